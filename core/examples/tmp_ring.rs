use memhook_core::memtype::{MemType, MemtypeMap};
static MAP: MemtypeMap<65_536> = MemtypeMap::new();
fn main() {
    let mut ring = [0usize; 8];
    let mut next = 0x7000_0000_0000usize;
    for p in &mut ring {
        *p = next;
        MAP.insert(next, 256, MemType::Cuda, 0).unwrap();
        next += 512;
    }
    for _ in 0..5 {
        let n: usize = std::env::var("N").map(|v| v.parse().unwrap()).unwrap_or(10_000_000);
        let t = std::time::Instant::now();
        let mut k = 0;
        for _ in 0..n {
            MAP.remove(ring[k], 256).unwrap();
            ring[k] = next;
            next += 512;
            MAP.insert(ring[k], 256, MemType::Cuda, 0).unwrap();
            k = (k + 1) % 8;
        }
        println!("ring remove+insert: {:.1} ns", t.elapsed().as_nanos() as f64 / n as f64);
    }
}

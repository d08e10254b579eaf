use memhook_core::memtype::{MemType, MemtypeMap};
use std::hint::black_box;
const CAP: usize = 65_536 + 16;
static MAP: MemtypeMap<CAP> = MemtypeMap::new();
const BASE: usize = 0x7f00_0000_0000;
const STRIDE: usize = 0x20_0000;
const LEN: usize = 0x10_0000;
unsafe extern "C" {
    fn mmap(a: *mut u8, l: usize, p: i32, f: i32, fd: i32, o: i64) -> *mut u8;
    fn madvise(a: *mut u8, l: usize, adv: i32) -> i32;
}
fn probes(ranges: usize) -> Vec<usize> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % ranges;
            let off = (x >> 32) as usize % (LEN - 64);
            BASE + i * STRIDE + off
        })
        .collect()
}
fn time(m: &MemtypeMap<CAP>, addrs: &[usize]) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..30 {
        let t = std::time::Instant::now();
        for _ in 0..50 {
            for &a in addrs {
                black_box(m.lookup(black_box(a), 8));
            }
        }
        best = best.min(t.elapsed().as_nanos() as f64 / (50.0 * addrs.len() as f64));
    }
    best
}
fn main() {
    for i in 0..65_536 {
        MAP.insert(BASE + i * STRIDE, LEN, MemType::Cuda, 0).unwrap();
    }
    let addrs = probes(65_536);
    let size = std::mem::size_of::<MemtypeMap<CAP>>();
    let region = unsafe { mmap(std::ptr::null_mut(), 16 << 20, 3, 0x22, -1, 0) };
    let aligned = ((region as usize + (2 << 20) - 1) & !((2 << 20) - 1)) as *mut u8;
    unsafe { madvise(aligned, 12 << 20, 14) };
    unsafe { std::ptr::copy_nonoverlapping(&MAP as *const _ as *const u8, aligned, size) };
    let huge = unsafe { &*(aligned as *const MemtypeMap<CAP>) };
    println!("size {size}");
    for _ in 0..3 {
        println!("static {:.1} ns  huge {:.1} ns", time(&MAP, &addrs), time(huge, &addrs));
    }
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    for l in smaps
        .lines()
        .filter(|l| l.starts_with("AnonHugePages") && !l.ends_with(" 0 kB"))
    {
        println!("{l}");
    }
}

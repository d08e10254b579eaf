use memhook_core::memtype::{Lookup, MemType, MemtypeMap};
static MAP: MemtypeMap<131_072> = MemtypeMap::new();
#[inline(never)]
#[unsafe(no_mangle)]
pub fn zz_lookup(a: usize) -> Lookup {
    MAP.lookup(a, 1)
}
fn main() {
    for i in 0..65536usize {
        MAP.insert(0x7f00_0000_0000 + i * 0x10000, 0x8000, MemType::Cuda, 0)
            .unwrap();
    }
    let mut h = 0usize;
    for i in 0..1000000usize {
        if let Lookup::Found(_) = zz_lookup(0x7f00_0000_0000 + ((i * 7919) % 65536) * 0x10000 + 8) {
            h += 1;
        }
    }
    println!("{h}");
}

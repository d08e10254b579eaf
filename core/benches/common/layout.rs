//! The ranges the memtype bench and the `readers` example look up: `ranges`
//! ranges of `LEN` bytes every `STRIDE` bytes from `BASE`, and pseudo-random
//! probe addresses among them. (Included by both, with `#[path]`.)

pub const BASE: usize = 0x7f00_0000_0000;
pub const STRIDE: usize = 0x20_0000;
pub const LEN: usize = 0x10_0000;

/// Pseudo-random probe addresses (xorshift), inside ranges (`hit`) or in the
/// gaps between them.
pub fn probes(ranges: usize, hit: bool) -> Vec<usize> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % ranges;
            let off = (x >> 32) as usize % (LEN - 64);
            BASE + i * STRIDE + if hit { off } else { LEN + off }
        })
        .collect()
}

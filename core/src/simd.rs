//! The memtype map's node search with AVX2, where the CPU has it.
//!
//! A search-tree node is 16 sorted `usize` keys; its rank (how many keys
//! are `<= addr`) is 16 comparisons. The baseline x86_64 target has no
//! 64-bit vector compare, so the portable code compiles to 16 scalar
//! compares and their packing (about 80 instructions a node). With AVX2,
//! four `vpcmpgtq`, two saturating packs, one `vpmovmskb` and a `popcnt`
//! do it (about 20). The CPU is asked once (cpuid, and xgetbv for the OS's
//! YMM support); without AVX2 and POPCNT, under loom or under Miri, the
//! portable code runs.
//!
//! The keys are read by inline assembly: 32-byte loads that x86_64 performs
//! as four 8-byte loads, each single-copy atomic (aligned 8-byte accesses
//! always are), exactly what the portable code's relaxed atomic loads do.
//! Like those, they may see a table being rewritten; the map's sequence
//! number validates every answer, and a torn node yields a rank in 0..=16
//! all the same (half the bits of a 32-bit mask), so no access goes out
//! of bounds.

use core::sync::atomic::{AtomicU8, Ordering};

/// 0 unknown, 1 AVX2 usable, 2 not.
static AVX2: AtomicU8 = AtomicU8::new(0);

/// Whether the AVX2 node search can run here.
#[inline(always)]
pub(crate) fn avx2() -> bool {
    // Miri runs no inline assembly: the portable search there.
    if cfg!(miri) {
        return false;
    }
    match AVX2.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => detect(),
    }
}

// `__cpuid` is a safe function in newer Rust and unsafe in older ones.
#[cold]
#[allow(unused_unsafe)]
fn detect() -> bool {
    use core::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: cpuid is available on every x86_64 CPU.
    let leaf1 = unsafe { __cpuid(1) };
    let popcnt_osxsave_avx = leaf1.ecx & (1 << 23) != 0 && leaf1.ecx & (1 << 27) != 0 && leaf1.ecx & (1 << 28) != 0;
    let ok = popcnt_osxsave_avx
        && {
            let xcr0: u32;
            // SAFETY: xgetbv with ecx = 0 reads XCR0; OSXSAVE says it is
            // enabled. It touches no memory.
            unsafe {
                core::arch::asm!("xgetbv", in("ecx") 0, out("eax") xcr0, out("edx") _, options(nomem, nostack, preserves_flags));
            }
            // SSE and AVX state saved by the OS.
            // SAFETY: leaf 0 exists on every x86_64 CPU.
            let max = unsafe { __cpuid(0) }.eax;
            // SAFETY: leaf 7 exists when the maximum leaf is at least 7.
            xcr0 & 0b110 == 0b110 && max >= 7 && unsafe { __cpuid_count(7, 0) }.ebx & (1 << 5) != 0
        };
    AVX2.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
    ok
}

/// How many of the 16 sorted keys at `keys` are `<= addr` (as the portable
/// `node_rank`).
///
/// # Safety
///
/// [`avx2`] returned true, and `keys` points to 16 readable, 8-byte aligned
/// `usize` words.
#[inline(always)]
pub(crate) unsafe fn node_rank(keys: *const usize, addr: usize) -> usize {
    let le_bytes: u32;
    // SAFETY: the caller's contract: AVX2 is usable and the 128 bytes at
    // `keys` are readable. Keys and address are biased by 2^63 so that the
    // signed compare orders them as unsigned. Each compare leaves a lane of
    // ones where key > addr; two saturating packs narrow the four vectors
    // to 32 bytes (two per key, in some order), and `vpmovmskb` gathers
    // them: the keys <= addr are half the zero bits, whatever their order.
    unsafe {
        core::arch::asm!(
            "vmovq xmm0, {addr}",
            "vpbroadcastq ymm0, xmm0",
            "vmovq xmm1, {bias}",
            "vpbroadcastq ymm1, xmm1",
            "vpxor ymm0, ymm0, ymm1",
            "vpxor ymm2, ymm1, ymmword ptr [{keys}]",
            "vpxor ymm3, ymm1, ymmword ptr [{keys} + 32]",
            "vpxor ymm4, ymm1, ymmword ptr [{keys} + 64]",
            "vpxor ymm5, ymm1, ymmword ptr [{keys} + 96]",
            "vpcmpgtq ymm2, ymm2, ymm0",
            "vpcmpgtq ymm3, ymm3, ymm0",
            "vpcmpgtq ymm4, ymm4, ymm0",
            "vpcmpgtq ymm5, ymm5, ymm0",
            "vpackssdw ymm2, ymm2, ymm3",
            "vpackssdw ymm4, ymm4, ymm5",
            "vpacksswb ymm2, ymm2, ymm4",
            "vpmovmskb {m:e}, ymm2",
            "not {m:e}",
            "popcnt {m:e}, {m:e}",
            "vzeroupper",
            addr = in(reg) addr,
            bias = in(reg) 1u64 << 63,
            keys = in(reg) keys,
            m = out(reg) le_bytes,
            out("xmm0") _,
            out("xmm1") _,
            out("xmm2") _,
            out("xmm3") _,
            out("xmm4") _,
            out("xmm5") _,
            options(nostack, readonly, pure)
        );
    }
    le_bytes as usize / 2
}

/// Asks the cache for the lines of `[p, p + len)` (a hint: it reads
/// nothing the program sees and cannot fault).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: prefetch never faults and has no visible effect, whatever
        // the address.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.wrapping_add(off).cast()) };
        off += 64;
    }
}

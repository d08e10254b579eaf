//! Arbitrary bytes as an x86_64 prologue, relocated to a near or far
//! trampoline: every success must be equivalent to the original (same
//! instructions, absolute targets and memory operands), every failure a
//! RelocError, never a panic. `cargo +nightly fuzz run relocate`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    memhook_tests::reloc_check::fuzz_relocate(data);
});

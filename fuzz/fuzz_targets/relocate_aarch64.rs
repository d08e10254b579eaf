//! Arbitrary words as an aarch64 prologue, relocated to a near or far
//! trampoline: every success keeps each instruction (or its target), every
//! failure is a RelocError, never a panic.
//! `cargo +nightly fuzz run relocate_aarch64`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    memhook_tests::reloc_check_aarch64::fuzz_relocate_aarch64(data);
});

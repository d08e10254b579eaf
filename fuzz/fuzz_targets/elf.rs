//! Malformed dynamic sections (built in memory from arbitrary bytes) fed to
//! core::elf: never a panic or an out-of-bounds read. `cargo +nightly fuzz run elf`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    memhook_tests::elf_fuzz::fuzz_elf(data);
});

//! Arbitrary operation sequences on the memtype map, compared with the
//! BTreeMap model after every step. `cargo +nightly fuzz run memtype`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    memhook_tests::memtype_model::fuzz_memtype(data);
});

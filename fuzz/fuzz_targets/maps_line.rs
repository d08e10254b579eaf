//! Arbitrary bytes as a line of `/proc/self/maps`: `memhook::maps::parse_line`
//! reads the same mapping as the plain model, or refuses as it does, and
//! never panics. `scripts/fuzz.sh maps_line`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    memhook_tests::maps_model::check_line(data);
});

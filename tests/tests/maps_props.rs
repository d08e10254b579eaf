//! `memhook::maps::parse_line` against a model written the plain way
//! (fields split at spaces, each parsed by the standard library), over
//! lines shaped as `/proc/self/maps` writes them, with their fields
//! mangled now and then, and over arbitrary bytes: the same mapping or
//! the same refusal, never a panic.

use memhook_tests::maps_model::{model, parsed};
use proptest::prelude::*;

/// A field as the kernel writes it, or now and then mangled: empty, too
/// long, a stray character, upper case.
fn hex_field(width: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        12 => any::<u64>().prop_map(move |v| format!("{v:0width$x}")),
        1 => Just(String::new()),
        1 => any::<u64>().prop_map(|v| format!("1{v:016x}")),
        1 => any::<u64>().prop_map(|v| format!("{v:X}")),
        1 => "[0-9a-fx-]{1,6}",
    ]
}

fn line() -> impl Strategy<Value = Vec<u8>> {
    let spaces = prop_oneof![8 => Just(" ".to_string()), 1 => " {2,4}", 1 => Just(String::new())];
    (
        (hex_field(8), hex_field(8), "[r-][w-][x-][ps]|[rwxps-]{0,3}"),
        (hex_field(8), hex_field(2), hex_field(2)),
        prop_oneof![
            10 => any::<u64>().prop_map(|v| (v % 1_000_000).to_string()),
            1 => any::<u64>().prop_map(|v| v.to_string()),
            1 => Just("18446744073709551616".to_string()),
            1 => "[0-9a-]{0,4}",
        ],
        prop_oneof![
            4 => Just(String::new()),
            4 => "/[a-z0-9/._ -]{1,40}",
            1 => "\\[(heap|stack|vdso|anon:[a-z ]{0,8})\\]",
            1 => "/[a-z]{300,320}",
        ],
        proptest::collection::vec(spaces, 6),
    )
        .prop_map(|((start, end, perms), (offset, major, minor), inode, path, s)| {
            format!(
                "{start}-{end}{}{perms}{}{offset}{}{major}:{minor}{}{inode}{}{path}",
                s[0],
                s[1],
                s[2],
                s[3],
                if path.is_empty() { &s[4] } else { "    " }
            )
            .into_bytes()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn parses_lines_as_the_model_does(line in line()) {
        prop_assert_eq!(parsed(&line), model(&line), "{}", String::from_utf8_lossy(&line));
    }

    #[test]
    fn refuses_what_is_no_line_as_the_model_does(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
        prop_assert_eq!(parsed(&bytes), model(&bytes));
    }

    #[test]
    fn reads_a_path_of_any_bytes(line in line(), tail in proptest::collection::vec(any::<u8>(), 0..40)) {
        // A path with bytes that are not UTF-8 (a file named so).
        let mut line = line;
        line.extend_from_slice(&tail);
        prop_assert_eq!(parsed(&line), model(&line));
    }
}

/// The shapes the kernel writes, each parsed as the model parses it (and
/// the model checked against known values).
#[test]
fn the_kernels_lines_parse_as_the_model_does() {
    let lines: [&[u8]; 4] = [
        b"55d0c0a4e000-55d0c0a50000 r--p 00000000 fd:01 1835269                    /usr/bin/cat",
        b"7ffd5e1c9000-7ffd5e1ea000 rw-p 00000000 00:00 0                          [stack]",
        b"7f3a12000000-7f3a12021000 rw-s 00000000 00:01 32778                      /SYSV00000000 (deleted)",
        b"7f3a12021000-7f3a12022000 ---p 00000000 00:00 0 ",
    ];
    for line in lines {
        assert_eq!(parsed(line), model(line), "{}", String::from_utf8_lossy(line));
    }
    let m = model(lines[0]).unwrap();
    assert_eq!(
        (m.0, m.1, m.2, m.5, m.6),
        (0x55d0c0a4e000, 0x55d0c0a50000, libc::PROT_READ, (0xfd, 1), 1835269)
    );
    assert_eq!(m.7, b"/usr/bin/cat");
    // And every line of this process's own maps.
    for line in std::fs::read("/proc/self/maps")
        .unwrap()
        .split(|&c| c == b'\n')
        .filter(|l| !l.is_empty())
    {
        assert!(parsed(line).is_some(), "{}", String::from_utf8_lossy(line));
        assert_eq!(parsed(line), model(line), "{}", String::from_utf8_lossy(line));
    }
}

/// A field that follows its `-` or `:` starts right there: a space after
/// either leaves it empty, and the line refused, as the model refuses it
/// (the parser once skipped the space and read the next field's digits
/// in its place; found by `reads_a_path_of_any_bytes`).
#[test]
fn a_space_after_the_dash_or_colon_is_no_field() {
    for line in [
        b"00000000-00000000 -w-s 00000000 00: 0 0".as_slice(),
        b"00000000- 00000000 rw-p 00000000 00:00 0",
        b"1000-2000 rw-p 00000000 00 :00 0",
    ] {
        assert_eq!(parsed(line), None, "{}", String::from_utf8_lossy(line));
        assert_eq!(model(line), None);
    }
    // Spaces before a field that follows a space are no matter.
    let line = b"  1000-2000   rw-p   00000000   08:01   7   /lib";
    assert_eq!(parsed(line), model(line));
    assert_eq!(parsed(line).map(|f| f.7), Some(b"/lib".to_vec()));
}

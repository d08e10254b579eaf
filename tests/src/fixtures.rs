//! The function-entry fixtures in `tests/fixtures/`: tab-separated rows of
//! library, symbol, offset (`-` where none was recorded) and the entry's
//! first bytes in hex; `#` lines are comments.

/// One fixture row.
pub struct Entry {
    /// The library the bytes were read from (`libc.so.6`).
    pub library: String,
    /// The exported function.
    pub symbol: String,
    /// Its offset in the library, where the fixture records it.
    pub offset: Option<usize>,
    /// Its first bytes.
    pub code: Vec<u8>,
}

/// The rows of `tests/fixtures/{file}`, in order.
pub fn read(file: &str) -> Vec<Entry> {
    let path = format!("{}/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            assert_eq!(cols.len(), 4, "{file}: {line}");
            Entry {
                library: cols[0].to_string(),
                symbol: cols[1].to_string(),
                offset: match cols[2] {
                    "-" => None,
                    o => Some(usize::from_str_radix(o.trim_start_matches("0x"), 16).unwrap()),
                },
                code: (0..cols[3].len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&cols[3][i..i + 2], 16).unwrap())
                    .collect(),
            }
        })
        .collect()
}

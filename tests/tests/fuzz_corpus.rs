//! Replays every fuzz target's seed corpus (`fuzz/corpus/<target>/`) on
//! stable, so that what the fuzzers found once stays fixed.

use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            (p, data)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    files
}

#[test]
fn memtype_corpus_replays() {
    for (path, data) in corpus("memtype") {
        eprintln!("{}", path.display());
        memhook_tests::memtype_model::fuzz_memtype(&data);
    }
}

#[test]
fn relocate_corpus_replays() {
    let files = corpus("relocate");
    for (path, data) in &files {
        eprintln!("{}", path.display());
        memhook_tests::reloc_check::fuzz_relocate(data);
    }
}

#[test]
fn elf_corpus_replays() {
    let files = corpus("elf");
    let named: usize = files
        .iter()
        .map(|(_, data)| memhook_tests::elf_fuzz::fuzz_elf(data))
        .sum();
    // The unmutated seeds are valid objects whose names all resolve.
    assert!(named >= 3 + 1 + 40, "{named}");
}

#[test]
fn relocate_aarch64_corpus_replays() {
    for (path, data) in corpus("relocate_aarch64") {
        eprintln!("{}", path.display());
        memhook_tests::reloc_check_aarch64::fuzz_relocate_aarch64(&data);
    }
}

#[test]
fn maps_line_corpus_replays() {
    let files = corpus("maps_line");
    for (path, data) in &files {
        eprintln!("{}", path.display());
        memhook_tests::maps_model::check_line(data);
    }
    // The kernel's own lines among the seeds parse (the model's refusal
    // of everything would pass the check above).
    let parsed = files
        .iter()
        .filter(|(_, d)| memhook_tests::maps_model::parsed(d).is_some())
        .count();
    assert!(parsed >= 4, "{parsed}");
}

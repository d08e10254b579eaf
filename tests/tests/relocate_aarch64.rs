//! aarch64 relocation on real function entries: Debian 12's arm64 glibc
//! (2.36), every function memhook's host hooks patch in bistro mode.

use memhook_aarch64::Aarch64;
use memhook_core::patch::Arch;
use memhook_tests::reloc_check_aarch64::relocate_keeping_checked;

/// (symbol, its first 64 bytes) from the fixture.
fn fixtures() -> Vec<(String, Vec<u8>)> {
    memhook_tests::fixtures::read("prologues-debian12-arm64-glibc236.tsv")
        .into_iter()
        .map(|row| (row.symbol, row.code))
        .collect()
}

/// Every host function memhook patches keeps its first word ahead of the
/// patch in Debian 12's arm64 glibc, and the words after it move to a
/// near trampoline (and, but for one, a far one): a uprobe on any of them
/// (bpftrace, bcc's `memleak`) leaves the hook whole. Their first words:
/// `nop` (`munmap`, `madvise`, `syscall`), `tst x5, #0xfff` (`mmap`),
/// `mov x8, #n` (`shmdt`, `truncate`), `sxtw x0, w0` (`shmat`,
/// `ftruncate`), a frame record's `stp` (`mremap`, `open`), and until the
/// seventy-third session unkept, a write of an argument register the
/// function never reads: `brk`'s `mov x1, x0`, `creat`'s `mov w2, w1`.
#[test]
fn every_host_function_of_debian_arm64_glibc_keeps_its_first_word() {
    let all = fixtures();
    assert_eq!(all.len(), 26, "the 19 host functions and their 7 aliases");
    const ENTRY: usize = 0x4000_0000;
    let mut far_refused = Vec::new();
    for (symbol, code) in &all {
        assert_eq!(Aarch64::entry_skip(code), 0, "{symbol}: no landing pad in this build");
        let near = relocate_keeping_checked(code, Aarch64::NEAR_JUMP_LEN, ENTRY + 0x1000)
            .unwrap_or_else(|| panic!("{symbol}: first word {:02x?} not kept", &code[..4]));
        let near = near.unwrap_or_else(|e| panic!("{symbol}: {e}"));
        assert_eq!(near.skip, 4, "{symbol}");
        if !matches!(
            relocate_keeping_checked(code, Aarch64::FAR_JUMP_LEN, ENTRY + 0x1000),
            Some(Ok(_))
        ) {
            far_refused.push(symbol.as_str());
        }
    }
    // The far form's 16 bytes after the kept word: all but `creat`, whose
    // third word branches away for good (into `open`) before
    // 16 bytes are taken.
    assert_eq!(far_refused, ["creat", "creat64"]);
}

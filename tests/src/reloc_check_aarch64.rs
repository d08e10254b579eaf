//! The aarch64 relocation checker shared by the fuzz target and the
//! corpus replay: arbitrary words as a prologue, relocated to a near or a
//! far trampoline. A success must keep every instruction that does not
//! read the PC as it was, and every PC-relative one's target (re-encoded,
//! or as an absolute literal in the trampoline); a failure is a
//! `RelocError`; nothing panics.

use memhook_aarch64::{Aarch64, BTI_C, pc_relative_target};
use memhook_core::patch::{Arch, RelocError, Relocation};

const ENTRY: usize = 0x4000_0000;

fn words(code: &[u8]) -> Vec<u32> {
    code.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Checks one relocation of `data` (the first byte picks the patch size
/// and the trampoline's distance).
pub fn fuzz_relocate_aarch64(data: &[u8]) {
    let Some((&sel, code)) = data.split_first() else {
        return;
    };
    let need = if sel & 1 == 0 { 4 } else { 16 };
    let tramp = match (sel >> 1) & 3 {
        0 => ENTRY + 0x1000,    // every form in reach
        1 => ENTRY + (8 << 20), // b/bl in reach, literals and b.cond not
        2 => ENTRY + (1 << 32), // nothing in reach
        _ => ENTRY.wrapping_sub(0x10_0000),
    };
    if let Ok(r) = Aarch64::relocate(code, ENTRY, need, tramp) {
        assert_eq!(r.skip, Aarch64::entry_skip(code), "past the landing pad alone");
        check(code, need, tramp, &r, 0);
    }
    // The first instruction kept ahead of the patch, where it can be.
    let _ = relocate_keeping_checked(code, need, tramp);
}

/// [`Arch::relocate_keeping`] of `code` (at a fixed entry) after the first
/// word [`Arch::keep_first`] keeps, to a trampoline at `tramp`, checked as
/// [`fuzz_relocate_aarch64`] checks a relocation, and the trampoline runs
/// the kept word first, after its landing pad. `None` where no word is
/// kept.
pub fn relocate_keeping_checked(code: &[u8], need: usize, tramp: usize) -> Option<Result<Relocation, RelocError>> {
    let (keep, _) = Aarch64::keep_first(code)?;
    let r = Aarch64::relocate_keeping(code, ENTRY, keep, need, tramp);
    if let Ok(r) = &r {
        let pad = Aarch64::entry_skip(code);
        assert_eq!(r.skip, keep);
        assert_eq!(
            words(&r.code)[1..1 + (keep - pad) / 4],
            words(&code[pad..keep])[..],
            "the kept word runs first"
        );
        check(code, need, tramp, r, (keep - pad) / 4);
    }
    Some(r)
}

/// The checks of one relocation `r` of `code`, whose trampoline runs
/// `kept` words kept at the entry before the moved ones.
fn check(code: &[u8], need: usize, tramp: usize, r: &Relocation, kept: usize) {
    assert!(r.taken >= need && r.taken.is_multiple_of(4) && r.code.len().is_multiple_of(4));
    let out = words(&r.code);
    assert_eq!(out[0], BTI_C, "trampolines start with bti c");
    let orig = words(&code[r.skip..r.skip + r.taken]);
    // Every absolute literal in the trampoline, and every target its
    // re-encoded words point to.
    let mut targets: Vec<usize> = out
        .windows(2)
        .map(|w| (u64::from(w[0]) | (u64::from(w[1]) << 32)) as usize)
        .collect();
    for (i, &w) in out.iter().enumerate() {
        if let Some(t) = pc_relative_target(w, tramp + 4 * i) {
            targets.push(t);
        }
    }
    for (i, &w) in orig.iter().enumerate() {
        let pc = ENTRY + r.skip + 4 * i;
        match pc_relative_target(w, pc) {
            Some(t) => {
                let page = t & !0xfff;
                assert!(
                    targets.contains(&t) || targets.contains(&page),
                    "{w:#010x} at {pc:#x}: target {t:#x} lost in {out:x?}"
                );
            }
            None => assert!(out.contains(&w), "{w:#010x} at {pc:#x} not copied into {out:x?}"),
        }
    }
    // Where a thread stopped before each moved word resumes: one start per
    // word, in order, after the landing pad; a word that does not read the
    // PC is copied to exactly that place.
    assert_eq!(r.starts.len(), orig.len(), "{:?}", r.starts);
    let mut last = 0;
    for (i, (&(from, to), &w)) in r.starts.iter().zip(&orig).enumerate() {
        assert_eq!(usize::from(from), 4 * i);
        assert!(
            usize::from(to) >= 4 * (1 + kept) && to % 4 == 0 && (i == 0 || to > last) && usize::from(to) < r.code.len()
        );
        last = to;
        if pc_relative_target(w, ENTRY + r.skip + 4 * i).is_none() {
            assert_eq!(out[usize::from(to) / 4], w, "word {i} resumes at its copy");
        }
    }
}

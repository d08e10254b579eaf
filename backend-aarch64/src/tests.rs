//! Encoding and relocation of every form, checked by decoding the result:
//! each rewritten instruction reaches the same target from the trampoline.

use super::*;

const ENTRY: usize = 0x40_0000;
const NEAR: usize = 0x40_0000 + 0x10_0000; // 1 MiB away: b/bl reach, literals do not
const FAR: usize = 0x7f00_0000_0000; // out of every reach

fn bytes(words: &[u32]) -> heapless::Vec<u8, 256> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn words(code: &[u8]) -> heapless::Vec<u32, 64> {
    code.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn reloc(code: &[u32], need: usize, tramp: usize) -> Result<Relocation, RelocError> {
    Aarch64::relocate(&bytes(code), ENTRY, need, tramp)
}

/// A `b` from `from` to `to`.
fn b(from: usize, to: usize) -> u32 {
    0x1400_0000 | field(diff(from, to), 2, 26).unwrap()
}

#[test]
fn entry_forms() {
    let near = Aarch64::entry_jump(ENTRY, ENTRY + 0x100);
    assert_eq!(words(&near).as_slice(), [0x1400_0040]);
    let back = Aarch64::entry_jump(ENTRY + 0x100, ENTRY);
    assert_eq!(words(&back).as_slice(), [0x17ff_ffc0]);
    assert!(Aarch64::is_near(ENTRY, ENTRY + (128 << 20) - 4));
    assert!(!Aarch64::is_near(ENTRY, ENTRY + (128 << 20)));
    let far = Aarch64::entry_jump(ENTRY, FAR);
    assert_eq!(far.len(), Aarch64::FAR_JUMP_LEN);
    assert_eq!(&words(&far)[..2], [LDR_X16_LIT8, BR_X16]);
    assert_eq!(u64::from_le_bytes(far[8..16].try_into().unwrap()), FAR as u64);
    assert_eq!(Aarch64::LOCK, &[0, 0, 0, 0x14]);
    assert_eq!(Aarch64::absolute_jump(FAR).as_slice(), far.as_slice());
    // A thread between the far form's ldr and br has x16 loaded: it goes on
    // at the destination; the near form is one instruction.
    assert_eq!(Aarch64::jump_interior(&far), Some((4, FAR)));
    assert_eq!(Aarch64::jump_interior(&near), None);
}

#[test]
fn landing_pads_stay_at_the_entry() {
    for pad in [&[BTI_C][..], &[BTI_JC], &[]] {
        let mut code: heapless::Vec<u32, 8> = pad.iter().copied().collect();
        let _ = code.push(0xd10043ff); // sub sp, sp, #16
        let _ = code.push(0xd65f03c0); // ret
        let r = reloc(&code, 4, NEAR).unwrap();
        assert_eq!(r.skip, 4 * pad.len());
        assert_eq!(r.taken, 4);
        let w = words(&r.code);
        assert_eq!(w[0], BTI_C, "trampolines start with bti c");
        assert_eq!(w[1], 0xd10043ff);
        assert_eq!(w[2], b(NEAR + 8, ENTRY + r.skip + 4), "jump back after the taken word");
    }
}

/// A `paciasp` (or `pacibsp`) signs x30 with SP: left alone at the entry
/// it handed the hook a signed return address (which its `ret` cannot
/// take where pointer authentication is on: a fault, as qemu's `max` CPU
/// showed), and moved off it, it left indirect callers no landing pad.
/// It is kept, with the `autiasp` that undoes it on the way to the hook,
/// and the trampoline signs again for the original; the plain relocation
/// refuses it. A frame record's `stp x29, x30, [sp, #-n]!` and a `sub
/// sp` are kept too (undone by `add sp`), and with nothing to undo a
/// `nop`, a compare or test, a move or immediate add into x9 to x15, or
/// into x0 to x8 where it does not read what was passed there (Debian
/// 12's glibc: `munmap`'s `nop`, `mmap`'s `tst x5, #0xfff`, `shmdt`'s
/// `mov x8, #197`, `creat`'s `mov w2, w1`), and a `sxtw` of an argument
/// into itself (`shmat`'s), so that a uprobe on the entry leaves the
/// patch whole. Nothing that changes an argument from what was passed,
/// nor what writes x16 to x18, a callee-saved register or memory, reads
/// memory, or is PC-relative is kept.
#[test]
fn pointer_authentication_and_frame_setup_are_kept_with_their_undo() {
    const ADD_SP_16: u32 = 0x910043ff; // add sp, sp, #16
    // (the words, what keep_first answers: the kept length and the undo)
    type Case<'a> = (&'a [u32], Option<(usize, &'a [u32])>);
    let cases: [Case<'_>; 47] = [
        (&[PACIASP, 0xa9bf7bfd], Some((4, &[AUTIASP]))),
        (&[BTI_C, PACIASP, 0xa9bf7bfd], Some((8, &[AUTIASP]))),
        (&[PACIBSP, 0xa9bf7bfd], Some((4, &[AUTIBSP]))),
        (&[0xa9bf7bfd], Some((4, &[ADD_SP_16]))), // stp x29, x30, [sp, #-16]!
        (&[BTI_C, 0xa9be7bfd], Some((8, &[0x910083ff]))), // stp x29, x30, [sp, #-32]!
        (&[0xd10043ff], Some((4, &[ADD_SP_16]))), // sub sp, sp, #16
        (&[0xd14007ff], Some((4, &[0x914007ff]))), // sub sp, sp, #1, lsl #12
        (&[0xd503201f], Some((4, &[]))),          // nop
        (&[BTI_C, 0xd503201f], Some((8, &[]))),   // bti c; nop
        (&[0xf2402cbf], Some((4, &[]))),          // tst x5, #0xfff
        (&[0xf100041f], Some((4, &[]))),          // cmp x0, #1
        (&[0x6b01001f], Some((4, &[]))),          // cmp w0, w1
        (&[0xeb21c01f], Some((4, &[]))),          // cmp x0, w1, sxtw
        (&[0xb100041f], Some((4, &[]))),          // cmn x0, #1
        (&[0xea01001f], Some((4, &[]))),          // tst x0, x1
        (&[0xd28018a8], Some((4, &[]))),          // mov x8, #0xc5
        (&[0x92800009], Some((4, &[]))),          // mov x9, #-1 (movn)
        (&[0xaa0003ea], Some((4, &[]))),          // mov x10, x0
        (&[0xb24003eb], Some((4, &[]))),          // mov x11, #1 (orr from xzr)
        (&[0x910043ec], Some((4, &[]))),          // add x12, sp, #16
        (&[0xd100040f], Some((4, &[]))),          // sub x15, x0, #1
        (&[0xa9bf53f3], None),                    // stp x19, x20, [sp, #-16]!
        (&[0xa9017bfd], None),                    // stp x29, x30, [sp, #16]
        (&[0x910003fd], None),                    // mov x29, sp
        (&[BTI_C, 0xd65f03c0], None),             // ret
        (&[0x10000009], None),                    // adr x9, .
        (&[0x90000008], None),                    // adrp x8, .
        (&[0xd2800010], None),                    // mov x16, #0: the trampoline's
        (&[0xaa0003e2], Some((4, &[]))),          // mov x2, x0: x2 unread
        (&[0x2a0103e2], Some((4, &[]))),          // mov w2, w1 (glibc's creat)
        (&[0x52804822], Some((4, &[]))),          // mov w2, #0x241
        (&[0x91002001], Some((4, &[]))),          // add x1, x0, #8
        (&[0xaa0103e1], Some((4, &[]))),          // mov x1, x1
        (&[0x2a0103e1], Some((4, &[]))),          // mov w1, w1: its upper half
        (&[0x91002021], None),                    // add x1, x1, #8: changes x1
        (&[0x91004108], None),                    // add x8, x8, #16: a result's address
        (&[0xaa010be1], None),                    // orr x1, xzr, x1, lsl #2: changes x1
        (&[0xaa0003f3], None),                    // mov x19, x0: callee-saved
        (&[0xd2800012], None),                    // mov x18, #0: the platform's
        (&[0x93407c00], Some((4, &[]))),          // sxtw x0, w0: its upper half
        (&[0x93407c02], Some((4, &[]))),          // sxtw x2, w0: x2 unread
        (&[0xf1000400], None),                    // subs x0, x0, #1: an argument
        (&[0xf9400008], None),                    // ldr x8, [x0]: a load
        (&[0x58000008], None),                    // ldr x8, literal
        (&[0xf2800008], None),                    // movk x8, #0: reads x8
        (&[0xaa010008], None),                    // orr x8, x0, x1: not a mov
        (&[0xb240000b], None),                    // orr x11, x0, #1: the same
    ];
    for (code, want) in cases {
        let got = Aarch64::keep_first(&bytes(code));
        let got = got.map(|(n, u)| (n, words(&u).to_vec()));
        assert_eq!(got, want.map(|(n, u)| (n, u.to_vec())), "{code:08x?}");
    }
    // bti c; paciasp; stp x29, x30, [sp, #-16]!; mov x29, sp; ...; ret
    let code = [BTI_C, PACIASP, 0xa9bf7bfd, 0x910003fd, 0xd65f03c0];
    let r = Aarch64::relocate_keeping(&bytes(&code), ENTRY, 8, 4, NEAR).unwrap();
    assert_eq!((r.skip, r.taken), (8, 4));
    let w = words(&r.code);
    assert_eq!(
        w[..3],
        [BTI_C, PACIASP, 0xa9bf7bfd],
        "the landing pad, the kept word, the moved one"
    );
    assert_eq!(w[3], b(NEAR + 12, ENTRY + 12), "back after the moved word");
    assert_eq!(r.starts.as_slice(), [(0, 8)]);
    // Without it kept: refused, not patched over or left to sign for the
    // hook.
    assert!(matches!(
        reloc(&code, 4, NEAR),
        Err(RelocError::Unsupported { address, .. }) if address == ENTRY + 4
    ));
    assert!(matches!(
        reloc(&code[1..], 4, NEAR),
        Err(RelocError::Unsupported { address, .. }) if address == ENTRY
    ));
    // A branch to the kept patch's start (a loop back to after the
    // `stp`) is refused; so is another `keep` than the first word's.
    let code = [0xa9bf7bfd, 0x910003fd, 0xd1000400, 0xb5ffffe0, 0xd65f03c0]; // ...; sub x0, x0, #1; cbnz x0, -4*1
    let looped = [0xa9bf7bfd, 0x910003fd, 0xd1000400, 0xb5ffffc0, 0xd65f03c0]; // cbnz x0 to entry+4
    assert!(Aarch64::relocate_keeping(&bytes(&code), ENTRY, 4, 4, NEAR).is_ok());
    assert_eq!(
        Aarch64::relocate_keeping(&bytes(&looped), ENTRY, 4, 4, NEAR),
        Err(RelocError::BranchIntoPatch {
            address: ENTRY + 12,
            target: ENTRY + 4
        })
    );
    assert!(matches!(
        Aarch64::relocate_keeping(&bytes(&code), ENTRY, 8, 4, NEAR),
        Err(RelocError::Unsupported { .. })
    ));
}

#[test]
fn copies_what_does_not_read_the_pc() {
    // stp x29, x30, [sp, #-16]!; mov x29, sp; then more
    let code = [0xa9bf7bfd, 0x910003fd, 0xd10083ff, 0xd65f03c0];
    // A 16-byte patch takes all four words, the ret last: fine.
    let r = reloc(&code, 16, FAR).unwrap();
    assert_eq!(&words(&r.code)[1..], &code, "copied, and no jump back after a ret");
    // With the ret third, the flow ends before the patch is covered.
    let short = [0xa9bf7bfd, 0x910003fd, 0xd65f03c0, 0xd10083ff];
    let r = reloc(&short, 16, FAR).unwrap_err();
    assert!(
        matches!(r, RelocError::FunctionTooShort { address, .. } if address == ENTRY + 8),
        "{r:?}"
    );
    let r = reloc(&code, 8, NEAR).unwrap();
    let w = words(&r.code);
    assert_eq!(&w[1..3], &code[..2]);
    assert_eq!(w[3], b(NEAR + 12, ENTRY + 8));
    // Far from the function, the jump back goes through x16.
    let r = reloc(&code, 8, FAR).unwrap();
    let w = words(&r.code);
    assert_eq!(&w[3..5], [LDR_X16_LIT8, BR_X16]);
}

/// A debugger's `brk #0` (gdb's, after the frame setup) or a uprobe's
/// `brk #5` among the words a patch would move is refused; one past them
/// stays where it is.
#[test]
fn a_breakpoint_under_the_patch_is_refused() {
    const BRK_GDB: u32 = 0xd420_0000;
    const BRK_UPROBE: u32 = 0xd420_00a0;
    let code = [0xa9bf7bfd, 0x910003fd, BRK_GDB, 0xd65f03c0];
    let r = reloc(&code, 16, FAR).unwrap_err();
    assert_eq!(r, RelocError::Breakpoint { address: ENTRY + 8 });
    // The near form moves one word: the breakpoint stays in the function.
    assert!(reloc(&code, 4, NEAR).is_ok());
    let r = reloc(&[BRK_UPROBE, 0x910003fd, 0xd10083ff, 0xd65f03c0], 4, NEAR).unwrap_err();
    assert_eq!(r, RelocError::Breakpoint { address: ENTRY });
}

#[test]
fn branches_are_reaimed() {
    let target = ENTRY + 0x2000;
    // b target (the only word under a 4-byte patch)
    let r = reloc(&[b(ENTRY, target), 0xd503201f], 4, NEAR).unwrap();
    assert_eq!(words(&r.code)[1], b(NEAR + 4, target));
    assert_eq!(r.code.len(), 8, "a taken b needs no jump back");
    let r = reloc(&[b(ENTRY, target), 0xd503201f], 4, FAR).unwrap();
    let w = words(&r.code);
    assert_eq!(&w[1..3], [LDR_X16_LIT8, BR_X16]);
    assert_eq!(u64::from(w[3]) | (u64::from(w[4]) << 32), target as u64);
    // bl: direct in reach; else x30 set to the point after it, then x16.
    let bl = 0x9400_0000 | field(diff(ENTRY, target), 2, 26).unwrap();
    let r = reloc(&[bl, 0xd503201f], 4, NEAR).unwrap();
    assert_eq!(
        words(&r.code)[1],
        0x9400_0000 | field(diff(NEAR + 4, target), 2, 26).unwrap()
    );
    let r = reloc(&[bl, 0xd503201f], 4, FAR).unwrap();
    let w = words(&r.code);
    assert_eq!(w[1], 0x1000_00be, "adr x30, #20");
    assert_eq!(&w[2..4], [LDR_X16_LIT8, BR_X16]);
    assert_eq!(u64::from(w[4]) | (u64::from(w[5]) << 32), target as u64);
}

#[test]
fn conditional_branches_invert_over_an_absolute_jump() {
    let target = ENTRY + 0x400;
    let cases = [
        (0x5400_0000 | (0x100 << 5) | 0x1, 0x5400_0000, 19), // b.ne +0x400 -> b.eq
        (0xb400_0000 | (0x100 << 5) | 3, 0xb500_0000 | 3, 19), // cbz x3 -> cbnz
        (0x3500_0000 | (0x100 << 5) | 4, 0x3400_0000 | 4, 19), // cbnz w4 -> cbz
        (0x3628_0000 | (0x100 << 5) | 2, 0x3728_0000 | 2, 14), // tbz w2, #5 -> tbnz
    ];
    for (word, inverted, bits) in cases {
        let target_of = |w: u32, pc: usize| pc.wrapping_add((sext(w, 5, bits) * 4) as usize);
        assert_eq!(target_of(word, ENTRY), target);
        // In reach (tbz reaches 32 KiB only): re-encoded.
        let close = ENTRY + 0x1000;
        let r = reloc(&[word, 0xd503201f], 4, close).unwrap();
        let w = words(&r.code)[1];
        assert_eq!(w & !(((1 << bits) - 1) << 5), word & !(((1 << bits) - 1) << 5));
        assert_eq!(target_of(w, close + 4), target);
        // Out of reach: the inverted condition skips 20 bytes.
        let r = reloc(&[word, 0xd503201f], 4, FAR).unwrap();
        let w = words(&r.code);
        assert_eq!(w[1], inverted | (5 << 5), "{word:#x}");
        assert_eq!(&w[2..4], [LDR_X16_LIT8, BR_X16]);
        assert_eq!(u64::from(w[4]) | (u64::from(w[5]) << 32), target as u64);
    }
}

#[test]
fn adr_and_adrp_keep_their_values() {
    // adrp x0, #+2 pages; adr x1, #+0x40
    let adrp: u32 = 0x9000_0000 | (2 << 29); // immlo 2: +2 pages, into x0
    let adr = 0x1000_0000 | (0x10 << 5) | 1;
    let r = reloc(&[adrp, adr], 8, NEAR).unwrap();
    let w = words(&r.code);
    match decode(w[1], NEAR + 4) {
        Insn::Adr {
            target,
            rd: 0,
            page: true,
        } => assert_eq!(target, (ENTRY & !0xfff) + 2 * 4096),
        other => panic!("{other:?}"),
    }
    match decode(w[2], NEAR + 8) {
        Insn::Adr {
            target,
            rd: 1,
            page: false,
        } => assert_eq!(target, ENTRY + 4 + 0x40),
        other => panic!("{other:?}"),
    }
    // Out of reach: a constant load.
    let r = reloc(&[adrp, adr], 8, FAR).unwrap();
    let w = words(&r.code);
    assert_eq!(w[1], 0x5800_0040, "ldr x0, #8");
    assert_eq!(w[2], B_OVER_LITERAL);
    assert_eq!(
        u64::from(w[3]) | (u64::from(w[4]) << 32),
        ((ENTRY & !0xfff) + 8192) as u64
    );
    assert_eq!(w[5], 0x5800_0041, "ldr x1, #8");
}

#[test]
fn literal_loads_go_through_x16_out_of_reach() {
    let lit = |opc_v: u32, rt: u32| opc_v | (0x20 << 5) | rt; // +0x80
    let cases = [
        (lit(0x1800_0000, 1), 0xb940_0201), // ldr w1
        (lit(0x5800_0000, 2), 0xf940_0202), // ldr x2
        (lit(0x9800_0000, 3), 0xb980_0203), // ldrsw x3
        (lit(0xd800_0000, 0), 0xf980_0200), // prfm pldl1keep
        (lit(0x1c00_0000, 4), 0xbd40_0204), // ldr s4
        (lit(0x5c00_0000, 5), 0xfd40_0205), // ldr d5
        (lit(0x9c00_0000, 6), 0x3dc0_0206), // ldr q6
    ];
    for (word, via) in cases {
        let r = reloc(&[word, 0xd503201f], 4, FAR).unwrap();
        let w = words(&r.code);
        assert_eq!(&w[1..3], [LDR_X16_LIT8, B_OVER_LITERAL], "{word:#x}");
        assert_eq!(u64::from(w[3]) | (u64::from(w[4]) << 32), (ENTRY + 0x80) as u64);
        assert_eq!(w[5], via, "{word:#x}");
        // In reach (1 MiB): re-encoded in place.
        let close = ENTRY + 0x800;
        let r = reloc(&[word, 0xd503201f], 4, close).unwrap();
        let w = words(&r.code)[1];
        match decode(w, close + 4) {
            Insn::Literal { target, .. } => assert_eq!(target, ENTRY + 0x80),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn refusals_name_the_case() {
    // A branch back into the patched words (from later code).
    let code = [0xd10043ff, 0xd10043ff, 0xd10043ff, 0xd10043ff, b(ENTRY + 16, ENTRY + 8)];
    assert!(matches!(
        reloc(&code, 16, FAR),
        Err(RelocError::BranchIntoPatch { address, target }) if address == ENTRY + 16 && target == ENTRY + 8
    ));
    // To the entry itself is allowed (a loop to the function's start).
    let code = [0xd10043ff, b(ENTRY + 4, ENTRY), 0xd65f03c0];
    assert!(reloc(&code, 4, NEAR).is_ok());
    // Shorter than the patch: ret in the second word of a 16-byte patch.
    let code = [0xd10043ff, 0xd65f03c0, 0, 0];
    assert!(matches!(reloc(&code, 16, FAR), Err(RelocError::FunctionTooShort { address, .. }) if address == ENTRY + 4));
    // x16 in use where a rewrite needs it: mov x16, #1; then b far.
    let code = [0xd2800030, b(ENTRY + 4, ENTRY + 0x10_0000), 0, 0];
    assert!(matches!(reloc(&code, 8, FAR), Err(RelocError::Unsupported { address, .. }) if address == ENTRY));
    // The same without a rewrite needing x16 (trampoline near): fine.
    assert!(reloc(&code, 8, NEAR).is_ok());
    // A call that returns inside a far jump's words (bl, blr x1 in the
    // second word): a thread in the callee would return into the jump.
    let (sub, ret) = (0xd10043ff, 0xd65f03c0);
    let bl = |at: usize| 0x9400_0000 | field(diff(at, ENTRY + 0x2000), 2, 26).unwrap();
    for call in [bl(ENTRY + 4), 0xd63f0020] {
        let code = [sub, call, sub, sub, ret];
        assert!(matches!(
            reloc(&code, 16, FAR),
            Err(RelocError::Unsupported { address, what }) if address == ENTRY + 4 && what.contains("returns inside")
        ));
    }
    // One in the last word returns to the jump's end: moved.
    assert!(reloc(&[sub, sub, sub, bl(ENTRY + 12), ret], 16, FAR).is_ok());
    // Too few bytes.
    assert!(matches!(
        reloc(&[0xd10043ff], 8, NEAR),
        Err(RelocError::NotEnoughBytes { .. })
    ));
}

#[test]
fn arbitrary_words_never_panic() {
    let mut x = 0x1234_5678_9abc_def0u64;
    for _ in 0..20_000 {
        let mut code = [0u32; 8];
        for w in &mut code {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *w = x as u32;
        }
        // Every fourth with a word keep_first keeps first.
        if x & 3 == 0 {
            code[0] = [
                PACIASP, 0xa9bf7bfd, 0xd10043ff, PACIBSP, 0xd503201f, 0xf2402cbf, 0xd28018a8, 0xaa0003ea,
            ][(x >> 2) as usize & 7];
        }
        for (need, tramp) in [(4, NEAR), (16, FAR), (16, NEAR)] {
            if let Ok(r) = reloc(&code, need, tramp) {
                assert!(r.taken >= need && r.code.len() % 4 == 0);
            }
            if let Some((keep, _)) = Aarch64::keep_first(&bytes(&code))
                && let Ok(r) = Aarch64::relocate_keeping(&bytes(&code), ENTRY, keep, need, tramp)
            {
                assert!(r.skip == keep && r.taken >= need && r.code.len() % 4 == 0);
            }
        }
    }
}

/// glibc's `_dl_debug_state` (the loader's breakpoint, which memhook
/// patches as an empty function): a lone `ret`, with `bti c` before it
/// where the loader is built for BTI. The 4-byte patch covers the `ret`
/// exactly, so the default `relocate_empty` relocates it as any prologue;
/// the far form (16 bytes) would cover the next function's code, and is
/// refused.
#[test]
fn an_empty_function_relocates_its_lone_return() {
    const RET: u32 = 0xd65f03c0;
    const BTI_C: u32 = 0xd503245f;
    let code = bytes(&[RET, 0xd503201f, 0xd503201f, 0xd503201f]);
    let r = Aarch64::relocate_empty(&code, ENTRY, Aarch64::NEAR_JUMP_LEN, NEAR).unwrap();
    assert_eq!((r.skip, r.taken), (0, 4));
    // The trampoline's landing pad, then the return.
    assert_eq!(&words(&r.code)[..2], [BTI_C, RET]);
    let code = bytes(&[BTI_C, RET, 0xd503201f, 0xd503201f]);
    let r = Aarch64::relocate_empty(&code, ENTRY, Aarch64::NEAR_JUMP_LEN, NEAR).unwrap();
    assert_eq!((r.skip, r.taken), (4, 4));
    let code = bytes(&[RET, 0xd503201f, 0xd503201f, 0xd503201f, 0xd503201f]);
    assert!(matches!(
        Aarch64::relocate_empty(&code, ENTRY, Aarch64::FAR_JUMP_LEN, FAR),
        Err(RelocError::FunctionTooShort { .. })
    ));
}

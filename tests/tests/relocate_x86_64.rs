//! x86_64 relocation on real function entries (the fixtures read from live
//! processes: libcuda 580, libcudart 13, glibc 2.36 and 2.39) and on
//! hand-written prologues for each refusal.

use memhook_core::patch::{Arch, RelocError};
use memhook_tests::reloc_check::{fuzz_relocate, relocate_checked};
use memhook_x86_64::X86_64;
use proptest::prelude::*;

struct Fixture {
    file: &'static str,
    library: String,
    symbol: String,
    entry: usize,
    code: Vec<u8>,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn fixtures() -> Vec<Fixture> {
    let mut all = Vec::new();
    for file in [
        "prologues-debian12-glibc236.tsv",
        "prologues-h200-driver580-cuda13-glibc239.tsv",
    ] {
        let path = format!("{}/fixtures/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        for (i, line) in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .enumerate()
        {
            let cols: Vec<&str> = line.split('\t').collect();
            assert_eq!(cols.len(), 4, "{file}: {line}");
            let offset = match cols[2] {
                "-" => 0x10_0000 + i * 0x1000,
                o => usize::from_str_radix(o.trim_start_matches("0x"), 16).unwrap(),
            };
            all.push(Fixture {
                file,
                library: cols[0].to_string(),
                symbol: cols[1].to_string(),
                entry: 0x7f3a_1200_0000 + offset,
                code: hex(cols[3]),
            });
        }
    }
    assert!(all.len() >= 60, "fixtures missing: {}", all.len());
    all
}

#[test]
fn every_fixture_relocates_to_a_near_trampoline_with_both_entry_forms() {
    for f in fixtures() {
        for need in [X86_64::NEAR_JUMP_LEN, X86_64::FAR_JUMP_LEN] {
            // Near slots sit within ±2 GiB; try below and above the library.
            for trampoline in [f.entry - 0x7000_0000, f.entry + 0x6ff0_0000] {
                let r = relocate_checked(&f.code, f.entry, need, trampoline)
                    .unwrap_or_else(|e| panic!("{} {} {} (need {need}): {e}", f.file, f.library, f.symbol));
                let cet = f.code.starts_with(&memhook_x86_64::ENDBR64);
                assert_eq!(r.skip, if cet { 4 } else { 0 }, "{}", f.symbol);
            }
        }
    }
}

#[test]
fn far_trampolines_use_absolute_branches_or_refuse_rip_relative_operands() {
    let mut refused = 0;
    for f in fixtures() {
        let trampoline = f.entry + (1 << 34); // 16 GiB away
        match relocate_checked(&f.code, f.entry, X86_64::FAR_JUMP_LEN, trampoline) {
            Ok(_) => {}
            Err(RelocError::OutOfRange { address, target }) => {
                assert!(
                    address >= f.entry && target.abs_diff(trampoline) > 1 << 31,
                    "{}",
                    f.symbol
                );
                refused += 1;
            }
            Err(e) => panic!("{} {}: {e}", f.library, f.symbol),
        }
    }
    // libcuda's `cmp dword [rip+d], imm` lies under the 13-byte form.
    assert!(refused >= 30, "{refused}");
}

#[test]
fn libcuda_entries_fix_the_rip_relative_cmp() {
    let f = fixtures().into_iter().find(|f| f.symbol == "cuMemAlloc_v2").unwrap();
    let r = relocate_checked(&f.code, f.entry, 13, f.entry - 0x1000_0000).unwrap();
    // push rbp; mov rbp,rsp; push r12; sub rsp,8; cmp dword [rip+d], imm
    assert_eq!(r.taken, 20);
}

const E: usize = 0x5555_0000_1000;

fn refuse(code: &[u8], need: usize) -> RelocError {
    X86_64::relocate(code, E, need, E + 0x10_0000).unwrap_err()
}

#[test]
fn jcc_rel8_and_call_rel32_in_the_prologue_are_rewritten() {
    // test edi,edi; je +0x20; call +0x100; nop*8
    let code = [
        0x85, 0xff, 0x74, 0x20, 0xe8, 0, 1, 0, 0, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90,
    ];
    let r = relocate_checked(&code, E, 5, E + 0x10_0000).unwrap();
    assert_eq!(r.taken, 9);
    // The far jump's 13 bytes cover the call's return address (+9): a
    // thread in the callee while it is written would return into the
    // jump's middle.
    let e = refuse(&code, 13);
    assert_eq!(
        e,
        RelocError::Unsupported {
            address: E + 4,
            what: "a call that returns inside the patched bytes"
        }
    );
    // A call whose return address is the jump's end is moved: nothing
    // returns inside it.
    let code = [0x85, 0xff, 0x90, 0xe8, 0, 1, 0, 0, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90];
    let r = relocate_checked(&code, E, 8, E + 0x10_0000).unwrap();
    assert_eq!(r.taken, 8);
    // call rax (two bytes) at the entry returns at +2.
    assert!(matches!(
        refuse(&[0xff, 0xd0, 0x90, 0x90, 0x90, 0x90, 0xc3, 0xcc], 5),
        RelocError::Unsupported { .. }
    ));
}

#[test]
fn function_shorter_than_the_patch_is_refused() {
    assert_eq!(
        refuse(&[0x31, 0xc0, 0xc3, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc], 5),
        RelocError::FunctionTooShort {
            address: E + 2,
            available: 3,
            needed: 5
        }
    );
    // endbr64 then a 1-byte ret: the patch would land on padding.
    let e = refuse(&[0xf3, 0x0f, 0x1e, 0xfa, 0xc3, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc], 5);
    assert!(matches!(e, RelocError::FunctionTooShort { .. }), "{e:?}");
}

/// A debugger's breakpoint among the instructions a patch would move is
/// refused: gdb puts its `int3` after a function's frame setup, 4 bytes
/// in where libcuda's functions begin `push rbp; mov rbp, rsp` (driver
/// 580's entries), 8 bytes after `endbr64`, and at the entry itself
/// where it finds no frame setup (a uprobe too). Moved, the `int3` would
/// trap in the trampoline, and the debugger would later put the byte it
/// saved back into the patch. One past the moved instructions stays
/// where it is and is no concern of the patch.
#[test]
fn a_breakpoint_under_the_patch_is_refused() {
    let bp = |at: usize| RelocError::Breakpoint { address: E + at };
    // cuMemAlloc_v2's entry, with the byte of `push r12` (41 54) after
    // the frame setup replaced.
    assert_eq!(
        refuse(&[0x55, 0x48, 0x89, 0xe5, 0xcc, 0x54, 0x48, 0x83, 0xec, 0x08], 5),
        bp(4)
    );
    assert_eq!(refuse(&[0xcc, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x48, 0x83], 5), bp(0));
    // After endbr64 (which stays at the entry), at the patch's start and
    // after the frame setup.
    let cet = [0xf3, 0x0f, 0x1e, 0xfa, 0xcc, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x90, 0x90];
    assert_eq!(refuse(&cet, 5), bp(4));
    let cet = [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0xcc, 0x54, 0x90, 0x90];
    assert_eq!(refuse(&cet, 5), bp(8));
    // `int 3`, the two-byte form.
    assert_eq!(refuse(&[0x55, 0x48, 0x89, 0xe5, 0xcd, 0x03, 0x90, 0x90], 5), bp(4));
    // Past the moved instructions: relocated, the breakpoint left in place.
    let r = relocate_checked(&[0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0xcc, 0x90], E, 5, E + 0x10_0000).unwrap();
    assert_eq!(r.taken, 6);
    // The far form moves more: the same breakpoint is under it.
    assert_eq!(
        refuse(
            &[
                0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0xcc, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90
            ],
            13
        ),
        bp(6)
    );
}

/// glibc's `_dl_debug_state` (the loader's breakpoint) as Debian 12's
/// ld.so has it: `ret`, then padding to the next function, 16 bytes on.
const DEBUG_STATE_236: [u8; 16] = [
    0xc3, 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0, 0x0f, 0x1f, 0x40, 0,
];

#[test]
fn an_empty_function_the_caller_vouches_for_takes_its_padding() {
    // The plain relocation refuses it, as any function shorter than the
    // patch.
    assert!(matches!(
        refuse(&DEBUG_STATE_236, 5),
        RelocError::FunctionTooShort { .. }
    ));
    let r = X86_64::relocate_empty(&DEBUG_STATE_236, E, 5, E + 0x10_0000).unwrap();
    assert_eq!((r.skip, r.taken), (0, 5));
    // The trampoline: its landing pad, then the return alone.
    assert_eq!(&r.code[..], &[0xf3, 0x0f, 0x1e, 0xfa, 0xc3]);
    assert_eq!(&r.starts[..], &[(0, 4)]);
    // With CET: endbr64 stays at the entry, the patch covers the ret and
    // four bytes of padding (int3 here).
    let cet = [0xf3, 0x0f, 0x1e, 0xfa, 0xc3, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc];
    let r = X86_64::relocate_empty(&cet, E, 5, E + 0x10_0000).unwrap();
    assert_eq!((r.skip, r.taken), (4, 5));
    // `repz ret`, as compilers tuned for older AMD cores wrote it.
    let rep = [0xf3, 0xc3, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90];
    let r = X86_64::relocate_empty(&rep, E, 5, E + 0x10_0000).unwrap();
    assert_eq!((r.skip, r.taken, &r.code[4..]), (0, 5, &[0xc3][..]));
    // An empty function whose body does cover the patch relocates as any.
    let long = [0x0f, 0x1f, 0x44, 0, 0, 0xc3, 0xcc, 0xcc];
    let r = X86_64::relocate_empty(&long, E, 5, E + 0x10_0000).unwrap();
    assert_eq!(r.taken, 5);
}

#[test]
fn an_empty_function_is_refused_where_its_padding_may_be_code() {
    let empty = |code: &[u8], entry: usize| X86_64::relocate_empty(code, entry, 5, entry + 0x10_0000).unwrap_err();
    // Not a lone return: the function does something first.
    let e = empty(&[0x31, 0xc0, 0xc3, 0x90, 0x90, 0x90, 0x90, 0x90], E);
    assert!(matches!(e, RelocError::FunctionTooShort { .. }), "{e:?}");
    // Code after the return, not padding: another function's, or this
    // one's (a return in the middle of it).
    let e = empty(&[0xc3, 0x48, 0x89, 0xe5, 0x90, 0x90, 0x90, 0x90], E);
    assert!(matches!(e, RelocError::FunctionTooShort { .. }), "{e:?}");
    let e = empty(&[0xc3, 0x90, 0x90, 0x55, 0x90, 0x90, 0x90, 0x90], E);
    assert!(matches!(e, RelocError::FunctionTooShort { .. }), "{e:?}");
    // A return behind another prefix (REX here; the fuzzer's find): it
    // decodes as a `ret`, but no compiler writes it, so it is no empty
    // function's.
    let e = empty(&[0x43, 0xc3, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90], E);
    assert!(matches!(e, RelocError::FunctionTooShort { .. }), "{e:?}");
    // The patch would reach the next 16-byte block, where a function may
    // start: a return 3 bytes before it.
    let e = empty(&DEBUG_STATE_236, E + 13);
    assert!(
        matches!(
            e,
            RelocError::FunctionTooShort {
                available: 3,
                needed: 5,
                ..
            }
        ),
        "{e:?}"
    );
    // 12 bytes before it: the 5 bytes fit.
    assert!(X86_64::relocate_empty(&DEBUG_STATE_236, E + 4, 5, E + 0x10_0000).is_ok());
    // Too few bytes readable.
    let e = empty(&[0xc3, 0x90, 0x90], E);
    assert!(matches!(e, RelocError::NotEnoughBytes { .. }), "{e:?}");
    // The far form (13 bytes) fits no padding after a 16-aligned lone
    // return but for 15 bytes: it does here.
    assert!(X86_64::relocate_empty(&DEBUG_STATE_236, E, 13, E + 0x10_0000).is_ok());
}

#[test]
fn loop_back_into_the_patched_bytes_is_refused() {
    // L: dec ecx; jnz L; ret
    let code = [0xff, 0xc9, 0x75, 0xfc, 0x90, 0x90, 0xc3, 0xcc];
    assert_eq!(
        refuse(&code, 5),
        RelocError::BranchIntoPatch {
            address: E + 2,
            target: E
        }
    );
    // A later jump into the middle of the patched bytes.
    let code = [0xb8, 1, 0, 0, 0, 0x90, 0xeb, 0xf9, 0xc3];
    assert_eq!(
        refuse(&code, 5),
        RelocError::BranchIntoPatch {
            address: E + 6,
            target: E + 1
        }
    );
}

#[test]
fn a_later_call_of_the_entry_is_a_call_like_any_other() {
    // mov eax, 1; ret; then another function that calls this one's entry
    // (as glibc's compat aliases do): accepted, the call goes through the
    // patch.
    let code = [0xb8, 1, 0, 0, 0, 0xc3, 0xe8, 0xf5, 0xff, 0xff, 0xff, 0xc3];
    let r = relocate_checked(&code, E, 5, E + 0x10_0000).unwrap();
    assert_eq!(r.taken, 5);
    // The same place jumped to one byte further in is the middle: refused.
    let code = [0xb8, 1, 0, 0, 0, 0xc3, 0xe9, 0xf6, 0xff, 0xff, 0xff, 0xc3];
    assert_eq!(
        refuse(&code, 5),
        RelocError::BranchIntoPatch {
            address: E + 6,
            target: E + 1
        }
    );
}

#[test]
fn undecodable_and_unsupported_bytes_are_refused_with_the_reason() {
    assert_eq!(
        refuse(&[0x06, 0x90, 0x90, 0x90, 0x90, 0x90], 5),
        RelocError::Undecodable { address: E }
    );
    let e = refuse(&[0xe2, 0x10, 0x90, 0x90, 0x90, 0x90, 0x90], 5); // loop
    assert!(matches!(e, RelocError::Unsupported { what: "loop", .. }), "{e:?}");
    let e = refuse(&[0x90, 0x90], 5);
    assert_eq!(
        e,
        RelocError::NotEnoughBytes {
            available: 2,
            needed: 5
        }
    );
    assert!(e.to_string().contains("only 2 bytes"));
}

#[test]
fn entry_jump_forms() {
    assert_eq!(&X86_64::entry_jump(0x1000, 0x2000)[..], &[0xe9, 0xfb, 0x0f, 0, 0]);
    let far = X86_64::entry_jump(0x1000, 0x7fff_0000_0000);
    assert_eq!(far.len(), 13);
    assert_eq!(&far[..2], &[0x49, 0xbb]); // movabs r11
    assert_eq!(&far[10..], &[0x41, 0xff, 0xe3]); // jmp r11
    // A thread between the two has r11 loaded: it goes on at the
    // destination; the near form is one instruction.
    assert_eq!(X86_64::jump_interior(&far), Some((10, 0x7fff_0000_0000)));
    assert_eq!(X86_64::jump_interior(&X86_64::entry_jump(0x1000, 0x2000)), None);
    assert!(X86_64::is_near(0x1000, 0x1000 + 0x7fff_0000));
    assert!(!X86_64::is_near(0x1000, 0x1000 + 0x8000_0005));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Arbitrary bytes: every success is equivalent, every failure a
    /// RelocError; nothing panics.
    #[test]
    fn arbitrary_prologues_relocate_equivalently_or_refuse(data in proptest::collection::vec(any::<u8>(), 8..72)) {
        fuzz_relocate(&data);
    }
}

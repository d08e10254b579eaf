//! x86_64 relocation on real function entries (the fixtures read from live
//! processes: libcuda 580, libcudart 13, glibc 2.36 and 2.39) and on
//! hand-written prologues for each refusal.

use memhook_core::patch::{Arch, RelocError};
use memhook_tests::reloc_check::{fuzz_relocate, relocate_checked, relocate_keeping_checked};
use memhook_x86_64::X86_64;
use proptest::prelude::*;

struct Fixture {
    file: &'static str,
    library: String,
    symbol: String,
    entry: usize,
    code: Vec<u8>,
}

fn fixtures() -> Vec<Fixture> {
    let mut all = Vec::new();
    for file in [
        "prologues-debian12-glibc236.tsv",
        "prologues-h200-driver580-cuda13-glibc239.tsv",
    ] {
        for (i, row) in memhook_tests::fixtures::read(file).into_iter().enumerate() {
            let offset = row.offset.unwrap_or(0x10_0000 + i * 0x1000);
            all.push(Fixture {
                file,
                library: row.library,
                symbol: row.symbol,
                entry: 0x7f3a_1200_0000 + offset,
                code: row.code,
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

/// Every CUDA fixture entry keeps its first instruction ahead of the
/// patch, so a uprobe on it leaves the hook whole (libcuda's and
/// libcudart's `push rbp`), and so does every host function memhook
/// hooks in Debian 12's glibc (no CET): its system-call wrappers (`mov
/// eax, 11` of `munmap`, `mov r10d, ecx` of `mmap`, `mov rax, rdi` of
/// `syscall`, `cmp byte [rip+d], 0` of `fallocate` and `creat`) and
/// frames (`sub rsp, 0x58` of `mremap`, `push r12` of `sbrk`). With
/// `endbr64` first (a CET build), that stays and nothing more is kept.
#[test]
fn every_fixture_without_endbr64_keeps_its_first_instruction() {
    const DEBIAN_KEPT: [&str; 20] = [
        "fallocate",
        "creat",
        "mmap",
        "mmap64",
        "munmap",
        "mremap",
        "madvise",
        "shmat",
        "shmdt",
        "brk",
        "sbrk",
        "process_madvise",
        "ftruncate",
        "truncate",
        "remap_file_pages",
        "open",
        "openat",
        "shm_open",
        "syscall",
        "ioctl",
    ];
    let mut kept = 0;
    for f in fixtures() {
        let cet = f.code.starts_with(&memhook_x86_64::ENDBR64);
        let must = f.library != "libc.so.6" || DEBIAN_KEPT.contains(&f.symbol.as_str());
        for trampoline in [f.entry - 0x7000_0000, f.entry + 0x6ff0_0000] {
            match relocate_keeping_checked(&f.code, f.entry, X86_64::NEAR_JUMP_LEN, trampoline) {
                None => assert!(
                    cet || !must,
                    "{} {} {}: first instruction not kept",
                    f.file,
                    f.library,
                    f.symbol
                ),
                Some(r) => {
                    assert!(!cet, "{}: endbr64 is a landing pad, not kept", f.symbol);
                    let r = r.unwrap_or_else(|e| panic!("{} {} {}: {e}", f.file, f.library, f.symbol));
                    if f.library != "libc.so.6" {
                        assert_eq!(r.skip, 1, "{}: push rbp", f.symbol);
                    }
                    kept += 1;
                }
            }
        }
    }
    assert!(kept >= 2 * (43 + DEBIAN_KEPT.len()), "{kept}");
}

/// What may run before the hook, and what undoes it: a push or a stack
/// allocation (the hook must find the stack as the caller left it), or
/// a write of `rax`, `r10` or `r11` (no argument is passed in them), or
/// a whole write of an argument register that does not read it (the
/// function never reads what was passed there: no hook of its signature
/// does either). Nothing that writes a callee-saved register or part of
/// an argument's, changes an argument from what was passed, touches
/// memory through a register or branches.
#[test]
fn keep_first_takes_what_can_run_before_the_hook() {
    let lea8 = [0x48, 0x8d, 0x64, 0x24, 8]; // lea rsp, [rsp+8]
    // (code, what keep_first answers: the kept length and the undo)
    type Case<'a> = (&'a [u8], Option<(usize, &'a [u8])>);
    let cases: [Case<'_>; 53] = [
        (&[0x55, 0x48, 0x89, 0xe5], Some((1, &lea8))), // push rbp
        (&[0x41, 0x54, 0x90], Some((2, &lea8))),       // push r12
        (
            &[0x48, 0x83, 0xec, 0x58],
            Some((4, &[0x48, 0x8d, 0xa4, 0x24, 0x58, 0, 0, 0])),
        ), // sub rsp, 0x58
        (
            &[0x48, 0x81, 0xec, 0, 1, 0, 0],
            Some((7, &[0x48, 0x8d, 0xa4, 0x24, 0, 1, 0, 0])),
        ), // sub rsp, 0x100
        (&[0xb8, 0x0b, 0, 0, 0], Some((5, &[]))),      // mov eax, 11
        (&[0x41, 0x89, 0xca], Some((3, &[]))),         // mov r10d, ecx
        (&[0x49, 0x89, 0xca], Some((3, &[]))),         // mov r10, rcx
        (&[0x4d, 0x31, 0xdb], Some((3, &[]))),         // xor r11, r11
        (&[0x31, 0xc0], Some((2, &[]))),               // xor eax, eax
        (&[0xf3, 0x0f, 0x1e, 0xfa, 0x55], None),       // endbr64 (a landing pad)
        (&[0x48, 0x89, 0xe5], None),                   // mov rbp, rsp
        (&[0xbf, 5, 0, 0, 0], Some((5, &[]))),         // mov edi, 5: rdi unread
        (&[0x48, 0x83, 0xef, 0x08], None),             // sub rdi, 8
        (&[0x48, 0x29, 0xc4], None),                   // sub rsp, rax
        (&[0x80, 0x3d, 0, 1, 0, 0, 0], Some((7, &[]))), // cmp byte [rip+0x100], 0
        (&[0x83, 0x3d, 0, 1, 0, 0, 7], Some((7, &[]))), // cmp dword [rip+0x100], 7
        (&[0x80, 0x38, 0], None),                      // cmp byte [rax], 0
        (&[0x80, 0x05, 0, 1, 0, 0, 1], None),          // add byte [rip+0x100], 1
        (&[0x8b, 0x05, 0, 0, 0, 0], Some((6, &[]))),   // mov eax, [rip]
        (&[0x48, 0x8b, 0x05, 0, 1, 0, 0], Some((7, &[]))), // mov rax, [rip+0x100]
        (&[0x4c, 0x8b, 0x1d, 0, 1, 0, 0], Some((7, &[]))), // mov r11, [rip+0x100]
        (&[0x0f, 0xb6, 0x05, 4, 0, 0, 0], Some((7, &[]))), // movzx eax, byte [rip+4]
        (&[0x48, 0x8d, 0x05, 0x10, 0, 0, 0], Some((7, &[]))), // lea rax, [rip+0x10]
        (&[0x48, 0x8d, 0x44, 0x24, 8], Some((5, &[]))), // lea rax, [rsp+8]: no read
        (&[0x48, 0x85, 0xff], Some((3, &[]))),         // test rdi, rdi
        (&[0x83, 0xff, 5], Some((3, &[]))),            // cmp edi, 5
        (&[0x48, 0x39, 0xca], Some((3, &[]))),         // cmp rdx, rcx
        (&[0xa8, 1], Some((2, &[]))),                  // test al, 1
        (&[0xf6, 0x05, 0, 1, 0, 0, 1], Some((7, &[]))), // test byte [rip+0x100], 1
        (&[0x48, 0x8b, 0x0d, 0, 0, 0, 0], Some((7, &[]))), // mov rcx, [rip]: rcx unread
        (&[0x48, 0x8d, 0x35, 0, 0, 0, 0], Some((7, &[]))), // lea rsi, [rip]: rsi unread
        (&[0x89, 0xfa], Some((2, &[]))),               // mov edx, edi (glibc's)
        (&[0x49, 0x89, 0xf1], Some((3, &[]))),         // mov r9, rsi
        (&[0x31, 0xd2], Some((2, &[]))),               // xor edx, edx
        (&[0x48, 0x8d, 0x57, 0x08], Some((4, &[]))),   // lea rdx, [rdi+8]
        (&[0x48, 0x63, 0xff], Some((3, &[]))),         // movsxd rdi, edi: an int's upper half
        (&[0x89, 0xff], Some((2, &[]))),               // mov edi, edi: the same
        (&[0x31, 0xfa], None),                         // xor edx, edi: reads rdx
        (&[0x48, 0x8d, 0x7f, 0x08], None),             // lea rdi, [rdi+8]: changes rdi
        (&[0x48, 0x8d, 0x14, 0x14], None),             // lea rdx, [rsp+rdx]: the same
        (&[0x40, 0x0f, 0xb6, 0xff], None),             // movzx edi, dil: the same
        (&[0xb2, 0x01], None),                         // mov dl, 1: part of rdx
        (&[0x89, 0xfb], None),                         // mov ebx, edi: callee-saved
        (&[0x48, 0x8b, 0x17], None),                   // mov rdx, [rdi]: maybe a device's
        (&[0x8b, 0x07], None),                         // mov eax, [rdi]: maybe a device's
        (&[0x48, 0x85, 0x07], None),                   // test [rdi], rax: the same
        (&[0x48, 0xa1, 0, 0, 0, 0, 0, 0, 0, 0], None), // mov rax, [abs 0]
        (&[0x31, 0x05, 0, 0, 0, 0], None),             // xor [rip], eax: a write
        (&[0x48, 0x8b, 0x04, 0x24], None),             // mov rax, [rsp]
        (&[0xff, 0x35, 0, 0, 0, 0], None),             // push qword [rip]
        (&[0xcc, 0x90], None),                         // int3
        (&[0xe8, 0, 0, 0, 0], None),                   // call
        (&[0x0f, 0x0b], None),                         // ud2
    ];
    for (code, want) in cases {
        let got = X86_64::keep_first(code);
        assert_eq!(got.as_ref().map(|(n, u)| (*n, &u[..])), want, "{code:02x?}");
    }
}

/// With the first instruction kept, the patch's start is no entry: a
/// branch back to it (a loop to the system call after `mov eax, n`)
/// would reach the hook again with nothing to undo. That is refused,
/// and the plain patch, which covers the `mov` alone, is the one taken.
/// A moved instruction's branch to the entry (a loop through the kept
/// instruction) is refused as in the plain patch.
#[test]
fn a_branch_to_the_kept_patchs_start_is_refused() {
    // mov eax, 11; syscall; cmp rax, -4095; jae -10 (to the syscall); ret
    let code = [
        0xb8, 0x0b, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0xf6, 0xc3,
    ];
    assert_eq!(
        X86_64::relocate_keeping(&code, E, 5, 5, E + 0x10_0000),
        Err(RelocError::BranchIntoPatch {
            address: E + 13,
            target: E + 5
        })
    );
    assert_eq!(relocate_checked(&code, E, 5, E + 0x10_0000).unwrap().taken, 5);
    // push rbp; dec edi; jnz entry; nop
    let code = [0x55, 0xff, 0xcf, 0x75, 0xfb, 0x90, 0x90, 0xc3];
    assert_eq!(
        X86_64::relocate_keeping(&code, E, 1, 5, E + 0x10_0000),
        Err(RelocError::BranchIntoPatch {
            address: E + 3,
            target: E
        })
    );
    // A `keep` other than the first instruction's is refused.
    let code = [0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x90, 0x90, 0xc3];
    assert!(matches!(
        X86_64::relocate_keeping(&code, E, 4, 5, E + 0x10_0000),
        Err(RelocError::Unsupported { .. })
    ));
    assert_eq!(
        relocate_keeping_checked(&code, E, 5, E + 0x10_0000)
            .unwrap()
            .unwrap()
            .taken,
        5
    );
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

    /// Arbitrary bytes after a first instruction that can be kept: every
    /// success of the kept layout is equivalent and branches nowhere
    /// into the patch; nothing panics.
    #[test]
    fn arbitrary_code_after_a_kept_instruction_relocates_or_refuses(
        first in 0usize..11,
        rest in proptest::collection::vec(any::<u8>(), 0..56),
        entry in 0u32..u32::MAX,
        delta in -0x7000_0000i64..0x7000_0000,
    ) {
        let heads: [&[u8]; 11] = [
            &[0x55],
            &[0x41, 0x54],
            &[0x48, 0x83, 0xec, 0x58],
            &[0xb8, 0x0b, 0, 0, 0],
            &[0x41, 0x89, 0xca],
            &[0x80, 0x3d, 0x21, 0xe8, 0x0d, 0, 0],
            &[0x48, 0x8b, 0x05, 0x39, 0x8f, 0x1b, 0], // mov rax, [rip+0x1b8f39]
            &[0x48, 0x8d, 0x05, 0xf0, 0xff, 0xff, 0xff], // lea rax, [rip-0x10]
            &[0x48, 0x85, 0xff],                      // test rdi, rdi
            &[0x89, 0xfa],                            // mov edx, edi
            &[0x48, 0x8d, 0x57, 0x08],                // lea rdx, [rdi+8]
        ];
        let mut code = heads[first].to_vec();
        code.extend_from_slice(&rest);
        let entry = 0x7f00_0000_0000usize + ((entry as usize) << 4);
        let kept = relocate_keeping_checked(&code, entry, 5, (entry as i64 + delta) as usize);
        prop_assert!(kept.is_some());
    }
}

//! Checks that relocated x86_64 code does what the original did: the
//! trampoline is decoded and walked beside the original instructions, and
//! every instruction must have the same bytes, or (RIP-relative operands)
//! the same bytes outside the displacement and the same absolute address, or
//! (branches) the same kind, condition and absolute target, and the
//! relocation's map of instruction starts must point each original
//! instruction at its copy. Shared by the
//! fixture tests, the property test and the `relocate` fuzz target.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};
use memhook_core::patch::{Arch, RelocError, Relocation};
use memhook_x86_64::{ENDBR64, X86_64};

fn decode_at(bytes: &[u8], ip: usize) -> Instruction {
    let mut d = Decoder::with_ip(64, bytes, ip as u64, DecoderOptions::NONE);
    d.decode()
}

fn literal(bytes: &[u8]) -> usize {
    u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

/// Reads an absolute `jmp [rip+0]; .quad t` at `code[at..]`; returns `t`.
fn abs_jmp(code: &[u8], at: usize) -> Option<usize> {
    (code.get(at..at + 6)? == [0xff, 0x25, 0, 0, 0, 0]).then(|| literal(&code[at + 6..]))
}

/// Panics with a description unless `r` (relocated from `code` at `entry`
/// to `trampoline`) is equivalent to the original.
pub fn assert_equivalent(code: &[u8], entry: usize, r: &Relocation, trampoline: usize) {
    let tr = &r.code[..];
    assert_eq!(&tr[..4], &ENDBR64, "trampoline must start with endbr64");
    // Past a landing pad, which stays at the entry alone; or past a kept
    // first instruction, which the trampoline runs again first, as it is.
    let kept = if r.skip == X86_64::entry_skip(code) {
        0
    } else {
        let (keep, _) = X86_64::keep_first(code).expect("the entry keeps a landing pad or a kept instruction");
        assert_eq!(r.skip, keep, "the patch starts after the kept instruction");
        let o = decode_at(code, entry);
        if o.is_ip_rel_memory_operand() {
            // The same instruction, reading the same address.
            let t = decode_at(&tr[4..], trampoline + 4);
            assert_eq!(
                (t.code(), t.len()),
                (o.code(), o.len()),
                "the kept instruction runs first"
            );
            assert_eq!(t.ip_rel_memory_address(), o.ip_rel_memory_address());
        } else {
            assert_eq!(&tr[4..4 + keep], &code[..keep], "the kept instruction runs first");
        }
        keep
    };
    let start = entry + r.skip;
    let body = &code[r.skip..r.skip + r.taken];
    let mut dec = Decoder::with_ip(64, body, start as u64, DecoderOptions::NONE);
    let mut at = 4 + kept; // cursor in the trampoline
    let mut o = Instruction::default();
    let mut starts = Vec::new();
    while dec.can_decode() {
        let o_off = (dec.ip() as usize) - start;
        starts.push((o_off as u8, at as u16));
        dec.decode_out(&mut o);
        let o_bytes = &body[o_off..o_off + o.len()];
        let t_ip = trampoline + at;
        let t = decode_at(&tr[at..], t_ip);
        let what = format!("{:?} at {:#x} -> {:?} at {t_ip:#x}", o.code(), o.ip(), t.code());
        match o.flow_control() {
            FlowControl::ConditionalBranch => {
                let target = o.near_branch_target();
                if t.is_jcc_near() && t.condition_code() == o.condition_code() {
                    assert_eq!(t.near_branch_target(), target, "{what}");
                    at += t.len();
                } else {
                    assert!(t.is_jcc_short(), "{what}");
                    assert_eq!(
                        (t.condition_code() as u8 - 1) ^ 1,
                        o.condition_code() as u8 - 1,
                        "{what}"
                    );
                    assert_eq!(t.near_branch_target() as usize, t_ip + 2 + 14, "{what}");
                    assert_eq!(abs_jmp(tr, at + 2), Some(target as usize), "{what}");
                    at += 16;
                }
            }
            FlowControl::UnconditionalBranch if o.is_jmp_short_or_near() => {
                let target = o.near_branch_target() as usize;
                if t.is_jmp_near() {
                    assert_eq!(t.near_branch_target() as usize, target, "{what}");
                    at += 5;
                } else {
                    assert_eq!(abs_jmp(tr, at), Some(target), "{what}");
                    at += 14;
                }
            }
            FlowControl::Call if o.is_call_near() => {
                let target = o.near_branch_target() as usize;
                if t.is_call_near() {
                    assert_eq!(t.near_branch_target() as usize, target, "{what}");
                    at += 5;
                } else {
                    assert_eq!(&tr[at..at + 8], &[0xff, 0x15, 2, 0, 0, 0, 0xeb, 8], "{what}");
                    assert_eq!(literal(&tr[at + 8..]), target, "{what}");
                    at += 16;
                }
            }
            _ if o.is_ip_rel_memory_operand() => {
                assert_eq!(t.code(), o.code(), "{what}");
                assert_eq!(t.ip_rel_memory_address(), o.ip_rel_memory_address(), "{what}");
                let offs = dec.get_constant_offsets(&o);
                let (d0, d1) = (offs.displacement_offset(), offs.displacement_offset() + 4);
                let t_bytes = &tr[at..at + o.len()];
                assert_eq!(&t_bytes[..d0], &o_bytes[..d0], "{what}");
                assert_eq!(&t_bytes[d1..], &o_bytes[d1..], "{what}");
                at += o.len();
            }
            _ => {
                assert_eq!(&tr[at..at + o.len()], o_bytes, "{what}");
                at += o.len();
            }
        }
    }
    // The jump back to the first byte after the moved ones.
    let back = start + r.taken;
    let t = decode_at(&tr[at..], trampoline + at);
    if t.is_jmp_near() {
        assert_eq!(t.near_branch_target() as usize, back);
        at += 5;
    } else {
        assert_eq!(abs_jmp(tr, at), Some(back), "jump back");
        at += 14;
    }
    assert_eq!(at, tr.len(), "trailing bytes in the trampoline");
    // Each moved instruction's start, where a thread stopped before it
    // resumes (the walk above found each original one's copy there).
    assert_eq!(r.starts[..], starts[..], "instruction starts");
}

/// Relocates `code` and, on success, checks equivalence; returns the result.
pub fn relocate_checked(code: &[u8], entry: usize, need: usize, trampoline: usize) -> Result<Relocation, RelocError> {
    let r = X86_64::relocate(code, entry, need, trampoline)?;
    assert_relocated(code, entry, need, &r, trampoline);
    Ok(r)
}

/// A relocation's bounds (the patch covered, within `code`), and
/// [`assert_equivalent`].
fn assert_relocated(code: &[u8], entry: usize, need: usize, r: &Relocation, trampoline: usize) {
    assert!(r.taken >= need, "took {} bytes for a {need}-byte patch", r.taken);
    assert!(r.skip + r.taken <= code.len());
    assert_equivalent(code, entry, r, trampoline);
}

/// [`Arch::relocate_keeping`] on `code` where [`Arch::keep_first`] keeps
/// its first instruction (`None` where it does not), checked as
/// [`relocate_checked`]; and, since the patch's start is no entry there,
/// no instruction of the moved ones or of those after them (as far as
/// `code` goes) branches anywhere from the entry's second byte to the
/// moved bytes' end.
pub fn relocate_keeping_checked(
    code: &[u8],
    entry: usize,
    need: usize,
    trampoline: usize,
) -> Option<Result<Relocation, RelocError>> {
    let (keep, _) = X86_64::keep_first(code)?;
    let r = match X86_64::relocate_keeping(code, entry, keep, need, trampoline) {
        Ok(r) => r,
        Err(e) => return Some(Err(e)),
    };
    assert_eq!(r.skip, keep);
    assert_relocated(code, entry, need, &r, trampoline);
    let mut dec = Decoder::with_ip(64, &code[keep..], (entry + keep) as u64, DecoderOptions::NONE);
    while dec.can_decode() {
        let i = dec.decode();
        if i.is_invalid() {
            break;
        }
        if matches!(
            i.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
        ) && (i.is_jcc_short_or_near() || i.is_jmp_short_or_near() || i.is_call_near())
        {
            let t = i.near_branch_target() as usize;
            let moved = (i.ip() as usize) < entry + keep + r.taken;
            let into = (entry + 1..entry + keep + r.taken).contains(&t) || (moved && t == entry);
            assert!(
                !into,
                "{:?} at {:#x} branches to {t:#x}, inside the kept instruction or the patch",
                i.code(),
                i.ip()
            );
        }
    }
    Some(Ok(r))
}

/// [`Arch::relocate_empty`] on `code` (a function the caller vouches is
/// empty), checked: where the plain relocation succeeds, the same answer;
/// where only the empty one does, the lone-return form: a `ret` (or
/// `repz ret`) first (after `endbr64`), the rest of the patch's bytes `nop` or `int3`
/// padding inside the `ret`'s 16-byte block, and a trampoline of the
/// landing pad and the `ret`.
pub fn relocate_empty_checked(
    code: &[u8],
    entry: usize,
    need: usize,
    trampoline: usize,
) -> Result<Relocation, RelocError> {
    let plain = X86_64::relocate(code, entry, need, trampoline);
    let empty = X86_64::relocate_empty(code, entry, need, trampoline);
    match (&plain, &empty) {
        (Ok(p), _) => assert_eq!(empty.as_ref(), Ok(p), "an empty function that relocates anyway"),
        (Err(_), Ok(r)) => {
            let skip = X86_64::entry_skip(code);
            let start = entry + skip;
            assert_eq!((r.skip, r.taken), (skip, need));
            let ret = match code[skip..] {
                [0xc3, ..] => 1,
                [0xf3, 0xc3, ..] => 2,
                _ => panic!("not a lone ret (or repz ret): {:02x?}", &code[skip..]),
            };
            assert!(start + need <= (start | 15) + 1, "the patch stays in the ret's block");
            let mut dec = Decoder::with_ip(64, &code[skip + ret..], (start + ret) as u64, DecoderOptions::NONE);
            let mut covered = ret;
            while covered < need {
                let i = dec.decode();
                assert!(
                    i.mnemonic() == iced_x86::Mnemonic::Nop || i.code() == iced_x86::Code::Int3,
                    "padding: {:?} at {:#x}",
                    i.code(),
                    i.ip()
                );
                covered += i.len();
            }
            assert_eq!(&r.code[..], &[0xf3, 0x0f, 0x1e, 0xfa, 0xc3]);
            assert_eq!(&r.starts[..], &[(0, 4)]);
        }
        (Err(_), Err(_)) => {}
    }
    empty
}

/// The `relocate` fuzz target's body: the first 8 bytes choose the entry,
/// the trampoline distance and the patch form; the rest is the prologue.
pub fn fuzz_relocate(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let entry = 0x7f00_0000_0000usize + ((u32::from_le_bytes(data[0..4].try_into().unwrap()) as usize) << 4);
    let delta = i32::from_le_bytes(data[4..8].try_into().unwrap()) as i64;
    // Near (within ±2 GiB) or, when the low bit says so, 16 GiB further.
    let far = if delta & 1 == 1 { 1i64 << 34 } else { 0 };
    let trampoline = (entry as i64 + delta + far) as usize;
    let need = if data[0] & 0x80 != 0 { 13 } else { 5 };
    let _ = relocate_checked(&data[8..], entry, need, trampoline);
    // The first instruction kept ahead of the patch, where it can be.
    let _ = relocate_keeping_checked(&data[8..], entry, need, trampoline);
    // The same bytes as an empty function (the loader's breakpoint), at
    // the entry and at an entry anywhere in a 16-byte block.
    let _ = relocate_empty_checked(&data[8..], entry, need, trampoline);
    let _ = relocate_empty_checked(&data[8..], entry + usize::from(data[1] & 15), need, trampoline);
}

//! memhook-aarch64: aarch64 code generation for memhook's bistro hooks.
//!
//! Implements `memhook_core::patch::Arch` for aarch64. Pure code
//! generation (instruction words in, instruction words out): testable on
//! any host.
//!
//! - Entry forms: `b imm26` when the destination is within ±128 MiB (one
//!   aligned 4-byte store: no torn state at all), else `ldr x16, #8;
//!   br x16; .quad dest` (16 bytes; x16 is the ABI's intra-procedure-call
//!   scratch register, free at a function's entry). A `bti c`/`bti jc`
//!   at the entry stays in place and the patch goes after it; every
//!   trampoline starts with `bti c`, so an indirect call into it stays
//!   legal under BTI. A `paciasp`/`pacibsp` (also a landing
//!   pad) signs x30, so it stays as an instruction kept ahead of the patch
//!   ([`Arch::keep_first`]): the way to the hook undoes it (`autiasp`),
//!   the trampoline runs it again; where that cannot be, the function is
//!   refused. A frame record's `stp x29, x30, [sp, #-n]!` or a `sub sp`
//!   first is kept so too, so that a uprobe on the entry (which replaces
//!   the first instruction) leaves the patch whole.
//! - Relocation copies every instruction that does not read the PC and
//!   rewrites the PC-relative ones so they behave the same from the
//!   trampoline: ADR and ADRP (re-encoded when in reach, else a 64-bit
//!   constant load), LDR/LDRSW/PRFM literal and the SIMD literal loads
//!   (re-encoded, else the address into x16 and a load through it), B and
//!   BL (direct when in reach, else through x16; BL's x30 is the point
//!   after it in the trampoline, where the relocated code continues),
//!   B.cond, CBZ, CBNZ, TBZ, TBNZ (re-encoded, else the inverted condition
//!   over an absolute jump).
//! - Refusals, each a `RelocError` naming the case: a branch (from the taken
//!   words or the rest of the entry that was read) into the patched words,
//!   a function whose flow ends before the patch is covered, and x16/x17
//!   used by the taken instructions when a rewrite needs them.
#![no_std]

use memhook_core::patch::{Arch, PatchBytes, RelocError, Relocation, TrampolineBytes, keeping};

/// `R_AARCH64_GLOB_DAT`.
pub const R_AARCH64_GLOB_DAT: u32 = 1025;
/// `R_AARCH64_JUMP_SLOT`.
pub const R_AARCH64_JUMP_SLOT: u32 = 1026;

/// `bti c`.
pub const BTI_C: u32 = 0xd503_245f;
const BTI_JC: u32 = 0xd503_24df;
/// `paciasp`: signs x30 with key A and SP (and is a landing pad).
pub const PACIASP: u32 = 0xd503_233f;
/// `pacibsp`: as `paciasp`, key B.
pub const PACIBSP: u32 = 0xd503_237f;
/// `autiasp`: authenticates x30 signed by `paciasp` with the same SP.
pub const AUTIASP: u32 = 0xd503_23bf;
/// `autibsp`: as `autiasp`, key B.
pub const AUTIBSP: u32 = 0xd503_23ff;
/// `add sp, sp, #0` (imm12 at bit 10, `lsl #12` at bit 22).
const ADD_SP: u32 = 0x9100_03ff;
/// `b .` (the lock: a thread arriving at the entry spins there).
pub const B_SELF: u32 = 0x1400_0000;
/// `ldr x16, #8`.
const LDR_X16_LIT8: u32 = 0x5800_0050;
/// `br x16`.
const BR_X16: u32 = 0xd61f_0200;
/// `b #12` (over an 8-byte literal).
const B_OVER_LITERAL: u32 = 0x1400_0003;
/// The scratch register rewrites use.
const SCRATCH: u32 = 16;

/// The aarch64 backend.
pub struct Aarch64;

/// A signed field of `bits` bits at `shift`, as i64.
const fn sext(word: u32, shift: u32, bits: u32) -> i64 {
    let v = (word >> shift) & ((1u32 << bits) - 1);
    ((v as i64) << (64 - bits)) >> (64 - bits)
}

/// `offset` as a signed field of `bits` bits after dropping `scale` low
/// bits, if it fits exactly.
fn field(offset: i64, scale: u32, bits: u32) -> Option<u32> {
    if offset & ((1 << scale) - 1) != 0 {
        return None;
    }
    let v = offset >> scale;
    let lim = 1i64 << (bits - 1);
    (-lim..lim).contains(&v).then_some((v as u32) & ((1u32 << bits) - 1))
}

fn diff(from: usize, to: usize) -> i64 {
    (to as i64).wrapping_sub(from as i64)
}

/// What a word is, for relocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Insn {
    /// `b` (`link`: `bl`) to `target`.
    Branch { target: usize, link: bool },
    /// `b.cond`, `cbz/cbnz`, `tbz/tbnz` to `target`; `invert` is the word
    /// with the condition inverted and the offset field cleared; `shift`
    /// and `bits` place the offset field.
    CondBranch {
        target: usize,
        invert: u32,
        shift: u32,
        bits: u32,
    },
    /// `adr` (`page`: `adrp`) of `target` into `rd`.
    Adr { target: usize, rd: u32, page: bool },
    /// A literal load of `target` into `rt`; `via` is the load through
    /// `[x16]` that replaces it out of reach.
    Literal { target: usize, via: u32 },
    /// `ret`, `br`, or an unconditional `b`: the flow does not continue.
    End,
    /// Anything else: position-independent, copied.
    Other,
}

fn decode(word: u32, pc: usize) -> Insn {
    let at = |off: i64| pc.wrapping_add(off as usize);
    // B / BL
    if word & 0x7c00_0000 == 0x1400_0000 {
        return Insn::Branch {
            target: at(sext(word, 0, 26) * 4),
            link: word & 0x8000_0000 != 0,
        };
    }
    // B.cond (and BC.cond): AL and NV always branch.
    if word & 0xff00_0000 == 0x5400_0000 {
        let cond = word & 0xf;
        let target = at(sext(word, 5, 19) * 4);
        if cond >= 0xe {
            return Insn::Branch { target, link: false };
        }
        return Insn::CondBranch {
            target,
            invert: (word & !(0x7ffff << 5)) ^ 1,
            shift: 5,
            bits: 19,
        };
    }
    // CBZ / CBNZ
    if word & 0x7e00_0000 == 0x3400_0000 {
        return Insn::CondBranch {
            target: at(sext(word, 5, 19) * 4),
            invert: (word & !(0x7ffff << 5)) ^ (1 << 24),
            shift: 5,
            bits: 19,
        };
    }
    // TBZ / TBNZ
    if word & 0x7e00_0000 == 0x3600_0000 {
        return Insn::CondBranch {
            target: at(sext(word, 5, 14) * 4),
            invert: (word & !(0x3fff << 5)) ^ (1 << 24),
            shift: 5,
            bits: 14,
        };
    }
    // ADR / ADRP
    if word & 0x1f00_0000 == 0x1000_0000 {
        let imm = (sext(word, 5, 19) << 2) | i64::from((word >> 29) & 3);
        let page = word & 0x8000_0000 != 0;
        let target = if page {
            (pc & !0xfff).wrapping_add((imm << 12) as usize)
        } else {
            at(imm)
        };
        return Insn::Adr {
            target,
            rd: word & 0x1f,
            page,
        };
    }
    // Literal loads: opc(2) 011 V 00 imm19 Rt.
    if word & 0x3b00_0000 == 0x1800_0000 {
        let rt = word & 0x1f;
        let base = SCRATCH << 5;
        let via = match (word >> 30, word & (1 << 26) != 0) {
            (0, false) => 0xb940_0000 | base | rt, // ldr wt, [x16]
            (1, false) => 0xf940_0000 | base | rt, // ldr xt, [x16]
            (2, false) => 0xb980_0000 | base | rt, // ldrsw xt, [x16]
            (3, false) => 0xf980_0000 | base | rt, // prfm op, [x16]
            (0, true) => 0xbd40_0000 | base | rt,  // ldr st, [x16]
            (1, true) => 0xfd40_0000 | base | rt,  // ldr dt, [x16]
            (2, true) => 0x3dc0_0000 | base | rt,  // ldr qt, [x16]
            _ => return Insn::Other,               // unallocated: copied as is
        };
        return Insn::Literal {
            target: at(sext(word, 5, 19) * 4),
            via,
        };
    }
    // Branches to a register: BR, RET, ERET, BRAA/BRAB (and their Z forms,
    // RETAA/RETAB) leave; BLR and BLRAA return here.
    if word >> 25 == 0x6b && matches!((word >> 21) & 0xf, 0 | 2 | 4 | 8) {
        return Insn::End;
    }
    Insn::Other
}

/// Whether the word is a call (BL, BLR, BLRAA and its kin): it returns to
/// the next word.
fn links(word: u32) -> bool {
    let bl = word & 0xfc00_0000 == 0x9400_0000;
    let blr = word >> 25 == 0x6b && matches!((word >> 21) & 0xf, 1 | 9);
    bl || blr
}

/// The address a PC-relative instruction at `pc` refers to (branch
/// target, ADR/ADRP value, literal address), or `None` for an instruction
/// that does not read the PC. For checkers and tools.
pub fn pc_relative_target(word: u32, pc: usize) -> Option<usize> {
    match decode(word, pc) {
        Insn::Branch { target, .. }
        | Insn::CondBranch { target, .. }
        | Insn::Adr { target, .. }
        | Insn::Literal { target, .. } => Some(target),
        Insn::End | Insn::Other => None,
    }
}

/// Whether the word at `pc` may read or write x16 or x17: exact for the
/// PC-relative forms (whose only register is the destination or the
/// tested one), conservative for the rest (any register field naming
/// them; some immediates look like register numbers).
fn may_use_scratch(word: u32, pc: usize) -> bool {
    let scratch = |r: u32| matches!(r & 0x1f, 16 | 17);
    match decode(word, pc) {
        Insn::Branch { .. } => false,
        Insn::CondBranch { .. } => word >> 24 != 0x54 && scratch(word),
        Insn::Adr { rd, .. } => scratch(rd),
        Insn::Literal { .. } => scratch(word),
        Insn::End | Insn::Other => {
            // Data processing with an immediate (op0 100x) names only Rd
            // and Rn; other classes may name a register in any field.
            let fields: &[u32] = if (word >> 26) & 0b111 == 0b100 {
                &[0, 5]
            } else {
                &[0, 5, 10, 16]
            };
            fields.iter().any(|&s| scratch(word >> s))
        }
    }
}

/// Appends words to the trampoline.
struct Out {
    code: TrampolineBytes,
    base: usize,
}

impl Out {
    fn pc(&self) -> usize {
        self.base + self.code.len()
    }

    fn word(&mut self, w: u32) -> Result<(), RelocError> {
        self.code
            .extend_from_slice(&w.to_le_bytes())
            .map_err(|_| RelocError::TrampolineFull)
    }

    fn quad(&mut self, q: u64) -> Result<(), RelocError> {
        self.code
            .extend_from_slice(&q.to_le_bytes())
            .map_err(|_| RelocError::TrampolineFull)
    }

    /// Jumps to `target`: `b` when in reach, else through x16. Returns
    /// whether x16 was used.
    fn jump(&mut self, target: usize) -> Result<bool, RelocError> {
        if let Some(imm) = field(diff(self.pc(), target), 2, 26) {
            self.word(0x1400_0000 | imm)?;
            return Ok(false);
        }
        self.word(LDR_X16_LIT8)?;
        self.word(BR_X16)?;
        self.quad(target as u64)?;
        Ok(true)
    }
}

impl Aarch64 {
    /// The length of the landing pad at the start of `code`: a `bti c` or
    /// `bti jc` (4), or none. A `paciasp` or `pacibsp`, a landing pad too,
    /// also signs x30: it is kept ahead of the patch with the `autiasp`
    /// that undoes it ([`Arch::keep_first`]), never left alone.
    fn pad(code: &[u8]) -> usize {
        match Self::word(code, 0) {
            Some(BTI_C | BTI_JC) => 4,
            _ => 0,
        }
    }

    /// Whether `w` may run before the hook and again in the trampoline
    /// with nothing to undo: a `nop`; a `cmp`, `cmn` or `tst` (`subs`,
    /// `adds`, `ands`, `bics` into the zero register: only the flags
    /// change, and no function's caller leaves anything in them for it);
    /// or a `movz`, `movn`, a register or bitmask `mov`, an `add` or `sub`
    /// of an immediate or a `sxtw`, into x9 to x15 (which carry no
    /// argument), or into x0 to x8 where it does not read the register it
    /// writes: a function whose first word overwrites what was passed
    /// there never reads it, so it takes no argument there (x8: no large
    /// result's address) and the hook, of its signature, reads none
    /// either (glibc's system calls load their number into x8; its `brk`
    /// begins `mov x1, x0`, `creat` `mov w2, w1`). Not x16 and x17, the
    /// trampoline's own scratch, nor x18 or a callee-saved register, nor a
    /// PC-relative word (its copy would read elsewhere) or a load (its
    /// address may be a device's memory, where a second read is not the
    /// first). And a `sxtw` of a register into itself (glibc's `shmat`
    /// and `ftruncate` begin `sxtw x0, w0`), or a `mov` of its 32 bits
    /// into itself: it changes only the upper half of a 32-bit argument,
    /// which the caller leaves undefined and the hook, of the same
    /// signature, does not read.
    fn harmless(w: u32) -> bool {
        const NOP: u32 = 0xd503_201f;
        let (rd, rn) = (w & 31, (w >> 5) & 31);
        let flags_only = rd == 31
            && (w & 0x7f80_0000 == 0x7100_0000 // subs, immediate (cmp)
                || w & 0x7f80_0000 == 0x3100_0000 // adds, immediate (cmn)
                || w & 0x7f20_0000 == 0x6b00_0000 // subs, shifted register
                || w & 0x7f20_0000 == 0x2b00_0000 // adds, shifted register
                || w & 0x7fe0_0000 == 0x6b20_0000 // subs, extended register
                || w & 0x7fe0_0000 == 0x2b20_0000 // adds, extended register
                || w & 0x7f80_0000 == 0x7200_0000 // ands, immediate (tst)
                || w & 0x7f00_0000 == 0x6a00_0000); // ands/bics, shifted register
        let (rm, shift) = ((w >> 16) & 31, (w >> 10) & 63);
        // What the function was passed in rd is not read (x9 to x15
        // carry nothing).
        let unread = |read: u32| rd >= 9 || read != rd;
        let sxtw = w & 0xffff_fc00 == 0x9340_7c00;
        let moves = rd <= 15
            && (w & 0x7f80_0000 == 0x5280_0000 // movz
                || w & 0x7f80_0000 == 0x1280_0000 // movn
                // orr, shifted register, from zr: mov (of itself, no shift:
                // only the upper half of a 32-bit argument)
                || (w & 0x7f20_0000 == 0x2a00_0000 && rn == 31 && (unread(rm) || shift == 0))
                || (w & 0x7f80_0000 == 0x3200_0000 && rn == 31) // orr, bitmask immediate, from zr: mov
                || (w & 0x7f80_0000 == 0x1100_0000 && unread(rn)) // add, immediate
                || (w & 0x7f80_0000 == 0x5100_0000 && unread(rn)) // sub, immediate
                || sxtw);
        let widens_itself = sxtw && rd == rn; // sxtw xn, wn
        w == NOP || flags_only || moves || widens_itself
    }

    /// The word at byte `at` of `code`, if whole.
    fn word(code: &[u8], at: usize) -> Option<u32> {
        let w = code.get(at..at + 4)?;
        Some(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    }

    /// [`Arch::relocate`], or with `keep` bytes (a landing pad and the
    /// instruction [`Arch::keep_first`] named) left ahead of the patch,
    /// the instruction run first in the trampoline:
    /// [`Arch::relocate_keeping`].
    fn relocate_impl(
        code: &[u8],
        entry: usize,
        keep: Option<usize>,
        need: usize,
        trampoline: usize,
    ) -> Result<Relocation, RelocError> {
        /// `brk #imm16`: gdb's breakpoint is `brk #0`, a uprobe's `brk #5`.
        fn is_brk(w: u32) -> bool {
            w & 0xffe0_001f == 0xd420_0000
        }
        let pad = Self::pad(code);
        let skip = keep.unwrap_or(pad);
        let start = entry + skip;
        // A `paciasp` moved off the entry would leave the callers' indirect
        // branches no landing pad (a BTI fault where the page is guarded),
        // and one left at the entry signs x30 for the hook: it is kept, with
        // its undo, or the function refused.
        if keep.is_none() && matches!(Self::word(code, skip), Some(PACIASP | PACIBSP)) {
            return Err(RelocError::Unsupported {
                address: start,
                what: "paciasp/pacibsp at the entry, kept only with its undo ahead of the patch",
            });
        }
        let words: heapless::Vec<u32, 64> = code[skip..]
            .chunks_exact(4)
            .take(64)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let count = need.div_ceil(4);
        if words.len() < count {
            return Err(RelocError::NotEnoughBytes {
                available: words.len() * 4,
                needed: need,
            });
        }
        let taken = count * 4;
        // Into the moved words (a branch to their start is a call of the
        // function, as to the entry), or, where an instruction is kept,
        // anywhere past the entry up to their end (the patch's start is no
        // entry then: a branch there would reach the hook with the kept
        // instruction undone where it had not been done), or from a moved
        // word to the entry (a loop through the kept instruction and the
        // hook again).
        let inside = |t: usize, moved: bool| {
            if keep.is_some() {
                (t > entry || (moved && t == entry)) && t < start + taken
            } else {
                t > start && t < start + taken
            }
        };
        // A call that returns inside the words the jump overwrites (a far
        // jump's first three): a thread in the callee when the patch is
        // written would return into the middle of the jump.
        if let Some(i) = (0..count).find(|&i| 4 * (i + 1) < need && links(words[i])) {
            return Err(RelocError::Unsupported {
                address: start + 4 * i,
                what: "a call that returns inside the patched bytes",
            });
        }
        // The flow must cover the patch, and nothing may branch into it.
        for (i, &w) in words.iter().enumerate() {
            let pc = start + 4 * i;
            // A debugger's `brk` (or a uprobe's) among the words moved.
            if i < count && is_brk(w) {
                return Err(RelocError::Breakpoint { address: pc });
            }
            let insn = decode(w, pc);
            if let Insn::Branch { target, .. } | Insn::CondBranch { target, .. } = insn
                && inside(target, i < count)
            {
                return Err(RelocError::BranchIntoPatch { address: pc, target });
            }
            // A return, a jump to a register or an unconditional branch
            // before the last word: the words after it are not this flow's.
            let leaves = matches!(insn, Insn::End | Insn::Branch { link: false, .. });
            if leaves && i + 1 < count {
                return Err(RelocError::FunctionTooShort {
                    address: pc,
                    available: 4 * (i + 1),
                    needed: need,
                });
            }
        }
        let mut out = Out {
            code: TrampolineBytes::new(),
            base: trampoline,
        };
        out.word(BTI_C)?;
        if keep.is_some() {
            // Position-independent (keep_first takes no PC-relative word).
            for w in code[pad..skip].chunks_exact(4) {
                out.word(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))?;
            }
        }
        let mut scratch = false;
        let mut ends = false;
        let mut starts = heapless::Vec::new();
        for (i, &w) in words[..count].iter().enumerate() {
            let pc = start + 4 * i;
            // At most 4 words (the far jump's 16 bytes): within MAX_STARTS.
            let _ = starts.push(((4 * i) as u8, out.code.len() as u16));
            match decode(w, pc) {
                Insn::Other => out.word(w)?,
                Insn::End => {
                    out.word(w)?;
                    ends = true;
                }
                Insn::Branch { target, link: false } => {
                    scratch |= out.jump(target)?;
                    ends = true;
                }
                Insn::Branch { target, link: true } => {
                    if let Some(imm) = field(diff(out.pc(), target), 2, 26) {
                        out.word(0x9400_0000 | imm)?;
                    } else {
                        // adr x30, #20; ldr x16, #8; br x16; .quad target
                        out.word(0x1000_0000 | (5 << 5) | 30)?;
                        out.word(LDR_X16_LIT8)?;
                        out.word(BR_X16)?;
                        out.quad(target as u64)?;
                        scratch = true;
                    }
                }
                Insn::CondBranch {
                    target,
                    invert,
                    shift,
                    bits,
                } => {
                    if let Some(imm) = field(diff(out.pc(), target), 2, bits) {
                        let offset = ((1 << bits) - 1) << shift;
                        out.word((w & !offset) | (imm << shift))?;
                    } else {
                        // The inverted condition skips the absolute jump.
                        let skip_imm = field(20, 2, bits).unwrap_or(5);
                        out.word(invert | (skip_imm << shift))?;
                        out.word(LDR_X16_LIT8)?;
                        out.word(BR_X16)?;
                        out.quad(target as u64)?;
                        scratch = true;
                    }
                }
                Insn::Adr { target, rd, page } => {
                    let re = if page {
                        field(diff(out.pc() & !0xfff, target), 12, 21)
                    } else {
                        field(diff(out.pc(), target), 0, 21)
                    };
                    match re {
                        Some(imm) => {
                            let op = if page { 0x9000_0000 } else { 0x1000_0000 };
                            out.word(op | ((imm & 3) << 29) | ((imm >> 2) << 5) | rd)?;
                        }
                        None => {
                            // ldr xd, #8; b #12; .quad target
                            out.word(0x5800_0040 | rd)?;
                            out.word(B_OVER_LITERAL)?;
                            out.quad(target as u64)?;
                        }
                    }
                }
                Insn::Literal { target, via } => {
                    if let Some(imm) = field(diff(out.pc(), target), 2, 19) {
                        out.word((w & !(0x7ffff << 5)) | (imm << 5))?;
                    } else {
                        // ldr x16, #8; b #12; .quad target; <load> [x16]
                        out.word(LDR_X16_LIT8)?;
                        out.word(B_OVER_LITERAL)?;
                        out.quad(target as u64)?;
                        out.word(via)?;
                        scratch = true;
                    }
                }
            }
        }
        if !ends {
            scratch |= out.jump(start + taken)?;
        }
        if scratch && let Some(i) = (0..count).find(|&i| may_use_scratch(words[i], start + 4 * i)) {
            return Err(RelocError::Unsupported {
                address: start + 4 * i,
                what: "an instruction using x16/x17 where the rewrite needs x16 as scratch",
            });
        }
        Ok(Relocation {
            skip,
            taken,
            code: out.code,
            starts,
        })
    }
}

impl Arch for Aarch64 {
    const NAME: &'static str = "aarch64";
    const NEAR_JUMP_LEN: usize = 4;
    const FAR_JUMP_LEN: usize = 16;
    const LOCK: &'static [u8] = &B_SELF.to_le_bytes();
    const R_JUMP_SLOT: u32 = R_AARCH64_JUMP_SLOT;
    const R_GLOB_DAT: u32 = R_AARCH64_GLOB_DAT;

    fn entry_skip(code: &[u8]) -> usize {
        Self::pad(code)
    }

    fn is_near(from: usize, to: usize) -> bool {
        field(diff(from, to), 2, 26).is_some()
    }

    fn entry_jump(from: usize, to: usize) -> PatchBytes {
        let mut p = PatchBytes::new();
        // Either form fits the capacity (16): the pushes cannot fail.
        match field(diff(from, to), 2, 26) {
            Some(imm) => {
                let _ = p.extend_from_slice(&(0x1400_0000 | imm).to_le_bytes());
            }
            None => {
                let _ = p.extend_from_slice(&LDR_X16_LIT8.to_le_bytes());
                let _ = p.extend_from_slice(&BR_X16.to_le_bytes());
                let _ = p.extend_from_slice(&(to as u64).to_le_bytes());
            }
        }
        p
    }

    fn absolute_jump(to: usize) -> PatchBytes {
        let mut p = PatchBytes::new();
        let _ = p.extend_from_slice(&LDR_X16_LIT8.to_le_bytes());
        let _ = p.extend_from_slice(&BR_X16.to_le_bytes());
        let _ = p.extend_from_slice(&(to as u64).to_le_bytes());
        p
    }

    fn jump_interior(jump: &[u8]) -> Option<(usize, usize)> {
        // ldr x16, #8; br x16; .quad to
        let word = |i: usize| u32::from_le_bytes([jump[i], jump[i + 1], jump[i + 2], jump[i + 3]]);
        if jump.len() == 16 && word(0) == LDR_X16_LIT8 && word(4) == BR_X16 {
            let to = u64::from_le_bytes(jump[8..16].try_into().ok()?);
            return Some((4, to as usize));
        }
        None
    }

    fn relocate(code: &[u8], entry: usize, need: usize, trampoline: usize) -> Result<Relocation, RelocError> {
        Self::relocate_impl(code, entry, None, need, trampoline)
    }

    /// After the landing pad (`bti c`, if any): `paciasp`/`pacibsp`
    /// (undone by `autiasp`/`autibsp`: SP is as it signed with, so x30
    /// comes back as the caller left it; kept, it also stays the landing
    /// pad indirect calls need), `stp x29, x30, [sp, #-n]!` (the frame
    /// record; `add sp, sp, #n`) and `sub sp, sp, #imm` (`add sp, sp,
    /// #imm`); and with nothing to undo, a word that changes only the
    /// flags or a register no argument is passed in (`Self::harmless`):
    /// Debian 12's arm64 glibc begins `munmap` and `madvise` with a `nop`,
    /// `mmap` with `tst x5, #0xfff`, `shmdt` with `mov x8, #197`, `shmat`
    /// with `sxtw x0, w0`.
    fn keep_first(code: &[u8]) -> Option<(usize, PatchBytes)> {
        let pad = Self::pad(code);
        let w = Self::word(code, pad)?;
        let undo = match w {
            PACIASP => AUTIASP,
            PACIBSP => AUTIBSP,
            // stp x29, x30, [sp, #imm7 * 8]! with imm7 < 0
            _ if w & 0xffc0_7fff == 0xa980_7bfd && sext(w, 15, 7) < 0 => {
                ADD_SP | (((-sext(w, 15, 7) * 8) as u32) << 10)
            }
            // sub sp, sp, #imm12 (lsl #12 or not)
            _ if w & 0xffc0_03ff == 0xd100_03ff || w & 0xffc0_03ff == 0xd140_03ff => ADD_SP | (w & 0x007f_fc00),
            _ if Self::harmless(w) => return Some((pad + 4, PatchBytes::new())),
            _ => return None,
        };
        let mut u = PatchBytes::new();
        u.extend_from_slice(&undo.to_le_bytes()).ok()?;
        Some((pad + 4, u))
    }

    fn relocate_keeping(
        code: &[u8],
        entry: usize,
        keep: usize,
        need: usize,
        trampoline: usize,
    ) -> Result<Relocation, RelocError> {
        keeping::<Self>(code, entry, keep, || {
            Self::relocate_impl(code, entry, Some(keep), need, trampoline)
        })
    }
}

#[cfg(test)]
mod tests;

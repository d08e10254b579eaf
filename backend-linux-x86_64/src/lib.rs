//! memhook-x86_64: x86_64 code generation for memhook's bistro hooks.
//!
//! [`X86_64`] implements [`memhook_core::patch::Arch`]:
//!
//! - entry forms: `jmp rel32` (5 bytes) when the target is within ±2 GiB,
//!   else `movabs r11, imm64; jmp r11` (13 bytes; r11 is scratch at a call
//!   boundary and carries no argument, unlike rax, whose low byte is the
//!   vector-register count of a variadic call);
//! - `endbr64` at the entry stays in place and the patch goes after it;
//!   trampolines start with `endbr64`, so indirect calls into them are legal
//!   under CET;
//! - without one, a first instruction that can run before the hook (`push
//!   r64`, `sub rsp, imm`, a `mov` or `xor` into `rax`, `r10` or `r11`, a
//!   `cmp` of a RIP-relative global) may stay in place too
//!   ([`Arch::keep_first`], [`Arch::relocate_keeping`]): the entry's first
//!   bytes are then the library file's, which a uprobe runs out of line
//!   and its removal writes back;
//! - relocation on iced-x86's allocation-free decoder: position-independent
//!   instructions are copied as they are; RIP-relative displacements are
//!   patched in place (`cmp dword [rip+d], imm` included, which every libcuda
//!   580 entry has); `jcc`/`jmp`/`call` (rel8 and rel32) are re-emitted to
//!   reach their old targets with rel32, or, out of range, through an
//!   absolute `jmp [rip+0]; .quad target` that clobbers no register;
//! - refusals name the case: the function's flow ends before the patch is
//!   covered, a branch (in the moved bytes or in the code after them)
//!   targets the patched bytes, undecodable bytes, a RIP-relative operand
//!   the trampoline cannot reach, or `loop`/`jrcxz`/`xbegin`.
//!
//! ```
//! use memhook_core::patch::Arch;
//! use memhook_x86_64::X86_64;
//!
//! // glibc 2.39's munmap: endbr64; mov eax, 11; syscall; ...
//! let code = [0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 0x0b, 0, 0, 0, 0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0x01, 0xc3];
//! let entry = 0x7f00_0012_6010;
//! let r = X86_64::relocate(&code, entry, 5, entry + 0x1000).unwrap();
//! assert_eq!((r.skip, r.taken), (4, 5)); // endbr64 stays; `mov eax, 11` moves
//! assert_eq!(&r.code[..9], &[0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 0x0b, 0, 0, 0]);
//! assert_eq!(X86_64::entry_jump(entry + 4, entry + 0x1000).len(), 5);
//! ```
#![no_std]

use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register};
use memhook_core::patch::{Arch, PatchBytes, RelocError, Relocation, TrampolineBytes, keeping};

/// The x86_64 code generator.
#[derive(Clone, Copy, Debug, Default)]
pub struct X86_64;

/// `endbr64`.
pub const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
/// `R_X86_64_GLOB_DAT`.
pub const R_X86_64_GLOB_DAT: u32 = 6;
/// `R_X86_64_JUMP_SLOT`.
pub const R_X86_64_JUMP_SLOT: u32 = 7;

/// Displacement from the end of an instruction at `ip` of length `len` to
/// `target`, if it fits rel32.
fn rel32(ip: usize, len: usize, target: usize) -> Option<i32> {
    let d = (target as i64).wrapping_sub((ip as i64).wrapping_add(len as i64));
    i32::try_from(d).ok()
}

/// Most branch targets remembered for the branch-into-patch check.
const MAX_TARGETS: usize = 16;

struct Emitter {
    code: TrampolineBytes,
    base: usize,
}

impl Emitter {
    fn ip(&self) -> usize {
        self.base + self.code.len()
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), RelocError> {
        self.code
            .extend_from_slice(bytes)
            .map_err(|_| RelocError::TrampolineFull)
    }

    /// A branch to `target`: `rel` followed by a rel32 when that reaches,
    /// else `abs` followed by the 8-byte address (`abs` ends with an
    /// indirect branch through the literal that follows it).
    fn branch(&mut self, rel: &[u8], abs: &[u8], target: usize) -> Result<(), RelocError> {
        match rel32(self.ip(), rel.len() + 4, target) {
            Some(d) => {
                self.put(rel)?;
                self.put(&d.to_le_bytes())
            }
            None => {
                self.put(abs)?;
                self.put(&(target as u64).to_le_bytes())
            }
        }
    }

    /// `jmp target`: rel32, or `jmp [rip+0]; .quad target`.
    fn jmp(&mut self, target: usize) -> Result<(), RelocError> {
        self.branch(&[0xe9], &[0xff, 0x25, 0, 0, 0, 0], target)
    }

    /// `jcc target` for condition nibble `cc`: `0f 8x rel32`, or the
    /// inverted short jcc over an absolute jump.
    fn jcc(&mut self, cc: u8, target: usize) -> Result<(), RelocError> {
        self.branch(
            &[0x0f, 0x80 | cc],
            &[0x70 | (cc ^ 1), 14, 0xff, 0x25, 0, 0, 0, 0],
            target,
        )
    }

    /// `call target`: rel32, or `call [rip+2]; jmp +8; .quad target`.
    fn call(&mut self, target: usize) -> Result<(), RelocError> {
        self.branch(&[0xe8], &[0xff, 0x15, 2, 0, 0, 0, 0xeb, 8], target)
    }

    /// Copies `bytes` (one instruction), re-aiming its RIP-relative
    /// displacement (at `disp_at`, 4 bytes) at `target`.
    fn copy_rip_relative(
        &mut self,
        bytes: &[u8],
        disp_at: usize,
        target: usize,
        from: usize,
    ) -> Result<(), RelocError> {
        let d = rel32(self.ip(), bytes.len(), target).ok_or(RelocError::OutOfRange { address: from, target })?;
        let at = self.code.len();
        self.put(bytes)?;
        self.code[at + disp_at..at + disp_at + 4].copy_from_slice(&d.to_le_bytes());
        Ok(())
    }

    /// Copies `bytes` (one instruction, `instr` as `decoder` decoded it),
    /// a RIP-relative operand re-aimed at the address it had.
    fn copy(&mut self, decoder: &Decoder<'_>, instr: &Instruction, bytes: &[u8]) -> Result<(), RelocError> {
        if !instr.is_ip_rel_memory_operand() {
            return self.put(bytes);
        }
        let ip = instr.ip() as usize;
        let offsets = decoder.get_constant_offsets(instr);
        if !offsets.has_displacement() || offsets.displacement_size() != 4 {
            return Err(RelocError::Unsupported {
                address: ip,
                what: "RIP-relative operand",
            });
        }
        let target = instr.ip_rel_memory_address() as usize;
        self.copy_rip_relative(bytes, offsets.displacement_offset(), target, ip)
    }
}

/// Condition nibble of a `jcc` (`ConditionCode` is 1-based in iced).
fn condition(instr: &Instruction) -> u8 {
    (instr.condition_code() as u8).wrapping_sub(1) & 0xf
}

/// Whether the instruction ends the function's straight-line flow (nothing
/// after it is known to belong to the function).
fn ends_flow(instr: &Instruction) -> bool {
    match instr.flow_control() {
        FlowControl::Return
        | FlowControl::UnconditionalBranch
        | FlowControl::IndirectBranch
        | FlowControl::Exception => true,
        FlowControl::Interrupt => matches!(instr.code(), Code::Int3 | Code::Int1 | Code::Into),
        _ => false,
    }
}

fn direct_target(instr: &Instruction) -> Option<usize> {
    match instr.flow_control() {
        FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
            if instr.is_jcc_short_or_near()
                || instr.is_jmp_short_or_near()
                || instr.is_call_near()
                || instr.is_loopcc()
                || instr.is_loop()
                || instr.is_jcx_short() =>
        {
            Some(instr.near_branch_target() as usize)
        }
        _ => None,
    }
}

impl X86_64 {
    /// Whether `instr` (a `mov`, `movzx`, `movsx`, `movsxd`, `lea` or
    /// `xor` into a register) writes a whole argument register (`rdi`,
    /// `rsi`, `rdx`, `rcx`, `r8`, `r9`: its 32 or 64 bits) without reading
    /// it: a function whose first instruction does so never reads the
    /// value passed there, so it takes no argument there (a variadic one
    /// would have saved it first), and a hook of its signature reads none
    /// either (glibc's `mov edx, edi`: a function of one or two
    /// arguments). `xor` only as the zeroing idiom (`xor edx, edx`). A
    /// `mov` or `movsxd` of a register's low 32 bits into itself is
    /// kept too: it changes only the upper half of an `int` argument,
    /// which the caller leaves undefined.
    fn argument_dead(instr: &Instruction) -> bool {
        let dest = instr.op0_register();
        let whole = matches!(dest.size(), 4 | 8);
        let argument = matches!(
            dest.full_register(),
            Register::RDI | Register::RSI | Register::RDX | Register::RCX | Register::R8 | Register::R9
        );
        let reads = |r: Register| r != Register::None && r.full_register() == dest.full_register();
        let source = (instr.op1_kind() == OpKind::Register).then(|| instr.op1_register());
        // A `lea`'s source is its address, as a load's (or an immediate's,
        // which has no base or index).
        let dead = match (instr.mnemonic(), source) {
            (Mnemonic::Xor, _) => source == Some(dest),
            (mnemonic, Some(r)) if reads(r) => {
                (matches!(mnemonic, Mnemonic::Mov | Mnemonic::Movsxd) && r.size() == 4) || r == dest
            }
            (_, Some(_)) => true,
            (_, None) => !reads(instr.memory_base()) && !reads(instr.memory_index()),
        };
        whole && argument && dead
    }

    /// [`Arch::relocate_empty`]'s case: after the landing pad, a lone
    /// `ret` (or `repz ret`), then padding (`nop` of any length, `int3`)
    /// over the rest of the `need` bytes, all inside the 16-byte block the
    /// `ret` starts (functions are aligned to 16: nothing else begins
    /// there). The trampoline is the landing pad and the `ret`.
    fn relocate_lone_return(code: &[u8], entry: usize, need: usize) -> Result<Relocation, RelocError> {
        let skip = Self::entry_skip(code);
        let body = &code[skip..];
        let start = entry + skip;
        let too_short = |available: usize| RelocError::FunctionTooShort {
            address: start,
            available,
            needed: need,
        };
        let block_end = (start | 15).wrapping_add(1);
        if block_end.wrapping_sub(start) < need {
            return Err(too_short(block_end.wrapping_sub(start)));
        }
        if body.len() < need {
            return Err(RelocError::NotEnoughBytes {
                available: body.len(),
                needed: need,
            });
        }
        // `ret`, or `repz ret` (as compilers tuned for older AMD cores
        // wrote a return that is a branch target): nothing else, however
        // it would decode (a `ret` behind other prefixes is no compiler's).
        let ret_len = match body {
            [0xc3, ..] => 1,
            [0xf3, 0xc3, ..] => 2,
            _ => return Err(too_short(0)),
        };
        let mut decoder = Decoder::with_ip(64, &body[ret_len..], (start + ret_len) as u64, DecoderOptions::NONE);
        let mut instr = Instruction::default();
        let mut covered = ret_len;
        while covered < need {
            decoder.decode_out(&mut instr);
            let padding = !instr.is_invalid() && (instr.mnemonic() == Mnemonic::Nop || instr.code() == Code::Int3);
            if !padding {
                return Err(too_short(1));
            }
            covered += instr.len();
        }
        let mut out = TrampolineBytes::new();
        let mut starts = heapless::Vec::new();
        // Cannot fail: 5 bytes of a 64-byte capacity, one start of 16.
        let _ = out.extend_from_slice(&ENDBR64);
        let _ = starts.push((0, out.len() as u16));
        let _ = out.push(0xc3);
        Ok(Relocation {
            skip,
            taken: need,
            code: out,
            starts,
        })
    }

    /// [`Arch::relocate`], or with `keep` bytes (the first instruction,
    /// as [`Arch::keep_first`] named it) left ahead of the patch and run
    /// first in the trampoline: [`Arch::relocate_keeping`].
    fn relocate_impl(
        code: &[u8],
        entry: usize,
        keep: Option<usize>,
        need: usize,
        trampoline: usize,
    ) -> Result<Relocation, RelocError> {
        let skip = keep.unwrap_or_else(|| Self::entry_skip(code));
        let body = &code[skip..];
        if body.len() < need {
            return Err(RelocError::NotEnoughBytes {
                available: body.len(),
                needed: need,
            });
        }
        let start = entry + skip;
        let mut out = Emitter {
            code: TrampolineBytes::new(),
            base: trampoline,
        };
        out.put(&ENDBR64)?;
        if keep.is_some() {
            // As it is, or (a RIP-relative `cmp`) reading the same address.
            let mut first = Decoder::with_ip(64, code, entry as u64, DecoderOptions::NONE);
            let instr = first.decode();
            out.copy(&first, &instr, &code[..skip])?;
        }

        let mut decoder = Decoder::with_ip(64, body, start as u64, DecoderOptions::NONE);
        let mut instr = Instruction::default();
        let mut taken = 0;
        let mut targets: heapless::Vec<(usize, usize), MAX_TARGETS> = heapless::Vec::new();
        let mut starts = heapless::Vec::new();
        while taken < need {
            if !decoder.can_decode() {
                return Err(RelocError::NotEnoughBytes {
                    available: body.len(),
                    needed: need,
                });
            }
            decoder.decode_out(&mut instr);
            let ip = instr.ip() as usize;
            let len = instr.len();
            if instr.is_invalid() {
                return Err(RelocError::Undecodable { address: ip });
            }
            // A debugger's `int3` (or a uprobe's), reached in the flow: no
            // compiler puts one there (only after a `ret` or a call that
            // does not return, as padding).
            if instr.code() == Code::Int3 || (instr.code() == Code::Int_imm8 && instr.immediate8() == 3) {
                return Err(RelocError::Breakpoint { address: ip });
            }
            let bytes = &body[taken..taken + len];
            // A call that returns inside the bytes the jump overwrites: a
            // thread in the callee when the patch is written would return
            // into the middle of the jump (no thread's stack can be
            // looked at; a pc can, see memhook's `evacuate`).
            let call = instr.is_call_near()
                || instr.is_call_near_indirect()
                || instr.is_call_far()
                || instr.is_call_far_indirect();
            if call && taken + len < need {
                return Err(RelocError::Unsupported {
                    address: ip,
                    what: "a call that returns inside the patched bytes",
                });
            }
            // At most `need` (13) one-byte instructions: within MAX_STARTS;
            // offsets within a trampoline (MAX_TRAMPOLINE) fit 16 bits.
            let _ = starts.push((taken as u8, out.code.len() as u16));
            if let Some(t) = direct_target(&instr) {
                targets.push((ip, t)).map_err(|_| RelocError::Unsupported {
                    address: ip,
                    what: "many branches",
                })?;
            }
            match instr.flow_control() {
                FlowControl::ConditionalBranch if instr.is_jcc_short_or_near() => {
                    out.jcc(condition(&instr), instr.near_branch_target() as usize)?;
                }
                FlowControl::ConditionalBranch => {
                    let what = if instr.is_jcx_short() { "jrcxz" } else { "loop" };
                    return Err(RelocError::Unsupported { address: ip, what });
                }
                FlowControl::UnconditionalBranch if instr.is_jmp_short_or_near() => {
                    out.jmp(instr.near_branch_target() as usize)?;
                }
                FlowControl::Call if instr.is_call_near() => {
                    out.call(instr.near_branch_target() as usize)?;
                }
                FlowControl::XbeginXabortXend => {
                    return Err(RelocError::Unsupported {
                        address: ip,
                        what: "xbegin/xabort/xend",
                    });
                }
                _ if instr.is_ip_rel_memory_operand() => out.copy(&decoder, &instr, bytes)?,
                _ if instr.is_call_far() || instr.is_jmp_far() => {
                    return Err(RelocError::Unsupported {
                        address: ip,
                        what: "far branch",
                    });
                }
                _ => out.put(bytes)?,
            }
            taken += len;
            if taken < need && ends_flow(&instr) {
                return Err(RelocError::FunctionTooShort {
                    address: ip,
                    available: taken,
                    needed: need,
                });
            }
        }

        // Nothing may branch into the bytes the patch replaces. The moved
        // instructions may not branch to any of them (a loop in the
        // prologue, even back to the entry, would run the patch). The code
        // after them, as far as we can see, may not branch into their middle;
        // a call or jump to the entry itself, from another function or a
        // later part of this one, is a call of the function like any other
        // and goes through the patch. A kept instruction counts as patched
        // here, and the patch's start is no entry: a branch there would
        // reach the hook with the kept instruction's work undone where it
        // had not been done.
        let patched = if keep.is_some() { entry } else { start }..start + taken;
        for &(address, target) in &targets {
            if patched.contains(&target) {
                return Err(RelocError::BranchIntoPatch { address, target });
            }
        }
        while decoder.can_decode() {
            decoder.decode_out(&mut instr);
            if instr.is_invalid() {
                break;
            }
            if let Some(target) = direct_target(&instr)
                && target != patched.start
                && patched.contains(&target)
            {
                return Err(RelocError::BranchIntoPatch {
                    address: instr.ip() as usize,
                    target,
                });
            }
        }

        out.jmp(start + taken)?;
        Ok(Relocation {
            skip,
            taken,
            code: out.code,
            starts,
        })
    }
}

impl Arch for X86_64 {
    const NAME: &'static str = "x86_64";
    const NEAR_JUMP_LEN: usize = 5;
    const FAR_JUMP_LEN: usize = 13;
    const LOCK: &'static [u8] = &[0xeb, 0xfe];
    const R_JUMP_SLOT: u32 = R_X86_64_JUMP_SLOT;
    const R_GLOB_DAT: u32 = R_X86_64_GLOB_DAT;

    fn entry_skip(code: &[u8]) -> usize {
        if code.starts_with(&ENDBR64) { ENDBR64.len() } else { 0 }
    }

    fn is_near(from: usize, to: usize) -> bool {
        rel32(from, 5, to).is_some()
    }

    fn entry_jump(from: usize, to: usize) -> PatchBytes {
        let mut p = PatchBytes::new();
        // The capacity (16) holds either form: the pushes cannot fail.
        match rel32(from, 5, to) {
            Some(d) => {
                let _ = p.push(0xe9);
                let _ = p.extend_from_slice(&d.to_le_bytes());
            }
            None => {
                let _ = p.extend_from_slice(&[0x49, 0xbb]);
                let _ = p.extend_from_slice(&(to as u64).to_le_bytes());
                let _ = p.extend_from_slice(&[0x41, 0xff, 0xe3]);
            }
        }
        p
    }

    fn absolute_jump(to: usize) -> PatchBytes {
        let mut p = PatchBytes::new();
        // 14 bytes fit the capacity (16).
        let _ = p.extend_from_slice(&[0xff, 0x25, 0, 0, 0, 0]); // jmp [rip+0]
        let _ = p.extend_from_slice(&(to as u64).to_le_bytes());
        p
    }

    fn jump_interior(jump: &[u8]) -> Option<(usize, usize)> {
        // movabs r11, to (10 bytes); jmp r11
        match jump {
            [0x49, 0xbb, to @ .., 0x41, 0xff, 0xe3] if to.len() == 8 => {
                Some((10, u64::from_le_bytes(to.try_into().ok()?) as usize))
            }
            _ => None,
        }
    }

    fn relocate(code: &[u8], entry: usize, need: usize, trampoline: usize) -> Result<Relocation, RelocError> {
        Self::relocate_impl(code, entry, None, need, trampoline)
    }

    /// `push r64` (undone by `lea rsp, [rsp+8]`: every libcuda and
    /// libcudart entry of driver 580 and CUDA 13 begins `push rbp`),
    /// `sub rsp, imm` (`lea rsp, [rsp+imm]`), and with nothing to undo:
    /// a `mov`, `movzx`, `movsx`, `movsxd`, `lea` or `xor` that writes only
    /// `rax`, `r10` or `r11` (no argument is passed in them; a variadic
    /// function's `al` is read by its own prologue, which the trampoline
    /// runs after the kept instruction again) or an argument register
    /// whose value the function never reads (`X86_64::argument_dead`:
    /// `mov edx, edi`), and a `cmp` or `test`
    /// (which change only the flags; no function's caller leaves anything
    /// in them for it). Memory is read only RIP-relative, from the
    /// library's own data (the trampoline's copy reads the same address):
    /// a read through a register may be of a device's memory, where a
    /// second read is not the first. The system-call wrappers of a glibc
    /// built without CET begin so (`mov eax, 11` is `munmap`, `cmp byte
    /// [rip+d], 0` `fallocate`), and many more functions (`mov rax,
    /// [rip+d]`, `test rdi, rdi`). `lea` leaves the flags alone.
    fn keep_first(code: &[u8]) -> Option<(usize, PatchBytes)> {
        if Self::entry_skip(code) != 0 {
            return None;
        }
        let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
        let instr = decoder.decode();
        if instr.is_invalid() {
            return None;
        }
        let compares = matches!(instr.mnemonic(), Mnemonic::Cmp | Mnemonic::Test);
        let loads = instr.op0_kind() == OpKind::Register
            && matches!(
                instr.mnemonic(),
                Mnemonic::Mov | Mnemonic::Movzx | Mnemonic::Movsx | Mnemonic::Movsxd | Mnemonic::Lea | Mnemonic::Xor
            );
        let dest = instr.op0_register();
        let loads_scratch = loads
            && (matches!(dest.full_register(), Register::RAX | Register::R10 | Register::R11)
                || Self::argument_dead(&instr));
        let memory_read =
            (compares || loads_scratch) && (instr.is_ip_rel_memory_operand() || instr.mnemonic() == Mnemonic::Lea);
        let operands_fit = (0..instr.op_count()).all(|i| {
            matches!(
                instr.op_kind(i),
                OpKind::Register
                    | OpKind::Immediate8
                    | OpKind::Immediate8to16
                    | OpKind::Immediate16
                    | OpKind::Immediate8to32
                    | OpKind::Immediate32
                    | OpKind::Immediate64
                    | OpKind::Immediate8to64
                    | OpKind::Immediate32to64
            ) || (memory_read && instr.op_kind(i) == OpKind::Memory)
        });
        if !operands_fit {
            return None;
        }
        let mut undo = PatchBytes::new();
        match instr.code() {
            // lea rsp, [rsp+8]
            Code::Push_r64 => undo.extend_from_slice(&[0x48, 0x8d, 0x64, 0x24, 8]).ok()?,
            Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32 if instr.op0_register() == Register::RSP => {
                // lea rsp, [rsp+disp32]
                let n = i32::try_from(instr.immediate(1) as i64).ok()?;
                undo.extend_from_slice(&[0x48, 0x8d, 0xa4, 0x24]).ok()?;
                undo.extend_from_slice(&n.to_le_bytes()).ok()?;
            }
            _ if compares || loads_scratch => {}
            _ => return None,
        }
        Some((instr.len(), undo))
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

    fn relocate_empty(code: &[u8], entry: usize, need: usize, trampoline: usize) -> Result<Relocation, RelocError> {
        match Self::relocate_impl(code, entry, None, need, trampoline) {
            Err(RelocError::FunctionTooShort { .. }) => Self::relocate_lone_return(code, entry, need),
            other => other,
        }
    }
}

//! Binary patching of function entries ("bistro"): the traits a backend and
//! an OS layer implement, and the protocol that writes a patch over them.
//!
//! - [`Arch`] is code generation only: the entry jump forms, relocation of
//!   the instructions a patch overwrites into a trampoline (so the hook can
//!   call the original), the self-loop "lock" instruction, and the ELF
//!   relocation types. Backends (`memhook-x86_64`, `memhook-aarch64`)
//!   implement it; it is pure and testable on any host.
//! - [`CodeMemory`] is what the OS layer provides: page protection, atomic
//!   small writes, byte writes, and serialisation of every core.
//! - [`write_patch`] is the protocol: lock the entry with a self-jump (a
//!   thread arriving meanwhile spins there), serialise, write the tail,
//!   serialise, replace the lock by the head, serialise, restore protection.
//!   A thread therefore sees the old entry, the lock, or the whole new entry,
//!   never the new head with an old tail. The [`RestorePoint`] it returns
//!   keeps the original bytes, and [`RestorePoint::undo`] writes them back
//!   the same way.
//!
//! A fake [`CodeMemory`] over an array shows the protocol:
//!
//! ```
//! use memhook_core::patch::{CodeMemory, PatchError, write_patch};
//!
//! /// 64 bytes of "code" at address 0x1000, with a log of what was done.
//! struct Fake { code: [u8; 64], log: Vec<&'static str> }
//! impl CodeMemory for Fake {
//!     fn make_writable(&mut self, _at: usize, _len: usize) -> Result<(), PatchError> {
//!         self.log.push("writable");
//!         Ok(())
//!     }
//!     fn restore_protection(&mut self, _at: usize, _len: usize) -> Result<(), PatchError> {
//!         self.log.push("protect");
//!         Ok(())
//!     }
//!     fn read(&self, at: usize, buf: &mut [u8]) {
//!         buf.copy_from_slice(&self.code[at - 0x1000..][..buf.len()]);
//!     }
//!     fn write_atomic(&mut self, at: usize, bytes: &[u8]) {
//!         self.log.push("atomic");
//!         self.code[at - 0x1000..][..bytes.len()].copy_from_slice(bytes);
//!     }
//!     fn write(&mut self, at: usize, bytes: &[u8]) {
//!         self.log.push("tail");
//!         self.code[at - 0x1000..][..bytes.len()].copy_from_slice(bytes);
//!     }
//!     fn serialize(&mut self) {
//!         self.log.push("sync");
//!     }
//! }
//!
//! let mut mem = Fake { code: [0x90; 64], log: Vec::new() };
//! let jump = [0xe9, 1, 2, 3, 4]; // jmp rel32
//! let restore = write_patch(&mut mem, 0x1000, &jump, &[0xeb, 0xfe]).unwrap();
//! assert_eq!(&mem.code[..5], &jump);
//! assert_eq!(mem.log, ["writable", "atomic", "sync", "tail", "sync", "atomic", "sync", "protect"]);
//! restore.undo(&mut mem, &[0xeb, 0xfe]).unwrap();
//! assert_eq!(&mem.code[..5], &[0x90; 5]);
//! ```

use core::fmt;

/// Longest entry patch of any architecture (aarch64's far form).
pub const MAX_PATCH: usize = 16;
/// Largest trampoline: relocated instructions plus the jump back.
pub const MAX_TRAMPOLINE: usize = 192;

/// Bytes written over a function entry.
pub type PatchBytes = heapless::Vec<u8, MAX_PATCH>;
/// Code placed in a trampoline.
pub type TrampolineBytes = heapless::Vec<u8, MAX_TRAMPOLINE>;

/// Why the instructions under a patch cannot be moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelocError {
    /// The function returns or jumps away before the patch is covered: the
    /// patch would overwrite bytes that are not this function's.
    FunctionTooShort {
        /// Where the function's flow ends.
        address: usize,
        /// Bytes of the function before that point.
        available: usize,
        /// Bytes the patch needs.
        needed: usize,
    },
    /// A branch targets the bytes the patch overwrites.
    BranchIntoPatch {
        /// The branch instruction.
        address: usize,
        /// Its target.
        target: usize,
    },
    /// Bytes that do not decode as an instruction.
    Undecodable {
        /// Where.
        address: usize,
    },
    /// A PC-relative operand cannot reach its target from the trampoline.
    OutOfRange {
        /// The instruction.
        address: usize,
        /// The operand's target.
        target: usize,
    },
    /// An instruction the relocator does not move.
    Unsupported {
        /// The instruction.
        address: usize,
        /// What it is.
        what: &'static str,
    },
    /// The relocated code does not fit [`MAX_TRAMPOLINE`] bytes.
    TrampolineFull,
    /// Fewer bytes were readable at the entry than the patch needs.
    NotEnoughBytes {
        /// Bytes supplied.
        available: usize,
        /// Bytes needed.
        needed: usize,
    },
}

impl fmt::Display for RelocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RelocError::FunctionTooShort {
                address,
                available,
                needed,
            } => write!(
                f,
                "function shorter than the patch: its flow ends at {address:#x} after {available} bytes, the patch needs {needed}"
            ),
            RelocError::BranchIntoPatch { address, target } => {
                write!(
                    f,
                    "branch at {address:#x} jumps back into the patched bytes ({target:#x})"
                )
            }
            RelocError::Undecodable { address } => write!(f, "undecodable instruction at {address:#x}"),
            RelocError::OutOfRange { address, target } => write!(
                f,
                "cannot fix the PC-relative operand at {address:#x}: {target:#x} is out of reach of the trampoline"
            ),
            RelocError::Unsupported { address, what } => write!(f, "cannot relocate {what} at {address:#x}"),
            RelocError::TrampolineFull => {
                write!(f, "relocated code does not fit a trampoline ({MAX_TRAMPOLINE} bytes)")
            }
            RelocError::NotEnoughBytes { available, needed } => {
                write!(
                    f,
                    "only {available} bytes readable at the entry, the patch needs {needed}"
                )
            }
        }
    }
}

impl core::error::Error for RelocError {}

/// The instructions under a patch, moved to a trampoline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relocation {
    /// Bytes kept in place at the entry (`endbr64`, `bti c`, `paciasp`): the
    /// patch starts at `entry + skip`.
    pub skip: usize,
    /// Bytes of original code taken (whole instructions, at least the patch).
    pub taken: usize,
    /// Code for the trampoline address: a landing pad where the ISA needs one
    /// (so indirect calls into it stay legal), the relocated instructions,
    /// and a jump back to `entry + skip + taken`.
    pub code: TrampolineBytes,
}

/// Architecture-specific code generation. Pure: no system calls.
pub trait Arch {
    /// Name, for messages.
    const NAME: &'static str;
    /// Length of the near entry jump (x86_64 `jmp rel32`: 5).
    const NEAR_JUMP_LEN: usize;
    /// Length of the far entry jump (x86_64 `movabs r11; jmp r11`: 13).
    const FAR_JUMP_LEN: usize;
    /// The self-loop written first: a thread that reaches the entry while
    /// the rest is written spins there (x86_64 `jmp $`: `eb fe`).
    const LOCK: &'static [u8];
    /// ELF `R_*_JUMP_SLOT`.
    const R_JUMP_SLOT: u32;
    /// ELF `R_*_GLOB_DAT`.
    const R_GLOB_DAT: u32;

    /// Bytes at the start of `code` that stay in place (landing pads).
    fn entry_skip(code: &[u8]) -> usize;

    /// Whether a near jump placed at `from` reaches `to`.
    fn is_near(from: usize, to: usize) -> bool;

    /// The entry jump at `from` to `to`: near when in range, far otherwise.
    fn entry_jump(from: usize, to: usize) -> PatchBytes;

    /// Position-independent code that jumps to `to` from anywhere without
    /// touching an argument register (a far-jump slot's content).
    fn absolute_jump(to: usize) -> PatchBytes;

    /// Moves the instructions at `entry` (whose bytes start `code`; pass as
    /// many as are readable, 64 is plenty) that a `need`-byte patch after
    /// the landing pad would overwrite, into code for address `trampoline`.
    ///
    /// # Errors
    ///
    /// A [`RelocError`] naming the instruction that cannot be moved.
    fn relocate(code: &[u8], entry: usize, need: usize, trampoline: usize) -> Result<Relocation, RelocError>;
}

/// Why writing code failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchError {
    /// The pages could not be made writable (errno).
    Protection(i32),
    /// The entry's bytes changed since they were read: another hooker wrote
    /// there meanwhile.
    EntryChanged {
        /// The entry.
        address: usize,
    },
    /// The lock would straddle a cache line, so it could not be written in
    /// one atomic store.
    LockStraddlesLine {
        /// The entry.
        address: usize,
    },
}

impl fmt::Display for PatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PatchError::Protection(errno) => write!(f, "cannot change code page protection (errno {errno})"),
            PatchError::EntryChanged { address } => {
                write!(
                    f,
                    "the code at {address:#x} changed since it was patched (another hooker?)"
                )
            }
            PatchError::LockStraddlesLine { address } => {
                write!(
                    f,
                    "entry {address:#x} straddles a cache line: the lock cannot be written atomically"
                )
            }
        }
    }
}

impl core::error::Error for PatchError {}

/// Writing to code: what the OS layer provides.
pub trait CodeMemory {
    /// Makes `[at, at + len)` writable (and still executable).
    ///
    /// # Errors
    ///
    /// [`PatchError::Protection`] when the OS refuses.
    fn make_writable(&mut self, at: usize, len: usize) -> Result<(), PatchError>;
    /// Restores the protection `make_writable` changed.
    ///
    /// # Errors
    ///
    /// [`PatchError::Protection`] when the OS refuses.
    fn restore_protection(&mut self, at: usize, len: usize) -> Result<(), PatchError>;
    /// Reads code bytes.
    fn read(&self, at: usize, buf: &mut [u8]);
    /// Writes 2, 4 or 8 bytes in one store (they do not cross a cache line).
    fn write_atomic(&mut self, at: usize, bytes: &[u8]);
    /// Writes bytes no thread executes meanwhile.
    fn write(&mut self, at: usize, bytes: &[u8]);
    /// Makes every core see the code written so far before it executes more.
    fn serialize(&mut self);
}

/// The bytes a patch replaced, to undo it exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestorePoint {
    /// Where the patch starts.
    pub at: usize,
    /// The bytes that were there.
    pub original: PatchBytes,
    /// The bytes written.
    pub patched: PatchBytes,
}

const CACHE_LINE: usize = 64;

/// Writes `bytes` at `at` with the lock protocol (module docs).
fn write_locked<M: CodeMemory>(mem: &mut M, at: usize, bytes: &[u8], lock: &[u8]) -> Result<(), PatchError> {
    if at / CACHE_LINE != (at + lock.len() - 1) / CACHE_LINE {
        return Err(PatchError::LockStraddlesLine { address: at });
    }
    mem.make_writable(at, bytes.len())?;
    if bytes.len() <= lock.len() {
        mem.write_atomic(at, bytes);
    } else {
        mem.write_atomic(at, lock);
        mem.serialize();
        mem.write(at + lock.len(), &bytes[lock.len()..]);
        mem.serialize();
        mem.write_atomic(at, &bytes[..lock.len()]);
    }
    mem.serialize();
    mem.restore_protection(at, bytes.len())
}

/// Writes `patch` at `at` (after the landing pad) with the lock protocol and
/// returns what is needed to undo it.
///
/// # Errors
///
/// A [`PatchError`]; nothing was written then, or the original bytes were
/// put back.
pub fn write_patch<M: CodeMemory>(
    mem: &mut M,
    at: usize,
    patch: &[u8],
    lock: &[u8],
) -> Result<RestorePoint, PatchError> {
    let mut original = PatchBytes::new();
    let mut buf = [0u8; MAX_PATCH];
    let n = patch.len().min(MAX_PATCH);
    mem.read(at, &mut buf[..n]);
    // Cannot fail: n <= MAX_PATCH.
    let _ = original.extend_from_slice(&buf[..n]);
    let mut patched = PatchBytes::new();
    let _ = patched.extend_from_slice(&patch[..n]);
    write_locked(mem, at, &patched, lock)?;
    Ok(RestorePoint { at, original, patched })
}

impl RestorePoint {
    /// Puts the original bytes back, with the same protocol.
    ///
    /// # Errors
    ///
    /// [`PatchError::EntryChanged`] if the bytes are no longer ours (then
    /// nothing is written), or a protection error.
    pub fn undo<M: CodeMemory>(&self, mem: &mut M, lock: &[u8]) -> Result<(), PatchError> {
        if !self.in_place(mem) {
            return Err(PatchError::EntryChanged { address: self.at });
        }
        write_locked(mem, self.at, &self.original, lock)
    }

    /// Whether the entry still holds the bytes written.
    pub fn in_place<M: CodeMemory>(&self, mem: &M) -> bool {
        let mut now = [0u8; MAX_PATCH];
        let n = self.patched.len();
        mem.read(self.at, &mut now[..n]);
        now[..n] == self.patched[..]
    }
}

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
//! - [`write_patches`] and [`undo_patches`] do the same for many entries in
//!   one pass: every lock, serialise, every tail, serialise, every head,
//!   serialise. Each entry goes through the states it goes through alone,
//!   and the batch costs three serialisations whatever its size.
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
    /// A breakpoint instruction among those the patch would move: a
    /// debugger's (gdb puts one after a function's frame setup, inside the
    /// bytes a patch covers) or a uprobe's. Moved, it would trap in the
    /// trampoline, where no debugger has one, and the debugger would later
    /// write the byte it saved back at its address, into the patch.
    Breakpoint {
        /// The breakpoint.
        address: usize,
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
            RelocError::Breakpoint { address } => {
                write!(f, "breakpoint at {address:#x} under the patch (a debugger's?)")
            }
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
    /// Bytes kept in place at the entry: a landing pad (`endbr64`, `bti c`,
    /// `paciasp`), or the first instruction [`Arch::keep_first`] named
    /// (from [`Arch::relocate_keeping`], whose trampoline runs it again).
    /// The patch starts at `entry + skip`.
    pub skip: usize,
    /// Bytes of original code taken (whole instructions, at least the patch).
    pub taken: usize,
    /// Code for the trampoline address: a landing pad where the ISA needs one
    /// (so indirect calls into it stay legal), the relocated instructions,
    /// and a jump back to `entry + skip + taken`.
    pub code: TrampolineBytes,
    /// Where each moved instruction starts, as (offset from `entry + skip`,
    /// offset in `code`), in order: a thread stopped before one of them,
    /// inside the bytes the patch overwrites, goes on correctly from the
    /// same instruction in the trampoline.
    pub starts: heapless::Vec<(u8, u16), MAX_STARTS>,
}

/// Most instructions a patch can take (x86_64: 13 bytes of one-byte
/// instructions for the far jump).
pub const MAX_STARTS: usize = 16;

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

    /// Where a thread can stand inside the entry jump `jump` (as
    /// [`Arch::entry_jump`] made it), between two of its instructions, and
    /// where the jump takes it from there: `(offset, destination)` for a
    /// jump of two instructions (the far forms: the first loads the
    /// destination into a scratch register, the second jumps to it), `None`
    /// for one instruction.
    fn jump_interior(jump: &[u8]) -> Option<(usize, usize)>;

    /// Moves the instructions at `entry` (whose bytes start `code`; pass as
    /// many as are readable, 64 is plenty) that a `need`-byte patch after
    /// the landing pad would overwrite, into code for address `trampoline`.
    ///
    /// # Errors
    ///
    /// A [`RelocError`] naming the instruction that cannot be moved.
    fn relocate(code: &[u8], entry: usize, need: usize, trampoline: usize) -> Result<Relocation, RelocError>;

    /// The function's first instruction where it may stay at the entry,
    /// ahead of the patch: its length, and the code that undoes what it
    /// did before the hook runs (empty where it needs no undoing: it only
    /// set the flags, or wrote a scratch register no argument is passed
    /// in, or an argument register whose value the function never reads,
    /// since it overwrites it first: a hook of the function's signature
    /// does not read it either). `None` where
    /// `code` begins with a landing pad (which stays anyway) or with an
    /// instruction that cannot run before the hook. The default: `None`.
    ///
    /// Why: a uprobe (what bpftrace, bcc's `memleak` and eBPF profilers
    /// put on a function) replaces the entry's first instruction with a
    /// breakpoint, runs the library file's copy of that instruction out
    /// of line and goes on after it; when it is taken out, the kernel
    /// writes the file's first bytes back. Over a patch at the entry
    /// that skips the hook while attached and leaves a broken jump after.
    /// With the first instruction kept and the patch after it, the file's
    /// bytes are the entry's own: the hook runs either way.
    fn keep_first(code: &[u8]) -> Option<(usize, PatchBytes)> {
        let _ = code;
        None
    }

    /// [`Arch::relocate`] with the patch after the first `keep` bytes (the
    /// instruction [`Arch::keep_first`] named), which stay in place: the
    /// trampoline runs them first, then the moved instructions. Nothing
    /// may branch to where the patch starts (it would run the hook with
    /// the kept instruction undone where it had not been done). The
    /// default: refused.
    ///
    /// # Errors
    ///
    /// As [`Arch::relocate`]; the caller then patches as
    /// [`Arch::relocate`] would.
    fn relocate_keeping(
        code: &[u8],
        entry: usize,
        keep: usize,
        need: usize,
        trampoline: usize,
    ) -> Result<Relocation, RelocError> {
        let _ = (code, keep, need, trampoline);
        Err(not_kept(entry))
    }

    /// [`Arch::relocate`] for a function known to do nothing (glibc's
    /// `_dl_debug_state`, the loader's breakpoint for debuggers): where its
    /// body is a lone return shorter than the patch, followed by alignment
    /// padding, the patch may cover that padding too, and the trampoline
    /// is the return alone. Only for a caller that knows the function is
    /// empty: in general a function this short is refused, since the bytes
    /// after it may be another's. The default: as [`Arch::relocate`]
    /// (where the return alone covers the patch, as on aarch64).
    ///
    /// # Errors
    ///
    /// As [`Arch::relocate`]; [`RelocError::FunctionTooShort`] where the
    /// return is not the first instruction, or the bytes after it are not
    /// padding, or the patch would reach past the 16-byte block the return
    /// lies in (where the next function may start).
    fn relocate_empty(code: &[u8], entry: usize, need: usize, trampoline: usize) -> Result<Relocation, RelocError> {
        Self::relocate(code, entry, need, trampoline)
    }
}

/// The refusal of [`Arch::relocate_keeping`] where nothing can be kept.
fn not_kept(entry: usize) -> RelocError {
    RelocError::Unsupported {
        address: entry,
        what: "an instruction kept ahead of the patch",
    }
}

/// [`Arch::relocate_keeping`] as the backends make it: `relocate` (their
/// relocator, the patch after `keep` bytes) where `keep` is the length
/// [`Arch::keep_first`] gives for `code`, else refused.
///
/// # Errors
///
/// `relocate`'s, or [`RelocError::Unsupported`] for another `keep`.
pub fn keeping<A: Arch + ?Sized>(
    code: &[u8],
    entry: usize,
    keep: usize,
    relocate: impl FnOnce() -> Result<Relocation, RelocError>,
) -> Result<Relocation, RelocError> {
    match A::keep_first(code) {
        Some((len, _)) if len == keep => relocate(),
        _ => Err(not_kept(entry)),
    }
}

/// What a near patch of the function at `entry` takes, as bistro patches
/// it: after the first instruction where [`Arch::keep_first`] keeps it and
/// the code after it can be moved ([`Arch::relocate_keeping`]; the way to
/// the hook then needs a slot near the entry, which a dry run assumes),
/// else as [`Arch::relocate`].
///
/// # Errors
///
/// [`Arch::relocate`]'s.
pub fn relocate_near<A: Arch + ?Sized>(code: &[u8], entry: usize, trampoline: usize) -> Result<Relocation, RelocError> {
    if let Some((keep, _)) = A::keep_first(code)
        && let Ok(r) = A::relocate_keeping(code, entry, keep, A::NEAR_JUMP_LEN, trampoline)
    {
        return Ok(r);
    }
    A::relocate(code, entry, A::NEAR_JUMP_LEN, trampoline)
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
    /// A thread stayed stopped inside the bytes the write would replace
    /// (blocked there with every signal that could move it blocked): the
    /// entry was left as it was.
    ThreadInside {
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
            PatchError::ThreadInside { address } => write!(
                f,
                "a thread stayed stopped inside the bytes a write at {address:#x} would replace"
            ),
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
    /// [`PatchError::Protection`] when the OS refuses. The protocol then
    /// leaves the page writable and reports the write done: it is.
    fn restore_protection(&mut self, at: usize, len: usize) -> Result<(), PatchError>;
    /// Reads code bytes.
    fn read(&self, at: usize, buf: &mut [u8]);
    /// Writes 2, 4 or 8 bytes in one store (they do not cross a cache line).
    fn write_atomic(&mut self, at: usize, bytes: &[u8]);
    /// Writes bytes no thread executes meanwhile.
    fn write(&mut self, at: usize, bytes: &[u8]);
    /// Makes every core see the code written so far before it executes more.
    fn serialize(&mut self);
    /// Stops every other thread that could run into `regions` until
    /// [`CodeMemory::release`], and moves each that stands inside one,
    /// past its first byte (the scheduler or a signal stopped it between
    /// two of the instructions a patch replaces, or it is blocked in a
    /// system call made there), to code that goes on the same way. Called
    /// before the locks are written (`locked` false: a thread between two
    /// instructions that the lock's bytes cover would run into the lock's
    /// second byte), and again once every core has seen them (`locked`
    /// true), for threads that ran meanwhile. Sets `stuck` on a region a
    /// thread could be neither stopped nor moved out of: its write is
    /// given up (its lock, if written, taken back). Nothing to do where no
    /// other thread runs (the default).
    fn hold(&mut self, regions: &mut [Region], locked: bool) {
        let _ = (regions, locked);
    }
    /// Lets the threads [`CodeMemory::hold`] stopped go on: every entry
    /// holds its lock by then, so none can enter the bytes.
    fn release(&mut self) {}
}

/// Bytes being replaced, for [`CodeMemory::hold`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Where they start (the entry).
    pub at: usize,
    /// How many.
    pub len: usize,
    /// A thread could not be moved out of them.
    pub stuck: bool,
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

/// One entry's write in a batch of the lock protocol.
struct Job<'a> {
    at: usize,
    bytes: &'a [u8],
    /// Made writable: its bytes are written, and its protection restored.
    writable: bool,
    result: Result<(), PatchError>,
    /// The bytes the lock replaced, to take it back.
    under_lock: [u8; 8],
}

impl<'a> Job<'a> {
    const fn new(at: usize, bytes: &'a [u8]) -> Self {
        Job {
            at,
            bytes,
            writable: false,
            result: Ok(()),
            under_lock: [0; 8],
        }
    }
}

/// Writes each job's bytes with the lock protocol (module docs), all in
/// one pass: every lock, one serialisation, every tail, one serialisation,
/// every head, one serialisation. Other threads are held from before the
/// locks until every core has seen them, and those inside the bytes are
/// moved out ([`CodeMemory::hold`]); an entry a thread could not leave is
/// not written, or gets its old bytes back in place of the lock
/// ([`PatchError::ThreadInside`]).
/// Each entry goes through the same three
/// states as when written alone (old, locked, new), so a batch of any size
/// costs three serialisations where one at a time costs three each (a
/// `membarrier` interrupts every core running the process; without it,
/// each is a grace wait of milliseconds). A job that fails (its lock would
/// straddle a line, or its page cannot be made writable), or came failed,
/// is left unwritten; the others go on.
fn write_locked<M: CodeMemory, const N: usize>(mem: &mut M, jobs: &mut [Job<'_>], lock: &[u8]) {
    for job in jobs.iter_mut().filter(|job| job.result.is_ok()) {
        if job.at / CACHE_LINE != (job.at + lock.len() - 1) / CACHE_LINE {
            job.result = Err(PatchError::LockStraddlesLine { address: job.at });
            continue;
        }
        match mem.make_writable(job.at, job.bytes.len()) {
            Ok(()) => job.writable = true,
            Err(e) => job.result = Err(e),
        }
    }
    let long = |job: &&mut Job<'_>| job.writable && job.result.is_ok() && job.bytes.len() > lock.len();
    if jobs.iter_mut().any(|job| long(&job)) {
        let mut regions: heapless::Vec<Region, N> = jobs
            .iter_mut()
            .filter(long)
            .map(|job| Region {
                at: job.at,
                len: job.bytes.len(),
                stuck: false,
            })
            .collect();
        mem.hold(&mut regions, false);
        let stuck = |regions: &[Region], job: &Job<'_>| regions.iter().any(|r| r.at == job.at && r.stuck);
        for job in jobs.iter_mut().filter(long) {
            if stuck(&regions, job) {
                job.result = Err(PatchError::ThreadInside { address: job.at });
                continue;
            }
            mem.read(job.at, &mut job.under_lock[..lock.len()]);
            mem.write_atomic(job.at, lock);
        }
        mem.serialize();
        regions.retain(|r| !r.stuck);
        mem.hold(&mut regions, true);
        mem.release();
        for job in jobs.iter_mut().filter(long) {
            if stuck(&regions, job) {
                mem.write_atomic(job.at, &job.under_lock[..lock.len()]);
                job.result = Err(PatchError::ThreadInside { address: job.at });
            } else {
                mem.write(job.at + lock.len(), &job.bytes[lock.len()..]);
            }
        }
        mem.serialize();
    }
    let mut written = false;
    for job in jobs.iter_mut().filter(|job| job.writable && job.result.is_ok()) {
        let head = job.bytes.len().min(lock.len());
        mem.write_atomic(job.at, &job.bytes[..head]);
        written = true;
    }
    if written {
        mem.serialize();
    }
    // Best effort: a write that is in place is reported done even where
    // its page could not be made read-only again (it then stays writable).
    // Callers act on the entry: reporting it unpatched would lose the
    // means to undo it, and a hook told its function is unpatched would
    // call the entry, which leads back into the hook.
    for job in jobs.iter_mut().filter(|job| job.writable) {
        let _ = mem.restore_protection(job.at, job.bytes.len());
    }
}

/// Writes `patch` at `at` (after the landing pad) with the lock protocol and
/// returns what is needed to undo it.
///
/// # Errors
///
/// A [`PatchError`]; nothing was written then. (A page whose protection
/// could not be restored after the write stays writable; the patch is in
/// place and reported so.)
pub fn write_patch<M: CodeMemory>(
    mem: &mut M,
    at: usize,
    patch: &[u8],
    lock: &[u8],
) -> Result<RestorePoint, PatchError> {
    let point = RestorePoint::read(mem, at, patch);
    let mut job = [Job::new(at, &point.patched)];
    write_locked::<M, 1>(mem, &mut job, lock);
    let result = job[0].result;
    result.map(|()| point)
}

/// Writes each `(at, patch)` with the lock protocol, all in one pass (three
/// serialisations for the whole batch), and returns, in the same order,
/// what undoes each or why it could not be written. A patch that fails
/// leaves its entry unchanged and the others are still written. At most
/// `N` patches: those beyond are neither written nor answered (the result
/// is shorter than `patches`).
///
/// Every entry must be distinct, and no patch's bytes may overlap
/// another's.
pub fn write_patches<M: CodeMemory, const N: usize>(
    mem: &mut M,
    patches: &[(usize, &[u8])],
    lock: &[u8],
) -> heapless::Vec<Result<RestorePoint, PatchError>, N> {
    let mut out: [Option<Result<RestorePoint, PatchError>>; N] = [const { None }; N];
    let answered = write_patches_into::<M, N>(mem, patches, lock, &mut out);
    out.into_iter().take(answered).flatten().collect()
}

/// [`write_patches`], each patch's result written into `out` at the
/// patch's place, for a caller that keeps the results off the stack (an
/// install inside a hook may run on a small one: the pass itself keeps
/// `N` jobs of 48 bytes). Returns how many patches were answered: at most
/// `N` and `out.len()`, the rest neither written nor answered.
///
/// Every entry must be distinct, and no patch's bytes may overlap
/// another's.
pub fn write_patches_into<M: CodeMemory, const N: usize>(
    mem: &mut M,
    patches: &[(usize, &[u8])],
    lock: &[u8],
    out: &mut [Option<Result<RestorePoint, PatchError>>],
) -> usize {
    let patches = &patches[..patches.len().min(N).min(out.len())];
    for (o, &(at, patch)) in out.iter_mut().zip(patches) {
        *o = Some(Ok(RestorePoint::read(mem, at, patch)));
    }
    // The bytes each point holds as written (no more than MAX_PATCH).
    let mut jobs: heapless::Vec<Job<'_>, N> = patches
        .iter()
        .map(|&(at, patch)| Job::new(at, &patch[..patch.len().min(MAX_PATCH)]))
        .collect();
    write_locked::<M, N>(mem, &mut jobs, lock);
    for (o, job) in out.iter_mut().zip(&jobs) {
        if let Err(e) = job.result {
            *o = Some(Err(e));
        }
    }
    patches.len()
}

/// Undoes each patch of `points` with the lock protocol, all in one pass,
/// and says, in the same order, whether each was undone. One whose entry no
/// longer holds its bytes is left alone ([`PatchError::EntryChanged`]).
/// At most `N`: those beyond are left alone and not answered.
pub fn undo_patches<M: CodeMemory, const N: usize>(
    mem: &mut M,
    points: &[&RestorePoint],
    lock: &[u8],
) -> heapless::Vec<Result<(), PatchError>, N> {
    let mut jobs: heapless::Vec<Job<'_>, N> = points.iter().take(N).map(|p| p.undo_job(mem)).collect();
    // Only the entries still ours are written.
    write_locked::<M, N>(mem, &mut jobs, lock);
    jobs.iter().map(|j| j.result).collect()
}

impl RestorePoint {
    /// Puts the original bytes back, with the same protocol.
    ///
    /// # Errors
    ///
    /// [`PatchError::EntryChanged`] if the bytes are no longer ours (then
    /// nothing is written), or a protection error.
    pub fn undo<M: CodeMemory>(&self, mem: &mut M, lock: &[u8]) -> Result<(), PatchError> {
        let mut job = [self.undo_job(mem)];
        write_locked::<M, 1>(mem, &mut job, lock);
        job[0].result
    }

    /// Reads the bytes `patch` will replace at `at`.
    fn read<M: CodeMemory>(mem: &M, at: usize, patch: &[u8]) -> RestorePoint {
        let n = patch.len().min(MAX_PATCH);
        let mut buf = [0u8; MAX_PATCH];
        mem.read(at, &mut buf[..n]);
        let mut point = RestorePoint {
            at,
            original: PatchBytes::new(),
            patched: PatchBytes::new(),
        };
        // Cannot fail: n <= MAX_PATCH.
        let _ = point.original.extend_from_slice(&buf[..n]);
        let _ = point.patched.extend_from_slice(&patch[..n]);
        point
    }

    /// The write that undoes this patch: failed already where the entry
    /// no longer holds it.
    fn undo_job<M: CodeMemory>(&self, mem: &M) -> Job<'_> {
        let mut job = Job::new(self.at, &self.original);
        if !self.in_place(mem) {
            job.result = Err(PatchError::EntryChanged { address: self.at });
        }
        job
    }

    /// Whether the entry still holds the bytes written.
    pub fn in_place<M: CodeMemory>(&self, mem: &M) -> bool {
        self.holds(mem, &self.patched)
    }

    /// Whether the entry holds the bytes the patch replaced: the patch was
    /// undone, or the code was loaded afresh at the same address. Neither
    /// this nor [`Self::in_place`] is true where another hooker patched
    /// over the patch (its jump now leads to ours, and a second patch of
    /// ours over the entry would lead into itself).
    pub fn undone<M: CodeMemory>(&self, mem: &M) -> bool {
        self.holds(mem, &self.original)
    }

    /// The bytes now at the patch's first `unit` bytes, where they are
    /// no longer the patch's but the rest of the patch is: a breakpoint
    /// over the jump's first instruction (a uprobe's or a debugger's,
    /// `unit` being the breakpoint's size), or what a uprobe's removal
    /// puts back there (the first bytes of the instruction the library
    /// file has at that address). Calls then run past the hook, or into
    /// what is left of the jump. `None` where the patch is whole, and
    /// where more than its head changed (another hooker's patch, or code
    /// loaded afresh).
    pub fn head_replaced<M: CodeMemory>(&self, mem: &M, unit: usize) -> Option<PatchBytes> {
        let n = self.patched.len();
        if unit == 0 || unit >= n {
            return None;
        }
        let mut now = [0u8; MAX_PATCH];
        mem.read(self.at, &mut now[..n]);
        (now[..unit] != self.patched[..unit] && now[unit..n] == self.patched[unit..n])
            .then(|| now[..unit].iter().copied().collect())
    }

    fn holds<M: CodeMemory>(&self, mem: &M, bytes: &[u8]) -> bool {
        let mut now = [0u8; MAX_PATCH];
        let n = bytes.len();
        mem.read(self.at, &mut now[..n]);
        now[..n] == *bytes
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    const BASE: usize = 0x1000;
    const LOCK: [u8; 2] = [0xeb, 0xfe];

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Op {
        Writable(usize),
        Protect(usize),
        Atomic(usize),
        Tail(usize),
        Sync,
        Hold,
        Release,
    }

    /// 256 bytes of code at `BASE`; logs every call, and checks after each
    /// write that every entry `watched` holds a state the protocol allows.
    struct Fake {
        code: [u8; 256],
        log: Vec<Op>,
        refuse_writable: Vec<usize>,
        refuse_protect: Vec<usize>,
        /// (entry, bytes before, bytes after) of each patch under way.
        watched: Vec<(usize, Vec<u8>, Vec<u8>)>,
        /// Entries a thread stays inside of: `hold` marks them stuck at
        /// the call given as the value (0: the first, before the locks).
        stuck_at: Vec<(usize, usize)>,
        /// The regions each `hold` was given, and the entries' bytes then.
        held: Vec<Vec<(Region, Vec<u8>)>>,
    }

    impl Fake {
        fn new() -> Self {
            let mut code = [0u8; 256];
            for (i, b) in code.iter_mut().enumerate() {
                *b = i as u8 ^ 0x5a;
            }
            Fake {
                code,
                log: Vec::new(),
                refuse_writable: Vec::new(),
                refuse_protect: Vec::new(),
                watched: Vec::new(),
                stuck_at: Vec::new(),
                held: Vec::new(),
            }
        }

        fn bytes(&self, at: usize, len: usize) -> &[u8] {
            &self.code[at - BASE..][..len]
        }

        /// An entry is old, locked over the old or the new tail, or new:
        /// never the new head over the old tail, never a lock over a mix.
        fn check(&self) {
            for (at, old, new) in &self.watched {
                let now = self.bytes(*at, old.len());
                let locked = |tail: &[u8]| now[..2] == LOCK && now[2..] == tail[2..];
                assert!(
                    now == &old[..] || now == &new[..] || locked(old) || locked(new),
                    "entry {at:#x} holds {now:02x?} (old {old:02x?}, new {new:02x?})"
                );
            }
        }

        fn syncs(&self) -> usize {
            self.log.iter().filter(|&&op| op == Op::Sync).count()
        }

        /// Where in the log `op` happened for the entry, if it did.
        fn at(&self, op: Op) -> Vec<usize> {
            self.log
                .iter()
                .enumerate()
                .filter(|&(_, &o)| o == op)
                .map(|(i, _)| i)
                .collect()
        }

        /// Whether a serialisation lies strictly between log positions.
        fn sync_between(&self, from: usize, to: usize) -> bool {
            self.log[from + 1..to].contains(&Op::Sync)
        }
    }

    impl CodeMemory for Fake {
        fn make_writable(&mut self, at: usize, _len: usize) -> Result<(), PatchError> {
            self.log.push(Op::Writable(at));
            if self.refuse_writable.contains(&at) {
                return Err(PatchError::Protection(13));
            }
            Ok(())
        }
        fn restore_protection(&mut self, at: usize, _len: usize) -> Result<(), PatchError> {
            self.log.push(Op::Protect(at));
            if self.refuse_protect.contains(&at) {
                return Err(PatchError::Protection(12));
            }
            Ok(())
        }
        fn read(&self, at: usize, buf: &mut [u8]) {
            buf.copy_from_slice(self.bytes(at, buf.len()));
        }
        fn write_atomic(&mut self, at: usize, bytes: &[u8]) {
            assert!(bytes.len() <= LOCK.len(), "one store of at most the lock's size");
            self.log.push(Op::Atomic(at));
            self.code[at - BASE..][..bytes.len()].copy_from_slice(bytes);
            self.check();
        }
        fn write(&mut self, at: usize, bytes: &[u8]) {
            self.log.push(Op::Tail(at - LOCK.len()));
            self.code[at - BASE..][..bytes.len()].copy_from_slice(bytes);
            self.check();
        }
        fn serialize(&mut self) {
            self.log.push(Op::Sync);
        }
        fn hold(&mut self, regions: &mut [Region], locked: bool) {
            assert_eq!(locked, self.held.len() % 2 == 1, "before the locks, then after");
            self.log.push(Op::Hold);
            let call = self.held.len();
            let mut seen = Vec::new();
            for r in regions {
                r.stuck = self.stuck_at.contains(&(r.at, call));
                seen.push((*r, self.bytes(r.at, r.len).to_vec()));
            }
            self.held.push(seen);
        }
        fn release(&mut self) {
            self.log.push(Op::Release);
        }
    }

    fn jump(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| 0xe0 ^ seed.wrapping_mul(31).wrapping_add(i as u8))
            .collect()
    }

    /// Each written entry went lock, serialise, tail, serialise, head,
    /// serialise, then had its protection restored.
    fn assert_protocol(mem: &Fake, at: usize) {
        let atomic = mem.at(Op::Atomic(at));
        let tail = mem.at(Op::Tail(at));
        let protect = mem.at(Op::Protect(at));
        assert_eq!(
            (atomic.len(), tail.len(), protect.len()),
            (2, 1, 1),
            "{at:#x}: {:?}",
            mem.log
        );
        assert!(
            mem.sync_between(atomic[0], tail[0]),
            "{at:#x}: tail before the lock was seen"
        );
        assert!(
            mem.sync_between(tail[0], atomic[1]),
            "{at:#x}: head before the tail was seen"
        );
        assert!(
            mem.sync_between(atomic[1], protect[0]),
            "{at:#x}: not serialised at the end"
        );
    }

    fn watch(mem: &mut Fake, patches: &[(usize, Vec<u8>)]) {
        mem.watched = patches
            .iter()
            .map(|(at, new)| (*at, mem.bytes(*at, new.len()).to_vec(), new.clone()))
            .collect();
    }

    /// `(entry, bytes)` pairs as `write_patches` takes them.
    fn as_refs<B: AsRef<[u8]>>(patches: &[(usize, B)]) -> Vec<(usize, &[u8])> {
        patches.iter().map(|(a, b)| (*a, b.as_ref())).collect()
    }

    /// Three near jumps, at entries 32 bytes apart.
    fn three_jumps() -> Vec<(usize, Vec<u8>)> {
        (0..3).map(|i| (BASE + 8 + 32 * i, jump(i as u8, 5))).collect()
    }

    #[test]
    fn a_batch_serialises_three_times_whatever_its_size() {
        for count in [1usize, 2, 5, 12] {
            let mut mem = Fake::new();
            // Entries 17 bytes apart: near and far forms, none straddling.
            let patches: Vec<(usize, Vec<u8>)> = (0..count)
                .map(|i| (BASE + 1 + 17 * i, jump(i as u8, if i % 3 == 2 { 13 } else { 5 })))
                .collect();
            watch(&mut mem, &patches);
            let before = mem.code;
            let refs = as_refs(&patches);
            let done = write_patches::<_, 16>(&mut mem, &refs, &LOCK);
            assert_eq!(mem.syncs(), 3, "{count} patches: {:?}", mem.log);
            assert_eq!(done.len(), count);
            for ((at, new), point) in patches.iter().zip(&done) {
                let point = point.as_ref().unwrap();
                assert_eq!(point.at, *at);
                assert_eq!(&point.patched[..], &new[..]);
                assert_eq!(&point.original[..], &before[at - BASE..][..new.len()]);
                assert_eq!(mem.bytes(*at, new.len()), &new[..]);
                assert_protocol(&mem, *at);
            }

            // And back, in one pass too.
            mem.log.clear();
            for w in &mut mem.watched {
                core::mem::swap(&mut w.1, &mut w.2);
            }
            let points: Vec<&RestorePoint> = done.iter().map(|p| p.as_ref().unwrap()).collect();
            let undone = undo_patches::<_, 16>(&mut mem, &points, &LOCK);
            assert!(undone.iter().all(Result::is_ok), "{undone:?}");
            assert_eq!(mem.syncs(), 3);
            assert_eq!(mem.code, before);
            for (at, _) in &patches {
                assert_protocol(&mem, *at);
            }
        }
    }

    /// A patch whose head (the breakpoint's size) something replaced, the
    /// rest in place, says what is there; a whole patch, a patch undone
    /// and one another hooker wrote over (more than its head changed) do
    /// not. Both heads: x86's 1-byte `int3`, arm64's 4-byte `brk`.
    #[test]
    fn a_replaced_head_is_found_and_nothing_else() {
        for (unit, len) in [(1usize, 5usize), (4, 16)] {
            let mut mem = Fake::new();
            let at = BASE + 8;
            let patch = jump(3, len);
            let done = write_patches::<_, 4>(&mut mem, &[(at, &patch[..])], &LOCK);
            let point = done[0].as_ref().unwrap();
            assert_eq!(point.head_replaced(&mem, unit), None, "whole");
            // A breakpoint over the head.
            let brk: Vec<u8> = [0xcc, 0x00, 0x20, 0xd4][..unit].to_vec();
            mem.code[at - BASE..][..unit].copy_from_slice(&brk);
            assert_eq!(point.head_replaced(&mem, unit).as_deref(), Some(&brk[..]));
            // The file's first bytes put back there.
            let original = point.original.clone();
            mem.code[at - BASE..][..unit].copy_from_slice(&original[..unit]);
            assert_eq!(point.head_replaced(&mem, unit).as_deref(), Some(&original[..unit]));
            // Undone: the original bytes whole.
            mem.code[at - BASE..][..len].copy_from_slice(&original);
            assert_eq!(point.head_replaced(&mem, unit), None, "undone");
            // Another hooker's jump over ours: more than the head changed.
            mem.code[at - BASE..][..len].copy_from_slice(&jump(9, len));
            assert_eq!(point.head_replaced(&mem, unit), None, "another hooker's");
            assert_eq!(point.head_replaced(&mem, 0), None);
            assert_eq!(point.head_replaced(&mem, len), None);
        }
    }

    /// Other threads are held (and moved out of every long patch's bytes)
    /// before the locks, and again once the locks are seen; they are let
    /// go before any tail is written. An entry a thread stays inside of
    /// keeps its old bytes and reports why: found before the locks, it is
    /// never locked; found after, its lock is taken back. The others are
    /// written; undo goes the same way.
    #[test]
    fn threads_are_held_around_the_locks_and_moved_out_before_the_tails() {
        let mut mem = Fake::new();
        let before = mem.code;
        // Near jumps, one far, and one no longer than the lock.
        let mut patches = three_jumps();
        patches[1].1 = jump(9, 13);
        patches.push((BASE + 200, vec![0x90, 0x90]));
        patches.push((BASE + 160, jump(7, 5)));
        let (early, late) = (patches[2].0, patches[4].0);
        mem.stuck_at = vec![(early, 0), (late, 1)];
        watch(&mut mem, &patches);
        let refs = as_refs(&patches);
        let done = write_patches::<_, 8>(&mut mem, &refs, &LOCK);
        let (holds, release) = (mem.at(Op::Hold), mem.at(Op::Release));
        assert_eq!((holds.len(), release.len()), (2, 1), "{:?}", mem.log);
        let first_lock = mem.at(Op::Atomic(patches[0].0))[0];
        let lock_sync = mem.at(Op::Sync)[0];
        let first_tail = mem.at(Op::Tail(patches[0].0))[0];
        assert!(holds[0] < first_lock && lock_sync < holds[1], "{:?}", mem.log);
        assert!(holds[1] < release[0] && release[0] < first_tail, "{:?}", mem.log);
        // Each long entry, with its old bytes at the first hold and its lock
        // at the second; not the short one, nor the first stuck one then.
        let ats = |call: usize| mem.held[call].iter().map(|(r, _)| r.at).collect::<Vec<_>>();
        assert_eq!(ats(0), [patches[0].0, patches[1].0, early, late]);
        assert_eq!(ats(1), [patches[0].0, patches[1].0, late]);
        for (r, bytes) in &mem.held[0] {
            assert_eq!(bytes[..], before[r.at - BASE..][..r.len]);
        }
        for (r, bytes) in &mem.held[1] {
            assert_eq!(bytes[..2], LOCK);
            assert_eq!(bytes[2..], before[r.at - BASE..][2..r.len]);
        }
        for stuck in [early, late] {
            let i = patches.iter().position(|p| p.0 == stuck).unwrap();
            assert_eq!(done[i], Err(PatchError::ThreadInside { address: stuck }));
            assert_eq!(mem.bytes(stuck, 5), &before[stuck - BASE..][..5]);
            assert!(mem.at(Op::Tail(stuck)).is_empty());
            assert_eq!(mem.at(Op::Protect(stuck)).len(), 1, "its protection put back");
        }
        assert!(mem.at(Op::Atomic(early)).is_empty(), "never locked");
        assert_eq!(mem.at(Op::Atomic(late)).len(), 2, "locked, then its bytes back");
        for i in [0, 1, 3] {
            let (at, new) = &patches[i];
            assert_eq!(mem.bytes(*at, new.len()), &new[..]);
        }
        for i in [0, 1] {
            assert_protocol(&mem, patches[i].0);
        }
        assert_eq!(mem.syncs(), 3);

        // Undone: threads held around the locks the same way.
        mem.log.clear();
        mem.held.clear();
        mem.stuck_at.clear();
        for w in &mut mem.watched {
            core::mem::swap(&mut w.1, &mut w.2);
        }
        let points: Vec<&RestorePoint> = [0, 1, 3].iter().map(|&i| done[i].as_ref().unwrap()).collect();
        let undone = undo_patches::<_, 8>(&mut mem, &points, &LOCK);
        assert!(undone.iter().all(Result::is_ok), "{undone:?}");
        assert_eq!(mem.code, before);
        assert_eq!(mem.held.len(), 2);
        assert_eq!(
            mem.held[0].iter().map(|(r, _)| r.at).collect::<Vec<_>>(),
            [patches[0].0, patches[1].0]
        );
    }

    #[test]
    fn patches_no_longer_than_the_lock_take_one_serialisation() {
        let mut mem = Fake::new();
        let patches = [(BASE + 4, [0x90u8, 0x90]), (BASE + 40, [0xcc, 0xcc])];
        let refs = as_refs(&patches);
        let done = write_patches::<_, 4>(&mut mem, &refs, &LOCK);
        assert!(done.iter().all(Result::is_ok));
        assert_eq!(mem.syncs(), 1);
        assert_eq!(mem.bytes(BASE + 4, 2), &[0x90, 0x90]);
        assert_eq!(mem.bytes(BASE + 40, 2), &[0xcc, 0xcc]);
    }

    #[test]
    fn a_failed_patch_leaves_its_entry_and_spares_the_others() {
        let mut mem = Fake::new();
        let straddling = BASE + 63; // the lock would cross a cache line
        let refused = BASE + 100;
        let unprotected = BASE + 140;
        mem.refuse_writable.push(refused);
        mem.refuse_protect.push(unprotected);
        let patches: Vec<(usize, Vec<u8>)> = [BASE + 2, straddling, refused, BASE + 180, unprotected]
            .iter()
            .enumerate()
            .map(|(i, &at)| (at, jump(i as u8, 5)))
            .collect();
        watch(&mut mem, &patches);
        let before = mem.code;
        let refs = as_refs(&patches);
        let done = write_patches::<_, 8>(&mut mem, &refs, &LOCK);
        assert_eq!(done[1], Err(PatchError::LockStraddlesLine { address: straddling }));
        assert_eq!(done[2], Err(PatchError::Protection(13)));
        // Written, though its protection could not be put back: reported
        // written (the entry is what a caller acts on).
        assert_eq!(done[4].as_ref().map(|p| p.at), Ok(unprotected));
        assert_eq!(mem.bytes(unprotected, 5), &patches[4].1[..]);
        for i in [1, 2] {
            let at = patches[i].0;
            assert_eq!(mem.bytes(at, 5), &before[at - BASE..][..5], "{at:#x} was written");
            assert!(mem.at(Op::Atomic(at)).is_empty() && mem.at(Op::Tail(at)).is_empty());
            assert!(
                mem.at(Op::Protect(at)).is_empty(),
                "{at:#x}: protection changed back though never changed"
            );
        }
        for i in [0, 3] {
            assert_eq!(mem.bytes(patches[i].0, 5), &patches[i].1[..]);
            assert_protocol(&mem, patches[i].0);
        }
        assert_eq!(mem.syncs(), 3);
    }

    #[test]
    fn undo_leaves_an_entry_another_hooker_rewrote() {
        let mut mem = Fake::new();
        let before = mem.code;
        let patches = three_jumps();
        let refs = as_refs(&patches);
        let done = write_patches::<_, 4>(&mut mem, &refs, &LOCK);
        // Another hooker patches over the second.
        let theirs = [0xe9, 1, 1, 1, 1];
        mem.code[patches[1].0 - BASE..][..5].copy_from_slice(&theirs);
        mem.log.clear();
        let points: Vec<&RestorePoint> = done.iter().map(|p| p.as_ref().unwrap()).collect();
        let stands = |mem: &Fake| {
            points
                .iter()
                .map(|p| (p.in_place(mem), p.undone(mem)))
                .collect::<Vec<_>>()
        };
        assert_eq!(stands(&mem), [(true, false), (false, false), (true, false)]);
        let undone = undo_patches::<_, 4>(&mut mem, &points, &LOCK);
        assert_eq!(undone[1], Err(PatchError::EntryChanged { address: patches[1].0 }));
        assert!(undone[0].is_ok() && undone[2].is_ok());
        assert_eq!(stands(&mem), [(false, true), (false, false), (false, true)]);
        assert_eq!(mem.bytes(patches[1].0, 5), &theirs);
        assert!(mem.at(Op::Writable(patches[1].0)).is_empty());
        for i in [0, 2] {
            let at = patches[i].0;
            assert_eq!(mem.bytes(at, 5), &before[at - BASE..][..5]);
        }
        assert_eq!(mem.syncs(), 3);
    }

    #[test]
    fn patches_beyond_the_room_are_left_unwritten() {
        let mut mem = Fake::new();
        let before = mem.code;
        let patches = three_jumps();
        let refs = as_refs(&patches);
        let done = write_patches::<_, 2>(&mut mem, &refs, &LOCK);
        assert_eq!(done.len(), 2);
        assert!(done[0].is_ok() && done[1].is_ok());
        assert_eq!(mem.bytes(patches[2].0, 5), &before[patches[2].0 - BASE..][..5]);
        assert!(mem.at(Op::Writable(patches[2].0)).is_empty());
        // A batch with nothing to write serialises nothing.
        mem.log.clear();
        mem.refuse_writable.push(BASE + 200);
        let none = write_patches::<_, 2>(&mut mem, &[(BASE + 200, &[1, 2, 3, 4, 5][..])], &LOCK);
        assert_eq!(none[0], Err(PatchError::Protection(13)));
        assert_eq!(mem.syncs(), 0);
    }
}

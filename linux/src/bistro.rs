//! Bistro: patching a function's entry so that every caller reaches a hook,
//! which can still call the original.
//!
//! ```no_run
//! use memhook::bistro::Hook;
//!
//! extern "C" fn my_getpid() -> libc::pid_t {
//!     let original: extern "C" fn() -> libc::pid_t = unsafe { core::mem::transmute(ORIGINAL.load(core::sync::atomic::Ordering::Acquire)) };
//!     original() // and see every call
//! }
//! static ORIGINAL: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
//!
//! // SAFETY: my_getpid has getpid's signature and ORIGINAL is set before
//! // the patch is visible (Hook::patch_with stores it first).
//! let hook = unsafe { Hook::patch_with(libc::getpid as *const () as usize, my_getpid as *const () as usize, &ORIGINAL) }.unwrap();
//! println!("{}", unsafe { libc::getpid() });
//! hook.unpatch().map_err(|(_, e)| e).unwrap();
//! ```
//!
//! How: the instructions the entry jump displaces are relocated into a
//! trampoline in a page mapped near the function (so the 5-byte `jmp rel32`
//! and rel32 operands reach), and the jump is written with the lock/tail/
//! head protocol of [`memhook_core::patch`]. A hook too far for the 5-byte
//! jump is reached through a far-jump slot near the function; only when no
//! slot can be mapped near does the entry get the 13-byte absolute form.
//! Where the function's first instruction can run before the hook
//! ([`memhook_core::patch::Arch::keep_first`]: `push rbp`, `mov eax, n`),
//! it stays in place and the jump follows it, to a slot that undoes it and
//! goes on to the hook; the trampoline runs it again. The entry's first
//! bytes are then the library file's, which is what a uprobe put on the
//! function runs out of line and writes back when it is taken out.
//! An entry another hooker already patched is relocated like any code, so
//! both hooks run. What cannot be relocated is refused with the reason, the
//! function's name and library (from `dladdr`) and its first 16 bytes.

use core::ffi::CStr;
use core::fmt;
use core::sync::atomic::{AtomicUsize, Ordering};

use memhook_core::patch::{
    Arch, PatchBytes, PatchError, RelocError, Relocation, RestorePoint, relocate_near, undo_patches, write_patches_into,
};

use crate::code::{Exit, LinuxCode};
use crate::{maps, trampoline};

/// The code generator of the machine memhook runs on.
#[cfg(target_arch = "x86_64")]
pub type NativeArch = memhook_x86_64::X86_64;

/// The code generator of the machine memhook runs on.
#[cfg(target_arch = "aarch64")]
pub type NativeArch = memhook_aarch64::Aarch64;

/// How far a near jump reaches, with a margin for the slot's own size.
#[cfg(target_arch = "x86_64")]
pub(crate) const NEAR_REACH: usize = (1 << 31) - (1 << 20);
/// How far a near jump (`b imm26`, ±128 MiB) reaches, with a margin.
#[cfg(target_arch = "aarch64")]
pub(crate) const NEAR_REACH: usize = (128 << 20) - (1 << 20);

/// Bytes of the entry read for relocation.
const READ: usize = 64;

/// Why a function could not be patched (or unpatched).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BistroError {
    /// The instructions under the patch cannot be relocated.
    Reloc {
        /// The function.
        target: usize,
        /// Why.
        error: RelocError,
        /// Its first bytes.
        bytes: [u8; 16],
        /// How many of `bytes` were readable.
        len: u8,
    },
    /// Writing the code failed.
    Patch {
        /// The function.
        target: usize,
        /// Why.
        error: PatchError,
    },
    /// The address is not in an executable mapping.
    NotCode {
        /// The address.
        target: usize,
    },
    /// No trampoline page could be mapped.
    NoTrampoline {
        /// The function.
        target: usize,
    },
    /// `dlsym` found no such symbol.
    NoSymbol,
    /// Another patch of the same batch covers the entry.
    Overlaps {
        /// The function.
        target: usize,
    },
    /// The hook lies in the bytes the patch would overwrite (the target
    /// itself, say): every call would jump into the jump.
    HookInPatch {
        /// The function.
        target: usize,
        /// The hook.
        hook: usize,
    },
}

impl BistroError {
    /// The function the error is about.
    pub fn target(&self) -> usize {
        match *self {
            BistroError::Reloc { target, .. }
            | BistroError::Patch { target, .. }
            | BistroError::NotCode { target }
            | BistroError::NoTrampoline { target }
            | BistroError::Overlaps { target }
            | BistroError::HookInPatch { target, .. } => target,
            BistroError::NoSymbol => 0,
        }
    }
}

/// Writes bytes as two hex digits each, every one after a space.
pub(crate) struct Bytes<'a>(pub(crate) &'a [u8]);

impl fmt::Display for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, " {b:02x}"))
    }
}

/// Writes `symbol in library` for an address, from `dladdr`.
struct Where(usize);

impl fmt::Display for Where {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
        // SAFETY: dladdr only writes `info`; the strings it points to live
        // as long as the object stays loaded, which covers this call.
        let found = unsafe { libc::dladdr(self.0 as *const libc::c_void, info.as_mut_ptr()) } != 0;
        // SAFETY: zero-initialised, then possibly filled by dladdr.
        let info = unsafe { info.assume_init() };
        let text = |p: *const libc::c_char| {
            // SAFETY: non-null pointers from dladdr are NUL-terminated.
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy())
        };
        let symbol = if found { text(info.dli_sname) } else { None };
        let library = if found { text(info.dli_fname) } else { None };
        match symbol {
            Some(s) if info.dli_saddr as usize == self.0 => write!(f, "{s}")?,
            Some(s) => write!(f, "{s}+{:#x}", self.0 - info.dli_saddr as usize)?,
            None => write!(f, "{:#x}", self.0)?,
        }
        if let Some(l) = library {
            write!(f, " in {l}")?;
        }
        write!(f, " ({:#x})", self.0)
    }
}

impl fmt::Display for BistroError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BistroError::Reloc {
                target,
                error,
                bytes,
                len,
            } => {
                write!(
                    f,
                    "cannot patch {}: {error}; first bytes:{}",
                    Where(*target),
                    Bytes(&bytes[..*len as usize])
                )
            }
            BistroError::Patch { target, error } => write!(f, "cannot patch {}: {error}", Where(*target)),
            BistroError::NotCode { target } => write!(f, "{:#x} is not in an executable mapping", target),
            BistroError::NoTrampoline { target } => {
                write!(f, "cannot patch {}: no trampoline page could be mapped", Where(*target))
            }
            BistroError::NoSymbol => f.write_str("no such symbol in the loaded objects"),
            BistroError::Overlaps { target } => write!(
                f,
                "cannot patch {}: another patch of the same batch covers its entry",
                Where(*target)
            ),
            BistroError::HookInPatch { target, hook } => write!(
                f,
                "cannot patch {}: the hook {hook:#x} lies in the bytes the patch overwrites (every call would jump into the jump)",
                Where(*target)
            ),
        }
    }
}

impl std::error::Error for BistroError {}

/// A relocated prologue kept for re-patching the same entry: its code is a
/// pure function of the entry bytes, the entry address and the slot, so the
/// slot is reused when the entry still holds the same bytes.
#[derive(Clone, Copy)]
struct Cached {
    target: usize,
    /// Where the patch started (past a landing pad or a kept instruction).
    skip: usize,
    bytes: [u8; READ],
    len: usize,
    trampoline: usize,
}

const CACHE: usize = 256;

/// Room for the exits of a batch: a near jump covers at most 4
/// instruction starts past its first byte, a far one 12.
const EXITS: usize = BATCH * 12;

struct State {
    trampolines: heapless::Vec<Cached, CACHE>,
    /// Slots an entry jumps to ([`entry_slot`]): (hook, undo, slot).
    slots: heapless::Vec<(usize, PatchBytes, usize), CACHE>,
    /// The batch being written: where a thread standing inside its bytes
    /// goes on (here, not on the stack: a few KiB).
    exits: heapless::Vec<Exit, EXITS>,
    /// The batch being written: each request's plan, then what its write
    /// gave (here, not on the stack: 10 KiB, in an install that may run
    /// inside a hook on a small stack).
    planned: heapless::Vec<Result<Planned, BistroError>, BATCH>,
    written: [Option<Result<RestorePoint, PatchError>>; BATCH],
    /// One protection's pass: its results, in the order of its patches.
    pass: [Option<Result<RestorePoint, PatchError>>; BATCH],
}

/// Serialises patching: install paths only, never a hook path.
static STATE: crate::fork::Mutex<State> = crate::fork::Mutex::new(State {
    trampolines: heapless::Vec::new(),
    slots: heapless::Vec::new(),
    exits: heapless::Vec::new(),
    planned: heapless::Vec::new(),
    written: [const { None }; BATCH],
    pass: [const { None }; BATCH],
});

/// A patched function entry. Dropping it leaves the patch in place (hooks
/// are usually for the life of the process); [`Hook::unpatch`] undoes it.
#[derive(Debug)]
#[must_use = "dropping a Hook keeps the patch; call unpatch to undo it"]
pub struct Hook {
    target: usize,
    hook: usize,
    trampoline: usize,
    taken: usize,
    /// Protection of the patched pages, restored after each write.
    prot: i32,
    restore: RestorePoint,
    /// The patched pages' record, which keeps a discarding `madvise` off
    /// them (`crate::kept`) while this hook lives.
    kept: Option<crate::kept::Kept>,
}

impl Drop for Hook {
    /// The patch stays (see [`Hook`]), but memhook no longer looks after
    /// it: its pages are no longer kept from a discarding `madvise`
    /// (an unloaded library's address may be another mapping's next).
    fn drop(&mut self) {
        if let Some(k) = self.kept.take() {
            crate::kept::release(k);
        }
    }
}

/// What a dry run found: whether and how a function can be patched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Bytes kept at the entry: a landing pad (`endbr64`), or the first
    /// instruction ([`Plan::kept`]).
    pub skip: usize,
    /// Whether the function's first instruction stays ahead of the patch
    /// ([`memhook_core::patch::Arch::keep_first`]; the patch then jumps to
    /// a slot that undoes it where it needs undoing).
    pub kept: bool,
    /// Bytes of original instructions the patch takes.
    pub taken: usize,
}

/// The protection of the loaded segment holding `addr`, and where the
/// readable part of it ends: from the program headers (`dl_iterate_phdr`,
/// no system call), else from `/proc/self/maps` (JIT or anonymous code).
fn code_mapping(addr: usize) -> Option<(i32, usize)> {
    struct Search {
        addr: usize,
        page: usize,
        found: Option<(i32, usize)>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the Search passed below; `info` and its program
        // headers are valid for this callback (dl_iterate_phdr's contract).
        let (search, info) = unsafe { (&mut *(data as *mut Search), &*info) };
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: `dlpi_phdr` points to `dlpi_phnum` headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type != libc::PT_LOAD {
                continue;
            }
            let start = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
            let end = (start + ph.p_memsz as usize).next_multiple_of(search.page);
            if (start..end).contains(&search.addr) {
                let mut prot = 0;
                if ph.p_flags & libc::PF_R != 0 {
                    prot |= libc::PROT_READ;
                }
                if ph.p_flags & libc::PF_W != 0 {
                    prot |= libc::PROT_WRITE;
                }
                if ph.p_flags & libc::PF_X != 0 {
                    prot |= libc::PROT_EXEC;
                }
                search.found = Some((prot, end));
                return 1;
            }
        }
        0
    }
    let mut search = Search {
        addr,
        page: crate::maps::page_size(),
        found: None,
    };
    // SAFETY: `visit` matches dl_iterate_phdr's callback type and only
    // reads what the loader hands it; `search` outlives the call.
    unsafe { crate::fork::iterate_phdr(visit, (&mut search as *mut Search).cast()) };
    search.found.or_else(|| maps::find(addr).map(|m| (m.prot, m.end)))
}

/// The entry's first bytes (as many as the segment holds, up to 64) and the
/// protection of its pages.
fn read_entry(target: usize) -> Result<([u8; READ], usize, i32), BistroError> {
    let (prot, end) = code_mapping(target).ok_or(BistroError::NotCode { target })?;
    if prot & libc::PROT_EXEC == 0 || prot & libc::PROT_READ == 0 {
        return Err(BistroError::NotCode { target });
    }
    let len = READ.min(end - target);
    let mut bytes = [0u8; READ];
    // SAFETY: `[target, target + len)` lies in a readable, mapped segment.
    unsafe { core::ptr::copy_nonoverlapping(target as *const u8, bytes.as_mut_ptr(), len) };
    Ok((bytes, len, prot))
}

fn reloc_error(target: usize, error: RelocError, bytes: &[u8]) -> BistroError {
    let mut first = [0u8; 16];
    let len = bytes.len().min(16);
    first[..len].copy_from_slice(&bytes[..len]);
    BistroError::Reloc {
        target,
        error,
        bytes: first,
        len: len as u8,
    }
}

/// Whether bistro can patch `target` with the 5-byte (`far == false`) or
/// 13-byte form, and how many bytes it would take. Writes nothing.
///
/// # Errors
///
/// The [`BistroError`] a patch would fail with.
pub fn can_patch(target: usize, far: bool) -> Result<Plan, BistroError> {
    dry_plan(target, far, is_empty_function(target))
}

/// Whether bistro could patch `target` with the 5-byte form, taking it
/// for an empty function ([`memhook_core::patch::Arch::relocate_empty`])
/// before [`EMPTY_FUNCTION`] names it: what `memhook doctor` says of the
/// loader's breakpoint.
pub(crate) fn can_patch_empty(target: usize) -> bool {
    dry_plan(target, false, true).is_ok()
}

/// [`can_patch`], with the relocator for empty functions or not.
fn dry_plan(target: usize, far: bool, empty: bool) -> Result<Plan, BistroError> {
    let (bytes, len, _) = read_entry(target)?;
    let code = &bytes[..len];
    // A trampoline right next to the function stands for a near slot.
    let near = target + (1 << 20);
    let r = if far {
        relocate_as(code, target, NativeArch::FAR_JUMP_LEN, near, empty)?
    } else if empty {
        relocate_as(code, target, NativeArch::NEAR_JUMP_LEN, near, true)?
    } else {
        // The kept layout where it can be (kept_layout).
        relocate_near::<NativeArch>(code, target, near).map_err(|e| reloc_error(target, e, code))?
    };
    Ok(Plan {
        skip: r.skip,
        // Past a kept instruction, not the landing pad alone.
        kept: r.skip != NativeArch::entry_skip(code),
        taken: r.taken,
    })
}

/// One function for [`Hook::patch_batch`] to patch: as the arguments of
/// [`Hook::patch_with`].
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The function's entry.
    pub target: usize,
    /// Where its callers are to go.
    pub hook: usize,
    /// Set to the address that calls the original, before the patch is
    /// visible.
    pub original: &'a AtomicUsize,
}

/// The one function bistro takes for empty ([`memhook_core::patch::Arch::relocate_empty`]):
/// the loader's breakpoint for debuggers (glibc's `_dl_debug_state`),
/// which `crate::namespace` names before it asks for its patch; 0 for
/// none. Anywhere else a function shorter than the patch is refused.
pub(crate) static EMPTY_FUNCTION: AtomicUsize = AtomicUsize::new(0);

/// [`NativeArch::relocate`], or, for [`EMPTY_FUNCTION`],
/// [`memhook_core::patch::Arch::relocate_empty`].
fn relocate(code: &[u8], target: usize, need: usize, trampoline: usize) -> Result<Relocation, BistroError> {
    relocate_as(code, target, need, trampoline, is_empty_function(target))
}

/// Whether `target` is [`EMPTY_FUNCTION`].
fn is_empty_function(target: usize) -> bool {
    target != 0 && target == EMPTY_FUNCTION.load(Ordering::Acquire)
}

/// [`relocate`], with the relocator for empty functions (`empty`) or the
/// general one.
fn relocate_as(
    code: &[u8],
    target: usize,
    need: usize,
    trampoline: usize,
    empty: bool,
) -> Result<Relocation, BistroError> {
    let r = if empty {
        NativeArch::relocate_empty(code, target, need, trampoline)
    } else {
        NativeArch::relocate(code, target, need, trampoline)
    };
    r.map_err(|e| reloc_error(target, e, code))
}

/// A patch ready to write: the trampoline holds the relocated prologue.
struct Planned {
    /// Where the jump goes (after the landing pad).
    at: usize,
    jump: PatchBytes,
    trampoline: usize,
    taken: usize,
    prot: i32,
}

/// Most patches written in one pass (one hold of the other threads and
/// three serialisations): every hooked CUDA function of the driver and
/// the runtime (70), or the host functions and the loader's (16). The
/// pass's bookkeeping lies in the patching state, not on the stack.
pub const BATCH: usize = 80;

/// [`Hook::patch_batch`] for at most [`BATCH`] requests: their results,
/// in order, pushed onto `done` (which has room for them).
fn patch_chunk<const N: usize>(
    state: &mut State,
    requests: &[Request<'_>],
    done: &mut heapless::Vec<Result<Hook, BistroError>, N>,
) {
    state.exits.clear();
    state.planned.clear();
    for r in requests.iter().take(BATCH) {
        let plan = plan(state, r.target, r.hook).and_then(|p| {
            let (start, end) = (p.at, p.at + p.jump.len());
            // From the entry (the jump may follow an `endbr64`, which
            // leads straight into it).
            if (r.target.min(start)..end).contains(&r.hook) {
                return Err(BistroError::HookInPatch {
                    target: r.target,
                    hook: r.hook,
                });
            }
            let overlaps = state
                .planned
                .iter()
                .flatten()
                .any(|q| q.at < end && start < q.at + q.jump.len());
            if overlaps {
                return Err(BistroError::Overlaps { target: r.target });
            }
            Ok(p)
        });
        if let Ok(p) = &plan {
            // Before the patch is visible: the hook calls through it.
            r.original.store(p.trampoline, Ordering::Release);
        }
        // Cannot fail: at most BATCH taken.
        let _ = state.planned.push(plan);
    }
    let State {
        exits,
        planned,
        written,
        pass,
        ..
    } = state;
    let exits = &exits[..];
    written.fill_with(|| None);
    by_protection(
        |i| planned[i].as_ref().ok().map(|p| p.prot),
        planned.len(),
        |prot, group| {
            let patches: heapless::Vec<(usize, &[u8]), BATCH> = group
                .iter()
                .filter_map(|&i| planned[i].as_ref().ok().map(|p| (p.at, &p.jump[..])))
                .collect();
            let mut code = LinuxCode::with_protection(prot).with_exits(exits);
            let answered = write_patches_into::<_, BATCH>(&mut code, &patches, NativeArch::LOCK, &mut pass[..]);
            for (&i, r) in group.iter().zip(pass.iter_mut()).take(answered) {
                written[i] = r.take();
            }
        },
    );
    for ((plan, written), r) in planned.iter().zip(written.iter_mut()).zip(requests) {
        let result = match plan {
            Ok(p) => {
                // Every plan was written, in its protection's pass.
                let written = written.take().unwrap_or(Err(PatchError::Protection(0)));
                written
                    .map(|restore| Hook {
                        target: r.target,
                        hook: r.hook,
                        trampoline: p.trampoline,
                        taken: p.taken,
                        prot: p.prot,
                        kept: crate::kept::keep(restore.at, restore.patched.len()),
                        restore,
                    })
                    .map_err(|error| BistroError::Patch {
                        target: r.target,
                        error,
                    })
            }
            Err(e) => Err(*e),
        };
        // Cannot fail: the caller gives at most N requests in all.
        let _ = done.push(result);
    }
}

/// Calls `write(prot, group)` once for each protection among the first
/// `len` items (`prot_of`; `None` for an item to leave out), `group`
/// holding the indices of the items with that protection in order: a
/// batch is written in one pass per protection of the mappings it
/// patches (code is almost always r-x, so one pass). Every signal is
/// blocked on this thread meanwhile (see [`SignalsBlocked`]).
fn by_protection(prot_of: impl Fn(usize) -> Option<i32>, len: usize, mut write: impl FnMut(i32, &[usize])) {
    let _blocked = SignalsBlocked::new();
    let len = len.min(BATCH);
    let mut grouped = [false; BATCH];
    for first in 0..len {
        let Some(prot) = prot_of(first).filter(|_| !grouped[first]) else {
            continue;
        };
        let mut group = heapless::Vec::<usize, BATCH>::new();
        for (i, g) in grouped.iter_mut().enumerate().take(len).skip(first) {
            if !*g && prot_of(i) == Some(prot) {
                *g = true;
                let _ = group.push(i);
            }
        }
        write(prot, &group);
    }
}

/// Blocks every signal that can be blocked on this thread while it lives,
/// and restores the mask it found. While a batch is written, entries hold
/// the lock (a jump to itself): a signal handler that ran on the writing
/// thread then and called one of those functions (an allocator's `mmap`
/// in a profiler's or a garbage collector's handler) would spin there for
/// ever, since the thread that would write the rest is the one spinning.
/// Deferred, the signal is taken once the batch is written. (A listing
/// of the threads blocks them too: `evacuate`.)
pub(crate) struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    pub(crate) fn new() -> Self {
        let mut all = core::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let mut found = core::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigfillset initialises `all`; pthread_sigmask reads it
        // and writes the mask it replaces into `found` (it cannot fail
        // with a valid `how`, and then `found` is written).
        unsafe {
            libc::sigfillset(all.as_mut_ptr());
            libc::pthread_sigmask(libc::SIG_BLOCK, all.as_ptr(), found.as_mut_ptr());
            SignalsBlocked(found.assume_init())
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask `new` found; signals that came
        // meanwhile are delivered now.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, core::ptr::null_mut()) };
    }
}

/// Where a patch starts and the jump it writes there.
struct Layout {
    /// Bytes left ahead of the patch.
    skip: usize,
    /// Whether they are an instruction [`Arch::keep_first`] kept (else a
    /// landing pad, or none).
    kept: bool,
    jump: PatchBytes,
}

/// The patch after the function's first instruction, where
/// [`Arch::keep_first`] keeps it (a uprobe on the function then leaves
/// the hook whole: README, "Debuggers and probes"), a slot near enough
/// runs what undoes it before the hook, and a dry run finds the code
/// after it can be moved. `None` otherwise.
fn kept_layout(state: &mut State, code: &[u8], target: usize, hook: usize) -> Option<Layout> {
    if is_empty_function(target) {
        return None;
    }
    let (keep, undo) = NativeArch::keep_first(code)?;
    let at = target + keep;
    let dest = if undo.is_empty() && NativeArch::is_near(at, hook) {
        hook
    } else {
        entry_slot(state, at, &undo, hook)?
    };
    let jump = NativeArch::entry_jump(at, dest);
    if jump.len() != NativeArch::NEAR_JUMP_LEN {
        return None;
    }
    // A trampoline right next to the function stands for a near slot.
    NativeArch::relocate_keeping(code, target, keep, jump.len(), target + (1 << 20)).ok()?;
    Some(Layout {
        skip: keep,
        kept: true,
        jump,
    })
}

/// The patch past the landing pad (if any), jumping to the hook or to a
/// far-jump slot near the entry.
fn plain_layout(state: &mut State, code: &[u8], target: usize, hook: usize) -> Layout {
    let skip = NativeArch::entry_skip(code);
    let at = target + skip;
    let dest = if NativeArch::is_near(at, hook) {
        hook
    } else {
        entry_slot(state, at, &[], hook).unwrap_or(hook)
    };
    Layout {
        skip,
        kept: false,
        jump: NativeArch::entry_jump(at, dest),
    }
}

/// Reads the entry, relocates its prologue into a trampoline near it (or
/// reuses the one made for the same bytes before) and builds the jump:
/// after a kept first instruction where it can ([`kept_layout`]), else
/// at the entry or past its landing pad. Writes no code but the
/// trampoline's and the slots'.
fn plan(state: &mut State, target: usize, hook: usize) -> Result<Planned, BistroError> {
    let (bytes, len, prot) = read_entry(target)?;
    let code = &bytes[..len];
    // The kept layout's relocation can still fail where the dry run's did
    // not (a RIP-relative operand out of the real trampoline's reach):
    // then the plain one, as before.
    if let Some(layout) = kept_layout(state, code, target, hook)
        && let Ok(planned) = plan_as(state, code, target, prot, layout)
    {
        return Ok(planned);
    }
    let layout = plain_layout(state, code, target, hook);
    plan_as(state, code, target, prot, layout)
}

/// [`plan`] for one layout.
fn plan_as(state: &mut State, code: &[u8], target: usize, prot: i32, layout: Layout) -> Result<Planned, BistroError> {
    let at = target + layout.skip;
    let jump = &layout.jump;
    let relocate_for = |slot: usize| {
        if layout.kept {
            NativeArch::relocate_keeping(code, target, layout.skip, jump.len(), slot)
                .map_err(|e| reloc_error(target, e, code))
        } else {
            relocate(code, target, jump.len(), slot)
        }
    };
    let cached = state
        .trampolines
        .iter()
        .find(|c| {
            c.target == target && c.skip == layout.skip && c.len <= code.len() && c.bytes[..c.len] == code[..c.len]
        })
        .map(|c| c.trampoline);
    let (trampoline, r) = match cached {
        Some(slot) => {
            // Same bytes, same entry, same layout, same slot: the code is
            // already there.
            let r = relocate_for(slot)?;
            (slot, r)
        }
        None => {
            let slot = trampoline::alloc_near(at, NEAR_REACH).ok_or(BistroError::NoTrampoline { target })?;
            let r = relocate_for(slot)?;
            trampoline::write(slot, &r.code).map_err(|error| BistroError::Patch { target, error })?;
            trampoline::trim(slot, r.code.len());
            let used = r.skip + r.taken;
            let mut c = Cached {
                target,
                skip: r.skip,
                bytes: [0; READ],
                len: used,
                trampoline: slot,
            };
            c.bytes[..used].copy_from_slice(&code[..used]);
            if state.trampolines.is_full() {
                state.trampolines.remove(0);
            }
            let _ = state.trampolines.push(c);
            (slot, r)
        }
    };
    // A thread standing at an instruction start inside the jump's bytes
    // goes on at the same instruction in the trampoline. (A plan refused
    // later leaves its exits: each leads to a copy of the code at its
    // start, which stays right.) One before a kept instruction runs it and
    // comes to the jump; one past it, at the jump's first byte, finds the
    // jump or the lock there.
    for &(from, to) in &r.starts {
        if from > 0 && usize::from(from) < jump.len() {
            // Cannot fail: at most 12 for each of BATCH plans.
            let _ = state.exits.push(Exit {
                from: at + usize::from(from),
                to: trampoline + usize::from(to),
            });
        }
    }
    Ok(Planned {
        at,
        jump: layout.jump,
        trampoline,
        taken: r.taken,
        prot,
    })
}

impl Hook {
    /// Patches the function at `target` so that it jumps to `hook`; stores
    /// the address that calls the original into `original` before the patch
    /// becomes visible, and returns the handle.
    ///
    /// # Safety
    ///
    /// `target` must be the entry of a function, `hook` a function with the
    /// same signature and ABI, and the hook must call the original (if at
    /// all) only through `original`. Code that jumps into the middle of the
    /// patched bytes from outside the 64 bytes memhook can see is not
    /// detected. The hook gets every argument the function reads as the
    /// caller passed it; a parameter the function never reads, whose
    /// register its first instruction overwrites, may hold something else
    /// where that instruction is kept ahead of the patch
    /// ([`memhook_core::patch::Arch::keep_first`]).
    ///
    /// # Errors
    ///
    /// A [`BistroError`]; the function is then unchanged.
    pub unsafe fn patch_with(target: usize, hook: usize, original: &AtomicUsize) -> Result<Hook, BistroError> {
        let request = Request { target, hook, original };
        // SAFETY: forwarded from the caller.
        let mut done = unsafe { Hook::patch_batch::<1>(core::slice::from_ref(&request)) };
        // One request in, one result out.
        done.pop().unwrap_or(Err(BistroError::Overlaps { target }))
    }

    /// [`Hook::patch_with`] for each request, the entries written in one
    /// pass of the lock protocol ([`memhook_core::patch::write_patches`]):
    /// three serialisations of every core for the whole batch, not three
    /// each (with the grace wait where the kernel lacks the membarrier,
    /// 6 ms for the batch instead of 6 ms a function), and each page's
    /// protection changed once each way. The results come in the order of
    /// the requests; one that fails leaves its function unchanged, and the
    /// others are patched. At most `N` requests are answered (the rest are
    /// not patched).
    ///
    /// # Safety
    ///
    /// As for [`Hook::patch_with`], for each request. The entries of one
    /// batch must be distinct functions (one whose patch would overlap an
    /// earlier request's is refused with [`BistroError::Overlaps`]).
    pub unsafe fn patch_batch<const N: usize>(requests: &[Request<'_>]) -> heapless::Vec<Result<Hook, BistroError>, N> {
        let mut state = STATE.lock();
        let mut done = heapless::Vec::new();
        for chunk in requests[..requests.len().min(N)].chunks(BATCH) {
            patch_chunk(&mut state, chunk, &mut done);
        }
        done
    }

    /// [`Hook::patch_with`] on the function `symbol` resolves to in the
    /// global scope (`dlsym(RTLD_DEFAULT, symbol)`).
    ///
    /// # Safety
    ///
    /// As for [`Hook::patch_with`], with `symbol` naming a function.
    ///
    /// # Errors
    ///
    /// [`BistroError::NoSymbol`] when nothing is found, else as
    /// [`Hook::patch_with`].
    pub unsafe fn patch_symbol(symbol: &CStr, hook: usize, original: &AtomicUsize) -> Result<Hook, BistroError> {
        // SAFETY: a NUL-terminated name and the pseudo-handle RTLD_DEFAULT.
        let target = unsafe { libc::dlsym(libc::RTLD_DEFAULT, symbol.as_ptr()) } as usize;
        if target == 0 {
            return Err(BistroError::NoSymbol);
        }
        // SAFETY: forwarded from the caller.
        unsafe { Hook::patch_with(target, hook, original) }
    }

    /// Undoes the patch, restoring the entry's bytes exactly. The trampoline
    /// stays mapped (a thread may still be running in it).
    ///
    /// # Errors
    ///
    /// Returns the hook with the error when the entry no longer holds our
    /// jump (another hooker patched over it: undo theirs first).
    // The hook comes back by value so it stays usable without a Box: the
    // install path does not allocate.
    #[allow(clippy::result_large_err)]
    pub fn unpatch(self) -> Result<(), (Hook, BistroError)> {
        let mut hooks = heapless::Vec::<Hook, 1>::new();
        // Cannot fail: room for one.
        let _ = hooks.push(self);
        match Hook::unpatch_batch(&mut hooks) {
            Some(error) => match hooks.pop() {
                Some(h) => Err((h, error)),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// [`Hook::unpatch`] for every hook of `hooks`, written in one pass of
    /// the lock protocol (three serialisations for the whole batch). The
    /// hooks undone are taken out of `hooks`; those left are the ones
    /// whose entry no longer holds the jump (another hooker patched over
    /// it), in their order, and the first one's error is returned.
    pub fn unpatch_batch<const N: usize>(hooks: &mut heapless::Vec<Hook, N>) -> Option<BistroError> {
        let mut state = STATE.lock();
        // A thread between a far jump's two instructions goes on where the
        // jump goes (its first one loaded the destination already).
        state.exits.clear();
        for h in hooks.iter() {
            if let Some((offset, to)) = NativeArch::jump_interior(&h.restore.patched) {
                let _ = state.exits.push(Exit {
                    from: h.restore.at + offset,
                    to,
                });
            }
        }
        let exits = &state.exits[..];
        let mut undone = [false; N];
        let mut error = None;
        for (c, chunk) in hooks.chunks(BATCH).enumerate() {
            by_protection(
                |i| Some(chunk[i].prot),
                chunk.len(),
                |prot, group| {
                    let points: heapless::Vec<&RestorePoint, BATCH> =
                        group.iter().map(|&i| &chunk[i].restore).collect();
                    let mut code = LinuxCode::with_protection(prot).with_exits(exits);
                    let results = undo_patches::<_, BATCH>(&mut code, &points, NativeArch::LOCK);
                    for (&i, r) in group.iter().zip(results) {
                        match r {
                            Ok(()) => undone[c * BATCH + i] = true,
                            Err(e) => {
                                error = error.or(Some(BistroError::Patch {
                                    target: chunk[i].target,
                                    error: e,
                                }))
                            }
                        }
                    }
                },
            );
        }
        let mut i = 0;
        hooks.retain(|_| {
            i += 1;
            !undone[i - 1]
        });
        error
    }

    /// Whether the function's entry still holds this patch's jump (not
    /// when another hooker patched over it, or when the code there is no
    /// longer the code patched: a library unloaded and another loaded at
    /// its address).
    ///
    /// # Safety
    ///
    /// The entry's bytes are mapped and readable.
    pub unsafe fn in_place(&self) -> bool {
        self.restore.in_place(&LinuxCode::with_protection(self.prot))
    }

    /// Whether the function's entry holds the bytes this patch replaced:
    /// undone by someone else, or the code loaded afresh at the address
    /// (a library unloaded and loaded again there). Where neither this
    /// nor [`Hook::in_place`] holds, another hooker patched over it.
    ///
    /// # Safety
    ///
    /// The entry's bytes are mapped and readable.
    pub unsafe fn undone(&self) -> bool {
        self.restore.undone(&LinuxCode::with_protection(self.prot))
    }

    /// The bytes now over the first instruction of this patch's jump,
    /// where they are no longer the jump's and the rest of it is: a
    /// uprobe or a debugger's breakpoint there, or what a uprobe's removal
    /// put back (see [`RestorePoint::head_replaced`]). Calls run past the
    /// hook then, or into what is left of the jump.
    ///
    /// # Safety
    ///
    /// The entry's bytes are mapped and readable.
    pub unsafe fn head_replaced(&self) -> Option<PatchBytes> {
        // The breakpoint's size: x86's `int3`, arm64's `brk`.
        const HEAD: usize = if cfg!(target_arch = "x86_64") { 1 } else { 4 };
        self.restore.head_replaced(&LinuxCode::with_protection(self.prot), HEAD)
    }

    /// Where the patch starts (past an `endbr64` or a first instruction it
    /// keeps: [`Plan::kept`]), and the bytes
    /// it replaced there.
    pub fn replaced(&self) -> (usize, &[u8]) {
        (self.restore.at, &self.restore.original)
    }

    /// The patched function.
    pub fn target(&self) -> usize {
        self.target
    }

    /// The hook.
    pub fn hook(&self) -> usize {
        self.hook
    }

    /// Calls the original function (the trampoline).
    pub fn original(&self) -> usize {
        self.trampoline
    }

    /// Bytes of original instructions moved into the trampoline.
    pub fn taken(&self) -> usize {
        self.taken
    }

    /// Whether the entry uses the long (absolute) jump form.
    pub fn is_far(&self) -> bool {
        self.restore.patched.len() > NativeArch::NEAR_JUMP_LEN
    }
}

/// A slot near `at` that runs `undo` and jumps to `hook`, shared by every
/// entry near it with the same two: a far-jump slot where `undo` is empty
/// (the hook out of the entry jump's reach), else the way from an entry
/// whose first instruction stays ahead of the patch to its hook.
fn entry_slot(state: &mut State, at: usize, undo: &[u8], hook: usize) -> Option<usize> {
    if let Some(&(_, _, slot)) = state
        .slots
        .iter()
        .find(|(h, u, s)| *h == hook && u[..] == *undo && NativeArch::is_near(at, *s))
    {
        return Some(slot);
    }
    let slot = trampoline::alloc_near(at, NEAR_REACH)?;
    let from = slot + undo.len();
    let jump = if NativeArch::is_near(from, hook) {
        NativeArch::entry_jump(from, hook)
    } else {
        NativeArch::absolute_jump(hook)
    };
    let mut code = heapless::Vec::<u8, { 2 * memhook_core::patch::MAX_PATCH }>::new();
    code.extend_from_slice(undo).ok()?;
    code.extend_from_slice(&jump).ok()?;
    trampoline::write(slot, &code).ok()?;
    trampoline::trim(slot, code.len());
    if !state.slots.is_full() {
        let _ = state.slots.push((hook, PatchBytes::from_slice(undo).ok()?, slot));
    }
    Some(slot)
}

//! memhook-ffi: the C ABI of memhook (`libmemhook.so`, `libmemhook.a`).
//!
//! Every call returns 0 on success and a negative `MEMHOOK_ERR_*` code on
//! error, with [`memhook_last_error`] giving the message (per thread, valid
//! until the thread's next memhook call). No panic crosses the ABI: a panic
//! inside becomes `MEMHOOK_ERR_INTERNAL`. Nothing here allocates.
#![allow(unsafe_code)]
// The C ABI's names (SPEC.md's stable interfaces) are snake_case types.
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};
use core::fmt::Write;
use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};

pub use memhook::event::bits;

/// Success.
pub const MEMHOOK_OK: c_int = 0;
/// A null or otherwise invalid argument.
pub const MEMHOOK_ERR_INVALID: c_int = -1;
/// The function's first instructions cannot be relocated (the message says
/// which function, why, and shows its first bytes).
pub const MEMHOOK_ERR_RELOCATE: c_int = -2;
/// Code pages could not be written, or the entry changed since it was
/// patched (another hooker wrote over it).
pub const MEMHOOK_ERR_PATCH: c_int = -3;
/// The address is not in an executable mapping.
pub const MEMHOOK_ERR_NOT_CODE: c_int = -4;
/// Out of trampoline memory or handle slots.
pub const MEMHOOK_ERR_NO_SPACE: c_int = -5;
/// The capability is not built in (e.g. bistro without its feature).
pub const MEMHOOK_ERR_UNSUPPORTED: c_int = -6;
/// A bug in memhook (a caught panic).
pub const MEMHOOK_ERR_INTERNAL: c_int = -7;

/// Patches live at once through the C API.
pub const MEMHOOK_MAX_PATCHES: usize = 1024;

const MESSAGE: usize = 512;

/// The calling thread's last error message, NUL-terminated.
struct LastError {
    buf: [u8; MESSAGE],
    len: usize,
}

impl Write for LastError {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        // Keep room for the NUL; cut silently when full.
        let room = MESSAGE - 1 - self.len;
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = const { RefCell::new(LastError { buf: [0; MESSAGE], len: 0 }) };
}

/// Records `message` as this thread's last error and returns `code`.
fn fail(code: c_int, message: core::fmt::Arguments<'_>) -> c_int {
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            e.len = 0;
            let _ = e.write_fmt(message);
            let n = e.len;
            e.buf[n] = 0;
        }
    });
    code
}

/// Runs `f`, turning a panic into `MEMHOOK_ERR_INTERNAL`.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        fail(
            MEMHOOK_ERR_INTERNAL,
            format_args!("internal error (a panic was caught)"),
        )
    })
}

/// The calling thread's last error message ("" if none). The pointer stays
/// valid until the thread's next memhook call.
#[unsafe(no_mangle)]
pub extern "C" fn memhook_last_error() -> *const c_char {
    static EMPTY: [u8; 1] = [0];
    LAST_ERROR
        .try_with(|e| match e.try_borrow() {
            Ok(e) => e.buf.as_ptr().cast(),
            Err(_) => EMPTY.as_ptr().cast(),
        })
        .unwrap_or(EMPTY.as_ptr().cast())
}

/// A bad configuration string or environment variable.
pub const MEMHOOK_ERR_CONFIG: c_int = -8;
/// A handler could not be registered (table full, or called from inside a
/// handler, or no event named, or a bit that is neither an event nor a
/// flag of this version).
pub const MEMHOOK_ERR_HANDLER: c_int = -9;
/// No such entry (`memhook_status` or `memhook_namespace_status` past the
/// last one).
pub const MEMHOOK_ERR_NOT_FOUND: c_int = -10;
/// Called from a signal handler that interrupted memhook's own work on its
/// thread (an install or uninstall, a status, a patch, the hooking of a
/// library loaded late), which holds the lock the call needs until the
/// handler returns: nothing was done, where waiting would have waited for
/// good (`memhook_install`, `memhook_uninstall`, `memhook_set_event_handler`
/// where it would install, `memhook_status`, `memhook_namespace_status`,
/// `memhook_patch`, `memhook_unpatch`).
pub const MEMHOOK_ERR_BUSY: c_int = -11;

/// [`MEMHOOK_ERR_BUSY`]'s failure of `call`, where memhook's own work on
/// this thread was interrupted ([`memhook::inside_memhook`]).
pub(crate) fn busy(call: &str) -> Option<c_int> {
    memhook::inside_memhook().then(|| fail(MEMHOOK_ERR_BUSY, format_args!("{call}: {}", memhook::InsideMemhook)))
}

/// Memory types (`memhook_mem_info_t::mem_type`).
pub const MEMHOOK_MEM_TYPE_HOST: u32 = 0;
/// CUDA device memory.
pub const MEMHOOK_MEM_TYPE_CUDA: u32 = 1;
/// CUDA managed memory.
pub const MEMHOOK_MEM_TYPE_CUDA_MANAGED: u32 = 2;
/// Page-locked host memory (CUDA pinned).
pub const MEMHOOK_MEM_TYPE_CUDA_HOST: u32 = 3;
/// Not known: ask the driver (`memhook_memtype_classify`).
pub const MEMHOOK_MEM_TYPE_UNKNOWN: u32 = 15;

/// Event bits and flags (the stable values of SPEC.md).
pub const MEMHOOK_EVENT_MMAP: u32 = 1 << 0;
/// munmap.
pub const MEMHOOK_EVENT_MUNMAP: u32 = 1 << 1;
/// mremap.
pub const MEMHOOK_EVENT_MREMAP: u32 = 1 << 2;
/// shmat.
pub const MEMHOOK_EVENT_SHMAT: u32 = 1 << 3;
/// shmdt.
pub const MEMHOOK_EVENT_SHMDT: u32 = 1 << 4;
/// sbrk.
pub const MEMHOOK_EVENT_SBRK: u32 = 1 << 5;
/// madvise (discarding advices).
pub const MEMHOOK_EVENT_MADVISE: u32 = 1 << 6;
/// brk.
pub const MEMHOOK_EVENT_BRK: u32 = 1 << 7;
/// A range became mapped (a library dlopen loaded included).
pub const MEMHOOK_EVENT_VM_MAPPED: u32 = 1 << 16;
/// A range is about to be unmapped: by munmap, mremap (its source where
/// it may move it; of a shrink, the pages past the new end), shmdt, a shrinking brk or sbrk, a discarding madvise or
/// process_madvise (one event per range), a fallocate, ftruncate or
/// truncate that discards pages of a mapped file, or an open, openat or
/// shm_open with O_TRUNC, a creat, or a fopen or freopen with a "w" mode
/// that empties one (one per mapping), or a call
/// that
/// maps at a fixed address over it (mmap with MAP_FIXED, mremap with
/// MREMAP_FIXED at its destination, shmat with SHM_REMAP,
/// remap_file_pages), or userfaultfd's UFFDIO_MOVE (an ioctl) from its
/// source range; any of these made by libc's syscall (openat2 with
/// O_TRUNC too). One comes after: a library dlclose unloaded (the loader unmaps it out of any
/// hook's sight).
pub const MEMHOOK_EVENT_VM_UNMAPPED: u32 = 1 << 17;
/// A typed allocation succeeded.
pub const MEMHOOK_EVENT_MEM_TYPE_ALLOC: u32 = 1 << 20;
/// A typed allocation is about to be freed: by a free call, or by the
/// destruction of the CUDA context it was made in (cuCtxDestroy,
/// cuDevicePrimaryCtxReset; the last cuDevicePrimaryCtxRelease reports
/// just after the call, which alone shows it was the last), or by the
/// unload of the module it is a global of.
pub const MEMHOOK_EVENT_MEM_TYPE_FREE: u32 = 1 << 21;
/// Flag: register without installing hooks.
pub const MEMHOOK_EVENT_FLAG_NO_INSTALL: u32 = 1 << 24;
/// Flag: replay what exists already (`/proc/self/maps`): with VM_MAPPED,
/// every mapping; with MEM_TYPE_ALLOC, every mapping of an NVIDIA device
/// file, as memory of unknown type.
pub const MEMHOOK_EVENT_FLAG_EXISTING_ALLOC: u32 = 1 << 25;

/// `mmap(addr, length, prot, flags, fd, offset)`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_mmap_event_t {
    /// The mapping, or `MAP_FAILED` while not done.
    pub result: *mut c_void,
    /// Requested address.
    pub address: *mut c_void,
    /// Length.
    pub size: usize,
    /// `PROT_*`.
    pub prot: c_int,
    /// `MAP_*`.
    pub flags: c_int,
    /// File descriptor.
    pub fd: c_int,
    /// Offset.
    pub offset: i64,
}

/// `munmap(addr, length)`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_munmap_event_t {
    /// 0, or -1 while not done.
    pub result: c_int,
    /// Start.
    pub address: *mut c_void,
    /// Length.
    pub size: usize,
}

/// `mremap(old_address, old_size, new_size, flags, new_address)`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_mremap_event_t {
    /// New address, or `MAP_FAILED` while not done.
    pub result: *mut c_void,
    /// Old address.
    pub address: *mut c_void,
    /// Old size.
    pub old_size: usize,
    /// New size.
    pub new_size: usize,
    /// `MREMAP_*`.
    pub flags: c_int,
    /// Requested new address.
    pub new_address: *mut c_void,
}

/// `shmat(shmid, shmaddr, shmflg)`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_shmat_event_t {
    /// Attached address, or `(void *)-1` while not done.
    pub result: *mut c_void,
    /// Segment.
    pub shmid: c_int,
    /// Requested address.
    pub shmaddr: *const c_void,
    /// `SHM_*`.
    pub shmflg: c_int,
}

/// `shmdt(shmaddr)`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_shmdt_event_t {
    /// 0, or -1 while not done.
    pub result: c_int,
    /// Attached address.
    pub shmaddr: *const c_void,
}

/// `sbrk(increment)`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_sbrk_event_t {
    /// Previous break, or `(void *)-1` while not done.
    pub result: *mut c_void,
    /// Increment.
    pub increment: isize,
}

/// `brk(addr)`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_brk_event_t {
    /// 0, or -1 while not done.
    pub result: c_int,
    /// Requested break.
    pub addr: *mut c_void,
}

/// `madvise(addr, length, advice)`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_madvise_event_t {
    /// 0, or -1 while not done.
    pub result: c_int,
    /// Start.
    pub addr: *mut c_void,
    /// Length.
    pub length: usize,
    /// `MADV_*`.
    pub advice: c_int,
}

/// `VM_MAPPED` / `VM_UNMAPPED`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_vm_event_t {
    /// Start.
    pub address: *mut c_void,
    /// Length.
    pub size: usize,
}

/// `MEM_TYPE_ALLOC` / `MEM_TYPE_FREE`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_mem_type_event_t {
    /// Start.
    pub address: *mut c_void,
    /// Length (0 when unknown).
    pub size: usize,
    /// `MEMHOOK_MEM_TYPE_*`.
    pub mem_type: u32,
}

/// One event; the member is chosen by the event type.
#[repr(C)]
#[derive(Clone, Copy)]
pub union memhook_event_t {
    /// `MEMHOOK_EVENT_MMAP`.
    pub mmap: memhook_mmap_event_t,
    /// `MEMHOOK_EVENT_MUNMAP`.
    pub munmap: memhook_munmap_event_t,
    /// `MEMHOOK_EVENT_MREMAP`.
    pub mremap: memhook_mremap_event_t,
    /// `MEMHOOK_EVENT_SHMAT`.
    pub shmat: memhook_shmat_event_t,
    /// `MEMHOOK_EVENT_SHMDT`.
    pub shmdt: memhook_shmdt_event_t,
    /// `MEMHOOK_EVENT_SBRK`.
    pub sbrk: memhook_sbrk_event_t,
    /// `MEMHOOK_EVENT_BRK`.
    pub brk: memhook_brk_event_t,
    /// `MEMHOOK_EVENT_MADVISE`.
    pub madvise: memhook_madvise_event_t,
    /// `MEMHOOK_EVENT_VM_MAPPED` and `MEMHOOK_EVENT_VM_UNMAPPED`.
    pub vm: memhook_vm_event_t,
    /// `MEMHOOK_EVENT_MEM_TYPE_ALLOC` and `MEMHOOK_EVENT_MEM_TYPE_FREE`.
    pub mem_type: memhook_mem_type_event_t,
}

/// What `memhook_memtype_lookup` answers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_mem_info_t {
    /// `MEMHOOK_MEM_TYPE_*`.
    pub mem_type: u32,
    /// Device ordinal, -1 for none.
    pub device: i32,
    /// Start of the allocation.
    pub base: *mut c_void,
    /// Its length.
    pub len: usize,
}

/// An event handler: called with the event's type, the event, and the
/// `arg` given at registration. `event` is memhook's own event, lent for
/// the call (do not keep the pointer): its member for `event_type` is set,
/// and what the handler writes there is the event's from then on (a
/// pre-handler's result, under SPEC.md's result rules). No other member
/// is set.
pub type memhook_event_cb =
    Option<unsafe extern "C" fn(event_type: u32, event: *mut memhook_event_t, arg: *mut c_void)>;

mod events;
mod preload;
mod report;

/// A bistro patch made by [`memhook_patch`] (opaque to C).
pub struct memhook_patch_t {
    _opaque: [u8; 0],
}

#[cfg(feature = "bistro")]
mod patching {
    use super::*;
    use core::sync::atomic::AtomicUsize;
    use memhook::bistro::{BistroError, Hook};

    // (A fork waits for its holder: a child never finds it held.)
    static PATCHES: memhook::fork::Mutex<[Option<Hook>; MEMHOOK_MAX_PATCHES]> =
        memhook::fork::Mutex::new([const { None }; MEMHOOK_MAX_PATCHES]);

    fn code_of(e: &BistroError) -> c_int {
        match e {
            BistroError::Reloc { .. } => MEMHOOK_ERR_RELOCATE,
            // (Overlaps: only a batch of several, which the C API never makes.)
            BistroError::Patch { .. } | BistroError::Overlaps { .. } => MEMHOOK_ERR_PATCH,
            BistroError::NotCode { .. } => MEMHOOK_ERR_NOT_CODE,
            BistroError::NoTrampoline { .. } => MEMHOOK_ERR_NO_SPACE,
            BistroError::NoSymbol | BistroError::HookInPatch { .. } => MEMHOOK_ERR_INVALID,
        }
    }

    pub fn patch(
        target: *mut c_void,
        hook: *mut c_void,
        original: *mut *mut c_void,
        handle: *mut *mut memhook_patch_t,
    ) -> c_int {
        if target.is_null() || hook.is_null() || original.is_null() || handle.is_null() {
            return fail(
                MEMHOOK_ERR_INVALID,
                format_args!("memhook_patch: target, hook, original and handle must not be NULL"),
            );
        }
        if let Some(code) = crate::busy("memhook_patch") {
            return code;
        }
        let mut patches = PATCHES.lock();
        let Some(slot) = patches.iter().position(Option::is_none) else {
            return fail(
                MEMHOOK_ERR_NO_SPACE,
                format_args!("memhook_patch: {MEMHOOK_MAX_PATCHES} patches are live already"),
            );
        };
        // SAFETY: `original` is a non-null, aligned `void **` the caller
        // owns; a pointer-sized atomic has the same layout.
        let original = unsafe { AtomicUsize::from_ptr(original.cast()) };
        // SAFETY: the caller promises (memhook.h) that target is a function
        // entry and hook a function of the same signature that calls the
        // original only through *original.
        match unsafe { Hook::patch_with(target as usize, hook as usize, original) } {
            Ok(h) => {
                patches[slot] = Some(h);
                // SAFETY: `handle` is non-null and the caller's to write.
                unsafe { *handle = (slot + 1) as *mut memhook_patch_t };
                MEMHOOK_OK
            }
            Err(e) => fail(code_of(&e), format_args!("{e}")),
        }
    }

    pub fn unpatch(handle: *mut memhook_patch_t) -> c_int {
        if let Some(code) = crate::busy("memhook_unpatch") {
            return code;
        }
        let slot = (handle as usize).wrapping_sub(1);
        let mut patches = PATCHES.lock();
        let Some(h) = patches.get_mut(slot).and_then(Option::take) else {
            return fail(
                MEMHOOK_ERR_INVALID,
                format_args!("memhook_unpatch: {handle:p} is not a live patch handle"),
            );
        };
        match h.unpatch() {
            Ok(()) => MEMHOOK_OK,
            Err((h, e)) => {
                patches[slot] = Some(h);
                fail(code_of(&e), format_args!("{e}"))
            }
        }
    }
}

/// Patches the function at `target` so that every call jumps to `hook`
/// (bistro). `*original` is set, before the patch is visible, to an address
/// that calls the original function; `*handle` identifies the patch for
/// [`memhook_unpatch`]. A `hook` inside the bytes the patch would
/// overwrite (`target` itself, by mistake) is refused with
/// `MEMHOOK_ERR_INVALID`: every call would jump into the jump. From a
/// signal handler that interrupted memhook's own work on its thread (a
/// patch among it), `MEMHOOK_ERR_BUSY`.
///
/// # Safety
///
/// `target` must be a function entry, `hook` a function with the same
/// signature and calling convention, and `original`/`handle` valid for a
/// write. The hook must call the original only through `*original`. It
/// gets every argument the function reads as the caller passed it; where
/// the function's first instruction runs before it (kept at the entry,
/// so that a uprobe there leaves the hook whole), a parameter the
/// function never reads, whose register that instruction overwrites, may
/// hold something else.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_patch(
    target: *mut c_void,
    hook: *mut c_void,
    original: *mut *mut c_void,
    handle: *mut *mut memhook_patch_t,
) -> c_int {
    #[cfg(feature = "bistro")]
    return guard(|| patching::patch(target, hook, original, handle));
    #[cfg(not(feature = "bistro"))]
    {
        let _ = (target, hook, original, handle);
        guard(|| {
            fail(
                MEMHOOK_ERR_UNSUPPORTED,
                format_args!("memhook_patch: memhook was built without the `bistro` feature"),
            )
        })
    }
}

/// Undoes a patch, restoring the function's bytes exactly. Fails (and keeps
/// the handle live) if another hooker patched over it since: undo that one
/// first. `MEMHOOK_ERR_BUSY` as for [`memhook_patch`].
///
/// # Safety
///
/// `handle` must come from [`memhook_patch`] (anything else is reported as
/// invalid, but must not be a pointer the caller still relies on as live).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_unpatch(handle: *mut memhook_patch_t) -> c_int {
    #[cfg(feature = "bistro")]
    return guard(|| patching::unpatch(handle));
    #[cfg(not(feature = "bistro"))]
    {
        let _ = handle;
        guard(|| {
            fail(
                MEMHOOK_ERR_UNSUPPORTED,
                format_args!("memhook_unpatch: memhook was built without the `bistro` feature"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::ffi::CStr;

    fn last() -> String {
        // SAFETY: memhook_last_error returns a NUL-terminated buffer.
        unsafe { CStr::from_ptr(memhook_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn null_arguments_are_invalid_with_a_message() {
        let mut h = core::ptr::null_mut();
        // SAFETY: NULLs are rejected before use.
        let rc = unsafe {
            memhook_patch(
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                &mut h,
            )
        };
        if cfg!(feature = "bistro") {
            assert_eq!(rc, MEMHOOK_ERR_INVALID);
            assert!(last().contains("must not be NULL"), "{}", last());
            // SAFETY: an invalid handle is reported, not used.
            let rc = unsafe { memhook_unpatch(0x999 as *mut memhook_patch_t) };
            assert_eq!(rc, MEMHOOK_ERR_INVALID);
            assert!(last().contains("not a live patch handle"));
        } else {
            assert_eq!(rc, MEMHOOK_ERR_UNSUPPORTED);
        }
    }

    #[test]
    fn c_values_are_the_cores() {
        let pairs = [
            (MEMHOOK_EVENT_MMAP, bits::MMAP),
            (MEMHOOK_EVENT_MUNMAP, bits::MUNMAP),
            (MEMHOOK_EVENT_MREMAP, bits::MREMAP),
            (MEMHOOK_EVENT_SHMAT, bits::SHMAT),
            (MEMHOOK_EVENT_SHMDT, bits::SHMDT),
            (MEMHOOK_EVENT_SBRK, bits::SBRK),
            (MEMHOOK_EVENT_MADVISE, bits::MADVISE),
            (MEMHOOK_EVENT_BRK, bits::BRK),
            (MEMHOOK_EVENT_VM_MAPPED, bits::VM_MAPPED),
            (MEMHOOK_EVENT_VM_UNMAPPED, bits::VM_UNMAPPED),
            (MEMHOOK_EVENT_MEM_TYPE_ALLOC, bits::MEM_TYPE_ALLOC),
            (MEMHOOK_EVENT_MEM_TYPE_FREE, bits::MEM_TYPE_FREE),
            (MEMHOOK_EVENT_FLAG_NO_INSTALL, bits::NO_INSTALL),
            (MEMHOOK_EVENT_FLAG_EXISTING_ALLOC, bits::EXISTING_ALLOC),
        ];
        for (c, core) in pairs {
            assert_eq!(c, core);
        }
        use memhook::memtype::MemType;
        assert_eq!(MEMHOOK_MEM_TYPE_HOST, MemType::Host as u32);
        assert_eq!(MEMHOOK_MEM_TYPE_CUDA, MemType::Cuda as u32);
        assert_eq!(MEMHOOK_MEM_TYPE_CUDA_MANAGED, MemType::CudaManaged as u32);
        assert_eq!(MEMHOOK_MEM_TYPE_CUDA_HOST, MemType::CudaHost as u32);
        assert_eq!(MEMHOOK_MEM_TYPE_UNKNOWN, MemType::Unknown as u32);
    }

    #[test]
    fn long_messages_are_cut_and_terminated() {
        fail(-1, format_args!("{}", "x".repeat(2000)));
        assert_eq!(last().len(), MESSAGE - 1);
        fail(-1, format_args!("short"));
        assert_eq!(last(), "short");
    }

    #[test]
    fn panics_do_not_cross_the_abi() {
        let rc = guard(|| panic!("boom"));
        assert_eq!(rc, MEMHOOK_ERR_INTERNAL);
        assert!(last().contains("panic"));
    }
}

//! Host memory events: hooks for mmap, munmap, mremap, shmat, shmdt, brk,
//! sbrk and madvise, each emitting its own event and the aggregate
//! `VM_MAPPED` (after the mapping exists) / `VM_UNMAPPED` (before it goes),
//! and for process_madvise, whose discarding advices on the caller's own
//! memory (Linux 6.13) are a `VM_UNMAPPED` per range (it has no event of
//! its own in the C ABI); and for fallocate, ftruncate and truncate,
//! and open, openat and shm_open with `O_TRUNC`, which take pages away from every
//! mapping of a file (a punched hole, a shrunk end, an emptied file) with
//! no call on the mappings: `VM_UNMAPPED` of each
//! mapped range of the file they discard, before the call (no event of
//! their own either), and again after it where a mapping of a file was
//! made or moved meanwhile (`FILE_MAPPINGS`); and so for `madvise`'s
//! `MADV_REMOVE`, which punches the same hole through the range's own
//! mappings. `remap_file_pages` puts other pages of a file in a range of
//! a shared mapping of it: `VM_UNMAPPED` of the range before the call,
//! `VM_MAPPED` after it (no event of its own). userfaultfd's `UFFDIO_MOVE`
//! (an `ioctl`) takes a range's pages to another: `VM_UNMAPPED` of the
//! source range before the call (`ioctl_hook`). What the dynamic loader
//! maps and unmaps for
//! `dlopen` and `dlclose` (through its own copies of mmap and munmap) is
//! reported after those calls (`loader_changed`). A library opened with
//! `dlmopen` in a namespace of its own calls that namespace's copy of
//! libc: in bistro mode its functions are patched too, with these hooks
//! compiled for the namespace (`functions_in`; see `crate::namespace`).
//!
//! Every hook calls the function's original (the bistro trampoline or the
//! pointer reloc found), never a raw system call: so glibc's own state (the
//! current break of brk/sbrk) stays right, and a hooker that patched the
//! function before memhook still sees every call. `errno` as the original
//! left it is what the caller sees, whatever the handlers did. When no
//! handler wants any of a hook's events, the hook is the original's load,
//! two loads from one cache line, a test and a jump to the original: the
//! events are built in a function of their own (each hook's `dispatched`), which
//! alone sets up a stack frame.
//!
//! A call that puts a mapping at a fixed address replaces whatever lay
//! there: `mmap` with `MAP_FIXED`, `mremap` with `MREMAP_FIXED` (at its
//! destination) and `shmat` with `SHM_REMAP`. The kernel unmaps the old
//! mapping first, with no `munmap` call to see, and a registration cache
//! that kept it would go on using pages that are gone: these hooks report
//! `VM_UNMAPPED` of the range they replace before the call (as UCM does
//! for `MAP_FIXED`), whether or not anything was mapped there.
//!
//! The kernel maps, unmaps and discards whole pages: `munmap(p, 100)`
//! unmaps all of p's page. `VM_MAPPED` and `VM_UNMAPPED` carry the range
//! as the kernel acts on it, the end rounded up to a page boundary (UCM
//! passes the call's length, and a cache that registered the rest of the
//! page would keep a registration of memory that is gone); the call's
//! own event (`MUNMAP`, `MADVISE`, ...) carries its arguments as given.

use core::cell::Cell;
use core::ffi::{c_int, c_long, c_void};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use memhook_core::event::{
    BrkEvent, Event, INVALID_PTR, MadviseEvent, MmapEvent, MremapEvent, MunmapEvent, SbrkEvent, ShmatEvent, ShmdtEvent,
    VmEvent, bits,
};

use crate::dispatch::{OwnCall, begin, finish, notify, wants};
use crate::maps::{keeping_errno, page_size};

/// The address that runs `function`'s original (`"mmap"`, `"munmap"`,
/// `"mremap"`, `"shmat"`, `"shmdt"`, `"brk"`, `"sbrk"`, `"madvise"`,
/// `"process_madvise"`, `"fallocate"`, `"ftruncate"`, `"truncate"`,
/// `"remap_file_pages"`, `"open"`, `"openat"`, `"shm_open"`,
/// `"syscall"`, `"creat"` or `"ioctl"`), past
/// memhook's hook: with bistro, its trampoline (the relocated first
/// instructions, then a jump into the function); with reloc, the
/// definition it found. `None` for another name, or before memhook hooked
/// the function.
///
/// For code that must map memory unreported (an allocator's own
/// bookkeeping, as UCM's `ucm_orig_mmap`), and for measuring the hooks'
/// cost against the same function in the same process. Call it with the
/// function's own signature (glibc's). The address stays valid for the
/// process's life (a trampoline is never unmapped, uninstall included).
pub fn original(function: &str) -> Option<usize> {
    functions()
        .into_iter()
        .find(|(name, _, _)| name.to_bytes() == function.as_bytes())
        .map(|(_, _, orig)| orig.load(Ordering::Acquire))
        .filter(|&p| p != 0)
}

/// The functions hooked, in install order, with their hooks: the C
/// library of the main namespace.
pub(crate) fn functions() -> [(&'static core::ffi::CStr, usize, &'static AtomicUsize); FUNCTIONS] {
    functions_in::<0>()
}

/// A hooked function: its name, memhook's hook for it, and where the hook
/// finds the original.
pub(crate) type Hooked = (&'static core::ffi::CStr, usize, &'static AtomicUsize);

/// The functions hooked in the C library of loader namespace `NS` (0 is
/// the main one; see `crate::namespace`): each namespace's copy of libc
/// has its own functions, so its hooks call its own originals, and each
/// hook is compiled once per namespace (a constant index into the
/// originals: the main namespace's hooks are what they would be alone).
pub(crate) fn functions_in<const NS: usize>() -> [Hooked; FUNCTIONS] {
    [
        (c"mmap", mmap_hook::<NS> as *const () as usize, &ORIG_MMAP[NS]),
        (c"munmap", munmap_hook::<NS> as *const () as usize, &ORIG_MUNMAP[NS]),
        (c"mremap", mremap_hook::<NS> as *const () as usize, &ORIG_MREMAP[NS]),
        (c"shmat", shmat_hook::<NS> as *const () as usize, &ORIG_SHMAT[NS]),
        (c"shmdt", shmdt_hook::<NS> as *const () as usize, &ORIG_SHMDT[NS]),
        (c"brk", brk_hook::<NS> as *const () as usize, &ORIG_BRK[NS]),
        (c"sbrk", sbrk_hook::<NS> as *const () as usize, &ORIG_SBRK[NS]),
        (c"madvise", madvise_hook::<NS> as *const () as usize, &ORIG_MADVISE[NS]),
        (
            c"process_madvise",
            process_madvise_hook::<NS> as *const () as usize,
            &ORIG_PROCESS_MADVISE[NS],
        ),
        (
            c"fallocate",
            fallocate_hook::<NS> as *const () as usize,
            &ORIG_FALLOCATE[NS],
        ),
        (
            c"ftruncate",
            ftruncate_hook::<NS> as *const () as usize,
            &ORIG_FTRUNCATE[NS],
        ),
        (
            c"truncate",
            truncate_hook::<NS> as *const () as usize,
            &ORIG_TRUNCATE[NS],
        ),
        (
            c"remap_file_pages",
            remap_file_pages_hook::<NS> as *const () as usize,
            &ORIG_REMAP_FILE_PAGES[NS],
        ),
        (c"open", open_hook::<NS> as *const () as usize, &ORIG_OPEN[NS]),
        (c"openat", openat_hook::<NS> as *const () as usize, &ORIG_OPENAT[NS]),
        (
            c"shm_open",
            shm_open_hook::<NS> as *const () as usize,
            &ORIG_SHM_OPEN[NS],
        ),
        (c"syscall", syscall_hook::<NS> as *const () as usize, &ORIG_SYSCALL[NS]),
        (c"creat", creat_hook::<NS> as *const () as usize, &ORIG_CREAT[NS]),
        (c"ioctl", ioctl_hook::<NS> as *const () as usize, &ORIG_IOCTL[NS]),
    ]
}

/// Loader namespaces whose C library memhook can hook: glibc's limit
/// (`DL_NNS`), the main namespace included.
pub(crate) const NAMESPACES: usize = 16;

/// Each function's hooks and originals: one per namespace for bistro's
/// patches of the namespace's libc (0 to 15, the main namespace's shared
/// with reloc), and one per other namespace for reloc's slots in its
/// objects (16 + the namespace): the two modes never write each other's
/// originals (a reloc scan and a bistro install may overlap).
pub(crate) const HOOK_SLOTS: usize = 2 * NAMESPACES;

/// One function's originals, one per hook slot ([`HOOK_SLOTS`]).
pub(crate) type Originals = [AtomicUsize; HOOK_SLOTS];

/// Hook slot `ns`'s index into [`Originals`] (`ns` is one of them: the
/// mask keeps a bounds check, and its panic, off the hooks' paths).
#[inline(always)]
const fn slot(ns: usize) -> usize {
    ns & (HOOK_SLOTS - 1)
}

const _: () = assert!(HOOK_SLOTS.is_power_of_two());

/// How many host functions memhook hooks.
pub(crate) const FUNCTIONS: usize = 19;

/// glibc's other names of hooked functions (the same functions on the
/// 64-bit targets memhook runs on), each with the function's own name.
pub(crate) const ALIAS_OF: [(&core::ffi::CStr, &core::ffi::CStr); ALIASES] = [
    (c"mmap64", c"mmap"),
    (c"fallocate64", c"fallocate"),
    (c"ftruncate64", c"ftruncate"),
    (c"truncate64", c"truncate"),
    (c"open64", c"open"),
    (c"openat64", c"openat"),
    (c"creat64", c"creat"),
];

/// The aliases of [`ALIAS_OF`] with their functions' hooks: reloc rewrites
/// the slots that name them too (recording each in its own original);
/// bistro's patch of the function covers them.
pub(crate) fn aliases() -> [Hooked; ALIASES] {
    let records = [
        &ORIG_MMAP64,
        &ORIG_FALLOCATE64,
        &ORIG_FTRUNCATE64,
        &ORIG_TRUNCATE64,
        &ORIG_OPEN64,
        &ORIG_OPENAT64,
        &ORIG_CREAT64,
    ];
    let hooks = functions();
    core::array::from_fn(|i| {
        let (alias, main) = ALIAS_OF[i];
        let hook = hooks
            .iter()
            .find(|(name, _, _)| *name == main)
            .map_or(0, |&(_, hook, _)| hook);
        (alias, hook, records[i])
    })
}

/// How many aliases [`aliases`] names.
pub(crate) const ALIASES: usize = 7;

pub(crate) static ORIG_MMAP: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_MUNMAP: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_MREMAP: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_SHMAT: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_SHMDT: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_BRK: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_SBRK: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_MADVISE: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_PROCESS_MADVISE: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_FALLOCATE: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_FTRUNCATE: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_TRUNCATE: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_REMAP_FILE_PAGES: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_OPEN: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_OPENAT: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_SHM_OPEN: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_SYSCALL: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_CREAT: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
pub(crate) static ORIG_IOCTL: Originals = [const { AtomicUsize::new(0) }; HOOK_SLOTS];
/// Reloc's records of the aliases (the same functions in glibc): the
/// hooks call the main name's original, which each install sets.
pub(crate) static ORIG_MMAP64: AtomicUsize = AtomicUsize::new(0);
pub(crate) static ORIG_FALLOCATE64: AtomicUsize = AtomicUsize::new(0);
pub(crate) static ORIG_FTRUNCATE64: AtomicUsize = AtomicUsize::new(0);
pub(crate) static ORIG_TRUNCATE64: AtomicUsize = AtomicUsize::new(0);
pub(crate) static ORIG_OPEN64: AtomicUsize = AtomicUsize::new(0);
pub(crate) static ORIG_OPENAT64: AtomicUsize = AtomicUsize::new(0);
pub(crate) static ORIG_CREAT64: AtomicUsize = AtomicUsize::new(0);

type MmapFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void;
type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> c_int;
type MremapFn = unsafe extern "C" fn(*mut c_void, usize, usize, c_int, ...) -> *mut c_void;
type ShmatFn = unsafe extern "C" fn(c_int, *const c_void, c_int) -> *mut c_void;
type ShmdtFn = unsafe extern "C" fn(*const c_void) -> c_int;
type BrkFn = unsafe extern "C" fn(*mut c_void) -> c_int;
type SbrkFn = unsafe extern "C" fn(libc::intptr_t) -> *mut c_void;
type MadviseFn = unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int;
type ProcessMadviseFn = unsafe extern "C" fn(c_int, *const libc::iovec, usize, c_int, libc::c_uint) -> isize;
type FallocateFn = unsafe extern "C" fn(c_int, c_int, libc::off_t, libc::off_t) -> c_int;
type FtruncateFn = unsafe extern "C" fn(c_int, libc::off_t) -> c_int;
type TruncateFn = unsafe extern "C" fn(*const core::ffi::c_char, libc::off_t) -> c_int;
type RemapFilePagesFn = unsafe extern "C" fn(*mut c_void, usize, c_int, usize, c_int) -> c_int;
type OpenFn = unsafe extern "C" fn(*const core::ffi::c_char, c_int, libc::mode_t) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const core::ffi::c_char, c_int, libc::mode_t) -> c_int;
type ShmOpenFn = unsafe extern "C" fn(*const core::ffi::c_char, c_int, libc::mode_t) -> c_int;
type CreatFn = unsafe extern "C" fn(*const core::ffi::c_char, libc::mode_t) -> c_int;
type SyscallFn = unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;
type IoctlFn = unsafe extern "C" fn(c_int, libc::c_ulong, ...) -> c_int;

/// Loads an original. The hooks are only reachable once it is set (install
/// stores it before any patch points to the hook).
macro_rules! original {
    ($orig:expr, $ty:ty) => {{
        let p = $orig.load(Ordering::Acquire);
        // SAFETY: the original has the function's signature; it was stored
        // before the hook became reachable.
        unsafe { core::mem::transmute::<usize, $ty>(p) }
    }};
}

/// A hook's entry: when no handler wants any of `$events`, a tail call of
/// the original, with no frame of its own (a load of the original, the
/// dispatcher's two masks from one line, a test and a jump); else a tail
/// call of `$dispatched`, which builds the events and owns the frame. So
/// a process whose handlers want none of these events pays for the hook
/// no stack traffic.
macro_rules! entry {
    ($(#[$doc:meta])* $hook:ident => $body:ident, $orig:ident as $ty:ty, $events:expr, ($($a:ident: $t:ty),*) -> $r:ty) => {
        entry! { @hook [] $(#[$doc])* $hook => $body, $orig as $ty, $events, ($($a: $t),*) -> $r }
    };
    // `through`: a function that makes the call, given the original and
    // the arguments (`madvise`'s, around memhook's own pages:
    // `crate::kept`).
    ($(#[$doc:meta])* $hook:ident => $body:ident, $orig:ident as $ty:ty, through $via:path, $events:expr, ($($a:ident: $t:ty),*) -> $r:ty) => {
        entry! { @hook [$via] $(#[$doc])* $hook => $body, $orig as $ty, $events, ($($a: $t),*) -> $r }
    };
    // The call of the original `$f`: itself, or through `$via`.
    (@call [], $f:ident, $($a:ident),*) => { $f($($a),*) };
    (@call [$via:path], $f:ident, $($a:ident),*) => { $via($f, $($a),*) };
    (@hook [$($via:path)?] $(#[$doc:meta])* $hook:ident => $body:ident, $orig:ident as $ty:ty, $events:expr, ($($a:ident: $t:ty),*) -> $r:ty) => {
        $(#[$doc])*
        pub(crate) unsafe extern "C" fn $hook<const NS: usize>($($a: $t),*) -> $r {
            /// The hook when a handler wants its events, for the main
            /// namespace's libc: the events are built here, in a frame of
            /// its own. (An item inside a generic function is not
            /// generic: one copy.)
            #[inline(never)]
            unsafe extern "C" fn dispatched($($a: $t),*) -> $r {
                let orig = original!($orig[0], $ty);
                // SAFETY: the original, which the body calls with the
                // caller's arguments (or, for a second try, arguments of
                // the same call derived from them).
                let call = move |$($a: $t),*| unsafe { entry!(@call [$($via)?], orig, $($a),*) };
                // SAFETY: forwarded.
                unsafe { $body(0, call, $($a),*) }
            }
            /// The same for another namespace's libc (`ns`, 1 to 15): one
            /// copy for them all, the namespace an argument.
            #[inline(never)]
            unsafe extern "C" fn dispatched_ns(ns: usize, $($a: $t),*) -> $r {
                let orig = original!($orig[slot(ns)], $ty);
                // SAFETY: as above.
                let call = move |$($a: $t),*| unsafe { entry!(@call [$($via)?], orig, $($a),*) };
                // SAFETY: forwarded.
                unsafe { $body(ns, call, $($a),*) }
            }
            if !wants($events) {
                let orig = original!($orig[NS], $ty);
                // SAFETY: the caller's arguments, forwarded to the original.
                return unsafe { entry!(@call [$($via)?], orig, $($a),*) };
            }
            if NS == 0 {
                // SAFETY: the same arguments, for the same call.
                unsafe { dispatched($($a),*) }
            } else {
                // SAFETY: as above.
                unsafe { dispatched_ns(NS, $($a),*) }
            }
        }
    };
}

/// Dispatches a hooked call: `original` makes the call and sets the
/// event's result; the errno it left is what the caller sees, whatever the
/// handlers after it did. The original is called here, in the hook's own
/// frame, between the dispatcher's two halves, marked as making `own`
/// (the call as the caller made it, from the hook's own arguments: a
/// pre-handler that changes the event changes neither, and the hook
/// names it with no look at the event's kind).
#[inline(always)]
fn call_original(
    own: OwnCall,
    mut before: Option<Event>,
    event: &mut Event,
    original: impl FnOnce(&mut Event),
    after: impl FnOnce(&Event) -> Option<Event>,
) {
    let Some(begun) = begin(before.as_mut(), event) else {
        original(event); // thread-local gone (thread exit): just the call
        return;
    };
    let called = begun.call_original();
    let errno = begun.errno();
    let mut saved = 0;
    if called {
        // What the handlers before the call (a `VM_UNMAPPED`, a
        // pre-handler) left in errno is not the caller's: a call that
        // succeeds leaves errno as it finds it.
        // SAFETY: this thread's errno.
        unsafe { *errno = begun.caller_errno() };
        begun.run_original(own, || original(event));
        // SAFETY: this thread's errno.
        saved = unsafe { *errno };
    }
    let mut follow = after(event);
    finish(begun, event, follow.as_mut());
    if called {
        // SAFETY: as above.
        unsafe { *errno = saved };
    }
}

/// `size` bytes from `address` with the end rounded up to a page
/// boundary: what a call that works in whole pages (mmap, munmap,
/// mremap, madvise, shmat) maps or unmaps. `munmap(p, 100)` unmaps all of
/// p's page, and a cache that kept a registration in the rest of it must
/// hear so. `size` as it is where the kernel refuses the call anyway: an
/// address not on a page boundary, an end past the top of the address
/// space.
#[inline(always)]
fn whole_pages(address: usize, size: usize) -> usize {
    whole_pages_of(address, size, page_size())
}

/// [`whole_pages`] in pages of `page` bytes (a hugetlb mapping's), a
/// power of two: rounded with a mask (a division by a page size not
/// known at compile time would cost the mmap hook's path tens of
/// cycles).
#[inline(always)]
fn whole_pages_of(address: usize, size: usize, page: usize) -> usize {
    pages_taken(address, size, page).unwrap_or(size)
}

/// [`whole_pages_of`], or `None` where the kernel refuses the call before
/// it looks at the mappings: an address not on a boundary of `page`, an
/// end past the top of the address space (`EINVAL`).
#[inline(always)]
fn pages_taken(address: usize, size: usize, page: usize) -> Option<usize> {
    let mask = page - 1;
    if address & mask != 0 {
        return None;
    }
    address
        .checked_add(size)
        .and_then(|end| end.checked_add(mask))
        .map(|end| (end & !mask) - address)
}

/// `VM_UNMAPPED` for what a call that works in whole pages unmaps or
/// discards at `address` for `size` bytes ([`whole_pages`]), if it is not
/// empty; nothing for a call the kernel refuses before it looks at the
/// mappings (`munmap` of an address not on a page boundary, or of a range
/// past the top of the address space: `EINVAL`, and nothing unmapped).
fn unmapped(address: usize, size: usize) -> Option<Event> {
    unmapped_bytes(address, pages_taken(address, size, page_size())?)
}

/// `VM_MAPPED` for what a call that works in whole pages of `page` bytes
/// (the base page's, or a hugetlb mapping's huge page) maps at `address`
/// for `size` bytes ([`whole_pages`]), if it is not empty.
fn mapped_in(address: usize, size: usize, page: usize) -> Option<Event> {
    mapped_bytes(address, whole_pages_of(address, size, page))
}

/// [`unmapped`] for a mapping of `page`-byte pages.
fn unmapped_in(address: usize, size: usize, page: usize) -> Option<Event> {
    unmapped_bytes(address, whole_pages_of(address, size, page))
}

/// The page size of the mapping at `address` that `mremap` moves or
/// resizes, or whose pages `shmat` maps: a huge page size where it is a
/// hugetlb mapping (the kernel rounds the sizes up to it), the base page
/// otherwise. Asked only of an address a huge page can start at, in a
/// process that may have a hugetlb mapping (see `crate::hugetlb`).
#[inline(always)]
fn page_at(address: usize) -> usize {
    if crate::hugetlb::may_start_huge_page(address) {
        crate::hugetlb::page_at(address)
    } else {
        page_size()
    }
}

/// `VM_MAPPED` for exactly `[address, address + size)`, if it is not empty
/// (the bytes the break moved over, or a range already in pages).
fn mapped_bytes(address: usize, size: usize) -> Option<Event> {
    (size != 0).then_some(Event::VmMapped(VmEvent { address, size }))
}

/// `VM_UNMAPPED` for exactly `[address, address + size)`, if it is not
/// empty (the bytes the break moved over, or a range already in pages).
fn unmapped_bytes(address: usize, size: usize) -> Option<Event> {
    (size != 0).then_some(Event::VmUnmapped(VmEvent { address, size }))
}

/// The result field of an event of variant `$v` (the hook knows which it
/// made: one compare), or `$invalid` if a handler replaced the event with
/// another kind (whose result is not this call's).
macro_rules! result_of {
    ($ev:expr, $v:ident, $invalid:expr) => {
        match &$ev {
            Event::$v(m) => m.result,
            _ => $invalid,
        }
    };
}

/// A pointer result, if the call succeeded.
fn succeeded(result: usize) -> Option<usize> {
    (result != INVALID_PTR).then_some(result)
}

/// `bits::VM_UNMAPPED` if `mmap` with `flags` replaces what lies at its
/// address (`MAP_FIXED`, unless `MAP_FIXED_NOREPLACE`, which fails
/// instead), else 0.
#[inline(always)]
fn mmap_replaces(flags: c_int) -> u32 {
    if flags & libc::MAP_FIXED != 0 && flags & libc::MAP_FIXED_NOREPLACE == 0 {
        bits::VM_UNMAPPED
    } else {
        0
    }
}

/// Whether `mmap` with `flags` and `fd` maps a file (or a device).
#[inline(always)]
fn maps_file(flags: c_int, fd: c_int) -> bool {
    flags & libc::MAP_ANONYMOUS == 0 && fd >= 0
}

/// `bits::VM_UNMAPPED` if `mmap` with `flags` and `fd` matters to a
/// handler of unmaps: it replaces what lies at its address
/// ([`mmap_replaces`]), or it maps a file, which a file-discarding call
/// in flight must learn of ([`FILE_MAPPINGS`]: a handler of unmaps alone,
/// a registration cache, sends it through the dispatch to be counted),
/// or hugetlb memory, whose later unmaps are sized in huge pages
/// (noted: `crate::hugetlb::made`). Else 0, after one test for the
/// common call, an anonymous mapping where the kernel chooses the
/// address.
#[inline(always)]
fn mmap_unmap_bits(flags: c_int, fd: c_int) -> u32 {
    if flags & (libc::MAP_FIXED | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB) == libc::MAP_ANONYMOUS {
        return 0;
    }
    if maps_file(flags, fd) || flags & libc::MAP_HUGETLB != 0 {
        bits::VM_UNMAPPED
    } else {
        mmap_replaces(flags)
    }
}

/// Mappings of files made or moved (mmap of a file, any mremap,
/// remap_file_pages, shmat), handler registrations, installs and
/// uninstalls, counted after the call, so that a file-discarding call
/// ([`report_file_discard`]) learns that its look at `/proc/self/maps`,
/// made before it ran, may have missed one.
static FILE_MAPPINGS: AtomicU64 = AtomicU64::new(0);

/// Counts a mapping of a file made or moved, after the call made it.
#[cold]
fn file_mapping_changed() {
    FILE_MAPPINGS.fetch_add(1, Ordering::SeqCst);
}

entry! {
    /// The `mmap` hook.
    mmap_hook => mmap_body, ORIG_MMAP as MmapFn,
    bits::MMAP | bits::VM_MAPPED | mmap_unmap_bits(flags, fd),
    (addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: libc::off_t) -> *mut c_void
}

/// [`mmap_hook`] when a handler wants its events, for namespace `ns`'s libc.
#[inline(always)]
#[expect(clippy::too_many_arguments, reason = "mmap's six, the namespace and the original")]
unsafe fn mmap_body(
    _ns: usize,
    orig: impl Fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    let mut ev = Event::Mmap(MmapEvent {
        result: INVALID_PTR,
        address: addr as usize,
        size: len,
        prot,
        flags,
        fd,
        offset: off,
    });
    // A hugetlb mapping's pages are huge: the kernel rounds the length
    // up to one. Anonymous memory's size is in the flags; a file's is
    // known before the call only where the range it replaces needs it
    // (0: asked of the mapping after the call; never where it replaces,
    // both ways giving the base page or more).
    let replaces = mmap_replaces(flags) != 0;
    let page = if flags & libc::MAP_ANONYMOUS != 0 {
        crate::hugetlb::of_anonymous(flags)
    } else if replaces {
        crate::hugetlb::of_file(fd)
    } else {
        0
    };
    // A fixed mapping replaces what lay there: unmapped before the call.
    let before = if replaces {
        unmapped_in(addr as usize, len, page)
    } else {
        None
    };
    call_original(
        OwnCall::Mmap(addr as usize, len),
        before,
        &mut ev,
        |e| {
            if let Event::Mmap(m) = e {
                // A pre-handler cannot change the arguments the original
                // gets: they are copies.
                m.result = orig(addr, len, prot, flags, fd, off) as usize;
                if maps_file(flags, fd) && m.result != INVALID_PTR {
                    file_mapping_changed();
                }
            }
        },
        |e| {
            let r = succeeded(result_of!(*e, Mmap, INVALID_PTR))?;
            let page = match page {
                0 => crate::hugetlb::of_file_at(fd, r),
                page => page,
            };
            crate::hugetlb::made(page);
            mapped_in(r, len, page)
        },
    );
    result_of!(ev, Mmap, INVALID_PTR) as *mut c_void
}

entry! {
    /// The `munmap` hook.
    munmap_hook => munmap_body, ORIG_MUNMAP as MunmapFn, bits::MUNMAP | bits::VM_UNMAPPED,
    (addr: *mut c_void, len: usize) -> c_int
}

/// [`munmap_hook`] when a handler wants its events, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn munmap_body(_ns: usize, orig: impl Fn(*mut c_void, usize) -> c_int, addr: *mut c_void, len: usize) -> c_int {
    let mut ev = Event::Munmap(MunmapEvent {
        result: -1,
        address: addr as usize,
        size: len,
    });
    call_original(
        OwnCall::Munmap(addr as usize, len),
        unmapped(addr as usize, len),
        &mut ev,
        |e| {
            if let Event::Munmap(m) = e {
                m.result = orig(addr, len);
            }
        },
        |_| None,
    );
    result_of!(ev, Munmap, -1)
}

entry! {
    /// The `mremap` hook (glibc's is variadic: the fifth argument, the new
    /// address, is read only with `MREMAP_FIXED`, and forwarded as it came).
    mremap_hook => mremap_body, ORIG_MREMAP as MremapFn, bits::MREMAP | bits::VM_MAPPED | bits::VM_UNMAPPED,
    (old: *mut c_void, old_size: usize, new_size: usize, flags: c_int, new_address: *mut c_void) -> *mut c_void
}

/// [`mremap_hook`] when a handler wants its events, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn mremap_body(
    _ns: usize,
    orig: impl Fn(*mut c_void, usize, usize, c_int, *mut c_void) -> *mut c_void,
    old: *mut c_void,
    old_size: usize,
    new_size: usize,
    flags: c_int,
    new_address: *mut c_void,
) -> *mut c_void {
    // A hugetlb mapping's sizes are rounded up to its huge page.
    let page = page_at(old as usize);
    if flags & libc::MREMAP_FIXED != 0 && wants(bits::VM_UNMAPPED) {
        // The destination's old mapping goes first (before the source's,
        // which the call's own dispatch reports).
        notify_keeping_errno(unmapped_in(new_address as usize, new_size, page));
    }
    let mut ev = Event::Mremap(MremapEvent {
        result: INVALID_PTR,
        address: old as usize,
        old_size,
        new_size,
        flags,
        new_address: new_address as usize,
    });
    let resize = in_place(old as usize, old_size, new_size, flags, page);
    // A growth that may move is tried in place first where a handler
    // wants the mappings' events (see `may_grow_in_place`).
    let trial = match resize {
        None if wants(bits::VM_MAPPED | bits::VM_UNMAPPED) => {
            may_grow_in_place(old as usize, old_size, new_size, flags, page)
        }
        _ => None,
    };
    let grew = Cell::new(false);
    let before = match (resize, trial) {
        // What a shrink cuts off: the rest stays where it is.
        (Some((old_end, new_end)), _) => unmapped_bytes(old as usize + new_end, old_end.saturating_sub(new_end)),
        // Nothing yet: reported below if the growth in place is refused.
        (None, Some(_)) => None,
        (None, None) => unmapped_in(old as usize, old_size, page),
    };
    call_original(
        OwnCall::Mremap(old as usize, old_size),
        before,
        &mut ev,
        |e| {
            if let Event::Mremap(m) = e {
                if trial.is_some() {
                    // The caller's mapping and sizes, without
                    // MREMAP_MAYMOVE: grown in place or refused (its
                    // errno not the caller's).
                    let r = keeping_errno(|| orig(old, old_size, new_size, 0, new_address)) as usize;
                    if r != INVALID_PTR {
                        m.result = r;
                        grew.set(true);
                        file_mapping_changed();
                        return;
                    }
                    // It will move: the old range goes first.
                    notify_keeping_errno(unmapped_in(old as usize, old_size, page));
                }
                m.result = orig(old, old_size, new_size, flags, new_address) as usize;
                if m.result != INVALID_PTR {
                    // It may have moved a mapping of a file.
                    file_mapping_changed();
                }
            }
        },
        |e| {
            let r = succeeded(result_of!(*e, Mremap, INVALID_PTR))?;
            match resize.or(trial.filter(|_| grew.get())) {
                // What a growth in place added.
                Some((old_end, new_end)) if r == old as usize => {
                    mapped_bytes(r + old_end, new_end.saturating_sub(old_end))
                }
                _ => mapped_in(r, new_size, page),
            }
        },
    );
    let result = result_of!(ev, Mremap, INVALID_PTR);
    if let Some((_, new_end)) = resize
        && succeeded(result).is_some_and(|r| r != old as usize)
        && wants(bits::VM_UNMAPPED)
    {
        // Moved where Linux resizes in place (qemu-user moves a shrink
        // made with MREMAP_MAYMOVE): the pages that stayed are gone from
        // here too. Late, not lost.
        notify_keeping_errno(unmapped_bytes(old as usize, new_end));
    }
    if flags & libc::MREMAP_DONTUNMAP != 0 && succeeded(result).is_some() && wants(bits::VM_MAPPED) {
        // The source stays mapped, emptied (its pages moved): a new
        // mapping where the call's dispatch reported one unmapped.
        notify_keeping_errno(mapped_in(old as usize, old_size, page));
    }
    result as *mut c_void
}

/// Where `mremap(old, old_size, new_size, flags)` cannot move the
/// mapping, the ends (from `old`, in whole pages of `page` bytes) of the
/// mapping before and after it: a shrink, which Linux always makes in
/// place (it unmaps the pages past the new end, whatever the flags but
/// `MREMAP_FIXED` and `MREMAP_DONTUNMAP`, which move), a call that keeps
/// the size, and a growth without `MREMAP_MAYMOVE` (in place, or
/// refused). Then the pages kept are neither unmapped nor mapped again:
/// a registration cache keeps its registrations of a buffer `realloc`
/// shrank (glibc shrinks a large block with `mremap`) but for the pages
/// cut off. `None` where the call may move the mapping (a growth with
/// `MREMAP_MAYMOVE`, tried in place first: [`may_grow_in_place`]; an old
/// size of 0, which makes a second mapping), or moves it: the whole old
/// range goes before the call, and the result's is mapped after; and for
/// a range past the top of the address space (the kernel refuses it).
#[inline(always)]
fn in_place(old: usize, old_size: usize, new_size: usize, flags: c_int, page: usize) -> Option<(usize, usize)> {
    if flags & (libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP) != 0 || old_size == 0 || new_size == 0 {
        return None;
    }
    let (old_end, new_end) = (whole_pages_of(old, old_size, page), whole_pages_of(old, new_size, page));
    let stays = new_end <= old_end || flags & libc::MREMAP_MAYMOVE == 0;
    (stays && old.checked_add(old_end.max(new_end)).is_some()).then_some((old_end, new_end))
}

/// Where `mremap(old, old_size, new_size, MREMAP_MAYMOVE)` grows the
/// mapping (`MREMAP_MAYMOVE` alone), the ends [`in_place`] gives: the
/// hook first tries the growth without `MREMAP_MAYMOVE`, which the kernel
/// makes in place where the pages after the mapping are free (what it
/// tries first with the flag too) and refuses otherwise, changing
/// nothing; then it reports only the pages added, and a registration
/// cache keeps its registrations of a buffer `realloc` grew in place
/// (glibc grows a large block with `mremap`). Only where it is refused
/// does the old range go (`VM_UNMAPPED`) before the call as made. The
/// price: a second system call for a growth that moves.
#[inline(always)]
fn may_grow_in_place(
    old: usize,
    old_size: usize,
    new_size: usize,
    flags: c_int,
    page: usize,
) -> Option<(usize, usize)> {
    if flags != libc::MREMAP_MAYMOVE || old_size == 0 {
        return None;
    }
    let (old_end, new_end) = (whole_pages_of(old, old_size, page), whole_pages_of(old, new_size, page));
    (new_end > old_end && old.checked_add(new_end).is_some()).then_some((old_end, new_end))
}

/// Delivers `event` (if any) outside a call's own dispatch, keeping the
/// caller's errno whatever the handlers do.
#[cold]
fn notify_keeping_errno(event: Option<Event>) {
    if let Some(mut event) = event {
        keeping_errno(|| notify(&mut event));
    }
}

/// What the dynamic loader mapped or unmapped for a library, which it
/// does through its own copies of mmap and munmap, out of the hooks'
/// sight: `VM_MAPPED` of a loaded object's span after the `dlopen` that
/// loaded it, `VM_UNMAPPED` of an unloaded one's after the `dlclose` that
/// unloaded it (late: the loader gives no public moment before it
/// unmaps at which the objects it will unmap are known; but not lost).
/// Found by reloc's rescan after every interposed `dlopen` and `dlclose`.
pub(crate) fn loader_changed(mapped: bool, start: usize, end: usize) {
    let size = end.saturating_sub(start);
    let event = if mapped {
        wants(bits::VM_MAPPED).then(|| mapped_bytes(start, size)).flatten()
    } else {
        wants(bits::VM_UNMAPPED).then(|| unmapped_bytes(start, size)).flatten()
    };
    notify_keeping_errno(event);
}

/// Size of the shared memory segment `shmid` (0 when unknown).
fn shm_size(shmid: c_int) -> usize {
    let mut ds = core::mem::MaybeUninit::<libc::shmid_ds>::zeroed();
    // SAFETY: IPC_STAT fills `ds`; on failure it is left zeroed.
    if unsafe { libc::shmctl(shmid, libc::IPC_STAT, ds.as_mut_ptr()) } != 0 {
        return 0;
    }
    // SAFETY: zero-initialised and possibly filled by shmctl.
    unsafe { ds.assume_init() }.shm_segsz
}

/// `bits::VM_UNMAPPED` if `shmat` with `shmaddr` and `shmflg` replaces
/// what lies at the address (`SHM_REMAP`), else 0.
#[inline(always)]
fn shmat_replaces(shmaddr: *const c_void, shmflg: c_int) -> u32 {
    if !shmaddr.is_null() && shmflg & libc::SHM_REMAP != 0 {
        bits::VM_UNMAPPED
    } else {
        0
    }
}

/// Where `shmat(.., shmaddr, shmflg)` maps: the address, rounded down
/// with `SHM_RND` (to four pages, the largest `SHMLBA` of the
/// architectures memhook runs on: reporting a little more than was
/// replaced is harmless, less is not).
fn shmat_start(shmaddr: *const c_void, shmflg: c_int) -> usize {
    let at = shmaddr as usize;
    if shmflg & libc::SHM_RND != 0 {
        at & !(4 * page_size() - 1)
    } else {
        at
    }
}

/// The range `shmat(.., shmaddr, shmflg)` of a segment of `size` bytes
/// in pages of `page` bytes, with `SHM_REMAP`, maps over: the segment's
/// pages from [`shmat_start`] (and from the address as given).
fn shmat_replaced(size: usize, shmaddr: *const c_void, shmflg: c_int, page: usize) -> Option<Event> {
    let start = shmat_start(shmaddr, shmflg);
    let end = (shmaddr as usize)
        .saturating_add(size.next_multiple_of(page_size()))
        .max(start.saturating_add(size.next_multiple_of(page)));
    unmapped_bytes(start, end - start)
}

/// The page size of segment `shmid`'s pages, for an attachment with
/// `SHM_REMAP` at `start`, where the range it replaces must be known
/// before the call: where a huge page can start there, the segment is
/// attached for a moment, read-only, where the kernel chooses (by
/// namespace `ns`'s originals, out of the hooks' sight), and its mapping
/// asked; the base page elsewhere, or where it cannot be attached (the
/// call then fails too). The moment's attach and detach update the
/// segment's times and pids, as the call itself does.
#[cold]
fn segment_page(ns: usize, shmid: c_int, start: usize) -> usize {
    if !crate::hugetlb::may_start_huge_page(start) {
        return page_size();
    }
    // (Before the call: its own attach's errno is not the caller's.)
    keeping_errno(|| attached_page(ns, shmid))
}

/// [`segment_page`]'s look: the segment attached for a moment, and the
/// page size of its mapping.
fn attached_page(ns: usize, shmid: c_int) -> usize {
    let attach = original!(ORIG_SHMAT[slot(ns)], ShmatFn);
    // SAFETY: shmat of the caller's segment where the kernel chooses,
    // read-only: a new mapping of nothing else, detached below.
    let p = unsafe { attach(shmid, core::ptr::null(), libc::SHM_RDONLY) };
    if p as usize == INVALID_PTR {
        return page_size();
    }
    let page = crate::hugetlb::page_here(p as usize);
    let detach = ORIG_SHMDT[slot(ns)].load(Ordering::Acquire);
    // SAFETY: detaches the attachment just made: by the original (set
    // when its hook was installed; libc's otherwise).
    unsafe {
        if detach != 0 {
            core::mem::transmute::<usize, ShmdtFn>(detach)(p);
        } else {
            libc::shmdt(p);
        }
    }
    page
}

entry! {
    /// The `shmat` hook (through its body for a handler of unmaps alone
    /// too: it notes a hugetlb attachment, whose later unmaps are sized in
    /// huge pages).
    shmat_hook => shmat_body, ORIG_SHMAT as ShmatFn, bits::SHMAT | bits::VM_MAPPED | bits::VM_UNMAPPED,
    (shmid: c_int, shmaddr: *const c_void, shmflg: c_int) -> *mut c_void
}

/// [`shmat_hook`] when a handler wants its events, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn shmat_body(
    ns: usize,
    orig: impl Fn(c_int, *const c_void, c_int) -> *mut c_void,
    shmid: c_int,
    shmaddr: *const c_void,
    shmflg: c_int,
) -> *mut c_void {
    let mut ev = Event::Shmat(ShmatEvent {
        result: INVALID_PTR,
        shmid,
        shmaddr: shmaddr as usize,
        shmflg,
    });
    // The segment's size, asked once where both the replaced range and
    // the new mapping need it.
    let size = (shmat_replaces(shmaddr, shmflg) != 0 && wants(bits::VM_UNMAPPED)).then(|| shm_size(shmid));
    let before = size.and_then(|size| {
        let page = segment_page(ns, shmid, shmat_start(shmaddr, shmflg));
        shmat_replaced(size, shmaddr, shmflg, page)
    });
    call_original(
        OwnCall::Shmat(shmid, shmaddr as usize),
        before,
        &mut ev,
        |e| {
            if let Event::Shmat(m) = e {
                m.result = orig(shmid, shmaddr, shmflg) as usize;
                if m.result != INVALID_PTR {
                    // A mapping of the segment's file (`mapped_files`).
                    file_mapping_changed();
                }
            }
        },
        |e| {
            let r = succeeded(result_of!(*e, Shmat, INVALID_PTR))?;
            let page = crate::hugetlb::of_new_at(r);
            let (mapped, unmapped) = (wants(bits::VM_MAPPED), wants(bits::VM_UNMAPPED));
            if !mapped && !unmapped {
                return None;
            }
            let size = size.unwrap_or_else(|| shm_size(shmid));
            if unmapped {
                attachments::remember(r, whole_pages_of(r, size, page));
            }
            if !mapped {
                return None;
            }
            mapped_in(r, size, page)
        },
    );
    result_of!(ev, Shmat, INVALID_PTR) as *mut c_void
}

entry! {
    /// The `shmdt` hook (the size comes from the mapping at the address).
    shmdt_hook => shmdt_body, ORIG_SHMDT as ShmdtFn, bits::SHMDT | bits::VM_UNMAPPED,
    (shmaddr: *const c_void) -> c_int
}

/// What `shmdt(at)` unmaps, as Linux finds it (`ksys_shmdt`): the
/// mappings of the segment attached at `at`, each of which maps the
/// segment's offset that lies as far from `at` as it does (more than one
/// where `mprotect` split the attachment, or `munmap` cut holes in it),
/// from the first to the last; `(at, 0)` where there is none. A mapping
/// of another segment or file laid in a hole lies inside the range too
/// (reported unmapped with it: more than went, never less). Asked of the
/// kernel where it answers ([`shm_attached_by`]: a few questions); else
/// the whole text is read (a fragment may lie past other mappings):
/// about 0.1 ms in a process of a thousand mappings.
///
/// Where the mappings cannot be read at all (no descriptor left under
/// the process's limit, no /proc mounted), the attachment `shmat` made
/// there, as [`attachments`] remembers it: the whole segment, more than
/// went where the attachment was cut since, never less.
fn shm_attached(at: usize) -> (usize, usize) {
    let found = match crate::maps::Queries::open().and_then(|q| shm_attached_by(&q, at)) {
        Ok(found) => Some(found),
        Err(()) => shm_attached_by_text(at),
    };
    let remembered = attachments::forget(at);
    found.unwrap_or_else(|| (at, remembered.unwrap_or(0)))
}

/// The System V attachments `shmat` made while a handler wanted
/// `VM_UNMAPPED`: where, and how long (the segment's size in whole
/// pages), for `shmdt` where the mappings cannot be read. A fixed table
/// of atomics (hooks do not allocate); an attachment it has no room for
/// is not remembered (its `shmdt`, where the mappings cannot be read,
/// then reports nothing, as before).
mod attachments {
    use core::sync::atomic::{AtomicUsize, Ordering};

    const ROOM: usize = 64;
    /// Each entry's address (0: free) and length.
    static AT: [AtomicUsize; ROOM] = [const { AtomicUsize::new(0) }; ROOM];
    static LEN: [AtomicUsize; ROOM] = [const { AtomicUsize::new(0) }; ROOM];

    /// Remembers an attachment of `len` bytes at `at`.
    pub(super) fn remember(at: usize, len: usize) {
        // An address attached again (after a detach that was not seen)
        // is one attachment.
        let _ = forget(at);
        for (a, l) in AT.iter().zip(&LEN) {
            if a.compare_exchange(0, at, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                l.store(len, Ordering::Release);
                return;
            }
        }
    }

    /// The length remembered for `at` (0 where its length was not yet
    /// stored), forgotten; `None` where none is.
    pub(super) fn forget(at: usize) -> Option<usize> {
        if at == 0 {
            // What a free entry holds: no attachment's address.
            return None;
        }
        for (a, l) in AT.iter().zip(&LEN) {
            if a.load(Ordering::Acquire) == at {
                let len = l.load(Ordering::Acquire);
                // The length is cleared before the entry is free, so
                // that it never overwrites the next owner's.
                l.store(0, Ordering::Relaxed);
                if a.compare_exchange(at, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    return Some(len);
                }
            }
        }
        None
    }
}

/// [`shm_attached`] by `PROCMAP_QUERY`, as Linux looks: the first mapping
/// of a SysV segment at or above `at` that maps the offset as far from
/// `at` as it lies, then the others of that segment that do, up to the
/// segment's size past `at` (where no fragment can lie; unbounded where
/// the size cannot be asked). `Err` where the kernel stops answering.
/// About 2.6 us a `shmdt` hooked, where the text took 16 us with 52
/// mappings, 650 us with 4,000 (dev VM).
fn shm_attached_by(q: &crate::maps::Queries, at: usize) -> Result<(usize, usize), ()> {
    use crate::maps::Ask;
    let mut cursor = at;
    let (first, page) = loop {
        let Some((m, page)) = q.ask(cursor, Ask::FILES.or_next())? else {
            return Ok((at, 0));
        };
        if piece_of_attachment_at(&m, at) {
            let named = q.ask(m.start, Ask::FILES.with_path())?;
            if named.is_some_and(|(n, _)| n.start == m.start && n.path().starts_with(b"/SYSV")) {
                break (m, page);
            }
        }
        if m.end <= cursor {
            return Ok((at, 0));
        }
        cursor = m.end;
    };
    // A SysV segment's inode number is its id; its file's size (Linux's
    // bound) is the segment's rounded up to its pages, huge pages for a
    // SHM_HUGETLB one.
    let size = match shm_size(first.inode as c_int) {
        0 => usize::MAX,
        size => size
            .checked_next_multiple_of(page.max(page_size()))
            .unwrap_or(usize::MAX),
    };
    let mut end = first.end;
    cursor = first.end;
    // (Every mapping, not only files': asked for the next mapping of a
    // file, the kernel would pass over every anonymous one above, past
    // the segment's end.)
    while let Some((m, _)) = q.ask(cursor, Ask::HOLDING.or_next())? {
        if m.end <= cursor || m.end - at > size {
            break;
        }
        if piece_of_attachment_at(&m, at) && m.dev == first.dev && m.inode == first.inode {
            end = m.end;
        }
        cursor = m.end;
    }
    Ok((first.start, end - first.start))
}

/// Whether `m` may be a piece of an attachment made at `at`, as Linux
/// tells one (`ksys_shmdt`): a shared mapping at or above `at` that maps
/// the offset as far from `at` as it lies (its segment a SysV one, which
/// the caller checks).
fn piece_of_attachment_at(m: &crate::maps::Mapping, at: usize) -> bool {
    m.shared && m.start >= at && (m.start - at) as u64 == m.offset
}

/// [`shm_attached`] by the text of `/proc/self/maps`; `None` where it
/// cannot be read.
fn shm_attached_by_text(at: usize) -> Option<(usize, usize)> {
    // The first fragment's file (device, inode: the segment's id, which
    // may be 0) and start; the last's end.
    let mut found: Option<((u32, u32), u64, usize)> = None;
    let mut end = at;
    let read = crate::maps::for_each(|m| {
        let fragment = piece_of_attachment_at(m, at) && m.path().starts_with(b"/SYSV");
        match found {
            None if fragment => {
                found = Some((m.dev, m.inode, m.start));
                end = m.end;
            }
            Some((dev, inode, _)) if fragment && m.dev == dev && m.inode == inode => end = m.end,
            _ => {}
        }
        core::ops::ControlFlow::Continue(())
    });
    read.ok()?;
    Some(found.map_or((at, 0), |(_, _, start)| (start, end - start)))
}

/// [`shmdt_hook`] when a handler wants its events, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn shmdt_body(_ns: usize, orig: impl Fn(*const c_void) -> c_int, shmaddr: *const c_void) -> c_int {
    let before = if wants(bits::VM_UNMAPPED) {
        // (Before the call: a refused open of /proc/self/maps is not the
        // caller's errno.)
        let (at, size) = keeping_errno(|| shm_attached(shmaddr as usize));
        unmapped(at, size)
    } else {
        None
    };
    let mut ev = Event::Shmdt(ShmdtEvent {
        result: -1,
        shmaddr: shmaddr as usize,
    });
    call_original(
        OwnCall::Shmdt(shmaddr as usize),
        before,
        &mut ev,
        |e| {
            if let Event::Shmdt(m) = e {
                m.result = orig(shmaddr);
            }
        },
        |_| None,
    );
    result_of!(ev, Shmdt, -1)
}

/// The current program break, without going through the hooks.
fn current_break(ns: usize) -> usize {
    let sbrk = ORIG_SBRK[slot(ns)].load(Ordering::Acquire);
    if sbrk != 0 {
        // SAFETY: glibc's sbrk (or what a prior hooker put before it);
        // sbrk(0) only reads the break.
        return unsafe { core::mem::transmute::<usize, SbrkFn>(sbrk)(0) } as usize;
    }
    // SAFETY: brk(0) returns the current break and changes nothing.
    unsafe { crate::sys::syscall!(libc::SYS_brk, 0 as libc::c_long) as usize }
}

/// `VM_UNMAPPED` of what moving the break from `top` down to `new`
/// unmaps; `None` for no shrink, and for one below the heap's start,
/// which the kernel refuses (`brk(NULL)`, an `sbrk` of more than the
/// heap: before, the whole range from there to the break was reported
/// unmapped, the program's own code and data with it).
fn break_shrink(new: usize, top: usize) -> Option<Event> {
    if new >= top || new < heap_start(top) {
        return None;
    }
    unmapped_bytes(new, top - new)
}

/// Where the heap starts (the kernel's `start_brk`, fixed for the
/// process's life): the `[heap]` mapping's start (or where the kernel
/// merged it with the data before it, that mapping's: a shrink below
/// the heap then reported, one too many), found at the first shrink
/// (asked of the kernel, the mappings up to it alone, where it answers
/// `PROCMAP_QUERY`; else from the text of `/proc/self/maps`) and kept.
/// 0 (every shrink reported) while there is no such mapping (no heap
/// yet, which `top` would tell apart but for qemu-user, whose maps may
/// not name it) or the mappings cannot be read.
fn heap_start(top: usize) -> usize {
    static START: AtomicUsize = AtomicUsize::new(0);
    let known = START.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    let mut start = None;
    let read = keeping_errno(|| {
        crate::maps::for_each_named(|m| {
            if m.path() == b"[heap]" {
                start = Some(m.start);
                return core::ops::ControlFlow::Break(());
            }
            core::ops::ControlFlow::Continue(())
        })
    });
    match (read, start) {
        (Ok(()), Some(start)) if start <= top => {
            START.store(start, Ordering::Relaxed);
            start
        }
        _ => 0,
    }
}

thread_local! {
    /// Set while this thread runs sbrk's original: glibc's sbrk moves the
    /// break with brk, and that inner call is sbrk's, already reported.
    static IN_SBRK: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

entry! {
    /// The `sbrk` hook.
    sbrk_hook => sbrk_body, ORIG_SBRK as SbrkFn, bits::SBRK | bits::VM_MAPPED | bits::VM_UNMAPPED,
    (increment: libc::intptr_t) -> *mut c_void
}

/// [`sbrk_hook`] when a handler wants its events, for namespace `ns`'s libc (sbrk(0) only reads the break: just the call).
#[inline(always)]
unsafe fn sbrk_body(ns: usize, orig: impl Fn(libc::intptr_t) -> *mut c_void, increment: libc::intptr_t) -> *mut c_void {
    if increment == 0 {
        return orig(increment);
    }
    let before = if increment < 0 && wants(bits::VM_UNMAPPED) {
        let top = current_break(ns);
        top.checked_sub(increment.unsigned_abs())
            .and_then(|new| break_shrink(new, top))
    } else {
        None
    };
    let mut ev = Event::Sbrk(SbrkEvent {
        result: INVALID_PTR,
        increment,
    });
    call_original(
        OwnCall::Brk,
        before,
        &mut ev,
        |e| {
            if let Event::Sbrk(m) = e {
                let _ = IN_SBRK.try_with(|f| f.set(true));
                m.result = orig(increment) as usize;
                let _ = IN_SBRK.try_with(|f| f.set(false));
            }
        },
        |e| {
            succeeded(result_of!(*e, Sbrk, INVALID_PTR))
                .filter(|_| increment > 0)
                .and_then(|r| mapped_bytes(r, increment as usize))
        },
    );
    result_of!(ev, Sbrk, INVALID_PTR) as *mut c_void
}

entry! {
    /// The `brk` hook.
    brk_hook => brk_body, ORIG_BRK as BrkFn, bits::BRK | bits::VM_MAPPED | bits::VM_UNMAPPED,
    (addr: *mut c_void) -> c_int
}

/// [`brk_hook`] when a handler wants its events, for namespace `ns`'s libc (sbrk's own call of brk is sbrk's, already reported: just the call).
#[inline(always)]
unsafe fn brk_body(ns: usize, orig: impl Fn(*mut c_void) -> c_int, addr: *mut c_void) -> c_int {
    if IN_SBRK.try_with(|f| f.get()).unwrap_or(false) {
        return orig(addr);
    }
    break_moved(current_break(ns), addr as usize, || orig(addr))
}

/// The break moved from `top` to `new` by `call` (0 where it moved, -1
/// where not), as `brk` is reported: `VM_UNMAPPED` of a shrink before
/// ([`break_shrink`]), `BRK` with the call's result, `VM_MAPPED` of a
/// growth after. The result, as a handler may have left it.
fn break_moved(top: usize, new: usize, call: impl FnOnce() -> c_int) -> c_int {
    let mut ev = Event::Brk(BrkEvent { result: -1, addr: new });
    call_original(
        OwnCall::Brk,
        break_shrink(new, top),
        &mut ev,
        |e| {
            if let Event::Brk(m) = e {
                m.result = call();
            }
        },
        |e| {
            if result_of!(*e, Brk, -1) == 0 && new > top {
                mapped_bytes(top, new - top)
            } else {
                None
            }
        },
    );
    result_of!(ev, Brk, -1)
}

/// `MADV_DONTNEED` that applies to locked pages too (Linux 5.18; not in
/// the libc crate). The same value on x86_64 and aarch64
/// (asm-generic/mman-common.h).
pub(crate) const MADV_DONTNEED_LOCKED: c_int = 24;
/// Replaces the range's pages by guard markers, which fault on access
/// (Linux 6.13; not in the libc crate): what the pages held is gone.
const MADV_GUARD_INSTALL: c_int = 102;

/// Whether `advice` discards the pages' contents (so caches of them must
/// go): `MADV_DONTNEED`, `MADV_FREE`, `MADV_REMOVE`, and the newer
/// `MADV_DONTNEED_LOCKED` and `MADV_GUARD_INSTALL`, which a registration
/// cache must hear of as surely (the pages it registered are replaced
/// either way). Advices that keep the contents (`MADV_PAGEOUT`,
/// `MADV_COLD`, ...) are not.
fn discards(advice: c_int) -> bool {
    matches!(
        advice,
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE | MADV_DONTNEED_LOCKED | MADV_GUARD_INSTALL
    )
}

entry! {
    /// The `madvise` hook: events only for the discarding advices.
    /// A discard is made around memhook's own pages (`crate::kept`).
    madvise_hook => madvise_body, ORIG_MADVISE as MadviseFn, through kept_madvise, bits::MADVISE | bits::VM_UNMAPPED,
    (addr: *mut c_void, len: usize, advice: c_int) -> c_int
}

/// The original `madvise`, around memhook's own pages ([`crate::kept`]).
///
/// # Safety
///
/// `orig` is `madvise` (the hook's original slot: libc's function, or a
/// hooker's before memhook's).
#[inline(always)]
unsafe fn kept_madvise(orig: MadviseFn, addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: `madvise`, with the caller's advice on the caller's range.
    unsafe { crate::kept::madvise(addr, len, advice, orig) }
}

/// [`madvise_hook`] when a handler wants its events, for namespace `ns`'s libc (only the discarding advices have events: the others just the call).
#[inline(always)]
unsafe fn madvise_body(
    _ns: usize,
    orig: impl Fn(*mut c_void, usize, c_int) -> c_int,
    addr: *mut c_void,
    len: usize,
    advice: c_int,
) -> c_int {
    if !discards(advice) {
        return orig(addr, len, advice);
    }
    let removes = advice == libc::MADV_REMOVE && wants(bits::VM_UNMAPPED);
    let mappings = if removes { report_removed(addr as usize, len) } else { 0 };
    let mut ev = Event::Madvise(MadviseEvent {
        result: -1,
        addr: addr as usize,
        length: len,
        advice,
    });
    call_original(
        OwnCall::Madvise(addr as usize, len),
        discarded(addr as usize, len, advice),
        &mut ev,
        |e| {
            if let Event::Madvise(m) = e {
                m.result = orig(addr, len, advice);
            }
        },
        |_| None,
    );
    let result = result_of!(ev, Madvise, -1);
    if removes && result == 0 && FILE_MAPPINGS.load(Ordering::SeqCst) != mappings {
        // A mapping of a file was made or moved during the call: the
        // second look, as after fallocate ([`report_late_discard`]).
        report_removed(addr as usize, len);
    }
    result
}

/// `VM_UNMAPPED` of what the discarding `advice` takes at `address` for
/// `size` bytes: whole pages, and where the kernel rounds a hugetlb
/// range's end up to a huge page (`MADV_DONTNEED` on Linux 5.19 to 6.8:
/// `crate::hugetlb::madvise_rounds_up`), the huge page of the mapping
/// that holds the range's last page (the first pages of a range that
/// runs over several mappings are in mappings that end inside it). Asked
/// only in a process that may have a hugetlb mapping, and only where
/// the end is not on the largest huge page's boundary already.
pub(crate) fn discarded(address: usize, size: usize, advice: c_int) -> Option<Event> {
    let base = page_size();
    let bytes = whole_pages(address, size);
    if matches!(advice, libc::MADV_DONTNEED | MADV_DONTNEED_LOCKED)
        && bytes != 0
        && address.is_multiple_of(base)
        && crate::hugetlb::madvise_rounds_up()
        && let Some((_, largest)) = crate::hugetlb::size_range()
        && let Some(end) = address.checked_add(bytes)
        && end % largest != 0
    {
        let page = crate::hugetlb::page_at(end - base);
        if page > base
            && let Some(end) = end.checked_next_multiple_of(page)
        {
            return unmapped_bytes(address, end - address);
        }
    }
    unmapped_bytes(address, bytes)
}

/// `MADV_REMOVE` frees the range's backing store: it punches a hole in
/// the file each shared mapping in the range maps (a memfd, tmpfs, a
/// SysV segment, shared anonymous memory, hugetlbfs), so every other
/// mapping of those bytes of the file loses its pages too, with no call
/// on it: a second view of a memfd, a duplicate `mremap` made with an
/// old size of 0, a private mapping's pages not yet copied. `VM_UNMAPPED`
/// of each, before the call, as for `fallocate`'s punched hole (the
/// range's own are the call's own dispatch's to report). Returns
/// [`FILE_MAPPINGS`] as it was before the look, the second look's cue.
/// Looks at the mappings in the range once, and at the process's
/// mappings of files once per shared mapping among them: a rare call.
/// Keeps errno (it runs before the call, whose caller sees its own).
#[cold]
fn report_removed(addr: usize, len: usize) -> u64 {
    keeping_errno(|| report_removed_mappings(addr, len))
}

/// [`report_removed`]'s work.
fn report_removed_mappings(addr: usize, len: usize) -> u64 {
    let mappings = FILE_MAPPINGS.load(Ordering::SeqCst);
    let end = addr.saturating_add(whole_pages(addr, len));
    let _ = crate::maps::for_each_past(addr, |m| {
        if m.start >= end {
            return core::ops::ControlFlow::Break(());
        }
        if m.shared {
            let lo = addr.max(m.start);
            let offset = m.offset + (lo - m.start) as u64;
            let bytes = (end.min(m.end) - lo) as u64;
            report_discarded_ranges((m.dev, m.inode), offset, offset + bytes, addr..end);
        }
        core::ops::ControlFlow::Continue(())
    });
    mappings
}

/// The most ranges one `process_madvise` takes (`UIO_MAXIOV`): the kernel
/// refuses more with `EINVAL`, before it acts on any.
const UIO_MAXIOV: usize = 1024;

/// The caller's ranges read per step, into the hook's stack (512 bytes).
const RANGES_PER_STEP: usize = 32;

entry! {
    /// The `process_madvise` hook (glibc 2.36; an allocator's batch of
    /// `MADV_DONTNEED`s on its own memory since Linux 6.13): for a
    /// discarding advice, `VM_UNMAPPED` of each range, before the call.
    process_madvise_hook => process_madvise_body, ORIG_PROCESS_MADVISE as ProcessMadviseFn, bits::VM_UNMAPPED,
    (pidfd: c_int, iov: *const libc::iovec, vlen: usize, advice: c_int, flags: libc::c_uint) -> isize
}

/// [`process_madvise_hook`] when a handler wants `VM_UNMAPPED`, for namespace `ns`'s libc.
///
/// Whether `pidfd` names this process is not asked (that costs a read of
/// `/proc/self/fdinfo`): the ranges are reported whatever it names, as
/// they are on a kernel older than 6.13, which refuses these advices
/// after the report. A report too many costs a cache a registration it
/// makes again; one too few, pages used after they are gone. A call the
/// kernel refuses before looking at the ranges (flags other than 0, more
/// than `UIO_MAXIOV` ranges) reports nothing.
#[inline(always)]
unsafe fn process_madvise_body(
    _ns: usize,
    orig: impl Fn(c_int, *const libc::iovec, usize, c_int, libc::c_uint) -> isize,
    pidfd: c_int,
    iov: *const libc::iovec,
    vlen: usize,
    advice: c_int,
    flags: libc::c_uint,
) -> isize {
    if !(discards(advice) && flags == 0 && vlen <= UIO_MAXIOV) {
        return orig(pidfd, iov, vlen, advice, flags);
    }
    let removes = advice == libc::MADV_REMOVE;
    let mappings = FILE_MAPPINGS.load(Ordering::SeqCst);
    report_ranges(iov as usize, vlen, advice);
    let own = OwnCall::ProcessMadvise(pidfd, iov as usize);
    let result = crate::dispatch::run_original(own, || orig(pidfd, iov, vlen, advice, flags));
    if removes && result > 0 && FILE_MAPPINGS.load(Ordering::SeqCst) != mappings {
        // The second look, as after madvise's.
        report_ranges(iov as usize, vlen, advice);
    }
    result
}

/// Delivers `VM_UNMAPPED` for each of the `count` ranges (`struct iovec`)
/// at `array` in the caller's memory, keeping the caller's errno. The
/// array is read without trusting it ([`read_caller`]): where the kernel
/// would answer `EFAULT`, the hook must not crash. The ranges are read
/// and reported `RANGES_PER_STEP` at a time; at the first step that
/// cannot be read whole, the rest is not reported (the call then fails
/// with `EFAULT`, having discarded nothing). Each range as `advice`
/// discards it ([`discarded`]); with `MADV_REMOVE`, also the other
/// mappings of the files each range maps ([`report_removed`]).
#[cold]
fn report_ranges(array: usize, count: usize, advice: c_int) {
    keeping_errno(|| {
        let mut ranges = [libc::iovec {
            iov_base: core::ptr::null_mut(),
            iov_len: 0,
        }; RANGES_PER_STEP];
        let mut done = 0;
        while done < count {
            let n = (count - done).min(RANGES_PER_STEP);
            let from = array.wrapping_add(done * size_of::<libc::iovec>());
            if !read_caller(from, &mut ranges[..n]) {
                break;
            }
            for range in &ranges[..n] {
                if let Some(mut event) = discarded(range.iov_base as usize, range.iov_len, advice) {
                    notify(&mut event);
                }
                if advice == libc::MADV_REMOVE {
                    report_removed(range.iov_base as usize, range.iov_len);
                }
            }
            done += n;
        }
    });
}

/// Values that any bytes make (integers, pointers, and structs of them):
/// what [`read_caller`] may fill from the caller's memory.
///
/// # Safety
///
/// Every bit pattern of the type's size is a valid value of it.
pub(crate) unsafe trait Plain: Copy {}
// SAFETY: two words, a pointer and a length: any bits are valid.
unsafe impl Plain for libc::iovec {}
// SAFETY: an integer.
unsafe impl Plain for u64 {}

/// Copies `out.len()` values from `from`, in the caller's memory, into
/// `out`, if they can all be read: with `process_vm_readv` on this
/// process (which answers `EFAULT` where a plain read would fault), or,
/// where that call is refused (a seccomp filter, qemu-user), by reading
/// them after `/proc/self/maps` shows them readable. `from` need not be
/// aligned.
fn read_caller<T: Plain>(from: usize, out: &mut [T]) -> bool {
    read_by_kernel(from, out).unwrap_or_else(|| read_if_mapped(from, out))
}

/// [`read_caller`] by `process_vm_readv`: whether all of `out` was read,
/// or `None` where the call is refused (not `EFAULT`).
fn read_by_kernel<T: Plain>(from: usize, out: &mut [T]) -> Option<bool> {
    let bytes = size_of_val(out);
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: bytes,
    };
    let remote = libc::iovec {
        iov_base: from as *mut c_void,
        iov_len: bytes,
    };
    // SAFETY: `local` is `out`, writable for `bytes`; the kernel checks
    // `remote` and fails where it cannot be read. getpid has no
    // preconditions.
    let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if got >= 0 {
        return Some(got as usize == bytes);
    }
    (crate::maps::errno() == libc::EFAULT).then_some(false)
}

/// [`read_caller`] by a plain copy, if `/proc/self/maps` shows the whole
/// range readable.
fn read_if_mapped<T: Plain>(from: usize, out: &mut [T]) -> bool {
    let bytes = size_of_val(out);
    if !readable(from, bytes) {
        return false;
    }
    // SAFETY: `[from, from + bytes)` lies in readable mappings (just
    // checked; the caller's memory, which it passed to the call), `out`
    // is as long, and they do not overlap (`out` is on this stack).
    unsafe { core::ptr::copy_nonoverlapping(from as *const u8, out.as_mut_ptr().cast::<u8>(), bytes) };
    true
}

/// Whether `[from, from + bytes)` lies in readable mappings, one after
/// another, as the kernel tells them (`maps::find`).
pub(crate) fn readable(from: usize, bytes: usize) -> bool {
    let Some(end) = from.checked_add(bytes) else {
        return false;
    };
    let mut at = from;
    while at < end {
        match crate::maps::find(at) {
            Some(m) if m.prot & libc::PROT_READ != 0 => at = m.end,
            _ => return false,
        }
    }
    true
}

/// userfaultfd's `UFFDIO_MOVE` (Linux 6.8, `linux/userfaultfd.h`):
/// `_IOWR(0xAA, 0x05, struct uffdio_move)`. The kernel takes an ioctl's
/// request as 32 bits (`unsigned int cmd`), whatever the caller passed
/// above them, and so does the hook.
pub(crate) const UFFDIO_MOVE: u32 = 0xc028_aa05;

/// `UFFDIO_MOVE`'s modes the kernel takes (`UFFDIO_MOVE_MODE_DONTWAKE`,
/// `UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES`): any other bit is `EINVAL`, before
/// it moves anything.
const UFFDIO_MOVE_MODES: u64 = 0b11;

/// `struct uffdio_move`: where to, from where, how many bytes, the mode,
/// and (the kernel's answer) how many it moved.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

// SAFETY: five integers: any bits are valid.
unsafe impl Plain for UffdioMove {}

/// The `ioctl` hook: userfaultfd's `UFFDIO_MOVE` (a garbage collector's
/// tool: it moves an anonymous range's pages to another range registered
/// with the userfaultfd, with no call on either mapping) takes the source
/// range's pages away, as `MADV_DONTNEED` would: `VM_UNMAPPED` of the
/// source range before the call. The destination range had no pages
/// there (the kernel refuses the move, `EEXIST`, where it has), so none
/// is taken from it. Every other request (a driver's: libcuda makes many)
/// costs a compare and a jump to the original, with no frame of its own;
/// `UFFDIO_MOVE` with no handler of `VM_UNMAPPED`, one more test. glibc's
/// `ioctl` is variadic: the third word is forwarded as it came.
pub(crate) unsafe extern "C" fn ioctl_hook<const NS: usize>(
    fd: c_int,
    request: libc::c_ulong,
    arg: *mut c_void,
) -> c_int {
    if request as u32 != UFFDIO_MOVE || !wants(bits::VM_UNMAPPED) {
        let orig = original!(ORIG_IOCTL[NS], IoctlFn);
        // SAFETY: the caller's arguments, forwarded to the original.
        return unsafe { orig(fd, request, arg) };
    }
    moving(NS, fd, request, arg)
}

/// [`ioctl_hook`] for a `UFFDIO_MOVE` a handler wants reported, for hook
/// slot `ns`'s libc.
#[cold]
#[inline(never)]
fn moving(ns: usize, fd: c_int, request: libc::c_ulong, arg: *mut c_void) -> c_int {
    let orig = original!(ORIG_IOCTL[slot(ns)], IoctlFn);
    // SAFETY: the caller's arguments, forwarded to the original.
    uffd_move_body(
        move |fd, request, arg| unsafe { orig(fd, request, arg) },
        fd,
        request,
        arg,
    )
}

/// `UFFDIO_MOVE` by `orig` (the ioctl, or the system call by `syscall`):
/// `VM_UNMAPPED` of the source range first, in whole pages, where the
/// kernel would look at the mappings at all. Its `struct uffdio_move` is
/// read without trusting it ([`read_caller`]): one that cannot be read
/// (the call's `EFAULT`), a range or length off a page boundary, a length
/// of 0, a range past the top of the address space or a mode the kernel
/// does not take (its `EINVAL`) reports nothing. Whether `fd` is a
/// userfaultfd is not asked (that costs a look at `/proc`): another
/// device's ioctl of the same number would report its range, a report
/// too many. A move that stops short (`EAGAIN`, a hole in the source
/// without `UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES`) has reported the whole
/// range. Keeps the caller's errno.
fn uffd_move_body(
    orig: impl FnOnce(c_int, libc::c_ulong, *mut c_void) -> c_int,
    fd: c_int,
    request: libc::c_ulong,
    arg: *mut c_void,
) -> c_int {
    keeping_errno(|| {
        let mut m = [UffdioMove::default()];
        if read_caller(arg as usize, &mut m)
            && let Some((src, len)) = moved_range(&m[0])
            && let Some(mut event) = unmapped_bytes(src, len)
        {
            notify(&mut event);
        }
    });
    let own = OwnCall::Ioctl(fd, arg as usize);
    crate::dispatch::run_original(own, || orig(fd, request, arg))
}

/// The source range a `UFFDIO_MOVE` of `m` takes pages from, or `None`
/// where the kernel refuses it before it looks at the mappings
/// (`fs/userfaultfd.c`, `userfaultfd_move`): a start or length off a page
/// boundary, a length of 0, either range past the top of the address
/// space, a mode with other bits.
fn moved_range(m: &UffdioMove) -> Option<(usize, usize)> {
    let page = page_size() as u64;
    let aligned = (m.src | m.dst | m.len) & (page - 1) == 0;
    let fits = |start: u64| start.checked_add(m.len).is_some_and(|end| end <= usize::MAX as u64);
    let valid = aligned && m.len != 0 && fits(m.src) && fits(m.dst) && m.mode & !UFFDIO_MOVE_MODES == 0;
    valid.then_some((m.src as usize, m.len as usize))
}

/// The call a system call made by `syscall(n, a, b, ..)` names, as a host
/// hook of the function that makes it would ([`OwnCall`]).
fn syscall_own_call(n: c_long, a: c_long, b: c_long, c: c_long) -> OwnCall {
    let (a, b) = (a as usize, b as usize);
    match n {
        libc::SYS_ioctl => OwnCall::Ioctl(a as c_int, c as usize),
        libc::SYS_mmap => OwnCall::Mmap(a, b),
        libc::SYS_munmap => OwnCall::Munmap(a, b),
        libc::SYS_mremap => OwnCall::Mremap(a, b),
        libc::SYS_shmat => OwnCall::Shmat(a as c_int, b),
        libc::SYS_shmdt => OwnCall::Shmdt(a),
        libc::SYS_madvise => OwnCall::Madvise(a, b),
        libc::SYS_process_madvise => OwnCall::ProcessMadvise(a as c_int, b),
        libc::SYS_remap_file_pages => OwnCall::RemapFilePages(a, b),
        // brk(0) only asks: never taken for the call's own (a hooker's
        // sbrk may ask before it moves the break).
        libc::SYS_brk if a != 0 => OwnCall::Brk,
        libc::SYS_fallocate => OwnCall::Fallocate(a as c_int),
        libc::SYS_ftruncate => OwnCall::Ftruncate(a as c_int),
        libc::SYS_truncate => OwnCall::Truncate(a),
        libc::SYS_openat | libc::SYS_openat2 => OwnCall::Open(b),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open | libc::SYS_creat => OwnCall::Open(a),
        _ => OwnCall::Other,
    }
}

/// The events of a system call made by `syscall(n, ..)` (`b`, its second
/// argument: an `ioctl`'s request; `d` and `e`, its fourth and fifth: an
/// `mmap`'s flags and descriptor): those of the hooked function that
/// makes it; 0 for every other call (a `futex`, a `gettid`, an `ioctl`
/// but `UFFDIO_MOVE`: just the call).
#[inline(always)]
fn syscall_events(n: c_long, b: c_long, d: c_long, e: c_long) -> u32 {
    match n {
        libc::SYS_ioctl if b as u32 == UFFDIO_MOVE => bits::VM_UNMAPPED,
        libc::SYS_mmap => bits::MMAP | bits::VM_MAPPED | mmap_unmap_bits(d as c_int, e as c_int),
        libc::SYS_munmap => bits::MUNMAP | bits::VM_UNMAPPED,
        libc::SYS_mremap => bits::MREMAP | bits::VM_MAPPED | bits::VM_UNMAPPED,
        libc::SYS_shmat => bits::SHMAT | bits::VM_MAPPED | bits::VM_UNMAPPED,
        libc::SYS_shmdt => bits::SHMDT | bits::VM_UNMAPPED,
        libc::SYS_madvise => bits::MADVISE | bits::VM_UNMAPPED,
        libc::SYS_remap_file_pages => bits::VM_MAPPED | bits::VM_UNMAPPED,
        libc::SYS_brk => bits::BRK | bits::VM_MAPPED | bits::VM_UNMAPPED,
        libc::SYS_process_madvise
        | libc::SYS_fallocate
        | libc::SYS_ftruncate
        | libc::SYS_truncate
        | libc::SYS_openat
        | libc::SYS_openat2 => bits::VM_UNMAPPED,
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open | libc::SYS_creat => bits::VM_UNMAPPED,
        _ => 0,
    }
}

/// The `syscall` hook: a system call that changes the mappings, made by
/// libc's `syscall` function (a library that means to pass other hooks
/// by, as UCM's own originals in its bistro mode; `openat2`, which glibc
/// has no function for), is reported as the hooked function that makes
/// it would be. glibc's `syscall` is variadic: six argument words are
/// taken, and forwarded as they came (the sixth from the caller's stack,
/// which holds it or the caller's own words). Any other call (`futex`,
/// the most frequent) costs a few compares and a call of the original
/// (no measurable time: `--bench host`'s `syscall` group); one made inside a
/// hooked call's original that names what that call works on (another
/// hooker's hook of it that makes the call by `syscall`) is that call's,
/// reported once, by memhook's hook of it; any other, its own
/// ([`OwnCall`]). `brk` is reported as the kernel answers it ([`raw_brk_body`]).
pub(crate) unsafe extern "C" fn syscall_hook<const NS: usize>(
    n: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> c_long {
    if syscall_events(n, b, d, e) == 0 {
        // Another call: straight to the original.
        let orig = original!(ORIG_SYSCALL[NS], SyscallFn);
        // SAFETY: the caller's arguments, forwarded to the original.
        return unsafe { orig(n, a, b, c, d, e, f) };
    }
    // SAFETY: the same arguments, for the same call (a jump: the same
    // signature, the seventh word where the caller left it).
    unsafe { memory_syscall::<NS>(n, a, b, c, d, e, f) }
}

/// [`syscall_hook`] for a call that changes the mappings: its events
/// delivered where a handler wants them, outside another hooked call's
/// original.
#[inline(never)]
unsafe extern "C" fn memory_syscall<const NS: usize>(
    n: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> c_long {
    if !wants(syscall_events(n, b, d, e)) || crate::dispatch::is_own_call(syscall_own_call(n, a, b, c)) {
        let orig = original!(ORIG_SYSCALL[NS], SyscallFn);
        if n == libc::SYS_madvise && crate::kept::may_take(a as *mut c_void, b as usize, c as c_int) {
            // Around memhook's own pages ([`crate::kept`]), by the system
            // call itself.
            // SAFETY: the caller's call.
            let narrowed =
                unsafe { crate::kept::around(a as *mut c_void, b as usize, c as c_int, crate::kept::system_madvise) };
            if narrowed != crate::kept::NOT_KEPT {
                return narrowed as c_long;
            }
        }
        // SAFETY: the caller's arguments, forwarded to the original.
        return unsafe { orig(n, a, b, c, d, e, f) };
    }
    // SAFETY: the caller's arguments of `syscall(n, ..)`.
    unsafe { syscall_body(NS, n, [a, b, c, d, e, f]) }
}

/// [`syscall_hook`] when a handler wants the events of system call `n`
/// (one that [`syscall_events`] names), for namespace `ns`'s libc: the
/// body of the hook of the function that makes it, with the system call
/// as its original. Each result as the kernel's through `syscall`: -1
/// and errno where it fails.
///
/// # Safety
///
/// `args` are the caller's arguments of `syscall(n, ..)`.
#[inline(always)]
unsafe fn syscall_body(ns: usize, n: c_long, args: [c_long; 6]) -> c_long {
    let orig = original!(ORIG_SYSCALL[slot(ns)], SyscallFn);
    // The system call with the arguments a body passes (the words past
    // them 0: the kernel does not read them).
    let sys = move |w: [c_long; 6]| {
        // SAFETY: system call `n`, with the caller's arguments or, for a
        // second try, arguments of the same call derived from them.
        unsafe { orig(n, w[0], w[1], w[2], w[3], w[4], w[5]) }
    };
    let [a, b, c, d, e, _] = args;
    let int = |r: c_long| r as c_int;
    // SAFETY: each body gets the caller's arguments, as the function
    // that makes the call takes them.
    unsafe {
        match n {
            libc::SYS_mmap => mmap_body(
                ns,
                |p, l, pr, fl, fd, off| {
                    sys([p as c_long, l as c_long, pr.into(), fl.into(), fd.into(), off]) as *mut c_void
                },
                a as *mut c_void,
                b as usize,
                c as c_int,
                d as c_int,
                e as c_int,
                args[5] as libc::off_t,
            ) as c_long,
            libc::SYS_munmap => munmap_body(
                ns,
                |p, l| int(sys([p as c_long, l as c_long, 0, 0, 0, 0])),
                a as *mut c_void,
                b as usize,
            )
            .into(),
            libc::SYS_mremap => mremap_body(
                ns,
                |p, o, s, fl, to| {
                    sys([p as c_long, o as c_long, s as c_long, fl.into(), to as c_long, 0]) as *mut c_void
                },
                a as *mut c_void,
                b as usize,
                c as usize,
                d as c_int,
                e as *mut c_void,
            ) as c_long,
            libc::SYS_shmat => shmat_body(
                ns,
                |id, at, fl| sys([id.into(), at as c_long, fl.into(), 0, 0, 0]) as *mut c_void,
                a as c_int,
                b as *const c_void,
                c as c_int,
            ) as c_long,
            libc::SYS_shmdt => shmdt_body(ns, |at| int(sys([at as c_long, 0, 0, 0, 0, 0])), a as *const c_void).into(),
            libc::SYS_madvise => madvise_body(
                ns,
                |p, l, adv| {
                    if crate::kept::may_take(p, l, adv) {
                        // Around memhook's own pages ([`crate::kept`]), by
                        // the system call itself.
                        let narrowed = crate::kept::around(p, l, adv, crate::kept::system_madvise);
                        if narrowed != crate::kept::NOT_KEPT {
                            return narrowed as c_int;
                        }
                    }
                    int(sys([p as c_long, l as c_long, adv.into(), 0, 0, 0]))
                },
                a as *mut c_void,
                b as usize,
                c as c_int,
            )
            .into(),
            libc::SYS_process_madvise => process_madvise_body(
                ns,
                |fd, iov, len, adv, fl| {
                    sys([fd.into(), iov as c_long, len as c_long, adv.into(), fl.into(), 0]) as isize
                },
                a as c_int,
                b as *const libc::iovec,
                c as usize,
                d as c_int,
                e as libc::c_uint,
            ) as c_long,
            libc::SYS_fallocate => fallocate_body(
                ns,
                |fd, mode, off, len| int(sys([fd.into(), mode.into(), off, len, 0, 0])),
                a as c_int,
                b as c_int,
                c as libc::off_t,
                d as libc::off_t,
            )
            .into(),
            libc::SYS_ftruncate => ftruncate_body(
                ns,
                |fd, len| int(sys([fd.into(), len, 0, 0, 0, 0])),
                a as c_int,
                b as libc::off_t,
            )
            .into(),
            libc::SYS_truncate => truncate_body(
                ns,
                |path, len| int(sys([path as c_long, len, 0, 0, 0, 0])),
                a as *const core::ffi::c_char,
                b as libc::off_t,
            )
            .into(),
            libc::SYS_remap_file_pages => remap_file_pages_body(
                ns,
                |p, l, pr, off, fl| int(sys([p as c_long, l as c_long, pr.into(), off as c_long, fl.into(), 0])),
                a as *mut c_void,
                b as usize,
                c as c_int,
                d as usize,
                e as c_int,
            )
            .into(),
            libc::SYS_openat => openat_body(
                ns,
                |dir, path, fl, mode| int(sys([dir.into(), path as c_long, fl.into(), mode.into(), 0, 0])),
                a as c_int,
                b as *const core::ffi::c_char,
                c as c_int,
                d as libc::mode_t,
            )
            .into(),
            libc::SYS_brk => raw_brk_body(|addr| sys([addr as c_long, 0, 0, 0, 0, 0]), a as usize),
            libc::SYS_ioctl => uffd_move_body(
                |fd, request, arg| int(sys([fd.into(), request as c_long, arg as c_long, 0, 0, 0])),
                a as c_int,
                b as libc::c_ulong,
                c as *mut c_void,
            )
            .into(),
            libc::SYS_openat2 => openat2_body(
                a as c_int,
                b as *const core::ffi::c_char,
                c as usize,
                d as usize,
                || sys(args),
            ),
            #[cfg(target_arch = "x86_64")]
            libc::SYS_open => open_body(
                ns,
                |path, fl, mode| int(sys([path as c_long, fl.into(), mode.into(), 0, 0, 0])),
                a as *const core::ffi::c_char,
                b as c_int,
                c as libc::mode_t,
            )
            .into(),
            #[cfg(target_arch = "x86_64")]
            libc::SYS_creat => creat_body(
                ns,
                |path, mode| int(sys([path as c_long, mode.into(), 0, 0, 0, 0])),
                a as *const core::ffi::c_char,
                b as libc::mode_t,
            )
            .into(),
            _ => sys(args),
        }
    }
}

/// `syscall(SYS_brk, addr)` made by `call`: the kernel's answer, the break
/// after the call (`addr` where it moved there; the break as it was
/// where it refused). As glibc's `brk` is reported: `VM_UNMAPPED` of a
/// shrink before ([`break_shrink`]: none below the heap, which the kernel
/// refuses), `BRK` with 0 where the break moved to `addr` (-1 where not),
/// `VM_MAPPED` of a growth after; the break before asked of the kernel,
/// not of glibc (whose own idea of it such a call leaves behind).
/// `brk(0)`, which only asks, is just the call.
fn raw_brk_body(call: impl Fn(usize) -> c_long, addr: usize) -> c_long {
    if addr == 0 {
        return call(0);
    }
    // SAFETY: brk(0) changes nothing and answers the break.
    let top = unsafe { crate::sys::raw(libc::SYS_brk, [0; 6]) } as usize;
    let mut answer = top as c_long;
    break_moved(top, addr, || {
        answer = call(addr);
        if answer as usize == addr { 0 } else { -1 }
    });
    answer
}

/// `struct open_how` (linux/openat2.h): `openat2`'s flags, mode and
/// resolution flags, 24 bytes in its first version.
const OPEN_HOW_FLAGS: usize = 0;
/// The smallest `struct open_how` the kernel takes (`OPEN_HOW_SIZE_VER0`).
const OPEN_HOW_SIZE: usize = 24;

/// `openat2(dirfd, path, how, size)` made by `call`: with `O_TRUNC` in
/// `how`'s flags, as [`openat_body`]: the file's mappings reported
/// before, and again after where a file mapping was made meanwhile. `how`
/// is read without trusting it ([`read_caller`]; the kernel answers
/// `EFAULT` where it cannot be read, and `EINVAL` for a size under the
/// first version's or flags past an `int`, and then empties nothing).
/// The file is looked up as [`emptied`] does, from `dirfd`: where the
/// resolution flags confine the lookup (`RESOLVE_IN_ROOT` makes `dirfd`
/// the root of an absolute path), the file found may be another than the
/// call's, and a report then names a file the call did not empty (one
/// too many; the call's own is missed where it is mapped too).
///
/// # Safety
///
/// `path` and `how` are the caller's, as the call gets them.
#[cold]
#[inline(never)]
unsafe fn openat2_body(
    dirfd: c_int,
    path: *const core::ffi::c_char,
    how: usize,
    size: usize,
    call: impl FnOnce() -> c_long,
) -> c_long {
    let mut flags = [0u64];
    let read = size >= OPEN_HOW_SIZE && keeping_errno(|| read_caller(how + OPEN_HOW_FLAGS, &mut flags));
    match c_int::try_from(flags[0]) {
        Ok(flags) if read && truncates(flags) => {
            let first = emptied(dirfd, path, flags);
            let mut result = 0;
            discarding(first, OwnCall::Open(path as usize), || {
                result = call();
                if result >= 0 { 0 } else { -1 }
            });
            result
        }
        _ => call(),
    }
}

/// Functions of glibc that open a file inside it (by its own `open`,
/// which bistro's patch covers and reloc cannot see), `fopen`,
/// `freopen` and their 64 names: reloc rewrites the
/// program's slots that name them to hooks of their own (as
/// [`open_hook`]: an open that empties a mapped file reports its
/// mappings before the call). Each hook calls the original its slots'
/// rewrite recorded ([`RELOC_ONLY_ORIGINALS`], in this order). Not for
/// bistro: its patch of `open` sees their opens already.
pub(crate) const RELOC_ONLY: usize = 4;

/// The symbols the host hooks give reloc at most: every function, its
/// aliases, and the [`RELOC_ONLY`] ones.
pub(crate) const RELOC_SYMBOLS: usize = FUNCTIONS + ALIASES + RELOC_ONLY;

/// Where reloc records the originals of the [`reloc_only`] functions.
pub(crate) static RELOC_ONLY_ORIGINALS: [AtomicUsize; RELOC_ONLY] = [const { AtomicUsize::new(0) }; RELOC_ONLY];

/// The [`RELOC_ONLY`] functions with their hooks and records.
pub(crate) fn reloc_only() -> [Hooked; RELOC_ONLY] {
    let o = &RELOC_ONLY_ORIGINALS;
    [
        (c"fopen", fopen_hook::<0> as *const () as usize, &o[0]),
        (c"fopen64", fopen_hook::<1> as *const () as usize, &o[1]),
        (c"freopen", freopen_hook::<2> as *const () as usize, &o[2]),
        (c"freopen64", freopen_hook::<3> as *const () as usize, &o[3]),
    ]
}

type FopenFn = unsafe extern "C" fn(*const core::ffi::c_char, *const core::ffi::c_char) -> *mut libc::FILE;
type FreopenFn =
    unsafe extern "C" fn(*const core::ffi::c_char, *const core::ffi::c_char, *mut libc::FILE) -> *mut libc::FILE;

/// The open flags of a `fopen` mode that matter here, as glibc reads it
/// (`_IO_new_file_fopen`): `w` first (`O_CREAT | O_TRUNC`), and an `x`
/// among the next six characters before a `,` (`O_EXCL`); 0 for any
/// other (`r`, `a`: nothing emptied; a mode glibc refuses).
///
/// # Safety
///
/// `mode` is NUL-terminated, or null.
unsafe fn fopen_flags(mode: *const core::ffi::c_char) -> c_int {
    if mode.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract.
    let mode = unsafe { core::ffi::CStr::from_ptr(mode) }.to_bytes();
    if mode.first() != Some(&b'w') {
        return 0;
    }
    let exclusive = mode[1..].iter().take(6).take_while(|&&c| c != b',').any(|&c| c == b'x');
    libc::O_CREAT | libc::O_TRUNC | if exclusive { libc::O_EXCL } else { 0 }
}

/// Makes an open that returns a stream (`call`) as [`open_with`] does,
/// `look` reporting before it where `flags` truncate.
fn stream_open_with(
    flags: c_int,
    path: *const core::ffi::c_char,
    look: impl FnOnce() -> Option<Discard>,
    call: impl FnOnce() -> *mut libc::FILE,
) -> *mut libc::FILE {
    let mut stream = core::ptr::null_mut();
    open_with(flags, OwnCall::Open(path as usize), look, || {
        stream = call();
        if stream.is_null() { -1 } else { 0 }
    });
    stream
}

/// The `fopen` hook (reloc): a mode that begins with `w` empties the file.
unsafe extern "C" fn fopen_hook<const I: usize>(
    path: *const core::ffi::c_char,
    mode: *const core::ffi::c_char,
) -> *mut libc::FILE {
    let orig = original!(RELOC_ONLY_ORIGINALS[I], FopenFn);
    if !wants(bits::VM_UNMAPPED) {
        // SAFETY: forwarded.
        return unsafe { orig(path, mode) };
    }
    // SAFETY: the caller's mode, which fopen reads too.
    let flags = unsafe { fopen_flags(mode) };
    // SAFETY: forwarded.
    stream_open_with(
        flags,
        path,
        || emptied(libc::AT_FDCWD, path, flags),
        || unsafe { orig(path, mode) },
    )
}

/// The `freopen` hook (reloc): as [`fopen_hook`], for the file `path`
/// names or, where it is null, the one `stream` has open (glibc opens it
/// again by its `/proc/self/fd` name).
unsafe extern "C" fn freopen_hook<const I: usize>(
    path: *const core::ffi::c_char,
    mode: *const core::ffi::c_char,
    stream: *mut libc::FILE,
) -> *mut libc::FILE {
    let orig = original!(RELOC_ONLY_ORIGINALS[I], FreopenFn);
    if !wants(bits::VM_UNMAPPED) {
        // SAFETY: forwarded.
        return unsafe { orig(path, mode, stream) };
    }
    // SAFETY: the caller's mode, which freopen reads too.
    let flags = unsafe { fopen_flags(mode) };
    let look = || {
        if !path.is_null() {
            return emptied(libc::AT_FDCWD, path, flags);
        }
        // SAFETY: the caller's open stream, which freopen uses too.
        let fd = keeping_errno(|| unsafe { libc::fileno(stream) });
        let st = stat_of_fd(fd)?;
        report_shrink(&st, 0)
    };
    // SAFETY: forwarded.
    stream_open_with(flags, path, look, || unsafe { orig(path, mode, stream) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps;

    /// Asked as the `syscall` hook asks: from a frame below the original's.
    #[inline(never)]
    fn own(n: c_long, a: c_long) -> bool {
        core::hint::black_box(crate::dispatch::is_own_call(syscall_own_call(n, a, 0, 0)))
    }

    #[test]
    fn a_hookers_brk_query_inside_sbrk_leaves_the_move_its_own() {
        // Another hooker's sbrk hook that asks the break by `syscall`
        // before it moves it: the question is just the call, the move is
        // the original's own (reported once, by memhook's sbrk hook).
        let seen = crate::dispatch::run_original(OwnCall::Brk, || {
            (
                own(libc::SYS_brk, 0),
                own(libc::SYS_brk, 0x1000),
                own(libc::SYS_brk, 0x1000),
            )
        });
        assert_eq!(seen, (false, true, false));
    }

    #[test]
    fn each_alias_has_its_functions_hook_and_a_record_of_its_own() {
        let hooks = functions();
        let hook_of = |name: &str| {
            hooks
                .iter()
                .find(|(n, _, _)| n.to_bytes() == name.as_bytes())
                .unwrap()
                .1
        };
        let aliases = aliases();
        let want = [
            ("mmap64", hook_of("mmap")),
            ("fallocate64", hook_of("fallocate")),
            ("ftruncate64", hook_of("ftruncate")),
            ("truncate64", hook_of("truncate")),
        ];
        for ((alias, hook, record), (name, main_hook)) in aliases.iter().zip(want) {
            assert_eq!(alias.to_bytes(), name.as_bytes());
            assert_eq!(*hook, main_hook, "{name}");
            assert!(
                !hooks.iter().any(|(_, _, o)| core::ptr::eq(*o, *record)),
                "{name}: a record of its own"
            );
        }
    }

    /// A read-write page, and a `PROT_NONE` page after it (with a guard
    /// before it: see [`maps::guarded_pages`]); unmapped when dropped.
    struct Fence(usize);

    impl Fence {
        fn new() -> Fence {
            Fence(maps::guarded_pages(1))
        }

        /// The start of the `PROT_NONE` page.
        fn edge(&self) -> usize {
            self.0 + page_size()
        }
    }

    impl Drop for Fence {
        fn drop(&mut self) {
            maps::unmap_guarded_pages(self.0, 1);
        }
    }

    fn ranges(n: usize) -> Vec<libc::iovec> {
        (0..n)
            .map(|i| libc::iovec {
                iov_base: (0x1000 * (i + 1)) as *mut c_void,
                iov_len: i + 7,
            })
            .collect()
    }

    /// A way of reading the caller's array.
    type Read<'a> = &'a dyn Fn(usize, &mut [libc::iovec]) -> bool;

    fn same(a: &[libc::iovec], b: &[libc::iovec]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.iov_base == y.iov_base && x.iov_len == y.iov_len)
    }

    /// Both ways of reading the caller's array: what they read where it is
    /// readable (aligned or not), and that they refuse, without a fault,
    /// where it is not (null, a `PROT_NONE` page, an array that runs
    /// into one).
    #[test]
    fn the_callers_ranges_are_read_where_readable_and_refused_where_not() {
        let fence = Fence::new();
        let want = ranges(4);
        let bytes = size_of_val(&want[..]);
        let read_kernel = |from: usize, out: &mut [libc::iovec]| read_by_kernel(from, out).unwrap();
        let ways: [(&str, Read); 3] = [
            ("kernel", &read_kernel),
            ("maps", &read_if_mapped::<libc::iovec>),
            ("either", &read_caller::<libc::iovec>),
        ];
        let mut probe = ranges(1);
        let kernel_reads = read_by_kernel(probe.as_ptr() as usize, &mut probe).is_some();
        if !kernel_reads {
            // qemu-user answers ENOSYS; a seccomp filter may refuse it.
            eprintln!("process_vm_readv refused here ({}): the maps way alone", maps::errno());
        }
        for (way, read) in ways.into_iter().filter(|(way, _)| kernel_reads || *way != "kernel") {
            for from in [fence.edge() - bytes, fence.edge() - bytes - 3] {
                // SAFETY: `bytes` bytes before the fence's edge, in its
                // first (writable) page.
                unsafe { core::ptr::copy_nonoverlapping(want.as_ptr().cast::<u8>(), from as *mut u8, bytes) };
                let empty = libc::iovec {
                    iov_base: core::ptr::null_mut(),
                    iov_len: 0,
                };
                let mut out = vec![empty; 4];
                assert!(read(from, &mut out), "{way}: {from:#x}");
                assert!(same(&out, &want), "{way}: {from:#x}");
            }
            let mut out = ranges(4);
            assert!(!read(0, &mut out), "{way}: null");
            assert!(!read(fence.edge(), &mut out), "{way}: PROT_NONE");
            assert!(!read(fence.edge() - 8, &mut out), "{way}: into PROT_NONE");
            assert!(!read(usize::MAX - 8, &mut out), "{way}: past the top");
        }
    }
}

/// The fallocate modes that take pages away from the file's mappings: a
/// hole punched or zeroed in place, or the file's contents shifted from
/// the offset on (collapse, insert). Allocation (mode 0, `KEEP_SIZE`)
/// discards nothing.
const FALLOCATE_DISCARDS: c_int = libc::FALLOC_FL_PUNCH_HOLE
    | libc::FALLOC_FL_ZERO_RANGE
    | libc::FALLOC_FL_COLLAPSE_RANGE
    | libc::FALLOC_FL_INSERT_RANGE;

entry! {
    /// The `fallocate` hook: for a mode that discards, `VM_UNMAPPED` of
    /// each mapped range of the file it discards, before the call.
    fallocate_hook => fallocate_body, ORIG_FALLOCATE as FallocateFn, bits::VM_UNMAPPED,
    (fd: c_int, mode: c_int, offset: libc::off_t, len: libc::off_t) -> c_int
}

/// [`fallocate_hook`] when a handler wants `VM_UNMAPPED`, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn fallocate_body(
    _ns: usize,
    orig: impl Fn(c_int, c_int, libc::off_t, libc::off_t) -> c_int,
    fd: c_int,
    mode: c_int,
    offset: libc::off_t,
    len: libc::off_t,
) -> c_int {
    if mode & FALLOCATE_DISCARDS != 0 && offset >= 0 && len > 0 {
        // Collapse and insert move everything after the offset.
        let end = if mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0 {
            u64::MAX
        } else {
            (offset as u64).saturating_add(len as u64)
        };
        let first = report_file_discard(file_of_fd(fd), offset as u64, end);
        return discarding(first, OwnCall::Fallocate(fd), || orig(fd, mode, offset, len));
    }
    orig(fd, mode, offset, len)
}

entry! {
    /// The `ftruncate` hook: a shrink takes the pages past the new end
    /// from every mapping of the file (private copies too):
    /// `VM_UNMAPPED` of each, before the call.
    ftruncate_hook => ftruncate_body, ORIG_FTRUNCATE as FtruncateFn, bits::VM_UNMAPPED,
    (fd: c_int, length: libc::off_t) -> c_int
}

/// [`ftruncate_hook`] when a handler wants `VM_UNMAPPED`, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn ftruncate_body(
    _ns: usize,
    orig: impl Fn(c_int, libc::off_t) -> c_int,
    fd: c_int,
    length: libc::off_t,
) -> c_int {
    let first = if length >= 0
        && let Some(st) = stat_of_fd(fd)
    {
        report_shrink(&st, length as u64)
    } else {
        None
    };
    discarding(first, OwnCall::Ftruncate(fd), || orig(fd, length))
}

entry! {
    /// The `truncate` hook: as [`ftruncate_hook`], the file named by a path.
    truncate_hook => truncate_body, ORIG_TRUNCATE as TruncateFn, bits::VM_UNMAPPED,
    (path: *const core::ffi::c_char, length: libc::off_t) -> c_int
}

/// [`truncate_hook`] when a handler wants `VM_UNMAPPED`, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn truncate_body(
    _ns: usize,
    orig: impl Fn(*const core::ffi::c_char, libc::off_t) -> c_int,
    path: *const core::ffi::c_char,
    length: libc::off_t,
) -> c_int {
    let mut st = core::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: the kernel reads `path` (a bad pointer is EFAULT, as it is
    // for the call) and fills `st` or fails.
    let first = if length >= 0 && unsafe { libc::stat(path, st.as_mut_ptr()) } == 0 {
        // SAFETY: filled by stat.
        report_shrink(&unsafe { st.assume_init() }, length as u64)
    } else {
        None
    };
    discarding(first, OwnCall::Truncate(path as usize), || orig(path, length))
}

entry! {
    /// The `open` hook (glibc's is variadic: the mode, read only with
    /// `O_CREAT` or `O_TMPFILE`, is forwarded as it came): an open that
    /// truncates ([`truncates`]) empties the file, taking every page from
    /// its mappings: `VM_UNMAPPED` of each, before the call. glibc's own
    /// opens (`fopen`, `freopen`, the fortified `__open_2`; `creat` on
    /// aarch64) call the same code, which bistro's patch covers; reloc
    /// sees the program's calls of `open` and `open64`, and hooks
    /// `fopen` and `freopen` themselves ([`reloc_only`]).
    open_hook => open_body, ORIG_OPEN as OpenFn, bits::VM_UNMAPPED,
    (path: *const core::ffi::c_char, flags: c_int, mode: libc::mode_t) -> c_int
}

/// [`open_hook`] when a handler wants `VM_UNMAPPED`, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn open_body(
    _ns: usize,
    orig: impl Fn(*const core::ffi::c_char, c_int, libc::mode_t) -> c_int,
    path: *const core::ffi::c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    if crate::dispatch::is_own_call(OwnCall::Open(path as usize)) || shm_opens_own(path) {
        // A `creat`'s open of its path ([`creat_hook`]), or a
        // `shm_open`'s of its object's file.
        return orig(path, flags, mode);
    }
    open_with(
        flags,
        OwnCall::Open(path as usize),
        || emptied(libc::AT_FDCWD, path, flags),
        || orig(path, flags, mode),
    )
}

entry! {
    /// The `openat` hook: as [`open_hook`], the path from a directory's
    /// descriptor.
    openat_hook => openat_body, ORIG_OPENAT as OpenatFn, bits::VM_UNMAPPED,
    (dirfd: c_int, path: *const core::ffi::c_char, flags: c_int, mode: libc::mode_t) -> c_int
}

/// [`openat_hook`] when a handler wants `VM_UNMAPPED`, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn openat_body(
    _ns: usize,
    orig: impl Fn(c_int, *const core::ffi::c_char, c_int, libc::mode_t) -> c_int,
    dirfd: c_int,
    path: *const core::ffi::c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    if crate::dispatch::is_own_call(OwnCall::Open(path as usize)) || shm_opens_own(path) {
        // As in [`open_hook`].
        return orig(dirfd, path, flags, mode);
    }
    open_with(
        flags,
        OwnCall::Open(path as usize),
        || emptied(dirfd, path, flags),
        || orig(dirfd, path, flags, mode),
    )
}

entry! {
    /// The `creat` hook: an open with `O_CREAT | O_WRONLY | O_TRUNC`
    /// ([`CREAT_FLAGS`]). glibc makes the `creat` system call where the
    /// kernel has one (x86_64), which no open hook sees, and calls its
    /// `open` where it has not (aarch64): that open, inside this hook's
    /// original and of its path, is this call's, reported here (another
    /// meanwhile, a signal handler's, of another path, is its own: see
    /// [`OwnCall`]).
    creat_hook => creat_body, ORIG_CREAT as CreatFn, bits::VM_UNMAPPED,
    (path: *const core::ffi::c_char, mode: libc::mode_t) -> c_int
}

/// The flags `creat` opens with.
const CREAT_FLAGS: c_int = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;

/// [`creat_hook`] when a handler wants `VM_UNMAPPED`, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn creat_body(
    _ns: usize,
    orig: impl Fn(*const core::ffi::c_char, libc::mode_t) -> c_int,
    path: *const core::ffi::c_char,
    mode: libc::mode_t,
) -> c_int {
    open_with(
        CREAT_FLAGS,
        OwnCall::Open(path as usize),
        || emptied(libc::AT_FDCWD, path, CREAT_FLAGS),
        || orig(path, mode),
    )
}

/// An open (`call`, the hook's `own`) with `flags`: where it truncates
/// ([`truncates`]), `look` reports the file's mappings before it
/// ([`emptied`]), and [`discarding`] looks again after it; else the call
/// alone.
#[inline(always)]
fn open_with(
    flags: c_int,
    own: OwnCall,
    look: impl FnOnce() -> Option<Discard>,
    call: impl FnOnce() -> c_int,
) -> c_int {
    if !truncates(flags) {
        return call();
    }
    discarding(look(), own, call)
}

/// Whether an open of `path` is the one glibc's `shm_open`, inside
/// memhook's hook of it, makes of the object's file: glibc before 2.34
/// keeps `shm_open` in librt, which opens the file by `open`, whose hook
/// would report the truncation a second time. Of that path alone, once
/// (another open inside the original, a signal handler's, is its own).
/// Outside a `shm_open` hook, one look at the thread's mark.
fn shm_opens_own(path: *const core::ffi::c_char) -> bool {
    let OwnCall::ShmOpen(name) = crate::dispatch::own_call_now() else {
        return false;
    };
    if path.is_null() {
        return false;
    }
    let mut file = [0u8; SHM_PATH];
    // SAFETY: `name` is the NUL-terminated name the `shm_open` hook was
    // given, which its caller keeps for the call, inside which this is.
    let Some(file) = (unsafe { shm_path(name as *const core::ffi::c_char, &mut file) }) else {
        return false;
    };
    // SAFETY: the open's NUL-terminated path, which the call reads too.
    file == unsafe { core::ffi::CStr::from_ptr(path) } && crate::dispatch::is_own_call(OwnCall::ShmOpen(name))
}

entry! {
    /// The `shm_open` hook: with `O_TRUNC`, as [`open_hook`], for the
    /// object's file in `/dev/shm` (glibc opens it by a function of its
    /// own, `__open64_nocancel`, which the open hooks do not cover).
    shm_open_hook => shm_open_body, ORIG_SHM_OPEN as ShmOpenFn, bits::VM_UNMAPPED,
    (name: *const core::ffi::c_char, flags: c_int, mode: libc::mode_t) -> c_int
}

/// [`shm_open_hook`] when a handler wants `VM_UNMAPPED`, for namespace `ns`'s libc.
#[inline(always)]
unsafe fn shm_open_body(
    _ns: usize,
    orig: impl Fn(*const core::ffi::c_char, c_int, libc::mode_t) -> c_int,
    name: *const core::ffi::c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> c_int {
    let look = || {
        if name.is_null() {
            return None; // the call's to refuse
        }
        let mut path = [0u8; SHM_PATH];
        // SAFETY: `name` is the caller's NUL-terminated name, which the
        // call reads too; glibc opens the object without following a link.
        let path = unsafe { shm_path(name, &mut path) }?;
        emptied(libc::AT_FDCWD, path.as_ptr(), flags | libc::O_NOFOLLOW)
    };
    open_with(flags, OwnCall::ShmOpen(name as usize), look, || orig(name, flags, mode))
}

/// glibc's directory of shared memory objects (`SHMDIR`).
const SHM_DIR: &[u8] = b"/dev/shm/";
/// Room for [`SHM_DIR`], a name of up to `NAME_MAX` bytes, and its NUL.
const SHM_PATH: usize = SHM_DIR.len() + 256;

/// The file of the shared memory object `name`, as glibc names it
/// (`__shm_get_name`): [`SHM_DIR`] and the name without its leading
/// slashes, in `buf`. `None` for a name glibc refuses for a slash inside
/// it or its length (the call then fails, and nothing is emptied).
///
/// # Safety
///
/// `name` is NUL-terminated.
unsafe fn shm_path(name: *const core::ffi::c_char, buf: &mut [u8; SHM_PATH]) -> Option<&core::ffi::CStr> {
    // SAFETY: the caller's contract.
    let name = unsafe { core::ffi::CStr::from_ptr(name) }.to_bytes();
    let start = name.iter().position(|&b| b != b'/')?;
    let name = &name[start..];
    if name.contains(&b'/') || SHM_DIR.len() + name.len() >= SHM_PATH {
        return None;
    }
    buf[..SHM_DIR.len()].copy_from_slice(SHM_DIR);
    buf[SHM_DIR.len()..SHM_DIR.len() + name.len()].copy_from_slice(name);
    buf[SHM_DIR.len() + name.len()] = 0;
    core::ffi::CStr::from_bytes_until_nul(&buf[..]).ok()
}

/// Whether an open with `flags` empties the regular file it opens, where
/// one is there: `O_TRUNC`, with any access mode (Linux then asks for
/// write permission, and truncates), but for `O_PATH` (which ignores it)
/// and `O_CREAT | O_EXCL` (refused where the file is there).
#[inline(always)]
const fn truncates(flags: c_int) -> bool {
    const EXCLUSIVE: c_int = libc::O_CREAT | libc::O_EXCL;
    flags & libc::O_TRUNC != 0 && flags & libc::O_PATH == 0 && flags & EXCLUSIVE != EXCLUSIVE
}

/// Before an open that truncates: where `path` (from `dirfd`; a symbolic
/// link followed but with `O_NOFOLLOW`, as the open does) names a regular
/// file with bytes, `VM_UNMAPPED` of every mapping of it, which the open
/// leaves with no pages. Nothing where it names nothing (a file the open
/// creates) or no regular file. Keeps the caller's errno.
#[cold]
#[inline(never)]
fn emptied(dirfd: c_int, path: *const core::ffi::c_char, flags: c_int) -> Option<Discard> {
    if path.is_null() {
        return None; // the call's EFAULT
    }
    let nofollow = if flags & libc::O_NOFOLLOW != 0 {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    let st = keeping_errno(|| {
        let mut st = core::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: the kernel reads `path` (a bad pointer is EFAULT, as it
        // is for the call) and fills `st` or fails.
        let found = unsafe { libc::fstatat(dirfd, path, st.as_mut_ptr(), nofollow) } == 0;
        // SAFETY: filled by fstatat where it succeeded.
        found.then(|| unsafe { st.assume_init() })
    })?;
    report_shrink(&st, 0)
}

entry! {
    /// The `remap_file_pages` hook: the pages of a range of a shared
    /// mapping of a file are replaced by other pages of the file (Linux
    /// emulates the call, deprecated since 3.16, with an `mmap` of the
    /// file at the range's address with `MAP_FIXED`): `VM_UNMAPPED` of the
    /// range before the call and `VM_MAPPED` after it, as for an `mmap`
    /// that replaces what lies at its address.
    remap_file_pages_hook => remap_file_pages_body, ORIG_REMAP_FILE_PAGES as RemapFilePagesFn,
    bits::VM_MAPPED | bits::VM_UNMAPPED,
    (addr: *mut c_void, size: usize, prot: c_int, pgoff: usize, flags: c_int) -> c_int
}

/// [`remap_file_pages_hook`] when a handler wants `VM_MAPPED` or
/// `VM_UNMAPPED`, for namespace `ns`'s libc. A failed call has reported
/// `VM_UNMAPPED` of a range it left as it was (a private mapping, a
/// range not mapped): a report too many, as for a `munmap` the kernel
/// refuses once it has looked at the mappings.
#[inline(always)]
unsafe fn remap_file_pages_body(
    _ns: usize,
    orig: impl Fn(*mut c_void, usize, c_int, usize, c_int) -> c_int,
    addr: *mut c_void,
    size: usize,
    prot: c_int,
    pgoff: usize,
    flags: c_int,
) -> c_int {
    let Some((start, bytes)) = remapped_range(addr as usize, size, prot, pgoff) else {
        // Refused before it looks at the mappings.
        return orig(addr, size, prot, pgoff, flags);
    };
    if wants(bits::VM_UNMAPPED) {
        notify_keeping_errno(unmapped_bytes(start, bytes));
    }
    let own = OwnCall::RemapFilePages(addr as usize, size);
    let result = crate::dispatch::run_original(own, || orig(addr, size, prot, pgoff, flags));
    if result == 0 {
        // A new mapping of a file, as an mmap's (see [`FILE_MAPPINGS`]).
        file_mapping_changed();
        if wants(bits::VM_MAPPED) {
            notify_keeping_errno(mapped_bytes(start, bytes));
        }
    }
    result
}

/// The range `remap_file_pages(addr, size, prot, ..)` acts on, as Linux
/// takes it (`mm/mmap.c`): the address rounded down to a page, the size
/// rounded down to whole pages (not the end up, as `munmap` does: a
/// partial last page stays as it was). `None` where Linux refuses the
/// call before it looks at the mappings: `prot` other than 0 (its only
/// valid value), a size under a page, a range past the top of the
/// address space, file pages from `pgoff` past the largest offset.
fn remapped_range(addr: usize, size: usize, prot: c_int, pgoff: usize) -> Option<(usize, usize)> {
    let page = page_size();
    let (start, bytes) = (addr & !(page - 1), size & !(page - 1));
    let valid = prot == 0
        && bytes != 0
        && start.checked_add(bytes).is_some()
        && pgoff.checked_add(bytes >> page.trailing_zeros()).is_some();
    valid.then_some((start, bytes))
}

/// A file's identity: its device (major, minor) and inode.
type FileId = ((u32, u32), u64);

/// The identity of a regular file from its `stat`, if it is one (a pipe
/// or a device has no pages to take from a mapping).
fn file_id(st: &libc::stat) -> Option<FileId> {
    (st.st_mode & libc::S_IFMT == libc::S_IFREG).then(|| ((libc::major(st.st_dev), libc::minor(st.st_dev)), st.st_ino))
}

/// `fstat` of `fd`, if it succeeds (a bad fd: the hooked call fails too).
fn stat_of_fd(fd: c_int) -> Option<libc::stat> {
    let mut st = core::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat fills `st` or fails.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: filled by fstat.
    Some(unsafe { st.assume_init() })
}

/// The identity of the regular file open at `fd`, if any.
fn file_of_fd(fd: c_int) -> Option<FileId> {
    stat_of_fd(fd).as_ref().and_then(file_id)
}

/// A truncation of the file `st` describes to `length` bytes: the pages
/// from the first page boundary at or past `length` go from every
/// mapping of it, if the file shrinks.
fn report_shrink(st: &libc::stat, length: u64) -> Option<Discard> {
    if length < st.st_size as u64 {
        let from = length.checked_next_multiple_of(page_size() as u64).unwrap_or(u64::MAX);
        return report_file_discard(file_id(st), from, u64::MAX);
    }
    None
}

/// A file-discarding call's report before the call: what the second look
/// after it needs.
struct Discard {
    file: FileId,
    from: u64,
    to: u64,
    /// [`FILE_MAPPINGS`] before the first look.
    mappings: u64,
}

/// `VM_UNMAPPED` of each range of the process's mappings of `file` that
/// maps bytes `[from, to)` of it, in whole pages, shared and private
/// mappings alike (a private mapping's pages not yet copied are the
/// file's), in address order; keeps the caller's errno. Looks over the
/// process's mappings of files (`maps::for_each_of_files`: asked of the
/// kernel, or the text of `/proc/self/maps` read, without allocating):
/// these calls are rare, and slow themselves. Where it cannot be read
/// (no descriptor left, no `/proc`), nothing is reported, as for
/// `shmdt`'s size. What
/// [`report_late_discard`] needs after the call.
#[cold]
fn report_file_discard(file: Option<FileId>, from: u64, to: u64) -> Option<Discard> {
    let file = file?;
    if from >= to {
        return None;
    }
    // Before the look: a mapping made after this load may be missed by
    // the look, and is counted after it (the second look's cue).
    let mappings = FILE_MAPPINGS.load(Ordering::SeqCst);
    report_discarded_ranges(file, from, to, 0..0);
    Some(Discard {
        file,
        from,
        to,
        mappings,
    })
}

/// Makes a file-discarding call (`call`: 0, or an open's descriptor, on
/// success; -1 on failure) whose first report was `first`, then
/// [`report_late_discard`] if it succeeded.
fn discarding(first: Option<Discard>, own: OwnCall, call: impl FnOnce() -> c_int) -> c_int {
    let result = crate::dispatch::run_original(own, call);
    if result >= 0 {
        report_late_discard(first);
    }
    result
}

/// After a file-discarding call that succeeded: where a mapping of a file
/// was made or moved since the first look (by another thread, or by a
/// handler of the first report), a second look reports the ranges of
/// `file` again. Late for a mapping the first look missed (the call has
/// taken its pages) but not lost, as the loader's unmaps are: a
/// registration cache that pinned pages of it in between drops them.
/// Every range is reported again, those the first look reported too: a
/// range the same can be a new mapping made where one was unmapped, and
/// a report too many costs a cache a re-registration, one too few a
/// stale one.
#[cold]
fn report_late_discard(first: Option<Discard>) {
    let Some(first) = first else {
        return;
    };
    if FILE_MAPPINGS.load(Ordering::SeqCst) == first.mappings {
        return;
    }
    report_discarded_ranges(first.file, first.from, first.to, 0..0);
}

/// `VM_UNMAPPED` of each range of the mappings of `file` that map its
/// bytes `[from, to)`, in whole pages, in address order, but for ranges
/// inside `own` (a call's own range, which its own dispatch reports).
/// Nothing to look for where the filter of mapped files says the file
/// has no mapping; else the read makes the filter anew.
fn report_discarded_ranges((dev, inode): FileId, from: u64, to: u64, own: core::ops::Range<usize>) {
    if mapped_files::surely_unmapped((dev, inode)) {
        return;
    }
    let page = page_size() as u64;
    let mut filter = mapped_files::Building::begin();
    keeping_errno(|| {
        let read = crate::maps::for_each_of_files(|m| {
            if m.inode != 0 {
                filter.add((m.dev, m.inode));
            }
            if m.dev == dev && m.inode == inode {
                let len = (m.end - m.start) as u64;
                let lo = from.max(m.offset);
                let hi = to.min(m.offset.saturating_add(len));
                if lo < hi {
                    let start = m.start as u64 + ((lo - m.offset) & !(page - 1));
                    let end = (m.start as u64 + (hi - m.offset))
                        .next_multiple_of(page)
                        .min(m.end as u64);
                    let inside = own.start <= start as usize && end as usize <= own.end;
                    if !inside && let Some(mut event) = unmapped_bytes(start as usize, (end - start) as usize) {
                        notify(&mut event);
                    }
                }
            }
            core::ops::ControlFlow::Continue(())
        });
        if read.is_ok() {
            filter.publish();
        }
    });
}

/// Which files the process maps, as the last full look over its mappings
/// of files found them: a filter (4,096 bits, two a file) that
/// answers "surely not mapped" for most files a truncating `open`, an
/// `ftruncate` or a `fallocate` empties, which then skip the read (an
/// `open(O_TRUNC)` of a mapped-nowhere file took 21 us against 2 us
/// unhooked, the read growing with the process's mappings). Only where
/// every mapping of a file made since that read is known:
/// - [`FILE_MAPPINGS`] unchanged since the read began: every mapping of a
///   file the hooks see counts there (mmap, mremap, remap_file_pages,
///   shmat; through `syscall` too), and so does every handler
///   registration (a mapping made while no handler wanted `VM_UNMAPPED`
///   went unseen) and every install and uninstall;
/// - the loader's count of objects loaded unchanged (it maps libraries
///   out of the hooks' sight);
/// - every host function bistro-patched in the main namespace's libc
///   (reloc does not see libc's own calls, as `fopen`'s with mode "m")
///   and no other namespace in use (its libc is hooked after it exists).
///
/// The filter is one writer's at a time (the others skip publishing),
/// read as a sequence lock: a reader that finds it rewritten meanwhile
/// does the read.
mod mapped_files {
    use core::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

    use super::{FILE_MAPPINGS, FileId};

    const WORDS: usize = 64;
    static BITS: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];
    /// 0: no filter; else [`FILE_MAPPINGS`] when its read began, plus 1.
    static STAMP: AtomicU64 = AtomicU64::new(0);
    /// The loader's count of loads when its read began.
    static LOADS: AtomicU64 = AtomicU64::new(0);
    static WRITING: AtomicBool = AtomicBool::new(false);
    /// Set by install where the filter can be trusted (see above).
    pub(super) static SOUND: AtomicBool = AtomicBool::new(false);

    /// The filter's two bits for `file`, as (word, mask) pairs.
    fn bits_of(((major, minor), inode): FileId) -> [(usize, u64); 2] {
        let mut h = inode.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (u64::from(major) << 32 | u64::from(minor)).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        h ^= h >> 29;
        let (a, b) = (h as usize % (WORDS * 64), (h >> 32) as usize % (WORDS * 64));
        [(a / 64, 1 << (a % 64)), (b / 64, 1 << (b % 64))]
    }

    /// A filter being built during a full read.
    pub(super) struct Building {
        bits: [u64; WORDS],
        stamp: u64,
        loads: Option<u64>,
    }

    impl Building {
        /// Begins, before the read: [`FILE_MAPPINGS`] and the loader's
        /// count as they are now. Inlined, so that its 512 bytes are
        /// made in the caller's frame, not copied there (README,
        /// "Stack").
        #[inline(always)]
        pub(super) fn begin() -> Building {
            let stamp = FILE_MAPPINGS.load(Ordering::SeqCst).wrapping_add(1);
            let loads = loads();
            Building {
                bits: [0; WORDS],
                stamp,
                loads,
            }
        }

        /// Notes a mapping of `file` the read found.
        pub(super) fn add(&mut self, file: FileId) {
            for (word, mask) in bits_of(file) {
                self.bits[word] |= mask;
            }
        }

        /// Publishes the filter of a read that went to the end, unless
        /// another thread is publishing one.
        pub(super) fn publish(&self) {
            let Some(loads) = self.loads else {
                return;
            };
            if !SOUND.load(Ordering::Acquire) || WRITING.swap(true, Ordering::Acquire) {
                return;
            }
            STAMP.store(0, Ordering::Relaxed);
            fence(Ordering::Release);
            for (word, &bits) in BITS.iter().zip(&self.bits) {
                word.store(bits, Ordering::Relaxed);
            }
            LOADS.store(loads, Ordering::Relaxed);
            STAMP.store(self.stamp, Ordering::Release);
            WRITING.store(false, Ordering::Release);
        }
    }

    /// Whether `file` surely has no mapping in this process now: the
    /// filter holds, and has neither of its bits.
    pub(super) fn surely_unmapped(file: FileId) -> bool {
        if !SOUND.load(Ordering::Acquire) {
            return false;
        }
        let stamp = STAMP.load(Ordering::Acquire);
        if stamp == 0 || stamp != FILE_MAPPINGS.load(Ordering::SeqCst).wrapping_add(1) {
            return false;
        }
        let found = bits_of(file)
            .iter()
            .all(|&(word, mask)| BITS[word].load(Ordering::Relaxed) & mask != 0);
        let then = LOADS.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if STAMP.load(Ordering::Relaxed) != stamp || found {
            return false;
        }
        loads() == Some(then) && one_namespace()
    }

    /// Whether the main namespace is the only one in use.
    fn one_namespace() -> bool {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        return crate::namespace::in_use() == 0;
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        true
    }

    /// The loader's count of objects loaded so far (`dlpi_adds`), or
    /// `None` where it gives none.
    fn loads() -> Option<u64> {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        return crate::reloc::loader_adds();
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        None
    }
}

/// Forgets the filter of mapped files (a handler registered: mappings of
/// files made while none wanted `VM_UNMAPPED` were not counted).
pub(crate) fn forget_mapped_files() {
    file_mapping_changed();
}

/// Whether the filter of mapped files may be trusted from now on (see
/// `mapped_files`): set by an install that bistro-patched every host
/// function, cleared by every install and uninstall first. Either way
/// the filter there was is forgotten.
pub(crate) fn trust_mapped_files(sound: bool) {
    mapped_files::SOUND.store(sound, Ordering::Release);
    file_mapping_changed();
}

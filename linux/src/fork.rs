//! Forks that find memhook's loader work whole.
//!
//! A child of `fork` has one thread, and a lock that another thread of the
//! parent held at the fork stays held in the child for good. Two kinds
//! matter here:
//!
//! - memhook's own locks over its hook state (reloc's objects and slots,
//!   the install's state, bistro's patches, the trampoline regions): a
//!   child whose `dlopen` rescans, or that calls `install`, `status` or
//!   `refresh`, would wait on them forever;
//! - the loader's lock that `dl_iterate_phdr` holds for its whole walk
//!   (`dl_load_write_lock`), which glibc, unlike its other loader lock,
//!   does not reset in the child (2.36 and 2.39, measured). memhook
//!   walks the loaded objects often, and a walk that reads relocations is
//!   long: a fork during one leaves the child hanging at its next
//!   `dlopen` (memhook's, which walks), or at anything else that walks
//!   (an unwinder, another `dlopen`). Measured:
//!   a thread loading and unloading a library while the main thread forks
//!   200 children, each of which opens a library already loaded: glibc
//!   alone, 0 of 2,000 children hang; memhook installed, 23 to 31 of 200.
//!
//! So every stretch of memhook's work that holds one of those locks, or
//! walks the objects, is a *section* (`fork::Mutex`,
//! `fork::iterate_phdr`), and a `pthread_atfork` handler registered at
//! load makes `fork` wait, before it forks, for the sections other
//! threads are in to end, while new ones wait for the fork to be over.
//! The child then finds memhook's locks free and no walk of memhook's
//! holding the loader's. (The loader's own holders: below.)
//!
//! The wait is bounded ([`LIMIT_NS`]): a section may itself wait for what
//! the forking thread holds (an install asks the loader for a symbol
//! while the forking thread runs a library constructor, which holds the
//! loader's lock), and the fork then goes ahead after the bound, as it did before,
//! counted in [`waits_given_up`]. A thread that forks from inside a
//! section (a handler of an event memhook sends while it holds a lock:
//! the mapping of a trampoline page during an install) does not wait for
//! itself.
//!
//! The hooks' hot paths never enter a section: dispatch takes no lock.
//! (The CUDA hooks' tables of IPC opens and graph ranges are sections,
//! taken for a few loads and stores beside driver calls that take
//! microseconds.)
//! The memory-type map's writer lock is not a section either: the CUDA
//! hooks take it after each allocation and free, and a fork need not wait
//! for them. The child mends the map instead (`memtype::after_fork_in_child`):
//! a writer changes only the table readers are not using, so the live
//! table is whole at any moment, and the child lets the lock go and
//! copies the live table over the spare one.
//!
//! # The loader's lock, let go in the child
//!
//! The sections keep memhook's own walks out of a fork. The loader's other
//! holders of `dl_load_write_lock` are not memhook's to wait for: another
//! library's `dl_iterate_phdr` (an unwinder's, a profiler's), and a
//! `dlopen` or `dlclose` while it adds or removes objects. A child forked
//! during one of them hangs at its next walk, with or without memhook
//! (a walk: its `dlopen` of a new library, an unwinder; memhook's entries
//! of the loader's functions walk too: below). glibc lets the loader's
//! other lock go in the child (`dl_load_lock`, which `dlopen` and
//! `dlclose` hold for their whole work), not this one.
//!
//! The child handler lets it go where the fork cut a walk and nothing
//! else: where the child finds it held and the loader says no change of
//! any namespace's objects was under way (each `r_state`
//! `RT_CONSISTENT`: `crate::namespace::at_rest`). The holder was then a
//! thread the fork left behind inside a walk, which only reads, or the
//! forking thread itself, forking from inside a walk (which cannot let it
//! go in the child: glibc's unlock refuses a thread whose id is not the
//! owner's, and the child's thread has a new one; the unlock at the
//! walk's end is then refused and changes nothing). The child's list of
//! objects is whole. Two threads walking without pause beside the forks
//! (`linux/tests/fork_loader.rs`): without this, 79 of 100 children hung
//! at their `dlopen`; with it, none.
//!
//! Amid a change (`RT_ADD` while a `dlopen` maps objects, `RT_DELETE`
//! while a `dlclose` unmaps them) the lock stays held: the child's list
//! may name objects half mapped or already unmapped, and a walk would read
//! them (let go there, a child's walk crashed, and glibc's own next
//! `dlopen` stops at its assertion that the state is `RT_ADD`). Such a
//! child hangs at its next walk, as without memhook (10 to 18 of 100
//! beside a thread loading and unloading a library in a loop, at their
//! `dlopen` of another library). No object can then come or go in it (the
//! loader's own `dlopen` of a new library and `dlclose` of a last handle
//! wait for the lock first), so memhook's entries of the loader's
//! functions skip their walks there ([`loader_lock_stuck`]): the child's
//! `dlopen` of a library already loaded, `dlsym` and `dlclose`, which
//! glibc alone makes without a walk, go through (13 and 16 of 100 hung in
//! memhook's walks before).
//!
//! The lock is a recursive `pthread_mutex_t` inside `_rtld_global`, at an
//! offset glibc does not publish (2,608 bytes in 2.36). It is found at
//! load, not assumed: inside a walk of its own the loading thread looks
//! through `_rtld_global` for the one recursive mutex that this thread
//! owns once, and after the walk finds it free. Where not exactly one
//! place fits (a static program, another C library), or the loader's
//! states cannot be read (glibc before 2.35, a main program without
//! `DT_DEBUG`), nothing is let go, and [`loader_lock_found`] says so.

use core::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// How long a fork waits for the sections in progress on other threads.
pub const LIMIT_NS: u64 = 1_000_000_000;

/// Sections in progress, one per thread that is in any (nested ones count
/// once).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Forks being prepared or made: new sections wait while it is not 0.
static FORKING: AtomicUsize = AtomicUsize::new(0);
/// Forks that went ahead after [`LIMIT_NS`] with sections still in
/// progress.
static GIVEN_UP: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's section depth. No destructor (see `dispatch::Local`).
    static DEPTH: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
}

/// A section of memhook's work that a fork must not cut (see the module
/// docs); it ends when dropped. Neither `Send` nor `Sync`: it belongs to
/// the thread that entered it.
pub(crate) struct Section {
    _thread: core::marker::PhantomData<*const ()>,
}

/// Enters a section: where a fork is being prepared and this thread is in
/// no section yet, waits for it first.
pub(crate) fn section() -> Section {
    match enter(true) {
        Some(section) => section,
        None => unreachable!("an entry that waits always enters"),
    }
}

/// Enters a section unless that would wait: `None` where a fork is being
/// prepared and this thread is in no section yet. For code that runs
/// where the forking thread may need what this thread holds (the loader's
/// lock, inside the loader's breakpoint: another library's fork handler
/// may call `dlsym`), which must not wait for the fork.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn try_section() -> Option<Section> {
    enter(false)
}

/// [`section`] where `wait`, else [`try_section`].
fn enter(wait: bool) -> Option<Section> {
    let depth = DEPTH.with(|d| d.get());
    if depth == 0 {
        loop {
            while FORKING.load(Ordering::SeqCst) != 0 {
                if !wait {
                    return None;
                }
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
            ACTIVE.fetch_add(1, Ordering::SeqCst);
            // A fork that began meanwhile may have looked at ACTIVE before
            // the increment: step back out and wait for it (or give up).
            if FORKING.load(Ordering::SeqCst) == 0 {
                break;
            }
            ACTIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    DEPTH.with(|d| d.set(depth + 1));
    Some(Section {
        _thread: core::marker::PhantomData,
    })
}

impl Drop for Section {
    fn drop(&mut self) {
        let depth = DEPTH.with(|d| {
            let depth = d.get() - 1;
            d.set(depth);
            depth
        });
        if depth == 0 {
            ACTIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Whether this thread is in a section: it counts once in `ACTIVE`.
fn own() -> usize {
    usize::from(DEPTH.with(|d| d.get()) > 0)
}

pub(crate) fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-parameter; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Before `fork`: keeps new sections out and waits (up to [`LIMIT_NS`])
/// for those in progress on other threads to end.
extern "C" fn prepare() {
    FORKING.fetch_add(1, Ordering::SeqCst);
    let own = own();
    let start = now_ns();
    while ACTIVE.load(Ordering::SeqCst) > own {
        if now_ns().saturating_sub(start) > LIMIT_NS {
            GIVEN_UP.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

/// After `fork`, in the parent: sections may begin again.
extern "C" fn parent() {
    FORKING.fetch_sub(1, Ordering::SeqCst);
}

/// After `fork`, in the child: this thread is the only one, so only its
/// own section (if it forked from inside one) is in progress, and no
/// other fork is being made.
extern "C" fn child() {
    ACTIVE.store(own(), Ordering::SeqCst);
    FORKING.store(0, Ordering::SeqCst);
    let_loader_lock_go();
    crate::memtype::after_fork_in_child();
    crate::maps::after_fork_in_child();
    crate::kept::after_fork_in_child();
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    crate::cuda::after_fork_in_child();
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    crate::evacuate::after_fork_in_child();
}

extern "C" fn register_at_load() {
    LOADER_LOCK.store(find_loader_lock(), Ordering::Relaxed);
    // SAFETY: the three handlers touch only this module's atomics, the
    // calling thread's section depth and (the child's) the loader's lock
    // over its objects, the memory-type map, the CUDA hooks' count of
    // runtime calls and the counts of threads moved out of patches, and
    // never fail.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

/// Where glibc's `dl_load_write_lock` is (see the module docs); 0 where
/// it was not found.
static LOADER_LOCK: AtomicUsize = AtomicUsize::new(0);
/// What a fork's child found of that lock: one of the three states
/// below, set by every child's handler (a grandchild's too), so the two
/// answers built on it ([`loader_lock_let_go`], [`loader_lock_stuck`])
/// can never both hold.
static LOADER_LOCK_AT_FORK: AtomicU8 = AtomicU8::new(LOCK_FREE);
/// Not a fork's child, or one that found the lock free.
const LOCK_FREE: u8 = 0;
/// A child that found the lock held and let it go.
const LOCK_LET_GO: u8 = 1;
/// A child that found it held amid a change of the objects, and kept it so.
const LOCK_KEPT: u8 = 2;

/// The words of glibc's `pthread_mutex_t` that say who holds it (the same
/// on x86_64 and aarch64): the lock word, the recursion count, the owner's
/// thread id, the users; then the kind.
const MUTEX_LOCK: usize = 0;
const MUTEX_COUNT: usize = 1;
const MUTEX_OWNER: usize = 2;
const MUTEX_USERS: usize = 3;
const MUTEX_KIND: usize = 4;
/// `PTHREAD_MUTEX_RECURSIVE_NP`, the loader's locks' kind.
const RECURSIVE: u32 = 1;
/// `RTLD_DL_SYMENT`: `dladdr1` gives the symbol's table entry.
const RTLD_DL_SYMENT: libc::c_int = 1;

/// The words of the mutex at `at`.
///
/// # Safety
///
/// `at` is 4-byte aligned and the 20 bytes from it are readable and
/// writable for as long as the slice is used (inside `_rtld_global`).
unsafe fn mutex_words<'a>(at: usize) -> &'a [AtomicU32; 5] {
    // SAFETY: from the caller; glibc changes these words with atomic
    // instructions, so reading them as atomics is sound beside it.
    unsafe { &*(at as *const [AtomicU32; 5]) }
}

/// What the walk in [`find_loader_lock`] looks through, and what it found.
struct LockSearch {
    base: usize,
    len: usize,
    me: u32,
    found: heapless::Vec<usize, 4>,
    more: bool,
}

/// Inside the loader's walk (holding its lock once): the recursive
/// mutexes of `_rtld_global` this thread holds once.
unsafe extern "C" fn held_here(
    _: *mut libc::dl_phdr_info,
    _: libc::size_t,
    data: *mut core::ffi::c_void,
) -> libc::c_int {
    // SAFETY: `find_loader_lock` passes its `LockSearch`, which outlives
    // the walk.
    let search = unsafe { &mut *data.cast::<LockSearch>() };
    let mut at = search.base;
    while at + 20 <= search.base + search.len {
        // SAFETY: `at` is 8-byte aligned (the symbol is, and the step is
        // 8) and 20 bytes from it lie inside `_rtld_global`.
        let w = unsafe { mutex_words(at) };
        if w[MUTEX_LOCK].load(Ordering::Relaxed) != 0
            && w[MUTEX_COUNT].load(Ordering::Relaxed) == 1
            && w[MUTEX_OWNER].load(Ordering::Relaxed) == search.me
            && w[MUTEX_USERS].load(Ordering::Relaxed) == 1
            && w[MUTEX_KIND].load(Ordering::Relaxed) == RECURSIVE
            && search.found.push(at).is_err()
        {
            search.more = true;
        }
        at += 8;
    }
    1
}

/// Finds glibc's `dl_load_write_lock` (see the module docs): 0 where
/// not exactly one place fits, or where the loader's states of its
/// namespaces cannot be read (glibc before 2.35, no `DT_DEBUG`).
fn find_loader_lock() -> usize {
    if !crate::reloc::sees_namespaces() {
        return 0;
    }
    // SAFETY: a NUL-terminated name; RTLD_DEFAULT searches the program's
    // objects in load order.
    let base = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_rtld_global".as_ptr()) } as usize;
    if base == 0 || !base.is_multiple_of(8) {
        return 0;
    }
    // SAFETY: a zeroed Dl_info is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let mut sym: *mut core::ffi::c_void = core::ptr::null_mut();
    // SAFETY: valid out-parameters; with RTLD_DL_SYMENT glibc stores a
    // pointer to the symbol's entry in the loader's own symbol table.
    let known = unsafe { libc::dladdr1(base as *const _, &mut info, &mut sym, RTLD_DL_SYMENT) };
    if known == 0 || sym.is_null() || info.dli_saddr as usize != base {
        return 0;
    }
    // SAFETY: `sym` points at the Elf64_Sym dladdr1 found, in the loader's
    // mapped dynamic symbol table.
    let len = unsafe { (*sym.cast::<libc::Elf64_Sym>()).st_size } as usize;
    let mut search = LockSearch {
        base,
        len,
        me: crate::sys::gettid() as u32,
        found: heapless::Vec::new(),
        more: false,
    };
    // SAFETY: `held_here` reads `search` as the LockSearch it is.
    unsafe { iterate_phdr(held_here, (&raw mut search).cast()) };
    // After the walk the loader's write lock is free; a lock this thread
    // held before (the loader's other one, during a `dlopen`) still is.
    let mut free = search.found.iter().filter(|&&at| {
        // SAFETY: found inside `_rtld_global` above.
        let w = unsafe { mutex_words(at) };
        w[MUTEX_LOCK].load(Ordering::Relaxed) == 0
            && w[MUTEX_COUNT].load(Ordering::Relaxed) == 0
            && w[MUTEX_OWNER].load(Ordering::Relaxed) == 0
    });
    match (free.next(), free.next(), search.more) {
        (Some(&at), None, false) => at,
        _ => 0,
    }
}

/// In the child: marks the loader's write lock free where the fork left
/// it held (see the module docs).
fn let_loader_lock_go() {
    let at = LOADER_LOCK.load(Ordering::Relaxed);
    if at == 0 {
        return;
    }
    // SAFETY: found inside `_rtld_global` at load; the loader is never
    // unloaded.
    let w = unsafe { mutex_words(at) };
    let held = w[MUTEX_LOCK].load(Ordering::Relaxed) != 0 || w[MUTEX_COUNT].load(Ordering::Relaxed) != 0;
    // Held amid a change of the objects (a `dlopen` mapping them, a
    // `dlclose` unmapping them), the lock stays held: the child's list
    // may name objects half mapped or already gone, and a walk would
    // read them (glibc's own next `dlopen` stops at an assertion there).
    let let_go = held && crate::namespace::at_rest();
    let state = match (held, let_go) {
        (false, _) => LOCK_FREE,
        (true, true) => LOCK_LET_GO,
        (true, false) => LOCK_KEPT,
    };
    LOADER_LOCK_AT_FORK.store(state, Ordering::Relaxed);
    if let_go {
        // The child has one thread: nothing takes the lock meanwhile. As
        // glibc's initializer leaves it, the kind kept.
        for word in [MUTEX_OWNER, MUTEX_USERS, MUTEX_COUNT, MUTEX_LOCK] {
            w[word].store(0, Ordering::SeqCst);
        }
    }
}

/// Whether memhook found the loader's lock over its list of objects
/// (glibc's `dl_load_write_lock`), which a fork's child whose fork cut
/// another thread's walk of the objects then finds free (see the module
/// docs). `false` in a static program, before glibc 2.35, in a main
/// program without `DT_DEBUG`, or with another C library: such a child
/// then hangs at its next walk, as it would without memhook.
pub fn loader_lock_found() -> bool {
    LOADER_LOCK.load(Ordering::Relaxed) != 0
}

/// Whether this process is the child of a fork that cut a walk of the
/// loaded objects, and memhook let go the loader's lock the walk held
/// (see [`loader_lock_found`]).
pub fn loader_lock_let_go() -> bool {
    LOADER_LOCK_AT_FORK.load(Ordering::Relaxed) == LOCK_LET_GO
}

/// Whether this process is the child of a fork that cut another
/// thread's change of the loaded objects (a `dlopen` mapping them, a
/// `dlclose` unmapping them), and the loader's lock over them, which
/// that thread held, is still held: for good, its holder being gone.
///
/// No object can then come or go in this process: the loader's own
/// `dlopen` of a new library and `dlclose` of its last handle wait for
/// that lock first. So memhook's entries of `dlopen`, `dlclose`, `dlsym`
/// and `dlvsym` skip their walks of the objects (the rescans, the look
/// for new namespaces, the search for the next definition of a hooked
/// function for `RTLD_NEXT`, which is then the loader's answer: the
/// function itself, whose calls bistro sees and reloc does not), and the
/// child's `dlopen` of a library already loaded, its `dlsym` and its
/// `dlclose` of a handle still open elsewhere go through, as without
/// memhook, where before they waited for good. [`crate::refresh`] does
/// nothing there; [`crate::status`] and an install of the configuration
/// in force answer as ever; an install of another configuration and an
/// uninstall, which must walk the objects, still wait.
pub fn loader_lock_stuck() -> bool {
    let at = LOADER_LOCK.load(Ordering::Relaxed);
    // SAFETY: found inside `_rtld_global` at load; the loader is never
    // unloaded.
    LOADER_LOCK_AT_FORK.load(Ordering::Relaxed) == LOCK_KEPT
        && at != 0
        && unsafe { mutex_words(at) }[MUTEX_LOCK].load(Ordering::Relaxed) != 0
}

#[used]
#[unsafe(link_section = ".init_array")]
static REGISTER_AT_LOAD: extern "C" fn() = register_at_load;

/// Forks that went ahead after waiting [`LIMIT_NS`] for memhook's work on
/// other threads (a child of such a fork may find a lock of memhook's
/// held). 0 unless a thread forked while another waited, inside memhook,
/// for something the forking thread held.
pub fn waits_given_up() -> u64 {
    GIVEN_UP.load(Ordering::Relaxed)
}

/// A spin lock whose holder is in a section: a fork waits for it to be
/// let go, so that the child finds it free. (For locks of memhook's
/// crates that a child may take; not for a lock held while waiting on
/// another thread.)
pub struct Mutex<T> {
    inner: spin::Mutex<T>,
}

/// A held [`Mutex`]: the lock is let go before the section ends.
pub struct Guard<'a, T> {
    guard: spin::MutexGuard<'a, T>,
    _section: Section,
}

/// Whether this thread is in a section: it holds one of memhook's locks
/// or is taking one (a [`Mutex`] enters its section before it asks and
/// leaves it after it lets go), or walks the loaded objects with the
/// loader's lock held ([`iterate_phdr`], the loader's breakpoint). Where
/// code running on the thread asks then, it is a signal handler that
/// interrupted memhook's own work (memhook runs no handler of its users
/// in a section), and a wait for a lock could be a wait for the
/// interrupted work, which goes on only when the handler returns: an
/// install, uninstall or status asked for there returns at once instead
/// (`crate::install::inside_memhook`).
pub(crate) fn inside_lock() -> bool {
    own() != 0
}

impl<T> Mutex<T> {
    /// A lock over `value`.
    pub const fn new(value: T) -> Self {
        Mutex {
            inner: spin::Mutex::new(value),
        }
    }

    /// Takes the lock (entering a section first).
    pub fn lock(&self) -> Guard<'_, T> {
        let section = section();
        Guard {
            guard: self.inner.lock(),
            _section: section,
        }
    }

    /// Takes the lock if it is free (entering a section first, which may
    /// wait for a fork being made).
    pub fn try_lock(&self) -> Option<Guard<'_, T>> {
        let section = section();
        self.inner.try_lock().map(|guard| Guard {
            guard,
            _section: section,
        })
    }
}

impl<T> core::ops::Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> core::ops::DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

/// `dl_iterate_phdr` inside a [`Section`]: a fork waits for the walk.
///
/// # Safety
///
/// As for `dl_iterate_phdr`: `callback` must treat `data` as what the
/// caller passes.
pub(crate) unsafe fn iterate_phdr(
    callback: unsafe extern "C" fn(*mut libc::dl_phdr_info, libc::size_t, *mut core::ffi::c_void) -> libc::c_int,
    data: *mut core::ffi::c_void,
) -> libc::c_int {
    let _section = section();
    // SAFETY: forwarded from the caller.
    unsafe { libc::dl_iterate_phdr(Some(callback), data) }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Barrier};

    /// The tests that fork (here and in other modules) and read the
    /// global counters: one at a time.
    pub(crate) static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Forks; the child exits with `child()`'s answer (0: right); returns
    /// the child's exit status.
    pub(crate) fn fork_and_check(child: impl FnOnce() -> i32) -> i32 {
        // SAFETY: the child runs `child`, which touches only memory
        // inherited from this thread, and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = child();
            // SAFETY: leaving the child without the parent's atexit.
            unsafe { libc::_exit(code) };
        }
        exit_code(pid)
    }

    /// Waits for the child `pid` (as `fork` returned it) and returns its
    /// exit code; it must have exited.
    fn exit_code(pid: libc::pid_t) -> i32 {
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waiting for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        libc::WEXITSTATUS(status)
    }

    /// What a signal handler learns from [`inside_lock`] on a thread that
    /// waits for one of memhook's locks (held here by the test's thread),
    /// and on the same thread once it has taken and let go of it: inside,
    /// then not. A `try_lock` that fails and nested locks leave the count
    /// right. This is what keeps an install asked for by a signal handler
    /// from waiting for good on the lock its own thread holds or waits for
    /// (`crate::install::inside_memhook`).
    #[test]
    fn a_thread_is_inside_memhooks_locks_from_asking_until_letting_go() {
        static A: Mutex<u32> = Mutex::new(0);
        static B: Mutex<u32> = Mutex::new(0);
        // 0: no answer yet; 1: inside; 2: not inside.
        static SEEN: AtomicU32 = AtomicU32::new(0);
        extern "C" fn look(_: libc::c_int) {
            SEEN.store(if inside_lock() { 1 } else { 2 }, Ordering::SeqCst);
        }
        // (Without bistro nothing else takes a signal's action.)
        #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
        let _one = crate::evacuate::SIGNAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: a handler that reads a thread-local and stores an
        // atomic, for a signal nothing else in these tests uses while
        // they hold SIGNAL_TESTS.
        let was = unsafe { libc::signal(libc::SIGUSR2, look as *const () as usize) };
        assert_ne!(was, libc::SIG_ERR);
        assert!(!inside_lock());
        let held = A.lock();
        assert!(inside_lock());
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let waiter = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            // A is held: the try fails, and counts nothing.
            let failed = A.try_lock().is_some();
            let failed = failed || inside_lock();
            {
                let _a = A.lock();
                let _b = B.lock();
            }
            let after = inside_lock();
            tid_tx.send(0).unwrap();
            go_rx.recv().unwrap();
            (failed, after)
        });
        let tid = tid_rx.recv().unwrap();
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let signal = |tid: i32| {
            SEEN.store(0, Ordering::SeqCst);
            // SAFETY: tgkill of this process's thread with a signal whose
            // handler is `look`.
            assert_eq!(unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR2) }, 0);
            let start = now_ns();
            while SEEN.load(Ordering::SeqCst) == 0 && now_ns() - start < 10_000_000_000 {
                std::thread::yield_now();
            }
            SEEN.load(Ordering::SeqCst)
        };
        // Until the waiter is in `A.lock()` (it may not be there yet).
        let start = now_ns();
        let mut inside = false;
        while !inside && now_ns() - start < 10_000_000_000 {
            inside = signal(tid) == 1;
        }
        drop(held);
        assert_eq!(tid_rx.recv().unwrap(), 0);
        let after_signal = signal(tid);
        go_tx.send(()).unwrap();
        let (failed, after) = waiter.join().unwrap();
        // SAFETY: restores the action found.
        unsafe { libc::signal(libc::SIGUSR2, was) };
        assert!(inside, "a signal handler on a thread waiting for a lock saw it outside");
        assert!(!failed, "a try_lock of a held lock took it, or left the thread inside");
        assert!(!after, "a thread that let go of its locks is still inside");
        assert_eq!(
            after_signal, 2,
            "a signal handler on a thread that let go saw it inside"
        );
        assert!(!inside_lock());
    }

    /// glibc's version as (major, minor).
    fn glibc() -> (u32, u32) {
        // SAFETY: gnu_get_libc_version returns a static NUL-terminated
        // string.
        let v = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
        let mut parts = v.to_str().unwrap().split('.').map(|p| p.parse::<u32>().unwrap());
        (parts.next().unwrap(), parts.next().unwrap())
    }

    #[test]
    fn the_loaders_lock_over_its_objects_is_found_on_glibc_2_35_and_later() {
        if glibc() < (2, 35) || !crate::namespace::debugger_interface() {
            eprintln!(
                "skipped: glibc {:?}, a debugger interface: {}",
                glibc(),
                crate::namespace::debugger_interface()
            );
            return;
        }
        assert!(loader_lock_found());
        // This process is no child of a fork that found it held.
        assert!(!loader_lock_let_go());
    }

    /// A walk of the loader's that stays inside (holding its lock) while
    /// `*data`'s flag is set, having raised its first.
    unsafe extern "C" fn stay(
        _: *mut libc::dl_phdr_info,
        _: libc::size_t,
        data: *mut core::ffi::c_void,
    ) -> libc::c_int {
        // SAFETY: the test passes a `[AtomicBool; 2]` that outlives the walk.
        let [inside, hold] = unsafe { &*data.cast::<[AtomicBool; 2]>() };
        inside.store(true, Ordering::SeqCst);
        while hold.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        1
    }

    unsafe extern "C" fn count(
        _: *mut libc::dl_phdr_info,
        _: libc::size_t,
        data: *mut core::ffi::c_void,
    ) -> libc::c_int {
        // SAFETY: the caller passes a usize that outlives the walk.
        unsafe { *data.cast::<usize>() += 1 };
        0
    }

    /// In a child: walks the loaded objects (killed by SIGALRM after 10 s
    /// where the walk waits on a lock left held); 0 where it went through
    /// and memhook let the loader's lock go, 1 where the walk found no
    /// object, 2 where the lock was not let go.
    fn walk_in_child() -> i32 {
        // SAFETY: alarm has no preconditions; SIGALRM's default action
        // ends the child, which the parent sees as not exited.
        unsafe { libc::alarm(10) };
        let mut objects = 0usize;
        // SAFETY: `count` reads the usize passed.
        unsafe { libc::dl_iterate_phdr(Some(count), (&raw mut objects).cast()) };
        if objects == 0 {
            1
        } else if !loader_lock_let_go() {
            2
        } else {
            0
        }
    }

    #[test]
    fn a_child_forked_while_another_thread_walks_the_loaded_objects_can_walk_them() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !loader_lock_found() {
            eprintln!("skipped: the loader's lock was not found (glibc {:?})", glibc());
            return;
        }
        // Another library's walk (an unwinder's, say), not memhook's: the
        // fork does not wait for it.
        let flags: &'static [AtomicBool; 2] = Box::leak(Box::new([AtomicBool::new(false), AtomicBool::new(true)]));
        let walker = std::thread::spawn(move || {
            // SAFETY: `stay` reads the flags, which live for good.
            unsafe { libc::dl_iterate_phdr(Some(stay), (flags as *const [AtomicBool; 2]).cast_mut().cast()) };
        });
        while !flags[0].load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        let code = fork_and_check(walk_in_child);
        flags[1].store(false, Ordering::SeqCst);
        walker.join().unwrap();
        assert_eq!(
            code, 0,
            "1: the child's walk found no object, 2: the lock was not let go"
        );
        assert!(!loader_lock_let_go(), "the parent let nothing go");
    }

    #[test]
    fn a_child_forked_from_inside_a_walk_can_walk_again() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        if !loader_lock_found() {
            eprintln!("skipped: the loader's lock was not found (glibc {:?})", glibc());
            return;
        }
        unsafe extern "C" fn fork_here(
            _: *mut libc::dl_phdr_info,
            _: libc::size_t,
            data: *mut core::ffi::c_void,
        ) -> libc::c_int {
            // SAFETY: the test passes a pid_t that outlives the walk; the
            // child of the fork leaves the walk and ends below with _exit.
            unsafe { *data.cast::<libc::pid_t>() = libc::fork() };
            1
        }
        let mut pid: libc::pid_t = -1;
        // SAFETY: `fork_here` writes the pid_t passed.
        unsafe { libc::dl_iterate_phdr(Some(fork_here), (&raw mut pid).cast()) };
        if pid == 0 {
            // The child left its walk, whose unlock glibc refused (its
            // thread's id is not the owner's): a walk now would wait for
            // good, had memhook not let the lock go.
            let code = walk_in_child();
            // SAFETY: leaving the child without the parent's atexit.
            unsafe { libc::_exit(code) };
        }
        // Killed by its alarm where its walk hung.
        assert_eq!(exit_code(pid), 0, "1: no object, 2: the lock was not let go");
    }

    #[test]
    fn a_fork_waits_for_another_threads_section_to_end() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let given_up = waits_given_up();
        let entered = Arc::new(Barrier::new(2));
        let left = Arc::new(AtomicBool::new(false));
        let holder = {
            let (entered, left) = (entered.clone(), left.clone());
            std::thread::spawn(move || {
                let section = section();
                entered.wait();
                // Long enough that a fork not waiting would come first.
                std::thread::sleep(std::time::Duration::from_millis(100));
                left.store(true, Ordering::SeqCst);
                drop(section);
            })
        };
        entered.wait();
        // The child is a copy of the parent as the fork found it: the
        // section had ended, and the child is in none.
        let code = fork_and_check(|| {
            let ended = left.load(Ordering::SeqCst);
            let free = ACTIVE.load(Ordering::SeqCst) == 0 && FORKING.load(Ordering::SeqCst) == 0;
            i32::from(!ended) | i32::from(!free) << 1
        });
        assert_eq!(
            code, 0,
            "1: forked inside the other thread's section, 2: counters not reset"
        );
        assert!(left.load(Ordering::SeqCst));
        holder.join().unwrap();
        assert_eq!(waits_given_up(), given_up);
        // New sections go ahead after the fork.
        drop(section());
    }

    #[test]
    fn a_thread_forking_from_inside_a_section_does_not_wait_for_itself() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let given_up = waits_given_up();
        let outer = section();
        let inner = section(); // nested: counted once
        assert_eq!(DEPTH.with(|d| d.get()), 2);
        let code = fork_and_check(|| {
            // The child's thread is still in its two sections, counted once.
            let counted = ACTIVE.load(Ordering::SeqCst) == 1 && DEPTH.with(|d| d.get()) == 2;
            drop(section());
            i32::from(!counted)
        });
        assert_eq!(code, 0);
        assert_eq!(
            waits_given_up(),
            given_up,
            "no wait given up: it did not wait for itself"
        );
        drop(inner);
        drop(outer);
        assert_eq!(DEPTH.with(|d| d.get()), 0);
    }

    #[test]
    fn a_fork_gives_up_waiting_after_the_limit_and_counts_it() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let given_up = waits_given_up();
        let entered = Arc::new(Barrier::new(2));
        let release = Arc::new(AtomicBool::new(false));
        let holder = {
            let (entered, release) = (entered.clone(), release.clone());
            std::thread::spawn(move || {
                let _section = section();
                entered.wait();
                // A section that waits for what the forking thread holds
                // (here: a flag it sets only after the fork).
                while !release.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
            })
        };
        entered.wait();
        let start = std::time::Instant::now();
        let code = fork_and_check(|| i32::from(release.load(Ordering::SeqCst)));
        let waited = start.elapsed();
        release.store(true, Ordering::SeqCst);
        holder.join().unwrap();
        assert_eq!(code, 0);
        assert_eq!(waits_given_up(), given_up + 1);
        assert!(
            waited >= std::time::Duration::from_nanos(LIMIT_NS),
            "gave up after {waited:?}, before the limit"
        );
    }
}

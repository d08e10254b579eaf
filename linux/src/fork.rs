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
//! holding the loader's. (The loader's own holders, another library's
//! `dl_iterate_phdr` or a `dlclose` in progress, are glibc's to fix: they
//! hang the child without memhook.)
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

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
    let depth = DEPTH.with(|d| d.get());
    if depth == 0 {
        loop {
            while FORKING.load(Ordering::SeqCst) != 0 {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
            ACTIVE.fetch_add(1, Ordering::SeqCst);
            // A fork that began meanwhile may have looked at ACTIVE before
            // the increment: step back out and wait for it.
            if FORKING.load(Ordering::SeqCst) == 0 {
                break;
            }
            ACTIVE.fetch_sub(1, Ordering::SeqCst);
        }
    }
    DEPTH.with(|d| d.set(depth + 1));
    Section {
        _thread: core::marker::PhantomData,
    }
}

/// Enters a section unless that would wait: `None` where a fork is being
/// prepared and this thread is in no section yet. For code that runs
/// where the forking thread may need what this thread holds (the loader's
/// lock, inside the loader's breakpoint: another library's fork handler
/// may call `dlsym`), which must not wait for the fork.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn try_section() -> Option<Section> {
    let depth = DEPTH.with(|d| d.get());
    if depth == 0 {
        if FORKING.load(Ordering::SeqCst) != 0 {
            return None;
        }
        ACTIVE.fetch_add(1, Ordering::SeqCst);
        // As in `section`: a fork that began meanwhile may have looked at
        // ACTIVE before the increment.
        if FORKING.load(Ordering::SeqCst) != 0 {
            ACTIVE.fetch_sub(1, Ordering::SeqCst);
            return None;
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
    crate::memtype::after_fork_in_child();
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    crate::cuda::after_fork_in_child();
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    crate::evacuate::after_fork_in_child();
}

extern "C" fn register_at_load() {
    // SAFETY: the three handlers touch only this module's atomics, the
    // calling thread's section depth and (the child's) the memory-type
    // map, the CUDA hooks' count of runtime calls and the counts of
    // threads moved out of patches, and never fail.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
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
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waiting for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        libc::WEXITSTATUS(status)
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

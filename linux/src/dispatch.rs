//! The process's handler table and dispatch, with the per-thread nesting
//! state the core leaves to its caller.
//!
//! The nesting state is a `const` thread-local without a destructor: no
//! allocation, valid in threads created before memhook was installed and in
//! signal handlers. Hooks ask `wants` first (the dispatcher's two masks, on the
//! line dispatch reads anyway) and skip everything when no handler wants
//! their events.

use core::ffi::c_int;
use core::sync::atomic::{AtomicBool, Ordering};
use std::ops::ControlFlow;

use crate::membarrier;

use memhook_core::event::{
    Asymmetric, DispatchDepth, Dispatcher, Event, Handler, HandlerId, MemTypeEvent, Pass, RegisterError, VmEvent, bits,
};
use memhook_core::memtype::MemType;

/// Most handlers registered at once.
pub const MAX_HANDLERS: usize = 64;

/// A registered handler: a Rust function or closure, or a raw function with
/// two context words (how the C ABI registers `(callback, arg)`).
#[derive(Clone, Copy)]
pub enum HandlerFn {
    /// A Rust handler.
    Rust(&'static (dyn Fn(&mut Event) + Send + Sync)),
    /// A raw handler: `func(a, b, event)`.
    Raw {
        /// Called with `a`, `b` and the event.
        func: unsafe fn(usize, usize, &mut Event),
        /// First context word.
        a: usize,
        /// Second context word.
        b: usize,
    },
}

/// Whether two Rust handlers are the same: one object. A handler with
/// state is named by its address; a zero-sized one (a function, or a
/// closure that captures nothing) has no address of its own (every
/// reference to one is the same dangling address), so its type tells it
/// apart: the vtable, compared with the address. (A type's vtable may be
/// emitted more than once, in which case one zero-sized handler reached
/// through two copies compares unequal; and two whose code is identical,
/// which the compiler may merge, may compare equal. Neither removes a
/// handler that does something else, which is what an unset by function
/// must never do.)
fn same_rust_handler(x: &(dyn Fn(&mut Event) + Send + Sync), y: &(dyn Fn(&mut Event) + Send + Sync)) -> bool {
    if size_of_val(x) == 0 && size_of_val(y) == 0 {
        core::ptr::eq(x, y)
    } else {
        core::ptr::addr_eq(x, y)
    }
}

impl PartialEq for HandlerFn {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (HandlerFn::Rust(x), HandlerFn::Rust(y)) => same_rust_handler(*x, *y),
            (HandlerFn::Raw { func: f, a, b }, HandlerFn::Raw { func: g, a: c, b: d }) => {
                core::ptr::fn_addr_eq(*f, *g) && a == c && b == d
            }
            _ => false,
        }
    }
}

impl Handler for HandlerFn {
    fn call(&self, event: &mut Event) {
        match *self {
            HandlerFn::Rust(f) => f(event),
            // SAFETY: whoever registered a raw handler promised that
            // `func(a, b, event)` is sound (the C ABI's contract).
            HandlerFn::Raw { func, a, b } => unsafe { func(a, b, event) },
        }
    }
}

static DISPATCHER: Dispatcher<HandlerFn, MAX_HANDLERS> = Dispatcher::new();

/// A thread's dispatch state: its nesting (the core's), and where its
/// `errno` lives (asked of libc once: hooks save and restore errno around
/// the handlers on every call).
struct Local {
    depth: DispatchDepth,
    errno: core::cell::Cell<*mut core::ffi::c_int>,
    /// While the thread runs a host hook's original, an address in the
    /// hook's frame; else 0 (see [`is_own_call`]).
    in_original: core::cell::Cell<usize>,
    /// The call that original makes, while `in_original` is not 0.
    own_call: core::cell::Cell<OwnCall>,
    /// How many marked originals this thread is inside (see
    /// [`marked_original`]): unlike `in_original`, which a dispatch clears
    /// while its handlers run, it says whether an outer original's
    /// `own_call` and `own_taken` are there to be kept.
    originals: core::cell::Cell<u32>,
    /// Whether a system call has been taken for `own_call` already (the
    /// original's own is made once: a second naming the same words is
    /// another's). An atomic swap, so that a signal handler's look cannot
    /// fall between another look's test and its set on this thread.
    own_taken: AtomicBool,
    /// The mark of the hooked CUDA function whose event the thread is
    /// delivering (its index + 1; 0: none), kept here so that a delivery
    /// and its mark take one thread-local lookup (a call into the dynamic
    /// linker in a preloaded library), not two (see
    /// [`ThisThread::notify_reporting`]).
    reporting: core::cell::Cell<u8>,
}

/// A host hook's call as the system call that makes it names it: the
/// words a hooker's hook of that function passes to `syscall` (UCM's
/// bistro mode does so) that say what the call works on. While a hook's
/// original runs, a memory system call that names the same is that
/// call's own, reported by the hook ([`is_own_call`]); any other made on
/// the thread meanwhile (by a signal handler that interrupts the
/// original, by the other hooker's own bookkeeping) is its own, and
/// reported.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum OwnCall {
    /// No call of a host hook (a hook of another kind).
    Other,
    /// `mmap`: the address asked for and the length.
    Mmap(usize, usize),
    /// `munmap`: the address and length.
    Munmap(usize, usize),
    /// `mremap`: the old address and size.
    Mremap(usize, usize),
    /// `shmat`: the segment and the address asked for.
    Shmat(c_int, usize),
    /// `shmdt`: the address.
    Shmdt(usize),
    /// `madvise`: the address and length.
    Madvise(usize, usize),
    /// `process_madvise`: the process's descriptor and the ranges' array.
    ProcessMadvise(c_int, usize),
    /// `remap_file_pages`: the address and length.
    RemapFilePages(usize, usize),
    /// `brk` or `sbrk` (the break glibc's `sbrk` asks for is not the
    /// caller's word: any `brk` system call).
    Brk,
    /// `fallocate`: the descriptor.
    Fallocate(c_int),
    /// `ftruncate`: the descriptor.
    Ftruncate(c_int),
    /// `truncate`: the path's address.
    Truncate(usize),
    /// `open`, `openat`, `creat`, `openat2`, `fopen`, `freopen`: the
    /// path's address.
    Open(usize),
    /// `shm_open`: the name's address (glibc before 2.34 opens the
    /// object's file by `open`, of a path it makes of the name).
    ShmOpen(usize),
    /// `ioctl` (`UFFDIO_MOVE`): the descriptor and the argument's address.
    Ioctl(c_int, usize),
}

// A thread-local with a destructor would be registered on a thread's first
// use (glibc's `__cxa_thread_atexit_impl`, which takes the loader's lock and
// may allocate): a hook on a thread that waits for a `dlopen` in progress
// elsewhere could then wait on the loader. `Local` has none.
const _: () = assert!(!core::mem::needs_drop::<Local>());

thread_local! {
    static LOCAL: Local = const {
        Local {
            depth: DispatchDepth::new(),
            errno: core::cell::Cell::new(core::ptr::null_mut()),
            in_original: core::cell::Cell::new(0),
            own_call: core::cell::Cell::new(OwnCall::Other),
            own_taken: AtomicBool::new(false),
            originals: core::cell::Cell::new(0),
            reporting: core::cell::Cell::new(0),
        }
    };
}

/// The barrier, thread ids and liveness the dispatcher's reader slots need
/// (see `Dispatcher::enter`).
static PLATFORM: Asymmetric = Asymmetric {
    barrier: membarrier::fence,
    // SAFETY: gettid has no arguments and cannot fail.
    thread_id: || unsafe { crate::sys::syscall!(libc::SYS_gettid) } as u64,
    thread_alive: |tid| {
        // SAFETY: signal 0 only checks that the thread exists in this
        // process (tgkill with our own pid).
        let r = unsafe { crate::sys::syscall!(libc::SYS_tgkill, libc::getpid(), tid as libc::pid_t, 0) };
        r == 0 || crate::maps::errno() != libc::ESRCH
    },
};

/// Whether dispatch readers use slots of their own (plain stores) rather
/// than the shared counters (two locked instructions per call): the kernel
/// has `membarrier(PRIVATE_EXPEDITED)` (or its SYNC_CORE form, which
/// serves) and this process registered for it.
pub fn reader_slots() -> bool {
    DISPATCHER.slots_enabled()
}

/// Issues the barrier the reader slots rely on (a registration writes and
/// unregistration waits by it): whether the kernel accepted it. For
/// tests: the dispatcher falls back to a spin where it fails, which no
/// event would show.
#[doc(hidden)]
pub fn reader_fence() -> bool {
    (PLATFORM.barrier)()
}

/// Registers for the expedited membarrier at load, while the process is
/// (usually) single-threaded, so that the registration is quick (the
/// registration code patching makes serves: see `membarrier`); then
/// lets readers use slots. Without it (an old kernel, a seccomp filter),
/// or with `MEMHOOK_READER_SLOTS=0` in the environment, the shared
/// counters serve.
extern "C" fn enable_reader_slots_at_load() {
    if crate::env_says_0(c"MEMHOOK_READER_SLOTS") {
        return;
    }
    if membarrier::fence_command().is_some() {
        DISPATCHER.enable_slots(&PLATFORM);
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static ENABLE_READER_SLOTS_AT_LOAD: extern "C" fn() = enable_reader_slots_at_load;

/// Whether any handler wants any of `events`.
#[inline]
pub(crate) fn wants(events: u32) -> bool {
    DISPATCHER.wants(events)
}

/// This thread's dispatch state, found once by a hook that uses it more
/// than once (each lookup of a thread-local is a call into the dynamic
/// linker in `libmemhook.so`): both halves of a dispatch ([`Begun`]), or
/// the prefetch of a delivery and the delivery. Made on the thread and
/// dropped in the hook's frame, while the thread runs: the raw pointer
/// keeps it neither `Send` nor `Sync`.
pub(crate) struct ThisThread(*const Local);

/// This thread's [`ThisThread`]; `None` once its state is gone (thread
/// exit), where no event is delivered.
#[inline(always)]
pub(crate) fn this_thread() -> Option<ThisThread> {
    LOCAL.try_with(|l| ThisThread(l)).ok()
}

impl ThisThread {
    #[inline(always)]
    fn local(&self) -> &Local {
        // SAFETY: [`this_thread`] took the pointer on this thread (the type
        // is neither Send nor Sync), from a `const` thread-local without a
        // destructor, whose storage lives as long as the thread, which is
        // running this.
        unsafe { &*self.0 }
    }

    /// Asks the cache for what delivering events of the kinds `kinds`
    /// reads (see `Dispatcher::prefetch_visit`): for a hook about to
    /// deliver after a driver call.
    #[inline(always)]
    pub(crate) fn prefetch_delivery(&self, kinds: u32) {
        DISPATCHER.prefetch_visit(&self.local().depth, kinds);
    }

    /// Delivers `event` (it has no original call) as the event of the
    /// hooked function whose mark is `reporting` (not 0), which
    /// [`reporting`] tells its handlers meanwhile; the mark the thread had
    /// (an outer delivery's, or 0) comes back after.
    #[inline(always)]
    pub(crate) fn notify_reporting(&self, reporting: u8, event: &mut Event) {
        let l = self.local();
        let was = l.reporting.replace(reporting);
        notify_on(l, event);
        l.reporting.set(was);
    }
}

/// A hook's dispatch between [`begin`] and [`finish`]: the pass, and this
/// thread's nesting state, found once for both halves.
pub(crate) struct Begun {
    pass: Pass,
    thread: ThisThread,
    /// The caller's errno before any handler ran.
    caller_errno: core::ffi::c_int,
    /// The thread's mark when this hook began: an outer hook's original
    /// running, or 0 (its handlers run unmarked: see [`is_own_call`]).
    was_original: usize,
}

impl Begun {
    /// Whether the hook makes the original call (see `Pass`).
    pub(crate) fn call_original(&self) -> bool {
        self.pass.call_original
    }

    /// This thread's `errno` location.
    #[inline(always)]
    pub(crate) fn errno(&self) -> *mut core::ffi::c_int {
        errno_of(self.thread.local())
    }

    /// Runs `original` (the hooked call's original, `own` the call it
    /// makes) marked as such for [`is_own_call`].
    #[inline(always)]
    pub(crate) fn run_original<R>(&self, own: OwnCall, original: impl FnOnce() -> R) -> R {
        marked_original(self.thread.local(), own, original)
    }

    /// The caller's errno as it was when the hook began, before any
    /// handler ran: what the original must be called with, so that a
    /// call that succeeds (and leaves errno alone) leaves the caller's.
    #[inline(always)]
    pub(crate) fn caller_errno(&self) -> core::ffi::c_int {
        self.caller_errno
    }
}

/// An address in the caller's frame: frames it calls lie below it (the
/// stack grows down on x86_64 and aarch64). The stack pointer, read into
/// a register: a local's address, where the compiler must then keep the
/// local in memory, cost a store and two loads more at each of the two
/// looks a hooked call with a handler makes (some 10 instructions a
/// pair, `scripts/callgrind.sh`).
#[inline(always)]
fn frame_address() -> usize {
    let sp: usize;
    // SAFETY: copies the stack pointer to a register; reads and writes
    // no memory, keeps the stack and the flags as they are.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    // SAFETY: as above.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let here = 0u8;
        sp = core::hint::black_box(&here) as *const u8 as usize;
    }
    sp
}

/// Runs `original` with `local`'s thread marked as inside a hook's
/// original (by an address in the hook's frame) that makes `own`, then
/// puts the mark back as it was. The frame is 0 while the call is
/// changed, so that a signal handler that runs in between never sees a
/// live frame beside another original's call (it sees no mark, and its
/// calls are its own).
///
/// Where no original runs on the thread (the common case: a hook called
/// by the program, not from inside another's original) there is no outer
/// call to keep: the mark is set, and cleared after, with no save and
/// restore (27 of the 524 instructions an mmap+munmap pair with a C
/// handler cost, `scripts/callgrind.sh`). `originals` is raised first, so that a
/// signal handler's hook that runs while the call is being written keeps
/// it as it found it; one that runs before leaves it to be written after.
/// (A `longjmp` out of an original leaves it raised: that thread's later
/// originals then take the longer way, which is as correct.)
#[inline(always)]
fn marked_original<R>(local: &Local, own: OwnCall, original: impl FnOnce() -> R) -> R {
    use core::sync::atomic::compiler_fence;
    let outer = local.originals.get();
    local.originals.set(outer + 1);
    compiler_fence(Ordering::SeqCst);
    let result = if outer == 0 {
        local.in_original.set(0);
        compiler_fence(Ordering::SeqCst);
        marked_call(local, own, original)
    } else {
        // Inside another original: its mark, call and flag are kept.
        let was = local.in_original.replace(0);
        compiler_fence(Ordering::SeqCst);
        let was_call = local.own_call.get();
        // A load and a store, not a swap (a locked instruction, some 20
        // cycles a call): with the frame 0 no look of a signal handler's
        // tests the flag, and a nested original's puts it back as it
        // found it.
        let was_taken = local.own_taken.load(Ordering::Relaxed);
        let result = marked_call(local, own, original);
        local.own_call.set(was_call);
        local.own_taken.store(was_taken, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        local.in_original.set(was);
        result
    };
    compiler_fence(Ordering::SeqCst);
    local.originals.set(outer);
    result
}

/// The call of [`marked_original`], its mark 0 on entry: `own` written,
/// then the frame that makes it live; the mark 0 again after.
#[inline(always)]
fn marked_call<R>(local: &Local, own: OwnCall, original: impl FnOnce() -> R) -> R {
    use core::sync::atomic::compiler_fence;
    local.own_call.set(own);
    local.own_taken.store(false, Ordering::Relaxed);
    compiler_fence(Ordering::SeqCst);
    local.in_original.set(frame_address());
    let result = original();
    local.in_original.set(0);
    compiler_fence(Ordering::SeqCst);
    result
}

/// [`Begun::run_original`] for a hook that calls its original outside a
/// dispatch (the file-discarding calls): finds the thread's state itself.
pub(crate) fn run_original<R>(own: OwnCall, original: impl FnOnce() -> R) -> R {
    match this_thread() {
        Some(thread) => marked_original(thread.local(), own, original),
        None => original(),
    }
}

/// Whether `call` is the call of the host hook whose original this
/// thread is running: the system call that the `syscall` hook is then
/// asked for is that call's own (another hooker's hook of it, which makes
/// the call with `syscall`, as UCM's bistro hooks do), already reported
/// by memhook's hook. Any other call made inside the original (a signal
/// handler's, the other hooker's own) is not ([`OwnCall`]), nor is one
/// that names the same words once one has been taken for the original's
/// (a signal handler's unmap of the very range, made after the original
/// unmapped it and a handler mapped it again, was lost until the
/// fifty-sixth session; one made before the original's own makes that
/// one reported instead: a report too many, never one lost). Handlers run
/// unmarked, wherever they are called from (an event delivered inside an
/// original, a hook nested in another's original): a `syscall` they make
/// is theirs. The mark holds only for frames below the marking hook's: a
/// thread that left the original by `longjmp` (out of a signal handler)
/// without putting the mark back is taken for one inside it only while
/// it runs deeper than that hook did, and the mark goes at the first look
/// from above it (here, or a hook's [`begin`]).
#[inline]
pub(crate) fn is_own_call(call: OwnCall) -> bool {
    let here = frame_address();
    LOCAL
        .try_with(|l| {
            let mark = live_mark(l.in_original.get(), here);
            l.in_original.set(mark);
            mark != 0
                && call != OwnCall::Other
                && l.own_call.get() == call
                && !l.own_taken.swap(true, Ordering::Relaxed)
        })
        .unwrap_or(false)
}

/// The call of the host hook whose original this thread is running, not
/// yet taken for its own (see [`is_own_call`]), without taking it;
/// [`OwnCall::Other`] where none.
#[inline]
pub(crate) fn own_call_now() -> OwnCall {
    let here = frame_address();
    LOCAL
        .try_with(|l| {
            let mark = live_mark(l.in_original.get(), here);
            l.in_original.set(mark);
            if mark != 0 && !l.own_taken.load(Ordering::Relaxed) {
                l.own_call.get()
            } else {
                OwnCall::Other
            }
        })
        .unwrap_or(OwnCall::Other)
}

/// `mark` as a frame at `here` sees it: 0 where `here` lies above the
/// marking frame (that hook has returned, or was left by `longjmp`).
#[inline(always)]
fn live_mark(mark: usize, here: usize) -> usize {
    if here < mark { mark } else { 0 }
}

/// The `errno` location of the thread whose state `local` is (asked of
/// libc once per thread).
#[inline(always)]
fn errno_of(local: &Local) -> *mut core::ffi::c_int {
    let at = local.errno.get();
    if !at.is_null() {
        return at;
    }
    // SAFETY: __errno_location has no preconditions; the thread's errno
    // stays where it is for the thread's life.
    let at = unsafe { libc::__errno_location() };
    local.errno.set(at);
    at
}

/// The first half of a hook's dispatch (see `Dispatcher::begin`): the
/// hook then makes the original call in its own frame, if the pass says
/// so, and hands it to [`finish`]. `None` when the thread's state is gone
/// (thread exit): the hook just makes the call. Inlined into the hooks:
/// only a table visit is a call of its own.
#[inline(always)]
pub(crate) fn begin(before: Option<&mut Event>, event: &mut Event) -> Option<Begun> {
    // (The lookup is an offset from the thread pointer, or one
    // `__tls_get_addr` call in a preloaded library.)
    let thread = this_thread()?;
    let l = thread.local();
    // SAFETY: this thread's errno location.
    let caller_errno = unsafe { *errno_of(l) };
    let was_original = live_mark(l.in_original.replace(0), frame_address());
    let pass = DISPATCHER.begin(&l.depth, before, event);
    Some(Begun {
        pass,
        thread,
        caller_errno,
        was_original,
    })
}

/// The second half of a hook's dispatch: post-handlers of `event`, then
/// `follow`'s (a `VM_MAPPED` made from the finished call).
#[inline(always)]
pub(crate) fn finish(begun: Begun, event: &mut Event, follow: Option<&mut Event>) {
    let local = begun.thread.local();
    DISPATCHER.finish(&local.depth, begun.pass, event, follow);
    local.in_original.set(begun.was_original);
}

/// Delivers an event that has no original call.
pub(crate) fn notify(event: &mut Event) {
    let _ = LOCAL.try_with(|l| notify_on(l, event));
}

/// The mark of the hooked function whose event this thread delivers now
/// ([`ThisThread::notify_reporting`]), or 0.
pub(crate) fn reporting() -> u8 {
    LOCAL.try_with(|l| l.reporting.get()).unwrap_or(0)
}

/// [`notify`] on the thread whose state `l` is.
#[inline(always)]
fn notify_on(l: &Local, event: &mut Event) {
    // Its handlers run unmarked, wherever it is delivered from (see
    // [`is_own_call`]).
    let was_original = l.in_original.replace(0);
    DISPATCHER.notify(&l.depth, event);
    l.in_original.set(was_original);
}

static FORK_HOOK: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    // SAFETY: only the forking thread exists in the child.
    let _ = LOCAL.try_with(|l| unsafe { DISPATCHER.reset_after_fork(&l.depth) });
}

fn ensure_fork_hook() {
    if !FORK_HOOK.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a child handler that only resets memhook state.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    }
}

/// Registers `handler` for `events` at `priority` (< 0 before the original
/// call, >= 0 after; ties in registration order). With
/// [`bits::EXISTING_ALLOC`], the handler is first called for the mappings
/// that exist now (`/proc/self/maps`): with `VM_MAPPED`, a `VM_MAPPED`
/// event for each; with `MEM_TYPE_ALLOC`, a `MEM_TYPE_ALLOC` of unknown
/// type for each mapping of an NVIDIA device file (the GPU memory mapped
/// before the hooks saw it).
///
/// A handler must not panic. The hook that calls it may have been called
/// from C, which cannot take an unwinding, so a panic ends the process
/// (Rust aborts at the hook's `extern "C"` edge, after the panic hook has
/// reported the panic). That is kept on purpose: going on would leave the
/// handler without the event it failed on, and for a registration cache
/// a lost unmap is silent corruption; a handler that can fail should
/// catch its own failure.
///
/// Nor should a handler be cancelled. The calls it runs inside (`mmap`,
/// `munmap`, `malloc`'s calls of them with its lock held, the CUDA
/// driver's) are not cancellation points, and memhook's own code on a
/// hook's path has none ([`crate::sys`]); a handler that calls one
/// (`write`, `printf`, `pthread_cond_wait`) on a thread another may
/// cancel should turn cancellation off around it
/// (`pthread_setcancelstate`). memhook does not for every event: the pair
/// of calls costs about 26 ns. A thread cancelled in a handler anyway
/// unwinds out of the hooked call: the handlers after it do not see that
/// event, and registration does not wait for the thread (where threads
/// read through reader slots, as wherever the kernel has the expedited
/// `membarrier`; see README, "Thread cancellation").
///
/// # Errors
///
/// A [`RegisterError`]: the table is full, the mask names no event or has
/// a bit that is neither an event nor a flag, or the call comes from
/// inside a handler or from a signal handler that interrupted this
/// thread's own change of the handlers (which it would wait for).
pub fn set_handler(events: u32, priority: i32, handler: HandlerFn) -> Result<HandlerId, RegisterError> {
    ensure_fork_hook();
    let id = LOCAL.with(|l| DISPATCHER.register(&l.depth, events, priority, handler))?;
    // Mappings of files made while no handler wanted their events went
    // uncounted: the filter of mapped files is forgotten.
    crate::host::forget_mapped_files();
    // The hooks let calls pass that no handler wanted: a hugetlb mapping
    // may have been made unseen.
    crate::hugetlb::forget();
    if events & bits::EXISTING_ALLOC != 0 && events & (bits::VM_MAPPED | bits::MEM_TYPE_ALLOC) != 0 {
        let _ = crate::maps::for_each(|m| {
            replay(&handler, events, m);
            ControlFlow::Continue(())
        });
    }
    Ok(id)
}

/// What [`bits::EXISTING_ALLOC`] delivers to `handler` (registered for
/// `events`) for a mapping `m` that existed before it.
fn replay(handler: &HandlerFn, events: u32, m: &crate::maps::Mapping) {
    let (address, size) = (m.start, m.end - m.start);
    if events & bits::VM_MAPPED != 0 {
        handler.call(&mut Event::VmMapped(VmEvent { address, size }));
    }
    if events & bits::MEM_TYPE_ALLOC != 0 && m.is_gpu() {
        handler.call(&mut Event::MemTypeAlloc(MemTypeEvent {
            address,
            size,
            mem_type: MemType::Unknown as u32,
        }));
    }
}

/// Removes registration `id`; once this returns its handler is not running
/// and will not run.
///
/// # Errors
///
/// [`RegisterError::NotFound`] or [`RegisterError::InsideHandler`].
pub fn unset_handler(id: HandlerId) -> Result<(), RegisterError> {
    LOCAL.with(|l| DISPATCHER.unregister(&l.depth, id))
}

/// Removes the bits `events` from every registration of `handler` (the C
/// ABI's unset by callback and argument); returns how many went entirely.
///
/// # Errors
///
/// [`RegisterError::InsideHandler`].
pub fn unset_handler_fn(events: u32, handler: &HandlerFn) -> Result<usize, RegisterError> {
    LOCAL.with(|l| DISPATCHER.unregister_handler(&l.depth, events, handler))
}

/// Delivers an event the embedder observed itself (for `NO_INSTALL` users,
/// e.g. an allocator reporting its own mappings) to every handler. A
/// memory-type event updates the map first; a `MEM_TYPE_FREE` of size 0
/// ends the allocation recorded at its address and is delivered with
/// that allocation's size (0 where none is recorded).
///
/// # Errors
///
/// [`MapError::WrapsAround`](crate::memtype::MapError::WrapsAround) for a
/// `VM_*` or `MEM_TYPE_*` event whose range runs past the end of the
/// address space: nothing is recorded or delivered.
pub fn report_event(event: &mut Event) -> Result<(), crate::memtype::MapError> {
    if let Event::VmMapped(VmEvent { address, size })
    | Event::VmUnmapped(VmEvent { address, size })
    | Event::MemTypeAlloc(MemTypeEvent { address, size, .. })
    | Event::MemTypeFree(MemTypeEvent { address, size, .. }) = *event
        && address.checked_add(size).is_none()
    {
        return Err(crate::memtype::MapError::WrapsAround {
            start: address,
            len: size,
        });
    }
    crate::memtype::record(event);
    notify(event);
    Ok(())
}

/// Events delivered straight to the original because a thread was already
/// nested too deep.
pub fn nested_overflows() -> u64 {
    DISPATCHER.nested_overflows()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Mutex;

    static SEEN: Mutex<Vec<(u32, usize, usize, u32)>> = Mutex::new(Vec::new());

    fn record(e: &mut Event) {
        let r = match *e {
            Event::VmMapped(v) => (bits::VM_MAPPED, v.address, v.size, 0),
            Event::MemTypeAlloc(m) => (bits::MEM_TYPE_ALLOC, m.address, m.size, m.mem_type),
            _ => (0, 0, 0, 0),
        };
        SEEN.lock().unwrap().push(r);
    }

    std::thread_local! {
        /// What `inside_original` said to the last handler call on this
        /// thread.
        static HANDLER_SAW: core::cell::Cell<Option<bool>> = const { core::cell::Cell::new(None) };
    }

    /// The call the tests' originals make.
    const OWN: OwnCall = OwnCall::Munmap(0x10_0000, 4096);

    fn note_inside(_: &mut Event) {
        HANDLER_SAW.with(|s| s.set(Some(is_own_call(OWN))));
    }

    /// Leaves this frame marked as a hook's inside its original, as a
    /// `longjmp` out of the original (from a signal handler) would.
    #[inline(never)]
    fn marked_and_left() {
        LOCAL.with(|l| {
            l.in_original.set(frame_address());
            l.own_call.set(OWN);
        });
        core::hint::black_box(());
    }

    #[inline(never)]
    fn deeper() -> bool {
        core::hint::black_box(is_own_call(OWN))
    }

    #[inline(never)]
    fn deeper_asks(call: OwnCall) -> bool {
        core::hint::black_box(is_own_call(call))
    }

    #[test]
    fn the_original_mark_holds_inside_an_original_and_not_for_handlers_or_after_it() {
        // (Asked by a function of its own, as the `syscall` hook is: a
        // frame below the one that marks.)
        assert!(!deeper());
        assert!(run_original(OWN, deeper), "in a function the original calls");
        assert!(!deeper(), "put back after it");
        // The original makes its call once: a second naming the same words
        // (a signal handler's) is another's. A nested original's own
        // leaves the outer's as it was, taken or not.
        assert_eq!(run_original(OWN, || (deeper(), deeper())), (true, false));
        assert_eq!(
            run_original(OWN, || {
                let taken = deeper();
                let inner = run_original(OwnCall::Brk, || deeper_asks(OwnCall::Brk));
                (taken, inner, deeper())
            }),
            (true, true, false)
        );
        assert!(run_original(OWN, deeper), "each original's own once");
        // Another call made inside the original (a signal handler's, the
        // other hooker's own) is not the original's.
        let others = [
            OwnCall::Munmap(0x10_0000, 8192),
            OwnCall::Munmap(0x20_0000, 4096),
            OwnCall::Madvise(0x10_0000, 4096),
            OwnCall::Other,
        ];
        for other in others {
            assert!(!run_original(OWN, || deeper_asks(other)), "{other:?} inside {OWN:?}");
        }
        // Nested: the inner original's call, then the outer's again.
        let (inner, outer_after) = run_original(OWN, || {
            let inner = run_original(OwnCall::Brk, || (deeper_asks(OwnCall::Brk), deeper()));
            (inner, deeper())
        });
        assert_eq!(inner, (true, false), "the inner original's call, not the outer's");
        assert!(outer_after, "the outer original's call after the inner returned");
        // A hook called inside an original (the other hooker's code calls
        // a hooked function) runs its own original while its dispatch has
        // the outer mark cleared for its handlers: the outer's call and
        // flag are kept all the same, taken or not.
        let hooked_inside = |then_outer: bool| {
            run_original(OWN, || {
                let before = then_outer && deeper();
                let was = LOCAL.with(|l| l.in_original.replace(0));
                let inner = run_original(OwnCall::Brk, || deeper_asks(OwnCall::Brk));
                LOCAL.with(|l| l.in_original.set(was));
                (before, inner, deeper())
            })
        };
        assert_eq!(
            hooked_inside(false),
            (false, true, true),
            "the outer's own after a nested hook's"
        );
        assert_eq!(
            hooked_inside(true),
            (true, true, false),
            "the outer's own taken before stays taken"
        );
        // A handler of an event delivered inside an original runs
        // unmarked; the original is marked again after it.
        let id = set_handler(bits::SHMDT, 0, HandlerFn::Rust(&note_inside)).unwrap();
        let (handler_saw, after) = run_original(OWN, || {
            let mut event = Event::Shmdt(memhook_core::event::ShmdtEvent { result: 0, shmaddr: 1 });
            notify(&mut event);
            (HANDLER_SAW.with(|s| s.take()), deeper())
        });
        unset_handler(id).unwrap();
        assert_eq!(handler_saw, Some(false), "the handler ran unmarked");
        assert!(after, "the original's mark is back after the handler");
        // A mark left behind (a longjmp out of the original) is not taken
        // for one by frames above it, and goes at the first look.
        marked_and_left();
        assert_ne!(LOCAL.with(|l| l.in_original.get()), 0);
        assert!(!is_own_call(OWN), "a frame above a stale mark is not inside");
        assert_eq!(LOCAL.with(|l| l.in_original.get()), 0, "the stale mark is gone");
    }

    #[test]
    fn existing_allocations_replay_gpu_mappings_as_unknown_and_every_mapping_as_mapped() {
        let lines: [&[u8]; 3] = [
            b"200000000-200200000 rw-s 00000000 00:05 613 /dev/nvidiactl",
            b"7f0000000000-7f0000400000 rw-s 00000000 00:05 617 /dev/nvidia-uvm",
            b"7f3a12000000-7f3a12021000 r-xp 00002000 08:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6",
        ];
        let handler = HandlerFn::Rust(&record);
        let replay_all = |events: u32| {
            SEEN.lock().unwrap().clear();
            for line in lines {
                replay(&handler, events, &crate::maps::parse_line(line).unwrap());
            }
            core::mem::take(&mut *SEEN.lock().unwrap())
        };
        let unknown = MemType::Unknown as u32;
        assert_eq!(
            replay_all(bits::MEM_TYPE_ALLOC | bits::EXISTING_ALLOC),
            [
                (bits::MEM_TYPE_ALLOC, 0x2_0000_0000, 0x20_0000, unknown),
                (bits::MEM_TYPE_ALLOC, 0x7f00_0000_0000, 0x40_0000, unknown),
            ],
            "the two NVIDIA device mappings, not libc"
        );
        assert_eq!(
            replay_all(bits::VM_MAPPED | bits::EXISTING_ALLOC).len(),
            3,
            "every mapping is mapped memory"
        );
        assert_eq!(
            replay_all(bits::VM_MAPPED | bits::MEM_TYPE_ALLOC | bits::EXISTING_ALLOC).len(),
            5
        );
    }
}

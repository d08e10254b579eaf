//! Events, handler registration and dispatch.
//!
//! A hooked call becomes an [`Event`]; a [`Dispatcher`] runs the registered
//! handlers whose mask names the event, in ascending priority: handlers with
//! priority `< 0` before the original call, `>= 0` after it (UCM's rule).
//!
//! # Result rules
//!
//! Host events (`mmap`, `munmap`, ...) carry the call's `result`, which starts
//! *invalid* (`MAP_FAILED` or `-1`). A handler may fill it only while it is
//! still invalid: a change made to a valid result is undone. If a
//! pre-handler leaves a valid result, the original call is skipped.
//!
//! # Concurrency
//!
//! Two immutable handler tables, an atomic index of the live one, and the
//! readers' marks: a slot per thread where the platform provides an
//! asymmetric barrier ([`Dispatcher::enable_slots`]), else a count per
//! table. Dispatch marks the live table busy while it reads it (not while
//! the original call runs); it never waits. Registration (serialised by a
//! writer lock that dispatch never takes) fills the other table, swaps, and
//! waits until the old table has no readers, so that once
//! [`Dispatcher::unregister`] returns the removed handler is never called
//! again. Registering from inside a handler would wait for itself; it fails
//! with [`RegisterError::InsideHandler`] instead.
//!
//! The caller owns the per-thread nesting state ([`DispatchDepth`], a
//! thread-local in the Linux runtime), because `core` has no threads of its
//! own.
//!
//! ```
//! use memhook_core::event::{Dispatcher, DispatchDepth, Event, FnHandler, MunmapEvent, bits};
//!
//! static DISPATCHER: Dispatcher<FnHandler, 8> = Dispatcher::new();
//! fn count(_event: &mut Event, context: usize) {
//!     // context is the address of an AtomicUsize here
//!     let n = unsafe { &*(context as *const core::sync::atomic::AtomicUsize) };
//!     n.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
//! }
//! static SEEN: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
//!
//! let depth = DispatchDepth::new();
//! let handler = FnHandler { func: count, context: &SEEN as *const _ as usize };
//! let id = DISPATCHER.register(&depth, bits::MUNMAP, 0, handler).unwrap();
//! let mut event = Event::Munmap(MunmapEvent { result: -1, address: 0x1000, size: 4096 });
//! DISPATCHER.dispatch(&depth, &mut event, |e| {
//!     if let Event::Munmap(m) = e { m.result = 0 } // the "original call"
//! });
//! assert_eq!(SEEN.load(core::sync::atomic::Ordering::Relaxed), 1);
//! DISPATCHER.unregister(&depth, id).unwrap();
//! ```

use core::fmt;

#[cfg(memhook_loom)]
use crate::sync::fence;
use crate::sync::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Cell, Mutex, Ordering, spin_wait};

/// Event bits and flags: the stable C ABI values of SPEC.md.
pub mod bits {
    /// `mmap` was called.
    pub const MMAP: u32 = 1 << 0;
    /// `munmap` was called.
    pub const MUNMAP: u32 = 1 << 1;
    /// `mremap` was called.
    pub const MREMAP: u32 = 1 << 2;
    /// `shmat` was called.
    pub const SHMAT: u32 = 1 << 3;
    /// `shmdt` was called.
    pub const SHMDT: u32 = 1 << 4;
    /// `sbrk` was called.
    pub const SBRK: u32 = 1 << 5;
    /// `madvise` was called with a discarding advice.
    pub const MADVISE: u32 = 1 << 6;
    /// `brk` was called.
    pub const BRK: u32 = 1 << 7;
    /// A range of virtual memory became mapped (after the fact), a
    /// library the dynamic loader loaded (`dlopen`) included.
    pub const VM_MAPPED: u32 = 1 << 16;
    /// A range of virtual memory is about to be unmapped: by `munmap`,
    /// `mremap` (its source where it may move it; of a shrink, which
    /// stays in place, the pages past the new end), `shmdt`, a shrinking `brk`/`sbrk`, a
    /// discarding `madvise` or `process_madvise` (one event per range),
    /// a `fallocate`, `ftruncate` or `truncate` that discards pages of a
    /// mapped file, or an `open`, `openat` or `shm_open` with `O_TRUNC`
    /// that empties one (one per mapping), or a call that maps at a fixed
    /// address over it
    /// (`mmap` with `MAP_FIXED`, `mremap` with `MREMAP_FIXED` at its
    /// destination, `shmat` with `SHM_REMAP`, `remap_file_pages`, which
    /// puts other pages of the file in the range), reported whether or not
    /// anything was mapped there, or userfaultfd's `UFFDIO_MOVE` (an
    /// `ioctl`) from its source range. One exception comes after the range
    /// went: a library the dynamic loader unloaded (`dlclose`), which it
    /// unmaps out of any hook's sight.
    pub const VM_UNMAPPED: u32 = 1 << 17;
    /// A typed (e.g. CUDA) allocation succeeded.
    pub const MEM_TYPE_ALLOC: u32 = 1 << 20;
    /// A typed allocation is about to be freed: by a free call, or by the
    /// destruction of the CUDA context it was made in (`cuCtxDestroy`,
    /// `cuDevicePrimaryCtxReset`; the last `cuDevicePrimaryCtxRelease`
    /// reports just after the call, which alone shows it was the last),
    /// or by the unload of the module it is a global of.
    pub const MEM_TYPE_FREE: u32 = 1 << 21;
    /// Flag: register the handler without installing hooks.
    pub const NO_INSTALL: u32 = 1 << 24;
    /// Flag: replay allocations that existed before the handler.
    pub const EXISTING_ALLOC: u32 = 1 << 25;

    /// Every event bit (flags excluded).
    pub const ALL_EVENTS: u32 = MMAP
        | MUNMAP
        | MREMAP
        | SHMAT
        | SHMDT
        | SBRK
        | MADVISE
        | BRK
        | VM_MAPPED
        | VM_UNMAPPED
        | MEM_TYPE_ALLOC
        | MEM_TYPE_FREE;
    /// Every flag bit.
    pub const ALL_FLAGS: u32 = NO_INSTALL | EXISTING_ALLOC;

    /// Whether `mask` is a handler's mask this version understands: at
    /// least one event, and no bit that is neither an event nor a flag (a
    /// program built against a later header, asking for an event this
    /// version never reports, is refused rather than left waiting for it).
    ///
    /// # Errors
    ///
    /// [`RegisterError::UnknownBits`](super::RegisterError::UnknownBits) or
    /// [`RegisterError::NoEvents`](super::RegisterError::NoEvents).
    pub const fn check_mask(mask: u32) -> Result<(), super::RegisterError> {
        let unknown = mask & !(ALL_EVENTS | ALL_FLAGS);
        if unknown != 0 {
            Err(super::RegisterError::UnknownBits { bits: unknown })
        } else if mask & ALL_EVENTS == 0 {
            Err(super::RegisterError::NoEvents)
        } else {
            Ok(())
        }
    }

    /// The name of a single event bit, as the C header and the CLI print it.
    pub const fn name(bit: u32) -> Option<&'static str> {
        Some(match bit {
            MMAP => "MMAP",
            MUNMAP => "MUNMAP",
            MREMAP => "MREMAP",
            SHMAT => "SHMAT",
            SHMDT => "SHMDT",
            SBRK => "SBRK",
            MADVISE => "MADVISE",
            BRK => "BRK",
            VM_MAPPED => "VM_MAPPED",
            VM_UNMAPPED => "VM_UNMAPPED",
            MEM_TYPE_ALLOC => "MEM_TYPE_ALLOC",
            MEM_TYPE_FREE => "MEM_TYPE_FREE",
            _ => return None,
        })
    }
}

/// The "failed" pointer result of `mmap`, `mremap`, `shmat` and `sbrk`
/// (`(void *)-1`).
pub const INVALID_PTR: usize = usize::MAX;

/// `mmap(addr, length, prot, flags, fd, offset)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmapEvent {
    /// Mapped address, or [`INVALID_PTR`] while not yet mapped.
    pub result: usize,
    /// Requested address.
    pub address: usize,
    /// Length in bytes.
    pub size: usize,
    /// `PROT_*` bits.
    pub prot: i32,
    /// `MAP_*` flags.
    pub flags: i32,
    /// File descriptor.
    pub fd: i32,
    /// File offset.
    pub offset: i64,
}

/// `munmap(addr, length)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MunmapEvent {
    /// 0 on success, -1 while not yet done.
    pub result: i32,
    /// Start of the range.
    pub address: usize,
    /// Length in bytes.
    pub size: usize,
}

/// `mremap(old_address, old_size, new_size, flags, new_address)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MremapEvent {
    /// New address, or [`INVALID_PTR`] while not yet done.
    pub result: usize,
    /// Old address.
    pub address: usize,
    /// Old size.
    pub old_size: usize,
    /// New size.
    pub new_size: usize,
    /// `MREMAP_*` flags.
    pub flags: i32,
    /// Requested new address (with `MREMAP_FIXED`).
    pub new_address: usize,
}

/// `shmat(shmid, shmaddr, shmflg)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmatEvent {
    /// Attached address, or [`INVALID_PTR`] while not yet attached.
    pub result: usize,
    /// Segment id.
    pub shmid: i32,
    /// Requested address.
    pub shmaddr: usize,
    /// `SHM_*` flags.
    pub shmflg: i32,
}

/// `shmdt(shmaddr)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShmdtEvent {
    /// 0 on success, -1 while not yet done.
    pub result: i32,
    /// Attached address.
    pub shmaddr: usize,
}

/// `sbrk(increment)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SbrkEvent {
    /// Previous break, or [`INVALID_PTR`] while not yet done.
    pub result: usize,
    /// Increment in bytes.
    pub increment: isize,
}

/// `brk(addr)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BrkEvent {
    /// 0 on success, -1 while not yet done.
    pub result: i32,
    /// Requested break.
    pub addr: usize,
}

/// `madvise(addr, length, advice)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadviseEvent {
    /// 0 on success, -1 while not yet done.
    pub result: i32,
    /// Start of the range.
    pub addr: usize,
    /// Length in bytes.
    pub length: usize,
    /// `MADV_*` advice.
    pub advice: i32,
}

/// `VM_MAPPED` / `VM_UNMAPPED`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmEvent {
    /// Start of the range.
    pub address: usize,
    /// Length in bytes. memhook's host hooks report whole pages for the
    /// calls that work in pages (mmap, munmap, mremap, madvise,
    /// process_madvise, shmat, shmdt): `munmap(p, 100)` is `VM_UNMAPPED` of p's whole page. brk and
    /// sbrk report the bytes the break moved.
    pub size: usize,
}

/// `MEM_TYPE_ALLOC` / `MEM_TYPE_FREE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemTypeEvent {
    /// Start of the allocation.
    pub address: usize,
    /// Length in bytes (0 when unknown).
    pub size: usize,
    /// A [`crate::memtype::MemType`] value.
    pub mem_type: u32,
}

/// One event, as handlers see it.
///
/// `repr(C, u32)`: a `u32` tag, then every variant's payload at one
/// offset, and every host event's payload starts with its `result`, so
/// reading a result is a test of the kind and one load, not a jump over
/// every kind (hooks and the result rule read it on every call). Each
/// variant's discriminant is its event bit, so [`Event::kind`] is the tag
/// itself: one load, where a discriminant counted from 0 took a table in
/// read-only data (a line more for a hook to miss after a system call).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, u32)]
pub enum Event {
    /// [`bits::MMAP`].
    Mmap(MmapEvent) = bits::MMAP,
    /// [`bits::MUNMAP`].
    Munmap(MunmapEvent) = bits::MUNMAP,
    /// [`bits::MREMAP`].
    Mremap(MremapEvent) = bits::MREMAP,
    /// [`bits::SHMAT`].
    Shmat(ShmatEvent) = bits::SHMAT,
    /// [`bits::SHMDT`].
    Shmdt(ShmdtEvent) = bits::SHMDT,
    /// [`bits::SBRK`].
    Sbrk(SbrkEvent) = bits::SBRK,
    /// [`bits::MADVISE`].
    Madvise(MadviseEvent) = bits::MADVISE,
    /// [`bits::BRK`].
    Brk(BrkEvent) = bits::BRK,
    /// [`bits::VM_MAPPED`].
    VmMapped(VmEvent) = bits::VM_MAPPED,
    /// [`bits::VM_UNMAPPED`].
    VmUnmapped(VmEvent) = bits::VM_UNMAPPED,
    /// [`bits::MEM_TYPE_ALLOC`].
    MemTypeAlloc(MemTypeEvent) = bits::MEM_TYPE_ALLOC,
    /// [`bits::MEM_TYPE_FREE`].
    MemTypeFree(MemTypeEvent) = bits::MEM_TYPE_FREE,
}

impl Event {
    /// The event's bit in [`bits`].
    #[inline]
    pub const fn kind(&self) -> u32 {
        match self {
            Event::Mmap(_) => bits::MMAP,
            Event::Munmap(_) => bits::MUNMAP,
            Event::Mremap(_) => bits::MREMAP,
            Event::Shmat(_) => bits::SHMAT,
            Event::Shmdt(_) => bits::SHMDT,
            Event::Sbrk(_) => bits::SBRK,
            Event::Madvise(_) => bits::MADVISE,
            Event::Brk(_) => bits::BRK,
            Event::VmMapped(_) => bits::VM_MAPPED,
            Event::VmUnmapped(_) => bits::VM_UNMAPPED,
            Event::MemTypeAlloc(_) => bits::MEM_TYPE_ALLOC,
            Event::MemTypeFree(_) => bits::MEM_TYPE_FREE,
        }
    }

    /// The result word of a host event (pointer results as addresses), or
    /// `None` for events without a result.
    #[inline]
    pub const fn result(&self) -> Option<isize> {
        // By class of kind, so that the arms of each match are one load at
        // one offset (`repr(C)`, result first) and fold into it: no jump
        // table.
        let kind = self.kind();
        if kind & PTR_RESULTS != 0 {
            return Some(match self {
                Event::Mmap(e) => e.result,
                Event::Mremap(e) => e.result,
                Event::Shmat(e) => e.result,
                Event::Sbrk(e) => e.result,
                _ => 0,
            } as isize);
        }
        if kind & INT_RESULTS != 0 {
            return Some(match self {
                Event::Munmap(e) => e.result,
                Event::Shmdt(e) => e.result,
                Event::Madvise(e) => e.result,
                Event::Brk(e) => e.result,
                _ => 0,
            } as isize);
        }
        None
    }

    /// Where every kind's payload (the variant's struct: [`MmapEvent`],
    /// [`VmEvent`], ...) lies in an `Event`, in bytes from its start: the
    /// same for all kinds, since `repr(C, u32)` lays an enum with fields
    /// out as its tag followed by a union of its variants.
    pub const PAYLOAD_OFFSET: usize = {
        let e = Event::VmMapped(VmEvent { address: 0, size: 0 });
        let base = (&raw const e).cast::<u8>();
        let Event::VmMapped(v) = &e else { unreachable!() };
        // SAFETY: both pointers are into `e`, the payload after its start.
        unsafe { (&raw const *v).cast::<u8>().offset_from(base) as usize }
    };

    /// The event's payload in place, [`Self::PAYLOAD_OFFSET`] bytes into
    /// it whatever the kind (one add, no look at the kind): for a C
    /// handler given the payload as the C ABI's union, whose members have
    /// the payloads' layouts, with no copy either way.
    /// The `size_of::<Event>() - PAYLOAD_OFFSET` bytes from it are the
    /// event's own (the largest payload's room); every field of every
    /// payload is a plain integer, valid for any bits written there.
    #[inline(always)]
    pub fn payload_ptr(&mut self) -> *mut u8 {
        (&raw mut *self).cast::<u8>().wrapping_add(Self::PAYLOAD_OFFSET)
    }

    fn set_result(&mut self, word: isize) {
        match self {
            Event::Mmap(e) => e.result = word as usize,
            Event::Mremap(e) => e.result = word as usize,
            Event::Shmat(e) => e.result = word as usize,
            Event::Sbrk(e) => e.result = word as usize,
            Event::Munmap(e) => e.result = word as i32,
            Event::Shmdt(e) => e.result = word as i32,
            Event::Madvise(e) => e.result = word as i32,
            Event::Brk(e) => e.result = word as i32,
            _ => {}
        }
    }

    /// Whether the event carries a result that is still invalid (the call has
    /// not been made, or failed). `false` for events without a result.
    #[inline]
    pub const fn result_is_invalid(&self) -> bool {
        match self.result() {
            // INVALID_PTR and -1 are the same word.
            Some(word) => word == -1,
            None => false,
        }
    }
}

/// A registered handler: anything `Copy` that can be called with an event
/// and compared (so that C callers can unregister by `(callback, arg)`).
pub trait Handler: Copy + PartialEq {
    /// Handles one event. Must not allocate, and must not block on anything a
    /// hooked call can hold.
    fn call(&self, event: &mut Event);
}

/// A plain function and a context word: the simplest [`Handler`].
///
/// Two are equal (for [`Dispatcher::unregister_handler`]) when their
/// function addresses and contexts are. Rust does not promise one address
/// per function: a pointer made from the function's name in another crate
/// or codegen unit may differ (Miri makes them differ on purpose). To
/// unset by handler, keep the pointer that was registered (a `static`
/// holding it is one pointer), or unset by id.
#[derive(Clone, Copy, Debug)]
pub struct FnHandler {
    /// The function.
    pub func: fn(&mut Event, usize),
    /// Passed to `func` unchanged.
    pub context: usize,
}

impl PartialEq for FnHandler {
    fn eq(&self, other: &Self) -> bool {
        core::ptr::fn_addr_eq(self.func, other.func) && self.context == other.context
    }
}

impl Handler for FnHandler {
    #[inline]
    fn call(&self, event: &mut Event) {
        (self.func)(event, self.context)
    }
}

/// Deepest nesting of dispatch on one thread; an event raised deeper goes
/// straight to the original call and is counted in
/// [`Dispatcher::nested_overflows`].
pub const MAX_NESTING: u32 = 4;

/// Per-thread dispatch state, owned by the caller (a thread-local in the Linux
/// runtime). Never shared between threads: the nesting depth, the reader
/// slot, and whether the thread is changing the handlers (so that a
/// signal handler that interrupted the change, and changes them too, is
/// refused rather than left waiting for itself).
#[derive(Debug, Default)]
pub struct DispatchDepth(core::cell::Cell<u32>, core::cell::Cell<SlotRef>, core::cell::Cell<bool>);

/// Which reader slot of which dispatcher a thread uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SlotRef {
    /// The dispatcher's address (0: none claimed yet).
    dispatcher: usize,
    /// Its slot index, or [`NO_SLOT`].
    index: usize,
}

/// A thread that found every slot taken: it uses the shared counters.
const NO_SLOT: usize = usize::MAX;

impl DispatchDepth {
    /// Depth 0: not dispatching.
    pub const fn new() -> Self {
        Self(
            core::cell::Cell::new(0),
            core::cell::Cell::new(SlotRef {
                dispatcher: 0,
                index: 0,
            }),
            core::cell::Cell::new(false),
        )
    }

    /// How many dispatches are running on this thread.
    pub fn get(&self) -> u32 {
        self.0.get()
    }
}

/// The mark of a thread changing the handlers ([`DispatchDepth`]'s third
/// field), set before the writer's lock is asked for and cleared after
/// it is let go (on every way out: the guard's drop). A signal handler
/// on the same thread sees the mark wherever it interrupts: the compiler
/// fences keep the mark's stores on their sides of the lock's, as the
/// thread runs them (one thread: no fence between cores is needed).
struct Changing<'a>(&'a core::cell::Cell<bool>);

impl<'a> Changing<'a> {
    fn mark(flag: &'a core::cell::Cell<bool>) -> Self {
        flag.set(true);
        core::sync::atomic::compiler_fence(Ordering::SeqCst);
        Changing(flag)
    }
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        core::sync::atomic::compiler_fence(Ordering::SeqCst);
        self.0.set(false);
    }
}

/// Identifies a registration, for [`Dispatcher::unregister`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HandlerId(u32);

impl HandlerId {
    /// The raw id (unique per dispatcher, never reused before 2^32 registrations).
    pub const fn get(self) -> u32 {
        self.0
    }
}

/// Why a registration failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterError {
    /// The handler table holds its capacity already.
    Full {
        /// The table's capacity.
        capacity: usize,
    },
    /// Called from inside a handler on this thread, or from a signal
    /// handler that interrupted this thread's own change of the handlers:
    /// waiting for the table to drain, or for the writer's lock, would
    /// wait for ourselves.
    InsideHandler,
    /// The event mask names no event.
    NoEvents,
    /// The event mask has bits that are neither an event nor a flag of
    /// this version.
    UnknownBits {
        /// Those bits.
        bits: u32,
    },
    /// No handler has that id.
    NotFound,
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterError::Full { capacity } => {
                write!(f, "handler table is full ({capacity} handlers)")
            }
            RegisterError::InsideHandler => f.write_str(
                "cannot change handlers from inside a handler, or from a signal handler that interrupted \
                     this thread's own change of them (it would wait for itself)",
            ),
            RegisterError::NoEvents => f.write_str("event mask names no event"),
            RegisterError::UnknownBits { bits } => write!(
                f,
                "event mask has bits {bits:#x} that are neither an event ({:#x}) nor a flag ({:#x}) of this memhook",
                bits::ALL_EVENTS,
                bits::ALL_FLAGS
            ),
            RegisterError::NotFound => f.write_str("no such handler"),
        }
    }
}

impl core::error::Error for RegisterError {}

#[derive(Clone, Copy, Debug)]
struct Entry<H> {
    id: u32,
    events: u32,
    priority: i32,
    handler: H,
}

/// One handler table: the entries in call order (ascending priority, ties
/// in registration order), and for every event bit the entries that want
/// it, before and after the original call, as bit sets over entry indices
/// (so that a pass touches only the entries it calls).
#[derive(Clone)]
struct Table<H, const N: usize> {
    entries: heapless::Vec<Entry<H>, N>,
    /// `calls[bit][0]`: entries with priority < 0 that want event `1 << bit`;
    /// `calls[bit][1]`: those with priority >= 0.
    calls: [[u64; 2]; 32],
}

impl<H: Copy, const N: usize> Table<H, N> {
    const FITS: () = assert!(N <= 64, "a handler table holds at most 64 entries (one bit each)");

    const fn new() -> Self {
        let () = Self::FITS;
        Self {
            entries: heapless::Vec::new(),
            calls: [[0; 2]; 32],
        }
    }

    /// Recomputes `calls` after the entries changed; returns the events
    /// that have pre- and post-handlers.
    fn index(&mut self) -> (u32, u32) {
        self.calls = [[0; 2]; 32];
        let (mut pre, mut post) = (0, 0);
        for (i, e) in self.entries.iter().enumerate() {
            let after = usize::from(e.priority >= 0);
            let mut events = e.events;
            while events != 0 {
                let bit = events.trailing_zeros() as usize;
                events &= events - 1;
                self.calls[bit][after] |= 1 << i;
            }
            if after == 0 {
                pre |= e.events;
            } else {
                post |= e.events;
            }
        }
        (pre, post)
    }
}

/// The host events whose result is a pointer.
const PTR_RESULTS: u32 = bits::MMAP | bits::MREMAP | bits::SHMAT | bits::SBRK;
/// The host events whose result is an `int`.
const INT_RESULTS: u32 = bits::MUNMAP | bits::SHMDT | bits::MADVISE | bits::BRK;
/// The events that carry a result (the host calls): [`Event::result`] is
/// `Some` exactly for these.
const RESULT_EVENTS: u32 = PTR_RESULTS | INT_RESULTS;

/// A visit's phase bits: handlers before the original call (priority < 0).
const PRE: u32 = 1;
/// ... and after it (priority >= 0).
const POST: u32 = 2;

/// What a dispatch did, for counters and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatched {
    /// Handlers called.
    pub handlers: u32,
    /// Whether the original call was made (it is skipped when a pre-handler
    /// supplied a valid result).
    pub called_original: bool,
    /// The thread was nested [`MAX_NESTING`] deep: handlers were skipped.
    pub overflowed: bool,
}

/// A dispatch between [`Dispatcher::begin`] and [`Dispatcher::finish`].
#[must_use = "a begun dispatch must be finished"]
#[derive(Debug)]
pub struct Pass {
    handlers: u32,
    /// Whether the caller makes the original call: no pre-handler supplied
    /// a valid result (events without a result always call it).
    pub call_original: bool,
    overflowed: bool,
    /// The handler masks `begin` saw, so that both halves agree on which
    /// passes there are.
    any: u32,
    post_mask: u32,
}

/// The handler table and dispatch. `N` is the capacity.
#[repr(C)]
pub struct Dispatcher<H, const N: usize> {
    /// What every dispatch reads, alone on one cache line (after a system
    /// call the caches are cold: one line, not three).
    hot: Hot,
    /// Reads in progress per table, of threads without a slot (their own
    /// line: `hot` stays read-only for dispatch).
    readers: [AtomicUsize; 2],
    /// Next id; held while a registration rebuilds the spare table.
    writer: Mutex<u32>,
    overflows: AtomicU64,
    tables: [Cell<Table<H, N>>; 2],
    slots: [ReaderSlot; READER_SLOTS],
}

/// The fields dispatch reads on every call, written only by registration.
#[repr(C, align(64))]
struct Hot {
    /// The index of the live table.
    live: AtomicUsize,
    /// Events that have a handler with priority < 0 (resp. >= 0).
    pre_mask: AtomicU32,
    post_mask: AtomicU32,
    /// The platform's [`Asymmetric`] (null until
    /// [`Dispatcher::enable_slots`]): readers with a slot use it.
    asymmetric: AtomicPtr<Asymmetric>,
}

// SAFETY: the tables are only written by the writer-lock holder, and only the
// table that is not live and has no readers (the protocol in the module docs);
// handlers are `Copy` data and are called from any thread, so `H: Send + Sync`
// is required for that sharing.
unsafe impl<H: Send + Sync, const N: usize> Sync for Dispatcher<H, N> {}
// SAFETY: as above; moving the dispatcher moves plain data and atomics.
unsafe impl<H: Send, const N: usize> Send for Dispatcher<H, N> {}

/// Reader slots per dispatcher: the first this many threads that dispatch
/// mark the table they read with plain stores to a slot of their own;
/// later threads use the shared counters (a locked read-modify-write to
/// enter and another to leave).
#[cfg(not(memhook_loom))]
pub const READER_SLOTS: usize = 128;
/// Reader slots per dispatcher (loom model version: two threads' worth).
#[cfg(memhook_loom)]
pub const READER_SLOTS: usize = 2;

/// How many waits on a slot's mark [`Dispatcher::drain`] makes between
/// two looks at whether its owner still exists.
const LIVENESS_EVERY: u32 = 1024;

/// One thread's reader slot, alone on its cache line.
#[repr(align(128))]
struct ReaderSlot {
    /// The owning thread's id (0: free).
    owner: AtomicU64,
    /// How many reads of table 0 and of table 1 the owner has in progress.
    /// Only the owner writes them (a signal handler on the owner nests a
    /// read and undoes it before the interrupted code resumes), so a plain
    /// load and store count, with no locked instruction.
    reading: [AtomicU32; 2],
}

impl ReaderSlot {
    #[cfg(not(memhook_loom))]
    const fn new() -> Self {
        Self {
            owner: AtomicU64::new(0),
            reading: [AtomicU32::new(0), AtomicU32::new(0)],
        }
    }

    #[cfg(memhook_loom)]
    fn new() -> Self {
        Self {
            owner: AtomicU64::new(0),
            reading: [AtomicU32::new(0), AtomicU32::new(0)],
        }
    }
}

/// What a platform gives a dispatcher so that readers can skip locked
/// instructions (the asymmetric handshake the module docs describe).
#[derive(Debug)]
pub struct Asymmetric {
    /// Makes every thread of the process execute a full memory barrier
    /// before it returns (Linux: `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`);
    /// `false` if it could not.
    pub barrier: fn() -> bool,
    /// The calling thread's id, never 0.
    pub thread_id: fn() -> u64,
    /// Whether the thread with this id still exists in this process (a
    /// slot whose owner is gone is taken over, and its marks are not
    /// waited for).
    pub thread_alive: fn(u64) -> bool,
}

enum ReadGuard<'a> {
    Shared(&'a AtomicUsize),
    Slot(&'a AtomicU32),
}

impl Drop for ReadGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        match self {
            ReadGuard::Shared(readers) => {
                readers.fetch_sub(1, Ordering::Release);
            }
            ReadGuard::Slot(reading) => reading.store(reading.load(Ordering::Relaxed) - 1, Ordering::Release),
        }
    }
}

impl<H: Handler, const N: usize> Dispatcher<H, N> {
    /// An empty dispatcher.
    #[cfg(not(memhook_loom))]
    pub const fn new() -> Self {
        Self {
            hot: Hot {
                live: AtomicUsize::new(0),
                pre_mask: AtomicU32::new(0),
                post_mask: AtomicU32::new(0),
                asymmetric: AtomicPtr::new(core::ptr::null_mut()),
            },
            readers: [AtomicUsize::new(0), AtomicUsize::new(0)],
            writer: Mutex::new(0),
            overflows: AtomicU64::new(0),
            tables: [Cell::new(Table::new()), Cell::new(Table::new())],
            slots: [const { ReaderSlot::new() }; READER_SLOTS],
        }
    }

    /// An empty dispatcher (loom model version).
    #[cfg(memhook_loom)]
    pub fn new() -> Self {
        Self {
            hot: Hot {
                live: AtomicUsize::new(0),
                pre_mask: AtomicU32::new(0),
                post_mask: AtomicU32::new(0),
                asymmetric: AtomicPtr::new(core::ptr::null_mut()),
            },
            readers: [AtomicUsize::new(0), AtomicUsize::new(0)],
            writer: Mutex::new(0),
            overflows: AtomicU64::new(0),
            tables: [Cell::new(Table::new()), Cell::new(Table::new())],
            slots: core::array::from_fn(|_| ReaderSlot::new()),
        }
    }

    /// Whether some handler wants any of `events` (one relaxed load pair
    /// from the line dispatch reads anyway): a hook with nothing to deliver
    /// skips everything else. A registration publishes its table before
    /// these masks, so a hook that sees a new bit finds its handler.
    #[inline(always)]
    pub fn wants(&self, events: u32) -> bool {
        (self.hot.pre_mask.load(Ordering::Relaxed) | self.hot.post_mask.load(Ordering::Relaxed)) & events != 0
    }

    /// The capacity of the handler table.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Events delivered straight to the original because the thread was
    /// already [`MAX_NESTING`] dispatches deep.
    pub fn nested_overflows(&self) -> u64 {
        self.overflows.load(Ordering::Relaxed)
    }

    /// Lets threads read with a slot of their own: `platform` supplies the
    /// process-wide barrier registrations then use. Call once, early
    /// (before threads dispatch, or at any time: readers already in flight
    /// on the shared counters are waited for as before).
    pub fn enable_slots(&self, platform: &'static Asymmetric) {
        self.hot
            .asymmetric
            .store(core::ptr::from_ref(platform).cast_mut(), Ordering::Release);
    }

    /// Whether [`Self::enable_slots`] was called.
    pub fn slots_enabled(&self) -> bool {
        self.platform().is_some()
    }

    fn platform(&self) -> Option<&'static Asymmetric> {
        let p = self.hot.asymmetric.load(Ordering::Acquire);
        // SAFETY: the only value ever stored is a `&'static Asymmetric`
        // (enable_slots), never written through; else it is null.
        unsafe { p.as_ref() }
    }

    /// This thread's reader slot, claimed on its first dispatch (a free
    /// slot, or one whose owner thread is gone); `None` when slots are not
    /// enabled or all are taken by live threads.
    #[inline]
    fn slot(&self, depth: &DispatchDepth) -> Option<&ReaderSlot> {
        let me = core::ptr::from_ref(self).addr();
        let r = depth.1.get();
        if r.dispatcher == me {
            return self.slots.get(r.index);
        }
        self.claim_slot(depth, me)
    }

    #[cold]
    fn claim_slot(&self, depth: &DispatchDepth, me: usize) -> Option<&ReaderSlot> {
        let platform = self.platform()?;
        let id = (platform.thread_id)();
        let mut index = NO_SLOT;
        for (i, slot) in self.slots.iter().enumerate() {
            let owner = slot.owner.load(Ordering::Relaxed);
            // A slot is taken over only from a thread that is gone, and
            // reads nothing. A thread that left a handler without
            // returning (cancelled in it: see `drain`) may have left its
            // marks: they are cleared, by the new owner, the only thread
            // that writes them from here on.
            let free = owner == 0 || !(platform.thread_alive)(owner);
            if free
                && slot
                    .owner
                    .compare_exchange(owner, id, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                if owner != 0 {
                    for r in &slot.reading {
                        r.store(0, Ordering::Release);
                    }
                }
                index = i;
                break;
            }
        }
        depth.1.set(SlotRef { dispatcher: me, index });
        self.slots.get(index)
    }

    /// Marks the live table busy and returns its index. Never waits: it
    /// retries only if a registration swapped tables in between.
    ///
    /// A thread with a slot counts itself there with a plain store, then
    /// re-reads `live`; [`Self::update`] stores `live`, then has the
    /// platform barrier run a full fence on every thread, then reads the
    /// slots. A reader whose store came before its thread's fence is seen
    /// by the writer; one whose store came after re-reads `live` after it,
    /// sees the new table, and leaves the old one alone (the asymmetric
    /// form of Dekker's handshake: the cost is all on the rare writer).
    ///
    /// Without a slot, the shared counters form the symmetric handshake:
    /// the reader counts itself, then (SeqCst fence) re-reads `live`; the
    /// writer stores `live`, then (SeqCst fence) reads the count. Whichever
    /// fence comes second sees the other side's write.
    #[inline(always)]
    fn enter(&self, depth: Option<&DispatchDepth>) -> (usize, ReadGuard<'_>) {
        if let Some(slot) = depth.and_then(|d| self.slot(d)) {
            loop {
                let t = self.hot.live.load(Ordering::Acquire) & 1;
                let reading = &slot.reading[t];
                reading.store(reading.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                let guard = ReadGuard::Slot(reading);
                // The reader's half of the handshake: nothing but program
                // order (the writer's barrier supplies the fence). loom has
                // no such barrier, so the model fences both halves.
                #[cfg(not(memhook_loom))]
                core::sync::atomic::compiler_fence(Ordering::SeqCst);
                #[cfg(memhook_loom)]
                fence(Ordering::SeqCst);
                if self.hot.live.load(Ordering::Acquire) == t {
                    return (t, guard);
                }
                drop(guard);
            }
        }
        self.enter_shared()
    }

    /// [`Self::enter`] through the shared counters (no slot: slots are
    /// off, or all taken), out of line so that the slot path stays short.
    #[cold]
    #[inline(never)]
    fn enter_shared(&self) -> (usize, ReadGuard<'_>) {
        loop {
            let t = self.hot.live.load(Ordering::Acquire) & 1;
            // Production: a SeqCst RMW then a SeqCst load, ordered with the
            // writer's SeqCst store and load in the single total order of
            // SeqCst operations (and a locked RMW is a full barrier on
            // x86). loom models SeqCst loads and stores as AcqRel, so the
            // model checks the equivalent fence form.
            #[cfg(not(memhook_loom))]
            self.readers[t].fetch_add(1, Ordering::SeqCst);
            #[cfg(memhook_loom)]
            self.readers[t].fetch_add(1, Ordering::Relaxed);
            let guard = ReadGuard::Shared(&self.readers[t]);
            #[cfg(memhook_loom)]
            fence(Ordering::SeqCst);
            if self.hot.live.load(Ordering::SeqCst) == t {
                return (t, guard);
            }
            drop(guard);
        }
    }

    /// The writer's barrier after publishing a table: every thread's slot
    /// store before its next re-read of `live` is visible after this.
    fn barrier(&self) {
        #[cfg(memhook_loom)]
        fence(Ordering::SeqCst);
        if let Some(platform) = self.platform()
            && !(platform.barrier)()
        {
            // The platform could not fence the other threads (it cannot
            // fail once set up): give stores in flight time to land.
            for _ in 0..100_000 {
                spin_wait();
            }
        }
    }

    /// Waits until table `t` has no readers (the writer's side of the
    /// handshakes in [`Self::enter`]; after [`Self::barrier`] when `live`
    /// just changed).
    ///
    /// A slot's marks whose owner thread is gone are passed over: a thread
    /// that never came back from a handler (cancelled at a cancellation
    /// point the handler called, or ended by `pthread_exit` in it) reads
    /// nothing, and waiting for its marks would hang every registration
    /// after it. Its owner is read after the barrier, so a thread that
    /// took the slot over before its fence there is seen as the owner,
    /// alive; one that takes it over after reads `live` after its
    /// takeover (a locked instruction, a full fence) and so reads the
    /// new table, not this one. A dead thread's id taken by a new thread
    /// meanwhile looks alive: the wait lasts while that thread does.
    /// Counts in the shared counters belong to no thread, and are waited
    /// for whatever left them.
    fn drain(&self, t: usize) {
        #[cfg(memhook_loom)]
        fence(Ordering::SeqCst);
        while self.readers[t].load(Ordering::SeqCst) != 0 {
            spin_wait();
        }
        if let Some(platform) = self.platform() {
            for slot in &self.slots {
                let mut spins = 0u32;
                while slot.reading[t].load(Ordering::Acquire) != 0 {
                    spins = spins.wrapping_add(1);
                    // Asked now and then: a system call each time.
                    if spins.is_multiple_of(LIVENESS_EVERY) {
                        let owner = slot.owner.load(Ordering::Acquire);
                        if owner != 0 && !(platform.thread_alive)(owner) {
                            break;
                        }
                    }
                    spin_wait();
                }
            }
        }
    }

    /// Reads table `t`.
    fn read<R>(&self, t: usize, f: impl FnOnce(&Table<H, N>) -> R) -> R {
        // SAFETY: table `t` was live when this thread entered it and its
        // reader count is held (ReadGuard), so no writer mutates it now.
        self.tables[t & 1].with(|p| f(unsafe { &*p }))
    }

    /// The entries of table `t` that want `event` in `phases` ([`PRE`]
    /// and/or [`POST`]), as a bit set over entry indices. Entries are in
    /// priority order, so every pre-handler's index is below every
    /// post-handler's: one ascending walk of the union runs the phases in
    /// order.
    #[inline(always)]
    fn todo(&self, t: usize, event: &Event, phases: u32) -> u64 {
        let bit = (event.kind().trailing_zeros() & 31) as usize;
        let [pre, post] = self.read(t, |table| table.calls[bit]);
        // Branch-free: each phase bit selects its set (all ones or none).
        let pre = pre & 0u64.wrapping_sub(u64::from(phases & PRE));
        let post = post & 0u64.wrapping_sub(u64::from((phases & POST) >> 1));
        pre | post
    }

    /// One visit of the live table: `first`'s handlers in `first_phases`,
    /// then `second`'s in `second_phases` (a hook's companion events share
    /// the visit). Inlined into each hook (through `begin` and `finish`),
    /// so that the path after a system call, which leaves the caches cold,
    /// runs from the hook's own lines and page rather than a shared copy
    /// elsewhere: on one H200 host, four rounds of each build in turn, an
    /// mmap+munmap pair with one empty handler added +58 to +64 ns
    /// (VM events) and +54 to +115 (all events) against +61 to +84 and
    /// +110 to +119 with one out-of-line copy.
    #[inline(always)]
    fn visit(
        &self,
        depth: &DispatchDepth,
        first: Option<&mut Event>,
        first_phases: u32,
        second: Option<&mut Event>,
        second_phases: u32,
    ) -> (u32, u32) {
        let (t, _read) = self.enter(Some(depth));
        let run = |event: Option<&mut Event>, phases: u32| {
            event.map_or(0, |e| match self.todo(t, e, phases) {
                0 => 0,
                todo => self.call_handlers(t, todo, e),
            })
        };
        (run(first, first_phases), run(second, second_phases))
    }

    /// Asks the cache for the lines a table visit for the events `kinds`
    /// reads, all at once: the hot line, the thread's reader slot, and in
    /// both tables (which one is live is itself on a line that may miss)
    /// the entries' start and each event's handler sets. For a caller
    /// about to dispatch after work that left the caches cold (a driver
    /// call): the visit's loads depend on one another (`live`, then the
    /// slot and that table's sets, then its entries), so that their misses
    /// would follow one another; asked for together, they overlap. A
    /// hint: it changes nothing a thread can observe.
    #[inline(always)]
    pub fn prefetch_visit(&self, depth: &DispatchDepth, kinds: u32) {
        #[cfg(all(target_arch = "x86_64", not(memhook_loom)))]
        {
            use crate::simd::prefetch;
            prefetch((&raw const self.hot).cast(), 1);
            let r = depth.1.get();
            if r.dispatcher == core::ptr::from_ref(self).addr()
                && let Some(slot) = self.slots.get(r.index)
            {
                prefetch((slot as *const ReaderSlot).cast(), 1);
            }
            for table in &self.tables {
                table.with(|p| {
                    // SAFETY: `p` points to this dispatcher's own table;
                    // taking a field's address reads nothing.
                    let (entries, calls) = unsafe { ((&raw const (*p).entries).cast::<u8>(), &raw const (*p).calls) };
                    prefetch(entries, 64);
                    let mut k = kinds;
                    while k != 0 {
                        let bit = k.trailing_zeros() as usize;
                        k &= k - 1;
                        prefetch(calls.cast::<[u64; 2]>().wrapping_add(bit).cast(), 1);
                    }
                });
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(memhook_loom))))]
        let _ = (depth, kinds);
    }

    /// The handler of table `t` at the lowest index in `todo`, which loses
    /// that bit; `None` when `todo` is empty.
    #[inline(always)]
    fn next_handler(&self, t: usize, todo: &mut u64) -> Option<H> {
        if *todo == 0 {
            return None;
        }
        let i = todo.trailing_zeros() as usize;
        *todo &= *todo - 1;
        self.read(t, |table| {
            debug_assert!(i < table.entries.len());
            // SAFETY: `todo`'s bits come from the table's `calls`, which
            // `Table::index` sets only for the indices of its entries (and
            // the table does not change while it is read). No bounds check:
            // the length lies on a cache line of its own.
            Some(unsafe { table.entries.as_slice().get_unchecked(i) }.handler)
        })
    }

    /// Calls the handlers of table `t` whose indices are the bits of
    /// `todo`, in index order.
    #[inline(always)]
    fn call_handlers(&self, t: usize, mut todo: u64, event: &mut Event) -> u32 {
        if event.kind() & RESULT_EVENTS != 0 {
            return self.call_handlers_ruled(t, todo, event);
        }
        // No result to guard (VM and memory-type events).
        let mut called = 0;
        while let Some(handler) = self.next_handler(t, &mut todo) {
            handler.call(event);
            called += 1;
        }
        called
    }

    /// [`Self::call_handlers`] for an event with a result: once valid (from
    /// the original, or filled by a handler), a result stays as it is.
    #[inline(never)]
    fn call_handlers_ruled(&self, t: usize, mut todo: u64, event: &mut Event) -> u32 {
        let mut called = 0;
        let mut kept = event.result().filter(|&word| word != -1);
        while let Some(handler) = self.next_handler(t, &mut todo) {
            handler.call(event);
            called += 1;
            match kept {
                // The result was valid: a handler may not change it.
                Some(word) if event.result() != Some(word) => event.set_result(word),
                Some(_) => {}
                None => kept = event.result().filter(|&word| word != -1),
            }
        }
        called
    }

    /// Dispatches `event`: pre-handlers, then `original` unless a pre-handler
    /// supplied a valid result (events without a result always call it), then
    /// post-handlers. No lock is taken and nothing allocates; the table is not
    /// held while `original` runs (see [`Self::begin`]).
    pub fn dispatch(&self, depth: &DispatchDepth, event: &mut Event, original: impl FnOnce(&mut Event)) -> Dispatched {
        self.dispatch_around(depth, None, event, original, |_| None)
    }

    /// [`Self::dispatch`] with companion events in the same table visits: a
    /// host hook's `VM_UNMAPPED` (`before`, delivered to all its handlers
    /// just before `event`'s pre-handlers) and `VM_MAPPED` (made by `after`
    /// from the finished event, delivered to all its handlers just after
    /// `event`'s post-handlers).
    /// One table visit before the original call and one after, each only
    /// when a handler wants it.
    pub fn dispatch_around(
        &self,
        depth: &DispatchDepth,
        mut before: Option<Event>,
        event: &mut Event,
        original: impl FnOnce(&mut Event),
        after: impl FnOnce(&Event) -> Option<Event>,
    ) -> Dispatched {
        let pass = self.begin(depth, before.as_mut(), event);
        if pass.call_original {
            original(event);
        }
        let mut next = after(event);
        self.finish(depth, pass, event, next.as_mut())
    }

    /// The first half of [`Self::dispatch_around`], for a hook that makes
    /// the original call itself (in its own frame, where the return from a
    /// system call lands on one frame, not several): enters the thread's
    /// nesting level and runs `before`'s handlers and `event`'s
    /// pre-handlers. The caller then makes the original call if
    /// [`Pass::call_original`] says so, and must hand the pass to
    /// [`Self::finish`] (on the same thread, before returning).
    ///
    /// No table is held across the original call: a registration never
    /// waits for a system call (which may itself wait for the registering
    /// thread: a FUSE daemon or a userfaultfd monitor in the same process).
    #[inline(always)]
    pub fn begin(&self, depth: &DispatchDepth, before: Option<&mut Event>, event: &mut Event) -> Pass {
        let d = depth.0.get();
        if d >= MAX_NESTING {
            return self.overflowed();
        }
        depth.0.set(d + 1);
        let (pre_mask, post_mask) = (
            self.hot.pre_mask.load(Ordering::Acquire),
            self.hot.post_mask.load(Ordering::Acquire),
        );
        let any = pre_mask | post_mask;
        let before = before.filter(|b| any & b.kind() != 0);
        let mut handlers = 0;
        let mut call_original = true;
        if before.is_some() || pre_mask & event.kind() != 0 {
            let (companion, own) = self.visit(depth, before, PRE | POST, Some(&mut *event), PRE);
            handlers = companion + own;
            // Only a pre-handler of the event itself can have supplied a
            // valid result.
            call_original = own == 0 || event.result().is_none_or(|word| word == -1);
        }
        Pass {
            handlers,
            call_original,
            overflowed: false,
            any,
            post_mask,
        }
    }

    /// The pass of an event raised [`MAX_NESTING`] deep: counted, and
    /// straight to the original.
    #[cold]
    #[inline(never)]
    fn overflowed(&self) -> Pass {
        self.overflows.fetch_add(1, Ordering::Relaxed);
        Pass {
            handlers: 0,
            call_original: true,
            overflowed: true,
            any: 0,
            post_mask: 0,
        }
    }

    /// The second half of [`Self::dispatch_around`]: `event`'s
    /// post-handlers, then all of `follow`'s, and the thread leaves the
    /// nesting level [`Self::begin`] entered.
    #[inline(always)]
    pub fn finish(
        &self,
        depth: &DispatchDepth,
        pass: Pass,
        event: &mut Event,
        follow: Option<&mut Event>,
    ) -> Dispatched {
        let mut handlers = pass.handlers;
        if !pass.overflowed {
            let follow = follow.filter(|f| pass.any & f.kind() != 0);
            if follow.is_some() || pass.post_mask & event.kind() != 0 {
                let (own, companion) = self.visit(depth, Some(event), POST, follow, PRE | POST);
                handlers += own + companion;
            }
            depth.0.set(depth.0.get() - 1);
        }
        Dispatched {
            handlers,
            called_original: pass.call_original,
            overflowed: pass.overflowed,
        }
    }

    /// Dispatches an event that has no original call (VM and MEM_TYPE events,
    /// or events reported by the embedder): every matching handler, in order.
    pub fn notify(&self, depth: &DispatchDepth, event: &mut Event) -> Dispatched {
        let d = depth.0.get();
        if d >= MAX_NESTING {
            return self.finish(depth, self.overflowed(), event, None);
        }
        depth.0.set(d + 1);
        let any = self.hot.pre_mask.load(Ordering::Acquire) | self.hot.post_mask.load(Ordering::Acquire);
        let mut handlers = 0;
        if any & event.kind() != 0 {
            // Pre- then post-handlers in one walk (there is no call between
            // them); the result rule holds across both.
            handlers = self.visit(depth, Some(event), PRE | POST, None, 0).0;
        }
        depth.0.set(d);
        Dispatched {
            handlers,
            called_original: true,
            overflowed: false,
        }
    }

    /// Whether any handler is registered for any bit of `events`.
    pub fn has_handlers(&self, events: u32) -> bool {
        let (t, _read) = self.enter(None);
        self.read(t, |table| table.entries.iter().any(|e| e.events & events != 0))
    }

    /// Runs `change` on a copy of the live table, publishes it, and waits
    /// until no thread still reads the old one.
    fn update<R>(
        &self,
        depth: &DispatchDepth,
        change: impl FnOnce(&mut heapless::Vec<Entry<H>, N>, &mut u32) -> Result<R, RegisterError>,
    ) -> Result<R, RegisterError> {
        if depth.get() > 0 || depth.2.get() {
            return Err(RegisterError::InsideHandler);
        }
        let _changing = Changing::mark(&depth.2);
        let mut next_id = self.writer.lock();
        let live = self.hot.live.load(Ordering::Relaxed);
        let spare = 1 - live;
        // Readers that entered the spare table before the last swap.
        self.drain(spare);
        let result = self.tables[spare].with_mut(|sp| {
            self.tables[live].with(|lp| {
                // SAFETY: we hold the writer lock, so no other thread writes
                // either table. `spare` is not live and had no readers after
                // we read `live`; a reader that counts itself into it from
                // now on re-checks `live` (see `enter`), finds it is not
                // `spare` until we store it below, and leaves without
                // reading. The live table is only read, as readers do.
                let (sp, lp) = unsafe { (&mut *sp, &*lp) };
                // Entry by entry, in place: `clone_from` would build the
                // whole table (3 KiB of C handlers) on the stack first, and
                // a signal handler may register on a small one. (Cannot
                // fail: both tables hold `N`.)
                sp.entries.clear();
                let _ = sp.entries.extend_from_slice(&lp.entries);
                let result = change(&mut sp.entries, &mut next_id)?;
                // Which events have pre- and post-handlers now, so that
                // dispatch skips a pass no handler needs.
                Ok((result, sp.index()))
            })
        });
        let (result, (pre, post)) = result?;
        self.hot.live.store(spare, Ordering::SeqCst);
        self.barrier();
        self.hot.pre_mask.store(pre, Ordering::Release);
        self.hot.post_mask.store(post, Ordering::Release);
        self.drain(live);
        Ok(result)
    }

    /// Registers `handler` for the events in `events` (flag bits are ignored
    /// here) at `priority`. Equal priorities run in registration order.
    ///
    /// # Errors
    ///
    /// [`RegisterError::Full`] when the table holds `N` handlers,
    /// [`RegisterError::InsideHandler`] when called from a handler,
    /// [`RegisterError::NoEvents`] when `events` names no event,
    /// [`RegisterError::UnknownBits`] when it has a bit that is neither an
    /// event nor a flag ([`bits::check_mask`]).
    pub fn register(
        &self,
        depth: &DispatchDepth,
        events: u32,
        priority: i32,
        handler: H,
    ) -> Result<HandlerId, RegisterError> {
        bits::check_mask(events)?;
        let events = events & bits::ALL_EVENTS;
        self.update(depth, |table, next_id| {
            if table.is_full() {
                return Err(RegisterError::Full { capacity: N });
            }
            let id = *next_id;
            *next_id = next_id.wrapping_add(1);
            let at = table.iter().position(|e| e.priority > priority).unwrap_or(table.len());
            let entry = Entry {
                id,
                events,
                priority,
                handler,
            };
            table
                .insert(at, entry)
                .map_err(|_| RegisterError::Full { capacity: N })?;
            Ok(HandlerId(id))
        })
    }

    /// Removes the registration `id`. When this returns, no thread is running
    /// that handler and none will start it.
    ///
    /// # Errors
    ///
    /// [`RegisterError::NotFound`] for an unknown id,
    /// [`RegisterError::InsideHandler`] when called from a handler.
    pub fn unregister(&self, depth: &DispatchDepth, id: HandlerId) -> Result<(), RegisterError> {
        self.update(depth, |table, _| {
            let at = table.iter().position(|e| e.id == id.0).ok_or(RegisterError::NotFound)?;
            table.remove(at);
            Ok(())
        })
    }

    /// Removes the bits `events` from every registration of `handler` (UCM's
    /// `unset_event_handler(events, cb, arg)`); registrations left with no
    /// event are removed. Returns how many registrations were removed.
    ///
    /// # Errors
    ///
    /// [`RegisterError::InsideHandler`] when called from a handler.
    pub fn unregister_handler(&self, depth: &DispatchDepth, events: u32, handler: &H) -> Result<usize, RegisterError> {
        self.update(depth, |table, _| {
            for e in table.iter_mut().filter(|e| e.handler == *handler) {
                e.events &= !events;
            }
            let before = table.len();
            table.retain(|e| e.events != 0);
            Ok(before - table.len())
        })
    }

    /// Number of registered handlers.
    pub fn len(&self) -> usize {
        let (t, _read) = self.enter(None);
        // SAFETY: as in `entry`: table `t` is held by the read guard.
        self.tables[t].with(|p| unsafe { (&*p).entries.len() })
    }

    /// Whether no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets readers and a registration that were in progress on threads
    /// that do not exist in this process (call in a `fork` child, with the
    /// forking thread's `depth`: its own slot, and a read it may be in the
    /// middle of, stay; it now has the child's thread id).
    ///
    /// # Safety
    ///
    /// Only the calling thread may exist (the child of `fork`, before it
    /// starts threads), so no count being reset belongs to a live reader.
    #[cfg(not(memhook_loom))]
    pub unsafe fn reset_after_fork(&self, depth: &DispatchDepth) {
        self.readers[0].store(0, Ordering::SeqCst);
        self.readers[1].store(0, Ordering::SeqCst);
        let mine = depth.1.get();
        let mine = (mine.dispatcher == core::ptr::from_ref(self).addr()).then_some(mine.index);
        for (i, slot) in self.slots.iter().enumerate() {
            if Some(i) == mine {
                let id = self.platform().map_or(0, |p| (p.thread_id)());
                slot.owner.store(id, Ordering::SeqCst);
            } else {
                slot.reading[0].store(0, Ordering::SeqCst);
                slot.reading[1].store(0, Ordering::SeqCst);
                slot.owner.store(0, Ordering::SeqCst);
            }
        }
        if self.writer.try_lock().is_none() {
            // SAFETY: the holder was a thread of the parent that does not
            // exist here (the caller's contract); the live table is intact
            // because a registration only publishes a finished spare table.
            unsafe { self.writer.force_unlock() };
        }
    }
}

#[cfg(not(memhook_loom))]
impl<H: Handler, const N: usize> Default for Dispatcher<H, N> {
    fn default() -> Self {
        Self::new()
    }
}

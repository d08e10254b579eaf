//! The process's memory-type map, fed by `MEM_TYPE_ALLOC` / `MEM_TYPE_FREE`
//! events (the CUDA hooks, or an embedder's [`crate::report_event`]).
//!
//! [`lookup`] never calls a driver and is safe from any thread at any time,
//! signal handlers included. Host memory is implied by absence: an address
//! in no recorded range answers [`Lookup::Absent`], which callers whose
//! typed allocations are all hooked may read as host.
//!
//! The map (4.5 MiB at [`CAPACITY`]) is zero bytes until written, so
//! it lies in `.bss` and costs nothing until touched. At load, memhook asks
//! the kernel for transparent huge pages there (`madvise(MADV_HUGEPAGE)`;
//! `MEMHOOK_MAP_HUGE_PAGES=0` in the environment leaves it): a lookup
//! touches three random pages of it, each a TLB miss with 4 KiB pages. It
//! lies on three whole 2 MiB pages of its own (aligned and padded: see
//! [`memhook_core::memtype::HugePageAligned`]), so that all of it can be
//! huge. The cost is memory: a touched 2 MiB region is resident whole.

pub use memhook_core::memtype::{Inserted, Lookup, MapError, MemInfo, MemType, MemtypeMap};

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use memhook_core::event::Event;
use memhook_core::memtype::HugePageAligned;

/// Ranges the map holds (beyond this, new ranges are dropped, counted, and
/// answer Unknown). Up to three quarters of it, an update rewrites a few
/// slots near it; fuller, it moves the entries up to the nearest free slot,
/// as a sorted array does.
pub const CAPACITY: usize = 65_536;

/// The map. No function another crate can inline names it, so that it
/// stays a hidden symbol and the hooks address it directly (rip-relative):
/// a static that such a function names is exported from this crate's
/// object code, and every access to it then loads its address from the
/// GOT first, one more dependent load, and a miss when a hook updates the
/// map after a driver call. The public functions below are not
/// `#[inline]`, and the small ones are `#[inline(never)]`: rustc makes a
/// small function without calls inlinable across crates by itself. The
/// hooks reach it through [`map`].
///
/// On whole 2 MiB pages ([`HugePageAligned`]), all of it huge once advised.
static MAP: HugePageAligned<MemtypeMap<CAPACITY>> = HugePageAligned(MemtypeMap::new());

/// Whether the map's memory was advised for huge pages at load.
static HUGE_PAGES: AtomicBool = AtomicBool::new(false);

/// Asks for transparent huge pages over the map (its whole 4 KiB pages;
/// the kernel uses them where an aligned 2 MiB lies inside), before
/// anything touches it, unless `MEMHOOK_MAP_HUGE_PAGES=0`. A kernel without
/// them refuses, and the map works as before.
extern "C" fn advise_huge_pages_at_load() {
    if crate::env_says_0(c"MEMHOOK_MAP_HUGE_PAGES") {
        return;
    }
    let page = 4096;
    let (lo, hi) = map_range();
    let (start, end) = (lo.next_multiple_of(page), hi & !(page - 1));
    // SAFETY: the range lies inside MAP, a static of this library, mapped
    // for its lifetime; MADV_HUGEPAGE changes how the kernel backs it, not
    // its contents.
    if end > start && unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) } == 0 {
        HUGE_PAGES.store(true, Ordering::Relaxed);
    }
}

// Ahead of every other constructor of this object (the linkers put the
// sections named by priority first, lowest first; std's own runs at 99):
// `libmemhook.so`'s, which installs when preloaded or told to trace or
// report, lays the map out where libcuda is loaded already (the CUDA
// hooks attach), and a 2 MiB region written before its advice keeps 4 KiB
// pages (`ffi/tests/constructors.rs`).
#[used]
#[unsafe(link_section = ".init_array.00101")]
static ADVISE_HUGE_PAGES_AT_LOAD: extern "C" fn() = advise_huge_pages_at_load;

/// Whether the map's memory was advised for transparent huge pages (see
/// the module docs).
pub fn huge_pages() -> bool {
    HUGE_PAGES.load(Ordering::Relaxed)
}

/// The map's address range (for tests and diagnostics).
#[inline(never)]
pub fn map_range() -> (usize, usize) {
    let start = &raw const MAP as usize;
    (start, start + size_of::<HugePageAligned<MemtypeMap<CAPACITY>>>())
}

/// The map, for this crate's hooks (inlined into them).
#[inline(always)]
pub(crate) fn map() -> &'static MemtypeMap<CAPACITY> {
    &MAP.0
}

/// What the map says about `[addr, addr + len)`.
pub fn lookup(addr: usize, len: usize) -> Lookup {
    MAP.lookup(addr, len)
}

/// What the driver says about `[addr, addr + len)`: asks
/// `cuPointerGetAttributes` (loading libcuda through cudarc when no hooked
/// libcuda is loaded yet), records a CUDA answer in the map, and returns
/// it. Its range is the allocation's; for memory mapped into a reserved
/// range with `cuMemMap` (PyTorch's expandable segments, NCCL), the
/// mapping's, not the reservation the driver's range attributes give
/// there, which may hold mappings of other types and devices and
/// unmapped space (no CUDA memory: `Host`, unrecorded). (Not recorded in a CUDA graph's allocation, whose memory comes and
/// goes with the graph's launches: the map keeps it Unknown.) Plain host
/// memory is `Found` with [`MemType::Host`] (not recorded: absence means
/// host). [`Lookup::Unknown`] when there is no driver, it refuses, or the
/// range does not lie in one allocation.
///
/// This calls the driver (about 0.1 to 1.2 µs on an H200 host) and may
/// load it: [`lookup`] first, `classify` when it says Unknown.
///
/// Ask only about memory the caller knows to be allocated. A free of
/// the same allocation on another thread at the same moment (a
/// use-after-free in the caller) can end between the driver's answer
/// and its recording, and leave the freed range recorded, where only a
/// later allocation there (which the hooks record over it) corrects it.
/// The hooks' own records have no such window: a free hook takes its
/// range out before the free.
pub fn classify(addr: usize, len: usize) -> Lookup {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        if !crate::cuda::load_driver() {
            return Lookup::Unknown;
        }
        let Some(info) = crate::cuda::classify(addr) else {
            return Lookup::Unknown;
        };
        if info.mem_type == MemType::Host {
            return Lookup::Found(MemInfo {
                base: addr,
                len,
                ..info
            });
        }
        let inside = addr
            .checked_add(len)
            .zip(info.base.checked_add(info.len))
            .is_some_and(|(end, limit)| info.base <= addr && end <= limit);
        if !inside || info.len == 0 {
            return Lookup::Unknown;
        }
        // A graph allocation's range stays Unknown: the answer holds only
        // until the graph's next free or launch (see `cuda::graph`).
        if crate::cuda::graph_unsettled(addr) {
            return Lookup::Found(info);
        }
        // Recorded already as the driver says (a repeated question): no
        // writer work, which costs the map's lock and both its tables.
        // Marked: which call made it is not known (see `cuda::events`).
        if MAP.lookup(info.base, info.len) != Lookup::Found(info) {
            let _ = MAP.insert_marked(info.base, info.len, info.mem_type, info.device, true);
        }
        Lookup::Found(info)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (addr, len);
        Lookup::Unknown
    }
}

/// Records `[start, start + len)` as `mem_type` on `device` (-1: none).
/// (A CUDA free of the range, where the hooks are installed too, looks at
/// the driver's answer and puts the range back if the driver refused:
/// which call made the memory is not known.)
///
/// # Errors
///
/// An empty or wrapping range.
pub fn insert(start: usize, len: usize, mem_type: MemType, device: i32) -> Result<Inserted, MapError> {
    MAP.insert_marked(start, len, mem_type, device, true)
}

/// Forgets `[start, start + len)`.
///
/// # Errors
///
/// An empty or wrapping range.
pub fn remove(start: usize, len: usize) -> Result<(), MapError> {
    MAP.remove(start, len)
}

/// Forgets the recorded range that starts exactly at `start`, returning
/// it (`None`, changing nothing, when none starts there).
pub fn take(start: usize) -> Option<MemInfo> {
    MAP.take(start)
}

/// Children of `fork` (this process, or its forebears since their own
/// fork) in which the map had to be mended.
static MENDED: AtomicU64 = AtomicU64::new(0);

/// In the child of a `fork`, from `fork`'s child handler: a thread of the
/// parent that was updating the map (a CUDA hook recording an allocation,
/// an embedder's `report_event`) left its lock held and its spare table
/// half-written, and the child's next update would wait forever. The map
/// lets the lock go and mends the spare from the live table
/// ([`MemtypeMap::reset_after_fork`]).
///
/// Not covered: a thread that forks from a signal handler that
/// interrupted its own update of the map (the update, resumed in the
/// parent and the child, would finish on a mended table).
pub(crate) fn after_fork_in_child() {
    // SAFETY: only the forking thread exists in the child, and it is not
    // inside an update of the map (see above: the hooks' updates do not
    // fork, and this runs from `fork` itself).
    if unsafe { MAP.reset_after_fork() } {
        MENDED.fetch_add(1, Ordering::Relaxed);
    }
}

/// How many times the map was mended in a child of `fork` because a
/// thread of the parent was updating it at the fork (see
/// [`crate::fork`]): 1 in such a child, 0 in a process none of whose
/// forks came at such a moment.
pub fn mended_after_fork() -> u64 {
    MENDED.load(Ordering::Relaxed)
}

/// Ranges dropped because the map was full.
pub fn dropped() -> u64 {
    MAP.dropped()
}

/// Live ranges.
pub fn len() -> usize {
    MAP.len()
}

/// Whether no range is recorded.
pub fn is_empty() -> bool {
    MAP.is_empty()
}

/// Feeds the map from a reported memory-type event (other events are
/// ignored). A free of size 0 (the reporter does not know it, as a free
/// call carries none) ends the allocation that starts at its address, as
/// the hooks' frees do, and the event is given that allocation's size.
pub(crate) fn record(event: &mut Event) {
    match event {
        Event::MemTypeAlloc(m) if m.size != 0 => {
            let mem_type = MemType::from_raw(m.mem_type);
            let _ = MAP.insert_marked(m.address, m.size, mem_type, -1, true);
        }
        Event::MemTypeFree(m) if m.size != 0 => {
            let _ = MAP.remove(m.address, m.size);
        }
        Event::MemTypeFree(m) => {
            if let Some(info) = MAP.take(m.address) {
                m.size = info.len;
            }
        }
        _ => {}
    }
}

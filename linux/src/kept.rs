//! Pages that hold memhook's code changes, kept from the advices that
//! would discard them.
//!
//! A bistro patch is a private copy of a page of a library's code (the
//! kernel copies the page at memhook's write), and the trampolines the
//! patched entries call are memhook's own anonymous pages. A discarding
//! `madvise` over either takes memhook's bytes away: `MADV_DONTNEED` of a
//! patched code page drops the copy, and the page reads the library file's
//! bytes again, the function unhooked with no word said (every later call
//! of it unreported: a missed free); over a trampoline it leaves zeros,
//! and the next hooked call that goes through one crashes
//! (`MADV_FREE` does the same later, whenever the kernel wants the
//! memory; `MADV_GUARD_INSTALL` at once; `MADV_WIPEONFORK` and
//! `MADV_DONTFORK` in a child of `fork`). A debugger's support library, a
//! checkpointing tool or an allocator's purge over a range it takes for
//! its own can make such a call (under cuda-gdb 13.0, whose process made
//! eight `madvise` calls, the driver's entries held their own bytes again
//! when its breakpoints were hit).
//!
//! So the pages are recorded here as memhook writes them (`keep`, each
//! patch and each trampoline region), and the `madvise` hook (and the
//! `syscall` hook's `SYS_madvise`) calls the original on the rest of the
//! range only (`madvise`): the call leaves memhook's pages as they are
//! and answers as the kernel would have for the rest. Each such call is
//! counted ([`discards_kept`]). The record is a fixed table of single
//! words (a range of pages each), read with no lock by any thread, a
//! signal handler's included, and written with compare-and-swap by the
//! patching paths; a hook reads it only for an advice that takes pages
//! and a range that meets the span of the pages ever recorded (two
//! loads answer the rest, and every call where no bistro patch was
//! made).
//!
//! What is not covered: `process_madvise` (its ranges may be another
//! process's), a system call made by the instruction itself, and a
//! discard that races an install (its look at the table made before the
//! patch is recorded, its call after the patch is written).

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Most ranges recorded at once: every trampoline region (128 at most)
/// and every live patch (256 at most), with room to spare.
pub const SLOTS: usize = 512;

/// The unit of a recorded range: 4 KiB, which every page size is a
/// multiple of.
const UNIT_SHIFT: u32 = 12;
/// Bits of a slot that count the range's units (the rest hold its first
/// unit: user addresses lie below 2^57, their units below 2^45).
const COUNT_BITS: u32 = 19;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// The recorded ranges: `first unit << COUNT_BITS | units`; 0 where free.
static SLOT: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
/// One past the highest slot ever used (readers look below it).
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// The lowest start and highest end ever recorded (a range outside them
/// holds no recorded page: most discards, an allocator's of its heap,
/// are answered by these two loads). `LOW` is `usize::MAX` before any.
static LOW: AtomicUsize = AtomicUsize::new(usize::MAX);
static TOP: AtomicUsize = AtomicUsize::new(0);
/// Calls whose range was narrowed around recorded pages.
static NARROWED: AtomicU64 = AtomicU64::new(0);

/// A recorded range, for [`release`].
#[derive(Debug, PartialEq, Eq)]
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) struct Kept {
    slot: usize,
    word: u64,
}

/// The page-aligned range `[start, end)` that holds `[at, at + len)`.
fn pages(at: usize, len: usize) -> (usize, usize) {
    let page = crate::maps::page_size();
    let start = at & !(page - 1);
    let end = at.saturating_add(len.max(1)).next_multiple_of(page);
    (start, end)
}

/// Records the pages of `[at, at + len)` as memhook's. `None` where the
/// table is full or the range too large for one slot (the pages are then
/// not kept: as before this module).
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn keep(at: usize, len: usize) -> Option<Kept> {
    let (start, end) = pages(at, len);
    let units = ((end - start) >> UNIT_SHIFT) as u64;
    if units == 0 || units > COUNT_MASK {
        return None;
    }
    let word = ((start >> UNIT_SHIFT) as u64) << COUNT_BITS | units;
    // The bounds first: a reader that finds the slot finds them too.
    LOW.fetch_min(start, Ordering::AcqRel);
    TOP.fetch_max(end, Ordering::AcqRel);
    for (slot, s) in SLOT.iter().enumerate() {
        if s.compare_exchange(0, word, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            HIGH.fetch_max(slot + 1, Ordering::AcqRel);
            return Some(Kept { slot, word });
        }
    }
    None
}

/// Forgets a range [`keep`] recorded (its patch undone, or no longer
/// memhook's to look after).
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn release(kept: Kept) {
    let _ = SLOT[kept.slot].compare_exchange(kept.word, 0, Ordering::AcqRel, Ordering::Relaxed);
}

/// The recorded ranges, each as `(first unit, units)`.
fn recorded() -> impl Iterator<Item = (u64, u64)> {
    SLOT[..HIGH.load(Ordering::Acquire).min(SLOTS)]
        .iter()
        .map(|s| s.load(Ordering::Acquire))
        .filter(|&w| w != 0)
        .map(|w| (w >> COUNT_BITS, w & COUNT_MASK))
}

/// Whether a recorded range overlaps the page-aligned `[lo, hi)`: one
/// pass, in units, with no search for the first.
fn any_overlapping(lo: usize, hi: usize) -> bool {
    let (lo, hi) = ((lo >> UNIT_SHIFT) as u64, (hi >> UNIT_SHIFT) as u64);
    recorded().any(|(first, units)| first < hi && first + units > lo)
}

/// The recorded range that overlaps the page-aligned `[lo, hi)` and
/// starts first, as `(start, end)`.
fn first_overlapping(lo: usize, hi: usize) -> Option<(usize, usize)> {
    let (lo, hi) = ((lo >> UNIT_SHIFT) as u64, (hi >> UNIT_SHIFT) as u64);
    recorded()
        .filter(|&(first, units)| first < hi && first + units > lo)
        .min_by_key(|&(first, _)| first)
        .map(|(first, units)| ((first as usize) << UNIT_SHIFT, ((first + units) as usize) << UNIT_SHIFT))
}

/// Whether any page of `[at, at + len)` is recorded.
pub fn holds(at: usize, len: usize) -> bool {
    let (start, end) = pages(at, len);
    any_overlapping(start, end)
}

/// How many `madvise` calls left memhook's pages out of their range (a
/// child of `fork` counts from 0). Where it grows, something discards
/// code or memory it does not own: the calls went on, around memhook's
/// pages; `memhook run` reports it per command.
pub fn discards_kept() -> u64 {
    NARROWED.load(Ordering::Relaxed)
}

/// In the child of a `fork`: [`discards_kept`] counts from 0 (the pages
/// recorded are the child's too).
pub(crate) fn after_fork_in_child() {
    NARROWED.store(0, Ordering::Relaxed);
}

/// `MADV_DONTNEED_LOCKED` (Linux 5.18) and `MADV_GUARD_INSTALL` (6.13),
/// which the libc crate may not have.
const MADV_DONTNEED_LOCKED: c_int = 24;
const MADV_GUARD_INSTALL: c_int = 102;

/// Whether `advice` takes a page's contents away, now, later or in a
/// child of `fork`.
fn takes_pages(advice: c_int) -> bool {
    matches!(
        advice,
        libc::MADV_DONTNEED
            | libc::MADV_FREE
            | libc::MADV_REMOVE
            | MADV_DONTNEED_LOCKED
            | MADV_GUARD_INSTALL
            | libc::MADV_WIPEONFORK
            | libc::MADV_DONTFORK
    )
}

/// A `madvise`: libc's (or a hooker's before memhook's), or the system
/// call itself ([`system_madvise`]).
pub(crate) type MadviseFn = unsafe extern "C" fn(*mut c_void, usize, c_int) -> c_int;

/// `madvise(addr, len, advice)` by `orig`, but where the advice would take
/// recorded pages away, on the parts of the range outside them only
/// ([`around`]).
///
/// # Safety
///
/// `orig` makes the `madvise` call (the caller's, on the caller's range).
#[inline(always)]
pub(crate) unsafe fn madvise(addr: *mut c_void, len: usize, advice: c_int, orig: MadviseFn) -> c_int {
    if may_take(addr, len, advice) {
        // SAFETY: as this function's.
        let narrowed = unsafe { around(addr, len, advice, orig) };
        if narrowed != NOT_KEPT {
            return narrowed as c_int;
        }
    }
    // SAFETY: the caller's call.
    unsafe { orig(addr, len, advice) }
}

/// Whether `madvise(addr, len, advice)` may take recorded pages away, so
/// that [`around`] must look at its range: the advice takes pages, and
/// the range meets the span of the pages ever recorded (none recorded: an
/// empty span).
#[inline(always)]
pub(crate) fn may_take(addr: *mut c_void, len: usize, advice: c_int) -> bool {
    let start = addr as usize;
    takes_pages(advice)
        && start < TOP.load(Ordering::Acquire)
        && start.saturating_add(len) > LOW.load(Ordering::Acquire)
}

/// [`around`]'s answer where no recorded page lies in the range: the
/// caller makes its call as it came.
pub(crate) const NOT_KEPT: i64 = i64::MIN;

/// `madvise` by the system call instruction itself.
///
/// # Safety
///
/// As `madvise`'s: the advice may discard what the range holds.
pub(crate) unsafe extern "C" fn system_madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: the caller's call; `syscall!` answers -1 with errno set.
    unsafe { crate::sys::syscall!(libc::SYS_madvise, addr, len, libc::c_long::from(advice)) as c_int }
}

/// Where `[addr, addr + len)` holds recorded pages, makes the `madvise`
/// by `orig` on the parts of the range outside them, and answers what the
/// kernel answers for those parts: 0, or -1 and the first error that
/// stopped it, or `ENOMEM` where some part held no mapping (the kernel's
/// answer then, after it advised the rest). Elsewhere [`NOT_KEPT`], with
/// no call made.
///
/// An `extern "C"` function (which cannot unwind) called from the hooks
/// only after [`may_take`], which makes no call: a hook's frame then
/// holds no landing pad (no unwinding table of its own), and a thread
/// cancelled in a handler unwinds through it as before. A frame whose
/// table does not list the call an unwinding comes through ends the
/// process (`ffi/examples/cancel_in_handler.c`).
///
/// # Safety
///
/// `orig` makes the `madvise` call (the caller's, on the caller's range).
#[inline(never)]
pub(crate) unsafe extern "C" fn around(addr: *mut c_void, len: usize, advice: c_int, orig: MadviseFn) -> i64 {
    let page = crate::maps::page_size();
    let start = addr as usize;
    // A call the kernel refuses whole (an unaligned start, a range that
    // wraps) or that touches nothing (no length) goes as it came.
    let end = match start.checked_add(len).and_then(|e| e.checked_next_multiple_of(page)) {
        Some(end) if len != 0 && start.is_multiple_of(page) => end,
        _ => return NOT_KEPT,
    };
    if !any_overlapping(start, end) {
        return NOT_KEPT;
    }
    NARROWED.fetch_add(1, Ordering::Relaxed);
    let mut at = start;
    let mut unmapped = false;
    while at < end {
        let (stop, next) = first_overlapping(at, end).map_or((end, end), |(s, e)| (s.max(at), e));
        if stop > at {
            // SAFETY: the caller's advice, on a part of its range.
            let result = unsafe { orig(at as *mut c_void, stop - at, advice) };
            if result != 0 {
                if crate::maps::errno() != libc::ENOMEM {
                    return result.into();
                }
                unmapped = true;
            }
        }
        at = next;
    }
    if unmapped {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return -1;
    }
    0
}

#[cfg(test)]
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// The ranges [`recording`] was given, on this thread.
        static CALLS: RefCell<Vec<(usize, usize)>> = const { RefCell::new(Vec::new()) };
        /// What [`failing`] leaves in errno; how often it was called.
        static FAILING: RefCell<(c_int, usize)> = const { RefCell::new((0, 0)) };
    }

    /// A `madvise` that records the ranges it is given.
    unsafe extern "C" fn recording(p: *mut c_void, l: usize, _: c_int) -> c_int {
        CALLS.with(|c| c.borrow_mut().push((p as usize, l)));
        0
    }

    /// A `madvise` that fails with the errno `FAILING` names.
    unsafe extern "C" fn failing(_: *mut c_void, _: usize, _: c_int) -> c_int {
        FAILING.with(|f| {
            let mut f = f.borrow_mut();
            f.1 += 1;
            // SAFETY: this thread's errno.
            unsafe { *libc::__errno_location() = f.0 };
        });
        -1
    }

    fn advise(at: usize, len: usize, advice: c_int, orig: MadviseFn) -> c_int {
        // SAFETY: the test's `madvise`s touch no memory.
        unsafe { madvise(at as *mut c_void, len, advice, orig) }
    }

    /// The tests here one at a time: each counts the narrowed calls.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn calls() -> Vec<(usize, usize)> {
        CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
    }

    /// A discard over recorded pages is made on the pages around them
    /// (before, between and after), and counted; one that misses them, or
    /// an advice that keeps the contents, goes whole. A released range is
    /// discarded again.
    #[test]
    fn a_discard_leaves_the_recorded_pages_out() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let page = crate::maps::page_size();
        // Addresses nothing maps: only the table is asked.
        let base = 0x6000_0000_0000usize;
        let a = keep(base + 2 * page + 5, 10).expect("room");
        let b = keep(base + 5 * page, 2 * page).expect("room");
        let before = discards_kept();
        assert_eq!(advise(base, 10 * page - 1, libc::MADV_DONTNEED, recording), 0);
        assert_eq!(
            calls(),
            [
                (base, 2 * page),
                (base + 3 * page, 2 * page),
                (base + 7 * page, 3 * page)
            ]
        );
        assert_eq!(discards_kept(), before + 1);
        // Wholly inside a recorded range: no call at all, and success.
        assert_eq!(advise(base + 5 * page, page, libc::MADV_FREE, recording), 0);
        assert_eq!(calls(), []);
        // Elsewhere, or an advice that keeps the pages: whole.
        for (at, advice) in [(base + 20 * page, libc::MADV_DONTNEED), (base, libc::MADV_COLD)] {
            advise(at, 10 * page, advice, recording);
            assert_eq!(calls(), [(at, 10 * page)]);
        }
        release(a);
        release(b);
        assert!(!holds(base, 10 * page));
        advise(base, 10 * page, libc::MADV_DONTNEED, recording);
        assert_eq!(calls(), [(base, 10 * page)]);
    }

    /// The narrowed call answers as the kernel does: the first error that
    /// is not `ENOMEM` at once; `ENOMEM` (a part with no mapping) after
    /// the other parts were advised.
    #[test]
    fn a_narrowed_call_answers_as_the_kernel() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let page = crate::maps::page_size();
        let base = 0x6100_0000_0000usize;
        let k = keep(base + page, page).expect("room");
        for (errno, calls) in [(libc::ENOMEM, 2), (libc::EINVAL, 1)] {
            FAILING.with(|f| *f.borrow_mut() = (errno, 0));
            assert_eq!(advise(base, 3 * page, libc::MADV_DONTNEED, failing), -1);
            assert_eq!((crate::maps::errno(), FAILING.with(|f| f.borrow().1)), (errno, calls));
        }
        release(k);
    }
}

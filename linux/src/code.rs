//! Writing to code pages on Linux: [`LinuxCode`] implements
//! [`CodeMemory`] with `mprotect` and
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)`.
//!
//! Serialisation: after the process registers for it (once), a SYNC_CORE
//! membarrier makes every thread of the process execute a core-serialising
//! instruction before it returns to user space, so no core runs stale
//! instructions. Where the kernel lacks it (before 4.16, or a seccomp filter
//! that forbids it), memhook signals each other thread that is running and
//! waits until its handler has run (the kernel enters and leaves a handler
//! by a serialising return; see `evacuate::sync_running_threads`): tens of
//! microseconds where the membarrier takes a few. Where that cannot be done
//! (the program handles both signals memhook can use, `/proc` cannot be
//! read, a thread runs with the signal blocked), it waits a grace period of
//! [`GRACE_WAIT_NS`] instead: an interrupt or a context switch (which
//! serialise) reaches every running thread well within that time on a live
//! system. Which one is used is reported by [`serialization`] and counted by
//! [`serializations_by_signal`].
//!
//! Threads inside the bytes: around a batch's locks (before them where a
//! lock covers an instruction start, and once they are seen), every other
//! thread that stands inside the bytes (preempted between two of the
//! instructions a jump replaces, or blocked in a system call made there)
//! is moved to the same instruction in the trampoline, by a signal whose
//! handler rewrites its saved pc; see [`threads_moved`] and
//! [`threads_unchecked`], and the module `evacuate` for the protocol.

use memhook_core::patch::{CodeMemory, PatchError, Region};

pub(crate) use crate::evacuate::Exit;
use crate::evacuate::Holding;
pub use crate::evacuate::{thread_check, threads_moved, threads_unchecked};

/// The lock's length (the self-jump written first).
const LOCK_LEN: usize = <crate::bistro::NativeArch as memhook_core::patch::Arch>::LOCK.len();

use core::sync::atomic::Ordering;

use crate::{maps, membarrier};

/// The grace wait used where membarrier SYNC_CORE is unavailable and
/// the threads cannot be signalled.
pub const GRACE_WAIT_NS: i64 = 2_000_000;

/// How code writes are made visible to every core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serialization {
    /// `membarrier(PRIVATE_EXPEDITED_SYNC_CORE)`.
    MembarrierSyncCore,
    /// The kernel lacks the membarrier: each other running thread is
    /// signalled and its handler waited for, or, where that cannot be
    /// done, a grace wait of [`GRACE_WAIT_NS`].
    Signals,
}

/// Which serialisation this process uses (registering for membarrier on the
/// first call).
pub fn serialization() -> Serialization {
    if membarrier::sync_core() {
        Serialization::MembarrierSyncCore
    } else {
        Serialization::Signals
    }
}

/// Registers for membarrier at load, before `main`, while the process is
/// (usually) single-threaded: the kernel then skips the RCU grace period
/// (milliseconds on a large machine) that a registration from a threaded
/// process waits for, e.g. the first install in a CUDA program.
extern "C" fn register_at_load() {
    let _ = serialization();
}

#[used]
#[unsafe(link_section = ".init_array")]
static REGISTER_AT_LOAD: extern "C" fn() = register_at_load;

/// Makes every core of the process see the code written so far.
pub fn serialize_all_cores() {
    serialize(None);
}

/// [`serialize_all_cores`], by `holding`'s signal while it holds threads.
fn serialize(holding: Option<&mut Holding>) {
    SERIALIZED.fetch_add(1, Ordering::Relaxed);
    if serialization() == Serialization::MembarrierSyncCore
        && membarrier::call(membarrier::PRIVATE_EXPEDITED_SYNC_CORE) == 0
    {
        return;
    }
    // The grace period counts from here: the code is written.
    let start = crate::fork::now_ns();
    let signalled = match holding {
        Some(h) => h.sync(),
        None => crate::evacuate::sync_running_threads(),
    };
    if signalled {
        BY_SIGNAL.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // The rest of it (a serialisation by signals that found a thread
    // blocking the signal waited for it already: see
    // `evacuate::sync_running_threads`).
    crate::evacuate::sleep_ns((GRACE_WAIT_NS as u64).saturating_sub(crate::fork::now_ns().saturating_sub(start)));
}

/// Serialisations of every core made ([`serialize_all_cores`]).
static SERIALIZED: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
/// Those of them made by signals.
static BY_SIGNAL: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// How many of the [`serializations`] were made by signalling the other
/// running threads (the kernel lacks the membarrier), how many signals
/// they sent in all, and how many of those reached a thread that
/// serialised: its handler answered within the wait, or it was found
/// inside memhook's handler, which it leaves by a serialising return
/// (the others went to threads not running then). The other
/// serialisations, where the kernel lacks it, were grace waits.
pub fn serializations_by_signal() -> (u64, u64, u64) {
    let (signals, answers) = crate::evacuate::sync_signals();
    (BY_SIGNAL.load(Ordering::Relaxed), signals, answers)
}

/// How many times memhook has serialised every core (each a `membarrier`
/// that interrupts every core running the process, or a grace wait of
/// [`GRACE_WAIT_NS`]): three for each batch of patches. Tests and benches
/// count them.
pub fn serializations() -> u64 {
    SERIALIZED.load(Ordering::Relaxed)
}

pub use crate::maps::page_size;

/// Instruction-cache flushes done (aarch64; x86_64 keeps its caches
/// coherent and needs none).
static FLUSHES: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// How many times written code was flushed to the instruction cache (0 on
/// x86_64, where no flush is needed): tests check that every code write
/// is flushed, which qemu, not modelling the caches, cannot show.
pub fn icache_flushes() -> u64 {
    FLUSHES.load(Ordering::Relaxed)
}

/// Makes `[at, at + len)`, just written, visible to instruction fetch on
/// this core (the serialisation then covers the others).
pub(crate) fn flush_icache(at: usize, len: usize) {
    #[cfg(target_arch = "aarch64")]
    {
        unsafe extern "C" {
            fn __clear_cache(start: *mut core::ffi::c_char, end: *mut core::ffi::c_char);
        }
        // SAFETY: cleans and invalidates the caches over a range of our own
        // mapped code; it changes no memory.
        unsafe { __clear_cache(at as *mut _, (at + len) as *mut _) };
        FLUSHES.fetch_add(1, Ordering::Relaxed);
    }
    #[cfg(not(target_arch = "aarch64"))]
    let _ = (at, len);
}

/// The pages covering `[at, at + len)`.
fn pages(at: usize, len: usize) -> (usize, usize) {
    let page = page_size();
    (at & !(page - 1), (at + len).next_multiple_of(page))
}

/// Changes the protection of the pages covering `[at, at + len)`.
pub(crate) fn protect(at: usize, len: usize, prot: i32) -> Result<(), PatchError> {
    let (start, end) = pages(at, len);
    // SAFETY: mprotect changes protection only; callers pass ranges of
    // mappings they own or code they patch, and keep PROT_EXEC on code.
    if unsafe { libc::mprotect(start as *mut libc::c_void, end - start, prot) } != 0 {
        return Err(PatchError::Protection(maps::errno()));
    }
    Ok(())
}

/// Page ranges one writer remembers making writable, so that a batch of
/// patches changes each page's protection once each way: at least as many
/// as the largest batch has entries.
const CHANGED: usize = 128;

/// Pages made writable: where, the protection to restore, and whether it
/// was restored.
#[derive(Clone, Copy, Debug)]
struct Changed {
    start: usize,
    end: usize,
    prot: i32,
    restored: bool,
}

/// [`CodeMemory`] for this process. It remembers the protection it found,
/// and restores exactly that. In a batch
/// ([`memhook_core::patch::write_patches`]), each page is made writable
/// once and restored once, after the last write: every restore comes after
/// every write there.
#[derive(Debug, Default)]
pub struct LinuxCode<'a> {
    known_prot: Option<i32>,
    changed: heapless::Vec<Changed, CHANGED>,
    /// Where a thread standing inside the bytes being written goes on.
    exits: &'a [Exit],
    /// The other threads, while held around the locks.
    holding: Option<Holding>,
}

impl LinuxCode<'static> {
    /// A new writer; it looks the protection up in `/proc/self/maps`.
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer for code whose mapping's protection the caller just read.
    pub fn with_protection(prot: i32) -> Self {
        Self {
            known_prot: Some(prot),
            changed: heapless::Vec::new(),
            exits: &[],
            holding: None,
        }
    }
}

impl<'a> LinuxCode<'a> {
    /// The same writer, moving a thread that stands at an exit's `from`,
    /// inside bytes it is about to overwrite, to its `to` (see
    /// [`threads_moved`]).
    pub(crate) fn with_exits(self, exits: &'a [Exit]) -> LinuxCode<'a> {
        LinuxCode {
            known_prot: self.known_prot,
            changed: self.changed,
            exits,
            holding: None,
        }
    }

    /// The page ranges it made writable, and whether each was restored.
    #[cfg(test)]
    fn changed(&self) -> impl Iterator<Item = (usize, usize, bool)> + '_ {
        self.changed.iter().map(|c| (c.start, c.end, c.restored))
    }
}

impl CodeMemory for LinuxCode<'_> {
    fn make_writable(&mut self, at: usize, len: usize) -> Result<(), PatchError> {
        let (start, end) = pages(at, len);
        if self
            .changed
            .iter()
            .any(|c| !c.restored && c.start <= start && end <= c.end)
        {
            return Ok(());
        }
        // Room to remember the range (a restored one's place will do),
        // else the range is refused before anything changes.
        let slot = match self.changed.iter().position(|c| c.restored) {
            Some(i) => i,
            None if !self.changed.is_full() => self.changed.len(),
            None => return Err(PatchError::Protection(libc::ENOMEM)),
        };
        let prot = match self.known_prot {
            Some(prot) => prot,
            None => maps::find(at).map_or(libc::PROT_READ | libc::PROT_EXEC, |m| m.prot),
        };
        protect(at, len, prot | libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC)?;
        let changed = Changed {
            start,
            end,
            prot,
            restored: false,
        };
        if slot == self.changed.len() {
            // Cannot fail: not full (checked above).
            let _ = self.changed.push(changed);
        } else {
            self.changed[slot] = changed;
        }
        Ok(())
    }

    fn restore_protection(&mut self, at: usize, len: usize) -> Result<(), PatchError> {
        let (start, end) = pages(at, len);
        // Restored once, the first time one of the range's writes is done
        // (in a batch every write is done by then); nothing to restore for
        // a range this writer did not change.
        match self.changed.iter_mut().find(|c| c.start <= start && end <= c.end) {
            Some(c) if !c.restored => {
                c.restored = true;
                protect(c.start, c.end - c.start, c.prot)
            }
            _ => Ok(()),
        }
    }

    fn read(&self, at: usize, buf: &mut [u8]) {
        // SAFETY: callers read code they are about to patch, inside a
        // readable mapping (checked by the bistro layer before patching).
        unsafe { core::ptr::copy_nonoverlapping(at as *const u8, buf.as_mut_ptr(), buf.len()) };
    }

    fn write_atomic(&mut self, at: usize, bytes: &[u8]) {
        write_one_store(at, bytes);
        flush_icache(at, bytes.len());
    }

    fn write(&mut self, at: usize, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: the page was made writable by `make_writable`; no
            // thread executes these bytes now (the entry is locked).
            unsafe { core::ptr::write_volatile((at + i) as *mut u8, *b) };
        }
        flush_icache(at, bytes.len());
    }

    fn serialize(&mut self) {
        serialize(self.holding.as_mut());
    }

    fn hold(&mut self, regions: &mut [Region], locked: bool) {
        match &mut self.holding {
            Some(h) => h.hold(self.exits, regions),
            // Before the locks, only where a thread could stand inside a
            // lock's own bytes (after a first instruction shorter than
            // it); otherwise the look once they are seen does.
            None if !locked && !crate::evacuate::any_inside(self.exits, regions, LOCK_LEN) => {}
            None => self.holding = Holding::start(self.exits, regions),
        }
    }

    fn release(&mut self) {
        if let Some(h) = self.holding.take() {
            h.release();
        }
    }
}

/// Writes 1, 2, 4 or 8 bytes with a single store instruction (x86_64 makes
/// a store within one cache line atomic, aligned or not).
#[cfg(target_arch = "x86_64")]
fn write_one_store(at: usize, bytes: &[u8]) {
    let mut v = [0u8; 8];
    v[..bytes.len()].copy_from_slice(bytes);
    let v = u64::from_le_bytes(v);
    // SAFETY: the page is writable (make_writable), the caller checked that
    // the range does not cross a cache line, and one `mov` does the store.
    unsafe {
        match bytes.len() {
            1 => core::arch::asm!("mov byte ptr [{0}], {1:l}", in(reg) at, in(reg) v, options(nostack)),
            2 => core::arch::asm!("mov word ptr [{0}], {1:x}", in(reg) at, in(reg) v, options(nostack)),
            4 => core::arch::asm!("mov dword ptr [{0}], {1:e}", in(reg) at, in(reg) v, options(nostack)),
            8 => core::arch::asm!("mov qword ptr [{0}], {1}", in(reg) at, in(reg) v, options(nostack)),
            n => panic!("write_atomic of {n} bytes"),
        }
    }
}

/// Writes 4 or 8 bytes with one aligned atomic store (aarch64 requires
/// alignment for single-copy atomicity).
#[cfg(not(target_arch = "x86_64"))]
fn write_one_store(at: usize, bytes: &[u8]) {
    use core::sync::atomic::{AtomicU32, AtomicU64};
    // SAFETY: the page is writable and the caller passes an aligned range of
    // the stated size.
    unsafe {
        match bytes.len() {
            4 => (*(at as *const AtomicU32)).store(u32::from_le_bytes(bytes.try_into().unwrap()), Ordering::Release),
            8 => (*(at as *const AtomicU64)).store(u64::from_le_bytes(bytes.try_into().unwrap()), Ordering::Release),
            n => panic!("write_atomic of {n} bytes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bistro::NativeArch;
    use memhook_core::patch::{Arch, undo_patches, write_patches};

    const RX: i32 = libc::PROT_READ | libc::PROT_EXEC;

    /// `pages` pages of `int3`, mapped r-x, between two `PROT_NONE` guard
    /// pages (see [`maps::guarded_pages`]).
    fn code_pages(pages: usize) -> usize {
        let len = pages * page_size();
        let p = maps::guarded_pages(pages);
        // SAFETY: the fresh read-write pages just mapped, filled, then
        // made r-x.
        unsafe {
            core::ptr::write_bytes(p as *mut u8, 0xcc, len);
            assert_eq!(libc::mprotect(p as *mut libc::c_void, len, RX), 0);
        }
        p
    }

    fn bytes(at: usize, len: usize) -> Vec<u8> {
        // SAFETY: inside a readable mapping made by the test.
        unsafe { core::slice::from_raw_parts(at as *const u8, len) }.to_vec()
    }

    /// A batch makes each page writable once and restores it once, after
    /// the last write, to exactly what it was.
    #[test]
    fn a_batch_changes_each_page_once_and_restores_it() {
        // (Its patches hold the other threads, and signal the running
        // ones: not beside the tests that assert how a hold went.)
        let _one = crate::evacuate::SIGNAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let page = page_size();
        let base = code_pages(3);
        let entries = [base + 8, base + 40, base + 2 * page + 8];
        // The far form: longer than the lock on every architecture.
        let jumps: Vec<_> = entries
            .iter()
            .map(|&at| NativeArch::entry_jump(at, at + (1 << 40)))
            .collect();
        let patches: Vec<(usize, &[u8])> = entries.iter().zip(&jumps).map(|(&at, j)| (at, &j[..])).collect();
        let mut mem = LinuxCode::with_protection(RX);
        let done = write_patches::<_, 4>(&mut mem, &patches, NativeArch::LOCK);
        assert!(done.iter().all(Result::is_ok), "{done:?}");
        for (&at, j) in entries.iter().zip(&jumps) {
            assert!(j.len() > NativeArch::LOCK.len());
            assert_eq!(bytes(at, j.len()), &j[..]);
        }
        let changed: Vec<_> = mem.changed().collect();
        assert_eq!(
            changed,
            [(base, base + page, true), (base + 2 * page, base + 3 * page, true)],
            "the first page twice, or one not restored"
        );
        for p in 0..3 {
            assert_eq!(maps::find(base + p * page).unwrap().prot, RX, "page {p}");
        }

        // Undone in one pass, through another writer: the same again.
        let points: Vec<_> = done.iter().map(|p| p.as_ref().unwrap()).collect();
        let mut mem = LinuxCode::with_protection(RX);
        let undone = undo_patches::<_, 4>(&mut mem, &points, NativeArch::LOCK);
        assert!(undone.iter().all(Result::is_ok));
        for (&at, j) in entries.iter().zip(&jumps) {
            assert_eq!(bytes(at, j.len()), vec![0xcc; j.len()]);
        }
        assert_eq!(mem.changed().count(), 2);
        for p in 0..3 {
            assert_eq!(maps::find(base + p * page).unwrap().prot, RX, "page {p}");
        }
        maps::unmap_guarded_pages(base, 3);
    }

    /// More pages than a writer can remember: the one beyond is refused
    /// before its protection changes, and the others are restored.
    #[test]
    fn a_writer_refuses_a_page_it_cannot_remember() {
        let page = page_size();
        let base = code_pages(CHANGED + 1);
        let mut mem = LinuxCode::with_protection(RX);
        for p in 0..CHANGED {
            mem.make_writable(base + p * page, 1).unwrap();
        }
        let last = base + CHANGED * page;
        assert_eq!(mem.make_writable(last, 1), Err(PatchError::Protection(libc::ENOMEM)));
        assert_eq!(maps::find(last).unwrap().prot, RX);
        for p in 0..CHANGED {
            mem.restore_protection(base + p * page, 1).unwrap();
        }
        assert!(mem.changed().all(|(_, _, restored)| restored));
        for p in 0..=CHANGED {
            assert_eq!(maps::find(base + p * page).unwrap().prot, RX, "page {p}");
        }
        // A restored page's record makes room for the next.
        mem.make_writable(last, 1).unwrap();
        mem.restore_protection(last, 1).unwrap();
        assert_eq!(maps::find(last).unwrap().prot, RX);
        maps::unmap_guarded_pages(base, CHANGED + 1);
    }
}

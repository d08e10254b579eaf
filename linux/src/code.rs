//! Writing to code pages on Linux: [`LinuxCode`] implements
//! [`CodeMemory`] with `mprotect` and
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)`.
//!
//! Serialisation: after the process registers for it (once), a SYNC_CORE
//! membarrier makes every thread of the process execute a core-serialising
//! instruction before it returns to user space, so no core runs stale
//! instructions. Where the kernel lacks it (before 4.16, or a seccomp filter
//! that forbids it), memhook falls back to a grace wait of
//! [`GRACE_WAIT_NS`]: an interrupt or a context switch (which serialise)
//! reaches every running thread well within that time on a live system. The
//! fallback is reported by [`serialization`].

use memhook_core::patch::{CodeMemory, PatchError};

use core::sync::atomic::{AtomicU8, Ordering};

use crate::{maps, membarrier};

/// The grace wait used where membarrier SYNC_CORE is unavailable.
pub const GRACE_WAIT_NS: i64 = 2_000_000;

/// How code writes are made visible to every core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serialization {
    /// `membarrier(PRIVATE_EXPEDITED_SYNC_CORE)`.
    MembarrierSyncCore,
    /// A grace wait of [`GRACE_WAIT_NS`] (the kernel lacks the membarrier).
    GraceWait,
}

static MEMBARRIER: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 yes, 2 no

/// Which serialisation this process uses (registering for membarrier on the
/// first call).
pub fn serialization() -> Serialization {
    let mut state = MEMBARRIER.load(Ordering::Acquire);
    if state == 0 {
        state = if membarrier::register(membarrier::PRIVATE_EXPEDITED_SYNC_CORE) {
            1
        } else {
            2
        };
        MEMBARRIER.store(state, Ordering::Release);
    }
    if state == 1 {
        Serialization::MembarrierSyncCore
    } else {
        Serialization::GraceWait
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
    if serialization() == Serialization::MembarrierSyncCore
        && membarrier::call(membarrier::PRIVATE_EXPEDITED_SYNC_CORE) == 0
    {
        return;
    }
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: GRACE_WAIT_NS,
    };
    // SAFETY: a valid timespec; the remainder is not wanted.
    unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
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

/// Changes the protection of the pages covering `[at, at + len)`.
pub(crate) fn protect(at: usize, len: usize, prot: i32) -> Result<(), PatchError> {
    let page = page_size();
    let start = at & !(page - 1);
    let end = (at + len).next_multiple_of(page);
    // SAFETY: mprotect changes protection only; callers pass ranges of
    // mappings they own or code they patch, and keep PROT_EXEC on code.
    if unsafe { libc::mprotect(start as *mut libc::c_void, end - start, prot) } != 0 {
        return Err(PatchError::Protection(maps::errno()));
    }
    Ok(())
}

/// [`CodeMemory`] for this process. It remembers the protection it found,
/// and restores exactly that.
#[derive(Debug, Default)]
pub struct LinuxCode {
    known_prot: Option<i32>,
    saved_prot: Option<i32>,
}

impl LinuxCode {
    /// A new writer; it looks the protection up in `/proc/self/maps`.
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer for code whose mapping's protection the caller just read.
    pub fn with_protection(prot: i32) -> Self {
        Self {
            known_prot: Some(prot),
            saved_prot: None,
        }
    }
}

impl CodeMemory for LinuxCode {
    fn make_writable(&mut self, at: usize, len: usize) -> Result<(), PatchError> {
        let prot = match self.known_prot {
            Some(prot) => prot,
            None => maps::find(at).map_or(libc::PROT_READ | libc::PROT_EXEC, |m| m.prot),
        };
        protect(at, len, prot | libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC)?;
        self.saved_prot = Some(prot);
        Ok(())
    }

    fn restore_protection(&mut self, at: usize, len: usize) -> Result<(), PatchError> {
        match self.saved_prot.take() {
            Some(prot) => protect(at, len, prot),
            None => Ok(()),
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
        serialize_all_cores();
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

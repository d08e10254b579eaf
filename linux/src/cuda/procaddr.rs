//! procaddr: the CUDA runtimes (static and shared) reach the driver only
//! through `dlsym(libcuda, "cuGetProcAddress_v2")` and the pointers
//! `cuGetProcAddress` returns. memhook answers both: `dlsym` of a hooked
//! driver function (reloc's dlsym interposition, see
//! [`crate::reloc::Entry::answer`]) and every `cuGetProcAddress` lookup
//! whose answer is a hooked function's definition, `cuGetProcAddress`
//! itself included.
//!
//! The driver decides which definition a (symbol, version, flags) lookup
//! means: `cuMemAlloc` at version 3020 or later is `cuMemAlloc_v2`, and
//! `cuMemAllocAsync` with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`
//! is `cuMemAllocAsync_ptsz`. memhook does not guess: it asks the real
//! function and maps the pointer it returns, a hooked function's own
//! definition, to that function's hook, whose original is that very
//! definition. A pointer that is no hooked definition is returned as it is.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::hooks::{ENTRY, Id, Kind, Lib};

/// Whether lookups are answered with hooks (procaddr installed).
pub(super) static ANSWERING: AtomicBool = AtomicBool::new(false);
/// Lookups answered with a hook.
pub(super) static ANSWERED: AtomicU64 = AtomicU64::new(0);

/// The hooked driver function whose definition is at `p`.
pub(super) fn by_entry(p: usize) -> Option<Id> {
    if p == 0 {
        return None;
    }
    Id::ALL
        .into_iter()
        .filter(|id| id.lib() == Lib::Driver)
        .find(|&id| ENTRY[id as usize].load(Ordering::Acquire) == p)
}

/// Replaces the function pointer a successful `cuGetProcAddress` wrote
/// into `*pfn` by its hook, when it is a hooked function's definition.
///
/// # Safety
///
/// `pfn` is null or the out-parameter a successful call filled.
pub(super) unsafe fn answer(pfn: *mut *mut c_void) {
    if pfn.is_null() || !ANSWERING.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: the caller's contract.
    let p = unsafe { pfn.read() } as usize;
    let Some(id) = by_entry(p).filter(|&id| !super::kept(id)) else {
        return;
    };
    debug_assert!(matches!(
        id.kind(),
        Kind::Alloc | Kind::Free | Kind::Teardown | Kind::ProcAddr
    ));
    ANSWERED.fetch_add(1, Ordering::Relaxed);
    // SAFETY: as above; the hook has the definition's signature.
    unsafe { pfn.write(id.hook() as *mut c_void) };
}

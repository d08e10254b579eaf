//! memhook-core: the pure, allocation-free heart of memhook.
//!
//! Everything here is `no_std` without `alloc` and makes no system call, so
//! it can run on a hook path (inside `mmap`, inside a CUDA call, inside an
//! allocator) and be tested and model-checked on any host:
//!
//! - [`event`]: event kinds with their C ABI bit values, payloads, the handler
//!   table and dispatch;
//! - [`memtype`]: the interval map from address ranges to memory types, with
//!   lock-free lookups;
//! - [`config`]: parsing of hook-mode settings;
//! - [`elf`]: bounded walking of an in-memory object's dynamic section;
//! - [`patch`]: the `Arch` and `CodeMemory` traits and the entry patch protocol;
//! - [`sync`]: the atomics and locks all shared state goes through (loom's
//!   under `--cfg memhook_loom`).
//!
//! The Linux runtime (`memhook`) feeds these from its hooks.
#![cfg_attr(not(test), no_std)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod elf;
#[allow(unsafe_code)]
pub mod event;
pub mod memtype;
pub mod patch;
#[cfg(all(target_arch = "x86_64", not(memhook_loom)))]
#[allow(unsafe_code)]
mod simd;
#[allow(unsafe_code)]
pub mod sync;

/// Asks the cache for the lines of `[p, p + len)`: a hint for code about
/// to touch them after work that left the caches cold (a driver call). It
/// reads nothing the program sees and cannot fault, whatever the address;
/// a no-op off x86_64 and under loom.
#[inline(always)]
pub fn prefetch(p: *const u8, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(memhook_loom)))]
    simd::prefetch(p, len);
    #[cfg(not(all(target_arch = "x86_64", not(memhook_loom))))]
    let _ = (p, len);
}

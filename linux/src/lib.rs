//! memhook: tells a process when memory appears and disappears (host mappings
//! and CUDA allocations) and answers what kind of memory a pointer is.
//!
//! This crate is the Linux runtime: it owns everything that touches the OS
//! (code-page protection, `/proc/self/maps`, near trampoline pages, the hook
//! functions themselves) and re-exports the allocation-free core.
//!
//! - [`bistro`] (feature `bistro`, on by default): patch any function entry
//!   with a hook that can call the original.
//! - [`reloc`]: hook symbols through the GOT slots of every loaded object,
//!   including objects loaded later.
//! - [`maps`]: allocation-free `/proc/self/maps` reading.
//! - [`host`]: the host hooks; [`host::original`] calls past them.
//! - [`fork`]: forks wait for memhook's loader work, so a child finds its
//!   locks free.
//! - [`pin`]: the first install keeps memhook's own shared object from
//!   being unloaded.
//!
//! # Use
//!
//! Install the hooks once ([`install()`], from the environment's
//! `MEMHOOK_MMAP_HOOK_MODE` and `MEMHOOK_CUDA_HOOK_MODE`, or
//! [`Config::parse`]), register handlers for the events you need
//! ([`set_handler`]; a priority below 0 runs before the call, 0 and above
//! after it), and ask what a pointer is ([`memtype::lookup`], which never
//! calls the driver). A handler runs inside the hooked call, on the
//! calling thread: it must not allocate, nor take a lock the program may
//! hold around an `mmap` (an allocator's), nor wait for another thread.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//!
//! use memhook::event::{Event, bits};
//! use memhook::memtype::{self, MemType};
//! use memhook::{Config, HandlerFn};
//!
//! static MAPPING: AtomicUsize = AtomicUsize::new(0);
//! static UNMAPPED: AtomicUsize = AtomicUsize::new(0);
//!
//! // Counts the bytes of our mapping reported unmapped (a registration
//! // cache would drop what it holds there).
//! fn on_unmapped(event: &mut Event) {
//!     if let Event::VmUnmapped(vm) = event
//!         && vm.address == MAPPING.load(Ordering::Relaxed)
//!     {
//!         UNMAPPED.fetch_add(vm.size, Ordering::Relaxed);
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! memhook::install(&Config::from_env()?);
//! let id = memhook::set_handler(bits::VM_UNMAPPED, 0, HandlerFn::Rust(&on_unmapped))?;
//!
//! let len = 1 << 20;
//! // SAFETY: a new private anonymous mapping, unmapped below.
//! let p = unsafe {
//!     libc::mmap(core::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE,
//!                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
//! };
//! assert_ne!(p, libc::MAP_FAILED);
//! MAPPING.store(p as usize, Ordering::Relaxed);
//! // Host memory: no CUDA allocation covers it.
//! assert_eq!(memtype::lookup(p as usize, 4096).mem_type_or(MemType::Host), MemType::Host);
//! // SAFETY: the mapping made above, not used after.
//! unsafe { libc::munmap(p, len) };
//! # // Reloc mode (the default where bistro is not built) does not see a
//! # // call made from memhook's own object: this program, which links it.
//! # if memhook::AVAILABLE_MODES.contains(memhook::config::HookMode::Bistro) {
//! assert_eq!(UNMAPPED.load(Ordering::Relaxed), len);
//! # }
//!
//! memhook::unset_handler(id)?;
//! # Ok(())
//! # }
//! ```
pub use memhook_core::{config, event, patch};

#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub mod bistro;
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub mod code;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub mod cuda;
pub mod dispatch;
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
mod evacuate;
pub mod fork;
pub mod host;
pub mod hugetlb;
mod install;
pub mod kept;
pub mod maps;
mod membarrier;
pub mod memtype;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod namespace;
pub mod pin;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub mod reloc;
pub mod sys;
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub mod trampoline;

use memhook_core::config::{HookMode, ModeSet};

pub use dispatch::{
    HandlerFn, MAX_HANDLERS, nested_overflows, report_event, set_handler, unset_handler, unset_handler_fn,
};
pub use install::{
    Config, FunctionStatus, InsideMemhook, MAX_STATUS, NamespaceStatus, Status, inside_memhook, install,
    install_unless_installed, installed, loader_break_patchable, namespace_constructors_seen, namespaces, prepared,
    refresh, status, status_at, try_install, try_uninstall, uninstall,
};

/// The hook modes this build supports: bistro only with the `bistro`
/// feature (and an architecture whose backend exists).
pub const AVAILABLE_MODES: ModeSet = if cfg!(all(
    feature = "bistro",
    any(target_arch = "x86_64", target_arch = "aarch64")
)) {
    ModeSet::ALL
} else {
    ModeSet::ALL.without(HookMode::Bistro)
};

/// Whether the environment variable `name` is set to `0` (how a
/// load-time default is turned off). For ELF constructors: getenv
/// allocates nothing, and at load no other thread of ours changes the
/// environment.
pub(crate) fn env_says_0(name: &core::ffi::CStr) -> bool {
    with_env(name, |value| value == Some(Ok("0")))
}

/// Calls `f` with the environment variable `name`'s value, read in place
/// with `getenv` (no copy, no allocation; and so, like any `getenv`, not
/// under std's lock against `std::env::set_var`, which is `unsafe` for
/// that reason): `None` when unset, `Err` when not UTF-8.
pub(crate) fn with_env<R>(name: &core::ffi::CStr, f: impl FnOnce(Option<Result<&str, ()>>) -> R) -> R {
    // SAFETY: a NUL-terminated name.
    let value = unsafe { libc::getenv(name.as_ptr()) };
    if value.is_null() {
        return f(None);
    }
    // SAFETY: getenv's non-null result is a NUL-terminated string of the
    // environment, read at once.
    let bytes = unsafe { core::ffi::CStr::from_ptr(value) }.to_bytes();
    f(Some(core::str::from_utf8(bytes).map_err(|_| ())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memhook_core::config::{ConfigErrorKind, Family};

    #[test]
    fn bistro_in_a_mode_string_matches_the_build() {
        let parsed = ModeSet::parse("bistro", Family::Mmap, AVAILABLE_MODES);
        if cfg!(all(
            feature = "bistro",
            any(target_arch = "x86_64", target_arch = "aarch64")
        )) {
            assert_eq!(parsed, Ok(ModeSet::of(&[HookMode::Bistro])));
        } else {
            let e = parsed.unwrap_err();
            assert_eq!(e.kind, ConfigErrorKind::NotBuilt);
            assert!(e.to_string().contains("built without the `bistro` feature"), "{e}");
        }
    }
}

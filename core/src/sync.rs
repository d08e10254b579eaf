//! The concurrency primitives every piece of shared state in memhook goes through.
//!
//! Under `--cfg memhook_loom` these are loom's model-checked types; otherwise
//! they are `core::sync::atomic` and `spin`. Code that uses them is written
//! once and checked by the loom models in `core/tests/loom.rs`
//! (`RUSTFLAGS="--cfg memhook_loom" cargo test -p memhook-core --test loom --release`).
//!
//! [`Cell`] is an `UnsafeCell` with loom's closure API (`with`, `with_mut`), so
//! that loom can see every access to data guarded by a protocol rather than by
//! a type.

#[cfg(not(memhook_loom))]
pub use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};
#[cfg(memhook_loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};

/// Busy-wait hint used by the few loops that wait for another thread
/// (registration waiting for readers to drain). Under loom it yields to the
/// model scheduler so that the waited-for thread can run.
#[inline]
pub fn spin_wait() {
    #[cfg(memhook_loom)]
    loom::thread::yield_now();
    #[cfg(not(memhook_loom))]
    core::hint::spin_loop();
}

/// A mutual-exclusion lock used only by writers (handler registration, map
/// updates), never by a reader on a hook path.
#[cfg(not(memhook_loom))]
pub struct Mutex<T>(spin::Mutex<T>);

#[cfg(not(memhook_loom))]
impl<T> Mutex<T> {
    /// A new unlocked mutex.
    pub const fn new(value: T) -> Self {
        Self(spin::Mutex::new(value))
    }

    /// Locks, spinning while another writer holds it.
    pub fn lock(&self) -> spin::MutexGuard<'_, T> {
        self.0.lock()
    }

    /// Locks only if nobody holds it.
    pub fn try_lock(&self) -> Option<spin::MutexGuard<'_, T>> {
        self.0.try_lock()
    }

    /// Unlocks a mutex whose holder no longer exists.
    ///
    /// # Safety
    ///
    /// No guard of this mutex may be alive in this process (after `fork`, the
    /// holder was a thread of the parent).
    pub unsafe fn force_unlock(&self) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.0.force_unlock() }
    }
}

/// A mutual-exclusion lock used only by writers (loom model version).
#[cfg(memhook_loom)]
pub struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(memhook_loom)]
impl<T> Mutex<T> {
    /// A new unlocked mutex.
    pub fn new(value: T) -> Self {
        Self(loom::sync::Mutex::new(value))
    }

    /// Locks, blocking in the model while another writer holds it.
    pub fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks only if nobody holds it.
    pub fn try_lock(&self) -> Option<loom::sync::MutexGuard<'_, T>> {
        self.0.try_lock().ok()
    }
}

/// An `UnsafeCell` whose accesses go through closures, as loom's does.
#[cfg(not(memhook_loom))]
#[derive(Debug)]
pub struct Cell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(memhook_loom))]
impl<T> Cell<T> {
    /// Wraps `value`.
    pub const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }

    /// Shared access through a raw pointer; the caller's protocol guarantees no
    /// concurrent `with_mut`.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Exclusive access through a raw pointer; the caller's protocol guarantees
    /// no concurrent `with` or `with_mut`.
    #[inline]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(memhook_loom)]
pub use loom::cell::UnsafeCell as Cell;

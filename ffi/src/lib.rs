//! memhook-ffi: the C ABI of memhook (`libmemhook.so`, `libmemhook.a`,
//! `include/memhook.h`). The calls of SPEC.md's "Stable interfaces" are added
//! here as each capability lands.
pub use memhook::event::bits;

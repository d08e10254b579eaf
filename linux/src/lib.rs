//! memhook: tells a process when memory appears and disappears (host mappings
//! and CUDA allocations) and answers what kind of memory a pointer is.
//!
//! This crate is the Linux runtime: it owns everything that touches the OS
//! (code-page protection, `/proc/self/maps`, `dl_iterate_phdr`, the hook
//! functions themselves) and re-exports the allocation-free core.
pub use memhook_core::{config, event, memtype};

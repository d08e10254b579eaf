//! memhook-x86_64: x86_64 code generation for memhook's bistro hooks.
//!
//! Implements `memhook_core::patch::Arch` for x86_64 (entry jump forms,
//! prologue relocation on iced-x86's allocation-free decoder, the x86_64 ELF
//! relocation types). Pure code generation: testable on any host.
#![no_std]

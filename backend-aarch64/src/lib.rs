//! memhook-aarch64: aarch64 code generation for memhook's bistro hooks.
//!
//! Implements `memhook_core::patch::Arch` for aarch64 (`b imm26` and
//! `ldr x16; br x16` entry forms, relocation of PC-relative instructions, the
//! aarch64 ELF relocation types). Pure code generation: testable on any host.
#![no_std]

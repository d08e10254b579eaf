//! A uprobe or a debugger's breakpoint put on a hooked CUDA function
//! after memhook patched it. Driver 580's entries keep their `push rbp`
//! ahead of the patch, so one at the entry leaves the hook whole and the
//! status says installed; one at the instruction the patch starts at (a
//! uprobe at `cuMemAlloc_v2+1`, a breakpoint there) lies over memhook's
//! jump, and its removal puts the library file's byte back there: then
//! `status()` must not call the function hooked, and says what lies at
//! the jump's head, as it does for the host functions
//! (`linux/tests/probe_over_patch.rs`). The fake driver (driver 580's
//! entry bytes) in bistro mode; its own test binary: nothing calls the
//! entry while it holds an `int3`.
#![cfg(target_arch = "x86_64")]

mod common;

use common::*;
use memhook::FunctionStatus;
use memhook::config::HookMode;
use memhook_tests::poke::poke;

fn alloc_bistro() -> FunctionStatus {
    memhook::status()
        .into_iter()
        .find(|s| s.function == "cuMemAlloc_v2" && s.mode == HookMode::Bistro)
        .expect("cuMemAlloc_v2 has a bistro entry in the status")
}

/// The same entry through `status_at`, one index at a time (the C API's
/// way): it must agree with `status()`.
fn alloc_bistro_at() -> FunctionStatus {
    let (_, n) = memhook::status_at(0);
    (0..n)
        .filter_map(|i| memhook::status_at(i).0)
        .find(|s| s.function == "cuMemAlloc_v2" && s.mode == HookMode::Bistro)
        .expect("cuMemAlloc_v2 has a bistro entry in status_at")
}

#[test]
fn status_names_a_breakpoint_or_a_uprobes_removal_over_a_cuda_patch() {
    let _serial = serial();
    let h = bistro_fake_driver();
    let entry = sym(h, c"cuMemAlloc_v2");
    // SAFETY: the entry's first bytes, in the loaded fake driver.
    let head = unsafe { *(entry as *const [u8; 2]) };
    assert_eq!(head[0], 0x55, "push rbp, kept at the entry");
    let at = entry + 1;
    assert_eq!(head[1], 0xe9, "memhook's near jump after it");
    // What the library file has there: driver 580's `mov rbp, rsp`.
    let original = 0x48;
    for s in [alloc_bistro(), alloc_bistro_at()] {
        assert!(s.installed && s.reason.is_empty(), "{s:?}");
    }

    // A uprobe at the entry: over the kept instruction; hooked still.
    poke(entry, 0xcc);
    for s in [alloc_bistro(), alloc_bistro_at()] {
        assert!(s.installed && s.reason.is_empty(), "{s:?}");
    }
    poke(entry, 0x55);
    // A breakpoint over the jump's first byte.
    poke(at, 0xcc);
    for s in [alloc_bistro(), alloc_bistro_at()] {
        assert!(!s.installed, "{s:?}");
        assert!(
            s.reason.contains(&format!("its jump at {at:#x} begins cc now")) && s.reason.contains("uprobe"),
            "{s:?}"
        );
    }
    // A uprobe there taken out: the file's byte put back.
    poke(at, original);
    for s in [alloc_bistro(), alloc_bistro_at()] {
        assert!(!s.installed, "{s:?}");
        assert!(
            s.reason.contains(&format!("its jump at {at:#x} begins 48 now")),
            "{s:?}"
        );
    }
    // memhook's byte again: hooked, as before, and the calls are seen.
    poke(at, 0xe9);
    for s in [alloc_bistro(), alloc_bistro_at()] {
        assert!(s.installed && s.reason.is_empty(), "{s:?}");
    }
    let _ = take();
    let alloc: unsafe extern "C" fn(*mut u64, usize) -> u32 = f(h, c"cuMemAlloc_v2");
    let free: unsafe extern "C" fn(u64) -> u32 = f(h, c"cuMemFree_v2");
    let mut p = 0u64;
    // SAFETY: the fake driver's functions with valid arguments.
    unsafe {
        assert_eq!(alloc(&mut p, 4096), 0);
        assert_eq!(free(p), 0);
    }
    assert_eq!(counts(&take()), (1, 1), "the allocation and the free reported");
    memhook::uninstall();
}

fn f<T>(h: *mut core::ffi::c_void, name: &core::ffi::CStr) -> T {
    // SAFETY: each name is the fake driver's function of type T.
    unsafe { cast(sym(h, name)) }
}

//! A uprobe or a debugger's breakpoint put on a host function after
//! memhook patched it, at the instruction where the patch starts (past an
//! `endbr64` or a first instruction memhook keeps, the entry's first
//! instruction otherwise; one at a kept entry leaves the hook whole: the
//! `uprobe_keeps_the_hook` tests of `bistro.rs`): its `int3` lies over
//! the first byte of memhook's jump, and calls go on past the hook; a
//! uprobe's removal puts the library file's byte back there, which leaves
//! no instruction of the function's (README, "Debuggers and probes").
//! memhook cannot stop either, but `status()` must not call such a
//! function hooked: it says what lies at the jump's head now.
//!
//! The test writes those bytes itself, as the kernel does, into
//! `remap_file_pages` (a function nothing in this process calls), and
//! puts memhook's byte back after. Its own test binary: no other test's
//! threads run while the function's entry is not memhook's.
#![cfg(all(target_arch = "x86_64", feature = "bistro"))]

use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::{Config, FunctionStatus};

#[path = "../../tests/src/poke.rs"]
mod poke;
use poke::poke;

fn remap_file_pages_bistro() -> FunctionStatus {
    memhook::status()
        .into_iter()
        .find(|s| s.function == "remap_file_pages" && s.mode == HookMode::Bistro && s.library == "libc.so.6")
        .expect("remap_file_pages has a bistro entry in the status")
}

#[test]
fn status_names_a_breakpoint_or_a_uprobes_removal_over_a_patch() {
    // SAFETY: a NUL-terminated name, RTLD_DEFAULT.
    let entry = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"remap_file_pages".as_ptr()) } as usize;
    assert_ne!(entry, 0);
    // The patch starts past an `endbr64` (libc built for CET) or a first
    // instruction kept (one without).
    let at = entry + memhook::bistro::can_patch(entry, false).unwrap().skip;
    // SAFETY: as above.
    let original = unsafe { *(at as *const u8) };

    memhook::install(&Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Bistro]),
            cuda: ModeSet::NONE,
        },
    });
    let s = remap_file_pages_bistro();
    assert!(s.installed, "{s:?}");
    // SAFETY: as above.
    let jump = unsafe { *(at as *const u8) };
    assert_eq!(jump, 0xe9, "memhook's near jump at {at:#x}");

    // A breakpoint over the jump's first byte.
    poke(at, 0xcc);
    let s = remap_file_pages_bistro();
    assert!(!s.installed, "{s:?}");
    assert!(
        s.reason.contains(&format!("its jump at {at:#x} begins cc now")) && s.reason.contains("uprobe"),
        "{s:?}"
    );
    // The uprobe taken out: the file's first byte put back.
    poke(at, original);
    let s = remap_file_pages_bistro();
    assert!(!s.installed, "{s:?}");
    assert!(
        s.reason
            .contains(&format!("its jump at {at:#x} begins {original:02x} now")),
        "{s:?}"
    );
    // memhook's byte again: hooked, as before.
    poke(at, jump);
    let s = remap_file_pages_bistro();
    assert!(s.installed && s.reason.is_empty(), "{s:?}");
    memhook::uninstall();
    // SAFETY: as above.
    let now = unsafe { *(at as *const u8) };
    assert_eq!(now, original, "the uninstall put the bytes back");
}

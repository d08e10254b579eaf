//! Reloc's table of hooked symbols, where an install would overflow it:
//! the install is refused whole (no symbol recorded, no slot rewritten),
//! and what fits is hooked after it as usual. Alone in its process: it
//! fills the table that every reloc install of a process shares.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use std::ffi::{CStr, CString};
use std::sync::atomic::AtomicUsize;

use memhook::reloc::{self, MAX_SYMBOLS, RelocError};

extern "C" fn hook_a() {}
extern "C" fn hook_b() {}

/// `n` symbol names no object defines, `prefix` first.
fn names(prefix: &str, n: usize) -> Vec<&'static CStr> {
    (0..n)
        .map(|i| &*Box::leak(CString::new(format!("{prefix}{i}")).unwrap().into_boxed_c_str()))
        .collect()
}

/// Hooks `names`, each with `hook` and an original of its own.
fn install(names: &[&'static CStr], hook: extern "C" fn()) -> Result<(), RelocError> {
    let hooks: Vec<_> = names
        .iter()
        .map(|&n| {
            (
                n,
                hook as *const () as usize,
                &*Box::leak(Box::new(AtomicUsize::new(0))),
            )
        })
        .collect();
    // SAFETY: no object defines these names, so no slot is rewritten to a
    // hook (whose signature would not match) and none is ever called.
    unsafe { reloc::install(&hooks) }
}

#[test]
fn an_install_that_would_overflow_the_table_changes_nothing() {
    // Ten symbols, and the loader's four that the first install adds.
    let first = names("mhf_first_", 10);
    install(&first, hook_a).unwrap();
    let room = MAX_SYMBOLS - 10 - 4;

    // One more than the room: refused, as a whole.
    let over = names("mhf_over_", room + 1);
    assert_eq!(install(&over, hook_a), Err(RelocError::TooManySymbols));
    assert_eq!(
        RelocError::TooManySymbols.to_string(),
        format!("too many symbols hooked through reloc (at most {MAX_SYMBOLS})")
    );

    // Nothing of it was recorded: the same names with another hook are no
    // conflict (a recorded one would be, and would pass for hooked with no
    // slot rewritten), and exactly the room is left.
    install(&over[..room], hook_b).unwrap();
    assert_eq!(
        install(&names("mhf_more_", 1), hook_b),
        Err(RelocError::TooManySymbols),
        "full"
    );
    // Full, a symbol already hooked is hooked again with its own hook, and
    // a conflict is told apart from a full table.
    install(&first[..3], hook_a).unwrap();
    assert_eq!(install(&first[..1], hook_b), Err(RelocError::Conflict));
}

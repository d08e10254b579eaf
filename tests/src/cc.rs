//! The system C compiler, as every test that builds a C program or shared
//! object runs it: `$CC` where set, else `cc`, with one failure message.
//! (Included with `#[path]` by `linux/`'s tests too: memhook-tests depends
//! on `memhook`, so those tests cannot depend on it without a second copy
//! of the library and its hooks in one process.)

use std::process::Command;

/// A command for the C compiler: `$CC`, else `cc`. The caller adds the
/// arguments and hands it to [`build`].
pub fn command() -> Command {
    Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
}

/// Runs the compiler command `c`; panics, naming `what` it was building,
/// where the compiler cannot start or fails.
pub fn build(c: &mut Command, what: &str) {
    let status = c
        .status()
        .unwrap_or_else(|e| panic!("building {what}: the C compiler ($CC, else cc) does not start: {e}"));
    assert!(status.success(), "building {what}: the C compiler exited with {status}");
}

//! libmemhook.so as the sources now build it, for the tests that load it
//! into programs (the C examples, `memhook run`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `libmemhook.so` in `dir` (the calling test's target folder,
/// `target/debug` or `target/release`), built from the current sources
/// once per test process: `cargo build -p memhook-ffi` with that folder's
/// profile, which does nothing where it is up to date. `cargo test`
/// builds no cdylib for a package's tests, so a library left there by an
/// earlier build would otherwise be tested in place of the code under
/// test. `build: false` takes the library as it is (a test built with
/// other features than the default ones, which a build here would
/// replace it with); so does `MEMHOOK_TEST_LIB_BUILT=1` in the
/// environment, for test binaries run where cargo cannot run (as
/// another user: `scripts/tests-as-user.sh`, which builds the library
/// first).
///
/// # Panics
///
/// Where the build fails or leaves no library in `dir`.
pub fn libmemhook(dir: &Path, build: bool) -> PathBuf {
    static BUILT: OnceLock<bool> = OnceLock::new();
    let lib = dir.join("libmemhook.so");
    if build && std::env::var_os("MEMHOOK_TEST_LIB_BUILT").is_none_or(|v| v != "1") {
        let ok = *BUILT.get_or_init(|| {
            let profile = if dir.ends_with("release") { "release" } else { "dev" };
            Command::new(option_env!("CARGO").unwrap_or("cargo"))
                .args(["build", "-p", "memhook-ffi", "--profile", profile])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .is_ok_and(|s| s.success())
        });
        assert!(ok, "cargo build -p memhook-ffi failed");
    }
    assert!(lib.is_file(), "{} is built", lib.display());
    lib
}

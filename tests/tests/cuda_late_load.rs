//! Late load: memhook is installed before any CUDA library is loaded (as
//! when the runtime dlopens libcuda on its first call); the fake driver
//! comes in later, as the dependency of a library the program dlopens, and
//! bistro (no reloc, no procaddr) patches it the moment it appears. Then
//! the library goes away with dlclose and comes back.
#![cfg(target_arch = "x86_64")]

mod common;

use common::*;
use memhook::Config;
use memhook::config::HookMode;

#[test]
fn hooks_a_driver_loaded_after_install() {
    prepare();
    log_events();
    memhook::install(&Config::parse("cuda=bistro;mmap=none").unwrap());
    assert_eq!(memhook::cuda::attached(), (false, false), "no CUDA library yet");
    let status = memhook::status();
    let s = status
        .iter()
        .find(|s| s.function == "cuMemFree_v2" && s.mode == HookMode::Bistro)
        .expect("a status for cuMemFree_v2");
    assert!(!s.installed && s.reason.contains("not loaded yet"), "{s:?}");

    // The PLT client needs libcuda.so.1: loading it loads the driver.
    let plt = open(&fake().plt);
    assert!(memhook::cuda::attached().0, "libcuda hooked as it loaded");
    // SAFETY: the client's function.
    let run: unsafe extern "C" fn(i32, usize) -> i32 = unsafe { cast(sym(plt, c"plt_run")) };
    let _ = take();
    // SAFETY: valid arguments.
    assert_eq!(unsafe { run(4, 4096) }, 0);
    assert_eq!(counts(&take()), (4, 4), "bistro on the late-loaded driver");
    let status = memhook::status();
    let s = status
        .iter()
        .find(|s| s.function == "cuMemFree_v2" && s.mode == HookMode::Bistro)
        .unwrap();
    assert!(s.installed, "{s:?}");
    let by_function = memhook::cuda::events_by_function();
    assert!(
        by_function.iter().any(|&(f, n)| f == "cuMemAlloc_v2" && n >= 4),
        "{by_function:?}"
    );

    // The driver goes away with its last user, and comes back.
    close(plt);
    assert!(!memhook::cuda::attached().0, "libcuda forgotten when unloaded");
    let plt = open(&fake().plt);
    assert!(memhook::cuda::attached().0, "and hooked again when reloaded");
    // SAFETY: the reloaded client's function.
    let run: unsafe extern "C" fn(i32, usize) -> i32 = unsafe { cast(sym(plt, c"plt_run")) };
    let _ = take();
    // SAFETY: valid arguments.
    assert_eq!(unsafe { run(3, 4096) }, 0);
    assert_eq!(counts(&take()), (3, 3), "bistro on the reloaded driver");

    memhook::uninstall();
    let _ = take();
    // SAFETY: as above.
    assert_eq!(unsafe { run(2, 4096) }, 0);
    assert_eq!(counts(&take()), (0, 0), "uninstall restored the entries");
}

//! Late load: memhook is installed before any CUDA library is loaded (as
//! when the runtime dlopens libcuda on its first call); the fake driver
//! comes in later, as the dependency of a library the program dlopens, and
//! bistro (no reloc, no procaddr) patches it the moment it appears. Then
//! the library goes away with dlclose and comes back.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod common;

use common::*;
use memhook::Config;
use memhook::config::HookMode;

#[test]
fn hooks_a_driver_loaded_after_install() {
    let _serial = serial();
    prepare();
    log_events();
    memhook::cuda::count_events_by_function().expect("a free handler slot");
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
    let queries = ctx_queries();
    // SAFETY: valid arguments.
    assert_eq!(unsafe { run(4, 4096) }, 0);
    assert_eq!(counts(&take()), (4, 4), "bistro on the late-loaded driver");
    assert_eq!(
        ctx_queries() - queries,
        4,
        "eight devices: each allocation asks its context's device"
    );
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
    // The reloaded driver shows one device: allocations are on device 0,
    // and the driver is not asked which.
    let h = libcuda();
    // SAFETY: the fake driver's functions.
    let (set_count, alloc, free) = unsafe {
        (
            cast::<unsafe extern "C" fn(i32)>(sym(h, c"fake_set_device_count")),
            cast::<unsafe extern "C" fn(*mut u64, usize) -> u32>(sym(h, c"cuMemAlloc_v2")),
            cast::<unsafe extern "C" fn(u64) -> u32>(sym(h, c"cuMemFree_v2")),
        )
    };
    // SAFETY: the reference `libcuda` took (the client keeps the driver).
    unsafe { libc::dlclose(h) };
    // SAFETY: valid arguments.
    unsafe { set_count(1) };
    let queries = ctx_queries();
    let mut p = 0u64;
    // SAFETY: a valid out-parameter.
    assert_eq!(unsafe { alloc(&mut p, 1 << 16) }, 0);
    match memhook::memtype::lookup(p as usize, 1 << 16) {
        memhook::memtype::Lookup::Found(i) => assert_eq!((i.mem_type, i.device), (memhook::memtype::MemType::Cuda, 0)),
        other => panic!("{other:?}"),
    }
    // SAFETY: the allocation above.
    assert_eq!(unsafe { free(p) }, 0);
    assert_eq!(ctx_queries(), queries, "one device: no cuCtxGetDevice");
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

/// The driver loaded on a thread with a 128 KiB stack, as a library's
/// worker thread may load it: the attach (patches, the GOT pass over every
/// object) runs inside that `dlopen`, on that stack. This unoptimised
/// build needs 104 KiB, 48 optimised (156 and 60 before the forty-first
/// session, whose one batch for all the functions keeps its bookkeeping
/// off the stack; the test then gave 224 KiB). (x86_64: the figures are
/// its.)
#[cfg(target_arch = "x86_64")]
#[test]
fn a_driver_loaded_on_a_thread_with_a_small_stack_is_hooked() {
    let _serial = serial();
    prepare();
    memhook::install(&Config::parse("cuda=bistro;mmap=bistro").unwrap());
    let attached = std::thread::Builder::new()
        .stack_size(128 * 1024)
        .spawn(|| {
            let plt = open(&fake().plt);
            let attached = memhook::cuda::attached().0;
            close(plt);
            attached
        })
        .unwrap()
        .join()
        .unwrap();
    memhook::uninstall();
    assert!(attached, "libcuda hooked as it loaded");
}

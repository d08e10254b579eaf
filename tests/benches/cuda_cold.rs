//! Added latency of a hooked CUDA allocation run from cold caches, without
//! a GPU. The real driver's `cuMemAlloc_v2` + `cuMemFree_v2` pair takes
//! about 60 us on the H200, during which its work (and the kernel's)
//! evicts the hook's code and data from the core's caches, so the hook
//! after the call runs cold; the fake driver's calls take under 100 ns and
//! leave them warm (`cargo bench --bench cuda`). Here each fake call first
//! writes over a buffer of its own (`fake_set_work`): none, 1 MiB and
//! 4 MiB (beyond the L2 of the machines memhook runs on; within their L3).
//! Writes, not reads: on the dev VM, work that only reads 1 MiB left the
//! hooks' added cost where it is warm (about +30 ns), while writing it
//! (the caches full of dirty lines) gave +90 to +140 ns, the range the
//! real driver gives on the H200.
//!
//! Each case: rounds of one pair through the patched entries and one
//! through memhook's originals (`memhook::cuda::original`), in random
//! order; the median of the per-round differences. A control round pits
//! the originals against themselves (what the method reads as "added"
//! when nothing is).
//!
//! `cargo bench -p memhook-tests --bench cuda_cold`

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[path = "../../linux/examples/common/paired.rs"]
mod paired;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
type Free = unsafe extern "C" fn(u64) -> u32;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
/// One fake allocation and its free through the given functions. Out of
/// line, and the same for both sides of every case: the hooked and the
/// unhooked pair run the same caller code from the same addresses, so
/// that only the functions called differ (see `paired::added_latency`).
#[inline(never)]
fn pair(alloc: Alloc, free: Free) {
    let mut p = 0u64;
    // SAFETY: the fake driver's functions with valid arguments.
    unsafe {
        assert_eq!(alloc(&mut p, 4096), 0);
        assert_eq!(free(std::hint::black_box(p)), 0);
    }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn main() {
    use std::ffi::c_void;

    use memhook::event::{Event, bits};
    use memhook::{Config, HandlerFn};

    type SetWork = unsafe extern "C" fn(usize) -> i32;

    let dir = std::env::temp_dir().join(format!("memhook-bench-cuda-cold-{}", std::process::id()));
    let fake = memhook_tests::fakecuda::Opened::build(&dir);
    let sym = |name| fake.sym(name);
    // SAFETY: the fake's functions have these signatures.
    let (alloc, free, set_work) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Alloc>(sym(c"cuMemAlloc_v2")),
            std::mem::transmute::<*mut c_void, Free>(sym(c"cuMemFree_v2")),
            std::mem::transmute::<*mut c_void, SetWork>(sym(c"fake_set_work")),
        )
    };
    memhook::install(&Config::parse("cuda=bistro;mmap=none").unwrap());
    // The process loaded the fake itself: tell memhook.
    memhook::refresh();
    assert!(memhook::cuda::attached().0, "the fake driver is hooked");
    let original = |name: &str| memhook::cuda::original(name).unwrap_or_else(|| panic!("{name} is hooked"));
    // SAFETY: the originals of these functions have their signatures.
    let (orig_alloc, orig_free) = unsafe {
        (
            std::mem::transmute::<usize, Alloc>(original("cuMemAlloc_v2")),
            std::mem::transmute::<usize, Free>(original("cuMemFree_v2")),
        )
    };
    let cases = [
        (0usize, 200_000, false),
        (1 << 20, 20_000, false),
        (4 << 20, 5_000, false),
        (1 << 20, 20_000, true),
    ];
    for (work, rounds, handler) in cases {
        // SAFETY: no fake call is in flight on any thread.
        assert_eq!(unsafe { set_work(work) }, 0);
        // One empty handler for both events (what a registration cache
        // adds: the dispatch from cold caches, twice a pair).
        let id = handler.then(|| {
            memhook::set_handler(
                bits::MEM_TYPE_ALLOC | bits::MEM_TYPE_FREE,
                0,
                HandlerFn::Rust(&|e: &mut Event| {
                    std::hint::black_box(e);
                }),
            )
            .unwrap()
        });
        let name = format!(
            "fake cuMemAlloc_v2+cuMemFree_v2 4KiB, {} KiB of driver work per call{}",
            work >> 10,
            if handler { ", one empty handler" } else { "" }
        );
        paired::added_latency(
            &name,
            rounds,
            || pair(alloc, free),
            || pair(orig_alloc, orig_free),
            || {},
        );
        paired::added_latency(
            &format!("  control (originals both sides), {} KiB", work >> 10),
            rounds,
            || pair(orig_alloc, orig_free),
            || pair(orig_alloc, orig_free),
            || {},
        );
        if let Some(id) = id {
            memhook::unset_handler(id).unwrap();
        }
    }
    memhook::uninstall();
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn main() {
    println!("cuda_cold: the fake driver has entries for x86_64 and aarch64 only: skipped");
}

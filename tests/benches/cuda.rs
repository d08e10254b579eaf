//! Added latency of a hooked CUDA allocation: a fake `cuMemAlloc_v2` +
//! `cuMemFree_v2` pair of 4 KiB (the fake driver of `tests/cuda`, whose
//! entries are driver 580's), called through the driver's own entry
//! points: first unhooked, then with the entries patched (bistro) and the
//! memory-type map fed, then with one (empty) handler for both events.
//! All three in the same run; the SPEC goal is <= 50 ns added.
#![cfg(target_arch = "x86_64")]

use std::ffi::c_void;
use std::hint::black_box;

use criterion::{Criterion, criterion_group};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

#[path = "../../core/benches/common/medians.rs"]
mod medians;

/// Criterion's default samples per benchmark.
const SAMPLES: usize = 100;
const GROUP: &str = "cuMemAlloc_v2+cuMemFree_v2 4KiB";

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
type Free = unsafe extern "C" fn(u64) -> u32;

fn pair(alloc: Alloc, free: Free) {
    let mut p = 0u64;
    // SAFETY: the fake driver's functions with valid arguments.
    unsafe {
        assert_eq!(alloc(&mut p, 4096), 0);
        assert_eq!(free(black_box(p)), 0);
    }
}

fn bench(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("memhook-bench-cuda-{}", std::process::id()));
    let fake = memhook_tests::fakecuda::Opened::build(&dir);
    let sym = |name| fake.sym(name);
    // SAFETY: the two functions have these signatures.
    let (alloc, free) = unsafe {
        (
            std::mem::transmute::<*mut c_void, Alloc>(sym(c"cuMemAlloc_v2")),
            std::mem::transmute::<*mut c_void, Free>(sym(c"cuMemFree_v2")),
        )
    };
    let mut g = c.benchmark_group(GROUP);
    timed(&mut g, "unhooked", || pair(alloc, free));
    ring_bench(&mut g, "unhooked, new addresses", alloc, free);
    memhook::install(&Config::parse("cuda=bistro;mmap=none").unwrap());
    // The process loaded the fake itself: tell memhook.
    memhook::refresh();
    assert!(memhook::cuda::attached().0, "the fake driver is hooked");
    timed(&mut g, "hooked, map fed", || pair(alloc, free));
    // The same address comes back after each free above (the fake's bump
    // allocator), which the map's writer handles without touching its
    // second table; here every allocation gets a new address.
    ring_bench(&mut g, "hooked, map fed, new addresses", alloc, free);
    let id = memhook::set_handler(
        bits::MEM_TYPE_ALLOC | bits::MEM_TYPE_FREE,
        0,
        HandlerFn::Rust(&|e: &mut Event| {
            black_box(e);
        }),
    )
    .unwrap();
    timed(&mut g, "hooked, map fed, one handler", || pair(alloc, free));
    memhook::unset_handler(id).unwrap();
    g.finish();
    memhook::uninstall();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Eight allocations stay alive; each step frees the oldest and allocates
/// anew, so every allocation gets a new address.
fn ring_bench(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    alloc: Alloc,
    free: Free,
) {
    let mut ring = [0u64; 8];
    let mut k = 0;
    for p in &mut ring {
        // SAFETY: the fake driver's allocation.
        assert_eq!(unsafe { alloc(p, 256) }, 0);
    }
    timed(g, name, || {
        // SAFETY: frees the ring's oldest allocation, allocates anew.
        unsafe {
            assert_eq!(free(ring[k]), 0);
            assert_eq!(alloc(&mut ring[k], 256), 0);
        }
        k = (k + 1) % ring.len();
    });
    for p in ring {
        // SAFETY: the ring's allocations.
        assert_eq!(unsafe { free(p) }, 0);
    }
}

/// Benchmarks `f` as `name` in `g`, its samples kept for the medians.
fn timed(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, name: &str, mut f: impl FnMut()) {
    let key = format!("{GROUP}/{name}");
    g.bench_function(name, |b| b.iter_custom(|iters| medians::timed(&key, iters, &mut f)));
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let m = |name: &str| medians::median(&format!("{GROUP}/{name}"), SAMPLES);
    println!("medians of the samples, {GROUP} (added: against unhooked in this run; goal 50 ns):");
    for (hooked, base) in [
        ("hooked, map fed", "unhooked"),
        ("hooked, map fed, one handler", "unhooked"),
        ("hooked, map fed, new addresses", "unhooked, new addresses"),
    ] {
        let (with, without) = (m(hooked), m(base));
        println!("median {hooked}: {}", medians::against(with, base, without));
    }
}

//! A shared CUDA runtime over the driver, both hooked: the fake
//! `libcudart.so.13`'s `cudaMalloc` and `cudaFree` reach the driver through
//! the pointers `cuGetProcAddress` gives (as CUDA 13's runtime does), which
//! lead to hooked driver entries. Each allocation and free is reported
//! once, as the runtime function's, the driver's nested calls passing
//! through; the driver's own callers still get their events, and the map
//! knows the memory in between.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod common;

use std::ffi::c_void;

use common::*;
use memhook::Config;
use memhook::event::bits;
use memhook::memtype::{self, Lookup, MemType};

type Malloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> i32;
type Free = unsafe extern "C" fn(*mut c_void) -> i32;
type DrvAlloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
type DrvFree = unsafe extern "C" fn(u64) -> u32;

/// Events delivered by `function` so far.
fn delivered(function: &str) -> u64 {
    memhook::cuda::events_by_function()
        .iter()
        .find(|(f, _)| *f == function)
        .map_or(0, |&(_, n)| n)
}

fn counts_now() -> [u64; 4] {
    ["cudaMalloc", "cudaFree", "cuMemAlloc_v2", "cuMemFree_v2"].map(delivered)
}

#[test]
fn a_runtime_call_reports_once_and_its_driver_calls_pass_through() {
    let _serial = serial();
    prepare();
    log_events();
    let counting = memhook::cuda::count_events_by_function().expect("a free handler slot");
    let mut loaded = None;
    for mode in ["bistro", "bistro,reloc,procaddr"] {
        memhook::install(&Config::parse(&format!("cuda={mode};mmap=none")).unwrap());
        // The driver (through a client linked to it), then the runtime:
        // loads memhook follows, after the first install (late loads).
        let cudart = *loaded.get_or_insert_with(|| {
            let _ = open(&fake().plt);
            open(&fake().cudart)
        });
        assert_eq!(
            memhook::cuda::attached(),
            (true, true),
            "mode {mode}: both libraries hooked"
        );
        // SAFETY: the fake runtime's and driver's functions, of these types.
        let (malloc, free, drv_alloc, drv_free) = unsafe {
            (
                cast::<Malloc>(sym(cudart, c"cudaMalloc")),
                cast::<Free>(sym(cudart, c"cudaFree")),
                cast::<DrvAlloc>(sym(libcuda(), c"cuMemAlloc_v2")),
                cast::<DrvFree>(sym(libcuda(), c"cuMemFree_v2")),
            )
        };
        let _ = take();
        let before = counts_now();
        let mut ptrs = Vec::new();
        for i in 0..10 {
            let mut p = std::ptr::null_mut();
            // SAFETY: a valid out-parameter.
            assert_eq!(unsafe { malloc(&mut p, 4096 << i) }, 0, "mode {mode}: cudaMalloc");
            match memtype::lookup(p as usize, 4096 << i) {
                Lookup::Found(info) => assert_eq!(
                    (info.mem_type, info.base, info.len),
                    (MemType::Cuda, p as usize, 4096 << i),
                    "mode {mode}"
                ),
                other => panic!("mode {mode}: lookup of a cudaMalloc pointer: {other:?}"),
            }
            ptrs.push(p);
        }
        for &p in &ptrs {
            // SAFETY: frees what cudaMalloc returned.
            assert_eq!(unsafe { free(p) }, 0, "mode {mode}: cudaFree");
            assert_eq!(memtype::lookup(p as usize, 1), Lookup::Absent, "mode {mode}: freed");
        }
        let after = counts_now();
        let added: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(
            added,
            [10, 10, 0, 0],
            "mode {mode}: events of cudaMalloc, cudaFree, and their nested cuMemAlloc_v2, cuMemFree_v2"
        );
        let recs = take();
        assert_eq!(
            counts(&recs),
            (10, 10),
            "mode {mode}: each allocation and free once: {recs:?}"
        );
        for (i, &p) in ptrs.iter().enumerate() {
            let want = (p as usize, 4096usize << i, MemType::Cuda as u32);
            assert!(
                recs.iter()
                    .any(|r| r.0 == bits::MEM_TYPE_ALLOC && (r.1, r.2, r.3) == want),
                "mode {mode}: the allocation event of {p:?}"
            );
        }
        // The driver's own caller, after the nested calls: reported as
        // the driver's.
        let mut d = 0u64;
        // SAFETY: the driver's allocation and its free.
        unsafe {
            assert_eq!(drv_alloc(&mut d, 4096), 0);
            assert!(matches!(memtype::lookup(d as usize, 4096), Lookup::Found(_)));
            assert_eq!(drv_free(d), 0);
        }
        let last = counts_now();
        assert_eq!(
            last.iter().zip(&after).map(|(a, b)| a - b).collect::<Vec<_>>(),
            [0, 0, 1, 1],
            "mode {mode}: a direct driver call"
        );
        assert_eq!(counts(&take()), (1, 1), "mode {mode}");
        memhook::uninstall();
    }
    // The count by function stops with its handler; the counts stay.
    memhook::install(&Config::parse("cuda=bistro;mmap=none").unwrap());
    memhook::unset_handler(counting).expect("registered above, outside any handler");
    let before = counts_now();
    assert!(before[2] > 0, "driver calls counted while the handler was registered");
    // SAFETY: the fake driver's functions, of these types.
    let (drv_alloc, drv_free) = unsafe {
        (
            cast::<DrvAlloc>(sym(libcuda(), c"cuMemAlloc_v2")),
            cast::<DrvFree>(sym(libcuda(), c"cuMemFree_v2")),
        )
    };
    let mut d = 0u64;
    // SAFETY: the driver's allocation and its free.
    unsafe {
        assert_eq!(drv_alloc(&mut d, 4096), 0);
        assert_eq!(drv_free(d), 0);
    }
    assert_eq!(counts(&take()), (1, 1), "the hooks still deliver");
    assert_eq!(counts_now(), before, "and nothing counts by function any more");
    memhook::uninstall();
}

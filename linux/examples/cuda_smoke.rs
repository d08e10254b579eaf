//! On a machine with a GPU: the CUDA hooks against the real driver.
//! Loads libcuda through cudarc (as a Rust CUDA program does), installs the
//! hooks (default modes), allocates and frees through cudarc's safe API and
//! through the raw driver calls, and prints what memhook saw: events by
//! function, lookups next to the driver's own answer, the PCI bus id from
//! NVML, the per-function status, and the added latency of a hooked
//! `cuMemAlloc_v2` + `cuMemFree_v2` pair (4 KiB) against the same calls
//! unhooked, in the same run (the median of the per-round differences,
//! one hooked and one unhooked pair per round, in random order).
//! Without libcuda it says so and exits 0.
//!
//! `cargo run --release -p memhook --example cuda_smoke` (`-- pair`: the
//! added latency of the real pair, bare and with one handler, and of the
//! map's work by hand only)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cudarc::driver::DevicePtr;
use cudarc::driver::sys;
use memhook::event::{Event, bits};
use memhook::memtype::{self, Lookup};
use memhook::{Config, HandlerFn};

#[path = "common/paired.rs"]
mod paired;
use paired::added_latency;
#[path = "common/scaling.rs"]
mod scaling;
use scaling::median;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);

fn pairs(n: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        pair();
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// One `cuMemAlloc_v2` + `cuMemFree_v2` of 4 KiB.
fn pair() {
    let mut p = 0;
    // SAFETY: the driver's allocation and free with valid arguments (a
    // current context exists).
    unsafe {
        assert_eq!(sys::cuMemAlloc_v2(&mut p, 4096), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(sys::cuMemFree_v2(p), sys::CUresult::CUDA_SUCCESS);
    }
}

type Alloc = unsafe extern "C" fn(*mut sys::CUdeviceptr, usize) -> sys::CUresult;
type Free = unsafe extern "C" fn(sys::CUdeviceptr) -> sys::CUresult;

/// One allocation and its free through the given pair of functions (the
/// driver's entries as the process finds them, or memhook's originals).
/// One function for both sides, out of line: the hooked and the unhooked
/// pair run the same caller code from the same addresses, so that only
/// the functions called differ (see `paired::added_latency`).
#[inline(never)]
fn sync_pair(alloc: Alloc, free: Free) {
    let mut p = 0;
    // SAFETY: the driver's allocation and free, with valid arguments (a
    // current context exists).
    unsafe {
        assert_eq!(alloc(&mut p, 4096), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(free(p), sys::CUresult::CUDA_SUCCESS);
    }
}

/// A free of the null pointer through `free`: the hook's way in and out
/// alone (it passes such a free straight to the original: no event), a
/// driver call of about no work.
#[inline(never)]
fn free_null(free: Free) {
    // SAFETY: freeing the null pointer is a no-op for the driver.
    let _ = unsafe { free(0) };
}

type AllocAsync = unsafe extern "C" fn(*mut sys::CUdeviceptr, usize, sys::CUstream) -> sys::CUresult;
type FreeAsync = unsafe extern "C" fn(sys::CUdeviceptr, sys::CUstream) -> sys::CUresult;

/// A stream-ordered allocation and its free, as [`sync_pair`].
#[inline(never)]
fn async_pair(alloc: AllocAsync, free: FreeAsync, stream: sys::CUstream) {
    let mut p = 0;
    // SAFETY: a stream-ordered allocation and its free on a live stream.
    unsafe {
        assert_eq!(alloc(&mut p, 4096, stream), sys::CUresult::CUDA_SUCCESS);
        assert_eq!(free(p, stream), sys::CUresult::CUDA_SUCCESS);
    }
}

/// memhook's originals of `cuMemAlloc_v2` and `cuMemFree_v2`, for the
/// by-hand pair.
static BY_HAND: [std::sync::atomic::AtomicUsize; 2] = [const { std::sync::atomic::AtomicUsize::new(0) }; 2];

/// The by-hand pair's allocation: the original, then what the hook does
/// besides calling it (the device query where `QUERY`, where the process
/// sees more than one device; the map's insert where `MAP`). Called
/// through [`sync_pair`], as the hooked pair is, so that the two differ
/// only in what runs around the driver's calls. With `BEFORE`, the
/// device query comes before the original instead: the same answer for
/// a driver allocation (which never changes the thread's context), asked
/// while the lines it reads may still be warm, and warming them for the
/// original's own look at the context, where after the driver's 60 us
/// they are cold (a figure to compare with the query after).
unsafe extern "C" fn by_hand_alloc<const QUERY: bool, const MAP: bool, const BEFORE: bool>(
    dptr: *mut sys::CUdeviceptr,
    size: usize,
) -> sys::CUresult {
    // SAFETY: BY_HAND holds the original of cuMemAlloc_v2 (main stores it
    // before any by-hand pair), of this signature.
    let orig = unsafe { std::mem::transmute::<usize, Alloc>(BY_HAND[0].load(Ordering::Relaxed)) };
    let mut device = 0;
    if QUERY && BEFORE {
        // SAFETY: a valid out-parameter.
        let _ = unsafe { sys::cuCtxGetDevice(&mut device) };
    }
    // SAFETY: the caller's arguments.
    let r = unsafe { orig(dptr, size) };
    if QUERY && !BEFORE {
        // SAFETY: a valid out-parameter.
        let _ = unsafe { sys::cuCtxGetDevice(&mut device) };
    }
    if MAP && r == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: a successful call filled the caller's out-parameter.
        let p = unsafe { *dptr };
        let _ = memtype::insert(p as usize, size, memtype::MemType::Cuda, device);
    }
    r
}

/// The by-hand pair's free: the map's take where `MAP`, then the original.
unsafe extern "C" fn by_hand_free<const MAP: bool>(dptr: sys::CUdeviceptr) -> sys::CUresult {
    if MAP {
        let _ = memtype::take(dptr as usize);
    }
    // SAFETY: as in by_hand_alloc, for cuMemFree_v2.
    let orig = unsafe { std::mem::transmute::<usize, Free>(BY_HAND[1].load(Ordering::Relaxed)) };
    // SAFETY: the caller's argument.
    unsafe { orig(dptr) }
}

fn main() {
    // SAFETY: only probes for the library.
    if !unsafe { sys::is_culib_present() } {
        println!("cuda_smoke: no libcuda on this machine: skipped");
        return;
    }
    let ctx = match cudarc::driver::CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            println!("cuda_smoke: no usable GPU ({e:?}): skipped");
            return;
        }
    };
    let stream = ctx.default_stream();
    let _ = pairs(100);
    let config = Config::from_env().expect("a valid MEMHOOK_* configuration");
    let mut installs = Vec::new();
    for _ in 0..10 {
        memhook::uninstall();
        // libcuda is loaded (cudarc loaded it): install hooks it at once.
        let t = Instant::now();
        memhook::install(&config);
        installs.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "install with libcuda loaded: first {:.2} ms, median {:.2} ms (goal 10 ms)",
        installs[0],
        median(installs.clone())
    );
    let original = |name: &str| memhook::cuda::original(name).unwrap_or_else(|| panic!("{name} is hooked"));
    // SAFETY: the originals of these functions have their signatures.
    let (orig_alloc, orig_free) = unsafe {
        (
            std::mem::transmute::<usize, Alloc>(original("cuMemAlloc_v2")),
            std::mem::transmute::<usize, Free>(original("cuMemFree_v2")),
        )
    };
    let orig_pair = || sync_pair(orig_alloc, orig_free);
    // The hooked side calls the driver's functions the same way, through
    // a pointer from dlsym (not through cudarc's wrappers): with the
    // default modes procaddr answers dlsym with the hook itself; with
    // bistro alone it is the patched entry.
    // SAFETY: a NUL-terminated name of a library this process loaded.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!lib.is_null(), "libcuda is loaded");
    let entry = |name: &std::ffi::CStr| {
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
        assert!(!p.is_null());
        p as usize
    };
    // SAFETY: the driver's entries of these functions have their signatures.
    let (alloc, free) = unsafe {
        (
            std::mem::transmute::<usize, Alloc>(entry(c"cuMemAlloc_v2")),
            std::mem::transmute::<usize, Free>(entry(c"cuMemFree_v2")),
        )
    };
    // `cuda_smoke pair`: the real pair (bare and with a handler) and its
    // floor only, with fewer rounds, so that a run can sample many
    // processes: the figure moves more from process to process than from
    // block to block of one process.
    let pair_only = std::env::args().nth(1).as_deref() == Some("pair");
    added_latency(
        "cuMemAlloc_v2+cuMemFree_v2 4KiB",
        if pair_only { 40_000 } else { 100_000 },
        || sync_pair(alloc, free),
        orig_pair,
        || {},
    );
    // SPEC.md's bar is per hooked call with one handler: the same pair
    // (two hooked calls) with one empty handler for both events, which
    // the hooks then deliver to.
    let handler = memhook::set_handler(
        bits::MEM_TYPE_ALLOC | bits::MEM_TYPE_FREE,
        0,
        HandlerFn::Rust(&|_: &mut Event| {}),
    )
    .expect("a free handler slot");
    added_latency(
        "cuMemAlloc_v2+cuMemFree_v2 4KiB, one empty handler",
        if pair_only { 20_000 } else { 40_000 },
        || sync_pair(alloc, free),
        orig_pair,
        || {},
    );
    memhook::unset_handler(handler).expect("registered above, outside any handler");
    // Where it goes: the original pair plus, by hand, what the hooks do
    // besides calling it (the map's insert and take; the device query
    // where the process sees more than one device), and the device query
    // alone, which the hooks skip where it sees one.
    let mut devices = 0;
    // SAFETY: a valid out-parameter.
    unsafe { sys::cuDeviceGetCount(&mut devices) };
    BY_HAND[0].store(orig_alloc as usize, Ordering::Relaxed);
    BY_HAND[1].store(orig_free as usize, Ordering::Relaxed);
    added_latency(
        &format!("  the original + the hooks' work by hand ({devices} device(s))"),
        20_000,
        if devices > 1 {
            || sync_pair(by_hand_alloc::<true, true, false>, by_hand_free::<true>)
        } else {
            || sync_pair(by_hand_alloc::<false, true, false>, by_hand_free::<true>)
        },
        orig_pair,
        || {},
    );
    if pair_only {
        return;
    }
    added_latency(
        "  the original + cuCtxGetDevice",
        20_000,
        || sync_pair(by_hand_alloc::<true, false, false>, by_hand_free::<false>),
        orig_pair,
        || {},
    );
    added_latency(
        "  cuCtxGetDevice + the original",
        20_000,
        || sync_pair(by_hand_alloc::<true, false, true>, by_hand_free::<false>),
        orig_pair,
        || {},
    );
    // The hook's way in and out alone: a free of the null pointer passes
    // straight to the original (no event), a driver call of ~no work.
    added_latency(
        "  cuMemFree_v2(0), passed through",
        20_000,
        || free_null(free),
        || free_null(orig_free),
        || {},
    );
    // The stream-ordered pair from the device's memory pool: the same hook
    // machinery around driver calls a hundred times cheaper and steadier
    // (its type is asked of the driver: a pool may hold host memory).
    let cu_stream = stream.cu_stream();
    // SAFETY: as above, for the entries.
    let (alloc_async, free_async) = unsafe {
        (
            std::mem::transmute::<usize, AllocAsync>(entry(c"cuMemAllocAsync")),
            std::mem::transmute::<usize, FreeAsync>(entry(c"cuMemFreeAsync")),
        )
    };
    // SAFETY: as above.
    let (orig_alloc_async, orig_free_async) = unsafe {
        (
            std::mem::transmute::<usize, AllocAsync>(original("cuMemAllocAsync")),
            std::mem::transmute::<usize, FreeAsync>(original("cuMemFreeAsync")),
        )
    };
    let rounds = std::cell::Cell::new(0u32);
    added_latency(
        "cuMemAllocAsync+cuMemFreeAsync 4KiB (pool)",
        20_000,
        || async_pair(alloc_async, free_async, cu_stream),
        || async_pair(orig_alloc_async, orig_free_async, cu_stream),
        || {
            // Keep the stream's queue short, rarely: a synchronize lets the
            // pool give its memory back, and the next pair maps it anew.
            rounds.set(rounds.get() + 1);
            if rounds.get().is_multiple_of(1024) {
                stream.synchronize().unwrap();
            }
        },
    );
    memhook::install(&config);
    memhook::set_handler(
        bits::MEM_TYPE_ALLOC | bits::MEM_TYPE_FREE,
        0,
        HandlerFn::Rust(&|e: &mut Event| match e {
            Event::MemTypeAlloc(_) => {
                ALLOCS.fetch_add(1, Ordering::Relaxed);
            }
            Event::MemTypeFree(_) => {
                FREES.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }),
    )
    .unwrap();
    memhook::cuda::count_events_by_function().unwrap();
    let _ = pairs(200);
    println!(
        "events: {} allocs, {} frees (200 pairs hooked, with a handler)",
        ALLOCS.load(Ordering::Relaxed),
        FREES.load(Ordering::Relaxed)
    );

    // cudarc's safe API: whatever it calls (cuMemAllocAsync), memhook sees.
    let before = ALLOCS.load(Ordering::Relaxed);
    let buf = stream.alloc_zeros::<u8>(1 << 20).unwrap();
    let (ptr, sync) = buf.device_ptr(&stream);
    let ptr = ptr as usize;
    drop(sync);
    println!(
        "cudarc alloc_zeros(1 MiB): {} event(s)",
        ALLOCS.load(Ordering::Relaxed) - before
    );
    let look = memtype::lookup(ptr + 4096, 64);
    let classified = memtype::classify(ptr + 4096, 64);
    println!("lookup: {look:?}\nclassify (driver): {classified:?}");
    let agree = matches!((look, classified), (Lookup::Found(a), Lookup::Found(b)) if a.mem_type == b.mem_type && a.device == b.device);
    println!("lookup agrees with the driver: {agree}");
    println!("pci bus id of device 0 (NVML): {:?}", memhook::cuda::pci_bus_id(0));
    let frees = FREES.load(Ordering::Relaxed);
    drop(buf);
    stream.synchronize().unwrap();
    println!(
        "drop: {} free event(s); lookup after: {:?}",
        FREES.load(Ordering::Relaxed) - frees,
        memtype::lookup(ptr, 1)
    );
    println!("events by function: {:?}", memhook::cuda::events_by_function());
    lookup_scaling();
    for s in memhook::status().iter().filter(|s| s.library == "libcuda.so.1") {
        if !s.installed {
            println!("  not installed: {} {} ({})", s.function, s.mode.name(), s.reason);
        }
    }
    let took = memhook::status().iter().filter(|s| s.installed).count();
    println!("status: {took} (function, mode) pairs installed");
}

/// Lookups of live device allocations among 65,536 ranges, from 1, 4 and
/// 16 threads, next to the driver's own answer (cuPointerGetAttribute) for
/// a device and a host pointer, in the same run.
fn lookup_scaling() {
    let mut live = Vec::new();
    for _ in 0..64 {
        let mut p = 0;
        // SAFETY: a driver allocation with a current context.
        let r = unsafe { sys::cuMemAlloc_v2(&mut p, 1 << 16) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        live.push(p as usize);
    }
    // Filler ranges far from any real allocation, up to 65,536 in all.
    let base = 0x7e00_0000_0000usize;
    let mut i = 0;
    while memtype::len() < memtype::CAPACITY {
        let _ = memtype::insert(base + i * 0x2000, 0x1000, memtype::MemType::Cuda, 0);
        i += 1;
    }
    // A mask, not `%`: a division per lookup would be the harness's own
    // cost (and a shared divider where cores are hardware threads).
    assert!(live.len().is_power_of_two());
    let mask = live.len() - 1;
    let lookups = |t: usize| {
        let n = 2_000_000;
        let t0 = Instant::now();
        let mut found = 0usize;
        for k in 0..n {
            let a = live[(k * 7 + t) & mask] + 4096;
            found += usize::from(matches!(memtype::lookup(a, 64), Lookup::Found(_)));
        }
        assert_eq!(found, n, "every live allocation is found");
        t0.elapsed().as_nanos() as f64 / n as f64
    };
    // The machine's own ceiling, in the same harness: arithmetic that
    // touches no memory, as four independent chains (so that, like the
    // lookups, it keeps a core's execution units busy rather than waiting
    // on one chain). Where the cores are hardware threads sharing physical
    // cores, no such code scales 16x on 16 of them.
    let arithmetic = |t: usize| {
        let n = 20_000_000u64;
        let t0 = Instant::now();
        let mut x = [0x9e37_79b9_7f4a_7c15u64 ^ t as u64, 1, 2, 3];
        for _ in 0..n {
            for v in &mut x {
                *v ^= *v << 13;
                *v ^= *v >> 7;
                *v ^= *v << 17;
            }
        }
        std::hint::black_box(x);
        t0.elapsed().as_nanos() as f64 / n as f64
    };
    // Rounds of every case in turn, against each round's own one thread.
    const ROUNDS: usize = 7;
    let counts = [1usize, 4, 16];
    let figures = scaling::scaling(&counts, ROUNDS, &[&lookups, &arithmetic]);
    let (look, arith) = (&figures[0], &figures[1]);
    println!(
        "memtype lookup, 65,536 ranges: 1 thread {:.1} ns ({ROUNDS} rounds of each case in turn; medians)",
        look[0].0
    );
    for k in 1..counts.len() {
        println!(
            "memtype lookup, {} threads: {:.1} ns each, {:.1}x one thread's throughput (goal at 16: 14x); arithmetic alone, same threads: {:.1}x",
            counts[k], look[k].0, look[k].1, arith[k].1
        );
    }
    let attr = |p: usize| {
        let n = 100_000;
        let t0 = Instant::now();
        for _ in 0..n {
            let mut t = 0u32;
            // SAFETY: a valid out-parameter for CU_POINTER_ATTRIBUTE_MEMORY_TYPE.
            let _ = unsafe {
                sys::cuPointerGetAttribute(
                    (&raw mut t).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    p as u64,
                )
            };
        }
        t0.elapsed().as_nanos() as f64 / n as f64
    };
    let host = vec![0u8; 4096];
    println!(
        "cuPointerGetAttribute, same run: device pointer {:.0} ns, host pointer {:.0} ns",
        attr(live[0] + 4096),
        attr(host.as_ptr() as usize)
    );
    // What the hooks ask the driver per allocation: the current device (a
    // typed allocation) or the pointer's attributes (an untyped one, as
    // the stream-ordered ones are).
    let n = 100_000;
    let t0 = Instant::now();
    for _ in 0..n {
        let mut d = 0;
        // SAFETY: a valid out-parameter.
        let _ = unsafe { sys::cuCtxGetDevice(&mut d) };
    }
    let get_device = t0.elapsed().as_nanos() as f64 / n as f64;
    let t0 = Instant::now();
    for _ in 0..n {
        std::hint::black_box(memtype::classify(std::hint::black_box(live[0] + 4096), 1));
    }
    println!(
        "driver calls of the hooks, same run: cuCtxGetDevice {get_device:.0} ns, memtype::classify of a device pointer {:.0} ns",
        t0.elapsed().as_nanos() as f64 / n as f64
    );
    for p in live {
        // SAFETY: frees what was allocated above.
        unsafe { sys::cuMemFree_v2(p as u64) };
    }
}

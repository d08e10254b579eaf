//! On a machine with a GPU: the CUDA hooks against the real driver.
//! Loads libcuda through cudarc (as a Rust CUDA program does), installs the
//! hooks (default modes), allocates and frees through cudarc's safe API and
//! through the raw driver calls, and prints what memhook saw: events by
//! function, lookups next to the driver's own answer, the PCI bus id from
//! NVML, the per-function status, and the added latency of a hooked
//! `cuMemAlloc_v2` + `cuMemFree_v2` pair (4 KiB) against the same calls
//! unhooked, in the same run (medians of blocks of 200 pairs).
//! Without libcuda it says so and exits 0.
//!
//! `cargo run --release -p memhook --example cuda_smoke`

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cudarc::driver::DevicePtr;
use cudarc::driver::sys;
use memhook::event::{Event, bits};
use memhook::memtype::{self, Lookup};
use memhook::{Config, HandlerFn};

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

/// The added latency of `pair` (an allocation and its free), hooked
/// against unhooked: pairs timed one by one, in blocks of 50 that
/// alternate between unhooked and hooked (`config`: the memtype map fed, no
/// handler), 4,000 pairs each; prints the p10, p25 and median of each side.
/// The driver's own time for a pair varies by microseconds, far more than
/// memhook adds, so block means cannot show tens of ns; low quantiles of
/// per-pair times come closer (the fast path's floor is steadier). Returns
/// the install times (ms); `after_block` runs untimed after each block.
fn added_latency(name: &str, config: &Config, pair: impl Fn(), after_block: impl Fn()) -> Vec<f64> {
    let (mut unhooked, mut hooked) = (Vec::new(), Vec::new());
    let mut installs = Vec::new();
    for block in 0..160 {
        let into = if block % 2 == 0 {
            memhook::uninstall();
            &mut unhooked
        } else {
            // libcuda is loaded (cudarc loaded it): install hooks it at once.
            let t = Instant::now();
            memhook::install(config);
            installs.push(t.elapsed().as_secs_f64() * 1e3);
            &mut hooked
        };
        for _ in 0..50 {
            let t = Instant::now();
            pair();
            into.push(t.elapsed().as_nanos() as f64);
        }
        after_block();
    }
    for (q_name, q) in [("p10", 0.10), ("p25", 0.25), ("median", 0.5)] {
        let (u, h) = (quantile(&mut unhooked, q), quantile(&mut hooked, q));
        println!(
            "{name}, {q_name} of 4000 pairs each: unhooked {u:.0} ns, hooked {h:.0} ns, added {:.0} ns",
            h - u
        );
    }
    installs
}

/// The `q`-quantile of `v` (sorts it).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q) as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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
    let installs = added_latency("cuMemAlloc_v2+cuMemFree_v2 4KiB", &config, pair, || {});
    println!(
        "install with libcuda loaded: first {:.2} ms, median {:.2} ms (goal 10 ms)",
        installs[0],
        median(installs.clone())
    );
    // The stream-ordered pair from the device's memory pool: the same hook
    // machinery (an allocation event recorded in the map, then its free),
    // around driver calls a hundred times cheaper and steadier.
    let cu_stream = stream.cu_stream();
    let async_pair = || {
        let mut p = 0;
        // SAFETY: a stream-ordered allocation and its free on a live stream.
        unsafe {
            assert_eq!(
                sys::cuMemAllocAsync(&mut p, 4096, cu_stream),
                sys::CUresult::CUDA_SUCCESS
            );
            assert_eq!(sys::cuMemFreeAsync(p, cu_stream), sys::CUresult::CUDA_SUCCESS);
        }
    };
    for _ in 0..100 {
        async_pair();
    }
    let _ = added_latency(
        "cuMemAllocAsync+cuMemFreeAsync 4KiB (pool)",
        &config,
        async_pair,
        || stream.synchronize().unwrap(),
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
    let per_thread = |threads: usize| {
        let live = &live;
        let start = std::sync::Barrier::new(threads);
        let start = &start;
        let ns: Vec<f64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        start.wait();
                        let n = 2_000_000;
                        let t0 = Instant::now();
                        let mut found = 0usize;
                        for k in 0..n {
                            let a = live[(k * 7 + t) % live.len()] + 4096;
                            found += usize::from(matches!(memtype::lookup(a, 64), Lookup::Found(_)));
                        }
                        assert_eq!(found, n, "every live allocation is found");
                        t0.elapsed().as_nanos() as f64 / n as f64
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        median(ns)
    };
    let one = per_thread(1);
    println!("memtype lookup, 65,536 ranges: 1 thread {one:.1} ns");
    for threads in [4, 16] {
        let ns = per_thread(threads);
        println!(
            "memtype lookup, {threads} threads: {ns:.1} ns each, {:.1}x one thread's throughput (goal at 16: 14x)",
            threads as f64 * one / ns
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
    for p in live {
        // SAFETY: frees what was allocated above.
        unsafe { sys::cuMemFree_v2(p as u64) };
    }
}

//! On every GPU of the machine (the multi-GPU issue: two H200s): device
//! memory, managed memory prefetched to each device, peer-enabled
//! allocations and the runtime's cudaSetDevice switching; every event and
//! lookup carries the right device, and the PCI bus id from NVML; frees on
//! one device never remove another's entries; one thread per device
//! allocating and freeing while another looks up addresses of all of them
//! (never a wrong answer); the lookup-scaling figures over every device's
//! allocations. Runs with any number of GPUs (one included); skipped
//! without a GPU.
#![cfg(target_arch = "x86_64")]

mod common;
#[path = "../../linux/examples/common/scaling.rs"]
mod scaling;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use common::{Rec, log_events, serial, take};
use cudarc::driver::sys::{self, CUresult};
use memhook::Config;
use memhook::event::bits;
use memhook::memtype::{self, Lookup, MemType};

#[track_caller]
fn ok(r: CUresult) {
    assert_eq!(r, CUresult::CUDA_SUCCESS);
}

/// Each device's primary context, or None without a GPU.
fn contexts() -> Option<Vec<sys::CUcontext>> {
    // SAFETY: only probes for the library.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    let mut n = 0;
    // SAFETY: valid out-parameters.
    unsafe {
        if sys::cuInit(0) != CUresult::CUDA_SUCCESS || sys::cuDeviceGetCount(&mut n) != CUresult::CUDA_SUCCESS {
            return None;
        }
    }
    let ctxs: Vec<_> = (0..n)
        .map(|d| {
            let mut c = std::ptr::null_mut();
            // SAFETY: device `d` exists.
            ok(unsafe { sys::cuDevicePrimaryCtxRetain(&mut c, d) });
            c
        })
        .collect();
    (!ctxs.is_empty()).then_some(ctxs)
}

/// Every device's context, with the hooks installed (None without a GPU).
fn setup() -> Option<Vec<sys::CUcontext>> {
    let ctxs = contexts()?;
    memhook::install(&Config::parse("cuda=bistro,reloc,procaddr;mmap=none").unwrap());
    // cudarc loaded libcuda from this program: hook it.
    memhook::refresh();
    Some(ctxs)
}

fn found(addr: usize) -> memhook::memtype::MemInfo {
    match memtype::lookup(addr, 1) {
        Lookup::Found(i) => i,
        other => panic!("lookup({addr:#x}) = {other:?}"),
    }
}

fn alloc_events(recs: &[Rec], addr: usize) -> usize {
    recs.iter()
        .filter(|r| r.0 == bits::MEM_TYPE_ALLOC && r.1 == addr)
        .count()
}

#[test]
fn every_device_keeps_its_own_allocations() {
    let _serial = serial();
    let Some(ctxs) = setup() else {
        eprintln!("gpu_multi: no GPU: skipped");
        return;
    };
    let n = ctxs.len();
    eprintln!("gpu_multi: {n} GPU(s)");
    log_events();
    let _ = take();
    // PCI bus ids: one per device, all different.
    let ids: Vec<String> = (0..n as i32)
        .map(|d| {
            memhook::cuda::pci_bus_id(d)
                .unwrap_or_else(|| panic!("bus id of {d}"))
                .to_string()
        })
        .collect();
    eprintln!("gpu_multi: bus ids {ids:?}");
    for (i, a) in ids.iter().enumerate() {
        assert!(ids[i + 1..].iter().all(|b| b != a), "bus ids differ: {ids:?}");
    }
    // SAFETY: (every call below) driver calls with valid arguments.
    unsafe {
        // Device and managed memory on each device, from its context.
        let mut mine = Vec::new();
        for (d, &ctx) in ctxs.iter().enumerate() {
            ok(sys::cuCtxSetCurrent(ctx));
            let (mut p, mut m) = (0, 0);
            ok(sys::cuMemAlloc_v2(&mut p, 1 << 20));
            ok(sys::cuMemAllocManaged(&mut m, 1 << 20, 1));
            let loc = sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: d as i32,
            };
            ok(sys::cuMemPrefetchAsync_v2(m, 1 << 20, loc, 0, std::ptr::null_mut()));
            ok(sys::cuCtxSynchronize());
            // The event's device: what a handler sees while it runs.
            assert_eq!(
                common::device_at_delivery(p as usize),
                Some(d as i32),
                "device at delivery, {d}"
            );
            let recs = take();
            assert_eq!(alloc_events(&recs, p as usize), 1);
            assert_eq!(alloc_events(&recs, m as usize), 1);
            let i = found(p as usize + 100);
            assert_eq!(
                (i.mem_type, i.device),
                (MemType::Cuda, d as i32),
                "device memory of {d}"
            );
            let Lookup::Found(driver) = memtype::classify(p as usize, 1) else {
                panic!()
            };
            assert_eq!(driver.device, d as i32, "the driver agrees");
            assert_eq!(found(m as usize).mem_type, MemType::CudaManaged);
            mine.push((d, p, m));
        }
        // Peer-enabled allocations: each context may reach the others'.
        for (d, &ctx) in ctxs.iter().enumerate() {
            ok(sys::cuCtxSetCurrent(ctx));
            for (e, &other) in ctxs.iter().enumerate() {
                let mut can = 0;
                ok(sys::cuDeviceCanAccessPeer(&mut can, d as i32, e as i32));
                if e != d && can == 1 {
                    let r = sys::cuCtxEnablePeerAccess(other, 0);
                    assert!(
                        r == CUresult::CUDA_SUCCESS || r == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
                        "{r:?}"
                    );
                }
            }
            let mut p = 0;
            ok(sys::cuMemAlloc_v2(&mut p, 1 << 16));
            assert_eq!(found(p as usize).device, d as i32, "peer-enabled allocation on {d}");
            ok(sys::cuMemFree_v2(p));
        }
        // Frees on one device leave every other device's entries.
        for &(d, p, m) in &mine {
            ok(sys::cuCtxSetCurrent(ctxs[d]));
            ok(sys::cuMemFree_v2(p));
            ok(sys::cuMemFree_v2(m));
            assert_eq!(memtype::lookup(p as usize, 1), Lookup::Absent);
            for &(e, q, _) in &mine {
                if e > d {
                    assert_eq!(
                        found(q as usize).device,
                        e as i32,
                        "device {e}'s entry after frees on {d}"
                    );
                }
            }
        }
    }
    // The runtime switching devices (cudarc's runtime API over libcudart).
    // SAFETY: only probes for the library.
    if unsafe { cudarc::runtime::sys::is_culib_present() } {
        use cudarc::runtime::sys as rt;
        for d in 0..n as i32 {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: runtime calls with valid arguments.
            unsafe {
                assert_eq!(rt::cudaSetDevice(d), rt::cudaError::cudaSuccess);
                assert_eq!(rt::cudaMalloc(&mut p, 1 << 20), rt::cudaError::cudaSuccess);
            }
            assert_eq!(found(p as usize).device, d, "cudaSetDevice({d}) then cudaMalloc");
            // SAFETY: as above.
            unsafe { assert_eq!(rt::cudaFree(p), rt::cudaError::cudaSuccess) };
        }
    }
    let _ = take();
}

#[test]
fn concurrent_devices_and_a_reader_never_disagree() {
    let _serial = serial();
    let Some(ctxs) = setup() else {
        eprintln!("gpu_multi: no GPU: skipped");
        return;
    };
    // Published (address, device + 1) pairs: set after the allocation
    // returned (so it is reported), cleared before the free; each with a
    // sequence, odd from just before the free to just after the next
    // allocation is published. A driver hands back the address it just
    // freed, so a reader that re-checked only the pair could not tell a
    // lookup made between that free and that allocation (which may say
    // Absent) from a wrong answer.
    const SLOTS: usize = 64;
    let published: Arc<Vec<(AtomicUsize, AtomicUsize, AtomicU64)>> = Arc::new(
        (0..SLOTS)
            .map(|_| (AtomicUsize::new(0), AtomicUsize::new(0), AtomicU64::new(0)))
            .collect(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let n = ctxs.len();
    let start = Arc::new(Barrier::new(n + 1));
    let reader = {
        let (published, stop, checked, start) = (published.clone(), stop.clone(), checked.clone(), start.clone());
        std::thread::spawn(move || {
            start.wait();
            while !stop.load(Ordering::Acquire) {
                for (addr, dev, seq) in published.iter() {
                    let s1 = seq.load(Ordering::Acquire);
                    let a = addr.load(Ordering::Relaxed);
                    let d = dev.load(Ordering::Relaxed);
                    if s1 & 1 == 1 || a == 0 || d == 0 {
                        continue;
                    }
                    let answer = memtype::lookup(a + 64, 8);
                    // Only a slot that changed since the loads may
                    // disagree: its sequence moved.
                    std::sync::atomic::fence(Ordering::Acquire);
                    if seq.load(Ordering::Relaxed) != s1 {
                        continue;
                    }
                    match answer {
                        Lookup::Found(i) if i.mem_type == MemType::Cuda && i.device == d as i32 - 1 => {
                            checked.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("{a:#x}, allocated on device {}: the map says {other:?}", d - 1),
                    }
                }
            }
        })
    };
    let workers: Vec<_> = ctxs
        .iter()
        .enumerate()
        .map(|(d, &ctx)| {
            let (published, start) = (published.clone(), start.clone());
            let ctx = ctx as usize;
            std::thread::spawn(move || {
                // SAFETY: device d's primary context.
                ok(unsafe { sys::cuCtxSetCurrent(ctx as sys::CUcontext) });
                start.wait();
                // A ring of live allocations per device: each lives while
                // the device's next RING - 1 are made, published from its
                // allocation's return to just before its free.
                const RING: usize = 8;
                let mine: Vec<usize> = (0..SLOTS).filter(|s| s % n == d).take(RING).collect();
                let mut held = [0u64; RING];
                for i in 0..4000 {
                    let k = i % RING;
                    let slot = &published[mine[k]];
                    slot.2.fetch_add(1, Ordering::Relaxed);
                    std::sync::atomic::fence(Ordering::Release);
                    if held[k] != 0 {
                        slot.1.store(0, Ordering::Relaxed);
                        slot.0.store(0, Ordering::Relaxed);
                        // SAFETY: the allocation made RING iterations ago.
                        ok(unsafe { sys::cuMemFree_v2(held[k]) });
                    }
                    let mut p = 0;
                    // SAFETY: driver calls with valid arguments.
                    ok(unsafe { sys::cuMemAlloc_v2(&mut p, 1 << 16) });
                    held[k] = p;
                    slot.0.store(p as usize, Ordering::Relaxed);
                    slot.1.store(d + 1, Ordering::Relaxed);
                    slot.2.fetch_add(1, Ordering::Release);
                }
                for (k, &p) in held.iter().enumerate() {
                    published[mine[k]].2.fetch_add(1, Ordering::Relaxed);
                    std::sync::atomic::fence(Ordering::Release);
                    published[mine[k]].1.store(0, Ordering::Relaxed);
                    // SAFETY: the ring's last allocations.
                    ok(unsafe { sys::cuMemFree_v2(p) });
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Release);
    reader.join().unwrap();
    let checked = checked.load(Ordering::Relaxed);
    eprintln!("gpu_multi: {checked} concurrent lookups checked on {n} device(s)");
    assert!(checked > 1000, "the reader saw live allocations ({checked})");
    let _ = take();
}

#[test]
fn lookup_scaling_across_devices() {
    let _serial = serial();
    let Some(ctxs) = setup() else {
        eprintln!("gpu_multi: no GPU: skipped");
        return;
    };
    let mut live = Vec::new();
    for &ctx in &ctxs {
        // SAFETY: driver calls with valid arguments.
        unsafe {
            ok(sys::cuCtxSetCurrent(ctx));
            for _ in 0..32 {
                let mut p = 0;
                ok(sys::cuMemAlloc_v2(&mut p, 1 << 16));
                live.push(p as usize);
            }
        }
    }
    // 1,024 probes (a mask, not `%`, picks one: a division per lookup
    // would be the harness's own cost).
    let probes: Vec<usize> = (0..1024).map(|i| live[i % live.len()] + 4096).collect();
    let lookups = |t: usize| {
        let n = 1_000_000;
        let t0 = Instant::now();
        for k in 0..n {
            let a = probes[(k * 7 + t) & 1023];
            assert!(matches!(memtype::lookup(a, 64), Lookup::Found(_)));
        }
        t0.elapsed().as_nanos() as f64 / n as f64
    };
    // Rounds of each case in turn; each round's ratio against its own
    // one-thread figure (a first run at a higher clock, or drift, cancels).
    let counts = [1usize, 4, 16];
    let figures = scaling::scaling(&counts, 5, &[&lookups]);
    for (&threads, (ns, ratio)) in counts.iter().zip(&figures[0]) {
        eprintln!(
            "gpu_multi: lookups over {} devices' allocations, {threads} threads: {ns:.1} ns each, {ratio:.1}x one thread (medians of 5 rounds)",
            ctxs.len()
        );
    }
    for p in live {
        // SAFETY: frees the allocations above (the context of each is not
        // needed for cuMemFree).
        unsafe { sys::cuMemFree_v2(p as u64) };
    }
}

//! On a GPU: every hooked driver allocation and free function, for real.
//! Each emits its event once with the right size, and the memory-type
//! map's answer agrees with the driver's own (cuPointerGetAttributes):
//! type and device. Skipped, with a message, where there is no GPU.
#![cfg(target_arch = "x86_64")]

mod common;

use std::ffi::c_void;

use common::{EveryKind, Rec, agrees, log_events, one_event, same_events, serial, take};
use cudarc::driver::sys::{self, CUresult};
use memhook::Config;
use memhook::event::bits;
use memhook::memtype::{self, Lookup, MemType};

const A: u32 = bits::MEM_TYPE_ALLOC;
const F: u32 = bits::MEM_TYPE_FREE;

/// A current context on device 0, or None (no driver, no GPU).
fn gpu() -> Option<sys::CUcontext> {
    // SAFETY: only probes for the library.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    let mut ctx = std::ptr::null_mut();
    // SAFETY: valid out-parameters; the primary context of device 0.
    unsafe {
        if sys::cuInit(0) != CUresult::CUDA_SUCCESS {
            return None;
        }
        if sys::cuDevicePrimaryCtxRetain(&mut ctx, 0) != CUresult::CUDA_SUCCESS {
            return None;
        }
        assert_eq!(sys::cuCtxSetCurrent(ctx), CUresult::CUDA_SUCCESS);
    }
    Some(ctx)
}

/// [`gpu`], with every CUDA hook installed, the log handler registered
/// and the log emptied; None (and a message) where there is no GPU.
fn hooked_gpu() -> Option<sys::CUcontext> {
    let Some(ctx) = gpu() else {
        eprintln!("gpu_driver: no GPU (or no driver): skipped");
        return None;
    };
    log_events();
    memhook::install(&Config::parse("cuda=bistro,reloc,procaddr;mmap=none").unwrap());
    memhook::refresh();
    assert!(memhook::cuda::attached().0, "libcuda hooked");
    let _ = take();
    Some(ctx)
}

#[track_caller]
fn ok(r: CUresult) {
    assert_eq!(r, CUresult::CUDA_SUCCESS);
}

#[track_caller]
fn one(recs: Vec<Rec>, kind: u32, addr: usize, size: usize) {
    one_event(recs, kind, addr, size);
}

/// A PTX module with a device global and a managed global of 256 bytes.
const PTX: &str = "
.version 7.0
.target sm_70
.address_size 64
.visible .global .align 8 .b8 memhook_global[256];
.visible .global .attribute(.managed) .align 8 .b8 memhook_managed[256];
\0";

#[test]
fn every_hooked_driver_function_on_the_gpu() {
    let _serial = serial();
    let Some(_ctx) = hooked_gpu() else {
        return;
    };
    let counting = memhook::cuda::count_events_by_function().expect("a free handler slot");
    // SAFETY: (every call below) driver calls with valid arguments and a
    // current context.
    unsafe {
        let mut p = 0;
        ok(sys::cuMemAlloc_v2(&mut p, 1 << 20));
        one(take(), A, p as usize, 1 << 20);
        agrees(p as usize + 4096, MemType::Cuda);
        ok(sys::cuMemFree_v2(p));
        one(take(), F, p as usize, 1 << 20);
        assert_eq!(memtype::lookup(p as usize, 1), Lookup::Absent);

        ok(sys::cuMemAllocManaged(&mut p, 1 << 20, 1));
        one(take(), A, p as usize, 1 << 20);
        agrees(p as usize, MemType::CudaManaged);
        ok(sys::cuMemFree_v2(p));
        one(take(), F, p as usize, 1 << 20);

        let mut pitch = 0;
        ok(sys::cuMemAllocPitch_v2(&mut p, &mut pitch, 1000, 3, 4));
        one(take(), A, p as usize, pitch * 3);
        agrees(p as usize, MemType::Cuda);
        ok(sys::cuMemFree_v2(p));
        one(take(), F, p as usize, pitch * 3);

        let stream = std::ptr::null_mut();
        ok(sys::cuMemAllocAsync(&mut p, 1 << 20, stream));
        one(take(), A, p as usize, 1 << 20);
        agrees(p as usize, MemType::Cuda);
        ok(sys::cuMemFreeAsync(p, stream));
        one(take(), F, p as usize, 1 << 20);
        ok(sys::cuStreamSynchronize(stream));

        let mut pool = std::ptr::null_mut();
        ok(sys::cuDeviceGetDefaultMemPool(&mut pool, 0));
        ok(sys::cuMemAllocFromPoolAsync(&mut p, 1 << 20, pool, stream));
        one(take(), A, p as usize, 1 << 20);
        agrees(p as usize, MemType::Cuda);
        ok(sys::cuMemFreeAsync(p, stream));
        one(take(), F, p as usize, 1 << 20);
        ok(sys::cuStreamSynchronize(stream));

        // Virtual memory management: create, reserve, map, unmap.
        let mut prop: sys::CUmemAllocationProp = std::mem::zeroed();
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        let mut gran = 0;
        ok(sys::cuMemGetAllocationGranularity(
            &mut gran,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        ));
        let mut handle = 0;
        ok(sys::cuMemCreate(&mut handle, gran, &prop, 0));
        // Mapped in the second of four granules reserved: the driver's
        // range attributes give the reservation, and classify records
        // the mapping alone.
        let mut reservation = 0;
        ok(sys::cuMemAddressReserve(&mut reservation, 4 * gran, 0, 0, 0));
        let va = reservation + gran as sys::CUdeviceptr;
        ok(sys::cuMemMap(va, gran, 0, handle, 0));
        one(take(), A, va as usize, gran);
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        ok(sys::cuMemSetAccess(va, gran, &access, 1));
        agrees(va as usize, MemType::Cuda);
        let mapping = memtype::MemInfo {
            mem_type: MemType::Cuda,
            device: 0,
            base: va as usize,
            len: gran,
        };
        assert_eq!(memtype::classify(va as usize + 100, 1), Lookup::Found(mapping));
        assert_eq!(memtype::lookup(va as usize, gran), Lookup::Found(mapping));
        for unmapped in [reservation as usize, va as usize + gran] {
            assert!(
                matches!(memtype::classify(unmapped, 1), Lookup::Found(i) if i.mem_type == MemType::Host),
                "{unmapped:#x}"
            );
            assert_eq!(memtype::lookup(unmapped, 1), Lookup::Absent, "{unmapped:#x}");
        }
        // A range that cuts the mapping: the driver refuses it. The hook
        // reported it freed before the call, then the mapping again.
        assert_ne!(sys::cuMemUnmap(va, gran / 2), CUresult::CUDA_SUCCESS);
        let ours: Vec<_> = take()
            .into_iter()
            .filter(|r| r.1 == va as usize)
            .map(|r| (r.0, r.2, r.3))
            .collect();
        let cuda = MemType::Cuda as u32;
        assert_eq!(ours, [(F, gran / 2, cuda), (A, gran, cuda)]);
        assert_eq!(memtype::lookup(va as usize, gran), Lookup::Found(mapping));
        // A device free of the mapped page: refused too (run 164). The
        // map marked the mapping, so the hook looked at the answer: the
        // page was reported freed, then again, and stays in the map.
        assert_ne!(sys::cuMemFree_v2(va), CUresult::CUDA_SUCCESS);
        let ours: Vec<_> = take()
            .into_iter()
            .filter(|r| r.1 == va as usize)
            .map(|r| (r.0, r.2, r.3))
            .collect();
        assert_eq!(ours, [(F, gran, cuda), (A, gran, cuda)], "a refused cuMemFree_v2");
        assert_eq!(memtype::lookup(va as usize, gran), Lookup::Found(mapping));
        ok(sys::cuMemUnmap(va, gran));
        one(take(), F, va as usize, gran);
        ok(sys::cuMemRelease(handle));
        ok(sys::cuMemAddressFree(reservation, 4 * gran));

        // Pinned host memory.
        let mut h: *mut c_void = std::ptr::null_mut();
        ok(sys::cuMemAllocHost_v2(&mut h, 1 << 20));
        one(take(), A, h as usize, 1 << 20);
        agrees(h as usize, MemType::CudaHost);
        ok(sys::cuMemFreeHost(h));
        one(take(), F, h as usize, 1 << 20);
        ok(sys::cuMemHostAlloc(&mut h, 1 << 20, 0));
        one(take(), A, h as usize, 1 << 20);
        agrees(h as usize, MemType::CudaHost);
        ok(sys::cuMemFreeHost(h));
        one(take(), F, h as usize, 1 << 20);

        // Registered host memory (page-aligned).
        let size = 4 << 20;
        let mem = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        ok(sys::cuMemHostRegister_v2(mem, size, 0));
        one(take(), A, mem as usize, size);
        agrees(mem as usize + 4096, MemType::CudaHost);

        // Frees the driver refuses (memory of the other kind: a program
        // error): each hook reported the free before the call, then the
        // memory again, and the map holds it as before.
        ok(sys::cuMemAllocHost_v2(&mut h, 1 << 16));
        ok(sys::cuMemAlloc_v2(&mut p, 1 << 16));
        let _ = take();
        let entry = |at: usize| match memtype::lookup(at, 1) {
            Lookup::Found(i) => (i.mem_type, i.device, i.base, i.len),
            other => panic!("{at:#x}: {other:?}"),
        };
        let (pinned, registered, device) = (h as usize, mem as usize, p as usize);
        let kept = [entry(pinned), entry(registered), entry(device)];
        let refusals = [
            (
                "cuMemFree_v2 of pinned memory",
                sys::cuMemFree_v2(pinned as u64),
                pinned,
            ),
            (
                "cuMemFreeAsync of registered memory",
                sys::cuMemFreeAsync(registered as u64, std::ptr::null_mut()),
                registered,
            ),
            (
                "cuMemFreeHost of registered memory",
                sys::cuMemFreeHost(mem),
                registered,
            ),
            (
                "cuMemHostUnregister of pinned memory",
                sys::cuMemHostUnregister(h),
                pinned,
            ),
            (
                "cuMemFreeHost of device memory",
                sys::cuMemFreeHost(device as *mut c_void),
                device,
            ),
        ];
        let mut logged = take().into_iter();
        for (what, status, at) in refusals {
            assert_ne!(status, CUresult::CUDA_SUCCESS, "{what}: the driver refuses it");
            let (t, _, base, len) = entry(at);
            assert_eq!([entry(pinned), entry(registered), entry(device)], kept, "{what}");
            let got = [logged.next(), logged.next()];
            let t = t as u32;
            assert_eq!(got, [Some((F, base, len, t)), Some((A, base, len, t))], "{what}");
        }
        assert_eq!(logged.next(), None);
        ok(sys::cuMemFreeHost(h));
        ok(sys::cuMemFree_v2(p));
        assert_eq!(take().len(), 2);

        ok(sys::cuMemHostUnregister(mem));
        one(take(), F, mem as usize, size);
        libc::munmap(mem, size);

        // Module and library globals, a __managed__ one among them.
        let mut module = std::ptr::null_mut();
        ok(sys::cuModuleLoadData(&mut module, PTX.as_ptr().cast()));
        let mut bytes = 0;
        ok(sys::cuModuleGetGlobal_v2(
            &mut p,
            &mut bytes,
            module,
            c"memhook_global".as_ptr(),
        ));
        assert_eq!(bytes, 256);
        one(take(), A, p as usize, 256);
        agrees(p as usize, MemType::Cuda);
        let module_global = p as usize;
        ok(sys::cuModuleGetGlobal_v2(
            &mut p,
            std::ptr::null_mut(),
            module,
            c"memhook_managed".as_ptr(),
        ));
        one(take(), A, p as usize, 256);
        agrees(p as usize, MemType::CudaManaged);
        let module_managed = p as usize;
        let mut library = std::ptr::null_mut();
        ok(sys::cuLibraryLoadData(
            &mut library,
            PTX.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        ));
        ok(sys::cuLibraryGetGlobal(
            &mut p,
            &mut bytes,
            library,
            c"memhook_global".as_ptr(),
        ));
        one(take(), A, p as usize, 256);
        agrees(p as usize, MemType::Cuda);
        let library_global = p as usize;

        // A device free of a global: refused by driver 580 (run 169,
        // tests/gpu/refusals.c), reported freed, then again, and the
        // global still in the map, for its unload to report.
        assert_ne!(sys::cuMemFree_v2(module_global as u64), CUresult::CUDA_SUCCESS);
        assert_ne!(
            sys::cuMemFreeAsync(module_managed as u64, std::ptr::null_mut()),
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            take(),
            [
                (F, module_global, 256, MemType::Cuda as u32),
                (A, module_global, 256, MemType::Cuda as u32),
                (F, module_managed, 256, MemType::CudaManaged as u32),
                (A, module_managed, 256, MemType::CudaManaged as u32),
            ],
            "each refused free of a global reported, then the global again"
        );
        agrees(module_global, MemType::Cuda);
        agrees(module_managed, MemType::CudaManaged);

        // Their unloads free them, with no free call: one MEM_TYPE_FREE
        // each, before the call, and the map forgets them.
        ok(sys::cuModuleUnload(module));
        same_events(
            take(),
            vec![
                (F, module_global, 256, MemType::Cuda as u32),
                (F, module_managed, 256, MemType::CudaManaged as u32),
            ],
            "the module's globals",
        );
        ok(sys::cuLibraryUnload(library));
        assert_eq!(take(), [(F, library_global, 256, MemType::Cuda as u32)]);
        for gone in [module_global, module_managed, library_global] {
            assert_eq!(memtype::lookup(gone, 1), Lookup::Absent, "{gone:#x}");
        }
    }
    memhook::unset_handler(counting).expect("registered above, outside any handler");
    let by_function = memhook::cuda::events_by_function();
    eprintln!("gpu_driver: events by function: {by_function:?}");
    existing_gpu_mappings_replay_as_unknown();
    memhook::uninstall();
}

/// EXISTING_ALLOC with MEM_TYPE_ALLOC: a handler registered now is told
/// of the driver's mappings of its device files (a live context has some),
/// each as memory of unknown type; `/proc/self/maps` read independently
/// (std, a line at a time) names the same ranges.
fn existing_gpu_mappings_replay_as_unknown() {
    use std::sync::Mutex;
    static SEEN: Mutex<Vec<(usize, usize, u32)>> = Mutex::new(Vec::new());
    let id = memhook::set_handler(
        bits::MEM_TYPE_ALLOC | bits::EXISTING_ALLOC,
        0,
        memhook::HandlerFn::Rust(&|e| {
            if let memhook::event::Event::MemTypeAlloc(m) = *e {
                SEEN.lock().unwrap().push((m.address, m.size, m.mem_type));
            }
        }),
    )
    .unwrap();
    memhook::unset_handler(id).unwrap();
    let seen = std::mem::take(&mut *SEEN.lock().unwrap());
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let want: Vec<(usize, usize, u32)> = maps
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(5)
                .is_some_and(|p| p.starts_with("/dev/nvidia"))
        })
        .map(|l| {
            let (a, b) = l.split_whitespace().next().unwrap().split_once('-').unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            (a, b - a, MemType::Unknown as u32)
        })
        .collect();
    eprintln!("gpu_driver: {} existing GPU mappings replayed", seen.len());
    assert!(!want.is_empty(), "a live context maps the driver's device files");
    assert_eq!(seen, want);
}

/// One allocation of each kind, made in the current context.
fn every_kind() -> EveryKind {
    let [d_size, m_size, p_size, r_size, pool_size] = EveryKind::SIZES;
    let page = EveryKind::own_mapping();
    // SAFETY: driver calls with valid arguments and a current context;
    // the registered mapping is this test's own.
    unsafe {
        let (mut d, mut m, mut pool) = (0, 0, 0);
        ok(sys::cuMemAlloc_v2(&mut d, d_size));
        ok(sys::cuMemAllocManaged(&mut m, m_size, 1)); // CU_MEM_ATTACH_GLOBAL
        let mut host = std::ptr::null_mut();
        ok(sys::cuMemAllocHost_v2(&mut host, p_size));
        ok(sys::cuMemHostRegister_v2(page, r_size, 0));
        ok(sys::cuMemAllocAsync(&mut pool, pool_size, std::ptr::null_mut()));
        ok(sys::cuStreamSynchronize(std::ptr::null_mut()));
        EveryKind::new([d as usize, m as usize, host as usize, page as usize, pool as usize])
    }
}

/// Destroying a context frees what was allocated in it, with no free
/// call: device, managed, pinned and registered memory each get a
/// `MEM_TYPE_FREE` from `cuCtxDestroy`'s hook, and leave the map; the
/// primary context's allocation and the stream-ordered pool's (which
/// outlives contexts) stay. Then the primary context's reset ends its own.
#[test]
fn destroying_a_context_reports_its_allocations_on_the_gpu() {
    let _serial = serial();
    let Some(_primary) = hooked_gpu() else {
        return;
    };
    // SAFETY: (every call below) driver calls with valid arguments and a
    // current context.
    unsafe {
        let mut keep = 0;
        ok(sys::cuMemAlloc_v2(&mut keep, 1 << 20));
        let mut ctx = std::ptr::null_mut();
        ok(sys::cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), 0, 0));
        let made = every_kind();
        let _ = take();

        ok(sys::cuCtxDestroy_v2(ctx));
        same_events(
            take(),
            made.frees().to_vec(),
            "one free for each allocation of the destroyed context",
        );
        made.check_ended();
        assert!(
            matches!(memtype::lookup(keep as usize, 1), Lookup::Found(i) if i.mem_type == MemType::Cuda),
            "the primary context's allocation stays"
        );
        eprintln!(
            "gpu_driver: cuCtxDestroy reported {} frees; the pool's memory is still the driver's: {:?}",
            4,
            memtype::classify(made.pool, 1)
        );

        // The primary context's reset (what cudaDeviceReset calls) ends
        // the allocation made in it.
        ok(sys::cuDevicePrimaryCtxReset_v2(0));
        let after = take();
        assert!(
            after.contains(&(F, keep as usize, 1 << 20, MemType::Cuda as u32)),
            "{after:x?}"
        );
        assert_eq!(memtype::lookup(keep as usize, 1), Lookup::Absent);
    }
    // A fresh primary context for the tests after this one.
    assert!(gpu().is_some());
    memhook::uninstall();
}

/// The release of the primary context's last reference destroys it, and
/// what was allocated in it, with no free call: device, managed, pinned
/// and registered memory each get a `MEM_TYPE_FREE` from the release's
/// hook, after that release (which release is the last shows only
/// then), and leave the map; the stream-ordered pool's memory stays, and
/// so does every allocation of another context (which the sweep after
/// the release asks the driver about). The earlier releases end nothing.
#[test]
fn the_last_release_of_the_primary_context_reports_its_allocations_on_the_gpu() {
    let _serial = serial();
    let Some(_primary) = hooked_gpu() else {
        return;
    };
    let active = || {
        let (mut flags, mut active) = (0, 0);
        // SAFETY: valid out-parameters; device 0 exists.
        ok(unsafe { sys::cuDevicePrimaryCtxGetState(0, &mut flags, &mut active) });
        active != 0
    };
    let made = every_kind();
    // And the same in a context of its own, which outlives the primary.
    let mut ctx = std::ptr::null_mut();
    // SAFETY: a valid out-parameter, device 0.
    ok(unsafe { sys::cuCtxCreate_v4(&mut ctx, std::ptr::null_mut(), 0, 0) });
    let other = every_kind();
    let _ = take();
    // This process's tests took a reference each: release them all.
    let mut releases = 0;
    while active() {
        assert_eq!(take(), [], "a release that is not the last ends nothing");
        // SAFETY: a reference this process holds.
        ok(unsafe { sys::cuDevicePrimaryCtxRelease_v2(0) });
        releases += 1;
        assert!(releases < 100_000, "the primary context stays active");
    }
    let ended = take();
    for want in made.frees() {
        assert!(ended.contains(&want), "{want:x?} in {ended:x?}");
    }
    assert!(ended.iter().all(|e| e.0 == F && e.1 != made.pool), "{ended:x?}");
    made.check_ended();
    eprintln!(
        "gpu_driver: the last of {releases} releases of the primary context reported {} frees",
        ended.len()
    );
    // The other context's memory, pinned and registered included, is
    // still the driver's, and the map's as it was: the sweep left it.
    for (addr, mem_type) in [
        (other.device, MemType::Cuda),
        (other.managed, MemType::CudaManaged),
        (other.pinned, MemType::CudaHost),
        (other.registered, MemType::CudaHost),
    ] {
        agrees(addr, mem_type);
    }
    // SAFETY: the context created above.
    ok(unsafe { sys::cuCtxDestroy_v2(ctx) });
    same_events(
        take(),
        other.frees().to_vec(),
        "the other context's destruction ends its own",
    );
    other.check_ended();
    // A fresh primary context for the tests after this one.
    assert!(gpu().is_some());
    memhook::uninstall();
}

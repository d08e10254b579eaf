//! Frees the driver refuses (a program error it catches: a free of memory
//! of another kind, or of memory mapped with `cuMemMap` or opened from
//! another process by a free of device memory) leave the memory-type map as it was, with a handler
//! (the free reported, then the allocation again) and with none (the
//! hooks' short path, which ends in a tail call to the driver). Its own
//! process: the first part runs before any handler is registered. The
//! fake driver refuses as driver 580 does on the H200
//! (`tests/gpu/refusals.c`).
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod common;

use std::ffi::{CStr, c_uint, c_void};

use common::*;
use memhook::event::bits;
use memhook::memtype::{self, Lookup, MemType};

type Dptr = u64;

fn f<T>(h: *mut c_void, name: &CStr) -> T {
    // SAFETY: each name below is the fake driver's (or runtime's) function
    // of type T.
    unsafe { cast(sym(h, name)) }
}

/// A map entry: type, device, base, length.
type Entry = (MemType, i32, usize, usize);

/// The map's entry at `p`.
#[track_caller]
fn entry(p: usize) -> Entry {
    match memtype::lookup(p, 1) {
        Lookup::Found(i) => (i.mem_type, i.device, i.base, i.len),
        other => panic!("{p:#x}: {other:?}"),
    }
}

/// The fake driver's entries the test calls.
struct Driver {
    alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32,
    alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> u32,
    register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> u32,
    from_pool: unsafe extern "C" fn(*mut Dptr, usize, usize, usize) -> u32,
    free: unsafe extern "C" fn(Dptr) -> u32,
    free_async: unsafe extern "C" fn(Dptr, usize) -> u32,
    free_host: unsafe extern "C" fn(*mut c_void) -> u32,
    unregister: unsafe extern "C" fn(*mut c_void) -> u32,
    error_after_free: unsafe extern "C" fn(i32, i32),
    forget: unsafe extern "C" fn(usize),
    reserve: unsafe extern "C" fn(*mut Dptr, usize, usize, Dptr, u64) -> u32,
    unreserve: unsafe extern "C" fn(Dptr, usize) -> u32,
    map: unsafe extern "C" fn(Dptr, usize, usize, u64, u64) -> u32,
    unmap: unsafe extern "C" fn(Dptr, usize) -> u32,
    ipc_open: unsafe extern "C" fn(*mut Dptr, Handle, c_uint) -> u32,
    ipc_close: unsafe extern "C" fn(Dptr) -> u32,
}

const A: u32 = bits::MEM_TYPE_ALLOC;
const F: u32 = bits::MEM_TYPE_FREE;
const DEVICE: usize = 1 << 20;
const PINNED: usize = 1 << 16;
const REGISTERED: usize = 1 << 16;
const POOL: usize = 1 << 16;
const PAGE: usize = 2 << 20;

/// One round: memory of each kind, each freed by the calls the driver
/// refuses it, then by its own. `events`: a handler logs them (checked).
fn round(d: &Driver, events: bool) {
    let ev = |kind: u32, addr: usize, size: usize, t: MemType| (kind, addr, size, t as u32);
    let mut p: Dptr = 0;
    // SAFETY: the fake's allocation, with a valid out-parameter.
    assert_eq!(unsafe { (d.alloc)(&mut p, DEVICE) }, 0);
    let device = p as usize;
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: as above.
    assert_eq!(unsafe { (d.alloc_host)(&mut h, PINNED) }, 0);
    let pinned = h as usize;
    let own = EveryKind::own_mapping();
    // SAFETY: the test's own mapping of that size.
    assert_eq!(unsafe { (d.register)(own, REGISTERED, 0) }, 0);
    let registered = own as usize;
    // A pool of host memory (to the fake, a handle with bit 0 set): its
    // allocations are pinned host memory that a device free ends.
    // SAFETY: as above; the fake takes any stream.
    assert_eq!(unsafe { (d.from_pool)(&mut p, POOL, 1, 0) }, 0);
    let pool = p as usize;
    // A page of device memory mapped into a reserved range, and memory
    // of device 3 opened from another process.
    let mut va: Dptr = 0;
    // SAFETY: the fake's functions, with a valid out-parameter; the page
    // lies in the range reserved.
    unsafe {
        assert_eq!((d.reserve)(&mut va, 2 * PAGE, 0, 0, 0), 0);
        assert_eq!((d.map)(va, PAGE, 0, 0, 0), 0);
        assert_eq!((d.ipc_open)(&mut p, handle(PAGE, 3), 1), 0);
    }
    let (mapped, opened) = (va as usize, p as usize);
    let kept_mapped = (MemType::Cuda, 0, mapped, PAGE);
    let kept_opened = (MemType::Cuda, 3, opened, PAGE);
    assert_eq!((entry(mapped), entry(opened)), (kept_mapped, kept_opened));
    let kept_device = (MemType::Cuda, 0, device, DEVICE);
    let kept_pinned = (MemType::CudaHost, -1, pinned, PINNED);
    let kept_registered = (MemType::CudaHost, -1, registered, REGISTERED);
    assert_eq!(
        (entry(device), entry(pinned), entry(registered), entry(pool)),
        (
            kept_device,
            kept_pinned,
            kept_registered,
            (MemType::CudaHost, -1, pool, POOL)
        )
    );
    let _ = take();

    // Refused: each free of memory of the other kind.
    // SAFETY: the fake's functions; each checks the pointer and refuses
    // what it did not allocate for that call.
    let refusals: [(&str, u32, usize, Entry); 9] = unsafe {
        [
            (
                "cuMemFree_v2 of a page mapped with cuMemMap",
                (d.free)(mapped as Dptr),
                mapped,
                kept_mapped,
            ),
            (
                "cuMemFreeAsync of memory opened from another process",
                (d.free_async)(opened as Dptr, 0),
                opened,
                kept_opened,
            ),
            (
                "cuMemFree_v2 of memory opened from another process",
                (d.free)(opened as Dptr),
                opened,
                kept_opened,
            ),
            (
                "cuMemFree_v2 of pinned memory",
                (d.free)(pinned as Dptr),
                pinned,
                kept_pinned,
            ),
            (
                "cuMemFreeAsync of registered memory",
                (d.free_async)(registered as Dptr, 0),
                registered,
                kept_registered,
            ),
            (
                "cuMemFreeHost of registered memory",
                (d.free_host)(own),
                registered,
                kept_registered,
            ),
            (
                "cuMemHostUnregister of pinned memory",
                (d.unregister)(h),
                pinned,
                kept_pinned,
            ),
            (
                "cuMemFreeHost of device memory",
                (d.free_host)(device as *mut c_void),
                device,
                kept_device,
            ),
            (
                "cuMemHostUnregister of device memory",
                (d.unregister)(device as *mut c_void),
                device,
                kept_device,
            ),
        ]
    };
    let mut logged = take().into_iter();
    for (what, status, at, kept) in refusals {
        assert_ne!(status, 0, "{what}: the fake refuses it");
        assert_eq!(entry(at), kept, "{what}: the map holds the memory as before");
        if events {
            let (t, _, base, len) = kept;
            let got = [logged.next(), logged.next()];
            assert_eq!(
                got,
                [Some(ev(F, base, len, t)), Some(ev(A, base, len, t))],
                "{what}: reported freed, then again"
            );
        }
    }
    assert_eq!(logged.next(), None);
    // Refused, of an address inside an allocation: nothing is taken.
    // SAFETY: as above.
    assert_ne!(unsafe { (d.unregister)((registered + 4096) as *mut c_void) }, 0);
    // SAFETY: as above.
    assert_ne!(unsafe { (d.free)((device + 4096) as Dptr) }, 0);
    assert_eq!((entry(device), entry(registered)), (kept_device, kept_registered));
    assert!(!take().iter().any(|r| r.0 == A), "nothing was taken to put back");
    // The reservation freed with the page still mapped in it: refused (by
    // driver 580 as by the fake, tests/gpu/refusals.c), so memhook, which
    // does not hook cuMemAddressFree, keeps the page and reports nothing.
    // SAFETY: the fake's function; the range reserved above.
    assert_ne!(unsafe { (d.unreserve)(va, 2 * PAGE) }, 0);
    assert_eq!(entry(mapped), kept_mapped, "a refused cuMemAddressFree");
    assert_eq!(take(), [], "a refused cuMemAddressFree reports nothing");

    // An error from a free that freed all the same (as the runtime's
    // frees may answer an error of earlier work): the memory is gone, and
    // nothing is put back; nor where other memory lies there by then.
    for other in [false, true] {
        let mut extra: *mut c_void = std::ptr::null_mut();
        // SAFETY: as above.
        assert_eq!(unsafe { (d.alloc_host)(&mut extra, PINNED) }, 0);
        let _ = take();
        // SAFETY: the fake's control function.
        unsafe { (d.error_after_free)(719, i32::from(other)) };
        // SAFETY: as above.
        assert_eq!(unsafe { (d.free_host)(extra) }, 719);
        let left = memtype::lookup(extra as usize, 1);
        assert_eq!(
            left,
            Lookup::Absent,
            "freed with an error (other memory there: {other})"
        );
        if events {
            assert_eq!(take(), [ev(F, extra as usize, PINNED, MemType::CudaHost)]);
        }
        // SAFETY: the fake's control function; the device memory it left.
        unsafe { (d.forget)(extra as usize) };
    }

    // The host pool's allocation: a device free ends it.
    // SAFETY: the fake's function; the pool allocation above.
    assert_eq!(unsafe { (d.free_async)(pool as Dptr, 0) }, 0);
    assert_eq!(memtype::lookup(pool, 1), Lookup::Absent);
    // Each by its own free.
    // SAFETY: as above: each of its own kind.
    let ends = unsafe {
        [
            (d.free)(device as Dptr),
            (d.free_host)(h),
            (d.unregister)(own),
            (d.unmap)(mapped as Dptr, PAGE),
            (d.ipc_close)(opened as Dptr),
        ]
    };
    assert_eq!(ends, [0; 5]);
    for gone in [device, pinned, registered, mapped, opened] {
        assert_eq!(memtype::lookup(gone, 1), Lookup::Absent, "{gone:#x}");
    }
    if events {
        assert_eq!(
            take(),
            [
                ev(F, pool, POOL, MemType::CudaHost),
                ev(F, device, DEVICE, MemType::Cuda),
                ev(F, pinned, PINNED, MemType::CudaHost),
                ev(F, registered, REGISTERED, MemType::CudaHost),
                ev(F, mapped, PAGE, MemType::Cuda),
                ev(F, opened, PAGE, MemType::Cuda),
            ]
        );
    }
    // SAFETY: the fake's function; the range reserved above, unmapped.
    assert_eq!(unsafe { (d.unreserve)(va, 2 * PAGE) }, 0);
    // SAFETY: the test's own mapping, no longer registered.
    unsafe { libc::munmap(own, REGISTERED) };
}

#[test]
fn a_refused_free_leaves_the_memory_in_the_map() {
    let _serial = serial();
    // The fake driver hooked in bistro mode, no handler yet.
    prepare();
    memhook::install(&memhook::Config::parse("cuda=bistro;mmap=none").unwrap());
    let _ = open(&fake().plt);
    assert!(memhook::cuda::attached().0);
    let h = libcuda();
    let d = Driver {
        alloc: f(h, c"cuMemAlloc_v2"),
        alloc_host: f(h, c"cuMemAllocHost_v2"),
        register: f(h, c"cuMemHostRegister_v2"),
        from_pool: f(h, c"cuMemAllocFromPoolAsync"),
        free: f(h, c"cuMemFree_v2"),
        free_async: f(h, c"cuMemFreeAsync"),
        free_host: f(h, c"cuMemFreeHost"),
        unregister: f(h, c"cuMemHostUnregister"),
        error_after_free: f(h, c"fake_error_after_free"),
        forget: f(h, c"fake_forget"),
        reserve: f(h, c"cuMemAddressReserve"),
        unreserve: f(h, c"cuMemAddressFree"),
        map: f(h, c"cuMemMap"),
        unmap: f(h, c"cuMemUnmap"),
        ipc_open: f(h, c"cuIpcOpenMemHandle_v2"),
        ipc_close: f(h, c"cuIpcCloseMemHandle"),
    };
    round(&d, false);
    log_events();
    round(&d, true);

    // Through the runtime: cudaFree of pinned memory, which the runtime
    // refuses as the driver does (the fake's cudaFree calls the driver's
    // cuMemFree, whose hook passes it through): reported once as freed
    // and once again, by the runtime function's hook alone.
    let cudart = open(&fake().cudart);
    memhook::refresh();
    assert_eq!(memhook::cuda::attached(), (true, true));
    let cuda_free: unsafe extern "C" fn(*mut c_void) -> i32 = f(cudart, c"cudaFree");
    let mut h: *mut c_void = std::ptr::null_mut();
    // SAFETY: as in `round`.
    assert_eq!(unsafe { (d.alloc_host)(&mut h, PINNED) }, 0);
    let _ = take();
    // SAFETY: the fake runtime's function; it refuses what the driver refuses.
    assert_ne!(unsafe { cuda_free(h) }, 0);
    let at = h as usize;
    let host = MemType::CudaHost as u32;
    assert_eq!(take(), [(F, at, PINNED, host), (A, at, PINNED, host)]);
    assert_eq!(entry(at), (MemType::CudaHost, -1, at, PINNED));
    // SAFETY: its own free.
    assert_eq!(unsafe { (d.free_host)(h) }, 0);
    assert_eq!(memtype::lookup(at, 1), Lookup::Absent);
}

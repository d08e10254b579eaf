//! The memory-type map as the CUDA hooks feed it, on the fake driver in
//! bistro mode: every hooked driver function's event (type, size, device),
//! lookups after allocation and free sequences, sub-ranges, frees of
//! unknown pointers, failed calls, classification through the driver, and
//! lookups that stay right while threads allocate and free.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod common;

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use common::*;
use memhook::event::{Event, MemTypeEvent, bits};
use memhook::memtype::{self, Lookup, MemInfo, MemType};

type Dptr = u64;

fn f<T>(h: *mut c_void, name: &CStr) -> T {
    // SAFETY: each test names the driver function of type T.
    unsafe { cast(sym(h, name)) }
}

fn found(addr: usize, len: usize) -> MemInfo {
    match memtype::lookup(addr, len) {
        Lookup::Found(i) => i,
        other => panic!("lookup({addr:#x}, {len}) = {other:?}"),
    }
}

#[test]
fn every_driver_function_reports_its_type_size_and_device() {
    let _serial = serial();
    let h = bistro_fake_driver();
    let alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32 = f(h, c"cuMemAlloc_v2");
    let free: unsafe extern "C" fn(Dptr) -> u32 = f(h, c"cuMemFree_v2");
    let managed: unsafe extern "C" fn(*mut Dptr, usize, c_uint) -> u32 = f(h, c"cuMemAllocManaged");
    let pitch: unsafe extern "C" fn(*mut Dptr, *mut usize, usize, usize, c_uint) -> u32 = f(h, c"cuMemAllocPitch_v2");
    let alloc_async: unsafe extern "C" fn(*mut Dptr, usize, *mut c_void) -> u32 = f(h, c"cuMemAllocAsync_ptsz");
    let free_async: unsafe extern "C" fn(Dptr, *mut c_void) -> u32 = f(h, c"cuMemFreeAsync_ptsz");
    let from_pool: unsafe extern "C" fn(*mut Dptr, usize, *mut c_void, *mut c_void) -> u32 =
        f(h, c"cuMemAllocFromPoolAsync");
    let map: unsafe extern "C" fn(Dptr, usize, usize, u64, u64) -> u32 = f(h, c"cuMemMap");
    let unmap: unsafe extern "C" fn(Dptr, usize) -> u32 = f(h, c"cuMemUnmap");
    let global: unsafe extern "C" fn(*mut Dptr, *mut usize, *mut c_void, *const c_char) -> u32 =
        f(h, c"cuModuleGetGlobal_v2");
    let lib_global: unsafe extern "C" fn(*mut Dptr, *mut usize, *mut c_void, *const c_char) -> u32 =
        f(h, c"cuLibraryGetGlobal");
    let alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> u32 = f(h, c"cuMemAllocHost_v2");
    let host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> u32 = f(h, c"cuMemHostAlloc");
    let free_host: unsafe extern "C" fn(*mut c_void) -> u32 = f(h, c"cuMemFreeHost");
    let register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> u32 = f(h, c"cuMemHostRegister_v2");
    let unregister: unsafe extern "C" fn(*mut c_void) -> u32 = f(h, c"cuMemHostUnregister");
    let alloc_v1: unsafe extern "C" fn(*mut u32, u32) -> u32 = f(h, c"cuMemAlloc");
    let free_v1: unsafe extern "C" fn(u32) -> u32 = f(h, c"cuMemFree");
    let alloc_host_v1: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> u32 = f(h, c"cuMemAllocHost");
    type MappedBuffer = unsafe extern "C" fn(
        *mut Dptr,
        *mut c_void,
        *const cudarc::driver::sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC,
    ) -> u32;
    let mapped_buffer: MappedBuffer = f(h, c"cuExternalMemoryGetMappedBuffer");
    let register_v1: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> u32 = f(h, c"cuMemHostRegister");
    let set_device: unsafe extern "C" fn(i32) = f(h, c"fake_set_device");
    let ev = |kind: u32, addr: usize, size: usize, t: MemType| (kind, addr, size, t as u32);
    let ipc_close: unsafe extern "C" fn(Dptr) -> u32 = f(h, c"cuIpcCloseMemHandle");
    let import: unsafe extern "C" fn(*mut Dptr, *mut c_void, *mut Handle) -> u32 = f(h, c"cuMemPoolImportPointer");
    const A: u32 = bits::MEM_TYPE_ALLOC;
    const F: u32 = bits::MEM_TYPE_FREE;
    let _ = take();

    // SAFETY: (every call below) the fake driver's functions with valid
    // arguments.
    unsafe {
        // Device memory on device 2: the event, the map, the free.
        set_device(2);
        let mut p: Dptr = 0;
        assert_eq!(alloc(&mut p, 1 << 20), 0);
        let p = p as usize;
        assert_eq!(
            device_at_delivery(p),
            Some(2),
            "a handler sees the device while the event runs"
        );
        assert_eq!(take(), [ev(A, p, 1 << 20, MemType::Cuda)]);
        let info = found(p + 4096, 4096);
        assert_eq!(
            (info.mem_type, info.device, info.base, info.len),
            (MemType::Cuda, 2, p, 1 << 20)
        );
        assert_eq!(found(p + (1 << 20) - 1, 1).mem_type, MemType::Cuda, "last byte");
        assert_eq!(
            memtype::lookup(p + (1 << 20) - 8, 16),
            Lookup::Unknown,
            "straddles the end"
        );
        assert_eq!(free(p as Dptr), 0);
        assert_eq!(take(), [ev(F, p, 1 << 20, MemType::Cuda)], "size from the map");
        assert_eq!(memtype::lookup(p, 1), Lookup::Absent);
        set_device(0);

        // Managed memory.
        let mut m: Dptr = 0;
        assert_eq!(managed(&mut m, 8192, 1), 0);
        let m = m as usize;
        assert_eq!(take(), [ev(A, m, 8192, MemType::CudaManaged)]);
        assert_eq!(found(m, 8192).mem_type, MemType::CudaManaged);

        // Pitch: the size is pitch times height.
        let (mut q, mut pitch_out): (Dptr, usize) = (0, 0);
        assert_eq!(pitch(&mut q, &mut pitch_out, 1000, 3, 4), 0);
        assert_eq!(pitch_out, 1024);
        assert_eq!(take(), [ev(A, q as usize, 3072, MemType::Cuda)]);

        // Stream-ordered, per-thread stream: classified through the driver.
        let mut s: Dptr = 0;
        assert_eq!(alloc_async(&mut s, 4096, std::ptr::null_mut()), 0);
        assert_eq!(take(), [ev(A, s as usize, 4096, MemType::Cuda)]);
        assert_eq!(free_async(s, std::ptr::null_mut()), 0);
        assert_eq!(take(), [ev(F, s as usize, 4096, MemType::Cuda)]);

        // A pool of host memory: the driver says pinned host.
        let mut hp: Dptr = 0;
        assert_eq!(
            from_pool(&mut hp, 4096, std::ptr::without_provenance_mut(1), std::ptr::null_mut()),
            0
        );
        // (A pool handle with bit 0 set is, to the fake, a pool of host memory.)
        assert_eq!(take(), [ev(A, hp as usize, 4096, MemType::CudaHost)]);
        assert_eq!(found(hp as usize, 1).device, -1, "host memory has no device");

        // Virtual memory management: map a range, unmap it.
        let va = 0x7000_0000_0000usize;
        assert_eq!(map(va as Dptr, 1 << 21, 0, 0, 0), 0);
        assert_eq!(take(), [ev(A, va, 1 << 21, MemType::Cuda)]);
        assert_eq!(unmap(va as Dptr, 1 << 21), 0);
        assert_eq!(take(), [ev(F, va, 1 << 21, MemType::Cuda)]);
        assert_eq!(memtype::lookup(va, 1), Lookup::Absent);

        // Module and library globals, with no size out-parameter; a
        // __managed__ global is classified managed.
        let mut g: Dptr = 0;
        assert_eq!(
            global(&mut g, std::ptr::null_mut(), std::ptr::null_mut(), c"x".as_ptr()),
            0
        );
        assert_eq!(take(), [ev(A, g as usize, 256, MemType::Cuda)]);
        let mut mg: Dptr = 0;
        let mut n = 0usize;
        assert_eq!(
            lib_global(&mut mg, &mut n, std::ptr::null_mut(), c"managed_y".as_ptr()),
            0
        );
        assert_eq!(n, 256);
        assert_eq!(take(), [ev(A, mg as usize, 256, MemType::CudaManaged)]);

        // Pinned host memory.
        let mut hb: *mut c_void = std::ptr::null_mut();
        assert_eq!(alloc_host(&mut hb, 10_000), 0);
        assert_eq!(take(), [ev(A, hb as usize, 10_000, MemType::CudaHost)]);
        let mut hb2: *mut c_void = std::ptr::null_mut();
        assert_eq!(host_alloc(&mut hb2, 4096, 0), 0);
        assert_eq!(take(), [ev(A, hb2 as usize, 4096, MemType::CudaHost)]);
        assert_eq!(free_host(hb), 0);
        assert_eq!(take(), [ev(F, hb as usize, 10_000, MemType::CudaHost)]);
        assert_eq!(free_host(hb2), 0);
        assert_eq!(take(), [ev(F, hb2 as usize, 4096, MemType::CudaHost)]);

        // Registered host memory.
        let mut buf = vec![0u8; 3 * 4096];
        let b = buf.as_mut_ptr() as usize;
        assert_eq!(register(b as *mut c_void, buf.len(), 0), 0);
        assert_eq!(take(), [ev(A, b, 3 * 4096, MemType::CudaHost)]);
        assert_eq!(found(b + 100, 10).mem_type, MemType::CudaHost);
        assert_eq!(unregister(b as *mut c_void), 0);
        assert_eq!(take(), [ev(F, b, 3 * 4096, MemType::CudaHost)]);
        assert_eq!(memtype::lookup(b, 1), Lookup::Absent);

        // Memory another process exported (how PyTorch shares CUDA
        // tensors): an IPC handle, 64 bytes passed by value, opens it
        // here, on the exporter's device (3), not this thread's (0), and
        // only its close ends it. Both names of the open.
        for name in [c"cuIpcOpenMemHandle_v2", c"cuIpcOpenMemHandle"] {
            let open: unsafe extern "C" fn(*mut Dptr, Handle, c_uint) -> u32 = f(h, name);
            let mut ip: Dptr = 0;
            assert_eq!(open(&mut ip, handle(1 << 21, 3), 1), 0, "{name:?}");
            let ip = ip as usize;
            assert_eq!(take(), [ev(A, ip, 1 << 21, MemType::Cuda)], "{name:?}");
            let info = found(ip + 4096, 64);
            assert_eq!(
                (info.mem_type, info.device, info.base, info.len),
                (MemType::Cuda, 3, ip, 1 << 21),
                "{name:?}: the exporter's device"
            );
            assert_eq!(ipc_close(ip as Dptr), 0);
            assert_eq!(take(), [ev(F, ip, 1 << 21, MemType::Cuda)], "{name:?}");
            assert_eq!(memtype::lookup(ip, 1), Lookup::Absent, "{name:?}");
        }
        // The driver counts the opens of one handle: a second gives the
        // same address and reports nothing new; the first close leaves
        // it mapped (and CUDA in the map), the last one ends it.
        type Open = unsafe extern "C" fn(*mut Dptr, Handle, c_uint) -> u32;
        let open: Open = f(h, c"cuIpcOpenMemHandle_v2");
        // Opens `handle` with `one`, then with `other`: one mapping.
        let open_twice = |one: Open, other: Open, handle: Handle| {
            let (mut first, mut second): (Dptr, Dptr) = (0, 0);
            assert_eq!(one(&mut first, handle, 1), 0);
            assert_eq!(other(&mut second, handle, 1), 0);
            assert_eq!(first, second, "one mapping");
            first as usize
        };
        // The last close of the mapping at `ip`: reported, and the map
        // says host there after.
        let last_close = |ip: usize| {
            assert_eq!(ipc_close(ip as Dptr), 0);
            assert_eq!(take(), [ev(F, ip, 1 << 20, MemType::Cuda)], "the last close");
            assert_eq!(memtype::lookup(ip, 1), Lookup::Absent);
        };
        let ip = open_twice(open, open, handle_of(1 << 20, 1, 0xabc));
        assert_eq!(take(), [ev(A, ip, 1 << 20, MemType::Cuda)], "reported once");
        assert_eq!(ipc_close(ip as Dptr), 0);
        assert_eq!(take(), [], "not the last close");
        assert_eq!(found(ip, 4096).mem_type, MemType::Cuda, "still mapped");
        last_close(ip);

        // Opened twice where the hooks do not count (through the
        // original: as before the hooks were installed, or beyond the
        // table's 4,096 mappings). Each close is reported as a free
        // before the call; one that leaves the mapping in place (another
        // open remains) records it again and reports it anew, so that the
        // map never says host over mapped memory.
        let raw_open: Open = cast(memhook::cuda::original("cuIpcOpenMemHandle_v2").expect("the original open"));
        let ip = open_twice(raw_open, raw_open, handle_of(1 << 20, 2, 0xdef));
        assert_eq!(take(), [], "opened unseen");
        assert_eq!(ipc_close(ip as Dptr), 0);
        assert_eq!(
            take(),
            // Of unknown type: the map never had it.
            [ev(F, ip, 1 << 20, MemType::Unknown), ev(A, ip, 1 << 20, MemType::Cuda)],
            "not the last close, which the hook could not know before the call"
        );
        let info = found(ip, 4096);
        assert_eq!(
            (info.mem_type, info.device, info.len),
            (MemType::Cuda, 2, 1 << 20),
            "still mapped"
        );
        last_close(ip);
        // Opened once unseen, then once through the hook: the hook's
        // count (one) falls short of the driver's (two). Its "last" close
        // leaves the mapping, which is recorded and reported again.
        let ip = open_twice(raw_open, open, handle_of(1 << 20, 4, 0x5407));
        assert_eq!(
            take(),
            [ev(A, ip, 1 << 20, MemType::Cuda)],
            "the first open the hook saw"
        );
        assert_eq!(ipc_close(ip as Dptr), 0);
        assert_eq!(
            take(),
            [ev(F, ip, 1 << 20, MemType::Cuda), ev(A, ip, 1 << 20, MemType::Cuda)],
            "taken for the last close, but the driver still maps it"
        );
        assert_eq!(found(ip, 4096).device, 4, "still mapped, on the exporter's device");
        last_close(ip);

        // A close the driver refuses (memory no other process exported)
        // leaves the allocation as it was.
        let mut d: Dptr = 0;
        assert_eq!(alloc(&mut d, 4096), 0);
        let _ = take();
        assert_ne!(ipc_close(d), 0);
        assert_eq!(
            take(),
            [
                ev(F, d as usize, 4096, MemType::Cuda),
                ev(A, d as usize, 4096, MemType::Cuda)
            ]
        );
        assert_eq!(found(d as usize, 1).mem_type, MemType::Cuda);
        assert_eq!(free(d), 0);
        assert_eq!(take(), [ev(F, d as usize, 4096, MemType::Cuda)]);

        // An allocation of a pool another process shares: the pool's
        // kind of memory, on the exporter's device; the ordinary free
        // ends it.
        let mut share = handle(8192, 5);
        let mut ip: Dptr = 0;
        assert_eq!(import(&mut ip, std::ptr::null_mut(), &mut share), 0);
        assert_eq!(take(), [ev(A, ip as usize, 8192, MemType::Cuda)]);
        assert_eq!(found(ip as usize, 8192).device, 5);
        assert_eq!(free_async(ip, std::ptr::null_mut()), 0);
        assert_eq!(take(), [ev(F, ip as usize, 8192, MemType::Cuda)]);
        let mut hp: Dptr = 0;
        assert_eq!(import(&mut hp, std::ptr::without_provenance_mut(1), &mut share), 0);
        assert_eq!(take(), [ev(A, hp as usize, 8192, MemType::CudaHost)]);
        // A failed open or import reports nothing.
        let mut none: Dptr = 0;
        assert_ne!(import(&mut none, std::ptr::null_mut(), std::ptr::null_mut()), 0);
        assert_eq!(take(), []);

        // A buffer of memory imported from another API: the size the
        // description asks for, on this thread's device; cuMemFree ends
        // it.
        set_device(3);
        let mut desc: cudarc::driver::sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC = std::mem::zeroed();
        desc.size = 3 << 20;
        let mut eb: Dptr = 0;
        assert_eq!(mapped_buffer(&mut eb, std::ptr::without_provenance_mut(0x5e), &desc), 0);
        let eb = eb as usize;
        assert_eq!(take(), [ev(A, eb, 3 << 20, MemType::Cuda)]);
        let info = found(eb + (2 << 20), 4096);
        assert_eq!(
            (info.mem_type, info.device, info.base, info.len),
            (MemType::Cuda, 3, eb, 3 << 20)
        );
        assert_eq!(free(eb as Dptr), 0);
        assert_eq!(take(), [ev(F, eb, 3 << 20, MemType::Cuda)]);
        set_device(0);

        // The legacy 32-bit calls.
        let mut l: u32 = 0;
        assert_eq!(alloc_v1(&mut l, 4096), 0);
        assert_eq!(take(), [ev(A, l as usize, 4096, MemType::Cuda)]);
        assert_eq!(free_v1(l), 0);
        assert_eq!(take(), [ev(F, l as usize, 4096, MemType::Cuda)]);
        // Pinned host memory under the names before `_v2`.
        let mut hv: *mut c_void = std::ptr::null_mut();
        assert_eq!(alloc_host_v1(&mut hv, 12_288), 0);
        assert_eq!(take(), [ev(A, hv as usize, 12_288, MemType::CudaHost)]);
        assert_eq!(found(hv as usize + 4096, 8).mem_type, MemType::CudaHost);
        assert_eq!(free_host(hv), 0);
        assert_eq!(take(), [ev(F, hv as usize, 12_288, MemType::CudaHost)]);
        assert_eq!(register_v1(b as *mut c_void, buf.len(), 0), 0);
        assert_eq!(take(), [ev(A, b, 3 * 4096, MemType::CudaHost)]);
        assert_eq!(found(b, 3 * 4096).mem_type, MemType::CudaHost);
        assert_eq!(unregister(b as *mut c_void), 0);
        assert_eq!(take(), [ev(F, b, 3 * 4096, MemType::CudaHost)]);
        assert_eq!(memtype::lookup(b, 1), Lookup::Absent);

        // Failed calls report nothing; a free of a pointer nobody knows
        // reports size 0 and leaves the map alone.
        let mut z: Dptr = 0;
        assert_ne!(alloc(&mut z, 0), 0);
        assert_eq!(take(), []);
        let live = memtype::len();
        assert_ne!(free(0xdead_0000), 0);
        assert_eq!(take(), [ev(F, 0xdead_0000, 0, MemType::Unknown)]);
        assert_eq!(memtype::len(), live);
        // A null pointer reports nothing.
        assert_eq!(free(0), 1);
        assert_eq!(take(), []);

        // The driver-only view: an entry the map lost is classified and
        // recorded again.
        memtype::remove(m, 8192).unwrap();
        assert_eq!(memtype::lookup(m, 8192), Lookup::Absent);
        let c = memtype::classify(m + 16, 64);
        assert!(
            matches!(c, Lookup::Found(i) if i.mem_type == MemType::CudaManaged && i.base == m && i.len == 8192),
            "{c:?}"
        );
        assert_eq!(found(m, 8192).mem_type, MemType::CudaManaged, "recorded");
        let host = 0u64;
        let c = memtype::classify(&host as *const u64 as usize, 8);
        assert!(matches!(c, Lookup::Found(i) if i.mem_type == MemType::Host), "{c:?}");
        assert_eq!(memtype::classify(m + 8000, 400), Lookup::Unknown, "spans the end");
    }
    memhook::uninstall();
}

/// The fake driver's virtual memory calls, for the tests of memory mapped
/// into reserved ranges (each asserts what the fake driver must do).
struct Vmm {
    reserve: unsafe extern "C" fn(*mut Dptr, usize, usize, Dptr, u64) -> u32,
    unreserve: unsafe extern "C" fn(Dptr, usize) -> u32,
    map: unsafe extern "C" fn(Dptr, usize, usize, u64, u64) -> u32,
    unmap: unsafe extern "C" fn(Dptr, usize) -> u32,
    set_device: unsafe extern "C" fn(i32),
}

impl Vmm {
    fn new(h: *mut c_void) -> Vmm {
        Vmm {
            reserve: f(h, c"cuMemAddressReserve"),
            unreserve: f(h, c"cuMemAddressFree"),
            map: f(h, c"cuMemMap"),
            unmap: f(h, c"cuMemUnmap"),
            set_device: f(h, c"fake_set_device"),
        }
    }

    /// A reserved range of `size` bytes: its start.
    fn reserve(&self, size: usize) -> usize {
        let mut va: Dptr = 0;
        // SAFETY: the fake's function, with a valid out-parameter.
        assert_eq!(unsafe { (self.reserve)(&mut va, size, 0, 0, 0) }, 0);
        va as usize
    }

    fn unreserve(&self, va: usize, size: usize) {
        // SAFETY: the fake's function; a range it reserved.
        assert_eq!(unsafe { (self.unreserve)(va as Dptr, size) }, 0);
    }

    /// Maps `size` bytes at `at`, of host memory where `host` (to the fake,
    /// a handle with bit 0 set), else of this thread's device.
    fn map(&self, at: usize, size: usize, host: bool) {
        // SAFETY: the fake's function; it checks nothing else.
        assert_eq!(unsafe { (self.map)(at as Dptr, size, 0, u64::from(host), 0) }, 0);
    }

    /// The driver's status for an unmap of `[at, at + size)`.
    fn unmap(&self, at: usize, size: usize) -> u32 {
        // SAFETY: the fake's function; it refuses a bad range.
        unsafe { (self.unmap)(at as Dptr, size) }
    }

    fn set_device(&self, device: i32) {
        // SAFETY: the fake's control function.
        unsafe { (self.set_device)(device) }
    }
}

/// The map's entry at `p`: type, device, base, length.
fn entry(p: usize) -> (MemType, i32, usize, usize) {
    let i = found(p, 1);
    (i.mem_type, i.device, i.base, i.len)
}

/// Memory mapped into a reserved range (`cuMemAddressReserve` +
/// `cuMemMap`, as PyTorch's expandable segments and NCCL map it): the
/// driver's range attributes give the whole reservation, its mapping
/// attributes the mapping. A classify records the mapping alone, never
/// the reservation over the other mappings in it (of another type or
/// device) and the unmapped space between them; where the driver refuses
/// the mapping attributes (older than CUDA 12), cuMemGetAddressRange's
/// range of the mapping.
#[test]
fn classify_in_a_reserved_range_records_the_mapping_alone() {
    let _serial = serial();
    let h = bistro_fake_driver();
    let vmm = Vmm::new(h);
    let set_old_driver: unsafe extern "C" fn(i32) = f(h, c"fake_set_old_driver");
    const MIB: usize = 1 << 20;
    let _ = take();

    for old in [false, true] {
        // SAFETY: the fake's control function.
        unsafe { set_old_driver(i32::from(old)) };
        vmm.set_device(1);
        let va = vmm.reserve(16 * MIB);
        // Page 0 and page 5: device memory of device 1; pages 2 and 3, one
        // mapping of host memory; pages 1, 4, 6 and 7 unmapped.
        vmm.map(va, 2 * MIB, false);
        vmm.map(va + 4 * MIB, 4 * MIB, true);
        vmm.map(va + 10 * MIB, 2 * MIB, false);
        assert_eq!(take().len(), 3, "old driver {old}");
        let host = (MemType::CudaHost, -1, va + 4 * MIB, 4 * MIB);
        assert_eq!(entry(va + 5 * MIB), host);

        // The map lost page 0 (as a full map drops a range); the driver
        // gives it back: the page, on its device.
        memtype::remove(va, 2 * MIB).unwrap();
        let c = memtype::classify(va + 16, 64);
        assert_eq!(
            c,
            Lookup::Found(MemInfo {
                mem_type: MemType::Cuda,
                device: 1,
                base: va,
                len: 2 * MIB
            }),
            "old driver {old}"
        );
        assert_eq!(entry(va), (MemType::Cuda, 1, va, 2 * MIB), "recorded");
        // Nothing else changed: the host mapping keeps its type, page 5 its
        // entry, and the unmapped pages stay out of the map.
        assert_eq!(entry(va + 4 * MIB), host, "old driver {old}");
        assert_eq!(entry(va + 11 * MIB), (MemType::Cuda, 1, va + 10 * MIB, 2 * MIB));
        for page in [1, 4, 6, 7] {
            assert_eq!(memtype::lookup(va + page * 2 * MIB, 1), Lookup::Absent, "page {page}");
        }
        // A range over two mappings is no allocation.
        assert_eq!(memtype::classify(va + 11 * MIB, 2 * MIB), Lookup::Unknown);
        // Unmapped space in the reservation is no CUDA memory, and stays
        // unrecorded.
        assert!(matches!(memtype::classify(va + 3 * MIB, 64), Lookup::Found(i) if i.mem_type == MemType::Host));
        assert_eq!(memtype::lookup(va + 3 * MIB, 1), Lookup::Absent);
        if !old {
            // The host mapping, classified where the map lost it.
            memtype::remove(va + 4 * MIB, 4 * MIB).unwrap();
            assert_eq!(
                memtype::classify(va + 7 * MIB, 4096),
                Lookup::Found(MemInfo {
                    mem_type: MemType::CudaHost,
                    device: -1,
                    base: va + 4 * MIB,
                    len: 4 * MIB
                })
            );
            assert_eq!(entry(va), (MemType::Cuda, 1, va, 2 * MIB));
            assert_eq!(entry(va + 10 * MIB), (MemType::Cuda, 1, va + 10 * MIB, 2 * MIB));
        }

        for (at, len) in [(0, 2), (4, 4), (10, 2)] {
            assert_eq!(vmm.unmap(va + at * MIB, len * MIB), 0);
        }
        assert_eq!(take().len(), 3);
        for page in 0..8 {
            assert_eq!(memtype::lookup(va + page * 2 * MIB, 1), Lookup::Absent, "page {page}");
        }
        vmm.unreserve(va, 16 * MIB);
        vmm.set_device(0);
    }
    // SAFETY: the fake's control function.
    unsafe { set_old_driver(0) };
}

/// A `cuMemUnmap` the driver refuses (its range cuts a mapping, or holds
/// unmapped space: a program error): the hook reported the range freed
/// and took it out of the map before the call; after the refusal, every
/// mapping the driver kept in the range is recorded and reported again,
/// with its own type and device, so that no mapped page reads as host
/// (past the walk's limit: Unknown).
#[test]
fn a_refused_unmap_reports_the_mappings_it_kept_again() {
    let _serial = serial();
    let vmm = Vmm::new(bistro_fake_driver());
    let ev = |kind: u32, addr: usize, size: usize, t: MemType| (kind, addr, size, t as u32);
    const A: u32 = bits::MEM_TYPE_ALLOC;
    const F: u32 = bits::MEM_TYPE_FREE;
    const MIB: usize = 1 << 20;
    let _ = take();

    vmm.set_device(2);
    let va = vmm.reserve(16 * MIB);
    // [0, 2) MiB device memory of device 2; [2, 6) one mapping of host
    // memory; [6, 10) unmapped; [10, 12) device memory of device 3.
    vmm.map(va, 2 * MIB, false);
    vmm.map(va + 2 * MIB, 4 * MIB, true);
    vmm.set_device(3);
    vmm.map(va + 10 * MIB, 2 * MIB, false);
    vmm.set_device(2);
    assert_eq!(take().len(), 3);
    let first = (MemType::Cuda, 2, va, 2 * MIB);
    let host = (MemType::CudaHost, -1, va + 2 * MIB, 4 * MIB);
    let last = (MemType::Cuda, 3, va + 10 * MIB, 2 * MIB);

    // A range that cuts the host mapping: refused; reported freed, then
    // both mappings again.
    assert_ne!(vmm.unmap(va, 4 * MIB), 0);
    assert_eq!(
        take(),
        [
            ev(F, va, 4 * MIB, MemType::Cuda),
            ev(A, va, 2 * MIB, MemType::Cuda),
            ev(A, va + 2 * MIB, 4 * MIB, MemType::CudaHost)
        ]
    );
    assert_eq!(entry(va + 100), first);
    assert_eq!(entry(va + 5 * MIB), host);
    // A range with unmapped space in it: refused; the mapping past the
    // space is found and reported again too.
    assert_ne!(vmm.unmap(va, 12 * MIB), 0);
    assert_eq!(
        take(),
        [
            ev(F, va, 12 * MIB, MemType::Cuda),
            ev(A, va, 2 * MIB, MemType::Cuda),
            ev(A, va + 2 * MIB, 4 * MIB, MemType::CudaHost),
            ev(A, va + 10 * MIB, 2 * MIB, MemType::Cuda)
        ]
    );
    assert_eq!(
        (entry(va), entry(va + 2 * MIB), entry(va + 10 * MIB)),
        (first, host, last)
    );
    assert_eq!(memtype::lookup(va + 6 * MIB, 1), Lookup::Absent);
    // Whole mappings, back to back: unmapped, reported once, gone.
    assert_eq!(vmm.unmap(va, 6 * MIB), 0);
    assert_eq!(take(), [ev(F, va, 6 * MIB, MemType::Cuda)]);
    assert_eq!(vmm.unmap(va + 10 * MIB, 2 * MIB), 0);
    assert_eq!(take(), [ev(F, va + 10 * MIB, 2 * MIB, MemType::Cuda)]);
    for page in 0..8 {
        assert_eq!(memtype::lookup(va + page * 2 * MIB, 1), Lookup::Absent, "page {page}");
    }
    vmm.unreserve(va, 16 * MIB);

    // A range whose holes take more queries than the walk makes (1,024
    // steps of 2 MiB: 2 GiB): the mapping past them is not reported
    // again, and the rest of the range reads Unknown (ask the driver),
    // never host; the driver's answer records the mapping there.
    const GIB: usize = 1 << 30;
    let va = vmm.reserve(4 * GIB);
    vmm.map(va, 2 * MIB, false);
    vmm.map(va + 3 * GIB, 2 * MIB, false);
    let _ = take();
    assert_ne!(vmm.unmap(va, 4 * GIB), 0);
    assert_eq!(
        take(),
        [ev(F, va, 4 * GIB, MemType::Cuda), ev(A, va, 2 * MIB, MemType::Cuda)]
    );
    assert_eq!(entry(va), (MemType::Cuda, 2, va, 2 * MIB));
    assert_eq!(memtype::lookup(va + 2 * GIB - 1, 1), Lookup::Absent, "walked: a hole");
    for past in [2 * GIB, 3 * GIB + 100, 4 * GIB - 1] {
        let info = found(va + past, 1);
        assert_eq!(info.mem_type, MemType::Unknown, "{past:#x} into the range");
    }
    let far = (MemType::Cuda, 2, va + 3 * GIB, 2 * MIB);
    match memtype::classify(va + 3 * GIB + 100, 64) {
        Lookup::Found(i) => assert_eq!((i.mem_type, i.device, i.base, i.len), far),
        other => panic!("classify: {other:?}"),
    }
    assert_eq!(entry(va + 3 * GIB + 4096), far, "recorded");
    assert_eq!((vmm.unmap(va, 2 * MIB), vmm.unmap(va + 3 * GIB, 2 * MIB)), (0, 0));
    memtype::remove(va, 4 * GIB).unwrap();
    vmm.unreserve(va, 4 * GIB);
    vmm.set_device(0);
}

#[test]
fn lookups_stay_right_while_threads_allocate_and_free() {
    let _serial = serial();
    let h = bistro_fake_driver();
    let alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32 = f(h, c"cuMemAlloc_v2");
    let managed: unsafe extern "C" fn(*mut Dptr, usize, c_uint) -> u32 = f(h, c"cuMemAllocManaged");
    let free: unsafe extern "C" fn(Dptr) -> u32 = f(h, c"cuMemFree_v2");
    let set_device: unsafe extern "C" fn(i32) = f(h, c"fake_set_device");
    // Writers: device memory on device 1 and managed memory on device 3.
    // Readers: any address of the fake's arena; whatever they find must be
    // one whole entry (type and device from the same allocation).
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(5));
    let (lo, hi) = {
        let mut p: Dptr = 0;
        // SAFETY: the fake's allocation, freed at once.
        unsafe {
            assert_eq!(alloc(&mut p, 4096), 0);
            assert_eq!(free(p), 0);
        }
        (p as usize, p as usize + (64 << 20))
    };
    let mut writers = Vec::new();
    for w in 0..3 {
        let start = start.clone();
        writers.push(std::thread::spawn(move || {
            start.wait();
            let (device, t) = if w == 2 {
                (3, MemType::CudaManaged)
            } else {
                (1, MemType::Cuda)
            };
            // SAFETY: the fake's functions with valid arguments.
            unsafe { set_device(device) };
            for i in 0..3000usize {
                let size = 4096 * (1 + i % 7);
                let mut p: Dptr = 0;
                // SAFETY: as above.
                let rc = unsafe {
                    if w == 2 {
                        managed(&mut p, size, 1)
                    } else {
                        alloc(&mut p, size)
                    }
                };
                assert_eq!(rc, 0);
                let info = found(p as usize + size / 2, 8);
                assert_eq!((info.mem_type, info.device), (t, device), "own live allocation");
                assert_eq!((info.base, info.len), (p as usize, size));
                // SAFETY: as above.
                assert_eq!(unsafe { free(p) }, 0);
            }
        }));
    }
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let (stop, start) = (stop.clone(), start.clone());
        readers.push(std::thread::spawn(move || {
            start.wait();
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ r;
            let mut seen = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let addr = lo + (x as usize % (hi - lo));
                if let Lookup::Found(i) = memtype::lookup(addr, 1) {
                    seen += 1;
                    let pair = (i.mem_type, i.device);
                    assert!(
                        pair == (MemType::Cuda, 1) || pair == (MemType::CudaManaged, 3),
                        "a torn entry: {i:?}"
                    );
                    assert!(i.base <= addr && addr < i.base + i.len, "{addr:#x} outside {i:?}");
                }
            }
            seen
        }));
    }
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let _ = take();
    memhook::uninstall();
}

#[test]
fn the_original_runs_the_driver_unreported_and_the_entry_still_reports() {
    let _serial = serial();
    let h = bistro_fake_driver();
    let alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32 = f(h, c"cuMemAlloc_v2");
    let free: unsafe extern "C" fn(Dptr) -> u32 = f(h, c"cuMemFree_v2");
    let at = |name: &str| memhook::cuda::original(name).unwrap_or_else(|| panic!("no original for {name}"));
    // SAFETY: the originals of these two functions have their signatures.
    let (orig_alloc, orig_free): (
        unsafe extern "C" fn(*mut Dptr, usize) -> u32,
        unsafe extern "C" fn(Dptr) -> u32,
    ) = unsafe { (cast(at("cuMemAlloc_v2")), cast(at("cuMemFree_v2"))) };
    // Bistro patched the entry: the original is its trampoline, elsewhere.
    assert_ne!(at("cuMemAlloc_v2"), sym(h, c"cuMemAlloc_v2"));
    assert_eq!(memhook::cuda::original("cuNoSuchFunction"), None);
    assert_eq!(memhook::cuda::original("mmap"), None, "CUDA functions only");
    let _ = take();
    let calls = fake_calls(h);
    let mut p: Dptr = 0;
    // SAFETY: the fake driver's allocation and free, through the originals.
    unsafe {
        assert_eq!(orig_alloc(&mut p, 8192), 0);
        assert_ne!(p, 0);
        assert_eq!(memtype::lookup(p as usize, 1), Lookup::Absent, "unreported, unrecorded");
        assert_eq!(orig_free(p), 0);
    }
    assert_eq!(fake_calls(h), calls + 2, "the driver ran both calls");
    assert!(take().is_empty(), "the originals report nothing");
    // The hooked entries still report, once each.
    // SAFETY: as above, through the patched entries.
    unsafe {
        assert_eq!(alloc(&mut p, 8192), 0);
        assert_eq!(found(p as usize, 8192).mem_type, MemType::Cuda);
        assert_eq!(free(p), 0);
    }
    assert_eq!(counts(&take()), (1, 1));
}

/// One allocation of each kind, made in the calling thread's current
/// context of the fake driver.
fn every_kind(h: *mut c_void) -> EveryKind {
    let alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32 = f(h, c"cuMemAlloc_v2");
    let managed: unsafe extern "C" fn(*mut Dptr, usize, c_uint) -> u32 = f(h, c"cuMemAllocManaged");
    let alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> u32 = f(h, c"cuMemAllocHost_v2");
    let register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> u32 = f(h, c"cuMemHostRegister_v2");
    let alloc_async: unsafe extern "C" fn(*mut Dptr, usize, *mut c_void) -> u32 = f(h, c"cuMemAllocAsync");
    let [d_size, m_size, p_size, r_size, pool_size] = EveryKind::SIZES;
    let page = EveryKind::own_mapping();
    // SAFETY: the fake driver's functions with valid arguments; the
    // registered mapping is this test's own.
    unsafe {
        let (mut d, mut m, mut pool): (Dptr, Dptr, Dptr) = (0, 0, 0);
        let mut host = std::ptr::null_mut();
        assert_eq!(alloc(&mut d, d_size), 0);
        assert_eq!(managed(&mut m, m_size, 1), 0);
        assert_eq!(alloc_host(&mut host, p_size), 0);
        assert_eq!(register(page, r_size, 0), 0);
        assert_eq!(alloc_async(&mut pool, pool_size, std::ptr::null_mut()), 0);
        EveryKind::new([d as usize, m as usize, host as usize, page as usize, pool as usize])
    }
}

/// [`EveryKind::check_ended`], then the pool's free (reported as such).
fn check_ended_and_free_the_pool(h: *mut c_void, made: &EveryKind) {
    made.check_ended();
    let free_async: unsafe extern "C" fn(Dptr, *mut c_void) -> u32 = f(h, c"cuMemFreeAsync");
    // SAFETY: the pool's allocation, freed once.
    assert_eq!(unsafe { free_async(made.pool as Dptr, std::ptr::null_mut()) }, 0);
    assert_eq!(
        take(),
        [(
            bits::MEM_TYPE_FREE,
            made.pool,
            EveryKind::SIZES[4],
            MemType::Cuda as u32
        )]
    );
}

/// Destroying a context frees every allocation made in it, with no free
/// call: the hooks of `cuCtxDestroy` and `cuDevicePrimaryCtxReset` report
/// each (type and size from the map) before the call, and the map forgets
/// them; another context's allocations and a stream-ordered pool's (which
/// belong to no context) stay. The context holds more allocations than
/// the hook copies out of the map at a time (8), so that its walk goes on
/// past a full chunk.
#[test]
fn destroying_a_context_reports_the_frees_it_makes() {
    let _serial = serial();
    let h = bistro_fake_driver();
    let alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32 = f(h, c"cuMemAlloc_v2");
    let create: unsafe extern "C" fn(*mut usize, c_uint, i32) -> u32 = f(h, c"cuCtxCreate_v2");
    let destroy: unsafe extern "C" fn(usize) -> u32 = f(h, c"cuCtxDestroy_v2");
    let reset: unsafe extern "C" fn(i32) -> u32 = f(h, c"cuDevicePrimaryCtxReset_v2");
    let set_device: unsafe extern "C" fn(i32) = f(h, c"fake_set_device");
    const F: u32 = bits::MEM_TYPE_FREE;

    // SAFETY: (every call below) the fake driver's functions with valid
    // arguments.
    unsafe {
        set_device(0);
        // In device 0's primary context.
        let mut keep: Dptr = 0;
        assert_eq!(alloc(&mut keep, 4096), 0);
        let keep = keep as usize;
        // In a context of its own on device 1.
        let mut ctx = 0usize;
        assert_eq!(create(&mut ctx, 0, 1), 0);
        let made = every_kind(h);
        assert_eq!(found(made.device, 1).device, 1);
        let mut frees = made.frees().to_vec();
        for i in 1..=20 {
            let mut d: Dptr = 0;
            assert_eq!(alloc(&mut d, 4096 * i), 0);
            frees.push((F, d as usize, 4096 * i, MemType::Cuda as u32));
        }
        let _ = take();

        assert_eq!(destroy(ctx), 0);
        same_events(take(), frees, "one free for each allocation of the destroyed context");
        assert_eq!(found(keep, 1).mem_type, MemType::Cuda, "another context's stays");

        // The reset of device 0's primary context ends its allocation
        // (and whatever other tests left in it), not the pool's.
        assert_eq!(reset(0), 0);
        let ended = take();
        assert!(ended.contains(&(F, keep, 4096, MemType::Cuda as u32)), "{ended:x?}");
        assert!(ended.iter().all(|e| e.0 == F && e.1 != made.pool), "{ended:x?}");
        for e in &ended {
            assert_eq!(memtype::lookup(e.1, 1), Lookup::Absent, "{e:x?}");
        }
        // A primary context no longer active: nothing to end.
        assert_eq!(reset(0), 0);
        assert_eq!(take(), []);
        check_ended_and_free_the_pool(h, &made);
    }
}

/// The release of a primary context's last reference destroys it, and
/// every allocation made in it, with no free call. Which release is the
/// last shows only after it: the hook reports each of the context's
/// allocations after that call (type and size from the map), and the map
/// forgets them; an earlier release ends nothing, and another device's
/// allocations and a stream-ordered pool's stay.
#[test]
fn releasing_a_primary_context_reports_the_frees_its_last_release_makes() {
    let _serial = serial();
    let h = bistro_fake_driver();
    let alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32 = f(h, c"cuMemAlloc_v2");
    let retain: unsafe extern "C" fn(*mut usize, i32) -> u32 = f(h, c"cuDevicePrimaryCtxRetain");
    let release: unsafe extern "C" fn(i32) -> u32 = f(h, c"cuDevicePrimaryCtxRelease_v2");
    let release_v1: unsafe extern "C" fn(i32) -> u32 = f(h, c"cuDevicePrimaryCtxRelease");
    let reset: unsafe extern "C" fn(i32) -> u32 = f(h, c"cuDevicePrimaryCtxReset_v2");
    let set_device: unsafe extern "C" fn(i32) = f(h, c"fake_set_device");
    const DEVICE: i32 = 3;

    // SAFETY: (every call below) the fake driver's functions with valid
    // arguments.
    unsafe {
        set_device(0);
        let mut keep: Dptr = 0;
        assert_eq!(alloc(&mut keep, 4096), 0);
        let keep = keep as usize;
        // Two references to device 3's primary context (a program's and
        // a library's), and every kind of allocation made in it. (The
        // reset first ends what other tests left there, and the fake's
        // count with it.)
        set_device(DEVICE);
        assert_eq!(reset(DEVICE), 0);
        let mut ctx = 0usize;
        assert_eq!(retain(&mut ctx, DEVICE), 0);
        assert_eq!(retain(&mut ctx, DEVICE), 0);
        let made = every_kind(h);
        assert_eq!(found(made.device, 1).device, DEVICE);
        let _ = take();

        // The first release leaves the context, and its memory, alive.
        assert_eq!(release(DEVICE), 0);
        assert_eq!(take(), [], "a release that is not the last ends nothing");
        assert_eq!(found(made.device, 1).mem_type, MemType::Cuda);
        assert_eq!(found(made.pinned, 1).mem_type, MemType::CudaHost);

        // The last (through the first version's entry) destroys it.
        assert_eq!(release_v1(DEVICE), 0);
        same_events(
            take(),
            made.frees().to_vec(),
            "one free for each allocation of the released context",
        );
        assert_eq!(found(keep, 1).mem_type, MemType::Cuda, "another device's stays");

        // A release with no reference left fails, and ends nothing.
        assert_ne!(release(DEVICE), 0);
        assert_eq!(take(), []);
        set_device(0);
        check_ended_and_free_the_pool(h, &made);
    }
}

/// A module's or library's unload frees the globals looked up in it,
/// with no free call: its hook reports each global once (however often
/// it was looked up), before the call, and the map forgets it; another
/// module's stay.
#[test]
fn unloading_a_module_reports_its_globals() {
    let _serial = serial();
    let h = bistro_fake_driver();
    type GlobalFn = unsafe extern "C" fn(*mut Dptr, *mut usize, *mut c_void, *const c_char) -> u32;
    let global: GlobalFn = f(h, c"cuModuleGetGlobal_v2");
    let lib_global: GlobalFn = f(h, c"cuLibraryGetGlobal");
    let lib_managed: GlobalFn = f(h, c"cuLibraryGetManaged");
    let module_unload: unsafe extern "C" fn(*mut c_void) -> u32 = f(h, c"cuModuleUnload");
    let library_unload: unsafe extern "C" fn(*mut c_void) -> u32 = f(h, c"cuLibraryUnload");
    let (module, library) = (0x111 as *mut c_void, 0x222 as *mut c_void);
    const A: u32 = bits::MEM_TYPE_ALLOC;
    const F: u32 = bits::MEM_TYPE_FREE;
    let _ = take();
    // SAFETY: (every call below) the fake driver's functions with valid
    // arguments (the fake takes any handle).
    unsafe {
        let (mut g, mut mg, mut lg, mut lm): (Dptr, Dptr, Dptr, Dptr) = (0, 0, 0, 0);
        let none = std::ptr::null_mut();
        assert_eq!(global(&mut g, none, module, c"x".as_ptr()), 0);
        assert_eq!(global(&mut g, none, module, c"x".as_ptr()), 0);
        assert_eq!(global(&mut mg, none, module, c"managed_y".as_ptr()), 0);
        assert_eq!(lib_global(&mut lg, none, library, c"x".as_ptr()), 0);
        let _ = take();
        // A library's __managed__ variable, as CUDA 13's runtime resolves
        // them: reported, managed in the map.
        assert_eq!(lib_managed(&mut lm, none, library, c"v".as_ptr()), 0);
        let (g, mg, lg, lm) = (g as usize, mg as usize, lg as usize, lm as usize);
        assert_eq!(take(), [(bits::MEM_TYPE_ALLOC, lm, 256, MemType::CudaManaged as u32)]);
        assert_eq!(found(mg, 1).mem_type, MemType::CudaManaged);
        assert_eq!(found(lm + 255, 1).mem_type, MemType::CudaManaged);

        // A device free of a global: refused (by driver 580 as by the
        // fake, tests/gpu/refusals.c: a global is a range of its own,
        // which only its module's unload ends). Reported freed, then
        // again; still in the map, and still the unload's to report.
        let free: unsafe extern "C" fn(Dptr) -> u32 = f(h, c"cuMemFree_v2");
        let free_async: unsafe extern "C" fn(Dptr, *mut c_void) -> u32 = f(h, c"cuMemFreeAsync");
        assert_ne!(free(g as Dptr), 0);
        assert_ne!(free_async(mg as Dptr, std::ptr::null_mut()), 0);
        let (cuda, managed) = (MemType::Cuda as u32, MemType::CudaManaged as u32);
        assert_eq!(
            take(),
            [
                (F, g, 256, cuda),
                (A, g, 256, cuda),
                (F, mg, 256, managed),
                (A, mg, 256, managed)
            ],
            "each refused free reported, then the global again"
        );
        assert_eq!(found(g, 1).mem_type, MemType::Cuda);
        assert_eq!(found(mg, 1).mem_type, MemType::CudaManaged);

        assert_eq!(module_unload(module), 0);
        same_events(
            take(),
            vec![
                (F, g, 256, MemType::Cuda as u32),
                (F, mg, 256, MemType::CudaManaged as u32),
            ],
            "each global of the module once",
        );
        assert_eq!(memtype::lookup(g, 1), Lookup::Absent);
        assert_eq!(memtype::lookup(mg, 1), Lookup::Absent);
        assert_eq!(found(lg, 1).mem_type, MemType::Cuda, "the library's stays");

        assert_eq!(library_unload(library), 0);
        same_events(
            take(),
            vec![
                (F, lg, 256, MemType::Cuda as u32),
                (F, lm, 256, MemType::CudaManaged as u32),
            ],
            "each global of the library once",
        );
        assert_eq!(memtype::lookup(lg, 1), Lookup::Absent);
        assert_eq!(memtype::lookup(lm, 1), Lookup::Absent);
        // Unloaded already: the driver refuses, and nothing is reported.
        assert_ne!(module_unload(module), 0);
        assert_eq!(take(), []);
    }
}

/// Graphics interop: a registered buffer of another API has a device
/// address while it is mapped, which `cuGraphicsResourceGetMappedPointer_v2`
/// gives out. Reported at that call (once a mapping: asked again, nothing),
/// CUDA on the thread's device in the map; the unmap (plain or `_ptsz`)
/// or the unregistration of a mapped resource reports its free before the
/// call, and the map forgets it. Without the hooks the range would be
/// absent from the map: host.
#[test]
fn graphics_interop_pointers_are_cuda_while_mapped() {
    let _serial = serial();
    let h = bistro_fake_driver();
    type Res = *mut c_void;
    let register: unsafe extern "C" fn(usize) -> Res = f(h, c"fake_graphics_register");
    let map: unsafe extern "C" fn(c_uint, *mut Res, *mut c_void) -> u32 = f(h, c"cuGraphicsMapResources");
    let pointer: unsafe extern "C" fn(*mut Dptr, *mut usize, Res) -> u32 =
        f(h, c"cuGraphicsResourceGetMappedPointer_v2");
    type Unmap = unsafe extern "C" fn(c_uint, *mut Res, *mut c_void) -> u32;
    let unmap: Unmap = f(h, c"cuGraphicsUnmapResources");
    let unmap_ptsz: Unmap = f(h, c"cuGraphicsUnmapResources_ptsz");
    let unregister: unsafe extern "C" fn(Res) -> u32 = f(h, c"cuGraphicsUnregisterResource");
    let set_device: unsafe extern "C" fn(i32) = f(h, c"fake_set_device");
    const A: u32 = bits::MEM_TYPE_ALLOC;
    const F: u32 = bits::MEM_TYPE_FREE;
    let cuda = MemType::Cuda as u32;
    let _ = take();
    // SAFETY: (every call below) the fake driver's functions with valid
    // arguments: resources the fake made, arrays of them.
    unsafe {
        set_device(1);
        let mut res = [register(1 << 20), register(3 << 16)];
        assert!(res.iter().all(|r| !r.is_null()));
        assert_eq!(map(2, res.as_mut_ptr(), std::ptr::null_mut()), 0);
        assert_eq!(take(), [], "a map gives no address yet");
        let (mut a, mut b, mut size): (Dptr, Dptr, usize) = (0, 0, 0);
        assert_eq!(pointer(&mut a, &mut size, res[0]), 0);
        let a = a as usize;
        assert_eq!(take(), [(A, a, 1 << 20, cuda)]);
        let info = found(a + 4096, 4096);
        assert_eq!(
            (info.mem_type, info.device, info.base, info.len),
            (MemType::Cuda, 1, a, 1 << 20)
        );
        // Asked again for the same mapping: no second report.
        let mut again: Dptr = 0;
        assert_eq!(pointer(&mut again, std::ptr::null_mut(), res[0]), 0);
        assert_eq!((again as usize, take()), (a, vec![]));
        assert_eq!(pointer(&mut b, &mut size, res[1]), 0);
        let b = b as usize;
        assert_eq!(take(), [(A, b, 3 << 16, cuda)]);

        // Both unmapped at once: each one's free, before the call.
        assert_eq!(unmap(2, res.as_mut_ptr(), std::ptr::null_mut()), 0);
        same_events(
            take(),
            vec![(F, a, 1 << 20, cuda), (F, b, 3 << 16, cuda)],
            "each pointer's free",
        );
        assert_eq!(memtype::lookup(a, 1), Lookup::Absent);
        assert_eq!(memtype::lookup(b, 1), Lookup::Absent);
        // Not mapped: no pointer, and an unmap the driver refuses reports
        // nothing.
        assert_ne!(pointer(&mut again, &mut size, res[0]), 0);
        assert_ne!(unmap(1, res.as_mut_ptr(), std::ptr::null_mut()), 0);
        assert_eq!(take(), []);

        // Mapped again, its size not asked for (the driver's is
        // reported), unmapped through `_ptsz`.
        assert_eq!(map(1, res.as_mut_ptr(), std::ptr::null_mut()), 0);
        let mut c: Dptr = 0;
        assert_eq!(pointer(&mut c, std::ptr::null_mut(), res[0]), 0);
        let c = c as usize;
        assert_eq!(take(), [(A, c, 1 << 20, cuda)]);
        assert_eq!(unmap_ptsz(1, res.as_mut_ptr(), std::ptr::null_mut()), 0);
        assert_eq!(take(), [(F, c, 1 << 20, cuda)]);

        // Unregistering a mapped resource ends its pointer; an unmapped
        // one's unregistration reports nothing.
        assert_eq!(map(1, res[1..].as_mut_ptr(), std::ptr::null_mut()), 0);
        let mut d: Dptr = 0;
        assert_eq!(pointer(&mut d, &mut size, res[1]), 0);
        let d = d as usize;
        assert_eq!(take(), [(A, d, 3 << 16, cuda)]);
        assert_eq!(unregister(res[1]), 0);
        assert_eq!(take(), [(F, d, 3 << 16, cuda)]);
        assert_eq!(memtype::lookup(d, 1), Lookup::Absent);
        assert_eq!(unregister(res[0]), 0);
        assert_eq!(take(), []);
        set_device(0);
    }
}

/// EGL interop: a mapped EGL image's frame (and a frame a consumer of an
/// EGL stream acquired) gives out its planes; each plane's allocation is
/// reported once, as the driver gives its range (planes of one
/// allocation: one event), and is CUDA on the device in the map while
/// mapped; a frame of arrays gives no address and reports nothing. The
/// unmap, the unregistration and the stream's release of the frame
/// report the frees before the call (the mapped pointer's query fails
/// for an image: the frame is asked). Before, such planes read as host.
#[test]
fn egl_frame_planes_are_cuda_while_mapped() {
    let _serial = serial();
    let h = bistro_fake_driver();
    type Res = *mut c_void;
    /// `CUeglFrame`: three planes, then nine 32-bit fields.
    #[repr(C)]
    #[derive(Default)]
    struct Frame {
        planes: [usize; 3],
        fields: [u32; 9],
    }
    const SEPARATE: c_int = 0;
    const SHARED: c_int = 1;
    const ARRAYS: c_int = 2;
    let register: unsafe extern "C" fn(usize, c_uint, c_int) -> Res = f(h, c"fake_egl_register");
    let stream: unsafe extern "C" fn(usize, c_uint, c_int) -> *mut c_void = f(h, c"fake_egl_stream");
    let map: unsafe extern "C" fn(c_uint, *mut Res, *mut c_void) -> u32 = f(h, c"cuGraphicsMapResources");
    let frame_of: unsafe extern "C" fn(*mut Frame, Res, c_uint, c_uint) -> u32 =
        f(h, c"cuGraphicsResourceGetMappedEglFrame");
    let pointer: unsafe extern "C" fn(*mut Dptr, *mut usize, Res) -> u32 =
        f(h, c"cuGraphicsResourceGetMappedPointer_v2");
    let unmap: unsafe extern "C" fn(c_uint, *mut Res, *mut c_void) -> u32 = f(h, c"cuGraphicsUnmapResources");
    let unregister: unsafe extern "C" fn(Res) -> u32 = f(h, c"cuGraphicsUnregisterResource");
    type Conn = *mut c_void;
    let acquire: unsafe extern "C" fn(*mut Conn, *mut Res, *mut c_void, c_uint) -> u32 =
        f(h, c"cuEGLStreamConsumerAcquireFrame");
    let release: unsafe extern "C" fn(*mut Conn, Res, *mut c_void) -> u32 = f(h, c"cuEGLStreamConsumerReleaseFrame");
    let set_device: unsafe extern "C" fn(i32) = f(h, c"fake_set_device");
    const A: u32 = bits::MEM_TYPE_ALLOC;
    const F: u32 = bits::MEM_TYPE_FREE;
    const PLANE: usize = 64 << 10;
    let cuda = MemType::Cuda as u32;
    let cuda_on_1 = |p: usize, base: usize, len: usize| {
        let info = found(p, 256);
        assert_eq!(
            (info.mem_type, info.device, info.base, info.len),
            (MemType::Cuda, 1, base, len),
            "plane at {p:#x}"
        );
    };
    let _ = take();
    // SAFETY: (every call below) the fake driver's functions with valid
    // arguments: resources and a stream the fake made, frames of ours.
    unsafe {
        set_device(1);
        let mut res = [
            register(PLANE, 2, SEPARATE),
            register(PLANE, 3, SHARED),
            register(PLANE, 2, ARRAYS),
        ];
        assert!(res.iter().all(|r| !r.is_null()));
        assert_eq!(map(3, res.as_mut_ptr(), std::ptr::null_mut()), 0);
        let (mut d, mut size): (Dptr, usize) = (0, 0);
        assert_ne!(pointer(&mut d, &mut size, res[0]), 0, "an image has no mapped pointer");
        assert_eq!(take(), [], "a map gives no address yet");

        // Two planes, each an allocation of its own.
        let mut frame = Frame::default();
        assert_eq!(frame_of(&mut frame, res[0], 0, 0), 0);
        let [p0, p1, _] = frame.planes;
        same_events(
            take(),
            vec![(A, p0, PLANE, cuda), (A, p1, PLANE, cuda)],
            "each plane's allocation",
        );
        cuda_on_1(p0 + 4096, p0, PLANE);
        cuda_on_1(p1, p1, PLANE);
        // Asked again: no second report.
        let mut again = Frame::default();
        assert_eq!(frame_of(&mut again, res[0], 0, 0), 0);
        assert_eq!((again.planes, take()), (frame.planes, vec![]));
        // One plane's entry gone (its free reported by hand): asked again,
        // that plane's allocation alone is reported.
        memhook::report_event(&mut Event::MemTypeFree(MemTypeEvent {
            address: p1,
            size: PLANE,
            mem_type: cuda,
        }))
        .unwrap();
        assert_eq!(take(), [(F, p1, PLANE, cuda)]);
        assert_eq!(frame_of(&mut again, res[0], 0, 0), 0);
        assert_eq!(take(), [(A, p1, PLANE, cuda)]);

        // Three planes of one allocation: one report, its whole range.
        let mut shared = Frame::default();
        assert_eq!(frame_of(&mut shared, res[1], 0, 0), 0);
        let base = shared.planes[0];
        assert_eq!(shared.planes[2], base + 2 * PLANE);
        assert_eq!(take(), [(A, base, 3 * PLANE, cuda)]);
        for p in shared.planes {
            cuda_on_1(p + 100, base, 3 * PLANE);
        }

        // Arrays: no address, nothing reported.
        let mut arrays = Frame::default();
        assert_eq!(frame_of(&mut arrays, res[2], 0, 0), 0);
        assert_eq!(take(), []);

        // All three unmapped at once: the frees, before the call; none for
        // the arrays.
        assert_eq!(unmap(3, res.as_mut_ptr(), std::ptr::null_mut()), 0);
        same_events(
            take(),
            vec![(F, p0, PLANE, cuda), (F, p1, PLANE, cuda), (F, base, 3 * PLANE, cuda)],
            "each allocation's free",
        );
        for p in [p0, p1, base, shared.planes[2]] {
            assert_eq!(memtype::lookup(p, 1), Lookup::Absent, "{p:#x} after the unmap");
        }
        // Not mapped: no frame, and the refused unmap reports nothing.
        assert_ne!(frame_of(&mut again, res[0], 0, 0), 0);
        assert_ne!(unmap(1, res.as_mut_ptr(), std::ptr::null_mut()), 0);
        assert_eq!(take(), []);

        // Unregistering a mapped image ends its planes.
        assert_eq!(map(1, res[1..].as_mut_ptr(), std::ptr::null_mut()), 0);
        assert_eq!(frame_of(&mut shared, res[1], 0, 0), 0);
        let base = shared.planes[0];
        assert_eq!(take(), [(A, base, 3 * PLANE, cuda)]);
        assert_eq!(unregister(res[1]), 0);
        assert_eq!(take(), [(F, base, 3 * PLANE, cuda)]);
        assert_eq!(memtype::lookup(base, 1), Lookup::Absent);
        for r in [res[0], res[2]] {
            assert_eq!(unregister(r), 0);
        }
        assert_eq!(take(), []);

        // A stream's frames: acquired, asked for, released.
        let mut conn = stream(PLANE, 2, SEPARATE);
        assert!(!conn.is_null());
        for _ in 0..2 {
            let mut r: Res = std::ptr::null_mut();
            assert_eq!(acquire(&mut conn, &mut r, std::ptr::null_mut(), 0), 0);
            assert_eq!(take(), [], "an acquire gives no address yet");
            let mut got = Frame::default();
            assert_eq!(frame_of(&mut got, r, 0, 0), 0);
            let [q0, q1, _] = got.planes;
            same_events(
                take(),
                vec![(A, q0, PLANE, cuda), (A, q1, PLANE, cuda)],
                "the stream frame's planes",
            );
            cuda_on_1(q1 + 8, q1, PLANE);
            assert_eq!(release(&mut conn, r, std::ptr::null_mut()), 0);
            same_events(
                take(),
                vec![(F, q0, PLANE, cuda), (F, q1, PLANE, cuda)],
                "the released frame's planes",
            );
            assert_eq!(memtype::lookup(q0, 1), Lookup::Absent);
            assert_eq!(memtype::lookup(q1, 1), Lookup::Absent);
        }
        set_device(0);
    }
}

/// Graph memory (seen on the H200: a stream-ordered allocation made
/// while its stream captures a graph, and an allocation node, have an
/// address the driver does not know until the graph runs, and device
/// memory there while it runs). Each is reported when made, of unknown
/// type, and recorded Unknown, not host: a lookup sends the caller to the
/// driver, whose answer once the graph runs is CUDA, and is not recorded
/// (the graph's next free or launch ends it). Its free (an ordinary free
/// after the graph ran, a captured free, a free node) is reported, and
/// the range stays Unknown: the graph may make the memory again with no
/// call memhook sees. A free node the driver refuses reports nothing;
/// other memory the driver puts in such a range replaces it.
#[test]
fn graph_memory_is_reported_and_stays_unknown_to_the_map() {
    use cudarc::driver::sys::{CUDA_MEM_ALLOC_NODE_PARAMS, CUgraphNodeParams};
    type AllocNode =
        unsafe extern "C" fn(*mut usize, usize, *const usize, usize, *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> u32;
    type FreeNode = unsafe extern "C" fn(*mut usize, usize, *const usize, usize, Dptr) -> u32;
    type AddNode =
        unsafe extern "C" fn(*mut usize, usize, *const usize, *const c_void, usize, *mut CUgraphNodeParams) -> u32;
    let _serial = serial();
    let h = bistro_fake_driver();
    let alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32 = f(h, c"cuMemAlloc_v2");
    let free: unsafe extern "C" fn(Dptr) -> u32 = f(h, c"cuMemFree_v2");
    let alloc_async: unsafe extern "C" fn(*mut Dptr, usize, *mut c_void) -> u32 = f(h, c"cuMemAllocAsync");
    let free_async: unsafe extern "C" fn(Dptr, *mut c_void) -> u32 = f(h, c"cuMemFreeAsync");
    let alloc_node: AllocNode = f(h, c"cuGraphAddMemAllocNode");
    let free_node: FreeNode = f(h, c"cuGraphAddMemFreeNode");
    let add_node: AddNode = f(h, c"cuGraphAddNode_v2");
    let map: unsafe extern "C" fn(Dptr, usize, usize, u64, u64) -> u32 = f(h, c"cuMemMap");
    let unmap: unsafe extern "C" fn(Dptr, usize) -> u32 = f(h, c"cuMemUnmap");
    let launch: unsafe extern "C" fn(Dptr) -> i32 = f(h, c"fake_graph_launch");
    let set_device: unsafe extern "C" fn(i32) = f(h, c"fake_set_device");
    // The fake takes this stream as capturing into a graph.
    let capturing: *mut c_void = std::ptr::without_provenance_mut(0xca97);
    let ev = |kind: u32, addr: usize, size: usize, t: MemType| (kind, addr, size, t as u32);
    const A: u32 = bits::MEM_TYPE_ALLOC;
    const F: u32 = bits::MEM_TYPE_FREE;
    const MIB: usize = 1 << 20;
    // The map's answer inside a recorded range of unknown type.
    let unknown = |p: usize, base: usize, len: usize| {
        let info = found(p, 4096);
        assert_eq!(
            (info.mem_type, info.base, info.len),
            (MemType::Unknown, base, len),
            "{p:#x}"
        );
    };
    let mut ranges = Vec::new();
    let _ = take();

    // SAFETY: (every call below) the fake driver's functions with valid
    // arguments.
    unsafe {
        set_device(1);
        // Captured, and freed after the graph ran.
        let mut g: Dptr = 0;
        assert_eq!(alloc_async(&mut g, 8 * MIB, capturing), 0);
        let g = g as usize;
        ranges.push((g, 8 * MIB));
        assert_eq!(take(), [ev(A, g, 8 * MIB, MemType::Unknown)]);
        unknown(g + MIB, g, 8 * MIB);
        // The driver does not know it yet.
        assert!(matches!(memtype::classify(g, 4096), Lookup::Found(i) if i.mem_type == MemType::Host));
        unknown(g, g, 8 * MIB);
        // The graph runs: the map still says Unknown (it never asks the
        // driver); the driver's answer to the caller is not recorded.
        assert_eq!(launch(g as Dptr), 0);
        unknown(g, g, 8 * MIB);
        let Lookup::Found(info) = memtype::classify(g, 4096) else {
            panic!("the driver knows it now")
        };
        assert_eq!(
            (info.mem_type, info.device, info.base, info.len),
            (MemType::Cuda, 1, g, 8 * MIB)
        );
        unknown(g, g, 8 * MIB);
        assert_eq!(free(g as Dptr), 0);
        assert_eq!(take(), [ev(F, g, 8 * MIB, MemType::Unknown)]);
        unknown(g + 4096, g, 8 * MIB);
        set_device(0);

        // Captured, and freed in the same capture.
        let mut c: Dptr = 0;
        assert_eq!(alloc_async(&mut c, MIB, capturing), 0);
        assert_eq!(free_async(c, capturing), 0);
        let c = c as usize;
        ranges.push((c, MIB));
        assert_eq!(
            take(),
            [ev(A, c, MIB, MemType::Unknown), ev(F, c, MIB, MemType::Unknown)]
        );
        unknown(c, c, MIB);

        // An allocation node, and a free node for it.
        let mut params: CUDA_MEM_ALLOC_NODE_PARAMS = std::mem::zeroed();
        params.bytesize = 2 * MIB;
        let mut node = 0usize;
        assert_eq!(alloc_node(&mut node, 1, std::ptr::null(), 0, &mut params), 0);
        let n = params.dptr as usize;
        assert_ne!(n, 0);
        ranges.push((n, 2 * MIB));
        assert_eq!(take(), [ev(A, n, 2 * MIB, MemType::Unknown)]);
        unknown(n + MIB, n, 2 * MIB);
        assert_eq!(free_node(&mut node, 1, &node, 1, n as Dptr), 0);
        assert_eq!(take(), [ev(F, n, 2 * MIB, MemType::Unknown)]);
        unknown(n, n, 2 * MIB);

        // A free node for memory that is no graph allocation: refused,
        // and the allocation stays.
        let mut d: Dptr = 0;
        assert_eq!(alloc(&mut d, 4096), 0);
        let _ = take();
        assert_ne!(free_node(&mut node, 1, std::ptr::null(), 0, d), 0);
        assert_eq!(take(), [], "a refused free node reports nothing");
        assert_eq!(found(d as usize, 4096).mem_type, MemType::Cuda);
        assert_eq!(free(d), 0);
        let _ = take();
        assert_eq!(memtype::lookup(d as usize, 1), Lookup::Absent);

        // The generic call: an allocation node, a node of another kind,
        // a free node.
        let mut p: CUgraphNodeParams = std::mem::zeroed();
        p.cast_kind(10);
        p.__bindgen_anon_1.alloc.bytesize = 4 * MIB;
        assert_eq!(add_node(&mut node, 1, std::ptr::null(), std::ptr::null(), 0, &mut p), 0);
        let a = p.__bindgen_anon_1.alloc.dptr as usize;
        ranges.push((a, 4 * MIB));
        assert_eq!(take(), [ev(A, a, 4 * MIB, MemType::Unknown)]);
        unknown(a, a, 4 * MIB);
        let mut k: CUgraphNodeParams = std::mem::zeroed(); // a kernel node
        assert_eq!(add_node(&mut node, 1, std::ptr::null(), std::ptr::null(), 0, &mut k), 0);
        assert_eq!(take(), []);
        let mut q: CUgraphNodeParams = std::mem::zeroed();
        q.cast_kind(11);
        q.__bindgen_anon_1.free.dptr = a as Dptr;
        assert_eq!(add_node(&mut node, 1, std::ptr::null(), std::ptr::null(), 0, &mut q), 0);
        assert_eq!(take(), [ev(F, a, 4 * MIB, MemType::Unknown)]);
        unknown(a, a, 4 * MIB);

        // Other memory mapped at a graph's address replaces the Unknown
        // range there, and its unmap ends it as any other.
        assert_eq!(map(a as Dptr, 2 * MIB, 0, 0, 0), 0);
        assert_eq!(take(), [ev(A, a, 2 * MIB, MemType::Cuda)]);
        assert_eq!(found(a, 4096).mem_type, MemType::Cuda);
        unknown(a + 2 * MIB, a + 2 * MIB, 2 * MIB);
        assert_eq!(unmap(a as Dptr, 2 * MIB), 0);
        assert_eq!(take(), [ev(F, a, 2 * MIB, MemType::Cuda)]);
        assert_eq!(memtype::lookup(a, 1), Lookup::Absent);
    }
    // Leave no graph range behind for the tests that follow.
    for (base, len) in ranges {
        let _ = memtype::remove(base, len);
    }
}

/// Sets a node's kind by its C value (`CU_GRAPH_NODE_TYPE_*`).
trait CastKind {
    fn cast_kind(&mut self, kind: u32);
}

impl CastKind for cudarc::driver::sys::CUgraphNodeParams {
    fn cast_kind(&mut self, kind: u32) {
        // SAFETY: the kind is the struct's first field, a C enum (4 bytes).
        unsafe { std::ptr::from_mut(self).cast::<u32>().write(kind) }
    }
}

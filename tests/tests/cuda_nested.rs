//! A shared CUDA runtime over the driver, both hooked: the fake
//! `libcudart.so.13`'s `cudaMalloc` and `cudaFree` reach the driver through
//! the pointers `cuGetProcAddress` gives (as CUDA 13's runtime does), which
//! lead to hooked driver entries. Each allocation and free is reported
//! once, as the runtime function's, the driver's nested calls passing
//! through; the driver's own callers still get their events, and the map
//! knows the memory in between.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use memhook::Config;
use memhook::event::{Event, bits};
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

/// Runs `body` (given the mode and the fake runtime's handle) with the
/// fake driver and runtime loaded and hooked, in each mode set that hooks
/// both levels of a runtime call, events counted by function. After each
/// run: every runtime function of `runtime` was reported once, by its own
/// hook or by the hook of its driver function (`driver`, the same
/// order); with bistro, always by its own (every caller of the runtime
/// reaches its hook, and the nested driver calls pass through).
fn through_the_runtime<const N: usize>(runtime: [&str; N], driver: [&str; N], mut body: impl FnMut(&str, *mut c_void)) {
    let _serial = serial();
    prepare();
    log_events();
    let counting = memhook::cuda::count_events_by_function().expect("a free handler slot");
    for mode in ["bistro", "bistro,reloc,procaddr", "reloc,procaddr"] {
        memhook::install(&Config::parse(&format!("cuda={mode};mmap=none")).unwrap());
        let _ = open(&fake().plt);
        let cudart = open(&fake().cudart);
        assert_eq!(memhook::cuda::attached(), (true, true), "mode {mode}");
        let _ = take();
        let (runtime_before, driver_before) = (runtime.map(delivered), driver.map(delivered));
        body(mode, cudart);
        // Each function's events since `before`.
        let since = |functions: [&str; N], before: [u64; N]| {
            let now = functions.map(delivered);
            core::array::from_fn::<u64, N, _>(|i| now[i] - before[i])
        };
        let (by_runtime, by_driver) = (since(runtime, runtime_before), since(driver, driver_before));
        let once: [u64; N] = core::array::from_fn(|i| by_runtime[i] + by_driver[i]);
        assert_eq!(
            once, [1; N],
            "mode {mode}: each call's event once, from the runtime's hook or the driver's: {by_runtime:?} {by_driver:?}"
        );
        if mode.contains("bistro") {
            assert_eq!(
                (by_runtime, by_driver),
                ([1; N], [0; N]),
                "mode {mode}: the runtime's events"
            );
        }
        memhook::uninstall();
    }
    memhook::unset_handler(counting).expect("registered above, outside any handler");
}

/// The runtime's opening of memory another process exported (its IPC
/// handle passed by value through the runtime's hook and the driver's)
/// reports once, as the runtime function's, on the exporter's device;
/// its close once; and an imported pool allocation once.
#[test]
fn memory_another_process_exported_is_reported_once_through_the_runtime() {
    type Open = unsafe extern "C" fn(*mut *mut c_void, Handle, u32) -> i32;
    type Close = unsafe extern "C" fn(*mut c_void) -> i32;
    type Import = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *mut Handle) -> i32;
    let mut share = handle(1 << 20, 6);
    through_the_runtime(
        [
            "cudaIpcOpenMemHandle",
            "cudaIpcCloseMemHandle",
            "cudaMemPoolImportPointer",
        ],
        ["cuIpcOpenMemHandle_v2", "cuIpcCloseMemHandle", "cuMemPoolImportPointer"],
        |mode, cudart| {
            // SAFETY: the fake runtime's functions, of these types.
            let (ipc_open, ipc_close, import) = unsafe {
                (
                    cast::<Open>(sym(cudart, c"cudaIpcOpenMemHandle")),
                    cast::<Close>(sym(cudart, c"cudaIpcCloseMemHandle")),
                    cast::<Import>(sym(cudart, c"cudaMemPoolImportPointer")),
                )
            };
            let mut p = std::ptr::null_mut();
            // SAFETY: a valid out-parameter and a handle by value.
            assert_eq!(unsafe { ipc_open(&mut p, share, 1) }, 0, "mode {mode}");
            match memtype::lookup(p as usize, 1 << 20) {
                Lookup::Found(info) => assert_eq!(
                    (info.mem_type, info.device, info.base, info.len),
                    (MemType::Cuda, 6, p as usize, 1 << 20),
                    "mode {mode}"
                ),
                other => panic!("mode {mode}: lookup of an opened IPC pointer: {other:?}"),
            }
            // SAFETY: closes what the open returned.
            assert_eq!(unsafe { ipc_close(p) }, 0, "mode {mode}");
            assert_eq!(memtype::lookup(p as usize, 1), Lookup::Absent, "mode {mode}");
            let mut q = std::ptr::null_mut();
            // SAFETY: valid out-parameter and export data.
            let imported = unsafe { import(&mut q, std::ptr::null_mut(), &mut share) };
            assert_eq!(imported, 0, "mode {mode}");
            assert!(
                matches!(memtype::lookup(q as usize, 1 << 20), Lookup::Found(i) if i.device == 6),
                "mode {mode}"
            );
            let recs = take();
            assert_eq!(counts(&recs), (2, 1), "mode {mode}: each once: {recs:?}");
        },
    );
}

/// The runtime's graph memory nodes (reaching the driver's through the
/// pointers `cuGetProcAddress` gives): the allocation node reports once,
/// of unknown type, and the map says Unknown over it; the free node
/// reports once, and the range stays Unknown.
#[test]
fn graph_memory_nodes_are_reported_once_through_the_runtime() {
    use cudarc::runtime::sys::cudaMemAllocNodeParams;
    type AllocNode = unsafe extern "C" fn(*mut usize, usize, *const usize, usize, *mut cudaMemAllocNodeParams) -> i32;
    type FreeNode = unsafe extern "C" fn(*mut usize, usize, *const usize, usize, *mut c_void) -> i32;
    through_the_runtime(
        ["cudaGraphAddMemAllocNode", "cudaGraphAddMemFreeNode"],
        ["cuGraphAddMemAllocNode", "cuGraphAddMemFreeNode"],
        |mode, cudart| {
            // SAFETY: the fake runtime's functions, of these types.
            let (alloc_node, free_node) = unsafe {
                (
                    cast::<AllocNode>(sym(cudart, c"cudaGraphAddMemAllocNode")),
                    cast::<FreeNode>(sym(cudart, c"cudaGraphAddMemFreeNode")),
                )
            };
            // SAFETY: plain data, zero for every field the call reads.
            let mut params: cudaMemAllocNodeParams = unsafe { std::mem::zeroed() };
            params.bytesize = 3 << 20;
            let mut node = 0usize;
            // SAFETY: valid out-parameters and parameters.
            let added = unsafe { alloc_node(&mut node, 1, std::ptr::null(), 0, &mut params) };
            assert_eq!(added, 0, "mode {mode}");
            let p = params.dptr as usize;
            let unknown = |when: &str| match memtype::lookup(p, 4096) {
                Lookup::Found(info) => assert_eq!(
                    (info.mem_type, info.base, info.len),
                    (MemType::Unknown, p, 3 << 20),
                    "mode {mode}, {when}"
                ),
                other => panic!("mode {mode}: lookup of a graph allocation {when}: {other:?}"),
            };
            unknown("after its node");
            // SAFETY: a valid out-parameter and the node's allocation.
            let added = unsafe { free_node(&mut node, 1, &node, 1, params.dptr) };
            assert_eq!(added, 0, "mode {mode}");
            unknown("after its free node (the graph may still make it)");
            let _ = memtype::remove(p, 3 << 20);
            assert_eq!(
                take(),
                [
                    (bits::MEM_TYPE_ALLOC, p, 3 << 20, MemType::Unknown as u32),
                    (bits::MEM_TYPE_FREE, p, 3 << 20, MemType::Unknown as u32)
                ],
                "mode {mode}"
            );
        },
    );
}

/// The runtime's mapping of a buffer of external memory (reaching the
/// driver's through the pointers `cuGetProcAddress` gives) reports once,
/// as the runtime function's, with the description's size, and the map
/// says CUDA over it.
#[test]
fn an_external_memory_buffer_is_reported_once_through_the_runtime() {
    use cudarc::runtime::sys::cudaExternalMemoryBufferDesc;
    type Map = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const cudaExternalMemoryBufferDesc) -> i32;
    through_the_runtime(
        ["cudaExternalMemoryGetMappedBuffer"],
        ["cuExternalMemoryGetMappedBuffer"],
        |mode, cudart| {
            // SAFETY: the fake runtime's function, of this type.
            let map = unsafe { cast::<Map>(sym(cudart, c"cudaExternalMemoryGetMappedBuffer")) };
            // SAFETY: plain data, zero for every field the call reads.
            let mut desc: cudaExternalMemoryBufferDesc = unsafe { std::mem::zeroed() };
            desc.size = 5 << 20;
            let mut p = std::ptr::null_mut();
            // SAFETY: a valid out-parameter and description; any handle.
            let mapped = unsafe { map(&mut p, std::ptr::without_provenance_mut(0x5e), &desc) };
            assert_eq!(mapped, 0, "mode {mode}");
            assert!(
                matches!(memtype::lookup(p as usize, 5 << 20), Lookup::Found(i) if i.mem_type == MemType::Cuda),
                "mode {mode}"
            );
            let _ = memtype::remove(p as usize, 5 << 20);
            let recs = take();
            assert_eq!(counts(&recs), (1, 0), "mode {mode}: {recs:?}");
            assert_eq!(recs[0].2, 5 << 20, "mode {mode}: the description's size");
        },
    );
}

/// Graphics interop through the runtime, whose graphics calls memhook
/// does not hook: they reach the driver's through the pointers
/// `cuGetProcAddress` gives, which bistro patches and procaddr answers.
/// The mapped pointer is reported once, as the driver function's, and is
/// CUDA in the map; the unmap and the unregistration of a mapped resource
/// each report its free once, before the call. (The runtime's own
/// functions stay unhooked on purpose: asked for a resource's pointer
/// at an unmap, the runtime would keep a failed query, for a resource
/// mapped as an array, as the program's last error.)
#[test]
fn graphics_interop_is_reported_once_through_the_runtime() {
    type Res = *mut c_void;
    type Map = unsafe extern "C" fn(i32, *mut Res, *mut c_void) -> i32;
    type Pointer = unsafe extern "C" fn(*mut *mut c_void, *mut usize, Res) -> i32;
    type Unregister = unsafe extern "C" fn(Res) -> i32;
    let _serial = serial();
    prepare();
    log_events();
    let counting = memhook::cuda::count_events_by_function().expect("a free handler slot");
    // The driver functions whose hooks report (the runtime's are none).
    let names = [
        "cuGraphicsResourceGetMappedPointer_v2",
        "cuGraphicsUnmapResources",
        "cuGraphicsUnregisterResource",
    ];
    for mode in ["bistro", "bistro,reloc,procaddr", "reloc,procaddr"] {
        memhook::install(&Config::parse(&format!("cuda={mode};mmap=none")).unwrap());
        let _ = open(&fake().plt);
        let cudart = open(&fake().cudart);
        // SAFETY: the fake driver's and runtime's functions, of these types.
        let (register, map, pointer, unmap, unregister) = unsafe {
            (
                cast::<unsafe extern "C" fn(usize) -> Res>(sym(libcuda(), c"fake_graphics_register")),
                cast::<Map>(sym(cudart, c"cudaGraphicsMapResources")),
                cast::<Pointer>(sym(cudart, c"cudaGraphicsResourceGetMappedPointer")),
                cast::<Map>(sym(cudart, c"cudaGraphicsUnmapResources")),
                cast::<Unregister>(sym(cudart, c"cudaGraphicsUnregisterResource")),
            )
        };
        let _ = take();
        let before = names.map(delivered);
        // SAFETY: (every call below) the fake's functions with valid
        // arguments: resources the fake made, arrays of them.
        unsafe {
            let mut res = [register(1 << 20)];
            assert_eq!(map(1, res.as_mut_ptr(), std::ptr::null_mut()), 0, "mode {mode}");
            let (mut p, mut size) = (std::ptr::null_mut(), 0);
            assert_eq!(pointer(&mut p, &mut size, res[0]), 0, "mode {mode}");
            let p = p as usize;
            assert!(
                matches!(memtype::lookup(p, 1 << 20), Lookup::Found(i) if i.mem_type == MemType::Cuda),
                "mode {mode}"
            );
            assert_eq!(
                take(),
                [(bits::MEM_TYPE_ALLOC, p, 1 << 20, MemType::Cuda as u32)],
                "mode {mode}"
            );
            assert_eq!(unmap(1, res.as_mut_ptr(), std::ptr::null_mut()), 0, "mode {mode}");
            assert_eq!(
                take(),
                [(bits::MEM_TYPE_FREE, p, 1 << 20, MemType::Cuda as u32)],
                "mode {mode}"
            );
            assert_eq!(memtype::lookup(p, 1), Lookup::Absent, "mode {mode}");

            // Mapped again, then unregistered while mapped.
            assert_eq!(map(1, res.as_mut_ptr(), std::ptr::null_mut()), 0, "mode {mode}");
            let mut q = std::ptr::null_mut();
            assert_eq!(pointer(&mut q, std::ptr::null_mut(), res[0]), 0, "mode {mode}");
            let q = q as usize;
            assert_eq!(
                take(),
                [(bits::MEM_TYPE_ALLOC, q, 1 << 20, MemType::Cuda as u32)],
                "mode {mode}"
            );
            assert_eq!(unregister(res[0]), 0, "mode {mode}");
            assert_eq!(
                take(),
                [(bits::MEM_TYPE_FREE, q, 1 << 20, MemType::Cuda as u32)],
                "mode {mode}"
            );
        }
        let added: Vec<u64> = names.map(delivered).iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(added, [2, 1, 1], "mode {mode}: each event once, the driver's");
        memhook::uninstall();
    }
    memhook::unset_handler(counting).expect("registered above, outside any handler");
}

/// EGL interop through the runtime, as graphics interop above: its calls
/// reach the driver's through `cuGetProcAddress`. An image's frame (two
/// planes of one allocation) is reported once, as the driver function's,
/// and ended by the unmap; a stream's frame by its release.
#[test]
fn egl_frames_are_reported_once_through_the_runtime() {
    type Res = *mut c_void;
    type Map = unsafe extern "C" fn(i32, *mut Res, *mut c_void) -> i32;
    type Frame = unsafe extern "C" fn(*mut [usize; 8], Res, c_uint, c_uint) -> i32;
    type Acquire = unsafe extern "C" fn(*mut Res, *mut Res, *mut c_void, c_uint) -> i32;
    type Release = unsafe extern "C" fn(*mut Res, Res, *mut c_void) -> i32;
    const SHARED: c_int = 1;
    const SEPARATE: c_int = 0;
    const PLANE: usize = 1 << 16;
    let _serial = serial();
    prepare();
    log_events();
    let counting = memhook::cuda::count_events_by_function().expect("a free handler slot");
    let names = [
        "cuGraphicsResourceGetMappedEglFrame",
        "cuGraphicsUnmapResources",
        "cuEGLStreamConsumerReleaseFrame",
    ];
    let cuda = MemType::Cuda as u32;
    for mode in ["bistro", "bistro,reloc,procaddr", "reloc,procaddr"] {
        memhook::install(&Config::parse(&format!("cuda={mode};mmap=none")).unwrap());
        let _ = open(&fake().plt);
        let cudart = open(&fake().cudart);
        // SAFETY: the fake driver's and runtime's functions, of these types.
        let (register, stream, map, frame_of, unmap, acquire, release) = unsafe {
            (
                cast::<unsafe extern "C" fn(usize, c_uint, c_int) -> Res>(sym(libcuda(), c"fake_egl_register")),
                cast::<unsafe extern "C" fn(usize, c_uint, c_int) -> Res>(sym(libcuda(), c"fake_egl_stream")),
                cast::<Map>(sym(cudart, c"cudaGraphicsMapResources")),
                cast::<Frame>(sym(cudart, c"cudaGraphicsResourceGetMappedEglFrame")),
                cast::<Map>(sym(cudart, c"cudaGraphicsUnmapResources")),
                cast::<Acquire>(sym(cudart, c"cudaEGLStreamConsumerAcquireFrame")),
                cast::<Release>(sym(cudart, c"cudaEGLStreamConsumerReleaseFrame")),
            )
        };
        let _ = take();
        let before = names.map(delivered);
        // SAFETY: (every call below) the fake's functions with valid
        // arguments: resources and a stream the fake made, frames of ours
        // (a `CUeglFrame` is 64 bytes, its planes first).
        unsafe {
            let mut res = [register(PLANE, 2, SHARED)];
            assert_eq!(map(1, res.as_mut_ptr(), std::ptr::null_mut()), 0, "mode {mode}");
            let mut frame = [0usize; 8];
            assert_eq!(frame_of(&mut frame, res[0], 0, 0), 0, "mode {mode}");
            let base = frame[0];
            assert_eq!(frame[1], base + PLANE, "mode {mode}");
            assert_eq!(take(), [(bits::MEM_TYPE_ALLOC, base, 2 * PLANE, cuda)], "mode {mode}");
            assert!(
                matches!(memtype::lookup(frame[1], 64), Lookup::Found(i) if i.mem_type == MemType::Cuda),
                "mode {mode}"
            );
            assert_eq!(unmap(1, res.as_mut_ptr(), std::ptr::null_mut()), 0, "mode {mode}");
            assert_eq!(take(), [(bits::MEM_TYPE_FREE, base, 2 * PLANE, cuda)], "mode {mode}");
            assert_eq!(memtype::lookup(base, 1), Lookup::Absent, "mode {mode}");

            let mut conn = stream(PLANE, 1, SEPARATE);
            let mut r: Res = std::ptr::null_mut();
            assert_eq!(acquire(&mut conn, &mut r, std::ptr::null_mut(), 0), 0, "mode {mode}");
            assert_eq!(frame_of(&mut frame, r, 0, 0), 0, "mode {mode}");
            let plane = frame[0];
            assert_eq!(take(), [(bits::MEM_TYPE_ALLOC, plane, PLANE, cuda)], "mode {mode}");
            assert_eq!(release(&mut conn, r, std::ptr::null_mut()), 0, "mode {mode}");
            assert_eq!(take(), [(bits::MEM_TYPE_FREE, plane, PLANE, cuda)], "mode {mode}");
            assert_eq!(memtype::lookup(plane, 1), Lookup::Absent, "mode {mode}");
        }
        let added: Vec<u64> = names.map(delivered).iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(added, [2, 1, 1], "mode {mode}: each event once, the driver's");
        memhook::uninstall();
    }
    memhook::unset_handler(counting).expect("registered above, outside any handler");
}

/// The size of the nesting test's outer allocation.
const OUTER: usize = 3 * 4096;
/// The hooked `cuMemAllocHost_v2` the nesting test's handler calls.
static ALLOC_HOST: AtomicUsize = AtomicUsize::new(0);
/// What the pinned allocation made inside the handler returned.
static NESTED: AtomicUsize = AtomicUsize::new(0);
/// The function the first handler was told after its own nested call, and
/// the one the handler after it was told (`None`: not called yet).
static NAMED: Mutex<[Option<Option<&'static str>>; 2]> = Mutex::new([None, None]);

type AllocHost = unsafe extern "C" fn(*mut *mut c_void, usize) -> u32;

/// For the outer allocation alone: allocates pinned memory through the
/// hooked entry (a nested delivery), then notes the function it is told.
fn allocates_inside(e: &mut Event) {
    let Event::MemTypeAlloc(m) = e else {
        return;
    };
    if m.size != OUTER || memhook::cuda::reporting_function() != Some("cuMemAlloc_v2") {
        return;
    }
    // SAFETY: the fake driver's hooked cuMemAllocHost_v2 (set before the
    // handler was registered), with a valid out-parameter.
    let alloc_host = unsafe { cast::<AllocHost>(ALLOC_HOST.load(Ordering::Relaxed)) };
    let mut p = std::ptr::null_mut();
    // SAFETY: as above.
    if unsafe { alloc_host(&mut p, 4096) } == 0 {
        NESTED.store(p as usize, Ordering::Relaxed);
    }
    NAMED.lock().unwrap_or_else(|e| e.into_inner())[0] = Some(memhook::cuda::reporting_function());
}

/// For the outer allocation: notes the function it is told.
fn notes_after(e: &mut Event) {
    if let Event::MemTypeAlloc(m) = e
        && m.size == OUTER
    {
        NAMED.lock().unwrap_or_else(|e| e.into_inner())[1] = Some(memhook::cuda::reporting_function());
    }
}

#[test]
fn a_handlers_own_cuda_call_leaves_the_outer_event_named_by_its_function() {
    let _serial = serial();
    let libcuda = bistro_fake_driver();
    // SAFETY: the fake driver's hooked entries, of these types.
    let (alloc, free, free_host) = unsafe {
        (
            cast::<DrvAlloc>(sym(libcuda, c"cuMemAlloc_v2")),
            cast::<DrvFree>(sym(libcuda, c"cuMemFree_v2")),
            cast::<Free>(sym(libcuda, c"cuMemFreeHost")),
        )
    };
    ALLOC_HOST.store(sym(libcuda, c"cuMemAllocHost_v2"), Ordering::Relaxed);
    let kinds = bits::MEM_TYPE_ALLOC;
    let first = memhook::set_handler(kinds, 0, memhook::HandlerFn::Rust(&allocates_inside)).unwrap();
    let second = memhook::set_handler(kinds, 0, memhook::HandlerFn::Rust(&notes_after)).unwrap();
    let _ = take();
    let mut d = 0u64;
    // SAFETY: a valid out-parameter.
    let rc = unsafe { alloc(&mut d, OUTER) };
    memhook::unset_handler(first).unwrap();
    memhook::unset_handler(second).unwrap();
    assert_eq!(rc, 0, "cuMemAlloc_v2");
    let pinned = NESTED.load(Ordering::Relaxed);
    assert_ne!(pinned, 0, "the handler's own allocation");
    let named = *NAMED.lock().unwrap();
    assert_eq!(
        named,
        [Some(Some("cuMemAlloc_v2")); 2],
        "after the nested delivery, the outer event is still cuMemAlloc_v2's"
    );
    assert_eq!(memhook::cuda::reporting_function(), None, "outside a delivery");
    let events = take();
    assert!(
        events.contains(&(bits::MEM_TYPE_ALLOC, pinned, 4096, MemType::CudaHost as u32)),
        "the nested allocation is reported: {events:?}"
    );
    assert!(
        events
            .iter()
            .any(|&(k, a, s, _)| k == bits::MEM_TYPE_ALLOC && a == d as usize && s == OUTER),
        "and so is the outer one: {events:?}"
    );
    // SAFETY: the two allocations made above.
    unsafe {
        assert_eq!(free_host(pinned as *mut c_void), 0);
        assert_eq!(free(d), 0);
    }
    memhook::uninstall();
}

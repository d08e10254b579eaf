//! The CUDA hook functions: one `extern "C"` function per hooked driver or
//! runtime function, with its exact signature (argument types from cudarc's
//! sys bindings).
//!
//! The return type is a plain `u32` (`CUresult` / `cudaError_t` values)
//! rather than cudarc's enums: a driver newer than the bindings may return
//! a code the enum lacks, and receiving that as a Rust enum would be
//! undefined behaviour. The two are the same in the C ABI.
//!
//! Each hook calls its original (the bistro trampoline, or the library's
//! own entry: see [`original`]); a runtime function's hook sets a
//! thread-local guard around the call, so that the hooked driver calls it
//! makes (`cudaMalloc` calling `cuMemAlloc_v2`) report nothing: one
//! allocation, one event (`tests/tests/cuda_nested.rs`). A driver
//! function's hook only reads the guard (see [`guarded`]). Allocations
//! report after a successful call; frees report before the call.
//!
//! Destroying a context frees every allocation made in it, with no free
//! call: `cuCtxDestroy` and `cuDevicePrimaryCtxReset` (which
//! `cudaDeviceReset` calls) report `MEM_TYPE_FREE` for each allocation
//! the map holds that the driver says belongs to the context, before the
//! call (see [`super::events::ending_context`]). Without it a registration
//! cache would keep the freed memory's registration, and the next
//! allocation, which the driver places at the same address (seen on the
//! H200), would be served from it. In the same way the unload of a module
//! or library (`cuModuleUnload`, `cuLibraryUnload`) frees the globals
//! reported from it: `MEM_TYPE_FREE` for each (see
//! [`super::events::unloading`]). The last release of a primary context
//! (`cuDevicePrimaryCtxRelease`) destroys it too; which release is the
//! last shows only after it, so its hook reports the frees after the
//! call (see [`super::events::releasing_primary`]).
#![allow(non_snake_case)]

use core::cell::Cell;
use core::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::sys::{
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_MEM_ALLOC_NODE_PARAMS, CUDA_MEM_ALLOC_NODE_PARAMS_v2, CUcontext, CUdevice,
    CUdeviceptr, CUdriverProcAddressQueryResult, CUexternalMemory, CUgraph, CUgraphEdgeData, CUgraphNode,
    CUgraphNodeParams, CUgraphNodeType, CUgraphicsResource, CUipcMemHandle, CUlibrary, CUmemGenericAllocationHandle,
    CUmemPoolPtrExportData, CUmemoryPool, CUmodule, CUstream, cuuint64_t,
};
use cudarc::runtime::sys::{
    cudaExternalMemory_t, cudaExternalMemoryBufferDesc, cudaGraph_t, cudaGraphNode_t, cudaIpcMemHandle_t,
    cudaMemAllocNodeParams, cudaMemPool_t, cudaMemPoolPtrExportData, cudaStream_t,
};
use memhook_core::memtype::{Lookup, MemType};

use super::driver;
use super::events::{self, allocated, ending_context, freeing, global_seen, releasing_primary, unloading};

/// A `CUresult` or `cudaError_t` value.
pub(crate) type Status = u32;
/// `CUDA_SUCCESS` / `cudaSuccess`.
pub(crate) const SUCCESS: Status = 0;
/// Returned when the function's library is gone (`CUDA_ERROR_DEINITIALIZED`,
/// `cudaErrorCudartUnloading`: both 4).
const UNAVAILABLE: Status = 4;
/// A legacy (`_v1`) 32-bit device pointer.
#[allow(non_camel_case_types)]
type CUdeviceptr_v1 = c_uint;

/// Which library defines a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lib {
    /// `libcuda.so.1`, the driver.
    Driver,
    /// `libcudart.so.*`, the runtime (when it is a shared object).
    Runtime,
}

/// What a function does, for the modes that apply to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Allocates or maps memory: `MEM_TYPE_ALLOC` (`cuGraphAddNode`'s
    /// node may instead be a free node: `MEM_TYPE_FREE`).
    Alloc,
    /// Frees or unmaps memory: `MEM_TYPE_FREE`.
    Free,
    /// Destroys a context (a primary context's release may), or unloads a
    /// module or library, and with it the allocations made in it:
    /// `MEM_TYPE_FREE` for each.
    Teardown,
    /// `cuGetProcAddress{,_v2}`: hooked by procaddr only.
    ProcAddr,
}

macro_rules! functions {
    ($($lib:ident $kind:ident $name:ident,)*) => {
        /// One hooked function.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(usize)]
        pub(crate) enum Id { $($name,)* }

        impl Id {
            /// Every function, in table order.
            pub(crate) const ALL: [Id; COUNT] = [$(Id::$name,)*];

            /// The symbol.
            pub(crate) const fn name(self) -> &'static core::ffi::CStr {
                match self {
                    $(Id::$name => match core::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("symbol names have no NUL"),
                    },)*
                }
            }

            /// The library that defines it. Inlined: a hook asks with its
            /// own `Id`, which then folds to a constant (out of line, the
            /// match over every function is a call through the GOT into a
            /// jump table, cold after a driver call).
            #[inline(always)]
            pub(crate) const fn lib(self) -> Lib {
                match self { $(Id::$name => Lib::$lib,)* }
            }

            /// What it does (inlined as [`Self::lib`]).
            #[inline(always)]
            pub(crate) const fn kind(self) -> Kind {
                match self { $(Id::$name => Kind::$kind,)* }
            }

            /// Its hook.
            pub(crate) fn hook(self) -> usize {
                match self { $(Id::$name => $name as *const () as usize,)* }
            }
        }

        /// How many functions are hooked.
        pub(crate) const COUNT: usize = [$(stringify!($name),)*].len();
    };
}

// The allocation and free pairs called most come first: their originals
// ([`ORIG`]) share one cache line, which a hook reads right after the
// driver's work has evicted it.
functions! {
    Driver Alloc cuMemAlloc_v2,
    Driver Free cuMemFree_v2,
    Driver Alloc cuMemAllocAsync,
    Driver Free cuMemFreeAsync,
    Runtime Alloc cudaMalloc,
    Runtime Free cudaFree,
    Runtime Alloc cudaMallocAsync,
    Runtime Free cudaFreeAsync,
    Driver Alloc cuMemAlloc,
    Driver Alloc cuMemAllocManaged,
    Driver Alloc cuMemAllocPitch,
    Driver Alloc cuMemAllocPitch_v2,
    Driver Alloc cuMemAllocAsync_ptsz,
    Driver Alloc cuMemAllocFromPoolAsync,
    Driver Alloc cuMemAllocFromPoolAsync_ptsz,
    Driver Alloc cuMemMap,
    Driver Alloc cuModuleGetGlobal_v2,
    Driver Alloc cuLibraryGetGlobal,
    Driver Alloc cuMemAllocHost_v2,
    Driver Alloc cuMemHostAlloc,
    Driver Alloc cuMemHostRegister_v2,
    Driver Free cuMemFree,
    Driver Free cuMemFreeAsync_ptsz,
    Driver Free cuMemFreeHost,
    Driver Free cuMemUnmap,
    Driver Free cuMemHostUnregister,
    Driver Alloc cuIpcOpenMemHandle_v2,
    Driver Alloc cuIpcOpenMemHandle,
    Driver Free cuIpcCloseMemHandle,
    Driver Alloc cuMemPoolImportPointer,
    Driver Alloc cuMemAllocHost,
    Driver Alloc cuMemHostRegister,
    Driver Alloc cuGraphAddMemAllocNode,
    Driver Free cuGraphAddMemFreeNode,
    Driver Alloc cuGraphAddNode,
    Driver Alloc cuGraphAddNode_v2,
    Driver Alloc cuLibraryGetManaged,
    Driver Alloc cuExternalMemoryGetMappedBuffer,
    Driver Alloc cuGraphicsResourceGetMappedPointer_v2,
    Driver Free cuGraphicsUnmapResources,
    Driver Free cuGraphicsUnmapResources_ptsz,
    Driver Free cuGraphicsUnregisterResource,
    Driver Alloc cuGraphicsResourceGetMappedEglFrame,
    Driver Free cuEGLStreamConsumerReleaseFrame,
    Driver Teardown cuCtxDestroy_v2,
    Driver Teardown cuCtxDestroy,
    Driver Teardown cuDevicePrimaryCtxReset_v2,
    Driver Teardown cuDevicePrimaryCtxReset,
    Driver Teardown cuDevicePrimaryCtxRelease_v2,
    Driver Teardown cuDevicePrimaryCtxRelease,
    Driver Teardown cuModuleUnload,
    Driver Teardown cuLibraryUnload,
    Driver ProcAddr cuGetProcAddress,
    Driver ProcAddr cuGetProcAddress_v2,
    Runtime Alloc cudaMallocManaged,
    Runtime Alloc cudaMallocPitch,
    Runtime Alloc cudaMallocAsync_ptsz,
    Runtime Alloc cudaMallocFromPoolAsync,
    Runtime Alloc cudaMallocFromPoolAsync_ptsz,
    Runtime Alloc cudaGetSymbolAddress,
    Runtime Alloc cudaMallocHost,
    Runtime Alloc cudaHostAlloc,
    Runtime Alloc cudaHostRegister,
    Runtime Free cudaFreeAsync_ptsz,
    Runtime Free cudaFreeHost,
    Runtime Free cudaHostUnregister,
    Runtime Alloc cudaIpcOpenMemHandle,
    Runtime Free cudaIpcCloseMemHandle,
    Runtime Alloc cudaMemPoolImportPointer,
    Runtime Alloc cudaGraphAddMemAllocNode,
    Runtime Free cudaGraphAddMemFreeNode,
    Runtime Alloc cudaExternalMemoryGetMappedBuffer,
}

/// A value that starts a cache line.
#[repr(C, align(64))]
pub(crate) struct Aligned<T>(pub(crate) T);

impl<T> core::ops::Deref for Aligned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// What each hook calls: the bistro trampoline, or the library's entry.
pub(crate) static ORIG: Aligned<[AtomicUsize; COUNT]> = Aligned([const { AtomicUsize::new(0) }; COUNT]);
/// The function's definition in its library (0 until the library is seen).
pub(crate) static ENTRY: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
/// Reloc's record of the original (used until [`ORIG`] is set).
pub(crate) static RELOC: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

/// The original of `id` as a function pointer of type `F`, if known.
#[inline(always)]
fn original<F: Copy>(id: Id) -> Option<F> {
    let p = match ORIG[id as usize].load(Ordering::Acquire) {
        0 => RELOC[id as usize].load(Ordering::Acquire),
        p => p,
    };
    // SAFETY: every value stored for `id` is the address of a function with
    // `id`'s signature (its definition, a trampoline that behaves as it, or
    // what reloc found its symbol bound to), and F is that signature.
    unsafe { super::function_at(p) }
}

thread_local! {
    /// Set while this thread runs the original of a hooked CUDA call.
    static IN_CUDA: Cell<bool> = const { Cell::new(false) };
}

/// Runtime hooks running their original now, in every thread: while
/// none is, no driver call is nested in one, and a driver function's
/// hook need not look up its thread's flag.
static RUNTIME_CALLS: Aligned<AtomicUsize> = Aligned(AtomicUsize::new(0));

/// Runs `body` with this thread's guard flag, looked up once per hook (a
/// thread-local lookup is a call into the dynamic linker in a preloaded
/// library); `None` only if the thread's locals are gone, which a `const`
/// one without a destructor never is, or where `id` is a driver
/// function and no runtime hook runs its original: the flag is set only
/// there, so it is clear. (The lookup, after the previous driver call,
/// costs cold misses in series: the linker's code, the thread's vector of
/// modules, the flag's line.)
#[inline(always)]
fn with_guard<R>(id: Id, body: impl FnOnce(Option<&Cell<bool>>) -> R) -> R {
    let flag = if id.lib() == Lib::Driver && RUNTIME_CALLS.0.load(Ordering::Relaxed) == 0 {
        core::ptr::null()
    } else {
        guard_flag()
    };
    // SAFETY: null, or this thread's `IN_CUDA`: a `const` thread-local
    // with no destructor, which lives as long as its thread, and so
    // outlives this call on it.
    body(unsafe { flag.as_ref() })
}

/// In the child of a `fork`, from `fork`'s child handler: a runtime hook
/// of a thread the child lacks was counted in [`RUNTIME_CALLS`], and would
/// stay counted; the child's count is the forking thread's own (one if it
/// forked from inside a runtime call's hook, as a handler may).
pub(crate) fn after_fork_in_child() {
    let own = IN_CUDA.try_with(Cell::get).unwrap_or(false);
    RUNTIME_CALLS.0.store(usize::from(own), Ordering::Relaxed);
}

/// This thread's [`IN_CUDA`] (null if its locals are gone). Out of line:
/// inlined, the compiler would look it up before the test that skips it
/// (a thread-local's address counts as free to compute).
#[inline(never)]
fn guard_flag() -> *const Cell<bool> {
    IN_CUDA.try_with(core::ptr::from_ref).unwrap_or(core::ptr::null())
}

/// Runs `id`'s `call` with `flag` set where the hooked calls it makes
/// must report nothing: a runtime function's (`cudaMalloc` calls
/// `cuMemAlloc_v2`). A driver function's original calls no hooked function
/// (each is checked to report once on the H200: `gpu_driver`), so its call
/// leaves the flag alone: after the driver's work (60 us for a 4 KiB
/// `cuMemAlloc_v2` + `cuMemFree_v2` on the H200) the thread-local's line
/// is cold, and a store to it would hold back the map's lock (an atomic
/// read-modify-write waits for the stores before it), and a free's hook
/// can then end in a tail call, so that the driver returns straight to
/// the caller instead of through the hook's cold code.
#[inline(always)]
fn guarded(id: Id, flag: Option<&Cell<bool>>, call: impl FnOnce() -> Status) -> Status {
    let Some(flag) = flag.filter(|_| id.lib() == Lib::Runtime) else {
        return call();
    };
    // This thread's own count is seen by its nested calls in program
    // order; another thread's only sends a driver hook to its flag.
    RUNTIME_CALLS.0.fetch_add(1, Ordering::Relaxed);
    flag.set(true);
    let status = call();
    flag.set(false);
    RUNTIME_CALLS.0.fetch_sub(1, Ordering::Relaxed);
    status
}

/// An allocating call: the original, then `MEM_TYPE_ALLOC` for the range
/// `result` reads when it succeeded.
#[inline(always)]
fn on_alloc(
    id: Id,
    mem_type: MemType,
    call: impl FnOnce() -> Status,
    result: impl FnOnce() -> (usize, usize),
) -> Status {
    on_success(id, call, || {
        let (address, size) = result();
        if address != 0 {
            allocated(id, address, size, mem_type);
        }
    })
}

/// A call whose hook reports after it succeeds (`then`), unless it runs
/// inside a hooked runtime call, whose hook reports.
#[inline(always)]
fn on_success(id: Id, call: impl FnOnce() -> Status, then: impl FnOnce()) -> Status {
    with_guard(id, |flag| {
        if flag.is_some_and(Cell::get) {
            return call(); // inside a hooked call, whose hook reports
        }
        let status = guarded(id, flag, call);
        if status == SUCCESS {
            then();
        }
        status
    })
}

/// A freeing call: `MEM_TYPE_FREE` for `address` (size when the call
/// carries it), then the original, in a tail call. A device free of
/// memory the driver may refuse it for (pinned host memory, unless a
/// host pool's; pages mapped with `cuMemMap`; memory opened from another
/// process: the map's mark says which) looks at the driver's answer and,
/// where it refused, puts the memory back (see [`events::freeing`]).
/// (Only values of at most two words go to the functions out of line: a
/// larger aggregate, passed by its address, would keep the hook from its
/// tail call.)
#[inline(always)]
fn on_free(id: Id, address: usize, size: Option<usize>, call: impl FnOnce() -> Status) -> Status {
    with_guard(id, |flag| {
        if address == 0 || flag.is_some_and(Cell::get) {
            return call();
        }
        let kept = freeing(id, address, size);
        if kept.len == 0 {
            return guarded(id, flag, call);
        }
        // Inline, with the call not in the tail: out of line, the call's
        // closure (three words for two arguments) would be passed by its
        // address, and no call of the hook could then be a tail call.
        // `check-hook-code.sh` allows this one.
        events::kept_freeing(id, address, kept);
        let status = guarded(id, flag, call);
        if status != SUCCESS {
            events::kept_refused(id, address, kept);
        }
        status
    })
}

/// A free of host memory (`cuMemFreeHost`, `cuMemHostUnregister` and the
/// runtime's): as [`on_free`], and where the driver refuses the call
/// (memory of the other kind, pinned where registered is freed or the
/// reverse: a program error the driver catches), what the map held is
/// put back and reported again (see [`events::refused`]). These calls
/// unpin memory, microseconds or more: the look after the call costs
/// nothing beside them.
#[inline(always)]
fn on_host_free(id: Id, address: usize, call: impl FnOnce() -> Status) -> Status {
    with_guard(id, |flag| {
        if address == 0 || flag.is_some_and(Cell::get) {
            return call();
        }
        let taken = events::take(address);
        events::report_taken(id, &taken);
        let status = guarded(id, flag, call);
        if status != SUCCESS {
            events::refused(id, taken);
        }
        status
    })
}

/// `cuMemUnmap`: as [`on_free`], and where the driver refuses the call
/// (a range that cuts a mapping or holds unmapped space: a program error
/// the driver catches), the mappings it kept in the range are recorded
/// and reported again (see [`events::unmap_refused`]): an early
/// free, then an allocation, never a mapped range read as host.
#[inline(always)]
fn on_unmap(id: Id, address: usize, size: usize, call: impl FnOnce() -> Status) -> Status {
    with_guard(id, |flag| {
        if address == 0 || flag.is_some_and(Cell::get) {
            return call();
        }
        freeing(id, address, Some(size));
        let status = guarded(id, flag, call);
        if status != SUCCESS {
            events::unmap_refused(id, address, size);
        }
        status
    })
}

/// A close of memory another process exported: `MEM_TYPE_FREE`, and
/// the range out of the map, only when it is the last close of the
/// mapping as the hooks count (see [`super::ipc`]); then the original.
/// ([`on_free`] but for that count, which a nested call must not touch.)
#[inline(always)]
fn on_close(id: Id, address: usize, call: impl FnOnce() -> Status) -> Status {
    with_guard(id, |flag| {
        if address == 0 || flag.is_some_and(Cell::get) {
            return call();
        }
        if super::ipc::closing(address) {
            return closing_last(id, flag, address, call);
        }
        guarded(id, flag, call)
    })
}

/// [`on_close`] of what the count takes for the last close: reported,
/// then the call; then, if the driver still maps `address` (the count
/// fell short of the driver's, or the close was refused), its
/// allocation again, recorded and reported. Out of line: a close that
/// is not the last ends in a tail call to the driver.
#[cold]
#[inline(never)]
fn closing_last(id: Id, flag: Option<&Cell<bool>>, address: usize, call: impl FnOnce() -> Status) -> Status {
    freeing(id, address, None);
    let status = guarded(id, flag, call);
    if driver::allocation_at(address).is_some() {
        allocated(id, address, 0, MemType::Unknown);
    }
    status
}

/// A graph's free node: `MEM_TYPE_FREE` for `address`, and the range out
/// of the map, once the call succeeded. (The node frees nothing until its
/// graph runs, and the driver refuses a node for memory that is no graph
/// allocation: reported before the call, a refused one would have ended
/// a live allocation.)
#[inline(never)]
fn on_free_node(id: Id, address: usize, call: impl FnOnce() -> Status) -> Status {
    with_guard(id, |flag| {
        if address == 0 || flag.is_some_and(Cell::get) {
            return call();
        }
        let status = guarded(id, flag, call);
        if status == SUCCESS {
            freeing(id, address, None);
        }
        status
    })
}

/// A node added by the generic call: an allocation node is reported as
/// `cuGraphAddMemAllocNode`'s, a free node as `cuGraphAddMemFreeNode`'s,
/// any other kind not at all.
///
/// # Safety
///
/// `params` is null or the caller's node parameters, valid for the call.
#[inline(never)]
unsafe fn on_node(id: Id, params: *mut CUgraphNodeParams, call: impl FnOnce() -> Status) -> Status {
    if params.is_null() {
        return call();
    }
    // The kind, read as the C integer it is (a kind newer than these
    // bindings would be no value of their enum).
    // SAFETY: the caller's contract; the kind is the first field.
    let kind = unsafe { params.cast::<u32>().read_unaligned() };
    // SAFETY: the caller's contract: a place inside its parameters.
    let node = unsafe { &raw mut (*params).__bindgen_anon_1 };
    if kind == CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC as u32 {
        // (`CUDA_MEM_ALLOC_NODE_PARAMS_v2` there, of the same layout.)
        // SAFETY: an allocation node's parameters, which a successful call
        // filled.
        on_alloc(id, MemType::Unknown, call, || unsafe { allocation_node(node.cast()) })
    } else if kind == CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE as u32 {
        // SAFETY: a free node's parameters: the address first.
        let address = unsafe { node.cast::<CUdeviceptr>().read_unaligned() };
        on_free_node(id, address as usize, call)
    } else {
        call()
    }
}

// One layout for an allocation node's parameters, whichever call or
// bindings name them, and the generic call's (checked against the H200's
// cuda.h: the size at 104, the address at 112; the kind at 0, the node's
// parameters at 16).
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<CUgraphNodeParams>() == 256);
    assert!(offset_of!(CUgraphNodeParams, type_) == 0);
    assert!(offset_of!(CUgraphNodeParams, __bindgen_anon_1) == 16);
    assert!(size_of::<CUDA_MEM_ALLOC_NODE_PARAMS>() == 120);
    assert!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, bytesize) == 104);
    assert!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS, dptr) == 112);
    assert!(size_of::<CUDA_MEM_ALLOC_NODE_PARAMS_v2>() == 120);
    assert!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS_v2, bytesize) == 104);
    assert!(offset_of!(CUDA_MEM_ALLOC_NODE_PARAMS_v2, dptr) == 112);
    assert!(size_of::<cudaMemAllocNodeParams>() == 120);
    assert!(offset_of!(cudaMemAllocNodeParams, bytesize) == 104);
    assert!(offset_of!(cudaMemAllocNodeParams, dptr) == 112);
};

/// The address and size of an allocation node's parameters ((0, 0) for
/// none).
///
/// # Safety
///
/// `params` is null or points to the parameters a successful call filled.
#[inline(always)]
unsafe fn allocation_node(params: *const CUDA_MEM_ALLOC_NODE_PARAMS) -> (usize, usize) {
    if params.is_null() {
        return (0, 0);
    }
    // SAFETY: the caller's contract.
    let p = unsafe { params.read_unaligned() };
    (p.dptr as usize, p.bytesize)
}

/// The size an external memory buffer's description asks for (0 for
/// none: the driver's range then).
///
/// # Safety
///
/// `desc` is null or the caller's description, valid for the call.
#[inline(always)]
unsafe fn buffer_size(desc: *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC) -> usize {
    if desc.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract.
    let size = unsafe { core::ptr::addr_of!((*desc).size).read_unaligned() };
    usize::try_from(size).unwrap_or(0)
}

// The runtime's description begins as the driver's.
const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(CUDA_EXTERNAL_MEMORY_BUFFER_DESC, size) == 8);
    assert!(offset_of!(cudaExternalMemoryBufferDesc, size) == 8);
};

/// Reads an out-parameter the original filled (0 for a null pointer).
///
/// # Safety
///
/// `p` is null or points to a `T` (the caller's out-parameter, written by
/// a successful call).
#[inline(always)]
unsafe fn out<T: Copy + Default>(p: *const T) -> T {
    if p.is_null() {
        T::default()
    } else {
        // SAFETY: the caller's contract.
        unsafe { p.read_unaligned() }
    }
}

/// A host pointer out-parameter as an address.
///
/// # Safety
///
/// As for [`out`].
#[inline(always)]
unsafe fn out_ptr(p: *const *mut c_void) -> usize {
    if p.is_null() {
        0
    } else {
        // SAFETY: the caller's contract.
        unsafe { p.read_unaligned() as usize }
    }
}

/// Defines a hook: `alloc TYPE => (address, size)` or `free => (address,
/// size or None)`, both expressions over the arguments (and, for alloc,
/// the out-parameters the successful original filled); `unmap =>
/// (address, size)`, `cuMemUnmap` (see [`on_unmap`]); `host_free =>
/// address`, a free of host memory (see [`on_host_free`]); `free_node =>
/// address`, a graph's free node, reported once the call succeeded; `node
/// => parameters`, a node of any kind (see [`on_node`]).
macro_rules! hook {
    ($name:ident($($a:ident: $t:ty),*) alloc $mt:ident => $result:expr) => {
        #[allow(unused_unsafe)]
        pub(crate) unsafe extern "C" fn $name($($a: $t),*) -> Status {
            type F = unsafe extern "C" fn($($t),*) -> Status;
            let Some(f) = original::<F>(Id::$name) else { return UNAVAILABLE };
            on_alloc(
                Id::$name,
                MemType::$mt,
                // SAFETY: the caller's arguments, to the function they called.
                || unsafe { f($($a),*) },
                // SAFETY: the out-parameters a successful call filled.
                || unsafe { $result },
            )
        }
    };
    // An open of memory another process exported: an allocation of the
    // driver's type and size, reported at the first open of the mapping
    // only (see `super::ipc`; `on_alloc` asks for the address only when
    // it reports, never inside a nested call).
    ($name:ident($($a:ident: $t:ty),*) open => $addr:expr) => {
        #[allow(unused_unsafe)]
        pub(crate) unsafe extern "C" fn $name($($a: $t),*) -> Status {
            type F = unsafe extern "C" fn($($t),*) -> Status;
            let Some(f) = original::<F>(Id::$name) else { return UNAVAILABLE };
            on_alloc(
                Id::$name,
                MemType::Unknown,
                // SAFETY: the caller's arguments, to the function they called.
                || unsafe { f($($a),*) },
                || {
                    // SAFETY: the out-parameter a successful call filled.
                    let address = unsafe { $addr };
                    let first = address != 0 && super::ipc::opened(address);
                    (if first { address } else { 0 }, 0)
                },
            )
        }
    };
    ($name:ident($($a:ident: $t:ty),*) free_node => $addr:expr) => {
        pub(crate) unsafe extern "C" fn $name($($a: $t),*) -> Status {
            type F = unsafe extern "C" fn($($t),*) -> Status;
            let Some(f) = original::<F>(Id::$name) else { return UNAVAILABLE };
            // SAFETY: the caller's arguments, to the function they called.
            on_free_node(Id::$name, $addr, || unsafe { f($($a),*) })
        }
    };
    ($name:ident($($a:ident: $t:ty),*) node => $params:expr) => {
        pub(crate) unsafe extern "C" fn $name($($a: $t),*) -> Status {
            type F = unsafe extern "C" fn($($t),*) -> Status;
            let Some(f) = original::<F>(Id::$name) else { return UNAVAILABLE };
            // SAFETY: the caller's arguments, to the function they called.
            let call = || unsafe { f($($a),*) };
            // SAFETY: the caller's parameters, null or valid for the call.
            unsafe { on_node(Id::$name, $params, call) }
        }
    };
    ($name:ident($($a:ident: $t:ty),*) close => $addr:expr) => {
        pub(crate) unsafe extern "C" fn $name($($a: $t),*) -> Status {
            type F = unsafe extern "C" fn($($t),*) -> Status;
            let Some(f) = original::<F>(Id::$name) else { return UNAVAILABLE };
            // SAFETY: the caller's arguments, to the function they called.
            // (Moved in: a closure that held the arguments' addresses
            // would keep them on the stack, and the hook from its tail
            // call.)
            on_close(Id::$name, $addr, move || unsafe { f($($a),*) })
        }
    };
    // The end of graphics resources' mapped pointers: `count` resources
    // at `resources` (see [`on_graphics_end`]).
    ($name:ident($($a:ident: $t:ty),*) graphics_end => ($count:expr, $resources:expr)) => {
        pub(crate) unsafe extern "C" fn $name($($a: $t),*) -> Status {
            type F = unsafe extern "C" fn($($t),*) -> Status;
            let Some(f) = original::<F>(Id::$name) else { return UNAVAILABLE };
            // SAFETY: the caller's arguments: `count` resources at
            // `resources`, as the call itself reads them.
            unsafe { on_graphics_end(Id::$name, $count, $resources) };
            // SAFETY: the caller's arguments, to the function they called.
            unsafe { f($($a),*) }
        }
    };
    ($name:ident($($a:ident: $t:ty),*) unmap => ($addr:expr, $size:expr)) => {
        pub(crate) unsafe extern "C" fn $name($($a: $t),*) -> Status {
            type F = unsafe extern "C" fn($($t),*) -> Status;
            let Some(f) = original::<F>(Id::$name) else { return UNAVAILABLE };
            // SAFETY: the caller's arguments, to the function they called.
            on_unmap(Id::$name, $addr, $size, || unsafe { f($($a),*) })
        }
    };
    ($name:ident($($a:ident: $t:ty),*) host_free => $addr:expr) => {
        pub(crate) unsafe extern "C" fn $name($($a: $t),*) -> Status {
            type F = unsafe extern "C" fn($($t),*) -> Status;
            let Some(f) = original::<F>(Id::$name) else { return UNAVAILABLE };
            // SAFETY: the caller's arguments, to the function they called.
            on_host_free(Id::$name, $addr, || unsafe { f($($a),*) })
        }
    };
    ($name:ident($($a:ident: $t:ty),*) free => ($addr:expr, $size:expr)) => {
        pub(crate) unsafe extern "C" fn $name($($a: $t),*) -> Status {
            type F = unsafe extern "C" fn($($t),*) -> Status;
            let Some(f) = original::<F>(Id::$name) else { return UNAVAILABLE };
            // SAFETY: the caller's arguments, to the function they called.
            // (Moved in, as for `close`.)
            on_free(Id::$name, $addr, $size, move || unsafe { f($($a),*) })
        }
    };
}

// The driver.
hook!(cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) alloc Cuda => (out(dptr) as usize, bytesize as usize));
hook!(cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) alloc Cuda => (out(dptr) as usize, bytesize));
hook!(cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint)
    alloc CudaManaged => (out(dptr) as usize, bytesize));
hook!(cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint)
    alloc Cuda => (out(dptr) as usize, out(pitch) as usize * height as usize));
hook!(cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint)
    alloc Cuda => (out(dptr) as usize, out(pitch).saturating_mul(height)));
// Stream-ordered allocations come from a pool that may hold device or
// host memory: the type is asked of the driver.
hook!(cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream)
    alloc Unknown => (out(dptr) as usize, bytesize));
hook!(cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream)
    alloc Unknown => (out(dptr) as usize, bytesize));
hook!(cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream)
    alloc Unknown => (out(dptr) as usize, bytesize));
hook!(cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream)
    alloc Unknown => (out(dptr) as usize, bytesize));
// Physical memory from cuMemCreate may be on a device or on the host.
hook!(cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong)
    alloc Unknown => (ptr as usize, size));
hook!(cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) alloc CudaHost => (out_ptr(pp), bytesize));
hook!(cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) alloc CudaHost => (out_ptr(pp), bytesize));
hook!(cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) alloc CudaHost => (p as usize, bytesize));
// The names before `_v2` (a 32-bit size; the flags of before CUDA 6.5):
// separate definitions in driver 580, which `dlsym` and a
// `cuGetProcAddress` of an older version answer with.
hook!(cuMemAllocHost(pp: *mut *mut c_void, bytesize: c_uint) alloc CudaHost => (out_ptr(pp), bytesize as usize));
hook!(cuMemHostRegister(p: *mut c_void, bytesize: usize, flags: c_uint) alloc CudaHost => (p as usize, bytesize));
hook!(cuMemFree(dptr: CUdeviceptr_v1) free => (dptr as usize, None));
hook!(cuMemFree_v2(dptr: CUdeviceptr) free => (dptr as usize, None));
hook!(cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) free => (dptr as usize, None));
hook!(cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) free => (dptr as usize, None));
hook!(cuMemFreeHost(p: *mut c_void) host_free => p as usize);
hook!(cuMemUnmap(ptr: CUdeviceptr, size: usize) unmap => (ptr as usize, size));
hook!(cuMemHostUnregister(p: *mut c_void) host_free => p as usize);
// Memory another process exported, mapped into this one: an IPC handle
// (passed by value, 64 bytes) opens the exporter's whole allocation, and a
// pool's export data one allocation of a shared pool. Type, device and
// size are the driver's: the memory lies on the exporter's device, which
// need not be this thread's. (PyTorch shares CUDA tensors between
// processes this way; without these, such memory would be absent from
// the map, which reads as host.) An imported pool allocation is freed
// by `cuMemFree*` / `cuMemFreeAsync*`.
// The driver counts the opens of one handle (a second returns the same
// address) and unmaps at the last close: reported once each (`ipc`).
hook!(cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint)
    open => out(pdptr) as usize);
hook!(cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint)
    open => out(pdptr) as usize);
hook!(cuIpcCloseMemHandle(dptr: CUdeviceptr) close => dptr as usize);
hook!(cuMemPoolImportPointer(ptr_out: *mut CUdeviceptr, pool: CUmemoryPool, share_data: *mut CUmemPoolPtrExportData)
    alloc Unknown => (out(ptr_out) as usize, 0));
// A buffer of memory imported from another API or process
// (`cuImportExternalMemory`: a Vulkan or Direct3D allocation, an opaque
// file descriptor), mapped here; ended by `cuMemFree`. Size from the
// description, type and device from the driver.
hook!(cuExternalMemoryGetMappedBuffer(dptr: *mut CUdeviceptr, ext: CUexternalMemory,
    desc: *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC) alloc Unknown => (out(dptr) as usize, buffer_size(desc)));

// Graphics interop: a buffer of another API (OpenGL, Direct3D),
// registered with CUDA, has a device address while it is mapped
// (`cuGraphicsMapResources`), which this call gives out; without it such
// memory is absent from the map, which reads as host. Reported once a
// mapping (a second call for the same mapping finds its range in the
// map), type and device from the driver; ended by the unmap, or by the
// resource's unregistration, which unmaps it. (The runtime's graphics
// calls reach these through `cuGetProcAddress` and are not hooked
// themselves: the unmap's query of a resource's pointer, asked of the
// runtime, would leave its failure for a resource mapped as an array as
// the program's last error; the driver keeps no such state.)
hook!(cuGraphicsResourceGetMappedPointer_v2(pdptr: *mut CUdeviceptr, psize: *mut usize, resource: CUgraphicsResource)
    alloc Unknown => graphics_pointer(out(pdptr) as usize, out(psize)));
hook!(cuGraphicsUnmapResources(count: c_uint, resources: *mut CUgraphicsResource, stream: CUstream)
    graphics_end => (count as usize, resources));
hook!(cuGraphicsUnmapResources_ptsz(count: c_uint, resources: *mut CUgraphicsResource, stream: CUstream)
    graphics_end => (count as usize, resources));
hook!(cuGraphicsUnregisterResource(resource: CUgraphicsResource) graphics_end => (1, &raw const resource));

// EGL interop: an EGL image registered with CUDA
// (`cuGraphicsEGLRegisterImage`) and mapped, or a frame that a consumer
// of an EGL stream acquired (`cuEGLStreamConsumerAcquireFrame`), gives
// out its planes in a frame (`cuGraphicsResourceGetMappedEglFrame`):
// device pointers when the frame is pitch-linear (arrays otherwise, with
// no address). Each plane's allocation, as the driver gives its range, is
// reported once (planes of one allocation, or the same frame asked for
// again, find it in the map); ended by the unmap or unregistration (as
// above: the mapped pointer's query fails for an image, and the frame's
// is asked), or by the consumer's release of the frame
// (`cuEGLStreamConsumerReleaseFrame`). The runtime's calls reach these
// through `cuGetProcAddress`, as for the other graphics calls.
hook!(cuEGLStreamConsumerReleaseFrame(conn: *mut c_void, resource: CUgraphicsResource, stream: *mut CUstream)
    graphics_end => (1, &raw const resource));

/// `CU_EGL_FRAME_TYPE_PITCH` (`cudaEGL.h`): a frame whose planes are
/// device pointers.
const EGL_FRAME_PITCH: u32 = 1;

/// `CUeglFrame` (`cudaEGL.h`, outside cudarc's bindings): the planes
/// (`MAX_PLANES`, 3: device pointers of a pitch-linear frame, arrays
/// otherwise), then nine 32-bit fields; 64 bytes.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct EglFrame {
    planes: [usize; 3],
    width: u32,
    height: u32,
    depth: u32,
    pitch: u32,
    plane_count: u32,
    channels: u32,
    frame_type: u32,
    color_format: u32,
    array_format: u32,
}

const _: () = assert!(size_of::<EglFrame>() == 64);

impl EglFrame {
    /// The device pointers of its planes: none for a frame of arrays.
    fn pitch_planes(&self) -> impl Iterator<Item = usize> + '_ {
        let count = if self.frame_type == EGL_FRAME_PITCH {
            (self.plane_count as usize).min(self.planes.len())
        } else {
            0
        };
        self.planes[..count].iter().copied().filter(|&p| p != 0)
    }

    /// The allocations behind its planes, as the driver gives their
    /// ranges (`base`, `len`), each once, with no plane repeated.
    fn allocations(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let mut seen = [0usize; 3];
        self.pitch_planes().enumerate().filter_map(move |(i, plane)| {
            let info = driver::classify(plane).filter(|m| m.len != 0 && (m.base..m.base + m.len).contains(&plane))?;
            let first = !seen[..i].contains(&info.base);
            seen[i] = info.base;
            first.then_some((info.base, info.len))
        })
    }
}

type EglFrameFn = unsafe extern "C" fn(*mut EglFrame, CUgraphicsResource, c_uint, c_uint) -> Status;

/// The frame of a mapped EGL resource: `MEM_TYPE_ALLOC` of each plane's
/// allocation that the map does not hold yet (type and device from the
/// driver).
pub(crate) unsafe extern "C" fn cuGraphicsResourceGetMappedEglFrame(
    frame: *mut EglFrame,
    resource: CUgraphicsResource,
    index: c_uint,
    mip: c_uint,
) -> Status {
    const ID: Id = Id::cuGraphicsResourceGetMappedEglFrame;
    let Some(f) = original::<EglFrameFn>(ID) else {
        return UNAVAILABLE;
    };
    on_success(
        ID,
        // SAFETY: the caller's arguments, to the function they called.
        || unsafe { f(frame, resource, index, mip) },
        // SAFETY: the out-parameter the successful call filled.
        || egl_frame_given(ID, &unsafe { out(frame) }),
    )
}

/// Reports the allocations behind a frame's planes that the map holds
/// nothing at.
#[cold]
#[inline(never)]
fn egl_frame_given(id: Id, frame: &EglFrame) {
    if frame
        .pitch_planes()
        .all(|p| matches!(crate::memtype::lookup(p, 1), Lookup::Found(_)))
    {
        return; // the same frame asked for again
    }
    for (base, len) in frame.allocations() {
        if !matches!(crate::memtype::lookup(base, 1), Lookup::Found(_)) {
            allocated(id, base, len, MemType::Unknown);
        }
    }
}

/// The range a mapped resource's pointer call gave, to report: none
/// (address 0) when the map holds exactly that range already, the same
/// mapping asked for again. (Size 0: the caller did not ask for it; the
/// map's entry at the address then is the mapping, else the driver's
/// size is reported.)
fn graphics_pointer(address: usize, size: usize) -> (usize, usize) {
    match crate::memtype::lookup(address, 1) {
        Lookup::Found(info) if info.base == address && (size == 0 || info.len == size) => (0, 0),
        _ => (address, size),
    }
}

type GraphicsPointerFn = unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, CUgraphicsResource) -> Status;

/// Before an unmap or an unregistration of graphics resources, or the
/// release of an EGL stream's frame: `MEM_TYPE_FREE` of each one's mapped
/// pointer, which the driver gives while the resource is still mapped
/// (one driver call a resource: the driver, not memhook, keeps which
/// resource has which range), or, for an EGL image or frame (whose
/// pointer the driver refuses), of its planes' allocations (a second
/// call, and one a plane for their ranges). A resource not mapped, or
/// mapped as an array, has none. Unconditional, like a
/// free of an address the map lost: a range reported but dropped by a
/// full map still gets its free.
///
/// # Safety
///
/// `resources` is null or points to `count` resource handles, which the
/// caller passes to the call it made.
#[cold]
#[inline(never)]
unsafe fn on_graphics_end(id: Id, count: usize, resources: *const CUgraphicsResource) {
    if resources.is_null() {
        return;
    }
    let Some(pointer) = original::<GraphicsPointerFn>(Id::cuGraphicsResourceGetMappedPointer_v2) else {
        return;
    };
    with_guard(id, |flag| {
        if flag.is_some_and(Cell::get) {
            return; // inside a hooked call, whose hook reports
        }
        let egl_frame = original::<EglFrameFn>(Id::cuGraphicsResourceGetMappedEglFrame);
        for i in 0..count {
            // SAFETY: the caller's contract: `count` handles.
            let resource = unsafe { resources.add(i).read_unaligned() };
            let (mut address, mut size): (CUdeviceptr, usize) = (0, 0);
            // SAFETY: the original of the driver's call, with two
            // out-parameters of ours and the caller's handle.
            if unsafe { pointer(&mut address, &mut size, resource) } == SUCCESS {
                if address != 0 && size != 0 {
                    freeing(id, address as usize, Some(size));
                }
                continue;
            }
            // Not a buffer: an EGL image's or stream's frame, pitch-linear
            // or of arrays; or a texture's array, which has neither.
            let mut frame = EglFrame::default();
            if let Some(get) = egl_frame
                // SAFETY: the original of the driver's call, with a frame
                // of ours and the caller's handle (the first frame: the
                // only one of a pitch-linear image).
                && unsafe { get(&mut frame, resource, 0, 0) } == SUCCESS
            {
                for (base, len) in frame.allocations() {
                    freeing(id, base, Some(len));
                }
            }
        }
    });
}

// Graph memory. An allocation node, and a stream-ordered allocation made
// while its stream captures a graph (the hooks above), reserve the
// address when they are made; the memory comes each time the graph runs,
// and the driver knows nothing at the address before (on the H200,
// "not CUDA's"): recorded Unknown, never host (`events::classified`), so
// that a lookup sends the caller to the driver, whose answer while the
// graph's memory lives is CUDA. A free node ends the range when it is
// made, as a captured `cuMemFreeAsync` does when captured.
hook!(cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize,
    params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) alloc Unknown => allocation_node(params));
hook!(cuGraphAddMemFreeNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize,
    dptr: CUdeviceptr) free_node => dptr as usize);
hook!(cuGraphAddNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, n: usize,
    params: *mut CUgraphNodeParams) node => params);
hook!(cuGraphAddNode_v2(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode,
    edges: *const CUgraphEdgeData, n: usize, params: *mut CUgraphNodeParams) node => params);

/// Defines a hook of context teardown: `$context` (an expression over the
/// argument) names the context the call destroys, if any.
macro_rules! teardown_hook {
    ($name:ident($a:ident: $t:ty) => $context:expr) => {
        pub(crate) unsafe extern "C" fn $name($a: $t) -> Status {
            type F = unsafe extern "C" fn($t) -> Status;
            let Some(f) = original::<F>(Id::$name) else {
                return UNAVAILABLE;
            };
            if let Some(context) = $context {
                ending_context(Id::$name, context);
            }
            // SAFETY: the caller's argument, to the function it called.
            unsafe { f($a) }
        }
    };
}

teardown_hook!(cuCtxDestroy_v2(ctx: CUcontext) => Some(ctx as usize).filter(|&c| c != 0));
teardown_hook!(cuCtxDestroy(ctx: CUcontext) => Some(ctx as usize).filter(|&c| c != 0));
teardown_hook!(cuDevicePrimaryCtxReset_v2(dev: CUdevice) => driver::primary_context(dev));
teardown_hook!(cuDevicePrimaryCtxReset(dev: CUdevice) => driver::primary_context(dev));

/// Defines a hook of the release of a primary context's reference, the
/// last of which destroys the context (see
/// [`super::events::releasing_primary`]).
macro_rules! release_hook {
    ($name:ident) => {
        pub(crate) unsafe extern "C" fn $name(dev: CUdevice) -> Status {
            type F = unsafe extern "C" fn(CUdevice) -> Status;
            let Some(f) = original::<F>(Id::$name) else {
                return UNAVAILABLE;
            };
            // SAFETY: the caller's argument, to the function it called.
            releasing_primary(Id::$name, dev, || unsafe { f(dev) })
        }
    };
}

release_hook!(cuDevicePrimaryCtxRelease_v2);
release_hook!(cuDevicePrimaryCtxRelease);

/// Defines a hook of a module's or library's unload, which frees its
/// globals.
macro_rules! unload_hook {
    ($name:ident($handle:ident: $t:ty)) => {
        pub(crate) unsafe extern "C" fn $name($handle: $t) -> Status {
            type F = unsafe extern "C" fn($t) -> Status;
            let Some(f) = original::<F>(Id::$name) else {
                return UNAVAILABLE;
            };
            // SAFETY: the caller's argument, to the function it called.
            unloading(Id::$name, $handle as usize, || unsafe { f($handle) })
        }
    };
}

unload_hook!(cuModuleUnload(module: CUmodule));
unload_hook!(cuLibraryUnload(library: CUlibrary));

/// A module or library global: `bytes` may be null, and the size is
/// wanted, so the hook passes its own out-parameter then.
macro_rules! global_hook {
    ($name:ident, $handle:ty) => {
        pub(crate) unsafe extern "C" fn $name(
            dptr: *mut CUdeviceptr,
            bytes: *mut usize,
            handle: $handle,
            name: *const c_char,
        ) -> Status {
            type F = unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, $handle, *const c_char) -> Status;
            let Some(f) = original::<F>(Id::$name) else {
                return UNAVAILABLE;
            };
            let mut size = 0usize;
            let bytes_out = if bytes.is_null() { &raw mut size } else { bytes };
            // A `__managed__` global is managed memory: the driver says.
            let status = on_alloc(
                Id::$name,
                MemType::Unknown,
                // SAFETY: the caller's arguments (a valid out-parameter for
                // the size in place of a null one).
                || unsafe { f(dptr, bytes_out, handle, name) },
                // SAFETY: out-parameters the successful call filled.
                || unsafe { (out(dptr) as usize, out(bytes_out)) },
            );
            if status == SUCCESS {
                // Whoever reported it (this hook, or the runtime call this
                // one ran inside), the unload of `handle` ends it.
                // SAFETY: out-parameters the successful call filled.
                global_seen(handle as usize, unsafe { out(dptr) } as usize, unsafe {
                    out(bytes_out)
                });
            }
            status
        }
    };
}

global_hook!(cuModuleGetGlobal_v2, CUmodule);
global_hook!(cuLibraryGetGlobal, CUlibrary);
// A library's `__managed__` variable: CUDA 13's runtime resolves them
// with this, not `cuLibraryGetGlobal`, when it loads the program's code
// (seen on the H200, run 112: `&var` read host in the map, managed to
// the driver).
global_hook!(cuLibraryGetManaged, CUlibrary);

// The runtime.
type CudaStream = cudaStream_t;
hook!(cudaMalloc(p: *mut *mut c_void, size: usize) alloc Cuda => (out_ptr(p), size));
hook!(cudaMallocManaged(p: *mut *mut c_void, size: usize, flags: c_uint) alloc CudaManaged => (out_ptr(p), size));
hook!(cudaMallocPitch(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize)
    alloc Cuda => (out_ptr(p), out(pitch).saturating_mul(height)));
hook!(cudaMallocAsync(p: *mut *mut c_void, size: usize, stream: CudaStream) alloc Unknown => (out_ptr(p), size));
hook!(cudaMallocAsync_ptsz(p: *mut *mut c_void, size: usize, stream: CudaStream) alloc Unknown => (out_ptr(p), size));
hook!(cudaMallocFromPoolAsync(p: *mut *mut c_void, size: usize, pool: cudaMemPool_t, stream: CudaStream)
    alloc Unknown => (out_ptr(p), size));
hook!(cudaMallocFromPoolAsync_ptsz(p: *mut *mut c_void, size: usize, pool: cudaMemPool_t, stream: CudaStream)
    alloc Unknown => (out_ptr(p), size));
// The size of a symbol is the driver's range at the address.
hook!(cudaGetSymbolAddress(p: *mut *mut c_void, symbol: *const c_void) alloc Unknown => (out_ptr(p), 0));
hook!(cudaMallocHost(p: *mut *mut c_void, size: usize) alloc CudaHost => (out_ptr(p), size));
hook!(cudaHostAlloc(p: *mut *mut c_void, size: usize, flags: c_uint) alloc CudaHost => (out_ptr(p), size));
hook!(cudaHostRegister(p: *mut c_void, size: usize, flags: c_uint) alloc CudaHost => (p as usize, size));
hook!(cudaFree(p: *mut c_void) free => (p as usize, None));
hook!(cudaFreeAsync(p: *mut c_void, stream: CudaStream) free => (p as usize, None));
hook!(cudaFreeAsync_ptsz(p: *mut c_void, stream: CudaStream) free => (p as usize, None));
hook!(cudaFreeHost(p: *mut c_void) host_free => p as usize);
hook!(cudaHostUnregister(p: *mut c_void) host_free => p as usize);
hook!(cudaIpcOpenMemHandle(p: *mut *mut c_void, handle: cudaIpcMemHandle_t, flags: c_uint) open => out_ptr(p));
hook!(cudaIpcCloseMemHandle(p: *mut c_void) close => p as usize);
hook!(cudaMemPoolImportPointer(p: *mut *mut c_void, pool: cudaMemPool_t, export_data: *mut cudaMemPoolPtrExportData)
    alloc Unknown => (out_ptr(p), 0));
// (The runtime's generic `cudaGraphAddNode` is not hooked: its arguments
// differ between runtimes 12 and 13. It reaches the driver's, which is.)
hook!(cudaGraphAddMemAllocNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, deps: *const cudaGraphNode_t,
    n: usize, params: *mut cudaMemAllocNodeParams) alloc Unknown => allocation_node(params.cast()));
hook!(cudaExternalMemoryGetMappedBuffer(p: *mut *mut c_void, ext: cudaExternalMemory_t,
    desc: *const cudaExternalMemoryBufferDesc) alloc Unknown => (out_ptr(p), buffer_size(desc.cast())));
hook!(cudaGraphAddMemFreeNode(node: *mut cudaGraphNode_t, graph: cudaGraph_t, deps: *const cudaGraphNode_t,
    n: usize, dptr: *mut c_void) free_node => dptr as usize);

/// `cuGetProcAddress` (CUDA 11.3's, without the status out-parameter).
pub(crate) unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: cuuint64_t,
) -> Status {
    type F = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, cuuint64_t) -> Status;
    let Some(f) = original::<F>(Id::cuGetProcAddress) else {
        return UNAVAILABLE;
    };
    // SAFETY: the caller's arguments.
    let status = unsafe { f(symbol, pfn, version, flags) };
    if status == SUCCESS {
        // SAFETY: a successful call filled `*pfn`.
        unsafe { super::procaddr::answer(pfn) };
    }
    status
}

/// `cuGetProcAddress_v2` (CUDA 12+, what `cuGetProcAddress` means in
/// today's headers).
pub(crate) unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: cuuint64_t,
    symbol_status: *mut CUdriverProcAddressQueryResult,
) -> Status {
    type F = unsafe extern "C" fn(
        *const c_char,
        *mut *mut c_void,
        c_int,
        cuuint64_t,
        *mut CUdriverProcAddressQueryResult,
    ) -> Status;
    let Some(f) = original::<F>(Id::cuGetProcAddress_v2) else {
        return UNAVAILABLE;
    };
    // SAFETY: the caller's arguments.
    let status = unsafe { f(symbol, pfn, version, flags, symbol_status) };
    if status == SUCCESS {
        // SAFETY: a successful call filled `*pfn`.
        unsafe { super::procaddr::answer(pfn) };
    }
    status
}

//! The few driver calls memhook makes itself: the device of the calling
//! thread's context, the range of an allocation, classification of a
//! pointer (`cuPointerGetAttributes`), the context an allocation belongs
//! to and a device's primary context (for the hooks of context teardown);
//! and the PCI bus id of a device, through NVML (nvml-wrapper).
//!
//! The driver functions are resolved once, off every hook path: from the
//! libcuda object memhook hooks, when it appears, or else through cudarc's
//! dynamic loader (which finds libcuda the way a CUDA program does) the
//! first time a caller asks to classify. A machine without libcuda answers
//! "unknown" and runs everything else.

use core::ffi::{CStr, c_int, c_uint, c_void};
use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use cudarc::driver::sys::{CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUpointer_attribute};
use memhook_core::memtype::{MemInfo, MemType};

use super::hooks::{SUCCESS, Status};

type GetAttributesFn = unsafe extern "C" fn(c_uint, *mut CUpointer_attribute, *mut *mut c_void, CUdeviceptr) -> Status;
type AddressRangeFn = unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> Status;
type CtxGetDeviceFn = unsafe extern "C" fn(*mut CUdevice) -> Status;
type DeviceGetAttributeFn = unsafe extern "C" fn(*mut c_int, CUdevice_attribute, CUdevice) -> Status;
type DeviceGetCountFn = unsafe extern "C" fn(*mut c_int) -> Status;
type PrimaryCtxGetStateFn = unsafe extern "C" fn(CUdevice, *mut c_uint, *mut c_int) -> Status;
type PrimaryCtxRetainFn = unsafe extern "C" fn(*mut CUcontext, CUdevice) -> Status;
type PrimaryCtxReleaseFn = unsafe extern "C" fn(CUdevice) -> Status;

static GET_ATTRIBUTES: AtomicUsize = AtomicUsize::new(0);
static ADDRESS_RANGE: AtomicUsize = AtomicUsize::new(0);
static CTX_GET_DEVICE: AtomicUsize = AtomicUsize::new(0);
static DEVICE_GET_ATTRIBUTE: AtomicUsize = AtomicUsize::new(0);
static DEVICE_GET_COUNT: AtomicUsize = AtomicUsize::new(0);
static PRIMARY_GET_STATE: AtomicUsize = AtomicUsize::new(0);
static PRIMARY_RETAIN: AtomicUsize = AtomicUsize::new(0);
static PRIMARY_RELEASE: AtomicUsize = AtomicUsize::new(0);

/// The devices the driver shows this process (fixed from `cuInit` on:
/// `CUDA_VISIBLE_DEVICES` is read once); 0 until asked successfully.
static DEVICES: AtomicI32 = AtomicI32::new(0);

/// The driver functions memhook calls itself: each name, and its slot. A
/// `static`, not a `const`: Rust 1.88 (`rust-version`) refuses a constant
/// that refers to a static's atomic.
static FUNCTIONS: [(&CStr, &AtomicUsize); 8] = [
    (c"cuPointerGetAttributes", &GET_ATTRIBUTES),
    (c"cuMemGetAddressRange_v2", &ADDRESS_RANGE),
    (c"cuCtxGetDevice", &CTX_GET_DEVICE),
    (c"cuDeviceGetAttribute", &DEVICE_GET_ATTRIBUTE),
    (c"cuDeviceGetCount", &DEVICE_GET_COUNT),
    (c"cuDevicePrimaryCtxGetState", &PRIMARY_GET_STATE),
    (c"cuDevicePrimaryCtxRetain", &PRIMARY_RETAIN),
    (c"cuDevicePrimaryCtxRelease_v2", &PRIMARY_RELEASE),
];

/// Resolves the driver functions from `handle` (a libcuda handle) with
/// `lookup` (the real `dlsym`).
pub(super) fn resolve(mut lookup: impl FnMut(&CStr) -> usize) {
    for (name, slot) in FUNCTIONS {
        let p = lookup(name);
        if p != 0 {
            slot.store(p, Ordering::Release);
        }
    }
}

/// Forgets the driver functions (libcuda was unloaded).
pub(super) fn forget() {
    for (_, slot) in FUNCTIONS {
        slot.store(0, Ordering::Release);
    }
    DEVICES.store(0, Ordering::Release);
}

/// Resolves the driver functions through cudarc's loader when no hooked
/// libcuda gave them. Allocates (it loads a library): never on a hook path.
pub(crate) fn load() -> bool {
    if GET_ATTRIBUTES.load(Ordering::Acquire) != 0 {
        return true;
    }
    // SAFETY: cudarc's loader only dlopens the candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return false;
    }
    // SAFETY: as above; present, so culib() does not panic.
    let lib = unsafe { cudarc::driver::sys::culib() };
    resolve(|name| {
        // SAFETY: the symbol is looked up, not called, here; a `usize`
        // receives its address.
        unsafe { lib.get::<*const c_void>(name.to_bytes_with_nul()) }.map_or(0, |s| *s as usize)
    });
    GET_ATTRIBUTES.load(Ordering::Acquire) != 0
}

/// `f` as its function type, when resolved.
fn function<F: Copy>(slot: &AtomicUsize) -> Option<F> {
    // SAFETY: each slot holds the driver function of the matching type.
    unsafe { super::function_at(slot.load(Ordering::Acquire)) }
}

/// The device of the calling thread's current context, or -1. Called
/// after an allocation succeeded (so `cuInit` ran and a context is
/// current). Where the process sees one device, that is device 0, and the
/// driver is not asked again: after its tens of microseconds of work, a
/// driver query runs from cold caches and costs far more than warm.
#[inline(always)]
pub(crate) fn current_device() -> i32 {
    match DEVICES.load(Ordering::Acquire) {
        1 => 0,
        0 => count_devices(),
        _ => context_device(),
    }
}

/// [`current_device`] before the device count is known: asks it (once per
/// driver load, where it succeeds).
#[cold]
#[inline(never)]
fn count_devices() -> i32 {
    if let Some(count) = function::<DeviceGetCountFn>(&DEVICE_GET_COUNT) {
        let mut n: c_int = 0;
        // SAFETY: a valid out-parameter.
        if unsafe { count(&mut n) } == SUCCESS && n > 0 {
            DEVICES.store(n, Ordering::Release);
            if n == 1 {
                return 0;
            }
        }
    }
    context_device()
}

/// The device of the calling thread's current context, asked of the
/// driver (-1 where it refuses).
fn context_device() -> i32 {
    let Some(f) = function::<CtxGetDeviceFn>(&CTX_GET_DEVICE) else {
        return -1;
    };
    let mut device: CUdevice = -1;
    // SAFETY: a valid out-parameter.
    if unsafe { f(&mut device) } == SUCCESS {
        device
    } else {
        -1
    }
}

/// The allocation `addr` lies in, as the driver sees it: (base, size).
pub(crate) fn range(addr: usize) -> Option<(usize, usize)> {
    // Pinned host memory: the range attributes know it.
    address_range(addr).or_else(|| classify(addr).filter(|i| i.len != 0).map(|i| (i.base, i.len)))
}

/// `cuMemGetAddressRange`'s answer for `addr`, where it holds `addr`:
/// the allocation, or for memory mapped into a reserved range
/// (`cuMemMap`) the mapping. (For host memory mapped so, driver 580 on
/// the H200 answers base 0: not taken.)
fn address_range(addr: usize) -> Option<(usize, usize)> {
    let f = function::<AddressRangeFn>(&ADDRESS_RANGE)?;
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-parameters; the driver checks the pointer.
    if unsafe { f(&mut base, &mut size, addr as CUdeviceptr) } != SUCCESS {
        return None;
    }
    let base = base as usize;
    (base <= addr && addr - base < size).then_some((base, size))
}

/// The part of the driver's range `[start, start + size)` that the
/// mapping `[map_base, map_base + map_size)` also covers. The range
/// attributes give an allocation, or, for memory mapped into a reserved
/// range with `cuMemMap`, the whole reservation; the mapping attributes
/// give the mapping, which for an allocation may hold others beside it
/// (a 4 KiB `cuMemAlloc` lies in a 2 MiB mapping on the H200). What
/// both cover is the allocation, or the mapping: never memory of another
/// mapping, which may be of another type or device, or none at all. No
/// mapping known (size 0), or none that meets the range: the range.
fn mapped_part(start: usize, size: usize, map_base: usize, map_size: usize) -> (usize, usize) {
    let lo = start.max(map_base);
    let hi = start.saturating_add(size).min(map_base.saturating_add(map_size));
    if map_size == 0 || hi <= lo {
        (start, size)
    } else {
        (lo, hi - lo)
    }
}

/// The size of the allocation that starts at `addr`, as the driver sees
/// it (`None`: none starts there).
pub(crate) fn allocation_at(addr: usize) -> Option<usize> {
    range(addr).filter(|&(base, _)| base == addr).map(|(_, n)| n)
}

/// What the driver says `addr` is: type, device, and the allocation's
/// range (for memory mapped into a reserved range, the mapping's: see
/// [`mapped_part`]). `None` when the driver is not loaded or refuses.
pub(crate) fn classify(addr: usize) -> Option<MemInfo> {
    let answer = match attributes(addr, WITH_MAPPING) {
        Some(answer) => answer,
        None => {
            // A driver older than the mapping attributes (CUDA 12) refuses
            // them: the range alone. (A second call there, where a range
            // is asked for: the public classify, an IPC open, a free of
            // memory the map does not know; allocations whose call gives
            // the size ask `kind`.) What that driver calls the allocation,
            // for memory mapped into a reserved range the mapping, stands
            // for the mapping (see `address_range`).
            let mut answer = attributes(addr, WITH_RANGE)?;
            (answer.map_base, answer.map_size) = address_range(addr).map_or((0, 0), |(b, n)| (b as CUdeviceptr, n));
            answer
        }
    };
    let (mem_type, device) = answer.decoded();
    let (base, len) = if mem_type == MemType::Host {
        (addr, 0)
    } else {
        mapped_part(
            answer.start as usize,
            answer.size,
            answer.map_base as usize,
            answer.map_size,
        )
    };
    Some(MemInfo {
        mem_type,
        device,
        base,
        len,
    })
}

/// The type and device of the memory at `addr`, without its range: what
/// an allocation's hook needs where the call gave the size (three
/// pointer attributes; [`classify`] asks seven). `None` when the driver
/// is not loaded or refuses.
pub(crate) fn kind(addr: usize) -> Option<(MemType, i32)> {
    attributes(addr, TYPE_ONLY).map(|answer| answer.decoded())
}

/// The pointer attributes memhook asks, in this order: the first three
/// give the type and device, the next two the range, the last two the
/// mapping.
const ASKED: [CUpointer_attribute; 7] = [
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
    CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
];
const TYPE_ONLY: usize = 3;
const WITH_RANGE: usize = 5;
const WITH_MAPPING: usize = 7;

/// The driver's answers to the first attributes of [`ASKED`] (those not
/// asked keep their defaults).
struct Answer {
    memory_type: c_uint,
    managed: c_uint,
    ordinal: c_int,
    start: CUdeviceptr,
    size: usize,
    map_base: CUdeviceptr,
    map_size: usize,
}

/// The first `n` attributes of [`ASKED`] for `addr` (`n` at most 7), in
/// one `cuPointerGetAttributes` call.
fn attributes(addr: usize, n: usize) -> Option<Answer> {
    let f = function::<GetAttributesFn>(&GET_ATTRIBUTES)?;
    let mut a = Answer {
        memory_type: 0,
        managed: 0,
        ordinal: -1,
        start: 0,
        size: 0,
        map_base: 0,
        map_size: 0,
    };
    let mut attributes = ASKED;
    let mut data: [*mut c_void; ASKED.len()] = [
        (&raw mut a.memory_type).cast(),
        (&raw mut a.managed).cast(),
        (&raw mut a.ordinal).cast(),
        (&raw mut a.start).cast(),
        (&raw mut a.size).cast(),
        (&raw mut a.map_base).cast(),
        (&raw mut a.map_size).cast(),
    ];
    let n = n.min(ASKED.len());
    // SAFETY: the first `n` attributes, each with storage of its
    // documented type (the boolean in a zeroed 4-byte word); the pointers
    // are not used after the call.
    let status = unsafe {
        f(
            n as c_uint,
            attributes.as_mut_ptr(),
            data.as_mut_ptr(),
            addr as CUdeviceptr,
        )
    };
    (status == SUCCESS).then_some(a)
}

impl Answer {
    /// The driver's memory type, managed flag and device ordinal as
    /// memhook's type and device (-1 but for device and managed memory).
    fn decoded(&self) -> (MemType, i32) {
        // CU_MEMORYTYPE_HOST 1, DEVICE 2, ARRAY 3, UNIFIED 4; 0: not CUDA's.
        let mem_type = match (self.memory_type, self.managed != 0) {
            (_, true) | (4, _) => MemType::CudaManaged,
            (2 | 3, false) => MemType::Cuda,
            (1, false) => MemType::CudaHost,
            _ => MemType::Host,
        };
        let device = match mem_type {
            MemType::Cuda | MemType::CudaManaged => self.ordinal,
            _ => -1,
        };
        (mem_type, device)
    }
}

/// The context the allocation at `addr` belongs to (0 for none: memory
/// of a stream-ordered pool, which outlives contexts), or `None` where
/// the driver does not know the address or is not loaded.
pub(crate) fn context_of(addr: usize) -> Option<usize> {
    let f = function::<GetAttributesFn>(&GET_ATTRIBUTES)?;
    let mut context: CUcontext = core::ptr::null_mut();
    let mut attributes = [CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT];
    let mut data: [*mut c_void; 1] = [(&raw mut context).cast()];
    // SAFETY: one attribute, with storage of its documented type.
    let status = unsafe { f(1, attributes.as_mut_ptr(), data.as_mut_ptr(), addr as CUdeviceptr) };
    (status == SUCCESS).then_some(context as usize)
}

/// Whether `device`'s primary context is active (`None` where the driver
/// is not loaded or refuses: an unknown device).
pub(crate) fn primary_active(device: CUdevice) -> Option<bool> {
    let state = function::<PrimaryCtxGetStateFn>(&PRIMARY_GET_STATE)?;
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: valid out-parameters; the driver checks the device.
    (unsafe { state(device, &mut flags, &mut active) } == SUCCESS).then_some(active != 0)
}

/// `device`'s primary context, if it is active (a reset of an inactive
/// one ends nothing). Its handle is taken with a retain and a release,
/// which leave the count as it was: an active context's count stays
/// above zero (the release goes through its hook where bistro patched
/// it, which finds the context still active and ends nothing).
pub(crate) fn primary_context(device: CUdevice) -> Option<usize> {
    let retain = function::<PrimaryCtxRetainFn>(&PRIMARY_RETAIN)?;
    let release = function::<PrimaryCtxReleaseFn>(&PRIMARY_RELEASE)?;
    if primary_active(device) != Some(true) {
        return None;
    }
    let mut context: CUcontext = core::ptr::null_mut();
    // SAFETY: as above.
    if unsafe { retain(&mut context, device) } != SUCCESS {
        return None;
    }
    // SAFETY: the reference just taken.
    unsafe { release(device) };
    Some(context as usize).filter(|&c| c != 0)
}

/// An integer attribute of `device`.
fn device_attribute(device: i32, attribute: CUdevice_attribute) -> Option<i32> {
    let f = function::<DeviceGetAttributeFn>(&DEVICE_GET_ATTRIBUTE)?;
    let mut value = 0;
    // SAFETY: a valid out-parameter; the driver checks the device.
    (unsafe { f(&mut value, attribute, device) } == SUCCESS).then_some(value)
}

/// A PCI bus id, as NVML writes it ("00000000:19:00.0").
pub type PciBusId = heapless::String<32>;

/// The PCI bus id of CUDA device `device`: its PCI address from the
/// driver, confirmed and written in NVML's form by NVML. `None` without a
/// driver, without NVML, or for an unknown device. Cached per device; the
/// first call loads NVML (it allocates: not for hook paths).
pub fn pci_bus_id(device: i32) -> Option<PciBusId> {
    const DEVICES: usize = 64;
    // (A fork section while held: a child never finds it held.)
    static CACHE: crate::fork::Mutex<[Option<PciBusId>; DEVICES]> = crate::fork::Mutex::new([const { None }; DEVICES]);
    let slot = usize::try_from(device).ok().filter(|&d| d < DEVICES)?;
    if let Some(id) = CACHE.lock()[slot].clone() {
        return Some(id);
    }
    load();
    let domain = device_attribute(device, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
    let bus = device_attribute(device, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
    let dev = device_attribute(device, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
    let nvml = nvml()?;
    let query = format!("{domain:08x}:{bus:02x}:{dev:02x}.0");
    let info = nvml.device_by_pci_bus_id(query).ok()?.pci_info().ok()?;
    let id = PciBusId::try_from(info.bus_id.as_str()).ok()?;
    CACHE.lock()[slot] = Some(id.clone());
    Some(id)
}

/// NVML, initialised once (None where it is missing).
fn nvml() -> Option<&'static nvml_wrapper::Nvml> {
    static NVML: std::sync::OnceLock<Option<nvml_wrapper::Nvml>> = std::sync::OnceLock::new();
    NVML.get_or_init(|| nvml_wrapper::Nvml::init().ok()).as_ref()
}

#[cfg(test)]
mod tests {
    use super::mapped_part;

    const MIB: usize = 1 << 20;

    #[test]
    fn the_part_of_a_range_its_mapping_covers_is_recorded() {
        // What driver 580 answered on the H200 (run 158). A page mapped
        // into a 16 MiB reservation: the range is the reservation, the
        // mapping the page.
        let va = 0x7f95_d8e0_0000;
        assert_eq!(mapped_part(va, 16 * MIB, va, 2 * MIB), (va, 2 * MIB));
        // Two pages mapped by one call, asked about at the second.
        assert_eq!(
            mapped_part(va, 16 * MIB, va + 4 * MIB, 4 * MIB),
            (va + 4 * MIB, 4 * MIB)
        );
        // A 4 KiB allocation in the driver's 2 MiB mapping, not at its
        // start; a pool's 4 KiB in a 32 MiB one: the allocation.
        let p = 0x7f95_d3e0_1000;
        assert_eq!(mapped_part(p, 4096, p - 4096, 2 * MIB), (p, 4096));
        assert_eq!(
            mapped_part(0x3_0200_0000, 4096, 0x3_0200_0000, 32 * MIB),
            (0x3_0200_0000, 4096)
        );
        // Range and mapping the same (a 4 MiB allocation).
        assert_eq!(mapped_part(p, 4 * MIB, p, 4 * MIB), (p, 4 * MIB));
        // No mapping known, or one that does not meet the range: the range.
        assert_eq!(mapped_part(va, 16 * MIB, 0, 0), (va, 16 * MIB));
        assert_eq!(mapped_part(va, 2 * MIB, va + 8 * MIB, 2 * MIB), (va, 2 * MIB));
        // A nonsense mapping that runs past the end of the address space:
        // no overflow, the range.
        assert_eq!(mapped_part(p, 4096, p - 4096, usize::MAX), (p, 4096));
    }
}

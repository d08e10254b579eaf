//! Shared by the CUDA tests: the fake driver built once per process, loads
//! that memhook follows, and an allocation-free log of memory-type events.
#![allow(dead_code)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use memhook::HandlerFn;
use memhook::event::{Event, bits};
use memhook_tests::fakecuda::{self, FakeCuda};

/// The fake driver and clients, built once per test process.
pub fn fake() -> &'static FakeCuda {
    static FAKE: OnceLock<FakeCuda> = OnceLock::new();
    FAKE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("memhook-fakecuda-{}", std::process::id()));
        fakecuda::build(&dir)
    })
}

/// A C string of a path.
pub fn cpath(p: &Path) -> CString {
    CString::new(p.to_str().expect("UTF-8 path")).expect("no NUL")
}

/// A function pointer from an address.
///
/// # Safety
///
/// `p` must be a function of type `T` (a pointer-sized function pointer).
pub unsafe fn cast<T>(p: usize) -> T {
    assert_eq!(size_of::<T>(), size_of::<usize>());
    // SAFETY: the caller's contract.
    unsafe { std::mem::transmute_copy(&p) }
}

/// `name` in `handle` (panics when missing).
pub fn sym(handle: *mut c_void, name: &CStr) -> usize {
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
    assert_ne!(p, 0, "{name:?} not found");
    p
}

type OpenFn = unsafe extern "C" fn(*const c_char) -> *mut c_void;

/// The loader library, opened by the test itself (memhook does not follow
/// the test executable's own dlopen calls: memhook is linked into it).
fn loader() -> OpenFn {
    static OPEN: OnceLock<usize> = OnceLock::new();
    let p = *OPEN.get_or_init(|| {
        let path = cpath(&fake().loader);
        // SAFETY: a NUL-terminated path to the library just built.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!h.is_null(), "dlopen loader");
        sym(h, c"loader_open")
    });
    // SAFETY: loader_open has this signature.
    unsafe { cast(p) }
}

/// Opens `path` through the loader library (a load memhook sees).
pub fn open(path: &Path) -> *mut c_void {
    let c = cpath(path);
    // SAFETY: the loader's dlopen wrapper, with a valid path.
    let h = unsafe { loader()(c.as_ptr()) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

/// Closes `h` through the loader library (an unload memhook sees).
pub fn close(h: *mut c_void) {
    static CLOSE: OnceLock<usize> = OnceLock::new();
    let p = *CLOSE.get_or_init(|| {
        let _ = loader();
        let path = cpath(&fake().loader);
        // SAFETY: RTLD_NOLOAD finds the loaded loader library.
        let l = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        sym(l, c"loader_close")
    });
    // SAFETY: loader_close has this signature; `h` came from `open`.
    let f: unsafe extern "C" fn(*mut c_void) -> i32 = unsafe { cast(p) };
    // SAFETY: as above.
    assert_eq!(unsafe { f(h) }, 0);
}

/// Serialises the tests of one process that install or patch.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes sure the loader is loaded (before install, so that install
/// patches its dlopen slot).
pub fn prepare() {
    let _ = loader();
}

/// One logged event: kind, address, size, memory type.
pub type Rec = (u32, usize, usize, u32);

const LOG: usize = 1 << 16;
static KIND: [AtomicU32; LOG] = [const { AtomicU32::new(0) }; LOG];
static ADDR: [AtomicUsize; LOG] = [const { AtomicUsize::new(0) }; LOG];
static SIZE: [AtomicUsize; LOG] = [const { AtomicUsize::new(0) }; LOG];
static TYPE: [AtomicU32; LOG] = [const { AtomicU32::new(0) }; LOG];
/// The device the memtype map gave for the address while the event was
/// being delivered (-2: not found).
static DEVICE: [std::sync::atomic::AtomicI32; LOG] = [const { std::sync::atomic::AtomicI32::new(-2) }; LOG];
static NEXT: AtomicUsize = AtomicUsize::new(0);

fn log(e: &mut Event) {
    let (kind, m) = match e {
        Event::MemTypeAlloc(m) => (bits::MEM_TYPE_ALLOC, *m),
        Event::MemTypeFree(m) => (bits::MEM_TYPE_FREE, *m),
        _ => return,
    };
    let i = NEXT.fetch_add(1, Ordering::AcqRel);
    if i < LOG {
        ADDR[i].store(m.address, Ordering::Relaxed);
        SIZE[i].store(m.size, Ordering::Relaxed);
        TYPE[i].store(m.mem_type, Ordering::Relaxed);
        let device = match memhook::memtype::lookup(m.address, 1) {
            memhook::memtype::Lookup::Found(info) => info.device,
            _ => -2,
        };
        DEVICE[i].store(device, Ordering::Relaxed);
        KIND[i].store(kind, Ordering::Release);
    }
}

/// Registers the logging handler for both memory-type events (once).
pub fn log_events() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        memhook::set_handler(
            bits::MEM_TYPE_ALLOC | bits::MEM_TYPE_FREE,
            0,
            HandlerFn::Rust(&|e: &mut Event| log(e)),
        )
        .expect("register the log handler");
    });
}

/// The events logged since the last call, oldest first.
pub fn take() -> Vec<Rec> {
    let n = NEXT.swap(0, Ordering::AcqRel).min(LOG);
    (0..n)
        .map(|i| {
            (
                KIND[i].load(Ordering::Acquire),
                ADDR[i].load(Ordering::Relaxed),
                SIZE[i].load(Ordering::Relaxed),
                TYPE[i].load(Ordering::Relaxed),
            )
        })
        .collect()
}

/// (allocations, frees) among `recs`.
pub fn counts(recs: &[Rec]) -> (usize, usize) {
    (
        recs.iter().filter(|r| r.0 == bits::MEM_TYPE_ALLOC).count(),
        recs.iter().filter(|r| r.0 == bits::MEM_TYPE_FREE).count(),
    )
}

/// The fake driver's call counter.
pub fn fake_calls(libcuda: *mut c_void) -> u64 {
    // SAFETY: fake_calls has this signature.
    let f: unsafe extern "C" fn() -> u64 = unsafe { cast(sym(libcuda, c"fake_calls")) };
    // SAFETY: no arguments.
    unsafe { f() }
}

/// How often the loaded fake driver was asked its current context's
/// device (cuCtxGetDevice).
#[allow(dead_code)]
pub fn ctx_queries() -> u64 {
    let h = libcuda();
    // SAFETY: fake_ctx_queries has this signature.
    let f: unsafe extern "C" fn() -> u64 = unsafe { cast(sym(h, c"fake_ctx_queries")) };
    // SAFETY: no arguments.
    let n = unsafe { f() };
    // SAFETY: the reference `libcuda` took, returned.
    unsafe { libc::dlclose(h) };
    n
}

/// The fake driver, loaded (by a client linked to it) and hooked in
/// bistro mode alone, with the log handler registered: a handle on it.
pub fn bistro_fake_driver() -> *mut c_void {
    prepare();
    log_events();
    memhook::install(&memhook::Config::parse("cuda=bistro;mmap=none").unwrap());
    let _ = open(&fake().plt);
    assert!(memhook::cuda::attached().0);
    libcuda()
}

/// A handle on the fake driver, which must be loaded already.
pub fn libcuda() -> *mut c_void {
    let c = cpath(&fake().libcuda);
    // SAFETY: RTLD_NOLOAD finds the loaded object only.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!h.is_null(), "the fake driver is loaded");
    h
}

/// The memtype map's answer at `addr` agrees with the driver's
/// (`memtype::classify`): type and device; and the type is `want`.
#[track_caller]
pub fn agrees(addr: usize, want: memhook::memtype::MemType) {
    use memhook::memtype::{self, Lookup};
    let Lookup::Found(mine) = memtype::lookup(addr, 1) else {
        panic!("lookup({addr:#x}) = {:?}", memtype::lookup(addr, 1));
    };
    let Lookup::Found(driver) = memtype::classify(addr, 1) else {
        panic!("classify({addr:#x}) failed");
    };
    assert_eq!(
        (mine.mem_type, mine.device),
        (driver.mem_type, driver.device),
        "{addr:#x}"
    );
    assert_eq!(mine.mem_type, want, "{addr:#x}");
}

/// The device a handler's lookup gave during the delivery of the logged
/// `MEM_TYPE_ALLOC` of `addr` (the map is fed before handlers run), if it
/// is in the log.
pub fn device_at_delivery(addr: usize) -> Option<i32> {
    let n = NEXT.load(Ordering::Acquire).min(LOG);
    (0..n)
        .find(|&i| KIND[i].load(Ordering::Acquire) == bits::MEM_TYPE_ALLOC && ADDR[i].load(Ordering::Relaxed) == addr)
        .map(|i| DEVICE[i].load(Ordering::Relaxed))
}

/// Asserts that `got` holds exactly the events of `want`, in any order
/// (the ones a walk over the map reports come in address order).
#[track_caller]
pub fn same_events(mut got: Vec<Rec>, mut want: Vec<Rec>, what: &str) {
    got.sort();
    want.sort();
    assert_eq!(got, want, "{what}");
}

/// The one event among `recs` at `addr` (asserting there is exactly one),
/// of `kind` and `size`.
#[track_caller]
pub fn one_event(recs: Vec<Rec>, kind: u32, addr: usize, size: usize) -> Rec {
    let ours: Vec<Rec> = recs.into_iter().filter(|r| r.1 == addr).collect();
    assert_eq!(ours.len(), 1, "one event at {addr:#x}: {ours:?}");
    assert_eq!((ours[0].0, ours[0].2), (kind, size), "{ours:?}");
    ours[0]
}

/// One allocation of each kind a context owns, and the pool's, which no
/// context owns (sizes [`EveryKind::SIZES`]): made by a test through the
/// driver it tests (the fake's functions, or the real driver's), to check
/// what a context's destruction reports.
pub struct EveryKind {
    pub device: usize,
    pub managed: usize,
    pub pinned: usize,
    /// A mapping of the test's own, registered with the driver.
    pub registered: usize,
    /// Stream-ordered pool memory: it outlives the context.
    pub pool: usize,
}

impl EveryKind {
    /// Device, managed, pinned, registered, pool.
    pub const SIZES: [usize; 5] = [1 << 20, 1 << 20, 1 << 16, 1 << 16, 1 << 20];

    /// The five addresses, in the order of [`Self::SIZES`].
    pub fn new([device, managed, pinned, registered, pool]: [usize; 5]) -> Self {
        EveryKind {
            device,
            managed,
            pinned,
            registered,
            pool,
        }
    }

    /// A mapping for [`Self::registered`] (read-write, anonymous).
    pub fn own_mapping() -> *mut c_void {
        // SAFETY: an anonymous private mapping, released by `check_ended`.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::SIZES[3],
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        page
    }

    /// The frees the context's destruction reports: all but the pool's.
    pub fn frees(&self) -> [Rec; 4] {
        use memhook::memtype::MemType;
        const F: u32 = bits::MEM_TYPE_FREE;
        let [d, m, p, r, _] = Self::SIZES;
        [
            (F, self.device, d, MemType::Cuda as u32),
            (F, self.managed, m, MemType::CudaManaged as u32),
            (F, self.pinned, p, MemType::CudaHost as u32),
            (F, self.registered, r, MemType::CudaHost as u32),
        ]
    }

    /// After the context's destruction: the map knows none of them but
    /// the pool's; the registered mapping is released.
    #[track_caller]
    pub fn check_ended(&self) {
        use memhook::memtype::{self, Lookup};
        for gone in [self.device, self.managed, self.pinned, self.registered] {
            assert_eq!(memtype::lookup(gone, 1), Lookup::Absent, "{gone:#x}");
        }
        assert!(
            matches!(memtype::lookup(self.pool, 1), Lookup::Found(_)),
            "the pool's memory stays"
        );
        // SAFETY: the test's own mapping, no longer registered.
        unsafe { libc::munmap(self.registered as *mut c_void, Self::SIZES[3]) };
    }
}

/// An IPC handle or a pool's export data, as the fake driver reads them
/// (`tests/cuda/fakecuda.c`): the size, then the exporter's device, then
/// an export id (64 bytes, passed by value, as the driver's).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Handle {
    pub reserved: [u8; 64],
}

/// A handle of no export id: each open is a mapping of its own.
pub fn handle(size: usize, device: i32) -> Handle {
    let mut h = Handle { reserved: [0; 64] };
    h.reserved[..8].copy_from_slice(&(size as u64).to_ne_bytes());
    h.reserved[8..12].copy_from_slice(&device.to_ne_bytes());
    h
}

/// A handle of one export (`id`): its opens share one mapping, as the
/// driver's do.
pub fn handle_of(size: usize, device: i32, id: u64) -> Handle {
    let mut h = handle(size, device);
    h.reserved[12..20].copy_from_slice(&id.to_ne_bytes());
    h
}

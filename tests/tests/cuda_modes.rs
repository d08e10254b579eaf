//! The user's question, answered on the fake driver: which hook mode
//! catches which kind of caller. Three clients make the same calls: one
//! through its PLT, one through pointers from `dlsym`, one as CUDA 13's
//! runtime does (through `cuGetProcAddress`, which it first looks up with
//! `cuGetProcAddress` itself). Reloc alone catches only the first, bistro
//! all three, procaddr the second and third; the default catches all three
//! with each event reported once, and `none` catches nothing. Every call
//! reaches the fake driver exactly once in every mode.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod common;

use std::ffi::{CStr, c_char, c_void};

use common::*;
use memhook::Config;
use memhook::config::HookMode;

const PAIRS: i32 = 3;
const SIZE: usize = 1 << 20;

type PltRun = unsafe extern "C" fn(i32, usize) -> i32;
type PathRun = unsafe extern "C" fn(*const c_char, i32, usize) -> i32;

struct Clients {
    plt: PltRun,
    dlsym: PathRun,
    runtime: PathRun,
}

fn clients() -> Clients {
    let f = fake();
    let (plt, dlsym, runtime) = (open(&f.plt), open(&f.dlsym), open(&f.runtime));
    // A shared runtime beside them, loaded for good: the bistro installs
    // patch both libraries.
    let _ = open(&f.cudart);
    // SAFETY: each symbol is the client function of the stated signature.
    unsafe {
        Clients {
            plt: cast(sym(plt, c"plt_run")),
            dlsym: cast(sym(dlsym, c"dlsym_run")),
            runtime: cast(sym(runtime, c"runtime_run")),
        }
    }
}

/// Runs each client; per client: (allocations, frees) reported, and the
/// driver calls it made.
fn run(c: &Clients, libcuda: &CStr) -> [((usize, usize), u64); 3] {
    let mut out = [((0, 0), 0); 3];
    for (i, slot) in out.iter_mut().enumerate() {
        let h = libcuda_handle();
        let before = fake_calls(h);
        let _ = take();
        // SAFETY: the clients' functions with valid arguments.
        let failed = unsafe {
            match i {
                0 => (c.plt)(PAIRS, SIZE),
                1 => (c.dlsym)(libcuda.as_ptr(), PAIRS, SIZE),
                _ => (c.runtime)(libcuda.as_ptr(), PAIRS, SIZE),
            }
        };
        assert_eq!(failed, 0, "client {i} failed calls");
        let recs = take();
        for r in &recs {
            assert!(r.2 == SIZE, "every event carries the allocation's size: {r:?}");
        }
        *slot = (counts(&recs), fake_calls(h) - before);
    }
    out
}

fn libcuda_handle() -> *mut c_void {
    libcuda()
}

#[test]
fn each_mode_catches_its_callers_and_each_event_once() {
    let _serial = serial();
    prepare();
    log_events();
    let libcuda = cpath(&fake().libcuda);
    let mut clients_loaded = None;
    // (mode, host mode, caught by: plt, dlsym, runtime). The host hooks
    // in reloc mode too share reloc's symbols with the CUDA hooks: with
    // them, `reloc,procaddr` is what `memhook doctor` advises where code
    // pages cannot be written.
    // In bistro mode, the host hooks patch the loader's functions that
    // reloc and procaddr interpose too.
    let matrix: [(&str, &str, [bool; 3]); 12] = [
        ("reloc", "none", [true, false, false]),
        ("bistro", "none", [true, true, true]),
        ("procaddr", "none", [false, true, true]),
        ("bistro,reloc,procaddr", "none", [true, true, true]),
        ("reloc,procaddr", "none", [true, true, true]),
        ("reloc,procaddr", "reloc", [true, true, true]),
        ("reloc", "reloc", [true, false, false]),
        ("bistro,reloc,procaddr", "reloc", [true, true, true]),
        ("reloc,procaddr", "bistro", [true, true, true]),
        ("procaddr", "bistro", [false, true, true]),
        ("bistro,reloc,procaddr", "bistro", [true, true, true]),
        ("none", "none", [false, false, false]),
    ];
    for (mode, host, expect) in matrix {
        let config = Config::parse(&format!("cuda={mode};mmap={host}")).expect("a valid config");
        let serialized = memhook::code::serializations();
        memhook::install(&config);
        let serialized = memhook::code::serializations() - serialized;
        // Loaded after the first install: that is also a late load.
        let c = clients_loaded.get_or_insert_with(clients);
        let got = run(c, &libcuda);
        for (i, caught) in expect.into_iter().enumerate() {
            let ((allocs, frees), calls) = got[i];
            // The runtime-like client adds one per-thread-stream pair.
            let pairs = PAIRS as usize + usize::from(i == 2);
            let want = if caught { (pairs, pairs) } else { (0, 0) };
            assert_eq!((allocs, frees), want, "mode {mode}, host {host}, client {i}: events");
            // The runtime-like client also makes five cuGetProcAddress calls.
            let driver_calls = 2 * pairs as u64 + if i == 2 { 5 } else { 0 };
            assert_eq!(calls, driver_calls, "mode {mode}, client {i}: driver calls");
        }
        if mode.contains("bistro") {
            let status = memhook::status();
            let s = status
                .iter()
                .find(|s| s.function == "cuMemAlloc_v2" && s.mode == HookMode::Bistro)
                .expect("a bistro status for cuMemAlloc_v2");
            assert!(s.installed, "{s:?}");
            assert_eq!(s.library, "libcuda.so.1");
            // One entry at a time (host entries first, then CUDA's): the
            // same list.
            for (i, s) in status.iter().enumerate() {
                assert_eq!(memhook::status_at(i), (Some(s.clone()), status.len()));
            }
            assert_eq!(memhook::status_at(status.len()), (None, status.len()));
            // Once the libraries are loaded (from the second install on),
            // the functions of both (54 of the fake's) are patched in one
            // batch, which serialises every core three times, or once
            // where every jump is one store (arm64's near jump); one at a
            // time: three each; one batch for each library and each 32
            // functions (before the forty-first session): six or nine.
            let patched = status
                .iter()
                .filter(|s| s.mode == HookMode::Bistro && s.installed)
                .count() as u64;
            assert!(patched > 32, "{patched} functions patched");
            let (driver, runtime) = memhook::cuda::attached();
            assert!(driver && runtime, "both libraries attached");
            let one_batch = if cfg!(target_arch = "x86_64") { 3 } else { 1 };
            // The host hooks in bistro mode: their own batch before.
            let batches = 1 + u64::from(host == "bistro");
            assert_eq!(
                serialized,
                batches * one_batch,
                "mode {mode}: {serialized} serialisations for {patched} patches"
            );
            eprintln!("mode {mode}: {serialized} serialisations for {patched} functions");
        }
        memhook::uninstall();
    }
}

/// The fake's entries are driver 580's: each hooked function's first 26
/// bytes equal the fixture read from the real libcuda, except the two
/// displacements (which point into each library). (x86_64: the fixture
/// is of the H200's driver; the arm64 entries are of their own shape.)
#[cfg(target_arch = "x86_64")]
#[test]
fn fake_driver_entries_are_the_real_prologue() {
    let _serial = serial();
    prepare();
    let h = {
        let _ = open(&fake().libcuda);
        libcuda()
    };
    let mut checked = 0;
    for row in memhook_tests::fixtures::read("prologues-h200-driver580-cuda13-glibc239.tsv")
        .into_iter()
        .filter(|row| row.library == "libcuda.so.1")
    {
        let name = std::ffi::CString::new(row.symbol.as_str()).unwrap();
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
        if p == 0 {
            continue; // not a function the fake needs
        }
        let want = &row.code[..26];
        // SAFETY: the function's code is mapped and at least 26 bytes long.
        let got = unsafe { std::slice::from_raw_parts(p as *const u8, 26) };
        for i in (0..26).filter(|i| !(12..16).contains(i) && !(22..26).contains(i)) {
            assert_eq!(got[i], want[i], "{}: byte {i}", row.symbol);
        }
        checked += 1;
    }
    assert!(checked >= 24, "only {checked} fake entries checked");
}

/// A `cuGetProcAddress` of a version before `_v2` answers with the old
/// definitions of pinned host memory, `cuMemAllocHost` and
/// `cuMemHostRegister` (separate functions in driver 580): procaddr hands
/// out their hooks, and their memory is reported as pinned host memory,
/// as the current version's is.
#[test]
fn an_older_version_through_procaddr_gets_the_old_names_hooked() {
    type Proc = unsafe extern "C" fn(*const c_char, *const c_char, i32) -> usize;
    type AllocHost = unsafe extern "C" fn(*mut *mut c_void, u32) -> u32;
    type Register = unsafe extern "C" fn(*mut c_void, usize, u32) -> u32;
    type Release = unsafe extern "C" fn(*mut c_void) -> u32;
    let _serial = serial();
    prepare();
    log_events();
    memhook::install(&Config::parse("cuda=procaddr;mmap=none").expect("a valid config"));
    let _ = open(&fake().plt);
    // Looked up as CUDA 13's runtime looks up the driver's functions.
    // SAFETY: the client's runtime_proc, of this signature.
    let proc: Proc = unsafe { cast(sym(open(&fake().runtime), c"runtime_proc")) };
    let libcuda = cpath(&fake().libcuda);
    let get = |name: &CStr, version: i32| {
        // SAFETY: NUL-terminated names.
        let p = unsafe { proc(libcuda.as_ptr(), name.as_ptr(), version) };
        assert_ne!(p, 0, "{name:?} at {version}");
        p
    };
    const A: u32 = memhook::event::bits::MEM_TYPE_ALLOC;
    const F: u32 = memhook::event::bits::MEM_TYPE_FREE;
    let host = memhook::memtype::MemType::CudaHost as u32;
    let _ = take();
    for version in [3010, 13000] {
        // SAFETY: the driver's functions of these names and signatures.
        let (alloc_host, register, free_host, unregister): (AllocHost, Register, Release, Release) = unsafe {
            (
                cast(get(c"cuMemAllocHost", version)),
                cast(get(c"cuMemHostRegister", version)),
                cast(get(c"cuMemFreeHost", version)),
                cast(get(c"cuMemHostUnregister", version)),
            )
        };
        let mut p = std::ptr::null_mut();
        let mut buf = vec![0u8; 2 * 4096];
        let b = buf.as_mut_ptr();
        // SAFETY: valid out-parameters; the buffer is this test's own and
        // outlives its registration.
        unsafe {
            assert_eq!(alloc_host(&mut p, 8192), 0);
            assert_eq!(take(), [(A, p as usize, 8192, host)], "version {version}");
            assert_eq!(free_host(p), 0);
            assert_eq!(take(), [(F, p as usize, 8192, host)], "version {version}");
            assert_eq!(register(b.cast(), buf.len(), 0), 0);
            assert_eq!(take(), [(A, b as usize, 2 * 4096, host)], "version {version}");
            assert_eq!(unregister(b.cast()), 0);
            assert_eq!(take(), [(F, b as usize, 2 * 4096, host)], "version {version}");
        }
    }
    memhook::uninstall();
}

static OTHER_ORIGINAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static OTHER_CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Another hooker's `cuMemAlloc_v2` hook: counts, and calls what it
/// patched over.
extern "C" fn other_alloc(p: *mut u64, size: usize) -> u32 {
    OTHER_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: the trampoline has cuMemAlloc_v2's signature.
    let original: extern "C" fn(*mut u64, usize) -> u32 =
        unsafe { std::mem::transmute(OTHER_ORIGINAL.load(std::sync::atomic::Ordering::Acquire)) };
    original(p, size)
}

/// Another hooker patches over memhook's bistro patch of the driver's
/// `cuMemAlloc_v2` (as a profiler or a second hooking library loaded
/// later does). An uninstall cannot undo that patch without undoing
/// theirs: it stays, still reporting, listed in `status`, while
/// `cuMemFree_v2`'s is undone. The next install takes it back as it is:
/// patched over again, its entry would lead through the other hooker to
/// the old patch and round to the new one, until the stack overflowed;
/// an install in reloc and procaddr modes leaves that function to it.
/// Once the other hooker lets go, the install after that undoes it and
/// patches afresh, and its uninstall leaves the entry's bytes exactly as
/// they were.
#[test]
fn a_patch_another_hooker_covered_is_kept_and_taken_back() {
    let _serial = serial();
    prepare();
    log_events();
    let bistro = Config::parse("cuda=bistro;mmap=none").expect("a valid config");
    memhook::install(&bistro);
    let c = clients();
    let h = libcuda_handle();
    let entry = sym(h, c"cuMemAlloc_v2");
    // PAIRS pairs through the client's PLT: how many times the other
    // hooker ran, and the allocations and frees memhook reported.
    let round = || {
        let n = OTHER_CALLS.load(std::sync::atomic::Ordering::SeqCst);
        let _ = take();
        // SAFETY: the client's function with valid arguments.
        assert_eq!(unsafe { (c.plt)(PAIRS, SIZE) }, 0);
        let (allocs, frees) = counts(&take());
        (OTHER_CALLS.load(std::sync::atomic::Ordering::SeqCst) - n, allocs, frees)
    };
    let pairs = PAIRS as usize;
    let listed = || {
        memhook::status()
            .iter()
            .filter(|s| s.mode == HookMode::Bistro && s.installed)
            .map(|s| s.function)
            .collect::<Vec<_>>()
    };
    assert_eq!(round(), (0, pairs, pairs));
    memhook::uninstall();
    // The entry as the library has it (the first install loaded it).
    // SAFETY: the function's code is mapped and at least 16 bytes long.
    let unpatched = unsafe { *(entry as *const [u8; 16]) };
    memhook::install(&bistro);
    // SAFETY: other_alloc has cuMemAlloc_v2's signature and calls its
    // original.
    let other = unsafe { memhook::bistro::Hook::patch_with(entry, other_alloc as *const () as usize, &OTHER_ORIGINAL) }
        .expect("the other hooker patches over memhook's jump");
    assert_eq!(round(), (pairs, pairs, pairs), "both hookers see every allocation");

    memhook::uninstall();
    assert_eq!(
        round(),
        (pairs, pairs, 0),
        "the kept patch still reports; cuMemFree_v2's is undone"
    );
    assert_eq!(listed(), ["cuMemAlloc_v2"], "the kept patch is listed");

    // Installed in the other modes, the kept patch goes on hooking
    // cuMemAlloc_v2 alone: no GOT slot, dlsym or cuGetProcAddress is
    // given its hook, whose original would be the entry again (the
    // first call ran round the two hooks until the stack overflowed).
    // Every client's calls are reported once, and the other hooker sees
    // each of its allocations.
    let libcuda = cpath(&fake().libcuda);
    memhook::install(&Config::parse("cuda=reloc,procaddr;mmap=none").expect("a valid config"));
    let n = OTHER_CALLS.load(std::sync::atomic::Ordering::SeqCst);
    for (i, ((allocs, frees), calls)) in run(&c, &libcuda).into_iter().enumerate() {
        let pairs = pairs + usize::from(i == 2);
        assert_eq!((allocs, frees), (pairs, pairs), "client {i}: events");
        assert_eq!(
            calls,
            2 * pairs as u64 + if i == 2 { 5 } else { 0 },
            "client {i}: driver calls"
        );
    }
    assert_eq!(
        OTHER_CALLS.load(std::sync::atomic::Ordering::SeqCst) - n,
        3 * pairs,
        "the other hooker saw every client's allocations"
    );
    assert_eq!(listed(), ["cuMemAlloc_v2"], "hooked by the kept patch");
    memhook::uninstall();
    assert_eq!(round(), (pairs, pairs, 0), "kept still");

    memhook::install(&bistro);
    assert_eq!(round(), (pairs, pairs, pairs), "taken back, not patched over");
    assert!(listed().contains(&"cuMemAlloc_v2") && listed().contains(&"cuMemFree_v2"));

    memhook::uninstall();
    other.unpatch().map_err(|(_, e)| e).expect("the other hooker lets go");
    memhook::install(&bistro);
    assert_eq!(round(), (0, pairs, pairs));
    memhook::uninstall();
    // SAFETY: as above.
    let now = unsafe { *(entry as *const [u8; 16]) };
    assert_eq!(now, unpatched, "the bytes as they were");
    assert_eq!(round(), (0, 0, 0));
    assert!(listed().is_empty());
}

//! Reloc on real shared objects built for the test: a caller through the
//! PLT, one through a GLOB_DAT pointer (-fno-plt), one with full RELRO, and
//! one loaded with dlopen after install together with its dependency; undo
//! restores every slot, and a dlclose'd object is forgotten.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// glibc's base symbol version on this architecture.
const GLIBC_BASE: &std::ffi::CStr = if cfg!(target_arch = "aarch64") {
    c"GLIBC_2.17"
} else {
    c"GLIBC_2.2.5"
};

use memhook::reloc;

#[path = "../../tests/src/cc.rs"]
mod cc;

/// Builds `lib<name>.so` in `dir` from `source`, linked against `dir`'s
/// libraries (`-L`, rpath), with `extra` arguments after the source.
fn build_library(dir: &Path, name: &str, source: &str, extra: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(format!("lib{name}.so"));
    cc::build(
        cc::command()
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&out)
            .arg(&src)
            .arg(format!("-L{}", dir.display()))
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .args(extra),
        name,
    );
    out
}

fn open(path: &Path) -> *mut libc::c_void {
    let p = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let h = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

fn sym<T>(handle: *mut libc::c_void, name: &CStr) -> T {
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
    assert!(!p.is_null(), "{name:?}");
    assert_eq!(size_of::<T>(), size_of::<usize>());
    // SAFETY: the callers name T as the symbol's function type.
    unsafe { std::mem::transmute_copy(&p) }
}

type Fn1 = unsafe extern "C" fn(i32) -> i32;

/// The tests install and uninstall reloc's hooks: they take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

static ORIGINAL: AtomicUsize = AtomicUsize::new(0);
static HOOKED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn hook_target(a: i32) -> i32 {
    HOOKED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: ORIGINAL holds mhr_target (same signature).
    let f: Fn1 = unsafe { std::mem::transmute(ORIGINAL.load(Ordering::Acquire)) };
    // SAFETY: mhr_target takes and returns an int.
    (unsafe { f(a) }) + 1000
}

#[test]
fn reloc_hooks_plt_glob_dat_relro_and_late_loads_and_undoes_them() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("memhook-reloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Loaded before everything else: RTLD_NEXT from it sees the target.
    let early = build_library(
        &dir,
        "mhr_early",
        "#define _GNU_SOURCE\n#include <dlfcn.h>\nvoid *mhr_early_next(const char *n) { return dlsym(RTLD_NEXT, n); }\n",
        &[],
    );
    let h_early = open(&early);
    build_library(&dir, "mhr_target", "int mhr_target(int a) { return a + 1; }", &[]);
    let caller = |name: &str| format!("int mhr_target(int);\nint mhr_call_{name}(int a) {{ return mhr_target(a); }}\n");
    let plt = build_library(&dir, "mhr_plt", &caller("plt"), &["-lmhr_target", "-Wl,-z,lazy"]);
    let noplt = build_library(&dir, "mhr_noplt", &caller("noplt"), &["-fno-plt", "-lmhr_target"]);
    let relro = build_library(
        &dir,
        "mhr_relro",
        &caller("relro"),
        &["-lmhr_target", "-Wl,-z,now", "-Wl,-z,relro"],
    );
    let loader = build_library(
        &dir,
        "mhr_loader",
        "#define _GNU_SOURCE\n#include <dlfcn.h>\nvoid *mhr_load(const char *p) { return dlopen(p, RTLD_NOW); }\n\
         int mhr_unload(void *h) { return dlclose(h); }\n\
         void *mhr_lookup(void *h, const char *n) { return dlsym(h, n); }\n\
         void *mhr_lookup_next(const char *n) { return dlsym(RTLD_NEXT, n); }\n\
         void *mhr_lookup_v(void *h, const char *n, const char *v) { return dlvsym(h, n, v); }\n",
        &[],
    );
    build_library(&dir, "mhr_latedep", &caller("latedep"), &["-lmhr_target"]);
    let late = build_library(
        &dir,
        "mhr_late",
        "int mhr_call_latedep(int);\nint mhr_call_late(int a) { return mhr_call_latedep(a); }\n",
        &["-lmhr_latedep"],
    );

    let (h_plt, h_noplt, h_relro, h_loader) = (open(&plt), open(&noplt), open(&relro), open(&loader));
    let call_plt: Fn1 = sym(h_plt, c"mhr_call_plt");
    let call_noplt: Fn1 = sym(h_noplt, c"mhr_call_noplt");
    let call_relro: Fn1 = sym(h_relro, c"mhr_call_relro");
    let load: unsafe extern "C" fn(*const libc::c_char) -> *mut libc::c_void = sym(h_loader, c"mhr_load");
    let unload: unsafe extern "C" fn(*mut libc::c_void) -> libc::c_int = sym(h_loader, c"mhr_unload");
    type Lookup = unsafe extern "C" fn(*mut libc::c_void, *const libc::c_char) -> *mut libc::c_void;
    type LookupNext = unsafe extern "C" fn(*const libc::c_char) -> *mut libc::c_void;
    type LookupV =
        unsafe extern "C" fn(*mut libc::c_void, *const libc::c_char, *const libc::c_char) -> *mut libc::c_void;
    let lookup: Lookup = sym(h_loader, c"mhr_lookup");
    let lookup_next: LookupNext = sym(h_loader, c"mhr_lookup_next");
    let lookup_v: LookupV = sym(h_loader, c"mhr_lookup_v");
    let h_target = open(&dir.join("libmhr_target.so"));
    // The helpers pass live handles or pseudo-handles, and NUL-terminated
    // names, as dlsym wants.
    // SAFETY: as just said.
    let by_handle = |h: *mut libc::c_void, n: &CStr| unsafe { lookup(h, n.as_ptr()) } as usize;
    // SAFETY: as just said.
    let by_next = |n: &CStr| unsafe { lookup_next(n.as_ptr()) } as usize;
    // What dlsym answers without memhook, from the loader library.
    let names = [c"mhr_target", c"mhr_call_plt"];
    let before_default = names.map(|n| by_handle(core::ptr::null_mut(), n));
    let before_handle = names.map(|n| by_handle(h_target, n));
    let before_next = names.map(by_next);
    let early_next: LookupNext = sym(h_early, c"mhr_early_next");
    // SAFETY: a NUL-terminated name.
    let by_early = |n: &CStr| unsafe { early_next(n.as_ptr()) } as usize;
    let before_early = names.map(by_early);
    assert!(
        before_early[0] != 0 && before_early[1] != 0,
        "RTLD_NEXT from the early library finds both"
    );
    // SAFETY: as above.
    let before_v = unsafe { lookup_v(core::ptr::null_mut(), c"getppid".as_ptr(), GLIBC_BASE.as_ptr()) } as usize;
    let calls = [call_plt, call_noplt, call_relro];
    for f in calls {
        // SAFETY: the test functions take and return an int.
        assert_eq!(unsafe { f(1) }, 2);
    }

    // SAFETY: hook_target has mhr_target's signature and calls the original
    // through ORIGINAL, which install sets before any slot points to it.
    unsafe { reloc::install(&[(c"mhr_target", hook_target as *const () as usize, &ORIGINAL)]) }.unwrap();
    // SAFETY: looking up the global definition.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mhr_target".as_ptr()) } as usize;
    assert_eq!(
        ORIGINAL.load(Ordering::SeqCst),
        global,
        "the original is the global definition"
    );
    let slots = reloc::slots_of(c"mhr_target");
    assert!(slots >= 3, "PLT, GLOB_DAT and RELRO slots: {slots}");

    let before = HOOKED.load(Ordering::SeqCst);
    for f in calls {
        // SAFETY: as above.
        assert_eq!(unsafe { f(1) }, 1002, "through the hook");
    }
    assert_eq!(HOOKED.load(Ordering::SeqCst) - before, 3);

    assert!(reloc::slots_of(c"dlsym") >= 1 && reloc::slots_of(c"dlopen") >= 1);
    // dlsym from a library: a hooked name found as the hooked function
    // answers the hook; anything else answers as before.
    let hook = hook_target as *const () as usize;
    let original = ORIGINAL.load(Ordering::SeqCst);
    let expect = |before: usize| if before == original { hook } else { before };
    let now_default = names.map(|n| by_handle(core::ptr::null_mut(), n));
    assert_eq!(now_default, [hook, before_default[1]], "RTLD_DEFAULT");
    // SAFETY: the answer is hook_target, which has mhr_target's signature.
    let found: Fn1 = unsafe { std::mem::transmute(now_default[0]) };
    let n = HOOKED.load(Ordering::SeqCst);
    // SAFETY: as above.
    let result = unsafe { found(7) };
    assert_eq!(result, 1008, "a function found through dlsym reaches the hook");
    assert_eq!(HOOKED.load(Ordering::SeqCst), n + 1);
    let now_handle = names.map(|n| by_handle(h_target, n));
    assert_eq!(now_handle, [hook, before_handle[1]], "explicit handle");
    let now_next = names.map(by_next);
    assert_eq!(
        now_next,
        [expect(before_next[0]), before_next[1]],
        "RTLD_NEXT keeps glibc's answer"
    );
    let now_early = names.map(by_early);
    assert_eq!(before_early[0], original, "the next mhr_target is the hooked one");
    assert_eq!(
        now_early,
        [hook, before_early[1]],
        "RTLD_NEXT to the hooked function answers the hook"
    );
    // SAFETY: as above.
    let now_v = unsafe { lookup_v(core::ptr::null_mut(), c"getppid".as_ptr(), GLIBC_BASE.as_ptr()) } as usize;
    assert_eq!(now_v, before_v, "dlvsym of an unhooked name");
    assert_ne!(before_v, 0);

    // Loaded after install (with its dependency): patched as it appears.
    let late_path = CString::new(late.to_str().unwrap()).unwrap();
    // SAFETY: the loader library's dlopen wrapper, with a valid path.
    let h_late = unsafe { load(late_path.as_ptr()) };
    assert!(!h_late.is_null());
    let call_late: Fn1 = sym(h_late, c"mhr_call_late");
    // SAFETY: as above.
    assert_eq!(unsafe { call_late(5) }, 1006, "late object's call is hooked");
    assert!(
        reloc::slots_of(c"mhr_target") > slots,
        "the dependency's slot was patched"
    );
    let objects = reloc::status().objects;

    // dlclose: the objects go, and memhook forgets them and their slots.
    // SAFETY: the handle from mhr_load.
    assert_eq!(unsafe { unload(h_late) }, 0);
    assert!(reloc::status().objects < objects, "unloaded objects forgotten");
    assert_eq!(
        reloc::slots_of(c"mhr_target"),
        slots,
        "their slots are not touched again"
    );

    reloc::uninstall();
    let before = HOOKED.load(Ordering::SeqCst);
    for f in calls {
        // SAFETY: as above.
        assert_eq!(unsafe { f(1) }, 2, "restored");
    }
    assert_eq!(HOOKED.load(Ordering::SeqCst), before);
    assert_eq!(reloc::status().slots, 0);

    // A symbol defined only in an RTLD_LOCAL object (as libcuda is, loaded
    // by libcudart): dlsym(RTLD_DEFAULT) cannot see it, so the original
    // comes from a slot already bound to it.
    build_library(&dir, "mhr_local", "int mhr_local_target(int a) { return a * 2; }", &[]);
    let local_caller = build_library(
        &dir,
        "mhr_local_caller",
        "int mhr_local_target(int);\nint mhr_call_local(int a) { return mhr_local_target(a); }\n",
        &["-lmhr_local", "-Wl,-z,now"],
    );
    let p = CString::new(local_caller.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path to a library just built.
    let h = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null());
    let call_local: Fn1 = sym(h, c"mhr_call_local");
    let definition: usize = sym(h, c"mhr_local_target");
    // SAFETY: as above; the global scope does not have it.
    assert!(unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mhr_local_target".as_ptr()) }.is_null());
    // SAFETY: hook_local doubles through LOCAL_ORIGINAL, set before patching.
    unsafe { reloc::install(&[(c"mhr_local_target", hook_local as *const () as usize, &LOCAL_ORIGINAL)]) }.unwrap();
    assert_eq!(
        LOCAL_ORIGINAL.load(Ordering::SeqCst),
        definition,
        "original from the bound slot"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { call_local(4) }, 8 + 1000);
    reloc::uninstall();
    // SAFETY: as above.
    assert_eq!(unsafe { call_local(4) }, 8);
    let _ = std::fs::remove_dir_all(&dir);
}

static LOCAL_ORIGINAL: AtomicUsize = AtomicUsize::new(0);

extern "C" fn hook_local(a: i32) -> i32 {
    // SAFETY: LOCAL_ORIGINAL holds mhr_local_target (same signature).
    let f: Fn1 = unsafe { std::mem::transmute(LOCAL_ORIGINAL.load(Ordering::Acquire)) };
    // SAFETY: it takes and returns an int.
    (unsafe { f(a) }) + 1000
}

static ABSENT_ORIGINAL: AtomicUsize = AtomicUsize::new(0);
static ABSENT_HOOKED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn hook_absent(a: i32) -> i32 {
    ABSENT_HOOKED.fetch_add(1, Ordering::SeqCst);
    let original = ABSENT_ORIGINAL.load(Ordering::Acquire);
    if original == 0 {
        // Reached with no function behind it: the test fails on this
        // value rather than on a call of address 0.
        return -1000;
    }
    // SAFETY: a non-zero original is mhr_absent's definition (same
    // signature).
    let f: Fn1 = unsafe { std::mem::transmute(original) };
    // SAFETY: it takes and returns an int.
    (unsafe { f(a) }) + 1000
}

/// A weak reference to a hooked function that no loaded object defines
/// (as `process_madvise` before glibc 2.36, `shm_open` outside librt
/// before 2.34, a CUDA function where libcuda is absent) is resolved by
/// the loader to 0, and the program tests it for that: its slots stay 0,
/// bound lazily or not, so the function stays absent to the program
/// rather than leading to a hook with nothing behind it. The loader never
/// binds such a slot later, and neither does memhook once a library that
/// defines the function comes; that library's own callers are hooked.
#[test]
fn a_weak_reference_to_an_absent_function_stays_absent() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("memhook-reloc-weak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source = "extern int mhr_absent(int) __attribute__((weak));\n\
                  int mhr_weak_call(int a) { return mhr_absent ? mhr_absent(a) : -2; }\n";
    let now = build_library(&dir, "mhr_weak_now", source, &["-Wl,-z,now"]);
    let lazy = build_library(&dir, "mhr_weak_lazy", source, &["-Wl,-z,lazy"]);
    let noplt = build_library(&dir, "mhr_weak_noplt", source, &["-fno-plt", "-Wl,-z,now"]);
    let calls: Vec<Fn1> = [now, lazy, noplt]
        .iter()
        .map(|p| sym(open(p), c"mhr_weak_call"))
        .collect();
    for &f in &calls {
        // SAFETY: the test functions take and return an int.
        assert_eq!(unsafe { f(1) }, -2, "absent before install");
    }
    // SAFETY: hook_absent checks ABSENT_ORIGINAL before calling it.
    unsafe { reloc::install(&[(c"mhr_absent", hook_absent as *const () as usize, &ABSENT_ORIGINAL)]) }.unwrap();
    assert_eq!(ABSENT_ORIGINAL.load(Ordering::SeqCst), 0, "no definition anywhere");
    assert_eq!(
        reloc::slots_of(c"mhr_absent"),
        0,
        "no slot of a function no object defines"
    );
    for &f in &calls {
        // SAFETY: as above.
        assert_eq!(unsafe { f(1) }, -2, "still absent to the program");
    }
    assert_eq!(ABSENT_HOOKED.load(Ordering::SeqCst), 0);

    // A definition comes, with a caller bound to it: that caller is
    // hooked; the weak references stay as the loader left them.
    build_library(&dir, "mhr_absent_def", "int mhr_absent(int a) { return a * 3; }", &[]);
    let caller = build_library(
        &dir,
        "mhr_absent_caller",
        "int mhr_absent(int);\nint mhr_absent_call(int a) { return mhr_absent(a); }\n",
        &["-lmhr_absent_def", "-Wl,-z,now"],
    );
    // (Through libc's dlopen: memhook's reloc follows objects loaded by
    // its own dlopen hook and rescans at the next loader call it sees.)
    let call_caller: Fn1 = sym(open(&caller), c"mhr_absent_call");
    reloc::refresh();
    // SAFETY: as above.
    assert_eq!(unsafe { call_caller(2) }, 1006, "the new caller reaches the hook");
    assert_eq!(reloc::slots_of(c"mhr_absent"), 1);
    for &f in &calls {
        // SAFETY: as above.
        assert_eq!(unsafe { f(1) }, -2, "the loader's 0 kept");
    }
    reloc::uninstall();
    // SAFETY: as above.
    assert_eq!(unsafe { call_caller(2) }, 6, "restored");
    let _ = std::fs::remove_dir_all(&dir);
}

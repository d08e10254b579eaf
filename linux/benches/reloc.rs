//! Reloc install time over a process with about 300 loaded shared objects.
//!
//! `cargo bench -p memhook --bench reloc`
//!
//! Setup builds (with cc) a library defining `mhb_f0`..`mhb_f29` and a
//! caller library that calls each through its PLT, then loads 300 copies of
//! the caller (distinct files, so distinct objects), all `RTLD_LOCAL`, so
//! originals come from bound slots. `install/30_symbols`
//! times one `reloc::install` of all 30 (one pass over every object's
//! relocations; the uninstall between samples is not timed). With the
//! `bistro` feature, `install/host_hooks_bistro` times `memhook::install`
//! of the host hooks alone in bistro mode in the same process: thirteen
//! patches and, to follow the loader's `dlopen`/`dlclose`, four more (of
//! the loader's functions) and a look at every object's program headers
//! (no pass over their relocations; the CUDA hooks, when on, make that
//! pass); `cargo bench -p memhook --features bistro --bench reloc`.
//!
//! `dlopen/*` times what memhook's interposed `dlopen` and `dlclose` add:
//! a `dlopen(RTLD_NOLOAD)` + `dlclose` of a loaded library from one of the
//! caller libraries, by path and by bare name (the callers have a
//! `DT_RUNPATH`, so a bare name goes on to glibc with the caller's return
//! address and is scanned before the `dlclose`), without memhook's hooks
//! and with the host hooks installed (reloc mode: the same dl hooks as in
//! any mode), in turn in the same process.
#![cfg(target_arch = "x86_64")]

use std::ffi::CString;
use std::process::Command;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use memhook::reloc;

#[cfg(feature = "bistro")]
#[path = "common/installs.rs"]
mod installs;

const SYMBOLS: usize = 30;
const COPIES: usize = 300;

extern "C" fn never_called() {}

fn setup() -> usize {
    let dir = std::env::temp_dir().join(format!("memhook-reloc-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cc = |name: &str, src: String, extra: &[&str]| {
        let c = dir.join(format!("{name}.c"));
        std::fs::write(&c, src).unwrap();
        let out = dir.join(format!("lib{name}.so"));
        let ok = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&out)
            .arg(&c)
            .arg(format!("-L{}", dir.display()))
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .args(extra)
            .status()
            .unwrap()
            .success();
        assert!(ok, "cc {name}");
        out
    };
    let defs: String = (0..SYMBOLS)
        .map(|i| format!("int mhb_f{i}(int a) {{ return a + {i}; }}\n"))
        .collect();
    cc("mhb_target", defs, &[]);
    let decls: String = (0..SYMBOLS).map(|i| format!("int mhb_f{i}(int);\n")).collect();
    let body: String = (0..SYMBOLS).map(|i| format!("s += mhb_f{i}(a);\n")).collect();
    let reopen = "#include <dlfcn.h>\nint mhb_reopen(const char *name) {\n\
        void *h = dlopen(name, RTLD_NOW | RTLD_NOLOAD);\n return h ? dlclose(h) : -1; }\n";
    let caller = cc(
        "mhb_caller",
        format!("{decls}{reopen}int mhb_sum(int a) {{ int s = 0;\n{body}return s; }}\n"),
        &["-lmhb_target", "-ldl"],
    );
    let target = dir.join("libmhb_target.so");
    let mut reopen = 0;
    for i in 0..COPIES {
        let copy = dir.join(format!("libmhb_caller{i}.so"));
        std::fs::copy(&caller, &copy).unwrap();
        let p = CString::new(copy.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path to a library just built.
        let h = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null());
        if i == 0 {
            // SAFETY: a live handle and a NUL-terminated name.
            reopen = unsafe { libc::dlsym(h, c"mhb_reopen".as_ptr()) } as usize;
            assert_ne!(reopen, 0);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    REOPEN.store(reopen, std::sync::atomic::Ordering::Relaxed);
    *TARGET.lock().unwrap() = Some(CString::new(target.to_str().unwrap()).unwrap());
    let mut objects = 0;
    // SAFETY: counting objects; the callback only increments.
    unsafe extern "C" fn count(_: *mut libc::dl_phdr_info, _: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: data is the counter below.
        unsafe { *(data as *mut usize) += 1 };
        0
    }
    // SAFETY: a valid callback and a counter that outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(count), (&mut objects as *mut usize).cast()) };
    objects
}

type Hook = (&'static std::ffi::CStr, usize, &'static AtomicUsize);

/// The first caller copy's `mhb_reopen`, and the target library's path.
static REOPEN: AtomicUsize = AtomicUsize::new(0);
static TARGET: std::sync::Mutex<Option<CString>> = std::sync::Mutex::new(None);

/// `mhb_reopen(name)` from the first caller copy: 0 when the library was
/// loaded and closed again.
fn reopen(name: &std::ffi::CStr) -> i32 {
    let f = REOPEN.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: mhb_reopen has this signature; `name` is NUL-terminated.
    unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*const libc::c_char) -> i32>(f)(name.as_ptr()) }
}

fn names() -> [Hook; SYMBOLS] {
    std::array::from_fn(|i| {
        let name: &'static std::ffi::CStr = Box::leak(CString::new(format!("mhb_f{i}")).unwrap().into_boxed_c_str());
        let original: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        (name, never_called as *const () as usize, original)
    })
}

fn install(c: &mut Criterion) {
    let objects = setup();
    let hooks = names();
    println!("loaded objects: {objects}");
    let mut g = c.benchmark_group("install");
    g.sample_size(20);
    g.bench_function("30_symbols", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                // SAFETY: the hooks are never called: nothing calls mhb_f*.
                unsafe { reloc::install(&hooks) }.unwrap();
                total += t.elapsed();
                assert_eq!(reloc::slots_of(hooks[0].0), COPIES);
                reloc::uninstall();
            }
            total
        })
    });
    #[cfg(feature = "bistro")]
    g.bench_function("host_hooks_bistro", |b| {
        use memhook::config::{HookConfig, HookMode, ModeSet};
        let config = memhook::Config {
            hooks: HookConfig {
                mmap: ModeSet::of(&[HookMode::Bistro]),
                cuda: ModeSet::NONE,
            },
        };
        b.iter_custom(|iters| {
            installs::timed(iters, &config, || {
                assert!(memhook::status().iter().all(|s| s.installed));
            })
        })
    });
    g.finish();
}

fn dlopen(c: &mut Criterion) {
    use memhook::config::{HookConfig, HookMode, ModeSet};
    let target = TARGET.lock().unwrap().clone().expect("install's setup ran");
    let host = memhook::Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Reloc]),
            cuda: ModeSet::NONE,
        },
    };
    let mut g = c.benchmark_group("dlopen");
    g.sample_size(20);
    for (name, file) in [("path", target.as_c_str()), ("bare", c"libmhb_target.so")] {
        for hooked in [false, true] {
            if hooked {
                memhook::install(&host);
            } else {
                memhook::uninstall();
            }
            let id = format!("{name}_{}", if hooked { "hooked" } else { "unhooked" });
            g.bench_function(id, |b| b.iter(|| assert_eq!(reopen(file), 0)));
        }
    }
    memhook::uninstall();
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = install, dlopen
}
criterion_main!(benches);

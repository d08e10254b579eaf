//! Forks and the loader's lock over its objects (glibc's
//! `dl_load_write_lock`, see `memhook::fork`): a child forked while another
//! thread walked the objects finds it let go; one forked amid another
//! thread's change of them finds it held for good, and memhook's entries
//! of the loader's functions skip their walks there. A process of their
//! own: how often a fork lands amid a change depends on how long
//! memhook's own work around each `dlopen` takes, which a process that
//! opened loader namespaces before (the host tests') makes longer.
#![cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use memhook::Config;
use memhook::config::{HookConfig, HookMode, ModeSet};

#[path = "../../tests/src/cc.rs"]
mod cc;
mod common;
use common::{build_library, load_and_call, wait_for_child};

/// The tests fork and install: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// memhook installed (host hooks in bistro mode: glibc's `dlopen`,
/// `dlsym`, `dlvsym` and `dlclose` patched to memhook's entries) until
/// dropped.
struct Installed;

impl Installed {
    fn bistro() -> Installed {
        memhook::install(&BISTRO);
        Installed
    }
}

/// The host hooks in bistro mode, the CUDA hooks off.
const BISTRO: Config = Config {
    hooks: HookConfig {
        mmap: ModeSet::of(&[HookMode::Bistro]),
        cuda: ModeSet::NONE,
    },
};

impl Drop for Installed {
    fn drop(&mut self) {
        memhook::uninstall();
    }
}

/// A library of one function, `int {name}(void) { return {answer}; }`,
/// built in a directory of this process's: the directory, and the
/// library's path.
fn library(name: &str, answer: i32) -> (std::path::PathBuf, CString) {
    let dir = std::env::temp_dir().join(format!("memhook-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = build_library(&dir, name, &format!("int {name}(void) {{ return {answer}; }}\n"), &[]);
    (dir, CString::new(path.to_str().unwrap()).unwrap())
}

/// What [`fork_children`] counted.
struct Forks {
    made: u32,
    hung: u32,
    /// Children whose `child` answered `Some(true)`.
    marked: u32,
}

/// Forks children while `more` says so (given the counts so far and the
/// time since the first); each runs `child`, which answers `None` where
/// its calls failed (the test fails, saying `failed`), else whether it
/// found what the test looks for. A child not exited within 5 s is killed
/// and counted hung.
fn fork_children(
    more: impl Fn(&Forks, std::time::Duration) -> bool,
    child: impl Fn() -> Option<bool>,
    failed: &str,
) -> Forks {
    let mut counts = Forks {
        made: 0,
        hung: 0,
        marked: 0,
    };
    let start = std::time::Instant::now();
    while more(&counts, start.elapsed()) {
        counts.made += 1;
        // SAFETY: the child runs `child` and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = child().map_or(2, i32::from);
            // SAFETY: leaving the child without the parent's atexit.
            unsafe { libc::_exit(code) };
        }
        assert!(pid > 0, "fork failed");
        match wait_for_child(pid, std::time::Duration::from_secs(5)) {
            None => counts.hung += 1,
            Some(status) => {
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) < 2,
                    "child status {status:#x} (exit 2: {failed})"
                );
                counts.marked += libc::WEXITSTATUS(status) as u32;
            }
        }
    }
    counts
}

/// Opens libc (loaded already), looks `malloc` up in it and closes it,
/// through memhook's entries of the three.
fn look_into_libc() -> bool {
    // SAFETY: NUL-terminated names; the handle is closed once.
    unsafe {
        let handle = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW);
        !handle.is_null() && !libc::dlsym(handle, c"malloc".as_ptr()).is_null() && libc::dlclose(handle) == 0
    }
}

unsafe extern "C" fn count_objects(
    _: *mut libc::dl_phdr_info,
    _: libc::size_t,
    data: *mut core::ffi::c_void,
) -> libc::c_int {
    // SAFETY: the caller passes a usize that outlives the walk.
    unsafe { *data.cast::<usize>() += 1 };
    0
}

/// A child forked while other threads walk the loaded objects without
/// pause (`dl_iterate_phdr`, as unwinders do: the loader's own work, which
/// no fork waits for) loads a library of its own: memhook lets go the
/// loader's lock over its objects that the fork left held, where glibc
/// alone leaves it held for good and the child hangs at its `dlopen`.
/// Installed, as a program that embeds memhook is. (Amid a change of the
/// objects, a `dlopen` or `dlclose` on another thread, the lock stays
/// held: a child forked then hangs at its next walk as without memhook,
/// 10 to 18 of 100 beside a thread loading and unloading a library;
/// `memhook::fork`'s docs.)
#[test]
fn a_child_forked_while_other_threads_walk_the_loaded_objects_loads_a_library() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !memhook::fork::loader_lock_found() {
        eprintln!("skipped: the loader's lock over its objects was not found (glibc before 2.35?)");
        return;
    }
    let (dir, own) = library("mhfw", 2);
    let _installed = Installed::bistro();
    let stop = Arc::new(AtomicBool::new(false));
    let walkers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut objects = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: `count_objects` adds to the usize passed.
                    unsafe { libc::dl_iterate_phdr(Some(count_objects), (&raw mut objects).cast()) };
                }
                objects
            })
        })
        .collect();
    let forks = fork_children(
        |f, t| f.made < 100 || t < std::time::Duration::from_millis(500),
        || load_and_call(&own, c"mhfw", 2).then(memhook::fork::loader_lock_let_go),
        "its library did not load and answer",
    );
    stop.store(true, Ordering::Relaxed);
    for walker in walkers {
        assert!(walker.join().unwrap() > 0);
    }
    let Forks { made, hung, marked } = forks;
    assert_eq!(hung, 0, "children that hung, of {made}");
    assert!(
        marked > 0,
        "no fork of {made} came while the loader's lock was held: the release went untested"
    );
    assert!(!memhook::fork::loader_lock_let_go(), "the parent lets nothing go");
    eprintln!("{marked} of {made} children found the loader's lock held and let it go");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child forked amid another thread's change of the loaded objects
/// finds the loader's lock over them held for good
/// (`memhook::fork::loader_lock_stuck`): its `dlopen` of a library
/// already loaded, its `dlsym` (`RTLD_NEXT` of a hooked function too) and
/// its `dlclose` go through memhook's entries, as they would without
/// memhook, where memhook's walks in them waited for good. The change is
/// made to stand still: a thread inside a walk (holding the lock) sets the
/// main namespace's `r_state` to `RT_DELETE`, as a `dlclose` leaves it
/// while it unmaps, until the fork is made.
#[test]
fn a_child_forked_amid_a_change_of_the_loaded_objects_opens_a_loaded_library() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !memhook::fork::loader_lock_found() {
        eprintln!("skipped: the loader's lock over its objects was not found (glibc before 2.35?)");
        return;
    }
    /// The loader's `r_debug` (this program is position-independent: the
    /// loader's own), and the walk's flags: inside, hold.
    static R_DEBUG: AtomicUsize = AtomicUsize::new(0);
    static INSIDE: AtomicBool = AtomicBool::new(false);
    static HOLD: AtomicBool = AtomicBool::new(true);
    unsafe extern "C" fn amid_a_change(
        _: *mut libc::dl_phdr_info,
        _: libc::size_t,
        _: *mut core::ffi::c_void,
    ) -> libc::c_int {
        // SAFETY: `r_state`, an int at offset 24 of the loader's r_debug,
        // which the loader changes only under the lock this walk holds
        // (or under its other lock, which no thread takes meanwhile: the
        // test is alone, SERIAL).
        let state = unsafe { &*((R_DEBUG.load(Ordering::SeqCst) + 24) as *const AtomicU32) };
        assert_eq!(state.swap(2, Ordering::SeqCst), 0, "RT_CONSISTENT before");
        INSIDE.store(true, Ordering::SeqCst);
        while HOLD.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        state.store(0, Ordering::SeqCst);
        1
    }
    // SAFETY: a NUL-terminated name.
    R_DEBUG.store(
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_r_debug".as_ptr()) } as usize,
        Ordering::SeqCst,
    );
    assert_ne!(R_DEBUG.load(Ordering::SeqCst), 0);
    let _installed = Installed::bistro();
    let changer = std::thread::spawn(|| {
        // SAFETY: `amid_a_change` uses only the statics.
        unsafe { libc::dl_iterate_phdr(Some(amid_a_change), core::ptr::null_mut()) };
    });
    while !INSIDE.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    // SAFETY: the child makes the calls below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let stuck = memhook::fork::loader_lock_stuck() && !memhook::fork::loader_lock_let_go();
        let looked = look_into_libc();
        // SAFETY: RTLD_NEXT and a NUL-terminated name.
        let next = !unsafe { libc::dlsym(libc::RTLD_NEXT, c"mmap".as_ptr()) }.is_null();
        memhook::refresh();
        // The same install again changes nothing, and the status is
        // kept: neither walks.
        memhook::install(&BISTRO);
        let installed = memhook::status().iter().any(|f| f.function == "mmap" && f.installed);
        let code = i32::from(!stuck) | i32::from(!looked) << 1 | i32::from(!next) << 2 | i32::from(!installed) << 3;
        // SAFETY: leaving the child without the parent's atexit.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "fork failed");
    let status = wait_for_child(pid, std::time::Duration::from_secs(10));
    HOLD.store(false, Ordering::SeqCst);
    changer.join().unwrap();
    let status = status.expect("the child hung");
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x} (exit 1: the lock not taken for stuck, 2: dlopen/dlsym/dlclose failed, 4: dlsym(RTLD_NEXT) failed, 8: not installed)"
    );
    assert!(!memhook::fork::loader_lock_stuck());
}

/// Children forked while another thread loads and unloads a library
/// without pause: those forked amid a change of the objects find the
/// loader's lock held for good (`loader_lock_stuck`), and their `dlopen`
/// of a library already loaded, `dlsym` and `dlclose` go through
/// memhook's entries all the same. Before memhook skipped its walks
/// there, 13 and 16 children of 100 hung so (two runs); glibc alone walks
/// nothing in these calls.
#[test]
fn children_forked_amid_another_threads_loads_and_unloads_open_a_loaded_library() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !memhook::fork::loader_lock_found() {
        eprintln!("skipped: the loader's lock over its objects was not found (glibc before 2.35?)");
        return;
    }
    let (dir, other) = library("mhfx", 1);
    let _installed = Installed::bistro();
    let stop = Arc::new(AtomicBool::new(false));
    let loader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                assert!(load_and_call(&other, c"mhfx", 1));
            }
        })
    };
    let forks = fork_children(
        |f, t| f.made < 100 || (f.marked == 0 && t < std::time::Duration::from_secs(30)),
        || {
            let kept = memhook::fork::loader_lock_stuck();
            // SAFETY: RTLD_NEXT and a NUL-terminated name.
            let next = !unsafe { libc::dlsym(libc::RTLD_NEXT, c"mmap".as_ptr()) }.is_null();
            (look_into_libc() && next).then_some(kept)
        },
        "dlopen/dlsym/dlclose failed",
    );
    stop.store(true, Ordering::Relaxed);
    loader.join().unwrap();
    let Forks { made, hung, marked } = forks;
    assert_eq!(hung, 0, "children that hung, of {made}");
    assert!(
        marked > 0,
        "no fork of {made} came amid a change: the skipped walks went untested"
    );
    eprintln!("{marked} of {made} children found the loader's lock held for good and went through");
    let _ = std::fs::remove_dir_all(&dir);
}

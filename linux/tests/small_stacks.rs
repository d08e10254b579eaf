//! The hooks run on whatever thread calls the hooked function, whatever
//! its stack: a thread made with a small stack (`pthread_attr_setstacksize`,
//! as some libraries make their workers) loads and unloads libraries,
//! looks symbols up (`RTLD_NEXT` of a hooked name among them) and maps
//! memory with the host hooks installed in bistro mode and a handler
//! registered; and an install and uninstall run on such a thread, as an
//! install from inside a hook does (a CUDA library's late load, an
//! allocator's first allocation). A stack overflow kills the test binary.
//!
//! Least stack, measured with a probe (the thread's stack size taken from
//! the environment, halved until the test overflows). Before the thirtieth
//! session `dlsym`'s interposition reserved a copy of every loaded
//! object's entry, 160 KiB, at every call, and the 32 KiB object listing
//! that only glibc before 2.35 needs was reserved in every frame that
//! might list; until the thirty-first, the rescan after a `dlopen` or
//! `dlclose` kept a list of every object gone (32 KiB) in its frame; until
//! the thirty-second, an uninstall kept a second list of the patches it
//! could not undo in other namespaces (36 KiB):
//!
//! | path | release | unoptimised (these tests) |
//! | --- | --- | --- |
//! | `dlopen`, `dlsym`, `dlclose` through the hooks | 16 KiB or less, Rust's least (48 before the thirty-first session, 192 before the thirtieth) | 16 KiB or less (96, 192) |
//! | install of the host hooks (reloc, then bistro) and uninstall | 48 KiB (44 before the forty-first session, whose batches of 80 keep their bookkeeping off the stack; 40 before the thirty-fourth, which added the look at other threads around a batch's locks; 64 before the thirty-second, 208 before the thirtieth) | 56 KiB (98, 94, 104, 144) |
//!
//! The hooks' thread gets 64 KiB and the install's 100 KiB: each test
//! fails with the code before (the install's with the second list of
//! patches kept; the hooks' with the 32 KiB list). Each runs twice, the
//! second time as under a glibc before 2.35, whose listing of the loaded
//! objects (32 KiB of ids) lay on the listing thread's stack until the
//! sixty-third session: both threads overflowed then (found under glibc
//! 2.31); it now lies in a room off every stack.
#![cfg(all(feature = "bistro", target_arch = "x86_64"))]

use std::sync::atomic::{AtomicUsize, Ordering};

use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

static MAPPED: AtomicUsize = AtomicUsize::new(0);

/// The tests install and uninstall: they take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn count(e: &mut Event) {
    if let Event::VmMapped(_) = *e {
        MAPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Each test runs its thread twice: with glibc's `_dl_find_object` where
/// this glibc has it (2.35 and later), and with the listing of the loaded
/// objects that an older glibc gets (`reloc::use_find_object(false)`),
/// whose 32 KiB of ids lie off the stack.
fn with_and_without_find_object(mut f: impl FnMut()) {
    /// Gives the next test `_dl_find_object` back, this one passing or not.
    struct FindObjectBack;
    impl Drop for FindObjectBack {
        fn drop(&mut self) {
            memhook::reloc::use_find_object(true);
        }
    }
    let _back = FindObjectBack;
    for find_object in [true, false] {
        memhook::reloc::use_find_object(find_object);
        f();
    }
}

#[test]
fn hooks_run_on_a_thread_with_a_64_kib_stack() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    with_and_without_find_object(hooks_on_a_64_kib_stack);
}

fn hooks_on_a_64_kib_stack() {
    MAPPED.store(0, Ordering::Relaxed);
    memhook::install(&Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Bistro]),
            cuda: ModeSet::NONE,
        },
    });
    // (Pending: a function whose library is not loaded yet, hooked as it
    // loads: shm_open, in librt before glibc 2.34.)
    assert!(memhook::status().iter().all(|s| s.installed || s.pending));
    let id = memhook::set_handler(bits::VM_MAPPED | bits::VM_UNMAPPED, 0, HandlerFn::Rust(&count)).unwrap();
    let worker = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(|| {
            let mut loaded = 0;
            for lib in [c"libm.so.6", c"libz.so.1", c"libutil.so.1", c"libresolv.so.2"] {
                // SAFETY: NUL-terminated names; each handle is closed once.
                unsafe {
                    let h = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW);
                    if h.is_null() {
                        continue;
                    }
                    loaded += 1;
                    assert!(!libc::dlsym(h, c"mmap".as_ptr()).is_null());
                    assert!(!libc::dlsym(libc::RTLD_NEXT, c"mmap".as_ptr()).is_null());
                    assert_eq!(libc::dlclose(h), 0);
                }
                // SAFETY: a fresh anonymous mapping, unmapped at once.
                unsafe {
                    let p = libc::mmap(
                        std::ptr::null_mut(),
                        1 << 20,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    );
                    assert_ne!(p, libc::MAP_FAILED);
                    assert_eq!(libc::munmap(p, 1 << 20), 0);
                }
            }
            loaded
        })
        .unwrap();
    let loaded = worker.join().unwrap();
    memhook::unset_handler(id).unwrap();
    memhook::uninstall();
    assert!(loaded >= 1, "no library to load");
    assert!(MAPPED.load(Ordering::Relaxed) >= 4, "the mappings were reported");
}

/// Installs of the host hooks in reloc mode, then in bistro mode, and an
/// uninstall, on a thread with a 100 KiB stack (see the module's table).
#[test]
fn install_runs_on_a_thread_with_a_100_kib_stack() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    with_and_without_find_object(install_on_a_100_kib_stack);
}

fn install_on_a_100_kib_stack() {
    let worker = std::thread::Builder::new()
        .stack_size(100 * 1024)
        .spawn(|| {
            let before = memhook::code::serializations();
            memhook::install(&Config {
                hooks: HookConfig {
                    mmap: ModeSet::of(&[HookMode::Reloc]),
                    cuda: ModeSet::NONE,
                },
            });
            memhook::install(&Config {
                hooks: HookConfig {
                    mmap: ModeSet::of(&[HookMode::Bistro]),
                    cuda: ModeSet::NONE,
                },
            });
            memhook::uninstall();
            memhook::code::serializations() - before
        })
        .unwrap();
    assert!(worker.join().unwrap() > 0, "the bistro install patched and unpatched");
}

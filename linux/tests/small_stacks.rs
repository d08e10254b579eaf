//! The hooks run on whatever thread calls the hooked function, whatever
//! its stack: a thread made with a small stack (`pthread_attr_setstacksize`,
//! as some libraries make their workers) loads and unloads libraries,
//! looks symbols up (`RTLD_NEXT` of a hooked name among them) and maps
//! memory with the host hooks installed in bistro mode and a handler
//! registered. A stack overflow there kills the test binary. The thread
//! gets 128 KiB: what this unoptimised build needs is 96 KiB (192 before
//! the thirtieth session: a copy of every loaded object's entry in
//! `dlsym`'s interposition, and the 32 KiB object listing only glibc
//! before 2.35 needs); a release build needs 48 KiB (192 before).
#![cfg(all(feature = "bistro", target_arch = "x86_64"))]

use std::sync::atomic::{AtomicUsize, Ordering};

use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

static MAPPED: AtomicUsize = AtomicUsize::new(0);

fn count(e: &mut Event) {
    if let Event::VmMapped(_) = *e {
        MAPPED.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn hooks_run_on_a_thread_with_a_128_kib_stack() {
    memhook::install(&Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Bistro]),
            cuda: ModeSet::NONE,
        },
    });
    assert!(memhook::status().iter().all(|s| s.installed));
    let id = memhook::set_handler(bits::VM_MAPPED | bits::VM_UNMAPPED, 0, HandlerFn::Rust(&count)).unwrap();
    let worker = std::thread::Builder::new()
        .stack_size(128 * 1024)
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

//! A host function no loaded object defines at the install is listed
//! pending, and bistro patches it the moment a library that defines it is
//! loaded: glibc before 2.34 keeps `shm_open` in librt, which a program
//! may load after it installs memhook (a plugin that links it). A process
//! of its own: nothing in it loads librt before the test does. With glibc
//! 2.34 and later `shm_open` is libc's, installed at once, and the late
//! load is not checked here.
#![cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]

use std::ffi::CString;
use std::sync::Mutex;

use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

const BISTRO: Config = Config {
    hooks: HookConfig {
        mmap: ModeSet::of(&[HookMode::Bistro]),
        cuda: ModeSet::NONE,
    },
};

/// `VM_UNMAPPED` events seen: (address, length).
static UNMAPPED: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

fn record(e: &mut Event) {
    if let Event::VmUnmapped(v) = *e {
        UNMAPPED.lock().unwrap().push((v.address, v.size));
    }
}

fn shm_open_entry() -> Option<memhook::FunctionStatus> {
    memhook::status()
        .into_iter()
        .find(|s| s.function == "shm_open" && s.mode == HookMode::Bistro)
}

type ShmOpen = unsafe extern "C" fn(*const libc::c_char, libc::c_int, libc::mode_t) -> libc::c_int;
type ShmUnlink = unsafe extern "C" fn(*const libc::c_char) -> libc::c_int;

#[test]
fn a_host_function_whose_library_loads_after_the_install_is_hooked_then() {
    // SAFETY: a NUL-terminated name and the pseudo-handle RTLD_DEFAULT.
    let defined = !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"shm_open".as_ptr()) }.is_null();
    memhook::install(&BISTRO);
    let entry = shm_open_entry().expect("shm_open listed");
    if defined {
        assert!(entry.installed, "{entry:?}");
        memhook::uninstall();
        eprintln!("skipped: shm_open is defined before the install (libc's since glibc 2.34)");
        return;
    }
    assert!(!entry.installed && entry.pending, "{entry:?}");
    assert_eq!(entry.library, "librt.so.1");
    let id = memhook::set_handler(bits::VM_UNMAPPED, 0, HandlerFn::Rust(&record)).unwrap();

    // SAFETY: a NUL-terminated name; the handle stays open.
    let rt = unsafe { libc::dlopen(c"librt.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!rt.is_null(), "librt.so.1 loads");
    let entry = shm_open_entry().expect("shm_open listed");
    assert!(entry.installed && !entry.pending, "hooked as librt loaded: {entry:?}");
    assert_eq!(entry.library, "librt.so.1");

    // SAFETY: librt's own functions, by their names, with their signatures.
    let (shm_open, shm_unlink): (ShmOpen, ShmUnlink) = unsafe {
        (
            std::mem::transmute::<*mut libc::c_void, ShmOpen>(libc::dlsym(rt, c"shm_open".as_ptr())),
            std::mem::transmute::<*mut libc::c_void, ShmUnlink>(libc::dlsym(rt, c"shm_unlink".as_ptr())),
        )
    };
    let name = CString::new(format!("/memhook-late-{}", std::process::id())).unwrap();
    let page = 4096;
    // SAFETY: a new shared memory object of this test's, sized, mapped,
    // opened again with O_TRUNC (which takes the mapping's page), then
    // unmapped and removed.
    unsafe {
        let fd = shm_open(name.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600);
        assert!(fd >= 0, "shm_open");
        assert_eq!(libc::ftruncate(fd, page as libc::off_t), 0);
        let p = libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::close(fd);
        UNMAPPED.lock().unwrap().clear();
        let again = shm_open(name.as_ptr(), libc::O_RDWR | libc::O_TRUNC, 0o600);
        assert!(again >= 0, "shm_open O_TRUNC");
        libc::close(again);
        let seen = std::mem::take(&mut *UNMAPPED.lock().unwrap());
        assert_eq!(seen, [(p as usize, page)], "the truncation's unmap, once");
        libc::munmap(p, page);
        shm_unlink(name.as_ptr());
    }
    memhook::unset_handler(id).unwrap();
    memhook::uninstall();
    assert!(memhook::status().is_empty());
}

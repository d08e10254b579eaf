//! memhook where the kernel refuses `membarrier` (a kernel before 4.16, or
//! a container's seccomp filter): the test runs itself again in a child
//! under a seccomp filter that answers `ENOSYS` to `membarrier`, from
//! before the child's first instruction (memhook registers at load). There
//! bistro serialises by signalling the other running threads (threads
//! spin meanwhile: each serialisation must reach them by signal, none
//! fall back), and, where the program handles both signals memhook can
//! use, by grace waits of 2 ms; dispatch readers use the shared counters.
//! The host hooks must install, report and uninstall as anywhere else, in
//! one batch of patches (the host functions and the loader's four).
#![cfg(all(feature = "bistro", target_arch = "x86_64"))]

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use memhook::code::Serialization;
use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

const CHILD: &str = "MEMHOOK_TEST_NO_MEMBARRIER";

/// `AUDIT_ARCH_X86_64`: the filter answers only this architecture's calls.
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;

/// Makes the calling process (a child about to exec) get `ENOSYS` from
/// every `membarrier` call, itself and whatever it executes.
fn refuse_membarrier() -> std::io::Result<()> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let filter = [
        // seccomp_data.arch, then .nr
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4),
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jump(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            libc::SYS_membarrier as u32,
            0,
            1,
        ),
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: prctl with the documented arguments; `program` and the
    // filter it points to outlive the call, which copies them.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

static MAPPED: AtomicUsize = AtomicUsize::new(0);
static UNMAPPED: AtomicUsize = AtomicUsize::new(0);
const LEN: usize = 3 << 20;

fn count(e: &mut Event) {
    match *e {
        Event::VmMapped(v) if v.size == LEN => {
            MAPPED.fetch_add(1, Ordering::SeqCst);
        }
        Event::VmUnmapped(v) if v.size == LEN => {
            UNMAPPED.fetch_add(1, Ordering::SeqCst);
        }
        _ => {}
    }
}

/// The first bytes of the C library's own entry of `name` (not what the
/// global scope finds first: an AddressSanitizer build defines `mmap`).
fn entry_bytes(name: &std::ffi::CStr) -> [u8; 16] {
    // SAFETY: NUL-terminated names; RTLD_NOLOAD opens nothing new and
    // the handle goes back at once (libc stays loaded); the entry's
    // first bytes are code, readable.
    unsafe {
        let libc_handle = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        assert!(!libc_handle.is_null(), "libc.so.6 is loaded");
        let f = libc::dlsym(libc_handle, name.as_ptr());
        libc::dlclose(libc_handle);
        assert!(!f.is_null(), "libc.so.6 defines {name:?}");
        *(f as *const [u8; 16])
    }
}

/// Maps and unmaps `LEN` bytes once.
fn map_and_unmap() {
    // SAFETY: a fresh anonymous mapping, unmapped at once.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(libc::munmap(p, LEN), 0);
    }
}

/// What the child checks, under the filter.
fn child() {
    assert_eq!(
        memhook::code::serialization(),
        Serialization::Signals,
        "the filter refuses membarrier"
    );
    assert!(
        !memhook::dispatch::reader_slots(),
        "readers fall back to the shared counters"
    );
    let before = entry_bytes(c"mmap");
    let config = Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Bistro]),
            cuda: ModeSet::NONE,
        },
    };
    // Two threads run meanwhile, one mapping and unmapping all along.
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..2)
        .map(|n| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut spins = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if n == 0 {
                        map_and_unmap();
                    }
                    spins = std::hint::black_box(spins + 1);
                }
                spins
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    // A thread that waits for a core through a serialisation's whole
    // wait (beside busy processes) answers no signal then, and needs
    // none: it runs the handler before its own code. So an install with
    // no answer is made again (uninstalled first), up to five times.
    let mut installs = 0;
    let (took, signals, answered) = loop {
        installs += 1;
        let serialized = memhook::code::serializations();
        let (by_signal, signals, answers) = memhook::code::serializations_by_signal();
        let started = Instant::now();
        memhook::install(&config);
        let took = started.elapsed();
        let status = memhook::status();
        // (Pending: a function whose library is not loaded yet, hooked as it
        // loads: shm_open, in librt before glibc 2.34.)
        assert!(
            !status.is_empty() && status.iter().all(|s| s.installed || s.pending),
            "{status:?}"
        );
        // The host functions and the loader's four in one batch; each
        // serialisation by signals, none by a grace wait.
        let (by_signal_now, signals_now, answers_now) = memhook::code::serializations_by_signal();
        assert_eq!(memhook::code::serializations() - serialized, 3);
        assert_eq!(by_signal_now - by_signal, 3, "every serialisation by signals");
        assert!(signals_now > signals, "the running threads were signalled");
        assert_ne!(entry_bytes(c"mmap"), before, "patched");
        if answers_now > answers || installs == 5 {
            break (took, signals_now - signals, answers_now - answers);
        }
        memhook::uninstall();
        assert_eq!(entry_bytes(c"mmap"), before, "uninstall restores the bytes");
    };
    assert!(
        answered > 0,
        "a thread on the other core answered (in {installs} installs)"
    );
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        assert!(s.join().unwrap() > 0);
    }

    let id = memhook::set_handler(bits::VM_MAPPED | bits::VM_UNMAPPED, 0, HandlerFn::Rust(&count)).unwrap();
    map_and_unmap();
    // Unregistering waits for no reader slot (the shared counters).
    memhook::unset_handler(id).unwrap();
    assert_eq!((MAPPED.load(Ordering::SeqCst), UNMAPPED.load(Ordering::SeqCst)), (1, 1));

    let serialized = memhook::code::serializations();
    memhook::uninstall();
    assert_eq!(memhook::code::serializations() - serialized, 3);
    assert_eq!(entry_bytes(c"mmap"), before, "uninstall restores the bytes");

    // Again with no other thread running: what the serialisations cost.
    let started = Instant::now();
    memhook::install(&config);
    let quiet = started.elapsed();
    // (Pending: a function whose library is not loaded yet, hooked as it
    // loads: shm_open, in librt before glibc 2.34.)
    assert!(memhook::status().iter().all(|s| s.installed || s.pending));
    memhook::uninstall();

    // The program handles both signals memhook can use: grace waits.
    extern "C" fn own(_: libc::c_int) {}
    for signal in [libc::SIGURG, libc::SIGWINCH] {
        // SAFETY: a handler that does nothing, for signals nobody sends.
        let was = unsafe { libc::signal(signal, own as *const () as usize) };
        assert_ne!(was, libc::SIG_ERR);
    }
    let (by_signal, ..) = memhook::code::serializations_by_signal();
    let started = Instant::now();
    memhook::install(&config);
    let waited = started.elapsed();
    // (Pending: a function whose library is not loaded yet, hooked as it
    // loads: shm_open, in librt before glibc 2.34.)
    assert!(memhook::status().iter().all(|s| s.installed || s.pending));
    assert_eq!(
        memhook::code::serializations_by_signal().0,
        by_signal,
        "no serialisation by signals"
    );
    assert_ne!(entry_bytes(c"mmap"), before, "patched");
    memhook::uninstall();
    assert_eq!(entry_bytes(c"mmap"), before, "uninstall restores the bytes");
    println!(
        "child: ok; install by signals {:.2} ms beside two running threads ({} signals, {} answered), \
         {:.2} ms alone; by grace waits of {} ms {:.2} ms",
        took.as_secs_f64() * 1e3,
        signals,
        answered,
        quiet.as_secs_f64() * 1e3,
        memhook::code::GRACE_WAIT_NS / 1_000_000,
        waited.as_secs_f64() * 1e3,
    );
}

#[test]
fn host_hooks_work_where_membarrier_is_refused() {
    if std::env::var_os(CHILD).is_some() {
        child();
        return;
    }
    let out = {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", "host_hooks_work_where_membarrier_is_refused", "--nocapture"])
            .env(CHILD, "1");
        // SAFETY: between fork and exec the closure makes two prctl calls
        // and allocates nothing.
        unsafe { command.pre_exec(refuse_membarrier) };
        command.output().expect("the test runs itself under the filter")
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let line = stdout.lines().find(|l| l.starts_with("child: ok")).unwrap_or_else(|| {
        panic!("the child ran no check:\n{stdout}\n{stderr}");
    });
    eprintln!("{line}");
}

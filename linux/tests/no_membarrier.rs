//! memhook where the kernel refuses `membarrier` (a kernel before 4.16, or
//! a container's seccomp filter): the test runs itself again in a child
//! under a seccomp filter that answers `ENOSYS` to `membarrier`, from
//! before the child's first instruction (memhook registers at load). There
//! bistro serialises by grace waits of 2 ms and dispatch readers use the
//! shared counters; the host hooks must install, report and uninstall as
//! anywhere else, in one batch of patches per library (a grace wait costs
//! what a hundred patches do).
#![cfg(all(feature = "bistro", target_arch = "x86_64"))]

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

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

fn entry_bytes(name: &std::ffi::CStr) -> [u8; 16] {
    // SAFETY: looking up and reading the first bytes of a libc function.
    unsafe { *(libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as *const [u8; 16]) }
}

/// What the child checks, under the filter.
fn child() {
    assert_eq!(
        memhook::code::serialization(),
        Serialization::GraceWait,
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
    let serialized = memhook::code::serializations();
    let started = Instant::now();
    memhook::install(&config);
    let took = started.elapsed();
    let status = memhook::status();
    assert!(!status.is_empty() && status.iter().all(|s| s.installed), "{status:?}");
    // The host functions in one batch, the loader's four in another.
    assert_eq!(memhook::code::serializations() - serialized, 6);
    assert_ne!(entry_bytes(c"mmap"), before, "patched");

    let id = memhook::set_handler(bits::VM_MAPPED | bits::VM_UNMAPPED, 0, HandlerFn::Rust(&count)).unwrap();
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
    // Unregistering waits for no reader slot (the shared counters).
    memhook::unset_handler(id).unwrap();
    assert_eq!((MAPPED.load(Ordering::SeqCst), UNMAPPED.load(Ordering::SeqCst)), (1, 1));

    let serialized = memhook::code::serializations();
    memhook::uninstall();
    assert_eq!(memhook::code::serializations() - serialized, 6);
    assert_eq!(entry_bytes(c"mmap"), before, "uninstall restores the bytes");
    println!(
        "child: ok; install {:.1} ms with grace waits of {} ms",
        took.as_secs_f64() * 1e3,
        memhook::code::GRACE_WAIT_NS / 1_000_000
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

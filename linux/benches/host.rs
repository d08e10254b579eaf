//! Host hook costs, each beside a baseline from the same run.
//!
//! `cargo bench -p memhook --bench host`
//!
//! - `mmap_munmap/unhooked` vs `mmap_munmap/hooked`: a 4 KiB anonymous
//!   mmap + munmap pair, plain, then with every bistro hook installed and
//!   one empty handler for all events (the added cost is the difference).
//! - `install/bistro_all_host`: installing every host hook (nineteen)
//!   in bistro mode (the uninstall between samples is not timed).
//! - `syscall/original` vs `syscall/hooked`: `syscall(SYS_getppid)`, a
//!   call the `syscall` hook passes on (as it does `futex`), through
//!   `host::original("syscall")` and through the hook, both with every
//!   hook installed and one empty handler for all events.
//! - `ioctl/original` vs `ioctl/hooked`: `ioctl(FIONREAD)` of a pipe, a
//!   request the `ioctl` hook passes on (as it does a driver's: all but
//!   userfaultfd's `UFFDIO_MOVE`), the same way.
//! - `madvise/original` vs `madvise/hooked`: `madvise(MADV_DONTNEED)` of
//!   a page of the bench's own (untouched, so the kernel's work is
//!   least), with every host hook installed and no handler: the hook's
//!   look at memhook's own pages (`memhook::kept`: a scan of the table of
//!   patched pages and trampoline regions, which the range misses) is
//!   what the hook adds.
//! - `open_truncate/unhooked` vs `open_truncate/hooked`: `open(O_TRUNC)`
//!   of a file of one byte (written again before each, untimed), then
//!   `close`: hooked with one empty `VM_UNMAPPED` handler, the hook looks
//!   at the file, which no mapping maps (the filter of mapped files
//!   answers); `open_truncate/hooked_mapped`: the same file mapped (a
//!   page, kept), whose mappings the hook then looks for over the
//!   process's mappings of files (`--bench maps` has that look alone),
//!   and reports unmapped.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group};
use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

#[path = "common/installs.rs"]
mod installs;
#[path = "../../core/benches/common/medians.rs"]
mod medians;

/// Criterion's default samples per benchmark.
const SAMPLES: usize = 100;

fn config() -> Config {
    Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Bistro]),
            cuda: ModeSet::NONE,
        },
    }
}

fn pair() {
    // SAFETY: an anonymous private mapping, unmapped right away.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        libc::munmap(black_box(p), 4096);
    }
}

fn empty(_: &mut Event) {}

fn mmap_munmap(c: &mut Criterion) {
    let mut g = c.benchmark_group("mmap_munmap");
    g.bench_function("unhooked", |b| {
        b.iter_custom(|iters| medians::timed("unhooked", iters, pair))
    });
    memhook::install(&config());
    assert!(memhook::status().iter().all(|s| s.installed));
    let id = memhook::set_handler(bits::ALL_EVENTS, 0, HandlerFn::Rust(&empty)).unwrap();
    g.bench_function("hooked", |b| {
        b.iter_custom(|iters| medians::timed("hooked", iters, pair))
    });
    memhook::unset_handler(id).unwrap();
    memhook::uninstall();
    g.finish();
}

/// A call a hook passes on to the original (libc's function `name`):
/// `original` makes it through the address `host::original(name)`
/// gives, `hooked` through the hook, both with every hook installed and
/// one empty handler for all events.
fn pass_through(c: &mut Criterion, name: &str, original: impl Fn(usize), hooked: impl Fn()) {
    let mut g = c.benchmark_group(name);
    memhook::install(&config());
    let id = memhook::set_handler(bits::ALL_EVENTS, 0, HandlerFn::Rust(&empty)).unwrap();
    let address = memhook::host::original(name).expect("hooked");
    let (as_original, as_hooked) = (format!("{name} original"), format!("{name} hooked"));
    g.bench_function("original", |b| {
        b.iter_custom(|iters| medians::timed(&as_original, iters, || original(address)))
    });
    g.bench_function("hooked", |b| {
        b.iter_custom(|iters| medians::timed(&as_hooked, iters, &hooked))
    });
    memhook::unset_handler(id).unwrap();
    memhook::uninstall();
    g.finish();
}

fn madvise_pass(c: &mut Criterion) {
    type Madvise = unsafe extern "C" fn(*mut libc::c_void, usize, libc::c_int) -> libc::c_int;
    let mut g = c.benchmark_group("madvise");
    memhook::install(&config());
    let address = memhook::host::original("madvise").expect("hooked");
    // SAFETY: a new anonymous page of the bench's own, unmapped below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED);
    g.bench_function("original", |b| {
        b.iter_custom(|iters| {
            medians::timed("madvise original", iters, || {
                // SAFETY: madvise's original, with its signature, on the
                // bench's own page.
                let r = unsafe {
                    std::mem::transmute::<usize, Madvise>(address)(black_box(page), 4096, libc::MADV_DONTNEED)
                };
                black_box(r);
            })
        })
    });
    g.bench_function("hooked", |b| {
        b.iter_custom(|iters| {
            medians::timed("madvise hooked", iters, || {
                // SAFETY: as above, through the hook.
                black_box(unsafe { libc::madvise(black_box(page), 4096, libc::MADV_DONTNEED) });
            })
        })
    });
    // SAFETY: the page mapped above.
    unsafe { libc::munmap(page, 4096) };
    memhook::uninstall();
    g.finish();
}

fn syscall_pass(c: &mut Criterion) {
    type Syscall = unsafe extern "C" fn(libc::c_long, ...) -> libc::c_long;
    pass_through(
        c,
        "syscall",
        |address| {
            // SAFETY: the original of libc's syscall, which has its
            // signature; getppid takes no arguments.
            black_box(unsafe { std::mem::transmute::<usize, Syscall>(address)(black_box(libc::SYS_getppid)) });
        },
        || {
            // SAFETY: as above.
            black_box(unsafe { libc::syscall(black_box(libc::SYS_getppid)) });
        },
    );
}

fn ioctl_pass(c: &mut Criterion) {
    type Ioctl = unsafe extern "C" fn(libc::c_int, libc::c_ulong, ...) -> libc::c_int;
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into `fds`; closed below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let mut n: libc::c_int = 0;
    let n = &raw mut n;
    pass_through(
        c,
        "ioctl",
        |address| {
            // SAFETY: the original of libc's ioctl, which has its
            // signature; FIONREAD writes an int to `n`.
            black_box(unsafe { std::mem::transmute::<usize, Ioctl>(address)(black_box(fds[0]), libc::FIONREAD, n) });
        },
        || {
            // SAFETY: as above.
            black_box(unsafe { libc::ioctl(black_box(fds[0]), libc::FIONREAD, n) });
        },
    );
    // SAFETY: the descriptors made above.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

fn open_truncate(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("memhook-bench-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("file");
    // (Readable too: mapped below.)
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let rounds = |id: &str, iters: u64| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            // SAFETY: one byte from a local into the bench's own file.
            assert_eq!(unsafe { libc::pwrite(fd, b"x".as_ptr().cast(), 1, 0) }, 1);
            let t = std::time::Instant::now();
            // SAFETY: a NUL-terminated path; the descriptor is closed.
            let opened = unsafe { libc::open(c_path.as_ptr(), libc::O_WRONLY | libc::O_TRUNC) };
            // SAFETY: as above.
            unsafe { libc::close(opened) };
            total += t.elapsed();
            assert!(opened >= 0);
        }
        medians::record(id, total, iters);
        total
    };
    let mut g = c.benchmark_group("open_truncate");
    g.bench_function("unhooked", |b| b.iter_custom(|iters| rounds("open unhooked", iters)));
    memhook::install(&config());
    let id = memhook::set_handler(bits::VM_UNMAPPED, 0, HandlerFn::Rust(&empty)).unwrap();
    g.bench_function("hooked", |b| b.iter_custom(|iters| rounds("open hooked", iters)));
    // SAFETY: a shared mapping of the bench's file, never touched (the
    // truncations leave nothing behind it), unmapped below.
    let mapped = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, fd, 0) };
    assert_ne!(mapped, libc::MAP_FAILED);
    g.bench_function("hooked_mapped", |b| {
        b.iter_custom(|iters| rounds("open hooked mapped", iters))
    });
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(mapped, 4096) };
    memhook::unset_handler(id).unwrap();
    memhook::uninstall();
    g.finish();
    drop(file);
    let _ = std::fs::remove_dir_all(&dir);
}

fn install(c: &mut Criterion) {
    let mut g = c.benchmark_group("install");
    g.sample_size(30);
    g.bench_function("bistro_all_host", |b| {
        b.iter_custom(|iters| installs::timed(iters, &config(), || {}))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = mmap_munmap, madvise_pass, syscall_pass, ioctl_pass, open_truncate, install
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let (hooked, plain) = (medians::median("hooked", SAMPLES), medians::median("unhooked", SAMPLES));
    println!(
        "median mmap+munmap 4 KiB: hooked, one empty handler for all events {} \
         (host_cost measures the same in interleaved rounds, steadier)",
        medians::against(hooked, "unhooked", plain)
    );
    for (name, what) in [
        ("madvise", "madvise(MADV_DONTNEED) of an untouched page, no handler"),
        ("syscall", "syscall(SYS_getppid), another call than memory's"),
        ("ioctl", "ioctl(FIONREAD) of a pipe, another request than UFFDIO_MOVE"),
    ] {
        let hooked = medians::median(&format!("{name} hooked"), SAMPLES);
        let plain = medians::median(&format!("{name} original"), SAMPLES);
        println!(
            "median {what}: through the hook {}",
            medians::against(hooked, "its original", plain)
        );
    }
    let (hooked, plain) = (
        medians::median("open hooked", SAMPLES),
        medians::median("open unhooked", SAMPLES),
    );
    let mappings = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count());
    println!(
        "median open(O_TRUNC)+close of a one-byte file: hooked, one empty VM_UNMAPPED handler {}, \
         with {mappings} mappings in the process",
        medians::against(hooked, "unhooked", plain)
    );
    let mapped = medians::median("open hooked mapped", SAMPLES);
    println!(
        "median open(O_TRUNC)+close of the same file mapped: hooked {}",
        medians::against(mapped, "unhooked", plain)
    );
}

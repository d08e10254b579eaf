//! Bistro costs, each next to a baseline from the same run.
//!
//! `cargo bench -p memhook --bench bistro`
//!
//! - `patch/entry`: one `Hook::patch_with` (relocation, trampoline, the
//!   three-serialisation write protocol), the unpatch untimed. The jump
//!   covers two instructions, so other threads are looked at (and held
//!   where not blocked elsewhere) once the locks are in place (the first,
//!   `endbr64`, is longer than a lock, so no look is needed before them):
//!   `patch/entry` runs beside none, `patch/beside_64_sleeping_threads`
//!   beside 64 threads blocked in a `read` (as most of a large program's
//!   are), each read from `/proc/self/task` once a patch. (An entry whose
//!   first instruction is one byte, `push rbp` without `endbr64`, is
//!   looked at before the locks too: twice.)
//! - `call/unpatched` vs `call/hooked`: a call of a small function, plain,
//!   and through a hook that calls the original (the added time is their
//!   difference).

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use memhook::bistro::Hook;

core::arch::global_asm!(
    ".text",
    ".globl mh_b_add",
    ".p2align 4",
    "mh_b_add:",
    "endbr64",
    "mov eax, edi",
    "add eax, esi",
    "add eax, 0x1000",
    "ret",
    "int3",
);

unsafe extern "C" {
    fn mh_b_add(a: i32, b: i32) -> i32;
}

type Add = extern "C" fn(i32, i32) -> i32;

static ORIGINAL: AtomicUsize = AtomicUsize::new(0);

extern "C" fn hook_add(a: i32, b: i32) -> i32 {
    // SAFETY: the trampoline has mh_b_add's signature.
    let original: Add = unsafe { std::mem::transmute(ORIGINAL.load(Ordering::Relaxed)) };
    original(a, b)
}

fn target() -> usize {
    mh_b_add as *const () as usize
}

fn calls(c: &mut Criterion) {
    let mut g = c.benchmark_group("call");
    // SAFETY: mh_b_add has the Add signature.
    let f: Add = unsafe { std::mem::transmute(target()) };
    g.bench_function("unpatched", |b| b.iter(|| black_box(f)(black_box(1), black_box(2))));
    // SAFETY: hook_add has the same signature and calls through ORIGINAL.
    let h = unsafe { Hook::patch_with(target(), hook_add as *const () as usize, &ORIGINAL) }.unwrap();
    assert_eq!(f(1, 2), 0x1003);
    g.bench_function("hooked", |b| b.iter(|| black_box(f)(black_box(1), black_box(2))));
    h.unpatch().map_err(|(_, e)| e).unwrap();
    g.finish();
}

fn patching(c: &mut Criterion) {
    let mut g = c.benchmark_group("patch");
    g.sample_size(30);
    let timed = |iters: u64| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let t = Instant::now();
            // SAFETY: as in `calls`.
            let h = unsafe { Hook::patch_with(target(), hook_add as *const () as usize, &ORIGINAL) }.unwrap();
            total += t.elapsed();
            h.unpatch().map_err(|(_, e)| e).unwrap();
        }
        total
    };
    g.bench_function("entry", |b| b.iter_custom(timed));
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let sleepers: Vec<_> = (0..64)
        .map(|_| {
            std::thread::spawn(move || {
                let mut byte = 0u8;
                // SAFETY: blocks in a read of one byte into `byte` until
                // the write end closes.
                unsafe { libc::read(fds[0], (&raw mut byte).cast(), 1) }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    g.bench_function("beside_64_sleeping_threads", |b| b.iter_custom(timed));
    // SAFETY: closing the write end ends every read with 0.
    unsafe { libc::close(fds[1]) };
    for t in sleepers {
        assert_eq!(t.join().unwrap(), 0);
    }
    // SAFETY: closing the read end.
    unsafe { libc::close(fds[0]) };
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = calls, patching
}
criterion_main!(benches);

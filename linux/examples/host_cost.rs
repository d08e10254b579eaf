//! The added cost of the host hooks, measured two ways so that drift in the
//! (slow, noisy) system calls hits every variant alike:
//! - paired rounds: 1,000 pairs unhooked, then with the hooks installed
//!   (each round installs them anew), the variants in alternating order;
//! - interleaved pairs: with the hooks installed, every iteration times one
//!   pair through the hooked entries and one through the originals
//!   (`memhook::host::original`: bistro's trampolines, which run the
//!   relocated first instructions and jump into libc), in alternating
//!   order. The per-iteration difference is the hooks' own cost (the
//!   patched entry's jump, the hook, the handlers), a few microseconds
//!   apart rather than milliseconds, and with no install in the round.
//!
//! `cargo run --release -p memhook --example host_cost`
use std::time::Instant;

use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

type Mmap = unsafe extern "C" fn(*mut libc::c_void, usize, i32, i32, i32, libc::off_t) -> *mut libc::c_void;
type Munmap = unsafe extern "C" fn(*mut libc::c_void, usize) -> i32;

fn pair() {
    pair_with(libc::mmap, libc::munmap);
}

/// One mmap(4 KiB)+munmap pair through the given functions.
#[inline(always)]
fn pair_with(mmap: Mmap, munmap: Munmap) {
    // SAFETY: an anonymous private mapping, unmapped right away.
    unsafe {
        let p = mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        munmap(std::hint::black_box(p), 4096);
    }
}

/// ns one pair takes. Out of line, and called for both sides of the
/// interleaved measure: the two run the same code from the same
/// addresses, and differ only in the functions called (an inlined copy
/// for each side adds where each copy landed to the difference).
#[inline(never)]
fn timed(mmap: Mmap, munmap: Munmap) -> f64 {
    let t = Instant::now();
    pair_with(mmap, munmap);
    t.elapsed().as_nanos() as f64
}

/// Runs `f` with the hooks installed and one empty handler for `mask`
/// (none for 0), both undone afterwards.
fn hooked<R>(config: &Config, mask: u32, f: impl FnOnce() -> R) -> R {
    memhook::install(config);
    let id = (mask != 0).then(|| memhook::set_handler(mask, 0, HandlerFn::Rust(&empty)).unwrap());
    let r = f();
    if let Some(id) = id {
        memhook::unset_handler(id).unwrap();
    }
    memhook::uninstall();
    r
}

/// The interleaved measure (see the top) with the hooks installed: the
/// median of the per-iteration differences.
fn interleaved(iterations: usize) -> f64 {
    // SAFETY: the originals of mmap and munmap, of glibc's signatures.
    let (orig_mmap, orig_munmap) = unsafe {
        (
            std::mem::transmute::<usize, Mmap>(memhook::host::original("mmap").expect("mmap is hooked")),
            std::mem::transmute::<usize, Munmap>(memhook::host::original("munmap").expect("munmap is hooked")),
        )
    };
    let mut diffs = Vec::with_capacity(iterations);
    for i in 0..iterations + 1000 {
        let (via_hooks, via_originals) = if i % 2 == 0 {
            let h = timed(libc::mmap, libc::munmap);
            (h, timed(orig_mmap, orig_munmap))
        } else {
            let o = timed(orig_mmap, orig_munmap);
            (timed(libc::mmap, libc::munmap), o)
        };
        if i >= 1000 {
            diffs.push(via_hooks - via_originals);
        }
    }
    diffs.sort_by(f64::total_cmp);
    diffs[diffs.len() / 2]
}

fn round(n: u32) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        pair();
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn empty(_: &mut Event) {}

fn main() {
    let config = Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Bistro]),
            cuda: ModeSet::NONE,
        },
    };
    // Paired rounds: each round measures the variants back to back (in
    // alternating order, so that drift within a round cancels), and the
    // added costs are the medians of the per-round differences. Variants:
    // unhooked; hooked with no handler; one empty handler for every event;
    // one for VM_MAPPED | VM_UNMAPPED only (what a registration cache
    // subscribes to).
    const MASKS: [Option<u32>; 4] = [
        None,
        Some(0),
        Some(bits::ALL_EVENTS),
        Some(bits::VM_MAPPED | bits::VM_UNMAPPED),
    ];
    let mut times: [Vec<f64>; 4] = Default::default();
    let mut added: [Vec<f64>; 4] = Default::default();
    let measure = |mask: Option<u32>| match mask {
        Some(mask) => hooked(&config, mask, || round(1000)),
        None => round(1000),
    };
    for r in 0..101 {
        let mut t = [0.0; 4];
        for k in 0..4 {
            let v = if r % 2 == 0 { k } else { 3 - k };
            t[v] = measure(MASKS[v]);
        }
        for v in 0..4 {
            times[v].push(t[v]);
            added[v].push(t[v] - t[0]);
        }
    }
    let id = memhook::set_handler(bits::ALL_EVENTS, 0, HandlerFn::Rust(&empty)).unwrap();
    let mut dispatch = Vec::new();
    for _ in 0..21 {
        let n = 100_000;
        let t = Instant::now();
        for i in 0..n {
            let mut e = Event::VmMapped(memhook::event::VmEvent { address: i, size: 4096 });
            memhook::report_event(std::hint::black_box(&mut e)).unwrap();
        }
        dispatch.push(t.elapsed().as_nanos() as f64 / n as f64);
    }
    memhook::unset_handler(id).unwrap();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let per_dispatch = median(&mut dispatch);
    let readers = if memhook::dispatch::reader_slots() {
        "per-thread slots"
    } else {
        "shared counters"
    };
    println!("mmap+munmap 4 KiB, 101 paired rounds of 1000 pairs (medians; dispatch readers: {readers}):");
    let names = [
        "unhooked",
        "hooked, no handler",
        "one empty handler, all events",
        "one empty handler, VM_MAPPED|VM_UNMAPPED",
    ];
    for v in 0..4 {
        let t = median(&mut times[v]);
        if v == 0 {
            println!("  {:<42} {t:8.0} ns", names[v]);
        } else {
            let d = median(&mut added[v]);
            println!(
                "  {:<42} {t:8.0} ns  ({d:+.0} ns, median of the paired differences)",
                names[v]
            );
        }
    }
    println!("one dispatch (report_event, one empty handler): {per_dispatch:.1} ns");
    const PAIRS: usize = 100_000;
    println!(
        "mmap+munmap 4 KiB, {PAIRS} interleaved pairs, hooked entries against the originals (median of the per-iteration differences):"
    );
    for (v, mask) in MASKS.into_iter().enumerate().skip(1) {
        let d = hooked(&config, mask.unwrap_or(0), || interleaved(PAIRS));
        println!("  {:<42} {d:+8.0} ns", names[v]);
    }
}

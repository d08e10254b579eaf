//! The added cost of the host hooks, measured in interleaved rounds so that
//! drift in the (slow, noisy) system calls hits every variant alike.
//! `cargo run --release -p memhook --example host_cost`
use std::time::Instant;

use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

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
        libc::munmap(std::hint::black_box(p), 4096);
    }
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
    let measure = |mask: Option<u32>| {
        if mask.is_some() {
            memhook::install(&config);
        }
        let id = mask
            .filter(|&m| m != 0)
            .map(|m| memhook::set_handler(m, 0, HandlerFn::Rust(&empty)).unwrap());
        let t = round(1000);
        if let Some(id) = id {
            memhook::unset_handler(id).unwrap();
        }
        if mask.is_some() {
            memhook::uninstall();
        }
        t
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
            memhook::report_event(std::hint::black_box(&mut e));
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
                "  {:<42} {t:8.0} ns  (+{d:.0} ns, median of the paired differences)",
                names[v]
            );
        }
    }
    println!("one dispatch (report_event, one empty handler): {per_dispatch:.1} ns");
}

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
    // Paired rounds: each round measures the three variants back to back
    // (in alternating order, so that drift within a round cancels), and
    // the added costs are the medians of the per-round differences.
    let (mut plain, mut bare, mut one) = (Vec::new(), Vec::new(), Vec::new());
    let (mut d_bare, mut d_one) = (Vec::new(), Vec::new());
    let measure = |variant: u8| {
        if variant > 0 {
            memhook::install(&config);
        }
        let id = (variant == 2).then(|| memhook::set_handler(bits::ALL_EVENTS, 0, HandlerFn::Rust(&empty)).unwrap());
        let t = round(1000);
        if let Some(id) = id {
            memhook::unset_handler(id).unwrap();
        }
        if variant > 0 {
            memhook::uninstall();
        }
        t
    };
    for r in 0..101 {
        let order: [u8; 3] = if r % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        let mut t = [0.0; 3];
        for v in order {
            t[v as usize] = measure(v);
        }
        plain.push(t[0]);
        bare.push(t[1]);
        one.push(t[2]);
        d_bare.push(t[1] - t[0]);
        d_one.push(t[2] - t[0]);
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
    let (p, b, o) = (median(&mut plain), median(&mut bare), median(&mut one));
    let (db, dn) = (median(&mut d_bare), median(&mut d_one));
    let per_dispatch = median(&mut dispatch);
    let readers = if memhook::dispatch::reader_slots() {
        "per-thread slots"
    } else {
        "shared counters"
    };
    println!("mmap+munmap 4 KiB, 101 paired rounds of 1000 pairs (medians; dispatch readers: {readers}):");
    println!("  unhooked                      {p:8.0} ns");
    println!("  hooked, no handler            {b:8.0} ns  (+{db:.0} ns, median of the paired differences)");
    println!("  hooked, one empty handler     {o:8.0} ns  (+{dn:.0} ns, median of the paired differences)");
    println!("one dispatch (report_event, one empty handler): {per_dispatch:.1} ns");
}

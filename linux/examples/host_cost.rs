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
    let (mut plain, mut bare, mut one) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..41 {
        plain.push(round(2000));
        memhook::install(&config);
        bare.push(round(2000));
        let id = memhook::set_handler(bits::ALL_EVENTS, 0, HandlerFn::Rust(&empty)).unwrap();
        one.push(round(2000));
        memhook::unset_handler(id).unwrap();
        memhook::uninstall();
    }
    let id = memhook::set_handler(bits::ALL_EVENTS, 0, HandlerFn::Rust(&empty)).unwrap();
    let n = 1_000_000;
    let t = Instant::now();
    for i in 0..n {
        let mut e = Event::VmMapped(memhook::event::VmEvent { address: i, size: 4096 });
        memhook::report_event(std::hint::black_box(&mut e));
    }
    let per_dispatch = t.elapsed().as_nanos() as f64 / n as f64;
    memhook::unset_handler(id).unwrap();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, b, o) = (median(&mut plain), median(&mut bare), median(&mut one));
    println!("mmap+munmap 4 KiB, median of 41 interleaved rounds of 2000 pairs:");
    println!("  unhooked                      {p:8.0} ns");
    println!("  hooked, no handler            {b:8.0} ns  (+{:.0} ns)", b - p);
    println!("  hooked, one empty handler     {o:8.0} ns  (+{:.0} ns)", o - p);
    println!("one dispatch (report_event, one empty handler): {per_dispatch:.1} ns");
}

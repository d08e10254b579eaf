use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};
use std::time::Instant;
fn pair() {
    unsafe {
        let len = if ZERO.load(std::sync::atomic::Ordering::Relaxed) {
            0
        } else {
            4096
        };
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
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
static ZERO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
fn main() {
    ZERO.store(std::env::var_os("ZERO").is_some(), std::sync::atomic::Ordering::Relaxed);
    let config = Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Bistro]),
            cuda: ModeSet::NONE,
        },
    };
    memhook::install(&config);
    if let Ok(m) = std::env::var("ONLY") {
        let m: u32 = m.parse().unwrap();
        if m != 0 {
            memhook::set_handler(m, 0, HandlerFn::Rust(&empty)).unwrap();
        }
        let n = std::env::var("N").map(|v| v.parse().unwrap()).unwrap_or(3_000_000);
        println!("{:.0}", round(n));
        return;
    }
    let masks = [
        0,
        bits::MMAP,
        bits::MMAP | bits::MUNMAP,
        bits::VM_MAPPED | bits::VM_UNMAPPED,
        bits::ALL_EVENTS,
    ];
    let mut res = vec![Vec::new(); masks.len()];
    for _ in 0..41 {
        for (k, &m) in masks.iter().enumerate() {
            let id = (m != 0).then(|| memhook::set_handler(m, 0, HandlerFn::Rust(&empty)).unwrap());
            res[k].push(round(2000));
            if let Some(id) = id {
                memhook::unset_handler(id).unwrap();
            }
        }
    }
    for (k, v) in res.iter_mut().enumerate() {
        v.sort_by(f64::total_cmp);
        println!("mask {:#x}: {:.0}", masks[k], v[20]);
    }
}

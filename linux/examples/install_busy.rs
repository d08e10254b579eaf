//! The host install in bistro mode beside threads that spin, more of them
//! than cores: each install must hold every running thread (a signal whose
//! handler waits) around its writes and let them go after, and a thread
//! that is waiting for a CPU answers only when the scheduler runs it.
//!
//! `cargo run --release -p memhook --example install_busy [SPINNERS...]`
//!
//! Prints, for each count of spinning threads (default 0, 1, 2, 3, 4 and
//! 8; `N` installs each, default 21), the median install time and its
//! ratio to the install with no other thread, measured in the same run
//! first.
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use memhook::Config;
use memhook::config::{HookConfig, HookMode, ModeSet};

fn main() {
    let config = Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Bistro]),
            cuda: ModeSet::NONE,
        },
    };
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a count of spinning threads"))
        .collect();
    let counts = if counts.is_empty() { vec![1, 2, 3, 4, 8] } else { counts };
    let installs: usize = std::env::var("N").map_or(21, |v| v.parse().expect("N: a number of installs"));
    assert!(installs > 0, "N: at least one install");
    // SAFETY: sysconf has no preconditions.
    let cores = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    println!(
        "host install in bistro mode beside spinning threads ({cores} cores online; {installs} installs each; medians):"
    );
    let alone = median_install(&config, 0, installs);
    println!("   0 spinners: {:>8.0} us (1.00x)", alone);
    for spinners in counts.into_iter().filter(|&k| k != 0) {
        let t = median_install(&config, spinners, installs);
        println!("  {spinners:>2} spinners: {t:>8.0} us ({:.2}x)", t / alone);
    }
    println!(
        "threads moved out of patched bytes: {}; writes unchecked: {}",
        memhook::code::threads_moved(),
        memhook::code::threads_unchecked()
    );
}

/// The median of `installs` installs (each after an uninstall, not timed)
/// while `spinners` threads spin, in microseconds.
fn median_install(config: &Config, spinners: usize, installs: usize) -> f64 {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..spinners {
            s.spawn(|| {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x + 1);
                }
                x
            });
        }
        // Let them all start spinning.
        std::thread::sleep(Duration::from_millis(50));
        let mut times: Vec<f64> = (0..installs)
            .map(|_| {
                memhook::uninstall();
                let t = Instant::now();
                memhook::install(config);
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        memhook::uninstall();
        stop.store(true, Ordering::Relaxed);
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    })
}

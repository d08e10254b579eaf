//! The writer's pace in the readers benchmarks (the memtype bench and the
//! `readers` example, which include this with `#[path]`): without pause,
//! or `MEMHOOK_WRITER_RATE` updates a second (an insert and a remove are
//! two), so that two builds' readers can be compared beside writers of the
//! same rate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Where a writer is in its schedule.
pub struct Pace {
    /// Insert+remove pairs a second; `None`: without pause.
    pairs_per_s: Option<f64>,
    start: Instant,
    pairs: u64,
}

impl Pace {
    /// The pace `MEMHOOK_WRITER_RATE` asks for, from now.
    pub fn from_env() -> Self {
        Pace {
            pairs_per_s: rate().map(|r| r / 2.0),
            start: Instant::now(),
            pairs: 0,
        }
    }

    /// Before each pair: spins until its turn (the core stays the
    /// writer's, as when unpaced), or until `stop` is set.
    pub fn next_pair(&mut self, stop: &AtomicBool) {
        if let Some(rate) = self.pairs_per_s {
            let due = self.pairs as f64 / rate;
            while self.start.elapsed().as_secs_f64() < due && !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        }
        self.pairs += 1;
    }
}

/// The updates a second `MEMHOOK_WRITER_RATE` asks for, if any.
pub fn rate() -> Option<f64> {
    std::env::var("MEMHOOK_WRITER_RATE").ok().and_then(|r| r.parse().ok())
}

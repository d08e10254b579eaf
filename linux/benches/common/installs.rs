//! Install time for criterion's `iter_custom`, shared by the benches that
//! time `memhook::install`.

use std::time::{Duration, Instant};

/// Installs `config` `iters` times and returns their total time; after
/// each, `check` (what the install must have done) and the uninstall run
/// untimed.
pub fn timed(iters: u64, config: &memhook::Config, check: impl Fn()) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let t = Instant::now();
        memhook::install(config);
        total += t.elapsed();
        check();
        memhook::uninstall();
    }
    total
}

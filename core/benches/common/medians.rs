//! The medians of the samples criterion measured, kept by the benchmark
//! itself, for a closing table of medians and ratios against the baseline
//! measured in the same run (criterion's own line gives its slope or mean
//! estimate, and no ratio). (Included by benches with `#[path]`.)
//!
//! A routine timed with [`timed`] records every call criterion makes of
//! it: the warm-up's first, then exactly one per sample. [`median`] takes
//! the last `samples` of them, the measurement's.

// Each bench that includes this uses the helpers it needs.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Nanoseconds per iteration of each call, by benchmark id.
static SAMPLES: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

/// Records one call of benchmark `id`: `iters` iterations in `elapsed`.
pub fn record(id: &str, elapsed: Duration, iters: u64) {
    let per_iter = elapsed.as_nanos() as f64 / iters.max(1) as f64;
    SAMPLES.lock().unwrap().entry(id.to_owned()).or_default().push(per_iter);
}

/// Times `iters` runs of `f` (criterion's `iter_custom` routine) and
/// records the call under `id`.
pub fn timed(id: &str, iters: u64, mut f: impl FnMut()) -> Duration {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    let elapsed = t.elapsed();
    record(id, elapsed, iters);
    elapsed
}

/// The median ns per iteration of benchmark `id`'s last `samples` calls,
/// or `None` if it did not run (filtered out) or ran fewer times.
pub fn median(id: &str, samples: usize) -> Option<f64> {
    let all = SAMPLES.lock().unwrap();
    let calls = all.get(id)?;
    let mut last = calls.get(calls.len().checked_sub(samples)?..)?.to_vec();
    last.sort_by(f64::total_cmp);
    let mid = last.len() / 2;
    Some(if last.len() % 2 == 1 {
        last[mid]
    } else {
        (last[mid - 1] + last[mid]) / 2.0
    })
}

/// `a / b`, printed as a ratio, or `-` when either is missing.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

/// A median in ns, or `-`.
pub fn ns(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1} ns"))
}

/// `a - b` in ns with its sign, or `-`.
pub fn added(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:+.1} ns", a - b),
        _ => "-".into(),
    }
}

/// `a` beside its baseline `b`, which `base` names: "A against BASE B:
/// added A - B (A / B)", each figure `-` where it is missing.
pub fn against(a: Option<f64>, base: &str, b: Option<f64>) -> String {
    format!(
        "{} against {base} {}: added {} ({})",
        ns(a),
        ns(b),
        added(a, b),
        ratio(a, b)
    )
}

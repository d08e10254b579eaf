//! Throughput scaling over threads, measured in rounds. (Included with
//! `#[path]` by the `cuda_smoke` example and the `gpu_multi` test of
//! memhook-tests.)

/// The median of `v`.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `work` (ns per operation, given the thread's index) on `threads`
/// threads started together; the median thread's figure.
pub fn on_threads(threads: usize, work: &(dyn Fn(usize) -> f64 + Sync)) -> f64 {
    let start = std::sync::Barrier::new(threads);
    let start = &start;
    let ns: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    start.wait();
                    work(t)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    median(ns)
}

/// Each of `works` on each of `counts` threads (the first count is the
/// base), every case in turn for `rounds` rounds; for each work and count,
/// the median ns per operation and the median of each round's throughput
/// against the same round's base (so that a host's drift between rounds,
/// and a first measurement at a higher clock, cancel).
pub fn scaling(counts: &[usize], rounds: usize, works: &[&(dyn Fn(usize) -> f64 + Sync)]) -> Vec<Vec<(f64, f64)>> {
    let mut ns = vec![vec![Vec::new(); counts.len()]; works.len()];
    for _ in 0..rounds {
        for (k, &threads) in counts.iter().enumerate() {
            for (w, work) in works.iter().enumerate() {
                ns[w][k].push(on_threads(threads, *work));
            }
        }
    }
    ns.iter()
        .map(|per_count| {
            per_count
                .iter()
                .zip(counts)
                .map(|(v, &threads)| {
                    let ratios = v
                        .iter()
                        .zip(&per_count[0])
                        .map(|(ns, base)| threads as f64 * base / (counts[0] as f64 * ns))
                        .collect();
                    (median(v.clone()), median(ratios))
                })
                .collect()
        })
        .collect()
}

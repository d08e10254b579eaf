//! The added latency of a hooked call pair, measured in paired rounds.
//! (Included with `#[path]` by the `cuda_smoke` example and the
//! `cuda_cold` bench of memhook-tests.)

use std::time::Instant;

/// The added latency of an allocation+free pair: `hooked` through the
/// driver's (patched) entries, `original` through memhook's originals of
/// the same functions (`memhook::cuda::original`: the driver's code past
/// the hook), in the same process and the same driver state. `n` rounds
/// each time one of each, in random order, timed one by one. The driver's
/// own time for a pair varies by microseconds, far more than memhook adds,
/// so block means of hooked and unhooked runs cannot show tens of ns;
/// adjacent calls share the driver's state. Both sides should call one
/// out-of-line function with different function pointers, so that the
/// caller's code, and where it lies, is the same for both. (That is not
/// what spreads the figure across processes, though: in run 76 on the
/// H200, eight processes with a copy of the caller per side gave +35 to
/// +211 ns and eight with one function +42 to +70, but in run 77 sixteen
/// processes with one function, of two builds, gave -41 to +171.) Prints the p10, p25 and median
/// of each side and the median of the per-round differences.
pub fn added_latency(name: &str, n: usize, hooked: impl Fn(), original: impl Fn(), after_round: impl Fn()) {
    let (mut h, mut o, mut d) = (Vec::new(), Vec::new(), Vec::new());
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let time = |f: &dyn Fn()| {
        let t = Instant::now();
        f();
        t.elapsed().as_nanos() as f64
    };
    for _ in 0..n {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let (th, to) = if rng & 1 == 0 {
            let th = time(&hooked);
            (th, time(&original))
        } else {
            let to = time(&original);
            (time(&hooked), to)
        };
        h.push(th);
        o.push(to);
        d.push(th - to);
        after_round();
    }
    for (q_name, q) in [("p10", 0.10), ("p25", 0.25), ("median", 0.5)] {
        let (u, k) = (quantile(&mut o, q), quantile(&mut h, q));
        println!(
            "{name}, {q_name} of {n} pairs each: original {u:.0} ns, hooked {k:.0} ns, added {:.0} ns",
            k - u
        );
    }
    // The spread of the estimate: the driver's time varies by
    // microseconds from pair to pair, so the median of 20,000 differences
    // moves by tens of ns from one block of rounds to the next.
    let blocks = n / 20_000;
    let spread = if blocks > 1 {
        let mut m: Vec<f64> = d.chunks(n / blocks).map(|c| quantile(&mut c.to_vec(), 0.5)).collect();
        m.sort_by(f64::total_cmp);
        format!(
            " (medians of {blocks} blocks of {}: {:.0} to {:.0} ns)",
            n / blocks,
            m[0],
            m[m.len() - 1]
        )
    } else {
        String::new()
    };
    println!(
        "{name}, median of the {n} per-round differences: added {:.0} ns{spread}",
        quantile(&mut d, 0.5)
    );
}

/// The `q`-quantile of `v` (sorts it).
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q) as usize]
}

//! Does a second reader cost the first? One thread times its own lookups
//! (65,536 live ranges, 4,096 pseudo-random hits, as the criterion bench)
//! alone, then while other threads look up too, then while a writer
//! inserts and removes ranges, and while a writer makes the same updates
//! to a map of its own (the control: what a busy thread beside it costs a
//! reader on this machine, sharing nothing): the five in turn, 21 rounds,
//! and the median of each round's ratio to the lone reader of the same
//! round (so that a host's drift between rounds cancels). The writer updates without pause;
//! its rate is printed too (a faster writer rewrites what readers read
//! more often). With `MEMHOOK_WRITER_RATE=N` it paces itself to N updates
//! a second (an insert and a remove are two), so that two builds' readers
//! can be compared beside writers of the same rate.
//!
//! `cargo run --release -p memhook-core --example readers`

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use memhook_core::memtype::{HugePageAligned, MemType, MemtypeMap};

/// Room for gaps, as in the criterion bench: at most three quarters full,
/// an update stays local, so the writer rewrites what readers read as
/// often as it can (in a nearly full map each update shifts thousands of
/// slots, and the writer managed only 30,000 updates a second).
/// On whole 2 MiB pages of its own, as `memhook`'s map is.
static MAP: HugePageAligned<MemtypeMap<131_072>> = HugePageAligned(MemtypeMap::new());
/// The control writer's map, filled as `MAP`; no reader reads it.
static OWN: HugePageAligned<MemtypeMap<131_072>> = HugePageAligned(MemtypeMap::new());

#[path = "../benches/common/layout.rs"]
mod layout;
#[path = "../benches/common/pace.rs"]
mod pace;
#[path = "../benches/common/pages.rs"]
mod pages;
use layout::{BASE, LEN, STRIDE, probes};

const LOOKUPS: usize = 2_000_000;

/// Updates the writer made (it updates without pause: how much it slows
/// the readers depends on how often it rewrites what they read).
static UPDATES: AtomicU64 = AtomicU64::new(0);
const ROUNDS: usize = 21;

fn lookups(addrs: &[usize], from: usize, n: usize) {
    let mut i = from;
    for _ in 0..n {
        i = (i + 1) & 4095;
        black_box(MAP.lookup(black_box(addrs[i]), 8));
    }
}

/// ns per lookup of the measuring thread, with `others` readers and
/// maybe a writer (of `MAP` or of `OWN`) busy meanwhile, and the writer's
/// millions of updates per second over the same time (0 without one).
fn first_reader(
    addrs: &Arc<Vec<usize>>,
    gaps: &Arc<Vec<usize>>,
    others: usize,
    writer: Option<&'static MemtypeMap<131_072>>,
) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(Barrier::new(others + usize::from(writer.is_some()) + 1));
    let mut helpers = Vec::new();
    for t in 0..others {
        let (stop, ready, addrs) = (stop.clone(), ready.clone(), addrs.clone());
        helpers.push(std::thread::spawn(move || {
            ready.wait();
            while !stop.load(Ordering::Relaxed) {
                lookups(&addrs, t * 997, 10_000);
            }
        }));
    }
    if let Some(map) = writer {
        let (stop, ready, gaps) = (stop.clone(), ready.clone(), gaps.clone());
        helpers.push(std::thread::spawn(move || {
            ready.wait();
            let mut pace = pace::Pace::from_env();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                pace.next_pair(&stop);
                i = (i + 7) & 4095;
                let a = gaps[i] & !0xfff;
                map.insert(a, 0x1000, MemType::CudaHost, -1).unwrap();
                map.remove(a, 0x1000).unwrap();
                UPDATES.fetch_add(2, Ordering::Relaxed);
            }
        }));
    }
    ready.wait();
    lookups(addrs, 0, LOOKUPS / 10); // warm this core's caches
    let u0 = UPDATES.load(Ordering::Relaxed);
    let t0 = Instant::now();
    lookups(addrs, 0, LOOKUPS);
    let elapsed = t0.elapsed();
    let ns = elapsed.as_nanos() as f64 / LOOKUPS as f64;
    let rate = (UPDATES.load(Ordering::Relaxed) - u0) as f64 / elapsed.as_secs_f64() / 1e6;
    stop.store(true, Ordering::Relaxed);
    for h in helpers {
        h.join().unwrap();
    }
    (ns, rate)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // Advised as memhook advises the process's map at load.
    pages::advise_huge_pages(&MAP);
    pages::advise_huge_pages(&OWN);
    for i in 0..65_536 {
        MAP.insert(BASE + i * STRIDE, LEN, MemType::Cuda, 0).unwrap();
        OWN.insert(BASE + i * STRIDE, LEN, MemType::Cuda, 0).unwrap();
    }
    let (addrs, gaps) = (Arc::new(probes(65_536, true)), Arc::new(probes(65_536, false)));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
    let cases = [
        ("alone", 0, None),
        ("with a second reader", 1, None),
        ("with all cores reading", cores - 1, None),
        ("with a writer", 0, Some(&MAP.0)),
        ("with a writer of its own", 0, Some(&OWN.0)),
    ];
    let mut times = vec![Vec::new(); cases.len()];
    let mut rates = Vec::new();
    for _ in 0..ROUNDS {
        for (k, &(_, others, writer)) in cases.iter().enumerate() {
            let (ns, rate) = first_reader(&addrs, &gaps, others, writer);
            times[k].push(ns);
            if writer.is_some_and(|w| std::ptr::eq(w, &MAP.0)) {
                rates.push(rate);
            }
        }
    }
    println!("memtype lookups of one reader, 65,536 ranges, {ROUNDS} rounds ({cores} cores; medians):");
    println!("  (the map: {})", pages::huge_pages_of(&MAP));
    for (k, (name, _, _)) in cases.iter().enumerate() {
        let ratio = median(times[k].iter().zip(&times[0]).map(|(t, alone)| t / alone).collect());
        println!(
            "  {name:<26} {:6.1} ns  ({ratio:.2}x alone, median of the per-round ratios)",
            median(times[k].clone())
        );
    }
    let (shared, own) = (&times[3], &times[4]);
    println!(
        "  sharing the map: {:.2}x (with a writer against with a writer of its own, median of the per-round ratios)",
        median(shared.iter().zip(own).map(|(s, o)| s / o).collect())
    );
    println!(
        "  (the writer, {}: {:.2} M updates/s, median)",
        if pace::rate().is_some() {
            "paced by MEMHOOK_WRITER_RATE"
        } else {
            "updating without pause"
        },
        median(rates)
    );
}

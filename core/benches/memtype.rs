//! memtype map benchmarks, each next to a `RwLock<BTreeMap>` baseline
//! measured in the same run.
//!
//! `cargo bench -p memhook-core --bench memtype`
//!
//! - `lookup_hit/<impl>/<ranges>` and `lookup_miss/...`: one lookup, one
//!   thread, with 16, 1,024 and 65,536 live ranges, inserted in address
//!   order (so the map's slots hold no gaps); `memhook_churned` after
//!   20,000 inserts and removes among them have spread gaps through it.
//! - `update/<impl>/<ranges>`: one insert plus one remove of a range among
//!   the live ones (reported per pair), in a map of 131,072 slots;
//!   `memhook_nearly_full` in one of 65,552 (more than three quarters full,
//!   an update widens to the nearest free slot).
//! - `readers/<impl>/<threads>[+writer]`: each of T threads (1, 2 and one
//!   fewer than the cores) does the same number of lookups (65,536 live
//!   ranges); the time is per lookup per thread (the slowest thread's),
//!   and criterion's element rate is the aggregate lookups/s. With
//!   `+writer`, one more thread inserts and removes ranges meanwhile,
//!   without pause (or `MEMHOOK_WRITER_RATE` updates a second). With
//!   `+own_writer`, the control: that thread makes the same updates to a
//!   map of its own, which no reader reads, so what it costs the readers
//!   is what any such busy thread costs them on this machine (a core, a
//!   cache, a clock shared below what the OS shows), and the ratio of
//!   `+writer` to it is what sharing the map costs. The reader counts can
//!   be set with `MEMHOOK_BENCH_READERS` (a comma list).
//!
//! The maps are advised for transparent huge pages, as `memhook` advises
//! the process's map at load.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, RwLock};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group};
use memhook_core::memtype::{HugePageAligned, Lookup, MemType, MemtypeMap};

/// Room for gaps at 65,536 ranges: updates stay local while a map is at
/// most three quarters full.
const CAPACITY: usize = 131_072;
/// Each map on whole 2 MiB pages of its own, as `memhook`'s is.
static MAP: HugePageAligned<MemtypeMap<CAPACITY>> = HugePageAligned(MemtypeMap::new());
/// The readers group's control: the map its `+own_writer` updates, which
/// no reader reads (filled as `MAP`).
static OWN: HugePageAligned<MemtypeMap<CAPACITY>> = HugePageAligned(MemtypeMap::new());
/// 65,536 ranges and 16 free slots.
static NEARLY_FULL: HugePageAligned<MemtypeMap<{ 65_536 + 16 }>> = HugePageAligned(MemtypeMap::new());

#[path = "common/layout.rs"]
mod layout;
#[path = "common/medians.rs"]
mod medians;
#[path = "common/pace.rs"]
mod pace;
#[path = "common/pages.rs"]
mod pages;
use layout::{BASE, LEN, STRIDE, probes};
use pace::Pace;
use pages::{advise_huge_pages, huge_pages_of};

type Baseline = RwLock<BTreeMap<usize, (usize, MemType)>>;

fn baseline_lookup(b: &Baseline, addr: usize, len: usize) -> Lookup {
    let map = b.read().unwrap();
    match map.range(..=addr).next_back() {
        Some((s, (e, t))) if addr + len <= *e => Lookup::Found(memhook_core::memtype::MemInfo {
            mem_type: *t,
            device: 0,
            base: *s,
            len: e - s,
        }),
        Some((_, (e, _))) if addr < *e => Lookup::Unknown,
        _ => Lookup::Absent,
    }
}

/// Inserts and removes 20,000 ranges in the gaps between `ranges` live
/// ones, leaving the live ones as they were.
fn churn<const N: usize>(map: &MemtypeMap<N>, ranges: usize) {
    for (k, a) in probes(ranges, false).iter().cycle().take(20_000).enumerate() {
        let a = a & !0xfff;
        map.insert(a, 0x1000, MemType::CudaHost, -1).unwrap();
        if k % 2 == 1 {
            map.remove(a, 0x1000).unwrap();
        }
    }
    for a in probes(ranges, false) {
        map.remove(a & !0xfff, 0x1000).unwrap();
    }
    assert_eq!(map.len(), ranges);
}

/// Fills `map` (cleared first) and a baseline with `ranges` ranges.
fn fill_map<const N: usize>(map: &MemtypeMap<N>, ranges: usize) -> Baseline {
    map.clear();
    let mut tree = BTreeMap::new();
    for i in 0..ranges {
        let start = BASE + i * STRIDE;
        map.insert(start, LEN, MemType::Cuda, 0).unwrap();
        tree.insert(start, (start + LEN, MemType::Cuda));
    }
    assert_eq!(map.len(), ranges);
    RwLock::new(tree)
}

fn fill(ranges: usize) -> Baseline {
    fill_map(&MAP.0, ranges)
}

/// Benchmarks `f` over the probe addresses in turn, as
/// `<group>/<name>/<ranges>` (its samples kept for the medians).
fn over<R>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    id: (&str, &str, usize),
    addrs: &[usize],
    mut f: impl FnMut(usize) -> R,
) {
    let (group, name, ranges) = id;
    let key = format!("{group}/{name}/{ranges}");
    g.bench_function(BenchmarkId::new(name, ranges), |b| {
        let mut i = 0;
        b.iter_custom(|iters| {
            medians::timed(&key, iters, || {
                i = (i + 1) & 4095;
                black_box(f(black_box(addrs[i])));
            })
        })
    });
}

/// One insert and one remove of a page at `a` (page-aligned down).
fn pair<const N: usize>(map: &MemtypeMap<N>, a: usize) {
    let a = a & !0xfff;
    map.insert(a, 0x1000, MemType::CudaHost, -1).unwrap();
    map.remove(a, 0x1000).unwrap();
}

fn single_thread(c: &mut Criterion) {
    advise_huge_pages(&MAP);
    advise_huge_pages(&NEARLY_FULL);
    for (group, hit) in [("lookup_hit", true), ("lookup_miss", false)] {
        let mut g = c.benchmark_group(group);
        for ranges in [16usize, 1024, 65_536] {
            let baseline = fill(ranges);
            let addrs = probes(ranges, hit);
            let want = if hit { MemType::Cuda } else { MemType::Host };
            assert_eq!(MAP.lookup(addrs[0], 8).mem_type_or(MemType::Host), want);
            over(&mut g, (group, "memhook", ranges), &addrs, |a| MAP.lookup(a, 8));
            over(&mut g, (group, "rwlock_btreemap", ranges), &addrs, |a| {
                baseline_lookup(&baseline, a, 8)
            });
            if ranges == 65_536 && hit {
                eprintln!("memtype map at 65,536 ranges: {}", huge_pages_of(&MAP));
            }
            churn(&MAP.0, ranges);
            assert_eq!(MAP.lookup(addrs[0], 8).mem_type_or(MemType::Host), want);
            over(&mut g, (group, "memhook_churned", ranges), &addrs, |a| MAP.lookup(a, 8));
        }
        g.finish();
    }

    let mut g = c.benchmark_group("update");
    for ranges in [16usize, 1024, 65_536] {
        let baseline = fill(ranges);
        let addrs = probes(ranges, false);
        g.throughput(Throughput::Elements(2));
        over(&mut g, ("update", "memhook", ranges), &addrs, |a| pair(&MAP.0, a));
        over(&mut g, ("update", "rwlock_btreemap", ranges), &addrs, |a| {
            let a = a & !0xfff;
            baseline.write().unwrap().insert(a, (a + 0x1000, MemType::CudaHost));
            baseline.write().unwrap().remove(&a);
        });
    }
    for i in 0..65_536 {
        NEARLY_FULL.insert(BASE + i * STRIDE, LEN, MemType::Cuda, 0).unwrap();
    }
    let addrs = probes(65_536, false);
    over(&mut g, ("update", "memhook_nearly_full", 65_536), &addrs, |a| {
        pair(&NEARLY_FULL.0, a)
    });
    g.finish();
}

type LookupFn = Arc<dyn Fn(usize) -> Lookup + Send + Sync>;
type UpdateFn = Arc<dyn Fn(usize) + Send + Sync>;

/// Who updates while the readers read, and the label's suffix.
const WRITERS: [(Writer, &str); 3] = [
    (Writer::None, ""),
    (Writer::Shared, "+writer"),
    (Writer::Own, "+own_writer"),
];

#[derive(Clone, Copy)]
enum Writer {
    None,
    /// The map the readers read.
    Shared,
    /// The same updates to a map of its own (the control).
    Own,
}

/// Runs `threads` readers doing `iters` lookups each, and a writer calling
/// `update` when given one; returns the slowest reader's time.
fn run_readers(threads: usize, iters: u64, lookup: LookupFn, update: Option<UpdateFn>) -> Duration {
    let addrs = Arc::new(probes(65_536, true));
    let gaps = Arc::new(probes(65_536, false));
    let start = Arc::new(Barrier::new(threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let writer_thread = update.map(|update| {
        let (stop, gaps) = (stop.clone(), gaps.clone());
        std::thread::spawn(move || {
            let mut pace = Pace::from_env();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                pace.next_pair(&stop);
                i = (i + 7) & 4095;
                update(gaps[i] & !0xfff);
            }
        })
    });
    let readers: Vec<_> = (0..threads)
        .map(|t| {
            let (start, addrs, lookup) = (start.clone(), addrs.clone(), lookup.clone());
            std::thread::spawn(move || {
                start.wait();
                let t0 = Instant::now();
                let mut i = t * 997;
                for _ in 0..iters {
                    i = (i + 1) & 4095;
                    black_box(lookup(black_box(addrs[i] + 64)));
                }
                t0.elapsed()
            })
        })
        .collect();
    start.wait();
    let slowest = readers.into_iter().map(|r| r.join().unwrap()).max().unwrap();
    stop.store(true, Ordering::Relaxed);
    if let Some(w) = writer_thread {
        w.join().unwrap();
    }
    slowest
}

/// The reader counts of the `readers` group: 1, 2 and one fewer than the
/// cores (at most one reader per core beside the writer: with a reader
/// more, one shares its core with the writer, and the slowest reader, the
/// figure, is slowed by the scheduler, not by the map), or the comma list
/// in `MEMHOOK_BENCH_READERS` (to see how the figure moves with the count).
fn reader_counts() -> Vec<usize> {
    if let Ok(list) = std::env::var("MEMHOOK_BENCH_READERS") {
        let counts: Vec<usize> = list
            .split(',')
            .filter_map(|c| c.trim().parse().ok())
            .filter(|&c| c > 0)
            .collect();
        assert!(
            !counts.is_empty(),
            "MEMHOOK_BENCH_READERS={list:?}: no reader count in it"
        );
        return counts;
    }
    let n = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
    let mut counts = vec![1, 2];
    if n > 3 {
        counts.push(n - 1);
    }
    counts
}

/// The `readers` writer's work on a memhook map: one insert and one remove.
fn update_pair(map: &'static MemtypeMap<CAPACITY>) -> UpdateFn {
    Arc::new(move |a| {
        map.insert(a, 0x1000, MemType::CudaHost, -1).unwrap();
        map.remove(a, 0x1000).unwrap();
    })
}

/// The same on a baseline.
fn update_baseline(map: Arc<Baseline>) -> UpdateFn {
    Arc::new(move |a| {
        map.write().unwrap().insert(a, (a + 0x1000, MemType::CudaHost));
        map.write().unwrap().remove(&a);
    })
}

fn threads(c: &mut Criterion) {
    let baseline = Arc::new(fill(65_536));
    advise_huge_pages(&OWN);
    let own_baseline = Arc::new(fill_map(&OWN.0, 65_536));
    let counts = reader_counts();
    let mut g = c.benchmark_group("readers");
    g.sample_size(20);
    for &t in &counts {
        for (writer, suffix) in WRITERS {
            let label = format!("{t}{suffix}");
            g.throughput(Throughput::Elements(t as u64));
            let key = format!("readers/memhook/{label}");
            let update = match writer {
                Writer::None => None,
                Writer::Shared => Some(update_pair(&MAP.0)),
                Writer::Own => Some(update_pair(&OWN.0)),
            };
            g.bench_function(BenchmarkId::new("memhook", &label), |b| {
                b.iter_custom(|iters| {
                    let slowest = run_readers(t, iters, Arc::new(|a| MAP.lookup(a, 8)), update.clone());
                    medians::record(&key, slowest, iters);
                    slowest
                })
            });
            let lb = baseline.clone();
            let key = format!("readers/rwlock_btreemap/{label}");
            let update = match writer {
                Writer::None => None,
                Writer::Shared => Some(update_baseline(baseline.clone())),
                Writer::Own => Some(update_baseline(own_baseline.clone())),
            };
            g.bench_function(BenchmarkId::new("rwlock_btreemap", &label), |b| {
                b.iter_custom(|iters| {
                    let lb = lb.clone();
                    let slowest = run_readers(t, iters, Arc::new(move |a| baseline_lookup(&lb, a, 8)), update.clone());
                    medians::record(&key, slowest, iters);
                    slowest
                })
            });
        }
    }
    g.finish();
}

/// Samples per benchmark: the single-thread groups', and the readers'.
const SAMPLES: usize = 30;
const READER_SAMPLES: usize = 20;

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(SAMPLES);
    targets = single_thread, threads
}

/// The closing table: every figure the goals name, as the median
/// of its samples, beside the `RwLock<BTreeMap>` baseline of the same run
/// and the ratios the goals are stated in. A benchmark filtered out
/// prints `-`.
fn summary() {
    let m = |id: &str| medians::median(id, SAMPLES);
    let r = |id: &str| medians::median(id, READER_SAMPLES);
    println!("medians of the samples (ratios against RwLock<BTreeMap> in this run):");
    for group in ["lookup_hit", "lookup_miss", "update"] {
        for ranges in [16, 1024, 65_536] {
            let mine = m(&format!("{group}/memhook/{ranges}"));
            let base = m(&format!("{group}/rwlock_btreemap/{ranges}"));
            let other = if group == "update" {
                format!(
                    "nearly full {}",
                    medians::ns(m(&format!("{group}/memhook_nearly_full/{ranges}")))
                )
            } else {
                format!(
                    "churned {}",
                    medians::ns(m(&format!("{group}/memhook_churned/{ranges}")))
                )
            };
            if mine.is_some() || base.is_some() {
                println!(
                    "median {group} {ranges:>6} ranges: memhook {} ({other}); RwLock<BTreeMap> {}; ratio {}",
                    medians::ns(mine),
                    medians::ns(base),
                    medians::ratio(mine, base)
                );
            }
        }
    }
    let counts = reader_counts();
    for imp in ["memhook", "rwlock_btreemap"] {
        let one = r(&format!("readers/{imp}/1"));
        for &t in &counts {
            let alone = r(&format!("readers/{imp}/{t}"));
            let beside = r(&format!("readers/{imp}/{t}+writer"));
            let control = r(&format!("readers/{imp}/{t}+own_writer"));
            if alone.is_some() || beside.is_some() || control.is_some() {
                println!(
                    "median readers {imp} {t:>2} thread(s), per lookup per thread: {} alone ({} of one thread's), \
                     {} beside a writer ({} of alone), {} beside a writer of a map of its own ({} of alone; \
                     sharing the map: {})",
                    medians::ns(alone),
                    medians::ratio(alone, one),
                    medians::ns(beside),
                    medians::ratio(beside, alone),
                    medians::ns(control),
                    medians::ratio(control, alone),
                    medians::ratio(beside, control)
                );
            }
        }
    }
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
}

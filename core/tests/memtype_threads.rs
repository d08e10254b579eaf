//! Lookups from several threads while a writer churns the map, with the
//! bucket table in use (well over 64 entries, in clusters far apart, so
//! that it has segments) and rebuilt now and then (a batch of entries in a
//! third region comes and goes, halving and doubling the length). Entries
//! the writer never touches must always be found whole; the ranges it
//! churns must read as absent or as exactly what it recorded.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use memhook_core::memtype::{Lookup, MemInfo, MemType, MemtypeMap};

static MAP: MemtypeMap<MAP_SLOTS> = MemtypeMap::new();

const DEVICE: usize = 0x7f07_afe0_0000;
const PINNED: usize = 0x7f86_0000_0000;
const BATCH: usize = 0x10_0000;

fn device(i: usize) -> usize {
    DEVICE + i * 0x1_0000
}

fn pinned(i: usize) -> usize {
    PINNED + i * 0x20_0000
}

/// Under Miri (`scripts/miri.sh`), which runs thousands of times slower
/// and checks every access for races, the same patterns smaller: still
/// over 64 entries, a bucket table with segments, and batches that
/// halve and double the length.
const MIRI: bool = cfg!(miri);
/// The map's slots, the device allocations that stay, the pinned ones
/// that stay, the writer's rounds, the batch that comes and goes, and the
/// reading threads.
const MAP_SLOTS: usize = if MIRI { 512 } else { 4096 };
const DEVICES: usize = if MIRI { 60 } else { 1000 };
const PINNEDS: usize = if MIRI { 10 } else { 200 };
const ROUNDS: usize = if MIRI { 40 } else { 2000 };
const BATCH_LEN: usize = if MIRI { 80 } else { 1500 };
const READERS: usize = if MIRI { 2 } else { 3 };

#[test]
fn lookups_stay_whole_while_the_bucket_table_is_rewritten() {
    for i in 0..DEVICES {
        MAP.insert(device(i), 0x8000, MemType::Cuda, 0).unwrap();
    }
    for i in 0..PINNEDS {
        MAP.insert(pinned(i), 0x10_0000, MemType::CudaHost, -1).unwrap();
    }
    let done = AtomicBool::new(false);
    let lookups = AtomicU64::new(0);
    let start = Barrier::new(READERS + 1);
    std::thread::scope(|s| {
        s.spawn(|| {
            start.wait();
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for round in 0..ROUNDS {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // A churned range in the gap after a device allocation.
                let gap = device(x as usize % DEVICES) + 0x8000;
                if x & 1 == 0 {
                    MAP.insert(gap, 0x4000, MemType::CudaManaged, 1).unwrap();
                } else {
                    MAP.remove(gap, 0x4000).unwrap();
                }
                // Now and then a batch far below comes or goes at once.
                if round % (ROUNDS / 4) == 0 {
                    for k in 0..BATCH_LEN {
                        MAP.insert(BATCH + k * 0x1000, 0x800, MemType::Cuda, 2).unwrap();
                    }
                } else if round % (ROUNDS / 4) == ROUNDS / 8 {
                    MAP.remove(BATCH, BATCH_LEN * 0x1000).unwrap();
                }
            }
            done.store(true, Ordering::Release);
        });
        for r in 0..READERS as u64 {
            let (done, lookups, start) = (&done, &lookups, &start);
            s.spawn(move || {
                start.wait();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ r;
                let mut n = 0;
                while !done.load(Ordering::Acquire) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = x as usize % DEVICES;
                    let (want, addr) = if x & 3 == 0 {
                        let j = i % PINNEDS;
                        (
                            MemInfo {
                                mem_type: MemType::CudaHost,
                                device: -1,
                                base: pinned(j),
                                len: 0x10_0000,
                            },
                            pinned(j) + 0x8_0000,
                        )
                    } else {
                        (
                            MemInfo {
                                mem_type: MemType::Cuda,
                                device: 0,
                                base: device(i),
                                len: 0x8000,
                            },
                            device(i) + (x >> 40) as usize % 0x7ff8,
                        )
                    };
                    assert_eq!(MAP.lookup(addr, 8), Lookup::Found(want), "untouched entry at {addr:#x}");
                    let gap = device(i) + 0x8000 + (x >> 20) as usize % 0x3ff8;
                    match MAP.lookup(gap, 8) {
                        Lookup::Absent => {}
                        Lookup::Found(got) => assert_eq!(
                            got,
                            MemInfo {
                                mem_type: MemType::CudaManaged,
                                device: 1,
                                base: device(i) + 0x8000,
                                len: 0x4000
                            },
                            "churned range at {gap:#x}"
                        ),
                        Lookup::Unknown => panic!("a churned range read as Unknown at {gap:#x}"),
                    }
                    n += 2;
                }
                lookups.fetch_add(n, Ordering::Relaxed);
            });
        }
    });
    assert!(
        lookups.load(Ordering::Relaxed) > if MIRI { 100 } else { 10_000 },
        "readers ran alongside the writer"
    );
    assert_eq!(MAP.dropped(), 0);
}

/// The CUDA hooks' pattern in a small map (no bucket table; one search
/// node or a short tree, the table packed): allocations of one size freed
/// by `take` (the size unknown), sometimes the one just made (the writer's
/// shortcuts), addresses drawn from a small pool so that they are reused
/// as a driver reuses what it just freed. A reader checks every published
/// allocation; a per-slot sequence (odd while the slot changes) tells a
/// read that raced the slot from a wrong answer (an address freed and
/// allocated again between the reader's loads would fool a plain re-check).
/// 200,000 updates per map (20,000 in a debug build).
#[test]
fn published_allocations_freed_by_take_are_always_found() {
    static SMALL: MemtypeMap<256> = MemtypeMap::new();
    // The production map's capacity: a deeper search tree over few entries.
    static LARGE: MemtypeMap<65_536> = MemtypeMap::new();
    ring_of_takes(&SMALL);
    // Under Miri the small map alone: laying out the large one's 9 MiB
    // takes Miri longer than the whole test takes here.
    if !MIRI {
        ring_of_takes(&LARGE);
    }
}

fn ring_of_takes<const N: usize>(map: &'static MemtypeMap<N>) {
    const SLOTS: usize = 8;
    const POOL: usize = 13;
    let at = |k: usize| 0x7f87_0000_0000 + k * 0x20_0000;
    let seq: [AtomicU64; SLOTS] = std::array::from_fn(|_| AtomicU64::new(0));
    let addr: [AtomicU64; SLOTS] = std::array::from_fn(|_| AtomicU64::new(0));
    let done = AtomicBool::new(false);
    let checked = AtomicU64::new(0);
    // A few entries that stay, so that the table holds 8 to 25.
    for k in 0..(POOL + 4) {
        if k >= POOL {
            map.insert(at(k), 0x1000, MemType::CudaHost, -1).unwrap();
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                for k in 0..SLOTS {
                    let s1 = seq[k].load(Ordering::Acquire);
                    let a = addr[k].load(Ordering::Relaxed) as usize;
                    if s1 & 1 == 1 || a == 0 {
                        continue;
                    }
                    let answer = map.lookup(a + 64, 8);
                    std::sync::atomic::fence(Ordering::Acquire);
                    if seq[k].load(Ordering::Relaxed) != s1 {
                        continue; // the slot changed meanwhile
                    }
                    let want = Lookup::Found(MemInfo {
                        mem_type: MemType::Cuda,
                        device: 0,
                        base: a,
                        len: 0x1_0000,
                    });
                    assert_eq!(answer, want, "slot {k}: {a:#x} is published");
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let mut used = [false; POOL];
        let mut held = [usize::MAX; SLOTS];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        // Fewer in a debug build (CI's `cargo test`), where an update of the
        // 65,536-slot map is tens of times slower, and fewer again under Miri.
        let updates = if MIRI {
            300
        } else if cfg!(debug_assertions) {
            20_000
        } else {
            200_000
        };
        for i in 0..updates {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Mostly the oldest slot (a ring), sometimes the newest.
            let k = if x.is_multiple_of(4) {
                (i + SLOTS - 1) % SLOTS
            } else {
                i % SLOTS
            };
            if held[k] != usize::MAX {
                seq[k].fetch_add(1, Ordering::Relaxed);
                std::sync::atomic::fence(Ordering::Release);
                addr[k].store(0, Ordering::Relaxed);
                let info = map.take(at(held[k])).expect("recorded");
                assert_eq!(info.base, at(held[k]));
                used[held[k]] = false;
                held[k] = usize::MAX;
                seq[k].fetch_add(1, Ordering::Release);
            }
            // The lowest free address of the pool (as a driver reuses the
            // one just freed), or another free one.
            let free: Vec<usize> = (0..POOL).filter(|&p| !used[p]).collect();
            let p = if x & 0x10 == 0 {
                free[0]
            } else {
                free[(x >> 8) as usize % free.len()]
            };
            seq[k].fetch_add(1, Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::Release);
            map.insert(at(p), 0x1_0000, MemType::Cuda, 0).unwrap();
            used[p] = true;
            held[k] = p;
            addr[k].store(at(p) as u64, Ordering::Relaxed);
            seq[k].fetch_add(1, Ordering::Release);
        }
        done.store(true, Ordering::Release);
    });
    let enough = if MIRI { 10 } else { 1_000 };
    assert!(checked.load(Ordering::Relaxed) > enough, "{checked:?} lookups checked");
}

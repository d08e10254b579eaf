//! Lookups from several threads while a writer churns the map, with the
//! bucket table in use (well over 64 entries, in clusters far apart, so
//! that it has segments) and rebuilt now and then (a batch of entries in a
//! third region comes and goes, halving and doubling the length). Entries
//! the writer never touches must always be found whole; the ranges it
//! churns must read as absent or as exactly what it recorded.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use memhook_core::memtype::{Lookup, MemInfo, MemType, MemtypeMap};

static MAP: MemtypeMap<4096> = MemtypeMap::new();

const DEVICE: usize = 0x7f07_afe0_0000;
const PINNED: usize = 0x7f86_0000_0000;
const BATCH: usize = 0x10_0000;

fn device(i: usize) -> usize {
    DEVICE + i * 0x1_0000
}

fn pinned(i: usize) -> usize {
    PINNED + i * 0x20_0000
}

#[test]
fn lookups_stay_whole_while_the_bucket_table_is_rewritten() {
    for i in 0..1000 {
        MAP.insert(device(i), 0x8000, MemType::Cuda, 0).unwrap();
    }
    for i in 0..200 {
        MAP.insert(pinned(i), 0x10_0000, MemType::CudaHost, -1).unwrap();
    }
    let done = AtomicBool::new(false);
    let lookups = AtomicU64::new(0);
    let start = Barrier::new(4);
    std::thread::scope(|s| {
        s.spawn(|| {
            start.wait();
            let mut x = 0x2545_f491_4f6c_dd1du64;
            for round in 0..2000usize {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // A churned range in the gap after a device allocation.
                let gap = device(x as usize % 1000) + 0x8000;
                if x & 1 == 0 {
                    MAP.insert(gap, 0x4000, MemType::CudaManaged, 1).unwrap();
                } else {
                    MAP.remove(gap, 0x4000).unwrap();
                }
                // Now and then a batch far below comes or goes at once.
                if round % 500 == 0 {
                    for k in 0..1500 {
                        MAP.insert(BATCH + k * 0x1000, 0x800, MemType::Cuda, 2).unwrap();
                    }
                } else if round % 500 == 250 {
                    MAP.remove(BATCH, 1500 * 0x1000).unwrap();
                }
            }
            done.store(true, Ordering::Release);
        });
        for r in 0..3u64 {
            let (done, lookups, start) = (&done, &lookups, &start);
            s.spawn(move || {
                start.wait();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ r;
                let mut n = 0;
                while !done.load(Ordering::Acquire) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = x as usize % 1000;
                    let (want, addr) = if x & 3 == 0 {
                        let j = i % 200;
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
        lookups.load(Ordering::Relaxed) > 10_000,
        "readers ran alongside the writer"
    );
    assert_eq!(MAP.dropped(), 0);
}

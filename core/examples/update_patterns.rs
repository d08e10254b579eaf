//! Memtype map update patterns, for timing and for instruction counts:
//! `cargo run --release -p memhook-core --example update_patterns -- <pattern>`
//! prints the time per pair; under `valgrind --tool=callgrind` the whole
//! program's instruction count compares builds (the README's pattern row).
//!
//! - `lifo`: 64 live ranges; allocate above them all and free it at once.
//! - `queue N`: N live ranges at rising addresses; allocate above, free the
//!   oldest.
//! - `churn N`: N live ranges among 4N places; free a random one, allocate
//!   at a random free place.

use std::time::Instant;

use memhook_core::memtype::{MemType, MemtypeMap};

static MAP: MemtypeMap<65_536> = MemtypeMap::new();
const BASE: usize = 0x7f00_0000_0000;
const STRIDE: usize = 0x20_0000;

fn at(i: usize) -> usize {
    BASE + i * STRIDE
}

fn alloc(i: usize) {
    MAP.insert(at(i), 0x10_0000, MemType::Cuda, 0).unwrap();
}

fn free(i: usize) {
    assert!(MAP.take(at(i)).is_some(), "range {i} was recorded");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pattern = args.next().unwrap_or_else(|| "lifo".into());
    let live: usize = args.next().map_or(64, |n| n.parse().expect("a number of live ranges"));
    let pairs = 20_000;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut random = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as usize
    };
    let spaced = pattern == "churn";
    let mut places: Vec<usize> = (0..live).map(|i| if spaced { i * 2 } else { i }).collect();
    let mut taken = vec![false; 4 * live];
    for &place in &places {
        taken[place] = true;
        alloc(place);
    }
    let started = Instant::now();
    for k in 0..pairs {
        match pattern.as_str() {
            "lifo" => {
                alloc(live + k % 7);
                free(live + k % 7);
            }
            "queue" => {
                alloc(live + k);
                free(k);
            }
            "churn" => {
                let j = random() % live;
                free(places[j]);
                taken[places[j]] = false;
                let place = loop {
                    let p = random() % (4 * live);
                    if !taken[p] {
                        break p;
                    }
                };
                taken[place] = true;
                places[j] = place;
                alloc(place);
            }
            other => panic!("unknown pattern {other:?}: lifo, queue N or churn N"),
        }
    }
    let ns = started.elapsed().as_nanos() as f64 / pairs as f64;
    assert_eq!(MAP.len(), live);
    println!("{pattern} {live}: {ns:.1} ns per pair ({pairs} pairs)");
}

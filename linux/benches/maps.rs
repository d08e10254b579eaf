//! Looks at the process's mappings: by `PROCMAP_QUERY` (Linux 6.11)
//! against the text of `/proc/self/maps`, in the same run.
//!
//! `cargo bench -p memhook --bench maps`
//!
//! - `find/text` vs `find/query`: the mapping that holds an address (the
//!   last of the bench's own, past most of the process's), as
//!   `maps::find` asked it before and asks it now where the kernel
//!   answers.
//! - `files/text` vs `files/query`: every mapping of a file, the look a
//!   truncating `open` or an `ftruncate` of a mapped file makes (the text
//!   is read whole; the kernel passes over the anonymous ones itself).
//!
//! Each at the process's own mappings (`_few`) and with 2,000 anonymous
//! mappings more (`_many`: 4,000 and more, as in a process of a CUDA
//! program with a caching allocator). Where the kernel does not answer,
//! the `query` rows measure the fallback: the text again.

use std::hint::black_box;
use std::ops::ControlFlow;
use std::time::Duration;

use criterion::{Criterion, criterion_group};

#[path = "../../core/benches/common/medians.rs"]
mod medians;

/// Criterion's default samples per benchmark.
const SAMPLES: usize = 100;

/// Anonymous mappings the `_many` rows add (read-write pages between
/// read-only ones, each a mapping of its own).
const EXTRA: usize = 2000;

/// The mapping at `addr` by `find`, or by the text alone.
fn find(addr: usize, by_text: bool) -> usize {
    let m = if by_text {
        memhook::maps::find_by_text(addr)
    } else {
        memhook::maps::find(addr)
    };
    m.expect("mapped").end
}

/// Counts the mappings of files, by the text or as the hooks look.
fn files(by_text: bool) -> usize {
    let mut n = 0;
    let count = |m: &memhook::maps::Mapping| {
        n += usize::from(m.inode != 0);
        ControlFlow::Continue(())
    };
    if by_text {
        memhook::maps::for_each(count).unwrap();
    } else {
        memhook::maps::for_each_of_files(count).unwrap();
    }
    n
}

fn looks(c: &mut Criterion, size: &str, at: usize) {
    let mut g = c.benchmark_group(format!("maps_{size}"));
    for (name, by_text) in [("text", true), ("query", false)] {
        let id = format!("find {name} {size}");
        g.bench_function(format!("find/{name}"), |b| {
            b.iter_custom(|iters| {
                medians::timed(&id, iters, || {
                    black_box(find(black_box(at), by_text));
                })
            })
        });
    }
    assert_eq!(files(true), files(false), "the same mappings of files both ways");
    for (name, by_text) in [("text", true), ("query", false)] {
        let id = format!("files {name} {size}");
        g.bench_function(format!("files/{name}"), |b| {
            b.iter_custom(|iters| {
                medians::timed(&id, iters, || {
                    black_box(files(by_text));
                })
            })
        });
    }
    g.finish();
}

fn few(c: &mut Criterion) {
    // The highest mapping of a file below the stack: most of the text
    // lies before it.
    let mut at = 0;
    memhook::maps::for_each(|m| {
        if m.inode != 0 {
            at = m.start;
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    looks(c, "few", at);
}

fn many(c: &mut Criterion) {
    let page = 4096;
    // SAFETY: a fresh read-only reservation, whose every other page is
    // made read-write (each a mapping of its own); never unmapped (the
    // bench ends with it).
    let base = unsafe {
        let base = libc::mmap(
            std::ptr::null_mut(),
            (2 * EXTRA + 1) * page,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(base, libc::MAP_FAILED);
        for i in 0..EXTRA {
            let p = base.cast::<u8>().add((2 * i + 1) * page);
            assert_eq!(libc::mprotect(p.cast(), page, libc::PROT_READ | libc::PROT_WRITE), 0);
        }
        base as usize
    };
    // The last of them: past them all in the text.
    looks(c, "many", base + (2 * EXTRA - 1) * page);
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = few, many
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let mappings = std::fs::read_to_string("/proc/self/maps").map_or(0, |m| m.lines().count());
    for size in ["few", "many"] {
        for what in ["find", "files"] {
            let (query, text) = (
                medians::median(&format!("{what} query {size}"), SAMPLES),
                medians::median(&format!("{what} text {size}"), SAMPLES),
            );
            println!(
                "median {what} ({size}): by the kernel's query {} against the text {} (the text takes {})",
                medians::ns(query),
                medians::ns(text),
                medians::ratio(text, query)
            );
        }
    }
    println!("({mappings} mappings at the end, the 'many' rows' included)");
}

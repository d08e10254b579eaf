//! Dispatch and lookup never allocate: a counting global allocator proves it.
#![cfg(not(memhook_loom))]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use memhook_core::event::{DispatchDepth, Dispatcher, Event, FnHandler, MunmapEvent, VmEvent, bits};
use memhook_core::memtype::{Lookup, MemType, MemtypeMap};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on the thread under test: the harness's own threads allocate
    /// when they please (its main thread, blocking on a channel while the
    /// test runs, does), and those are not the paths under test.
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if COUNTING.try_with(std::cell::Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
    }
}

// SAFETY: forwards to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

static D: Dispatcher<FnHandler, 8> = Dispatcher::new();
static MAP: MemtypeMap<4096> = MemtypeMap::new();
static SEEN: AtomicUsize = AtomicUsize::new(0);

fn seen(_e: &mut Event, _c: usize) {
    SEEN.fetch_add(1, Ordering::Relaxed);
}

/// One test function; only this thread's allocations count.
#[test]
fn dispatch_lookup_and_map_updates_do_not_allocate() {
    let depth = DispatchDepth::new();
    D.register(
        &depth,
        bits::MUNMAP | bits::VM_UNMAPPED,
        -1,
        FnHandler { func: seen, context: 0 },
    )
    .unwrap();
    D.register(&depth, bits::MUNMAP, 1, FnHandler { func: seen, context: 1 })
        .unwrap();
    // Fewer under Miri (`scripts/miri.sh`), thousands of times slower.
    let (entries, rounds) = if cfg!(miri) { (100, 200) } else { (1000, 10_000) };
    for i in 0..entries {
        MAP.insert(0x100000 + i * 0x2000, 0x1000, MemType::Cuda, 0).unwrap();
    }

    COUNTING.with(|c| c.set(true));
    let before = ALLOCS.load(Ordering::SeqCst);
    let mut found = 0;
    for i in 0..rounds {
        let mut vm = Event::VmUnmapped(VmEvent { address: i, size: 4096 });
        D.notify(&depth, &mut vm);
        let mut ev = Event::Munmap(MunmapEvent {
            result: -1,
            address: i,
            size: 4096,
        });
        D.dispatch(&depth, &mut ev, |e| {
            if let Event::Munmap(m) = e {
                m.result = 0;
            }
        });
        if let Lookup::Found(_) = MAP.lookup(0x100000 + (i % (2 * entries)) * 0x1000, 8) {
            found += 1;
        }
        MAP.insert(0x8000_0000 + i * 0x1000, 0x1000, MemType::CudaHost, -1)
            .unwrap();
        MAP.remove(0x8000_0000 + i * 0x1000, 0x1000).unwrap();
    }
    let after = ALLOCS.load(Ordering::SeqCst);
    COUNTING.with(|c| c.set(false));
    assert_eq!(after - before, 0, "allocations on the dispatch/lookup/update paths");
    // Every other lookup lands in a mapping; three handler calls a round.
    assert_eq!(found, rounds / 2);
    assert_eq!(SEEN.load(Ordering::Relaxed), 3 * rounds);
}

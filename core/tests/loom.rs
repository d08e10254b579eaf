//! loom models of memhook-core's shared state.
//!
//! Run: `RUSTFLAGS="--cfg memhook_loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p memhook-core --test loom --release`
#![cfg(memhook_loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use memhook_core::event::{DispatchDepth, Dispatcher, Event, FnHandler, MunmapEvent, bits};
use memhook_core::memtype::{Lookup, MemInfo, MemType, MemtypeMap};

fn munmap() -> Event {
    Event::Munmap(MunmapEvent {
        result: -1,
        address: 0x1000,
        size: 4096,
    })
}

/// Fails the model if called after its `gone` flag was set (the flag is set
/// right after `unregister` returns); counts calls otherwise.
fn watched(_event: &mut Event, context: usize) {
    // SAFETY: context is the address of a `Watch` kept alive by an Arc until
    // every thread of the model has joined.
    let w = unsafe { &*(context as *const Watch) };
    assert!(
        !w.gone.load(Ordering::SeqCst),
        "handler called after unregister returned"
    );
    w.calls.fetch_add(1, Ordering::SeqCst);
}

struct Watch {
    gone: AtomicBool,
    calls: AtomicUsize,
}

#[test]
fn loom_no_handler_runs_after_unregister_returns() {
    loom::model(|| {
        let d = Arc::new(Dispatcher::<FnHandler, 2>::new());
        let watch = Arc::new(Watch {
            gone: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
        });
        let handler = FnHandler {
            func: watched,
            context: Arc::as_ptr(&watch) as usize,
        };
        let depth = DispatchDepth::new();
        let id = d.register(&depth, bits::MUNMAP, 0, handler).unwrap();

        let reader = {
            let d = d.clone();
            thread::spawn(move || {
                let depth = DispatchDepth::new();
                let mut ev = munmap();
                d.dispatch(&depth, &mut ev, |e| {
                    if let Event::Munmap(m) = e {
                        m.result = 0;
                    }
                })
                .handlers
            })
        };
        d.unregister(&depth, id).unwrap();
        watch.gone.store(true, Ordering::SeqCst);
        let handlers = reader.join().unwrap();
        // Pre and post passes each run it at most once.
        assert!(handlers <= 1);
        assert_eq!(watch.calls.load(Ordering::SeqCst), handlers as usize);
    });
}

fn count(_event: &mut Event, context: usize) {
    // SAFETY: context is the address of an AtomicUsize kept alive by an Arc
    // until every thread of the model has joined.
    let n = unsafe { &*(context as *const AtomicUsize) };
    n.fetch_add(1, Ordering::SeqCst);
}

/// Registers `count` (on the counter at `ctx`) for VM_MAPPED at `priority`.
fn register_counter(d: &Dispatcher<FnHandler, 2>, depth: &DispatchDepth, priority: i32, ctx: usize) {
    d.register(
        depth,
        bits::VM_MAPPED,
        priority,
        FnHandler {
            func: count,
            context: ctx,
        },
    )
    .unwrap();
}

#[test]
fn loom_registration_is_atomic_for_concurrent_dispatch() {
    loom::model(|| {
        let d = Arc::new(Dispatcher::<FnHandler, 2>::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let ctx = Arc::as_ptr(&calls) as usize;
        let depth = DispatchDepth::new();
        register_counter(&d, &depth, 0, ctx);

        let reader = {
            let d = d.clone();
            thread::spawn(move || {
                let depth = DispatchDepth::new();
                let mut ev = Event::VmMapped(memhook_core::event::VmEvent { address: 1, size: 1 });
                d.notify(&depth, &mut ev).handlers
            })
        };
        // A second registration races the dispatch: the reader sees the old
        // table (1 handler) or the new one (2), each handler at most once.
        register_counter(&d, &depth, 1, ctx);
        let handlers = reader.join().unwrap();
        assert!(handlers == 1 || handlers == 2, "{handlers}");
        assert_eq!(calls.load(Ordering::SeqCst), handlers as usize);
        assert_eq!(d.len(), 2);
    });
}

fn info(mem_type: MemType, base: usize, len: usize) -> Lookup {
    Lookup::Found(MemInfo {
        mem_type,
        device: 0,
        base,
        len,
    })
}

#[test]
fn loom_map_reader_sees_old_or_new_entry_never_a_mix() {
    loom::model(|| {
        let map = Arc::new(MemtypeMap::<2>::new());
        map.insert(0x1000, 0x1000, MemType::Cuda, 0).unwrap();
        let reader = {
            let map = map.clone();
            thread::spawn(move || map.lookup(0x1800, 8))
        };
        // Replace the range with another type.
        map.insert(0x1000, 0x1000, MemType::CudaManaged, 0).unwrap();
        let seen = reader.join().unwrap();
        assert!(
            seen == info(MemType::Cuda, 0x1000, 0x1000) || seen == info(MemType::CudaManaged, 0x1000, 0x1000),
            "{seen:?}"
        );
        assert_eq!(map.lookup(0x1800, 8), info(MemType::CudaManaged, 0x1000, 0x1000));
    });
}

#[test]
fn loom_map_reader_during_split_sees_whole_or_split() {
    loom::model(|| {
        let map = Arc::new(MemtypeMap::<2>::new());
        map.insert(0x1000, 0x3000, MemType::Cuda, 0).unwrap();
        let reader = {
            let map = map.clone();
            thread::spawn(move || (map.lookup(0x1000, 8), map.lookup(0x2800, 8)))
        };
        map.remove(0x2000, 0x1000).unwrap();
        let (left, middle) = reader.join().unwrap();
        // The left part is Cuda throughout, with the old or new extent.
        assert!(
            left == info(MemType::Cuda, 0x1000, 0x3000) || left == info(MemType::Cuda, 0x1000, 0x1000),
            "{left:?}"
        );
        // The removed middle is the old entry or absent: never another type.
        assert!(
            middle == info(MemType::Cuda, 0x1000, 0x3000) || middle == Lookup::Absent,
            "{middle:?}"
        );
        assert_eq!(map.lookup(0x3000, 8), info(MemType::Cuda, 0x3000, 0x1000));
    });
}

//! Removing a handler by function (`unset_handler_fn`, what the C ABI's
//! `memhook_unset_event_handler` does) removes that handler's
//! registrations and no other's: not another function's, not a closure's,
//! and not another instance of the same closure with state of its own.
use std::sync::atomic::{AtomicU64, Ordering};

use memhook::event::{Event, VmEvent, bits};
use memhook::{HandlerFn, report_event, set_handler, unset_handler_fn};

/// Where the test's events are: its handlers count only these, so that
/// nothing else in the process could move the counts.
const AT: usize = 0x5eed_0000;

static A: AtomicU64 = AtomicU64::new(0);
static B: AtomicU64 = AtomicU64::new(0);
static C: AtomicU64 = AtomicU64::new(0);
static D: AtomicU64 = AtomicU64::new(0);
static E: AtomicU64 = AtomicU64::new(0);

fn ours(e: &Event) -> bool {
    matches!(e, Event::VmMapped(v) if v.address == AT)
}

fn count_a(e: &mut Event) {
    if ours(e) {
        A.fetch_add(1, Ordering::Relaxed);
    }
}

fn count_b(e: &mut Event) {
    if ours(e) {
        B.fetch_add(1, Ordering::Relaxed);
    }
}

/// A handler with state: the same closure type for every counter, each
/// instance at an address of its own.
fn counting(into: &'static AtomicU64) -> HandlerFn {
    HandlerFn::Rust(Box::leak(Box::new(move |e: &mut Event| {
        if ours(e) {
            into.fetch_add(1, Ordering::Relaxed);
        }
    })))
}

/// One event the handlers count, and what each has counted so far.
fn report() -> [u64; 5] {
    report_event(&mut Event::VmMapped(VmEvent {
        address: AT,
        size: 4096,
    }))
    .unwrap();
    [&A, &B, &C, &D, &E].map(|c| c.load(Ordering::Relaxed))
}

#[test]
fn unsetting_a_handler_by_function_leaves_every_other_handler() {
    let d = counting(&D);
    let e = counting(&E);
    for h in [
        HandlerFn::Rust(&count_a),
        HandlerFn::Rust(&count_b),
        HandlerFn::Rust(&|e: &mut Event| {
            if ours(e) {
                C.fetch_add(1, Ordering::Relaxed);
            }
        }),
        d,
        e,
    ] {
        set_handler(bits::VM_MAPPED, 0, h).expect("a free handler slot");
    }
    assert_eq!(report(), [1, 1, 1, 1, 1]);

    // A function: only its registration goes (every zero-sized handler
    // lies at one dangling address, so the address alone would name all
    // three of them).
    assert_eq!(unset_handler_fn(bits::VM_MAPPED, &HandlerFn::Rust(&count_a)), Ok(1));
    assert_eq!(report(), [1, 2, 2, 2, 2]);

    // A function registered twice: both registrations go, nothing else.
    set_handler(bits::VM_MAPPED, 0, HandlerFn::Rust(&count_b)).expect("a free handler slot");
    assert_eq!(report(), [1, 4, 3, 3, 3]);
    assert_eq!(unset_handler_fn(bits::VM_MAPPED, &HandlerFn::Rust(&count_b)), Ok(2));
    assert_eq!(report(), [1, 4, 4, 4, 4]);

    // One of two instances of a closure with state: the other stays.
    assert_eq!(unset_handler_fn(bits::VM_MAPPED, &d), Ok(1));
    assert_eq!(report(), [1, 4, 5, 4, 5]);
    assert_eq!(unset_handler_fn(bits::VM_MAPPED, &d), Ok(0), "already gone");
    assert_eq!(unset_handler_fn(bits::VM_MAPPED, &e), Ok(1));
    assert_eq!(report(), [1, 4, 6, 4, 5]);
}

//! Dispatch semantics: order, priorities, the result rule, nesting, errors.
#![cfg(not(memhook_loom))]

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use memhook_core::event::{
    DispatchDepth, Dispatched, Dispatcher, Event, FnHandler, Handler, INVALID_PTR, MAX_NESTING, MmapEvent, MunmapEvent,
    RegisterError, VmEvent, bits,
};

thread_local! {
    static LOG: RefCell<Vec<(usize, i32)>> = const { RefCell::new(Vec::new()) };
}

/// Records `(context, result word)` in the thread's log.
fn record(event: &mut Event, context: usize) {
    let word = event.result().unwrap_or(0) as i32;
    LOG.with(|l| l.borrow_mut().push((context, word)));
}

fn take_log() -> Vec<(usize, i32)> {
    LOG.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

/// [`record`] as one function pointer: Rust promises no unique address
/// for a function, so each use of its name may make a pointer of its own
/// (Miri makes them so on purpose), and an unset by handler compares the
/// pointer. One `static` is one pointer.
static RECORD: fn(&mut Event, usize) = record;

fn handler(context: usize) -> FnHandler {
    FnHandler { func: RECORD, context }
}

fn munmap() -> Event {
    Event::Munmap(MunmapEvent {
        result: -1,
        address: 0x1000,
        size: 4096,
    })
}

fn original_ok(e: &mut Event) {
    if let Event::Munmap(m) = e {
        m.result = 0;
    }
}

#[test]
fn handlers_run_in_priority_order_with_ties_in_registration_order() {
    let d: Dispatcher<FnHandler, 16> = Dispatcher::new();
    let depth = DispatchDepth::new();
    // (context, priority): registration order is the context.
    for (ctx, prio) in [(1, 5), (2, -3), (3, 0), (4, -3), (5, 5), (6, -10), (7, 0)] {
        d.register(&depth, bits::MUNMAP, prio, handler(ctx)).unwrap();
    }
    take_log();
    let mut ev = munmap();
    let out = d.dispatch(&depth, &mut ev, original_ok);
    assert_eq!(
        out,
        Dispatched {
            handlers: 7,
            called_original: true,
            overflowed: false
        }
    );
    let log = take_log();
    let order: Vec<usize> = log.iter().map(|(c, _)| *c).collect();
    assert_eq!(order, [6, 2, 4, 3, 7, 1, 5]);
    // Pre-handlers (< 0) saw the invalid result, post-handlers the original's.
    let results: Vec<i32> = log.iter().map(|(_, r)| *r).collect();
    assert_eq!(results, [-1, -1, -1, 0, 0, 0, 0]);
}

#[test]
fn masks_select_handlers() {
    let d: Dispatcher<FnHandler, 8> = Dispatcher::new();
    let depth = DispatchDepth::new();
    d.register(&depth, bits::MMAP, 0, handler(1)).unwrap();
    d.register(&depth, bits::MUNMAP | bits::VM_UNMAPPED, 0, handler(2))
        .unwrap();
    take_log();
    let mut ev = Event::VmUnmapped(VmEvent { address: 0, size: 1 });
    let out = d.notify(&depth, &mut ev);
    assert_eq!(out.handlers, 1);
    assert_eq!(take_log(), [(2, 0)]);
    assert!(d.has_handlers(bits::MMAP));
    assert!(!d.has_handlers(bits::SHMAT));
}

fn fill_mmap(event: &mut Event, addr: usize) {
    if let Event::Mmap(m) = event {
        m.result = addr;
    }
}

fn pre_fill(event: &mut Event, context: usize) {
    fill_mmap(event, context);
}

/// A handler that fills an mmap result with `addr`.
fn filler(addr: usize) -> FnHandler {
    FnHandler {
        func: pre_fill,
        context: addr,
    }
}

fn mmap_event() -> Event {
    Event::Mmap(MmapEvent {
        result: INVALID_PTR,
        address: 0,
        size: 4096,
        prot: 3,
        flags: 0x22,
        fd: -1,
        offset: 0,
    })
}

#[test]
fn pre_handler_result_skips_the_original_and_valid_results_are_kept() {
    let d: Dispatcher<FnHandler, 8> = Dispatcher::new();
    let depth = DispatchDepth::new();
    d.register(&depth, bits::MMAP, -2, filler(0xa000)).unwrap();
    // A second pre-handler and a post-handler try to change the valid result.
    d.register(&depth, bits::MMAP, -1, filler(0xb000)).unwrap();
    d.register(&depth, bits::MMAP, 3, filler(0xc000)).unwrap();
    let mut ev = mmap_event();
    let mut original_called = false;
    let out = d.dispatch(&depth, &mut ev, |e| {
        original_called = true;
        fill_mmap(e, 0xdead000);
    });
    assert!(!original_called);
    assert!(!out.called_original);
    assert_eq!(ev.result(), Some(0xa000));
}

#[test]
fn post_handler_may_fill_a_result_the_original_left_invalid() {
    let d: Dispatcher<FnHandler, 8> = Dispatcher::new();
    let depth = DispatchDepth::new();
    d.register(&depth, bits::MMAP, 1, filler(0xe000)).unwrap();
    d.register(&depth, bits::MMAP, 2, filler(0xf000)).unwrap();
    let mut ev = mmap_event();
    let out = d.dispatch(&depth, &mut ev, |_| {}); // original failed
    assert!(out.called_original);
    assert_eq!(ev.result(), Some(0xe000)); // the first filler wins
}

static NESTED: Dispatcher<FnHandler, 8> = Dispatcher::new();
thread_local! {
    static DEPTH: DispatchDepth = const { DispatchDepth::new() };
}

/// A handler that raises the same event again, as a registration cache's
/// cleanup does when its munmap is hooked.
fn recurse(event: &mut Event, context: usize) {
    record(event, context);
    DEPTH.with(|depth| {
        let mut inner = munmap();
        NESTED.dispatch(depth, &mut inner, original_ok);
    });
}

#[test]
fn nested_dispatch_is_delivered_up_to_the_bound_then_counted() {
    DEPTH.with(|depth| {
        NESTED
            .register(
                depth,
                bits::MUNMAP,
                0,
                FnHandler {
                    func: recurse,
                    context: 9,
                },
            )
            .unwrap();
        take_log();
        let before = NESTED.nested_overflows();
        let mut ev = munmap();
        let out = NESTED.dispatch(depth, &mut ev, original_ok);
        assert!(!out.overflowed);
        // One delivery per level, MAX_NESTING levels; the next is counted.
        assert_eq!(take_log().len(), MAX_NESTING as usize);
        assert_eq!(NESTED.nested_overflows() - before, 1);
        assert_eq!(depth.get(), 0);
    });
}

fn register_inside(_event: &mut Event, context: usize) {
    let d = unsafe_ref(context);
    DEPTH.with(|depth| {
        let r = d.register(depth, bits::MMAP, 0, handler(1));
        RESULT.with(|c| *c.borrow_mut() = Some(r.map(|_| ())));
    });
}

thread_local! {
    static RESULT: RefCell<Option<Result<(), RegisterError>>> = const { RefCell::new(None) };
}

fn unsafe_ref(context: usize) -> &'static Dispatcher<FnHandler, 8> {
    // SAFETY: the tests pass the address of a `static` dispatcher.
    unsafe { &*(context as *const Dispatcher<FnHandler, 8>) }
}

static INSIDE: Dispatcher<FnHandler, 8> = Dispatcher::new();

#[test]
fn registering_from_a_handler_fails_instead_of_deadlocking() {
    DEPTH.with(|depth| {
        let ctx = &INSIDE as *const _ as usize;
        INSIDE
            .register(
                depth,
                bits::MUNMAP,
                0,
                FnHandler {
                    func: register_inside,
                    context: ctx,
                },
            )
            .unwrap();
        let mut ev = munmap();
        INSIDE.dispatch(depth, &mut ev, original_ok);
        assert_eq!(
            RESULT.with(|c| c.borrow_mut().take()),
            Some(Err(RegisterError::InsideHandler))
        );
        assert_eq!(INSIDE.len(), 1);
    });
}

#[test]
fn full_table_and_bad_registrations_are_errors() {
    let d: Dispatcher<FnHandler, 2> = Dispatcher::new();
    let depth = DispatchDepth::new();
    let a = d.register(&depth, bits::MMAP, 0, handler(1)).unwrap();
    d.register(&depth, bits::MMAP, 0, handler(2)).unwrap();
    assert_eq!(
        d.register(&depth, bits::MMAP, 0, handler(3)),
        Err(RegisterError::Full { capacity: 2 })
    );
    assert_eq!(
        d.register(&depth, bits::NO_INSTALL, 0, handler(3)),
        Err(RegisterError::NoEvents)
    );
    // A bit that is neither an event nor a flag (an event of a later
    // version, say) is refused, not dropped: the handler would wait for
    // it forever. Flags beside events are fine.
    for unknown in [1 << 8, 1 << 15, 1 << 18, 1 << 22, 1 << 26, 1 << 31] {
        assert_eq!(
            d.register(&depth, bits::MMAP | unknown, 0, handler(3)),
            Err(RegisterError::UnknownBits { bits: unknown })
        );
    }
    assert_eq!(d.len(), 2, "nothing registered by the refusals");
    assert_eq!(
        RegisterError::UnknownBits { bits: 1 << 8 }.to_string(),
        "event mask has bits 0x100 that are neither an event (0x3300ff) nor a flag (0x3000000) of this memhook"
    );
    assert_eq!(
        bits::check_mask(bits::MMAP | bits::NO_INSTALL | bits::EXISTING_ALLOC),
        Ok(())
    );
    d.unregister(&depth, a).unwrap();
    assert_eq!(d.unregister(&depth, a), Err(RegisterError::NotFound));
    d.register(&depth, bits::MMAP, 0, handler(3)).unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(
        RegisterError::Full { capacity: 2 }.to_string(),
        "handler table is full (2 handlers)"
    );
}

#[test]
fn unregister_by_handler_clears_bits_then_removes() {
    let d: Dispatcher<FnHandler, 4> = Dispatcher::new();
    let depth = DispatchDepth::new();
    d.register(&depth, bits::MMAP | bits::MUNMAP, 0, handler(1)).unwrap();
    d.register(&depth, bits::MMAP, 0, handler(2)).unwrap();
    assert_eq!(d.unregister_handler(&depth, bits::MMAP, &handler(1)), Ok(0));
    assert!(d.has_handlers(bits::MUNMAP));
    assert_eq!(d.unregister_handler(&depth, bits::MUNMAP, &handler(1)), Ok(1));
    assert!(!d.has_handlers(bits::MUNMAP));
    assert_eq!(d.len(), 1);
}

/// A handler that counts calls and fails the test if it runs after its
/// unregistration returned.
#[derive(Clone, Copy)]
struct Watched {
    calls: &'static AtomicUsize,
    gone: &'static AtomicBool,
}

impl PartialEq for Watched {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.gone, other.gone)
    }
}

impl Handler for Watched {
    fn call(&self, _event: &mut Event) {
        assert!(
            !self.gone.load(Ordering::SeqCst),
            "handler called after unregister returned"
        );
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn concurrent_dispatch_never_sees_an_unregistered_handler() {
    static D: Dispatcher<Watched, 8> = Dispatcher::new();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    static STOP: AtomicBool = AtomicBool::new(false);
    let threads = 2;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let depth = DispatchDepth::new();
                barrier.wait();
                let mut n = 0u64;
                while !STOP.load(Ordering::Relaxed) {
                    let mut ev = munmap();
                    D.dispatch(&depth, &mut ev, original_ok);
                    n += 1;
                }
                n
            })
        })
        .collect();
    barrier.wait();
    let depth = DispatchDepth::new();
    // One flag per registration, each its own handler's.
    static GONE: [AtomicBool; 1000] = [const { AtomicBool::new(false) }; 1000];
    for gone in &GONE {
        let id = D
            .register(&depth, bits::MUNMAP, 0, Watched { calls: &CALLS, gone })
            .unwrap();
        std::thread::yield_now();
        D.unregister(&depth, id).unwrap();
        gone.store(true, Ordering::SeqCst);
    }
    STOP.store(true, Ordering::Relaxed);
    let dispatched: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(dispatched > 0);
    assert!(D.is_empty());
}

#[test]
fn companion_events_come_before_pre_and_after_post_handlers() {
    let d: Dispatcher<FnHandler, 8> = Dispatcher::new();
    let depth = DispatchDepth::new();
    d.register(&depth, bits::VM_UNMAPPED | bits::VM_MAPPED, 0, handler(1))
        .unwrap();
    d.register(&depth, bits::MUNMAP, -1, handler(2)).unwrap();
    d.register(&depth, bits::MUNMAP, 1, handler(3)).unwrap();
    d.register(&depth, bits::VM_UNMAPPED, -7, handler(4)).unwrap();
    take_log();
    let mut ev = munmap();
    let before = Some(Event::VmUnmapped(VmEvent {
        address: 0x1000,
        size: 4096,
    }));
    let out = d.dispatch_around(&depth, before, &mut ev, original_ok, |e| {
        // Made from the finished event: the original has run.
        assert_eq!(e.result(), Some(0));
        Some(Event::VmMapped(VmEvent {
            address: 0x1000,
            size: 4096,
        }))
    });
    let order: Vec<usize> = take_log().iter().map(|(c, _)| *c).collect();
    // VM_UNMAPPED's handlers (by priority), MUNMAP's pre, [original],
    // MUNMAP's post, then VM_MAPPED's.
    assert_eq!(order, [4, 1, 2, 3, 1]);
    assert_eq!(out.handlers, 5);
    // A companion nobody wants is not delivered, and costs no table visit.
    let quiet: Dispatcher<FnHandler, 8> = Dispatcher::new();
    let mut ev = munmap();
    let out = quiet.dispatch_around(
        &depth,
        Some(Event::VmUnmapped(VmEvent { address: 1, size: 1 })),
        &mut ev,
        original_ok,
        |_| None,
    );
    assert_eq!((out.handlers, out.called_original), (0, true));
}

#[test]
fn a_dispatch_split_around_the_callers_own_call_keeps_every_rule() {
    let d: Dispatcher<FnHandler, 8> = Dispatcher::new();
    let depth = DispatchDepth::new();
    d.register(&depth, bits::VM_UNMAPPED, 0, handler(1)).unwrap();
    d.register(&depth, bits::MUNMAP, -1, handler(2)).unwrap();
    d.register(&depth, bits::MUNMAP, 3, handler(3)).unwrap();
    d.register(&depth, bits::VM_MAPPED, 0, handler(4)).unwrap();
    take_log();
    let mut before = Event::VmUnmapped(VmEvent {
        address: 0x1000,
        size: 4096,
    });
    let mut ev = munmap();
    let pass = d.begin(&depth, Some(&mut before), &mut ev);
    // Inside the pass the thread counts as dispatching: registering would
    // wait for itself, so it is refused.
    assert_eq!(depth.get(), 1);
    assert_eq!(
        d.register(&depth, bits::MMAP, 0, handler(9)),
        Err(RegisterError::InsideHandler)
    );
    assert!(pass.call_original);
    original_ok(&mut ev);
    let mut follow = Event::VmMapped(VmEvent {
        address: 0x1000,
        size: 4096,
    });
    let out = d.finish(&depth, pass, &mut ev, Some(&mut follow));
    assert_eq!(depth.get(), 0);
    assert_eq!(
        out,
        Dispatched {
            handlers: 4,
            called_original: true,
            overflowed: false
        }
    );
    let order: Vec<usize> = take_log().iter().map(|(c, _)| *c).collect();
    assert_eq!(order, [1, 2, 3, 4]);

    // A pre-handler's valid result: the pass says not to call.
    d.register(&depth, bits::MMAP, -5, filler(0x7000)).unwrap();
    let mut ev = mmap_event();
    let pass = d.begin(&depth, None, &mut ev);
    assert!(!pass.call_original);
    let out = d.finish(&depth, pass, &mut ev, None);
    assert!(!out.called_original);
    assert_eq!(ev.result(), Some(0x7000));
}

#[test]
fn a_full_table_of_mixed_masks_calls_exactly_the_matching_handlers_in_order() {
    let d: Dispatcher<FnHandler, 64> = Dispatcher::new();
    let depth = DispatchDepth::new();
    let kinds = [bits::MMAP, bits::MUNMAP, bits::VM_MAPPED, bits::MEM_TYPE_FREE];
    let mut ids = Vec::new();
    for ctx in 0..64usize {
        // Every handler wants some of the kinds, at a priority from -3 to 3.
        let events = kinds
            .iter()
            .enumerate()
            .filter(|(k, _)| ctx % (k + 2) == 0)
            .fold(bits::BRK, |m, (_, b)| m | b);
        let prio = (ctx % 7) as i32 - 3;
        ids.push((
            ctx,
            events,
            prio,
            d.register(&depth, events, prio, handler(ctx)).unwrap(),
        ));
    }
    assert!(matches!(
        d.register(&depth, bits::MMAP, 0, handler(99)),
        Err(RegisterError::Full { .. })
    ));
    // Unregister every third one: the rest keep their order.
    for (ctx, _, _, id) in &ids {
        if ctx % 3 == 0 {
            d.unregister(&depth, *id).unwrap();
        }
    }
    let live: Vec<_> = ids.iter().filter(|(ctx, ..)| ctx % 3 != 0).collect();
    for &kind in &kinds {
        take_log();
        let mut ev = match kind {
            bits::MMAP => mmap_event(),
            bits::MUNMAP => munmap(),
            bits::VM_MAPPED => Event::VmMapped(VmEvent { address: 0, size: 1 }),
            _ => Event::MemTypeFree(memhook_core::event::MemTypeEvent {
                address: 0,
                size: 1,
                mem_type: 1,
            }),
        };
        d.dispatch(&depth, &mut ev, |_| {});
        let got: Vec<usize> = take_log().iter().map(|(c, _)| *c).collect();
        let mut want: Vec<(i32, usize)> = live
            .iter()
            .filter(|(_, ev, ..)| ev & kind != 0)
            .map(|(ctx, _, prio, _)| (*prio, *ctx))
            .collect();
        want.sort(); // by priority, then registration order (= context)
        assert_eq!(got, want.iter().map(|w| w.1).collect::<Vec<_>>(), "kind {kind:#x}");
    }
}

#[test]
fn a_handler_unregistered_during_a_call_misses_its_post_pass_and_nothing_waits_for_the_call() {
    static D: Dispatcher<FnHandler, 8> = Dispatcher::new();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    static GONE: AtomicBool = AtomicBool::new(false);
    fn post(_: &mut Event, _: usize) {
        // Never after unregister returned.
        assert!(!GONE.load(Ordering::SeqCst));
        CALLS.fetch_add(1, Ordering::SeqCst);
    }
    let depth = DispatchDepth::new();
    let id = D
        .register(&depth, bits::MUNMAP, 0, FnHandler { func: post, context: 0 })
        .unwrap();
    let in_call = Arc::new(Barrier::new(2));
    let unregistered = Arc::new(Barrier::new(2));
    let t = {
        let (in_call, unregistered) = (in_call.clone(), unregistered.clone());
        std::thread::spawn(move || {
            let depth = DispatchDepth::new();
            let mut ev = munmap();
            D.dispatch(&depth, &mut ev, |e| {
                in_call.wait();
                // The "system call" lasts until the handler is gone: the
                // registration must not wait for it (it would deadlock).
                unregistered.wait();
                original_ok(e);
            })
        })
    };
    in_call.wait();
    D.unregister(&depth, id).unwrap();
    GONE.store(true, Ordering::SeqCst);
    unregistered.wait();
    let out = t.join().unwrap();
    // The call's post pass came after unregister returned: no handler.
    assert_eq!((out.handlers, CALLS.load(Ordering::SeqCst)), (0, 0));
}

#[test]
fn notify_runs_pre_then_post_handlers_once_each_and_keeps_the_result_rule() {
    // An embedder's report of a host event: no original call between the
    // phases, one walk; a valid result filled by the first pre-handler
    // stays, whatever later handlers write.
    let d: Dispatcher<FnHandler, 8> = Dispatcher::new();
    let depth = DispatchDepth::new();
    d.register(&depth, bits::MMAP, 4, handler(3)).unwrap();
    d.register(&depth, bits::MMAP, -5, filler(0xa000)).unwrap();
    d.register(&depth, bits::MMAP, -1, handler(2)).unwrap();
    d.register(&depth, bits::MMAP, 2, filler(0xb000)).unwrap();
    d.register(&depth, bits::VM_MAPPED, 0, handler(9)).unwrap();
    take_log();
    let mut ev = mmap_event();
    let out = d.notify(&depth, &mut ev);
    assert_eq!(out.handlers, 4);
    assert!(!out.overflowed);
    assert_eq!(ev.result(), Some(0xa000));
    // The loggers saw the kept result, pre-handler first; the VM_MAPPED
    // handler was not called for an MMAP event.
    assert_eq!(take_log(), vec![(2, 0xa000), (3, 0xa000)]);
    assert_eq!(depth.get(), 0);
}

/// One event of every kind.
fn one_of_each() -> [Event; 12] {
    let vm = VmEvent { address: 0, size: 1 };
    let mt = memhook_core::event::MemTypeEvent {
        address: 0,
        size: 1,
        mem_type: 0,
    };
    [
        mmap_event(),
        munmap(),
        Event::Mremap(memhook_core::event::MremapEvent {
            result: INVALID_PTR,
            address: 0,
            old_size: 1,
            new_size: 2,
            flags: 0,
            new_address: 0,
        }),
        Event::Shmat(memhook_core::event::ShmatEvent {
            result: INVALID_PTR,
            shmid: 0,
            shmaddr: 0,
            shmflg: 0,
        }),
        Event::Shmdt(memhook_core::event::ShmdtEvent { result: -1, shmaddr: 0 }),
        Event::Sbrk(memhook_core::event::SbrkEvent {
            result: INVALID_PTR,
            increment: 1,
        }),
        Event::Madvise(memhook_core::event::MadviseEvent {
            result: -1,
            addr: 0,
            length: 1,
            advice: 4,
        }),
        Event::Brk(memhook_core::event::BrkEvent { result: -1, addr: 0 }),
        Event::VmMapped(vm),
        Event::VmUnmapped(vm),
        Event::MemTypeAlloc(mt),
        Event::MemTypeFree(mt),
    ]
}

#[test]
fn exactly_the_host_call_events_carry_a_result() {
    // Dispatch takes the result rule's path by event kind; the kinds with
    // a result must be exactly those whose `result()` is `Some`.
    let all = one_of_each();
    let host =
        bits::MMAP | bits::MUNMAP | bits::MREMAP | bits::SHMAT | bits::SHMDT | bits::SBRK | bits::MADVISE | bits::BRK;
    let mut seen = 0;
    for mut e in all {
        seen |= e.kind();
        assert_eq!(e.result().is_some(), e.kind() & host != 0, "{e:?}");
        // And a post-handler may fill a still-invalid result of exactly
        // those kinds (the rule's path runs for them).
        let d: Dispatcher<FnHandler, 2> = Dispatcher::new();
        let depth = DispatchDepth::new();
        d.register(&depth, e.kind(), 0, handler(1)).unwrap();
        take_log();
        assert_eq!(d.notify(&depth, &mut e).handlers, 1);
        assert_eq!(take_log().len(), 1);
    }
    assert_eq!(seen, bits::ALL_EVENTS, "every kind is covered");
}

#[test]
fn only_a_pre_handler_can_skip_the_original() {
    // An event that arrives with a valid result (an embedder's own) still
    // gets its original call when no pre-handler ran; a companion event's
    // pre-handlers cannot skip it either.
    let d: Dispatcher<FnHandler, 8> = Dispatcher::new();
    let depth = DispatchDepth::new();
    d.register(&depth, bits::VM_UNMAPPED, -1, handler(1)).unwrap();
    d.register(&depth, bits::MUNMAP, 1, handler(2)).unwrap();
    take_log();
    let mut ev = Event::Munmap(MunmapEvent {
        result: 0,
        address: 0x1000,
        size: 4096,
    });
    let mut before = Some(Event::VmUnmapped(VmEvent {
        address: 0x1000,
        size: 4096,
    }));
    let pass = d.begin(&depth, before.as_mut(), &mut ev);
    assert!(pass.call_original, "no pre-handler of MUNMAP ran");
    let out = d.finish(&depth, pass, &mut ev, None);
    assert!(out.called_original);
    assert_eq!(out.handlers, 2);
    assert_eq!(take_log(), vec![(1, 0), (2, 0)]);
    assert_eq!(depth.get(), 0);
}

#[test]
fn every_kind_of_payload_lies_where_payload_ptr_says() {
    // The C ABI hands a handler the payload in place (one add, whatever
    // the kind): each variant's struct must start there, and fit in the
    // event.
    fn at<T>(e: &mut T) -> usize {
        core::ptr::from_mut(e).addr()
    }
    let mut seen = 0;
    for mut e in one_of_each() {
        seen |= e.kind();
        let start = core::ptr::from_mut(&mut e).addr();
        let here = e.payload_ptr().addr();
        assert_eq!(here, start + Event::PAYLOAD_OFFSET, "{e:?}");
        let (field, size) = match &mut e {
            Event::Mmap(p) => (at(p), size_of_val(p)),
            Event::Munmap(p) => (at(p), size_of_val(p)),
            Event::Mremap(p) => (at(p), size_of_val(p)),
            Event::Shmat(p) => (at(p), size_of_val(p)),
            Event::Shmdt(p) => (at(p), size_of_val(p)),
            Event::Sbrk(p) => (at(p), size_of_val(p)),
            Event::Madvise(p) => (at(p), size_of_val(p)),
            Event::Brk(p) => (at(p), size_of_val(p)),
            Event::VmMapped(p) | Event::VmUnmapped(p) => (at(p), size_of_val(p)),
            Event::MemTypeAlloc(p) | Event::MemTypeFree(p) => (at(p), size_of_val(p)),
        };
        assert_eq!(field, here, "{e:?}");
        assert!(Event::PAYLOAD_OFFSET + size <= size_of::<Event>(), "{e:?}");
    }
    assert_eq!(seen, bits::ALL_EVENTS, "every kind is covered");
}

/// The dispatcher of [`a_signal_handler_changing_the_handlers_mid_change_is_refused`],
/// whose platform barrier (run while a registration holds the writer's
/// lock) stands in for a signal handler that registers on the same
/// thread.
static INTERRUPTED: Dispatcher<FnHandler, 8> = Dispatcher::new();

thread_local! {
    static INTERRUPTED_DEPTH: DispatchDepth = const { DispatchDepth::new() };
}

/// What each registration the barrier made returned.
static REFUSED_INSIDE: std::sync::Mutex<Vec<Result<(), RegisterError>>> = std::sync::Mutex::new(Vec::new());

static NEXT_THREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn barrier_that_registers() -> bool {
    let r = INTERRUPTED_DEPTH.with(|depth| INTERRUPTED.register(depth, bits::MMAP, 0, handler(7)).map(|_| ()));
    REFUSED_INSIDE.lock().unwrap().push(r);
    true
}

static INTERRUPTING: memhook_core::event::Asymmetric = memhook_core::event::Asymmetric {
    barrier: barrier_that_registers,
    thread_id: || NEXT_THREAD.fetch_add(1, Ordering::Relaxed),
    thread_alive: |_| true,
};

/// A registration made on a thread in the middle of that thread's own
/// registration (as by a signal handler that interrupted it: here the
/// barrier, which runs with the writer's lock held) is refused at once
/// with `InsideHandler`, and the registration it interrupted finishes;
/// the thread's mark is gone afterwards, so its next registration works.
/// Before, the nested one spun on the lock its own thread held, for good.
#[test]
fn a_signal_handler_changing_the_handlers_mid_change_is_refused() {
    INTERRUPTED.enable_slots(&INTERRUPTING);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let register = || INTERRUPTED_DEPTH.with(|d| INTERRUPTED.register(d, bits::MUNMAP, 0, handler(1)).map(|_| ()));
        let first = register();
        let second = register();
        tx.send((first, second)).unwrap();
    });
    let Ok((first, second)) = rx.recv_timeout(std::time::Duration::from_secs(30)) else {
        panic!("the registration made inside its own thread's registration waited for that thread");
    };
    assert_eq!((first, second), (Ok(()), Ok(())));
    let nested = REFUSED_INSIDE.lock().unwrap();
    assert!(!nested.is_empty(), "the barrier ran");
    assert!(
        nested.iter().all(|r| *r == Err(RegisterError::InsideHandler)),
        "{nested:?}"
    );
}

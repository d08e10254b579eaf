//! Dispatch through per-thread reader slots (plain stores, the writer's
//! membarrier supplying the fence): registration still never lets a removed
//! handler run, threads beyond the slot count and threads that exited are
//! handled, and the slots are on wherever the kernel has the barrier.
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use memhook::event::{Event, VmEvent, bits};
use memhook::{HandlerFn, report_event, set_handler, unset_handler};

/// The tests share the process's one dispatcher: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn vm_event(address: usize) -> Event {
    Event::VmMapped(VmEvent { address, size: 4096 })
}

/// Whether this process was started with the slots' opt-out,
/// `MEMHOOK_READER_SLOTS=0` (read at load: a developer's shell may export
/// it).
fn opted_out() -> bool {
    std::env::var("MEMHOOK_READER_SLOTS").as_deref() == Ok("0")
}

#[test]
fn slots_are_on_where_the_kernel_has_the_expedited_membarrier() {
    // SAFETY: membarrier(MEMBARRIER_CMD_QUERY) reads nothing.
    let supported = unsafe { libc::syscall(libc::SYS_membarrier, 0, 0, 0) };
    let expedited = supported >= 0 && supported & (1 << 3) != 0;
    if opted_out() {
        assert!(
            !memhook::dispatch::reader_slots(),
            "MEMHOOK_READER_SLOTS=0 is not honoured"
        );
        return;
    }
    assert_eq!(memhook::dispatch::reader_slots(), expedited);
    if expedited {
        // Where the slots are on, the writers' barrier is one the kernel
        // takes (a refused one would leave the dispatcher spinning in its
        // place, unseen).
        assert!(
            memhook::dispatch::reader_fence(),
            "the reader slots' membarrier is refused"
        );
    }
}

#[test]
fn one_membarrier_registration_serves_the_slots_and_code_patching() {
    // Each registration from a threaded process waits for an RCU grace
    // period (12 to 16 ms on the dev VM: a `dlopen` of libmemhook.so into
    // Python paid two). Where the kernel has the SYNC_CORE command,
    // memhook registers for it alone (code patching needs it, the slots
    // take it), and the plain command stays unregistered: the kernel
    // refuses it (EPERM). Nothing else in this test binary registers.
    // SAFETY: membarrier(MEMBARRIER_CMD_QUERY) reads nothing.
    let supported = unsafe { libc::syscall(libc::SYS_membarrier, 0, 0, 0) };
    if supported < 0 || supported & (1 << 5) == 0 {
        eprintln!("no membarrier SYNC_CORE here: not checked");
        return;
    }
    if opted_out() {
        eprintln!("MEMHOOK_READER_SLOTS=0 in this process's environment: no slots, not checked");
        return;
    }
    assert!(memhook::dispatch::reader_slots(), "SYNC_CORE serves the reader slots");
    assert!(memhook::dispatch::reader_fence());
    // SAFETY: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) touches no memory.
    let plain = unsafe { libc::syscall(libc::SYS_membarrier, 1 << 3, 0, 0) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert_eq!(
        (plain, errno),
        (-1, Some(libc::EPERM)),
        "memhook registered for the plain command too (a second grace period)"
    );
}

static LIVE: AtomicBool = AtomicBool::new(false);
static LATE_CALLS: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);

fn checked(_: &mut Event) {
    if !LIVE.load(Ordering::SeqCst) {
        LATE_CALLS.fetch_add(1, Ordering::SeqCst);
    }
    CALLS.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn no_handler_runs_after_unset_returns_while_eight_threads_dispatch() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(9));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (stop, start) = (stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    report_event(&mut vm_event(0x1000 * (i * 1_000_000 + n))).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    start.wait();
    let deadline = Instant::now() + Duration::from_millis(400);
    let mut cycles = 0;
    while Instant::now() < deadline || cycles < 50 {
        LIVE.store(true, Ordering::SeqCst);
        let id = set_handler(bits::VM_MAPPED, 0, HandlerFn::Rust(&checked)).unwrap();
        std::thread::sleep(Duration::from_micros(200));
        unset_handler(id).unwrap();
        // From here on the handler must not run.
        LIVE.store(false, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(50));
        cycles += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let dispatched: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(dispatched > 0);
    assert!(CALLS.load(Ordering::Relaxed) > 0, "the handler ran while registered");
    assert_eq!(
        LATE_CALLS.load(Ordering::SeqCst),
        0,
        "a handler ran after unset_handler returned ({cycles} cycles)"
    );
}

static SEEN: AtomicUsize = AtomicUsize::new(0);

fn count(_: &mut Event) {
    SEEN.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn more_threads_than_slots_and_exited_threads_all_deliver() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let id = set_handler(bits::VM_MAPPED, 0, HandlerFn::Rust(&count)).unwrap();
    SEEN.store(0, Ordering::Relaxed);
    let slots = memhook::event::READER_SLOTS;
    // More threads alive at once than there are slots: the rest use the
    // shared counters.
    let hold = Arc::new(Barrier::new(slots + 9));
    let threads: Vec<_> = (0..slots + 8)
        .map(|i| {
            let hold = hold.clone();
            std::thread::spawn(move || {
                report_event(&mut vm_event(0x1000 * i)).unwrap();
                hold.wait();
                report_event(&mut vm_event(0x1000 * i)).unwrap();
            })
        })
        .collect();
    hold.wait();
    // A registration waits for every reader; none is reading now.
    let other = set_handler(bits::VM_UNMAPPED, 0, HandlerFn::Rust(&count)).unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(SEEN.load(Ordering::Relaxed), 2 * (slots + 8));
    // Those threads are gone: new threads take their slots over.
    let threads: Vec<_> = (0..slots)
        .map(|i| std::thread::spawn(move || report_event(&mut vm_event(0x1000 * i)).unwrap()))
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(SEEN.load(Ordering::Relaxed), 3 * slots + 16);
    unset_handler(other).unwrap();
    unset_handler(id).unwrap();
}

//! Events an embedder reports itself (`report_event`, what an allocator
//! with `NO_INSTALL` does): a free whose size the reporter does not know
//! ends the allocation recorded at its address, and a range that runs past
//! the end of the address space is refused before anything sees it.
use std::sync::Mutex;

use memhook::event::{Event, MemTypeEvent, VmEvent, bits};
use memhook::memtype::{self, Lookup, MapError, MemType};
use memhook::{HandlerFn, report_event, set_handler, unset_handler};

/// What the test's handler saw: (event bit, address, size).
static SEEN: Mutex<Vec<(u32, usize, usize)>> = Mutex::new(Vec::new());

fn record(e: &mut Event) {
    let (address, size) = match *e {
        Event::VmMapped(v) | Event::VmUnmapped(v) => (v.address, v.size),
        Event::MemTypeAlloc(m) | Event::MemTypeFree(m) => (m.address, m.size),
        _ => return,
    };
    SEEN.lock().unwrap().push((e.kind(), address, size));
}

fn seen() -> Vec<(u32, usize, usize)> {
    std::mem::take(&mut *SEEN.lock().unwrap())
}

fn typed(address: usize, size: usize) -> MemTypeEvent {
    MemTypeEvent {
        address,
        size,
        mem_type: MemType::Cuda as u32,
    }
}

/// The tests share the handler and the map: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// `record`, registered for `events` until dropped (a failed test's
/// handler does not stay to double the next one's events).
struct Registered(memhook::event::HandlerId);

impl Registered {
    fn new(events: u32) -> Self {
        let id = set_handler(events, 0, HandlerFn::Rust(&record)).unwrap();
        seen();
        Registered(id)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        unset_handler(self.0).unwrap();
    }
}

#[test]
fn a_free_of_unknown_size_ends_the_allocation_recorded_at_its_address() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const AT: usize = 0x7e11_0000_0000;
    const LEN: usize = 1 << 20;
    let _handler = Registered::new(bits::MEM_TYPE_ALLOC | bits::MEM_TYPE_FREE);
    report_event(&mut Event::MemTypeAlloc(typed(AT, LEN))).unwrap();
    assert!(matches!(memtype::lookup(AT + 4096, 8), Lookup::Found(i) if i.mem_type == MemType::Cuda));

    // The free as a free call carries it: no size. The entry goes (a later
    // host mapping there must not be taken for device memory), and the
    // handlers and the reporter get the allocation's size.
    let mut free = Event::MemTypeFree(typed(AT, 0));
    report_event(&mut free).unwrap();
    assert_eq!(memtype::lookup(AT + 4096, 8), Lookup::Absent);
    assert!(matches!(free, Event::MemTypeFree(m) if m.size == LEN), "{free:?}");
    assert_eq!(
        seen(),
        [(bits::MEM_TYPE_ALLOC, AT, LEN), (bits::MEM_TYPE_FREE, AT, LEN)]
    );

    // Again, or inside the allocation rather than at its start: nothing
    // recorded there to end, delivered as it came.
    report_event(&mut Event::MemTypeAlloc(typed(AT, LEN))).unwrap();
    report_event(&mut Event::MemTypeFree(typed(AT + 4096, 0))).unwrap();
    assert!(matches!(memtype::lookup(AT + 4096, 8), Lookup::Found(_)));
    report_event(&mut Event::MemTypeFree(typed(AT, 0))).unwrap();
    report_event(&mut Event::MemTypeFree(typed(AT, 0))).unwrap();
    assert_eq!(memtype::lookup(AT, 8), Lookup::Absent);
    assert_eq!(
        seen(),
        [
            (bits::MEM_TYPE_ALLOC, AT, LEN),
            (bits::MEM_TYPE_FREE, AT + 4096, 0),
            (bits::MEM_TYPE_FREE, AT, LEN),
            (bits::MEM_TYPE_FREE, AT, 0),
        ]
    );
}

#[test]
fn a_range_past_the_end_of_the_address_space_is_refused_and_not_delivered() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _handler = Registered::new(bits::ALL_EVENTS);
    let (top, size) = (usize::MAX - 4095, 8192);
    let wraps = Err(MapError::WrapsAround { start: top, len: size });
    for mut e in [
        Event::VmMapped(VmEvent { address: top, size }),
        Event::VmUnmapped(VmEvent { address: top, size }),
        Event::MemTypeAlloc(typed(top, size)),
        Event::MemTypeFree(typed(top, size)),
    ] {
        assert_eq!(report_event(&mut e), wraps, "{e:?}");
    }
    assert_eq!(seen(), [], "no handler saw a refused event");
    assert_eq!(memtype::lookup(top, 8), Lookup::Absent, "nothing recorded");
    // A range that ends a page short of the end is like any other.
    let below = top - 4096;
    report_event(&mut Event::MemTypeAlloc(typed(below, 4096))).unwrap();
    assert!(matches!(memtype::lookup(below, 8), Lookup::Found(i) if i.base == below && i.len == 4096));
    report_event(&mut Event::MemTypeFree(typed(below, 4096))).unwrap();
    assert_eq!(
        seen(),
        [(bits::MEM_TYPE_ALLOC, below, 4096), (bits::MEM_TYPE_FREE, below, 4096)]
    );
}

//! The address ranges of graph allocations. CUDA gives a graph's
//! allocation (an allocation node, or a stream-ordered allocation made
//! while its stream captures) its address when the node is made, and
//! the memory comes and goes there with the graph: each launch makes it
//! again (after a free of the last one, or by the launch's own free with
//! `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`), and no call that
//! memhook hooks says when. The driver reuses such ranges from graph to
//! graph (on the H200 every graph allocation of a run got one address).
//!
//! So such a range stays Unknown in the map: a free reports
//! `MEM_TYPE_FREE` and then records the range Unknown again, and
//! `memtype::classify` does not record the driver's answer there (which
//! holds only until the graph's next free or launch). A lookup never
//! says host where a graph's memory may live; the caller asks the
//! driver. An allocation recorded over such a range (the driver handing
//! the address to other memory) replaces the Unknown entry as usual.
//!
//! The hooks take this table's lock only in paths that have called the
//! driver (a graph allocation, the free of an entry recorded Unknown, a
//! classification), never in a free of memory of a known type; no
//! registration holds it. Its holder is in a fork section
//! ([`crate::fork`]): a child never finds it held.
//!
//! Beyond [`CAPACITY`] ranges the oldest is forgotten, and from then on
//! (until the driver is unloaded) every range recorded Unknown is taken
//! for a graph's: kept Unknown after its free, and the driver's answer
//! not recorded there. A forgotten graph range whose free ended it would
//! read host at its graph's next launch, a wrong type; the cost of the
//! rule is only that other memory of a type the driver could not tell
//! (rare) stays Unknown after its free, where a lookup sends the caller
//! to the driver.

use core::sync::atomic::{AtomicBool, Ordering};

use memhook_core::memtype::{Lookup, MemType};

use crate::fork::Mutex;
use crate::memtype;

/// Ranges remembered at once.
pub(super) const CAPACITY: usize = 1024;

/// (base, length), oldest first.
static RANGES: Mutex<heapless::Vec<(usize, usize), CAPACITY>> = Mutex::new(heapless::Vec::new());

/// Whether a range was forgotten to make room (see the module docs).
static FORGOT: AtomicBool = AtomicBool::new(false);

/// Remembers `[base, base + len)` as a graph allocation's range.
pub(super) fn remember(base: usize, len: usize) {
    if len == 0 {
        return;
    }
    let mut ranges = RANGES.lock();
    if let Some(r) = ranges.iter_mut().find(|(b, _)| *b == base) {
        r.1 = len;
        return;
    }
    if ranges.is_full() {
        ranges.remove(0);
        FORGOT.store(true, Ordering::Relaxed);
    }
    let _ = ranges.push((base, len));
}

/// The graph allocation's range that covers `addr`, if one is
/// remembered.
pub(crate) fn covering(addr: usize) -> Option<(usize, usize)> {
    RANGES.lock().iter().copied().find(|&(b, n)| addr >= b && addr - b < n)
}

/// Whether the range `[base, base + len)`, recorded Unknown and now
/// freed, is to be recorded Unknown again: a graph allocation's range
/// (remembered, or, once one was forgotten, any such range).
pub(super) fn keeps(base: usize, len: usize) -> bool {
    FORGOT.load(Ordering::Relaxed) || covering(base) == Some((base, len))
}

/// Whether the driver's answer at `addr` holds only until a graph's next
/// free or launch, so is not to be recorded: a graph allocation's range
/// covers it (remembered, or, once one was forgotten, any range the map
/// holds Unknown there).
pub(crate) fn unsettled(addr: usize) -> bool {
    covering(addr).is_some()
        || (FORGOT.load(Ordering::Relaxed)
            && matches!(memtype::map().lookup(addr, 1), Lookup::Found(i) if i.mem_type == MemType::Unknown))
}

/// Forgets every range (the driver was unloaded).
pub(super) fn forget_all() {
    let mut ranges = RANGES.lock();
    ranges.clear();
    FORGOT.store(false, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_found_by_any_address_inside_and_the_oldest_goes_first() {
        forget_all();
        remember(0x1000, 0x100);
        assert_eq!(covering(0x1000), Some((0x1000, 0x100)));
        assert_eq!(covering(0x10ff), Some((0x1000, 0x100)));
        assert_eq!(covering(0x1100), None, "one past the end");
        assert_eq!(covering(0xfff), None);
        remember(0x1000, 0x200);
        assert_eq!(covering(0x1100), Some((0x1000, 0x200)), "the same base: the new length");
        for i in 1..CAPACITY {
            remember(0x10_0000 + i * 0x1000, 0x1000);
        }
        assert_eq!(covering(0x1000), Some((0x1000, 0x200)), "full, not yet beyond");
        assert!(keeps(0x1000, 0x200));
        assert!(!keeps(0x1000, 0x100), "another length: not the range remembered");
        assert!(!keeps(0x7000_0000, 0x1000), "not one of them, and none forgotten");
        remember(0x9000_0000, 0x1000);
        assert_eq!(covering(0x1000), None, "the oldest forgotten");
        assert!(covering(0x9000_0000).is_some());
        assert!(
            keeps(0x1000, 0x200),
            "one forgotten: any range recorded Unknown may be a graph's"
        );
        assert!(keeps(0x7000_0000, 0x1000));
        remember(0, 0);
        assert_eq!(covering(0), None, "an empty range is not remembered");
        forget_all();
        assert_eq!(covering(0x9000_0000), None);
        assert!(!keeps(0x1000, 0x200), "the driver unloaded: nothing forgotten any more");
    }

    /// A fork while another thread holds the table's lock waits for it:
    /// the child finds the lock free (with a plain spin lock, the child's
    /// first question would spin for good).
    #[test]
    fn a_child_forked_while_another_thread_holds_the_table_can_ask_it() {
        use std::sync::{Arc, Barrier};
        let _s = crate::fork::tests::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let held = Arc::new(Barrier::new(2));
        let holder = {
            let held = held.clone();
            std::thread::spawn(move || {
                let guard = RANGES.lock();
                held.wait();
                // Long enough that a fork not waiting would come first.
                std::thread::sleep(std::time::Duration::from_millis(100));
                drop(guard);
            })
        };
        held.wait();
        let code = crate::fork::tests::fork_and_check(|| i32::from(RANGES.try_lock().is_none()));
        assert_eq!(code, 0, "the child found the table's lock held");
        holder.join().unwrap();
    }
}

//! The opens of memory another process exported, counted as the driver
//! counts them. Driver 580 gives the same address for a second
//! `cuIpcOpenMemHandle` of one handle in one context, and unmaps it only
//! at the matching last `cuIpcCloseMemHandle` (seen on the H200): a
//! close that is not the last must neither end the range in the map (a
//! lookup would read the mapped memory as host) nor report a free, and
//! an open that is not the first reports nothing new.
//!
//! Only the IPC hooks take this table's lock, for a few loads and
//! stores, beside driver calls that take microseconds; no registration
//! holds it. Its holder is in a fork section ([`crate::fork`]): a child
//! never finds it held.
//!
//! The count can fall short of the driver's: opens made before the
//! hooks were installed, or beyond [`CAPACITY`] distinct open mappings,
//! are not counted (an open not counted is reported as the first, a
//! close as the last). So a close reported as the last is checked after
//! the call: if the driver still maps the address, the hook records it
//! again and reports its allocation anew. A free reported early is safe
//! (a registration cache registers again); a range left out of the map
//! while still mapped would read host.

use crate::fork::Mutex;

/// Distinct mappings counted at once.
pub(super) const CAPACITY: usize = 4096;

/// (address, opens not yet closed).
static OPEN: Mutex<heapless::Vec<(usize, u32), CAPACITY>> = Mutex::new(heapless::Vec::new());

/// A successful open that returned `address`: whether it is the first
/// (then it is reported).
pub(super) fn opened(address: usize) -> bool {
    let mut open = OPEN.lock();
    if let Some((_, n)) = open.iter_mut().find(|(a, _)| *a == address) {
        *n = n.saturating_add(1);
        return false;
    }
    let _ = open.push((address, 1));
    true
}

/// A close of `address` about to be made: whether it is the last (then
/// it is reported, and the range leaves the map). An address not
/// counted (opened before the hooks, or beyond the capacity) is taken
/// to be the last.
pub(super) fn closing(address: usize) -> bool {
    let mut open = OPEN.lock();
    let Some(i) = open.iter().position(|(a, _)| *a == address) else {
        return true;
    };
    if open[i].1 > 1 {
        open[i].1 -= 1;
        return false;
    }
    open.swap_remove(i);
    true
}

/// Forgets every count (the driver was unloaded).
pub(super) fn forget_all() {
    OPEN.lock().clear();
}

/// Forgets the count of `address` (its mapping ended without a close).
pub(super) fn forget(address: usize) {
    let mut open = OPEN.lock();
    if let Some(i) = open.iter().position(|(a, _)| *a == address) {
        open.swap_remove(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_and_a_first_close_are_neither_first_nor_last() {
        let a = 0x7000_1234_0000;
        assert!(opened(a), "first open");
        assert!(!opened(a), "second open of the same mapping");
        assert!(!closing(a), "one open remains");
        assert!(closing(a), "the last close");
        assert!(closing(a), "not counted any more: taken as the last");
        assert!(opened(a), "a new first open");
        forget(a);
        assert!(closing(a));
    }
}

//! The process's memory-type map, fed by `MEM_TYPE_ALLOC` / `MEM_TYPE_FREE`
//! events (the CUDA hooks, or an embedder's [`crate::report_event`]).
//!
//! [`lookup`] never calls a driver and is safe from any thread at any time,
//! signal handlers included. Host memory is implied by absence: an address
//! in no recorded range answers [`Lookup::Absent`], which callers whose
//! typed allocations are all hooked may read as host.

pub use memhook_core::memtype::{Inserted, Lookup, MapError, MemInfo, MemType, MemtypeMap};

use memhook_core::event::Event;

/// Ranges the map holds (beyond this, new ranges are dropped, counted, and
/// answer Unknown).
pub const CAPACITY: usize = 65_536;

static MAP: MemtypeMap<CAPACITY> = MemtypeMap::new();

/// What the map says about `[addr, addr + len)`.
#[inline]
pub fn lookup(addr: usize, len: usize) -> Lookup {
    MAP.lookup(addr, len)
}

/// Records `[start, start + len)` as `mem_type` on `device` (-1: none).
///
/// # Errors
///
/// An empty or wrapping range.
pub fn insert(start: usize, len: usize, mem_type: MemType, device: i32) -> Result<Inserted, MapError> {
    MAP.insert(start, len, mem_type, device)
}

/// Forgets `[start, start + len)`.
///
/// # Errors
///
/// An empty or wrapping range.
pub fn remove(start: usize, len: usize) -> Result<(), MapError> {
    MAP.remove(start, len)
}

/// Ranges dropped because the map was full.
pub fn dropped() -> u64 {
    MAP.dropped()
}

/// Live ranges.
pub fn len() -> usize {
    MAP.len()
}

/// Whether no range is recorded.
pub fn is_empty() -> bool {
    MAP.is_empty()
}

/// Feeds the map from a memory-type event (other events are ignored).
pub(crate) fn record(event: &Event) {
    match *event {
        Event::MemTypeAlloc(m) if m.size != 0 => {
            let _ = MAP.insert(m.address, m.size, MemType::from_raw(m.mem_type), -1);
        }
        Event::MemTypeFree(m) if m.size != 0 => {
            let _ = MAP.remove(m.address, m.size);
        }
        _ => {}
    }
}

//! A full memory-type map under the CUDA hooks (its own process: the range
//! the full map drops stays marked for the rest of it): a hooked allocation
//! that does not fit is dropped and counted, lookups inside it answer
//! Unknown (never Absent, never a wrong type), its events still reach the
//! handlers, and the map takes ranges again once there is room.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod common;

use std::ffi::c_void;

use common::*;
use memhook::event::bits;
use memhook::memtype::{self, Inserted, Lookup, MemType};

type Dptr = u64;

#[test]
fn a_full_map_drops_the_new_range_counts_it_and_never_answers_wrong() {
    let _serial = serial();
    let h = bistro_fake_driver();
    // SAFETY: the fake driver's functions of these types.
    let (alloc, free): (
        unsafe extern "C" fn(*mut Dptr, usize) -> u32,
        unsafe extern "C" fn(Dptr) -> u32,
    ) = unsafe { (cast(sym(h, c"cuMemAlloc_v2")), cast(sym(h, c"cuMemFree_v2"))) };

    // Fill the map to capacity with ranges far from the fake's addresses.
    let filler = |i: usize| 0x7d00_0000_0000usize + i * 0x2000;
    let room = memtype::CAPACITY - memtype::len();
    for i in 0..room {
        assert_eq!(
            memtype::insert(filler(i), 0x1000, MemType::Cuda, 0),
            Ok(Inserted::Stored)
        );
    }
    assert_eq!(memtype::len(), memtype::CAPACITY);
    let dropped = memtype::dropped();
    let _ = take();

    let mut p: Dptr = 0;
    // SAFETY: the fake driver's allocation, through its hooked entry.
    assert_eq!(unsafe { alloc(&mut p, 8192) }, 0);
    let p = p as usize;
    assert_eq!(memtype::dropped(), dropped + 1, "the range that did not fit is counted");
    for (at, len) in [(p, 1), (p + 4096, 64), (p, 8192)] {
        assert_eq!(memtype::lookup(at, len), Lookup::Unknown, "inside the dropped range");
    }
    let filled = filler(room / 2);
    assert!(matches!(memtype::lookup(filled, 16), Lookup::Found(i) if i.base == filled && i.mem_type == MemType::Cuda));
    // The handlers heard of it all the same.
    assert_eq!(one_event(take(), bits::MEM_TYPE_ALLOC, p, 8192).3, MemType::Cuda as u32);
    // SAFETY: its free, through the hooked entry.
    assert_eq!(unsafe { free(p as Dptr) }, 0);
    assert_eq!(one_event(take(), bits::MEM_TYPE_FREE, p, 8192).0, bits::MEM_TYPE_FREE);
    assert_eq!(
        memtype::lookup(p, 1),
        Lookup::Unknown,
        "a range once dropped stays unknown"
    );

    // Room again: the next allocation is recorded.
    for i in (0..room).rev() {
        assert_eq!(memtype::remove(filler(i), 0x1000), Ok(()));
    }
    let mut q: Dptr = 0;
    // SAFETY: as above.
    assert_eq!(unsafe { alloc(&mut q, 4096) }, 0);
    let q = q as usize;
    if q >= p + 8192 || q + 4096 <= p {
        assert!(matches!(memtype::lookup(q, 4096), Lookup::Found(i) if i.base == q && i.len == 4096));
    }
    assert_eq!(memtype::dropped(), dropped + 1);
    // SAFETY: as above.
    assert_eq!(unsafe { free(q as Dptr) }, 0);
    let _ = std::ptr::null::<c_void>();
}

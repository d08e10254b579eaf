//! More graph allocations than memhook remembers (`cuda::graph`'s 1,024
//! ranges), on the fake driver in bistro mode. A graph's allocation has
//! memory only while its graph runs, and each launch makes it again at
//! the same address with no call memhook sees, so its range must stay
//! Unknown in the map after a free: host there would be a wrong type at
//! the next launch. That holds for the ranges memhook had to forget to
//! make room too. A test binary of its own: the table, once overflowed,
//! stays so for the process (until the driver is unloaded).
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod common;

use std::ffi::{CStr, c_void};

use common::*;
use cudarc::driver::sys::CUDA_MEM_ALLOC_NODE_PARAMS;
use memhook::event::bits;
use memhook::memtype::{self, Lookup, MemType};

type Dptr = u64;

fn f<T>(h: *mut c_void, name: &CStr) -> T {
    // SAFETY: each use names the driver function of type T.
    unsafe { cast(sym(h, name)) }
}

/// The map's answer at `p`: a range recorded Unknown, `[base, base + len)`.
fn assert_unknown(p: usize, base: usize, len: usize, what: &str) {
    match memtype::lookup(p, 1) {
        Lookup::Found(i) => assert_eq!(
            (i.mem_type, i.base, i.len),
            (MemType::Unknown, base, len),
            "{what}: {p:#x}"
        ),
        other => panic!("{what}: lookup({p:#x}) = {other:?}, not a range recorded Unknown"),
    }
}

#[test]
fn graph_ranges_beyond_those_remembered_stay_unknown_after_their_free() {
    type AllocNode =
        unsafe extern "C" fn(*mut usize, usize, *const usize, usize, *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> u32;
    let _serial = serial();
    let h = bistro_fake_driver();
    let alloc_node: AllocNode = f(h, c"cuGraphAddMemAllocNode");
    let alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32 = f(h, c"cuMemAlloc_v2");
    let free: unsafe extern "C" fn(Dptr) -> u32 = f(h, c"cuMemFree_v2");
    let launch: unsafe extern "C" fn(Dptr) -> i32 = f(h, c"fake_graph_launch");
    const LEN: usize = 64 << 10;
    const NODES: usize = 1100; // more than the 1,024 remembered
    let _ = take();
    let mut node = 0usize;
    let mut graph = Vec::new();
    for _ in 0..NODES {
        // SAFETY: the fake driver's function with valid arguments.
        let mut params: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
        params.bytesize = LEN;
        // SAFETY: as above.
        assert_eq!(unsafe { alloc_node(&mut node, 1, std::ptr::null(), 0, &mut params) }, 0);
        graph.push(params.dptr as usize);
    }
    let events = take();
    assert_eq!(events.len(), NODES, "one event per allocation node");
    assert!(
        events
            .iter()
            .all(|e| e.0 == bits::MEM_TYPE_ALLOC && e.3 == MemType::Unknown as u32)
    );

    // The oldest (forgotten to make room) and the newest (remembered):
    // each graph runs, is freed, and runs again.
    for &g in [graph[0], graph[NODES - 1]].iter() {
        assert_unknown(g, g, LEN, "made");
        // SAFETY: the fake's graph launch of an allocation it made.
        assert_eq!(unsafe { launch(g as Dptr) }, 0);
        // The driver's answer, good only until the graph's free, is
        // given to the caller and not recorded.
        let Lookup::Found(info) = memtype::classify(g, 4096) else {
            panic!("the driver knows {g:#x} while its graph runs")
        };
        assert_eq!((info.mem_type, info.base, info.len), (MemType::Cuda, g, LEN));
        assert_unknown(g, g, LEN, "after classify");
        // SAFETY: the fake driver's free of memory it made.
        assert_eq!(unsafe { free(g as Dptr) }, 0);
        let freed = take();
        assert_eq!(freed.len(), 1, "{freed:x?}");
        assert_eq!((freed[0].0, freed[0].1, freed[0].2), (bits::MEM_TYPE_FREE, g, LEN));
        // Not host: the graph's next launch makes the memory again here.
        assert_unknown(g + LEN / 2, g, LEN, "after its free");
    }

    // Other memory still ends as usual: a plain allocation's free leaves
    // nothing behind.
    let mut d: Dptr = 0;
    // SAFETY: the fake driver's functions with valid arguments.
    unsafe {
        assert_eq!(alloc(&mut d, 4096), 0);
        assert!(matches!(memtype::lookup(d as usize, 1), Lookup::Found(i) if i.mem_type == MemType::Cuda));
        assert_eq!(free(d), 0);
    }
    assert_eq!(memtype::lookup(d as usize, 1), Lookup::Absent);
    let _ = take();
}

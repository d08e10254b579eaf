//! The memtype map against its BTreeMap model: random operation sequences
//! (overlaps, adjacency, splits, a full map, zero-length and wrapping ranges).

use memhook_core::memtype::{MemType, MemtypeMap};
use memhook_tests::memtype_model::{Op, check_ops, ops_from_bytes};
use proptest::prelude::*;

fn mem_type() -> impl Strategy<Value = MemType> {
    prop_oneof![
        Just(MemType::Host),
        Just(MemType::Cuda),
        Just(MemType::CudaManaged),
        Just(MemType::CudaHost),
        Just(MemType::Unknown),
    ]
}

/// Addresses on a 0x100 grid in a small window, so that ranges overlap,
/// touch and split; now and then the very top of the address space.
fn addr() -> impl Strategy<Value = usize> {
    prop_oneof![
        20 => (0usize..64).prop_map(|k| 0x10000 + k * 0x100),
        1 => (0usize..4).prop_map(|k| usize::MAX - k * 0x100),
    ]
}

fn len() -> impl Strategy<Value = usize> {
    prop_oneof![
        20 => (1usize..24).prop_map(|k| k * 0x100),
        2 => Just(0usize),
        1 => Just(usize::MAX / 2),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (addr(), len(), mem_type(), -1i32..4)
            .prop_map(|(start, len, mem_type, device)| Op::Insert { start, len, mem_type, device }),
        1 => (addr(), len(), mem_type(), -1i32..4)
            .prop_map(|(start, len, mem_type, device)| Op::InsertMarked { start, len, mem_type, device }),
        1 => (addr(), len()).prop_map(|(start, len)| Op::Remove { start, len }),
        1 => addr().prop_map(|start| Op::Take { start }),
        4 => (addr(), prop_oneof![Just(0usize), 1usize..0x400]).prop_map(|(addr, len)| Op::Lookup { addr, len }),
    ]
}

static SMALL: MemtypeMap<6> = MemtypeMap::new();
static LARGE: MemtypeMap<128> = MemtypeMap::new();
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn small_map_matches_model(ops in proptest::collection::vec(op(), 1..80)) {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        check_ops(&SMALL, &ops);
    }

    #[test]
    fn large_map_matches_model(ops in proptest::collection::vec(op(), 1..200)) {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        check_ops(&LARGE, &ops);
    }

    #[test]
    fn fuzz_decoding_matches_model(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        check_ops(&SMALL, &ops_from_bytes(&data));
    }
}

#[test]
fn adjacent_ranges_stay_separate_and_exact() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ops = [
        Op::Insert {
            start: 0x1000,
            len: 0x1000,
            mem_type: MemType::Cuda,
            device: 0,
        },
        Op::Insert {
            start: 0x2000,
            len: 0x1000,
            mem_type: MemType::Cuda,
            device: 1,
        },
        Op::Lookup { addr: 0x1fff, len: 1 },
        Op::Lookup {
            addr: 0x2000,
            len: 0x1000,
        },
        Op::Lookup {
            addr: 0x1ff0,
            len: 0x20,
        },
        Op::Remove {
            start: 0x1800,
            len: 0x1000,
        },
        Op::Lookup { addr: 0x1800, len: 1 },
        Op::Lookup {
            addr: 0x2800,
            len: 0x800,
        },
    ];
    check_ops(&LARGE, &ops);
}

static DEEP: MemtypeMap<1024> = MemtypeMap::new();

/// Ranges spread over a wide window, so that hundreds live at once and the
/// search tree has several levels (capacity 1,024: two index levels).
fn wide_op() -> impl Strategy<Value = Op> {
    let start = (0usize..4096).prop_map(|k| 0x100000 + k * 0x100);
    prop_oneof![
        6 => (start.clone(), 1usize..6, mem_type(), -1i32..2)
            .prop_map(|(start, k, mem_type, device)| Op::Insert { start, len: k * 0x100, mem_type, device }),
        1 => (start.clone(), 1usize..40).prop_map(|(start, k)| Op::Remove { start, len: k * 0x100 }),
        3 => (start, 0usize..0x300).prop_map(|(addr, len)| Op::Lookup { addr, len }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn deep_tree_matches_model(ops in proptest::collection::vec(wide_op(), 600..1500)) {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        check_ops(&DEEP, &ops);
    }
}

/// Allocation-like traffic: a few fixed ranges recorded, freed exactly and
/// recorded again (often as the same kind of memory, sometimes not), with
/// now and then an overlapping record: what the writer's shortcuts for a
/// free right after its allocation, and for a reused address, must get
/// right on both tables; and frees that end an allocation by its start
/// alone (`take`, as a CUDA free without a size does).
fn churn_op() -> impl Strategy<Value = Op> {
    let range = (0usize..4).prop_map(|k| (0x40000 + k * 0x1000, 0x1000));
    prop_oneof![
        4 => (range.clone(), prop_oneof![Just(MemType::Cuda), Just(MemType::CudaHost)], 0i32..2)
            .prop_map(|((start, len), mem_type, device)| Op::Insert { start, len, mem_type, device }),
        4 => range.clone().prop_map(|(start, len)| Op::Remove { start, len }),
        3 => range.clone().prop_map(|(start, _)| Op::Take { start }),
        1 => (0usize..8).prop_map(|k| Op::Insert {
            start: 0x40800 + k * 0x800,
            len: 0x1000,
            mem_type: MemType::CudaManaged,
            device: 1,
        }),
        3 => (0usize..0x4000).prop_map(|off| Op::Lookup { addr: 0x40000 + off, len: 8 }),
    ]
}

static CHURN: MemtypeMap<16> = MemtypeMap::new();

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn allocation_churn_matches_model(ops in proptest::collection::vec(churn_op(), 1..120)) {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        check_ops(&CHURN, &ops);
    }
}

static CLUSTERS: MemtypeMap<512> = MemtypeMap::new();

/// Three clusters far apart (device memory, pinned host memory, and a few
/// stray ranges low in the address space), each dense enough that the map
/// keeps a bucket table cut into segments at the gaps between them, and
/// ranges that come and go inside each, so that updates recount buckets,
/// stray past a segment's buckets and trigger whole rebuilds.
fn cluster_op() -> impl Strategy<Value = Op> {
    let start = prop_oneof![
        8 => (0usize..1024).prop_map(|k| 0x7f07_afe0_0000 + k * 0x1_0000),
        4 => (0usize..256).prop_map(|k| 0x7f86_0000_0000 + k * 0x20_0000),
        1 => (0usize..16).prop_map(|k| 0x10_0000 + k * 0x1000),
        1 => (0usize..64).prop_map(|k| 0x7f86_0000_0000 + (256 + k * 64) * 0x20_0000),
    ];
    prop_oneof![
        8 => (start.clone(), 1usize..4, mem_type(), -1i32..2)
            .prop_map(|(start, k, mem_type, device)| Op::Insert { start, len: k * 0x1000, mem_type, device }),
        2 => (start.clone(), 1usize..64).prop_map(|(start, k)| Op::Remove { start, len: k * 0x1_0000 }),
        1 => start.clone().prop_map(|start| Op::Take { start }),
        6 => (start, 0usize..0x2000).prop_map(|(addr, off)| Op::Lookup { addr: addr + off, len: 8 }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn far_apart_clusters_match_model(ops in proptest::collection::vec(cluster_op(), 400..1200)) {
        let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        check_ops(&CLUSTERS, &ops);
    }
}

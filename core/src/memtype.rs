//! The memory-type map: address ranges to [`MemInfo`], with lock-free lookups.
//!
//! [`MemtypeMap`] keeps non-overlapping ranges sorted by start in two
//! identical tables of fixed capacity `N` (chosen by the caller; storage is
//! inline, so a large map belongs in a `static`, where, being zero bytes
//! when new, it lies in `.bss`: the first writer, or [`MemtypeMap::prepare`],
//! lays out its sentinels). A writer (serialised by a
//! lock that readers never take) applies an update to the table readers are
//! not using, publishes it, then applies the same update to the other. Each
//! table has a sequence counter, odd while it is written; a lookup reads the
//! published table and validates the counter afterwards, retrying only in the
//! rare case that a writer rewrote the very table it was reading (a reader
//! that started before the previous publication). Readers write no shared
//! memory, so lookups from many threads do not contend, and an update never
//! blocks a lookup.
//!
//! # Finding the entry
//!
//! A table's starts are searched two ways, both branch-free within a node
//! (16 keys compared at once, with AVX2 where the CPU has it):
//! - a search tree over the starts: one node per level, so four dependent
//!   node searches at 65,536 entries;
//! - from 64 slots on, a bucket table: the starts cut into at most four
//!   segments at their widest gaps (so that device memory, pinned host
//!   memory and a stray range far from both each get buckets of their
//!   own), and each segment's span into a power-of-two number of equal,
//!   power-of-two-wide buckets (about one per four entries), each holding
//!   how many starts lie below it. A lookup reads its bucket's count (and
//!   the next bucket's) and, when at most 16 starts lie in the bucket,
//!   compares them: one small load and one node, whatever the size. A
//!   bucket with more (a dense cluster of small ranges in a wide span) is
//!   searched from the lowest tree level
//!   one node of which covers it: two nodes for up to 256 starts, rather
//!   than the tree's full height.
//!
//! # Updating
//!
//! The slots hold the entries in order with gaps among them (a
//! packed-memory array). A gap repeats the start of the entry after it, so
//! the search above never stops on one and needs no change for them. An
//! update rewrites one window of slots (`Table::edit`): usually the
//! entry it adds or removes and the gaps beside it; when the new entries do
//! not fit, the window widens over its neighbours and lays them out again
//! with the gaps spread evenly. So an update moves the entries near it, not
//! half the table, while the map is at most three quarters full; fuller, it
//! widens to the nearest free slot, as a sorted array shifts. A table of at
//! most 48 entries keeps them packed (a lookup among 16 compares one node)
//! and shifts.
//!
//! An update recounts the buckets that begin inside its window and adds its
//! change in length to the ones above (up to the first that counts every
//! slot); the bucket table is rebuilt when the length has halved or
//! doubled since, or many updates landed outside the buckets' plan, which
//! reaches as far again above the last start as below it.
//!
//! # The promise: never a wrong type
//!
//! - `insert` replaces whatever it overlaps (neighbours are trimmed or split).
//! - When the map is full, the new range is dropped and counted; the old
//!   information it overlapped is removed anyway, and the dropped range is
//!   remembered (as one conservative hull), so that lookups inside it answer
//!   [`Lookup::Unknown`], not [`Lookup::Absent`].
//! - A split that needs a slot the full map does not have drops the right-hand
//!   part the same way.
//! - `lookup(addr, len)` answers [`Lookup::Found`] only when the whole range
//!   lies in one entry; a range that straddles an entry's edge is
//!   [`Lookup::Unknown`].
//!
//! ```
//! use memhook_core::memtype::{Lookup, MemInfo, MemType, MemtypeMap};
//!
//! static MAP: MemtypeMap<1024> = MemtypeMap::new();
//! MAP.insert(0x10000, 0x1000, MemType::Cuda, 0).unwrap();
//! match MAP.lookup(0x10800, 16) {
//!     Lookup::Found(MemInfo { mem_type, device, base, len }) => {
//!         assert_eq!((mem_type, device, base, len), (MemType::Cuda, 0, 0x10000, 0x1000));
//!     }
//!     other => panic!("{other:?}"),
//! }
//! assert_eq!(MAP.lookup(0x20000, 16), Lookup::Absent);
//! assert_eq!(MAP.lookup(0x10ff8, 16), Lookup::Unknown); // straddles the end
//! ```

use core::fmt;

use crate::sync::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Mutex, Ordering, fence, spin_wait};

/// Kinds of memory. The values are the C ABI's `MEMHOOK_MEM_TYPE_*`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemType {
    /// Ordinary host memory.
    Host = 0,
    /// CUDA device memory.
    Cuda = 1,
    /// CUDA managed (unified) memory.
    CudaManaged = 2,
    /// Page-locked host memory registered with or allocated by CUDA.
    CudaHost = 3,
    /// Not known.
    Unknown = 15,
}

impl MemType {
    /// From the C ABI value; anything unknown is [`MemType::Unknown`].
    pub const fn from_raw(raw: u32) -> Self {
        match raw {
            0 => MemType::Host,
            1 => MemType::Cuda,
            2 => MemType::CudaManaged,
            3 => MemType::CudaHost,
            _ => MemType::Unknown,
        }
    }

    /// Lower-case name, as the CLI prints it.
    pub const fn name(self) -> &'static str {
        match self {
            MemType::Host => "host",
            MemType::Cuda => "cuda",
            MemType::CudaManaged => "cuda_managed",
            MemType::CudaHost => "cuda_host",
            MemType::Unknown => "unknown",
        }
    }
}

/// What the map knows about one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Kind of memory.
    pub mem_type: MemType,
    /// Device ordinal, -1 for none.
    pub device: i32,
    /// Start of the allocation the address belongs to.
    pub base: usize,
    /// Length of that allocation.
    pub len: usize,
}

/// The answer of [`MemtypeMap::lookup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The whole range lies in this entry.
    Found(MemInfo),
    /// No entry overlaps the range, and no dropped range does.
    Absent,
    /// The range straddles an entry's edge, or overlaps a range the map had
    /// to drop: the caller must ask the driver.
    Unknown,
}

impl Lookup {
    /// The memory type the answer implies, with [`Lookup::Absent`] read as
    /// `absent` (host, where the caller's hooks see every typed allocation).
    pub const fn mem_type_or(self, absent: MemType) -> MemType {
        match self {
            Lookup::Found(info) => info.mem_type,
            Lookup::Absent => absent,
            Lookup::Unknown => MemType::Unknown,
        }
    }
}

/// Why an update was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapError {
    /// A range of length 0.
    EmptyRange {
        /// Its start.
        start: usize,
    },
    /// `start + len` overflows the address space.
    WrapsAround {
        /// The start.
        start: usize,
        /// The length.
        len: usize,
    },
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MapError::EmptyRange { start } => write!(f, "empty range at {start:#x}"),
            MapError::WrapsAround { start, len } => {
                write!(f, "range {start:#x}+{len:#x} wraps around the address space")
            }
        }
    }
}

impl core::error::Error for MapError {}

/// What an insert did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// The range is in the map.
    Stored,
    /// The map was full: the range was dropped (and counted); lookups in it
    /// answer Unknown.
    Dropped,
}

/// An entry's packed type and device: the type in the low bits, the
/// caller's mark ([`MemtypeMap::insert_marked`]) in bit 16, the device in
/// the high word.
const fn pack(mem_type: MemType, device: i32) -> u64 {
    (mem_type as u32 as u64) | ((device as u32 as u64) << 32)
}

/// The mark's bit in a packed entry.
const MARK: u64 = 1 << 16;

const fn unpack(meta: u64, base: usize, end: usize) -> MemInfo {
    MemInfo {
        mem_type: MemType::from_raw(meta as u32 & 0xffff),
        device: (meta >> 32) as u32 as i32,
        base,
        len: end - base,
    }
}

/// The spare table catches up by copying the live one's entries when at
/// most this many differ; beyond, by applying the operation again.
const COPY_CATCH_UP: usize = 8;

/// Keys per node of the search tree: two cache lines of starts.
const B: usize = 16;

/// From this many entries on, a table keeps its bucket table (see
/// [`Table::bucket_rank`]); below, the search tree alone answers.
const BUCKETS_MIN: usize = 64;
/// A bucket's count when every slot in use starts below it (read as the
/// table's length): it stays right as the length changes.
const ALL: u32 = u32::MAX;

/// What bucket stores for `below` of the `n` slots in use starting below it.
fn bucket_count(below: usize, n: usize) -> u32 {
    if below >= n { ALL } else { below as u32 }
}

/// Entries per bucket, on average, that a bucket table is sized for.
const STARTS_PER_BUCKET: usize = 4;
/// Most segments a bucket table is cut into (see
/// [`Table::rebuild_all_buckets`]).
const SEGMENTS: usize = 4;

/// One segment of a bucket table: buckets `base..end` of the table, each
/// `1 << shift` bytes wide from `lo` on (the last one reaching to the next
/// segment's `lo`). An unused segment has `lo == usize::MAX` (0 in a
/// table never written: see [`Table::lay_out`]).
struct Segment {
    lo: AtomicUsize,
    shift: AtomicUsize,
    base: AtomicUsize,
    end: AtomicUsize,
}

impl Segment {
    #[cfg(not(memhook_loom))]
    const fn new() -> Self {
        Segment {
            lo: AtomicUsize::new(0),
            shift: AtomicUsize::new(0),
            base: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
        }
    }

    #[cfg(memhook_loom)]
    fn new() -> Self {
        Segment {
            lo: AtomicUsize::new(0),
            shift: AtomicUsize::new(0),
            base: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
        }
    }

    /// The first address of its bucket `b`, at most `limit` (the next
    /// segment's `lo`: a segment's power-of-two buckets may reach past it,
    /// and the buckets there must still count no more starts than the
    /// next segment's first, so that counts never fall from one bucket to
    /// the next).
    fn bucket_start(&self, b: usize, limit: usize) -> usize {
        let (lo, shift) = (self.lo.load(Ordering::Relaxed), self.shift.load(Ordering::Relaxed));
        let local = b - self.base.load(Ordering::Relaxed);
        let at = if local == 0 {
            lo
        } else if local > usize::MAX >> shift {
            usize::MAX
        } else {
            lo.saturating_add(local << shift)
        };
        at.min(limit)
    }
}
/// Most levels above the starts (16^8 keys is far beyond any capacity).
const MAX_LEVELS: usize = 8;

/// Shape of the implicit search tree over the starts: level `l` (stored in
/// `index[off[l]..off[l] + size[l]]`) holds every 16th key of the level
/// below it (level 0's below is `starts`), padded with `usize::MAX` to a
/// multiple of 16. The top level has at most 16 keys.
struct Geometry {
    levels: usize,
    off: [usize; MAX_LEVELS],
    size: [usize; MAX_LEVELS],
    total: usize,
}

const fn geometry(capacity: usize) -> Geometry {
    let mut g = Geometry {
        levels: 0,
        off: [0; MAX_LEVELS],
        size: [0; MAX_LEVELS],
        total: 0,
    };
    let mut below = capacity;
    while below > B && g.levels < MAX_LEVELS {
        let size = below.div_ceil(B).next_multiple_of(B);
        g.off[g.levels] = g.total;
        g.size[g.levels] = size;
        g.total += size;
        g.levels += 1;
        below = size;
    }
    g
}

/// Where a range ends and what it is: read together on a hit.
struct Slot {
    end: AtomicUsize,
    meta: AtomicU64,
}

/// `starts` comes first, so that it begins on a cache line: a bucket's
/// window of 16 starts then spans two lines, not three (see
/// [`Table::bucket_rank`]). What every lookup reads besides (the sequence,
/// the length, the bucket table's shape) lies together after the arrays.
#[repr(C, align(64))]
struct Table<const N: usize> {
    /// Sorted starts of the slots `0..len`; `usize::MAX` after them. A gap
    /// repeats the start of the entry after it, which the last slot in use
    /// always is.
    starts: [AtomicUsize; N],
    /// Where each slot's range ends (0 for a gap) and what it is.
    slots: [Slot; N],
    /// The upper levels of the search tree (see [`Geometry`]).
    index: [AtomicUsize; N],
    /// The bucket table: `buckets[b]`, for `b < bucket_total`, is the
    /// number of starts below the first address of bucket `b` (see
    /// [`Segment`]), or [`ALL`].
    buckets: [AtomicU32; N],
    /// Odd while a writer is changing this table.
    seq: AtomicU64,
    /// Slots in use: entries and the gaps between them (see [`Table::edit`]).
    len: AtomicUsize,
    /// Buckets in use; 0 while the table keeps no bucket table.
    bucket_total: AtomicUsize,
    segments: [Segment; SEGMENTS],
    /// Entries (slots in use that are not gaps).
    count: AtomicUsize,
    /// Writer only: the length at the last full rebuild of the buckets,
    /// and the updates since whose range began past its segment's last
    /// bucket (so that the buckets no longer fit the starts well).
    built_len: AtomicUsize,
    strays: AtomicUsize,
    /// Writer only: the levels of the search tree kept up to date (those a
    /// reader uses at the current length, [`Table::levels_for`]); the
    /// levels above hold `usize::MAX` only.
    index_levels: AtomicUsize,
}

/// Changes made by one table update that happen outside the table.
#[derive(Default)]
struct Spill {
    dropped: u64,
    hull: Option<(usize, usize)>,
}

impl Spill {
    fn drop_range(&mut self, start: usize, end: usize) {
        self.dropped += 1;
        self.hull = Some(match self.hull {
            Some((lo, hi)) => (lo.min(start), hi.max(end)),
            None => (start, end),
        });
    }
}

/// An update, as the writer replays it on the second table.
///
/// Its tags start at 1, so that the writer lock's `None` (no operation
/// pending) is a zero tag: the whole map, lock included, is zero bytes
/// when new (checked by `NONE_IS_ZERO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Op {
    /// Record `[start, end)` with `meta`; `pure` when it overlapped no
    /// entry and was stored (so removing exactly it undoes it).
    Insert {
        // First: with the tag before it, the variant takes 32 bytes, not 40
        // (`repr(u8)` lays fields out in order).
        pure: bool,
        start: usize,
        end: usize,
        meta: u64,
    } = 1,
    /// Forget `[start, end)`.
    Remove { start: usize, end: usize } = 2,
    /// Forget `[start, end)`, which the table it is pending for holds as
    /// one entry with `meta` that a pure insert made: recording the same
    /// range with the same `meta` again cancels it.
    Undo { start: usize, end: usize, meta: u64 } = 3,
    /// Forget everything.
    Clear = 4,
}

/// No operation pending is a zero tag (see [`Op`]). Checked where the map
/// is built in a `static` (the loom model builds it at run time).
#[cfg(not(memhook_loom))]
#[allow(unsafe_code)]
const NONE_IS_ZERO: () = {
    let none: Option<(Op, usize)> = None;
    // SAFETY: reads one byte of a live local. Its first byte is the tag
    // of `Op` (`repr(u8)`), where `None` keeps its niche; were it an
    // uninitialised byte instead (a layout that put the `usize` first),
    // const evaluation would refuse the read and the crate would not build.
    let tag = unsafe { *(&raw const none).cast::<u8>() };
    assert!(tag == 0, "the writer lock's None is not zero bytes");
};

impl Op {
    /// Applies the operation to `t` (whose sequence number is odd).
    fn run<const N: usize>(self, t: &Table<N>, spill: &mut Spill) -> Edit {
        match self {
            Op::Insert { start, end, meta, .. } => t.edit(start, end, Some(meta), spill),
            Op::Remove { start, end } | Op::Undo { start, end, .. } => t.edit(start, end, None, spill),
            Op::Clear => {
                let old_n = t.len.load(Ordering::Relaxed);
                t.len.store(0, Ordering::Relaxed);
                t.count.store(0, Ordering::Relaxed);
                Edit {
                    result: Inserted::Stored,
                    from: 0,
                    to: old_n,
                    span: None,
                    touched: true,
                    moved: true,
                }
            }
        }
    }
}

/// What one table edit did.
#[derive(Clone, Copy, Debug)]
struct Edit {
    /// The insert's outcome (`Stored` for the other operations).
    result: Inserted,
    /// The slots `from..to` may have changed; none outside.
    from: usize,
    to: usize,
    /// The addresses `[lo, hi]` every changed start lies in, old or new
    /// (`None`: unknown, the buckets are recounted from `from` on).
    span: Option<(usize, usize)>,
    /// Whether an entry overlapped the range.
    touched: bool,
    /// Whether entries outside the range were moved to other slots (the
    /// window was widened and laid out afresh).
    moved: bool,
}

impl Edit {
    /// A stored edit of slots `from..to` that moved no entry but by the
    /// one it added or removed, every changed start in `span`.
    const fn local(from: usize, to: usize, span: (usize, usize), touched: bool) -> Self {
        Edit {
            result: Inserted::Stored,
            from,
            to,
            span: Some(span),
            touched,
            moved: false,
        }
    }
}

/// The most pieces one edit writes: the left part of a trimmed entry, the
/// inserted range, and the right part of a trimmed entry.
const PIECES: usize = 3;

/// A window of this many slots or fewer is laid out however full or empty
/// it is; a larger one is widened until at least a quarter of its slots
/// hold entries, so that runs of gaps stay short.
const SMALL_WINDOW: usize = 8;

/// A table of at most this many entries keeps them packed, without gaps.
const SMALL_TABLE: usize = 3 * B;

/// Whether a widened window of `room` slots (in a table of `n` slots) may
/// hold `m` entries. The bound falls from all of them for the smallest
/// windows to three quarters for the whole table (the packed-memory
/// array's density thresholds): a window laid out afresh leaves its
/// smaller windows room to spare, so an insert widens far only after
/// many inserts near it.
fn roomy(m: usize, room: usize, n: usize) -> bool {
    if room <= SMALL_WINDOW {
        return m <= room;
    }
    let level = |slots: usize| (usize::BITS - 1 - (slots / SMALL_WINDOW).max(1).leading_zeros()) as usize;
    let top = level(n.max(2 * SMALL_WINDOW));
    let at = level(room).min(top);
    // m / room <= 3/4 + 1/4 * (top - at) / top
    m * 4 * top <= room * (3 * top + (top - at))
}

/// How many of `keys[start..end]` are `<= addr` (no branch per key).
#[inline(always)]
fn count_le(keys: &[AtomicUsize], start: usize, end: usize, addr: usize) -> usize {
    let mut c = 0;
    for k in keys.get(start..end).unwrap_or(&[]) {
        c += (k.load(Ordering::Relaxed) <= addr) as usize;
    }
    c
}

/// How many keys of the sorted node `keys[start..start + 16]` are `<= addr`.
/// The sixteen compares are independent (no dependency chain); since the
/// keys are sorted, the ones form a prefix of the mask and its length is
/// the trailing zeros of the inverse (`bsf`, which every x86_64 has, where a
/// popcount would not be in the baseline target).
#[inline(always)]
fn node_rank(keys: &[AtomicUsize], start: usize, addr: usize) -> usize {
    let Some(node) = keys.get(start..start + B) else {
        return 0;
    };
    #[cfg(all(target_arch = "x86_64", not(memhook_loom)))]
    if crate::simd::avx2() {
        #[allow(unsafe_code)]
        // SAFETY: AVX2 is usable, and `node` is 16 aligned words (an
        // AtomicUsize has usize's size and alignment).
        return unsafe { crate::simd::node_rank(node.as_ptr().cast(), addr) };
    }
    node_rank_portable(node, addr)
}

/// [`node_rank`] without SIMD.
#[inline(always)]
fn node_rank_portable(node: &[AtomicUsize], addr: usize) -> usize {
    let mut mask = 0u32;
    for (j, k) in node.iter().enumerate() {
        mask |= ((k.load(Ordering::Relaxed) <= addr) as u32) << j;
    }
    (!mask).trailing_zeros() as usize
}

impl<const N: usize> Table<N> {
    const GEOMETRY: Geometry = geometry(N);
    const FITS: () = assert!(
        Self::GEOMETRY.total <= N && N < ALL as usize,
        "search tree does not fit the index, or bucket ranks do not fit u32"
    );

    /// A table of zero bytes (so that a map in a `static` lies in `.bss`:
    /// no file pages, and room for huge pages). Before its first update
    /// it must be laid out ([`Self::lay_out`]); until then its length is
    /// 0, and every lookup answers Absent whatever its starts hold.
    #[cfg(not(memhook_loom))]
    const fn new() -> Self {
        let () = Self::FITS;
        Self {
            seq: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            count: AtomicUsize::new(0),
            starts: [const { AtomicUsize::new(0) }; N],
            slots: [const {
                Slot {
                    end: AtomicUsize::new(0),
                    meta: AtomicU64::new(0),
                }
            }; N],
            index: [const { AtomicUsize::new(0) }; N],
            buckets: [const { AtomicU32::new(0) }; N],
            segments: [const { Segment::new() }; SEGMENTS],
            bucket_total: AtomicUsize::new(0),
            built_len: AtomicUsize::new(0),
            strays: AtomicUsize::new(0),
            index_levels: AtomicUsize::new(0),
        }
    }

    #[cfg(memhook_loom)]
    fn new() -> Self {
        let () = Self::FITS;
        Self {
            seq: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            count: AtomicUsize::new(0),
            starts: core::array::from_fn(|_| AtomicUsize::new(0)),
            slots: core::array::from_fn(|_| Slot {
                end: AtomicUsize::new(0),
                meta: AtomicU64::new(0),
            }),
            index: core::array::from_fn(|_| AtomicUsize::new(0)),
            buckets: core::array::from_fn(|_| AtomicU32::new(0)),
            segments: core::array::from_fn(|_| Segment::new()),
            bucket_total: AtomicUsize::new(0),
            built_len: AtomicUsize::new(0),
            strays: AtomicUsize::new(0),
            index_levels: AtomicUsize::new(0),
        }
    }

    /// Writes the values an empty table holds past its length: starts and
    /// search-tree keys `usize::MAX`, segments unused. Called once, by the
    /// first writer, before anything else changes the table. A reader may
    /// be reading it meanwhile: with length 0 its answer is Absent,
    /// whatever it counts among the starts (every slot's end is 0).
    fn lay_out(&self) {
        for key in self.starts.iter().chain(&self.index) {
            key.store(usize::MAX, Ordering::Relaxed);
        }
        for seg in &self.segments {
            seg.lo.store(usize::MAX, Ordering::Relaxed);
        }
    }

    /// Number of entries whose start is `<= addr`: through the bucket table
    /// where it answers, else through the search tree. Every index is
    /// bounds-checked, so torn data (validated by the caller) cannot push an
    /// access out of bounds.
    #[inline(always)]
    fn upper_bound(&self, n: usize, addr: usize) -> usize {
        if let Some(i) = self.bucket_rank(n, addr) {
            return i;
        }
        self.tree_rank(n, addr)
    }

    /// The bucket of `addr`, and bounds on the number of starts `<= addr`:
    /// the starts below the bucket, and below the next one (or all of
    /// them). `None` without a bucket table, or on torn data.
    #[inline(always)]
    fn bucket_bounds(&self, n: usize, addr: usize) -> Option<(usize, usize)> {
        let total = self.bucket_total.load(Ordering::Relaxed);
        if total == 0 {
            return None;
        }
        let seg = self.segment_of(addr);
        let Some(offset) = addr.checked_sub(seg.lo.load(Ordering::Relaxed)) else {
            return Some((0, 0)); // below every start
        };
        let (base, end) = (seg.base.load(Ordering::Relaxed), seg.end.load(Ordering::Relaxed));
        let shift = seg.shift.load(Ordering::Relaxed) as u32;
        // Past the segment's last bucket: its last (which reaches to the
        // next segment).
        let b = base + offset.checked_shr(shift)?.min(end.checked_sub(base + 1)?);
        let below = (self.buckets.get(b)?.load(Ordering::Relaxed) as usize).min(n);
        let upto = if b + 1 < total {
            (self.buckets.get(b + 1)?.load(Ordering::Relaxed) as usize).min(n)
        } else {
            n // the last bucket reaches past the last start
        };
        Some((below, upto))
    }

    /// The segment of the bucket table that address `v` falls in (the
    /// first when `v` lies below it): how many of the others begin at or
    /// below `v` (unused ones begin at usize::MAX), without a branch on the
    /// address. A table of one segment (spread ranges) skips even that: a
    /// branch on the table's shape, which stays put, so a lookup loads the
    /// segment's fields without waiting for the compares.
    #[inline(always)]
    fn segment_of(&self, v: usize) -> &Segment {
        let mut k = 0;
        if self.segments[1].lo.load(Ordering::Relaxed) != usize::MAX {
            for seg in &self.segments[1..] {
                k += usize::from(seg.lo.load(Ordering::Relaxed) <= v);
            }
        }
        &self.segments[k]
    }

    /// [`Self::upper_bound`] through the bucket table. The bucket of `addr`
    /// bounds the answer: at least the count of starts below the bucket,
    /// at most the count below the next one. When at most 16 starts lie
    /// in the bucket, one 16-key window of starts from the lower bound
    /// counts the rest: one load and one node where the tree takes a node
    /// per level. A bucket with more (a dense cluster of small ranges in a
    /// wide span) is searched from the lowest tree level one node of which
    /// covers it, rather than from the top. `None` on torn data (the
    /// caller's sequence check discards whatever this answers then).
    #[inline(always)]
    fn bucket_rank(&self, n: usize, addr: usize) -> Option<usize> {
        let (below, upto) = self.bucket_bounds(n, addr)?;
        // A window moved left to fit its array counts the same: the keys
        // it gains lie below the bucket, so below `addr`.
        if upto <= below + B {
            // The window from the line that holds `below` (eight starts to
            // a line, the array starting on one) where it still reaches
            // `upto`: two lines rather than three. Its keys before `below`
            // lie below the bucket, so below `addr`, as above.
            let line = below & !7;
            let first = if upto <= line + B { line } else { below }.min(N.saturating_sub(B));
            // The answer's slot is most likely the window's first few.
            // (A hint: an address off either end of the array is harmless.)
            #[cfg(all(target_arch = "x86_64", not(memhook_loom)))]
            crate::simd::prefetch(
                self.slots.as_ptr().wrapping_add(below.wrapping_sub(1)).cast(),
                (STARTS_PER_BUCKET + 1) * size_of::<Slot>(),
            );
            return Some(first + node_rank(&self.starts, first, addr));
        }
        // Level `l`'s keys are every (16^(l+1))th start: the window of 16
        // from the key at or before `below` covers the bucket when it
        // reaches `upto`. Its keys before `below` are below `addr` and its
        // keys from `upto` on above it, so its count is the level's.
        let g = &Self::GEOMETRY;
        let mut stride_log = B.trailing_zeros();
        for l in 0..g.levels {
            let first = (below >> stride_log).min(g.size[l] - B);
            if upto <= (first + B) << stride_log {
                let p = first + node_rank(&self.index, g.off[l] + first, addr);
                return Some(self.descend(l, p, addr));
            }
            stride_log += B.trailing_zeros();
        }
        None
    }

    /// [`Self::upper_bound`] through the search tree, from its top.
    #[inline(always)]
    fn tree_rank(&self, n: usize, addr: usize) -> usize {
        let g = &Self::GEOMETRY;
        if g.levels == 0 {
            return count_le(&self.starts, 0, n, addr);
        }
        if n <= B {
            // One leaf holds every entry (the starts past `n` are
            // usize::MAX): no level above it to walk.
            return node_rank(&self.starts, 0, addr);
        }
        // Start at the lowest level whose keys fit in one node: the levels
        // above it are not kept for this length.
        let l = Self::levels_for(n) - 1;
        let p = node_rank(&self.index, g.off[l], addr);
        self.descend(l, p, addr)
    }

    /// The number of starts `<= addr`, given `p`, the number of level
    /// `l`'s keys `<= addr`: one node per level below.
    #[inline(always)]
    fn descend(&self, mut l: usize, mut p: usize, addr: usize) -> usize {
        let g = &Self::GEOMETRY;
        while l > 0 {
            l -= 1;
            if p == 0 {
                return 0;
            }
            // With a consistent table the child lies inside its level;
            // a torn read (discarded by the caller) may point past it.
            // A predicted branch, where a clamp would lengthen the chain
            // of dependent loads.
            let start = B * (p - 1);
            if start + B > g.size[l] {
                return 0;
            }
            p = start + node_rank(&self.index, g.off[l] + start, addr);
        }
        if p == 0 {
            return 0;
        }
        let mut start = B * (p - 1);
        if !N.is_multiple_of(B) {
            // Starts past `n` are usize::MAX, so a window moved left to
            // fit the array still counts exactly.
            start = start.min(N - B);
        } else if start + B > N {
            return 0; // torn
        }
        // The slot the answer reads is one of this leaf's: fetch them while
        // the leaf's starts are compared (two misses overlap instead of
        // following each other).
        #[cfg(all(target_arch = "x86_64", not(memhook_loom)))]
        if let Some(slots) = self.slots.get(start..start + B) {
            crate::simd::prefetch(slots.as_ptr().cast(), size_of_val(slots));
        }
        start + node_rank(&self.starts, start, addr)
    }

    /// The answer from this table, possibly torn (validated by the caller).
    #[inline(always)]
    fn probe(&self, addr: usize, end: usize) -> Lookup {
        let n = self.len.load(Ordering::Relaxed).min(N);
        let i = self.upper_bound(n, addr);
        if i > 0 {
            let slot = &self.slots[i - 1];
            let e = slot.end.load(Ordering::Relaxed);
            if end <= e {
                let s = self.starts[i - 1].load(Ordering::Relaxed);
                let meta = slot.meta.load(Ordering::Relaxed);
                if s > addr || e < s {
                    return Lookup::Unknown; // torn; the caller retries
                }
                return Lookup::Found(unpack(meta, s, e));
            }
            if addr < e {
                return Lookup::Unknown;
            }
        }
        if i < n && self.starts[i].load(Ordering::Relaxed) < end {
            return Lookup::Unknown;
        }
        Lookup::Absent
    }

    // Writer side: called only with the writer lock held, on a table no
    // reader will trust (its sequence number is odd).

    fn end(&self, i: usize) -> usize {
        self.slots[i].end.load(Ordering::Relaxed)
    }

    /// The end and packed type of the entry that starts at `start`.
    fn starting_at(&self, start: usize) -> Option<(usize, u64)> {
        let i = self.upper_bound(self.len.load(Ordering::Relaxed).min(N), start);
        let (s, e, m) = self.get(i.checked_sub(1)?);
        (s == start && e > start).then_some((e, m))
    }

    fn get(&self, i: usize) -> (usize, usize, u64) {
        (
            self.starts[i].load(Ordering::Relaxed),
            self.end(i),
            self.slots[i].meta.load(Ordering::Relaxed),
        )
    }

    /// The entries in slots `from..len`, in address order (gaps skipped).
    fn entries(&self, from: usize) -> impl Iterator<Item = MemInfo> + '_ {
        (from..self.len.load(Ordering::Relaxed)).filter_map(|i| {
            let (s, e, m) = self.get(i);
            (e != 0).then(|| unpack(m, s, e))
        })
    }

    fn set(&self, i: usize, (s, e, m): (usize, usize, u64)) {
        self.starts[i].store(s, Ordering::Relaxed);
        self.slots[i].end.store(e, Ordering::Relaxed);
        self.slots[i].meta.store(m, Ordering::Relaxed);
    }

    /// Moves entries `from..n` to `from + by` (right, `by > 0`) or left:
    /// one sequential pass per array (a memmove of atomics, without a
    /// bounds check per element).
    fn shift(&self, n: usize, from: usize, by: isize) {
        let by_abs = by.unsigned_abs();
        let (lo, hi) = if by > 0 { (from, n + by_abs) } else { (from - by_abs, n) };
        let (Some(starts), Some(slots)) = (self.starts.get(lo..hi), self.slots.get(lo..hi)) else {
            return;
        };
        fn moved<T>(items: &[T], by: isize, mv: impl Fn(&T, &T)) {
            let k = by.unsigned_abs();
            if by > 0 {
                // Right: from the end down, each item to `k` places later.
                for (dst, src) in items[k..].iter().rev().zip(items[..items.len() - k].iter().rev()) {
                    mv(dst, src);
                }
            } else {
                for (dst, src) in items[..items.len() - k].iter().zip(items[k..].iter()) {
                    mv(dst, src);
                }
            }
        }
        moved(starts, by, |d, s| d.store(s.load(Ordering::Relaxed), Ordering::Relaxed));
        moved(slots, by, |d, s| {
            d.end.store(s.end.load(Ordering::Relaxed), Ordering::Relaxed);
            d.meta.store(s.meta.load(Ordering::Relaxed), Ordering::Relaxed);
        });
    }

    /// Whether slot `i` holds an entry (not a gap).
    fn is_entry(&self, i: usize) -> bool {
        self.end(i) != 0
    }

    /// How many of the slots `range` hold entries.
    fn entries_in(&self, range: core::ops::Range<usize>) -> usize {
        range.filter(|&i| self.is_entry(i)).count()
    }

    /// `a`, moved down over the gaps just below it (to the slot after an
    /// entry, or 0).
    fn after_entry(&self, mut a: usize) -> usize {
        while a > 0 && !self.is_entry(a - 1) {
            a -= 1;
        }
        a
    }

    /// `b`, moved up over gaps to the next entry (or `n`).
    fn entry_from(&self, mut b: usize, n: usize) -> usize {
        while b < n && !self.is_entry(b) {
            b += 1;
        }
        b
    }

    /// First index in `0..n` whose key (by `key`) is greater than `addr`.
    fn first_above(&self, n: usize, addr: usize, key: impl Fn(usize) -> usize) -> usize {
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if key(mid) <= addr {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The levels of the search tree a reader uses at length `n`: none
    /// while one leaf holds every start, else those up to the lowest level
    /// one node of which covers them all (where [`Self::tree_rank`]
    /// starts, and where [`Self::bucket_rank`] stops at the latest).
    #[inline(always)]
    fn levels_for(n: usize) -> usize {
        let g = &Self::GEOMETRY;
        if n <= B || g.levels == 0 {
            return 0;
        }
        let mut l = 0;
        let mut span = B * B;
        while l + 1 < g.levels && n > span {
            l += 1;
            span *= B;
        }
        l + 1
    }

    /// Sets the starts of slots `n..old_n`, past a length shrunk from
    /// `old_n` to `n`, to `usize::MAX` (what every start past the length
    /// holds).
    #[inline(always)]
    fn clear_starts(&self, n: usize, old_n: usize) {
        for i in n..old_n {
            self.starts[i].store(usize::MAX, Ordering::Relaxed);
        }
    }

    /// Rewrites the search tree after the starts of slots `from..to`
    /// changed and the length went from `old_n` to the current one (`to`
    /// covers both lengths when they differ). Only the levels a reader
    /// uses at the new length are kept: a small table's edits touch no
    /// level above them (a queue of eight allocations rewrote all four
    /// levels of a 65,536-slot map at every update, each level's first
    /// key being the first start). A level no longer used goes back to
    /// `usize::MAX`, and one used again is built whole.
    fn rebuild_index(&self, from: usize, to: usize, old_n: usize) {
        let n = self.len.load(Ordering::Relaxed);
        self.clear_starts(n, old_n);
        let g = &Self::GEOMETRY;
        let (want, have) = (Self::levels_for(n), self.index_levels.load(Ordering::Relaxed));
        let key_below = |l: usize, j: usize| {
            if l == 0 {
                self.starts[j].load(Ordering::Relaxed)
            } else {
                self.index[g.off[l - 1] + j].load(Ordering::Relaxed)
            }
        };
        let to = if n == old_n {
            to.min(n)
        } else {
            to.max(n).max(old_n).min(N)
        };
        let (mut real, mut old_real, mut from, mut to) = (n, old_n, from, to);
        for l in 0..want.min(have) {
            let (up, old_up) = (real.div_ceil(B), old_real.div_ceil(B));
            // The first key of this level that changes: the levels above
            // depend on nothing else, so they stop where this one is as
            // it was (an entry added or removed past a node's first key
            // changes no level at all).
            let mut changed: Option<(usize, usize)> = None;
            for i in from / B..to.div_ceil(B).min(up.max(old_up)).min(g.size[l]) {
                let key = if i < up { key_below(l, B * i) } else { usize::MAX };
                let slot = &self.index[g.off[l] + i];
                if slot.load(Ordering::Relaxed) != key {
                    slot.store(key, Ordering::Relaxed);
                    changed = Some((changed.map_or(i, |(first, _)| first), i));
                }
            }
            let Some((first, last)) = changed else {
                break;
            };
            (real, old_real, from, to) = (up, old_up, first, last + 1);
        }
        if want == have {
            return;
        }
        // The real keys of each level at the old length and at the new.
        let (mut old_keys, mut keys) = (old_n, n);
        for l in 0..want.max(have) {
            (old_keys, keys) = (old_keys.div_ceil(B), keys.div_ceil(B));
            if l >= want {
                for i in 0..old_keys.min(g.size[l]) {
                    self.index[g.off[l] + i].store(usize::MAX, Ordering::Relaxed);
                }
            } else if l >= have {
                for i in 0..keys.min(g.size[l]) {
                    self.index[g.off[l] + i].store(key_below(l, B * i), Ordering::Relaxed);
                }
            }
        }
        self.index_levels.store(want, Ordering::Relaxed);
    }

    /// The first address of bucket `b` (`b` below the total).
    fn bucket_start(&self, b: usize) -> usize {
        let k = self
            .segments
            .iter()
            .position(|seg| b < seg.end.load(Ordering::Relaxed))
            .unwrap_or(0);
        let limit = self
            .segments
            .get(k + 1)
            .map_or(usize::MAX, |next| next.lo.load(Ordering::Relaxed));
        self.segments[k].bucket_start(b, limit)
    }

    /// The first bucket that begins above `v`, and whether `v` lies past
    /// its segment's last bucket start (the buckets did not plan for it).
    fn bucket_after(&self, v: usize) -> (usize, bool) {
        let seg = self.segment_of(v);
        let (base, end) = (seg.base.load(Ordering::Relaxed), seg.end.load(Ordering::Relaxed));
        match v.checked_sub(seg.lo.load(Ordering::Relaxed)) {
            None => (0, false),
            Some(offset) => {
                let local = offset >> seg.shift.load(Ordering::Relaxed);
                (base + (local + 1).min(end - base), local >= end - base)
            }
        }
    }

    /// Rewrites the bucket table after the starts from index `from` on
    /// changed (the length was `old_n`), all of the added and removed
    /// ones within `span` when known. An update recounts the buckets that
    /// begin inside its span and adds the change in length to those past
    /// it; the whole table is rebuilt (see [`Self::rebuild_all_buckets`])
    /// when the length has halved or doubled since the last rebuild, a
    /// start lies below the first segment, or a quarter as many updates
    /// as there were entries landed past their segment's buckets.
    fn rebuild_buckets(&self, from: usize, old_n: usize, span: Option<(usize, usize)>) {
        let n = self.len.load(Ordering::Relaxed);
        let total = self.bucket_total.load(Ordering::Relaxed);
        // Built from BUCKETS_MIN slots on, dropped below three quarters of
        // that: a table whose length hovers near it is not rebuilt at
        // every crossing.
        if n < BUCKETS_MIN && (total == 0 || n < BUCKETS_MIN * 3 / 4) {
            self.bucket_total.store(0, Ordering::Relaxed);
            return;
        }
        let start = |i: usize| self.starts[i].load(Ordering::Relaxed);
        let built = self.built_len.load(Ordering::Relaxed);
        if total == 0
            || self.segments[0].lo.load(Ordering::Relaxed) > start(0)
            || n > built * 2
            || n * 2 < built
            || self.strays.load(Ordering::Relaxed) > built / 4
        {
            self.rebuild_all_buckets(n);
            return;
        }
        let (mut b, mut j, recount_to) = match span {
            Some((span_lo, span_hi)) => {
                let (b, stray) = self.bucket_after(span_lo);
                if stray {
                    self.strays
                        .store(self.strays.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                }
                let recount_to = self.bucket_after(span_hi).0;
                // The starts below the first bucket to recount (none to
                // find when the span begins no bucket: one start added or
                // removed inside a bucket).
                let j = if b < recount_to {
                    let bound = self.bucket_start(b);
                    self.first_above(n, bound.wrapping_sub(1), start) * usize::from(bound > 0)
                } else {
                    0
                };
                (b, j, recount_to)
            }
            None => match from.min(n) {
                0 => (0, 0, total),
                f => (self.bucket_after(start(f - 1)).0, f, total),
            },
        };
        let recount_from = b;
        while b < recount_to {
            let bound = self.bucket_start(b);
            while j < n && start(j) < bound {
                j += 1;
            }
            self.buckets[b].store(bucket_count(j, n), Ordering::Relaxed);
            b += 1;
        }
        // Past the span every bucket counts the same starts as before,
        // moved by the change in length, up to the first that counts them
        // all: it and those after it still do, whatever the length. (So an
        // entry added above the others, as new allocations mostly are,
        // changes no bucket above it.)
        let delta = n.wrapping_sub(old_n) as u32;
        if delta != 0 {
            for bucket in self.buckets.get(recount_to..total).unwrap_or(&[]) {
                let count = bucket.load(Ordering::Relaxed);
                if count == ALL {
                    break;
                }
                bucket.store(count.wrapping_add(delta), Ordering::Relaxed);
            }
            // Below the span the counts stay, but whether they are all of
            // the slots changes with the length: the buckets just below
            // that counted all the old slots now count all but the new
            // ones, and those that count all the slots left say so.
            for bucket in self.buckets[..recount_from.min(total)].iter().rev() {
                let count = bucket.load(Ordering::Relaxed);
                if n > old_n && count == ALL {
                    bucket.store(old_n as u32, Ordering::Relaxed);
                } else if n < old_n && count as usize == n {
                    bucket.store(ALL, Ordering::Relaxed);
                } else {
                    break;
                }
            }
        }
    }

    /// Builds the bucket table afresh for the `n` starts. Uniform buckets
    /// over the whole span would leave a cluster of many ranges in a few
    /// crowded buckets whenever other ranges lie far away (device memory
    /// and pinned host memory, say). So the starts are first cut into at
    /// most [`SEGMENTS`] segments at their widest gaps, those wider than an
    /// eighth of the span; each segment gets a power-of-two number of
    /// buckets, about one per [`STARTS_PER_BUCKET`] of its entries, of the
    /// narrowest power-of-two width that covers its starts.
    fn rebuild_all_buckets(&self, n: usize) {
        let start = |i: usize| self.starts[i].load(Ordering::Relaxed);
        // Segment k holds starts bounds[k]..bounds[k + 1]. Cut, while there
        // are segments to spare, at the widest gap that is wider than an
        // eighth of its own segment's span.
        let mut bounds = [n; SEGMENTS + 1];
        bounds[0] = 0;
        let mut segments = 1;
        while segments < SEGMENTS {
            let mut widest: Option<(usize, usize)> = None; // (gap, index after it)
            for k in 0..segments {
                let (first, past) = (bounds[k], bounds[k + 1]);
                let extent = start(past - 1) - start(first);
                for i in first + 1..past {
                    let gap = start(i) - start(i - 1);
                    if gap > extent / 8 && widest.is_none_or(|(w, _)| gap > w) {
                        widest = Some((gap, i));
                    }
                }
            }
            let Some((_, cut)) = widest else {
                break;
            };
            bounds[segments] = cut;
            segments += 1;
            bounds[..segments].sort_unstable();
        }
        let (mut base, mut j) = (0, 0);
        for (k, seg) in self.segments.iter().enumerate() {
            if k >= segments {
                seg.lo.store(usize::MAX, Ordering::Relaxed);
                seg.base.store(base, Ordering::Relaxed);
                seg.end.store(base, Ordering::Relaxed);
                continue;
            }
            let (first, past) = (bounds[k], bounds[k + 1]);
            let (lo, last) = (start(first), start(past - 1));
            let limit = if past < n { start(past) } else { usize::MAX };
            let mut count = ((past - first) / STARTS_PER_BUCKET).next_power_of_two();
            let mut shift = 0;
            while shift < usize::BITS as usize - 1 && (last - lo) >> shift >= count {
                shift += 1;
            }
            if k + 1 == segments {
                // As many buckets again above the last start, of the same
                // width: allocations arrive at the top, and one past the
                // plan counts toward a rebuild. (The total stays within
                // the table: each segment's count is at most half its
                // entries.)
                count *= 2;
            }
            seg.lo.store(lo, Ordering::Relaxed);
            seg.shift.store(shift, Ordering::Relaxed);
            seg.base.store(base, Ordering::Relaxed);
            seg.end.store(base + count, Ordering::Relaxed);
            for b in base..base + count {
                let bound = seg.bucket_start(b, limit);
                while j < n && start(j) < bound {
                    j += 1;
                }
                self.buckets[b].store(bucket_count(j, n), Ordering::Relaxed);
            }
            base += count;
        }
        self.bucket_total.store(base, Ordering::Relaxed);
        self.built_len.store(n, Ordering::Relaxed);
        self.strays.store(0, Ordering::Relaxed);
    }

    /// Runs `change` (which says which slots it changed) with the table
    /// marked as being written, then rewrites the search tree and the
    /// buckets over them.
    fn rewrite(&self, change: impl FnOnce() -> Edit) -> Edit {
        self.begin_write();
        let old_n = self.len.load(Ordering::Relaxed);
        let edit = change();
        if edit.from < edit.to {
            let n = self.len.load(Ordering::Relaxed);
            if n <= B
                && self.index_levels.load(Ordering::Relaxed) == 0
                && self.bucket_total.load(Ordering::Relaxed) == 0
            {
                // No tree level and no bucket table, nor any wanted at this
                // length: of both rebuilds, only the starts past a shrunk
                // length are left to clear. (Their two calls, out of line,
                // cost a queue of eight allocations about 70 instructions
                // an update.)
                self.clear_starts(n, old_n);
            } else {
                self.rebuild_index(edit.from, edit.to, old_n);
                self.rebuild_buckets(edit.from, old_n, edit.span);
            }
        }
        self.end_write();
        edit
    }

    /// Applies `op`.
    fn apply(&self, op: Op, spill: &mut Spill) -> Edit {
        self.rewrite(|| op.run(self, spill))
    }

    /// Makes this table equal to `live`, which differs from it only at
    /// indices `from` and above (a straight copy: no search, no shift).
    fn catch_up(&self, live: &Table<N>, from: usize) {
        // The starts that change are this table's `from..old_n`, replaced
        // by the live one's `from..n`: both runs are sorted, so their ends
        // bound every start added or removed. That span keeps the bucket
        // recount to the buckets it covers (past it, the counts move by
        // the change in length), where a recount from `from` to the last
        // bucket cost every update O(buckets).
        let start = |t: &Table<N>, i: usize| t.starts[i].load(Ordering::Relaxed);
        let (old_n, n) = (self.len.load(Ordering::Relaxed), live.len.load(Ordering::Relaxed));
        let mine = (from < old_n).then(|| (start(self, from), start(self, old_n - 1)));
        let theirs = (from < n).then(|| (start(live, from), start(live, n - 1)));
        let span = match (mine, theirs) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (one, other) => one.or(other),
        };
        if span.is_none() && old_n == n {
            return; // equal already: they differ only from `from` on
        }
        self.rewrite(|| {
            for i in from..n {
                self.set(i, live.get(i));
            }
            self.len.store(n, Ordering::Relaxed);
            self.count.store(live.count.load(Ordering::Relaxed), Ordering::Relaxed);
            Edit {
                result: Inserted::Stored,
                from,
                to: n.max(old_n),
                span,
                touched: true,
                moved: true,
            }
        });
    }

    /// Makes this table a copy of `live`, every array whole, and leaves
    /// its sequence even (and above where it was): the repair of a table
    /// a writer may have left half-written, which no assumption about
    /// where the writer stopped can help (see
    /// [`MemtypeMap::reset_after_fork`]). Not for readers' tables: this
    /// one is not published while it runs.
    #[cfg(not(memhook_loom))]
    fn copy_whole(&self, live: &Table<N>) {
        fn copy(to: &[AtomicUsize], from: &[AtomicUsize]) {
            for (t, f) in to.iter().zip(from) {
                t.store(f.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
        let seq = self.seq.load(Ordering::Relaxed) | 1;
        self.seq.store(seq, Ordering::Relaxed);
        copy(&self.starts, &live.starts);
        copy(&self.index, &live.index);
        for (t, f) in self.slots.iter().zip(&live.slots) {
            t.end.store(f.end.load(Ordering::Relaxed), Ordering::Relaxed);
            t.meta.store(f.meta.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        for (t, f) in self.buckets.iter().zip(&live.buckets) {
            t.store(f.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let words = [
            (&self.len, &live.len),
            (&self.bucket_total, &live.bucket_total),
            (&self.count, &live.count),
            (&self.built_len, &live.built_len),
            (&self.strays, &live.strays),
            (&self.index_levels, &live.index_levels),
        ]
        .into_iter()
        .chain(self.segments.iter().zip(&live.segments).flat_map(|(t, f)| {
            [
                (&t.lo, &f.lo),
                (&t.shift, &f.shift),
                (&t.base, &f.base),
                (&t.end, &f.end),
            ]
        }));
        for (t, f) in words {
            t.store(f.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.seq.store(seq + 1, Ordering::Release);
    }

    fn begin_write(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    fn end_write(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Release);
    }

    /// Replaces the entries that overlap `[start, end)` by their parts
    /// outside it and, given `meta`, records `[start, end)` itself.
    ///
    /// The slots in use hold the entries in address order with gaps among
    /// them. A gap repeats the start of the entry after it, so a search
    /// never stops on one (the last slot with a start at or below an
    /// address is always an entry) and the lookup needs no change for
    /// them. An edit rewrites one window of slots: the entries it changes
    /// and the gaps around them. When the new pieces do not fit there, or
    /// the window is mostly gaps, the window widens (doubling) over its
    /// neighbours until they can all be laid out again with the gaps spread
    /// evenly among them; at the end of the slots in use it may grow into
    /// the free ones. An update so moves the entries of its window, not
    /// the rest of the table.
    fn edit(&self, start: usize, end: usize, meta: Option<u64>, spill: &mut Spill) -> Edit {
        let n = self.len.load(Ordering::Relaxed);
        let count = self.count.load(Ordering::Relaxed);
        let start_of = |i: usize| self.starts[i].load(Ordering::Relaxed);
        // The first slot whose start lies above `start`: the entry just
        // before it is the only one that can reach over `start` from below.
        // Found as a lookup finds it (the table's search tree and buckets
        // are those of its starts: every rewrite leaves them so), where a
        // binary search over the slots takes 17 dependent, unpredictable
        // steps at 65,536 entries.
        let p = self.upper_bound(n, start).min(n);
        debug_assert_eq!(p, self.first_above(n, start, start_of));
        // The first and last slots of the entries the range overlaps.
        let mut first = None;
        let mut last = 0;
        let mut overlapped = 0;
        if p > 0 && self.end(p - 1) > start {
            first = Some(p - 1);
            last = p - 1;
            overlapped = 1;
        }
        let mut b = p;
        while b < n && start_of(b) < end {
            if self.is_entry(b) {
                first.get_or_insert(b);
                last = b;
                overlapped += 1;
            }
            b += 1;
        }
        if overlapped == 0 && meta.is_none() {
            return Edit {
                result: Inserted::Stored,
                from: n,
                to: n,
                span: None,
                touched: false,
                moved: false,
            };
        }
        // The window: from past the entry before (over the gaps that repeat
        // the first start that changes) up to the entry after.
        b = self.entry_from(b, n);
        let mut a = self.after_entry(first.unwrap_or(p));
        // A small table keeps no gaps: its entries stay packed, in the one
        // layout their addresses give (so any insert that touched nothing
        // is undone exactly by removing it), and a lookup among 16 of them
        // compares one node; an edit moves the entries after it, as in a
        // sorted array. A table that shrank to that size, or to under a
        // quarter of its slots, is laid out afresh once, whole, so that it
        // is searched over its entries, not its gaps.
        let left = count - overlapped + usize::from(meta.is_some());
        let small = left <= SMALL_TABLE;
        let sparse = (small && n > count) || (n > B && left * 4 < n);
        // The two common edits: a range that overlaps nothing recorded, and
        // one entry removed whole.
        let untouched = meta.filter(|_| overlapped == 0);
        let removes_one = meta.is_none() && overlapped == 1 && start_of(last) >= start && self.end(last) <= end;
        // In a small table (packed), they shift the entries after them by
        // one, as a sorted array does.
        if let Some(meta) = untouched
            && small
            && !sparse
            && n < N
        {
            self.shift(n, p, 1);
            self.set(p, (start, end, meta));
            self.len.store(n + 1, Ordering::Relaxed);
            self.count.store(count + 1, Ordering::Relaxed);
            // The starts that moved kept their values: the buckets change
            // by the one added (the recount covers its bucket, the change
            // in length those above).
            return Edit::local(p, n + 1, (start, start), false);
        }
        if removes_one && small && !sparse {
            let removed = start_of(last);
            self.shift(n, last + 1, -1);
            self.len.store(n - 1, Ordering::Relaxed);
            self.count.store(count - 1, Ordering::Relaxed);
            return Edit::local(last, n, (removed, removed), true);
        }
        // Elsewhere, directly (the layout below does the same): a range that
        // overlaps nothing goes to the last gap before the next entry (its
        // gaps now repeat its start) or after the last entry; an entry
        // removed whole becomes a gap with those around it.
        if let Some(meta) = untouched
            && !sparse
            && count < N
            && ((a == n && n < N) || (!small && b < n && a < b && b - a <= SMALL_WINDOW))
        {
            let at = if b < n { b - 1 } else { n };
            let old_hi = if b < n { start_of(b) } else { start };
            for i in a..at {
                self.starts[i].store(start, Ordering::Relaxed);
            }
            self.set(at, (start, end, meta));
            if at == n {
                self.len.store(n + 1, Ordering::Relaxed);
            }
            self.count.store(count + 1, Ordering::Relaxed);
            return Edit::local(a, at + 1, (start, old_hi), false);
        }
        // Entries freed at the front of the table, oldest first (a queue of
        // allocations), leave a run of gaps there that every later front
        // removal rewrites; past an eighth of the table, the table is laid
        // out afresh instead (below).
        let long_front = a == 0 && b - a > SMALL_WINDOW + n / 8;
        if removes_one && !sparse && (b >= n || (!small && (b - a <= SMALL_WINDOW || (a == 0 && !long_front)))) {
            let old_lo = start_of(a);
            let (stop, hi) = if b < n {
                let next = start_of(b);
                for i in a..b {
                    self.set(i, (next, 0, 0));
                }
                (b, next)
            } else {
                self.len.store(a, Ordering::Relaxed);
                (n, start_of(n - 1))
            };
            self.count.store(count - 1, Ordering::Relaxed);
            return Edit::local(a, stop, (old_lo, hi), true);
        }
        // The new pieces, in address order. What a full table has no slot
        // for is dropped: the right part of a split first, then the new
        // range (the order in which they would have needed one).
        let mut pieces = [(0usize, 0usize, 0u64); PIECES];
        let mut np = 0;
        let mut entries = count - overlapped;
        let mut right = None;
        if let Some(f) = first {
            let (s, _, m) = self.get(f);
            if s < start {
                pieces[np] = (s, start, m);
                np += 1;
                entries += 1;
            }
            let (_, e, m) = self.get(last);
            if e > end {
                if entries < N {
                    right = Some((end, e, m));
                    entries += 1;
                } else {
                    spill.drop_range(end, e);
                }
            }
        }
        let mut result = Inserted::Stored;
        if let Some(m) = meta {
            if entries < N {
                pieces[np] = (start, end, m);
                np += 1;
            } else {
                spill.drop_range(start, end);
                result = Inserted::Dropped;
            }
        }
        if let Some(piece) = right {
            pieces[np] = piece;
            np += 1;
        }
        // Widen until the window can take them: `before` and `after` count
        // the entries it took in on either side. A widened window is laid
        // out at most three quarters full, unless the whole table is fuller
        // than that: then it widens a slot at a time on either side until
        // it has a free slot, and the entries between the change and that
        // slot move over by what the change needs, as in a sorted array
        // (`from_left`: the room was found on the left).
        let dense = (count - overlapped + np) * 4 > N * 3;
        let (mut before, mut after, mut moved, mut from_left) = (0, 0, false, false);
        if sparse || (long_front && meta.is_none() && !small) {
            before = self.entries_in(0..a);
            after = self.entries_in(b..n);
            (a, b, moved) = (0, n, true);
        } else if small {
            after = self.entries_in(b..n);
            (b, moved) = (n, true);
        }
        let mut reach = (b - a).max(SMALL_WINDOW / 2);
        loop {
            let m = before + np + after;
            let at_end = b >= n;
            let room = if at_end { N - a } else { b - a };
            let fits = m <= room
                && (at_end || ((room <= SMALL_WINDOW || m * 4 >= room) && (!moved || dense || roomy(m, room, N))));
            if fits || (a == 0 && at_end) {
                break;
            }
            moved = true;
            if dense {
                // Left on even turns (or when the right has nothing left).
                if a > 0 && (reach.is_multiple_of(2) || b >= n) {
                    // The entry before the window, and the gaps below it.
                    before += 1;
                    let wa = self.after_entry(a - 1);
                    from_left = wa < a - 1;
                    a = wa;
                } else {
                    // The entry after the window, and the gaps above it.
                    after += 1;
                    from_left = false;
                    b = self.entry_from(b + 1, n);
                }
                reach += 1;
                continue;
            }
            let wa = self.after_entry(a.saturating_sub(reach));
            before += self.entries_in(wa..a);
            let wb = self.entry_from(b.saturating_add(reach).min(n), n);
            after += self.entries_in(b..wb);
            (a, b) = (wa, wb);
            reach *= 2;
        }
        let m = before + np + after;
        let old_end = b.min(n);
        let old_span = (a < old_end).then(|| (start_of(a), start_of(old_end - 1)));
        // Where the window's slots end now: where they did, or, at the end
        // of the slots in use, just past its entries (with half as many
        // more slots as gaps when it was widened, for the inserts to come,
        // unless the table is small).
        let stop = if b >= n {
            let spread = if moved && !dense && !small { m + m / 2 } else { m };
            a + spread.min(N - a)
        } else {
            b
        };
        // The entries kept move to the window's first slots (in order,
        // each to a slot at or before its own), then every entry goes to
        // its slot among evenly spread gaps, from the last down: entry `q`
        // of `m` goes to slot `t(q) = stop - 1 - (m - 1 - q) * slots / m`,
        // and `t(q) >= a + q` (as `slots >= m`), so no entry is overwritten
        // before it is read. A gap takes the start of the entry after it.
        let mut c = a;
        for i in a..old_end {
            let changed = first.is_some_and(|f| (f..=last).contains(&i));
            if self.is_entry(i) && !changed {
                if c != i {
                    self.set(c, self.get(i));
                }
                c += 1;
            }
        }
        // `t(q)`'s offset from the end, stepped without a division. A table
        // too full to spread packs the window's entries instead, toward the
        // side away from the room it found (so that only those between the
        // change and the room move).
        let slots = stop - a;
        let (step, carry) = match m {
            0 => (0, 0),
            _ if dense && moved => (1, 0),
            1 => (slots, 0), // the common case, without a division
            _ => (slots / m, slots % m),
        };
        let mut offset = if dense && moved && !from_left { slots - m } else { 0 };
        let mut rem = 0;
        let mut next_start = if b < n { start_of(b) } else { usize::MAX };
        let mut q = m;
        for i in (a..stop).rev() {
            if q > 0 && i == stop - 1 - offset {
                q -= 1;
                offset += step;
                rem += carry;
                if rem >= m {
                    rem -= m;
                    offset += 1;
                }
                let source = if q < before {
                    a + q
                } else if q < before + np {
                    next_start = pieces[q - before].0;
                    self.set(i, pieces[q - before]);
                    continue;
                } else {
                    a + q - np
                };
                // Entries that stay where they are (most of a packed
                // window) are not rewritten.
                if source != i {
                    self.set(i, self.get(source));
                }
                next_start = start_of(i);
            } else {
                self.set(i, (next_start, 0, 0));
            }
        }
        if b >= n {
            self.len.store(stop, Ordering::Relaxed);
        }
        self.count.store(count - overlapped + np, Ordering::Relaxed);
        let new_span = (a < stop).then(|| (start_of(a), start_of(stop - 1)));
        let span = match (old_span, new_span) {
            (Some((a0, a1)), Some((b0, b1))) => Some((a0.min(b0), a1.max(b1))),
            (one, other) => one.or(other),
        };
        Edit {
            result,
            from: a,
            to: if b >= n { stop.max(n) } else { b },
            span,
            touched: overlapped > 0,
            // A small table's layout is the one its entries give.
            moved: moved && !small,
        }
    }
}

/// `T` laid on whole 2 MiB pages: aligned to 2 MiB, its size rounded up
/// to a multiple of that. For a large map in a `static`: advised for
/// transparent huge pages (`madvise(MADV_HUGEPAGE)` before it is first
/// touched), every byte of it can then lie on huge pages, where an
/// unaligned map keeps its ends on 4 KiB ones (a 4.5 MiB map at a random
/// offset has one or two whole 2 MiB pages in it), and a lookup at 65,536
/// ranges touches three random places of it, each a TLB miss on a 4 KiB
/// page: a two-level page walk in a virtual machine. The alignment holds
/// at run time where the loader honours the object's segment alignment
/// (the kernel for executables; glibc 2.35 and later for shared objects;
/// elsewhere it is as good as none). The padding is address space only:
/// never touched, it takes no memory.
///
/// For statics: on the stack, the alignment costs up to 2 MiB of it.
#[repr(C, align(2097152))]
pub struct HugePageAligned<T>(pub T);

impl<T> core::ops::Deref for HugePageAligned<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// The interval map. See the module docs.
///
/// Two cache lines head it: the writers' (the lock, the pending
/// operation), and the readers' (the live table's index, which every
/// lookup reads first, and the dropped ranges' hull). A writer takes and
/// releases its lock and rewrites the pending operation several times an
/// update; on the readers' line it writes only the live index, once, so
/// that lookups on other cores lose that line once per update, not at
/// every step of it. A hook about to update after a driver call asks for
/// both lines at once ([`Self::prefetch_update`]).
#[repr(C, align(64))]
pub struct MemtypeMap<const N: usize> {
    /// The writers' lock, and the operation the spare table still lacks
    /// (the live one has it), with the lowest index at which the two
    /// tables differ: the spare is always exactly one operation behind,
    /// and catches up at the next update by copying from there.
    writer: Mutex<Option<(Op, usize)>>,
    /// Whether the tables are laid out (the first writer does it: see
    /// [`Self::new`]).
    ready: AtomicBool,
    dropped: AtomicU64,
    read: ReaderLine,
    tables: [Table<N>; 2],
}

/// What every lookup reads before the tables, on a line of its own.
#[repr(C, align(64))]
struct ReaderLine {
    live: AtomicUsize,
    /// Hull of every dropped range: `[lo, hi)`, empty while `lo >= hi`.
    dropped_lo: AtomicUsize,
    dropped_hi: AtomicUsize,
}

fn range_end(start: usize, len: usize) -> Result<usize, MapError> {
    if len == 0 {
        return Err(MapError::EmptyRange { start });
    }
    start.checked_add(len).ok_or(MapError::WrapsAround { start, len })
}

impl<const N: usize> MemtypeMap<N> {
    /// An empty map: zero bytes, so that a map in a `static` lies in
    /// `.bss` (a 65,536-entry map in `.data` made a 5.6 MB shared object;
    /// zero pages cost nothing until touched, and can be huge pages). The
    /// first update lays out the tables' sentinels.
    #[cfg(not(memhook_loom))]
    pub const fn new() -> Self {
        let () = NONE_IS_ZERO;
        Self {
            tables: [Table::new(), Table::new()],
            writer: Mutex::new(None),
            ready: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            read: ReaderLine {
                live: AtomicUsize::new(0),
                dropped_lo: AtomicUsize::new(0),
                dropped_hi: AtomicUsize::new(0),
            },
        }
    }

    /// An empty map (loom model version).
    #[cfg(memhook_loom)]
    pub fn new() -> Self {
        Self {
            tables: [Table::new(), Table::new()],
            writer: Mutex::new(None),
            ready: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            read: ReaderLine {
                live: AtomicUsize::new(0),
                dropped_lo: AtomicUsize::new(0),
                dropped_hi: AtomicUsize::new(0),
            },
        }
    }

    /// Lays out the tables now, if no writer has yet. The first writer
    /// does it otherwise: a one-time write of both tables' starts and
    /// search-tree keys (2 MiB at 65,536 slots: about 2 ms of page faults
    /// on the dev VM), which a caller can keep off a hot path this way
    /// (memhook does it when it attaches to a loaded CUDA library). Changes
    /// no entry.
    pub fn prepare(&self) {
        let _writer = self.writer.lock();
        self.lay_out_once();
    }

    /// Lays out the tables if no writer has yet (call with the lock held).
    /// Every writer that reads or changes a table calls it first; the
    /// shortcuts of `update_locked` and `take` need not, since they act
    /// only on an operation pending, which a table update left.
    #[inline(always)]
    fn lay_out_once(&self) {
        if !self.ready.load(Ordering::Relaxed) {
            self.lay_out();
        }
    }

    /// The first writer's work (under the lock): both tables' sentinels,
    /// and the dropped ranges' hull made empty the way `clear` leaves it.
    #[cold]
    #[inline(never)]
    fn lay_out(&self) {
        for table in &self.tables {
            table.lay_out();
        }
        self.read.dropped_lo.store(usize::MAX, Ordering::Release);
        self.ready.store(true, Ordering::Relaxed);
    }

    /// The capacity.
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.tables[self.read.live.load(Ordering::Acquire)]
            .count
            .load(Ordering::Acquire)
    }

    /// Whether the map holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ranges dropped because the map was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// What the map says about `[addr, addr + len)` (`len` 0 is read as 1).
    /// Lock-free, allocation-free, never calls anything; safe from any thread
    /// and from signal handlers.
    #[inline]
    pub fn lookup(&self, addr: usize, len: usize) -> Lookup {
        let Some(end) = addr.checked_add(len.max(1)) else {
            return Lookup::Unknown;
        };
        let answer = loop {
            let table = &self.tables[self.read.live.load(Ordering::Acquire)];
            let s1 = table.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                // A writer is rewriting the table we thought live: the other
                // one has been published meanwhile.
                spin_wait();
                continue;
            }
            let answer = table.probe(addr, end);
            fence(Ordering::Acquire);
            if table.seq.load(Ordering::Relaxed) == s1 {
                break answer;
            }
        };
        if answer == Lookup::Absent
            && self.read.dropped_lo.load(Ordering::Acquire) < end
            && addr < self.read.dropped_hi.load(Ordering::Acquire)
        {
            return Lookup::Unknown;
        }
        answer
    }

    /// Brings the spare table up to date (a copy of the live one's entries
    /// from the first that differs), applies `op` to it, and publishes it;
    /// the old live table becomes the spare, lacking `op`. One application
    /// per update in the common case, and none for the free of an
    /// allocation just recorded (an insert that overlapped nothing, then
    /// the removal of exactly that range: the spare already is the state
    /// after both).
    #[inline(always)]
    fn update(&self, op: Op) -> Inserted {
        let mut pending = self.writer.lock();
        self.update_locked(&mut pending, op)
    }

    /// [`Self::update`] with the writer lock held (`pending` is its data).
    /// The two shortcuts (a free right after its allocation, and the same
    /// allocation recorded again) are inlined into their callers: a hook
    /// runs them after a driver call, from cold caches, where every line
    /// of code counts.
    #[inline(always)]
    fn update_locked(&self, pending: &mut Option<(Op, usize)>, op: Op) -> Inserted {
        let live = self.read.live.load(Ordering::Relaxed);
        match (pending.map(|(behind, _)| behind), op) {
            // Freed right after it was recorded: the spare never had it.
            (
                Some(Op::Insert {
                    start,
                    end,
                    meta,
                    pure: true,
                }),
                Op::Remove { start: s, end: e },
            ) if (start, end) == (s, e) => {
                self.read.live.store(1 - live, Ordering::Release);
                // The tables still differ where the insert put the range.
                *pending = pending.map(|(_, from)| (Op::Undo { start, end, meta }, from));
                return Inserted::Stored;
            }
            // Recorded again as it was (an address reused for the same
            // kind of memory): the spare still has it.
            (
                Some(Op::Undo { start, end, meta }),
                Op::Insert {
                    start: s,
                    end: e,
                    meta: m,
                    ..
                },
            ) if (start, end, meta) == (s, e, m) => {
                self.read.live.store(1 - live, Ordering::Release);
                *pending = pending.map(|(_, from)| {
                    (
                        Op::Insert {
                            start,
                            end,
                            meta,
                            pure: true,
                        },
                        from,
                    )
                });
                return Inserted::Stored;
            }
            _ => {}
        }
        self.update_tables(pending, live, op)
    }

    /// [`Self::update_locked`] past its shortcuts: the spare table (the
    /// one `live` does not name) catches up, takes `op`, and is published.
    #[inline(never)]
    fn update_tables(&self, pending: &mut Option<(Op, usize)>, live: usize, mut op: Op) -> Inserted {
        self.lay_out_once();
        let spare = &self.tables[1 - live];
        if let Some((behind, from)) = pending.take() {
            let live = &self.tables[live];
            if live.len.load(Ordering::Relaxed).saturating_sub(from) <= COPY_CATCH_UP {
                spare.catch_up(live, from);
            } else {
                // Far from the end: the edit is local, where a copy runs
                // to the end.
                spare.apply(behind, &mut Spill::default());
            }
        }
        let mut spill = Spill::default();
        let Edit {
            result,
            from,
            touched,
            moved,
            ..
        } = spare.apply(op, &mut spill);
        if let Some((lo, hi)) = spill.hull {
            // Before publication: a lookup that sees the range gone also
            // sees it poisoned.
            self.read.dropped_lo.fetch_min(lo, Ordering::AcqRel);
            self.read.dropped_hi.fetch_max(hi, Ordering::AcqRel);
            self.dropped.fetch_add(spill.dropped, Ordering::Relaxed);
        }
        if let Op::Insert { ref mut pure, .. } = op {
            // Undone exactly, slot for slot, by removing its range: it
            // overlapped nothing, moved no other entry, and was stored.
            *pure = !touched && !moved && result == Inserted::Stored;
        }
        self.read.live.store(1 - live, Ordering::Release);
        *pending = Some((op, from));
        result
    }

    /// Records `[start, start + len)` as `mem_type` on `device` (-1 for none),
    /// replacing whatever it overlaps.
    ///
    /// # Errors
    ///
    /// An empty or wrapping range is refused and changes nothing. A full map
    /// is not an error: see [`Inserted::Dropped`].
    #[inline(always)]
    pub fn insert(&self, start: usize, len: usize, mem_type: MemType, device: i32) -> Result<Inserted, MapError> {
        self.insert_marked(start, len, mem_type, device, false)
    }

    /// [`Self::insert`], with a mark: one bit the caller keeps with the
    /// entry. Lookups do not see it; the pieces a later update splits the
    /// entry into keep it; [`Self::take_marked`] gives it back. (memhook's
    /// CUDA hooks mark the memory that a free of device memory may be
    /// refused for, to look at that free's answer.)
    ///
    /// # Errors
    ///
    /// As [`Self::insert`].
    #[inline(always)]
    pub fn insert_marked(
        &self,
        start: usize,
        len: usize,
        mem_type: MemType,
        device: i32,
        mark: bool,
    ) -> Result<Inserted, MapError> {
        let end = range_end(start, len)?;
        let meta = pack(mem_type, device) | if mark { MARK } else { 0 };
        Ok(self.update(Op::Insert {
            start,
            end,
            meta,
            pure: false,
        }))
    }

    /// Forgets `[start, start + len)`: entries inside go, entries across its
    /// edges are trimmed or split.
    ///
    /// # Errors
    ///
    /// An empty or wrapping range is refused and changes nothing.
    pub fn remove(&self, start: usize, len: usize) -> Result<(), MapError> {
        let end = range_end(start, len)?;
        self.update(Op::Remove { start, end });
        Ok(())
    }

    /// Asks the cache for the lines every update writes (the writers'
    /// lock and pending operation; the live index; each table's fields
    /// besides its arrays). An update takes
    /// the lock with an atomic read-modify-write, which waits for every
    /// load before it and holds back every load after it: a caller about
    /// to update after work that evicted the lines (a driver call) calls
    /// this first, so that the misses overlap its own loads instead of
    /// following them. A hint: it changes nothing a thread can observe.
    #[inline(always)]
    pub fn prefetch_update(&self) {
        #[cfg(all(target_arch = "x86_64", not(memhook_loom)))]
        {
            crate::simd::prefetch((&raw const self.writer).cast(), 1);
            crate::simd::prefetch((&raw const self.read).cast(), 1);
            // And each table's fields after its arrays (its sequence,
            // length, counts and bucket segments: three lines), which the
            // update reads and writes in both tables: a fake allocation
            // after 4 MiB of writes gained 97 ns hooked where it gained 113
            // (the `cuda_cold` bench on the dev VM, the medians of fifteen
            // processes each, in alternation).
            for t in &self.tables {
                let fields = size_of::<Table<N>>() - core::mem::offset_of!(Table<N>, seq);
                crate::simd::prefetch((&raw const t.seq).cast(), fields);
            }
        }
    }

    /// Forgets the entry that starts exactly at `start` and returns what it
    /// was (`None`, changing nothing, when no entry starts there): how a
    /// free whose call does not carry the size ends an allocation. One
    /// writer-side step instead of a lookup and a removal, and the free
    /// of the allocation recorded last needs neither search nor table work.
    #[inline]
    pub fn take(&self, start: usize) -> Option<MemInfo> {
        self.take_marked(start).map(|(info, _)| info)
    }

    /// [`Self::take`], with the entry's mark ([`Self::insert_marked`]).
    #[inline]
    pub fn take_marked(&self, start: usize) -> Option<(MemInfo, bool)> {
        let mut pending = self.writer.lock();
        // The allocation recorded last, stored as it came (the live table
        // has it): no search, and the removal is a shortcut.
        if let Some((
            Op::Insert {
                start: s,
                end,
                meta,
                pure: true,
            },
            _,
        )) = *pending
            && s == start
        {
            self.update_locked(&mut pending, Op::Remove { start, end });
            return Some((unpack(meta, start, end), meta & MARK != 0));
        }
        match self.take_recorded(&mut pending, start) {
            (0, _) => None,
            (end, meta) => Some((unpack(meta, start, end), meta & MARK != 0)),
        }
    }

    /// [`Self::take`] of an entry found in the live table: its end and
    /// packed type (end 0: none starts at `start`). Two registers, not an
    /// `Option<MemInfo>`, which would come back through the caller's stack
    /// memory: a function whose stack a callee may see cannot end in a
    /// tail call, and a CUDA free's hook, which takes and then calls the
    /// driver, would then return through its own code, cold by then.
    #[inline(never)]
    fn take_recorded(&self, pending: &mut Option<(Op, usize)>, start: usize) -> (usize, u64) {
        self.lay_out_once();
        let live = &self.tables[self.read.live.load(Ordering::Relaxed)];
        // The writer lock is held: no writer changes the live table while
        // it is read here, so the answer needs no validation.
        let Some((end, meta)) = live.starting_at(start) else {
            return (0, 0);
        };
        self.update_locked(pending, Op::Remove { start, end });
        (end, meta)
    }

    /// Makes the map whole again in the child of a `fork` made while a
    /// thread of the parent was updating it, and returns whether it had
    /// to (`false`: the writer lock was free, and nothing changed).
    ///
    /// That thread does not exist in the child: its lock stays held, and
    /// the spare table may be half-written, its pending operation stale.
    /// The live table is whole whatever the writer was doing, since a
    /// writer changes only the spare and publishes it finished. So the
    /// lock is let go, and the spare becomes a copy of the live table,
    /// every array whole (at most about 2.3 MiB at 65,536 slots, copied
    /// once, and only by a child whose parent was mid-update), with no
    /// operation pending. A first writer interrupted while laying out the
    /// tables is redone.
    ///
    /// # Safety
    ///
    /// Only the calling thread may exist (the child of `fork`, before it
    /// starts threads), and it must not itself be inside an update of
    /// this map (it forked from a signal handler that interrupted one):
    /// the lock's holder must be a thread that is gone.
    // The one unsafe function of this module: its contract (no other
    // thread, no update of this thread's in progress) is the caller's.
    #[cfg(not(memhook_loom))]
    #[allow(unsafe_code)]
    pub unsafe fn reset_after_fork(&self) -> bool {
        if self.writer.try_lock().is_some() {
            return false;
        }
        // SAFETY: the holder was a thread of the parent that does not
        // exist here (the caller's contract), so no guard is alive.
        unsafe { self.writer.force_unlock() };
        let mut pending = self.writer.lock();
        if self.ready.load(Ordering::Relaxed) {
            let live = self.read.live.load(Ordering::Relaxed);
            self.tables[1 - live].copy_whole(&self.tables[live]);
        } else {
            self.lay_out();
        }
        *pending = None;
        true
    }

    /// Forgets every entry and every dropped range.
    pub fn clear(&self) {
        self.update(Op::Clear);
        self.read.dropped_lo.store(usize::MAX, Ordering::Release);
        self.read.dropped_hi.store(0, Ordering::Release);
    }

    /// Copies the entries that start at or above `from`, in address order,
    /// into `out`, as many as fit, and returns how many: fewer than
    /// `out.len()` only when no more start there. One consistent snapshot
    /// per call, taken under the writer lock (which it does not hold while
    /// the caller works): a walk over the map in chunks, without
    /// allocating, that may update the map between chunks (the next chunk
    /// starts above the last entry copied).
    pub fn entries_from(&self, from: usize, out: &mut [MemInfo]) -> usize {
        let _writer = self.writer.lock();
        self.lay_out_once();
        let t = &self.tables[self.read.live.load(Ordering::Relaxed)];
        let n = t.len.load(Ordering::Relaxed);
        // The first slot whose start is at or above `from` (starts are
        // sorted, a gap repeating the start of the entry after it).
        let first = match from.checked_sub(1) {
            Some(below) => t.first_above(n, below, |i| t.starts[i].load(Ordering::Relaxed)),
            None => 0,
        };
        let mut copied = 0;
        for (slot, info) in out.iter_mut().zip(t.entries(first)) {
            *slot = info;
            copied += 1;
        }
        copied
    }

    /// Calls `f` with every entry, in address order, from one consistent
    /// snapshot (taken under the writer lock: not for hook paths).
    pub fn for_each(&self, f: impl FnMut(MemInfo)) {
        let _writer = self.writer.lock();
        self.lay_out_once();
        self.tables[self.read.live.load(Ordering::Relaxed)]
            .entries(0)
            .for_each(f);
    }
}

#[cfg(not(memhook_loom))]
impl<const N: usize> Default for MemtypeMap<N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(memhook_loom)))]
mod tests {

    #[test]
    fn an_address_reused_for_the_same_memory_stays_right_on_both_tables() {
        let m: MemtypeMap<64> = MemtypeMap::new();
        let found = |m: &MemtypeMap<64>, a| match m.lookup(a, 8) {
            Lookup::Found(i) => Some((i.mem_type, i.device)),
            _ => None,
        };
        for round in 0..3 {
            m.insert(0x10_0000, 0x2000, MemType::Cuda, 0).unwrap();
            assert_eq!(found(&m, 0x10_0100), Some((MemType::Cuda, 0)), "round {round}");
            m.remove(0x10_0000, 0x2000).unwrap();
            assert_eq!(found(&m, 0x10_0100), None, "round {round}");
        }
        // Reused again, then other updates publish each table in turn.
        m.insert(0x10_0000, 0x2000, MemType::Cuda, 0).unwrap();
        m.insert(0x20_0000, 0x100, MemType::CudaHost, -1).unwrap();
        assert_eq!(found(&m, 0x10_0100), Some((MemType::Cuda, 0)));
        m.insert(0x30_0000, 0x100, MemType::CudaHost, -1).unwrap();
        assert_eq!(found(&m, 0x10_0100), Some((MemType::Cuda, 0)));
        // Freed, then reused as another kind: no shortcut, both tables move.
        m.remove(0x10_0000, 0x2000).unwrap();
        m.insert(0x10_0000, 0x2000, MemType::CudaManaged, 1).unwrap();
        assert_eq!(found(&m, 0x10_0100), Some((MemType::CudaManaged, 1)));
        m.insert(0x40_0000, 0x100, MemType::CudaHost, -1).unwrap();
        assert_eq!(found(&m, 0x10_0100), Some((MemType::CudaManaged, 1)));
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn a_free_right_after_its_allocation_leaves_both_tables_right() {
        let m: MemtypeMap<64> = MemtypeMap::new();
        m.insert(0x1000, 0x1000, MemType::Cuda, 1).unwrap();
        for round in 0..4 {
            // Allocate and free a range that touches nothing (the writer
            // skips the second table's work), then check both tables by
            // publishing each in turn with further updates.
            m.insert(0x10_0000, 0x2000, MemType::CudaManaged, 0).unwrap();
            assert!(matches!(m.lookup(0x10_0800, 8), Lookup::Found(i) if i.mem_type == MemType::CudaManaged));
            m.remove(0x10_0000, 0x2000).unwrap();
            assert_eq!(m.lookup(0x10_0800, 8), Lookup::Absent, "round {round}");
            assert_eq!(m.len(), 1 + round);
            m.insert(0x20_0000 + round * 0x1_0000, 0x100, MemType::CudaHost, -1)
                .unwrap();
            assert_eq!(
                m.lookup(0x10_0800, 8),
                Lookup::Absent,
                "round {round}: the caught-up table"
            );
            assert_eq!(m.len(), 2 + round);
            assert!(matches!(m.lookup(0x1800, 8), Lookup::Found(i) if i.device == 1));
        }
        // An insert that overlaps an entry is not undone by a removal of its
        // own range: the entry it trimmed stays trimmed.
        m.insert(0x1800, 0x100, MemType::CudaHost, -1).unwrap();
        m.remove(0x1800, 0x100).unwrap();
        assert_eq!(m.lookup(0x1800, 8), Lookup::Absent);
        assert!(matches!(m.lookup(0x1000, 8), Lookup::Found(i) if i.len == 0x800));
        assert!(matches!(m.lookup(0x1900, 8), Lookup::Found(i) if i.base == 0x1900));
        m.insert(0x9000_0000, 0x10, MemType::Cuda, 0).unwrap();
        assert!(
            matches!(m.lookup(0x1900, 8), Lookup::Found(i) if i.base == 0x1900),
            "the other table agrees"
        );
        assert_eq!(m.lookup(0x1800, 8), Lookup::Absent);
    }

    /// Checks one table's layout: sorted starts, gaps that repeat the
    /// start of the entry after them, an entry in the last slot in use,
    /// entries that do not overlap, the entry count, free slots past the
    /// end, and an exact bucket table.
    fn check_table<const N: usize>(t: &Table<N>) {
        let n = t.len.load(Ordering::Relaxed);
        let mut entries = 0;
        let mut prev_end = 0;
        for i in 0..n {
            let (s, e, _) = t.get(i);
            if i + 1 < n {
                assert!(
                    s <= t.starts[i + 1].load(Ordering::Relaxed),
                    "slot {i}: starts out of order"
                );
            }
            if e == 0 {
                assert!(i + 1 < n, "a gap in the last slot in use");
                assert_eq!(s, t.starts[i + 1].load(Ordering::Relaxed), "slot {i}: a gap's start");
            } else {
                assert!(s < e && s >= prev_end, "slot {i}: entry [{s:#x}, {e:#x}) overlaps");
                prev_end = e;
                entries += 1;
            }
        }
        assert_eq!(entries, t.count.load(Ordering::Relaxed), "entry count");
        for i in n..N {
            assert_eq!(t.starts[i].load(Ordering::Relaxed), usize::MAX, "slot {i} past the end");
        }
        // The search tree: the levels a reader uses hold every 16th key of
        // the level below, then usize::MAX; the levels above, usize::MAX.
        let g = &Table::<N>::GEOMETRY;
        let used = Table::<N>::levels_for(n);
        let mut real = n;
        for l in 0..g.levels {
            real = real.div_ceil(B);
            for i in 0..g.size[l] {
                let key = t.index[g.off[l] + i].load(Ordering::Relaxed);
                let want = if l < used && i < real {
                    if l == 0 {
                        t.starts[B * i].load(Ordering::Relaxed)
                    } else {
                        t.index[g.off[l - 1] + B * i].load(Ordering::Relaxed)
                    }
                } else {
                    usize::MAX
                };
                assert_eq!(key, want, "index level {l} key {i} (length {n})");
            }
        }
        let (total, mut below) = (t.bucket_total.load(Ordering::Relaxed), 0);
        for b in 0..total {
            // Bucket starts rise with `b`, so one sweep counts them all.
            let bound = t.bucket_start(b);
            while below < n && t.starts[below].load(Ordering::Relaxed) < bound {
                below += 1;
            }
            assert_eq!(
                t.buckets[b].load(Ordering::Relaxed),
                bucket_count(below, n),
                "bucket {b}"
            );
        }
    }

    /// Brings the spare table up to date (as the next update would) and
    /// checks that both tables are the same slot for slot and well formed.
    fn check_both<const N: usize>(m: &MemtypeMap<N>) {
        let mut pending = m.writer.lock();
        m.lay_out_once();
        let live = m.read.live.load(Ordering::Relaxed);
        let (spare, live) = (&m.tables[1 - live], &m.tables[live]);
        if let Some((behind, from)) = pending.take() {
            if live.len.load(Ordering::Relaxed).saturating_sub(from) <= COPY_CATCH_UP {
                spare.catch_up(live, from);
            } else {
                spare.apply(behind, &mut Spill::default());
            }
        }
        check_table(live);
        let n = live.len.load(Ordering::Relaxed);
        assert_eq!(n, spare.len.load(Ordering::Relaxed), "slots in use differ");
        assert_eq!(live.count.load(Ordering::Relaxed), spare.count.load(Ordering::Relaxed));
        for i in 0..n {
            assert_eq!(live.get(i), spare.get(i), "slot {i} differs between the tables");
        }
    }

    /// A new map is zero bytes (a `static` one lies in `.bss`), its
    /// tables not yet laid out: it answers Absent everywhere, and readers
    /// racing its first writer (which lays them out) see Absent or the
    /// first entry, never anything else.
    #[test]
    fn a_new_map_answers_absent_and_readers_race_its_first_writer_safely() {
        for round in 0..200usize {
            let m: MemtypeMap<256> = MemtypeMap::new();
            assert!(m.is_empty());
            for addr in [0, 1, 0x1_0000, 0x1_0800, usize::MAX / 2, usize::MAX - 1] {
                assert_eq!(m.lookup(addr, 1), Lookup::Absent, "{addr:#x}");
            }
            m.for_each(|i| panic!("a new map holds {i:?}"));
            let base = 0x1_0000 + round * 0x1000;
            let want = Lookup::Found(MemInfo {
                mem_type: MemType::Cuda,
                device: 0,
                base,
                len: 0x1000,
            });
            let stop = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|s| {
                let reader = s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        for addr in [base, base + 0x800, base + 0xfff] {
                            match m.lookup(addr, 1) {
                                Lookup::Absent => {}
                                got => assert_eq!(got, want, "{addr:#x}"),
                            }
                        }
                        assert_eq!(m.lookup(base + 0x1000, 1), Lookup::Absent);
                    }
                });
                m.insert(base, 0x1000, MemType::Cuda, 0).unwrap();
                assert_eq!(m.lookup(base + 0x10, 8), want);
                stop.store(true, Ordering::Relaxed);
                reader.join().unwrap();
            });
            check_both(&m);
        }
    }

    /// `prepare` lays out a new map's tables (as its first writer would)
    /// and changes nothing in a map already written.
    #[test]
    fn prepare_lays_out_the_tables_once_and_keeps_entries() {
        let m: MemtypeMap<256> = MemtypeMap::new();
        assert!(!m.ready.load(Ordering::Relaxed));
        m.prepare();
        assert!(m.ready.load(Ordering::Relaxed));
        for t in &m.tables {
            assert!(t.starts.iter().all(|k| k.load(Ordering::Relaxed) == usize::MAX));
            assert!(t.segments.iter().all(|s| s.lo.load(Ordering::Relaxed) == usize::MAX));
        }
        assert_eq!(m.lookup(0x1_0000, 1), Lookup::Absent);
        for i in 0..100 {
            m.insert(0x1_0000 + i * 0x2000, 0x1000, MemType::Cuda, 0).unwrap();
        }
        m.prepare();
        assert_eq!(m.len(), 100);
        check_both(&m);
        assert!(
            matches!(m.lookup(0x1_0000 + 99 * 0x2000 + 8, 8), Lookup::Found(i) if i.base == 0x1_0000 + 99 * 0x2000)
        );
    }

    /// A child of `fork` made while a thread of the parent was updating
    /// the map finds its lock held and its spare table half-written, or
    /// its pending operation stale. `reset_after_fork` lets the lock go
    /// and mends the spare: the map then agrees with a plain list of its
    /// entries through every later update, on both tables.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "still running after ten minutes under Miri; its one unsafe call only unlocks a spin lock"
    )]
    #[allow(unsafe_code)]
    fn reset_after_fork_mends_a_map_left_mid_update() {
        const CELLS: usize = 256;
        let cell = |i: usize| 0x100_0000 + i * 0x1_0000;
        // Where the parent's writer stopped: 0, inside its edit of the
        // spare; 1, after publishing, before recording what the spare
        // lacks; 2, inside the first writer's layout of the tables.
        for case in 0..3u64 {
            let m: MemtypeMap<1024> = MemtypeMap::new();
            let mut next = xorshift(0x9e37_79b9_7f4a_7c15 ^ case);
            // (length, device) of the entry recorded in each cell.
            let mut model = [None::<(usize, i32)>; CELLS];
            let check = |m: &MemtypeMap<1024>, model: &[Option<(usize, i32)>; CELLS], what: &str| {
                for (i, entry) in model.iter().enumerate() {
                    let got = m.lookup(cell(i) + 8, 8);
                    match *entry {
                        Some((len, device)) => assert_eq!(
                            got,
                            Lookup::Found(MemInfo {
                                mem_type: MemType::Cuda,
                                device,
                                base: cell(i),
                                len
                            }),
                            "case {case}, {what}: cell {i}"
                        ),
                        None => assert_eq!(got, Lookup::Absent, "case {case}, {what}: cell {i}"),
                    }
                }
            };
            let step =
                |m: &MemtypeMap<1024>, model: &mut [Option<(usize, i32)>; CELLS], next: &mut dyn FnMut() -> usize| {
                    let i = next() % CELLS;
                    if next().is_multiple_of(3) {
                        m.remove(cell(i), 0x1_0000).unwrap();
                        model[i] = None;
                    } else {
                        let (len, device) = (0x100 + next() % 0xff00, (next() % 8) as i32);
                        m.insert(cell(i), len, MemType::Cuda, device).unwrap();
                        model[i] = Some((len, device));
                    }
                };
            if case != 2 {
                for _ in 0..400 {
                    step(&m, &mut model, &mut next);
                }
            }
            match case {
                0 => {
                    let held = m.writer.lock();
                    let spare = &m.tables[1 - m.read.live.load(Ordering::Relaxed)];
                    spare.begin_write();
                    for i in 0..64 {
                        spare.set(i * 3, (next(), next(), next() as u64));
                    }
                    spare.len.store(777, Ordering::Relaxed);
                    spare.buckets[3].store(5, Ordering::Relaxed);
                    core::mem::forget(held);
                }
                1 => {
                    let mut held = m.writer.lock();
                    let (start, end, meta) = (cell(7), cell(7) + 0x300, pack(MemType::Cuda, 5));
                    m.update_locked(
                        &mut held,
                        Op::Insert {
                            start,
                            end,
                            meta,
                            pure: false,
                        },
                    );
                    model[7] = Some((0x300, 5));
                    *held = None;
                    core::mem::forget(held);
                }
                _ => {
                    let held = m.writer.lock();
                    m.tables[0].lay_out();
                    core::mem::forget(held);
                }
            }
            assert!(
                m.writer.try_lock().is_none(),
                "case {case}: the lock is held, as in the child"
            );
            check(&m, &model, "before the mend");
            // SAFETY: the writer lock's holder (a forgotten guard above)
            // is not in an update of the map, as a gone thread's is not.
            assert!(unsafe { m.reset_after_fork() }, "case {case}");
            check(&m, &model, "mended");
            check_both(&m);
            for round in 0..1500 {
                step(&m, &mut model, &mut next);
                check(&m, &model, "after the mend");
                if round % 100 == 0 {
                    check_both(&m);
                }
            }
            // With the lock free, there is nothing to mend.
            let mut before = std::vec::Vec::new();
            m.for_each(|i| before.push(i));
            // SAFETY: nobody holds the lock.
            assert!(!unsafe { m.reset_after_fork() });
            let mut after = std::vec::Vec::new();
            m.for_each(|i| after.push(i));
            assert_eq!(before, after);
            check_both(&m);
        }
    }

    /// Random inserts, removals and takes, small and large, overlapping
    /// and not, on maps small enough to fill: after every update both
    /// tables hold the same slots, well formed, and every lookup agrees
    /// with a plain list of the entries.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "minutes under Miri: the layout's logic, no unsafe code (scripts/miri.sh)"
    )]
    fn both_tables_stay_identical_and_well_formed() {
        fn run<const N: usize>(seed: u64, ops: usize, span: usize) {
            let m: MemtypeMap<N> = MemtypeMap::new();
            let mut next = xorshift(seed);
            let mut recorded: [(usize, usize); 64] = [(0, 0); 64];
            for op in 0..ops {
                let start = (next() % span) * 0x100 + 0x1_0000;
                let len = match next() % 4 {
                    0 => 0x100,
                    1 => (next() % 4 + 1) * 0x100,
                    2 => (next() % 64 + 1) * 0x100,
                    _ => (next() % 1024 + 1) * 0x10,
                };
                match next() % 8 {
                    0..=3 => {
                        m.insert(start, len, MemType::Cuda, (op % 5) as i32).unwrap();
                        recorded[op % 64] = (start, len);
                    }
                    4 => m.remove(start, len).unwrap(),
                    5 => {
                        let (s, l) = recorded[next() % 64];
                        if l != 0 {
                            m.remove(s, l).unwrap();
                        }
                    }
                    6 => {
                        let (s, _) = recorded[next() % 64];
                        let _ = m.take(s);
                    }
                    _ => {
                        // Allocate and free at once: the writer's shortcut.
                        m.insert(start, len, MemType::CudaHost, -1).unwrap();
                        m.remove(start, len).unwrap();
                    }
                }
                if op % 7 == 0 || N <= 64 {
                    check_both(&m);
                    let mut entries = [(0usize, 0usize); N];
                    let mut k = 0;
                    m.for_each(|i| {
                        entries[k] = (i.base, i.base + i.len);
                        k += 1;
                    });
                    assert_eq!(k, m.len());
                    for _ in 0..16 {
                        let addr = (next() % span) * 0x100 + 0x1_0000 + next() % 0x100;
                        let hit = entries[..k].iter().find(|&&(s, e)| s <= addr && addr < e);
                        match (m.lookup(addr, 1), hit) {
                            (Lookup::Found(i), Some(&(s, e))) => assert_eq!((i.base, i.base + i.len), (s, e)),
                            (Lookup::Absent, None) | (Lookup::Unknown, _) if m.dropped() > 0 => {}
                            (Lookup::Absent, None) => {}
                            (got, want) => panic!("seed {seed:#x} op {op}: {addr:#x}: {got:?}, entries say {want:?}"),
                        }
                    }
                }
            }
        }
        for seed in 1..6u64 {
            run::<16>(seed * 0x9e37_79b9, 3000, 256);
            run::<64>(seed * 0x2545_f491, 3000, 512);
            run::<512>(seed * 0x1234_5679, 4000, 4096);
            run::<4096>(seed * 0x7f4a_7c15, 6000, 1 << 16);
        }
    }

    /// Updates stay local: random inserts and removals among 4,000
    /// entries in 8,192 slots rewrite a few dozen slots on average (the
    /// sorted array moved half the table each time); a table that shrinks
    /// to 16 entries ends packed; small tables never hold a gap.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "minutes under Miri: the layout's logic, no unsafe code (scripts/miri.sh)"
    )]
    fn updates_rewrite_a_window_and_small_tables_stay_packed() {
        static T: Table<8192> = Table::new();
        T.lay_out();
        let mut next = xorshift(0x5851_f42d_4c95_7f2d);
        let edit = |start: usize, len: usize, meta: Option<u64>| {
            T.rewrite(|| T.edit(start, start + len, meta, &mut Spill::default()))
        };
        let addr = |i: usize| 0x10_0000 + i * 0x10_0000;
        let mut live = std::vec::Vec::new();
        for _ in 0..4000 {
            let i = next() % 1_000_000;
            edit(addr(i), 0x1000, Some(1));
            live.push(i);
        }
        live.sort_unstable();
        live.dedup();
        check_table(&T);
        let (mut rewritten, mut edits) = (0, 0);
        for k in 0..4000 {
            let e = if k % 2 == 0 {
                let i = next() % 1_000_000;
                if live.binary_search(&i).is_ok() {
                    continue;
                }
                live.insert(live.binary_search(&i).unwrap_err(), i);
                edit(addr(i), 0x1000, Some(1))
            } else {
                let i = live.remove(next() % live.len());
                edit(addr(i), 0x1000, None)
            };
            rewritten += e.to - e.from;
            edits += 1;
        }
        check_table(&T);
        let n = T.len.load(Ordering::Relaxed);
        assert!(
            rewritten / edits <= 64,
            "{} slots rewritten per edit of {n}",
            rewritten / edits
        );
        // Shrink to 16 entries: the table ends packed.
        while live.len() > 16 {
            let i = live.remove(next() % live.len());
            edit(addr(i), 0x1000, None);
            let (n, count) = (T.len.load(Ordering::Relaxed), T.count.load(Ordering::Relaxed));
            assert!(count > SMALL_TABLE || n == count, "{count} entries in {n} slots");
        }
        check_table(&T);
        assert_eq!(T.len.load(Ordering::Relaxed), 16);
        // A queue: allocate above everything, free the oldest. The slots in
        // use stay within four times the entries, and edits stay local.
        static Q: Table<8192> = Table::new();
        Q.lay_out();
        let (mut rewritten, mut edits) = (0, 0);
        let queue = |i: usize| 0x1_0000_0000 + i * 0x1_0000;
        for i in 0..200 {
            Q.rewrite(|| Q.edit(queue(i), queue(i) + 0x8000, Some(3), &mut Spill::default()));
        }
        for k in 0..5000 {
            for e in [
                Q.rewrite(|| Q.edit(queue(200 + k), queue(200 + k) + 0x8000, Some(3), &mut Spill::default())),
                Q.rewrite(|| Q.edit(queue(k), queue(k) + 0x8000, None, &mut Spill::default())),
            ] {
                rewritten += e.to - e.from;
                edits += 1;
            }
            let (n, count) = (Q.len.load(Ordering::Relaxed), Q.count.load(Ordering::Relaxed));
            assert!(count == 200 && n <= 4 * count + B, "{count} entries in {n} slots");
            if k % 500 == 0 {
                check_table(&Q);
            }
        }
        assert!(
            rewritten / edits <= 64,
            "queue: {} slots rewritten per edit",
            rewritten / edits
        );
        // Inserts and removals in the middle of a small table keep it packed.
        for _ in 0..200 {
            let i = next() % 1_000_000;
            if live.binary_search(&i).is_err() {
                edit(addr(i), 0x1000, Some(2));
                edit(addr(i), 0x1000, None);
            }
            assert_eq!(T.len.load(Ordering::Relaxed), T.count.load(Ordering::Relaxed));
        }
        check_table(&T);
    }

    /// A pseudo-random sequence (xorshift64) from `x`.
    fn xorshift(mut x: u64) -> impl FnMut() -> usize {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as usize
        }
    }

    /// The bucket table against a plain count of the starts, through
    /// inserts and removes that move its low end, widen and narrow its
    /// span, cross its size thresholds and pile many small ranges into
    /// one bucket (where the window falls back to the tree).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "minutes under Miri: the layout's logic, no unsafe code (scripts/miri.sh)"
    )]
    fn the_bucket_table_counts_the_starts_exactly() {
        let map: MemtypeMap<512> = MemtypeMap::new();
        let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
        let mut used_buckets = 0;
        for round in 0..3000 {
            let r = next();
            let (start, len) = match round % 5 {
                // Spread over a wide span.
                0 | 1 => (0x1_0000_0000 + (r % 4096) * 0x20_0000, 0x1000),
                // A dense cluster of small ranges.
                2 => (0x2_0000_0000 + (r % 2048) * 0x40, 0x40),
                // Far above and far below (moving both ends).
                3 => (
                    if r & 1 == 0 { 0x7000_0000_0000 } else { 0x1000 } + (r >> 8) % 64 * 0x1000,
                    0x1000,
                ),
                _ => (0x1_0000_0000 + (r % 4096) * 0x20_0000, 0x40_0000),
            };
            if round % 400 == 399 {
                // Most of the map goes at once: the bucket table shrinks
                // and leaves stale counts past its end.
                map.remove(0x1_0000_0000, 0x2_0000_0000 - round % 3 * 0x8000_0000)
                    .unwrap();
            } else if next().is_multiple_of(3) {
                map.remove(start, len).unwrap();
            } else {
                map.insert(start, len, MemType::Cuda, 0).unwrap();
            }
            let t = &map.tables[map.read.live.load(Ordering::Relaxed)];
            let n = t.len.load(Ordering::Relaxed);
            let on = t.bucket_total.load(Ordering::Relaxed) != 0;
            assert!(
                (on || n < BUCKETS_MIN) && (!on || n >= BUCKETS_MIN * 3 / 4),
                "bucket table on from {BUCKETS_MIN} slots, off below three quarters of that ({n}, {on})"
            );
            let starts: [usize; 512] = core::array::from_fn(|i| t.starts[i].load(Ordering::Relaxed));
            let last = starts[n.max(1) - 1];
            let mut probes = [0usize; 13 + 4 * SEGMENTS];
            probes[..13].copy_from_slice(&[
                next(),
                start,
                start + len - 1,
                start.wrapping_sub(1),
                starts[next() % n.max(1)],
                starts[next() % n.max(1)].wrapping_sub(1),
                0,
                usize::MAX - 1,
                last,
                last.wrapping_add(1 + next() % 0x10_0000),
                last.wrapping_add(next() % 0x1_0000_0000),
                next() % 0x3_0000_0000,
                next() % 0x8000_0000_0000,
            ]);
            // Each segment's edges and a bucket edge inside it.
            for (k, seg) in t.segments.iter().enumerate() {
                let (lo, shift) = (seg.lo.load(Ordering::Relaxed), seg.shift.load(Ordering::Relaxed));
                let (base, end) = (seg.base.load(Ordering::Relaxed), seg.end.load(Ordering::Relaxed));
                let inside = if end > base {
                    t.bucket_start(base + next() % (end - base))
                } else {
                    lo
                };
                let past = if end > base { t.bucket_start(end - 1) } else { lo };
                probes[13 + 4 * k..17 + 4 * k].copy_from_slice(&[
                    lo,
                    lo.wrapping_sub(1),
                    inside,
                    past.wrapping_add(next() % (1 << shift.min(40))),
                ]);
            }
            for probe in probes {
                if probe == usize::MAX {
                    continue; // no lookup asks there (its end would wrap)
                }
                let want = starts[..n].iter().filter(|&&s| s <= probe).count();
                assert_eq!(t.tree_rank(n, probe), want, "tree at {probe:#x}");
                if let Some(got) = t.bucket_rank(n, probe) {
                    assert_eq!(got, want, "buckets at {probe:#x} (n {n})");
                    used_buckets += 1;
                }
                assert_eq!(t.upper_bound(n, probe), want);
            }
        }
        assert!(
            used_buckets > 1000,
            "the bucket path answered only {used_buckets} probes"
        );
    }

    /// Appends and frees near the end (how allocations arrive): the spare
    /// table catches up by a copy of the last entries and recounts only
    /// the buckets that copy spans. Every bucket of both tables must still
    /// count the starts below it exactly.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "minutes under Miri: the layout's logic, no unsafe code (scripts/miri.sh)"
    )]
    fn buckets_stay_exact_when_the_spare_catches_up_near_the_end() {
        let map: MemtypeMap<512> = MemtypeMap::new();
        let mut next = xorshift(0x1234_5678_9abc_def1u64);
        let mut top = 0x7f00_0000_0000usize;
        for step in 0..2000 {
            match next() % 4 {
                // Free one of the last few, or the last.
                0 if !map.is_empty() => {
                    let t = &map.tables[map.read.live.load(Ordering::Relaxed)];
                    let n = t.len.load(Ordering::Relaxed);
                    let i = n - 1 - (next() % n.min(8));
                    let at = t.starts[i].load(Ordering::Relaxed);
                    assert!(map.take(at).is_some());
                }
                // Or free the last few at once (one operation removing
                // several starts, which the next catch-up copies over).
                1 if map.len() > 8 && step % 5 == 0 => {
                    let t = &map.tables[map.read.live.load(Ordering::Relaxed)];
                    let n = t.len.load(Ordering::Relaxed);
                    let at = t.starts[n - 1 - next() % 8].load(Ordering::Relaxed);
                    map.remove(at, top + 0x8000 - at).unwrap();
                }
                // Allocate above everything, sometimes far above.
                _ => {
                    top += 0x1_0000 * (1 + next() % 4) + if step % 97 == 0 { 0x40_0000_0000 } else { 0 };
                    let _ = map.insert(top, 0x8000, MemType::Cuda, 0).unwrap();
                }
            }
            for t in &map.tables {
                let n = t.len.load(Ordering::Relaxed);
                let starts: [usize; 512] = core::array::from_fn(|i| t.starts[i].load(Ordering::Relaxed));
                for k in 0..t.bucket_total.load(Ordering::Relaxed) {
                    let bound = t.bucket_start(k);
                    let want = starts[..n].iter().filter(|&&s| s < bound).count();
                    assert_eq!(
                        t.buckets[k].load(Ordering::Relaxed),
                        bucket_count(want, n),
                        "bucket {k} (n {n}, step {step})"
                    );
                }
            }
        }
        assert!(
            map.len() >= BUCKETS_MIN,
            "the test reached the bucket table ({} entries)",
            map.len()
        );
    }

    /// The bucket counts against a plain count of the starts after every
    /// update of allocation-like traffic in three clusters far apart, on a
    /// map that fills up (so windows meet the end of the starts).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "minutes under Miri: the layout's logic, no unsafe code (scripts/miri.sh)"
    )]
    fn segmented_buckets_count_the_starts_exactly() {
        let map: MemtypeMap<512> = MemtypeMap::new();
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
        for step in 0..6000 {
            let r = next();
            let start = match r % 14 {
                0..=7 => 0x7f07_afe0_0000 + (next() % 1024) * 0x1_0000,
                8..=11 => 0x7f86_0000_0000 + (next() % 256) * 0x20_0000,
                12 => 0x10_0000 + (next() % 16) * 0x1000,
                _ => 0x7f86_0000_0000 + (256 + (next() % 64) * 64) * 0x20_0000,
            };
            match next() % 11 {
                0..=7 => {
                    let _ = map.insert(start, (1 + next() % 3) * 0x1000, MemType::Cuda, 0);
                }
                8 | 9 => map.remove(start, (1 + next() % 63) * 0x1_0000).unwrap(),
                _ => {
                    let _ = map.take(start);
                }
            }
            for t in &map.tables {
                let n = t.len.load(Ordering::Relaxed);
                if n == 0 {
                    continue;
                }
                let starts: [usize; 512] = core::array::from_fn(|i| t.starts[i].load(Ordering::Relaxed));
                let picks: [usize; 24] = core::array::from_fn(|k| starts[next() % n] + [0, 0x10, 0x1fff][k % 3]);
                for probe in [start, start + 0x800].into_iter().chain(picks) {
                    let want = starts[..n].iter().filter(|&&s| s <= probe).count();
                    if let Some((below, upto)) = t.bucket_bounds(n, probe) {
                        if !(below <= want && want <= upto) {
                            for seg in &t.segments {
                                std::eprintln!(
                                    "seg lo {:#x} shift {} base {} end {}",
                                    seg.lo.load(Ordering::Relaxed),
                                    seg.shift.load(Ordering::Relaxed),
                                    seg.base.load(Ordering::Relaxed),
                                    seg.end.load(Ordering::Relaxed)
                                );
                            }
                            let total = t.bucket_total.load(Ordering::Relaxed);
                            for b in 0..total {
                                std::eprint!(
                                    "{}:{:#x}={} ",
                                    b,
                                    t.bucket_start(b),
                                    t.buckets[b].load(Ordering::Relaxed)
                                );
                            }
                            std::eprintln!();
                            for (i, s) in starts[..n].iter().enumerate() {
                                std::eprint!("{i}:{s:#x} ");
                            }
                            std::eprintln!(
                                "\nbuilt {} strays {}",
                                t.built_len.load(Ordering::Relaxed),
                                t.strays.load(Ordering::Relaxed)
                            );
                        }
                        assert!(
                            below <= want && want <= upto,
                            "step {step}: {probe:#x} has {want} starts below, bounds {below}..{upto} (n {n})"
                        );
                    }
                    assert_eq!(t.upper_bound(n, probe), want, "step {step}: {probe:#x} (n {n})");
                }
            }
        }
    }

    /// Device memory in one place, pinned host memory far away, and one
    /// stray range farther still: each cluster gets a segment of its own,
    /// so a lookup in either needs only a bucket and one 16-start window
    /// (at most 16 starts between the bucket's bounds), where one set of
    /// uniform buckets over the whole span would pile each cluster into a
    /// few crowded buckets.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "minutes under Miri: the layout's logic, no unsafe code (scripts/miri.sh)"
    )]
    fn clusters_far_apart_get_buckets_of_their_own() {
        static MAP: MemtypeMap<8192> = MemtypeMap::new();
        let device = |i: usize| 0x7f07_afe0_0000 + i * 0x1_0000;
        let pinned = |i: usize| 0x7f86_0000_0000 + i * 0x20_0000;
        for i in 0..4000 {
            MAP.insert(device(i), 0x1_0000, MemType::Cuda, 0).unwrap();
        }
        for i in 0..1000 {
            MAP.insert(pinned(i), 0x20_0000, MemType::CudaHost, -1).unwrap();
        }
        MAP.insert(0x1000, 0x1000, MemType::CudaManaged, 0).unwrap();
        let t = &MAP.tables[MAP.read.live.load(Ordering::Relaxed)];
        let n = t.len.load(Ordering::Relaxed);
        assert_eq!(t.count.load(Ordering::Relaxed), 5001);
        let used = t
            .segments
            .iter()
            .filter(|s| s.lo.load(Ordering::Relaxed) != usize::MAX)
            .count();
        assert_eq!(used, 3, "the stray range, the device cluster and the pinned cluster");
        for addr in (0..4000)
            .map(|i| device(i) + 0x800)
            .chain((0..1000).map(|i| pinned(i) + 0x1234))
        {
            let (below, upto) = t.bucket_bounds(n, addr).unwrap();
            assert!(upto - below <= B, "{addr:#x}: {} starts in its bucket", upto - below);
            assert!(matches!(MAP.lookup(addr, 8), Lookup::Found(_)));
        }
    }

    #[cfg(all(target_arch = "x86_64", not(memhook_loom)))]
    #[test]
    fn the_avx2_node_search_agrees_with_the_portable_one() {
        if !crate::simd::avx2() {
            return; // nothing to compare on this CPU
        }
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
        for round in 0..20_000 {
            let mut keys = [0usize; B];
            for k in &mut keys {
                // Small, large (top bit set) and extreme values.
                *k = match round % 4 {
                    0 => next() % 64,
                    1 => next(),
                    2 => usize::MAX - next() % 8,
                    _ => next() | (1 << 63),
                };
            }
            keys.sort_unstable();
            let node: [AtomicUsize; B] = core::array::from_fn(|i| AtomicUsize::new(keys[i]));
            for addr in [
                0,
                usize::MAX,
                keys[next() % B],
                keys[next() % B].wrapping_sub(1),
                next(),
            ] {
                #[allow(unsafe_code)]
                // SAFETY: AVX2 is usable; 16 aligned words.
                let fast = unsafe { crate::simd::node_rank(node.as_ptr().cast(), addr) };
                assert_eq!(fast, node_rank_portable(&node, addr), "{keys:x?} {addr:#x}");
            }
        }
    }
    use super::*;

    fn found<const N: usize>(map: &MemtypeMap<N>, addr: usize, len: usize) -> Option<(MemType, usize, usize)> {
        match map.lookup(addr, len) {
            Lookup::Found(i) => Some((i.mem_type, i.base, i.len)),
            _ => None,
        }
    }

    #[test]
    fn insert_splits_the_entry_it_lands_in() {
        let map = MemtypeMap::<8>::new();
        map.insert(0x1000, 0x3000, MemType::Cuda, 0).unwrap();
        map.insert(0x2000, 0x1000, MemType::CudaHost, -1).unwrap();
        assert_eq!(found(&map, 0x1000, 1), Some((MemType::Cuda, 0x1000, 0x1000)));
        assert_eq!(found(&map, 0x2fff, 1), Some((MemType::CudaHost, 0x2000, 0x1000)));
        assert_eq!(found(&map, 0x3000, 0x1000), Some((MemType::Cuda, 0x3000, 0x1000)));
        assert_eq!(map.len(), 3);
    }

    #[test]
    fn full_map_drops_and_poisons_instead_of_answering_wrong() {
        let map = MemtypeMap::<2>::new();
        map.insert(0x1000, 0x1000, MemType::Cuda, 0).unwrap();
        map.insert(0x3000, 0x1000, MemType::Cuda, 0).unwrap();
        assert_eq!(
            map.insert(0x5000, 0x1000, MemType::CudaManaged, 0),
            Ok(Inserted::Dropped)
        );
        assert_eq!(map.dropped(), 1);
        assert_eq!(map.lookup(0x5800, 8), Lookup::Unknown);
        // Replacing an existing range while full: the old type must go.
        assert_eq!(map.insert(0x1000, 0x1000, MemType::CudaHost, 0), Ok(Inserted::Stored));
        assert_eq!(found(&map, 0x1000, 8), Some((MemType::CudaHost, 0x1000, 0x1000)));
        // A split with no free slot drops the right-hand part.
        map.remove(0x3400, 0x100).unwrap();
        assert_eq!(found(&map, 0x3000, 0x400), Some((MemType::Cuda, 0x3000, 0x400)));
        assert_eq!(map.lookup(0x3800, 8), Lookup::Unknown);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "minutes under Miri: the layout's logic, no unsafe code (scripts/miri.sh)"
    )]
    fn the_search_tree_keeps_the_levels_readers_use_as_tables_grow_and_shrink() {
        let m = MemtypeMap::<4096>::new();
        let at = |i: usize| 0x10_0000 + i * 0x1000;
        let levels = |m: &MemtypeMap<4096>| {
            m.tables[m.read.live.load(Ordering::Relaxed)]
                .index_levels
                .load(Ordering::Relaxed)
        };
        // Grow through 16 and 256 entries, shrink back to 3 from the front
        // (a queue), then from the back, and grow again: the tree stays
        // exact (check_both) and every entry is found.
        let mut seen = [false; 3];
        for round in 0..2 {
            for i in 0..600 {
                m.insert(at(i), 0x800, MemType::Cuda, 0).unwrap();
                if i % 37 == 0 || i == 16 || i == 256 || i == 257 {
                    check_both(&m);
                }
                seen[levels(&m)] = true;
            }
            let range = if round == 0 { 0..597 } else { 3..600 };
            for i in range {
                if round == 0 {
                    m.remove(at(i), 0x800).unwrap();
                } else {
                    m.remove(at(600 - i + 2), 0x800).unwrap();
                }
                if i % 41 == 0 {
                    check_both(&m);
                }
            }
            check_both(&m);
            assert_eq!(m.len(), 3);
            assert_eq!(levels(&m), 0, "three entries: one leaf, no level");
            m.clear();
        }
        assert_eq!(seen, [true; 3], "the table used no level, one, and two");
        for i in 0..300 {
            m.insert(at(i), 0x800, MemType::Cuda, 0).unwrap();
        }
        for i in 0..300 {
            assert!(
                matches!(m.lookup(at(i) + 8, 8), Lookup::Found(f) if f.base == at(i)),
                "entry {i}"
            );
            assert_eq!(m.lookup(at(i) + 0x900, 8), Lookup::Absent);
        }
    }

    /// `take` answers with the whole entry (type, device, range) that
    /// starts at the address, whether it was recorded last (the
    /// writer's shortcut) or earlier (the table's search, whose answer
    /// comes back packed in two registers), and nothing elsewhere.
    #[test]
    fn take_returns_the_entry_recorded_at_the_address() {
        let m = MemtypeMap::<64>::new();
        let (a, b, c) = (0x10_0000, 0x20_0000, 0x30_0000);
        m.insert(a, 0x1000, MemType::Cuda, 3).unwrap();
        m.insert(c, 0x3000, MemType::CudaHost, -1).unwrap();
        m.insert(b, 0x2000, MemType::CudaManaged, 1).unwrap();
        let info = |mem_type, device, base, len| MemInfo {
            mem_type,
            device,
            base,
            len,
        };
        // Inside an entry, past the end of the address space: nothing.
        assert_eq!(m.take(b + 0x1000), None);
        assert_eq!(m.take(usize::MAX), None);
        // Recorded last: the shortcut.
        assert_eq!(m.take(b), Some(info(MemType::CudaManaged, 1, b, 0x2000)));
        // Recorded earlier: found in the table.
        assert_eq!(m.take(a), Some(info(MemType::Cuda, 3, a, 0x1000)));
        assert_eq!(m.take(a), None);
        assert_eq!(m.lookup(a, 1), Lookup::Absent);
        assert_eq!(m.take(c), Some(info(MemType::CudaHost, -1, c, 0x3000)));
        assert!(m.is_empty());
    }

    /// The writer's words share one line; what lookups read first lies on
    /// the next, which an update writes once (the live index).
    /// A mark is the caller's: lookups answer as without it, the pieces
    /// of a split entry keep it, and a take gives it back, whether the
    /// entry was the one recorded last or lies among thousands.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "minutes under Miri: the layout's logic, no unsafe code (scripts/miri.sh)"
    )]
    fn a_mark_stays_with_its_entry_and_its_pieces_and_lookups_do_not_see_it() {
        let map = MemtypeMap::<4096>::new();
        // The last recorded, taken by the shortcut.
        map.insert_marked(0x1000, 0x1000, MemType::Cuda, -1, true).unwrap();
        assert_eq!(found(&map, 0x1800, 1), Some((MemType::Cuda, 0x1000, 0x1000)));
        let (info, mark) = map.take_marked(0x1000).unwrap();
        assert_eq!(
            (info.mem_type, info.device, info.len, mark),
            (MemType::Cuda, -1, 0x1000, true)
        );
        map.insert_marked(0x1000, 0x1000, MemType::Cuda, -1, false).unwrap();
        assert_eq!(map.take_marked(0x1000).map(|(_, m)| m), Some(false));
        // Many entries, alternately marked, of every type and a device each.
        let types = [MemType::Cuda, MemType::CudaManaged, MemType::CudaHost, MemType::Unknown];
        for i in 0..2000usize {
            let t = types[i % 4];
            map.insert_marked(0x10_0000 + i * 0x1000, 0x1000, t, (i % 7) as i32 - 1, i % 2 == 0)
                .unwrap();
        }
        for i in (0..2000usize).step_by(3) {
            let at = 0x10_0000 + i * 0x1000;
            let info = match map.lookup(at + 8, 8) {
                Lookup::Found(info) => info,
                other => panic!("{at:#x}: {other:?}"),
            };
            assert_eq!((info.mem_type, info.device), (types[i % 4], (i % 7) as i32 - 1));
        }
        // A remove splits entry 10 (marked), an insert splits entry 11 (not).
        let at = |i: usize| 0x10_0000 + i * 0x1000;
        map.remove(at(10) + 0x400, 0x400).unwrap();
        map.insert(at(11) + 0x400, 0x400, MemType::CudaHost, 3).unwrap();
        for (start, len, mark) in [
            (at(10), 0x400, true),
            (at(10) + 0x800, 0x800, true),
            (at(11), 0x400, false),
            (at(11) + 0x400, 0x400, false),
            (at(11) + 0x800, 0x800, false),
        ] {
            let (info, m) = map.take_marked(start).expect("an entry starts there");
            assert_eq!((info.base, info.len, m), (start, len, mark), "{start:#x}");
        }
        for i in (12..2000usize).rev() {
            let (info, m) = map.take_marked(at(i)).unwrap();
            assert_eq!(
                (info.mem_type, info.device, info.len, m),
                (types[i % 4], (i % 7) as i32 - 1, 0x1000, i % 2 == 0)
            );
        }
        assert_eq!(map.take_marked(at(3) + 1), None);
    }

    #[test]
    fn the_writers_words_and_the_readers_words_lie_on_two_lines() {
        let map = MemtypeMap::<64>::new();
        let base = &map as *const _ as usize;
        assert_eq!(base % 64, 0);
        let at = |p: usize, len: usize| (p - base, p + len - base);
        let writer = at(&map.writer as *const _ as usize, size_of_val(&map.writer));
        let ready = at(&map.ready as *const _ as usize, 1);
        let dropped = at(&map.dropped as *const _ as usize, 8);
        for (lo, hi) in [writer, ready, dropped] {
            assert!(hi <= 64, "writer word at {lo}..{hi}");
        }
        for p in [
            &map.read.live as *const _ as usize,
            &map.read.dropped_lo as *const _ as usize,
            &map.read.dropped_hi as *const _ as usize,
        ] {
            let (lo, hi) = at(p, 8);
            assert!(lo >= 64 && hi <= 128, "reader word at {lo}..{hi}");
        }
    }

    /// A walk in chunks from any address sees exactly the entries at or
    /// above it, in order, and may remove entries between chunks.
    #[test]
    fn entries_from_walks_the_map_in_chunks() {
        let map = MemtypeMap::<256>::new();
        let mut next = xorshift(7);
        for _ in 0..150 {
            let start = (next() % 4096) * 0x1000;
            let _ = map.insert(start, 0x1000 * (1 + next() % 3), MemType::Cuda, 0);
        }
        let mut all = Vec::new();
        map.for_each(|i| all.push(i));
        assert!(all.len() > 40, "{}", all.len());
        for from in [
            0,
            1,
            all[5].base,
            all[5].base + 1,
            all[all.len() - 1].base + 1,
            usize::MAX,
        ] {
            for chunk in [1, 3, 64] {
                let mut seen = Vec::new();
                let mut cursor = from;
                let mut buf = [MemInfo {
                    mem_type: MemType::Host,
                    device: 0,
                    base: 0,
                    len: 0,
                }; 64];
                loop {
                    let got = map.entries_from(cursor, &mut buf[..chunk]);
                    seen.extend_from_slice(&buf[..got]);
                    if got < chunk {
                        break;
                    }
                    cursor = buf[got - 1].base + 1;
                }
                let want: Vec<MemInfo> = all.iter().copied().filter(|i| i.base >= from).collect();
                assert_eq!(seen, want, "from {from:#x}, chunks of {chunk}");
            }
        }
        // Removing what a chunk returned, as a walk that ends entries does.
        let mut cursor = 0;
        let mut buf = [all[0]; 4];
        let mut removed = 0;
        loop {
            let got = map.entries_from(cursor, &mut buf);
            for info in &buf[..got] {
                if info.base % 0x2000 == 0 {
                    map.remove(info.base, info.len).unwrap();
                    removed += 1;
                }
                cursor = info.base + 1;
            }
            if got < buf.len() {
                break;
            }
        }
        let mut left = Vec::new();
        map.for_each(|i| left.push(i));
        assert_eq!(left.len() + removed, all.len());
        assert!(left.iter().all(|i| i.base % 0x2000 != 0));
    }

    #[test]
    fn bad_ranges_are_errors() {
        let map = MemtypeMap::<2>::new();
        assert_eq!(
            map.insert(5, 0, MemType::Cuda, 0),
            Err(MapError::EmptyRange { start: 5 })
        );
        assert_eq!(
            map.remove(usize::MAX - 1, 4),
            Err(MapError::WrapsAround {
                start: usize::MAX - 1,
                len: 4
            })
        );
        assert_eq!(map.lookup(usize::MAX, 2), Lookup::Unknown);
        assert!(map.is_empty());
    }
}

//! A plain `BTreeMap` model of `MemtypeMap`, and a harness that runs one
//! sequence of operations against both and compares every answer. The
//! property tests and the `memtype` fuzz target share it.

use std::collections::BTreeMap;

use memhook_core::memtype::{Inserted, Lookup, MapError, MemInfo, MemType, MemtypeMap};

/// One operation on the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `insert(start, len, mem_type, device)`.
    Insert {
        /// Start address.
        start: usize,
        /// Length.
        len: usize,
        /// Type.
        mem_type: MemType,
        /// Device.
        device: i32,
    },
    /// `insert_marked(start, len, mem_type, device, true)`.
    InsertMarked {
        /// Start address.
        start: usize,
        /// Length.
        len: usize,
        /// Type.
        mem_type: MemType,
        /// Device.
        device: i32,
    },
    /// `remove(start, len)`.
    Remove {
        /// Start address.
        start: usize,
        /// Length.
        len: usize,
    },
    /// `take_marked(start)`: forget the entry starting at `start`,
    /// returning it and its mark.
    Take {
        /// Start address.
        start: usize,
    },
    /// `lookup(addr, len)`.
    Lookup {
        /// Address.
        addr: usize,
        /// Length.
        len: usize,
    },
}

/// An entry of the model: end, type, device, mark.
type Entry = (usize, MemType, i32, bool);

/// The obviously-correct model: entries keyed by start, with the same
/// capacity rules as the real map.
#[derive(Debug)]
pub struct Model {
    capacity: usize,
    entries: BTreeMap<usize, Entry>,
    hull: Option<(usize, usize)>,
    /// Ranges dropped because the model was full.
    pub dropped: u64,
}

fn end_of(start: usize, len: usize) -> Result<usize, MapError> {
    if len == 0 {
        return Err(MapError::EmptyRange { start });
    }
    start.checked_add(len).ok_or(MapError::WrapsAround { start, len })
}

impl Model {
    /// An empty model of a map with `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Model {
            capacity,
            entries: BTreeMap::new(),
            hull: None,
            dropped: 0,
        }
    }

    fn drop_range(&mut self, start: usize, end: usize) {
        self.dropped += 1;
        self.hull = Some(match self.hull {
            Some((lo, hi)) => (lo.min(start), hi.max(end)),
            None => (start, end),
        });
    }

    fn overlapping(&self, start: usize, end: usize) -> Vec<(usize, Entry)> {
        self.entries
            .iter()
            .filter(|(s, (e, ..))| **s < end && start < *e)
            .map(|(s, entry)| (*s, *entry))
            .collect()
    }

    /// Removes `[start, start + len)`.
    pub fn remove(&mut self, start: usize, len: usize) -> Result<(), MapError> {
        let end = end_of(start, len)?;
        for (s, (e, t, d, m)) in self.overlapping(start, end) {
            self.entries.remove(&s);
            if s < start {
                self.entries.insert(s, (start, t, d, m));
            }
            if e > end {
                if s < start && self.entries.len() == self.capacity {
                    // A split the full map has no slot for.
                    self.drop_range(end, e);
                } else {
                    self.entries.insert(end, (e, t, d, m));
                }
            }
        }
        Ok(())
    }

    /// Inserts, replacing what it overlaps; `mark` stays with it.
    pub fn insert(
        &mut self,
        start: usize,
        len: usize,
        mem_type: MemType,
        device: i32,
        mark: bool,
    ) -> Result<Inserted, MapError> {
        let end = end_of(start, len)?;
        self.remove(start, len)?;
        if self.entries.len() == self.capacity {
            self.drop_range(start, end);
            return Ok(Inserted::Dropped);
        }
        self.entries.insert(start, (end, mem_type, device, mark));
        Ok(Inserted::Stored)
    }

    /// Forgets the entry that starts at `start`, returning it and its mark.
    pub fn take(&mut self, start: usize) -> Option<(MemInfo, bool)> {
        let (end, mem_type, device, mark) = self.entries.remove(&start)?;
        let info = MemInfo {
            mem_type,
            device,
            base: start,
            len: end - start,
        };
        Some((info, mark))
    }

    /// What the map must answer.
    pub fn lookup(&self, addr: usize, len: usize) -> Lookup {
        let Some(end) = addr.checked_add(len.max(1)) else {
            return Lookup::Unknown;
        };
        let hits = self.overlapping(addr, end);
        match hits.as_slice() {
            [(s, (e, t, d, _))] if *s <= addr && end <= *e => Lookup::Found(MemInfo {
                mem_type: *t,
                device: *d,
                base: *s,
                len: e - s,
            }),
            [] => match self.hull {
                Some((lo, hi)) if lo < end && addr < hi => Lookup::Unknown,
                _ => Lookup::Absent,
            },
            _ => Lookup::Unknown,
        }
    }

    /// Entries in address order.
    pub fn entries(&self) -> Vec<MemInfo> {
        self.entries
            .iter()
            .map(|(s, (e, t, d, _))| MemInfo {
                mem_type: *t,
                device: *d,
                base: *s,
                len: e - s,
            })
            .collect()
    }
}

/// Runs `ops` against a fresh `MemtypeMap<N>` and the model, panicking with
/// the step on the first difference.
pub fn check_ops<const N: usize>(map: &MemtypeMap<N>, ops: &[Op]) {
    map.clear();
    let mut model = Model::new(N);
    let dropped_before = map.dropped();
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Insert {
                start,
                len,
                mem_type,
                device,
            } => {
                let got = map.insert(start, len, mem_type, device);
                let want = model.insert(start, len, mem_type, device, false);
                assert_eq!(got, want, "step {step}: {op:?}");
            }
            Op::InsertMarked {
                start,
                len,
                mem_type,
                device,
            } => {
                let got = map.insert_marked(start, len, mem_type, device, true);
                let want = model.insert(start, len, mem_type, device, true);
                assert_eq!(got, want, "step {step}: {op:?}");
            }
            Op::Remove { start, len } => {
                assert_eq!(map.remove(start, len), model.remove(start, len), "step {step}: {op:?}");
            }
            Op::Take { start } => {
                assert_eq!(map.take_marked(start), model.take(start), "step {step}: {op:?}");
            }
            Op::Lookup { addr, len } => {
                assert_eq!(map.lookup(addr, len), model.lookup(addr, len), "step {step}: {op:?}");
            }
        }
        let mut entries = Vec::new();
        map.for_each(|i| entries.push(i));
        assert_eq!(entries, model.entries(), "step {step}: {op:?}: entries differ");
        assert_eq!(map.len(), entries.len());
    }
    assert_eq!(map.dropped() - dropped_before, model.dropped);
}

const TYPES: [MemType; 5] = [
    MemType::Host,
    MemType::Cuda,
    MemType::CudaManaged,
    MemType::CudaHost,
    MemType::Unknown,
];

/// Addresses: mostly a small window (so ranges overlap and touch), sometimes
/// the top of the address space (wrap-around).
fn address(b: u8) -> usize {
    match b {
        0..=215 => 0x1000 + (b as usize) * 0x100,
        // A second cluster far away (as pinned host memory lies far from
        // device memory), so that the map's bucket table gets segments.
        216..=247 => 0x7f00_0000_0000 + (b as usize - 216) * 0x1_0000,
        _ => usize::MAX - (255 - b as usize) * 0x80,
    }
}

fn length(b: u8) -> usize {
    match b {
        0 => 0,
        1..=250 => (b as usize) * 0x40,
        _ => usize::MAX / 2 + b as usize,
    }
}

/// Decodes fuzz input into operations: 4 bytes each.
pub fn ops_from_bytes(data: &[u8]) -> Vec<Op> {
    data.chunks_exact(4)
        .map(|c| match c[0] % 4 {
            0 | 1 if c[0] & 4 != 0 => Op::InsertMarked {
                start: address(c[1]),
                len: length(c[2]),
                mem_type: TYPES[(c[3] % 5) as usize],
                device: (c[3] / 5) as i32 % 3 - 1,
            },
            0 | 1 => Op::Insert {
                start: address(c[1]),
                len: length(c[2]),
                mem_type: TYPES[(c[3] % 5) as usize],
                device: (c[3] / 5) as i32 % 3 - 1,
            },
            2 => Op::Remove {
                start: address(c[1]),
                len: length(c[2]),
            },
            _ => Op::Lookup {
                addr: address(c[1]),
                len: length(c[2]) / 4,
            },
        })
        .collect()
}

/// The fuzz target's body: decode, then compare with the model on a small
/// map (so that "full" is reached) and a larger one.
pub fn fuzz_memtype(data: &[u8]) {
    static SMALL: MemtypeMap<8> = MemtypeMap::new();
    static LARGE: MemtypeMap<256> = MemtypeMap::new();
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _serial = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let ops = ops_from_bytes(data);
    check_ops(&SMALL, &ops);
    check_ops(&LARGE, &ops);
}

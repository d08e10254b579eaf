//! The `elf` fuzz target's body: arbitrary bytes as an object in memory,
//! walked as memhook's reloc walks a loaded object. The first four bytes
//! place the dynamic section (offset, size); the rest is the object. The
//! walk must end in a result or an ElfError, never a panic or a read outside
//! the bytes (SliceMemory refuses those), and its relocations must be those
//! an entry-by-entry reading of the tables gives, ending where that ends.

use core::ops::ControlFlow;

use memhook_core::elf::{
    DEFINES_SCAN_LIMIT, Dynamic, Reloc, SliceMemory, defines, for_each_named_reloc, for_each_reloc,
    for_each_reloc_by_index, for_each_symbol_reloc, read_dynamic, search_paths, symbol_name, symbol_prefix,
};

/// An ELF64 RELA entry's size.
const SIZEOF_RELA: usize = 24;

/// Where the fuzzed object is placed.
pub const BASE: usize = 0x40_0000;

/// Walks `data` (see the module docs); returns the relocations whose symbol
/// names resolved.
pub fn fuzz_elf(data: &[u8]) -> usize {
    if data.len() < 4 {
        return 0;
    }
    let offset = u16::from_le_bytes([data[0], data[1]]) as usize;
    let size = u16::from_le_bytes([data[2], data[3]]) as usize;
    let mem = SliceMemory {
        base: BASE,
        bytes: &data[4..],
    };
    // The search-path tags (what memhook's dlopen asks of the caller's
    // object): a result or an error, whatever the bytes.
    let _ = search_paths(&mem, BASE + offset, size);
    let Ok(d) = read_dynamic(&mem, BASE, BASE + offset, size) else {
        return 0;
    };
    let mut named = 0;
    let mut walked = Vec::new();
    let result = for_each_reloc(&mem, BASE, &d, |r| {
        let _ = symbol_prefix(&mem, &d, r.sym);
        let mut buf = [0u8; 256];
        if symbol_name(&mem, &d, r.sym, &mut buf).is_ok() {
            named += 1;
        }
        walked.push(r);
        if walked.len() >= WALK_LIMIT {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    // Whether the object defines a name (reloc's question before a dlsym):
    // an answer or "cannot say", whatever the bytes; a definition found
    // through the hash table is one that reading the symbols in turn finds.
    for name in [&b"mmap"[..], b"cuMemAlloc_v2", b"f0", b""] {
        let hashed = defines(&mem, &d, name);
        let in_turn = defines(&mem, &Dynamic { gnu_hash: None, ..d }, name);
        if hashed == Some(true) && d.nsyms.is_some_and(|n| n <= DEFINES_SCAN_LIMIT) {
            assert_ne!(in_turn, Some(false), "{:?}", core::str::from_utf8(name));
        }
    }
    // The walk reads many entries at once: it must give what reading them
    // one by one gives, and fail where that fails.
    let (want, complete) = one_by_one(mem.bytes, &d);
    assert_eq!(walked, want, "relocations differ from an entry-by-entry walk");
    assert_eq!(result.is_ok(), complete, "{result:?}");
    // The walk that reads symbols ahead gives what reading them in turn
    // gives (reloc's walk: the GOT slots' types, x86_64 and aarch64).
    let types = [6, 7, 1025, 1026];
    let in_turn: Vec<(Reloc, [u8; 2])> = walked
        .iter()
        .filter(|r| r.sym != 0 && types.contains(&r.r_type))
        .filter_map(|&r| Some((r, symbol_prefix(&mem, &d, r.sym).ok()?)))
        .collect();
    let mut ahead = Vec::new();
    let result_ahead = for_each_symbol_reloc(&mem, BASE, &d, &types, |r, prefix| {
        ahead.push((r, prefix));
        if ahead.len() >= in_turn.len() && walked.len() >= WALK_LIMIT {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    assert_eq!(ahead, in_turn, "relocations read ahead differ from those read in turn");
    if walked.len() < WALK_LIMIT {
        assert_eq!(result_ahead, result);
    }
    // reloc's walk hands on only relocations of those types whose symbols
    // bear the name it says, whatever the hash table claims (the walk by
    // symbol index, taken whatever the object's size, and the walk that
    // chooses); with the table out of use it finds every one.
    let names: [&[u8]; 4] = [b"mmap", b"cuMemAlloc_v2", b"m", b""];
    let bearing = |d: &Dynamic, by_index: bool| {
        let mut out = Vec::new();
        let visit = |r: Reloc, p: usize| {
            let mut buf = [0u8; 256];
            assert!(types.contains(&r.r_type), "{r:?}");
            assert_eq!(symbol_name(&mem, d, r.sym, &mut buf).ok(), Some(names[p]), "{r:?}");
            out.push((r, p));
            if out.len() >= WALK_LIMIT {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        if by_index {
            let _ = for_each_reloc_by_index(&mem, BASE, d, &types, &names, visit);
        } else {
            let _ = for_each_named_reloc(&mem, BASE, d, &types, &names, visit);
        }
        out
    };
    let _ = bearing(&d, true);
    let _ = bearing(&d, false);
    if walked.len() < WALK_LIMIT {
        let want: Vec<(Reloc, usize)> = in_turn
            .iter()
            .filter_map(|&(r, _)| {
                let mut buf = [0u8; 256];
                let name = symbol_name(&mem, &d, r.sym, &mut buf).ok()?;
                Some((r, names.iter().position(|n| *n == name)?))
            })
            .collect();
        assert_eq!(bearing(&Dynamic { gnu_hash: None, ..d }, false), want);
    }
    named
}

/// Most relocations a fuzzed walk takes.
const WALK_LIMIT: usize = 100_000;

/// The relocations of `d`'s tables read an entry at a time straight from
/// `bytes` (up to [`WALK_LIMIT`]), and whether the walk ended without an
/// unreadable entry.
fn one_by_one(bytes: &[u8], d: &Dynamic) -> (Vec<Reloc>, bool) {
    let mut out = Vec::new();
    let tables = [d.jmprel.map(|t| (t, 0)), d.rela.map(|t| (t, d.relacount))];
    for ((start, size), skip) in tables.into_iter().flatten() {
        let count = size / SIZEOF_RELA;
        for i in skip.min(count)..count {
            if out.len() >= WALK_LIMIT {
                return (out, true);
            }
            let entry = start
                .checked_add(i * SIZEOF_RELA)
                .and_then(|at| at.checked_sub(BASE))
                .and_then(|off| bytes.get(off..off.checked_add(SIZEOF_RELA)?));
            let Some(entry) = entry else {
                return (out, false);
            };
            let word = |k: usize| u64::from_le_bytes(entry[k..k + 8].try_into().expect("8 bytes"));
            out.push(Reloc {
                slot: BASE.wrapping_add(word(0) as usize),
                r_type: word(8) as u32,
                sym: (word(8) >> 32) as u32,
                addend: word(16) as i64,
            });
        }
    }
    (out, true)
}

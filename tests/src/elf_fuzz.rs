//! The `elf` fuzz target's body: arbitrary bytes as an object in memory,
//! walked as memhook's reloc walks a loaded object. The first four bytes
//! place the dynamic section (offset, size); the rest is the object. The
//! walk must end in a result or an ElfError, never a panic or a read outside
//! the bytes (SliceMemory refuses those).

use core::ops::ControlFlow;

use memhook_core::elf::{SliceMemory, for_each_reloc, read_dynamic, search_paths, symbol_name, symbol_prefix};

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
    let mut walked = 0;
    let _ = for_each_reloc(&mem, BASE, &d, |r| {
        let _ = symbol_prefix(&mem, &d, r.sym);
        let mut buf = [0u8; 256];
        if symbol_name(&mem, &d, r.sym, &mut buf).is_ok() {
            named += 1;
        }
        walked += 1;
        if walked > 100_000 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    named
}

//! Bounded, allocation-free walking of an ELF object in memory: its dynamic
//! section, relocation tables and dynamic symbols, as reloc hooking needs
//! them.
//!
//! Memory is read through [`Memory`], which refuses any range outside the
//! object, so a malformed object is an [`ElfError`] naming the table and the
//! value, never a wild read. Every walk stops at its table's size: the
//! dynamic section at its segment's size (not only at `DT_NULL`), the
//! relocation tables at `DT_PLTRELSZ`/`DT_RELASZ`, symbols at the count that
//! `DT_GNU_HASH` (or `DT_HASH`) implies, names at `DT_STRSZ`.
//!
//! ```
//! use memhook_core::elf::{ElfError, Memory, SliceMemory, read_dynamic};
//!
//! // A dynamic section of one entry, DT_NULL, at address 0x1000.
//! let bytes = [0u8; 16];
//! let mem = SliceMemory { base: 0x1000, bytes: &bytes };
//! let d = read_dynamic(&mem, 0x1000, 0x1000, 16).unwrap();
//! assert_eq!(d.jmprel, None);
//! // Past the end of the object: an error, not a read.
//! assert!(read_dynamic(&mem, 0x1000, 0x1008, 16).is_err());
//! ```

use core::fmt;
use core::ops::ControlFlow;

use goblin::elf::dynamic::{
    DT_GNU_HASH, DT_HASH, DT_JMPREL, DT_NULL, DT_PLTREL, DT_PLTRELSZ, DT_RELA, DT_RELACOUNT, DT_RELAENT, DT_RELASZ,
    DT_RPATH, DT_RUNPATH, DT_STRSZ, DT_STRTAB, DT_SYMENT, DT_SYMTAB,
};
use goblin::elf64::dynamic::SIZEOF_DYN;
use goblin::elf64::reloc::SIZEOF_RELA;
use goblin::elf64::sym::SIZEOF_SYM;

/// A malformed or unsupported object: what was wrong and the value involved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElfError {
    /// What was wrong, naming the table or tag.
    pub what: &'static str,
    /// The offending value (an address, index, size or tag).
    pub value: u64,
}

impl ElfError {
    /// An error about `what`, with `value`.
    pub const fn new(what: &'static str, value: u64) -> Self {
        ElfError { what, value }
    }
}

impl fmt::Display for ElfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed ELF object: {} ({:#x})", self.what, self.value)
    }
}

impl core::error::Error for ElfError {}

/// Read access to an object's memory.
pub trait Memory {
    /// Fills `buf` from `addr`.
    ///
    /// # Errors
    ///
    /// When any byte of the range is outside the object.
    fn read(&self, addr: usize, buf: &mut [u8]) -> Result<(), ElfError>;

    /// A hint that `addr` is about to be read: memory in this process can
    /// ask the cache for it. Changes nothing any read returns; the default
    /// does nothing.
    fn prefetch(&self, addr: usize) {
        let _ = addr;
    }
}

/// [`Memory`] over a byte slice placed at `base` (tests, fuzzing).
#[derive(Clone, Copy, Debug)]
pub struct SliceMemory<'a> {
    /// Address of `bytes[0]`.
    pub base: usize,
    /// The object's bytes.
    pub bytes: &'a [u8],
}

impl Memory for SliceMemory<'_> {
    fn read(&self, addr: usize, buf: &mut [u8]) -> Result<(), ElfError> {
        let start = addr
            .checked_sub(self.base)
            .ok_or(ElfError::new("read below the object", addr as u64))?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| self.bytes.get(start..end))
            .ok_or(ElfError::new("read past the object", addr as u64))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

/// `base + offset`, or an error naming `what` when it overflows (a
/// malformed pointer near the top of the address space).
fn addr(base: usize, offset: usize, what: &'static str) -> Result<usize, ElfError> {
    base.checked_add(offset).ok_or(ElfError::new(what, base as u64))
}

fn read_u32<M: Memory>(mem: &M, addr: usize) -> Result<u32, ElfError> {
    let mut b = [0u8; 4];
    mem.read(addr, &mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64<M: Memory>(mem: &M, addr: usize) -> Result<u64, ElfError> {
    let mut b = [0u8; 8];
    mem.read(addr, &mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// What the dynamic section says (addresses are absolute).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dynamic {
    /// `DT_SYMTAB`.
    pub symtab: Option<usize>,
    /// `DT_STRTAB`.
    pub strtab: Option<usize>,
    /// `DT_STRSZ`.
    pub strsz: usize,
    /// `DT_JMPREL` with `DT_PLTRELSZ`.
    pub jmprel: Option<(usize, usize)>,
    /// `DT_RELA` with `DT_RELASZ`.
    pub rela: Option<(usize, usize)>,
    /// `DT_RELACOUNT`: how many `R_*_RELATIVE` relocations open the RELA
    /// table (the linker sorts them first), which name no symbol. A C++
    /// library's are most of its relocations (95% of LLVM's).
    pub relacount: usize,
    /// Dynamic symbols, from `DT_GNU_HASH` or `DT_HASH` (`None`: neither,
    /// or a GNU hash table that hashes no symbol and no `DT_HASH`: then
    /// only the object's bounds limit a symbol index).
    pub nsyms: Option<usize>,
    /// The `DT_GNU_HASH` table, where it hashes some symbol and its chains
    /// begin at or past `symoffset` (`None` otherwise: then
    /// [`for_each_named_reloc`] reads every symbol relocation's name).
    pub gnu_hash: Option<GnuHash>,
}

/// Where a `DT_GNU_HASH` table finds the symbols it hashes: those from
/// `symoffset` to the end of the symbol table. The symbols below
/// `symoffset` are in no chain; a linker puts there the ones the object
/// imports (which no lookup in it may find).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GnuHash {
    /// The first hashed symbol.
    pub symoffset: usize,
    /// The bucket count (at least one).
    pub nbuckets: usize,
    /// The buckets' address; the chains follow them.
    pub buckets: usize,
}

impl GnuHash {
    /// One past the last symbol of the chain that begins at symbol
    /// `start` (at least `symoffset`).
    ///
    /// # Errors
    ///
    /// An unreadable chain entry, or a chain longer than [`MAX_SYMBOLS`].
    fn chain_end<M: Memory>(&self, mem: &M, start: usize) -> Result<usize, ElfError> {
        let chains = addr(self.buckets, self.nbuckets * 4, "DT_GNU_HASH chains")?;
        let mut index = start;
        loop {
            if index - self.symoffset > MAX_SYMBOLS {
                return Err(ElfError::new("DT_GNU_HASH chain does not end", index as u64));
            }
            let h = read_u32(mem, addr(chains, (index - self.symoffset) * 4, "DT_GNU_HASH chains")?)?;
            index += 1;
            if h & 1 == 1 {
                return Ok(index);
            }
        }
    }
}

/// Most `DT_GNU_HASH` chain entries followed to count symbols.
const MAX_SYMBOLS: usize = 1 << 24;

/// How many of the last buckets [`gnu_hash_symbols`] reads, at most, for
/// the last one in use before it reads them all.
const LAST_BUCKETS: usize = 1024;

/// The end of the chains from the last bucket in use, where that can only
/// be the end of every chain: `(symbol count, true)`, or `(0, false)`
/// where the table must be read whole.
///
/// A linker lays the hashed symbols out bucket by bucket, so the last
/// bucket in use (found from the end of the buckets, a few reads) heads
/// the last chain, and one past its end is the symbol count. What that
/// assumes is checked, not trusted: the end found must be where another
/// of the object's tables begins (`follows`: its symbol table, string
/// table or SysV hash table; ld puts `.dynsym` after `.gnu.hash`, lld
/// `.hash` or `.dynstr`), or four zero bytes before one (padding; the
/// last chain entry ends a chain, so it is never zero). A chain found
/// there cannot end earlier than the longest one (ours is one of them)
/// nor later (it would run into that table), so it is the longest.
fn last_chain_end<M: Memory>(mem: &M, h: &GnuHash, follows: &[usize]) -> Result<(usize, bool), ElfError> {
    let mut chunk = [0u8; 1024];
    let per_read = chunk.len() / 4;
    let mut end = h.nbuckets;
    let mut start = 0;
    while start == 0 && end > h.nbuckets.saturating_sub(LAST_BUCKETS) {
        let n = end.min(per_read);
        let bytes = &mut chunk[..n * 4];
        mem.read(addr(h.buckets, (end - n) * 4, "DT_GNU_HASH buckets")?, bytes)?;
        start = bytes
            .chunks_exact(4)
            .rev()
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .find(|&v| v != 0)
            .unwrap_or(0);
        end -= n;
    }
    if start < h.symoffset || start == 0 {
        return Ok((0, false));
    }
    let index = h.chain_end(mem, start)?;
    let at = addr(h.buckets, (h.nbuckets + index - h.symoffset) * 4, "DT_GNU_HASH chains")?;
    let ends = follows.contains(&at)
        || (at.checked_add(4).is_some_and(|pad| follows.contains(&pad)) && read_u32(mem, at).ok() == Some(0));
    Ok(if ends { (index, true) } else { (0, false) })
}

/// The object's symbol count from its GNU hash table: one past the highest
/// symbol any bucket's chain reaches, with the table's shape where its
/// chains begin at or past `symoffset`. `None` when it hashes no symbol:
/// its `symoffset` is then no count (ld.bfd writes 1 in a program that
/// exports nothing, whatever it imports). Where the last chain plainly
/// ends the table (see [`last_chain_end`]), that is all it reads; else
/// every bucket (a large library has tens of thousands: most of the
/// tables' pages an install would read, and in a process of large
/// libraries a third of a pass over them).
fn gnu_hash_symbols<M: Memory>(
    mem: &M,
    table: usize,
    follows: &[usize],
) -> Result<Option<(usize, Option<GnuHash>)>, ElfError> {
    let nbuckets = read_u32(mem, table)? as usize;
    let symoffset = read_u32(mem, addr(table, 4, "DT_GNU_HASH address")?)? as usize;
    let bloom = read_u32(mem, addr(table, 8, "DT_GNU_HASH address")?)? as usize;
    if nbuckets > MAX_SYMBOLS || bloom > MAX_SYMBOLS {
        return Err(ElfError::new("DT_GNU_HASH table too large", nbuckets.max(bloom) as u64));
    }
    let buckets = addr(table, 16 + bloom * 8, "DT_GNU_HASH buckets")?;
    let shape = GnuHash {
        symoffset,
        nbuckets,
        buckets,
    };
    if let Ok((count, true)) = last_chain_end(mem, &shape, follows) {
        return Ok(Some((count, Some(shape))));
    }
    let mut last = 0usize;
    let mut chunk = [0u8; 1024];
    // Every bucket is read (the walk never breaks).
    let _ = for_each_entry::<_, 4>(mem, buckets, 0..nbuckets, &mut chunk, "DT_GNU_HASH buckets", |b| {
        last = last.max(u32::from_le_bytes(*b) as usize);
        ControlFlow::Continue(())
    })?;
    if last == 0 {
        return Ok(None);
    }
    if last < symoffset {
        return Ok(Some((symoffset, None)));
    }
    Ok(Some((shape.chain_end(mem, last)?, Some(shape))))
}

/// Reads the dynamic section at `dynamic` (`size` bytes, the PT_DYNAMIC
/// segment's size) of an object loaded at `base`. Pointers smaller than
/// `base` are taken as relative (the vDSO's, or a loader that leaves the
/// section unrelocated); others as already relocated (glibc).
///
/// # Errors
///
/// An [`ElfError`] for an unreadable entry, a table size that is not a
/// multiple of its entry size, REL (not RELA) relocations, or a symbol table
/// without a string table.
pub fn read_dynamic<M: Memory>(mem: &M, base: usize, dynamic: usize, size: usize) -> Result<Dynamic, ElfError> {
    let fix = |v: u64| -> Result<usize, ElfError> {
        let v = v as usize;
        if v < base {
            base.checked_add(v)
                .ok_or(ElfError::new("dynamic pointer overflows", v as u64))
        } else {
            Ok(v)
        }
    };
    let mut d = Dynamic::default();
    let (mut jmprel, mut pltrelsz, mut rela, mut relasz) = (None, None, None, None);
    let (mut gnu_hash, mut hash) = (None, None);
    for i in 0..size / SIZEOF_DYN {
        let at = addr(dynamic, i * SIZEOF_DYN, "PT_DYNAMIC address")?;
        let tag = read_u64(mem, at)?;
        let val = read_u64(mem, addr(at, 8, "PT_DYNAMIC address")?)?;
        match tag {
            DT_NULL => break,
            DT_SYMTAB => d.symtab = Some(fix(val)?),
            DT_STRTAB => d.strtab = Some(fix(val)?),
            DT_STRSZ => d.strsz = val as usize,
            DT_JMPREL => jmprel = Some(fix(val)?),
            DT_PLTRELSZ => pltrelsz = Some(val as usize),
            DT_RELA => rela = Some(fix(val)?),
            DT_RELASZ => relasz = Some(val as usize),
            DT_GNU_HASH => gnu_hash = Some(fix(val)?),
            DT_HASH => hash = Some(fix(val)?),
            DT_RELACOUNT => d.relacount = val as usize,
            DT_PLTREL if val != DT_RELA => return Err(ElfError::new("DT_PLTREL is not DT_RELA", val)),
            DT_RELAENT if val as usize != SIZEOF_RELA => return Err(ElfError::new("DT_RELAENT", val)),
            DT_SYMENT if val as usize != SIZEOF_SYM => return Err(ElfError::new("DT_SYMENT", val)),
            _ => {}
        }
    }
    let table = |start: Option<usize>, len: Option<usize>, name: &'static str| match (start, len) {
        (Some(s), Some(n)) if n % SIZEOF_RELA == 0 => Ok(Some((s, n))),
        (Some(_), Some(n)) => Err(ElfError::new(name, n as u64)),
        (Some(s), None) => Err(ElfError::new(name, s as u64)),
        (None, _) => Ok(None),
    };
    d.jmprel = table(jmprel, pltrelsz, "DT_JMPREL without a valid DT_PLTRELSZ")?;
    d.rela = table(rela, relasz, "DT_RELA without a valid DT_RELASZ")?;
    if d.symtab.is_some() && d.strtab.is_none() {
        return Err(ElfError::new("DT_SYMTAB without DT_STRTAB", 0));
    }
    let from_gnu = match gnu_hash {
        Some(t) => {
            let follows: heapless::Vec<usize, 3> = [d.symtab, d.strtab, hash].into_iter().flatten().collect();
            gnu_hash_symbols(mem, t, &follows)?
        }
        None => None,
    };
    d.nsyms = match (from_gnu, hash) {
        (Some((n, shape)), _) => {
            d.gnu_hash = shape;
            Some(n)
        }
        (None, Some(t)) => Some(read_u32(mem, addr(t, 4, "DT_HASH address")?)? as usize),
        (None, None) => None,
    };
    Ok(d)
}

/// Which library search paths an object's dynamic section names: what
/// decides where a `dlopen` from inside the object looks (see
/// [`search_paths`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SearchPaths {
    /// `DT_RPATH` (the old form, searched for the object's own loads and,
    /// where they have no `DT_RUNPATH`, for those of every object loaded
    /// on its behalf).
    pub rpath: bool,
    /// `DT_RUNPATH` (searched for the object's own loads only).
    pub runpath: bool,
}

/// Whether the dynamic section at `dynamic` (`size` bytes) names a
/// `DT_RPATH` or a `DT_RUNPATH`. Reads the tags only, up to `DT_NULL` or
/// the section's size.
///
/// # Errors
///
/// An [`ElfError`] for an entry outside the object.
pub fn search_paths<M: Memory>(mem: &M, dynamic: usize, size: usize) -> Result<SearchPaths, ElfError> {
    let mut paths = SearchPaths::default();
    for i in 0..size / SIZEOF_DYN {
        match read_u64(mem, addr(dynamic, i * SIZEOF_DYN, "PT_DYNAMIC address")?)? {
            DT_NULL => break,
            DT_RPATH => paths.rpath = true,
            DT_RUNPATH => paths.runpath = true,
            _ => {}
        }
    }
    Ok(paths)
}

/// Where symbol `index`'s name starts: the string table and the offset.
fn name_offset<M: Memory>(mem: &M, d: &Dynamic, index: u32) -> Result<(usize, usize), ElfError> {
    let (Some(symtab), Some(strtab)) = (d.symtab, d.strtab) else {
        return Err(ElfError::new("symbol without DT_SYMTAB/DT_STRTAB", index as u64));
    };
    if let Some(n) = d.nsyms
        && index as usize >= n
    {
        return Err(ElfError::new("symbol index past the symbol table", index as u64));
    }
    let st_name = read_u32(mem, addr(symtab, index as usize * SIZEOF_SYM, "DT_SYMTAB address")?)? as usize;
    if st_name >= d.strsz {
        return Err(ElfError::new("st_name past DT_STRSZ", st_name as u64));
    }
    Ok((strtab, st_name))
}

/// The first two bytes of symbol `index`'s name (0 past its end): a cheap
/// first look, before [`symbol_name`], for a walk that wants a few names
/// among many (a C++ library's imports mostly begin with `_Z`).
///
/// # Errors
///
/// As for [`symbol_name`], bar the name's length.
pub fn symbol_prefix<M: Memory>(mem: &M, d: &Dynamic, index: u32) -> Result<[u8; 2], ElfError> {
    let (strtab, st_name) = name_offset(mem, d, index)?;
    let mut prefix = [0u8; 2];
    let n = prefix.len().min(d.strsz - st_name);
    mem.read(addr(strtab, st_name, "DT_STRTAB address")?, &mut prefix[..n])?;
    if prefix[0] == 0 {
        prefix[1] = 0;
    }
    Ok(prefix)
}

/// `STT_FUNC`: a symbol that is a function (`STT_GNU_IFUNC`, 10, names a
/// resolver that returns one).
const STT_FUNC: u8 = 2;

/// Most names [`find_functions`] looks up in one pass.
pub const MAX_LOOKUPS: usize = 64;

/// Finds, in one pass over the dynamic symbol table, the functions
/// `names` the object defines: `found[i]` gets the `st_value` of
/// `names[i]` (relative to the load bias in a shared object). It stays
/// `None` where the object defines no plain function of that name: no
/// definition, or one that is not `STT_FUNC` (an indirect function's value
/// is its resolver), or two (versions) at different values.
///
/// # Errors
///
/// An [`ElfError`] for an object whose symbol count is unknown (no hash
/// table), for more than [`MAX_LOOKUPS`] names or fewer slots in `found`
/// than names, or for an unreadable symbol.
pub fn find_functions<M: Memory>(
    mem: &M,
    d: &Dynamic,
    names: &[&[u8]],
    found: &mut [Option<u64>],
) -> Result<(), ElfError> {
    if names.len() > MAX_LOOKUPS || found.len() < names.len() {
        return Err(ElfError::new("too many names to look up", names.len() as u64));
    }
    let Some(symtab) = d.symtab else {
        return Ok(());
    };
    let Some(count) = d.nsyms else {
        return Err(ElfError::new("no symbol count (no DT_GNU_HASH or DT_HASH)", 0));
    };
    let mut unusable = 0u64;
    let mut buf = [0u8; 64];
    for index in 1..count.min(MAX_SYMBOLS) {
        // st_name (4), st_info, st_other, st_shndx (2), st_value (8).
        let mut sym = [0u8; 16];
        mem.read(addr(symtab, index * SIZEOF_SYM, "DT_SYMTAB address")?, &mut sym)?;
        if u16::from_le_bytes([sym[6], sym[7]]) == 0 {
            continue; // undefined here
        }
        let prefix = symbol_prefix(mem, d, index as u32)?;
        if !names.iter().any(|n| n.len() >= 2 && n[..2] == prefix) {
            continue;
        }
        let Ok(name) = symbol_name(mem, d, index as u32, &mut buf) else {
            continue; // longer than any name looked up
        };
        let Some(i) = names.iter().position(|n| *n == name) else {
            continue;
        };
        let value = u64::from_le_bytes([sym[8], sym[9], sym[10], sym[11], sym[12], sym[13], sym[14], sym[15]]);
        if sym[4] & 0xf != STT_FUNC || found[i].is_some_and(|v| v != value) {
            unusable |= 1 << i;
        }
        found[i] = Some(value);
    }
    for (i, f) in found.iter_mut().enumerate().take(names.len()) {
        if unusable & (1 << i) != 0 {
            *f = None;
        }
    }
    Ok(())
}

/// One RELA relocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reloc {
    /// The slot it writes (load base + `r_offset`).
    pub slot: usize,
    /// `ELF64_R_TYPE`.
    pub r_type: u32,
    /// `ELF64_R_SYM`.
    pub sym: u32,
    /// `r_addend`.
    pub addend: i64,
}

/// Relocations read from the object at once by [`for_each_reloc`]: 1.5
/// KiB of stack. One read a relocation (a bounds check and a call to copy
/// 24 bytes each) took a third of an install's time in a process of large
/// C++ libraries (three libLLVMs: 65,000 relocations past the relative
/// ones).
const RELOCS_PER_READ: usize = 64;

/// Calls `f` with every relocation of the PLT table, then of the RELA
/// table past the `DT_RELACOUNT` relative ones that open it, until it
/// breaks.
///
/// # Errors
///
/// An [`ElfError`] for an unreadable entry, after `f` has had every entry
/// before it.
pub fn for_each_reloc<M: Memory>(
    mem: &M,
    base: usize,
    d: &Dynamic,
    mut f: impl FnMut(Reloc) -> ControlFlow<()>,
) -> Result<(), ElfError> {
    let tables = [d.jmprel.map(|t| (t, 0)), d.rela.map(|t| (t, d.relacount))];
    let mut chunk = [0u8; RELOCS_PER_READ * SIZEOF_RELA];
    for ((start, size), skip) in tables.into_iter().flatten() {
        let count = size / SIZEOF_RELA;
        let walked = for_each_entry::<_, SIZEOF_RELA>(
            mem,
            start,
            skip.min(count)..count,
            &mut chunk,
            "relocation table address",
            |entry| {
                let word = |k: usize| u64::from_le_bytes(entry[k..k + 8].try_into().unwrap_or([0; 8]));
                let (offset, info, addend) = (word(0), word(8), word(16) as i64);
                f(Reloc {
                    slot: base.wrapping_add(offset as usize),
                    r_type: info as u32,
                    sym: (info >> 32) as u32,
                    addend,
                })
            },
        )?;
        if walked.is_break() {
            return Ok(());
        }
    }
    Ok(())
}

/// Calls `f` with entries `range` of the table of `SIZE`-byte entries at
/// `table`, read as many at a time as `chunk` holds (at least one; a read
/// each, with its bounds check and its call to copy, took a third of an
/// install's time in a process of large C++ libraries), until it breaks.
///
/// # Errors
///
/// An [`ElfError`] for the first entry that cannot be read (after `f` has
/// had every one before it), or whose address overflows (naming `what`).
fn for_each_entry<M: Memory, const SIZE: usize>(
    mem: &M,
    table: usize,
    range: core::ops::Range<usize>,
    chunk: &mut [u8],
    what: &'static str,
    mut f: impl FnMut(&[u8; SIZE]) -> ControlFlow<()>,
) -> Result<ControlFlow<()>, ElfError> {
    debug_assert!(chunk.len() >= SIZE, "a chunk holds at least one entry");
    let per_read = (chunk.len() / SIZE).max(1);
    let mut i = range.start;
    while i < range.end {
        let at = i
            .checked_mul(SIZE)
            .and_then(|off| table.checked_add(off))
            .ok_or(ElfError::new(what, table as u64))?;
        let mut n = (range.end - i).min(per_read);
        if mem.read(at, &mut chunk[..n * SIZE]).is_err() {
            // A table that runs out of the object: one entry at a time, so
            // that the error comes at the first unreadable one, as it lies.
            n = 1;
            mem.read(at, &mut chunk[..SIZE])?;
        }
        for entry in chunk[..n * SIZE].chunks_exact(SIZE) {
            if f(entry.try_into().unwrap_or(&[0; SIZE])).is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
        i += n;
    }
    Ok(ControlFlow::Continue(()))
}

/// How far ahead of the relocation it hands on [`for_each_symbol_reloc`]
/// asks for a symbol's entry; its name is asked for half as far ahead,
/// once the entry has come.
const SYMBOLS_AHEAD: usize = 16;

/// Calls `f`, in table order, with every relocation of `for_each_reloc`
/// whose type is one of `types` and whose symbol is not 0, and with the
/// first two bytes of the symbol's name ([`symbol_prefix`]; a relocation
/// whose name cannot be read is passed over), until it breaks.
///
/// It asks for each symbol's entry 16 relocations (`SYMBOLS_AHEAD`) before it
/// reads it, and for its name half as far ahead ([`Memory::prefetch`]): a
/// large library's symbols and names lie all over megabytes, and a walk
/// that read one relocation's after the other's waited for memory twice a
/// relocation (most of an install's time in a process of large C++
/// libraries). What `f` is given is what reading them in turn gives.
///
/// # Errors
///
/// As for [`for_each_reloc`], after `f` has had every relocation before the
/// unreadable entry.
pub fn for_each_symbol_reloc<M: Memory>(
    mem: &M,
    base: usize,
    d: &Dynamic,
    types: &[u32],
    mut f: impl FnMut(Reloc, [u8; 2]) -> ControlFlow<()>,
) -> Result<(), ElfError> {
    let mut ring = [Reloc {
        slot: 0,
        r_type: 0,
        sym: 0,
        addend: 0,
    }; SYMBOLS_AHEAD];
    // Relocations taken into the ring, and handed on.
    let (mut taken, mut done) = (0usize, 0usize);
    let mut broke = false;
    let mut hand_on = |r: Reloc| match symbol_prefix(mem, d, r.sym) {
        Ok(prefix) => f(r, prefix),
        Err(_) => ControlFlow::Continue(()),
    };
    let walked = for_each_reloc(mem, base, d, |r| {
        if r.sym == 0 || !types.contains(&r.r_type) {
            return ControlFlow::Continue(());
        }
        if taken - done == SYMBOLS_AHEAD {
            if hand_on(ring[done % SYMBOLS_AHEAD]).is_break() {
                broke = true;
                return ControlFlow::Break(());
            }
            done += 1;
        }
        if let Some(entry) = d.symtab.and_then(|t| t.checked_add(r.sym as usize * SIZEOF_SYM)) {
            mem.prefetch(entry);
        }
        ring[taken % SYMBOLS_AHEAD] = r;
        taken += 1;
        // The entry asked for half a ring ago has likely come: ask for its
        // name.
        if let Some(mid) = taken.checked_sub(SYMBOLS_AHEAD / 2 + 1)
            && mid >= done
            && let Ok((strtab, st_name)) = name_offset(mem, d, ring[mid % SYMBOLS_AHEAD].sym)
        {
            mem.prefetch(strtab.wrapping_add(st_name));
        }
        ControlFlow::Continue(())
    });
    // What the ring still holds was read before the walk ended, whether
    // it ended well or at an unreadable entry.
    while !broke && done < taken {
        broke = hand_on(ring[done % SYMBOLS_AHEAD]).is_break();
        done += 1;
    }
    walked
}

/// Most names [`for_each_named_reloc`] looks for, and most symbols bearing
/// them it keeps; past either it reads every symbol relocation's name.
pub const MAX_NAMED: usize = 128;

/// The first two bytes of `name` as [`symbol_prefix`] reads them from a
/// string table (0 past the end).
fn prefix_of(name: &[u8]) -> [u8; 2] {
    let first = name.first().copied().unwrap_or(0);
    let second = if first == 0 {
        0
    } else {
        name.get(1).copied().unwrap_or(0)
    };
    [first, second]
}

/// A 1,024-bit filter over the names' two-byte prefixes (a few bits set
/// for a few names: most other prefixes miss it), asked before a name is
/// compared with each.
struct PrefixFilter([u64; 16]);

impl PrefixFilter {
    fn bit(p: [u8; 2]) -> usize {
        ((usize::from(p[0]) << 3) ^ usize::from(p[1])) & 1023
    }

    fn of(names: &[&[u8]]) -> Self {
        let mut bits = [0u64; 16];
        for name in names {
            let bit = Self::bit(prefix_of(name));
            bits[bit >> 6] |= 1 << (bit & 63);
        }
        PrefixFilter(bits)
    }

    fn passes(&self, prefix: [u8; 2]) -> bool {
        let bit = Self::bit(prefix);
        self.0[bit >> 6] & 1 << (bit & 63) != 0
    }
}

/// The position in `names` of symbol `index`'s name (`None`: none of
/// them, or the name cannot be read). Callers ask a [`PrefixFilter`] or
/// a hash first.
fn named<M: Memory>(mem: &M, d: &Dynamic, index: u32, names: &[&[u8]]) -> Option<usize> {
    let mut buf = [0u8; 256];
    let name = symbol_name(mem, d, index, &mut buf).ok()?;
    names.iter().position(|n| *n == name)
}

/// Where an object hashes at most this many symbols per name looked for,
/// [`for_each_named_reloc`] reads all their hashes in one pass rather than
/// each name's bucket and chain (a small library defines a few symbols:
/// one short read, not a read or three per name).
const HASHED_SCAN_PER_NAME: usize = 4;

/// [`for_each_named_reloc`] finds the symbols first where the object has
/// more than this many relocations per import and name looked for.
const INDEX_FROM: usize = 4;

/// The GNU hash of `name` (`dl_new_hash`).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter()
        .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(u32::from(c)))
}

/// The dynamic symbols named one of `names`, as `(index, position in
/// names)` in `out`, and how many: every symbol below the GNU hash table's
/// `symoffset` (the imports) read in one pass, by its name's first two
/// bytes first; each name then looked up in the table, whose chains hold
/// every symbol from `symoffset` on. `None` where the object's tables
/// cannot say (no usable GNU hash table, more names or symbols than
/// [`MAX_NAMED`], a chain that leaves the table) or a symbol below
/// `symoffset` cannot be read: the caller then reads every relocation's
/// name.
fn symbols_named<M: Memory>(mem: &M, d: &Dynamic, names: &[&[u8]], out: &mut [(u32, u16); MAX_NAMED]) -> Option<usize> {
    let (Some(h), Some(symtab), Some(nsyms)) = (d.gnu_hash, d.symtab, d.nsyms) else {
        return None;
    };
    if names.len() > MAX_NAMED || h.nbuckets == 0 || h.symoffset > nsyms {
        return None;
    }
    let filter = PrefixFilter::of(names);
    let mut n = 0;
    let mut push = |index: usize, position: usize| -> bool {
        let Some(entry) = out.get_mut(n) else {
            return false;
        };
        *entry = (index as u32, position as u16);
        n += 1;
        true
    };
    // The imports: each one's name, in table order. (Asking for names a
    // few entries ahead changed nothing measurable, warm or in a first
    // install: a linker writes the imports' names in about their order.)
    let strtab = d.strtab?;
    let mut chunk = [0u8; 64 * SIZEOF_SYM];
    let st_name = |chunk: &[u8], j: usize| {
        let at = j * SIZEOF_SYM;
        u32::from_le_bytes([chunk[at], chunk[at + 1], chunk[at + 2], chunk[at + 3]]) as usize
    };
    let mut index = 1;
    while index < h.symoffset {
        let k = (h.symoffset - index).min(chunk.len() / SIZEOF_SYM);
        let chunk = &mut chunk[..k * SIZEOF_SYM];
        mem.read(symtab.checked_add(index * SIZEOF_SYM)?, chunk).ok()?;
        for j in 0..k {
            let name_at = st_name(chunk, j);
            if name_at >= d.strsz {
                return None;
            }
            let mut prefix = [0u8; 2];
            let len = prefix.len().min(d.strsz - name_at);
            mem.read(strtab.checked_add(name_at)?, &mut prefix[..len]).ok()?;
            let prefix = prefix_of(&prefix);
            if filter.passes(prefix)
                && let Some(position) = named(mem, d, (index + j) as u32, names)
                && !push(index + j, position)
            {
                return None;
            }
        }
        index += k;
    }
    // The hashed symbols (definitions, which the object's own relocations
    // may name too): where they are few, one pass over their hashes in
    // the chains; else each name's chain.
    let chains = h.buckets.checked_add(h.nbuckets * 4)?;
    let mut hashes = [0u32; MAX_NAMED];
    for (hash, name) in hashes.iter_mut().zip(names) {
        *hash = gnu_hash(name);
    }
    let hashes = &hashes[..names.len()];
    if nsyms - h.symoffset <= HASHED_SCAN_PER_NAME * names.len() {
        let mut chunk = [0u8; 1024];
        let mut index = h.symoffset;
        let mut failed = false;
        let walked = for_each_entry::<_, 4>(
            mem,
            chains,
            0..nsyms - h.symoffset,
            &mut chunk,
            "DT_GNU_HASH chains",
            |link| {
                let link = u32::from_le_bytes(*link) | 1;
                for (position, _) in hashes.iter().enumerate().filter(|&(_, &hash)| hash | 1 == link) {
                    if named(mem, d, index as u32, &names[position..=position]).is_some() && !push(index, position) {
                        failed = true;
                        return ControlFlow::Break(());
                    }
                }
                index += 1;
                ControlFlow::Continue(())
            },
        );
        return (!failed && walked.is_ok()).then_some(n);
    }
    for (position, &hash) in hashes.iter().enumerate() {
        let mut full = false;
        for_each_hash_match(mem, &h, nsyms, hash, |index| {
            if named(mem, d, index as u32, &names[position..=position]).is_some() && !push(index, position) {
                full = true;
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        })?;
        if full {
            return None;
        }
    }
    Some(n)
}

/// Calls `f` with each hashed symbol in the chain of `hash`'s bucket whose
/// hash is `hash` (bar the chain-end bit), in chain order, until it
/// breaks. `None` where the table cannot say: a bucket that points below
/// `symoffset`, a chain that runs past the `nsyms` symbols, an entry that
/// cannot be read.
fn for_each_hash_match<M: Memory>(
    mem: &M,
    h: &GnuHash,
    nsyms: usize,
    hash: u32,
    mut f: impl FnMut(usize) -> ControlFlow<()>,
) -> Option<()> {
    if h.nbuckets == 0 {
        return None; // (read_dynamic makes none such)
    }
    let chains = h.buckets.checked_add(h.nbuckets * 4)?;
    let bucket = addr(h.buckets, (hash as usize % h.nbuckets) * 4, "").ok()?;
    let mut index = read_u32(mem, bucket).ok()? as usize;
    if index == 0 {
        return Some(()); // an empty bucket
    }
    if index < h.symoffset {
        return None;
    }
    loop {
        if index >= nsyms {
            return None;
        }
        let link = read_u32(mem, addr(chains, (index - h.symoffset) * 4, "").ok()?).ok()?;
        if link | 1 == hash | 1 && f(index).is_break() {
            return Some(());
        }
        if link & 1 == 1 {
            return Some(());
        }
        index += 1;
    }
}

/// Calls `f`, in table order, with every relocation of [`for_each_reloc`]
/// whose type is one of `types` and whose symbol is named one of `names`,
/// and the name's position in `names`, until it breaks.
///
/// Where the object has a GNU hash table, it first finds the symbols that
/// bear the names (see `symbols_named`): the object's imports in one pass
/// over them, its definitions through the table. An object whose symbols
/// bear none of the names is then done without a look at its relocations
/// (most of a process's libraries, for memhook's names), and the others'
/// relocations are matched by symbol index alone: no symbol entry and no
/// name read per relocation, which in a process of large C++ libraries
/// (tens of thousands of relocations naming symbols each) was most of an
/// install. Elsewhere it reads each symbol relocation's name, as
/// [`for_each_symbol_reloc`].
///
/// # Errors
///
/// As for [`for_each_reloc`], after `f` has had every relocation before the
/// unreadable entry; none where no symbol bears a name (the relocations
/// are not read).
pub fn for_each_named_reloc<M: Memory>(
    mem: &M,
    base: usize,
    d: &Dynamic,
    types: &[u32],
    names: &[&[u8]],
    mut f: impl FnMut(Reloc, usize) -> ControlFlow<()>,
) -> Result<(), ElfError> {
    // An object with few relocations beside its imports (a small library)
    // is walked by name: reading its imports' names and then its
    // relocations would read about as many names, and more.
    let relocs = d.jmprel.map_or(0, |(_, size)| size / SIZEOF_RELA)
        + d.rela
            .map_or(0, |(_, size)| (size / SIZEOF_RELA).saturating_sub(d.relacount));
    let imports = d.gnu_hash.map_or(0, |h| h.symoffset);
    if relocs > INDEX_FROM * (imports + names.len())
        && let Some(walked) = for_each_reloc_by_index(mem, base, d, types, names, &mut f)
    {
        return walked;
    }
    let filter = PrefixFilter::of(names);
    for_each_symbol_reloc(mem, base, d, types, |r, prefix| {
        match filter.passes(prefix).then(|| named(mem, d, r.sym, names)).flatten() {
            Some(position) => f(r, position),
            None => ControlFlow::Continue(()),
        }
    })
}

/// [`for_each_named_reloc`]'s walk by symbol index, whatever the object's
/// size: the symbols that bear the names found first (`symbols_named`),
/// then the relocations of `types` naming them, matched by index (none
/// read where no symbol bears a name). `None`, having called nothing,
/// where the object's tables cannot say which symbols bear the names:
/// then only the walk by name can.
pub fn for_each_reloc_by_index<M: Memory>(
    mem: &M,
    base: usize,
    d: &Dynamic,
    types: &[u32],
    names: &[&[u8]],
    mut f: impl FnMut(Reloc, usize) -> ControlFlow<()>,
) -> Option<Result<(), ElfError>> {
    let mut found = [(0u32, 0u16); MAX_NAMED];
    let n = symbols_named(mem, d, names, &mut found)?;
    let found = &mut found[..n];
    if found.is_empty() {
        return Some(Ok(()));
    }
    // (Sorted in place, with no allocation: by index, then position, so
    // that a symbol of two equal names gives the first.)
    found.sort_unstable();
    let found = &*found;
    // A relocation's symbol index, screened by its low bits first.
    let mut filter = [0u64; 8];
    for &(index, _) in found {
        filter[(index as usize >> 6) & 7] |= 1 << (index & 63);
    }
    Some(for_each_reloc(mem, base, d, |r| {
        if filter[(r.sym as usize >> 6) & 7] & 1 << (r.sym & 63) == 0 || !types.contains(&r.r_type) {
            return ControlFlow::Continue(());
        }
        // The first entry of that index (sorted: its lowest position).
        match found.get(found.partition_point(|&(index, _)| index < r.sym)) {
            Some(&(index, position)) if index == r.sym => f(r, usize::from(position)),
            _ => ControlFlow::Continue(()),
        }
    }))
}

/// The name of dynamic symbol `index`, copied into `buf`.
///
/// # Errors
///
/// An [`ElfError`] when the index is past the symbol count, the name's
/// offset past `DT_STRSZ`, or the name has no NUL within the string table or
/// `buf`.
pub fn symbol_name<'b, M: Memory>(mem: &M, d: &Dynamic, index: u32, buf: &'b mut [u8]) -> Result<&'b [u8], ElfError> {
    let (strtab, st_name) = name_offset(mem, d, index)?;
    let max = buf.len().min(d.strsz - st_name);
    let mut len = 0;
    // Read in small chunks so that a short name near the end of the
    // object does not fail on bytes after it.
    while len < max {
        let n = (max - len).min(16);
        mem.read(
            addr(strtab, st_name + len, "DT_STRTAB address")?,
            &mut buf[len..len + n],
        )?;
        if let Some(nul) = buf[len..len + n].iter().position(|&c| c == 0) {
            return Ok(&buf[..len + nul]);
        }
        len += n;
    }
    Err(ElfError::new("symbol name unterminated or too long", st_name as u64))
}

/// Most symbols [`defines`] reads one by one in an object without a GNU
/// hash table that hashes some symbol.
pub const DEFINES_SCAN_LIMIT: usize = 4096;

/// Whether the object defines a dynamic symbol named `name`: through its
/// GNU hash table (the name's bucket and chain), or, without one that
/// hashes some symbol, by reading its symbols in turn (at most
/// [`DEFINES_SCAN_LIMIT`]). `None` where its tables cannot say: more
/// symbols than that to read, or an entry that cannot be read. A symbol
/// with no section (`SHN_UNDEF`) is an import, not a definition.
pub fn defines<M: Memory>(mem: &M, d: &Dynamic, name: &[u8]) -> Option<bool> {
    let Some(symtab) = d.symtab else {
        return Some(false); // no symbols
    };
    let nsyms = d.nsyms?;
    let mut buf = [0u8; 256];
    if name.len() >= buf.len() {
        return None;
    }
    // Whether symbol `index` is a definition named `name`: its name's
    // first `name.len() + 1` bytes read at once (a longer name differs).
    let is_it = |index: usize, buf: &mut [u8; 256]| -> Option<bool> {
        let mut sym = [0u8; 8];
        mem.read(addr(symtab, index * SIZEOF_SYM, "DT_SYMTAB address").ok()?, &mut sym)
            .ok()?;
        if u16::from_le_bytes([sym[6], sym[7]]) == 0 {
            return Some(false); // undefined here
        }
        let (strtab, st_name) = name_offset(mem, d, index as u32).ok()?;
        if d.strsz - st_name < name.len() + 1 {
            return Some(false); // too short a string left to be `name`
        }
        let bytes = &mut buf[..name.len() + 1];
        mem.read(addr(strtab, st_name, "DT_STRTAB address").ok()?, bytes).ok()?;
        Some(bytes[..name.len()] == *name && bytes[name.len()] == 0)
    };
    let Some(h) = d.gnu_hash else {
        if nsyms > DEFINES_SCAN_LIMIT {
            return None;
        }
        for index in 1..nsyms {
            if is_it(index, &mut buf)? {
                return Some(true);
            }
        }
        return Some(false);
    };
    // The symbol's answer: true, false, or None (unreadable) ends the walk.
    let mut answer = Some(false);
    for_each_hash_match(mem, &h, nsyms, gnu_hash(name), |index| {
        answer = is_it(index, &mut buf);
        if answer == Some(false) {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    })?;
    answer
}

#[cfg(all(test, not(memhook_loom)))]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    /// The string table of `names` (after the empty string) and where
    /// each name starts in it.
    fn string_table(names: &[&str]) -> (Vec<u8>, Vec<u32>) {
        let mut strtab = std::vec![0u8];
        let mut offsets = Vec::new();
        for n in names {
            offsets.push(strtab.len() as u32);
            strtab.extend_from_slice(n.as_bytes());
            strtab.push(0);
        }
        (strtab, offsets)
    }

    /// Writes the dynamic section `dyns` (tag, value) at the start of `b`.
    fn put_dynamic(b: &mut [u8], dyns: &[(u64, u64)]) {
        for (i, (t, v)) in dyns.iter().enumerate() {
            b[i * 16..i * 16 + 8].copy_from_slice(&t.to_le_bytes());
            b[i * 16 + 8..i * 16 + 16].copy_from_slice(&v.to_le_bytes());
        }
    }

    /// Builds a small object: dynamic section, a GNU hash table, symbols,
    /// strings and one PLT relocation per name.
    pub(crate) fn object(names: &[&str]) -> (Vec<u8>, usize) {
        const BASE: usize = 0x40_0000;
        let (strtab, offsets) = string_table(names);
        let nsyms = names.len() + 1;
        // Layout: [dynamic 10 entries][gnu hash][symtab][strtab][jmprel]
        let hash_at = 160;
        // 1 bucket, symoffset 1, bloom 1 word: 16 + 8 + 4 + chains.
        let sym_at = hash_at + 16 + 8 + 4 + 4 * names.len();
        let sym_at = sym_at.next_multiple_of(8);
        let str_at = sym_at + nsyms * SIZEOF_SYM;
        let rel_at = (str_at + strtab.len()).next_multiple_of(8);
        let mut b = std::vec![0u8; rel_at + names.len() * SIZEOF_RELA];
        let dyns: [(u64, u64); 8] = [
            (DT_SYMTAB, (BASE + sym_at) as u64),
            (DT_STRTAB, (BASE + str_at) as u64),
            (DT_STRSZ, strtab.len() as u64),
            (DT_GNU_HASH, (BASE + hash_at) as u64),
            (DT_JMPREL, (BASE + rel_at) as u64),
            (DT_PLTRELSZ, (names.len() * SIZEOF_RELA) as u64),
            (DT_PLTREL, DT_RELA),
            (DT_NULL, 0),
        ];
        put_dynamic(&mut b, &dyns);
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(str_at, &strtab);
        put(hash_at, &1u32.to_le_bytes()); // nbuckets
        put(hash_at + 4, &1u32.to_le_bytes()); // symoffset
        put(hash_at + 8, &1u32.to_le_bytes()); // bloom words
        put(hash_at + 24, &1u32.to_le_bytes()); // bucket 0 -> symbol 1
        for i in 0..names.len() {
            let last = i + 1 == names.len();
            put(hash_at + 28 + 4 * i, &(if last { 1u32 } else { 0 }).to_le_bytes());
        }
        for (i, off) in offsets.iter().enumerate() {
            put(sym_at + (i + 1) * SIZEOF_SYM, &off.to_le_bytes());
            let r = rel_at + i * SIZEOF_RELA;
            put(r, &(0x2000u64 + 8 * i as u64).to_le_bytes());
            put(r + 8, &((((i + 1) as u64) << 32) | 7).to_le_bytes());
        }
        (b, BASE)
    }

    /// Builds an object as a linker lays it out: `imports` first (below
    /// the GNU hash table's `symoffset`, in no chain), then `defs` hashed
    /// into `nbuckets` buckets with their true hashes, and the relocations
    /// `relocs` (`(symbol index, type)`; slot `0x3000 + 8 * i`), JUMP_SLOT
    /// ones in the PLT table, the others in the RELA table.
    pub(crate) fn linked(imports: &[&str], defs: &[&str], nbuckets: usize, relocs: &[(u32, u32)]) -> (Vec<u8>, usize) {
        const BASE: usize = 0x40_0000;
        // Definitions ordered by bucket, as the table needs them.
        let mut defs: Vec<&str> = defs.to_vec();
        defs.sort_by_key(|n| gnu_hash(n.as_bytes()) as usize % nbuckets);
        let names: Vec<&str> = imports.iter().chain(&defs).copied().collect();
        let symoffset = 1 + imports.len();
        let nsyms = 1 + names.len();
        let (strtab, offsets) = string_table(&names);
        let (plt, rela): (Vec<_>, Vec<_>) = relocs.iter().enumerate().partition(|(_, r)| r.1 == 7);
        let hash_at = 16 * 12;
        let buckets_at = hash_at + 16 + 8;
        let chains_at = buckets_at + 4 * nbuckets;
        let sym_at = (chains_at + 4 * defs.len()).next_multiple_of(8);
        let str_at = sym_at + nsyms * SIZEOF_SYM;
        let plt_at = (str_at + strtab.len()).next_multiple_of(8);
        let rela_at = plt_at + plt.len() * SIZEOF_RELA;
        let mut b = std::vec![0u8; rela_at + rela.len() * SIZEOF_RELA];
        let dyns: [(u64, u64); 10] = [
            (DT_SYMTAB, (BASE + sym_at) as u64),
            (DT_STRTAB, (BASE + str_at) as u64),
            (DT_STRSZ, strtab.len() as u64),
            (DT_GNU_HASH, (BASE + hash_at) as u64),
            (DT_JMPREL, (BASE + plt_at) as u64),
            (DT_PLTRELSZ, (plt.len() * SIZEOF_RELA) as u64),
            (DT_PLTREL, DT_RELA),
            (DT_RELA, (BASE + rela_at) as u64),
            (DT_RELASZ, (rela.len() * SIZEOF_RELA) as u64),
            (DT_NULL, 0),
        ];
        put_dynamic(&mut b, &dyns);
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(hash_at, &(nbuckets as u32).to_le_bytes());
        put(hash_at + 4, &(symoffset as u32).to_le_bytes());
        put(hash_at + 8, &1u32.to_le_bytes()); // bloom words
        put(hash_at + 16, &u64::MAX.to_le_bytes()); // a bloom that lets all by
        let mut filled = std::vec![false; nbuckets];
        for (i, n) in defs.iter().enumerate() {
            let h = gnu_hash(n.as_bytes());
            let bucket = h as usize % nbuckets;
            if !core::mem::replace(&mut filled[bucket], true) {
                put(buckets_at + 4 * bucket, &((symoffset + i) as u32).to_le_bytes());
            }
            let last = defs
                .get(i + 1)
                .is_none_or(|m| gnu_hash(m.as_bytes()) as usize % nbuckets != bucket);
            put(chains_at + 4 * i, &((h & !1) | u32::from(last)).to_le_bytes());
        }
        put(str_at, &strtab);
        for (i, off) in offsets.iter().enumerate() {
            put(sym_at + (i + 1) * SIZEOF_SYM, &off.to_le_bytes());
            if i + 1 >= symoffset {
                put(sym_at + (i + 1) * SIZEOF_SYM + 6, &1u16.to_le_bytes()); // defined
            }
        }
        for (table, list) in [(plt_at, &plt), (rela_at, &rela)] {
            for (k, &(i, &(sym, r_type))) in list.iter().enumerate() {
                let at = table + k * SIZEOF_RELA;
                put(at, &(0x3000u64 + 8 * i as u64).to_le_bytes());
                put(at + 8, &((u64::from(sym) << 32) | u64::from(r_type)).to_le_bytes());
            }
        }
        (b, BASE)
    }

    /// The relocations of `types` naming one of `names` as a walk that
    /// reads each one's name in turn finds them: `(slot, position)`.
    fn named_in_turn(
        mem: &SliceMemory<'_>,
        base: usize,
        d: &Dynamic,
        types: &[u32],
        names: &[&[u8]],
    ) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for_each_reloc(mem, base, d, |r| {
            let mut buf = [0u8; 256];
            if types.contains(&r.r_type)
                && let Ok(name) = symbol_name(mem, d, r.sym, &mut buf)
                && let Some(p) = names.iter().position(|n| *n == name)
            {
                out.push((r.slot - base, p));
            }
            ControlFlow::Continue(())
        })
        .unwrap();
        out
    }

    fn named_walk(
        mem: &SliceMemory<'_>,
        base: usize,
        d: &Dynamic,
        types: &[u32],
        names: &[&[u8]],
    ) -> (Vec<(usize, usize)>, Result<(), ElfError>) {
        let mut out = Vec::new();
        let r = for_each_named_reloc(mem, base, d, types, names, |r, p| {
            out.push((r.slot - base, p));
            ControlFlow::Continue(())
        });
        (out, r)
    }

    /// The walk by symbol index finds what reading every relocation's name
    /// finds: imports and definitions, in every bucket layout, names that
    /// share a hash chain or a prefix with others, relocation types
    /// filtered, and with the GNU hash table out of use (the walk by name).
    #[test]
    fn relocations_found_by_symbol_index_are_those_found_by_name() {
        let imports = ["mmap", "munmap", "malloc", "mmap64", "_ZN4llvm3fooEv", "dlopen", "m"];
        let defs = [
            "mremap",
            "cudaMalloc",
            "cudaFree",
            "mmapx",
            "_ZN4llvm3barEv",
            "dlclose",
            "f0",
            "f1",
            "f2",
        ];
        let count = (imports.len() + defs.len()) as u32;
        // Every symbol named by PLT, GLOB_DAT and absolute (R_64)
        // relocations, in an order unlike the symbols' (more of them than
        // `INDEX_FROM` per symbol: the walk finds the symbols first).
        let relocs: Vec<(u32, u32)> = (0..12 * count)
            .map(|k| ((k * 7) % count + 1, [7, 6, 1][(k % 3) as usize]))
            .collect();
        let wanted: [&[&[u8]]; 4] = [
            &[b"mmap", b"munmap", b"mremap", b"dlopen", b"dlclose", b"cudaMalloc"],
            &[b"m", b"mm", b"f1", b"nothing", b"cudaFree"],
            &[b"absent", b"_ZN4llvm3barEv"],
            &[],
        ];
        for nbuckets in [1, 2, 3, 7, 64] {
            let (bytes, base) = linked(&imports, &defs, nbuckets, &relocs);
            let mem = SliceMemory { base, bytes: &bytes };
            let d = read_dynamic(&mem, base, base, 16 * 12).unwrap();
            assert!(d.gnu_hash.is_some(), "{nbuckets} buckets");
            for names in wanted {
                for types in [&[7, 6][..], &[7][..]] {
                    let want = named_in_turn(&mem, base, &d, types, names);
                    assert_eq!(
                        named_walk(&mem, base, &d, types, names),
                        (want.clone(), Ok(())),
                        "{nbuckets} buckets"
                    );
                    let by_name = Dynamic { gnu_hash: None, ..d };
                    assert_eq!(named_walk(&mem, base, &by_name, types, names), (want, Ok(())));
                }
            }
        }
        // Each name is found where it is (a check that the walks above
        // found something).
        let (bytes, base) = linked(&imports, &defs, 3, &relocs);
        let mem = SliceMemory { base, bytes: &bytes };
        let d = read_dynamic(&mem, base, base, 16 * 12).unwrap();
        let (found, _) = named_walk(&mem, base, &d, &[7, 6], &[b"mmap", b"cudaFree"]);
        let mut positions: Vec<usize> = found.iter().map(|&(_, p)| p).collect();
        positions.dedup();
        assert_eq!(found.len(), 16, "{found:?}");
        assert!(positions.contains(&0) && positions.contains(&1));
    }

    /// An object none of whose symbols bears a name is done without a
    /// read of its relocations; one whose tables the GNU hash table does
    /// not describe (a chain that leaves the symbol table) is walked by
    /// name, which finds what it can and reports the unreadable tables.
    #[test]
    fn the_walk_by_index_skips_objects_without_the_names_and_falls_back_on_bad_tables() {
        let relocs: Vec<(u32, u32)> = (0..30).map(|k| (k % 3 + 1, [7, 6][k as usize % 2])).collect();
        let (bytes, base) = linked(&["mmap"], &["f0", "f1"], 2, &relocs);
        // The PLT table cut short.
        let cut = &bytes[..bytes.len() - 4];
        let mem = SliceMemory { base, bytes: cut };
        let d = read_dynamic(&mem, base, base, 16 * 12).unwrap();
        assert_eq!(named_walk(&mem, base, &d, &[7, 6], &[b"absent"]), (Vec::new(), Ok(())));
        let (found, r) = named_walk(&mem, base, &d, &[7, 6], &[b"mmap"]);
        assert_eq!(found.len(), 10, "{found:?}");
        assert_eq!(r.unwrap_err().what, "read past the object");
        // A bucket that points below symoffset: the table is not used.
        let (mut bytes, base) = linked(&["mmap"], &["f0", "f1"], 1, &relocs);
        let bucket = 16 * 12 + 24;
        bytes[bucket..bucket + 4].copy_from_slice(&1u32.to_le_bytes());
        let mem = SliceMemory { base, bytes: &bytes };
        let d = read_dynamic(&mem, base, base, 16 * 12).unwrap();
        let mut found = [(0, 0); MAX_NAMED];
        assert_eq!(symbols_named(&mem, &d, &[b"f1"], &mut found), None);
        // (The symbol count the table gives ends below f1.)
        let want = named_in_turn(&mem, base, &d, &[7, 6], &[b"f1", b"mmap"]);
        assert_eq!(want.len(), 10);
        assert!(want.iter().all(|&(_, p)| p == 1), "{want:?}");
        assert_eq!(named_walk(&mem, base, &d, &[7, 6], &[b"f1", b"mmap"]), (want, Ok(())));
    }

    /// The symbol count from the last chain (a few reads) is the count from
    /// every bucket, where the last chain ends at the next table or at
    /// zero padding before it; a table whose last bucket does not head
    /// the last chain is read whole and still counted right.
    #[test]
    fn defines_finds_definitions_and_not_imports() {
        let defs: Vec<std::string::String> = (0..30).map(|i| std::format!("cuFn{i}")).collect();
        let defs: Vec<&str> = defs.iter().map(|s| s.as_str()).collect();
        for nbuckets in [1, 3, 16] {
            let (bytes, base) = linked(&["mmap", "cuInit"], &defs, nbuckets, &[(1, 7)]);
            let mem = SliceMemory { base, bytes: &bytes };
            let d = read_dynamic(&mem, base, base, 16 * 12).unwrap();
            assert!(d.gnu_hash.is_some());
            let mut linear = d;
            linear.gnu_hash = None;
            for (how, d) in [("hash", &d), ("in turn", &linear)] {
                for def in &defs {
                    assert_eq!(defines(&mem, d, def.as_bytes()), Some(true), "{def}, {how}, {nbuckets}");
                }
                // Imported, a prefix or an extension of a definition, absent.
                for other in ["mmap", "cuInit", "cuFn1_", "cuFn", "munmap", ""] {
                    assert_eq!(
                        defines(&mem, d, other.as_bytes()),
                        Some(false),
                        "{other}, {how}, {nbuckets}"
                    );
                }
            }
            // Too many symbols to read in turn: cannot say.
            let mut many = linear;
            many.nsyms = Some(DEFINES_SCAN_LIMIT + 1);
            assert_eq!(defines(&mem, &many, b"cuFn3"), None);
            // A name longer than any symbol's buffer: cannot say.
            assert_eq!(defines(&mem, &d, &[b'a'; 300]), None);
        }
        // No symbol table: nothing defined.
        let (bytes, base) = linked(&["mmap"], &["f"], 1, &[]);
        let mem = SliceMemory { base, bytes: &bytes };
        let mut d = read_dynamic(&mem, base, base, 16 * 12).unwrap();
        d.symtab = None;
        assert_eq!(defines(&mem, &d, b"f"), Some(false));
    }

    #[test]
    fn defines_cannot_say_for_a_broken_table() {
        let (mut bytes, base) = linked(&["mmap"], &["cuMemAlloc_v2", "cuMemFree_v2"], 1, &[]);
        let mem = SliceMemory { base, bytes: &bytes };
        let d = read_dynamic(&mem, base, base, 16 * 12).unwrap();
        assert_eq!(defines(&mem, &d, b"cuMemFree_v2"), Some(true));
        let h = d.gnu_hash.unwrap();
        // The bucket sent below symoffset, then past the symbols.
        for head in [1u32, 50] {
            bytes[h.buckets - base..][..4].copy_from_slice(&head.to_le_bytes());
            let mem = SliceMemory { base, bytes: &bytes };
            assert_eq!(defines(&mem, &d, b"cuMemFree_v2"), None, "bucket -> {head}");
        }
    }

    #[test]
    fn the_symbol_count_from_the_last_chain_is_the_count_from_every_bucket() {
        let defs: Vec<std::string::String> = (0..40).map(|i| std::format!("f{i}")).collect();
        for n in [1usize, 2, 5, 39, 40] {
            let names: Vec<&str> = defs[..n].iter().map(|s| s.as_str()).collect();
            for nbuckets in [1, 2, 3, 16, 64] {
                let (mut bytes, base) = linked(&["mmap"], &names, nbuckets, &[(1, 7)]);
                let mem = SliceMemory { base, bytes: &bytes };
                let d = read_dynamic(&mem, base, base, 16 * 12).unwrap();
                let hash_at = base + 16 * 12;
                let full = gnu_hash_symbols(&mem, hash_at, &[]).unwrap();
                assert_eq!(full.map(|(c, _)| c), Some(2 + n), "{n} symbols, {nbuckets} buckets");
                assert_eq!(d.nsyms, Some(2 + n));
                let h = d.gnu_hash.unwrap();
                // The fast path is taken (the symbol table follows the
                // chains, with or without padding).
                let fast = last_chain_end(&mem, &h, &[d.symtab.unwrap()]);
                assert_eq!(fast, Ok((2 + n, true)), "{n} symbols, {nbuckets} buckets");
                // The last bucket in use made to head the first chain:
                // refused, and the full count still right.
                let last_used = (0..nbuckets)
                    .rev()
                    .find(|&b| bytes[h.buckets - base + 4 * b..][..4] != [0; 4])
                    .unwrap();
                let first_used = (0..nbuckets)
                    .find(|&b| bytes[h.buckets - base + 4 * b..][..4] != [0; 4])
                    .unwrap();
                if first_used != last_used {
                    let head = bytes[h.buckets - base + 4 * first_used..][..4].to_vec();
                    bytes[h.buckets - base + 4 * last_used..][..4].copy_from_slice(&head);
                    let mem = SliceMemory { base, bytes: &bytes };
                    let fast = last_chain_end(&mem, &h, &[d.symtab.unwrap()]);
                    assert_eq!(fast, Ok((0, false)), "{n} symbols, {nbuckets} buckets");
                    let d2 = read_dynamic(&mem, base, base, 16 * 12).unwrap();
                    let whole = gnu_hash_symbols(&mem, hash_at, &[]).unwrap().map(|(c, _)| c);
                    assert_eq!(d2.nsyms, whole);
                }
            }
        }
    }

    #[test]
    fn walks_dynamic_relocations_and_names() {
        let (bytes, base) = object(&["mmap", "munmap", "cuMemAlloc_v2"]);
        let mem = SliceMemory { base, bytes: &bytes };
        let d = read_dynamic(&mem, base, base, 160).unwrap();
        assert_eq!(d.nsyms, Some(4));
        let mut seen = Vec::new();
        for_each_reloc(&mem, base, &d, |r| {
            let mut buf = [0u8; 64];
            let name = symbol_name(&mem, &d, r.sym, &mut buf).unwrap();
            seen.push((
                r.slot - base,
                r.r_type,
                std::string::String::from_utf8(name.to_vec()).unwrap(),
            ));
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(
            seen,
            [
                (0x2000, 7, "mmap".into()),
                (0x2008, 7, "munmap".into()),
                (0x2010, 7, "cuMemAlloc_v2".into())
            ]
        );
    }

    #[test]
    fn malformed_tables_are_errors_naming_the_table() {
        let (mut bytes, base) = object(&["mmap"]);
        let mem = SliceMemory { base, bytes: &bytes };
        let d = read_dynamic(&mem, base, base, 160).unwrap();
        // Symbol past the count.
        let e = symbol_name(&mem, &d, 9, &mut [0u8; 16]).unwrap_err();
        assert_eq!(e.what, "symbol index past the symbol table");
        // A name that does not fit the caller's buffer.
        let e = symbol_name(&mem, &d, 1, &mut [0u8; 2]).unwrap_err();
        assert_eq!(e.what, "symbol name unterminated or too long");
        // DT_PLTRELSZ not a multiple of the entry size.
        bytes[5 * 16 + 8] = 7;
        let mem = SliceMemory { base, bytes: &bytes };
        let e = read_dynamic(&mem, base, base, 160).unwrap_err();
        assert!(e.what.starts_with("DT_JMPREL"), "{e}");
        // A dynamic section running off the object, without DT_NULL.
        let e = read_dynamic(&mem, base, base + bytes.len() - 8, 160).unwrap_err();
        assert_eq!(e.what, "read past the object");
    }

    /// A table longer than one read comes whole and in order; one that
    /// runs out of the object comes up to its last whole entry, then the
    /// error.
    #[test]
    fn long_and_truncated_relocation_tables() {
        let names: Vec<std::string::String> = (0..2 * RELOCS_PER_READ + 22).map(|i| std::format!("f{i}")).collect();
        let names: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
        let (bytes, base) = object(&names);
        let walk = |bytes: &[u8]| {
            let mem = SliceMemory { base, bytes };
            let d = read_dynamic(&mem, base, base, 160).unwrap();
            let mut seen = Vec::new();
            let r = for_each_reloc(&mem, base, &d, |r| {
                seen.push((r.slot - base, r.sym));
                ControlFlow::Continue(())
            });
            (seen, r)
        };
        let want: Vec<(usize, u32)> = (0..names.len()).map(|i| (0x2000 + 8 * i, i as u32 + 1)).collect();
        let (seen, r) = walk(&bytes);
        assert_eq!(r, Ok(()));
        assert_eq!(seen, want);
        // The last entry cut short: every one before it, then the error.
        let (seen, r) = walk(&bytes[..bytes.len() - 5]);
        assert_eq!(r.unwrap_err().what, "read past the object");
        assert_eq!(seen, want[..names.len() - 1]);
        // A walk that breaks stops where it breaks, mid-read.
        let mem = SliceMemory { base, bytes: &bytes };
        let d = read_dynamic(&mem, base, base, 160).unwrap();
        let mut calls = 0;
        let r = for_each_reloc(&mem, base, &d, |_| {
            calls += 1;
            if calls == RELOCS_PER_READ + 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        assert_eq!((r, calls), (Ok(()), RELOCS_PER_READ + 3));
    }

    /// The walk that reads ahead gives what reading in turn gives: every
    /// relocation of the types asked for, in order, with its name's first
    /// two bytes, across many ring lengths; it stops where `f` breaks, and
    /// at an unreadable entry after every one before it.
    #[test]
    fn symbol_relocations_read_ahead_come_as_read_in_turn() {
        let names: Vec<std::string::String> = (0..5 * SYMBOLS_AHEAD + 5)
            .map(|i| std::format!("{}x{i}", (b'a' + (i % 26) as u8) as char))
            .collect();
        let names: Vec<&str> = names.iter().map(|n| n.as_str()).collect();
        let (mut bytes, base) = object(&names);
        // Every third relocation a type not asked for, every fifth symbol 0.
        let rel_at = bytes.len() - names.len() * SIZEOF_RELA;
        for i in 0..names.len() {
            let info = rel_at + i * SIZEOF_RELA + 8;
            let (ty, sym) = match i {
                _ if i % 3 == 2 => (1u64, i as u64 + 1),
                _ if i % 5 == 4 => (7, 0),
                _ => (if i % 2 == 0 { 7 } else { 6 }, i as u64 + 1),
            };
            bytes[info..info + 8].copy_from_slice(&(sym << 32 | ty).to_le_bytes());
        }
        let in_turn = |bytes: &[u8]| {
            let mem = SliceMemory { base, bytes };
            let d = read_dynamic(&mem, base, base, 160).unwrap();
            let mut out = Vec::new();
            let r = for_each_reloc(&mem, base, &d, |r| {
                if r.sym != 0 && (r.r_type == 6 || r.r_type == 7) {
                    out.push((r, symbol_prefix(&mem, &d, r.sym).unwrap()));
                }
                ControlFlow::Continue(())
            });
            (out, r)
        };
        let ahead = |bytes: &[u8], stop: usize| {
            let mem = SliceMemory { base, bytes };
            let d = read_dynamic(&mem, base, base, 160).unwrap();
            let mut out = Vec::new();
            let r = for_each_symbol_reloc(&mem, base, &d, &[6, 7], |r, prefix| {
                out.push((r, prefix));
                if out.len() == stop {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            (out, r)
        };
        let (want, r) = in_turn(&bytes);
        assert_eq!(r, Ok(()));
        assert!(want.len() > 2 * SYMBOLS_AHEAD, "{}", want.len());
        assert_eq!(want[0].1, *b"ax");
        assert_eq!(ahead(&bytes, usize::MAX), (want.clone(), Ok(())));
        for stop in [1, SYMBOLS_AHEAD / 2, SYMBOLS_AHEAD, SYMBOLS_AHEAD + 1, want.len() - 1] {
            assert_eq!(ahead(&bytes, stop), (want[..stop].to_vec(), Ok(())), "stop {stop}");
        }
        let cut = &bytes[..bytes.len() - 5];
        let (want_cut, r) = in_turn(cut);
        assert!(r.is_err());
        assert_eq!(ahead(cut, usize::MAX), (want_cut, r));
    }

    /// Entries read many at a time come as read one by one: across reads,
    /// from an offset, up to a break, and up to the first unreadable one.
    #[test]
    fn table_entries_read_in_chunks() {
        const BASE: usize = 0x1000;
        let bytes: Vec<u8> = (0..600u32).flat_map(|v| v.to_le_bytes()).collect();
        let walk = |bytes: &[u8], range: core::ops::Range<usize>, stop: u32| {
            let mem = SliceMemory { base: BASE, bytes };
            let mut seen = Vec::new();
            let mut chunk = [0u8; 64];
            let r = for_each_entry::<_, 4>(&mem, BASE, range, &mut chunk, "test table", |e| {
                seen.push(u32::from_le_bytes(*e));
                if seen.len() as u32 == stop {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
            (seen, r)
        };
        let (seen, r) = walk(&bytes, 3..600, u32::MAX);
        assert_eq!((seen, r), ((3..600).collect(), Ok(ControlFlow::Continue(()))));
        let (seen, r) = walk(&bytes, 0..600, 20);
        assert_eq!((seen, r), ((0..20).collect(), Ok(ControlFlow::Break(()))));
        // The table runs two bytes past the object's end.
        let (seen, r) = walk(&bytes[..598], 0..600, u32::MAX);
        assert_eq!(seen, (0..149).collect::<Vec<_>>());
        assert_eq!(r.unwrap_err().what, "read past the object");
        // An address that overflows names the table.
        let mem = SliceMemory {
            base: BASE,
            bytes: &bytes,
        };
        let r = for_each_entry::<_, 4>(&mem, usize::MAX - 8, 0..4, &mut [0u8; 64], "test table", |_| {
            ControlFlow::Continue(())
        });
        assert_eq!(r.unwrap_err().what, "read past the object");
        let r = for_each_entry::<_, 4>(&mem, usize::MAX - 8, 3..4, &mut [0u8; 64], "test table", |_| {
            ControlFlow::Continue(())
        });
        assert_eq!(r.unwrap_err().what, "test table");
    }

    /// A program that exports nothing: its GNU hash table hashes no symbol
    /// and says `symoffset` 1 (as ld.bfd writes it), while it imports
    /// three. The count is unknown, not 1: every import is named.
    #[test]
    fn an_empty_gnu_hash_table_counts_no_symbols() {
        let (mut bytes, base) = object(&["mmap", "munmap", "dlsym"]);
        // Bucket 0 (after nbuckets, symoffset, bloom size, shift and one
        // bloom word): no chain.
        bytes[160 + 24..160 + 28].copy_from_slice(&0u32.to_le_bytes());
        let mem = SliceMemory { base, bytes: &bytes };
        let d = read_dynamic(&mem, base, base, 160).unwrap();
        assert_eq!(d.nsyms, None);
        let mut names = Vec::new();
        for_each_reloc(&mem, base, &d, |r| {
            let mut buf = [0u8; 64];
            names.push(symbol_name(&mem, &d, r.sym, &mut buf).unwrap().to_vec());
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(names, [b"mmap".to_vec(), b"munmap".to_vec(), b"dlsym".to_vec()]);
    }

    /// The RELA table's leading relative relocations (`DT_RELACOUNT`) are
    /// passed over; a count past the table's end passes over it all.
    #[test]
    fn the_leading_relative_relocations_are_skipped() {
        let (mut bytes, base) = object(&["mmap", "munmap", "dlsym"]);
        let put = |bytes: &mut Vec<u8>, entry: usize, tag: u64, val: u64| {
            bytes[entry * 16..entry * 16 + 8].copy_from_slice(&tag.to_le_bytes());
            bytes[entry * 16 + 8..entry * 16 + 16].copy_from_slice(&val.to_le_bytes());
        };
        // The PLT table becomes the RELA table, its first entry counted as
        // relative.
        let jmprel = u64::from_le_bytes(bytes[4 * 16 + 8..4 * 16 + 16].try_into().unwrap());
        put(&mut bytes, 4, DT_RELA, jmprel);
        put(&mut bytes, 5, DT_RELASZ, (3 * SIZEOF_RELA) as u64);
        put(&mut bytes, 6, DT_RELACOUNT, 1);
        let walked = |bytes: &[u8]| {
            let mem = SliceMemory { base, bytes };
            let d = read_dynamic(&mem, base, base, 160).unwrap();
            let mut names = Vec::new();
            for_each_reloc(&mem, base, &d, |r| {
                let mut buf = [0u8; 64];
                names.push(symbol_name(&mem, &d, r.sym, &mut buf).unwrap().to_vec());
                ControlFlow::Continue(())
            })
            .unwrap();
            names
        };
        assert_eq!(walked(&bytes), [b"munmap".to_vec(), b"dlsym".to_vec()]);
        bytes[6 * 16 + 8] = 9;
        assert_eq!(walked(&bytes), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn find_functions_finds_plain_function_definitions_only() {
        let names = ["mmap", "munmap", "madvise", "brk", "sbrk", "shmat", "undef"];
        let (mut bytes, base) = object(&names);
        let d = read_dynamic(&SliceMemory { base, bytes: &bytes }, base, base, 160).unwrap();
        let sym_at = d.symtab.unwrap() - base;
        // (symbol, st_info, st_shndx, st_value)
        let defs: [(usize, u8, u16, u64); 7] = [
            (1, 0x12, 12, 0x1000), // mmap: global function
            (2, 0x22, 12, 0x2000), // munmap: weak function
            (3, 0x1a, 12, 0x3000), // madvise: an indirect function
            (4, 0x11, 20, 0x4000), // brk: an object, not a function
            (5, 0x12, 12, 0x5000), // sbrk: two versions...
            (6, 0x12, 12, 0x6000), // shmat
            (7, 0x12, 0, 0),       // undef: not defined here
        ];
        for (i, info, shndx, value) in defs {
            let at = sym_at + i * SIZEOF_SYM;
            bytes[at + 4] = info;
            bytes[at + 6..at + 8].copy_from_slice(&shndx.to_le_bytes());
            bytes[at + 8..at + 16].copy_from_slice(&value.to_le_bytes());
        }
        let mem = SliceMemory { base, bytes: &bytes };
        let look = |want: &[&[u8]]| {
            let mut found = [None; 8];
            find_functions(&mem, &d, want, &mut found).unwrap();
            found
        };
        let found = look(&[
            b"shmat", b"mmap", b"munmap", b"madvise", b"brk", b"undef", b"absent", b"sbrk",
        ]);
        assert_eq!(
            found,
            [
                Some(0x6000),
                Some(0x1000),
                Some(0x2000),
                None,
                None,
                None,
                None,
                Some(0x5000)
            ]
        );
        // A second definition of sbrk (another version) at another value:
        // no answer rather than a guess; at the same value, the answer.
        let mut two = bytes.clone();
        let at = sym_at + 6 * SIZEOF_SYM;
        let sbrk = u32::from_le_bytes(two[sym_at + 5 * SIZEOF_SYM..][..4].try_into().unwrap());
        two[at..at + 4].copy_from_slice(&sbrk.to_le_bytes());
        let mem2 = SliceMemory { base, bytes: &two };
        let mut found = [None; 1];
        find_functions(&mem2, &d, &[b"sbrk"], &mut found).unwrap();
        assert_eq!(found, [None]);
        two[at + 8..at + 16].copy_from_slice(&0x5000u64.to_le_bytes());
        let mem2 = SliceMemory { base, bytes: &two };
        find_functions(&mem2, &d, &[b"sbrk"], &mut found).unwrap();
        assert_eq!(found, [Some(0x5000)]);
        // Bad requests are errors, not panics.
        let many = [b"x".as_slice(); MAX_LOOKUPS + 1];
        assert!(find_functions(&mem, &d, &many, &mut [None; MAX_LOOKUPS + 1]).is_err());
        assert!(find_functions(&mem, &d, &[b"mmap", b"brk"], &mut [None; 1]).is_err());
        // Without a symbol count nothing is read past the table's end.
        let no_count = Dynamic { nsyms: None, ..d };
        assert!(find_functions(&mem, &no_count, &[b"mmap"], &mut [None; 1]).is_err());
    }

    #[test]
    fn symbol_prefix_is_the_names_first_two_bytes() {
        let (bytes, base) = object(&["mmap", "x", "cuMemAlloc_v2"]);
        let mem = SliceMemory { base, bytes: &bytes };
        let d = read_dynamic(&mem, base, base, 160).unwrap();
        assert_eq!(symbol_prefix(&mem, &d, 1), Ok(*b"mm"));
        assert_eq!(symbol_prefix(&mem, &d, 2), Ok([b'x', 0]));
        assert_eq!(symbol_prefix(&mem, &d, 3), Ok(*b"cu"));
        // Symbol 0's name is the empty string.
        assert_eq!(symbol_prefix(&mem, &d, 0), Ok([0, 0]));
        assert_eq!(
            symbol_prefix(&mem, &d, 9).unwrap_err().what,
            "symbol index past the symbol table"
        );
    }

    #[test]
    fn search_paths_reads_the_tags_up_to_dt_null() {
        let dynamic = |tags: &[u64]| -> Vec<u8> {
            let mut b = Vec::new();
            for &t in tags {
                b.extend_from_slice(&t.to_le_bytes());
                b.extend_from_slice(&0x10u64.to_le_bytes());
            }
            b
        };
        let paths = |bytes: &[u8], size: usize| search_paths(&SliceMemory { base: 0x1000, bytes }, 0x1000, size);
        let none = SearchPaths::default();
        let both = SearchPaths {
            rpath: true,
            runpath: true,
        };
        let b = dynamic(&[DT_STRTAB, DT_NULL]);
        assert_eq!(paths(&b, b.len()), Ok(none));
        let b = dynamic(&[DT_STRTAB, DT_RUNPATH, DT_NULL]);
        assert_eq!(paths(&b, b.len()), Ok(SearchPaths { runpath: true, ..none }));
        let b = dynamic(&[DT_RPATH, DT_STRSZ, DT_RUNPATH, DT_NULL]);
        assert_eq!(paths(&b, b.len()), Ok(both));
        // A tag after DT_NULL, or past the section's size, is not the object's.
        let b = dynamic(&[DT_STRTAB, DT_NULL, DT_RPATH]);
        assert_eq!(paths(&b, b.len()), Ok(none));
        let b = dynamic(&[DT_STRTAB, DT_RUNPATH]);
        assert_eq!(paths(&b, 16), Ok(none));
        // A section running off the object without DT_NULL: an error.
        let b = dynamic(&[DT_STRTAB, DT_RPATH]);
        assert_eq!(paths(&b, b.len() + 16).unwrap_err().what, "read past the object");
    }

    #[test]
    fn stops_at_the_segment_size_without_dt_null() {
        let (bytes, base) = object(&["mmap"]);
        let mem = SliceMemory { base, bytes: &bytes };
        // Only the first two entries (symtab, strtab) are inside "the segment".
        let d = read_dynamic(&mem, base, base, 32).unwrap();
        assert!(d.symtab.is_some() && d.strtab.is_some() && d.jmprel.is_none() && d.nsyms.is_none());
    }
}

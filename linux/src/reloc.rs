//! Reloc: hooking by rewriting the GOT slots (`JUMP_SLOT`, `GLOB_DAT`)
//! through which loaded objects reach a symbol. No code page is written.
//!
//! [`install`] adds (symbol → hook) pairs and applies them to every loaded
//! object in one pass over each object's relocations; objects are
//! remembered, so a later `dlopen` (interposed through reloc itself, or,
//! for the host hooks alone in bistro mode, through bistro patches of the
//! loader's functions to the same entries) scans only the new ones, and a `dlclose` makes memhook forget the objects that
//! went away (they are never touched again). A `dlopen` whose search
//! depends on its caller (a bare name from a caller with a `DT_RUNPATH`,
//! `$ORIGIN`, ...) goes on to glibc with the caller's return address intact,
//! and what it loaded is scanned at the same thread's next `dlsym`,
//! `dlvsym`, `dlopen` or `dlclose` (see the comment at `dlopen_decide`). With the host hooks
//! installed, the spans of the objects that appeared or went are reported
//! as `VM_MAPPED` / `VM_UNMAPPED` after the call (the loader maps and
//! unmaps them through its own copies of mmap and munmap, which no hook
//! sees). [`uninstall`] restores every
//! slot it wrote. memhook's own object, the vDSO and the dynamic loader are
//! skipped. A slot inside the object's RELRO region is written between two
//! `mprotect` calls. The original of a symbol is what the global scope
//! resolves it to (`dlsym(RTLD_DEFAULT)`), so a lazily bound slot never
//! sends the hook into the PLT resolver; a symbol defined only in objects
//! loaded `RTLD_LOCAL` (libcuda, as libcudart loads it) takes its original
//! from the first slot already bound to a definition in another object. The
//! original is stored before any slot is written, so a hook never runs
//! without it. A slot the loader left at 0 (a weak reference to a
//! function no object defined, which the object tests for its absence:
//! `process_madvise` before glibc 2.36) is never written, nor bound later,
//! as the loader does not bind it.
//!
//! Reloc misses callers that do not go through a relocation slot (code that
//! looked the function up itself, or a statically linked copy); bistro and
//! procaddr cover those.
//!
//! The object that contains memhook's own code is skipped, so that
//! memhook's calls (its trampoline mmap, its own dlsym) are never routed
//! through its hooks. When memhook is a Rust crate linked into a program,
//! that object is the program itself: reloc then hooks every library the
//! program loads but not the program's own PLT calls. Bistro (the default
//! mode for host memory) covers them, and so does loading memhook as
//! `libmemhook.so`.

use core::ffi::{CStr, c_char, c_int, c_void};
use core::ops::ControlFlow;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use memhook_core::elf::{ElfError, Memory, Reloc, SearchPaths, for_each_named_reloc, read_dynamic, search_paths};

use crate::maps::page_size;

/// Most symbols hooked through reloc: memhook's own, every host function
/// (with its aliases, `fopen`'s family and the loader's four) and every
/// CUDA function together (106: `cuda` checks at build time that they
/// fit), and room for an embedder's.
pub const MAX_SYMBOLS: usize = 160;
const _: () = assert!(MAX_SYMBOLS <= 256, "a scan names a symbol by a u8 (`Wanted::which`)");
/// Most slots patched at once.
pub const MAX_SLOTS: usize = 16384;
/// Most loaded objects remembered.
pub const MAX_OBJECTS: usize = 2048;
/// Most PT_LOAD segments per object memhook reads through.
pub(crate) const MAX_SEGMENTS: usize = 16;

#[cfg(target_arch = "x86_64")]
const R_JUMP_SLOT: u32 = memhook_x86_64::R_X86_64_JUMP_SLOT;
#[cfg(target_arch = "x86_64")]
const R_GLOB_DAT: u32 = memhook_x86_64::R_X86_64_GLOB_DAT;
#[cfg(target_arch = "aarch64")]
const R_JUMP_SLOT: u32 = memhook_aarch64::R_AARCH64_JUMP_SLOT;
#[cfg(target_arch = "aarch64")]
const R_GLOB_DAT: u32 = memhook_aarch64::R_AARCH64_GLOB_DAT;

/// Why reloc could not do what was asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelocError {
    /// More than [`MAX_SYMBOLS`] symbols.
    TooManySymbols,
    /// More than [`MAX_SLOTS`] slots to patch: the rest were left alone.
    TooManySlots,
    /// A symbol name was hooked twice with different hooks.
    Conflict,
    /// `dlopen` or `dlclose` has no definition (no dynamic loader).
    NoDefinition,
}

impl core::fmt::Display for RelocError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RelocError::TooManySymbols => {
                return write!(f, "too many symbols hooked through reloc (at most {MAX_SYMBOLS})");
            }
            RelocError::TooManySlots => "too many relocation slots to patch; some were left unhooked",
            RelocError::Conflict => "symbol already hooked through reloc with another hook",
            RelocError::NoDefinition => "dlopen/dlclose not found: cannot follow objects loaded later",
        })
    }
}

impl std::error::Error for RelocError {}

#[derive(Clone, Copy)]
struct Symbol {
    name: &'static CStr,
    hook: usize,
    /// Where the caller reads the original; 0 inside until known.
    original: &'static AtomicUsize,
    /// Whether GOT slots naming the symbol are rewritten.
    slots: bool,
    /// Where `dlsym` of the symbol answers `hook`: when the real answer is
    /// the value this holds.
    answer: Option<&'static AtomicUsize>,
}

/// One symbol for [`install_with`].
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// The symbol.
    pub name: &'static CStr,
    /// Its hook.
    pub hook: usize,
    /// Receives the original (see [`install`]).
    pub original: &'static AtomicUsize,
    /// Rewrite the GOT slots that name the symbol.
    pub slots: bool,
    /// Answer `dlsym`/`dlvsym` of the symbol with `hook` when the real
    /// answer equals the value this holds (the definition being hooked);
    /// any other definition is answered as it is.
    pub answer: Option<&'static AtomicUsize>,
}

/// A loaded object's identity (load base and program headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ObjectId {
    base: usize,
    phdr: usize,
}

#[derive(Clone, Copy)]
struct Slot {
    object: ObjectId,
    slot: usize,
    old: usize,
    symbol: u8,
    /// The hook written (the symbol's, or in another namespace's object
    /// that namespace's: see `crate::namespace::reloc_hook`).
    hook: usize,
}

/// A loaded object reloc knows, with the span the loader mapped for it
/// (its first to its last load segment, in whole pages: what `dlclose`
/// unmaps).
#[derive(Clone, Copy)]
struct Known {
    id: ObjectId,
    /// A hash of its path: another library loaded at the address of one
    /// unloaded since the last scan has the same id, not the same path.
    name: u64,
    span: (usize, usize),
    /// The last scan that found it loaded (see `State::scans`).
    seen: u32,
    /// In another of the loader's namespaces (see
    /// [`for_each_namespace_object`]).
    foreign: bool,
    /// One slot memhook wrote in it, and the hook written: the same
    /// library unloaded and loaded again at the same address since the
    /// last scan has the same id and path, and a fresh GOT.
    check: Option<(usize, usize)>,
}

/// FNV-1a of `bytes`.
fn name_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// glibc's `_dl_find_object` (2.35 and later), looked up at install: 0
/// before, 1 where the C library lacks it.
static FIND_OBJECT: AtomicUsize = AtomicUsize::new(0);

/// Has reloc ignore `_dl_find_object` (`false`) or look it up again
/// (`true`): for tests of the fallback that older C libraries get.
#[doc(hidden)]
pub fn use_find_object(on: bool) {
    FIND_OBJECT.store(if on { 0 } else { 1 }, Ordering::Release);
    look_up_find_object();
}

/// The objects a scan may take in where `_dl_find_object` is missing:
/// those listed before a wait for the loads in progress (see
/// `listed_settled`), with the loader's count of unloads before the
/// listing and of loads after the wait. The ids lie in a [`ListingRoom`].
struct Listed<'a> {
    ids: &'a [ObjectId],
    subs_before: Option<u64>,
    adds_after: Option<u64>,
    /// Set where [`Listed::holds`] turned down a listed object for its
    /// address's reuse: the scan may have left out an object that had
    /// been relocated (the rescan lists again, see [`rescan`]).
    ambiguous: core::cell::Cell<bool>,
}

impl Listed<'_> {
    /// Whether `o` was listed and has been relocated since. An id is an
    /// address: where a listed object went (unloads counted since the
    /// listing) and a load began after the wait (loads counted since),
    /// an object with a listed id may be a new one still loading, so none
    /// counts as loaded (the next scan lists afresh).
    fn holds(&self, o: &Object<'_>) -> bool {
        let reused = match (o.loads, self.subs_before, self.adds_after) {
            (Some((adds, subs)), Some(before), Some(after)) => subs != before && adds != after,
            _ => false,
        };
        let listed = self.ids.contains(&o.id);
        if reused && listed {
            self.ambiguous.set(true);
        }
        !reused && listed
    }
}

/// Room for one listing's ids: 32 KiB, off the stack of the thread that
/// lists (any thread that calls `dlopen` or `dlclose`, or installs, with
/// a glibc before 2.35; some make their threads' stacks 64 KiB or less).
/// One static room, for one listing at a time; a listing made meanwhile
/// (another thread's, or a rescan inside this one's, a `dlopen` in a
/// callback) gets pages mapped for it, and unmapped after, by memhook's
/// own system calls (no hook sees them). Where the kernel gives none, the
/// room is empty: nothing counts as listed, so the scan takes in no new
/// object (the next scan does).
enum ListingRoom {
    Shared,
    Mapped(usize),
    Empty,
}

/// The ids of [`ListingRoom::Shared`], and whether a listing uses them.
struct SharedIds {
    busy: AtomicBool,
    ids: core::cell::UnsafeCell<[ObjectId; MAX_OBJECTS]>,
}

// SAFETY: `ids` is used only by the one thread whose swap of `busy` found
// it false, until that thread stores false again (`ListingRoom`'s drop).
unsafe impl Sync for SharedIds {}

static SHARED_IDS: SharedIds = SharedIds {
    busy: AtomicBool::new(false),
    ids: core::cell::UnsafeCell::new([ObjectId { base: 0, phdr: 0 }; MAX_OBJECTS]),
};

/// Bytes of a mapped room: the ids, in whole pages.
fn mapped_room_len() -> usize {
    core::mem::size_of::<[ObjectId; MAX_OBJECTS]>().next_multiple_of(page_size())
}

impl ListingRoom {
    fn take() -> ListingRoom {
        if !SHARED_IDS.busy.swap(true, Ordering::Acquire) {
            return ListingRoom::Shared;
        }
        // SAFETY: a new private anonymous mapping, nowhere in particular;
        // the result is checked. (The raw call: errno untouched, as
        // around every hook.)
        let p = unsafe {
            crate::sys::raw(
                libc::SYS_mmap,
                [
                    0,
                    mapped_room_len() as libc::c_long,
                    libc::c_long::from(libc::PROT_READ | libc::PROT_WRITE),
                    libc::c_long::from(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS),
                    -1,
                    0,
                ],
            )
        };
        if crate::sys::refused(p) {
            ListingRoom::Empty
        } else {
            ListingRoom::Mapped(p as usize)
        }
    }

    /// The room's ids, for as long as the room is held.
    fn ids(&mut self) -> &mut [ObjectId] {
        match *self {
            // SAFETY: this room set `busy` (see `SharedIds`).
            ListingRoom::Shared => unsafe { &mut *SHARED_IDS.ids.get() },
            // SAFETY: the pages mapped for this room alone, zero-filled
            // (every ObjectId of zeros is a valid one), page-aligned, and
            // as long as the array.
            ListingRoom::Mapped(p) => unsafe { &mut *(p as *mut [ObjectId; MAX_OBJECTS]) },
            ListingRoom::Empty => &mut [],
        }
    }
}

impl Drop for ListingRoom {
    fn drop(&mut self) {
        match *self {
            ListingRoom::Shared => SHARED_IDS.busy.store(false, Ordering::Release),
            ListingRoom::Mapped(p) => {
                // SAFETY: the pages this room mapped, no longer used.
                unsafe {
                    crate::sys::raw(
                        libc::SYS_munmap,
                        [p as libc::c_long, mapped_room_len() as libc::c_long, 0, 0, 0, 0],
                    )
                };
            }
            ListingRoom::Empty => {}
        }
    }
}

/// Where `_dl_find_object` is missing (glibc before 2.35): lists the
/// loaded objects, then waits until any load in progress on another
/// thread has finished (a `dlopen(NULL)` takes the loader's lock, which a
/// `dlopen` holds from mapping to relocation and beyond): every object
/// listed has been relocated by then. Called before the state is taken
/// (an install or a scan never waits for the loader's lock while it holds
/// the state). `None` where `_dl_find_object` answers.
fn listed_settled(room: &mut [ObjectId]) -> Option<Listed<'_>> {
    if FIND_OBJECT.load(Ordering::Acquire) != 1 {
        return None;
    }
    let mut subs_before = None;
    let mut len = 0;
    for_each_object(|o| {
        subs_before = o.loads.map(|(_, subs)| subs);
        if let Some(id) = room.get_mut(len) {
            *id = o.id;
            len += 1;
        }
    });
    let mut listed = Listed {
        ids: &room[..len],
        subs_before,
        adds_after: None,
        ambiguous: core::cell::Cell::new(false),
    };
    let (open, close) = (
        REAL_DLOPEN.load(Ordering::Acquire),
        REAL_DLCLOSE.load(Ordering::Acquire),
    );
    // SAFETY: REAL_DLOPEN and REAL_DLCLOSE, where set, hold dlopen and
    // dlclose themselves (or their bistro trampolines), never memhook's
    // entries; dlopen(NULL, RTLD_NOLOAD) returns the main program's handle,
    // which dlclose gives back.
    unsafe {
        let h = if open != 0 {
            core::mem::transmute::<usize, DlopenFn>(open)(core::ptr::null(), libc::RTLD_LAZY | libc::RTLD_NOLOAD)
        } else {
            libc::dlopen(core::ptr::null(), libc::RTLD_LAZY | libc::RTLD_NOLOAD)
        };
        if !h.is_null() {
            if close != 0 {
                core::mem::transmute::<usize, DlcloseFn>(close)(h);
            } else {
                libc::dlclose(h);
            }
        }
    }
    for_each_object_while(|o| {
        listed.adds_after = o.loads.map(|(adds, _)| adds);
        ControlFlow::Break(())
    });
    Some(listed)
}

/// Looks `_dl_find_object` up (once; outside every loader callback, as
/// `dlsym` takes the loader's lock).
fn look_up_find_object() {
    if FIND_OBJECT.load(Ordering::Acquire) == 0 {
        let f = global_definition(c"_dl_find_object");
        FIND_OBJECT.store(if f == 0 { 1 } else { f }, Ordering::Release);
    }
}

/// Whether this C library lets reloc tell a loaded object from one
/// another thread's `dlopen` has listed but not yet relocated (glibc's
/// `_dl_find_object`, 2.35 and later). Without it a scan lists the
/// objects, waits for the loads in progress on other threads (a
/// `dlopen(NULL)`, which takes the loader's lock) and takes in only the
/// objects listed before the wait.
pub fn sees_relocation() -> bool {
    look_up_find_object();
    FIND_OBJECT.load(Ordering::Acquire) > 1
}

/// Whether memhook can follow the loader's other namespaces (`dlmopen`):
/// the loader's list of them (`r_debug_extended`, glibc 2.35 and later,
/// through the main program's `DT_DEBUG`) and `_dl_find_object`. Where it
/// can, the host hooks in bistro mode hook each namespace's libc (in
/// reloc mode, its objects' GOT slots), and the loader's mappings of its
/// objects are reported; where it cannot, a library opened with `dlmopen`
/// calls a libc memhook does not see.
pub fn sees_namespaces() -> bool {
    sees_relocation() && crate::namespace::debugger_interface()
}

/// Whether the loader has finished loading `o` (relocated it): a
/// `dlopen` on another thread puts its objects in the list before it
/// relocates them, and a GOT slot written before the relocation would be
/// overwritten (a lazily bound one gets the load base added: a wild
/// call). glibc's `_dl_find_object` knows an object only from the end of
/// its relocation on. Without it (glibc before 2.35), the objects listed
/// before the scan's wait for the loads in progress (`listed`, see
/// `listed_settled`) count as loaded, and no other.
fn settled(o: &Object<'_>, listed: Option<&Listed>) -> bool {
    let f = FIND_OBJECT.load(Ordering::Acquire);
    let Some(&(start, _)) = o.segments.first() else {
        return true;
    };
    if f <= 1 {
        return listed.is_none_or(|l| l.holds(o));
    }
    find_object(f, start).is_some()
}

/// What glibc's `_dl_find_object` (`f`, as [`FIND_OBJECT`] holds it) says
/// of the object that holds `addr`: `dlfo_map_start`, `dlfo_map_end` and
/// `dlfo_link_map`, or `None` where it knows no such object (none there,
/// or one still being loaded).
fn find_object(f: usize, addr: usize) -> Option<(usize, usize, usize)> {
    type FindObject = unsafe extern "C" fn(*mut c_void, *mut u64) -> c_int;
    // `struct dl_find_object` is 96 bytes on 64-bit targets; room to spare.
    let mut result = [0u64; 32];
    // SAFETY: `f` is `_dl_find_object` (lock-free, safe inside
    // dl_iterate_phdr); `result` is larger than its result struct.
    let found = unsafe { core::mem::transmute::<usize, FindObject>(f)(addr as *mut c_void, result.as_mut_ptr()) } == 0;
    found.then_some((result[1] as usize, result[2] as usize, result[3] as usize))
}

/// An object's span that the loader mapped (`dlopen`) or unmapped
/// (`dlclose`), found by a rescan and waiting to be reported.
#[derive(Clone, Copy)]
struct Change {
    mapped: bool,
    span: (usize, usize),
}

/// Whether rescans after `dlopen`/`dlclose` record the loader's
/// mappings as [`Change`]s (set while host events are installed).
pub(crate) static LOADER_EVENTS: AtomicBool = AtomicBool::new(false);

struct State {
    symbols: heapless::Vec<Symbol, MAX_SYMBOLS>,
    objects: heapless::Vec<Known, MAX_OBJECTS>,
    /// The loader's changes found and not yet reported (at most every
    /// known object gone and as many new: never full).
    changes: heapless::Deque<Change, { 2 * MAX_OBJECTS }>,
    slots: heapless::Vec<Slot, MAX_SLOTS>,
    overflow: bool,
    /// Objects skipped because their dynamic section was malformed.
    malformed: usize,
    /// Scans made (each marks the known objects it finds).
    scans: u32,
    /// The loader's count of loads and unloads at the last full scan: a
    /// rescan that finds them unchanged has nothing to do.
    loads: Option<(u64, u64)>,
}

impl State {
    /// Nothing hooked, nothing known.
    const fn new() -> State {
        State {
            symbols: heapless::Vec::new(),
            objects: heapless::Vec::new(),
            changes: heapless::Deque::new(),
            slots: heapless::Vec::new(),
            overflow: false,
            malformed: 0,
            scans: 0,
            loads: None,
        }
    }
}

static STATE: crate::fork::Mutex<State> = crate::fork::Mutex::new(State::new());

/// One loaded object, as `dl_iterate_phdr` shows it.
pub(crate) struct Object<'a> {
    pub(crate) id: ObjectId,
    /// The loader's counts of loads and unloads so far (`dlpi_adds`,
    /// `dlpi_subs`), where it gives them.
    loads: Option<(u64, u64)>,
    pub(crate) name: &'a [u8],
    pub(crate) segments: heapless::Vec<(usize, usize), MAX_SEGMENTS>,
    dynamic: Option<(usize, usize)>,
    relro: Option<(usize, usize)>,
    /// Its loader namespace: 0 for the main one (listed by
    /// `dl_iterate_phdr`), else another (known by its `link_map`; only
    /// the host functions' slots are rewritten in it, to that namespace's
    /// hooks).
    namespace: usize,
}

impl Memory for Object<'_> {
    fn read(&self, addr: usize, buf: &mut [u8]) -> Result<(), ElfError> {
        let end = addr
            .checked_add(buf.len())
            .ok_or(ElfError::new("read wraps", addr as u64))?;
        if !self.segments.iter().any(|&(s, e)| s <= addr && end <= e) {
            return Err(ElfError::new("read outside the object's segments", addr as u64));
        }
        // SAFETY: the range lies inside one of the object's loaded PT_LOAD
        // segments, which stay mapped while the loader lock is held (we are
        // inside dl_iterate_phdr) or the state lock serialises us with
        // dlclose.
        unsafe { core::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    fn prefetch(&self, addr: usize) {
        memhook_core::prefetch(addr as *const u8, 1);
    }
}

impl Object<'_> {
    /// Takes its load segments, dynamic section and RELRO range from its
    /// program headers (at its load bias, `id.base`). `false` where it has
    /// more load segments than room (those past it are left out).
    fn take_program_headers(&mut self, phdrs: &[libc::Elf64_Phdr]) -> bool {
        let mut room = true;
        for ph in phdrs {
            let start = self.id.base.wrapping_add(ph.p_vaddr as usize);
            let end = start.wrapping_add(ph.p_memsz as usize);
            match ph.p_type {
                libc::PT_LOAD => room &= self.segments.push((start, end)).is_ok(),
                libc::PT_DYNAMIC => self.dynamic = Some((start, ph.p_memsz as usize)),
                libc::PT_GNU_RELRO => self.relro = Some((start, end)),
                _ => {}
            }
        }
        room
    }

    /// Whether the object names a `DT_RPATH` or a `DT_RUNPATH`; both, as
    /// the cautious answer, where its dynamic section cannot be read.
    fn search_paths(&self) -> SearchPaths {
        let worst = SearchPaths {
            rpath: true,
            runpath: true,
        };
        self.dynamic
            .map_or(Ok(SearchPaths::default()), |(at, size)| search_paths(self, at, size))
            .unwrap_or(worst)
    }

    fn holds(&self, addr: usize) -> bool {
        self.segments.iter().any(|&(s, e)| (s..e).contains(&addr))
    }
}

/// Calls `f` with every loaded object (under the loader's lock).
pub(crate) fn for_each_object(mut f: impl FnMut(&Object<'_>)) {
    for_each_object_while(|o| {
        f(o);
        ControlFlow::Continue(())
    });
}

/// The loader's count of objects loaded so far (`dlpi_adds`, as the first
/// object shows it), or `None` where it gives none.
pub(crate) fn loader_adds() -> Option<u64> {
    let mut adds = None;
    for_each_object_while(|o| {
        adds = o.loads.map(|(adds, _)| adds);
        ControlFlow::Break(())
    });
    adds
}

/// Calls `f` with every loaded object (under the loader's lock) until it
/// breaks.
fn for_each_object_while(mut f: impl FnMut(&Object<'_>) -> ControlFlow<()>) {
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, size: libc::size_t, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the closure passed below; `info` is valid for
        // this call (dl_iterate_phdr's contract).
        let (f, info) = unsafe {
            (
                &mut *(data as *mut &mut dyn FnMut(&Object<'_>) -> ControlFlow<()>),
                &*info,
            )
        };
        // The counters follow the first four fields (glibc since 2.4).
        let loads = (size >= core::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8)
            .then_some((info.dlpi_adds, info.dlpi_subs));
        let name = if info.dlpi_name.is_null() {
            &[][..]
        } else {
            // SAFETY: a non-null dlpi_name is NUL-terminated.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        let base = info.dlpi_addr as usize;
        let mut o = Object {
            id: ObjectId {
                base,
                phdr: info.dlpi_phdr as usize,
            },
            loads,
            name,
            segments: heapless::Vec::new(),
            dynamic: None,
            relro: None,
            namespace: 0,
        };
        // SAFETY: dlpi_phdr points to dlpi_phnum headers.
        let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        let _ = o.take_program_headers(phdrs);
        match f(&o) {
            ControlFlow::Continue(()) => 0,
            ControlFlow::Break(()) => 1,
        }
    }
    let mut f: &mut dyn FnMut(&Object<'_>) -> ControlFlow<()> = &mut f;
    // SAFETY: `visit` has the callback type and `f` outlives the call.
    unsafe {
        crate::fork::iterate_phdr(
            visit,
            (&mut f as *mut &mut dyn FnMut(&Object<'_>) -> ControlFlow<()>).cast(),
        )
    };
}

/// Calls `f` with every object of the loader's other namespaces (those
/// `dlmopen` made; see `crate::namespace`), in each namespace's load
/// order, under the loader's lock (the one `dl_iterate_phdr` holds, which
/// `dlclose` takes to unlink and free an object). Such an object is
/// found through `link_map`'s public fields; its program headers come
/// from its ELF header ([`read_headers`]), and where they cannot, it is
/// its span alone (what `_dl_find_object` says the loader mapped for it),
/// with no dynamic section, so nothing is patched in it. An object
/// `_dl_find_object` does not know yet (still being loaded) is left out
/// and the answer is `true`, unless `mapped_too` and it is mapped
/// already ([`mapped_unrelocated`]: the loader has mapped it and not yet
/// relocated it; only for code that reads the object or patches its code,
/// never its GOT, which the relocation will write); so is a namespace's
/// entry for an object of another (the loader itself, listed in every
/// namespace). `None`, and nothing walked, without `_dl_find_object`
/// (glibc before 2.35, which has no list of namespaces either; or reloc
/// told to do without it).
fn for_each_namespace_object(mapped_too: bool, mut f: impl FnMut(&Object<'_>)) -> Option<bool> {
    let find = FIND_OBJECT.load(Ordering::Acquire);
    if find <= 1 {
        return None;
    }
    if crate::namespace::in_use() == 0 {
        return Some(false);
    }
    struct Walk<'a> {
        f: &'a mut dyn FnMut(&Object<'_>),
        find: usize,
        mapped_too: bool,
        unsettled: bool,
    }
    unsafe extern "C" fn visit(_info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the Walk passed below, alive for the call.
        let walk = unsafe { &mut *(data as *mut Walk<'_>) };
        crate::namespace::for_each_link_map(|l| {
            let Some((start, end, map)) = find_object(walk.find, l.ld) else {
                if walk.mapped_too
                    && let Some(o) = mapped_unrelocated(l)
                {
                    (walk.f)(&o);
                } else {
                    walk.unsettled = true;
                }
                return;
            };
            if map != l.map || start >= end {
                return;
            }
            let mut o = namespace_object(l);
            if !read_headers(&mut o, start) {
                // Its span alone: known and reported, nothing patched.
                o.segments.clear();
                o.dynamic = None;
                o.relro = None;
                let _ = o.segments.push((start, end));
            }
            (walk.f)(&o);
        });
        1 // one call: the walk above covers every namespace
    }
    let mut walk = Walk {
        f: &mut f,
        find,
        mapped_too,
        unsettled: false,
    };
    // SAFETY: `visit` matches the callback type and uses `walk` only
    // during the call.
    unsafe { crate::fork::iterate_phdr(visit, (&raw mut walk).cast()) };
    Some(walk.unsettled)
}

/// A namespace's object that `_dl_find_object` does not know (yet): where
/// its first page, at its load bias, is readable and holds its ELF header,
/// and its dynamic section lies in one of the load segments that header
/// gives, the object as read from there. So an object the loader has
/// mapped, and not yet relocated, is found: the libc of a namespace that
/// `dlmopen` is making, seen from the loader's breakpoint
/// (`crate::namespace::loader_break`). `None` for anything else (an object
/// whose first segment does not map its header at its bias).
fn mapped_unrelocated<'a>(l: &crate::namespace::LinkMap) -> Option<Object<'a>> {
    let page = page_size();
    if l.addr == 0 || !l.addr.is_multiple_of(page) {
        return None;
    }
    // Readable, as the kernel tells it: where the first segment does not
    // map the header at the bias, the page there may be anything, a
    // PROT_NONE gap of this object or another's guard page among them.
    if !crate::host::readable(l.addr, page) {
        return None;
    }
    let mut o = namespace_object(l);
    (read_headers(&mut o, l.addr) && o.holds(l.ld)).then_some(o)
}

/// The object of a namespace's `link_map` `l`, its headers not read yet
/// (no segments). Under the loader's lock, `l` listed.
fn namespace_object<'a>(l: &crate::namespace::LinkMap) -> Object<'a> {
    let name = if l.name == 0 {
        &[][..]
    } else {
        // SAFETY: a link_map's l_name is null or NUL-terminated, and lives
        // while the object is listed (the caller holds the loader's lock).
        unsafe { CStr::from_ptr(l.name as *const c_char) }.to_bytes()
    };
    Object {
        id: ObjectId {
            base: l.addr,
            phdr: l.ld,
        },
        loads: None,
        name,
        segments: heapless::Vec::new(),
        dynamic: None,
        relro: None,
        namespace: l.namespace,
    }
}

/// One namespace's C library, as [`with_namespace_libcs`] finds it.
pub(crate) struct NamespaceLibc {
    /// Its namespace (1 to 15).
    pub(crate) namespace: usize,
    /// Its load bias and dynamic section: which libc it is. (Another
    /// loaded later at the same address has the same; bistro tells them
    /// apart by whether its patches are in the code.)
    #[cfg_attr(not(feature = "bistro"), expect(dead_code, reason = "bistro's"))]
    pub(crate) id: (usize, usize),
    /// Its load segments.
    #[cfg_attr(not(feature = "bistro"), expect(dead_code, reason = "bistro's"))]
    pub(crate) segments: heapless::Vec<(usize, usize), MAX_SEGMENTS>,
    /// The entries of the host functions (in the order of
    /// `crate::host::functions`), 0 where it defines no plain function of
    /// that name inside its segments.
    pub(crate) functions: [usize; crate::host::FUNCTIONS],
}

#[cfg(feature = "bistro")]
impl NamespaceLibc {
    /// Whether `at` and the `len` bytes from it lie in one of its load
    /// segments.
    pub(crate) fn holds(&self, at: usize, len: usize) -> bool {
        at.checked_add(len)
            .is_some_and(|end| self.segments.iter().any(|&(s, e)| s <= at && end <= e))
    }
}

/// Calls `f` with the C library (an object whose path ends in
/// `libc.so.6`) of each of the loader's other namespaces that holds one,
/// under the loader's write lock, inside a `dl_iterate_phdr` callback: the
/// loader unmaps objects under the same lock, so the library's code stays
/// mapped until `f` returns, and `f` may read and write it. `f` must not
/// call into the loader (nor wait for a thread that may). Its functions
/// are found in its own symbol table: no `dlmopen` or `dlsym` into a
/// namespace (a `dlmopen` into one that emptied meanwhile would leave the
/// loader's lock held for good: glibc signals that error without
/// releasing it). A libc the loader has mapped and not yet relocated (a
/// `dlmopen` under way on this thread, seen from the loader's breakpoint)
/// is found too ([`mapped_unrelocated`]): its code and symbol table are
/// in place, and nothing here writes what the relocation will. `false`
/// where the namespaces cannot be walked.
pub(crate) fn with_namespace_libcs(mut f: impl FnMut(&NamespaceLibc)) -> bool {
    let hooks = crate::host::functions();
    let names: [&[u8]; crate::host::FUNCTIONS] = core::array::from_fn(|i| hooks[i].0.to_bytes());
    for_each_namespace_object(true, |o| {
        let Some(functions) = libc_entries(o, &names) else {
            return;
        };
        f(&NamespaceLibc {
            namespace: o.namespace,
            id: (o.id.base, o.id.phdr),
            segments: o.segments.clone(),
            functions,
        });
    })
    .is_some()
}

/// Where `o`, when it is a C library (its path ends in `libc.so.6`),
/// defines `names`, from its own symbol table: each entry 0 where it
/// defines no plain function of that name inside its segments. `None`
/// for another object, or a C library whose dynamic section cannot be
/// read.
fn libc_entries<const K: usize>(o: &Object<'_>, names: &[&[u8]; K]) -> Option<[usize; K]> {
    entries_of(o, b"libc.so.6", names)
}

/// As [`libc_entries`], for the object whose file is named `file`.
fn entries_of<const K: usize>(o: &Object<'_>, file: &[u8], names: &[&[u8]; K]) -> Option<[usize; K]> {
    if o.name.rsplit(|&c| c == b'/').next().unwrap_or(o.name) != file {
        return None;
    }
    let (dynamic, size) = o.dynamic?;
    let d = read_dynamic(o, o.id.base, dynamic, size).ok()?;
    let mut found = [None; K];
    memhook_core::elf::find_functions(o, &d, names, &mut found).ok()?;
    Some(found.map(|v| {
        let entry = v.map_or(0, |v| o.id.base.wrapping_add(v as usize));
        if o.holds(entry) { entry } else { 0 }
    }))
}

/// Where the main namespace's C library (the first object
/// `dl_iterate_phdr` lists whose path ends in `libc.so.6`) defines
/// `names`, read from its own symbol table (see [`libc_entries`]): what
/// bistro patches, so that glibc's own calls (`malloc`'s `mmap`) are
/// caught wherever the global scope's definition lies. `dlsym(RTLD_DEFAULT,
/// ...)` answers an interposer's definition where one comes first (an
/// `mmap` of the program's own, of a preloaded library, or the hook of
/// another instance of memhook in reloc mode, which answers `dlsym` with
/// its hook): a patch there would miss every call glibc makes inside
/// itself, and, for another memhook's hook, every call once that one is
/// uninstalled. `None` where no such object is listed (a static program,
/// another C library) or its symbols cannot be read.
#[cfg(feature = "bistro")]
pub(crate) fn main_libc_entries<const K: usize>(names: &[&[u8]; K]) -> Option<[usize; K]> {
    main_entries_in(b"libc.so.6", names)
}

/// Where the first object `dl_iterate_phdr` lists whose file is named
/// `file` defines `names` (see [`libc_entries`]): `None` where none is
/// listed or its symbols cannot be read.
#[cfg(feature = "bistro")]
pub(crate) fn main_entries_in<const K: usize>(file: &[u8], names: &[&[u8]; K]) -> Option<[usize; K]> {
    let mut entries = None;
    for_each_object_while(|o| match entries_of(o, file, names) {
        Some(found) => {
            entries = Some(found);
            ControlFlow::Break(())
        }
        None => ControlFlow::Continue(()),
    });
    entries
}

/// Fills `o`'s segments, dynamic section and RELRO range from its
/// program headers, read from its ELF header at `start` (where the loader
/// mapped its first segment: the file's first page, for an object whose
/// first segment maps the file from offset 0), as `dl_iterate_phdr` gives
/// them for the main namespace's objects. `false`, with `o` partly
/// filled, where the first page holds no ELF header of this target or
/// its program headers lie past that page.
fn read_headers(o: &mut Object<'_>, start: usize) -> bool {
    let page = page_size();
    if start == 0 || !start.is_multiple_of(page) {
        return false;
    }
    // SAFETY: the first page of a loaded object's first segment, which
    // the loader keeps mapped and readable (it holds the headers it read)
    // while the object is listed; the caller holds the loader's lock.
    let first = unsafe { core::slice::from_raw_parts(start as *const u8, page) };
    let u16_at = |at: usize| first.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64_at = |at: usize| {
        first
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize)
    };
    // e_ident: the magic, ELFCLASS64, little-endian.
    if first.get(..6) != Some(&b"\x7fELF\x02\x01"[..]) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return false;
    };
    if phentsize != size_of::<libc::Elf64_Phdr>()
        || !phoff.is_multiple_of(align_of::<libc::Elf64_Phdr>())
        || phoff.checked_add(phnum * phentsize).is_none_or(|e| e > page)
    {
        return false;
    }
    o.id.phdr = start + phoff;
    // SAFETY: `phnum` headers of their size, aligned, inside the page
    // checked above.
    let phdrs = unsafe { core::slice::from_raw_parts(o.id.phdr as *const libc::Elf64_Phdr, phnum) };
    o.take_program_headers(phdrs) && !o.segments.is_empty()
}

/// Whether memhook must leave `o` alone: itself, the vDSO, the loader.
fn skipped(o: &Object<'_>) -> bool {
    let me = uninstall as *const () as usize;
    if o.segments.iter().any(|&(s, e)| (s..e).contains(&me)) {
        return true;
    }
    let name = o.name;
    let contains = |needle: &[u8]| name.windows(needle.len()).any(|w| w == needle);
    name.starts_with(b"linux-vdso")
        || name.starts_with(b"linux-gate")
        || contains(b"/ld-linux")
        || contains(b"ld-linux-")
}

/// Writes `value` into a GOT slot, around RELRO protection if needed.
fn write_slot(o_relro: Option<(usize, usize)>, slot: usize, value: usize) {
    let in_relro = o_relro.is_some_and(|(s, e)| (s..e).contains(&slot));
    let page = slot & !(page_size() - 1);
    if in_relro {
        // SAFETY: the page holds the object's GOT; making it writable for
        // one store changes nothing else.
        unsafe { libc::mprotect(page as *mut c_void, page_size(), libc::PROT_READ | libc::PROT_WRITE) };
    }
    // SAFETY: a GOT slot is an aligned pointer-sized word of the object's
    // data; callers through it load it atomically (one instruction).
    unsafe { (*(slot as *const AtomicUsize)).store(value, Ordering::Release) };
    if in_relro {
        // SAFETY: as above: back to the loader's protection.
        unsafe { libc::mprotect(page as *mut c_void, page_size(), libc::PROT_READ) };
    }
}

fn read_slot(slot: usize) -> usize {
    // SAFETY: an aligned word of the object's data (see write_slot).
    unsafe { (*(slot as *const AtomicUsize)).load(Ordering::Acquire) }
}

/// For another namespace's object in reloc mode: the namespaces that hold
/// a libc, after their hooks' originals are refreshed (once per scan, on
/// the first such object: see `crate::namespace::refresh_reloc_originals`).
fn libcs_for(o: &Object<'_>, refreshed: &mut Option<u32>) -> u32 {
    if o.namespace == 0 || !crate::namespace::reloc_follows() {
        return 0;
    }
    *refreshed.get_or_insert_with(crate::namespace::refresh_reloc_originals)
}

/// The names whose GOT slots are rewritten, from one symbol on, and which
/// symbol each is: made once a scan, for every object it patches.
struct Wanted {
    names: heapless::Vec<&'static [u8], MAX_SYMBOLS>,
    which: heapless::Vec<u8, MAX_SYMBOLS>,
}

impl Wanted {
    fn of(symbols: &[Symbol], from: usize) -> Self {
        let mut wanted = Wanted {
            names: heapless::Vec::new(),
            which: heapless::Vec::new(),
        };
        for (i, s) in symbols.iter().enumerate().skip(from).filter(|(_, s)| s.slots) {
            // Both hold every symbol.
            let _ = wanted.names.push(s.name.to_bytes());
            let _ = wanted.which.push(i as u8);
        }
        wanted
    }
}

/// One pass over `o`'s relocations: patches every slot that names one of
/// `wanted`. In another namespace's object, only the host functions'
/// slots, and only where the namespace holds a libc (`libcs`, bit per
/// namespace, from [`libcs_for`]: none unless reloc follows the
/// namespaces) whose definitions its hooks' originals are.
fn patch_object(state: &mut State, o: &Object<'_>, wanted: &Wanted, libcs: u32) {
    let Some((dynamic, size)) = o.dynamic else {
        return;
    };
    if o.namespace != 0 && libcs & (1 << o.namespace) == 0 {
        return; // another namespace's object: its span alone
    }
    if wanted.names.is_empty() {
        return; // nothing to look for
    }
    let d = match read_dynamic(o, o.id.base, dynamic, size) {
        Ok(d) => d,
        Err(_) => {
            state.malformed += 1;
            return;
        }
    };
    let mut found: heapless::Vec<(usize, u8), 256> = heapless::Vec::new();
    let mut pending_overflow = false;
    let walk = for_each_named_reloc(
        o,
        o.id.base,
        &d,
        &[R_JUMP_SLOT, R_GLOB_DAT],
        &wanted.names,
        |r: Reloc, i| {
            if found.push((r.slot, wanted.which[i])).is_err() {
                pending_overflow = true;
                return ControlFlow::Break(());
            }
            ControlFlow::Continue(())
        },
    );
    if walk.is_err() {
        state.malformed += 1;
    }
    for &(slot, symbol) in &found {
        if !o.segments.iter().any(|&(s, e)| s <= slot && slot + 8 <= e) {
            continue;
        }
        let sym = state.symbols[symbol as usize];
        // In another namespace's object, only the host functions, and
        // their hooks for that namespace (calling its libc).
        let (hook, original) = if o.namespace == 0 {
            (sym.hook, sym.original)
        } else {
            match crate::namespace::reloc_hook(o.namespace, sym.name.to_bytes()) {
                Some(h) => h,
                None => continue,
            }
        };
        let old = read_slot(slot);
        if old == hook {
            continue;
        }
        // 0: a weak reference the loader found no definition for. The
        // object tests it for the function's absence, and the loader never
        // binds it later: it stays 0, whatever memhook's original (a hook
        // there would make the function present, with no original behind
        // it where none is defined anywhere).
        if old == 0 {
            continue;
        }
        if original.load(Ordering::Acquire) == 0 {
            if o.namespace != 0 {
                continue; // its libc defines no such function
            }
            // Not in the global scope: a slot bound to another object's
            // definition gives it. A value inside this object is its own
            // PLT stub (lazy binding): leave the slot for now.
            if o.holds(old) {
                continue;
            }
            original.store(old, Ordering::Release);
        }
        if state
            .slots
            .push(Slot {
                object: o.id,
                slot,
                old,
                symbol,
                hook,
            })
            .is_err()
        {
            state.overflow = true;
            break;
        }
        write_slot(o.relro, slot, hook);
    }
    state.overflow |= pending_overflow;
}

/// The span the loader mapped for `o`: its first to its last load
/// segment, in whole pages (the holes between segments are the object's
/// too, kept inaccessible).
fn span_of(o: &Object<'_>) -> (usize, usize) {
    let page = page_size();
    let start = o.segments.iter().map(|&(s, _)| s).min().unwrap_or(0) & !(page - 1);
    let end = o.segments.iter().map(|&(_, e)| e).max().unwrap_or(0);
    (start, end.checked_next_multiple_of(page).unwrap_or(end))
}

/// Patches the objects not seen yet (all symbols) and, when `from` is below
/// the symbol count, the known objects for the symbols from `from` on.
/// With `report` (a rescan after `dlopen`/`dlclose`, not an install's
/// first look) and [`LOADER_EVENTS`], records the spans of the objects
/// that appeared and vanished as [`Change`]s. A rescan that finds the
/// loader's counts of loads and unloads as the last scan left them stops
/// at the first object: nothing came or went.
fn scan(state: &mut State, from: usize, report: bool, listed: Option<&Listed>) {
    let report = report && LOADER_EVENTS.load(Ordering::Acquire);
    let (wanted_from, wanted_all) = (Wanted::of(&state.symbols, from), Wanted::of(&state.symbols, 0));
    let rescan = from >= state.symbols.len();
    let scans = state.scans.wrapping_add(1);
    state.scans = scans;
    let (mut first, unchanged, mut loads) = (true, core::cell::Cell::new(false), None);
    // An object still being loaded is left for a later scan (which then
    // must not stop early).
    let mut unsettled = false;
    // Objects come in load order, as they were recorded: the next known
    // one is usually the one after the last found.
    let mut next = 0;
    // In reloc mode, the other namespaces' hooks get their libcs'
    // definitions as originals before the first of their objects is
    // looked at, in the walk of those objects (under the loader's write
    // lock, so that the libcs are the ones whose objects are patched).
    let mut with_libc: Option<u32> = None;
    let mut visit = |o: &Object<'_>| {
        if core::mem::take(&mut first) {
            loads = o.loads;
            if rescan && loads.is_some() && loads == state.loads {
                unchanged.set(true);
                return ControlFlow::Break(());
            }
        }
        if skipped(o) {
            return ControlFlow::Continue(());
        }
        let name = name_hash(o.name);
        let objects = &mut state.objects;
        let known = if objects.get(next).is_some_and(|k| k.id == o.id) {
            Some(next)
        } else {
            objects.iter().position(|k| k.id == o.id)
        };
        // Another library at the address of one unloaded since the last
        // scan: the old one went, a new one came.
        let replaced = known.filter(|&i| {
            objects[i].name != name
                || objects[i]
                    .check
                    .is_some_and(|(slot, hook)| !o.holds(slot) || read_slot(slot) != hook)
        });
        if let (Some(i), None) = (known, replaced) {
            objects[i].seen = scans;
            next = i + 1;
            if !rescan {
                let libcs = libcs_for(o, &mut with_libc);
                patch_object(state, o, &wanted_from, libcs);
            }
            return ControlFlow::Continue(());
        }
        if !settled(o, listed) {
            unsettled = true;
            return ControlFlow::Continue(());
        }
        let span = span_of(o);
        let new = Known {
            id: o.id,
            name,
            span,
            seen: scans,
            foreign: o.namespace != 0,
            check: None,
        };
        if let Some(i) = replaced {
            let old = core::mem::replace(&mut objects[i], new);
            next = i + 1;
            state.slots.retain(|s| s.object != old.id);
            if report {
                let _ = state.changes.push_back(Change {
                    mapped: false,
                    span: old.span,
                });
            }
        } else {
            if objects.push(new).is_err() {
                state.overflow = true;
                return ControlFlow::Continue(());
            }
            next = objects.len();
        }
        if report {
            let _ = state.changes.push_back(Change { mapped: true, span });
        }
        let libcs = libcs_for(o, &mut with_libc);
        patch_object(state, o, &wanted_all, libcs);
        let check = state
            .slots
            .iter()
            .rev()
            .take_while(|s| s.object == o.id)
            .last()
            .map(|s| (s.slot, s.hook));
        if let Some(k) = state.objects.get_mut(next - 1) {
            k.check = check;
        }
        ControlFlow::Continue(())
    };
    for_each_object_while(&mut visit);
    // The other namespaces' objects: known, and their loads and unloads
    // reported, as the main namespace's; in reloc mode their host
    // functions' slots patched (see `patch_object`). (Not when the
    // loader's counts say nothing came or went: they count every
    // namespace's.)
    if unchanged.get() {
        return;
    }
    let walked = for_each_namespace_object(false, |o| {
        let _ = visit(o);
    });
    unsettled |= walked == Some(true);
    if walked.is_none() {
        // Not looked at: not gone.
        for k in state.objects.iter_mut().filter(|k| k.foreign) {
            k.seen = scans;
        }
    }
    state.loads = if unsettled { None } else { loads };
    // Objects that are gone (dlclose): forget them and their slots.
    if state.objects.iter().all(|k| k.seen == scans) {
        return;
    }
    state.forget_gone(scans, report);
}

impl State {
    /// Forgets the objects the scan `scans` did not find (unloaded) and
    /// their slots, recording their unmaps where `report`. Up to [`GONE`]
    /// at a time: a list of every object's would take 32 KiB of the stack
    /// of the thread whose `dlopen` or `dlclose` the scan follows (a
    /// `dlclose` usually unloads one library and its few dependencies).
    fn forget_gone(&mut self, scans: u32, report: bool) {
        let State {
            objects,
            changes,
            slots,
            ..
        } = self;
        loop {
            let mut gone: heapless::Vec<ObjectId, GONE> = heapless::Vec::new();
            objects.retain(|k| {
                if k.seen == scans || gone.push(k.id).is_err() {
                    return true; // alive, or for the next round
                }
                if report {
                    let _ = changes.push_back(Change {
                        mapped: false,
                        span: k.span,
                    });
                }
                false
            });
            if gone.is_empty() {
                return;
            }
            slots.retain(|s| !gone.contains(&s.object));
        }
    }
}

/// How many unloaded objects [`State::forget_gone`] takes at a time.
const GONE: usize = 32;

/// Reports the loader's changes that rescans recorded
/// (`crate::host::loader_changed`), one at a time, outside the state's
/// lock. Where another thread holds the state, they wait for the next
/// call: after every interposed `dlopen` and `dlclose`, and at the end of
/// an install or uninstall (whose rescans may have found changes for a
/// `dlopen` on another thread), once no memhook lock is held: handlers
/// run here.
pub(crate) fn report_changes() {
    loop {
        let Some(change) = STATE.try_lock().and_then(|mut s| s.changes.pop_front()) else {
            return;
        };
        crate::host::loader_changed(change.mapped, change.span.0, change.span.1);
    }
}

/// Hooks each `(symbol, hook, original)` in every loaded object and in
/// objects loaded later. `original` receives, before any slot points to the
/// hook, the address of the function the symbol resolves to (0 until known
/// for a symbol that only `RTLD_LOCAL` objects define and no slot has bound
/// yet; such slots are patched once a bound one shows the definition).
///
/// # Safety
///
/// Each hook must have its symbol's signature and ABI, and call the
/// original (if at all) through its `original`.
///
/// # Errors
///
/// A [`RelocError`]. [`RelocError::TooManySymbols`] and
/// [`RelocError::Conflict`] change nothing (no symbol is recorded, no slot
/// rewritten); with [`RelocError::TooManySlots`] every symbol is hooked,
/// in the slots that fit.
pub unsafe fn install(hooks: &[(&'static CStr, usize, &'static AtomicUsize)]) -> Result<(), RelocError> {
    let mut entries: heapless::Vec<Entry, MAX_SYMBOLS> = heapless::Vec::new();
    for &(name, hook, original) in hooks {
        entries
            .push(Entry {
                name,
                hook,
                original,
                slots: true,
                answer: Some(original),
            })
            .map_err(|_| RelocError::TooManySymbols)?;
    }
    // SAFETY: forwarded from the caller.
    unsafe { install_with(&entries) }
}

/// [`install`] with a choice per symbol: rewrite its slots, answer `dlsym`
/// of it, or both. With neither it only makes sure that `dlopen`, `dlclose`
/// and `dlsym` are interposed (see [`on_objects_changed`]).
///
/// # Safety
///
/// As for [`install`].
///
/// # Errors
///
/// As for [`install`].
pub unsafe fn install_with(entries: &[Entry]) -> Result<(), RelocError> {
    look_up_find_object();
    with_listing(|listed| {
        INSTALLING.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded from the caller.
        let result = unsafe { install_locked(entries, listed) };
        INSTALLING.fetch_sub(1, Ordering::SeqCst);
        result
    })
}

/// [`install_with`] itself, marked as an install in progress.
///
/// # Safety
///
/// As for [`install`].
unsafe fn install_locked(entries: &[Entry], listed: Option<&Listed>) -> Result<(), RelocError> {
    let mut state = STATE.lock();
    // All or nothing: a symbol recorded and left unscanned would pass for
    // hooked (a later install skips it) with no slot rewritten.
    let mut new = 0;
    for e in entries {
        match state.symbols.iter().find(|s| s.name == e.name) {
            Some(s) if s.hook != e.hook => return Err(RelocError::Conflict),
            Some(_) => {}
            None => new += 1,
        }
    }
    if !has_dl_hooks(&state) {
        new += DL_ENTRIES;
    }
    if state.symbols.len() + new > MAX_SYMBOLS {
        return Err(RelocError::TooManySymbols);
    }
    let from = state.symbols.len();
    let defined = maybe_defined(entries.len(), |i| {
        let name = entries[i].name;
        (!state.symbols.iter().any(|s| s.name == name)).then_some(name)
    });
    for (i, e) in entries.iter().enumerate() {
        if let Some(s) = state.symbols.iter().find(|s| s.name == e.name) {
            e.original.store(s.original.load(Ordering::Acquire), Ordering::Release);
            continue;
        }
        let global = if i >= 128 || defined & 1 << i != 0 {
            // SAFETY: a NUL-terminated name and the RTLD_DEFAULT pseudo-handle.
            unsafe { libc::dlsym(libc::RTLD_DEFAULT, e.name.as_ptr()) as usize }
        } else {
            0 // no loaded object defines it: learnt from a bound slot later
        };
        e.original.store(global, Ordering::Release);
        state
            .symbols
            .push(Symbol {
                name: e.name,
                hook: e.hook,
                original: e.original,
                slots: e.slots,
                answer: e.answer,
            })
            .map_err(|_| RelocError::TooManySymbols)?;
    }
    ensure_dl_hooks(&mut state)?;
    publish(&state);
    scan(&mut state, from, false, listed);
    rescan_pending(&mut state, listed);
    if state.overflow {
        Err(RelocError::TooManySlots)
    } else {
        Ok(())
    }
}

/// Which of `count` names (bit `i` for `name(i)`, `None` for one not
/// wanted; past 128, none looked at) some loaded object defines, or may
/// (tables that cannot say), read from their own symbol tables: the names
/// worth a `dlsym(RTLD_DEFAULT)`. Where no object defines a name, glibc's
/// `dlsym` allocates an error message (`malloc`, the program's
/// allocator): the CUDA hooks' 60-odd names, in a process that has not
/// loaded CUDA yet, did that 65 times an install, and an allocator that
/// installs memhook from inside its first `malloc` must not be entered
/// again (`ffi/examples/no_malloc.c`). A name that only objects loaded
/// `RTLD_LOCAL` define is still asked, and not found (libcuda, as
/// libcudart loads it, is one).
#[inline(never)]
fn maybe_defined(count: usize, name: impl Fn(usize) -> Option<&'static CStr>) -> u128 {
    let count = count.min(128);
    let wanted = (0..count).filter(|&i| name(i).is_some()).fold(0u128, |m, i| m | 1 << i);
    let mut found = 0u128;
    if wanted == 0 {
        return 0;
    }
    for_each_object_while(|o| {
        let d = o
            .dynamic
            .and_then(|(at, size)| read_dynamic(o, o.id.base, at, size).ok());
        for i in 0..count {
            if wanted & !found & 1 << i == 0 {
                continue;
            }
            let Some(n) = name(i) else { continue };
            let maybe = d
                .as_ref()
                .is_none_or(|d| memhook_core::elf::defines(o, d, n.to_bytes()) != Some(false));
            if maybe {
                found |= 1 << i;
            }
        }
        if wanted & !found == 0 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    found
}

/// `dlsym(RTLD_DEFAULT, name)`, asked only where some loaded object
/// defines `name` (see [`maybe_defined`]): 0 otherwise, with nothing
/// allocated.
pub(crate) fn global_definition(name: &'static CStr) -> usize {
    if maybe_defined(1, |_| Some(name)) == 0 {
        return 0;
    }
    // SAFETY: a NUL-terminated name and the RTLD_DEFAULT pseudo-handle.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

/// Restores every slot memhook wrote, in every object still loaded, and
/// forgets every symbol (the dlopen/dlclose hooks included).
pub fn uninstall() {
    let mut state = STATE.lock();
    // Object by object, inside the loader's walk of them: under its write
    // lock, which a dlclose takes before it unmaps anything, so an object
    // listed stays mapped while its slots are put back (another thread's
    // dlclose can come between a walk and a later write). An object not
    // listed is gone: its slots are never touched again.
    let slots = &state.slots;
    let put_back = |o: &Object<'_>| {
        // Newest first, so a slot patched twice ends with its first value.
        for s in slots.iter().rev().filter(|s| s.object == o.id) {
            if o.holds(s.slot) && read_slot(s.slot) == s.hook {
                write_slot(o.relro, s.slot, s.old);
            }
        }
    };
    for_each_object(put_back);
    // The other namespaces' objects. (Their list cannot be walked
    // without _dl_find_object, and then none was patched.)
    let _ = for_each_namespace_object(false, put_back);
    state.slots.clear();
    state.symbols.clear();
    state.objects.clear();
    state.loads = None;
    state.overflow = false;
    publish(&state);
}

/// How reloc stands: symbols hooked, slots patched, objects known, objects
/// skipped as malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelocStatus {
    /// Symbols hooked (dlopen and dlclose included).
    pub symbols: usize,
    /// Slots currently patched.
    pub slots: usize,
    /// Loaded objects known.
    pub objects: usize,
    /// Objects whose dynamic section could not be read.
    pub malformed: usize,
}

/// The current [`RelocStatus`].
pub fn status() -> RelocStatus {
    let s = STATE.lock();
    RelocStatus {
        symbols: s.symbols.len(),
        slots: s.slots.len(),
        objects: s.objects.len(),
        malformed: s.malformed,
    }
}

/// Slots currently patched for `symbol`.
pub fn slots_of(symbol: &CStr) -> usize {
    let s = STATE.lock();
    let Some(i) = s.symbols.iter().position(|x| x.name == symbol) else {
        return 0;
    };
    s.slots.iter().filter(|x| x.symbol as usize == i).count()
}

// dlopen and dlclose, interposed through reloc, so that objects loaded later
// are patched as they appear, and unloaded ones forgotten.
//
// glibc's dlopen takes its caller from its return address, and the caller
// decides three things: where a bare name is searched (the caller's
// DT_RUNPATH, or else the DT_RPATHs of the caller and of the objects that
// loaded it), what `$ORIGIN` means, and the namespace the object joins. A
// hook that calls dlopen itself is the caller: a
// library with `RUNPATH=$ORIGIN` that opens a sibling by name would fail
// to find it, under memhook only. So dlopen's entry, like dlsym's, is a
// few instructions of assembly that ask `dlopen_decide`: where memhook's
// call finds exactly what the caller's would (no `$` in the name, the
// caller in memhook's namespace, and for a bare name no DT_RUNPATH in the
// caller or in memhook's own object and no DT_RPATH outside the main
// program: a cautious condition, as no object's chain of loaders can be
// read),
// the hook calls dlopen and rescans when it returns; otherwise the entry
// tail-jumps into the real dlopen, which then sees the caller's return
// address as without memhook, and the objects it loads are scanned at this
// thread's next dlsym, dlvsym, dlopen or dlclose (or `refresh`).

static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `dlopen_decide`'s answer meaning "call dlopen from the hook".
const THROUGH: usize = 0;

/// Set once a dlopen has been passed to the real function unwatched: from
/// then on a dlclose rescans before it runs as well, so that an object that
/// was loaded that way and not scanned since is known, and its unload
/// reported.
static PASSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set when this thread passed a dlopen to the real function: its
    /// next dlsym, dlvsym, dlopen or dlclose (necessarily after that
    /// dlopen's objects are in the loader's list) rescans.
    static UNSEEN: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Rescans if this thread passed a dlopen since its last rescan.
fn catch_up() {
    if crate::fork::loader_lock_stuck() {
        return; // nothing came or went, and a walk would wait for good
    }
    if UNSEEN.try_with(|u| u.replace(false)).unwrap_or(false) {
        rescan();
        changed();
    }
    // A library opened with dlmopen, in a namespace of its own, is looked
    // into with dlsym before it is called: its libc is hooked by then,
    // and the objects dlmopen loaded are known (and reported). dlmopen
    // itself is not interposed. A rescan that finds the loader's counts
    // unchanged stops at the first object.
    if crate::namespace::in_use() != 0 {
        #[cfg(feature = "bistro")]
        crate::namespace::check();
        rescan();
    }
}

/// Called by the dlopen entry with dlopen's `file` and the caller's
/// return address: [`THROUGH`] when memhook's own call to dlopen finds
/// exactly what the caller's would, else [`PASS`] (the entry then
/// tail-jumps into the real dlopen).
extern "C" fn dlopen_decide(file: *const c_char, caller: usize) -> usize {
    catch_up();
    // SAFETY: dlopen's contract: `file` is null or a NUL-terminated string.
    if file.is_null() || same_from_memhook(unsafe { CStr::from_ptr(file) }.to_bytes(), caller) {
        return THROUGH;
    }
    PASSED.store(true, Ordering::SeqCst);
    let _ = UNSEEN.try_with(|u| u.set(true));
    PASS
}

/// Whether an object other than the main program has a `DT_RPATH`, as
/// the last look found it: `rpath_key` of the loader's counts then, with
/// the answer in bit 0 (all ones: no look yet).
static RPATH_SEEN: AtomicU64 = AtomicU64::new(u64::MAX);

/// The loader's counts of loads and unloads, folded into one word with
/// bit 0 clear (a count would have to wrap 2^31 times to repeat one).
fn rpath_key((adds, subs): (u64, u64)) -> u64 {
    (adds << 32 | (subs & 0x7fff_ffff) << 1) & !1 & !(1 << 63)
}

/// Whether glibc's dlopen of `file` from memhook's object loads what it
/// would from the object that holds `caller` (see the comment above).
fn same_from_memhook(file: &[u8], caller: usize) -> bool {
    if file.contains(&b'$') || crate::fork::loader_lock_stuck() {
        return false;
    }
    // A path is opened as it is: only the namespace is the caller's (the
    // new object's own dependencies are not searched from the caller:
    // glibc forgets the caller once the file is found).
    let bare = !file.contains(&b'/');
    let me = memhook_dlopen as *const () as usize;
    let (mut caller_runpath, mut my_runpath) = (None, None);
    // Whether some library has a DT_RPATH: from the last look while the
    // loader's counts are the same, else looked for now.
    let (mut key, mut known, mut rpath) = (None, None, false);
    let mut first = true;
    for_each_object(|o| {
        let (is_caller, is_me) = (o.holds(caller), o.holds(me));
        if !bare {
            if is_caller {
                caller_runpath = Some(false);
            }
            return;
        }
        // The main program comes first; its DT_RPATH is searched from any
        // caller without a DT_RUNPATH, memhook's object included.
        let main = core::mem::take(&mut first);
        if main {
            key = o.loads.map(rpath_key);
            let seen = RPATH_SEEN.load(Ordering::Relaxed);
            known = key.filter(|&k| seen & !1 == k).map(|_| seen & 1 == 1);
        }
        if (main || known.is_some()) && !is_caller && !is_me {
            return;
        }
        let paths = o.search_paths();
        rpath |= paths.rpath && !main;
        if is_caller {
            caller_runpath = Some(paths.runpath);
        }
        if is_me {
            my_runpath = Some(paths.runpath);
        }
    });
    let rpath = match (known, key) {
        (Some(seen), _) => seen,
        (None, Some(key)) => {
            RPATH_SEEN.store(key | u64::from(rpath), Ordering::Relaxed);
            rpath
        }
        (None, None) => rpath,
    };
    match (caller_runpath, my_runpath) {
        // The caller is not in memhook's namespace (or in no object).
        (None, _) => false,
        _ if !bare => true,
        (Some(theirs), Some(mine)) => !rpath && !theirs && !mine,
        (Some(_), None) => false,
    }
}

/// dlopen called from the hook (what the entry jumps to for [`THROUGH`]).
unsafe extern "C" fn memhook_dlopen(file: *const c_char, mode: c_int) -> *mut c_void {
    // SAFETY: REAL_DLOPEN holds dlopen's original (set before this hook is
    // installed) and the arguments are the caller's.
    let handle = unsafe { core::mem::transmute::<usize, DlopenFn>(REAL_DLOPEN.load(Ordering::Acquire))(file, mode) };
    if !handle.is_null() {
        rescan();
        changed();
    }
    handle
}

unsafe extern "C" fn memhook_dlclose(handle: *mut c_void) -> c_int {
    catch_up();
    if PASSED.load(Ordering::SeqCst) && crate::namespace::in_use() == 0 {
        // Another thread's unwatched dlopen may have loaded what this
        // unloads: know it first, so that its unmapping is reported.
        // (Where namespaces are in use, catch_up has just rescanned: a
        // dlmopen is never watched.)
        rescan();
    }
    // SAFETY: as for dlopen.
    let rc = unsafe { core::mem::transmute::<usize, DlcloseFn>(REAL_DLCLOSE.load(Ordering::Acquire))(handle) };
    // A namespace whose last library went took its libc with it: its
    // patches are forgotten (and a namespace made at its index later is
    // hooked afresh).
    #[cfg(feature = "bistro")]
    crate::namespace::check();
    rescan();
    changed();
    rc
}

/// Called after every interposed `dlopen` and `dlclose`.
static ON_CHANGE: AtomicUsize = AtomicUsize::new(0);

/// Has `f` called after every `dlopen` and `dlclose` that went through a
/// slot memhook rewrote (once reloc is installed), after reloc has patched
/// the new objects (for a `dlopen` passed on to glibc with its caller's
/// return address, at that thread's next `dlsym`, `dlvsym`, `dlopen` or
/// `dlclose`). `f` runs on the caller's thread, outside memhook's
/// locks, possibly inside a library constructor that holds the loader's
/// lock: it must not wait for a lock that a thread calling into the loader
/// may hold.
pub fn on_objects_changed(f: fn()) {
    ON_CHANGE.store(f as usize, Ordering::Release);
}

fn changed() {
    let f = ON_CHANGE.load(Ordering::Acquire);
    if f != 0 {
        // SAFETY: only `on_objects_changed` stores here, a `fn()`.
        unsafe { core::mem::transmute::<usize, fn()>(f)() };
    }
}

/// Scans for objects loaded or unloaded by calls memhook did not see (a
/// `dlopen` from memhook's own object: the program itself when memhook is
/// linked in as a Rust crate), then runs the [`on_objects_changed`]
/// callback.
pub fn refresh() {
    rescan();
    changed();
}

/// Set when a dlopen or dlclose could not take the state (an install in
/// progress, possibly waiting for the loader lock this thread holds inside a
/// constructor): the holder rescans before it lets go.
static RESCAN: AtomicBool = AtomicBool::new(false);

/// Installs in progress: they hold the state while they call `dlsym`,
/// which takes the loader's lock.
static INSTALLING: AtomicUsize = AtomicUsize::new(0);

/// Scans for new and vanished objects and reports what the loader mapped
/// and unmapped. Where another thread's scan holds the state, waits for
/// it (a scan never waits for the loader's lock), so that the objects
/// this thread's dlopen loaded are hooked before the caller can call into
/// them; where an install holds it, does not wait (the install may be
/// waiting for the loader lock this thread holds inside a constructor):
/// the install rescans before it lets go.
fn rescan() {
    if crate::fork::loader_lock_stuck() {
        return; // as in `catch_up`
    }
    // Without `_dl_find_object`: where the listing could not tell a listed
    // object from a new one at its address (another thread unloaded and
    // loaded meanwhile), the scan left it out, which may be this thread's
    // own library, relocated and about to be called: list again (each
    // time after the loads in progress), up to RELISTS times.
    for _ in 0..RELISTS {
        RESCAN.store(true, Ordering::SeqCst);
        let again = with_listing(|listed| {
            rescan_with(listed);
            listed.is_some_and(|l| l.ambiguous.get())
        });
        if !again {
            break;
        }
    }
    report_changes();
    // A host function no object defined at the install (shm_open, in
    // librt before glibc 2.34) is patched once a library brings it.
    #[cfg(feature = "bistro")]
    crate::install::objects_changed();
}

/// Most listings a rescan makes where each one leaves an object out for
/// its address's reuse (see [`rescan`]).
const RELISTS: usize = 16;

/// Calls `f` with the objects listed before the wait for loads in
/// progress ([`listed_settled`]) where `_dl_find_object` is missing, else
/// with `None`. The listing's 32 KiB of ids lie in a [`ListingRoom`],
/// never on the stack: the rescans after every `dlopen` and `dlclose`
/// memhook interposes run on whatever thread calls them.
fn with_listing<R>(f: impl FnOnce(Option<&Listed<'_>>) -> R) -> R {
    #[cold]
    #[inline(never)]
    fn listed<R>(f: impl FnOnce(Option<&Listed<'_>>) -> R) -> R {
        let mut room = ListingRoom::take();
        let listed = listed_settled(room.ids());
        f(listed.as_ref())
    }
    if FIND_OBJECT.load(Ordering::Acquire) == 1 {
        listed(f)
    } else {
        f(None)
    }
}

/// Takes the state (or leaves the work to an install under way) and runs
/// the scans asked for. With a listing (no `_dl_find_object`), at least
/// one scan with it: a thread that held the state meanwhile may have
/// taken this one's request and scanned with a listing of its own, made
/// before this thread's library was loaded, which left it out.
fn rescan_with(listed: Option<&Listed>) {
    loop {
        if let Some(mut state) = STATE.try_lock() {
            if listed.is_some() {
                RESCAN.store(true, Ordering::SeqCst);
            }
            rescan_pending(&mut state, listed);
            break;
        }
        if INSTALLING.load(Ordering::SeqCst) != 0 {
            break;
        }
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

/// Runs the scans that dlopen/dlclose asked for while the state was held.
fn rescan_pending(state: &mut State, listed: Option<&Listed>) {
    while RESCAN.swap(false, Ordering::SeqCst) {
        let n = state.symbols.len();
        scan(state, n, true, listed);
    }
}

/// How many of the loader's functions memhook interposes.
pub(crate) const DL_ENTRIES: usize = 4;

/// The loader's four functions memhook interposes: name, memhook's entry
/// for it, and where the entry finds the function it stands for.
pub(crate) fn dl_entries() -> [(&'static CStr, usize, &'static AtomicUsize); DL_ENTRIES] {
    unsafe extern "C" {
        fn memhook_dlopen_entry();
        fn memhook_dlsym_entry();
        fn memhook_dlvsym_entry();
    }
    [
        (c"dlopen", memhook_dlopen_entry as *const () as usize, &REAL_DLOPEN),
        (c"dlclose", memhook_dlclose as *const () as usize, &REAL_DLCLOSE),
        (c"dlsym", memhook_dlsym_entry as *const () as usize, &REAL_DLSYM),
        (c"dlvsym", memhook_dlvsym_entry as *const () as usize, &REAL_DLVSYM),
    ]
}

/// Set while the four functions of [`dl_entries`] are bistro-patched to
/// the entries (the host hooks alone, in bistro mode), which then find
/// the functions in their trampolines: a reloc install keeps those as
/// the originals (the functions' own addresses lead back into the
/// entries).
pub(crate) static BISTRO_DL: AtomicBool = AtomicBool::new(false);

/// Records the loaded objects (their spans, for the loader's events)
/// without hooking anything in them: for the host hooks alone in bistro
/// mode, where bistro patches of the loader's functions call the rescans.
pub(crate) fn follow_objects() {
    look_up_find_object();
    with_listing(|listed| {
        let mut state = STATE.lock();
        let n = state.symbols.len();
        scan(&mut state, n, false, listed);
        rescan_pending(&mut state, listed);
    });
}

/// Whether the loader's functions ([`dl_entries`]) are among the symbols.
fn has_dl_hooks(state: &State) -> bool {
    state.symbols.iter().any(|s| s.name == c"dlopen")
}

fn ensure_dl_hooks(state: &mut State) -> Result<(), RelocError> {
    if has_dl_hooks(state) {
        return Ok(());
    }
    for (name, hook, real) in dl_entries() {
        let original = if BISTRO_DL.load(Ordering::Acquire) {
            real.load(Ordering::Acquire)
        } else {
            // SAFETY: as in install.
            unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
        };
        if original == 0 {
            return Err(RelocError::NoDefinition);
        }
        real.store(original, Ordering::Release);
        state
            .symbols
            .push(Symbol {
                name,
                hook,
                original: real,
                slots: true,
                answer: Some(real),
            })
            .map_err(|_| RelocError::TooManySymbols)?;
    }
    Ok(())
}

// dlsym and dlvsym, interposed through reloc, so that a lookup of a hooked
// symbol returns the hook (what the procaddr mode builds on).
//
// glibc resolves RTLD_NEXT and RTLD_DEFAULT relative to the caller's object,
// found from the return address. So the entries are a few instructions of
// assembly: they ask `dl_decide` with the caller's return address, and for
// a name that is not hooked (nearly every lookup) they tail-jump into the
// real function, which then sees the caller's return address and answers
// exactly as without memhook. For a hooked name, the real answer is found
// (RTLD_NEXT by walking the objects after the caller's), and the hook is
// returned only when that answer is the very function hooked: an
// interposer that asks for the next `mmap` past itself still gets libc's,
// so no call loops back through memhook.

static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);
static REAL_DLVSYM: AtomicUsize = AtomicUsize::new(0);

/// `dl_decide`'s answer meaning "let the real function answer".
const PASS: usize = 1;
const RTLD_NEXT: usize = usize::MAX;

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".text",
    ".globl memhook_dlopen_entry",
    ".hidden memhook_dlopen_entry",
    ".type memhook_dlopen_entry, @function",
    ".p2align 4",
    "memhook_dlopen_entry:",
    "endbr64",
    "push rdi",
    "push rsi",
    "sub rsp, 8",
    "mov rsi, [rsp + 24]", // the caller's return address
    "call {decide_open}",
    "add rsp, 8",
    "pop rsi",
    "pop rdi",
    "cmp rax, 1",
    "je 4f",
    "jmp {through}", // THROUGH: the hook, with this return address
    "4:",
    "jmp qword ptr [rip + {real_dlopen}]",
    ".globl memhook_dlsym_entry",
    ".hidden memhook_dlsym_entry",
    ".type memhook_dlsym_entry, @function",
    ".p2align 4",
    "memhook_dlsym_entry:",
    "endbr64",
    "push rdi",
    "push rsi",
    "sub rsp, 8",
    "mov rdx, [rsp + 24]", // the caller's return address
    "xor ecx, ecx",        // no version
    "call {decide}",
    "add rsp, 8",
    "pop rsi",
    "pop rdi",
    "cmp rax, 1",
    "je 2f",
    "ret",
    "2:",
    "jmp qword ptr [rip + {real_dlsym}]",
    ".globl memhook_dlvsym_entry",
    ".hidden memhook_dlvsym_entry",
    ".type memhook_dlvsym_entry, @function",
    ".p2align 4",
    "memhook_dlvsym_entry:",
    "endbr64",
    "push rdi",
    "push rsi",
    "push rdx",
    "mov rcx, rdx",        // the version
    "mov rdx, [rsp + 24]", // the caller's return address
    "call {decide}",
    "pop rdx",
    "pop rsi",
    "pop rdi",
    "cmp rax, 1",
    "je 3f",
    "ret",
    "3:",
    "jmp qword ptr [rip + {real_dlvsym}]",
    decide = sym dl_decide,
    decide_open = sym dlopen_decide,
    through = sym memhook_dlopen,
    real_dlopen = sym REAL_DLOPEN,
    real_dlsym = sym REAL_DLSYM,
    real_dlvsym = sym REAL_DLVSYM,
);

// The same on aarch64: the caller's return address is x30, which the real
// function must see unchanged, so the entries restore it before the tail
// jump.
#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".text",
    ".globl memhook_dlopen_entry",
    ".hidden memhook_dlopen_entry",
    ".type memhook_dlopen_entry, %function",
    ".p2align 4",
    "memhook_dlopen_entry:",
    "bti c",
    "stp x29, x30, [sp, #-32]!",
    "mov x29, sp",
    "stp x0, x1, [sp, #16]",
    "mov x1, x30", // the caller's return address
    "bl {decide_open}",
    "mov x16, x0",
    "ldp x0, x1, [sp, #16]",
    "ldp x29, x30, [sp], #32",
    "cmp x16, #1",
    "b.eq 4f",
    "b {through}", // THROUGH: the hook, with this return address
    "4:",
    "adrp x16, {real_dlopen}",
    "ldr x16, [x16, :lo12:{real_dlopen}]",
    "br x16",
    ".globl memhook_dlsym_entry",
    ".hidden memhook_dlsym_entry",
    ".type memhook_dlsym_entry, %function",
    ".p2align 4",
    "memhook_dlsym_entry:",
    "bti c",
    "stp x29, x30, [sp, #-32]!",
    "mov x29, sp",
    "stp x0, x1, [sp, #16]",
    "mov x2, x30", // the caller's return address
    "mov x3, xzr", // no version
    "bl {decide}",
    "cmp x0, #1",
    "b.eq 2f",
    "ldp x29, x30, [sp], #32",
    "ret",
    "2:",
    "ldp x0, x1, [sp, #16]",
    "ldp x29, x30, [sp], #32",
    "adrp x16, {real_dlsym}",
    "ldr x16, [x16, :lo12:{real_dlsym}]",
    "br x16",
    ".globl memhook_dlvsym_entry",
    ".hidden memhook_dlvsym_entry",
    ".type memhook_dlvsym_entry, %function",
    ".p2align 4",
    "memhook_dlvsym_entry:",
    "bti c",
    "stp x29, x30, [sp, #-48]!",
    "mov x29, sp",
    "stp x0, x1, [sp, #16]",
    "str x2, [sp, #32]",
    "mov x3, x2",  // the version
    "mov x2, x30", // the caller's return address
    "bl {decide}",
    "cmp x0, #1",
    "b.eq 3f",
    "ldp x29, x30, [sp], #48",
    "ret",
    "3:",
    "ldp x0, x1, [sp, #16]",
    "ldr x2, [sp, #32]",
    "ldp x29, x30, [sp], #48",
    "adrp x16, {real_dlvsym}",
    "ldr x16, [x16, :lo12:{real_dlvsym}]",
    "br x16",
    decide = sym dl_decide,
    decide_open = sym dlopen_decide,
    through = sym memhook_dlopen,
    real_dlopen = sym REAL_DLOPEN,
    real_dlsym = sym REAL_DLSYM,
    real_dlvsym = sym REAL_DLVSYM,
);

/// The published, lock-free view of the hooked symbols (dlsym must not wait
/// for the state: a constructor may call it while an install waits for the
/// loader lock the constructor's thread holds).
struct Published {
    name: AtomicUsize,
    hook: AtomicUsize,
    original: AtomicUsize,
}

static PUBLISHED: [Published; MAX_SYMBOLS] = [const {
    Published {
        name: AtomicUsize::new(0),
        hook: AtomicUsize::new(0),
        original: AtomicUsize::new(0),
    }
}; MAX_SYMBOLS];
static PUBLISHED_LEN: AtomicUsize = AtomicUsize::new(0);

fn publish(state: &State) {
    // Entries only ever grow (or all go): rewriting a live entry writes the
    // same values, and the length is stored last.
    for (p, s) in PUBLISHED.iter().zip(state.symbols.iter()) {
        p.name.store(s.name.as_ptr() as usize, Ordering::Relaxed);
        p.hook.store(s.hook, Ordering::Relaxed);
        p.original.store(
            s.answer.map_or(0, |a| a as *const AtomicUsize as usize),
            Ordering::Relaxed,
        );
    }
    PUBLISHED_LEN.store(state.symbols.len(), Ordering::Release);
}

/// The hook and the original of a hooked `name`.
fn hooked(name: &CStr) -> Option<(usize, usize)> {
    let n = PUBLISHED_LEN.load(Ordering::Acquire).min(MAX_SYMBOLS);
    PUBLISHED[..n].iter().find_map(|p| {
        if p.original.load(Ordering::Relaxed) == 0 {
            return None; // slots only: dlsym answers as it would
        }
        // SAFETY: published names are &'static CStr.
        let candidate = unsafe { CStr::from_ptr(p.name.load(Ordering::Relaxed) as *const c_char) };
        (candidate == name).then(|| {
            // SAFETY: published originals are &'static AtomicUsize.
            let original = unsafe { &*(p.original.load(Ordering::Relaxed) as *const AtomicUsize) };
            (p.hook.load(Ordering::Relaxed), original.load(Ordering::Acquire))
        })
    })
}

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;
type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// The real lookup of `name` (`version` for dlvsym) in `handle`.
fn real_lookup(handle: *mut c_void, name: *const c_char, version: *const c_char) -> usize {
    // SAFETY: the REAL_* pointers hold dlsym/dlvsym (set before their slots
    // were patched); the arguments are the caller's.
    unsafe {
        if version.is_null() {
            core::mem::transmute::<usize, DlsymFn>(REAL_DLSYM.load(Ordering::Acquire))(handle, name) as usize
        } else {
            core::mem::transmute::<usize, DlvsymFn>(REAL_DLVSYM.load(Ordering::Acquire))(handle, name, version) as usize
        }
    }
}

/// What RTLD_NEXT from `caller` finds: the first definition of `name` in an
/// object after the caller's, in load order.
//
// The objects after the caller are read a few at a time (`NEXT_CHUNK` a
// pass over the loader's list), not all at once: this runs inside the
// process's `dlsym`, on whatever thread calls it, and a copy of every
// object's entry (2,048 of them) took 160 KiB of that thread's stack, at
// every `dlsym` call (its frame was reserved whether or not this ran).
// Each pass counts from the caller's object, so loads and unloads before
// it change nothing; the objects are asked in turn with the loader's
// lock released (`dlopen` is called outside `dl_iterate_phdr`).
#[cold]
#[inline(never)]
fn next_definition(name: *const c_char, version: *const c_char, caller: usize) -> usize {
    #[derive(Clone, Copy)]
    struct Entry {
        name: *const c_char,
        segments: [(usize, usize); 4],
        n: usize,
    }
    const NEXT_CHUNK: usize = 16;
    let mut skip = 0;
    loop {
        let mut objects: heapless::Vec<Entry, NEXT_CHUNK> = heapless::Vec::new();
        let mut after: Option<usize> = None;
        for_each_object_while(|o| {
            let Some(k) = after.as_mut() else {
                if o.segments.iter().any(|&(s, end)| (s..end).contains(&caller)) {
                    after = Some(0);
                }
                return ControlFlow::Continue(());
            };
            *k += 1;
            if *k <= skip {
                return ControlFlow::Continue(());
            }
            let mut e = Entry {
                // The main program (empty name): dlopen(NULL).
                name: if o.name.is_empty() {
                    core::ptr::null()
                } else {
                    o.name.as_ptr().cast()
                },
                segments: [(0, 0); 4],
                n: 0,
            };
            for &seg in o.segments.iter().take(4) {
                e.segments[e.n] = seg;
                e.n += 1;
            }
            let _ = objects.push(e);
            if objects.is_full() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        if objects.is_empty() {
            return 0; // the caller not found, or no object after it
        }
        for e in &objects {
            // SAFETY: RTLD_NOLOAD only finds an object already loaded (name
            // from its link map entry, or NULL for the main program).
            let h = unsafe { libc::dlopen(e.name, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
            if h.is_null() {
                continue;
            }
            let p = real_lookup(h, name, version);
            // SAFETY: the handle dlopen just returned.
            unsafe { libc::dlclose(h) };
            if p != 0 && e.segments[..e.n].iter().any(|&(s, end)| (s..end).contains(&p)) {
                return p;
            }
        }
        skip += objects.len();
    }
}

/// Called by the dlsym/dlvsym entries: the answer, or [`PASS`] to let the
/// real function answer (with the caller's return address intact).
extern "C" fn dl_decide(handle: *mut c_void, name: *const c_char, caller: usize, version: *const c_char) -> usize {
    catch_up();
    if name.is_null() {
        return PASS;
    }
    // SAFETY: dlsym's contract: `name` is a NUL-terminated string.
    let Some((hook, original)) = hooked(unsafe { CStr::from_ptr(name) }) else {
        return PASS;
    };
    let real = if handle as usize == RTLD_NEXT {
        if crate::fork::loader_lock_stuck() {
            return PASS; // the walk would wait for good: the loader answers
        }
        next_definition(name, version, caller)
    } else {
        // RTLD_DEFAULT resolves from memhook's scope here (the global scope
        // plus memhook's dependencies): it differs from the caller's only
        // for a definition in the caller's private (RTLD_LOCAL) scope.
        real_lookup(handle, name, version)
    };
    // (An answer of 1 cannot be a symbol; PASS would only repeat it.)
    if real != 0 && real == original { hook } else { real }
}

#[cfg(test)]
mod tests {
    use memhook_core::elf::for_each_reloc_by_index;

    use super::*;

    /// A look for unseen loads (`memhook::refresh`) asked for where this
    /// thread holds reloc's state (as a signal handler that interrupted a
    /// status or an uninstall finds it) returns at once. Before, it spun
    /// on the state its own thread held, for good (here the check thread
    /// would never answer).
    #[test]
    fn a_refresh_inside_memhooks_own_work_returns_at_once() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let held = STATE.lock();
            crate::install::refresh();
            drop(held);
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_secs(60)).is_ok(),
            "a refresh waited for the state its own thread holds"
        );
    }

    fn object(base: usize, loads: Option<(u64, u64)>) -> Object<'static> {
        Object {
            id: ObjectId { base, phdr: base + 64 },
            loads,
            name: b"",
            segments: heapless::Vec::new(),
            dynamic: None,
            relro: None,
            namespace: 0,
        }
    }

    /// A scan that finds 100 of 300 known objects gone (more than a round
    /// of `GONE`), every third one: those and only their slots are
    /// forgotten, one unmap reported for each, in the order they were
    /// known; a scan that finds none gone changes nothing.
    #[test]
    fn forget_gone_takes_every_unloaded_object_and_its_slots() {
        // (A State is megabytes: built on a thread with room for it.)
        std::thread::Builder::new()
            .stack_size(64 << 20)
            .spawn(forget_gone_case)
            .unwrap()
            .join()
            .unwrap();
    }

    fn forget_gone_case() {
        let mut state = Box::new(State::new());
        const SCAN: u32 = 5;
        let id = |i: usize| ObjectId {
            base: 0x10_0000 * (i + 1),
            phdr: 0x10_0000 * (i + 1) + 64,
        };
        for i in 0..300 {
            state
                .objects
                .push(Known {
                    id: id(i),
                    name: i as u64,
                    span: (id(i).base, id(i).base + 0x1000),
                    seen: if i % 3 == 0 { SCAN - 1 } else { SCAN },
                    foreign: false,
                    check: None,
                })
                .ok()
                .unwrap();
            for k in 0..2 {
                state
                    .slots
                    .push(Slot {
                        object: id(i),
                        slot: id(i).base + 8 * k,
                        old: 0,
                        symbol: 0,
                        hook: 0,
                    })
                    .ok()
                    .unwrap();
            }
        }
        state.forget_gone(SCAN, true);
        assert_eq!(state.objects.len(), 200);
        assert!(state.objects.iter().all(|k| k.seen == SCAN && k.name % 3 != 0));
        assert_eq!(state.slots.len(), 400);
        assert!(
            state
                .slots
                .iter()
                .all(|s| state.objects.iter().any(|k| k.id == s.object))
        );
        let unmapped: std::vec::Vec<usize> = state.changes.iter().map(|c| c.span.0).collect();
        let want: std::vec::Vec<usize> = (0..300).filter(|i| i % 3 == 0).map(|i| id(i).base).collect();
        assert_eq!(unmapped, want);
        assert!(state.changes.iter().all(|c| !c.mapped));
        state.forget_gone(SCAN, true);
        assert_eq!(
            (state.objects.len(), state.slots.len(), state.changes.len()),
            (200, 400, 100)
        );
    }

    /// A listing's room is the shared one where no other listing holds
    /// it, else pages mapped for it (zeroed, writable, as long as the
    /// ids), and the shared room is free again once its holder is done.
    #[test]
    fn a_listing_made_while_another_holds_the_shared_room_gets_its_own() {
        let mut first = ListingRoom::take();
        assert!(matches!(first, ListingRoom::Shared));
        let mut second = ListingRoom::take();
        let ListingRoom::Mapped(at) = second else {
            panic!("no pages mapped for the second listing");
        };
        let ids = second.ids();
        assert_eq!(ids.len(), MAX_OBJECTS);
        assert!(ids.iter().all(|id| *id == ObjectId { base: 0, phdr: 0 }));
        ids[MAX_OBJECTS - 1] = ObjectId { base: 1, phdr: 2 };
        assert_eq!(first.ids().len(), MAX_OBJECTS);
        assert!(crate::maps::find(at).is_some(), "mapped");
        drop(second);
        assert!(crate::maps::find(at).is_none(), "unmapped when done");
        drop(first);
        assert!(matches!(ListingRoom::take(), ListingRoom::Shared));
    }

    /// Listed at base 0x1000 with 7 unloads before the listing and 20
    /// loads after the wait.
    fn listed() -> Listed<'static> {
        static IDS: std::sync::LazyLock<[ObjectId; 1]> = std::sync::LazyLock::new(|| [object(0x1000, None).id]);
        Listed {
            ambiguous: core::cell::Cell::new(false),
            ids: &*IDS,
            subs_before: Some(7),
            adds_after: Some(20),
        }
    }

    /// In every object this process has loaded (libc, libgcc, the loader,
    /// the vDSO...), the walk by symbol index (taken whatever the object's
    /// size) finds the GOT slots the walk by name finds, for memhook's own
    /// names and for names every object imports or defines.
    #[test]
    fn every_loaded_object_gives_the_same_slots_by_index_and_by_name() {
        let names: [&[u8]; 14] = [
            b"mmap",
            b"munmap",
            b"mremap",
            b"madvise",
            b"dlopen",
            b"dlclose",
            b"dlsym",
            b"malloc",
            b"free",
            b"memcpy",
            b"__cxa_finalize",
            b"__libc_start_main",
            b"pthread_create",
            b"_ITM_registerTMCloneTable",
        ];
        let (mut objects, mut slots) = (0, 0);
        for_each_object(|o| {
            let Some((dynamic, size)) = o.dynamic else {
                return;
            };
            let Ok(d) = read_dynamic(o, o.id.base, dynamic, size) else {
                return;
            };
            let types = [R_JUMP_SLOT, R_GLOB_DAT];
            let mut by_index = std::vec::Vec::new();
            let indexed = for_each_reloc_by_index(o, o.id.base, &d, &types, &names, |r, p| {
                by_index.push((r.slot, p));
                ControlFlow::Continue(())
            });
            let mut by_name = std::vec::Vec::new();
            let named = for_each_named_reloc(
                o,
                o.id.base,
                &memhook_core::elf::Dynamic { gnu_hash: None, ..d },
                &types,
                &names,
                |r, p| {
                    by_name.push((r.slot, p));
                    ControlFlow::Continue(())
                },
            );
            if let Some(indexed) = indexed {
                assert_eq!(
                    (by_index, indexed),
                    (by_name.clone(), named),
                    "{}",
                    String::from_utf8_lossy(o.name)
                );
                objects += 1;
            }
            // The symbol count (from the last chain, where it plainly ends
            // the table) is the one every bucket gives.
            if let Some(h) = d.gnu_hash {
                let word = |at: usize| {
                    let mut b = [0u8; 4];
                    o.read(at, &mut b).unwrap();
                    u32::from_le_bytes(b) as usize
                };
                let top = (0..h.nbuckets).map(|b| word(h.buckets + 4 * b)).max().unwrap();
                let chains = h.buckets + 4 * h.nbuckets;
                let mut end = top;
                while word(chains + 4 * (end - h.symoffset)) & 1 == 0 {
                    end += 1;
                }
                assert_eq!(d.nsyms, Some(end + 1), "{}", String::from_utf8_lossy(o.name));
            }
            slots += by_name.len();
        });
        // libc and the loader at least, with slots of these names.
        assert!(objects >= 2 && slots >= 4, "{objects} objects, {slots} slots");
    }

    #[test]
    fn a_listed_object_counts_as_loaded_unless_its_address_may_be_reused() {
        let l = listed();
        assert!(l.holds(&object(0x1000, Some((20, 7)))), "nothing came or went");
        assert!(
            l.holds(&object(0x1000, Some((20, 8)))),
            "a load in progress failed: none began since"
        );
        assert!(
            l.holds(&object(0x1000, Some((21, 7)))),
            "a load began: nothing listed went"
        );
        assert!(!l.ambiguous.get(), "every answer so far certain");
        assert!(!l.holds(&object(0x2000, Some((21, 8)))), "not listed: loading");
        assert!(!l.ambiguous.get(), "an object not listed is not a listed one left out");
        assert!(
            !l.holds(&object(0x1000, Some((21, 8)))),
            "something listed went and a load began: the id may name a new object"
        );
        assert!(l.ambiguous.get(), "a listed object left out: the rescan lists again");
        assert!(l.holds(&object(0x1000, None)), "no counters: the list decides");
        assert!(!l.holds(&object(0x2000, Some((20, 7)))), "not listed: loading");
    }
}

//! The C libraries of the loader's other namespaces (`dlmopen`).
//!
//! `dlmopen(LM_ID_NEWLM, ...)` loads a library into a namespace of its
//! own, with its own copy of every dependency, libc included: the
//! library's calls of `mmap`, `munmap`, ... go to that copy, which the
//! bistro patches of the main namespace's libc do not touch. With the
//! host hooks in bistro mode, memhook patches every namespace's libc as
//! well, with hooks of its own ([`crate::host::functions_in`]) that call
//! that copy's originals: its `errno` and its notion of the program break
//! stay its own.
//!
//! Namespaces are found through the loader's interface for debuggers,
//! `struct r_debug_extended` (glibc 2.35 and later), reached through the
//! main program's `DT_DEBUG` entry (the loader stores its own address
//! there; the exported `_r_debug` may be a copy the program made at link
//! time, which the loader never updates): one entry per namespace,
//! chained in namespace order as each is first used, and never freed.
//! An entry's `r_map` is non-null while its namespace holds objects.
//! Reading the chain is a handful of loads, made at every `dlopen`,
//! `dlclose`, `dlsym` and `dlvsym` memhook interposes (a library opened
//! with `dlmopen` is looked into with `dlsym` before it is called), at
//! install and at [`crate::refresh`]. A namespace found in use and not
//! yet hooked has its libc opened with `RTLD_NOLOAD` (never loaded by
//! memhook; the handle is kept, so that the patched copy stays mapped)
//! and patched. With an older glibc, or a main program without
//! `DT_DEBUG`, no namespace is seen and nothing changes.
//!
//! A namespace lives as long as something holds its objects: once the
//! last library a program opened in it is closed, the loader frees it and
//! the next `dlmopen(LM_ID_NEWLM, ...)` reuses its index. So memhook's
//! handle must not keep it: after each `dlclose` it interposes (and at
//! [`crate::refresh`]) a hooked namespace that holds nothing but its libc
//! and the loader ([`idle`]) has the handle closed. Where the program
//! still holds that libc (it opened it itself), the patches stay; where
//! the libc went, memhook forgets them (the code they were written in is
//! gone) and the namespace is free. (Without this, a program that opens
//! and closes a plugin in a namespace of its own over and over would run
//! out of namespaces under memhook after a dozen rounds.)
//!
//! In reloc mode (host hooks in reloc mode and not in bistro mode) the
//! namespaces' objects have their GOT slots of the host functions
//! rewritten as the main namespace's are, to that namespace's hooks,
//! whose originals are its libc's definitions ([`prepare_originals`],
//! [`reloc_hook`]). In either mode reloc's rescans walk the namespaces'
//! objects (`crate::reloc`), so that the loader's mappings of them are
//! reported as the main namespace's are.
//!
//! What this does not cover: calls made by a library's constructors
//! during the `dlmopen` that creates its namespace (before memhook can
//! see the namespace), and the CUDA hooks.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use crate::host::{FUNCTIONS, Hooked, NAMESPACES, functions_in};
#[cfg(feature = "bistro")]
pub(crate) use hooks::*;

/// The head of `struct r_debug_extended` on 64-bit targets: `struct
/// r_debug` (`r_version` at 0, `r_map` at 8, ...) and, from version 2,
/// `r_next` at 40.
const R_VERSION: usize = 0;
const R_MAP: usize = 8;
const R_NEXT: usize = 40;
/// `DT_DEBUG`: the dynamic entry the loader points at its `r_debug`.
const DT_DEBUG: i64 = 21;

/// The loader's `r_debug_extended` of the main namespace: 0 not looked
/// for yet, 1 none found.
static R_DEBUG: AtomicUsize = AtomicUsize::new(0);

/// A word the loader may be writing meanwhile.
///
/// # Safety
///
/// `at` is an aligned, readable word that stays mapped.
unsafe fn word(at: usize) -> usize {
    // SAFETY: the caller's contract; an atomic load, as the loader stores
    // these words with release stores.
    unsafe { AtomicUsize::from_ptr(at as *mut usize) }.load(Ordering::Acquire)
}

/// The main program's `DT_DEBUG` value (the loader's `r_debug`), or 1.
fn find_r_debug() -> usize {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr's contract: `info` is valid for this call;
        // `data` is the `usize` passed below.
        let (info, out) = unsafe { (&*info, &mut *(data as *mut usize)) };
        for i in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: dlpi_phdr points to dlpi_phnum headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type != libc::PT_DYNAMIC {
                continue;
            }
            let dynamic = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
            for entry in 0..ph.p_memsz as usize / 16 {
                // SAFETY: the main program's dynamic section, mapped and
                // of `p_memsz` bytes: 16-byte entries (tag, value).
                let (tag, value) = unsafe { (word(dynamic + 16 * entry) as i64, word(dynamic + 16 * entry + 8)) };
                match tag {
                    0 => break,
                    DT_DEBUG if value > 1 && value % 8 == 0 => *out = value,
                    _ => {}
                }
            }
        }
        1 // the main program comes first: stop after it
    }
    let mut found = 1usize;
    // SAFETY: `first` matches the callback type and reads `found` only
    // during the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&raw mut found).cast()) };
    found
}

/// The loader's `r_debug`, found once.
fn r_debug() -> usize {
    let mut r = R_DEBUG.load(Ordering::Acquire);
    if r == 0 {
        r = find_r_debug();
        R_DEBUG.store(r, Ordering::Release);
    }
    r
}

/// Whether the main program's `DT_DEBUG` leads to the loader's `r_debug`.
pub(crate) fn debugger_interface() -> bool {
    r_debug() != 1
}

/// Calls `f` with each namespace other than the main one that the loader
/// has set up (`k`, 1 to 15) and its `r_map` (0 while it holds no object):
/// a walk of the loader's chain of `r_debug_extended`, in namespace order.
fn for_each_namespace(mut f: impl FnMut(usize, usize)) {
    let r = r_debug();
    if r == 1 {
        return;
    }
    // SAFETY: the loader's r_debug, static in ld.so: aligned and mapped
    // for the process's life.
    // (`r_version` is an int: the word's low half on little-endian targets.)
    if (unsafe { word(r + R_VERSION) } as u32) < 2 {
        return; // no r_next: one namespace, or a glibc before 2.35
    }
    // SAFETY: version 2 has r_next; each entry is the loader's static
    // state of one namespace (GL(dl_ns)[k]._ns_debug), never freed.
    let mut next = unsafe { word(r + R_NEXT) };
    for k in 1..NAMESPACES {
        if next == 0 || !next.is_multiple_of(8) {
            return;
        }
        // SAFETY: as above.
        f(k, unsafe { word(next + R_MAP) });
        // SAFETY: as above.
        next = unsafe { word(next + R_NEXT) };
    }
}

/// Namespaces other than the main one that hold objects now (bit `k` for
/// namespace `k`).
pub(crate) fn in_use() -> u32 {
    let mut mask = 0;
    for_each_namespace(|k, map| {
        if map != 0 {
            mask |= 1 << k;
        }
    });
    mask
}

/// The public head of a `struct link_map`, as read.
pub(crate) struct LinkMap {
    /// Its namespace (1 to 15).
    pub(crate) namespace: usize,
    /// The map's own address.
    pub(crate) map: usize,
    /// `l_addr`: the load bias.
    pub(crate) addr: usize,
    /// `l_name`: the path (a C string), or 0.
    pub(crate) name: usize,
    /// `l_ld`: the dynamic section.
    pub(crate) ld: usize,
}

/// Most objects one namespace's list is followed for (a bound on a walk
/// that reads what the loader writes).
const MAX_OBJECTS: usize = 4096;

/// Calls `f` with every object listed in the namespaces other than the
/// main one, namespace by namespace, in load order.
///
/// Must run under the loader's lock (inside a `dl_iterate_phdr`
/// callback): `dlclose` unlinks and frees a `link_map` under it.
pub(crate) fn for_each_link_map(mut f: impl FnMut(&LinkMap)) {
    for_each_namespace(|namespace, mut l| {
        for _ in 0..MAX_OBJECTS {
            if l == 0 || !l.is_multiple_of(8) {
                break;
            }
            // SAFETY: a listed link_map, alive under the loader's lock (the
            // caller's contract): l_addr, l_name, l_ld and l_next are its
            // first four words.
            let (addr, name, ld, after) = unsafe { (word(l), word(l + 8), word(l + 16), word(l + 24)) };
            f(&LinkMap {
                namespace,
                map: l,
                addr,
                name,
                ld,
            });
            l = after;
        }
    });
}

/// Whether namespaces are followed: the host hooks are installed in
/// bistro mode.
pub(crate) static FOLLOW: AtomicBool = AtomicBool::new(false);

/// Namespace `ns`'s libc, opened with `RTLD_NOLOAD` (never loaded by
/// memhook): a handle for [`close_libc`]. `None` where the namespace
/// holds no libc (or `ns` is not a namespace in use).
pub(crate) fn open_libc(ns: usize) -> Option<*mut c_void> {
    if !(1..NAMESPACES).contains(&ns) || in_use() & (1 << ns) == 0 {
        return None;
    }
    // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds a libc the
    // namespace already holds (and fails where it holds none). `ns` is
    // a namespace index the loader has set up; one that emptied since the
    // look above is refused with an error, not a crash.
    let h = unsafe {
        libc::dlmopen(
            ns as libc::Lmid_t,
            c"libc.so.6".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        // The failure's message is memhook's, not the program's: the
        // program's next dlerror() must not find it.
        // SAFETY: dlerror has no preconditions.
        let _ = unsafe { libc::dlerror() };
        return None;
    }
    Some(h)
}

/// Closes a handle of [`open_libc`].
pub(crate) fn close_libc(h: *mut c_void) {
    crate::reloc::real_dlclose(h);
}

/// The hooks of namespace `ns` (1 to 15) for its libc's functions.
pub(crate) fn functions(ns: usize) -> Option<[Hooked; FUNCTIONS]> {
    Some(match ns {
        1 => functions_in::<1>(),
        2 => functions_in::<2>(),
        3 => functions_in::<3>(),
        4 => functions_in::<4>(),
        5 => functions_in::<5>(),
        6 => functions_in::<6>(),
        7 => functions_in::<7>(),
        8 => functions_in::<8>(),
        9 => functions_in::<9>(),
        10 => functions_in::<10>(),
        11 => functions_in::<11>(),
        12 => functions_in::<12>(),
        13 => functions_in::<13>(),
        14 => functions_in::<14>(),
        15 => functions_in::<15>(),
        _ => return None,
    })
}

/// Whether the host hooks are installed in reloc mode: the GOT slots of
/// the other namespaces' objects are rewritten too, to hooks that call
/// their namespace's libc (unless bistro follows the namespaces).
pub(crate) static RELOC: AtomicBool = AtomicBool::new(false);

/// Namespaces whose hooks' originals are set (bit `k` for namespace `k`).
/// A namespace that empties loses its bit: the next one at its index has
/// a libc of its own.
static PREPARED: AtomicU32 = AtomicU32::new(0);

/// Starts reloc's following of the namespaces (an install in reloc
/// mode): each namespace in use is prepared afresh ([`prepare_originals`];
/// a bistro install since the last may have set its originals to
/// trampolines).
pub(crate) fn follow_in_reloc_mode() {
    RELOC.store(true, Ordering::Release);
    PREPARED.store(0, Ordering::Release);
    prepare_originals();
}

/// Whether reloc rewrites the slots of the other namespaces' objects.
pub(crate) fn reloc_follows() -> bool {
    RELOC.load(Ordering::Acquire) && !FOLLOW.load(Ordering::Acquire)
}

/// For reloc mode: makes each namespace's libc definitions the originals
/// of its hooks, once per namespace (again for a namespace that emptied
/// and was made again since). It opens the namespace's libc for the
/// lookup (and closes it: reloc keeps no namespace alive) and looks the
/// functions up, which takes the loader's lock: called outside memhook's
/// locks and the loader's callbacks, before the scans that may write
/// those hooks into slots.
pub(crate) fn prepare_originals() {
    if !reloc_follows() {
        return;
    }
    let used = in_use();
    let todo = used & !PREPARED.fetch_and(used, Ordering::AcqRel);
    for ns in (1..NAMESPACES).filter(|ns| todo & (1 << ns) != 0) {
        let (Some(lib), Some(functions)) = (open_libc(ns), functions(ns)) else {
            continue; // no libc there yet: looked at again next time
        };
        for (name, _, original) in functions {
            let at = crate::reloc::real_dlsym(lib, name);
            // Over a value of an earlier libc at this index (or a bistro
            // trampoline of an earlier install): each is a working
            // function while anything can call through it.
            if at != 0 {
                original.store(at, Ordering::Release);
            }
        }
        close_libc(lib);
        PREPARED.fetch_or(1 << ns, Ordering::AcqRel);
    }
}

/// For reloc's scans, under the loader's lock: whether namespace `ns`'s
/// originals are its present libc's (unset, or inside one of its
/// objects). Where they are not (the namespace emptied and was made again
/// between two looks, or they are trampolines of an earlier bistro
/// install), the namespace is prepared again at the next
/// [`prepare_originals`], and reloc leaves its objects for the scan after.
pub(crate) fn originals_current(ns: usize) -> bool {
    let Some(functions) = functions(ns) else {
        return false;
    };
    let Some(at) = functions
        .iter()
        .map(|(_, _, o)| o.load(Ordering::Acquire))
        .find(|&a| a != 0)
    else {
        return true;
    };
    let mut current = false;
    if let Some(owner) = crate::reloc::object_map_at(at) {
        for_each_link_map(|l| current |= l.namespace == ns && l.map == owner);
    }
    if !current {
        PREPARED.fetch_and(!(1 << ns), Ordering::AcqRel);
    }
    current
}

/// For reloc: namespace `ns`'s hook for the symbol `name` (a host
/// function, or another name of one) and where it finds its original;
/// `None` for any other symbol.
pub(crate) fn reloc_hook(ns: usize, name: &[u8]) -> Option<(usize, &'static AtomicUsize)> {
    let name = crate::host::ALIAS_OF
        .iter()
        .find(|(alias, _)| alias.to_bytes() == name)
        .map_or(name, |(_, main)| main.to_bytes());
    functions(ns)?
        .into_iter()
        .find(|(n, _, _)| n.to_bytes() == name)
        .map(|(_, hook, original)| (hook, original))
}

/// Hooking each namespace's libc (bistro).
#[cfg(feature = "bistro")]
mod hooks {
    use core::ffi::{c_int, c_void};
    use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

    use super::{FOLLOW, NAMESPACES, close_libc, for_each_link_map, in_use, open_libc};

    /// Each hooked namespace's libc, opened with `RTLD_NOLOAD` and kept while
    /// its patches are in place (0 not opened), and its `link_map`.
    static LIBC: [AtomicUsize; NAMESPACES] = [const { AtomicUsize::new(0) }; NAMESPACES];
    static LIBC_MAP: [AtomicUsize; NAMESPACES] = [const { AtomicUsize::new(0) }; NAMESPACES];

    /// Namespace `ns`'s libc, opened once with `RTLD_NOLOAD` and kept open
    /// (see [`release_pin`]): for bistro's patches, which must stay mapped.
    /// `None` where the namespace holds no libc.
    pub(crate) fn libc_of(ns: usize) -> Option<*mut c_void> {
        let slot = LIBC.get(ns)?;
        let h = slot.load(Ordering::Acquire);
        if h != 0 {
            return Some(h as *mut c_void);
        }
        let h = open_libc(ns)?;
        let mut map: usize = 0;
        // SAFETY: a live handle; RTLD_DI_LINKMAP writes a link_map pointer.
        if unsafe { libc::dlinfo(h, libc::RTLD_DI_LINKMAP, (&raw mut map).cast()) } != 0 {
            map = 0;
        }
        LIBC_MAP[ns].store(map, Ordering::Release);
        slot.store(h as usize, Ordering::Release);
        Some(h)
    }

    /// Closes memhook's handle of namespace `ns`'s libc ([`libc_of`]), and
    /// says whether the libc is still loaded (then the handle is taken again:
    /// the program holds it too). Called under the install's lock, with the
    /// namespace [`idle`].
    pub(crate) fn release_pin(ns: usize, still_hooked: impl FnOnce(*mut c_void) -> bool) -> bool {
        let Some(slot) = LIBC.get(ns) else {
            return false;
        };
        let h = slot.swap(0, Ordering::AcqRel);
        if h != 0 {
            close_libc(h as *mut c_void);
        }
        // The same libc, still loaded, if the namespace still holds a libc
        // whose code holds the patches (a new libc at the same address would
        // hold its own bytes).
        match open_libc(ns) {
            Some(again) if still_hooked(again) => {
                slot.store(again as usize, Ordering::Release);
                true
            }
            Some(other) => {
                close_libc(other);
                LIBC_MAP[ns].store(0, Ordering::Release);
                false
            }
            None => {
                LIBC_MAP[ns].store(0, Ordering::Release);
                false
            }
        }
    }

    /// Closes memhook's handle of namespace `ns`'s libc, if it holds one
    /// (uninstall, once no patch of memhook's is left in it).
    pub(crate) fn unpin(ns: usize) {
        let Some(slot) = LIBC.get(ns) else {
            return;
        };
        let h = slot.swap(0, Ordering::AcqRel);
        if h != 0 {
            LIBC_MAP[ns].store(0, Ordering::Release);
            close_libc(h as *mut c_void);
        }
    }

    /// Hooked namespaces (of `hooked`) that hold nothing but their libc (the
    /// one memhook holds open) and the loader's entry: their programs' last
    /// library in them is closed. Walked under the loader's lock.
    pub(crate) fn idle(hooked: u32) -> u32 {
        if hooked == 0 {
            return 0;
        }
        struct Walk {
            hooked: u32,
            busy: u32,
        }
        unsafe extern "C" fn visit(_info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> c_int {
            // SAFETY: `data` is the Walk passed below, alive for the call.
            let walk = unsafe { &mut *(data as *mut Walk) };
            for_each_link_map(|l| {
                if walk.hooked & (1 << l.namespace) == 0 {
                    return;
                }
                let libc = LIBC_MAP[l.namespace].load(Ordering::Acquire);
                // The loader's entry in a namespace is a copy of its own map:
                // the object at its dynamic section is another map.
                let loader = crate::reloc::object_map_at(l.ld).is_some_and(|m| m != l.map);
                if libc == 0 || (l.map != libc && !loader) {
                    walk.busy |= 1 << l.namespace;
                }
            });
            1 // one call: the walk covers every namespace
        }
        let mut walk = Walk { hooked, busy: 0 };
        // SAFETY: `visit` matches the callback type and uses `walk` only
        // during the call.
        unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut walk).cast()) };
        hooked & in_use() & !walk.busy
    }

    /// Namespaces whose libc is hooked (bit `k` for namespace `k`).
    pub(crate) static HOOKED: AtomicU32 = AtomicU32::new(0);

    /// Namespaces in use whose libc is not hooked (and should be).
    pub(crate) fn unhooked() -> u32 {
        if !FOLLOW.load(Ordering::Acquire) {
            return 0;
        }
        in_use() & !HOOKED.load(Ordering::Acquire)
    }

    /// Hooks the libc of the namespaces that came since the last look, if
    /// any: called where memhook interposes the loader's functions.
    pub(crate) fn check() {
        if unhooked() != 0 {
            crate::install::follow_namespaces();
        }
    }
}

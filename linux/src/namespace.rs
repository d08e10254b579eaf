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
//! install and at [`crate::refresh`]. With an older glibc, or a main
//! program without `DT_DEBUG`, no namespace is seen and nothing changes.
//!
//! memhook holds nothing in a namespace: a namespace lives as long as its
//! program holds objects in it, and once the program closes its last
//! library there the loader frees it, its libc with it, and the next
//! `dlmopen(LM_ID_NEWLM, ...)` reuses its index, as without memhook.
//! (glibc has room for about a dozen namespaces; a handle of memhook's
//! would make a program that opens and closes a plugin in a namespace of
//! its own, round after round, run out of them.) Nor does memhook ever
//! `dlmopen` into a namespace: glibc refuses one into a namespace that
//! emptied meanwhile with the loader's lock still held, for good. So
//! every look at a namespace's libc, and every write to its code, is made
//! under the loader's write lock (inside a `dl_iterate_phdr` callback;
//! the loader unmaps objects under it), with the libc's functions read
//! from its own symbol table ([`crate::reloc::with_namespace_libcs`]).
//! A hooked libc that went is noticed at the next look (an unload
//! counted since: [`check`]) and its patches forgotten, never written.
//!
//! In reloc mode (host hooks in reloc mode and not in bistro mode) the
//! namespaces' objects have their GOT slots of the host functions
//! rewritten as the main namespace's are, to that namespace's reloc hooks
//! ([`reloc_hook`]), whose originals its libc's definitions are, set in
//! the same walk, under the same lock, as the slots
//! ([`refresh_reloc_originals`]). In either mode reloc's rescans walk the
//! namespaces' objects (`crate::reloc`), so that the loader's mappings of
//! them are reported as the main namespace's are.
//!
//! In bistro mode memhook also patches the loader's breakpoint for
//! debuggers ([`loader_break`]), which the loader calls once the objects
//! of a `dlmopen` are mapped, before it relocates them or runs any of
//! their code: the namespace's libc is hooked there, and the calls its
//! library's constructors make are seen. Where that patch cannot be made
//! (a loader whose breakpoint is not an empty function followed by
//! padding, a debugger's breakpoint on it at install), a namespace is
//! hooked at the next loader call memhook interposes, as in reloc mode.
//!
//! What this does not cover: in reloc mode, and where the breakpoint is
//! not patched, the calls made by a library's constructors during the
//! `dlmopen` that creates its namespace (before memhook can see the
//! namespace); and the CUDA hooks.

use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::host::{FUNCTIONS, Hooked, NAMESPACES, functions_in};
#[cfg(feature = "bistro")]
pub(crate) use hooks::*;

/// The head of `struct r_debug_extended` on 64-bit targets: `struct
/// r_debug` (`r_version` at 0, `r_map` at 8, ...) and, from version 2,
/// `r_next` at 40.
const R_VERSION: usize = 0;
const R_MAP: usize = 8;
const R_NEXT: usize = 40;
/// `r_brk`: the loader's breakpoint for debuggers.
#[cfg(feature = "bistro")]
const R_BRK: usize = 16;
/// `r_state` (an int): `RT_CONSISTENT` (0) while no change of the
/// namespace's objects is under way.
const R_STATE: usize = 24;
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
    unsafe { crate::fork::iterate_phdr(first, (&raw mut found).cast()) };
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

/// The main namespace's `r_debug_extended` where the loader keeps one of
/// version 2 or later (with `r_next`: glibc 2.35 and later), else `None`.
fn r_debug_extended() -> Option<usize> {
    let r = r_debug();
    // SAFETY: the loader's r_debug, static in ld.so: aligned and mapped
    // for the process's life.
    // (`r_version` is an int: the word's low half on little-endian targets.)
    (r != 1 && (unsafe { word(r + R_VERSION) } as u32) >= 2).then_some(r)
}

/// Calls `f` with each namespace other than the main one that the loader
/// has set up (`k`, 1 to 15) and its `r_debug_extended` (the loader's
/// static state of that namespace, `GL(dl_ns)[k]._ns_debug`, never
/// freed): a walk of the loader's chain, in namespace order.
fn for_each_debug(mut f: impl FnMut(usize, usize)) {
    let Some(r) = r_debug_extended() else {
        return; // no r_next: one namespace, or a glibc before 2.35
    };
    // SAFETY: version 2 has r_next; each entry is static in ld.so.
    let mut next = unsafe { word(r + R_NEXT) };
    for k in 1..NAMESPACES {
        if next == 0 || !next.is_multiple_of(8) {
            return;
        }
        f(k, next);
        // SAFETY: as above.
        next = unsafe { word(next + R_NEXT) };
    }
}

/// Calls `f` with each namespace other than the main one that the loader
/// has set up (`k`, 1 to 15) and its `r_map` (0 while it holds no object),
/// in namespace order.
fn for_each_namespace(mut f: impl FnMut(usize, usize)) {
    // SAFETY: an entry of the loader's chain, static in ld.so.
    for_each_debug(|k, entry| f(k, unsafe { word(entry + R_MAP) }));
}

/// The loader's breakpoint for debuggers (`r_brk`: glibc's
/// `_dl_debug_state`, an empty function the loader calls as it begins and
/// as it ends each change of a namespace's objects), where namespaces can
/// be followed; 0 where not.
///
/// memhook patches it (with [`loader_break_hook`]; see
/// `crate::install::patch_host_functions`) so as to see a namespace that
/// `dlmopen` makes as soon as its objects are mapped: the loader calls it
/// once they all are (`RT_CONSISTENT`), before it relocates them and runs
/// their constructors, so that the namespace's libc is hooked before any
/// of its code runs, and what the constructors of the library and its
/// dependencies do is seen.
///
/// The loader says which version of `r_debug` it keeps only once a second
/// namespace is made (version 2, with `r_next`: glibc 2.35 and later);
/// until then it is 1, so what is asked here is whether memhook can follow
/// namespaces at all ([`crate::reloc::sees_namespaces`]).
#[cfg(feature = "bistro")]
pub(crate) fn loader_break() -> usize {
    if !crate::reloc::sees_namespaces() {
        return 0;
    }
    // SAFETY: the loader's r_debug (found: sees_namespaces), static in
    // ld.so; the loader set r_brk at its start.
    unsafe { word(r_debug() + R_BRK) }
}

/// Whether no namespace is amid a change of its objects: the main one's
/// `r_state` and every other's are `RT_CONSISTENT`. (At `RT_ADD` objects
/// are being mapped; at `RT_DELETE` unmapped.)
#[cfg(feature = "bistro")]
fn settled() -> bool {
    r_debug_extended().is_some() && at_rest()
}

/// Whether the loader, as far as it says, is amid no change of any
/// namespace's objects: the main namespace's `r_state` and every other's
/// in its chain are `RT_CONSISTENT` (with a chain of version 1, glibc
/// 2.35 and later have made no second namespace). Reads only what was
/// found before (`false` where the loader's `r_debug` was not looked for
/// or not found), so that a fork's child may ask before it can walk the
/// objects.
pub(crate) fn at_rest() -> bool {
    let r = R_DEBUG.load(Ordering::Acquire);
    if r <= 1 {
        return false;
    }
    // SAFETY: the loader's r_debug and its chain's entries, static in
    // ld.so; `r_state` is an int, the word's low half (little-endian).
    let mut all = unsafe { word(r + R_STATE) } as u32 == 0;
    // SAFETY: as above.
    for_each_debug(|_, entry| all &= unsafe { word(entry + R_STATE) } as u32 == 0);
    all
}

/// The loader breakpoint's original ([`loader_break`]): its relocated
/// `ret`, set before the patch is written.
#[cfg(feature = "bistro")]
pub(crate) static BREAK_ORIGINAL: AtomicUsize = AtomicUsize::new(0);

/// Where the loader's breakpoint leads once patched: runs the original (a
/// return), then, when the loader has just finished a change (every
/// namespace `RT_CONSISTENT`) and the host hooks follow the namespaces,
/// hooks the libc of a namespace that came ([`check_now`]). It runs inside
/// `dlopen`, `dlmopen` and `dlclose`, with the loader's lock held (not
/// its write lock): it never waits for memhook's state, whose holder may
/// be waiting for that lock, nor for a fork being prepared (another
/// library's fork handler may call `dlsym`: it looks only from a section
/// entered without waiting, `crate::fork::try_section`), and keeps
/// `errno`.
#[cfg(feature = "bistro")]
pub(crate) extern "C" fn loader_break_hook() {
    let original = BREAK_ORIGINAL.load(Ordering::Acquire);
    if original != 0 {
        // SAFETY: the trampoline of `_dl_debug_state`, a function of no
        // arguments and no result (its `ret`, after a landing pad).
        unsafe { core::mem::transmute::<usize, extern "C" fn()>(original)() };
    }
    if FOLLOW.load(Ordering::Acquire)
        && settled()
        && let Some(_section) = crate::fork::try_section()
    {
        crate::maps::keeping_errno(check_now);
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

/// The hooks of namespace `ns` (1 to 15) for its libc's functions.
#[cfg(feature = "bistro")]
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

/// Namespace `ns`'s hooks (1 to 15) for reloc's slots in its objects:
/// their own originals, apart from bistro's ([`crate::host::HOOK_SLOTS`]).
pub(crate) fn reloc_functions(ns: usize) -> Option<[Hooked; FUNCTIONS]> {
    Some(match ns {
        1 => functions_in::<17>(),
        2 => functions_in::<18>(),
        3 => functions_in::<19>(),
        4 => functions_in::<20>(),
        5 => functions_in::<21>(),
        6 => functions_in::<22>(),
        7 => functions_in::<23>(),
        8 => functions_in::<24>(),
        9 => functions_in::<25>(),
        10 => functions_in::<26>(),
        11 => functions_in::<27>(),
        12 => functions_in::<28>(),
        13 => functions_in::<29>(),
        14 => functions_in::<30>(),
        15 => functions_in::<31>(),
        _ => return None,
    })
}

/// Whether the host hooks are installed in reloc mode: the GOT slots of
/// the other namespaces' objects are rewritten too, to hooks that call
/// their namespace's libc (unless bistro follows the namespaces).
pub(crate) static RELOC: AtomicBool = AtomicBool::new(false);

/// Whether reloc rewrites the slots of the other namespaces' objects.
pub(crate) fn reloc_follows() -> bool {
    RELOC.load(Ordering::Acquire) && !FOLLOW.load(Ordering::Acquire)
}

/// For reloc's scans, under the loader's write lock, before they write
/// any namespace's hooks into slots: makes each namespace's libc
/// definitions (read from its own symbol table: memhook holds no handle
/// in a namespace) the originals of its reloc hooks. A namespace the
/// loader freed and made again at the same index has another libc: its
/// hooks call the new one's functions from then on (no object of the old
/// one is left to call the old). Returns the namespaces that hold a libc
/// (bit `k` for namespace `k`): only their objects' slots are rewritten.
pub(crate) fn refresh_reloc_originals() -> u32 {
    let mut found = 0;
    crate::reloc::with_namespace_libcs(|libc| {
        let Some(functions) = reloc_functions(libc.namespace) else {
            return;
        };
        for ((_, _, original), at) in functions.iter().zip(libc.functions) {
            if at != 0 {
                original.store(at, Ordering::Release);
            }
        }
        #[cfg(feature = "bistro")]
        check_kept(libc);
        found |= 1 << libc.namespace;
    });
    found
}

/// For reloc: namespace `ns`'s hook for the symbol `name` (a host
/// function, or another name of one) and where it finds its original;
/// `None` for any other symbol.
pub(crate) fn reloc_hook(ns: usize, name: &[u8]) -> Option<(usize, &'static AtomicUsize)> {
    let name = crate::host::ALIAS_OF
        .iter()
        .find(|(alias, _)| alias.to_bytes() == name)
        .map_or(name, |(_, main)| main.to_bytes());
    let functions = reloc_functions(ns)?;
    let i = functions.iter().position(|(n, _, _)| n.to_bytes() == name)?;
    #[cfg(feature = "bistro")]
    if kept_now(ns, i) {
        return None;
    }
    let (_, hook, original) = functions[i];
    Some((hook, original))
}

/// Hooking each namespace's libc (bistro).
#[cfg(feature = "bistro")]
mod hooks {
    use core::ffi::{c_int, c_void};
    use core::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};

    use super::{FOLLOW, in_use};
    use crate::host::{FUNCTIONS, NAMESPACES};

    /// The bistro patches an uninstall kept in the namespaces' libcs
    /// (another hooker had patched over them: see
    /// [`crate::install::uninstall`]), for reloc's scans: per namespace
    /// and function (in the order of [`crate::host::functions`]), where
    /// the patch starts (0 for none), and the first bytes it replaced
    /// there (at most 8) with their count.
    static KEPT: [[KeptPatch; FUNCTIONS]; NAMESPACES] = [const { [const { KeptPatch::new() }; FUNCTIONS] }; NAMESPACES];

    /// One kept patch (see [`KEPT`]).
    struct KeptPatch {
        at: AtomicUsize,
        bytes: AtomicU64,
        len: AtomicU8,
    }

    impl KeptPatch {
        const fn new() -> Self {
            KeptPatch {
                at: AtomicUsize::new(0),
                bytes: AtomicU64::new(0),
                len: AtomicU8::new(0),
            }
        }
    }
    /// Per namespace, the functions (bit `i` for function `i`) whose kept
    /// patch the last look at its libc found there still, in place or
    /// under the other hooker's: its calls reach our hook through the
    /// entry, so reloc leaves their slots to it (rewritten, a call
    /// through one would be reported by both hooks).
    static KEPT_NOW: [AtomicU32; NAMESPACES] = [const { AtomicU32::new(0) }; NAMESPACES];

    /// Records namespace `ns`'s kept patch of function `i`: it starts at
    /// `at`, where it replaced `replaced`.
    pub(crate) fn set_kept(ns: usize, i: usize, at: usize, replaced: &[u8]) {
        let n = replaced.len().min(8);
        let mut word = [0u8; 8];
        word[..n].copy_from_slice(&replaced[..n]);
        let kept = &KEPT[ns][i];
        kept.bytes.store(u64::from_ne_bytes(word), Ordering::Relaxed);
        kept.len.store(n as u8, Ordering::Relaxed);
        kept.at.store(at, Ordering::Release);
    }

    /// Forgets namespace `ns`'s kept patches.
    pub(crate) fn clear_kept(ns: usize) {
        for kept in &KEPT[ns] {
            kept.at.store(0, Ordering::Release);
        }
        KEPT_NOW[ns].store(0, Ordering::Release);
    }

    /// Which of its namespace's kept patches are in `libc` still: at its
    /// function's entry, which does not hold the bytes the patch replaced
    /// again (a libc loaded afresh at the address, or a patch undone). The
    /// others are forgotten. Under the loader's write lock, `libc` listed.
    pub(crate) fn check_kept(libc: &crate::reloc::NamespaceLibc) {
        let ns = libc.namespace;
        let mut now = 0u32;
        for (i, (&entry, kept)) in libc.functions.iter().zip(&KEPT[ns]).enumerate() {
            let at = kept.at.load(Ordering::Acquire);
            if at == 0 {
                continue;
            }
            let n = usize::from(kept.len.load(Ordering::Relaxed));
            let ours = entry != 0 && at.wrapping_sub(entry) < 16 && n > 0 && libc.holds(at, n) && {
                let mut bytes = [0u8; 8];
                // SAFETY: `n` bytes inside the listed libc's load
                // segments, which stay mapped under the loader's write
                // lock.
                unsafe { core::ptr::copy_nonoverlapping(at as *const u8, bytes.as_mut_ptr(), n) };
                bytes != kept.bytes.load(Ordering::Relaxed).to_ne_bytes()
            };
            if ours {
                now |= 1 << i;
            } else {
                kept.at.store(0, Ordering::Release);
            }
        }
        KEPT_NOW[ns].store(now, Ordering::Release);
    }

    /// Whether reloc leaves namespace `ns`'s slots of function `i` to a
    /// kept patch (see [`check_kept`]).
    pub(crate) fn kept_now(ns: usize, i: usize) -> bool {
        KEPT_NOW
            .get(ns)
            .is_some_and(|k| k.load(Ordering::Acquire) & (1 << i) != 0)
    }

    /// Namespaces whose libc is hooked (bit `k` for namespace `k`), as the
    /// last look found them.
    pub(crate) static HOOKED: AtomicU32 = AtomicU32::new(0);

    /// The loader's count of unloads (`dlpi_subs`) at the last look.
    static SUBS: AtomicU64 = AtomicU64::new(u64::MAX);

    /// The loader's count of objects unloaded so far (`u64::MAX` where it
    /// gives none).
    pub(crate) fn unloads() -> u64 {
        unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, size: libc::size_t, data: *mut c_void) -> c_int {
            // SAFETY: dl_iterate_phdr's contract: `info` is valid for this
            // call and `size` bytes long; `data` is the u64 passed below.
            unsafe {
                if size >= core::mem::size_of::<libc::dl_phdr_info>() {
                    *(data as *mut u64) = (*info).dlpi_subs;
                }
            }
            1
        }
        let mut subs = u64::MAX;
        // SAFETY: `first` matches the callback type and writes `subs` only
        // during the call.
        unsafe { crate::fork::iterate_phdr(first, (&raw mut subs).cast()) };
        subs
    }

    /// Records the loader's count of unloads for the next [`check`]
    /// (taken before a look, so that an unload during it is looked at
    /// again).
    pub(crate) fn looked(subs: u64) {
        SUBS.store(subs, Ordering::Release);
    }

    /// Whether the namespaces should be looked at again: one in use whose
    /// libc is not hooked, or an object unloaded since the last look (a
    /// hooked libc may have gone, its namespace freed, and another made
    /// at its index).
    pub(crate) fn due() -> bool {
        if !FOLLOW.load(Ordering::Acquire) || crate::fork::loader_lock_stuck() {
            return false;
        }
        let hooked = HOOKED.load(Ordering::Acquire);
        in_use() & !hooked != 0 || (hooked != 0 && unloads() != SUBS.load(Ordering::Acquire))
    }

    /// Hooks the libc of the namespaces that came since the last look, and
    /// forgets those that went: called where memhook interposes the
    /// loader's functions.
    pub(crate) fn check() {
        if due() {
            crate::install::follow_namespaces(true);
        }
    }

    /// [`check`] from inside the loader ([`super::loader_break_hook`]):
    /// looks only if memhook's state is free now, and else leaves the
    /// look to its holder or to the next loader call memhook interposes.
    pub(crate) fn check_now() {
        if due() {
            crate::install::follow_namespaces(false);
        }
    }
}

//! Keeping memhook's code mapped once it is installed.
//!
//! Once installed, memhook's code is reachable from outside it for good:
//! bistro patches jump into its hooks, reloc writes them into other
//! objects' GOT slots (from which a program may have copied a function
//! pointer), and procaddr hands them to the CUDA runtime, which keeps
//! them. If memhook lives in a shared object that the program later
//! closes (a plugin that embeds the crate or links `libmemhook.a`), a
//! `dlclose` that unmapped it would leave all of those jumping into
//! nothing: the next `mmap` of any thread would crash the process.
//!
//! So the first install pins memhook's own object, as UCX's UCM does
//! (`ucm_prevent_dl_unload`): `dlopen` of the object by the name the
//! loader knows it by, with `RTLD_NOLOAD | RTLD_NODELETE`, which loads
//! nothing and marks it never to be unloaded. Where there is nothing to
//! do, nothing is asked of the loader: memhook is part of the program, or
//! its object was linked with `-z nodelete` (as `libmemhook.so` is).
//! The `dlopen` of an object already loaded reads the loader's list and
//! sets a flag: it opens no file and allocates nothing, so an allocator
//! that installs memhook from inside its first `malloc` is not entered
//! again.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicU8, Ordering};

/// How memhook's own object is kept mapped ([`pinned`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pinned {
    /// Nothing installed yet: not looked at.
    NotYet,
    /// memhook is part of the program, which is never unloaded.
    Program,
    /// memhook's shared object was linked with `-z nodelete`.
    LinkedNodelete,
    /// memhook's shared object was marked at the first install never to
    /// be unloaded (`dlopen` with `RTLD_NOLOAD | RTLD_NODELETE`).
    Pinned,
    /// The loader could not say which object memhook is in, or refused
    /// to pin it: a `dlclose` of that object would unmap memhook's hooks.
    /// Link the object with `-Wl,-z,nodelete`.
    Failed,
}

const NOT_YET: u8 = 0;
const PROGRAM: u8 = 1;
const LINKED_NODELETE: u8 = 2;
const PINNED: u8 = 3;
const FAILED: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(NOT_YET);

/// glibc's `dladdr1` request for the object's `struct link_map`.
const RTLD_DL_LINKMAP: c_int = 2;
/// glibc's `RTLD_NODELETE` (not in the libc crate for Linux).
const RTLD_NODELETE: c_int = 0x1000;
const DT_NULL: i64 = 0;
const DT_FLAGS_1: i64 = 0x6fff_fffb;
const DF_1_NODELETE: u64 = 0x8;

/// The public head of glibc's `struct link_map` (`<link.h>`).
#[repr(C)]
struct LinkMap {
    addr: usize,
    name: *const c_char,
    dynamic: *const Dyn,
    next: *const LinkMap,
    prev: *const LinkMap,
}

/// An `Elf64_Dyn` / `Elf32_Dyn` entry (pointer-sized tag and value).
#[repr(C)]
struct Dyn {
    tag: isize,
    val: usize,
}

/// How memhook's own object is kept mapped: [`Pinned::NotYet`] until the
/// first [`crate::install()`].
pub fn pinned() -> Pinned {
    match STATE.load(Ordering::Acquire) {
        PROGRAM => Pinned::Program,
        LINKED_NODELETE => Pinned::LinkedNodelete,
        PINNED => Pinned::Pinned,
        FAILED => Pinned::Failed,
        _ => Pinned::NotYet,
    }
}

/// Pins memhook's object (once; later calls return at once). Called
/// before install takes any lock of memhook's: the `dlopen` takes the
/// loader's lock, which a library's constructor that installs holds.
pub(crate) fn pin_self() {
    if STATE.load(Ordering::Acquire) != NOT_YET {
        return;
    }
    // Two threads may both look: each finds the same answer, and a second
    // RTLD_NODELETE open of a pinned object changes nothing.
    STATE.store(look(), Ordering::Release);
}

fn look() -> u8 {
    let mut info = core::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let mut map: *mut c_void = core::ptr::null_mut();
    // SAFETY: dladdr1 fills `info` and, with RTLD_DL_LINKMAP, `map` with
    // the loader's entry for the object holding this function (which
    // lives as long as the object, that is, as long as this code).
    let found = unsafe {
        libc::dladdr1(
            pin_self as *const c_void,
            info.as_mut_ptr(),
            &raw mut map,
            RTLD_DL_LINKMAP,
        )
    } != 0;
    if !found || map.is_null() {
        return FAILED;
    }
    // SAFETY: see above: a live `struct link_map`, whose head is public.
    let map = unsafe { &*map.cast::<LinkMap>() };
    // SAFETY: l_name is null or a NUL-terminated string of the loader's.
    if map.name.is_null() || unsafe { *map.name } == 0 {
        return PROGRAM; // the program's own entry has an empty name
    }
    // SAFETY: l_ld is the object's dynamic section, mapped with it, ended
    // by DT_NULL (checked by the loader when it loaded the object).
    if !map.dynamic.is_null() && unsafe { flags_1(map.dynamic) } & DF_1_NODELETE != 0 {
        return LINKED_NODELETE;
    }
    // SAFETY: the name the loader knows the object by: RTLD_NOLOAD finds
    // it in the loader's list (no file is opened) and RTLD_NODELETE marks
    // it. The handle is kept for good (the object stays anyway).
    let handle = unsafe { libc::dlopen(map.name, libc::RTLD_LAZY | libc::RTLD_NOLOAD | RTLD_NODELETE) };
    if handle.is_null() {
        // Leave no error of ours for the program's next dlerror().
        // SAFETY: dlerror takes no argument.
        let _ = unsafe { libc::dlerror() };
        return FAILED;
    }
    PINNED
}

/// The `DT_FLAGS_1` value of a dynamic section (0 without one).
///
/// # Safety
///
/// `dynamic` points to a dynamic section ended by `DT_NULL`.
unsafe fn flags_1(dynamic: *const Dyn) -> u64 {
    let mut at = dynamic;
    loop {
        // SAFETY: the caller's contract: entries up to DT_NULL are mapped.
        let entry = unsafe { &*at };
        match entry.tag as i64 {
            DT_NULL => return 0,
            DT_FLAGS_1 => return entry.val as u64,
            _ => {}
        }
        // SAFETY: not past DT_NULL, which ends the section.
        at = unsafe { at.add(1) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_binary_holds_memhook_in_the_program() {
        // (The shared-object cases run as C programs: ffi's examples test.)
        assert_eq!(look(), PROGRAM);
    }

    #[test]
    fn flags_1_reads_nodelete_and_stops_at_dt_null() {
        let with = [
            Dyn { tag: 1, val: 7 },
            Dyn {
                tag: DT_FLAGS_1 as isize,
                val: (DF_1_NODELETE | 1) as usize,
            },
            Dyn { tag: 0, val: 0 },
        ];
        // SAFETY: ended by DT_NULL.
        assert_eq!(unsafe { flags_1(with.as_ptr()) } & DF_1_NODELETE, DF_1_NODELETE);
        let after_end = [
            Dyn { tag: 1, val: 7 },
            Dyn { tag: 0, val: 0 },
            Dyn {
                tag: DT_FLAGS_1 as isize,
                val: DF_1_NODELETE as usize,
            },
        ];
        // SAFETY: ended by DT_NULL (the entry after it is never read).
        assert_eq!(unsafe { flags_1(after_end.as_ptr()) }, 0);
    }
}

//! Trampoline slots in pages mapped near the code they serve.
//!
//! A trampoline holds the instructions a patch displaced and a jump back; a
//! far-jump slot holds an absolute jump to a hook that is out of reach of
//! the entry's 5-byte jump. Both must sit within ±2 GiB (aarch64: ±128 MiB)
//! of the patched code so that rel32 operands and the short entry jump
//! reach, so memhook maps 64 KiB regions in the free gaps of the address
//! space closest to the target (`/proc/self/maps`, `MAP_FIXED_NOREPLACE`)
//! and hands out 256-byte slots from them. Slots are never unmapped: a
//! thread may still be running in one after its patch is undone. The
//! regions are mapped with the system call itself: they are memhook's own
//! and send no event (a handler must never run while memhook holds a
//! lock of its own).

use core::ops::ControlFlow;

use memhook_core::patch::PatchError;

use crate::code::protect;
use crate::maps;

/// Bytes per slot as handed out (a trampoline is at most `MAX_TRAMPOLINE`
/// = 192 bytes); [`trim`] gives back what a trampoline does not use.
pub const SLOT: usize = 256;
/// Bytes per mapped region.
pub const REGION: usize = 64 * 1024;
const MAX_REGIONS: usize = 128;
/// Lowest address memhook maps at (above `vm.mmap_min_addr`).
const LOW: usize = 0x100_0000;
/// Highest user address on x86_64 and aarch64 (47/48-bit).
const HIGH: usize = 0x7fff_ffff_0000;

#[derive(Clone, Copy)]
struct Region {
    base: usize,
    next: usize,
}

static REGIONS: crate::fork::Mutex<heapless::Vec<Region, MAX_REGIONS>> = crate::fork::Mutex::new(heapless::Vec::new());

/// Whether `[slot, slot + SLOT)` lies entirely within `reach` of `near`.
fn within(slot: usize, near: usize, reach: usize) -> bool {
    slot.abs_diff(near) < reach && (slot + SLOT).abs_diff(near) < reach
}

/// Maps a region within `reach` of `near`, trying the free gaps nearest it.
fn map_near(near: usize, reach: usize) -> Option<usize> {
    let mut candidates: heapless::Vec<usize, 32> = heapless::Vec::new();
    let mut prev_end = LOW;
    let mut consider = |gap_start: usize, gap_end: usize| {
        let gap_start = gap_start.max(LOW).next_multiple_of(REGION);
        if gap_end < gap_start + REGION {
            return;
        }
        let last = (gap_end - REGION) & !(REGION - 1);
        let want = (near & !(REGION - 1)).clamp(gap_start, last);
        if within(want, near, reach) && within(want + REGION - SLOT, near, reach) {
            if candidates.is_full() {
                // Keep the 32 nearest.
                let (far_i, far) = candidates
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, c)| c.abs_diff(near))
                    .map(|(i, c)| (i, *c))
                    .unwrap();
                if want.abs_diff(near) < far.abs_diff(near) {
                    candidates[far_i] = want;
                }
            } else {
                let _ = candidates.push(want);
            }
        }
    };
    let _ = maps::for_each(|m| {
        if m.start > prev_end {
            consider(prev_end, m.start);
        }
        prev_end = prev_end.max(m.end);
        ControlFlow::Continue(())
    });
    if prev_end < HIGH {
        consider(prev_end, HIGH);
    }
    candidates.sort_unstable_by_key(|c| c.abs_diff(near));
    for &at in &candidates {
        // The system calls themselves, not libc's functions, which may be
        // hooked: memhook's own regions are no event, since a handler run
        // now would run under memhook's locks (this one, and the install's
        // or the CUDA hooks' state), and one that asked `status()` would
        // wait on itself.
        // Every argument a full word: the kernel reads whole registers,
        // and a narrower variadic argument leaves the rest undefined.
        let word = |v: usize| v as libc::c_long;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping;
        // the result is checked, and a kernel that ignores the flag (before
        // 4.17) treats the address as a hint, which is checked too.
        let p = unsafe {
            crate::sys::syscall!(
                libc::SYS_mmap,
                word(at),
                word(REGION),
                libc::c_long::from(libc::PROT_READ | libc::PROT_EXEC),
                libc::c_long::from(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE),
                -1 as libc::c_long,
                0 as libc::c_long,
            )
        };
        if p == -1 {
            continue; // `syscall!` answers -1 for every error, as libc's `syscall`
        }
        if p as usize == at {
            return Some(at);
        }
        // SAFETY: unmapping the region the kernel just gave us elsewhere.
        unsafe { crate::sys::syscall!(libc::SYS_munmap, p, word(REGION)) };
    }
    None
}

/// A slot within `reach` of `near`, from an existing region or a new one.
pub fn alloc_near(near: usize, reach: usize) -> Option<usize> {
    let mut regions = REGIONS.lock();
    for r in regions.iter_mut() {
        let slot = r.base + r.next;
        if r.next + SLOT <= REGION && within(slot, near, reach) {
            r.next += SLOT;
            return Some(slot);
        }
    }
    if regions.is_full() {
        return None;
    }
    let base = map_near(near, reach)?;
    let _ = regions.push(Region { base, next: SLOT });
    Some(base)
}

/// Makes sure `slots` slots within `reach` of `near` can be handed out
/// without mapping a region (one with room, or a new one): for patches
/// made where a mapping, and the events it sends, is unwelcome (under the
/// loader's lock). `false` where no region can be mapped there.
pub fn reserve_near(near: usize, reach: usize, slots: usize) -> bool {
    let mut regions = REGIONS.lock();
    if regions.iter().any(|r| {
        r.next + slots * SLOT <= REGION
            && within(r.base + r.next, near, reach)
            && within(r.base + REGION - SLOT, near, reach)
    }) {
        return true;
    }
    if regions.is_full() {
        return false;
    }
    let Some(base) = map_near(near, reach) else {
        return false;
    };
    let _ = regions.push(Region { base, next: 0 });
    true
}

/// Gives back the tail of `slot` past its first `used` bytes (rounded up
/// to [`GRAIN`]), when it is the last slot handed out from its region:
/// the trampolines of one library then sit next to each other, and a hook
/// that calls two of them in turn (an allocation and its free) reads one
/// or two cache lines of them, not two pages.
pub fn trim(slot: usize, used: usize) {
    let used = used.max(1).next_multiple_of(GRAIN);
    if used >= SLOT {
        return;
    }
    let mut regions = REGIONS.lock();
    if let Some(r) = regions.iter_mut().find(|r| r.base + r.next == slot + SLOT) {
        r.next -= SLOT - used;
    }
}

/// The alignment of a trimmed slot's end, and so of the next slot.
pub const GRAIN: usize = 32;

/// Writes code into a slot (the page stays executable throughout, so
/// threads running other slots of it are not disturbed).
///
/// # Errors
///
/// A protection error from `mprotect`.
pub fn write(slot: usize, code: &[u8]) -> Result<(), PatchError> {
    assert!(code.len() <= SLOT, "trampoline of {} bytes", code.len());
    // Two writers of slots on one page would race on its protection (one
    // making it read-only again while the other still writes).
    static WRITING: crate::fork::Mutex<()> = crate::fork::Mutex::new(());
    let _writing = WRITING.lock();
    protect(slot, code.len(), libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC)?;
    // SAFETY: the slot lies in a region we mapped and just made writable;
    // nothing executes it yet (it is not published until the entry patch).
    unsafe { core::ptr::copy_nonoverlapping(code.as_ptr(), slot as *mut u8, code.len()) };
    crate::code::flush_icache(slot, code.len());
    protect(slot, code.len(), libc::PROT_READ | libc::PROT_EXEC)
}

/// Regions mapped so far.
pub fn regions() -> usize {
    REGIONS.lock().len()
}

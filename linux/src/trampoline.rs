//! Trampoline slots in pages mapped near the code they serve.
//!
//! A trampoline holds the instructions a patch displaced and a jump back; a
//! far-jump slot holds an absolute jump to a hook that is out of reach of
//! the entry's 5-byte jump. Both must sit within ±2 GiB (aarch64: ±128 MiB)
//! of the patched code so that rel32 operands and the short entry jump
//! reach, so memhook maps 64 KiB regions in the free gaps of the address
//! space closest to the target (`/proc/self/maps`, `MAP_FIXED_NOREPLACE`;
//! where the mappings cannot be read, by asking for addresses around the
//! target in turn) and hands out 256-byte slots from them. Slots are
//! never unmapped: a thread may still be running in one after its patch
//! is undone. The regions are mapped with the system call itself: they
//! are memhook's own and send no event (a handler must never run while
//! memhook holds a lock of its own).

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
    let read = maps::for_each(|m| {
        if m.start > prev_end {
            consider(prev_end, m.start);
        }
        prev_end = prev_end.max(m.end);
        ControlFlow::Continue(())
    });
    if read.is_err() {
        return probe_near(near, reach);
    }
    if prev_end < HIGH {
        consider(prev_end, HIGH);
    }
    candidates.sort_unstable_by_key(|c| c.abs_diff(near));
    candidates.iter().copied().find(|&at| map_at(at))
}

/// Region-aligned addresses probed on each side of the target, one region
/// apart, where the mappings cannot be read ([`probe_near`]): 32 MiB.
const PROBED_CLOSE: usize = 512;

/// [`map_near`] where the process's mappings cannot be read (no `/proc`
/// mounted, no descriptor left): every region-aligned address within
/// [`PROBED_CLOSE`] regions of `near`, nearest first, then on each side
/// further out, twice as far each time, while in `reach`; each one asked
/// of the kernel with `MAP_FIXED_NOREPLACE`, which refuses an address
/// that is taken (0.35 ms for the 1,031 refusals from the middle of a
/// taken 1 GiB on the dev VM; once per region, which serves 256
/// trampolines). Libraries lie packed, but the space past the last of
/// them, and the holes their alignment leaves, are free.
fn probe_near(near: usize, reach: usize) -> Option<usize> {
    let base = near & !(REGION - 1);
    let fits = |at: usize| {
        (LOW..=HIGH - REGION).contains(&at) && within(at, near, reach) && within(at + REGION - SLOT, near, reach)
    };
    let close = (0..=PROBED_CLOSE).flat_map(|k| {
        let above = if k == 0 { None } else { base.checked_add(k * REGION) };
        [base.checked_sub(k * REGION), above]
    });
    let far = core::iter::successors(Some(PROBED_CLOSE * REGION * 2), |d: &usize| d.checked_mul(2))
        .take_while(|&d| d < reach)
        .flat_map(|d| [base.checked_sub(d), base.checked_add(d)]);
    close.chain(far).flatten().filter(|&at| fits(at)).find(|&at| map_at(at))
}

/// Maps a region at exactly `at` if nothing is mapped there.
fn map_at(at: usize) -> bool {
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
        return false; // `syscall!` answers -1 for every error, as libc's `syscall`
    }
    if p as usize == at {
        return true;
    }
    // SAFETY: unmapping the region the kernel just gave us elsewhere.
    unsafe { crate::sys::syscall!(libc::SYS_munmap, p, word(REGION)) };
    false
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
    keep(base);
    let _ = regions.push(Region { base, next: SLOT });
    Some(base)
}

/// Records a new region's pages as memhook's for good (regions are never
/// unmapped): a discarding `madvise` over them would leave zeros where
/// the hooks' trampolines are (`crate::kept`).
fn keep(base: usize) {
    // The table has room for every region (`kept::SLOTS`); were it full,
    // the region would only go unkept.
    let _ = crate::kept::keep(base, REGION);
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
    keep(base);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of `len` bytes the kernel places, inaccessible: taken space.
    fn taken(len: usize) -> usize {
        // SAFETY: a new private anonymous mapping, unmapped by the caller.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
    }

    /// Without a map of the address space ([`probe_near`], where the
    /// mappings cannot be read), a region is found past taken space: from
    /// the middle of a 16 MiB block, outside the block, within reach,
    /// mapped executable; and none where the reach ends inside the block.
    #[test]
    fn probing_finds_a_region_past_taken_space_within_reach() {
        let len = 16 << 20;
        let block = taken(len);
        let near = block + len / 2;
        assert_eq!(probe_near(near, 4 << 20), None, "nothing is free within 4 MiB");
        let at = probe_near(near, 1 << 30).expect("a region within 1 GiB");
        assert!(
            at + REGION <= block || at >= block + len,
            "{at:#x} inside the block at {block:#x}"
        );
        assert!(within(at, near, 1 << 30) && within(at + REGION - SLOT, near, 1 << 30));
        let m = maps::find(at).expect("the region is mapped");
        assert_eq!(m.prot, libc::PROT_READ | libc::PROT_EXEC);
        // SAFETY: the region probe_near mapped (handed to no one) and the
        // block mapped above.
        unsafe {
            libc::munmap(at as *mut libc::c_void, REGION);
            libc::munmap(block as *mut libc::c_void, len);
        }
    }
}

//! Hugetlb mappings: anonymous memory mapped with `MAP_HUGETLB`, files on
//! a hugetlbfs mount, `memfd_create(MFD_HUGETLB)` files, SysV segments
//! made with `SHM_HUGETLB`. The kernel maps, moves and discards them in
//! whole huge pages, whatever length a call gives:
//! `mmap(MAP_FIXED | MAP_HUGETLB, 4 KiB)` replaces 2 MiB, `mremap` of 4
//! KiB of one moves 2 MiB (Linux 5.16 on), `shmat` of a 4 KiB
//! `SHM_HUGETLB` segment maps 2 MiB, and `madvise(MADV_DONTNEED)` of 4
//! KiB at its start discards 2 MiB on Linux 5.19 to 6.8 (6.9 rounds the
//! end down instead; older kernels refuse). A hook that reported the
//! call's length in base pages reported less than went, and a
//! registration cache kept registrations of pages the process no longer
//! has: the host hooks report these calls' ranges in the mapping's own
//! page size, from what this module finds.
//!
//! For new anonymous memory the call says which: `MAP_HUGETLB` and the
//! size in its flags. For a new mapping of a file or a segment, and one
//! that exists (`mremap`, `madvise`), the kernel is asked
//! (`PROCMAP_QUERY` on `/proc/self/maps`, Linux 6.11, about 1 us), or,
//! where it cannot answer, the mapping's line in `/proc/self/maps` is
//! read and its device compared with those of the kernel's own hugetlbfs
//! mounts (learnt once, from a `memfd_create(MFD_HUGETLB)` of each size)
//! and of the hugetlbfs mounts in `/proc/self/mountinfo`. An existing
//! mapping is asked of only in a process that has a hugetlb mapping: the
//! hooks that make one say so (`made`), and one look over the process's
//! mappings answers the question after an install or a new handler (the
//! hooks may not have run for a while before: `forget`). Everything here
//! is allocation-free and safe in a signal handler (system calls on the
//! stack's buffers), and leaves errno as it finds it: the hooks ask
//! before the calls they hook, whose callers see the errno of their own
//! call alone. [`support`] says what applies in this process
//! (`memhook doctor`'s `hugetlb:` line).

use core::ffi::c_int;
use core::ops::ControlFlow;
use core::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::maps::{Ask, Mapping, Queries, keeping_errno, page_size};

/// `statfs.f_type` of hugetlbfs.
const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;

/// Where `mmap`'s and `memfd_create`'s flags carry a huge page size's
/// log2 (`MAP_HUGE_SHIFT`, `MFD_HUGE_SHIFT`), and its mask.
const HUGE_SHIFT: u32 = 26;
const HUGE_MASK: c_int = 0x3f;

/// The huge page sizes the kernel offers: bit `k` for `2^k` bytes; bit 0
/// once found (never a size); 0 before.
static SIZES: AtomicU64 = AtomicU64::new(0);

/// The device of the kernel's own hugetlbfs mount of each size (index
/// `k`), as `major << 32 | minor`, plus one (0: none found).
static DEVICES: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// The default huge page size (`MAP_HUGETLB` without a size); 0 before
/// it is found or where there is none.
static DEFAULT: AtomicUsize = AtomicUsize::new(0);

/// Whether the process may have a hugetlb mapping: [`ABSENT`] or
/// [`PRESENT_NOW`] where known (neither: look), and above them the count
/// of [`forget`]s, so that a look that a `forget` overtook does not
/// record what it found (a mapping made before that `forget`, unseen,
/// may have come after the look passed its address).
static PRESENT: AtomicU64 = AtomicU64::new(0);
const ABSENT: u64 = 1;
const PRESENT_NOW: u64 = 2;
const FORGOTTEN: u64 = 4;

/// How hugetlb memory is sized here (`memhook doctor`'s `hugetlb:` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Support {
    /// The huge page sizes the kernel offers: bit `k` for `2^k` bytes
    /// (none: the kernel has no hugetlb, or refuses
    /// `memfd_create(MFD_HUGETLB)`, and every mapping is sized in base
    /// pages).
    pub sizes: u64,
    /// Whether the kernel tells a mapping's page size (`PROCMAP_QUERY`,
    /// Linux 6.11); else `/proc/self/maps` and `/proc/self/mountinfo`
    /// are read.
    pub query: bool,
    /// Whether `MADV_DONTNEED` rounds a hugetlb range's end up to a huge
    /// page here (Linux 5.19 to 6.8): its `VM_UNMAPPED` then runs to the
    /// end of the huge page.
    pub madvise_rounds_up: bool,
}

/// How hugetlb memory is sized in this process ([`Support`]).
pub fn support() -> Support {
    // Any mapped address will do: this function's own code.
    let query = query(support as *const () as usize, false).is_ok();
    Support {
        sizes: sizes(),
        query,
        madvise_rounds_up: madvise_rounds_up(),
    }
}

/// The process has a hugetlb mapping of `page` bytes' pages, if `page`
/// is larger than the base page (a hook made one).
#[inline]
pub(crate) fn made(page: usize) {
    if page > page_size() {
        PRESENT.fetch_or(PRESENT_NOW, Ordering::AcqRel);
    }
}

/// The hooks may not have seen every mapping made since the last look (an
/// install, a handler that wants events the hooks let pass before): the
/// next question looks again, unless a hugetlb mapping is known.
pub(crate) fn forget() {
    let _ = PRESENT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
        (s & PRESENT_NOW == 0).then(|| (s & !(FORGOTTEN - 1)) + FORGOTTEN)
    });
}

/// The huge page sizes (bit `k` for `2^k` bytes), found once.
fn sizes() -> u64 {
    match SIZES.load(Ordering::Acquire) {
        0 => probe(),
        found => found & !1,
    }
}

/// Finds the sizes and the devices of their mounts: a
/// `memfd_create(MFD_HUGETLB)` of each size from 64 KiB to 16 GiB (the
/// sizes of x86_64 and arm64 kernels) succeeds where the kernel offers
/// it, with or without pages reserved, and its file lies on that size's
/// mount. A kernel older than 4.14 or a filter that refuses the call:
/// no sizes, and mappings are sized in base pages. A probe that found
/// no descriptor (or memory) to spare for a memfd is not kept: the next
/// question probes again, rather than taking huge pages for base pages
/// for the process's life.
#[cold]
fn probe() -> u64 {
    keeping_errno(probe_sizes)
}

/// [`probe`]'s work (its refused `memfd_create`s set errno).
fn probe_sizes() -> u64 {
    let mut sizes = 0u64;
    let mut short = false;
    for k in 16..=34 {
        let made = memfd_huge(k << HUGE_SHIFT);
        short |= made.is_none() && out_of_room(crate::maps::errno());
        if let Some(fd) = made {
            let mut st = core::mem::MaybeUninit::<libc::stat>::zeroed();
            // SAFETY: fstat fills `st` or fails.
            if unsafe { libc::fstat(fd, st.as_mut_ptr()) } == 0 {
                // SAFETY: filled by fstat.
                let st = unsafe { st.assume_init() };
                DEVICES[k as usize].store(
                    device(libc::major(st.st_dev), libc::minor(st.st_dev)),
                    Ordering::Relaxed,
                );
                sizes |= 1 << k;
            }
            // The descriptor opened above, closed once.
            crate::sys::close(fd);
        }
    }
    match memfd_huge(0) {
        Some(fd) => {
            if let Some(page) = memfd_page(fd) {
                DEFAULT.store(page, Ordering::Relaxed);
            }
            crate::sys::close(fd);
        }
        None => short |= out_of_room(crate::maps::errno()),
    }
    if !short {
        SIZES.store(sizes | 1, Ordering::Release);
    }
    sizes
}

/// Whether a refused `memfd_create` was refused for want of a descriptor
/// (the process's limit, the system's) or of memory: a refusal that says
/// nothing of the sizes the kernel offers.
fn out_of_room(errno: c_int) -> bool {
    matches!(errno, libc::EMFILE | libc::ENFILE | libc::ENOMEM)
}

/// A hugetlb memfd of the size `size_flags` names (0: the default).
fn memfd_huge(size_flags: c_int) -> Option<c_int> {
    // SAFETY: a NUL-terminated name and flags; the file is empty (nothing
    // reserved) and closed by the caller.
    let fd = unsafe {
        libc::memfd_create(
            c"memhook-hugetlb".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_HUGETLB | size_flags as libc::c_uint,
        )
    };
    (fd >= 0).then_some(fd)
}

/// The huge page size of the hugetlb memfd open at `fd` (its file
/// system's block size: a local one, the kernel's own mount).
fn memfd_page(fd: c_int) -> Option<usize> {
    let mut sf = core::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs fills `sf` or fails.
    if unsafe { libc::fstatfs(fd, sf.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: filled by fstatfs.
    let sf = unsafe { sf.assume_init() };
    (sf.f_type as u32 == HUGETLBFS_MAGIC && sf.f_bsize > 0).then_some(sf.f_bsize as usize)
}

/// [`DEVICES`]'s form of a device.
fn device(major: u32, minor: u32) -> u64 {
    ((u64::from(major) << 32) | u64::from(minor)) + 1
}

/// The page size of anonymous memory `mmap` with `flags` makes: the
/// huge page size for `MAP_HUGETLB` (the one its flags name, or the
/// default), the base page otherwise (one test). Noted ([`made`]) by the
/// caller once the mapping exists.
#[inline(always)]
pub(crate) fn of_anonymous(flags: c_int) -> usize {
    if flags & libc::MAP_HUGETLB == 0 {
        return page_size();
    }
    of_huge_flags(flags)
}

/// [`of_anonymous`] for `MAP_HUGETLB`.
#[inline(never)]
fn of_huge_flags(flags: c_int) -> usize {
    let base = page_size();
    let log2 = (flags >> HUGE_SHIFT) & HUGE_MASK;
    if log2 != 0 {
        return 1usize.checked_shl(log2 as u32).unwrap_or(base).max(base);
    }
    let _ = sizes();
    DEFAULT.load(Ordering::Relaxed).max(base)
}

/// The page size of the file open at `fd`, for `mmap` with `MAP_FIXED`,
/// which must know the range it replaces before the call: by the file's
/// device ([`hugetlbfs_device`]) against those of the hugetlbfs mounts
/// (the kernel's own, and `/proc/self/mountinfo`'s). The base page for
/// any other file.
#[cold]
pub(crate) fn of_file(fd: c_int) -> usize {
    keeping_errno(|| {
        let base = page_size();
        let Some(dev) = hugetlbfs_device(fd) else {
            return base;
        };
        internal_page(dev)
            .or_else(|| Mounts::read().page_of(dev))
            .map_or(base, |page| page.max(base))
    })
}

/// The page size of the mapping `mmap` just made at `address` of the
/// file open at `fd`: the base page for a file that cannot lie on
/// hugetlbfs ([`hugetlbfs_device`]: a device such as the GPU driver's,
/// a file on a disk); a hugetlb memfd's by its device; otherwise asked
/// of the kernel where a huge page can start there. Noted ([`made`]) by
/// the caller.
#[cold]
pub(crate) fn of_file_at(fd: c_int, address: usize) -> usize {
    match keeping_errno(|| hugetlbfs_device(fd)) {
        None => page_size(),
        Some(dev) => internal_page(dev).unwrap_or_else(|| of_new_at(address)),
    }
}

/// The device ([`device`]'s form) of the file open at `fd`, if it could
/// lie on hugetlbfs: a regular file on a device without a major number
/// (hugetlbfs's, as tmpfs's, a network file system's, an overlay's);
/// not a device file (the GPU driver maps its own), not a file on a
/// disk. As the kernel has it: `statx` with `AT_STATX_DONT_SYNC` asks
/// the file system nothing, where a `statfs` would ask a network file
/// system's servers (all of Lustre's) and block on one that stopped
/// answering. `None` too where there are no huge page sizes, or `statx`
/// is refused.
fn hugetlbfs_device(fd: c_int) -> Option<u64> {
    if fd < 0 || sizes() == 0 {
        return None;
    }
    let mut stx = core::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH names `fd`
    // itself; statx fills `stx` or fails. The device comes with every
    // answer; the type is asked.
    let r = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE,
            stx.as_mut_ptr(),
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: filled by statx.
    let stx = unsafe { stx.assume_init() };
    let regular = u32::from(stx.stx_mode) & libc::S_IFMT == libc::S_IFREG;
    (regular && stx.stx_dev_major == 0).then(|| device(0, stx.stx_dev_minor))
}

/// The page size of the mapping a call just made at `address` (a file's,
/// a segment's): asked of the kernel where a huge page can start there,
/// the base page elsewhere; noted ([`made`]).
#[cold]
pub(crate) fn of_new_at(address: usize) -> usize {
    let page = if may_start_huge_page(address) {
        page_here(address)
    } else {
        page_size()
    };
    made(page);
    page
}

/// Whether a hugetlb mapping can start at `address`: the kernel offers
/// huge pages, and the smallest's boundary lies there. Elsewhere a
/// mapping that starts (or a call that must start) there is one of base
/// pages, and nothing need be asked.
pub(crate) fn may_start_huge_page(address: usize) -> bool {
    size_range().is_some_and(|(smallest, _)| address.is_multiple_of(smallest))
}

/// The huge page size of the kernel's own hugetlbfs mount of device
/// `dev` ([`device`]'s form), if it is one.
fn internal_page(dev: u64) -> Option<usize> {
    let sizes = sizes();
    DEVICES
        .iter()
        .enumerate()
        .find(|&(k, known)| sizes & (1 << k) != 0 && known.load(Ordering::Relaxed) == dev)
        .map(|(k, _)| 1 << k)
}

/// Whether `madvise`'s discarding advices round a hugetlb range's end up
/// to a huge page: Linux 5.19 (the first to take them on hugetlb) to
/// 6.8; 6.9 rounds it down (`8ebe0a5eaaeb`). Where the release cannot
/// be read, yes: a report too large costs a cache a registration it
/// makes again, one too small a stale one.
pub(crate) fn madvise_rounds_up() -> bool {
    #[cfg(test)]
    match tests::ROUNDS_UP.load(Ordering::Relaxed) {
        0 => {}
        v => return v == 2,
    }
    static ROUNDS_UP: AtomicU8 = AtomicU8::new(0);
    match ROUNDS_UP.load(Ordering::Relaxed) {
        0 => {
            let mut uts = core::mem::MaybeUninit::<libc::utsname>::zeroed();
            // SAFETY: uname fills `uts` or fails.
            let release = if unsafe { libc::uname(uts.as_mut_ptr()) } == 0 {
                // SAFETY: filled by uname (NUL-terminated fields).
                let uts = unsafe { uts.assume_init() };
                release_of(&uts.release)
            } else {
                None
            };
            let yes = rounds_up_in(release);
            ROUNDS_UP.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        v => v == 2,
    }
}

/// [`madvise_rounds_up`] for a kernel release (major, minor).
fn rounds_up_in(release: Option<(u32, u32)>) -> bool {
    release.is_none_or(|r| ((5, 19)..(6, 9)).contains(&r))
}

/// The major and minor numbers of a release string (`"6.8.0-45-generic"`).
fn release_of(field: &[libc::c_char]) -> Option<(u32, u32)> {
    let mut parts = [0u32; 2];
    let mut i = 0;
    let mut digits = 0;
    for &c in field {
        let c = c as u8;
        if c.is_ascii_digit() {
            parts[i] = parts[i].checked_mul(10)?.checked_add(u32::from(c - b'0'))?;
            digits += 1;
        } else if c == b'.' && i == 0 && digits > 0 {
            i = 1;
            digits = 0;
        } else {
            break;
        }
    }
    (i == 1 && digits > 0).then_some((parts[0], parts[1]))
}

/// The smallest and the largest huge page size, if the kernel offers any.
pub(crate) fn size_range() -> Option<(usize, usize)> {
    let sizes = sizes();
    (sizes != 0).then(|| (1 << sizes.trailing_zeros(), 1 << (63 - sizes.leading_zeros())))
}

/// The page size of the mapping that holds `addr`, if the process may
/// have a hugetlb mapping (else, and where nothing is mapped there, the
/// base page). The first question after [`forget`] looks over every
/// mapping.
pub(crate) fn page_at(addr: usize) -> usize {
    if size_range().is_none() || !present() {
        return page_size();
    }
    page_here(addr)
}

/// The page size of the mapping that holds `addr` (the base page where
/// nothing is), asked of the kernel.
pub(crate) fn page_here(addr: usize) -> usize {
    let base = page_size();
    // (`PROCMAP_QUERY` of an address with no mapping sets ENOENT.)
    keeping_errno(|| match query(addr, false) {
        Ok(found) => found
            .filter(|&(start, _, _)| start <= addr)
            .map_or(base, |(_, _, page)| page),
        Err(()) => crate::maps::find(addr).map_or(base, |m| page_of(&m, &mut None)),
    })
}

/// Whether the process may have a hugetlb mapping: known by the hooks,
/// or found by a look over the mappings after [`forget`].
fn present() -> bool {
    present_by(look)
}

/// [`present`], with `look` to look over the mappings.
fn present_by(look: impl FnOnce() -> bool) -> bool {
    let before = PRESENT.load(Ordering::Acquire);
    if before & PRESENT_NOW != 0 {
        return true;
    }
    if before & ABSENT != 0 {
        return false;
    }
    if look() {
        PRESENT.fetch_or(PRESENT_NOW, Ordering::AcqRel);
        return true;
    }
    // Recorded only if nothing happened meanwhile: a hook that made one
    // has said so, and after a `forget` the next question looks again.
    match PRESENT.compare_exchange(before, before | ABSENT, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => false,
        Err(now) => now & PRESENT_NOW != 0,
    }
}

/// Whether any mapping of the process is a hugetlb one.
#[cold]
fn look() -> bool {
    keeping_errno(look_over)
}

/// [`look`]'s work.
fn look_over() -> bool {
    let base = page_size();
    let by_query = Queries::open().and_then(|q| {
        let mut at = 0usize;
        loop {
            match q.ask(at, Ask::HOLDING.or_next()) {
                Ok(Some((m, page))) => {
                    if page > base {
                        return Ok(true);
                    }
                    if m.end <= at {
                        return Ok(false);
                    }
                    at = m.end;
                }
                Ok(None) => return Ok(false),
                Err(()) => return Err(()),
            }
        }
    });
    if let Ok(found) = by_query {
        return found;
    }
    let mut mounts = None;
    let mut found = false;
    let _ = crate::maps::for_each(|m| {
        found = page_of(m, &mut mounts) > base;
        if found {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    found
}

/// `PROCMAP_QUERY` of the mapping that holds `addr` (or, with `next`, of
/// the first one that ends past it): its start, end and page size, or
/// `None` where there is none; `Err` where the kernel does not answer
/// (older than 6.11, no `/proc`).
fn query(addr: usize, next: bool) -> Result<Option<(usize, usize, usize)>, ()> {
    let ask = if next { Ask::HOLDING.or_next() } else { Ask::HOLDING };
    let found = Queries::open()?.ask(addr, ask)?;
    Ok(found.map(|(m, page)| (m.start, m.end, page)))
}

/// The page size of a mapping by its line in `/proc/self/maps`: a huge
/// page size where its device is that of the kernel's own hugetlbfs
/// mount of that size (anonymous `MAP_HUGETLB` memory, `SHM_HUGETLB`
/// segments, hugetlb memfds) or of one of the hugetlbfs `mounts` (its
/// files, removed ones too); the base page otherwise. Only a mapping
/// whose ends are huge-page aligned, on a device without a major number,
/// can be one; `mounts` is read the first time one needs it. Nothing is
/// asked of the file itself (a `statfs` of a path on a server that
/// stopped answering would block the hook).
fn page_of(m: &Mapping, mounts: &mut Option<Mounts>) -> usize {
    let base = page_size();
    let Some((smallest, _)) = size_range() else {
        return base;
    };
    if !m.start.is_multiple_of(smallest) || !m.end.is_multiple_of(smallest) || m.dev.0 != 0 {
        return base;
    }
    let dev = device(m.dev.0, m.dev.1);
    internal_page(dev)
        .or_else(|| mounts.get_or_insert_with(Mounts::read).page_of(dev))
        .map_or(base, |page| page.max(base))
}

/// The hugetlbfs mounts of `/proc/self/mountinfo`: each one's device and
/// page size (up to 16; more are left out).
struct Mounts {
    found: [(u64, usize); 16],
    count: usize,
}

impl Mounts {
    /// Read from `/proc/self/mountinfo` (none where it cannot be).
    fn read() -> Mounts {
        let mut mounts = Mounts {
            found: [(0, 0); 16],
            count: 0,
        };
        let _ = crate::maps::for_each_line(c"/proc/self/mountinfo", &mut |line| {
            if let Some(mount) = hugetlbfs_mount(line)
                && mounts.count < mounts.found.len()
            {
                mounts.found[mounts.count] = mount;
                mounts.count += 1;
            }
            ControlFlow::Continue(())
        });
        mounts
    }

    /// The page size of the mount of device `dev` ([`device`]'s form).
    fn page_of(&self, dev: u64) -> Option<usize> {
        self.found[..self.count]
            .iter()
            .find(|&&(d, _)| d == dev)
            .map(|&(_, page)| page)
    }
}

/// The device ([`device`]'s form) and page size of the mount a line of
/// `/proc/self/mountinfo` describes, if it is hugetlbfs: `36 35 0:33 /
/// /dev/hugepages rw,relatime shared:16 - hugetlbfs hugetlbfs
/// rw,pagesize=2M` (the size from the super options; the default size
/// where they have none).
fn hugetlbfs_mount(line: &[u8]) -> Option<(u64, usize)> {
    let mut fields = line.split(|&c| c == b' ').filter(|f| !f.is_empty());
    let dev = fields.nth(2)?;
    let mut rest = fields.skip_while(|&f| f != b"-");
    rest.next()?;
    if rest.next()? != b"hugetlbfs" {
        return None;
    }
    let options = rest.nth(1).unwrap_or(b"");
    let colon = dev.iter().position(|&c| c == b':')?;
    let number = |digits: &[u8]| crate::maps::parse_decimal(digits).map(|n| n as u32);
    let dev = device(number(&dev[..colon])?, number(&dev[colon + 1..])?);
    let page = options
        .split(|&c| c == b',')
        .find_map(|o| o.strip_prefix(b"pagesize="))
        .and_then(page_size_option)
        .or_else(|| {
            let _ = sizes();
            Some(DEFAULT.load(Ordering::Relaxed)).filter(|&p| p != 0)
        })?;
    Some((dev, page))
}

/// A `pagesize=` option's value: digits and a unit (`2M`, `1G`, `64K`).
fn page_size_option(value: &[u8]) -> Option<usize> {
    let (&unit, digits) = value.split_last()?;
    let shift = match unit {
        b'K' => 10,
        b'M' => 20,
        b'G' => 30,
        _ => return None,
    };
    if digits.len() > 6 {
        return None;
    }
    let n = crate::maps::parse_decimal(digits)? as usize;
    n.checked_shl(shift).filter(|p| p.is_power_of_two())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use memhook_core::event::Event;
    use std::sync::Mutex;

    use crate::maps::tests::QUERY_OFF;
    /// [`madvise_rounds_up`]'s answer while not 0: 1 no, 2 yes.
    pub(crate) static ROUNDS_UP: AtomicU8 = AtomicU8::new(0);
    /// Taken by the tests that set those, or map hugetlb memory.
    pub(crate) static HUGE_TESTS: Mutex<()> = Mutex::new(());

    const M2: usize = 2 << 20;

    /// `support` tells what the hooks use: the sizes probed, whether the
    /// kernel answered, the release's rounding.
    #[test]
    fn support_says_how_mappings_are_sized() {
        let _t = HUGE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let s = support();
        assert_eq!(s.sizes, sizes());
        assert_eq!(s.madvise_rounds_up, madvise_rounds_up());
        let here = support as *const () as usize;
        assert_eq!(s.query, query(here, false).is_ok());
        if s.query {
            let (start, end, page) = query(here, false).unwrap().unwrap();
            assert!(start <= here && here < end && page == page_size());
        }
        QUERY_OFF.store(true, Ordering::Relaxed);
        assert!(!support().query);
        QUERY_OFF.store(false, Ordering::Relaxed);
    }

    /// A probe made with no descriptor to spare (every one under the
    /// process's limit open) finds no sizes and is not kept: the next
    /// question, with descriptors back, finds what a probe with them
    /// finds. Before, the first probe's empty answer was kept for the
    /// process's life, and its hugetlb mappings were sized in base pages.
    /// In a child of a fork (the limit and the descriptors are its own).
    #[test]
    fn a_probe_with_no_descriptor_to_spare_is_not_kept() {
        let _t = HUGE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let expected = probe_sizes();
        // SAFETY: the child makes system calls only (no allocation, no
        // lock another thread may hold) and ends by _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = (|| {
                SIZES.store(0, Ordering::Relaxed);
                let limit = libc::rlimit {
                    rlim_cur: 64,
                    rlim_max: 64,
                };
                // SAFETY: plain values.
                if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
                    return 10;
                }
                let (mut first, mut last) = (-1, -1);
                loop {
                    // SAFETY: a NUL-terminated path.
                    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
                    if fd < 0 {
                        break;
                    }
                    if first < 0 {
                        first = fd;
                    }
                    last = fd;
                }
                if sizes() != 0 || SIZES.load(Ordering::Relaxed) != 0 {
                    return 11;
                }
                for fd in first.max(0)..=last {
                    crate::sys::close(fd);
                }
                if sizes() != expected || SIZES.load(Ordering::Relaxed) != expected | 1 {
                    return 12;
                }
                0
            })();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child status {status:#x}");
        match libc::WEXITSTATUS(status) {
            0 => {}
            11 => panic!("a probe with no descriptor found sizes, or was kept"),
            12 => panic!("the probe after it did not find the sizes {expected:#x}"),
            c => panic!("child exit {c}"),
        }
    }

    #[test]
    fn the_kernel_release_says_whether_madvise_rounds_up() {
        let release = |s: &str| {
            let mut field = [0 as libc::c_char; 65];
            for (f, b) in field.iter_mut().zip(s.bytes()) {
                *f = b as libc::c_char;
            }
            release_of(&field)
        };
        assert_eq!(release("6.8.0-45-generic"), Some((6, 8)));
        assert_eq!(release("5.19"), Some((5, 19)));
        assert_eq!(release("10.1.2"), Some((10, 1)));
        assert_eq!(release("6.18.44-fc-v1252"), Some((6, 18)));
        assert_eq!(release("6"), None);
        assert_eq!(release("6."), None);
        assert_eq!(release(".8"), None);
        assert_eq!(release(""), None);
        assert_eq!(release("99999999999.1"), None);
        for (r, want) in [
            (Some((4, 18)), false),
            (Some((5, 18)), false),
            (Some((5, 19)), true),
            (Some((6, 1)), true),
            (Some((6, 8)), true),
            (Some((6, 9)), false),
            (Some((6, 18)), false),
            (None, true),
        ] {
            assert_eq!(rounds_up_in(r), want, "{r:?}");
        }
    }

    /// A hugetlbfs mount's device and page size from its line in
    /// `/proc/self/mountinfo`; other filesystems, and lines cut short,
    /// are none.
    #[test]
    fn hugetlbfs_mounts_are_read_from_mountinfo() {
        let _ = sizes();
        let default = DEFAULT.load(Ordering::Relaxed);
        let line = |s: &str| hugetlbfs_mount(s.as_bytes());
        assert_eq!(
            line("36 35 0:33 / /dev/hugepages rw,relatime shared:16 - hugetlbfs hugetlbfs rw,pagesize=2M"),
            Some((device(0, 33), M2))
        );
        assert_eq!(
            line("40 35 0:45 / /mnt/huge1g rw,relatime - hugetlbfs none rw,pagesize=1024M"),
            Some((device(0, 45), 1 << 30))
        );
        assert_eq!(
            line("41 35 0:46 / /mnt/h rw - hugetlbfs none rw,size=64M,pagesize=1G,min_size=0"),
            Some((device(0, 46), 1 << 30))
        );
        assert_eq!(
            line("42 35 0:47 / /mnt/k rw - hugetlbfs none rw,pagesize=64K"),
            Some((device(0, 47), 64 << 10))
        );
        // No size, or one the kernel never writes: the default.
        for odd in ["rw", "rw,pagesize=3M", "rw,pagesize=M"] {
            let found = line(&format!("43 35 0:48 / /mnt/d rw - hugetlbfs none {odd}"));
            assert_eq!(found, (default != 0).then_some((device(0, 48), default)), "{odd}");
        }
        for other in [
            "25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
            "26 25 0:22 / /dev/shm rw - tmpfs tmpfs rw,size=64M",
            "36 35 0:33 / /dev/hugepages rw",
            "36 35 0:33",
            "36 35 x:33 / /h rw - hugetlbfs none rw,pagesize=2M",
            "",
        ] {
            assert_eq!(line(other), None, "{other}");
        }
        // A mapping of a file on such a mount (removed: the path is no
        // use) is sized by its device; one beside it, on another, not.
        let mut mounts = Some(Mounts {
            found: [(device(0, 33), M2); 16],
            count: 1,
        });
        let mapping = |s: &str| crate::maps::parse_line(s.as_bytes()).unwrap();
        if size_range().is_some() {
            let huge = mapping("7f0000200000-7f0000600000 rw-s 00000000 00:21 77 /dev/hugepages/pool (deleted)");
            assert_eq!(page_of(&huge, &mut mounts), M2);
        }
        let other = mapping("7f0000200000-7f0000600000 rw-s 00000000 00:22 77 /dev/shm/pool");
        assert_eq!(page_of(&other, &mut mounts), page_size());
        let unaligned = mapping("7f0000201000-7f0000600000 rw-s 00000000 00:21 77 /dev/hugepages/pool");
        assert_eq!(page_of(&unaligned, &mut mounts), page_size());
        let on_a_disk = mapping("7f0000200000-7f0000600000 rw-s 00000000 08:01 77 /data/pool");
        let mut disk_mount = Some(Mounts {
            found: [(device(8, 1), M2); 16],
            count: 1,
        });
        assert_eq!(
            page_of(&on_a_disk, &mut disk_mount),
            page_size(),
            "a device with a major number"
        );
    }

    /// A private mapping of one 2 MiB hugetlb page, if the kernel has one
    /// free (`.ci/run` reserves some), and not under qemu-user (the
    /// aarch64 CI step says so: `MEMHOOK_TEST_QEMU`), which keeps its own
    /// map of the guest's pages in base pages and knows nothing of a
    /// hugetlb mapping's rounding.
    fn huge_page() -> Option<usize> {
        if std::env::var_os("MEMHOOK_TEST_QEMU").is_some() {
            eprintln!("under qemu-user: hugetlb mappings not checked");
            return None;
        }
        // SAFETY: a new private mapping, unmapped by the caller.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                M2,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | (21 << HUGE_SHIFT),
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            eprintln!("no free 2 MiB hugetlb page (/proc/sys/vm/nr_hugepages): not checked");
            return None;
        }
        Some(p as usize)
    }

    fn unmap(p: usize, len: usize) {
        // SAFETY: the test's own mapping.
        assert_eq!(unsafe { libc::munmap(p as *mut libc::c_void, len) }, 0);
    }

    /// An ordinary private mapping of `len` bytes.
    fn ordinary(len: usize) -> usize {
        // SAFETY: a new private mapping, unmapped by the caller.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
    }

    /// The size a new mapping's pages will have, from mmap's flags, or
    /// the file's device.
    #[test]
    fn a_new_mappings_page_comes_from_its_flags_or_its_file() {
        let base = page_size();
        assert_eq!(of_anonymous(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS), base);
        let huge = |log2: c_int| {
            of_anonymous(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | (log2 << HUGE_SHIFT))
        };
        assert_eq!(huge(21), M2);
        assert_eq!(huge(30), 1 << 30);
        // SAFETY: a NUL-terminated name; closed below.
        let plain = unsafe { libc::memfd_create(c"memhook-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(plain >= 0);
        assert_eq!(of_file(plain), base);
        assert_eq!(of_file(-1), base);
        // A device file, a file on a disk: not even looked up.
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(hugetlbfs_device(std::os::fd::AsRawFd::as_raw_fd(&null)), None);
        assert_eq!(of_file_at(std::os::fd::AsRawFd::as_raw_fd(&null), 0), base);
        assert!(
            hugetlbfs_device(plain).is_some(),
            "a memfd: tmpfs, a device without a major number"
        );
        // SAFETY: as above.
        unsafe { libc::close(plain) };
        let Some(fd) = memfd_huge(21 << HUGE_SHIFT) else {
            eprintln!("no hugetlb memfd here: not checked further");
            return;
        };
        assert_eq!(of_file(fd), M2, "by its device: the kernel's own mount");
        assert_eq!(of_file_at(fd, 12345), M2, "the same, not asked of a mapping");
        // SAFETY: as above.
        unsafe { libc::close(fd) };
        // The default: /proc/meminfo's Hugepagesize.
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: usize = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("Hugepagesize:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        assert_eq!(huge(0), kib * 1024);
        let (smallest, largest) = size_range().unwrap();
        assert!(smallest <= M2 && M2 <= largest, "{smallest:#x} {largest:#x}");
    }

    /// The page size of the mapping at an address, by `PROCMAP_QUERY` and
    /// by `/proc/self/maps` (as on a kernel older than 6.11), alike.
    #[test]
    fn a_mappings_page_is_found_by_query_and_by_maps() {
        let _t = HUGE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(huge) = huge_page() else {
            return;
        };
        let base = page_size();
        let plain = ordinary(4 * base);
        let hole = ordinary(base);
        unmap(hole, base);
        for off in [false, true] {
            QUERY_OFF.store(off, Ordering::Relaxed);
            assert_eq!(page_here(huge), M2, "query off: {off}");
            assert_eq!(page_here(huge + M2 - 1), M2, "query off: {off}");
            assert_eq!(page_here(plain + base), base, "query off: {off}");
            assert_eq!(page_here(hole), base, "query off: {off}");
            assert!(look(), "query off: {off}");
        }
        QUERY_OFF.store(false, Ordering::Relaxed);
        // Without it, the look finds none (no other test maps any while
        // this one holds the lock).
        unmap(huge, M2);
        for off in [false, true] {
            QUERY_OFF.store(off, Ordering::Relaxed);
            assert!(!look(), "query off: {off}");
        }
        QUERY_OFF.store(false, Ordering::Relaxed);
        unmap(plain, 4 * base);
    }

    /// A hugetlb mapping unknown to the hooks (made while none wanted its
    /// events) is found by the look that follows `forget`; one they made
    /// is known at once.
    #[test]
    fn a_hugetlb_mapping_is_known_after_forget_or_made() {
        let _t = HUGE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(huge) = huge_page() else {
            return;
        };
        let known = || PRESENT.load(Ordering::Acquire) & (ABSENT | PRESENT_NOW);
        PRESENT.store(ABSENT, Ordering::Release);
        assert_eq!(page_at(huge), page_size(), "no hugetlb mapping known: not asked");
        forget();
        assert_eq!(known(), 0);
        assert_eq!(page_at(huge), M2);
        assert_eq!(known(), PRESENT_NOW);
        forget();
        assert_eq!(known(), PRESENT_NOW, "forget keeps a known one");
        PRESENT.store(ABSENT, Ordering::Release);
        made(page_size());
        assert_eq!(known(), ABSENT, "a base page is no news");
        made(M2);
        assert_eq!(page_at(huge), M2);
        unmap(huge, M2);
        // A look that a forget overtook records nothing: the next one
        // looks again.
        PRESENT.store(0, Ordering::Release);
        let overtaken = || {
            forget();
            false
        };
        assert!(!present_by(overtaken));
        assert_eq!(known(), 0, "unknown still");
        assert!(!present(), "none left");
        assert_eq!(known(), ABSENT);
    }

    /// The questions the hooks ask before the calls they hook leave errno
    /// as they find it (the caller sees its own call's alone): the first
    /// one's probe (each size the kernel lacks fails: `ENODEV` here), a
    /// mapping asked of at an address with none (`PROCMAP_QUERY` says
    /// `ENOENT`), a look over the mappings, both ways, a file that cannot
    /// be asked of (`EBADF`).
    #[test]
    fn the_questions_leave_errno_as_they_find_it() {
        let _t = HUGE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let keeps = |what: &str, f: &dyn Fn()| {
            // SAFETY: this thread's errno.
            unsafe { *libc::__errno_location() = 77 };
            f();
            assert_eq!(crate::maps::errno(), 77, "{what}");
        };
        let found = sizes();
        SIZES.store(0, Ordering::Release);
        keeps("the probe", &|| {
            let _ = size_range();
        });
        assert_eq!(sizes(), found, "the same sizes found again");
        let state = PRESENT.load(Ordering::Acquire);
        // The lowest page: never mapped (`vm.mmap_min_addr`).
        let nothing = page_size();
        for off in [false, true] {
            QUERY_OFF.store(off, Ordering::Relaxed);
            keeps("nothing mapped", &|| assert_eq!(page_here(nothing), page_size()));
            PRESENT.store(0, Ordering::Release);
            keeps("a look", &|| {
                let _ = present();
            });
        }
        QUERY_OFF.store(false, Ordering::Relaxed);
        PRESENT.store(state, Ordering::Release);
        keeps("a bad descriptor", &|| {
            assert_eq!(of_file(i32::MAX), page_size());
            assert_eq!(of_file_at(i32::MAX, nothing), page_size());
        });
    }

    /// `madvise(MADV_DONTNEED)` of a hugetlb mapping's first 4 KiB, where
    /// the kernel rounds the end up (5.19 to 6.8): `VM_UNMAPPED` of the
    /// huge page; where it does not, or for ordinary memory, the 4 KiB;
    /// a range that ends in the huge page, from ordinary memory before
    /// it, to the huge page's end.
    #[test]
    fn a_hugetlb_discard_is_reported_as_the_kernel_makes_it() {
        let _t = HUGE_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(huge) = huge_page() else {
            return;
        };
        made(M2);
        let base = page_size();
        let plain = ordinary(base);
        let range = |e: Option<Event>| match e {
            Some(Event::VmUnmapped(v)) => (v.address, v.size),
            other => panic!("{other:?}"),
        };
        for off in [false, true] {
            QUERY_OFF.store(off, Ordering::Relaxed);
            ROUNDS_UP.store(2, Ordering::Relaxed);
            for advice in [libc::MADV_DONTNEED, crate::host::MADV_DONTNEED_LOCKED] {
                assert_eq!(range(crate::host::discarded(huge, base, advice)), (huge, M2));
            }
            assert_eq!(range(crate::host::discarded(huge, M2, libc::MADV_DONTNEED)), (huge, M2));
            assert_eq!(
                range(crate::host::discarded(huge - base, 2 * base, libc::MADV_DONTNEED)),
                (huge - base, M2 + base)
            );
            assert_eq!(
                range(crate::host::discarded(plain, 100, libc::MADV_DONTNEED)),
                (plain, base)
            );
            // MADV_REMOVE rounds inward, MADV_FREE is refused: as given.
            assert_eq!(
                range(crate::host::discarded(huge, base, libc::MADV_REMOVE)),
                (huge, base)
            );
            ROUNDS_UP.store(1, Ordering::Relaxed);
            assert_eq!(
                range(crate::host::discarded(huge, base, libc::MADV_DONTNEED)),
                (huge, base)
            );
        }
        QUERY_OFF.store(false, Ordering::Relaxed);
        ROUNDS_UP.store(0, Ordering::Relaxed);
        unmap(plain, base);
        unmap(huge, M2);
    }
}

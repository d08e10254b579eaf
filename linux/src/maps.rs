//! Reading `/proc/self/maps` without allocating.
//!
//! Each call opens the file itself and parses it through a buffer on its own
//! stack, so concurrent readers never share state, and an allocator that
//! embeds memhook can call it. Where the kernel answers `PROCMAP_QUERY`
//! (Linux 6.11), a question about one address ([`find`]) asks it of that
//! mapping alone, in binary (about 0.2 us, where the text is generated and
//! parsed line by line up to the address), and a look at the mappings of
//! files ([`for_each_of_files`]) has the kernel pass over the anonymous
//! ones; elsewhere the text is read.

use core::ffi::c_int;
use core::ops::ControlFlow;
use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Longest path kept per mapping (longer ones are cut).
pub const PATH_CAPACITY: usize = 256;

/// One line of `/proc/self/maps`.
#[derive(Clone, Copy)]
pub struct Mapping {
    /// First address.
    pub start: usize,
    /// One past the last address.
    pub end: usize,
    /// `PROT_READ | PROT_WRITE | PROT_EXEC` bits.
    pub prot: i32,
    /// Whether the mapping is shared (`s`) rather than private (`p`).
    pub shared: bool,
    /// Offset in the file.
    pub offset: u64,
    /// The file's device (major, minor); (0, 0) for anonymous memory.
    pub dev: (u32, u32),
    /// The file's inode; 0 for anonymous memory.
    pub inode: u64,
    /// The path: its first `path_len` bytes are written, the rest not
    /// (a line's parse, or the kernel's answer, writes only what the path
    /// has: most are short, many empty).
    path: [core::mem::MaybeUninit<u8>; PATH_CAPACITY],
    path_len: usize,
}

impl Mapping {
    /// No mapping: [`Queries::ask_into`] writes one over it.
    const EMPTY: Mapping = Mapping {
        start: 0,
        end: 0,
        prot: 0,
        shared: false,
        offset: 0,
        dev: (0, 0),
        inode: 0,
        path: [core::mem::MaybeUninit::uninit(); PATH_CAPACITY],
        path_len: 0,
    };

    /// The path or pseudo-path (`[heap]`, `[vdso]`), possibly empty.
    pub fn path(&self) -> &[u8] {
        // SAFETY: `parse_line` (from the line) or `Queries::ask` (the
        // kernel, into the buffer it was given) wrote the first
        // `path_len` bytes (at most PATH_CAPACITY), and nothing unwrites
        // them.
        unsafe { core::slice::from_raw_parts(self.path.as_ptr().cast::<u8>(), self.path_len) }
    }

    /// Whether this maps an NVIDIA device file (`/dev/nvidia0`,
    /// `/dev/nvidiactl`, `/dev/nvidia-uvm`, ...): the CUDA driver's
    /// mappings of device, pinned and managed memory.
    pub fn is_gpu(&self) -> bool {
        self.path().starts_with(b"/dev/nvidia")
    }

    /// Whether `addr` lies in the mapping.
    pub fn contains(&self, addr: usize) -> bool {
        (self.start..self.end).contains(&addr)
    }
}

impl core::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{:#x}-{:#x} prot {} {}",
            self.start,
            self.end,
            self.prot,
            String::from_utf8_lossy(self.path())
        )
    }
}

/// The value of a hexadecimal digit, either case.
#[inline(always)]
fn hex_digit(c: u8) -> Option<u64> {
    match c {
        b'0'..=b'9' => Some(u64::from(c - b'0')),
        b'a'..=b'f' => Some(u64::from(c - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(c - b'A' + 10)),
        _ => None,
    }
}

/// A line's fields, read once from the front: a step reads a field and
/// stops on the byte after it; a field that follows a space skips the
/// spaces before it first (one or more part such fields), one that
/// follows its `-` or `:` starts right there.
struct Fields<'a> {
    line: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    /// Moves past the spaces at the cursor.
    #[inline(always)]
    fn skip_spaces(&mut self) {
        while self.line.get(self.at) == Some(&b' ') {
            self.at += 1;
        }
    }

    /// Whether the byte at the cursor ends a field that `end` ends: `end`
    /// itself (taken), or, for a field ended by a space, the line's end.
    #[inline(always)]
    fn ends(&mut self, end: u8) -> Option<bool> {
        match self.line.get(self.at) {
            Some(&c) if c == end => {
                self.at += 1;
                Some(true)
            }
            Some(_) => Some(false),
            None if end == b' ' => Some(true),
            None => None,
        }
    }

    /// A hexadecimal number of one to sixteen digits at the cursor, ended
    /// by `end`.
    #[inline(always)]
    fn hex(&mut self, end: u8) -> Option<u64> {
        let (mut v, mut digits) = (0u64, 0);
        while !self.ends(end)? {
            let d = hex_digit(self.line[self.at])?;
            digits += 1;
            if digits > 16 {
                return None;
            }
            v = (v << 4) | d;
            self.at += 1;
        }
        (digits > 0).then_some(v)
    }

    /// A decimal number of one to twenty digits that fits in 64 bits,
    /// past the spaces at the cursor, ended by a space or the line's end.
    #[inline(always)]
    fn decimal(&mut self) -> Option<u64> {
        self.skip_spaces();
        let (mut v, mut digits) = (0u64, 0);
        while !self.ends(b' ')? {
            let c = self.line[self.at];
            if !c.is_ascii_digit() {
                return None;
            }
            digits += 1;
            if digits > 20 {
                return None;
            }
            v = v.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            self.at += 1;
        }
        (digits > 0).then_some(v)
    }

    /// The next field as it is: the bytes up to a space or the end.
    #[inline(always)]
    fn word(&mut self) -> &'a [u8] {
        self.skip_spaces();
        let from = self.at;
        while self.line.get(self.at).is_some_and(|&c| c != b' ') {
            self.at += 1;
        }
        &self.line[from..self.at]
    }

    /// The rest of the line past the spaces at the cursor.
    #[inline(always)]
    fn rest(&mut self) -> &'a [u8] {
        self.skip_spaces();
        &self.line[self.at..]
    }
}

/// A decimal number of one to nine digits (a thread id, a device
/// number, a size): `None` for anything else (`.`, a sign, more digits).
pub(crate) fn parse_decimal(name: &[u8]) -> Option<i32> {
    if name.is_empty() || name.len() > 9 || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(name.iter().fold(0i32, |v, &b| v * 10 + i32::from(b - b'0')))
}

/// Parses one line (without its newline): fields parted by spaces (one
/// or more), the path the rest of the line after the inode's. Each byte
/// is read once (a process's maps may have thousands of lines, read
/// whole for a truncation's look).
pub fn parse_line(line: &[u8]) -> Option<Mapping> {
    let mut m = Mapping::EMPTY;
    parse_line_into(line, &mut m).map(|()| m)
}

/// [`parse_line`] into `out` (left as it was where the line is not one):
/// `None` where it is not. [`for_each`]'s, with one mapping on its stack
/// and none copied (README, "Stack").
fn parse_line_into(line: &[u8], out: &mut Mapping) -> Option<()> {
    let mut fields = Fields { line, at: 0 };
    fields.skip_spaces();
    let start = fields.hex(b'-')? as usize;
    let end = fields.hex(b' ')? as usize;
    let perms = fields.word();
    fields.skip_spaces();
    let offset = fields.hex(b' ')?;
    fields.skip_spaces();
    let dev = (fields.hex(b':')? as u32, fields.hex(b' ')? as u32);
    let inode = fields.decimal()?;
    if perms.len() < 4 || end < start {
        return None;
    }
    let mut prot = 0;
    if perms[0] == b'r' {
        prot |= libc::PROT_READ;
    }
    if perms[1] == b'w' {
        prot |= libc::PROT_WRITE;
    }
    if perms[2] == b'x' {
        prot |= libc::PROT_EXEC;
    }
    out.start = start;
    out.end = end;
    out.prot = prot;
    out.shared = perms[3] == b's';
    out.offset = offset;
    out.dev = dev;
    out.inode = inode;
    // The path is the rest of the line after the inode, spaces included.
    let path = fields.rest();
    let n = path.len().min(PATH_CAPACITY);
    // SAFETY: `n` bytes from the line into the path's first `n`, which
    // do not overlap (`out` is the caller's mapping, not the line).
    unsafe { core::ptr::copy_nonoverlapping(path.as_ptr(), out.path.as_mut_ptr().cast::<u8>(), n) };
    out.path_len = n;
    Some(())
}

/// Calls `f` with each mapping of this process, in address order, until it
/// breaks.
///
/// # Errors
///
/// The errno of a failed `open` or `read`.
pub fn for_each(mut f: impl FnMut(&Mapping) -> ControlFlow<()>) -> Result<(), i32> {
    let mut m = Mapping::EMPTY;
    for_each_in(&mut m, &mut f)
}

/// [`for_each`], each line parsed into `m`: the caller's one mapping on
/// the stack (README, "Stack").
fn for_each_in(m: &mut Mapping, f: &mut dyn FnMut(&Mapping) -> ControlFlow<()>) -> Result<(), i32> {
    for_each_line(c"/proc/self/maps", &mut |line| {
        if parse_line_into(line, m).is_some() {
            f(m)
        } else {
            ControlFlow::Continue(())
        }
    })
}

/// Looks at the process's mappings (or mounts) that could not read them:
/// [`looks_failed`].
static LOOKS_FAILED: AtomicU64 = AtomicU64::new(0);

/// How many looks at this process's mappings (`/proc/self/maps`, or
/// `/proc/self/mountinfo` for a hugetlb file's page size) could not read
/// them: no descriptor left under the process's limit (`EMFILE`), none in
/// the system, no `/proc` mounted, or a read that failed. A look that the
/// kernel answers by `PROCMAP_QUERY` is made on the same file, so it
/// fails the same way. What each hook does then:
/// - a file emptied (`ftruncate`, `truncate`, `fallocate`, a truncating
///   `open`, `madvise(MADV_REMOVE)`): the `VM_UNMAPPED` of the file's
///   other mappings is **not reported** (the call's own range, where it
///   has one, is);
/// - `shmdt`: the attachment as `shmat` made it is reported (more than
///   went where it was cut since, never less);
/// - a hugetlb mapping's page size: base pages (a discard reported
///   short of the huge page the kernel takes);
/// - `brk`/`sbrk` shrinks: each reported.
///
/// So a registration cache that finds this count grown has perhaps missed
/// an unmap of a file's pages, and should drop what it holds of files.
/// `memhook run` reports it per command. In this process: a child of
/// `fork` counts from 0.
pub fn looks_failed() -> u64 {
    LOOKS_FAILED.load(Ordering::Relaxed)
}

/// In the child of a `fork`: [`looks_failed`] counts from 0.
pub(crate) fn after_fork_in_child() {
    LOOKS_FAILED.store(0, Ordering::Relaxed);
}

/// The buffer [`for_each_line`] reads through: on the stack of a hooked
/// call, so small (README, "Stack"). A line of the mappings holds its
/// kept path ([`PATH_CAPACITY`]) and its fields (at most 90 bytes) in
/// it; the kernel's text comes a page at a time into the file's own
/// buffer, and each `read` takes what fits of it.
const LINE_BUFFER: usize = 1024;

/// Calls `f` with each line of the file at `path` (without its newline),
/// read through a buffer on this stack, until it breaks. A line longer
/// than the buffer ([`LINE_BUFFER`]) is passed cut to it. Never inlined,
/// nor one copy per caller's closure: its buffer is on the stack only
/// while the text is read, not in the frame of every caller that may
/// read it (one that asks the kernel by `PROCMAP_QUERY` does not).
///
/// # Errors
///
/// The errno of a failed `open` or `read`.
#[inline(never)]
pub(crate) fn for_each_line(path: &core::ffi::CStr, f: &mut dyn FnMut(&[u8]) -> ControlFlow<()>) -> Result<(), i32> {
    let fd = open_at(libc::AT_FDCWD, path, libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        LOOKS_FAILED.fetch_add(1, Ordering::Relaxed);
        return Err(errno());
    }
    let mut buf = [0u8; LINE_BUFFER];
    let mut have = 0;
    let result = 'read: loop {
        let n = match crate::sys::read(fd, &mut buf[have..]) {
            Ok(n) => n,
            Err(libc::EINTR) => continue,
            Err(e) => break Err(e),
        };
        let eof = n == 0;
        have += n;
        let mut used = 0;
        while let Some(nl) = buf[used..have].iter().position(|&c| c == b'\n') {
            if f(&buf[used..used + nl]).is_break() {
                break 'read Ok(());
            }
            used += nl + 1;
        }
        if eof {
            if used < have {
                let _ = f(&buf[used..have]);
            }
            break Ok(());
        }
        if used == 0 && have == buf.len() {
            // A line longer than the buffer: pass what fits (a path is
            // cut), then skip to its end.
            if f(&buf[..have]).is_break() {
                break Ok(());
            }
            have = 0;
            loop {
                let mut c = [0u8; 1];
                if crate::sys::read(fd, &mut c) != Ok(1) || c[0] == b'\n' {
                    break;
                }
            }
            continue;
        }
        buf.copy_within(used..have, 0);
        have -= used;
    };
    crate::sys::close(fd);
    if result.is_err() {
        LOOKS_FAILED.fetch_add(1, Ordering::Relaxed);
    }
    result
}

/// The mapping that contains `addr`, if any: asked of the kernel
/// (`PROCMAP_QUERY`, Linux 6.11), or read from the text where it does not
/// answer.
pub fn find(addr: usize) -> Option<Mapping> {
    let Ok(q) = Queries::open() else {
        return find_by_text(addr);
    };
    let mut m = Mapping::EMPTY;
    match q.ask_into(addr, Ask::HOLDING.with_path(), &mut m) {
        Ok(found) => found.map(|_| m),
        Err(()) => {
            drop(q);
            find_by_text(addr)
        }
    }
}

/// [`find`] by the text alone, as on a kernel older than 6.11 (`--bench
/// maps` compares the two). Not inlined: its frame is on the stack only
/// where the kernel does not answer (README, "Stack").
#[inline(never)]
pub fn find_by_text(addr: usize) -> Option<Mapping> {
    let mut found = None;
    let _ = for_each(|m| {
        if m.contains(addr) {
            found = Some(*m);
            return ControlFlow::Break(());
        }
        if m.start > addr {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    found
}

/// Calls `f` with each mapping of a file (shared anonymous memory, a SysV
/// segment and a memfd are files too), in address order, until it
/// breaks; where the kernel does not answer `PROCMAP_QUERY`, with every
/// mapping (`f` tells a file's by its inode). The paths are not read.
/// The look of a call that empties a file (a truncating `open`, an
/// `ftruncate`) for the file's mappings.
///
/// # Errors
///
/// The errno of a failed `open` or `read` of the text.
pub fn for_each_of_files(mut f: impl FnMut(&Mapping) -> ControlFlow<()>) -> Result<(), i32> {
    for_each_from(0, Ask::FILES, &mut f)
}

/// Calls `f` with each mapping, its path read, in address order, until it
/// breaks (as [`for_each`]; by [`Queries`] where the kernel answers,
/// which asks only up to the one it breaks at).
///
/// # Errors
///
/// As [`for_each`].
pub(crate) fn for_each_named(mut f: impl FnMut(&Mapping) -> ControlFlow<()>) -> Result<(), i32> {
    for_each_from(0, Ask::HOLDING.with_path(), &mut f)
}

/// Calls `f` with each mapping that ends past `addr` (the one that holds
/// it first), in address order, until it breaks (as [`for_each`]; by
/// [`Queries`] where the kernel answers).
///
/// # Errors
///
/// As [`for_each`].
pub(crate) fn for_each_past(addr: usize, mut f: impl FnMut(&Mapping) -> ControlFlow<()>) -> Result<(), i32> {
    for_each_from(addr, Ask::HOLDING, &mut f)
}

/// Calls `f` with each mapping `ask` selects (files alone, or all) that
/// ends past `addr`, in address order, until it breaks: by [`Queries`],
/// or by the text (every mapping past `addr`) where the kernel does not
/// answer them, from the start or from where they stopped answering.
/// Not inlined: one frame, whichever way it reads, below each mapping's
/// `f` (README, "Stack").
#[inline(never)]
fn for_each_from(addr: usize, ask: Ask, f: &mut dyn FnMut(&Mapping) -> ControlFlow<()>) -> Result<(), i32> {
    let mut at = addr;
    let mut m = Mapping::EMPTY;
    if let Ok(q) = Queries::open() {
        loop {
            match q.ask_into(at, ask.or_next(), &mut m) {
                Ok(Some(_)) => {
                    if f(&m).is_break() {
                        return Ok(());
                    }
                    if m.end <= at {
                        return Ok(()); // (the top of the address space)
                    }
                    at = m.end;
                }
                Ok(None) => return Ok(()),
                Err(()) => break,
            }
        }
    }
    for_each_in(&mut m, &mut |m| {
        if m.end > at { f(m) } else { ControlFlow::Continue(()) }
    })
}

/// Whether the kernel answers `PROCMAP_QUERY` here (Linux 6.11; not
/// under a seccomp filter that refuses the `ioctl`, nor under qemu-user,
/// which makes up `/proc/self/maps`): the looks at the mappings that
/// [`find`], [`for_each_of_files`] and the `shmdt` hook make ask it;
/// else they read the text. (`memhook doctor`'s `mappings:` line.)
pub fn queries_answer() -> bool {
    let here = queries_answer as *const () as usize;
    Queries::open()
        .and_then(|q| q.ask(here, Ask::HOLDING))
        .is_ok_and(|m| m.is_some())
}

/// What [`Queries::ask`] asks for.
#[derive(Clone, Copy)]
pub(crate) struct Ask {
    flags: u64,
    path: bool,
}

impl Ask {
    /// The mapping that holds the address.
    pub(crate) const HOLDING: Ask = Ask { flags: 0, path: false };
    /// The mapping of a file that holds the address.
    pub(crate) const FILES: Ask = Ask {
        flags: FILE_BACKED_VMA,
        path: false,
    };

    /// Or else the first one past it.
    pub(crate) const fn or_next(self) -> Ask {
        Ask {
            flags: self.flags | COVERING_OR_NEXT_VMA,
            ..self
        }
    }

    /// With its path (a path longer than [`PATH_CAPACITY`] makes the
    /// question fail: the text has it, cut).
    pub(crate) const fn with_path(self) -> Ask {
        Ask { path: true, ..self }
    }
}

/// `struct procmap_query` (linux/fs.h, Linux 6.11).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const _: () = assert!(size_of::<ProcmapQuery>() == 104);

/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = 0xc068_6611;
/// The mapping that holds the address, or else the next one.
const COVERING_OR_NEXT_VMA: u64 = 0x10;
/// Mappings of files alone.
const FILE_BACKED_VMA: u64 = 0x20;
/// `vma_flags`' bits.
const VMA_READABLE: u64 = 0x1;
const VMA_WRITABLE: u64 = 0x2;
const VMA_EXECUTABLE: u64 = 0x4;
const VMA_SHARED: u64 = 0x8;

/// Whether `PROCMAP_QUERY` answers here: not known yet, yes, or no.
static QUERY: AtomicU8 = AtomicU8::new(0);
const QUERY_WORKS: u8 = 1;
const QUERY_REFUSED: u8 = 2;

/// `/proc/self/maps` open for `PROCMAP_QUERY` (Linux 6.11): a mapping
/// asked of the kernel by address, in binary, about 0.2 us a question
/// (dev VM), where the text is generated and parsed line by line (about
/// 0.17 us a line); a question for the mappings of files has the kernel
/// pass over the anonymous ones. Closed when dropped.
pub(crate) struct Queries {
    fd: c_int,
}

impl Queries {
    /// `Err` where the file cannot be opened, or the kernel is known not
    /// to answer.
    pub(crate) fn open() -> Result<Queries, ()> {
        if QUERY.load(Ordering::Relaxed) == QUERY_REFUSED || query_off() {
            return Err(());
        }
        let fd = open_at(libc::AT_FDCWD, c"/proc/self/maps", libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(());
        }
        Ok(Queries { fd })
    }

    /// The mapping `ask` asks for at `addr`, with its page size; `None`
    /// where there is none; `Err` where the kernel does not answer (older
    /// than 6.11; a path longer than asked for).
    pub(crate) fn ask(&self, addr: usize, ask: Ask) -> Result<Option<(Mapping, usize)>, ()> {
        let mut m = Mapping::EMPTY;
        Ok(self.ask_into(addr, ask, &mut m)?.map(|page| (m, page)))
    }

    /// [`ask`](Self::ask), the mapping written into `m` (its page size
    /// returned): for a caller that asks again and again, with one
    /// mapping on its stack and none copied (README, "Stack").
    #[inline(never)]
    pub(crate) fn ask_into(&self, addr: usize, ask: Ask, m: &mut Mapping) -> Result<Option<usize>, ()> {
        m.path_len = 0;
        let mut q = ProcmapQuery {
            size: size_of::<ProcmapQuery>() as u64,
            query_flags: ask.flags,
            query_addr: addr as u64,
            ..ProcmapQuery::default()
        };
        if ask.path {
            q.vma_name_addr = m.path.as_mut_ptr() as u64;
            q.vma_name_size = PATH_CAPACITY as u32;
        }
        // SAFETY: PROCMAP_QUERY reads and writes `q`, whose size it is
        // told, and writes at most `vma_name_size` bytes at
        // `vma_name_addr` (the mapping's path buffer, as long; 0: none);
        // a kernel without it fails the call (ENOTTY) and touches nothing.
        // By the instruction, not libc's `ioctl`, which memhook hooks.
        let r = unsafe { crate::sys::syscall!(libc::SYS_ioctl, self.fd, PROCMAP_QUERY, &raw mut q) };
        if r != 0 {
            let e = errno();
            if e == libc::ENOENT {
                // None there (a kernel without the call says ENOTTY).
                QUERY.store(QUERY_WORKS, Ordering::Relaxed);
                return Ok(None);
            }
            // Refused for good (an older kernel; a seccomp filter on
            // `ioctl`): the text from now on.
            if matches!(
                e,
                libc::ENOTTY | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS | libc::EPERM | libc::EACCES
            ) {
                QUERY.store(QUERY_REFUSED, Ordering::Relaxed);
            }
            return Err(());
        }
        QUERY.store(QUERY_WORKS, Ordering::Relaxed);
        let f = q.vma_flags;
        let bit = |b: u64, prot: i32| if f & b != 0 { prot } else { 0 };
        m.start = q.vma_start as usize;
        m.end = q.vma_end as usize;
        m.prot = bit(VMA_READABLE, libc::PROT_READ)
            | bit(VMA_WRITABLE, libc::PROT_WRITE)
            | bit(VMA_EXECUTABLE, libc::PROT_EXEC);
        m.shared = f & VMA_SHARED != 0;
        m.offset = q.vma_offset;
        m.dev = (q.dev_major, q.dev_minor);
        m.inode = q.inode;
        if ask.path {
            // The length with its NUL (0: no name); the kernel wrote it.
            m.path_len = (q.vma_name_size as usize).saturating_sub(1).min(PATH_CAPACITY);
        }
        Ok(Some(q.vma_page_size as usize))
    }
}

impl Drop for Queries {
    fn drop(&mut self) {
        // The descriptor `open` opened, closed once.
        crate::sys::close(self.fd);
    }
}

/// Whether a test turned [`Queries`] off (as on a kernel older than
/// 6.11, so that the way by the text is taken).
#[inline(always)]
fn query_off() -> bool {
    #[cfg(test)]
    return tests::QUERY_OFF.load(Ordering::Relaxed);
    #[cfg(not(test))]
    false
}

/// The base page size: 4 KiB on x86_64; elsewhere (arm64 kernels use 4,
/// 16 or 64 KiB) the kernel's, asked once. Cheap enough for the host
/// hooks' paths, which round every range they report to it.
#[inline(always)]
pub fn page_size() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        4096
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use core::sync::atomic::{AtomicUsize, Ordering};
        static PAGE: AtomicUsize = AtomicUsize::new(0);
        match PAGE.load(Ordering::Relaxed) {
            0 => {
                // SAFETY: getauxval reads the process's auxiliary vector
                // and has no preconditions.
                let page = unsafe { libc::getauxval(libc::AT_PAGESZ) } as usize;
                let page = if page.is_power_of_two() { page } else { 4096 };
                PAGE.store(page, Ordering::Relaxed);
                page
            }
            page => page,
        }
    }
}

pub(crate) fn errno() -> i32 {
    // SAFETY: errno is thread-local and always readable.
    unsafe { *libc::__errno_location() }
}

/// `openat` by the system call itself, for memhook's own opens (the
/// files of `/proc`): libc's `open` and `openat` are functions memhook
/// patches, and a writer patching them that opened a file through them
/// would run into its own locked entry (and a hook would look at the
/// open). The descriptor, or -1 with errno set.
pub(crate) fn open_at(dirfd: core::ffi::c_int, path: &core::ffi::CStr, flags: core::ffi::c_int) -> core::ffi::c_int {
    // SAFETY: a NUL-terminated path and plain flags (no mode: no O_CREAT).
    unsafe { crate::sys::syscall!(libc::SYS_openat, dirfd, path.as_ptr(), flags, 0) as core::ffi::c_int }
}

/// Runs `f` and puts back the calling thread's errno as it was, whatever
/// `f`'s system calls or a handler it calls left there: for what a hook
/// does besides the call it hooks (a look at the mappings, events
/// delivered outside the call's own dispatch), so that the caller sees
/// the errno of its own call alone.
pub(crate) fn keeping_errno<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: __errno_location has no preconditions.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: this thread's errno, which stays where it is.
    let saved = unsafe { *errno };
    let result = f();
    // SAFETY: as above.
    unsafe { *errno = saved };
    result
}

/// For tests: `pages` fresh read-write pages between two `PROT_NONE`
/// guard pages (the one after them starts at `base + pages * page`).
/// The guards keep the pages a mapping of their own whatever else is
/// mapped beside them: qemu-user (the aarch64 CI step) builds
/// `/proc/self/maps` from the host's mappings, which merge neighbours the
/// guest sees apart, and leaves out or mislabels a merged range whose
/// pages differ in protection.
#[cfg(test)]
pub(crate) fn guarded_pages(pages: usize) -> usize {
    let page = page_size();
    let len = pages * page;
    // SAFETY: a fresh reservation, whose middle a fresh read-write
    // mapping replaces (MAP_FIXED, inside the reservation).
    unsafe {
        let guard = libc::mmap(
            core::ptr::null_mut(),
            len + 2 * page,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(guard, libc::MAP_FAILED);
        let p = libc::mmap(
            guard.cast::<u8>().add(page).cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
    }
}

/// Unmaps what [`guarded_pages`]`(pages)` returned, guards included.
#[cfg(test)]
pub(crate) fn unmap_guarded_pages(base: usize, pages: usize) {
    let page = page_size();
    // SAFETY: the test's own pages and guards, no longer used.
    unsafe { libc::munmap((base - page) as *mut libc::c_void, (pages + 2) * page) };
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use core::sync::atomic::AtomicBool;

    /// [`Queries::open`] answers `Err` while set.
    pub(crate) static QUERY_OFF: AtomicBool = AtomicBool::new(false);

    #[test]
    fn parses_lines_with_and_without_paths() {
        let m = parse_line(b"7f3a12000000-7f3a12021000 r-xp 00002000 08:01 1234   /usr/lib/x86_64-linux-gnu/libc.so.6")
            .unwrap();
        assert_eq!((m.start, m.end, m.offset), (0x7f3a12000000, 0x7f3a12021000, 0x2000));
        assert_eq!(m.prot, libc::PROT_READ | libc::PROT_EXEC);
        assert_eq!(m.path(), b"/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert_eq!((m.dev, m.inode), ((8, 1), 1234));
        let m = parse_line(b"7ffd1000-7ffd3000 rw-s 00000000 00:00 0 ").unwrap();
        assert!(m.shared && m.path().is_empty());
        assert_eq!((m.dev, m.inode), ((0, 0), 0));
        let m = parse_line(b"1000-2000 rw-s 00000000 103:0a 18446744073709551615 /memfd:pool (deleted)").unwrap();
        assert_eq!((m.dev, m.inode), ((0x103, 0xa), u64::MAX));
        assert!(parse_line(b"1000-2000 rw-s 00000000 103:0a 18446744073709551616 /x").is_none());
        assert!(parse_line(b"1000-2000 rw-s 00000000 1030a 1 /x").is_none());
        let m = parse_line(b"1000-2000 rw-p 00000000 00:00 0 /tmp/a file (deleted)").unwrap();
        assert_eq!(m.path(), b"/tmp/a file (deleted)");
        assert!(parse_line(b"garbage").is_none());
        assert!(parse_line(b"2000-1000 rw-p 0 00:00 0").is_none());
        // Fields parted by more than one space; none after the inode.
        let m = parse_line(b"1000-2000  r--p  10  fd:01  77").unwrap();
        assert_eq!(
            (m.start, m.end, m.offset, m.dev, m.inode),
            (0x1000, 0x2000, 0x10, (0xfd, 1), 77)
        );
        assert!(m.path().is_empty() && !m.shared && m.prot == libc::PROT_READ);
        // Sixteen hex digits at most; a field cut short; no digits.
        assert!(parse_line(b"ffffffffffffffff-ffffffffffffffff rw-p 0 00:00 0").is_some());
        assert!(parse_line(b"10000000000000000-1 rw-p 0 00:00 0").is_none());
        for bad in [
            &b""[..],
            b"1000-2000",
            b"1000-2000 rw-p",
            b"1000-2000 rw-p 0 00:00",
            b"1000-2000 rw- 0 00:00 0",
            b"1000-2000 rw-p 0x0 00:00 0",
            b"1000-2000 rw-p 0 0000 0",
            b"1000-2000 rw-p 0 :00 0",
            b"1000-2000 rw-p 0 00: 0",
            b"1000- rw-p 0 00:00 0",
            b"-2000 rw-p 0 00:00 0",
            b"1000-2000-3000 rw-p 0 00:00 0",
            b"1000-2000 rw-p 0 00:00 1a /x",
            b"1000-2000 rw-p 0 00:00 -1 /x",
        ] {
            assert!(parse_line(bad).is_none(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn nvidia_device_files_are_gpu_mappings() {
        let gpu = |line: &[u8]| parse_line(line).unwrap().is_gpu();
        assert!(gpu(b"200000000-200200000 rw-s 00000000 00:05 613 /dev/nvidiactl"));
        assert!(gpu(
            b"7f0000000000-7f0000200000 rw-s 00000000 00:05 617 /dev/nvidia-uvm"
        ));
        assert!(gpu(b"7f1000000000-7f1000010000 rw-s 3c000 00:05 612 /dev/nvidia0"));
        assert!(!gpu(
            b"7f3a12000000-7f3a12021000 r-xp 00002000 08:01 1234 /usr/lib/libcuda.so.1"
        ));
        assert!(!gpu(b"1000-2000 rw-p 00000000 00:00 0 "));
        assert!(!gpu(b"1000-2000 rw-p 00000000 00:00 0 /dev/zero (deleted)"));
    }

    /// A mapping's fields, path included, for comparisons.
    type Fields = (usize, usize, i32, bool, u64, (u32, u32), u64, Vec<u8>);

    fn fields(m: &Mapping) -> Fields {
        (
            m.start,
            m.end,
            m.prot,
            m.shared,
            m.offset,
            m.dev,
            m.inode,
            m.path().to_vec(),
        )
    }

    /// Every mapping, by the text.
    fn text() -> Vec<Fields> {
        let mut all = Vec::new();
        for_each(|m| {
            all.push(fields(m));
            ControlFlow::Continue(())
        })
        .unwrap();
        all
    }

    /// A file of three pages mapped shared with its middle page made
    /// read-only (three mappings), beside an anonymous one: the kernel
    /// tells each as the text does, and asked for the mappings of files,
    /// gives each of the text's (the other tests' mappings may come and
    /// go meanwhile: only one present in two reads of the text is
    /// required, only one in either allowed); the same by the text alone,
    /// as on a kernel older than 6.11.
    #[test]
    fn queries_tell_each_mapping_as_the_text_does() {
        // (The hugetlb tests turn the queries off too.)
        let _t = crate::hugetlb::tests::HUGE_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let page = page_size();
        let path = std::env::temp_dir().join(format!("memhook-maps-query-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 3 * page]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared read-only mapping of the test's file,
        // and an anonymous one; both unmapped below.
        let (f, anon) = unsafe {
            let f = libc::mmap(
                core::ptr::null_mut(),
                3 * page,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(f, libc::MAP_FAILED);
            assert_eq!(
                libc::mprotect(f.cast::<u8>().add(page).cast(), page, libc::PROT_NONE),
                0
            );
            (f as usize, guarded_pages(2))
        };
        let q = Queries::open();
        // (A kernel older than 6.11: `find` reads the text.)
        let asked = |addr: usize| match &q {
            Ok(q) => fields(&q.ask(addr, Ask::HOLDING.with_path()).unwrap().unwrap().0),
            Err(()) => fields(&find(addr).unwrap()),
        };
        let want = path.as_os_str().as_encoded_bytes().to_vec();
        for (at, prot, offset) in [
            (f, libc::PROT_READ, 0),
            (f + page, 0, page),
            (f + 2 * page, libc::PROT_READ, 2 * page),
        ] {
            let by_text = fields(&find_by_text(at + 1).unwrap());
            assert_eq!(by_text.7, want);
            assert_eq!(
                (by_text.0, by_text.1, by_text.2, by_text.3, by_text.4),
                (at, at + page, prot, true, offset as u64)
            );
            assert_eq!(asked(at + 1), by_text, "the file's page at {at:#x}");
            assert_eq!(fields(&find(at + page - 1).unwrap()), by_text);
        }
        let by_text = fields(&find_by_text(anon).unwrap());
        assert_eq!(asked(anon + page), by_text, "anonymous");
        assert!(!by_text.3 && by_text.6 == 0 && by_text.7.is_empty());
        // Nothing is mapped in the first page (below mmap_min_addr).
        assert!(find(0).is_none());
        if let Ok(q) = &q {
            assert!(q.ask(0, Ask::HOLDING).unwrap().is_none());
        }
        // The mappings of files, and every mapping past an address.
        let queries = q.is_ok();
        drop(q);
        for off in [!queries, true] {
            QUERY_OFF.store(off, Ordering::Relaxed);
            look_past_and_at_files(f, anon, off);
        }
        QUERY_OFF.store(false, Ordering::Relaxed);
        // SAFETY: the test's own mappings.
        unsafe { libc::munmap(f as *mut libc::c_void, 3 * page) };
        unmap_guarded_pages(anon, 2);
        let _ = std::fs::remove_file(&path);
    }

    /// [`for_each_of_files`] and [`for_each_past`] as the text lists the
    /// mappings, the test's file's three at `f` among them.
    fn look_past_and_at_files(f: usize, anon: usize, off: bool) {
        let page = page_size();
        let before = text();
        let mut files = Vec::new();
        for_each_of_files(|m| {
            files.push((m.start, m.end, m.dev, m.inode));
            ControlFlow::Continue(())
        })
        .unwrap();
        let mut past = Vec::new();
        for_each_past(f + page + 1, |m| {
            past.push((m.start, m.end));
            if past.len() == 8 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        let after = text();
        let key = |m: &Fields| (m.0, m.1, m.5, m.6);
        let of_files = |all: &[Fields]| all.iter().filter(|m| m.6 != 0).map(key).collect::<Vec<_>>();
        let (b, a) = (of_files(&before), of_files(&after));
        for m in b.iter().filter(|m| a.contains(m)) {
            assert!(
                files.contains(m),
                "{m:x?} in both reads of the text, not asked (text alone: {off})"
            );
        }
        for m in files.iter().filter(|m| m.3 != 0) {
            assert!(
                b.contains(m) || a.contains(m),
                "{m:x?} asked, in neither read of the text"
            );
        }
        if !off {
            assert!(files.iter().all(|m| m.3 != 0), "files alone");
        }
        assert!(
            files.iter().any(|m| m.0 == anon) == off,
            "the anonymous mapping, by the text alone"
        );
        assert!(files.contains(&(
            f + 2 * page,
            f + 3 * page,
            by_text_dev(&before, f),
            by_text_inode(&before, f)
        )));
        assert_eq!(
            past[..2],
            [(f + page, f + 2 * page), (f + 2 * page, f + 3 * page)],
            "the one that holds the address first"
        );
        assert!(past.windows(2).all(|w| w[0].1 <= w[1].0), "in order: {past:x?}");
    }

    fn by_text_dev(all: &[Fields], at: usize) -> (u32, u32) {
        all.iter().find(|m| m.0 == at).unwrap().5
    }

    fn by_text_inode(all: &[Fields], at: usize) -> u64 {
        all.iter().find(|m| m.0 == at).unwrap().6
    }

    #[test]
    fn finds_this_function_and_a_stack_variable() {
        let code = find(finds_this_function_and_a_stack_variable as *const () as usize).expect("text mapped");
        assert!(code.prot & libc::PROT_EXEC != 0, "{code:?}");
        let local = 5u64;
        let stack = find(&local as *const u64 as usize).expect("stack mapped");
        assert!(stack.prot & libc::PROT_WRITE != 0);
        let mut n = 0;
        let mut last = 0;
        for_each(|m| {
            assert!(m.start >= last, "sorted");
            last = m.end;
            n += 1;
            ControlFlow::Continue(())
        })
        .unwrap();
        assert!(n > 5);
    }
}

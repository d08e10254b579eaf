//! Reading `/proc/self/maps` without allocating.
//!
//! Each call opens the file itself and parses it through a buffer on its own
//! stack, so concurrent readers never share state, and an allocator that
//! embeds memhook can call it.

use core::ops::ControlFlow;

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
    path: [u8; PATH_CAPACITY],
    path_len: usize,
}

impl Mapping {
    /// The path or pseudo-path (`[heap]`, `[vdso]`), possibly empty.
    pub fn path(&self) -> &[u8] {
        &self.path[..self.path_len]
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

fn hex(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &c in field {
        let d = (c as char).to_digit(16)?;
        v = (v << 4) | d as u64;
    }
    Some(v)
}

fn decimal(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 20 {
        return None;
    }
    field.iter().try_fold(0u64, |v, &c| {
        let d = (c as char).to_digit(10)?;
        v.checked_mul(10)?.checked_add(u64::from(d))
    })
}

/// A decimal number of one to nine digits (a thread id, a device
/// number, a size): `None` for anything else (`.`, a sign, more digits).
pub(crate) fn parse_decimal(name: &[u8]) -> Option<i32> {
    if name.is_empty() || name.len() > 9 || !name.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(name.iter().fold(0i32, |v, &b| v * 10 + i32::from(b - b'0')))
}

/// Parses one line (without its newline).
pub fn parse_line(line: &[u8]) -> Option<Mapping> {
    let mut fields = line.split(|&c| c == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = hex(fields.next()?)?;
    let dev = fields.next()?;
    let colon = dev.iter().position(|&c| c == b':')?;
    let dev = (hex(&dev[..colon])? as u32, hex(&dev[colon + 1..])? as u32);
    let inode = decimal(fields.next()?)?;
    let dash = range.iter().position(|&c| c == b'-')?;
    let start = hex(&range[..dash])? as usize;
    let end = hex(&range[dash + 1..])? as usize;
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
    // The path is the rest of the line after the inode, spaces included.
    let mut m = Mapping {
        start,
        end,
        prot,
        shared: perms[3] == b's',
        offset,
        dev,
        inode,
        path: [0; PATH_CAPACITY],
        path_len: 0,
    };
    if let Some(first) = fields.next() {
        let at = first.as_ptr() as usize - line.as_ptr() as usize;
        let path = &line[at..];
        let n = path.len().min(PATH_CAPACITY);
        m.path[..n].copy_from_slice(&path[..n]);
        m.path_len = n;
    }
    Some(m)
}

/// Calls `f` with each mapping of this process, in address order, until it
/// breaks.
///
/// # Errors
///
/// The errno of a failed `open` or `read`.
pub fn for_each(mut f: impl FnMut(&Mapping) -> ControlFlow<()>) -> Result<(), i32> {
    for_each_line(c"/proc/self/maps", |line| match parse_line(line) {
        Some(m) => f(&m),
        None => ControlFlow::Continue(()),
    })
}

/// Calls `f` with each line of the file at `path` (without its newline),
/// read through a buffer on this stack, until it breaks. A line longer
/// than the buffer (4 KiB) is passed cut to it.
///
/// # Errors
///
/// The errno of a failed `open` or `read`.
pub(crate) fn for_each_line(path: &core::ffi::CStr, mut f: impl FnMut(&[u8]) -> ControlFlow<()>) -> Result<(), i32> {
    let fd = open_at(libc::AT_FDCWD, path, libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(errno());
    }
    let mut buf = [0u8; 4096];
    let mut have = 0;
    let result = 'read: loop {
        // SAFETY: the destination is the unused tail of `buf`.
        let n = unsafe { libc::read(fd, buf[have..].as_mut_ptr().cast(), buf.len() - have) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            break Err(e);
        }
        let eof = n == 0;
        have += n as usize;
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
                // SAFETY: one byte into a local.
                let r = unsafe { libc::read(fd, c.as_mut_ptr().cast(), 1) };
                if r <= 0 || c[0] == b'\n' {
                    break;
                }
            }
            continue;
        }
        buf.copy_within(used..have, 0);
        have -= used;
    };
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    result
}

/// The mapping that contains `addr`, if any.
pub fn find(addr: usize) -> Option<Mapping> {
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
mod tests {
    use super::*;

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

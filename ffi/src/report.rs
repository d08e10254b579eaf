//! What is installed (`memhook_status`), the version, and the binary event
//! records of `MEMHOOK_REPORT_FD` (what `memhook run` reads).

use core::ffi::{c_char, c_int};

use memhook::event::{Event, bits};
use memhook::{FunctionStatus, HandlerFn};

use super::*;

/// One hooked function in one mode, as [`memhook_status`] reports it.
/// Strings are NUL-terminated (and cut to fit).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_hook_status_t {
    /// The function (`"mmap"`, `"cuMemAlloc_v2"`).
    pub function: [c_char; 48],
    /// The library that defines it (`"libc.so.6"`, `"libcuda.so.1"`).
    pub library: [c_char; 24],
    /// `"bistro"`, `"reloc"` or `"procaddr"`.
    pub mode: [c_char; 16],
    /// 1 when the mode took, 0 when not.
    pub installed: i32,
    /// 1 when it has not taken only because the library is not loaded yet
    /// (it takes when the library loads).
    pub pending: i32,
    /// Why not (empty when it took).
    pub reason: [c_char; 200],
}

/// Copies `s` into `dst` as a NUL-terminated string, cut to fit.
fn copy<const N: usize>(dst: &mut [c_char; N], s: &str) {
    let n = s.len().min(N - 1);
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    dst[n] = 0;
}

fn to_c_status(s: &FunctionStatus) -> memhook_hook_status_t {
    let mut out = memhook_hook_status_t {
        function: [0; 48],
        library: [0; 24],
        mode: [0; 16],
        installed: i32::from(s.installed),
        pending: i32::from(s.pending),
        reason: [0; 200],
    };
    copy(&mut out.function, s.function);
    copy(&mut out.library, s.library);
    copy(&mut out.mode, s.mode.name());
    copy(&mut out.reason, &s.reason);
    out
}

/// The `index`-th entry of what the installed hooks are: per function and
/// mode, whether it took and why not. Iterate from 0 until
/// `MEMHOOK_ERR_NOT_FOUND`. `MEMHOOK_ERR_BUSY` from a signal handler that
/// interrupted memhook's own work on its thread, which holds the state.
///
/// # Safety
///
/// `status` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_status(index: usize, status: *mut memhook_hook_status_t) -> c_int {
    if status.is_null() {
        return fail(MEMHOOK_ERR_INVALID, format_args!("memhook_status: status is NULL"));
    }
    guard(|| {
        if let Some(code) = crate::busy("memhook_status") {
            return code;
        }
        let (s, n) = memhook::status_at(index);
        let Some(s) = s else {
            return fail(
                MEMHOOK_ERR_NOT_FOUND,
                format_args!("memhook_status: no entry {index} ({n} in all)"),
            );
        };
        // SAFETY: non-null and the caller's to write.
        unsafe { *status = to_c_status(&s) };
        MEMHOOK_OK
    })
}

/// How the C library of one of the loader's other namespaces (a library
/// opened with `dlmopen(LM_ID_NEWLM, ...)` gets a libc of its own) stands,
/// as [`memhook_namespace_status`] reports it.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_namespace_status_t {
    /// The namespace (an `Lmid_t`, 1 to 15).
    pub namespace_id: i64,
    /// The host functions its libc defines.
    pub functions: u32,
    /// How many of them are hooked (bistro, as the main namespace's).
    pub hooked: u32,
    /// Why one is not (the first that failed; empty when all are).
    pub reason: [c_char; 200],
}

/// The `index`-th of the loader's other namespaces whose libc memhook
/// hooked (in the order found; with the host hooks installed in bistro
/// mode). Iterate from 0 until `MEMHOOK_ERR_NOT_FOUND`; none in a process
/// that never called `dlmopen`. A namespace the loader freed (the program
/// closed its last library in it) is not listed. `MEMHOOK_ERR_BUSY` as
/// for `memhook_status`.
///
/// # Safety
///
/// `status` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_namespace_status(index: usize, status: *mut memhook_namespace_status_t) -> c_int {
    if status.is_null() {
        return fail(
            MEMHOOK_ERR_INVALID,
            format_args!("memhook_namespace_status: status is NULL"),
        );
    }
    guard(|| {
        if let Some(code) = crate::busy("memhook_namespace_status") {
            return code;
        }
        let all = memhook::namespaces();
        let Some(s) = all.get(index) else {
            return fail(
                MEMHOOK_ERR_NOT_FOUND,
                format_args!("memhook_namespace_status: no entry {index} ({} in all)", all.len()),
            );
        };
        let mut out = memhook_namespace_status_t {
            namespace_id: s.namespace as i64,
            functions: s.functions as u32,
            hooked: s.hooked as u32,
            reason: [0; 200],
        };
        copy(&mut out.reason, &s.reason);
        // SAFETY: non-null and the caller's to write.
        unsafe { *status = out };
        MEMHOOK_OK
    })
}

/// How many of this process's threads memhook has moved out of bytes it
/// was overwriting (a thread the scheduler had stopped inside a function's
/// first instructions, or blocked in a system call made there, when a
/// bistro patch was written over them: it went on from the same
/// instruction in the trampoline). 0 without bistro; a child of `fork`
/// counts from 0.
#[unsafe(no_mangle)]
pub extern "C" fn memhook_threads_moved() -> u64 {
    threads().0
}

/// How many times a bistro patch was written without its other threads
/// checked (a thread blocked the signal memhook uses while it ran, the
/// program handles both `SIGURG` and `SIGWINCH`, or `/proc/self/task`
/// could not be read): the write went on as it would without the check,
/// and a thread stopped inside the bytes would crash. `memhook doctor`
/// says whether the check can run here. 0 without bistro; a child of
/// `fork` counts from 0.
#[unsafe(no_mangle)]
pub extern "C" fn memhook_threads_unchecked() -> u64 {
    threads().1
}

/// How many looks at this process's mappings could not read them (no
/// descriptor left under the process's limit, no `/proc` mounted): where
/// this count grows, a file emptied meanwhile (`ftruncate`, `truncate`,
/// `fallocate`, a truncating `open`, `madvise(MADV_REMOVE)`) may have
/// taken pages of the file's other mappings with no `VM_UNMAPPED` for
/// them, and a hugetlb range may have been reported in base pages
/// (`shmdt` reports the attachment as `shmat` made it). A registration
/// cache that sees it grow should drop what it holds of files. A child of
/// `fork` counts from 0.
#[unsafe(no_mangle)]
pub extern "C" fn memhook_mapping_looks_failed() -> u64 {
    memhook::maps::looks_failed()
}

/// How many `madvise` calls this process made over pages memhook wrote
/// (a patched function's entry, a trampoline) with an advice that would
/// have taken them away (`MADV_DONTNEED`, `MADV_FREE`, ...): each call was
/// made on the rest of its range only, and memhook's pages kept (the
/// function stays hooked, the trampoline intact). Where this count grows,
/// something discards code or memory it does not own (a debugger's
/// support library, a checkpointing tool, an allocator purging past its
/// own memory). A child of `fork` counts from 0.
#[unsafe(no_mangle)]
pub extern "C" fn memhook_discards_kept() -> u64 {
    memhook::kept::discards_kept()
}

/// (threads moved, writes unchecked), both 0 where bistro is not built.
fn threads() -> (u64, u64) {
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    return (memhook::code::threads_moved(), memhook::code::threads_unchecked());
    #[cfg(not(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    (0, 0)
}

/// memhook's version, `"MAJOR.MINOR.PATCH"` (a static string).
#[unsafe(no_mangle)]
pub extern "C" fn memhook_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// A record of `MEMHOOK_REPORT_FD`: an event.
pub const MEMHOOK_RECORD_EVENT: u32 = 1;
/// A record of `MEMHOOK_REPORT_FD`: one [`memhook_hook_status_t`] entry.
pub const MEMHOOK_RECORD_STATUS: u32 = 2;
/// A record of `MEMHOOK_REPORT_FD`: one of the loader's other namespaces
/// whose libc memhook hooked, as [`memhook_namespace_status`] reports it
/// (`address`: the namespace, `size`: the host functions its libc
/// defines, `value`: how many are hooked, `reason`: why one is not).
pub const MEMHOOK_RECORD_NAMESPACE: u32 = 3;
/// A record of `MEMHOOK_REPORT_FD`, one per process at its exit: the
/// threads moved out of patched bytes and the patches written unchecked
/// (`address`: [`memhook_threads_moved`], `size`:
/// [`memhook_threads_unchecked`]), and the looks at the mappings that
/// failed (`value`: [`memhook_mapping_looks_failed`], at most
/// `UINT32_MAX`), and the discards made around memhook's pages (`result`:
/// [`memhook_discards_kept`]).
pub const MEMHOOK_RECORD_THREADS: u32 = 4;

/// One fixed-size (256-byte) record written to the file descriptor named
/// by `MEMHOOK_REPORT_FD` with a single `write`, or `send` on a socket (so
/// records of several threads never interleave on a pipe or a
/// `SOCK_SEQPACKET` socket, which `memhook run` uses). Reporting stops
/// when a write fails or the descriptor is no longer the one it began
/// with (the program closed it, and its number may name another file).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct memhook_record_t {
    /// `MEMHOOK_RECORD_EVENT`, `MEMHOOK_RECORD_STATUS`,
    /// `MEMHOOK_RECORD_NAMESPACE` or `MEMHOOK_RECORD_THREADS`.
    pub kind: u32,
    /// The event's `MEMHOOK_EVENT_*` bit (events).
    pub event_type: u32,
    /// The process that wrote it.
    pub pid: u32,
    /// The memory type (`MEM_TYPE_*` events); for status: 1 when the hook
    /// took, 2 when it waits for its library to load, 0 when it failed;
    /// for a namespace, how many of its functions are hooked; for threads,
    /// the looks at the mappings that failed.
    pub value: u32,
    /// The range's start (events); the namespace (namespaces); threads
    /// moved (threads).
    pub address: u64,
    /// The range's length (events; 0 when unknown); the host functions
    /// the namespace's libc defines (namespaces); patches written
    /// unchecked (threads).
    pub size: u64,
    /// The call's result (events that have one); for threads, the
    /// discards made around memhook's pages.
    pub result: i64,
    /// The function that raised the event (empty for `VM_*`), or the hooked
    /// function (status).
    pub function: [c_char; 48],
    /// The library (status).
    pub library: [c_char; 24],
    /// The mode (status).
    pub mode: [c_char; 16],
    /// Why the mode did not take (status), or why a function of a
    /// namespace is not hooked (namespaces).
    pub reason: [c_char; 128],
}

const _: () = assert!(size_of::<memhook_record_t>() == 256);

fn empty_record(kind: u32) -> memhook_record_t {
    memhook_record_t {
        kind,
        event_type: 0,
        // SAFETY: getpid cannot fail.
        pid: unsafe { libc::getpid() } as u32,
        value: 0,
        address: 0,
        size: 0,
        result: 0,
        function: [0; 48],
        library: [0; 24],
        mode: [0; 16],
        reason: [0; 128],
    }
}

/// What the descriptor of `MEMHOOK_REPORT_FD` was when reporting began:
/// its device and inode (from `fstat`), and whether it is a socket.
static REPORT_DEV: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
static REPORT_INO: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
static REPORT_SOCKET: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// The device and inode of `fd`, and whether it is a socket (`None`: not
/// open).
fn identity(fd: c_int) -> Option<(u64, u64, bool)> {
    let mut st = core::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat only writes `st`.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: zero-initialised, then filled by a successful fstat.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino, st.st_mode & libc::S_IFMT == libc::S_IFSOCK))
}

/// Writes one record to `fd`, if it is still what reporting began with.
///
/// A program may close the descriptor it inherited (a daemon closing
/// every descriptor but its own) and open a file that gets its number:
/// memhook then wrote its records into that file. So each write first
/// checks the descriptor's device and inode, and reporting stops for good
/// at the first mismatch or failed write. On a socket (`memhook run`'s),
/// the record goes with `send(MSG_NOSIGNAL)`: a reader that went away is
/// an error, not a `SIGPIPE` that ends the program. errno is left as it
/// was.
fn write_record(fd: c_int, r: &memhook_record_t) {
    use core::sync::atomic::Ordering;
    if REPORT_FD.load(Ordering::Acquire) != fd {
        return;
    }
    // SAFETY: this thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    let same = identity(fd).is_some_and(|(dev, ino, _)| {
        (dev, ino) == (REPORT_DEV.load(Ordering::Relaxed), REPORT_INO.load(Ordering::Relaxed))
    });
    // SAFETY: the record's own bytes, all initialised: its fields fill
    // its 256 bytes with no padding (the size assertion above).
    let bytes = unsafe {
        core::slice::from_raw_parts(
            (r as *const memhook_record_t).cast::<u8>(),
            size_of::<memhook_record_t>(),
        )
    };
    // By memhook::sys, not libc's send and write: this runs inside mmap
    // and the rest, which are not cancellation points.
    let failed = same
        && loop {
            let sent = if REPORT_SOCKET.load(Ordering::Relaxed) {
                memhook::sys::send(fd, bytes, libc::MSG_NOSIGNAL)
            } else {
                memhook::sys::write(fd, bytes)
            };
            match sent {
                Ok(_) => break false,
                Err(libc::EINTR) => continue,
                // A full non-blocking descriptor: this record is lost,
                // the next may go.
                Err(e) if e == libc::EAGAIN || e == libc::EWOULDBLOCK => break false,
                Err(_) => break true,
            }
        };
    if !same || failed {
        // The reader went away, or the descriptor is another's now: the
        // program keeps running, unreported.
        REPORT_FD.store(-1, Ordering::Release);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The record of one event.
fn event_record(e: &Event) -> memhook_record_t {
    let mut r = empty_record(MEMHOOK_RECORD_EVENT);
    r.event_type = e.kind();
    r.result = e.result().unwrap_or(0) as i64;
    let (function, address, size) = match *e {
        Event::Mmap(m) => ("mmap", m.result, m.size),
        Event::Munmap(m) => ("munmap", m.address, m.size),
        Event::Mremap(m) => ("mremap", m.result, m.new_size),
        Event::Shmat(m) => ("shmat", m.result, 0),
        Event::Shmdt(m) => ("shmdt", m.shmaddr, 0),
        Event::Sbrk(m) => ("sbrk", m.result, m.increment.unsigned_abs()),
        Event::Brk(m) => ("brk", m.addr, 0),
        Event::Madvise(m) => ("madvise", m.addr, m.length),
        Event::VmMapped(v) | Event::VmUnmapped(v) => ("", v.address, v.size),
        Event::MemTypeAlloc(m) | Event::MemTypeFree(m) => {
            r.value = m.mem_type;
            (
                memhook::cuda::reporting_function().unwrap_or("memhook_report_event"),
                m.address,
                m.size,
            )
        }
    };
    copy(&mut r.function, function);
    r.address = address as u64;
    r.size = size as u64;
    r
}

/// The `MEMHOOK_REPORT_FD` handler (context word `a`: the descriptor).
unsafe fn report(fd: usize, _: usize, e: &mut Event) {
    write_record(fd as c_int, &event_record(e));
}

/// The descriptor of `MEMHOOK_REPORT_FD`, once read.
static REPORT_FD: core::sync::atomic::AtomicI32 = core::sync::atomic::AtomicI32::new(-1);

/// Writes every status entry as a record, then one record per loader
/// namespace besides the main one whose libc is hooked, then the counts
/// of threads moved out of patches.
fn write_status(fd: c_int) {
    // One entry at a time: this runs at the program's exit, on whatever
    // thread calls `exit`.
    let mut index = 0;
    while let (Some(s), _) = memhook::status_at(index) {
        index += 1;
        let c = to_c_status(&s);
        let mut r = empty_record(MEMHOOK_RECORD_STATUS);
        r.function = c.function;
        r.library = c.library;
        r.mode = c.mode;
        r.value = if s.installed {
            1
        } else if s.pending {
            2
        } else {
            0
        };
        copy(&mut r.reason, &s.reason);
        write_record(fd, &r);
    }
    for n in memhook::namespaces().iter() {
        let mut r = empty_record(MEMHOOK_RECORD_NAMESPACE);
        r.address = n.namespace as u64;
        r.size = n.functions as u64;
        r.value = n.hooked as u32;
        copy(&mut r.reason, &n.reason);
        write_record(fd, &r);
    }
    let mut r = empty_record(MEMHOOK_RECORD_THREADS);
    (r.address, r.size) = threads();
    r.value = u32::try_from(memhook::maps::looks_failed()).unwrap_or(u32::MAX);
    r.result = i64::try_from(memhook::kept::discards_kept()).unwrap_or(i64::MAX);
    write_record(fd, &r);
}

extern "C" fn status_at_exit() {
    let fd = REPORT_FD.load(core::sync::atomic::Ordering::Acquire);
    if fd >= 0 {
        write_status(fd);
    }
}

/// `MEMHOOK_REPORT_ID=dev:ino`, if set: the device and inode of the
/// descriptor `MEMHOOK_REPORT_FD` names in the process it was made for
/// (`memhook run` sets both). `Err` for a value that is not that.
fn report_id() -> Result<Option<(u64, u64)>, &'static str> {
    let Some(v) = std::env::var_os("MEMHOOK_REPORT_ID") else {
        return Ok(None);
    };
    v.to_str()
        .and_then(|s| s.trim().split_once(':'))
        .and_then(|(dev, ino)| Some((dev.parse().ok()?, ino.parse().ok()?)))
        .map(Some)
        .ok_or("MEMHOOK_REPORT_ID is not DEVICE:INODE")
}

/// The descriptor to report on: `MEMHOOK_REPORT_FD`'s, if this process
/// has it (the one `MEMHOOK_REPORT_ID` names, when set); else a new
/// connection to `MEMHOOK_REPORT_SOCKET`; else none.
fn report_fd() -> Result<Option<c_int>, &'static str> {
    let socket = std::env::var_os("MEMHOOK_REPORT_SOCKET");
    if let Some(v) = std::env::var_os("MEMHOOK_REPORT_FD") {
        let fd: c_int = v
            .to_str()
            .and_then(|s| s.trim().parse().ok())
            .filter(|&fd| fd >= 0)
            .ok_or("MEMHOOK_REPORT_FD is not a file descriptor number")?;
        match (identity(fd), report_id()?) {
            (Some((dev, ino, _)), Some(id)) if id != (dev, ino) => {}
            (Some(_), _) => return Ok(Some(fd)),
            (None, Some(_)) => {}
            (None, None) if socket.is_some() => {}
            (None, None) => return Err("MEMHOOK_REPORT_FD names a descriptor that is not open"),
        }
    }
    Ok(socket.and_then(|name| connect_abstract(name.as_encoded_bytes())))
}

/// A `SOCK_SEQPACKET` connection (close-on-exec: a program this one
/// starts connects for itself) to the socket named `name` in the
/// abstract namespace; `None` if there is none, or it refuses.
fn connect_abstract(name: &[u8]) -> Option<c_int> {
    // SAFETY: an all-zero sockaddr_un is valid; filled below.
    let mut addr: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    if name.is_empty() || name.len() + 1 > addr.sun_path.len() {
        return None;
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // The abstract namespace: a NUL, then the name (no terminator).
    for (dst, &b) in addr.sun_path[1..].iter_mut().zip(name) {
        *dst = b as c_char;
    }
    let len = core::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    // SAFETY: plain flags.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `addr` is a sockaddr_un of which `len` bytes are the address.
    let rc = unsafe { libc::connect(fd, (&raw const addr).cast(), len as libc::socklen_t) };
    if rc != 0 {
        // SAFETY: the socket made above, closed once.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(fd)
}

/// Starts `MEMHOOK_REPORT_FD=n` reporting if the variable names a
/// descriptor: every event as a record (priority 1000: after every other
/// handler, with the final result), the status now and at exit. Returns
/// an error message for a bad value.
///
/// The variable outlives the descriptor: a program started by one that
/// closed the descriptor and opened a file on its number (a script's
/// `exec 4>log`) inherits both, and would write its records into that
/// file. With `MEMHOOK_REPORT_ID` set, a descriptor that is not the one
/// named is left alone (and nothing is said: such descendants are
/// expected).
///
/// Such a process, and one whose parent closed the descriptor before
/// starting it (Python's `multiprocessing` spawn children), connects to
/// `MEMHOOK_REPORT_SOCKET` instead when that names a listening socket in
/// the abstract namespace (`memhook run` sets it), so that its events
/// are counted too.
pub(crate) fn start_from_env() -> Result<(), &'static str> {
    let Some(fd) = report_fd()? else {
        return Ok(());
    };
    let Some((dev, ino, socket)) = identity(fd) else {
        return Err("MEMHOOK_REPORT_FD names a descriptor that is not open");
    };
    REPORT_DEV.store(dev, core::sync::atomic::Ordering::Relaxed);
    REPORT_INO.store(ino, core::sync::atomic::Ordering::Relaxed);
    REPORT_SOCKET.store(socket, core::sync::atomic::Ordering::Relaxed);
    REPORT_FD.store(fd, core::sync::atomic::Ordering::Release);
    let h = HandlerFn::Raw {
        func: report,
        a: fd as usize,
        b: 0,
    };
    memhook::set_handler(bits::ALL_EVENTS, 1000, h).map_err(|_| "MEMHOOK_REPORT_FD: cannot register the handler")?;
    write_status(fd);
    // SAFETY: registers a function with no arguments that only writes.
    unsafe { libc::atexit(status_at_exit) };
    Ok(())
}

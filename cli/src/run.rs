//! `memhook run`: runs a command with libmemhook preloaded and
//! `MEMHOOK_REPORT_FD` naming one end of a socket pair, reads the records, shows a live
//! line on a terminal, and summarises.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{IsTerminal, Read};
use std::os::fd::FromRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use memhook::event::bits;

use crate::json_string;

/// What `run` was asked.
pub struct Options {
    pub cuda_mode: Option<String>,
    pub mmap_mode: Option<String>,
    pub trace: bool,
    pub json: bool,
    pub command: Vec<String>,
}

/// The record layout of `memhook_record_t` (ffi/src/report.rs).
const RECORD: usize = 256;
const KIND_EVENT: u32 = 1;
const KIND_STATUS: u32 = 2;
const KIND_NAMESPACE: u32 = 3;
const KIND_THREADS: u32 = 4;

struct Record {
    kind: u32,
    event_type: u32,
    pid: u32,
    value: u32,
    address: u64,
    size: u64,
    result: i64,
    function: String,
    library: String,
    mode: String,
    reason: String,
}

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn parse(b: &[u8; RECORD]) -> Record {
    let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
    Record {
        kind: u32_at(0),
        event_type: u32_at(4),
        pid: u32_at(8),
        value: u32_at(12),
        address: u64_at(16),
        size: u64_at(24),
        result: i64::from_ne_bytes(b[32..40].try_into().unwrap()),
        function: cstr(&b[40..88]),
        library: cstr(&b[88..112]),
        mode: cstr(&b[112..128]),
        reason: cstr(&b[128..256]),
    }
}

/// Ranges alive, per process (each has its own address space: a child's
/// unmap of what it inherited leaves its parent's mapping counted) and
/// per memory type, with the bytes of all processes and their peak.
#[derive(Default)]
struct Alive {
    /// pid -> start -> (end, type name)
    ranges: HashMap<u32, BTreeMap<u64, (u64, &'static str)>>,
    bytes: HashMap<&'static str, u64>,
    peak: HashMap<&'static str, u64>,
}

impl Alive {
    fn remove(&mut self, pid: u32, start: u64, end: u64) {
        let Some(ranges) = self.ranges.get_mut(&pid) else {
            return;
        };
        let overlapping: Vec<(u64, (u64, &'static str))> = ranges
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(s, v)| (*s, *v))
            .collect();
        for &(s, _) in &overlapping {
            ranges.remove(&s);
        }
        for (s, (e, t)) in overlapping {
            *self.bytes.entry(t).or_default() -= e - s;
            if s < start {
                self.add_raw(pid, s, start, t);
            }
            if e > end {
                self.add_raw(pid, end, e, t);
            }
        }
    }

    fn add_raw(&mut self, pid: u32, start: u64, end: u64, t: &'static str) {
        self.ranges.entry(pid).or_default().insert(start, (end, t));
        let b = self.bytes.entry(t).or_default();
        *b += end - start;
        let p = self.peak.entry(t).or_default();
        *p = (*p).max(*b);
    }

    fn add(&mut self, pid: u32, start: u64, size: u64, t: &'static str) {
        if size == 0 {
            return;
        }
        let end = start.saturating_add(size);
        self.remove(pid, start, end);
        self.add_raw(pid, start, end, t);
    }

    /// The end of `pid`'s range that starts at `start` (`start` if none).
    fn end_of(&self, pid: u32, start: u64) -> u64 {
        self.ranges.get(&pid).and_then(|r| r.get(&start)).map_or(start, |v| v.0)
    }
}

#[derive(Default)]
struct Summary {
    events: BTreeMap<String, u64>,
    functions: BTreeMap<String, u64>,
    host: Alive,
    typed: Alive,
    /// (function, mode) -> (library, state: 1 installed, 2 pending, 0 failed, reason)
    hooks: BTreeMap<(String, String), (String, u32, String)>,
    /// The loader's other namespaces whose libc is hooked, as last
    /// reported (at exit): namespace -> (functions, hooked, reason).
    namespaces: BTreeMap<u64, (u64, u32, String)>,
    /// Per process, at its exit: threads moved out of bytes being patched,
    /// patches written with the other threads unchecked, looks at the
    /// mappings that failed, and discards made around memhook's pages.
    threads: BTreeMap<u32, (u64, u64, u64, u64)>,
    total: u64,
    /// The processes that sent records (the command, and its descendants
    /// that load libmemhook).
    processes: std::collections::HashSet<u32>,
}

fn type_name(t: u32) -> &'static str {
    match t {
        0 => "host",
        1 => "cuda",
        2 => "cuda_managed",
        3 => "cuda_host",
        _ => "unknown",
    }
}

impl Summary {
    fn add(&mut self, r: Record) {
        self.processes.insert(r.pid);
        match r.kind {
            KIND_EVENT => {
                self.total += 1;
                let name = bits::name(r.event_type).unwrap_or("?").to_string();
                *self.events.entry(name).or_default() += 1;
                if !r.function.is_empty() {
                    *self.functions.entry(r.function.clone()).or_default() += 1;
                }
                match r.event_type {
                    bits::VM_MAPPED => self.host.add(r.pid, r.address, r.size, "host"),
                    bits::VM_UNMAPPED => self.host.remove(r.pid, r.address, r.address.saturating_add(r.size)),
                    bits::MEM_TYPE_ALLOC => self.typed.add(r.pid, r.address, r.size, type_name(r.value)),
                    bits::MEM_TYPE_FREE => {
                        let end = if r.size == 0 {
                            // Size unknown: the allocation that starts here.
                            self.typed.end_of(r.pid, r.address)
                        } else {
                            r.address.saturating_add(r.size)
                        };
                        self.typed.remove(r.pid, r.address, end);
                    }
                    _ => {}
                }
            }
            KIND_STATUS => {
                self.hooks.insert((r.function, r.mode), (r.library, r.value, r.reason));
            }
            KIND_NAMESPACE => {
                self.namespaces.insert(r.address, (r.size, r.value, r.reason));
            }
            KIND_THREADS => {
                let kept = u64::try_from(r.result).unwrap_or(0);
                self.threads
                    .insert(r.pid, (r.address, r.size, u64::from(r.value), kept));
            }
            _ => {}
        }
    }

    /// Threads moved out of patched bytes, patches written unchecked,
    /// looks at the mappings that failed, and discards made around
    /// memhook's pages, summed over the processes.
    fn threads(&self) -> (u64, u64, u64, u64) {
        self.threads
            .values()
            .fold((0, 0, 0, 0), |(m, u, l, k), &(moved, unchecked, looks, kept)| {
                (m + moved, u + unchecked, l + looks, k + kept)
            })
    }

    fn bytes(&self, t: &'static str) -> (u64, u64) {
        let a = if t == "host" { &self.host } else { &self.typed };
        (
            a.bytes.get(t).copied().unwrap_or(0),
            a.peak.get(t).copied().unwrap_or(0),
        )
    }

    fn json(&self, ended: Ended) -> String {
        let exit_status = ended.code();
        let signal = match ended {
            Ended::Killed(sig) => sig.to_string(),
            Ended::Exited(_) => "null".into(),
        };
        let map = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, v)| format!("{}: {v}", json_string(k)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let alive = ["host", "cuda", "cuda_managed", "cuda_host"]
            .iter()
            .map(|t| format!("\"{t}\": {}", self.bytes(t).0))
            .collect::<Vec<_>>()
            .join(", ");
        let hooks = self
            .hooks
            .iter()
            .map(|((f, m), (l, state, why))| {
                format!(
                    "{{\"function\": {}, \"library\": {}, \"mode\": {}, \"installed\": {}, \"reason\": {}}}",
                    json_string(f),
                    json_string(l),
                    json_string(m),
                    *state == 1,
                    json_string(why)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let namespaces = self
            .namespaces
            .iter()
            .map(|(n, (functions, hooked, why))| {
                format!(
                    "{{\"namespace\": {n}, \"functions\": {functions}, \"hooked\": {hooked}, \"reason\": {}}}",
                    json_string(why)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let (moved, unchecked, looks, kept) = self.threads();
        format!(
            "{{\"exit_status\": {exit_status}, \"signal\": {signal}, \"processes\": {}, \"events\": {{{}}}, \"functions\": {{{}}}, \"bytes_alive\": {{{alive}}}, \"hooks\": [{hooks}], \"namespaces\": [{namespaces}], \"threads_moved\": {moved}, \"threads_unchecked\": {unchecked}, \"mapping_looks_failed\": {looks}, \"discards_kept\": {kept}}}",
            self.processes.len(),
            map(&self.events),
            map(&self.functions)
        )
    }

    fn table(&self, command: &str, ended: Ended) -> String {
        let mut o = String::new();
        let _ = match ended {
            Ended::Exited(code) => writeln!(o, "memhook run: `{command}` exited with status {code}"),
            Ended::Killed(sig) => writeln!(
                o,
                "memhook run: `{command}` was killed by signal {sig} ({})",
                signal_name(sig)
            ),
        };
        let _ = writeln!(
            o,
            "events by kind ({} in all, from {} process{}):",
            self.total,
            self.processes.len(),
            if self.processes.len() == 1 { "" } else { "es" }
        );
        for (k, v) in &self.events {
            let _ = writeln!(o, "  {k:<16} {v:>10}");
        }
        let _ = writeln!(o, "events by function:");
        for (k, v) in &self.functions {
            let _ = writeln!(o, "  {k:<32} {v:>10}");
        }
        let _ = writeln!(o, "bytes alive at exit (peak):");
        for t in ["host", "cuda", "cuda_managed", "cuda_host", "unknown"] {
            let (now, peak) = self.bytes(t);
            let _ = writeln!(o, "  {t:<13} {now:>16} ({peak})");
        }
        let mut per_mode: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
        for ((_, m), (_, state, _)) in &self.hooks {
            per_mode.entry(m).or_default()[(*state as usize).min(2)] += 1;
        }
        let _ = writeln!(o, "hooks:");
        if per_mode.is_empty() {
            let _ = writeln!(o, "  none reported (was the program dynamically linked?)");
        }
        for (m, [failed, ok, pending]) in &per_mode {
            let _ = writeln!(
                o,
                "  {m:<9} {ok} installed, {failed} failed, {pending} waiting for a library never loaded"
            );
        }
        for ((f, m), (l, state, why)) in &self.hooks {
            if *state == 0 {
                let _ = writeln!(o, "  not hooked: {f} ({l}, {m}): {why}");
            }
        }
        if !self.namespaces.is_empty() {
            let _ = writeln!(o, "loader namespaces of their own (dlmopen), at exit:");
        }
        for (n, (functions, hooked, why)) in &self.namespaces {
            let why = if why.is_empty() {
                String::new()
            } else {
                format!(": {why}")
            };
            let _ = writeln!(o, "  namespace {n}: {hooked} of {functions} host functions hooked{why}");
        }
        let (moved, unchecked, looks, kept) = self.threads();
        if moved > 0 {
            let _ = writeln!(
                o,
                "threads moved out of bytes being patched: {moved} (each went on from the trampoline)"
            );
        }
        if unchecked > 0 {
            let _ = writeln!(
                o,
                "patches written with other threads unchecked: {unchecked} (a thread stopped inside would crash; see `memhook doctor`)"
            );
        }
        if looks > 0 {
            let _ = writeln!(
                o,
                "looks at the mappings that could not read them: {looks} (no descriptor left, or no /proc: a file emptied then may have taken pages of its other mappings unreported)"
            );
        }
        if kept > 0 {
            let _ = writeln!(
                o,
                "discards made around memhook's pages: {kept} (a madvise over a patched function's code or a trampoline: those pages kept, the rest discarded)"
            );
        }
        o
    }
}

/// Where libmemhook.so is: `$MEMHOOK_LIB`, or next to this executable (or
/// in `../lib`).
fn library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MEMHOOK_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("MEMHOOK_LIB={} is not a file", p.display()))
        };
    }
    let exe = this_executable()?;
    let dir = exe.parent().unwrap_or(std::path::Path::new("."));
    for candidate in [dir.join("libmemhook.so"), dir.join("../lib/libmemhook.so")] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "libmemhook.so not found next to {} (set MEMHOOK_LIB)",
        exe.display()
    ))
}

/// This executable's path: `/proc/self/exe`, or where `/proc` is not
/// mounted, the command's name as the shell found it (a path, or the
/// first executable of that name on `PATH`).
fn this_executable() -> Result<PathBuf, String> {
    let exe = match std::env::current_exe() {
        Ok(exe) => return Ok(exe),
        Err(e) => e,
    };
    let not_found = || format!("cannot find this executable: {exe} (set MEMHOOK_LIB to the path of libmemhook.so)");
    let name = PathBuf::from(std::env::args_os().next().ok_or_else(not_found)?);
    let found = if name.as_os_str().as_encoded_bytes().contains(&b'/') {
        Some(name)
    } else {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path).map(|d| d.join(&name)).find(|p| {
                std::fs::metadata(p).is_ok_and(|m| {
                    m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
                })
            })
        })
    };
    found.and_then(|p| p.canonicalize().ok()).ok_or_else(not_found)
}

/// A signal's name (`SIGSEGV`), or `signal N` for one without a common name.
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.into()
}

/// Why `run` could not run the command: a message, and the status to
/// leave with (126: the command cannot be executed; 127: it is not found,
/// as `env`, `nohup` and `timeout` say; 1 otherwise).
pub struct Failed {
    pub message: String,
    pub code: i32,
}

impl From<String> for Failed {
    fn from(message: String) -> Self {
        Failed { message, code: 1 }
    }
}

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it.
    Killed(i32),
}

impl Ended {
    /// The shell's number for it: the status, or 128 plus the signal.
    pub fn code(self) -> i32 {
        match self {
            Ended::Exited(code) => code,
            Ended::Killed(signal) => 128 + signal,
        }
    }
}

/// The signals a terminal sends to its whole foreground group (Ctrl-C,
/// Ctrl-\\): the command gets them itself, and decides what they mean;
/// `memhook run` waits for it to end, and then summarises.
const TERMINAL_SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGQUIT];

/// Ignores [`TERMINAL_SIGNALS`] in this process and returns their actions
/// as they were, for the command to start with.
fn ignore_terminal_signals() -> [libc::sigaction; 2] {
    TERMINAL_SIGNALS.map(|sig| {
        // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, no
        // flags, empty mask), overwritten by the call.
        let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
        // SAFETY: as above; SIG_IGN needs no handler.
        let mut ignore: libc::sigaction = unsafe { core::mem::zeroed() };
        ignore.sa_sigaction = libc::SIG_IGN;
        // SAFETY: valid signal number and pointers to locals.
        unsafe { libc::sigaction(sig, &ignore, &mut old) };
        old
    })
}

/// Leaves as `ended` says: the status, or, when a signal ended the
/// command, that signal, raised on this process with its default action
/// (so that a shell that runs `memhook run` sees what it would have seen
/// of the command alone, and a script interrupted by Ctrl-C stops), and
/// no core file of memhook's own. 128 plus the signal if it does not end
/// this process.
pub fn leave(ended: Ended) -> ! {
    if let Ended::Killed(sig) = ended {
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid resource and a pointer to a local; the default
        // action is restored and the signal unblocked before it is raised.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = core::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, core::ptr::null_mut());
            libc::raise(sig);
        }
    }
    std::process::exit(ended.code())
}

/// `DEVICE:INODE` of the socket `fd`, for `MEMHOOK_REPORT_ID`: a process
/// that inherits `MEMHOOK_REPORT_FD` but whose descriptor of that number
/// is another file (its parent closed ours and opened the file there)
/// then writes no record into it.
fn report_id(fd: libc::c_int) -> Result<String, Failed> {
    let mut st = core::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat only writes `st`.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(format!("fstat of the report socket: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: zero-initialised, then filled by a successful fstat.
    let st = unsafe { st.assume_init() };
    Ok(format!("{}:{}", st.st_dev, st.st_ino))
}

/// A listening `SOCK_SEQPACKET` socket in the abstract namespace, named
/// for this run (`MEMHOOK_REPORT_SOCKET`): where a descendant that does
/// not have the pair's end (its parent closed it, as Python's
/// `multiprocessing` does for a spawned child, or put a file on its
/// number) connects to report. Returns the socket and its name.
fn listen_for_descendants() -> Result<(libc::c_int, String), Failed> {
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = format!("memhook-run-{}-{nonce:08x}", std::process::id());
    // SAFETY: an all-zero sockaddr_un is valid; filled below.
    let mut addr: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // The abstract namespace: a NUL, then the name (no terminator).
    for (dst, b) in addr.sun_path[1..].iter_mut().zip(name.bytes()) {
        *dst = b as libc::c_char;
    }
    let len = core::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    let os_error = |what: &str| Failed::from(format!("{what}: {}", std::io::Error::last_os_error()));
    // SAFETY: plain flags.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(os_error("socket"));
    }
    // SAFETY: `addr` is a sockaddr_un of which `len` bytes are the
    // address; `fd` is the socket made above.
    let bound = unsafe { libc::bind(fd, (&raw const addr).cast(), len as libc::socklen_t) } == 0;
    // SAFETY: the socket made and bound above.
    if !bound || unsafe { libc::listen(fd, 128) } != 0 {
        let e = os_error("the descendants' socket");
        // SAFETY: the socket made above, closed once.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    Ok((fd, name))
}

/// Reads records from `fd` into `summary` until the writers are gone,
/// then closes it.
fn read_records(fd: libc::c_int, summary: &Mutex<Summary>) {
    // SAFETY: `fd` is owned by the caller's thread from now on.
    let mut records = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut buf = [0u8; RECORD];
    while records.read_exact(&mut buf).is_ok() {
        summary.lock().unwrap().add(parse(&buf));
    }
}

/// `poll` of `fd` for input, waiting up to `timeout_ms` (-1: as long as
/// it takes): > 0 when readable, 0 when the time ran out, < 0 on error.
fn poll_in(fd: libc::c_int, timeout_ms: libc::c_int) -> libc::c_int {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, a local.
    unsafe { libc::poll(&mut p, 1, timeout_ms) }
}

/// Whether a connection waits on `listener` to be accepted.
fn pending(listener: libc::c_int) -> bool {
    poll_in(listener, 0) > 0
}

/// Accepts connections from this user's processes on `listener`, each
/// read on a thread of its own. `open` counts the connections being
/// accepted or read.
fn accept_descendants(listener: libc::c_int, summary: Arc<Mutex<Summary>>, open: Arc<AtomicUsize>) {
    loop {
        if poll_in(listener, -1) < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        // Counted before the accept: a wait for the readers that finds
        // nothing pending finds this count.
        open.fetch_add(1, Ordering::SeqCst);
        // SAFETY: accepts on the listening socket; no peer address asked.
        let c = unsafe {
            libc::accept4(
                listener,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if c < 0 || !same_user(c) {
            if c >= 0 {
                // SAFETY: the connection just accepted, closed once.
                unsafe { libc::close(c) };
            }
            open.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (summary, open) = (summary.clone(), open.clone());
        std::thread::spawn(move || {
            read_records(c, &summary);
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Whether the process at the other end of `c` runs as this user (the
/// abstract namespace has no file permissions: anyone may connect).
fn same_user(c: libc::c_int) -> bool {
    // SAFETY: an all-zero ucred is valid; filled by getsockopt.
    let mut cred: libc::ucred = unsafe { core::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of `len` bytes.
    let rc = unsafe { libc::getsockopt(c, libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len) };
    // SAFETY: getuid cannot fail.
    rc == 0 && cred.uid == unsafe { libc::getuid() }
}

/// Runs the command and summarises its events; returns how it ended.
pub fn run(opts: Options) -> Result<Ended, Failed> {
    let lib = library()?;
    let mut fds = [0; 2];
    // A socket pair of records, not a pipe: a record is one message,
    // never split or interleaved, and the program's `send(MSG_NOSIGNAL)`
    // gets an error, not a SIGPIPE that ends it, if this process goes
    // away first.
    // SAFETY: a two-element array for the pair's ends.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) } != 0 {
        return Err(format!("socketpair: {}", std::io::Error::last_os_error()).into());
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    // The read end stays in this process only.
    // SAFETY: sets a flag on a descriptor this function owns.
    unsafe { libc::fcntl(read_fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // Without it (a sandbox that refuses the socket), descendants that
    // lack the pair's end are not counted, and the run goes on.
    let descendants = match listen_for_descendants() {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!(
                "memhook run: {} (descendants without the report socket are not counted)",
                e.message
            );
            None
        }
    };
    // After an AddressSanitizer runtime, which must come first (see
    // `preload`). A command that cannot be read is left for the spawn to
    // report; one the loader cannot preload into is said to be so.
    use crate::preload::Program;
    let file = crate::preload::command_file(opts.command[0].as_ref());
    let program = file.as_deref().and_then(|f| crate::preload::inspect(f).ok());
    let secure = file.as_deref().and_then(crate::preload::secure_execution);
    let not_loaded = match (&program, secure) {
        (Some(Program::Static), _) => Some("statically linked (no loader reads LD_PRELOAD)".to_string()),
        (Some(Program::Foreign(what)), _) => Some(what.to_string()),
        // `sudo`, `passwd`, `ping` run by a user other than root.
        (Some(Program::Dynamic(_)), Some(why)) => Some(format!(
            "{why} (the loader ignores LD_PRELOAD's paths in its secure-execution mode)"
        )),
        _ => None,
    };
    if let Some(why) = not_loaded {
        eprintln!(
            "memhook run: `{}` is {why}: libmemhook.so cannot be loaded into it, so only \
             the programs it starts that can load it are reported",
            opts.command[0]
        );
    }
    let needed = match program {
        Some(Program::Dynamic(needed)) => needed,
        _ => Vec::new(),
    };
    let preload = crate::preload::preload(&lib, std::env::var_os("LD_PRELOAD").as_deref(), &needed);
    let mut cmd = Command::new(&opts.command[0]);
    cmd.args(&opts.command[1..])
        .env("LD_PRELOAD", preload)
        .env(
            "ASAN_OPTIONS",
            crate::preload::asan_options(std::env::var_os("ASAN_OPTIONS").as_deref()),
        )
        .env("MEMHOOK_REPORT_FD", write_fd.to_string())
        .env("MEMHOOK_REPORT_ID", report_id(write_fd)?);
    if let Some((_, name)) = &descendants {
        cmd.env("MEMHOOK_REPORT_SOCKET", name);
    }
    if let Some(m) = &opts.cuda_mode {
        cmd.env("MEMHOOK_CUDA_HOOK_MODE", m);
    }
    if let Some(m) = &opts.mmap_mode {
        cmd.env("MEMHOOK_MMAP_HOOK_MODE", m);
    }
    if opts.trace {
        cmd.env("MEMHOOK_TRACE", "1");
    }
    // Ignored here from before the command starts (no moment at which
    // Ctrl-C ends memhook run and leaves the command running unwatched);
    // the command starts with them as they were.
    let terminal_signals = ignore_terminal_signals();
    // SAFETY: runs in the child between fork and exec, and calls only
    // sigaction, which is async-signal-safe, with a copy it owns.
    unsafe {
        cmd.pre_exec(move || {
            for (sig, action) in TERMINAL_SIGNALS.iter().zip(&terminal_signals) {
                libc::sigaction(*sig, action, core::ptr::null_mut());
            }
            Ok(())
        })
    };
    let spawned = cmd.spawn();
    // SAFETY: the write end belongs to the child now.
    unsafe { libc::close(write_fd) };
    let mut child = spawned.map_err(|e| Failed {
        message: format!("cannot run {}: {e}", opts.command[0]),
        code: match e.kind() {
            std::io::ErrorKind::NotFound => 127,
            _ if e.raw_os_error().is_some() => 126,
            _ => 1,
        },
    })?;

    let summary = Arc::new(Mutex::new(Summary::default()));
    let reader = {
        let summary = summary.clone();
        // The read end, owned by this thread from now on.
        std::thread::spawn(move || read_records(read_fd, &summary))
    };
    let open = Arc::new(AtomicUsize::new(0));
    {
        let (summary, open) = (summary.clone(), open.clone());
        if let Some(&(listener, _)) = descendants.as_ref() {
            std::thread::spawn(move || accept_descendants(listener, summary, open));
        }
    }
    let done = Arc::new(AtomicBool::new(false));
    let live = std::io::stderr().is_terminal().then(|| {
        let (summary, done) = (summary.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut last, mut t) = (0, Instant::now());
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(500));
                let s = summary.lock().unwrap();
                let rate = (s.total - last) as f64 / t.elapsed().as_secs_f64();
                (last, t) = (s.total, Instant::now());
                let mib = |ty| s.bytes(ty).0 as f64 / (1 << 20) as f64;
                eprint!(
                    "\r\x1b[K[memhook] {rate:.0} events/s  host {:.1} MiB  cuda {:.1} MiB  managed {:.1} MiB  pinned {:.1} MiB",
                    mib("host"),
                    mib("cuda"),
                    mib("cuda_managed"),
                    mib("cuda_host")
                );
            }
            eprint!("\r\x1b[K");
        })
    });
    let status = child.wait().map_err(|e| format!("waiting for the command: {e}"))?;
    // Descendants may still hold the pair or a connection: give them a
    // moment, then summarise.
    let deadline = Instant::now() + Duration::from_millis(500);
    let reading = || {
        !reader.is_finished()
            || descendants.as_ref().is_some_and(|&(l, _)| pending(l))
            || open.load(Ordering::SeqCst) > 0
    };
    while reading() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    done.store(true, Ordering::Relaxed);
    if let Some(l) = live {
        let _ = l.join();
    }
    let ended = match (status.code(), status.signal()) {
        (Some(code), _) => Ended::Exited(code),
        (None, Some(sig)) => Ended::Killed(sig),
        (None, None) => Ended::Exited(1),
    };
    let s = summary.lock().unwrap();
    if opts.json {
        println!("{}", s.json(ended));
    } else {
        eprint!("{}", s.table(&opts.command.join(" "), ended));
    }
    Ok(ended)
}

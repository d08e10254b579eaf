//! `LD_PRELOAD=libmemhook.so`: install from the environment at load, and
//! with `MEMHOOK_TRACE=1` print every event to stderr (formatted into a
//! stack buffer and written with one `write`: no allocation).

use core::fmt::Write as _;

use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

/// A line of trace, on the stack.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl core::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

fn emit(args: core::fmt::Arguments<'_>) {
    let mut line = Line { buf: [0; 256], len: 0 };
    let _ = line.write_fmt(args);
    let _ = line.write_str("\n");
    // Not libc's write, a cancellation point: this runs inside mmap and
    // the rest, which are none (memhook::sys).
    let _ = memhook::sys::write(2, &line.buf[..line.len]);
}

/// The `MEMHOOK_TRACE` handler (registered last, priority 1000, so it sees
/// the final result).
unsafe fn trace(_: usize, _: usize, e: &mut Event) {
    let name = bits::name(e.kind()).unwrap_or("?");
    match *e {
        Event::Mmap(m) => emit(format_args!(
            "memhook: {name} addr={:#x} size={:#x} prot={} flags={:#x} fd={} -> {:#x}",
            m.address, m.size, m.prot, m.flags, m.fd, m.result
        )),
        Event::Munmap(m) => emit(format_args!(
            "memhook: {name} addr={:#x} size={:#x} -> {}",
            m.address, m.size, m.result
        )),
        Event::Mremap(m) => emit(format_args!(
            "memhook: {name} addr={:#x} old={:#x} new={:#x} flags={:#x} -> {:#x}",
            m.address, m.old_size, m.new_size, m.flags, m.result
        )),
        Event::Shmat(m) => emit(format_args!("memhook: {name} shmid={} -> {:#x}", m.shmid, m.result)),
        Event::Shmdt(m) => emit(format_args!("memhook: {name} addr={:#x} -> {}", m.shmaddr, m.result)),
        Event::Sbrk(m) => emit(format_args!(
            "memhook: {name} increment={} -> {:#x}",
            m.increment, m.result
        )),
        Event::Brk(m) => emit(format_args!("memhook: {name} addr={:#x} -> {}", m.addr, m.result)),
        Event::Madvise(m) => emit(format_args!(
            "memhook: {name} addr={:#x} size={:#x} advice={} -> {}",
            m.addr, m.length, m.advice, m.result
        )),
        Event::VmMapped(v) | Event::VmUnmapped(v) => {
            emit(format_args!("memhook: {name} addr={:#x} size={:#x}", v.address, v.size))
        }
        Event::MemTypeAlloc(m) | Event::MemTypeFree(m) => emit(format_args!(
            "memhook: {name} addr={:#x} size={:#x} type={}",
            m.address, m.size, m.mem_type
        )),
    }
}

/// `MEMHOOK_TRACE`: on at `1`; off unset, empty or `0`. Any other value
/// (`yes`, `true`) leaves it off and says so, once, rather than leave the
/// user waiting for a trace that never comes.
fn trace_wanted() -> bool {
    match std::env::var_os("MEMHOOK_TRACE") {
        Some(v) if v == "1" => true,
        Some(v) if v.is_empty() || v == "0" => false,
        Some(v) => {
            emit(format_args!(
                "memhook: MEMHOOK_TRACE=`{}` is neither 1 (on) nor 0 (off): no trace",
                v.to_string_lossy()
            ));
            false
        }
        None => false,
    }
}

fn preloaded() -> bool {
    std::env::var_os("LD_PRELOAD").is_some_and(|v| v.to_string_lossy().contains("libmemhook"))
}

extern "C" fn at_load() {
    let trace_on = trace_wanted();
    let report_on =
        std::env::var_os("MEMHOOK_REPORT_FD").is_some() || std::env::var_os("MEMHOOK_REPORT_SOCKET").is_some();
    if !preloaded() && !trace_on && !report_on {
        return;
    }
    match Config::from_env() {
        Ok(c) => memhook::install(&c),
        Err(e) => {
            emit(format_args!("memhook: {e}; no hooks installed"));
            return;
        }
    }
    let mut index = 0;
    while let (Some(s), _) = memhook::status_at(index) {
        index += 1;
        if s.installed || s.pending {
            continue;
        }
        emit(format_args!(
            "memhook: {} ({}) not hooked: {}",
            s.function,
            s.mode.name(),
            s.reason
        ));
    }
    if let Err(e) = crate::report::start_from_env() {
        emit(format_args!("memhook: {e}"));
    }
    if trace_on {
        let h = HandlerFn::Raw {
            func: trace,
            a: 0,
            b: 0,
        };
        if let Err(e) = memhook::set_handler(bits::ALL_EVENTS, 1000, h) {
            emit(format_args!("memhook: MEMHOOK_TRACE: {e}"));
        }
    }
}

/// Runs when the library is loaded (LD_PRELOAD, or a link at startup).
#[used]
#[unsafe(link_section = ".init_array")]
static AT_LOAD: extern "C" fn() = at_load;

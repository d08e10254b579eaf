//! `memhook demo`: a built-in workload for a new user. Installs the hooks
//! in this process, maps and unmaps memory, mallocs and frees large
//! blocks, and with a GPU allocates device, managed and pinned memory
//! through cudarc; prints the events it saw and what the memory-type map
//! says about each allocation.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use memhook::event::{Event, bits};
use memhook::memtype::{self, Lookup};
use memhook::{Config, HandlerFn};

/// The events seen, kept without allocating (a handler must not).
const LOG: usize = 4096;
static KIND: [AtomicU32; LOG] = [const { AtomicU32::new(0) }; LOG];
static ADDR: [AtomicUsize; LOG] = [const { AtomicUsize::new(0) }; LOG];
static SIZE: [AtomicUsize; LOG] = [const { AtomicUsize::new(0) }; LOG];
static NEXT: AtomicUsize = AtomicUsize::new(0);

fn log(e: &mut Event) {
    let (addr, size) = match *e {
        Event::Mmap(m) => (m.result, m.size),
        Event::Munmap(m) => (m.address, m.size),
        Event::Mremap(m) => (m.result, m.new_size),
        // The memory a grown break adds starts at the old break, the
        // result; a shrink's lies below it.
        Event::Sbrk(s) if s.increment >= 0 => (s.result, s.increment as usize),
        Event::Sbrk(s) => (
            s.result.wrapping_sub(s.increment.unsigned_abs()),
            s.increment.unsigned_abs(),
        ),
        Event::Brk(b) => (b.addr, 0),
        Event::Madvise(m) => (m.addr, m.length),
        Event::VmMapped(v) | Event::VmUnmapped(v) => (v.address, v.size),
        Event::MemTypeAlloc(m) | Event::MemTypeFree(m) => (m.address, m.size),
        _ => (0, 0),
    };
    let i = NEXT.fetch_add(1, Ordering::Relaxed);
    if i < LOG {
        ADDR[i].store(addr, Ordering::Relaxed);
        SIZE[i].store(size, Ordering::Relaxed);
        KIND[i].store(e.kind(), Ordering::Release);
    }
}

/// Prints the events logged since `from` that touch `[lo, hi)`.
fn show(from: usize, lo: usize, hi: usize) -> usize {
    let n = NEXT.load(Ordering::Acquire).min(LOG);
    let mut shown = 0;
    for i in from..n {
        let (a, s) = (ADDR[i].load(Ordering::Relaxed), SIZE[i].load(Ordering::Relaxed));
        if a < hi && lo < a.saturating_add(s.max(1)) {
            let k = bits::name(KIND[i].load(Ordering::Acquire)).unwrap_or("?");
            println!("    {k:<15} {a:#x} + {s:#x}");
            shown += 1;
        }
    }
    shown
}

fn describe(addr: usize) -> String {
    match memtype::lookup(addr, 1) {
        Lookup::Found(i) => format!(
            "{} on device {} ({:#x} + {:#x})",
            i.mem_type.name(),
            i.device,
            i.base,
            i.len
        ),
        Lookup::Absent => "host (no CUDA allocation there)".into(),
        Lookup::Unknown => "unknown (ask the driver: memtype::classify)".into(),
    }
}

pub fn demo() -> i32 {
    println!("memhook demo: hooks installed in this process (mmap: bistro; CUDA: bistro,reloc,procaddr)");
    memhook::install(&Config::defaults());
    if let Err(e) = memhook::set_handler(bits::ALL_EVENTS, 0, HandlerFn::Rust(&|e: &mut Event| log(e))) {
        eprintln!("memhook demo: cannot register a handler: {e}");
        return 1;
    }
    let mut total = 0;
    println!("\nmmap + munmap of 1 MiB, three times:");
    for _ in 0..3 {
        let from = NEXT.load(Ordering::Acquire);
        // SAFETY: a fresh private anonymous mapping, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1 << 20,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as usize;
        println!("  mapped {p:#x}: memtype says {}", describe(p));
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p as *mut libc::c_void, 1 << 20) };
        total += show(from, p, p + (1 << 20));
    }
    println!("\nmalloc + free of 8 MiB, twice (the allocator's own calls, which bistro catches):");
    for _ in 0..2 {
        let from = NEXT.load(Ordering::Acquire);
        let v: Vec<u8> = Vec::with_capacity(8 << 20);
        let p = v.as_ptr() as usize;
        drop(v);
        println!("  block at {p:#x}:");
        let shown = show(from, p.saturating_sub(4096), p + (8 << 20));
        if shown == 0 {
            println!("    (no event: the allocator had the memory already)");
        }
        total += shown;
    }
    total += cuda();
    println!(
        "\n{total} events shown; status: {} hooks installed",
        memhook::status().iter().filter(|s| s.installed).count()
    );
    0
}

/// The CUDA part: device, managed and pinned memory through cudarc.
fn cuda() -> usize {
    use cudarc::driver::{CudaContext, DevicePtr};
    println!("\nCUDA:");
    // SAFETY: only probes for the library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        println!("  no libcuda on this machine: the CUDA part is skipped");
        return 0;
    }
    let ctx = match CudaContext::new(0) {
        Ok(c) => c,
        Err(e) => {
            println!("  no usable GPU ({e:?}): the CUDA part is skipped");
            return 0;
        }
    };
    // cudarc loaded libcuda from inside this program: have memhook look.
    memhook::refresh();
    let stream = ctx.default_stream();
    let mut shown = 0;
    let from = NEXT.load(Ordering::Acquire);
    if let Ok(buf) = stream.alloc_zeros::<u8>(16 << 20) {
        let (p, sync) = buf.device_ptr(&stream);
        let p = p as usize;
        drop(sync);
        println!("  device 16 MiB at {p:#x}: memtype says {}", describe(p));
        drop(buf);
        let _ = stream.synchronize();
        shown += show(from, p, p + (16 << 20));
    }
    let from = NEXT.load(Ordering::Acquire);
    // SAFETY: u8 is valid for any bit pattern.
    if let Ok(managed) = unsafe { ctx.alloc_unified::<u8>(4 << 20, true) } {
        let (p, sync) = managed.device_ptr(&stream);
        let p = p as usize;
        drop(sync);
        println!("  managed 4 MiB at {p:#x}: memtype says {}", describe(p));
        drop(managed);
        shown += show(from, p, p + (4 << 20));
    }
    let from = NEXT.load(Ordering::Acquire);
    // SAFETY: the pinned memory is not read before it is written.
    if let Ok(mut pinned) = unsafe { ctx.alloc_pinned::<u8>(2 << 20) } {
        let p = pinned.as_mut_ptr().map_or(0, |p| p as usize);
        println!("  pinned 2 MiB at {p:#x}: memtype says {}", describe(p));
        drop(pinned);
        shown += show(from, p, p + (2 << 20));
    }
    shown
}

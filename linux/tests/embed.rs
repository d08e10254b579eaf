//! Embedding memhook the way an allocator does: this test binary's global
//! allocator serves every allocation with its own mmap/munmap and installs
//! memhook (bistro) from inside its first allocation, which may be memhook's
//! own load-time warm-up of the decoder tables: no recursion, no deadlock,
//! the hooks end up installed and report the allocator's own mappings. A
//! full reinstall made later from inside an allocation must not allocate.
//! Blocks of a megabyte and more are mapped and unmapped by `syscall`, as
//! tcmalloc's own `mmap` and `munmap` do: reported all the same, with no
//! allocation on the way.
#![cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

struct MmapAllocator;

static STARTED: AtomicBool = AtomicBool::new(false);
static READY: AtomicBool = AtomicBool::new(false);
thread_local! {
    // Per thread: only the installing thread's (or the handler's thread's)
    // allocations are memhook's. The test harness's main thread allocates
    // for its own bookkeeping while the test thread starts, and a process-wide
    // flag counted those (seen under qemu, where the threads interleave).
    // Const-initialised with no destructor: reading it never allocates.
    static INSIDE_INSTALL: Cell<bool> = const { Cell::new(false) };
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    static IN_SYSCALL: Cell<bool> = const { Cell::new(false) };
}
/// Allocations made while the allocator's `syscall` ran, memhook's hook
/// of it included (must stay 0).
static ALLOCS_IN_SYSCALL: AtomicUsize = AtomicUsize::new(0);
/// The test's big block, and where a mapping of its size was reported.
const BIG: usize = 3 << 20;
static BIG_MAPPED_AT: AtomicUsize = AtomicUsize::new(0);
/// Blocks this large and larger are mapped and unmapped by `syscall`.
const BY_SYSCALL: usize = 1 << 20;

/// `syscall(n, args..)`, allocations meanwhile counted.
fn counted_syscall(n: libc::c_long, args: [libc::c_long; 6]) -> libc::c_long {
    IN_SYSCALL.set(true);
    // SAFETY: the callers pass what the system call expects.
    let r = unsafe { libc::syscall(n, args[0], args[1], args[2], args[3], args[4], args[5]) };
    IN_SYSCALL.set(false);
    r
}
/// Set by the test: the next allocation reinstalls memhook.
static REINSTALL: AtomicBool = AtomicBool::new(false);
/// Allocations made while memhook was installing (must stay 0).
static ALLOCS_DURING_INSTALL: AtomicUsize = AtomicUsize::new(0);
/// The largest mapping reported to the handler, and unmaps reported.
static LARGEST_MAPPED: AtomicUsize = AtomicUsize::new(0);
static UNMAPPED: AtomicUsize = AtomicUsize::new(0);
/// Allocations while the handler ran (must stay 0).
static ALLOCS_IN_HANDLER: AtomicUsize = AtomicUsize::new(0);

fn handler(e: &mut Event) {
    IN_HANDLER.set(true);
    match *e {
        Event::VmMapped(v) => {
            LARGEST_MAPPED.fetch_max(v.size, Ordering::SeqCst);
            if v.size == BIG {
                BIG_MAPPED_AT.store(v.address, Ordering::SeqCst);
            }
        }
        Event::VmUnmapped(_) => {
            UNMAPPED.fetch_add(1, Ordering::SeqCst);
        }
        _ => {}
    }
    IN_HANDLER.set(false);
}

fn page_round(n: usize) -> usize {
    n.max(1).next_multiple_of(4096)
}

// SAFETY: every block is its own private anonymous mapping, page aligned
// (alignments above a page are refused with null).
unsafe impl GlobalAlloc for MmapAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if INSIDE_INSTALL.get() {
            ALLOCS_DURING_INSTALL.fetch_add(1, Ordering::SeqCst);
        }
        if IN_HANDLER.get() {
            ALLOCS_IN_HANDLER.fetch_add(1, Ordering::SeqCst);
        }
        if IN_SYSCALL.get() {
            ALLOCS_IN_SYSCALL.fetch_add(1, Ordering::SeqCst);
        }
        if !STARTED.swap(true, Ordering::SeqCst) {
            // The first allocation of the process: install from here.
            INSIDE_INSTALL.set(true);
            let config = Config {
                hooks: HookConfig {
                    mmap: ModeSet::of(&[HookMode::Bistro]),
                    cuda: ModeSet::NONE,
                },
            };
            memhook::install(&config);
            memhook::set_handler(bits::VM_MAPPED | bits::VM_UNMAPPED, 0, HandlerFn::Rust(&handler)).unwrap();
            INSIDE_INSTALL.set(false);
            READY.store(true, Ordering::SeqCst);
        }
        if REINSTALL.swap(false, Ordering::SeqCst) {
            INSIDE_INSTALL.set(true);
            let reloc = Config {
                hooks: HookConfig {
                    mmap: ModeSet::of(&[HookMode::Reloc]),
                    cuda: ModeSet::NONE,
                },
            };
            memhook::install(&reloc);
            let bistro = Config {
                hooks: HookConfig {
                    mmap: ModeSet::of(&[HookMode::Bistro]),
                    cuda: ModeSet::NONE,
                },
            };
            memhook::install(&bistro);
            INSIDE_INSTALL.set(false);
        }
        if layout.align() > 4096 {
            return std::ptr::null_mut();
        }
        if layout.size() >= BY_SYSCALL {
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
            let size = page_round(layout.size()) as libc::c_long;
            let p = counted_syscall(libc::SYS_mmap, [0, size, 3, flags.into(), -1, 0]);
            return if p == -1 { std::ptr::null_mut() } else { p as *mut u8 };
        }
        // SAFETY: an anonymous private mapping of the rounded size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page_round(layout.size()),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p.cast()
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let size = page_round(layout.size());
        if layout.size() >= BY_SYSCALL {
            // (`ptr` is a block this allocator mapped with this size.)
            counted_syscall(
                libc::SYS_munmap,
                [ptr as libc::c_long, size as libc::c_long, 0, 0, 0, 0],
            );
            return;
        }
        // SAFETY: `ptr` is a block this allocator mapped with this size.
        unsafe { libc::munmap(ptr.cast(), size) };
    }
}

#[global_allocator]
static ALLOCATOR: MmapAllocator = MmapAllocator;

#[test]
fn an_allocator_installs_memhook_from_its_first_allocation() {
    assert!(memhook::prepared(), "the decoder tables were built at load");
    assert!(READY.load(Ordering::SeqCst), "installed during the first allocation");
    // (Pending: a function whose library is not loaded yet, hooked as it
    // loads: shm_open, in librt before glibc 2.34.)
    assert!(
        memhook::status().iter().all(|s| s.installed || s.pending),
        "{:?}",
        memhook::status()
    );

    // A full reinstall (another mode, then back) from inside an allocation:
    // counted allocations must stay zero.
    REINSTALL.store(true, Ordering::SeqCst);
    let v = vec![1u8; 10];
    assert!(!REINSTALL.load(Ordering::SeqCst), "the reinstall ran");
    assert_eq!(
        ALLOCS_DURING_INSTALL.load(Ordering::SeqCst),
        0,
        "memhook allocated while reinstalling"
    );
    // (Pending: shm_open, in librt before glibc 2.34, as above.)
    assert!(
        memhook::status()
            .iter()
            .all(|s| (s.installed || s.pending) && s.mode == HookMode::Bistro)
    );
    drop(v);

    let before = UNMAPPED.load(Ordering::SeqCst);
    let big = vec![7u8; BIG];
    assert!(LARGEST_MAPPED.load(Ordering::SeqCst) >= BIG);
    assert_eq!(
        BIG_MAPPED_AT.load(Ordering::SeqCst),
        big.as_ptr() as usize,
        "the allocator's own mmap by syscall was reported"
    );
    drop(big);
    assert!(UNMAPPED.load(Ordering::SeqCst) > before, "and its munmap by syscall");
    assert_eq!(ALLOCS_IN_HANDLER.load(Ordering::SeqCst), 0);
    assert_eq!(
        ALLOCS_IN_SYSCALL.load(Ordering::SeqCst),
        0,
        "memhook allocated in its syscall hook"
    );
}

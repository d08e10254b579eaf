//! Host memory events in bistro and reloc modes. The calls come from a
//! helper shared library built for the test (`cc`), as an application's
//! libraries make them; in reloc mode the test executable itself (which
//! contains memhook) is skipped like memhook's own object.
#![cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use memhook::config::{HookConfig, HookMode, ModeSet};
use memhook::event::{Event, bits};
use memhook::{Config, HandlerFn};

#[path = "../../tests/src/cc.rs"]
mod cc;
mod common;
use common::{build_library, load_and_call, wait_for_child};

const HELPER: &str = r#"
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/uio.h>
#include <unistd.h>
/* glibc 2.36 and later: absent from an older one (then -2). */
extern ssize_t process_madvise(int, const struct iovec *, size_t, int, unsigned int) __attribute__((weak));
long mhh_process_madvise(int pidfd, const struct iovec *iov, size_t n, int advice, unsigned flags) {
    return process_madvise ? process_madvise(pidfd, iov, n, advice, flags) : -2;
}
void *mhh_mmap(size_t len) { return mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); }
int mhh_munmap(void *p, size_t len) { return munmap(p, len); }
/* The new address, read by the kernel without MREMAP_FIXED too where the
   mapping is hugetlb (it must be huge-page aligned), is passed as 0:
   glibc 2.31 forwards the variadic argument as the register holds it
   (2.36 passes 0 without MREMAP_FIXED or MREMAP_DONTUNMAP), and a stale
   value made the shrink of a hugetlb mapping fail with EINVAL, hooked or
   not. */
void *mhh_mremap(void *p, size_t o, size_t n) { return mremap(p, o, n, MREMAP_MAYMOVE, (void *)0); }
int mhh_madvise(void *p, size_t len, int advice) { return madvise(p, len, advice); }
void *mhh_shmat(int id) { return shmat(id, NULL, 0); }
int mhh_shmdt(void *p) { return shmdt(p); }
void *mhh_sbrk(long increment) { return sbrk(increment); }
int mhh_brk(void *p) { return brk(p); }
void *mhh_mmap_at(void *p, size_t len, int flags) { return mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0); }
void *mhh_mremap_to(void *p, size_t o, size_t n, void *to) { return mremap(p, o, n, MREMAP_MAYMOVE | MREMAP_FIXED, to); }
void *mhh_mremap_flags(void *p, size_t o, size_t n, int flags) { return mremap(p, o, n, flags, (void *)0); }
void *mhh_shmat_at(int id, void *at, int flags) { return shmat(id, at, flags); }
void *mhh_malloc(size_t n) { return malloc(n); }
void mhh_free(void *p) { free(p); }
#include <fcntl.h>
int mhh_fallocate(int fd, int mode, long off, long len) { return fallocate(fd, mode, off, len); }
int mhh_ftruncate(int fd, long len) { return ftruncate(fd, len); }
int mhh_ftruncate64(int fd, long len) { return ftruncate64(fd, len); }
int mhh_truncate(const char *path, long len) { return truncate(path, len); }
void *mhh_mmap_file(void *at, size_t len, int flags, int fd, long off) { return mmap(at, len, PROT_READ | PROT_WRITE, flags, fd, off); }
int mhh_remap_file_pages(void *p, size_t size, int prot, size_t pgoff, int flags) { return remap_file_pages(p, size, prot, pgoff, flags); }
#include <stdio.h>
int mhh_open(const char *path, int flags) { return open(path, flags, 0600); }
int mhh_open64(const char *path, int flags) { return open64(path, flags, 0600); }
int mhh_openat(int dirfd, const char *path, int flags) { return openat(dirfd, path, flags, 0600); }
int mhh_fopen_w(const char *path) { FILE *f = fopen(path, "w"); return f ? fclose(f) : -1; }
int mhh_fopen_mode(const char *path, const char *mode) { FILE *f = fopen(path, mode); return f ? fclose(f) : -1; }
/* A stream that reads its file through a mapping glibc makes (mode "m"), after its first read. */
void *mhh_fopen_mapped(const char *path) { FILE *f = fopen(path, "rm"); if (f) (void)fgetc(f); return f; }
int mhh_fclose(void *f) { return fclose(f); }
int mhh_creat(const char *path) { int fd = creat(path, 0600); return fd < 0 ? -1 : close(fd); }
/* The file opened to read, then again to write: by its path, or (null_path) by the stream's own. */
int mhh_freopen_w(const char *path, int null_path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    FILE *g = freopen(null_path ? NULL : path, "w", f);
    return g ? fclose(g) : -1;
}
int mhh_shm_open(const char *name, int flags) { return shm_open(name, flags, 0600); }
long mhh_syscall(long n, long a, long b, long c, long d, long e, long f) { return syscall(n, a, b, c, d, e, f); }
#include <sys/ioctl.h>
int mhh_ioctl(int fd, unsigned long request, void *arg) { return ioctl(fd, request, arg); }
#include <dlfcn.h>
void *mhh_dlopen(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }
int mhh_dlclose(void *handle) { return dlclose(handle); }
void *mhh_dlsym(void *handle, const char *name) { return dlsym(handle, name); }
"#;

struct Helper {
    mmap: unsafe extern "C" fn(usize) -> usize,
    munmap: unsafe extern "C" fn(usize, usize) -> i32,
    mremap: unsafe extern "C" fn(usize, usize, usize) -> usize,
    madvise: unsafe extern "C" fn(usize, usize, i32) -> i32,
    process_madvise: unsafe extern "C" fn(i32, *const libc::iovec, usize, i32, u32) -> isize,
    shmat: unsafe extern "C" fn(i32) -> usize,
    shmdt: unsafe extern "C" fn(usize) -> i32,
    sbrk: unsafe extern "C" fn(isize) -> usize,
    brk: unsafe extern "C" fn(usize) -> i32,
    mmap_at: unsafe extern "C" fn(usize, usize, i32) -> usize,
    mremap_to: unsafe extern "C" fn(usize, usize, usize, usize) -> usize,
    mremap_flags: unsafe extern "C" fn(usize, usize, usize, i32) -> usize,
    shmat_at: unsafe extern "C" fn(i32, usize, i32) -> usize,
    malloc: unsafe extern "C" fn(usize) -> usize,
    free: unsafe extern "C" fn(usize),
    fallocate: unsafe extern "C" fn(i32, i32, i64, i64) -> i32,
    ftruncate: unsafe extern "C" fn(i32, i64) -> i32,
    ftruncate64: unsafe extern "C" fn(i32, i64) -> i32,
    truncate: unsafe extern "C" fn(*const libc::c_char, i64) -> i32,
    mmap_file: unsafe extern "C" fn(usize, usize, i32, i32, i64) -> usize,
    remap_file_pages: unsafe extern "C" fn(usize, usize, i32, usize, i32) -> i32,
    open: unsafe extern "C" fn(*const libc::c_char, i32) -> i32,
    open64: unsafe extern "C" fn(*const libc::c_char, i32) -> i32,
    openat: unsafe extern "C" fn(i32, *const libc::c_char, i32) -> i32,
    fopen_w: unsafe extern "C" fn(*const libc::c_char) -> i32,
    fopen_mode: unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> i32,
    creat: unsafe extern "C" fn(*const libc::c_char) -> i32,
    fopen_mapped: unsafe extern "C" fn(*const libc::c_char) -> usize,
    fclose: unsafe extern "C" fn(usize) -> i32,
    freopen_w: unsafe extern "C" fn(*const libc::c_char, i32) -> i32,
    shm_open: unsafe extern "C" fn(*const libc::c_char, i32) -> i32,
    syscall: unsafe extern "C" fn(
        libc::c_long,
        libc::c_long,
        libc::c_long,
        libc::c_long,
        libc::c_long,
        libc::c_long,
        libc::c_long,
    ) -> libc::c_long,
    ioctl: unsafe extern "C" fn(i32, libc::c_ulong, usize) -> i32,
    dlopen: unsafe extern "C" fn(*const libc::c_char) -> usize,
    dlclose: unsafe extern "C" fn(usize) -> i32,
    dlsym: unsafe extern "C" fn(usize, *const libc::c_char) -> usize,
}

/// A function pointer from an address.
///
/// # Safety
///
/// `p` must be a function of type `T` (a pointer-sized function pointer).
unsafe fn cast<T>(p: usize) -> T {
    assert_eq!(size_of::<T>(), size_of::<usize>());
    // SAFETY: the caller's contract.
    unsafe { std::mem::transmute_copy(&p) }
}

fn helper() -> &'static Helper {
    static H: OnceLock<Helper> = OnceLock::new();
    H.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("memhook-host-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = build_library(&dir, "mhh", HELPER, &["-ldl"]);
        let path = CString::new(out.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path to the library just built.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!h.is_null());
        let _ = std::fs::remove_dir_all(&dir);
        let sym = |name: &std::ffi::CStr| {
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
            assert_ne!(p, 0, "{name:?}");
            p
        };
        // SAFETY: each symbol is the helper function of the stated
        // signature; the library is never closed.
        unsafe {
            Helper {
                mmap: cast(sym(c"mhh_mmap")),
                munmap: cast(sym(c"mhh_munmap")),
                mremap: cast(sym(c"mhh_mremap")),
                madvise: cast(sym(c"mhh_madvise")),
                process_madvise: cast(sym(c"mhh_process_madvise")),
                shmat: cast(sym(c"mhh_shmat")),
                shmdt: cast(sym(c"mhh_shmdt")),
                sbrk: cast(sym(c"mhh_sbrk")),
                brk: cast(sym(c"mhh_brk")),
                mmap_at: cast(sym(c"mhh_mmap_at")),
                mremap_to: cast(sym(c"mhh_mremap_to")),
                mremap_flags: cast(sym(c"mhh_mremap_flags")),
                shmat_at: cast(sym(c"mhh_shmat_at")),
                malloc: cast(sym(c"mhh_malloc")),
                free: cast(sym(c"mhh_free")),
                fallocate: cast(sym(c"mhh_fallocate")),
                ftruncate: cast(sym(c"mhh_ftruncate")),
                ftruncate64: cast(sym(c"mhh_ftruncate64")),
                truncate: cast(sym(c"mhh_truncate")),
                mmap_file: cast(sym(c"mhh_mmap_file")),
                remap_file_pages: cast(sym(c"mhh_remap_file_pages")),
                open: cast(sym(c"mhh_open")),
                open64: cast(sym(c"mhh_open64")),
                openat: cast(sym(c"mhh_openat")),
                fopen_w: cast(sym(c"mhh_fopen_w")),
                fopen_mode: cast(sym(c"mhh_fopen_mode")),
                creat: cast(sym(c"mhh_creat")),
                fopen_mapped: cast(sym(c"mhh_fopen_mapped")),
                fclose: cast(sym(c"mhh_fclose")),
                freopen_w: cast(sym(c"mhh_freopen_w")),
                shm_open: cast(sym(c"mhh_shm_open")),
                syscall: cast(sym(c"mhh_syscall")),
                ioctl: cast(sym(c"mhh_ioctl")),
                dlopen: cast(sym(c"mhh_dlopen")),
                dlclose: cast(sym(c"mhh_dlclose")),
                dlsym: cast(sym(c"mhh_dlsym")),
            }
        }
    })
}

/// One recorded event: kind, address, size, result.
type Rec = (u32, usize, usize, isize);

const LOG: usize = 1 << 14;
static LOG_KIND: [AtomicU32; LOG] = [const { AtomicU32::new(0) }; LOG];
static LOG_ADDR: [AtomicUsize; LOG] = [const { AtomicUsize::new(0) }; LOG];
static LOG_SIZE: [AtomicUsize; LOG] = [const { AtomicUsize::new(0) }; LOG];
static LOG_RESULT: [AtomicUsize; LOG] = [const { AtomicUsize::new(0) }; LOG];
static LOG_N: AtomicUsize = AtomicUsize::new(0);
static RECORDING: AtomicBool = AtomicBool::new(false);
/// The thread whose events are recorded: the test harness's other threads
/// (starting, mapping their signal stacks) may map into the very range a
/// step looks at.
static RECORDER: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD_MARK: u8 = const { 0 };
}

/// An id of the calling thread (the address of its thread-local marker).
fn thread_id() -> usize {
    THREAD_MARK.with(|m| m as *const u8 as usize)
}

/// What `record` leaves in errno: the hooks must not let it through.
const HANDLER_ERRNO: i32 = 0x5eed;

/// Records every event of the recording thread while RECORDING (no
/// allocation: fixed arrays), and sets errno, as a careless handler may.
fn record(e: &mut Event) {
    if !RECORDING.load(Ordering::Acquire) || RECORDER.load(Ordering::Acquire) != thread_id() {
        return;
    }
    set_errno(HANDLER_ERRNO);
    let (addr, size) = match *e {
        Event::Mmap(m) => (m.address, m.size),
        Event::Munmap(m) => (m.address, m.size),
        Event::Mremap(m) => (m.address, m.new_size),
        Event::Shmat(m) => (m.shmaddr, m.shmid as usize),
        Event::Shmdt(m) => (m.shmaddr, 0),
        Event::Sbrk(m) => (0, m.increment as usize),
        Event::Brk(m) => (m.addr, 0),
        Event::Madvise(m) => (m.addr, m.length),
        Event::VmMapped(v) | Event::VmUnmapped(v) => (v.address, v.size),
        Event::MemTypeAlloc(m) | Event::MemTypeFree(m) => (m.address, m.size),
    };
    let i = LOG_N.fetch_add(1, Ordering::AcqRel);
    if i < LOG {
        LOG_KIND[i].store(e.kind(), Ordering::Relaxed);
        LOG_ADDR[i].store(addr, Ordering::Relaxed);
        LOG_SIZE[i].store(size, Ordering::Relaxed);
        LOG_RESULT[i].store(e.result().unwrap_or(0) as usize, Ordering::Relaxed);
    }
}

/// Runs `f` with recording on; returns what was recorded.
fn recorded(f: impl FnOnce()) -> Vec<Rec> {
    LOG_N.store(0, Ordering::SeqCst);
    RECORDER.store(thread_id(), Ordering::SeqCst);
    RECORDING.store(true, Ordering::SeqCst);
    f();
    RECORDING.store(false, Ordering::SeqCst);
    let n = LOG_N.load(Ordering::SeqCst).min(LOG);
    (0..n)
        .map(|i| {
            (
                LOG_KIND[i].load(Ordering::Relaxed),
                LOG_ADDR[i].load(Ordering::Relaxed),
                LOG_SIZE[i].load(Ordering::Relaxed),
                LOG_RESULT[i].load(Ordering::Relaxed) as isize,
            )
        })
        .collect()
}

/// Whether a record is about `[addr, addr + len]` (its address or its
/// result there). In bistro mode every mapping of the process is seen, the
/// test harness's own too: each step looks only at its own range.
fn near(r: &Rec, addr: usize, len: usize) -> bool {
    (addr..=addr + len).contains(&r.1) || (addr..=addr + len).contains(&(r.3 as usize))
}

/// The records about `[addr, addr + len]`.
fn about(log: &[Rec], addr: usize, len: usize) -> Vec<Rec> {
    log.iter().copied().filter(|r| near(r, addr, len)).collect()
}

static SERIAL: Mutex<()> = Mutex::new(());

/// How many host functions memhook hooks here: nineteen, or eighteen with
/// a glibc older than 2.36 (no `process_madvise`, so nothing to hook).
fn host_functions() -> usize {
    // SAFETY: a NUL-terminated name and the pseudo-handle RTLD_DEFAULT.
    let present = !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"process_madvise".as_ptr()) }.is_null();
    18 + usize::from(present)
}

/// The entries of `status` for the main namespace's libc, one a host
/// function: without libpthread's copies of some (glibc before 2.34
/// keeps `open` there too, which bistro patches beside libc's), listed
/// after them.
fn libc_entries(status: &[memhook::FunctionStatus]) -> usize {
    status.iter().filter(|s| s.library != "libpthread.so.0").count()
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn iovec(base: usize, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: base as *mut libc::c_void,
        iov_len: len,
    }
}

/// Maps `pages` pages of `fd` from page `first` (`shared` or private).
fn map_file(fd: i32, pages: usize, first: usize, shared: bool) -> usize {
    let page = page_size();
    let flags = if shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
    // SAFETY: a new mapping of the file; unmapped by the caller.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            pages * page,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            (first * page) as libc::off_t,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

/// fallocate, ftruncate and truncate take pages from every mapping of a
/// file with no call on the mappings (a punched hole reads zeros, pages
/// past a shrunk end are gone): `VM_UNMAPPED` of each mapped range of
/// the file they discard, in whole pages, before the call, for shared
/// and private mappings alike; nothing for a call that discards
/// nothing (allocation, growth), a file not mapped, or a bad descriptor.
fn check_file_discards(h: &Helper, events: u32) {
    let page = page_size();
    let p = |n: usize| (n * page) as i64;
    let vm = |ranges: &[(usize, usize)]| -> Vec<Rec> {
        let mut want: Vec<Rec> = ranges
            .iter()
            .filter(|_| events & bits::VM_UNMAPPED != 0)
            .map(|&(a, n)| (bits::VM_UNMAPPED, a, n, 0))
            .collect();
        want.sort_by_key(|r| r.1);
        want
    };
    // SAFETY: a new memfd, closed below.
    let fd = unsafe { libc::memfd_create(c"memhook-host".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: the helpers wrap the libc calls; each gets what it expects
    // (a bad descriptor or path is the kernel's to refuse).
    unsafe {
        let log = recorded(|| assert_eq!((h.ftruncate)(fd, p(16)), 0));
        assert_eq!(log, [], "growing discards nothing");
        let shared = map_file(fd, 16, 0, true);
        let private = map_file(fd, 16, 0, false);
        let tail = map_file(fd, 8, 8, true);
        std::ptr::write_bytes(shared as *mut u8, 0x5a, 16 * page);

        // A hole from inside page 2 to inside page 4: whole pages 2 to 4
        // of the mappings that map them (not `tail`, from page 8 on).
        let mut result = -1;
        let log = recorded(|| {
            set_errno(77);
            result = (h.fallocate)(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                p(2) + 100,
                p(3) - 200,
            );
            assert_eq!(errno(), 77, "errno survives the handlers before fallocate");
        });
        assert_eq!(result, 0);
        assert_eq!(
            log,
            vm(&[(shared + 2 * page, 3 * page), (private + 2 * page, 3 * page)])
        );
        assert_eq!(*((shared + 3 * page) as *const u8), 0, "the hole reads zeros");
        assert_eq!(*((shared + 6 * page) as *const u8), 0x5a);
        // Allocation discards nothing.
        let log = recorded(|| assert_eq!((h.fallocate)(fd, libc::FALLOC_FL_KEEP_SIZE, 0, p(16)), 0));
        assert_eq!(log, []);

        // MADV_REMOVE of pages 7 and 8 of `shared` punches the same hole
        // in the file: the other mappings of those pages lose them too
        // (page 7 and 8 of `private`, page 0 of `tail`), reported before
        // the call; the range itself once, by the call's own dispatch.
        std::ptr::write_bytes(shared as *mut u8, 0x5a, 16 * page);
        let log = recorded(|| {
            set_errno(77);
            assert_eq!((h.madvise)(shared + 7 * page, 2 * page - 100, libc::MADV_REMOVE), 0);
            assert_eq!(errno(), 77, "errno survives the handlers around madvise");
        });
        let mut unmaps = only(bits::VM_UNMAPPED, log.iter().copied());
        unmaps.sort_by_key(|r| r.1);
        assert_eq!(
            unmaps,
            vm(&[
                (private + 7 * page, 2 * page),
                (tail, page),
                (shared + 7 * page, 2 * page)
            ]),
        );
        if std::env::var_os("MEMHOOK_TEST_QEMU").is_none() {
            // (qemu-user answers MADV_REMOVE without passing it on.)
            assert_eq!(
                *((private + 8 * page) as *const u8),
                0,
                "the private view lost the page"
            );
        }
        assert_eq!(*((tail + page) as *const u8), 0x5a, "past the hole: kept");
        // Not every advice on a shared mapping reaches the file: DONTNEED
        // drops this view's pages alone.
        let log = recorded(|| assert_eq!((h.madvise)(shared + 9 * page, page, libc::MADV_DONTNEED), 0));
        let unmaps = only(bits::VM_UNMAPPED, log.iter().copied());
        assert_eq!(unmaps, vm(&[(shared + 9 * page, page)]));
        assert_eq!(*((tail + page) as *const u8), 0x5a, "the file kept page 9");
        // The same advice through process_madvise (glibc 2.36; the
        // kernel takes it for the caller itself from 6.13, and refuses it
        // before: reported all the same), page 10.
        let pidfd = libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) as i32;
        assert!(pidfd >= 0, "pidfd_open: {}", errno());
        let iov = [iovec(shared + 10 * page, page)];
        let mut result = 0;
        let log = recorded(|| result = (h.process_madvise)(pidfd, iov.as_ptr(), 1, libc::MADV_REMOVE, 0));
        libc::close(pidfd);
        if result != -2 {
            let mut unmaps = only(bits::VM_UNMAPPED, log.iter().copied());
            unmaps.sort_by_key(|r| r.1);
            assert_eq!(
                unmaps,
                vm(&[
                    (private + 10 * page, page),
                    (tail + 2 * page, page),
                    (shared + 10 * page, page)
                ]),
                "process_madvise: {result}"
            );
        }

        // A shrink to inside page 12, through glibc's other name
        // (reloc rewrites its slots too): pages 13 on, of each mapping.
        let log = recorded(|| assert_eq!((h.ftruncate64)(fd, p(12) + 100), 0));
        assert_eq!(
            log,
            vm(&[
                (shared + 13 * page, 3 * page),
                (private + 13 * page, 3 * page),
                (tail + 5 * page, 3 * page)
            ])
        );
        // A shrink to inside page 10: pages 11 on, of each mapping.
        let log = recorded(|| assert_eq!((h.ftruncate)(fd, p(10) + 100), 0));
        assert_eq!(
            log,
            vm(&[
                (shared + 11 * page, 5 * page),
                (private + 11 * page, 5 * page),
                (tail + 3 * page, 5 * page)
            ])
        );
        // Not a file, or no file: nothing, and the call's own error.
        let log = recorded(|| {
            assert_eq!((h.ftruncate)(-1, 0), -1);
            assert_eq!(errno(), libc::EBADF);
            assert_eq!(
                (h.fallocate)(-1, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, p(1)),
                -1
            );
            assert_eq!(errno(), libc::EBADF);
            assert_eq!((h.truncate)(std::ptr::null(), 0), -1);
            assert_eq!(errno(), libc::EFAULT);
        });
        assert_eq!(log, []);
        for (m, n) in [(shared, 16), (private, 16), (tail, 8)] {
            libc::munmap(m as *mut libc::c_void, n * page);
        }
        libc::close(fd);

        // truncate by path: a file mapped privately (its pages not yet
        // copied are the file's), cut to one page.
        let path = std::env::temp_dir().join(format!("memhook-truncate-{}", std::process::id()));
        let c_path = CString::new(path.to_str().unwrap()).unwrap();
        std::fs::write(&path, vec![1u8; 4 * page]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let m = map_file(std::os::fd::AsRawFd::as_raw_fd(&file), 4, 0, false);
        let log = recorded(|| assert_eq!((h.truncate)(c_path.as_ptr(), p(1)), 0));
        assert_eq!(log, vm(&[(m + page, 3 * page)]));
        libc::munmap(m as *mut libc::c_void, 4 * page);
        let _ = std::fs::remove_file(&path);
    }
}

/// Under qemu-user, whose `/proc/self/maps` lists no `[heap]`: memhook
/// cannot tell where the heap starts, and reports a shrink below it too.
fn qemu_lists_no_heap() -> bool {
    std::env::var_os("MEMHOOK_TEST_QEMU").is_some()
        && !std::fs::read_to_string("/proc/self/maps").unwrap().contains("[heap]")
}

/// Whether the program defines `name` before the C library does: built
/// with AddressSanitizer (`scripts/asan.sh`), whose allocator serves
/// `malloc` and whose `dlopen` interceptor makes every `dlopen` the
/// program's own (a library's RUNPATH is then not searched, without
/// memhook too), or beside another interposer.
fn interposed(name: &std::ffi::CStr) -> bool {
    // SAFETY: a NUL-terminated name and the pseudo-handle RTLD_DEFAULT.
    let first = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    first != libc_function(name)
}

/// `syscall(n, ..)` with up to six arguments, through the helper (a
/// caller of libc's `syscall` that reloc's slots lead to the hook too).
fn sys(h: &Helper, n: libc::c_long, args: &[libc::c_long]) -> libc::c_long {
    let mut w = [0; 6];
    w[..args.len()].copy_from_slice(args);
    // SAFETY: the callers pass what each system call expects of its
    // arguments (memory of their own, or what the kernel refuses).
    unsafe { (h.syscall)(n, w[0], w[1], w[2], w[3], w[4], w[5]) }
}

/// A system call that changes the mappings, made by libc's `syscall`
/// (as a library that means to pass other hooks by does; `openat2` has
/// no other way in): the events of the function that makes it, each
/// once, with the kernel's result and errno. Other calls pass through
/// with their results and errno, and no event.
fn check_syscall(h: &Helper, events: u32) {
    let page = page_size();
    let l = |x: usize| x as libc::c_long;
    // Other calls: the result, and errno where it fails.
    let log = recorded(|| {
        assert_eq!(sys(h, libc::SYS_getpid, &[]), std::process::id() as libc::c_long);
        set_errno(0);
        assert_eq!(sys(h, libc::SYS_close, &[-1]), -1);
        assert_eq!(errno(), libc::EBADF);
    });
    assert_eq!(log, [], "no event for another call");

    // mmap, mremap (a shrink), madvise, munmap.
    let mut p = 0;
    let log = recorded(|| {
        set_errno(77);
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        p = sys(h, libc::SYS_mmap, &[0, l(2 * K64), 3, flags.into(), -1, 0]) as usize;
        assert_eq!(errno(), 77, "errno survives the handlers of syscall(SYS_mmap)");
    });
    assert_ne!(p as isize, -1, "mmap errno {}", errno());
    assert_eq!(
        about(&log, p, 2 * K64),
        only(
            events,
            [(bits::MMAP, 0, 2 * K64, p as isize), (bits::VM_MAPPED, p, 2 * K64, 0)]
        )
    );
    let log = recorded(|| {
        assert_eq!(
            sys(h, libc::SYS_mremap, &[l(p), l(2 * K64), l(K64), 0, 0]),
            p as libc::c_long
        );
        assert_eq!(
            sys(h, libc::SYS_madvise, &[l(p), l(page), libc::MADV_DONTNEED.into()]),
            0
        );
    });
    assert_eq!(
        about(&log, p, 2 * K64),
        only(
            events,
            [
                (bits::VM_UNMAPPED, p + K64, K64, 0),
                (bits::MREMAP, p, K64, p as isize),
                (bits::VM_UNMAPPED, p, page, 0),
                (bits::MADVISE, p, page, 0)
            ]
        )
    );
    // Refused before the kernel looks at the mappings: its own event
    // alone, -1 and the kernel's errno.
    let log = recorded(|| {
        assert_eq!(sys(h, libc::SYS_munmap, &[l(p + 1), l(page)]), -1);
        assert_eq!(errno(), libc::EINVAL);
    });
    assert_eq!(about(&log, p, K64), only(events, [(bits::MUNMAP, p + 1, page, -1)]));
    let log = recorded(|| assert_eq!(sys(h, libc::SYS_munmap, &[l(p), l(K64)]), 0));
    assert_eq!(
        about(&log, p, K64),
        only(events, [(bits::VM_UNMAPPED, p, K64, 0), (bits::MUNMAP, p, K64, 0)])
    );

    // brk by the system call: the kernel's break moved and back, events
    // as for glibc's brk; its answer the break after; below the heap,
    // refused (the break as it was), nothing unmapped; brk(0) only asks.
    let top = sys(h, libc::SYS_brk, &[0]) as usize;
    let log = recorded(|| assert_eq!(sys(h, libc::SYS_brk, &[l(top + K64)]), l(top + K64)));
    assert_eq!(
        about(&log, top, K64),
        only(events, [(bits::BRK, top + K64, 0, 0), (bits::VM_MAPPED, top, K64, 0)])
    );
    let log = recorded(|| assert_eq!(sys(h, libc::SYS_brk, &[l(top)]), l(top)));
    assert_eq!(
        about(&log, top, K64),
        only(events, [(bits::VM_UNMAPPED, top, K64, 0), (bits::BRK, top, 0, 0)])
    );
    let log = recorded(|| {
        assert_eq!(sys(h, libc::SYS_brk, &[1]), l(top), "refused");
        assert_eq!(sys(h, libc::SYS_brk, &[0]), l(top));
    });
    let log: Vec<Rec> = log
        .into_iter()
        .filter(|r| !qemu_lists_no_heap() || r.0 != bits::VM_UNMAPPED)
        .collect();
    assert_eq!(log, only(events, [(bits::BRK, 1, 0, -1)]), "{log:x?}");

    // A mapped file emptied by ftruncate and by openat2(O_TRUNC), whose
    // flags lie in the caller's struct open_how.
    // A file of this test's own (the four mode tests run at once).
    let dir = std::env::temp_dir().join(format!("memhook-syscall-{}-{}", std::process::id(), thread_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mapped");
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let fill = || std::fs::write(&path, vec![1u8; 2 * page]).unwrap();
    fill();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let m = map_file(fd, 2, 0, true);
    let emptied = only(events, [(bits::VM_UNMAPPED, m, 2 * page, 0)]);
    let log = recorded(|| assert_eq!(sys(h, libc::SYS_ftruncate, &[fd.into(), 0]), 0));
    assert_eq!(log, emptied, "ftruncate");
    // (A mode only with O_CREAT: openat2 refuses one otherwise.)
    let how = |flags: i32| [flags as u64, if flags & libc::O_CREAT != 0 { 0o600 } else { 0 }, 0];
    for (flags, empties) in [
        (libc::O_RDWR | libc::O_TRUNC, true),
        (libc::O_RDWR, false),
        (libc::O_RDWR | libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL, false),
    ] {
        fill();
        let how = how(flags);
        let log = recorded(|| {
            set_errno(77);
            let r = sys(
                h,
                libc::SYS_openat2,
                &[
                    libc::AT_FDCWD.into(),
                    c_path.as_ptr() as libc::c_long,
                    how.as_ptr() as libc::c_long,
                    24,
                ],
            );
            if r == -1 && errno() == libc::ENOSYS {
                return; // a kernel before 5.6
            }
            if flags & libc::O_EXCL != 0 {
                assert_eq!((r, errno()), (-1, libc::EEXIST));
            } else {
                assert!(r >= 0, "openat2 errno {}", errno());
                assert_eq!(errno(), 77, "errno survives the handlers of openat2");
                // SAFETY: the descriptor just opened.
                unsafe { libc::close(r as i32) };
            }
        });
        if empties {
            assert_eq!(log, emptied, "openat2 {flags:#x}");
        } else {
            assert_eq!(log, [], "openat2 {flags:#x} empties nothing");
        }
    }
    // A struct open_how the kernel cannot read: EFAULT, no report, no
    // crash in the hook.
    let log = recorded(|| {
        let bad = [libc::AT_FDCWD.into(), c_path.as_ptr() as libc::c_long, 8, 24];
        assert_eq!(sys(h, libc::SYS_openat2, &bad), -1);
        assert!(matches!(errno(), libc::EFAULT | libc::ENOSYS), "errno {}", errno());
    });
    assert_eq!(log, []);
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(m as *mut libc::c_void, 2 * page) };
    drop(file);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An open with `O_TRUNC` empties a regular file: every mapping of it
/// loses its pages (a shared one's read as a `SIGBUS`), with no call on
/// the mappings. `VM_UNMAPPED` of each whole mapping, before the call,
/// through `open`, `open64` (glibc's other name: reloc rewrites its slots
/// too) and `openat`, and a shared memory object's through `shm_open`
/// (whose own open inside libc no open hook sees); `fopen(path, "w")`
/// opens inside libc, which bistro's
/// patch sees and reloc does not. Nothing where the open empties nothing:
/// no `O_TRUNC`, `O_PATH`, `O_CREAT | O_EXCL` (refused: the file is
/// there), a file created by the call (errno kept across it), an empty
/// file, a directory.
fn check_open_truncate(h: &Helper, mode: HookMode, events: u32) {
    let page = page_size();
    let vm = |ranges: &[(usize, usize)]| -> Vec<Rec> {
        ranges
            .iter()
            .filter(|_| events & bits::VM_UNMAPPED != 0)
            .map(|&(a, n)| (bits::VM_UNMAPPED, a, n, 0))
            .collect()
    };
    let dir = std::env::temp_dir().join(format!("memhook-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mapped");
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let c_dir = CString::new(dir.to_str().unwrap()).unwrap();
    let fill = || std::fs::write(&path, vec![1u8; 4 * page]).unwrap();
    let size = || std::fs::metadata(&path).unwrap().len();
    fill();
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let shared = map_file(fd, 4, 0, true);
    let private = map_file(fd, 2, 1, false);
    let mut want = vm(&[(shared, 4 * page), (private, 2 * page)]);
    want.sort_by_key(|r| r.1);
    // SAFETY: the helpers wrap the libc calls, with NUL-terminated paths
    // (or none, the kernel's to refuse); each descriptor is closed.
    unsafe {
        let close = |fd: i32| {
            assert!(fd >= 0, "open: errno {}", errno());
            libc::close(fd);
        };
        let dirfd = libc::open(c_dir.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
        assert!(dirfd >= 0);
        let truncating: [(&str, &dyn Fn() -> i32); 3] = [
            ("open", &|| (h.open)(c_path.as_ptr(), libc::O_WRONLY | libc::O_TRUNC)),
            ("open64", &|| (h.open64)(c_path.as_ptr(), libc::O_RDWR | libc::O_TRUNC)),
            ("openat", &|| {
                (h.openat)(dirfd, c"mapped".as_ptr(), libc::O_RDWR | libc::O_TRUNC)
            }),
        ];
        for (name, call) in truncating {
            fill();
            let log = recorded(|| {
                set_errno(77);
                close(call());
                assert_eq!(errno(), 77, "{name}: errno survives the handlers");
            });
            assert_eq!(log, want, "{name}");
            assert_eq!(size(), 0, "{name} emptied the file");
        }

        // Opens that empty nothing.
        fill();
        let log = recorded(|| {
            close((h.open)(c_path.as_ptr(), libc::O_RDWR));
            close((h.open)(c_path.as_ptr(), libc::O_PATH | libc::O_TRUNC));
            assert_eq!(
                (h.open)(
                    c_path.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC
                ),
                -1
            );
            assert_eq!(errno(), libc::EEXIST);
            assert_eq!((h.open)(c_dir.as_ptr(), libc::O_RDWR | libc::O_TRUNC), -1);
            assert_eq!(errno(), libc::EISDIR);
            assert_eq!((h.open)(std::ptr::null(), libc::O_RDWR | libc::O_TRUNC), -1);
            assert_eq!(errno(), libc::EFAULT);
        });
        assert_eq!(log, [], "no open that empties the file");
        assert_eq!(size(), 4 * page as u64, "none emptied it");
        let created = dir.join("created");
        let c_created = CString::new(created.to_str().unwrap()).unwrap();
        let log = recorded(|| {
            set_errno(77);
            close((h.openat)(
                dirfd,
                c"created".as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
            ));
            assert_eq!(errno(), 77, "errno survives the look at a file not there yet");
            // Now there, empty: truncated again, nothing to take.
            close((h.open)(c_created.as_ptr(), libc::O_WRONLY | libc::O_TRUNC));
        });
        assert_eq!(log, []);

        // fopen(path, "w"), creat and freopen open inside libc: bistro
        // sees that open, reloc hooks the functions themselves. Each
        // empties the file once.
        let calls: [(&str, &dyn Fn() -> i32); 5] = [
            ("fopen w", &|| (h.fopen_w)(c_path.as_ptr())),
            ("fopen w+e", &|| (h.fopen_mode)(c_path.as_ptr(), c"w+e".as_ptr())),
            ("creat", &|| (h.creat)(c_path.as_ptr())),
            ("freopen path w", &|| (h.freopen_w)(c_path.as_ptr(), 0)),
            ("freopen NULL w", &|| (h.freopen_w)(c_path.as_ptr(), 1)),
        ];
        for (name, call) in calls {
            fill();
            let log = recorded(|| {
                set_errno(77);
                assert_eq!(call(), 0, "{name}: errno {}", errno());
                assert_eq!(errno(), 77, "{name}: errno survives the handlers");
            });
            assert_eq!(size(), 0, "{name} emptied the file");
            assert_eq!(log, want, "{name} ({mode:?})");
        }
        // Streams that empty nothing: to read, to append, and exclusive
        // (the file is there: refused).
        fill();
        let log = recorded(|| {
            assert_eq!((h.fopen_mode)(c_path.as_ptr(), c"r".as_ptr()), 0);
            assert_eq!((h.fopen_mode)(c_path.as_ptr(), c"a+".as_ptr()), 0);
            assert_eq!((h.fopen_mode)(c_path.as_ptr(), c"wx".as_ptr()), -1);
            assert_eq!(errno(), libc::EEXIST);
        });
        assert_eq!(log, [], "({mode:?})");
        assert_eq!(size(), 4 * page as u64, "none emptied it");
        libc::close(dirfd);
        libc::munmap(shared as *mut libc::c_void, 4 * page);
        libc::munmap(private as *mut libc::c_void, 2 * page);

        // A shared memory object, mapped, emptied by shm_open(O_TRUNC)
        // (the name's leading slash is glibc's to drop).
        let name = CString::new(format!("/memhook-shm-{}", std::process::id())).unwrap();
        let fd = (h.shm_open)(name.as_ptr(), libc::O_RDWR | libc::O_CREAT);
        assert!(fd >= 0, "shm_open: errno {}", errno());
        assert_eq!(libc::ftruncate(fd, (2 * page) as libc::off_t), 0);
        let object = map_file(fd, 2, 0, true);
        libc::close(fd);
        let log = recorded(|| {
            close((h.shm_open)(name.as_ptr(), libc::O_RDWR));
            set_errno(77);
            close((h.shm_open)(name.as_ptr(), libc::O_RDWR | libc::O_TRUNC));
            assert_eq!(errno(), 77, "shm_open: errno survives the handlers");
        });
        assert_eq!(log, vm(&[(object, 2 * page)]), "shm_open");
        let fd = (h.shm_open)(name.as_ptr(), libc::O_RDONLY);
        let mut st: libc::stat = std::mem::zeroed();
        assert_eq!(libc::fstat(fd, &mut st), 0);
        assert_eq!(st.st_size, 0, "shm_open emptied the object");
        close(fd);
        libc::munmap(object as *mut libc::c_void, 2 * page);
        libc::shm_unlink(name.as_ptr());
    }
    drop(file);
    let _ = std::fs::remove_dir_all(&dir);
}

/// remap_file_pages puts other pages of a file in a range of a shared
/// mapping of it (Linux emulates it with an `mmap` of the file over the
/// range): the pages a registration cache pinned there are no longer the
/// mapping's. `VM_UNMAPPED` of the range before the call, `VM_MAPPED`
/// after, the range as the kernel takes it (address rounded down to a
/// page, size down to whole pages); nothing for a call it refuses before
/// looking at the mappings, with its errno.
fn check_remap_file_pages(h: &Helper, events: u32) {
    let page = page_size();
    // SAFETY: a new memfd, closed below.
    let fd = unsafe { libc::memfd_create(c"memhook-remap".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: the helper wraps the libc call; the ranges it is given lie
    // in the mapping made here (or are refused by the kernel), unmapped
    // below.
    unsafe {
        assert_eq!(libc::ftruncate(fd, (8 * page) as libc::off_t), 0);
        let m = map_file(fd, 8, 0, true);
        for i in 0..8 {
            std::ptr::write_bytes((m + i * page) as *mut u8, i as u8 + 1, page);
        }
        if let Err(refused) = remap_file_pages_works() {
            // (qemu-user answers ENOSYS.) The call's result and errno
            // come back through the hook, and nothing is mapped after
            // it: the report before it is one too many.
            eprintln!("remap_file_pages refused here (errno {refused}): its refusal alone checked");
            let log = recorded(|| {
                assert_eq!((h.remap_file_pages)(m + page, 2 * page, 0, 5, 0), -1);
                assert_eq!(errno(), refused);
            });
            assert_eq!(
                about(&log, m, 8 * page),
                only(events & bits::VM_UNMAPPED, [(bits::VM_UNMAPPED, m + page, 2 * page, 0)])
            );
            libc::munmap(m as *mut libc::c_void, 8 * page);
            libc::close(fd);
            return;
        }
        // From inside page 1, two pages and a bit: pages 1 and 2 now show
        // the file's pages 5 and 6; page 3 keeps its own.
        let mut result = -1;
        let log = recorded(|| {
            set_errno(77);
            result = (h.remap_file_pages)(m + page + 100, 2 * page + 50, 0, 5, 0);
            assert_eq!(errno(), 77, "errno survives the handlers around remap_file_pages");
        });
        assert_eq!(result, 0);
        assert_eq!(
            about(&log, m, 8 * page),
            only(
                events,
                [
                    (bits::VM_UNMAPPED, m + page, 2 * page, 0),
                    (bits::VM_MAPPED, m + page, 2 * page, 0)
                ]
            )
        );
        assert_eq!(*((m + page) as *const u8), 6, "page 1 shows the file's page 5");
        assert_eq!(*((m + 2 * page) as *const u8), 7, "page 2 shows the file's page 6");
        assert_eq!(*((m + 3 * page) as *const u8), 4, "page 3 kept its own");
        // Refused before the mappings are looked at: a protection other
        // than 0, a size under a page, file pages past the largest
        // offset. Nothing reported.
        let log = recorded(|| {
            assert_eq!((h.remap_file_pages)(m, page, libc::PROT_READ, 1, 0), -1);
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!((h.remap_file_pages)(m, page - 1, 0, 1, 0), -1);
            assert_eq!(errno(), libc::EINVAL);
            assert_eq!((h.remap_file_pages)(m, 2 * page, 0, usize::MAX, 0), -1);
            assert_eq!(errno(), libc::EINVAL);
        });
        assert_eq!(about(&log, m, 8 * page), []);
        assert_eq!(*(m as *const u8), 1, "page 0 kept its own");
        libc::munmap(m as *mut libc::c_void, 8 * page);
        libc::close(fd);
    }
}

/// An `mremap` that cannot move the mapping acts in place: a shrink
/// (Linux makes every one in place) unmaps only the pages past the new
/// end, a call that keeps the size changes nothing, and a growth
/// without `MREMAP_MAYMOVE` maps only the pages added (or is refused).
/// The pages kept are neither unmapped nor mapped again: a registration
/// cache keeps its registrations of them.
fn check_mremap_in_place(h: &Helper, events: u32) {
    let page = page_size();
    // SAFETY: a mapping of the helper's, resized in place below and
    // unmapped at its last size; the helpers pass what libc expects.
    unsafe {
        let a = (h.mmap)(2 * K64);
        assert_ne!(a as isize, -1);
        // To K64 + 100 bytes, may move: in place, the pages past K64 + one
        // page unmapped.
        let mut r = 0;
        let log = recorded(|| {
            set_errno(77);
            r = (h.mremap)(a, 2 * K64, K64 + 100);
            assert_eq!(errno(), 77, "errno survives the handlers of a shrink");
        });
        if r != a {
            // qemu-user moves it (Linux does not): the pages that stayed
            // are reported gone from the old place after the call, late,
            // and the new place mapped.
            assert!(
                std::env::var_os("MEMHOOK_TEST_QEMU").is_some(),
                "Linux shrinks in place: {a:#x} moved to {r:#x}"
            );
            let log: Vec<Rec> = log
                .into_iter()
                .filter(|x| near(x, a, 2 * K64) || near(x, r, K64))
                .collect();
            assert_eq!(
                log,
                only(
                    events,
                    [
                        (bits::VM_UNMAPPED, a + K64 + page, K64 - page, 0),
                        (bits::MREMAP, a, K64 + 100, r as isize),
                        (bits::VM_MAPPED, r, K64 + page, 0),
                        (bits::VM_UNMAPPED, a, K64 + page, 0)
                    ]
                ),
                "{log:x?}"
            );
            assert_eq!((h.munmap)(r, K64 + page), 0);
            return;
        }
        assert_eq!(
            about(&log, a, 2 * K64),
            only(
                events,
                [
                    (bits::VM_UNMAPPED, a + K64 + page, K64 - page, 0),
                    (bits::MREMAP, a, K64 + 100, a as isize)
                ]
            ),
            "{log:x?}"
        );
        // The same pages: nothing unmapped or mapped.
        let log = recorded(|| r = (h.mremap)(a, K64 + 100, K64 + page));
        assert_eq!(r, a);
        assert_eq!(
            about(&log, a, 2 * K64),
            only(events, [(bits::MREMAP, a, K64 + page, a as isize)]),
            "{log:x?}"
        );
        // Back to 2 * K64 without MREMAP_MAYMOVE: in place (the pages
        // after it were its own a moment ago; another thread may have
        // mapped there since, and then the kernel refuses).
        // A range at the top of the address space, whose ends the hook
        // must not compute past it: refused by the kernel, and nothing
        // worse.
        let top = usize::MAX & !(page - 1);
        assert_eq!((h.mremap_flags)(top, 2 * page, page, 0), usize::MAX);
        let log = recorded(|| r = (h.mremap_flags)(a, K64 + page, 2 * K64, 0));
        let (size, want) = if r == a {
            (
                2 * K64,
                vec![
                    (bits::MREMAP, a, 2 * K64, a as isize),
                    (bits::VM_MAPPED, a + K64 + page, K64 - page, 0),
                ],
            )
        } else {
            assert_eq!(errno(), libc::ENOMEM, "a growth in place refused");
            (K64 + page, vec![(bits::MREMAP, a, 2 * K64, -1)])
        };
        assert_eq!(about(&log, a, 2 * K64), only(events, want), "{log:x?}");
        assert_eq!((h.munmap)(a, size), 0);
    }
}

/// What `mremap(from, K64, 2 * K64, MREMAP_MAYMOVE)` that returned `to`
/// reports: grown in place, the pages added (after the call); moved, the
/// old range (before it) and the new one (after).
fn grown(from: usize, to: usize) -> Vec<Rec> {
    if to == from {
        vec![
            (bits::MREMAP, from, 2 * K64, to as isize),
            (bits::VM_MAPPED, from + K64, K64, 0),
        ]
    } else {
        vec![
            (bits::VM_UNMAPPED, from, K64, 0),
            (bits::MREMAP, from, 2 * K64, to as isize),
            (bits::VM_MAPPED, to, 2 * K64, 0),
        ]
    }
}

/// A growth that may move (`MREMAP_MAYMOVE`, which glibc's `realloc`
/// of a large block makes): where the pages after the mapping are free,
/// the kernel grows it in place, and only the pages added are reported
/// (mapped): a registration cache keeps its registrations of the rest.
/// Where they are taken, it moves: the old range unmapped before the
/// call, the new one mapped after. The caller's errno survives the
/// refused try in place either way.
fn check_mremap_grow(h: &Helper, events: u32) {
    // SAFETY: mappings of the helper's, grown below and unmapped at their
    // last sizes; the helpers pass what libc expects.
    unsafe {
        // Free pages after it: the upper half of a mapping of 2 * K64
        // given back (another thread may map there meanwhile: then it
        // moves, and says so).
        let a = (h.mmap)(2 * K64);
        assert_ne!(a as isize, -1);
        assert_eq!((h.munmap)(a + K64, K64), 0);
        let mut r = 0;
        let log = recorded(|| {
            set_errno(77);
            r = (h.mremap)(a, K64, 2 * K64);
            assert_eq!(errno(), 77, "errno survives the handlers of a growth");
        });
        assert_ne!(r as isize, -1, "mremap errno {}", errno());
        let log: Vec<Rec> = log
            .into_iter()
            .filter(|x| near(x, a, 2 * K64) || near(x, r, 2 * K64))
            .collect();
        assert_eq!(log, only(events, grown(a, r)), "{log:x?}");
        if r != a {
            eprintln!("the pages after {a:#x} were taken meanwhile: it moved");
        }
        assert_eq!((h.munmap)(r, 2 * K64), 0);

        // The pages after it taken (the first half of a mapping): it
        // moves.
        let b = (h.mmap)(2 * K64);
        assert_ne!(b as isize, -1);
        let log = recorded(|| {
            set_errno(77);
            r = (h.mremap)(b, K64, 2 * K64);
            assert_eq!(errno(), 77, "errno survives the handlers of a growth that moves");
        });
        assert_ne!(r as isize, -1, "mremap errno {}", errno());
        assert_ne!(r, b, "the pages after the first half are the second's");
        let log: Vec<Rec> = log
            .into_iter()
            .filter(|x| near(x, b, 2 * K64) || near(x, r, 2 * K64))
            .collect();
        assert_eq!(log, only(events, grown(b, r)), "{log:x?}");
        assert_eq!((h.munmap)(r, 2 * K64), 0);
        assert_eq!((h.munmap)(b + K64, K64), 0);
    }
}

/// Whether `remap_file_pages` works here (tried once, by the system call
/// itself, on a mapping of its own), or the errno it refuses with
/// (qemu-user answers `ENOSYS`).
fn remap_file_pages_works() -> Result<(), i32> {
    static WORKS: OnceLock<Result<(), i32>> = OnceLock::new();
    *WORKS.get_or_init(|| {
        let page = page_size();
        // SAFETY: a new memfd and a mapping of it, both let go below; the
        // call remaps the mapping's first page.
        unsafe {
            let fd = libc::memfd_create(c"memhook-remap-probe".as_ptr(), 0);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, (2 * page) as libc::off_t), 0);
            let m = map_file(fd, 2, 0, true);
            let r = libc::syscall(libc::SYS_remap_file_pages, m, page, 0, 1, 0);
            let result = if r == 0 { Ok(()) } else { Err(errno()) };
            libc::munmap(m as *mut libc::c_void, 2 * page);
            libc::close(fd);
            result
        }
    })
}

/// userfaultfd's `UFFDIO_MOVE` (Linux 6.8), which moves an anonymous
/// range's pages into a range registered with the userfaultfd with no
/// call on either mapping: `VM_UNMAPPED` of the source range before the
/// call, by `ioctl` and by `syscall(SYS_ioctl)`, each once; nothing for
/// the destination (it had no pages), nothing where the kernel refuses
/// the move before it looks (a range off a page boundary, an unknown
/// mode), and a bad argument is the call's `EFAULT`, not a crash in the
/// hook. Another request passes with its result and errno, no event.
/// Not checked where this process cannot make a userfaultfd or the
/// kernel has no `UFFDIO_MOVE` (`memhook doctor`'s `userfaultfd:` line).
fn check_uffd_move(h: &Helper, events: u32) {
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
    const UFFDIO_MOVE: libc::c_ulong = 0xc028_aa05;
    const UFFD_USER_MODE_ONLY: libc::c_long = 1;
    const UFFD_FEATURE_MOVE: u64 = 1 << 16;
    const MODE_MISSING: u64 = 1;
    let page = page_size();
    let l = |x: usize| x as libc::c_long;

    // Another request: passed through, its result and errno, no event.
    let log = recorded(|| {
        set_errno(0);
        // SAFETY: FIONREAD on a descriptor that is not open: EBADF.
        assert_eq!(unsafe { (h.ioctl)(-1, libc::FIONREAD, 0) }, -1);
        assert_eq!(errno(), libc::EBADF);
    });
    assert_eq!(log, [], "no event for another request");

    // SAFETY: userfaultfd for this process's own faults; closed below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_userfaultfd,
            libc::O_CLOEXEC as libc::c_long | UFFD_USER_MODE_ONLY,
        )
    };
    if fd < 0 {
        eprintln!("UFFDIO_MOVE: no userfaultfd here (errno {}), not checked", errno());
        return;
    }
    let fd = fd as i32;
    let mut api = [0xaa_u64, UFFD_FEATURE_MOVE, 0];
    // SAFETY: UFFDIO_API reads and writes `struct uffdio_api`, three words.
    let r = unsafe { libc::ioctl(fd, UFFDIO_API, api.as_mut_ptr()) };
    if r != 0 || api[1] & UFFD_FEATURE_MOVE == 0 {
        eprintln!(
            "UFFDIO_MOVE: not in this kernel (older than 6.8; errno {}), not checked",
            errno()
        );
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return;
    }
    // Four pages of source, written (so present, and this process's
    // alone), and four of destination, registered, never touched, four
    // pages past them (each step looks only at its own range).
    let pages = 4;
    // SAFETY: the helper wraps mmap; unmapped below.
    let src = unsafe { (h.mmap)(3 * pages * page) };
    assert_ne!(src, usize::MAX);
    let dst = src + 2 * pages * page;
    for i in 0..pages * page / 8 {
        // SAFETY: inside the source mapping, written.
        unsafe { *((src + i * 8) as *mut u64) = i as u64 ^ 0x5a5a };
    }
    let mut register = [dst as u64, (pages * page) as u64, MODE_MISSING, 0];
    // SAFETY: UFFDIO_REGISTER reads and writes `struct uffdio_register`, four words.
    let r = unsafe { libc::ioctl(fd, UFFDIO_REGISTER, register.as_mut_ptr()) };
    assert_eq!(r, 0, "UFFDIO_REGISTER: errno {}", errno());

    // `struct uffdio_move`: dst, src, len, mode, and the bytes moved.
    let mut mv = [dst as u64, src as u64, (2 * page) as u64, 0, 0];
    let log = recorded(|| {
        set_errno(77);
        // SAFETY: the helper wraps ioctl; UFFDIO_MOVE reads and writes `mv`.
        let r = unsafe { (h.ioctl)(fd, UFFDIO_MOVE, mv.as_mut_ptr() as usize) };
        assert_eq!(r, 0, "errno {}", errno());
        assert_eq!(errno(), 77, "errno survives the handlers");
    });
    assert_eq!(mv[4], (2 * page) as u64, "moved");
    assert_eq!(about(&log, dst, pages * page), [], "nothing of the destination");
    assert_eq!(
        about(&log, src, pages * page),
        only(events, [(bits::VM_UNMAPPED, src, 2 * page, 0)])
    );
    // SAFETY: inside the destination, whose first two pages are now the
    // source's; the source's first two pages are gone (zero on a read).
    unsafe {
        assert_eq!(*((dst + page + 8) as *const u64), (page / 8 + 1) as u64 ^ 0x5a5a);
        assert_eq!(*((src + page + 8) as *const u64), 0);
    }

    // The next two pages by the system call, through libc's `syscall`.
    let mut mv = [
        (dst + 2 * page) as u64,
        (src + 2 * page) as u64,
        (2 * page) as u64,
        0,
        0,
    ];
    let log = recorded(|| {
        let r = sys(
            h,
            libc::SYS_ioctl,
            &[l(fd as usize), UFFDIO_MOVE as libc::c_long, l(mv.as_mut_ptr() as usize)],
        );
        assert_eq!(r, 0, "errno {}", errno());
    });
    assert_eq!(
        about(&log, src, pages * page),
        only(events, [(bits::VM_UNMAPPED, src + 2 * page, 2 * page, 0)]),
        "syscall(SYS_ioctl, UFFDIO_MOVE): once"
    );

    // Refused before the kernel looks: off a page boundary, an unknown
    // mode; a bad argument. The kernel's errno, nothing reported.
    for (what, arg, want) in [
        (
            "unaligned",
            [dst as u64, (src + 8) as u64, page as u64, 0, 0],
            libc::EINVAL,
        ),
        ("mode", [dst as u64, src as u64, page as u64, 1 << 7, 0], libc::EINVAL),
    ] {
        let mut arg = arg;
        let log = recorded(|| {
            // SAFETY: as above.
            let r = unsafe { (h.ioctl)(fd, UFFDIO_MOVE, arg.as_mut_ptr() as usize) };
            assert_eq!(r, -1, "{what}");
            assert_eq!(errno(), want, "{what}");
        });
        assert_eq!(about(&log, src, pages * page), [], "{what}");
    }
    let log = recorded(|| {
        // SAFETY: the kernel reads the argument and fails with EFAULT.
        assert_eq!(unsafe { (h.ioctl)(fd, UFFDIO_MOVE, 8) }, -1);
        assert_eq!(errno(), libc::EFAULT);
    });
    assert_eq!(log, [], "a bad argument");

    // SAFETY: our mappings and descriptor.
    unsafe {
        assert_eq!((h.munmap)(src, 3 * pages * page), 0);
        libc::close(fd);
    }
}

/// process_madvise (glibc 2.36): a discarding advice on the caller's own
/// memory (Linux 6.13; an allocator's batch of `MADV_DONTNEED`s) is a
/// `VM_UNMAPPED` of each range, in order, before the call; the function
/// has no event of its own. The result and errno are the kernel's (an
/// older kernel, or qemu-user, refuses the advice, and a seccomp filter
/// the call, as Docker 20.10's default profile does with EPERM: reported
/// all the same, as the hook cannot know). A call the kernel refuses
/// before it reads the ranges, or whose ranges it cannot read, reports
/// nothing, and a bad array is `EFAULT` (or the filter's EPERM), not a
/// crash in the hook.
fn check_process_madvise(h: &Helper, events: u32) {
    let page = page_size();
    // SAFETY: pidfd_open of this process; closed below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as i32;
    assert!(pidfd >= 0, "pidfd_open: {}", errno());
    // SAFETY: the helper wraps mmap; 48 pages, unmapped below.
    let r = unsafe { (h.mmap)(48 * page) };
    assert_ne!(r, usize::MAX);
    // The call as the kernel answers it, by the system call (not hooked).
    let kernel = |array: *const libc::iovec, n: usize, advice: i32, flags: u32| {
        // SAFETY: process_madvise, which checks `array` itself.
        let result = unsafe { libc::syscall(libc::SYS_process_madvise, pidfd, array, n, advice, flags) } as isize;
        (result, if result < 0 { errno() } else { 77 })
    };
    // The call through glibc (hooked), from the helper library, with the
    // events recorded; errno set to 77 first.
    let hooked = |array: *const libc::iovec, n: usize, advice: i32, flags: u32| {
        let mut out = (0, 0);
        let log = recorded(|| {
            set_errno(77);
            // SAFETY: the helper wraps process_madvise, which checks
            // `array` itself (a bad one is EFAULT).
            out.0 = unsafe { (h.process_madvise)(pidfd, array, n, advice, flags) };
            out.1 = errno();
        });
        (out, about(&log, r, 48 * page))
    };
    let (probe, _) = hooked(core::ptr::null(), 0, libc::MADV_DONTNEED, 0);
    if probe.0 == -2 {
        eprintln!("process_madvise: not in this glibc (older than 2.36), not checked");
    } else {
        // Two ranges, the first short of a page (the kernel discards it whole).
        let iov = [iovec(r, 100), iovec(r + 2 * page, page)];
        let want = kernel(iov.as_ptr(), 2, libc::MADV_DONTNEED, 0);
        let (got, log) = hooked(iov.as_ptr(), 2, libc::MADV_DONTNEED, 0);
        assert_eq!(got, want, "result and errno");
        assert_eq!(
            log,
            only(
                events,
                [
                    (bits::VM_UNMAPPED, r, page, 0),
                    (bits::VM_UNMAPPED, r + 2 * page, page, 0)
                ]
            )
        );
        // Forty ranges (more than the hook reads at a time), each reported.
        let many: Vec<libc::iovec> = (0..40).map(|i| iovec(r + i * page, page)).collect();
        let want = kernel(many.as_ptr(), many.len(), libc::MADV_DONTNEED, 0);
        let (got, log) = hooked(many.as_ptr(), many.len(), libc::MADV_DONTNEED, 0);
        assert_eq!(got, want, "result and errno");
        let each: Vec<Rec> = if events & bits::VM_UNMAPPED != 0 {
            many.iter()
                .map(|v| (bits::VM_UNMAPPED, v.iov_base as usize, page, 0))
                .collect()
        } else {
            Vec::new()
        };
        assert_eq!(log, each);
        // An array the kernel cannot read: null, in a PROT_NONE page,
        // running into one. EFAULT (where the kernel has the call),
        // nothing reported, no crash.
        let fenced = r + 47 * page;
        // SAFETY: makes the last page of `r` inaccessible (unmapped with
        // `r` below).
        let protected = unsafe { libc::mprotect(fenced as *mut libc::c_void, page, libc::PROT_NONE) };
        assert_eq!(protected, 0);
        // SAFETY: one range written just before the PROT_NONE page.
        unsafe { ((fenced - 16) as *mut libc::iovec).write(iovec(r, page)) };
        for (array, n) in [(0, 1), (fenced, 1), (fenced - 16, 2)] {
            let array = array as *const libc::iovec;
            let want = kernel(array, n, libc::MADV_DONTNEED, 0);
            assert!(
                want.0 == -1 && [libc::EFAULT, libc::ENOSYS, libc::EPERM].contains(&want.1),
                "{want:?}"
            );
            let (got, log) = hooked(array, n, libc::MADV_DONTNEED, 0);
            assert_eq!(got, want, "array {array:?}, {n} ranges");
            assert_eq!(log, [], "array {array:?}, {n} ranges");
        }
        // Calls refused before the ranges are read, and an advice that
        // keeps the contents: nothing reported.
        let one = [iovec(r, page)];
        for (n, advice, flags) in [
            (1, libc::MADV_DONTNEED, 1),
            (1025, libc::MADV_DONTNEED, 0),
            (1, libc::MADV_COLD, 0),
        ] {
            let want = kernel(one.as_ptr(), n, advice, flags);
            let (got, log) = hooked(one.as_ptr(), n, advice, flags);
            assert_eq!(got, want, "{n} ranges, advice {advice}, flags {flags}");
            assert_eq!(log, [], "{n} ranges, advice {advice}, flags {flags}");
        }
    }
    // SAFETY: the mapping made above, and the pidfd.
    unsafe {
        assert_eq!((h.munmap)(r, 48 * page), 0);
        libc::close(pidfd);
    }
}

/// A test's registrations and install, undone when it ends (also when it
/// fails, so one failure does not leave handlers behind for the next).
struct Session(Vec<memhook::event::HandlerId>);

impl Session {
    fn new(mode: HookMode) -> Session {
        Session::with(&config(mode))
    }

    fn with(config: &Config) -> Session {
        memhook::install(config);
        Session(Vec::new())
    }

    fn handler(&mut self, events: u32, priority: i32, f: &'static (dyn Fn(&mut Event) + Send + Sync)) {
        self.0
            .push(memhook::set_handler(events, priority, HandlerFn::Rust(f)).unwrap());
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for id in self.0.drain(..) {
            let _ = memhook::unset_handler(id);
        }
        memhook::uninstall();
    }
}

fn config(mmap: HookMode) -> Config {
    Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[mmap]),
            cuda: ModeSet::NONE,
        },
    }
}

const K64: usize = 64 * 1024;

/// `shmdt` of an attachment of `id_shm` (`K64` bytes) split in pieces:
/// by `mprotect` of its second page, and by `munmap` of its first. Linux
/// unmaps every piece left (`ksys_shmdt`); the hook must report them all
/// (it reported the first piece alone, or nothing where that was gone).
fn check_shm_fragments(h: &Helper, events: u32, id_shm: i32, page: usize) {
    // SAFETY: attaches the caller's segment; each piece changed below lies
    // inside the attachment, detached after.
    let a = unsafe { (h.shmat)(id_shm) };
    assert_ne!(a, usize::MAX);
    // SAFETY: as above.
    let protected = unsafe { libc::mprotect((a + page) as *mut _, page, libc::PROT_READ) };
    assert_eq!(protected, 0);
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.shmdt)(a) }, 0));
    assert_eq!(
        about(&log, a, K64),
        only(events, [(bits::VM_UNMAPPED, a, K64, 0), (bits::SHMDT, a, 0, 0)])
    );
    // SAFETY: as above.
    let a = unsafe { (h.shmat)(id_shm) };
    assert_ne!(a, usize::MAX);
    // SAFETY: as above.
    assert_eq!(unsafe { (h.munmap)(a, page) }, 0);
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.shmdt)(a) }, 0));
    assert_eq!(
        about(&log, a, K64),
        only(
            events,
            [(bits::VM_UNMAPPED, a + page, K64 - page, 0), (bits::SHMDT, a, 0, 0)]
        )
    );
}

/// The records of `all` whose kind is in `events`: what a handler
/// registered for `events` sees of a call that makes `all`.
fn only(events: u32, all: impl IntoIterator<Item = Rec>) -> Vec<Rec> {
    all.into_iter().filter(|r| r.0 & events != 0).collect()
}

fn errno() -> i32 {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() }
}

fn set_errno(value: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = value };
}

/// Every hooked function's events in `mode`, seen by one handler
/// registered for `events`: every event, or the aggregate ones alone (a
/// registration cache's subscription, for which the hooks deliver them
/// without building the call's own event).
fn check_mode(mode: HookMode, events: u32) {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let mut session = Session::new(mode);
    let status = memhook::status();
    assert_eq!(libc_entries(&status), host_functions(), "{status:?}");
    assert!(status.iter().all(|s| s.installed && s.mode == mode), "{status:?}");
    session.handler(events, 0, &record);

    // mmap: MMAP with its result, then VM_MAPPED. The caller's errno
    // survives the handlers after a successful call.
    let mut p = 0;
    let log = recorded(|| {
        set_errno(77);
        // The helper functions wrap libc's; each call below passes what
        // libc expects.
        // SAFETY: as just said.
        p = unsafe { (h.mmap)(K64) };
        assert_eq!(errno(), 77, "errno survives the handlers after mmap");
    });
    assert_ne!(p as isize, -1);
    assert_eq!(
        about(&log, p, K64),
        only(events, [(bits::MMAP, 0, K64, p as isize), (bits::VM_MAPPED, p, K64, 0)])
    );

    // mremap grow (may move): where it moves, VM_UNMAPPED of the old
    // range before, then MREMAP with its result, then VM_MAPPED of the new
    // range; where it grows in place, the pages added mapped after.
    let mut q = 0;
    // SAFETY: as above.
    let log = recorded(|| q = unsafe { (h.mremap)(p, K64, 2 * K64) });
    assert_ne!(q as isize, -1);
    let log: Vec<Rec> = log
        .into_iter()
        .filter(|r| near(r, p, K64) || near(r, q, 2 * K64))
        .collect();
    assert_eq!(log, only(events, grown(p, q)), "{log:x?}");

    check_mremap_in_place(h, events);
    check_mremap_grow(h, events);

    // madvise: a discarding advice is an unmap of the contents; others are
    // not reported.
    let log = recorded(|| {
        set_errno(77);
        // SAFETY: as above.
        assert_eq!(unsafe { (h.madvise)(q, 4096, libc::MADV_DONTNEED) }, 0);
        assert_eq!(errno(), 77, "errno survives the handlers before madvise");
    });
    assert_eq!(
        about(&log, q, 4096),
        only(events, [(bits::VM_UNMAPPED, q, 4096, 0), (bits::MADVISE, q, 4096, 0)])
    );
    // The newer discarding advices: DONTNEED on locked pages too (Linux
    // 5.18), and guard markers in place of the pages (6.13; removed
    // again, which discards nothing). Reported whatever the kernel makes
    // of them (an older one refuses them: the result says so).
    for advice in [24, 102] {
        let mut result = 0;
        // SAFETY: as above.
        let log = recorded(|| result = unsafe { (h.madvise)(q, 4096, advice) });
        assert_eq!(
            about(&log, q, 4096),
            only(
                events,
                [
                    (bits::VM_UNMAPPED, q, 4096, 0),
                    (bits::MADVISE, q, 4096, result as isize)
                ]
            ),
            "advice {advice}"
        );
    }
    let log = recorded(|| {
        // SAFETY: as above (MADV_GUARD_REMOVE).
        let _ = unsafe { (h.madvise)(q, 4096, 103) };
    });
    assert!(about(&log, q, 4096).is_empty(), "{log:x?}");
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.madvise)(q, 4096, libc::MADV_WILLNEED) }, 0));
    assert!(about(&log, q, 4096).is_empty(), "{log:x?}");

    // A length short of a page: the call's own event carries it as given;
    // VM_UNMAPPED, the page the kernel discards or unmaps whole (a cache's
    // registration in the rest of that page goes too).
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.madvise)(q, 100, libc::MADV_DONTNEED) }, 0));
    assert_eq!(
        about(&log, q, page),
        only(events, [(bits::VM_UNMAPPED, q, page, 0), (bits::MADVISE, q, 100, 0)])
    );
    // SAFETY: as above.
    let r = unsafe { (h.mmap)(K64) };
    assert_ne!(r, usize::MAX);
    // SAFETY: as above (its first page).
    let log = recorded(|| assert_eq!(unsafe { (h.munmap)(r, 100) }, 0));
    assert_eq!(
        about(&log, r, page),
        only(events, [(bits::VM_UNMAPPED, r, page, 0), (bits::MUNMAP, r, 100, 0)])
    );
    // SAFETY: as above (the rest of the mapping).
    assert_eq!(unsafe { (h.munmap)(r + page, K64 - page) }, 0);

    // munmap: VM_UNMAPPED before, MUNMAP with result 0. The caller's
    // errno survives a handler that ran before the call, too.
    let log = recorded(|| {
        set_errno(77);
        // SAFETY: as above.
        assert_eq!(unsafe { (h.munmap)(q, 2 * K64) }, 0);
        assert_eq!(errno(), 77, "errno survives the handlers before munmap");
    });
    assert_eq!(
        about(&log, q, 2 * K64),
        only(
            events,
            [(bits::VM_UNMAPPED, q, 2 * K64, 0), (bits::MUNMAP, q, 2 * K64, 0)]
        )
    );

    // Failing calls: result -1, errno as the original left it.
    let mut failed = 0;
    let log = recorded(|| {
        // SAFETY: as above (an unaligned address fails with EINVAL).
        assert_eq!(unsafe { (h.munmap)(1, 4096) }, -1);
        failed = errno();
    });
    assert_eq!(failed, libc::EINVAL, "errno survives the handlers");
    // (The kernel refuses it before it looks at the mappings: nothing is
    // unmapped, and no VM_UNMAPPED comes; the call's own event does.)
    let at_1: Vec<Rec> = log.iter().filter(|r| r.1 == 1).copied().collect();
    assert_eq!(at_1, only(events, [(bits::MUNMAP, 1, 4096, -1)]));
    let log = recorded(|| {
        // SAFETY: as above (a range past the top of the address space
        // fails with EINVAL).
        assert_eq!(unsafe { (h.munmap)(usize::MAX & !0xfff, 8192) }, -1);
    });
    assert_eq!(
        only(bits::VM_UNMAPPED, log.iter().copied()),
        [],
        "nothing unmapped past the top"
    );
    let log = recorded(|| {
        // SAFETY: as above (a length of 0 fails with EINVAL).
        assert_eq!(unsafe { (h.mmap)(0) }, usize::MAX);
        failed = errno();
    });
    assert_eq!(failed, libc::EINVAL, "errno survives the handlers");
    let kinds: Vec<u32> = log.iter().map(|r| r.0).collect();
    assert_eq!(
        kinds,
        only(events, [(bits::MMAP, 0, 0, -1)])
            .iter()
            .map(|r| r.0)
            .collect::<Vec<_>>(),
        "{log:x?}"
    );

    check_process_madvise(h, events);
    check_file_discards(h, events);
    check_remap_file_pages(h, events);
    check_open_truncate(h, mode, events);
    check_syscall(h, events);
    check_uffd_move(h, events);

    // shmat/shmdt: sizes from the segment and the mapping.
    // SAFETY: a private segment, removed below.
    let id_shm = unsafe { libc::shmget(libc::IPC_PRIVATE, K64, libc::IPC_CREAT | 0o600) };
    assert!(id_shm >= 0);
    let mut a = 0;
    // SAFETY: as above.
    let log = recorded(|| a = unsafe { (h.shmat)(id_shm) });
    assert_eq!(
        about(&log, a, K64),
        only(
            events,
            [
                (bits::SHMAT, 0, id_shm as usize, a as isize),
                (bits::VM_MAPPED, a, K64, 0)
            ]
        )
    );
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.shmdt)(a) }, 0));
    assert_eq!(
        about(&log, a, K64),
        only(events, [(bits::VM_UNMAPPED, a, K64, 0), (bits::SHMDT, a, 0, 0)])
    );
    // An attachment that `mprotect` split in three, and one whose first
    // page `munmap` took: `shmdt` unmaps every piece left, and reports
    // them all (it reported the first piece alone, or nothing).
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    if K64 / page >= 3 {
        check_shm_fragments(h, events, id_shm, page);
    }
    // SAFETY: removing the segment created above.
    unsafe { libc::shmctl(id_shm, libc::IPC_RMID, std::ptr::null_mut()) };

    check_replacing_calls(h, events);
    check_hugetlb(h, events);

    // sbrk and brk grow and shrink (glibc's break stays right: sbrk(0)
    // agrees after each step).
    // SAFETY: as above; the break is restored.
    let top = unsafe { (h.sbrk)(0) };
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.sbrk)(K64 as isize) }, top));
    assert_eq!(
        about(&log, top, K64),
        only(
            events,
            [(bits::SBRK, 0, K64, top as isize), (bits::VM_MAPPED, top, K64, 0)]
        )
    );
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.sbrk)(-(K64 as isize)) }, top + K64));
    assert_eq!(
        about(&log, top, K64),
        only(
            events,
            [
                (bits::VM_UNMAPPED, top, K64, 0),
                (bits::SBRK, 0, -(K64 as isize) as usize, (top + K64) as isize)
            ]
        )
    );
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.brk)(top + K64) }, 0));
    assert_eq!(
        about(&log, top, K64),
        only(events, [(bits::BRK, top + K64, 0, 0), (bits::VM_MAPPED, top, K64, 0)])
    );
    // SAFETY: as above.
    assert_eq!(unsafe { (h.sbrk)(0) }, top + K64, "glibc's break follows brk");
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.brk)(top) }, 0));
    assert_eq!(
        about(&log, top, K64),
        only(events, [(bits::VM_UNMAPPED, top, K64, 0), (bits::BRK, top, 0, 0)])
    );
    // Below the heap's start (brk(NULL), an sbrk of more than the heap):
    // refused by the kernel, and nothing unmapped (the whole range up to
    // the break was reported, the program's own code and data in it).
    // (glibc's brk answers 0 where the kernel's break ends at or past
    // the address asked, as it does when it refuses one below the heap.)
    // SAFETY: as above; each is refused, the break unchanged.
    let log = recorded(|| unsafe {
        assert_eq!((h.brk)(0), 0);
        assert_eq!((h.brk)(1), 0);
        // (sbrk too: it moves the break with brk, and answers the old
        // one.)
        assert_eq!((h.sbrk)(-((top - 4096) as isize)), top);
    });
    if qemu_lists_no_heap() {
        eprintln!("under qemu-user (no [heap] in its maps): a shrink below the heap is reported");
    } else {
        assert!(
            !log.iter().any(|r| r.0 == bits::VM_UNMAPPED),
            "nothing unmapped below the heap: {log:x?}"
        );
    }
    // SAFETY: as above.
    assert_eq!(unsafe { (h.sbrk)(0) }, top, "the break unchanged");

    if interposed(c"malloc") {
        eprintln!("malloc is not glibc's (AddressSanitizer's?): glibc's not checked");
    } else {
        check_glibc_malloc(h, mode);
    }
    check_originals_are_unreported();
    drop(session);
    assert!(memhook::status().is_empty());
}

/// glibc malloc of a large block maps it inside libc: bistro patches the
/// entry and sees it, reloc (no slot for a call inside libc) does not.
fn check_glibc_malloc(h: &Helper, mode: HookMode) {
    // A fixed threshold: glibc raises its dynamic one to the size of any
    // mapped block freed earlier (other tests in this process free 8 MiB
    // ones), and would then serve this block from the heap.
    // SAFETY: mallopt only changes an allocator setting.
    assert_eq!(unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) }, 1);
    let mut m = 0;
    // SAFETY: the helper wraps malloc.
    let log = recorded(|| m = unsafe { (h.malloc)(8 << 20) });
    let covering = log.iter().any(|r| r.0 == bits::VM_MAPPED && r.1 <= m && m < r.1 + r.2);
    // SAFETY: the block malloc gave.
    let freed = recorded(|| unsafe { (h.free)(m) });
    let unmapped = freed
        .iter()
        .any(|r| r.0 == bits::VM_UNMAPPED && r.1 <= m && m < r.1 + r.2);
    match mode {
        HookMode::Bistro => assert!(covering && unmapped, "bistro sees glibc's internal mmap/munmap"),
        _ => assert!(!covering && !unmapped, "reloc cannot see calls inside libc"),
    }
}

/// The originals map and unmap past the hooks: no event.
fn check_originals_are_unreported() {
    type Mmap = unsafe extern "C" fn(usize, usize, i32, i32, i32, i64) -> usize;
    type Munmap = unsafe extern "C" fn(usize, usize) -> i32;
    // SAFETY: the originals of mmap and munmap, of glibc's signatures.
    let (mmap, munmap) = unsafe {
        (
            cast::<Mmap>(memhook::host::original("mmap").expect("mmap is hooked")),
            cast::<Munmap>(memhook::host::original("munmap").expect("munmap is hooked")),
        )
    };
    let log = recorded(|| {
        // SAFETY: an anonymous private mapping, unmapped right away.
        let p = unsafe {
            mmap(
                0,
                K64,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p as isize, -1);
        // SAFETY: as above.
        assert_eq!(unsafe { munmap(p, K64) }, 0);
    });
    assert_eq!(log, [], "the originals are unreported");
    assert_eq!(memhook::host::original("malloc"), None);
}

const M2: usize = 2 << 20;

/// A 2 MiB hugetlb page for the test, if the kernel has one free
/// (`/proc/sys/vm/nr_hugepages`; `.ci/run` reserves eight), mapped
/// privately where the kernel chooses, unrecorded; `None` (and why)
/// where not, or under qemu-user.
fn huge_page() -> Option<usize> {
    if std::env::var_os("MEMHOOK_TEST_QEMU").is_some() {
        // qemu-user keeps its own map of the guest's pages, in base
        // pages: a huge page moved by mremap faults where the kernel
        // put it.
        eprintln!("hugetlb: under qemu-user (MEMHOOK_TEST_QEMU), not checked");
        return None;
    }
    // SAFETY: a new private mapping, unmapped by the caller.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            M2,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT),
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        eprintln!(
            "hugetlb: no free 2 MiB page (errno {}; reserve some in /proc/sys/vm/nr_hugepages): not checked",
            errno()
        );
        return None;
    }
    Some(p as usize)
}

/// `len` bytes of 1s in ordinary pages, 2 MiB aligned, unrecorded.
fn ordinary_aligned(h: &Helper, len: usize) -> usize {
    // SAFETY: the helper maps fresh private memory; what lies outside the
    // aligned part is unmapped, the aligned part written whole.
    unsafe {
        let r = (h.mmap)(len + M2);
        assert_ne!(r as isize, -1);
        let a = r.next_multiple_of(M2);
        if a > r {
            (h.munmap)(r, a - r);
        }
        if r + M2 > a {
            (h.munmap)(a + len, r + M2 - a);
        }
        std::ptr::write_bytes(a as *mut u8, 1, len);
        a
    }
}

/// Hugetlb mappings are mapped, moved and discarded in whole huge pages
/// whatever length the call gives: the hooks report the kernel's range,
/// 2 MiB where the call said 4 KiB (they reported 4 KiB, and a
/// registration cache kept the rest of the replaced or moved page).
/// Each step checks the kernel did so (the bytes past the call's length
/// are gone) beside what was reported.
fn check_hugetlb(h: &Helper, events: u32) {
    let Some(first) = huge_page() else {
        return;
    };
    // SAFETY: the page just mapped.
    unsafe { libc::munmap(first as *mut libc::c_void, M2) };
    let page = page_size();
    // mmap(MAP_FIXED | MAP_HUGETLB) of 4 KiB over ordinary memory: the
    // kernel replaces 2 MiB.
    let a = ordinary_aligned(h, 2 * M2);
    let mut x = 0;
    let log = recorded(|| {
        // SAFETY: a fixed mapping over the test's own memory.
        x = unsafe {
            (h.mmap_at)(
                a,
                page,
                libc::MAP_FIXED | libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT),
            )
        }
    });
    if x as isize == -1 {
        eprintln!("hugetlb: MAP_FIXED refused (errno {}): not checked", errno());
        // SAFETY: the test's mapping.
        unsafe { (h.munmap)(a, 2 * M2) };
        return;
    }
    // What is left of the ordinary memory: the mremap below replaces it.
    assert_eq!(x, a);
    // SAFETY: inside the new huge page.
    assert_eq!(unsafe { *((a + page) as *const u8) }, 0, "the kernel replaced 2 MiB");
    assert_eq!(
        about(&log, a, M2),
        only(events, replaced_by((bits::MMAP, a, page, a as isize), a, M2)),
        "{log:x?}"
    );

    // mremap of 4 KiB of it onto the next 2 MiB (ordinary memory): the
    // kernel moves the whole huge page, and replaces 2 MiB there.
    let to = a + M2;
    // SAFETY: the test's huge page, written whole.
    unsafe { std::ptr::write_bytes(a as *mut u8, 7, M2) };
    let log = recorded(|| {
        // SAFETY: as above.
        x = unsafe { (h.mremap_to)(a, page, page, to) };
    });
    assert_eq!(x, to, "mremap errno {}", errno());
    // SAFETY: the moved huge page.
    assert_eq!(unsafe { *((to + M2 - 1) as *const u8) }, 7, "the kernel moved 2 MiB");
    let log: Vec<Rec> = log.into_iter().filter(|e| near(e, a, 2 * M2)).collect();
    assert_eq!(log, only(events, moved(a, page, to, M2)), "{log:x?}");

    // madvise(MADV_DONTNEED) of 4 KiB at its start: Linux 5.19 to 6.8
    // discard the whole huge page, 6.9 on none of it; whatever this
    // kernel did, every byte it discarded was reported.
    let log = recorded(|| {
        // SAFETY: as above.
        assert_eq!(unsafe { (h.madvise)(to, page, libc::MADV_DONTNEED) }, 0);
    });
    let unmapped: Vec<(usize, usize)> = only(bits::VM_UNMAPPED, about(&log, to, M2))
        .iter()
        .map(|e| (e.1, e.1 + e.2))
        .collect();
    if events & bits::VM_UNMAPPED != 0 {
        assert!(
            unmapped.contains(&(to, to + page)) || unmapped.contains(&(to, to + M2)),
            "{log:x?}"
        );
        for at in (to..to + M2).step_by(page) {
            // SAFETY: the huge page, still mapped.
            if unsafe { *(at as *const u8) } == 0 {
                assert!(
                    unmapped.iter().any(|&(s, e)| (s..e).contains(&at)),
                    "{at:#x} discarded, unreported: {log:x?}"
                );
            }
        }
    }
    // SAFETY: the test's huge page (where it was is unmapped: moved).
    assert_eq!(unsafe { (h.munmap)(to, M2) }, 0);

    // A shrink in place of two huge pages: to 2 MiB and 4 KiB the kernel
    // rounds the new size up to the huge page (nothing changes, nothing
    // reported); to 2 MiB the second huge page goes.
    let huge = libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT);
    // SAFETY: a new hugetlb mapping of the test's, unmapped below.
    let b = unsafe { (h.mmap_at)(0, 2 * M2, huge) };
    if b as isize == -1 {
        eprintln!(
            "hugetlb: no two free 2 MiB pages (errno {}): shrink not checked",
            errno()
        );
    } else {
        // SAFETY: resizes the test's mapping in place.
        let log = recorded(|| x = unsafe { (h.mremap)(b, 2 * M2, M2 + page) });
        assert_eq!(x, b, "mremap errno {}", errno());
        assert_eq!(
            about(&log, b, 2 * M2),
            only(events, [(bits::MREMAP, b, M2 + page, b as isize)]),
            "{log:x?}"
        );
        // SAFETY: as above.
        let log = recorded(|| x = unsafe { (h.mremap)(b, 2 * M2, M2) });
        assert_eq!(x, b, "mremap errno {}", errno());
        assert_eq!(
            about(&log, b, 2 * M2),
            only(
                events,
                [(bits::VM_UNMAPPED, b + M2, M2, 0), (bits::MREMAP, b, M2, b as isize)]
            ),
            "{log:x?}"
        );
        // SAFETY: what is left of it.
        assert_eq!(unsafe { (h.munmap)(b, M2) }, 0);
    }

    // A hugetlb memfd's file, mapped for 4 KiB: 2 MiB, where the kernel
    // chooses (the page size asked of the mapping after the call) and
    // with MAP_FIXED over ordinary memory (asked of the file's device
    // before it: the range it replaces).
    // SAFETY: a new memfd, closed below.
    let fd = unsafe {
        libc::memfd_create(
            c"memhook-hugetlb-test".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_HUGETLB | (21 << libc::MFD_HUGE_SHIFT),
        )
    };
    assert!(fd >= 0, "memfd_create(MFD_HUGETLB): {}", errno());
    // SAFETY: sizes the test's memfd.
    assert_eq!(unsafe { libc::ftruncate(fd, M2 as i64) }, 0);
    let log = recorded(|| {
        // SAFETY: a new shared mapping of the test's file.
        x = unsafe { (h.mmap_file)(0, page, libc::MAP_SHARED, fd, 0) };
    });
    assert_ne!(x as isize, -1, "errno {}", errno());
    let vm = only(bits::VM_MAPPED | bits::VM_UNMAPPED, about(&log, x, M2));
    assert_eq!(vm, only(events, [(bits::VM_MAPPED, x, M2, 0)]), "{log:x?}");
    // SAFETY: the mapping just made.
    assert_eq!(unsafe { (h.munmap)(x, M2) }, 0);
    let c = ordinary_aligned(h, M2);
    let log = recorded(|| {
        // SAFETY: a fixed mapping of the test's file over the test's memory.
        x = unsafe { (h.mmap_file)(c, page, libc::MAP_SHARED | libc::MAP_FIXED, fd, 0) };
    });
    assert_eq!(x, c, "errno {}", errno());
    // SAFETY: inside the file's huge page, which the kernel zeroed.
    assert_eq!(unsafe { *((c + M2 - 1) as *const u8) }, 0, "the kernel replaced 2 MiB");
    let vm = only(bits::VM_MAPPED | bits::VM_UNMAPPED, about(&log, c, M2));
    assert_eq!(
        vm,
        only(events, [(bits::VM_UNMAPPED, c, M2, 0), (bits::VM_MAPPED, c, M2, 0)]),
        "{log:x?}"
    );
    // SAFETY: the mapping and the memfd.
    unsafe {
        assert_eq!((h.munmap)(c, M2), 0);
        libc::close(fd);
    }

    // A SysV segment made with SHM_HUGETLB of 4 KiB: attached in a 2 MiB
    // huge page, and again with SHM_REMAP over ordinary memory, which
    // replaces 2 MiB.
    // SAFETY: a private segment, removed when `_removed` drops (a failed
    // step too: its huge page would stay reserved).
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, page, libc::IPC_CREAT | libc::SHM_HUGETLB | 0o600) };
    if id < 0 {
        eprintln!("hugetlb: shmget(SHM_HUGETLB) refused (errno {}): not checked", errno());
        return;
    }
    let _removed = RemovedAtEnd(id);
    let log = recorded(|| {
        // SAFETY: attaches the test's segment.
        x = unsafe { (h.shmat)(id) };
    });
    assert_ne!(x as isize, -1);
    assert_eq!(
        about(&log, x, M2),
        only(
            events,
            [(bits::SHMAT, 0, id as usize, x as isize), (bits::VM_MAPPED, x, M2, 0)]
        ),
        "{log:x?}"
    );
    // SAFETY: detaches it.
    assert_eq!(unsafe { (h.shmdt)(x) }, 0);
    let b = ordinary_aligned(h, M2);
    let log = recorded(|| {
        // SAFETY: attaches the test's segment over the test's memory.
        x = unsafe { (h.shmat_at)(id, b, libc::SHM_REMAP) };
    });
    assert_eq!(x, b, "shmat(SHM_REMAP) errno {}", errno());
    // SAFETY: inside the segment's page, which reads zeros.
    assert_eq!(unsafe { *((b + M2 - 1) as *const u8) }, 0, "the kernel replaced 2 MiB");
    assert_eq!(
        about(&log, b, M2),
        only(events, replaced_by((bits::SHMAT, b, id as usize, b as isize), b, M2)),
        "{log:x?}"
    );
    // SAFETY: the test's attachment (over all of `b`).
    assert_eq!(unsafe { (h.shmdt)(b) }, 0);

    // A SHM_HUGETLB segment of 3 MiB (two huge pages), its attachment
    // split by `mprotect` of the second: `shmdt` unmaps both pieces (Linux
    // looks for them up to the segment's file size, 4 MiB, not 3).
    // SAFETY: a private segment, removed when `_removed3` drops.
    let id3 = unsafe {
        libc::shmget(
            libc::IPC_PRIVATE,
            M2 + M2 / 2,
            libc::IPC_CREAT | libc::SHM_HUGETLB | 0o600,
        )
    };
    if id3 < 0 {
        eprintln!(
            "hugetlb: a second shmget(SHM_HUGETLB) refused (errno {}): not checked",
            errno()
        );
        return;
    }
    let _removed3 = RemovedAtEnd(id3);
    // SAFETY: attaches the test's segment; its second huge page made
    // read-only (a piece of its own).
    unsafe {
        x = (h.shmat)(id3);
        assert_ne!(x as isize, -1, "shmat: errno {}", errno());
        assert_eq!(libc::mprotect((x + M2) as *mut libc::c_void, M2, libc::PROT_READ), 0);
    }
    // SAFETY: detaches it.
    let log = recorded(|| assert_eq!(unsafe { (h.shmdt)(x) }, 0));
    assert_eq!(
        about(&log, x, 2 * M2),
        only(events, [(bits::VM_UNMAPPED, x, 2 * M2, 0), (bits::SHMDT, x, 0, 0)]),
        "{log:x?}"
    );
}

/// A SysV segment removed when this drops.
struct RemovedAtEnd(i32);

impl Drop for RemovedAtEnd {
    fn drop(&mut self) {
        // SAFETY: removes the test's segment (gone with its last detach).
        unsafe { libc::shmctl(self.0, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}

/// Every event of a `call` that maps `size` bytes at `at` over what lay
/// there (`MAP_FIXED`, `SHM_REMAP`), in order: the old mapping
/// unmapped, the call, the new mapping.
fn replaced_by(call: Rec, at: usize, size: usize) -> [Rec; 3] {
    [(bits::VM_UNMAPPED, at, size, 0), call, (bits::VM_MAPPED, at, size, 0)]
}

/// Every event of `mremap(from, size, size, MREMAP_MAYMOVE |
/// MREMAP_FIXED, to)` that moves `moved` bytes (the kernel's: `size` in
/// whole pages, huge ones for hugetlb memory), in order: the
/// destination's old mapping unmapped, then the source, the call, the
/// moved mapping at the destination.
fn moved(from: usize, size: usize, to: usize, moved: usize) -> [Rec; 4] {
    [
        (bits::VM_UNMAPPED, to, moved, 0),
        (bits::VM_UNMAPPED, from, moved, 0),
        (bits::MREMAP, from, size, to as isize),
        (bits::VM_MAPPED, to, moved, 0),
    ]
}

/// Calls that map at a fixed address replace what lay there, which the
/// kernel unmaps without a `munmap` call: each reports `VM_UNMAPPED` of
/// the range it replaces first, `MAP_FIXED_NOREPLACE` replaces nothing.
fn check_replacing_calls(h: &Helper, events: u32) {
    // Two neighbouring 64 KiB mappings to replace (unrecorded).
    // SAFETY: the helper functions pass what libc expects; every mapping
    // made here is the test's own and unmapped at the end.
    let r = unsafe { (h.mmap)(2 * K64) };
    assert_ne!(r as isize, -1);

    // mmap(MAP_FIXED) over the first.
    let mut x = 0;
    // SAFETY: as above.
    let log = recorded(|| x = unsafe { (h.mmap_at)(r, K64, libc::MAP_FIXED) });
    assert_eq!(x, r);
    assert_eq!(
        about(&log, r, K64),
        only(events, replaced_by((bits::MMAP, r, K64, r as isize), r, K64)),
        "{log:x?}"
    );

    // MAP_FIXED_NOREPLACE over it fails (EEXIST; a kernel older than 4.17
    // reads it as a hint and maps elsewhere): nothing is unmapped.
    // SAFETY: as above.
    let log = recorded(|| x = unsafe { (h.mmap_at)(r, K64, libc::MAP_FIXED_NOREPLACE) });
    assert_ne!(x, r);
    assert!(
        !about(&log, r, K64).iter().any(|e| e.0 == bits::VM_UNMAPPED),
        "{log:x?}"
    );
    if x as isize != -1 {
        // SAFETY: the mapping the old kernel made elsewhere.
        unsafe { (h.munmap)(x, K64) };
    }

    // mremap(MREMAP_FIXED) of a third mapping onto the second: the
    // destination's old mapping goes, then the source, and the moved
    // mapping appears at the destination.
    // SAFETY: as above.
    let s = unsafe { (h.mmap)(K64) };
    assert_ne!(s as isize, -1);
    let to = r + K64;
    // SAFETY: as above.
    let log = recorded(|| {
        set_errno(77);
        // SAFETY: as above.
        x = unsafe { (h.mremap_to)(s, K64, K64, to) };
        assert_eq!(errno(), 77, "errno survives the handlers of the replaced range");
    });
    assert_eq!(x, to);
    let log: Vec<Rec> = log
        .into_iter()
        .filter(|e| near(e, s, K64) || near(e, to, K64))
        .collect();
    assert_eq!(log, only(events, moved(s, K64, to, K64)), "{log:x?}");

    // mremap(MREMAP_DONTUNMAP) moves the pages and leaves the source
    // mapped, empty: unmapped, then mapped again after the call (where the
    // kernel has the flag: 5.7 and later, for private anonymous memory).
    // SAFETY: as above.
    let s = unsafe { (h.mmap)(K64) };
    assert_ne!(s as isize, -1);
    let log = recorded(|| {
        set_errno(77);
        // SAFETY: as above.
        x = unsafe { (h.mremap_flags)(s, K64, K64, libc::MREMAP_MAYMOVE | libc::MREMAP_DONTUNMAP) };
        if x as isize != -1 {
            assert_eq!(errno(), 77, "errno survives the handlers of the emptied source");
        }
    });
    if x as isize == -1 {
        assert_eq!(errno(), libc::EINVAL, "only an old kernel refuses MREMAP_DONTUNMAP");
    } else {
        let log: Vec<Rec> = log.into_iter().filter(|e| near(e, s, K64) || near(e, x, K64)).collect();
        assert_eq!(
            log,
            only(
                events,
                [
                    (bits::VM_UNMAPPED, s, K64, 0),
                    (bits::MREMAP, s, K64, x as isize),
                    (bits::VM_MAPPED, x, K64, 0),
                    (bits::VM_MAPPED, s, K64, 0)
                ]
            ),
            "{log:x?}"
        );
        // SAFETY: the moved mapping.
        unsafe { (h.munmap)(x, K64) };
    }
    // SAFETY: the source, mapped either way.
    unsafe { (h.munmap)(s, K64) };

    // shmat(SHM_REMAP) over the first.
    // SAFETY: a private segment, removed below.
    let id = unsafe { libc::shmget(libc::IPC_PRIVATE, K64, libc::IPC_CREAT | 0o600) };
    assert!(id >= 0);
    // SAFETY: as above.
    let log = recorded(|| x = unsafe { (h.shmat_at)(id, r, libc::SHM_REMAP) });
    assert_eq!(x, r, "shmat(SHM_REMAP) errno {}", errno());
    assert_eq!(
        about(&log, r, K64),
        only(events, replaced_by((bits::SHMAT, r, id as usize, r as isize), r, K64)),
        "{log:x?}"
    );
    // SAFETY: detaching the segment attached above, and removing it; then
    // unmapping the second mapping.
    unsafe {
        assert_eq!((h.shmdt)(r), 0);
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
        assert_eq!((h.munmap)(to, K64), 0);
    }
}

const VM: u32 = bits::VM_MAPPED | bits::VM_UNMAPPED;

/// A registration cache's subscription, `VM_UNMAPPED` alone: the hooks of
/// calls that map (whose own events it does not want) still report the
/// ranges they replace.
fn check_replacing_calls_for_unmaps_alone(mode: HookMode) {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut session = Session::new(mode);
    session.handler(bits::VM_UNMAPPED, 0, &record);
    check_replacing_calls(helper(), bits::VM_UNMAPPED);
}

/// What the handler of [`check_mapping_during_a_discard`] does at the
/// first `VM_UNMAPPED` it records.
static DURING_DISCARD: Mutex<Option<Box<dyn Fn() + Send>>> = Mutex::new(None);

/// [`record`], and at the first `VM_UNMAPPED` recorded, the action in
/// `DURING_DISCARD` (once).
fn record_then_act(e: &mut Event) {
    record(e);
    if matches!(e, Event::VmUnmapped(_))
        && RECORDING.load(Ordering::Acquire)
        && RECORDER.load(Ordering::Acquire) == thread_id()
    {
        // Taken, and the lock let go, before the action (whose own
        // unmaps come here again).
        let act = DURING_DISCARD.lock().unwrap().take();
        if let Some(act) = act {
            act();
        }
    }
}

/// A mapping of a file made, or moved, while a call that discards its
/// pages runs (after the hook looked at `/proc/self/maps`, before the
/// call: here by the handler of the hook's first report, at an address
/// below the ones reported, which the look has passed; or a reported one
/// moved there, or given other pages of the file by `remap_file_pages`)
/// is reported after
/// the call, with every range of the file again: late, not lost. For a
/// handler of `VM_UNMAPPED` alone, a registration cache's subscription,
/// whose hooks of mmap otherwise would not dispatch a plain mmap.
fn check_mapping_during_a_discard(mode: HookMode) {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let mut session = Session::new(mode);
    session.handler(bits::VM_UNMAPPED, 0, &record_then_act);
    let page = page_size();
    let p = |n: usize| (n * page) as i64;
    // SAFETY: a new memfd, closed below; the mappings are the test's own,
    // inside a reservation of its own, unmapped below; the helpers pass
    // what libc expects.
    unsafe {
        let fd = libc::memfd_create(c"memhook-during".as_ptr(), 0);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, p(16)), 0);
        // 64 pages: two holes (0-15, 16-31) below a shared (32-47) and a
        // private (48-63) mapping of the file.
        let r = libc::mmap(
            std::ptr::null_mut(),
            64 * page,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        ) as usize;
        assert_ne!(r, libc::MAP_FAILED as usize);
        let (low, hole, shared, private) = (r, r + 16 * page, r + 32 * page, r + 48 * page);
        for (at, flags) in [(shared, libc::MAP_SHARED), (private, libc::MAP_PRIVATE)] {
            assert_eq!((h.mmap_file)(at, 16 * page, flags | libc::MAP_FIXED, fd, 0), at);
        }
        let punch = |fd: i32| (h.fallocate)(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, p(2), p(3));
        let pages_2_to_4 = |m: usize| (bits::VM_UNMAPPED, m + 2 * page, 3 * page, 0);

        // A new shared mapping in the upper hole (a hint, with no fixed
        // flag: the dispatch of a plain mmap of a file is what is tested).
        assert_eq!(libc::munmap(low as *mut libc::c_void, 32 * page), 0);
        let made = Arc::new(AtomicUsize::new(0));
        let m = made.clone();
        *DURING_DISCARD.lock().unwrap() = Some(Box::new(move || {
            m.store(
                (h.mmap_file)(hole, 16 * page, libc::MAP_SHARED, fd, 0),
                Ordering::SeqCst,
            );
        }));
        let log = recorded(|| assert_eq!(punch(fd), 0));
        assert_eq!(made.load(Ordering::SeqCst), hole, "the hint was taken");
        assert_eq!(
            about(&log, low, 64 * page),
            [
                pages_2_to_4(shared),
                pages_2_to_4(private),
                pages_2_to_4(hole),
                pages_2_to_4(shared),
                pages_2_to_4(private)
            ],
            "{log:x?}"
        );
        assert_eq!(DURING_DISCARD.lock().unwrap().take().map(|_| ()), None);

        // The first mapping reported (the new one) moved down into the
        // lower hole (mremap) by the handler of its report.
        *DURING_DISCARD.lock().unwrap() = Some(Box::new(move || {
            assert_eq!((h.mremap_to)(hole, 16 * page, 16 * page, low), low);
        }));
        let log = recorded(|| assert_eq!(punch(fd), 0));
        assert_eq!(
            about(&log, low, 64 * page),
            [
                pages_2_to_4(hole),
                // The move: the destination's range, then the source.
                (bits::VM_UNMAPPED, low, 16 * page, 0),
                (bits::VM_UNMAPPED, hole, 16 * page, 0),
                pages_2_to_4(shared),
                pages_2_to_4(private),
                pages_2_to_4(low),
                pages_2_to_4(shared),
                pages_2_to_4(private)
            ],
            "{log:x?}"
        );

        // No mapping made meanwhile: one report of each.
        let log = recorded(|| assert_eq!(punch(fd), 0));
        assert_eq!(
            about(&log, low, 64 * page),
            [pages_2_to_4(low), pages_2_to_4(shared), pages_2_to_4(private)],
            "{log:x?}"
        );

        // The first mapping reported given the file's pages 2 to 4 at its
        // pages 8 to 10 (remap_file_pages), past what the look saw there,
        // by the handler of its report (where the call works: not under
        // qemu-user, which answers ENOSYS).
        if remap_file_pages_works().is_ok() {
            *DURING_DISCARD.lock().unwrap() = Some(Box::new(move || {
                assert_eq!((h.remap_file_pages)(low + 8 * page, 3 * page, 0, 2, 0), 0);
            }));
            let log = recorded(|| assert_eq!(punch(fd), 0));
            assert_eq!(
                about(&log, low, 64 * page),
                [
                    pages_2_to_4(low),
                    (bits::VM_UNMAPPED, low + 8 * page, 3 * page, 0),
                    pages_2_to_4(shared),
                    pages_2_to_4(private),
                    pages_2_to_4(low),
                    (bits::VM_UNMAPPED, low + 8 * page, 3 * page, 0),
                    pages_2_to_4(shared),
                    pages_2_to_4(private)
                ],
                "{log:x?}"
            );
        }
        *DURING_DISCARD.lock().unwrap() = None;
        for m in [low, shared, private] {
            assert_eq!(libc::munmap(m as *mut libc::c_void, 16 * page), 0);
        }
        libc::close(fd);
    }
}

#[test]
fn a_mapping_made_during_a_discard_is_reported_in_bistro_mode() {
    check_mapping_during_a_discard(HookMode::Bistro);
}

#[test]
fn a_mapping_made_during_a_discard_is_reported_in_reloc_mode() {
    check_mapping_during_a_discard(HookMode::Reloc);
}

#[test]
fn replacing_calls_reach_a_handler_of_unmaps_alone_in_bistro_mode() {
    check_replacing_calls_for_unmaps_alone(HookMode::Bistro);
}

#[test]
fn replacing_calls_reach_a_handler_of_unmaps_alone_in_reloc_mode() {
    check_replacing_calls_for_unmaps_alone(HookMode::Reloc);
}

#[test]
fn every_function_in_bistro_mode() {
    check_mode(HookMode::Bistro, bits::ALL_EVENTS);
}

#[test]
fn every_function_in_reloc_mode() {
    check_mode(HookMode::Reloc, bits::ALL_EVENTS);
}

#[test]
fn every_function_in_bistro_mode_with_aggregate_events_alone() {
    check_mode(HookMode::Bistro, VM);
}

#[test]
fn every_function_in_reloc_mode_with_aggregate_events_alone() {
    check_mode(HookMode::Reloc, VM);
}

/// A discarding `madvise` over a page memhook wrote (a patched entry's,
/// a trampoline's) leaves that page alone (`memhook::kept`): the entry
/// keeps its jump and its events, the trampoline its code. Before, the
/// entry's page read the library file's bytes again (the function
/// unhooked, its calls unreported: as under cuda-gdb, whose
/// `libcudadebugger` had the driver's entries back to their own bytes),
/// and a hooked call through the trampoline's zeroed page crashed. Made
/// by the program's `madvise` with no handler wanting its events, then
/// with one (the hook's dispatch), and by `syscall(SYS_madvise)`; each
/// call answers 0 and is counted.
#[test]
fn a_discard_of_memhooks_own_pages_leaves_them_alone() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let mut session = Session::new(HookMode::Bistro);
    let munmap_bistro = memhook::status()
        .iter()
        .any(|s| s.function == "munmap" && s.mode == HookMode::Bistro && s.installed);
    if !munmap_bistro {
        eprintln!("munmap not patched here (a debugger's breakpoint?): not checked");
        return;
    }
    let page = page_size();
    let down = |p: usize| p & !(page - 1);
    // libc's own entry (a program built with AddressSanitizer has its own
    // `munmap` first in the global scope).
    let entry = libc_function(c"munmap");
    let original = memhook::host::original("munmap").expect("munmap's original");
    // SAFETY: the entry's first bytes, mapped and readable code.
    let bytes = || unsafe { std::ptr::read_volatile(entry as *const [u8; 16]) };
    let patched = bytes();
    assert!(memhook::kept::holds(entry, 1) && memhook::kept::holds(original, 1));
    let before = memhook::kept::discards_kept();
    let syscall_madvise = |at: usize, advice: i32| {
        // SAFETY: the helper's `syscall`, with madvise's three arguments.
        unsafe {
            (h.syscall)(
                libc::SYS_madvise,
                at as libc::c_long,
                page as libc::c_long,
                advice.into(),
                0,
                0,
                0,
            )
        }
    };
    // SAFETY: madvise of whole pages that memhook keeps (the calls are
    // made on none of them); a page of the test's own otherwise.
    unsafe {
        // No handler wants the call's events: the hook's shortest path.
        assert_eq!((h.madvise)(down(entry), page, libc::MADV_DONTNEED), 0);
        assert_eq!((h.madvise)(down(original), page, libc::MADV_DONTNEED), 0);
    }
    session.handler(bits::VM_UNMAPPED | bits::MADVISE, 0, &record);
    // SAFETY: as above.
    unsafe {
        assert_eq!((h.madvise)(down(original), page, libc::MADV_FREE), 0);
    }
    assert_eq!(syscall_madvise(down(entry), libc::MADV_DONTNEED), 0);
    assert_eq!(syscall_madvise(down(original), libc::MADV_DONTNEED), 0);
    assert_eq!(bytes(), patched, "munmap's patch was taken away");
    assert_eq!(memhook::kept::discards_kept() - before, 5);
    // The hook reports, and goes on through the trampoline.
    let mut p = 0;
    let log = recorded(|| {
        // SAFETY: a new page of the test's own, unmapped at once.
        unsafe {
            p = (h.mmap)(page);
            assert_eq!((h.munmap)(p, page), 0);
        }
    });
    assert!(
        about(&log, p, page).contains(&(bits::VM_UNMAPPED, p, page, 0)),
        "no VM_UNMAPPED of the page: {log:x?}"
    );
    // The original itself, unreported.
    // SAFETY: munmap's original, called with munmap's signature on a new
    // page of the test's own.
    let log = recorded(|| unsafe {
        let orig: unsafe extern "C" fn(usize, usize) -> i32 = cast(original);
        p = (h.mmap)(page);
        assert_eq!(orig(p, page), 0);
    });
    assert_eq!(only(bits::VM_UNMAPPED, about(&log, p, page)), []);
    // A page of the test's own is discarded as asked.
    // SAFETY: the test's own new page, written, discarded and unmapped.
    unsafe {
        let q = (h.mmap)(page);
        *(q as *mut u8) = 7;
        assert_eq!((h.madvise)(q, page, libc::MADV_DONTNEED), 0);
        assert_eq!(*(q as *const u8), 0);
        assert_eq!((h.munmap)(q, page), 0);
    }
    assert_eq!(memhook::kept::discards_kept() - before, 5);
}

/// `madvise` by the system call instruction itself, which no hook sees.
///
/// # Safety
///
/// As `madvise`'s: the advice may discard what the range holds.
unsafe fn raw_madvise(at: usize, len: usize, advice: i32) -> isize {
    let ret: isize;
    // SAFETY: the madvise system call; the kernel clobbers only what is
    // named (rcx and r11 on x86_64).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") libc::SYS_madvise as isize => ret, in("rdi") at,
            in("rsi") len, in("rdx") advice as isize, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    // SAFETY: as above (x0 holds the result).
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("svc 0", in("x8") libc::SYS_madvise as isize, inlateout("x0") at as isize => ret,
            in("x1") len, in("x2") advice as isize, options(nostack));
    }
    ret
}

/// Where a discard memhook cannot see takes a patch away (a system call
/// made by the instruction itself, here), the function's status says so:
/// not installed, its jump gone. Before, it said installed (as under
/// cuda-gdb, whose calls reached the driver's own bytes while `memhook
/// run` listed the bistro patches as made). In a child: the patch stays
/// lost there.
#[test]
fn a_patch_taken_away_unseen_is_not_listed_as_installed() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let session = Session::new(HookMode::Bistro);
    let is_munmap = |s: &memhook::FunctionStatus| s.function == "munmap" && s.mode == HookMode::Bistro;
    if !memhook::status().iter().any(|s| is_munmap(s) && s.installed) {
        eprintln!("munmap not patched here (a debugger's breakpoint?): not checked");
        return;
    }
    let page = page_size();
    // libc's own entry (a program built with AddressSanitizer has its own
    // `munmap` first in the global scope).
    let entry = libc_function(c"munmap");
    // SAFETY: the child discards a page of libc's code (read back from the
    // file: munmap unpatched), reads memhook's status one entry at a time
    // (no allocation) and leaves by `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            if raw_madvise(entry & !(page - 1), page, libc::MADV_DONTNEED) != 0 {
                libc::_exit(3);
            }
            let mut i = 0;
            let code = loop {
                match memhook::status_at(i) {
                    (Some(s), _) if is_munmap(&s) => {
                        break if s.installed {
                            1
                        } else if s.reason.contains("is gone") {
                            0
                        } else {
                            2
                        };
                    }
                    (Some(_), _) => i += 1,
                    (None, _) => break 4,
                }
            };
            libc::_exit(code);
        }
    }
    let status = wait_for_child(pid, std::time::Duration::from_secs(20)).expect("the child hung");
    drop(session);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child exit {} (1: still listed installed, 2: another reason, 3: madvise failed, 4: no munmap entry)",
        libc::WEXITSTATUS(status)
    );
}

/// The look at `/proc/self/maps` some hooks make before their call
/// (`shmdt`, `madvise(MADV_REMOVE)`) may be refused (`EMFILE`, in a
/// process at its limit of descriptors): a call that succeeds still
/// leaves errno as it found it, and each refused look is counted
/// (`maps::looks_failed`: a file's other mappings may have gone
/// unreported); with descriptors to spare, none is. In a child, so that
/// the limit binds no other test's thread.
#[test]
fn a_refused_look_leaves_errno_alone() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let mut session = Session::new(HookMode::Bistro);
    session.handler(bits::ALL_EVENTS, 0, &record);
    let page = page_size();
    // SAFETY: a private segment attached, and a memfd mapped, both let go
    // below (the child's copies die with it); the child calls only the
    // helpers and async-signal-safe functions before `_exit`.
    unsafe {
        let id = libc::shmget(libc::IPC_PRIVATE, page, libc::IPC_CREAT | 0o600);
        assert!(id >= 0);
        let a = (h.shmat)(id);
        assert_ne!(a, usize::MAX);
        libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
        let fd = libc::memfd_create(c"memhook-emfile".as_ptr(), 0);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, (2 * page) as libc::off_t), 0);
        let m = map_file(fd, 2, 0, true);
        let pid = libc::fork();
        if pid == 0 {
            // Every descriptor from the lowest free one on refused.
            let free = libc::dup(0);
            libc::close(free);
            let mut limit = std::mem::zeroed::<libc::rlimit>();
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            limit.rlim_cur = free as libc::rlim_t;
            let refused = libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
                && libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY) == -1;
            let looks = memhook::maps::looks_failed();
            set_errno(77);
            let detached = (h.shmdt)(a) == 0 && errno() == 77;
            set_errno(77);
            let removed = (h.madvise)(m, page, libc::MADV_REMOVE) == 0 && errno() == 77;
            // Both looks failed, and are counted (the madvise's look for
            // the memfd's other mappings is the one whose reports are lost).
            let counted = memhook::maps::looks_failed() >= looks + 2;
            let code =
                i32::from(!refused) | i32::from(!detached) << 1 | i32::from(!removed) << 2 | i32::from(!counted) << 3;
            libc::_exit(code);
        }
        assert!(pid > 0);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child exit {} (1: opens not refused, 2: errno after shmdt, 4: errno after madvise, \
             8: the failed looks not counted)",
            libc::WEXITSTATUS(status)
        );
        // With descriptors to spare, the same calls' looks are made.
        let looks = memhook::maps::looks_failed();
        assert_eq!((h.madvise)(m, page, libc::MADV_REMOVE), 0);
        assert_eq!(
            memhook::maps::looks_failed(),
            looks,
            "a look counted failed that was made"
        );
        assert_eq!((h.shmdt)(a), 0);
        libc::munmap(m as *mut libc::c_void, 2 * page);
        libc::close(fd);
    }
}

/// Arguments the kernel refuses, at the top of the address space and
/// past it (addresses no process can map: above 2^57, past five-level
/// paging's user space) and sizes up to the largest: every hooked
/// function gives the kernel's answer, and no hook computes a range past
/// the top (a panic there, in the test's debug build, ends the process).
/// The hooks' arithmetic on what the caller gives is checked. (Not under
/// qemu-user, which answers some of these calls as it likes, a `madvise`
/// past its guest's space with 0, and fails an assertion of its own on
/// another.)
#[test]
fn arguments_at_the_top_of_the_address_space_are_the_kernels_to_refuse() {
    if std::env::var_os("MEMHOOK_TEST_QEMU").is_some() {
        eprintln!("under qemu-user: not checked");
        return;
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    for mode in [HookMode::Bistro, HookMode::Reloc] {
        let mut session = Session::new(mode);
        session.handler(bits::ALL_EVENTS, -1, &record);
        session.handler(bits::ALL_EVENTS, 0, &record);
        let page = page_size();
        let top = usize::MAX & !(page - 1);
        let addresses = [1usize << 57, (1 << 63) + 1, top - page, top, usize::MAX - 1, usize::MAX];
        let sizes = [1usize, page, 2 * page + 1, 1 << 62, usize::MAX - page + 1, usize::MAX];
        let refused = |what: &str, r: isize| assert_eq!(r, -1, "{mode:?} {what}");
        for &a in &addresses {
            for &n in &sizes {
                // SAFETY: nothing is mapped at these addresses; the kernel
                // refuses each call (checked), and the helpers pass what
                // libc expects.
                unsafe {
                    let what = format!("{a:#x} {n:#x}");
                    refused(&format!("munmap {what}"), (h.munmap)(a, n) as isize);
                    refused(
                        &format!("madvise {what}"),
                        (h.madvise)(a, n, libc::MADV_DONTNEED) as isize,
                    );
                    refused(
                        &format!("madvise remove {what}"),
                        (h.madvise)(a, n, libc::MADV_REMOVE) as isize,
                    );
                    for flags in [0, libc::MREMAP_MAYMOVE] {
                        refused(
                            &format!("mremap {what} {flags}"),
                            (h.mremap_flags)(a, n, page, flags) as isize,
                        );
                        refused(
                            &format!("mremap grow {what} {flags}"),
                            (h.mremap_flags)(a, page, n, flags) as isize,
                        );
                    }
                    refused(&format!("mremap to {what}"), (h.mremap_to)(a, page, n, top) as isize);
                    refused(&format!("mmap at {what}"), (h.mmap_at)(a, n, libc::MAP_FIXED) as isize);
                    refused(
                        &format!("mmap at {what} no replace"),
                        (h.mmap_at)(a, n, libc::MAP_FIXED_NOREPLACE) as isize,
                    );
                    refused(&format!("shmdt {what}"), (h.shmdt)(a) as isize);
                    refused(&format!("remap {what}"), (h.remap_file_pages)(a, n, 0, 0, 0) as isize);
                    let iov = [iovec(a, n), iovec(a, n)];
                    let pidfd = -1;
                    let r = (h.process_madvise)(pidfd, iov.as_ptr(), 2, libc::MADV_DONTNEED, 0);
                    // (-2: no process_madvise in this glibc.)
                    refused(&format!("process_madvise {what}"), if r == -2 { -1 } else { r });
                }
            }
        }
        // SAFETY: sizes no process can have, and breaks no heap can
        // reach or shrink by: each refused (ENOMEM), nothing changed.
        unsafe {
            for &n in &sizes[3..] {
                refused(&format!("mmap {n:#x}"), (h.mmap)(n) as isize);
            }
            for increment in [isize::MAX, 1 << 62, -(1 << 62), isize::MIN + 1, isize::MIN] {
                refused(&format!("sbrk {increment:#x}"), (h.sbrk)(increment) as isize);
            }
            for &a in &addresses {
                refused(&format!("brk {a:#x}"), (h.brk)(a) as isize);
            }
        }
        // SAFETY: as above: a segment attached at an address the kernel
        // refuses, then removed.
        unsafe {
            let id = libc::shmget(libc::IPC_PRIVATE, page, libc::IPC_CREAT | 0o600);
            assert!(id >= 0);
            for &a in &addresses {
                for flags in [0, libc::SHM_RND, libc::SHM_REMAP, libc::SHM_RND | libc::SHM_REMAP] {
                    refused(&format!("shmat {a:#x} {flags}"), (h.shmat_at)(id, a, flags) as isize);
                }
            }
            libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
        }
        drop(session);
    }
}

/// A pre-handler that supplies the result for one marker length.
const MARKER: usize = 0x7e57_0000;
fn fake_mmap(e: &mut Event) {
    if let Event::Mmap(m) = e
        && m.size == 12345 * 4096
    {
        m.result = MARKER;
    }
}

#[test]
fn priorities_and_result_override() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let mut session = Session::new(HookMode::Bistro);
    session.handler(bits::MMAP, -5, &fake_mmap);
    session.handler(bits::MMAP | bits::VM_MAPPED, 3, &record);
    let mut p = 0;
    // SAFETY: the helper wraps mmap; the original is skipped here.
    let log = recorded(|| p = unsafe { (h.mmap)(12345 * 4096) });
    assert_eq!(p, MARKER, "a pre-handler's valid result skips the original");
    assert_eq!(
        about(&log, MARKER, 12345 * 4096),
        [
            (bits::MMAP, 0, 12345 * 4096, MARKER as isize),
            (bits::VM_MAPPED, MARKER, 12345 * 4096, 0)
        ]
    );
}

static NESTED_TARGET: AtomicUsize = AtomicUsize::new(0);

/// On the unmap of one range, unmaps another (as a registration cache's
/// cleanup does): the nested munmap must be delivered too.
fn cleanup(e: &mut Event) {
    record(e);
    if let Event::VmUnmapped(v) = e
        && v.size == 7 * 4096
    {
        let other = NESTED_TARGET.swap(0, Ordering::SeqCst);
        if other != 0 {
            // SAFETY: `other` is a mapping this test made for this purpose.
            unsafe { libc::munmap(other as *mut libc::c_void, 4096) };
        }
    }
}

#[test]
fn a_handler_that_unmaps_gets_its_own_events() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let mut session = Session::new(HookMode::Bistro);
    session.handler(bits::VM_UNMAPPED | bits::MUNMAP, 0, &cleanup);
    // SAFETY: the helper wraps mmap.
    let (a, b) = unsafe { ((h.mmap)(7 * 4096), (h.mmap)(4096)) };
    NESTED_TARGET.store(b, Ordering::SeqCst);
    // SAFETY: unmapping what was mapped above.
    let log = recorded(|| assert_eq!(unsafe { (h.munmap)(a, 7 * 4096) }, 0));
    let kinds: Vec<(u32, usize)> = log
        .iter()
        .filter(|r| near(r, a, 7 * 4096) || near(r, b, 4096))
        .map(|r| (r.0, r.1))
        .collect();
    assert_eq!(
        kinds,
        [
            (bits::VM_UNMAPPED, a),
            (bits::VM_UNMAPPED, b),
            (bits::MUNMAP, b),
            (bits::MUNMAP, a)
        ]
    );
}

static MARK_MAPS: AtomicUsize = AtomicUsize::new(0);
static MARK_UNMAPS: AtomicUsize = AtomicUsize::new(0);
// Seven pages: no other mapping of the test process has this size (five
// pages is the size of a thread's signal stack on aarch64).
const MARK_SIZE: usize = 7 * 4096;

thread_local! {
    /// Set on the test's threads while they map and unmap: the process's
    /// other mappings of the same size (thread start-up, on some
    /// platforms) are not the test's.
    static MARKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count_marked(e: &mut Event) {
    if !MARKING.with(|m| m.get()) {
        return;
    }
    match *e {
        Event::Mmap(m) if m.size == MARK_SIZE && m.result != usize::MAX => {
            MARK_MAPS.fetch_add(1, Ordering::Relaxed);
        }
        Event::Munmap(m) if m.size == MARK_SIZE && m.result == 0 => {
            MARK_UNMAPS.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
}

#[test]
fn eight_threads_mapping_are_counted_exactly() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut session = Session::new(HookMode::Bistro);
    session.handler(bits::MMAP | bits::MUNMAP, 0, &count_marked);
    let (m0, u0) = (MARK_MAPS.load(Ordering::SeqCst), MARK_UNMAPS.load(Ordering::SeqCst));
    const EACH: usize = 2000;
    // Half the threads through libc's functions, half by `syscall`.
    let threads: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let h = helper();
                MARKING.with(|m| m.set(true));
                for _ in 0..EACH {
                    if i % 2 == 0 {
                        // SAFETY: map and unmap a private region.
                        unsafe {
                            let p = (h.mmap)(MARK_SIZE);
                            assert_ne!(p as isize, -1);
                            assert_eq!((h.munmap)(p, MARK_SIZE), 0);
                        }
                    } else {
                        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
                        let size = MARK_SIZE as libc::c_long;
                        let p = sys(h, libc::SYS_mmap, &[0, size, 3, flags.into(), -1, 0]);
                        assert_ne!(p, -1);
                        assert_eq!(sys(h, libc::SYS_munmap, &[p, size]), 0);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(MARK_MAPS.load(Ordering::SeqCst) - m0, 8 * EACH);
    assert_eq!(MARK_UNMAPS.load(Ordering::SeqCst) - u0, 8 * EACH);
}

#[test]
fn fork_while_another_thread_dispatches() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut session = Session::new(HookMode::Bistro);
    session.handler(bits::MMAP | bits::MUNMAP, 0, &count_marked);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let busy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let h = helper();
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: map and unmap a private region.
                unsafe {
                    let p = (h.mmap)(MARK_SIZE);
                    (h.munmap)(p, MARK_SIZE);
                }
            }
        })
    };
    for _ in 0..20 {
        // SAFETY: the child only calls async-signal-safe-enough code that
        // memhook makes safe after fork (its reset), then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let before = MARK_MAPS.load(Ordering::SeqCst);
            let h = helper();
            MARKING.with(|m| m.set(true));
            // SAFETY: as above.
            let ok = unsafe {
                let p = (h.mmap)(MARK_SIZE);
                (h.munmap)(p, MARK_SIZE) == 0
            };
            // Registration must not wait for the parent's readers.
            let registered = memhook::set_handler(bits::MUNMAP, 1, HandlerFn::Rust(&record)).is_ok();
            let seen = MARK_MAPS.load(Ordering::SeqCst) == before + 1;
            let code = i32::from(!ok) | i32::from(!registered) << 1 | i32::from(!seen) << 2;
            // SAFETY: leaving the child without running the parent's atexit.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child exit {} (1: map/unmap failed, 2: registration failed, 4: its mmap not seen)",
            libc::WEXITSTATUS(status)
        );
    }
    stop.store(true, Ordering::Relaxed);
    busy.join().unwrap();
}

/// The C library's own entry of `name`, where bistro patches: libc's,
/// or, for a function libc does not define (the loader's in libdl and
/// `shm_open` in librt, before glibc 2.34), the global scope's. Not what
/// the global scope finds first where libc defines it: a program built
/// with AddressSanitizer defines `mmap`, `munmap` and the like itself
/// (its interceptors).
fn libc_function(name: &std::ffi::CStr) -> usize {
    let mut f = defined_in(c"libc.so.6", name);
    if f == 0 {
        // SAFETY: a NUL-terminated name and the pseudo-handle RTLD_DEFAULT.
        f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    }
    assert_ne!(f, 0, "no {name:?} loaded");
    f
}

/// Another hooker's patch of the C library's entry of `name` (over
/// memhook's patch where memhook installed first), made with bistro:
/// `hook` runs, and `original` holds the way on.
///
/// # Safety
///
/// `hook` has the function's signature and calls `original`'s value as
/// the function itself (or does its work).
unsafe fn patch_libc(name: &std::ffi::CStr, hook: usize, original: &AtomicUsize) -> memhook::bistro::Hook {
    // SAFETY: the caller's contract.
    unsafe { memhook::bistro::Hook::patch_with(libc_function(name), hook, original) }.unwrap()
}

/// Where the loaded library `lib` (or one it depends on) defines `name`;
/// 0 where `lib` is not loaded or nothing defines it.
fn defined_in(lib: &std::ffi::CStr, name: &std::ffi::CStr) -> usize {
    // SAFETY: NUL-terminated names; RTLD_NOLOAD opens nothing new, and
    // the handle goes back at once (the library stays loaded).
    unsafe {
        let h = libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if h.is_null() {
            return 0;
        }
        let f = libc::dlsym(h, name.as_ptr()) as usize;
        libc::dlclose(h);
        f
    }
}

/// The first bytes of the C library's entry of `name`.
fn entry_bytes(name: &std::ffi::CStr) -> [u8; 16] {
    // SAFETY: reading the first bytes of a libc function's code.
    unsafe { *(libc_function(name) as *const [u8; 16]) }
}

#[test]
fn install_uninstall_cycles_restore_the_bytes() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let names = [
        c"mmap",
        c"munmap",
        c"mremap",
        c"shmat",
        c"shmdt",
        c"brk",
        c"sbrk",
        c"madvise",
        c"process_madvise",
        c"fallocate",
        c"ftruncate",
        c"truncate",
        c"remap_file_pages",
        c"open",
        c"openat",
        c"shm_open",
        c"syscall",
        c"creat",
        c"ioctl",
    ];
    // SAFETY: NUL-terminated names and the pseudo-handle RTLD_DEFAULT.
    let names: Vec<_> = names
        .into_iter()
        .filter(|n| !unsafe { libc::dlsym(libc::RTLD_DEFAULT, n.as_ptr()) }.is_null())
        .collect();
    assert_eq!(names.len(), host_functions());
    // The loader's functions, which the host hooks alone in bistro mode
    // patch too (to follow dlopen and dlclose).
    let loader = [c"dlopen", c"dlclose", c"dlsym", c"dlvsym"];
    let before: Vec<_> = names.iter().map(|n| entry_bytes(n)).collect();
    let loader_before: Vec<_> = loader.iter().map(|n| entry_bytes(n)).collect();
    for _ in 0..5 {
        let serialized = memhook::code::serializations();
        memhook::install(&config(HookMode::Bistro));
        // One batch, serialising every core three times (once on arm64,
        // whose near jump is one instruction, written by one store): the
        // host functions and the loader's four together (one at a time:
        // 48); and one for the libc of each loader namespace other tests
        // left open.
        let per_batch = if cfg!(target_arch = "x86_64") { 3 } else { 1 };
        let namespaces = memhook::namespaces().iter().filter(|n| n.functions > 0).count() as u64;
        let batches = 1 + namespaces;
        assert_eq!(memhook::code::serializations() - serialized, per_batch * batches);
        memhook::install(&config(HookMode::Bistro)); // idempotent
        assert_eq!(memhook::installed(), Some(config(HookMode::Bistro)));
        // A first registration's install from the environment leaves an
        // install made before it as it is.
        let serialized_now = memhook::code::serializations();
        assert_eq!(memhook::install_unless_installed(&config(HookMode::Reloc)), Ok(()));
        assert_eq!(memhook::installed(), Some(config(HookMode::Bistro)));
        assert_eq!(memhook::code::serializations(), serialized_now);
        assert_eq!(libc_entries(&memhook::status()), host_functions());
        // One entry at a time, the same list.
        let all = memhook::status();
        for (i, s) in all.iter().enumerate() {
            assert_eq!(memhook::status_at(i), (Some(s.clone()), all.len()));
        }
        assert_eq!(memhook::status_at(all.len()), (None, all.len()));
        assert!(names.iter().zip(&before).any(|(n, b)| entry_bytes(n) != *b), "patched");
        for (n, b) in loader.iter().zip(&loader_before) {
            assert_ne!(entry_bytes(n), *b, "{n:?} patched");
        }
        let serialized = memhook::code::serializations();
        memhook::uninstall();
        assert_eq!(
            memhook::code::serializations() - serialized,
            per_batch * batches,
            "undone in one batch, and one a namespace"
        );
        assert_eq!(memhook::installed(), None);
        let after: Vec<_> = names.iter().map(|n| entry_bytes(n)).collect();
        assert_eq!(after, before);
        let after: Vec<_> = loader.iter().map(|n| entry_bytes(n)).collect();
        assert_eq!(after, loader_before);
    }
}

static OTHER_ORIGINAL: AtomicUsize = AtomicUsize::new(0);
static OTHER_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Another hooker's mmap hook (patched before memhook installs). It
/// counts the recording thread's calls only: the test harness maps memory
/// on other threads meanwhile (a new test thread's stack).
extern "C" fn other_mmap(a: usize, l: usize, p: i32, f: i32, fd: i32, o: i64) -> usize {
    if RECORDING.load(Ordering::Acquire) && RECORDER.load(Ordering::Acquire) == thread_id() {
        OTHER_CALLS.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: the trampoline has mmap's signature.
    let orig: extern "C" fn(usize, usize, i32, i32, i32, i64) -> usize =
        unsafe { std::mem::transmute(OTHER_ORIGINAL.load(Ordering::Acquire)) };
    orig(a, l, p, f, fd, o)
}

/// [`other_mmap`] patched over the C library's `mmap` entry (over
/// memhook's patch where memhook installed first).
fn patch_other_mmap() -> memhook::bistro::Hook {
    // SAFETY: other_mmap has mmap's signature and calls its original.
    unsafe { patch_libc(c"mmap", other_mmap as *const () as usize, &OTHER_ORIGINAL) }
}

#[test]
fn coexists_with_a_hooker_that_patched_mmap_first() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let other = patch_other_mmap();
    let mut session = Session::new(HookMode::Bistro);
    session.handler(bits::MMAP, 0, &record);
    let n = OTHER_CALLS.load(Ordering::SeqCst);
    let mut p = 0;
    // SAFETY: the helper wraps mmap.
    let log = recorded(|| p = unsafe { (h.mmap)(K64) });
    assert_eq!(OTHER_CALLS.load(Ordering::SeqCst), n + 1, "the first hooker still runs");
    assert_eq!(
        about(&log, p, K64),
        [(bits::MMAP, 0, K64, p as isize)],
        "memhook sees it once"
    );
    // SAFETY: unmapping what was mapped.
    unsafe { (h.munmap)(p, K64) };
    drop(session);
    other.unpatch().map_err(|(_, e)| e).unwrap();
}

/// A truncating open of a file no mapping maps skips the read of
/// `/proc/self/maps` where memhook's filter of mapped files says so; the
/// filter must miss no mapping made since it was built: one made while
/// no handler wanted `VM_UNMAPPED` (the mmap went undispatched: the
/// registration after it forgets the filter), one glibc makes itself (a
/// stream opened with mode "m": seen by bistro's patch; in reloc mode,
/// which cannot see it, the filter is not used), and a file mapped when
/// the filter was made. Each truncating open of a mapped file reports
/// its mapping, in both modes.
#[test]
fn the_filter_of_mapped_files_misses_no_mapping() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let page = page_size();
    let dir = std::env::temp_dir().join(format!("memhook-filter-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (f, g) = (dir.join("f"), dir.join("g"));
    let (c_f, c_g) = (
        CString::new(f.to_str().unwrap()).unwrap(),
        CString::new(g.to_str().unwrap()).unwrap(),
    );
    let truncate = |path: &CString| {
        // SAFETY: the helper wraps open with a NUL-terminated path; the
        // descriptor is closed.
        unsafe {
            let fd = (h.open)(path.as_ptr(), libc::O_WRONLY | libc::O_TRUNC);
            assert!(fd >= 0, "open: errno {}", errno());
            libc::close(fd);
        }
    };
    let fill = |path: &std::path::Path| std::fs::write(path, vec![1u8; 2 * page]).unwrap();
    for mode in [HookMode::Bistro, HookMode::Reloc] {
        // (A session: a failed step leaves no handler or hooks behind.)
        let mut session = Session::new(mode);
        session.handler(bits::VM_UNMAPPED, 0, &record);
        // The filter made: g is mapped nowhere.
        fill(&g);
        let log = recorded(|| truncate(&c_g));
        assert_eq!(log, [], "{mode:?}: g mapped nowhere");
        // f mapped while no handler wants VM_UNMAPPED, then a handler again.
        for id in session.0.drain(..) {
            memhook::unset_handler(id).unwrap();
        }
        fill(&f);
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&f).unwrap();
        let m = map_file(std::os::fd::AsRawFd::as_raw_fd(&file), 2, 0, true);
        session.handler(bits::VM_UNMAPPED, 0, &record);
        let log = recorded(|| truncate(&c_f));
        assert_eq!(
            log,
            [(bits::VM_UNMAPPED, m, 2 * page, 0)],
            "{mode:?}: mapped unseen, then a handler"
        );
        // The filter made with f mapped: f's truncation still looks.
        fill(&g);
        assert_eq!(recorded(|| truncate(&c_g)), [], "{mode:?}");
        fill(&f);
        let log = recorded(|| truncate(&c_f));
        assert_eq!(
            log,
            [(bits::VM_UNMAPPED, m, 2 * page, 0)],
            "{mode:?}: mapped when the filter was made"
        );
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(m as *mut libc::c_void, 2 * page) };
        drop(file);
        // A stream maps a file never mapped before inside glibc.
        let k = dir.join(format!("k-{mode:?}"));
        let c_k = CString::new(k.to_str().unwrap()).unwrap();
        fill(&k);
        // SAFETY: a NUL-terminated path; the stream is closed below.
        let stream = unsafe { (h.fopen_mapped)(c_k.as_ptr()) };
        assert_ne!(stream, 0);
        let mapped = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .find(|l| l.ends_with(k.to_str().unwrap()))
            .map(|l| usize::from_str_radix(l.split('-').next().unwrap(), 16).unwrap());
        let log = recorded(|| truncate(&c_k));
        match mapped {
            Some(at) => assert_eq!(
                log,
                [(bits::VM_UNMAPPED, at, 2 * page, 0)],
                "{mode:?}: glibc's own mapping"
            ),
            None => eprintln!("no mapping for a stream of mode \"m\" here: that step not checked"),
        }
        // SAFETY: the stream opened above.
        unsafe { (h.fclose)(stream) };
        // A library the loader maps (out of the hooks' sight) after the
        // filter was made: a hole punched in its file's read-only data
        // (a page no one reads again; the library stays loaded) is
        // reported in its mapping.
        fill(&g);
        assert_eq!(recorded(|| truncate(&c_g)), [], "{mode:?}");
        let name = format!("filter{mode:?}");
        let lib = build_library(&dir, &name, "const char filter_data[3 * 4096] = {1};\n", &[]);
        let c_lib = CString::new(lib.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path to a library with no constructor.
        assert!(!unsafe { libc::dlopen(c_lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null());
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        // (start, end, perms, file offset) of each mapping of the library.
        let mappings: Vec<(usize, usize, String, usize)> = maps
            .lines()
            .filter(|l| l.ends_with(lib.to_str().unwrap()))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (a, b) = f[0].split_once('-').unwrap();
                let hex = |x: &str| usize::from_str_radix(x, 16).unwrap();
                (hex(a), hex(b), f[1].to_owned(), hex(f[2]))
            })
            .collect();
        let Some(&(data, data_end, _, first)) = mappings
            .iter()
            .find(|(_, _, perms, offset)| perms == "r--p" && *offset > 0)
        else {
            panic!("{mode:?}: no read-only data mapping of {lib:?} past its first page:\n{maps}");
        };
        // The page punched: the data mapping's last, past the library's
        // headers; every mapping of that page of the file reports it
        // (segments may share a page of the file: 64 KiB alignment on
        // aarch64).
        let offset = first + (data_end - data) - page;
        let want: Vec<Rec> = mappings
            .iter()
            .filter(|&&(start, end, _, off)| off <= offset && offset < off + (end - start))
            .map(|&(start, _, _, off)| (bits::VM_UNMAPPED, start + (offset - off), page, 0))
            .collect();
        assert!(!want.is_empty());
        let file = std::fs::OpenOptions::new().write(true).open(&lib).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: the helper wraps fallocate on the library's file.
        let log = recorded(|| assert_eq!(unsafe { (h.fallocate)(fd, punch, offset as i64, page as i64) }, 0));
        assert_eq!(log, want, "{mode:?}: the loader's mapping");
        drop(session);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

static UCM_ORIGINAL: AtomicUsize = AtomicUsize::new(0);
static UCM_CALLS: AtomicUsize = AtomicUsize::new(0);

/// A mapping (64 KiB) the other hooker's munmap hook unmaps by `syscall`
/// for its own bookkeeping, before the call it was asked for; 0: none.
static UCM_OWN_UNMAP: AtomicUsize = AtomicUsize::new(0);
/// A mapping (64 KiB) a signal handler unmaps by `syscall`, the signal
/// raised inside the other hooker's munmap hook; 0: none.
static SIGNAL_UNMAP: AtomicUsize = AtomicUsize::new(0);

/// Unmaps [`SIGNAL_UNMAP`]'s mapping by `syscall`.
extern "C" fn unmap_in_signal_handler(_: i32) {
    let p = SIGNAL_UNMAP.swap(0, Ordering::SeqCst);
    if p != 0 {
        // SAFETY: the test's own mapping, unused by anything else.
        unsafe { libc::syscall(libc::SYS_munmap, p, K64) };
    }
}

/// A range (64 KiB) that, once the other hooker's munmap hook has unmapped
/// it, a signal handler maps again and unmaps by `syscall`; 0: none.
static SIGNAL_REMAP: AtomicUsize = AtomicUsize::new(0);

/// Maps [`SIGNAL_REMAP`]'s range again (through libc, hooked) and unmaps
/// it by `syscall`, with the very words of the munmap it interrupts.
extern "C" fn remap_in_signal_handler(_: i32) {
    let p = SIGNAL_REMAP.swap(0, Ordering::SeqCst);
    if p != 0 {
        // SAFETY: the helper wraps mmap; the range was the test's and is
        // free now (MAP_FIXED_NOREPLACE: nothing else is replaced).
        let again = unsafe { (helper().mmap_at)(p, K64, libc::MAP_FIXED_NOREPLACE) };
        assert_eq!(again, p, "the range is free to map again");
        // SAFETY: the mapping just made, unused by anything else.
        unsafe { libc::syscall(libc::SYS_munmap, p, K64) };
    }
}

/// Another hooker's munmap hook as UCM's bistro mode makes one: its own
/// work (counted, on the recording thread: an unmap of its own and a
/// signal whose handler unmaps, where the test asks), then the call by
/// libc's `syscall`, not by a trampoline to the original (and after it,
/// where the test asks, a signal whose handler maps the range again and
/// unmaps it).
extern "C" fn ucm_like_munmap(a: usize, l: usize) -> i32 {
    if RECORDING.load(Ordering::Acquire) && RECORDER.load(Ordering::Acquire) == thread_id() {
        UCM_CALLS.fetch_add(1, Ordering::SeqCst);
        let own = UCM_OWN_UNMAP.swap(0, Ordering::SeqCst);
        if own != 0 {
            // SAFETY: the test's own mapping, unused by anything else.
            unsafe { libc::syscall(libc::SYS_munmap, own, K64) };
        }
        if SIGNAL_UNMAP.load(Ordering::SeqCst) != 0 {
            // SAFETY: raise has no preconditions; the test installed the
            // handler, which runs before raise returns.
            unsafe { libc::raise(libc::SIGUSR2) };
        }
    }
    // SAFETY: the caller's munmap arguments.
    let result = unsafe { libc::syscall(libc::SYS_munmap, a, l) as i32 };
    if a != 0 && SIGNAL_REMAP.load(Ordering::SeqCst) == a {
        // SAFETY: as above: the test's handler runs before raise returns.
        unsafe { libc::raise(libc::SIGUSR1) };
    }
    result
}

/// A hooker whose munmap hook makes the call by `syscall` (UCM's bistro
/// mode), beside memhook: each munmap is reported once, whichever patched
/// first. Patched before memhook, memhook's hook runs first and the
/// system call is its original's, already reported (without that, twice);
/// patched over memhook's patch, memhook's munmap hook never runs, and
/// the system call is what memhook sees (before the `syscall` hook:
/// nothing). Other unmaps by `syscall` made inside the hooker's hook, its
/// own and a signal handler's, are theirs, reported either way (taken
/// for the call's own, they were lost).
#[test]
fn a_hooker_that_unmaps_by_syscall_is_seen_once_either_side_of_memhook() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let unmap_once = |what: &str| {
        // SAFETY: the helpers wrap mmap and munmap; the mappings are new.
        let [p, own, signalled] = [(); 3].map(|()| unsafe { (h.mmap)(K64) });
        for m in [p, own, signalled] {
            assert_ne!(m as isize, -1);
        }
        UCM_OWN_UNMAP.store(own, Ordering::SeqCst);
        SIGNAL_UNMAP.store(signalled, Ordering::SeqCst);
        let n = UCM_CALLS.load(Ordering::SeqCst);
        // SAFETY: as above.
        let log = recorded(|| assert_eq!(unsafe { (h.munmap)(p, K64) }, 0));
        assert_eq!(UCM_CALLS.load(Ordering::SeqCst) - n, 1, "{what}: the other hooker runs");
        assert_eq!(
            (
                UCM_OWN_UNMAP.load(Ordering::SeqCst),
                SIGNAL_UNMAP.load(Ordering::SeqCst)
            ),
            (0, 0),
            "{what}: the hooker's own unmap and the signal handler's ran"
        );
        // (The three mappings may lie side by side.)
        let at = |m: usize| log.iter().copied().filter(|r| r.1 == m).collect::<Vec<_>>();
        assert_eq!(
            at(p),
            [(bits::VM_UNMAPPED, p, K64, 0), (bits::MUNMAP, p, K64, 0)],
            "{what}: memhook reports it once"
        );
        for (m, whose) in [(own, "the hooker's own"), (signalled, "the signal handler's")] {
            assert_eq!(
                at(m),
                [(bits::VM_UNMAPPED, m, K64, 0), (bits::MUNMAP, m, K64, 0)],
                "{what}: {whose} unmap is reported"
            );
        }
    };
    let signal = (libc::SIGUSR2, unmap_in_signal_handler as extern "C" fn(i32));
    beside_ucm_like_munmap(signal, bits::MUNMAP | bits::VM_UNMAPPED, unmap_once);
}

/// Runs `unmap_once` with [`ucm_like_munmap`] patched over munmap before
/// memhook installs in bistro mode, then after, each time with a handler
/// of `events` that records, and the signal handler `signal` installed.
fn beside_ucm_like_munmap((signal, handler): (i32, extern "C" fn(i32)), events: u32, unmap_once: impl Fn(&str)) {
    // SAFETY: a handler for a signal nothing else in the tests uses.
    let was = unsafe { libc::signal(signal, handler as *const () as libc::sighandler_t) };
    assert_ne!(was, libc::SIG_ERR);
    let patch = || {
        // SAFETY: ucm_like_munmap has munmap's signature and unmaps.
        unsafe { patch_libc(c"munmap", ucm_like_munmap as *const () as usize, &UCM_ORIGINAL) }
    };
    let other = patch();
    let mut session = Session::new(HookMode::Bistro);
    session.handler(events, 0, &record);
    unmap_once("patched before memhook");
    drop(session);
    other.unpatch().map_err(|(_, e)| e).unwrap();

    let mut session = Session::new(HookMode::Bistro);
    session.handler(events, 0, &record);
    let other = patch();
    unmap_once("patched after memhook");
    other.unpatch().map_err(|(_, e)| e).unwrap();
    drop(session);
    // SAFETY: the disposition the test found.
    unsafe { libc::signal(signal, was) };
}

/// A signal handler that, inside another hooker's munmap hook and after
/// its system call, maps the range again and unmaps it by `syscall`
/// with the same words: the original's own call was taken already, so
/// this one is reported, and the range ends unmapped in the events as in
/// the process (until the fifty-sixth session it was taken for the
/// original's too, and a registration cache kept the mapping it had been
/// told of).
#[test]
fn a_signal_handlers_unmap_after_the_originals_own_is_reported() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let unmap_once = |what: &str| {
        // SAFETY: the helper wraps mmap.
        let p = unsafe { (h.mmap)(K64) };
        assert_ne!(p as isize, -1);
        SIGNAL_REMAP.store(p, Ordering::SeqCst);
        // SAFETY: the helper wraps munmap; the mapping is the test's.
        let log = recorded(|| assert_eq!(unsafe { (h.munmap)(p, K64) }, 0));
        assert_eq!(SIGNAL_REMAP.load(Ordering::SeqCst), 0, "{what}: the signal handler ran");
        let at: Vec<_> = log.iter().copied().filter(|r| r.1 == p).map(|r| r.0).collect();
        assert_eq!(
            at,
            [bits::VM_UNMAPPED, bits::VM_MAPPED, bits::VM_UNMAPPED],
            "{what}: unmapped, mapped again by the signal handler, unmapped by it"
        );
    };
    let signal = (libc::SIGUSR1, remap_in_signal_handler as extern "C" fn(i32));
    beside_ucm_like_munmap(signal, bits::VM_MAPPED | bits::VM_UNMAPPED, unmap_once);
}

static UCM_FTRUNCATE_ORIGINAL: AtomicUsize = AtomicUsize::new(0);
/// A descriptor the other hooker's ftruncate hook empties by `syscall`
/// for its own bookkeeping, before the call it was asked for; -1: none.
static UCM_OWN_TRUNCATE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Another hooker's ftruncate hook as UCM's bistro mode would make one:
/// its own work (on the recording thread, an `ftruncate` of another file
/// by `syscall`, where the test asks), then the call by `syscall`.
extern "C" fn ucm_like_ftruncate(fd: i32, length: i64) -> i32 {
    if RECORDING.load(Ordering::Acquire) && RECORDER.load(Ordering::Acquire) == thread_id() {
        let own = UCM_OWN_TRUNCATE.swap(-1, Ordering::SeqCst);
        if own >= 0 {
            // SAFETY: the test's own file, open for writing.
            unsafe { libc::syscall(libc::SYS_ftruncate, own, 0) };
        }
    }
    // SAFETY: the caller's ftruncate arguments.
    unsafe { libc::syscall(libc::SYS_ftruncate, fd, length) as i32 }
}

/// The same for a call on a file: a hooker whose `ftruncate` hook makes
/// the call by `syscall`, patched before memhook and after it. The
/// truncation of a mapped file is reported once either way; the
/// hooker's own truncation of another mapped file, made by `syscall`
/// inside its hook (inside memhook's hook's original, where memhook is
/// patched over it), is its own, reported too (a descriptor the call's
/// mark does not name).
#[test]
fn a_hooker_that_truncates_by_syscall_is_seen_once_either_side_of_memhook() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let page = page_size();
    let dir = std::env::temp_dir().join(format!("memhook-hooker-truncate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let open = |name: &str| {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(name))
            .unwrap();
        f.set_len(page as u64).unwrap();
        f
    };
    let truncate_once = |what: &str| {
        let (asked, own) = (open("asked"), open("own"));
        use std::os::fd::AsRawFd;
        let (a, b) = (
            map_file(asked.as_raw_fd(), 1, 0, true),
            map_file(own.as_raw_fd(), 1, 0, true),
        );
        UCM_OWN_TRUNCATE.store(own.as_raw_fd(), Ordering::SeqCst);
        // SAFETY: the helper wraps ftruncate; the test's own file.
        let log = recorded(|| assert_eq!(unsafe { (h.ftruncate)(asked.as_raw_fd(), 0) }, 0));
        assert_eq!(
            UCM_OWN_TRUNCATE.load(Ordering::SeqCst),
            -1,
            "{what}: the other hooker ran"
        );
        let at = |m: usize| log.iter().copied().filter(|r| r.1 == m).collect::<Vec<_>>();
        assert_eq!(
            at(a),
            [(bits::VM_UNMAPPED, a, page, 0)],
            "{what}: the call's file, once"
        );
        assert_eq!(
            at(b),
            [(bits::VM_UNMAPPED, b, page, 0)],
            "{what}: the hooker's own truncation"
        );
        // SAFETY: the test's mappings.
        unsafe {
            libc::munmap(a as *mut libc::c_void, page);
            libc::munmap(b as *mut libc::c_void, page);
        }
    };
    let patch = || {
        // SAFETY: ucm_like_ftruncate has ftruncate's signature.
        unsafe {
            patch_libc(
                c"ftruncate",
                ucm_like_ftruncate as *const () as usize,
                &UCM_FTRUNCATE_ORIGINAL,
            )
        }
    };
    let other = patch();
    let mut session = Session::new(HookMode::Bistro);
    session.handler(bits::VM_UNMAPPED, 0, &record);
    truncate_once("patched before memhook");
    drop(session);
    other.unpatch().map_err(|(_, e)| e).unwrap();

    let mut session = Session::new(HookMode::Bistro);
    session.handler(bits::VM_UNMAPPED, 0, &record);
    let other = patch();
    truncate_once("patched after memhook");
    other.unpatch().map_err(|(_, e)| e).unwrap();
    drop(session);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Another hooker patches over memhook's patch of `mmap` after memhook
/// installed. An uninstall cannot undo memhook's patch without undoing
/// theirs: it stays, still reporting, and `status` lists it as
/// installed. An install meanwhile takes it back (a second patch over
/// its own jump would lead into itself: the next `mmap` would never
/// return); an install in reloc mode leaves that function to it. Once
/// the other hooker lets go, the next install undoes it and the entry's
/// bytes come back exactly.
#[test]
fn a_patch_another_hooker_covered_is_kept_listed_and_taken_back() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let before = entry_bytes(c"mmap");
    let handler = memhook::set_handler(bits::MMAP, 0, HandlerFn::Rust(&record)).unwrap();
    // Sees one mmap: how many times the other hooker and memhook did.
    let one_mmap = || {
        let n = OTHER_CALLS.load(Ordering::SeqCst);
        let mut p = 0;
        // SAFETY: the helper wraps mmap.
        let log = recorded(|| p = unsafe { (h.mmap)(K64) });
        // SAFETY: unmapping what was mapped.
        unsafe { (h.munmap)(p, K64) };
        (OTHER_CALLS.load(Ordering::SeqCst) - n, about(&log, p, K64).len())
    };
    memhook::install(&config(HookMode::Bistro));
    let other = patch_other_mmap();
    assert_eq!(one_mmap(), (1, 1));
    memhook::uninstall();
    let status = memhook::status();
    assert!(
        status.iter().any(|f| f.function == "mmap" && f.installed),
        "the kept patch is listed: {status:?}"
    );
    assert!(
        !status.iter().any(|f| f.function == "munmap"),
        "the others are undone: {status:?}"
    );
    assert_eq!(one_mmap(), (1, 1), "the kept patch still reports");
    // In reloc mode the kept patch goes on hooking its function, whose
    // slots are left to lead to it: each call reaches our hook once.
    // (Rewritten to the hook, whose original would be the entry again,
    // the first call ran round the two hooks until the stack overflowed.)
    memhook::install(&config(HookMode::Reloc));
    assert_eq!(one_mmap(), (1, 1), "reloc beside the kept patch");
    let status = memhook::status();
    let mode_of = |f: &str| status.iter().find(|s| s.function == f).map(|s| (s.mode, s.installed));
    assert_eq!(mode_of("mmap"), Some((HookMode::Bistro, true)), "{status:?}");
    assert_eq!(mode_of("munmap"), Some((HookMode::Reloc, true)), "{status:?}");
    memhook::uninstall();
    assert_eq!(one_mmap(), (1, 1), "still kept");
    memhook::install(&config(HookMode::Bistro));
    assert_eq!(one_mmap(), (1, 1), "taken back, not patched over");
    let status = memhook::status();
    assert!(status.iter().all(|f| f.installed), "{status:?}");
    assert_eq!(
        libc_entries(&status),
        host_functions(),
        "one entry a function: {status:?}"
    );
    memhook::uninstall();
    other.unpatch().map_err(|(_, e)| e).unwrap();
    // Uncovered now: the next install undoes the kept patch and patches
    // afresh, and its uninstall leaves the bytes as they were.
    memhook::install(&config(HookMode::Bistro));
    assert_eq!(one_mmap(), (0, 1));
    memhook::uninstall();
    assert_eq!(entry_bytes(c"mmap"), before);
    assert!(memhook::status().is_empty());
    assert_eq!(one_mmap(), (0, 0));
    memhook::unset_handler(handler).unwrap();
}

static OTHER_OPEN_ORIGINAL: AtomicUsize = AtomicUsize::new(0);
static OTHER_OPEN_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Another hooker's `open` hook: counts this test thread's calls.
extern "C" fn other_open(path: *const libc::c_char, flags: i32, mode: libc::mode_t) -> i32 {
    if RECORDER.load(Ordering::Acquire) == thread_id() {
        OTHER_OPEN_CALLS.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: the trampoline has open's signature.
    let orig: extern "C" fn(*const libc::c_char, i32, libc::mode_t) -> i32 =
        unsafe { std::mem::transmute(OTHER_OPEN_ORIGINAL.load(Ordering::Acquire)) };
    orig(path, flags, mode)
}

/// libpthread's own `open`, where it has one apart from libc's (glibc
/// before 2.34).
fn libpthread_open() -> Option<usize> {
    let copy = defined_in(c"libpthread.so.0", c"open");
    (copy != 0 && copy != defined_in(c"libc.so.6", c"open")).then_some(copy)
}

/// glibc before 2.34 (the chroot of `scripts/glibc.sh bullseye`): bistro
/// patches libpthread's own `open`, which programs linked with
/// libpthread call, beside libc's. Another hooker patches over that
/// patch; an uninstall keeps it (listed with library `libpthread.so.0`),
/// and an install in reloc mode leaves `open` to it: rewritten, reloc's
/// original would be that entry, which leads back into the hook, and the
/// first call would never return. Each truncating open is reported once.
#[test]
fn a_kept_patch_of_libpthreads_open_is_left_to_itself_in_reloc_mode() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(copy) = libpthread_open() else {
        eprintln!("skipped: libpthread has no open of its own (glibc 2.34 and later)");
        return;
    };
    let h = helper();
    let page = page_size();
    let dir = std::env::temp_dir().join(format!("memhook-copy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("f");
    let c_file = CString::new(file.to_str().unwrap()).unwrap();
    // (other hooker's calls, reports) of one truncating open of the file,
    // mapped.
    let one_open = || {
        std::fs::write(&file, vec![1u8; page]).unwrap();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&file).unwrap();
        let m = map_file(std::os::fd::AsRawFd::as_raw_fd(&f), 1, 0, true);
        let n = OTHER_OPEN_CALLS.load(Ordering::SeqCst);
        let log = recorded(|| {
            // SAFETY: the helper wraps open with a NUL-terminated path;
            // the descriptor is closed.
            unsafe { libc::close((h.open)(c_file.as_ptr(), libc::O_WRONLY | libc::O_TRUNC)) };
        });
        // SAFETY: the test's mapping.
        unsafe { libc::munmap(m as *mut libc::c_void, page) };
        (OTHER_OPEN_CALLS.load(Ordering::SeqCst) - n, about(&log, m, page).len())
    };
    let handler = memhook::set_handler(bits::VM_UNMAPPED, 0, HandlerFn::Rust(&record)).unwrap();
    memhook::install(&config(HookMode::Bistro));
    let copy_entry = |status: &[memhook::FunctionStatus]| {
        status
            .iter()
            .find(|s| s.function == "open" && s.library == "libpthread.so.0")
            .map(|s| s.installed)
    };
    assert_eq!(copy_entry(&memhook::status()), Some(true), "{:?}", memhook::status());
    assert_eq!(one_open(), (0, 1), "the program's open, through libpthread's copy");
    // SAFETY: other_open has open's signature and calls its original.
    let other =
        unsafe { memhook::bistro::Hook::patch_with(copy, other_open as *const () as usize, &OTHER_OPEN_ORIGINAL) }
            .unwrap();
    assert_eq!(one_open(), (1, 1));
    memhook::uninstall();
    assert_eq!(copy_entry(&memhook::status()), Some(true), "the kept patch is listed");
    assert_eq!(one_open(), (1, 1), "the kept patch still reports");
    memhook::install(&config(HookMode::Reloc));
    assert_eq!(one_open(), (1, 1), "reloc beside the kept copy");
    memhook::uninstall();
    memhook::install(&config(HookMode::Bistro));
    assert_eq!(one_open(), (1, 1), "taken back, not patched over");
    memhook::uninstall();
    other.unpatch().map_err(|(_, e)| e).unwrap();
    memhook::install(&config(HookMode::Bistro));
    assert_eq!(one_open(), (0, 1));
    memhook::uninstall();
    assert!(memhook::status().is_empty());
    assert_eq!(one_open(), (0, 0));
    memhook::unset_handler(handler).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

static OTHER_DLSYM_ORIGINAL: AtomicUsize = AtomicUsize::new(0);
static OTHER_DLSYM_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Another hooker's dlsym hook: counts this test thread's calls (other
/// threads of the harness may look symbols up meanwhile).
extern "C" fn other_dlsym(handle: *mut libc::c_void, name: *const libc::c_char) -> *mut libc::c_void {
    if RECORDER.load(Ordering::Acquire) == thread_id() {
        OTHER_DLSYM_CALLS.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: the trampoline has dlsym's signature.
    let orig: extern "C" fn(*mut libc::c_void, *const libc::c_char) -> *mut libc::c_void =
        unsafe { std::mem::transmute(OTHER_DLSYM_ORIGINAL.load(Ordering::Acquire)) };
    orig(handle, name)
}

/// The same for the loader's functions, which the host hooks alone in
/// bistro mode patch in the host functions' batch and undo in one: a
/// patch of `dlsym` another hooker covered is kept by the uninstall (the
/// host functions' are undone), taken back by the next install rather
/// than patched over (which would make `dlsym` call itself for ever),
/// and undone once uncovered, with the bytes as they were.
#[test]
fn a_loader_patch_another_hooker_covered_is_kept_and_taken_back() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    RECORDER.store(thread_id(), Ordering::Release);
    let (before, mmap_before) = (entry_bytes(c"dlsym"), entry_bytes(c"mmap"));
    // One lookup through the entry: how many times the other hooker ran,
    // and whether it found the symbol.
    let lookup = || {
        let n = OTHER_DLSYM_CALLS.load(Ordering::SeqCst);
        // SAFETY: a NUL-terminated name and the pseudo-handle RTLD_DEFAULT.
        let found = !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mmap".as_ptr()) }.is_null();
        (OTHER_DLSYM_CALLS.load(Ordering::SeqCst) - n, found)
    };
    memhook::install(&config(HookMode::Bistro));
    assert_ne!(entry_bytes(c"dlsym"), before, "the loader followed by a patch");
    // SAFETY: other_dlsym has dlsym's signature and calls its original.
    let other = unsafe {
        memhook::bistro::Hook::patch_symbol(c"dlsym", other_dlsym as *const () as usize, &OTHER_DLSYM_ORIGINAL)
    }
    .unwrap();
    assert_eq!(lookup(), (1, true));
    memhook::uninstall();
    assert_eq!(entry_bytes(c"mmap"), mmap_before, "the host functions' patches undone");
    assert_eq!(lookup(), (1, true), "the kept patch still leads to dlsym");
    memhook::install(&config(HookMode::Bistro));
    assert_eq!(lookup(), (1, true), "taken back, not patched over");
    memhook::uninstall();
    other.unpatch().map_err(|(_, e)| e).unwrap();
    // Uncovered now: the next install undoes the kept patch and patches
    // afresh, and its uninstall leaves the bytes as they were.
    memhook::install(&config(HookMode::Bistro));
    assert_eq!(lookup(), (0, true));
    memhook::uninstall();
    assert_eq!(entry_bytes(c"dlsym"), before);
    RECORDER.store(0, Ordering::Release);
}

/// memhook's own trampoline regions (the executable pages it maps near
/// the code it patches, at an install, a library's late load or a
/// namespace's hooking) are not events: mapping one, memhook holds its
/// locks, and a handler run then that asked [`memhook::status`] would
/// wait on itself for ever. Handlers run only where memhook holds none.
#[test]
fn memhooks_own_trampoline_regions_send_no_event() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut session = Session::new(HookMode::Bistro);
    session.handler(
        bits::MMAP | bits::MUNMAP | bits::VM_MAPPED | bits::VM_UNMAPPED,
        0,
        &record,
    );
    // A page far from the libraries, and so from every region so far.
    // SAFETY: a fresh private mapping at a hint, unmapped below.
    let far = unsafe {
        libc::mmap(
            0x3000_0000_0000 as *mut libc::c_void,
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(far, libc::MAP_FAILED);
    let regions = memhook::trampoline::regions();
    let log = recorded(|| assert!(memhook::trampoline::reserve_near(far as usize, 100 << 20, 1)));
    assert_eq!(
        memhook::trampoline::regions(),
        regions + 1,
        "a region was mapped near {far:?}"
    );
    assert_eq!(log, [], "no event for memhook's own region");
    // SAFETY: the page mapped above.
    unsafe { libc::munmap(far, 4096) };
}

static SIG_MAPS: AtomicUsize = AtomicUsize::new(0);
const SIG_SIZE: usize = 11 * 4096;

fn count_sig(e: &mut Event) {
    if let Event::Munmap(m) = *e
        && m.size == SIG_SIZE
        && m.result == 0
    {
        SIG_MAPS.fetch_add(1, Ordering::Relaxed);
    }
}

/// A pre-handler that raises the signal while its thread is inside the
/// dispatch of a (trigger-sized) mmap.
fn raise_inside(e: &mut Event) {
    if let Event::Mmap(m) = *e
        && m.size == 2 * SIG_SIZE
    {
        // SAFETY: raising a signal whose handler only maps and unmaps.
        unsafe { libc::raise(libc::SIGUSR1) };
    }
}

/// Maps and unmaps from inside a signal handler that interrupted a thread
/// in the middle of a dispatch.
extern "C" fn on_signal(_: libc::c_int) {
    let h = helper();
    // SAFETY: map and unmap a private region (async-signal-safe calls).
    unsafe {
        let p = (h.mmap)(SIG_SIZE);
        (h.munmap)(p, SIG_SIZE);
    }
}

#[test]
fn dispatch_works_inside_signal_handlers() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let mut session = Session::new(HookMode::Bistro);
    session.handler(bits::MUNMAP, 0, &count_sig);
    session.handler(bits::MMAP, -1, &raise_inside);
    // SAFETY: installing a handler that only maps and unmaps.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let before = SIG_MAPS.load(Ordering::SeqCst);
    const SIGNALS: usize = 500;
    for _ in 0..SIGNALS {
        // SAFETY: map and unmap; the signal arrives inside the mmap's
        // dispatch (from the pre-handler).
        unsafe {
            let p = (h.mmap)(2 * SIG_SIZE);
            assert_ne!(p as isize, -1);
            (h.munmap)(p, 2 * SIG_SIZE);
        }
    }
    // Each signal handler's munmap was delivered, nested in the dispatch it
    // interrupted.
    assert_eq!(SIG_MAPS.load(Ordering::SeqCst) - before, SIGNALS);
    // SAFETY: restoring the default disposition.
    unsafe { libc::signal(libc::SIGUSR1, libc::SIG_DFL) };
}

/// Armed in the child process of the test below: its handler panics once
/// (disarming first: the panic's own report may map memory).
static ARMED: AtomicBool = AtomicBool::new(false);

fn panics_once(e: &mut Event) {
    if matches!(e, Event::VmMapped(v) if v.size == K64) && ARMED.swap(false, Ordering::AcqRel) {
        panic!("a handler's bug");
    }
}

/// A handler that panics ends the process (it cannot unwind out of the
/// hook, whose caller may be C, and going on would lose the event it
/// failed on): the test runs its own binary again as a child that does
/// it (a fresh process: a forked child of this multithreaded one hung
/// once under qemu-user, in the panic's machinery).
#[test]
#[cfg_attr(
    target_arch = "aarch64",
    ignore = "runs its own binary as a child, which qemu-user (the aarch64 CI) cannot; the behaviour is Rust's"
)]
fn a_panicking_handler_ends_the_process() {
    const CHILD: &str = "MEMHOOK_TEST_PANICKING_HANDLER";
    if std::env::var_os(CHILD).is_some() {
        let h = helper();
        let mut session = Session::new(HookMode::Bistro);
        session.handler(bits::VM_MAPPED, 0, &panics_once);
        ARMED.store(true, Ordering::SeqCst);
        // SAFETY: the helper's mmap, as in check_mode.
        let p = unsafe { (h.mmap)(K64) };
        println!("went on past the panic: {p:#x}");
        std::process::exit(0);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_panicking_handler_ends_the_process",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{out:?}");
    assert!(stderr.contains("a handler's bug"), "the panic is reported: {stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("went on"));
}

/// A library with data of its own (a buffer a registration cache could
/// have registered), and one that needs it: unloading the second
/// unloads both.
const PLUGIN_BASE: &str = "char mhl_buffer[1 << 16];\nint mhl_base(void) { return mhl_buffer[7]; }\n";
const PLUGIN: &str = "int mhl_base(void);\nint mhl_plugin(void) { return mhl_base() + 1; }\n";

/// The span of the loaded object whose path ends in `name`, by its
/// program headers: its first to its last load segment, in whole pages.
fn span_of_loaded(name: &str) -> Option<(usize, usize)> {
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _: libc::size_t, data: *mut libc::c_void) -> i32 {
        // SAFETY: dl_iterate_phdr's arguments for this call; `data` is the
        // pair below.
        let (info, (name, out)) = unsafe { (&*info, &mut *(data as *mut (&str, Option<(usize, usize)>))) };
        if info.dlpi_name.is_null() {
            return 0;
        }
        // SAFETY: a non-null dlpi_name is NUL-terminated.
        let path = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
        if !path.ends_with(*name) {
            return 0;
        }
        let page = page_size();
        let (mut lo, mut hi) = (usize::MAX, 0);
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: dlpi_phdr points to dlpi_phnum headers.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            if ph.p_type == libc::PT_LOAD {
                let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
                lo = lo.min(start & !(page - 1));
                hi = hi.max((start + ph.p_memsz as usize).next_multiple_of(page));
            }
        }
        *out = Some((lo, hi));
        1
    }
    let mut data: (&str, Option<(usize, usize)>) = (name, None);
    // SAFETY: `visit` has the callback's type; `data` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut data as *mut (&str, Option<(usize, usize)>)).cast()) };
    data.1
}

/// The `/proc/self/maps` ranges whose path ends in `name`.
fn mapped_from(name: &str) -> Vec<(usize, usize)> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(name))
        .map(|l| {
            let (lo, hi) = l.split_whitespace().next().unwrap().split_once('-').unwrap();
            (
                usize::from_str_radix(lo, 16).unwrap(),
                usize::from_str_radix(hi, 16).unwrap(),
            )
        })
        .collect()
}

/// The dynamic loader maps and unmaps libraries through its own copies
/// of mmap and munmap, which no hook sees: `dlopen` reports `VM_MAPPED`
/// of each object it loaded after the call, and `dlclose` `VM_UNMAPPED`
/// of each it unloaded (the library's data included) after the call; a
/// `dlclose` that leaves the library loaded reports nothing.
/// Installs the host hooks in `mode` beside the CUDA hooks of `cuda`,
/// registers a handler that records the loader's events, and makes a
/// fresh folder named for `what` and the configuration.
fn loader_setup(what: &str, mode: HookMode, cuda: ModeSet) -> (Session, std::path::PathBuf) {
    memhook::install(&Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[mode]),
            cuda,
        },
    });
    let mut session = Session(Vec::new());
    session.handler(bits::VM_MAPPED | bits::VM_UNMAPPED, 0, &record);
    let dir = std::env::temp_dir().join(format!(
        "memhook-{what}-{}-{}-{}",
        std::process::id(),
        mode.name(),
        cuda.is_empty()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    (session, dir)
}

fn check_loader(mode: HookMode, cuda: ModeSet) {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let (_session, dir) = loader_setup("loader", mode, cuda);
    // The host hooks alone in bistro mode follow the loader through bistro
    // patches of its functions (no pass over the objects' relocations);
    // otherwise through GOT slots.
    let slots = memhook::reloc::status().slots;
    if mode == HookMode::Bistro && cuda.is_empty() {
        assert_eq!(slots, 0, "no GOT slot rewritten");
    } else {
        assert!(slots > 0, "reloc's dl hooks");
    }
    let base_lib = build_library(&dir, "mhl_base", PLUGIN_BASE, &[]);
    let plugin = build_library(
        &dir,
        "mhl_plugin",
        PLUGIN,
        &["-L", dir.to_str().unwrap(), "-lmhl_base", "-Wl,-rpath,$ORIGIN"],
    );
    assert!(base_lib.exists());
    let path = CString::new(plugin.to_str().unwrap()).unwrap();
    let names = ["/libmhl_plugin.so", "/libmhl_base.so"];

    let mut handle = 0;
    // SAFETY: the helper wraps dlopen with a NUL-terminated path.
    let log = recorded(|| handle = unsafe { (h.dlopen)(path.as_ptr()) });
    assert_ne!(handle, 0, "dlopen of the plugin");
    let spans: Vec<(usize, usize)> = names.iter().map(|n| span_of_loaded(n).unwrap()).collect();
    for (name, &(lo, hi)) in names.iter().zip(&spans) {
        let mapped: Vec<&Rec> = log.iter().filter(|r| r.1 == lo).collect();
        assert_eq!(mapped, [&(bits::VM_MAPPED, lo, hi - lo, 0)], "{name}: {log:x?}");
        let name = name.trim_start_matches('/');
        for (a, b) in mapped_from(name) {
            assert!(lo <= a && b <= hi, "{name}: {a:#x}-{b:#x} outside {lo:#x}-{hi:#x}");
        }
    }
    let buffer = {
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle as *mut libc::c_void, c"mhl_buffer".as_ptr()) } as usize;
        assert_ne!(p, 0);
        p
    };
    assert!(
        spans[1].0 <= buffer && buffer + (1 << 16) <= spans[1].1,
        "the buffer lies in its library's span"
    );

    // A second reference: its dlclose unloads nothing, and says nothing.
    let mut again = 0;
    // SAFETY: as above.
    let log = recorded(|| again = unsafe { (h.dlopen)(path.as_ptr()) });
    assert_eq!(again, handle);
    assert_eq!(log, []);
    // SAFETY: the helper wraps dlclose of a handle dlopen returned.
    let log = recorded(|| assert_eq!(unsafe { (h.dlclose)(again) }, 0));
    assert_eq!(log, []);

    // The last reference: both objects go, each reported once.
    // SAFETY: as above.
    let log = recorded(|| assert_eq!(unsafe { (h.dlclose)(handle) }, 0));
    for (name, &(lo, hi)) in names.iter().zip(&spans) {
        let unmapped: Vec<&Rec> = log.iter().filter(|r| r.1 == lo).collect();
        assert_eq!(unmapped, [&(bits::VM_UNMAPPED, lo, hi - lo, 0)], "{name}: {log:x?}");
        assert_eq!(mapped_from(name.trim_start_matches('/')), [], "{name} is unloaded");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn library_loads_and_unloads_in_bistro_mode() {
    check_loader(HookMode::Bistro, ModeSet::NONE);
}

#[test]
fn library_loads_and_unloads_in_reloc_mode() {
    check_loader(HookMode::Reloc, ModeSet::NONE);
}

/// With the CUDA hooks too (which interpose dlopen and dlclose
/// themselves, for libraries that load later).
#[test]
fn library_loads_and_unloads_beside_the_cuda_hooks() {
    check_loader(
        HookMode::Bistro,
        ModeSet::of(&[HookMode::Bistro, HookMode::Reloc, HookMode::Procaddr]),
    );
}

// dlopen asks who called it: the caller's DT_RUNPATH, or else its DT_RPATH,
// is where a bare name is searched, and `$ORIGIN` is the caller's
// directory. memhook's interposed dlopen must leave both as they are
// without it.

const SIBLING: &str = "char mhc_buffer[1 << 16];\nint mhc_sibling(void) { return 42 + mhc_buffer[3]; }\n";
const SIBLING2: &str = "int mhc_sibling2(void) { return 43; }\n";
const DEP: &str = "int mhc_dep(void) { return 7; }\n";
/// Opens `file` and calls `symbol` in it (none: only opens), keeping the
/// handle for `mhc_close`: the way a library loads its plugins.
const OPENER: &str = r#"
#include <dlfcn.h>
static void *opened;
int mhc_open(const char *file, const char *symbol) {
    opened = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!opened) return -1;
    if (!symbol) return 0;
    int (*f)(void) = (int (*)(void))dlsym(opened, symbol);
    return f ? f() : -2;
}
int mhc_close(void) { return dlclose(opened); }
"#;

struct Opener {
    handle: usize,
    open: unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> i32,
    close: unsafe extern "C" fn() -> i32,
}

/// Loads an opener library through the helper (an ordinary caller).
fn load_opener(path: &std::path::Path) -> Opener {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: the helper wraps dlopen with a NUL-terminated path.
    let handle = unsafe { (helper().dlopen)(path.as_ptr()) };
    assert_ne!(handle, 0, "dlopen of {path:?}");
    let sym = |name: &std::ffi::CStr| {
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(handle as *mut libc::c_void, name.as_ptr()) } as usize;
        assert_ne!(p, 0, "{name:?}");
        p
    };
    // SAFETY: the opener's functions, of these signatures.
    unsafe {
        Opener {
            handle,
            open: std::mem::transmute::<usize, unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> i32>(
                sym(c"mhc_open"),
            ),
            close: std::mem::transmute::<usize, unsafe extern "C" fn() -> i32>(sym(c"mhc_close")),
        }
    }
}

/// The events of `log` at the start of `span` (an object's whole span).
fn at_span(log: &[Rec], span: (usize, usize)) -> Vec<Rec> {
    log.iter().filter(|r| r.1 == span.0).copied().collect()
}

/// How `open_and_close` opens.
struct Open<'a> {
    /// The symbol to call after the open (none: only open).
    symbol: Option<&'a std::ffi::CStr>,
    /// What the open (and the call) answers.
    want: i32,
    /// Open on another thread.
    elsewhere: bool,
    /// The load is reported by the time the open returns.
    reported: bool,
}

/// Opens `file` from `opener` as `how` says, then closes it on this
/// thread; asserts that the object named `name` was reported mapped (by
/// the time the open returned, when `how.reported`), then unmapped, once
/// each, with its whole span.
fn open_and_close(opener: &Opener, file: &std::ffi::CStr, name: &str, how: Open<'_>) {
    let Open {
        symbol,
        want,
        elsewhere,
        reported,
    } = how;
    let (open, symbol_ptr) = (opener.open, symbol.map_or(0, |s| s.as_ptr() as usize));
    let file_ptr = file.as_ptr() as usize;
    // SAFETY: NUL-terminated strings (or null) for the opener's dlopen and dlsym.
    let call = move || unsafe { open(file_ptr as *const libc::c_char, symbol_ptr as *const libc::c_char) };
    let mut got = 0;
    let opened = recorded(|| {
        got = if elsewhere {
            std::thread::spawn(call).join().unwrap()
        } else {
            call()
        }
    });
    assert_eq!(got, want, "{file:?} opened from the opener's own place");
    let span = span_of_loaded(name).unwrap();
    let size = span.1 - span.0;
    if reported {
        assert_eq!(
            at_span(&opened, span),
            [(bits::VM_MAPPED, span.0, size, 0)],
            "{name}: {opened:x?}"
        );
    }
    // SAFETY: the opener closes the handle its open kept.
    let closed = recorded(|| assert_eq!(unsafe { (opener.close)() }, 0));
    let log: Vec<Rec> = opened.into_iter().chain(closed).collect();
    assert_eq!(
        at_span(&log, span),
        [(bits::VM_MAPPED, span.0, size, 0), (bits::VM_UNMAPPED, span.0, size, 0)],
        "{name}: {log:x?}"
    );
    assert_eq!(mapped_from(name.trim_start_matches('/')), [], "{name} is unloaded");
}

fn check_dlopen_caller(mode: HookMode, cuda: ModeSet) {
    if interposed(c"dlopen") {
        eprintln!("dlopen is not the C library's (AddressSanitizer's loses its caller's RUNPATH): not checked");
        return;
    }
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let (_session, dir) = loader_setup("caller", mode, cuda);
    for sub in ["sib", "dep"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    build_library(&dir.join("sib"), "mhc_sib", SIBLING, &[]);
    build_library(&dir.join("sib"), "mhc_sib2", SIBLING2, &[]);
    build_library(&dir.join("dep"), "mhc_dep", DEP, &[]);
    let runpath = build_library(
        &dir,
        "mhc_runpath",
        OPENER,
        &["-ldl", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/sib"],
    );
    let rpath = build_library(
        &dir,
        "mhc_rpath",
        OPENER,
        &["-ldl", "-Wl,--disable-new-dtags,-rpath,$ORIGIN/dep"],
    );

    let opener = load_opener(&runpath);
    // A bare name, found through the opener's DT_RUNPATH; its dlsym follows
    // (and reports the load).
    let then_call = |symbol, want| Open {
        symbol: Some(symbol),
        want,
        elsewhere: false,
        reported: true,
    };
    open_and_close(
        &opener,
        c"libmhc_sib.so",
        "/libmhc_sib.so",
        then_call(c"mhc_sibling", 42),
    );
    // `$ORIGIN`, the opener's directory; opened on another thread, with no
    // dlsym after it: this thread's dlclose finds it first, and reports
    // both.
    let only_open = Open {
        symbol: None,
        want: 0,
        elsewhere: true,
        reported: false,
    };
    open_and_close(&opener, c"$ORIGIN/sib/libmhc_sib2.so", "/libmhc_sib2.so", only_open);
    // A name found nowhere: the failure the caller would get, no event.
    let mut got = 0;
    // SAFETY: a NUL-terminated name and no symbol, for the opener's dlopen.
    let log = recorded(|| got = unsafe { (opener.open)(c"libmhc_nowhere.so".as_ptr(), std::ptr::null()) });
    assert_eq!(got, -1);
    assert_eq!(log, []);

    // A bare name found through the opener's DT_RPATH (the old form).
    let old = load_opener(&rpath);
    open_and_close(&old, c"libmhc_dep.so", "/libmhc_dep.so", then_call(c"mhc_dep", 7));
    // A path, with a DT_RPATH among the objects: the caller does not
    // matter, memhook opens it and reports it as the call returns.
    let path = CString::new(dir.join("sib/libmhc_sib2.so").to_str().unwrap()).unwrap();
    let at_return = Open {
        symbol: None,
        want: 0,
        elsewhere: false,
        reported: true,
    };
    open_and_close(&old, &path, "/libmhc_sib2.so", at_return);
    for o in [old, opener] {
        // SAFETY: the helper wraps dlclose of a handle its dlopen returned.
        assert_eq!(unsafe { (h.dlclose)(o.handle) }, 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dlopen_searches_from_its_caller_in_bistro_mode() {
    check_dlopen_caller(HookMode::Bistro, ModeSet::NONE);
}

#[test]
fn dlopen_searches_from_its_caller_in_reloc_mode() {
    check_dlopen_caller(HookMode::Reloc, ModeSet::NONE);
}

#[test]
fn dlopen_searches_from_its_caller_beside_the_cuda_hooks() {
    check_dlopen_caller(
        HookMode::Bistro,
        ModeSet::of(&[HookMode::Bistro, HookMode::Reloc, HookMode::Procaddr]),
    );
}

// Loads on two threads at once: a library another thread's dlopen has
// mapped but not yet relocated is in the loader's list already; a GOT
// slot reloc wrote then would be overwritten by the relocation (a lazy
// one gets the load base added to memhook's hook: a wild call).

/// Maps and unmaps three pages through its PLT (lazily bound).
const RACER: &str = "#include <sys/mman.h>\nint mhr_map(void) {\n    \
    void *p = mmap(0, 3 << 12, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);\n    \
    return p != MAP_FAILED && munmap(p, 3 << 12) == 0;\n}\n";
/// Loads a library lazily, calls its `mhr_map`, unloads it.
const CYCLER: &str = r#"
#include <dlfcn.h>
int mhr_cycle(const char *path) {
    void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    if (!h) return -1;
    int (*f)(void) = (int (*)(void))dlsym(h, "mhr_map");
    int r = f ? f() : -2;
    return dlclose(h) == 0 ? r : -3;
}
"#;

static RACE_MAPS: AtomicUsize = AtomicUsize::new(0);

fn count_race_maps(e: &mut Event) {
    if let Event::Mmap(m) = *e
        && m.size == 3 << 12
    {
        RACE_MAPS.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn libraries_loaded_on_two_threads_at_once_are_hooked_once_relocated() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    loads_on_two_threads();
}

/// The same where glibc's `_dl_find_object` is missing (before 2.35):
/// each scan takes in the objects listed before it (after the loads in
/// progress). Until the sixty-third session a thread whose rescan found
/// the state held could find its request taken by the holder, whose
/// listing, made before this thread's library was loaded, left the
/// library out: it returned from `dlopen` with the library unhooked (9
/// to 41 of 3,000 maps unseen under glibc 2.31).
#[test]
fn libraries_loaded_on_two_threads_at_once_are_hooked_once_listed() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    /// Gives the next tests `_dl_find_object` back, this one passing or not.
    struct FindObjectBack;
    impl Drop for FindObjectBack {
        fn drop(&mut self) {
            memhook::reloc::use_find_object(true);
        }
    }
    let _back = FindObjectBack;
    memhook::reloc::use_find_object(false);
    loads_on_two_threads();
}

fn loads_on_two_threads() {
    const CYCLES: usize = 1500;
    let h = helper();
    let mut session = Session::new(HookMode::Reloc);
    session.handler(bits::MMAP, 0, &count_race_maps);
    let dir = std::env::temp_dir().join(format!("memhook-race-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let racers: Vec<CString> = ["mhr_a", "mhr_b"]
        .iter()
        .map(|n| CString::new(build_library(&dir, n, RACER, &["-Wl,-z,lazy"]).to_str().unwrap()).unwrap())
        .collect();
    let cycler = build_library(&dir, "mhr_cycler", CYCLER, &["-ldl", "-Wl,-z,lazy"]);
    let cycler = CString::new(cycler.to_str().unwrap()).unwrap();
    // SAFETY: the helper wraps dlopen with a NUL-terminated path.
    let handle = unsafe { (h.dlopen)(cycler.as_ptr()) };
    assert_ne!(handle, 0);
    // SAFETY: a live handle and a NUL-terminated name.
    let cycle = unsafe { libc::dlsym(handle as *mut libc::c_void, c"mhr_cycle".as_ptr()) } as usize;
    assert_ne!(cycle, 0);
    RACE_MAPS.store(0, Ordering::SeqCst);
    let threads: Vec<_> = racers
        .iter()
        .map(|path| {
            let path = path.as_ptr() as usize;
            std::thread::spawn(move || {
                // SAFETY: mhr_cycle has this signature; `path` is a
                // NUL-terminated path that outlives the thread.
                let cycle: unsafe extern "C" fn(*const libc::c_char) -> i32 = unsafe { std::mem::transmute(cycle) };
                for _ in 0..CYCLES {
                    // SAFETY: as above.
                    assert_eq!(unsafe { cycle(path as *const libc::c_char) }, 1);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // Every load's mmap went through the hook: each library was hooked
    // after its relocation, never before.
    assert_eq!(RACE_MAPS.load(Ordering::SeqCst), 2 * CYCLES);
    drop(session);
    // SAFETY: the helper wraps dlclose of a handle its dlopen returned.
    assert_eq!(unsafe { (h.dlclose)(handle) }, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A library that needs `libmhf_dep.so` (found through its RUNPATH).
const NEEDS_DEP: &str = "int mhf_dep(void);\nint mhf_lib(void) { return mhf_dep() + 1; }\n";

/// A test's watchdog: waits until `done` is set, and ends the process with
/// `msg` if a minute passes first (with `_exit`: an exit would wait for
/// locks a hung thread may hold). Touches only atomics, sleeps and a
/// write, so it may run while a `dlopen` is in progress.
fn exit_unless_done_in_a_minute(done: &AtomicBool, msg: &[u8]) {
    let since = std::time::Instant::now();
    while !done.load(Ordering::SeqCst) {
        if since.elapsed() > std::time::Duration::from_secs(60) {
            // SAFETY: a buffer of its length; _exit ends the process
            // without running anything.
            unsafe {
                libc::write(2, msg.as_ptr().cast(), msg.len());
                libc::_exit(101);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A library the loader has put in its list but not yet relocated (its
/// dependency's file is a FIFO, so the loader waits in `open`): a scan
/// then must neither hook it nor report it; the failed load leaves no
/// trace either. With `find_object` off, reloc's fallback for C
/// libraries without `_dl_find_object`: the scan waits for the load to
/// end (the FIFO is written from another thread meanwhile).
fn check_unsettled(find_object: bool) {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let mut session = Session::new(HookMode::Reloc);
    session.handler(bits::VM_MAPPED | bits::VM_UNMAPPED, 0, &record);
    memhook::reloc::use_find_object(find_object);
    let dir = std::env::temp_dir().join(format!("memhook-unsettled-{}-{find_object}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dep = build_library(&dir, "mhf_dep", "int mhf_dep(void) { return 1; }\n", &[]);
    let lib = build_library(
        &dir,
        "mhf_lib",
        NEEDS_DEP,
        &[
            "-L",
            dir.to_str().unwrap(),
            "-lmhf_dep",
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN",
        ],
    );
    std::fs::remove_file(&dep).unwrap();
    let fifo = CString::new(dep.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let objects = memhook::reloc::status().objects;
    // Lets the loader read garbage, 200 ms after it is told to: the load
    // fails, the library goes. (Written whatever the scan does: a thread
    // left inside the loader would hang the test program's exit.) Started,
    // and past its start-up, before the load: while a dlopen is in
    // progress a thread can neither start (the loader's TLS lock) nor
    // register a thread-local destructor (glibc's
    // `__cxa_thread_atexit_impl` takes the loader's lock; Rust's thread
    // start-up and an mpsc channel's first use do), so from then on the
    // writer touches only atomics, sleeps and writes. It is the test's
    // watchdog too: a load still unfinished a minute after the write ends
    // the process with a message (with `_exit`: an exit would wait for
    // the loader's lock), not a hang of the test run.
    let garbage = dep.clone();
    let flags = Arc::new([AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false)]);
    let writer = std::thread::spawn({
        let flags = flags.clone();
        move || {
            let [ready, go, done] = &*flags;
            ready.store(true, Ordering::SeqCst);
            while !go.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
            std::fs::write(&garbage, b"not an ELF file").unwrap();
            exit_unless_done_in_a_minute(
                done,
                b"check_unsettled: the load has not ended a minute after its FIFO was written\n",
            );
        }
    });
    let [ready, go, done] = &*flags;
    while !ready.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    let open = h.dlopen;
    let loading = std::thread::spawn(move || {
        // SAFETY: the helper wraps dlopen with a NUL-terminated path.
        unsafe { open(path.as_ptr()) }
    });
    // The library is in the loader's list while its dependency's open
    // waits for a writer.
    let since = std::time::Instant::now();
    let span = loop {
        if let Some(span) = span_of_loaded("/libmhf_lib.so") {
            break span;
        }
        if since.elapsed() > std::time::Duration::from_secs(60) {
            go.store(true, Ordering::SeqCst);
            done.store(true, Ordering::SeqCst);
            panic!("the library was never listed while its dependency's open waited");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    go.store(true, Ordering::SeqCst);
    let log = recorded(memhook::refresh);
    let taken_in = memhook::reloc::status().objects;
    let loaded = loading.join().unwrap();
    done.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    assert_eq!(loaded, 0, "the load fails");
    memhook::reloc::use_find_object(true);
    assert_eq!(at_span(&log, span), [], "{log:x?}");
    assert_eq!(taken_in, objects, "not taken in");
    assert_eq!(span_of_loaded("/libmhf_lib.so"), None);
    let log = recorded(memhook::refresh);
    assert_eq!(at_span(&log, span), [], "{log:x?}");
    assert_eq!(memhook::reloc::status().objects, objects);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_library_still_being_loaded_is_left_alone() {
    check_unsettled(true);
}

/// Without `_dl_find_object` (glibc before 2.35), as reloc would run
/// there.
#[test]
fn a_library_still_being_loaded_is_waited_for_without_find_object() {
    check_unsettled(false);
}

/// One library unloaded and the next of `order` (0: `libmhr_one.so`, 1:
/// `libmhr_two.so`, built from `source`) loaded, likely at its address,
/// each out of memhook's sight (the test program's own dlopen and
/// dlclose, which reloc leaves alone): the next scan reports the old one's
/// unmapping and the new one's mapping, and, where `source` is [`RACER`],
/// the new one's mmap is seen.
fn check_reuse(source: &str, order: [usize; 2]) {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut session = Session::new(HookMode::Reloc);
    session.handler(bits::VM_MAPPED | bits::VM_UNMAPPED | bits::MMAP, 0, &record);
    let dir = std::env::temp_dir().join(format!("memhook-reuse-{}-{}", std::process::id(), order[1]));
    std::fs::create_dir_all(&dir).unwrap();
    let paths: Vec<CString> = ["mhr_one", "mhr_two"]
        .iter()
        .map(|n| CString::new(build_library(&dir, n, source, &[]).to_str().unwrap()).unwrap())
        .collect();
    // SAFETY: NUL-terminated paths of libraries just built.
    let load = |p: &CString| unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    let mut handle = load(&paths[0]);
    assert!(!handle.is_null());
    let _ = recorded(memhook::refresh);
    let mut was = span_of_loaded("/libmhr_one.so").unwrap();
    let mut reused = 0;
    for next in order {
        let name = ["/libmhr_one.so", "/libmhr_two.so"][next];
        let next = &paths[next];
        // SAFETY: the handle the last load returned.
        assert_eq!(unsafe { libc::dlclose(handle) }, 0);
        handle = load(next);
        assert!(!handle.is_null());
        let span = span_of_loaded(name).unwrap();
        let log = recorded(memhook::refresh);
        let gone = (bits::VM_UNMAPPED, was.0, was.1 - was.0, 0);
        let came = (bits::VM_MAPPED, span.0, span.1 - span.0, 0);
        if span == was {
            reused += 1;
            assert_eq!(at_span(&log, span), [gone, came], "{name}: {log:x?}");
        } else {
            assert_eq!(at_span(&log, was), [gone], "{name}: {log:x?}");
            assert_eq!(at_span(&log, span), [came], "{name}: {log:x?}");
        }
        was = span;
        if source != RACER {
            continue;
        }
        // Hooked: its mmap is seen.
        // SAFETY: a live handle and a NUL-terminated name.
        let map = unsafe { libc::dlsym(handle, c"mhr_map".as_ptr()) } as usize;
        // SAFETY: mhr_map has this signature.
        let map: unsafe extern "C" fn() -> i32 = unsafe { std::mem::transmute(map) };
        // SAFETY: as above.
        let log = recorded(|| assert_eq!(unsafe { map() }, 1));
        assert!(
            log.iter().any(|r| r.0 == bits::MMAP && r.2 == 3 << 12),
            "{name}: {log:x?}"
        );
    }
    if reused == 0 {
        eprintln!("no library was loaded where the last one was: the reuse itself went unchecked");
    }
    // SAFETY: the handle the last load returned.
    assert_eq!(unsafe { libc::dlclose(handle) }, 0);
    let _ = recorded(memhook::refresh);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Another library where one was, neither calling anything memhook hooks
/// (no GOT slot written that could tell them apart): their paths do.
#[test]
fn a_library_loaded_where_another_was_is_a_new_one() {
    check_reuse("int mhr_value(void) { return 7; }\n", [1, 0]);
}

/// The same library loaded again where it was: same address, same path, a
/// fresh GOT, without the slot memhook wrote.
#[test]
fn the_same_library_loaded_again_is_a_new_one() {
    check_reuse(RACER, [0, 0]);
}

/// A library for a namespace of its own: calls into its own copy of libc.
const NS_LIBRARY: &str = r#"
#include <errno.h>
#include <stddef.h>
#include <sys/mman.h>
void *mhn_mmap(size_t len) { return mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); }
int mhn_munmap(void *p, size_t len) { return munmap(p, len); }
int mhn_madvise(void *p, size_t len, int advice) { return madvise(p, len, advice); }
int mhn_errno(void) { return errno; }
void mhn_set_errno(int e) { errno = e; }
"#;

/// The events a namespace library's calls make.
const NS_EVENTS: u32 = bits::MMAP | bits::MUNMAP | bits::MADVISE | bits::VM_MAPPED | bits::VM_UNMAPPED;

/// How namespace `lmid` stands in [`memhook::namespaces`], if it is listed.
fn namespace_stands(lmid: libc::Lmid_t) -> Option<memhook::NamespaceStatus> {
    memhook::namespaces().into_iter().find(|s| s.namespace == lmid as usize)
}

/// The library's functions in one namespace.
struct InNamespace {
    lmid: libc::Lmid_t,
    handle: usize,
    mmap: unsafe extern "C" fn(usize) -> usize,
    munmap: unsafe extern "C" fn(usize, usize) -> i32,
    madvise: unsafe extern "C" fn(usize, usize, i32) -> i32,
    errno: unsafe extern "C" fn() -> i32,
    set_errno: unsafe extern "C" fn(i32),
    /// The first bytes of the namespace's libc `mmap`.
    libc_mmap: usize,
}

/// `dlmopen(LM_ID_NEWLM, path, RTLD_NOW)`: the handle, or a panic with
/// the loader's message.
fn dlmopen_new(path: &std::path::Path) -> *mut libc::c_void {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path to a library built for the test.
    let h = unsafe { libc::dlmopen(libc::LM_ID_NEWLM, path.as_ptr(), libc::RTLD_NOW) };
    if h.is_null() {
        // SAFETY: dlerror's message after a failed dlmopen on this thread.
        let why = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) };
        panic!("dlmopen: {why:?}");
    }
    h
}

/// Opens `path` with `dlmopen` in a new namespace (its functions found
/// with `dlsym`, as a user of the library finds them).
fn open_in_new_namespace(path: &std::path::Path) -> InNamespace {
    let h = dlmopen_new(path);
    let mut lmid: libc::Lmid_t = 0;
    // SAFETY: a live handle; RTLD_DI_LMID writes an Lmid_t.
    let rc = unsafe { libc::dlinfo(h, libc::RTLD_DI_LMID, (&raw mut lmid).cast()) };
    assert_eq!(rc, 0);
    assert_ne!(lmid, libc::LM_ID_BASE, "a namespace of its own");
    let sym = |h: *mut libc::c_void, name: &std::ffi::CStr| {
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
        assert_ne!(p, 0, "{name:?}");
        p
    };
    // SAFETY: the namespace's libc, already loaded there (RTLD_NOLOAD).
    let libc_handle = unsafe { libc::dlmopen(lmid, c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    assert!(!libc_handle.is_null(), "the namespace has a libc of its own");
    let libc_mmap = sym(libc_handle, c"mmap");
    // SAFETY: a live handle, also held by `h`.
    unsafe { libc::dlclose(libc_handle) };
    // SAFETY: each symbol is the library function of the stated
    // signature; a test that closes the library uses none of them after.
    unsafe {
        InNamespace {
            lmid,
            handle: h as usize,
            mmap: cast(sym(h, c"mhn_mmap")),
            munmap: cast(sym(h, c"mhn_munmap")),
            madvise: cast(sym(h, c"mhn_madvise")),
            errno: cast(sym(h, c"mhn_errno")),
            set_errno: cast(sym(h, c"mhn_set_errno")),
            libc_mmap,
        }
    }
}

/// The span the loader mapped for the object of `handle` (a `dlopen` or
/// `dlmopen` handle), by its program headers: its first to its last load
/// segment, in whole pages.
fn span_of_handle(handle: usize) -> (usize, usize) {
    // The head of glibc's struct link_map: l_addr comes first.
    let mut map: *const usize = std::ptr::null();
    // SAFETY: a live handle; RTLD_DI_LINKMAP writes a link_map pointer.
    let rc = unsafe {
        libc::dlinfo(
            handle as *mut libc::c_void,
            libc::RTLD_DI_LINKMAP,
            (&raw mut map).cast(),
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: the object's link_map; a library built by the test has its
    // ELF header at its load bias (its first segment maps the file from
    // offset 0 at address 0) and its program headers in that page.
    let (start, end) = unsafe {
        let base = *map;
        let eh = &*(base as *const libc::Elf64_Ehdr);
        assert_eq!(&eh.e_ident[..4], b"\x7fELF");
        let phdrs = std::slice::from_raw_parts(
            (base + eh.e_phoff as usize) as *const libc::Elf64_Phdr,
            usize::from(eh.e_phnum),
        );
        let loads = phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
        let start = loads.clone().map(|p| p.p_vaddr as usize).min().unwrap();
        let end = loads.map(|p| (p.p_vaddr + p.p_memsz) as usize).max().unwrap();
        (base + start, base + end)
    };
    let page = page_size();
    (start & !(page - 1), end.next_multiple_of(page))
}

/// A namespace test's start: the serial lock, a directory, and the
/// namespace test library built there as `libmhn-{tag}.so`; `None` (the
/// test skips, saying why) where memhook cannot follow namespaces here.
fn namespace_test(
    tag: &str,
) -> Option<(
    std::sync::MutexGuard<'static, ()>,
    std::path::PathBuf,
    std::path::PathBuf,
)> {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !namespaces_followed() {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("memhook-ns-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = build_library(&dir, &format!("mhn-{tag}"), NS_LIBRARY, &[]);
    Some((serial, dir, lib))
}

/// Whether memhook can follow dlmopen's namespaces here; says why a test
/// skips where it cannot (glibc before 2.35: no list of namespaces to
/// follow; the doctor says so too).
fn namespaces_followed() -> bool {
    let followed = memhook::reloc::sees_namespaces();
    if !followed {
        eprintln!("skipped: this C library does not let memhook follow dlmopen's namespaces");
    }
    followed
}

/// The address of the GOT slot through which the library file `path`,
/// loaded at bias `base`, calls `name` (its `JUMP_SLOT` relocation).
fn got_slot(path: &std::path::Path, base: usize, name: &str) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let elf = goblin::elf::Elf::parse(&bytes).unwrap();
    let r = elf
        .pltrelocs
        .iter()
        .find(|r| elf.dynsyms.get(r.r_sym).and_then(|s| elf.dynstrtab.get_at(s.st_name)) == Some(name))
        .unwrap_or_else(|| panic!("no PLT relocation of {name} in {}", path.display()));
    base + r.r_offset as usize
}

/// The load bias of the object of `handle`.
fn load_bias(handle: usize) -> usize {
    // The head of glibc's struct link_map: l_addr comes first.
    let mut map: *const usize = std::ptr::null();
    // SAFETY: a live handle; RTLD_DI_LINKMAP writes a link_map pointer.
    let rc = unsafe {
        libc::dlinfo(
            handle as *mut libc::c_void,
            libc::RTLD_DI_LINKMAP,
            (&raw mut map).cast(),
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: the object's link_map, alive while the handle is.
    unsafe { *map }
}

/// The word at `at` (a GOT slot).
fn word_at(at: usize) -> usize {
    // SAFETY: a GOT slot of a loaded library: aligned and mapped.
    unsafe { std::ptr::read_volatile(at as *const usize) }
}

/// The first 16 bytes at `at` (a function entry).
fn bytes_at(at: usize) -> [u8; 16] {
    // SAFETY: a function's entry, in a mapped, readable code page.
    unsafe { *(at as *const [u8; 16]) }
}

/// Checks that calls from `ns`'s library reach the handler, once each,
/// with the namespace's errno its own.
fn check_namespace_calls(ns: &InNamespace) {
    let mut p = 0;
    // SAFETY: the library wraps mmap.
    let log = recorded(|| p = unsafe { (ns.mmap)(K64) });
    assert_ne!(p as isize, -1);
    assert_eq!(
        about(&log, p, K64),
        [(bits::MMAP, 0, K64, p as isize), (bits::VM_MAPPED, p, K64, 0)],
        "namespace {}: mmap",
        ns.lmid
    );
    // SAFETY: discarding and unmapping what was mapped.
    let log = recorded(|| unsafe {
        assert_eq!((ns.madvise)(p, K64, libc::MADV_DONTNEED), 0);
        assert_eq!((ns.munmap)(p, K64), 0);
    });
    assert_eq!(
        about(&log, p, K64),
        [
            (bits::VM_UNMAPPED, p, K64, 0),
            (bits::MADVISE, p, K64, 0),
            (bits::VM_UNMAPPED, p, K64, 0),
            (bits::MUNMAP, p, K64, 0),
        ],
        "namespace {}: madvise and munmap",
        ns.lmid
    );
    // A failing call: the namespace's errno is the call's, and the main
    // namespace's stays as it was, whatever the handler (which sets the
    // main errno) did.
    set_errno(1234);
    // SAFETY: the library's errno setter.
    unsafe { (ns.set_errno)(0) };
    let page = page_size();
    // SAFETY: munmap of an address off a page boundary fails with EINVAL
    // and touches nothing.
    let log = recorded(|| assert_eq!(unsafe { (ns.munmap)(p + 1, page) }, -1));
    // SAFETY: the library's errno getter.
    assert_eq!(unsafe { (ns.errno)() }, libc::EINVAL, "the namespace's errno");
    assert_eq!(errno(), 1234, "the main namespace's errno");
    // (Refused before the kernel looks at the mappings: its own event
    // alone, no VM_UNMAPPED.)
    assert_eq!(about(&log, p + 1, page), [(bits::MUNMAP, p + 1, page, -1)]);
}

/// A library whose constructor maps five pages and unmaps the second;
/// `mhc_made` says where.
const NS_CONSTRUCTOR_LIBRARY: &str = r#"
#include <stddef.h>
#include <sys/mman.h>
#include <unistd.h>
static void *made;
__attribute__((constructor)) static void map_at_load(void) {
    long page = sysconf(_SC_PAGESIZE);
    made = mmap(NULL, 5 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (made != MAP_FAILED) munmap((char *)made + page, page);
}
void *mhc_made(void) { return made; }
"#;

/// Opens `lib` with `dlmopen` in a new namespace while recording; returns
/// the handle and what was recorded about the five pages its constructor
/// mapped (`mhc_made`).
fn open_recording_constructor(lib: &std::path::Path) -> (usize, usize, Vec<Rec>) {
    let mut h = std::ptr::null_mut();
    let log = recorded(|| h = dlmopen_new(lib));
    // SAFETY: a live handle and a NUL-terminated name.
    let made = unsafe { libc::dlsym(h, c"mhc_made".as_ptr()) } as usize;
    assert_ne!(made, 0);
    // SAFETY: mhc_made takes nothing and returns a pointer.
    let at = unsafe { cast::<unsafe extern "C" fn() -> usize>(made)() };
    assert_ne!(at as isize, -1, "the constructor's mmap failed");
    let pages = at..at + 5 * page_size();
    let about = log
        .into_iter()
        .filter(|r| pages.contains(&r.1) || pages.contains(&(r.3 as usize)))
        .collect();
    (h as usize, at, about)
}

/// The loader's breakpoint for debuggers (`_dl_debug_state`), exported by
/// glibc's loader.
fn loader_break() -> usize {
    // SAFETY: a NUL-terminated name and the pseudo-handle RTLD_DEFAULT.
    let at = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_debug_state".as_ptr()) } as usize;
    assert_ne!(at, 0, "the loader exports _dl_debug_state");
    at
}

/// The calls a library's constructors make while `dlmopen` makes its
/// namespace are seen in bistro mode: memhook patches the loader's
/// breakpoint for debuggers, which the loader calls once the namespace's
/// objects are mapped and before any of their code runs, and hooks the
/// namespace's libc there. Uninstall restores the breakpoint's bytes. In
/// reloc mode they are not seen (the slots it rewrites are the loader's
/// to fill until the constructors have run).
#[test]
fn what_the_constructors_of_a_library_in_a_new_namespace_call_is_seen_in_bistro_mode() {
    let Some((_s, dir, _)) = namespace_test("ctor") else {
        return;
    };
    let lib = build_library(&dir, "mhc", NS_CONSTRUCTOR_LIBRARY, &[]);
    let page = page_size();
    let at = loader_break();
    let unpatched = bytes_at(at);
    {
        let mut session = Session::new(HookMode::Bistro);
        session.handler(NS_EVENTS, 0, &record);
        // glibc's loader on x86_64: a lone `ret` (after `endbr64` where
        // it is built for CET), which memhook must patch.
        let lone_return =
            cfg!(target_arch = "x86_64") && matches!(unpatched, [0xf3, 0x0f, 0x1e, 0xfa, 0xc3, ..] | [0xc3, ..]);
        assert_eq!(
            memhook::loader_break_patchable(),
            memhook::namespace_constructors_seen()
        );
        if !memhook::namespace_constructors_seen() {
            assert!(
                !lone_return,
                "the loader's breakpoint is a lone return, and the install did not patch it: {unpatched:02x?}"
            );
            eprintln!("skipped: this loader's breakpoint is no empty function memhook can patch");
            return;
        }
        assert_ne!(bytes_at(at), unpatched, "the loader's breakpoint is patched");
        let (h, made, log) = open_recording_constructor(&lib);
        assert_eq!(
            log,
            [
                (bits::MMAP, 0, 5 * page, made as isize),
                (bits::VM_MAPPED, made, 5 * page, 0),
                (bits::VM_UNMAPPED, made + page, page, 0),
                (bits::MUNMAP, made + page, page, 0),
            ],
            "the constructor's mmap and munmap"
        );
        // SAFETY: the handle dlmopen returned; nothing of it is used after.
        assert_eq!(unsafe { libc::dlclose(h as *mut libc::c_void) }, 0);
    }
    assert_eq!(bytes_at(at), unpatched, "uninstall restores the loader's breakpoint");
    {
        let mut session = Session::new(HookMode::Reloc);
        session.handler(NS_EVENTS, 0, &record);
        assert!(!memhook::namespace_constructors_seen());
        assert_eq!(bytes_at(at), unpatched, "reloc mode leaves the loader's code alone");
        let (h, _, log) = open_recording_constructor(&lib);
        assert_eq!(log, [], "reloc mode does not see the constructor's calls");
        // SAFETY: as above.
        assert_eq!(unsafe { libc::dlclose(h as *mut libc::c_void) }, 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The loader's breakpoint runs memhook's namespace work inside the
/// loader, its lock held: installs and uninstalls on one thread, while
/// another makes and frees namespaces whose constructors map memory and
/// a third loads and unloads a library in the main namespace (each
/// `dlsym` looking for namespaces too), must neither deadlock nor crash.
/// A minute without an end ends the process with a message. (No fork
/// here: a child forked while another thread's `dlclose` held the
/// loader's write lock finds it held for good, glibc's limit, which
/// README's "Forks" describes.)
#[test]
fn namespaces_made_and_freed_beside_installs_and_loads_neither_hang_nor_crash() {
    let Some((_s, dir, lib)) = namespace_test("stress") else {
        return;
    };
    let ctor = build_library(&dir, "mhcs", NS_CONSTRUCTOR_LIBRARY, &[]);
    let main = build_library(&dir, "mhms", "int mhms(void) { return 7; }\n", &[]);
    let at = loader_break();
    let unpatched = bytes_at(at);
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = std::thread::spawn({
        let done = done.clone();
        move || {
            exit_unless_done_in_a_minute(
                &done,
                b"namespaces beside installs and loads: not done in a minute (a deadlock)\n",
            )
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let spawn_loop = |f: Box<dyn Fn() + Send>| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u32;
            while !stop.load(Ordering::SeqCst) || rounds < 20 {
                f();
                rounds += 1;
            }
            rounds
        })
    };
    let namespaces = spawn_loop(Box::new(move || {
        for path in [&ctor, &lib] {
            let h = dlmopen_new(path);
            // SAFETY: the handle dlmopen returned; nothing of it is used
            // after.
            assert_eq!(unsafe { libc::dlclose(h) }, 0);
        }
    }));
    let main = CString::new(main.to_str().unwrap()).unwrap();
    let loads = spawn_loop(Box::new(move || assert!(load_and_call(&main, c"mhms", 7))));
    for round in 0..40 {
        let mode = if round % 4 == 3 {
            HookMode::Reloc
        } else {
            HookMode::Bistro
        };
        memhook::install(&config(mode));
        std::thread::yield_now();
        memhook::uninstall();
    }
    stop.store(true, Ordering::SeqCst);
    let rounds = (namespaces.join().unwrap(), loads.join().unwrap());
    done.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    assert!(rounds.0 >= 20 && rounds.1 >= 20, "{rounds:?}");
    assert_eq!(
        bytes_at(at),
        unpatched,
        "uninstalled: the loader's breakpoint holds its own bytes"
    );
    assert!(memhook::namespaces().is_empty(), "{:?}", memhook::namespaces());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A library opened with `dlmopen` has a libc of its own: in bistro mode
/// memhook hooks it too, whether the namespace came before the install or
/// after it (found at the `dlsym` that looks into the library), and
/// uninstall restores its bytes; in reloc mode the library's GOT slots are
/// rewritten to that namespace's hooks, and put back by uninstall.
#[test]
fn a_library_in_a_namespace_of_its_own_is_hooked_in_bistro_and_reloc_modes() {
    let Some((_s, dir, lib)) = namespace_test("own") else {
        return;
    };
    // Loaded before the installs, so that reloc rewrites its slots.
    let h = helper();
    let lib2 = build_library(&dir, "mhn2", NS_LIBRARY, &[]);
    let mut loaded = 0;
    let events = NS_EVENTS;

    // A namespace made before the install.
    let first = open_in_new_namespace(&lib);
    let unpatched = bytes_at(first.libc_mmap);
    {
        let mut session = Session::new(HookMode::Bistro);
        session.handler(events, 0, &record);
        assert_ne!(bytes_at(first.libc_mmap), unpatched, "the namespace's mmap is patched");
        check_namespace_calls(&first);

        // A namespace made while installed.
        let second = open_in_new_namespace(&lib);
        assert_ne!(second.lmid, first.lmid);
        check_namespace_calls(&second);

        // The loader's mappings of a namespace's objects are reported as
        // the main namespace's are: after the dlsym that looks into it,
        // and after the dlclose that unloads it.
        let mut third = None;
        let log = recorded(|| third = Some(open_in_new_namespace(&lib)));
        let third = third.unwrap();
        let (start, end) = span_of_handle(third.handle);
        assert_eq!(
            about(&log, start, end - start),
            [(bits::VM_MAPPED, start, end - start, 0)],
            "namespace {}: the library's load, in {log:x?}",
            third.lmid
        );
        check_namespace_calls(&third);
        // SAFETY: the handle dlmopen returned; nothing of the library is
        // used after this.
        let log = recorded(|| assert_eq!(unsafe { libc::dlclose(third.handle as *mut libc::c_void) }, 0));
        assert_eq!(
            about(&log, start, end - start),
            [(bits::VM_UNMAPPED, start, end - start, 0)],
            "namespace {}: the library's unload",
            third.lmid
        );

        // A library loaded into a namespace that exists: its load is
        // reported at the dlsym that looks into it.
        let path = CString::new(lib2.to_str().unwrap()).unwrap();
        let log = recorded(|| {
            // SAFETY: a NUL-terminated path to a library built for the
            // test, into a namespace in use; never closed.
            let h = unsafe { libc::dlmopen(first.lmid, path.as_ptr(), libc::RTLD_NOW) };
            assert!(!h.is_null());
            loaded = h as usize;
            // SAFETY: a live handle and a NUL-terminated name.
            assert!(!unsafe { libc::dlsym(h, c"mhn_errno".as_ptr()) }.is_null());
        });
        let (start, end) = span_of_handle(loaded);
        assert_eq!(
            about(&log, start, end - start),
            [(bits::VM_MAPPED, start, end - start, 0)],
            "a second library in namespace {}",
            first.lmid
        );

        let namespaces = memhook::namespaces();
        // The third namespace went with its library (see
        // a_namespace_is_freed_when_its_last_library_is_closed_...).
        assert!(
            namespaces.iter().all(|s| s.namespace != third.lmid as usize),
            "{namespaces:?}"
        );
        for ns in [&first, &second] {
            let stands = namespaces
                .iter()
                .find(|s| s.namespace == ns.lmid as usize)
                .unwrap_or_else(|| panic!("namespace {} in {namespaces:?}", ns.lmid));
            assert_eq!(stands.functions, host_functions(), "{stands:?}");
            assert_eq!(stands.hooked, stands.functions, "{stands:?}");
            assert!(stands.reason.is_empty(), "{stands:?}");
        }
        assert_eq!(
            libc_entries(&memhook::status()),
            host_functions(),
            "the main namespace's"
        );
    }
    assert_eq!(bytes_at(first.libc_mmap), unpatched, "uninstall restores the bytes");
    assert!(memhook::namespaces().is_empty());

    // Reloc mode rewrites the GOT slots of a namespace's objects too, to
    // that namespace's hooks: in namespaces made before the install and
    // after it. (Its libc itself stays as it is: `namespaces()` lists
    // bistro's patches.) Uninstall puts the slots back.
    let slot = got_slot(&lib, load_bias(first.handle), "mmap");
    let bound = word_at(slot);
    assert_eq!(bound, first.libc_mmap, "bound to the namespace's own libc");
    {
        let mut session = Session::new(HookMode::Reloc);
        session.handler(events, 0, &record);
        assert_eq!(bytes_at(first.libc_mmap), unpatched);
        assert_ne!(word_at(slot), bound, "rewritten");
        check_namespace_calls(&first);
        let fourth = open_in_new_namespace(&lib);
        // Looked into by a library whose dlsym reloc interposes (this
        // test program's own calls are not: it holds memhook).
        // SAFETY: a live handle and a NUL-terminated name.
        assert_ne!(unsafe { (h.dlsym)(fourth.handle, c"mhn_mmap".as_ptr()) }, 0);
        check_namespace_calls(&fourth);
        assert!(memhook::namespaces().is_empty());
    }
    assert_eq!(word_at(slot), bound, "put back");

    // Installed again (bistro): the namespace's libc is hooked again, and
    // each call reported once (reloc's slots were put back).
    {
        let mut session = Session::new(HookMode::Bistro);
        session.handler(events, 0, &record);
        assert_ne!(bytes_at(first.libc_mmap), unpatched, "patched again");
        check_namespace_calls(&first);
    }
    assert_eq!(bytes_at(first.libc_mmap), unpatched);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Another hooker patches over memhook's patch of a namespace's `mmap`
/// (as one loaded in that namespace would). An uninstall cannot undo
/// that patch without undoing theirs: it stays, still reporting, while
/// the namespace's other patches are undone, and [`memhook::namespaces`]
/// says that one function is hooked there. An install in reloc mode
/// leaves that function's slots to it; the next install in bistro mode
/// takes it back and hooks the namespace's other functions again; once the other
/// hooker lets go, the install after that undoes it and patches afresh,
/// and its uninstall leaves the bytes exactly as they were.
#[test]
fn a_namespace_patch_another_hooker_covered_is_kept_and_taken_back() {
    let Some((_s, dir, lib)) = namespace_test("kept") else {
        return;
    };
    let ns = open_in_new_namespace(&lib);
    let before = bytes_at(ns.libc_mmap);
    let handler = memhook::set_handler(NS_EVENTS, 0, HandlerFn::Rust(&record)).unwrap();
    // One mmap and one munmap from the namespace: how many times the
    // other hooker ran, and how many MMAP and MUNMAP events memhook sent.
    let one_round = || {
        let n = OTHER_CALLS.load(Ordering::SeqCst);
        let mut p = 0;
        let log = recorded(|| {
            // SAFETY: the library wraps mmap and munmap; what is mapped
            // is unmapped.
            unsafe {
                p = (ns.mmap)(K64);
                assert_eq!((ns.munmap)(p, K64), 0);
            }
        });
        let log = about(&log, p, K64);
        let kind = |k: u32| log.iter().filter(|r| r.0 == k).count();
        (
            OTHER_CALLS.load(Ordering::SeqCst) - n,
            kind(bits::MMAP),
            kind(bits::MUNMAP),
        )
    };
    let hooked = || namespace_stands(ns.lmid).map(|s| (s.hooked, s.functions));
    let all = Some((host_functions(), host_functions()));

    memhook::install(&config(HookMode::Bistro));
    assert_eq!(one_round(), (0, 1, 1));
    assert_eq!(hooked(), all);
    // SAFETY: other_mmap has mmap's signature and calls its original.
    let other =
        unsafe { memhook::bistro::Hook::patch_with(ns.libc_mmap, other_mmap as *const () as usize, &OTHER_ORIGINAL) }
            .unwrap();
    assert_eq!(one_round(), (1, 1, 1), "both hookers see the mmap");

    memhook::uninstall();
    assert_eq!(
        one_round(),
        (1, 1, 0),
        "the kept patch still reports; munmap's is undone"
    );
    assert_eq!(hooked(), Some((1, host_functions())), "{:?}", memhook::namespaces());

    // In reloc mode the namespace's slots of mmap are left to the kept
    // patch (rewritten, each call was reported by both hooks), and the
    // others are rewritten.
    memhook::install(&config(HookMode::Reloc));
    assert_eq!(one_round(), (1, 1, 1), "reloc beside the kept patch");
    memhook::uninstall();
    assert_eq!(one_round(), (1, 1, 0), "still kept");

    memhook::install(&config(HookMode::Bistro));
    assert_eq!(
        one_round(),
        (1, 1, 1),
        "taken back, not patched over, and the rest hooked again"
    );
    assert_eq!(hooked(), all, "{:?}", memhook::namespaces());

    memhook::uninstall();
    other.unpatch().map_err(|(_, e)| e).unwrap();
    memhook::install(&config(HookMode::Bistro));
    assert_eq!(one_round(), (0, 1, 1));
    assert_eq!(hooked(), all);
    memhook::uninstall();
    assert_eq!(bytes_at(ns.libc_mmap), before, "the bytes as they were");
    assert!(memhook::namespaces().is_empty());
    assert_eq!(one_round(), (0, 0, 0));
    memhook::unset_handler(handler).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The loader frees a namespace once its last object is closed, and the
/// next `dlmopen(LM_ID_NEWLM, ...)` reuses its index. memhook must not
/// keep a namespace alive: a program that opens a plugin in a
/// namespace of its own and closes it, over and over (more rounds than
/// glibc has room for namespaces: about a dozen), keeps working in both
/// modes, each round's namespace at the same index, its calls reported
/// (whether its libc comes back at the same address or not). In bistro
/// mode a namespace whose program still holds its libc keeps its patches
/// after its last library goes, and is freed when the libc goes too.
#[test]
fn a_namespace_is_freed_when_its_last_library_is_closed_in_bistro_and_reloc_modes() {
    let Some((_s, dir, lib)) = namespace_test("free") else {
        return;
    };
    let h = helper();
    let events = NS_EVENTS;
    let listed = |lmid: libc::Lmid_t| namespace_stands(lmid).is_some();
    for mode in [HookMode::Bistro, HookMode::Reloc] {
        let mut session = Session::new(mode);
        session.handler(events, 0, &record);
        let mut index = None;
        let mut holes = Vec::new();
        let mut libcs = std::collections::BTreeSet::new();
        for round in 0..24 {
            let ns = open_in_new_namespace(&lib);
            // Looked into through a library whose dlsym reloc interposes
            // (this test program's own calls are not: it holds memhook).
            // SAFETY: a live handle and a NUL-terminated name.
            assert_ne!(unsafe { (h.dlsym)(ns.handle, c"mhn_mmap".as_ptr()) }, 0);
            assert_eq!(
                *index.get_or_insert(ns.lmid),
                ns.lmid,
                "{mode:?}, round {round}: the index reused"
            );
            libcs.insert(ns.libc_mmap);
            if mode == HookMode::Bistro {
                assert!(listed(ns.lmid), "{mode:?}, round {round}");
            }
            check_namespace_calls(&ns);
            // SAFETY: the handle dlmopen returned; nothing of the library
            // is used after this.
            assert_eq!(unsafe { libc::dlclose(ns.handle as *mut libc::c_void) }, 0);
            assert!(!listed(ns.lmid), "{mode:?}, round {round}: forgotten");
            // Every other round, a page in the hole the namespace's libc
            // left is taken, so that the next one's libc comes elsewhere.
            if round % 2 == 0 {
                let at = ns.libc_mmap & !(page_size() - 1);
                // SAFETY: an anonymous page where nothing is mapped now
                // (MAP_FIXED_NOREPLACE), unmapped at the end.
                let hole = unsafe {
                    libc::mmap(
                        at as *mut libc::c_void,
                        page_size(),
                        libc::PROT_NONE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    )
                };
                assert_eq!(hole as usize, at);
                holes.push(at);
            }
        }
        // SAFETY: the pages mapped above, used by nothing.
        holes
            .drain(..)
            .for_each(|p| assert_eq!(unsafe { libc::munmap(p as *mut libc::c_void, page_size()) }, 0));
        eprintln!(
            "{mode:?}: 24 rounds in namespace {index:?}, its libc at {} addresses",
            libcs.len()
        );
        assert!(libcs.len() > 1, "{mode:?}: the namespace's libc never moved");
    }

    // Bistro, with the loader's functions followed through reloc's slots
    // (as when the CUDA hooks are configured): this test program's own
    // dlmopen and dlclose go unseen, so a namespace is freed and made
    // again between two looks, its libc mostly at the same address. The
    // look at the next dlsym (through the helper) tells the new libc from
    // the one hooked (its code holds no patch) and hooks it.
    let unseen = Config {
        hooks: HookConfig {
            mmap: ModeSet::of(&[HookMode::Bistro]),
            cuda: ModeSet::of(&[HookMode::Reloc]),
        },
    };
    let mut session = Session::with(&unseen);
    session.handler(events, 0, &record);
    let mut same = 0;
    let mut last = None;
    for round in 0..6 {
        let ns = open_in_new_namespace(&lib);
        // SAFETY: a live handle and a NUL-terminated name.
        assert_ne!(unsafe { (h.dlsym)(ns.handle, c"mhn_mmap".as_ptr()) }, 0);
        same += usize::from(last == Some(ns.libc_mmap));
        last = Some(ns.libc_mmap);
        assert!(listed(ns.lmid), "round {round}");
        check_namespace_calls(&ns);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::dlclose(ns.handle as *mut libc::c_void) }, 0);
    }
    eprintln!("unseen unloads: the libc at the same address in {same} of 5 rounds");
    // (Under qemu-user, which places mappings itself, the loader's next
    // mapping does not take the hole the last left.)
    #[cfg(target_arch = "x86_64")]
    assert!(same > 0, "never at the same address: the case is not tested");
    drop(session);

    // Bistro: the program holds the namespace's libc itself.
    let mut session = Session::new(HookMode::Bistro);
    session.handler(events, 0, &record);
    // SAFETY: a NUL-terminated name.
    let own = unsafe { libc::dlmopen(libc::LM_ID_NEWLM, c"libc.so.6".as_ptr(), libc::RTLD_NOW) };
    assert!(!own.is_null());
    let mut lmid: libc::Lmid_t = 0;
    // SAFETY: a live handle; RTLD_DI_LMID writes an Lmid_t.
    let rc = unsafe { libc::dlinfo(own, libc::RTLD_DI_LMID, (&raw mut lmid).cast()) };
    assert_eq!(rc, 0);
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path to a library built for the test, into
    // the namespace just made.
    let plugin = unsafe { libc::dlmopen(lmid, path.as_ptr(), libc::RTLD_NOW) };
    assert!(!plugin.is_null());
    // SAFETY: a live handle and a NUL-terminated name.
    let ns_munmap = unsafe { libc::dlsym(own, c"munmap".as_ptr()) } as usize;
    assert_ne!(ns_munmap, 0);
    assert!(listed(lmid));
    // SAFETY: the handle dlmopen returned; its library is not used again.
    assert_eq!(unsafe { libc::dlclose(plugin) }, 0);
    assert!(listed(lmid), "the program's own libc handle keeps the patches");
    // SAFETY: munmap of the namespace's libc, with its signature.
    let ns_munmap: unsafe extern "C" fn(usize, usize) -> i32 = unsafe { cast(ns_munmap) };
    // SAFETY: an anonymous mapping, unmapped through the namespace's libc.
    let p = unsafe { (h.mmap)(K64) };
    // SAFETY: the mapping just made.
    let log = recorded(|| assert_eq!(unsafe { ns_munmap(p, K64) }, 0));
    assert_eq!(
        about(&log, p, K64),
        [(bits::VM_UNMAPPED, p, K64, 0), (bits::MUNMAP, p, K64, 0)],
        "still reported"
    );
    // SAFETY: the handle dlmopen returned; nothing of it is used after.
    assert_eq!(unsafe { libc::dlclose(own) }, 0);
    assert!(!listed(lmid), "freed with its libc");
    let again = open_in_new_namespace(&lib);
    assert_eq!(again.lmid, lmid, "the index reused");
    check_namespace_calls(&again);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::dlclose(again.handle as *mut libc::c_void) }, 0);
    drop(session);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Namespaces made and freed over and over on one thread (each round:
/// open a library in a namespace of its own, look into it, call its
/// `mmap` and `munmap`, close it; namespaces are looked for at every
/// loader call) while another installs in reloc and bistro mode by turns
/// and three look symbols up: no crash (a namespace's hooks never call an
/// unloaded libc, nor patch one over its own patch), no deadlock (a
/// watchdog ends the process with a message after a minute). Once the
/// install settles in bistro mode, a namespace made meanwhile is hooked
/// in full and its calls reported, and a namespace is freed with its
/// library. (Two threads making namespaces at once run glibc out of
/// static TLS after a hundred rounds or so, without memhook too.)
#[test]
fn namespaces_come_and_go_while_threads_reinstall_and_look_up_symbols() {
    let Some((_s, dir, lib)) = namespace_test("churn") else {
        return;
    };
    let h = helper();
    let events = NS_EVENTS;
    let mut session = Session::new(HookMode::Bistro);
    session.handler(events, 0, &record);

    let stop = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let watchdog = std::thread::spawn({
        let finished = finished.clone();
        move || exit_unless_done_in_a_minute(&finished, b"namespace churn: not done after a minute (deadlock?)\n")
    });
    // At least more rounds than glibc has room for namespaces (about a
    // dozen: each must be freed), and for at least 0.6 s.
    const ROUNDS: u64 = 16;
    let churners: Vec<_> = (0..1)
        .map(|_| {
            let lib = lib.clone();
            std::thread::spawn(move || {
                let since = std::time::Instant::now();
                let mut rounds = 0u64;
                while rounds < ROUNDS || since.elapsed() < std::time::Duration::from_millis(600) {
                    let ns = open_in_new_namespace(&lib);
                    // SAFETY: a live handle and a NUL-terminated name.
                    assert_ne!(unsafe { (h.dlsym)(ns.handle, c"mhn_munmap".as_ptr()) }, 0);
                    // SAFETY: the library's mmap and munmap wrappers, on
                    // what they map.
                    unsafe {
                        let p = (ns.mmap)(K64);
                        assert_ne!(p as isize, -1);
                        assert_eq!((ns.munmap)(p, K64), 0);
                    }
                    // SAFETY: the handle dlmopen returned; nothing of the
                    // library is used after this.
                    assert_eq!(unsafe { libc::dlclose(ns.handle as *mut libc::c_void) }, 0);
                    rounds += 1;
                }
                // One left open, made while installs come and go.
                (rounds, open_in_new_namespace(&lib))
            })
        })
        .collect();
    let lookups: Vec<_> = (0..3)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    // SAFETY: a NUL-terminated name and RTLD_DEFAULT.
                    assert_ne!(unsafe { (h.dlsym)(0, c"malloc".as_ptr()) }, 0);
                    n += 1;
                }
                n
            })
        })
        .collect();
    let reinstaller = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut cycles = 0u64;
            while !stop.load(Ordering::SeqCst) {
                memhook::install(&config(HookMode::Reloc));
                std::thread::sleep(std::time::Duration::from_millis(1));
                memhook::install(&config(HookMode::Bistro));
                std::thread::sleep(std::time::Duration::from_millis(1));
                cycles += 1;
            }
            cycles
        }
    });
    let (rounds, left): (Vec<u64>, Vec<InNamespace>) = churners.into_iter().map(|t| t.join().unwrap()).unzip();
    stop.store(true, Ordering::SeqCst);
    let cycles = reinstaller.join().unwrap();
    let lookups: u64 = lookups.into_iter().map(|t| t.join().unwrap()).sum();
    finished.store(true, Ordering::SeqCst);
    watchdog.join().unwrap();
    eprintln!("{cycles} install cycles, namespace rounds {rounds:?}, {lookups} lookups");
    assert!(cycles > 0 && rounds.iter().all(|&r| r >= ROUNDS) && lookups > 0);

    // Settled in bistro mode: the namespace made meanwhile is hooked (by
    // the install or at the next loader call), and so is one made now,
    // which is freed with its library (the next one takes its index).
    memhook::install(&config(HookMode::Bistro));
    memhook::refresh();
    for ns in &left {
        let stands = namespace_stands(ns.lmid).expect("the namespace made meanwhile is hooked");
        assert_eq!((stands.hooked, stands.functions), (host_functions(), host_functions()));
        check_namespace_calls(ns);
    }
    let ns = open_in_new_namespace(&lib);
    let stands = namespace_stands(ns.lmid).expect("the namespace is hooked");
    assert_eq!((stands.hooked, stands.functions), (host_functions(), host_functions()));
    check_namespace_calls(&ns);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::dlclose(ns.handle as *mut libc::c_void) }, 0);
    let again = open_in_new_namespace(&lib);
    assert_eq!(again.lmid, ns.lmid, "freed, and its index reused");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::dlclose(again.handle as *mut libc::c_void) }, 0);
    drop(session);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Looks into a library already loaded through the helper (`dlopen`,
/// `dlsym`, `dlclose`: memhook's entries walk the loaded objects and
/// rescan them; glibc's own work takes no lock a fork leaves held).
fn look_into_libc(h: &Helper) -> bool {
    // SAFETY: the helper wraps the loader's functions; the names are
    // NUL-terminated and the handle is closed once.
    unsafe {
        let handle = (h.dlopen)(c"libc.so.6".as_ptr());
        handle != 0 && (h.dlsym)(handle, c"malloc".as_ptr()) != 0 && (h.dlclose)(handle) == 0
    }
}

/// A child forked while other threads are inside memhook's loader work
/// (rescans after `dlopen` and `dlclose`, `refresh`, `status`, install
/// and uninstall, each holding memhook's locks or walking the loaded
/// objects under the loader's `dl_iterate_phdr` lock, which glibc does not
/// reset in a child) finds memhook's locks free and the loader's lock let
/// go: its `dlopen`, `refresh`, install and hooked calls go through, and
/// its hooks report. Before memhook made forks wait for that work, such
/// children hung in 23 to 31 of 200 forks.
fn check_fork_during_loader_work(mode: HookMode) {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let h = helper();
    let mut session = Session::new(mode);
    session.handler(bits::MMAP | bits::MUNMAP, 0, &count_marked);
    let stop = Arc::new(AtomicBool::new(false));
    let looker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                assert!(look_into_libc(h));
                memhook::refresh();
                let _ = memhook::status();
            }
        })
    };
    let installer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u32;
            while !stop.load(Ordering::Relaxed) {
                // The same configuration: the hooks stay whatever the
                // interleaving, and each call installs afresh.
                memhook::uninstall();
                memhook::install(&config(mode));
                rounds += 1;
            }
            rounds
        })
    };
    let (mut hung, mut forks) = (0, 0);
    let start = std::time::Instant::now();
    while forks < 100 || start.elapsed() < std::time::Duration::from_millis(500) {
        forks += 1;
        // SAFETY: the child makes the calls below and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let looked = look_into_libc(h);
            memhook::refresh();
            memhook::uninstall();
            memhook::install(&config(mode));
            let installed = memhook::status().iter().any(|f| f.function == "mmap" && f.installed);
            let before = MARK_MAPS.load(Ordering::SeqCst);
            MARKING.with(|m| m.set(true));
            // SAFETY: map and unmap a private region.
            let mapped = unsafe {
                let p = (h.mmap)(MARK_SIZE);
                (h.munmap)(p, MARK_SIZE) == 0
            };
            let seen = MARK_MAPS.load(Ordering::SeqCst) == before + 1;
            let code = i32::from(!looked) | i32::from(!installed) << 1 | i32::from(!(mapped && seen)) << 2;
            // SAFETY: leaving the child without the parent's atexit.
            unsafe { libc::_exit(code) };
        }
        match wait_for_child(pid, std::time::Duration::from_secs(5)) {
            None => hung += 1,
            Some(status) => assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child status {status:#x} (exit 1: dlopen/dlsym/dlclose failed, 2: not installed, 4: its mmap not seen)"
            ),
        }
    }
    stop.store(true, Ordering::Relaxed);
    looker.join().unwrap();
    let installs = installer.join().unwrap();
    assert_eq!(hung, 0, "children that hung, of {forks} ({installs} installs beside)");
    assert_eq!(memhook::fork::waits_given_up(), 0);
}

/// A child forked while another thread updates the memory-type map (as
/// the CUDA hooks do after each allocation and free, or an embedder's
/// `report_event`) finds the map whole and its lock free: the lookups of
/// ranges recorded before agree, and its own updates go through, on both
/// of the map's tables. Without the mend, every such child waited forever
/// at its first update.
#[test]
fn a_child_forked_while_the_memtype_map_is_updated_finds_it_whole() {
    use memhook::memtype::{self, Lookup, MemType};
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Two regions of cells far from anything else recorded: the first
    // fixed, the second churned by the writer.
    const CELLS: usize = 64;
    let fixed = |i: usize| 0x7a00_0000_0000 + i * 0x10_0000;
    let churned = |i: usize| 0x7b00_0000_0000 + i * 0x10_0000;
    for i in 0..CELLS {
        memtype::insert(fixed(i), 0x1000 + i * 0x100, MemType::Cuda, (i % 4) as i32).unwrap();
    }
    let fixed_whole = move || {
        (0..CELLS).all(|i| {
            matches!(memtype::lookup(fixed(i) + 0x800, 8),
                Lookup::Found(f) if f.base == fixed(i) && f.len == 0x1000 + i * 0x100 && f.device == (i % 4) as i32)
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut updates = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for i in 0..CELLS {
                    memtype::insert(churned(i), 0x2000, MemType::CudaManaged, 1).unwrap();
                    if i % 2 == 0 {
                        memtype::remove(churned(i), 0x2000).unwrap();
                    } else {
                        assert!(memtype::take(churned(i)).is_some());
                    }
                    updates += 2;
                }
            }
            updates
        })
    };
    let (mut hung, mut mended, mut forks) = (0, 0, 0);
    let start = std::time::Instant::now();
    while forks < 100 || start.elapsed() < std::time::Duration::from_millis(500) {
        forks += 1;
        // SAFETY: the child makes the calls below and leaves with _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut code = i32::from(!fixed_whole());
            // Updates that publish each table in turn, each followed by
            // the lookups: the writer's cells go, a cell of the child's
            // own comes and goes.
            memtype::remove(churned(0), CELLS * 0x10_0000).unwrap();
            code |=
                i32::from(!fixed_whole() || (0..CELLS).any(|i| memtype::lookup(churned(i), 8) != Lookup::Absent)) << 1;
            memtype::insert(churned(3), 0x3000, MemType::CudaHost, -1).unwrap();
            code |= i32::from(
                !fixed_whole()
                    || !matches!(memtype::lookup(churned(3) + 0x2fff, 1), Lookup::Found(f) if f.mem_type == MemType::CudaHost),
            ) << 2;
            memtype::remove(churned(3), 0x3000).unwrap();
            code |= i32::from(!fixed_whole() || memtype::lookup(churned(3), 8) != Lookup::Absent) << 3;
            memtype::insert(churned(5), 0x1000, MemType::Cuda, 2).unwrap();
            code |= i32::from(!fixed_whole()) << 4;
            if memtype::mended_after_fork() == 1 {
                code |= 1 << 6;
            }
            // SAFETY: leaving the child without the parent's atexit.
            unsafe { libc::_exit(code) };
        }
        match wait_for_child(pid, std::time::Duration::from_secs(5)) {
            None => hung += 1,
            Some(status) => {
                assert!(libc::WIFEXITED(status), "child status {status:#x}");
                let code = libc::WEXITSTATUS(status);
                assert_eq!(
                    code & 0x3f,
                    0,
                    "child's failed checks {code:#b} (bit n: the nth round of lookups)"
                );
                mended += i32::from(code & 1 << 6 != 0);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let updates = writer.join().unwrap();
    assert_eq!(hung, 0, "children that hung, of {forks} ({updates} updates beside)");
    assert!(
        mended > 0,
        "no fork of {forks} came while the map was updated: the mend went untested"
    );
    assert_eq!(memtype::mended_after_fork(), 0, "the parent's map needs no mend");
    eprintln!("{mended} of {forks} children mended the map");
    memtype::remove(fixed(0), CELLS * 0x10_0000).unwrap();
    memtype::remove(churned(0), CELLS * 0x10_0000).unwrap();
}

#[test]
fn a_child_forked_during_loader_work_finds_memhooks_locks_free_in_bistro_mode() {
    check_fork_during_loader_work(HookMode::Bistro);
}

#[test]
fn a_child_forked_during_loader_work_finds_memhooks_locks_free_in_reloc_mode() {
    check_fork_during_loader_work(HookMode::Reloc);
}

//! memhook's own system calls, made by the instruction itself: never
//! through libc's `syscall` function, which memhook hooks (a program's
//! `syscall(SYS_munmap, ...)` changes the mappings as surely as
//! `munmap`). Through it, memhook's own calls would come back into its
//! hook: its trampoline pages would be reported as the program's
//! mappings, and a writer patching `syscall`, or a thread it holds out of
//! the bytes being written, would run into those bytes.
//!
//! Nor is any of them a cancellation point, as libc's `read`, `write`,
//! `close`, `send` and `nanosleep` are. memhook runs inside `mmap`,
//! `munmap`, `shmat` and the rest, which are not cancellation points:
//! a program may cancel a thread that calls them (or `malloc`, which
//! calls them holding its arena's lock) and rely on the thread going on
//! to its next cancellation point. A cancellation acted upon inside a
//! hook would unwind the thread out of the middle of that call instead,
//! with whatever lock its caller held still held. So memhook's own
//! reads, writes, closes and sleeps on a hook's path, and in its own
//! handlers (`MEMHOOK_TRACE`, `memhook run`'s reports), go by these
//! functions. A handler of the program's that calls a cancellation
//! point should turn cancellation off for that time itself
//! (`pthread_setcancelstate`): see [`crate::set_handler`].

use core::ffi::{c_int, c_long};

/// System call `n` with `args`, as the kernel answers it: a result, or
/// `-errno` (from -4095 to -1).
///
/// # Safety
///
/// As for the system call: the arguments are what the kernel expects of
/// it (pointers it writes through are valid for it).
#[inline(always)]
pub(crate) unsafe fn raw(n: c_long, args: [c_long; 6]) -> c_long {
    let ret: c_long;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; `syscall` clobbers rcx and r11 (said
    // here) and memory as the call says (asm's default: it may read and
    // write any memory).
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n => ret,
            in("rdi") args[0],
            in("rsi") args[1],
            in("rdx") args[2],
            in("r10") args[3],
            in("r8") args[4],
            in("r9") args[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: the caller's contract; `svc 0` returns in x0 and keeps every
    // other register.
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") args[0] => ret,
            in("x1") args[1],
            in("x2") args[2],
            in("x3") args[3],
            in("x4") args[4],
            in("x5") args[5],
            options(nostack),
        );
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        // No hooks here (bistro and reloc need x86_64 or aarch64): libc's
        // function, its errno turned back into the kernel's answer.
        // SAFETY: the caller's contract.
        let r = unsafe { libc::syscall(n, args[0], args[1], args[2], args[3], args[4], args[5]) };
        ret = if r == -1 {
            -c_long::from(crate::maps::errno())
        } else {
            r
        };
    }
    ret
}

/// Whether `r`, an answer of [`raw`], is the kernel's refusal (`-errno`).
#[inline(always)]
pub(crate) fn refused(r: c_long) -> bool {
    (-4095..0).contains(&r)
}

/// System call `n` with `args`, answered as libc's `syscall` answers: -1
/// with errno set where the kernel refuses it.
///
/// # Safety
///
/// As for [`raw`].
#[inline(always)]
pub(crate) unsafe fn call(n: c_long, args: [c_long; 6]) -> c_long {
    // SAFETY: the caller's contract.
    let r = unsafe { raw(n, args) };
    if refused(r) {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = -r as core::ffi::c_int };
        return -1;
    }
    r
}

/// The calling thread's id, by the system call: glibc's `gettid` came
/// with 2.30, and a library that names it does not load under an older
/// one (RHEL 8's 2.28). Cannot fail; errno untouched.
#[inline]
pub(crate) fn gettid() -> libc::pid_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { raw(libc::SYS_gettid, [0; 6]) as libc::pid_t }
}

/// `read(2)` of `buf.len()` bytes at most from `fd`: the count read (0 at
/// the end), or the errno. errno untouched; not a cancellation point.
pub fn read(fd: c_int, buf: &mut [u8]) -> Result<usize, c_int> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let r = unsafe {
        raw(
            libc::SYS_read,
            [fd as c_long, buf.as_mut_ptr() as c_long, buf.len() as c_long, 0, 0, 0],
        )
    };
    answer(r)
}

/// `write(2)` of `buf` to `fd`: the count written, or the errno. errno
/// untouched; not a cancellation point.
pub fn write(fd: c_int, buf: &[u8]) -> Result<usize, c_int> {
    // SAFETY: the kernel reads at most `buf.len()` bytes of `buf`.
    let r = unsafe {
        raw(
            libc::SYS_write,
            [fd as c_long, buf.as_ptr() as c_long, buf.len() as c_long, 0, 0, 0],
        )
    };
    answer(r)
}

/// `send(2)` of `buf` on the socket `fd` with `flags`: the count sent,
/// or the errno. errno untouched; not a cancellation point.
pub fn send(fd: c_int, buf: &[u8], flags: c_int) -> Result<usize, c_int> {
    // SAFETY: as `write`; no address (a connected socket's `sendto`).
    let r = unsafe {
        raw(
            libc::SYS_sendto,
            [
                fd as c_long,
                buf.as_ptr() as c_long,
                buf.len() as c_long,
                flags as c_long,
                0,
                0,
            ],
        )
    };
    answer(r)
}

/// `close(2)` of `fd` (its errno, if any, is of no use: the descriptor
/// is gone either way on Linux). errno untouched; not a cancellation
/// point.
pub fn close(fd: c_int) {
    // SAFETY: closing a descriptor touches no memory of ours.
    unsafe { raw(libc::SYS_close, [fd as c_long, 0, 0, 0, 0, 0]) };
}

/// Sleeps for `ts` (woken early by a signal: not resumed). errno
/// untouched; not a cancellation point.
pub fn nanosleep(ts: &libc::timespec) {
    // SAFETY: the kernel reads `ts`; no remainder is asked for.
    unsafe {
        raw(
            libc::SYS_nanosleep,
            [ts as *const libc::timespec as c_long, 0, 0, 0, 0, 0],
        )
    };
}

/// A count as [`raw`] answered it, or its errno.
fn answer(r: c_long) -> Result<usize, c_int> {
    if refused(r) { Err(-r as c_int) } else { Ok(r as usize) }
}

/// `syscall!(n, a, b, ...)`: [`call`] with up to six arguments, each cast
/// to `c_long` (pointers and integers as the C function takes them), the
/// rest 0.
macro_rules! syscall {
    ($n:expr $(, $a:expr)* $(,)?) => {{
        let mut args = [0 as core::ffi::c_long; 6];
        let given = [$($a as core::ffi::c_long),*];
        args[..given.len()].copy_from_slice(&given);
        $crate::sys::call($n as core::ffi::c_long, args)
    }};
}
pub(crate) use syscall;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_as_libc_does() {
        // SAFETY: getpid and gettid have no arguments.
        assert_eq!(unsafe { syscall!(libc::SYS_getpid) }, std::process::id() as c_long);
        // SAFETY: as above.
        assert_eq!(unsafe { syscall!(libc::SYS_gettid) }, unsafe { libc::gettid() }
            as c_long);
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: closing a descriptor that is not open fails with EBADF.
        assert_eq!(unsafe { syscall!(libc::SYS_close, -1) }, -1);
        assert_eq!(crate::maps::errno(), libc::EBADF);
        assert_eq!(
            // SAFETY: as above, by the kernel's answer alone.
            unsafe { raw(libc::SYS_close, [-1, 0, 0, 0, 0, 0]) },
            -c_long::from(libc::EBADF)
        );
        // Six arguments: a mapping made and unmapped, its contents kept.
        let page = 4096usize;
        // SAFETY: a new private anonymous mapping, unmapped below.
        let p = unsafe {
            syscall!(
                libc::SYS_mmap,
                0usize,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0
            )
        };
        assert!(p > 0, "mmap: {p}");
        // SAFETY: the mapping just made, writable.
        unsafe { *(p as *mut u8) = 7 };
        // SAFETY: the same mapping.
        assert_eq!(unsafe { syscall!(libc::SYS_munmap, p, page) }, 0);
    }
}

//! The `membarrier` system call, as memhook uses it: the expedited private
//! commands, each registered for once (at load, while the process is
//! usually single-threaded, so that the kernel skips the RCU grace period a
//! threaded process's registration waits for).

use core::ffi::{c_int, c_long};

const QUERY: c_int = 0;
/// A full memory barrier on every running thread of the process.
pub(crate) const PRIVATE_EXPEDITED: c_int = 1 << 3;
const REGISTER_PRIVATE_EXPEDITED: c_int = 1 << 4;
/// As [`PRIVATE_EXPEDITED`], and a core-serialising instruction too.
pub(crate) const PRIVATE_EXPEDITED_SYNC_CORE: c_int = 1 << 5;
const REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: c_int = 1 << 6;

/// Issues `cmd`; 0 on success.
pub(crate) fn call(cmd: c_int) -> c_long {
    // SAFETY: membarrier takes (cmd, flags, cpu_id) and touches no memory.
    unsafe { crate::sys::syscall!(libc::SYS_membarrier, cmd, 0, 0) }
}

/// Registers this process for `command` (one of the expedited commands
/// above); false when the kernel lacks it or refuses.
pub(crate) fn register(command: c_int) -> bool {
    let registration = match command {
        PRIVATE_EXPEDITED => REGISTER_PRIVATE_EXPEDITED,
        PRIVATE_EXPEDITED_SYNC_CORE => REGISTER_PRIVATE_EXPEDITED_SYNC_CORE,
        _ => return false,
    };
    let supported = call(QUERY);
    supported >= 0 && supported & c_long::from(command) != 0 && call(registration) == 0
}

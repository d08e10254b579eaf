//! The `membarrier` system call, as memhook uses it: the expedited private
//! commands, registered for at load, while the process is usually
//! single-threaded, so that the kernel skips the RCU grace period a
//! threaded process's registration waits for (12 to 16 ms on the dev VM: a
//! `dlopen` of libmemhook.so into a threaded process, such as Python's,
//! pays it). One registration serves both uses: the SYNC_CORE command,
//! which code patching needs, gives "the memory ordering guarantees
//! described in MEMBARRIER_CMD_PRIVATE_EXPEDITED" besides (membarrier(2)),
//! which the dispatcher's reader slots need.

use core::ffi::{c_int, c_long};
use core::sync::atomic::{AtomicU8, Ordering};

const QUERY: c_int = 0;
/// A full memory barrier on every running thread of the process.
const PRIVATE_EXPEDITED: c_int = 1 << 3;
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
/// above) by `registration`; false when the kernel lacks it or refuses.
fn register(command: c_int, registration: c_int) -> bool {
    let supported = call(QUERY);
    supported >= 0 && supported & c_long::from(command) != 0 && call(registration) == 0
}

/// 0 not asked yet, 1 registered, 2 refused.
static SYNC_CORE: AtomicU8 = AtomicU8::new(0);
static EXPEDITED: AtomicU8 = AtomicU8::new(0);

/// `register` asked once: its answer kept in `state`. Two threads that
/// ask first at once both register; the kernel's second registration
/// finds the first done.
fn registered_once(state: &AtomicU8, command: c_int, registration: c_int) -> bool {
    let mut s = state.load(Ordering::Acquire);
    if s == 0 {
        s = if register(command, registration) { 1 } else { 2 };
        state.store(s, Ordering::Release);
    }
    s == 1
}

/// Whether this process may issue [`PRIVATE_EXPEDITED_SYNC_CORE`]
/// (registering for it on the first call).
pub(crate) fn sync_core() -> bool {
    registered_once(
        &SYNC_CORE,
        PRIVATE_EXPEDITED_SYNC_CORE,
        REGISTER_PRIVATE_EXPEDITED_SYNC_CORE,
    )
}

/// The command that puts a full memory barrier on every running thread of
/// the process, registered for: the SYNC_CORE command where the kernel
/// has it (it orders memory as `PRIVATE_EXPEDITED` does, and its one
/// registration serves code patching too), else `PRIVATE_EXPEDITED`
/// (registered for on the first call that needs it); `None` where the
/// kernel has neither or refuses them.
pub(crate) fn fence_command() -> Option<c_int> {
    if sync_core() {
        Some(PRIVATE_EXPEDITED_SYNC_CORE)
    } else {
        registered_once(&EXPEDITED, PRIVATE_EXPEDITED, REGISTER_PRIVATE_EXPEDITED).then_some(PRIVATE_EXPEDITED)
    }
}

/// A full memory barrier on every running thread of the process
/// ([`fence_command`]); false where there is none.
pub(crate) fn fence() -> bool {
    fence_command().is_some_and(|c| call(c) == 0)
}

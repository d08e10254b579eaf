//! More module globals than memhook keeps track of (1,024; its own
//! process: once one goes unkept, every later unload asks the driver about
//! the map's device entries): the unload of a module whose global was not
//! kept still reports it, after the call rather than before, and every
//! other module's unload reports its own before the call, once.
#![cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]

mod common;

use std::ffi::{c_char, c_void};

use common::*;
use memhook::event::bits;
use memhook::memtype::{self, Lookup, MemType};

type Dptr = u64;

#[test]
fn globals_past_the_table_are_still_reported_at_their_unload() {
    let _serial = serial();
    let h = bistro_fake_driver();
    type GlobalFn = unsafe extern "C" fn(*mut Dptr, *mut usize, *mut c_void, *const c_char) -> u32;
    // SAFETY: the fake driver's functions of these types.
    let (global, unload): (GlobalFn, unsafe extern "C" fn(*mut c_void) -> u32) =
        unsafe { (cast(sym(h, c"cuModuleGetGlobal_v2")), cast(sym(h, c"cuModuleUnload"))) };
    const MODULES: usize = 1030;
    let handle = |i: usize| (0x10_0000 + i) as *mut c_void;
    let mut globals = Vec::new();
    for i in 0..MODULES {
        let mut g: Dptr = 0;
        // SAFETY: valid arguments (the fake takes any handle).
        let status = unsafe { global(&mut g, std::ptr::null_mut(), handle(i), c"x".as_ptr()) };
        assert_eq!(status, 0);
        globals.push(g as usize);
    }
    let _ = take();
    // The last modules' globals came after the table filled. Each unload
    // reports its module's global exactly once, kept or not.
    for i in (0..MODULES).rev() {
        // SAFETY: a module handle the fake knows.
        assert_eq!(unsafe { unload(handle(i)) }, 0);
        assert_eq!(
            take(),
            [(bits::MEM_TYPE_FREE, globals[i], 256, MemType::Cuda as u32)],
            "module {i}"
        );
        assert_eq!(memtype::lookup(globals[i], 1), Lookup::Absent);
    }
}

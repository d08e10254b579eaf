//! Writes a byte into code, as a debugger or the kernel's uprobes do:
//! shared by the tests that put a breakpoint's byte over a patch (its own
//! test binary each: nothing may call the function meanwhile).

/// Writes `byte` at `at` in a code page of a library (read and execute),
/// and puts that protection back.
pub fn poke(at: usize, byte: u8) {
    let page = at & !4095;
    // SAFETY: the caller's code page (and the next, where `at` is near the
    // page's end), made writable for the one byte, then read and execute
    // again as a library's text is.
    unsafe {
        assert_eq!(
            libc::mprotect(
                page as *mut _,
                8192,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC
            ),
            0
        );
        core::ptr::write_volatile(at as *mut u8, byte);
        assert_eq!(
            libc::mprotect(page as *mut _, 8192, libc::PROT_READ | libc::PROT_EXEC),
            0
        );
    }
}

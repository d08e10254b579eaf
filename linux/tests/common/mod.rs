//! Shared by the host tests and the loader-lock fork tests (both use all
//! of it): building a test library, loading and calling one, and waiting
//! for a child that may hang.

use crate::cc;

/// Builds `lib<name>.so` in `dir` from `source` with the C compiler (`CC`,
/// else `cc`), with `extra` arguments after the source.
pub fn build_library(dir: &std::path::Path, name: &str, source: &str, extra: &[&str]) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(format!("lib{name}.so"));
    cc::build(
        cc::command()
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&out)
            .arg(&src)
            .args(extra),
        &format!("lib{name}.so"),
    );
    out
}

/// Waits up to `limit` for child `pid`; kills it and returns `None` when it
/// has not exited by then (a hang), else its wait status.
pub fn wait_for_child(pid: libc::pid_t, limit: std::time::Duration) -> Option<i32> {
    let until = std::time::Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: polling a child of this process.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return Some(status);
        }
        if std::time::Instant::now() > until {
            // SAFETY: ending and reaping a child of this process.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Opens the library at `path`, calls its function `name` (which returns
/// `want`) and closes it.
pub fn load_and_call(path: &std::ffi::CStr, name: &std::ffi::CStr, want: i32) -> bool {
    // SAFETY: a NUL-terminated path and name; the function found is
    // `int (void)`, called before the handle is closed, once.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        if handle.is_null() {
            return false;
        }
        let f = libc::dlsym(handle, name.as_ptr());
        let called = !f.is_null() && core::mem::transmute::<*mut libc::c_void, extern "C" fn() -> i32>(f)() == want;
        libc::dlclose(handle) == 0 && called
    }
}

//! memhook-tests: cross-crate integration tests, the models they check the
//! implementation against, and the harnesses shared with the fuzz targets.
pub mod cc;
pub mod elf_fuzz;
pub mod fakecuda;
pub mod fixtures;
pub mod libmemhook;
pub mod maps_model;
pub mod memtype_model;
pub mod poke;
pub mod reloc_check;
pub mod reloc_check_aarch64;

/// The environment variables by which memhook, loaded into a program,
/// takes its configuration (and `memhook run` its library and report
/// channel).
pub const CONFIG_VARS: [&str; 9] = [
    "MEMHOOK_CUDA_HOOK_MODE",
    "MEMHOOK_MMAP_HOOK_MODE",
    "MEMHOOK_TRACE",
    "MEMHOOK_MAP_HUGE_PAGES",
    "MEMHOOK_READER_SLOTS",
    "MEMHOOK_LIB",
    "MEMHOOK_REPORT_FD",
    "MEMHOOK_REPORT_ID",
    "MEMHOOK_REPORT_SOCKET",
];

/// A command for `program` without [`CONFIG_VARS`]: a test that starts a
/// program with memhook in it sets what it means (`.env(...)` after this)
/// and nothing of the developer's shell comes through (with
/// `MEMHOOK_MMAP_HOOK_MODE=none` exported there, a test that counts events
/// would see none).
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let mut command = std::process::Command::new(program);
    for var in CONFIG_VARS {
        command.env_remove(var);
    }
    command
}

/// Runs `program` with `args` (and `env`) in a mount namespace of its own
/// whose `/proc` is an empty file system: a process with no `/proc`
/// mounted, as in a chroot or a sandbox without it. `None`, having said
/// why on stderr, where no such namespace can be made (not root, no
/// `unshare`, a container without the capability): unshare's refusal
/// (its message first) or the mount's (exit 100).
pub fn without_proc(
    program: impl AsRef<std::ffi::OsStr>,
    args: &[&str],
    env: &[(&str, &std::path::Path)],
) -> Option<std::process::Output> {
    let mut c = command("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs none /proc || exit 100; exec "$@""#)
        .arg("sh")
        .arg(program)
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    match c.output() {
        Ok(o) if o.status.code() == Some(100) || o.stdout.is_empty() && o.stderr.starts_with(b"unshare:") => {
            eprintln!(
                "skipped: no mount namespace with an empty /proc here: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            None
        }
        Ok(o) => Some(o),
        Err(e) => {
            eprintln!("skipped: unshare: {e}");
            None
        }
    }
}

/// Waits up to `limit` for `child` to end: true where it did. Past that,
/// kills it (its whole process group where it leads one: a program that
/// started others, as `memhook run` does) and returns false once it is
/// reaped, so that a test of a program that hangs fails and goes on.
pub fn wait_within(child: &mut std::process::Child, limit: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > until {
            let pid = child.id() as libc::pid_t;
            // SAFETY: getpgid reads the group of our own child, not yet
            // reaped (so its id is not another process's).
            if unsafe { libc::getpgid(pid) } == pid {
                // SAFETY: signals the group that child leads.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            } else {
                let _ = child.kill();
            }
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    true
}

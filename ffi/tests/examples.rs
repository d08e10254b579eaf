//! The C programs of `ffi/examples/`, built with the system C compiler
//! against `include/memhook.h` and `libmemhook.so`, and run: a handler
//! counting events, a second namespace's libc (`dlmopen`), libmemhook.so
//! closed after install (it stays loaded), a program with an `mmap` of
//! its own, two copies of memhook in one process, the CUDA hooks
//! on the fake driver, and unmodified programs (one that maps and
//! unmaps, one that moves pages with userfaultfd) under
//! `LD_PRELOAD=libmemhook.so MEMHOOK_TRACE=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The folder with libmemhook.so (this test's target folder), the
/// library built from the current sources where the test has the default
/// features (see `memhook_tests::libmemhook::libmemhook`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    memhook_tests::libmemhook::libmemhook(&dir, cfg!(feature = "bistro"));
    dir
}

fn out_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("memhook-ffi-examples-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cc(src: &str, out: &Path, link_memhook: bool) {
    cc_with(src, out, link_memhook, &[]);
}

/// Builds the example `src` into `out`, with `extra` after the source (a
/// library such as `-ldl` must follow the objects that need it: glibc
/// before 2.34 keeps `dlopen` and `dlerror` in libdl).
fn cc_with(src: &str, out: &Path, link_memhook: bool, extra: &[&str]) {
    let mut c = memhook_tests::cc::command();
    c.args(["-O2", "-Wall", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(root().join("ffi/examples").join(src))
        .arg("-o")
        .arg(out)
        .args(extra);
    if link_memhook {
        let lib = lib_dir();
        c.arg("-L").arg(&lib).arg("-lmemhook").arg("-ldl");
        c.arg(format!("-Wl,-rpath,{}", lib.display()));
    }
    memhook_tests::cc::build(&mut c, src);
}

#[test]
fn count_events() {
    let out = out_dir().join("count_events");
    cc("count_events.c", &out, true);
    let o = memhook_tests::command(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A program opens libmemhook.so with `dlopen`, installs (both host
/// modes, in turn), registers a handler and closes it: the library stays
/// (`-z nodelete`), so the hooked `mmap`, a fork and a later `dlopen` keep
/// working and the handler still sees the events. Before the flag, the
/// first `mmap` after the `dlclose` crashed the process.
#[test]
fn closing_libmemhook_after_install_leaves_it_loaded_and_working() {
    let out = out_dir().join("unload");
    cc_with("unload.c", &out, false, &["-ldl"]);
    closes_and_keeps_working(&out, &lib_dir().join("libmemhook.so"));
}

/// Runs `unload.c`'s program over `library` in both host modes: closed
/// after install, it stays loaded, and its hooks and handler keep working.
fn closes_and_keeps_working(program: &Path, library: &Path) {
    for config in ["mmap=bistro;cuda=none", "mmap=reloc;cuda=none"] {
        let o = memhook_tests::command(program)
            .arg(library)
            .arg(config)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{config}: {:?} {stdout}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            stdout.contains("1 mapped, 1 unmapped, library still loaded"),
            "{config}: {stdout}"
        );
    }
}

/// A plugin of the program's own that contains memhook: a shared object
/// built from `libmemhook.a` (`dir/lib{name}.so`; each test its own, as
/// the tests run at once), linked without `-z nodelete`.
fn static_plugin(dir: &Path, name: &str) -> PathBuf {
    let plugin = dir.join(format!("lib{name}.so"));
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, "int plugin_marker(void) { return 42; }\n").unwrap();
    let mut c = memhook_tests::cc::command();
    c.args(["-shared", "-fPIC", "-o"])
        .arg(&plugin)
        .arg(&src)
        // Only what the programs look up is kept from the archive.
        .args([
            "-Wl,-u,memhook_install",
            "-Wl,-u,memhook_uninstall",
            "-Wl,-u,memhook_set_event_handler",
        ])
        .arg(lib_dir().join("libmemhook.a"))
        .args(["-lpthread", "-ldl", "-lm"]);
    memhook_tests::cc::build(&mut c, "the plugin");
    if let Ok(d) = Command::new("readelf").arg("-d").arg(&plugin).output() {
        assert!(
            !String::from_utf8_lossy(&d.stdout).contains("NODELETE"),
            "the plugin is linked without -z nodelete"
        );
    }
    plugin
}

/// Installing and uninstalling allocate nothing, as the C library sees
/// it (the program's own `malloc`, which the C library and the loader
/// call, counts): in each host mode, with the CUDA hooks in each mode and
/// no CUDA library loaded, twice each, through libmemhook.so and through
/// a plugin built from `libmemhook.a` (whose first install pins it with a
/// `dlopen`). What an allocator that installs memhook from inside its
/// first `malloc` relies on. Before, each CUDA name no object defines
/// cost a `dlsym` that allocated its error message: 67 allocations an
/// install with the CUDA hooks' default modes, 65 in reloc mode. And
/// the configuration read from the environment, and the hooked calls a
/// handler sees.
#[test]
fn install_and_uninstall_allocate_nothing() {
    let dir = out_dir();
    let out = dir.join("no_malloc");
    cc_with("no_malloc.c", &out, false, &["-ldl"]);
    let configs = [
        "mmap=bistro;cuda=none",
        "mmap=reloc;cuda=none",
        "mmap=bistro",
        "mmap=reloc;cuda=reloc",
        "mmap=bistro;cuda=procaddr",
        "mmap=bistro;cuda=bistro,reloc,procaddr",
    ];
    for library in [lib_dir().join("libmemhook.so"), static_plugin(&dir, "plugin_no_malloc")] {
        let o = memhook_tests::command(&out)
            .arg(&library)
            .args(configs)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && stdout.contains("allocations in all: 0"),
            "{}: {:?}\n{stdout}{}",
            library.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(
            stdout.matches("): install 0, 0 allocations").count(),
            2 * configs.len(),
            "{stdout}"
        );
        // Eight rounds of mmap, madvise, mremap and munmap: each call's
        // own event and its VM events (nine a round), with no allocation.
        assert_eq!(
            stdout.matches("): hooked calls, 0 allocations, 72 events").count(),
            2 * configs.len(),
            "{stdout}"
        );
    }
    // `memhook_install(NULL)`: the modes read from the environment in
    // place (std's `var_os` copied each value: 2 allocations an install).
    let from_env = |mmap: &std::ffi::OsStr| {
        memhook_tests::command(&out)
            .arg(lib_dir().join("libmemhook.so"))
            .arg("env")
            .env("MEMHOOK_MMAP_HOOK_MODE", mmap)
            .env("MEMHOOK_CUDA_HOOK_MODE", "reloc,procaddr")
            .output()
            .unwrap()
    };
    let o = from_env("reloc".as_ref());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && stdout.contains("allocations in all: 0"),
        "{stdout}"
    );
    // A bad value, or one that is not UTF-8, is refused (so it was read).
    use std::os::unix::ffi::OsStrExt;
    for bad in [&b"relo"[..], b"reloc\xff"] {
        let o = from_env(std::ffi::OsStr::from_bytes(bad));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            !o.status.success() && stdout.contains("env (round 0): install -8"),
            "{bad:?}: {stdout}"
        );
    }
}

/// The same with memhook inside a plugin of the program's own, built from
/// `libmemhook.a` and linked without `-z nodelete`: the first install
/// pins the plugin (`dlopen` with `RTLD_NOLOAD | RTLD_NODELETE`), so its
/// `dlclose` leaves it loaded and the hooks working. Before the pin, the
/// first `mmap` after the `dlclose` crashed the process (SIGSEGV, both
/// modes).
#[test]
fn closing_a_plugin_that_embeds_the_static_library_leaves_it_loaded() {
    let dir = out_dir();
    let plugin = static_plugin(&dir, "plugin_unload");
    let out = dir.join("unload_static");
    cc_with("unload.c", &out, false, &["-ldl"]);
    closes_and_keeps_working(&out, &plugin);
}

/// A program with an `mmap` of its own that forwards to the C library's:
/// bistro patches the C library's entry (found in its symbol table), not
/// the program's, so `malloc`'s `mmap` of a large block and `free`'s
/// `munmap` inside the C library are reported, and the program's own
/// calls once each. Patched where `dlsym(RTLD_DEFAULT, "mmap")` pointed
/// (the program's), memhook missed `malloc`'s map.
#[test]
fn bistro_patches_the_c_librarys_mmap_past_an_interposer() {
    let out = out_dir().join("own_mmap");
    cc("own_mmap.c", &out, true);
    let o = memhook_tests::command(&out)
        .arg("mmap=bistro;cuda=none")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("malloc and free: 1 mapped, 1 unmapped"), "{stdout}");
    assert!(
        stdout.contains("the program's mmap and munmap: 1 mapped, 1 unmapped"),
        "{stdout}"
    );
}

/// Runs `cmd`, killing it after `limit`: its output, or `None` when it
/// hung.
fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Option<std::process::Output> {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    memhook_tests::wait_within(&mut child, limit).then(|| child.wait_with_output().unwrap())
}

/// Two independent copies of memhook in one process (two libraries that
/// each embed it), every pair of host modes, uninstalled in either
/// order: each sees each `mmap` once while installed; the one left
/// installed keeps seeing them whatever the other did (a bistro copy over
/// a reloc one used to patch the reloc copy's hook, which `dlsym`
/// answered, and went blind when that copy uninstalled); and a copy
/// whose bistro patch the other patched over gets it back at its next
/// install (it used to patch over its own jump, and the process hung).
#[test]
fn two_copies_of_memhook_each_see_every_mmap() {
    let out = out_dir().join("two_instances");
    cc("two_instances.c", &out, true);
    let copy = out_dir().join("libmemhook-copy.so");
    std::fs::copy(lib_dir().join("libmemhook.so"), &copy).unwrap();
    // The program's output with these arguments, once it ran to the end.
    let run = |case: &str, args: &[&str]| {
        let o = output_within(
            memhook_tests::command(&out).arg(&copy).args(args),
            std::time::Duration::from_secs(20),
        )
        .unwrap_or_else(|| panic!("{case}: hung"));
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{case}: {:?}\n{stdout}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        stdout
    };
    let modes = ["mmap=bistro;cuda=none", "mmap=reloc;cuda=none"];
    for a in modes {
        for b in modes {
            for order in ["0", "1"] {
                let case = format!("A {a}, B {b}, order {order}");
                let stdout = run(&case, &[a, b, order]);
                let seen = |what: &str| {
                    let line = stdout
                        .lines()
                        .find(|l| l.starts_with(&format!("{what}: ")))
                        .unwrap_or_else(|| panic!("{case}: no line {what}:\n{stdout}"));
                    let count = |k: &str| {
                        line.split(k)
                            .nth(1)
                            .and_then(|v| v.split(' ').next()?.parse::<u32>().ok())
                    };
                    (count("a=").unwrap(), count("b=").unwrap())
                };
                assert_eq!(seen("A installed"), (1, 0), "{case}\n{stdout}");
                assert_eq!(seen("both installed"), (1, 1), "{case}\n{stdout}");
                if order == "0" {
                    // A's patch may be kept (B patched over it, or holds
                    // A's hook as its original): then A still sees it.
                    assert_eq!(seen("A uninstalled").1, 1, "{case}: B sees on\n{stdout}");
                    assert_eq!(seen("B uninstalled").1, 0, "{case}\n{stdout}");
                    assert_eq!(seen("A installed again"), (1, 0), "{case}\n{stdout}");
                    assert_eq!(seen("B installed again"), (1, 1), "{case}\n{stdout}");
                } else {
                    assert_eq!(seen("B uninstalled"), (1, 0), "{case}\n{stdout}");
                    assert_eq!(seen("A uninstalled"), (0, 0), "{case}\n{stdout}");
                }
            }
        }
    }
    // Both in bistro mode, B's patch over A's: A uninstalls (its patch
    // stays under B's, still reporting) and installs again in reloc mode,
    // which leaves mmap to that patch (its slots rewritten, each call ran
    // round A's hook and B's until the stack overflowed); once B has
    // gone, A's patch is in place, and A's uninstall undoes it.
    let case = "A bistro, B bistro, A again in reloc mode";
    let bistro = "mmap=bistro;cuda=none";
    let stdout = run(case, &[bistro, bistro, "2", "mmap=reloc;cuda=none"]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "A installed: a=1 b=0",
            "both installed: a=1 b=1",
            "A uninstalled: a=1 b=1",
            "A installed again in another mode: a=1 b=1",
            "B uninstalled: a=1 b=0",
            "A uninstalled at last: a=0 b=0",
        ],
        "{case}"
    );
}

/// Two copies of memhook with the CUDA hooks, on the fake driver: the
/// second copy's bistro and procaddr hooks are refused, with a reason
/// that names the cause (`dlsym` answers with the first copy's hooks,
/// which lie outside libcuda), and both copies see the allocation.
#[test]
fn two_copies_of_memhook_with_the_cuda_hooks() {
    let dir = out_dir();
    let fake = memhook_tests::fakecuda::build(&dir.join("fakecuda-two"));
    let out = dir.join("two_instances_cuda");
    let rpath = format!("-Wl,-rpath,{}", fake.dir.display());
    // (The library comes before the program's object: kept with
    // --no-as-needed.)
    let libcuda = fake.libcuda.to_str().unwrap();
    cc_with(
        "two_instances_cuda.c",
        &out,
        true,
        &["-Wl,--no-as-needed", libcuda, &rpath],
    );
    let copy = dir.join("libmemhook-copy-cuda.so");
    std::fs::copy(lib_dir().join("libmemhook.so"), &copy).unwrap();
    let o = output_within(
        memhook_tests::command(&out).arg(&copy),
        std::time::Duration::from_secs(20),
    )
    .expect("hung");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("allocations seen: a=1 b=1"), "{stdout}");
    for mode in ["bistro", "procaddr"] {
        assert!(
            stdout.contains(&format!(
                "B: cuMemAlloc_v2 {mode} installed=0 dlsym answers a definition outside libcuda.so.1 (another hooker's)"
            )),
            "{stdout}"
        );
    }
    assert!(stdout.contains("B: cuMemAlloc_v2 reloc installed=1"), "{stdout}");
}

/// The C library's version, as (major, minor).
fn glibc_version() -> (u32, u32) {
    // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let mut parts = v.to_str().unwrap().split('.').map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[test]
fn a_second_namespace_libc_is_hooked() {
    if glibc_version() < (2, 35) {
        // Before 2.35 the loader keeps no list of its namespaces that
        // memhook can read (README, "Seen: a second loader namespace").
        eprintln!("skipped: glibc {:?} is older than 2.35", glibc_version());
        return;
    }
    let out = out_dir().join("namespaces");
    cc("namespaces.c", &out, true);
    let o = memhook_tests::command(&out).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("1 mapped, 2 unmapped"), "{stdout}");
}

#[test]
fn cuda_events_on_the_fake_driver() {
    let dir = out_dir();
    let fake = memhook_tests::fakecuda::build(&dir.join("fakecuda"));
    let out = dir.join("cuda_events");
    cc("cuda_events.c", &out, true);
    let o = memhook_tests::command(&out).arg(&fake.libcuda).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("4 allocations, 4 frees"), "{stdout}");
    assert!(
        stdout.contains(concat!("memhook ", env!("CARGO_PKG_VERSION"))),
        "{stdout}"
    );
}

/// The C API example built with AddressSanitizer and with
/// ThreadSanitizer (their shared runtimes, GCC's default), linked with
/// libmemhook.so: the install, the events of the program's own maps and
/// unmaps (through the sanitizer's interceptors to the C library's
/// functions, which bistro patched), the originals and the typed map
/// work as without one, and the sanitizer finds nothing to report.
/// Skipped for a sanitizer the compiler lacks, or whose programs cannot
/// run here (a kernel whose address space layout ThreadSanitizer does
/// not know).
#[test]
fn the_c_api_in_sanitized_programs() {
    let dir = out_dir();
    let probe_src = dir.join("probe.c");
    std::fs::write(&probe_src, "int main(void) { return 0; }\n").unwrap();
    for sanitizer in ["address", "thread"] {
        let flag = format!("-fsanitize={sanitizer}");
        let probe = dir.join(format!("probe_{sanitizer}"));
        let built = memhook_tests::cc::command()
            .arg(&flag)
            .arg(&probe_src)
            .arg("-o")
            .arg(&probe)
            .output()
            .unwrap();
        // Leak checking stops the world by ptrace, which a sandbox may
        // refuse: not what this test is about.
        let options = [("ASAN_OPTIONS", "detect_leaks=0"), ("TSAN_OPTIONS", "")];
        if !built.status.success() || !memhook_tests::command(&probe).envs(options).status().unwrap().success() {
            eprintln!("{flag}: not in this compiler, or its programs do not run here; not checked");
            continue;
        }
        let out = dir.join(format!("count_events_{sanitizer}"));
        cc_with("count_events.c", &out, true, &[&flag]);
        let o = memhook_tests::command(&out).envs(options).output().unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && stdout.contains("C ABI events test passed"),
            "{flag}: {}\n{stdout}{stderr}",
            o.status
        );
        assert!(!stderr.contains("Sanitizer"), "{flag}: {stderr}");
    }
}

/// The C API example under Valgrind's memcheck, as a developer runs a
/// program that embeds memhook: Valgrind runs the program on its own
/// copy of the code, so bistro's patches must be seen by it (it checks
/// code writes), and memcheck must find no read of memory memhook did
/// not initialise and no bad access in memhook's code (an error fails
/// the run: `--error-exitcode`). Skipped where Valgrind is not
/// installed.
#[test]
fn the_c_api_under_valgrind() {
    let version = Command::new("valgrind").arg("--version").output();
    if !version.is_ok_and(|o| o.status.success()) {
        eprintln!("valgrind is not installed: not checked");
        return;
    }
    let out = out_dir().join("count_events_valgrind");
    cc("count_events.c", &out, true);
    let o = memhook_tests::command("valgrind")
        .args(["-q", "--error-exitcode=9", "--leak-check=no"])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && stdout.contains("C ABI events test passed"),
        "{}\n{stdout}{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn trace_of_an_unmodified_program_under_ld_preload() {
    let out = out_dir().join("trace_preload");
    cc("trace_preload.c", &out, false);
    // The program's stderr under libmemhook.so with `var=value`; it runs
    // to its end whatever the setting.
    let stderr_with = |var: &str, value: &str| {
        let o = memhook_tests::command(&out)
            .env("LD_PRELOAD", lib_dir().join("libmemhook.so"))
            .env(var, value)
            .output()
            .unwrap();
        assert!(o.status.success(), "{var}={value}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = stderr_with("MEMHOOK_TRACE", "1");
    for line in [
        "MMAP addr=0x0 size=0x13000",
        "VM_MAPPED addr=",
        "VM_UNMAPPED addr=",
        "MUNMAP addr=",
    ] {
        assert!(
            err.lines().any(|l| l.contains(line) && l.contains("0x13000")),
            "no `{line}` line in the trace:\n{err}"
        );
    }
    // A bad mode is reported.
    let err = stderr_with("MEMHOOK_MMAP_HOOK_MODE", "bistr");
    assert!(err.contains("unknown hook mode `bistr`"), "{err}");
    // A trace setting other than 1 or 0 is reported, and no trace comes.
    let err = stderr_with("MEMHOOK_TRACE", "yes");
    assert!(
        err.contains("MEMHOOK_TRACE=`yes` is neither 1 (on) nor 0 (off)"),
        "{err}"
    );
    assert!(!err.contains("MMAP addr="), "{err}");
}

/// A thread whose cancellation is pending maps and unmaps (anonymous,
/// System V shared and hugetlb memory), none of it a cancellation point,
/// then calls `pthread_testcancel`: it gets through every call and is
/// cancelled there, with memhook in the way as without it. memhook's own
/// reads, writes and closes on a hook's path (the hugetlb page size
/// probe, `shmdt`'s look at the mappings, the trace and report handlers)
/// once were libc's, cancellation points: the first of them cancelled
/// the thread inside `shmat` (or `mmap`, traced), in the middle of a call
/// its caller may hold a lock across.
#[test]
fn a_pending_cancellation_waits_for_the_programs_own_cancellation_point() {
    let dir = out_dir();
    let (api, plain) = (dir.join("pending_cancel_api"), dir.join("pending_cancel"));
    cc_with("pending_cancel.c", &api, true, &["-DAPI", "-pthread"]);
    cc_with("pending_cancel.c", &plain, false, &["-pthread"]);
    let check = |what: &str, cmd: &mut Command| {
        let o = cmd.output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{what}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out.into_owned()
    };
    for mode in ["bistro", "reloc"] {
        let out = check(
            &format!("a handler of the program's, host hooks in {mode} mode"),
            memhook_tests::command(&api).env("MEMHOOK_MMAP_HOOK_MODE", mode),
        );
        let events: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("events "))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(events >= 12, "{mode}: the handler saw {events} events:\n{out}");
    }
    let preload = lib_dir().join("libmemhook.so");
    check(
        "MEMHOOK_TRACE=1",
        memhook_tests::command(&plain)
            .env("LD_PRELOAD", &preload)
            .env("MEMHOOK_TRACE", "1"),
    );
    let report = dir.join("pending_cancel.report");
    let file = std::fs::File::create(&report).unwrap();
    let mut cmd = memhook_tests::command(&plain);
    cmd.env("LD_PRELOAD", &preload).env("MEMHOOK_REPORT_FD", "3");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: dup2 (or, where the file is 3 already, fcntl) in the child
    // before exec, of a descriptor it inherits.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            let kept = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if kept < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    check("MEMHOOK_REPORT_FD=3", &mut cmd);
    let records = std::fs::metadata(&report).unwrap().len() / 256;
    assert!(records >= 12, "{records} records reported");
}

/// A thread cancelled inside a handler (the handler called `write` with
/// a cancellation pending) never comes back to memhook: registrations
/// after it return, the handlers left see every event, and new threads
/// dispatch, three times over (`cancel_in_handler.c`). Before, the dead
/// thread's mark on the handler table stayed, and the next registration
/// waited for it forever. A thread cancelled in a `MADVISE` handler
/// unwinds out of `madvise`'s hook too (in a build of the seventy-fifth
/// session's, whose hook could unwind from its look at memhook's own
/// pages, the unwinding ended the process). Where the reader slots are off (a kernel
/// without the expedited membarrier), readers count themselves in shared
/// counters that name no thread, and registration still waits: skipped.
#[test]
fn a_thread_cancelled_in_a_handler_holds_up_no_registration() {
    if !memhook::dispatch::reader_slots() {
        eprintln!("no reader slots here (the kernel has no expedited membarrier): not run");
        return;
    }
    let out = out_dir().join("cancel_in_handler");
    cc_with("cancel_in_handler.c", &out, true, &["-pthread"]);
    let Some(o) = output_within(&mut memhook_tests::command(&out), std::time::Duration::from_secs(60)) else {
        panic!("the program hung: a registration waited for the thread cancelled in its handler");
    };
    assert!(
        o.status.success() && o.stdout.starts_with(b"ok"),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A signal handler that registers a handler, interrupting its own
/// thread's registration or unregistration, is refused
/// (`MEMHOOK_ERR_HANDLER`, its message naming the signal handler) and the
/// program goes on: 20,000 rounds of the main thread's set and unset
/// under a 50 us timer whose handler sets and unsets too
/// (`register_in_signal.c`). Before, the signal handler spun on the
/// writer's lock its own thread held, for good.
#[test]
fn a_signal_handler_that_registers_never_waits_for_its_own_thread() {
    runs_its_rounds("register_in_signal", "registration");
}

/// Builds and runs the example `name` (`ffi/examples/signal_rounds.h`'s
/// rounds under a timer): it must finish within 120 s and exit 0 (it
/// ends itself with 3 where a round is stuck). `what`: what a hang
/// would say waited.
fn runs_its_rounds(name: &str, what: &str) {
    let out = out_dir().join(name);
    cc_with(&format!("{name}.c"), &out, true, &["-pthread"]);
    let Some(o) = output_within(&mut memhook_tests::command(&out), std::time::Duration::from_secs(120)) else {
        panic!("the program hung: a signal handler's {what} waited for its own thread");
    };
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&o.stdout).trim());
}

/// A signal handler that installs, or registers a handler (which installs
/// where nothing is installed), interrupting its own thread's install or
/// uninstall, is refused (`MEMHOOK_ERR_BUSY`, its message naming the
/// signal handler) and the program goes on: 1,000 rounds of the main
/// thread's install and uninstall under a 50 us timer whose handler calls
/// `memhook_install` and `memhook_set_event_handler`
/// (`install_in_signal.c`); after them the hooks report the main thread's
/// `munmap`. Before, the signal handler spun on the install lock its own
/// thread held, for good (stuck in the first round).
#[test]
fn a_signal_handler_that_installs_never_waits_for_its_own_thread() {
    runs_its_rounds("install_in_signal", "install");
}

/// A statically linked program with memhook in it (`static_program.c`,
/// `-static` against `libmemhook.a`): every host function's status says
/// it is not hooked because the program is statically linked, in bistro
/// and in reloc mode. Before, bistro listed them as waiting for a library
/// to load ("no such symbol in the loaded objects"), and reloc blamed
/// dlopen ("dlopen/dlclose not found"). Skipped where the C library has
/// no static archive to link with.
#[test]
fn a_static_program_is_told_its_host_functions_are_not_hooked() {
    let out = out_dir().join("static_program");
    let mut c = memhook_tests::cc::command();
    c.args(["-O2", "-Wall", "-Werror", "-static", "-I"])
        .arg(root().join("include"))
        .arg(root().join("ffi/examples/static_program.c"))
        .arg(lib_dir().join("libmemhook.a"))
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&out);
    let built = c.output().unwrap();
    if !built.status.success() {
        eprintln!(
            "skipped: no static link here: {}",
            String::from_utf8_lossy(&built.stderr).lines().last().unwrap_or("")
        );
        return;
    }
    let o = memhook_tests::command(&out).output().unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A process with no `/proc` mounted (`no_proc.c`, in a mount namespace
/// whose `/proc` is an empty file system): the host hooks install in
/// bistro mode and report a `munmap`, and the looks at the mappings that
/// failed are counted. Before, every bistro patch was refused ("no
/// trampoline page could be mapped": the free space near libc was read
/// from `/proc/self/maps`), and with the default host mode no host event
/// came at all. Skipped where no mount namespace can be made (not root,
/// no `unshare`, a container without the capability).
#[test]
fn bistro_hooks_without_proc_mounted() {
    let out = out_dir().join("no_proc");
    cc("no_proc.c", &out, true);
    let Some(o) = memhook_tests::without_proc(&out, &[], &[]) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}: {stdout}{stderr}", o.status);
}

/// `shmdt` in a process with no descriptor left under its limit (memhook
/// cannot open `/proc/self/maps` to see what the detach unmaps) reports
/// `VM_UNMAPPED` of the whole segment, in both host modes, from what the
/// `shmat` hook remembered (`shm_no_descriptors.c`). Before, it reported
/// nothing: a registration cache kept the detached range. The look that
/// failed is counted (`memhook_mapping_looks_failed`), and none with
/// descriptors to spare.
#[test]
fn shmdt_with_no_descriptor_left_reports_the_segment() {
    let out = out_dir().join("shm_no_descriptors");
    cc("shm_no_descriptors.c", &out, true);
    for mode in ["bistro", "reloc"] {
        let o = memhook_tests::command(&out)
            .env("MEMHOOK_MMAP_HOOK_MODE", mode)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{mode}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// An unmodified program that moves pages with userfaultfd's `UFFDIO_MOVE`
/// (a compacting garbage collector's way, with no call on either
/// mapping), under `LD_PRELOAD=libmemhook.so MEMHOOK_TRACE=1`, in bistro
/// and in reloc mode (the program's own `ioctl` slot): the trace has
/// `VM_UNMAPPED` of exactly the range it moved from. Skipped, with the
/// program's reason, where no userfaultfd can be made or the kernel has
/// no `UFFDIO_MOVE` (before Linux 6.8).
#[test]
fn a_preloaded_library_reports_the_pages_userfaultfd_moves() {
    let out = out_dir().join("uffd_move");
    cc("uffd_move.c", &out, false);
    for mode in ["bistro", "reloc"] {
        let o = memhook_tests::command(&out)
            .env("LD_PRELOAD", lib_dir().join("libmemhook.so"))
            .env("MEMHOOK_TRACE", "1")
            .env("MEMHOOK_MMAP_HOOK_MODE", mode)
            .env("MEMHOOK_CUDA_HOOK_MODE", "none")
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{mode}: {:?}\n{stdout}{stderr}", o.status);
        if let Some(why) = stdout.strip_prefix("skipped: ") {
            eprintln!("UFFDIO_MOVE under LD_PRELOAD: {}, not checked", why.trim());
            return;
        }
        let moved: Vec<&str> = stdout
            .lines()
            .find_map(|l| l.strip_prefix("moved "))
            .unwrap_or_else(|| panic!("{mode}: no `moved` line: {stdout}"))
            .split(' ')
            .collect();
        let want = format!("VM_UNMAPPED addr={} size={}", moved[0], moved[1]);
        assert_eq!(
            stderr.lines().filter(|l| l.ends_with(&want)).count(),
            1,
            "{mode}: `{want}` once in the trace:\n{stderr}"
        );
    }
}

/// Reloc mode rewrites the program's own GOT slots, position-independent
/// or not: a program that exports nothing has a GNU hash table that
/// hashes no symbol (ld.bfd then writes a `symoffset` of 1), which once
/// hid every import of a non-PIE program from reloc.
#[test]
fn reloc_mode_hooks_the_program_itself_pie_or_not() {
    for (name, flags) in [("trace_pie", "-pie"), ("trace_no_pie", "-no-pie")] {
        let out = out_dir().join(name);
        cc_with("trace_preload.c", &out, false, &["-fPIE", flags]);
        let o = memhook_tests::command(&out)
            .env("LD_PRELOAD", lib_dir().join("libmemhook.so"))
            .env("MEMHOOK_TRACE", "1")
            .env("MEMHOOK_MMAP_HOOK_MODE", "reloc")
            .env("MEMHOOK_CUDA_HOOK_MODE", "none")
            .output()
            .unwrap();
        assert!(o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        for line in ["MMAP addr=0x0 size=0x13000", "MUNMAP addr="] {
            assert!(
                err.lines().any(|l| l.contains(line) && l.contains("0x13000")),
                "{name}: no `{line}` line in the trace:\n{err}"
            );
        }
    }
}

//! The C programs of `ffi/examples/`, built with the system C compiler
//! against `include/memhook.h` and `libmemhook.so`, and run: a handler
//! counting events, a second namespace's libc (`dlmopen`), libmemhook.so
//! closed after install (it stays loaded), the CUDA hooks
//! on the fake driver, and an unmodified
//! program under `LD_PRELOAD=libmemhook.so MEMHOOK_TRACE=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The folder with libmemhook.so (this test's target folder).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    assert!(
        dir.join("libmemhook.so").is_file(),
        "libmemhook.so is built next to the tests ({})",
        dir.display()
    );
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

fn cc_with(src: &str, out: &Path, link_memhook: bool, extra: &[&str]) {
    let mut c = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    c.args(extra)
        .args(["-O2", "-Wall", "-Werror", "-I"])
        .arg(root().join("include"))
        .arg(root().join("ffi/examples").join(src))
        .arg("-o")
        .arg(out);
    if link_memhook {
        let lib = lib_dir();
        c.arg("-L").arg(&lib).arg("-lmemhook").arg("-ldl");
        c.arg(format!("-Wl,-rpath,{}", lib.display()));
    }
    assert!(c.status().expect("a C compiler (cc)").success(), "building {src}");
}

#[test]
fn count_events() {
    let out = out_dir().join("count_events");
    cc("count_events.c", &out, true);
    let o = Command::new(&out).output().unwrap();
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
    for config in ["mmap=bistro;cuda=none", "mmap=reloc;cuda=none"] {
        let o = Command::new(&out)
            .arg(lib_dir().join("libmemhook.so"))
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

#[test]
fn a_second_namespace_libc_is_hooked() {
    let out = out_dir().join("namespaces");
    cc("namespaces.c", &out, true);
    let o = Command::new(&out).output().unwrap();
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
    let o = Command::new(&out).arg(&fake.libcuda).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("4 allocations, 4 frees"), "{stdout}");
    assert!(
        stdout.contains(concat!("memhook ", env!("CARGO_PKG_VERSION"))),
        "{stdout}"
    );
}

#[test]
fn trace_of_an_unmodified_program_under_ld_preload() {
    let out = out_dir().join("trace_preload");
    cc("trace_preload.c", &out, false);
    let o = Command::new(&out)
        .env("LD_PRELOAD", lib_dir().join("libmemhook.so"))
        .env("MEMHOOK_TRACE", "1")
        .output()
        .unwrap();
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
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
    // A bad mode is reported, and the program still runs.
    let o = Command::new(&out)
        .env("LD_PRELOAD", lib_dir().join("libmemhook.so"))
        .env("MEMHOOK_MMAP_HOOK_MODE", "bistr")
        .output()
        .unwrap();
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown hook mode `bistr`"), "{err}");
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
        let o = Command::new(&out)
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

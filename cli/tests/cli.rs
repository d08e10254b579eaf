//! The `memhook` command, run as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn memhook() -> Command {
    memhook_tests::command(env!("CARGO_BIN_EXE_memhook"))
}

/// Makes sure libmemhook.so, built from the current sources, sits next
/// to the binary (`run` preloads it).
fn with_library() {
    let dir = Path::new(env!("CARGO_BIN_EXE_memhook")).parent().unwrap();
    memhook_tests::libmemhook::libmemhook(dir, true);
}

/// Whether the file `path` exists within 10 s (a program under `memhook
/// run` that marks how far it got).
fn appears(path: &Path) -> bool {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !path.exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    path.exists()
}

/// The line of `memhook doctor` that starts with `key` (empty if none).
fn doctor_line(key: &str) -> String {
    let doctor = text(&memhook().arg("doctor").output().unwrap());
    doctor
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_default()
        .to_string()
}

/// `memhook run --json -- prog`: its JSON line, once it ended well.
fn run_json(prog: &Path) -> String {
    let o = memhook().args(["run", "--json", "--"]).arg(prog).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn work() -> PathBuf {
    let d = std::env::temp_dir().join(format!("memhook-cli-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A program that uses the fake CUDA driver: five allocations of 1 MiB,
/// three freed; and four mappings of 1 MiB, three unmapped.
const PROGRAM: &str = r#"
#include <sys/mman.h>
typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *, unsigned long);
int cuMemFree_v2(CUdeviceptr);
int main(void) {
    CUdeviceptr p[5];
    for (int i = 0; i < 5; i++)
        if (cuMemAlloc_v2(&p[i], 1 << 20) != 0) return 10;
    for (int i = 0; i < 3; i++)
        if (cuMemFree_v2(p[i]) != 0) return 11;
    void *m[4];
    for (int i = 0; i < 4; i++)
        m[i] = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < 3; i++)
        munmap(m[i], 1 << 20);
    return 0;
}
"#;

/// The program, built once (tests run on threads of one process, and
/// two builds into one folder at once would link half-written files).
fn program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_program).clone()
}

fn build_program() -> PathBuf {
    let dir = work();
    let fake = memhook_tests::fakecuda::build(&dir.join("fakecuda"));
    let src = dir.join("prog.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let out = dir.join("prog");
    memhook_tests::cc::build(
        memhook_tests::cc::command()
            .arg("-O1")
            .arg(&src)
            .arg(&fake.libcuda)
            .arg(format!("-Wl,-rpath,{},--disable-new-dtags", fake.dir.display()))
            .arg("-o")
            .arg(&out),
        "prog.c",
    );
    out
}

/// `"key": value` somewhere in the JSON.
fn field(json: &str, key: &str) -> Option<u64> {
    let at = json.find(&format!("\"{key}\": "))? + key.len() + 4;
    json[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[test]
fn run_counts_events_by_kind_and_function() {
    with_library();
    let prog = program();
    let json = run_json(&prog);
    assert_eq!(field(&json, "exit_status"), Some(0), "{json}");
    assert_eq!(field(&json, "MEM_TYPE_ALLOC"), Some(5), "{json}");
    assert_eq!(field(&json, "MEM_TYPE_FREE"), Some(3), "{json}");
    assert_eq!(field(&json, "cuMemAlloc_v2"), Some(5), "{json}");
    assert_eq!(field(&json, "cuMemFree_v2"), Some(3), "{json}");
    assert_eq!(field(&json, "cuda"), Some(2 << 20), "two allocations alive: {json}");
    assert!(field(&json, "mmap").unwrap() >= 4, "{json}");
    assert!(field(&json, "munmap").unwrap() >= 3, "{json}");
    assert!(field(&json, "host").unwrap() >= 1 << 20, "one mapping alive: {json}");
    assert!(
        json.contains(
            r#"{"function": "cuMemAlloc_v2", "library": "libcuda.so.1", "mode": "bistro", "installed": true"#
        ),
        "{json}"
    );
    // The text summary, with a mode chosen on the command line.
    let o = memhook()
        .args(["run", "--cuda-mode", "reloc", "--"])
        .arg(&prog)
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("events by function:") && t.contains("cuMemAlloc_v2"), "{t}");
    assert!(t.contains("reloc"), "{t}");
}

/// A program that opens a second libc in a loader namespace of its own
/// and maps and unmaps through it, keeping the namespace open to exit.
const NAMESPACE_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/mman.h>
int main(void) {
    void *h = dlmopen(LM_ID_NEWLM, "libc.so.6", RTLD_NOW);
    if (!h) return 10;
    void *(*ns_mmap)(void *, size_t, int, int, int, long) = (void *(*)(void *, size_t, int, int, int, long))dlsym(h, "mmap");
    int (*ns_munmap)(void *, size_t) = (int (*)(void *, size_t))dlsym(h, "munmap");
    if (!ns_mmap || !ns_munmap) return 11;
    void *p = ns_mmap(0, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || ns_munmap(p, 1 << 16) != 0) return 12;
    return 0;
}
"#;

/// `memhook run` says how the libc of each loader namespace the program
/// opened stands at its exit, in the JSON (`namespaces`) and the text
/// summary; a program that opens none has an empty list.
#[test]
fn run_reports_the_loader_namespaces_a_program_opened() {
    with_library();
    let line = doctor_line("loader namespaces:");
    if !line.contains("followed:") {
        eprintln!("skipped: this glibc's namespaces are not followed ({line})");
        return;
    }
    let prog = build_c_with("namespace", NAMESPACE_PROGRAM, &["-ldl"]);
    let json = run_json(&prog);
    let at = json.find("\"namespaces\": [{").expect("a namespace listed");
    let listed = &json[at..];
    let (functions, hooked) = (field(listed, "functions").unwrap(), field(listed, "hooked").unwrap());
    assert!(field(listed, "namespace").unwrap() >= 1, "{json}");
    assert!(functions >= 8 && hooked == functions, "{json}");
    assert!(listed.contains("\"reason\": \"\""), "{json}");
    let o = memhook().args(["run", "--"]).arg(&prog).output().unwrap();
    let t = text(&o);
    assert!(
        t.contains("loader namespaces of their own")
            && t.contains(&format!(": {functions} of {functions} host functions hooked")),
        "{t}"
    );
    // None opened: an empty list, and no such section.
    let o = memhook().args(["run", "--json", "--", "true"]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"namespaces\": []"),
        "{}",
        text(&o)
    );
    let o = memhook().args(["run", "--", "true"]).output().unwrap();
    assert!(!text(&o).contains("loader namespaces"), "{}", text(&o));
}

/// A program that patches its own function through the C API while a
/// thread is blocked in a system call made inside the bytes the patch
/// overwrites: memhook moves that thread to the trampoline, and says so
/// (`memhook_threads_moved`, then the report at exit). Exit status 0 when
/// the blocked call completes, the hook sees the next call, and the
/// count is 1.
#[cfg(target_arch = "x86_64")]
const MOVES_A_THREAD: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
/* sys4(a0, a1, a2, nr): `mov eax, ecx; syscall; nop; ret`, so a thread
   blocked in it stands 4 bytes in: inside a 5-byte jump. */
__asm__(".text\n.globl sys4\n.type sys4, @function\n.p2align 4\n"
        "sys4:\n mov %ecx, %eax\n syscall\n nop\n ret\n int3\n");
long sys4(long, long, long, long);
static long (*original)(long, long, long, long);
static long hooked;
static long hook(long a0, long a1, long a2, long nr) { hooked++; return original(a0, a1, a2, nr); }
static int fds[2];
static volatile int reader_tid;
static void *reader(void *arg) {
    char c = 0;
    reader_tid = syscall(SYS_gettid);
    long n = sys4(fds[0], (long)&c, 1, SYS_read);
    return (void *)(long)(n == 1 && c == 'x');
}
/* Whether thread `tid` is blocked in read(2) (the first field of its
   syscall file is the call's number). */
static int blocked_in_read(int tid) {
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strncmp(buf, "0 ", 2) == 0;
}
int main(void) {
    int (*patch)(void *, void *, void **, void **) = dlsym(RTLD_DEFAULT, "memhook_patch");
    uint64_t (*moved)(void) = dlsym(RTLD_DEFAULT, "memhook_threads_moved");
    uint64_t (*unchecked)(void) = dlsym(RTLD_DEFAULT, "memhook_threads_unchecked");
    if (!patch || !moved || !unchecked) return 10;
    if (pipe(fds)) return 11;
    pthread_t t;
    if (pthread_create(&t, 0, reader, 0)) return 12;
    for (int i = 0; !(reader_tid && blocked_in_read(reader_tid)); i++) {
        if (i > 10000) return 13;
        usleep(1000);
    }
    void *handle;
    if (patch((void *)sys4, (void *)hook, (void **)&original, &handle) != 0) return 14;
    if (moved() != 1 || unchecked() != 0) return 15;
    if (write(fds[1], "x", 1) != 1) return 16;
    void *ok;
    if (pthread_join(t, &ok) || !ok) return 17;
    if (sys4(0, 0, 0, SYS_getpid) != getpid() || hooked != 1) return 18;
    return 0;
}
"#;

/// `memhook run` says how many threads memhook moved out of bytes it was
/// patching, summed over the processes (`threads_moved` in the JSON, a
/// line of the text), and how many patches went unchecked; a program
/// that patches nothing under a thread reports 0 and no such line.
#[cfg(target_arch = "x86_64")]
#[test]
fn run_reports_the_threads_moved_out_of_patched_bytes() {
    with_library();
    let line = doctor_line("threads in patches:");
    if !line.contains("moved out") {
        eprintln!("skipped: threads cannot be moved out here ({line})");
        return;
    }
    let prog = build_c_with("moves_a_thread", MOVES_A_THREAD, &["-pthread", "-ldl"]);
    let json = run_json(&prog);
    assert_eq!(field(&json, "threads_moved"), Some(1), "{json}");
    assert_eq!(field(&json, "threads_unchecked"), Some(0), "{json}");
    let o = memhook().args(["run", "--"]).arg(&prog).output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("threads moved out of bytes being patched: 1 "), "{t}");
    assert!(!t.contains("unchecked"), "{t}");
    let o = memhook().args(["run", "--json", "--", "true"]).output().unwrap();
    let json = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(field(&json, "threads_moved"), Some(0), "{json}");
    assert_eq!(field(&json, "threads_unchecked"), Some(0), "{json}");
    let o = memhook().args(["run", "--", "true"]).output().unwrap();
    assert!(!text(&o).contains("threads moved"), "{}", text(&o));
}

/// A shared mapping of a memfd, the file emptied by `ftruncate` with no
/// descriptor left under the process's limit: memhook cannot open
/// `/proc/self/maps` to find the file's mappings.
const TRUNCATES_WITH_NO_DESCRIPTOR: &str = r#"
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
int main(void) {
    int fd = memfd_create("memhook-looks", 0);
    if (fd < 0 || ftruncate(fd, 8192)) return 10;
    char *a = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (a == MAP_FAILED) return 11;
    a[0] = 1;
    int lowest = dup(fd);
    if (lowest < 0) return 12;
    close(lowest);
    struct rlimit old, none;
    if (getrlimit(RLIMIT_NOFILE, &old)) return 13;
    none = old;
    none.rlim_cur = (rlim_t)lowest;
    if (setrlimit(RLIMIT_NOFILE, &none)) return 14;
    int refused = open("/proc/self/maps", O_RDONLY) < 0;
    int cut = ftruncate(fd, 0) == 0;
    setrlimit(RLIMIT_NOFILE, &old);
    return refused && cut ? 0 : 15;
}
"#;

/// `memhook run` says how many looks at a process's mappings could not
/// read them (`mapping_looks_failed` in the JSON, a line of the text):
/// the cue, for a user, that a file emptied then may have taken pages of
/// its mappings unreported. 0, and no line, where every look was made.
#[test]
fn run_reports_the_looks_at_the_mappings_that_failed() {
    with_library();
    let prog = build_c("truncates_with_no_descriptor", TRUNCATES_WITH_NO_DESCRIPTOR);
    let json = run_json(&prog);
    assert!(field(&json, "mapping_looks_failed").is_some_and(|n| n >= 1), "{json}");
    said_only_where_counted(
        &prog,
        "mapping_looks_failed",
        "looks at the mappings that could not read them: ",
    );
}

/// `prog`'s text summary under `memhook run` has the line that starts
/// with `line`; a run of `true` has none, and 0 for `key` in its JSON.
fn said_only_where_counted(prog: &Path, key: &str, line: &str) {
    let o = memhook().args(["run", "--"]).arg(prog).output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains(line), "{t}");
    let o = memhook().args(["run", "--json", "--", "true"]).output().unwrap();
    let json = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(field(&json, key), Some(0), "{json}");
    let o = memhook().args(["run", "--", "true"]).output().unwrap();
    assert!(!text(&o).contains(line), "{}", text(&o));
}

/// Discards (`MADV_DONTNEED`) the page of libc's `munmap` and the page of
/// its original (memhook's trampoline, found through the preloaded
/// library), then unmaps a page of its own: 0 where memhook kept both
/// pages (`memhook_discards_kept` counts the two calls) and the program
/// lived through the unmap; 10 and up where a step failed.
const DISCARDS_MEMHOOKS_PAGES: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
int main(void) {
    void *(*original)(const char *) = (void *(*)(const char *))dlsym(RTLD_DEFAULT, "memhook_original");
    uint64_t (*kept)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "memhook_discards_kept");
    if (!original || !kept) return 10;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t at[2] = {(uintptr_t)dlsym(RTLD_DEFAULT, "munmap"), (uintptr_t)original("munmap")};
    if (!at[0] || !at[1]) return 11;
    for (int i = 0; i < 2; i++)
        if (madvise((void *)(at[i] & ~(page - 1)), page, MADV_DONTNEED)) return 12;
    void *p = mmap(0, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || munmap(p, page)) return 13;
    return kept() == 2 ? 0 : 14;
}
"#;

/// `memhook run` says how many `madvise` calls were made around memhook's
/// own pages (`discards_kept` in the JSON, a line of the text), and the
/// program that made them runs on: its unmap after the discards is
/// reported (the patch still in place) and goes through the trampoline
/// (still code). Before, the entry's page read libc's own bytes again and
/// the trampoline's zeros crashed the program. 0, and no line, where no
/// call touched them.
#[test]
fn run_reports_the_discards_made_around_memhooks_pages() {
    with_library();
    // dlsym: in libdl before glibc 2.34.
    let prog = build_c_with("discards_memhooks_pages", DISCARDS_MEMHOOKS_PAGES, &["-ldl"]);
    let json = run_json(&prog);
    assert_eq!(field(&json, "discards_kept"), Some(2), "{json}");
    assert_eq!(field(&json, "exit_status"), Some(0), "{json}");
    said_only_where_counted(&prog, "discards_kept", "discards made around memhook's pages: ");
}

/// Builds C `source` into the work folder as `name`.
fn build_c(name: &str, source: &str) -> PathBuf {
    build_c_with(name, source, &[])
}

/// Builds C `source` into the work folder as `name`, linked with `args`.
fn build_c_with(name: &str, source: &str, args: &[&str]) -> PathBuf {
    let (mut cc, out) = c_command(name, source, args);
    memhook_tests::cc::build(&mut cc, name);
    out
}

/// [`build_c_with`] for a build this compiler may not manage (a flag or
/// an archive it lacks): the compiler's output where it fails.
fn try_build_c(name: &str, source: &str, args: &[&str]) -> Result<PathBuf, Output> {
    let (mut cc, out) = c_command(name, source, args);
    let o = cc.output().unwrap();
    if o.status.success() { Ok(out) } else { Err(o) }
}

/// The compiler's command for C `source`, written to the work folder, into
/// `name` there with `args`; and that program's path.
fn c_command(name: &str, source: &str, args: &[&str]) -> (Command, PathBuf) {
    let dir = work();
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let mut cc = memhook_tests::cc::command();
    cc.arg(&src).args(args).arg("-o").arg(&out);
    (cc, out)
}

/// A program built with AddressSanitizer's shared runtime (GCC's
/// default): the runtime ends the process where a preloaded library comes
/// before it, so `memhook run` names it first (the program's `DT_NEEDED`
/// entry), and keeps it first where the user preloads it. The program's
/// own maps and unmaps are reported (through ASan's interceptors to the C
/// library's, which memhook hooks); ASan's allocator maps its memory by
/// its own system calls, which no hook sees. Before, the program exited
/// with status 1 at start ("ASan runtime does not come first in initial
/// library list"). Skipped where the compiler cannot build such a program
/// or it cannot run here without memhook.
#[test]
fn run_puts_an_asan_runtime_first() {
    with_library();
    let built = try_build_c(
        "asan",
        r#"
        #include <stdio.h>
        #include <sys/mman.h>
        int main(void) {
            for (int i = 0; i < 3; i++) {
                void *p = mmap(NULL, 7 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (p == MAP_FAILED || munmap(p, 7 * 4096) != 0) return 2;
            }
            puts("asan program ran");
            return 0;
        }
        "#,
        &["-fsanitize=address"],
    );
    // Leak checking at exit stops the world by ptrace, which a sandbox may
    // refuse: not what this test is about.
    let asan_options = "detect_leaks=0";
    let prog = match built {
        Ok(prog) => prog,
        Err(o) => {
            eprintln!("no AddressSanitizer in this compiler, not checked: {}", text(&o));
            return;
        }
    };
    let alone = Command::new(&prog).env("ASAN_OPTIONS", asan_options).output().unwrap();
    if !alone.status.success() {
        eprintln!(
            "an AddressSanitizer program does not run here, not checked: {}",
            text(&alone)
        );
        return;
    }
    let runtime = memhook_tests::cc::command()
        .arg("-print-file-name=libasan.so")
        .output()
        .unwrap();
    let runtime = String::from_utf8_lossy(&runtime.stdout).trim().to_string();
    for user_preload in [None, Some(runtime.as_str())] {
        let mut cmd = memhook();
        cmd.args(["run", "--json", "--"])
            .arg(&prog)
            .env("ASAN_OPTIONS", asan_options);
        match user_preload {
            Some(r) => cmd.env("LD_PRELOAD", r),
            None => cmd.env_remove("LD_PRELOAD"),
        };
        let o = cmd.output().unwrap();
        let t = text(&o);
        assert!(
            o.status.success() && t.contains("asan program ran"),
            "LD_PRELOAD {user_preload:?}: {t}"
        );
        assert_eq!(field(&t, "exit_status"), Some(0), "{t}");
        assert!(field(&t, "mmap").unwrap() >= 3, "LD_PRELOAD {user_preload:?}: {t}");
        assert!(field(&t, "munmap").unwrap() >= 3, "LD_PRELOAD {user_preload:?}: {t}");
    }
    // Started by a shell, whose needs are read instead: the run turns
    // ASan's check of its runtime's place off (the user's options kept).
    let o = memhook()
        .args(["run", "--json", "--", "sh", "-c"])
        .arg(format!("{} && {}", prog.display(), prog.display()))
        .env("ASAN_OPTIONS", asan_options)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(t.matches("asan program ran").count(), 2, "{t}");
    assert!(o.status.success(), "{t}");
    assert!(field(&t, "mmap").unwrap() >= 6, "{t}");
    // Where the user asks for the check, it is made, and the program
    // ends as ASan ends it.
    let o = memhook()
        .args(["run", "--", "sh", "-c"])
        .arg(prog.as_os_str())
        .env("ASAN_OPTIONS", "detect_leaks=0:verify_asan_link_order=1")
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("does not come first"),
        "{}",
        text(&o)
    );
}

/// A statically linked program reads no `LD_PRELOAD` (the kernel starts
/// it with no loader): `memhook run` says so before it runs it, and runs
/// it all the same, ending as it ends. Skipped where the C library has no
/// static archive.
#[test]
fn run_says_a_static_program_cannot_load_memhook() {
    with_library();
    let prog = match try_build_c("static", "int main(void) { return 3; }\n", &["-static"]) {
        Ok(prog) => prog,
        Err(o) => {
            eprintln!("no static C library here, not checked: {}", text(&o));
            return;
        }
    };
    let o = memhook().args(["run", "--"]).arg(&prog).output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(
        t.contains("is statically linked") && t.contains("cannot be loaded into it"),
        "{t}"
    );
    // A program started by the loader gets no such line.
    let o = memhook().args(["run", "--", "true"]).output().unwrap();
    assert!(!text(&o).contains("cannot be loaded"), "{}", text(&o));
}

/// A program the loader starts in its secure-execution mode (set-user-ID
/// to another user: `sudo` or `passwd` run by a user other than root)
/// ignores `LD_PRELOAD`'s paths: `memhook run` says so, as for a static
/// program, and runs it all the same. Needs root (to give the program
/// to another user); skipped otherwise.
#[test]
fn run_says_a_set_user_id_program_cannot_load_memhook() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: no program of another user can be made here, not checked");
        return;
    }
    with_library();
    let built = build_c(
        "setuid",
        "#include <sys/mman.h>\nint main(void) { void *p = mmap(0, 1 << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); munmap(p, 1 << 20); return 4; }\n",
    );
    let prog = built.with_file_name("setuid-nobody");
    std::fs::copy(&built, &prog).unwrap();
    let c = std::ffi::CString::new(prog.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; 65534 is nobody.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    let o = memhook().args(["run", "--json", "--"]).arg(&prog).output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(4), "{t}");
    assert!(
        t.contains("is set-user-ID to another user (the loader ignores LD_PRELOAD's paths")
            && t.contains("cannot be loaded into it"),
        "{t}"
    );
    assert_eq!(field(&t, "MMAP"), None, "nothing loaded, nothing reported: {t}");
    // Set-user-ID to its own user (root here): loaded, reported, no line.
    // SAFETY: as above.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 0, 0) }, 0);
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    let o = memhook().args(["run", "--json", "--"]).arg(&prog).output().unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(4), "{t}");
    assert!(!t.contains("cannot be loaded"), "{t}");
    assert!(field(&t, "MMAP").is_some_and(|n| n >= 1), "{t}");
}

/// A daemon's start: it closes the descriptor it inherited for the
/// records and opens its log on that number, then maps and unmaps; the
/// log must hold only what the program wrote.
const REUSES_THE_DESCRIPTOR: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *v = getenv("MEMHOOK_REPORT_FD");
    if (!v) return 10;
    int fd = atoi(v);
    close(fd);
    int f = open(argv[1], O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (f < 0 || (f != fd && (dup2(f, fd) != fd || close(f) != 0))) return 11;
    for (int i = 0; i < 10; i++) {
        void *p = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED || munmap(p, 1 << 20) != 0) return 12;
    }
    if (write(fd, "log\n", 4) != 4 || close(fd) != 0) return 13;
    struct stat st;
    return stat(argv[1], &st) == 0 && st.st_size == 4 ? 0 : 14;
}
"#;

/// A program that outlives `memhook run` (killed): it says it started
/// (`argv[2]`), and after a pause maps and unmaps, then leaves a mark
/// (`argv[1]`).
const OUTLIVES_THE_READER: &str = r#"
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int s = open(argv[2], O_CREAT | O_WRONLY, 0644);
    if (s < 0 || close(s) != 0) return 11;
    usleep(500 * 1000);
    for (int i = 0; i < 100; i++) {
        void *p = mmap(0, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED || munmap(p, 1 << 16) != 0) return 12;
    }
    int f = open(argv[1], O_CREAT | O_WRONLY, 0644);
    return f >= 0 && close(f) == 0 ? 0 : 13;
}
"#;

/// The records' descriptor is the program's to close: a file that gets
/// its number afterwards receives no record (it used to get every event
/// as 256 bytes of binary), and the program runs on. And a program that
/// outlives `memhook run` is not ended by a SIGPIPE at its next event.
#[test]
fn run_never_writes_into_the_programs_files_nor_ends_it() {
    with_library();
    let prog = build_c("reuse", REUSES_THE_DESCRIPTOR);
    let log = work().join("reuse.log");
    let o = memhook()
        .args(["run", "--json", "--"])
        .arg(&prog)
        .arg(&log)
        .output()
        .unwrap();
    let json = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        field(&json, "exit_status"),
        Some(0),
        "the program's checks (14: its log held more than its line): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        std::fs::read(&log).unwrap(),
        b"log\n",
        "the log holds the program's line only"
    );

    let prog = build_c("outlive", OUTLIVES_THE_READER);
    let (mark, started) = (work().join("outlived"), work().join("started"));
    let _ = std::fs::remove_file(&mark);
    let _ = std::fs::remove_file(&started);
    let mut run = memhook()
        .args(["run", "--"])
        .arg(&prog)
        .arg(&mark)
        .arg(&started)
        .spawn()
        .unwrap();
    // Killed once the program runs (and before its pause ends).
    assert!(appears(&started), "the program started under memhook run");
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(
        appears(&mark),
        "the program ran to its end after memhook run was killed"
    );
}

/// A program started by one that closed the report descriptor, or
/// opened a file on its number (a script's `exec 4>log`), inherits the
/// variable that names it: its records must not go into that file (they
/// did: every status record and event, 3.4 MB for a short Python run),
/// and it reports through `MEMHOOK_REPORT_SOCKET` instead, so that its
/// events are counted (they were not).
#[test]
fn a_program_that_inherits_the_number_but_not_the_socket_reports_through_the_run_socket() {
    with_library();
    let prog = program();
    let log = work().join("reused-number.log");
    for (script, file) in [
        (r#"eval "exec ${MEMHOOK_REPORT_FD}>\"\$1\""; exec "$0""#, true),
        (r#"eval "exec ${MEMHOOK_REPORT_FD}>&-"; exec "$0""#, false),
    ] {
        let _ = std::fs::remove_file(&log);
        let o = memhook()
            .args(["run", "--json", "--", "sh", "-c", script])
            .arg(&prog)
            .arg(&log)
            .output()
            .unwrap();
        let json = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(o.status.success(), "{script}: {}", text(&o));
        if file {
            let written = std::fs::metadata(&log).map(|m| m.len());
            assert_eq!(
                written.ok(),
                Some(0),
                "the file on the reused number stays empty: {json}"
            );
        }
        assert!(!text(&o).contains("not open"), "nothing said of it: {}", text(&o));
        assert_eq!(field(&json, "MEM_TYPE_ALLOC"), Some(5), "{script}: counted: {json}");
        assert_eq!(
            field(&json, "processes"),
            Some(1),
            "{script}: one process, exec'd: {json}"
        );
        assert_eq!(field(&json, "MEM_TYPE_FREE"), Some(3), "{script}: {json}");
        assert_eq!(
            field(&json, "cuda"),
            Some(2 << 20),
            "{script}: two allocations alive: {json}"
        );
    }
}

/// Each process has its own address space: a forked child's unmap of
/// a mapping it inherited does not end its parent's, and the bytes alive
/// at exit are every process's.
const FORKS_AND_UNMAPS: &str = r#"
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    void *p = mmap(0, 1 << 24, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 10;
    pid_t pid = fork();
    if (pid == 0) {
        munmap(p, 1 << 24); /* the child's copy */
        void *q = mmap(0, 1 << 23, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        _exit(q == MAP_FAILED ? 11 : 0); /* q stays mapped to its end */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 12;
}
"#;

#[test]
fn bytes_alive_are_counted_per_process() {
    with_library();
    let prog = build_c("forks_and_unmaps", FORKS_AND_UNMAPS);
    let json = run_json(&prog);
    assert_eq!(
        field(&json, "processes"),
        Some(2),
        "the parent and its child reported: {json}"
    );
    let host = field(&json, "host").unwrap();
    assert!(
        host >= (1 << 24) + (1 << 23),
        "the parent's 16 MiB and the child's 8 MiB alive: {host}: {json}"
    );
}

/// `memhook run` ends as the command did: with its status, or by its
/// signal (which a shell reads as 128 plus the signal, and a script
/// interrupted by Ctrl-C stops at), naming the signal; a command that is
/// not there or cannot be run gives 127 or 126, as `env` and `timeout` do.
#[test]
fn run_keeps_the_exit_status() {
    use std::os::unix::process::ExitStatusExt;
    with_library();
    let o = memhook().args(["run", "--", "sh", "-c", "exit 3"]).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let o = memhook()
        .args(["run", "--json", "sh", "-c", "kill -9 $$"])
        .output()
        .unwrap();
    assert_eq!(o.status.signal(), Some(9), "{}", text(&o));
    let json = String::from_utf8_lossy(&o.stdout);
    assert_eq!(field(&json, "exit_status"), Some(137), "{json}");
    assert_eq!(field(&json, "signal"), Some(9), "{json}");
    let o = memhook().args(["run", "sh", "-c", "kill -TERM $$"]).output().unwrap();
    assert_eq!(o.status.signal(), Some(libc::SIGTERM), "{}", text(&o));
    assert!(!o.status.core_dumped(), "no core file of memhook's own");
    assert!(text(&o).contains("was killed by signal 15 (SIGTERM)"), "{}", text(&o));
    let o = memhook()
        .args(["run", "--json", "sh", "-c", "exit 4"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"signal\": null,"));

    let o = memhook().args(["run", "--", "/nonexistent/program"]).output().unwrap();
    assert_eq!(o.status.code(), Some(127), "{}", text(&o));
    assert!(text(&o).contains("cannot run /nonexistent/program"), "{}", text(&o));
    let not_executable = work().join("not-executable");
    std::fs::write(&not_executable, "data").unwrap();
    let o = memhook().arg("run").arg(&not_executable).output().unwrap();
    assert_eq!(o.status.code(), Some(126), "{}", text(&o));
}

/// Under `memhook run` (whose reports go by `send` on its socket), a
/// thread whose cancellation is pending gets through its maps and unmaps,
/// none of them a cancellation point, and is cancelled at its own
/// `pthread_testcancel` (`ffi/examples/pending_cancel.c`). Before, the
/// report handler's `send`, a cancellation point, cancelled it inside
/// its first `mmap`.
#[test]
fn run_leaves_a_pending_cancellation_to_the_programs_own_cancellation_point() {
    with_library();
    let source =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../ffi/examples/pending_cancel.c"))
            .unwrap();
    let prog = build_c_with("pending_cancel", &source, &["-pthread"]);
    let o = memhook().arg("run").arg(&prog).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("calls 30 of 30, cancelled 1"),
        "{}",
        text(&o)
    );
}

/// `memhook run -- sh -c script` in a process group of its own, started
/// with SIGINT's disposition `sigint` (which the command inherits), its
/// output piped where `piped`, else dropped.
fn run_with_sigint(script: &str, sigint: libc::sighandler_t, piped: bool) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let output = || {
        if piped {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        }
    };
    let mut run = memhook();
    run.args(["run", "--", "sh", "-c", script])
        .process_group(0)
        .stdout(output())
        .stderr(output());
    // SAFETY: runs in the child before exec; sigaction is
    // async-signal-safe.
    unsafe {
        run.pre_exec(move || {
            libc::signal(libc::SIGINT, sigint);
            Ok(())
        })
    };
    run.spawn().unwrap()
}

/// Ctrl-C reaches the terminal's whole foreground group: the command,
/// which decides what it means, and `memhook run`, which must not die
/// of it before the command ends, or its summary is lost. And a command
/// that ignores Ctrl-C because its caller did (a background job of a
/// script) still does under `memhook run`.
#[test]
fn ctrl_c_ends_the_command_not_the_summary() {
    with_library();
    let started = work().join("interrupted-started");
    let _ = std::fs::remove_file(&started);
    let script = format!(
        "trap 'exit 5' INT; touch {}; while :; do sleep 0.05; done",
        started.display()
    );
    // Ctrl-C as a terminal's user has it, whatever this test inherited
    // (a job started in the background by a shell without job control
    // ignores it, and so would the command: its trap would be refused).
    let mut run = run_with_sigint(&script, libc::SIG_DFL, true);
    assert!(appears(&started), "the command started under memhook run");
    // SAFETY: signals the group just made (memhook run and its command).
    assert_eq!(unsafe { libc::kill(-(run.id() as i32), libc::SIGINT) }, 0);
    assert!(
        memhook_tests::wait_within(&mut run, std::time::Duration::from_secs(30)),
        "memhook run and its command, after Ctrl-C: still running after 30 s"
    );
    let o = run.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(5), "the command's trap decided: {}", text(&o));
    assert!(text(&o).contains("exited with status 5"), "summarised: {}", text(&o));
    assert!(text(&o).contains("hooks:"), "{}", text(&o));

    // Started with Ctrl-C ignored: the command inherits that (and its
    // `trap` cannot take it back), so it runs on; a TERM then ends it.
    let _ = std::fs::remove_file(&started);
    let mut run = run_with_sigint(&script, libc::SIG_IGN, false);
    assert!(appears(&started), "the command started under memhook run");
    let group = -(run.id() as i32);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(group, libc::SIGINT) }, 0);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        run.try_wait().unwrap().is_none(),
        "the command ignores Ctrl-C as its caller did"
    );
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(group, libc::SIGTERM) }, 0);
    assert!(
        memhook_tests::wait_within(&mut run, std::time::Duration::from_secs(30)),
        "memhook run and its command, after a TERM: still running after 30 s"
    );
    let status = run.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.signal() == Some(libc::SIGTERM) || status.code() == Some(128 + libc::SIGTERM),
        "{status:?}"
    );
}

/// The running kernel's release string, and its major and minor numbers.
fn kernel_release() -> (String, u32, u32) {
    // SAFETY: a plain C struct, all zeros valid; uname fills it.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::uname(&mut uts) }, 0);
    // SAFETY: uname's fields are NUL-terminated.
    let release = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (release, major, minor)
}

/// `memhook doctor` says whether memory can change here with no hooked
/// call (an io_uring's requests), or by a call it sees only through libc
/// (userfaultfd's page moves), as this process finds by making the same
/// objects itself.
#[test]
fn doctor_says_whether_memory_can_change_past_the_hooks() {
    let o = memhook().arg("doctor").output().unwrap();
    let t = text(&o);
    let ring = t
        .lines()
        .find(|l| l.starts_with("io_uring:"))
        .expect("an io_uring line");
    let mut params = [0u64; 15];
    // SAFETY: io_uring_setup(2) writes the 120-byte parameters it is given.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd >= 0 {
        // SAFETY: the descriptor just made.
        unsafe { libc::close(fd as i32) };
        assert!(ring.contains("usable") && ring.contains("not reported"), "{ring}");
    } else {
        assert!(!ring.contains("usable"), "{ring}");
    }
    let moves = t
        .lines()
        .find(|l| l.starts_with("userfaultfd:"))
        .expect("a userfaultfd line");
    // SAFETY: userfaultfd(2) takes flags alone (1: UFFD_USER_MODE_ONLY).
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | 1) };
    if fd < 0 {
        assert!(moves.contains("not available"), "{moves}");
        return;
    }
    // SAFETY: the descriptor just made.
    unsafe { libc::close(fd as i32) };
    let (release, major, minor) = kernel_release();
    assert_eq!(
        moves.contains("UFFDIO_MOVE available") && moves.contains("VM_UNMAPPED of the source range"),
        (major, minor) >= (6, 8),
        "{release}: {moves}"
    );
}

/// `memhook` with `args` and `env` with no `/proc` mounted
/// ([`memhook_tests::without_proc`]): started by its path, or by its name
/// where `env` sets `PATH`.
fn without_proc(args: &[&str], env: &[(&str, &Path)]) -> Option<Output> {
    let by_name = env.iter().any(|&(k, _)| k == "PATH");
    let program = if by_name {
        "memhook"
    } else {
        env!("CARGO_BIN_EXE_memhook")
    };
    memhook_tests::without_proc(program, args, env)
}

/// `memhook doctor` says where the process's mappings cannot be read at
/// all (no `/proc` mounted: a chroot or sandbox without it), and what the
/// hooks then miss, where it said they were read from the text; and says
/// nothing of the kind where they can be. Its `code pages:` line says
/// there what it says with `/proc` (it said "NOT writable: libc's code
/// is not in /proc/self/maps", and bistro patched nothing).
#[test]
fn doctor_says_where_the_mappings_cannot_be_read() {
    let here = doctor_line("mappings:");
    assert!(!here.contains("CANNOT"), "{here}");
    let Some(o) = without_proc(&["doctor"], &[]) else {
        return;
    };
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let line = t.lines().find(|l| l.starts_with("mappings:")).expect("a mappings line");
    assert!(
        line.contains("CANNOT be read") && line.contains("mapping_looks_failed"),
        "{line}"
    );
    // Bistro patches there too (its trampolines placed without the map).
    let code = t
        .lines()
        .find(|l| l.starts_with("code pages:"))
        .expect("a code pages line");
    assert_eq!(
        code.contains("NOT writable"),
        doctor_line("code pages:").contains("NOT writable"),
        "{code}"
    );
}

/// `memhook run` with no `/proc` mounted: it finds itself, and the
/// library beside it, by the path it was started by, or by its name on
/// `PATH` (it stopped at "no /proc/self/exe available"), or is told
/// where the library is by `MEMHOOK_LIB`; each way the command runs with
/// the host hooks in bistro mode installed (`munmap` among them: they
/// were all refused there before the seventy-fourth session).
#[test]
fn run_without_proc_mounted() {
    with_library();
    let lib = Path::new(env!("CARGO_BIN_EXE_memhook")).with_file_name("libmemhook.so");
    let path = std::env::join_paths([lib.parent().unwrap(), Path::new("/usr/bin"), Path::new("/bin")]).unwrap();
    let path = Path::new(&path);
    for env in [&[][..], &[("PATH", path)][..], &[("MEMHOOK_LIB", lib.as_path())][..]] {
        let Some(o) = without_proc(&["run", "--json", "--", "true"], env) else {
            return;
        };
        let json = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{env:?}: {}", text(&o));
        assert!(
            json.contains(r#"{"function": "munmap", "library": "libc.so.6", "mode": "bistro", "installed": true"#),
            "{env:?}: {json}"
        );
    }
}

#[test]
fn doctor_names_each_check() {
    let o = memhook().arg("doctor").output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for check in [
        "code pages:",
        "environment:",
        "membarrier:",
        "threads in patches:",
        "dispatch readers:",
        "memtype map:",
        "hugetlb:",
        "mappings:",
        "loader:",
        "loader namespaces:",
        "forks:",
        "io_uring:",
        "userfaultfd:",
        "libcuda:",
        "GPUs:",
        "bistro dry run:",
        "verdict:",
    ] {
        assert!(t.lines().any(|l| l.starts_with(check)), "no `{check}` line:\n{t}");
    }
    assert!(
        t.contains("reloc alone cannot catch a statically linked CUDA runtime"),
        "{t}"
    );
    // Linux 6.11 and later answer PROCMAP_QUERY.
    let (release, major, minor) = kernel_release();
    let hugetlb = t.lines().find(|l| l.starts_with("hugetlb:")).unwrap();
    if (major, minor) >= (6, 11) && !hugetlb.contains("no huge page sizes") {
        assert!(hugetlb.contains("PROCMAP_QUERY)"), "{release}: {hugetlb}");
    }
    let mappings = t.lines().find(|l| l.starts_with("mappings:")).unwrap();
    assert_eq!(
        mappings.contains("asked of the kernel (PROCMAP_QUERY)"),
        (major, minor) >= (6, 11),
        "{release}: {mappings}"
    );
    // Where the loader's namespaces can be followed (glibc 2.35 and later
    // with a debugger interface), its lock over the objects is found too:
    // a child forked during another thread's walk finds it let go.
    let line = |key: &str| t.lines().find(|l| l.starts_with(key)).unwrap();
    assert_eq!(
        line("forks:").contains("let go"),
        line("loader namespaces:").contains("followed:"),
        "{t}"
    );
    // This machine reads its threads and leaves SIGURG to the default.
    assert!(
        t.lines()
            .any(|l| l.starts_with("threads in patches:") && l.contains("moved out") && l.contains("SIGURG")),
        "{t}"
    );
}

#[test]
fn scan_meets_the_coverage_bars_on_this_machine() {
    for (lib, bar) in [("libc.so.6", 98.5), ("libstdc++.so.6", 96.5), ("libm.so.6", 99.5)] {
        let path = [
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib64",
            "/usr/lib64",
        ]
        .iter()
        .map(|d| Path::new(d).join(lib))
        .find(|p| p.is_file());
        let Some(path) = path else {
            eprintln!("{lib} not found on this machine: skipped");
            continue;
        };
        let o = memhook().args(["scan", "--json"]).arg(&path).output().unwrap();
        let json = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(o.status.success(), "{}", text(&o));
        let (total, near) = (field(&json, "total").unwrap(), field(&json, "near").unwrap());
        let pct = 100.0 * near as f64 / total as f64;
        assert!(pct >= bar, "{lib}: {pct:.1}% near < {bar}%: {json}");
        let o = memhook().args(["scan", "--list"]).arg(&path).output().unwrap();
        let t = text(&o);
        assert!(t.contains('%'), "{t}");
        if field(&json, "refused").unwrap() > 0 {
            assert!(
                t.lines().any(|l| l.starts_with("    refused ") && l.contains(": ")),
                "refusals are listed with reasons: {t}"
            );
        }
        // Each function patched near at its entry is named, with why and
        // its first bytes (where a uprobe would turn its hook off).
        let unkept = t
            .lines()
            .filter(|l| l.starts_with("    entry not kept ") && l.contains("(first bytes: "))
            .count() as u64;
        assert_eq!(unkept, near - field(&json, "entry_kept").unwrap(), "{lib}: {json}\n{t}");
    }
}

#[test]
fn demo_shows_events() {
    let o = memhook().arg("demo").output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for want in [
        "MMAP",
        "VM_MAPPED",
        "VM_UNMAPPED",
        "MUNMAP",
        "memtype says host",
        "CUDA:",
    ] {
        assert!(t.contains(want), "no `{want}` in:\n{t}");
    }
    // Both large blocks are accounted for: each shows the allocator's own
    // call that provided it (glibc maps the first; its free raises the
    // mmap threshold, and the second comes from the break), or says why
    // there is none.
    let malloc = t
        .split("malloc + free")
        .nth(1)
        .and_then(|m| m.split("CUDA:").next())
        .unwrap_or("");
    let blocks: Vec<&str> = malloc.split("  block at ").skip(1).collect();
    assert_eq!(blocks.len(), 2, "{t}");
    assert!(blocks[0].contains("MMAP"), "glibc maps a first 8 MiB block:\n{t}");
    for b in blocks {
        assert!(
            ["MMAP", "SBRK", "MREMAP", "no event"].iter().any(|w| b.contains(w)),
            "a block without its allocator call in:\n{t}"
        );
    }
}

/// The hook modes `run` installed, as its JSON lists them.
fn modes_installed(json: &str) -> Vec<&str> {
    let mut modes: Vec<&str> = json
        .split(r#""mode": ""#)
        .skip(1)
        .filter_map(|m| m.split('"').next())
        .collect();
    modes.sort_unstable();
    modes.dedup();
    modes
}

/// `run`'s options with a value take it after `=` too (`--mmap-mode=reloc`),
/// as after a space; a flag given a value is refused.
#[test]
fn run_takes_an_options_value_after_an_equals_sign() {
    with_library();
    let json = |args: &[&str]| {
        let o = memhook()
            .arg("run")
            .args(args)
            .args(["--json", "--", "true"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    for mode in ["reloc", "bistro"] {
        let spaced = json(&["--mmap-mode", mode, "--cuda-mode", "none"]);
        let joined = json(&[&format!("--mmap-mode={mode}"), "--cuda-mode=none"]);
        assert_eq!(modes_installed(&spaced), [mode], "{spaced}");
        assert_eq!(modes_installed(&joined), [mode], "{joined}");
    }
    let o = memhook().args(["run", "--json=yes", "--", "true"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--json takes no value"),
        "{}",
        text(&o)
    );
}

/// `--help` after any command prints the usage on stdout and succeeds;
/// after `run`'s command it is the command's.
#[test]
fn help_of_each_command_is_the_usage() {
    let usage = memhook().arg("--help").output().unwrap();
    assert!(usage.status.success());
    assert!(String::from_utf8_lossy(&usage.stdout).contains("memhook run ["));
    for args in [
        &["help"][..],
        &["-h"],
        &["run", "--help"],
        &["run", "-h"],
        &["scan", "--help"],
        &["doctor", "-h"],
        &["demo", "--help"],
    ] {
        let o = memhook().args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert_eq!(o.stdout, usage.stdout, "{args:?}");
    }
    with_library();
    let o = memhook()
        .args(["run", "--", "sh", "-c", "echo \"own $1\"", "sh", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "own --help\n");
}

#[test]
fn errors_are_one_line_and_non_zero() {
    let not_elf = work().join("not-elf.so");
    std::fs::write(&not_elf, b"hello").unwrap();
    let cases: [&[&str]; 12] = [
        &["bogus"],
        &["run", "--frobnicate", "--", "true"],
        &["run", "--frobnicate=1", "--", "true"],
        &["run"],
        &["run", "--cuda-mode", "bistr", "--", "true"],
        &["run", "--mmap-mode=procaddr", "--", "true"],
        &["run", "--mmap-mode"],
        &["scan", "--nope", "/bin/true"],
        &["scan", "/nonexistent/libfoo.so"],
        &["scan", not_elf.to_str().unwrap()],
        &["run", "--", "/nonexistent/program"],
        &["doctor", "--json"],
    ];
    for args in cases {
        let o = memhook().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: one line, got:\n{err}");
    }
}

//! Bistro on real code: hand-written prologues in a test shared library
//! (`tests/asm/prologues.S`) patched and called, a glibc function by name,
//! stacked hooks, refusals, and a stress test of patching while eight
//! threads call the function.
#![cfg(all(feature = "bistro", target_arch = "x86_64"))]

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};

use memhook::bistro::{BistroError, Hook, Request, can_patch};
use memhook::patch::{PatchError, RelocError};

#[path = "../../tests/src/cc.rs"]
mod cc;

/// The test library: `tests/asm/prologues.S` built into a shared object
/// with the system C compiler and dlopen'ed once. Its functions are far
/// (more than 2 GiB) from this executable's hooks, so every patch here also
/// goes through a far-jump slot near the library.
struct Prologues {
    rip: unsafe extern "C" fn(i32) -> i32,
    call: unsafe extern "C" fn(i32) -> i32,
    jcc: unsafe extern "C" fn(i32) -> i32,
    tiny: unsafe extern "C" fn() -> i32,
    looping: unsafe extern "C" fn(i32) -> i32,
    count: unsafe extern "C" fn(i32) -> i32,
    counter: &'static AtomicU64,
    /// `mh_t_count2` to `mh_t_count4`, each with its own counter.
    counts: [unsafe extern "C" fn(i32) -> i32; 3],
    counters: [&'static AtomicU64; 3],
    /// `mh_t_steps`: one-byte instructions under the patch.
    steps: unsafe extern "C" fn(i32) -> i32,
    steps_counter: &'static AtomicU64,
    /// `mh_t_sys(a0, a1, a2, nr)`: a system call under the patch.
    sys: Sys,
    /// `mh_t_frame`, `mh_t_alloca`, `mh_t_getpid`, `mh_t_single`,
    /// `mh_t_load`, `mh_t_test`, `mh_t_arg`: first instructions kept
    /// ahead of the patch.
    kept: [unsafe extern "C" fn(i32) -> i32; 7],
}

type Sys = unsafe extern "C" fn(usize, usize, usize, usize) -> isize;

fn lib() -> &'static Prologues {
    static LIB: OnceLock<Prologues> = OnceLock::new();
    LIB.get_or_init(|| {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/asm/prologues.S");
        let out = std::env::temp_dir().join(format!("memhook-prologues-{}.so", std::process::id()));
        cc::build(cc::command().args(["-shared", "-fPIC", "-o"]).arg(&out).arg(src), src);
        let path = std::ffi::CString::new(out.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path to the library just built.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {}", out.display());
        let _ = std::fs::remove_file(&out);
        let sym = |name: &std::ffi::CStr| {
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
            assert!(!p.is_null(), "{name:?}");
            p as usize
        };
        type F1 = unsafe extern "C" fn(i32) -> i32;
        type F0 = unsafe extern "C" fn() -> i32;
        // Each symbol is a function of the stated signature in prologues.S
        // (the counter an 8-byte aligned quad); the library is never closed.
        // SAFETY: as just said, for the one-argument functions.
        let f1 = |name: &std::ffi::CStr| unsafe { std::mem::transmute::<usize, F1>(sym(name)) };
        // SAFETY: as above.
        let f0 = |name: &std::ffi::CStr| unsafe { std::mem::transmute::<usize, F0>(sym(name)) };
        Prologues {
            rip: f1(c"mh_t_rip"),
            call: f1(c"mh_t_call"),
            jcc: f1(c"mh_t_jcc"),
            tiny: f0(c"mh_t_tiny"),
            looping: f1(c"mh_t_loop"),
            count: f1(c"mh_t_count"),
            // SAFETY: as above.
            counter: unsafe { &*(sym(c"mh_t_counter") as *const AtomicU64) },
            counts: [f1(c"mh_t_count2"), f1(c"mh_t_count3"), f1(c"mh_t_count4")],
            // SAFETY: as above.
            counters: [c"mh_t_counter2", c"mh_t_counter3", c"mh_t_counter4"]
                .map(|name| unsafe { &*(sym(name) as *const AtomicU64) }),
            steps: f1(c"mh_t_steps"),
            // SAFETY: as above.
            steps_counter: unsafe { &*(sym(c"mh_t_steps_counter") as *const AtomicU64) },
            // SAFETY: as above.
            sys: unsafe { std::mem::transmute::<usize, Sys>(sym(c"mh_t_sys")) },
            kept: [
                f1(c"mh_t_frame"),
                f1(c"mh_t_alloca"),
                f1(c"mh_t_getpid"),
                f1(c"mh_t_single"),
                f1(c"mh_t_load"),
                f1(c"mh_t_test"),
                f1(c"mh_t_arg"),
            ],
        }
    })
}

type Fn1 = extern "C" fn(i32) -> i32;

/// Defines a hook that counts its calls and adds 1000 (or `$add`) to what
/// the original returns.
macro_rules! hook {
    ($name:ident, $original:ident, $calls:ident) => {
        hook!($name, $original, $calls, 1000);
    };
    ($name:ident, $original:ident, $calls:ident, $add:expr) => {
        static $original: AtomicUsize = AtomicUsize::new(0);
        static $calls: AtomicUsize = AtomicUsize::new(0);
        extern "C" fn $name(a: i32) -> i32 {
            $calls.fetch_add(1, Ordering::SeqCst);
            // SAFETY: set to the trampoline (same signature) before the patch.
            let original: Fn1 = unsafe { std::mem::transmute($original.load(Ordering::Acquire)) };
            original(a) + $add
        }
    };
}

hook!(hook_rip, ORIG_RIP, CALLS_RIP);
hook!(hook_call, ORIG_CALL, CALLS_CALL);
hook!(hook_jcc, ORIG_JCC, CALLS_JCC);
hook!(hook_a, ORIG_A, CALLS_A);
hook!(hook_b, ORIG_B, CALLS_B);

fn entry_bytes(f: usize) -> [u8; 16] {
    // SAFETY: reading the first bytes of a function in our text.
    unsafe { *(f as *const [u8; 16]) }
}

/// Patches `f` with `hook`, checks hook and original both run with the
/// right argument and result, unpatches and checks the bytes are exact.
fn patch_call_unpatch(
    f: unsafe extern "C" fn(i32) -> i32,
    hook: Fn1,
    original: &AtomicUsize,
    calls: &AtomicUsize,
    cases: &[(i32, i32)],
) {
    let before = entry_bytes(f as usize);
    for &(arg, want) in cases {
        // SAFETY: the test functions take an i32 and return one.
        assert_eq!(unsafe { f(arg) }, want);
    }
    // SAFETY: `hook` has f's signature and calls the original through `original`.
    let h = unsafe { Hook::patch_with(f as usize, hook as usize, original) }.unwrap();
    assert!(
        !h.is_far(),
        "a far hook is reached through a near slot: the entry keeps the 5-byte form"
    );
    let n = calls.load(Ordering::SeqCst);
    for &(arg, want) in cases {
        // SAFETY: as above.
        assert_eq!(unsafe { f(arg) }, want + 1000, "hooked f({arg})");
        // SAFETY: the trampoline has f's signature.
        let orig: Fn1 = unsafe { std::mem::transmute(h.original()) };
        assert_eq!(orig(arg), want, "original({arg})");
    }
    assert_eq!(calls.load(Ordering::SeqCst) - n, cases.len());
    h.unpatch().map_err(|(_, e)| e).unwrap();
    assert_eq!(entry_bytes(f as usize), before, "unpatch restores the exact bytes");
    for &(arg, want) in cases {
        // SAFETY: as above.
        assert_eq!(unsafe { f(arg) }, want);
    }
}

static ORIG_KEPT: AtomicUsize = AtomicUsize::new(0);
static CALLS_KEPT: AtomicUsize = AtomicUsize::new(0);
/// The argument `hook_kept` was last called with.
static SEEN_KEPT: AtomicI32 = AtomicI32::new(i32::MIN);

/// `hook!`'s hook that also keeps the argument it was called with.
extern "C" fn hook_kept(a: i32) -> i32 {
    CALLS_KEPT.fetch_add(1, Ordering::SeqCst);
    SEEN_KEPT.store(a, Ordering::SeqCst);
    // SAFETY: set to the trampoline (same signature) before the patch.
    let original: Fn1 = unsafe { std::mem::transmute(ORIG_KEPT.load(Ordering::Acquire)) };
    original(a) + 1000
}

/// Code that does what the kernel does while a uprobe is on a function's
/// entry: runs the library's first instruction (`first`, as the file has
/// it, at `back - first.len()`) out of line, then jumps back to the
/// instruction after it. A `cmp byte [rip+d], imm8` or a `mov rax,
/// [rip+d]` is re-aimed at the same address, as the kernel re-aims a
/// RIP-relative operand.
fn out_of_line(first: &[u8], back: usize) -> Fn1 {
    let slot = memhook::trampoline::alloc_near(back, 1 << 30).expect("a slot near the function");
    let mut code = first.to_vec();
    // Where the displacement lies.
    let at = match first {
        [0x80, 0x3d, _, _, _, _, _] => Some(2),
        [0x48, 0x8b, 0x05, _, _, _, _] => Some(3),
        _ => None,
    };
    if let Some(at) = at {
        let d = i32::from_le_bytes(first[at..at + 4].try_into().unwrap());
        let read = back as i64 + i64::from(d);
        let d = i32::try_from(read - (slot + first.len()) as i64).expect("within 2 GiB");
        code[at..at + 4].copy_from_slice(&d.to_le_bytes());
    }
    code.extend_from_slice(&[0xff, 0x25, 0, 0, 0, 0]); // jmp [rip+0]
    code.extend_from_slice(&(back as u64).to_le_bytes());
    memhook::trampoline::write(slot, &code).unwrap();
    // SAFETY: the code just written, a function of type Fn1.
    unsafe { std::mem::transmute::<usize, Fn1>(slot) }
}

/// Where a function's first instruction can run before the hook (`push
/// rbp`, `sub rsp, 0x58`, `mov eax, 39`), bistro keeps it and patches
/// after it: the entry's first bytes stay the library file's. A uprobe
/// on the entry (bpftrace, bcc's memleak) runs that instruction out of
/// line and goes on after it, into the patch: the hook runs, with the
/// stack as the caller left it (a wrong undo would return the hook to a
/// wrong address, or leave the stack moved). Taking the uprobe out writes
/// the file's first bytes back: the same bytes. Before, a patch at the
/// entry was skipped while a uprobe was on (the original ran, unseen),
/// and after its removal the entry began with the file's first byte and
/// went on into the jump's displacement: `SIGSEGV` on libcuda's entries,
/// a wrong system call on glibc's wrappers.
#[test]
fn uprobe_on_a_kept_entry_keeps_the_hook() {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() };
    // What each returns of its argument: a + 7, a + 9, getpid() + a,
    // a + 11, a + 13, a + 13, a + 17.
    for (f, add) in lib().kept.into_iter().zip([7, 9, pid, 11, 13, 13, 17]) {
        let want = |a: i32| a + add;
        let entry = f as usize;
        let before = entry_bytes(entry);
        let plan = can_patch(entry, false).unwrap();
        assert!(plan.kept, "{before:02x?}: {plan:?}");
        let keep = plan.skip;
        // SAFETY: `hook_kept` has f's signature and calls the original
        // through ORIG_KEPT.
        let h = unsafe { Hook::patch_with(entry, hook_kept as *const () as usize, &ORIG_KEPT) }.unwrap();
        assert_eq!(
            h.replaced().0,
            entry + keep,
            "the patch starts after the kept instruction"
        );
        assert_eq!(
            entry_bytes(entry)[..keep],
            before[..keep],
            "the entry's first instruction is the file's"
        );
        let n = CALLS_KEPT.load(Ordering::SeqCst);
        // SAFETY: the trampoline has f's signature.
        let original: Fn1 = unsafe { std::mem::transmute(h.original()) };
        let probed = out_of_line(&before[..keep], entry + keep);
        for a in [0, 5, -3] {
            // SAFETY: the test functions take an i32 and return one.
            assert_eq!(unsafe { f(a) }, want(a) + 1000, "hooked, {before:02x?}");
            // The hook saw what was passed (the kept instruction wrote
            // no argument of its signature).
            assert_eq!(SEEN_KEPT.swap(i32::MIN, Ordering::SeqCst), a, "{before:02x?}");
            assert_eq!(original(a), want(a), "original, {before:02x?}");
            assert_eq!(probed(a), want(a) + 1000, "hooked under a uprobe, {before:02x?}");
            assert_eq!(SEEN_KEPT.swap(i32::MIN, Ordering::SeqCst), a, "{before:02x?}");
        }
        assert_eq!(CALLS_KEPT.load(Ordering::SeqCst) - n, 6);
        h.unpatch().map_err(|(_, e)| e).unwrap();
        assert_eq!(entry_bytes(entry), before, "unpatch restores the exact bytes");
        // SAFETY: as above.
        assert_eq!(unsafe { f(1) }, want(1));
    }
}

/// Two tests patch mh_t_rip; they take turns.
static RIP_SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn endbr64_rip_relative_lea_cmp_and_jcc() {
    let _s = RIP_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    patch_call_unpatch(lib().rip, hook_rip, &ORIG_RIP, &CALLS_RIP, &[(0, 7), (5, 12), (-7, 0)]);
    let plan = can_patch(lib().rip as usize, false).unwrap();
    assert_eq!(plan.skip, 4, "endbr64 stays in place");
}

#[test]
fn call_rel32_in_the_prologue() {
    patch_call_unpatch(lib().call, hook_call, &ORIG_CALL, &CALLS_CALL, &[(1, 101), (-100, 0)]);
}

#[test]
fn jcc_rel8_out_of_the_patch() {
    patch_call_unpatch(lib().jcc, hook_jcc, &ORIG_JCC, &CALLS_JCC, &[(3, 6), (-3, 0), (0, 0)]);
}

#[test]
fn tiny_function_and_loop_into_the_entry_are_refused_with_reasons() {
    static UNUSED: AtomicUsize = AtomicUsize::new(0);
    let tiny = lib().tiny as usize;
    let before = entry_bytes(tiny);
    // SAFETY: the patch is refused, so nothing is written.
    let e = unsafe { Hook::patch_with(tiny, hook_rip as *const () as usize, &UNUSED) }.unwrap_err();
    assert!(
        matches!(
            e,
            BistroError::Reloc {
                error: RelocError::FunctionTooShort { .. },
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("function shorter than the patch") && msg.contains("first bytes: 31 c0 c3 cc"),
        "{msg}"
    );
    assert_eq!(entry_bytes(tiny), before);
    // SAFETY: as above (mh_t_tiny returns 0).
    assert_eq!(unsafe { (lib().tiny)() }, 0);

    let looping = lib().looping as usize;
    // SAFETY: refused, nothing written.
    let e = unsafe { Hook::patch_with(looping, hook_rip as *const () as usize, &UNUSED) }.unwrap_err();
    assert!(
        matches!(
            e,
            BistroError::Reloc {
                error: RelocError::BranchIntoPatch { .. },
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("jumps back into the patched bytes"), "{e}");
    // SAFETY: as above.
    assert_eq!(unsafe { (lib().looping)(3) }, 5);
    assert_eq!(UNUSED.load(Ordering::SeqCst), 0);
}

/// A hook in the bytes the patch would overwrite (the function itself,
/// by mistake) is refused, and the function is left as it was: patched,
/// every call would jump into the jump, forever.
#[test]
fn a_hook_inside_the_patched_bytes_is_refused() {
    static UNUSED: AtomicUsize = AtomicUsize::new(0);
    let f = lib().rip as usize;
    let before = entry_bytes(f);
    // (Its entry is an `endbr64`, the jump after it: from the entry on.)
    for hook in [f, f + 1, f + 4, f + 8] {
        // SAFETY: refused before anything is written.
        let e = unsafe { Hook::patch_with(f, hook, &UNUSED) }.unwrap_err();
        assert_eq!(e, BistroError::HookInPatch { target: f, hook }, "{e}");
        assert!(e.to_string().contains("lies in the bytes the patch overwrites"), "{e}");
    }
    assert_eq!(entry_bytes(f), before);
    // SAFETY: the function, unpatched.
    assert_eq!(unsafe { (lib().rip)(2) }, unsafe { (lib().rip)(2) });
    assert_eq!(UNUSED.load(Ordering::SeqCst), 0, "no original handed out");
}

#[test]
fn stacked_hooks_both_run_and_unpatch_in_order() {
    let f = lib().rip as usize;
    let _s = RIP_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = entry_bytes(f);
    // SAFETY: hooks with f's signature, calling through their originals.
    let a = unsafe { Hook::patch_with(f, hook_a as *const () as usize, &ORIG_A) }.unwrap();
    // B patches over A's jump: the trampoline of B carries A's jump.
    // SAFETY: as for A.
    let b = unsafe { Hook::patch_with(f, hook_b as *const () as usize, &ORIG_B) }.unwrap();
    let (na, nb) = (CALLS_A.load(Ordering::SeqCst), CALLS_B.load(Ordering::SeqCst));
    // SAFETY: mh_t_rip takes and returns i32.
    assert_eq!(unsafe { (lib().rip)(1) }, 8 + 2000, "both hooks add 1000");
    assert_eq!(
        (CALLS_A.load(Ordering::SeqCst) - na, CALLS_B.load(Ordering::SeqCst) - nb),
        (1, 1)
    );
    // Undoing A first would drop B's jump: refused.
    let (a, e) = a.unpatch().unwrap_err();
    assert!(matches!(e, BistroError::Patch { .. }), "{e:?}");
    b.unpatch().map_err(|(_, e)| e).unwrap();
    a.unpatch().map_err(|(_, e)| e).unwrap();
    assert_eq!(entry_bytes(f), before);
}

static ORIG_PPID: AtomicUsize = AtomicUsize::new(0);
static CALLS_PPID: AtomicUsize = AtomicUsize::new(0);

extern "C" fn hook_getppid() -> libc::pid_t {
    CALLS_PPID.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the trampoline has getppid's signature.
    let original: extern "C" fn() -> libc::pid_t = unsafe { std::mem::transmute(ORIG_PPID.load(Ordering::Acquire)) };
    original()
}

#[test]
fn glibc_function_with_a_hook_beyond_2_gib() {
    let target = libc::getppid as *const () as usize;
    // SAFETY: getppid has no preconditions.
    let want = unsafe { libc::getppid() };
    let before = entry_bytes(target);
    // SAFETY: same signature; calls the original through ORIG_PPID.
    let h = unsafe { Hook::patch_symbol(c"getppid", hook_getppid as *const () as usize, &ORIG_PPID) }.unwrap();
    assert_eq!(h.target(), target, "dlsym finds libc's getppid");
    // The test binary and libc are far apart; the entry still uses the
    // 5-byte form, through a far-jump slot near libc.
    assert!(!h.is_far());
    let n = CALLS_PPID.load(Ordering::SeqCst);
    // SAFETY: getppid has no preconditions.
    assert_eq!(unsafe { libc::getppid() }, want);
    assert_eq!(CALLS_PPID.load(Ordering::SeqCst), n + 1);
    h.unpatch().map_err(|(_, e)| e).unwrap();
    assert_eq!(entry_bytes(target), before);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::getppid() }, want);
    assert_eq!(CALLS_PPID.load(Ordering::SeqCst), n + 1);
}

#[test]
fn unknown_symbol_is_an_error() {
    static UNUSED: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: nothing is found, so nothing is patched.
    let e =
        unsafe { Hook::patch_symbol(c"memhook_no_such_function", hook_a as *const () as usize, &UNUSED) }.unwrap_err();
    assert_eq!(e, BistroError::NoSymbol);
}

#[test]
fn not_code_is_an_error() {
    static DATA: u64 = 0;
    static UNUSED: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: refused before anything is written.
    let e =
        unsafe { Hook::patch_with(&DATA as *const u64 as usize, hook_a as *const () as usize, &UNUSED) }.unwrap_err();
    assert!(matches!(e, BistroError::NotCode { .. }), "{e:?}");
}

static ORIG_COUNT: AtomicUsize = AtomicUsize::new(0);
static CALLS_COUNT: AtomicU64 = AtomicU64::new(0);

extern "C" fn hook_count(a: i32) -> i32 {
    CALLS_COUNT.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the trampoline has mh_t_count's signature.
    let original: Fn1 = unsafe { std::mem::transmute(ORIG_COUNT.load(Ordering::Acquire)) };
    original(a)
}

/// Eight threads call `f` (which returns its argument and counts its
/// calls in `counter`) in a loop while it is patched with `hook` (whose
/// original goes in `original`) and unpatched `cycles` times: no crash,
/// every call returns its argument, every call reached the original
/// exactly once (the function's own counter equals the calls made), and
/// the entry's bytes are back. Returns the calls made.
fn patch_while_eight_threads_call(
    f: unsafe extern "C" fn(i32) -> i32,
    counter: &'static AtomicU64,
    hook: extern "C" fn(i32) -> i32,
    original: &'static AtomicUsize,
    cycles: usize,
) -> u64 {
    const THREADS: usize = 8;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let base = counter.load(Ordering::SeqCst);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (stop, start) = (stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut made = 0u64;
                let mut i = t as i32;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: the function returns its argument.
                    let r = unsafe { f(i) };
                    assert_eq!(r, i, "a call returned garbage");
                    made += 1;
                    i = i.wrapping_add(THREADS as i32);
                }
                made
            })
        })
        .collect();
    start.wait();
    let before = entry_bytes(f as usize);
    for _ in 0..cycles {
        // SAFETY: the hook has the function's signature and calls the
        // original through `original`.
        let h = unsafe { Hook::patch_with(f as usize, hook as *const () as usize, original) }.unwrap();
        h.unpatch().map_err(|(_, e)| e).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let made: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let seen = counter.load(Ordering::SeqCst) - base;
    assert_eq!(entry_bytes(f as usize), before);
    assert_eq!(seen, made, "calls made vs calls that reached the original");
    made
}

/// Eight threads call the function in a loop while it is patched and
/// unpatched 10,000 times (see `patch_while_eight_threads_call`).
#[test]
fn stress_patch_unpatch_while_eight_threads_call() {
    const CYCLES: usize = 10_000;
    let made = patch_while_eight_threads_call(lib().count, lib().counter, hook_count, &ORIG_COUNT, CYCLES);
    let hooked = CALLS_COUNT.load(Ordering::Relaxed);
    assert!(hooked <= made);
    eprintln!(
        "{made} calls, {hooked} through the hook, {CYCLES} patch/unpatch cycles, serialisation {:?}",
        memhook::code::serialization()
    );
}

// Hooks that count their calls and return what the original returns.
hook!(hook_count2, ORIG_COUNT2, CALLS_COUNT2, 0);
hook!(hook_count3, ORIG_COUNT3, CALLS_COUNT3, 0);
hook!(hook_count4, ORIG_COUNT4, CALLS_COUNT4, 0);

/// The batch tests patch mh_t_count2 to 4; they take turns.
static BATCH_SERIAL: Mutex<()> = Mutex::new(());

/// mh_t_count2 to 4 with their hooks, as batch requests.
fn count_requests() -> [Request<'static>; 3] {
    let hooks: [Fn1; 3] = [hook_count2, hook_count3, hook_count4];
    let originals = [&ORIG_COUNT2, &ORIG_COUNT3, &ORIG_COUNT4];
    core::array::from_fn(|i| Request {
        target: lib().counts[i] as usize,
        hook: hooks[i] as usize,
        original: originals[i],
    })
}

/// Patches mh_t_count2 to 4 in one batch and unpatches them in one,
/// `cycles` times; every patch and every undo must succeed.
fn patch_and_unpatch_counts(cycles: usize) {
    let requests = count_requests();
    for _ in 0..cycles {
        // SAFETY: each hook has its function's signature and calls the
        // original through its `original`.
        let done = unsafe { Hook::patch_batch::<3>(&requests) };
        let mut hooks: heapless::Vec<Hook, 3> = done.into_iter().map(Result::unwrap).collect();
        assert_eq!(Hook::unpatch_batch(&mut hooks), None);
    }
}

fn hook_calls() -> [usize; 3] {
    [&CALLS_COUNT2, &CALLS_COUNT3, &CALLS_COUNT4].map(|c| c.load(Ordering::SeqCst))
}

/// One batch patches every function it can, in one pass, and answers each
/// request in order: a function too short to patch and a second patch of
/// the same entry are refused and change nothing; the others' hooks and
/// originals run. Undoing the batch restores every byte, except under a
/// patch another hooker laid over ours, which stays until that one goes.
#[test]
fn a_batch_patches_what_it_can_and_answers_each_request() {
    let _serial = BATCH_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let [r2, r3, r4] = count_requests();
    static UNUSED: AtomicUsize = AtomicUsize::new(0);
    let tiny = Request {
        target: lib().tiny as usize,
        hook: hook_a as *const () as usize,
        original: &UNUSED,
    };
    let before = lib().counts.map(|f| entry_bytes(f as usize));
    let tiny_before = entry_bytes(lib().tiny as usize);
    // SAFETY: each hook has its function's signature and calls the
    // original through its `original`.
    let done = unsafe { Hook::patch_batch::<8>(&[r2, tiny, r3, r2, r4]) };
    assert_eq!(done.len(), 5);
    assert!(
        matches!(
            done[1],
            Err(BistroError::Reloc {
                error: RelocError::FunctionTooShort { .. },
                ..
            })
        ),
        "{:?}",
        done[1]
    );
    assert_eq!(
        done[3].as_ref().unwrap_err(),
        &BistroError::Overlaps { target: r2.target }
    );
    assert_eq!(entry_bytes(lib().tiny as usize), tiny_before);
    let mut hooks: heapless::Vec<Hook, 4> = done.into_iter().flatten().collect();
    assert_eq!(hooks.len(), 3);
    let calls = hook_calls();
    for (i, h) in hooks.iter().enumerate() {
        assert_eq!(h.target(), lib().counts[i] as usize);
        assert_ne!(entry_bytes(h.target()), before[i]);
        // SAFETY: the counting functions return their argument.
        assert_eq!(unsafe { (lib().counts[i])(40 + i as i32) }, 40 + i as i32);
        // SAFETY: the trampoline has the function's signature.
        let original: Fn1 = unsafe { std::mem::transmute(h.original()) };
        assert_eq!(original(7), 7);
    }
    let after = hook_calls();
    assert_eq!(
        [after[0] - calls[0], after[1] - calls[1], after[2] - calls[2]],
        [1, 1, 1]
    );

    // Another hooker patches over mh_t_count3: undoing the batch leaves
    // ours there (its error says which), and restores the other two.
    hook!(hook_over, ORIG_OVER, CALLS_OVER, 0);
    // SAFETY: as above.
    let over =
        unsafe { Hook::patch_with(lib().counts[1] as usize, hook_over as *const () as usize, &ORIG_OVER) }.unwrap();
    let error = Hook::unpatch_batch(&mut hooks);
    assert!(
        matches!(error, Some(BistroError::Patch { target, .. }) if target == lib().counts[1] as usize),
        "{error:?}"
    );
    assert_eq!(hooks.len(), 1);
    assert_eq!(hooks[0].target(), lib().counts[1] as usize);
    assert_eq!(entry_bytes(lib().counts[0] as usize), before[0]);
    assert_eq!(entry_bytes(lib().counts[2] as usize), before[2]);
    // SAFETY: as above.
    assert_eq!(unsafe { (lib().counts[1])(9) }, 9);
    assert_eq!(CALLS_OVER.load(Ordering::SeqCst), 1, "both hooks still run");
    over.unpatch().map_err(|(_, e)| e).unwrap();
    assert_eq!(Hook::unpatch_batch(&mut hooks), None);
    assert!(hooks.is_empty());
    assert_eq!(lib().counts.map(|f| entry_bytes(f as usize)), before);
}

/// Eight threads call three functions in a loop while one batch patches
/// and unpatches all three 3,000 times: no crash, every call returns its
/// argument, and every call reached its original exactly once.
#[test]
fn stress_batches_while_eight_threads_call() {
    const THREADS: usize = 8;
    const CYCLES: usize = 3_000;
    let _serial = BATCH_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let base = lib().counters.map(|c| c.load(Ordering::SeqCst));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (stop, start) = (stop.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let mut made = [0u64; 3];
                let mut i = t as i32;
                while !stop.load(Ordering::Relaxed) {
                    for (k, f) in lib().counts.iter().enumerate() {
                        // SAFETY: the counting functions return their argument.
                        assert_eq!(unsafe { f(i) }, i, "a call returned garbage");
                        made[k] += 1;
                    }
                    i = i.wrapping_add(THREADS as i32);
                }
                made
            })
        })
        .collect();
    start.wait();
    let before = lib().counts.map(|f| entry_bytes(f as usize));
    patch_and_unpatch_counts(CYCLES);
    stop.store(true, Ordering::Relaxed);
    let made = workers
        .into_iter()
        .map(|w| w.join().unwrap())
        .fold([0u64; 3], |mut a, m| {
            for k in 0..3 {
                a[k] += m[k];
            }
            a
        });
    let seen: Vec<u64> = (0..3)
        .map(|k| lib().counters[k].load(Ordering::SeqCst) - base[k])
        .collect();
    assert_eq!(lib().counts.map(|f| entry_bytes(f as usize)), before);
    assert_eq!(seen, made, "calls made vs calls that reached the originals");
    eprintln!(
        "{made:?} calls, {:?} through the hooks, {CYCLES} batch patch/unpatch cycles",
        hook_calls()
    );
}

static LOCKED_SEEN: AtomicU64 = AtomicU64::new(0);
static HANDLED: AtomicU64 = AtomicU64::new(0);

/// A signal handler on the patching thread that calls mh_t_count2 (as an
/// allocator's `mmap` in a profiler's handler would): if it ever found the
/// entry locked, the call would spin there for ever; it counts that
/// instead of calling.
extern "C" fn on_signal(_: libc::c_int) {
    let f = lib().counts[0];
    // The patch starts after the entry's endbr64.
    // SAFETY: reading two bytes of the function's own code.
    let head = unsafe { *((f as usize + 4) as *const [u8; 2]) };
    if head == [0xeb, 0xfe] {
        LOCKED_SEEN.fetch_add(1, Ordering::Relaxed);
        return;
    }
    // SAFETY: the counting functions return their argument.
    assert_eq!(unsafe { f(5) }, 5);
    HANDLED.fetch_add(1, Ordering::Relaxed);
}

/// Signals sent to the patching thread every few microseconds while it
/// patches and unpatches a batch 2,000 times: its handlers run between batches, never
/// while an entry of the batch holds the lock (signals are blocked while a
/// batch is written), so none can deadlock on it.
#[test]
fn a_signal_handler_on_the_patching_thread_never_meets_a_locked_entry() {
    const CYCLES: usize = 2_000;
    let _serial = BATCH_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _ = lib();
    // SAFETY: a plain handler for SIGUSR1 (the old action is put back).
    let old = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as *const () as usize;
        action.sa_flags = libc::SA_RESTART;
        let mut old: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(libc::SIGUSR1, &action, &mut old), 0);
        old
    };
    let stop = Arc::new(AtomicBool::new(false));
    // SAFETY: the calling thread's own id.
    let me = unsafe { libc::pthread_self() } as usize;
    let signaller = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: the patching thread outlives this thread (it
                // joins it before returning).
                assert_eq!(unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) }, 0);
                sent += 1;
                // A few microseconds apart: the patching thread still
                // gets on, and many land while a batch is written.
                for _ in 0..5_000 {
                    std::hint::spin_loop();
                }
            }
            sent
        })
    };
    let before = lib().counts.map(|f| entry_bytes(f as usize));
    patch_and_unpatch_counts(CYCLES);
    stop.store(true, Ordering::Relaxed);
    let sent = signaller.join().unwrap();
    // SAFETY: puts back the action found.
    unsafe { libc::sigaction(libc::SIGUSR1, &old, std::ptr::null_mut()) };
    assert_eq!(lib().counts.map(|f| entry_bytes(f as usize)), before);
    let (seen, handled) = (LOCKED_SEEN.load(Ordering::Relaxed), HANDLED.load(Ordering::Relaxed));
    eprintln!("{sent} signals sent, {handled} handled, {seen} met a locked entry");
    assert!(handled > 0, "no signal reached the patching thread");
    assert_eq!(seen, 0, "a handler met a locked entry: it would have spun for ever");
}

// A hook of mh_t_steps that counts its calls and returns what the
// original returns.
hook!(hook_steps, ORIG_STEPS, CALLS_STEPS, 0);

/// Eight threads call a function whose patched bytes hold five
/// instructions (four of one byte) while it is patched and unpatched: a
/// thread the scheduler stops between two of them, when the jump is
/// written over them, is moved to the same point of the trampoline
/// before it runs again. No crash, every call returns its argument, and
/// every call reached the original exactly once. (Before memhook moved
/// such threads, glibc's `dlsym`, which starts `push rbp; push rbx`,
/// crashed this way in a host test about once in sixty runs.)
#[test]
fn threads_stopped_inside_the_patched_bytes_are_moved_out() {
    // Each patch waits for the eight busy threads to be held: a few ms
    // apiece on two cores.
    const CYCLES: usize = 400;
    let moved = memhook::code::threads_moved();
    let made = patch_while_eight_threads_call(lib().steps, lib().steps_counter, hook_steps, &ORIG_STEPS, CYCLES);
    eprintln!(
        "{made} calls, {} through the hook, {CYCLES} cycles, {} threads moved out of the patched bytes",
        CALLS_STEPS.load(Ordering::Relaxed),
        memhook::code::threads_moved() - moved
    );
}

static ORIG_SYS: AtomicUsize = AtomicUsize::new(0);
static CALLS_SYS: AtomicU64 = AtomicU64::new(0);

extern "C" fn hook_sys(a0: usize, a1: usize, a2: usize, nr: usize) -> isize {
    CALLS_SYS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the trampoline has mh_t_sys's signature.
    let original: Sys = unsafe { std::mem::transmute(ORIG_SYS.load(Ordering::Acquire)) };
    // SAFETY: forwarded as called.
    unsafe { original(a0, a1, a2, nr) }
}

/// The user pc of thread `tid` once it is blocked in system call `nr`
/// (`/proc/self/task/TID/syscall`: the number, six arguments, sp, pc).
fn blocked_pc(tid: i32, nr: i64) -> usize {
    let path = format!("/proc/self/task/{tid}/syscall");
    for _ in 0..5_000 {
        let text = std::fs::read_to_string(&path).unwrap();
        let fields: Vec<&str> = text.split_whitespace().collect();
        if fields.first().and_then(|f| f.parse::<i64>().ok()) == Some(nr) {
            return usize::from_str_radix(fields[8].trim_start_matches("0x"), 16).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    panic!("thread {tid} never blocked in system call {nr}");
}

/// The tests that patch mh_t_sys, one at a time.
static SYS_SERIAL: Mutex<()> = Mutex::new(());

/// A thread reading one byte from a new pipe through mh_t_sys, blocked
/// in the `read` (its pc inside the bytes a patch of mh_t_sys
/// overwrites), with memhook's signals blocked if `masked`: the thread,
/// its id, and the pipe's descriptors.
fn reader_blocked_in_sys(masked: bool) -> (std::thread::JoinHandle<(isize, u8)>, i32, [i32; 2]) {
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        if masked {
            // SAFETY: blocks SIGURG and SIGWINCH on this thread only.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGURG);
                libc::sigaddset(&mut set, libc::SIGWINCH);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
        }
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let mut byte = 0u8;
        // SAFETY: read(2) of one byte into `byte`, made by mh_t_sys.
        let n = unsafe { (lib().sys)(fds[0] as usize, (&raw mut byte) as usize, 1, libc::SYS_read as usize) };
        (n, byte)
    });
    let tid = rx.recv().unwrap();
    assert_eq!(
        blocked_pc(tid, libc::SYS_read),
        lib().sys as usize + 4,
        "blocked right after the syscall"
    );
    (reader, tid, fds)
}

/// Writes the byte `reader_blocked_in_sys`'s thread waits for, checks
/// its read got it, and closes the pipe.
fn let_the_reader_finish(reader: std::thread::JoinHandle<(isize, u8)>, fds: [i32; 2]) {
    // SAFETY: writes one byte from a live buffer to the pipe.
    assert_eq!(unsafe { libc::write(fds[1], b"x".as_ptr().cast(), 1) }, 1);
    assert_eq!(reader.join().unwrap(), (1, b'x'));
    // SAFETY: closing the pipe made for the reader.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

/// A thread blocked in a system call made inside the bytes a patch
/// overwrites (its pc, right after the `syscall`, is inside them) while
/// the function is patched: it is moved to the trampoline (the call
/// restarted there), and its call completes with the right result when
/// the pipe it reads gets a byte. Without the move it would resume in
/// the middle of the jump. The function is then called through the hook.
#[test]
fn a_thread_blocked_in_a_system_call_inside_the_patched_bytes_completes_it() {
    let _serial = SYS_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = lib().sys as usize;
    let (reader, tid, fds) = reader_blocked_in_sys(false);
    let moved = memhook::code::threads_moved();
    // SAFETY: hook_sys has mh_t_sys's signature.
    let h = unsafe { Hook::patch_with(f, hook_sys as *const () as usize, &ORIG_SYS) }.unwrap();
    assert_eq!(memhook::code::threads_moved() - moved, 1, "the reader was moved");
    // A child of fork counts its own process's moves: none yet.
    // SAFETY: the child only reads an atomic and exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(i32::from(memhook::code::threads_moved() != 0)) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child counted its parent's moves"
    );
    // The reader went back to sleep in its read, restarted in the trampoline.
    assert_ne!(blocked_pc(tid, libc::SYS_read), f + 4);
    let_the_reader_finish(reader, fds);
    // SAFETY: getpid through the hook.
    let pid = unsafe { (lib().sys)(0, 0, 0, libc::SYS_getpid as usize) };
    // SAFETY: getpid has no preconditions.
    assert_eq!(pid, unsafe { libc::getpid() } as isize);
    assert_eq!(CALLS_SYS.load(Ordering::Relaxed), 1);
    h.unpatch().map_err(|(_, e)| e).unwrap();
}

/// A thread blocked inside the bytes with memhook's signals blocked
/// cannot be moved: after the writer's limit the patch is refused
/// (`ThreadInside`), the entry keeps its bytes, and the thread's call
/// completes in the original code. Nothing is counted moved.
#[test]
fn a_patch_over_a_thread_that_cannot_be_moved_is_refused_and_the_entry_kept() {
    let _serial = SYS_SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = lib().sys as usize;
    let before = entry_bytes(f);
    let (reader, _, fds) = reader_blocked_in_sys(true);
    let moved = memhook::code::threads_moved();
    // SAFETY: hook_sys has mh_t_sys's signature.
    let refused = unsafe { Hook::patch_with(f, hook_sys as *const () as usize, &ORIG_SYS) };
    match refused {
        Err(BistroError::Patch {
            target,
            error: PatchError::ThreadInside { address },
        }) => assert_eq!((target, address), (f, f)),
        other => panic!("not refused for the thread inside: {other:?}"),
    }
    assert_eq!(entry_bytes(f), before, "the entry keeps its bytes");
    assert_eq!(memhook::code::threads_moved(), moved);
    let_the_reader_finish(reader, fds);
}

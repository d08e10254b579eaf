//! Bistro on aarch64 (run under qemu-user in CI): hand-written prologues
//! (global_asm!) patched for real, the relocated code of every rewritten
//! form executed and compared with the original (differential tests), and
//! threads calling a function while it is patched and unpatched.
//!
//! qemu does not model the instruction cache, so the flush after every
//! code write is checked by count (`memhook::code::icache_flushes`).
#![cfg(all(feature = "bistro", target_arch = "aarch64"))]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use memhook::bistro::{BistroError, Hook};
use memhook::patch::Arch;

type F = unsafe extern "C" fn(u64) -> u64;

core::arch::global_asm!(
    ".data",
    ".p2align 3",
    "mh_a_data: .quad 1000",
    ".text",
    // Real patching: each function's first patched word is the form named.
    ".globl mh_r_bti",
    ".p2align 4",
    "mh_r_bti:",
    "bti c",
    "add x0, x0, #1",
    "ret",
    ".globl mh_r_pac",
    ".p2align 4",
    "mh_r_pac:",
    "hint #25", // paciasp
    "stp x29, x30, [sp, #-16]!",
    "mov x29, sp",
    "add x0, x0, #2",
    "ldp x29, x30, [sp], #16",
    "hint #29", // autiasp
    "ret",
    ".globl mh_r_frame",
    ".p2align 4",
    "mh_r_frame:",
    "stp x29, x30, [sp, #-16]!",
    "mov x29, sp",
    "add x0, x0, #3",
    "ldp x29, x30, [sp], #16",
    "ret",
    // Kept with nothing to undo: a `nop` (Debian 12's munmap), a compare
    // whose flags the next word branches on (run again by the trampoline
    // after the hook, whose own flags would take the wrong way: 5 for any
    // x), a scratch register's load (x9: the trampoline loads it again).
    ".globl mh_r_nop",
    ".p2align 4",
    "mh_r_nop:",
    "nop",
    "add x0, x0, #4",
    "ret",
    ".globl mh_r_cmp",
    ".p2align 4",
    "mh_r_cmp:",
    "cmp x0, #0",
    "b.eq 1f",
    "add x0, x0, #5",
    "ret",
    "1:",
    "mov x0, #5",
    "ret",
    ".globl mh_r_scratch",
    ".p2align 4",
    "mh_r_scratch:",
    "mov x9, #6",
    "add x0, x0, x9",
    "ret",
    // An `int` argument widened in place (glibc's shmat).
    ".globl mh_r_sxtw",
    ".p2align 4",
    "mh_r_sxtw:",
    "sxtw x0, w0",
    "add x0, x0, #7",
    "ret",
    // An argument register the function never reads, written (glibc's
    // brk: `mov x1, x0`): the hook gets x0 as passed, the trampoline sets
    // x1 again for the original (the caller's x1 is whatever it was).
    ".globl mh_r_arg",
    ".p2align 4",
    "mh_r_arg:",
    "mov x1, x0",
    "add x0, x1, #8",
    "ret",
    ".globl mh_r_adrp",
    ".p2align 4",
    "mh_r_adrp:",
    "adrp x9, mh_a_data",
    "add x9, x9, :lo12:mh_a_data",
    "ldr x9, [x9]",
    "add x0, x0, x9",
    "ret",
    ".globl mh_r_lit",
    ".p2align 4",
    "mh_r_lit:",
    "ldr x9, 1f",
    "add x0, x0, x9",
    "ret",
    ".p2align 3",
    "1: .quad 2000",
    ".globl mh_r_cbz",
    ".p2align 4",
    "mh_r_cbz:",
    "cbz x0, 1f",
    "mov x0, #7",
    "ret",
    "1: mov x0, #9",
    "ret",
    ".globl mh_r_count",
    ".p2align 4",
    "mh_r_count:",
    "add x0, x0, #1",
    "ret",
    // Differential tests: the first four words (a far patch's window) hold
    // the form named; the relocated window must compute what the original
    // computes.
    ".globl mh_d_adrp",
    ".p2align 4",
    "mh_d_adrp:",
    "adrp x9, mh_a_data",
    "add x9, x9, :lo12:mh_a_data",
    "ldr x9, [x9]",
    "add x0, x0, x9",
    "ret",
    ".globl mh_d_adr",
    ".p2align 4",
    "mh_d_adr:",
    "adr x9, 2f",
    "ldr x9, [x9]",
    "add x0, x0, x9",
    "nop",
    "ret",
    ".p2align 3",
    "2: .quad 3000",
    ".globl mh_d_lit",
    ".p2align 4",
    "mh_d_lit:",
    "ldr x9, 1f",
    "ldr w10, 2f",
    "ldrsw x11, 3f",
    "add x0, x0, x9",
    "add x0, x0, x10",
    "add x0, x0, x11",
    "ret",
    ".p2align 3",
    "1: .quad 4000",
    "2: .word 50",
    "3: .word -7",
    ".globl mh_d_simd",
    ".p2align 4",
    "mh_d_simd:",
    "ldr d1, 1f",
    "fmov x9, d1",
    "nop",
    "add x0, x0, x9",
    "ret",
    ".p2align 3",
    "1: .quad 5000",
    ".globl mh_d_bcond",
    ".p2align 4",
    "mh_d_bcond:",
    "cmp x0, #5",
    "b.lt 1f",
    "nop",
    "nop",
    "mov x0, #1",
    "ret",
    "1: mov x0, #2",
    "ret",
    ".globl mh_d_cbz",
    ".p2align 4",
    "mh_d_cbz:",
    "cbz x0, 1f",
    "nop",
    "nop",
    "nop",
    "mov x0, #7",
    "ret",
    "1: mov x0, #9",
    "ret",
    ".globl mh_d_tbnz",
    ".p2align 4",
    "mh_d_tbnz:",
    "tbnz x0, #1, 1f",
    "nop",
    "nop",
    "nop",
    "mov x0, #3",
    "ret",
    "1: mov x0, #4",
    "ret",
    ".globl mh_d_bl",
    ".p2align 4",
    "mh_d_bl:",
    "stp x29, x30, [sp, #-16]!",
    "mov x29, sp",
    "nop",
    // The window's last word: a call earlier in it would return inside a
    // far jump, which the relocator refuses.
    "bl mh_d_helper",
    "ldp x29, x30, [sp], #16",
    "add x0, x0, #1",
    "ret",
    ".globl mh_d_helper",
    ".p2align 4",
    "mh_d_helper:",
    "add x0, x0, #100",
    "ret",
    ".globl mh_d_b",
    ".p2align 4",
    "mh_d_b:",
    "add x0, x0, #1",
    "nop",
    "nop",
    "b 1f",
    "add x0, x0, #50",
    "1: add x0, x0, #3",
    "ret",
);

unsafe extern "C" {
    fn mh_r_bti(x: u64) -> u64;
    fn mh_r_pac(x: u64) -> u64;
    fn mh_r_frame(x: u64) -> u64;
    fn mh_r_nop(x: u64) -> u64;
    fn mh_r_cmp(x: u64) -> u64;
    fn mh_r_scratch(x: u64) -> u64;
    fn mh_r_sxtw(x: u64) -> u64;
    fn mh_r_arg(x: u64) -> u64;
    fn mh_r_adrp(x: u64) -> u64;
    fn mh_r_lit(x: u64) -> u64;
    fn mh_r_cbz(x: u64) -> u64;
    fn mh_r_count(x: u64) -> u64;
    fn mh_d_adrp(x: u64) -> u64;
    fn mh_d_adr(x: u64) -> u64;
    fn mh_d_lit(x: u64) -> u64;
    fn mh_d_simd(x: u64) -> u64;
    fn mh_d_bcond(x: u64) -> u64;
    fn mh_d_cbz(x: u64) -> u64;
    fn mh_d_tbnz(x: u64) -> u64;
    fn mh_d_bl(x: u64) -> u64;
    fn mh_d_b(x: u64) -> u64;
}

/// Tests that patch share the functions: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn words(at: usize, n: usize) -> Vec<u32> {
    // SAFETY: the function's code is mapped and readable.
    (0..n)
        .map(|i| unsafe { ((at + 4 * i) as *const u32).read_volatile() })
        .collect()
}

/// The original of the patched function under test.
static ORIG: AtomicUsize = AtomicUsize::new(0);
static HOOKED: AtomicU64 = AtomicU64::new(0);

/// Calls the original and adds 1000 (so both are seen in the result).
unsafe extern "C" fn hook(x: u64) -> u64 {
    HOOKED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the original has the patched function's signature.
    let f: F = unsafe { std::mem::transmute(ORIG.load(Ordering::Acquire)) };
    // SAFETY: forwarded.
    let r = unsafe { f(x) };
    r + 1000
}

#[test]
fn real_patches_call_hook_and_original_and_undo_exactly() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // (A b.cond at the entry cannot be tested through a hook: the hook, a
    // function call, need not keep the caller's flags. The differential
    // test below runs relocated b.cond windows directly.)
    let cases: [(&str, F, F, &[u64]); 5] = [
        ("bti entry", mh_r_bti, mh_r_bti, &[0, 41]),
        ("paciasp entry", mh_r_pac, mh_r_pac, &[0, 41]),
        ("adrp+add", mh_r_adrp, mh_r_adrp, &[0, 5]),
        ("ldr literal", mh_r_lit, mh_r_lit, &[1, 2]),
        ("cbz out of the patch", mh_r_cbz, mh_r_cbz, &[0, 3]),
    ];
    for (what, target, call, inputs) in cases {
        let at = target as *const () as usize;
        // SAFETY: calling the unpatched test function.
        let expect: Vec<u64> = inputs.iter().map(|&x| unsafe { call(x) }).collect();
        let before = words(at, 4);
        let flushes = memhook::code::icache_flushes();
        // SAFETY: `hook` has the function's signature and calls the
        // original through ORIG, which patch_with sets first.
        let h = unsafe { Hook::patch_with(at, hook as *const () as usize, &ORIG) }
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            memhook::code::icache_flushes() > flushes,
            "{what}: code writes are flushed"
        );
        if what == "bti entry" {
            assert_eq!(words(at, 1)[0], memhook_aarch64::BTI_C, "the landing pad stays");
        }
        if what == "paciasp entry" {
            assert_eq!(words(at, 1)[0], memhook_aarch64::PACIASP, "the landing pad stays, kept");
        }
        let n = HOOKED.load(Ordering::SeqCst);
        for (&x, &want) in inputs.iter().zip(&expect) {
            // SAFETY: calling the patched function.
            assert_eq!(unsafe { call(x) }, want + 1000, "{what}({x}): hook and original");
        }
        assert_eq!(HOOKED.load(Ordering::SeqCst) - n, inputs.len() as u64);
        h.unpatch().unwrap_or_else(|(_, e)| panic!("{what}: {e}"));
        assert_eq!(words(at, 4), before, "{what}: the exact words are back");
        for (&x, &want) in inputs.iter().zip(&expect) {
            // SAFETY: the function as it was.
            assert_eq!(unsafe { call(x) }, want, "{what}({x}) after unpatch");
        }
    }
}

/// Code that does what the kernel does while a uprobe is on a function's
/// entry: runs the entry's first word (as the file has it) out of line,
/// then goes on at the word after it.
fn out_of_line(first: u32, back: usize) -> F {
    let slot = memhook::trampoline::alloc_near(back, 100 << 20).expect("a slot");
    // first; ldr x16, #8; br x16; .quad back
    let code: Vec<u8> = [first, 0x5800_0050, 0xd61f_0200]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .chain((back as u64).to_le_bytes())
        .collect();
    memhook::trampoline::write(slot, &code).unwrap();
    // SAFETY: the code just written (and flushed), a function of type F.
    unsafe { std::mem::transmute::<usize, F>(slot) }
}

/// A first word that `keep_first` keeps (`paciasp`, the frame record's
/// `stp`, a `nop`, a `cmp`, a `mov` into x9, a `sxtw` of x0, a `mov`
/// into x1 of a function of one argument) stays at
/// the entry and the patch follows it: a uprobe on the entry, which runs
/// that word out of line and goes on after it, goes into the patch, and
/// the hook runs with x30 and SP as the caller left them (an `autiasp` or
/// `add sp` on the way undoes the word); the trampoline runs the word
/// again for the original (the `cmp`'s flags, x9's value).
#[test]
fn uprobe_on_a_kept_entry_keeps_the_hook() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let kept = [
        (mh_r_pac as F, 2),
        (mh_r_frame as F, 3),
        (mh_r_nop as F, 4),
        (mh_r_cmp as F, 5),
        (mh_r_scratch as F, 6),
        (mh_r_sxtw as F, 7),
        (mh_r_arg as F, 8),
    ];
    for (f, add) in kept {
        let at = f as *const () as usize;
        let first = words(at, 1)[0];
        // SAFETY: `hook` has the function's signature and calls the
        // original through ORIG.
        let h = unsafe { Hook::patch_with(at, hook as *const () as usize, &ORIG) }.unwrap();
        assert_eq!(h.replaced().0, at + 4, "the patch follows the kept word");
        assert_eq!(words(at, 1)[0], first, "the entry's first word is the file's");
        let probed = out_of_line(first, at + 4);
        let n = HOOKED.load(Ordering::SeqCst);
        for x in [0, 7] {
            // SAFETY: the patched function, and its entry run as a uprobe
            // runs it.
            unsafe {
                assert_eq!(f(x), x + add + 1000, "{first:#010x}: hooked");
                assert_eq!(probed(x), x + add + 1000, "{first:#010x}: hooked under a uprobe");
            }
        }
        assert_eq!(HOOKED.load(Ordering::SeqCst) - n, 4);
        h.unpatch().unwrap_or_else(|(_, e)| panic!("{e}"));
    }
}

/// A hook in the words the patch would overwrite (the function itself,
/// by mistake; after a `bti c`, its first word too) is refused and the
/// function left as it was.
#[test]
fn a_hook_inside_the_patched_words_is_refused() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    static UNUSED: AtomicUsize = AtomicUsize::new(0);
    // The near jump is one word: at the entry, or after the `bti c`.
    for (f, inside) in [(mh_r_bti as F, &[0, 4][..]), (mh_r_adrp as F, &[0][..])] {
        let at = f as *const () as usize;
        let before = words(at, 4);
        for hook in inside.iter().map(|d| at + d) {
            // SAFETY: refused before anything is written.
            let e = unsafe { Hook::patch_with(at, hook, &UNUSED) }.unwrap_err();
            assert_eq!(e, BistroError::HookInPatch { target: at, hook }, "{e}");
        }
        assert_eq!(words(at, 4), before);
    }
    assert_eq!(UNUSED.load(Ordering::SeqCst), 0, "no original handed out");
}

/// Relocates the first 16 bytes of `f` (a far patch's window) into a
/// trampoline at `slot` and returns it as a function.
fn relocated(f: F, slot: usize) -> F {
    let at = f as *const () as usize;
    let mut code = [0u8; 64];
    // SAFETY: 64 bytes of mapped code (the function and what follows it).
    unsafe { std::ptr::copy_nonoverlapping(at as *const u8, code.as_mut_ptr(), 64) };
    let r = memhook_aarch64::Aarch64::relocate(&code, at, 16, slot).unwrap_or_else(|e| panic!("{e}"));
    memhook::trampoline::write(slot, &r.code).unwrap();
    // SAFETY: the trampoline runs the relocated window, then jumps back.
    unsafe { std::mem::transmute::<usize, F>(slot) }
}

/// A slot for code far (more than 128 MiB) from every function here.
fn far_slot() -> usize {
    let hint = (mh_d_adrp as *const () as usize).wrapping_add(1 << 36) & !0xffff;
    // SAFETY: a fresh mapping at a hint (the kernel picks if it is taken).
    let p = unsafe {
        libc::mmap(
            hint as *mut libc::c_void,
            1 << 16,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

#[test]
fn relocated_code_computes_what_the_original_computes() {
    let cases: [(&str, F, &[u64]); 9] = [
        ("adrp+add", mh_d_adrp, &[0, 9]),
        ("adr", mh_d_adr, &[0, 9]),
        ("ldr/ldrsw literal", mh_d_lit, &[0, 9]),
        ("simd literal", mh_d_simd, &[0, 9]),
        ("b.cond", mh_d_bcond, &[3, 5, 9]),
        ("cbz", mh_d_cbz, &[0, 1]),
        ("tbnz", mh_d_tbnz, &[0, 2, 3]),
        ("bl in the prologue", mh_d_bl, &[0, 9]),
        ("b", mh_d_b, &[0, 9]),
    ];
    let far = far_slot();
    let distance = far.abs_diff(mh_d_adrp as *const () as usize);
    assert!(
        distance > 128 << 20,
        "the far slot is out of every branch's reach ({distance:#x})"
    );
    let mut far_next = far;
    for (what, f, inputs) in cases {
        let near = memhook::trampoline::alloc_near(f as *const () as usize, 100 << 20).expect("a near slot");
        for (label, slot) in [("near", near), ("far", far_next)] {
            let t = relocated(f, slot);
            for &x in inputs {
                // SAFETY: the original and its relocated copy.
                let (want, got) = unsafe { (f(x), t(x)) };
                assert_eq!(got, want, "{what} ({label} trampoline), input {x}");
            }
        }
        far_next += 256;
    }
}

#[test]
fn threads_calling_while_patching_lose_no_call() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const THREADS: usize = 4;
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (stop, calls, start) = (stop.clone(), calls.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: mh_r_count is `x + 1`, or the hook's `x + 1001`.
                    let r = unsafe { mh_r_count(1) };
                    assert!(r == 2 || r == 1002, "a call went wrong: {r}");
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    start.wait();
    let at = mh_r_count as *const () as usize;
    let before = words(at, 2);
    for _ in 0..200 {
        // SAFETY: as in the first test.
        let h = unsafe { Hook::patch_with(at, hook as *const () as usize, &ORIG) }.unwrap();
        h.unpatch().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(words(at, 2), before);
    assert!(calls.load(Ordering::Relaxed) > 0);
}

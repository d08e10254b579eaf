//! Where the time of one patch goes: each system-level step timed alone.
//! `cargo run --release -p memhook --example patch_cost`
use std::time::Instant;

fn median(mut v: Vec<u128>) -> u128 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn time(name: &str, mut f: impl FnMut()) {
    let v: Vec<u128> = (0..201)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos()
        })
        .collect();
    println!("{name:<28} {:>8} ns median", median(v));
}

/// Times every CodeMemory call of the inner writer.
struct Timed<'a>(memhook::code::LinuxCode<'static>, &'a mut Vec<(&'static str, u128)>);
impl memhook::patch::CodeMemory for Timed<'_> {
    fn make_writable(&mut self, at: usize, len: usize) -> Result<(), memhook::patch::PatchError> {
        let t = Instant::now();
        let r = self.0.make_writable(at, len);
        self.1.push(("make_writable", t.elapsed().as_nanos()));
        r
    }
    fn restore_protection(&mut self, at: usize, len: usize) -> Result<(), memhook::patch::PatchError> {
        let t = Instant::now();
        let r = self.0.restore_protection(at, len);
        self.1.push(("restore_protection", t.elapsed().as_nanos()));
        r
    }
    fn read(&self, at: usize, buf: &mut [u8]) {
        self.0.read(at, buf)
    }
    fn write_atomic(&mut self, at: usize, bytes: &[u8]) {
        let t = Instant::now();
        self.0.write_atomic(at, bytes);
        self.1.push(("write_atomic", t.elapsed().as_nanos()));
    }
    fn write(&mut self, at: usize, bytes: &[u8]) {
        let t = Instant::now();
        self.0.write(at, bytes);
        self.1.push(("write", t.elapsed().as_nanos()));
    }
    fn serialize(&mut self) {
        let t = Instant::now();
        self.0.serialize();
        self.1.push(("serialize", t.elapsed().as_nanos()));
    }
}

fn main() {
    let here = main as *const () as usize;
    time("maps::find", || {
        std::hint::black_box(memhook::maps::find(here));
    });
    time("serialize_all_cores", memhook::code::serialize_all_cores);
    let page = here & !4095;
    time("mprotect rwx + rx", || {
        // SAFETY: the page holds this program's code and stays executable.
        unsafe {
            libc::mprotect(
                page as *mut _,
                4096,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            );
            libc::mprotect(page as *mut _, 4096, libc::PROT_READ | libc::PROT_EXEC);
        }
    });
    static ORIGINAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    extern "C" fn hook() -> libc::pid_t {
        // SAFETY: the trampoline has getppid's signature.
        let f: extern "C" fn() -> libc::pid_t =
            unsafe { std::mem::transmute(ORIGINAL.load(std::sync::atomic::Ordering::Acquire)) };
        f()
    }
    let target = libc::getppid as *const () as usize;
    time("can_patch (read + relocate)", || {
        std::hint::black_box(memhook::bistro::can_patch(target, false).unwrap());
    });
    // SAFETY: reading getppid's first bytes.
    let same: [u8; 5] = unsafe { *(target as *const [u8; 5]) };
    time("write_patch (same bytes)", || {
        let mut mem = memhook::code::LinuxCode::with_protection(libc::PROT_READ | libc::PROT_EXEC);
        memhook::patch::write_patch(&mut mem, target, &same, &[0xeb, 0xfe]).unwrap();
    });
    for _ in 0..3 {
        let mut log = Vec::new();
        let mut mem = Timed(
            memhook::code::LinuxCode::with_protection(libc::PROT_READ | libc::PROT_EXEC),
            &mut log,
        );
        memhook::patch::write_patch(&mut mem, target, &same, &[0xeb, 0xfe]).unwrap();
        println!("{log:?}");
    }
    let mut patch = Vec::new();
    let mut unpatch = Vec::new();
    for _ in 0..201 {
        let t = Instant::now();
        // SAFETY: hook has getppid's signature and calls the original.
        let h = unsafe { memhook::bistro::Hook::patch_with(target, hook as *const () as usize, &ORIGINAL) }.unwrap();
        patch.push(t.elapsed().as_nanos());
        let t = Instant::now();
        h.unpatch().map_err(|(_, e)| e).unwrap();
        unpatch.push(t.elapsed().as_nanos());
    }
    println!("{:<28} {:>8} ns median", "Hook::patch_with (getppid)", median(patch));
    println!("{:<28} {:>8} ns median", "Hook::unpatch", median(unpatch));
    println!("serialisation: {:?}", memhook::code::serialization());
}

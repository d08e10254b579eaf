//! The CUDA hooks' install in bistro mode with the driver and a shared
//! runtime loaded (the fake driver of `tests/cuda`, whose entries are
//! driver 580's), beside threads blocked in a `read`, as a large process
//! has them (PyTorch's has about 20, at times 60 or more): every batch of
//! patches looks at each thread around its writes.
//!
//! `cargo run --release -p memhook-tests --example cuda_install [THREADS...]`
//!
//! Prints, for each count of blocked threads (default 0, 16 and 64), the
//! median of 31 installs and of 31 uninstalls, the serialisations of an
//! install, and the install's ratio to the one with no other thread,
//! measured in the same run first.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused))]

use std::io::Read;
use std::time::Instant;

use memhook::Config;

const ROUNDS: usize = 31;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(target_arch = "x86_64")]
fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a count of blocked threads"))
        .collect();
    let counts = if counts.is_empty() { vec![16, 64] } else { counts };
    let dir = std::env::temp_dir().join(format!("memhook-cuda-install-{}", std::process::id()));
    let _driver = memhook_tests::fakecuda::Opened::build(&dir);
    let runtime = std::ffi::CString::new(dir.join("libcudart.so.13").to_str().expect("a UTF-8 path")).expect("no NUL");
    // SAFETY: a NUL-terminated path to the fake runtime just built; it
    // stays loaded.
    assert!(!unsafe { libc::dlopen(runtime.as_ptr(), libc::RTLD_NOW) }.is_null());
    let config = Config::parse("cuda=bistro;mmap=none").expect("a valid configuration");
    let (reader, writer) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    let mut blocked = Vec::new();
    let mut alone = None;
    for count in std::iter::once(0).chain(counts) {
        while blocked.len() < count {
            let mut r = reader.try_clone().expect("a socket");
            blocked.push(std::thread::spawn(move || {
                let _ = r.read(&mut [0u8; 1]);
            }));
        }
        // Let them reach the read.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (mut installs, mut uninstalls, mut serialised) = (Vec::new(), Vec::new(), 0);
        for _ in 0..ROUNDS {
            let before = memhook::code::serializations();
            let t = Instant::now();
            memhook::install(&config);
            installs.push(t.elapsed().as_secs_f64() * 1e6);
            serialised = memhook::code::serializations() - before;
            assert!(memhook::cuda::attached() == (true, true), "both libraries hooked");
            let t = Instant::now();
            memhook::uninstall();
            uninstalls.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let install = median(installs);
        let base = *alone.get_or_insert(install);
        println!(
            "cuda_install: {count:>3} blocked threads: install {install:.0} us ({serialised} serialisations, {:.2}x alone), uninstall {:.0} us (medians of {ROUNDS})",
            install / base,
            median(uninstalls)
        );
    }
    drop(writer);
    for t in blocked {
        let _ = t.join();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("cuda_install: x86_64 only (the fake driver's entries are driver 580's)");
}

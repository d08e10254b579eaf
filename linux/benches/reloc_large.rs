//! Install time in a process of a few huge C++ libraries, as PyTorch's
//! is (libtorch_cuda, cuDNN, cuBLAS: 67 objects, hundreds of MiB), where
//! the walk over their relocations is most of an install.
//!
//! `cargo bench -p memhook --bench reloc_large`
//!
//! Loads what of [`LARGE`] the host has (LLVM's and clang's libraries:
//! tens of thousands of symbol relocations each) and times
//! `memhook::install` of the host hooks in reloc mode, and of the CUDA
//! hooks in reloc mode (the runtime's names, and the loader's functions
//! that every CUDA mode follows through the objects' GOT slots), over
//! every object; the uninstall between samples is not timed. Prints
//! nothing but a note where the host has none of them.
#![cfg(target_arch = "x86_64")]

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use memhook::config::{HookConfig, HookMode, ModeSet};

#[path = "common/installs.rs"]
mod installs;

/// Large C++ libraries, loaded where the host has them.
const LARGE: [&std::ffi::CStr; 4] = [
    c"libLLVM-14.so.1",
    c"libLLVM-15.so.1",
    c"libLLVM.so.22.1",
    c"libclang-cpp.so.14",
];

fn large(c: &mut Criterion) {
    let mut loaded = 0;
    for name in LARGE {
        // SAFETY: a NUL-terminated library name; the handle stays open
        // for the process's life.
        loaded += usize::from(!unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null());
    }
    println!("large libraries loaded: {loaded} of {}", LARGE.len());
    if loaded == 0 {
        return;
    }
    let mut g = c.benchmark_group("large");
    g.sample_size(20);
    let reloc = ModeSet::of(&[HookMode::Reloc]);
    let host = HookConfig {
        mmap: reloc,
        cuda: ModeSet::NONE,
    };
    let cuda = HookConfig {
        mmap: ModeSet::NONE,
        cuda: reloc,
    };
    for (id, hooks) in [("host_hooks_reloc", host), ("cuda_hooks_reloc", cuda)] {
        let config = memhook::Config { hooks };
        g.bench_function(id, |b| b.iter_custom(|iters| installs::timed(iters, &config, || {})));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = large
}
criterion_main!(benches);

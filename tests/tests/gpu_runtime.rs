//! On a GPU: the CUDA runtime API from Rust (cudarc, which loads the shared
//! libcudart). Each allocation and free reports once, with its type and
//! size, whichever level caught it (libcudart's entries with bistro, or
//! the driver calls it makes), and lookups agree with the driver. Skipped,
//! with a message, without a GPU or without libcudart.
#![cfg(target_arch = "x86_64")]

mod common;

use std::ffi::c_void;

use common::{Rec, agrees, log_events, one_event, serial, take};
use cudarc::runtime::sys::{self as rt, cudaError};
use memhook::Config;
use memhook::event::bits;
use memhook::memtype::MemType;

#[track_caller]
fn ok(e: rt::cudaError_t) {
    assert_eq!(e, cudaError::cudaSuccess);
}

#[track_caller]
fn one(recs: Vec<Rec>, kind: u32, addr: usize, size: usize, t: MemType) {
    let r = one_event(recs, kind, addr, size);
    assert_eq!(r.3, t as u32, "{r:?}");
}

#[test]
fn runtime_allocations_through_cudarc_report_once() {
    let _serial = serial();
    // SAFETY: only probes for the libraries.
    let present = unsafe { cudarc::driver::sys::is_culib_present() && rt::is_culib_present() };
    if !present {
        eprintln!("gpu_runtime: no libcuda or libcudart: skipped");
        return;
    }
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: creates the runtime's context (cudaFree(NULL) is the idiom).
    if unsafe { rt::cudaFree(std::ptr::null_mut()) } != cudaError::cudaSuccess {
        eprintln!("gpu_runtime: no usable GPU: skipped");
        return;
    }
    log_events();
    let counting = memhook::cuda::count_events_by_function().expect("a free handler slot");
    memhook::install(&Config::parse("cuda=bistro,reloc,procaddr;mmap=none").unwrap());
    // cudarc loaded libcudart and libcuda from this program: hook them.
    memhook::refresh();
    let (driver, runtime) = memhook::cuda::attached();
    assert!(driver && runtime, "libcuda and libcudart hooked");
    let _ = take();
    // SAFETY: (every call below) runtime calls with valid arguments.
    unsafe {
        ok(rt::cudaMalloc(&mut p, 1 << 20));
        one(take(), bits::MEM_TYPE_ALLOC, p as usize, 1 << 20, MemType::Cuda);
        agrees(p as usize, MemType::Cuda);
        ok(rt::cudaFree(p));
        one(take(), bits::MEM_TYPE_FREE, p as usize, 1 << 20, MemType::Cuda);

        ok(rt::cudaMallocManaged(&mut p, 2 << 20, 1));
        one(take(), bits::MEM_TYPE_ALLOC, p as usize, 2 << 20, MemType::CudaManaged);
        agrees(p as usize, MemType::CudaManaged);
        ok(rt::cudaFree(p));
        one(take(), bits::MEM_TYPE_FREE, p as usize, 2 << 20, MemType::CudaManaged);

        ok(rt::cudaMallocHost(&mut p, 3 << 20));
        one(take(), bits::MEM_TYPE_ALLOC, p as usize, 3 << 20, MemType::CudaHost);
        agrees(p as usize, MemType::CudaHost);
        ok(rt::cudaFreeHost(p));
        one(take(), bits::MEM_TYPE_FREE, p as usize, 3 << 20, MemType::CudaHost);

        let stream = std::ptr::null_mut();
        ok(rt::cudaMallocAsync(&mut p, 4 << 20, stream));
        one(take(), bits::MEM_TYPE_ALLOC, p as usize, 4 << 20, MemType::Cuda);
        ok(rt::cudaFreeAsync(p, stream));
        one(take(), bits::MEM_TYPE_FREE, p as usize, 4 << 20, MemType::Cuda);
        ok(rt::cudaStreamSynchronize(stream));
    }
    memhook::unset_handler(counting).expect("registered above, outside any handler");
    eprintln!(
        "gpu_runtime: events by function: {:?}",
        memhook::cuda::events_by_function()
    );
    memhook::uninstall();
}

//! The fake CUDA driver and its clients (`tests/cuda/*.c`), built with the
//! system C compiler for the tests that exercise the CUDA hook modes
//! without a GPU. See `tests/cuda/fakecuda.c` for what the fake does.

use std::path::{Path, PathBuf};

/// The built libraries.
#[derive(Clone, Debug)]
pub struct FakeCuda {
    /// The folder that holds them.
    pub dir: PathBuf,
    /// The fake driver, `libcuda.so.1` (soname `libcuda.so.1`).
    pub libcuda: PathBuf,
    /// Calls the driver through its PLT (links against it).
    pub plt: PathBuf,
    /// Resolves the driver's functions with `dlsym`.
    pub dlsym: PathBuf,
    /// Behaves as the CUDA runtime (`cuGetProcAddress`).
    pub runtime: PathBuf,
    /// Only `dlopen`s (so that loads go through a library memhook follows).
    pub loader: PathBuf,
    /// A shared runtime, `libcudart.so.13`: `cudaMalloc` and `cudaFree`
    /// over the driver's `cuGetProcAddress` pointers.
    pub cudart: PathBuf,
}

/// The C sources: `tests/cuda`, or `$MEMHOOK_FAKECUDA_SRC` (for test
/// binaries carried to another machine).
fn source(name: &str) -> PathBuf {
    std::env::var_os("MEMHOOK_FAKECUDA_SRC")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda"), PathBuf::from)
        .join(name)
}

fn cc(args: &[&str], out: &Path, src: &Path, extra: &[&str]) {
    crate::cc::build(
        crate::cc::command()
            .args(["-shared", "-fPIC", "-O2", "-Wall"])
            .args(args)
            .arg("-o")
            .arg(out)
            .arg(src)
            .args(extra),
        &out.display().to_string(),
    );
}

/// Builds the fake driver and its clients into `dir` (created if needed).
/// The clients find `libcuda.so.1` next to themselves (`$ORIGIN`).
pub fn build(dir: &Path) -> FakeCuda {
    std::fs::create_dir_all(dir).expect("create the build folder");
    let libcuda = dir.join("libcuda.so.1");
    cc(
        &["-Wl,-soname,libcuda.so.1"],
        &libcuda,
        &source("fakecuda.c"),
        &["-lpthread"],
    );
    let clients = source("clients.c");
    let plt = dir.join("libmh_client_plt.so");
    let libcuda_arg = libcuda.to_str().expect("a UTF-8 path");
    cc(
        &[
            "-DCLIENT_PLT",
            "-Wl,-rpath,$ORIGIN",
            "-Wl,--disable-new-dtags",
            "-Wl,-z,lazy",
        ],
        &plt,
        &clients,
        &[libcuda_arg],
    );
    let dlsym = dir.join("libmh_client_dlsym.so");
    cc(&["-DCLIENT_DLSYM"], &dlsym, &clients, &["-ldl"]);
    let runtime = dir.join("libmh_client_runtime.so");
    cc(&["-DCLIENT_RUNTIME"], &runtime, &clients, &["-ldl"]);
    let loader = dir.join("libmh_client_loader.so");
    cc(&["-DCLIENT_LOADER"], &loader, &clients, &["-ldl"]);
    let cudart = dir.join("libcudart.so.13");
    cc(
        &["-DCLIENT_CUDART", "-Wl,-soname,libcudart.so.13"],
        &cudart,
        &clients,
        &["-ldl"],
    );
    FakeCuda {
        dir: dir.to_path_buf(),
        libcuda,
        plt,
        dlsym,
        runtime,
        loader,
        cudart,
    }
}

/// The fake driver, built and loaded (`dlopen`, `RTLD_NOW`), for the
/// benches that call it directly.
pub struct Opened {
    handle: *mut core::ffi::c_void,
}

impl Opened {
    /// Builds the fake into `dir` and loads its `libcuda.so.1`.
    pub fn build(dir: &Path) -> Opened {
        let fake = build(dir);
        let path = std::ffi::CString::new(fake.libcuda.to_str().expect("a UTF-8 path")).expect("no NUL");
        // SAFETY: a NUL-terminated path to the library just built.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "dlopen {}", fake.libcuda.display());
        Opened { handle }
    }

    /// The address of `name` in the fake (panics when it is missing).
    pub fn sym(&self, name: &std::ffi::CStr) -> *mut core::ffi::c_void {
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        assert!(!p.is_null(), "{name:?} in the fake driver");
        p
    }
}

//! `memhook doctor`: which hook modes work on this machine, and why not.

use std::ffi::CString;

use cudarc::driver::sys;
use memhook::code::{Serialization, serialization};

/// How the hooks that look at the process's mappings (a truncated file's
/// other mappings, a `shmdt`'s pieces, the mapping at an address) can
/// read them here.
fn mappings() -> String {
    if memhook::maps::queries_answer() {
        return "asked of the kernel (PROCMAP_QUERY): a truncated file's mappings, a shmdt's pieces, the mapping at an \
                address"
            .into();
    }
    match memhook::maps::for_each(|_| core::ops::ControlFlow::Break(())) {
        Ok(()) => "read from the text of /proc/self/maps (no PROCMAP_QUERY before Linux 6.11): a truncation of a \
                   mapped file or a shmdt takes time with the process's mappings"
            .into(),
        Err(e) => format!(
            "CANNOT be read (/proc/self/maps: {}; is /proc mounted?): a file emptied (ftruncate, truncate, \
             fallocate, a truncating open, MADV_REMOVE) reports nothing for its other mappings, a hugetlb range is \
             reported in base pages, a shmdt reports the attachment as shmat made it; each such look is counted \
             (memhook::maps::looks_failed, memhook_mapping_looks_failed, memhook run's \"mapping_looks_failed\")",
            std::io::Error::from_raw_os_error(e)
        ),
    }
}

/// Prints one check's line.
fn line(check: &str, verdict: &str) {
    println!("{check:<22} {verdict}");
}

fn page_of(addr: usize) -> usize {
    addr & !(memhook::maps::page_size() - 1)
}

/// Whether this process may make code writable (bistro's need): a fresh
/// page made executable (SELinux `execmem`), and a page of libc's code
/// made writable and back (`execmod`, PaX MPROTECT).
fn code_pages() -> Result<(), String> {
    let ps = memhook::maps::page_size();
    // SAFETY: a fresh private anonymous page, unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ps,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: our own page.
    let rx = unsafe { libc::mprotect(p, ps, libc::PROT_READ | libc::PROT_EXEC) };
    let err = std::io::Error::last_os_error();
    // SAFETY: our own page.
    unsafe { libc::munmap(p, ps) };
    if rx != 0 {
        return Err(format!(
            "a new page cannot be made executable ({err}): trampolines are refused"
        ));
    }
    let code = page_of(libc::getpid as *const () as usize);
    // As the mappings say, or a code segment's r-x where they cannot be
    // read (no /proc mounted), as a bistro patch assumes there.
    let prot = memhook::maps::find(code).map_or(libc::PROT_READ | libc::PROT_EXEC, |m| m.prot);
    // SAFETY: adds write permission to one page of libc's code and puts
    // the protection found back; nothing is written.
    let rwx = unsafe { libc::mprotect(code as *mut libc::c_void, ps, prot | libc::PROT_WRITE) };
    let err = std::io::Error::last_os_error();
    // SAFETY: as above.
    unsafe { libc::mprotect(code as *mut libc::c_void, ps, prot) };
    if rwx != 0 {
        return Err(format!(
            "library code cannot be made writable ({err}): entries cannot be patched"
        ));
    }
    Ok(())
}

/// SELinux, PaX and container facts that explain a refusal.
fn environment() -> String {
    let mut facts = Vec::new();
    if let Ok(e) = std::fs::read_to_string("/sys/fs/selinux/enforce") {
        facts.push(format!(
            "SELinux {}",
            if e.trim() == "1" { "enforcing" } else { "permissive" }
        ));
    }
    if let Ok(s) = std::fs::read_to_string("/proc/self/status")
        && let Some(pax) = s.lines().find(|l| l.starts_with("PaX:"))
    {
        facts.push(pax.to_string());
    }
    let cgroup = std::fs::read_to_string("/proc/1/cgroup").unwrap_or_default();
    if std::path::Path::new("/.dockerenv").exists()
        || std::path::Path::new("/run/.containerenv").exists()
        || ["docker", "kubepods", "containerd", "lxc"]
            .iter()
            .any(|k| cgroup.contains(k))
    {
        facts.push("in a container".into());
    }
    if facts.is_empty() {
        "no SELinux, no PaX, not in a known container".into()
    } else {
        facts.join(", ")
    }
}

/// The driver's version, when libcuda is present.
fn driver_version() -> Option<i32> {
    // SAFETY: only probes for the library.
    if !unsafe { sys::is_culib_present() } {
        return None;
    }
    let mut v = 0;
    // SAFETY: present (so cudarc resolves it); a valid out-parameter.
    (unsafe { sys::cuDriverGetVersion(&mut v) } == sys::CUresult::CUDA_SUCCESS).then_some(v)
}

fn gpus() -> Result<Vec<String>, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"))?;
    let n = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    let driver = nvml.sys_driver_version().unwrap_or_default();
    (0..n)
        .map(|i| {
            let d = nvml.device_by_index(i).map_err(|e| format!("NVML device {i}: {e}"))?;
            let name = d.name().unwrap_or_default();
            let bus = d.pci_info().map(|p| p.bus_id).unwrap_or_default();
            Ok(format!("{i}: {name} at {bus} (driver {driver})"))
        })
        .collect()
}

/// Bistro's dry run over every hooked function of `lib` (a soname to
/// dlopen), counting near, far and refused.
fn dry_run(lib: &str, library_label: &str) -> Option<(usize, usize, Vec<String>)> {
    let c = CString::new(lib).ok()?;
    // SAFETY: loads a library by name (its constructors run, as in any CUDA
    // program).
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return None;
    }
    let (mut near, mut far, mut refused) = (0, 0, Vec::new());
    for (name, l) in memhook::cuda::functions() {
        if l != library_label {
            continue;
        }
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
        let name = name.to_string_lossy();
        if p == 0 {
            refused.push(format!("{name}: not exported"));
        } else if memhook::bistro::can_patch(p, false).is_ok() {
            near += 1;
        } else {
            match memhook::bistro::can_patch(p, true) {
                Ok(_) => far += 1,
                Err(e) => refused.push(format!("{name}: {e}")),
            }
        }
    }
    Some((near, far, refused))
}

/// How the memtype map's memory is backed: advised for transparent huge
/// pages at load (and the kernel's setting for them), or not.
fn map_pages() -> String {
    let (start, end) = memhook::memtype::map_range();
    let mib = (end - start) as f64 / f64::from(1 << 20);
    let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|s| Some(s.split('[').nth(1)?.split(']').next()?.to_string()));
    match (memhook::memtype::huge_pages(), setting) {
        (true, Some(mode)) if mode != "never" => format!(
            "{mib:.1} MiB, advised for transparent huge pages (kernel: {mode}): a lookup's pages share TLB entries"
        ),
        (true, _) => format!("{mib:.1} MiB, advised for huge pages, but the kernel's transparent huge pages are off"),
        (false, _) => format!(
            "{mib:.1} MiB in 4 KiB pages: MEMHOOK_MAP_HUGE_PAGES=0, or no transparent huge pages in this kernel"
        ),
    }
}

/// The `hugetlb:` line: the huge page sizes, how a mapping's is found,
/// and whether `MADV_DONTNEED` rounds up here.
fn hugetlb() -> String {
    let s = memhook::hugetlb::support();
    if s.sizes == 0 {
        return "no huge page sizes offered (or memfd_create(MFD_HUGETLB) refused): mappings sized in base pages"
            .into();
    }
    let sizes: Vec<String> = (0..64)
        .filter(|k| s.sizes & (1u64 << k) != 0)
        .map(|k| match k {
            30.. => format!("{} GiB", 1u64 << (k - 30)),
            20.. => format!("{} MiB", 1u64 << (k - 20)),
            _ => format!("{} KiB", 1u64 << (k - 10)),
        })
        .collect();
    format!(
        "{} pages; a mapping's page size {}; MADV_DONTNEED {}",
        sizes.join(", "),
        if s.query {
            "asked of the kernel (PROCMAP_QUERY)"
        } else {
            "read from /proc/self/maps and mountinfo (no PROCMAP_QUERY before Linux 6.11)"
        },
        if s.madvise_rounds_up {
            "rounds a hugetlb range's end up to its huge page here (reported so)"
        } else {
            "does not round a hugetlb range's end up here"
        }
    )
}

/// Whether this process may make an io_uring: a ring of one entry is
/// made and closed. The kernel reads an io_uring's requests from memory
/// it shares with the process, so a discard submitted there
/// (`IORING_OP_MADVISE`) or a truncation (`IORING_OP_FTRUNCATE`) calls
/// no function a hook could see.
fn io_uring() -> String {
    // struct io_uring_params: 120 bytes, zero asks for the defaults.
    let mut params = [0u64; 15];
    // SAFETY: io_uring_setup(2) writes the 120-byte parameters it is given.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    if fd >= 0 {
        // SAFETY: the descriptor just made.
        unsafe { libc::close(fd as libc::c_int) };
        return "usable by this process: what a program submits to a ring (IORING_OP_MADVISE, \
                IORING_OP_FTRUNCATE, an IORING_OP_OPENAT with O_TRUNC) calls no function and is not reported"
            .into();
    }
    match err.raw_os_error() {
        Some(libc::ENOSYS) => "not in this kernel: nothing reaches memory past the hooks that way".into(),
        Some(libc::EPERM) => format!(
            "refused to this process ({err}: kernel.io_uring_disabled{}, or a seccomp filter): \
             nothing reaches memory past the hooks that way",
            std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                .map(|v| format!(" = {}", v.trim()))
                .unwrap_or_default()
        ),
        _ => format!("not made here ({err}); where a program can make one, what it submits there is not reported"),
    }
}

/// Whether this kernel moves pages between ranges for userfaultfd
/// (`UFFDIO_MOVE`, Linux 6.8), an `ioctl` memhook reports where libc makes
/// it.
fn userfaultfd_move() -> String {
    const UFFD_USER_MODE_ONLY: libc::c_int = 1;
    const UFFD_API: u64 = 0xaa;
    const UFFD_FEATURE_MOVE: u64 = 1 << 16;
    // _IOWR(0xaa, 0x3f, struct uffdio_api), 24 bytes.
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    // SAFETY: userfaultfd(2) takes flags alone.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | UFFD_USER_MODE_ONLY) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return format!("not available to this process ({err}): no page moves past the hooks that way");
    }
    let fd = fd as libc::c_int;
    // struct uffdio_api { api, features, ioctls }: features 0 asks for
    // none and the kernel answers every one it has.
    let mut api = [UFFD_API, 0, 0];
    // SAFETY: UFFDIO_API reads and writes the 24-byte struct it is given.
    let rc = unsafe { libc::ioctl(fd, UFFDIO_API, api.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: the descriptor just made.
    unsafe { libc::close(fd) };
    if rc != 0 {
        format!("UFFDIO_API refused ({err}): no page moves past the hooks that way")
    } else if api[1] & UFFD_FEATURE_MOVE != 0 {
        "UFFDIO_MOVE available: a move through libc's ioctl or syscall is reported (VM_UNMAPPED of \
         the source range; in reloc mode from the objects it rewrote), one made by the instruction is not"
            .into()
    } else {
        "no UFFDIO_MOVE in this kernel (before Linux 6.8): no page moves past the hooks that way".into()
    }
}

pub fn doctor() -> i32 {
    println!("memhook {} doctor", env!("CARGO_PKG_VERSION"));
    match code_pages() {
        Ok(()) => line("code pages:", "writable: bistro can patch entries and map trampolines"),
        Err(e) => line("code pages:", &format!("NOT writable: {e}; use reloc,procaddr")),
    }
    line("environment:", &environment());
    line(
        "membarrier:",
        match serialization() {
            Serialization::MembarrierSyncCore => "PRIVATE_EXPEDITED_SYNC_CORE: patches serialise every core at once",
            _ => {
                "not available: patches signal each running thread instead (a 2 ms grace period where it cannot be signalled)"
            }
        },
    );
    line(
        "threads in patches:",
        &match memhook::code::thread_check() {
            Ok(signal) => {
                format!("a thread stopped inside bytes being patched is moved out (/proc/self/task, {signal})")
            }
            Err(why) => format!("not checked: {why}; patches are written as if no thread stood inside"),
        },
    );
    line(
        "dispatch readers:",
        if memhook::dispatch::reader_slots() {
            "per-thread slots (plain stores; registration fences every thread with membarrier)"
        } else {
            "shared counters (two locked instructions per hooked call): no membarrier PRIVATE_EXPEDITED, or MEMHOOK_READER_SLOTS=0"
        },
    );
    line("memtype map:", &map_pages());
    line("hugetlb:", &hugetlb());
    line("mappings:", &mappings());
    line(
        "loader:",
        if memhook::reloc::sees_relocation() {
            "_dl_find_object present: reloc hooks a library only once the loader has relocated it"
        } else {
            "no _dl_find_object (glibc before 2.35): a rescan waits for the loads in progress on other \
             threads (a dlopen(NULL)) and hooks only the libraries listed before the wait"
        },
    );
    line(
        "loader namespaces:",
        if memhook::reloc::sees_namespaces() && memhook::loader_break_patchable() {
            "followed: a library opened with dlmopen has its own libc, which the host hooks patch too \
             (bistro, as soon as the loader has mapped it, through its breakpoint for debuggers: what the \
             library's constructors call is seen; in reloc mode, its objects' GOT slots, after the dlmopen), \
             and its objects' loads and unloads are reported"
        } else if memhook::reloc::sees_namespaces() {
            "followed: a library opened with dlmopen has its own libc, which the host hooks patch too \
             (bistro; in reloc mode, its objects' GOT slots), and its objects' loads and unloads are reported; \
             the loader's breakpoint for debuggers is no empty function memhook can patch (or a debugger's \
             breakpoint is on it), so what the library's constructors call during the dlmopen is not seen"
        } else {
            "not followed (glibc before 2.35, or no DT_DEBUG in the program): a library opened with \
             dlmopen calls a libc of its own that memhook does not see"
        },
    );
    line(
        "forks:",
        if memhook::fork::loader_lock_found() {
            "a child forked while another thread walked the loaded objects (dl_iterate_phdr) finds the \
             loader's lock over them let go; forked amid a dlopen or dlclose changing them, it finds it held \
             for good: memhook's entries of the loader's functions skip their walks there, and the child's \
             own walks (the dlopen of a new library among them) wait, as without memhook"
        } else {
            "the loader's lock over its objects was not found (glibc before 2.35, no DT_DEBUG, a static \
             program): a child forked while another thread walked or changed them hangs at its next walk, \
             as without memhook"
        },
    );
    line("io_uring:", &io_uring());
    line("userfaultfd:", &userfaultfd_move());
    match driver_version() {
        Some(v) => line(
            "libcuda:",
            &format!("present, driver API {}.{}", v / 1000, v % 1000 / 10),
        ),
        None => line(
            "libcuda:",
            "not found: the CUDA hooks wait for it (they install when it loads)",
        ),
    }
    match gpus() {
        Ok(g) if g.is_empty() => line("GPUs:", "none (NVML sees no device)"),
        Ok(g) => {
            line("GPUs:", &format!("{} (NVML)", g.len()));
            for d in g {
                println!("{:<22} {d}", "");
            }
        }
        Err(e) => line("GPUs:", &format!("none found ({e})")),
    }
    for (soname, label) in [("libcuda.so.1", "libcuda.so.1"), ("libcudart.so", "libcudart.so")] {
        match dry_run(soname, label) {
            Some((near, far, refused)) => {
                line(
                    "bistro dry run:",
                    &format!(
                        "{soname}: {near} near, {far} far, {} refused of the hooked functions",
                        refused.len()
                    ),
                );
                for r in refused {
                    println!("{:<22}   {r}", "");
                }
            }
            None => line(
                "bistro dry run:",
                &format!("{soname}: not loadable here, nothing to check"),
            ),
        }
    }
    line(
        "verdict:",
        "reloc alone cannot catch a statically linked CUDA runtime: it reaches the driver \
         through dlsym(cuGetProcAddress_v2) and the pointers cuGetProcAddress returns, never through \
         a GOT slot. Use the default (bistro,reloc,procaddr); where code pages are not writable, \
         reloc,procaddr still catches it.",
    );
    0
}

//! The process's memory-type map lies in zero-initialised memory (`.bss`,
//! no file behind it) and is advised for transparent huge pages at load,
//! unless `MEMHOOK_MAP_HUGE_PAGES=0`; either way it works.
use std::process::Command;

use memhook::memtype::{self, Lookup, MemType};

/// The `/proc/self/smaps` blocks (header line, then its fields) of the
/// mappings that overlap `[start, end)`.
fn mappings(start: usize, end: usize) -> Vec<(String, Vec<String>)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in smaps.lines() {
        let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
        let header =
            range.and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)));
        match header {
            Some((lo, hi)) if line.split_whitespace().count() >= 5 => {
                if lo < end && start < hi {
                    out.push((line.to_string(), Vec::new()));
                } else {
                    out.push((String::new(), Vec::new()));
                }
            }
            _ => {
                if let Some(last) = out.last_mut() {
                    last.1.push(line.to_string());
                }
            }
        }
    }
    out.into_iter().filter(|(h, _)| !h.is_empty()).collect()
}

/// Whether this process can see madvise(MADV_HUGEPAGE) in its own smaps:
/// a kernel with transparent huge pages, observed directly (under
/// qemu-user, which runs the aarch64 tests in CI, madvise succeeds without
/// reaching the kernel, and smaps shows the emulator's mappings).
fn advice_observable() -> bool {
    if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
        return false;
    }
    let len = 4 << 20;
    // SAFETY: a fresh anonymous private mapping, advised, then unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let seen = libc::madvise(p, len, libc::MADV_HUGEPAGE) == 0
            && mappings(p as usize, p as usize + len).iter().any(|(_, fields)| {
                fields
                    .iter()
                    .any(|f| f.starts_with("VmFlags:") && f.split_whitespace().any(|w| w == "hg"))
            });
        libc::munmap(p, len);
        seen
    }
}

/// Runs the test `name` of this binary in a child process with the
/// environment variable `MEMHOOK_MAP_HUGE_PAGES` set to `value` (`None`:
/// unset), and checks that it passed: the map is laid out at load, so
/// only a new process can have the other setting.
fn in_child(name: &str, value: Option<&str>) {
    let mut child = Command::new(std::env::current_exe().unwrap());
    child.args(["--include-ignored", "--exact", name, "--nocapture"]);
    match value {
        Some(v) => child.env("MEMHOOK_MAP_HUGE_PAGES", v),
        None => child.env_remove("MEMHOOK_MAP_HUGE_PAGES"),
    };
    let out = child.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_map_lies_in_anonymous_memory_advised_for_huge_pages() {
    if std::env::var("MEMHOOK_MAP_HUGE_PAGES").as_deref() == Ok("0") {
        // Started with the opt-out (exported by the developer's shell):
        // the advice is checked in a process without it.
        in_child("the_map_lies_in_anonymous_memory_advised_for_huge_pages", None);
        return;
    }
    let (start, end) = memtype::map_range();
    assert!(end - start > 4 << 20, "the map is {} bytes", end - start);
    // On whole 2 MiB pages of its own, so that all of it can be huge: the
    // kernel's loader honours this executable's segment alignment
    // (qemu-user's, which runs the aarch64 tests, need not).
    assert_eq!((end - start) % (2 << 20), 0, "the map spans whole 2 MiB pages");
    if std::env::var_os("MEMHOOK_TEST_QEMU").is_none() {
        assert_eq!(start % (2 << 20), 0, "the map starts on a 2 MiB boundary: {start:#x}");
    }
    let maps = mappings(start, end);
    assert!(!maps.is_empty(), "no mapping holds the map");
    // Fields: range, perms, offset, device, inode[, path]. Zero bytes in
    // .bss: only the page it shares with .data's end comes from the file.
    let anonymous = |header: &str| header.split_whitespace().nth(4) == Some("0");
    let overlap = |header: &str| {
        let (lo, hi) = header.split_whitespace().next().unwrap().split_once('-').unwrap();
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).unwrap(),
            usize::from_str_radix(hi, 16).unwrap(),
        );
        hi.min(end) - lo.max(start)
    };
    let in_files: usize = maps
        .iter()
        .filter(|(h, _)| !anonymous(h))
        .map(|(h, _)| overlap(h))
        .sum();
    assert!(
        in_files <= 16 << 10,
        "{in_files} bytes of the map lie in file mappings: {maps:#?}"
    );
    if !advice_observable() {
        println!("madvise(MADV_HUGEPAGE) is not visible in smaps here: advice not checked");
        return;
    }
    assert!(memtype::huge_pages(), "madvise(MADV_HUGEPAGE) over the map failed");
    // The anonymous mappings that hold its whole pages carry the advice
    // (a page it shares with its neighbours at either end is not advised).
    let (first, last) = (start.next_multiple_of(4096), end & !4095);
    let whole_pages = |header: &str| {
        let (lo, hi) = header.split_whitespace().next().unwrap().split_once('-').unwrap();
        usize::from_str_radix(lo, 16).unwrap() < last && first < usize::from_str_radix(hi, 16).unwrap()
    };
    for (header, fields) in maps.iter().filter(|(h, _)| anonymous(h) && whole_pages(h)) {
        let flags = fields.iter().find(|f| f.starts_with("VmFlags:")).expect("VmFlags");
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{header}: {flags}");
    }
    // And it works: the first update lays out the tables.
    memtype::insert(0x7e00_0000_0000, 0x1000, MemType::Cuda, 0).unwrap();
    assert!(matches!(memtype::lookup(0x7e00_0000_0800, 8), Lookup::Found(i) if i.mem_type == MemType::Cuda));
    assert!(memtype::take(0x7e00_0000_0000).is_some());
    assert_eq!(memtype::lookup(0x7e00_0000_0800, 8), Lookup::Absent);
}

/// Run by the test below in a child process with the opt-out set.
#[test]
#[ignore = "run by without_advice_when_the_environment_says_0"]
fn child_without_advice() {
    assert_eq!(std::env::var("MEMHOOK_MAP_HUGE_PAGES").as_deref(), Ok("0"));
    assert!(!memtype::huge_pages());
    let (start, end) = memtype::map_range();
    for (header, fields) in mappings(start, end) {
        let flags = fields.iter().find(|f| f.starts_with("VmFlags:")).expect("VmFlags");
        assert!(!flags.split_whitespace().any(|f| f == "hg"), "{header}: {flags}");
    }
    memtype::insert(0x7e00_0000_0000, 0x1000, MemType::CudaHost, -1).unwrap();
    assert!(matches!(memtype::lookup(0x7e00_0000_0800, 8), Lookup::Found(i) if i.mem_type == MemType::CudaHost));
}

#[test]
fn without_advice_when_the_environment_says_0() {
    if !advice_observable() {
        println!("madvise(MADV_HUGEPAGE) is not visible in smaps here: not checked");
        return;
    }
    in_child("child_without_advice", Some("0"));
}

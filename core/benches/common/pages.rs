//! The huge pages behind a static map, for the memtype bench and the
//! `readers` example (included by both with `#[path]`): a lookup in a
//! large map touches three random pages, so whether the kernel gave the
//! map the transparent huge pages it was advised for moves the figures.

/// Asks for transparent huge pages over `map`'s whole pages, as `memhook`
/// does for the process's map at load. Before the map is first touched; a
/// kernel without them refuses, harmlessly.
pub fn advise_huge_pages<T>(map: &'static T) {
    let start = (map as *const T as usize).next_multiple_of(4096);
    let end = (map as *const T as usize + size_of::<T>()) & !4095;
    if end > start {
        // SAFETY: the range lies inside a static of this program;
        // MADV_HUGEPAGE changes how the kernel backs it, not its contents.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

/// How `map`'s memory is backed now, from `/proc/self/smaps`:
/// "AnonHugePages X kB of Y kB" summed over the mappings it overlaps (the
/// advice splits the one that holds it), or why it cannot say.
pub fn huge_pages_of<T>(map: &'static T) -> String {
    let (start, end) = (map as *const T as usize, map as *const T as usize + size_of::<T>());
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return "no /proc/self/smaps".into();
    };
    let (mut inside, mut size, mut huge) = (false, 0u64, 0u64);
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = head.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            inside = lo < end && start < hi;
            continue;
        }
        let kib = || {
            line.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if inside && line.starts_with("Size:") {
            size += kib();
        } else if inside && line.starts_with("AnonHugePages:") {
            huge += kib();
        }
    }
    format!("AnonHugePages {huge} kB of the {size} kB mapped over it")
}

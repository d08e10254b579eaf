//! What a CUDA hook reports: the memtype map first (so that a handler's
//! lookup already agrees), then `MEM_TYPE_ALLOC` / `MEM_TYPE_FREE` to the
//! handlers. Nothing here allocates or waits for a registration.

use core::sync::atomic::{AtomicU64, Ordering};

use memhook_core::event::{Event, MemTypeEvent, bits};
use memhook_core::memtype::{Lookup, MemInfo, MemType};

use super::driver;
use super::hooks::{Id, SUCCESS, Status};
use crate::dispatch::{self, ThisThread, wants};
use crate::memtype;

/// The hooked CUDA function whose event this thread is delivering now
/// (for handlers that report by function).
pub(crate) fn reporting() -> Option<Id> {
    let i = dispatch::reporting();
    (i != 0).then(|| Id::ALL[usize::from(i) - 1])
}

/// Delivers `event` as `id`'s on the thread whose state `thread` is: the
/// mark [`reporting`] reads and the delivery in one thread-local lookup,
/// which a hook that first asks the cache for the delivery's lines
/// shares with that (before the fifty-fifth session a delivery made two
/// lookups, and the prefetch a third, each a call into the dynamic linker
/// in `libmemhook.so`). (No count of its own: a global counter bumped
/// here, an atomic read-modify-write on a line every thread's events
/// share, cost each delivery from cold caches ~6 ns, 13 a pair, in run
/// 77; [`super::count_events_by_function`] counts where asked.)
fn deliver(thread: &ThisThread, id: Id, mut event: Event) {
    thread.notify_reporting(id as u8 + 1, &mut event);
}

/// A successful allocation of `[address, address + size)` (size 0: ask the
/// driver) of `mem_type` (Unknown: ask the driver).
#[inline(always)]
pub(super) fn allocated(id: Id, address: usize, size: usize, mem_type: MemType) {
    // After the driver's work every line below is likely cold. The map's
    // lock is an atomic read-modify-write, which waits for the loads
    // before it and holds back those after it: ask for its line first and
    // read the handler masks before it, so that the misses overlap rather
    // than follow one another. (A handler registered meanwhile misses this
    // event as it would a moment later.)
    memtype::map().prefetch_update();
    let thread = if wants(bits::MEM_TYPE_ALLOC) {
        dispatch::this_thread()
    } else {
        None
    };
    if let Some(thread) = &thread {
        thread.prefetch_delivery(bits::MEM_TYPE_ALLOC);
    }
    let (mem_type, device, size) = match mem_type {
        MemType::Cuda | MemType::CudaManaged => (mem_type, driver::current_device(), size),
        MemType::Unknown => classified(address, size),
        _ => (mem_type, -1, size),
    };
    if size != 0 && mem_type != MemType::Host {
        // A full map drops the range and answers Unknown inside it.
        let mark = marked(id, mem_type);
        let _ = memtype::map().insert_marked(address, size, mem_type, device, mark);
    }
    if let Some(thread) = &thread {
        deliver_alloc(thread, id, address, size, mem_type);
    }
}

/// Whether the entry that `id` records for memory of `mem_type` is
/// marked ([`memhook_core::memtype::MemtypeMap::insert_marked`]): memory
/// a free of device memory (`cuMemFree*`, `cudaFree*`) may be refused
/// for, which is all but the device and managed memory of the device
/// allocations (pinned memory from a stream-ordered pool of host memory,
/// which `cuMemFreeAsync` frees, is marked by its type). Driver 580
/// refuses a device free of pinned or registered host memory and of
/// pages mapped with `cuMemMap` (`tests/gpu/refusals.c`), and one of
/// memory opened from another process, which only its close ends
/// (`tests/gpu/ipc.c`, run 167); a free of a marked entry looks at
/// the driver's answer ([`freeing`]), the others keep their tail call.
#[inline(always)]
const fn marked(id: Id, mem_type: MemType) -> bool {
    let device_allocation = matches!(
        id,
        Id::cuMemAlloc_v2
            | Id::cuMemAlloc
            | Id::cuMemAllocAsync
            | Id::cuMemAllocAsync_ptsz
            | Id::cuMemAllocFromPoolAsync
            | Id::cuMemAllocFromPoolAsync_ptsz
            | Id::cuMemAllocManaged
            | Id::cuMemAllocPitch
            | Id::cuMemAllocPitch_v2
            | Id::cuMemPoolImportPointer
            | Id::cuExternalMemoryGetMappedBuffer
            | Id::cudaMalloc
            | Id::cudaMallocAsync
            | Id::cudaMallocAsync_ptsz
            | Id::cudaMallocFromPoolAsync
            | Id::cudaMallocFromPoolAsync_ptsz
            | Id::cudaMallocManaged
            | Id::cudaMallocPitch
            | Id::cudaMemPoolImportPointer
            | Id::cudaExternalMemoryGetMappedBuffer
    );
    !device_allocation || matches!(mem_type, MemType::CudaHost)
}

/// Delivers `MEM_TYPE_ALLOC` for `[address, address + size)`.
#[inline(always)]
fn deliver_alloc(thread: &ThisThread, id: Id, address: usize, size: usize, mem_type: MemType) {
    deliver(
        thread,
        id,
        Event::MemTypeAlloc(MemTypeEvent {
            address,
            size,
            mem_type: mem_type as u32,
        }),
    );
}

/// The type, device and size the driver gives an allocation of unknown
/// type at `address` (`size` 0: the driver's size too).
///
/// An address the driver calls not its own, just returned by its
/// allocation call, is a graph's allocation (a node, or a stream-ordered
/// allocation made while the stream captures): reserved, with memory only
/// while the graph runs. Unknown, not host: host would be a wrong type
/// once the graph runs.
///
/// Where the call gave the size, the driver is asked the type and device
/// alone ([`driver::kind`]: three pointer attributes, where a range takes
/// seven): the stream-ordered allocations (`cuMemAllocAsync`,
/// `cudaMallocAsync`) come this way at every call.
#[inline(never)]
fn classified(address: usize, size: usize) -> (MemType, i32, usize) {
    let answer = if size != 0 {
        driver::kind(address).map(|(mem_type, device)| (mem_type, device, size))
    } else {
        driver::classify(address).map(|info| (info.mem_type, info.device, info.len))
    };
    match answer {
        Some((mem_type, device, size)) if mem_type != MemType::Host => (mem_type, device, size),
        Some(_) => {
            super::graph::remember(address, size);
            (MemType::Unknown, -1, size)
        }
        None => (MemType::Unknown, -1, size),
    }
}

/// A free of the allocation at `address` (its size when the call carries
/// it; else what the map recorded; else the driver's range; else 0).
///
/// Returns [`Kept::NONE`], or, where `id` frees device memory and the
/// map held a marked entry at `address` ([`marked`]: memory the driver
/// may refuse that free for), that entry: it is then out of the map and
/// nothing is reported yet, and the hook reports it ([`kept_freeing`]),
/// makes the call, and puts it back if the driver refused
/// ([`kept_refused`]) (driver 580 refuses a device free of pinned host
/// memory, a program error, but frees a host pool's allocation: which
/// one it was shows only after the call).
#[inline(always)]
pub(super) fn freeing(id: Id, address: usize, size: Option<usize>) -> Kept {
    // As in `allocated`: the map's line is asked for before the loads.
    memtype::map().prefetch_update();
    if size.is_none() && !wants(bits::MEM_TYPE_FREE) {
        // Nobody to tell: end the recorded allocation in one step.
        match memtype::map().take_marked(address) {
            None => {
                forget_unrecorded(address);
            }
            Some((info, _)) if info.mem_type == MemType::Unknown => keep_graph_range(info.base, info.len),
            Some((info, mark)) if keeps(id, &info, mark) => return Kept::of(&info),
            Some(_) => {}
        }
        return Kept::NONE;
    }
    reporting_free(id, address, size)
}

/// A marked entry a free of device memory took ([`freeing`]): its length
/// (0: none), type and device. Two words, which go to and come back from
/// a function in registers (a third would go through memory, and the
/// hook's stack could then be seen by its callee: no tail call).
#[derive(Clone, Copy)]
pub(super) struct Kept {
    /// The entry's length; 0: nothing kept.
    pub(super) len: usize,
    /// Its type in the low word, its device in the high one.
    kind: u64,
}

impl Kept {
    /// Nothing kept.
    pub(super) const NONE: Kept = Kept { len: 0, kind: 0 };

    #[inline(always)]
    const fn of(info: &MemInfo) -> Kept {
        Kept {
            len: info.len,
            kind: (info.mem_type as u32 as u64) | ((info.device as u32 as u64) << 32),
        }
    }

    /// The entry, at `address`.
    const fn at(self, address: usize) -> Taken {
        let entry = MemInfo {
            mem_type: MemType::from_raw(self.kind as u32),
            device: (self.kind >> 32) as u32 as i32,
            base: address,
            len: self.len,
        };
        Taken {
            address,
            entry: Some(entry),
            size: self.len,
            mark: true,
        }
    }
}

/// Whether a free by `id` keeps the entry it took, with its `mark`, to
/// look at the driver's answer ([`freeing`]): a device free of a marked
/// entry (a graph's range, recorded Unknown, is ended as usual).
#[inline(always)]
const fn keeps(id: Id, info: &MemInfo, mark: bool) -> bool {
    mark && !matches!(info.mem_type, MemType::Unknown) && frees_device_memory(id)
}

/// Whether `id` is a free of device memory, which driver 580 refuses
/// for memory of other kinds (see [`marked`]), a host pool's allocation
/// aside.
#[inline(always)]
const fn frees_device_memory(id: Id) -> bool {
    matches!(
        id,
        Id::cuMemFree
            | Id::cuMemFree_v2
            | Id::cuMemFreeAsync
            | Id::cuMemFreeAsync_ptsz
            | Id::cudaFree
            | Id::cudaFreeAsync
            | Id::cudaFreeAsync_ptsz
    )
}

/// What a free took out of the map before its call (or found in the
/// driver alone), and reports: kept for a call the driver may refuse,
/// to be put back if it does ([`refused`]).
#[derive(Clone, Copy)]
pub(super) struct Taken {
    /// The freed address.
    address: usize,
    /// What the map held there, or `None`: the map held nothing that
    /// starts there, and `size` is the driver's (0: none).
    entry: Option<MemInfo>,
    /// The size reported.
    size: usize,
    /// The entry's mark (marked where the map held none).
    mark: bool,
}

/// Before a device free of the marked entry [`freeing`] took (its answer
/// `kept`): `MEM_TYPE_FREE` for it.
#[cold]
#[inline(never)]
pub(super) fn kept_freeing(id: Id, address: usize, kept: Kept) {
    report_taken(id, &kept.at(address));
}

/// After the driver refused that free: the memory back (see [`refused`]).
#[cold]
#[inline(never)]
pub(super) fn kept_refused(id: Id, address: usize, kept: Kept) {
    refused(id, kept.at(address));
}

/// Takes what a free of `address` ends out of the map, as
/// [`reporting_free`] does, and says what it took (nothing is reported).
/// Inlined: left to the compiler, it went out of line once the map's
/// static changed type (6a03d42), and a free with a handler paid a call
/// (+36 instructions a pair in `scripts/callgrind.sh`'s `cuda` family).
#[inline(always)]
pub(super) fn take(address: usize) -> Taken {
    let (entry, size, mark) = match memtype::map().take_marked(address) {
        Some((info, mark)) => {
            if info.mem_type == MemType::Unknown {
                keep_graph_range(info.base, info.len);
            }
            (Some(info), info.len, mark)
        }
        None => (None, forget_unrecorded(address), true),
    };
    Taken {
        address,
        entry,
        size,
        mark,
    }
}

/// `MEM_TYPE_FREE` for what [`take`] took (where a handler wants it).
pub(super) fn report_taken(id: Id, taken: &Taken) {
    if wants(bits::MEM_TYPE_FREE)
        && let Some(thread) = dispatch::this_thread()
    {
        let mem_type = taken.entry.map_or(MemType::Unknown, |info| info.mem_type);
        deliver_free(&thread, id, taken.address, taken.size, mem_type);
    }
}

/// After a free the driver refused (its hook reported it and took it out
/// of the map before the call): where the driver still has memory of the
/// type the map held starting at the address, what the map held is put
/// back and `MEM_TYPE_ALLOC` reported for it (an early free, then an
/// allocation, as for a refused `cuMemUnmap`); a range the map did not
/// hold is recorded from the driver's answers. Where the driver no
/// longer knows the address (a refusal after it shut down, at the
/// process's exit; an error status from earlier work, which the runtime's
/// frees may return after freeing) or has other memory there now
/// (allocated by another thread since, whose hook records it), nothing is
/// put back: never a type the memory no longer has.
#[cold]
#[inline(never)]
pub(super) fn refused(id: Id, taken: Taken) {
    let Some(now) = driver::classify(taken.address) else {
        return;
    };
    if now.base != taken.address || now.mem_type == MemType::Host {
        return;
    }
    // What the map held (an entry taken at the address starts there);
    // else the driver's range, with the type and device it gives now.
    let len = match taken.entry {
        Some(info) if (info.mem_type, info.device) == (now.mem_type, now.device) => info.len,
        None if taken.size != 0 => taken.size,
        _ => return,
    };
    // A full map drops the range and answers Unknown inside it.
    let _ = memtype::map().insert_marked(taken.address, len, now.mem_type, now.device, taken.mark);
    if wants(bits::MEM_TYPE_ALLOC)
        && let Some(thread) = dispatch::this_thread()
    {
        deliver_alloc(&thread, id, taken.address, len, now.mem_type);
    }
}

/// After a `cuMemUnmap` of `[address, address + size)` the driver
/// refused (its hook reported the range freed and took it out of the map
/// before the call): each mapping the driver still has in the range is
/// recorded and reported again, `MEM_TYPE_ALLOC` of the whole mapping.
/// Mappings start at multiples of the allocation granularity (2 MiB on
/// every GPU so far): unmapped space is passed over in steps of that
/// from the next such multiple, at most [`UNMAP_STEPS`] driver queries
/// in all. The part of a longer range with holes that the queries did not
/// reach is recorded Unknown (marked): the mappings there are not
/// reported again, but a lookup there says to ask the driver, never host
/// (`memtype::classify` records what the driver has there).
#[cold]
#[inline(never)]
pub(super) fn unmap_refused(id: Id, address: usize, size: usize) {
    const STEP: usize = 2 << 20;
    let end = address.saturating_add(size);
    let mut at = address;
    for _ in 0..UNMAP_STEPS {
        if at >= end {
            return;
        }
        match driver::classify(at) {
            Some(info) if info.mem_type != MemType::Host && info.base <= at && at - info.base < info.len => {
                // Unknown: type and device asked again, as for a mapping
                // of memory of any device.
                allocated(id, info.base, info.len, MemType::Unknown);
                at = info.base.saturating_add(info.len);
            }
            _ => at = (at | (STEP - 1)).saturating_add(1),
        }
    }
    if at < end {
        let _ = memtype::map().insert_marked(at, end - at, MemType::Unknown, -1, true);
    }
}

/// The most driver queries [`unmap_refused`] makes.
const UNMAP_STEPS: usize = 1024;

/// After the free of an entry recorded Unknown: a graph allocation's
/// range is recorded Unknown again (its graph may make the memory again
/// with no call memhook sees: see [`super::graph`]). (Base and length by
/// value: a `MemInfo` would be passed through the hook's stack memory,
/// and the hook could then not end in a tail call to the driver.)
#[cold]
#[inline(never)]
fn keep_graph_range(base: usize, len: usize) {
    if super::graph::keeps(base, len) {
        let _ = memtype::map().insert(base, len, MemType::Unknown, -1);
    }
}

/// A free of an address the map does not know: asks the driver, only to
/// forget a range that may cover it. Returns the allocation's size (0:
/// the driver knows none that starts there).
#[cold]
#[inline(never)]
fn forget_unrecorded(address: usize) -> usize {
    let size = driver::allocation_at(address).unwrap_or(0);
    if size != 0 {
        let _ = memtype::map().remove(address, size);
    }
    size
}

/// [`freeing`] with a handler to tell, or the size given. The map first,
/// as for an allocation: a handler's lookup of the range already says
/// it is gone. (Returns as [`freeing`].)
#[inline(never)]
fn reporting_free(id: Id, address: usize, size: Option<usize>) -> Kept {
    let thread = dispatch::this_thread();
    if let Some(thread) = &thread {
        thread.prefetch_delivery(bits::MEM_TYPE_FREE);
    }
    let (size, mem_type) = match size {
        // The call carries the size (cuMemUnmap): the type is the map's,
        // and the range goes whatever the map holds there.
        Some(size) => {
            let mem_type = match memtype::map().lookup(address, 1) {
                Lookup::Found(info) if info.base == address => info.mem_type,
                _ => MemType::Unknown,
            };
            let _ = memtype::map().remove(address, size);
            (size, mem_type)
        }
        // The allocation recorded at `address`, taken out in one step;
        // else the driver's range.
        None => match take(address) {
            Taken {
                entry: Some(info),
                mark,
                ..
            } if keeps(id, &info, mark) => {
                return Kept::of(&info);
            }
            taken => (taken.size, taken.entry.map_or(MemType::Unknown, |info| info.mem_type)),
        },
    };
    if wants(bits::MEM_TYPE_FREE)
        && let Some(thread) = &thread
    {
        deliver_free(thread, id, address, size, mem_type);
    }
    Kept::NONE
}

/// Delivers `MEM_TYPE_FREE` for `[address, address + size)`.
fn deliver_free(thread: &ThisThread, id: Id, address: usize, size: usize, mem_type: MemType) {
    deliver(
        thread,
        id,
        Event::MemTypeFree(MemTypeEvent {
            address,
            size,
            mem_type: mem_type as u32,
        }),
    );
}

/// A context is about to be destroyed, and with it every allocation made
/// in it: `MEM_TYPE_FREE` for each the map holds that the driver says is
/// `context`'s, and its removal from the map (one driver query per typed
/// entry: tens of nanoseconds each, beside a teardown that takes
/// milliseconds). Memory of a stream-ordered pool belongs to no context
/// and outlives it (on the H200 too): it stays.
#[cold]
#[inline(never)]
pub(super) fn ending_context(id: Id, context: usize) {
    end_entries(id, |info| typed(info) && driver::context_of(info.base) == Some(context));
}

/// Whether an entry is of a type the driver allocates (not Unknown).
fn typed(info: &MemInfo) -> bool {
    matches!(info.mem_type, MemType::Cuda | MemType::CudaManaged | MemType::CudaHost)
}

/// Ends (see [`ended`]) every entry of the map that `which` selects, and
/// forgets any module global kept at it (its module's unload must not
/// end what comes to lie there next). The map is walked in chunks copied
/// out under its lock: no allocation, and no driver call or handler with
/// the lock held.
fn end_entries(id: Id, mut which: impl FnMut(&MemInfo) -> bool) {
    // Eight entries (192 bytes) on the caller's stack: 32 took 576 more,
    // which a teardown on a small stack paid (`tests/c/stack_use.c`);
    // each further chunk costs one search of the map.
    const CHUNK: usize = 8;
    let map = memtype::map();
    let mut chunk = [MemInfo {
        mem_type: MemType::Unknown,
        device: -1,
        base: 0,
        len: 0,
    }; CHUNK];
    let mut from = 0;
    loop {
        let got = map.entries_from(from, &mut chunk);
        for info in &chunk[..got] {
            from = info.base.saturating_add(1);
            if which(info) {
                forget_global_at(info.base);
                ended(id, *info);
            }
        }
        if got < CHUNK {
            return;
        }
    }
}

/// Ends an entry of the map that a call ends with no free call of its
/// own: takes the entry that starts at `info.base` out of the map and,
/// if one was still there, delivers `MEM_TYPE_FREE` for what it held. A
/// free hook on another thread that took it first reported it: one event
/// either way.
fn ended(id: Id, info: MemInfo) {
    // An IPC mapping ends with its context, however many opens it had.
    super::ipc::forget(info.base);
    let Some(info) = memtype::map().take(info.base) else {
        return;
    };
    if wants(bits::MEM_TYPE_FREE)
        && let Some(thread) = dispatch::this_thread()
    {
        deliver_free(&thread, id, info.base, info.len, info.mem_type);
    }
}

/// A module or library global reported, and the handle whose unload
/// frees it.
#[derive(Clone, Copy)]
struct Global {
    handle: usize,
    base: usize,
    len: usize,
}

/// Globals kept: a program asks for a few (each `__device__` variable it
/// takes the address of, once per module).
const GLOBALS: usize = 1024;

/// The globals reported and not yet unloaded. Taken by the hooks of the
/// global lookups and of the unloads (never by a handler's registration,
/// and never held while a handler or the driver runs); its holder is in a
/// fork section, so that a child never finds it held.
static GLOBALS_SEEN: crate::fork::Mutex<heapless::Vec<Global, GLOBALS>> = crate::fork::Mutex::new(heapless::Vec::new());

/// Globals reported while [`GLOBALS_SEEN`] was full: their unloads are
/// found by asking the driver after each unload instead (see
/// [`unloading`]).
static GLOBALS_UNKEPT: AtomicU64 = AtomicU64::new(0);

/// Keeps `[base, base + len)` as a global of `handle` (once per pair).
pub(super) fn global_seen(handle: usize, base: usize, len: usize) {
    if base == 0 || len == 0 {
        return;
    }
    let mut seen = GLOBALS_SEEN.lock();
    if seen.iter().any(|g| g.handle == handle && g.base == base) {
        return;
    }
    if seen.push(Global { handle, base, len }).is_err() {
        GLOBALS_UNKEPT.fetch_add(1, Ordering::Relaxed);
    }
}

/// Forgets the kept globals at `base`.
fn forget_global_at(base: usize) {
    GLOBALS_SEEN.lock().retain(|g| g.base != base);
}

/// The unload of the module or library `handle` (`call`, the original):
/// `MEM_TYPE_FREE`, before the call, for each global reported from it
/// that the map still holds as it was recorded. Where globals went
/// unkept (more than [`GLOBALS`]), the map's device entries the driver no
/// longer knows after the call are ended then: late, but not lost.
pub(super) fn unloading(id: Id, handle: usize, call: impl FnOnce() -> Status) -> Status {
    // Eight globals (192 bytes) on the caller's stack, as `end_entries`.
    const CHUNK: usize = 8;
    loop {
        // A chunk of this handle's globals, out of the table (the lock is
        // not held while handlers run).
        let mut chunk: heapless::Vec<Global, CHUNK> = heapless::Vec::new();
        {
            let mut seen = GLOBALS_SEEN.lock();
            let mut i = 0;
            while i < seen.len() && !chunk.is_full() {
                if seen[i].handle == handle {
                    let _ = chunk.push(seen.swap_remove(i));
                } else {
                    i += 1;
                }
            }
        }
        if chunk.is_empty() {
            break;
        }
        for g in chunk {
            if let Lookup::Found(info) = memtype::map().lookup(g.base, 1)
                && (info.base, info.len) == (g.base, g.len)
            {
                ended(id, info);
            }
        }
    }
    let status = call();
    if status == SUCCESS && GLOBALS_UNKEPT.load(Ordering::Relaxed) != 0 {
        end_unknown_to_the_driver(id);
    }
    status
}

/// Ends every device, managed or pinned entry of the map that the driver
/// says it no longer knows (it answers "host memory" for the address),
/// after a call that freed memory with no free call and left no way to
/// tell which beforehand: an unload whose globals went unkept, the last
/// release of a primary context. (Where the driver refuses to answer, the
/// entry stays.)
#[cold]
#[inline(never)]
fn end_unknown_to_the_driver(id: Id) {
    end_entries(id, |info| {
        typed(info) && driver::classify(info.base).is_some_and(|d| d.mem_type == MemType::Host)
    });
}

/// The release of a reference to `device`'s primary context (`call`,
/// the original). The last one destroys the context, and with it every
/// allocation made in it, with no free call; the driver tells no one the
/// count, so which release is the last shows only after it: where the
/// context is no longer active after a successful release, the map's
/// entries the driver no longer knows are ended then (`MEM_TYPE_FREE`
/// after the memory went, where a destruction by `cuCtxDestroy` or
/// `cuDevicePrimaryCtxReset` reports before: late, but not lost). The
/// memory of a stream-ordered pool outlives the context (on the H200
/// too) and the driver still knows it: it stays. (Another thread that
/// retains the context again between the release and the check hides
/// the destruction from it; each range of the old context then stays in
/// the map until a new allocation replaces it or its address is freed.)
pub(super) fn releasing_primary(id: Id, device: i32, call: impl FnOnce() -> Status) -> Status {
    let status = call();
    if status == SUCCESS && driver::primary_active(device) == Some(false) {
        end_unknown_to_the_driver(id);
    }
    status
}

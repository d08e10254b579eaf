//! CUDA memory-type hooks: the driver's and the runtime's allocation and
//! free functions, hooked by the modes of `MEMHOOK_CUDA_HOOK_MODE`, each
//! reporting `MEM_TYPE_ALLOC` after a successful allocation and
//! `MEM_TYPE_FREE` before a free, and feeding the [`crate::memtype`] map.
//! The destruction of a context (`cuCtxDestroy`, `cuDevicePrimaryCtxReset`)
//! frees its allocations with no free call: its hook reports
//! `MEM_TYPE_FREE` for each before the call. So does the release of a
//! primary context's last reference (`cuDevicePrimaryCtxRelease`), after
//! the call: the driver tells no one the count, so that release shows
//! itself only by the context's being inactive after it.
//!
//! - **bistro** patches the entries of libcuda (and of a shared libcudart)
//!   the moment the library is loaded, at install or later (memhook
//!   follows `dlopen` and `dlclose`).
//! - **reloc** rewrites every object's GOT slots that name a hooked
//!   function.
//! - **procaddr** answers `dlsym` of a hooked driver function, and every
//!   `cuGetProcAddress` lookup, with the hook (see the `procaddr` module).
//!
//! A function hooked by several modes reports once: every mode's hook is
//! the same function, and its original is the bistro trampoline when the
//! entry is patched (else the library's entry). A hooked call made inside
//! another hooked call's original (`cudaMalloc` calling `cuMemAlloc_v2`)
//! reports nothing: the outer one reports.
//!
//! Which modes took, per function and why the others did not, is in
//! [`crate::status`].

mod driver;
mod events;
mod graph;
mod hooks;
mod ipc;
mod procaddr;

use core::ffi::CStr;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use memhook_core::config::{HookMode, ModeSet};
use memhook_core::event::{Event, HandlerId, RegisterError, bits};

pub use driver::{PciBusId, pci_bus_id};
pub(crate) use driver::{classify, load as load_driver};
pub(crate) use graph::unsettled as graph_unsettled;
pub(crate) use hooks::after_fork_in_child;
use hooks::{COUNT, ENTRY, Id, Kind, Lib, ORIG, RELOC};

use crate::dispatch::HandlerFn;
use crate::install::FunctionStatus;
use crate::reloc;

/// Status entries the CUDA hooks can hold (every function in three modes).
pub(crate) const STATUS: usize = 3 * COUNT;

/// `p` as a function pointer of type `F` (`None` for 0).
///
/// # Safety
///
/// A nonzero `p` is the address of a function whose signature is `F`.
#[inline(always)]
unsafe fn function_at<F: Copy>(p: usize) -> Option<F> {
    const { assert!(size_of::<F>() == size_of::<usize>()) };
    // SAFETY: the caller's contract; F is a pointer-sized function pointer.
    (p != 0).then(|| unsafe { core::mem::transmute_copy::<usize, F>(&p) })
}

struct State {
    modes: ModeSet,
    /// The hooked driver and runtime objects, as loaded.
    attached: [Option<reloc::ObjectId>; 2],
    #[cfg(feature = "bistro")]
    bistro: heapless::Vec<(Id, crate::bistro::Hook), COUNT>,
    status: heapless::Vec<FunctionStatus, STATUS>,
    /// Per library: its functions' status already says it is not loaded
    /// (written once, not at every load or unload of another library).
    absent_noted: [bool; 2],
}

static STATE: crate::fork::Mutex<State> = crate::fork::Mutex::new(State {
    modes: ModeSet::of(&[]),
    attached: [None, None],
    #[cfg(feature = "bistro")]
    bistro: heapless::Vec::new(),
    status: heapless::Vec::new(),
    absent_noted: [false, false],
});

/// Set when a load or unload was seen while the state was held.
static PENDING: AtomicBool = AtomicBool::new(false);

/// Per function: its bistro patch is one an uninstall kept (another
/// hooker had patched over it) and this install took back. Such a
/// function is hooked by that patch alone, in every mode: the calls to
/// its entry reach the other hooker, then our hook, which calls the
/// patch's trampoline. No GOT slot is rewritten to the hook, and no
/// `dlsym` or `cuGetProcAddress` is answered with it: with the entry as
/// its original, each call would run round the two hooks until the
/// stack overflowed.
static KEPT: [AtomicBool; COUNT] = [const { AtomicBool::new(false) }; COUNT];

/// Whether `id`'s bistro patch is a kept one (see [`KEPT`]).
pub(super) fn kept(id: Id) -> bool {
    KEPT[id as usize].load(Ordering::Acquire)
}

impl Lib {
    const fn index(self) -> usize {
        match self {
            Lib::Driver => 0,
            Lib::Runtime => 1,
        }
    }

    /// The library's name as status shows it.
    pub(crate) const fn soname(self) -> &'static str {
        match self {
            Lib::Driver => "libcuda.so.1",
            Lib::Runtime => "libcudart.so",
        }
    }

    /// Which hooked library a loaded object's path names.
    fn of_path(path: &[u8]) -> Option<Lib> {
        let base = path.rsplit(|&b| b == b'/').next()?;
        if base == b"libcuda.so" || base.starts_with(b"libcuda.so.") {
            Some(Lib::Driver)
        } else if base.starts_with(b"libcudart.so") {
            Some(Lib::Runtime)
        } else {
            None
        }
    }
}

fn note(state: &mut State, id: Id, mode: HookMode, why: Option<&dyn core::fmt::Display>) {
    note_as(state, id, mode, why, false);
}

fn note_as(state: &mut State, id: Id, mode: HookMode, why: Option<&dyn core::fmt::Display>, pending: bool) {
    let function = id.name().to_str().unwrap_or("?");
    let entry = FunctionStatus::new(function, id.lib().soname(), mode, why, pending);
    match state
        .status
        .iter_mut()
        .find(|s| s.function == function && s.mode == mode)
    {
        Some(s) => *s = entry,
        None => {
            let _ = state.status.push(entry);
        }
    }
}

// Every CUDA function, every host function in reloc mode (with its
// aliases and the functions hooked in reloc mode alone) and the loader's
// four fit reloc's table at once: with the host hooks in reloc mode, the
// CUDA install once asked for more than it held, and failed whole.
const _: () = assert!(
    COUNT + crate::host::RELOC_SYMBOLS + reloc::DL_ENTRIES <= reloc::MAX_SYMBOLS,
    "reloc::MAX_SYMBOLS must hold every CUDA and host symbol"
);

/// Installs the CUDA hooks of `modes` (the caller has removed any earlier
/// install). Libraries not loaded yet are hooked when they load.
pub(crate) fn install(modes: ModeSet) {
    if modes.is_empty() {
        return;
    }
    let mut state = STATE.lock();
    state.modes = modes;
    #[cfg(feature = "bistro")]
    take_back_kept(&mut state);
    let procaddr = modes.contains(HookMode::Procaddr);
    let mut entries: heapless::Vec<reloc::Entry, COUNT> = heapless::Vec::new();
    let mut ids: heapless::Vec<Id, COUNT> = heapless::Vec::new();
    for id in Id::ALL {
        let slots = !kept(id)
            && match id.kind() {
                Kind::ProcAddr => procaddr,
                Kind::Alloc | Kind::Free | Kind::Teardown => modes.contains(HookMode::Reloc),
            };
        let answer = (procaddr && id.lib() == Lib::Driver && !kept(id)).then_some(&ENTRY[id as usize]);
        if slots || answer.is_some() {
            let _ = entries.push(reloc::Entry {
                name: id.name(),
                hook: id.hook(),
                original: &RELOC[id as usize],
                slots,
                answer,
            });
            let _ = ids.push(id);
        }
    }
    reloc::on_objects_changed(objects_changed);
    // Also interposes dlopen/dlclose (late loads) for bistro alone.
    // SAFETY: each hook has its symbol's signature and calls the original
    // through ORIG, else the RELOC record reloc fills before any slot.
    let result = unsafe { reloc::install_with(&entries) };
    let err = result.err();
    let why = err.as_ref().map(|e| e as &dyn core::fmt::Display);
    for (e, &id) in entries.iter().zip(&ids) {
        if e.slots && id.kind() != Kind::ProcAddr {
            note(&mut state, id, HookMode::Reloc, why);
        }
        if e.answer.is_some() {
            note(&mut state, id, HookMode::Procaddr, why);
        }
    }
    procaddr::ANSWERING.store(procaddr, Ordering::Release);
    sync(&mut state);
    drop(state);
    drain();
}

/// Undoes the bistro patches and stops answering lookups (reloc's slots
/// are restored by `reloc::uninstall`). Hooks handed out earlier keep
/// working: they call the library's entry.
pub(crate) fn uninstall() {
    let mut state = STATE.lock();
    procaddr::ANSWERING.store(false, Ordering::Release);
    #[cfg(feature = "bistro")]
    {
        // One batch. A hook another hooker patched over stays, working,
        // listed with its id; the others' calls go to the entries again.
        // (Patches kept by an uninstall before, with no install since,
        // are left as they are: their library may have gone.)
        let mut ids = heapless::Vec::<Id, COUNT>::new();
        let mut hooks = heapless::Vec::<crate::bistro::Hook, COUNT>::new();
        let mut before = heapless::Vec::<(Id, crate::bistro::Hook), COUNT>::new();
        while let Some((id, h)) = state.bistro.pop() {
            if state.attached[id.lib().index()].is_none() {
                let _ = before.push((id, h));
                continue;
            }
            let _ = ids.push(id);
            let _ = hooks.push(h);
        }
        let _ = crate::bistro::Hook::unpatch_batch(&mut hooks);
        for id in ids {
            match hooks
                .iter()
                .position(|h| h.target() == ENTRY[id as usize].load(Ordering::Acquire))
            {
                Some(i) => {
                    let _ = state.bistro.push((id, hooks.swap_remove(i)));
                }
                None => ORIG[id as usize].store(ENTRY[id as usize].load(Ordering::Acquire), Ordering::Release),
            }
        }
        for kept in before {
            let _ = state.bistro.push(kept);
        }
        for kept in &KEPT {
            kept.store(false, Ordering::Release);
        }
    }
    state.attached = [None, None];
    state.modes = ModeSet::of(&[]);
    state.status.clear();
    state.absent_noted = [false, false];
    // The patches kept still report: status lists them.
    #[cfg(feature = "bistro")]
    for i in 0..state.bistro.len() {
        let id = state.bistro[i].0;
        note(&mut state, id, HookMode::Bistro, None);
    }
}

/// Takes back, at an install, the bistro patches an uninstall kept (see
/// [`KEPT`]) that are still in their library as it is loaded now, and
/// forgets the others: their library was unloaded, or loaded afresh
/// (its entry holds the bytes the patch replaced).
#[cfg(feature = "bistro")]
fn take_back_kept(state: &mut State) {
    if state.bistro.is_empty() {
        return;
    }
    let found = loaded_libs();
    for lib in [Lib::Driver, Lib::Runtime] {
        let f = found[lib.index()].as_ref();
        let held = f.and_then(Found::hold);
        state.bistro.retain(|(id, h)| {
            if id.lib() != lib {
                return true;
            }
            // SAFETY: the entry lies in a loaded segment of the library,
            // which `held` keeps loaded.
            let keep = held.is_some() && f.is_some_and(|f| f.holds_patch(h.target())) && !unsafe { h.undone() };
            KEPT[*id as usize].store(keep, Ordering::Release);
            keep
        });
    }
}

/// A reference to a hooked library ([`Found::hold`]), given back when
/// dropped.
#[cfg(feature = "bistro")]
struct Held(*mut core::ffi::c_void);

#[cfg(feature = "bistro")]
impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: the reference `Found::hold` took.
        unsafe { libc::dlclose(self.0) };
    }
}

#[cfg(feature = "bistro")]
impl Found {
    /// A reference to the library, which keeps it loaded while its
    /// entries are read: `None` where it is loaded no more.
    fn hold(&self) -> Option<Held> {
        // SAFETY: a NUL-terminated copy of the object's path; RTLD_NOLOAD
        // only finds an object already loaded.
        let handle = unsafe { libc::dlopen(self.name.as_ptr().cast(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        (!handle.is_null()).then_some(Held(handle))
    }

    /// Whether a patch at `target` (of any form) lies inside the library's
    /// loaded segments: not one made in a library unloaded since.
    fn holds_patch(&self, target: usize) -> bool {
        let patch = memhook_core::patch::MAX_PATCH;
        self.segments.iter().any(|&(s, e)| s <= target && target + patch <= e)
    }
}

/// Per function and mode: installed, or why not, as each stands now
/// ([`as_now`]).
pub(crate) fn status() -> heapless::Vec<FunctionStatus, STATUS> {
    let state = STATE.lock();
    let mut all = state.status.clone();
    // The libraries loaded now, looked for once, where an entry asks.
    let mut found = None;
    for s in &mut all {
        as_now(&state, s, &mut found);
    }
    all
}

/// Entry `index` of [`status`] (`None` past the end), and how many.
pub(crate) fn status_at(index: usize) -> (Option<FunctionStatus>, usize) {
    let state = STATE.lock();
    let mut s = state.status.get(index).cloned();
    if let Some(s) = &mut s {
        as_now(&state, s, &mut None);
    }
    (s, state.status.len())
}

/// `s` as its function stands now, as the host functions' status has it
/// (`crate::install::status`): an installed bistro patch whose jump's
/// first instruction something has replaced since (a uprobe or a
/// debugger's breakpoint put on the instruction the patch starts at, or
/// what a uprobe's removal put back there) is not installed, and the
/// reason says what is there; so is one whose jump is gone, the
/// function's own bytes back (`crate::install::undone`). The entry is read only inside its library's
/// loaded segments, with a reference to the library held: one unloaded
/// since (its sync not run yet) is not read. `found`: the libraries
/// loaded now, looked for here where not yet.
fn as_now(state: &State, s: &mut FunctionStatus, found: &mut Option<[Option<Found>; 2]>) {
    #[cfg(feature = "bistro")]
    if s.installed && s.mode == HookMode::Bistro {
        let Some((id, h)) = state
            .bistro
            .iter()
            .find(|(id, _)| id.name().to_str().is_ok_and(|n| n == s.function))
        else {
            return;
        };
        let Some(f) = found.get_or_insert_with(loaded_libs)[id.lib().index()].as_ref() else {
            return;
        };
        let Some(_held) = f.hold() else {
            return;
        };
        if !f.holds_patch(h.target()) {
            return;
        }
        // SAFETY: the entry lies in a loaded segment of the library, which
        // `_held` keeps loaded.
        if let Some(now) = unsafe { h.head_replaced() } {
            crate::install::head_replaced(s, h.replaced().0, &now);
        // SAFETY: as above.
        } else if unsafe { h.undone() } {
            crate::install::undone(s, h.replaced().0);
        }
    }
    #[cfg(not(feature = "bistro"))]
    let _ = (state, s, found);
}

/// Called by reloc after every `dlopen` and `dlclose`: hooks libraries
/// that appeared, forgets those that went. Never waits for the state.
fn objects_changed() {
    PENDING.store(true, Ordering::SeqCst);
    drain();
}

/// Syncs while a sync was asked for and the state is free.
fn drain() {
    while PENDING.load(Ordering::SeqCst) {
        let Some(mut state) = STATE.try_lock() else {
            return; // the holder drains after it lets go
        };
        PENDING.store(false, Ordering::SeqCst);
        sync(&mut state);
    }
}

/// The hooked libraries loaded now.
fn loaded_libs() -> [Option<Found>; 2] {
    let mut found: [Option<Found>; 2] = [None, None];
    reloc::for_each_object(|o| {
        if let Some(lib) = Lib::of_path(o.name)
            && found[lib.index()].is_none()
            && o.name.len() < PATH
        {
            let mut name = [0u8; PATH];
            name[..o.name.len()].copy_from_slice(o.name);
            found[lib.index()] = Some(Found {
                id: o.id,
                name,
                segments: o.segments.clone(),
            });
        }
    });
    found
}

/// Attaches to the hooked libraries loaded now, detaches from those gone.
fn sync(state: &mut State) {
    if state.modes.is_empty() {
        return;
    }
    let found = loaded_libs();
    let mut attaching = [None, None];
    for lib in [Lib::Driver, Lib::Runtime] {
        let now = found[lib.index()].as_ref().map(|f| f.id);
        let before = state.attached[lib.index()];
        if before.is_some() && before != now {
            detach(state, lib);
        }
        match &found[lib.index()] {
            Some(f) if before != now => attaching[lib.index()] = Some((lib, f)),
            #[cfg(feature = "bistro")]
            None if before.is_none() && !state.absent_noted[lib.index()] && state.modes.contains(HookMode::Bistro) => {
                state.absent_noted[lib.index()] = true;
                for f in Id::ALL
                    .into_iter()
                    .filter(|f| f.lib() == lib && f.kind() != Kind::ProcAddr)
                {
                    note_as(
                        state,
                        f,
                        HookMode::Bistro,
                        Some(&format_args!("{} not loaded yet: patched when it loads", lib.soname())),
                        true,
                    );
                }
            }
            _ => {}
        }
    }
    attach(state, attaching.iter().flatten().copied());
}

/// Longest library path memhook attaches to.
const PATH: usize = 512;

/// A hooked library found loaded: identity, NUL-terminated path, segments.
struct Found {
    id: reloc::ObjectId,
    name: [u8; PATH],
    segments: heapless::Vec<(usize, usize), { reloc::MAX_SEGMENTS }>,
}

/// Resolves the hooked functions of each library just found (the driver,
/// the runtime, or both), patches them (bistro) in one batch (one hold of
/// the other threads and three serialisations for both libraries) and
/// makes the hooks' originals the definitions.
fn attach<'a>(state: &mut State, libs: impl Iterator<Item = (Lib, &'a Found)>) {
    // Functions to patch, and aliases of them, resolved after the batch.
    #[cfg(feature = "bistro")]
    let mut requests = heapless::Vec::<crate::bistro::Request<'static>, COUNT>::new();
    #[cfg(feature = "bistro")]
    let mut patching = heapless::Vec::<Id, COUNT>::new();
    let mut aliases = heapless::Vec::<(Id, Id), COUNT>::new();
    // Each library resolved, with the reference that keeps it loaded
    // until its entries are patched.
    let mut opened = heapless::Vec::<(Lib, *mut libc::c_void, reloc::ObjectId), 2>::new();
    for (lib, found) in libs {
        // The map's one-time layout (2 MiB of writes) now, while a CUDA
        // library loads, not in the first hooked allocation; a process
        // that never loads one never pays it.
        crate::memtype::map().prepare();
        // SAFETY: a NUL-terminated copy of the object's path; RTLD_NOLOAD
        // only finds an object already loaded.
        let handle = unsafe { libc::dlopen(found.name.as_ptr().cast(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            continue;
        }
        // Cannot fail: at most one for each library.
        let _ = opened.push((lib, handle, found.id));
        let segments = &found.segments;
        let inside = |p: usize| segments.iter().any(|&(s, e)| (s..e).contains(&p));
        // SAFETY: a live handle and a NUL-terminated name.
        let answer = |symbol: &CStr| unsafe { libc::dlsym(handle, symbol.as_ptr()) } as usize;
        let lookup = |symbol: &CStr| {
            let p = answer(symbol);
            if inside(p) { p } else { 0 }
        };
        if lib == Lib::Driver {
            driver::resolve(lookup);
        }
        for id in Id::ALL.into_iter().filter(|id| id.lib() == lib) {
            let found = answer(id.name());
            let entry = if inside(found) { found } else { 0 };
            ENTRY[id as usize].store(entry, Ordering::Release);
            if entry == 0 {
                // Found elsewhere: another hooker interposes dlsym, such as
                // a second copy of memhook in reloc or procaddr mode.
                let (why, other) = if found != 0 {
                    ("dlsym answers a definition outside", " (another hooker's)")
                } else {
                    ("not exported by", "")
                };
                if state.modes.contains(HookMode::Bistro) && id.kind() != Kind::ProcAddr {
                    note(
                        state,
                        id,
                        HookMode::Bistro,
                        Some(&format_args!("{why} {}{other}", lib.soname())),
                    );
                }
                if state.modes.contains(HookMode::Procaddr) && lib == Lib::Driver {
                    note(
                        state,
                        id,
                        HookMode::Procaddr,
                        Some(&format_args!("{why} {}{other}", lib.soname())),
                    );
                }
                continue;
            }
            #[cfg(feature = "bistro")]
            if kept(id) {
                // Taken back (see `take_back_kept`): its original stays the
                // patch's trampoline.
                note(state, id, HookMode::Bistro, None);
                continue;
            }
            if let Some(first) = Id::ALL
                .into_iter()
                .take_while(|&o| o != id)
                .find(|&o| o.lib() == lib && ENTRY[o as usize].load(Ordering::Acquire) == entry)
            {
                // One definition under two names (an alias): patched once,
                // as `first`, whose hook reports its calls; this one's hook,
                // which reloc and procaddr may hand out, calls what
                // `first`'s calls, so that no call reports twice.
                // (`first`'s original is known once the batch below is made.)
                let _ = aliases.push((id, first));
                if state.modes.contains(HookMode::Bistro) && id.kind() != Kind::ProcAddr {
                    note(state, id, HookMode::Bistro, None);
                }
                continue;
            }
            #[cfg(feature = "bistro")]
            if state.modes.contains(HookMode::Bistro) && id.kind() != Kind::ProcAddr {
                let _ = requests.push(crate::bistro::Request {
                    target: entry,
                    hook: id.hook(),
                    original: &ORIG[id as usize],
                });
                let _ = patching.push(id);
                continue;
            }
            ORIG[id as usize].store(entry, Ordering::Release);
        }
    }
    // The bistro patches of both libraries, in one batch: three
    // serialisations of every core, not three for each library.
    #[cfg(feature = "bistro")]
    {
        // SAFETY: each entry is the function's its id names, and its hook
        // calls the original through ORIG (set by patch_batch before the
        // patch is visible).
        let done = unsafe { crate::bistro::Hook::patch_batch::<COUNT>(&requests) };
        for (result, id) in done.into_iter().zip(patching) {
            match result {
                Ok(h) => {
                    let _ = state.bistro.push((id, h));
                    note(state, id, HookMode::Bistro, None);
                }
                Err(e) => {
                    ORIG[id as usize].store(ENTRY[id as usize].load(Ordering::Acquire), Ordering::Release);
                    note(state, id, HookMode::Bistro, Some(&e));
                }
            }
        }
    }
    for (id, first) in aliases {
        ORIG[id as usize].store(ORIG[first as usize].load(Ordering::Acquire), Ordering::Release);
    }
    for (lib, handle, id) in opened {
        // SAFETY: the handle dlopen returned above.
        unsafe { libc::dlclose(handle) };
        state.attached[lib.index()] = Some(id);
    }
}

/// `lib` was unloaded: its code is gone, so nothing is unpatched; the hooks
/// answer "unavailable" until it is loaded again.
fn detach(state: &mut State, lib: Lib) {
    #[cfg(feature = "bistro")]
    state.bistro.retain(|(id, _)| id.lib() != lib);
    for id in Id::ALL.into_iter().filter(|id| id.lib() == lib) {
        KEPT[id as usize].store(false, Ordering::Release);
        ORIG[id as usize].store(0, Ordering::Release);
        RELOC[id as usize].store(0, Ordering::Release);
        ENTRY[id as usize].store(0, Ordering::Release);
        if state.modes.contains(HookMode::Bistro) && id.kind() != Kind::ProcAddr {
            note_as(
                state,
                id,
                HookMode::Bistro,
                Some(&format_args!(
                    "{} was unloaded: patched again when it loads",
                    lib.soname()
                )),
                true,
            );
        }
    }
    if lib == Lib::Driver {
        driver::forget();
        ipc::forget_all();
        graph::forget_all();
    }
    state.attached[lib.index()] = None;
    state.absent_noted[lib.index()] = true;
}

/// `MEM_TYPE_*` events each hooked CUDA function delivered while
/// [`count_events_by_function`]'s handler was registered.
static BY_FUNCTION: [AtomicU64; COUNT] = [const { AtomicU64::new(0) }; COUNT];

/// The counting handler: one more for the function whose event this is.
fn count_by_function(_: &mut Event) {
    if let Some(id) = events::reporting() {
        BY_FUNCTION[id as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Starts counting, by hooked CUDA function, the `MEM_TYPE_ALLOC` and
/// `MEM_TYPE_FREE` events the hooks deliver ([`events_by_function`] reads
/// the counts): registers a handler that counts them, at priority 0.
/// Unset it with the id returned ([`crate::unset_handler`]) to stop; the
/// counts stay. Each call registers one more counter (an event is then
/// counted once for each): call it once. The hooks keep no count of their
/// own: a counter every delivery bumped was an atomic read-modify-write
/// on a line all threads share, paid by every user of the events
/// (`memhook run` counts through its own handler).
///
/// # Errors
///
/// As [`crate::set_handler`]: a full table, or a call from a handler.
pub fn count_events_by_function() -> Result<HandlerId, RegisterError> {
    crate::set_handler(
        bits::MEM_TYPE_ALLOC | bits::MEM_TYPE_FREE,
        0,
        HandlerFn::Rust(&count_by_function),
    )
}

/// The `MEM_TYPE_*` events each hooked CUDA function delivered while
/// [`count_events_by_function`]'s handler was registered, by name
/// (functions that delivered none are left out).
pub fn events_by_function() -> heapless::Vec<(&'static str, u64), COUNT> {
    Id::ALL
        .into_iter()
        .filter_map(|id| {
            let n = BY_FUNCTION[id as usize].load(Ordering::Relaxed);
            (n != 0).then(|| (id.name().to_str().unwrap_or("?"), n))
        })
        .collect()
}

/// `cuGetProcAddress` and `dlsym` lookups procaddr answered with a hook.
pub fn procaddr_answers() -> u64 {
    procaddr::ANSWERED.load(Ordering::Relaxed)
}

/// Whether libcuda (`Lib::Driver`) or libcudart is hooked now.
pub fn attached() -> (bool, bool) {
    let s = STATE.lock();
    (s.attached[0].is_some(), s.attached[1].is_some())
}

/// The hooked CUDA function whose `MEM_TYPE_*` event the calling thread is
/// delivering (for a handler that reports by function); `None` outside
/// such a delivery (an event from `report_event`, or a host event).
pub fn reporting_function() -> Option<&'static str> {
    events::reporting().and_then(|id| id.name().to_str().ok())
}

/// The address that runs `function`'s original, past memhook's hook: with
/// bistro, its trampoline (the relocated first instructions, then a jump
/// into the function); otherwise the definition reloc found. `None` for a
/// function memhook does not hook, or whose library it has not seen.
///
/// For code that must call the driver unreported (an allocator's own
/// bookkeeping, as UCM's `ucm_orig_*` calls), and for measuring memhook's
/// cost against the same driver in the same state. Call it with the
/// function's own signature. The address stays valid while the library
/// stays loaded (a trampoline is never unmapped, uninstall included); ask
/// again after the library was unloaded and loaded anew.
pub fn original(function: &str) -> Option<usize> {
    let id = Id::ALL
        .into_iter()
        .find(|id| id.name().to_bytes() == function.as_bytes())?;
    match ORIG[id as usize].load(Ordering::Acquire) {
        0 => Some(RELOC[id as usize].load(Ordering::Acquire)).filter(|&p| p != 0),
        p => Some(p),
    }
}

/// Every hooked CUDA function: symbol and the library that defines it
/// (`cuGetProcAddress{,_v2}` are hooked by procaddr only).
pub fn functions() -> impl Iterator<Item = (&'static CStr, &'static str)> {
    Id::ALL.into_iter().map(|id| (id.name(), id.lib().soname()))
}

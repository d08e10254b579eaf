//! Installing the hooks a [`Config`] asks for, and what took.

use core::fmt;

use memhook_core::config::{ConfigError, Family, HookConfig, HookMode, ModeSet};

use crate::AVAILABLE_MODES;
use crate::host::functions;

/// What to install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Hook modes per family.
    pub hooks: HookConfig,
}

impl Config {
    /// The defaults (host memory: bistro; CUDA: bistro, reloc, procaddr),
    /// limited to what this build has.
    pub const fn defaults() -> Config {
        Config {
            hooks: HookConfig::defaults(AVAILABLE_MODES),
        }
    }

    /// From `MEMHOOK_MMAP_HOOK_MODE` and `MEMHOOK_CUDA_HOOK_MODE` (unset
    /// means the default). Allocates nothing (an allocator may call it
    /// from inside its first `malloc`, as `memhook_install(NULL)` does):
    /// the values are read in place with `getenv`, not copied as
    /// `std::env::var_os` copies them, and so, like any `getenv`, not
    /// under std's lock against `std::env::set_var` (which is `unsafe` for
    /// that reason). A value that is not UTF-8 is read by std, lossily, to
    /// name the bad token.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the variable and the bad token.
    pub fn from_env() -> Result<Config, ConfigError> {
        let mut config = Config::defaults();
        for family in [Family::Mmap, Family::Cuda] {
            let set = crate::with_env(family.env_var_c(), |value| match value {
                None => Ok(None),
                Some(Ok(value)) => ModeSet::parse(value, family, AVAILABLE_MODES).map(Some),
                Some(Err(())) => {
                    let value = std::env::var_os(family.env_var()).unwrap_or_default();
                    ModeSet::parse(&value.to_string_lossy(), family, AVAILABLE_MODES).map(Some)
                }
            })?;
            let Some(set) = set else { continue };
            match family {
                Family::Mmap => config.hooks.mmap = set,
                Family::Cuda => config.hooks.cuda = set,
            }
        }
        Ok(config)
    }

    /// From a config string such as `"cuda=bistro,reloc;mmap=bistro"`.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the bad part or token.
    pub fn parse(value: &str) -> Result<Config, ConfigError> {
        Ok(Config {
            hooks: HookConfig::parse(value, AVAILABLE_MODES)?,
        })
    }
}

/// Longest reason kept per function.
pub const REASON: usize = 200;

/// How one hooked function stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionStatus {
    /// The function.
    pub function: &'static str,
    /// The library that defines it.
    pub library: &'static str,
    /// The mode tried.
    pub mode: HookMode,
    /// Whether it took.
    pub installed: bool,
    /// Not installed only because the function's library is not loaded
    /// yet: the mode installs the moment it loads.
    pub pending: bool,
    /// Why not (empty when it took).
    pub reason: heapless::String<REASON>,
}

impl FunctionStatus {
    /// The status of `function` (in `library`) in `mode`: installed when
    /// there is no `why`, else not, with `why` as the reason (cut to
    /// [`REASON`] bytes).
    pub(crate) fn new(
        function: &'static str,
        library: &'static str,
        mode: HookMode,
        why: Option<&dyn fmt::Display>,
        pending: bool,
    ) -> Self {
        let mut reason = heapless::String::new();
        if let Some(why) = why {
            let _ = fmt::Write::write_fmt(&mut reason, format_args!("{why}"));
        }
        FunctionStatus {
            function,
            library,
            mode,
            installed: why.is_none(),
            pending,
            reason,
        }
    }
}

/// Status entries of the host hooks (each function in two modes, and
/// libpthread's copies of some in bistro mode).
const HOST_STATUS: usize = 2 * crate::host::FUNCTIONS + COPIES;

/// Most second copies of host functions in glibc's libpthread.so.0
/// (before 2.34: `open`, whose other name is `open64`).
const COPIES: usize = 4;

/// The library that holds them.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
const PTHREAD: &str = "libpthread.so.0";

/// Most entries [`status`] returns: every host and CUDA function in every
/// mode that applies to it.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub const MAX_STATUS: usize = HOST_STATUS + crate::cuda::STATUS;
/// Most entries [`status`] returns.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub const MAX_STATUS: usize = HOST_STATUS;

/// What [`install`] did, per function and mode.
pub type Status = heapless::Vec<FunctionStatus, MAX_STATUS>;

#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
type BistroHooks = heapless::Vec<crate::bistro::Hook, { crate::host::FUNCTIONS + 5 + COPIES }>;

struct Installed {
    config: Option<Config>,
    status: heapless::Vec<FunctionStatus, HOST_STATUS>,
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    hooks: BistroHooks,
    /// dlopen, dlclose, dlsym and dlvsym, patched for the host hooks
    /// alone in bistro mode (see `follow_loader`).
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    loader: heapless::Vec<crate::bistro::Hook, 4>,
    /// The loader's breakpoint for debuggers, patched with the host
    /// functions in bistro mode (see `crate::namespace::loader_break`).
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    loader_break: heapless::Vec<crate::bistro::Hook, 1>,
    /// libpthread's second copies of host functions (glibc before 2.34),
    /// patched in the host functions' batch (see `pthread_copy_requests`).
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    copies: heapless::Vec<crate::bistro::Hook, COPIES>,
    /// The libc functions of the loader's other namespaces, patched (see
    /// `crate::namespace`), and how each namespace stands.
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    namespace_hooks: heapless::Vec<(usize, crate::bistro::Hook), NAMESPACE_HOOKS>,
    /// Which libc each namespace's hooks are in (its load bias and
    /// dynamic section; zeros for none).
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    namespace_libcs: [(usize, usize); crate::host::NAMESPACES],
    namespaces: heapless::Vec<NamespaceStatus, { crate::host::NAMESPACES - 1 }>,
    reloc: bool,
}

/// Most patches in the libc of other namespaces: every function in each.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
const NAMESPACE_HOOKS: usize = (crate::host::NAMESPACES - 1) * crate::host::FUNCTIONS;

/// How the C library of one of the loader's other namespaces (a
/// `dlmopen`) stands: its functions, and how many of them are hooked
/// (bistro, the mode of the main namespace's host hooks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceStatus {
    /// The namespace (`Lmid_t`, 1 to 15).
    pub namespace: usize,
    /// The host functions its libc defines.
    pub functions: usize,
    /// How many of them are hooked.
    pub hooked: usize,
    /// Why one is not (the first that failed), empty when all are.
    pub reason: heapless::String<REASON>,
}

/// Set while a thread holds [`INSTALLED`] and may call into the loader
/// (an install, an uninstall, the hooking of a namespace): a loader call
/// that looks for new namespaces then does not wait for the state (its
/// thread may hold the loader's lock the holder waits for).
static BUSY: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Holds [`BUSY`] set while it lives, restoring what it found.
struct Busy(bool);

impl Busy {
    fn new() -> Busy {
        Busy(BUSY.swap(true, core::sync::atomic::Ordering::SeqCst))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.store(self.0, core::sync::atomic::Ordering::SeqCst);
    }
}

static INSTALLED: crate::fork::Mutex<Installed> = crate::fork::Mutex::new(Installed {
    config: None,
    status: heapless::Vec::new(),
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    hooks: heapless::Vec::new(),
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    loader: heapless::Vec::new(),
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    loader_break: heapless::Vec::new(),
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    copies: heapless::Vec::new(),
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    namespace_hooks: heapless::Vec::new(),
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    namespace_libcs: [(0, 0); crate::host::NAMESPACES],
    namespaces: heapless::Vec::new(),
    reloc: false,
});

fn note(
    status: &mut heapless::Vec<FunctionStatus, HOST_STATUS>,
    function: &'static str,
    mode: HookMode,
    why: Option<&dyn fmt::Display>,
) {
    note_in(status, function, "libc.so.6", mode, why);
}

/// Why the host functions are not hooked in a statically linked program.
const STATIC_PROGRAM: &str = "this program is statically linked: its C library is part of the executable, \
                              and memhook hooks the host functions of the shared C library (libc.so.6) only";

/// Whether this program is statically linked (static-pie too): the
/// program's own headers, the first object the loader lists, name no
/// dynamic loader (`PT_INTERP`). Its C library is then part of the
/// executable, which has no dynamic symbols to find the host functions
/// by, and no GOT slots that calls to them go through.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) fn statically_linked() -> bool {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the flag passed below; `info` and its program
        // headers are valid for this callback (dl_iterate_phdr's
        // contract).
        let (found, info) = unsafe { (&mut *data.cast::<Option<bool>>(), &*info) };
        let headers = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: `dlpi_phdr` points to `dlpi_phnum` headers.
            unsafe { core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        *found = Some(headers.iter().any(|h| h.p_type == libc::PT_INTERP));
        1 // the program alone
    }
    let mut interpreted: Option<bool> = None;
    // SAFETY: `first` matches the callback type and only reads what the
    // loader hands it; `interpreted` outlives the call.
    unsafe { crate::fork::iterate_phdr(first, (&raw mut interpreted).cast()) };
    interpreted == Some(false)
}

/// [`note`], for the function's definition in `library`.
fn note_in(
    status: &mut heapless::Vec<FunctionStatus, HOST_STATUS>,
    function: &'static str,
    library: &'static str,
    mode: HookMode,
    why: Option<&dyn fmt::Display>,
) {
    let _ = status.push(FunctionStatus::new(function, library, mode, why, false));
}

/// Installs the hooks `config` asks for. Idempotent: installing the same
/// config again does nothing; a different one replaces the first. Thread
/// safe. A function a mode cannot hook is reported in [`status`] with the
/// reason, and the others are installed.
///
/// From then on memhook's code must stay mapped, even after
/// [`uninstall`]: patched entries and GOT slots lead into it, and a
/// program or the CUDA runtime may keep a hook's address it was given. So
/// the first install marks the shared object that contains memhook (a
/// plugin that embeds this crate or links `libmemhook.a`) never to be
/// unloaded, unless it was linked with `-Wl,-z,nodelete` (as
/// `libmemhook.so` is) or memhook is part of the program:
/// [`crate::pin::pinned`] says which.
///
/// From a signal handler that interrupted memhook's own work on its
/// thread ([`inside_memhook`]) it does nothing: [`try_install`] says so.
pub fn install(config: &Config) {
    let _ = try_install(config);
}

/// [`install`], or [`InsideMemhook`] without waiting where the call comes
/// from a signal handler that interrupted memhook's own work on its
/// thread ([`inside_memhook`]): an install or uninstall, a status, the
/// hooking of a library loaded late. That work holds the lock an install
/// takes, and goes on only once the handler returns.
///
/// # Errors
///
/// [`InsideMemhook`], where nothing is installed or changed.
pub fn try_install(config: &Config) -> Result<(), InsideMemhook> {
    install_as(config, false)
}

/// [`install`], unless an install has been made (with any config) and
/// not undone: what a first registration does with the environment's
/// config. Asks [`installed`] first, without the lock, so that once
/// memhook is installed it takes no lock at all (a signal handler that
/// registers may have interrupted its own thread inside one); and again
/// under the lock, so that an install another thread is making meanwhile
/// is neither waited for twice nor replaced.
///
/// # Errors
///
/// [`InsideMemhook`] where nothing is installed and the call comes from a
/// signal handler that interrupted memhook's own work on its thread (its
/// first install among them): nothing is installed by this call.
pub fn install_unless_installed(config: &Config) -> Result<(), InsideMemhook> {
    if installed().is_none() {
        return install_as(config, true);
    }
    Ok(())
}

/// Why an install, an uninstall or a look at the status could not be
/// made: it was asked for by a signal handler that interrupted memhook's
/// own work on its thread ([`inside_memhook`]), which holds the lock it
/// needs until the handler returns. Nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsideMemhook;

impl fmt::Display for InsideMemhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "called from a signal handler that interrupted memhook's own work on this thread (an install, an \
             uninstall, a status, a library's hooking), which cannot go on until the handler returns",
        )
    }
}

impl core::error::Error for InsideMemhook {}

/// Whether this thread is inside memhook's own work, holding or taking
/// one of its locks or walking the loaded objects with the loader's lock
/// held (`crate::fork::inside_lock`): code that asks is a signal handler that interrupted
/// that work (memhook runs no event handler under its locks). There
/// [`try_install`] and [`try_uninstall`] return [`InsideMemhook`],
/// [`install`], [`uninstall`] and [`refresh`] do nothing, [`status`] and
/// [`namespaces`] are empty and [`status_at`] finds no entry, at once:
/// each would wait for the lock its own thread holds, for good.
/// Registering a handler ([`crate::set_handler`]) does not wait on these
/// locks and works there as anywhere.
pub fn inside_memhook() -> bool {
    crate::fork::inside_lock()
}

/// [`install`]'s work; `unless_installed`: as [`install_unless_installed`].
fn install_as(config: &Config, unless_installed: bool) -> Result<(), InsideMemhook> {
    if inside_memhook() {
        return Err(InsideMemhook);
    }
    // Before any lock of memhook's: the pin takes the loader's lock.
    crate::pin::pin_self();
    #[cfg(all(feature = "bistro", target_arch = "x86_64"))]
    if warm_up::defer(config) {
        return Ok(());
    }
    let mut state = INSTALLED.lock();
    if state.config == Some(*config) || (unless_installed && state.config.is_some()) {
        return Ok(());
    }
    let busy = Busy::new();
    if state.config.is_some() {
        remove(&mut state);
    } else {
        // Patches an uninstall had to keep: undone now if the hooker
        // that patched over them has let go (those still covered are
        // taken back below).
        #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            LATE.store(0, core::sync::atomic::Ordering::Release);
            unpatch_host_and_loader(&mut state);
            if !state.namespace_hooks.is_empty() {
                unhook_namespaces(&mut state);
            }
        }
    }
    // Made anew below (an uninstall leaves the kept patches listed).
    state.status.clear();
    // Mappings made while the hooks were out are unseen.
    crate::hugetlb::forget();
    let mmap = config.hooks.mmap;
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    let in_libc = if mmap.contains(HookMode::Bistro) {
        bistro_targets_in_libc()
    } else {
        [0; LIBC_TARGETS]
    };
    // For the host hooks alone in bistro mode, the loader's functions are
    // patched too (`loader_requests`), in the host functions' batch: one
    // hold of the other threads and three serialisations for all.
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    let mut followed = false;
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    if mmap.contains(HookMode::Bistro) {
        let loader = if !mmap.contains(HookMode::Reloc) && config.hooks.cuda.is_empty() {
            // Before the patches: their entries report what the loader
            // does from the first call.
            crate::reloc::LOADER_EVENTS.store(true, core::sync::atomic::Ordering::Release);
            loader_requests(&mut state, &in_libc)
        } else {
            None
        };
        followed = patch_host_functions(&mut state, &in_libc, loader.as_deref());
    } else if !mmap.contains(HookMode::Reloc) {
        note_kept(&mut state);
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if mmap.contains(HookMode::Reloc) {
        let mut hooks: heapless::Vec<
            (
                &'static core::ffi::CStr,
                usize,
                &'static core::sync::atomic::AtomicUsize,
            ),
            { crate::host::RELOC_SYMBOLS },
        > = functions().into_iter().collect();
        // glibc's mmap64 is mmap under another name, and so on.
        let _ = hooks.extend_from_slice(&crate::host::aliases());
        // fopen, freopen and their 64 names: their opens are inside libc,
        // where bistro's patch of open sees them (then a hook of their own
        // would report each twice).
        if !mmap.contains(HookMode::Bistro) {
            let _ = hooks.extend_from_slice(&crate::host::reloc_only());
        }
        // A function whose bistro patch an uninstall kept (another hooker
        // patched over it) is hooked by that patch alone: its slots lead
        // to the entry, through the other hooker, to our hook, which
        // calls the patch's trampoline. Rewritten, a slot would make the
        // original the entry, and each call would run round the two
        // hooks until the stack overflowed.
        hooks.retain(|&(_, hook, _)| !kept_bistro(&state, hook));
        // The other namespaces' objects get their namespace's reloc hooks,
        // whose originals each scan sets from their libcs
        // (`namespace::refresh_reloc_originals`).
        crate::namespace::RELOC.store(true, core::sync::atomic::Ordering::Release);
        // SAFETY: as for bistro.
        let result = unsafe { crate::reloc::install(&hooks) };
        let static_program = statically_linked();
        for (name, hook, _) in functions().into_iter().filter(|(name, _, _)| present(name)) {
            let function = name.to_str().unwrap_or("?");
            if kept_bistro(&state, hook) {
                note(&mut state.status, function, HookMode::Bistro, None);
                continue;
            }
            match result {
                _ if static_program => note(&mut state.status, function, HookMode::Reloc, Some(&STATIC_PROGRAM)),
                Ok(()) => note(&mut state.status, function, HookMode::Reloc, None),
                Err(e) => note(&mut state.status, function, HookMode::Reloc, Some(&e)),
            }
        }
        state.reloc = true;
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        // The loader maps and unmaps libraries out of the hooks' sight:
        // reloc's interposed dlopen/dlclose report what it did. The CUDA
        // hooks install them (GOT slots) in every mode; for host hooks
        // alone they are installed here: bistro patches of the loader's
        // functions in bistro mode, GOT slots otherwise.
        let host = mmap.contains(HookMode::Bistro) || mmap.contains(HookMode::Reloc);
        crate::reloc::LOADER_EVENTS.store(host, core::sync::atomic::Ordering::Release);
        crate::cuda::install(config.hooks.cuda);
        if host && !state.reloc && config.hooks.cuda.is_empty() {
            #[cfg(feature = "bistro")]
            let patched = followed;
            #[cfg(not(feature = "bistro"))]
            let patched = false;
            if patched {
                crate::reloc::follow_objects();
            } else {
                // SAFETY: no symbol of its own: only reloc's dlopen,
                // dlclose, dlsym and dlvsym hooks. Where there is no
                // dynamic loader (a static program) there is nothing to
                // report.
                let _ = unsafe { crate::reloc::install_with(&[]) };
            }
            state.reloc = true;
        }
    }
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    if mmap.contains(HookMode::Bistro) {
        crate::namespace::FOLLOW.store(true, core::sync::atomic::Ordering::Release);
        hook_namespaces(&mut state);
    }
    set_config(&mut state, Some(*config));
    // Every host function bistro-patched: every mapping of a file made
    // from here on is seen, and the filter of mapped files holds.
    let all_patched = mmap.contains(HookMode::Bistro)
        && functions()
            .into_iter()
            .filter(|(name, _, _)| present(name))
            .all(|(name, _, _)| {
                let name = name.to_str().unwrap_or("?");
                state
                    .status
                    .iter()
                    .any(|s| s.function == name && s.mode == HookMode::Bistro && s.installed)
            });
    crate::host::trust_mapped_files(all_patched);
    drop(busy);
    drop(state);
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    drain_late();
    // Loads on other threads that the install's rescans found.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    crate::reloc::report_changes();
    Ok(())
}

/// What the host install does with one host function in bistro mode.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Not in this C library: not listed.
    Absent,
    /// Our patch from before, kept at an uninstall because another hooker
    /// had patched over it: still in place and working, and a second
    /// patch over it would lead into itself.
    Kept,
    /// Nowhere to be found.
    NoSymbol,
    /// Patched in the batch.
    Patch,
}

/// Bistro-patches every host function of the main namespace's C library
/// (and libpthread's copies of some, before glibc 2.34:
/// [`pthread_copy_requests`]), the loader's breakpoint for debuggers
/// ([`break_request`]), and the loader's functions where `loader` has
/// them ([`loader_requests`]), all in one batch (`Hook::patch_batch`: one
/// hold of the other threads and three serialisations of every core for
/// all of them: `host::FUNCTIONS`, five and the copies), and notes how
/// each host function stands, in the functions' order, then the copies.
/// Whether the loader's were all patched (all or none: where one could
/// not be, the ones done are undone, and reloc's GOT hooks follow the
/// loader instead).
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn patch_host_functions(
    state: &mut Installed,
    in_libc: &[usize; LIBC_TARGETS],
    loader: Option<&[crate::bistro::Request<'static>]>,
) -> bool {
    use crate::bistro::{BistroError, Hook, Request};
    const N: usize = crate::host::FUNCTIONS;
    let mut steps = [Step::Absent; N];
    LATE.store(0, core::sync::atomic::Ordering::Release);
    let (copies, copy_names) = pthread_copy_requests(state, in_libc);
    let mut requests = heapless::Vec::<Request<'static>, { N + 5 + COPIES }>::new();
    let _ = requests.extend_from_slice(&copies);
    for (i, (name, hook, original)) in functions().into_iter().enumerate() {
        if !present(name) {
            continue;
        }
        let target = entry_of(name, in_libc[i]);
        steps[i] = if target == 0 {
            Step::NoSymbol
        } else if state.hooks.iter().any(|h| h.target() == target) {
            Step::Kept
        } else {
            let _ = requests.push(Request { target, hook, original });
            Step::Patch
        };
    }
    let host = requests.len() - copies.len();
    let loader_break = break_request(state);
    if let Some(r) = loader_break {
        let _ = requests.push(r);
    }
    let _ = requests.extend_from_slice(loader.unwrap_or(&[]));
    // SAFETY: each hook has its function's signature and calls the
    // original through `original`, which patch_batch sets first (the
    // loader's entries reach their functions that way: see
    // `loader_requests`; the breakpoint's hook calls its `ret`).
    let mut done = unsafe { Hook::patch_batch::<{ N + 5 + COPIES }>(&requests) }.into_iter();
    // The copies' results first (noted after the host functions'), then
    // the host functions' (one for each Patch step, below), then the
    // loader's.
    let copy_results: heapless::Vec<_, COPIES> = (&mut done).take(copies.len()).zip(copy_names).collect();
    let mut host_results = (&mut done).take(host);
    // Asked once, where a function was not found: a static program has
    // none of them.
    let static_program = steps.contains(&Step::NoSymbol) && statically_linked();
    for (i, (step, (name, _, _))) in steps.into_iter().zip(functions()).enumerate() {
        let function = name.to_str().unwrap_or("?");
        let library = host_library(name, in_libc[i]);
        let why: Option<&dyn fmt::Display> = match step {
            Step::Absent => continue,
            Step::Kept => None,
            Step::NoSymbol if static_program => Some(&STATIC_PROGRAM),
            Step::NoSymbol => {
                // Patched the moment a library brings it (`patch_late`).
                LATE.fetch_or(1 << i, core::sync::atomic::Ordering::AcqRel);
                let why: &dyn fmt::Display = &BistroError::NoSymbol;
                let entry = FunctionStatus::new(function, library, HookMode::Bistro, Some(why), true);
                let _ = state.status.push(entry);
                continue;
            }
            Step::Patch => match host_results.next() {
                Some(Ok(h)) => keep(&mut state.hooks, h, &"too many bistro hooks"),
                Some(Err(e)) => {
                    note_in(&mut state.status, function, library, HookMode::Bistro, Some(&e));
                    continue;
                }
                None => Some(&"not patched: the batch had no room"),
            },
        };
        note_in(&mut state.status, function, library, HookMode::Bistro, why);
    }
    // Past any host result left unread (none: one per Patch step).
    host_results.for_each(drop);
    for (result, function) in copy_results {
        let why = match result {
            Ok(h) => keep(&mut state.copies, h, &"too many copies in libpthread.so.0"),
            Err(e) => {
                note_in(&mut state.status, function, PTHREAD, HookMode::Bistro, Some(&e));
                continue;
            }
        };
        note_in(&mut state.status, function, PTHREAD, HookMode::Bistro, why);
    }
    // The breakpoint's: where it could not be patched, a namespace's libc
    // is hooked at the next loader call memhook interposes instead.
    if loader_break.is_some()
        && let Some(Ok(h)) = done.next()
    {
        let _ = state.loader_break.push(h);
    }
    loader.is_some() && follow_loader(state, done)
}

/// Keeps the patch `h` in `hooks` (`None`), or, where they have no room
/// (cannot happen: room for every patch they take), undoes it rather than
/// lose it and gives `full` as the reason.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn keep<const N: usize>(
    hooks: &mut heapless::Vec<crate::bistro::Hook, N>,
    h: crate::bistro::Hook,
    full: &'static &'static str,
) -> Option<&'static dyn fmt::Display> {
    let h = hooks.push(h).err()?;
    let _ = h.unpatch();
    Some(full)
}

/// The library status names for the host function `name`, whose entry in
/// libc is `in_libc` (0: elsewhere, or nowhere): glibc before 2.34 keeps
/// `shm_open` in librt.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn host_library(name: &core::ffi::CStr, in_libc: usize) -> &'static str {
    if in_libc == 0 && name == c"shm_open" {
        "librt.so.1"
    } else {
        "libc.so.6"
    }
}

/// The host functions (bits, by their index in `host::functions`) that
/// the bistro install in force found no definition of: `shm_open`, which
/// glibc before 2.34 keeps in librt, where no loaded object had it yet.
/// Listed pending, and patched the moment a library that defines one is
/// loaded ([`objects_changed`]).
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
static LATE: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// A look for [`LATE`] functions asked for while the install state was
/// held: the holder looks after it lets go ([`drain_late`]).
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
static LATE_ASKED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// After a `dlopen` or `dlclose` memhook followed (`reloc`'s rescan, on
/// the caller's thread): where a host function had no definition at the
/// install, patches it if a library now defines it. Never waits for the
/// install state: where it is held, its holder looks when it lets go.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn objects_changed() {
    use core::sync::atomic::Ordering;
    if LATE.load(Ordering::Acquire) == 0 {
        return;
    }
    LATE_ASKED.store(true, Ordering::SeqCst);
    drain_late();
}

/// Patches the [`LATE`] functions while a look was asked and the install
/// state is free.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn drain_late() {
    use core::sync::atomic::Ordering;
    while LATE_ASKED.load(Ordering::SeqCst) {
        let Some(mut state) = INSTALLED.try_lock() else {
            return; // the holder drains after it lets go
        };
        LATE_ASKED.store(false, Ordering::SeqCst);
        patch_late(&mut state);
    }
}

/// Patches the [`LATE`] functions a loaded library now defines, in one
/// batch, and puts their status entries right.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn patch_late(state: &mut Installed) {
    use core::sync::atomic::Ordering;

    use crate::bistro::{Hook, Request};
    let late = LATE.load(Ordering::Acquire);
    if late == 0 || !state.config.is_some_and(|c| c.hooks.mmap.contains(HookMode::Bistro)) {
        return;
    }
    let mut requests = heapless::Vec::<Request<'static>, 4>::new();
    let mut which = heapless::Vec::<(usize, &'static core::ffi::CStr), 4>::new();
    for (i, (name, hook, original)) in functions().into_iter().enumerate() {
        if late & (1 << i) == 0 {
            continue;
        }
        let target = crate::reloc::global_definition(name);
        if target != 0 && which.push((i, name)).is_ok() {
            let _ = requests.push(Request { target, hook, original });
        }
    }
    if requests.is_empty() {
        return;
    }
    // SAFETY: as in `patch_host_functions`: each hook has its function's
    // signature and calls the original the batch sets first.
    let done = unsafe { Hook::patch_batch::<4>(&requests) };
    for (result, (i, name)) in done.into_iter().zip(which) {
        LATE.fetch_and(!(1 << i), Ordering::AcqRel);
        let function = name.to_str().unwrap_or("?");
        let error;
        let why: Option<&dyn fmt::Display> = match result {
            Ok(h) => keep(&mut state.hooks, h, &"too many bistro hooks"),
            Err(e) => {
                error = e;
                Some(&error)
            }
        };
        let entry = FunctionStatus::new(function, host_library(name, 0), HookMode::Bistro, why, false);
        if let Some(s) = state
            .status
            .iter_mut()
            .find(|s| s.function == function && s.mode == HookMode::Bistro && s.pending)
        {
            *s = entry;
        }
    }
}

/// The patches of libpthread's second copies of host functions, for
/// [`patch_host_functions`]'s batch, and their functions' names. glibc
/// before 2.34 keeps in libpthread.so.0 copies of `open` and `open64`
/// (cancellation points built from the same source as libc's), which the
/// global scope finds before libc's wherever the program links
/// libpthread, as every program with threads does: a patch of libc's
/// alone saw none of the program's `open(O_TRUNC)` there. A copy gets its
/// function's hook and original: the batch sets the original to each
/// trampoline it plans, in order, and the copies come first, so the hook
/// calls libc's where that patch took and the copy's where only the
/// copy's did (the same system call either way). Copies an uninstall
/// kept (another hooker patched over them) are noted installed. Nothing
/// with glibc 2.34 and later (libpthread is empty) or where libpthread is
/// not loaded.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn pthread_copy_requests(
    state: &mut Installed,
    in_libc: &[usize; LIBC_TARGETS],
) -> (
    heapless::Vec<crate::bistro::Request<'static>, COPIES>,
    heapless::Vec<&'static str, COPIES>,
) {
    const N: usize = crate::host::FUNCTIONS;
    let (mut requests, mut names_patched) = (heapless::Vec::new(), heapless::Vec::new());
    let host = functions();
    let names: [&[u8]; N] = core::array::from_fn(|i| host[i].0.to_bytes());
    let Some(copies) = crate::reloc::main_entries_in(PTHREAD.as_bytes(), &names) else {
        return (requests, names_patched);
    };
    for (i, &(name, hook, original)) in host.iter().enumerate() {
        let function = name.to_str().unwrap_or("?");
        if copies[i] == 0 || copies[i] == entry_of(name, in_libc[i]) || !present(name) {
            continue;
        }
        if state.copies.iter().any(|h| h.target() == copies[i]) {
            note_in(&mut state.status, function, PTHREAD, HookMode::Bistro, None);
        } else if names_patched.push(function).is_err() {
            let why: &dyn fmt::Display = &"too many copies in libpthread.so.0";
            note_in(&mut state.status, function, PTHREAD, HookMode::Bistro, Some(why));
        } else {
            let _ = requests.push(crate::bistro::Request {
                target: copies[i],
                hook,
                original,
            });
        }
    }
    (requests, names_patched)
}

/// The patch of the loader's breakpoint for debuggers
/// (`crate::namespace::loader_break`), which lets memhook hook the libc
/// of a namespace `dlmopen` makes before any of the namespace's code runs.
/// `None` where the loader has none memhook can follow namespaces with,
/// or where an uninstall kept its patch (another hooker patched over it:
/// it is taken back as it is). Names the breakpoint to bistro as the one
/// empty function it may patch over its padding.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn break_request(state: &Installed) -> Option<crate::bistro::Request<'static>> {
    let target = crate::namespace::loader_break();
    if target == 0 || state.loader_break.iter().any(|h| h.target() == target) {
        return None;
    }
    crate::bistro::EMPTY_FUNCTION.store(target, core::sync::atomic::Ordering::Release);
    Some(crate::bistro::Request {
        target,
        hook: crate::namespace::loader_break_hook as *const () as usize,
        original: &crate::namespace::BREAK_ORIGINAL,
    })
}

/// The patches of the loader's dlopen, dlclose, dlsym and dlvsym to
/// reloc's entries for them, for the host hooks alone in bistro mode:
/// four patches instead of a pass over every object's relocations (a
/// millisecond and more in a process of a few hundred libraries), made in
/// the host functions' batch ([`patch_host_functions`]). `None` where one
/// cannot be found: reloc's GOT hooks follow the loader instead. Each
/// entry has its function's signature and reaches the function through
/// its `original`, which the batch sets to the trampoline before the
/// patch.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn loader_requests(
    state: &mut Installed,
    in_libc: &[usize; LIBC_TARGETS],
) -> Option<heapless::Vec<crate::bistro::Request<'static>, 4>> {
    let mut requests = heapless::Vec::<crate::bistro::Request<'static>, 4>::new();
    for (i, (name, entry, real)) in crate::reloc::dl_entries().into_iter().enumerate() {
        let target = entry_of(name, in_libc[crate::host::FUNCTIONS + i]);
        if target == 0 {
            unfollow_loader(state);
            return None;
        }
        if state.loader.iter().any(|h| h.target() == target) {
            continue; // kept from before (see `install`)
        }
        let _ = requests.push(crate::bistro::Request {
            target,
            hook: entry,
            original: real,
        });
    }
    Some(requests)
}

/// Takes the loader's patches of the batch (`done`, what remains of it
/// after the host functions'): all or none, as [`loader_requests`] says.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn follow_loader(
    state: &mut Installed,
    done: impl Iterator<Item = Result<crate::bistro::Hook, crate::bistro::BistroError>>,
) -> bool {
    let mut all = true;
    for d in done {
        match d {
            Ok(h) => {
                crate::reloc::BISTRO_DL.store(true, core::sync::atomic::Ordering::Release);
                let _ = state.loader.push(h);
            }
            Err(_) => all = false,
        }
    }
    if !all {
        unfollow_loader(state);
    }
    all
}

/// Undoes [`follow_loader`]'s patches. A patch another hooker patched
/// over stays (working, through its trampoline), and so does
/// `reloc::BISTRO_DL`: reloc must keep finding the functions through
/// their trampolines, not through their patched entries.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn unfollow_loader(state: &mut Installed) {
    if unpatch_all(&mut state.loader) {
        crate::reloc::BISTRO_DL.store(false, core::sync::atomic::Ordering::Release);
    }
}

/// Undoes the host functions' patches, the loader's and its
/// breakpoint's in one batch (one hold of the other threads, three
/// serialisations), as [`unfollow_loader`] and [`unpatch_all`] each do
/// for theirs: the patches another hooker patched over stay, each in its
/// list.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn unpatch_host_and_loader(state: &mut Installed) {
    let others = state.loader.len() + state.loader_break.len() + state.copies.len();
    if others == 0 || state.hooks.len() + others > state.hooks.capacity() {
        // (The second cannot happen: room for every host function, the
        // loader's four, its breakpoint and libpthread's copies.)
        unfollow_loader(state);
        unpatch_all(&mut state.copies);
        unpatch_all(&mut state.loader_break);
        unpatch_all(&mut state.hooks);
        return;
    }
    // The loader's patches and libpthread's copies join the host
    // functions' list for the batch (in place: an install may run on a
    // small stack), and those kept go back after it.
    let mut copy_targets = heapless::Vec::<usize, COPIES>::new();
    while let Some(h) = state.copies.pop() {
        let _ = copy_targets.push(h.target());
        let _ = state.hooks.push(h); // room checked above
    }
    let mut loader_targets = heapless::Vec::<usize, 4>::new();
    while let Some(h) = state.loader.pop() {
        let _ = loader_targets.push(h.target());
        let _ = state.hooks.push(h); // room checked above
    }
    let break_target = state.loader_break.first().map(crate::bistro::Hook::target);
    if let Some(h) = state.loader_break.pop() {
        let _ = state.hooks.push(h); // room checked above
    }
    unpatch_all(&mut state.hooks);
    let mut i = 0;
    while i < state.hooks.len() {
        let target = state.hooks[i].target();
        if loader_targets.contains(&target) {
            let _ = state.loader.push(state.hooks.swap_remove(i));
        } else if copy_targets.contains(&target) {
            let _ = state.copies.push(state.hooks.swap_remove(i));
        } else if Some(target) == break_target {
            let _ = state.loader_break.push(state.hooks.swap_remove(i));
        } else {
            i += 1;
        }
    }
    if state.loader.is_empty() {
        crate::reloc::BISTRO_DL.store(false, core::sync::atomic::Ordering::Release);
    }
}

/// Undoes every patch of `hooks` in one batch, and keeps those another
/// hooker patched over (in place, still working, through their
/// trampolines: an install finds them there and takes them back rather
/// than patching over its own jump). Whether none was kept.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn unpatch_all<const N: usize>(hooks: &mut heapless::Vec<crate::bistro::Hook, N>) -> bool {
    let _ = crate::bistro::Hook::unpatch_batch(hooks);
    hooks.is_empty()
}

/// The host functions, then the loader's four (`reloc::dl_entries`).
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
const LIBC_TARGETS: usize = crate::host::FUNCTIONS + 4;

/// Where the main namespace's C library defines the host functions and
/// the loader's four, in that order (0 where unknown), from one pass over
/// its symbol table (`reloc::main_libc_entries`; about 30 µs for libc's
/// on the dev VM).
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn bistro_targets_in_libc() -> [usize; LIBC_TARGETS] {
    let (host, loader) = (functions(), crate::reloc::dl_entries());
    let names: [&[u8]; LIBC_TARGETS] = core::array::from_fn(|i| match host.get(i) {
        Some(&(name, _, _)) => name.to_bytes(),
        None => loader[i - host.len()].0.to_bytes(),
    });
    crate::reloc::main_libc_entries(&names).unwrap_or([0; LIBC_TARGETS])
}

/// Where bistro patches the function `name`: its entry in the main
/// namespace's C library (`in_libc`, read from the library's own symbol
/// table; see `reloc::main_libc_entries`), or, where that table does not
/// say (0: glibc before 2.34 defines the loader's functions in libdl), the
/// definition `dlsym(RTLD_DEFAULT, ...)` finds, asked only where some
/// object defines it (`reloc::global_definition`: a miss allocates
/// nothing). 0 where neither knows it.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn entry_of(name: &'static core::ffi::CStr, in_libc: usize) -> usize {
    if in_libc != 0 {
        return in_libc;
    }
    crate::reloc::global_definition(name)
}

/// Whether the host function `name` is in this process's C library.
/// `process_madvise` came with glibc 2.36: an older one has nothing to
/// hook, and nothing can call it, so [`status`] leaves it out rather than
/// list it as a failure. The others are in every glibc (`shm_open` in
/// librt before 2.34, which may load after the install: listed pending
/// until it does, see [`LATE`]).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn present(name: &core::ffi::CStr) -> bool {
    name != c"process_madvise" || crate::reloc::global_definition(c"process_madvise") != 0
}

fn remove(state: &mut Installed) {
    crate::host::trust_mapped_files(false);
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    LATE.store(0, core::sync::atomic::Ordering::Release);
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    unhook_namespaces(state);
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    unpatch_host_and_loader(state);
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    crate::namespace::RELOC.store(false, core::sync::atomic::Ordering::Release);
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    crate::cuda::uninstall();
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    crate::reloc::LOADER_EVENTS.store(false, core::sync::atomic::Ordering::Release);
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if state.reloc || state.config.is_some_and(|c| !c.hooks.cuda.is_empty()) {
        crate::reloc::uninstall();
        state.reloc = false;
    }
    // The originals stay set: a thread may still be inside a hook.
    state.status.clear();
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    note_kept(state);
    set_config(state, None);
}

/// Whether `hook`'s function keeps a bistro patch of ours that an
/// uninstall could not undo (another hooker patched over it: see
/// [`uninstall`]). Outside a bistro install, the patches listed are those.
/// A kept patch of libpthread's copy counts too: reloc's original would
/// be that copy's entry, which leads back into the hook.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn kept_bistro(state: &Installed, hook: usize) -> bool {
    #[cfg(feature = "bistro")]
    return state.hooks.iter().chain(&state.copies).any(|h| h.hook() == hook);
    #[cfg(not(feature = "bistro"))]
    {
        let _ = (state, hook);
        false
    }
}

/// Lists the bistro patches an uninstall kept as installed: they still
/// report, and the hooks of no other mode are put on their functions.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn note_kept(state: &mut Installed) {
    for i in 0..state.hooks.len() {
        if let Some(function) = hooked_by(state.hooks[i].hook()) {
            note(&mut state.status, function, HookMode::Bistro, None);
        }
    }
    for i in 0..state.copies.len() {
        if let Some(function) = hooked_by(state.copies[i].hook()) {
            note_in(&mut state.status, function, PTHREAD, HookMode::Bistro, None);
        }
    }
}

/// The host function whose hook is `hook`.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn hooked_by(hook: usize) -> Option<&'static str> {
    functions()
        .into_iter()
        .find(|&(_, h, _)| h == hook)
        .map(|(name, _, _)| name.to_str().unwrap_or("?"))
}

/// Undoes every patch (bistro entries restored exactly, reloc slots put
/// back). Handlers stay registered.
///
/// A bistro patch another hooker has patched over since cannot be undone
/// without undoing theirs: it stays in place and keeps reporting (its
/// hook is on their path), and [`status`] lists it as installed. The next
/// [`install`] undoes it if the other hooker has let go, or takes it back
/// as it is, in whatever mode: its function is left to it (no GOT slot
/// is rewritten to its hook, no lookup answered with it), since with the
/// entry as the hook's original each call would run round the two
/// hooks. The same holds for the CUDA functions' patches, and for those
/// in the libc of another loader namespace (while that libc stays
/// loaded).
///
/// From a signal handler that interrupted memhook's own work on its
/// thread ([`inside_memhook`]) it does nothing: [`try_uninstall`] says so.
pub fn uninstall() {
    let _ = try_uninstall();
}

/// [`uninstall`], or [`InsideMemhook`] without waiting where the call
/// comes from a signal handler that interrupted memhook's own work on its
/// thread ([`inside_memhook`]).
///
/// # Errors
///
/// [`InsideMemhook`], where nothing is undone.
pub fn try_uninstall() -> Result<(), InsideMemhook> {
    if inside_memhook() {
        return Err(InsideMemhook);
    }
    let mut state = INSTALLED.lock();
    let busy = Busy::new();
    remove(&mut state);
    drop(busy);
    drop(state);
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    crate::reloc::report_changes();
    Ok(())
}

/// Whether the install in force hooks the libc of a namespace `dlmopen`
/// makes as soon as the loader has mapped it, before any of its code runs,
/// so that what its library's constructors call is seen: the host hooks
/// are in bistro mode and the loader's breakpoint for debuggers
/// (`_dl_debug_state`, which the loader calls as each change of its
/// objects ends) is patched. Otherwise a namespace's libc is hooked at
/// the first `dlsym`, `dlopen` or `dlclose` after the `dlmopen`.
pub fn namespace_constructors_seen() -> bool {
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    return crate::namespace::FOLLOW.load(core::sync::atomic::Ordering::Acquire)
        && !inside_memhook()
        && !INSTALLED.lock().loader_break.is_empty();
    #[cfg(not(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    false
}

/// Whether an install in bistro mode could patch the loader's breakpoint
/// for debuggers here (see [`namespace_constructors_seen`]): the loader
/// keeps a list of its namespaces (glibc 2.35 and later), and its
/// breakpoint is an empty function memhook can patch (not, for one,
/// while a debugger has its own breakpoint there).
pub fn loader_break_patchable() -> bool {
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let target = crate::namespace::loader_break();
        target != 0 && crate::bistro::can_patch_empty(target)
    }
    #[cfg(not(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    false
}

/// Per hooked function: the mode tried, whether it took, and why not. A
/// host function the C library lacks (`process_madvise` before glibc
/// 2.36) has no entry: there is nothing to hook, and nothing calls it.
/// Empty where asked for by a signal handler that interrupted memhook's
/// own work on its thread ([`inside_memhook`]), which holds the locks.
pub fn status() -> Status {
    if inside_memhook() {
        return Status::new();
    }
    let mut all: Status = {
        let state = INSTALLED.lock();
        state.status.iter().map(|s| as_now(&state, s)).collect()
    };
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    all.extend(crate::cuda::status());
    all
}

/// `s` as its function stands now. A host function's bistro patch whose
/// jump's first instruction something has replaced since, the rest of the
/// jump in place, is not installed, and the reason says what is there: a
/// uprobe (`bpftrace`, `perf probe`) or a debugger's breakpoint put on the
/// function after the install, whose `int3` the calls meet first and go
/// on past the hook, or what a uprobe's removal put back there (the
/// library file's first byte, over the jump's), which leaves no
/// instruction of the function's (README, "Debuggers and probes"). So is
/// one whose jump is gone, the function's own bytes back ([`undone`]).
fn as_now(state: &Installed, s: &FunctionStatus) -> FunctionStatus {
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    if s.installed && s.mode == HookMode::Bistro {
        let patches = if s.library == PTHREAD {
            &state.copies[..]
        } else {
            &state.hooks[..]
        };
        if let Some(h) = patches.iter().find(|h| hooked_by(h.hook()) == Some(s.function)) {
            // SAFETY: a patch of the install in force, in the main
            // namespace's libc (or libpthread), which is never unloaded.
            if let Some(now) = unsafe { h.head_replaced() } {
                let mut s = s.clone();
                head_replaced(&mut s, h.replaced().0, &now);
                return s;
            }
            // SAFETY: as above.
            if unsafe { h.undone() } {
                let mut s = s.clone();
                undone(&mut s, h.replaced().0);
                return s;
            }
        }
    }
    #[cfg(not(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    let _ = state;
    s.clone()
}

/// Marks `s`, a bistro entry, not installed: the bytes at `at`, where its
/// jump was, are the function's own again (its page discarded by a call
/// memhook did not see, a system call made by the instruction itself
/// being one; or written back by another), so calls run the function
/// unhooked (see [`as_now`]; the CUDA functions' status says the same).
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn undone(s: &mut FunctionStatus, at: usize) {
    s.installed = false;
    s.reason.clear();
    let _ = fmt::Write::write_fmt(
        &mut s.reason,
        format_args!(
            "its jump at {at:#x} is gone: the function's own bytes are back (its page discarded by a madvise memhook did not see, or written over)"
        ),
    );
}

/// Marks `s`, a bistro entry, not installed: its jump at `at` begins with
/// `now`, not memhook's bytes (see [`as_now`]; the CUDA functions' status
/// says the same).
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn head_replaced(s: &mut FunctionStatus, at: usize, now: &[u8]) {
    s.installed = false;
    s.reason.clear();
    let _ = fmt::Write::write_fmt(
        &mut s.reason,
        format_args!(
            "its jump at {at:#x} begins{} now, not memhook's: a uprobe or a debugger's breakpoint there, or one taken out",
            crate::bistro::Bytes(now)
        ),
    );
}

/// Entry `index` of [`status`], and how many there are, copying that one
/// entry only: [`status`] returns every entry by value (about 60 KiB, and
/// twice that on the stack while it is built), too much for a thread with
/// a small stack that only walks the list (as the C API's
/// `memhook_status` does, one index a call). `None` past the end. The
/// entries are those of the moment of the call: an install between two
/// calls may change them. `(None, 0)` where asked for by a signal
/// handler that interrupted memhook's own work on its thread
/// ([`inside_memhook`]).
pub fn status_at(index: usize) -> (Option<FunctionStatus>, usize) {
    if inside_memhook() {
        return (None, 0);
    }
    let host = {
        let installed = INSTALLED.lock();
        if let Some(s) = installed.status.get(index) {
            let s = as_now(&installed, s);
            let n = installed.status.len();
            drop(installed);
            return (Some(s), n + cuda_status_len());
        }
        installed.status.len()
    };
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let (s, n) = crate::cuda::status_at(index - host);
        (s, host + n)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    (None, host)
}

/// How many entries the CUDA hooks' status holds.
fn cuda_status_len() -> usize {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    return crate::cuda::status_at(usize::MAX).1;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    0
}

/// Hooks libraries that were loaded by calls memhook could not see: a
/// `dlopen` made from memhook's own object (the program itself, when
/// memhook is linked into it as a Rust crate, since reloc leaves that
/// object alone). Loads through any other object are seen as they happen.
/// Does nothing where asked for by a signal handler that interrupted
/// memhook's own work on its thread ([`inside_memhook`]), whose lock the
/// look would wait for.
pub fn refresh() {
    if inside_memhook() {
        return;
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    crate::reloc::refresh();
    #[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
    crate::namespace::check();
}

/// How the C library of each of the loader's other namespaces stands
/// (`dlmopen`; see [`install`]): those hooked now (a namespace the loader
/// freed is not listed), in the order found.
/// Empty unless the host hooks are installed in bistro mode and a
/// namespace other than the main one holds a libc, or an uninstall kept
/// patches there that another hooker had patched over (its reason says
/// so). Empty where asked for by a signal handler that interrupted
/// memhook's own work on its thread ([`inside_memhook`]).
pub fn namespaces() -> heapless::Vec<NamespaceStatus, { crate::host::NAMESPACES - 1 }> {
    if inside_memhook() {
        return heapless::Vec::new();
    }
    INSTALLED.lock().namespaces.clone()
}

/// Hooks the libc of namespaces that came since the last look, and
/// forgets those that went: called by [`crate::namespace::check`] from the
/// loader's functions memhook interposes (`wait`), and by
/// `crate::namespace::check_now` from inside the loader, its lock held
/// (the loader's breakpoint, in a section entered without waiting for a
/// fork). With `wait`, waits for the state unless its holder may be
/// waiting for the loader; without, looks only where the state is free
/// now, since its holder may be waiting for the loader's lock. Where it
/// does not look, the holder looks itself before it lets go, or the next
/// loader call memhook interposes does.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) fn follow_namespaces(wait: bool) {
    loop {
        if let Some(mut state) = INSTALLED.try_lock() {
            if state.config.is_some() {
                let _busy = Busy::new();
                hook_namespaces(&mut state);
            }
            return;
        }
        if !wait || BUSY.load(core::sync::atomic::Ordering::SeqCst) {
            return;
        }
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}

/// Brings the namespaces' hooks up to date (bistro): forgets the patches
/// of a libc that went (the loader unmapped it with its namespace, once
/// the program closed its last library there; nothing is written to
/// where it was), and patches, in every namespace that holds a libc not
/// hooked yet, its host functions with that namespace's hooks.
///
/// memhook holds no handle in any namespace: every look at a namespace's
/// libc, and every write to it, is made under the loader's write lock
/// ([`crate::reloc::with_namespace_libcs`]), under which the loader never
/// unmaps an object. A libc found again at the same address is taken for
/// the one hooked only while a patch of memhook's is in its code (another
/// loaded there later holds its own bytes). The trampolines are set aside
/// before, outside that lock (mapping one sends an event), and a libc
/// that went between the two looks is not patched.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn hook_namespaces(state: &mut Installed) {
    use core::sync::atomic::Ordering;

    let subs = crate::namespace::unloads();
    // The libcs to hook: namespace, which libc, and where it lies.
    let mut todo: heapless::Vec<(usize, (usize, usize)), { crate::host::NAMESPACES - 1 }> = heapless::Vec::new();
    let mut present = 0u32;
    let walked = crate::reloc::with_namespace_libcs(|libc| {
        let ns = libc.namespace;
        present |= 1 << ns;
        if state.namespace_libcs[ns] == libc.id {
            // The libc patched before, or another loaded at its address.
            forget_undone(state, libc);
            let hooked = crate::namespace::HOOKED.load(Ordering::Acquire) & (1 << ns) != 0;
            if hooked && state.namespace_hooks.iter().any(|&(n, _)| n == ns) {
                return;
            }
            // Not hooked since an uninstall that kept patches another
            // hooker covered (they are taken back), or loaded afresh.
        } else {
            forget_namespace(state, ns);
        }
        let _ = todo.push((ns, libc.id));
    });
    if !walked {
        return;
    }
    // Namespaces patched before that hold no libc now.
    for ns in 1..crate::host::NAMESPACES {
        if state.namespace_libcs[ns] != (0, 0) && present & (1 << ns) == 0 {
            forget_namespace(state, ns);
        }
    }
    crate::namespace::looked(subs);
    if todo.is_empty() {
        return;
    }
    for &(_, (base, _)) in &todo {
        // Each function's trampoline and, for a hook out of a near jump's
        // reach, a far slot.
        let _ = crate::trampoline::reserve_near(base, crate::bistro::NEAR_REACH, 2 * crate::host::FUNCTIONS);
    }
    crate::reloc::with_namespace_libcs(|libc| {
        let ns = libc.namespace;
        if !todo.iter().any(|&(n, id)| n == ns && id == libc.id) {
            return; // went since the first look, or already hooked
        }
        let Some(functions) = crate::namespace::functions(ns) else {
            return;
        };
        hook_namespace(state, libc, &functions);
    });
}

/// Forgets, without writing them, the patches of `libc`'s namespace
/// whose entries hold the bytes they replaced again: a libc loaded
/// afresh at the address of the one patched (or a patch undone by
/// someone else). Those in place stay, and so do those another hooker
/// patched over: its jump leads to ours, and patching its entry again
/// would make a call run into itself. Under the loader's write lock,
/// `libc` listed, at the address recorded for the namespace.
///
/// A patch laid by another hooker on a libc loaded afresh at the same
/// address looks the same as one laid over ours: it is taken for ours
/// (that function then goes unhooked there, not round in a loop). Every
/// `dlclose` is followed by a look that forgets a libc that went, so
/// that takes a namespace freed and made again while memhook is not
/// installed.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn forget_undone(state: &mut Installed, libc: &crate::reloc::NamespaceLibc) {
    let patch = memhook_core::patch::MAX_PATCH;
    state.namespace_hooks.retain(|(n, h)| {
        // SAFETY: the entry lies in the listed libc's load segments, which
        // stay mapped under the loader's write lock.
        *n != libc.namespace || (libc.holds(h.target(), patch) && !unsafe { h.undone() })
    });
}

/// Forgets namespace `ns`'s patches without writing them (the code they
/// were made in is gone, or is another libc's), and its status.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn forget_namespace(state: &mut Installed, ns: usize) {
    crate::namespace::clear_kept(ns);
    state.namespace_hooks.retain(|(n, _)| *n != ns);
    state.namespaces.retain(|s| s.namespace != ns);
    state.namespace_libcs[ns] = (0, 0);
    crate::namespace::HOOKED.fetch_and(!(1 << ns), core::sync::atomic::Ordering::AcqRel);
}

/// Patches `libc`'s host functions with its namespace's hooks, under the
/// loader's write lock, and records how the namespace stands.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn hook_namespace(state: &mut Installed, libc: &crate::reloc::NamespaceLibc, functions: &[crate::host::Hooked]) {
    let ns = libc.namespace;
    let mut stands = NamespaceStatus {
        namespace: ns,
        functions: 0,
        hooked: 0,
        reason: heapless::String::new(),
    };
    let mut requests = heapless::Vec::<crate::bistro::Request<'static>, { crate::host::FUNCTIONS }>::new();
    let mut names = heapless::Vec::<&'static core::ffi::CStr, { crate::host::FUNCTIONS }>::new();
    for (&(name, hook, original), &target) in functions.iter().zip(&libc.functions) {
        if target == 0 {
            continue; // process_madvise before glibc 2.36
        }
        stands.functions += 1;
        if state
            .namespace_hooks
            .iter()
            .any(|(n, h)| *n == ns && h.target() == target)
        {
            // Kept by an uninstall under another hooker's patch: taken
            // back as it is (see `forget_undone`).
            stands.hooked += 1;
            continue;
        }
        let _ = requests.push(crate::bistro::Request { target, hook, original });
        let _ = names.push(name);
    }
    // SAFETY: as for the main namespace's hooks: each has its function's
    // signature and calls this namespace's original through `original`,
    // which patch_batch sets first. The entries are in the libc's code,
    // mapped while the loader's write lock is held.
    let done = unsafe { crate::bistro::Hook::patch_batch::<{ crate::host::FUNCTIONS }>(&requests) };
    for (patched, name) in done.into_iter().zip(names) {
        let why: &dyn fmt::Display = match patched {
            Ok(h) => match state.namespace_hooks.push((ns, h)) {
                Ok(()) => {
                    stands.hooked += 1;
                    continue;
                }
                Err((_, h)) => {
                    // Cannot happen (room for every function of every
                    // namespace); undone rather than lost.
                    let _ = h.unpatch();
                    &"too many bistro hooks"
                }
            },
            Err(ref e) => e,
        };
        if stands.reason.is_empty() {
            let name = name.to_str().unwrap_or("?");
            let _ = fmt::Write::write_fmt(&mut stands.reason, format_args!("{name}: {why}"));
        }
    }
    state.namespace_libcs[ns] = libc.id;
    crate::namespace::HOOKED.fetch_or(1 << ns, core::sync::atomic::Ordering::AcqRel);
    state.namespaces.retain(|s| s.namespace != ns);
    let _ = state.namespaces.push(stands);
}

/// Undoes [`hook_namespaces`]'s patches, under the loader's write lock, in
/// each libc that is still the one patched (a patch another hooker
/// patched over stays, working, and is kept: [`namespaces`] lists its
/// namespace with those alone hooked, and the next install takes them
/// back); the patches of a libc that went are forgotten.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn unhook_namespaces(state: &mut Installed) {
    use core::sync::atomic::Ordering;

    // Marks a patch this uninstall keeps (the namespace number's top
    // bit): it goes back in the list at once, where the walk of its
    // namespace, which takes the patches it finds, must pass over it. A
    // second list of kept patches would cost the frame 36 KiB, and an
    // uninstall runs on whatever stack its caller has.
    const KEPT: usize = 1 << (usize::BITS - 1);

    crate::namespace::FOLLOW.store(false, Ordering::Release);
    crate::reloc::with_namespace_libcs(|libc| {
        let ns = libc.namespace;
        if state.namespace_libcs[ns] != libc.id {
            return;
        }
        // What is left is in the libc, and ours.
        forget_undone(state, libc);
        let mut mine = heapless::Vec::<crate::bistro::Hook, { crate::host::FUNCTIONS }>::new();
        let mut i = 0;
        while i < state.namespace_hooks.len() {
            let (n, _) = state.namespace_hooks[i];
            if n != ns || mine.is_full() {
                i += 1;
                continue;
            }
            let (_, h) = state.namespace_hooks.swap_remove(i);
            let _ = mine.push(h);
        }
        // One batch for the namespace's libc.
        let _ = crate::bistro::Hook::unpatch_batch(&mut mine);
        for h in mine {
            // Taken from the list above: there is room.
            let _ = state.namespace_hooks.push((ns | KEPT, h));
        }
    });
    // What is left unmarked is in libcs that went: forgotten, as is every
    // namespace with no patch kept.
    state.namespace_hooks.retain_mut(|(n, _)| {
        let kept = *n & KEPT != 0;
        *n &= !KEPT;
        kept
    });
    for ns in 1..crate::host::NAMESPACES {
        let kept = state.namespace_hooks.iter().filter(|&&(n, _)| n == ns).count();
        if kept == 0 {
            forget_namespace(state, ns);
            continue;
        }
        // Not hooked: the next install hooks the namespace's other
        // functions again. Reloc's scans leave the kept ones to their
        // patches (see `namespace::check_kept`).
        crate::namespace::HOOKED.fetch_and(!(1 << ns), Ordering::AcqRel);
        crate::namespace::clear_kept(ns);
        if let Some(functions) = crate::namespace::functions(ns) {
            for (_, h) in state.namespace_hooks.iter().filter(|&&(n, _)| n == ns) {
                if let Some(i) = functions.iter().position(|&(_, hook, _)| hook == h.hook()) {
                    let (at, replaced) = h.replaced();
                    crate::namespace::set_kept(ns, i, at, replaced);
                }
            }
        }
        if let Some(stands) = state.namespaces.iter_mut().find(|s| s.namespace == ns) {
            stands.hooked = kept;
            stands.reason.clear();
            let _ = stands.reason.push_str(KEPT_REASON);
        }
    }
}

/// Why a namespace's functions are not all hooked after an uninstall that
/// kept some of its patches.
#[cfg(all(feature = "bistro", any(target_arch = "x86_64", target_arch = "aarch64")))]
const KEPT_REASON: &str = "kept at an uninstall, under another hooker's patches; the others undone";

/// The config installed, if any. Takes no lock (a handler, or a signal
/// handler whose thread is inside memhook, may ask): an install in
/// progress on another thread shows once it is made.
pub fn installed() -> Option<Config> {
    let word = CONFIG_NOW.load(core::sync::atomic::Ordering::Acquire);
    (word != 0).then(|| Config {
        hooks: HookConfig {
            cuda: ModeSet::from_bits((word >> 8) as u8),
            mmap: ModeSet::from_bits((word >> 16) as u8),
        },
    })
}

/// [`Installed::config`], read without [`INSTALLED`]'s lock by
/// [`installed`]: 0 for none; else bit 0, the CUDA modes' bits in the
/// second byte and the host's in the third.
static CONFIG_NOW: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);

/// Sets the installed config, in `state` and in [`CONFIG_NOW`] (after the
/// install or uninstall it describes is made).
fn set_config(state: &mut Installed, config: Option<Config>) {
    state.config = config;
    let word = config.map_or(0, |c| {
        1 | u32::from(c.hooks.cuda.bits()) << 8 | u32::from(c.hooks.mmap.bits()) << 16
    });
    CONFIG_NOW.store(word, core::sync::atomic::Ordering::Release);
}

/// Whether memhook's load-time preparation (building the x86_64 decoder's
/// tables, so that install never allocates) has run. It runs from an ELF
/// constructor before `main`.
pub fn prepared() -> bool {
    #[cfg(all(feature = "bistro", target_arch = "x86_64"))]
    return warm_up::done();
    #[cfg(not(all(feature = "bistro", target_arch = "x86_64")))]
    true
}

/// The x86_64 decoder (iced-x86) builds its tables on first use, with a few
/// thousand allocations. memhook does that once, in an ELF constructor,
/// before `main`, so that install and hook paths never allocate. An
/// embedder whose allocator installs memhook from its first allocation may
/// be called from inside that build: such an install is deferred to the end
/// of it (re-entering the decoder there would wait for itself).
#[cfg(all(feature = "bistro", target_arch = "x86_64"))]
mod warm_up {
    use core::sync::atomic::{AtomicBool, Ordering};

    use memhook_core::patch::Arch;

    use super::Config;

    static WARMING: AtomicBool = AtomicBool::new(false);
    static DONE: AtomicBool = AtomicBool::new(false);
    static PENDING: crate::fork::Mutex<Option<Config>> = crate::fork::Mutex::new(None);

    /// Records `config` for after the warm-up if one is running now.
    pub(super) fn defer(config: &Config) -> bool {
        if !WARMING.load(Ordering::Acquire) {
            return false;
        }
        *PENDING.lock() = Some(*config);
        true
    }

    /// Whether the load-time warm-up has run.
    pub fn done() -> bool {
        DONE.load(Ordering::Acquire)
    }

    /// Builds the decoder's tables (idempotent), then runs a deferred install.
    pub fn warm_up() {
        if DONE.swap(true, Ordering::AcqRel) {
            return;
        }
        WARMING.store(true, Ordering::Release);
        // One decode builds every table.
        let _ = memhook_x86_64::X86_64::relocate(&[0x90; 16], 0x10000, 5, 0x20000);
        WARMING.store(false, Ordering::Release);
        let pending = PENDING.lock().take();
        if let Some(config) = pending {
            super::install(&config);
        }
    }

    extern "C" fn at_load() {
        warm_up();
    }

    /// Runs at load, before `main` (or when the library is dlopen'ed).
    #[used]
    #[unsafe(link_section = ".init_array")]
    static AT_LOAD: extern "C" fn() = at_load;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary is dynamically linked (its headers name the
    /// loader): not taken for a static program, whose host functions
    /// memhook leaves alone (`static_program.c` checks the other side).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn a_dynamically_linked_program_is_not_taken_for_a_static_one() {
        assert!(!statically_linked());
    }

    /// Where memhook's own work on a thread is interrupted (here the
    /// install state held by the thread itself, as a signal handler that
    /// interrupted an install finds it), an install, an uninstall and the
    /// status asked for there return at once: the install and uninstall
    /// refused with [`InsideMemhook`], nothing changed, the status empty.
    /// Before, each waited for the lock its own thread held, for good
    /// (here the check thread would never answer).
    #[test]
    fn calls_inside_memhooks_own_work_return_at_once() {
        let config = Config::parse("mmap=reloc;cuda=none").unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let held = INSTALLED.lock();
            let answers = (
                inside_memhook(),
                try_install(&config),
                install_unless_installed(&config),
                try_uninstall(),
                status().len(),
                status_at(0),
                namespaces().len(),
                installed(),
            );
            drop(held);
            tx.send((answers, inside_memhook())).unwrap();
        });
        let Ok((answers, after)) = rx.recv_timeout(std::time::Duration::from_secs(60)) else {
            panic!("a call inside memhook's own work waited for the lock its own thread holds");
        };
        let (inside, install, unless, uninstall, status, status_at, namespaces, installed) = answers;
        assert!(inside);
        assert_eq!(install, Err(InsideMemhook));
        assert_eq!(unless, Err(InsideMemhook));
        assert_eq!(uninstall, Err(InsideMemhook));
        assert_eq!((status, status_at, namespaces), (0, (None, 0), 0));
        assert_eq!(installed, None, "nothing was installed");
        assert!(!after);
        assert!(InsideMemhook.to_string().contains("signal handler"));
    }
}

//! Conversion between the core's events and the C union, and the calls of
//! SPEC.md's "Stable interfaces" that take them.

use core::ffi::{CStr, c_char, c_int, c_void};

use memhook::event::{
    BrkEvent, Event, MadviseEvent, MemTypeEvent, MmapEvent, MremapEvent, MunmapEvent, SbrkEvent, ShmatEvent,
    ShmdtEvent, VmEvent, bits,
};
use memhook::memtype::{Lookup, MemType};
use memhook::{Config, HandlerFn};

use super::*;

fn p(v: usize) -> *mut c_void {
    v as *mut c_void
}

/// The C form of `e`.
pub(crate) fn to_c(e: &Event) -> memhook_event_t {
    match *e {
        Event::Mmap(m) => memhook_event_t {
            mmap: memhook_mmap_event_t {
                result: p(m.result),
                address: p(m.address),
                size: m.size,
                prot: m.prot,
                flags: m.flags,
                fd: m.fd,
                offset: m.offset,
            },
        },
        Event::Munmap(m) => memhook_event_t {
            munmap: memhook_munmap_event_t {
                result: m.result,
                address: p(m.address),
                size: m.size,
            },
        },
        Event::Mremap(m) => memhook_event_t {
            mremap: memhook_mremap_event_t {
                result: p(m.result),
                address: p(m.address),
                old_size: m.old_size,
                new_size: m.new_size,
                flags: m.flags,
                new_address: p(m.new_address),
            },
        },
        Event::Shmat(m) => memhook_event_t {
            shmat: memhook_shmat_event_t {
                result: p(m.result),
                shmid: m.shmid,
                shmaddr: m.shmaddr as *const c_void,
                shmflg: m.shmflg,
            },
        },
        Event::Shmdt(m) => memhook_event_t {
            shmdt: memhook_shmdt_event_t {
                result: m.result,
                shmaddr: m.shmaddr as *const c_void,
            },
        },
        Event::Sbrk(m) => memhook_event_t {
            sbrk: memhook_sbrk_event_t {
                result: p(m.result),
                increment: m.increment,
            },
        },
        Event::Brk(m) => memhook_event_t {
            brk: memhook_brk_event_t {
                result: m.result,
                addr: p(m.addr),
            },
        },
        Event::Madvise(m) => memhook_event_t {
            madvise: memhook_madvise_event_t {
                result: m.result,
                addr: p(m.addr),
                length: m.length,
                advice: m.advice,
            },
        },
        Event::VmMapped(v) | Event::VmUnmapped(v) => memhook_event_t {
            vm: memhook_vm_event_t {
                address: p(v.address),
                size: v.size,
            },
        },
        Event::MemTypeAlloc(m) | Event::MemTypeFree(m) => memhook_event_t {
            mem_type: memhook_mem_type_event_t {
                address: p(m.address),
                size: m.size,
                mem_type: m.mem_type,
            },
        },
    }
}

/// The core form of a C event of type `kind` (a single event bit).
///
/// # Safety
///
/// `c`'s member for `kind` must be initialised.
pub(crate) unsafe fn from_c(kind: u32, c: &memhook_event_t) -> Option<Event> {
    // SAFETY: every arm reads the member `kind` names, which the caller
    // initialised.
    unsafe {
        Some(match kind {
            bits::MMAP => {
                let m = c.mmap;
                Event::Mmap(MmapEvent {
                    result: m.result as usize,
                    address: m.address as usize,
                    size: m.size,
                    prot: m.prot,
                    flags: m.flags,
                    fd: m.fd,
                    offset: m.offset,
                })
            }
            bits::MUNMAP => {
                let m = c.munmap;
                Event::Munmap(MunmapEvent {
                    result: m.result,
                    address: m.address as usize,
                    size: m.size,
                })
            }
            bits::MREMAP => {
                let m = c.mremap;
                Event::Mremap(MremapEvent {
                    result: m.result as usize,
                    address: m.address as usize,
                    old_size: m.old_size,
                    new_size: m.new_size,
                    flags: m.flags,
                    new_address: m.new_address as usize,
                })
            }
            bits::SHMAT => {
                let m = c.shmat;
                Event::Shmat(ShmatEvent {
                    result: m.result as usize,
                    shmid: m.shmid,
                    shmaddr: m.shmaddr as usize,
                    shmflg: m.shmflg,
                })
            }
            bits::SHMDT => {
                let m = c.shmdt;
                Event::Shmdt(ShmdtEvent {
                    result: m.result,
                    shmaddr: m.shmaddr as usize,
                })
            }
            bits::SBRK => {
                let m = c.sbrk;
                Event::Sbrk(SbrkEvent {
                    result: m.result as usize,
                    increment: m.increment,
                })
            }
            bits::BRK => {
                let m = c.brk;
                Event::Brk(BrkEvent {
                    result: m.result,
                    addr: m.addr as usize,
                })
            }
            bits::MADVISE => {
                let m = c.madvise;
                Event::Madvise(MadviseEvent {
                    result: m.result,
                    addr: m.addr as usize,
                    length: m.length,
                    advice: m.advice,
                })
            }
            bits::VM_MAPPED => Event::VmMapped(VmEvent {
                address: c.vm.address as usize,
                size: c.vm.size,
            }),
            bits::VM_UNMAPPED => Event::VmUnmapped(VmEvent {
                address: c.vm.address as usize,
                size: c.vm.size,
            }),
            bits::MEM_TYPE_ALLOC | bits::MEM_TYPE_FREE => {
                let m = c.mem_type;
                let e = MemTypeEvent {
                    address: m.address as usize,
                    size: m.size,
                    mem_type: m.mem_type,
                };
                if kind == bits::MEM_TYPE_ALLOC {
                    Event::MemTypeAlloc(e)
                } else {
                    Event::MemTypeFree(e)
                }
            }
            _ => return None,
        })
    }
}

/// Asserts at compile time that C struct `$c` has Rust payload `$r`'s
/// layout: the same size and alignment, and each field named (the two
/// structs name their fields alike) at the same offset with the same size.
macro_rules! same_layout {
    ($c:ty = $r:ty { $($f:ident),* $(,)? }) => {
        const _: () = {
            // SAFETY: both are structs of integers and raw pointers, for
            // which all zeros is a value.
            let (c, r): ($c, $r) = unsafe { (core::mem::zeroed(), core::mem::zeroed()) };
            assert!(size_of::<$c>() == size_of::<$r>() && align_of::<$c>() == align_of::<$r>());
            $(assert!(
                core::mem::offset_of!($c, $f) == core::mem::offset_of!($r, $f)
                    && size_of_val(&c.$f) == size_of_val(&r.$f)
            );)*
        };
    };
}

// Each member of the C union is its kind's payload in the core's event,
// field for field, so a C handler is handed the event's payload itself
// ([`call_c`]).
same_layout!(
    memhook_mmap_event_t = MmapEvent {
        result,
        address,
        size,
        prot,
        flags,
        fd,
        offset,
    }
);
same_layout!(memhook_munmap_event_t = MunmapEvent { result, address, size });
same_layout!(
    memhook_mremap_event_t = MremapEvent {
        result,
        address,
        old_size,
        new_size,
        flags,
        new_address,
    }
);
same_layout!(
    memhook_shmat_event_t = ShmatEvent {
        result,
        shmid,
        shmaddr,
        shmflg
    }
);
same_layout!(memhook_shmdt_event_t = ShmdtEvent { result, shmaddr });
same_layout!(memhook_sbrk_event_t = SbrkEvent { result, increment });
same_layout!(memhook_brk_event_t = BrkEvent { result, addr });
same_layout!(
    memhook_madvise_event_t = MadviseEvent {
        result,
        addr,
        length,
        advice
    }
);
same_layout!(memhook_vm_event_t = VmEvent { address, size });
same_layout!(
    memhook_mem_type_event_t = MemTypeEvent {
        address,
        size,
        mem_type
    }
);
// The whole union fits in an event from its payload on (a handler may
// write any member), at an offset aligned for it.
const _: () = assert!(
    Event::PAYLOAD_OFFSET + size_of::<memhook_event_t>() <= size_of::<Event>()
        && Event::PAYLOAD_OFFSET.is_multiple_of(align_of::<memhook_event_t>())
        && align_of::<Event>() >= align_of::<memhook_event_t>()
);

/// Calls a C handler (`a` is the callback, `b` its argument) with the
/// event's payload in place as the C union: what it changes is the
/// event's, with no copy either way (before the fifty-fifth session the
/// event was converted to the union and back around each call: 72 of the
/// 581 instructions one C handler added to an mmap+munmap pair).
///
/// # Safety
///
/// `a` is a `memhook_event_cb` that was non-null at registration.
unsafe fn call_c(a: usize, b: usize, event: &mut Event) {
    // SAFETY: the caller's contract: `a` is the registered callback.
    let cb: unsafe extern "C" fn(u32, *mut memhook_event_t, *mut c_void) = unsafe { core::mem::transmute(a) };
    let kind = event.kind();
    // SAFETY: the callback's contract (memhook.h): it gets the event and
    // the argument it registered. The pointer is `event`'s payload, borrowed
    // exclusively for the call: the member for `kind` has that payload's
    // layout (asserted above), every byte of the union lies inside the event
    // (asserted above), and any bits the handler writes there leave the
    // event valid (its fields are plain integers; the tag, which says the
    // kind, lies before the payload, out of its reach).
    unsafe { cb(kind, event.payload_ptr().cast::<memhook_event_t>(), b as *mut c_void) };
}

fn handler(cb: memhook_event_cb, arg: *mut c_void) -> Option<HandlerFn> {
    cb.map(|f| HandlerFn::Raw {
        func: call_c,
        a: f as usize,
        b: arg as usize,
    })
}

/// Installs the hooks `config` names (`"cuda=bistro,reloc;mmap=bistro"`;
/// NULL: from `MEMHOOK_MMAP_HOOK_MODE` and `MEMHOOK_CUDA_HOOK_MODE`).
/// Installing the same configuration again does nothing. From a signal
/// handler that interrupted memhook's own work on its thread (its install
/// or uninstall among them), it does nothing and fails with
/// `MEMHOOK_ERR_BUSY` rather than wait for itself.
///
/// # Safety
///
/// `config` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_install(config: *const c_char) -> c_int {
    guard(|| {
        let parsed = if config.is_null() {
            Config::from_env()
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            match unsafe { CStr::from_ptr(config) }.to_str() {
                Ok(s) => Config::parse(s),
                Err(_) => return fail(MEMHOOK_ERR_CONFIG, format_args!("memhook_install: config is not UTF-8")),
            }
        };
        match parsed {
            Ok(c) => match memhook::try_install(&c) {
                Ok(()) => MEMHOOK_OK,
                Err(e) => fail(MEMHOOK_ERR_BUSY, format_args!("memhook_install: {e}")),
            },
            Err(e) => fail(MEMHOOK_ERR_CONFIG, format_args!("{e}")),
        }
    })
}

/// Undoes every patch; handlers stay registered. From a signal handler
/// that interrupted memhook's own work on its thread, it does nothing and
/// fails with `MEMHOOK_ERR_BUSY`.
#[unsafe(no_mangle)]
pub extern "C" fn memhook_uninstall() -> c_int {
    guard(|| match memhook::try_uninstall() {
        Ok(()) => MEMHOOK_OK,
        Err(e) => fail(MEMHOOK_ERR_BUSY, format_args!("memhook_uninstall: {e}")),
    })
}

/// Registers `cb(event_type, event, arg)` for `events` at `priority` (< 0
/// before the original call, >= 0 after). Unless `events` has
/// `MEMHOOK_EVENT_FLAG_NO_INSTALL`, hooks are installed from the environment
/// first if none are.
///
/// # Safety
///
/// `cb` must be safe to call from any thread with any `arg` given here,
/// must not allocate and must not block on anything a hooked call can hold.
/// It runs inside calls that are not cancellation points (`mmap`, `malloc`'s
/// calls of it, the CUDA driver's): one that calls a cancellation point
/// (`write`, `printf`) on a thread another may cancel should turn
/// cancellation off around it (`pthread_setcancelstate`).
///
/// It may be called from a signal handler once memhook is installed (or
/// with `MEMHOOK_EVENT_FLAG_NO_INSTALL`). Where the signal interrupted
/// this thread's own change of the handlers, it fails
/// (`MEMHOOK_ERR_HANDLER`) rather than wait for itself; where nothing is
/// installed yet and the signal interrupted memhook's own work on this
/// thread (its first install among them), it installs nothing and fails
/// with `MEMHOOK_ERR_BUSY`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_set_event_handler(
    events: u32,
    priority: c_int,
    cb: memhook_event_cb,
    arg: *mut c_void,
) -> c_int {
    guard(|| {
        let Some(h) = handler(cb, arg) else {
            return fail(
                MEMHOOK_ERR_INVALID,
                format_args!("memhook_set_event_handler: callback is NULL"),
            );
        };
        // A bad mask installs nothing on its way to the error.
        if let Err(e) = bits::check_mask(events) {
            return fail(MEMHOOK_ERR_HANDLER, format_args!("memhook_set_event_handler: {e}"));
        }
        // Once installed, no lock is taken on the way to the dispatcher
        // (whose own refuses a change from a signal handler that
        // interrupted this thread's).
        if events & bits::NO_INSTALL == 0 && memhook::installed().is_none() {
            match Config::from_env() {
                Ok(c) => {
                    if let Err(e) = memhook::install_unless_installed(&c) {
                        return fail(MEMHOOK_ERR_BUSY, format_args!("memhook_set_event_handler: {e}"));
                    }
                }
                Err(e) => return fail(MEMHOOK_ERR_CONFIG, format_args!("{e}")),
            }
        }
        match memhook::set_handler(events, priority, h) {
            Ok(_) => MEMHOOK_OK,
            Err(e) => fail(MEMHOOK_ERR_HANDLER, format_args!("memhook_set_event_handler: {e}")),
        }
    })
}

/// Removes `events` from the registrations of `(cb, arg)`; a registration
/// left with no event goes. When it returns, a removed handler is not
/// running and will not run. Called from inside a handler, or from a
/// signal handler that interrupted its own thread's change of the
/// handlers, it removes nothing (it would wait for itself), and
/// `memhook_last_error()` says so.
///
/// # Safety
///
/// None beyond passing what was registered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_unset_event_handler(events: u32, cb: memhook_event_cb, arg: *mut c_void) {
    let _ = guard(|| {
        if let Some(h) = handler(cb, arg)
            && let Err(e) = memhook::unset_handler_fn(events, &h)
        {
            return fail(MEMHOOK_ERR_HANDLER, format_args!("memhook_unset_event_handler: {e}"));
        }
        MEMHOOK_OK
    });
}

/// Delivers an event the caller observed itself (e.g. an allocator's own
/// mappings, with `MEMHOOK_EVENT_FLAG_NO_INSTALL`) to every handler;
/// `MEM_TYPE` events also update the memory-type map. A
/// `MEMHOOK_EVENT_MEM_TYPE_FREE` of size 0 (not known to the caller) ends
/// the allocation recorded at its address, and `event` gets its size. A
/// `VM` or `MEM_TYPE` range past the end of the address space is refused
/// (`MEMHOOK_ERR_INVALID`), unrecorded and undelivered.
///
/// # Safety
///
/// `event` points to an event whose member for `event_type` is set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_report_event(event_type: u32, event: *mut memhook_event_t) -> c_int {
    guard(|| {
        if event.is_null() {
            return fail(MEMHOOK_ERR_INVALID, format_args!("memhook_report_event: event is NULL"));
        }
        // SAFETY: the caller set the member for `event_type`.
        let Some(mut e) = (unsafe { from_c(event_type, &*event) }) else {
            return fail(
                MEMHOOK_ERR_INVALID,
                format_args!("memhook_report_event: {event_type:#x} is not one event type"),
            );
        };
        if let Err(e) = memhook::report_event(&mut e) {
            return fail(MEMHOOK_ERR_INVALID, format_args!("memhook_report_event: {e}"));
        }
        // SAFETY: `event` is non-null and the caller's to write.
        unsafe { *event = to_c(&e) };
        MEMHOOK_OK
    })
}

/// What the memory-type map says about `[addr, addr + len)`, without calling
/// any driver: the recorded type, `MEMHOOK_MEM_TYPE_HOST` for an address in
/// no recorded range, `MEMHOOK_MEM_TYPE_UNKNOWN` when the range straddles
/// an edge or the map had to drop ranges there. Safe from any thread.
///
/// # Safety
///
/// `info` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_memtype_lookup(
    addr: *const c_void,
    len: usize,
    info: *mut memhook_mem_info_t,
) -> c_int {
    if info.is_null() {
        return fail(
            MEMHOOK_ERR_INVALID,
            format_args!("memhook_memtype_lookup: info is NULL"),
        );
    }
    let out = info_of(memhook::memtype::lookup(addr as usize, len), addr as usize, len);
    // SAFETY: non-null and the caller's to write.
    unsafe { *info = out };
    MEMHOOK_OK
}

/// The C form of a lookup's answer (Absent reads as host).
fn info_of(answer: Lookup, addr: usize, len: usize) -> memhook_mem_info_t {
    match answer {
        Lookup::Found(i) => memhook_mem_info_t {
            mem_type: i.mem_type as u32,
            device: i.device,
            base: p(i.base),
            len: i.len,
        },
        Lookup::Absent => memhook_mem_info_t {
            mem_type: MemType::Host as u32,
            device: -1,
            base: p(addr),
            len,
        },
        Lookup::Unknown => memhook_mem_info_t {
            mem_type: MemType::Unknown as u32,
            device: -1,
            base: p(addr),
            len,
        },
    }
}

/// What the driver says about `[addr, addr + len)`
/// (`cuPointerGetAttributes`, loading libcuda if the process has not):
/// the answer (the allocation's range; for memory mapped into a reserved
/// range with `cuMemMap`, the mapping's) is recorded in the map for later
/// lookups, except in a CUDA graph's allocation, whose memory comes and
/// goes with the graph's launches (the map keeps it `MEM_TYPE_UNKNOWN`). `MEM_TYPE_UNKNOWN`
/// when there is no driver, it refuses, or the range spans allocations.
/// Calls the driver: use [`memhook_memtype_lookup`] first. Ask only about
/// memory known to be allocated: a free of it on another thread at the
/// same moment can leave the freed range recorded.
///
/// # Safety
///
/// `info` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_memtype_classify(
    addr: *const c_void,
    len: usize,
    info: *mut memhook_mem_info_t,
) -> c_int {
    if info.is_null() {
        return fail(
            MEMHOOK_ERR_INVALID,
            format_args!("memhook_memtype_classify: info is NULL"),
        );
    }
    guard(|| {
        let out = info_of(memhook::memtype::classify(addr as usize, len), addr as usize, len);
        // SAFETY: non-null and the caller's to write.
        unsafe { *info = out };
        MEMHOOK_OK
    })
}

/// The address that runs `function` past memhook's hook, for calls that
/// must go unreported (an allocator's own mappings, as UCM's
/// `ucm_orig_mmap`): a host function (`"mmap"`, `"munmap"`, `"mremap"`,
/// `"shmat"`, `"shmdt"`, `"brk"`, `"sbrk"`, `"madvise"`,
/// `"process_madvise"`, `"fallocate"`, `"ftruncate"`, `"truncate"`,
/// `"remap_file_pages"`, `"open"`, `"openat"`, `"shm_open"`,
/// `"syscall"`, `"creat"`, `"ioctl"`) or a hooked CUDA
/// function (`"cuMemAlloc_v2"`, `"cudaMalloc"`, ...). Cast it to the
/// function's own type. NULL, with `memhook_last_error` saying why, for a
/// name memhook does not hook, or a function it has not hooked (yet). The
/// address stays valid for the process's life (a CUDA function's, while
/// its library stays loaded).
///
/// # Safety
///
/// `function` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memhook_original(function: *const c_char) -> *mut c_void {
    if function.is_null() {
        fail(MEMHOOK_ERR_INVALID, format_args!("memhook_original: function is NULL"));
        return core::ptr::null_mut();
    }
    // SAFETY: non-null, and NUL-terminated by the caller's contract.
    let name = unsafe { CStr::from_ptr(function) }.to_string_lossy();
    let found = memhook::host::original(&name);
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    let found = found.or_else(|| memhook::cuda::original(&name));
    match found {
        Some(address) => address as *mut c_void,
        None => {
            fail(
                MEMHOOK_ERR_NOT_FOUND,
                format_args!("memhook_original: memhook has not hooked `{name}`"),
            );
            core::ptr::null_mut()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One event of every kind, each field a different value.
    fn one_of_each() -> Vec<Event> {
        let vm = VmEvent {
            address: 0x7000,
            size: 0x1000,
        };
        let mt = MemTypeEvent {
            address: 0x9000,
            size: 0x2000,
            mem_type: 2,
        };
        vec![
            Event::Mmap(MmapEvent {
                result: 0x1000,
                address: 0x2000,
                size: 3,
                prot: 4,
                flags: 5,
                fd: 6,
                offset: 7,
            }),
            Event::Munmap(MunmapEvent {
                result: -1,
                address: 0x3000,
                size: 8,
            }),
            Event::Mremap(MremapEvent {
                result: 0x4000,
                address: 0x5000,
                old_size: 9,
                new_size: 10,
                flags: 11,
                new_address: 0x6000,
            }),
            Event::Shmat(ShmatEvent {
                result: 0x8000,
                shmid: 12,
                shmaddr: 0xa000,
                shmflg: 13,
            }),
            Event::Shmdt(ShmdtEvent {
                result: 14,
                shmaddr: 0xb000,
            }),
            Event::Sbrk(SbrkEvent {
                result: 0xc000,
                increment: -15,
            }),
            Event::Madvise(MadviseEvent {
                result: 16,
                addr: 0xd000,
                length: 17,
                advice: 18,
            }),
            Event::Brk(BrkEvent {
                result: 19,
                addr: 0xe000,
            }),
            Event::VmMapped(vm),
            Event::VmUnmapped(vm),
            Event::MemTypeAlloc(mt),
            Event::MemTypeFree(mt),
        ]
    }

    /// `e` with every field changed.
    fn changed(e: &Event) -> Event {
        macro_rules! bump {
            ($m:ident: $($f:ident),*) => {{ $($m.$f += 1;)* }};
        }
        let mut e = *e;
        match &mut e {
            Event::Mmap(m) => bump!(m: result, address, size, prot, flags, fd, offset),
            Event::Munmap(m) => bump!(m: result, address, size),
            Event::Mremap(m) => bump!(m: result, address, old_size, new_size, flags, new_address),
            Event::Shmat(m) => bump!(m: result, shmid, shmaddr, shmflg),
            Event::Shmdt(m) => bump!(m: result, shmaddr),
            Event::Sbrk(m) => bump!(m: result, increment),
            Event::Madvise(m) => bump!(m: result, addr, length, advice),
            Event::Brk(m) => bump!(m: result, addr),
            Event::VmMapped(v) | Event::VmUnmapped(v) => bump!(v: address, size),
            Event::MemTypeAlloc(m) | Event::MemTypeFree(m) => bump!(m: address, size, mem_type),
        }
        e
    }

    /// A C handler that reads its kind's member as C does, notes it (in
    /// `arg`, an `Option<Event>`), and writes the whole union back with
    /// every field of that member changed.
    extern "C" fn rewrite(kind: u32, event: *mut memhook_event_t, arg: *mut c_void) {
        // SAFETY: call_c hands over the event's payload as the union, its
        // member for `kind` set; `arg` is the test's `Option<Event>`.
        unsafe {
            let seen = from_c(kind, &*event).expect("one event kind");
            *arg.cast::<Option<Event>>() = Some(seen);
            *event = to_c(&changed(&seen));
        }
    }

    /// The address the report test's event asks for.
    const ASKED: usize = 0x5eed_0000;
    /// The mapping its pre-handler supplies.
    const SUPPLIED: usize = 0x7a11_0000;

    /// A pre-handler of `MMAP` that supplies a result for the test's call.
    extern "C" fn supply(kind: u32, event: *mut memhook_event_t, _: *mut c_void) {
        // SAFETY: an MMAP event's member is `mmap`.
        unsafe {
            if kind == MEMHOOK_EVENT_MMAP && (*event).mmap.address as usize == ASKED {
                (*event).mmap.result = SUPPLIED as *mut c_void;
            }
        }
    }

    /// A post-handler of `MMAP` that notes the result it sees (in `arg`, an
    /// `AtomicUsize`).
    extern "C" fn note(kind: u32, event: *mut memhook_event_t, arg: *mut c_void) {
        // SAFETY: as above; `arg` is the test's `AtomicUsize`.
        unsafe {
            if kind == MEMHOOK_EVENT_MMAP && (*event).mmap.address as usize == ASKED {
                let seen = &*arg.cast::<core::sync::atomic::AtomicUsize>();
                seen.store((*event).mmap.result as usize, core::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    #[test]
    fn a_pre_handlers_result_reaches_the_post_handler_and_the_reporter() {
        let seen = core::sync::atomic::AtomicUsize::new(0);
        let seen_arg = (&raw const seen).cast_mut().cast::<c_void>();
        let flags = MEMHOOK_EVENT_MMAP | MEMHOOK_EVENT_FLAG_NO_INSTALL;
        // SAFETY: both handlers are memhook_event_cb; `seen` outlives them
        // (unset below).
        unsafe {
            assert_eq!(
                memhook_set_event_handler(flags, -1, Some(supply), core::ptr::null_mut()),
                MEMHOOK_OK
            );
            assert_eq!(memhook_set_event_handler(flags, 1, Some(note), seen_arg), MEMHOOK_OK);
        }
        let mut event = to_c(&Event::Mmap(MmapEvent {
            result: memhook::event::INVALID_PTR,
            address: ASKED,
            size: 4096,
            prot: 0,
            flags: 0,
            fd: -1,
            offset: 0,
        }));
        // SAFETY: the member for MMAP is set.
        let rc = unsafe { memhook_report_event(MEMHOOK_EVENT_MMAP, &mut event) };
        // SAFETY: as registered.
        unsafe {
            memhook_unset_event_handler(flags, Some(supply), core::ptr::null_mut());
            memhook_unset_event_handler(flags, Some(note), seen_arg);
        }
        assert_eq!(rc, MEMHOOK_OK);
        let seen = seen.load(core::sync::atomic::Ordering::Relaxed);
        assert_eq!(seen, SUPPLIED, "the post-handler sees the pre-handler's result");
        // SAFETY: report_event wrote the MMAP member back.
        let reported = unsafe { event.mmap.result } as usize;
        assert_eq!(reported, SUPPLIED, "and so does the reporter");
    }

    #[test]
    fn a_c_handler_reads_and_changes_the_event_itself() {
        let mut kinds = 0;
        for e in one_of_each() {
            kinds |= e.kind();
            let mut event = e;
            let mut seen: Option<Event> = None;
            // SAFETY: `rewrite` is a memhook_event_cb; its argument is `seen`.
            unsafe { call_c(rewrite as *const () as usize, (&raw mut seen).addr(), &mut event) };
            assert_eq!(seen, Some(e), "the handler saw every field of {e:?}");
            assert_eq!(event, changed(&e), "the handler's writes are the event's");
        }
        assert_eq!(kinds, bits::ALL_EVENTS, "every kind is covered");
    }
}

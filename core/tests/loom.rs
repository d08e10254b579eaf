//! loom models of memhook-core's shared state.
//!
//! Run: `RUSTFLAGS="--cfg memhook_loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p memhook-core --test loom --release`
#![cfg(memhook_loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use memhook_core::event::{Asymmetric, DispatchDepth, Dispatcher, Event, FnHandler, MunmapEvent, bits};
use memhook_core::memtype::{Lookup, MemInfo, MemType, MemtypeMap};

fn munmap() -> Event {
    Event::Munmap(MunmapEvent {
        result: -1,
        address: 0x1000,
        size: 4096,
    })
}

/// Fails the model if called after its `gone` flag was set (the flag is set
/// right after `unregister` returns); counts calls otherwise.
fn watched(_event: &mut Event, context: usize) {
    // SAFETY: context is the address of a `Watch` kept alive by an Arc until
    // every thread of the model has joined.
    let w = unsafe { &*(context as *const Watch) };
    assert!(
        !w.gone.load(Ordering::SeqCst),
        "handler called after unregister returned"
    );
    w.calls.fetch_add(1, Ordering::SeqCst);
}

struct Watch {
    gone: AtomicBool,
    calls: AtomicUsize,
}

/// One dispatch races the unregistration of its only handler; the
/// handler must not run once `unregister` has returned. `platform`:
/// readers mark the table through slots (the asymmetric handshake) rather
/// than the shared counters.
fn no_handler_after_unregister(platform: Option<&'static Asymmetric>) {
    loom::model(move || {
        let d = Arc::new(Dispatcher::<FnHandler, 2>::new());
        if let Some(p) = platform {
            d.enable_slots(p);
        }
        let watch = Arc::new(Watch {
            gone: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
        });
        let handler = FnHandler {
            func: watched,
            context: Arc::as_ptr(&watch) as usize,
        };
        let depth = DispatchDepth::new();
        let id = d.register(&depth, bits::MUNMAP, 0, handler).unwrap();

        let reader = {
            let d = d.clone();
            thread::spawn(move || {
                let depth = DispatchDepth::new();
                let mut ev = munmap();
                d.dispatch(&depth, &mut ev, |e| {
                    if let Event::Munmap(m) = e {
                        m.result = 0;
                    }
                })
                .handlers
            })
        };
        d.unregister(&depth, id).unwrap();
        watch.gone.store(true, Ordering::SeqCst);
        let handlers = reader.join().unwrap();
        // A post-handler only: it runs at most once.
        assert!(handlers <= 1);
        assert_eq!(watch.calls.load(Ordering::SeqCst), handlers as usize);
    });
}

#[test]
fn loom_no_handler_runs_after_unregister_returns() {
    no_handler_after_unregister(None);
}

/// Distinct thread ids for the models' slot readers (a plain std atomic:
/// only its uniqueness matters, not its ordering).
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Under loom the dispatcher models the barrier as a SeqCst fence on both
/// sides (loom has no asymmetric barrier), so the platform adds nothing.
static MODEL_PLATFORM: Asymmetric = Asymmetric {
    barrier: || true,
    thread_id: || NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    thread_alive: |_| true,
};

#[test]
fn loom_no_handler_runs_after_unregister_returns_with_reader_slots() {
    no_handler_after_unregister(Some(&MODEL_PLATFORM));
}

fn count(_event: &mut Event, context: usize) {
    // SAFETY: context is the address of an AtomicUsize kept alive by an Arc
    // until every thread of the model has joined.
    let n = unsafe { &*(context as *const AtomicUsize) };
    n.fetch_add(1, Ordering::SeqCst);
}

/// Registers `count` (on the counter at `ctx`) for VM_MAPPED at `priority`.
fn register_counter(d: &Dispatcher<FnHandler, 2>, depth: &DispatchDepth, priority: i32, ctx: usize) {
    d.register(
        depth,
        bits::VM_MAPPED,
        priority,
        FnHandler {
            func: count,
            context: ctx,
        },
    )
    .unwrap();
}

#[test]
fn loom_registration_is_atomic_for_concurrent_dispatch() {
    loom::model(|| {
        let d = Arc::new(Dispatcher::<FnHandler, 2>::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let ctx = Arc::as_ptr(&calls) as usize;
        let depth = DispatchDepth::new();
        register_counter(&d, &depth, 0, ctx);

        let reader = {
            let d = d.clone();
            thread::spawn(move || {
                let depth = DispatchDepth::new();
                let mut ev = Event::VmMapped(memhook_core::event::VmEvent { address: 1, size: 1 });
                d.notify(&depth, &mut ev).handlers
            })
        };
        // A second registration races the dispatch: the reader sees the old
        // table (1 handler) or the new one (2), each handler at most once.
        register_counter(&d, &depth, 1, ctx);
        let handlers = reader.join().unwrap();
        assert!(handlers == 1 || handlers == 2, "{handlers}");
        assert_eq!(calls.load(Ordering::SeqCst), handlers as usize);
        assert_eq!(d.len(), 2);
    });
}

fn info(mem_type: MemType, base: usize, len: usize) -> Lookup {
    Lookup::Found(MemInfo {
        mem_type,
        device: 0,
        base,
        len,
    })
}

/// A map holding `[0x1000, 0x1000 + len)` of the first state's type; a
/// reader looks up 0x1800 while the other states are recorded in turn
/// over the same start. The reader must see one state whole (type and
/// extent together), and a lookup afterwards the last.
fn reader_beside_updates(states: &[(MemType, usize)]) {
    let states = states.to_vec();
    loom::model(move || {
        let map = Arc::new(MemtypeMap::<2>::new());
        let (first, len) = states[0];
        map.insert(0x1000, len, first, 0).unwrap();
        let reader = {
            let map = map.clone();
            thread::spawn(move || map.lookup(0x1800, 8))
        };
        for &(mem_type, len) in &states[1..] {
            map.insert(0x1000, len, mem_type, 0).unwrap();
        }
        let seen = reader.join().unwrap();
        assert!(states.iter().any(|&(t, len)| seen == info(t, 0x1000, len)), "{seen:?}");
        let &(last, len) = states.last().unwrap();
        assert_eq!(map.lookup(0x1800, 8), info(last, 0x1000, len));
    });
}

#[test]
fn loom_map_reader_sees_old_or_new_entry_never_a_mix() {
    // Replace the range with another type.
    reader_beside_updates(&[(MemType::Cuda, 0x1000), (MemType::CudaManaged, 0x1000)]);
}

/// Two updates while a reader looks up: the second rewrites the very
/// table the reader may have started on (the live one before the first),
/// so the reader's validation must catch it. Each state has its own type
/// and extent, so that a mix of two is not one of them.
#[test]
fn loom_map_reader_across_two_updates_sees_one_state() {
    reader_beside_updates(&[
        (MemType::Cuda, 0x1000),
        (MemType::CudaManaged, 0x2000),
        (MemType::CudaHost, 0x3000),
    ]);
}

#[test]
fn loom_map_reader_during_split_sees_whole_or_split() {
    loom::model(|| {
        let map = Arc::new(MemtypeMap::<2>::new());
        map.insert(0x1000, 0x3000, MemType::Cuda, 0).unwrap();
        let reader = {
            let map = map.clone();
            thread::spawn(move || (map.lookup(0x1000, 8), map.lookup(0x2800, 8)))
        };
        map.remove(0x2000, 0x1000).unwrap();
        let (left, middle) = reader.join().unwrap();
        // The left part is Cuda throughout, with the old or new extent.
        assert!(
            left == info(MemType::Cuda, 0x1000, 0x3000) || left == info(MemType::Cuda, 0x1000, 0x1000),
            "{left:?}"
        );
        // The removed middle is the old entry or absent: never another type.
        assert!(
            middle == info(MemType::Cuda, 0x1000, 0x3000) || middle == Lookup::Absent,
            "{middle:?}"
        );
        assert_eq!(map.lookup(0x3000, 8), info(MemType::Cuda, 0x3000, 0x1000));
    });
}

mod patch_protocol {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicU8, AtomicU16, AtomicUsize, Ordering, fence};
    use loom::thread;
    use memhook_core::patch::{CodeMemory, PatchError, RestorePoint, undo_patches, write_patch, write_patches};

    const BASE: usize = 0x1000;
    /// Entry `k` of a model with several is at `BASE + k * LINE`.
    const LINE: usize = 64;
    const LOCK: [u8; 2] = [0xeb, 0xfe];

    /// Five bytes of code: the head (the first two, written by one store,
    /// as the lock and the head are) and the tail.
    struct Code {
        head: AtomicU16,
        tail: [AtomicU8; 3],
        /// Threads in the middle of fetching the entry instruction.
        fetching: AtomicUsize,
    }

    impl Code {
        fn new(bytes: [u8; 5]) -> Self {
            Code {
                head: AtomicU16::new(u16::from_le_bytes([bytes[0], bytes[1]])),
                tail: [
                    AtomicU8::new(bytes[2]),
                    AtomicU8::new(bytes[3]),
                    AtomicU8::new(bytes[4]),
                ],
                fetching: AtomicUsize::new(0),
            }
        }

        /// What a thread arriving at the entry executes: one fetch of the
        /// instruction there, or `None` when it is the lock (`jmp $`, which
        /// only sends it to fetch again: a later fetch, which the models
        /// check separately). A fetch is one unit for serialisation: the
        /// IPI of a SYNC_CORE membarrier is taken at an instruction boundary.
        fn fetch(&self) -> Option<[u8; 5]> {
            self.fetching.fetch_add(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            let head = self.head.load(Ordering::Acquire).to_le_bytes();
            let seen = (head != LOCK).then(|| {
                let t: Vec<u8> = self.tail.iter().map(|b| b.load(Ordering::Relaxed)).collect();
                [head[0], head[1], t[0], t[1], t[2]]
            });
            self.fetching.fetch_sub(1, Ordering::Release);
            seen
        }
    }

    /// CodeMemory over the model: stores as the Linux one does them;
    /// serialisation (membarrier SYNC_CORE) returns once every fetch that
    /// began before it has finished. Entry `k` is `BASE + k * LINE`.
    struct Writer(Vec<Arc<Code>>);

    impl Writer {
        fn one(code: Arc<Code>) -> Self {
            Writer(vec![code])
        }

        /// The entry holding `at`, and `at`'s offset in it.
        fn entry(&self, at: usize) -> (&Code, usize) {
            let k = (at - BASE) / LINE;
            (&self.0[k], at - BASE - k * LINE)
        }
    }

    impl CodeMemory for Writer {
        fn make_writable(&mut self, _at: usize, _len: usize) -> Result<(), PatchError> {
            Ok(())
        }
        fn restore_protection(&mut self, _at: usize, _len: usize) -> Result<(), PatchError> {
            Ok(())
        }
        fn read(&self, at: usize, buf: &mut [u8]) {
            let (code, off) = self.entry(at);
            let head = code.head.load(Ordering::Relaxed).to_le_bytes();
            for (i, b) in buf.iter_mut().enumerate() {
                let k = off + i;
                *b = if k < 2 {
                    head[k]
                } else {
                    code.tail[k - 2].load(Ordering::Relaxed)
                };
            }
        }
        fn write_atomic(&mut self, at: usize, bytes: &[u8]) {
            let (code, off) = self.entry(at);
            assert_eq!((off, bytes.len()), (0, 2), "one store covers the head");
            code.head
                .store(u16::from_le_bytes([bytes[0], bytes[1]]), Ordering::Release);
        }
        fn write(&mut self, at: usize, bytes: &[u8]) {
            let (code, off) = self.entry(at);
            for (i, b) in bytes.iter().enumerate() {
                code.tail[off - 2 + i].store(*b, Ordering::Relaxed);
            }
        }
        fn serialize(&mut self) {
            fence(Ordering::SeqCst);
            for code in &self.0 {
                while code.fetching.load(Ordering::Acquire) != 0 {
                    thread::yield_now();
                }
            }
        }
    }

    const OLD: [u8; 5] = [0x55, 0x48, 0x89, 0xe5, 0x41]; // push rbp; mov rbp, rsp; ...
    const NEW: [u8; 5] = [0xe9, 0x10, 0x20, 0x30, 0x40]; // jmp rel32

    /// Runs `f` under loom with room for the two spin loops of the model
    /// (the executor on the lock, the serialisation on in-flight fetches).
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.max_branches = 100_000;
        builder.check(f);
    }

    /// A thread fetching the entry instruction while it is patched gets the
    /// whole original instruction bytes or the whole new jump, never a mix.
    /// (A thread part-way through the old prologue's later instructions is
    /// outside what any entry-patching protocol can promise.)
    #[test]
    fn loom_patch_never_exposes_a_mix() {
        model(|| {
            let code = Arc::new(Code::new(OLD));
            let executor = {
                let code = code.clone();
                thread::spawn(move || code.fetch())
            };
            let restore = write_patch(&mut Writer::one(code.clone()), BASE, &NEW, &LOCK).unwrap();
            whole(executor.join().unwrap(), NEW);
            assert_eq!(code.fetch(), Some(NEW));
            assert_eq!(&restore.original[..], &OLD);
        });
    }

    /// Undo, raced by a thread fetching the entry: it runs the whole jump
    /// or the whole original first instruction, never a mix.
    #[test]
    fn loom_undo_never_exposes_a_mix() {
        model(|| {
            let code = Arc::new(Code::new(OLD));
            let mut w = Writer::one(code.clone());
            let restore = write_patch(&mut w, BASE, &NEW, &LOCK).unwrap();
            let executor = {
                let code = code.clone();
                thread::spawn(move || code.fetch())
            };
            restore.undo(&mut w, &LOCK).unwrap();
            whole(executor.join().unwrap(), NEW);
            assert_eq!(code.fetch(), Some(OLD));
        });
    }

    const NEW2: [u8; 5] = [0xe9, 0x50, 0x60, 0x70, 0x01];

    /// A fetch that saw an entry (`None`: it met the lock) saw all of
    /// `new` or all of the old bytes, never a mix.
    fn whole(seen: Option<[u8; 5]>, new: [u8; 5]) {
        if let Some(seen) = seen {
            assert!(seen == new || seen == OLD, "mixed bytes: {seen:02x?}");
        }
    }

    /// A batch of two patches, written in one pass (three serialisations
    /// for both), raced by a thread fetching each entry in turn: each fetch
    /// gets that entry's whole original bytes or its whole new jump.
    #[test]
    fn loom_batch_never_exposes_a_mix() {
        model(|| {
            let codes = vec![Arc::new(Code::new(OLD)), Arc::new(Code::new(OLD))];
            let executor = {
                let codes = codes.clone();
                thread::spawn(move || (codes[1].fetch(), codes[0].fetch()))
            };
            let mut w = Writer(codes.clone());
            let done = write_patches::<_, 2>(&mut w, &[(BASE, &NEW[..]), (BASE + LINE, &NEW2[..])], &LOCK);
            let (second, first) = executor.join().unwrap();
            whole(first, NEW);
            whole(second, NEW2);
            assert_eq!(codes[0].fetch(), Some(NEW));
            assert_eq!(codes[1].fetch(), Some(NEW2));

            // And both undone in one pass.
            let points: Vec<&RestorePoint> = done.iter().map(|p| p.as_ref().unwrap()).collect();
            let undone = undo_patches::<_, 2>(&mut w, &points, &LOCK);
            assert!(undone.iter().all(Result::is_ok));
            assert_eq!(codes[0].fetch(), Some(OLD));
            assert_eq!(codes[1].fetch(), Some(OLD));
        });
    }

    /// Undoing a batch, raced by a thread fetching each entry in turn.
    #[test]
    fn loom_batch_undo_never_exposes_a_mix() {
        model(|| {
            let codes = vec![Arc::new(Code::new(OLD)), Arc::new(Code::new(OLD))];
            let mut w = Writer(codes.clone());
            let done = write_patches::<_, 2>(&mut w, &[(BASE, &NEW[..]), (BASE + LINE, &NEW2[..])], &LOCK);
            let executor = {
                let codes = codes.clone();
                thread::spawn(move || (codes[0].fetch(), codes[1].fetch()))
            };
            let points: Vec<&RestorePoint> = done.iter().map(|p| p.as_ref().unwrap()).collect();
            let undone = undo_patches::<_, 2>(&mut w, &points, &LOCK);
            assert!(undone.iter().all(Result::is_ok));
            let (first, second) = executor.join().unwrap();
            whole(first, NEW);
            whole(second, NEW2);
            assert_eq!(codes[0].fetch(), Some(OLD));
            assert_eq!(codes[1].fetch(), Some(OLD));
        });
    }
}

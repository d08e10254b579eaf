/* A fake CUDA driver, built by the tests as libcuda.so.1 (CI has no GPU).
 *
 * Every exported driver function starts with the real entry bytes of
 * driver 580's libcuda (tests/fixtures/prologues-h200-*.tsv):
 *
 *   55                    push rbp
 *   48 89 e5              mov rbp, rsp
 *   41 54                 push r12
 *   48 83 ec 08           sub rsp, 8
 *   81 3d d32 00ba1c32    cmp dword [rip + d32], 0x321cba00   (driver torn down?)
 *   0f 84 r32             je  <error path>
 *
 * (only the two displacements differ: they point into this library), then
 * unwinds and tail-calls the fake implementation. So bistro relocates the
 * same instructions here as on the real driver, including the
 * RIP-relative compare when an entry takes the long form. (On aarch64, an
 * entry of the same shape: see ENTRY.)
 *
 * The fake work keeps a table of allocations in reserved address space
 * ("device" memory, PROT_NONE), so that cuMemGetAddressRange and
 * cuPointerGetAttributes answer like the driver. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef unsigned long long CUdeviceptr;
typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
};
enum { T_NONE = 0, T_HOST = 1, T_DEVICE = 2, T_MANAGED = 4 };
/* Device memory another process exported, opened here: only
 * cuIpcCloseMemHandle ends it. */
#define T_IPC (T_DEVICE + 32)
/* The virtual address of a graph allocation (an allocation node, or a
 * stream-ordered allocation made while the stream captures a graph):
 * reserved, with no memory until the graph runs (fake_graph_launch), and
 * unknown to cuPointerGetAttributes until then, as on the H200. */
#define T_GRAPH (T_DEVICE + 64)
/* The stream the fake takes as capturing into a graph. */
#define CAPTURING ((void *)0xca97)

/* The word the entries compare: 0x321cba00 means "torn down". */
__attribute__((used, visibility("hidden"))) uint32_t fake_state;

#if defined(__x86_64__)
#define ENTRY(name)                                                          \
    __asm__(".text\n"                                                        \
            ".globl " #name "\n"                                             \
            ".type " #name ", @function\n"                                   \
            ".p2align 4\n" #name ":\n"                                       \
            "push %rbp\n"                                                    \
            "mov %rsp, %rbp\n"                                               \
            "push %r12\n"                                                    \
            "sub $8, %rsp\n"                                                 \
            "cmpl $0x321cba00, fake_state(%rip)\n"                           \
            ".byte 0x0f, 0x84\n"                                             \
            ".long 1f - . - 4\n"                                             \
            "add $8, %rsp\n"                                                 \
            "pop %r12\n"                                                     \
            "pop %rbp\n"                                                     \
            "jmp impl_" #name "\n"                                           \
            "1:\n"                                                           \
            "add $8, %rsp\n"                                                 \
            "pop %r12\n"                                                     \
            "pop %rbp\n"                                                     \
            "mov $4, %eax\n"                                                 \
            "ret\n"                                                          \
            ".size " #name ", . - " #name "\n");
#elif defined(__aarch64__)
/* On arm64 (no driver's bytes to copy here), the shape a compiler gives
 * such an entry: a frame, then the same check of a word of the library's
 * own through adrp + ldr (page-relative: the relocator rewrites it when
 * an entry takes the long form), a conditional branch past the patched
 * bytes, and a tail call of the implementation. Only x16 and x17, the
 * intra-call scratch registers, are used: the arguments stay in x0-x7. */
#define ENTRY(name)                                                          \
    __asm__(".text\n"                                                        \
            ".globl " #name "\n"                                             \
            ".type " #name ", %function\n"                                   \
            ".p2align 4\n" #name ":\n"                                       \
            "stp x29, x30, [sp, #-16]!\n"                                    \
            "mov x29, sp\n"                                                  \
            "adrp x16, fake_state\n"                                         \
            "ldr w16, [x16, :lo12:fake_state]\n"                             \
            "mov w17, #0xba00\n"                                             \
            "movk w17, #0x321c, lsl #16\n"                                   \
            "cmp w16, w17\n"                                                 \
            "b.eq 1f\n"                                                      \
            "ldp x29, x30, [sp], #16\n"                                      \
            "b impl_" #name "\n"                                             \
            "1:\n"                                                           \
            "ldp x29, x30, [sp], #16\n"                                      \
            "mov w0, #4\n"                                                   \
            "ret\n"                                                          \
            ".size " #name ", . - " #name "\n");
#else
#error "the fake driver's entries are written for x86_64 and aarch64"
#endif

#define IMPL __attribute__((used, visibility("hidden")))

static atomic_ulong calls;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Work every device allocation and free does first (fake_set_work): writes
 * over a private buffer of that many bytes, as a real driver's work evicts
 * its caller's cache lines (a cuMemAlloc_v2 + cuMemFree_v2 pair of the H200
 * takes about 60 us), so that a bench can measure hooks run from cold
 * caches without a GPU. 0 (the default): none. */
static atomic_size_t work_bytes;
static unsigned char *work_buf;

static void work(void) {
    size_t n = atomic_load_explicit(&work_bytes, memory_order_relaxed);
    for (size_t i = 0; i < n; i += 64)
        ((volatile unsigned char *)work_buf)[i] += 1;
}
static __thread int current_device;

struct alloc {
    uintptr_t base;
    size_t size;
    int type;
    int device;
    uintptr_t ctx; /* the context it belongs to; 0: a stream-ordered pool's */
    unsigned long long ipc_id; /* T_IPC: the handle's export (0: none) */
    int opens;                 /* T_IPC: opens not yet closed */
    int global;                /* a module's or library's global */
};

/* Contexts: device d's primary context is PRIMARY(d), current unless the
 * thread made another current (cuCtxCreate); created ones count up from
 * 0x2000. Destroying one frees what was allocated in it (cuCtxDestroy,
 * cuDevicePrimaryCtxReset, the release of a primary context's last
 * reference), except the memory of stream-ordered pools, which belongs to
 * none, as on the real driver. A primary context counts its references
 * (retains less releases); an allocation with no context current
 * activates it with one, as a runtime's retain would. */
#define PRIMARY(d) ((uintptr_t)0x1000 + (uintptr_t)(d))
static __thread uintptr_t current_ctx;
static __thread int in_pool_alloc;
/* Set while memory another process exported is opened: its device. */
static __thread int exporter_device = -1;
static int primary_active[8];
static int primary_refs[8];
static uintptr_t next_ctx = 0x2000;
/* Module and library globals (see global_of). */
static struct {
    void *handle;
    CUdeviceptr plain, managed;
} modules[2048];
/* Set while an unload frees its globals: only it does (see frees). */
static __thread int in_unload;
/* Set while a global is allocated (record marks it). */
static __thread int in_global_alloc;
#define MAX_ALLOCS 65536
static struct alloc allocs[MAX_ALLOCS];
static int nallocs;

/* Reserved address space: 1 TiB of "device" memory (a bump allocator that
 * reuses only the top: a benchmark that frees its oldest of eight 256-byte
 * allocations at 40 ns a step uses 64 GiB in under ten seconds), and
 * 64 MiB below 4 GiB for the legacy 32-bit calls. */
struct arena {
    uintptr_t base, top, end;
};
static struct arena device_arena, low_arena;

/* Where the low arena goes: MAP_32BIT on x86_64; elsewhere a place below
 * 4 GiB asked for by address. */
#ifdef MAP_32BIT
#define LOW_FLAGS MAP_32BIT
#define LOW_HINT NULL
#else
#define LOW_FLAGS MAP_FIXED_NOREPLACE
#define LOW_HINT ((void *)0x80000000UL)
#endif

/* The device arena's size: 1 TiB, or FAKECUDA_ARENA_GIB GiB (valgrind
 * refuses a reservation of 1 TiB; its instruction counts of the hooks,
 * scripts/callgrind.sh, need a few GiB at most). */
static size_t device_arena_size(void) {
    const char *gib = getenv("FAKECUDA_ARENA_GIB");
    size_t n = gib ? (size_t)strtoul(gib, NULL, 10) : 0;
    return n ? n << 30 : (size_t)1 << 40;
}

/* Reserves `a` (size 0: the device arena's size), once. */
static int arena_init(struct arena *a, size_t size, int extra) {
    if (a->base)
        return 0;
    if (size == 0)
        size = device_arena_size();
    void *hint = a == &low_arena ? LOW_HINT : NULL;
    void *p = mmap(hint, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra, -1, 0);
    /* A low place taken: the next ones below 4 GiB. */
    for (uintptr_t at = 0x40000000; p == MAP_FAILED && hint && at < ((uintptr_t)4 << 30) - size;
         at += 0x40000000)
        p = mmap((void *)at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    a->base = a->top = (uintptr_t)p;
    a->end = a->base + size;
    return 0;
}

static uintptr_t arena_alloc(struct arena *a, size_t size) {
    size_t rounded = (size + 255) & ~(size_t)255;
    if (rounded == 0 || a->top + rounded > a->end)
        return 0;
    uintptr_t p = a->top;
    a->top += rounded;
    return p;
}

static void arena_free(struct arena *a, uintptr_t p, size_t size) {
    size_t rounded = (size + 255) & ~(size_t)255;
    if (p + rounded == a->top) /* the last one: give it back (alloc/free loops reuse) */
        a->top = p;
}

static struct alloc *find(uintptr_t p) {
    for (int i = nallocs - 1; i >= 0; i--)
        if (p >= allocs[i].base && p < allocs[i].base + allocs[i].size)
            return &allocs[i];
    return NULL;
}

static int record(uintptr_t base, size_t size, int type) {
    if (nallocs == MAX_ALLOCS)
        return -1;
    uintptr_t ctx = in_pool_alloc ? 0 : current_ctx ? current_ctx : PRIMARY(current_device);
    if (ctx == PRIMARY(current_device) && current_device >= 0 && current_device < 8 && !primary_active[current_device]) {
        primary_active[current_device] = 1;
        primary_refs[current_device] = 1;
    }
    int device = type == T_HOST ? -1 : exporter_device >= 0 ? exporter_device : current_device;
    allocs[nallocs] = (struct alloc){base, size, type, device, ctx};
    allocs[nallocs++].global = in_global_alloc;
    return 0;
}

static void forget(struct alloc *a) { *a = allocs[--nallocs]; }

/* Address space reserved with cuMemAddressReserve, for cuMemMap. As the
 * H200's driver 580 answers: an address mapped there has the whole
 * reservation as its range attributes and the mapping as its mapping
 * attributes (and cuMemGetAddressRange gives the mapping, with base 0
 * where the mapping is of host memory); an address there that nothing is
 * mapped at is no CUDA memory (type 0), its range the reservation. */
static struct {
    uintptr_t base;
    size_t size;
} reserved[64];
static int nreserved;

static int reservation_of(uintptr_t p) {
    for (int i = 0; i < nreserved; i++)
        if (p >= reserved[i].base && p - reserved[i].base < reserved[i].size)
            return i;
    return -1;
}

/* Set by fake_set_old_driver: cuPointerGetAttributes refuses the mapping
 * attributes (18 and 19, CUDA 12's), as an older driver does. */
static int old_driver;

/* Device-side allocation of `size` in `arena`, recorded with `type`. */
static CUresult alloc_in(struct arena *a, size_t arena_size, int extra, uintptr_t *out, size_t size, int type) {
    atomic_fetch_add(&calls, 1);
    work();
    if (!out || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (arena_init(a, arena_size, extra) == 0) {
        uintptr_t p = arena_alloc(a, size);
        if (p && record(p, size, type) == 0) {
            *out = p;
            rc = CUDA_SUCCESS;
        } else if (p) {
            arena_free(a, p, size);
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static CUresult dev_alloc(CUdeviceptr *dptr, size_t size, int type) {
    uintptr_t p = 0;
    CUresult rc = alloc_in(&device_arena, 0, 0, &p, size, type);
    if (rc == CUDA_SUCCESS)
        *dptr = p;
    return rc;
}

/* A stream-ordered allocation: from a pool, which belongs to no context. */
static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, int type) {
    in_pool_alloc = 1;
    CUresult rc = dev_alloc(dptr, size, type);
    in_pool_alloc = 0;
    return rc;
}

static CUresult low_alloc(unsigned int *dptr, size_t size) {
    uintptr_t p = 0;
    CUresult rc = alloc_in(&low_arena, (size_t)64 << 20, LOW_FLAGS, &p, size, T_DEVICE);
    if (rc == CUDA_SUCCESS)
        *dptr = (unsigned int)p;
    return rc;
}

/* Whether a free of `type` (0: a device free, cuMemFree*) ends `a`. As
 * driver 580 on the H200 (tests/gpu/refusals.c): a device free refuses
 * pinned and registered host memory (a host pool's allocation aside),
 * pages mapped with cuMemMap and a module's globals (run 169: each a
 * range of its own, which only the unload ends); cuMemFreeHost refuses
 * all but pinned host memory; only cuIpcCloseMemHandle ends an opened
 * IPC mapping. */
static int frees(const struct alloc *a, int type) {
    if (reservation_of(a->base) >= 0 || (a->global && !in_unload))
        return 0;
    if (type != 0)
        return a->type == type && (type != T_HOST || a->ctx != 0);
    return a->type != T_IPC && a->type != T_HOST + 16 && (a->type != T_HOST || a->ctx == 0);
}

/* Set by fake_error_after_free: the next free that frees answers this
 * error all the same (as the runtime's frees may answer an error of
 * earlier asynchronous work), then it is cleared; where
 * device_after_free is set, the freed range is then device memory (as
 * if another thread had been given it meanwhile: forget it with
 * fake_forget). */
static CUresult error_after_free;
static int device_after_free;

/* Frees the allocation starting at p (of `type` when type != 0). */
static CUresult free_at(uintptr_t p, int type) {
    atomic_fetch_add(&calls, 1);
    work();
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (a && a->base == p && frees(a, type)) {
        uintptr_t base = a->base;
        size_t size = a->size;
        int t = a->type;
        forget(a);
        if (t == T_HOST)
            munmap((void *)base, (size + 4095) & ~(size_t)4095);
        else if (base >= low_arena.base && base < low_arena.end)
            arena_free(&low_arena, base, size);
        else
            arena_free(&device_arena, base, size);
        rc = error_after_free;
        if (rc != CUDA_SUCCESS && device_after_free)
            record(base, size, T_DEVICE);
        error_after_free = CUDA_SUCCESS;
        device_after_free = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static CUresult host_alloc(void **pp, size_t size) {
    atomic_fetch_add(&calls, 1);
    if (!pp || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, (size + 4095) & ~(size_t)4095, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    int ok = record((uintptr_t)p, size, T_HOST) == 0;
    pthread_mutex_unlock(&lock);
    if (!ok) {
        munmap(p, (size + 4095) & ~(size_t)4095);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

/* ---- The hooked allocation functions. ---- */
ENTRY(cuMemAlloc)
IMPL CUresult impl_cuMemAlloc(unsigned int *dptr, unsigned int size) { return low_alloc(dptr, size); }
ENTRY(cuMemAlloc_v2)
IMPL CUresult impl_cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) { return dev_alloc(dptr, size, T_DEVICE); }
ENTRY(cuMemAllocManaged)
IMPL CUresult impl_cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags) {
    (void)flags;
    return dev_alloc(dptr, size, T_MANAGED);
}
ENTRY(cuMemAllocPitch)
IMPL CUresult impl_cuMemAllocPitch(unsigned *dptr, unsigned *pitch, unsigned w, unsigned h, unsigned elem) {
    (void)elem;
    if (!pitch)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned p = (w + 511) & ~511u;
    CUresult rc = low_alloc(dptr, (size_t)p * h);
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    return rc;
}
ENTRY(cuMemAllocPitch_v2)
IMPL CUresult impl_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned elem) {
    (void)elem;
    if (!pitch)
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (w + 511) & ~(size_t)511;
    CUresult rc = dev_alloc(dptr, p * h, T_DEVICE);
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    return rc;
}
ENTRY(cuMemAllocAsync)
IMPL CUresult impl_cuMemAllocAsync(CUdeviceptr *dptr, size_t size, void *stream) {
    return pool_alloc(dptr, size, stream == CAPTURING ? T_GRAPH : T_DEVICE);
}
ENTRY(cuMemAllocAsync_ptsz)
IMPL CUresult impl_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, void *stream) {
    return pool_alloc(dptr, size, stream == CAPTURING ? T_GRAPH : T_DEVICE);
}
ENTRY(cuMemAllocFromPoolAsync)
IMPL CUresult impl_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, void *pool, void *stream) {
    /* A pool handle with bit 0 set is a pool of host memory. */
    return pool_alloc(dptr, size, stream == CAPTURING ? T_GRAPH : ((uintptr_t)pool & 1) ? T_HOST : T_DEVICE);
}
ENTRY(cuMemAllocFromPoolAsync_ptsz)
IMPL CUresult impl_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, void *pool, void *stream) {
    return pool_alloc(dptr, size, stream == CAPTURING ? T_GRAPH : ((uintptr_t)pool & 1) ? T_HOST : T_DEVICE);
}
ENTRY(cuMemMap)
IMPL CUresult impl_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, unsigned long long handle,
                            unsigned long long flags) {
    (void)offset;
    (void)flags;
    atomic_fetch_add(&calls, 1);
    if (!ptr || !size)
        return CUDA_ERROR_INVALID_VALUE;
    /* A handle with bit 0 set is host memory (CU_MEM_LOCATION_TYPE_HOST). */
    pthread_mutex_lock(&lock);
    int ok = record(ptr, size, (handle & 1) ? T_HOST : T_DEVICE) == 0;
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
ENTRY(cuMemUnmap)
/* As the driver: the range must be whole mappings, back to back (one
 * that cuts a mapping, or holds unmapped space, is refused and unmaps
 * nothing). */
IMPL CUresult impl_cuMemUnmap(CUdeviceptr ptr, size_t size) {
    atomic_fetch_add(&calls, 1);
    pthread_mutex_lock(&lock);
    uintptr_t end = ptr + size, at = ptr;
    int whole = size != 0 && end > ptr;
    while (whole && at < end) {
        struct alloc *a = find(at);
        whole = a && a->base == at && a->size <= end - at;
        if (whole)
            at += a->size;
    }
    for (at = ptr; whole && at < end;) {
        struct alloc *a = find(at);
        at += a->size;
        forget(a);
    }
    pthread_mutex_unlock(&lock);
    return whole ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Globals: "managed_*" names are __managed__ variables. Each module or
 * library handle has its own two, allocated at the first lookup and
 * freed by its unload. */
static CUresult global_of(void *handle, CUdeviceptr *dptr, size_t *bytes, const char *name, int managed) {
    int m = -1;
    for (int i = 0; i < 2048; i++) {
        int used = modules[i].plain || modules[i].managed;
        if (used && modules[i].handle == handle) {
            m = i;
            break;
        }
        if (!used && m < 0)
            m = i;
    }
    if (m < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    modules[m].handle = handle;
    if (name && strncmp(name, "managed_", 8) == 0)
        managed = 1;
    CUdeviceptr *slot = managed ? &modules[m].managed : &modules[m].plain;
    if (!*slot) {
        in_global_alloc = 1;
        CUresult rc = dev_alloc(slot, 256, slot == &modules[m].managed ? T_MANAGED : T_DEVICE);
        in_global_alloc = 0;
        if (rc != CUDA_SUCCESS)
            return rc;
    } else {
        atomic_fetch_add(&calls, 1);
    }
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = *slot;
    if (bytes)
        *bytes = 256;
    return CUDA_SUCCESS;
}
ENTRY(cuModuleGetGlobal_v2)
IMPL CUresult impl_cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, void *mod, const char *name) {
    return global_of(mod, dptr, bytes, name, 0);
}
ENTRY(cuLibraryGetGlobal)
IMPL CUresult impl_cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, void *lib, const char *name) {
    return global_of(lib, dptr, bytes, name, 0);
}
/* A library's __managed__ variable, whatever its name. */
ENTRY(cuLibraryGetManaged)
IMPL CUresult impl_cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, void *lib, const char *name) {
    return global_of(lib, dptr, bytes, name, 1);
}
/* The unload of a module or library frees its globals. */
static CUresult unload(void *handle) {
    for (int m = 0; m < 2048; m++) {
        if (modules[m].handle != handle || !(modules[m].plain || modules[m].managed))
            continue;
        in_unload = 1;
        if (modules[m].plain)
            free_at(modules[m].plain, 0);
        if (modules[m].managed)
            free_at(modules[m].managed, 0);
        in_unload = 0;
        modules[m].plain = modules[m].managed = 0;
        modules[m].handle = NULL;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}
ENTRY(cuModuleUnload)
IMPL CUresult impl_cuModuleUnload(void *mod) { return unload(mod); }
ENTRY(cuLibraryUnload)
IMPL CUresult impl_cuLibraryUnload(void *lib) { return unload(lib); }
ENTRY(cuMemAllocHost_v2)
IMPL CUresult impl_cuMemAllocHost_v2(void **pp, size_t size) { return host_alloc(pp, size); }
/* The legacy name: a 32-bit size, a full pointer. */
ENTRY(cuMemAllocHost)
IMPL CUresult impl_cuMemAllocHost(void **pp, unsigned int size) { return host_alloc(pp, size); }
ENTRY(cuMemHostAlloc)
IMPL CUresult impl_cuMemHostAlloc(void **pp, size_t size, unsigned flags) {
    (void)flags;
    return host_alloc(pp, size);
}
static CUresult host_register(void *p, size_t size) {
    atomic_fetch_add(&calls, 1);
    if (!p || !size)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    /* Registered, not allocated: T_HOST, but munmap'ed by nobody here. */
    int ok = record((uintptr_t)p, size, T_HOST + 16) == 0;
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
ENTRY(cuMemHostRegister_v2)
IMPL CUresult impl_cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
    (void)flags;
    return host_register(p, size);
}
/* The legacy name (before CUDA 6.5's flags), one more definition. */
ENTRY(cuMemHostRegister)
IMPL CUresult impl_cuMemHostRegister(void *p, size_t size, unsigned flags) {
    (void)flags;
    return host_register(p, size);
}

/* ---- The hooked free functions. ---- */
ENTRY(cuMemFree)
IMPL CUresult impl_cuMemFree(unsigned int p) { return free_at(p, 0); }
ENTRY(cuMemFree_v2)
IMPL CUresult impl_cuMemFree_v2(CUdeviceptr p) { return free_at(p, 0); }
ENTRY(cuMemFreeAsync)
IMPL CUresult impl_cuMemFreeAsync(CUdeviceptr p, void *stream) {
    (void)stream;
    return free_at(p, 0);
}
ENTRY(cuMemFreeAsync_ptsz)
IMPL CUresult impl_cuMemFreeAsync_ptsz(CUdeviceptr p, void *stream) {
    (void)stream;
    return free_at(p, 0);
}
ENTRY(cuMemFreeHost)
IMPL CUresult impl_cuMemFreeHost(void *p) { return free_at((uintptr_t)p, T_HOST); }
ENTRY(cuMemHostUnregister)
IMPL CUresult impl_cuMemHostUnregister(void *p) {
    atomic_fetch_add(&calls, 1);
    pthread_mutex_lock(&lock);
    struct alloc *a = find((uintptr_t)p);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (a && a->base == (uintptr_t)p && a->type == T_HOST + 16) {
        forget(a);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- Graph memory: an allocation node reserves its address at once;
 * the memory comes when the graph runs (fake_graph_launch). A free node
 * frees nothing until its graph runs. The parameters are CUDA 13's:
 * CUDA_MEM_ALLOC_NODE_PARAMS has bytesize at 104 and dptr at 112, and
 * CUgraphNodeParams the type at 0 (MEM_ALLOC 10, MEM_FREE 11) and the
 * node's parameters at 16 (offsets read with the H200's cuda.h). ---- */
struct alloc_node_params {
    unsigned char pool_props[88];
    const void *access_descs;
    size_t access_desc_count;
    size_t bytesize;
    CUdeviceptr dptr;
};
struct node_params {
    int type;
    int reserved0[3];
    union {
        long long reserved1[29];
        struct alloc_node_params alloc;
        CUdeviceptr free_dptr;
    };
    long long reserved2;
};
_Static_assert(sizeof(struct alloc_node_params) == 120, "CUDA_MEM_ALLOC_NODE_PARAMS");
_Static_assert(sizeof(struct node_params) == 256, "CUgraphNodeParams");
static uintptr_t next_node = 0x9000;

static CUresult alloc_node(void **node, struct alloc_node_params *params) {
    if (!node || !params)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = pool_alloc(&params->dptr, params->bytesize, T_GRAPH);
    if (rc == CUDA_SUCCESS)
        *node = (void *)next_node++;
    return rc;
}
static CUresult free_node(void **node, CUdeviceptr dptr) {
    atomic_fetch_add(&calls, 1);
    pthread_mutex_lock(&lock);
    struct alloc *a = find(dptr);
    int ok = node && a && a->base == dptr && a->ctx == 0;
    pthread_mutex_unlock(&lock);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    *node = (void *)next_node++;
    return CUDA_SUCCESS;
}
static CUresult add_node(void **node, struct node_params *params) {
    if (!node || !params)
        return CUDA_ERROR_INVALID_VALUE;
    switch (params->type) {
    case 10:
        return alloc_node(node, &params->alloc);
    case 11:
        return free_node(node, params->free_dptr);
    default:
        atomic_fetch_add(&calls, 1);
        *node = (void *)next_node++;
        return CUDA_SUCCESS;
    }
}
ENTRY(cuGraphAddMemAllocNode)
IMPL CUresult impl_cuGraphAddMemAllocNode(void **node, void *graph, void *const *deps, size_t n,
                                          struct alloc_node_params *params) {
    (void)graph, (void)deps, (void)n;
    return alloc_node(node, params);
}
ENTRY(cuGraphAddMemFreeNode)
IMPL CUresult impl_cuGraphAddMemFreeNode(void **node, void *graph, void *const *deps, size_t n, CUdeviceptr dptr) {
    (void)graph, (void)deps, (void)n;
    return free_node(node, dptr);
}
ENTRY(cuGraphAddNode)
IMPL CUresult impl_cuGraphAddNode(void **node, void *graph, void *const *deps, size_t n, struct node_params *params) {
    (void)graph, (void)deps, (void)n;
    return add_node(node, params);
}
ENTRY(cuGraphAddNode_v2)
IMPL CUresult impl_cuGraphAddNode_v2(void **node, void *graph, void *const *deps, const void *edges, size_t n,
                                     struct node_params *params) {
    (void)graph, (void)deps, (void)edges, (void)n;
    return add_node(node, params);
}
/* The graph holding the allocation at `dptr` runs its allocation node:
 * the address has memory, a stream-ordered pool's (0, or -1 when it is
 * no graph allocation). */
int fake_graph_launch(CUdeviceptr dptr) {
    pthread_mutex_lock(&lock);
    struct alloc *a = find(dptr);
    int ok = a && a->base == dptr && a->type == T_GRAPH;
    if (ok)
        a->type = T_DEVICE;
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

/* ---- Memory imported from another API (cuImportExternalMemory): a
 * buffer of it, mapped by cuExternalMemoryGetMappedBuffer, is device
 * memory that cuMemFree ends. ---- */
struct external_buffer_desc {
    unsigned long long offset, size;
    unsigned flags, reserved[16];
};
ENTRY(cuExternalMemoryGetMappedBuffer)
IMPL CUresult impl_cuExternalMemoryGetMappedBuffer(CUdeviceptr *dptr, void *ext,
                                                   const struct external_buffer_desc *desc) {
    if (!ext || !desc)
        return CUDA_ERROR_INVALID_VALUE;
    return dev_alloc(dptr, desc->size, T_DEVICE);
}

/* ---- Graphics interop: a buffer of another API (OpenGL, Direct3D),
 * registered with CUDA, has a device address only while it is
 * mapped (cuGraphicsMapResources), which
 * cuGraphicsResourceGetMappedPointer_v2 gives out; an unmap, or the
 * resource's unregistration, ends it. A fake resource is made by
 * fake_graphics_register (the real calls take another API's objects);
 * each map gives the buffer an address of its own. ---- */
enum {
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NOT_MAPPED = 211,
    CUDA_ERROR_NOT_MAPPED_AS_POINTER = 213
};
/* An EGL image (fake_egl_register) has planes in place of a buffer:
 * `planes` of `size` bytes each, mapped as one allocation (`shared`) or
 * one a plane, or arrays (`arrays`: no address). */
enum { EGL_SEPARATE = 0, EGL_SHARED = 1, EGL_ARRAYS = 2 };
struct graphics_resource {
    size_t size;
    CUdeviceptr dptr; /* 0 while not mapped */
    unsigned planes;  /* 0: a buffer */
    int layout;
    CUdeviceptr plane[3];
};
void *fake_graphics_register(size_t size) {
    struct graphics_resource *r = calloc(1, sizeof *r);
    if (r)
        r->size = size;
    return r;
}
void *fake_egl_register(size_t plane_size, unsigned planes, int layout) {
    if (planes == 0 || planes > 3)
        return NULL;
    struct graphics_resource *r = fake_graphics_register(plane_size);
    if (r) {
        r->planes = planes;
        r->layout = layout;
    }
    return r;
}
static CUresult graphics_map(struct graphics_resource *r) {
    if (r->dptr)
        return CUDA_ERROR_ALREADY_MAPPED;
    if (!r->planes)
        return dev_alloc(&r->dptr, r->size, T_DEVICE);
    /* An EGL image: dptr stands for "mapped" (the first plane's, or an
     * array handle's, address). */
    if (r->layout == EGL_ARRAYS) {
        for (unsigned i = 0; i < r->planes; i++)
            r->plane[i] = 0xa770000 + i;
    } else if (r->layout == EGL_SHARED) {
        CUresult rc = dev_alloc(&r->plane[0], r->size * r->planes, T_DEVICE);
        if (rc != CUDA_SUCCESS)
            return rc;
        for (unsigned i = 1; i < r->planes; i++)
            r->plane[i] = r->plane[0] + i * r->size;
    } else {
        for (unsigned i = 0; i < r->planes; i++) {
            CUresult rc = dev_alloc(&r->plane[i], r->size, T_DEVICE);
            if (rc != CUDA_SUCCESS)
                return rc;
        }
    }
    r->dptr = r->plane[0];
    return CUDA_SUCCESS;
}
CUresult cuGraphicsMapResources(unsigned count, struct graphics_resource **resources, void *stream) {
    (void)stream;
    if (!resources)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; i++) {
        CUresult rc = graphics_map(resources[i]);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    return CUDA_SUCCESS;
}
ENTRY(cuGraphicsResourceGetMappedPointer_v2)
IMPL CUresult impl_cuGraphicsResourceGetMappedPointer_v2(CUdeviceptr *dptr, size_t *size,
                                                         struct graphics_resource *r) {
    atomic_fetch_add(&calls, 1);
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    if (!r->dptr)
        return CUDA_ERROR_NOT_MAPPED;
    if (r->planes)
        return CUDA_ERROR_NOT_MAPPED_AS_POINTER;
    if (dptr)
        *dptr = r->dptr;
    if (size)
        *size = r->size;
    return CUDA_SUCCESS;
}
static CUresult graphics_unmap(unsigned count, struct graphics_resource **resources) {
    if (!resources)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; i++) {
        struct graphics_resource *r = resources[i];
        if (!r->dptr)
            return CUDA_ERROR_NOT_MAPPED;
        if (!r->planes)
            free_at(r->dptr, 0);
        else if (r->layout == EGL_SHARED)
            free_at(r->plane[0], 0);
        else if (r->layout == EGL_SEPARATE)
            for (unsigned p = 0; p < r->planes; p++)
                free_at(r->plane[p], 0);
        memset(r->plane, 0, sizeof r->plane);
        r->dptr = 0;
    }
    return CUDA_SUCCESS;
}
ENTRY(cuGraphicsUnmapResources)
IMPL CUresult impl_cuGraphicsUnmapResources(unsigned count, struct graphics_resource **resources, void *stream) {
    (void)stream;
    return graphics_unmap(count, resources);
}
ENTRY(cuGraphicsUnmapResources_ptsz)
IMPL CUresult impl_cuGraphicsUnmapResources_ptsz(unsigned count, struct graphics_resource **resources,
                                                 void *stream) {
    (void)stream;
    return graphics_unmap(count, resources);
}
/* As the driver does, unregistering a mapped resource unmaps it. */
ENTRY(cuGraphicsUnregisterResource)
IMPL CUresult impl_cuGraphicsUnregisterResource(struct graphics_resource *r) {
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    if (r->dptr)
        graphics_unmap(1, &r);
    free(r);
    return CUDA_SUCCESS;
}

/* CUeglFrame (cudaEGL.h): a mapped EGL image's planes, device pointers
 * of a pitch-linear frame (frameType 1) or arrays (0). */
typedef struct {
    void *planes[3];
    unsigned width, height, depth, pitch, planeCount, numChannels, frameType, eglColorFormat, cuFormat;
} fake_egl_frame;
ENTRY(cuGraphicsResourceGetMappedEglFrame)
IMPL CUresult impl_cuGraphicsResourceGetMappedEglFrame(fake_egl_frame *frame, struct graphics_resource *r,
                                                       unsigned index, unsigned mip) {
    atomic_fetch_add(&calls, 1);
    if (!r || !frame || !r->planes || index != 0 || mip != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!r->dptr)
        return CUDA_ERROR_NOT_MAPPED;
    memset(frame, 0, sizeof *frame);
    for (unsigned i = 0; i < r->planes; i++)
        frame->planes[i] = (void *)r->plane[i];
    frame->pitch = 256;
    frame->width = 256;
    frame->height = (unsigned)(r->size / 256);
    frame->depth = 1;
    frame->planeCount = r->planes;
    frame->numChannels = 1;
    frame->frameType = r->layout == EGL_ARRAYS ? 0 : 1;
    return CUDA_SUCCESS;
}

/* The consumer's end of an EGL stream (fake_egl_stream: frames of
 * `planes` planes of `size` bytes each, laid out as `layout`): each
 * acquire gives a frame's resource, mapped, until its release. */
struct egl_stream {
    size_t size;
    unsigned planes;
    int layout;
};
void *fake_egl_stream(size_t plane_size, unsigned planes, int layout) {
    struct egl_stream *c = calloc(1, sizeof *c);
    if (c) {
        c->size = plane_size;
        c->planes = planes;
        c->layout = layout;
    }
    return c;
}
CUresult cuEGLStreamConsumerAcquireFrame(struct egl_stream **conn, struct graphics_resource **resource, void **stream,
                                         unsigned timeout) {
    (void)stream;
    (void)timeout;
    if (!conn || !*conn || !resource)
        return CUDA_ERROR_INVALID_VALUE;
    struct graphics_resource *r = fake_egl_register((*conn)->size, (*conn)->planes, (*conn)->layout);
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = graphics_map(r);
    if (rc != CUDA_SUCCESS) {
        free(r);
        return rc;
    }
    *resource = r;
    return CUDA_SUCCESS;
}
ENTRY(cuEGLStreamConsumerReleaseFrame)
IMPL CUresult impl_cuEGLStreamConsumerReleaseFrame(struct egl_stream **conn, struct graphics_resource *r,
                                                   void **stream) {
    (void)stream;
    atomic_fetch_add(&calls, 1);
    if (!conn || !*conn || !r || !r->planes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!r->dptr)
        return CUDA_ERROR_NOT_MAPPED;
    graphics_unmap(1, &r);
    free(r);
    return CUDA_SUCCESS;
}

/* ---- Memory another process exported. ---- */
/* A fake IPC handle or pool export: the size in its first 8 bytes, the
 * exporter's device in the next 4, and an export id in the 8 after
 * (64 bytes in all, passed by value, as the driver's CUipcMemHandle is).
 * As driver 580 does, a second open of a handle (same nonzero id) gives
 * the same address, and only the last close unmaps it. */
typedef struct {
    char reserved[64];
} fake_handle;

static size_t handle_size(const char *h) {
    size_t size;
    memcpy(&size, h, sizeof size);
    return size;
}
static int handle_device(const char *h) {
    int device;
    memcpy(&device, h + 8, sizeof device);
    return device;
}

static unsigned long long handle_id(const char *h) {
    unsigned long long id;
    memcpy(&id, h + 12, sizeof id);
    return id;
}

static CUresult ipc_open(CUdeviceptr *dptr, fake_handle handle) {
    unsigned long long id = handle_id(handle.reserved);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (int i = 0; id && i < nallocs; i++) {
        if (allocs[i].type == T_IPC && allocs[i].ipc_id == id) {
            allocs[i].opens++;
            *dptr = allocs[i].base;
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    exporter_device = handle_device(handle.reserved);
    CUresult rc = dev_alloc(dptr, handle_size(handle.reserved), T_IPC);
    exporter_device = -1;
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&lock);
        struct alloc *a = find(*dptr);
        a->ipc_id = id;
        a->opens = 1;
        pthread_mutex_unlock(&lock);
    }
    return rc;
}
/* The export: a handle that names the allocation's size and device. */
ENTRY(cuIpcGetMemHandle)
IMPL CUresult impl_cuIpcGetMemHandle(fake_handle *handle, CUdeviceptr p) {
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (handle && a && a->base == p && a->type == T_DEVICE) {
        unsigned long long id = a->base;
        memset(handle, 0, sizeof *handle);
        memcpy(handle->reserved, &a->size, sizeof a->size);
        memcpy(handle->reserved + 8, &a->device, sizeof a->device);
        memcpy(handle->reserved + 12, &id, sizeof id);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
ENTRY(cuIpcOpenMemHandle_v2)
IMPL CUresult impl_cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, fake_handle handle, unsigned flags) {
    (void)flags;
    return ipc_open(dptr, handle);
}
ENTRY(cuIpcOpenMemHandle)
IMPL CUresult impl_cuIpcOpenMemHandle(CUdeviceptr *dptr, fake_handle handle, unsigned flags) {
    (void)flags;
    return ipc_open(dptr, handle);
}
ENTRY(cuIpcCloseMemHandle)
IMPL CUresult impl_cuIpcCloseMemHandle(CUdeviceptr p) {
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    int more = a && a->base == p && a->type == T_IPC && a->opens > 1;
    if (more)
        a->opens--;
    pthread_mutex_unlock(&lock);
    return more ? CUDA_SUCCESS : free_at(p, T_IPC);
}
/* One allocation of a pool another process shares (bit 0 of the pool
 * handle: a pool of host memory); freed by cuMemFree*. */
ENTRY(cuMemPoolImportPointer)
IMPL CUresult impl_cuMemPoolImportPointer(CUdeviceptr *dptr, void *pool, fake_handle *share) {
    if (!share)
        return CUDA_ERROR_INVALID_VALUE;
    exporter_device = handle_device(share->reserved);
    CUresult rc = pool_alloc(dptr, handle_size(share->reserved), ((uintptr_t)pool & 1) ? T_HOST : T_DEVICE);
    exporter_device = -1;
    return rc;
}

/* ---- Contexts. ---- */
/* Frees everything allocated in `ctx` (host memory unmapped, registered
 * memory forgotten), as destroying it does. */
static void destroy_ctx(uintptr_t ctx) {
    pthread_mutex_lock(&lock);
    for (int i = nallocs - 1; i >= 0; i--) {
        struct alloc *a = &allocs[i];
        if (a->ctx != ctx)
            continue;
        if (a->type == T_HOST)
            munmap((void *)a->base, (a->size + 4095) & ~(size_t)4095);
        forget(a);
    }
    /* Modules of the context go with it. */
    for (int m = 0; m < 2048; m++) {
        if (modules[m].plain && !find(modules[m].plain))
            modules[m].plain = 0;
        if (modules[m].managed && !find(modules[m].managed))
            modules[m].managed = 0;
    }
    pthread_mutex_unlock(&lock);
    if (current_ctx == ctx)
        current_ctx = 0;
}
ENTRY(cuCtxCreate_v2)
IMPL CUresult impl_cuCtxCreate_v2(uintptr_t *ctx, unsigned flags, int device) {
    (void)flags;
    if (!ctx || device < 0 || device > 7)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *ctx = next_ctx++;
    pthread_mutex_unlock(&lock);
    current_ctx = *ctx;
    current_device = device;
    return CUDA_SUCCESS;
}
ENTRY(cuCtxSetCurrent)
IMPL CUresult impl_cuCtxSetCurrent(uintptr_t ctx) {
    current_ctx = ctx;
    return CUDA_SUCCESS;
}
ENTRY(cuCtxDestroy_v2)
IMPL CUresult impl_cuCtxDestroy_v2(uintptr_t ctx) {
    atomic_fetch_add(&calls, 1);
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    destroy_ctx(ctx);
    return CUDA_SUCCESS;
}
ENTRY(cuCtxDestroy)
IMPL CUresult impl_cuCtxDestroy(uintptr_t ctx) { return impl_cuCtxDestroy_v2(ctx); }
/* Destroys device's primary context, which is then inactive and counts
 * no reference (a reset, or the release of the last). */
static void end_primary(int device) {
    destroy_ctx(PRIMARY(device));
    pthread_mutex_lock(&lock);
    primary_active[device] = 0;
    primary_refs[device] = 0;
    pthread_mutex_unlock(&lock);
}
ENTRY(cuDevicePrimaryCtxReset_v2)
IMPL CUresult impl_cuDevicePrimaryCtxReset_v2(int device) {
    atomic_fetch_add(&calls, 1);
    if (device < 0 || device > 7)
        return CUDA_ERROR_INVALID_VALUE;
    end_primary(device);
    return CUDA_SUCCESS;
}
ENTRY(cuDevicePrimaryCtxReset)
IMPL CUresult impl_cuDevicePrimaryCtxReset(int device) { return impl_cuDevicePrimaryCtxReset_v2(device); }
ENTRY(cuDevicePrimaryCtxGetState)
IMPL CUresult impl_cuDevicePrimaryCtxGetState(int device, unsigned *flags, int *active) {
    if (device < 0 || device > 7 || !flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    *active = primary_active[device];
    return CUDA_SUCCESS;
}
ENTRY(cuDevicePrimaryCtxRetain)
IMPL CUresult impl_cuDevicePrimaryCtxRetain(uintptr_t *ctx, int device) {
    if (device < 0 || device > 7 || !ctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    primary_active[device] = 1;
    primary_refs[device]++;
    pthread_mutex_unlock(&lock);
    *ctx = PRIMARY(device);
    return CUDA_SUCCESS;
}
/* The release of the last reference destroys the context. */
ENTRY(cuDevicePrimaryCtxRelease_v2)
IMPL CUresult impl_cuDevicePrimaryCtxRelease_v2(int device) {
    atomic_fetch_add(&calls, 1);
    if (device < 0 || device > 7)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int last = primary_refs[device] == 1;
    int held = primary_refs[device] > 0;
    if (held)
        primary_refs[device]--;
    pthread_mutex_unlock(&lock);
    if (!held)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (last)
        end_primary(device);
    return CUDA_SUCCESS;
}
ENTRY(cuDevicePrimaryCtxRelease)
IMPL CUresult impl_cuDevicePrimaryCtxRelease(int device) { return impl_cuDevicePrimaryCtxRelease_v2(device); }

/* ---- What memhook asks the driver. ---- */
ENTRY(cuInit)
IMPL CUresult impl_cuInit(unsigned flags) {
    (void)flags;
    return CUDA_SUCCESS;
}
/* Devices shown (cuDeviceGetAttribute answers for 0..7), and how often
 * the current context's device was asked. */
static int device_count = 8;
static atomic_ulong ctx_queries;
ENTRY(cuCtxGetDevice)
IMPL CUresult impl_cuCtxGetDevice(int *device) {
    atomic_fetch_add(&ctx_queries, 1);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = current_device;
    return CUDA_SUCCESS;
}
ENTRY(cuDeviceGetCount)
IMPL CUresult impl_cuDeviceGetCount(int *count) {
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = device_count;
    return CUDA_SUCCESS;
}
ENTRY(cuMemGetAddressRange_v2)
IMPL CUresult impl_cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    if (a && a->type != T_HOST && a->type != T_HOST + 16 && a->type != T_GRAPH) {
        if (base)
            *base = a->base;
        if (size)
            *size = a->size;
        rc = CUDA_SUCCESS;
    } else if (a && a->type == T_HOST && reservation_of(p) >= 0) {
        /* Host memory mapped into a reservation: driver 580's answer. */
        if (base)
            *base = 0;
        if (size)
            *size = a->size;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
ENTRY(cuPointerGetAttributes)
IMPL CUresult impl_cuPointerGetAttributes(unsigned n, int *attributes, void **data, CUdeviceptr p) {
    if (!attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++)
        if (old_driver && (attributes[i] == 18 || attributes[i] == 19))
            return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    struct alloc none = {0, 0, T_NONE, -2, 0};
    if (!a || a->type == T_GRAPH)
        a = &none;
    int type = a->type == T_HOST + 16 ? T_HOST : a->type == T_IPC ? T_DEVICE : a->type;
    /* The range: the allocation, or the reservation around a mapping.
     * The mapping: the mapping in a reservation; else the driver's 2 MiB
     * chunks around the allocation (a 4 KiB cuMemAlloc lies in a 2 MiB
     * mapping with others on the H200). */
    int r = reservation_of(p);
    uintptr_t range_base = r >= 0 ? reserved[r].base : a->base;
    size_t range_size = r >= 0 ? reserved[r].size : a->size;
    const uintptr_t chunk = (uintptr_t)2 << 20;
    uintptr_t map_base = r >= 0 ? a->base : a->base & ~(chunk - 1);
    size_t map_size = r >= 0 ? a->size : a->size ? ((a->base + a->size + chunk - 1) & ~(chunk - 1)) - map_base : 0;
    for (unsigned i = 0; i < n; i++) {
        switch (attributes[i]) {
        case 1: /* CU_POINTER_ATTRIBUTE_CONTEXT */
            *(uintptr_t *)data[i] = a->ctx;
            break;
        case 2: /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
            *(unsigned *)data[i] = type == T_MANAGED ? T_DEVICE : (unsigned)type;
            break;
        case 8: /* CU_POINTER_ATTRIBUTE_IS_MANAGED: a C bool */
            *(_Bool *)data[i] = type == T_MANAGED;
            break;
        case 9: /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */
            *(int *)data[i] = a->device;
            break;
        case 11: /* CU_POINTER_ATTRIBUTE_RANGE_START_ADDR */
            *(CUdeviceptr *)data[i] = range_base;
            break;
        case 12: /* CU_POINTER_ATTRIBUTE_RANGE_SIZE */
            *(size_t *)data[i] = range_size;
            break;
        case 18: /* CU_POINTER_ATTRIBUTE_MAPPING_SIZE */
            *(size_t *)data[i] = map_size;
            break;
        case 19: /* CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR */
            *(CUdeviceptr *)data[i] = map_base;
            break;
        default:
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
ENTRY(cuDeviceGetAttribute)
IMPL CUresult impl_cuDeviceGetAttribute(int *value, int attribute, int device) {
    if (!value || device < 0 || device > 7)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case 33: /* PCI bus */
        *value = 0x19 + device;
        return CUDA_SUCCESS;
    case 34: /* PCI device */
    case 50: /* PCI domain */
        *value = 0;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* ---- cuGetProcAddress: the driver picks the definition by version and
 * flags; so does the fake: NAME_v2 from version 3020, NAME_ptsz with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2). ---- */
extern char cuMemAlloc[], cuMemAlloc_v2[], cuMemAllocManaged[], cuMemAllocPitch[], cuMemAllocPitch_v2[],
    cuMemAllocAsync[], cuMemAllocAsync_ptsz[], cuMemAllocFromPoolAsync[], cuMemAllocFromPoolAsync_ptsz[], cuMemMap[],
    cuMemUnmap[], cuModuleGetGlobal_v2[], cuLibraryGetGlobal[], cuMemAllocHost_v2[], cuMemHostAlloc[],
    cuMemHostRegister_v2[], cuMemAllocHost[], cuMemHostRegister[], cuMemFree[], cuMemFree_v2[], cuMemFreeAsync[], cuMemFreeAsync_ptsz[], cuMemFreeHost[],
    cuMemHostUnregister[], cuInit[], cuCtxGetDevice[], cuDeviceGetCount[], cuMemGetAddressRange_v2[], cuPointerGetAttributes[],
    cuDeviceGetAttribute[], cuGetProcAddress[], cuGetProcAddress_v2[], cuCtxCreate_v2[], cuCtxSetCurrent[],
    cuCtxDestroy_v2[], cuCtxDestroy[], cuDevicePrimaryCtxReset_v2[], cuDevicePrimaryCtxReset[],
    cuDevicePrimaryCtxGetState[], cuDevicePrimaryCtxRetain[], cuDevicePrimaryCtxRelease_v2[], cuDevicePrimaryCtxRelease[], cuModuleUnload[],
    cuLibraryUnload[], cuIpcOpenMemHandle_v2[], cuIpcOpenMemHandle[], cuIpcCloseMemHandle[], cuMemPoolImportPointer[],
    cuGraphAddMemAllocNode[], cuGraphAddMemFreeNode[], cuGraphAddNode[], cuGraphAddNode_v2[], cuLibraryGetManaged[],
    cuExternalMemoryGetMappedBuffer[], cuGraphicsResourceGetMappedPointer_v2[], cuGraphicsUnmapResources[],
    cuGraphicsUnmapResources_ptsz[], cuGraphicsUnregisterResource[], cuGraphicsResourceGetMappedEglFrame[],
    cuEGLStreamConsumerReleaseFrame[];

static const struct {
    const char *name;
    void *fn;
} procs[] = {
#define P(x) {#x, x}
    P(cuMemAlloc), P(cuMemAlloc_v2), P(cuMemAllocManaged), P(cuMemAllocPitch), P(cuMemAllocPitch_v2),
    P(cuMemAllocAsync), P(cuMemAllocAsync_ptsz), P(cuMemAllocFromPoolAsync), P(cuMemAllocFromPoolAsync_ptsz),
    P(cuMemMap), P(cuMemUnmap), P(cuModuleGetGlobal_v2), P(cuLibraryGetGlobal), P(cuMemAllocHost_v2),
    P(cuMemHostAlloc), P(cuMemHostRegister_v2), P(cuMemAllocHost), P(cuMemHostRegister), P(cuMemFree), P(cuMemFree_v2), P(cuMemFreeAsync),
    P(cuMemFreeAsync_ptsz), P(cuMemFreeHost), P(cuMemHostUnregister), P(cuInit), P(cuCtxGetDevice), P(cuDeviceGetCount),
    P(cuMemGetAddressRange_v2), P(cuPointerGetAttributes), P(cuDeviceGetAttribute), P(cuGetProcAddress),
    P(cuGetProcAddress_v2), P(cuCtxCreate_v2), P(cuCtxSetCurrent), P(cuCtxDestroy_v2), P(cuCtxDestroy),
    P(cuDevicePrimaryCtxReset_v2), P(cuDevicePrimaryCtxReset), P(cuDevicePrimaryCtxGetState),
    P(cuDevicePrimaryCtxRetain), P(cuDevicePrimaryCtxRelease_v2), P(cuDevicePrimaryCtxRelease), P(cuModuleUnload),
    P(cuLibraryUnload), P(cuIpcOpenMemHandle_v2), P(cuIpcOpenMemHandle), P(cuIpcCloseMemHandle),
    P(cuMemPoolImportPointer), P(cuGraphAddMemAllocNode), P(cuGraphAddMemFreeNode), P(cuGraphAddNode),
    P(cuGraphAddNode_v2), P(cuLibraryGetManaged), P(cuExternalMemoryGetMappedBuffer),
    P(cuGraphicsResourceGetMappedPointer_v2), P(cuGraphicsUnmapResources), P(cuGraphicsUnmapResources_ptsz),
    P(cuGraphicsUnregisterResource), {"cuGraphicsMapResources", (void *)cuGraphicsMapResources},
    P(cuGraphicsResourceGetMappedEglFrame), P(cuEGLStreamConsumerReleaseFrame),
    {"cuEGLStreamConsumerAcquireFrame", (void *)cuEGLStreamConsumerAcquireFrame},
#undef P
};

static void *proc(const char *name) {
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++)
        if (strcmp(procs[i].name, name) == 0)
            return procs[i].fn;
    return NULL;
}

static CUresult get_proc(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    atomic_fetch_add(&calls, 1);
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    char name[128];
    size_t n = strlen(symbol);
    if (n > 100)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(name, symbol, n + 1);
    if (version >= 3020) {
        memcpy(name + n, "_v2", 4);
        if (!proc(name))
            name[n] = 0;
    }
    if (flags & 2) {
        size_t m = strlen(name);
        memcpy(name + m, "_ptsz", 6);
        if (!proc(name))
            name[m] = 0;
    }
    *pfn = proc(name);
    if (status)
        *status = *pfn ? 0 : 1;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
ENTRY(cuGetProcAddress)
IMPL CUresult impl_cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    return get_proc(symbol, pfn, version, flags, NULL);
}
ENTRY(cuGetProcAddress_v2)
IMPL CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                                       int *status) {
    return get_proc(symbol, pfn, version, flags, status);
}

/* cuMemAddressReserve and cuMemAddressFree (not hooked: no memory comes
 * or goes with them), reservations 2 MiB-aligned in the device arena. As
 * driver 580 on the H200 (tests/gpu/refusals.c, run 167), freeing a
 * reservation with a page still mapped in it is refused and leaves the
 * page mapped: no mapping ends without its cuMemUnmap. */
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)alignment;
    (void)addr;
    (void)flags;
    const uintptr_t align = (uintptr_t)2 << 20;
    if (!ptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t raw;
    if (nreserved < (int)(sizeof reserved / sizeof reserved[0]) && arena_init(&device_arena, 0, 0) == 0
        && (raw = arena_alloc(&device_arena, size + align)) != 0) {
        uintptr_t base = (raw + align - 1) & ~(align - 1);
        reserved[nreserved].base = base;
        reserved[nreserved++].size = size;
        *ptr = base;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    (void)size;
    pthread_mutex_lock(&lock);
    int r = reservation_of(ptr);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    int mapped = 0;
    for (int i = 0; r >= 0 && i < nallocs; i++)
        mapped |= reservation_of(allocs[i].base) == r;
    if (r >= 0 && reserved[r].base == ptr && !mapped) {
        reserved[r] = reserved[--nreserved];
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* ---- For the tests. ---- */
unsigned long fake_calls(void) { return atomic_load(&calls); }
void fake_set_old_driver(int old) { old_driver = old; }

/* The next free that frees answers `error`, and leaves device memory
 * where it freed if `device` (see error_after_free). */
void fake_error_after_free(int error, int device) {
    pthread_mutex_lock(&lock);
    error_after_free = error;
    device_after_free = device;
    pthread_mutex_unlock(&lock);
}

/* Forgets the allocation recorded at p, freeing nothing. */
void fake_forget(uintptr_t p) {
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    if (a && a->base == p)
        forget(a);
    pthread_mutex_unlock(&lock);
}

/* Sets the work of each allocation and free (above); returns 0, or -1 if
 * the buffer cannot be mapped. Call it with no driver call in flight. */
int fake_set_work(size_t bytes) {
    static size_t mapped;
    if (bytes > mapped) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return -1;
        if (work_buf)
            munmap(work_buf, mapped);
        work_buf = p;
        mapped = bytes;
    }
    atomic_store(&work_bytes, bytes);
    return 0;
}
int fake_live(void) {
    pthread_mutex_lock(&lock);
    int n = nallocs;
    pthread_mutex_unlock(&lock);
    return n;
}
void fake_set_device(int device) { current_device = device; }
void fake_set_device_count(int n) { device_count = n; }
unsigned long fake_ctx_queries(void) { return atomic_load(&ctx_queries); }

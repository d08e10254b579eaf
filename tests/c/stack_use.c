/* The stack each hooked call takes beyond what it takes unhooked, with one
 * empty handler of every event: what memhook asks of a program that maps,
 * unmaps or truncates on a small stack (a signal handler on its
 * alternate stack, a coroutine, a thread made with PTHREAD_STACK_MIN).
 * scripts/check-stack.sh runs it against the optimised libmemhook.so, the
 * fake CUDA driver (tests/cuda/fakecuda.c) and the fake shared runtime
 * (tests/cuda/clients.c), in both host modes.
 *
 *   stack_use QUERY_LIMIT TEXT_LIMIT CUDA_LIMIT [text]
 *
 * Each call runs on a stack of its own (makecontext), filled with a
 * pattern first; the deepest byte that changed is the call's use. Every
 * call is measured before the install (three times, the deepest kept)
 * and after it (the same), so one-time work on a hook's first call
 * counts. Then a handler's registration and removal, whose whole use
 * must be within QUERY_LIMIT. Prints a line per call; exits 0 when every call's addition is
 * within the limit, 1 naming each that is not, 2 where it could not
 * measure. A host call's limit is QUERY_LIMIT bytes where the kernel
 * answers PROCMAP_QUERY (Linux 6.11), TEXT_LIMIT where memhook must read
 * the text of /proc/self/maps instead; a CUDA call's is CUDA_LIMIT (its
 * hooks never look at the mappings). With "text", a seccomp filter refuses
 * PROCMAP_QUERY (ENOTTY) as an older kernel does. Link with -Wl,-z,now,
 * so that no lazy binding's work lands in the first measure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#include "memhook.h"
#include "seccomp_x86_64.h"

/* The driver's functions the calls below make (tests/cuda/fakecuda.c's). */
typedef struct {
    char reserved[64];
} ipc_handle;
int cuInit(unsigned);
int cuMemAlloc_v2(uint64_t *, size_t);
int cuMemFree_v2(uint64_t);
int cuMemAllocAsync(uint64_t *, size_t, void *);
int cuMemFreeAsync(uint64_t, void *);
int cuMemAddressReserve(uint64_t *, size_t, size_t, uint64_t, unsigned long long);
int cuMemMap(uint64_t, size_t, size_t, unsigned long long, unsigned long long);
int cuMemUnmap(uint64_t, size_t);
int cuMemAllocHost_v2(void **, size_t);
int cuMemFreeHost(void *);
int cuMemHostRegister_v2(void *, size_t, unsigned);
int cuMemHostUnregister(void *);
int cuModuleGetGlobal_v2(uint64_t *, size_t *, void *, const char *);
int cuModuleUnload(void *);
int cuIpcGetMemHandle(ipc_handle *, uint64_t);
int cuIpcOpenMemHandle_v2(uint64_t *, ipc_handle, unsigned);
int cuIpcCloseMemHandle(uint64_t);
int cuCtxCreate_v2(uintptr_t *, unsigned, int);
int cuCtxDestroy_v2(uintptr_t);
/* The fake shared runtime's (tests/cuda/clients.c, CLIENT_CUDART): it
 * calls the driver through cuGetProcAddress's pointers, so that both
 * levels of one call are hooked. */
int cudaMalloc(void **, size_t);
int cudaFree(void *);

#define STACK (256 * 1024)
#define FILL 0xA5
static unsigned char *stack;
static ucontext_t caller, callee;
static void (*work)(void);
static char file[64];

static void run_work(void) { work(); }

/* The bytes of `stack` that `w` wrote (its frames and everything they
 * called, down to the deepest). */
static size_t use_of(void (*w)(void)) {
    memset(stack, FILL, STACK);
    work = w;
    if (getcontext(&callee) != 0) return 0;
    callee.uc_stack.ss_sp = stack;
    callee.uc_stack.ss_size = STACK;
    callee.uc_link = &caller;
    makecontext(&callee, run_work, 0);
    if (swapcontext(&caller, &callee) != 0) return 0;
    size_t untouched = 0;
    while (untouched < STACK && stack[untouched] == FILL) untouched++;
    return STACK - untouched;
}

static size_t deepest_of(void (*w)(void)) {
    size_t most = 0;
    for (int i = 0; i < 3; i++) {
        size_t u = use_of(w);
        if (u > most) most = u;
    }
    return most;
}

static void *anon(size_t size) {
    return mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

/* A file of two pages mapped shared: the file-emptying calls below each
 * unmap its pages from the process's view (VM_UNMAPPED). */
static void *mapped_file(int *fd) {
    *fd = open(file, O_RDWR | O_CREAT, 0600);
    if (*fd < 0 || ftruncate(*fd, 8192) != 0) return MAP_FAILED;
    return mmap(NULL, 8192, PROT_READ, MAP_SHARED, *fd, 0);
}

static void done_with_file(void *p, int fd) {
    if (p != MAP_FAILED) munmap(p, 8192);
    if (fd >= 0) close(fd);
}

static void w_mmap_munmap(void) { munmap(anon(4096), 4096); }
static void w_mremap(void) {
    void *p = mremap(anon(4096), 4096, 1 << 20, MREMAP_MAYMOVE);
    if (p != MAP_FAILED) munmap(p, 1 << 20);
}
static void w_madvise(void) {
    void *p = anon(1 << 16);
    madvise(p, 1 << 16, MADV_DONTNEED);
    munmap(p, 1 << 16);
}
/* glibc 2.36's: weak, so that the program builds and runs with an older
 * glibc, where memhook has no such function to hook. */
extern ssize_t process_madvise(int, const struct iovec *, size_t, int, unsigned) __attribute__((weak));

static void w_process_madvise(void) {
    if (!process_madvise) return;
    void *p = anon(1 << 16);
    struct iovec v = {p, 1 << 16};
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (pidfd >= 0) {
        process_madvise(pidfd, &v, 1, MADV_DONTNEED, 0);
        close(pidfd);
    }
    munmap(p, 1 << 16);
}
static void w_shm(void) {
    int id = shmget(IPC_PRIVATE, 1 << 16, IPC_CREAT | 0600);
    if (id < 0) return;
    void *p = shmat(id, NULL, 0);
    if (p != (void *)-1) shmdt(p);
    shmctl(id, IPC_RMID, NULL);
}
static void w_sbrk(void) {
    if (sbrk(4096) != (void *)-1) sbrk(-4096);
}
static void w_brk(void) {
    char *top = sbrk(0);
    if (brk(top + 4096) == 0) brk(top);
}
static void w_syscall(void) {
    long p = syscall(SYS_mmap, 0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != -1) syscall(SYS_munmap, p, 4096);
}
static void w_ftruncate(void) {
    int fd;
    void *p = mapped_file(&fd);
    if (fd >= 0) ftruncate(fd, 0);
    done_with_file(p, fd);
}
static void w_truncate(void) {
    int fd;
    void *p = mapped_file(&fd);
    truncate(file, 0);
    done_with_file(p, fd);
}
static void w_open_trunc(void) {
    int fd;
    void *p = mapped_file(&fd);
    int again = open(file, O_RDWR | O_TRUNC);
    if (again >= 0) close(again);
    done_with_file(p, fd);
}
static void w_fopen_w(void) {
    int fd;
    void *p = mapped_file(&fd);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    done_with_file(p, fd);
}
static void w_fallocate(void) {
    int fd;
    void *p = mapped_file(&fd);
    if (fd >= 0) fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096);
    done_with_file(p, fd);
}
static void w_remap_file_pages(void) {
    int fd;
    void *p = mapped_file(&fd);
    if (p != MAP_FAILED) remap_file_pages(p, 4096, 0, 1, 0);
    done_with_file(p, fd);
}
static void w_cuda(void) {
    uint64_t d = 0;
    if (cuMemAlloc_v2(&d, 4096) == 0) cuMemFree_v2(d);
}
static void w_cuda_async(void) {
    uint64_t d = 0;
    if (cuMemAllocAsync(&d, 4096, NULL) == 0) cuMemFreeAsync(d, NULL);
}
/* A reservation made once (main): the fake driver keeps a few. */
static uint64_t reserved;
static void w_cuda_map(void) {
    if (cuMemMap(reserved, 2 << 20, 0, 2, 0) == 0) cuMemUnmap(reserved, 2 << 20);
}
static void w_cuda_host(void) {
    void *p = NULL;
    if (cuMemAllocHost_v2(&p, 4096) == 0) cuMemFreeHost(p);
}
static void w_cuda_register(void) {
    void *p = anon(1 << 16);
    if (cuMemHostRegister_v2(p, 1 << 16, 0) == 0) cuMemHostUnregister(p);
    munmap(p, 1 << 16);
}
/* A module's global, allocated at its first lookup, freed by the unload. */
static void w_cuda_module(void) {
    static char module;
    uint64_t d = 0;
    size_t bytes = 0;
    if (cuModuleGetGlobal_v2(&d, &bytes, &module, "counter") == 0) cuModuleUnload(&module);
}
static void w_cuda_ipc(void) {
    uint64_t d = 0, opened = 0;
    ipc_handle h;
    if (cuMemAlloc_v2(&d, 1 << 16) != 0) return;
    if (cuIpcGetMemHandle(&h, d) == 0 && cuIpcOpenMemHandle_v2(&opened, h, 1) == 0) cuIpcCloseMemHandle(opened);
    cuMemFree_v2(d);
}
static void w_cuda_runtime(void) {
    void *p = NULL;
    if (cudaMalloc(&p, 4096) == 0) cudaFree(p);
}
/* A context's teardown frees what it holds (memhook reports each). */
static void w_cuda_context(void) {
    uintptr_t ctx = 0;
    uint64_t d[4];
    if (cuCtxCreate_v2(&ctx, 0, 0) != 0) return;
    for (int i = 0; i < 4; i++) cuMemAlloc_v2(&d[i], 4096);
    cuCtxDestroy_v2(ctx);
}

/* Each call, and for CUDA's the function whose own hook must have taken
 * (an event alone could come from a hook below it). */
static const struct {
    const char *name;
    void (*work)(void);
    const char *hooked;
} calls[] = {
    {"mmap+munmap", w_mmap_munmap},
    {"mremap", w_mremap},
    {"madvise", w_madvise},
    {"process_madvise", w_process_madvise},
    {"shmat+shmdt", w_shm},
    {"sbrk", w_sbrk},
    {"brk", w_brk},
    {"syscall", w_syscall},
    {"ftruncate", w_ftruncate},
    {"truncate", w_truncate},
    {"open(O_TRUNC)", w_open_trunc},
    {"fopen(\"w\")", w_fopen_w},
    {"fallocate", w_fallocate},
    {"remap_file_pages", w_remap_file_pages},
    {"cuMemAlloc_v2+Free", w_cuda, "cuMemAlloc_v2"},
    {"cuMemAllocAsync+Free", w_cuda_async, "cuMemAllocAsync"},
    {"cuMemMap+Unmap", w_cuda_map, "cuMemMap"},
    {"cuMemAllocHost+Free", w_cuda_host, "cuMemAllocHost_v2"},
    {"cuMemHostRegister", w_cuda_register, "cuMemHostRegister_v2"},
    {"cuModuleGetGlobal", w_cuda_module, "cuModuleGetGlobal_v2"},
    {"cuIpcOpenMemHandle", w_cuda_ipc, "cuIpcOpenMemHandle_v2"},
    {"cuCtxDestroy", w_cuda_context, "cuCtxDestroy_v2"},
    {"cudaMalloc+Free", w_cuda_runtime, "cudaMalloc"},
};
#define CALLS (sizeof calls / sizeof calls[0])

/* Whether a mode's hook of `function` took. */
static int hook_took(const char *function) {
    struct memhook_hook_status_t st;
    for (size_t i = 0; memhook_status(i, &st) == 0; i++)
        if (strcmp(st.function, function) == 0 && st.installed) return 1;
    return 0;
}

static long events;
static void other(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)e;
    (void)arg;
}
/* A registration and its removal: what a signal handler that registers
 * takes of its stack (memhook allows it: README, "Core design notes"). */
static int registered;
static void w_register(void) {
    registered += memhook_set_event_handler(MEMHOOK_EVENT_MMAP, -1, other, NULL) == 0;
    memhook_unset_event_handler(MEMHOOK_EVENT_MMAP, other, NULL);
}
static void empty(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)e;
    (void)arg;
    events++;
}

/* struct procmap_query's ioctl (linux/fs.h, Linux 6.11). */
#define PROCMAP_QUERY 0xc0686611u

/* Whether the kernel answers PROCMAP_QUERY here. */
static int queries_answer(void) {
    int fd = open("/proc/self/maps", O_RDONLY);
    uint64_t q[13] = {104, 0x10 /* covering or next */};
    int answered = fd >= 0 && ioctl(fd, PROCMAP_QUERY, q) == 0;
    if (fd >= 0) close(fd);
    return answered;
}

/* Refuses PROCMAP_QUERY with ENOTTY, as a kernel without it answers;
 * every other call is let through. */
static int refuse_procmap_query(void) {
    struct sock_filter f[] = {
        SECCOMP_X86_64_NR,
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PROCMAP_QUERY, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOTTY),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    if (install_seccomp_filter(f, sizeof f / sizeof f[0]) != 0) return -1;
    return queries_answer() ? -1 : 0;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5 || (argc == 5 && strcmp(argv[4], "text") != 0)) {
        fprintf(stderr, "usage: stack_use QUERY_LIMIT TEXT_LIMIT CUDA_LIMIT [text]\n");
        return 2;
    }
    if (argc == 5 && refuse_procmap_query() != 0) {
        fprintf(stderr, "stack_use: could not refuse PROCMAP_QUERY by seccomp: %s\n", strerror(errno));
        return 2;
    }
    int by_query = queries_answer();
    size_t host_limit = strtoul(argv[by_query ? 1 : 2], NULL, 0), cuda_limit = strtoul(argv[3], NULL, 0);
    printf("the mappings %s\n", by_query ? "asked of the kernel (PROCMAP_QUERY)" : "read from the text of /proc/self/maps");
    snprintf(file, sizeof file, "/tmp/memhook-stack-use-%d", (int)getpid());
    stack = mmap(NULL, STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack == MAP_FAILED || cuInit(0) != 0 || cuMemAddressReserve(&reserved, 2 << 20, 0, 0, 0) != 0) {
        fprintf(stderr, "stack_use: no stack to measure on, or cuInit or cuMemAddressReserve failed\n");
        return 2;
    }
    /* Once each first, on this stack: the work of a first call that is
     * not memhook's (the fake driver's start, stdio's buffers) is not
     * the hooks' either. */
    for (size_t i = 0; i < CALLS; i++) calls[i].work();
    size_t unhooked[CALLS];
    for (size_t i = 0; i < CALLS; i++) unhooked[i] = deepest_of(calls[i].work);
    uint32_t all = MEMHOOK_EVENT_MMAP | MEMHOOK_EVENT_MUNMAP | MEMHOOK_EVENT_MREMAP | MEMHOOK_EVENT_SHMAT |
                   MEMHOOK_EVENT_SHMDT | MEMHOOK_EVENT_SBRK | MEMHOOK_EVENT_MADVISE | MEMHOOK_EVENT_BRK |
                   MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED | MEMHOOK_EVENT_MEM_TYPE_ALLOC |
                   MEMHOOK_EVENT_MEM_TYPE_FREE;
    if (memhook_install(NULL) != 0 || memhook_set_event_handler(all, 0, empty, NULL) != 0) {
        fprintf(stderr, "stack_use: %s\n", memhook_last_error());
        return 2;
    }
    int over = 0;
    printf("%-20s %9s %9s %9s (limit %zu, CUDA's %zu)\n", "call", "unhooked", "hooked", "added", host_limit,
           cuda_limit);
    for (size_t i = 0; i < CALLS; i++) {
        size_t limit = calls[i].hooked ? cuda_limit : host_limit;
        long before = events;
        size_t hooked = deepest_of(calls[i].work);
        long added = (long)hooked - (long)unhooked[i];
        printf("%-20s %9zu %9zu %9ld%s\n", calls[i].name, unhooked[i], hooked, added,
               added > (long)limit ? "  OVER" : "");
        if (calls[i].hooked && !hook_took(calls[i].hooked)) {
            fprintf(stderr, "stack_use: %s has no hook installed\n", calls[i].hooked);
            over = 1;
        }
        if (events == before) {
            fprintf(stderr, "stack_use: %s reported no event: its hook did not run\n", calls[i].name);
            over = 1;
        }
        if (added > (long)limit) over = 1;
    }
    /* Registration: its whole use, within the host calls' limit. */
    size_t used = deepest_of(w_register);
    printf("%-20s %9s %9zu %9s%s\n", "set+unset handler", "", used, "", used > host_limit ? "  OVER" : "");
    if (registered != 3) {
        fprintf(stderr, "stack_use: a registration failed: %s\n", memhook_last_error());
        over = 1;
    }
    if (used > host_limit) over = 1;
    unlink(file);
    return over;
}

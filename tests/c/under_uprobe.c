/* A program that uprobes are put on while memhook's bistro hooks are in,
 * as bpftrace, bcc's memleak or an eBPF GPU-memory profiler put them
 * (tests/c/under_uprobe.sh does it through tracefs): on the driver's
 * cuMemAlloc_v2 and cuMemFree_v2 (driver 580's, or the fake one's of
 * tests/cuda/fakecuda.c with the same entry bytes: push rbp first, no
 * endbr64), on libc's munmap, and on libc's getpagesize, which the
 * program patches itself (memhook_patch) with a hook that counts its
 * calls (Debian 12's begins mov rax, [rip+d]: a load of a global, kept
 * and re-aimed in the trampoline; the kernel runs the file's copy out of
 * line with its own re-aim), and on libc's iswalpha, patched the same
 * way by a hook that also keeps its argument (Debian 12's begins mov
 * edx, edi: a write of an argument register the function never reads,
 * kept; the hook must still get its one argument as passed). A
 * uprobe replaces the entry's first instruction with int3, runs the
 * file's copy of it out of line and goes on after it; taken out, it
 * writes the file's first bytes back. bistro keeps that instruction and
 * patches after it, so neither may cost an event or a call.
 *
 * Prints, for each function, "probe NAME FILE OFFSET" (the uprobe's
 * place: its file and the entry's offset in it) and then "ready"; then,
 * for each line read on stdin, one phase: 5 allocations and frees and
 * 5 pages mapped and unmapped, 5 calls of getpagesize, 10 of iswalpha
 * (a letter and a digit each round), and "phase N: allocations A, frees F, munmaps M, getpagesize hooked
 * G, iswalpha hooked W, failed E" (E: calls that failed, gave a wrong
 * page size or class, or whose hook saw another argument; G and W count
 * glibc's own calls too). Exits 0 when every phase saw every call and none failed,
 * 1 otherwise, 2 where memhook's bistro hooks are not in. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <wctype.h>

#include "memhook.h"

int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(void **, int);
int cuCtxSetCurrent(void *);
int cuMemAlloc_v2(uint64_t *, size_t);
int cuMemFree_v2(uint64_t);

#define ROUNDS 5
static volatile int allocs, frees, munmaps, pagesizes, alphas;
static volatile wint_t alpha_seen;

static int (*original_getpagesize)(void);

static int hook_getpagesize(void) {
    pagesizes++;
    return original_getpagesize();
}

static int (*original_iswalpha)(wint_t);

static int hook_iswalpha(wint_t wc) {
    alphas++;
    alpha_seen = wc;
    return original_iswalpha(wc);
}

static void count(uint32_t type, memhook_event_t *e, void *arg) {
    (void)e;
    (void)arg;
    if (type == MEMHOOK_EVENT_MEM_TYPE_ALLOC) allocs++;
    if (type == MEMHOOK_EVENT_MEM_TYPE_FREE) frees++;
    if (type == MEMHOOK_EVENT_MUNMAP) munmaps++;
}

struct where {
    uintptr_t addr;
    const char *file;
    uintptr_t offset;
};

/* The object and PT_LOAD segment holding `w->addr`: its file offset. */
static int find(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct where *w = data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && w->addr >= start && w->addr < start + ph->p_memsz) {
            w->file = info->dlpi_name;
            w->offset = w->addr - start + ph->p_offset;
            return 1;
        }
    }
    return 0;
}

static int probe_line(const char *name, void *f) {
    struct where w = {(uintptr_t)f, NULL, 0};
    if (!dl_iterate_phdr(find, &w) || !w.file || !*w.file) return -1;
    printf("probe %s %s 0x%lx\n", name, w.file, (unsigned long)w.offset);
    return 0;
}

int main(void) {
    void *ctx = NULL;
    if (cuInit(0) != 0 || cuDevicePrimaryCtxRetain(&ctx, 0) != 0 || cuCtxSetCurrent(ctx) != 0) return 2;
    if (memhook_install(NULL) != 0 ||
        memhook_set_event_handler(MEMHOOK_EVENT_MEM_TYPE_ALLOC | MEMHOOK_EVENT_MEM_TYPE_FREE | MEMHOOK_EVENT_MUNMAP, 0,
                                  count, NULL) != 0) {
        fprintf(stderr, "under_uprobe: %s\n", memhook_last_error());
        return 2;
    }
    const char *names[] = {"cuMemAlloc_v2", "cuMemFree_v2", "munmap"};
    int hooked = 0;
    struct memhook_hook_status_t st;
    for (size_t i = 0; memhook_status(i, &st) == 0; i++)
        for (int n = 0; n < 3; n++)
            if (strcmp(st.function, names[n]) == 0 && strcmp(st.mode, "bistro") == 0) {
                printf("status %s: %s%s\n", st.function, st.installed ? "installed" : "not installed: ",
                       st.installed ? "" : st.reason);
                hooked += st.installed;
            }
    if (hooked != 3) return 2;
    void *gps = dlsym(RTLD_DEFAULT, "getpagesize");
    memhook_patch_t *handle;
    if (!gps || memhook_patch(gps, (void *)hook_getpagesize, (void **)&original_getpagesize, &handle) != 0) {
        fprintf(stderr, "under_uprobe: getpagesize: %s\n", memhook_last_error());
        return 2;
    }
    void *alpha = dlsym(RTLD_DEFAULT, "iswalpha");
    if (!alpha || memhook_patch(alpha, (void *)hook_iswalpha, (void **)&original_iswalpha, &handle) != 0) {
        fprintf(stderr, "under_uprobe: iswalpha: %s\n", memhook_last_error());
        return 2;
    }
    if (probe_line("cuMemAlloc_v2", (void *)cuMemAlloc_v2) || probe_line("cuMemFree_v2", (void *)cuMemFree_v2) ||
        probe_line("munmap", dlsym(RTLD_DEFAULT, "munmap")) || probe_line("getpagesize", gps) ||
        probe_line("iswalpha", alpha))
        return 2;
    long page = sysconf(_SC_PAGESIZE);
    printf("ready\n");
    fflush(stdout);
    int ok = 1;
    char line[64];
    for (int phase = 1; fgets(line, sizeof line, stdin); phase++) {
        int a0 = allocs, f0 = frees, m0 = munmaps, g0 = pagesizes, w0 = alphas, failed = 0;
        for (int i = 0; i < ROUNDS; i++) {
            uint64_t d = 0;
            if (cuMemAlloc_v2(&d, 4096) != 0 || cuMemFree_v2(d) != 0) failed++;
            void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED || munmap(p, 4096) != 0) failed++;
            if (getpagesize() != page) failed++;
            /* A letter and a digit, each seen by the hook as passed. */
            if (!iswalpha(L'a' + i) || alpha_seen != (wint_t)(L'a' + i)) failed++;
            if (iswalpha(L'0' + i) || alpha_seen != (wint_t)(L'0' + i)) failed++;
        }
        int a = allocs - a0, f = frees - f0, m = munmaps - m0, g = pagesizes - g0, w = alphas - w0;
        printf("phase %d: allocations %d, frees %d, munmaps %d, getpagesize hooked %d, iswalpha hooked %d, failed %d\n",
               phase, a, f, m, g, w, failed);
        fflush(stdout);
        ok &= a == ROUNDS && f == ROUNDS && m == ROUNDS && g >= ROUNDS && w >= 2 * ROUNDS && failed == 0;
    }
    return ok ? 0 : 1;
}

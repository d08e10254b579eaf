/* libmemhook.so loaded late, where libcuda is loaded and holds
 * allocations: its constructor installs (MEMHOOK_TRACE=1 in the
 * environment), the CUDA hooks attach, and the memtype map is laid out
 * (written) then, before any allocation is hooked. Prints
 * whether transparent huge pages can be had here at all (a control
 * region advised and touched), then the map's huge pages.
 *
 *   late_load LIBMEMHOOK MAP_OFFSET MAP_SIZE
 *
 * MAP_OFFSET and MAP_SIZE (hexadecimal): the map's static in the library
 * (its symbol), from the test that runs this (ffi/tests/constructors.rs).
 * Output: "control KB", "map KB" (AnonHugePages over each range), and
 * "recorded N" (of N allocations made after the load, those the map
 * answers for as CUDA memory: the hooks are in place). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "memhook.h"

typedef unsigned long long CUdeviceptr;
int cuInit(unsigned flags);
int cuMemAlloc_v2(CUdeviceptr *p, size_t size);

/* AnonHugePages, in kB, of the mappings that overlap [lo, hi). */
static long huge_kb(uintptr_t lo, uintptr_t hi) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    long kb = 0;
    int in = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        long v;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = a < hi && lo < b;
        else if (in && sscanf(line, "AnonHugePages: %ld kB", &v) == 1)
            kb += v;
    }
    fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    enum { N = 16 };
    CUdeviceptr p[N];
    if (argc != 4) return 2;
    if (cuInit(0) != 0) return 3;
    for (int i = 0; i < N; i++)
        if (cuMemAlloc_v2(&p[i], 1 << 20) != 0) return 4;

    /* The control: 2 MiB aligned, advised, then touched. */
    size_t len = 4 << 20;
    char *c = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c == MAP_FAILED) return 5;
    char *aligned = (char *)(((uintptr_t)c + len - 1) & ~(uintptr_t)(len - 1));
    madvise(aligned, len, MADV_HUGEPAGE);
    memset(aligned, 1, len);
    printf("control %ld\n", huge_kb((uintptr_t)aligned, (uintptr_t)aligned + len));

    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 6;
    }
    struct link_map *lm;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0) return 7;
    uintptr_t map = lm->l_addr + strtoull(argv[2], NULL, 16);
    uintptr_t size = strtoull(argv[3], NULL, 16);
    printf("map %ld\n", huge_kb(map, map + size));

    int (*lookup)(const void *, size_t, memhook_mem_info_t *) = dlsym(h, "memhook_memtype_lookup");
    if (!lookup) return 8;
    for (int i = 0; i < N; i++)
        if (cuMemAlloc_v2(&p[i], 1 << 20) != 0) return 9;
    int recorded = 0;
    for (int i = 0; i < N; i++) {
        memhook_mem_info_t info;
        if (lookup((const void *)(uintptr_t)p[i], 8, &info) == 0 && info.mem_type == MEMHOOK_MEM_TYPE_CUDA)
            recorded++;
    }
    printf("recorded %d\n", recorded);
    return 0;
}

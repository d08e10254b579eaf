/* A program a developer debugs with gdb, breakpoints set on functions
 * memhook hooks before memhook installs (scripts/check-debugger.sh runs
 * it under gdb, against the fake CUDA driver of tests/cuda/fakecuda.c).
 * gdb puts its int3 after a function's frame setup: cuMemAlloc_v2+4 on
 * driver 580's entries (push rbp; mov rbp, rsp), inside the bytes a
 * bistro patch moves. bistro must refuse such a function, saying why,
 * and leave it to the other CUDA modes: every allocation and free is
 * still reported, and the program runs to its end (before, the int3 was
 * moved into the trampoline: SIGTRAP there, and gdb's removal of its
 * breakpoint would have written into the patch).
 *
 * Prints each refused bistro patch with its reason, then a line
 * "allocations A, frees F"; exits 0 when A and F are the calls made. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "memhook.h"

int cuInit(unsigned);
int cuMemAlloc_v2(uint64_t *, size_t);
int cuMemFree_v2(uint64_t);

#define ROUNDS 5
static int allocs, frees;

static void count(uint32_t type, memhook_event_t *e, void *arg) {
    (void)e;
    (void)arg;
    if (type == MEMHOOK_EVENT_MEM_TYPE_ALLOC) allocs++;
    if (type == MEMHOOK_EVENT_MEM_TYPE_FREE) frees++;
}

int main(void) {
    if (cuInit(0) != 0) return 2;
    if (memhook_install(NULL) != 0 ||
        memhook_set_event_handler(MEMHOOK_EVENT_MEM_TYPE_ALLOC | MEMHOOK_EVENT_MEM_TYPE_FREE, 0, count, NULL) != 0) {
        fprintf(stderr, "under_gdb: %s\n", memhook_last_error());
        return 2;
    }
    for (int i = 0; i < ROUNDS; i++) {
        uint64_t d = 0;
        if (cuMemAlloc_v2(&d, 4096) != 0 || cuMemFree_v2(d) != 0) return 2;
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED || munmap(p, 4096) != 0) return 2;
    }
    struct memhook_hook_status_t st;
    for (size_t i = 0; memhook_status(i, &st) == 0; i++)
        if (!st.installed && !st.pending && strcmp(st.mode, "bistro") == 0)
            printf("refused: %s: %s\n", st.function, st.reason);
    printf("allocations %d, frees %d\n", allocs, frees);
    return allocs == ROUNDS && frees == ROUNDS ? 0 : 1;
}

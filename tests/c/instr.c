/* Instructions a hooked call costs, counted by callgrind (so the machine's
 * load does not matter): scripts/callgrind.sh runs this under valgrind
 * with N and 2N calls and takes the difference. A C user's view: linked
 * against libmemhook.so and the fake CUDA driver (tests/cuda/fakecuda.c).
 *
 *   instr mmap|cuda|ring plain|hooked|handler N
 *
 * mmap: N pairs of mmap+munmap of 4 KiB; cuda: N pairs of cuMemAlloc_v2 +
 * cuMemFree_v2 of 4 KiB (the fake driver gives the freed address back to
 * the next allocation); ring: N steps of freeing the oldest of eight live
 * 256-byte allocations and allocating anew, each at a new address. plain: no install; hooked: the hooks of that
 * family alone, in bistro mode, no handler; handler: and one empty C
 * handler of the family's aggregate events (VM_MAPPED | VM_UNMAPPED;
 * MEM_TYPE_ALLOC | MEM_TYPE_FREE). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "memhook.h"

typedef int (*alloc_fn)(uint64_t *, size_t);
typedef int (*free_fn)(uint64_t);
int cuMemAlloc_v2(uint64_t *, size_t);
int cuMemFree_v2(uint64_t);

static long events_seen;

/* Counts, so that the run checks the hooks reported every call. */
static void empty(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)e;
    (void)arg;
    events_seen++;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: instr mmap|cuda|ring plain|hooked|handler N\n");
        return 2;
    }
    int ring = strcmp(argv[1], "ring") == 0;
    int cuda = ring || strcmp(argv[1], "cuda") == 0;
    long n = atol(argv[3]);
    if (strcmp(argv[2], "plain") != 0) {
        if (memhook_install(cuda ? "cuda=bistro;mmap=none" : "cuda=none;mmap=bistro") != MEMHOOK_OK) {
            fprintf(stderr, "install: %s\n", memhook_last_error());
            return 1;
        }
        if (strcmp(argv[2], "handler") == 0) {
            uint32_t events = cuda ? MEMHOOK_EVENT_MEM_TYPE_ALLOC | MEMHOOK_EVENT_MEM_TYPE_FREE
                                   : MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED;
            if (memhook_set_event_handler(events, 0, empty, NULL) != MEMHOOK_OK)
                return 1;
        }
    }
    /* Through pointers, so that the calls go where the hooks lead
     * whatever the mode (a bistro patch is in the function itself). */
    alloc_fn volatile alloc = (alloc_fn)cuMemAlloc_v2;
    free_fn volatile release = (free_fn)cuMemFree_v2;
    uint64_t live[8];
    if (ring)
        for (int k = 0; k < 8; k++)
            if (alloc(&live[k], 256) != 0)
                return 1;
    for (long i = 0; i < n; i++) {
        if (ring) {
            if (release(live[i % 8]) != 0 || alloc(&live[i % 8], 256) != 0)
                return 1;
        } else if (cuda) {
            uint64_t p;
            if (alloc(&p, 4096) != 0 || release(p) != 0)
                return 1;
        } else {
            void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED || munmap(p, 4096) != 0)
                return 1;
        }
    }
    if (strcmp(argv[2], "handler") == 0 && events_seen != 2 * n + (ring ? 8 : 0)) {
        fprintf(stderr, "%ld events for %ld pairs\n", events_seen, n);
        return 1;
    }
    return 0;
}

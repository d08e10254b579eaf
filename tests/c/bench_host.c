/* The added cost of memhook's host hooks as a C user of libmemhook.so sees
 * it (the library is mapped near libc, so the entry jump reaches the hook
 * directly): mmap+munmap of 4 KiB, unhooked, hooked with no handler, hooked
 * with one empty C handler for all events, for VM_MAPPED | VM_UNMAPPED (the
 * goal's handler) and for VM_UNMAPPED only (what a registration cache
 * registers). Interleaved rounds, medians.
 * Build: cc -O2 -I include tests/c/bench_host.c -L target/release -lmemhook */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include "memhook.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static double round_ns(int n) {
    double t = now();
    for (int i = 0; i < n; i++) {
        void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        munmap(p, 4096);
    }
    return (now() - t) / n;
}

static void empty(uint32_t type, memhook_event_t *e, void *arg) { (void)type; (void)e; (void)arg; }

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define ROUNDS 41
int main(void) {
    double plain[ROUNDS], bare[ROUNDS], all[ROUNDS], vm[ROUNDS], unmap_only[ROUNDS];
    uint32_t every = MEMHOOK_EVENT_MMAP | MEMHOOK_EVENT_MUNMAP | MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED;
    uint32_t vm_events = MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED;
    for (int r = 0; r < ROUNDS; r++) {
        plain[r] = round_ns(2000);
        if (memhook_install("cuda=none;mmap=bistro") != MEMHOOK_OK) return 1;
        bare[r] = round_ns(2000);
        memhook_set_event_handler(every, 0, empty, NULL);
        all[r] = round_ns(2000);
        memhook_unset_event_handler(every, empty, NULL);
        memhook_set_event_handler(vm_events, 0, empty, NULL);
        vm[r] = round_ns(2000);
        memhook_unset_event_handler(vm_events, empty, NULL);
        memhook_set_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, 0, empty, NULL);
        unmap_only[r] = round_ns(2000);
        memhook_unset_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, empty, NULL);
        memhook_uninstall();
    }
    qsort(plain, ROUNDS, sizeof(double), cmp);
    qsort(bare, ROUNDS, sizeof(double), cmp);
    qsort(all, ROUNDS, sizeof(double), cmp);
    qsort(vm, ROUNDS, sizeof(double), cmp);
    qsort(unmap_only, ROUNDS, sizeof(double), cmp);
    double p = plain[ROUNDS / 2];
    printf("libmemhook.so, mmap+munmap 4 KiB, median of %d interleaved rounds of 2000 pairs:\n", ROUNDS);
    printf("  unhooked                               %8.0f ns\n", p);
    printf("  hooked, no handler                     %8.0f ns (%+.0f)\n", bare[ROUNDS / 2], bare[ROUNDS / 2] - p);
    printf("  hooked, one empty handler, all events  %8.0f ns (%+.0f)\n", all[ROUNDS / 2], all[ROUNDS / 2] - p);
    printf("  hooked, one empty handler, VM events   %8.0f ns (%+.0f)\n", vm[ROUNDS / 2], vm[ROUNDS / 2] - p);
    printf("  hooked, one empty handler, VM_UNMAPPED %8.0f ns (%+.0f)\n", unmap_only[ROUNDS / 2], unmap_only[ROUNDS / 2] - p);
    return 0;
}

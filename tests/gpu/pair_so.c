/* The added latency of the real cuMemAlloc_v2 + cuMemFree_v2 (4 KiB)
 * through libmemhook.so, as an embedder or `memhook run` gets it (the
 * Rust examples link memhook into the executable, where a thread-local
 * costs one instruction; in a shared object it is a call into the
 * dynamic linker). Rounds of one pair through the patched entries and
 * one through memhook_original's, in random order; the median of the
 * per-round differences, bare and with one empty handler. Usage:
 * pair_so [rounds]. */
#define PROGRAM "pair_so"
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "events.h"

typedef int (*alloc_t)(uint64_t *, size_t);
typedef int (*free_t)(uint64_t);

static uint64_t now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* One pair through (a, f), timed; out of line, so that both sides run
 * the same caller code. */
__attribute__((noinline)) static int64_t pair(alloc_t a, free_t f) {
    uint64_t p = 0;
    uint64_t t0 = now();
    CHECK(a(&p, 4096));
    CHECK(f(p));
    return (int64_t)(now() - t0);
}

static int cmp(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

static void measure(const char *what, int rounds, alloc_t ha, free_t hf, alloc_t oa, free_t of) {
    int64_t *d = malloc(sizeof *d * (size_t)rounds);
    uint64_t seed = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < 2000; i++) { /* warm-up */
        pair(ha, hf);
        pair(oa, of);
    }
    for (int i = 0; i < rounds; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        int64_t h, o;
        if (seed & 1) {
            h = pair(ha, hf);
            o = pair(oa, of);
        } else {
            o = pair(oa, of);
            h = pair(ha, hf);
        }
        d[i] = h - o;
    }
    qsort(d, (size_t)rounds, sizeof *d, cmp);
    printf(PROGRAM ": %s, median of the %d per-round differences: added %lld ns (quartiles %lld to %lld)\n", what,
           rounds, (long long)d[rounds / 2], (long long)d[rounds / 4], (long long)d[3 * rounds / 4]);
    free(d);
}

static void quiet(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type, (void)e, (void)arg;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 40000;
    if (memhook_install("cuda=bistro;mmap=none") != 0) {
        fprintf(stderr, PROGRAM ": install: %s\n", memhook_last_error());
        return 4;
    }
    init_driver();
    alloc_t ha = (alloc_t)fn("cuMemAlloc_v2"), oa = (alloc_t)memhook_original("cuMemAlloc_v2");
    free_t hf = (free_t)fn("cuMemFree_v2"), of = (free_t)memhook_original("cuMemFree_v2");
    if (!oa || !of || (void *)oa == (void *)ha) {
        fprintf(stderr, PROGRAM ": cuMemAlloc_v2 not hooked\n");
        return 5;
    }
    measure("cuMemAlloc_v2+cuMemFree_v2 4KiB through libmemhook.so", rounds, ha, hf, oa, of);
    CHECK(memhook_set_event_handler(MEMHOOK_EVENT_MEM_TYPE_ALLOC | MEMHOOK_EVENT_MEM_TYPE_FREE, 0, quiet, NULL));
    measure("the same, one empty handler", rounds / 2, ha, hf, oa, of);
    return 0;
}

/* What the C programs of tests/gpu share: the driver's functions found
 * with dlsym (as a program that loads the driver itself finds them:
 * procaddr answers dlsym with its hooks, bistro patches the entries),
 * a check of their results, and a handler that keeps the memory-type
 * events delivered, in order (a handler must not allocate). A program
 * defines PROGRAM, its name for messages, before including this. */
#ifndef MEMHOOK_GPU_EVENTS_H
#define MEMHOOK_GPU_EVENTS_H

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "memhook.h"

/* libcuda.so.1, opened by the program. */
static void *cuda;

/* The driver's `name` (exits when missing). */
static void *fn(const char *name) {
    void *f = dlsym(cuda, name);
    if (!f) {
        fprintf(stderr, PROGRAM ": %s not found\n", name);
        exit(2);
    }
    return f;
}

#define CHECK(call)                                                          \
    do {                                                                     \
        int rc_ = (call);                                                    \
        if (rc_ != 0) {                                                      \
            fprintf(stderr, PROGRAM ": %s = %d\n", #call, rc_);              \
            exit(3);                                                         \
        }                                                                    \
    } while (0)

static struct {
    uint32_t type;
    uintptr_t address;
    size_t size;
} events[256];
static atomic_int nevents;

static inline void on_event(uint32_t type, memhook_event_t *e, void *arg) {
    (void)arg;
    int i = atomic_fetch_add(&nevents, 1);
    if (i < 256) {
        events[i].type = type;
        events[i].address = (uintptr_t)e->mem_type.address;
        events[i].size = e->mem_type.size;
    }
}

/* memhook installed with the CUDA hooks in `mode` (host hooks off), and
 * on_event registered for the memory-type events (exits 4 when refused). */
static inline void install_in(const char *mode) {
    char config[128];
    snprintf(config, sizeof config, "cuda=%s;mmap=none", mode);
    if (memhook_install(config) != 0) {
        fprintf(stderr, PROGRAM ": install %s: %s\n", config, memhook_last_error());
        exit(4);
    }
    CHECK(memhook_set_event_handler(MEMHOOK_EVENT_MEM_TYPE_ALLOC | MEMHOOK_EVENT_MEM_TYPE_FREE, 0, on_event, NULL));
}

/* libcuda loaded (after the install: hooked as it loads) and device 0's
 * primary context current. */
static inline void init_driver(void) {
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        fprintf(stderr, PROGRAM ": no libcuda.so.1\n");
        exit(2);
    }
    void *ctx = NULL;
    CHECK(((int (*)(unsigned))fn("cuInit"))(0));
    CHECK(((int (*)(void **, int))fn("cuDevicePrimaryCtxRetain"))(&ctx, 0));
    CHECK(((int (*)(void *))fn("cuCtxSetCurrent"))(ctx));
}

/* Events of `type` at `address` so far; the size of the last in *size
 * (when size is not NULL). */
static inline int seen(uint32_t type, uintptr_t address, size_t *size) {
    int n = 0, total = atomic_load(&nevents);
    for (int i = 0; i < total && i < 256; i++) {
        if (events[i].type == type && events[i].address == address) {
            n++;
            if (size)
                *size = events[i].size;
        }
    }
    return n;
}

#endif

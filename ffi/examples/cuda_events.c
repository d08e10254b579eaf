/* memhook's C ABI on CUDA memory, against the fake driver of tests/cuda
 * (argv[1]: its libcuda.so.1): install all three CUDA modes, count
 * memory-type events with a handler, load the driver after install (as
 * the CUDA runtime does), allocate and free through pointers from dlsym,
 * look the allocations up, classify one through the driver, and find the
 * hooks in memhook_status. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "memhook.h"

typedef unsigned long long CUdeviceptr;
typedef int (*alloc_fn)(CUdeviceptr *, size_t);
typedef int (*free_fn)(CUdeviceptr);

static int allocs, frees;
static size_t bytes;

static void count(uint32_t type, memhook_event_t *e, void *arg) {
    (void)arg;
    if (type == MEMHOOK_EVENT_MEM_TYPE_ALLOC && e->mem_type.mem_type == MEMHOOK_MEM_TYPE_CUDA) {
        allocs++;
        bytes += e->mem_type.size;
    } else if (type == MEMHOOK_EVENT_MEM_TYPE_FREE) {
        frees++;
    }
}

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "cuda_events: %s failed (line %d): %s\n", #c, __LINE__,                 \
                    memhook_last_error());                                                         \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    CHECK(argc == 2);
    printf("memhook %s\n", memhook_version());
    CHECK(memhook_install("cuda=bistro,reloc,procaddr;mmap=none") == 0);
    CHECK(memhook_set_event_handler(MEMHOOK_EVENT_MEM_TYPE_ALLOC | MEMHOOK_EVENT_MEM_TYPE_FREE, 0, count, NULL) == 0);

    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    alloc_fn a = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    free_fn f = (free_fn)dlsym(h, "cuMemFree_v2");
    CHECK(a && f);

    CUdeviceptr p[4];
    for (int i = 0; i < 4; i++)
        CHECK(a(&p[i], 1 << 20) == 0);
    CHECK(allocs == 4 && bytes == 4u << 20);

    memhook_mem_info_t info;
    CHECK(memhook_memtype_lookup((void *)(uintptr_t)(p[2] + 100), 64, &info) == 0);
    CHECK(info.mem_type == MEMHOOK_MEM_TYPE_CUDA && info.base == (void *)(uintptr_t)p[2] && info.len == 1 << 20);
    CHECK(memhook_memtype_classify((void *)(uintptr_t)p[3], 1, &info) == 0);
    CHECK(info.mem_type == MEMHOOK_MEM_TYPE_CUDA && info.device == 0);
    int host_var = 0;
    CHECK(memhook_memtype_lookup(&host_var, sizeof host_var, &info) == 0);
    CHECK(info.mem_type == MEMHOOK_MEM_TYPE_HOST);

    for (int i = 0; i < 4; i++)
        CHECK(f(p[i]) == 0);
    CHECK(frees == 4);
    CHECK(memhook_memtype_lookup((void *)(uintptr_t)p[0], 1, &info) == 0 && info.mem_type == MEMHOOK_MEM_TYPE_HOST);

    /* The status names each function and mode. */
    memhook_hook_status_t st;
    int found = 0, n = 0;
    while (memhook_status(n, &st) == 0) {
        if (strcmp(st.function, "cuMemAlloc_v2") == 0 && strcmp(st.mode, "bistro") == 0 && st.installed == 1 &&
            strcmp(st.library, "libcuda.so.1") == 0)
            found = 1;
        n++;
    }
    CHECK(found);
    CHECK(memhook_status(n, &st) == MEMHOOK_ERR_NOT_FOUND);
    printf("cuda_events: %d allocations, %d frees, %d status entries: ok\n", allocs, frees, n);
    return 0;
}

/* Two copies of memhook in one process (see two_instances.c), both with
 * the default configuration, and a program that calls the CUDA driver
 * (here the fake driver of the tests, linked in). The second copy finds
 * the driver's functions with dlsym, which the first copy answers with
 * its own hooks: the second's bistro and procaddr hooks are refused, and
 * its status says why. Both still see the allocation (the second through
 * its reloc hook of the program's call, which leads to the first's).
 *
 * Build: cc -I include two_instances_cuda.c -L target/debug -lmemhook -ldl path/to/libcuda.so.1
 * Run:   ./a.out path/to/copy-of-libmemhook.so */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memhook.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "failed: %s\n", #c); exit(1); } } while (0)

typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
int cuMemFree_v2(CUdeviceptr dptr);

static int seen_a, seen_b;

static void on_a(uint32_t type, memhook_event_t *e, void *arg) {
    (void)e, (void)arg;
    seen_a += type == MEMHOOK_EVENT_MEM_TYPE_ALLOC;
}

static void on_b(uint32_t type, memhook_event_t *e, void *arg) {
    (void)e, (void)arg;
    seen_b += type == MEMHOOK_EVENT_MEM_TYPE_ALLOC;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    CHECK(memhook_install(NULL) == 0);
    CHECK(memhook_set_event_handler(MEMHOOK_EVENT_MEM_TYPE_ALLOC, 0, on_a, NULL) == 0);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    int (*install_b)(const char *) = (int (*)(const char *))dlsym(h, "memhook_install");
    int (*set_handler_b)(uint32_t, int, memhook_event_cb, void *) =
        (int (*)(uint32_t, int, memhook_event_cb, void *))dlsym(h, "memhook_set_event_handler");
    int (*status_b)(size_t, memhook_hook_status_t *) = (int (*)(size_t, memhook_hook_status_t *))dlsym(h, "memhook_status");
    CHECK(install_b && set_handler_b && status_b);
    CHECK(install_b(NULL) == 0);
    CHECK(set_handler_b(MEMHOOK_EVENT_MEM_TYPE_ALLOC, 0, on_b, NULL) == 0);

    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 4096) == 0);
    CHECK(cuMemFree_v2(p) == 0);
    printf("allocations seen: a=%d b=%d\n", seen_a, seen_b);
    memhook_hook_status_t st;
    for (size_t i = 0; status_b(i, &st) == 0; i++)
        if (strcmp(st.function, "cuMemAlloc_v2") == 0)
            printf("B: cuMemAlloc_v2 %s installed=%d %s\n", st.mode, st.installed, st.reason);
    return 0;
}

/* A program with an mmap of its own (a profiler or sandbox interposing
 * the function, here forwarding to the C library's): dlsym(RTLD_DEFAULT,
 * "mmap") finds the program's, but bistro patches the C library's entry,
 * so the calls the C library makes inside itself (malloc's mmap of a
 * large block, free's munmap) are reported as well as the program's own,
 * each once.
 *
 * Build: cc -I include own_mmap.c -L target/debug -lmemhook -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "memhook.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "failed: %s\n", #c); exit(1); } } while (0)
#define BIG (64 << 20) /* above malloc's mmap threshold */

static int own_calls;

void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset) {
    static void *(*next)(void *, size_t, int, int, int, off_t);
    if (next == NULL)
        next = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
    own_calls++;
    return next(addr, length, prot, flags, fd, offset);
}

static int big_maps, big_unmaps;

/* Where the large block's address goes: a compiler may drop a malloc
 * whose block nothing reads, with its memset and free (GCC 16 at -O2
 * drops this one, and the C library then maps nothing). */
static void *volatile block_seen;

static void on_event(uint32_t type, memhook_event_t *e, void *arg) {
    (void)arg;
    if (type == MEMHOOK_EVENT_VM_MAPPED && e->vm.size >= BIG)
        big_maps++;
    if (type == MEMHOOK_EVENT_VM_UNMAPPED && e->vm.size >= BIG)
        big_unmaps++;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    CHECK(memhook_install(argv[1]) == 0);
    CHECK(memhook_set_event_handler(MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED, 0, on_event, NULL) == 0);
    /* The C library's own calls: not through the program's mmap. */
    char *p = malloc(BIG);
    CHECK(p != NULL);
    memset(p, 1, 4096);
    block_seen = p;
    free(p);
    printf("malloc and free: %d mapped, %d unmapped\n", big_maps, big_unmaps);
    /* The program's own call, through its mmap to the C library's. */
    big_maps = big_unmaps = 0;
    int before = own_calls;
    void *q = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(q != MAP_FAILED && own_calls == before + 1);
    CHECK(munmap(q, BIG) == 0);
    printf("the program's mmap and munmap: %d mapped, %d unmapped\n", big_maps, big_unmaps);
    return 0;
}

/* memhook allocates nothing while it installs: what an allocator that
 * installs it from inside its own first malloc relies on (the C library's
 * malloc would be its own, entered again). This program replaces malloc
 * for the whole process (the C library and the dynamic loader call the
 * program's) with a counting bump allocator, opens memhook (libmemhook.so,
 * or a plugin built from libmemhook.a), and counts the allocations made
 * during each install and uninstall of the configurations it is given.
 * No CUDA library is loaded: the CUDA hooks' names are found nowhere,
 * where a dlsym that finds nothing allocates its error message.
 *
 * With each installed, it also counts the allocations made while a
 * handler sees mmap, mremap, madvise and munmap calls: none either.
 *
 * A configuration of "env" installs with a null string: from the
 * environment's MEMHOOK_MMAP_HOOK_MODE and MEMHOOK_CUDA_HOOK_MODE.
 *
 * Build: cc -I include no_malloc.c -ldl
 * Run:   ./a.out path/to/libmemhook.so "mmap=bistro" "mmap=reloc;cuda=reloc" env ... */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "memhook.h"

static _Alignas(4096) char arena[32 << 20];
static size_t used;
static int counting, counted;

static void *bump(size_t n, size_t align) {
    if (align < 16)
        align = 16;
    size_t at = (used + sizeof(size_t) + align - 1) & ~(align - 1);
    if (at + n > sizeof arena)
        return NULL;
    ((size_t *)(arena + at))[-1] = n;
    used = at + n;
    if (counting)
        counted++;
    return arena + at;
}

void *malloc(size_t n) { return bump(n, 16); }
void free(void *p) { (void)p; }
void *calloc(size_t a, size_t b) {
    void *p = bump(a * b, 16);
    if (p)
        memset(p, 0, a * b);
    return p;
}
void *realloc(void *p, size_t n) {
    void *q = bump(n, 16);
    if (p && q) {
        size_t old = ((size_t *)p)[-1];
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}
void *memalign(size_t a, size_t n) { return bump(n, a); }
void *aligned_alloc(size_t a, size_t n) { return bump(n, a); }
int posix_memalign(void **r, size_t a, size_t n) {
    *r = bump(n, a);
    return *r ? 0 : ENOMEM;
}
size_t malloc_usable_size(void *p) { return p ? ((size_t *)p)[-1] : 0; }

static int events;

static void on_event(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type, (void)e, (void)arg;
    events++;
}

/* Hooked calls, each reported to the handler: the allocations they make. */
static int hooked_calls(void) {
    counted = 0;
    counting = 1;
    for (int i = 0; i < 8; i++) {
        char *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            break;
        p[0] = 1;
        madvise(p, 4096, MADV_DONTNEED);
        char *q = mremap(p, 1 << 16, 1 << 17, MREMAP_MAYMOVE);
        munmap(q == MAP_FAILED ? p : q, q == MAP_FAILED ? 1 << 16 : 1 << 17);
    }
    counting = 0;
    return counted;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIBRARY CONFIG...\n", argv[0]);
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    int (*install)(const char *) = (int (*)(const char *))dlsym(h, "memhook_install");
    void (*uninstall)(void) = (void (*)(void))dlsym(h, "memhook_uninstall");
    int (*set_handler)(uint32_t, int, memhook_event_cb, void *) =
        (int (*)(uint32_t, int, memhook_event_cb, void *))dlsym(h, "memhook_set_event_handler");
    void (*unset_handler)(uint32_t, memhook_event_cb, void *) =
        (void (*)(uint32_t, memhook_event_cb, void *))dlsym(h, "memhook_unset_event_handler");
    if (install == NULL || uninstall == NULL || set_handler == NULL || unset_handler == NULL) {
        fprintf(stderr, "no memhook_install, _uninstall or _set/_unset_event_handler in %s\n", argv[1]);
        return 1;
    }
    uint32_t all = MEMHOOK_EVENT_MMAP | MEMHOOK_EVENT_MUNMAP | MEMHOOK_EVENT_MREMAP | MEMHOOK_EVENT_MADVISE |
                   MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED;
    int total = 0;
    for (int i = 2; i < argc; i++) {
        for (int round = 0; round < 2; round++) {
            counted = 0;
            counting = 1;
            int rc = install(strcmp(argv[i], "env") == 0 ? NULL : argv[i]);
            counting = 0;
            int in_install = counted;
            if (rc == 0 && set_handler(all, 0, on_event, NULL) == 0) {
                events = 0;
                int in_calls = hooked_calls();
                unset_handler(all, on_event, NULL);
                printf("%s (round %d): hooked calls, %d allocations, %d events\n", argv[i], round, in_calls,
                       events);
                total += in_calls;
            }
            counted = 0;
            counting = 1;
            uninstall();
            counting = 0;
            printf("%s (round %d): install %d, %d allocations; uninstall, %d allocations\n", argv[i], round, rc,
                   in_install, counted);
            if (rc != 0)
                return 1;
            total += in_install + counted;
        }
    }
    printf("allocations in all: %d\n", total);
    return total == 0 ? 0 : 3;
}

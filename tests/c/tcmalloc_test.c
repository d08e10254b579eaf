/* memhook under a real replacement allocator: run with
 * LD_PRELOAD=libtcmalloc_minimal.so.4. tcmalloc grows its heap with sbrk
 * and mmap; with memhook's bistro hooks every large block it hands out
 * after install lies in a range reported as VM_MAPPED. */
#define _GNU_SOURCE
#include <assert.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memhook.h"

#define RANGES 4096
/* volatile: the handler runs inside malloc, which GCC otherwise assumes
 * leaves the program's globals alone. */
static volatile uintptr_t start[RANGES], end[RANGES];
static volatile int nranges, unmapped;

static void on_vm(uint32_t type, memhook_event_t *e, void *arg) {
    (void)arg;
    if (type == MEMHOOK_EVENT_VM_MAPPED && nranges < RANGES) {
        start[nranges] = (uintptr_t)e->vm.address;
        end[nranges] = (uintptr_t)e->vm.address + e->vm.size;
        nranges++;
    } else if (type == MEMHOOK_EVENT_VM_UNMAPPED) {
        unmapped++;
    }
}

/* Whether the reported ranges (existing ones replayed, new ones since)
 * cover [p, p + n): a block may continue a heap grown before install. */
static int covered(void *p, size_t n) {
    uintptr_t pos = (uintptr_t)p, stop = (uintptr_t)p + n;
    while (pos < stop) {
        uintptr_t next = pos;
        for (int i = 0; i < nranges; i++)
            if (start[i] <= pos && pos < end[i] && end[i] > next) next = end[i];
        if (next == pos) return 0;
        pos = next;
    }
    return 1;
}

int main(void) {
    /* Really under tcmalloc? */
    assert(dlsym(RTLD_DEFAULT, "tc_malloc") != NULL);
    assert(memhook_install("cuda=none;mmap=bistro") == MEMHOOK_OK);
    /* EXISTING_ALLOC: the mappings that exist now are replayed first. */
    uint32_t events = MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED | MEMHOOK_EVENT_FLAG_EXISTING_ALLOC;
    assert(memhook_set_event_handler(events, 0, on_vm, NULL) == MEMHOOK_OK);
    int existing = nranges;
    assert(existing > 3);
    void *blocks[8];
    size_t size = 64 << 20;
    for (int i = 0; i < 8; i++) {
        blocks[i] = malloc(size);
        assert(blocks[i] != NULL);
        memset(blocks[i], 1, 4096);
        if (!covered(blocks[i], size)) {
            fprintf(stderr, "block %d at %p (%zu bytes) not in any reported mapping (%d ranges)\n", i, blocks[i], size, nranges);
            for (int k = 0; k < nranges; k++) fprintf(stderr, "  %#lx-%#lx\n", (unsigned long)start[k], (unsigned long)end[k]);
            return 1;
        }
    }
    for (int i = 0; i < 8; i++) free(blocks[i]);
    memhook_unset_event_handler(MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED, on_vm, NULL);
    assert(memhook_uninstall() == MEMHOOK_OK);
    assert(nranges > existing); /* tcmalloc grew its heap after install */
    printf("tcmalloc test passed: %d existing mappings replayed, %d new, %d unmaps\n", existing, nranges - existing, unmapped);
    return 0;
}

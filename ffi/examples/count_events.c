/* memhook's C ABI for events and memory types, used as a C library would:
 * install from a config string, count events with a handler, report an
 * allocator's own typed allocation, look it up, call the originals past
 * the hooks, see a bad config refused with the token named, and a
 * handler's removal of itself refused, with the reason. */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "memhook.h"

#define MARK (9 * 4096)

static int mapped, unmapped, vm_mapped, vm_unmapped;

static void count(uint32_t type, memhook_event_t *e, void *arg) {
    assert(arg == (void *)&mapped);
    switch (type) {
    case MEMHOOK_EVENT_MMAP:
        if (e->mmap.size == MARK && e->mmap.result != MAP_FAILED) mapped++;
        break;
    case MEMHOOK_EVENT_MUNMAP:
        if (e->munmap.size == MARK && e->munmap.result == 0) unmapped++;
        break;
    case MEMHOOK_EVENT_VM_MAPPED:
        if (e->vm.size == MARK) vm_mapped++;
        break;
    case MEMHOOK_EVENT_VM_UNMAPPED:
        if (e->vm.size == MARK) vm_unmapped++;
        break;
    }
}

/* A handler that tries to remove itself from inside: refused (it would
 * wait for itself), and memhook_unset_event_handler, which returns
 * nothing, says so in memhook_last_error. */
static int refused_inside, unset_self_calls;
static void unset_self(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    if (e->vm.size != MARK) return;
    unset_self_calls++;
    memhook_unset_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, unset_self, arg);
    if (strstr(memhook_last_error(), "memhook_unset_event_handler: cannot change handlers from inside a handler"))
        refused_inside++;
}

int main(void) {
    int rc = memhook_install("cuda=none;mmap=bistr");
    assert(rc == MEMHOOK_ERR_CONFIG);
    assert(strstr(memhook_last_error(), "`bistr`") != NULL);

    /* A mask with a bit that is neither an event nor a flag (an event of a
     * later version) is refused by name, and nothing is registered (the
     * counts below would double). */
    rc = memhook_set_event_handler(MEMHOOK_EVENT_MMAP | (1u << 8), 0, count, &mapped);
    assert(rc == MEMHOOK_ERR_HANDLER);
    assert(strstr(memhook_last_error(), "bits 0x100 that are neither an event") != NULL);

    assert(memhook_install("cuda=none;mmap=bistro") == MEMHOOK_OK);
    uint32_t events = MEMHOOK_EVENT_MMAP | MEMHOOK_EVENT_MUNMAP | MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED;
    assert(memhook_set_event_handler(events, 0, count, &mapped) == MEMHOOK_OK);
    for (int i = 0; i < 10; i++) {
        void *p = mmap(NULL, MARK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert(p != MAP_FAILED);
        assert(munmap(p, MARK) == 0);
    }
    assert(mapped == 10 && unmapped == 10 && vm_mapped == 10 && vm_unmapped == 10);

    /* The originals map and unmap unreported; an unknown name is refused. */
    void *(*orig_mmap)(void *, size_t, int, int, int, off_t) =
        (void *(*)(void *, size_t, int, int, int, off_t))memhook_original("mmap");
    int (*orig_munmap)(void *, size_t) = (int (*)(void *, size_t))memhook_original("munmap");
    assert(orig_mmap != NULL && orig_munmap != NULL);
    void *q = orig_mmap(NULL, MARK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert(q != MAP_FAILED && orig_munmap(q, MARK) == 0);
    assert(mapped == 10 && unmapped == 10 && vm_mapped == 10 && vm_unmapped == 10);
    assert(memhook_original("malloc") == NULL);
    assert(strstr(memhook_last_error(), "`malloc`") != NULL);

    /* An allocator reporting its own device allocation (NO_INSTALL users). */
    memhook_event_t ev;
    ev.mem_type.address = (void *)0x7f0000100000;
    ev.mem_type.size = 1 << 20;
    ev.mem_type.mem_type = MEMHOOK_MEM_TYPE_CUDA;
    assert(memhook_report_event(MEMHOOK_EVENT_MEM_TYPE_ALLOC, &ev) == MEMHOOK_OK);
    memhook_mem_info_t info;
    assert(memhook_memtype_lookup((void *)0x7f0000100400, 64, &info) == MEMHOOK_OK);
    assert(info.mem_type == MEMHOOK_MEM_TYPE_CUDA && info.base == (void *)0x7f0000100000 && info.len == (1 << 20));
    assert(memhook_memtype_lookup((void *)0x7f00001ffff0, 64, &info) == MEMHOOK_OK);
    assert(info.mem_type == MEMHOOK_MEM_TYPE_UNKNOWN); /* straddles the end */
    assert(memhook_report_event(MEMHOOK_EVENT_MEM_TYPE_FREE, &ev) == MEMHOOK_OK);
    assert(memhook_memtype_lookup((void *)0x7f0000100400, 64, &info) == MEMHOOK_OK);
    assert(info.mem_type == MEMHOOK_MEM_TYPE_HOST);
    /* A free of unknown size (0, as a free call has none) ends the
     * allocation at its address, and comes back with its size. */
    assert(memhook_report_event(MEMHOOK_EVENT_MEM_TYPE_ALLOC, &ev) == MEMHOOK_OK);
    ev.mem_type.size = 0;
    assert(memhook_report_event(MEMHOOK_EVENT_MEM_TYPE_FREE, &ev) == MEMHOOK_OK);
    assert(ev.mem_type.size == (1 << 20));
    assert(memhook_memtype_lookup((void *)0x7f0000100400, 64, &info) == MEMHOOK_OK);
    assert(info.mem_type == MEMHOOK_MEM_TYPE_HOST);
    /* A range past the end of the address space is refused, by name. */
    ev.mem_type.address = (void *)(uintptr_t)-4096;
    ev.mem_type.size = 8192;
    assert(memhook_report_event(MEMHOOK_EVENT_MEM_TYPE_ALLOC, &ev) == MEMHOOK_ERR_INVALID);
    assert(strstr(memhook_last_error(), "wraps around the address space") != NULL);

    assert(memhook_set_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, 0, unset_self, NULL) == MEMHOOK_OK);
    for (int i = 0; i < 2; i++) {
        void *r = mmap(NULL, MARK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert(r != MAP_FAILED && munmap(r, MARK) == 0);
    }
    assert(unset_self_calls == 2 && refused_inside == 2); /* still registered */
    memhook_unset_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, unset_self, NULL);

    memhook_unset_event_handler(events, count, &mapped);
    void *p = mmap(NULL, MARK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(p, MARK);
    assert(mapped == 12); /* no longer called */
    assert(unset_self_calls == 2);
    assert(memhook_uninstall() == MEMHOOK_OK);
    printf("C ABI events test passed\n");
    return 0;
}

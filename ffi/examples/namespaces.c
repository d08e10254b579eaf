/* A library opened with dlmopen(LM_ID_NEWLM, ...) runs with its own copy
 * of libc. memhook hooks that copy too (host hooks in bistro mode): here
 * the namespace's own mmap and munmap, called directly, are reported, and
 * memhook_namespace_status says how the namespace stands.
 *
 * Build: cc -I include namespaces.c -L target/debug -lmemhook -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "memhook.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "failed: %s (%s)\n", #c, memhook_last_error()); exit(1); } } while (0)

static void *watched;
static int mapped, unmapped;

static void on_event(uint32_t type, memhook_event_t *e, void *arg) {
    (void)arg;
    if (type == MEMHOOK_EVENT_VM_MAPPED && e->vm.address == watched)
        mapped++;
    if (type == MEMHOOK_EVENT_VM_UNMAPPED && e->vm.address == watched)
        unmapped++;
}

int main(void) {
    CHECK(memhook_install("mmap=bistro;cuda=none") == 0);
    CHECK(memhook_set_event_handler(MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED, 0, on_event, NULL) == 0);

    /* A second libc, in a namespace of its own. */
    void *h = dlmopen(LM_ID_NEWLM, "libc.so.6", RTLD_NOW);
    CHECK(h != NULL);
    Lmid_t lmid;
    CHECK(dlinfo(h, RTLD_DI_LMID, &lmid) == 0);
    /* Looking into the namespace (dlsym) is when memhook hooks its libc. */
    void *(*ns_mmap)(void *, size_t, int, int, int, off_t) = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(h, "mmap");
    int (*ns_munmap)(void *, size_t) = (int (*)(void *, size_t))dlsym(h, "munmap");
    CHECK(ns_mmap != NULL && ns_munmap != NULL && (void *)ns_mmap != (void *)mmap);

    void *p = ns_mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    watched = p;
    CHECK(ns_munmap(p, 1 << 16) == 0);
    /* The mapping was made before `watched` was set: only the unmap counts
     * here; map again at a known address to see the map. */
    void *q = ns_mmap(p, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    CHECK(q == p);
    CHECK(ns_munmap(q, 1 << 16) == 0);
    printf("namespace %ld: %d mapped, %d unmapped\n", (long)lmid, mapped, unmapped);
    CHECK(mapped == 1 && unmapped == 2);

    memhook_namespace_status_t st;
    CHECK(memhook_namespace_status(0, &st) == 0);
    printf("namespace %ld: %u of %u host functions hooked%s%s\n", (long)st.namespace_id, st.hooked, st.functions,
           st.reason[0] ? ": " : "", st.reason);
    CHECK(st.namespace_id == lmid && st.functions > 0 && st.hooked == st.functions);
    CHECK(memhook_namespace_status(1, &st) == MEMHOOK_ERR_NOT_FOUND);
    CHECK(memhook_uninstall() == 0);
    return 0;
}

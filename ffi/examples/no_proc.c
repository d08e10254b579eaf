/* memhook in a process with no /proc mounted (a chroot or sandbox
 * without it): the host hooks still install in bistro mode, their
 * trampolines placed by asking the kernel for addresses near libc one
 * after another (there is no map of the address space to read), and a
 * mapping's munmap is reported; the looks at the mappings that failed
 * are counted. ffi/tests/examples.rs runs it in a mount namespace whose
 * /proc is an empty file system. Prints what it saw; exits 0 when all
 * holds, 3 where /proc is mounted after all (not the case it checks). */
#define _GNU_SOURCE
#include <stdio.h>
#include <sys/mman.h>
#include "memhook.h"

static void *mapping;
static volatile size_t unmapped;
static void on_unmapped(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)arg;
    if (e->vm.address == mapping) unmapped += e->vm.size;
}

int main(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (maps) {
        fclose(maps);
        printf("/proc is mounted here: nothing checked\n");
        return 3;
    }
    if (memhook_install("mmap=bistro;cuda=none") != 0 ||
        memhook_set_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, 0, on_unmapped, 0) != 0) {
        fprintf(stderr, "memhook: %s\n", memhook_last_error());
        return 2;
    }
    size_t len = 1 << 20;
    mapping = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) return 2;
    munmap(mapping, len);
    unsigned long long looks = memhook_mapping_looks_failed();
    printf("no /proc: munmap of %#zx reported as %#zx; looks at the mappings that failed: %llu\n", len,
           (size_t)unmapped, looks);
    return unmapped == len && looks > 0 ? 0 : 1;
}

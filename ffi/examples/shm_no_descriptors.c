/* shmdt in a process with no descriptor left under its limit, where
 * memhook cannot open /proc/self/maps to find what the detach unmaps:
 * VM_UNMAPPED still comes, of the whole segment (as shmat attached it),
 * and the failed look is counted (memhook_mapping_looks_failed). Then the
 * same with descriptors to spare (no look counted failed), and a munmap
 * for scale. Prints the sizes and counts; exits 0 when every VM_UNMAPPED
 * has its size and the count grew only without descriptors.
 * ffi/tests/examples.rs runs it in both host modes. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/shm.h>
#include <unistd.h>
#include "memhook.h"

static volatile size_t unmapped;
static uint64_t looks_failed; /* during the last detach */
static void on_unmapped(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)arg;
    unmapped += e->vm.size;
}

/* Attaches a 64 KiB segment, then (with no_fds) uses up every descriptor,
 * detaches it and gives the descriptors back: the bytes reported unmapped. */
static size_t detach(int no_fds) {
    int id = shmget(IPC_PRIVATE, 0x10000, IPC_CREAT | 0600);
    void *s = id >= 0 ? shmat(id, 0, 0) : (void *)-1;
    if (s == (void *)-1) return (size_t)-1;
    int first = -1, last = -1;
    if (no_fds) {
        for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0; last = fd)
            if (first < 0) first = fd;
    }
    unmapped = 0;
    uint64_t looks = memhook_mapping_looks_failed();
    shmdt(s);
    size_t seen = unmapped;
    looks_failed = memhook_mapping_looks_failed() - looks;
    for (int fd = first; first >= 0 && fd <= last; fd++) close(fd);
    shmctl(id, IPC_RMID, 0);
    return seen;
}

int main(void) {
    if (memhook_install(NULL) != 0 || memhook_set_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, 0, on_unmapped, 0) != 0) {
        fprintf(stderr, "memhook: %s\n", memhook_last_error());
        return 2;
    }
    struct rlimit r = {256, 256};
    setrlimit(RLIMIT_NOFILE, &r);
    size_t without = detach(1);
    uint64_t failed_without = looks_failed;
    size_t with = detach(0);
    uint64_t failed_with = looks_failed;
    void *p = mmap(0, 0x5000, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unmapped = 0;
    munmap(p, 0x5000);
    printf("shmdt with no descriptor left: %#zx (looks failed: %llu); with: %#zx (%llu); munmap: %#zx\n", without,
           (unsigned long long)failed_without, with, (unsigned long long)failed_with, (size_t)unmapped);
    int sizes = without == 0x10000 && with == 0x10000 && unmapped == 0x5000;
    return sizes && failed_without >= 1 && failed_with == 0 ? 0 : 1;
}

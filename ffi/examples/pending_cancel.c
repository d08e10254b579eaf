/* A thread with a cancellation pending maps and unmaps memory (anonymous,
 * System V shared, hugetlb), then reaches pthread_testcancel. None of
 * mmap, munmap, shmat, shmdt, shmget, shmctl and memfd_create is a
 * cancellation point, so the thread must get through every call and be
 * cancelled at pthread_testcancel, with memhook's hooks in the way as
 * without them. Built with -DAPI it installs memhook and counts every
 * event with a handler of its own; without, it runs under
 * LD_PRELOAD=libmemhook.so (MEMHOOK_TRACE=1, MEMHOOK_REPORT_FD, or
 * `memhook run`). Prints "calls N of N, cancelled 1" and exits 0 when
 * the thread got through. ffi/tests/examples.rs and cli/tests/cli.rs
 * run it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef API
#include "memhook.h"
#endif

enum { ROUNDS = 3, CALLS = 10 };
static volatile int calls;

static void *work(void *arg) {
    (void)arg;
    /* A cancellation of its own, pending until it is enabled again. */
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, 0);
    pthread_cancel(pthread_self());
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, 0);
    for (int i = 0; i < ROUNDS; i++) {
        void *p = mmap(0, 0x13000, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        calls++;
        if (p != MAP_FAILED) munmap(p, 0x13000);
        calls++;
        int id = shmget(IPC_PRIVATE, 0x10000, IPC_CREAT | 0600);
        calls++;
        void *s = id >= 0 ? shmat(id, 0, 0) : (void *)-1;
        calls++;
        if (s != (void *)-1) shmdt(s);
        calls++;
        if (id >= 0) shmctl(id, IPC_RMID, 0);
        calls++;
        /* Where the machine has no huge pages these fail: memhook looks
         * at the call all the same. */
        int fd = memfd_create("pending_cancel", MFD_HUGETLB);
        void *h = fd >= 0 ? mmap(0, 2 << 20, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        calls++;
        if (h != MAP_FAILED) munmap(h, 2 << 20);
        calls++;
        void *a = mmap(0, 2 << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        calls++;
        if (a != MAP_FAILED) munmap(a, 2 << 20);
        calls++;
        /* close is a cancellation point; the system call is not. */
        if (fd >= 0) syscall(SYS_close, fd);
    }
    pthread_testcancel();
    return 0;
}

#ifdef API
static long events;
static void count(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)e;
    (void)arg;
    __atomic_fetch_add(&events, 1, __ATOMIC_RELAXED);
}
#endif

int main(void) {
#ifdef API
    if (memhook_install(NULL) != 0 ||
        memhook_set_event_handler(0xff | MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED, 0, count, 0) != 0) {
        fprintf(stderr, "memhook: %s\n", memhook_last_error());
        return 2;
    }
#endif
    pthread_t t;
    void *r;
    if (pthread_create(&t, 0, work, 0) != 0 || pthread_join(t, &r) != 0) return 2;
    printf("calls %d of %d, cancelled %d\n", calls, ROUNDS * CALLS, r == PTHREAD_CANCELED);
#ifdef API
    printf("events %ld\n", __atomic_load_n(&events, __ATOMIC_RELAXED));
#endif
    return calls == ROUNDS * CALLS && r == PTHREAD_CANCELED ? 0 : 1;
}

/* A thread cancelled inside a handler: its handler calls write, a
 * cancellation point, with the thread's cancellation pending, so the
 * thread unwinds out of the handler and out of its mmap and ends there,
 * never returning to memhook. memhook must not wait for it: registering
 * and removing handlers afterwards returns, the handlers left see the
 * events, and new threads dispatch (one may take the dead thread's reader
 * slot). (A handler should not be cancelled: README's "Thread
 * cancellation" says how to keep it from it. This is what happens when
 * one is.) Prints "ok" and exits 0; ffi/tests/examples.rs runs it with
 * a time limit. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include "memhook.h"

static __thread int cancellable;

static void logs(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)e;
    (void)arg;
    if (cancellable) {
        ssize_t r = write(-1, "", 0); /* a cancellation point */
        (void)r;
    }
}

static long seen;
static void count(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)e;
    (void)arg;
    __atomic_fetch_add(&seen, 1, __ATOMIC_RELAXED);
}

static void map_unmap(void) {
    void *p = mmap(0, 0x13000, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) munmap(p, 0x13000);
}

static void *cancelled_in_handler(void *arg) {
    (void)arg;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, 0);
    pthread_cancel(pthread_self());
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, 0);
    cancellable = 1;
    map_unmap(); /* ends in the handler */
    return (void *)1;
}

/* The same in the handler of a discard's MADVISE event: madvise's hook
 * frame holds no unwinding table of its own (one that did, without the
 * call the unwinding comes through, would end the process: it did while
 * the hook's look at memhook's own pages could unwind). */
static void *cancelled_in_madvise_handler(void *arg) {
    (void)arg;
    void *p = mmap(0, 0x2000, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 0;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, 0);
    pthread_cancel(pthread_self());
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, 0);
    cancellable = 1;
    madvise(p, 0x2000, MADV_DONTNEED); /* ends in the handler */
    return (void *)1;
}

static void *maps(void *arg) {
    (void)arg;
    map_unmap();
    return 0;
}

int main(void) {
    if (memhook_install(NULL) != 0 || memhook_set_event_handler(MEMHOOK_EVENT_VM_MAPPED, 0, logs, 0) != 0) {
        fprintf(stderr, "memhook: %s\n", memhook_last_error());
        return 2;
    }
    for (int round = 0; round < 3; round++) {
        pthread_t t;
        void *r;
        if (pthread_create(&t, 0, cancelled_in_handler, 0) != 0 || pthread_join(t, &r) != 0) return 2;
        if (r != PTHREAD_CANCELED) {
            fprintf(stderr, "round %d: the thread was not cancelled in its handler\n", round);
            return 1;
        }
        /* Returns, rather than waiting for the dead thread's read. */
        if (memhook_set_event_handler(MEMHOOK_EVENT_VM_MAPPED, 0, count, 0) != 0) {
            fprintf(stderr, "memhook: %s\n", memhook_last_error());
            return 1;
        }
        long before = __atomic_load_n(&seen, __ATOMIC_RELAXED);
        map_unmap();
        if (pthread_create(&t, 0, maps, 0) != 0 || pthread_join(t, 0) != 0) return 2;
        long after = __atomic_load_n(&seen, __ATOMIC_RELAXED);
        if (after - before != 2) {
            fprintf(stderr, "round %d: %ld VM_MAPPED events of 2\n", round, after - before);
            return 1;
        }
        memhook_unset_event_handler(MEMHOOK_EVENT_VM_MAPPED, count, 0);
    }
    memhook_unset_event_handler(MEMHOOK_EVENT_VM_MAPPED, logs, 0);
    map_unmap();
    if (memhook_set_event_handler(MEMHOOK_EVENT_MADVISE, 0, logs, 0) != 0) {
        fprintf(stderr, "memhook: %s\n", memhook_last_error());
        return 1;
    }
    pthread_t t;
    void *r;
    if (pthread_create(&t, 0, cancelled_in_madvise_handler, 0) != 0 || pthread_join(t, &r) != 0) return 2;
    if (r != PTHREAD_CANCELED) {
        fprintf(stderr, "the thread was not cancelled in its MADVISE handler\n");
        return 1;
    }
    memhook_unset_event_handler(MEMHOOK_EVENT_MADVISE, logs, 0);
    printf("ok\n");
    return 0;
}

/* A signal handler that installs memhook, or registers a handler (which
 * installs from the environment when nothing is installed), on a thread
 * that installs and uninstalls itself: the main thread uninstalls and
 * installs 1,000 times while a timer interrupts it every 50 us with a
 * signal whose handler calls memhook_install and memhook_set_event_handler
 * (then, where that worked, memhook_unset_event_handler). Where the signal
 * lands inside the main thread's own install or uninstall, the handler's
 * install is refused (MEMHOOK_ERR_BUSY, its message naming the signal
 * handler), and so is its registration where nothing is installed yet
 * (where something is, the registration installs nothing and goes ahead);
 * before, both waited for good on the install lock their own thread held. A watchdog thread (the signal blocked in it) ends the
 * program with status 3 when the main thread makes no progress for 10 s.
 * After the rounds, a handler registered by the main thread sees the
 * munmap it makes: the hooks are in. Prints the counts; exits 0 when
 * every round finished, each refusal said why and the hooks report.
 * ffi/tests/examples.rs runs it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>

#include "memhook.h"
#include "signal_rounds.h"

#define ROUNDS 1000

static void signal_handlers_handler(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)e;
    (void)arg;
}

static volatile sig_atomic_t installs, refused, registered, refused_registrations, unexplained;
static char why[256];

/* Keeps the first unexplained answer (strncpy: no formatting in a signal
 * handler). */
static void explain(const char *call) {
    if (unexplained++) return;
    strncpy(why, call, sizeof why - 1);
    strncat(why, memhook_last_error(), sizeof why - 1 - strlen(why));
}

static void on_timer(int sig) {
    (void)sig;
    signals++;
    int r = memhook_install(NULL);
    if (r == MEMHOOK_OK) {
        installs++;
    } else if (r == MEMHOOK_ERR_BUSY && strstr(memhook_last_error(), "signal handler")) {
        refused++;
    } else {
        explain("memhook_install: ");
    }
    r = memhook_set_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, 0, signal_handlers_handler, NULL);
    if (r == MEMHOOK_OK) {
        registered++;
        memhook_unset_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, signal_handlers_handler, NULL);
    } else if (r == MEMHOOK_ERR_BUSY && strstr(memhook_last_error(), "signal handler")) {
        refused_registrations++;
    } else {
        explain("memhook_set_event_handler: ");
    }
}

static volatile long unmapped;

static void count_unmapped(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    if (e->vm.address == arg) unmapped++;
}

int main(void) {
    if (start_rounds("install_in_signal", on_timer) != 0) return 2;
    int failed = 0;
    for (long i = 0; i < ROUNDS; i++) {
        if (memhook_install(NULL) != MEMHOOK_OK || memhook_uninstall() != MEMHOOK_OK) {
            fprintf(stderr, "round %ld: %s\n", i, memhook_last_error());
            failed = 1;
            break;
        }
        progress = i + 1;
    }
    stop_rounds();
    if (memhook_install(NULL) != MEMHOOK_OK) {
        fprintf(stderr, "memhook: %s\n", memhook_last_error());
        return 2;
    }
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    if (memhook_set_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, 0, count_unmapped, p) != MEMHOOK_OK) {
        fprintf(stderr, "memhook: %s\n", memhook_last_error());
        return 2;
    }
    munmap(p, 4096);
    printf("%ld rounds; %d signals: %d installs, %d refused inside the thread's own install or uninstall; "
           "%d registered, %d refused there; %d else; the munmap after reported %ld times\n",
           progress, (int)signals, (int)installs, (int)refused, (int)registered, (int)refused_registrations,
           (int)unexplained, unmapped);
    if (unexplained) fprintf(stderr, "first unexplained: %s\n", why);
    return failed || unexplained || progress != ROUNDS || unmapped != 1 ? 1 : 0;
}

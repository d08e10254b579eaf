/* A signal handler that changes memhook's handlers, on a thread that
 * changes them itself: the main thread registers and unregisters a
 * handler 20,000 times while a timer interrupts it every 50 us with a
 * signal whose handler registers (and, where that worked, unregisters)
 * another. Where the signal lands inside the main thread's own change,
 * the handler's registration is refused (MEMHOOK_ERR_HANDLER) rather
 * than wait for the writer's lock its own thread holds; before, it
 * waited forever. A watchdog thread (the signal blocked in it) ends the
 * program with status 3 when the main thread makes no progress for 10 s.
 * Prints the counts; exits 0 when every round finished and each refusal
 * said why. ffi/tests/examples.rs runs it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "memhook.h"
#include "signal_rounds.h"

#define ROUNDS 20000

static void main_handler(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)e;
    (void)arg;
}

static void signal_handlers_handler(uint32_t type, memhook_event_t *e, void *arg) {
    (void)type;
    (void)e;
    (void)arg;
}

static volatile sig_atomic_t refused, registered, unexplained;

static void on_timer(int sig) {
    (void)sig;
    signals++;
    int r = memhook_set_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, 0, signal_handlers_handler, NULL);
    if (r == 0) {
        registered++;
        memhook_unset_event_handler(MEMHOOK_EVENT_VM_UNMAPPED, signal_handlers_handler, NULL);
    } else if (r == MEMHOOK_ERR_HANDLER && strstr(memhook_last_error(), "signal handler")) {
        refused++;
    } else {
        unexplained++;
    }
}

int main(void) {
    if (memhook_install(NULL) != 0) {
        fprintf(stderr, "memhook: %s\n", memhook_last_error());
        return 2;
    }
    if (start_rounds("register_in_signal", on_timer) != 0) return 2;
    int failed = 0;
    for (long i = 0; i < ROUNDS; i++) {
        if (memhook_set_event_handler(MEMHOOK_EVENT_VM_MAPPED, 0, main_handler, NULL) != 0) {
            fprintf(stderr, "round %ld: %s\n", i, memhook_last_error());
            failed = 1;
            break;
        }
        memhook_unset_event_handler(MEMHOOK_EVENT_VM_MAPPED, main_handler, NULL);
        progress = i + 1;
    }
    stop_rounds();
    printf("%ld rounds; %d signals: %d registered, %d refused inside the thread's own change, %d else\n", progress,
           (int)signals, (int)registered, (int)refused, (int)unexplained);
    return failed || unexplained || progress != ROUNDS ? 1 : 0;
}

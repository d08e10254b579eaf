/* What register_in_signal.c and install_in_signal.c share: a timer that
 * interrupts the main thread every 50 us with SIGALRM, whose handler is
 * the program's, and a watchdog thread (the signal blocked in it) that
 * ends the program with status 3 when the main thread's `progress` has
 * not moved for 10 s: a signal handler that waits for its own thread
 * waits for good. */
#ifndef MEMHOOK_EXAMPLES_SIGNAL_ROUNDS_H
#define MEMHOOK_EXAMPLES_SIGNAL_ROUNDS_H

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

/* Rounds the main thread finished, and signals handled. */
static volatile long progress;
static volatile sig_atomic_t signals;

static const char *rounds_name;

static void *rounds_watchdog(void *arg) {
    (void)arg;
    long last = -1;
    for (;;) {
        sleep(10);
        if (progress == last) {
            fprintf(stderr, "%s: stuck after %ld rounds, %d signals\n", rounds_name, progress, (int)signals);
            _exit(3);
        }
        last = progress;
    }
    return NULL;
}

/* Starts the watchdog (named `name` in its message) and the timer whose
 * signal runs `handler`; 0 on success. */
static int start_rounds(const char *name, void (*handler)(int)) {
    rounds_name = name;
    sigset_t alarm, old;
    sigemptyset(&alarm);
    sigaddset(&alarm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alarm, &old);
    pthread_t w;
    if (pthread_create(&w, NULL, rounds_watchdog, NULL) != 0) return -1;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 50}, {0, 50}};
    return setitimer(ITIMER_REAL, &every, NULL);
}

/* Stops the timer. */
static void stop_rounds(void) {
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
}

#endif

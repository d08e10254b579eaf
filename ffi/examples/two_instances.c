/* Two independent copies of memhook in one process: this program links
 * libmemhook.so (A) and opens a copy of it under another file name (B)
 * with RTLD_LOCAL, as two libraries that each embed memhook would be.
 * Each installs (argv[2] and argv[3]: configs), each has a handler, and
 * they uninstall in either order (argv[4]: 0, A first; 1, B first), or
 * (2) A uninstalls while B is installed and installs again with the
 * config argv[5], then B uninstalls, then A. Each line printed says how
 * many times each saw one mmap at a known address.
 *
 * Build: cc -I include two_instances.c -L target/debug -lmemhook -ldl
 * Run:   ./a.out path/to/copy-of-libmemhook.so CONFIG_A CONFIG_B ORDER [CONFIG_A2] */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "memhook.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "failed: %s\n", #c); exit(1); } } while (0)

static void *watched;
static int seen_a, seen_b;

static void on_a(uint32_t type, memhook_event_t *e, void *arg) {
    (void)arg;
    if (type == MEMHOOK_EVENT_MMAP && e->mmap.result == watched)
        seen_a++;
}

static void on_b(uint32_t type, memhook_event_t *e, void *arg) {
    (void)arg;
    if (type == MEMHOOK_EVENT_MMAP && e->mmap.result == watched)
        seen_b++;
}

/* Maps over `watched` (MAP_FIXED), prints who saw it, and starts over. */
static void round_of(const char *what) {
    CHECK(mmap(watched, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == watched);
    printf("%s: a=%d b=%d\n", what, seen_a, seen_b);
    fflush(stdout);
    seen_a = seen_b = 0;
}

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    CHECK(p != NULL);
    return p;
}

int main(int argc, char **argv) {
    CHECK(argc == 5 || argc == 6);
    int order = atoi(argv[4]);
    CHECK(order != 2 || argc == 6);
    watched = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(watched != MAP_FAILED);

    CHECK(memhook_install(argv[2]) == 0);
    CHECK(memhook_set_event_handler(MEMHOOK_EVENT_MMAP, 0, on_a, NULL) == 0);
    round_of("A installed");

    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL);
    int (*install_b)(const char *) = (int (*)(const char *))sym(h, "memhook_install");
    int (*uninstall_b)(void) = (int (*)(void))sym(h, "memhook_uninstall");
    int (*set_handler_b)(uint32_t, int, memhook_event_cb, void *) =
        (int (*)(uint32_t, int, memhook_event_cb, void *))sym(h, "memhook_set_event_handler");
    CHECK(install_b(argv[3]) == 0);
    CHECK(set_handler_b(MEMHOOK_EVENT_MMAP, 0, on_b, NULL) == 0);
    round_of("both installed");

    if (order == 0) {
        CHECK(memhook_uninstall() == 0);
        round_of("A uninstalled");
        CHECK(uninstall_b() == 0);
        round_of("B uninstalled");
        CHECK(memhook_install(argv[2]) == 0);
        round_of("A installed again");
        CHECK(install_b(argv[3]) == 0);
        round_of("B installed again");
    } else if (order == 1) {
        CHECK(uninstall_b() == 0);
        round_of("B uninstalled");
        CHECK(memhook_uninstall() == 0);
        round_of("A uninstalled");
    } else {
        CHECK(memhook_uninstall() == 0);
        round_of("A uninstalled");
        CHECK(memhook_install(argv[5]) == 0);
        round_of("A installed again in another mode");
        CHECK(uninstall_b() == 0);
        round_of("B uninstalled");
        CHECK(memhook_uninstall() == 0);
        round_of("A uninstalled at last");
    }
    return 0;
}

/* A plugin that uses memhook is unloaded: the program opens libmemhook.so
 * with dlopen (as a plugin linked with -lmemhook brings it in), installs
 * the hooks, registers a handler, and closes it. libmemhook.so is linked
 * with -z nodelete, so it stays: the hooked mmap, a fork and a later
 * dlopen all keep working, and the handler still sees the events. (Were it
 * unmapped, the patched mmap would jump into nothing.)
 *
 * Build: cc -I include unload.c -ldl; run: ./a.out path/to/libmemhook.so */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memhook.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "failed: %s\n", #c); exit(1); } } while (0)

static void *watched;
static int mapped, unmapped;

static void on_event(uint32_t type, memhook_event_t *e, void *arg) {
    (void)arg;
    if (type == MEMHOOK_EVENT_VM_MAPPED && e->vm.address == watched)
        mapped++;
    if (type == MEMHOOK_EVENT_VM_UNMAPPED && e->vm.address == watched)
        unmapped++;
}

static void *sym(void *h, const char *name) {
    void *p = dlsym(h, name);
    CHECK(p != NULL);
    return p;
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    int (*install)(const char *) = (int (*)(const char *))sym(h, "memhook_install");
    int (*set_handler)(uint32_t, int, memhook_event_cb, void *) =
        (int (*)(uint32_t, int, memhook_event_cb, void *))sym(h, "memhook_set_event_handler");
    CHECK(install(argv[2]) == 0);
    CHECK(set_handler(MEMHOOK_EVENT_VM_MAPPED | MEMHOOK_EVENT_VM_UNMAPPED, 0, on_event, NULL) == 0);
    CHECK(dlclose(h) == 0);

    /* Map at a known address, then unmap: both reported. */
    void *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    CHECK(munmap(p, 1 << 16) == 0);
    watched = p;
    CHECK(mmap(p, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) == p);
    CHECK(munmap(p, 1 << 16) == 0);

    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        _exit(munmap(mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), 4096) == 0 ? 0 : 1);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    void *m = dlopen("libm.so.6", RTLD_NOW);
    CHECK(m != NULL && dlsym(m, "cos") != NULL);
    CHECK(dlclose(m) == 0);

    /* Still there: a no-load open of it succeeds. */
    void *again = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    printf("after dlclose: %d mapped, %d unmapped, library %s\n", mapped, unmapped,
           again ? "still loaded" : "unloaded");
    CHECK(again != NULL && mapped == 1 && unmapped == 1);
    return 0;
}

/* memhook's C ABI for bistro, used as a C program would: patch a function
 * of this program and one of libc, call them, unpatch, check the bytes. */
#include <assert.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "memhook.h"

static int calls;

__attribute__((noinline)) int square_plus(int a) {
    /* Enough work that the compiler keeps a real prologue. */
    volatile int x = a;
    return x * x + 1;
}

static int (*orig_square_plus)(int);
static int hook_square_plus(int a) {
    calls++;
    return orig_square_plus(a) + 1000;
}

static pid_t (*orig_getppid)(void);
static pid_t hook_getppid(void) {
    calls++;
    return orig_getppid();
}

int main(void) {
    int (*volatile f)(int) = square_plus;
    pid_t (*volatile g)(void) = getppid;
    unsigned char before[16], before_libc[16];
    memcpy(before, (void *)square_plus, 16);
    memcpy(before_libc, (void *)getppid, 16);
    pid_t ppid = g();

    memhook_patch_t *h1, *h2;
    int rc = memhook_patch((void *)square_plus, (void *)hook_square_plus, (void **)&orig_square_plus, &h1);
    if (rc != MEMHOOK_OK) {
        fprintf(stderr, "patch square_plus: %d %s\n", rc, memhook_last_error());
        return 1;
    }
    rc = memhook_patch((void *)getppid, (void *)hook_getppid, (void **)&orig_getppid, &h2);
    if (rc != MEMHOOK_OK) {
        fprintf(stderr, "patch getppid: %d %s\n", rc, memhook_last_error());
        return 1;
    }
    assert(f(3) == 1010);
    assert(orig_square_plus(3) == 10);
    assert(g() == ppid);
    assert(calls == 2);

    assert(memhook_unpatch(h1) == MEMHOOK_OK);
    assert(memhook_unpatch(h2) == MEMHOOK_OK);
    assert(memcmp(before, (void *)square_plus, 16) == 0);
    assert(memcmp(before_libc, (void *)getppid, 16) == 0);
    assert(f(3) == 10 && g() == ppid && calls == 2);

    /* Errors: a data address, and a stale handle. */
    static int data;
    memhook_patch_t *h3;
    void *o;
    rc = memhook_patch(&data, (void *)hook_getppid, &o, &h3);
    assert(rc == MEMHOOK_ERR_NOT_CODE);
    assert(strstr(memhook_last_error(), "not in an executable mapping") != NULL);
    assert(memhook_unpatch(h1) == MEMHOOK_ERR_INVALID);
    printf("C ABI bistro test passed: %s\n", memhook_last_error());
    return 0;
}

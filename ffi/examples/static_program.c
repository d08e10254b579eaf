/* A statically linked program (built with -static against libmemhook.a):
 * its C library is part of the executable, with no dynamic symbols to find
 * the host functions by and no GOT slots that calls to them go through, so
 * memhook hooks none of them. Each host function's status says so, as a
 * failure (not one waiting for a library that will never load), in bistro
 * and in reloc mode. ffi/tests/examples.rs builds and runs it where the C
 * library has a static archive. Exits 0 when every entry says so. */
#include <stdio.h>
#include <string.h>
#include "memhook.h"

static int check(const char *config) {
    if (memhook_install(config) != 0) {
        fprintf(stderr, "memhook_install(%s): %s\n", config, memhook_last_error());
        return 1;
    }
    int entries = 0, wrong = 0;
    memhook_hook_status_t s;
    for (size_t i = 0; memhook_status(i, &s) == 0; i++) {
        if (strcmp(s.library, "libc.so.6") != 0) continue;
        entries++;
        if (s.installed || s.pending || !strstr(s.reason, "statically linked")) {
            printf("%s: %s (%s): installed %d, pending %d: %s\n", config, s.function, s.mode, s.installed, s.pending,
                   s.reason);
            wrong++;
        }
    }
    printf("%s: %d host functions, each not hooked: statically linked\n", config, entries - wrong);
    return entries == 0 || wrong != 0;
}

int main(void) {
    int failed = check("mmap=bistro;cuda=none");
    failed |= check("mmap=reloc;cuda=none");
    return failed;
}

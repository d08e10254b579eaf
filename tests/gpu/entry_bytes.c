/* Prints, for each function named on the command line, its library's
 * soname as given, the symbol, its offset in the library, and its first 64
 * bytes in hex: a line of tests/fixtures/prologues-*.tsv, read from the
 * live process (scripts/gpu-run.sh runs it for libcuda's hooked functions).
 *   entry_bytes libcuda.so.1 cuCtxDestroy_v2 ... */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIBRARY SYMBOL...\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    int missing = 0;
    for (int i = 2; i < argc; i++) {
        const unsigned char *p = dlsym(lib, argv[i]);
        Dl_info info;
        if (!p || !dladdr(p, &info)) {
            fprintf(stderr, "%s: not found\n", argv[i]);
            missing = 1;
            continue;
        }
        printf("%s\t%s\t%#lx\t", argv[1], argv[i], (unsigned long)(p - (const unsigned char *)info.dli_fbase));
        for (int k = 0; k < 64; k++)
            printf("%02x", p[k]);
        printf("\n");
    }
    return missing;
}

/* A program's __managed__ variable on the real driver. CUDA 13's runtime
 * resolves it with cuLibraryGetManaged (not cuLibraryGetGlobal) when host
 * code first touches it; before memhook hooked that call, the map had no
 * range there, and a lookup of &var said host (run 112). Checked, with
 * memhook installed in the mode given: a lookup of the variable says
 * CUDA_MANAGED over its whole extent (the driver agrees: managed), once
 * host code has touched it, after a kernel wrote it, and at the address
 * cudaGetSymbolAddress gives; a __device__ variable's address says CUDA.
 *
 *   nvcc -O2 -I. managed.cu -L. -lmemhook -Xlinker -rpath -Xlinker '$ORIGIN' -o managed
 *   ./managed bistro     (procaddr, a comma list; none: host, and fails) */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "memhook.h"

static const size_t SIZE = (size_t)4 << 20;
__managed__ char mbuf[4 << 20];
__device__ char dbuf[4 << 20];
__global__ void touch() {
    mbuf[0] = 1;
    dbuf[0] = 1;
}
static int failures;

static void expect(const char *what, const void *p, uint32_t type) {
    memhook_mem_info_t info;
    memset(&info, 0, sizeof info);
    memhook_memtype_lookup(p, 1, &info);
    bool ok = info.mem_type == type && info.len == SIZE && info.base == p && info.device == 0;
    printf("managed %s %p: lookup type %u (want %u) device %d base %p len %zu: %s\n", what, p, info.mem_type, type,
           info.device, info.base, info.len, ok ? "ok" : "FAILED");
    failures += !ok;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "bistro";
    char config[128];
    snprintf(config, sizeof config, "cuda=%s;mmap=none", mode);
    if (memhook_install(config) != 0) {
        fprintf(stderr, "managed: install %s: %s\n", config, memhook_last_error());
        return 4;
    }
    mbuf[1] = 2; /* host code's first touch: the runtime resolves it */
    expect("&mbuf after a host write", mbuf, MEMHOOK_MEM_TYPE_CUDA_MANAGED);
    touch<<<1, 1>>>();
    if (cudaDeviceSynchronize() != cudaSuccess)
        return 3;
    expect("&mbuf after a kernel", mbuf, MEMHOOK_MEM_TYPE_CUDA_MANAGED);
    void *m = NULL, *d = NULL;
    if (cudaGetSymbolAddress(&m, mbuf) != cudaSuccess || cudaGetSymbolAddress(&d, dbuf) != cudaSuccess)
        return 3;
    expect("cudaGetSymbolAddress(mbuf)", m, MEMHOOK_MEM_TYPE_CUDA_MANAGED);
    expect("cudaGetSymbolAddress(dbuf)", d, MEMHOOK_MEM_TYPE_CUDA);
    printf("managed %s: %s\n", mode, failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

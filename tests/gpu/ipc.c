/* Memory another process exported, on the real driver. The parent
 * allocates device memory and exports an IPC handle; a child process
 * (this program again, given the handle in hex) installs memhook in the
 * mode asked for, opens the handle, and checks: one MEM_TYPE_ALLOC for
 * the opened range, with the allocation's size; a lookup that says CUDA
 * on device 0 (before memhook hooked the open it said host: absent from
 * the map); a second open of the handle (the driver counts opens and
 * gives the same address) that reports nothing, and a first close that
 * leaves the range CUDA; one MEM_TYPE_FREE at the last close, and the
 * range absent after. Then a count memhook holds short of the driver's:
 * one open unseen (through memhook_original, as an open made before the
 * install), one through the hook; the close memhook takes for the last
 * is reported, and since the driver still maps the address afterwards,
 * the range is recorded and reported again (a lookup says CUDA); the
 * real last close ends it. Last, a cuMemFree_v2 of opened memory (a
 * program error): its status, and that a refusal leaves the range CUDA
 * in the map (reported freed, then again) until the close ends it.
 *
 *   gcc -O2 -I. ipc.c -L. -lmemhook -ldl -Wl,-rpath,'$ORIGIN' -o ipc
 *   ./ipc bistro        (or procaddr, a comma list; none: what a lookup
 *                        said with the open unhooked)
 *
 * The driver's functions are found with dlsym, as a program that loads
 * the driver itself does: procaddr answers dlsym with its hooks, bistro
 * patches the entries; reloc alone reaches only callers through a PLT. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define PROGRAM "ipc"
#include "events.h"

extern char **environ;

typedef unsigned long long CUdeviceptr;
typedef struct {
    char reserved[64];
} CUipcMemHandle;

static const size_t SIZE = (size_t)8 << 20;

static int child(const char *mode, const char *hex) {
    CUipcMemHandle handle;
    for (int i = 0; i < 64; i++) {
        unsigned byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
            return 5;
        handle.reserved[i] = (char)byte;
    }
    install_in(mode);
    init_driver(); /* loaded after the install: hooked as it loads */
    int (*open)(CUdeviceptr *, CUipcMemHandle, unsigned) = fn("cuIpcOpenMemHandle_v2");
    int (*close)(CUdeviceptr) = fn("cuIpcCloseMemHandle");
    CUdeviceptr p = 0;
    CHECK(open(&p, handle, 1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */));
    size_t size = 0;
    int allocs = seen(MEMHOOK_EVENT_MEM_TYPE_ALLOC, p, &size);
    memhook_mem_info_t info;
    CHECK(memhook_memtype_lookup((void *)(uintptr_t)p, 4096, &info));
    printf("ipc %s: opened %#llx: %d alloc event(s) of %zu bytes; lookup type %u device %d base %p len %zu\n", mode,
           p, allocs, size, info.mem_type, info.device, info.base, info.len);
    int ok = allocs == 1 && size == SIZE && info.mem_type == MEMHOOK_MEM_TYPE_CUDA && info.device == 0 &&
             (uintptr_t)info.base == p && info.len == SIZE;
    /* The driver counts opens of one handle: a second gives the same
     * address, and the first close leaves it mapped. */
    CUdeviceptr again = 0;
    CHECK(open(&again, handle, 1));
    allocs = seen(MEMHOOK_EVENT_MEM_TYPE_ALLOC, p, NULL);
    CHECK(close(p));
    int early = seen(MEMHOOK_EVENT_MEM_TYPE_FREE, p, NULL);
    CHECK(memhook_memtype_lookup((void *)(uintptr_t)p, 4096, &info));
    printf("ipc %s: opened again at %#llx: %d alloc event(s) in all; one close: %d free event(s), lookup type %u\n",
           mode, again, allocs, early, info.mem_type);
    ok = ok && again == p && allocs == 1 && early == 0 && info.mem_type == MEMHOOK_MEM_TYPE_CUDA;
    CHECK(close(p));
    int frees = seen(MEMHOOK_EVENT_MEM_TYPE_FREE, p, &size);
    CHECK(memhook_memtype_lookup((void *)(uintptr_t)p, 4096, &info));
    printf("ipc %s: closed: %d free event(s) of %zu bytes; lookup type %u\n", mode, frees, size, info.mem_type);
    ok = ok && frees == 1 && size == SIZE && info.mem_type == MEMHOOK_MEM_TYPE_HOST;
    /* The count short of the driver's: one open unseen, one seen. */
    int (*raw_open)(CUdeviceptr *, CUipcMemHandle, unsigned) =
        (int (*)(CUdeviceptr *, CUipcMemHandle, unsigned))memhook_original("cuIpcOpenMemHandle_v2");
    if (!raw_open) { /* not hooked (mode none) */
        printf("ipc %s: no original open: %s\n", mode, memhook_last_error());
        ok = 0;
    } else {
        CUdeviceptr unseen = 0;
        CHECK(raw_open(&unseen, handle, 1));
        CHECK(open(&again, handle, 1));
        int allocs0 = seen(MEMHOOK_EVENT_MEM_TYPE_ALLOC, p, NULL), frees0 = seen(MEMHOOK_EVENT_MEM_TYPE_FREE, p, NULL);
        CHECK(close(p));
        int allocs1 = seen(MEMHOOK_EVENT_MEM_TYPE_ALLOC, p, NULL), frees1 = seen(MEMHOOK_EVENT_MEM_TYPE_FREE, p, NULL);
        memhook_mem_info_t mid;
        CHECK(memhook_memtype_lookup((void *)(uintptr_t)p, 4096, &mid));
        CHECK(close(p));
        int frees2 = seen(MEMHOOK_EVENT_MEM_TYPE_FREE, p, NULL);
        CHECK(memhook_memtype_lookup((void *)(uintptr_t)p, 4096, &info));
        printf("ipc %s: opened unseen and seen at %#llx %#llx: first close %d free(s) %d alloc(s), lookup type %u "
               "device %d len %zu; last close %d free(s), lookup type %u\n",
               mode, unseen, again, frees1 - frees0, allocs1 - allocs0, mid.mem_type, mid.device, mid.len,
               frees2 - frees1, info.mem_type);
        ok = ok && unseen == p && again == p && frees1 - frees0 == 1 && allocs1 - allocs0 == 1 &&
             mid.mem_type == MEMHOOK_MEM_TYPE_CUDA && mid.device == 0 && mid.len == SIZE && frees2 - frees1 == 1 &&
             info.mem_type == MEMHOOK_MEM_TYPE_HOST;
        /* A device free of opened memory: the driver is expected to
         * refuse it (only the close ends an opened mapping). */
        int (*mem_free)(CUdeviceptr) = fn("cuMemFree_v2");
        CHECK(open(&again, handle, 1));
        int a0 = seen(MEMHOOK_EVENT_MEM_TYPE_ALLOC, again, NULL), f0 = seen(MEMHOOK_EVENT_MEM_TYPE_FREE, again, NULL);
        int status = mem_free(again);
        int a1 = seen(MEMHOOK_EVENT_MEM_TYPE_ALLOC, again, NULL), f1 = seen(MEMHOOK_EVENT_MEM_TYPE_FREE, again, NULL);
        CHECK(memhook_memtype_lookup((void *)(uintptr_t)again, 4096, &mid));
        int closed = close(again);
        int f2 = seen(MEMHOOK_EVENT_MEM_TYPE_FREE, again, NULL);
        CHECK(memhook_memtype_lookup((void *)(uintptr_t)again, 4096, &info));
        printf("ipc %s: cuMemFree_v2 of opened memory: status %d, %d free(s) %d alloc(s), lookup type %u device %d "
               "len %zu; close %d: %d free(s), lookup type %u\n",
               mode, status, f1 - f0, a1 - a0, mid.mem_type, mid.device, mid.len, closed, f2 - f1, info.mem_type);
        ok = ok && status != 0 && f1 - f0 == 1 && a1 - a0 == 1 && mid.mem_type == MEMHOOK_MEM_TYPE_CUDA &&
             mid.device == 0 && mid.len == SIZE && closed == 0 && f2 - f1 == 1 &&
             info.mem_type == MEMHOOK_MEM_TYPE_HOST;
    }
    printf("ipc %s: %s\n", mode, ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "child") == 0)
        return child(argv[2], argv[3]);
    const char *mode = argc > 1 ? argv[1] : "bistro";
    init_driver();
    CUdeviceptr d = 0;
    CUipcMemHandle handle;
    CHECK(((int (*)(CUdeviceptr *, size_t))fn("cuMemAlloc_v2"))(&d, SIZE));
    CHECK(((int (*)(CUipcMemHandle *, CUdeviceptr))fn("cuIpcGetMemHandle"))(&handle, d));
    char hex[129];
    for (int i = 0; i < 64; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)handle.reserved[i]);
    char *child_argv[] = {argv[0], "child", (char *)mode, hex, NULL};
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, child_argv, environ) != 0) {
        perror("ipc: posix_spawn");
        return 6;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(((int (*)(CUdeviceptr))fn("cuMemFree_v2"))(d));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 7;
}

/* A buffer of external memory on the real driver. Physical memory made
 * with cuMemCreate is exported as a file descriptor and imported back
 * with cuImportExternalMemory (as memory from Vulkan, or from another
 * process, would be); cuExternalMemoryGetMappedBuffer maps a buffer of
 * it at a new device address, which cuMemFree ends. Checked, with
 * memhook installed in the mode given: one MEM_TYPE_ALLOC for the
 * buffer, of the size asked for; a lookup of CUDA on device 0 over it
 * (before memhook hooked the call: host, absent from the map); one
 * MEM_TYPE_FREE at cuMemFree, and the range absent after.
 *
 *   gcc -O2 -I. -I/usr/local/cuda/include external.c -L. -lmemhook -ldl -Wl,-rpath,'$ORIGIN' -o external
 *   ./external bistro      (or procaddr, a comma list; none: host, and fails)
 *
 * The driver's functions are found with dlsym, as in ipc.c. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROGRAM "external"
#include "events.h"

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "bistro";
    install_in(mode);
    init_driver();

    /* Physical memory that can be exported as a file descriptor. */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t granularity = 0;
    CHECK(((CUresult(*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))fn(
        "cuMemGetAllocationGranularity"))(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const size_t size = 4 * granularity;
    CUmemGenericAllocationHandle handle;
    CHECK(((CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))fn(
        "cuMemCreate"))(&handle, size, &prop, 0));
    int fd = -1;
    CHECK(((CUresult(*)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long))fn(
        "cuMemExportToShareableHandle"))(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));

    CUDA_EXTERNAL_MEMORY_HANDLE_DESC hdesc;
    memset(&hdesc, 0, sizeof hdesc);
    hdesc.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    hdesc.handle.fd = fd; /* the driver owns it once the import succeeds */
    hdesc.size = size;
    CUexternalMemory ext = NULL;
    int rc = ((CUresult(*)(CUexternalMemory *, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *))fn("cuImportExternalMemory"))(
        &ext, &hdesc);
    if (rc != 0) {
        printf("external %s: cuImportExternalMemory of an exported cuMemCreate handle = %d: FAILED\n", mode, rc);
        return 5;
    }
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC bdesc;
    memset(&bdesc, 0, sizeof bdesc);
    bdesc.offset = granularity;
    bdesc.size = 2 * granularity;
    CUdeviceptr p = 0;
    CHECK(((CUresult(*)(CUdeviceptr *, CUexternalMemory, const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *))fn(
        "cuExternalMemoryGetMappedBuffer"))(&p, ext, &bdesc));
    size_t got = 0;
    int allocs = seen(MEMHOOK_EVENT_MEM_TYPE_ALLOC, p, &got);
    memhook_mem_info_t info;
    CHECK(memhook_memtype_lookup((void *)(uintptr_t)p, 4096, &info));
    printf("external %s: buffer at %#llx: %d alloc event(s) of %zu bytes (asked %zu); lookup type %u device %d base %p "
           "len %zu\n",
           mode, p, allocs, got, (size_t)bdesc.size, info.mem_type, info.device, info.base, info.len);
    int ok = allocs == 1 && got == bdesc.size && info.mem_type == MEMHOOK_MEM_TYPE_CUDA && info.device == 0 &&
             (uintptr_t)info.base == p && info.len == bdesc.size;
    CHECK(((CUresult(*)(CUdeviceptr))fn("cuMemFree_v2"))(p));
    int frees = seen(MEMHOOK_EVENT_MEM_TYPE_FREE, p, &got);
    CHECK(memhook_memtype_lookup((void *)(uintptr_t)p, 4096, &info));
    printf("external %s: cuMemFree: %d free event(s) of %zu bytes; lookup type %u\n", mode, frees, got, info.mem_type);
    ok = ok && frees == 1 && got == bdesc.size && info.mem_type == MEMHOOK_MEM_TYPE_HOST;
    CHECK(((CUresult(*)(CUexternalMemory))fn("cuDestroyExternalMemory"))(ext));
    CHECK(((CUresult(*)(CUmemGenericAllocationHandle))fn("cuMemRelease"))(handle));
    printf("external %s: %s\n", mode, ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}

/* Which frees the driver refuses (memory of another kind, an address
 * inside an allocation), and whether the memory is still there after
 * each: printed for the results file. Driver 580 on the H200 (run 164):
 * cuMemFree and cuMemFreeAsync refuse pinned and registered host memory
 * and pages mapped with cuMemMap; cuMemFreeHost refuses all but pinned
 * host memory; cuMemHostUnregister all but registered; each refusal
 * leaves the memory as it was. memhook's hooks put what they took out of
 * the map back when the driver refuses (linux/src/cuda/events.rs,
 * refused), and the fake driver refuses as this one does
 * (tests/cuda/fakecuda.c, frees). Build: gcc -I CUDA/include refusals.c
 * -lcuda. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d\n", #x, r_); } } while (0)
static void still(const char *what, CUdeviceptr p) {
    unsigned mt = 0; CUdeviceptr start = 0; size_t size = 0;
    CUpointer_attribute a[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    void *d[3] = {&mt, &start, &size};
    CUresult r = cuPointerGetAttributes(3, a, d, p);
    printf("   after %-40s rc=%d type %u range [%#llx,+%zu)\n", what, r, mt, (unsigned long long)start, size);
}
#define TRY(call, p) do { CUresult r_ = (call); printf("%-60s -> %d\n", #call, r_); still(#call, (CUdeviceptr)(p)); } while (0)
int main(void) {
    CUdevice dev; CUcontext ctx;
    OK(cuInit(0)); OK(cuDeviceGet(&dev, 0)); OK(cuDevicePrimaryCtxRetain(&ctx, dev)); OK(cuCtxSetCurrent(ctx));
    CUdeviceptr d; OK(cuMemAlloc(&d, 1 << 20));
    void *h; OK(cuMemAllocHost(&h, 1 << 20));
    void *reg = mmap(0, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    OK(cuMemHostRegister(reg, 4 << 20, 0));
    void *plain = malloc(1 << 20);
    CUdeviceptr pa; OK(cuMemAllocAsync(&pa, 4096, 0)); OK(cuStreamSynchronize(0));
    CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
    size_t gran = 0; OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h0; OK(cuMemCreate(&h0, gran, &prop, 0));
    CUdeviceptr va; OK(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0)); OK(cuMemMap(va, gran, 0, h0, 0));
    CUmemAccessDesc acc = {prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE}; OK(cuMemSetAccess(va, gran, &acc, 1));

    TRY(cuMemFree(d + 4096), d);
    TRY(cuMemFree((CUdeviceptr)h), h);
    TRY(cuMemFree((CUdeviceptr)reg), reg);
    TRY(cuMemFree(va), va);
    TRY(cuMemFree((CUdeviceptr)plain), plain);
    TRY(cuMemFreeAsync(d + 4096, 0), d);
    TRY(cuMemFreeAsync((CUdeviceptr)h, 0), h);
    TRY(cuMemFreeAsync(va, 0), va);
    TRY(cuMemFreeHost((void *)d), d);
    TRY(cuMemFreeHost(reg), reg);
    TRY(cuMemFreeHost((char *)h + 4096), h);
    TRY(cuMemFreeHost((void *)va), va);
    TRY(cuMemHostUnregister(h), h);
    TRY(cuMemHostUnregister((char *)reg + 4096), reg);
    TRY(cuMemHostUnregister((void *)d), d);
    TRY(cuMemHostUnregister((void *)va), va);
    TRY(cuMemRelease(h0), va);
    TRY(cuMemUnmap(va, gran), va);
    TRY(cuMemAddressFree(va, 2 * gran), va);
    TRY(cuMemFreeAsync(pa, 0), pa);
    OK(cuStreamSynchronize(0));
    TRY(cuMemFreeAsync(d, 0), d);
    OK(cuStreamSynchronize(0));
    still("sync", d);
    TRY(cuMemFreeHost(h), h);
    TRY(cuMemHostUnregister(reg), reg);

    /* A reservation freed while a page is still mapped in it (memhook
     * does not hook cuMemAddressFree): refused, or unmapped with it?
     * "after" shows what the driver has at the page then. */
    CUmemGenericAllocationHandle h1; OK(cuMemCreate(&h1, gran, &prop, 0));
    CUdeviceptr vb; OK(cuMemAddressReserve(&vb, 2 * gran, 0, 0, 0)); OK(cuMemMap(vb, gran, 0, h1, 0));
    OK(cuMemSetAccess(vb, gran, &acc, 1));
    TRY(cuMemAddressFree(vb, 2 * gran), vb);
    TRY(cuMemUnmap(vb, gran), vb);
    TRY(cuMemAddressFree(vb, 2 * gran), vb);
    TRY(cuMemRelease(h1), vb);

    /* A device free of a module's globals (memhook marks their entries,
     * so a device free of one looks at the driver's answer and puts the
     * entry back only where the driver's range starts at the address):
     * what range the driver gives each global, and whether it refuses. */
    static const char ptx[] =
        ".version 7.0\n.target sm_70\n.address_size 64\n"
        ".visible .global .align 8 .b8 first[256];\n"
        ".visible .global .align 8 .b8 second[256];\n"
        ".visible .global .attribute(.managed) .align 8 .b8 managed[256];\n";
    CUmodule mod;
    OK(cuModuleLoadData(&mod, ptx));
    CUdeviceptr g[3] = {0, 0, 0}; size_t gsize[3] = {0, 0, 0};
    const char *names[3] = {"first", "second", "managed"};
    for (int i = 0; i < 3; i++) {
        OK(cuModuleGetGlobal(&g[i], &gsize[i], mod, names[i]));
        CUdeviceptr mbase = 0; size_t msize = 0;
        CUpointer_attribute a[2] = {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
        void *d2[2] = {&mbase, &msize};
        CUresult r = cuPointerGetAttributes(2, a, d2, g[i]);
        printf("global %-8s at %#llx size %zu: mapping rc=%d [%#llx,+%zu)\n", names[i], (unsigned long long)g[i], gsize[i], r,
               (unsigned long long)mbase, msize);
        still(names[i], g[i]);
    }
    TRY(cuMemFree(g[1]), g[1]);
    TRY(cuMemFree(g[0]), g[0]);
    TRY(cuMemFreeAsync(g[0], 0), g[0]);
    OK(cuStreamSynchronize(0));
    still("sync", g[0]);
    TRY(cuMemFree(g[2]), g[2]);
    TRY(cuMemFreeHost((void *)g[0]), g[0]);
    TRY(cuModuleUnload(mod), g[0]);
    return 0;
}

/* What the driver answers about pointers of every kind (the attributes
 * memhook's classify asks, the mapping attributes beside them, and
 * cuMemGetAddressRange), printed for the results file: allocations, pinned
 * and registered host memory, pool memory, and pages mapped into a reserved
 * range with cuMemMap (device and host-located), mapped and not. Driver 580
 * on the H200 (run 158) gives a mapped page's range attributes as the whole
 * reservation and its mapping attributes as the mapping; see
 * linux/src/cuda/driver.rs (mapped_part). Build: gcc -I CUDA/include
 * pointer_attributes.c -lcuda. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define OK(x) do { CUresult r_ = (x); if (r_) { printf("%s: %d\n", #x, r_); } } while (0)

static void q(const char *what, CUdeviceptr p) {
    unsigned mt = 0, managed = 0, mapped = 0; int ord = -2;
    CUdeviceptr start = 0, mbase = 0; size_t size = 0, msize = 0;
    CUpointer_attribute a[8] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_MAPPED, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
    void *d[8] = {&mt, &managed, &ord, &start, &size, &mapped, &mbase, &msize};
    CUresult r8 = cuPointerGetAttributes(8, a, d, p);
    printf("%-28s p=%#llx all8 rc=%d: type %u managed %u ord %d range [%#llx,+%zu) mapped %u mapping [%#llx,+%zu)\n",
           what, (unsigned long long)p, r8, mt, managed, ord, (unsigned long long)start, size, mapped,
           (unsigned long long)mbase, msize);
    CUdeviceptr b = 0; size_t s = 0;
    CUresult r = cuMemGetAddressRange(&b, &s, p);
    printf("    cuMemGetAddressRange rc=%d [%#llx,+%zu)\n", r, (unsigned long long)b, s);
}

int main(void) {
    CUdevice dev; CUcontext ctx;
    OK(cuInit(0)); OK(cuDeviceGet(&dev, 0)); OK(cuDevicePrimaryCtxRetain(&ctx, dev)); OK(cuCtxSetCurrent(ctx));
    CUdeviceptr p1, p2, p3;
    OK(cuMemAlloc(&p1, 4096)); OK(cuMemAlloc(&p2, 4096)); OK(cuMemAlloc(&p3, 4 << 20));
    q("cuMemAlloc 4K", p1); q("cuMemAlloc 4K second", p2); q("cuMemAlloc 4K +100", p2 + 100); q("cuMemAlloc 4M", p3);
    CUdeviceptr m; OK(cuMemAllocManaged(&m, 1 << 20, CU_MEM_ATTACH_GLOBAL)); q("managed 1M", m);
    void *h; OK(cuMemAllocHost(&h, 1 << 20)); q("cuMemAllocHost 1M", (CUdeviceptr)h);
    void *reg = mmap(0, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    OK(cuMemHostRegister(reg, 4 << 20, 0)); q("registered 4M +8K", (CUdeviceptr)reg + 8192);
    void *plain = malloc(100); q("malloc", (CUdeviceptr)plain);
    CUdeviceptr pa; OK(cuMemAllocAsync(&pa, 4096, 0)); OK(cuStreamSynchronize(0)); q("pool 4K", pa);

    CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
    size_t gran = 0; OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h0, h2, hh;
    OK(cuMemCreate(&h0, gran, &prop, 0)); OK(cuMemCreate(&h2, 2 * gran, &prop, 0));
    CUdeviceptr va; OK(cuMemAddressReserve(&va, 8 * gran, 0, 0, 0));
    OK(cuMemMap(va, gran, 0, h0, 0)); OK(cuMemMap(va + 2 * gran, 2 * gran, 0, h2, 0));
    CUmemAccessDesc acc = {prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    OK(cuMemSetAccess(va, gran, &acc, 1)); OK(cuMemSetAccess(va + 2 * gran, 2 * gran, &acc, 1));
    printf("granularity %zu, reservation [%#llx,+%zu)\n", gran, (unsigned long long)va, 8 * gran);
    q("vmm page 0", va); q("vmm page 0 +100", va + 100); q("vmm page 1 (unmapped)", va + gran);
    q("vmm pages 2-3 at 3", va + 3 * gran); q("vmm page 5 (unmapped)", va + 5 * gran);
    /* host-located physical memory in the same reservation */
    CUmemAllocationProp hp = prop; hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; hp.location.id = 0;
    size_t hgran = 0; CUresult r = cuMemGetAllocationGranularity(&hgran, &hp, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    printf("host numa granularity rc=%d %zu\n", r, hgran);
    if (r == 0 && hgran <= gran && cuMemCreate(&hh, gran, &hp, 0) == 0) {
        OK(cuMemMap(va + 6 * gran, gran, 0, hh, 0));
        CUmemAccessDesc acc2 = {prop.location, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        OK(cuMemSetAccess(va + 6 * gran, gran, &acc2, 1));
        q("vmm page 6 (host numa)", va + 6 * gran);
    } else printf("no host-numa cuMemCreate\n");
    /* unmap page 0, query again */
    OK(cuMemUnmap(va, gran)); q("vmm page 0 after unmap", va);
    return 0;
}

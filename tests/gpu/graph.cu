/* Graph memory on the real driver. CUDA gives a graph's allocation (an
 * allocation node, or a stream-ordered allocation made while its stream
 * captures a graph) its address when the node is made; the memory comes
 * when the graph runs, and before that the driver knows nothing at the
 * address. memhook reports each allocation when it is made, of unknown
 * type, and records the range Unknown, not host: a lookup sends the
 * caller to the driver (memhook_memtype_classify), whose answer once the
 * graph ran is CUDA (not recorded). Frees are reported, and the range
 * stays Unknown: a launch makes the memory again. Checked, with memhook
 * installed in the mode given:
 *   A  a captured cudaMallocAsync, freed with cudaFree after a launch,
 *      launched again (the memory back at the same address) and freed;
 *   B  a captured cudaMallocAsync and cudaFreeAsync, launched twice;
 *   C  an allocation node, freed with cudaFree after a launch;
 *   D  an allocation node and a free node;
 *   E  the same through the generic cudaGraphAddNode;
 *   F  a free node for memory that is no graph allocation: refused, and
 *      the allocation stays CUDA.
 *
 *   nvcc -O2 -I. graph.cu -L. -lmemhook -Xlinker -rpath -Xlinker '$ORIGIN' -o graph
 *   ./graph bistro     (procaddr, a comma list; none: what a lookup said
 *                       with nothing hooked, and fails) */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memhook.h"

#define CHECK(call)                                                                \
    do {                                                                           \
        cudaError_t rc_ = (call);                                                  \
        if (rc_ != cudaSuccess) {                                                  \
            fprintf(stderr, "graph: %s = %d (%s)\n", #call, rc_, cudaGetErrorString(rc_)); \
            exit(3);                                                               \
        }                                                                          \
    } while (0)

static const size_t SIZE = (size_t)8 << 20;
static int failures;

/* The events delivered, in order (a handler must not allocate). */
static struct {
    uint32_t type;
    uintptr_t address;
    size_t size;
    uint32_t mem_type;
} events[256];
static int nevents, seen_up_to;

static void on_event(uint32_t type, memhook_event_t *e, void *) {
    int i = __atomic_fetch_add(&nevents, 1, __ATOMIC_SEQ_CST);
    if (i < 256)
        events[i] = {type, (uintptr_t)e->mem_type.address, e->mem_type.size, e->mem_type.mem_type};
}

static void expect(const char *step, bool ok, const char *what) {
    printf("graph %s: %s: %s\n", step, what, ok ? "ok" : "FAILED");
    failures += !ok;
}

/* The events since the last call: exactly `want` (0: none; 'A': one
 * MEM_TYPE_ALLOC; 'F': one MEM_TYPE_FREE; "AF" both, in order) at p, of
 * SIZE bytes and type `type` (-1: any). */
static void events_are(const char *step, const char *want, void *p, int type) {
    int total = __atomic_load_n(&nevents, __ATOMIC_SEQ_CST), n = total - seen_up_to;
    bool ok = n == (int)strlen(want);
    for (int i = 0; ok && i < n; i++) {
        auto &e = events[seen_up_to + i];
        uint32_t kind = want[i] == 'A' ? MEMHOOK_EVENT_MEM_TYPE_ALLOC : MEMHOOK_EVENT_MEM_TYPE_FREE;
        ok = e.type == kind && e.address == (uintptr_t)p && e.size == SIZE && (type < 0 || (int)e.mem_type == type);
    }
    char what[64];
    snprintf(what, sizeof what, "events \"%s\" at %p (%d seen)", want, p, n);
    for (int i = seen_up_to; i < total && i < 256; i++)
        printf("    event %s %#lx size %zu type %u\n", events[i].type == MEMHOOK_EVENT_MEM_TYPE_ALLOC ? "ALLOC" : "FREE",
               events[i].address, events[i].size, events[i].mem_type);
    seen_up_to = total;
    expect(step, ok, what);
}

/* The map's answer at p: `type`, and for a recorded range its base p and
 * length SIZE. */
static void lookup_is(const char *step, void *p, uint32_t type) {
    memhook_mem_info_t info;
    memset(&info, 0, sizeof info);
    memhook_memtype_lookup(p, 4096, &info);
    bool ok = info.mem_type == type && (type == MEMHOOK_MEM_TYPE_HOST || (info.base == p && info.len == SIZE));
    char what[96];
    snprintf(what, sizeof what, "lookup type %u (want %u) base %p len %zu", info.mem_type, type, info.base, info.len);
    expect(step, ok, what);
}

/* The driver's answer through memhook, once the graph ran: CUDA on device
 * 0 over the whole allocation; the map stays Unknown. */
static void classify_is_cuda(const char *step, void *p) {
    memhook_mem_info_t info;
    memset(&info, 0, sizeof info);
    memhook_memtype_classify(p, 4096, &info);
    char what[96];
    snprintf(what, sizeof what, "classify type %u device %d len %zu", info.mem_type, info.device, info.len);
    expect(step, info.mem_type == MEMHOOK_MEM_TYPE_CUDA && info.device == 0 && info.len == SIZE, what);
    lookup_is(step, p, MEMHOOK_MEM_TYPE_UNKNOWN);
}

static cudaMemAllocNodeParams alloc_params(void) {
    cudaMemAllocNodeParams prm;
    memset(&prm, 0, sizeof prm);
    prm.poolProps.allocType = cudaMemAllocationTypePinned;
    prm.poolProps.location.type = cudaMemLocationTypeDevice;
    prm.poolProps.location.id = 0;
    prm.bytesize = SIZE;
    return prm;
}

static void launch(cudaGraph_t g, cudaStream_t s, int times) {
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    for (int i = 0; i < times; i++)
        CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGraphExecDestroy(x));
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "bistro";
    char config[128];
    snprintf(config, sizeof config, "cuda=%s;mmap=none", mode);
    if (memhook_install(config) != 0) {
        fprintf(stderr, "graph: install %s: %s\n", config, memhook_last_error());
        return 4;
    }
    if (memhook_set_event_handler(MEMHOOK_EVENT_MEM_TYPE_ALLOC | MEMHOOK_EVENT_MEM_TYPE_FREE, 0, on_event, NULL) != 0)
        return 4;
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    seen_up_to = __atomic_load_n(&nevents, __ATOMIC_SEQ_CST);
    const int UNKNOWN = MEMHOOK_MEM_TYPE_UNKNOWN;

    { /* A */
        void *p = NULL;
        cudaGraph_t g;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CHECK(cudaMallocAsync(&p, SIZE, s));
        CHECK(cudaMemsetAsync(p, 1, SIZE, s));
        CHECK(cudaStreamEndCapture(s, &g));
        events_are("A captured", "A", p, UNKNOWN);
        lookup_is("A captured", p, MEMHOOK_MEM_TYPE_UNKNOWN);
        launch(g, s, 1);
        lookup_is("A launched", p, MEMHOOK_MEM_TYPE_UNKNOWN);
        classify_is_cuda("A launched", p);
        CHECK(cudaFree(p));
        events_are("A cudaFree", "F", p, UNKNOWN);
        lookup_is("A cudaFree", p, MEMHOOK_MEM_TYPE_UNKNOWN);
        launch(g, s, 1);
        classify_is_cuda("A launched again", p);
        CHECK(cudaFree(p));
        events_are("A cudaFree again", "F", p, UNKNOWN);
        CHECK(cudaGraphDestroy(g));
    }
    { /* B */
        void *p = NULL;
        cudaGraph_t g;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CHECK(cudaMallocAsync(&p, SIZE, s));
        CHECK(cudaMemsetAsync(p, 1, SIZE, s));
        CHECK(cudaFreeAsync(p, s));
        CHECK(cudaStreamEndCapture(s, &g));
        events_are("B captured", "AF", p, UNKNOWN);
        lookup_is("B captured", p, MEMHOOK_MEM_TYPE_UNKNOWN);
        launch(g, s, 2);
        events_are("B launched twice", "", p, -1);
        CHECK(cudaGraphDestroy(g));
    }
    { /* C */
        cudaGraph_t g;
        cudaGraphNode_t n;
        CHECK(cudaGraphCreate(&g, 0));
        cudaMemAllocNodeParams prm = alloc_params();
        CHECK(cudaGraphAddMemAllocNode(&n, g, NULL, 0, &prm));
        events_are("C node", "A", prm.dptr, UNKNOWN);
        lookup_is("C node", prm.dptr, MEMHOOK_MEM_TYPE_UNKNOWN);
        launch(g, s, 1);
        classify_is_cuda("C launched", prm.dptr);
        CHECK(cudaFree(prm.dptr));
        events_are("C cudaFree", "F", prm.dptr, UNKNOWN);
        lookup_is("C cudaFree", prm.dptr, MEMHOOK_MEM_TYPE_UNKNOWN);
        CHECK(cudaGraphDestroy(g));
    }
    { /* D */
        cudaGraph_t g;
        cudaGraphNode_t n, f;
        CHECK(cudaGraphCreate(&g, 0));
        cudaMemAllocNodeParams prm = alloc_params();
        CHECK(cudaGraphAddMemAllocNode(&n, g, NULL, 0, &prm));
        CHECK(cudaGraphAddMemFreeNode(&f, g, &n, 1, prm.dptr));
        events_are("D nodes", "AF", prm.dptr, UNKNOWN);
        lookup_is("D nodes", prm.dptr, MEMHOOK_MEM_TYPE_UNKNOWN);
        launch(g, s, 1);
        CHECK(cudaGraphDestroy(g));
    }
    { /* E */
        cudaGraph_t g;
        cudaGraphNode_t n, f;
        CHECK(cudaGraphCreate(&g, 0));
        /* (A union with members of their own constructors: no default
         * constructor in C++; zeroed memory instead.) */
        cudaGraphNodeParams *prm = (cudaGraphNodeParams *)calloc(1, sizeof(cudaGraphNodeParams));
        cudaGraphNodeParams *fp = (cudaGraphNodeParams *)calloc(1, sizeof(cudaGraphNodeParams));
        prm->type = cudaGraphNodeTypeMemAlloc;
        cudaMemAllocNodeParams a = alloc_params();
        prm->alloc.poolProps = a.poolProps;
        prm->alloc.bytesize = a.bytesize;
        CHECK(cudaGraphAddNode(&n, g, NULL, NULL, 0, prm));
        void *p = prm->alloc.dptr;
        events_are("E generic alloc node", "A", p, UNKNOWN);
        lookup_is("E generic alloc node", p, MEMHOOK_MEM_TYPE_UNKNOWN);
        fp->type = cudaGraphNodeTypeMemFree;
        fp->free.dptr = p;
        CHECK(cudaGraphAddNode(&f, g, &n, NULL, 1, fp));
        free(prm);
        free(fp);
        events_are("E generic free node", "F", p, UNKNOWN);
        lookup_is("E generic free node", p, MEMHOOK_MEM_TYPE_UNKNOWN);
        launch(g, s, 1);
        CHECK(cudaGraphDestroy(g));
    }
    { /* F */
        void *d = NULL;
        CHECK(cudaMalloc(&d, SIZE));
        events_are("F cudaMalloc", "A", d, MEMHOOK_MEM_TYPE_CUDA);
        cudaGraph_t g;
        cudaGraphNode_t f;
        CHECK(cudaGraphCreate(&g, 0));
        cudaError_t rc = cudaGraphAddMemFreeNode(&f, g, NULL, 0, d);
        (void)cudaGetLastError();
        char what[64];
        snprintf(what, sizeof what, "free node of plain memory refused (%d)", rc);
        expect("F", rc != cudaSuccess, what);
        events_are("F refused", "", d, -1);
        lookup_is("F refused", d, MEMHOOK_MEM_TYPE_CUDA);
        CHECK(cudaGraphDestroy(g));
        CHECK(cudaFree(d));
        events_are("F cudaFree", "F", d, MEMHOOK_MEM_TYPE_CUDA);
    }
    printf("graph %s: %s\n", mode, failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

/* Clients of the fake driver, built by the tests into separate shared
 * objects (one -DCLIENT_* each), as an application's libraries reach the
 * driver:
 *   CLIENT_PLT     links against libcuda.so.1 and calls through its PLT;
 *   CLIENT_DLSYM   dlopens libcuda and resolves functions with dlsym;
 *   CLIENT_RUNTIME behaves as CUDA 13's runtime: dlsym of
 *                  cuGetProcAddress_v2, then cuGetProcAddress for
 *                  cuGetProcAddress itself, then for everything else
 *                  through the pointer it got;
 *   CLIENT_LOADER  only dlopens (so that the test's loads go through a
 *                  library whose dlopen memhook follows);
 *   CLIENT_CUDART  is a shared runtime (built as libcudart.so.13):
 *                  cudaMalloc and cudaFree call the driver through the
 *                  pointers cuGetProcAddress gives, as CUDA 13's runtime
 *                  does, so that memhook hooks both levels of one call.
 * Each run function makes `n` allocations of `size` bytes and frees them,
 * returning the number of calls that failed (or -1 when a function could
 * not be found). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef unsigned long long CUdeviceptr;
typedef int CUresult;
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, void *);
typedef CUresult (*free_async_fn)(CUdeviceptr, void *);
typedef CUresult (*gpa_fn)(const char *, void **, int, unsigned long long, int *);

__attribute__((unused)) static int pairs(alloc_fn a, free_fn f, int n, size_t size) {
    int failed = 0;
    for (int i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        if (a(&p, size) != 0) {
            failed++;
            continue;
        }
        failed += f(p) != 0;
    }
    return failed;
}

/* `name` at `version` as CUDA 13's runtime finds it: dlsym of
 * cuGetProcAddress_v2 in the driver (`libcuda` opened with `flags`), then
 * cuGetProcAddress for cuGetProcAddress itself, then for `name` through
 * the pointer that gave (NULL if not found). */
__attribute__((unused)) static void *proc_of(const char *libcuda, int flags, const char *name, int version) {
    void *h = dlopen(libcuda, flags);
    if (!h)
        return NULL;
    gpa_fn first = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    gpa_fn gpa = NULL;
    void *f = NULL;
    if (first && first("cuGetProcAddress", (void **)&gpa, 13000, 0, NULL) == 0 && gpa)
        gpa(name, &f, version, 0, NULL);
    dlclose(h);
    return f;
}

#ifdef CLIENT_PLT
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
int plt_run(int n, size_t size) { return pairs(cuMemAlloc_v2, cuMemFree_v2, n, size); }
/* One allocation left alive, for lookups. */
CUdeviceptr plt_alloc(size_t size) {
    CUdeviceptr p = 0;
    return cuMemAlloc_v2(&p, size) == 0 ? p : 0;
}
int plt_free(CUdeviceptr p) { return cuMemFree_v2(p); }
#endif

#ifdef CLIENT_DLSYM
int dlsym_run(const char *libcuda, int n, size_t size) {
    void *h = dlopen(libcuda, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
    alloc_fn a = (alloc_fn)dlsym(h, "cuMemAlloc_v2");
    free_fn f = (free_fn)dlsym(h, "cuMemFree_v2");
    int r = a && f ? pairs(a, f, n, size) : -1;
    dlclose(h);
    return r;
}
#endif

#ifdef CLIENT_RUNTIME
int runtime_run(const char *libcuda, int n, size_t size) {
    void *h = dlopen(libcuda, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
    gpa_fn first = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    gpa_fn gpa = NULL;
    int r = -1;
    if (first && first("cuGetProcAddress", (void **)&gpa, 13000, 0, NULL) == 0 && gpa) {
        alloc_fn a = NULL;
        free_fn f = NULL;
        alloc_async_fn aa = NULL;
        free_async_fn fa = NULL;
        gpa("cuMemAlloc", (void **)&a, 13000, 0, NULL);
        gpa("cuMemFree", (void **)&f, 13000, 0, NULL);
        /* --default-stream per-thread: the _ptsz definitions. */
        gpa("cuMemAllocAsync", (void **)&aa, 13000, 2, NULL);
        gpa("cuMemFreeAsync", (void **)&fa, 13000, 2, NULL);
        if (a && f && aa && fa) {
            r = pairs(a, f, n, size);
            CUdeviceptr p = 0;
            if (aa(&p, size, NULL) != 0 || fa(p, NULL) != 0)
                r++;
        }
    }
    dlclose(h);
    return r;
}

/* The definition the runtime's way gives for `name` at `version` (NULL
 * if none; the driver stays loaded by the test). */
void *runtime_proc(const char *libcuda, const char *name, int version) {
    return proc_of(libcuda, RTLD_NOW | RTLD_LOCAL, name, version);
}
#endif

#ifdef CLIENT_CUDART
static alloc_fn drv_alloc;
static free_fn drv_free;

/* The driver's functions, once (the driver must be loaded already). */
static int resolve(void) {
    if (drv_alloc && drv_free)
        return 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        return -1;
    gpa_fn first = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    gpa_fn gpa = NULL;
    int r = -1;
    if (first && first("cuGetProcAddress", (void **)&gpa, 13000, 0, NULL) == 0 && gpa &&
        gpa("cuMemAlloc", (void **)&drv_alloc, 13000, 0, NULL) == 0 &&
        gpa("cuMemFree", (void **)&drv_free, 13000, 0, NULL) == 0 && drv_alloc && drv_free)
        r = 0;
    dlclose(h);
    return r;
}

/* cudaError_t values: 0 success, 1 (cudaErrorInvalidValue) otherwise. */
int cudaMalloc(void **p, size_t size) {
    if (!p || resolve() != 0)
        return 1;
    CUdeviceptr d = 0;
    if (drv_alloc(&d, size) != 0)
        return 2; /* cudaErrorMemoryAllocation */
    *p = (void *)d;
    return 0;
}

int cudaFree(void *p) {
    if (resolve() != 0)
        return 1;
    return drv_free((CUdeviceptr)p) == 0 ? 0 : 1;
}

/* Memory another process exported: the handle (64 bytes) passed by
 * value, to the driver's function cuGetProcAddress gives. */
typedef struct {
    char reserved[64];
} ipc_handle;
typedef CUresult (*ipc_open_fn)(CUdeviceptr *, ipc_handle, unsigned);
typedef CUresult (*ipc_close_fn)(CUdeviceptr);
typedef CUresult (*pool_import_fn)(CUdeviceptr *, void *, ipc_handle *);

/* The driver's `name` through cuGetProcAddress (NULL if not found). */
static void *driver_proc(const char *name) { return proc_of("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD, name, 13000); }

int cudaIpcOpenMemHandle(void **p, ipc_handle handle, unsigned flags) {
    ipc_open_fn open = (ipc_open_fn)driver_proc("cuIpcOpenMemHandle");
    CUdeviceptr d = 0;
    if (!p || !open || open(&d, handle, flags) != 0)
        return 1;
    *p = (void *)d;
    return 0;
}

int cudaIpcCloseMemHandle(void *p) {
    ipc_close_fn close = (ipc_close_fn)driver_proc("cuIpcCloseMemHandle");
    return close && close((CUdeviceptr)p) == 0 ? 0 : 1;
}

/* Graph memory nodes (cudaMemAllocNodeParams has the driver's layout). */
typedef CUresult (*alloc_node_fn)(void **, void *, void *const *, size_t, void *);
typedef CUresult (*free_node_fn)(void **, void *, void *const *, size_t, CUdeviceptr);

int cudaGraphAddMemAllocNode(void **node, void *graph, void *const *deps, size_t n, void *params) {
    alloc_node_fn add = (alloc_node_fn)driver_proc("cuGraphAddMemAllocNode");
    return add && add(node, graph, deps, n, params) == 0 ? 0 : 1;
}

int cudaGraphAddMemFreeNode(void **node, void *graph, void *const *deps, size_t n, void *dptr) {
    free_node_fn add = (free_node_fn)driver_proc("cuGraphAddMemFreeNode");
    return add && add(node, graph, deps, n, (CUdeviceptr)dptr) == 0 ? 0 : 1;
}

/* A buffer of external memory (the description has the driver's layout). */
typedef CUresult (*mapped_buffer_fn)(CUdeviceptr *, void *, const void *);
int cudaExternalMemoryGetMappedBuffer(void **p, void *ext, const void *desc) {
    mapped_buffer_fn map = (mapped_buffer_fn)driver_proc("cuExternalMemoryGetMappedBuffer");
    CUdeviceptr d = 0;
    if (!p || !map || map(&d, ext, desc) != 0)
        return 1;
    *p = (void *)d;
    return 0;
}

/* Graphics interop: the driver's calls, a resource handle being the
 * driver's. */
typedef CUresult (*graphics_map_fn)(unsigned, void **, void *);
typedef CUresult (*graphics_pointer_fn)(CUdeviceptr *, size_t *, void *);
typedef CUresult (*graphics_unregister_fn)(void *);
int cudaGraphicsMapResources(int count, void **resources, void *stream) {
    graphics_map_fn map = (graphics_map_fn)driver_proc("cuGraphicsMapResources");
    return count >= 0 && map && map((unsigned)count, resources, stream) == 0 ? 0 : 1;
}
int cudaGraphicsResourceGetMappedPointer(void **p, size_t *size, void *resource) {
    graphics_pointer_fn pointer = (graphics_pointer_fn)driver_proc("cuGraphicsResourceGetMappedPointer");
    CUdeviceptr d = 0;
    if (!p || !pointer || pointer(&d, size, resource) != 0)
        return 1;
    *p = (void *)d;
    return 0;
}
int cudaGraphicsUnmapResources(int count, void **resources, void *stream) {
    graphics_map_fn unmap = (graphics_map_fn)driver_proc("cuGraphicsUnmapResources");
    return count >= 0 && unmap && unmap((unsigned)count, resources, stream) == 0 ? 0 : 1;
}
int cudaGraphicsUnregisterResource(void *resource) {
    graphics_unregister_fn unregister = (graphics_unregister_fn)driver_proc("cuGraphicsUnregisterResource");
    return unregister && unregister(resource) == 0 ? 0 : 1;
}
/* EGL interop: the frame is passed as the driver's (the real runtime's
 * cudaEglFrame describes the planes otherwise: the fake passes its own
 * caller's frame through), as are a stream's connection and resources. */
typedef CUresult (*egl_frame_fn)(void *, void *, unsigned, unsigned);
typedef CUresult (*egl_acquire_fn)(void **, void **, void *, unsigned);
typedef CUresult (*egl_release_fn)(void **, void *, void *);
int cudaGraphicsResourceGetMappedEglFrame(void *frame, void *resource, unsigned index, unsigned mip) {
    egl_frame_fn get = (egl_frame_fn)driver_proc("cuGraphicsResourceGetMappedEglFrame");
    return get && get(frame, resource, index, mip) == 0 ? 0 : 1;
}
int cudaEGLStreamConsumerAcquireFrame(void **conn, void **resource, void *stream, unsigned timeout) {
    egl_acquire_fn acquire = (egl_acquire_fn)driver_proc("cuEGLStreamConsumerAcquireFrame");
    return acquire && acquire(conn, resource, stream, timeout) == 0 ? 0 : 1;
}
int cudaEGLStreamConsumerReleaseFrame(void **conn, void *resource, void *stream) {
    egl_release_fn release = (egl_release_fn)driver_proc("cuEGLStreamConsumerReleaseFrame");
    return release && release(conn, resource, stream) == 0 ? 0 : 1;
}

int cudaMemPoolImportPointer(void **p, void *pool, ipc_handle *data) {
    pool_import_fn import = (pool_import_fn)driver_proc("cuMemPoolImportPointer");
    CUdeviceptr d = 0;
    if (!p || !import || import(&d, pool, data) != 0)
        return 1;
    *p = (void *)d;
    return 0;
}
#endif

#ifdef CLIENT_LOADER
void *loader_open(const char *path) { return dlopen(path, RTLD_NOW | RTLD_GLOBAL); }
int loader_close(void *h) { return dlclose(h); }
#endif

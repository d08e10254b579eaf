// A CUDA runtime program for the GPU tests, built by scripts/gpu-run.sh with
// nvcc three ways: static runtime (the default), -cudart shared, and
// --default-stream per-thread. It makes one allocation of each kind and
// frees it; `memhook run --json` counts what each hook mode saw.
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e = (x);                                                                       \
        if (e != cudaSuccess) {                                                                    \
            std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));                          \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

__device__ char device_global[4096];

int main() {
    void *p = nullptr;
    CHECK(cudaFree(nullptr)); // create the context first
    CHECK(cudaMalloc(&p, 1 << 20));
    CHECK(cudaFree(p));
    CHECK(cudaMallocManaged(&p, 2 << 20));
    CHECK(cudaFree(p));
    CHECK(cudaMallocHost(&p, 3 << 20));
    CHECK(cudaFreeHost(p));
    CHECK(cudaMallocAsync(&p, 4 << 20, 0));
    CHECK(cudaFreeAsync(p, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaGetSymbolAddress(&p, device_global));
    std::printf("runtime_prog: ok\n");
    return 0;
}

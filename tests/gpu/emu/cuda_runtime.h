/* A host emulation of the small part of the CUDA runtime and device
 * language that the kernel files of src/backend/cuda/ use, so that they run on the
 * CPU, without a GPU or a driver, under tests/gpu/emu/check.sh: each launch
 * runs its blocks one after another, each block as blockDim.x host threads
 * (so __syncthreads is a real barrier and __shared__ arrays are shared by
 * the block). Memory is host memory; the stream-ordered calls run at once.
 * It checks the kernels' indexing and arithmetic against the CPU backend;
 * it says nothing about the GPU's own behaviour (timing, memory model,
 * libdevice's transcendentals, launch limits). Test-only: never part of the
 * library. */
#ifndef LK_CUDA_EMU_RUNTIME_H
#define LK_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <thread>
#include <vector>

#define __global__ static
#define __device__
#define __host__
#define __shared__ static
#define __restrict__ __restrict

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3() = default;
    dim3(unsigned a) : x(a) {}
};
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static pthread_barrier_t lk_emu_barrier;

typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 } cudaError_t;
typedef void *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };

static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
/* Every pointer here is "device memory" to the kernels: the reductions'
 * outputs are then the accumulators themselves, the path a training step
 * takes (gpu_ops on a GPU hands them host memory, the other path). */
enum cudaMemoryType { cudaMemoryTypeUnregistered, cudaMemoryTypeHost, cudaMemoryTypeDevice, cudaMemoryTypeManaged };
struct cudaPointerAttributes {
    cudaMemoryType type;
    int device;
};
static inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *) {
    a->type = cudaMemoryTypeDevice, a->device = 0;
    return cudaSuccess;
}
static inline const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated error" : "no error"; }
static inline cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) {
    *p = malloc(n);
    if (*p) memset(*p, 0xa5, n); /* garbage, as cudaMalloc's memory is */
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaMallocAsync(void **p, size_t n, int) { return cudaMallocAsync(p, n, (cudaStream_t)0); }
static inline cudaError_t cudaFreeAsync(void *p, int) { return free(p), cudaSuccess; }
static inline cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) { return memcpy(d, s, n), cudaSuccess; }
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, int) {
    return memcpy(d, s, n), cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, int) { return memset(p, v, n), cudaSuccess; }

static inline void __syncthreads(void) { pthread_barrier_wait(&lk_emu_barrier); }
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v) {
    unsigned long long old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

/* kernel<<<grid, block>>>(args) becomes lk_emu_launch(grid, block, [=] { kernel(args); }) (check.sh). */
static inline void lk_emu_launch(dim3 grid, dim3 block, const std::function<void()> &f) {
    gridDim = grid, blockDim = block;
    for (unsigned b = 0; b < grid.x; b++) {
        pthread_barrier_init(&lk_emu_barrier, NULL, block.x);
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < block.x; t++)
            ts.emplace_back([&f, b, t] {
                blockIdx.x = b, threadIdx.x = t;
                f();
            });
        for (auto &t : ts) t.join();
        pthread_barrier_destroy(&lk_emu_barrier);
    }
}

#endif

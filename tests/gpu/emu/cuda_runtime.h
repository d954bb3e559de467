/* A host emulation of the small part of the CUDA runtime and device
 * language that the kernel files of src/backend/cuda/ use, so that they run on the
 * CPU, without a GPU or a driver, under tests/gpu/emu/check.sh: each launch
 * runs its blocks one after another, each block as blockDim.x host threads
 * (so __syncthreads is a real barrier and __shared__ arrays are shared by
 * the block). Memory is host memory; the stream-ordered calls run at once.
 * Streams are tokens: the kernel files' lk_cu_stream() (common.cuh) is the
 * one token here, and a launch, scratch allocation or copy on any other
 * stream (the legacy stream 0 above all, which a CUDA graph cannot
 * capture) fails as a launch error, so the emulation also checks that
 * every call goes on the compute stream; a launch without a stream does
 * not compile.
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
#include <mutex>
#include <tuple>
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

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidResourceHandle = 400
} cudaError_t;
typedef void *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault };

#ifdef LK_FAKE_GPU
/* Built into the fake GPU (tests/gpu/fake/): the runtime calls are the
 * fake runtime's, the stream is the library's compute stream (device/cuda.c
 * made it), and a launch is queued on it to run later, in stream order, or
 * recorded into a graph while the stream captures. The types here match
 * the runtime's ABI (enums are ints, handles pointers, the attribute
 * struct's layout). */
#define LK_CU_EMU 1
enum cudaMemoryType { cudaMemoryTypeUnregistered, cudaMemoryTypeHost, cudaMemoryTypeDevice, cudaMemoryTypeManaged };
struct cudaPointerAttributes { /* the runtime's layout, reserved words included (it writes them) */
    cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
    long reserved[8];
};
extern "C" {
cudaStream_t lk__cuda_stream_current(void);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t st);
cudaError_t cudaFreeAsync(void *p, cudaStream_t st);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st);
cudaError_t cudaStreamSynchronize(cudaStream_t st);
}
static inline cudaStream_t lk_cu_stream(void) { return lk__cuda_stream_current(); }
#include "gpu/fake/fake.h"
#else
/* The compute stream's token (common.cuh uses this instead of the
 * library's lk__cuda_stream_current). */
#define LK_CU_EMU 1
static char lk_emu_compute_stream;
static inline cudaStream_t lk_cu_stream(void) { return &lk_emu_compute_stream; }
/* A launch's error, as the runtime keeps it until cudaGetLastError. */
static thread_local cudaError_t lk_emu_last_error = cudaSuccess;
static inline cudaError_t lk_emu_check_stream(cudaStream_t s) {
    return s == &lk_emu_compute_stream ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

static inline cudaError_t cudaGetLastError(void) {
    cudaError_t e = lk_emu_last_error;
    lk_emu_last_error = cudaSuccess;
    return e;
}
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
static inline cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t st) {
    *p = NULL;
    if (cudaError_t e = lk_emu_check_stream(st)) return e;
    *p = malloc(n);
    if (*p) memset(*p, 0xa5, n); /* garbage, as cudaMalloc's memory is */
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFreeAsync(void *p, cudaStream_t st) {
    free(p); /* freed even on the wrong stream: the error is reported, nothing leaks */
    return lk_emu_check_stream(st);
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t st) {
    if (cudaError_t e = lk_emu_check_stream(st)) return e;
    return memcpy(d, s, n), cudaSuccess;
}
static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st) {
    if (cudaError_t e = lk_emu_check_stream(st)) return e;
    return memset(p, v, n), cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t st) { return lk_emu_check_stream(st); }

#endif

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

/* kernel<<<grid, block, shared_bytes, stream>>>(args) becomes
 * lk_emu_launch(grid, block, shared_bytes, stream, kernel, args)
 * (cu2cpp.py). Only the four-argument form exists: a launch on the
 * implicit legacy stream does not compile, one on another stream than the
 * compute stream's token is a launch error (cudaGetLastError). */
/* A block's threads are a pool of host threads kept from launch to launch
 * (remade when the block size changes): making 32 threads per block per
 * launch cost the fake GPU's fits most of their time. The blocks run one
 * after another; the pool's threads wait at the block barrier between two,
 * so a block's static __shared__ arrays are never shared with the next.
 * Never destroyed: its threads wait at a barrier until the process ends. */
struct lk_emu_pool_t {
    unsigned n = 0;
    std::vector<std::thread> *ts = nullptr;
    pthread_barrier_t start, done; /* n + 1: the pool and the launcher */
    const std::function<void()> *f = nullptr;
    unsigned blocks = 0;
    bool quit = false;
};
static lk_emu_pool_t *lk_emu_pool;
static std::mutex lk_emu_pool_mu;

static inline void lk_emu_worker(lk_emu_pool_t *p, unsigned t) {
    for (;;) {
        pthread_barrier_wait(&p->start);
        if (p->quit) return;
        for (unsigned b = 0; b < p->blocks; b++) {
            blockIdx.x = b, threadIdx.x = t;
            (*p->f)();
            pthread_barrier_wait(&lk_emu_barrier);
        }
        pthread_barrier_wait(&p->done);
    }
}

static inline void lk_emu_run_blocks(dim3 grid, dim3 block, const std::function<void()> &f) {
    std::lock_guard<std::mutex> l(lk_emu_pool_mu);
    lk_emu_pool_t *p = lk_emu_pool;
    if (p && p->n != block.x) { /* another block size: the old pool ends */
        p->quit = true;
        pthread_barrier_wait(&p->start);
        for (auto &t : *p->ts) t.join();
        pthread_barrier_destroy(&p->start), pthread_barrier_destroy(&p->done);
        pthread_barrier_destroy(&lk_emu_barrier);
        delete p->ts;
        delete p;
        p = lk_emu_pool = nullptr;
    }
    if (!p) {
        p = lk_emu_pool = new lk_emu_pool_t;
        p->n = block.x;
        pthread_barrier_init(&p->start, NULL, block.x + 1);
        pthread_barrier_init(&p->done, NULL, block.x + 1);
        pthread_barrier_init(&lk_emu_barrier, NULL, block.x);
        p->ts = new std::vector<std::thread>;
        for (unsigned t = 0; t < block.x; t++) p->ts->emplace_back(lk_emu_worker, p, t);
    }
    gridDim = grid, blockDim = block;
    p->f = &f, p->blocks = grid.x;
    pthread_barrier_wait(&p->start);
    pthread_barrier_wait(&p->done);
}
/* The launch's arguments are copied here, at the launch, as the GPU's
 * launch copies them: a kernel that runs later (on the fake GPU) sees the
 * values they had then, not whatever the launcher's variables hold by the
 * time it runs. */
template <class K, class... A>
static inline std::function<void()> lk_emu_bind(K *kernel, A... args) {
    auto t = std::make_tuple(args...);
    return [kernel, t] { std::apply(kernel, t); };
}
#ifdef LK_FAKE_GPU
/* Queued (the fake runtime keeps the launch error as its last error). */
template <class K, class... A>
static inline void lk_emu_launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t st, K *kernel, A... args) {
    (void)shared_bytes;
    std::function<void()> f = lk_emu_bind(kernel, args...);
    lk_fake_enqueue(st, "kernel", [grid, block, f] { lk_emu_run_blocks(grid, block, f); });
}
#else
template <class K, class... A>
static inline void lk_emu_launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t st, K *kernel, A... args) {
    (void)shared_bytes; /* the kernels' __shared__ arrays are static here */
    if (cudaError_t e = lk_emu_check_stream(st)) {
        lk_emu_last_error = e;
        return;
    }
    lk_emu_run_blocks(grid, block, lk_emu_bind(kernel, args...));
}
#endif

#endif

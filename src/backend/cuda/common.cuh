/* Device-side helpers shared by the CUDA kernel files: loading and storing
 * an f32, bf16 or f16 element as f32 with exactly the CPU's conversions
 * (lockstep/dtype.h: round to nearest even, NaN kept quiet), the launch
 * geometry of the grid-stride loops, and stream-ordered scratch memory.
 * The .cu files are compiled with --fmad=false: the CPU reference is ISO C
 * without contraction, and a fused multiply-add rounds once where it rounds
 * twice, so an f32 kernel would differ from it in the last bit. */
#ifndef LK_BACKEND_CUDA_COMMON_CUH
#define LK_BACKEND_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_impl.h"
#include "backend/kernels.h"

/* Threads per block and the most blocks of a grid-stride launch; the host
 * emulation of tests/gpu/emu/ builds these files with fewer of both
 * (results must not depend on either). */
#ifndef LK_CU_THREADS
#define LK_CU_THREADS 256
#endif
#ifndef LK_CU_MAX_BLOCKS
#define LK_CU_MAX_BLOCKS (1 << 20)
#endif

/* Blocks for n items in a grid-stride loop: enough to fill any GPU, capped
 * so the grid size stays in range; 1 for n == 0 (the kernel does nothing). */
static inline unsigned lk_cu_blocks(int64_t n) {
    int64_t b = (n + LK_CU_THREADS - 1) / LK_CU_THREADS;
    return b < 1 ? 1u : b > LK_CU_MAX_BLOCKS ? (unsigned)LK_CU_MAX_BLOCKS : (unsigned)b;
}

#define LK_CU_FOR(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

__device__ static inline float lk_cu_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ static inline uint16_t lk_cu_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

__device__ static inline float lk_cu_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0) {
        float f = (float)mant * 0x1p-24f;
        return sign ? -f : f;
    }
    if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
    else x = sign | ((exp + 112u) << 23) | (mant << 13);
    return __uint_as_float(x);
}

__device__ static inline uint16_t lk_cu_f32_to_f16(float f) {
    uint32_t x = __float_as_uint(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
    if (x < 0x38800000u) return (uint16_t)(sign | (uint16_t)rintf(__uint_as_float(x) * 0x1p24f));
    x += 0xc8000fffu + ((x >> 13) & 1u);
    return (uint16_t)(sign | (uint16_t)(x >> 13));
}

/* Element i of an operand of dtype dt (f32, bf16 or f16) as f32, and back. */
__device__ static inline float lk_cu_ld(const void *p, int dt, int64_t i) {
    if (dt == LK_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == LK_BF16 ? lk_cu_bf16_to_f32(h) : lk_cu_f16_to_f32(h);
}

__device__ static inline void lk_cu_st(void *p, int dt, int64_t i, float v) {
    if (dt == LK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = dt == LK_BF16 ? lk_cu_f32_to_bf16(v) : lk_cu_f32_to_f16(v);
}

/* An integer target or index of dtype i32 or i64. */
__device__ static inline int64_t lk_cu_index(const void *p, int dt, int64_t i) {
    return dt == LK_I64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* Whether a kernel can write p: device (or managed) memory. The reductions'
 * outputs (norm, first non-finite, unscale's count) are host memory by
 * contract for callers that read them at once, or device memory for those
 * that batch their reads (the trainer's step-status slots). */
static inline bool lk_cu_on_device(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* The stream every launch, scratch allocation and copy of the kernel files
 * goes on: the current device's compute stream (device/cuda.c; made by
 * backend.c's run before any launcher runs). Never the legacy stream 0,
 * which a CUDA graph cannot capture. The host emulation (tests/gpu/emu/)
 * supplies its own token. */
#ifndef LK_CU_EMU
extern "C" cudaStream_t lk__cuda_stream_current(void);
static inline cudaStream_t lk_cu_stream(void) { return lk__cuda_stream_current(); }
#endif
/* Each launcher's first statement: no compute stream (it could not be
 * made; backend.c's run made it already, so this does not happen through
 * the backend) fails the op instead of letting its launches go to the
 * NULL stream, which is the legacy stream. */
#define LK_CU_REQUIRE_STREAM()                                                                                        \
    do {                                                                                                               \
        if (!lk_cu_stream()) return (int)cudaErrorInvalidResourceHandle;                                               \
    } while (0)

/* Stream-ordered scratch on the compute stream (no device-wide
 * synchronisation, unlike cudaMalloc/cudaFree, and capturable into a graph
 * as its allocation and free nodes); freed the same way once the kernels
 * that use it are queued. */
static inline cudaError_t lk_cu_scratch(void **p, size_t bytes) {
    return cudaMallocAsync(p, bytes ? bytes : 1, lk_cu_stream());
}
static inline void lk_cu_scratch_free(void *p) {
    if (p) cudaFreeAsync(p, lk_cu_stream());
}

#endif

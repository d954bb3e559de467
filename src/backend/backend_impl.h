/* Private: the per-device backend vtable. The autograd ops do shape logic and
 * call these for the math; the CPU backend (cpu.c) is the reference every
 * other backend is tested against. One comment per method. */
#ifndef LK_BACKEND_IMPL_H
#define LK_BACKEND_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/kernels.h"
#include "lockstep/tensor.h"

typedef struct lk_backend {
    const char *name;
    lk_device_kind kind;
    /* C[M,N] = alpha * op(A)[M,K] op(B)[K,N] + beta * C, row-major f32;
     * op(X) = X^T when the flag is set; leading dimensions in elements. */
    void (*gemm)(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
    /* y[i] = f(x[i]) for n contiguous elements. */
    void (*unary)(lk_unary_op op, int64_t n, const float *x, float *y, float alpha);
    /* dx[i] = dy[i] * f'(x[i]) (y = f(x) given for ops that use it); accumulate when `acc`. */
    void (*unary_backward)(lk_unary_op op, int64_t n, const float *x, const float *y, const float *dy, float *dx,
                           float alpha, bool acc);
    /* out = a (op) b over out's shape; a and b carry strides in elements,
     * 0 on broadcast dimensions; out is contiguous. */
    void (*binary)(lk_binary_op op, int ndim, const int64_t *shape, const float *a, const int64_t *sa, const float *b,
                   const int64_t *sb, float *out);
    /* y += x (n contiguous elements), scaled: y = y + alpha * x. */
    void (*axpy)(int64_t n, float alpha, const float *x, float *y);
} lk_backend;

const lk_backend *lk__backend(lk_device dev);

/* Intra-op parallelism over independent items (the samples of a
 * convolution), for when one process owns several cores. BLAS's own
 * threading splits each GEMM, which for the many small per-sample GEMMs of a
 * convolution costs more in wake-ups than it gains; giving each core whole
 * samples and single-threaded GEMMs does not.
 * lk__parallel_width: how many tasks to cut `items` into (1 when this
 * process has one compute thread, as under DP's replicas or one rank per
 * core). lk__parallel_run: fn(ctx, t) for t in [0, width), task 0 on the
 * calling thread and the others on a parked pool (parallel.c). A task must
 * not record autograd nodes, and a task that fails must hand its message
 * back itself (the last error is per thread); tasks the pool cannot take run
 * on the caller, so results depend on the width, never on how many threads
 * ran it. */
int lk__parallel_width(int64_t items);
/* Task t's share [*begin, *end) of n items cut `width` ways; cuts fall on
 * multiples of `align` (a power of two; 16 keeps vector loops whole). */
static inline void lk__task_range(int64_t n, int t, int width, int64_t align, int64_t *begin, int64_t *end) {
    *begin = (n * t / width) & ~(align - 1);
    *end = t + 1 == width ? n : (n * (t + 1) / width) & ~(align - 1);
}
void lk__parallel_run(int width, void (*fn)(void *ctx, int task), void *ctx);
extern const lk_backend lk__cpu_backend;

#endif

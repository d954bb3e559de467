/* A second backend for the tests, registered for the debug device: plain
 * scalar reference loops (no BLAS, no threads, no vectorisation tricks) for
 * the f32 GEMM and the element-wise and reduction families, counting every
 * descriptor it runs per op kind. Every other descriptor (bf16/f16 operands,
 * anything it does not list) is left to the registry's fallback, which runs
 * it on the CPU backend because the debug device is host-addressable: so the
 * tests see both paths. Proof that a new backend is a new file that fills
 * lk_backend and registers it for its device kind; nothing in the library
 * knows this one.
 *
 * The loops compute each element with the same single operation and the same
 * kernel bodies (kernels.h) as the CPU backend, so element-wise results are
 * bitwise equal; the GEMM sums K products in plain order where OpenBLAS
 * blocks and vectorises, and sum-to-shape adds each element straight into
 * its destination, so those two may differ in the last bits. */
#ifndef LK_TEST_DEBUG_BACKEND_H
#define LK_TEST_DEBUG_BACKEND_H

#include "backend/backend_impl.h"
#include "debug_device.h"

static long dbg_ran[LK_OP_COUNT]; /* descriptors run, per op kind (all threads) */

static inline long dbg_backend_ran(lk_op_kind op) { return __atomic_load_n(&dbg_ran[op], __ATOMIC_RELAXED); }
static inline long dbg_backend_ran_total(void) {
    long s = 0;
    for (int i = 0; i < LK_OP_COUNT; i++) s += dbg_backend_ran((lk_op_kind)i);
    return s;
}

static bool dbg_be_supports(const lk_op_desc *d) {
    int n = lk__op_arity(d->op);
    for (int i = 0; i < n; i++)
        if (d->dtype[i] != LK_F32) return false;
    switch (d->op) {
    case LK_OP_GEMM:
    case LK_OP_UNARY:
    case LK_OP_UNARY_BACKWARD:
    case LK_OP_BINARY:
    case LK_OP_AXPY:
    case LK_OP_AFFINE:
    case LK_OP_SUM_TO: return true;
    default: return false;
    }
}

static void dbg_gemm(const lk_gemm_params *g, const float *A, const float *B, float *C) {
    for (int64_t i = 0; i < g->M; i++)
        for (int64_t j = 0; j < g->N; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < g->K; k++) {
                float a = g->trans_a ? A[k * g->lda + i] : A[i * g->lda + k];
                float b = g->trans_b ? B[j * g->ldb + k] : B[k * g->ldb + j];
                s += a * b;
            }
            float *c = &C[i * g->ldc + j];
            /* beta == 0 overwrites (C may hold NaN poison), as BLAS does */
            *c = g->beta == 0.0f ? g->alpha * s : g->alpha * s + g->beta * *c;
        }
}

/* The offset of output element i (row-major over shape) under strides st. */
static int64_t dbg_offset(int ndim, const int64_t *shape, const int64_t *st, int64_t i) {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        off += (i % shape[d]) * st[d];
        i /= shape[d];
    }
    return off;
}

static lk_status dbg_be_run(const lk_op_desc *d, void *const *x) {
    lk_op_desc tmp; /* per-step values from `live` (host memory here), as the CPU backend reads them */
    d = lk__op_live_apply(d, &tmp);
    __atomic_fetch_add(&dbg_ran[d->op], 1, __ATOMIC_RELAXED);
    switch (d->op) {
    case LK_OP_GEMM: dbg_gemm(&d->gemm, x[0], x[1], x[2]); break;
    case LK_OP_UNARY: {
        const float *in = x[0];
        float *out = x[1];
        for (int64_t i = 0; i < d->unary.n; i++) out[i] = lk_k_unary(d->unary.fn, in[i], d->unary.alpha);
        break;
    }
    case LK_OP_UNARY_BACKWARD: {
        const float *in = x[0], *y = x[1], *dy = x[2];
        float *dx = x[3];
        for (int64_t i = 0; i < d->unary.n; i++) {
            /* relu selects dy (dy * 0 would give -0 or NaN where the CPU gives 0) */
            float g = d->unary.fn == LK_UNARY_RELU
                          ? (in[i] > 0.0f ? dy[i] : 0.0f)
                          : dy[i] * lk_k_unary_grad(d->unary.fn, in ? in[i] : 0.0f, y ? y[i] : 0.0f, d->unary.alpha);
            dx[i] = d->unary.acc ? dx[i] + g : g;
        }
        break;
    }
    case LK_OP_BINARY: {
        const lk_binary_params *b = &d->binary;
        const float *pa = x[0], *pb = x[1];
        float *out = x[2];
        int64_t n = 1;
        for (int k = 0; k < b->ndim; k++) n *= b->shape[k];
        for (int64_t i = 0; i < n; i++)
            out[i] = lk_k_binary(b->fn, pa[dbg_offset(b->ndim, b->shape, b->sa, i)],
                                 pb[dbg_offset(b->ndim, b->shape, b->sb, i)]);
        break;
    }
    case LK_OP_AXPY: {
        const float *in = x[0];
        float *y = x[1];
        for (int64_t i = 0; i < d->axpy.n; i++) y[i] += d->axpy.alpha * in[i];
        break;
    }
    case LK_OP_AFFINE: {
        const float *in = x[0];
        float *y = x[1];
        for (int64_t i = 0; i < d->affine.n; i++)
            y[i] = d->affine.has_add ? in[i] * d->affine.mul + d->affine.add : in[i] * d->affine.mul;
        break;
    }
    case LK_OP_SUM_TO: {
        const lk_sum_to_params *p = &d->sum_to;
        const float *src = x[0];
        float *dst = x[1];
        int64_t n = 1;
        for (int k = 0; k < p->ndim; k++) n *= p->shape[k];
        for (int64_t i = 0; i < n; i++) dst[dbg_offset(p->ndim, p->shape, p->sd, i)] += src[i];
        break;
    }
    default: return lk_error(LK_STATUS_INTERNAL, "debug backend: op %d", (int)d->op);
    }
    return LK_STATUS_OK;
}

static const lk_backend dbg_backend = {.name = "debug", .supports = dbg_be_supports, .run = dbg_be_run};

/* Registers the debug device (dbg_device) and this backend for its kind;
 * returns the device. */
static inline lk_device dbg_backend_device(void) {
    lk_device dev = dbg_device();
    if (lk__backend_register(dev.kind, &dbg_backend)) {
        fprintf(stderr, "debug backend: %s\n", lk_last_error());
        abort();
    }
    return dev;
}

#endif

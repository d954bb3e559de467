/* The CPU backend: the reference. GEMM goes to OpenBLAS with transpose flags
 * (no copies for transposed views); element-wise loops are written so the
 * compiler vectorises them, using the kernel bodies in kernels.h. */
#include <cblas.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"

static void sgemm1(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* A GEMM cut across the compute threads (BLAS itself runs single-threaded,
 * see parallel.c): by output columns when there are enough of them, else by
 * rows; cuts on 16-element boundaries. Each output element is computed by
 * one thread, so the result is bitwise repeatable for a given thread count
 * (BLAS's blocking over K can follow the cut's shape, so another thread count
 * may differ in the last bits). */
typedef struct {
    bool ta, tb, by_cols;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int width;
} gemm_job;

static void gemm_task(void *ctx, int t) {
    const gemm_job *j = ctx;
    int64_t len = j->by_cols ? j->N : j->M;
    int64_t a, b;
    lk__task_range(len, t, j->width, 16, &a, &b);
    if (b <= a) return;
    if (j->by_cols)
        sgemm1(j->ta, j->tb, j->M, b - a, j->K, j->alpha, j->A, j->lda, j->tb ? j->B + a * j->ldb : j->B + a, j->ldb,
               j->beta, j->C + a, j->ldc);
    else
        sgemm1(j->ta, j->tb, b - a, j->N, j->K, j->alpha, j->ta ? j->A + a : j->A + a * j->lda, j->lda, j->B, j->ldb,
               j->beta, j->C + a * j->ldc, j->ldc);
}

#define GEMM_SPLIT_FLOPS (4.0 * 1024 * 1024) /* below ~30 us of one core, a second one does not pay */

static void cpu_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                     const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) { /* BLAS leaves C alone for K == 0 only when beta == 1 */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    int width = 2.0 * (double)M * (double)N * (double)K >= GEMM_SPLIT_FLOPS ? lk__parallel_width(INT64_MAX) : 1;
    bool by_cols = N >= 32 * width || N >= M;
    int64_t parts = (by_cols ? N : M) / 16;
    if (width > parts) width = parts > 1 ? (int)parts : 1;
    if (width <= 1) {
        sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    gemm_job job = {ta, tb, by_cols, M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, width};
    lk__parallel_run(width, gemm_task, &job);
}

static void cpu_unary(lk_unary_op op, int64_t n, const float *restrict x, float *restrict y, float alpha) {
    switch (op) { /* the hot ones get loops of their own, so they vectorise */
    case LK_UNARY_RELU:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        return;
    case LK_UNARY_NEG:
        for (int64_t i = 0; i < n; i++) y[i] = -x[i];
        return;
    default:
        for (int64_t i = 0; i < n; i++) y[i] = lk_k_unary(op, x[i], alpha);
    }
}

static void cpu_unary_backward(lk_unary_op op, int64_t n, const float *restrict x, const float *restrict y,
                               const float *restrict dy, float *restrict dx, float alpha, bool acc) {
    if (op == LK_UNARY_RELU) {
        if (acc)
            for (int64_t i = 0; i < n; i++) dx[i] += x[i] > 0.0f ? dy[i] : 0.0f;
        else
            for (int64_t i = 0; i < n; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float g = dy[i] * lk_k_unary_grad(op, x ? x[i] : 0.0f, y ? y[i] : 0.0f, alpha);
        dx[i] = acc ? dx[i] + g : g;
    }
}

/* Walks out's shape; the innermost dimension runs as a flat loop with the
 * inputs' own strides (1 or 0 in the common cases, which vectorise). */
static void cpu_binary(lk_binary_op op, int ndim, const int64_t *shape, const float *a, const int64_t *sa,
                       const float *b, const int64_t *sb, float *out) {
    if (ndim == 0) {
        out[0] = lk_k_binary(op, a[0], b[0]);
        return;
    }
    int64_t inner = shape[ndim - 1], ia = sa[ndim - 1], ib = sb[ndim - 1];
    int64_t outer = 1;
    for (int d = 0; d < ndim - 1; d++) outer *= shape[d];
    int64_t idx[LK_MAX_DIMS] = {0};
    int64_t oa = 0, ob = 0;
    for (int64_t o = 0; o < outer; o++) {
        const float *pa = a + oa, *pb = b + ob;
        float *po = out + o * inner;
        if (ia == 1 && ib == 1) {
            switch (op) {
            case LK_BINARY_ADD: for (int64_t i = 0; i < inner; i++) po[i] = pa[i] + pb[i]; break;
            case LK_BINARY_SUB: for (int64_t i = 0; i < inner; i++) po[i] = pa[i] - pb[i]; break;
            case LK_BINARY_MUL: for (int64_t i = 0; i < inner; i++) po[i] = pa[i] * pb[i]; break;
            case LK_BINARY_DIV: for (int64_t i = 0; i < inner; i++) po[i] = pa[i] / pb[i]; break;
            }
        } else {
            for (int64_t i = 0; i < inner; i++) po[i] = lk_k_binary(op, pa[i * ia], pb[i * ib]);
        }
        /* advance the outer multi-index */
        for (int d = ndim - 2; d >= 0; d--) {
            idx[d]++;
            oa += sa[d];
            ob += sb[d];
            if (idx[d] < shape[d]) break;
            oa -= sa[d] * shape[d];
            ob -= sb[d] * shape[d];
            idx[d] = 0;
        }
    }
}

static void cpu_axpy(int64_t n, float alpha, const float *restrict x, float *restrict y) {
    if (alpha == 1.0f)
        for (int64_t i = 0; i < n; i++) y[i] += x[i];
    else
        for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

static bool is_half(lk_dtype t) { return t == LK_BF16 || t == LK_F16; }

static bool cpu_supports(const lk_op_desc *d) {
    switch (d->op) {
    case LK_OP_GEMM: {
        lk_dtype a = d->dtype[0], b = d->dtype[1], c = d->dtype[2];
        if (a == LK_F32) return b == LK_F32 && c == LK_F32;
        return is_half(a) && b == a && (c == LK_F32 || c == a);
    }
    case LK_OP_COUNT: break;
    }
    return false;
}

static lk_status cpu_run(const lk_op_desc *d, void *const *x) {
    switch (d->op) {
    case LK_OP_GEMM: {
        const lk_gemm_params *g = &d->gemm;
        if (d->dtype[0] != LK_F32) return lk__cpu_gemm_lowp(d, x[0], x[1], x[2]);
        cpu_gemm(g->trans_a, g->trans_b, g->M, g->N, g->K, g->alpha, x[0], g->lda, x[1], g->ldb, g->beta, x[2], g->ldc);
        return LK_STATUS_OK;
    }
    case LK_OP_COUNT: break;
    }
    return lk_error(LK_STATUS_INTERNAL, "cpu backend: op %d", (int)d->op);
}

const lk_backend lk__cpu_backend = {
    .name = "cpu",
    .kind = LK_CPU,
    .supports = cpu_supports,
    .run = cpu_run,
    .unary = cpu_unary,
    .unary_backward = cpu_unary_backward,
    .binary = cpu_binary,
    .axpy = cpu_axpy,
};

const lk_backend *lk__backend(lk_device dev) {
    (void)dev; /* host-addressable devices run on the CPU backend; the CUDA backend registers here when built */
    return &lk__cpu_backend;
}

const char *lk__op_desc_str(const lk_op_desc *d, char *buf, size_t size) {
    switch (d->op) {
    case LK_OP_GEMM:
        snprintf(buf, size, "gemm %s x %s -> %s (%c%c, %lldx%lldx%lld)", lk_dtype_name(d->dtype[0]),
                 lk_dtype_name(d->dtype[1]), lk_dtype_name(d->dtype[2]), d->gemm.trans_a ? 'T' : 'N',
                 d->gemm.trans_b ? 'T' : 'N', (long long)d->gemm.M, (long long)d->gemm.N, (long long)d->gemm.K);
        return buf;
    case LK_OP_COUNT: break;
    }
    snprintf(buf, size, "op %d", (int)d->op);
    return buf;
}

lk_status lk__backend_run(lk_device dev, const lk_op_desc *d, void *const *operands) {
    const lk_backend *be = lk__backend(dev);
    if (!be->supports(d)) {
        char what[128];
        return lk_error(LK_STATUS_UNSUPPORTED, "the %s backend has no %s", be->name, lk__op_desc_str(d, what, sizeof what));
    }
    return be->run(d, operands);
}

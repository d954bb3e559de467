/* The CUDA backend's bf16/f16 path for the families whose kernels are f32
 * only — pooling and its adjoint, layer and batch norm and their backward,
 * SyncBatchNorm's passes (BN_STATS, BN_APPLY), embedding's scatter-add, the
 * convolution's bias add and bias gradient — with the CPU backend's
 * semantics (src/backend/cpu/widen.c): every 16-bit operand is widened into
 * f32 scratch (exact), the f32 launcher runs on an all-f32 copy of the
 * descriptor (the same kernels/ bodies as the CPU), and the operands the op
 * writes are rounded back once. Written operands are widened too, since
 * some accumulate (col2im-style +=, dw/db of layer norm, the bias
 * gradient). f32 operands are passed in place. The CPU runs the same
 * arithmetic in chunks of planes, channels or rows; chunking never changes
 * a value (they are independent), so the bits are the CPU's. The scratch is
 * stream-ordered (one cudaMallocAsync per op): correctness first, the
 * conversion kernels are cheap next to the op (docs/GPU.md). */
#include "backend/cuda/common.cuh"

namespace {

__global__ void k_widen(int64_t n, const void *h, int dt, int64_t stride, float *f) {
    LK_CU_FOR(k, n) f[k] = lk_cu_ld(h, dt, k * stride);
}

__global__ void k_narrow(int64_t n, const float *f, void *h, int dt, int64_t stride) {
    LK_CU_FOR(k, n) lk_cu_st(h, dt, k * stride, f[k]);
}

bool is_half(lk_dtype t) { return t == LK_BF16 || t == LK_F16; }

/* Operand i of d: its element count, its element stride (batch norm's
 * strided per-channel vectors) and whether the op writes it; false for an
 * op this file does not widen. The counts are widen.c's. */
bool operand_shape(const lk_op_desc *d, int i, int64_t *count, int64_t *stride, bool *written) {
    *stride = 1;
    *written = false;
    switch (d->op) {
    case LK_OP_POOL2D: { /* x, y, idx */
        const lk_pool_params *g = &d->pool;
        *count = i == 0 ? (int64_t)g->planes * g->H * g->W : (int64_t)g->planes * g->OH * g->OW;
        *written = i >= 1;
        return true;
    }
    case LK_OP_POOL2D_BACKWARD: { /* dy, idx, dx */
        const lk_pool_params *g = &d->pool;
        *count = i == 2 ? (int64_t)g->planes * g->H * g->W : (int64_t)g->planes * g->OH * g->OW;
        *written = i == 2;
        return true;
    }
    case LK_OP_BATCH_NORM: { /* x, w, b, running_mean, running_var, y, stats */
        const lk_batch_norm_params *p = &d->batch_norm;
        int64_t ncs = (int64_t)p->N * p->C * p->S;
        *count = i == 0 || i == 5 ? ncs : i == 6 ? 2 * (int64_t)p->C : p->C;
        if (i >= 1 && i <= 4) *stride = p->stride[i - 1];
        *written = i >= 3;
        return true;
    }
    case LK_OP_BATCH_NORM_BACKWARD: { /* x, dy, stats, w, dx, dw, db */
        const lk_batch_norm_params *p = &d->batch_norm;
        int64_t ncs = (int64_t)p->N * p->C * p->S;
        *count = i <= 1 || i == 4 ? ncs : i == 2 ? 2 * (int64_t)p->C : p->C;
        *written = i >= 4;
        return true;
    }
    case LK_OP_LAYER_NORM: { /* x, w, b, y, stats */
        const lk_layer_norm_params *p = &d->layer_norm;
        *count = i == 0 || i == 3 ? p->M * p->L : i == 4 ? 2 * p->M : p->L;
        *written = i >= 3;
        return true;
    }
    case LK_OP_LAYER_NORM_BACKWARD: { /* x, dy, stats, w, dx, dw, db */
        const lk_layer_norm_params *p = &d->layer_norm;
        *count = i <= 1 || i == 4 ? p->M * p->L : i == 2 ? 2 * p->M : p->L;
        *written = i >= 4;
        return true;
    }
    case LK_OP_BN_STATS: /* x, g, mean [C], out (f64) */
    case LK_OP_BN_APPLY: { /* x, g, coef [2C] or [4C], y */
        const lk_bn_split_params *p = &d->bn_split;
        int64_t ncs = (int64_t)p->N * p->C * p->S;
        bool apply = d->op == LK_OP_BN_APPLY;
        *count = i <= 1 || (apply && i == 3) ? ncs : !apply ? p->C : (p->backward ? 4 : 2) * (int64_t)p->C;
        *written = i == 3;
        return true;
    }
    case LK_OP_EMBEDDING_BACKWARD: { /* g [n, D], idx, dw [V, D] */
        const lk_embedding_params *p = &d->embedding;
        *count = i == 0 ? p->n * p->D : i == 2 ? p->V * p->D : p->n;
        *written = i == 2;
        return true;
    }
    case LK_OP_BIAS_ADD: /* y [O, samples*P] (f32), b [O], out [samples, O, P] */
    case LK_OP_CHANNEL_SUM: { /* dy [samples, O, P], db [O] (f32) */
        const lk_bias_params *p = &d->bias;
        int64_t big = (int64_t)p->samples * p->O * p->P;
        bool sum = d->op == LK_OP_CHANNEL_SUM;
        *count = sum ? (i == 0 ? big : p->O) : i == 1 ? p->O : big;
        *written = sum ? i == 1 : i == 2;
        return true;
    }
    default: return false;
    }
}

} // namespace

extern "C" bool lk__cuda_has_half(const lk_op_desc *d) {
    for (int i = 0; i < lk__op_arity(d->op); i++)
        if (is_half(d->dtype[i])) return true;
    return false;
}

extern "C" int lk__cuda_widened(const lk_op_desc *d, void *const *x, lk__cuda_launcher run) {
    int n = lk__op_arity(d->op);
    lk_op_desc f = *d;
    void *ops[LK_OP_MAX_OPERANDS] = {NULL};
    float *buf[LK_OP_MAX_OPERANDS] = {NULL};
    int64_t count[LK_OP_MAX_OPERANDS] = {0}, stride[LK_OP_MAX_OPERANDS] = {0};
    bool written[LK_OP_MAX_OPERANDS] = {false};
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        ops[i] = x[i];
        if (!is_half(d->dtype[i])) continue;
        f.dtype[i] = LK_F32;
        if (!x[i]) continue;
        if (!operand_shape(d, i, &count[i], &stride[i], &written[i])) return (int)cudaErrorInvalidValue;
        if (count[i] < 0) count[i] = 0;
        total += (size_t)count[i];
    }
    float *base = NULL;
    cudaError_t e = lk_cu_scratch((void **)&base, total * sizeof(float));
    if (e != cudaSuccess) return (int)e;
    size_t at = 0;
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        if (!is_half(d->dtype[i]) || !x[i]) continue;
        buf[i] = base + at;
        at += (size_t)count[i];
        ops[i] = buf[i];
        if (d->op == LK_OP_BATCH_NORM && i >= 1 && i <= 4) f.batch_norm.stride[i - 1] = 1;
        if (count[i] > 0) {
            k_widen<<<lk_cu_blocks(count[i]), LK_CU_THREADS>>>(count[i], x[i], (int)d->dtype[i], stride[i], buf[i]);
            e = cudaGetLastError();
        }
    }
    if (e == cudaSuccess) e = (cudaError_t)run(&f, ops);
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        if (!buf[i] || !written[i] || count[i] <= 0) continue;
        k_narrow<<<lk_cu_blocks(count[i]), LK_CU_THREADS>>>(count[i], buf[i], x[i], (int)d->dtype[i], stride[i]);
        e = cudaGetLastError();
    }
    lk_cu_scratch_free(base);
    return (int)e;
}

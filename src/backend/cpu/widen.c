/* The CPU backend's bf16/f16 path for the op families whose kernels are f32
 * only (pooling, layer and batch norm, SyncBatchNorm's passes, embedding's
 * scatter-add): every 16-bit operand is widened into an f32 scratch array
 * (exact), the f32 kernel runs on an all-f32 copy of the descriptor, and the
 * operands the op writes are rounded back once. So a 16-bit activation is
 * normalised or pooled with f32 statistics and sums, exactly as the f32 op
 * would on the widened values, and its result is rounded once, which is
 * what torch's CPU kernels do for bf16 (they accumulate in float).
 * Pooling goes through it in chunks of planes (pool.c), so the scratch stays
 * small; the norms widen whole tensors (their statistics span the batch).
 * The scratch lives only for the call: what an op keeps for backward stays
 * in its own 16-bit dtype. */
#include <string.h>

#include "backend/cpu/cpu_impl.h"

static bool is_half(lk_dtype t) { return t == LK_BF16 || t == LK_F16; }

/* Operand i of d: its element count, the stride of its elements (1 unless
 * batch norm's per-channel vectors are strided) and whether the op writes it.
 * Returns false for an op this file does not widen. */
static bool operand_shape(const lk_op_desc *d, int i, int64_t *count, int64_t *stride, bool *written) {
    *stride = 1;
    *written = false;
    switch (d->op) {
    case LK_OP_POOL2D: {
        const lk_pool_params *g = &d->pool;
        *count = i == 0 ? g->planes * g->H * g->W : g->planes * g->OH * g->OW;
        *written = i >= 1;
        return true;
    }
    case LK_OP_POOL2D_BACKWARD: {
        const lk_pool_params *g = &d->pool;
        *count = i == 2 ? g->planes * g->H * g->W : g->planes * g->OH * g->OW;
        *written = i == 2;
        return true;
    }
    case LK_OP_BATCH_NORM: { /* x, w, b, running_mean, running_var, y, stats */
        const lk_batch_norm_params *p = &d->batch_norm;
        int64_t ncs = (int64_t)p->N * p->C * p->S;
        *count = i == 0 || i == 5 ? ncs : i == 6 ? 2 * p->C : p->C;
        if (i >= 1 && i <= 4) *stride = p->stride[i - 1];
        *written = i >= 3;
        return true;
    }
    case LK_OP_BATCH_NORM_BACKWARD: { /* x, dy, stats, w, dx, dw, db */
        const lk_batch_norm_params *p = &d->batch_norm;
        int64_t ncs = (int64_t)p->N * p->C * p->S;
        *count = i <= 1 || i == 4 ? ncs : i == 2 ? 2 * p->C : p->C;
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
    case LK_OP_BN_STATS: /* x, g, mean, out (f64) */
    case LK_OP_BN_APPLY: { /* x, g, coef, y */
        const lk_bn_split_params *p = &d->bn_split;
        int64_t ncs = (int64_t)p->N * p->C * p->S;
        *count = i <= 1 || (d->op == LK_OP_BN_APPLY && i == 3) ? ncs : (i == 2 ? 4 : 2) * p->C;
        *written = i == 3;
        return true;
    }
    case LK_OP_EMBEDDING_BACKWARD: { /* g [n, D], idx, dw [V, D] */
        const lk_embedding_params *p = &d->embedding;
        *count = i == 0 ? p->n * p->D : i == 2 ? p->V * p->D : p->n;
        *written = i == 2;
        return true;
    }
    default: return false;
    }
}

bool lk__cpu_has_half(const lk_op_desc *d) {
    for (int i = 0; i < lk__op_arity(d->op); i++)
        if (is_half(d->dtype[i])) return true;
    return false;
}

lk_op_desc lk__cpu_widened_desc(const lk_op_desc *d) {
    lk_op_desc f = *d;
    for (int i = 0; i < lk__op_arity(d->op); i++)
        if (is_half(f.dtype[i])) f.dtype[i] = LK_F32;
    return f;
}

lk_status lk__cpu_run_widened(const lk_op_desc *d, void *const *x,
                              lk_status (*run)(const lk_op_desc *d, void *const *x)) {
    int n = lk__op_arity(d->op);
    lk_op_desc f = lk__cpu_widened_desc(d);
    void *ops[LK_OP_MAX_OPERANDS];
    float *buf[LK_OP_MAX_OPERANDS] = {0};
    lk_status st = LK_STATUS_OK;
    for (int i = 0; i < n; i++) {
        ops[i] = x[i];
        if (!is_half(d->dtype[i]) || !x[i]) continue;
        int64_t count, stride;
        bool written;
        if (!operand_shape(d, i, &count, &stride, &written)) {
            st = lk_error(LK_STATUS_INTERNAL, "cpu backend: op %d has no 16-bit path", (int)d->op);
            goto done;
        }
        if (!(buf[i] = lk_malloc((size_t)(count > 0 ? count : 1) * sizeof(float)))) {
            st = LK_STATUS_OUT_OF_MEMORY;
            goto done;
        }
        /* written operands are widened too: some accumulate (+=) into them */
        const uint16_t *h = x[i];
        if (stride == 1) lk_half_to_f32_n(d->dtype[i], buf[i], h, (size_t)count);
        else
            for (int64_t k = 0; k < count; k++)
                buf[i][k] = d->dtype[i] == LK_BF16 ? lk_bf16_bits_to_f32(h[k * stride]) : lk_f16_bits_to_f32(h[k * stride]);
        ops[i] = buf[i];
        if (d->op == LK_OP_BATCH_NORM && i >= 1 && i <= 4) f.batch_norm.stride[i - 1] = 1;
    }
    if ((st = run(&f, ops))) goto done;
    for (int i = 0; i < n; i++) {
        if (!buf[i]) continue;
        int64_t count, stride;
        bool written;
        operand_shape(d, i, &count, &stride, &written);
        if (!written) continue;
        uint16_t *h = x[i];
        if (stride == 1) lk_f32_to_half_n(d->dtype[i], h, buf[i], (size_t)count);
        else
            for (int64_t k = 0; k < count; k++)
                h[k * stride] = d->dtype[i] == LK_BF16 ? lk_f32_to_bf16_bits(buf[i][k]) : lk_f32_to_f16_bits(buf[i][k]);
    }
done:
    for (int i = 0; i < n; i++) lk_free(buf[i]);
    return st;
}

/* The CPU backend's classification losses over integer targets, f32:
 * cross-entropy (fused log-softmax + weighted, label-smoothed NLL per row,
 * kernels/rows.h) and nll_loss on log-probabilities, forward and backward.
 * Rows whose target is ignore_index count for nothing; the mean divides by
 * the total weight of the counted rows, as PyTorch's nll_loss does. */
#include <string.h>

#include "backend/cpu/cpu_impl.h"

static inline int64_t target_at(lk_dtype dt, const void *t, int64_t i) {
    return dt == LK_I64 ? ((const int64_t *)t)[i] : (int64_t)((const int32_t *)t)[i];
}

#if !LK_ISA_VARIANT /* the baseline copy answers supports() */
bool lk__cpu_xent_supports(const lk_op_desc *d) {
    int ti = d->op == LK_OP_NLL_BACKWARD ? 0 : 1, n = lk__op_arity(d->op);
    if (d->dtype[ti] != LK_I32 && d->dtype[ti] != LK_I64) return false;
    for (int i = 0; i < n; i++) {
        bool wsum = (d->op == LK_OP_XENT && i == 5) || (d->op == LK_OP_NLL && i == 4);
        if (i != ti && d->dtype[i] != (wsum ? LK_F64 : LK_F32)) return false;
    }
    return d->xent.reduction >= 0 && d->xent.reduction <= 2;
}
#endif

static lk_status xent_forward(const lk_xent_params *p, lk_dtype tdt, void *const *x) {
    const float *xd = x[0], *w = x[2];
    const void *tg = x[1];
    float *od = x[3], *pd = x[4];
    const int64_t C = p->C, D = p->D, rows = p->N * p->D;
    const float eps = p->eps;
    lk_reduction red = (lk_reduction)p->reduction;
    /* A gathered row when the classes are strided (D > 1), and the row's
     * exp() when no softmax is kept for backward. */
    float *scratch = C > 0 ? lk_malloc(2 * (size_t)C * sizeof *scratch) : NULL;
    if (C > 0 && !scratch) return lk_last_status();
    double nll_sum = 0.0, smooth_sum = 0.0, wsum = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = target_at(tdt, tg, r);
        if (t == p->ignore_index) {
            if (red == LK_REDUCTION_NONE) od[r] = 0.0f;
            continue;
        }
        const float *z = xd + r * C;
        if (D > 1) {
            const float *base = xd + (r / D) * C * D + r % D;
            for (int64_t c = 0; c < C; c++) scratch[c] = base[c * D];
            z = scratch;
        }
        float wt = w ? w[t] : 1.0f, sm;
        float nll = lk_k_xent_row(z, pd ? pd + r * C : scratch + C, C, t, wt, w, eps, pd != NULL, &sm);
        if (red == LK_REDUCTION_NONE) od[r] = eps > 0.0f ? (1.0f - eps) * nll + sm * (eps / (float)C) : nll;
        nll_sum += nll;
        smooth_sum += sm;
        wsum += wt;
    }
    /* 0/0 = NaN when every target is ignored, as PyTorch. */
    double es = C > 0 ? (double)eps / (double)C : 0.0;
    if (red == LK_REDUCTION_SUM) od[0] = (float)((1.0 - eps) * nll_sum + es * smooth_sum);
    if (red == LK_REDUCTION_MEAN)
        od[0] = (float)(eps > 0.0f ? (1.0 - eps) * (nll_sum / wsum) + es * (smooth_sum / wsum) : nll_sum / wsum);
    *(double *)x[5] = wsum;
    lk_free(scratch);
    return LK_STATUS_OK;
}

static lk_status xent_backward(const lk_xent_params *p, lk_dtype tdt, void *const *x) {
    const float *pd = x[0], *w = x[2], *gd = x[3];
    const void *tg = x[1];
    float *dd = x[4];
    const int64_t C = p->C, D = p->D;
    lk_reduction red = (lk_reduction)p->reduction;
    float *row = NULL;
    if (D > 1 && !(row = lk_malloc((size_t)C * sizeof *row))) return lk_last_status();
    for (int64_t r = 0; r < p->N * D; r++) {
        int64_t t = target_at(tdt, tg, r);
        float *dst = D == 1 ? dd + r * C : row;
        if (t == p->ignore_index) {
            memset(dst, 0, (size_t)C * sizeof *dst);
        } else {
            float coef = red == LK_REDUCTION_NONE ? gd[r] : red == LK_REDUCTION_MEAN ? gd[0] / p->norm : gd[0];
            lk_k_xent_row_grad(pd + r * C, dst, C, t, w ? w[t] : 1.0f, w, p->W, p->eps, coef);
        }
        if (D > 1) {
            float *base = dd + (r / D) * C * D + r % D;
            for (int64_t c = 0; c < C; c++) base[c * D] = row[c];
        }
    }
    lk_free(row);
    return LK_STATUS_OK;
}

static void nll_forward(const lk_xent_params *p, lk_dtype tdt, void *const *x) {
    const float *xd = x[0], *w = x[2];
    const void *tg = x[1];
    float *od = x[3];
    const int64_t C = p->C, D = p->D;
    lk_reduction red = (lk_reduction)p->reduction;
    double sum = 0.0, wsum = 0.0;
    for (int64_t r = 0; r < p->N * D; r++) {
        int64_t t = target_at(tdt, tg, r);
        float v = 0.0f;
        if (t != p->ignore_index) {
            float wt = w ? w[t] : 1.0f;
            v = -wt * xd[(r / D) * C * D + t * D + r % D];
            sum += v;
            wsum += wt;
        }
        if (red == LK_REDUCTION_NONE) od[r] = v;
    }
    if (red == LK_REDUCTION_SUM) od[0] = (float)sum;
    if (red == LK_REDUCTION_MEAN) od[0] = (float)(sum / wsum);
    *(double *)x[4] = wsum;
}

static void nll_backward(const lk_xent_params *p, lk_dtype tdt, void *const *x) {
    const void *tg = x[0];
    const float *w = x[1], *gd = x[2];
    float *dd = x[3];
    const int64_t C = p->C, D = p->D;
    lk_reduction red = (lk_reduction)p->reduction;
    for (int64_t r = 0; r < p->N * D; r++) {
        int64_t t = target_at(tdt, tg, r);
        if (t == p->ignore_index) continue;
        float coef = red == LK_REDUCTION_NONE ? gd[r] : red == LK_REDUCTION_MEAN ? gd[0] / p->norm : gd[0];
        dd[(r / D) * C * D + t * D + r % D] = -(w ? w[t] : 1.0f) * coef;
    }
}

lk_status LK_ISA(lk__cpu_xent)(const lk_op_desc *d, void *const *x) {
    switch (d->op) {
    case LK_OP_XENT: return xent_forward(&d->xent, d->dtype[1], x);
    case LK_OP_XENT_BACKWARD: return xent_backward(&d->xent, d->dtype[1], x);
    case LK_OP_NLL: nll_forward(&d->xent, d->dtype[1], x); return LK_STATUS_OK;
    case LK_OP_NLL_BACKWARD: nll_backward(&d->xent, d->dtype[0], x); return LK_STATUS_OK;
    default: return lk_error(LK_STATUS_INTERNAL, "cpu backend: op %d is not a classification loss", (int)d->op);
    }
}

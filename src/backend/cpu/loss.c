/* The CPU backend's pointwise losses, f32: the regression losses (mse, l1,
 * smooth_l1) and binary cross-entropy (on probabilities or on logits, with
 * optional element weights and pos_weight): per-element losses, or their
 * mean or sum accumulated in double in element order, and the gradients.
 * The regression losses also take a bf16/f16 input and target (autocast's
 * fp32 list without an f32 copy): each element widened (exact), the same
 * f32 arithmetic, the input's gradient rounded once to the input's dtype. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"
#include "lockstep/autograd.h"

/* The regression losses over a 16-bit input (and target) in blocks: each
 * block widened into stack buffers (exact), the f32 arithmetic of the f32
 * path element by element (mean and sum in double, in element order: the
 * same result), the gradient block rounded once to dx's dtype. */
enum { LOSS_BLOCK = 1024 };

static void widen_block(lk_dtype dt, const void *p, int64_t i0, int64_t m, float *w) {
    if (dt == LK_F32) memcpy(w, (const float *)p + i0, (size_t)m * sizeof(float));
    else lk_half_to_f32_n(dt, w, (const uint16_t *)p + i0, (size_t)m);
}

static lk_status loss_lowp(const lk_op_desc *d, void *const *x) {
    const lk_loss_params *p = &d->loss;
    lk_dtype xt = d->dtype[0], yt = d->dtype[1];
    float beta = p->beta;
    lk_reduction red = (lk_reduction)p->reduction;
    float xb[LOSS_BLOCK], yb[LOSS_BLOCK], db[LOSS_BLOCK];
    double acc = 0;
    float scale = red == LK_REDUCTION_MEAN ? 1.0f / (float)p->n : 1.0f;
    for (int64_t i0 = 0; i0 < p->n; i0 += LOSS_BLOCK) {
        int64_t m = p->n - i0 < LOSS_BLOCK ? p->n - i0 : LOSS_BLOCK;
        widen_block(xt, x[0], i0, m, xb);
        widen_block(yt, x[1], i0, m, yb);
        if (d->op == LK_OP_LOSS) {
            float *od = x[2];
            for (int64_t j = 0; j < m; j++) {
                float diff = xb[j] - yb[j], v;
                switch (p->kind) {
                case LK_PLOSS_MSE: v = diff * diff; break;
                case LK_PLOSS_L1: v = fabsf(diff); break;
                default: v = fabsf(diff) < beta ? 0.5f * diff * diff / beta : fabsf(diff) - 0.5f * beta;
                }
                if (red == LK_REDUCTION_NONE) od[i0 + j] = v;
                else acc += v;
            }
            continue;
        }
        const float *gd = x[2];
        for (int64_t j = 0; j < m; j++) {
            float diff = xb[j] - yb[j], gi = red == LK_REDUCTION_NONE ? gd[i0 + j] : gd[0] * scale, v;
            switch (p->kind) {
            case LK_PLOSS_MSE: v = 2.0f * diff; break;
            case LK_PLOSS_L1: v = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f); break;
            default: v = fabsf(diff) < beta ? diff / beta : (diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f));
            }
            db[j] = gi * v;
        }
        if (xt == LK_F32) memcpy((float *)x[3] + i0, db, (size_t)m * sizeof(float));
        else lk_f32_to_half_n(xt, (uint16_t *)x[3] + i0, db, (size_t)m);
    }
    if (d->op == LK_OP_LOSS && red == LK_REDUCTION_SUM) ((float *)x[2])[0] = (float)acc;
    if (d->op == LK_OP_LOSS && red == LK_REDUCTION_MEAN) ((float *)x[2])[0] = p->n ? (float)(acc / (double)p->n) : NAN;
    return LK_STATUS_OK;
}

lk_status lk__cpu_loss(const lk_op_desc *d, void *const *x) {
    if (d->dtype[0] != LK_F32 || d->dtype[1] != LK_F32) return loss_lowp(d, x);
    const lk_loss_params *p = &d->loss;
    const float *xd = x[0], *yd = x[1];
    float beta = p->beta;
    lk_reduction red = (lk_reduction)p->reduction;
    if (d->op == LK_OP_LOSS) {
        float *od = x[2];
        double acc = 0;
        for (int64_t i = 0; i < p->n; i++) {
            float diff = xd[i] - yd[i], v;
            switch (p->kind) {
            case LK_PLOSS_MSE: v = diff * diff; break;
            case LK_PLOSS_L1: v = fabsf(diff); break;
            default: v = fabsf(diff) < beta ? 0.5f * diff * diff / beta : fabsf(diff) - 0.5f * beta;
            }
            if (red == LK_REDUCTION_NONE) od[i] = v;
            else acc += v;
        }
        if (red == LK_REDUCTION_SUM) od[0] = (float)acc;
        if (red == LK_REDUCTION_MEAN) od[0] = p->n ? (float)(acc / (double)p->n) : NAN;
        return LK_STATUS_OK;
    }
    const float *gd = x[2];
    float *dd = x[3];
    float scale = red == LK_REDUCTION_MEAN ? 1.0f / (float)p->n : 1.0f;
    for (int64_t i = 0; i < p->n; i++) {
        float diff = xd[i] - yd[i], gi = red == LK_REDUCTION_NONE ? gd[i] : gd[0] * scale, v;
        switch (p->kind) {
        case LK_PLOSS_MSE: v = 2.0f * diff; break;
        case LK_PLOSS_L1: v = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f); break;
        default: v = fabsf(diff) < beta ? diff / beta : (diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f));
        }
        dd[i] = gi * v;
    }
    return LK_STATUS_OK;
}

lk_status lk__cpu_bce(const lk_op_desc *d, void *const *x) {
    const lk_bce_params *p = &d->bce;
    const float *xd = x[0], *td = x[1], *wd = x[2], *pwd = x[3];
    lk_reduction red = (lk_reduction)p->reduction;
    bool logits = p->logits;
    int64_t N = p->n;
    if (d->op == LK_OP_BCE) {
        float *od = x[4];
        double acc = 0.0;
        for (int64_t i = 0; i < N; i++) {
            float v = logits ? lk_k_bce_logits(xd[i], td[i], pwd ? pwd[i] : 1.0f) : lk_k_bce(xd[i], td[i]);
            if (wd) v *= wd[i];
            if (red == LK_REDUCTION_NONE) od[i] = v;
            else acc += v;
        }
        if (red == LK_REDUCTION_SUM) od[0] = (float)acc;
        if (red == LK_REDUCTION_MEAN) od[0] = (float)(acc / (double)N); /* N = 0: NaN, as PyTorch */
        return LK_STATUS_OK;
    }
    const float *gd = x[4];
    float scale = red == LK_REDUCTION_MEAN ? 1.0f / (float)N : 1.0f;
    for (int k = 0; k < 2; k++) {
        float *dd = x[5 + k];
        if (!dd) continue;
        for (int64_t i = 0; i < N; i++) {
            float gi = red == LK_REDUCTION_NONE ? gd[i] : gd[0] * scale, v;
            float pw = pwd ? pwd[i] : 1.0f;
            if (k == 0) v = logits ? lk_k_bce_logits_dx(xd[i], td[i], pw) : lk_k_bce_dx(xd[i], td[i]);
            else v = logits ? lk_k_bce_logits_dt(xd[i], pw) : lk_k_bce_dt(xd[i]);
            dd[i] = (wd ? wd[i] * v : v) * gi;
        }
    }
    return LK_STATUS_OK;
}

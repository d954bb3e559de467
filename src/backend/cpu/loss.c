/* The CPU backend's pointwise losses: the regression losses (mse, l1,
 * smooth_l1; f32, bf16 or f16 input and target) and binary cross-entropy
 * (f32; on probabilities or on logits, with optional element weights and
 * pos_weight): per-element losses, or their mean or sum accumulated in
 * double, and the gradients. A 16-bit input or target (autocast's fp32 list
 * without an f32 copy) is widened (exact) to the same f32 arithmetic, and
 * the input's gradient rounded once to the input's dtype. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

/* The regression losses in blocks of LOSS_BLOCK elements: a 16-bit input
 * (or target) widened into stack buffers (exact), an f32 one read in place;
 * the f32 arithmetic one loop per loss kind (no branch per element: the
 * loops vectorise); a 16-bit gradient rounded once per element. A mean or
 * sum adds the per-element losses in double in eight partial sums, element
 * i into sum i mod 8, combined pairwise at the end: the same result for any
 * block size (a multiple of 8), eight times shorter a dependency chain than
 * one running sum (which bounded a 200K-element mse at ~0.16 ms, one double
 * add latency per element), and as exact — the losses are >= 0, so each sum's
 * relative error stays below n * 2^-53, far under f32's 2^-24. */
enum { LOSS_BLOCK = 1024, LANES = 8 };

static const float *block_of(lk_dtype dt, const void *p, int64_t i0, int64_t m, float *w) {
    if (dt == LK_F32) return (const float *)p + i0;
    lk_half_to_f32_n(dt, w, (const uint16_t *)p + i0, (size_t)m);
    return w;
}

/* v[j] = the per-element loss of x[j] against y[j] (dx 0), or its
 * derivative in x[j] (dx 1): one loop per kind, each with the kernel's
 * formula for a constant kind, so each vectorises. */
#define PLOSS_LOOP(K)                                                                                \
    for (int64_t j = 0; j < m; j++)                                                                  \
        v[j] = dx ? lk_k_ploss_dx(K, x[j] - y[j], beta) : lk_k_ploss(K, x[j] - y[j], beta)

static void ploss_block(lk_ploss_kind kind, bool dx, float beta, const float *restrict x, const float *restrict y,
                        int64_t m, float *restrict v) {
    switch (kind) {
    case LK_PLOSS_MSE: PLOSS_LOOP(LK_PLOSS_MSE); break;
    case LK_PLOSS_L1: PLOSS_LOOP(LK_PLOSS_L1); break;
    default: PLOSS_LOOP(LK_PLOSS_SMOOTH_L1);
    }
}

lk_status LK_ISA(lk__cpu_loss)(const lk_op_desc *d, void *const *x) {
    const lk_loss_params *p = &d->loss;
    lk_dtype xt = d->dtype[0], yt = d->dtype[1];
    lk_ploss_kind kind = (lk_ploss_kind)p->kind;
    lk_reduction red = (lk_reduction)p->reduction;
    float xw[LOSS_BLOCK], yw[LOSS_BLOCK], vb[LOSS_BLOCK];
    double lane[LANES] = {0};
    float scale = red == LK_REDUCTION_MEAN ? 1.0f / (float)p->n : 1.0f;
    for (int64_t i0 = 0; i0 < p->n; i0 += LOSS_BLOCK) {
        int64_t m = p->n - i0 < LOSS_BLOCK ? p->n - i0 : LOSS_BLOCK;
        const float *xb = block_of(xt, x[0], i0, m, xw), *yb = block_of(yt, x[1], i0, m, yw);
        if (d->op == LK_OP_LOSS) {
            if (red == LK_REDUCTION_NONE) { /* the output is f32 */
                ploss_block(kind, false, p->beta, xb, yb, m, (float *)x[2] + i0);
                continue;
            }
            ploss_block(kind, false, p->beta, xb, yb, m, vb);
            int64_t j = 0;
            for (; j + LANES <= m; j += LANES)
                for (int k = 0; k < LANES; k++) lane[k] += vb[j + k];
            for (int k = 0; j < m; j++, k++) lane[k] += vb[j]; /* the last block's tail: i0 + j == k mod 8 */
            continue;
        }
        /* backward: dx = incoming gradient * d loss / dx, in dx's dtype */
        const float *gd = x[2];
        float *db = xt == LK_F32 ? (float *)x[3] + i0 : vb;
        ploss_block(kind, true, p->beta, xb, yb, m, db);
        if (red == LK_REDUCTION_NONE)
            for (int64_t j = 0; j < m; j++) db[j] = gd[i0 + j] * db[j];
        else {
            float gi = gd[0] * scale;
            for (int64_t j = 0; j < m; j++) db[j] = gi * db[j];
        }
        if (xt != LK_F32) lk_f32_to_half_n(xt, (uint16_t *)x[3] + i0, db, (size_t)m);
    }
    if (d->op == LK_OP_LOSS && red != LK_REDUCTION_NONE) {
        double acc = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        float *od = x[2];
        if (red == LK_REDUCTION_SUM) od[0] = (float)acc;
        else od[0] = p->n ? (float)(acc / (double)p->n) : NAN;
    }
    return LK_STATUS_OK;
}

lk_status LK_ISA(lk__cpu_bce)(const lk_op_desc *d, void *const *x) {
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

/* The CPU backend's pointwise regression losses (mse, l1, smooth_l1), f32:
 * per-element losses, or their mean or sum accumulated in double in element
 * order, and the gradient w.r.t. the input. */
#include <math.h>

#include "backend/cpu/cpu_impl.h"
#include "lockstep/autograd.h"

lk_status lk__cpu_loss(const lk_op_desc *d, void *const *x) {
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

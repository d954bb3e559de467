/* The gradients between the backward pass and the optimizer step, once
 * the strategy has reduced them: the fp16 unscale with its overflow flag
 * agreed across ranks, the check for a non-finite gradient (which names the
 * parameter and element), and gradient clipping by value or by norm. */
#include <math.h>
#include <string.h>

#include "train/train_impl.h"

void lk__clip_gradients(lk_trainer *tr) {
    if (tr->cfg.gradient_clip_val <= 0) return;
    if (!strcmp(tr->cfg.gradient_clip_algorithm, "value")) lk_clip_grad_value(&tr->params, tr->cfg.gradient_clip_val);
    else {
        double norm;
        lk_clip_grad_norm(&tr->params, tr->cfg.gradient_clip_val, 2.0, &norm);
    }
}

/* Index of the first NaN or infinity in d[0..n), or -1. Checks the
 * exponent bits in blocks with no early exit, which vectorises: a per-element
 * isfinite() with a branch cost as much as Adam itself (1 ns per element). */
static int64_t find_nonfinite(const float *d, int64_t n) {
    for (int64_t b = 0; b < n; b += 4096) {
        int64_t e = n - b < 4096 ? n : b + 4096;
        uint32_t bad = 0;
        for (int64_t k = b; k < e; k++) {
            uint32_t u;
            memcpy(&u, d + k, sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        if (bad)
            for (int64_t k = b; k < e; k++)
                if (!isfinite(d[k])) return k;
    }
    return -1;
}

lk_status lk__first_nonfinite(lk_trainer *tr, double loss) {
    for (int i = 0; i < tr->params.n; i++) {
        lk_tensor *g = tr->params.items[i].tensor->grad;
        if (!g) continue;
        const float *d = g->data;
        int64_t k = find_nonfinite(d, g->numel);
        if (k >= 0)
            return lk_error(LK_STATUS_ABORTED,
                            "non-finite gradient at step %lld (epoch %lld, batch %lld): parameter '%s' element %lld "
                            "is %g (loss %g)",
                            (long long)tr->global_step, (long long)tr->epoch, (long long)tr->batch_idx,
                            tr->params.items[i].name, (long long)k, (double)d[k], loss);
    }
    return LK_STATUS_OK;
}

/* precision 16-mixed, once the step's gradients are reduced: unscales
 * them and decides whether the optimizer step is skipped. The overflow flag
 * is reduced across ranks (MAX) so that every rank skips or steps together,
 * whatever its own gradients held; a sharded optimizer step would otherwise
 * update some shards and not others. */
lk_status lk__unscale_gradients(lk_trainer *tr, bool *skip) {
    bool found;
    LK_TRY(lk_grad_scaler_unscale(tr->scaler, &tr->params, &found));
    double any = found ? 1.0 : 0.0;
    LK_TRY(lk_strategy_reduce(tr->strat, &any, 1, LK_REDUCE_MAX));
    *skip = any != 0.0;
    return LK_STATUS_OK;
}

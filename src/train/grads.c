/* The gradients between the backward pass and the optimizer step, once
 * the strategy has reduced them: the fp16 unscale with its overflow flag
 * agreed across ranks, the check for a non-finite gradient (which names the
 * parameter and element), and gradient clipping by value or by norm. */
#include <math.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "tensor/tensor_impl.h"
#include "train/train_impl.h"

void lk__clip_gradients(lk_trainer *tr) {
    if (tr->cfg.gradient_clip_val <= 0) return;
    if (!strcmp(tr->cfg.gradient_clip_algorithm, "value")) lk_clip_grad_value(&tr->params, tr->cfg.gradient_clip_val);
    else {
        double norm;
        lk_clip_grad_norm(&tr->params, tr->cfg.gradient_clip_val, 2.0, &norm);
    }
}

lk_status lk__first_nonfinite(lk_trainer *tr, double loss) {
    int n = tr->params.n;
    lk_device dev = LK_DEVICE_CPU;
    for (int i = 0; i < n; i++)
        if (tr->params.items[i].tensor->grad) dev = tr->params.items[i].tensor->grad->device;
    /* each gradient's first non-finite index, where the gradients are, read
     * back with one copy */
    int64_t small[32], *idx = n <= 32 ? small : lk_calloc((size_t)n + 1, sizeof *idx); /* no malloc per step for small models */
    if (!idx) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) idx[i] = -1;
    lk__scalars ks;
    lk_status st = lk__scalars_begin(&ks, dev, LK_I64, n, idx);
    for (int i = 0; !st && i < n; i++) {
        lk_tensor *g = tr->params.items[i].tensor->grad;
        if (!g) continue;
        /* LK_OP_NONFINITE tests the exponent bits blockwise without a branch
         * (a per-element isfinite() with one costs as much as Adam itself) */
        lk_op_desc nd = {.op = LK_OP_NONFINITE, .dtype = {g->dtype, LK_I64}};
        nd.nonfinite = (lk_nonfinite_params){g->numel, 1.0f};
        st = lk__backend_run(g->device, &nd, (void *[]){g->data, lk__scalars_at(&ks, i)});
    }
    if (lk__scalars_end(&ks) && !st) st = lk_last_status();
    for (int i = 0; !st && i < n; i++) {
        lk_tensor *g = tr->params.items[i].tensor->grad;
        int64_t k = idx[i];
        if (g && k >= 0) {
            if (idx != small) lk_free(idx);
            float v = (float)lk_tensor_get(g, k); /* the element (copied from a device) as f32, exact */
            return lk_error(LK_STATUS_ABORTED,
                            "non-finite gradient at step %lld (epoch %lld, batch %lld): parameter '%s' element %lld "
                            "is %g (loss %g)",
                            (long long)tr->global_step, (long long)tr->epoch, (long long)tr->batch_idx,
                            tr->params.items[i].name, (long long)k, (double)v, loss);
        }
    }
    if (idx != small) lk_free(idx);
    return st;
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

/* The step's one device->host read and the checks on it, in one file: the
 * loss (kept on the device by step.c's keep_loss, or each dp replica's)
 * comes back in the same copy as the gradients' checks — the fp16
 * unscale's found-inf counts (the flag then agreed across ranks) or each
 * gradient's first non-finite index (the message names the parameter and
 * element) — and the loss check ("the loss is nan at step N"), the only
 * place a loss is checked for being finite: a strategy that reads the
 * loss itself calls it through the step function's check_loss. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "optim/optim_impl.h"
#include "tensor/tensor_impl.h"
#include "train/train_impl.h"

/* A non-finite loss as users read it: "nan" whatever its sign bit (printf
 * writes "-nan" for 0 * inf), "inf" or "-inf". The loss training_step
 * logged is logged first, as on the CPU, where it was logged at once. */
lk_status lk__step_log_pending(lk_trainer *tr, double loss) {
    if (!tr->pending_loss.armed) return LK_STATUS_OK;
    tr->pending_loss.armed = false;
    int64_t bs = tr->cur_batch_size;
    tr->cur_batch_size = tr->pending_loss.batch_size;
    lk_status st = lk_log_metric(tr, tr->pending_loss.name, loss, &tr->pending_loss.opts);
    tr->cur_batch_size = bs;
    return st;
}

lk_status lk__step_check_loss(lk_trainer *tr, double loss) {
    LK_TRY(lk__step_log_pending(tr, loss)); /* the loss training_step logged (lk__log_loss): this read's value */
    loss = lk__fault_loss(tr, loss); /* LK_TEST_LOSS_NAN (faults.c) */
    if (isfinite(loss)) return LK_STATUS_OK;
    char buf[32];
    if (isnan(loss)) snprintf(buf, sizeof buf, "nan");
    else snprintf(buf, sizeof buf, "%g", loss);
    return lk_error(LK_STATUS_ABORTED, "the loss is %s at step %lld (epoch %lld, batch %lld)", buf,
                    (long long)tr->global_step, (long long)tr->epoch, (long long)tr->batch_idx);
}

/* The status slots (the loss slots, then one per parameter) on `dev`,
 * allocated once per run. */
static lk_status status_reserve(lk_trainer *tr, lk_device dev) {
    struct lk__step_status *ss = &tr->step_status;
    int nloss = tr->dp_devices > 1 ? tr->dp_devices : 1;
    int64_t slots = (int64_t)tr->params->n + nloss;
    if (ss->host && ss->slots >= slots && ss->nloss == nloss && lk_device_equal(ss->dev, dev)) return LK_STATUS_OK;
    lk__step_status_free(tr);
    if (!(ss->host = lk_calloc((size_t)slots, sizeof *ss->host)) || !(ss->rows = lk_calloc((size_t)nloss, sizeof *ss->rows)))
        return LK_STATUS_OUT_OF_MEMORY;
    ss->slots = slots;
    ss->nloss = nloss;
    ss->dev = dev;
    if (lk_device_is_host(dev)) ss->mem = ss->host;
    else LK_TRY(lk_device_alloc(dev, (size_t)slots * sizeof *ss->host, &ss->mem));
    return LK_STATUS_OK;
}

void lk__step_status_free(lk_trainer *tr) {
    struct lk__step_status *ss = &tr->step_status;
    if (ss->mem && ss->mem != ss->host) lk_device_free(ss->dev, ss->mem, (size_t)ss->slots * sizeof *ss->host);
    lk_free(ss->host);
    lk_free(ss->rows);
    *ss = (struct lk__step_status){0};
}

/* Where the gradients are (the loss is copied there): the last gradient's
 * device, `fallback` when there is none. */
static lk_device grads_device(const lk_trainer *tr, lk_device fallback) {
    for (int i = 0; i < tr->params->n; i++)
        if (tr->params->items[i].tensor->grad) fallback = tr->params->items[i].tensor->grad->device;
    return fallback;
}

/* The loss into loss slot k (reserved). */
static lk_status keep_at(lk_trainer *tr, int k, const lk_tensor *loss) {
    if (loss->numel < 1 || lk_dtype_size(loss->dtype) > sizeof(int64_t))
        return lk_error(LK_STATUS_INVALID_USAGE, "training_step returned a loss of %lld %s elements (expected one float)",
                        (long long)loss->numel, lk_dtype_name(loss->dtype));
    size_t size = lk_dtype_size(loss->dtype);
    /* a copy within the device (queued behind backward on a GPU; dp's
     * replica k >= 1: a peer copy to device 0), not a read */
    return lk_device_copy(tr->step_status.dev, (int64_t *)tr->step_status.mem + k, loss->device,
                          (const char *)loss->data + lk__elem_offset(loss, 0) * (int64_t)size, size);
}

lk_status lk__step_keep_loss(lk_trainer *tr, const lk_tensor *loss) {
    LK_TRY(status_reserve(tr, grads_device(tr, loss->device)));
    LK_TRY(keep_at(tr, 0, loss));
    tr->step_status.loss_dtype = loss->dtype;
    tr->step_status.replicas = false;
    tr->step_status.held = true;
    return LK_STATUS_OK;
}

lk_status lk__step_keep_replica_loss(lk_trainer *tr, int k, const lk_tensor *loss, int64_t rows, int64_t total) {
    struct lk__step_status *ss = &tr->step_status;
    LK_TRY(status_reserve(tr, grads_device(tr, loss->device)));
    if (k < 0 || k >= ss->nloss)
        return lk_error(LK_STATUS_INTERNAL, "dp: the loss of replica %d of %d", k, ss->nloss);
    if (!ss->held || !ss->replicas) { /* this micro-batch's first: the slots of the last are stale */
        memset(ss->rows, 0, (size_t)ss->nloss * sizeof *ss->rows);
        ss->loss_dtype = loss->dtype;
    } else if (loss->dtype != ss->loss_dtype) { /* one conversion reads every slot */
        return lk_error(LK_STATUS_INTERNAL, "dp: replica %d's loss is %s, an earlier replica's %s", k,
                        lk_dtype_name(loss->dtype), lk_dtype_name(ss->loss_dtype));
    }
    LK_TRY(keep_at(tr, k, loss));
    ss->rows[k] = rows;
    ss->total = total;
    ss->replicas = ss->held = true;
    return LK_STATUS_OK;
}

/* Loss slot k as read back, converted as lk_tensor_item converts (through f32). */
static lk_status slot_loss(struct lk__step_status *ss, int k, double *out) {
    lk_tensor *l = lk__tensor_wrap_on(LK_DEVICE_CPU, ss->loss_dtype, 0, NULL, ss->host + k);
    if (!l) return lk_last_status();
    *out = lk_tensor_item(l);
    lk_tensor_release(l);
    return LK_STATUS_OK;
}

/* The non-finite gradient message for the slots read back (-1: finite). */
static lk_status nonfinite_message(lk_trainer *tr, const int64_t *idx, double loss) {
    for (int i = 0; i < tr->params->n; i++) {
        lk_tensor *g = tr->params->items[i].tensor->grad;
        int64_t k = idx[i];
        if (g && k >= 0) {
            float v = (float)lk_tensor_get(g, k); /* the element (copied from a device) as f32, exact */
            return lk_error(LK_STATUS_ABORTED,
                            "non-finite gradient at step %lld (epoch %lld, batch %lld): parameter '%s' element %lld "
                            "is %g (loss %g)",
                            (long long)tr->global_step, (long long)tr->epoch, (long long)tr->batch_idx,
                            tr->params->items[i].name, (long long)k, (double)v, loss);
        }
    }
    return LK_STATUS_OK;
}

lk_status lk__step_checks(lk_trainer *tr, bool sync, double *loss, bool *skip) {
    struct lk__step_status *ss = &tr->step_status;
    *skip = false;
    bool held = ss->held;
    ss->held = false;
    if (!held && !sync) return LK_STATUS_OK;
    int n = tr->params->n;
    lk_device dev = held ? ss->dev : grads_device(tr, LK_DEVICE_CPU);
    LK_TRY(status_reserve(tr, dev));
    int nl = ss->nloss;
    int64_t *slot = (int64_t *)ss->mem + nl; /* the gradients' slots, where the ops write */
    if (sync && tr->scaler) {
        /* one pass per gradient: checked (before it is scaled, as PyTorch
         * checks), multiplied by 1/scale, its non-finite count in its slot */
        LK_TRY(lk__grad_scaler_unscale_into(tr->scaler, tr->params, slot));
    } else if (sync) {
        for (int i = 0; i < n; i++) {
            lk_tensor *g = tr->params->items[i].tensor->grad;
            if (!g) continue;
            /* LK_OP_NONFINITE tests the exponent bits blockwise without a
             * branch (a per-element isfinite() with one costs as much as Adam
             * itself) */
            lk_op_desc nd = {.op = LK_OP_NONFINITE, .dtype = {g->dtype, LK_I64}};
            nd.nonfinite = (lk_nonfinite_params){g->numel, 1.0f};
            LK_TRY(lk__backend_run(g->device, &nd, (void *[]){g->data, slot + i}));
        }
    }
    /* The read: the loss and the gradients' slots in one copy (none on a
     * host-addressable device). Only the slots written are looked at. */
    int first = held ? 0 : nl, last = sync ? nl + n : nl;
    if (ss->mem != ss->host && last > first)
        LK_TRY(lk_device_copy(LK_DEVICE_CPU, ss->host + first, ss->dev, (int64_t *)ss->mem + first,
                              (size_t)(last - first) * sizeof *ss->host));
    if (held && !ss->replicas) {
        LK_TRY(slot_loss(ss, 0, loss));
        LK_TRY(lk__step_check_loss(tr, *loss));
    } else if (held) {
        /* dp: train_loss is replica 0's (what its training_step logged);
         * the check is on the replicas' mean weighted by their rows, the
         * value and the order of the sum dp's check_loss had */
        double l = 0, v0 = NAN;
        for (int k = 0; k < nl; k++) {
            double v = NAN;
            if (ss->rows[k]) LK_TRY(slot_loss(ss, k, &v));
            if (k == 0) v0 = v;
            l += ss->rows[k] ? v * (double)ss->rows[k] / (double)ss->total : 0;
        }
        LK_TRY(lk__step_log_pending(tr, v0));
        *loss = l;
        LK_TRY(lk__step_check_loss(tr, l));
    }
    if (!sync) return LK_STATUS_OK;
    if (tr->scaler) {
        /* The overflow flag is reduced across ranks (MAX) so that every rank
         * skips or steps together, whatever its own gradients held; a
         * sharded optimizer step would otherwise update some shards and not
         * others. Over the world, not the data-parallel group: the ranks
         * holding other parts of the model (pipeline stages) must skip too,
         * and keep one loss scale. */
        double any = 0.0;
        for (int i = 0; i < n; i++) any = tr->params->items[i].tensor->grad && ss->host[nl + i] > 0 ? 1.0 : any;
        LK_TRY(lk_strategy_reduce(tr->strat, &any, 1, LK_REDUCE_MAX));
        *skip = any != 0.0;
        return LK_STATUS_OK;
    }
    return nonfinite_message(tr, ss->host + nl, *loss);
}

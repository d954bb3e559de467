/* The trainer's side of a training step, as the strategy calls it
 * (lk_step_fn): the module's training_step on replica k with the dropout
 * streams re-keyed for this step, the loss handed to step_checks.c (kept
 * on the device for the step's one read, or checked as dp reads it), the
 * profiler's phases, and dp's replicas — each a module made by the module's
 * replicate() and a scratch trainer its training_step logs into
 * (discarded). The strategy runs them in the order and on the threads it
 * needs; the fit loop only calls lk_strategy_training_step. */
#include <math.h>
#include <stdio.h>

#include "lockstep/models.h" /* lk_model_blocks_input: a pipeline's first stage */
#include "device/gpu.h"
#include "train/accelerator.h"
#include "tensor/tensor_impl.h"
#include "train/prefetch.h"
#include "train/train_impl.h"

typedef struct lk__replica {
    lk_module *module;
    lk_trainer *shadow;
} lk__replica;

static lk_tensor *step_forward(void *ctx, int replica, const lk_batch *b, int64_t batch_idx) {
    lk_trainer *tr = ctx;
    lk_trainer *t = replica == 0 ? tr : tr->replicas[replica].shadow;
    lk_module *m = replica == 0 ? tr->module : tr->replicas[replica].module;
    t->stage = "train";
    t->cur_batch_size = b->size;
    /* Replica k of dp draws the randomness rank k would; single and ddp this rank's. */
    lk_layer_set_rng_step(m->net, (uint64_t)tr->cfg.seed, (uint32_t)(replica == 0 ? tr->rank : replica),
                          (uint64_t)tr->global_step);
    t->pending_loss.armed = false; /* a failed step's leftover */
    t->step_status.held = false;
    if (replica == 0) return lk_module_training_step(m, b, batch_idx, t);
    /* dp's replica k, on its own thread: its slice was prefetched onto its
     * device with the batch (prefetch.c), and cross-entropy's target check
     * reads the slice's host copy, not the device; both are per thread */
    if (tr->pf && lk__prefetch_enter(tr->pf)) return NULL;
    lk__host_shadows_on(true);
    lk_tensor *loss = lk_module_training_step(m, b, batch_idx, t);
    lk__host_shadows_on(false);
    lk__prefetch_leave(tr->pf);
    return loss;
}

/* A strategy that reads the loss itself (dp without keep_replica_loss). */
static lk_status step_check_loss(void *ctx, double loss) { return lk__step_check_loss(ctx, loss); }

/* single, ddp: the loss stays on the device until step_checks.c's one read. */
static lk_status step_keep_loss(void *ctx, const lk_tensor *loss) { return lk__step_keep_loss(ctx, loss); }

/* dp: each replica's loss joins that read, on device 0. */
static lk_status step_keep_replica_loss(void *ctx, int k, const lk_tensor *loss, int64_t rows, int64_t total) {
    return lk__step_keep_replica_loss(ctx, k, loss, rows, total);
}

static void step_begin(void *ctx) {
    lk_trainer *tr = ctx;
    /* The step's dropout streams, keyed by (seed, data-parallel rank, step):
     * a pipeline's stages run the module's blocks without step_forward, so
     * this is where theirs are keyed (the same keys single uses: each layer
     * lives on one stage). step_forward keys again for the others, alike. */
    lk_layer_set_rng_step(tr->module->net, (uint64_t)tr->cfg.seed, (uint32_t)lk_strategy_dp_rank(tr->strat),
                          (uint64_t)tr->global_step);
    lk__prof_forward_begin(tr->prof, tr->global_step);
}

static void step_end(void *ctx, double t_fwd_end, double t_bwd_end, double t_comm_end) {
    lk_trainer *tr = ctx;
    lk__prof_backward_end(tr->prof, tr->step_t0, tr->step_t1, t_fwd_end, t_bwd_end, t_comm_end);
}

static void step_free_replica(void *ctx, int k);

static lk_status step_replicate(void *ctx, int k, lk_layer **net) {
    lk_trainer *tr = ctx;
    lk_module *m = tr->module;
    *net = NULL;
    if (!m->vt->replicate)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "strategy '%s' needs one replica of module '%s' per device, but the module cannot be "
                        "replicated (its vtable has no replicate()); use ddp, which needs no replicas",
                        lk_strategy_name(tr->strat), m->name ? m->name : "?");
    if (k < 1 || k >= tr->dp_devices)
        return lk_error(LK_STATUS_INTERNAL, "dp: replica %d of %d devices", k, tr->dp_devices);
    if (!tr->replicas && !(tr->replicas = lk_calloc((size_t)tr->dp_devices, sizeof *tr->replicas)))
        return LK_STATUS_OUT_OF_MEMORY;
    lk__replica *r = &tr->replicas[k];
    LK_TRY(m->vt->replicate(m, &r->module));
    lk_device dev = LK_DEVICE_CPU; /* replica k on device k of trainer.devices (the CPU: all on it) */
    int ck;
    if (lk__accelerator_device(&tr->cfg, k, &dev) || lk_layer_cast_parameters(r->module->net, tr->param_dtype) ||
        lk__activation_checkpointing(&tr->cfg, r->module->net, &ck) || /* as replica 0's */
        lk_layer_to(r->module->net, dev)) { /* as replica 0's (*-true), where replica k runs */
        lk_status st = lk_last_status();
        step_free_replica(tr, k);
        return st;
    }
    if (!(r->shadow = lk_calloc(1, sizeof *r->shadow))) {
        step_free_replica(tr, k);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    r->shadow->cfg = tr->cfg;
    *net = r->module->net;
    return LK_STATUS_OK;
}

static void step_free_replica(void *ctx, int k) {
    lk_trainer *tr = ctx;
    if (!tr->replicas) return;
    lk__replica *r = &tr->replicas[k];
    lk_module_free(r->module);
    if (r->shadow) {
        lk_free(r->shadow->metrics);
        lk_free(r->shadow);
    }
    *r = (lk__replica){0};
}

void lk__replicas_free(lk_trainer *tr) {
    for (int k = 1; tr->replicas && k < tr->dp_devices; k++) step_free_replica(tr, k);
    lk_free(tr->replicas);
    tr->replicas = NULL;
}

/* model_parallel, pipeline: the module's forward and loss apart. The first
 * stage's input is the batch's field 0 (what a module's forward from its
 * net takes) as the net's forward brings it to its first block (the
 * autoencoder flattens images: skipping that fed [N, 1, 28, 28] to a
 * Linear); the last stage's loss is the module's. */
static lk_tensor *step_pipe_input(void *ctx, const lk_batch *b) {
    lk_trainer *tr = ctx;
    return lk_model_blocks_input(tr->module->net, lk_batch_tensor(b, 0));
}

static lk_tensor *step_pipe_loss(void *ctx, lk_tensor *out, const lk_batch *b) {
    lk_trainer *tr = ctx;
    tr->stage = "train";
    return lk_module_loss(tr->module, out, b);
}

static lk_status step_pipe_log_loss(void *ctx, double loss) {
    lk_trainer *tr = ctx;
    return lk_log_metric(tr, "train_loss", loss, &(lk_log_opts){.prog_bar = true});
}

lk_step_fn lk__step_fn(lk_trainer *tr) {
    return (lk_step_fn){.ctx = tr,
                        .forward = step_forward,
                        .check_loss = step_check_loss,
                        .keep_loss = step_keep_loss,
                        .keep_replica_loss = step_keep_replica_loss,
                        .step_begin = step_begin,
                        .step_end = step_end,
                        .replicate = step_replicate,
                        .free_replica = step_free_replica,
                        .pipe_input = step_pipe_input,
                        .pipe_loss = step_pipe_loss,
                        .pipe_log_loss = step_pipe_log_loss};
}

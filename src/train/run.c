/* What every loop (fit, validate, test, predict) sets up and tears down:
 * the module on the training device, the data preparation and setup, the
 * loaders and their prefetchers, the batch limits, and the run's cleanup. */
#include <math.h>
#include <string.h>

#include "tensor/tensor_impl.h"
#include "device/gpu.h"
#include "train/accelerator.h"
#include "train/prefetch.h"
#include "train/train_impl.h"

/* A run on a device made it the default (begin_run): the process's own
 * default comes back when the run ends. */
void lk__run_end_on_device(lk_trainer *tr) {
    if (tr->default_set) lk_device_set_default(tr->prev_default); /* it was the default before: cannot fail */
    tr->default_set = false;
}

void lk__run_cleanup(lk_trainer *tr) {
    lk__host_shadows_on(false);
    if (tr->strat) lk_strategy_detach(tr->strat); /* dp: its threads stop and its replicas go */
    lk__run_end_on_device(tr);
    lk__replicas_free(tr);
    lk__step_status_free(tr);
    lk_scheduler_free(tr->sched);
    tr->sched = NULL;
    lk_optimizer_free(tr->optim);
    tr->optim = NULL;
    lk_grad_scaler_free(tr->scaler);
    tr->scaler = NULL;
    lk_progress_free(tr->progress);
    tr->progress = NULL;
    lk_logger_free(tr->logger);
    tr->logger = NULL;
    lk__prof_free(tr);
    lk__prefetch_free(tr->pf_eval); /* its passes ended with their loops */
    tr->pf_eval = NULL;
    lk__metrics_deferred_free(tr);
    lk_free(tr->ckpt_rows);
    tr->ckpt_rows = NULL;
    tr->val_pending = tr->epoch_restored = false;
}

int64_t lk__limit_batches(lk_count_or_fraction limit, int64_t n) {
    if (!limit.is_count) return (int64_t)floor(limit.value * (double)n + 1e-9);
    return (int64_t)limit.value < n ? (int64_t)limit.value : n;
}

static lk_status status_reduce(void *ctx, int *status) {
    lk_trainer *tr = ctx;
    if (tr->world == 1) return LK_STATUS_OK;
    int32_t v = *status;
    LK_TRY(lk_comm_all_reduce(tr->comm, &v, 1, LK_I32, LK_REDUCE_MAX));
    *status = v;
    return LK_STATUS_OK;
}

static lk_status prepare_data(void *ctx) {
    lk_datamodule *dm = ctx;
    return dm->vt->prepare_data ? dm->vt->prepare_data(dm) : LK_STATUS_OK;
}

/* Batches go onto a device the CPU cannot read ahead of their step
 * (prefetch.c); under dp each replica's slice onto its device. */
bool lk__prefetching(const lk_trainer *tr) { return !lk_device_is_host(tr->dev); }

/* The fit's prefetcher: onto the trainer's device, or dp's slices onto
 * their replicas' devices (replica k on device k, as step.c places it). */
lk_status lk__fit_prefetcher(lk_trainer *tr) {
    if (tr->dp_devices <= 1) return lk__prefetch_create(tr->dev, &tr->pf);
    lk_device *devs = lk_calloc((size_t)tr->dp_devices, sizeof *devs);
    if (!devs) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = LK_STATUS_OK;
    for (int k = 0; k < tr->dp_devices && !st; k++) st = lk__accelerator_device(&tr->cfg, k, &devs[k]);
    if (!st) st = lk__prefetch_create_split(devs, tr->dp_devices, &tr->pf);
    lk_free(devs);
    return st;
}

/* The loader's buffers on such a device: the memory its copies read fastest
 * (pinned on cuda). ctx is the trainer's device, which outlives the loader. */
static void *device_host_alloc(void *ctx, size_t bytes) {
    void *p;
    return lk_device_host_alloc(*(const lk_device *)ctx, bytes, &p) ? NULL : p;
}
static void device_host_free(void *ctx, void *p) { lk_device_host_free(*(const lk_device *)ctx, p, 0); }

/* The prefetcher of the evaluation loops (validation, test, predict; made
 * on first use, kept until run_cleanup), or NULL on the synchronous path. */
lk_status lk__eval_prefetcher(lk_trainer *tr, lk__prefetch **out) {
    *out = NULL;
    if (!lk__prefetching(tr)) return LK_STATUS_OK;
    if (!tr->pf_eval) LK_TRY(lk__prefetch_create(tr->dev, &tr->pf_eval));
    *out = tr->pf_eval;
    return LK_STATUS_OK;
}

lk_status lk__make_loader(lk_trainer *tr, lk_dataset *ds, bool train, lk_loader **out) {
    lk_loader_config lc = lk_loader_config_default();
    lc.batch_size = tr->dm->batch_size > 0 ? tr->dm->batch_size : 32;
    lc.shuffle = train && tr->cfg.overfit_batches.value == 0;
    lc.seed = (uint64_t)tr->cfg.seed;
    /* the sampler shards over the ranks that see different data */
    lc.rank = lk_strategy_dp_rank(tr->strat);
    lc.world_size = lk_strategy_dp_size(tr->strat);
    lc.num_workers = tr->dm->num_workers;
    /* Evaluation counts every sample exactly once: no padding, uneven shards
     * (the metric reduction weighs each batch by its size). Training pads so
     * every rank runs the same number of steps. */
    lc.no_pad = !train;
    if (!lk_device_is_host(tr->dev)) {
        lc.alloc = device_host_alloc, lc.free = device_host_free, lc.alloc_ctx = &tr->dev;
        if (lk__prefetching(tr)) lc.hold = 2; /* batch i stays valid while i + 1 is taken */
    }
    return lk_loader_create(ds, &lc, out);
}

lk_status lk__begin_run(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *stage) {
    if (!m || !m->vt || !m->net) return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer: a module with a network is required");
    if (!dm || !dm->vt || !dm->vt->dataset)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer: a data module with dataset() is required");
    tr->module = m;
    tr->dm = dm;
    /* A deferred model (lk_module_create_builtin_deferred) is made real
     * here, whole, unless the strategy materialises it itself in
     * lk_strategy_wrap, never holding all of it: each pipeline rank its
     * stage (a split by measured time runs the whole model once first, so
     * it is made whole here), fsdp one unit at a time when it trains (its
     * evaluation runs the whole model). Evaluation wraps only a pipeline
     * (lk__eval_pipeline_setup, which makes the model whole for a module
     * whose steps run it themselves). */
    bool wraps = !strcmp(stage, "fit") || lk_strategy_needs_blocks(tr->strat);
    bool cuts = wraps && lk_strategy_materializes(tr->strat);
    if (m->net->deferred) tr->stage_only = cuts && lk_strategy_needs_blocks(tr->strat);
    if (m->net->deferred && !cuts && lk_layer_materialize(m->net)) {
        lk_status st = lk_last_status();
        if (st != LK_STATUS_OUT_OF_MEMORY) return st;
        lk_named_tensors all = {0}; /* each tensor once (a tied weight too) */
        double mib = 0;
        if (!lk_layer_named_parameters(m->net, &all) && !lk_layer_named_buffers(m->net, &all))
            for (int i = 0; i < all.n; i++) mib += (double)lk_tensor_nbytes(all.items[i].tensor) / 1048576.0;
        lk_named_tensors_clear(&all);
        return lk_error(st, "strategy %s starts from the whole model on each rank (%.1f MiB of parameters and buffers), "
                        "and it does not fit: %s; strategies pipeline and model_parallel build each rank only its "
                        "stage's blocks, fsdp and deepspeed_stage_3 only its shards", lk_strategy_name(tr->strat), mib, lk_last_error());
    }
    /* bf16-true / 16-true: the module's parameters in that dtype, as
     * Lightning's module.to(dtype), before anything flattens them or a
     * checkpoint is loaded into them (the load casts). */
    LK_TRY(lk_layer_cast_parameters(m->net, tr->param_dtype));
    /* The module on the training device (module.to(device)), and the run's
     * new tensors there too: every op creates its result on the default
     * device. Nothing to do on the CPU. */
    if (tr->dev.kind != LK_CPU) {
        LK_TRY(lk_layer_to(m->net, tr->dev));
        if (!tr->default_set) tr->prev_default = lk_device_default();
        LK_TRY(lk_device_set_default(tr->dev));
        tr->default_set = true;
        lk__host_shadows_on(true); /* cross-entropy's target check reads the batch's host copy */
    }
    /* Local rank 0 may download and unpack for a long while: its own bound. */
    if (tr->world > 1 && dm->vt->prepare_data)
        LK_TRY(lk_comm_long_work(tr->comm, 0, "data preparation (prepare_data: download, unpack)", "trainer.checkpoint_timeout",
                                 tr->cfg.checkpoint_timeout));
    LK_TRY(lk_data_prepare(tr->pg.local_rank, prepare_data, dm, status_reduce, tr));
    if (dm->vt->setup) LK_TRY(dm->vt->setup(dm, stage)); /* optional: datasets made at creation need none */
    return m->vt->setup ? m->vt->setup(m, dm, stage) : LK_STATUS_OK;
}

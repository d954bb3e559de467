/* The Trainer: fit, validate, test and predict loops over a module and a
 * data module, with the strategy reducing gradients, gradient accumulation
 * and clipping, the optimizer and scheduler, validation inside the epoch,
 * checkpoints, early stopping, progress, loggers and run.json. Only rank 0
 * prints and writes files; every decision that ends a loop is taken from
 * values that are identical on every rank, so ranks never diverge. The
 * parts the loops call live beside it: optim_factory.c (optimizer, loss
 * scaler, scheduler), grads.c (unscale, non-finite check, clipping),
 * callbacks.c (EarlyStopping, the monitors), checkpoint.c, signals.c and
 * runsummary.c (run.json, the profiler's table). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lockstep/config.h"
#include "backend/backend_impl.h"
#include "backend/threads.h"
#include "optim/optim_impl.h"
#include "device/gpu.h"
#include "train/prefetch.h"
#include "tensor/tensor_impl.h"
#include "train/train_impl.h"

/* ---- creation --------------------------------------------------------------- */

const char *lk__precision_name(const char *p) {
    return !strcmp(p, "32") ? "32-true" : !strcmp(p, "bf16") ? "bf16-mixed" : !strcmp(p, "16") ? "16-mixed" : p;
}

/* trainer.precision (with Lightning's aliases) -> the autocast dtype of the
 * steps (LK_F32: none) and the parameters' dtype. The *-true precisions
 * keep the parameters (and so the gradients) themselves in the low dtype
 * and run the steps under autocast of it: the GEMMs take the 16-bit
 * weights as they are, the fp32-list ops (softmax, losses) still widen. */
static lk_status parse_precision(const char *given, lk_dtype *autocast, lk_dtype *params) {
    *autocast = *params = LK_F32;
    const char *p = lk__precision_name(given);
    if (!strcmp(p, "32-true")) return LK_STATUS_OK;
    if (!strcmp(p, "bf16-mixed")) return (*autocast = LK_BF16), LK_STATUS_OK;
    if (!strcmp(p, "16-mixed")) return (*autocast = LK_F16), LK_STATUS_OK;
    if (!strcmp(p, "bf16-true")) return (*autocast = *params = LK_BF16), LK_STATUS_OK;
    if (!strcmp(p, "16-true")) return (*autocast = *params = LK_F16), LK_STATUS_OK;
    if (!strcmp(p, "64-true") || !strcmp(p, "64"))
        return lk_error(LK_STATUS_UNSUPPORTED, "trainer.precision '%s': f64 training is not supported (use 32-true)", p);
    return lk_error(LK_STATUS_INVALID_ARGUMENT,
                    "trainer.precision '%s' is not one of 32-true, 32, bf16-mixed, bf16, 16-mixed, 16, bf16-true, "
                    "16-true, 64-true, 64", p);
}

/* The checks that need nothing started, and the dtypes they decide: the
 * steps' autocast, the parameters' and the one ddp gradients travel in. */
static lk_status check_config(const lk_trainer_config *cfg, lk_dtype *autocast, lk_dtype *param_dtype,
                              lk_dtype *comm_dtype) {
    *autocast = *param_dtype = *comm_dtype = LK_F32;
    if (cfg->deterministic && cfg->max_time > 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "trainer.deterministic is true but trainer.max_time is set: stopping on wall time "
                        "depends on machine speed, so runs would not be reproducible");
    LK_TRY(parse_precision(cfg->precision, autocast, param_dtype));
    if (cfg->float32_matmul_precision[0])
        LK_TRY(lk__f32_matmul_parse("trainer.float32_matmul_precision", cfg->float32_matmul_precision, NULL));
    *comm_dtype = !strcmp(cfg->ddp_comm_hook, "bf16_compress")   ? LK_BF16
                  : !strcmp(cfg->ddp_comm_hook, "fp16_compress") ? LK_F16
                                                                  : LK_F32;
    if (*param_dtype != LK_F32 && *comm_dtype != LK_F32 && *comm_dtype != *param_dtype)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "trainer.ddp_comm_hook %s sends %s gradients, but under trainer.precision %s the gradients are "
                        "%s: use %s (averaged in place, half the bytes) or none (averaged in f32)",
                        cfg->ddp_comm_hook, lk_dtype_name(*comm_dtype), cfg->precision, lk_dtype_name(*param_dtype),
                        *param_dtype == LK_BF16 ? "bf16_compress" : "fp16_compress");
    return LK_STATUS_OK;
}

lk_status lk_trainer_config_check(const lk_trainer_config *cfg) {
    lk_dtype autocast, param_dtype, comm_dtype;
    return check_config(cfg, &autocast, &param_dtype, &comm_dtype);
}

lk_status lk_trainer_create(const lk_trainer_config *cfg, const lk_optim_settings *optim, const char *config_yaml,
                            lk_trainer **out) {
    *out = NULL;
    LK_TRY(lk__accelerator_check(cfg)); /* device/gpu_select.c: before anything starts */
    lk_dtype autocast, param_dtype, comm_dtype;
    LK_TRY(check_config(cfg, &autocast, &param_dtype, &comm_dtype));
    lk_trainer *tr = lk_calloc(1, sizeof *tr);
    if (!tr) return LK_STATUS_OUT_OF_MEMORY;
    tr->autocast = autocast;
    tr->param_dtype = param_dtype;
    tr->cfg = *cfg;
    if (optim) tr->opt = *optim;
    else lk_optim_settings_default(&tr->opt);
    tr->config_yaml = config_yaml ? lk_strdup(config_yaml) : NULL;
    /* Lightning's aliases become the names they stand for, as its Trainer
     * does: what the log, run.json and checkpoints say. */
    const char *canon = lk__precision_name(cfg->precision);
    if (canon != cfg->precision) {
        if (strcmp(cfg->precision, "32")) /* Lightning warns for these two, not for 32 */
            lk_warn0("trainer.precision %s is Lightning's older name for %s: it runs %s (write %s to say so)",
                     cfg->precision, canon, canon, canon);
        snprintf(tr->cfg.precision, sizeof tr->cfg.precision, "%s", canon);
    }
    tr->best_score = NAN;
    tr->t_start = lk_time_now();
    tr->prev_f32_matmul = lk_float32_matmul_precision(); /* process-wide, as torch's: put back by lk_trainer_free */
    if (cfg->float32_matmul_precision[0]) lk_set_float32_matmul_precision(cfg->float32_matmul_precision);
    tr->replay_at_start = lk__replay_get_stats();
    lk_status st = lk__callbacks_init(tr);
    if (!st) st = lk_pg_info_from_env(&tr->pg);
    if (st) goto fail;
    tr->rank = tr->pg.rank;
    tr->world = tr->pg.world_size;
    bool dp = !strcmp(cfg->strategy, "dp");
    /* The training device: the CPU, or (kind, index for this local rank) */
    st = lk__accelerator_device(cfg, dp ? 0 : tr->pg.local_rank, &tr->dev);
    if (st) goto fail;
    if (tr->dev.kind == LK_CUDA && tr->rank == 0)
        lk_log_warn("GPU training is new in lockstep and has run only on emulations of a GPU in its tests so far "
                    "(issue 21): `ctest -L gpu` in a CUDA build checks this machine's GPU against the CPU");
    if (tr->dev.kind == LK_CPU) {
        /* On the CPU a device is a core: more ranks than cores only fight
         * over them (LK_ALLOW_OVERSUBSCRIBE=1 permits it, e.g. for tests). */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cfg->devices > cores && !lk_env_get_long("LK_ALLOW_OVERSUBSCRIBE", 0)) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "trainer.devices=%lld is more than the %ld CPU cores available on this machine "
                          "(set LK_ALLOW_OVERSUBSCRIBE=1 to run anyway)",
                          (long long)cfg->devices, cores);
            goto fail;
        }
    }
    int64_t want = (cfg->devices > 0 ? cfg->devices : 1) * (cfg->num_nodes > 0 ? cfg->num_nodes : 1);
    if (dp) { /* one process drives every device */
        tr->dp_devices = (int)(cfg->devices > 0 ? cfg->devices : 1);
        want = 1;
        if (cfg->num_nodes > 1) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy 'dp' runs on one node (num_nodes=%lld): use ddp",
                          (long long)cfg->num_nodes);
            goto fail;
        }
    }
    if (tr->world == 1 && want > 1 && !strcmp(tr->pg.source, "none") && cfg->num_nodes <= 1 &&
        strcmp(cfg->strategy, "single") && !dp) { /* auto, or a ddp */
        /* A program of the user's started alone: this process becomes the
         * job's launcher, and its first run starts the ranks (self_launch.c).
         * More than one node needs a launcher on each, so that stays an error. */
        tr->launcher = (int)want;
        *out = tr;
        return LK_STATUS_OK;
    }
    if (tr->world == 1 && want > 1) {
        st = lk_error(LK_STATUS_INVALID_USAGE,
                      "trainer.devices=%lld x num_nodes=%lld needs %lld processes, but this one was started alone: "
                      "run it through `lockstep fit` (which launches them) or `lockstep launch -n %lld -- ...`",
                      (long long)cfg->devices, (long long)cfg->num_nodes, (long long)want, (long long)want);
        goto fail;
    }
    if (tr->world > 1 && cfg->devices > 0 && want != tr->world) {
        st = lk_error(LK_STATUS_INVALID_USAGE,
                      "the launcher started %d processes (WORLD_SIZE), but trainer.devices=%lld x num_nodes=%lld = %lld",
                      tr->world, (long long)cfg->devices, (long long)cfg->num_nodes, (long long)want);
        goto fail;
    }
    if (!strcmp(cfg->strategy, "single") && tr->world > 1) {
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.strategy 'single' runs one process, but %d were started",
                      tr->world);
        goto fail;
    }
    lk_log_set_rank(tr->rank, tr->world);
    tr->test_step_delay_ms = lk_env_get_long("LK_TEST_STEP_DELAY_MS", 0);
    tr->test_overflow_rank = -1;
    const char *ov = lk_env_get("LK_TEST_GRAD_OVERFLOW");
    long long ov_step;
    if (ov && sscanf(ov, "%d:%lld", &tr->test_overflow_rank, &ov_step) == 2) tr->test_overflow_step = ov_step;
    else tr->test_overflow_rank = -1;
    tr->test_nan_rank = -1;
    const char *tn = lk_env_get("LK_TEST_LOSS_NAN");
    long long tn_step;
    if (tn && sscanf(tn, "%d:%lld", &tr->test_nan_rank, &tn_step) == 2) tr->test_nan_step = tn_step;
    else tr->test_nan_rank = -1;
    /* Ranks on one node share its cores: BLAS threads that outnumber them
     * spin against each other. */
    lk__threads_for_ranks(tr->pg.local_world_size > 0 ? tr->pg.local_world_size : 1);
    lk_trainer_config_comm_timeout_from(cfg, tr->comm_timeout_from, sizeof tr->comm_timeout_from);
    const char *forced = lk_env_get("LK_COMM_BACKEND");
    tr->comm_backend_from = forced && *forced && strcmp(forced, "auto") ? "LK_COMM_BACKEND" : "default";
    if (tr->world > 1) {
        lk_comm_config cc = lk_comm_config_default();
        cc.timeout_s = cfg->comm_timeout; /* LK_COMM_TIMEOUT is in it unless the config set the key */
        cc.timeout_from = tr->comm_timeout_from;
        /* Ranks on GPUs talk over nccl where it was built (Lightning's
         * default there), unless LK_COMM_BACKEND names another, or ranks
         * share a GPU (LK_ALLOW_OVERSUBSCRIBE), which nccl refuses: shm. */
        bool shared_gpu = tr->pg.local_world_size > lk_device_count(LK_CUDA);
        for (int i = 0; tr->dev.kind == LK_CUDA && !shared_gpu && !(forced && *forced) && i < lk_comm_backend_count(); i++)
            if (!strcmp(lk_comm_backend_name_at(i), "nccl")) cc.backend = "nccl";
        cc.pg = &tr->pg;
        st = lk_comm_create(&cc, &tr->comm);
        if (st) goto fail;
    }
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = cfg->strategy;
    if (tr->world == 1 && !dp) sc.name = "single"; /* nothing to reduce across processes */
    sc.devices = tr->dp_devices;
    sc.comm = tr->comm;
    sc.bucket_cap_mb = cfg->bucket_cap_mb;
    sc.shared_params = cfg->ddp_shared_params;
    sc.param_dtype = param_dtype;
    sc.comm_dtype = comm_dtype;
    sc.device = tr->dev;
    st = lk_strategy_create(&sc, &tr->strat);
    if (st) goto fail;
    if (sc.comm_dtype != LK_F32 && strcmp(lk_strategy_name(tr->strat), "ddp") && tr->rank == 0)
        lk_log_warn("trainer.ddp_comm_hook %s has no effect: the strategy is %s on %d process%s (it compresses ddp's "
                    "gradient all-reduce between processes)",
                    cfg->ddp_comm_hook, dp ? "dp" : lk_strategy_name(tr->strat), tr->world, tr->world == 1 ? "" : "es");
    *out = tr;
    return LK_STATUS_OK;
fail:
    lk_trainer_free(tr);
    return st;
}

/* A run on a device made it the default (begin_run): the process's own
 * default comes back when the run ends. */
static void end_on_device(lk_trainer *tr) {
    if (tr->default_set) lk_device_set_default(tr->prev_default); /* it was the default before: cannot fail */
    tr->default_set = false;
}

static void run_cleanup(lk_trainer *tr) {
    lk__host_shadows_on(false);
    if (tr->strat) lk_strategy_detach(tr->strat); /* dp: its threads stop and its replicas go */
    end_on_device(tr);
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

void lk_trainer_free(lk_trainer *tr) {
    if (!tr) return;
    run_cleanup(tr);
    if (tr->prev_f32_matmul) lk_set_float32_matmul_precision(tr->prev_f32_matmul);
    lk_strategy_free(tr->strat); /* borrows the parameter arrays below */
    lk_named_tensors_clear(&tr->params);
    lk_named_tensors_clear(&tr->buffers);
    lk_free(tr->param_arr);
    lk_free(tr->buffer_arr);
    lk_free(tr->param_names);
    lk_tensor_release(tr->flat_params);
    lk_tensor_release(tr->flat_grads);
    lk_comm_free(tr->comm);
    lk_free(tr->metrics);
    lk_free(tr->ckpt_rows);
    for (int j = 0; j < tr->nckpts; j++) lk_free(tr->ckpts[j].topk);
    lk_free(tr->config_yaml);
    lk_free(tr);
}

int lk_trainer_rank(const lk_trainer *tr) { return tr->launcher ? -1 : tr->rank; }
int lk_trainer_world_size(const lk_trainer *tr) { return tr->launcher ? tr->launcher : tr->world; }
int64_t lk_trainer_current_epoch(const lk_trainer *tr) { return tr->epoch; }
int64_t lk_trainer_global_step(const lk_trainer *tr) { return tr->global_step; }
const char *lk_trainer_log_dir(const lk_trainer *tr) { return tr->log_dir; }
const char *lk_trainer_last_checkpoint(const lk_trainer *tr) { return tr->last_ckpt; }
const char *lk_trainer_best_checkpoint(const lk_trainer *tr) { return tr->best_ckpt; }

void lk_module_free(lk_module *m) {
    if (!m) return;
    if (m->vt && m->vt->destroy) m->vt->destroy(m);
    lk_layer_free(m->net);
    lk_free(m->hparams_yaml);
    lk_free(m);
}

void lk_datamodule_free(lk_datamodule *dm) {
    if (!dm) return;
    if (dm->vt && dm->vt->destroy) dm->vt->destroy(dm);
    lk_free(dm->hparams_yaml);
    lk_free(dm);
}

lk_tensor *lk_batch_tensor(const lk_batch *b, int field) {
    if (!b || field < 0 || field >= b->nfields) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_batch_tensor: field %d out of range (the batch has %d)", field,
                 b ? b->nfields : 0);
        return NULL;
    }
    const lk_array *a = &b->field[field];
    lk_device dev = lk_device_default();
    if (!lk_device_is_host(dev)) { /* the trainer's loops may have copied it there already (prefetch.c) */
        lk_tensor *staged = NULL;
        if (lk__prefetch_tensor(b, field, dev, &staged)) return NULL;
        if (staged) lk__host_shadow_set(staged, a->data, b, field); /* copied from a->data: its host shadow */
        if (staged) return lk_scope_adopt(staged);
    }
    /* The loader's batch is host memory: on a host-addressable device the
     * field is that device's tensor as it is (the run's ops then put their
     * results there: they follow their first input); a run on another device
     * gets one copy of the field there (one check per field, not per element). */
    lk_device at = lk_device_is_host(dev) ? dev : LK_DEVICE_CPU;
    lk_tensor *t = lk__tensor_wrap_on(at, a->dtype, a->ndim, a->shape, a->data);
    if (t && !lk_device_is_host(dev)) {
        lk_tensor *d = lk_tensor_to(t, dev);
        lk_tensor_release(t);
        t = d;
        lk__host_shadow_set(t, a->data, b, field);
    }
    return lk_scope_adopt(t);
}

/* ---- helpers ------------------------------------------------------------------- */

static int64_t limit_batches(lk_count_or_fraction limit, int64_t n) {
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
static bool prefetching(const lk_trainer *tr) { return !lk_device_is_host(tr->dev); }

/* The fit's prefetcher: onto the trainer's device, or dp's slices onto
 * their replicas' devices (replica k on device k, as step.c places it). */
static lk_status fit_prefetcher(lk_trainer *tr) {
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
static lk_status eval_prefetcher(lk_trainer *tr, lk__prefetch **out) {
    *out = NULL;
    if (!prefetching(tr)) return LK_STATUS_OK;
    if (!tr->pf_eval) LK_TRY(lk__prefetch_create(tr->dev, &tr->pf_eval));
    *out = tr->pf_eval;
    return LK_STATUS_OK;
}

static lk_status make_loader(lk_trainer *tr, lk_dataset *ds, bool train, lk_loader **out) {
    lk_loader_config lc = lk_loader_config_default();
    lc.batch_size = tr->dm->batch_size > 0 ? tr->dm->batch_size : 32;
    lc.shuffle = train && tr->cfg.overfit_batches == 0;
    lc.seed = (uint64_t)tr->cfg.seed;
    lc.rank = tr->rank;
    lc.world_size = tr->world;
    lc.num_workers = tr->dm->num_workers;
    /* Evaluation counts every sample exactly once: no padding, uneven shards
     * (the metric reduction weighs each batch by its size). Training pads so
     * every rank runs the same number of steps. */
    lc.no_pad = !train;
    if (!lk_device_is_host(tr->dev)) {
        lc.alloc = device_host_alloc, lc.free = device_host_free, lc.alloc_ctx = &tr->dev;
        if (prefetching(tr)) lc.hold = 2; /* batch i stays valid while i + 1 is taken */
    }
    return lk_loader_create(ds, &lc, out);
}

static bool is_rank0(const lk_trainer *tr) { return tr->rank == 0; }

/* SyncBatchNorm's all-reduce (trainer.sync_batchnorm). */
static lk_status sum_over_ranks(void *ctx, double *vals, int n) {
    lk_trainer *tr = ctx;
    return lk_comm_all_reduce(tr->comm, vals, (size_t)n, LK_F64, LK_REDUCE_SUM);
}

/* Parameters and buffers of the module, flattened into the strategy's
 * gradient buffer, and the optimizer and scheduler (optim_factory.c). */
static lk_status setup_params(lk_trainer *tr, int64_t steps_per_epoch) {
    lk_module *m = tr->module;
    if (!tr->flat_params) { /* once per trainer: the layer keeps its flat views */
        int64_t total = lk_layer_num_parameters(m->net);
        lk_tensor *gbuf, *pbuf; /* the strategy's */
        bool copy_values;
        LK_TRY(lk_strategy_grad_buffer(tr->strat, total, &gbuf));
        LK_TRY(lk_strategy_param_buffer(tr->strat, total, &pbuf, &copy_values));
        LK_TRY(lk_params_flatten_into(m->net, pbuf, copy_values, gbuf, &tr->flat_params, &tr->flat_grads));
    }
    if (tr->param_arr) /* the strategy holds these from an earlier fit on this trainer */
        return lk_error(LK_STATUS_INVALID_USAGE, "fit: call lk_trainer_fit once per trainer (create another to fit again)");
    LK_TRY(lk_layer_named_parameters(m->net, &tr->params));
    LK_TRY(lk_layer_named_buffers(m->net, &tr->buffers));
    int np = tr->params.n, nb = tr->buffers.n;
    tr->param_arr = lk_calloc((size_t)np + 1, sizeof *tr->param_arr);
    tr->param_names = lk_calloc((size_t)np + 1, sizeof *tr->param_names);
    tr->buffer_arr = lk_calloc((size_t)nb + 1, sizeof *tr->buffer_arr);
    if (!tr->param_arr || !tr->param_names || !tr->buffer_arr) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < np; i++) {
        tr->param_arr[i] = tr->params.items[i].tensor;
        tr->param_names[i] = tr->params.items[i].name;
    }
    int nbf = 0; /* num_batches_tracked (i64) is broadcast too */
    for (int i = 0; i < nb; i++) tr->buffer_arr[nbf++] = tr->buffers.items[i].tensor;
    LK_TRY(lk_strategy_setup(tr->strat, tr->param_arr, tr->param_names, np, tr->buffer_arr, nbf));

    return lk__optim_setup(tr, steps_per_epoch);
}

static lk_status open_outputs(lk_trainer *tr, bool want_logs) {
    if (!is_rank0(tr)) return LK_STATUS_OK;
    if (tr->cfg.enable_progress_bar) {
        lk_progress_options po = lk_progress_options_default();
        po.every_n_steps = (int)tr->cfg.log_every_n_steps;
        LK_TRY(lk_progress_create(&po, &tr->progress));
    }
    if (!want_logs || tr->cfg.fast_dev_run) return LK_STATUS_OK;
    char root[LK_PATH];
    snprintf(root, sizeof root, "%s", tr->cfg.default_root_dir[0] ? tr->cfg.default_root_dir : ".");
    if (tr->cfg.logger_set && tr->cfg.n_loggers == 0) {
        /* logger: false. Lightning's log_dir is then default_root_dir:
         * config.yaml, run.json and checkpoints/ go there. */
        LK_TRY(lk_file_mkdirs(root));
        snprintf(tr->log_dir, sizeof tr->log_dir, "%s", root);
    } else {
        lk_logger *list, *csv;
        LK_TRY(lk_logger_list_create(&list));
        tr->logger = list;
        if (!tr->cfg.logger_set) {
            LK_TRY(lk_csv_logger_create(root, "lightning_logs", -1, &csv));
            LK_TRY(lk_logger_list_add(list, csv));
            const char *dir = lk_logger_log_dir(csv);
            snprintf(tr->log_dir, sizeof tr->log_dir, "%s", dir ? dir : root);
            if (tr->cfg.enable_tensorboard) {
                lk_logger *tb;
                LK_TRY(lk_tb_logger_create(tr->log_dir, &tb));
                LK_TRY(lk_logger_list_add(list, tb));
            }
        }
        int versions[LK_MAX_CALLBACKS];
        for (int i = 0; tr->cfg.logger_set && i < tr->cfg.n_loggers; i++) {
            const lk_logger_config *lc = &tr->cfg.loggers[i];
            const char *save = lc->save_dir[0] ? lc->save_dir : root;
            int version = (int)lc->version;
            /* Loggers sharing save_dir/name and no version share the first's
             * version_N (Lightning resolves both to the same directory). */
            for (int j = 0; j < i && version < 0; j++) {
                const lk_logger_config *o = &tr->cfg.loggers[j];
                if (!strcmp(o->save_dir[0] ? o->save_dir : root, save) && !strcmp(o->name, lc->name)) version = versions[j];
            }
            lk_logger *lg;
            if (!strcmp(lc->kind, "csv")) LK_TRY(lk_csv_logger_create(save, lc->name, version, &lg));
            else LK_TRY(lk_tb_logger_create_versioned(save, lc->name, version, &lg));
            versions[i] = lk_logger_version(lg);
            LK_TRY(lk_logger_list_add(list, lg));
            if (i == 0) {
                const char *dir = lk_logger_log_dir(lg);
                snprintf(tr->log_dir, sizeof tr->log_dir, "%s", dir && *dir ? dir : root);
            }
        }
    }
    lk_logger *list = tr->logger;
    /* hparams.yaml: the model's and data module's init args (save_hyperparameters) */
    char *hp = NULL;
    size_t hl = 0;
    FILE *f = open_memstream(&hp, &hl);
    if (f) {
        if (tr->module && tr->module->hparams_yaml) fputs(tr->module->hparams_yaml, f);
        if (tr->dm && tr->dm->hparams_yaml) fputs(tr->dm->hparams_yaml, f);
        fclose(f);
        if (list) lk_logger_log_hyperparams(list, hp && *hp ? hp : "{}\n");
        free(hp);
    }
    if (tr->config_yaml) {
        char path[LK_PATH + 16];
        snprintf(path, sizeof path, "%s/config.yaml", tr->log_dir);
        LK_TRY(lk_file_write_atomic(path, tr->config_yaml, strlen(tr->config_yaml)));
    }
    return LK_STATUS_OK;
}

/* Every rank agrees whether to stop (max_time, a signal), with one tiny
 * all-reduce per step only when something could make ranks disagree.
 * `check_time` false leaves max_time to the epoch end (Timer(interval="epoch")). */
static lk_status agree_stop(lk_trainer *tr, bool check_time, bool *stop) {
    int32_t local = 0;
    if (lk__stop_signal()) local = 2;
    else if (check_time && tr->cfg.max_time > 0 && lk_time_now() - tr->t_fit_start >= tr->cfg.max_time) local = 1;
    if (tr->world > 1) LK_TRY(lk_comm_all_reduce(tr->comm, &local, 1, LK_I32, LK_REDUCE_MAX));
    if (local == 2) snprintf(tr->stop_reason, sizeof tr->stop_reason, "stopped by a signal");
    else if (local == 1) snprintf(tr->stop_reason, sizeof tr->stop_reason, "max_time (%gs) reached", tr->cfg.max_time);
    *stop = local != 0;
    return LK_STATUS_OK;
}

/* ---- evaluation loops -------------------------------------------------------- */

static lk_status run_eval(lk_trainer *tr, lk_loader *loader, const char *stage, int64_t limit, uint64_t epoch,
                          const char *title) {
    lk_module *m = tr->module;
    const char *saved_stage = tr->stage;
    tr->stage = stage;
    lk__metrics_reset_epoch(tr, stage);
    int64_t n = lk_loader_len(loader);
    if (limit >= 0 && limit < n) n = limit;
    /* Every rank runs the same number of batches (uneven shards: the
     * metric reduction weighs each batch by its size). */
    int64_t n_all = n;
    if (tr->world > 1) {
        double v = (double)n;
        LK_TRY(lk_strategy_reduce(tr->strat, &v, 1, LK_REDUCE_MAX));
        n_all = (int64_t)v;
    }
    lk_layer_train(m->net, false);
    bool prev = lk_set_grad_enabled(false);
    lk_status st = lk_loader_start(loader, epoch, 0);
    lk__prefetch *pf = NULL;
    if (!st) st = eval_prefetcher(tr, &pf);
    if (!st && pf) st = lk__prefetch_begin(pf, loader, n);
    if (tr->progress) lk_progress_begin_eval(tr->progress, title, n);
    for (int64_t i = 0; i < n_all && !st; i++) {
        const lk_batch *b = NULL;
        if (i < n) {
            st = pf ? lk__prefetch_next(pf, &b) : lk_loader_next(loader, &b);
            if (st) break;
        }
        if (!b) continue;
        tr->cur_batch_size = b->size;
        tr->batch_idx = i;
        lk_scope_begin();
        lk_autocast_enter(tr->autocast); /* evaluation runs in the precision it trains in, as Lightning's */
        if (!strcmp(stage, "test")) st = lk_module_test_step(m, b, i, tr);
        else st = lk_module_validation_step(m, b, i, tr);
        lk_autocast_exit();
        lk_scope_end();
        if (tr->progress) lk_progress_update_eval(tr->progress, i + 1);
    }
    lk_status end = lk__prefetch_end(pf); /* no copy in flight when the loader restarts or goes */
    if (!st) st = end;
    lk_set_grad_enabled(prev);
    lk_layer_train(m->net, true);
    if (!st) st = lk__metrics_end_epoch(tr, stage);
    if (!st && tr->progress) {
        const char *names[32];
        double vals[32];
        int k = 0;
        for (int i = 0; i < tr->nmetrics && k < 32; i++)
            if (tr->metrics[i].stage == stage && tr->metrics[i].has_value && tr->metrics[i].on_epoch) {
                names[k] = tr->metrics[i].name;
                vals[k++] = tr->metrics[i].value;
            }
        lk_progress_end_eval(tr->progress, names, vals, k);
    }
    tr->stage = saved_stage;
    return st;
}

/* ---- validation inside fit ------------------------------------------------------ */

static lk_status validate_now(lk_trainer *tr, lk_loader *val, int64_t limit) {
    if (!val || limit == 0) return LK_STATUS_OK;
    LK_TRY(run_eval(tr, val, "val", limit, 0, "Validation"));
    tr->val_ran = true;
    LK_TRY(lk__metrics_log_epoch(tr, "val"));
    if (tr->sched && !strcmp(tr->opt.scheduler, "plateau")) {
        double v;
        if (!lk_trainer_metric(tr, tr->opt.monitor, &v))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "lr_scheduler plateau: monitor '%s' was never logged",
                            tr->opt.monitor);
        LK_TRY(lk_scheduler_step_metric(tr->sched, v));
    }
    for (int j = 0; j < tr->nes; j++) LK_TRY(lk__early_stopping_check(tr, &tr->es[j]));
    return LK_STATUS_OK;
}

/* ---- fit ------------------------------------------------------------------------- */

/* A checkpoint written inside the epoch, after `done` of its batches: it
 * resumes at the next one, with the validation due after batch done - 1
 * when `val_due` (it has not run yet). */
static lk_status ckpt_inside_epoch(lk_trainer *tr, int64_t done, bool val_due, lk_status (*write)(lk_trainer *)) {
    int64_t saved = tr->resume_batch;
    tr->resume_batch = done;
    tr->val_pending = val_due;
    lk_status st = write(tr);
    tr->resume_batch = saved;
    tr->val_pending = false;
    return st;
}

static lk_status fit_loop(lk_trainer *tr, lk_loader *train, lk_loader *val, int64_t n_train, int64_t n_val) {
    lk_module *m = tr->module;
    const lk_trainer_config *c = &tr->cfg;
    int64_t accum = tr->accum;
    int64_t val_every = c->val_check_interval.is_count ? (int64_t)c->val_check_interval.value
                                                       : (int64_t)floor(c->val_check_interval.value * (double)n_train);
    if (val_every < 1) val_every = 1;
    lk_layer_train(m->net, true);
    tr->stage = "train";
    bool stop = false;
    bool epoch_timer = !strcmp(c->time_check_interval, "epoch"); /* Timer(interval="epoch") */
    for (; !stop && !tr->should_stop && (c->max_epochs < 0 || tr->epoch < c->max_epochs); tr->epoch++) {
        if (!tr->epoch_restored) { /* a resumed epoch's sums so far came with its checkpoint */
            lk__metrics_reset_epoch(tr, "train");
            LK_TRY(lk__log_lr_epoch(tr));
        }
        tr->epoch_restored = false;
        LK_TRY(lk_loader_start(train, (uint64_t)tr->epoch, tr->resume_batch));
        if (tr->pf) LK_TRY(lk__prefetch_begin(tr->pf, train, n_train - tr->resume_batch));
        if (tr->progress) lk_progress_begin_epoch(tr->progress, tr->epoch, c->max_epochs, n_train);
        bool validate_epoch = ((tr->epoch + 1) % c->check_val_every_n_epoch) == 0;
        bool int_interval = c->val_check_interval.is_count;
        if (tr->val_pending) { /* the validation due after the batch the checkpoint was written at */
            tr->val_pending = false;
            LK_TRY(validate_now(tr, val, n_val));
            LK_TRY(ckpt_inside_epoch(tr, tr->resume_batch, false, lk__ckpt_callback));
            tr->stage = "train";
        }
        /* Stopped (a signal, max_time, max_steps) with batches of the epoch
         * done: its end (row, validation, scheduler, epoch checkpoint) is
         * left to the resume, and last.ckpt resumes at the next batch. Only
         * max_steps on the epoch's last batch ends the epoch here: that is
         * where training ends. */
        bool defer_end = false;
        for (int64_t i = tr->resume_batch; i < n_train; i++) {
            double t0 = lk_time_now();
            const lk_batch *b;
            LK_TRY(tr->pf ? lk__prefetch_next(tr->pf, &b) : lk_loader_next(train, &b));
            if (!b) break;
            double t1 = lk_time_now();
            tr->batch_idx = i;
            tr->cur_batch_size = b->size;
            bool sync = ((i + 1) % accum == 0) || i + 1 == n_train;
            tr->step_t0 = t0, tr->step_t1 = t1;
            lk_step_args sa = {.batch = b, .batch_idx = i, .sync = sync, .loss_mul = 1.0f / (float)accum,
                               .loss_scale = lk_grad_scaler_scale(tr->scaler), .autocast = tr->autocast};
            lk_step_result sr;
            size_t live0 = lk_pool_reset_peak();
            lk_status step_st = lk_strategy_training_step(tr->strat, &sa, &sr);
            lk__host_shadow_clear(); /* the batch's host memory may be refilled from here on */
            LK_TRY(step_st);
            bool skip = false;
            if (!sync) LK_TRY(lk__step_checks(tr, false, &sr.loss, &skip)); /* the loss alone: no gradient is final */
            if (tr->global_step >= 1) { /* the first step also makes the optimizer's state and caches */
                size_t peak = lk_pool_get_stats().bytes_live_peak - live0;
                if (peak > tr->step_peak_bytes) tr->step_peak_bytes = peak;
            }
            if (sync) tr->sum_comm_wait += lk_strategy_get_stats(tr->strat).comm_straggler_last_s;
            tr->sum_data += t1 - t0;
            tr->sum_fwd += sr.t_fwd;
            tr->sum_bwd += sr.t_bwd;
            tr->sum_comm += sr.t_comm;
            tr->samples_seen += b->size;
            if (sync) {
                double t5 = lk_time_now();
                lk__optimizer_prewake(tr->optim);
                if (tr->rank == tr->test_overflow_rank && tr->global_step == tr->test_overflow_step && tr->params.n &&
                    tr->params.items[0].tensor->grad) /* one rank only, after the all-reduce: only the reduced flag skips everywhere */
                {
                    static const float inf = INFINITY; /* written where the gradient lives */
                    lk_tensor *g = tr->params.items[0].tensor->grad;
                    LK_TRY(lk_device_copy(g->device, g->data, LK_DEVICE_CPU, &inf, sizeof inf));
                }
                /* the step's one read: the loss with the gradients' checks */
                LK_TRY(lk__step_checks(tr, true, &sr.loss, &skip));
                if (!skip) lk__clip_gradients(tr);
                /* the step unless skipped, then the strategy's part (shard sync, dp's copy out) and zero_grad */
                LK_TRY(lk_strategy_optimizer_step(tr->strat, tr->optim, skip));
                if (tr->scaler) LK_TRY(lk_grad_scaler_update(tr->scaler, skip));
                { /* the shards' sync is communication: booked there, not as optimizer time */
                    lk_strategy_stats ss = lk_strategy_get_stats(tr->strat);
                    tr->sum_comm += ss.step_sync_last_s;
                    tr->sum_comm_wait += ss.step_straggler_last_s;
                    t5 += ss.step_sync_last_s;
                }
                if (tr->sched && !strcmp(tr->opt.interval, "step") && strcmp(tr->opt.scheduler, "plateau"))
                    LK_TRY(lk_scheduler_step(tr->sched));
                tr->sum_opt += lk_time_now() - t5;
                lk__prof_optimizer(tr->prof, t5, lk_time_now());
                if (tr->test_step_delay_ms > 0) /* tests that signal a run mid-way need it to last */
                    nanosleep(&(struct timespec){tr->test_step_delay_ms / 1000, (tr->test_step_delay_ms % 1000) * 1000000L}, NULL);
                tr->timed_steps++;
                tr->global_step++;
                if (tr->global_step == 1) tr->t_first_step = lk_time_now();
                /* Throughput counts from the 5th step on: the first ones warm
                 * caches, the storage pool and the BLAS threads. */
                if (tr->global_step == 5) {
                    tr->t_steady = lk_time_now();
                    tr->samples_steady = tr->samples_seen;
                    tr->sum_at_steady[0] = tr->sum_data, tr->sum_at_steady[1] = tr->sum_fwd;
                    tr->sum_at_steady[2] = tr->sum_bwd, tr->sum_at_steady[3] = tr->sum_comm;
                    tr->sum_at_steady[4] = tr->sum_opt, tr->sum_at_steady[5] = tr->sum_comm_wait;
                }
                if (tr->global_step % c->log_every_n_steps == 0) {
                    LK_TRY(lk__log_lr(tr));
                    LK_TRY(lk__log_scale(tr));
                    LK_TRY(lk__log_device_stats(tr));
                    if (tr->logger) LK_TRY(lk__metrics_log_step(tr));
                }
                /* A fraction validates at its multiples and at the epoch end (below); an
                 * integer N validates every N batches only, as Lightning does. */
                bool val_due = validate_epoch && (i + 1) % val_every == 0 && (int_interval || i + 1 < n_train);
                if (lk__ckpt_due_steps(tr) && i + 1 < n_train)
                    LK_TRY(ckpt_inside_epoch(tr, i + 1, val_due, lk__ckpt_callback_last));
                bool max_steps = c->max_steps >= 0 && tr->global_step >= c->max_steps;
                if (max_steps) {
                    stop = true;
                    snprintf(tr->stop_reason, sizeof tr->stop_reason, "max_steps=%lld reached", (long long)c->max_steps);
                }
                bool agreed;
                LK_TRY(agree_stop(tr, !epoch_timer, &agreed));
                stop = stop || agreed;
                if (stop && (agreed || i + 1 < n_train)) {
                    defer_end = true;
                    LK_TRY(ckpt_inside_epoch(tr, i + 1, val_due, lk__ckpt_callback_stop));
                }
            }
            if (tr->progress) {
                const char *names[16];
                double vals[16];
                int k = lk__metrics_prog_bar(tr, names, vals, 16);
                lk_progress_update(tr->progress, i + 1, names, vals, k);
            }
            if (validate_epoch && (i + 1) % val_every == 0 && (int_interval || i + 1 < n_train) && !defer_end) {
                LK_TRY(validate_now(tr, val, n_val));
                LK_TRY(ckpt_inside_epoch(tr, i + 1, false, lk__ckpt_callback));
                tr->stage = "train";
            }
            if (stop || tr->should_stop) break;
        }
        if (defer_end) {
            LK_TRY(lk__prefetch_end(tr->pf));
            tr->resume_batch = 0;
            break; /* (the epoch counter stays: the resume finishes this epoch) */
        }
        LK_TRY(lk__prefetch_end(tr->pf)); /* no copy in flight once the loader restarts */
        tr->resume_batch = 0;
        LK_TRY(lk__metrics_end_epoch(tr, "train"));
        if (tr->logger) LK_TRY(lk__metrics_log_epoch(tr, "train"));
        if (tr->progress) {
            const char *names[16];
            double vals[16];
            int k = lk__metrics_prog_bar(tr, names, vals, 16);
            lk_progress_end_epoch(tr->progress, names, vals, k);
        }
        if (validate_epoch && !c->val_check_interval.is_count) LK_TRY(validate_now(tr, val, n_val));
        if (tr->sched && !strcmp(tr->opt.interval, "epoch") && strcmp(tr->opt.scheduler, "plateau"))
            LK_TRY(lk_scheduler_step(tr->sched));
        tr->stage = "train";
        tr->at_epoch_end = true; /* checkpoints written now resume at the next epoch */
        lk_status st = lk__ckpt_callback(tr);
        tr->at_epoch_end = false;
        LK_TRY(st);
        if (epoch_timer && !stop) LK_TRY(agree_stop(tr, true, &stop)); /* the whole epoch ran: now the time */
    }
    return LK_STATUS_OK;
}

/* How many times this job was restarted: torchrun's (and `lockstep launch
 * --max-restarts`') TORCHELASTIC_RESTART_COUNT or SLURM's requeue count. */
static long restart_count(const char **which) {
    static const char *const vars[] = {"TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"};
    long best = 0;
    *which = vars[0];
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(vars[i]);
        long x = v && *v ? strtol(v, NULL, 10) : 0;
        if (x > best) best = x, *which = vars[i];
    }
    return best;
}

static lk_status begin_run(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *stage) {
    if (!m || !m->vt || !m->net) return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer: a module with a network is required");
    if (!dm || !dm->vt || !dm->vt->setup || !dm->vt->dataset)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer: a data module with setup() and dataset() is required");
    tr->module = m;
    tr->dm = dm;
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
    LK_TRY(dm->vt->setup(dm, stage));
    return lk__builtin_input_check(m, dm, stage);
}

lk_status lk_trainer_fit(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path) {
    if (tr->launcher) return lk__self_launch(tr, "fit");
    const lk_trainer_config *c = &tr->cfg;
    tr->t_fit_start = lk_time_now();
    lk_loader *train = NULL, *val = NULL;
    lk__sig_state sigs;
    lk__signals_install(&sigs);
    lk_status st = begin_run(tr, m, dm, "fit");
    lk_dataset *train_ds = st ? NULL : dm->vt->dataset(dm, "train");
    lk_dataset *val_ds = st ? NULL : dm->vt->dataset(dm, "val");
    if (!st && !train_ds) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "data module '%s' has no training set", dm->name);
    if (!st && !m->vt->training_step && !(m->vt->forward && m->vt->loss))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "module '%s' has no training_step (and no forward and loss to compose one)", m->name);
    if (!st) st = make_loader(tr, train_ds, true, &train);
    if (!st && prefetching(tr)) st = fit_prefetcher(tr);
    if (!st && (val_ds || c->overfit_batches)) st = make_loader(tr, c->overfit_batches ? train_ds : val_ds, false, &val);
    int64_t n_train = 0, n_val = 0;
    if (!st) {
        n_train = limit_batches(c->limit_train_batches, lk_loader_len(train));
        n_val = val ? limit_batches(c->limit_val_batches, lk_loader_len(val)) : 0;
        if (c->overfit_batches) n_train = n_val = c->overfit_batches < lk_loader_len(train) ? c->overfit_batches : lk_loader_len(train);
        if (c->fast_dev_run) {
            n_train = c->fast_dev_run < n_train ? c->fast_dev_run : n_train;
            n_val = c->fast_dev_run < n_val ? c->fast_dev_run : n_val;
        }
        tr->accum = c->accumulate_grad_batches;
        if (c->global_batch_size > 0) {
            int64_t per = dm->batch_size * tr->world;
            if (c->global_batch_size % per)
                st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                              "trainer.global_batch_size %lld is not a multiple of batch_size %lld x %d ranks = %lld",
                              (long long)c->global_batch_size, (long long)dm->batch_size, tr->world, (long long)per);
            else tr->accum = c->global_batch_size / per;
        }
        if (n_train == 0 && !st) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "no training batches (limit_train_batches=%g)", c->limit_train_batches.value);
    }
    if (!st) st = setup_params(tr, n_train / (tr->accum ? tr->accum : 1) + 1);
    if (!st) st = lk__prof_create(tr);
    if (!st && c->sync_batchnorm && tr->world > 1) {
        int k = lk_layer_sync_batchnorm(m->net, sum_over_ranks, tr);
        lk_log0("sync_batchnorm: %d batch norm layer%s compute statistics over all %d ranks", k, k == 1 ? "" : "s",
                tr->world);
    }
    if (!st) {
        lk_step_fn fn = lk__step_fn(tr);
        st = lk_strategy_attach(tr->strat, &fn);
    }
    if (!st && is_rank0(tr)) { /* temporaries of writers killed before their rename (a full-size last.ckpt.tmp.<pid>) */
        char root[LK_PATH + 32];
        snprintf(root, sizeof root, "%s/lightning_logs", c->default_root_dir[0] ? c->default_root_dir : ".");
        int removed = lk__out_remove_stale_tmp(root);
        if (removed) lk_log0("removed %d stale temporary file%s of dead writers under %s", removed, removed > 1 ? "s" : "", root);
    }
    const char *restart_var = NULL;
    long restarts = restart_count(&restart_var);
    if (!st && (!ckpt_path || !*ckpt_path) && restarts > 0) {
        /* A restarted job (launch --max-restarts, a requeued SLURM job)
         * resumes from its last checkpoint by itself, as Lightning's
         * auto-requeue does; with none written yet it starts over. */
        char path[LK_PATH];
        if (lk__ckpt_resolve(tr, "last", path, sizeof path) == LK_STATUS_OK) ckpt_path = "last";
        else lk_clear_error();
        lk_log0("%s=%ld: %s", restart_var, restarts,
                ckpt_path ? "a restarted job: resuming from the last checkpoint"
                          : "a restarted job, but no last.ckpt was written yet: training from the start");
    }
    if (!st && ckpt_path && *ckpt_path) {
        char path[LK_PATH];
        st = lk__ckpt_resolve(tr, ckpt_path, path, sizeof path);
        if (!st) st = lk__ckpt_load(tr, path, true);
        if (!st) lk_log0("resumed from %s at epoch %lld, step %lld, batch %lld", path, (long long)tr->epoch,
                         (long long)tr->global_step, (long long)tr->resume_batch);
    }
    if (!st) st = open_outputs(tr, true);
    if (!st) lk__ckpt_adopt(tr); /* the resumed top-k, now that the checkpoint directory is known */
    if (!st && is_rank0(tr)) {
        lk_log0("lockstep %s: fit %s on %d process%s (%s), %lld parameters, %lld train / %lld val batches per epoch%s",
                LK_VERSION_STRING, m->name, tr->world, tr->world > 1 ? "es" : "",
                lk_strategy_summary(tr->strat),
                (long long)lk_layer_num_parameters(m->net), (long long)n_train, (long long)n_val,
                tr->accum > 1 ? " (accumulating gradients)" : "");
        if (tr->log_dir[0]) lk_log0("logs: %s", tr->log_dir);
        if (tr->autocast != LK_F32) {
            /* said once: a precision whose GEMMs cannot run natively here
             * (no instructions for it, or none that oneDNN uses) still
             * trains correctly, but through f32 and so not faster */
            const char *dt = lk_dtype_name(tr->autocast), *path = lk__train_gemm_path(tr);
            if (tr->dev.kind == LK_CUDA)
                lk_log0("precision %s: matrix products in %s on the GPU (%s)", c->precision, dt, path);
            else if (lk__cpu_gemm_native(tr->autocast))
                lk_log0("precision %s: matrix products in %s on this CPU's own units (%s)", c->precision, dt, path);
            else
                lk_log0("precision %s: no %s matrix product runs natively here; they run through %s (correct, "
                        "not faster than 32-true)",
                        c->precision, dt, path);
        }
        lk__cuda_props gp;
        if (tr->dev.kind == LK_CUDA && tr->autocast == LK_F32 && tr->param_dtype == LK_F32 &&
            !lk__f32_matmul_reduced() && !lk__cuda_props_get(tr->dev.index, &gp) && gp.major >= 8)
            /* as Lightning's hint on a GPU with tensor cores */
            lk_log0("%s has TF32 tensor cores: trainer.float32_matmul_precision high lets 32-true's matrix products "
                    "use them (faster, with a 10-bit mantissa), as torch.set_float32_matmul_precision('high') does",
                    gp.name);
        if (c->enable_model_summary && c->model_summary_max_depth != 0) {
            char *table = NULL;
            if (lk_model_summary(m->net, (int)c->model_summary_max_depth, &table) == LK_STATUS_OK) {
                printf("\n%s\n", table);
                fflush(stdout);
            } else {
                lk_log_warn("model summary: %s", lk_last_error()); /* a table is not worth failing the fit */
            }
            lk_free(table);
        }
    }
    /* Sanity check: a few validation batches before training (not logged). */
    if (!st && val && c->num_sanity_val_steps != 0 && !ckpt_path && !c->fast_dev_run) {
        int64_t k = c->num_sanity_val_steps < 0 ? n_val : (c->num_sanity_val_steps < n_val ? c->num_sanity_val_steps : n_val);
        if (k > 0) st = run_eval(tr, val, "val", k, 0, "Sanity Checking");
        for (int i = 0; i < tr->nmetrics; i++)
            if (tr->metrics[i].stage && !strcmp(tr->metrics[i].stage, "val")) tr->metrics[i].has_value = false, tr->metrics[i].epoch_any = false;
    }
    double t_train = lk_time_now();
    /* fast_dev_run: N batches of one epoch, as Lightning's (max_epochs=1) */
    if (c->fast_dev_run) tr->cfg.max_epochs = 1;
    if (!st) st = fit_loop(tr, train, val, n_train, n_val);
    if (st && c->on_exception_ckpt[0] && tr->param_arr && is_rank0(tr)) {
        /* OnExceptionCheckpoint: the state as it was when fit failed (rank 0
         * alone: the other ranks may be gone, so no barrier). */
        char msg[2048], dir[LK_PARAM_STR];
        snprintf(msg, sizeof msg, "%s", lk_last_error());
        snprintf(dir, sizeof dir, "%s", c->on_exception_ckpt);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        lk_status s2 = slash ? lk_file_mkdirs(dir) : LK_STATUS_OK;
        if (!s2) s2 = lk__ckpt_save(tr, c->on_exception_ckpt);
        if (s2) lk_log_warn("OnExceptionCheckpoint: could not write %s: %s", c->on_exception_ckpt, lk_last_error());
        else lk_log0("OnExceptionCheckpoint: saved %s", c->on_exception_ckpt);
        const char *m = msg; /* lk_error adds the rank prefix again */
        if (!strncmp(m, "[rank ", 6) && strstr(m, "] ")) m = strstr(m, "] ") + 2;
        lk_error(st, "%s", m);
    }
    tr->t_train_end = lk_time_now();
    tr->train_time = tr->t_train_end - t_train;
    if (!st && tr->stop_reason[0]) lk_log0("%s", tr->stop_reason);
    if (!st && lk__stop_signal()) st = lk_error(LK_STATUS_ABORTED, "stopped by signal %d after writing last.ckpt", lk__stop_signal());
    /* The run's error, before run.json, the logger or cleanup (which may
     * fail on the same full disk) can replace it. */
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", lk_last_error());
    if (!st && is_rank0(tr) && m->vt->on_stage_end) {
        lk_status s2 = m->vt->on_stage_end(m, tr, "fit");
        if (s2) lk_log_warn("on_stage_end: %s", lk_last_error());
    }
    lk__print_profile(tr);
    if (!st) st = lk__prof_finish(tr);
    lk__write_runinfo(tr, "fit", st);
    if (tr->logger) lk_logger_finalize(tr->logger, st ? "failed" : "success");
    lk__prefetch_free(tr->pf); /* before its loader: its copies read the loader's memory */
    tr->pf = NULL;
    lk_loader_free(train);
    lk_loader_free(val);
    if (c->sync_batchnorm && m) lk_layer_sync_batchnorm(m->net, NULL, NULL); /* the module outlives this trainer's comm */
    lk_status saved = st;
    /* Peers still waiting for this rank (it failed alone: a non-finite loss,
     * a bad file) then say why it left rather than suspect a desync. */
    if (saved && tr->comm) lk_comm_set_leave_reason(tr->comm, msg[0] == '[' && strchr(msg, ']') ? strchr(msg, ']') + 2 : msg);
    run_cleanup(tr);
    lk__signals_restore(&sigs);
    if (saved) lk_error(saved, "%s", msg[0] == '[' ? strchr(msg, ']') + 2 : msg);
    return saved;
}

/* validate / test share one shape. */
static lk_status eval_command(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path,
                              const char *command, const char *stage, const char *split, lk_count_or_fraction limit_frac,
                              const char *title) {
    lk_loader *loader = NULL;
    tr->t_fit_start = lk_time_now();
    lk_status st = begin_run(tr, m, dm, !strcmp(command, "validate") ? "validate" : "test");
    lk_dataset *ds = st ? NULL : dm->vt->dataset(dm, split);
    if (!st && !ds) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "data module '%s' has no %s set", dm->name, split);
    if (!st && ckpt_path && *ckpt_path) {
        char path[LK_PATH];
        st = lk__ckpt_resolve(tr, ckpt_path, path, sizeof path);
        if (!st) st = lk__ckpt_load(tr, path, false);
        if (!st) snprintf(tr->last_ckpt, sizeof tr->last_ckpt, "%s", path); /* the checkpoint evaluated */
    }
    if (!st) st = make_loader(tr, ds, false, &loader);
    if (!st && !tr->log_dir[0]) st = open_outputs(tr, true);
    else if (!st && is_rank0(tr) && !tr->progress && tr->cfg.enable_progress_bar) {
        lk_progress_options po = lk_progress_options_default();
        st = lk_progress_create(&po, &tr->progress);
    }
    if (!st) {
        int64_t n = limit_batches(limit_frac, lk_loader_len(loader));
        if (tr->cfg.fast_dev_run && tr->cfg.fast_dev_run < n) n = tr->cfg.fast_dev_run;
        st = run_eval(tr, loader, stage, n, 0, title);
    }
    if (!st) st = lk__metrics_log_epoch(tr, stage);
    if (!st && is_rank0(tr)) {
        printf("\n%-24s %s\n", !strcmp(stage, "test") ? "Test metric" : "Validate metric", "DataLoader 0");
        for (int i = 0; i < tr->nmetrics; i++)
            if (tr->metrics[i].stage && !strcmp(tr->metrics[i].stage, stage) && tr->metrics[i].has_value)
                printf("%-24s %.6g\n", tr->metrics[i].name, tr->metrics[i].value);
        fflush(stdout);
    }
    if (!st && m->vt->on_stage_end && is_rank0(tr)) {
        lk_status s2 = m->vt->on_stage_end(m, tr, stage);
        if (s2) lk_log_warn("on_stage_end: %s", lk_last_error());
    }
    lk__write_runinfo(tr, command, st);
    if (tr->logger) lk_logger_flush(tr->logger);
    lk_loader_free(loader);
    end_on_device(tr);
    return st;
}

lk_status lk_trainer_validate(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path) {
    if (tr->launcher) return lk__self_launch(tr, "validate");
    return eval_command(tr, m, dm, ckpt_path, "validate", "val", "val", tr->cfg.limit_val_batches, "Validation");
}

lk_status lk_trainer_test(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path) {
    if (tr->launcher) return lk__self_launch(tr, "test");
    return eval_command(tr, m, dm, ckpt_path, "test", "test", "test", tr->cfg.limit_test_batches, "Testing");
}

lk_status lk_trainer_predict(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path) {
    if (tr->launcher) return lk__self_launch(tr, "predict");
    lk_loader *loader = NULL;
    lk_status st = begin_run(tr, m, dm, "predict");
    lk_dataset *ds = st ? NULL : dm->vt->dataset(dm, "predict");
    if (!st && !ds) ds = dm->vt->dataset(dm, "test");
    if (!st && !ds) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "data module '%s' has no predict (or test) set", dm->name);
    if (!st && !m->vt->predict_step && !m->vt->forward)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "module '%s' has no predict_step (and no forward)", m->name);
    if (!st && ckpt_path && *ckpt_path) {
        char path[LK_PATH];
        st = lk__ckpt_resolve(tr, ckpt_path, path, sizeof path);
        if (!st) st = lk__ckpt_load(tr, path, false);
    }
    if (!st) st = make_loader(tr, ds, false, &loader);
    if (!st && !tr->log_dir[0]) st = open_outputs(tr, true);
    lk__pred *pred = NULL;
    if (!st) st = lk__pred_create(&pred);
    int64_t n = st ? 0 : limit_batches(tr->cfg.limit_predict_batches, lk_loader_len(loader));
    if (!st) st = lk_loader_start(loader, 0, 0);
    lk__prefetch *pf = NULL;
    if (!st) st = eval_prefetcher(tr, &pf);
    if (!st && pf) st = lk__prefetch_begin(pf, loader, n);
    tr->stage = "predict";
    lk_layer_train(m->net, false);
    bool prev = lk_set_grad_enabled(false);
    for (int64_t i = 0; i < n && !st; i++) {
        const lk_batch *b;
        st = pf ? lk__prefetch_next(pf, &b) : lk_loader_next(loader, &b);
        if (st || !b) break;
        lk_scope_begin();
        lk_autocast_enter(tr->autocast);
        lk_tensor *p = lk_module_predict_step(m, b, i, tr);
        lk_autocast_exit();
        if (!p) st = lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_USAGE, "predict_step returned nothing");
        lk_tensor *c = p ? lk_tensor_cast(p, LK_F32) : NULL;
        if (p && !c) st = lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
        if (c) st = lk__pred_add(pred, c, b);
        lk_tensor_release(c);
        lk_scope_end();
    }
    lk_status end = lk__prefetch_end(pf);
    if (!st) st = end;
    lk_set_grad_enabled(prev);
    lk_layer_train(m->net, true);
    /* Rows of every rank, in dataset order, each sample once, in one .npy on
     * rank 0. A rank that failed above must not leave the others waiting in
     * the gather: all agree first. */
    if (tr->world > 1) {
        int32_t code = (int32_t)st;
        lk_status cs = lk_comm_all_reduce(tr->comm, &code, 1, LK_I32, LK_REDUCE_MAX);
        if (!st && cs) st = cs;
        if (!st && code) st = lk_error((lk_status)code, "another rank failed in predict");
    }
    char path[LK_PATH + 64] = "", shape[128] = "";
    int64_t rows = 0;
    snprintf(path, sizeof path, "%s/predictions.npy", tr->log_dir);
    if (!st) st = lk__pred_write(pred, tr->comm, tr->rank, tr->world, lk_dataset_len(ds), path, &rows, shape, sizeof shape);
    lk__pred_free(pred);
    if (!st && is_rank0(tr)) {
        if (rows) lk_log0("predictions: %s f32 in %s (dataset order; numpy.load reads it)", shape, path);
        else lk_log0("predictions: none (no predict batch ran)");
    }
    lk__write_runinfo(tr, "predict", st);
    lk_loader_free(loader);
    end_on_device(tr);
    return st;
}

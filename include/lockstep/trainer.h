/* lockstep/trainer.h — the Trainer, the module and data-module interfaces,
 * and metric logging, with PyTorch Lightning's names and defaults.
 *
 * A module is what Lightning calls a LightningModule: the network (an
 * lk_layer that owns the parameters) plus the steps. A data module owns
 * datasets; the trainer builds the loaders with the distributed sampler, so
 * every rank sees its own shard. The trainer runs the loops, asks the
 * strategy to reduce gradients, steps the optimizer, logs and checkpoints.
 *
 *     static lk_tensor *my_training_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
 *         lk_tensor *x = lk_batch_tensor(b, 0), *y = lk_batch_tensor(b, 1);
 *         lk_tensor *loss = lk_cross_entropy(lk_layer_forward(m->net, x), y, NULL);
 *         lk_log_metric(tr, "train_loss", lk_tensor_item(loss), &(lk_log_opts){.prog_bar = true});
 *         return loss;
 *     }
 *
 * Or the forward and the loss apart (a pipeline stage runs the forward
 * without the loss); training_step, validation_step, test_step and
 * predict_step then come for free (train_loss, val_loss, test_loss logged):
 *
 *     static lk_tensor *my_forward(lk_module *m, const lk_batch *b) {
 *         return lk_layer_forward(m->net, lk_batch_tensor(b, 0));
 *     }
 *     static lk_tensor *my_loss(lk_module *m, lk_tensor *out, const lk_batch *b) {
 *         return lk_cross_entropy(out, lk_batch_tensor(b, 1), NULL);
 *     }
 *     static const lk_module_vtable my_vt = {.forward = my_forward, .loss = my_loss};
 *
 * Every run writes under <default_root_dir>/lightning_logs/version_N/:
 * metrics.csv, hparams.yaml, config.yaml, run.json, checkpoints/.
 */
#ifndef LOCKSTEP_TRAINER_H
#define LOCKSTEP_TRAINER_H

#include "lockstep/data.h"
#include "lockstep/models.h"
#include "lockstep/nn.h"
#include "lockstep/optim.h"
#include "lockstep/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lk_trainer lk_trainer;
typedef struct lk_module lk_module;
typedef struct lk_datamodule lk_datamodule;

/* ---- trainer configuration (Lightning's flag names) ----------------------- */

/* Callbacks and loggers given as class_path entries (trainer.callbacks,
 * trainer.logger), with Lightning's init_args names. The flat
 * trainer.monitor / early_stopping_* keys are shorthands for one of each. */
#define LK_MAX_CALLBACKS 8
typedef struct lk_checkpoint_config { /* ModelCheckpoint */
    char dirpath[LK_PARAM_STR];  /* "": <log_dir>/checkpoints */
    char filename[LK_PARAM_STR]; /* "{epoch}-{val_loss:.3f}" */
    char monitor[LK_PARAM_STR];  /* "": rank by step (keeps the newest save_top_k) */
    char mode[LK_PARAM_STR];     /* min | max */
    int64_t save_top_k;          /* -1: all; 0: none */
    bool save_last, verbose, auto_insert_metric_name;
    int64_t every_n_train_steps; /* 0: off */
    int64_t every_n_epochs;      /* top-k at the end of every Nth epoch (0: never) */
    bool save_weights_only;      /* top-k files hold the model's weights only (last.ckpt stays complete) */
    bool save_on_train_epoch_end; /* accepted (any value): lockstep saves after validation, and at the epoch end */
    bool enable_version_counter;  /* accepted (any value): file names carry the epoch and step */
    char train_time_interval[LK_PARAM_STR]; /* only "" (null): lockstep saves by steps and epochs */
} lk_checkpoint_config;
typedef struct lk_early_stopping_config { /* EarlyStopping */
    char monitor[LK_PARAM_STR];
    char mode[LK_PARAM_STR];
    double min_delta;
    int64_t patience;
    bool strict;        /* a monitor that was never logged is an error (false: skip the check) */
    bool check_finite, verbose;
    double stopping_threshold, divergence_threshold; /* NaN: off */
    bool check_on_train_epoch_end, log_rank_zero_only; /* accepted (any value): checked after each validation, on rank 0's word */
} lk_early_stopping_config;
typedef struct lk_logger_config { /* CSVLogger, TensorBoardLogger */
    char kind[LK_PARAM_STR];     /* csv | tensorboard */
    char save_dir[LK_PARAM_STR]; /* "": default_root_dir */
    char name[LK_PARAM_STR];     /* "lightning_logs" */
    int64_t version;             /* -1: the next free version_N */
} lk_logger_config;

typedef struct lk_config_node lk_config_node;

typedef struct lk_trainer_config {
    char accelerator[LK_PARAM_STR]; /* cpu | gpu | cuda | auto, or (C API) a registered device kind's name */
    int64_t devices;                /* processes (CPU) or GPUs; 0 = auto (1 on CPU) */
    char devices_spec[LK_PARAM_STR]; /* devices when a list or -1 was written ("[0, 2]", "0,2", "-1"); "" otherwise */
    char strategy[LK_PARAM_STR];    /* auto | single | ddp | ddp_spawn | dp | model_parallel | pipeline */
    int64_t num_nodes;
    char precision[LK_PARAM_STR];   /* 32-true | bf16-mixed | 16-mixed | bf16-true | 16-true | 64-true (and aliases) */
    char float32_matmul_precision[LK_PARAM_STR]; /* highest | high | medium (lk_set_float32_matmul_precision) */
    int64_t max_epochs;             /* -1: unlimited (then max_steps or max_time must stop it) */
    int64_t min_epochs;
    int64_t max_steps;              /* -1: no limit */
    double max_time;                /* seconds; 0: no limit */
    int64_t accumulate_grad_batches;
    double gradient_clip_val;       /* 0: off */
    char gradient_clip_algorithm[LK_PARAM_STR]; /* norm | value */
    int64_t num_sanity_val_steps;
    lk_count_or_fraction limit_train_batches; /* int: batches; float: fraction of the epoch (Lightning) */
    lk_count_or_fraction limit_val_batches;
    lk_count_or_fraction limit_test_batches;
    lk_count_or_fraction limit_predict_batches;
    lk_count_or_fraction val_check_interval;  /* float: fraction of an epoch; int: every N training batches */
    int64_t check_val_every_n_epoch; /* 0 (null in a config): val_check_interval counts batches across epochs */
    int64_t log_every_n_steps;
    bool enable_progress_bar;
    bool enable_checkpointing;
    char default_root_dir[LK_PARAM_STR];
    bool deterministic;
    int64_t fast_dev_run;           /* 0 off; N: N batches of each loop, no logs or checkpoints */
    lk_count_or_fraction overfit_batches; /* int: the first N training batches; float: that fraction of them */
    int64_t seed;                   /* seed_everything(seed, workers=True) */
    double comm_timeout;            /* seconds any collective may wait */
    double checkpoint_timeout;      /* seconds the other ranks wait for rank 0's checkpoint write or data download */
    double memory_limit_mb;         /* per-rank cap on lockstep's host allocations, MiB (0: LK_MEMORY_LIMIT_MB, else none) */
    double bucket_cap_mb;           /* ddp bucket size */
    char state_dict_type[LK_PARAM_STR]; /* full | sharded: a sharded strategy's checkpoints (docs/CHECKPOINTS.md) */
    char ddp_comm_hook[LK_PARAM_STR]; /* none | bf16_compress | fp16_compress (PyTorch's compression hooks) */
    bool ddp_shared_params;         /* ddp on one node: ranks share one copy of parameters + optimizer state */
    bool ddp_broadcast_buffers;     /* ddp: buffers from rank 0 before each forward (default true) */
    char fsdp_sharding_strategy[LK_PARAM_STR]; /* fsdp, deepspeed_stage_3: FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD */
    char fsdp_auto_wrap_policy[LK_PARAM_STR];  /* layer classes that become units ("": the model's blocks; "none") */
    int64_t fsdp_min_num_params;    /* size-based wrapping when > 0 */
    bool fsdp_forward_prefetch, fsdp_backward_prefetch;
    bool fsdp_cpu_offload;          /* deepspeed_stage_2/3, fsdp on a GPU: chunks and optimizer on the CPU */
    int64_t pipeline_chunks;        /* model_parallel, pipeline: trainer.pipeline.chunks (default 4) */
    char pipeline_schedule[LK_PARAM_STR]; /* trainer.pipeline.schedule: gpipe | 1f1b (default) */
    char pipeline_split[LK_PARAM_STR];    /* trainer.pipeline.split: each stage's first block after the first */
    int64_t pipeline_stages;        /* trainer.pipeline.stages: devices = stages x replicas (0: one stage per device) */
    int64_t pipeline_virtual_stages;/* trainer.pipeline.virtual_stages: stages per rank (interleaved_1f1b; 0: 2 there, else 1) */
    char scale_lr[LK_PARAM_STR];    /* none | linear (base lr × world size × accumulation) */
    int64_t global_batch_size;      /* 0: off; else accumulation is derived from it */
    char profiler[LK_PARAM_STR];    /* none | simple | advanced | trace (pytorch: the same as trace) */
    int64_t profiler_trace_steps;   /* trace: optimizer steps recorded (the first N) */
    bool enable_model_summary;      /* print the layer table at fit start (rank 0) */
    int64_t model_summary_max_depth;/* rows down to this depth (-1: all) */
    bool sync_batchnorm;            /* ddp: batch norm statistics over all ranks (SyncBatchNorm) */
    bool activation_checkpointing;  /* recompute each top-level block in the backward (lk_layer_checkpoint_policy) */
    char activation_checkpointing_policy[LK_PARAM_STR]; /* "Linear,Conv2d": checkpoint layers of these classes instead */
    /* precision 16-mixed: the loss scaler (torch.cuda.amp.GradScaler's arguments) */
    double grad_scaler_init_scale;      /* 65536 */
    double grad_scaler_growth_factor;   /* 2 (> 1) */
    double grad_scaler_backoff_factor;  /* 0.5 (in (0, 1)) */
    int64_t grad_scaler_growth_interval;/* 2000 clean steps before the scale grows */
    /* callbacks (a built-in set configured here rather than by class_path) */
    char monitor[LK_PARAM_STR];     /* ModelCheckpoint monitor ("" = last only) */
    char monitor_mode[LK_PARAM_STR];/* min | max */
    int64_t save_top_k;
    bool save_last;
    int64_t every_n_train_steps;    /* ModelCheckpoint: also every N optimizer steps (0: off) */
    char checkpoint_filename[LK_PARAM_STR]; /* e.g. "{epoch}-{val_loss:.3f}" */
    char early_stopping_monitor[LK_PARAM_STR]; /* "" = off */
    int64_t early_stopping_patience;
    double early_stopping_min_delta;
    char early_stopping_mode[LK_PARAM_STR];
    double early_stopping_stopping_threshold;   /* stop once the monitor is this good (NaN: off) */
    double early_stopping_divergence_threshold; /* stop once it is worse than this (NaN: off) */
    bool early_stopping_check_finite;           /* stop when the monitor is NaN or inf */
    bool device_stats_monitor;      /* log CPU utilisation and RSS per rank */
    bool enable_tensorboard;
    bool enable_autolog_hparams;    /* the loggers get the init args (hparams.yaml, TensorBoard's HParams); false: {} */
    /* trainer.callbacks / trainer.logger lists (not in the parameter table:
     * lk_trainer_config_apply fills them) */
    int n_checkpoints;
    lk_checkpoint_config checkpoints[LK_MAX_CALLBACKS];
    int n_early_stopping;
    lk_early_stopping_config early_stopping[LK_MAX_CALLBACKS];
    int n_loggers;            /* with logger_set: 0 = logger: false */
    bool logger_set;          /* false: the default loggers (CSV, and TensorBoard unless enable_tensorboard is false) */
    lk_logger_config loggers[LK_MAX_CALLBACKS];
    char on_exception_ckpt[LK_PARAM_STR]; /* OnExceptionCheckpoint: file written when fit fails ("": off) */
    /* LearningRateMonitor.logging_interval: "" (no monitor) or "step": lr-* every
     * log_every_n_steps steps; "epoch": once per epoch; "null": as the
     * scheduler steps (epoch for an epoch-interval scheduler, else step) */
    char lr_logging_interval[16];
    char time_check_interval[16]; /* Timer.interval: "" or "step": max_time checked after every step; "epoch": after each epoch */
    /* Where comm_timeout came from, for run.json, `lockstep env` and the
     * timeout message: "default"; "LK_COMM_TIMEOUT" (lk_trainer_config_default
     * puts the variable's value in place of the built-in default); or
     * "trainer.comm_timeout in FILE:LINE:COL" / "--trainer.comm_timeout on
     * the command line" (lk_trainer_config_apply: a key the config sets
     * wins over the variable). A program that assigns comm_timeout itself
     * may leave this alone: lk_trainer_config_comm_timeout_from notices. */
    char comm_timeout_from[LK_PARAM_STR];
    /* Lightning's flags read since (docs/LIGHTNING.md's table) */
    int64_t min_steps;              /* early stopping waits for this many optimizer steps (-1: none) */
    bool deterministic_warn;        /* deterministic: "warn": what true refuses is a warning instead */
} lk_trainer_config;

/* The parameter table behind the config (YAML validation and --help). */
const lk_param *lk_trainer_params(int *count);
lk_status lk_trainer_config_default(lk_trainer_config *cfg);
/* Applies a config's `trainer` map: the table's keys, plus Lightning's
 * value forms (fast_dev_run: true, devices: auto | -1 | [0, 1], max_time:
 * "DD:HH:MM:SS" or {days, hours, minutes, seconds}, strategy aliases) and
 * the callbacks / logger lists. Errors name FILE:LINE and the accepted
 * names. Keys applied before a failing one keep their new values. */
lk_status lk_trainer_config_apply(const lk_config_node *trainer, lk_trainer_config *cfg);
/* Where cfg->comm_timeout came from, as run.json and the timeout message
 * say it: cfg->comm_timeout_from, or "trainer.comm_timeout (set by the
 * program)" when the value is not the one that names (a program assigned
 * it). Returns buf. */
const char *lk_trainer_config_comm_timeout_from(const lk_trainer_config *cfg, char *buf, size_t size);
/* The init_args tables, for --help: class names (short) and their tables. */
typedef struct lk_callback_info {
    const char *name; /* "ModelCheckpoint" */
    const lk_param *params;
    int n_params;
    const char *help;
} lk_callback_info;
const lk_callback_info *lk_callback_infos(int *count);
const lk_callback_info *lk_logger_infos(int *count);

/* ---- logging from inside steps -------------------------------------------- */

typedef enum { LK_LOG_REDUCE_MEAN, LK_LOG_REDUCE_SUM, LK_LOG_REDUCE_MAX, LK_LOG_REDUCE_MIN } lk_log_reduce;
typedef struct lk_log_opts {
    bool prog_bar;
    int on_step;   /* 0: Lightning's default for the stage (train: per step, eval: per epoch); 1 yes; -1 no */
    int on_epoch;  /* 0: default; 1 yes; -1 no */
    bool sync_dist;
    lk_log_reduce reduce;
    bool no_logger;
} lk_log_opts;
/* Logs a scalar (Lightning's self.log; lk_log is the natural-log op). opts may be NULL. */
lk_status lk_log_metric(lk_trainer *tr, const char *name, double value, const lk_log_opts *opts);
/* Logs the share of rows of logits [N, C] whose largest entry is at the
 * class index of target [N] (torchmetrics' multiclass accuracy, top-1), as
 * lk_log_metric would log it, without reading the tensors on the host when
 * they live on a GPU (the count waits on the device until the epoch ends).
 * Weighted by N in the epoch mean. opts may be NULL. */
lk_status lk_log_accuracy(lk_trainer *tr, const char *name, const lk_tensor *logits, const lk_tensor *target,
                          const lk_log_opts *opts);

/* ---- modules ---------------------------------------------------------------- */

typedef struct lk_module_vtable {
    /* Returns the loss (a scope-owned one-element tensor) or NULL on error.
     * (optional when forward and loss are set: the default is
     * loss(forward(b), b), logged as train_loss on the progress bar) */
    lk_tensor *(*training_step)(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr);
    /* (optional) NULL: with forward and loss set, the loss of forward(b)
     * logged as val_loss (test_loss), on the progress bar and reduced over
     * the ranks (sync_dist); without them, nothing. */
    lk_status (*validation_step)(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr);
    lk_status (*test_step)(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr);
    /* (optional) Returns the prediction (scope-owned) or NULL on error.
     * NULL: forward(b) when forward is set. */
    lk_tensor *(*predict_step)(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr);
    /* (optional) End of fit/test on rank 0, e.g. to draw a picture into log_dir. */
    lk_status (*on_stage_end)(lk_module *m, lk_trainer *tr, const char *stage);
    void (*destroy)(lk_module *m); /* (optional) frees self */
    /* (optional) A new module with the same architecture (values need not
     * match: the strategy copies them). Asked for only by a strategy
     * that keeps replicas in one process (LK_PROCESS_THREADS: dp), through
     * lk_step_fn.replicate; the trainer's loops never call it. */
    lk_status (*replicate)(lk_module *m, lk_module **out);
    /* (optional) The network's output for batch b (scope-owned), without the
     * loss: what a pipeline stage that holds no loss runs. */
    lk_tensor *(*forward)(lk_module *m, const lk_batch *b);
    /* (optional) The loss (scope-owned, one element) of `output` — what
     * forward returned for b — against b's targets. */
    lk_tensor *(*loss)(lk_module *m, lk_tensor *output, const lk_batch *b);
    /* (optional) Called once the data module is set up for `stage` ("fit",
     * "validate", "test", "predict"), before the first batch (Lightning's
     * LightningModule.setup after LightningDataModule.setup): e.g. to check
     * the data's samples against what the network takes. An error stops the
     * run before any step. */
    lk_status (*setup)(lk_module *m, lk_datamodule *dm, const char *stage);
} lk_module_vtable;

struct lk_module {
    const char *name;           /* "autoencoder" */
    const lk_module_vtable *vt;
    lk_layer *net;              /* owned: parameters and buffers come from here */
    void *self;                 /* the module's own data */
    char *hparams_yaml;         /* save_hyperparameters(): written to hparams.yaml (owned, may be NULL) */
};
/* A new module (*out) instead of a compound literal: name and vt are
 * borrowed (a string literal, a static table); net and self become the
 * module's, on failure too (then they are freed at once: lk_layer_free and
 * vt->destroy, and *out is NULL), so constructors can be passed straight
 * in. A NULL net (a layer constructor that failed) is an error carrying
 * that constructor's message. lk_module_free frees net, then self through
 * vt->destroy. */
lk_status lk_module_create(const char *name, const lk_module_vtable *vt, lk_layer *net, void *self, lk_module **out);
void lk_module_free(lk_module *m);

/* The module's steps as the trainer runs them: the vtable's slot when set,
 * else its default from forward and loss (above); a slot with neither is an
 * INVALID_ARGUMENT error naming the module and what it lacks. A strategy
 * (or a step of your own) calls these rather than the slots. forward and
 * loss return scope-owned tensors, or NULL with the error set. */
lk_tensor *lk_module_forward(lk_module *m, const lk_batch *b);
lk_tensor *lk_module_loss(lk_module *m, lk_tensor *output, const lk_batch *b);
lk_tensor *lk_module_training_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr);
lk_status lk_module_validation_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr);
lk_status lk_module_test_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr);
lk_tensor *lk_module_predict_step(lk_module *m, const lk_batch *b, int64_t batch_idx, lk_trainer *tr);
/* Loads weights by PyTorch state-dict name from a safetensors file — one
 * PyTorch wrote (a weights-only file), `lockstep export` wrote, or a lockstep
 * checkpoint (its optimizer state is ignored). Every missing or misshaped
 * tensor is listed in one error; nothing is copied then. */
lk_status lk_module_load_weights(lk_module *m, const char *path);

/* Optimizer and LR scheduler as data: the `optimizer` and `lr_scheduler`
 * sections of a config (Lightning's configure_optimizers, declaratively). */
typedef struct lk_optim_settings {
    char name[LK_PARAM_STR];      /* adam | adamw | sgd | rmsprop */
    double lr, weight_decay, momentum, dampening, beta1, beta2, eps;
    bool nesterov, amsgrad;
    double alpha;                 /* rmsprop */
    bool centered;                /* rmsprop */
    char scheduler[LK_PARAM_STR]; /* none | step | multistep | exponential | cosine | linear | onecycle | plateau */
    char interval[LK_PARAM_STR];  /* epoch | step */
    int64_t step_size;            /* step: period; cosine: T_max (0 = the whole run); linear: total_iters */
    double gamma;                 /* step, multistep, exponential */
    lk_int_list milestones;       /* multistep */
    double eta_min;               /* cosine */
    double start_factor, end_factor; /* linear */
    double max_lr;                /* onecycle (0: 10 x lr) */
    char monitor[LK_PARAM_STR];   /* plateau */
    double factor;                /* plateau */
    int64_t patience;             /* plateau */
    /* Which parameters weight_decay applies to: all (every one: torch's
     * single group, the default) | matrices (those of >= 2 dims: nanoGPT's
     * configure_optimizers; biases and norm weights do not decay) |
     * matrices_no_embeddings (and not the weights of Embedding layers, a
     * tied lm_head's included: the and GPT-2's original groups). */
    char weight_decay_params[LK_PARAM_STR];
    int64_t warmup_steps;         /* > 0: the lr rises linearly from lr/(N+1) to lr over N scheduler steps, then the scheduler runs */
    /* plateau (ReduceLROnPlateau's arguments beyond monitor, factor, patience) */
    char mode[LK_PARAM_STR];      /* min | max: which way the monitored metric improves */
    double threshold;             /* 1e-4: the least change that counts as better */
    char threshold_mode[LK_PARAM_STR]; /* rel | abs */
    int64_t cooldown;             /* epochs to wait after a reduction */
    double min_lr;                /* the lr never goes below this */
    double plateau_eps;           /* lr_scheduler.init_args.eps: smaller lr changes are skipped (0: torch's 1e-8) */
    /* onecycle (torch's OneCycleLR arguments beyond max_lr) */
    double pct_start;             /* 0.3: share of the cycle spent rising */
    char anneal_strategy[LK_PARAM_STR]; /* cos | linear */
    bool cycle_momentum;          /* momentum (Adam's beta1) cycled inversely to the lr; false here unless set (torch: true) */
    double base_momentum, max_momentum; /* 0.85, 0.95 */
    double div_factor, final_div_factor; /* 25, 1e4: initial lr = max_lr / div_factor, final = initial / final_div_factor */
    bool three_phase;             /* a third phase down to the final lr */
    int64_t total_steps;          /* 0: epochs x steps_per_epoch when both are set, else the run's length */
    int64_t epochs, steps_per_epoch;
} lk_optim_settings;
const lk_param *lk_optim_settings_params(int *count);
lk_status lk_optim_settings_default(lk_optim_settings *s);

/* ---- data modules ---------------------------------------------------------- */

typedef struct lk_datamodule_vtable {
    /* (optional) Downloads; runs on local rank 0 only, the others wait. */
    lk_status (*prepare_data)(lk_datamodule *dm);
    /* (optional) Builds datasets for "fit", "validate", "test" or
     * "predict", on every rank after prepare_data. NULL: the datasets were
     * made before the run (at creation) and dataset() returns them. */
    lk_status (*setup)(lk_datamodule *dm, const char *stage);
    /* "train", "val", "test", "predict" -> the split's dataset (borrowed),
     * or NULL when the data module has none (no validation, no test set). */
    lk_dataset *(*dataset)(lk_datamodule *dm, const char *split);
    void (*destroy)(lk_datamodule *dm); /* (optional) frees self */
} lk_datamodule_vtable;

struct lk_datamodule {
    const char *name;
    const lk_datamodule_vtable *vt;
    void *self;
    int64_t batch_size;
    int num_workers;
    char *hparams_yaml;
};
/* A new data module (*out): name and vt are borrowed as in
 * lk_module_create (vt needs dataset()); self becomes the data module's, on
 * failure too (freed through vt->destroy, *out NULL); batch_size >= 1
 * samples per batch on each rank; num_workers starts at 0 (loading inline)
 * and may be set after. */
lk_status lk_datamodule_create(const char *name, const lk_datamodule_vtable *vt, void *self, int64_t batch_size,
                               lk_datamodule **out);
void lk_datamodule_free(lk_datamodule *dm);

/* ---- built-in modules and data modules (the CLI's class_path names) ---------- */

/* A module around a registered model (lockstep/models.h: autoencoder, mlp,
 * cnn): it logs train_loss (progress bar), val_loss, test_loss, and for
 * classifiers val_acc and test_acc; the autoencoder draws
 * reconstructions.png into the log dir after fit and test. */
lk_status lk_module_create_builtin(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                                   lk_module **out);
/* The same module around a deferred model (lk_model_create_deferred:
 * nothing allocated or drawn). A run makes it real: a strategy that cuts
 * the model into stages (model_parallel, pipeline) materialises only this
 * rank's stage, so no rank ever holds the whole model; any other strategy
 * (or a split by measured time, which runs the whole model once)
 * materialises it whole as the run begins, with lk_module_create_builtin's
 * bits. `lockstep fit`, validate, test and predict build their model so. */
lk_status lk_module_create_builtin_deferred(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                                            lk_module **out);

typedef struct lk_datamodule_info {
    const char *name;
    const char *help;
    const lk_param *params; /* init_args */
    int n_params;
} lk_datamodule_info;
/* fashion_mnist (root, batch_size, num_workers, val_size, flatten, normalize)
 * and synthetic (task, num_samples, input_shape, num_classes, seed,
 * batch_size, num_workers); npy and csv read a user's files (their
 * arguments: `lockstep fit --help`). */
const lk_datamodule_info *lk_datamodules(int *count);
lk_status lk_datamodule_create_builtin(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                                       lk_datamodule **out);

/* ---- the trainer ------------------------------------------------------------- */

/* The merged config text (written as config.yaml) may be NULL.
 *
 * Starting the ranks (Lightning's ddp launcher): a program that asks for
 * devices > 1 with strategy ddp, ddp_spawn or auto and is started alone
 * (`./myprog`: no RANK/WORLD_SIZE, MPI or SLURM variables) gets a
 * *launcher* trainer, which is none of the ranks: lk_trainer_is_launcher is
 * true, lk_trainer_rank is -1, lk_trainer_world_size the number of ranks.
 * Its first fit, validate, test or predict runs this same program again
 * (/proc/self/exe, the same argv) once per rank with the rendezvous
 * variables set, relays their output (rank 0 as is, the others prefixed
 * "[rank R] "), forwards Ctrl-C, stops the job when one rank fails, and
 * returns once every rank has exited: LK_STATUS_OK when all succeeded,
 * else LK_STATUS_REMOTE with the first failing rank's exit status. Each rank
 * runs main from the top and takes the ordinary path, so everything main
 * does — fit, then test, then printing results — happens in the ranks.
 * In the launcher, later runs return that same status without starting the
 * ranks again, and metrics, log_dir and checkpoints are empty; main should
 * just clean up and exit:
 *
 *     lk_status st = lk_trainer_fit(tr, m, dm, NULL);    // launcher: the whole job
 *     if (!st) st = lk_trainer_test(tr, m, dm, "last");  // launcher: fit's status again
 *     double v;
 *     if (lk_trainer_rank(tr) == 0 && !lk_trainer_get_metric(tr, "test_loss", &v))
 *         printf("test_loss %.4f\n", v);                 // once per job: rank 0
 *     if (st) fprintf(stderr, "%s\n", lk_last_error());
 *     ...free...; return st ? 1 : 0;
 *
 * Work before lk_trainer_create runs in the launcher and in every rank.
 * num_nodes > 1 needs a launcher on each node (`lockstep launch`, mpirun,
 * srun), so creating such a trainer alone fails with LK_STATUS_INVALID_USAGE.
 * A process started by a launcher (`lockstep launch -n 2 -- ./myprog`,
 * mpirun) is a rank directly. */
lk_status lk_trainer_create(const lk_trainer_config *cfg, const lk_optim_settings *optim, const char *config_yaml,
                            lk_trainer **out);
/* The checks of lk_trainer_create that need nothing started (the precision,
 * the ddp comm hook against it, deterministic with max_time), for a program
 * that launches its ranks itself and wants one error instead of one per rank
 * (`lockstep fit` calls it before launching). lk_trainer_create makes them
 * again. */
lk_status lk_trainer_config_check(const lk_trainer_config *cfg);
void lk_trainer_free(lk_trainer *tr);
/* True when this process starts the job's ranks and is none of them (above). */
bool lk_trainer_is_launcher(const lk_trainer *tr);

lk_status lk_trainer_fit(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path);
lk_status lk_trainer_validate(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path);
lk_status lk_trainer_test(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path);
lk_status lk_trainer_predict(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path);

/* State the steps may read. */
int lk_trainer_rank(const lk_trainer *tr); /* -1 in a launcher */
int lk_trainer_world_size(const lk_trainer *tr);
int64_t lk_trainer_current_epoch(const lk_trainer *tr);
int64_t lk_trainer_global_step(const lk_trainer *tr);
const char *lk_trainer_log_dir(const lk_trainer *tr); /* "" before the first run */
/* The last value of a logged metric (epoch aggregate when there is one)
 * in *value. A metric with no value (never logged, or only on another rank
 * without sync_dist) is INVALID_ARGUMENT naming it and the metrics there are. */
lk_status lk_trainer_get_metric(const lk_trainer *tr, const char *name, double *value);
/* Deprecated: lk_trainer_get_metric, which returns lk_status like the rest
 * of the API. Kept for programs written against it: true when the metric
 * has a value (then in *value), false (and no error set) when not. */
bool lk_trainer_metric(const lk_trainer *tr, const char *name, double *value);
const char *lk_trainer_last_checkpoint(const lk_trainer *tr);
const char *lk_trainer_best_checkpoint(const lk_trainer *tr);

/* Lightning's model summary of a network: a row per layer down to max_depth
 * (1: the top-level children; -1: every layer) with name, type, parameters
 * and mode, then the parameter totals and the size in MB. *out is a new
 * lk_malloc'd string the caller lk_free's; on failure *out is NULL. */
lk_status lk_model_summary(const lk_layer *net, int max_depth, char **out);

/* A batch field as a scope-owned tensor wrapping the loader's buffer (no copy;
 * valid inside the step). When the run's device is not host-addressable, a
 * copy of the field on that device instead (one per call: take it once). */
lk_tensor *lk_batch_tensor(const lk_batch *b, int field);

#ifdef __cplusplus
}
#endif
#endif

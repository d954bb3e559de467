/* The trainer's and the optimizer's parameter tables: Lightning's flag names,
 * types, bounds, defaults and one line of help each. YAML validation, the
 * CLI's --help and --print_config all read these. Also the part of a
 * Lightning config that a flat table cannot hold: trainer.callbacks and
 * trainer.logger as class_path lists, and the other value forms Lightning
 * accepts (fast_dev_run: true, devices: [0, 1], max_time: "00:01:00:00"). */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lockstep/config.h"
#include "lockstep/trainer.h"

#define T(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(lk_trainer_config, field), def, lo, hi, choices, help}

static const lk_param trainer_params[] = {
    T("accelerator", ENUM, accelerator, "auto", 1, 0, "cpu|gpu|cuda|auto", "hardware to run on (gpu needs the CUDA backend)"),
    T("devices", INT, devices, "1", 0, 4096, NULL, "processes (cpu) or GPUs per node; 0 = auto"),
    T("strategy", ENUM, strategy, "auto", 1, 0, "auto|single|ddp|ddp_spawn|dp|deepspeed_stage_1|deepspeed_stage_2",
      "how training is spread over devices (dp: one process, a replica per device on threads; ddp_spawn: "
      "ranks forked from this process, then trained as ddp; deepspeed_stage_1/2: lockstep's own ZeRO, the "
      "optimizer update (and with 2 the gradients) sharded over the ranks, docs/STRATEGIES.md)"),
    T("num_nodes", INT, num_nodes, "1", 1, 1e6, NULL, "machines (launched by mpirun or srun)"),
    T("precision", ENUM, precision, "32-true", 1, 0, "32-true|32|bf16-mixed|bf16|16-mixed|16|bf16-true|16-true|64-true|64",
      "numeric precision: *-mixed multiplies in bf16/f16 with f32 master weights (docs/PRECISION.md)"),
    T("float32_matmul_precision", ENUM, float32_matmul_precision, "highest", 1, 0, "highest|high|medium",
      "f32 matrix products: highest multiplies in f32; high and medium let a GPU use TF32 tensor cores "
      "(torch.set_float32_matmul_precision; the CPU stays exact)"),
    T("max_epochs", INT, max_epochs, "1000", -1, 1e12, NULL, "stop after this many epochs (-1: no limit)"),
    T("min_epochs", INT, min_epochs, "0", 0, 1e12, NULL, "train at least this many epochs (early stopping waits)"),
    T("min_steps", INT, min_steps, "-1", -1, 1e15, NULL, "train at least this many optimizer steps (early stopping waits; -1: none)"),
    T("max_steps", INT, max_steps, "-1", -1, 1e15, NULL, "stop after this many optimizer steps (-1: no limit)"),
    T("max_time", FLOAT, max_time, "0", 0, 1e12, NULL, "stop after this many seconds of training (0: no limit)"),
    T("accumulate_grad_batches", INT, accumulate_grad_batches, "1", 1, 1e6, NULL,
      "micro-batches per optimizer step (gradients reduced once per step)"),
    T("gradient_clip_val", FLOAT, gradient_clip_val, "0", 0, 1e30, NULL, "clip gradients to this norm/value (0: off)"),
    T("gradient_clip_algorithm", ENUM, gradient_clip_algorithm, "norm", 1, 0, "norm|value", "clip by global norm or value"),
    T("num_sanity_val_steps", INT, num_sanity_val_steps, "2", -1, 1e9, NULL,
      "validation batches run before training (-1: all)"),
    T("limit_train_batches", COUNT_OR_FRACTION, limit_train_batches, "1.0", 0, 1e15, NULL,
      "training batches per epoch: an int counts batches, a float (0.0-1.0) is a fraction"),
    T("limit_val_batches", COUNT_OR_FRACTION, limit_val_batches, "1.0", 0, 1e15, NULL,
      "validation batches: int count or float fraction"),
    T("limit_test_batches", COUNT_OR_FRACTION, limit_test_batches, "1.0", 0, 1e15, NULL, "test batches: int count or float fraction"),
    T("limit_predict_batches", COUNT_OR_FRACTION, limit_predict_batches, "1.0", 0, 1e15, NULL,
      "predict batches: int count or float fraction"),
    T("val_check_interval", COUNT_OR_FRACTION, val_check_interval, "1.0", 1, 1e15, NULL,
      "validate every fraction (float) of an epoch or every N (int) training batches"),
    T("check_val_every_n_epoch", INT, check_val_every_n_epoch, "1", 1, 1e9, NULL,
      "validate every N epochs (null: an integer val_check_interval counts training batches across epochs)"),
    T("log_every_n_steps", INT, log_every_n_steps, "50", 1, 1e9, NULL, "write step metrics every N steps"),
    T("enable_progress_bar", BOOL, enable_progress_bar, "true", 1, 0, NULL, "show progress (a bar on a terminal, lines otherwise)"),
    T("enable_checkpointing", BOOL, enable_checkpointing, "true", 1, 0, NULL, "write checkpoints (last.ckpt and top-k)"),
    T("default_root_dir", STRING, default_root_dir, ".", 1, 0, NULL, "where lightning_logs/version_N/ is created"),
    T("deterministic", BOOL, deterministic, "false", 1, 0, NULL,
      "refuse options that would break bitwise reproducibility (\"warn\": warn about them instead)"),
    T("fast_dev_run", INT, fast_dev_run, "0", 0, 1e9, NULL, "run N batches of each loop, no logs or checkpoints (0: off)"),
    T("overfit_batches", COUNT_OR_FRACTION, overfit_batches, "0", 0, 1e9, NULL,
      "train and validate on the first N training batches (an int), or on that fraction of them (a float)"),
    T("seed", INT, seed, "0", 0, 4294967295.0, NULL, "seed_everything: parameters, data order, dropout, augmentation"),
    T("comm_timeout", FLOAT, comm_timeout, "120", 0.1, 1e6, NULL, "seconds any collective may wait before failing"),
    T("checkpoint_timeout", FLOAT, checkpoint_timeout, "1800", 0.1, 1e7, NULL,
      "seconds the other ranks wait for rank 0 to write a checkpoint or prepare data (instead of comm_timeout)"),
    T("bucket_cap_mb", FLOAT, bucket_cap_mb, "25", 1e-6, 1e6, NULL, "ddp gradient bucket size in MB"),
    T("ddp_comm_hook", ENUM, ddp_comm_hook, "none", 1, 0, "none|bf16_compress|fp16_compress",
      "ddp: gradients travel as bf16/fp16 (half the bytes, rounded) instead of exact f32"),
    T("ddp_shared_params", BOOL, ddp_shared_params, "true", 1, 0, NULL,
      "ddp on one node: one copy of parameters and optimizer state, each rank updates 1/N (false: a replica per rank)"),
    T("ddp_broadcast_buffers", BOOL, ddp_broadcast_buffers, "true", 1, 0, NULL,
      "ddp: buffers (BatchNorm statistics) from rank 0 before each forward, as DistributedDataParallel"),
    T("scale_lr", ENUM, scale_lr, "none", 1, 0, "none|linear", "linear: lr x world size x accumulate_grad_batches"),
    T("global_batch_size", INT, global_batch_size, "0", 0, 1e12, NULL,
      "samples per optimizer step over all ranks; derives accumulate_grad_batches (0: off)"),
    T("profiler", ENUM, profiler, "none", 1, 0, "none|simple|advanced|trace|pytorch",
      "simple: per-phase step times; advanced: also per-op times; trace (or pytorch): also <log_dir>/trace.json "
      "for Perfetto (docs/PROFILING.md)"),
    T("profiler_trace_steps", INT, profiler_trace_steps, "20", 1, 1e6, NULL,
      "trace: record the first N optimizer steps (bounds the file)"),
    T("enable_model_summary", BOOL, enable_model_summary, "true", 1, 0, NULL,
      "print the layer/parameter table at fit start"),
    T("model_summary_max_depth", INT, model_summary_max_depth, "1", -1, 1e6, NULL,
      "model summary: rows down to this layer depth (-1: every layer)"),
    T("sync_batchnorm", BOOL, sync_batchnorm, "false", 1, 0, NULL,
      "ddp: batch norm statistics (and their gradients) over the whole global batch, not each rank's part"),
    T("grad_scaler_init_scale", FLOAT, grad_scaler_init_scale, "65536", 1e-30, 3.4e38, NULL,
      "precision 16-mixed: the first loss scale (GradScaler's init_scale)"),
    T("grad_scaler_growth_factor", FLOAT, grad_scaler_growth_factor, "2", 1, 1e30, NULL,
      "precision 16-mixed: the scale's factor after growth_interval clean steps (> 1)"),
    T("grad_scaler_backoff_factor", FLOAT, grad_scaler_backoff_factor, "0.5", 1e-30, 1, NULL,
      "precision 16-mixed: the scale's factor after a step whose gradients overflowed (< 1; the step is skipped)"),
    T("grad_scaler_growth_interval", INT, grad_scaler_growth_interval, "2000", 1, 1e15, NULL,
      "precision 16-mixed: clean steps in a row before the scale grows"),
    T("monitor", STRING, monitor, "", 1, 0, NULL, "ModelCheckpoint: metric that ranks checkpoints (empty: last only)"),
    T("monitor_mode", ENUM, monitor_mode, "min", 1, 0, "min|max", "ModelCheckpoint: lower or higher is better"),
    T("save_top_k", INT, save_top_k, "1", -1, 1e6, NULL, "ModelCheckpoint: best checkpoints kept (-1: all)"),
    T("save_last", BOOL, save_last, "true", 1, 0, NULL, "ModelCheckpoint: keep last.ckpt"),
    T("every_n_train_steps", INT, every_n_train_steps, "0", 0, 1e15, NULL,
      "ModelCheckpoint: also save last.ckpt every N optimizer steps, mid-epoch (0: off)"),
    T("checkpoint_filename", STRING, checkpoint_filename, "{epoch}-{step}", 1, 0, NULL,
      "ModelCheckpoint: file name template, e.g. {epoch}-{val_loss:.3f}"),
    T("early_stopping_monitor", STRING, early_stopping_monitor, "", 1, 0, NULL, "EarlyStopping: metric (empty: off)"),
    T("early_stopping_patience", INT, early_stopping_patience, "3", 0, 1e9, NULL, "EarlyStopping: checks without improvement"),
    T("early_stopping_min_delta", FLOAT, early_stopping_min_delta, "0", 0, 1e30, NULL, "EarlyStopping: smallest improvement"),
    T("early_stopping_mode", ENUM, early_stopping_mode, "min", 1, 0, "min|max", "EarlyStopping: lower or higher is better"),
    T("early_stopping_stopping_threshold", FLOAT, early_stopping_stopping_threshold, ".nan", 1, 0, NULL,
      "EarlyStopping: stop once the monitor is at least this good (.nan: off)"),
    T("early_stopping_divergence_threshold", FLOAT, early_stopping_divergence_threshold, ".nan", 1, 0, NULL,
      "EarlyStopping: stop once the monitor is worse than this (.nan: off)"),
    T("early_stopping_check_finite", BOOL, early_stopping_check_finite, "true", 1, 0, NULL,
      "EarlyStopping: stop when the monitor becomes NaN or infinite"),
    T("device_stats_monitor", BOOL, device_stats_monitor, "false", 1, 0, NULL,
      "DeviceStatsMonitor: log CPU utilisation and resident memory (rank 0, and the largest RSS of any rank)"),
    T("enable_tensorboard", BOOL, enable_tensorboard, "true", 1, 0, NULL, "also write TensorBoard event files"),
    T("activation_checkpointing", BOOL, activation_checkpointing, "false", 1, 0, NULL,
      "keep only each top-level block's input in the forward and recompute the block in the backward (saves the "
      "activations inside multi-layer blocks, costs a forward; the gradients are the same bits; docs/PROFILING.md)"),
    T("activation_checkpointing_policy", STRING, activation_checkpointing_policy, "", 1, 0, NULL,
      "FSDP's policy: checkpoint every layer of these classes instead, a comma-separated string, e.g. "
      "\"Linear,Conv2d\" or Sequential"),
};

const lk_param *lk_trainer_params(int *count) {
    *count = (int)(sizeof trainer_params / sizeof trainer_params[0]);
    return trainer_params;
}

/* trainer.comm_timeout and LK_COMM_TIMEOUT follow the one precedence rule
 * (core.h, lk_env_var): the default puts the variable's value, when it is
 * set and valid, in place of the table's default; lk_trainer_config_apply
 * replaces it with a key the config sets. comm_timeout_from says which of
 * the three gave the value. The variable is checked against the key's own
 * bounds: one range, however the value is given. */
static const lk_param *comm_timeout_param(void) {
    return lk_params_find(trainer_params, (int)(sizeof trainer_params / sizeof trainer_params[0]), "comm_timeout");
}

lk_status lk_trainer_config_default(lk_trainer_config *cfg) {
    memset(cfg, 0, sizeof *cfg); /* the callback and logger lists start empty */
    int n;
    const lk_param *p = lk_trainer_params(&n);
    LK_TRY(lk_params_defaults(p, n, cfg));
    const lk_param *ct = comm_timeout_param();
    double v;
    if (lk_env_get_number("LK_COMM_TIMEOUT", ct->min, ct->max, &v)) {
        cfg->comm_timeout = v;
        snprintf(cfg->comm_timeout_from, sizeof cfg->comm_timeout_from, "LK_COMM_TIMEOUT");
    } else {
        snprintf(cfg->comm_timeout_from, sizeof cfg->comm_timeout_from, "default");
    }
    return LK_STATUS_OK;
}

const char *lk_trainer_config_comm_timeout_from(const lk_trainer_config *cfg, char *buf, size_t size) {
    const char *from = cfg->comm_timeout_from;
    const lk_param *ct = comm_timeout_param();
    double v = 0;
    bool holds;
    if (!strcmp(from, "LK_COMM_TIMEOUT"))
        holds = lk_env_get_number("LK_COMM_TIMEOUT", ct->min, ct->max, &v) && v == cfg->comm_timeout;
    else if (!strcmp(from, "default"))
        holds = cfg->comm_timeout == strtod(ct->def, NULL);
    else
        holds = from[0] != 0; /* a key in the config: lk_trainer_config_apply wrote value and origin together */
    snprintf(buf, size, "%s", holds ? from : "trainer.comm_timeout (set by the program)");
    return buf;
}

#define O(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(lk_optim_settings, field), def, lo, hi, choices, help}

static const lk_param optim_params[] = {
    O("name", ENUM, name, "adam", 1, 0, "adam|adamw|sgd|rmsprop", "optimizer"),
    O("lr", FLOAT, lr, "0.001", 0, 1e6, NULL, "learning rate"),
    O("weight_decay", FLOAT, weight_decay, "0", 0, 1e6, NULL, "L2 penalty (adamw: decoupled decay)"),
    O("momentum", FLOAT, momentum, "0", 0, 1, NULL, "sgd/rmsprop momentum"),
    O("dampening", FLOAT, dampening, "0", 0, 1, NULL, "sgd dampening"),
    O("nesterov", BOOL, nesterov, "false", 1, 0, NULL, "sgd Nesterov momentum"),
    O("beta1", FLOAT, beta1, "0.9", 0, 0.999999, NULL, "adam beta1"),
    O("beta2", FLOAT, beta2, "0.999", 0, 0.99999999, NULL, "adam beta2"),
    O("eps", FLOAT, eps, "1e-8", 0, 1, NULL, "adam/rmsprop epsilon"),
    O("amsgrad", BOOL, amsgrad, "false", 1, 0, NULL, "adam/adamw AMSGrad variant"),
    O("alpha", FLOAT, alpha, "0.99", 0, 1, NULL, "rmsprop smoothing constant"),
    O("centered", BOOL, centered, "false", 1, 0, NULL, "rmsprop: normalise by the gradient's estimated variance"),
    O("scheduler", ENUM, scheduler, "none", 1, 0, "none|step|multistep|exponential|cosine|linear|onecycle|plateau",
      "learning-rate scheduler"),
    O("interval", ENUM, interval, "epoch", 1, 0, "epoch|step", "step the scheduler every epoch or every optimizer step"),
    O("step_size", INT, step_size, "0", 0, 2147483647, NULL, "step: period; cosine: T_max (0: the whole run); linear: iterations"),
    O("gamma", FLOAT, gamma, "0.1", 0, 1e6, NULL, "step/multistep/exponential decay factor"),
    O("milestones", INTS, milestones, "[]", 0, 1e12, NULL, "multistep: epochs (or steps) where lr *= gamma"),
    O("eta_min", FLOAT, eta_min, "0", 0, 1e6, NULL, "cosine: final learning rate"),
    O("start_factor", FLOAT, start_factor, "0.333333333", 1e-12, 1, NULL, "linear: first factor"),
    O("end_factor", FLOAT, end_factor, "1.0", 0, 1, NULL, "linear: last factor"),
    O("max_lr", FLOAT, max_lr, "0", 0, 1e6, NULL, "onecycle: peak learning rate (0: 10 x lr)"),
    O("monitor", STRING, monitor, "val_loss", 1, 0, NULL, "plateau: metric to watch"),
    O("factor", FLOAT, factor, "0.1", 0, 0.999999, NULL, "plateau: lr *= factor"),
    O("patience", INT, patience, "10", 0, 1e9, NULL, "plateau: epochs without improvement"),
    O("weight_decay_params", ENUM, weight_decay_params, "all", 1, 0, "all|matrices|matrices_no_embeddings",
      "parameters weight_decay applies to (matrices: >= 2 dims, nanoGPT's groups; matrices_no_embeddings: not "
      "Embedding weights either)"),
    O("warmup_steps", INT, warmup_steps, "0", 0, 2147483647, NULL,
      "linear warm-up from lr/(N+1) over N scheduler steps before the scheduler (nanoGPT's; 0: none)"),
};

const lk_param *lk_optim_settings_params(int *count) {
    *count = (int)(sizeof optim_params / sizeof optim_params[0]);
    return optim_params;
}

lk_status lk_optim_settings_default(lk_optim_settings *s) {
    int n;
    const lk_param *p = lk_optim_settings_params(&n);
    return lk_params_defaults(p, n, s);
}

/* ---- callbacks and loggers by class_path ------------------------------------------ */

#define CK(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(lk_checkpoint_config, field), def, lo, hi, choices, help}
static const lk_param checkpoint_params[] = {
    CK("dirpath", STRING, dirpath, "", 1, 0, NULL, "directory for the files (null: <log_dir>/checkpoints)"),
    CK("filename", STRING, filename, "{epoch}-{step}", 1, 0, NULL, "file name template, e.g. {epoch}-{val_loss:.3f}"),
    CK("monitor", STRING, monitor, "", 1, 0, NULL, "metric that ranks checkpoints (null: the newest rank first)"),
    CK("verbose", BOOL, verbose, "false", 1, 0, NULL, "say when a checkpoint is written"),
    CK("save_last", BOOL, save_last, "false", 1, 0, NULL, "also keep last.ckpt"),
    CK("save_top_k", INT, save_top_k, "1", -1, 1e6, NULL, "best checkpoints kept (-1: all, 0: none)"),
    CK("mode", ENUM, mode, "min", 1, 0, "min|max", "lower or higher is better"),
    CK("auto_insert_metric_name", BOOL, auto_insert_metric_name, "true", 1, 0, NULL,
       "{epoch} becomes epoch=3 (false: 3)"),
    CK("every_n_train_steps", INT, every_n_train_steps, "0", 0, 1e15, NULL, "also save every N optimizer steps (0: off)"),
    CK("every_n_epochs", INT, every_n_epochs, "1", 0, 1e15, NULL, "save at the end of every Nth epoch (0: never)"),
    CK("save_weights_only", BOOL, save_weights_only, "false", 1, 0, NULL,
       "top-k files hold the model's weights only, no optimizer state (last.ckpt stays complete for resuming)"),
    CK("save_on_train_epoch_end", BOOL, save_on_train_epoch_end, "false", 1, 0, NULL,
       "accepted; lockstep saves after each validation and at the epoch end either way"),
};

#define ES(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(lk_early_stopping_config, field), def, lo, hi, choices, help}
static const lk_param early_stopping_params[] = {
    ES("monitor", STRING, monitor, "", 1, 0, NULL, "metric to watch (required)"),
    ES("min_delta", FLOAT, min_delta, "0", 0, 1e30, NULL, "smallest change that counts as an improvement"),
    ES("patience", INT, patience, "3", 0, 1e9, NULL, "checks without improvement before stopping"),
    ES("verbose", BOOL, verbose, "false", 1, 0, NULL, "say why training stopped"),
    ES("mode", ENUM, mode, "min", 1, 0, "min|max", "lower or higher is better"),
    ES("strict", BOOL, strict, "true", 1, 0, NULL, "a monitor that was never logged is an error (false: skip)"),
    ES("check_finite", BOOL, check_finite, "true", 1, 0, NULL, "stop when the monitor becomes NaN or infinite"),
    ES("stopping_threshold", FLOAT, stopping_threshold, ".nan", 1, 0, NULL, "stop once the monitor is this good"),
    ES("divergence_threshold", FLOAT, divergence_threshold, ".nan", 1, 0, NULL, "stop once it is worse than this"),
};

/* Arguments that configure something the trainer already does: parsed (so
 * typos and bad values are caught) into scratch structs. */
typedef struct {
    char logging_interval[LK_PARAM_STR];
    bool log_momentum, log_weight_decay;
    char duration[LK_PARAM_STR], interval[LK_PARAM_STR]; /* Timer (duration is read by hand) */
    bool verbose;
    char cpu_stats[LK_PARAM_STR];
    int64_t max_depth;
    char dirpath[LK_PARAM_STR], filename[LK_PARAM_STR];
} scratch_args;
#define SA(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(scratch_args, field), def, lo, hi, choices, help}
static const lk_param lr_monitor_params[] = {
    SA("logging_interval", ENUM, logging_interval, "null", 1, 0, "null|step|epoch",
       "step: lr-<Optimizer> every log_every_n_steps steps; epoch: once per epoch; null: as the scheduler steps"),
    SA("log_momentum", BOOL, log_momentum, "false", 1, 0, NULL, "accepted; only the learning rate is logged"),
    SA("log_weight_decay", BOOL, log_weight_decay, "false", 1, 0, NULL, "accepted; only the learning rate is logged"),
};
static const lk_param device_stats_params[] = {
    SA("cpu_stats", ENUM, cpu_stats, "null", 1, 0, "null|true|false", "CPU utilisation and resident memory are logged"),
};
static const lk_param timer_params[] = {
    SA("duration", STRING, duration, "", 1, 0, NULL, "\"DD:HH:MM:SS\" or {days, hours, minutes, seconds}: sets max_time"),
    SA("interval", ENUM, interval, "step", 1, 0, "step|epoch", "check the time after every step or after each epoch"),
    SA("verbose", BOOL, verbose, "true", 1, 0, NULL, "say when time is up"),
};
static const lk_param summary_params[] = {
    SA("max_depth", INT, max_depth, "1", -1, 1e6, NULL, "layers shown in the model summary"),
};
static const lk_param on_exception_params[] = {
    SA("dirpath", STRING, dirpath, "", 1, 0, NULL, "directory of the checkpoint written when fit fails (required)"),
    SA("filename", STRING, filename, "on_exception", 1, 0, NULL, "its name, without .ckpt"),
};

enum { CB_CHECKPOINT, CB_EARLY_STOPPING, CB_LR_MONITOR, CB_DEVICE_STATS, CB_TIMER, CB_SUMMARY, CB_ON_EXCEPTION };
#define NP(t) (int)(sizeof t / sizeof t[0])
static const lk_callback_info callback_infos[] = { /* in the order of the enum above */
    {"ModelCheckpoint", checkpoint_params, NP(checkpoint_params), "top-k and last checkpoints (several allowed)"},
    {"EarlyStopping", early_stopping_params, NP(early_stopping_params), "stop when a metric stops improving"},
    {"LearningRateMonitor", lr_monitor_params, NP(lr_monitor_params), "when lr-<Optimizer> is logged (without it: every log_every_n_steps steps)"},
    {"DeviceStatsMonitor", device_stats_params, NP(device_stats_params), "trainer.device_stats_monitor: true"},
    {"Timer", timer_params, NP(timer_params), "stop after a duration (trainer.max_time)"},
    {"ModelSummary", summary_params, NP(summary_params), "the model summary printed before fit"},
    {"OnExceptionCheckpoint", on_exception_params, NP(on_exception_params), "save a checkpoint when fit fails"},
};

const lk_callback_info *lk_callback_infos(int *count) {
    *count = NP(callback_infos);
    return callback_infos;
}

typedef struct {
    lk_logger_config c;
    char version[LK_PARAM_STR];
    char prefix[LK_PARAM_STR];
    int64_t flush_logs_every_n_steps;
    bool log_graph, default_hp_metric;
} logger_args;
#define LA(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(logger_args, field), def, lo, hi, choices, help}
static const lk_param csv_logger_params[] = {
    LA("save_dir", STRING, c.save_dir, "", 1, 0, NULL, "root directory (null: trainer.default_root_dir)"),
    LA("name", STRING, c.name, "lightning_logs", 1, 0, NULL, "experiment directory under save_dir"),
    LA("version", STRING, version, "", 1, 0, NULL, "version number (null: the next free version_N)"),
    LA("prefix", STRING, prefix, "", 1, 0, NULL, "accepted; must be empty"),
    LA("flush_logs_every_n_steps", INT, flush_logs_every_n_steps, "100", 1, 1e12, NULL, "accepted (lockstep flushes per epoch)"),
};
static const lk_param tb_logger_params[] = {
    LA("save_dir", STRING, c.save_dir, "", 1, 0, NULL, "root directory (null: trainer.default_root_dir)"),
    LA("name", STRING, c.name, "lightning_logs", 1, 0, NULL, "experiment directory under save_dir"),
    LA("version", STRING, version, "", 1, 0, NULL, "version number (null: the next free version_N)"),
    LA("prefix", STRING, prefix, "", 1, 0, NULL, "accepted; must be empty"),
    LA("log_graph", BOOL, log_graph, "false", 1, 0, NULL, "accepted; lockstep writes no graph"),
    LA("default_hp_metric", BOOL, default_hp_metric, "true", 1, 0, NULL, "accepted"),
};
static const lk_callback_info logger_infos[] = {
    {"CSVLogger", csv_logger_params, NP(csv_logger_params), "metrics.csv and hparams.yaml"},
    {"TensorBoardLogger", tb_logger_params, NP(tb_logger_params), "TensorBoard event files and hparams.yaml"},
};

const lk_callback_info *lk_logger_infos(int *count) {
    *count = NP(logger_infos);
    return logger_infos;
}

/* Lightning classes lockstep does not have, and what to use instead (NULL:
 * nothing does that job here yet). */
static const struct {
    const char *name, *instead;
} not_here[] = {
    {"TQDMProgressBar", "trainer.enable_progress_bar (lockstep draws its own progress)"},
    {"RichProgressBar", "trainer.enable_progress_bar (lockstep draws its own progress)"},
    {"RichModelSummary", "ModelSummary"},
    {"GradientAccumulationScheduler", "trainer.accumulate_grad_batches (a constant)"},
    {"StochasticWeightAveraging", NULL},
    {"LearningRateFinder", "a fixed optimizer.init_args.lr"},
    {"BatchSizeFinder", "a fixed data.init_args.batch_size"},
    {"ThroughputMonitor", "run.json, which records samples_per_s"},
    {"WandbLogger", "CSVLogger or TensorBoardLogger"},
    {"MLFlowLogger", "CSVLogger or TensorBoardLogger"},
    {"CometLogger", "CSVLogger or TensorBoardLogger"},
    {"NeptuneLogger", "CSVLogger or TensorBoardLogger"},
};

/* An INVALID_ARGUMENT error that starts with the node's FILE:LINE:COL. */
static lk_status at(const lk_config_node *n, const char *fmt, ...) {
    char w[512], msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s", lk_config_node_where(n, w, sizeof w), msg);
}

static void join_names(const lk_param *t, int n, char *buf, size_t size) {
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        strncat(buf, i ? ", " : "", size - strlen(buf) - 1);
        strncat(buf, t[i].name, size - strlen(buf) - 1);
    }
}

/* "00:01:30:00", "90" (seconds) or {days: 1, hours: 2, ...} (Python's
 * timedelta arguments) -> seconds. */
static lk_status parse_duration(const lk_config_node *n, const char *what, double *out) {
    *out = 0;
    if (!n || lk_config_node_is_null(n)) return LK_STATUS_OK;
    if (lk_config_node_type(n) == LK_CONFIG_MAP) {
        static const struct { const char *key; double s; } unit[] = {
            {"weeks", 604800}, {"days", 86400}, {"hours", 3600}, {"minutes", 60}, {"seconds", 1},
            {"milliseconds", 1e-3}, {"microseconds", 1e-6}};
        const char *names[7];
        for (int k = 0; k < 7; k++) names[k] = unit[k].key;
        for (int i = 0; i < lk_config_node_count(n); i++) {
            const lk_config_node *c = lk_config_node_child(n, i);
            const char *key = lk_config_node_key(c), *text = lk_config_node_text(c);
            int k = 0;
            while (k < 7 && strcmp(key, unit[k].key)) k++;
            if (k == 7) {
                const char *s = lk_suggest(key, names, 7);
                return at(c, "%s: unknown key '%s'%s%s%s (expected weeks, days, hours, minutes, seconds, milliseconds, "
                          "microseconds)", what, key, s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "");
            }
            char *end;
            double v = text ? strtod(text, &end) : 0;
            if (!text || end == text || *end || !(v >= 0) || isinf(v))
                return at(c, "%s.%s: expected a non-negative number, got '%s'", what, key, text ? text : "(a collection)");
            *out += v * unit[k].s;
        }
        return LK_STATUS_OK;
    }
    const char *t = lk_config_node_text(n);
    if (!t) return at(n, "%s: expected \"DD:HH:MM:SS\", a number of seconds or {days, hours, minutes, seconds}", what);
    double part[4] = {0};
    int np = 0;
    const char *p = t;
    for (;;) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || np == 4 || !(v >= 0) || isinf(v)) { np = -1; break; }
        part[np++] = v;
        if (*end == ':') p = end + 1;
        else if (!*end) break;
        else { np = -1; break; }
    }
    if (np != 1 && np != 4)
        return at(n, "%s: expected \"DD:HH:MM:SS\" (Lightning's max_time form), a number of seconds or "
                  "{days, hours, minutes, seconds}, got '%s'", what, t);
    *out = np == 1 ? part[0] : part[0] * 86400 + part[1] * 3600 + part[2] * 60 + part[3];
    return LK_STATUS_OK;
}

/* The short class name of entry `i` of a class_path list, and its init_args. */
static lk_status read_entry(const lk_config_node *e, const char *what, const lk_callback_info *infos, int ninfos,
                            int *index, const lk_config_node **init_args) {
    const lk_config_node *cp = e;
    *init_args = NULL;
    if (lk_config_node_type(e) == LK_CONFIG_MAP) {
        for (int i = 0; i < lk_config_node_count(e); i++) {
            const lk_config_node *c = lk_config_node_child(e, i);
            const char *key = lk_config_node_key(c);
            if (!strcmp(key, "class_path") || !strcmp(key, "init_args")) continue;
            return at(c, "%s: unknown key '%s' (an entry has class_path and init_args; the class's arguments go "
                      "under init_args)", what, key);
        }
        cp = lk_config_node_get(e, "class_path");
        *init_args = lk_config_node_get(e, "init_args");
        if (!cp) return at(e, "%s: class_path is required (one of the names below)", what);
    }
    const char *full = lk_config_node_text(cp);
    if (!full || lk_config_node_is_null(cp))
        return at(cp, "%s.class_path: expected a class name such as %s", what, infos[0].name);
    /* lightning.pytorch.callbacks.ModelCheckpoint, pytorch_lightning.loggers.CSVLogger -> the last part */
    const char *name = strrchr(full, '.');
    name = name ? name + 1 : full;
    for (int k = 0; k < ninfos; k++)
        if (!strcmp(name, infos[k].name)) {
            *index = k;
            if (*init_args && !lk_config_node_is_null(*init_args) && lk_config_node_type(*init_args) != LK_CONFIG_MAP)
                return at(*init_args, "%s.init_args: expected a mapping of %s's arguments", what, name);
            return LK_STATUS_OK;
        }
    char list[512] = "";
    const char *names[16];
    for (int k = 0; k < ninfos; k++) {
        names[k] = infos[k].name;
        strncat(list, k ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, infos[k].name, sizeof list - strlen(list) - 1);
    }
    for (size_t k = 0; k < sizeof not_here / sizeof not_here[0]; k++)
        if (!strcmp(name, not_here[k].name))
            return not_here[k].instead
                       ? at(cp, "%s.class_path: lockstep has no %s; use %s instead (lockstep accepts %s)", what, name,
                            not_here[k].instead, list)
                       : at(cp, "%s.class_path: lockstep has no %s yet, and nothing else does its job: remove the entry "
                            "(lockstep accepts %s)", what, name, list);
    const char *s = lk_suggest(name, names, ninfos);
    return at(cp, "%s.class_path: unknown class '%s'%s%s%s (lockstep accepts %s, optionally with a module path such as "
              "lightning.pytorch.callbacks.)", what, full, s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "", list);
}

/* init_args of class `info` into obj; unknown keys name the accepted ones. */
static lk_status apply_init_args(const lk_callback_info *info, const lk_config_node *ia, void *obj, const char *what,
                                 const char *const *skip, int nskip) {
    LK_TRY(lk_params_defaults(info->params, info->n_params, obj));
    for (int i = 0; i < lk_config_node_count(ia); i++) {
        const lk_config_node *c = lk_config_node_child(ia, i);
        const char *key = lk_config_node_key(c);
        if (lk_params_find(info->params, info->n_params, key)) continue;
        const char *names[32];
        for (int k = 0; k < info->n_params && k < 32; k++) names[k] = info->params[k].name;
        const char *s = lk_suggest(key, names, info->n_params < 32 ? info->n_params : 32);
        char list[1024];
        join_names(info->params, info->n_params, list, sizeof list);
        return at(c, "%s.init_args: unknown key '%s' for %s%s%s%s (accepted: %s)", what, key, info->name,
                  s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "", list);
    }
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s.init_args", what);
    return lk_config_apply_params_except(ia, info->params, info->n_params, obj, prefix, skip, nskip);
}

static lk_status apply_callback(const lk_config_node *e, const char *what, lk_trainer_config *cfg) {
    int k = 0;
    const lk_config_node *ia;
    LK_TRY(read_entry(e, what, callback_infos, NP(callback_infos), &k, &ia));
    const lk_callback_info *info = &callback_infos[k];
    scratch_args sa;
    memset(&sa, 0, sizeof sa);
    switch (k) {
    case CB_CHECKPOINT: {
        if (cfg->n_checkpoints == LK_MAX_CALLBACKS)
            return at(e, "%s: at most %d ModelCheckpoint callbacks", what, LK_MAX_CALLBACKS);
        lk_checkpoint_config *c = &cfg->checkpoints[cfg->n_checkpoints];
        LK_TRY(apply_init_args(info, ia, c, what, NULL, 0));
        if (!c->filename[0]) snprintf(c->filename, sizeof c->filename, "{epoch}-{step}");
        cfg->n_checkpoints++;
        return LK_STATUS_OK;
    }
    case CB_EARLY_STOPPING: {
        if (cfg->n_early_stopping == LK_MAX_CALLBACKS)
            return at(e, "%s: at most %d EarlyStopping callbacks", what, LK_MAX_CALLBACKS);
        lk_early_stopping_config *c = &cfg->early_stopping[cfg->n_early_stopping];
        LK_TRY(apply_init_args(info, ia, c, what, NULL, 0));
        if (!c->monitor[0]) return at(ia ? ia : e, "%s: EarlyStopping needs init_args.monitor (the metric to watch)", what);
        cfg->n_early_stopping++;
        return LK_STATUS_OK;
    }
    case CB_TIMER: {
        static const char *const skip[] = {"duration"};
        LK_TRY(apply_init_args(info, ia, &sa, what, skip, 1));
        double sec;
        char w[160];
        snprintf(w, sizeof w, "%s.init_args.duration", what);
        LK_TRY(parse_duration(lk_config_node_get(ia, "duration"), w, &sec));
        if (sec > 0 && (cfg->max_time <= 0 || sec < cfg->max_time)) cfg->max_time = sec;
        snprintf(cfg->time_check_interval, sizeof cfg->time_check_interval, "%.15s", sa.interval);
        return LK_STATUS_OK;
    }
    case CB_LR_MONITOR:
        LK_TRY(apply_init_args(info, ia, &sa, what, NULL, 0));
        snprintf(cfg->lr_logging_interval, sizeof cfg->lr_logging_interval, "%.15s", sa.logging_interval);
        return LK_STATUS_OK;
    case CB_SUMMARY:
        LK_TRY(apply_init_args(info, ia, &sa, what, NULL, 0));
        /* Lightning refuses the pair too: the callback would print what the flag turned off */
        if (!cfg->enable_model_summary)
            return at(e, "%s: ModelSummary is listed but trainer.enable_model_summary is false (remove one of them)",
                      what);
        cfg->model_summary_max_depth = sa.max_depth;
        return LK_STATUS_OK;
    case CB_DEVICE_STATS:
        LK_TRY(apply_init_args(info, ia, &sa, what, NULL, 0));
        cfg->device_stats_monitor = true;
        return LK_STATUS_OK;
    case CB_ON_EXCEPTION:
        LK_TRY(apply_init_args(info, ia, &sa, what, NULL, 0));
        if (!sa.dirpath[0]) return at(ia ? ia : e, "%s: OnExceptionCheckpoint needs init_args.dirpath", what);
        char path[2 * LK_PARAM_STR + 8];
        snprintf(path, sizeof path, "%s/%s.ckpt", sa.dirpath, sa.filename);
        if (strlen(path) >= sizeof cfg->on_exception_ckpt)
            return at(ia, "%s: OnExceptionCheckpoint dirpath + filename is longer than %d bytes", what, LK_PARAM_STR - 1);
        memcpy(cfg->on_exception_ckpt, path, strlen(path) + 1);
        return LK_STATUS_OK;
    default:
        return apply_init_args(info, ia, &sa, what, NULL, 0);
    }
}

static lk_status apply_logger(const lk_config_node *e, const char *what, lk_trainer_config *cfg) {
    int k = 0;
    const lk_config_node *ia;
    LK_TRY(read_entry(e, what, logger_infos, NP(logger_infos), &k, &ia));
    if (cfg->n_loggers == LK_MAX_CALLBACKS) return at(e, "%s: at most %d loggers", what, LK_MAX_CALLBACKS);
    logger_args la;
    memset(&la, 0, sizeof la);
    LK_TRY(apply_init_args(&logger_infos[k], ia, &la, what, NULL, 0));
    if (la.prefix[0]) return at(ia, "%s.init_args.prefix: lockstep writes metric names without a prefix", what);
    la.c.version = -1;
    if (la.version[0]) {
        char *end;
        const char *v = la.version;
        if (!strncmp(v, "version_", 8)) v += 8;
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || x < 0)
            return at(lk_config_node_get(ia, "version"), "%s.init_args.version: expected a number or version_N, got '%s'",
                      what, la.version);
        la.c.version = x;
    }
    snprintf(la.c.kind, sizeof la.c.kind, "%s", k == 0 ? "csv" : "tensorboard");
    if (!la.c.name[0]) snprintf(la.c.name, sizeof la.c.name, "lightning_logs");
    cfg->loggers[cfg->n_loggers++] = la.c;
    cfg->logger_set = true;
    return LK_STATUS_OK;
}

/* trainer.strategy as Lightning's {class_path, init_args} node: the class
 * (DDPStrategy, ... with or without its module path: the strategy registry
 * knows them) names the strategy, and its init_args set the trainer keys
 * of that strategy's options (they win over the flat keys beside them).
 * Which init_args a class takes is the strategy's list
 * (lk_strategy_init_args); what each sets is the trainer's. */
static lk_status apply_strategy_node(const lk_param *tp, int n, lk_trainer_config *cfg, const lk_config_node *c) {
    for (int i = 0; i < lk_config_node_count(c); i++) {
        const char *key = lk_config_node_key(lk_config_node_child(c, i));
        if (strcmp(key, "class_path") && strcmp(key, "init_args"))
            return at(lk_config_node_child(c, i),
                      "trainer.strategy: unknown key '%s' (a strategy node has class_path and init_args)", key);
    }
    int ncls;
    const char *const *classes = lk_strategy_class_names(&ncls);
    char list[256] = "";
    for (int i = 0; i < ncls; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", classes[i]);
    const lk_config_node *cp = lk_config_node_get(c, "class_path");
    const char *cls = cp ? lk_config_node_text(cp) : NULL;
    if (!cls) return at(cp ? cp : c, "trainer.strategy.class_path: expected a class name (one of %s)", list);
    const lk_strategy_info *si = lk_strategy_info_get(cls);
    if (!si || !si->class_name) {
        const char *dot = strrchr(cls, '.');
        const char *hint = lk_suggest(dot ? dot + 1 : cls, classes, ncls);
        return at(cp, "trainer.strategy.class_path: unknown class '%s'%s%s%s (lockstep accepts %s, optionally with a "
                  "module path such as lightning.pytorch.strategies.)",
                  cls, hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "", list);
    }
    const char *name = si->name;
    const lk_config_node *ia = lk_config_node_get(c, "init_args");
    if (ia && !lk_config_node_is_null(ia)) {
        if (lk_config_node_type(ia) != LK_CONFIG_MAP)
            return at(ia, "trainer.strategy.init_args: expected a map of %s's arguments", si->class_name);
        const char *const *keys = lk_strategy_init_args(cls);
        int nkeys = 0;
        char takes[256] = "";
        for (; keys[nkeys]; nkeys++)
            snprintf(takes + strlen(takes), sizeof takes - strlen(takes), "%s%s", nkeys ? ", " : "", keys[nkeys]);
        for (int i = 0; i < lk_config_node_count(ia); i++) {
            const lk_config_node *e = lk_config_node_child(ia, i);
            const char *key = lk_config_node_key(e), *v = lk_config_node_text(e);
            bool known = false;
            for (int k = 0; k < nkeys; k++) known |= !strcmp(key, keys[k]);
            if (!known) {
                const char *hint = lk_suggest(key, keys, nkeys);
                return at(e, "trainer.strategy.init_args: unknown argument '%s' for %s%s%s%s (%s takes %s)", key,
                          si->class_name, hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "",
                          si->class_name, nkeys ? takes : "none");
            }
            bool null = lk_config_node_is_null(e);
            if (!v && !null) return at(e, "trainer.strategy.init_args.%s: expected a value, not a collection", key);
            /* the trainer key each argument sets (NULL: checked, changes nothing here) */
            const char *tkey = !strcmp(key, "bucket_cap_mb")       ? "bucket_cap_mb"
                               : !strcmp(key, "ddp_comm_hook")     ? "ddp_comm_hook"
                               : !strcmp(key, "shared_params")     ? "ddp_shared_params"
                               : !strcmp(key, "broadcast_buffers") ? "ddp_broadcast_buffers"
                                                                   : NULL;
            if (!strcmp(key, "ddp_comm_hook") && null) v = "none"; /* Lightning's default: no hook */
            else if (null) return at(e, "trainer.strategy.init_args.%s: expected a value, got null", key);
            if (!strcmp(key, "stage")) { /* DeepSpeedStrategy: which ZeRO stage */
                if (!strcmp(v, "1")) name = "deepspeed_stage_1";
                else if (!strcmp(v, "2")) name = "deepspeed_stage_2";
                else if (!strcmp(v, "3"))
                    return at(e, "trainer.strategy.init_args.stage: ZeRO stage 3 (sharded parameters) is not built yet; "
                              "use stage 1 or 2");
                else return at(e, "trainer.strategy.init_args.stage: expected 1 or 2, got '%s'", v);
            } else if (!strcmp(key, "start_method")) { /* lockstep's ddp_spawn forks; popen starts fresh processes: ddp */
                if (!strcmp(v, "spawn") || !strcmp(v, "fork") || !strcmp(v, "forkserver")) name = "ddp_spawn";
                else if (!strcmp(v, "popen")) name = "ddp";
                else return at(e, "trainer.strategy.init_args.start_method: expected popen, spawn, fork or forkserver, got '%s'", v);
            } else if (tkey) {
                if (lk_params_set(tp, n, cfg, "trainer", tkey, v))
                    return at(e, "trainer.strategy.init_args.%s: %s", key, lk_last_error());
            } else if (strcmp(v, "true") && strcmp(v, "false") && strcmp(v, "True") && strcmp(v, "False")) {
                /* find_unused_parameters (an unused parameter's gradient is a zero in the flat buffer),
                 * gradient_as_bucket_view (always), static_graph (never assumed): booleans */
                return at(e, "trainer.strategy.init_args.%s: expected true or false, got '%s'", key, v);
            }
        }
    }
    if (lk_params_set(tp, n, cfg, "trainer", "strategy", name)) return at(c, "%s", lk_last_error());
    return LK_STATUS_OK;
}

static lk_status set_scalar(const lk_param *tp, int n, lk_trainer_config *cfg, const lk_config_node *c,
                            const char *value) {
    if (lk_params_set(tp, n, cfg, "trainer", lk_config_node_key(c), value)) return at(c, "%s", lk_last_error());
    return LK_STATUS_OK;
}

/* The keys the flat table cannot hold (their value forms are Lightning's). */
static const char *const special_keys[] = {"callbacks", "logger", "devices", "max_time", "fast_dev_run", "strategy"};

static lk_status apply_special(const lk_param *tp, int n, lk_trainer_config *cfg, const lk_config_node *c) {
    const char *key = lk_config_node_key(c), *text = lk_config_node_text(c);
    bool null = lk_config_node_is_null(c);
    char what[64];
    if (!strcmp(key, "callbacks")) {
        cfg->n_checkpoints = cfg->n_early_stopping = 0;
        cfg->lr_logging_interval[0] = cfg->time_check_interval[0] = 0;
        if (null) return LK_STATUS_OK;
        if (lk_config_node_type(c) == LK_CONFIG_MAP) {
            LK_TRY(apply_callback(c, "trainer.callbacks", cfg));
            return LK_STATUS_OK;
        }
        if (lk_config_node_type(c) != LK_CONFIG_SEQ)
            return at(c, "trainer.callbacks: expected a list of {class_path, init_args} entries");
        for (int j = 0; j < lk_config_node_count(c); j++) {
            snprintf(what, sizeof what, "trainer.callbacks[%d]", j);
            LK_TRY(apply_callback(lk_config_node_child(c, j), what, cfg));
        }
    } else if (!strcmp(key, "logger")) {
        cfg->n_loggers = 0;
        cfg->logger_set = false;
        if (null) return LK_STATUS_OK;
        if (text) {
            if (!strcmp(text, "false") || !strcmp(text, "False")) cfg->logger_set = true;
            else if (strcmp(text, "true") && strcmp(text, "True"))
                LK_TRY(apply_logger(c, "trainer.logger", cfg));
        } else if (lk_config_node_type(c) == LK_CONFIG_MAP) {
            LK_TRY(apply_logger(c, "trainer.logger", cfg));
        } else {
            cfg->logger_set = true; /* an empty list: no loggers */
            for (int j = 0; j < lk_config_node_count(c); j++) {
                snprintf(what, sizeof what, "trainer.logger[%d]", j);
                LK_TRY(apply_logger(lk_config_node_child(c, j), what, cfg));
            }
        }
    } else if (!strcmp(key, "devices")) {
        /* Lightning: an int, "auto", -1 (all), a list of indices or "0,1" */
        if (lk_config_node_type(c) == LK_CONFIG_MAP) return at(c, "trainer.devices: expected an int, auto, -1 or a list");
        int count = 0;
        cfg->devices_spec[0] = 0; /* the GPU ids, kept for lk__gpu_select (a count alone loses them) */
        if (lk_config_node_type(c) == LK_CONFIG_SEQ) {
            for (int j = 0; j < lk_config_node_count(c); j++) {
                const lk_config_node *e = lk_config_node_child(c, j);
                const char *et = lk_config_node_text(e);
                char *end;
                long v = et ? strtol(et, &end, 10) : -1;
                if (!et || end == et || *end || v < 0)
                    return at(e, "trainer.devices[%d]: expected a device index (0, 1, ...), got '%s'", j,
                              et ? et : "(a collection)");
                for (int q = 0; q < j; q++)
                    if (!strcmp(lk_config_node_text(lk_config_node_child(c, q)), et))
                        return at(e, "trainer.devices: index %s is listed twice", et);
                /* kept as "[0, 2]": a one-element list names a GPU, where "1" alone is a count */
                size_t sl = strlen(cfg->devices_spec);
                snprintf(cfg->devices_spec + sl, sizeof cfg->devices_spec - sl, "%s%ld", sl ? ", " : "[", v);
                count++;
            }
            if (!count) return at(c, "trainer.devices: an empty list selects no device (use auto or a number)");
            size_t sl = strlen(cfg->devices_spec);
            snprintf(cfg->devices_spec + sl, sizeof cfg->devices_spec - sl, "]");
            char v[32];
            snprintf(v, sizeof v, "%d", count);
            LK_TRY(set_scalar(tp, n, cfg, c, v));
        } else if (null || !strcmp(text, "auto")) {
            cfg->devices = 0;
        } else if (!strcmp(text, "-1")) { /* every device: a process per core on the CPU */
            snprintf(cfg->devices_spec, sizeof cfg->devices_spec, "-1");
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            cfg->devices = cores > 0 ? cores : 1;
        } else if (strchr(text, ',')) { /* "0,1": indices as a string */
            snprintf(cfg->devices_spec, sizeof cfg->devices_spec, "%s", text);
            for (const char *p = text; *p; p++) count += *p == ',';
            char v[32];
            snprintf(v, sizeof v, "%d", count + (text[strlen(text) - 1] != ','));
            LK_TRY(set_scalar(tp, n, cfg, c, v));
        } else {
            char *end;
            long long v = strtoll(text, &end, 10);
            if (end != text && !*end && v == 0) /* Lightning: "devices=0 is not a valid input" */
                return at(c, "trainer.devices: 0 selects no device (Lightning refuses it too): use a count of 1 or "
                          "more, auto, -1 (every core or GPU) or a list of indices such as [0]");
            LK_TRY(set_scalar(tp, n, cfg, c, text));
        }
    } else if (!strcmp(key, "max_time")) {
        LK_TRY(parse_duration(c, "trainer.max_time", &cfg->max_time));
    } else if (!strcmp(key, "fast_dev_run")) {
        if (text && (!strcmp(text, "true") || !strcmp(text, "True"))) cfg->fast_dev_run = 1;
        else if (text && (!strcmp(text, "false") || !strcmp(text, "False"))) cfg->fast_dev_run = 0;
        else if (text) LK_TRY(set_scalar(tp, n, cfg, c, text));
        else return at(c, "trainer.fast_dev_run: expected true, false or a number of batches");
    } else if (!strcmp(key, "strategy")) {
        if (lk_config_node_type(c) == LK_CONFIG_MAP) {
            LK_TRY(apply_strategy_node(tp, n, cfg, c));
            return LK_STATUS_OK;
        }
        if (!text) return at(c, "trainer.strategy: expected a name such as ddp, or {class_path: DDPStrategy, init_args: {...}}");
        const lk_strategy_info *si = lk_strategy_info_get(text); /* Lightning's aliases and class names */
        LK_TRY(set_scalar(tp, n, cfg, c, si ? si->name : text));
    }
    return LK_STATUS_OK;
}

/* Lightning's Trainer flags whose default is None: --print_config writes
 * them as null, which means the same default here (max_epochs' None is
 * resolved after the other keys, as Lightning's fit loop does). */
static const char *const none_default[] = {
    "max_epochs", "min_epochs", "min_steps", "limit_train_batches", "limit_val_batches", "limit_test_batches",
    "limit_predict_batches", "val_check_interval", "num_sanity_val_steps", "log_every_n_steps",
    "enable_checkpointing", "enable_progress_bar", "enable_model_summary", "gradient_clip_val",
    "gradient_clip_algorithm", "deterministic", "profiler", "default_root_dir"};

/* Lightning's Trainer flags that have no key of their own here, the values
 * accepted, and why another value is refused (the flag table in
 * docs/LIGHTNING.md says what each accepted value means here). */
enum { ANY_BOOL, ONLY_TRUE, ONLY_FALSE, ONLY_NULL, ANY_COUNT };
static const struct {
    const char *name;
    int accepts;
    const char *why; /* for a value outside `accepts` */
} lightning_flags[] = {
    /* a speed hint for cuDNN's autotuner: lockstep chooses its kernels without one */
    {"benchmark", ANY_BOOL, NULL},
    /* evaluation runs without the tape either way (torch.inference_mode or torch.no_grad) */
    {"inference_mode", ANY_BOOL, NULL},
    /* the loss and every gradient are checked for NaN/inf at every step, always */
    {"detect_anomaly", ANY_BOOL, NULL},
    /* the CLI's data modules read fixed data: reloading yields the same loaders, reshuffled each epoch anyway */
    {"reload_dataloaders_every_n_epochs", ANY_COUNT, NULL},
    {"use_distributed_sampler", ONLY_TRUE,
     "lockstep's loaders always give each rank its own shard of every split with the distributed sampler "
     "(Lightning's true)"},
    {"barebones", ONLY_FALSE,
     "lockstep has no one switch for it: set logger: false, enable_checkpointing: false, enable_progress_bar: false "
     "and enable_model_summary: false"},
    {"plugins", ONLY_NULL,
     "lockstep has no plugin classes: the precision is trainer.precision, and the cluster environment is read from "
     "the launcher's variables (torchrun, mpirun, srun)"},
};

static bool is_word(const char *t, const char *lower) {
    return t && (!strcmp(t, lower) || (t[0] == lower[0] - 32 && !strcmp(t + 1, lower + 1)));
}

static lk_status lightning_flag(int k, const lk_config_node *c) {
    const char *name = lightning_flags[k].name, *text = lk_config_node_text(c);
    int acc = lightning_flags[k].accepts;
    if (lk_config_node_is_null(c)) return LK_STATUS_OK; /* Lightning's default */
    if (acc == ANY_COUNT) {
        char *end;
        long long v = text ? strtoll(text, &end, 10) : -1;
        if (!text || end == text || *end || v < 0)
            return at(c, "trainer.%s: expected a number of epochs (0: never), got '%s'", name,
                      text ? text : "(a collection)");
        return LK_STATUS_OK;
    }
    if (acc == ONLY_NULL) {
        if (lk_config_node_type(c) == LK_CONFIG_SEQ && lk_config_node_count(c) == 0) return LK_STATUS_OK;
        return at(c, "trainer.%s is not supported (only null): %s", name, lightning_flags[k].why);
    }
    bool t = is_word(text, "true"), f = is_word(text, "false");
    if (!t && !f) return at(c, "trainer.%s: expected true or false, got '%s'", name, text ? text : "(a collection)");
    if ((acc == ONLY_TRUE && f) || (acc == ONLY_FALSE && t))
        return at(c, "trainer.%s: %s is not supported: %s", name, t ? "true" : "false", lightning_flags[k].why);
    return LK_STATUS_OK;
}

/* One key of the trainer section `t` (its child i); `others` is scratch
 * for the names of the keys the table must skip. */
static lk_status apply_key(const lk_param *tp, int n, lk_trainer_config *cfg, const lk_config_node *t, int i,
                           const char **others) {
    const lk_config_node *c = lk_config_node_child(t, i);
    const char *key = lk_config_node_key(c), *text = lk_config_node_text(c);
    bool null = lk_config_node_is_null(c);
    for (int k = 0; k < NP(lightning_flags); k++)
        if (!strcmp(key, lightning_flags[k].name)) return lightning_flag(k, c);
    if (null && !strcmp(key, "check_val_every_n_epoch")) { /* Lightning's None: by batches across epochs */
        cfg->check_val_every_n_epoch = 0;
        return LK_STATUS_OK;
    }
    for (int k = 0; null && k < NP(none_default); k++)
        if (!strcmp(key, none_default[k])) return set_scalar(tp, n, cfg, c, lk_params_find(tp, n, key)->def);
    if (!strcmp(key, "deterministic")) {
        cfg->deterministic_warn = text && !strcmp(text, "warn"); /* torch's warn_only */
        if (cfg->deterministic_warn) {
            cfg->deterministic = true;
            return LK_STATUS_OK;
        }
    }
    int k = 0;
    for (int j = 0; j < lk_config_node_count(t); j++)
        if (j != i) others[k++] = lk_config_node_key(lk_config_node_child(t, j));
    return lk_config_apply_params_except(t, tp, n, cfg, "trainer", others, k);
}

/* The message of the last error without the "[rank N] " that lk_error puts
 * in front (added again when the collected messages are raised). */
static const char *bare_error(void) {
    const char *m = lk_last_error();
    if (!strncmp(m, "[rank ", 6) && strstr(m, "] ")) m = strstr(m, "] ") + 2;
    return m;
}

lk_status lk_trainer_config_apply(const lk_config_node *t, lk_trainer_config *cfg) {
    int n;
    const lk_param *tp = lk_trainer_params(&n);
    if (!t || lk_config_node_is_null(t) || lk_config_node_type(t) != LK_CONFIG_MAP)
        return lk_config_apply_params(t, tp, n, cfg, "trainer");
    enum { MAX_KEYS = 256 };
    int count = lk_config_node_count(t);
    if (count > MAX_KEYS) return at(t, "trainer: %d keys; at most %d", count, MAX_KEYS);
    const char *others[MAX_KEYS];
    /* Every key is applied and every problem reported at once: a config
     * written by another program is fixed in one round, not one per run. */
    char errs[8192] = "";
    int nerr = 0;
    lk_status first = LK_STATUS_OK;
    for (int i = 0; i < 2 * count; i++) { /* the table's keys first: callbacks check some of them */
        const lk_config_node *c = lk_config_node_child(t, i % count);
        bool special = false;
        for (int k = 0; k < NP(special_keys) && !special; k++) special = !strcmp(lk_config_node_key(c), special_keys[k]);
        if (special != (i >= count)) continue;
        lk_status st = special ? apply_special(tp, n, cfg, c) : apply_key(tp, n, cfg, t, i, others);
        if (!st) continue;
        if (!nerr++) first = st;
        size_t l = strlen(errs);
        snprintf(errs + l, sizeof errs - l, "%s%s", l ? "\n  " : "", bare_error());
    }
    if (!nerr) {
        /* Lightning: max_epochs None is 1000 unless max_steps or max_time stops the run */
        if (lk_config_node_is_null(lk_config_node_get(t, "max_epochs")))
            cfg->max_epochs = cfg->max_steps == -1 && cfg->max_time <= 0 ? 1000 : -1;
        /* Lightning refuses a fraction here too: epochs are not counted */
        const lk_config_node *vci = lk_config_node_get(t, "val_check_interval");
        if (cfg->check_val_every_n_epoch == 0 && !cfg->val_check_interval.is_count && cfg->val_check_interval.value != 1.0)
            return at(vci ? vci : t,
                      "trainer.val_check_interval %g is a fraction of an epoch, but trainer.check_val_every_n_epoch is "
                      "null (validation every val_check_interval training batches, across epochs): give a number of "
                      "batches", cfg->val_check_interval.value);
    }
    const lk_config_node *ct = lk_config_node_get(t, "comm_timeout");
    const char *ct_file = lk_config_node_file(ct);
    if (ct && !(ct_file && !strcmp(ct_file, "(default)"))) /* not a default written back into the tree */
        lk_config_node_origin(ct, "trainer.comm_timeout", cfg->comm_timeout_from, sizeof cfg->comm_timeout_from);
    if (nerr == 1) return lk_error(first, "%s", errs);
    if (nerr) return lk_error(first, "%d problems in the trainer section:\n  %s", nerr, errs);
    return LK_STATUS_OK;
}

/* ---- activation checkpointing (trainer.activation_checkpointing[_policy]) ---- */

static void collect_types(const lk_layer *l, const char **types, int *n, int max) {
    bool seen = false;
    for (int i = 0; i < *n && !seen; i++) seen = !strcmp(types[i], l->type);
    if (!seen && *n < max) types[(*n)++] = l->type;
    for (int c = 0; c < l->n_children; c++) collect_types(l->children[c].layer, types, n, max);
}

lk_status lk__activation_checkpointing(const lk_trainer_config *c, lk_layer *net, int *count) {
    *count = 0;
    bool policy = c->activation_checkpointing_policy[0] != '\0';
    if (!net || (!c->activation_checkpointing && !policy)) return LK_STATUS_OK;
    if (c->sync_batchnorm)
        return lk_error(LK_STATUS_UNSUPPORTED, "trainer.activation_checkpointing with trainer.sync_batchnorm: a "
                        "recompute would all-reduce the statistics again inside the backward; turn one of them off");
    if (!policy) {
        *count = lk_layer_checkpoint_policy(net, NULL, 0);
        return LK_STATUS_OK;
    }
    /* "Linear,Conv2d", "[Linear, Conv2d]": class names, checked against the model's */
    enum { MAX = 64 };
    const char *have[MAX];
    int nhave = 0;
    collect_types(net, have, &nhave, MAX);
    char buf[LK_PARAM_STR];
    snprintf(buf, sizeof buf, "%s", c->activation_checkpointing_policy);
    const char *names[MAX];
    int n = 0;
    for (char *tok = strtok(buf, "[], \t"); tok; tok = strtok(NULL, "[], \t")) {
        bool ok = false;
        for (int i = 0; i < nhave && !ok; i++) ok = !strcmp(have[i], tok);
        if (!ok) {
            char list[512] = "";
            for (int i = 0; i < nhave; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", have[i]);
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.activation_checkpointing_policy: no layer of class "
                            "'%s' in the model (its layer classes: %s)", tok, list);
        }
        if (n < MAX) names[n++] = tok;
    }
    if (n == 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.activation_checkpointing_policy: '%s' names no layer class",
                        c->activation_checkpointing_policy);
    *count = lk_layer_checkpoint_policy(net, names, n);
    return LK_STATUS_OK;
}

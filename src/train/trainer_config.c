/* The trainer's and the optimizer's parameter tables: Lightning's flag names,
 * types, bounds, defaults and one line of help each. YAML validation, the
 * CLI's --help and --print_config all read these. */
#include <stddef.h>

#include "lockstep/trainer.h"

#define T(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(lk_trainer_config, field), def, lo, hi, choices, help}

static const lk_param trainer_params[] = {
    T("accelerator", ENUM, accelerator, "auto", 1, 0, "cpu|gpu|auto", "hardware to run on (gpu needs the CUDA backend)"),
    T("devices", INT, devices, "1", 0, 4096, NULL, "processes (cpu) or GPUs per node; 0 = auto"),
    T("strategy", ENUM, strategy, "auto", 1, 0, "auto|single|ddp|ddp_spawn|dp",
      "how training is spread over devices (dp: one process, a replica per device on threads)"),
    T("num_nodes", INT, num_nodes, "1", 1, 1e6, NULL, "machines (launched by mpirun or srun)"),
    T("precision", ENUM, precision, "32-true", 1, 0, "32-true|32", "numeric precision (mixed precision comes later)"),
    T("max_epochs", INT, max_epochs, "1000", -1, 1e12, NULL, "stop after this many epochs (-1: no limit)"),
    T("min_epochs", INT, min_epochs, "0", 0, 1e12, NULL, "train at least this many epochs (early stopping waits)"),
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
    T("check_val_every_n_epoch", INT, check_val_every_n_epoch, "1", 1, 1e9, NULL, "validate every N epochs"),
    T("log_every_n_steps", INT, log_every_n_steps, "50", 1, 1e9, NULL, "write step metrics every N steps"),
    T("enable_progress_bar", BOOL, enable_progress_bar, "true", 1, 0, NULL, "show progress (a bar on a terminal, lines otherwise)"),
    T("enable_checkpointing", BOOL, enable_checkpointing, "true", 1, 0, NULL, "write checkpoints (last.ckpt and top-k)"),
    T("default_root_dir", STRING, default_root_dir, ".", 1, 0, NULL, "where lightning_logs/version_N/ is created"),
    T("deterministic", BOOL, deterministic, "false", 1, 0, NULL, "refuse options that would break bitwise reproducibility"),
    T("fast_dev_run", INT, fast_dev_run, "0", 0, 1e9, NULL, "run N batches of each loop, no logs or checkpoints (0: off)"),
    T("overfit_batches", INT, overfit_batches, "0", 0, 1e9, NULL, "train and validate on the first N training batches"),
    T("seed", INT, seed, "0", 0, 4294967295.0, NULL, "seed_everything: parameters, data order, dropout, augmentation"),
    T("comm_timeout", FLOAT, comm_timeout, "120", 0.1, 1e6, NULL, "seconds any collective may wait before failing"),
    T("checkpoint_timeout", FLOAT, checkpoint_timeout, "1800", 0.1, 1e7, NULL,
      "seconds the other ranks wait for rank 0 to write a checkpoint or prepare data (instead of comm_timeout)"),
    T("bucket_cap_mb", FLOAT, bucket_cap_mb, "25", 1e-6, 1e6, NULL, "ddp gradient bucket size in MB"),
    T("ddp_comm_hook", ENUM, ddp_comm_hook, "none", 1, 0, "none|bf16_compress|fp16_compress",
      "ddp: gradients travel as bf16/fp16 (half the bytes, rounded) instead of exact f32"),
    T("ddp_shared_params", BOOL, ddp_shared_params, "true", 1, 0, NULL,
      "ddp on one node: one copy of parameters and optimizer state, each rank updates 1/N (false: a replica per rank)"),
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
};

const lk_param *lk_trainer_params(int *count) {
    *count = (int)(sizeof trainer_params / sizeof trainer_params[0]);
    return trainer_params;
}

lk_status lk_trainer_config_default(lk_trainer_config *cfg) {
    int n;
    const lk_param *p = lk_trainer_params(&n);
    return lk_params_defaults(p, n, cfg);
}

#define O(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(lk_optim_settings, field), def, lo, hi, choices, help}

static const lk_param optim_params[] = {
    O("name", ENUM, name, "adam", 1, 0, "adam|adamw|sgd", "optimizer"),
    O("lr", FLOAT, lr, "0.001", 0, 1e6, NULL, "learning rate"),
    O("weight_decay", FLOAT, weight_decay, "0", 0, 1e6, NULL, "L2 penalty (adamw: decoupled decay)"),
    O("momentum", FLOAT, momentum, "0", 0, 1, NULL, "sgd momentum"),
    O("dampening", FLOAT, dampening, "0", 0, 1, NULL, "sgd dampening"),
    O("nesterov", BOOL, nesterov, "false", 1, 0, NULL, "sgd Nesterov momentum"),
    O("beta1", FLOAT, beta1, "0.9", 0, 0.999999, NULL, "adam beta1"),
    O("beta2", FLOAT, beta2, "0.999", 0, 0.99999999, NULL, "adam beta2"),
    O("eps", FLOAT, eps, "1e-8", 0, 1, NULL, "adam epsilon"),
    O("amsgrad", BOOL, amsgrad, "false", 1, 0, NULL, "adam/adamw AMSGrad variant"),
    O("scheduler", ENUM, scheduler, "none", 1, 0, "none|step|multistep|exponential|cosine|linear|onecycle|plateau",
      "learning-rate scheduler"),
    O("interval", ENUM, interval, "epoch", 1, 0, "epoch|step", "step the scheduler every epoch or every optimizer step"),
    O("step_size", INT, step_size, "0", 0, 1e12, NULL, "step: period; cosine: T_max (0: the whole run); linear: iterations"),
    O("gamma", FLOAT, gamma, "0.1", 0, 1e6, NULL, "step/multistep/exponential decay factor"),
    O("milestones", INTS, milestones, "[]", 0, 1e12, NULL, "multistep: epochs (or steps) where lr *= gamma"),
    O("eta_min", FLOAT, eta_min, "0", 0, 1e6, NULL, "cosine: final learning rate"),
    O("start_factor", FLOAT, start_factor, "0.333333333", 1e-12, 1, NULL, "linear: first factor"),
    O("end_factor", FLOAT, end_factor, "1.0", 0, 1, NULL, "linear: last factor"),
    O("max_lr", FLOAT, max_lr, "0", 0, 1e6, NULL, "onecycle: peak learning rate (0: 10 x lr)"),
    O("monitor", STRING, monitor, "val_loss", 1, 0, NULL, "plateau: metric to watch"),
    O("factor", FLOAT, factor, "0.1", 0, 0.999999, NULL, "plateau: lr *= factor"),
    O("patience", INT, patience, "10", 0, 1e9, NULL, "plateau: epochs without improvement"),
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

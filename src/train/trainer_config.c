/* The trainer's and the optimizer's parameter tables: Lightning's flag names,
 * types, bounds, defaults and one line of help each. YAML validation, the
 * CLI's --help and --print_config all read these. Also the value forms
 * a flat table cannot hold that Lightning accepts (fast_dev_run: true,
 * devices: [0, 1], max_time: "00:01:00:00", the strategy's config node);
 * trainer.callbacks and trainer.logger, lists of class_path entries, are
 * config_classes.c's. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lockstep/config.h"
#include "lockstep/trainer.h"
#include "train/trainer_config_impl.h"

#define NP(t) (int)(sizeof t / sizeof t[0])
#define T(name, type, field, def, lo, hi, choices, help) \
    {name, LK_PARAM_##type, offsetof(lk_trainer_config, field), def, lo, hi, choices, help}

static const lk_param trainer_params[] = {
    T("accelerator", ENUM, accelerator, "auto", 1, 0, "cpu|gpu|cuda|auto", "hardware to run on (gpu needs the CUDA backend)"),
    T("devices", INT, devices, "1", 0, 4096, NULL, "processes (cpu) or GPUs per node; 0 = auto"),
    T("strategy", ENUM, strategy, "auto", 1, 0,
      "auto|single|ddp|ddp_spawn|dp|deepspeed_stage_1|deepspeed_stage_2|deepspeed_stage_3|fsdp|model_parallel|pipeline",
      "how training is spread over devices (dp: one process, a replica per device on threads; ddp_spawn: "
      "ranks forked from this process, then trained as ddp; deepspeed_stage_1/2: lockstep's own ZeRO, the "
      "optimizer update (and with 2 the gradients) sharded over the ranks, docs/STRATEGIES.md; model_parallel, "
      "pipeline: the model's blocks cut into stages, one per process, docs/PIPELINE.md)"),
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
    T("memory_limit_mb", FLOAT, memory_limit_mb, "0", 0, 1e9, NULL,
      "per-rank cap on the MiB lockstep allocates on the host, the shared heap included; an allocation past it ends "
      "the fit with an out-of-memory error naming it (0: LK_MEMORY_LIMIT_MB, else none)"),
    /* trainer.pipeline: {chunks, schedule, split, stages, virtual_stages} (apply_special) */
    T("pipeline_chunks", INT, pipeline_chunks, "4", 1, 65536, NULL,
      "pipeline: micro-batches per batch (trainer.pipeline.chunks; must divide the batch)"),
    T("pipeline_schedule", ENUM, pipeline_schedule, "1f1b", 1, 0, "gpipe|1f1b|interleaved_1f1b",
      "pipeline: the schedule (trainer.pipeline.schedule; docs/PIPELINE.md)"),
    T("pipeline_split", STRING, pipeline_split, "", 1, 0, NULL,
      "model_parallel, pipeline: each stage's first block after the first, comma-separated; 'time': by the measured time of "
      "each block (profiled on the first batch); empty or 'parameters': balanced by parameter count"),
    T("pipeline_stages", INT, pipeline_stages, "0", 0, 4096, NULL,
      "model_parallel, pipeline: the stages (trainer.pipeline.stages); devices = stages x data-parallel replicas (0: one stage per device)"),
    T("pipeline_virtual_stages", INT, pipeline_virtual_stages, "0", 0, 64, NULL,
      "pipeline, schedule interleaved_1f1b: the model's stages per rank (trainer.pipeline.virtual_stages; 0: 2)"),
    T("bucket_cap_mb", FLOAT, bucket_cap_mb, "25", 1e-6, 1e6, NULL, "ddp gradient bucket size in MB"),
    T("state_dict_type", ENUM, state_dict_type, "full", 1, 0, "full|sharded",
      "deepspeed_stage_1/2: checkpoints as one whole file (full), or as a set of one shard per rank plus an index "
      "that loads at any world size (sharded; docs/CHECKPOINTS.md)"),
    T("ddp_comm_hook", ENUM, ddp_comm_hook, "none", 1, 0, "none|bf16_compress|fp16_compress",
      "ddp: gradients travel as bf16/fp16 (half the bytes, rounded) instead of exact f32"),
    T("ddp_shared_params", BOOL, ddp_shared_params, "true", 1, 0, NULL,
      "ddp on one node: one copy of parameters and optimizer state, each rank updates 1/N (false: a replica per rank)"),
    T("fsdp_sharding_strategy", ENUM, fsdp_sharding_strategy, "FULL_SHARD", 1, 0,
      "FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD",
      "fsdp, deepspeed_stage_3: what is sharded (FSDPStrategy's sharding_strategy; docs/STRATEGIES.md)"),
    T("fsdp_auto_wrap_policy", STRING, fsdp_auto_wrap_policy, "", 1, 0, NULL,
      "fsdp, deepspeed_stage_3: the layer classes that become units, comma-separated (\"Block\"); \"none\": one unit; "
      "empty: the model's repeated blocks"),
    T("fsdp_min_num_params", INT, fsdp_min_num_params, "0", 0, 1e15, NULL,
      "fsdp, deepspeed_stage_3: wrap layers by size instead (torch's size_based_auto_wrap_policy; 0: off)"),
    T("fsdp_forward_prefetch", BOOL, fsdp_forward_prefetch, "true", 1, 0, NULL,
      "fsdp, deepspeed_stage_3: gather the next unit while this one computes"),
    T("fsdp_backward_prefetch", BOOL, fsdp_backward_prefetch, "true", 1, 0, NULL,
      "fsdp, deepspeed_stage_3: gather the unit the backward reaches next while this one computes"),
    T("fsdp_cpu_offload", BOOL, fsdp_cpu_offload, "false", 1, 0, NULL,
      "deepspeed_stage_2/3, fsdp on a GPU: master chunks, gradient chunks and optimizer state in host memory, the "
      "optimizer on the CPU (FSDPStrategy's cpu_offload; the *_offload strategy names set it)"),
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
    T("enable_autolog_hparams", BOOL, enable_autolog_hparams, "true", 1, 0, NULL,
      "log the model's and data module's init args (hparams.yaml, TensorBoard's HParams tab); false: hparams.yaml "
      "is {}"),
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
    O("pct_start", FLOAT, pct_start, "0.3", 0, 1, NULL, "onecycle: share of the cycle spent raising the lr"),
    O("anneal_strategy", ENUM, anneal_strategy, "cos", 1, 0, "cos|linear", "onecycle: the shape of the lr's change"),
    O("cycle_momentum", BOOL, cycle_momentum, "false", 1, 0, NULL,
      "onecycle: cycle the momentum (Adam's beta1) inversely to the lr (torch's default true; a class_path "
      "OneCycleLR without it gets true)"),
    O("base_momentum", FLOAT, base_momentum, "0.85", 0, 1, NULL, "onecycle: the momentum at the lr's peak"),
    O("max_momentum", FLOAT, max_momentum, "0.95", 0, 1, NULL, "onecycle: the momentum at the lr's ends"),
    O("div_factor", FLOAT, div_factor, "25", 1e-12, 1e12, NULL, "onecycle: initial lr = max_lr / div_factor"),
    O("final_div_factor", FLOAT, final_div_factor, "10000", 1e-12, 1e15, NULL,
      "onecycle: final lr = initial lr / final_div_factor"),
    O("three_phase", BOOL, three_phase, "false", 1, 0, NULL, "onecycle: a third phase down to the final lr"),
    O("total_steps", INT, total_steps, "0", 0, 2147483647, NULL,
      "onecycle: scheduler steps in the cycle (0: epochs x steps_per_epoch when set, else the run's length)"),
    O("epochs", INT, epochs, "0", 0, 2147483647, NULL, "onecycle: with steps_per_epoch, the cycle's length"),
    O("steps_per_epoch", INT, steps_per_epoch, "0", 0, 2147483647, NULL, "onecycle: with epochs, the cycle's length"),
    O("monitor", STRING, monitor, "val_loss", 1, 0, NULL, "plateau: metric to watch"),
    O("factor", FLOAT, factor, "0.1", 0, 0.999999, NULL, "plateau: lr *= factor"),
    O("patience", INT, patience, "10", 0, 1e9, NULL, "plateau: epochs without improvement"),
    O("mode", ENUM, mode, "min", 1, 0, "min|max", "plateau: min (the metric should fall) or max"),
    O("threshold", FLOAT, threshold, "0.0001", 0, 1e30, NULL, "plateau: the least change that counts as an improvement"),
    O("threshold_mode", ENUM, threshold_mode, "rel", 1, 0, "rel|abs", "plateau: threshold relative to the best, or absolute"),
    O("cooldown", INT, cooldown, "0", 0, 1e9, NULL, "plateau: epochs to wait after a reduction"),
    O("min_lr", FLOAT, min_lr, "0", 0, 1e6, NULL, "plateau: lower bound of the learning rate"),
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
    s->plateau_eps = 1e-8; /* torch's; not in the table (optimizer.eps is Adam's) */
    return lk_params_defaults(p, n, s);
}


/* trainer.strategy as Lightning's {class_path, init_args} node: the class
 * (DDPStrategy, ... with or without its module path: the strategy registry
 * knows them) names the strategy, and its init_args set the trainer keys
 * of that strategy's options (they win over the flat keys beside them).
 * Which init_args a class takes is the strategy's list
 * (lk_strategy_init_args); what each sets is the trainer's. */
/* One of FSDPStrategy's init_args: the trainer key it sets, or a check of
 * an argument that changes nothing in lockstep (registry.c says why). */
static lk_status apply_fsdp_arg(const lk_param *tp, int n, lk_trainer_config *cfg, const lk_config_node *e,
                                const char *key, const char *v, bool null) {
    const char *tkey = !strcmp(key, "sharding_strategy")                 ? "fsdp_sharding_strategy"
                       : !strcmp(key, "auto_wrap_policy")                ? "fsdp_auto_wrap_policy"
                       : !strcmp(key, "min_num_params")                  ? "fsdp_min_num_params"
                       : !strcmp(key, "forward_prefetch")                ? "fsdp_forward_prefetch"
                       : !strcmp(key, "cpu_offload")                     ? "fsdp_cpu_offload"
                       : !strcmp(key, "activation_checkpointing_policy") ? "activation_checkpointing_policy"
                                                                         : NULL;
    char val[LK_PARAM_STR];
    if (!strcmp(key, "backward_prefetch")) { /* torch's BackwardPrefetch: BACKWARD_PRE (lockstep's), or none */
        const char *d = v ? strrchr(v, '.') : NULL;
        const char *b = d ? d + 1 : v;
        if (null || !strcmp(b, "None") || !strcmp(b, "none")) v = "false";
        else if (!strcmp(b, "BACKWARD_PRE") || !strcmp(b, "BACKWARD_POST")) v = "true"; /* POST: PRE's overlap, which is not worse */
        else return lk__cfg_at(e, "trainer.strategy.init_args.backward_prefetch: expected BACKWARD_PRE, BACKWARD_POST or null, got '%s'", b);
        tkey = "fsdp_backward_prefetch";
    } else if (!strcmp(key, "sharding_strategy") && v) { /* "FULL_SHARD", ShardingStrategy.FULL_SHARD, or its number */
        const char *d = strrchr(v, '.');
        static const char *const by_number[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};
        snprintf(val, sizeof val, "%s", d ? d + 1 : v);
        if (val[0] >= '1' && val[0] <= '4' && !val[1]) snprintf(val, sizeof val, "%s", by_number[val[0] - '1']);
        v = val;
    } else if (!strcmp(key, "mixed_precision")) {
        if (!null) return lk__cfg_at(e, "trainer.strategy.init_args.mixed_precision: set trainer.precision instead "
                             "(bf16-mixed, 16-mixed: the shards stay f32, the compute runs in the low precision)");
        return LK_STATUS_OK;
    } else if (!strcmp(key, "state_dict_type")) {
        if (null) return LK_STATUS_OK;
        tkey = "state_dict_type"; /* full (one file) or sharded (a set, docs/CHECKPOINTS.md) */
    }
    if (null) {
        if (!strcmp(key, "auto_wrap_policy")) v = ""; /* the model's blocks */
        else if (!strcmp(key, "activation_checkpointing_policy")) v = "";
        else return lk__cfg_at(e, "trainer.strategy.init_args.%s: expected a value, got null", key);
    }
    if (tkey) {
        if (lk_params_set(tp, n, cfg, "trainer", tkey, v))
            return lk__cfg_at(e, "trainer.strategy.init_args.%s: %s", key, lk_last_error());
        if (!strcmp(key, "activation_checkpointing_policy") && *v && lk_params_set(tp, n, cfg, "trainer", "activation_checkpointing", "true"))
            return lk__cfg_at(e, "trainer.strategy.init_args.%s: %s", key, lk_last_error());
        return LK_STATUS_OK;
    }
    if (strcmp(v, "true") && strcmp(v, "false") && strcmp(v, "True") && strcmp(v, "False"))
        return lk__cfg_at(e, "trainer.strategy.init_args.%s: expected true or false, got '%s'", key, v);
    return LK_STATUS_OK;
}

static lk_status apply_strategy_node(const lk_param *tp, int n, lk_trainer_config *cfg, const lk_config_node *c) {
    for (int i = 0; i < lk_config_node_count(c); i++) {
        const char *key = lk_config_node_key(lk_config_node_child(c, i));
        if (strcmp(key, "class_path") && strcmp(key, "init_args"))
            return lk__cfg_at(lk_config_node_child(c, i),
                      "trainer.strategy: unknown key '%s' (a strategy node has class_path and init_args)", key);
    }
    int ncls;
    const char *const *classes = lk_strategy_class_names(&ncls);
    char list[256] = "";
    for (int i = 0; i < ncls; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", classes[i]);
    const lk_config_node *cp = lk_config_node_get(c, "class_path");
    const char *cls = cp ? lk_config_node_text(cp) : NULL;
    if (!cls) return lk__cfg_at(cp ? cp : c, "trainer.strategy.class_path: expected a class name (one of %s)", list);
    const lk_strategy_info *si = lk_strategy_info_get(cls);
    if (!si || !si->class_name) {
        const char *dot = strrchr(cls, '.');
        const char *hint = lk_suggest(dot ? dot + 1 : cls, classes, ncls);
        return lk__cfg_at(cp, "trainer.strategy.class_path: unknown class '%s'%s%s%s (lockstep accepts %s, optionally with a "
                  "module path such as lightning.pytorch.strategies.)",
                  cls, hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "", list);
    }
    const char *name = si->name;
    const lk_config_node *ia = lk_config_node_get(c, "init_args");
    if (ia && !lk_config_node_is_null(ia)) {
        if (lk_config_node_type(ia) != LK_CONFIG_MAP)
            return lk__cfg_at(ia, "trainer.strategy.init_args: expected a map of %s's arguments", si->class_name);
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
            if (nkeys && !strcmp(key, "timeout")) { /* torch.distributed's process-group timeout: comm_timeout */
                double sec;
                LK_TRY(lk__cfg_parse_duration_hms(e, "trainer.strategy.init_args.timeout", true, &sec));
                if (sec <= 0) continue; /* null: Lightning's default_pg_timeout; lockstep's comm_timeout stays */
                char val[64];
                snprintf(val, sizeof val, "%.17g", sec);
                if (lk_params_set(tp, n, cfg, "trainer", "comm_timeout", val))
                    return lk__cfg_at(e, "trainer.strategy.init_args.timeout: %s", lk_last_error());
                lk_config_node_origin(e, "trainer.strategy.init_args.timeout", cfg->comm_timeout_from,
                                      sizeof cfg->comm_timeout_from);
                continue;
            }
            if (!known && nkeys && lk_config_node_is_null(e)) {
                /* the constructor arguments LightningCLI prints at their None:
                 * the Trainer's own flags and lockstep's launcher fill them */
                static const char *const at_none[] = {"accelerator", "parallel_devices", "cluster_environment",
                                                      "checkpoint_io", "precision_plugin", "precision",
                                                      "ddp_comm_state", "ddp_comm_wrapper", "model_averaging_period",
                                                      "process_group_backend"};
                for (size_t k = 0; k < sizeof at_none / sizeof at_none[0] && !known; k++) known = !strcmp(key, at_none[k]);
                if (known) continue;
            }
            if (!known) {
                const char *hint = lk_suggest(key, keys, nkeys);
                return lk__cfg_at(e, "trainer.strategy.init_args: unknown argument '%s' for %s%s%s%s (%s takes %s)", key,
                          si->class_name, hint ? " (did you mean '" : "", hint ? hint : "", hint ? "'?)" : "",
                          si->class_name, nkeys ? takes : "none");
            }
            bool null = lk_config_node_is_null(e);
            /* FSDPStrategy's class lists (auto_wrap_policy, activation_checkpointing_policy) may be YAML lists
             * of class names or dotted class paths: joined with commas, each name's last component */
            char joined[LK_PARAM_STR];
            if (!v && !null && lk_config_node_type(e) == LK_CONFIG_SEQ &&
                (!strcmp(key, "auto_wrap_policy") || !strcmp(key, "activation_checkpointing_policy"))) {
                joined[0] = 0;
                for (int j = 0; j < lk_config_node_count(e); j++) {
                    const char *t = lk_config_node_text(lk_config_node_child(e, j));
                    if (!t) return lk__cfg_at(e, "trainer.strategy.init_args.%s: expected a list of layer class names", key);
                    const char *d = strrchr(t, '.');
                    snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", j ? "," : "", d ? d + 1 : t);
                }
                v = joined;
            }
            if (!v && !null && !strcmp(key, "mixed_precision")) v = "(a policy)"; /* refused with the key to use */
            if (!v && !null) return lk__cfg_at(e, "trainer.strategy.init_args.%s: expected a value, not a collection", key);
            if (!strcmp(si->class_name, "FSDPStrategy")) {
                LK_TRY(apply_fsdp_arg(tp, n, cfg, e, key, v, null));
                continue;
            }
            if (!strcmp(si->name, "pipeline")) { /* PipelineStrategy: trainer.pipeline.KEY */
                char pkey[32];
                snprintf(pkey, sizeof pkey, "pipeline_%s", key);
                if (null) return lk__cfg_at(e, "trainer.strategy.init_args.%s: expected a value, got null", key);
                if (lk_params_set(tp, n, cfg, "trainer", pkey, v))
                    return lk__cfg_at(e, "trainer.strategy.init_args.%s: %s", key, lk_last_error());
                continue;
            }
            /* the trainer key each argument sets (NULL: checked, changes nothing here) */
            const char *tkey = !strcmp(key, "bucket_cap_mb")       ? "bucket_cap_mb"
                               : !strcmp(key, "ddp_comm_hook")     ? "ddp_comm_hook"
                               : !strcmp(key, "shared_params")     ? "ddp_shared_params"
                               : !strcmp(key, "broadcast_buffers") ? "ddp_broadcast_buffers"
                               : !strcmp(key, "state_dict_type")   ? "state_dict_type"
                               : !strcmp(key, "offload_optimizer") ? "fsdp_cpu_offload"
                                                                   : NULL;
            if (!strcmp(key, "ddp_comm_hook") && null) v = "none"; /* Lightning's default: no hook */
            else if (null) return lk__cfg_at(e, "trainer.strategy.init_args.%s: expected a value, got null", key);
            if (!strcmp(key, "stage")) { /* DeepSpeedStrategy: which ZeRO stage */
                if (!strcmp(v, "1")) name = "deepspeed_stage_1";
                else if (!strcmp(v, "2")) name = "deepspeed_stage_2";
                else if (!strcmp(v, "3")) name = "deepspeed_stage_3";
                else return lk__cfg_at(e, "trainer.strategy.init_args.stage: expected 1, 2 or 3, got '%s'", v);
            } else if (!strcmp(key, "start_method")) { /* lockstep's ddp_spawn forks; popen starts fresh processes: ddp */
                if (!strcmp(v, "spawn") || !strcmp(v, "fork") || !strcmp(v, "forkserver")) name = "ddp_spawn";
                else if (!strcmp(v, "popen")) name = "ddp";
                else return lk__cfg_at(e, "trainer.strategy.init_args.start_method: expected popen, spawn, fork or forkserver, got '%s'", v);
            } else if (tkey) {
                if (lk_params_set(tp, n, cfg, "trainer", tkey, v))
                    return lk__cfg_at(e, "trainer.strategy.init_args.%s: %s", key, lk_last_error());
            } else if (strcmp(v, "true") && strcmp(v, "false") && strcmp(v, "True") && strcmp(v, "False")) {
                /* find_unused_parameters (an unused parameter's gradient is a zero in the flat buffer),
                 * gradient_as_bucket_view (always), static_graph (never assumed): booleans */
                return lk__cfg_at(e, "trainer.strategy.init_args.%s: expected true or false, got '%s'", key, v);
            }
        }
    }
    if (lk_params_set(tp, n, cfg, "trainer", "strategy", name)) return lk__cfg_at(c, "%s", lk_last_error());
    return LK_STATUS_OK;
}

static lk_status set_scalar(const lk_param *tp, int n, lk_trainer_config *cfg, const lk_config_node *c,
                            const char *value) {
    if (lk_params_set(tp, n, cfg, "trainer", lk_config_node_key(c), value)) return lk__cfg_at(c, "%s", lk_last_error());
    return LK_STATUS_OK;
}

/* The keys the flat table cannot hold (their value forms are Lightning's). */
static const char *const special_keys[] = {"callbacks", "logger", "devices", "max_time", "fast_dev_run", "strategy",
                                           "pipeline"};

static lk_status apply_special(const lk_param *tp, int n, lk_trainer_config *cfg, const lk_config_node *c) {
    const char *key = lk_config_node_key(c), *text = lk_config_node_text(c);
    bool null = lk_config_node_is_null(c);
    char what[64];
    if (!strcmp(key, "callbacks")) {
        cfg->n_checkpoints = cfg->n_early_stopping = 0;
        cfg->lr_logging_interval[0] = cfg->time_check_interval[0] = 0;
        if (null) return LK_STATUS_OK;
        if (lk_config_node_type(c) == LK_CONFIG_MAP) {
            LK_TRY(lk__cfg_apply_callback(c, "trainer.callbacks", cfg));
            return LK_STATUS_OK;
        }
        if (lk_config_node_type(c) != LK_CONFIG_SEQ)
            return lk__cfg_at(c, "trainer.callbacks: expected a list of {class_path, init_args} entries");
        for (int j = 0; j < lk_config_node_count(c); j++) {
            snprintf(what, sizeof what, "trainer.callbacks[%d]", j);
            LK_TRY(lk__cfg_apply_callback(lk_config_node_child(c, j), what, cfg));
        }
    } else if (!strcmp(key, "logger")) {
        cfg->n_loggers = 0;
        cfg->logger_set = false;
        if (null) return LK_STATUS_OK;
        if (text) {
            if (!strcmp(text, "false") || !strcmp(text, "False")) cfg->logger_set = true;
            else if (strcmp(text, "true") && strcmp(text, "True"))
                LK_TRY(lk__cfg_apply_logger(c, "trainer.logger", cfg));
        } else if (lk_config_node_type(c) == LK_CONFIG_MAP) {
            LK_TRY(lk__cfg_apply_logger(c, "trainer.logger", cfg));
        } else {
            cfg->logger_set = true; /* an empty list: no loggers */
            for (int j = 0; j < lk_config_node_count(c); j++) {
                snprintf(what, sizeof what, "trainer.logger[%d]", j);
                LK_TRY(lk__cfg_apply_logger(lk_config_node_child(c, j), what, cfg));
            }
        }
    } else if (!strcmp(key, "devices")) {
        /* Lightning: an int, "auto", -1 (all), a list of indices or "0,1" */
        if (lk_config_node_type(c) == LK_CONFIG_MAP) return lk__cfg_at(c, "trainer.devices: expected an int, auto, -1 or a list");
        int count = 0;
        cfg->devices_spec[0] = 0; /* the GPU ids, kept for lk__gpu_select (a count alone loses them) */
        if (lk_config_node_type(c) == LK_CONFIG_SEQ) {
            for (int j = 0; j < lk_config_node_count(c); j++) {
                const lk_config_node *e = lk_config_node_child(c, j);
                const char *et = lk_config_node_text(e);
                char *end;
                long v = et ? strtol(et, &end, 10) : -1;
                if (!et || end == et || *end || v < 0)
                    return lk__cfg_at(e, "trainer.devices[%d]: expected a device index (0, 1, ...), got '%s'", j,
                              et ? et : "(a collection)");
                for (int q = 0; q < j; q++)
                    if (!strcmp(lk_config_node_text(lk_config_node_child(c, q)), et))
                        return lk__cfg_at(e, "trainer.devices: index %s is listed twice", et);
                /* kept as "[0, 2]": a one-element list names a GPU, where "1" alone is a count */
                size_t sl = strlen(cfg->devices_spec);
                snprintf(cfg->devices_spec + sl, sizeof cfg->devices_spec - sl, "%s%ld", sl ? ", " : "[", v);
                count++;
            }
            if (!count) return lk__cfg_at(c, "trainer.devices: an empty list selects no device (use auto or a number)");
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
                return lk__cfg_at(c, "trainer.devices: 0 selects no device (Lightning refuses it too): use a count of 1 or "
                          "more, auto, -1 (every core or GPU) or a list of indices such as [0]");
            LK_TRY(set_scalar(tp, n, cfg, c, text));
        }
    } else if (!strcmp(key, "max_time")) {
        LK_TRY(lk__cfg_parse_duration(c, "trainer.max_time", &cfg->max_time));
    } else if (!strcmp(key, "fast_dev_run")) {
        if (text && (!strcmp(text, "true") || !strcmp(text, "True"))) cfg->fast_dev_run = 1;
        else if (text && (!strcmp(text, "false") || !strcmp(text, "False"))) cfg->fast_dev_run = 0;
        else if (text) LK_TRY(set_scalar(tp, n, cfg, c, text));
        else return lk__cfg_at(c, "trainer.fast_dev_run: expected true, false or a number of batches");
    } else if (!strcmp(key, "pipeline")) { /* trainer.pipeline.{chunks,schedule,split,stages,virtual_stages} */
        if (null) return LK_STATUS_OK;
        if (lk_config_node_type(c) != LK_CONFIG_MAP) return lk__cfg_at(c, "trainer.pipeline: expected a map of chunks, schedule, split, stages and virtual_stages");
        for (int j = 0; j < lk_config_node_count(c); j++) {
            const lk_config_node *e = lk_config_node_child(c, j);
            const char *k = lk_config_node_key(e), *v = lk_config_node_text(e);
            const char *tkey = !strcmp(k, "chunks") ? "pipeline_chunks" : !strcmp(k, "schedule") ? "pipeline_schedule"
                               : !strcmp(k, "split") ? "pipeline_split" : !strcmp(k, "stages") ? "pipeline_stages"
                               : !strcmp(k, "virtual_stages") ? "pipeline_virtual_stages" : NULL;
            if (!tkey) return lk__cfg_at(e, "trainer.pipeline: unknown key '%s' (expected chunks, schedule, split, stages or virtual_stages)", k);
            if (!v) return lk__cfg_at(e, "trainer.pipeline.%s: expected a value, not a collection", k);
            if (lk_params_set(tp, n, cfg, "trainer", tkey, v)) return lk__cfg_at(e, "trainer.pipeline.%s: %s", k, lk_last_error());
        }
    } else if (!strcmp(key, "strategy")) {
        if (lk_config_node_type(c) == LK_CONFIG_MAP) {
            LK_TRY(apply_strategy_node(tp, n, cfg, c));
            return LK_STATUS_OK;
        }
        if (!text) return lk__cfg_at(c, "trainer.strategy: expected a name such as ddp, or {class_path: DDPStrategy, init_args: {...}}");
        const lk_strategy_info *si = lk_strategy_info_get(text); /* Lightning's aliases and class names */
        LK_TRY(set_scalar(tp, n, cfg, c, si ? si->name : text));
        /* the alias is resolved above, so what it also asks for is kept here */
        if (lk_strategy_name_offloads(text) && lk_params_set(tp, n, cfg, "trainer", "fsdp_cpu_offload", "true"))
            return lk__cfg_at(c, "trainer.strategy: %s", lk_last_error());
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
    "gradient_clip_algorithm", "deterministic", "profiler", "default_root_dir",
    "precision" /* None from Lightning 2.1 on: 32-true unless a plugin says otherwise */};

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
    {"model_registry", ONLY_NULL,
     "lockstep uploads no model to a registry (Lightning 2.5's litmodels): the checkpoints are in the log directory, "
     "and `lockstep export` writes their weights as safetensors"},
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
            return lk__cfg_at(c, "trainer.%s: expected a number of epochs (0: never), got '%s'", name,
                      text ? text : "(a collection)");
        return LK_STATUS_OK;
    }
    if (acc == ONLY_NULL) {
        if (lk_config_node_type(c) == LK_CONFIG_SEQ && lk_config_node_count(c) == 0) return LK_STATUS_OK;
        return lk__cfg_at(c, "trainer.%s is not supported (only null): %s", name, lightning_flags[k].why);
    }
    bool t = is_word(text, "true"), f = is_word(text, "false");
    if (!t && !f) return lk__cfg_at(c, "trainer.%s: expected true or false, got '%s'", name, text ? text : "(a collection)");
    if ((acc == ONLY_TRUE && f) || (acc == ONLY_FALSE && t))
        return lk__cfg_at(c, "trainer.%s: %s is not supported: %s", name, t ? "true" : "false", lightning_flags[k].why);
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
    if (count > MAX_KEYS) return lk__cfg_at(t, "trainer: %d keys; at most %d", count, MAX_KEYS);
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
            return lk__cfg_at(vci ? vci : t,
                      "trainer.val_check_interval %g is a fraction of an epoch, but trainer.check_val_every_n_epoch is "
                      "null (validation every val_check_interval training batches, across epochs): give a number of "
                      "batches", cfg->val_check_interval.value);
    }
    const lk_config_node *ct = lk_config_node_get(t, "comm_timeout");
    const char *ct_file = lk_config_node_file(ct);
    if (ct && !(ct_file && !strcmp(ct_file, "(default)")) && /* not a default written back into the tree */
        strncmp(cfg->comm_timeout_from, "trainer.strategy", 16)) /* the strategy's timeout wins over the flat key */
        lk_config_node_origin(ct, "trainer.comm_timeout", cfg->comm_timeout_from, sizeof cfg->comm_timeout_from);
    if (nerr == 1) return lk_error(first, "%s", errs);
    if (nerr) return lk_error(first, "%d problems in the trainer section:\n  %s", nerr, errs);
    return LK_STATUS_OK;
}

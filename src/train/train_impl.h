/* Private to src/train: the trainer's state, shared by the trainer object
 * (trainer.c), the loops (run.c, fit.c, eval.c, predict.c), metric logging
 * (metrics.c) and checkpoints (checkpoint.c), and the functions one of
 * them calls in another. */
#ifndef LK_TRAIN_IMPL_H
#define LK_TRAIN_IMPL_H

#include <signal.h>

#include "lockstep/trainer.h"
#include "backend/replay.h"
#include "train/loggers.h"

#define LK_METRIC_NAME 96
#define LK_PATH 1024
#define LK_PATH2 2048 /* a log dir plus a file name */

typedef struct lk_profiler lk_profiler;
typedef struct lk__deferred lk__deferred;

typedef struct lk_metric {
    char name[LK_METRIC_NAME];
    const char *stage; /* the loop that logged it: "train", "val", "test" (static) */
    bool prog_bar, on_step, on_epoch, sync_dist, logger;
    lk_log_reduce reduce;
    bool step_fresh;   /* logged since the last step flush */
    double step_value;
    double epoch_sum, epoch_weight, epoch_ext; /* ext: max/min */
    bool epoch_any;
    double value;      /* latest (epoch aggregate once an epoch ended) */
    bool has_value;
} lk_metric;

typedef struct lk_topk {
    double score;
    char path[LK_PATH2];
} lk_topk;

/* One ModelCheckpoint instance (trainer.callbacks entries, or the flat
 * trainer.monitor / save_top_k keys) and its state, kept in checkpoints. */
typedef struct lk_ckpt_state {
    lk_checkpoint_config c;
    bool flat;         /* from the flat keys: without a monitor it keeps last.ckpt only, as before */
    double best_score; /* NaN until a monitored save */
    char best_path[LK_PATH2];
    lk_topk *topk;
    int ntopk;
    bool warned;       /* the "monitor has no value yet" warning was printed */
    /* Resumed state waits here until this run's directory is known
     * (lk__ckpt_adopt): the directory the checkpoint's instance saved into
     * ("" when the checkpoint predates the key), and whether a checkpoint
     * was loaded at all. */
    char loaded_dir[LK_PATH2];
    bool loaded;
} lk_ckpt_state;

/* One EarlyStopping instance and its state. */
typedef struct lk_es_state {
    lk_early_stopping_config c;
    int wait;
    double best; /* NaN until the first check */
} lk_es_state;

struct lk_trainer {
    lk_trainer_config cfg;
    lk_dtype autocast;    /* trainer.precision: the steps' autocast dtype (LK_F32: 32-true) */
    lk_dtype param_dtype; /* the parameters' and gradients' dtype: f32, or bf16/f16 for the *-true precisions */
    long test_step_delay_ms; /* LK_TEST_STEP_DELAY_MS */
    int test_overflow_rank;  /* LK_TEST_GRAD_OVERFLOW=RANK:STEP (-1: off) */
    int test_nan_rank;       /* LK_TEST_LOSS_NAN=RANK:STEP (-1: off) */
    int64_t test_nan_step;
    int64_t test_overflow_step;
    lk_optim_settings opt;
    char *config_yaml;
    /* distributed */
    lk_pg_info pg;
    lk_comm *comm;
    lk_strategy *strat;
    int rank, world;
    int launcher; /* > 0: this process starts that many ranks and is none of them (self_launch.c) */
    /* Where settings an LK_* variable can also give came from (run.json's
     * "settings"; one rule, core.h's lk_env_var) */
    char comm_timeout_from[LK_PARAM_STR];
    const char *comm_backend_from; /* "LK_COMM_BACKEND" or "default" */
    lk_device dev;          /* the device this rank trains on (trainer.accelerator, trainer.devices) */
    lk_device prev_default; /* the process's default device before a run made dev the default */
    uint64_t prev_memory_limit; /* lk_alloc_limit before this trainer set trainer.memory_limit_mb's */
    bool set_memory_limit;
    const char *memory_limit_from; /* "trainer.memory_limit_mb" or "LK_MEMORY_LIMIT_MB" */
    const char *prev_f32_matmul; /* lk_float32_matmul_precision before this trainer set its own */
    bool default_set;       /* a run set dev as the default: run_cleanup restores prev_default */
    /* the current run */
    lk_module *module;
    lk_datamodule *dm;
    const char *stage; /* "train", "val", "test", "predict", "sanity" */
    int64_t epoch, global_step, batch_idx;
    int64_t resume_batch; /* batches of the current epoch already done (resume) */
    bool at_epoch_end;    /* a checkpoint now resumes at epoch + 1, batch 0 */
    /* A checkpoint written inside an epoch resumes at resume_batch; one
     * written before a validation that was due after the batch before it
     * (a step checkpoint, a stop) says so, and the resume runs it first. */
    bool val_pending;
    /* The resumed epoch's train metrics were restored from the checkpoint
     * (lk__metrics_restore): the epoch's start neither resets nor logs them. */
    bool epoch_restored;
    /* The train metrics' epoch sums of every rank, gathered for the next
     * checkpoint written inside an epoch ([world][nmetrics][4]: sum, weight,
     * max/min, any), or NULL (lk__metrics_gather). */
    double *ckpt_rows;
    int ckpt_rows_n;
    /* The model's state dict gathered on every rank before a checkpoint
     * write, when the strategy's gather is a collective (checkpoint.c);
     * the writer's files take it from here. */
    lk_named_tensors ckpt_state;
    lk_named_tensors ckpt_optim; /* the optimizer's state, gathered with it (lk_strategy_optimizer_state) */
    bool ckpt_state_ready;
    /* A sharded checkpoint's shards staged by every rank for rank 0's sets
     * (ckpt_shards.c): the staging directory ("" when none), the set's id. */
    char shard_stage[LK_PATH2];
    char shard_set_id[40];
    bool shard_noted; /* state_dict_type sharded under a replica strategy: said once */
    int64_t cur_batch_size;
    /* A training step's loss logged by lk__log_loss on a device the host
     * cannot read: logged when the strategy reads the loss once, after
     * backward is queued (step_checks.c), not read a second time. */
    struct {
        bool armed;
        char name[LK_METRIC_NAME];
        lk_log_opts opts;
        int64_t batch_size;
    } pending_loss;
    /* The training step's one device->host read (step_checks.c): slot 0 holds
     * the loss (its own dtype's bytes, put there by step.c's keep_loss;
     * dp: slots 0..R-1 replica k's, put there by keep_replica_loss), the
     * n slots after them one i64 per gradient (its first non-finite index,
     * or the scaler's found-inf count), copied back together. `mem` is on
     * the gradients' device (`host` itself on a host-addressable one). */
    struct lk__step_status {
        void *mem;
        int64_t *host;
        lk_device dev;
        int64_t slots;
        lk_dtype loss_dtype;
        bool held;     /* slot 0 holds this micro-batch's loss, not yet read */
        int nloss;     /* loss slots before the gradients' (1; dp: one per replica) */
        bool replicas; /* dp: the loss slots are the replicas' (keep_replica_loss) */
        int64_t *rows; /* dp: [nloss] rows behind each replica's loss (0: none kept) */
        int64_t total; /* dp: the micro-batch's rows */
    } step_status;
    int64_t accum;        /* accumulate_grad_batches in force */
    /* The parameters this rank holds, by name: the strategy's list
     * (lk_strategy_local_params; empty until fit wraps the module). */
    const lk_named_tensors *params;
    lk_optimizer *optim;
    int dp_devices;  /* strategy dp: replicas (0: another strategy) */
    /* The module's model was deferred and the strategy cuts it: each rank
     * materialises its stage only, and fit leaves it in stages (the whole
     * model need not fit one process; lk_strategy_sync_model on request). */
    bool stage_only;
    struct lk__replica *replicas; /* dp: replica k's module and scratch trainer (step.c), [dp_devices] */
    double step_t0, step_t1;      /* the current micro-batch: waiting for it began, it arrived (the profiler's phases) */
    lk_scheduler *sched;
    lk_grad_scaler *scaler; /* precision 16-mixed: the loss scaler (NULL otherwise) */
    /* metrics */
    lk_metric *metrics;
    int nmetrics, cap_metrics;
    struct lk__deferred *deferred; /* eval metrics waiting on the device for the loop's end (metrics.c); NULL: none yet */
    /* outputs (rank 0) */
    lk_logger *logger;
    lk_progress *progress;
    char log_dir[LK_PATH];
    char last_ckpt[LK_PATH2], best_ckpt[LK_PATH2];
    double best_score; /* the first monitored ModelCheckpoint's, as Lightning's trainer.checkpoint_callback */
    lk_ckpt_state ckpts[LK_MAX_CALLBACKS + 1]; /* the list's, then the flat keys' */
    int nckpts;
    lk_es_state es[LK_MAX_CALLBACKS + 1];
    int nes;
    bool should_stop;
    bool val_ran;     /* a validation loop (not the sanity check) has run */
    char stop_reason[512];
    /* timing */
    double t_start, t_first_step, t_fit_start;
    lk__replay_stats replay_at_start; /* the graph replay's counters when the trainer was made (run.json counts from here) */
    double sum_data, sum_fwd, sum_bwd, sum_comm, sum_opt;
    double sum_comm_wait; /* the part of sum_comm spent waiting for the last rank to arrive */
    /* Each rank's memory at the end of a fit (lk__memory_collect; rank 0
     * has every rank's, the others their own in row 0): LK__MEM_* columns. */
    int64_t *rank_memory;
    int n_rank_memory;
    /* A pipeline's: each rank's schedule time and the part of it spent in
     * messages (sends, receives, the waits in them), [run_s, comm_s] per
     * rank, gathered with rank_memory (rank 0 has every rank's) */
    double *rank_pipe;
    size_t step_peak_bytes; /* the most tensor memory one forward + backward held beyond what was live before it
                               (activations, saved tensors, temporaries), over the steps after the first */
    int64_t timed_steps, samples_seen;
    double train_time, t_train_end, t_steady;
    double stats_wall, stats_cpu; /* DeviceStatsMonitor's last sample */
    int64_t samples_steady;
    double sum_at_steady[6];
    lk_profiler *prof; /* profiler advanced / trace (profiler.c); NULL otherwise */
    struct lk__prefetch *pf; /* fit on a device the CPU cannot read: the batch prefetch (prefetch.c); NULL otherwise */
    struct lk__prefetch *pf_eval; /* the same for validation, test and predict (made on first use) */
};

/* run.c: what every loop sets up and tears down. */
/* The module and data module checked and made the run's, the module on the
 * training device (the run's default device), prepare_data on local rank 0
 * and setup(stage). */
lk_status lk__begin_run(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *stage);
/* The process's own default device back, when a run made the trainer's its default. */
void lk__run_end_on_device(lk_trainer *tr);
/* Frees what a run made (strategy's attachment, optimizer, loggers, ...);
 * the trainer can be freed or run an evaluation after it. */
void lk__run_cleanup(lk_trainer *tr);
/* limit_*_batches applied to a loader of n batches. */
int64_t lk__limit_batches(lk_count_or_fraction limit, int64_t n);
/* Batches go onto a device the CPU cannot read ahead of their step. */
bool lk__prefetching(const lk_trainer *tr);
/* The fit's prefetcher (tr->pf): onto the trainer's device, or dp's slices onto their replicas' devices. */
lk_status lk__fit_prefetcher(lk_trainer *tr);
/* The evaluation loops' prefetcher (made on first use), or NULL on the synchronous path. */
lk_status lk__eval_prefetcher(lk_trainer *tr, struct lk__prefetch **out);
/* A loader over `ds` for this rank: shuffled and padded for training, each sample once otherwise. */
lk_status lk__make_loader(lk_trainer *tr, lk_dataset *ds, bool train, lk_loader **out);

/* outputs.c: rank 0's progress bar and, when `want_logs`, the loggers, the
 * log directory, hparams.yaml and config.yaml (nothing on other ranks). */
lk_status lk__open_outputs(lk_trainer *tr, bool want_logs);

/* eval.c: one pass of validation_step ("val") or test_step ("test") over
 * `loader` (at most `limit` batches, every rank the same count), its epoch
 * metrics reduced; `title` names it on the progress bar. */
lk_status lk__run_eval(lk_trainer *tr, lk_loader *loader, const char *stage, int64_t limit, uint64_t epoch,
                       const char *title);

/* faults.c: the tests' fault hooks (LK_TEST_STEP_DELAY_MS,
 * LK_TEST_GRAD_OVERFLOW, LK_TEST_LOSS_NAN), read once by lk__faults_init;
 * each does nothing when its variable is unset. */
void lk__faults_init(lk_trainer *tr);
/* After the gradients are reduced: an infinite first element of the first gradient on the chosen rank and step. */
lk_status lk__fault_grad_overflow(lk_trainer *tr);
/* After an optimizer step: sleeps the delay. */
void lk__fault_step_delay(const lk_trainer *tr);
/* The loss the loss check sees: NaN on the chosen rank and step, `loss` otherwise. */
double lk__fault_loss(const lk_trainer *tr, double loss);

/* step.c: the trainer's side of the strategy's step (lk_step_fn): the
 * module's training_step on replica k (dp's replicas are modules and
 * scratch trainers made here), the non-finite loss check and the
 * profiler's phases. lk__replicas_free frees what replicate left
 * (after lk_strategy_detach). */
lk_step_fn lk__step_fn(lk_trainer *tr);
/* Test and predict under a pipeline (eval.c): the strategy wrapped (when no
 * fit did) and attached, so that lk__run_eval and predict run the batches
 * through its stages; nothing for other strategies. A collective. */
lk_status lk__eval_pipeline_setup(lk_trainer *tr);
/* trainer.activation_checkpointing[_policy] on net (trainer_config.c):
 * *count layers set; INVALID_ARGUMENT naming the model's layer classes for
 * a class it lacks. */
lk_status lk__activation_checkpointing(const lk_trainer_config *c, lk_layer *net, int *count);
void lk__replicas_free(lk_trainer *tr);

/* profiler.c: trainer.profiler advanced and trace. Every call takes NULL
 * (profiler off) and then does nothing. */
lk_status lk__prof_create(lk_trainer *tr); /* sets tr->prof when the profiler asks for one */
void lk__prof_free(lk_trainer *tr);
/* Around each training micro-step: times its ops, and for the first
 * profiler_trace_steps steps records its phases (data from t_data, forward
 * from t_fwd, backward from t_bwd, exposed comm from t_comm to t_end). */
void lk__prof_forward_begin(lk_profiler *p, int64_t step);
void lk__prof_backward_end(lk_profiler *p, double t_data, double t_fwd, double t_bwd, double t_comm, double t_end);
void lk__prof_optimizer(lk_profiler *p, double t0, double t1);
/* End of fit: prints the op table (rank 0); with trace, gathers every
 * rank's events and rank 0 writes <log_dir>/trace.json (collective). */
lk_status lk__prof_finish(lk_trainer *tr);

/* metrics.c */
lk_metric *lk__metric_get(lk_trainer *tr, const char *name, bool create);
/* lk_log_metric of the loss tensor a training_step returns: on the host its
 * value now; on another device the value the strategy's one read of the
 * step's loss gives (that read is a synchronisation on a GPU, and it comes
 * after backward is queued). The caller must return this same tensor. */
lk_status lk__log_loss(lk_trainer *tr, const char *name, const lk_tensor *loss, const lk_log_opts *opts);
/* An eval loop's epoch metric whose value is the one-element float tensor
 * t: on a device the host cannot read it is copied on the device into a
 * slot read once at lk__metrics_end_epoch, and added to the epoch
 * aggregate then, in logging order with this batch's size: the bits
 * lk_log_metric(tr, name, lk_tensor_item(t), opts) gives now, which is
 * what the host (and a training step, dp, an f64 value) does. */
lk_status lk__log_tensor(lk_trainer *tr, const char *name, const lk_tensor *t, const lk_log_opts *opts);
/* Whether module m's steps run its net only through lk_module_forward (the
 * built-in modules): then lk__module_forward_replay can stand in for it. */
bool lk__module_forward_only_via_module(const lk_module *m);
/* While set (this thread), lk_module_forward answers `out` (borrowed) for
 * a batch of its rows instead of running the module's forward: the output
 * a pipeline's stages computed. NULL ends it. */
void lk__module_forward_replay(lk_tensor *out);
/* The accuracy of logits [N, C] (f32, bf16 or f16) against targets [N]
 * (i64, i32 or u8) on one device: the count of rows whose first maximum is
 * the target (LK_OP_ACCURACY: ties keep the earlier class, a NaN never
 * wins); as lk__log_tensor does with a value, on a device the host cannot
 * read the count waits there and hits / N is added at the loop's end,
 * elsewhere it is logged now. */
lk_status lk__log_accuracy(lk_trainer *tr, const char *name, const lk_tensor *logits, const lk_tensor *target,
                           const lk_log_opts *opts);
/* Frees the device array of waiting values (run_cleanup). */
void lk__metrics_deferred_free(lk_trainer *tr);
void lk__metrics_reset_epoch(lk_trainer *tr, const char *stage);
/* Reduces epoch aggregates across ranks and turns them into values. */
lk_status lk__metrics_end_epoch(lk_trainer *tr, const char *stage);
/* Writes this step's fresh step metrics to the loggers (rank 0). */
lk_status lk__metrics_log_step(lk_trainer *tr);
/* Writes epoch values logged since the last call to the loggers (rank 0). */
lk_status lk__metrics_log_epoch(lk_trainer *tr, const char *stage);
/* Collective (every rank, inside an epoch): gathers every rank's train
 * epoch sums for the checkpoint about to be written (tr->ckpt_rows). */
lk_status lk__metrics_gather(lk_trainer *tr);
/* The metrics' state as a checkpoint keeps it (metadata "metrics"): each
 * metric's latest value, and inside an epoch every rank's sums so far, so
 * a resumed epoch logs the row an uninterrupted one does. lk_malloc'd. */
char *lk__metrics_state(const lk_trainer *tr);
/* Restores lk__metrics_state's text written by `world` ranks (checked
 * whole first: an error names the file and the line). */
lk_status lk__metrics_restore(lk_trainer *tr, const char *path, const char *text, long long world);
/* "a, b, c": the metrics that have a value now (what lk_trainer_metric finds), or "(none)". */
void lk__metrics_available(const lk_trainer *tr, char *out, size_t size);
/* Names/values of the progress-bar metrics (borrowed; up to `max`). */
int lk__metrics_prog_bar(lk_trainer *tr, const char **names, double *values, int max);

/* predict.c: rows of predict_step with their dataset indices, gathered on
 * rank 0 into one .npy in dataset order (each sample once). */
typedef struct lk__pred lk__pred;
lk_status lk__pred_create(lk__pred **out);
void lk__pred_free(lk__pred *p);
/* `t` is f32 [batch size, ...]; copies it. */
lk_status lk__pred_add(lk__pred *p, const lk_tensor *t, const lk_batch *b);
/* Collective over `comm` (the data-parallel group, whose ranks saw
 * different samples): every rank of it calls it; its rank 0 gathers the
 * rows and, when `writes`, writes `path` and fills rows_out and shape_out
 * ("N x 10"). No file when no rank predicted anything. */
lk_status lk__pred_write(lk__pred *p, lk_comm *comm, int rank, int world, bool writes, int64_t dataset_len,
                         const char *path, int64_t *rows_out, char *shape_out, size_t shape_size);

/* self_launch.c: runs this program as the job's tr->launcher ranks and
 * returns the job's status (once per process; later calls repeat it). */
lk_status lk__self_launch(lk_trainer *tr, const char *command);

/* precision.c: trainer.precision under Lightning's full name: its aliases
 * 32, bf16 and 16 give 32-true, bf16-mixed and 16-mixed; any other string
 * is returned as it is. */
const char *lk__precision_name(const char *p);
/* trainer.precision (with its aliases) -> the steps' autocast dtype (LK_F32:
 * none) and the parameters' dtype; an error naming the choices otherwise. */
lk_status lk__precision_parse(const char *given, lk_dtype *autocast, lk_dtype *params);

/* checkpoint.c */
lk_status lk__ckpt_save(lk_trainer *tr, const char *path);
lk_status lk__ckpt_save_ex(lk_trainer *tr, const char *path, bool weights_only);
lk_status lk__ckpt_load(lk_trainer *tr, const char *path, bool restore_training);
/* After a resume, once the log directory is known: each ModelCheckpoint
 * instance keeps its top-k list only if it saves into the directory the
 * checkpoint's instance saved into, as Lightning's load_state_dict does
 * (never deleting another run's files); otherwise only its best path. */
void lk__ckpt_adopt(lk_trainer *tr);
/* The ModelCheckpoint callback at the end of a validation/epoch. */
lk_status lk__ckpt_callback(lk_trainer *tr);
/* The instances whose every_n_train_steps falls on this step (the flat
 * one writes last.ckpt only). */
lk_status lk__ckpt_callback_last(lk_trainer *tr);
/* A stop inside an epoch (signal, max_time, max_steps): last.ckpt only. */
lk_status lk__ckpt_callback_stop(lk_trainer *tr);
/* Whether any instance saves at this global step (the same on every rank). */
bool lk__ckpt_due_steps(const lk_trainer *tr);
/* Fills tr->ckpts and tr->es from the config (list entries, then the flat keys). */
lk_status lk__callbacks_init(lk_trainer *tr);
/* "last" / "best" / a path -> a path (error when it does not exist). */
lk_status lk__ckpt_resolve(lk_trainer *tr, const char *spec, char *out, size_t size);

/* signals.c: the stop signals (SIGINT, SIGTERM, SIGHUP, SIGUSR1) of a fit. */
typedef struct lk__sig_state {
    struct sigaction old_int, old_term, old_hup, old_usr1;
} lk__sig_state;
/* Clears the record and catches the stop signals; the previous handlers go to `s`. */
void lk__signals_install(lk__sig_state *s);
/* Puts back the handlers lk__signals_install saved in `s`. */
void lk__signals_restore(lk__sig_state *s);
/* The last stop signal caught since lk__signals_install, or 0. */
int lk__stop_signal(void);

/* optim_factory.c: tr->optim (with trainer.scale_lr applied, sharded by
 * the strategy), tr->scaler for 16-mixed and tr->sched from tr->opt; the
 * parameters (tr->params) must be set up. On failure what was built stays
 * in tr for run_cleanup to free. */
lk_status lk__optim_setup(lk_trainer *tr, int64_t steps_per_epoch);

/* callbacks.c: the callbacks the loops call besides ModelCheckpoint. */
/* EarlyStopping `es` after a validation: sets tr->should_stop and
 * tr->stop_reason when it stops; an error when a strict monitor was never logged. */
lk_status lk__early_stopping_check(lk_trainer *tr, lk_es_state *es);
/* At a logged step: lr-<Optimizer> (per-step form), the loss scale
 * (16-mixed) and the device stats (trainer.device_stats_monitor; an
 * all-reduce when world > 1, so every rank calls it). Each does nothing when
 * its callback is off. */
lk_status lk__log_lr(lk_trainer *tr);
lk_status lk__log_scale(lk_trainer *tr);
lk_status lk__log_device_stats(lk_trainer *tr);
/* DeviceStatsMonitor's GPU metrics (named as Lightning's GPU stats:
 * "device_stats/device_id: 0/utilization.gpu (%)", memory.used / .free in
 * MB, temperature.gpu, power.draw) from one GPU's NVML stats, the fields
 * NVML did not answer left out: their count, at most LK__GPU_METRICS. */
#define LK__GPU_METRICS 6
struct lk__gpu_stats;
int lk__gpu_stats_metrics(int device_id, const struct lk__gpu_stats *s, char name[][80], double *value);
/* NVML's index of CUDA device `cuda_index` under CUDA_VISIBLE_DEVICES
 * `visible` (NULL: unset): its entry when the list is of integers, else cuda_index. */
int lk__nvml_index_for(int cuda_index, const char *visible);
/* At an epoch start: lr-<Optimizer> when LearningRateMonitor logs per epoch. */
lk_status lk__log_lr_epoch(lk_trainer *tr);

/* runsummary.c: the summary of a finished command. */
/* Writes <log_dir>/run.json on rank 0 (nothing elsewhere or without a log
 * dir) for `command` ending with `st`. Cannot fail: a write error is a
 * warning and leaves the run's own error as the last error. */
void lk__write_runinfo(lk_trainer *tr, const char *command, lk_status st);
/* Prints the mean phase times per optimizer step on rank 0 when
 * trainer.profiler is not none and a step ran. */
void lk__print_profile(lk_trainer *tr);
/* The memory columns per rank: model state (lk_strategy_get_memory), the
 * allocator's peak live bytes, the process's peak resident set. */
enum { LK__MEM_PARAMS, LK__MEM_GRADS, LK__MEM_OPTIM, LK__MEM_GATHERED, LK__MEM_ALLOC_PEAK, LK__MEM_MAX_RSS, LK__MEM_COLS };
/* Gathers every rank's memory to rank 0 (collective: every rank calls it
 * at the same point, the fit having succeeded on all of them) and prints
 * it there, one line per rank; a pipeline's schedule times per rank
 * (rank_pipe) come in the same end-of-fit exchange. A failure is a warning
 * and leaves rank 0 with its own row only. */
void lk__memory_collect(lk_trainer *tr);
/* What this run's GEMMs (in its autocast dtype) run through on its device:
 * lk__backend_gemm_path for its device kind. */
const char *lk__train_gemm_path(const lk_trainer *tr);

/* grads.c: the step's reduced gradients before the optimizer step:
 * trainer.gradient_clip_val/algorithm on tr->params (nothing when 0). */
void lk__clip_gradients(lk_trainer *tr);

/* step_checks.c: the step's one device->host read, and the loss check. */
/* The checks after a micro-batch's strategy step, with one device->host
 * copy: when `sync` (the gradients are reduced) the gradients' checks are
 * queued first — 16-mixed: the scaler's unscale and found-inf counts,
 * otherwise each gradient's first non-finite index — then the loss kept by
 * keep_loss (when held) and those results are read back at once; then, on
 * the host, the loss check and train_loss (lk__step_check_loss), and
 * 16-mixed: *skip true on every rank when any rank's gradients overflowed
 * (a collective: every rank calls it), otherwise an ABORTED error naming
 * the first parameter and element whose gradient is NaN or infinite.
 * *loss is the loss read (dp: the replicas' mean weighted by their rows;
 * kept as is when none was held). */
lk_status lk__step_checks(lk_trainer *tr, bool sync, double *loss, bool *skip);
/* Places `loss` (a scalar on any device) in the step status's slot 0. */
lk_status lk__step_keep_loss(lk_trainer *tr, const lk_tensor *loss);
/* dp: replica k's loss (on its device, over `rows` of `total` rows) into
 * loss slot k, on device 0 (a copy between devices, not a read). The read
 * logs train_loss with replica 0's (what its training_step logged) and
 * checks the mean weighted by rows / total. */
lk_status lk__step_keep_replica_loss(lk_trainer *tr, int k, const lk_tensor *loss, int64_t rows, int64_t total);
void lk__step_status_free(lk_trainer *tr);
/* The loss check ("the loss is nan at step N ...") and the
 * train_loss lk__log_loss deferred (pending_loss), on the loss read. */
lk_status lk__step_check_loss(lk_trainer *tr, double loss);
/* The train_loss lk__log_loss deferred, logged with `loss` (nothing when none is). */
lk_status lk__step_log_pending(lk_trainer *tr, double loss);

/* The fashion_mnist data module's directory once set up, and the setting
 * that named it (data.init_args.root, LK_DATA_ROOT or default); false for
 * another data module, or before setup. */
bool lk__builtin_data_root(const lk_datamodule *dm, const char **dir, const char **from);

/* The tokens data module (dm_tokens.c): its parameter table (one row of
 * builtin.c's list), its constructor, and the check of a built-in model's
 * vocab_size and block_size against the data once it is set up. */
#define LK__DM_TOKENS_NPARAMS 9
#define LK__DM_TOKENS_HELP "token files (llm.c/nanoGPT u16; default: the King James Bible as bytes, Debian's bible-kjv)"
extern const lk_param lk__dm_tokens_params[LK__DM_TOKENS_NPARAMS];
lk_status lk__dm_tokens_create(const lk_model_kv *args, int n_args, uint64_t seed, lk_datamodule **out);
bool lk__dm_is_tokens(const lk_datamodule *dm);
lk_status lk__dm_tokens_check_model(const lk_model_info *info, const lk_model_kv *args, int n_args,
                                    const lk_datamodule *dm);
/* The training file the data module reads or would read ("" when it has no place). */
const char *lk__dm_tokens_train_file(const lk_datamodule *dm);
/* Encodes text[0..len) with `tok`, splits it (the last val_fraction of
 * the text for validation) and writes dir/train.bin, dir/val.bin (llm.c's
 * format) and dir/meta.json (tokenizer, vocab_size, counts, source; the
 * vocab/merges paths for gpt2), meta.json last. */
lk_status lk__tokens_prepare_dir(const char *dir, const char *text, size_t len, const lk_tokenizer *tok,
                                 double val_fraction, const char *source, const char *vocab_json,
                                 const char *merges_txt, int64_t *ntrain, int64_t *nval);

#endif

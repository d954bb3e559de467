/* lockstep/strategy.h — how a training step is spread over devices.
 *
 * A strategy owns the training step: setup (replicas start identical), the
 * step over a micro-batch (forward, backward and the gradient reduction, in
 * whatever order and on whatever threads it needs), what happens around the
 * optimizer step, metric reduction and which rank writes files. `single`
 * runs the step on this process; `ddp` runs one process per device over an
 * lk_comm and all-reduces each gradient bucket while backward goes on; `dp`
 * runs one replica per device on threads of this process and sums the
 * gradients onto replica 0. The caller (the trainer) supplies its side of
 * the step as callbacks (lk_step_fn) and keeps the loops, the loss scaler,
 * clipping and the scheduler:
 *
 *     lk_strategy_config sc = lk_strategy_config_default();
 *     lk_ddp_options ddp = lk_ddp_options_default(); ddp.bucket_cap_mb = 5;
 *     sc.name = "ddp"; sc.comm = comm; sc.ddp = &ddp;  // comm borrowed, ddp copied
 *     lk_strategy *s; LK_TRY(lk_strategy_create(&sc, &s));
 *     lk_tensor *grads, *pbuf; bool copy;
 *     LK_TRY(lk_strategy_grad_buffer(s, n_elems, &grads));
 *     LK_TRY(lk_strategy_param_buffer(s, n_elems, &pbuf, &copy));
 *     LK_TRY(lk_params_flatten_into(net, pbuf, copy, grads, &flat_p, &flat_g));
 *     LK_TRY(lk_strategy_setup(s, params, names, n, buffers, nbuf));
 *     ... make the optimizer; LK_TRY(lk_strategy_shard_optimizer(s, optim));
 *     lk_step_fn fn = {.ctx = me, .forward = my_forward};
 *     LK_TRY(lk_strategy_attach(s, &fn));
 *     for each micro-batch:
 *         lk_step_args a = {.batch = b, .sync = last_micro_batch, .loss_mul = 1.0f / accum, .loss_scale = 1};
 *         lk_step_result r; LK_TRY(lk_strategy_training_step(s, &a, &r));
 *         if (a.sync) { clip...; LK_TRY(lk_strategy_optimizer_step(s, optim, false)); }  // also zeroes grads
 *     lk_strategy_detach(s); lk_strategy_free(s);
 *
 * The lower-level calls (before_forward, begin/finish_backward, after_step,
 * zero_grad) remain for callers that run the step themselves.
 */
#ifndef LOCKSTEP_STRATEGY_H
#define LOCKSTEP_STRATEGY_H

#include "lockstep/data.h"
#include "lockstep/dist.h"
#include "lockstep/nn.h"
#include "lockstep/optim.h"
#include "lockstep/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lk_strategy lk_strategy;

/* ddp's own options (lk_strategy_config.ddp). The strategies that take
 * them say so in lk_strategy_info.ddp_options (ddp, ddp_spawn, and auto
 * when it becomes ddp); the others ignore them. */
typedef struct lk_ddp_options {
    double bucket_cap_mb;     /* gradient bucket size (default 25) */
    bool broadcast_buffers;   /* buffers (BatchNorm stats) from rank 0 before each forward (default true) */
    bool report_unused;       /* a parameter that got no gradient in a synced step is an error naming it
                                 (default false: its zero gradient is reduced like any other) */
    lk_dtype comm_dtype;      /* the dtype gradients travel in. LK_F32 (default) is exact; LK_BF16 or
                                 LK_F16 halve the bytes (PyTorch's bf16/fp16_compress_hook): each bucket is
                                 rounded to it, averaged in f32 and rounded once more, then widened back.
                                 With 16-bit gradients (lk_strategy_config.param_dtype) and LK_F32, each
                                 bucket is widened to f32, averaged and rounded once; equal to param_dtype
                                 averages in place */
    bool shared_params;       /* over shm (one node): one copy of the parameters and the optimizer state
                                 for all ranks, each rank updating a 1/W shard of it after the all-reduce
                                 (same bits, a W-th of the optimizer's memory traffic and memory per rank).
                                 Default true; ignored where ranks share no memory (mpi). false: every rank
                                 keeps a replica and updates all of it, as PyTorch DDP does */
} lk_ddp_options;
lk_ddp_options lk_ddp_options_default(void);

/* fsdp's and deepspeed_stage_3's options (lk_strategy_config.fsdp; PyTorch
 * FSDP's names). */
typedef enum lk_fsdp_sharding {
    LK_FSDP_FULL_SHARD,    /* parameters, gradients and optimizer state sharded; a unit's parameters
                              are given back after its forward and gathered again for its backward */
    LK_FSDP_SHARD_GRAD_OP, /* the same, but a unit's gathered parameters stay from its forward to its backward */
    LK_FSDP_NO_SHARD,      /* one chunk per rank: every rank holds everything, gradients all-reduced */
    LK_FSDP_HYBRID_SHARD,  /* FULL_SHARD inside each node, replicated across nodes */
} lk_fsdp_sharding;
typedef struct lk_fsdp_options {
    lk_fsdp_sharding sharding;  /* default FULL_SHARD */
    const char *wrap_types;     /* auto_wrap_policy: the layer classes that become units, comma-separated
                                   ("Block", "Linear,Conv2d"); "none": the whole net is one unit; NULL or "":
                                   min_num_params when set, else the model's repeated blocks (gpt's
                                   transformer blocks; otherwise the children of its first layer with
                                   several). Borrowed until create returns */
    int64_t min_num_params;     /* size_based_auto_wrap_policy: > 0 wraps, bottom up, each layer whose
                                   parameters no wrapped layer below it took reach this many */
    bool forward_prefetch;      /* issue the next unit's all-gather while this one computes (default true) */
    bool backward_prefetch;     /* the same in the backward, in reverse (default true: BACKWARD_PRE) */
    bool cpu_offload;           /* on a GPU: the master chunks, their gradients and the optimizer state in host
                                   memory, the optimizer stepping on the CPU (FSDP's CPUOffload, DeepSpeed's
                                   offload_optimizer); on the CPU they are there already (default false) */
} lk_fsdp_options;
lk_fsdp_options lk_fsdp_options_default(void);
const char *lk_fsdp_sharding_name(lk_fsdp_sharding s); /* "FULL_SHARD", ... */

typedef struct lk_strategy_config {
    const char *name;         /* "auto" (single for one process, ddp for several), "single", "ddp",
                                 "ddp_spawn" (ddp: how the ranks were started is the launcher's business),
                                 "dp" (one process; with devices <= 1 it is single), or any other name
                                 lk_strategy_info_get knows (Lightning's aliases and class names) */
    lk_comm *comm;            /* borrowed; required for ddp; NULL for single and dp */
    int devices;              /* dp: replicas, one thread each (default 1) */
    const lk_ddp_options *ddp; /* ddp's options (copied by lk_strategy_create); NULL: lk_ddp_options_default() */
    lk_dtype param_dtype;     /* the parameters' and gradients' dtype: LK_F32 (default), or LK_BF16 / LK_F16
                                 for the *-true precisions (lk_layer_cast_parameters first) */
    lk_device device;         /* where the flat gradient buffer lives: the training device (default the CPU;
                                 the module must be there too, lk_layer_to) */
    /* model_parallel and pipeline (trainer.pipeline.*): micro-batches per batch (pipeline; 0: 4),
     * the schedule ("gpipe", "1f1b"; NULL: 1f1b), the first block of each stage after the first,
     * comma-separated ("decoder"; NULL or "": balanced by parameter count). Borrowed until create returns. */
    int pipe_chunks;
    const char *pipe_schedule;
    const char *pipe_split;
    /* trainer.pipeline.virtual_stages: the model's stages per rank (interleaved_1f1b; 0: 2 there, else 1) */
    int pipe_virtual_stages;
    /* trainer.pipeline.stages: the stages; the devices are stages x data-parallel replicas
     * (0: one stage per device, no replicas) */
    int pipe_stages;
    const lk_fsdp_options *fsdp; /* fsdp, deepspeed_stage_3 (copied by create); NULL: lk_fsdp_options_default() */
} lk_strategy_config;
lk_strategy_config lk_strategy_config_default(void);

/* Names the strategies can take (for --help and the "did you mean" hint). */
const char *const *lk_strategy_names(int *count);

/* How a strategy's ranks run: the launcher, the device selection and the
 * data loader ask this, never the strategy's name. */
typedef enum lk_process_model {
    LK_PROCESS_SINGLE,     /* one process on one device (single) */
    LK_PROCESS_PER_DEVICE, /* one process per device, started by a launcher (ddp, ddp_spawn, auto) */
    LK_PROCESS_THREADS,    /* one process drives every device, one thread each (dp) */
} lk_process_model;

/* What a strategy is, before one is made. */
typedef struct lk_strategy_info {
    const char *name;       /* lockstep's name ("ddp_spawn"), what lk_strategy_config.name takes */
    const char *class_name; /* Lightning's class ("DDPStrategy"), for class_path */
    lk_process_model process_model;
    bool forks;             /* its ranks are forked from this process (ddp_spawn): nothing that does not
                               survive a fork (CUDA) may start before they are */
    bool ddp_options;       /* it reads lk_strategy_config.ddp */
} lk_strategy_info;
/* The strategy `name` stands for: one of lk_strategy_names, one of
 * Lightning's aliases ("ddp_find_unused_parameters_true", "ddp_fork",
 * "ddp_notebook", "single_device") or a class name with or without its
 * module path ("DDPStrategy", "lightning.pytorch.strategies.DDPStrategy").
 * NULL when it is none of them (no error set). Static storage. */
const lk_strategy_info *lk_strategy_info_get(const char *name);
/* Whether a name is one of Lightning's that also asks for the optimizer on
 * the CPU (deepspeed_stage_2_offload, deepspeed_stage_3_offload,
 * fsdp_cpu_offload: lk_fsdp_options.cpu_offload). */
bool lk_strategy_name_offloads(const char *name);
/* The class names class_path takes, and their strategies' init_args keys
 * (for --help and the "did you mean" hint): class k's keys are keys[k],
 * a NULL-terminated list. */
const char *const *lk_strategy_class_names(int *count);
const char *const *lk_strategy_init_args(const char *class_name);

lk_status lk_strategy_create(const lk_strategy_config *cfg, lk_strategy **out);
void lk_strategy_free(lk_strategy *s);

/* The flat gradient buffer: a 1-d tensor of cfg.param_dtype, numel elements (zeroed,
 * LK_ALIGN-aligned; for ddp inside the communicator's shared memory, so
 * buckets are reduced with no copy in). Pass it to lk_params_flatten before
 * lk_strategy_setup so that the optimizer's flat gradient and DDP's buckets
 * are the same memory. Borrowed: owned by the strategy. */
lk_status lk_strategy_grad_buffer(lk_strategy *s, int64_t numel, lk_tensor **out);
/* The memory the parameters live in when ranks share one copy
 * (ddp's shared_params where the communicator's ranks share memory;
 * collective), as a 1-d tensor of cfg.param_dtype, numel elements: pass it to
 * lk_params_flatten_into, with copy_values, before lk_strategy_setup. *buf
 * is NULL where each rank keeps its own replica: flatten into private memory
 * then. Borrowed: owned by the strategy; on lk_strategy_free every parameter
 * gets its own copy back. */
lk_status lk_strategy_param_buffer(lk_strategy *s, int64_t numel, lk_tensor **buf, bool *copy_values);
/* Makes every replica start identical (ddp: parameters and buffers broadcast
 * from rank 0) and takes over the gradients: each parameter's .grad becomes a
 * view of the flat gradient buffer in registration order (kept as is when
 * lk_params_flatten already put it there); buckets are cut walking
 * backwards, the order backward produces gradients. Arrays are
 * borrowed and must stay valid until lk_strategy_free. */
lk_status lk_strategy_setup(lk_strategy *s, lk_tensor *const *params, const char *const *names, int n,
                            lk_tensor *const *buffers, int nbuf);
/* ---- the parameter layout and the state ---------------------------------------
 * The strategy decides which parameters this rank holds and where: it wraps
 * the module's network into one or more units, each a flat parameter buffer
 * and a flat gradient buffer every parameter and .grad of the unit is a view
 * of. single, ddp and dp hold every parameter whole on every rank in one
 * unit over all of them, in registration order (ddp's gradient buffer in the
 * communicator's shared memory, its parameters there too with shared_params);
 * a sharded strategy (ZeRO-3, FSDP) will hold a shard of each unit.
 *
 *     LK_TRY(lk_strategy_wrap(s, net));   // flatten + lk_strategy_setup
 *     LK_TRY(lk_optimizer_create(&oc, lk_strategy_local_params(s), &optim));
 *     LK_TRY(lk_strategy_shard_optimizer(s, optim));
 */
/* Wraps `net` (once per strategy; the net must outlive the strategy): the
 * units' flat buffers made (lk_strategy_grad_buffer, lk_strategy_param_buffer,
 * lk_params_flatten_into for a replica strategy) and lk_strategy_setup run on
 * the parameters and buffers this rank holds. A second call is an
 * INVALID_USAGE error. On failure what was made stays for lk_strategy_free. */
lk_status lk_strategy_wrap(lk_strategy *s, lk_layer *net);
/* Whether lk_strategy_wrap was called. */
bool lk_strategy_wrapped(const lk_strategy *s);
/* The parameters this rank holds, by name (what its optimizer updates and
 * its gradients' checks and clipping see): empty before lk_strategy_wrap.
 * Borrowed: owned by the strategy. */
const lk_named_tensors *lk_strategy_local_params(const lk_strategy *s);
/* The units lk_strategy_wrap made (0 before), and unit i's flat parameter
 * and gradient buffers (borrowed; *params NULL where the parameters stay
 * separate tensors). */
int lk_strategy_num_units(const lk_strategy *s);
lk_status lk_strategy_unit(const lk_strategy *s, int i, lk_tensor **params, lk_tensor **grads);
/* Gradient clipping by total norm across whatever the strategy shards
 * (torch.nn.utils.clip_grad_norm_ over the whole model): replicas clip
 * their local parameters as they are, which is the whole model (no read);
 * a sharded strategy sums the squared norms over its group first. */
lk_status lk_strategy_clip_grad_norm(lk_strategy *s, double max_norm, double norm_type);
/* The model's state dict a checkpoint writes (lk_state_dict_get of the
 * wrapped net, or of `net` before a wrap), whole: replicas hold it as it
 * is (views, nothing moves); a sharded strategy gathers its units here
 * (collective). The caller clears *out. */
lk_status lk_strategy_state_dict(lk_strategy *s, lk_layer *net, lk_named_tensors *out);
/* Whether lk_strategy_state_dict is a collective, which every rank must
 * call in the same order (a sharded strategy's gather), not only the rank
 * that writes: false for the replicas. */
bool lk_strategy_state_dict_collective(const lk_strategy *s);
/* The optimizer's state by the net's parameter names (lk_optimizer_state_get's
 * form), as a checkpoint holds it: the optimizer's own for the replicas and
 * ZeRO 1/2; fsdp's chunks gathered and cut per parameter (collective when
 * lk_strategy_state_dict_collective). The caller clears *out. */
lk_status lk_strategy_optimizer_state(lk_strategy *s, lk_optimizer *o, lk_named_tensors *out);
/* The same, without the per-element arrays when `arrays` is false (the
 * hyperparameters and each parameter's step: a sharded checkpoint set's
 * trainer state, whose shards hold the arrays). Never a collective then. */
lk_status lk_strategy_optimizer_state_ex(lk_strategy *s, lk_optimizer *o, lk_named_tensors *out, bool arrays);
/* Loads such a state (from any strategy's checkpoint) into `o`, this rank's
 * part of it where the strategy shards. */
lk_status lk_strategy_optimizer_state_load(lk_strategy *s, lk_optimizer *o, const lk_named_tensors *state);
/* Whether this rank writes checkpoint files (replicas: global rank 0). */
bool lk_strategy_writes_checkpoint(const lk_strategy *s);
/* After a checkpoint's full state dict was loaded into the net on this
 * rank: a sharded strategy keeps its shard and lets the rest go. Replicas
 * (and any strategy before lk_strategy_wrap): nothing to do. */
lk_status lk_strategy_state_dict_loaded(lk_strategy *s);
/* Before a checkpoint's training state (optimizer, scheduler, counters) is
 * restored: UNSUPPORTED with the reason where this strategy cannot restore
 * it exactly (a pipeline of several stages, whose checkpoint holds stage 0's
 * optimizer state only); OK otherwise. Loading weights alone is not
 * concerned. */
lk_status lk_strategy_check_resume(const lk_strategy *s);
/* Before the whole model runs on every rank (validation, test, the end of
 * fit): makes each rank's copy of the parameters and buffers current. A
 * collective (every rank calls it in the same order): the pipeline
 * strategies, whose stages update only their own blocks, broadcast each
 * stage's when they changed since the last call; nothing to do for the
 * others or before lk_strategy_wrap. */
lk_status lk_strategy_sync_model(lk_strategy *s);

/* ---- sharded checkpoints (docs/CHECKPOINTS.md) ----------------------------------
 * A piece: the range [lo, hi) of one parameter's flattened elements that
 * this rank holds, by the parameter's state-dict name. A sharded
 * checkpoint set stores the pieces each rank owns; loading asks each rank's
 * pieces under its current layout and fills them from whichever files
 * cover them, so a set loads at any world size. Pointers are borrowed from
 * the strategy and live until its layout changes (the next step). */
#define LK_SHARD_MAX_STATE 4
typedef struct lk_shard_piece {
    const char *name;     /* the parameter's state-dict name */
    lk_dtype dtype;       /* of value: the parameters' dtype */
    int ndim;
    const int64_t *shape; /* the whole tensor's */
    int64_t numel;        /* the whole tensor's */
    int64_t lo, hi;       /* the flattened range held here */
    void *value;          /* hi - lo elements of dtype */
    int nstate;           /* the optimizer's state arrays given (0: the strategy does not hold them) */
    float *state[LK_SHARD_MAX_STATE]; /* hi - lo f32 elements each, in the optimizer's order */
} lk_shard_piece;
/* Whether the strategy shards the model state and so can write a sharded
 * checkpoint set (each rank its own pieces); false for the replicas. */
bool lk_strategy_shards_state(const lk_strategy *s);
/* This rank's pieces (*out: lk_free it). Sharded strategies: the pieces
 * this rank owns, with the optimizer state of their elements. Replicas:
 * every parameter whole, without optimizer state (rank 0's to save, every
 * rank's to load). Not a collective. */
lk_status lk_strategy_shard_pieces(lk_strategy *s, lk_shard_piece **out, int *n);
/* After every rank filled its pieces' values from a checkpoint set: a
 * strategy that keeps replicated parameters shares the pieces (ZeRO 1/2:
 * an all-gather). Collective for such strategies; nothing for replicas. */
lk_status lk_strategy_shard_pieces_loaded(lk_strategy *s);

/* ---- pipelines (model_parallel, pipeline) ---------------------------------------
 * A pipeline strategy cuts the network into stages of consecutive blocks
 * (lk_model_blocks, which lives above this layer: the caller passes them
 * in before lk_strategy_wrap). */
/* Whether the strategy needs the network's blocks (lk_strategy_set_blocks). */
bool lk_strategy_needs_blocks(const lk_strategy *s);
/* The network's blocks in order (borrowed until lk_strategy_free); checks
 * the split against them (a name that is no block, more stages than
 * blocks: INVALID_ARGUMENT naming them). Nothing to do for other strategies. */
lk_status lk_strategy_set_blocks(lk_strategy *s, const lk_named_layer *blocks, int n);
/* Whether lk_strategy_wrap materialises a deferred model (a network from
 * lk_model_create_deferred) itself, never holding the whole of it: a
 * pipeline or model_parallel stage only its blocks (not when split by
 * time: that profiles the whole model), fsdp and the DeepSpeed stages 2
 * and 3 one unit at a time. Otherwise the caller materialises it first
 * (lk_layer_materialize; the trainer does). */
bool lk_strategy_materializes(const lk_strategy *s);
/* Whether the split waits for lk_strategy_profile_blocks (a pipeline with
 * trainer.pipeline.split time), to be called after lk_strategy_set_blocks
 * and before lk_strategy_wrap. */
bool lk_strategy_wants_block_profile(const lk_strategy *s);
/* The split by measured time: rank 0 times one forward and backward of
 * each block on one micro-batch's rows of x (the first block's input: a
 * batch as the model brings it there, lk_model_blocks_input), the times
 * are broadcast, and every rank cuts the same contiguous stages with the
 * smallest slowest stage. A collective (every rank passes its own x; only
 * rank 0's is run). The blocks' gradients are dropped afterwards and their
 * buffers untouched (they run in eval mode). Nothing for other strategies. */
lk_status lk_strategy_profile_blocks(lk_strategy *s, lk_tensor *x);
/* Whether evaluation runs the batch through the strategy's own forward (a
 * pipeline attached for fit, test or predict: a forward-only schedule over
 * its stages) instead of the whole model on every rank after
 * lk_strategy_sync_model. */
bool lk_strategy_evals_forward(const lk_strategy *s);
/* That forward: the model's output on batch b (its rows in the batch's
 * order) on every rank, *out owned by the caller. `whole`: the batch goes
 * through the stages as one micro-batch, so every matrix product has the
 * shape the whole model's forward has and the output is its bits (test,
 * predict); else in the strategy's micro-batches, which overlap on the
 * stages but round differently (validation inside fit). A collective over
 * the strategy's pipeline group; INVALID_USAGE where
 * lk_strategy_evals_forward is false. */
lk_status lk_strategy_eval_forward(lk_strategy *s, const lk_batch *b, bool whole, lk_tensor **out);

/* ---- the data-parallel group ----------------------------------------------------
 * The ranks that see different data and average their gradients: the
 * sampler's shards, the linear LR scaling, the global batch, SyncBatchNorm's
 * statistics and sync_dist metrics are over this group, not the world.
 * ddp: the world; single and dp (whose replicas are threads of this one
 * process, fed by one loader): this process alone (comm NULL, size 1). */
lk_comm *lk_strategy_dp_comm(const lk_strategy *s);
int lk_strategy_dp_size(const lk_strategy *s);
int lk_strategy_dp_rank(const lk_strategy *s);
/* In-place reduction of n doubles over the data-parallel group (sync_dist
 * metrics); nothing to do on a group of one. */
lk_status lk_strategy_dp_reduce(lk_strategy *s, double *vals, int n, lk_reduce_op op);

/* ---- the training step --------------------------------------------------------
 * The caller's side of a step: what runs on one replica. */
typedef struct lk_step_fn {
    void *ctx;
    /* Forward of replica `replica` (0: the caller's module, on the calling
     * thread; dp's others on their own threads) over batch b: returns the
     * micro-batch's unscaled mean loss (in the current scope) or NULL with the
     * error set. The strategy enters the step's autocast around it. */
    lk_tensor *(*forward)(void *ctx, int replica, const lk_batch *b, int64_t batch_idx);
    /* (optional) Sees the step's loss (the mean over the whole micro-batch)
     * once backward is queued, before the last gradients are reduced
     * (single, ddp), or once the replicas are done (dp). An error ends the
     * step with it. Not called by single and ddp when keep_loss is set, nor
     * by dp when keep_replica_loss is. */
    lk_status (*check_loss)(void *ctx, double loss);
    /* (optional; single and ddp, dp ignores it) Takes the loss instead of
     * the strategy reading it: called once backward is queued, with the
     * tensor training_step returned (valid during the call only). The
     * caller keeps its value where it is and reads and checks it later,
     * with whatever else it reads (the trainer: with the gradients'
     * non-finite flags, in one device->host copy per step); r->loss is then
     * NaN. An error ends the step with it. */
    lk_status (*keep_loss)(void *ctx, const lk_tensor *loss);
    /* (optional; dp) keep_loss for dp: replica `replica`'s loss (on its
     * device), the mean over `rows` of the micro-batch's `total` rows,
     * called on the calling thread once every replica is done and the
     * gradients are combined, in replica order; a replica without rows is
     * skipped. The caller reads the losses later (the trainer: in the
     * step's one read, on device 0) and checks their mean weighted by
     * rows / total, the value check_loss would have seen; r->loss is NaN. */
    lk_status (*keep_replica_loss)(void *ctx, int replica, const lk_tensor *loss, int64_t rows, int64_t total);
    /* (optional) Around a step whose every op runs on the calling thread
     * (single, ddp; dp's replicas run on their own threads, so dp calls
     * neither): before the forward, and after the reduction with when
     * forward, backward and the gradient reduction ended (lk_time_now). */
    void (*step_begin)(void *ctx);
    void (*step_end)(void *ctx, double t_fwd_end, double t_bwd_end, double t_comm_end);
    /* dp only: replica k (k >= 1) of the caller's module; *net is its
     * network, whose parameters the strategy flattens and fills from
     * replica 0's. free_replica(k) frees it (after the strategy let go of its
     * tensors). */
    lk_status (*replicate)(void *ctx, int k, lk_layer **net);
    void (*free_replica)(void *ctx, int k);
    /* model_parallel and pipeline (required there, ignored elsewhere): the
     * first stage's input of a micro-batch (the module's forward without
     * the network: the batch's field 0), the last stage's loss of the
     * network's output (the module's loss), and the step's mean loss over
     * the micro-batches, known on every rank, logged as train_loss. */
    lk_tensor *(*pipe_input)(void *ctx, const lk_batch *b);
    lk_tensor *(*pipe_loss)(void *ctx, lk_tensor *out, const lk_batch *b);
    lk_status (*pipe_log_loss)(void *ctx, double loss);
} lk_step_fn;

/* dp's cut of a micro-batch of `size` rows over n replicas: replica k
 * takes rows [*start, *start + *rows), the first size % n replicas one row
 * more than the others (the trainer's prefetch stages the same slices). */
void lk_strategy_dp_slice(int64_t size, int n, int k, int64_t *start, int64_t *rows);

typedef struct lk_step_args {
    const lk_batch *batch;
    int64_t batch_idx;
    bool sync;        /* the last micro-batch before an optimizer step: reduce the gradients */
    float loss_mul;   /* 1/accumulate_grad_batches (1: none) */
    float loss_scale; /* the fp16 loss scaler's scale (1: none); applied after loss_mul */
    lk_dtype autocast; /* the precision policy: forward under this autocast (LK_F32: none) */
} lk_step_args;

typedef struct lk_step_result {
    double loss;                /* the micro-batch's mean loss (unscaled) */
    double t_fwd, t_bwd, t_comm; /* seconds in forward, backward and the exposed gradient reduction */
} lk_step_result;

/* Hands the strategy the caller's side of the step (copied), once, after
 * lk_strategy_setup and the optimizer: dp makes its replicas here (and sets
 * BLAS to one thread each). */
lk_status lk_strategy_attach(lk_strategy *s, const lk_step_fn *fn);
/* Lets go of what lk_strategy_attach made (dp: stops the replicas' threads
 * and frees the replicas through fn->free_replica). lk_strategy_free does it
 * too; idempotent. */
void lk_strategy_detach(lk_strategy *s);
/* One micro-batch: forward, backward and, when a->sync, the gradient
 * reduction. The gradients then hold the batch's (averaged over ranks for
 * ddp, summed over replicas for dp) and are ready for the optimizer. */
lk_status lk_strategy_training_step(lk_strategy *s, const lk_step_args *a, lk_step_result *r);
/* The optimizer step of a synced step and what the strategy does around it:
 * lk_optimizer_step(o) unless `skip` (the loss scaler found an overflow),
 * then ddp's shard sync (shared parameters), dp's copy of the parameters to
 * its replicas, and the gradients zeroed. Time spent in the shard sync is
 * in lk_strategy_get_stats().step_sync_last_s. */
lk_status lk_strategy_optimizer_step(lk_strategy *s, lk_optimizer *o, bool skip);

/* ---- lower-level calls (the step above makes them) ------------------------------ */
/* Before the forward pass (ddp: broadcast buffers when configured). */
lk_status lk_strategy_before_forward(lk_strategy *s);
/* Before backward: `sync` false inside no_sync (gradient accumulation), so
 * this pass reduces nothing. */
void lk_strategy_begin_backward(lk_strategy *s, bool sync);
/* After backward: on a syncing pass, starts the buckets still waiting
 * (parameters that got no gradient) and waits for every bucket. Gradients
 * then hold the average over ranks. */
lk_status lk_strategy_finish_backward(lk_strategy *s);
/* With shared parameters: moves the optimizer's state into shared memory
 * and restricts its update to this rank's shard (collective; the optimizer
 * must have one parameter group over all the parameters, in order). No-op
 * otherwise. Call once, after lk_strategy_setup. */
lk_status lk_strategy_shard_optimizer(lk_strategy *s, lk_optimizer *o);
/* After each optimizer step: with a sharded optimizer, waits until every
 * rank has updated its shard (no rank reads a parameter before). No-op
 * otherwise. */
lk_status lk_strategy_after_step(lk_strategy *s);
bool lk_strategy_shares_params(const lk_strategy *s);
/* grads <- 0 (one memset over the flat buffer). */
void lk_strategy_zero_grad(lk_strategy *s);
/* In-place reduction of n doubles across every rank (decisions every rank
 * must share: a batch count, the loss scaler's overflow flag). */
lk_status lk_strategy_reduce(lk_strategy *s, double *vals, int n, lk_reduce_op op);
lk_status lk_strategy_broadcast(lk_strategy *s, void *buf, size_t count, lk_dtype dt, int root);
lk_status lk_strategy_barrier(lk_strategy *s);

const char *lk_strategy_name(const lk_strategy *s);
/* How the fit's opening line names it ("dp, one replica per device on threads"). */
const char *lk_strategy_summary(const lk_strategy *s);
int lk_strategy_rank(const lk_strategy *s);
int lk_strategy_world_size(const lk_strategy *s);
bool lk_strategy_is_global_zero(const lk_strategy *s);

/* ---- uneven inputs (PyTorch's Join) ------------------------------------------
 * When ranks have different numbers of batches, a rank that runs out keeps
 * answering the others' gradient all-reduces with zeros until every rank is
 * out. Each rank calls lk_strategy_join_step(s, true, &done) at the start of
 * every step it has data for, and lk_strategy_join(s) once it has none.
 * Gradients are still averaged over the whole world (PyTorch's default,
 * divide_by_initial_world_size), so a joined rank dilutes the others'
 * steps. Without these calls a mismatch is not silent: the communicator
 * reports the desync (or the rank that left). With a sharded optimizer
 * (shared parameters) lk_strategy_join is UNSUPPORTED: a rank that ran out
 * takes no optimizer step, so its shard would not be updated. */
lk_status lk_strategy_join_step(lk_strategy *s, bool has_data, bool *all_done);
lk_status lk_strategy_join(lk_strategy *s);

/* (optional) A profiler's view of ddp's gradient buckets: called on the
 * thread that collects each bucket's all-reduce (the one that called
 * finish_backward), with the bucket's index, its bytes as sent, when the
 * all-reduce ran (lk_time_now seconds) and whether it ran on the
 * communication thread (false: the last bucket, reduced inline). fn NULL
 * clears it. */
typedef void (*lk_strategy_bucket_fn)(void *ctx, int bucket, size_t bytes, double t_start, double t_end,
                                      bool comm_thread);
void lk_strategy_set_bucket_hook(lk_strategy *s, lk_strategy_bucket_fn fn, void *ctx);
/* (optional) A profiler's view of a pipeline's schedule (model_parallel,
 * pipeline): called on the step's thread after each action of this rank's
 * list ran, with its kind (lk_pipe_kind of lockstep/pipeline.h), its
 * micro-batch (a message group: its first message's; -1: none) and when
 * it ran (lk_time_now seconds). fn NULL clears it. */
typedef void (*lk_strategy_pipe_fn)(void *ctx, int kind, int chunk, double t_start, double t_end);
void lk_strategy_set_pipe_hook(lk_strategy *s, lk_strategy_pipe_fn fn, void *ctx);

typedef struct lk_strategy_stats {
    uint64_t allreduce_calls;  /* bucket all-reduces issued so far */
    uint64_t bytes_reduced;    /* ... and the bytes they carried (per rank, as sent) */
    int buckets;               /* number of gradient buckets */
    double comm_exposed_s;     /* time finish_backward (and after_step) spent waiting, summed */
    double comm_wait_last_s;   /* ... in the last synced step */
    double comm_straggler_s;   /* the part of comm_exposed_s spent waiting for the last rank to arrive (shm) */
    double comm_straggler_last_s; /* ... in the last synced step's finish_backward */
    double step_sync_last_s;      /* shared parameters: the last lk_strategy_after_step (counted in comm_exposed_s) */
    double step_straggler_last_s; /* ... its wait for the last rank (counted in comm_straggler_s) */
    /* model_parallel, pipeline: this rank's schedule runs over the steps
     * after the first, summed: their time, and the part spent in messages
     * (waiting for a neighbour stage: the bubble, plus the transfers) */
    int pipe_stages, pipe_chunks; /* 0: not a pipeline */
    int pipe_virtual;             /* the model's stages per rank (interleaved_1f1b; else 1) */
    double pipe_run_s, pipe_comm_s;
} lk_strategy_stats;
lk_strategy_stats lk_strategy_get_stats(const lk_strategy *s);

/* The model state this rank holds, in bytes (ZeRO's accounting): the flat
 * parameters, the flat gradients and the optimizer's state (that of
 * lk_strategy_shard_optimizer's optimizer; 0 before). The replicas hold
 * everything whole (ddp's shared_params: the node's one copy, counted whole
 * here); deepspeed_stage_1/2 hold 1/N of the optimizer state (and their
 * padded buffers). Zero before lk_strategy_wrap. */
typedef struct lk_strategy_memory {
    int64_t param_bytes, grad_bytes, optim_state_bytes;
    /* Parameters gathered whole for a unit's forward or backward beyond the
     * rank's own shards, at most at once (fsdp, deepspeed_stage_3); 0 for the
     * strategies that keep every parameter whole. */
    int64_t gathered_bytes;
} lk_strategy_memory;
lk_strategy_memory lk_strategy_get_memory(const lk_strategy *s);
/* Internal: whether the strategy keeps only a chunk of the optimizer's
 * state (deepspeed_stage_1/2): the trainer then creates the optimizer
 * without state (lk__optimizer_defer_state), so that the whole replicated
 * state is never allocated, not even for a moment. */
bool lk__strategy_chunks_optimizer_state(const lk_strategy *s);

#ifdef __cplusplus
}
#endif
#endif

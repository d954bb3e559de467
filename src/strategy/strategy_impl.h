/* Private to src/strategy: the strategy vtable and the head every strategy
 * shares. strategy.c owns the registry (name -> vtable, "auto"), the public
 * functions (which check their arguments once and dispatch) and the helpers
 * more than one strategy uses: the flat gradient buffer, the gradients as
 * views of it, and the step of a strategy whose replica is this process
 * (single, ddp). Each strategy is one file that fills an lk_strategy_vt:
 * single.c, ddp.c, dp.c. A slot left NULL means "nothing to do" (or, for
 * create's checks, "accept"). */
#ifndef LK_STRATEGY_IMPL_H
#define LK_STRATEGY_IMPL_H

#include "lockstep/autograd.h"
#include "lockstep/strategy.h"

typedef struct lk_strategy_vt {
    const char *name;    /* what lk_strategy_name answers and checkpoints record */
    const char *summary; /* the fit's opening line ("dp, one replica per device on threads") */
    /* Checks the config (the head is filled) and allocates the strategy's own
     * state into s->self; the head is freed by strategy.c. */
    lk_status (*create)(lk_strategy *s);
    /* Frees s->self and gives back what the strategy put into the
     * parameters (e.g. shared storage), before strategy.c restores the
     * gradients and frees the flat buffer. */
    void (*free)(lk_strategy *s);
    /* Where the flat gradient buffer lives (NULL: private aligned memory).
     * *shared true when it came from lk_comm_alloc_shared. */
    lk_status (*alloc_grads)(lk_strategy *s, size_t bytes, void **mem, bool *shared);
    /* One copy of the parameters for every rank (NULL: each keeps its own). */
    lk_status (*param_buffer)(lk_strategy *s, int64_t numel, void **buf, bool *copy_values);
    /* After the head holds the parameters: make the replicas identical and
     * take over the gradients (lk__strategy_grads_to_flat). */
    lk_status (*setup)(lk_strategy *s);
    /* The trainer's side of the step is known (dp makes its replicas). */
    lk_status (*attach)(lk_strategy *s);
    void (*detach)(lk_strategy *s);
    /* One micro-batch: forward, backward and the gradient reduction. */
    lk_status (*training_step)(lk_strategy *s, const lk_step_args *a, lk_step_result *r);
    /* Hooks of the step of lk__strategy_local_step (single, ddp). */
    lk_status (*before_forward)(lk_strategy *s);
    void (*begin_backward)(lk_strategy *s, bool sync);
    lk_status (*finish_backward)(lk_strategy *s);
    /* After the optimizer step (or its skip), before the gradients are
     * zeroed: ddp waits for every shard, dp copies the parameters out. */
    lk_status (*after_step)(lk_strategy *s);
    lk_status (*shard_optimizer)(lk_strategy *s, lk_optimizer *o);
    bool (*shares_params)(const lk_strategy *s);
    /* Uneven inputs: this rank has no more data (PyTorch's Join). */
    lk_status (*join)(lk_strategy *s);
    /* The parameter layout and the state (optional: NULL gives the replica
     * strategies' behaviour, strategy.c's lk__strategy_wrap_whole etc.) */
    /* Wraps the net: makes s->units, fills s->local (the parameters this
     * rank holds) and s->local_buffers, and calls lk_strategy_setup. */
    lk_status (*wrap)(lk_strategy *s, lk_layer *net);
    /* Clipping by the total norm over what the strategy shards. */
    lk_status (*clip_grad_norm)(lk_strategy *s, double max_norm, double norm_type);
    /* The full state dict for a checkpoint (gathered), and the shard kept after a load. */
    lk_status (*state_dict)(lk_strategy *s, lk_layer *net, lk_named_tensors *out);
    lk_status (*state_dict_loaded)(lk_strategy *s);
    /* (optional) The optimizer's state under the net's names, and its load
     * (NULL: the optimizer's own, lk_optimizer_state_get / _load). */
    lk_status (*optimizer_state)(lk_strategy *s, lk_optimizer *o, lk_named_tensors *out, bool arrays);
    lk_status (*optimizer_state_load)(lk_strategy *s, lk_optimizer *o, const lk_named_tensors *state);
    /* The data-parallel group when it is not the whole communicator (a
     * subgroup: pipeline stages, tensor parallelism); NULL: s->comm. */
    lk_comm *(*dp_comm)(lk_strategy *s);
    /* (optional) Why a checkpoint's training state cannot be resumed under
     * this strategy here (NULL: it can); lk_strategy_check_resume's. */
    const char *(*resume_unsupported)(const lk_strategy *s);
    /* (pipelines) The network's blocks before wrap (lk_strategy_set_blocks);
     * NULL: the strategy needs none. */
    lk_status (*set_blocks)(lk_strategy *s, const lk_named_layer *blocks, int n);
    /* (optional, pipelines) Whether the split waits for a profile of the
     * blocks, and that profile (lk_strategy_profile_blocks). */
    bool (*wants_profile)(const lk_strategy *s);
    /* (optional) Whether wrap materialises a deferred model itself
     * (lk_model_create_deferred), holding no more than its share of it at
     * any time: a pipeline stage its blocks, fsdp one unit at a time.
     * NULL or false: the trainer materialises it whole before the wrap. */
    bool (*materializes)(const lk_strategy *s);
    /* (optional, pipelines) Whether evaluation runs through the strategy's
     * forward, and that forward (lk_strategy_eval_forward). */
    bool (*evals_forward)(const lk_strategy *s);
    lk_status (*eval_forward)(lk_strategy *s, const lk_batch *b, bool whole, lk_tensor **out);
    lk_status (*profile_blocks)(lk_strategy *s, lk_tensor *x);
    /* (optional) Every rank's copy of the whole model made current before
     * it runs whole (lk_strategy_sync_model; a collective); NULL: nothing
     * (the replicas' copies always are). */
    lk_status (*sync_model)(lk_strategy *s);
    /* (optional) The model state this rank holds, when it is not every
     * buffer whole (lk_strategy_get_memory's default). */
    void (*memory)(const lk_strategy *s, lk_strategy_memory *m);
    /* (optional, sharded strategies) The pieces this rank owns for a
     * sharded checkpoint (lk_strategy_shard_pieces; NULL: the replicas'
     * default, every parameter whole), and what follows filling them on a
     * load (lk_strategy_shard_pieces_loaded). */
    lk_status (*shard_pieces)(lk_strategy *s, lk_shard_piece **out, int *n);
    lk_status (*shard_pieces_loaded)(lk_strategy *s);
    /* Whether shard_optimizer keeps only a chunk of the optimizer's state
     * (lk__optimizer_shard_chunk): the trainer then creates the optimizer
     * without state, so the whole state is never allocated
     * (lk__strategy_chunks_optimizer_state). */
    bool chunks_optimizer_state;
} lk_strategy_vt;

extern const lk_strategy_vt lk__strategy_single;
extern const lk_strategy_vt lk__strategy_ddp;
extern const lk_strategy_vt lk__strategy_dp;
extern const lk_strategy_vt lk__strategy_model_parallel; /* pipeline.c */
extern const lk_strategy_vt lk__strategy_pipeline;
extern const lk_strategy_vt lk__strategy_zero1; /* zero.c: deepspeed_stage_1 */
extern const lk_strategy_vt lk__strategy_zero2; /* fsdp.c: deepspeed_stage_2 (parameters kept whole) */
extern const lk_strategy_vt lk__strategy_fsdp;  /* fsdp.c: fsdp */
extern const lk_strategy_vt lk__strategy_zero3; /* fsdp.c: deepspeed_stage_3 */

struct lk_strategy {
    const lk_strategy_vt *vt;
    void *self; /* the strategy's own state */
    void *ext;  /* a strategy built over another's vtable (zero.c over ddp's): its own state, beside self */
    lk_strategy_config cfg;
    lk_ddp_options ddp; /* cfg.ddp's copy (its defaults when none was given); cfg.ddp points here */
    lk_fsdp_options fsdp; /* cfg.fsdp's copy, likewise */
    lk_comm *comm;
    int rank, world;
    /* lk_strategy_setup's arrays (borrowed) */
    lk_tensor *const *params;
    const char *const *names;
    int nparams;
    lk_tensor *const *buffers;
    int nbuffers;
    /* the flat gradient buffer: every parameter's .grad is a view of it */
    void *flat_grad;        /* flat_numel elements of cfg.param_dtype */
    lk_tensor *flat_grad_t; /* the same memory as a tensor (lk_strategy_grad_buffer) */
    int64_t flat_numel;
    bool flat_shared;
    /* the parameters live in memory every rank of the node maps (one copy,
     * rank 0's values): ddp's setup then broadcasts nothing (zero.c's
     * shared mode sets it; ddp's own shared mode has its own flag) */
    bool params_common;
    lk_device flat_dev;     /* where it lives: cfg.device, or the host for a strategy that offloads its
                             * gradient chunks and optimizer to the CPU (fsdp's cpu_offload on a GPU) */
    lk_tensor *param_buf_t; /* lk_strategy_param_buffer's answer, when there is one */
    lk_step_fn fn;          /* lk_strategy_attach's */
    bool attached;
    bool sync;
    int64_t join_steps; /* steps this rank had data for (uneven inputs) */
    lk_strategy_stats stats;
    lk_strategy_bucket_fn bucket_fn; /* profiler (optional) */
    void *bucket_ctx;
    lk_strategy_pipe_fn pipe_fn; /* profiler (optional) */
    void *pipe_ctx;
    /* the layout lk_strategy_wrap made */
    bool wrapped;
    lk_layer *net;                 /* borrowed */
    lk_named_tensors local;        /* the parameters this rank holds */
    lk_named_tensors local_buffers;
    lk_tensor **local_arr, **buffer_arr; /* lk_strategy_setup's arrays, owned here when wrap made them */
    const char **local_names;
    struct lk__unit {
        lk_tensor *params, *grads; /* flat views (owned references) */
    } *units;
    int nunits;
    /* the data-parallel group (lk_strategy_dp_comm): dp_comm NULL alone */
    lk_comm *dp_comm;
    int dp_rank, dp_size;
    int64_t optim_state_floats; /* lk_strategy_shard_optimizer's optimizer's, whole (0: none) */
};

/* Tests only: one more strategy, found by info->name (copied) and not
 * listed among the names; its vtable is borrowed for the process's life.
 * A test that needs a strategy of another shape (a data-parallel group
 * that is a subgroup) registers it before lk_trainer_create. */
void lk__strategy_register_test(const lk_strategy_info *info, const lk_strategy_vt *vt);

/* The replica strategies' wrap (vt->wrap NULL): one unit over every
 * parameter, in registration order, as lk_strategy_grad_buffer,
 * lk_strategy_param_buffer and lk_params_flatten_into make it. */
lk_status lk__strategy_wrap_whole(lk_strategy *s, lk_layer *net);

/* The flat gradient buffer of `numel` floats, allocated once (vt->alloc_grads). */
lk_status lk__strategy_alloc_flat(lk_strategy *s, int64_t numel);
/* Every parameter's .grad becomes the view of its range of the flat buffer
 * (registration order; an existing gradient is copied in, one already in
 * place is kept). */
lk_status lk__strategy_grads_to_flat(lk_strategy *s);
/* The step of a strategy whose one replica is this process: the hooks
 * before_forward / begin_backward / finish_backward of s->vt around the
 * trainer's forward and lk_backward. */
lk_status lk__strategy_local_step(lk_strategy *s, const lk_step_args *a, lk_step_result *r);
/* The loss of a micro-batch as backward sees it: times loss_mul (skipped
 * at 1) then loss_scale (skipped at 1) — the order the bits depend on. */
lk_tensor *lk__strategy_scale_loss(lk_tensor *loss, float mul, float scale);

#endif

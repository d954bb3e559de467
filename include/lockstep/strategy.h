/* lockstep/strategy.h — how a training step is spread over devices.
 *
 * A strategy wraps the parts of a step that depend on where it runs: setup
 * (replicas start identical), the backward path (DDP starts each gradient
 * bucket's all-reduce the moment its last gradient is ready, while backward
 * goes on), the wait before the optimizer step, metric reduction, and which
 * rank writes files. `single` does nothing extra; `ddp` runs one process per
 * device over an lk_comm.
 *
 *     lk_strategy_config sc = lk_strategy_config_default();
 *     sc.name = "ddp"; sc.comm = comm;                 // comm borrowed
 *     lk_strategy *s; LK_TRY(lk_strategy_create(&sc, &s));
 *     LK_TRY(lk_strategy_setup(s, params, names, n, buffers, nbuf));
 *     for each micro-batch:
 *         lk_strategy_begin_backward(s, last_micro_batch);   // no_sync when false
 *         lk_backward(loss);
 *         LK_TRY(lk_strategy_finish_backward(s));             // waits for buckets when syncing
 *     optimizer step; lk_strategy_zero_grad(s);
 */
#ifndef LOCKSTEP_STRATEGY_H
#define LOCKSTEP_STRATEGY_H

#include "lockstep/dist.h"
#include "lockstep/optim.h"
#include "lockstep/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lk_strategy lk_strategy;

typedef struct lk_strategy_config {
    const char *name;         /* "auto" (single for one process, ddp for several), "single", "ddp" */
    lk_comm *comm;            /* borrowed; required for ddp; NULL for single */
    double bucket_cap_mb;     /* ddp: gradient bucket size (default 25) */
    bool broadcast_buffers;   /* ddp: buffers (BatchNorm stats) from rank 0 before each forward (default true) */
    bool report_unused;       /* ddp: a parameter that got no gradient in a synced step is an error naming it
                                 (default false: its zero gradient is reduced like any other) */
    lk_dtype comm_dtype;      /* ddp: the dtype gradients travel in. LK_F32 (default) is exact; LK_BF16 or
                                 LK_F16 halve the bytes (PyTorch's bf16/fp16_compress_hook): each bucket is
                                 rounded to it, averaged in f32 and rounded once more, then widened back */
    bool shared_params;       /* ddp over shm (one node): one copy of the parameters and the optimizer state
                                 for all ranks, each rank updating a 1/W shard of it after the all-reduce
                                 (same bits, a W-th of the optimizer's memory traffic and memory per rank).
                                 Default true; ignored where ranks share no memory (mpi). false: every rank
                                 keeps a replica and updates all of it, as PyTorch DDP does */
} lk_strategy_config;
lk_strategy_config lk_strategy_config_default(void);

/* Names the strategies can take (for --help and the "did you mean" hint). */
const char *const *lk_strategy_names(int *count);

lk_status lk_strategy_create(const lk_strategy_config *cfg, lk_strategy **out);
void lk_strategy_free(lk_strategy *s);

/* The flat gradient buffer (zeroed, LK_ALIGN-aligned; for ddp inside the
 * communicator's shared memory, so buckets are reduced with no copy in).
 * Pass it to lk_params_flatten before lk_strategy_setup so that the
 * optimizer's flat gradient and DDP's buckets are the same memory. Owned by
 * the strategy. */
lk_status lk_strategy_grad_buffer(lk_strategy *s, int64_t numel, float **out);
/* The memory the parameters live in when ranks share one copy
 * (cfg.shared_params on shm; collective): pass it to lk_params_flatten_into,
 * with copy_values, before lk_strategy_setup. *buf is NULL where each rank
 * keeps its own replica: flatten into private memory then. Owned by the
 * strategy; on lk_strategy_free every parameter gets its own copy back. */
lk_status lk_strategy_param_buffer(lk_strategy *s, int64_t numel, float **buf, bool *copy_values);
/* Makes every replica start identical (ddp: parameters and buffers broadcast
 * from rank 0) and takes over the gradients: each parameter's .grad becomes a
 * view of the flat gradient buffer in registration order (kept as is when
 * lk_params_flatten already put it there); buckets are cut walking
 * backwards, the order backward produces gradients. Arrays are
 * borrowed and must stay valid until lk_strategy_free. */
lk_status lk_strategy_setup(lk_strategy *s, lk_tensor *const *params, const char *const *names, int n,
                            lk_tensor *const *buffers, int nbuf);
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
/* In-place reduction of n doubles across ranks (metrics). */
lk_status lk_strategy_reduce(lk_strategy *s, double *vals, int n, lk_reduce_op op);
lk_status lk_strategy_broadcast(lk_strategy *s, void *buf, size_t count, lk_dtype dt, int root);
lk_status lk_strategy_barrier(lk_strategy *s);

const char *lk_strategy_name(const lk_strategy *s);
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
} lk_strategy_stats;
lk_strategy_stats lk_strategy_get_stats(const lk_strategy *s);

#ifdef __cplusplus
}
#endif
#endif

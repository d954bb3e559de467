/* Strategies: `single` and `ddp`. DDP keeps every gradient in one flat
 * buffer inside the communicator's shared memory, in reverse parameter order,
 * cut into buckets of about bucket_cap_mb; a parameter's grad-ready hook
 * counts its bucket down, and buckets are all-reduced (average) in index
 * order the moment they are complete — while backward continues — so that
 * every rank issues the same collectives in the same order. The last bucket
 * is reduced on the calling thread in finish_backward (see launch_ready). */
#include <string.h>

#include "autograd/autograd_impl.h"
#include "lockstep/strategy.h"
#include "optim/optim_impl.h"
#include "tensor/tensor_impl.h"

typedef enum { STRAT_SINGLE, STRAT_DDP } strat_kind;

typedef struct bucket {
    int64_t offset, count; /* element range of the flat gradient buffer */
    int nparams, ready;
    lk_work *work;
} bucket;

typedef struct param_slot {
    lk_strategy *s;
    int bucket;
    bool got_grad;
} param_slot;

struct lk_strategy {
    strat_kind kind;
    lk_strategy_config cfg;
    lk_comm *comm;
    int rank, world;
    lk_tensor *const *params;
    const char *const *names;
    int nparams;
    lk_tensor *const *buffers;
    int nbuffers;
    float *flat_grad; /* ddp: in shared memory */
    uint16_t *wire;   /* ddp with comm_dtype bf16/f16: the buckets as they travel (shared memory) */
    int64_t flat_numel;
    bool flat_shared;
    bucket *buckets;
    int nbuckets, next_launch;
    param_slot *slots;
    bool sync;
    lk_status async_err;
    int64_t join_steps; /* steps this rank had data for (uneven inputs) */
    /* Shared parameters (one node): one copy for all ranks, in rank 0's
     * part of the segment; each rank updates its shard of it. */
    float *common_params, *common_state;
    bool common_owner, sharded;
    lk_strategy_stats stats;
    lk_strategy_bucket_fn bucket_fn; /* profiler (optional) */
    void *bucket_ctx;
};

static const char *const strategy_names[] = {"auto", "single", "ddp"};

const char *const *lk_strategy_names(int *count) {
    *count = (int)(sizeof strategy_names / sizeof strategy_names[0]);
    return strategy_names;
}

lk_strategy_config lk_strategy_config_default(void) {
    return (lk_strategy_config){.name = "auto", .comm = NULL, .bucket_cap_mb = 25.0, .broadcast_buffers = true,
                                .report_unused = false, .comm_dtype = LK_F32, .shared_params = true};
}

lk_status lk_strategy_create(const lk_strategy_config *cfg, lk_strategy **out) {
    *out = NULL;
    const char *name = cfg->name ? cfg->name : "auto";
    int world = cfg->comm ? lk_comm_world_size(cfg->comm) : 1;
    strat_kind kind;
    if (!strcmp(name, "auto")) kind = world > 1 ? STRAT_DDP : STRAT_SINGLE;
    else if (!strcmp(name, "single")) kind = STRAT_SINGLE;
    else if (!strcmp(name, "ddp") || !strcmp(name, "ddp_spawn")) kind = STRAT_DDP;
    else {
        int n;
        const char *const *names = lk_strategy_names(&n);
        const char *s = lk_suggest(name, names, n);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown strategy '%s'%s%s%s (expected auto, single or ddp)", name,
                        s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "");
    }
    if (kind == STRAT_SINGLE && world > 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy 'single' runs one process, but %d were started", world);
    if (kind == STRAT_DDP && !cfg->comm)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy 'ddp' needs a communicator");
    if (cfg->comm_dtype != LK_F32 && cfg->comm_dtype != LK_BF16 && cfg->comm_dtype != LK_F16)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "ddp gradients travel as f32, bf16 or f16, not %s",
                        lk_dtype_name(cfg->comm_dtype));
    if (!(cfg->bucket_cap_mb > 0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "bucket_cap_mb must be > 0, got %g", cfg->bucket_cap_mb);
    lk_strategy *s = lk_calloc(1, sizeof *s);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->kind = kind;
    s->cfg = *cfg;
    s->comm = cfg->comm;
    s->rank = cfg->comm ? lk_comm_rank(cfg->comm) : 0;
    s->world = world;
    s->sync = true;
    *out = s;
    return LK_STATUS_OK;
}

static size_t bucket_bytes(const lk_strategy *s, const bucket *b) {
    return (size_t)b->count * lk_dtype_size(s->cfg.comm_dtype);
}

void lk_strategy_set_bucket_hook(lk_strategy *s, lk_strategy_bucket_fn fn, void *ctx) {
    s->bucket_fn = fn;
    s->bucket_ctx = ctx;
}

static void wait_all(lk_strategy *s) {
    for (int b = 0; b < s->nbuckets; b++) {
        if (s->buckets[b].work) {
            lk_status st = lk_work_wait(s->buckets[b].work);
            if (st && !s->async_err) s->async_err = st;
            if (!st && s->bucket_fn) {
                double t0, t1;
                lk_work_times(s->buckets[b].work, &t0, &t1);
                s->bucket_fn(s->bucket_ctx, b, bucket_bytes(s, &s->buckets[b]), t0, t1, true);
            }
            lk_work_free(s->buckets[b].work);
            s->buckets[b].work = NULL;
        }
    }
}

void lk_strategy_free(lk_strategy *s) {
    if (!s) return;
    wait_all(s);
    for (int i = 0; i < s->nparams; i++) {
        lk_tensor *p = s->params[i];
        lk_tensor_set_grad_hook(p, NULL, NULL);
        if (s->common_params) lk__tensor_own_storage(p); /* the shared copy goes away too */
        if (s->flat_grad) { /* the flat buffer goes away: give grads their own memory */
            lk_tensor *own = p->grad ? lk_tensor_clone(p->grad) : NULL;
            lk_tensor_release(p->grad);
            p->grad = own;
        }
    }
    if (s->wire) lk_comm_free_shared(s->comm, s->wire);
    if (s->common_owner) { /* only the heap's block list changes: the bytes stay mapped until lk_comm_free, so a
                              peer still copying its parameters out (above) reads them intact */
        lk_comm_free_shared(s->comm, s->common_params);
        lk_comm_free_shared(s->comm, s->common_state);
    }
    if (s->flat_grad) {
        if (s->flat_shared) lk_comm_free_shared(s->comm, s->flat_grad);
        else lk_aligned_free(s->flat_grad);
    }
    lk_free(s->buckets);
    lk_free(s->slots);
    lk_free(s);
}

/* Starts bucket b's average: in place in the gradient buffer, or rounded
 * into the wire buffer first when gradients travel compressed. */
static lk_status reduce_bucket(lk_strategy *s, bucket *b, bool async) {
    void *buf = s->flat_grad + b->offset;
    if (s->wire) {
        buf = s->wire + b->offset;
        lk_f32_to_half_n(s->cfg.comm_dtype, buf, s->flat_grad + b->offset, (size_t)b->count);
    }
    s->stats.allreduce_calls++;
    s->stats.bytes_reduced += bucket_bytes(s, b);
    if (async) return lk_comm_all_reduce_async(s->comm, buf, (size_t)b->count, s->cfg.comm_dtype, LK_REDUCE_AVG, &b->work);
    return lk_comm_all_reduce(s->comm, buf, (size_t)b->count, s->cfg.comm_dtype, LK_REDUCE_AVG);
}

/* Starts the complete buckets in index order, on the communication thread.
 * The last bucket is left to finish_backward: it completes when backward
 * does, nothing remains to overlap it with, and reducing it on the main
 * thread saves two thread hand-offs and keeps the communication thread from
 * competing with this rank's own compute for its core. */
static void launch_ready(lk_strategy *s) {
    while (s->next_launch < s->nbuckets - 1) {
        bucket *b = &s->buckets[s->next_launch];
        if (b->ready < b->nparams) return;
        lk_status st = reduce_bucket(s, b, true);
        if (st && !s->async_err) s->async_err = st;
        s->next_launch++;
    }
}

static void on_grad_ready(lk_tensor *p, void *ctx) {
    param_slot *slot = ctx;
    lk_strategy *s = slot->s;
    slot->got_grad = true;
    if (!s->sync) return;
    s->buckets[slot->bucket].ready++;
    launch_ready(s);
}

lk_status lk_strategy_grad_buffer(lk_strategy *s, int64_t numel, float **out) {
    if (s->flat_grad) {
        if (numel != s->flat_numel)
            return lk_error(LK_STATUS_INVALID_USAGE, "strategy: gradient buffer already allocated for %lld floats",
                            (long long)s->flat_numel);
        *out = s->flat_grad;
        return LK_STATUS_OK;
    }
    size_t bytes = (size_t)(numel ? numel : 1) * sizeof(float);
    if (s->kind == STRAT_DDP) {
        void *mem;
        LK_TRY(lk_comm_alloc_shared(s->comm, bytes, &mem));
        s->flat_grad = mem;
        s->flat_shared = true;
    } else if (!(s->flat_grad = lk_aligned_alloc(LK_ALIGN, bytes))) {
        return LK_STATUS_OUT_OF_MEMORY;
    }
    memset(s->flat_grad, 0, bytes);
    s->flat_numel = numel;
    *out = s->flat_grad;
    return LK_STATUS_OK;
}

lk_status lk_strategy_param_buffer(lk_strategy *s, int64_t numel, float **buf, bool *copy_values) {
    *buf = NULL;
    *copy_values = true;
    if (s->kind != STRAT_DDP || !s->cfg.shared_params || s->world < 2 || strcmp(lk_comm_backend(s->comm), "shm"))
        return LK_STATUS_OK;
    if (s->common_params) return lk_error(LK_STATUS_INVALID_USAGE, "strategy: the parameter buffer is already allocated");
    void *mem;
    LK_TRY(lk_comm_alloc_common(s->comm, (size_t)(numel ? numel : 1) * sizeof(float), &mem, &s->common_owner));
    s->common_params = mem;
    *buf = mem;
    *copy_values = s->common_owner;
    return LK_STATUS_OK;
}

lk_status lk_strategy_setup(lk_strategy *s, lk_tensor *const *params, const char *const *names, int n,
                            lk_tensor *const *buffers, int nbuf) {
    s->params = params;
    s->names = names;
    s->nparams = n;
    s->buffers = buffers;
    s->nbuffers = nbuf;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (params[i]->dtype != LK_F32)
            return lk_error(LK_STATUS_UNSUPPORTED, "parameter '%s' has dtype %s; strategies train f32 parameters",
                            names ? names[i] : "?", lk_dtype_name(params[i]->dtype));
        total += params[i]->numel;
    }
    if (s->flat_grad && s->flat_numel != total)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy: the gradient buffer holds %lld floats, the parameters %lld",
                        (long long)s->flat_numel, (long long)total);
    if (s->common_params) { /* rank 0 wrote the values: they are everyone's once it is here */
        int64_t off = 0;
        for (int i = 0; i < n; i++) {
            if ((float *)params[i]->data != s->common_params + off || !lk_tensor_is_contiguous(params[i]))
                return lk_error(LK_STATUS_INVALID_USAGE, "ddp: parameter '%s' is not where the shared parameter buffer "
                                "puts it (flatten the parameters into lk_strategy_param_buffer's memory, in order)",
                                names ? names[i] : "?");
            off += params[i]->numel;
        }
        LK_TRY(lk_comm_barrier(s->comm));
    }
    if (s->kind == STRAT_DDP) {
        /* Replicas start identical: rank 0's parameters and buffers win. */
        for (int i = 0; i < n && !s->common_params; i++) {
            lk_tensor *p = params[i];
            if (!lk_tensor_is_contiguous(p))
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "ddp: parameter '%s' is not contiguous", names ? names[i] : "?");
            LK_TRY(lk_comm_broadcast(s->comm, p->data, (size_t)p->numel, p->dtype, 0));
        }
        for (int i = 0; i < nbuf; i++)
            LK_TRY(lk_comm_broadcast(s->comm, buffers[i]->data, (size_t)buffers[i]->numel, buffers[i]->dtype, 0));
    }
    if (!s->flat_grad) {
        float *unused;
        LK_TRY(lk_strategy_grad_buffer(s, total, &unused));
    }
    if (s->kind == STRAT_DDP && s->cfg.comm_dtype != LK_F32 && !s->wire) {
        void *mem;
        LK_TRY(lk_comm_alloc_shared(s->comm, (size_t)(total ? total : 1) * sizeof(uint16_t), &mem));
        s->wire = mem;
    }
    s->slots = lk_calloc((size_t)(n ? n : 1), sizeof *s->slots);
    s->buckets = lk_calloc((size_t)(n ? n : 1), sizeof *s->buckets);
    if (!s->slots || !s->buckets) return LK_STATUS_OUT_OF_MEMORY;
    /* Gradients are packed in registration order (as lk_params_flatten packs
     * parameters, so the optimizer sees one flat range); buckets are cut
     * walking backwards — the order backward produces gradients — so each
     * bucket is one contiguous range. */
    int64_t cap = (int64_t)(s->cfg.bucket_cap_mb * 1024 * 1024 / sizeof(float));
    if (cap < 1) cap = 1;
    int64_t off = total;
    s->nbuckets = 0;
    for (int i = n - 1; i >= 0; i--) {
        lk_tensor *p = params[i];
        off -= p->numel;
        if (s->nbuckets == 0 || s->buckets[s->nbuckets - 1].count >= cap) s->buckets[s->nbuckets++] = (bucket){0};
        bucket *b = &s->buckets[s->nbuckets - 1];
        float *want = s->flat_grad + off;
        if (!p->grad || p->grad->data != (void *)want || !lk_tensor_is_contiguous(p->grad)) {
            lk_tensor *g = lk_tensor_wrap(LK_F32, p->ndim, p->shape, want);
            if (!g) return lk_last_status();
            if (p->grad) lk_tensor_copy(g, p->grad);
            lk_tensor_release(p->grad);
            p->grad = g;
        }
        b->offset = off;
        b->count += p->numel;
        b->nparams++;
        s->slots[i] = (param_slot){s, s->nbuckets - 1, false};
        if (s->kind == STRAT_DDP) lk_tensor_set_grad_hook(p, on_grad_ready, &s->slots[i]);
    }
    s->stats.buckets = s->nbuckets;
    return LK_STATUS_OK;
}

lk_status lk_strategy_shard_optimizer(lk_strategy *s, lk_optimizer *o) {
    if (!s->common_params) return LK_STATUS_OK;
    if (s->sharded) return lk_error(LK_STATUS_INVALID_USAGE, "strategy: an optimizer is already sharded over the shared parameters");
    int64_t nstate = lk__optimizer_state_floats(o);
    if (nstate < 0)
        return lk_error(LK_STATUS_UNSUPPORTED, "ddp with shared parameters updates one parameter group (this optimizer has %d); "
                        "set shared_params false", lk_optimizer_num_groups(o));
    /* Rank r updates elements [lo, hi): a W-th each, cut at multiples of 16
     * floats (64 bytes) so no two ranks write one cache line. */
    int64_t n = s->flat_numel, W = s->world, r = s->rank;
    int64_t lo = n * r / W / 16 * 16, hi = r == W - 1 ? n : n * (r + 1) / W / 16 * 16;
    if (nstate > 0) {
        void *mem;
        bool owner;
        LK_TRY(lk_comm_alloc_common(s->comm, (size_t)nstate * sizeof(float), &mem, &owner));
        s->common_state = mem;
    }
    LK_TRY(lk__optimizer_shard(o, lo, hi, s->common_state, s->common_owner));
    LK_TRY(lk_comm_barrier(s->comm)); /* rank 0's state is in */
    s->sharded = true;
    return LK_STATUS_OK;
}

lk_status lk_strategy_after_step(lk_strategy *s) {
    if (!s->sharded) return LK_STATUS_OK;
    double t0 = lk_time_now(), w0 = lk_comm_arrival_wait_s(s->comm);
    lk_status st = lk_comm_barrier(s->comm);
    double straggler = lk_comm_arrival_wait_s(s->comm) - w0, dt = lk_time_now() - t0;
    s->stats.comm_exposed_s += dt;
    s->stats.comm_straggler_s += straggler;
    s->stats.step_sync_last_s = dt;
    s->stats.step_straggler_last_s = straggler;
    return st;
}

bool lk_strategy_shares_params(const lk_strategy *s) { return s->common_params != NULL; }

lk_status lk_strategy_before_forward(lk_strategy *s) {
    if (s->kind != STRAT_DDP || !s->cfg.broadcast_buffers) return LK_STATUS_OK;
    for (int i = 0; i < s->nbuffers; i++)
        LK_TRY(lk_comm_broadcast(s->comm, s->buffers[i]->data, (size_t)s->buffers[i]->numel, s->buffers[i]->dtype, 0));
    return LK_STATUS_OK;
}

void lk_strategy_begin_backward(lk_strategy *s, bool sync) {
    s->sync = sync;
    for (int b = 0; b < s->nbuckets; b++) s->buckets[b].ready = 0;
    for (int i = 0; i < s->nparams; i++) s->slots[i].got_grad = false;
    s->next_launch = 0;
}

lk_status lk_strategy_finish_backward(lk_strategy *s) {
    if (s->kind != STRAT_DDP || !s->sync) return LK_STATUS_OK;
    if (s->common_params && !s->sharded) /* every rank would update all of one copy */
        return lk_error(LK_STATUS_INVALID_USAGE, "ddp: the parameters are shared (lk_strategy_param_buffer) but no optimizer "
                        "is sharded over them: call lk_strategy_shard_optimizer before the first step");
    if (s->cfg.report_unused) {
        for (int i = 0; i < s->nparams; i++)
            if (!s->slots[i].got_grad) {
                wait_all(s);
                return lk_error(LK_STATUS_INVALID_USAGE,
                                "ddp: parameter '%s' received no gradient in this step (it took no part in the loss); "
                                "set report_unused false to reduce a zero gradient for it instead",
                                s->names ? s->names[i] : "?");
            }
    }
    /* Parameters that got no gradient leave their buckets incomplete: the
     * zero (or accumulated) gradient is reduced like any other, in order. */
    for (int b = s->next_launch; b < s->nbuckets; b++) s->buckets[b].ready = s->buckets[b].nparams;
    launch_ready(s);
    double t0 = lk_time_now();
    wait_all(s);
    double w0 = lk_comm_arrival_wait_s(s->comm); /* async buckets waited on another thread, overlapped */
    for (; s->next_launch < s->nbuckets && !s->async_err; s->next_launch++) { /* the last bucket, inline */
        double b0 = s->bucket_fn ? lk_time_now() : 0;
        s->async_err = reduce_bucket(s, &s->buckets[s->next_launch], false);
        if (s->bucket_fn && !s->async_err)
            s->bucket_fn(s->bucket_ctx, s->next_launch, bucket_bytes(s, &s->buckets[s->next_launch]), b0, lk_time_now(),
                         false);
    }
    double straggler = lk_comm_arrival_wait_s(s->comm) - w0;
    s->stats.comm_straggler_s += straggler;
    s->stats.comm_straggler_last_s = straggler;
    if (s->wire && !s->async_err) /* widen the averages back into the gradients */
        lk_half_to_f32_n(s->cfg.comm_dtype, s->flat_grad, s->wire, (size_t)s->flat_numel);
    double dt = lk_time_now() - t0;
    s->stats.comm_exposed_s += dt;
    s->stats.comm_wait_last_s = dt;
    lk_status st = s->async_err;
    s->async_err = LK_STATUS_OK;
    if (st) return lk_comm_error(s->comm) ? lk_last_status() : st;
    return LK_STATUS_OK;
}

void lk_strategy_zero_grad(lk_strategy *s) {
    if (s->flat_grad) memset(s->flat_grad, 0, (size_t)s->flat_numel * sizeof(float));
}

lk_status lk_strategy_reduce(lk_strategy *s, double *vals, int n, lk_reduce_op op) {
    if (s->world == 1 || n == 0) return LK_STATUS_OK;
    return lk_comm_all_reduce(s->comm, vals, (size_t)n, LK_F64, op);
}

lk_status lk_strategy_broadcast(lk_strategy *s, void *buf, size_t count, lk_dtype dt, int root) {
    if (s->world == 1) return LK_STATUS_OK;
    return lk_comm_broadcast(s->comm, buf, count, dt, root);
}

lk_status lk_strategy_barrier(lk_strategy *s) { return s->world == 1 ? LK_STATUS_OK : lk_comm_barrier(s->comm); }

const char *lk_strategy_name(const lk_strategy *s) { return s->kind == STRAT_DDP ? "ddp" : "single"; }
int lk_strategy_rank(const lk_strategy *s) { return s->rank; }
int lk_strategy_world_size(const lk_strategy *s) { return s->world; }
bool lk_strategy_is_global_zero(const lk_strategy *s) { return s->rank == 0; }
lk_strategy_stats lk_strategy_get_stats(const lk_strategy *s) { return s->stats; }

/* ---- uneven inputs ------------------------------------------------------------- */

lk_status lk_strategy_join_step(lk_strategy *s, bool has_data, bool *all_done) {
    int32_t active = has_data ? 1 : 0;
    if (has_data) s->join_steps++;
    if (s->world > 1) LK_TRY(lk_comm_all_reduce(s->comm, &active, 1, LK_I32, LK_REDUCE_SUM));
    *all_done = active == 0;
    return LK_STATUS_OK;
}

lk_status lk_strategy_join(lk_strategy *s) {
    if (s->kind != STRAT_DDP) return LK_STATUS_OK;
    if (s->sharded) /* a joined rank takes no optimizer step, so its shard would go stale */
        return lk_error(LK_STATUS_UNSUPPORTED, "ddp: uneven inputs (join) need replicated parameters; set shared_params false");
    for (;;) {
        bool done;
        LK_TRY(lk_strategy_join_step(s, false, &done));
        if (done) break;
        /* Shadow one synced step of the ranks that still have data: the same
         * bucket all-reduces, in the same order, with zero gradients. */
        lk_strategy_zero_grad(s);
        lk_strategy_begin_backward(s, true);
        LK_TRY(lk_strategy_finish_backward(s));
    }
    /* Ranks that joined early stopped stepping: as PyTorch does, the replicas
     * end identical by taking the parameters of the rank that ran longest. */
    int64_t key = s->join_steps * s->world + s->rank;
    LK_TRY(lk_comm_all_reduce(s->comm, &key, 1, LK_I64, LK_REDUCE_MAX));
    int root = (int)(key % s->world);
    for (int i = 0; i < s->nparams; i++)
        LK_TRY(lk_comm_broadcast(s->comm, s->params[i]->data, (size_t)s->params[i]->numel, LK_F32, root));
    for (int i = 0; i < s->nbuffers; i++)
        LK_TRY(lk_comm_broadcast(s->comm, s->buffers[i]->data, (size_t)s->buffers[i]->numel, s->buffers[i]->dtype, root));
    s->join_steps = 0;
    return LK_STATUS_OK;
}

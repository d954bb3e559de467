/* The `ddp` strategy: one process per device over an lk_comm. Every
 * gradient lives in one flat buffer inside the communicator's shared
 * memory, in registration order, cut into buckets of about bucket_cap_mb
 * walking backwards (the order backward produces gradients); a parameter's
 * grad-ready hook counts its bucket down, and buckets are all-reduced
 * (average) in index order the moment they are complete — while backward
 * continues — so that every rank issues the same collectives in the same
 * order. The last bucket is reduced on the calling thread in
 * finish_backward (see launch_ready). Also here: gradients that travel
 * compressed (comm_dtype bf16/f16, PyTorch's compress hooks) or, for 16-bit
 * parameters, widened to f32 for the average; shared
 * parameters with the optimizer sharded over them (where the ranks share
 * memory), and uneven inputs (join).
 *
 * On a device the host cannot read (lk_strategy_config.device), the flat
 * gradient buffer is device memory. A communicator that takes device memory
 * (nccl: lk_comm_reads_device) averages the buckets there, in place, and
 * broadcasts the parameters from device memory; when gradients travel in
 * another dtype, the wire buffer is device memory too and each bucket is
 * converted into it (and the averages back) by the backend's cast, which
 * rounds as the host conversion does. One that reads host memory
 * (shm, mpi) works on a host staging copy in its shared memory instead:
 * each bucket is copied out when it is complete (and widened or compressed
 * there into the wire buffer when gradients travel in another dtype),
 * averaged, and the whole averaged buffer is copied back once the last
 * bucket is done; parameters and buffers are broadcast through host copies
 * too. No shared parameters there (each rank keeps its replica on its
 * device). */
#include <string.h>

/* The sharded optimizer needs what lk_optimizer does not publish: the size
 * of its state and a restriction of its update to one range
 * (lk__optimizer_state_floats, lk__optimizer_shard). */
#include "optim/optim_impl.h"
/* Shared parameters are given back their own storage on free
 * (lk__tensor_own_storage): no public call moves a view's storage. */
#include "tensor/tensor_impl.h"
#include "strategy/strategy_impl.h"

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

typedef struct ddp {
    void *wire; /* comm_dtype != param_dtype: the buckets as they travel (shared memory, or device memory below) */
    size_t wire_bytes;
    bool wire_on_device; /* a device-reading communicator: the wire buffer is on cfg.device, converted there */
    void *stage; /* the gradients on a device: their host copy the communicator reduces (shared memory) */
    bucket *buckets;
    int nbuckets, next_launch;
    param_slot *slots;
    lk_status async_err;
    /* Shared parameters (one node): one copy for all ranks, in rank 0's
     * part of the segment; each rank updates its shard of it. */
    void *common_params; /* flat_numel elements of param_dtype */
    float *common_state;
    bool common_owner, sharded;
} ddp;

static ddp *me(const lk_strategy *s) { return s->self; }

static lk_status ddp_create(lk_strategy *s) {
    if (!s->comm) return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy 'ddp' needs a communicator");
    if (!(s->self = lk_calloc(1, sizeof(ddp)))) return LK_STATUS_OUT_OF_MEMORY;
    return LK_STATUS_OK;
}

static size_t bucket_bytes(const lk_strategy *s, const bucket *b) {
    return (size_t)b->count * lk_dtype_size(s->ddp.comm_dtype);
}

static void wait_all(lk_strategy *s) {
    ddp *d = me(s);
    for (int b = 0; b < d->nbuckets; b++) {
        if (d->buckets[b].work) {
            lk_status st = lk_work_wait(d->buckets[b].work);
            if (st && !d->async_err) d->async_err = st;
            if (!st && s->bucket_fn) {
                double t0, t1;
                lk_work_times(d->buckets[b].work, &t0, &t1);
                s->bucket_fn(s->bucket_ctx, b, bucket_bytes(s, &d->buckets[b]), t0, t1, true);
            }
            lk_work_free(d->buckets[b].work);
            d->buckets[b].work = NULL;
        }
    }
}

static void ddp_free(lk_strategy *s) {
    ddp *d = me(s);
    if (!d) return;
    wait_all(s);
    for (int i = 0; i < s->nparams && d->common_params; i++)
        lk__tensor_own_storage(s->params[i]); /* the shared copy goes away too */
    if (d->wire && d->wire_on_device) lk_device_free(s->cfg.device, d->wire, d->wire_bytes);
    else if (d->wire) lk_comm_free_shared(s->comm, d->wire);
    if (d->stage) lk_comm_free_shared(s->comm, d->stage);
    if (d->common_owner) { /* only the heap's block list changes: the bytes stay mapped until lk_comm_free, so a
                              peer still copying its parameters out (above) reads them intact */
        lk_comm_free_shared(s->comm, d->common_params);
        lk_comm_free_shared(s->comm, d->common_state);
    }
    lk_free(d->buckets);
    lk_free(d->slots);
    lk_free(d);
    s->self = NULL;
}

static void *elem(void *base, lk_dtype dt, int64_t i) { return (char *)base + i * (int64_t)lk_dtype_size(dt); }

static bool on_device(const lk_strategy *s) { return !lk_device_is_host(s->cfg.device); }
/* The gradients are on a device the communicator cannot read: it reduces a host copy. */
static bool staged(const lk_strategy *s) { return on_device(s) && !lk_comm_reads_device(s->comm); }

/* A broadcast of t from root: in place where the communicator can read t,
 * through a host copy otherwise. */
static lk_status bcast(lk_strategy *s, lk_tensor *t, int root) {
    if (lk_device_is_host(t->device) || lk_comm_reads_device(s->comm)) return lk_comm_broadcast(s->comm, t->data, (size_t)t->numel, t->dtype, root);
    lk_tensor *h = lk_tensor_to(t, LK_DEVICE_CPU);
    if (!h) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
    lk_status st = lk_comm_broadcast(s->comm, h->data, (size_t)h->numel, h->dtype, root);
    if (!st) st = lk_tensor_copy(t, h);
    lk_tensor_release(h);
    return st;
}

/* n elements from src (dtype sd) into dst (dtype dd): one of the two is f32
 * (lk_strategy_create refuses the other pairs). */
static void convert(lk_dtype dd, void *dst, lk_dtype sd, const void *src, size_t n) {
    if (sd == LK_F32) lk_f32_to_half_n(dd, dst, src, n);
    else lk_half_to_f32_n(sd, dst, src, n);
}

/* The same conversion of n elements on the training device, for a
 * device-reading communicator: the backend's cast (an LK_OP_COPY with two
 * dtypes, over 1-d views of the two buffers). It gives convert()'s bits:
 * the CPU's cast of a contiguous f32 <-> bf16/f16 run is
 * lk_f32_to_half_n / lk_half_to_f32_n itself, and the cuda cast
 * (common.cuh's lk_cu_f32_to_bf16 / _f16) rounds to nearest even as they
 * do (gpu_ops_emu's copy_cast rows check it against the CPU bit for bit). */
static lk_status convert_on_device(lk_strategy *s, lk_dtype dd, void *dst, lk_dtype sd, const void *src, size_t n) {
    int64_t shape[1] = {(int64_t)n};
    lk_tensor *t = lk__tensor_wrap_on(s->cfg.device, dd, 1, shape, dst);
    lk_tensor *f = t ? lk__tensor_wrap_on(s->cfg.device, sd, 1, shape, (void *)src) : NULL;
    lk_status st = f ? lk_tensor_copy(t, f) : lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
    lk_tensor_release(f);
    lk_tensor_release(t);
    return st;
}

/* Starts bucket b's average: in place in the gradient buffer, or converted
 * into the wire buffer first when gradients travel in another dtype
 * (compressed f32 gradients; 16-bit gradients averaged in f32). */
static lk_status reduce_bucket(lk_strategy *s, bucket *b, bool async) {
    ddp *d = me(s);
    void *buf = elem(s->flat_grad, s->cfg.param_dtype, b->offset);
    if (d->stage) { /* the bucket out of the device, into the communicator's memory */
        buf = elem(d->stage, s->cfg.param_dtype, b->offset);
        LK_TRY(lk_device_copy(LK_DEVICE_CPU, buf, s->cfg.device, elem(s->flat_grad, s->cfg.param_dtype, b->offset),
                              (size_t)b->count * lk_dtype_size(s->cfg.param_dtype)));
    }
    if (d->wire) { /* from the host copy of the gradients (the buffer itself, or the stage), or on the device */
        void *src = buf;
        buf = elem(d->wire, s->ddp.comm_dtype, b->offset);
        if (d->wire_on_device)
            LK_TRY(convert_on_device(s, s->ddp.comm_dtype, buf, s->cfg.param_dtype, src, (size_t)b->count));
        else convert(s->ddp.comm_dtype, buf, s->cfg.param_dtype, src, (size_t)b->count);
    }
    s->stats.allreduce_calls++;
    s->stats.bytes_reduced += bucket_bytes(s, b);
    if (async) return lk_comm_all_reduce_async(s->comm, buf, (size_t)b->count, s->ddp.comm_dtype, LK_REDUCE_AVG, &b->work);
    return lk_comm_all_reduce(s->comm, buf, (size_t)b->count, s->ddp.comm_dtype, LK_REDUCE_AVG);
}

/* Starts the complete buckets in index order, on the communication thread.
 * The last bucket is left to finish_backward: it completes when backward
 * does, nothing remains to overlap it with, and reducing it on the main
 * thread saves two thread hand-offs and keeps the communication thread from
 * competing with this rank's own compute for its core. */
static void launch_ready(lk_strategy *s) {
    ddp *d = me(s);
    while (d->next_launch < d->nbuckets - 1) {
        bucket *b = &d->buckets[d->next_launch];
        if (b->ready < b->nparams) return;
        lk_status st = reduce_bucket(s, b, true);
        if (st && !d->async_err) d->async_err = st;
        d->next_launch++;
    }
}

static void on_grad_ready(lk_tensor *p, void *ctx) {
    (void)p;
    param_slot *slot = ctx;
    lk_strategy *s = slot->s;
    slot->got_grad = true;
    if (!s->sync) return;
    me(s)->buckets[slot->bucket].ready++;
    launch_ready(s);
}

static lk_status ddp_alloc_grads(lk_strategy *s, size_t bytes, void **mem, bool *shared) {
    *shared = !on_device(s);
    if (on_device(s)) return lk_device_alloc(s->cfg.device, bytes, mem); /* staged or not: ddp_setup */
    return lk_comm_alloc_shared(s->comm, bytes, mem);
}

static lk_status ddp_param_buffer(lk_strategy *s, int64_t numel, void **buf, bool *copy_values) {
    ddp *d = me(s);
    /* one copy only where every rank can map the same bytes (shm, one node) */
    if (!s->ddp.shared_params || s->world < 2 || !lk_comm_shares_memory(s->comm) || on_device(s)) return LK_STATUS_OK;
    if (d->common_params) return lk_error(LK_STATUS_INVALID_USAGE, "strategy: the parameter buffer is already allocated");
    void *mem;
    LK_TRY(lk_comm_alloc_common(s->comm, (size_t)(numel ? numel : 1) * lk_dtype_size(s->cfg.param_dtype), &mem,
                                &d->common_owner));
    d->common_params = mem;
    *buf = mem;
    *copy_values = d->common_owner;
    return LK_STATUS_OK;
}

static lk_status ddp_setup(lk_strategy *s) {
    ddp *d = me(s);
    lk_tensor *const *params = s->params;
    const char *const *names = s->names;
    int n = s->nparams;
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += params[i]->numel;
    if (s->params_common && !d->common_params) LK_TRY(lk_comm_barrier(s->comm)); /* zero.c's: as below */
    if (d->common_params) { /* rank 0 wrote the values: they are everyone's once it is here */
        int64_t off = 0;
        for (int i = 0; i < n; i++) {
            if (params[i]->data != elem(d->common_params, s->cfg.param_dtype, off) || !lk_tensor_is_contiguous(params[i]))
                return lk_error(LK_STATUS_INVALID_USAGE, "ddp: parameter '%s' is not where the shared parameter buffer "
                                "puts it (flatten the parameters into lk_strategy_param_buffer's memory, in order)",
                                names ? names[i] : "?");
            off += params[i]->numel;
        }
        LK_TRY(lk_comm_barrier(s->comm));
    }
    /* Replicas start identical: rank 0's parameters and buffers win. */
    for (int i = 0; i < n && !d->common_params && !s->params_common; i++) {
        lk_tensor *p = params[i];
        if (!lk_tensor_is_contiguous(p))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "ddp: parameter '%s' is not contiguous", names ? names[i] : "?");
        LK_TRY(bcast(s, p, 0));
    }
    for (int i = 0; i < s->nbuffers; i++) LK_TRY(bcast(s, s->buffers[i], 0));
    LK_TRY(lk__strategy_alloc_flat(s, total));
    if (staged(s) && !d->stage) {
        void *mem;
        LK_TRY(lk_comm_alloc_shared(s->comm, (size_t)(total ? total : 1) * lk_dtype_size(s->cfg.param_dtype), &mem));
        d->stage = mem;
    }
    if (s->ddp.comm_dtype != s->cfg.param_dtype && !d->wire) {
        void *mem;
        d->wire_bytes = (size_t)(total ? total : 1) * lk_dtype_size(s->ddp.comm_dtype);
        /* where the communicator reads: its memory, or next to the device's gradients */
        d->wire_on_device = on_device(s) && !staged(s);
        if (d->wire_on_device) LK_TRY(lk_device_alloc(s->cfg.device, d->wire_bytes, &mem));
        else LK_TRY(lk_comm_alloc_shared(s->comm, d->wire_bytes, &mem));
        d->wire = mem;
    }
    d->slots = lk_calloc((size_t)(n ? n : 1), sizeof *d->slots);
    d->buckets = lk_calloc((size_t)(n ? n : 1), sizeof *d->buckets);
    if (!d->slots || !d->buckets) return LK_STATUS_OUT_OF_MEMORY;
    LK_TRY(lk__strategy_grads_to_flat(s));
    /* Gradients are packed in registration order (as lk_params_flatten packs
     * parameters, so the optimizer sees one flat range); buckets are cut
     * walking backwards — the order backward produces gradients — so each
     * bucket is one contiguous range. */
    int64_t cap = (int64_t)(s->ddp.bucket_cap_mb * 1024 * 1024 / (double)lk_dtype_size(s->cfg.param_dtype));
    if (cap < 1) cap = 1;
    int64_t off = total;
    d->nbuckets = 0;
    for (int i = n - 1; i >= 0; i--) {
        lk_tensor *p = params[i];
        off -= p->numel;
        if (d->nbuckets == 0 || d->buckets[d->nbuckets - 1].count >= cap) d->buckets[d->nbuckets++] = (bucket){0};
        bucket *b = &d->buckets[d->nbuckets - 1];
        b->offset = off;
        b->count += p->numel;
        b->nparams++;
        d->slots[i] = (param_slot){s, d->nbuckets - 1, false};
        lk_tensor_set_grad_hook(p, on_grad_ready, &d->slots[i]);
    }
    s->stats.buckets = d->nbuckets;
    return LK_STATUS_OK;
}

static lk_status ddp_shard_optimizer(lk_strategy *s, lk_optimizer *o) {
    ddp *d = me(s);
    if (!d->common_params) return LK_STATUS_OK;
    if (d->sharded) return lk_error(LK_STATUS_INVALID_USAGE, "strategy: an optimizer is already sharded over the shared parameters");
    int64_t nstate = lk__optimizer_state_floats(o);
    if (nstate < 0)
        return lk_error(LK_STATUS_UNSUPPORTED, "ddp with shared parameters updates one parameter group (this optimizer has %d); "
                        "set shared_params false", lk_optimizer_num_groups(o));
    /* Rank r updates elements [lo, hi): a W-th each, cut at multiples of 64
     * bytes of parameters (16 f32, 32 bf16) so no two ranks write one cache
     * line. */
    int64_t n = s->flat_numel, W = s->world, r = s->rank, a = 64 / (int64_t)lk_dtype_size(s->cfg.param_dtype);
    int64_t lo = n * r / W / a * a, hi = r == W - 1 ? n : n * (r + 1) / W / a * a;
    if (nstate > 0) {
        void *mem;
        bool owner;
        LK_TRY(lk_comm_alloc_common(s->comm, (size_t)nstate * sizeof(float), &mem, &owner));
        d->common_state = mem;
    }
    LK_TRY(lk__optimizer_shard(o, lo, hi, d->common_state, d->common_owner));
    LK_TRY(lk_comm_barrier(s->comm)); /* rank 0's state is in */
    d->sharded = true;
    return LK_STATUS_OK;
}

static lk_status ddp_after_step(lk_strategy *s) {
    if (!me(s)->sharded) return LK_STATUS_OK;
    double t0 = lk_time_now(), w0 = lk_comm_arrival_wait_s(s->comm);
    lk_status st = lk_comm_barrier(s->comm);
    double straggler = lk_comm_arrival_wait_s(s->comm) - w0, dt = lk_time_now() - t0;
    s->stats.comm_exposed_s += dt;
    s->stats.comm_straggler_s += straggler;
    s->stats.step_sync_last_s = dt;
    s->stats.step_straggler_last_s = straggler;
    return st;
}

static bool ddp_shares_params(const lk_strategy *s) { return me(s)->common_params != NULL; }

static lk_status ddp_before_forward(lk_strategy *s) {
    if (!s->ddp.broadcast_buffers) return LK_STATUS_OK;
    for (int i = 0; i < s->nbuffers; i++) LK_TRY(bcast(s, s->buffers[i], 0));
    return LK_STATUS_OK;
}

static void ddp_begin_backward(lk_strategy *s, bool sync) {
    (void)sync;
    ddp *d = me(s);
    for (int b = 0; b < d->nbuckets; b++) d->buckets[b].ready = 0;
    for (int i = 0; i < s->nparams && d->slots; i++) d->slots[i].got_grad = false;
    d->next_launch = 0;
}

static lk_status ddp_finish_backward(lk_strategy *s) {
    ddp *d = me(s);
    if (!s->sync) return LK_STATUS_OK;
    if (d->common_params && !d->sharded) /* every rank would update all of one copy */
        return lk_error(LK_STATUS_INVALID_USAGE, "ddp: the parameters are shared (lk_strategy_param_buffer) but no optimizer "
                        "is sharded over them: call lk_strategy_shard_optimizer before the first step");
    if (s->ddp.report_unused) {
        for (int i = 0; i < s->nparams; i++)
            if (!d->slots[i].got_grad) {
                wait_all(s);
                return lk_error(LK_STATUS_INVALID_USAGE,
                                "ddp: parameter '%s' received no gradient in this step (it took no part in the loss); "
                                "set report_unused false to reduce a zero gradient for it instead",
                                s->names ? s->names[i] : "?");
            }
    }
    /* Parameters that got no gradient leave their buckets incomplete: the
     * zero (or accumulated) gradient is reduced like any other, in order. */
    for (int b = d->next_launch; b < d->nbuckets; b++) d->buckets[b].ready = d->buckets[b].nparams;
    launch_ready(s);
    double t0 = lk_time_now();
    wait_all(s);
    double w0 = lk_comm_arrival_wait_s(s->comm); /* async buckets waited on another thread, overlapped */
    for (; d->next_launch < d->nbuckets && !d->async_err; d->next_launch++) { /* the last bucket, inline */
        double b0 = s->bucket_fn ? lk_time_now() : 0;
        d->async_err = reduce_bucket(s, &d->buckets[d->next_launch], false);
        if (s->bucket_fn && !d->async_err)
            s->bucket_fn(s->bucket_ctx, d->next_launch, bucket_bytes(s, &d->buckets[d->next_launch]), b0, lk_time_now(),
                         false);
    }
    double straggler = lk_comm_arrival_wait_s(s->comm) - w0;
    s->stats.comm_straggler_s += straggler;
    s->stats.comm_straggler_last_s = straggler;
    if (d->wire && d->wire_on_device && !d->async_err) /* the averages back into the gradients, on the device */
        d->async_err = convert_on_device(s, s->cfg.param_dtype, s->flat_grad, s->ddp.comm_dtype, d->wire,
                                         (size_t)s->flat_numel);
    else if (d->wire && !d->async_err) /* widen the averages back into the gradients (or their host stage) */
        convert(s->cfg.param_dtype, d->stage ? d->stage : s->flat_grad, s->ddp.comm_dtype, d->wire,
                (size_t)s->flat_numel);
    if (d->stage && !d->async_err) /* the averages back onto the device, in one copy */
        d->async_err = lk_device_copy(s->cfg.device, s->flat_grad, LK_DEVICE_CPU, d->stage,
                                      (size_t)s->flat_numel * lk_dtype_size(s->cfg.param_dtype));
    double dt = lk_time_now() - t0;
    s->stats.comm_exposed_s += dt;
    s->stats.comm_wait_last_s = dt;
    lk_status st = d->async_err;
    d->async_err = LK_STATUS_OK;
    if (st) return lk_comm_error(s->comm) ? lk_last_status() : st;
    return LK_STATUS_OK;
}

static lk_status ddp_join(lk_strategy *s) {
    if (me(s)->sharded) /* a joined rank takes no optimizer step, so its shard would go stale */
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
    for (int i = 0; i < s->nparams; i++) LK_TRY(bcast(s, s->params[i], root));
    for (int i = 0; i < s->nbuffers; i++) LK_TRY(bcast(s, s->buffers[i], root));
    s->join_steps = 0;
    return LK_STATUS_OK;
}

const lk_strategy_vt lk__strategy_ddp = {
    .name = "ddp",
    .create = ddp_create,
    .free = ddp_free,
    .alloc_grads = ddp_alloc_grads,
    .param_buffer = ddp_param_buffer,
    .setup = ddp_setup,
    .training_step = lk__strategy_local_step,
    .before_forward = ddp_before_forward,
    .begin_backward = ddp_begin_backward,
    .finish_backward = ddp_finish_backward,
    .after_step = ddp_after_step,
    .shard_optimizer = ddp_shard_optimizer,
    .shares_params = ddp_shares_params,
    .join = ddp_join,
};

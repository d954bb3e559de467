/* ZeRO stage 1 (`deepspeed_stage_1`; Lightning's DeepSpeedStrategy with
 * stage 1, lockstep's own implementation — no DeepSpeed inside). Stage 2
 * and 3 are fsdp.c's (gradients reduce-scattered unit by unit during the
 * backward). Parameters stay replicated; the flat parameter range is cut
 * into N equal chunks of ceil(numel / N) elements rounded up to a cache
 * line (the last ones padded with elements nobody reads, never refused),
 * and rank r's optimizer updates only chunk r. After the step the updated chunks are all-gathered
 * into every replica, in place in a padded parameter buffer.
 *
 * The gradients take ddp's path unchanged (bucketed all-reduce during the
 * backward, compress hooks, accumulation inside no_sync): the averaged
 * gradients are whole on every rank, so clipping and the loss scaler's
 * check see what ddp sees and the result is ddp's bit for bit.
 *
 * Built over ddp's vtable (s->self is ddp's state); this strategy's own state
 * is s->ext. The optimizer keeps the state of its chunk only (arrays x
 * chunk floats, lk__optimizer_state_layout): ZeRO's 12 bytes per parameter
 * of Adam's f32 master state divided by N. Around a checkpoint the state is
 * made whole: gathered from every rank before a save (state_dict, a
 * collective), or loaded whole by every rank (state_dict_loaded makes room);
 * the next synced backward cuts it back to the chunk before the optimizer
 * steps. Resume at the same world size is exact.
 *
 * On one node over shm (`trainer.ddp_shared_params`, default true, as ddp's
 * shared parameters) the padded parameter buffer is one copy every rank
 * maps (lk_comm_alloc_common): each rank's optimizer writes its chunk in
 * place and the all-gather after the step is a barrier. The gradient
 * all-reduce orders it as ddp's shared mode: no rank updates before every
 * rank's backward is done with the parameters. The bits are the
 * replicas' (an element-wise update of the same values). Across nodes
 * (mpi), with shared_params false, or on a device, each rank keeps its
 * replica and the chunks are all-gathered.
 *
 * On a device (GPUs) the padded parameters, the chunk's state and the whole
 * copy around a checkpoint are that device's memory, where the optimizer
 * runs; ddp's path carries the gradients as on the CPU. A communicator that
 * reads device memory (nccl) all-gathers the chunks in place; one that reads
 * host memory (shm, mpi) gathers a host copy (`stage`), copied back in one
 * piece. A sharded checkpoint set is host-only for now (refused, named). */
#include <string.h>


#include "optim/optim_impl.h"
#include "tensor/tensor_impl.h"
#include "strategy/strategy_impl.h"

typedef struct zero {
    int64_t numel, chunk, lo, hi; /* flat elements, per-rank chunk, this rank's [lo, hi) */
    void *params;                 /* chunk * world elements of param_dtype: the replicas' flat parameters */
    int64_t arrays;               /* the optimizer's state arrays (Adam: 2) */
    float *chunk_state;           /* arrays x chunk floats: the state of this rank's chunk, all it keeps */
    float *whole_state;           /* arrays x numel floats, around a checkpoint only (NULL otherwise) */
    lk_optimizer *optim;          /* borrowed: the one sharded over the chunks */
    void *stage;                  /* on a device the communicator cannot read: chunk x world elements of host
                                   * memory the chunks are gathered in (the widest dtype gathered: f32 or param) */
    size_t stage_bytes;
    bool want_common; /* trainer.ddp_shared_params as given (ddp's own copy of it is turned off) */
    bool common;      /* params is the node's one shared copy: the chunks are written in place, not gathered */
    bool common_owner; /* this rank allocated it (rank 0): it frees it */
} zero;

static zero *z_of(const lk_strategy *s) { return s->ext; }
static bool on_device(const lk_strategy *s) { return !lk_device_is_host(s->cfg.device); }

/* Memory where the parameters live (zeroed): the host's (aligned for the
 * parameter buffer, lk_calloc's for state), or the device's. `what` labels
 * a host allocation a memory limit refuses. */
static lk_status mem_alloc(lk_strategy *s, size_t bytes, const char *what, bool aligned, void **out) {
    *out = NULL;
    if (on_device(s)) {
        LK_TRY(lk_device_alloc(s->cfg.device, bytes, out));
        lk_status st = lk_device_memset(s->cfg.device, *out, 0, bytes);
        if (st) lk_device_free(s->cfg.device, *out, bytes), *out = NULL;
        return st;
    }
    const char *was = what ? lk__alloc_what(what) : NULL;
    *out = aligned ? lk_aligned_alloc(LK_ALIGN, bytes) : lk_calloc(1, bytes);
    if (what) lk__alloc_what(was);
    if (!*out) return LK_STATUS_OUT_OF_MEMORY;
    if (aligned) memset(*out, 0, bytes);
    return LK_STATUS_OK;
}

static void mem_free(lk_strategy *s, void *p, size_t bytes, bool aligned) {
    if (on_device(s)) lk_device_free(s->cfg.device, p, bytes);
    else if (aligned) lk_aligned_free(p);
    else lk_free(p);
}

/* A copy within the parameters' memory (host or device). */
static lk_status mem_copy(lk_strategy *s, void *dst, const void *src, size_t bytes) {
    if (!on_device(s)) return memcpy(dst, src, bytes), LK_STATUS_OK;
    return lk_device_copy(s->cfg.device, dst, s->cfg.device, src, bytes);
}

static size_t state_bytes(const zero *z, int64_t per_array) { return (size_t)(z->arrays * per_array + 1) * sizeof(float); }

/* All-gathers `chunk` elements per rank in place: whole (chunk x world
 * elements in the parameters' memory) holds this rank's chunk at rank x
 * chunk and every chunk afterwards. Through the host stage where the
 * communicator cannot read the device's memory. Collective. */
static lk_status gather_chunks(lk_strategy *s, void *whole, size_t chunk, lk_dtype dt) {
    zero *z = z_of(s);
    size_t es = lk_dtype_size(dt), mine = chunk * (size_t)s->rank * es, all = chunk * (size_t)s->world * es;
    if (!on_device(s) || lk_comm_reads_device(s->comm))
        return lk_comm_all_gather(s->comm, (char *)whole + mine, whole, chunk, dt);
    if (z->stage_bytes < all) {
        lk_free(z->stage);
        z->stage_bytes = 0;
        if (!(z->stage = lk_malloc(all))) return LK_STATUS_OUT_OF_MEMORY;
        z->stage_bytes = all;
    }
    LK_TRY(lk_device_copy(LK_DEVICE_CPU, (char *)z->stage + mine, s->cfg.device, (char *)whole + mine, chunk * es));
    LK_TRY(lk_comm_all_gather(s->comm, (char *)z->stage + mine, z->stage, chunk, dt));
    return lk_device_copy(s->cfg.device, whole, LK_DEVICE_CPU, z->stage, all);
}
static size_t esz(const lk_strategy *s) { return lk_dtype_size(s->cfg.param_dtype); }
static void *at(void *base, const lk_strategy *s, int64_t i) { return (char *)base + i * (int64_t)esz(s); }

static lk_status z_create(lk_strategy *s) {
    const char *name = "deepspeed_stage_1";
    if (!s->comm) return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy '%s' needs a communicator", name);
    if (s->cfg.fsdp && s->cfg.fsdp->cpu_offload && on_device(s))
        return lk_error(LK_STATUS_UNSUPPORTED, "strategy '%s' with the optimizer offloaded to the CPU (offload_optimizer, "
                        "trainer.fsdp_cpu_offload) is not built on %s: deepspeed_stage_2 and 3 offload it", name,
                        lk_device_str(s->cfg.device, (char[32]){0}, 32));
    zero *z = lk_calloc(1, sizeof *z);
    if (!z) return LK_STATUS_OUT_OF_MEMORY;
    /* ddp's own parameter buffer and optimizer sharding stay off: this
     * strategy makes the buffer (shared or a replica) and shards itself */
    z->want_common = s->ddp.shared_params;
    s->ddp.shared_params = false;
    s->ext = z;
    lk_status st = lk__strategy_ddp.create(s);
    if (st) {
        lk_free(z);
        s->ext = NULL;
    }
    return st;
}

static void z_free(lk_strategy *s) {
    zero *z = z_of(s);
    if (z && z->params)
        for (int i = 0; i < s->nparams; i++) lk__tensor_own_storage(s->params[i]); /* the padded buffer goes */
    lk__strategy_ddp.free(s);
    if (!z) return;
    /* the shared copy: its owner frees it, as ddp_free its shared parameters */
    if (z->common && z->common_owner) lk_comm_free_shared(s->comm, z->params);
    else if (!z->common) mem_free(s, z->params, (size_t)(z->chunk * s->world) * esz(s), true);
    mem_free(s, z->chunk_state, state_bytes(z, z->chunk), false);
    mem_free(s, z->whole_state, state_bytes(z, z->numel), false);
    lk_free(z->stage);
    lk_free(z);
    s->ext = NULL;
}

/* The chunks of n elements over the world, all of one size so that every
 * rank sends and receives the same count (the last ones cover padding):
 * ceil(n / W) elements rounded up to 64 bytes (16 f32, 32 bf16),
 * as fsdp's: every rank's chunk then starts on a cache line, so no two ranks
 * write one line and each rank's update runs on aligned vectors (a chunk
 * starting mid-line made rank 1's update slower than rank 0's, and rank 0
 * waited for it at every step's barrier). */
static void cut(lk_strategy *s, int64_t n) {
    zero *z = z_of(s);
    int64_t W = s->world, line = 64 / (int64_t)esz(s);
    z->numel = n;
    z->chunk = (n + W - 1) / W;
    z->chunk = (z->chunk + line - 1) / line * line;
    if (z->chunk < 1) z->chunk = 1;
    z->lo = z->chunk * s->rank < n ? z->chunk * s->rank : n;
    z->hi = z->lo + z->chunk < n ? z->lo + z->chunk : n;
}

/* The replica's flat parameters in a buffer padded to chunk * world, so the
 * chunks are all-gathered in place. */
static lk_status z_param_buffer(lk_strategy *s, int64_t numel, void **buf, bool *copy_values) {
    zero *z = z_of(s);
    if (z->params) return lk_error(LK_STATUS_INVALID_USAGE, "strategy: the parameter buffer is already allocated");
    cut(s, numel);
    size_t bytes = (size_t)(z->chunk * s->world) * esz(s);
    if (z->want_common && s->world > 1 && lk_comm_shares_memory(s->comm) && !on_device(s)) {
        LK_TRY(lk_comm_alloc_common(s->comm, bytes, &z->params, &z->common_owner));
        z->common = s->params_common = true;
        *buf = z->params;
        *copy_values = z->common_owner; /* rank 0 writes the values; ddp's setup waits for them */
        return LK_STATUS_OK;
    }
    LK_TRY(mem_alloc(s, bytes, NULL, true, &z->params));
    *buf = z->params;
    *copy_values = true;
    return LK_STATUS_OK;
}

static lk_status z_setup(lk_strategy *s) {
    zero *z = z_of(s);
    LK_TRY(lk__strategy_ddp.setup(s));
    if (!z->params)
        return lk_error(LK_STATUS_INVALID_USAGE, "%s: the parameters are not in the strategy's parameter buffer "
                        "(wrap the net with lk_strategy_wrap)", s->vt->name);
    int64_t off = 0;
    for (int i = 0; i < s->nparams; i++) {
        if (s->params[i]->data != at(z->params, s, off))
            return lk_error(LK_STATUS_INVALID_USAGE, "%s: parameter '%s' is not where the flat parameter buffer puts it",
                            s->vt->name, s->names ? s->names[i] : "?");
        off += s->params[i]->numel;
    }
    if (z->common)
        lk_log0("%s: the %d ranks share one copy of the parameters, each updating its chunk in place (no all-gather "
                "after the step; trainer.ddp_shared_params)", s->vt->name, s->world);
    return LK_STATUS_OK;
}

/* The chunks every rank wrote are everyone's: a barrier on the node's one
 * copy, an all-gather into each replica otherwise. Collective. */
static lk_status share_chunks(lk_strategy *s) {
    zero *z = z_of(s);
    if (z->common) return lk_comm_barrier(s->comm);
    return gather_chunks(s, z->params, (size_t)z->chunk, s->cfg.param_dtype);
}

static lk_status z_shard_optimizer(lk_strategy *s, lk_optimizer *o) {
    zero *z = z_of(s);
    if (z->optim) return lk_error(LK_STATUS_INVALID_USAGE, "%s: an optimizer is already sharded", s->vt->name);
    int64_t nstate = lk__optimizer_state_floats(o);
    if (nstate < 0)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s shards one parameter group over the ranks (this optimizer has %d); "
                        "use ddp for several groups", s->vt->name, lk_optimizer_num_groups(o));
    z->arrays = z->numel ? nstate / z->numel : 0;
    /* the update restricted to the chunk, only the chunk's state kept (never
     * a whole copy: that is the memory ZeRO saves; the trainer creates the
     * optimizer without state for it, lk__optimizer_defer_state) */
    void *mem;
    LK_TRY(mem_alloc(s, state_bytes(z, z->chunk), "the optimizer state's chunk", false, &mem));
    z->chunk_state = mem;
    LK_TRY(lk__optimizer_shard_chunk(o, z->lo, z->hi, z->chunk_state, z->chunk));
    z->optim = o;
    return LK_STATUS_OK;
}

/* The optimizer back on its chunk's state after a checkpoint made it whole
 * (before the optimizer steps again). */
static lk_status to_chunk(lk_strategy *s) {
    zero *z = z_of(s);
    if (!z->whole_state) return LK_STATUS_OK;
    for (int64_t k = 0; k < z->arrays; k++)
        LK_TRY(mem_copy(s, z->chunk_state + k * z->chunk, z->whole_state + k * z->numel + z->lo,
                        (size_t)(z->hi - z->lo) * sizeof(float)));
    LK_TRY(lk__optimizer_state_layout(z->optim, z->chunk_state, z->lo, z->chunk));
    mem_free(s, z->whole_state, state_bytes(z, z->numel), false);
    z->whole_state = NULL;
    return LK_STATUS_OK;
}

/* Room for the whole state, with this rank's chunk in it (the rest zero
 * until a gather or a load fills it), and the optimizer pointed at it. */
static lk_status to_whole(lk_strategy *s) {
    zero *z = z_of(s);
    if (z->whole_state || !z->optim) return LK_STATUS_OK;
    void *mem;
    LK_TRY(mem_alloc(s, state_bytes(z, z->numel), NULL, false, &mem));
    z->whole_state = mem;
    for (int64_t k = 0; k < z->arrays; k++)
        LK_TRY(mem_copy(s, z->whole_state + k * z->numel + z->lo, z->chunk_state + k * z->chunk,
                        (size_t)(z->hi - z->lo) * sizeof(float)));
    return lk__optimizer_state_layout(z->optim, z->whole_state, 0, z->numel);
}

/* The gradients in ddp's buffer: the communicator's shared memory on one
 * node, which its all-reduce reduces in place (a private buffer cost a copy
 * in and out of the segment per bucket: 0.14 ms of a 2.4 ms mlp step). */
static lk_status z_alloc_grads(lk_strategy *s, size_t bytes, void **mem, bool *shared) {
    return lk__strategy_ddp.alloc_grads(s, bytes, mem, shared);
}

static void z_begin_backward(lk_strategy *s, bool sync) { lk__strategy_ddp.begin_backward(s, sync); }

static lk_status z_finish_backward(lk_strategy *s) {
    zero *z = z_of(s);
    if (s->sync && z->whole_state) LK_TRY(to_chunk(s)); /* the step comes: back to the chunk */
    return lk__strategy_ddp.finish_backward(s);
}

/* Every replica takes the chunks their owners just updated (after a
 * skipped step too: the chunks are then unchanged, and every rank must
 * issue the same collectives). */
static lk_status z_after_step(lk_strategy *s) {
    double t0 = lk_time_now(), w0 = lk_comm_arrival_wait_s(s->comm);
    lk_status st = share_chunks(s);
    double straggler = lk_comm_arrival_wait_s(s->comm) - w0, dt = lk_time_now() - t0;
    s->stats.comm_exposed_s += dt;
    s->stats.comm_straggler_s += straggler;
    s->stats.step_sync_last_s = dt;
    s->stats.step_straggler_last_s = straggler;
    return st;
}

/* The whole optimizer state on every rank before a checkpoint reads it
 * (each array's chunks all-gathered through a padded scratch; a state
 * already whole — a second checkpoint before the next step — is every
 * rank's same values, so no rank gathers), then the model's state dict,
 * which every replica holds whole. Collective. */
static lk_status z_state_dict(lk_strategy *s, lk_layer *net, lk_named_tensors *out) {
    zero *z = z_of(s);
    if (z->optim && !z->whole_state && z->arrays > 0) {
        size_t tmp_bytes = (size_t)(z->chunk * s->world) * sizeof(float);
        void *mem;
        LK_TRY(mem_alloc(s, tmp_bytes, NULL, true, &mem));
        float *tmp = mem;
        lk_status st = to_whole(s);
        for (int64_t k = 0; k < z->arrays && !st; k++) {
            st = mem_copy(s, tmp + z->chunk * s->rank, z->chunk_state + k * z->chunk, (size_t)z->chunk * sizeof(float));
            if (!st) st = gather_chunks(s, tmp, (size_t)z->chunk, LK_F32);
            if (!st) st = mem_copy(s, z->whole_state + k * z->numel, tmp, (size_t)z->numel * sizeof(float));
        }
        mem_free(s, tmp, tmp_bytes, true);
        LK_TRY(st);
    }
    return lk_state_dict_get(net, out);
}

/* Every rank read the whole checkpoint: the optimizer's state is loaded
 * whole next (checkpoint.c), so it gets room for it here. */
static lk_status z_state_dict_loaded(lk_strategy *s) { return to_whole(s); }

/* A sharded checkpoint's pieces: each parameter's intersection with this
 * rank's chunk [lo, hi) of the flat buffer, its values in the replica's
 * padded buffer and its optimizer state in the chunk's arrays (or in the
 * whole copy a checkpoint made, until the next synced backward). Not a
 * collective: nothing is gathered for a sharded checkpoint. */
static lk_status z_shard_pieces(lk_strategy *s, lk_shard_piece **out, int *n) {
    zero *z = z_of(s);
    if (z->arrays > LK_SHARD_MAX_STATE)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: a sharded checkpoint holds at most %d optimizer state arrays "
                        "(this optimizer has %lld)", s->vt->name, LK_SHARD_MAX_STATE, (long long)z->arrays);
    lk_shard_piece *p = lk_calloc((size_t)s->nparams + 1, sizeof *p);
    if (!p) return LK_STATUS_OUT_OF_MEMORY;
    int k = 0;
    int64_t off = 0;
    for (int i = 0; i < s->nparams; i++) {
        lk_tensor *t = s->params[i];
        int64_t a = off > z->lo ? off : z->lo, b = off + t->numel < z->hi ? off + t->numel : z->hi;
        off += t->numel;
        if (b <= a) continue;
        p[k] = (lk_shard_piece){.name = s->names ? s->names[i] : "", .dtype = t->dtype, .ndim = t->ndim,
                                .shape = t->shape, .numel = t->numel, .lo = a - (off - t->numel),
                                .hi = b - (off - t->numel), .value = at(z->params, s, a)};
        p[k].nstate = z->optim ? (int)z->arrays : 0;
        for (int j = 0; j < p[k].nstate; j++)
            p[k].state[j] = z->whole_state ? z->whole_state + j * z->numel + a : z->chunk_state + j * z->chunk + (a - z->lo);
        k++;
    }
    *out = p;
    *n = k;
    return LK_STATUS_OK;
}

/* Every rank filled its chunk of the parameters: the replicas take the
 * others' chunks, as after a step. */
static lk_status z_shard_pieces_loaded(lk_strategy *s) { return share_chunks(s); }

static bool z_shares_params(const lk_strategy *s) { (void)s; return false; }

/* Parameters in their padded buffer, ddp's whole gradients, the optimizer
 * state of the chunk: what a step holds (the whole copy a checkpoint makes
 * lives until the next synced backward, and is not counted). */
static void z_memory(const lk_strategy *s, lk_strategy_memory *m) {
    const zero *z = z_of(s);
    int64_t padded = z->chunk * s->world * (int64_t)esz(s);
    m->param_bytes = padded; /* the node's one copy counts whole on each rank that maps it, as ddp's shared one */
    m->grad_bytes = s->flat_numel * (int64_t)esz(s);
    m->optim_state_bytes = z->optim ? z->chunk * z->arrays * (int64_t)sizeof(float) : 0;
}

static lk_status z_join(lk_strategy *s) {
    return lk_error(LK_STATUS_UNSUPPORTED, "%s: uneven inputs (join) are not supported: a rank that ran out takes no "
                    "optimizer step, so its chunk would not be updated; give every rank the same number of batches "
                    "(use_distributed_sampler, drop_last) or use ddp", s->vt->name);
}

static lk_status z_before_forward(lk_strategy *s) { return lk__strategy_ddp.before_forward(s); }

const lk_strategy_vt lk__strategy_zero1 = {
    .name = "deepspeed_stage_1",
    .summary = "deepspeed_stage_1 (lockstep's ZeRO-1: optimizer update sharded, gradients all-reduced)",
    .create = z_create,
    .free = z_free,
    .chunks_optimizer_state = true,
    .alloc_grads = z_alloc_grads,
    .param_buffer = z_param_buffer,
    .setup = z_setup,
    .training_step = lk__strategy_local_step,
    .before_forward = z_before_forward,
    .begin_backward = z_begin_backward,
    .finish_backward = z_finish_backward,
    .after_step = z_after_step,
    .shard_optimizer = z_shard_optimizer,
    .shares_params = z_shares_params,
    .join = z_join,
    .state_dict = z_state_dict,
    .state_dict_loaded = z_state_dict_loaded,
    .memory = z_memory,
    .shard_pieces = z_shard_pieces,
    .shard_pieces_loaded = z_shard_pieces_loaded,
};

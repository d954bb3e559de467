/* Strategies: the public functions on a created strategy, which dispatch
 * to the strategy's vtable (strategy_impl.h), and what several strategies
 * share: the flat gradient buffer every parameter's .grad is a view of, and
 * the step of a strategy whose one replica is this process (single, ddp).
 * Metric reduction, broadcast and barrier go through the communicator for
 * every strategy (a one-process strategy has nothing to reduce). The
 * registry that names the strategies and creates one is registry.c: the
 * strategies use this file, and this file names none of them. */
#include <math.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/replay.h"
#include "optim/optim_impl.h" /* lk__optimizer_state_floats: the state's size for lk_strategy_get_memory */
#include "strategy/strategy_impl.h"
#include "tensor/tensor_impl.h"

void lk_strategy_set_bucket_hook(lk_strategy *s, lk_strategy_bucket_fn fn, void *ctx) {
    s->bucket_fn = fn;
    s->bucket_ctx = ctx;
}

void lk_strategy_set_pipe_hook(lk_strategy *s, lk_strategy_pipe_fn fn, void *ctx) {
    s->pipe_fn = fn;
    s->pipe_ctx = ctx;
}

void lk_strategy_free(lk_strategy *s) {
    if (!s) return;
    lk_strategy_detach(s);
    if (s->vt->free) s->vt->free(s);
    for (int i = 0; i < s->nparams; i++) {
        lk_tensor *p = s->params[i];
        lk_tensor_set_grad_hook(p, NULL, NULL);
        if (s->flat_grad) { /* the flat buffer goes away: give grads their own memory (where they are) */
            lk_tensor *own = p->grad ? lk_tensor_to(p->grad, p->grad->device) : NULL;
            lk_tensor_release(p->grad);
            p->grad = own;
        }
    }
    lk_tensor_release(s->flat_grad_t);
    lk_tensor_release(s->param_buf_t);
    if (s->flat_grad) {
        if (s->flat_shared) lk_comm_free_shared(s->comm, s->flat_grad);
        else if (!lk_device_is_host(s->flat_dev))
            lk_device_free(s->flat_dev, s->flat_grad, (size_t)(s->flat_numel ? s->flat_numel : 1) *
                                                            lk_dtype_size(s->cfg.param_dtype));
        else lk_aligned_free(s->flat_grad);
    }
    /* what lk_strategy_wrap made, after the memory above went (the order the
     * trainer freed them in when it made them) */
    lk_named_tensors_clear(&s->local);
    lk_named_tensors_clear(&s->local_buffers);
    lk_free(s->local_arr);
    lk_free(s->buffer_arr);
    lk_free(s->local_names);
    for (int i = 0; i < s->nunits; i++) {
        lk_tensor_release(s->units[i].params);
        lk_tensor_release(s->units[i].grads);
    }
    lk_free(s->units);
    lk_free(s);
}

/* ---- the flat gradient buffer ---------------------------------------------------- */

lk_status lk__strategy_alloc_flat(lk_strategy *s, int64_t numel) {
    if (s->flat_grad) {
        if (numel != s->flat_numel)
            return lk_error(LK_STATUS_INVALID_USAGE, "strategy: gradient buffer already allocated for %lld elements",
                            (long long)s->flat_numel);
        return LK_STATUS_OK;
    }
    size_t bytes = (size_t)(numel ? numel : 1) * lk_dtype_size(s->cfg.param_dtype);
    const char *was = lk__alloc_what("the flat gradient buffer"); /* named by an error of the memory limit */
    lk_status st = LK_STATUS_OK;
    if (s->vt->alloc_grads) {
        void *mem = NULL;
        st = s->vt->alloc_grads(s, bytes, &mem, &s->flat_shared);
        s->flat_grad = mem;
    } else if (!lk_device_is_host(s->flat_dev)) { /* the training device's memory */
        st = lk_device_alloc(s->flat_dev, bytes, &s->flat_grad);
    } else if (!(s->flat_grad = lk_aligned_alloc(LK_ALIGN, bytes))) {
        st = LK_STATUS_OUT_OF_MEMORY;
    }
    lk__alloc_what(was);
    LK_TRY(st);
    if (lk_device_is_host(s->flat_dev)) memset(s->flat_grad, 0, bytes);
    else LK_TRY(lk_device_memset(s->flat_dev, s->flat_grad, 0, bytes));
    s->flat_numel = numel;
    return LK_STATUS_OK;
}

lk_status lk_strategy_grad_buffer(lk_strategy *s, int64_t numel, lk_tensor **out) {
    *out = NULL;
    LK_TRY(lk__strategy_alloc_flat(s, numel));
    if (!s->flat_grad_t) {
        int64_t shape[1] = {s->flat_numel};
        if (!(s->flat_grad_t = lk__tensor_wrap_on(s->flat_dev, s->cfg.param_dtype, 1, shape, s->flat_grad))) return lk_last_status();
    }
    *out = s->flat_grad_t;
    return LK_STATUS_OK;
}

lk_status lk_strategy_param_buffer(lk_strategy *s, int64_t numel, lk_tensor **buf, bool *copy_values) {
    *buf = NULL;
    *copy_values = true;
    if (!s->vt->param_buffer) return LK_STATUS_OK;
    void *mem = NULL;
    LK_TRY(s->vt->param_buffer(s, numel, &mem, copy_values));
    if (!mem) return LK_STATUS_OK;
    int64_t shape[1] = {numel};
    lk_tensor_release(s->param_buf_t);
    if (!(s->param_buf_t = lk__tensor_wrap_on(s->cfg.device, s->cfg.param_dtype, 1, shape, mem))) return lk_last_status();
    *buf = s->param_buf_t;
    return LK_STATUS_OK;
}

lk_status lk__strategy_grads_to_flat(lk_strategy *s) {
    int64_t off = 0;
    for (int i = 0; i < s->nparams; i++) {
        lk_tensor *p = s->params[i];
        void *want = (char *)s->flat_grad + off * (int64_t)lk_dtype_size(s->cfg.param_dtype);
        if (!p->grad || p->grad->data != want || !lk_tensor_is_contiguous(p->grad)) {
            lk_tensor *g = lk__tensor_wrap_on(s->flat_dev, s->cfg.param_dtype, p->ndim, p->shape, want);
            if (!g) return lk_last_status();
            if (p->grad) lk_tensor_copy(g, p->grad);
            lk_tensor_release(p->grad);
            p->grad = g;
        }
        off += p->numel;
    }
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
        if (params[i]->dtype != s->cfg.param_dtype)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "parameter '%s' has dtype %s; the strategy was made for %s "
                            "parameters (lk_strategy_config.param_dtype)",
                            names ? names[i] : "?", lk_dtype_name(params[i]->dtype), lk_dtype_name(s->cfg.param_dtype));
        total += params[i]->numel;
    }
    if (s->flat_grad && s->flat_numel != total)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy: the gradient buffer holds %lld elements, the parameters %lld",
                        (long long)s->flat_numel, (long long)total);
    if (s->vt->setup) return s->vt->setup(s);
    LK_TRY(lk__strategy_alloc_flat(s, total));
    return lk__strategy_grads_to_flat(s);
}

/* ---- the parameter layout and the state ---------------------------------------- */

lk_status lk__strategy_wrap_whole(lk_strategy *s, lk_layer *net) {
    /* one unit over every parameter: the flat buffers first (ddp's in shared
     * memory), then the parameters and gradients become views of them */
    int64_t total = lk_layer_num_parameters(net);
    lk_tensor *gbuf, *pbuf;
    bool copy_values;
    LK_TRY(lk_strategy_grad_buffer(s, total, &gbuf));
    LK_TRY(lk_strategy_param_buffer(s, total, &pbuf, &copy_values));
    if (!(s->units = lk_calloc(1, sizeof *s->units))) return LK_STATUS_OUT_OF_MEMORY;
    s->nunits = 1;
    LK_TRY(lk_params_flatten_into(net, pbuf, copy_values, gbuf, &s->units[0].params, &s->units[0].grads));
    LK_TRY(lk_layer_named_parameters(net, &s->local));
    LK_TRY(lk_layer_named_buffers(net, &s->local_buffers));
    int np = s->local.n, nb = s->local_buffers.n;
    s->local_arr = lk_calloc((size_t)np + 1, sizeof *s->local_arr);
    s->local_names = lk_calloc((size_t)np + 1, sizeof *s->local_names);
    s->buffer_arr = lk_calloc((size_t)nb + 1, sizeof *s->buffer_arr);
    if (!s->local_arr || !s->local_names || !s->buffer_arr) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < np; i++) {
        s->local_arr[i] = s->local.items[i].tensor;
        s->local_names[i] = s->local.items[i].name;
    }
    for (int i = 0; i < nb; i++) s->buffer_arr[i] = s->local_buffers.items[i].tensor; /* num_batches_tracked (i64) too */
    return lk_strategy_setup(s, s->local_arr, s->local_names, np, s->buffer_arr, nb);
}

lk_status lk_strategy_wrap(lk_strategy *s, lk_layer *net) {
    if (!net) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_strategy_wrap: no network");
    if (s->wrapped)
        return lk_error(LK_STATUS_INVALID_USAGE, "lk_strategy_wrap: this strategy already wraps a network (one per strategy)");
    s->wrapped = true; /* from here on, even on failure: the parameters may be views of its buffers already */
    s->net = net;
    return s->vt->wrap ? s->vt->wrap(s, net) : lk__strategy_wrap_whole(s, net);
}

bool lk_strategy_wrapped(const lk_strategy *s) { return s->wrapped; }

bool lk_strategy_needs_blocks(const lk_strategy *s) { return s->vt->set_blocks != NULL; }

lk_status lk_strategy_set_blocks(lk_strategy *s, const lk_named_layer *blocks, int n) {
    return s->vt->set_blocks ? s->vt->set_blocks(s, blocks, n) : LK_STATUS_OK;
}
bool lk_strategy_materializes(const lk_strategy *s) { return s->vt->materializes && s->vt->materializes(s); }

bool lk_strategy_wants_block_profile(const lk_strategy *s) {
    return s->vt->wants_profile && s->vt->wants_profile(s);
}

bool lk_strategy_evals_forward(const lk_strategy *s) {
    return s && s->wrapped && s->vt->evals_forward && s->vt->evals_forward(s);
}

lk_status lk_strategy_eval_forward(lk_strategy *s, const lk_batch *b, bool whole, lk_tensor **out) {
    if (out) *out = NULL;
    if (!b || !out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_strategy_eval_forward: NULL batch or out");
    if (!lk_strategy_evals_forward(s))
        return lk_error(LK_STATUS_INVALID_USAGE, "lk_strategy_eval_forward: strategy %s runs no forward of its own "
                        "(lk_strategy_evals_forward)", s->vt->name);
    return s->vt->eval_forward(s, b, whole, out);
}

lk_status lk_strategy_profile_blocks(lk_strategy *s, lk_tensor *x) {
    if (!lk_strategy_wants_block_profile(s)) return LK_STATUS_OK;
    if (!x) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_strategy_profile_blocks: NULL input");
    return s->vt->profile_blocks(s, x);
}
const lk_named_tensors *lk_strategy_local_params(const lk_strategy *s) { return &s->local; }
int lk_strategy_num_units(const lk_strategy *s) { return s->nunits; }

lk_status lk_strategy_unit(const lk_strategy *s, int i, lk_tensor **params, lk_tensor **grads) {
    if (i < 0 || i >= s->nunits)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_strategy_unit: unit %d of %d", i, s->nunits);
    if (params) *params = s->units[i].params;
    if (grads) *grads = s->units[i].grads;
    return LK_STATUS_OK;
}

lk_status lk_strategy_clip_grad_norm(lk_strategy *s, double max_norm, double norm_type) {
    if (s->vt->clip_grad_norm) return s->vt->clip_grad_norm(s, max_norm, norm_type);
    /* every rank holds the whole model: its local norm is the total one
     * (no total asked for: nothing is read back) */
    return lk_clip_grad_norm(&s->local, max_norm, norm_type, NULL);
}

lk_status lk_strategy_state_dict(lk_strategy *s, lk_layer *net, lk_named_tensors *out) {
    if (s->vt->state_dict) return s->vt->state_dict(s, s->wrapped ? s->net : net, out);
    return lk_state_dict_get(s->wrapped ? s->net : net, out);
}

bool lk_strategy_writes_checkpoint(const lk_strategy *s) { return s->rank == 0; }

lk_status lk_strategy_optimizer_state(lk_strategy *s, lk_optimizer *o, lk_named_tensors *out) {
    return lk_strategy_optimizer_state_ex(s, o, out, true);
}

lk_status lk_strategy_optimizer_state_ex(lk_strategy *s, lk_optimizer *o, lk_named_tensors *out, bool arrays) {
    if (s->wrapped && s->vt->optimizer_state) return s->vt->optimizer_state(s, o, out, arrays);
    return lk__optimizer_state_get_ex(o, out, arrays);
}

lk_status lk_strategy_optimizer_state_load(lk_strategy *s, lk_optimizer *o, const lk_named_tensors *state) {
    return s->wrapped && s->vt->optimizer_state_load ? s->vt->optimizer_state_load(s, o, state)
                                                      : lk_optimizer_state_load(o, state);
}

bool lk_strategy_state_dict_collective(const lk_strategy *s) { return s->vt->state_dict != NULL; }

lk_status lk_strategy_check_resume(const lk_strategy *s) {
    const char *why = s->vt->resume_unsupported ? s->vt->resume_unsupported(s) : NULL;
    return why ? lk_error(LK_STATUS_UNSUPPORTED, "strategy %s cannot resume a checkpoint's training state: %s",
                          s->vt->name, why)
               : LK_STATUS_OK;
}

lk_status lk_strategy_sync_model(lk_strategy *s) {
    return s && s->wrapped && s->vt->sync_model ? s->vt->sync_model(s) : LK_STATUS_OK;
}

lk_status lk_strategy_state_dict_loaded(lk_strategy *s) {
    return s->wrapped && s->vt->state_dict_loaded ? s->vt->state_dict_loaded(s) : LK_STATUS_OK;
}

bool lk_strategy_shards_state(const lk_strategy *s) { return s && s->vt->shard_pieces != NULL; }

lk_status lk_strategy_shard_pieces(lk_strategy *s, lk_shard_piece **out, int *n) {
    *out = NULL;
    *n = 0;
    if (!s->wrapped && !s->params)
        return lk_error(LK_STATUS_INVALID_USAGE, "strategy %s: no parameters yet (shard pieces before lk_strategy_wrap)",
                        s->vt->name);
    /* a sharded strategy's pieces are its chunks, where its gradient chunks are (s->flat_dev): on a GPU
     * only with cpu_offload are they host memory the set's writer reads */
    if (s->vt->shard_pieces && !lk_device_is_host(s->flat_dev))
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: a sharded checkpoint set (state_dict_type: sharded) is written "
                        "from host memory only for now, and this run's parameters are on %s; use state_dict_type: "
                        "full there", s->vt->name, lk_device_str(s->cfg.device, (char[32]){0}, 32));
    if (s->vt->shard_pieces) return s->vt->shard_pieces(s, out, n);
    /* replicas: every parameter whole, here as on every rank */
    lk_shard_piece *p = lk_calloc((size_t)s->nparams + 1, sizeof *p);
    if (!p) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < s->nparams; i++) {
        lk_tensor *t = s->params[i];
        p[i] = (lk_shard_piece){.name = s->names ? s->names[i] : "", .dtype = t->dtype, .ndim = t->ndim,
                                .shape = t->shape, .numel = t->numel, .lo = 0, .hi = t->numel, .value = t->data};
    }
    *out = p;
    *n = s->nparams;
    return LK_STATUS_OK;
}

lk_status lk_strategy_shard_pieces_loaded(lk_strategy *s) {
    return s->vt->shard_pieces_loaded ? s->vt->shard_pieces_loaded(s) : LK_STATUS_OK;
}

lk_comm *lk_strategy_dp_comm(const lk_strategy *s) { return s->dp_comm; }
int lk_strategy_dp_size(const lk_strategy *s) { return s->dp_size; }
int lk_strategy_dp_rank(const lk_strategy *s) { return s->dp_rank; }

lk_status lk_strategy_dp_reduce(lk_strategy *s, double *vals, int n, lk_reduce_op op) {
    if (s->dp_size == 1 || n == 0) return LK_STATUS_OK;
    return lk_comm_all_reduce(s->dp_comm, vals, (size_t)n, LK_F64, op);
}

/* ---- the step --------------------------------------------------------------------- */

lk_status lk_strategy_attach(lk_strategy *s, const lk_step_fn *fn) {
    if (!fn || !fn->forward) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_strategy_attach: a forward callback is required");
    if (s->attached) return lk_error(LK_STATUS_INVALID_USAGE, "lk_strategy_attach: already attached (detach first)");
    s->fn = *fn;
    lk_status st = s->vt->attach ? s->vt->attach(s) : LK_STATUS_OK;
    if (!st) s->attached = true;
    return st;
}

void lk_strategy_detach(lk_strategy *s) {
    if (!s || !s->attached) return;
    if (s->vt->detach) s->vt->detach(s);
    s->attached = false;
}

lk_status lk_strategy_training_step(lk_strategy *s, const lk_step_args *a, lk_step_result *r) {
    *r = (lk_step_result){.loss = NAN};
    if (!s->attached)
        return lk_error(LK_STATUS_INVALID_USAGE, "lk_strategy_training_step: no step callbacks (call lk_strategy_attach first)");
    return s->vt->training_step(s, a, r);
}

lk_tensor *lk__strategy_scale_loss(lk_tensor *loss, float mul, float scale) {
    if (loss && mul != 1.0f) loss = lk_mul_scalar(loss, mul);
    if (loss && scale != 1.0f) loss = lk_mul_scalar(loss, scale); /* after the division, as Lightning */
    return loss;
}

lk_status lk__strategy_local_step(lk_strategy *s, const lk_step_args *a, lk_step_result *r) {
    const lk_step_fn *fn = &s->fn;
    double t1 = lk_time_now();
    lk_scope_begin();
    if (fn->step_begin) fn->step_begin(fn->ctx);
    lk_status st = lk_strategy_before_forward(s);
    lk_autocast_enter(a->autocast);
    lk_tensor *loss = st ? NULL : fn->forward(fn->ctx, 0, a->batch, a->batch_idx);
    lk_autocast_exit();
    if (!st && !loss) st = lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_USAGE, "training_step returned no loss");
    r->loss = NAN;
    lk_tensor *scaled = st ? NULL : lk__strategy_scale_loss(loss, a->loss_mul, a->loss_scale);
    double t2 = lk_time_now();
    if (!st) {
        lk_strategy_begin_backward(s, a->sync);
        st = lk_backward(scaled);
        /* Nothing is read between forward and backward, so a GPU runs them
         * back to back. With keep_loss the caller reads the loss later,
         * together with its checks of the reduced gradients (the trainer's
         * one read per step; a non-finite loss then stops the step after
         * the last exchange, still before the optimizer touches a
         * parameter); otherwise this is the step's read of the loss (on a
         * GPU a synchronisation: the host waits for the queue to drain). */
        if (fn->keep_loss) {
            if (!st) st = fn->keep_loss(fn->ctx, loss);
        } else {
            r->loss = lk_tensor_item(loss);
            if (!st && fn->check_loss) st = fn->check_loss(fn->ctx, r->loss);
        }
        double t3 = lk_time_now();
        if (!st) st = lk_strategy_finish_backward(s);
        double t4 = lk_time_now();
        r->t_bwd = t3 - t2;
        r->t_comm = t4 - t3;
        if (fn->step_end) fn->step_end(fn->ctx, t2, t3, t4);
    }
    lk_scope_end();
    r->t_fwd = t2 - t1;
    return st;
}

lk_status lk_strategy_optimizer_step(lk_strategy *s, lk_optimizer *o, bool skip) {
    if (!skip) LK_TRY(lk_optimizer_step(o));
    LK_TRY(lk_strategy_after_step(s));
    lk_strategy_zero_grad(s);
    return lk__replay_step_end(); /* the step's last work is issued (backend/replay.c; nothing open: OK) */
}

/* ---- the lower-level calls ---------------------------------------------------------- */

lk_status lk_strategy_shard_optimizer(lk_strategy *s, lk_optimizer *o) {
    int64_t f = o ? lk__optimizer_state_floats(o) : 0;
    s->optim_state_floats = f > 0 ? f : 0; /* several groups (-1): not counted */
    if (!s->vt->shard_optimizer) return LK_STATUS_OK;
    const char *was = lk__alloc_what("the optimizer state"); /* named by an error of the memory limit */
    lk_status st = s->vt->shard_optimizer(s, o);
    lk__alloc_what(was);
    return st;
}

lk_strategy_memory lk_strategy_get_memory(const lk_strategy *s) {
    lk_strategy_memory m = {0};
    if (!s->wrapped) return m;
    int64_t b = s->flat_numel * (int64_t)lk_dtype_size(s->cfg.param_dtype);
    m = (lk_strategy_memory){b, b, s->optim_state_floats * (int64_t)sizeof(float), 0};
    if (s->vt->memory) s->vt->memory(s, &m);
    return m;
}

bool lk__strategy_chunks_optimizer_state(const lk_strategy *s) {
    return s && s->vt->chunks_optimizer_state;
}

lk_status lk_strategy_after_step(lk_strategy *s) { return s->vt->after_step ? s->vt->after_step(s) : LK_STATUS_OK; }

bool lk_strategy_shares_params(const lk_strategy *s) { return s->vt->shares_params && s->vt->shares_params(s); }

lk_status lk_strategy_before_forward(lk_strategy *s) {
    return s->vt->before_forward ? s->vt->before_forward(s) : LK_STATUS_OK;
}

void lk_strategy_begin_backward(lk_strategy *s, bool sync) {
    s->sync = sync;
    if (s->vt->begin_backward) s->vt->begin_backward(s, sync);
}

lk_status lk_strategy_finish_backward(lk_strategy *s) {
    return s->vt->finish_backward ? s->vt->finish_backward(s) : LK_STATUS_OK;
}

void lk_strategy_zero_grad(lk_strategy *s) {
    if (!s->flat_grad) return;
    if (lk_device_is_host(s->flat_dev)) {
        /* a fill op, cut across the compute threads as the optimizer's flat
         * update just was: each clears the gradients it read, in its own
         * cache (one thread's memset pulled the other's lines across: 30-40
         * us of a 1 ms bf16-mixed mlp step on two threads). On host memory
         * it always runs: the CPU backend fills every dtype. */
        lk_op_desc d = {.op = LK_OP_FILL, .dtype = {s->cfg.param_dtype}};
        d.fill = (lk_fill_params){.ndim = 1, .shape = {s->flat_numel}, .sd = {1}, .value = 0.0};
        (void)lk__backend_run(s->flat_dev, &d, (void *[]){s->flat_grad});
    } else {
        size_t bytes = (size_t)s->flat_numel * lk_dtype_size(s->cfg.param_dtype);
        (void)lk_device_memset(s->flat_dev, s->flat_grad, 0, bytes); /* a device's memset fails only on a broken device */
    }
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

const char *lk_strategy_name(const lk_strategy *s) { return s->vt->name; }
const char *lk_strategy_summary(const lk_strategy *s) { return s->vt->summary ? s->vt->summary : s->vt->name; }
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

lk_status lk_strategy_join(lk_strategy *s) { return s->vt->join ? s->vt->join(s) : LK_STATUS_OK; }

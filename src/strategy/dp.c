/* The `dp` strategy: DataParallel's shape on one process. One replica of the
 * module per device, each driven by its own thread (tapes and scopes are per
 * thread); the batch is cut into one slice per replica, each replica runs
 * forward and backward on its slice, the gradients are summed onto replica 0
 * (the caller's parameters), the optimizer steps there, and the parameters
 * (and buffers, as DataParallel broadcasts them from device 0) are copied
 * back out. The central reduction and copy are the cost the DP-vs-DDP
 * benchmark shows. The replicas' modules are the caller's: it makes them
 * through lk_step_fn.replicate (the trainer keeps a scratch trainer per
 * replica for its logging, and puts replica k on device k of
 * trainer.devices) and this file holds only their parameters, gradients
 * and buffers. Each replica's thread makes its replica's device its default,
 * so its batch slice and activations land there; the reduction and the copy
 * back are device copies (peer copies between two devices of one kind that
 * has them, as GPUs do; through the host otherwise) and one typed op each.
 * Replica k's gradients reach device 0 in a pool tensor (lk_tensor_to):
 * after the first step the pool hands the same block back, so the sum
 * allocates no device memory per step. Nothing is read back here: each
 * replica's loss stays on its device and goes to the caller after the
 * combination (lk_step_fn.keep_replica_loss; the trainer reads them all
 * with the gradients' checks, once per step), and the slices' rows may
 * already be on the replicas' devices (the trainer's prefetch cuts the
 * batch with lk_strategy_dp_slice too). A caller without
 * keep_replica_loss gets the old path: each replica reads its loss, and
 * check_loss sees their weighted mean. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "strategy/strategy_impl.h"
#include "tensor/tensor_impl.h"

typedef struct dp dp;

typedef struct replica {
    dp *d;
    lk_strategy *s;
    int k;
    lk_tensor *flat_p, *flat_g; /* replica 0: the caller's parameters, as one range */
    lk_named_tensors buffers;   /* replicas >= 1 (replica 0's are s->buffers) */
    bool made;                  /* fn.replicate succeeded: fn.free_replica owes it */
    lk_batch slice;
    double loss, t_fwd, t_bwd;
    lk_tensor *loss_t; /* with keep_replica_loss: the slice's loss, left on the replica's device */
    lk_status st;
    char err[1024];
    pthread_t thread;
    bool running;
} replica;

struct dp {
    int n;
    replica *r;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen; /* work generation posted by the main thread */
    int pending;  /* workers still running the current generation */
    bool quit;
    bool stale; /* replica 0's parameters may have changed since the replicas copied them (attach) */
    const lk_step_args *job; /* the current step */
    int64_t total;
};

static dp *me(const lk_strategy *s) { return s->self; }

static lk_status dp_create(lk_strategy *s) {
    if (s->world > 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy 'dp' runs in one process, but %d were launched", s->world);
    dp *d = lk_calloc(1, sizeof *d);
    if (!d) return LK_STATUS_OUT_OF_MEMORY;
    d->n = s->cfg.devices;
    if (!(d->r = lk_calloc((size_t)d->n, sizeof *d->r))) {
        lk_free(d);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->go, NULL);
    pthread_cond_init(&d->done, NULL);
    s->self = d;
    return LK_STATUS_OK;
}

static void dp_free(lk_strategy *s) {
    dp *d = me(s);
    if (!d) return;
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->go);
    pthread_cond_destroy(&d->done);
    lk_free(d->r);
    lk_free(d);
    s->self = NULL;
}

static void slice_batch(const lk_batch *b, int64_t start, int64_t count, lk_batch *out) {
    *out = *b;
    out->size = count;
    for (int f = 0; f < b->nfields; f++) {
        const lk_array *a = &b->field[f];
        int64_t row = 1;
        for (int d = 1; d < a->ndim; d++) row *= a->shape[d];
        out->field[f].shape[0] = count;
        out->field[f].data = (char *)a->data + start * row * (int64_t)lk_dtype_size(a->dtype);
    }
    if (b->sample_index) out->sample_index = b->sample_index + start;
}

void lk_strategy_dp_slice(int64_t size, int n, int k, int64_t *start, int64_t *rows) {
    int64_t per = n > 0 ? size / n : 0, extra = n > 0 ? size % n : 0;
    *rows = per + (k < extra ? 1 : 0);
    *start = (int64_t)k * per + (k < extra ? k : extra);
}

/* Forward and backward of one replica on its slice. */
static void run_replica(dp *d, int k) {
    replica *r = &d->r[k];
    const lk_step_fn *fn = &r->s->fn;
    const lk_step_args *a = d->job;
    r->st = LK_STATUS_OK;
    r->loss = NAN;
    lk_tensor_release(r->loss_t);
    r->loss_t = NULL;
    if (r->slice.size == 0) return;
    double t0 = lk_time_now();
    lk_scope_begin();
    lk_autocast_enter(a->autocast); /* autocast is per thread: each replica enters it */
    lk_tensor *loss = fn->forward(fn->ctx, k, &r->slice, a->batch_idx);
    lk_autocast_exit();
    if (!loss) r->st = lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_USAGE, "training_step returned no loss");
    if (!r->st) {
        lk_tensor *unscaled = loss;
        /* Each replica's loss is the mean over its slice: weighting by the
         * slice's share makes the summed gradient the full batch's. The
         * loss scale comes after the division, as the single-process path
         * scales it. */
        loss = lk__strategy_scale_loss(loss, a->loss_mul * (float)r->slice.size / (float)d->total, a->loss_scale);
        r->t_fwd = lk_time_now() - t0;
        double t1 = lk_time_now();
        r->st = lk_backward(loss);
        /* Left where it is for the caller's one read per step (on a GPU a
         * read here would stall this replica's queue each step); without
         * keep_replica_loss read after backward is queued. Kept past the
         * scope's end: the main thread hands it over and releases it. */
        if (fn->keep_replica_loss) r->loss_t = lk_tensor_retain(unscaled);
        else r->loss = lk_tensor_item(unscaled);
        r->t_bwd = lk_time_now() - t1;
    }
    if (r->st) snprintf(r->err, sizeof r->err, "%s", lk_last_error());
    lk_scope_end();
}

static void *worker(void *arg) {
    replica *r = arg;
    dp *d = r->d;
    int k = r->k;
    uint64_t seen = 0;
    lk_set_grad_enabled(true);
    lk_device dev = r->flat_p->device; /* the replica's device: what its module code makes goes there */
    lk_status dev_st = lk_device_set_thread_default(&dev);
    char dev_err[512];
    snprintf(dev_err, sizeof dev_err, "%s", dev_st ? lk_last_error() : "");
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!d->quit && d->gen == seen) pthread_cond_wait(&d->go, &d->mu);
        if (d->quit) {
            pthread_mutex_unlock(&d->mu);
            break;
        }
        seen = d->gen;
        pthread_mutex_unlock(&d->mu);
        if (dev_st) r->st = dev_st, snprintf(r->err, sizeof r->err, "%s", dev_err);
        else run_replica(d, k);
        pthread_mutex_lock(&d->mu);
        if (--d->pending == 0) pthread_cond_signal(&d->done);
        pthread_mutex_unlock(&d->mu);
    }
    lk_thread_cleanup();
    return NULL;
}

/* Stops the threads and lets go of the replicas (attach's undo). */
static void dp_detach(lk_strategy *s) {
    dp *d = me(s);
    pthread_mutex_lock(&d->mu);
    d->quit = true;
    pthread_cond_broadcast(&d->go);
    pthread_mutex_unlock(&d->mu);
    for (int k = 0; k < d->n; k++) {
        replica *r = &d->r[k];
        if (r->running) pthread_join(r->thread, NULL);
        lk_named_tensors_clear(&r->buffers);
        lk_tensor_release(r->loss_t);
        lk_tensor_release(r->flat_p);
        lk_tensor_release(r->flat_g);
        if (r->made && s->fn.free_replica) s->fn.free_replica(s->fn.ctx, k);
        *r = (replica){0};
    }
    d->quit = false;
    d->gen = 0;
}

static lk_status dp_attach(lk_strategy *s) {
    dp *d = me(s);
    const lk_step_fn *fn = &s->fn;
    if (!fn->replicate)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy 'dp' needs replicas of the module (lk_step_fn.replicate)");
    /* Replica 0 is the caller's parameters, one flat range (lk_params_flatten). */
    lk_dtype dt = s->cfg.param_dtype;
    size_t es = lk_dtype_size(dt);
    char *base = s->nparams ? s->params[0]->data : s->flat_grad;
    int64_t off = 0;
    for (int i = 0; i < s->nparams; i++) {
        if (s->params[i]->data != base + off * (int64_t)es || !lk_tensor_is_contiguous(s->params[i]))
            return lk_error(LK_STATUS_INVALID_USAGE, "dp: parameter '%s' is not in one flat range with the others "
                            "(lk_params_flatten the network before lk_strategy_setup)", s->names ? s->names[i] : "?");
        off += s->params[i]->numel;
    }
    int64_t shape[1] = {s->flat_numel};
    replica *r0 = &d->r[0];
    r0->flat_p = lk__tensor_wrap_on(s->nparams ? s->params[0]->device : s->cfg.device, dt, 1, shape, base);
    r0->flat_g = lk__tensor_wrap_on(s->cfg.device, dt, 1, shape, s->flat_grad);
    lk_status st = r0->flat_p && r0->flat_g ? LK_STATUS_OK : lk_last_status();
    for (int k = 0; k < d->n; k++) d->r[k].d = d, d->r[k].s = s, d->r[k].k = k;
    for (int k = 1; k < d->n && !st; k++) {
        replica *r = &d->r[k];
        lk_layer *net = NULL;
        st = fn->replicate(fn->ctx, k, &net);
        r->made = !st;
        if (!st) st = lk_params_flatten(net, NULL, &r->flat_p, &r->flat_g);
        if (!st && (r->flat_p->numel != s->flat_numel || r->flat_p->dtype != dt))
            st = lk_error(LK_STATUS_INTERNAL, "dp: replica %d has %lld %s parameters, replica 0 %lld %s", k,
                          (long long)r->flat_p->numel, lk_dtype_name(r->flat_p->dtype), (long long)s->flat_numel,
                          lk_dtype_name(dt));
        if (!st) st = lk_layer_named_buffers(net, &r->buffers);
        if (!st && r->buffers.n != s->nbuffers)
            st = lk_error(LK_STATUS_INTERNAL, "dp: replica %d has %d buffers, replica 0 %d", k, r->buffers.n, s->nbuffers);
        if (!st) st = lk_device_copy(r->flat_p->device, r->flat_p->data, r0->flat_p->device, base, (size_t)s->flat_numel * es);
        if (!st) {
            if (pthread_create(&r->thread, NULL, worker, r)) st = lk_error(LK_STATUS_INTERNAL, "dp: cannot start thread %d", k);
            else r->running = true;
        }
    }
    if (st) {
        dp_detach(s);
        return st;
    }
    /* N replicas compute at once: BLAS gets one thread each. */
    lk_set_num_threads(1);
    d->stale = true;
    return LK_STATUS_OK;
}

static lk_status dp_after_step(lk_strategy *s);

static lk_status dp_step(lk_strategy *s, const lk_step_args *a, lk_step_result *res) {
    dp *d = me(s);
    const lk_batch *b = a->batch;
    /* The replicas copied replica 0 at attach; what the caller did since
     * (the trainer loads a checkpoint after attaching) reaches them here, or
     * a resumed run's first step would run the replicas on the old values. */
    if (d->stale) LK_TRY(dp_after_step(s));
    /* DataParallel broadcasts buffers (BatchNorm statistics) from device 0. */
    for (int k = 1; k < d->n; k++)
        for (int i = 0; i < s->nbuffers; i++) lk_tensor_copy(d->r[k].buffers.items[i].tensor, s->buffers[i]);
    for (int k = 0; k < d->n; k++) {
        int64_t start, cnt;
        lk_strategy_dp_slice(b->size, d->n, k, &start, &cnt);
        slice_batch(b, start, cnt, &d->r[k].slice);
    }
    d->job = a;
    d->total = b->size;
    pthread_mutex_lock(&d->mu);
    d->pending = d->n - 1;
    d->gen++;
    pthread_cond_broadcast(&d->go);
    pthread_mutex_unlock(&d->mu);
    run_replica(d, 0);
    pthread_mutex_lock(&d->mu);
    while (d->pending > 0) pthread_cond_wait(&d->done, &d->mu);
    pthread_mutex_unlock(&d->mu);
    d->job = NULL;
    for (int k = 0; k < d->n; k++)
        if (d->r[k].st) return lk_error(d->r[k].st, "dp replica %d: %s", k, d->r[k].err);
    res->t_fwd = d->r[0].t_fwd;
    res->t_bwd = d->r[0].t_bwd;
    /* Gradients onto replica 0 (the central device's reduction). */
    double t0 = lk_time_now();
    lk_tensor *g0 = d->r[0].flat_g;
    bool host = lk_device_is_host(g0->device);
    for (int k = 1; k < d->n; k++) {
        lk_tensor *gk = d->r[k].flat_g;
        if (host && lk_device_is_host(gk->device)) {
            LK_TRY(lk__axpy(gk->device, gk->dtype, g0->numel, 1.0f, gk->data, g0->data)); /* g0 += gk */
            memset(gk->data, 0, lk_tensor_nbytes(gk));
            continue;
        }
        /* another device: gk copied to replica 0's first, then the same op there */
        lk_tensor *t = lk_tensor_to(gk, g0->device);
        lk_status st = t ? lk__axpy(g0->device, gk->dtype, g0->numel, 1.0f, t->data, g0->data) : lk_last_status();
        lk_tensor_release(t);
        if (!st) st = lk_device_memset(gk->device, gk->data, 0, lk_tensor_nbytes(gk));
        LK_TRY(st);
    }
    res->t_comm = lk_time_now() - t0;
    if (s->fn.keep_replica_loss) {
        /* after the combination, as the loss was checked before: each
         * replica's loss to the caller, who reads them all at once */
        res->loss = NAN;
        for (int k = 0; k < d->n; k++)
            if (d->r[k].slice.size)
                LK_TRY(s->fn.keep_replica_loss(s->fn.ctx, k, d->r[k].loss_t, d->r[k].slice.size, b->size));
        return LK_STATUS_OK;
    }
    double l = 0;
    for (int k = 0; k < d->n; k++) l += d->r[k].slice.size ? d->r[k].loss * (double)d->r[k].slice.size / (double)b->size : 0;
    res->loss = l;
    return s->fn.check_loss ? s->fn.check_loss(s->fn.ctx, l) : LK_STATUS_OK;
}

static lk_status dp_training_step(lk_strategy *s, const lk_step_args *a, lk_step_result *res) {
    lk_status st = dp_step(s, a, res);
    for (int k = 0; k < me(s)->n; k++) { /* the kept losses, whatever happened (the caller copied them) */
        lk_tensor_release(me(s)->r[k].loss_t);
        me(s)->r[k].loss_t = NULL;
    }
    return st;
}

/* After the optimizer step: replica 0's parameters to the others. */
static lk_status dp_after_step(lk_strategy *s) {
    dp *d = me(s);
    if (!d->r[0].flat_p) return LK_STATUS_OK; /* not attached: nothing to copy to */
    size_t bytes = lk_tensor_nbytes(d->r[0].flat_p);
    for (int k = 1; k < d->n; k++) {
        lk_tensor *p = d->r[k].flat_p, *p0 = d->r[0].flat_p;
        if (lk_device_is_host(p->device) && lk_device_is_host(p0->device)) memcpy(p->data, p0->data, bytes);
        else LK_TRY(lk_device_copy(p->device, p->data, p0->device, p0->data, bytes));
    }
    d->stale = false;
    return LK_STATUS_OK;
}

const lk_strategy_vt lk__strategy_dp = {
    .name = "dp",
    .summary = "dp, one replica per device on threads",
    .create = dp_create,
    .free = dp_free,
    .attach = dp_attach,
    .detach = dp_detach,
    .training_step = dp_training_step,
    .after_step = dp_after_step,
};

/* The `dp` strategy: DataParallel's shape on one process. One replica of the
 * module per device, each driven by its own thread (tapes and scopes are per
 * thread); the batch is cut into one slice per replica, each replica runs
 * forward and backward on its slice, the gradients are summed onto replica 0,
 * the optimizer steps there, and the parameters (and buffers, as
 * DataParallel broadcasts them from device 0) are copied back out. The
 * central reduction and copy are the cost the DP-vs-DDP benchmark shows. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "train/train_impl.h"

typedef struct replica {
    lk_dp *dp;
    int k;
    lk_module *m;
    lk_trainer *shadow; /* replicas > 0 log into a scratch trainer (discarded) */
    lk_tensor *flat_p, *flat_g;
    lk_named_tensors buffers;
    lk_batch slice;
    double loss, t_fwd, t_bwd;
    lk_status st;
    char err[1024];
    pthread_t thread;
} replica;

struct lk_dp {
    lk_trainer *tr;
    int n;
    replica *r;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;  /* work generation posted by the main thread */
    int pending;   /* workers still running the current generation */
    bool quit;
    /* the current job */
    int64_t batch_idx;
    float accum_scale;
    float loss_scale; /* the fp16 loss scaler's (1: none) */
    int64_t total;
};

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

/* Forward and backward of one replica on its slice. */
static void run_replica(lk_dp *dp, int k) {
    replica *r = &dp->r[k];
    lk_trainer *tr = k == 0 ? dp->tr : r->shadow;
    r->st = LK_STATUS_OK;
    r->loss = NAN;
    if (r->slice.size == 0) return;
    double t0 = lk_time_now();
    tr->stage = "train";
    tr->cur_batch_size = r->slice.size;
    lk_scope_begin();
    lk_layer_set_rng_step(r->m->net, (uint64_t)dp->tr->cfg.seed, (uint32_t)k, (uint64_t)dp->tr->global_step);
    lk_autocast_enter(dp->tr->autocast); /* autocast is per thread: each replica enters it */
    lk_tensor *loss = r->m->vt->training_step(r->m, &r->slice, dp->batch_idx, tr);
    lk_autocast_exit();
    if (!loss) r->st = lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_USAGE, "training_step returned no loss");
    if (!r->st) {
        r->loss = lk_tensor_item(loss);
        /* Each replica's loss is the mean over its slice: weighting by the
         * slice's share makes the summed gradient the full batch's. */
        loss = lk_mul_scalar(loss, dp->accum_scale * (float)r->slice.size / (float)dp->total);
        /* After the division, as the single-process path scales it. */
        if (dp->loss_scale != 1.0f) loss = lk_mul_scalar(loss, dp->loss_scale);
        r->t_fwd = lk_time_now() - t0;
        double t1 = lk_time_now();
        r->st = lk_backward(loss);
        r->t_bwd = lk_time_now() - t1;
    }
    if (r->st) snprintf(r->err, sizeof r->err, "%s", lk_last_error());
    lk_scope_end();
}

static void *worker(void *arg) {
    replica *r = arg;
    lk_dp *dp = r->dp;
    int k = r->k;
    uint64_t seen = 0;
    lk_set_grad_enabled(true);
    for (;;) {
        pthread_mutex_lock(&dp->mu);
        while (!dp->quit && dp->gen == seen) pthread_cond_wait(&dp->go, &dp->mu);
        if (dp->quit) {
            pthread_mutex_unlock(&dp->mu);
            break;
        }
        seen = dp->gen;
        pthread_mutex_unlock(&dp->mu);
        run_replica(dp, k);
        pthread_mutex_lock(&dp->mu);
        if (--dp->pending == 0) pthread_cond_signal(&dp->done);
        pthread_mutex_unlock(&dp->mu);
    }
    lk_thread_cleanup();
    return NULL;
}

void lk__dp_free(lk_dp *dp) {
    if (!dp) return;
    pthread_mutex_lock(&dp->mu);
    dp->quit = true;
    pthread_cond_broadcast(&dp->go);
    pthread_mutex_unlock(&dp->mu);
    for (int k = 1; k < dp->n; k++) {
        replica *r = &dp->r[k];
        if (r->thread) pthread_join(r->thread, NULL);
        lk_named_tensors_clear(&r->buffers);
        lk_tensor_release(r->flat_p);
        lk_tensor_release(r->flat_g);
        lk_module_free(r->m);
        if (r->shadow) {
            lk_free(r->shadow->metrics);
            lk_free(r->shadow);
        }
    }
    lk_named_tensors_clear(&dp->r[0].buffers);
    pthread_mutex_destroy(&dp->mu);
    pthread_cond_destroy(&dp->go);
    pthread_cond_destroy(&dp->done);
    lk_free(dp->r);
    lk_free(dp);
}

lk_status lk__dp_create(lk_trainer *tr, int n, lk_dp **out) {
    *out = NULL;
    lk_module *m = tr->module;
    if (!m->vt->replicate)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "strategy 'dp' needs one replica of module '%s' per device, but the module cannot be "
                        "replicated (its vtable has no replicate()); use ddp, which needs no replicas",
                        m->name ? m->name : "?");
    if (tr->world > 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy 'dp' runs in one process, but %d were launched", tr->world);
    lk_dp *dp = lk_calloc(1, sizeof *dp);
    if (!dp) return LK_STATUS_OUT_OF_MEMORY;
    dp->r = lk_calloc((size_t)n, sizeof *dp->r);
    if (!dp->r) {
        lk_free(dp);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    dp->tr = tr;
    dp->n = n;
    pthread_mutex_init(&dp->mu, NULL);
    pthread_cond_init(&dp->go, NULL);
    pthread_cond_init(&dp->done, NULL);
    dp->r[0].m = m;
    dp->r[0].flat_p = tr->flat_params;
    dp->r[0].flat_g = tr->flat_grads;
    lk_status st = lk_layer_named_buffers(m->net, &dp->r[0].buffers);
    for (int k = 1; k < n && !st; k++) {
        replica *r = &dp->r[k];
        st = m->vt->replicate(m, &r->m);
        if (!st) st = lk_params_flatten(r->m->net, NULL, &r->flat_p, &r->flat_g);
        if (!st && r->flat_p->numel != tr->flat_params->numel)
            st = lk_error(LK_STATUS_INTERNAL, "dp: replica %d has %lld parameters, replica 0 %lld", k,
                          (long long)r->flat_p->numel, (long long)tr->flat_params->numel);
        if (!st) st = lk_layer_named_buffers(r->m->net, &r->buffers);
        if (!st) {
            memcpy(r->flat_p->data, tr->flat_params->data, lk_tensor_nbytes(tr->flat_params));
            r->shadow = lk_calloc(1, sizeof *r->shadow);
            if (!r->shadow) st = LK_STATUS_OUT_OF_MEMORY;
        }
        if (!st) {
            r->shadow->cfg = tr->cfg;
            r->dp = dp;
            r->k = k;
            if (pthread_create(&r->thread, NULL, worker, r)) st = lk_error(LK_STATUS_INTERNAL, "dp: cannot start thread %d", k);
        }
    }
    if (st) {
        lk__dp_free(dp);
        return st;
    }
    /* N replicas compute at once: BLAS gets one thread each. */
    lk_set_num_threads(1);
    *out = dp;
    return LK_STATUS_OK;
}

lk_status lk__dp_step(lk_dp *dp, const lk_batch *b, int64_t batch_idx, float accum_scale, float loss_scale, double *loss,
                      double *fwd_s, double *bwd_s, double *reduce_s) {
    /* DataParallel broadcasts buffers (BatchNorm statistics) from device 0. */
    for (int k = 1; k < dp->n; k++)
        for (int i = 0; i < dp->r[0].buffers.n; i++)
            lk_tensor_copy(dp->r[k].buffers.items[i].tensor, dp->r[0].buffers.items[i].tensor);
    int64_t per = b->size / dp->n, extra = b->size % dp->n, start = 0;
    for (int k = 0; k < dp->n; k++) {
        int64_t cnt = per + (k < extra ? 1 : 0);
        slice_batch(b, start, cnt, &dp->r[k].slice);
        start += cnt;
    }
    dp->batch_idx = batch_idx;
    dp->accum_scale = accum_scale;
    dp->loss_scale = loss_scale;
    dp->total = b->size;
    pthread_mutex_lock(&dp->mu);
    dp->pending = dp->n - 1;
    dp->gen++;
    pthread_cond_broadcast(&dp->go);
    pthread_mutex_unlock(&dp->mu);
    run_replica(dp, 0);
    pthread_mutex_lock(&dp->mu);
    while (dp->pending > 0) pthread_cond_wait(&dp->done, &dp->mu);
    pthread_mutex_unlock(&dp->mu);
    for (int k = 0; k < dp->n; k++)
        if (dp->r[k].st) return lk_error(dp->r[k].st, "dp replica %d: %s", k, dp->r[k].err);
    *fwd_s = dp->r[0].t_fwd;
    *bwd_s = dp->r[0].t_bwd;
    /* Gradients onto replica 0 (the central device's reduction). */
    double t0 = lk_time_now();
    float *g0 = dp->r[0].flat_g->data;
    int64_t ng = dp->r[0].flat_g->numel;
    for (int k = 1; k < dp->n; k++) {
        float *gk = dp->r[k].flat_g->data;
        for (int64_t i = 0; i < ng; i++) g0[i] += gk[i];
        memset(gk, 0, (size_t)ng * sizeof(float));
    }
    *reduce_s = lk_time_now() - t0;
    double l = 0;
    for (int k = 0; k < dp->n; k++) l += dp->r[k].slice.size ? dp->r[k].loss * (double)dp->r[k].slice.size / (double)b->size : 0;
    *loss = l;
    return LK_STATUS_OK;
}

void lk__dp_broadcast_params(lk_dp *dp) {
    size_t bytes = lk_tensor_nbytes(dp->r[0].flat_p);
    for (int k = 1; k < dp->n; k++) memcpy(dp->r[k].flat_p->data, dp->r[0].flat_p->data, bytes);
}

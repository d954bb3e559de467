/* batch_norm over [N, C, ...] f32, bf16 or f16 (BatchNorm1d/2d): forward and backward for
 * x, weight and bias in training (batch statistics) and eval (running
 * statistics) mode, with PyTorch's semantics — the biased variance
 * normalises, the unbiased one feeds the running variance, and the running
 * statistics are updated in place outside the tape. Per-channel sums run
 * per (sample, channel) plane in f32 and accumulate across planes in double,
 * so a large batch does not lose precision in the mean. A bf16/f16 input
 * (autocast's activations) gives an output and an input gradient of its
 * dtype, with the same f32 statistics (the backend widens it); weight,
 * bias and the running statistics may be f32 (mixed) or 16-bit (true), and
 * their gradients get their dtype through lk__accum. */
#include <string.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

/* node->a.i: [0] training, [1] index of weight in node->in (or -1), [2] of
 * bias; saved[0] = contiguous x, saved[1] = [2, C] (mean, invstd) used. */
/* Channels are independent: whole channels per core once the input is
 * large enough to pay for a thread (about a megabyte). */
static int bn_width(int64_t numel, long C) { return numel >= (1 << 18) ? lk__parallel_width(C) : 1; }

typedef struct {
    const void *xd, *gd; /* in x's and dY's own dtypes (xt, gt) */
    const float *mean, *invstd, *w;
    float *dx, *dw, *db;
    long N, C, S;
    double M;
    bool training;
    int width;
    lk_dtype xt, gt;
} bn_bwd_job;

/* Where SyncBatchNorm's sums go: a reducer (the trainer's data-parallel
 * group: lk_layer_sync_batchnorm_reducer), which takes the device buffer
 * itself when its communicator reads device memory, or a caller's function
 * over host doubles (lk_batch_norm_sync). */
typedef struct {
    lk_bn_reducer red; /* red.sum NULL: sum */
    lk_sum_fn sum;
    void *ctx;
    double count; /* samples per channel over every rank */
} bn_sync;

/* One of SyncBatchNorm's passes (LK_OP_BN_STATS, LK_OP_BN_APPLY) on dev's backend. */
static lk_status bn_split_run(lk_device dev, lk_op_kind op, long N, long C, long S, lk_bn_stat stat, bool backward,
                              lk_dtype xt, const void *x, lk_dtype gt, const void *g, const float *k, lk_dtype yt,
                              void *out) {
    /* x, g and BN_APPLY's y in their own dtypes (a 16-bit activation is widened by the backend) */
    lk_dtype ot = op == LK_OP_BN_STATS ? LK_F64 : yt;
    lk_op_desc d = {.op = op, .dtype = {xt, g ? gt : LK_F32, LK_F32, ot}};
    d.bn_split = (lk_bn_split_params){N, C, S, stat, backward};
    return lk__backend_run(dev, &d, (void *[]){(void *)x, (void *)g, (void *)k, out});
}

/* SyncBatchNorm's per-channel values on a device the host may not read
 * (cuda): the passes read and write buffers on the op's device, and the
 * per-channel scalars between the all-reduces are computed on the host from
 * copies of those C values (one copy each way per pass; C is small). The
 * host never dereferences a tensor's memory here; on the CPU the copies are
 * memcpys and the arithmetic is unchanged, so the bits are too. */
typedef struct {
    lk_tensor *t; /* n elements on dev, from the tensor pool (no cudaMalloc per step) */
    void *p;      /* its data */
} bn_dbuf;

static lk_status dbuf_alloc(lk_device dev, lk_dtype dt, size_t n, bn_dbuf *b) {
    b->t = lk__tensor_new_on(dev, dt, 1, (int64_t[]){(int64_t)(n ? n : 1)});
    b->p = b->t ? b->t->data : NULL;
    return b->t ? LK_STATUS_OK : lk_last_status();
}
static void dbuf_free(bn_dbuf *b) {
    lk_tensor_release(b->t);
    *b = (bn_dbuf){0};
}
/* bytes between the host and dev. */
static lk_status to_host(void *h, lk_device dev, const void *p, size_t bytes) {
    return bytes ? lk_device_copy(LK_DEVICE_CPU, h, dev, p, bytes) : LK_STATUS_OK;
}
static lk_status to_dev(lk_device dev, void *p, const void *h, size_t bytes) {
    return bytes ? lk_device_copy(dev, p, LK_DEVICE_CPU, h, bytes) : LK_STATUS_OK;
}

/* SyncBatchNorm's one all-reduce of a pass: the n doubles at d (on dev)
 * summed over the ranks, the sums left in h (the host's copy, for the
 * per-channel scalars). A communicator that reads dev's memory (nccl; any
 * on host memory) reduces d in place and h is copied from it after; else
 * (shm or mpi with a GPU, a caller's function) h is copied from d and
 * reduced on the host: one copy out per pass either way. With keep, d and
 * h hold 2n: this rank's sums first, which stay as they are (the backward's
 * weight and bias gradients are this rank's), and the n reduced after them. */
static lk_status bn_reduce(const bn_sync *sy, lk_device dev, double *d, double *h, size_t n, bool keep) {
    size_t bytes = n * sizeof *d;
    double *rd = keep ? d + n : d, *rh = keep ? h + n : h;
    if (sy->red.sum && (lk_device_is_host(dev) || sy->red.device_memory)) {
        if (keep && n) LK_TRY(lk_device_copy(dev, rd, dev, d, bytes));
        LK_TRY(sy->red.sum(sy->red.ctx, dev, rd, (int)n));
        return to_host(h, dev, d, keep ? 2 * bytes : bytes);
    }
    LK_TRY(to_host(h, dev, d, bytes));
    if (keep && n) memcpy(rh, h, bytes);
    if (sy->red.sum) return sy->red.sum(sy->red.ctx, LK_DEVICE_CPU, rh, (int)n);
    return sy->sum(sy->ctx, rh, (int)n);
}

/* SyncBatchNorm's backward: this rank's per-channel sums of g and
 * g * (x - mean) (one BN_STATS pass), summed over the ranks in one
 * all-reduce for the input gradient; the weight and bias gradients are
 * this rank's sums (DDP averages them afterwards, as PyTorch's
 * SyncBatchNorm leaves them). j's pointers are on dev (w f32 contiguous);
 * the host works on copies: the [2, C] statistics and w in, dw and db out,
 * the sums in and the input gradient's coefficients out. */
static lk_status bn_sync_backward(lk_device dev, const bn_bwd_job *j, const bn_sync *sy) {
    long N = j->N, C = j->C, S = j->S;
    size_t nc = (size_t)(C > 0 ? C : 0);
    double *tot = lk_malloc((4 * nc + 1) * sizeof *tot); /* this rank's [2C], then every rank's [2C] */
    /* host: k [4C] (mean, k0, k1, k2 per channel), stats [2C] (mean, invstd), w [C], dw [C], db [C] */
    float *k = lk_malloc((9 * nc + 1) * sizeof *k), *hs = k ? k + 4 * nc : NULL, *hw = k ? hs + 2 * nc : NULL,
          *hdw = k ? hw + nc : NULL, *hdb = k ? hdw + nc : NULL;
    bn_dbuf dtot = {0}, dk = {0};
    lk_status st = tot && k ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    if (!st) st = dbuf_alloc(dev, LK_F64, 4 * nc, &dtot);
    if (!st) st = bn_split_run(dev, LK_OP_BN_STATS, N, C, S, LK_BN_GRAD, false, j->xt, j->xd, j->gt, j->gd, j->mean,
                               LK_F64, dtot.p);
    if (!st) st = bn_reduce(sy, dev, dtot.p, tot, 2 * nc, true);
    const double *all = tot + 2 * nc;
    if (!st) st = to_host(hs, dev, j->mean, 2 * nc * sizeof *hs); /* mean and invstd: one [2, C] tensor */
    if (!st && j->w) st = to_host(hw, dev, j->w, nc * sizeof *hw);
    for (long c = 0; !st && c < C; c++) {
        hdb[c] = (float)tot[c];
        hdw[c] = (float)(tot[C + c] * hs[C + c]);
    }
    if (!st && j->db) st = to_dev(dev, j->db, hdb, nc * sizeof *hdb);
    if (!st && j->dw) st = to_dev(dev, j->dw, hdw, nc * sizeof *hdw);
    for (long c = 0; !st && j->dx && c < C; c++) {
        float is = hs[C + c], k1 = (j->w ? hw[c] : 1.0f) * is;
        k[c] = hs[c];
        k[C + c] = (float)(-(double)k1 * all[c] / sy->count);
        k[2 * C + c] = k1;
        k[3 * C + c] = (float)(-(double)k1 * is * is * all[C + c] / sy->count);
    }
    if (!st && j->dx) st = dbuf_alloc(dev, LK_F32, 4 * nc, &dk);
    if (!st && j->dx) st = to_dev(dev, dk.p, k, 4 * nc * sizeof *k);
    if (!st && j->dx)
        st = bn_split_run(dev, LK_OP_BN_APPLY, N, C, S, LK_BN_SUM, true, j->xt, j->xd, j->gt, j->gd, dk.p, j->xt,
                          j->dx);
    dbuf_free(&dtot);
    dbuf_free(&dk);
    lk_free(tot);
    lk_free(k);
    return st;
}

static void batch_norm_backward(lk_node *n, lk_tensor *gout) {
    lk_tensor *x = n->in[0], *xc = n->saved[0], *stats = n->saved[1];
    lk_tensor *w = n->a.i[1] >= 0 ? n->in[n->a.i[1]] : NULL, *b = n->a.i[2] >= 0 ? n->in[n->a.i[2]] : NULL;
    bool training = n->a.i[0] != 0;
    long N = xc->shape[0], C = xc->shape[1], S = N * C > 0 ? (long)(xc->numel / (N * C)) : 0;
    double M = (double)N * (double)S;
    const float *mean = stats->data, *invstd = (const float *)stats->data + C;
    const void *xd = xc->data, *gd = gout->data;
    /* dX in the input's dtype (the backend rounds it once); dW and dB in f32,
     * rounded by lk__accum to a 16-bit parameter's dtype */
    lk_tensor *dx = x->requires_grad ? lk__tensor_new_on(xc->device, xc->dtype, x->ndim, x->shape) : NULL;
    lk_tensor *dw = w && w->requires_grad ? lk__tensor_new_on(xc->device, LK_F32, 1, w->shape) : NULL;
    lk_tensor *db = b && b->requires_grad ? lk__tensor_new_on(xc->device, LK_F32, 1, b->shape) : NULL;
    if ((x->requires_grad && !dx) || (w && w->requires_grad && !dw) || (b && b->requires_grad && !db)) goto done;
    lk_tensor *wc = w ? lk__contig(w) : NULL;
    if (w && !wc) goto done;
    bn_bwd_job job = {xd, gd, mean, invstd, wc ? wc->data : NULL, dx ? dx->data : NULL, dw ? dw->data : NULL,
                      db ? db->data : NULL, N, C, S, M, training, bn_width(xc->numel, C), xc->dtype, gout->dtype};
    if (n->extra && training) {
        lk_status st = bn_sync_backward(xc->device, &job, n->extra);
        if (st) {
            lk_tensor_release(wc);
            goto done;
        }
    } else {
        lk_op_desc d = {.op = LK_OP_BATCH_NORM_BACKWARD,
                        .dtype = {xc->dtype, gout->dtype, LK_F32, LK_F32, xc->dtype, LK_F32, LK_F32}};
        d.batch_norm = (lk_batch_norm_params){.N = N, .C = C, .S = S, .M = M, .training = training};
        lk_status st = lk__backend_run(xc->device, &d, (void *[]){(void *)xd, (void *)gd, stats->data,
                                                                   wc ? wc->data : NULL, job.dx, job.dw, job.db});
        if (st) {
            lk_tensor_release(wc);
            goto done;
        }
    }
    lk_tensor_release(wc);
    /* moved: the gradient slots take these buffers instead of copying them */
    lk__accum_move(x, dx), dx = NULL;
    lk__accum_move(w, dw), dw = NULL;
    lk__accum_move(b, db), db = NULL;
done:
    lk_tensor_release(dx);
    lk_tensor_release(dw);
    lk_tensor_release(db);
}

static lk_status check_channel_vec(const lk_tensor *t, const char *what, const lk_tensor *x) {
    char st[128], sx[128];
    LK_TRY(lk__check_float("batch_norm", t, what)); /* f32, or 16-bit parameters (bf16-true) */
    if (t->ndim != 1 || t->shape[0] != x->shape[1])
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "batch_norm: %s %s does not match input %s (expected [%lld])", what,
                        lk_shape_str(t, st, sizeof st), lk_shape_str(x, sx, sizeof sx), (long long)x->shape[1]);
    return LK_STATUS_OK;
}

/* A host copy of a per-channel vector of any float dtype at its stride
 * (SyncBatchNorm's scalars): the span from element 0 to element C-1, read
 * from the tensor's device and, for the running statistics, written back
 * whole (the elements between are copied back unchanged). */
typedef struct {
    lk_tensor *t; /* NULL: absent */
    void *h;
    size_t bytes;
} host_vec;

static lk_status vec_in(lk_tensor *t, long C, host_vec *v) {
    *v = (host_vec){t, NULL, 0};
    if (!t || C <= 0) return LK_STATUS_OK;
    v->bytes = (size_t)((C - 1) * t->stride[0] + 1) * lk_dtype_size(t->dtype);
    if (!(v->h = lk_malloc(v->bytes))) return LK_STATUS_OUT_OF_MEMORY;
    return to_host(v->h, t->device, t->data, v->bytes);
}
static lk_status vec_out(const host_vec *v) { return v->h ? to_dev(v->t->device, v->t->data, v->h, v->bytes) : LK_STATUS_OK; }
static void vec_free(host_vec *v) {
    lk_free(v->h);
    v->h = NULL;
}
static float vec_get(const host_vec *v, long c) {
    const lk_tensor *t = v->t;
    if (t->dtype == LK_F32) return ((const float *)v->h)[c * t->stride[0]];
    uint16_t h = ((const uint16_t *)v->h)[c * t->stride[0]];
    return t->dtype == LK_BF16 ? lk_bf16_bits_to_f32(h) : lk_f16_bits_to_f32(h);
}
static void vec_set(host_vec *v, long c, float x) {
    const lk_tensor *t = v->t;
    if (t->dtype == LK_F32) ((float *)v->h)[c * t->stride[0]] = x;
    else ((uint16_t *)v->h)[c * t->stride[0]] = t->dtype == LK_BF16 ? lk_f32_to_bf16_bits(x) : lk_f32_to_f16_bits(x);
}

typedef struct {
    const void *xd; /* x and the output in x's dtype xt */
    void *od;
    float *stats;
    lk_tensor *running_mean, *running_var, *weight, *bias;
    long N, C, S;
    double M;
    float eps, momentum;
    bool training;
    int width;
    lk_dtype xt;
} bn_fwd_job;

/* SyncBatchNorm's statistics, as PyTorch's SyncBatchNorm: per channel
 * this rank's sum and sum of squares (one BN_STATS pass, the squares from
 * the deviations from this rank's own mean: lk_k_bn_channel_moments) and
 * its sample count, one [2C + 1] f64 buffer summed over the ranks in one
 * all-reduce. The count is reduced, not assumed: a rank with a short last
 * batch weighs what it holds. The global mean and biased variance
 * normalise; the unbiased one (over the global count) feeds the running
 * variance. j->xd, j->od and j->stats are on dev: the sums come back to the
 * host (bn_reduce), the mean and invstd go to stats, the scale / shift to
 * the apply pass; the running statistics, weight and bias are read (and
 * the first two written) through host copies on their own devices. */
static lk_status bn_sync_stats(lk_device dev, const bn_fwd_job *j, const bn_sync *sy_in, bn_sync *sy) {
    long N = j->N, C = j->C, S = j->S;
    size_t nc = (size_t)(C > 0 ? C : 0);
    double *v = lk_malloc((2 * nc + 1) * sizeof *v); /* sum [C], sum of squares [C], count */
    float *k = lk_malloc((4 * nc + 1) * sizeof *k); /* scale, shift per channel; then the host's [2, C] stats */
    float *mean = k ? k + 2 * nc : NULL, *invstd = k ? mean + nc : NULL;
    host_vec rm = {0}, rv = {0}, w = {0}, b = {0};
    bn_dbuf dv = {0}, dk = {0};
    lk_status st = v && k ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    if (!st) st = dbuf_alloc(dev, LK_F64, 2 * nc + 1, &dv);
    if (!st) st = bn_split_run(dev, LK_OP_BN_STATS, N, C, S, LK_BN_MOMENTS, false, j->xt, j->xd, LK_F32, NULL, NULL,
                               LK_F64, dv.p);
    if (!st) st = to_dev(dev, (double *)dv.p + 2 * nc, &j->M, sizeof j->M); /* the count rides along */
    if (!st) st = bn_reduce(sy_in, dev, dv.p, v, 2 * nc + 1, false);
    double M = st ? 0 : v[2 * nc];
    if (!st && M <= 1.0)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "batch_norm (sync): expected more than 1 value per channel over all "
                      "ranks when training, got %g", M);
    if (!st) st = vec_in(j->running_mean, C, &rm);
    if (!st) st = vec_in(j->running_var, C, &rv);
    if (!st) st = vec_in(j->weight, C, &w);
    if (!st) st = vec_in(j->bias, C, &b);
    for (long c = 0; !st && c < C; c++) {
        double m = v[c] / M, q = v[C + c] - v[c] * m; /* sum of squared deviations from the global mean */
        if (q < 0) q = 0; /* rounding of a constant channel */
        mean[c] = (float)m;
        invstd[c] = (float)(1.0 / sqrt(q / M + (double)j->eps));
        if (j->running_mean) {
            vec_set(&rm, c, (1.0f - j->momentum) * vec_get(&rm, c) + j->momentum * mean[c]);
            vec_set(&rv, c, (1.0f - j->momentum) * vec_get(&rv, c) + j->momentum * (float)(q / (M - 1)));
        }
        float scale = invstd[c] * (j->weight ? vec_get(&w, c) : 1.0f);
        k[c] = scale;
        k[C + c] = (j->bias ? vec_get(&b, c) : 0.0f) - mean[c] * scale;
    }
    if (!st) st = to_dev(dev, j->stats, mean, 2 * nc * sizeof *mean); /* mean and invstd: one [2, C] tensor */
    if (!st) st = vec_out(&rm);
    if (!st) st = vec_out(&rv);
    if (!st) st = dbuf_alloc(dev, LK_F32, 2 * nc, &dk);
    if (!st) st = to_dev(dev, dk.p, k, 2 * nc * sizeof *k);
    if (!st) st = bn_split_run(dev, LK_OP_BN_APPLY, N, C, S, LK_BN_SUM, false, j->xt, j->xd, LK_F32, NULL, dk.p, j->xt, j->od);
    *sy = (bn_sync){sy_in->red, sy_in->sum, sy_in->ctx, M};
    vec_free(&rm), vec_free(&rv), vec_free(&w), vec_free(&b);
    dbuf_free(&dv);
    dbuf_free(&dk);
    lk_free(v);
    lk_free(k);
    return st;
}

static lk_tensor *batch_norm_impl(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                                  lk_tensor *bias, bool training, float momentum, float eps, const bn_sync *sync);

lk_tensor *lk_batch_norm(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                         lk_tensor *bias, bool training, float momentum, float eps) {
    return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, NULL);
}

lk_tensor *lk_batch_norm_sync(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                              lk_tensor *bias, bool training, float momentum, float eps, lk_sum_fn sum, void *ctx) {
    bn_sync sy = {{0}, sum, ctx, 0};
    return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                           sum && training ? &sy : NULL);
}

lk_tensor *lk__batch_norm_sync_reducer(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                                       lk_tensor *bias, bool training, float momentum, float eps, const lk_bn_reducer *r) {
    bn_sync sy = {r ? *r : (lk_bn_reducer){0}, NULL, NULL, 0};
    return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                           r && r->sum && training ? &sy : NULL);
}

static lk_tensor *batch_norm_impl(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                                  lk_tensor *bias, bool training, float momentum, float eps, const bn_sync *sync) {
    LK_OP_CHECK_INPUTS(x);
    char sx[128];
    if (lk__same_device("batch_norm", 5, (lk_tensor *[]){x, running_mean, running_var, weight, bias})) return NULL;
    if (lk__check_float("batch_norm", x, "input")) return NULL;
    lk_shape_str(x, sx, sizeof sx);
    if (x->ndim < 2)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "batch_norm: input must be [N, C] or [N, C, H, W], got %s", sx),
               NULL;
    if ((running_mean && check_channel_vec(running_mean, "running_mean", x)) ||
        (running_var && check_channel_vec(running_var, "running_var", x)) ||
        (weight && check_channel_vec(weight, "weight", x)) || (bias && check_channel_vec(bias, "bias", x)))
        return NULL;
    if (!running_mean != !running_var)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "batch_norm: running_mean and running_var must be given together (one is NULL)"),
               NULL;
    if (!training && !running_mean)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "batch_norm: eval mode (training = false) needs running_mean and running_var"),
               NULL;
    if (!(eps >= 0.0f))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "batch_norm: eps must be >= 0, got %g", (double)eps), NULL;
    long N = x->shape[0], C = x->shape[1], S = N * C > 0 ? (long)(x->numel / (N * C)) : 0;
    double M = (double)N * (double)S;
    if (training && M <= 1.0 && C > 0 && !sync) /* with sync the count over all ranks decides */
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "batch_norm: expected more than 1 value per channel when training, got input %s", sx),
               NULL;

    /* same as input: a 16-bit x is kept as it is (no f32 copy) and gives a
     * 16-bit output; the statistics are f32 (stats), the backend widens */
    lk_tensor *xc = lk__contig_keep(x);
    lk_tensor *stats = xc ? lk__tensor_new_on(x->device, LK_F32, 2, (int64_t[]){2, C}) : NULL;
    lk_tensor *out = stats ? lk__tensor_new_on(x->device, x->dtype, x->ndim, x->shape) : NULL;
    if (!out) {
        lk_tensor_release(xc);
        lk_tensor_release(stats);
        return NULL;
    }
    bn_fwd_job job = {xc->data, out->data, stats->data, running_mean, running_var, weight, bias,
                      N, C, S, M, eps, momentum, training, bn_width(x->numel, C), x->dtype};
    bn_sync used = {0};
    if (sync) {
        lk_status st = bn_sync_stats(xc->device, &job, sync, &used);
        if (st) {
            lk_tensor_release(xc);
            lk_tensor_release(stats);
            lk_tensor_release(out);
            return NULL;
        }
    } else {
        lk_op_desc d = {.op = LK_OP_BATCH_NORM,
                        .dtype = {x->dtype, weight ? weight->dtype : LK_F32, bias ? bias->dtype : LK_F32,
                                  running_mean ? running_mean->dtype : LK_F32,
                                  running_var ? running_var->dtype : LK_F32, x->dtype, LK_F32}};
        d.batch_norm = (lk_batch_norm_params){
            .N = N, .C = C, .S = S, .M = M, .eps = eps, .momentum = momentum, .training = training,
            .stride = {weight ? weight->stride[0] : 0, bias ? bias->stride[0] : 0,
                       running_mean ? running_mean->stride[0] : 0, running_var ? running_var->stride[0] : 0}};
        if (lk__backend_run(xc->device, &d,
                            (void *[]){xc->data, weight ? weight->data : NULL, bias ? bias->data : NULL,
                                       running_mean ? running_mean->data : NULL,
                                       running_var ? running_var->data : NULL, out->data, stats->data})) {
            lk_tensor_release(xc);
            lk_tensor_release(stats);
            lk_tensor_release(out);
            return NULL;
        }
    }
    lk_tensor *in[3] = {x, NULL, NULL};
    int n_in = 1, iw = -1, ib = -1;
    if (weight) in[iw = n_in++] = weight;
    if (bias) in[ib = n_in++] = bias;
    lk_node *n = lk__record("batch_norm", batch_norm_backward, out, n_in, in);
    if (n) {
        n->a.i[0] = training;
        n->a.i[1] = iw;
        n->a.i[2] = ib;
        n->saved[0] = lk_tensor_retain(xc);
        n->saved[1] = lk_tensor_retain(stats);
        if (sync && !(n->extra = lk_malloc(sizeof used))) { /* the backward could not sync */
            lk_tensor_release(xc);
            lk_tensor_release(stats);
            lk_tensor_release(out);
            return NULL;
        }
        if (sync) memcpy(n->extra, &used, sizeof used);
    }
    lk_tensor_release(xc);
    lk_tensor_release(stats);
    return lk__op_result(out);
}

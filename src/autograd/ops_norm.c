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
 * bias, [3] the fused ReLU (lk_batch_norm_relu: the backward reads
 * node->out, the ReLU's output); saved[0] = contiguous x, saved[1] = [2, C] (mean, invstd) used,
 * saved[2] = SyncBatchNorm's reduced [2C + 1] sums (the count at 2C), with
 * the bn_sync in extra. */
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

/* SyncBatchNorm's values on a device the host may not read (cuda): the
 * passes, the all-reduce and the per-channel finish between them
 * (LK_OP_BN_FINISH, _BACKWARD) all read and write buffers on the op's
 * device, so a step with SyncBatchNorm copies nothing to the host (no
 * stream synchronisation, nothing that stops a graph capture) when the
 * communicator reads device memory. The host never dereferences a
 * tensor's memory here. */
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

/* SyncBatchNorm's one all-reduce of a pass: the n doubles at d (on dev)
 * summed over the ranks, in place. A communicator that reads dev's memory
 * (nccl; any on host memory, and a caller's function on the CPU) sums d
 * where it is: no copy. Else (shm or mpi with a GPU, a caller's function
 * on a GPU) the sums go through a host copy, reduced there and copied
 * back, so the finish after runs on the device either way: one code path
 * for the per-channel arithmetic (the CPU's bits on every route) and the
 * two copies the staging needs anyway. */
static lk_status bn_reduce(const bn_sync *sy, lk_device dev, double *d, size_t n) {
    bool host = lk_device_is_host(dev);
    if (sy->red.sum && (host || sy->red.device_memory)) return sy->red.sum(sy->red.ctx, dev, d, (int)n);
    if (host) return sy->sum(sy->ctx, d, (int)n);
    size_t bytes = n * sizeof *d;
    double *h = lk_malloc(bytes ? bytes : 1);
    if (!h) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = bytes ? lk_device_copy(LK_DEVICE_CPU, h, dev, d, bytes) : LK_STATUS_OK;
    if (!st) st = sy->red.sum ? sy->red.sum(sy->red.ctx, LK_DEVICE_CPU, h, (int)n) : sy->sum(sy->ctx, h, (int)n);
    if (!st && bytes) st = lk_device_copy(dev, d, LK_DEVICE_CPU, h, bytes);
    lk_free(h);
    return st;
}

/* SyncBatchNorm's backward: this rank's per-channel sums of g and
 * g * (x - mean) (one BN_STATS pass), summed over the ranks in one
 * all-reduce for the input gradient; the weight and bias gradients are
 * this rank's sums (DDP averages them afterwards, as PyTorch's
 * SyncBatchNorm leaves them). j's pointers are on dev (w f32 contiguous),
 * count is the forward's global count (device memory, the forward's
 * reduced buffer); the finish (dw, db and the apply pass's coefficients)
 * runs on dev (LK_OP_BN_FINISH_BACKWARD). */
static lk_status bn_sync_backward(lk_device dev, const bn_bwd_job *j, const bn_sync *sy, const double *count) {
    long N = j->N, C = j->C, S = j->S;
    size_t nc = (size_t)(C > 0 ? C : 0);
    bn_dbuf dtot = {0}, dk = {0};
    /* this rank's [2C], then every rank's [2C] */
    lk_status st = dbuf_alloc(dev, LK_F64, 4 * nc, &dtot);
    double *mine = dtot.p, *all = mine ? mine + 2 * nc : NULL;
    if (!st) st = bn_split_run(dev, LK_OP_BN_STATS, N, C, S, LK_BN_GRAD, false, j->xt, j->xd, j->gt, j->gd, j->mean,
                               LK_F64, mine);
    if (!st && nc) st = lk_device_copy(dev, all, dev, mine, 2 * nc * sizeof *mine);
    if (!st) st = bn_reduce(sy, dev, all, 2 * nc);
    if (!st && j->dx) st = dbuf_alloc(dev, LK_F32, 4 * nc, &dk);
    if (!st) {
        lk_op_desc d = {.op = LK_OP_BN_FINISH_BACKWARD, .dtype = {LK_F64, LK_F32, LK_F64, LK_F32, LK_F32, LK_F32, LK_F32}};
        d.bn_finish = (lk_bn_finish_params){.C = C};
        /* mean and invstd: one [2, C] tensor */
        st = lk__backend_run(dev, &d, (void *[]){mine, (void *)j->w, (void *)count, (void *)j->mean, j->dw, j->db, dk.p});
    }
    if (!st && j->dx)
        st = bn_split_run(dev, LK_OP_BN_APPLY, N, C, S, LK_BN_SUM, true, j->xt, j->xd, j->gt, j->gd, dk.p, j->xt,
                          j->dx);
    dbuf_free(&dtot);
    dbuf_free(&dk);
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
        /* the forward's reduced buffer (saved[2]): its last double is the count over every rank */
        const double *count = (const double *)n->saved[2]->data + 2 * (C > 0 ? C : 0);
        lk_status st = bn_sync_backward(xc->device, &job, n->extra, count);
        if (st) {
            lk_tensor_release(wc);
            goto done;
        }
    } else {
        bool relu = n->a.i[3] != 0;
        lk_op_desc d = {.op = LK_OP_BATCH_NORM_BACKWARD,
                        .dtype = {xc->dtype, gout->dtype, LK_F32, LK_F32, xc->dtype, LK_F32, LK_F32,
                                  relu ? n->out->dtype : LK_F32}};
        d.batch_norm = (lk_batch_norm_params){.N = N, .C = C, .S = S, .M = M, .training = training, .relu = relu};
        lk_status st = lk__backend_run(xc->device, &d,
                                       (void *[]){(void *)xd, (void *)gd, stats->data, wc ? wc->data : NULL, job.dx,
                                                  job.dw, job.db, relu ? n->out->data : NULL});
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
 * variance. Everything stays on dev (j->xd, j->od, j->stats and the
 * per-channel tensors are there): the count is written by a fill, the
 * finish (LK_OP_BN_FINISH) turns the reduced sums into the statistics, the
 * running statistics' update and the apply pass's scale and shift. On
 * success *sums is the reduced buffer (caller-owned), whose count the
 * backward reads. */
static lk_status bn_sync_stats(lk_device dev, const bn_fwd_job *j, const bn_sync *sy, lk_tensor **sums) {
    long N = j->N, C = j->C, S = j->S;
    size_t nc = (size_t)(C > 0 ? C : 0);
    bn_dbuf dv = {0}, dk = {0}; /* sum [C], sum of squares [C], count; scale, shift per channel */
    lk_status st = dbuf_alloc(dev, LK_F64, 2 * nc + 1, &dv);
    if (!st) st = bn_split_run(dev, LK_OP_BN_STATS, N, C, S, LK_BN_MOMENTS, false, j->xt, j->xd, LK_F32, NULL, NULL,
                               LK_F64, dv.p);
    if (!st) { /* the count rides along, written on the device (a fill, not a copy) */
        lk_op_desc d = {.op = LK_OP_FILL, .dtype = {LK_F64}};
        d.fill = (lk_fill_params){.ndim = 1, .shape = {1}, .sd = {1}, .value = j->M};
        st = lk__backend_run(dev, &d, (void *[]){(double *)dv.p + 2 * nc});
    }
    if (!st) st = bn_reduce(sy, dev, dv.p, 2 * nc + 1);
    /* more than one value per channel over the ranks: certain when this rank
     * holds more (every count is >= 0), so only a rank with at most one
     * reads the reduced count back (8 bytes; no copy in a normal step) */
    if (!st && j->M <= 1.0) {
        double M = 0;
        st = lk_device_copy(LK_DEVICE_CPU, &M, dev, (double *)dv.p + 2 * nc, sizeof M);
        if (!st && M <= 1.0)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "batch_norm (sync): expected more than 1 value per channel over "
                          "all ranks when training, got %g", M);
    }
    if (!st) st = dbuf_alloc(dev, LK_F32, 2 * nc, &dk);
    if (!st) {
        const lk_tensor *w = j->weight, *b = j->bias, *rm = j->running_mean, *rv = j->running_var;
        lk_op_desc d = {.op = LK_OP_BN_FINISH,
                        .dtype = {LK_F64, w ? w->dtype : LK_F32, b ? b->dtype : LK_F32, rm ? rm->dtype : LK_F32,
                                  rv ? rv->dtype : LK_F32, LK_F32, LK_F32}};
        d.bn_finish = (lk_bn_finish_params){C, j->eps, j->momentum,
                                            {w ? w->stride[0] : 0, b ? b->stride[0] : 0, rm ? rm->stride[0] : 0,
                                             rv ? rv->stride[0] : 0}};
        /* mean and invstd into stats: one [2, C] tensor */
        st = lk__backend_run(dev, &d, (void *[]){dv.p, w ? w->data : NULL, b ? b->data : NULL, rm ? rm->data : NULL,
                                                 rv ? rv->data : NULL, j->stats, dk.p});
    }
    if (!st) st = bn_split_run(dev, LK_OP_BN_APPLY, N, C, S, LK_BN_SUM, false, j->xt, j->xd, LK_F32, NULL, dk.p, j->xt, j->od);
    if (!st) *sums = lk_tensor_retain(dv.t);
    dbuf_free(&dv);
    dbuf_free(&dk);
    return st;
}

static lk_tensor *batch_norm_impl(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                                  lk_tensor *bias, bool training, float momentum, float eps, const bn_sync *sync,
                                  bool relu);

lk_tensor *lk_batch_norm(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                         lk_tensor *bias, bool training, float momentum, float eps) {
    return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, NULL, false);
}

/* One op where it can be: the CPU backend's batch norm with the ReLU in its
 * passes (lk_batch_norm_params.relu), which needs f32 per-channel vectors
 * (the mixed precisions' case; x may be 16-bit). Elsewhere (a GPU, 16-bit
 * weights) the two ops, whose bits the fused op reproduces. */
lk_tensor *lk_batch_norm_relu(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                              lk_tensor *bias, bool training, float momentum, float eps) {
    LK_OP_CHECK_INPUTS(x);
    bool fuse = x->device.kind == LK_CPU;
    lk_tensor *vec[4] = {running_mean, running_var, weight, bias};
    for (int i = 0; i < 4; i++) fuse = fuse && (!vec[i] || vec[i]->dtype == LK_F32);
    if (fuse) return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, NULL, true);
    lk_tensor *y = batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, NULL, false);
    return y ? lk_relu(y) : NULL;
}

lk_tensor *lk_batch_norm_sync(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                              lk_tensor *bias, bool training, float momentum, float eps, lk_sum_fn sum, void *ctx) {
    bn_sync sy = {{0}, sum, ctx};
    return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                           sum && training ? &sy : NULL, false);
}

lk_tensor *lk__batch_norm_sync_reducer(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                                       lk_tensor *bias, bool training, float momentum, float eps, const lk_bn_reducer *r) {
    bn_sync sy = {r ? *r : (lk_bn_reducer){0}, NULL, NULL};
    return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps,
                           r && r->sum && training ? &sy : NULL, false);
}

static lk_tensor *batch_norm_impl(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                                  lk_tensor *bias, bool training, float momentum, float eps, const bn_sync *sync,
                                  bool relu) {
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
    lk_tensor *sums = NULL; /* SyncBatchNorm's reduced buffer: the backward reads its count */
    if (sync) {
        lk_status st = bn_sync_stats(xc->device, &job, sync, &sums);
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
            .N = N, .C = C, .S = S, .M = M, .eps = eps, .momentum = momentum, .training = training, .relu = relu,
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
    lk_node *n = lk__record(relu ? "batch_norm_relu" : "batch_norm", batch_norm_backward, out, n_in, in);
    if (n) {
        n->a.i[0] = training;
        n->a.i[1] = iw;
        n->a.i[2] = ib;
        n->a.i[3] = relu;
        n->saved[0] = lk_tensor_retain(xc);
        n->saved[1] = lk_tensor_retain(stats);
        n->saved[2] = lk_tensor_retain(sums);
        if (sync && !(n->extra = lk_malloc(sizeof *sync))) { /* the backward could not sync */
            lk_tensor_release(xc);
            lk_tensor_release(stats);
            lk_tensor_release(sums);
            lk_tensor_release(out);
            return NULL;
        }
        if (sync) memcpy(n->extra, sync, sizeof *sync);
    }
    lk_tensor_release(xc);
    lk_tensor_release(stats);
    lk_tensor_release(sums);
    return lk__op_result(out);
}

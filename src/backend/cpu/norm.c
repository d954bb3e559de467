/* The CPU backend's normalisations, f32. Layer norm: the row kernels of
 * kernels/rows.h over M rows, forward (keeping each row's mean and rstd when
 * asked) and the fused backward (dx, and dw/db accumulated). Batch norm (one
 * process's statistics): per channel, on the plane kernels of
 * kernels/conv.h, whole channels per compute thread. SyncBatchNorm's
 * passes either side of its all-reduces (BN_STATS, BN_APPLY) run serially,
 * channel by channel, as they did in ops_norm.c. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

lk_status lk__cpu_layer_norm(const lk_op_desc *d, void *const *x) {
    int64_t M = d->layer_norm.M, L = d->layer_norm.L;
    if (d->op == LK_OP_LAYER_NORM) {
        const float *xd = x[0], *wd = x[1], *bd = x[2];
        float *od = x[3], *sd = x[4];
        if (L > 0)
            for (int64_t r = 0; r < M; r++) {
                float mean, rstd;
                lk_k_layer_norm_row(xd + r * L, od + r * L, L, wd, bd, d->layer_norm.eps, &mean, &rstd);
                if (sd) {
                    sd[2 * r] = mean;
                    sd[2 * r + 1] = rstd;
                }
            }
        return LK_STATUS_OK;
    }
    const float *xd = x[0], *gd = x[1], *sd = x[2], *wd = x[3];
    float *dx = x[4], *dw = x[5], *db = x[6], *dy = NULL;
    if (dx && wd && L > 0 && !(dy = lk_malloc((size_t)L * sizeof *dy))) return lk_last_status();
    for (int64_t r = 0; r < M; r++) {
        const float *xr = xd + r * L, *gr = gd + r * L;
        float mean = sd[2 * r], rstd = sd[2 * r + 1];
        if (dx) {
            const float *dyr = gr;
            if (wd) {
                memcpy(dy, gr, (size_t)L * sizeof *dy);
                lk_k_mul8(dy, wd, L);
                dyr = dy;
            }
            lk_k_layer_norm_backward_row(xr, dyr, mean, rstd, L, dx + r * L);
        }
        if (dw || db) lk_k_layer_norm_param_grad_row(xr, gr, mean, rstd, L, dw, db);
    }
    lk_free(dy);
    return LK_STATUS_OK;
}

/* ---- batch norm ----------------------------------------------------------------
 * Channels are independent: whole channels per core once the input is large
 * enough to pay for a thread (about a megabyte). */
static int bn_width(long N, long C, long S) {
    return (int64_t)N * C * S >= (1 << 18) ? lk__parallel_width(C) : 1;
}

typedef struct {
    const lk_batch_norm_params *p;
    const float *xd, *w, *b;
    float *rm, *rv, *od, *stats;
    int width;
} bn_fwd_job;

static void bn_fwd_task(void *ctx, int t) {
    const bn_fwd_job *j = ctx;
    const lk_batch_norm_params *p = j->p;
    long N = p->N, C = p->C, S = p->S;
    const int64_t sw = p->stride[0], sb = p->stride[1], srm = p->stride[2], srv = p->stride[3];
    double M = p->M;
    const float *xd = j->xd;
    float *mean = j->stats, *invstd = j->stats + C, *od = j->od;
    int64_t c0, c1;
    lk__task_range(C, t, j->width, 1, &c0, &c1);
    for (long c = c0; c < c1; c++) {
        if (p->training) {
            double s = 0, q = 0;
            for (long i = 0; i < N; i++) s += lk_k_plane_sum(xd + (i * C + c) * S, S);
            float m = (float)(s / M);
            for (long i = 0; i < N; i++) q += lk_k_plane_sqdev(xd + (i * C + c) * S, S, m);
            double var = q / M;
            mean[c] = m;
            invstd[c] = (float)(1.0 / sqrt(var + (double)p->eps));
            if (j->rm) {
                j->rm[c * srm] = (1.0f - p->momentum) * j->rm[c * srm] + p->momentum * m;
                j->rv[c * srv] = (1.0f - p->momentum) * j->rv[c * srv] + p->momentum * (float)(q / (M - 1));
            }
        } else {
            mean[c] = j->rm[c * srm];
            invstd[c] = (float)(1.0 / sqrt((double)j->rv[c * srv] + (double)p->eps));
        }
        float scale = invstd[c] * (j->w ? j->w[c * sw] : 1.0f);
        float shift = (j->b ? j->b[c * sb] : 0.0f) - mean[c] * scale;
        for (long i = 0; i < N; i++) lk_k_plane_affine(xd + (i * C + c) * S, S, scale, shift, od + (i * C + c) * S);
    }
}

typedef struct {
    const lk_batch_norm_params *p;
    const float *xd, *gd, *mean, *invstd, *w;
    float *dx, *dw, *db;
    int width;
} bn_bwd_job;

static void bn_bwd_task(void *ctx, int t) {
    const bn_bwd_job *j = ctx;
    const lk_batch_norm_params *p = j->p;
    long N = p->N, C = p->C, S = p->S;
    int64_t c0, c1;
    lk__task_range(C, t, j->width, 1, &c0, &c1);
    for (long c = c0; c < c1; c++) {
        /* channel c's sums of g and g * (x - mean) over the batch and the plane */
        double sg, sgx;
        lk_k_bn_channel_grad_sums(j->gd, j->xd, N, C, S, c, j->mean[c], &sg, &sgx);
        float is = j->invstd[c], wv = j->w ? j->w[c] : 1.0f;
        if (j->db) j->db[c] = (float)sg;
        if (j->dw) j->dw[c] = (float)(sgx * is);
        if (j->dx) {
            /* training: dx = w*is/M * (M*g - sum(g) - xhat * sum(g*xhat)), xhat = (x - mean)*is;
             * eval: the statistics are constants, dx = g * w * is. */
            float k1 = wv * is, k0 = 0.0f, k2 = 0.0f;
            if (p->training) {
                k0 = (float)(-(double)k1 * sg / p->M);
                k2 = (float)(-(double)k1 * is * is * sgx / p->M);
            }
            for (long i = 0; i < N; i++)
                lk_k_bn_backward_plane(j->gd + (i * C + c) * S, j->xd + (i * C + c) * S, S, j->mean[c], k0, k1, k2,
                                       j->dx + (i * C + c) * S);
        }
    }
}

lk_status lk__cpu_batch_norm(const lk_op_desc *d, void *const *x) {
    const lk_batch_norm_params *p = &d->batch_norm;
    if (d->op == LK_OP_BATCH_NORM) {
        bn_fwd_job job = {p, x[0], x[1], x[2], x[3], x[4], x[5], x[6], bn_width(p->N, p->C, p->S)};
        lk__parallel_run(job.width, bn_fwd_task, &job);
        return LK_STATUS_OK;
    }
    const float *stats = x[2];
    bn_bwd_job job = {p, x[0], x[1], stats, stats + p->C, x[3], x[4], x[5], x[6], bn_width(p->N, p->C, p->S)};
    lk__parallel_run(job.width, bn_bwd_task, &job);
    return LK_STATUS_OK;
}

/* ---- SyncBatchNorm's split passes ------------------------------------------------- */
/* Each pass its own function: with all five in one function GCC 12 spilled
 * the plane sums' accumulators and the forward of a [32, 16, 24, 24] batch
 * took 0.248 ms instead of 0.230 (ops_norm.c's old inline loops: 0.216). */
__attribute__((noinline)) static void bn_sum_pass(const float *xd, long N, long C, long S, double *out) {
    for (long c = 0; c < C; c++) {
        double s = 0;
        for (long i = 0; i < N; i++) s += lk_k_plane_sum(xd + (i * C + c) * S, S);
        out[c] = s;
    }
}

__attribute__((noinline)) static void bn_sqdev_pass(const float *xd, const float *mean, long N, long C, long S,
                                                    double *out) {
    for (long c = 0; c < C; c++) {
        double q = 0;
        for (long i = 0; i < N; i++) q += lk_k_plane_sqdev(xd + (i * C + c) * S, S, mean[c]);
        out[c] = q;
    }
}

__attribute__((noinline)) static void bn_grad_pass(const float *xd, const float *gd, const float *mean, long N, long C,
                                                   long S, double *out) {
    for (long c = 0; c < C; c++) lk_k_bn_channel_grad_sums(gd, xd, N, C, S, c, mean[c], &out[c], &out[C + c]);
}

__attribute__((noinline)) static void bn_affine_pass(const float *xd, const float *k, long N, long C, long S,
                                                     float *y) {
    for (long c = 0; c < C; c++)
        for (long i = 0; i < N; i++) lk_k_plane_affine(xd + (i * C + c) * S, S, k[c], k[C + c], y + (i * C + c) * S);
}

__attribute__((noinline)) static void bn_dx_pass(const float *xd, const float *gd, const float *k, long N, long C,
                                                 long S, float *dx) {
    for (long c = 0; c < C; c++)
        for (long i = 0; i < N; i++)
            lk_k_bn_backward_plane(gd + (i * C + c) * S, xd + (i * C + c) * S, S, k[c], k[C + c], k[2 * C + c],
                                   k[3 * C + c], dx + (i * C + c) * S);
}

lk_status lk__cpu_bn_split(const lk_op_desc *d, void *const *x) {
    const lk_bn_split_params *p = &d->bn_split;
    long N = p->N, C = p->C, S = p->S;
    if (d->op == LK_OP_BN_STATS) {
        if (p->stat == LK_BN_SUM) bn_sum_pass(x[0], N, C, S, x[3]);
        else if (p->stat == LK_BN_SQDEV) bn_sqdev_pass(x[0], x[2], N, C, S, x[3]);
        else bn_grad_pass(x[0], x[1], x[2], N, C, S, x[3]);
    } else if (p->backward) bn_dx_pass(x[0], x[1], x[2], N, C, S, x[3]);
    else bn_affine_pass(x[0], x[2], N, C, S, x[3]);
    return LK_STATUS_OK;
}

/* The CPU backend's normalisations, f32. Layer norm: the row kernels of
 * kernels/rows.h over M rows, forward (keeping each row's mean and rstd when
 * asked) and the fused backward (dx, and dw/db accumulated). Batch norm (one
 * process's statistics): per channel, on the plane kernels of
 * kernels/conv.h, whole channels per compute thread. SyncBatchNorm's
 * passes either side of its all-reduces (BN_STATS, BN_APPLY) and the
 * per-channel finish after each all-reduce (BN_FINISH, _BACKWARD) run
 * serially, channel by channel, as they did in ops_norm.c. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

lk_status LK_ISA(lk__cpu_layer_norm)(const lk_op_desc *d, void *const *x) {
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
 * enough to pay for a thread (about a megabyte). The big operands (x, y, dy,
 * dx: [N, C, S]) may be bf16/f16 when every per-channel vector is f32 (the
 * mixed precisions' case): each plane is then widened into a per-thread
 * buffer of S floats (exact) and the f32 plane kernels run on it, the same
 * arithmetic in the same order as on f32 operands, its output rounded once.
 * A channel's planes were widened in chunks of a megabyte or more before
 * (widen.c), which made a bf16 batch norm no faster than f32's: the chunks
 * went through memory, not the core's caches. */
static int bn_width(long N, long C, long S) {
    return (int64_t)N * C * S >= (1 << 18) ? lk__parallel_width(C) : 1;
}

/* Plane `at` (element offset) of a big operand as f32: in place, or widened into buf. */
static const float *bn_plane(lk_dtype t, const void *base, int64_t at, long S, float *buf) {
    if (t == LK_F32) return (const float *)base + at;
    lk_half_to_f32_n(t, buf, (const uint16_t *)base + at, (size_t)S);
    return buf;
}

/* Where a plane of an output is computed (in place, or buf), and its rounding into place. */
static float *bn_out(lk_dtype t, void *base, int64_t at, float *buf) {
    return t == LK_F32 ? (float *)base + at : buf;
}
static void bn_out_done(lk_dtype t, void *base, int64_t at, long S, const float *buf) {
    if (t != LK_F32) lk_f32_to_half_n(t, (uint16_t *)base + at, buf, (size_t)S);
}

/* Each task owns a range of channels and walks it sample by sample: plane
 * (i, c0), (i, c0 + 1), ... are adjacent in memory, so every pass streams
 * its channels' part of the tensor front to back. Walking one channel's
 * planes instead (a plane at a stride of C planes) left the hardware
 * prefetcher a run of 3 KB (28x28) or 196 bytes (7x7) before each jump:
 * in ResNet-20's step at batch 64 batch norm ran at a quarter of the
 * bandwidth of a triad. Each channel's sums still add its planes' f32 sums
 * in double in sample order, so the bits are those of the channel walk.
 * acc: [2C] doubles, the task's channels' sums. */
typedef struct {
    const lk_batch_norm_params *p;
    const void *xd;
    const float *w, *b;
    float *rm, *rv, *stats;
    void *od;
    lk_dtype xt, ot;
    float *buf; /* 2 S floats per task, when x or y is 16-bit */
    int width;
    double *acc;
} bn_fwd_job;

static void bn_fwd_task(void *ctx, int t) {
    const bn_fwd_job *j = ctx;
    const lk_batch_norm_params *p = j->p;
    long N = p->N, C = p->C, S = p->S;
    const int64_t sw = p->stride[0], sb = p->stride[1], srm = p->stride[2], srv = p->stride[3];
    double M = p->M;
    float *mean = j->stats, *invstd = j->stats + C;
    float *xb = j->buf ? j->buf + (size_t)t * 2 * S : NULL, *yb = xb ? xb + S : NULL;
    double *s = j->acc, *q = j->acc + C;
    int64_t c0, c1;
    lk__task_range(C, t, j->width, 1, &c0, &c1);
    if (p->training) {
        for (long c = c0; c < c1; c++) s[c] = q[c] = 0;
        for (long i = 0; i < N; i++)
            for (long c = c0; c < c1; c++) s[c] += lk_k_plane_sum(bn_plane(j->xt, j->xd, (i * C + c) * S, S, xb), S);
        for (long c = c0; c < c1; c++) mean[c] = (float)(s[c] / M);
        for (long i = 0; i < N; i++)
            for (long c = c0; c < c1; c++)
                q[c] += lk_k_plane_sqdev(bn_plane(j->xt, j->xd, (i * C + c) * S, S, xb), S, mean[c]);
        for (long c = c0; c < c1; c++) {
            double var = q[c] / M;
            float m = mean[c];
            invstd[c] = (float)(1.0 / sqrt(var + (double)p->eps));
            if (j->rm) {
                j->rm[c * srm] = (1.0f - p->momentum) * j->rm[c * srm] + p->momentum * m;
                j->rv[c * srv] = (1.0f - p->momentum) * j->rv[c * srv] + p->momentum * (float)(q[c] / (M - 1));
            }
        }
    } else {
        for (long c = c0; c < c1; c++) {
            mean[c] = j->rm[c * srm];
            invstd[c] = (float)(1.0 / sqrt((double)j->rv[c * srv] + (double)p->eps));
        }
    }
    for (long i = 0; i < N; i++)
        for (long c = c0; c < c1; c++) {
            float scale = invstd[c] * (j->w ? j->w[c * sw] : 1.0f);
            float shift = (j->b ? j->b[c * sb] : 0.0f) - mean[c] * scale;
            int64_t at = (i * C + c) * S;
            float *y = bn_out(j->ot, j->od, at, yb);
            /* the fused ReLU before a 16-bit output's rounding: rounding
             * keeps the sign and maps only +-0 to 0, so max(0, round(v)) =
             * round(max(0, v)) */
            if (p->relu) lk_k_plane_affine_relu(bn_plane(j->xt, j->xd, at, S, xb), S, scale, shift, y);
            else lk_k_plane_affine(bn_plane(j->xt, j->xd, at, S, xb), S, scale, shift, y);
            bn_out_done(j->ot, j->od, at, S, yb);
        }
}

typedef struct {
    const lk_batch_norm_params *p;
    const void *xd, *gd;
    const float *mean, *invstd, *w;
    void *dx;
    float *dw, *db;
    lk_dtype xt, gt, dxt;
    float *buf; /* BN_BWD_PLANES S floats per task, when x, dy, dx or y is 16-bit or relu */
    int width;
    double *acc;
    const void *yd; /* relu: the forward's output, in dtype yt; else NULL */
    lk_dtype yt;
} bn_bwd_job;

/* x, dy, dx, y (relu) and the masked dy (relu) */
#define BN_BWD_PLANES 5

/* Plane `at` of the gradient the batch norm itself sees: dy, or with the
 * fused ReLU dy where y > 0 (else 0), masked into mb. The separate ReLU's
 * backward wrote that plane to memory and the batch norm read it back
 * twice; here it is made per plane, in cache, for each of the two passes. */
static const float *bn_grad_plane(const bn_bwd_job *j, int64_t at, long S, float *gb, float *yb, float *mb) {
    const float *g = bn_plane(j->gt, j->gd, at, S, gb);
    if (!j->yd) return g;
    if (j->yt != LK_F32) {
        /* a 16-bit y is not widened: y > 0 on its bits is 0 < h <= +inf's
         * bits (sign clear, not 0, not NaN), as elementwise.c's relu16 */
        const uint16_t *h = (const uint16_t *)j->yd + at, top = j->yt == LK_BF16 ? 0x7f80 : 0x7c00;
        for (long i = 0; i < S; i++) mb[i] = (uint16_t)(h[i] - 1u) < top ? g[i] : 0.0f;
        return mb;
    }
    lk_k_plane_relu_mask(g, bn_plane(j->yt, j->yd, at, S, yb), S, mb);
    return mb;
}

static void bn_bwd_task(void *ctx, int t) {
    const bn_bwd_job *j = ctx;
    const lk_batch_norm_params *p = j->p;
    long N = p->N, C = p->C, S = p->S;
    float *xb = j->buf ? j->buf + (size_t)t * BN_BWD_PLANES * S : NULL, *gb = xb ? xb + S : NULL,
          *dxb = xb ? gb + S : NULL, *yb = xb ? dxb + S : NULL, *mb = xb ? yb + S : NULL;
    double *sg = j->acc, *sgx = j->acc + C;
    int64_t c0, c1;
    lk__task_range(C, t, j->width, 1, &c0, &c1);
    /* each channel's sums of g and g * (x - mean) over the batch and the
     * plane (lk_k_bn_channel_grad_sums, a plane at a time) */
    for (long c = c0; c < c1; c++) sg[c] = sgx[c] = 0;
    for (long i = 0; i < N; i++)
        for (long c = c0; c < c1; c++) {
            int64_t at = (i * C + c) * S;
            float a = 0.0f, q = 0.0f;
            lk_k_bn_backward_sums(bn_grad_plane(j, at, S, gb, yb, mb), bn_plane(j->xt, j->xd, at, S, xb), S,
                                  j->mean[c], &a, &q);
            sg[c] += a;
            sgx[c] += q;
        }
    for (long c = c0; c < c1; c++) {
        if (j->db) j->db[c] = (float)sg[c];
        if (j->dw) j->dw[c] = (float)(sgx[c] * j->invstd[c]);
    }
    if (!j->dx) return;
    for (long i = 0; i < N; i++)
        for (long c = c0; c < c1; c++) {
            /* training: dx = w*is/M * (M*g - sum(g) - xhat * sum(g*xhat)), xhat = (x - mean)*is;
             * eval: the statistics are constants, dx = g * w * is. */
            float is = j->invstd[c], wv = j->w ? j->w[c] : 1.0f;
            float k1 = wv * is, k0 = 0.0f, k2 = 0.0f;
            if (p->training) {
                k0 = (float)(-(double)k1 * sg[c] / p->M);
                k2 = (float)(-(double)k1 * is * is * sgx[c] / p->M);
            }
            int64_t at = (i * C + c) * S;
            lk_k_bn_backward_plane(bn_grad_plane(j, at, S, gb, yb, mb), bn_plane(j->xt, j->xd, at, S, xb), S,
                                   j->mean[c], k0, k1, k2, bn_out(j->dxt, j->dx, at, dxb));
            bn_out_done(j->dxt, j->dx, at, S, dxb);
        }
}

/* The big operands' dtypes are the descriptor's; every other is f32 here
 * (lk__cpu_bn_native_half says when a 16-bit descriptor may come). */
lk_status LK_ISA(lk__cpu_batch_norm)(const lk_op_desc *d, void *const *x) {
    const lk_batch_norm_params *p = &d->batch_norm;
    bool fwd = d->op == LK_OP_BATCH_NORM, mask = !fwd && p->relu;
    if (mask && !x[7])
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "cpu backend: batch_norm_backward with relu needs the output y");
    int width = bn_width(p->N, p->C, p->S), per = fwd ? 2 : BN_BWD_PLANES;
    /* the tasks' plane buffers, carved from this thread's grow-only scratch
     * (a malloc per call would fault in a fresh mapping above glibc's mmap
     * threshold: 3 planes of a 224x224 image per task are 600 KB). Free here:
     * widen.c holds it only around its own calls, and its chunk path runs
     * this function on all-f32 descriptors, which take no buffer. */
    float *buf = NULL;
    if ((lk__op_has_half(d) || mask) && !(buf = lk__cpu_scratch((size_t)width * (size_t)per * (size_t)(p->S > 0 ? p->S : 1))))
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "cpu backend: out of memory for batch norm's 16-bit plane buffers");
    double *acc = lk__cpu_scratch_for(LK__SCRATCH_NORM, 2 * sizeof(double) * (size_t)(p->C > 0 ? p->C : 1));
    if (!acc) return lk_error(LK_STATUS_OUT_OF_MEMORY, "cpu backend: out of memory for batch norm's channel sums");
    if (fwd) {
        bn_fwd_job job = {p, x[0], x[1], x[2], x[3], x[4], x[6], x[5], d->dtype[0], d->dtype[5], buf, width, acc};
        lk__parallel_run(job.width, bn_fwd_task, &job);
    } else {
        const float *stats = x[2];
        bn_bwd_job job = {p,          x[0],     x[1], stats, stats + p->C, x[3], x[4], x[5], x[6], d->dtype[0],
                          d->dtype[1], d->dtype[4], buf,  width, acc,          mask ? x[7] : NULL, d->dtype[7]};
        lk__parallel_run(job.width, bn_bwd_task, &job);
    }
    return LK_STATUS_OK;
}

#if !LK_ISA_VARIANT /* the baseline copy answers it */
/* Whether a 16-bit batch norm runs natively (above): only its big operands
 * are 16-bit. A 16-bit weight, bias or running statistic (bf16-true,
 * 16-true) takes widen.c's chunks. */
bool lk__cpu_bn_native_half(const lk_op_desc *d, void *const *x) {
    bool fwd = d->op == LK_OP_BATCH_NORM;
    static const int vec_f[] = {1, 2, 3, 4, 6}, vec_b[] = {2, 3, 5, 6};
    const int *v = fwd ? vec_f : vec_b;
    for (int k = 0; k < (fwd ? 5 : 4); k++)
        if (x[v[k]] && d->dtype[v[k]] != LK_F32) return false;
    return true;
}
#endif

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

__attribute__((noinline)) static void bn_moments_pass(const float *xd, long N, long C, long S, double *out) {
    for (long c = 0; c < C; c++) lk_k_bn_channel_moments(xd, N, C, S, c, &out[c], &out[C + c]);
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

/* SyncBatchNorm's per-channel finish between its all-reduce and the next
 * pass (lk_bn_finish_params): C values, serial. */
static void bn_finish(const lk_op_desc *d, void *const *x) {
    const lk_bn_finish_params *p = &d->bn_finish;
    if (d->op == LK_OP_BN_FINISH) {
        for (long c = 0; c < p->C; c++)
            lk_k_bn_finish_channel(x[0], p->C, c, p->eps, p->momentum, x[1], p->stride[0], x[2], p->stride[1], x[3],
                                   p->stride[2], x[4], p->stride[3], x[5], x[6]);
        return;
    }
    double M = *(const double *)x[2];
    for (long c = 0; c < p->C; c++) lk_k_bn_finish_backward_channel(x[0], p->C, c, x[1], M, x[3], x[4], x[5], x[6]);
}

lk_status LK_ISA(lk__cpu_bn_split)(const lk_op_desc *d, void *const *x) {
    if (d->op == LK_OP_BN_FINISH || d->op == LK_OP_BN_FINISH_BACKWARD) {
        bn_finish(d, x);
        return LK_STATUS_OK;
    }
    const lk_bn_split_params *p = &d->bn_split;
    long N = p->N, C = p->C, S = p->S;
    if (d->op == LK_OP_BN_STATS) {
        if (p->stat == LK_BN_SUM) bn_sum_pass(x[0], N, C, S, x[3]);
        else if (p->stat == LK_BN_SQDEV) bn_sqdev_pass(x[0], x[2], N, C, S, x[3]);
        else if (p->stat == LK_BN_MOMENTS) bn_moments_pass(x[0], N, C, S, x[3]);
        else bn_grad_pass(x[0], x[1], x[2], N, C, S, x[3]);
    } else if (p->backward) bn_dx_pass(x[0], x[1], x[2], N, C, S, x[3]);
    else bn_affine_pass(x[0], x[2], N, C, S, x[3]);
    return LK_STATUS_OK;
}

/* The CUDA backend's convolution pieces, pooling, batch norm and
 * SyncBatchNorm's passes, f32 (16-bit im2col here; the other 16-bit forms
 * through widen.cu), over the plane
 * bodies of backend/kernels/conv.h — the very loops the CPU backend runs,
 * one GPU thread per plane: im2col and col2im per (sample, channel) plane,
 * the bias add per (sample, channel) block, the bias gradient per channel
 * (samples in order, as the CPU sums them), max / avg / adaptive-avg
 * pooling and their adjoints per plane, batch norm and its backward per
 * channel (planes in order, as the CPU), SyncBatchNorm's per-channel sums
 * one thread per channel (planes in order) and its normalisation / input
 * gradient one thread per plane. Planes never share an output
 * element, so every result is the CPU's bits. Parallel only across planes:
 * correct and deterministic first, fast later (docs/GPU.md). */
#include "backend/cuda/common.cuh"

namespace {

__global__ void k_im2col(lk_im2col_params g, const float *x, float *cols) {
    long P = g.OH * g.OW, khw = g.kh * g.kw, HW = g.H * g.W;
    LK_CU_FOR(t, (int64_t)g.samples * g.C) {
        long j = (long)(t / g.C), c = (long)(t % g.C);
        lk_k_im2col_plane(x + (j * g.C + c) * HW, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.OH, g.OW,
                          cols + c * khw * g.ldc + j * P, g.ldc);
    }
}

/* bf16/f16 images into columns of their dtype: the bits move unchanged (autocast's conv2d). */
__global__ void k_im2col_u16(lk_im2col_params g, const uint16_t *x, uint16_t *cols) {
    long P = g.OH * g.OW, khw = g.kh * g.kw, HW = g.H * g.W;
    LK_CU_FOR(t, (int64_t)g.samples * g.C) {
        long j = (long)(t / g.C), c = (long)(t % g.C);
        lk_k_im2col_plane_u16(x + (j * g.C + c) * HW, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.OH,
                              g.OW, cols + c * khw * g.ldc + j * P, g.ldc);
    }
}

__global__ void k_col2im(lk_im2col_params g, float *cols, float *dx) {
    long P = g.OH * g.OW, khw = g.kh * g.kw, HW = g.H * g.W;
    LK_CU_FOR(t, (int64_t)g.samples * g.C) {
        long j = (long)(t / g.C), c = (long)(t % g.C);
        lk_k_col2im_plane(cols + c * khw * g.ldc + j * P, g.ldc, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh,
                          g.dw, g.OH, g.OW, dx + (j * g.C + c) * HW);
    }
}

__global__ void k_bias_add(lk_bias_params p, const float *y, const float *b, float *out, bool in_place) {
    long ld = p.samples * p.P;
    LK_CU_FOR(t, (int64_t)p.samples * p.O) {
        long s = (long)(t / p.O), o = (long)(t % p.O);
        if (in_place) {
            if (b) lk_k_plane_add_scalar(out + o * p.P, p.P, b[o]);
        } else {
            lk_k_plane_affine(y + o * ld + s * p.P, p.P, 1.0f, b ? b[o] : 0.0f, out + (s * p.O + o) * p.P);
        }
    }
}

__global__ void k_channel_sum(lk_bias_params p, const float *dy, float *db) {
    LK_CU_FOR(o, p.O) {
        for (long s = 0; s < p.samples; s++) db[o] += lk_k_plane_sum(dy + (s * p.O + o) * p.P, p.P);
    }
}

__global__ void k_pool(lk_pool_params g, const float *x, float *y, int *idx) {
    long no = g.OH * g.OW, ni = g.H * g.W;
    LK_CU_FOR(c, g.planes) {
        switch (g.kind) {
        case LK_POOL_MAX:
            lk_k_max_pool_plane(x + c * ni, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.OH, g.OW, y + c * no,
                                idx + c * no);
            break;
        case LK_POOL_AVG:
            lk_k_avg_pool_plane(x + c * ni, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.count_include_pad, g.OH,
                                g.OW, y + c * no);
            break;
        default: lk_k_adaptive_avg_plane(x + c * ni, g.H, g.W, g.OH, g.OW, y + c * no);
        }
    }
}

__global__ void k_pool_backward(lk_pool_params g, const float *dy, const int *idx, float *dx) {
    long no = g.OH * g.OW, ni = g.H * g.W;
    LK_CU_FOR(c, g.planes) {
        switch (g.kind) {
        case LK_POOL_MAX: lk_k_max_pool_backward_plane(dy + c * no, idx + c * no, no, dx + c * ni); break;
        case LK_POOL_AVG:
            lk_k_avg_pool_backward_plane(dy + c * no, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.count_include_pad,
                                         g.OH, g.OW, dx + c * ni);
            break;
        default: lk_k_adaptive_avg_backward_plane(dy + c * no, g.H, g.W, g.OH, g.OW, dx + c * ni);
        }
    }
}

/* Batch norm, one thread per channel with the CPU's per-channel loop
 * (kernels/conv.h's plane bodies; sums per plane in f32, across planes in
 * double, planes in order). */
__global__ void k_batch_norm(lk_batch_norm_params p, const float *xd, const float *w, const float *b, float *rm,
                             float *rv, float *od, float *stats) {
    long N = p.N, C = p.C, S = p.S;
    const int64_t sw = p.stride[0], sb = p.stride[1], srm = p.stride[2], srv = p.stride[3];
    float *mean = stats, *invstd = stats + C;
    LK_CU_FOR(c, C) {
        if (p.training) {
            double s = 0, q = 0;
            for (long i = 0; i < N; i++) s += lk_k_plane_sum(xd + (i * C + c) * S, S);
            float m = (float)(s / p.M);
            for (long i = 0; i < N; i++) q += lk_k_plane_sqdev(xd + (i * C + c) * S, S, m);
            double var = q / p.M;
            mean[c] = m;
            invstd[c] = (float)(1.0 / sqrt(var + (double)p.eps));
            if (rm) {
                rm[c * srm] = (1.0f - p.momentum) * rm[c * srm] + p.momentum * m;
                rv[c * srv] = (1.0f - p.momentum) * rv[c * srv] + p.momentum * (float)(q / (p.M - 1));
            }
        } else {
            mean[c] = rm[c * srm];
            invstd[c] = (float)(1.0 / sqrt((double)rv[c * srv] + (double)p.eps));
        }
        float scale = invstd[c] * (w ? w[c * sw] : 1.0f);
        float shift = (b ? b[c * sb] : 0.0f) - mean[c] * scale;
        for (long i = 0; i < N; i++) lk_k_plane_affine(xd + (i * C + c) * S, S, scale, shift, od + (i * C + c) * S);
    }
}

__global__ void k_batch_norm_backward(lk_batch_norm_params p, const float *xd, const float *gd, const float *stats,
                                      const float *w, float *dx, float *dw, float *db) {
    long N = p.N, C = p.C, S = p.S;
    const float *mean = stats, *invstd = stats + C;
    LK_CU_FOR(c, C) {
        double sg, sgx;
        lk_k_bn_channel_grad_sums(gd, xd, N, C, S, c, mean[c], &sg, &sgx);
        float is = invstd[c], wv = w ? w[c] : 1.0f;
        if (db) db[c] = (float)sg;
        if (dw) dw[c] = (float)(sgx * is);
        if (dx) {
            float k1 = wv * is, k0 = 0.0f, k2 = 0.0f;
            if (p.training) {
                k0 = (float)(-(double)k1 * sg / p.M);
                k2 = (float)(-(double)k1 * is * is * sgx / p.M);
            }
            for (long i = 0; i < N; i++)
                lk_k_bn_backward_plane(gd + (i * C + c) * S, xd + (i * C + c) * S, S, mean[c], k0, k1, k2,
                                       dx + (i * C + c) * S);
        }
    }
}

/* SyncBatchNorm's per-channel sums (lk_bn_split_params), one thread per
 * channel: the CPU's loop (plane sums in f32, across planes in double, in order). */
__global__ void k_bn_stats(lk_bn_split_params p, const float *xd, const float *gd, const float *mean, double *out) {
    long N = p.N, C = p.C, S = p.S;
    LK_CU_FOR(c, C) {
        if (p.stat == LK_BN_GRAD) {
            lk_k_bn_channel_grad_sums(gd, xd, N, C, S, (long)c, mean[c], &out[c], &out[C + c]);
            continue;
        }
        if (p.stat == LK_BN_MOMENTS) {
            lk_k_bn_channel_moments(xd, N, C, S, (long)c, &out[c], &out[C + c]);
            continue;
        }
        double s = 0;
        for (long i = 0; i < N; i++)
            s += p.stat == LK_BN_SUM ? lk_k_plane_sum(xd + (i * C + c) * S, S)
                                     : lk_k_plane_sqdev(xd + (i * C + c) * S, S, mean[c]);
        out[c] = s;
    }
}

/* The normalisation (coef [2, C]: scale, shift) or the input gradient (coef
 * [4, C]: mean, k0, k1, k2) from the all-reduced sums, one thread per (sample, channel) plane. */
__global__ void k_bn_apply(lk_bn_split_params p, const float *xd, const float *gd, const float *k, float *y) {
    long C = p.C, S = p.S;
    LK_CU_FOR(t, (int64_t)p.N * C) {
        long c = (long)(t % C);
        if (p.backward)
            lk_k_bn_backward_plane(gd + t * S, xd + t * S, S, k[c], k[C + c], k[2 * C + c], k[3 * C + c], y + t * S);
        else lk_k_plane_affine(xd + t * S, S, k[c], k[C + c], y + t * S);
    }
}

/* SyncBatchNorm's per-channel finish (lk_bn_finish_params), one thread per
 * channel: the CPU's body (kernels/conv.h), so the values between the
 * all-reduce and the next pass never leave the device. */
__global__ void k_bn_finish(lk_bn_finish_params p, const double *sums, const float *w, const float *b, float *rm,
                            float *rv, float *stats, float *coef) {
    LK_CU_FOR(c, p.C)
    lk_k_bn_finish_channel(sums, p.C, (long)c, p.eps, p.momentum, w, p.stride[0], b, p.stride[1], rm, p.stride[2], rv,
                           p.stride[3], stats, coef);
}

__global__ void k_bn_finish_backward(lk_bn_finish_params p, const double *sums, const float *w, const double *count,
                                     const float *stats, float *dw, float *db, float *coef) {
    LK_CU_FOR(c, p.C) lk_k_bn_finish_backward_channel(sums, p.C, (long)c, w, *count, stats, dw, db, coef);
}

} // namespace

extern "C" int lk__cuda_conv(const lk_op_desc *d, void *const *x) {
    LK_CU_REQUIRE_STREAM();
    if (d->op != LK_OP_IM2COL && lk__op_has_half(d)) return lk__cuda_widened(d, x, lk__cuda_conv);
    switch (d->op) {
    case LK_OP_IM2COL:
    case LK_OP_COL2IM: {
        const lk_im2col_params *g = &d->im2col;
        int64_t n = (int64_t)g->samples * g->C;
        if (n <= 0) return 0;
        if (d->op == LK_OP_IM2COL && d->dtype[0] != LK_F32)
            k_im2col_u16<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(*g, (const uint16_t *)x[0], (uint16_t *)x[1]);
        else if (d->op == LK_OP_IM2COL)
            k_im2col<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(*g, (const float *)x[0], (float *)x[1]);
        else k_col2im<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(*g, (float *)x[0], (float *)x[1]);
        break;
    }
    case LK_OP_BIAS_ADD: {
        const lk_bias_params *p = &d->bias;
        bool in_place = p->samples == 1 && x[0] == x[2];
        int64_t n = (int64_t)p->samples * p->O;
        if (n > 0)
            k_bias_add<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, (const float *)x[0], (const float *)x[1], (float *)x[2],
                                                           in_place);
        break;
    }
    case LK_OP_CHANNEL_SUM:
        if (d->bias.O > 0)
            k_channel_sum<<<lk_cu_blocks(d->bias.O), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->bias, (const float *)x[0], (float *)x[1]);
        break;
    case LK_OP_POOL2D:
        if (d->pool.planes > 0)
            k_pool<<<lk_cu_blocks(d->pool.planes), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->pool, (const float *)x[0], (float *)x[1],
                                                                    (int *)x[2]);
        break;
    case LK_OP_POOL2D_BACKWARD:
        if (d->pool.planes > 0)
            k_pool_backward<<<lk_cu_blocks(d->pool.planes), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->pool, (const float *)x[0],
                                                                             (const int *)x[1], (float *)x[2]);
        break;
    case LK_OP_BATCH_NORM:
        if (d->batch_norm.C > 0)
            k_batch_norm<<<lk_cu_blocks(d->batch_norm.C), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                d->batch_norm, (const float *)x[0], (const float *)x[1], (const float *)x[2], (float *)x[3],
                (float *)x[4], (float *)x[5], (float *)x[6]);
        break;
    case LK_OP_BATCH_NORM_BACKWARD:
        if (d->batch_norm.C > 0)
            k_batch_norm_backward<<<lk_cu_blocks(d->batch_norm.C), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                d->batch_norm, (const float *)x[0], (const float *)x[1], (const float *)x[2], (const float *)x[3],
                (float *)x[4], (float *)x[5], (float *)x[6]);
        break;
    case LK_OP_BN_STATS:
        if (d->bn_split.C > 0)
            k_bn_stats<<<lk_cu_blocks(d->bn_split.C), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->bn_split, (const float *)x[0],
                                                                        (const float *)x[1], (const float *)x[2],
                                                                        (double *)x[3]);
        break;
    case LK_OP_BN_APPLY: {
        int64_t n = (int64_t)d->bn_split.N * d->bn_split.C;
        if (n > 0)
            k_bn_apply<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(d->bn_split, (const float *)x[0], (const float *)x[1],
                                                            (const float *)x[2], (float *)x[3]);
        break;
    }
    case LK_OP_BN_FINISH:
        if (d->bn_finish.C > 0)
            k_bn_finish<<<lk_cu_blocks(d->bn_finish.C), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                d->bn_finish, (const double *)x[0], (const float *)x[1], (const float *)x[2], (float *)x[3],
                (float *)x[4], (float *)x[5], (float *)x[6]);
        break;
    case LK_OP_BN_FINISH_BACKWARD:
        if (d->bn_finish.C > 0)
            k_bn_finish_backward<<<lk_cu_blocks(d->bn_finish.C), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                d->bn_finish, (const double *)x[0], (const float *)x[1], (const double *)x[2], (const float *)x[3],
                (float *)x[4], (float *)x[5], (float *)x[6]);
        break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

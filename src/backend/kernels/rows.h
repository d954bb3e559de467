/* Kernel bodies that run along rows in 8 lanes: softmax, cross-entropy, BCE,
 * layer norm, and the Philox blocks behind dropout's mask. Part of
 * backend/kernels.h (include that: it defines LK_KERNEL). */
/* ==== softmax / cross-entropy / BCE / layer-norm kernel bodies
 *      (owner: autograd/ops_softmax.c, autograd/ops_layers.c) ====
 * Row loops run in blocks of 8 independent lanes with a scalar tail: a fixed
 * 8-wide block vectorises at any optimisation level (GCC's -O2 cost model
 * refuses loops of unknown trip count), and the lanes fix the summation
 * order, so results do not depend on the ISA or the compiler's choices. The
 * block bound is written n - n % 8 so that GCC does not warn about the tail
 * once n is a constant after inlining. */
#ifndef LK_KERNELS_OPS_A_SECTION
#define LK_KERNELS_OPS_A_SECTION

#include <stdint.h>

#define LK_K_LANES 8
#ifdef __CUDACC__
#define LK_K_RESTRICT __restrict__
#else
#define LK_K_RESTRICT restrict
#endif

/* exp(x) in plain arithmetic (no libm call, no floorf), so a block of them
 * vectorises: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, with n
 * rounded by the 1.5 * 2^23 trick, and Cephes' degree-6 polynomial. Max
 * relative error 1e-7 (< 2 ulp) on [-87.5, 88.5] (tests/autograd/test_ops_a.c
 * sweeps it); 0 below -87.5 (so exp(-inf) = 0 for masked rows), +inf above
 * 88.5, NaN stays NaN. */
LK_KERNEL float lk_k_expf(float x) {
    float xc = x >= -87.5f ? x : -87.5f; /* also maps NaN to a finite value before the int cast */
    xc = xc <= 88.5f ? xc : 88.5f;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int i; float f; } s;
    s.i = ((n > 127.0f ? 127 : (int)n) + 127) << 23; /* 2^n for n in [-126, 127] */
    float y = p * s.f;
    y = n > 127.0f ? y * 2.0f : y; /* n = 128 near the overflow edge */
    y = x < -87.5f ? 0.0f : y;
    y = x > 88.5f ? INFINITY : y;
    return x != x ? x : y;
}

LK_KERNEL float lk_k_max8(const float *x, long n) {
    float m[LK_K_LANES];
    for (int j = 0; j < LK_K_LANES; j++) m[j] = -INFINITY;
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float r = m[0];
    for (int j = 1; j < LK_K_LANES; j++) r = m[j] > r ? m[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

LK_KERNEL float lk_k_sum8(const float *x, long n) {
    float a[LK_K_LANES] = {0};
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) a[j] += x[i + j];
    float r = 0.0f;
    for (int j = 0; j < LK_K_LANES; j++) r += a[j];
    for (; i < n; i++) r += x[i];
    return r;
}

/* sum(x * y) over n elements. */
LK_KERNEL float lk_k_dot8(const float *x, const float *y, long n) {
    float a[LK_K_LANES] = {0};
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) a[j] += x[i + j] * y[i + j];
    float r = 0.0f;
    for (int j = 0; j < LK_K_LANES; j++) r += a[j];
    for (; i < n; i++) r += x[i] * y[i];
    return r;
}

/* y = exp(x - m); returns sum(y). The exp polynomial is a long dependent
 * chain, so the main loop takes 16 lanes at once (1.7x faster than 8 on the
 * AVX-512 build machine); rows shorter than 16 still get an 8-lane block. */
LK_KERNEL float lk_k_exp_sum8(const float *LK_K_RESTRICT x, float *LK_K_RESTRICT y, long n, float m) {
    float a[2 * LK_K_LANES] = {0};
    long i = 0;
    for (; i < n - n % (2 * LK_K_LANES); i += 2 * LK_K_LANES)
        for (int j = 0; j < 2 * LK_K_LANES; j++) {
            float e = lk_k_expf(x[i + j] - m);
            y[i + j] = e;
            a[j] += e;
        }
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) {
            float e = lk_k_expf(x[i + j] - m);
            y[i + j] = e;
            a[j] += e;
        }
    float r = 0.0f;
    for (int j = 0; j < 2 * LK_K_LANES; j++) r += a[j];
    for (; i < n; i++) {
        float e = lk_k_expf(x[i] - m);
        y[i] = e;
        r += e;
    }
    return r;
}

/* y = x * s + b. */
LK_KERNEL void lk_k_axpb8(const float *LK_K_RESTRICT x, float *LK_K_RESTRICT y, long n, float s, float b) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] = x[i + j] * s + b;
    for (; i < n; i++) y[i] = x[i] * s + b;
}

/* y *= s, in place. */
LK_KERNEL void lk_k_scale8(float *y, long n, float s) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] *= s;
    for (; i < n; i++) y[i] *= s;
}

/* y = (x - m) - logs, in that order as PyTorch does: m + logs would round
 * away the small part when the logits are large. */
LK_KERNEL void lk_k_log_softmax_finish8(const float *LK_K_RESTRICT x, float *LK_K_RESTRICT y, long n, float m,
                                        float logs) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] = (x[i + j] - m) - logs;
    for (; i < n; i++) y[i] = (x[i] - m) - logs;
}

/* Softmax (log_out = 0) or log-softmax (log_out = 1) of one contiguous row,
 * max-subtracted as PyTorch does: y = exp(x - m) / sum, or
 * y = (x - m) - log(sum). x and y must not overlap. */
LK_KERNEL void lk_k_softmax_row(const float *x, float *y, long n, int log_out) {
    float m = lk_k_max8(x, n);
    float s = lk_k_exp_sum8(x, y, n, m);
    if (log_out) lk_k_log_softmax_finish8(x, y, n, m, logf(s));
    else lk_k_scale8(y, n, 1.0f / s);
}

/* The same over the middle axis of a [C, inner] block (softmax over a dim
 * that is not the last): lanes run along `inner`. m and s are scratch of
 * `inner` floats each. */
LK_KERNEL void lk_k_softmax_cols(const float *x, float *y, long C, long inner, float *m, float *s, int log_out) {
    for (long j = 0; j < inner; j++) {
        m[j] = -INFINITY;
        s[j] = 0.0f;
    }
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++) m[j] = x[c * inner + j] > m[j] ? x[c * inner + j] : m[j];
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++) {
            float e = lk_k_expf(x[c * inner + j] - m[j]);
            y[c * inner + j] = e;
            s[j] += e;
        }
    for (long j = 0; j < inner; j++) s[j] = log_out ? logf(s[j]) : 1.0f / s[j];
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++)
            y[c * inner + j] = log_out ? (x[c * inner + j] - m[j]) - s[j] : y[c * inner + j] * s[j];
}

/* Backward of a softmax row from its output y and output gradient g:
 * softmax: dx = y * (g - sum(g * y)); log-softmax: dx = g - exp(y) * sum(g). */
LK_KERNEL void lk_k_softmax_backward_row(const float *LK_K_RESTRICT y, const float *LK_K_RESTRICT g,
                                          float *LK_K_RESTRICT dx, long n, int log_out) {
    long i = 0;
    if (log_out) {
        float sg = lk_k_sum8(g, n);
        for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = g[i + j] - lk_k_expf(y[i + j]) * sg;
        for (; i < n; i++) dx[i] = g[i] - lk_k_expf(y[i]) * sg;
    } else {
        float d = lk_k_dot8(g, y, n);
        for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = y[i + j] * (g[i + j] - d);
        for (; i < n; i++) dx[i] = y[i] * (g[i] - d);
    }
}

/* Column form of the above over a [C, inner] block; acc is scratch of `inner`. */
LK_KERNEL void lk_k_softmax_backward_cols(const float *y, const float *g, float *dx, long C, long inner, float *acc,
                                          int log_out) {
    for (long j = 0; j < inner; j++) acc[j] = 0.0f;
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++) acc[j] += log_out ? g[c * inner + j] : g[c * inner + j] * y[c * inner + j];
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++) {
            long k = c * inner + j;
            dx[k] = log_out ? g[k] - lk_k_expf(y[k]) * acc[j] : y[k] * (g[k] - acc[j]);
        }
}

/* Fused log-softmax + weighted, label-smoothed NLL of one row of C logits z
 * for target t (0 <= t < C), as PyTorch composes it:
 *   nll = -w[t] * logp[t],  smooth = -sum_c w[c] * logp[c]  (w = 1 when NULL)
 * and loss = (1 - eps) * nll + eps / C * smooth (the caller combines, since
 * the mean divides both by the same total weight). Writes the softmax into p
 * (scratch of C floats; exact probabilities only when want_p). */
LK_KERNEL float lk_k_xent_row(const float *z, float *p, long C, long t, float wt, const float *w, float eps,
                              int want_p, float *smooth) {
    float m = lk_k_max8(z, C);
    float s = lk_k_exp_sum8(z, p, C, m);
    float logs = logf(s);
    float nll = -wt * ((z[t] - m) - logs);
    if (eps > 0.0f) {
        /* -sum_c w_c logp_c with -logp_c = (m - z_c) + logs, per element as
         * PyTorch's log_softmax rounds it (m + logs would lose digits). */
        float a[LK_K_LANES] = {0}, r = 0.0f;
        long i = 0;
        if (w) {
            for (; i < C - C % LK_K_LANES; i += LK_K_LANES)
                for (int j = 0; j < LK_K_LANES; j++) a[j] += w[i + j] * ((m - z[i + j]) + logs);
            for (; i < C; i++) r += w[i] * ((m - z[i]) + logs);
        } else {
            for (; i < C - C % LK_K_LANES; i += LK_K_LANES)
                for (int j = 0; j < LK_K_LANES; j++) a[j] += (m - z[i + j]) + logs;
            for (; i < C; i++) r += (m - z[i]) + logs;
        }
        for (int j = 0; j < LK_K_LANES; j++) r += a[j];
        *smooth = r;
    } else {
        *smooth = 0.0f;
    }
    if (want_p) lk_k_scale8(p, C, 1.0f / s);
    return nll;
}

/* Gradient of the row loss above w.r.t. the logits, scaled by coef:
 *   dx_c = coef * (p_c * ((1-eps) w_t + eps/C * W) - (1-eps) w_t [c == t] - eps/C * w_c)
 * where W = sum_c w_c (C when unweighted). */
LK_KERNEL void lk_k_xent_row_grad(const float *LK_K_RESTRICT p, float *LK_K_RESTRICT dx, long C, long t, float wt, const float *w, float W,
                                  float eps, float coef) {
    float es = eps / (float)C;
    float a = coef * ((1.0f - eps) * wt + es * W), b = coef * es;
    long i = 0;
    if (w) {
        for (; i < C - C % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = p[i + j] * a - b * w[i + j];
        for (; i < C; i++) dx[i] = p[i] * a - b * w[i];
    } else {
        for (; i < C - C % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = p[i + j] * a - b;
        for (; i < C; i++) dx[i] = p[i] * a - b;
    }
    dx[t] -= coef * (1.0f - eps) * wt;
}

/* The regression losses of one element, of diff = x - t (LK_OP_LOSS), and
 * their derivative in x: mse diff^2; l1 |diff|; smooth_l1 0.5 diff^2 / beta
 * below beta, |diff| - 0.5 beta above. A backend's loop over elements calls
 * these with a constant kind, so each kind's loop compiles on its own. */
typedef enum { LK_PLOSS_MSE, LK_PLOSS_L1, LK_PLOSS_SMOOTH_L1 } lk_ploss_kind;

LK_KERNEL float lk_k_ploss(int kind, float diff, float beta) {
    switch (kind) {
    case LK_PLOSS_MSE: return diff * diff;
    case LK_PLOSS_L1: return fabsf(diff);
    default: return fabsf(diff) < beta ? 0.5f * diff * diff / beta : fabsf(diff) - 0.5f * beta;
    }
}

LK_KERNEL float lk_k_ploss_dx(int kind, float diff, float beta) {
    float sign = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f);
    switch (kind) {
    case LK_PLOSS_MSE: return 2.0f * diff;
    case LK_PLOSS_L1: return sign;
    default: return fabsf(diff) < beta ? diff / beta : sign;
    }
}

/* Binary cross-entropy on probabilities, PyTorch's form with each log clamped
 * to >= -100 so x = 0 or 1 gives a finite loss:
 *   loss = (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100). */
LK_KERNEL float lk_k_bce(float x, float t) {
    float l1 = log1pf(-x), l0 = logf(x);
    l1 = l1 > -100.0f ? l1 : -100.0f;
    l0 = l0 > -100.0f ? l0 : -100.0f;
    return (t - 1.0f) * l1 - t * l0;
}
/* d/dx as PyTorch computes it: (x - t) / max((1 - x) x, 1e-12). */
LK_KERNEL float lk_k_bce_dx(float x, float t) {
    float d = (1.0f - x) * x;
    return (x - t) / (d > 1e-12f ? d : 1e-12f);
}
/* d/dt: max(log1p(-x), -100) - max(log(x), -100). */
LK_KERNEL float lk_k_bce_dt(float x) {
    float l1 = log1pf(-x), l0 = logf(x);
    return (l1 > -100.0f ? l1 : -100.0f) - (l0 > -100.0f ? l0 : -100.0f);
}

/* Binary cross-entropy on logits, stable for any x:
 *   loss = (1 - t) x + (1 + (pw - 1) t) softplus(-x),
 *   softplus(-x) = max(-x, 0) + log1p(exp(-|x|))   (pw = 1: no pos_weight). */
LK_KERNEL float lk_k_softplus_neg(float x) {
    float ax = fabsf(x);
    return (x < 0.0f ? -x : 0.0f) + log1pf(expf(-ax));
}
LK_KERNEL float lk_k_bce_logits(float x, float t, float pw) {
    return (1.0f - t) * x + (1.0f + (pw - 1.0f) * t) * lk_k_softplus_neg(x);
}
/* d/dx = (1 + (pw - 1) t) sigmoid(x) - pw t;  d/dt = (pw - 1) softplus(-x) - x. */
LK_KERNEL float lk_k_bce_logits_dx(float x, float t, float pw) {
    float sg = x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
    return (1.0f + (pw - 1.0f) * t) * sg - pw * t;
}
LK_KERNEL float lk_k_bce_logits_dt(float x, float pw) { return (pw - 1.0f) * lk_k_softplus_neg(x) - x; }

/* y = x * w (+ b): the affine part of a normalisation. */
LK_KERNEL void lk_k_mul8(float *LK_K_RESTRICT y, const float *LK_K_RESTRICT w, long n) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] *= w[i + j];
    for (; i < n; i++) y[i] *= w[i];
}
LK_KERNEL void lk_k_add8(float *LK_K_RESTRICT y, const float *LK_K_RESTRICT b, long n) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] += b[i + j];
    for (; i < n; i++) y[i] += b[i];
}

/* Layer norm of one row of n: mean, biased variance (two passes, in lanes),
 * y = (x - mean) * rstd * w + b (w, b may be NULL). Returns mean and rstd. */
LK_KERNEL void lk_k_layer_norm_row(const float *x, float *y, long n, const float *w, const float *b, float eps,
                                   float *mean_out, float *rstd_out) {
    float mean = lk_k_sum8(x, n) / (float)n;
    float a[LK_K_LANES] = {0}, var = 0.0f;
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) a[j] += (x[i + j] - mean) * (x[i + j] - mean);
    for (int j = 0; j < LK_K_LANES; j++) var += a[j];
    for (; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)n;
    float rstd = 1.0f / sqrtf(var + eps);
    lk_k_axpb8(x, y, n, rstd, -mean * rstd);
    if (w) lk_k_mul8(y, w, n);
    if (b) lk_k_add8(y, b, n);
    *mean_out = mean;
    *rstd_out = rstd;
}

/* Backward of one layer-norm row (the fused formula): with xh = (x - mean) rstd
 * and dy = g * w (the caller passes dy, i.e. g itself when there is no w),
 *   dx = rstd * (dy - mean(dy) - xh * mean(dy * xh)). */
LK_KERNEL void lk_k_layer_norm_backward_row(const float *LK_K_RESTRICT x, const float *LK_K_RESTRICT dy, float mean,
                                            float rstd, long n, float *LK_K_RESTRICT dx) {
    float s1[LK_K_LANES] = {0}, s2[LK_K_LANES] = {0}, sdy = 0.0f, sdyx = 0.0f;
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) {
            s1[j] += dy[i + j];
            s2[j] += dy[i + j] * ((x[i + j] - mean) * rstd);
        }
    for (int j = 0; j < LK_K_LANES; j++) {
        sdy += s1[j];
        sdyx += s2[j];
    }
    for (; i < n; i++) {
        sdy += dy[i];
        sdyx += dy[i] * ((x[i] - mean) * rstd);
    }
    float m1 = sdy / (float)n, m2 = sdyx / (float)n;
    for (i = 0; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = rstd * (dy[i + j] - m1 - ((x[i + j] - mean) * rstd) * m2);
    for (; i < n; i++) dx[i] = rstd * (dy[i] - m1 - ((x[i] - mean) * rstd) * m2);
}

/* dw += g * (x - mean) rstd and db += g over one row (either may be NULL). */
LK_KERNEL void lk_k_layer_norm_param_grad_row(const float *LK_K_RESTRICT x, const float *LK_K_RESTRICT g, float mean,
                                              float rstd, long n, float *LK_K_RESTRICT dw, float *LK_K_RESTRICT db) {
    long i = 0;
    if (dw) {
        for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dw[i + j] += g[i + j] * ((x[i + j] - mean) * rstd);
        for (; i < n; i++) dw[i] += g[i] * ((x[i] - mean) * rstd);
    }
    if (db) lk_k_add8(db, g, n);
}

/* Philox4x32-10 (the round function of src/core/rng.c) on LK_K_LANES
 * consecutive counters at once, ctr + j with the carry into ctr[1] as
 * lk_rng_u32 advances it; block j's four words land in out[4j .. 4j+3].
 * Lanes in arrays so the 32x32->64 multiplies vectorise; dropout masks come
 * from here (tests check it against lk_philox4x32_10). */
LK_KERNEL void lk_k_philox4x32_10_x8(const uint32_t ctr[4], const uint32_t key[2], uint32_t *out) {
    uint32_t x0[LK_K_LANES], x1[LK_K_LANES], x2[LK_K_LANES], x3[LK_K_LANES], k0 = key[0], k1 = key[1];
    for (int j = 0; j < LK_K_LANES; j++) {
        x0[j] = ctr[0] + (uint32_t)j;
        x1[j] = ctr[1] + (x0[j] < ctr[0] ? 1u : 0u);
        x2[j] = ctr[2];
        x3[j] = ctr[3];
    }
    for (int round = 0; round < 10; round++) {
        for (int j = 0; j < LK_K_LANES; j++) {
            uint64_t p0 = (uint64_t)0xD2511F53u * x0[j], p1 = (uint64_t)0xCD9E8D57u * x2[j];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ x1[j] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ x3[j] ^ k1;
            x0[j] = n0;
            x1[j] = (uint32_t)p1;
            x2[j] = n2;
            x3[j] = (uint32_t)p0;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    for (int j = 0; j < LK_K_LANES; j++) {
        out[4 * j] = x0[j];
        out[4 * j + 1] = x1[j];
        out[4 * j + 2] = x2[j];
        out[4 * j + 3] = x3[j];
    }
}

/* ==== accuracy (owner: train/metrics.c's lk__log_accuracy, LK_OP_ACCURACY) ====
 * The row loop of the trainer's host accuracy, so that the count a device
 * keeps is the count the host made: one row per call, classes in order. */

/* A 16-bit float's bits widened to f32 exactly, in plain arithmetic: bf16
 * is the top half of an f32; f16 has a 5-bit exponent (bias 15) and a
 * 10-bit mantissa, subnormals m * 2^-24 (exact in f32). */
LK_KERNEL float lk_k_half_bits_to_f32(uint16_t h, int bf16) {
    union { uint32_t u; float f; } v;
    if (bf16) {
        v.u = (uint32_t)h << 16;
        return v.f;
    }
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (uint32_t)(h >> 10) & 0x1fu, m = (uint32_t)h & 0x3ffu;
    if (e == 0) {
        float r = (float)m * 5.9604644775390625e-8f;
        return s ? -r : r;
    }
    v.u = s | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | m << 13;
    return v.f;
}

/* Element i of logits whose kind is 0 (f32), 1 (bf16) or 2 (f16), as f32. */
LK_KERNEL float lk_k_ld_wide(const void *x, int kind, int64_t i) {
    return kind == 0 ? ((const float *)x)[i] : lk_k_half_bits_to_f32(((const uint16_t *)x)[i], kind == 1);
}

/* Whether row r of [N, C] logits predicts target[r] (target kind 0: i64,
 * 1: i32, 2: u8): the first class whose logit is greater (>) than every
 * earlier one's best, from class 0, so ties keep the earlier class and a
 * NaN neither wins nor, once first, loses. */
LK_KERNEL int lk_k_row_hit(const void *x, int kind, int64_t C, int64_t r, const void *target, int tkind) {
    int64_t arg = 0;
    float best = C > 0 ? lk_k_ld_wide(x, kind, r * C) : 0.0f;
    for (int64_t k = 1; k < C; k++) {
        float v = lk_k_ld_wide(x, kind, r * C + k);
        if (v > best) best = v, arg = k;
    }
    int64_t y = tkind == 0 ? ((const int64_t *)target)[r]
              : tkind == 1 ? (int64_t)((const int32_t *)target)[r]
                           : (int64_t)((const uint8_t *)target)[r];
    return arg == y;
}

/* One Philox4x32-10 block: core/rng.c's lk_philox4x32_10 as a kernel body
 * (a GPU thread's block of dropout's mask). */
LK_KERNEL void lk_k_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * x0, p1 = (uint64_t)0xCD9E8D57u * x2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1;
        x0 = n0;
        x1 = (uint32_t)p1;
        x2 = n2;
        x3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = x0, out[1] = x1, out[2] = x2, out[3] = x3;
}

/* Dropout's keep flag of one stream word: lk_rng_uniform() < p written on
 * the word itself, thr = p * 2^24 (exact: a power-of-two scaling). */
LK_KERNEL uint8_t lk_k_keep(uint32_t w, float thr) { return (uint8_t)!((float)(w >> 8) < thr); }

/* Block b of LK_OP_DROPOUT_MASK's Philox part (after the head words): the
 * block of counter ctr + b (64-bit over ctr[1]:ctr[0]) gives keep[4b ..
 * 4b + 3], those below n. One GPU thread's work. */
LK_KERNEL void lk_k_dropout_mask_block(const uint32_t key[2], const uint32_t ctr[4], float thr, int64_t b,
                                       uint8_t *keep, int64_t n) {
    uint64_t c = ((uint64_t)ctr[1] << 32 | ctr[0]) + (uint64_t)b;
    uint32_t cb[4] = {(uint32_t)c, (uint32_t)(c >> 32), ctr[2], ctr[3]}, w[4];
    lk_k_philox4x32_10(cb, key, w);
    for (int j = 0; j < 4 && 4 * b + j < n; j++) keep[4 * b + j] = lk_k_keep(w[j], thr);
}

/* Every block of the Philox part, keep[0 .. n): whole groups of LK_K_LANES
 * blocks through the vectorised lk_k_philox4x32_10_x8 (the speed of the
 * host draw this replaced), the rest block by block; the same words either
 * way (the x8 kernel carries into ctr[1] per lane). */
LK_KERNEL void lk_k_dropout_mask_blocks(const uint32_t key[2], const uint32_t ctr[4], float thr, uint8_t *keep,
                                        int64_t n) {
    uint64_t c0 = (uint64_t)ctr[1] << 32 | ctr[0];
    int64_t b = 0;
    for (; 4 * (b + LK_K_LANES) <= n; b += LK_K_LANES) {
        uint64_t c = c0 + (uint64_t)b;
        uint32_t cb[4] = {(uint32_t)c, (uint32_t)(c >> 32), ctr[2], ctr[3]}, w[4 * LK_K_LANES];
        lk_k_philox4x32_10_x8(cb, key, w);
        for (int j = 0; j < 4 * LK_K_LANES; j++) keep[4 * b + j] = lk_k_keep(w[j], thr);
    }
    for (; 4 * b < n; b++) lk_k_dropout_mask_block(key, ctr, thr, b, keep, n);
}

#endif /* LK_KERNELS_OPS_A_SECTION */

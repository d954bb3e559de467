/* The CPU backend's gradient utilities, f32 (and bf16/f16 for all but the
 * unscale, which only 16-mixed's f32 gradients take): a tensor's norm (the raw sum
 * of |x|^p in double, or max |x|) for gradient clipping, and the search for
 * the first inf or NaN, the loss scaler's unscale (scale every element,
 * counting the non-finite ones on the way) and clipping by value. Single-threaded and in index order, so the sums
 * are the ones clip.c computed before they moved here. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

/* Adds n elements' |x|^p to *out (or takes the max |x|, p = inf). */
static void norm_f32(const lk_norm_params *p, const float *d, int64_t n, double *out) {
    double acc = *out;
    if (isinf(p->p)) {
        for (int64_t k = 0; k < n; k++) {
            double a = fabs((double)d[k]);
            if (a > acc || isnan(a)) acc = isnan(acc) ? acc : a;
        }
    } else if (p->p == 2.0) {
        for (int64_t k = 0; k < n; k++) acc += (double)d[k] * d[k];
    } else if (p->p == 1.0) {
        for (int64_t k = 0; k < n; k++) acc += fabs((double)d[k]);
    } else {
        for (int64_t k = 0; k < n; k++) acc += pow(fabs((double)d[k]), p->p);
    }
    *out = acc;
}

/* The exponent bits are tested with no branch and no early exit inside a
 * block of 4096, which vectorises (a per-element isfinite() with a branch
 * costs as much as an Adam step); only a block holding one is searched
 * element by element. */
#define NONFINITE_BLOCK 4096
static int64_t first_nonfinite_f32(const float *x, int64_t n) {
    for (int64_t b = 0; b < n; b += NONFINITE_BLOCK) {
        int64_t e = n - b < NONFINITE_BLOCK ? n : b + NONFINITE_BLOCK;
        uint32_t bad = 0;
        for (int64_t k = b; k < e; k++) {
            uint32_t u;
            memcpy(&u, x + k, sizeof u);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        if (bad)
            for (int64_t k = b; k < e; k++)
                if (!isfinite(x[k])) return k;
    }
    return -1;
}

/* One pass: each element's exponent tested (before it is scaled, as PyTorch
 * checks) and the element scaled; the per-block count stays in 32 bits so
 * the loop vectorises. x and y may be the same array. */
static int64_t unscale_f32(const float *x, float *y, int64_t n, float mul) {
    int64_t count = 0;
    for (int64_t b = 0; b < n; b += NONFINITE_BLOCK) {
        int64_t e = n - b < NONFINITE_BLOCK ? n : b + NONFINITE_BLOCK;
        uint32_t bad = 0;
        for (int64_t k = b; k < e; k++) {
            uint32_t u;
            memcpy(&u, x + k, sizeof u);
            bad += (u & 0x7f800000u) == 0x7f800000u;
            y[k] = x[k] * mul;
        }
        count += bad;
    }
    return count;
}

static void clamp_f32(const float *x, float *y, int64_t n, float lo, float hi) {
    for (int64_t k = 0; k < n; k++) y[k] = x[k] < lo ? lo : x[k] > hi ? hi : x[k];
}

/* 16-bit gradients (the *-true precisions): the f32 loops over chunks
 * widened on the stack (exact), in index order, so a sum adds the same
 * values in the same order as over the f32 widening of the whole tensor. */
#define CHUNK 512
static lk_status grads_half(const lk_op_desc *d, void *const *x) {
    lk_dtype dt = d->dtype[0];
    const uint16_t *src = x[0];
    int64_t n = d->op == LK_OP_NORM ? d->norm.n : d->op == LK_OP_CLAMP ? d->clamp.n : d->nonfinite.n;
    float buf[CHUNK];
    if (d->op == LK_OP_NORM) *(double *)x[1] = 0.0;
    for (int64_t i = 0; i < n; i += CHUNK) {
        int64_t m = n - i < CHUNK ? n - i : CHUNK;
        lk_half_to_f32_n(dt, buf, src + i, (size_t)m);
        if (d->op == LK_OP_NORM) {
            norm_f32(&d->norm, buf, m, x[1]);
        } else if (d->op == LK_OP_NONFINITE) {
            int64_t k = first_nonfinite_f32(buf, m);
            if (k >= 0) return (*(int64_t *)x[1] = i + k), LK_STATUS_OK;
        } else {
            clamp_f32(buf, buf, m, d->clamp.lo, d->clamp.hi);
            lk_f32_to_half_n(dt, (uint16_t *)x[1] + i, buf, (size_t)m);
        }
    }
    if (d->op == LK_OP_NONFINITE) *(int64_t *)x[1] = -1;
    return LK_STATUS_OK;
}

lk_status LK_ISA(lk__cpu_grads)(const lk_op_desc *d, void *const *x) {
    if (d->dtype[0] != LK_F32 && d->op != LK_OP_UNSCALE) return grads_half(d, x);
    switch (d->op) {
    case LK_OP_NORM:
        *(double *)x[1] = 0.0;
        norm_f32(&d->norm, x[0], d->norm.n, x[1]);
        return LK_STATUS_OK;
    case LK_OP_NONFINITE: *(int64_t *)x[1] = first_nonfinite_f32(x[0], d->nonfinite.n); return LK_STATUS_OK;
    case LK_OP_UNSCALE:
        *(int64_t *)x[2] = unscale_f32(x[0], x[1], d->nonfinite.n, d->nonfinite.mul);
        return LK_STATUS_OK;
    case LK_OP_CLAMP: /* comparisons with NaN are false: a NaN stays */
        clamp_f32(x[0], x[1], d->clamp.n, d->clamp.lo, d->clamp.hi);
        return LK_STATUS_OK;
    default: break;
    }
    return lk_error(LK_STATUS_INTERNAL, "cpu backend: op %d is not a gradient utility", (int)d->op);
}

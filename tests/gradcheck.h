/* Finite-difference gradient checks for ops, in f32 with central
 * differences. The op's output is contracted with fixed random weights R
 * (L = sum(out * R), accumulated in double) so every output element matters.
 * Tolerance: central differences in f32 with eps = 1e-3 carry an O(eps^2)
 * truncation error and an O(ulp(L)/eps) rounding error; for the O(1)-sized
 * values used here that is ~1e-4..1e-3, so we accept
 * |analytic - numeric| <= atol + rtol * |numeric| with atol = rtol = 5e-3
 * unless a test states otherwise (ops with kinks, e.g. relu or max-pool,
 * keep inputs away from them). */
#ifndef LK_GRADCHECK_H
#define LK_GRADCHECK_H

#include "lk_test.h"
#include "tensor/tensor_impl.h"

typedef lk_tensor *(*lk_gc_fn)(lk_tensor **in, void *ctx);

static double lk_gc_eval(lk_gc_fn f, lk_tensor **in, void *ctx, const lk_tensor *R) {
    lk_scope_begin();
    bool prev = lk_set_grad_enabled(false);
    lk_tensor *out = f(in, ctx);
    double L = 0;
    if (out)
        for (int64_t i = 0; i < out->numel; i++) L += lk_tensor_get(out, i) * lk_tensor_get(R, i);
    else
        L = NAN;
    lk_set_grad_enabled(prev);
    lk_scope_end();
    return L;
}

/* Checks d(sum(f(in) * R))/d(in[k]) for every float input with requires_grad.
 * Returns the number of mismatching elements (also reported via CHECK). */
static int lk_gradcheck_tol(const char *name, lk_gc_fn f, lk_tensor **in, int n, void *ctx, double eps, double atol,
                            double rtol) {
    int bad = 0;
    lk_scope_begin();
    for (int k = 0; k < n; k++)
        if (in[k]) lk_tensor_zero_grad(in[k], true);
    lk_tensor *out = f(in, ctx);
    CHECK_MSG(out != NULL, "%s: forward failed: %s", name, lk_last_error());
    if (!out) {
        lk_scope_end();
        return 1;
    }
    lk_rng rng;
    lk_rng_init(&rng, 1234, LK_RNG_USER, 7, 7);
    lk_tensor *R = lk_tensor_randn(&rng, out->ndim, out->shape, 0.0f, 1.0f);
    lk_status st = lk_backward_with(out, R);
    CHECK_MSG(st == LK_STATUS_OK, "%s: backward failed: %s", name, lk_last_error());
    lk_scope_end();
    for (int k = 0; k < n && st == LK_STATUS_OK; k++) {
        lk_tensor *x = in[k];
        if (!x || !x->requires_grad || x->dtype != LK_F32) continue;
        CHECK_MSG(x->grad != NULL, "%s: input %d got no gradient", name, k);
        if (!x->grad) {
            bad++;
            continue;
        }
        float *xd = x->data;
        for (int64_t i = 0; i < x->numel; i++) {
            int64_t off = lk__elem_offset(x, i);
            float orig = xd[off];
            xd[off] = orig + (float)eps;
            double lp = lk_gc_eval(f, in, ctx, R);
            xd[off] = orig - (float)eps;
            double lm = lk_gc_eval(f, in, ctx, R);
            xd[off] = orig;
            double num = (lp - lm) / (2 * eps);
            double ana = lk_tensor_get(x->grad, i);
            if (!(fabs(ana - num) <= atol + rtol * fabs(num))) {
                if (bad < 5)
                    fprintf(stderr, "%s: input %d element %lld: analytic %.6g numeric %.6g\n", name, k, (long long)i,
                            ana, num);
                bad++;
            }
        }
    }
    lk_tensor_release(R);
    CHECK_MSG(bad == 0, "%s: %d gradient elements differ from finite differences", name, bad);
    return bad;
}

static int lk_gradcheck(const char *name, lk_gc_fn f, lk_tensor **in, int n, void *ctx) {
    return lk_gradcheck_tol(name, f, in, n, ctx, 1e-3, 5e-3, 5e-3);
}

/* A random f32 leaf requiring grad, values in N(0, 1) (caller releases). */
static lk_tensor *lk_gc_param(uint32_t seed, int ndim, const int64_t *shape) {
    lk_rng r;
    lk_rng_init(&r, seed, LK_RNG_USER, 0, 0);
    lk_tensor *t = lk_tensor_randn(&r, ndim, shape, 0.0f, 1.0f);
    lk_tensor_set_requires_grad(t, true);
    return t;
}

#endif

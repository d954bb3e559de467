/* conv2d, pooling and batch_norm: gradient checks on odd shapes (5x7
 * images, stride, padding, dilation, groups, 1x1 kernels, a batch of one),
 * a direct-loop reference for the per-sample, chunked, "same"-padding and
 * 1x1 paths, pooling values and shapes in ceil mode, max-pool ties and NaN,
 * the running-statistics update, steady-state allocation, and the error
 * messages for bad input; linear's GEMMs cut across threads or run side by
 * side against one thread. */
#include "gradcheck.h"
#include "backend/backend_impl.h"

typedef struct {
    lk_conv2d_params p;
} conv_ctx;

static lk_tensor *f_conv(lk_tensor **in, void *ctx) {
    return lk_conv2d(in[0], in[1], in[2], ((conv_ctx *)ctx)->p);
}

static lk_conv2d_params cp(int sh, int sw, int ph, int pw, int dh, int dw, int groups) {
    return (lk_conv2d_params){{sh, sw}, {ph, pw}, {dh, dw}, groups};
}

/* Gradcheck of conv2d for x, w and (when bias) b. */
static void gc_conv(const char *name, int64_t N, int64_t C, int64_t H, int64_t W, int64_t O, int64_t kh, int64_t kw,
                    bool bias, lk_conv2d_params p) {
    lk_tensor *in[3] = {lk_gc_param(11, LK_SHAPE(N, C, H, W)), lk_gc_param(12, LK_SHAPE(O, C / p.groups, kh, kw)),
                        bias ? lk_gc_param(13, LK_SHAPE(O)) : NULL};
    conv_ctx ctx = {p};
    lk_gradcheck(name, f_conv, in, 3, &ctx);
    for (int i = 0; i < 3; i++) lk_tensor_release(in[i]);
}

/* Only some inputs require grad: backward must skip the others' work and
 * still get the rest right (the first layer of a net has a data input). */
static void gc_conv_partial(const char *name, bool gx, bool gw, lk_conv2d_params p) {
    lk_tensor *in[3] = {lk_gc_param(14, LK_SHAPE(3, 2, 6, 5)), lk_gc_param(15, LK_SHAPE(4, 2 / p.groups, 3, 3)),
                        lk_gc_param(16, LK_SHAPE(4))};
    lk_tensor_set_requires_grad(in[0], gx);
    lk_tensor_set_requires_grad(in[1], gw);
    lk_tensor_set_requires_grad(in[2], gw);
    conv_ctx ctx = {p};
    lk_gradcheck(name, f_conv, in, 3, &ctx);
    CHECK(gx == (in[0]->grad != NULL) && gw == (in[1]->grad != NULL));
    for (int i = 0; i < 3; i++) lk_tensor_release(in[i]);
}

static void conv_gradchecks(void) {
    gc_conv_partial("conv data input (no dx)", false, true, cp(1, 1, 1, 1, 1, 1, 1));
    gc_conv_partial("conv frozen weight (dx only)", true, false, cp(2, 1, 1, 0, 1, 1, 2));
    gc_conv("conv 5x7 plain", 2, 3, 5, 7, 4, 3, 3, true, LK_CONV2D_DEFAULT);
    gc_conv("conv stride 2 pad 1", 2, 3, 5, 7, 4, 3, 3, true, cp(2, 2, 1, 1, 1, 1, 1));
    gc_conv("conv dilation 2 pad 2", 1, 2, 7, 6, 3, 3, 2, false, cp(1, 1, 2, 2, 2, 2, 1));
    gc_conv("conv groups 2 stride (2,1) pad (1,0)", 2, 4, 5, 5, 6, 3, 3, true, cp(2, 1, 1, 0, 1, 1, 2));
    gc_conv("conv depthwise", 2, 3, 4, 5, 3, 3, 3, true, cp(1, 1, 1, 1, 1, 1, 3));
    gc_conv("conv 1x1", 2, 3, 4, 5, 5, 1, 1, true, LK_CONV2D_DEFAULT);
    gc_conv("conv 1x1 groups 2", 1, 4, 3, 3, 2, 1, 1, false, cp(1, 1, 0, 0, 1, 1, 2));
    gc_conv("conv 1x1 stride 2 pad 1", 2, 3, 5, 4, 2, 1, 1, true, cp(2, 2, 1, 1, 1, 1, 1));
    gc_conv("conv batch 1, kernel = image", 1, 1, 5, 5, 2, 5, 5, true, LK_CONV2D_DEFAULT);
    gc_conv("conv rectangular stride 3 dilation (1,3)", 3, 2, 8, 9, 2, 2, 3, true, cp(3, 2, 0, 2, 1, 3, 1));
}

/* Direct-loop conv2d in double and its adjoints, for checking the chunked path. */
static void ref_conv(const float *x, const float *w, const float *b, const float *gy, int N, int C, int H, int W, int O,
                     int kh, int kw, lk_conv2d_params p, int OH, int OW, double *y, double *dx, double *dw,
                     double *db) {
    int Cg = C / p.groups, Og = O / p.groups;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    int yi = ((n * O + o) * OH + oh) * OW + ow, grp = o / Og;
                    double s = b ? b[o] : 0.0;
                    db[o] += gy[yi];
                    for (int c = 0; c < Cg; c++)
                        for (int i = 0; i < kh; i++)
                            for (int j = 0; j < kw; j++) {
                                int ih = oh * p.stride[0] - p.padding[0] + i * p.dilation[0];
                                int iw = ow * p.stride[1] - p.padding[1] + j * p.dilation[1];
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                int xi = ((n * C + grp * Cg + c) * H + ih) * W + iw;
                                int wi = ((o * Cg + c) * kh + i) * kw + j;
                                s += (double)x[xi] * w[wi];
                                dx[xi] += (double)w[wi] * gy[yi];
                                dw[wi] += (double)x[xi] * gy[yi];
                            }
                    y[yi] = s;
                }
}

static double max_rel_err(const lk_tensor *t, const double *ref) {
    double m = 0, scale = 1e-6;
    for (int64_t i = 0; i < t->numel; i++) scale = fmax(scale, fabs(ref[i]));
    for (int64_t i = 0; i < t->numel; i++) m = fmax(m, fabs(lk_tensor_get(t, i) - ref[i]) / scale);
    return m;
}

/* Per-sample GEMMs (28x28), chunks of samples sharing one GEMM (small
 * maps, with a partial last chunk), the contiguous "same"-padding im2col and
 * the 1x1 path must all match the direct loops. Tolerance: f32 sums of
 * <= 50 products of N(0,1) values, relative to the largest output: 1e-5. */
static void conv_matches_direct_loops_at(int threads) {
    lk_set_num_threads(threads);
    struct {
        int N, C, H, W, O, kh, kw;
        lk_conv2d_params p;
    } cases[] = {
        {7, 2, 28, 28, 3, 3, 3, cp(1, 1, 1, 1, 1, 1, 1)},
        {11, 4, 28, 27, 6, 5, 5, cp(1, 1, 2, 2, 1, 1, 2)},
        {9, 3, 30, 30, 4, 3, 3, cp(2, 2, 0, 1, 2, 1, 1)},
        {6, 8, 14, 14, 4, 1, 1, cp(1, 1, 0, 0, 1, 1, 2)},
        {5, 3, 17, 19, 4, 3, 3, cp(1, 1, 2, 2, 2, 2, 1)},   /* "same" output, dilated */
        {4, 2, 9, 11, 3, 3, 5, cp(1, 1, 1, 2, 1, 1, 1)},    /* "same", rectangular kernel */
        {3, 2, 5, 1, 2, 3, 3, cp(1, 1, 1, 1, 1, 1, 1)},     /* one pixel wide */
        {22, 4, 7, 7, 5, 3, 3, cp(1, 1, 1, 1, 1, 1, 1)},    /* 7x7 maps: chunks of 5 samples, last of 2 */
        {37, 3, 4, 4, 2, 2, 2, cp(1, 1, 0, 0, 1, 1, 1)},    /* 3x3 out: chunks of 28 and 9 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int N = cases[k].N, C = cases[k].C, H = cases[k].H, W = cases[k].W, O = cases[k].O, kh = cases[k].kh,
            kw = cases[k].kw;
        lk_conv2d_params p = cases[k].p;
        lk_tensor *x = lk_gc_param(21, LK_SHAPE(N, C, H, W)), *w = lk_gc_param(22, LK_SHAPE(O, C / p.groups, kh, kw));
        lk_tensor *b = lk_gc_param(23, LK_SHAPE(O));
        lk_scope_begin();
        lk_tensor *y = lk_conv2d(x, w, b, p);
        CHECK_MSG(y != NULL, "case %zu: %s", k, lk_last_error());
        if (!y) {
            lk_scope_end();
            continue;
        }
        int OH = (int)y->shape[2], OW = (int)y->shape[3];
        lk_rng r;
        lk_rng_init(&r, 5, LK_RNG_USER, 1, 1);
        lk_tensor *gy = lk_tensor_randn(&r, 4, y->shape, 0.0f, 1.0f);
        CHECK_OK(lk_backward_with(y, gy));
        double *ry = calloc((size_t)y->numel, sizeof(double)), *rdx = calloc((size_t)x->numel, sizeof(double));
        double *rdw = calloc((size_t)w->numel, sizeof(double)), *rdb = calloc((size_t)O, sizeof(double));
        ref_conv(x->data, w->data, b->data, gy->data, N, C, H, W, O, kh, kw, p, OH, OW, ry, rdx, rdw, rdb);
        double ey = max_rel_err(y, ry), ex = max_rel_err(x->grad, rdx), ew = max_rel_err(w->grad, rdw),
               eb = max_rel_err(b->grad, rdb);
        CHECK_MSG(ey < 1e-5 && ex < 1e-5 && ew < 1e-5 && eb < 1e-5, "case %zu: rel err y %g dx %g dw %g db %g", k, ey,
                  ex, ew, eb);
        free(ry);
        free(rdx);
        free(rdw);
        free(rdb);
        lk_tensor_release(gy);
        lk_scope_end();
        lk_tensor_release(x);
        lk_tensor_release(w);
        lk_tensor_release(b);
    }
}

/* With one compute thread and with several (samples split across threads,
 * each running single-threaded GEMMs). */
static void conv_matches_direct_loops(void) {
    for (int threads = 1; threads <= 3; threads++) conv_matches_direct_loops_at(threads);
    lk_set_num_threads(2);
}

/* GEMMs cut across threads (by columns or rows, every transpose: a linear
 * layer's forward and both backward products) match one thread to 1e-6
 * (BLAS's blocking over K may follow the cut, so not always bitwise) and
 * are bitwise repeatable for a given thread count. */
static void gemm_split_matches_serial(void) {
    static const int64_t shapes[][3] = {{64, 784, 256}, {37, 300, 129}, {256, 100, 33}, {5, 2000, 1000}, {300, 64, 20}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int64_t M = shapes[k][0], K = shapes[k][1], N = shapes[k][2];
        lk_tensor *x = lk_gc_param(71, LK_SHAPE(M, K)), *w = lk_gc_param(72, LK_SHAPE(N, K));
        lk_tensor *res[4][3] = {{NULL}};
        for (int run = 1; run <= 4; run++) {
            int threads = run == 4 ? 3 : run;
            lk_set_num_threads(threads);
            lk_tensor_zero_grad(x, true);
            lk_tensor_zero_grad(w, true);
            lk_scope_begin();
            lk_tensor *y = lk_linear(x, w, NULL);
            lk_rng r;
            lk_rng_init(&r, 3, LK_RNG_USER, (uint32_t)k, 0);
            lk_tensor *gy = y ? lk_tensor_randn(&r, 2, y->shape, 0.0f, 1.0f) : NULL;
            CHECK_OK(lk_backward_with(y, gy));
            res[run - 1][0] = y ? lk_tensor_clone(y) : NULL;
            res[run - 1][1] = x->grad ? lk_tensor_clone(x->grad) : NULL;
            res[run - 1][2] = w->grad ? lk_tensor_clone(w->grad) : NULL;
            lk_tensor_release(gy);
            lk_scope_end();
        }
        for (int i = 0; i < 3; i++) {
            if (!res[0][i] || !res[1][i] || !res[2][i] || !res[3][i]) {
                CHECK(0);
                continue;
            }
            const float *e = res[0][i]->data;
            for (int t = 1; t < 3; t++) {
                const float *a = res[t][i]->data;
                double err = 0, scale = 1e-12;
                for (int64_t q = 0; q < res[0][i]->numel; q++) {
                    err = fmax(err, fabs((double)a[q] - e[q]));
                    scale = fmax(scale, fabs((double)e[q]));
                }
                CHECK_MSG(err / scale < 1e-6, "[%lld x %lld] x [%lld x %lld]^T, %d threads: %s differs by %g",
                          (long long)M, (long long)K, (long long)N, (long long)K, t + 1, i == 0 ? "y" : i == 1 ? "dx" : "dw",
                          err / scale);
            }
            CHECK_MSG(!memcmp(res[2][i]->data, res[3][i]->data, (size_t)res[0][i]->numel * 4),
                      "3 threads twice: %s not bitwise repeatable", i == 0 ? "y" : i == 1 ? "dx" : "dw");
        }
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 3; i++) lk_tensor_release(res[t][i]);
        lk_tensor_release(x);
        lk_tensor_release(w);
    }
    lk_set_num_threads(2);
}

/* Under bf16 autocast, a linear's two backward GEMMs (dX and dW, 67 MFLOP
 * each here) run side by side on two compute threads when the backend would
 * run each whole (bf16 on AMX: lin_pair in ops_matmul.c). y, dx, dw and db
 * match one thread bitwise then (the same uncut GEMMs, only on two cores).
 * On a CPU where the GEMMs are cut instead (AVX512-BF16 without AMX), a
 * piece may take another kernel and sum in another order: the f32 results
 * dx, dw, db match to 1e-6 of their scale, and y, rounded to bf16, to one
 * bf16 ulp of each element (a sum that lands near a rounding boundary goes
 * the other way). Three threads twice are bitwise repeatable. */
static void linear_pair_matches_serial(void) {
    const int64_t M = 256, K = 512, N = 256;
    lk_tensor *x = lk_gc_param(81, LK_SHAPE(M, K)), *w = lk_gc_param(82, LK_SHAPE(N, K));
    lk_tensor *b = lk_gc_param(83, LK_SHAPE(N));
    lk_tensor *res[4][4] = {{NULL}};
    for (int run = 1; run <= 4; run++) {
        lk_set_num_threads(run == 4 ? 3 : run);
        lk_tensor_zero_grad(x, true);
        lk_tensor_zero_grad(w, true);
        lk_tensor_zero_grad(b, true);
        lk_scope_begin();
        lk_autocast_enter(LK_BF16);
        lk_tensor *y = lk_linear(x, w, b);
        lk_autocast_exit();
        lk_rng r;
        lk_rng_init(&r, 4, LK_RNG_USER, 0, 0);
        lk_tensor *gy32 = y ? lk_tensor_randn(&r, 2, y->shape, 0.0f, 1.0f) : NULL;
        lk_tensor *gy = gy32 ? lk_tensor_cast(gy32, LK_BF16) : NULL;
        CHECK_OK(lk_backward_with(y, gy));
        res[run - 1][0] = y ? lk_tensor_cast(y, LK_F32) : NULL;
        res[run - 1][1] = x->grad ? lk_tensor_clone(x->grad) : NULL;
        res[run - 1][2] = w->grad ? lk_tensor_clone(w->grad) : NULL;
        res[run - 1][3] = b->grad ? lk_tensor_clone(b->grad) : NULL;
        lk_tensor_release(gy);
        lk_tensor_release(gy32);
        lk_scope_end();
    }
    lk_set_num_threads(2);
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {LK_BF16, LK_BF16, LK_F32}};
    d.gemm = (lk_gemm_params){.M = M, .N = K, .K = N};
    bool cut = lk__cpu_gemm_cut(&d); /* on two threads: then no pair, and the cut may sum in another order */
    static const char *names[4] = {"y", "dx", "dw", "db"};
    for (int i = 0; i < 4; i++) {
        if (!res[0][i] || !res[1][i] || !res[2][i] || !res[3][i]) {
            CHECK(0);
            continue;
        }
        size_t bytes = (size_t)res[0][i]->numel * 4;
        const float *e = res[0][i]->data, *a = res[1][i]->data;
        double err = 0, scale = 1e-12, ulps = 0;
        for (int64_t q = 0; q < res[0][i]->numel; q++) {
            err = fmax(err, fabs((double)a[q] - e[q]));
            scale = fmax(scale, fabs((double)e[q]));
            int ex;
            (void)frexp((double)e[q], &ex); /* |e| in [2^(ex-1), 2^ex): a bf16 ulp is 2^(ex-8) */
            ulps = fmax(ulps, e[q] != 0.0f ? fabs((double)a[q] - e[q]) / ldexp(1.0, ex - 8) : (a[q] != 0.0f) * 1e9);
        }
        if (cut && i == 0) CHECK_MSG(ulps <= 1.0, "bf16 linear, 2 threads: y differs by %g bf16 ulps", ulps);
        else if (cut) CHECK_MSG(err / scale < 1e-6, "bf16 linear, 2 threads: %s differs by %g", names[i], err / scale);
        else CHECK_MSG(!memcmp(e, a, bytes), "bf16 linear, 2 threads (GEMMs side by side): %s not bitwise one thread's",
                       names[i]);
        CHECK_MSG(!memcmp(res[2][i]->data, res[3][i]->data, bytes), "3 threads twice: %s not bitwise repeatable",
                  names[i]);
    }
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++) lk_tensor_release(res[t][i]);
    lk_tensor_release(x);
    lk_tensor_release(w);
    lk_tensor_release(b);
}

/* A known answer from PyTorch 1.13: conv2d(arange(16).view(1,1,4,4),
 * arange(9).view(1,1,3,3), bias=[0.5], stride=2, padding=1, dilation=1). */
static void conv_known_values(void) {
    float xv[16], wv[9];
    for (int i = 0; i < 16; i++) xv[i] = (float)i;
    for (int i = 0; i < 9; i++) wv[i] = (float)i;
    lk_tensor *x = lk_tensor_from_data(LK_F32, LK_SHAPE(1, 1, 4, 4), xv);
    lk_tensor *w = lk_tensor_from_data(LK_F32, LK_SHAPE(1, 1, 3, 3), wv);
    lk_tensor *b = lk_tensor_from_data(LK_F32, LK_SHAPE(1), (float[]){0.5f});
    lk_scope_begin();
    lk_tensor *y = lk_conv2d(x, w, b, cp(2, 2, 1, 1, 1, 1, 1));
    CHECK(y && y->shape[2] == 2 && y->shape[3] == 2);
    const double want[4] = {73.5, 154.5, 279.5, 438.5};
    for (int i = 0; y && i < 4; i++) CHECK_NEAR(lk_tensor_get(y, i), want[i], 1e-4);
    lk_scope_end();
    lk_tensor_release(x);
    lk_tensor_release(w);
    lk_tensor_release(b);
}

/* ---- pooling -------------------------------------------------------------------- */

typedef struct {
    int kind; /* 0 max, 1 avg, 2 adaptive */
    lk_pool2d_params p;
    int oh, ow;
} pool_ctx;

static lk_tensor *f_pool(lk_tensor **in, void *vctx) {
    pool_ctx *c = vctx;
    if (c->kind == 0) return lk_max_pool2d(in[0], c->p);
    if (c->kind == 1) return lk_avg_pool2d(in[0], c->p);
    return lk_adaptive_avg_pool2d(in[0], c->oh, c->ow);
}

static lk_pool2d_params pp(int kh, int kw, int sh, int sw, int ph, int pw, bool include_pad, bool ceil) {
    return (lk_pool2d_params){{kh, kw}, {sh, sw}, {ph, pw}, include_pad, ceil};
}

/* Distinct values at least 0.05 apart (a shuffled ramp), so the max of a
 * window never changes under the +-1e-3 finite-difference steps. */
static lk_tensor *ramp_param(int ndim, const int64_t *shape) {
    lk_tensor *t = lk_tensor_zeros(LK_F32, ndim, shape);
    float *d = t->data;
    int64_t n = t->numel;
    for (int64_t i = 0; i < n; i++) d[i] = (float)((i * 37 + 11) % n) * 0.05f - 1.0f;
    lk_tensor_set_requires_grad(t, true);
    return t;
}

static void gc_pool(const char *name, pool_ctx c, int ndim, const int64_t *shape) {
    lk_tensor *x = ramp_param(ndim, shape);
    lk_gradcheck(name, f_pool, &x, 1, &c);
    lk_tensor_release(x);
}

static void pool_gradchecks(void) {
    /* numel of each shape is coprime with 37, so the ramp is a permutation */
    gc_pool("max 2x2", (pool_ctx){.kind = 0, .p = pp(2, 2, 0, 0, 0, 0, true, false)}, LK_SHAPE(2, 3, 5, 7));
    gc_pool("max 3x3 s2 p1", (pool_ctx){.kind = 0, .p = pp(3, 3, 2, 2, 1, 1, true, false)}, LK_SHAPE(2, 2, 5, 7));
    gc_pool("max 3x2 s(2,1) ceil", (pool_ctx){.kind = 0, .p = pp(3, 2, 2, 1, 0, 1, true, true)}, LK_SHAPE(1, 3, 6, 5));
    gc_pool("max 3-d input", (pool_ctx){.kind = 0, .p = pp(2, 3, 1, 2, 1, 0, true, true)}, LK_SHAPE(3, 4, 5));
    gc_pool("avg 2x2", (pool_ctx){.kind = 1, .p = pp(2, 2, 0, 0, 0, 0, true, false)}, LK_SHAPE(2, 3, 5, 7));
    gc_pool("avg 3x3 s2 p1 incl pad", (pool_ctx){.kind = 1, .p = pp(3, 3, 2, 2, 1, 1, true, false)},
            LK_SHAPE(2, 2, 5, 7));
    gc_pool("avg 3x3 s2 p1 excl pad", (pool_ctx){.kind = 1, .p = pp(3, 3, 2, 2, 1, 1, false, false)},
            LK_SHAPE(2, 2, 5, 7));
    gc_pool("avg 3x3 s2 p1 ceil incl", (pool_ctx){.kind = 1, .p = pp(3, 3, 2, 2, 1, 1, true, true)},
            LK_SHAPE(1, 2, 6, 6));
    gc_pool("avg 2x3 s2 ceil excl", (pool_ctx){.kind = 1, .p = pp(2, 3, 2, 2, 0, 1, false, true)},
            LK_SHAPE(2, 1, 5, 6));
    gc_pool("adaptive 5x7->3x4", (pool_ctx){.kind = 2, .oh = 3, .ow = 4}, LK_SHAPE(2, 3, 5, 7));
    gc_pool("adaptive 3x2->4x5 (upsampling bins)", (pool_ctx){.kind = 2, .oh = 4, .ow = 5}, LK_SHAPE(1, 2, 3, 2));
    gc_pool("adaptive global", (pool_ctx){.kind = 2, .oh = 1, .ow = 1}, LK_SHAPE(3, 5, 7));
}

/* Known answers from PyTorch 1.13 on x = arange(30).view(1, 1, 5, 6). */
static void pool_known_values(void) {
    float xv[30];
    for (int i = 0; i < 30; i++) xv[i] = (float)i;
    lk_tensor *x = lk_tensor_from_data(LK_F32, LK_SHAPE(1, 1, 5, 6), xv);
    lk_scope_begin();
    /* max_pool2d(x, 2, 2, ceil_mode=True) -> 3x3 */
    lk_tensor *m = lk_max_pool2d(x, pp(2, 2, 0, 0, 0, 0, true, true));
    const double wm[9] = {7, 9, 11, 19, 21, 23, 25, 27, 29};
    CHECK(m && m->shape[2] == 3 && m->shape[3] == 3);
    for (int i = 0; m && i < 9; i++) CHECK_NEAR(lk_tensor_get(m, i), wm[i], 0);
    /* avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False) -> 3x4 */
    lk_tensor *a = lk_avg_pool2d(x, pp(3, 3, 2, 2, 1, 1, false, true));
    const double wa[12] = {3.5, 5, 7, 8, 12.5, 14, 16, 17, 21.5, 23, 25, 26};
    CHECK(a && a->shape[2] == 3 && a->shape[3] == 4);
    for (int i = 0; a && i < 12; i++) CHECK_NEAR(lk_tensor_get(a, i), wa[i], 1e-5);
    /* the same with count_include_pad=True */
    lk_tensor *ai = lk_avg_pool2d(x, pp(3, 3, 2, 2, 1, 1, true, true));
    const double wai[12] = {1.5555556, 3.3333333, 4.6666667, 2.6666667, 8.3333333, 14, 16, 8.5,
                            9.5555556, 15.333333, 16.666667, 8.6666667};
    for (int i = 0; ai && i < 12; i++) CHECK_NEAR(lk_tensor_get(ai, i), wai[i], 1e-5);
    /* adaptive_avg_pool2d(x, (3, 4)) */
    lk_tensor *ad = lk_adaptive_avg_pool2d(x, 3, 4);
    const double wad[12] = {3.5, 4.5, 6.5, 7.5, 12.5, 13.5, 15.5, 16.5, 21.5, 22.5, 24.5, 25.5};
    for (int i = 0; ad && i < 12; i++) CHECK_NEAR(lk_tensor_get(ad, i), wad[i], 1e-5);
    lk_scope_end();
    lk_tensor_release(x);
}

/* Ties go to the first maximum; a NaN wins, the last NaN of a window taking
 * the gradient (PyTorch 1.13's CPU kernel, checked by hand against it). */
static void max_pool_ties_and_nan(void) {
    float xv[16] = {1, 3, 3, 0, 3, 2, NAN, 5, 0, NAN, 7, 1, NAN, 2, 9, 9};
    lk_tensor *x = lk_tensor_from_data(LK_F32, LK_SHAPE(1, 1, 4, 4), xv);
    lk_tensor *gy = lk_tensor_from_data(LK_F32, LK_SHAPE(1, 1, 2, 2), (float[]){1, 2, 3, 4});
    lk_tensor_set_requires_grad(x, true);
    lk_scope_begin();
    lk_tensor *y = lk_max_pool2d(x, pp(2, 2, 0, 0, 0, 0, true, false));
    CHECK(y && lk_tensor_get(y, 0) == 3 && isnan(lk_tensor_get(y, 1)) && isnan(lk_tensor_get(y, 2)) &&
          lk_tensor_get(y, 3) == 9);
    CHECK_OK(lk_backward_with(y, gy));
    const double want[16] = {0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4, 0};
    for (int i = 0; x->grad && i < 16; i++) CHECK_NEAR(lk_tensor_get(x->grad, i), want[i], 0);
    lk_scope_end();
    lk_tensor_release(x);
    lk_tensor_release(gy);
}

/* ---- batch norm ------------------------------------------------------------------- */

typedef struct {
    bool training;
    lk_tensor *rm, *rv;
} bn_ctx;

static lk_tensor *f_bn(lk_tensor **in, void *vctx) {
    bn_ctx *c = vctx;
    return lk_batch_norm(in[0], c->rm, c->rv, in[1], in[2], c->training, 0.1f, 1e-5f);
}

static void gc_bn(const char *name, bool training, bool affine, int ndim, const int64_t *shape) {
    int64_t C = shape[1];
    lk_tensor *in[3] = {lk_gc_param(31, ndim, shape), affine ? lk_gc_param(32, LK_SHAPE(C)) : NULL,
                        affine ? lk_gc_param(33, LK_SHAPE(C)) : NULL};
    bn_ctx c = {training, NULL, NULL};
    if (!training) { /* eval: running statistics with a spread of means and variances */
        lk_rng r;
        lk_rng_init(&r, 34, LK_RNG_USER, 0, 0);
        c.rm = lk_tensor_randn(&r, LK_SHAPE(C), 0.0f, 1.0f);
        c.rv = lk_tensor_rand(&r, LK_SHAPE(C), 0.5f, 2.0f);
    }
    lk_gradcheck(name, f_bn, in, 3, &c);
    for (int i = 0; i < 3; i++) lk_tensor_release(in[i]);
    lk_tensor_release(c.rm);
    lk_tensor_release(c.rv);
}

static void batch_norm_gradchecks(void) {
    gc_bn("bn2d train", true, true, LK_SHAPE(3, 2, 3, 5));
    gc_bn("bn2d train no affine", true, false, LK_SHAPE(2, 3, 2, 2));
    gc_bn("bn1d train", true, true, LK_SHAPE(5, 4));
    gc_bn("bn2d batch 1 train", true, true, LK_SHAPE(1, 2, 2, 3));
    gc_bn("bn2d eval", false, true, LK_SHAPE(3, 2, 3, 5));
    gc_bn("bn1d eval no affine", false, false, LK_SHAPE(4, 3));
}

/* Two channels of x [2, 2, 1, 2]: channel 0 holds {1, 2, 3, 6}, channel 1
 * {-1, -1, 2, 4}. mean0 = 3, biased var0 = 3.5, unbiased 14/3; mean1 = 1,
 * var1 = 4.5, unbiased 6. With momentum 0.1 from (0, 1): running_mean =
 * (0.3, 0.1), running_var = (0.9 + 14/30, 0.9 + 0.6). */
static void batch_norm_running_stats(void) {
    lk_tensor *x = lk_tensor_from_data(LK_F32, LK_SHAPE(2, 2, 1, 2), (float[]){1, 2, -1, -1, 3, 6, 2, 4});
    lk_tensor *rm = lk_tensor_zeros(LK_F32, LK_SHAPE(2)), *rv = lk_tensor_full(LK_F32, LK_SHAPE(2), 1.0);
    lk_tensor *w = lk_tensor_from_data(LK_F32, LK_SHAPE(2), (float[]){2, 1});
    lk_tensor *b = lk_tensor_from_data(LK_F32, LK_SHAPE(2), (float[]){0.5f, 0});
    lk_tensor_set_requires_grad(w, true);
    lk_scope_begin();
    size_t tape0 = lk_tape_len();
    lk_tensor *y = lk_batch_norm(x, rm, rv, w, b, true, 0.1f, 0.0f);
    CHECK(y != NULL);
    CHECK_NEAR(lk_tensor_get(rm, 0), 0.3, 1e-6);
    CHECK_NEAR(lk_tensor_get(rm, 1), 0.1, 1e-6);
    CHECK_NEAR(lk_tensor_get(rv, 0), 0.9 + 14.0 / 30.0, 1e-6);
    CHECK_NEAR(lk_tensor_get(rv, 1), 1.5, 1e-6);
    CHECK(lk_tape_len() == tape0 + 1); /* the update is not on the tape */
    /* y[0,0,0,0] = (1 - 3) / sqrt(3.5) * 2 + 0.5 */
    CHECK_NEAR(lk_tensor_get(y, 0), -4.0 / sqrt(3.5) + 0.5, 1e-5);
    /* eval uses the running statistics: (x - 0.3) / sqrt(var + eps) * 2 + 0.5 */
    lk_tensor *ye = lk_batch_norm(x, rm, rv, w, b, false, 0.1f, 1e-5f);
    CHECK(ye != NULL);
    CHECK_NEAR(lk_tensor_get(ye, 0), (1 - 0.3) / sqrt(0.9 + 14.0 / 30.0 + 1e-5) * 2 + 0.5, 1e-5);
    CHECK_NEAR(lk_tensor_get(rm, 0), 0.3, 1e-6); /* eval leaves them alone */
    lk_scope_end();
    lk_tensor_release(x);
    lk_tensor_release(rm);
    lk_tensor_release(rv);
    lk_tensor_release(w);
    lk_tensor_release(b);
}

/* ---- a CNN step allocates nothing once warm --------------------------------------- */

/* The thread-parallel paths of conv, max-pool and batch-norm (large enough
 * to take them) give the single-thread results: bitwise, except the
 * weight and bias gradients of conv, summed per thread then across. */
static void parallel_matches_serial(void) {
    lk_tensor *x = lk_gc_param(61, LK_SHAPE(8, 4, 40, 40)), *w = lk_gc_param(62, LK_SHAPE(16, 4, 3, 3));
    lk_tensor *b = lk_gc_param(63, LK_SHAPE(16)), *g = lk_gc_param(64, LK_SHAPE(16));
    lk_tensor *out[3] = {NULL}, *grads[3][4] = {{NULL}};
    for (int threads = 1; threads <= 3; threads++) {
        lk_set_num_threads(threads);
        lk_tensor *rm = lk_tensor_zeros(LK_F32, LK_SHAPE(16)), *rv = lk_tensor_full(LK_F32, LK_SHAPE(16), 1.0);
        lk_tensor *ps[4] = {x, w, b, g};
        for (int i = 0; i < 4; i++) lk_tensor_zero_grad(ps[i], true);
        lk_scope_begin();
        lk_tensor *h = lk_relu(lk_conv2d(x, w, b, cp(1, 1, 1, 1, 1, 1, 1))); /* not straight into BN: db would be 0 */
        h = lk_batch_norm(h, rm, rv, g, NULL, true, 0.1f, 1e-5f);
        h = lk_max_pool2d(h, pp(2, 2, 0, 0, 0, 0, true, false));
        lk_rng r;
        lk_rng_init(&r, 9, LK_RNG_USER, 0, 0);
        lk_tensor *gy = lk_tensor_randn(&r, 4, h->shape, 0.0f, 1.0f);
        CHECK_OK(lk_backward_with(h, gy));
        out[threads - 1] = lk_tensor_clone(h);
        for (int i = 0; i < 4; i++) grads[threads - 1][i] = ps[i]->grad ? lk_tensor_clone(ps[i]->grad) : NULL;
        lk_tensor_release(gy);
        lk_scope_end();
        lk_tensor_release(rm);
        lk_tensor_release(rv);
    }
    lk_set_num_threads(2);
    for (int t = 1; t < 3; t++) {
        CHECK_MSG(out[t] && !memcmp(out[t]->data, out[0]->data, (size_t)out[0]->numel * 4), "threads %d: output", t + 1);
        for (int i = 0; i < 4; i++) {
            lk_tensor *a = grads[t][i], *e = grads[0][i];
            if (!a || !e) {
                CHECK(0);
                continue;
            }
            double err = 0, scale = 1e-12; /* max abs error over the tensor's max abs value */
            for (int64_t k = 0; k < e->numel; k++) {
                err = fmax(err, fabs(((float *)a->data)[k] - ((float *)e->data)[k]));
                scale = fmax(scale, fabs(((float *)e->data)[k]));
            }
            err /= scale;
            bool exact = i == 0 || i == 3; /* dX and the BN weight: same sums in the same order */
            CHECK_MSG(exact ? err == 0 : err < 1e-5, "threads %d: grad %d differs by %g", t + 1, i, err);
        }
    }
    for (int t = 0; t < 3; t++) {
        lk_tensor_release(out[t]);
        for (int i = 0; i < 4; i++) lk_tensor_release(grads[t][i]);
    }
    lk_tensor *ts[] = {x, w, b, g};
    for (size_t i = 0; i < 4; i++) lk_tensor_release(ts[i]);
}

static void conv_net_steady_state(void) {
    lk_tensor *x = lk_gc_param(41, LK_SHAPE(6, 1, 12, 12));
    lk_tensor_set_requires_grad(x, false);
    lk_tensor *w1 = lk_gc_param(42, LK_SHAPE(4, 1, 3, 3)), *b1 = lk_gc_param(43, LK_SHAPE(4));
    lk_tensor *w2 = lk_gc_param(44, LK_SHAPE(8, 4, 3, 3)), *g = lk_gc_param(45, LK_SHAPE(8));
    lk_tensor *rm = lk_tensor_zeros(LK_F32, LK_SHAPE(8)), *rv = lk_tensor_full(LK_F32, LK_SHAPE(8), 1.0);
    for (int it = 0; it < 3; it++) {
        uint64_t before = lk_alloc_count();
        lk_scope_begin();
        lk_tensor *h = lk_max_pool2d(lk_relu(lk_conv2d(x, w1, b1, cp(1, 1, 1, 1, 1, 1, 1))),
                                     pp(2, 2, 0, 0, 0, 0, true, false));
        h = lk_batch_norm(lk_conv2d(h, w2, NULL, cp(1, 1, 1, 1, 1, 1, 1)), rm, rv, g, NULL, true, 0.1f, 1e-5f);
        lk_tensor *loss = lk_mean(lk_adaptive_avg_pool2d(lk_relu(h), 1, 1), NULL, 0, false);
        CHECK_OK(lk_backward(loss));
        lk_scope_end();
        if (it == 2)
            CHECK_MSG(lk_alloc_count() == before, "%llu allocations in a steady-state step",
                      (unsigned long long)(lk_alloc_count() - before));
    }
    CHECK(w1->grad && w2->grad && b1->grad && g->grad);
    lk_tensor *ts[] = {x, w1, b1, w2, g, rm, rv};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) lk_tensor_release(ts[i]);
}

/* ---- bad input ------------------------------------------------------------------------ */

static lk_status st_of(lk_tensor *t) { return t ? LK_STATUS_OK : lk_last_status(); }

static void bad_input(void) {
    lk_tensor *x = lk_tensor_zeros(LK_F32, LK_SHAPE(2, 3, 5, 5)), *w = lk_tensor_zeros(LK_F32, LK_SHAPE(8, 4, 3, 3));
    lk_tensor *w3 = lk_tensor_zeros(LK_F32, LK_SHAPE(8, 3, 3, 3)), *big = lk_tensor_zeros(LK_F32, LK_SHAPE(2, 3, 7, 7));
    lk_tensor *b5 = lk_tensor_zeros(LK_F32, LK_SHAPE(5)), *xi = lk_tensor_zeros(LK_I32, LK_SHAPE(2, 3, 5, 5));
    lk_tensor *x2 = lk_tensor_zeros(LK_F32, LK_SHAPE(3, 5)), *one = lk_tensor_zeros(LK_F32, LK_SHAPE(1, 3, 1, 1));
    lk_tensor *c3 = lk_tensor_zeros(LK_F32, LK_SHAPE(3)), *c4 = lk_tensor_zeros(LK_F32, LK_SHAPE(4));
    lk_scope_begin();
    CHECK_ERR(st_of(lk_conv2d(x, w, NULL, LK_CONV2D_DEFAULT)), LK_STATUS_INVALID_ARGUMENT,
              "conv2d: input channels 3 do not match weight [8, 4, 3, 3] (groups 1)");
    CHECK_ERR(st_of(lk_conv2d(x, w3, NULL, cp(0, 1, 0, 0, 1, 1, 1))), LK_STATUS_INVALID_ARGUMENT, "must be >= 1");
    CHECK_ERR(st_of(lk_conv2d(x, w3, NULL, cp(1, 1, 0, 0, 1, 1, 2))), LK_STATUS_INVALID_ARGUMENT,
              "input channels 3 (input [2, 3, 5, 5]) are not divisible by groups 2");
    CHECK_ERR(st_of(lk_conv2d(x, big, NULL, LK_CONV2D_DEFAULT)), LK_STATUS_INVALID_ARGUMENT,
              "kernel 7x7 (dilation {1, 1}) is larger than the padded input 5x5");
    CHECK_ERR(st_of(lk_conv2d(x, w3, NULL, cp(1, 1, 0, 0, 3, 3, 1))), LK_STATUS_INVALID_ARGUMENT,
              "larger than the padded input");
    CHECK_ERR(st_of(lk_conv2d(x, w3, b5, LK_CONV2D_DEFAULT)), LK_STATUS_INVALID_ARGUMENT,
              "bias [5] does not match weight [8, 3, 3, 3] (expected [8])");
    CHECK_ERR(st_of(lk_conv2d(x2, w3, NULL, LK_CONV2D_DEFAULT)), LK_STATUS_INVALID_ARGUMENT,
              "input must be [N, C, H, W], got [3, 5]");
    CHECK_ERR(st_of(lk_conv2d(xi, w3, NULL, LK_CONV2D_DEFAULT)), LK_STATUS_UNSUPPORTED, "i32");
    { /* f32 and 16-bit operands mixed outside autocast: refused, naming the dtypes (torch refuses too);
       * under autocast the same call runs in the region's dtype */
        lk_tensor *xb = lk_tensor_cast(x, LK_BF16);
        CHECK_ERR(st_of(lk_conv2d(xb, w3, NULL, LK_CONV2D_DEFAULT)), LK_STATUS_INVALID_ARGUMENT,
                  "conv2d: input bf16, weight f32: outside autocast every operand must have the same dtype");
        lk_autocast_enter(LK_BF16);
        lk_tensor *y = lk_conv2d(xb, w3, NULL, LK_CONV2D_DEFAULT);
        lk_autocast_exit();
        CHECK(y && y->dtype == LK_BF16);
        lk_tensor_release(xb);
    }
    CHECK_ERR(st_of(lk_conv2d(NULL, w3, NULL, LK_CONV2D_DEFAULT)), LK_STATUS_INVALID_ARGUMENT, "NULL");
    CHECK_ERR(st_of(lk_max_pool2d(x, pp(3, 3, 1, 1, 2, 2, true, false))), LK_STATUS_INVALID_ARGUMENT,
              "padding {2, 2} must be at most half of kernel {3, 3}");
    CHECK_ERR(st_of(lk_avg_pool2d(x, pp(0, 2, 1, 1, 0, 0, true, false))), LK_STATUS_INVALID_ARGUMENT, "must be >= 1");
    CHECK_ERR(st_of(lk_max_pool2d(x, pp(6, 6, 1, 1, 0, 0, true, false))), LK_STATUS_INVALID_ARGUMENT,
              "input [2, 3, 5, 5] is too small for kernel {6, 6}");
    CHECK_ERR(st_of(lk_max_pool2d(x2, pp(2, 2, 1, 1, 0, 0, true, false))), LK_STATUS_INVALID_ARGUMENT,
              "max_pool2d: input must be [N, C, H, W] or [C, H, W], got [3, 5]");
    CHECK_ERR(st_of(lk_adaptive_avg_pool2d(x, 0, 2)), LK_STATUS_INVALID_ARGUMENT, "output size 0x2");
    CHECK_ERR(st_of(lk_batch_norm(one, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f)), LK_STATUS_INVALID_ARGUMENT,
              "expected more than 1 value per channel when training, got input [1, 3, 1, 1]");
    CHECK_ERR(st_of(lk_batch_norm(x, c4, c3, NULL, NULL, true, 0.1f, 1e-5f)), LK_STATUS_INVALID_ARGUMENT,
              "running_mean [4] does not match input [2, 3, 5, 5] (expected [3])");
    CHECK_ERR(st_of(lk_batch_norm(x, NULL, NULL, c3, c4, true, 0.1f, 1e-5f)), LK_STATUS_INVALID_ARGUMENT,
              "bias [4] does not match input");
    CHECK_ERR(st_of(lk_batch_norm(x, NULL, NULL, NULL, NULL, false, 0.1f, 1e-5f)), LK_STATUS_INVALID_ARGUMENT,
              "eval mode");
    CHECK_ERR(st_of(lk_batch_norm(c3, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f)), LK_STATUS_INVALID_ARGUMENT,
              "got [3]");
    /* batch of one with H*W > 1 is fine in training, and [1, C] is fine in eval */
    CHECK_OK(st_of(lk_batch_norm(lk_slice(x, 0, 0, 1), NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f)));
    CHECK_OK(st_of(lk_batch_norm(one, c3, c3, NULL, NULL, false, 0.1f, 1e-5f)));
    lk_scope_end();
    lk_tensor *ts[] = {x, w, w3, big, b5, xi, x2, one, c3, c4};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) lk_tensor_release(ts[i]);
}

LK_TEST_MAIN(LK_TEST_CASE(conv_gradchecks), LK_TEST_CASE(conv_matches_direct_loops), LK_TEST_CASE(parallel_matches_serial), LK_TEST_CASE(gemm_split_matches_serial),
             LK_TEST_CASE(linear_pair_matches_serial), LK_TEST_CASE(conv_known_values),
             LK_TEST_CASE(pool_gradchecks), LK_TEST_CASE(pool_known_values), LK_TEST_CASE(max_pool_ties_and_nan),
             LK_TEST_CASE(batch_norm_gradchecks), LK_TEST_CASE(batch_norm_running_stats),
             LK_TEST_CASE(conv_net_steady_state), LK_TEST_CASE(bad_input))

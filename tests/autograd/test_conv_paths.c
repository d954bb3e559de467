/* conv2d's two CPU paths, oneDNN's convolutions and im2col + GEMM (LK_CONV,
 * src/backend/cpu/conv_path.c): on the ResNet's and the cnn's shapes and
 * on odd ones (stride, padding, dilation, groups, a bias, 1x1, a batch that
 * the threads split unevenly) the output and the three gradients agree to
 * f32 rounding; the oneDNN path repeats its bits run to run and at a given
 * thread count (the ddp resume tests rely on that); the gradients of a
 * weight whose .grad already holds a value accumulate on both; and where
 * oneDNN is built, it takes its own kernels (not its reference code) for
 * the ResNet's shapes, and LK_CONV=auto sends each ResNet shape where its
 * rule says. */
#include <math.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "gradcheck.h"
#include "lk_capture.h"

typedef struct {
    int N, C, H, O, k;
    lk_conv2d_params p;
    bool bias;
} conv_case;

static const conv_case cases[] = {
    {9, 1, 28, 8, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, false},  /* resnet stem */
    {9, 8, 28, 8, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, false},  /* layer1 */
    {9, 8, 28, 16, 3, {{2, 2}, {1, 1}, {1, 1}, 1}, false}, /* layer2.0.conv1 */
    {9, 8, 28, 16, 1, {{2, 2}, {0, 0}, {1, 1}, 1}, false}, /* layer2.0.downsample */
    {9, 32, 7, 32, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, false}, /* layer3 */
    {7, 1, 28, 32, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true},  /* cnn conv1 */
    {7, 32, 14, 64, 3, {{1, 1}, {1, 1}, {1, 1}, 1}, true}, /* cnn conv2 */
    {4, 3, 13, 5, 5, {{1, 1}, {2, 2}, {1, 1}, 1}, true},   /* 5x5, odd size */
    {5, 4, 11, 6, 3, {{2, 2}, {0, 0}, {2, 2}, 2}, true},   /* dilated, grouped, no padding */
    {3, 6, 9, 6, 3, {{1, 1}, {1, 1}, {1, 1}, 3}, true},    /* grouped 3 */
    {2, 3, 5, 4, 1, {{1, 1}, {0, 0}, {1, 1}, 1}, true},    /* 1x1 */
};

typedef struct {
    lk_tensor *y, *dx, *dw, *db;
} result;

static void result_free(result *r) {
    lk_tensor_release(r->y);
    lk_tensor_release(r->dx);
    lk_tensor_release(r->dw);
    lk_tensor_release(r->db);
    memset(r, 0, sizeof *r);
}

/* Forward and backward of one case on `path`; a weight gradient pre-filled
 * with 0.5 when `pre` (accumulation). */
static result run_case_in(const conv_case *c, int path, bool pre, lk_dtype autocast) {
    lk__cpu_conv_use(path);
    lk_tensor *x = lk_gc_param(31, LK_SHAPE(c->N, c->C, c->H, c->H));
    lk_tensor *w = lk_gc_param(32, LK_SHAPE(c->O, c->C / c->p.groups, c->k, c->k));
    lk_tensor *b = c->bias ? lk_gc_param(33, LK_SHAPE(c->O)) : NULL;
    if (pre) {
        w->grad = lk_tensor_zeros(LK_F32, 4, w->shape);
        for (int64_t i = 0; i < w->numel; i++) ((float *)w->grad->data)[i] = 0.5f;
    }
    result r = {0};
    lk_scope_begin();
    if (autocast != LK_F32) lk_autocast_enter(autocast);
    lk_tensor *y = lk_conv2d(x, w, b, c->p);
    if (autocast != LK_F32) lk_autocast_exit();
    CHECK_MSG(y != NULL, "%s", lk_last_error());
    if (y) {
        lk_rng g;
        lk_rng_init(&g, 7, LK_RNG_USER, 1, 1);
        lk_tensor *gy = lk_tensor_randn(&g, 4, y->shape, 0.0f, 1.0f), *gc = lk_tensor_cast(gy, y->dtype);
        CHECK_OK(lk_backward_with(y, gc));
        lk_tensor_release(gy);
        lk_tensor_release(gc);
        r.y = lk_tensor_cast(y, LK_F32); /* a bf16 output widened for the comparison */
    }
    lk_scope_end();
    r.dx = lk_tensor_retain(x->grad), r.dw = lk_tensor_retain(w->grad), r.db = b ? lk_tensor_retain(b->grad) : NULL;
    lk_tensor_release(x);
    lk_tensor_release(w);
    lk_tensor_release(b);
    lk__cpu_conv_use(LK__CONV_AUTO);
    return r;
}

static result run_case(const conv_case *c, int path, bool pre) { return run_case_in(c, path, pre, LK_F32); }

/* max |a - b| / max(1, max |b|) */
static double rel_diff(const lk_tensor *a, const lk_tensor *b) {
    if (!a || !b) return a == b ? 0 : INFINITY;
    double m = 1, d = 0;
    for (int64_t i = 0; i < b->numel; i++) {
        double u = ((const float *)a->data)[i], v = ((const float *)b->data)[i];
        m = fmax(m, fabs(v)), d = fmax(d, fabs(u - v));
    }
    return d / m;
}

static bool same_bits(const lk_tensor *a, const lk_tensor *b) {
    if (!a || !b) return a == b;
    return a->numel == b->numel && !memcmp(a->data, b->data, sizeof(float) * (size_t)a->numel);
}

/* f32 sums of at most 32*9 (forward) or 9*N*P (dW) products of N(0,1)
 * values, in two orders: 1e-5 of the largest value. */
static void paths_agree_at(int threads, bool pre) {
    lk_set_num_threads(threads);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t runs = lk__cpu_conv_dnnl_runs();
        result a = run_case(&cases[k], LK__CONV_ONEDNN, pre);
#ifdef LK_HAVE_DNNL
        CHECK_MSG(lk__cpu_conv_dnnl_runs() >= runs + 3, "case %zu: f32 did not run through oneDNN", k);
#else
        (void)runs;
#endif
        result b = run_case(&cases[k], LK__CONV_IM2COL, pre);
        double ey = rel_diff(a.y, b.y), ex = rel_diff(a.dx, b.dx), ew = rel_diff(a.dw, b.dw), eb = rel_diff(a.db, b.db);
        CHECK_MSG(ey < 1e-5 && ex < 1e-5 && ew < 1e-5 && eb < 1e-5,
                  "case %zu, %d threads%s: onednn vs im2col rel diff y %g dx %g dw %g db %g", k, threads,
                  pre ? ", accumulating" : "", ey, ex, ew, eb);
        result_free(&a);
        result_free(&b);
    }
    lk_set_num_threads(2);
}

static void paths_agree(void) {
    (void)lk_gradcheck; /* gradcheck.h is here for lk_gc_param */
    for (int threads = 1; threads <= 3; threads++) paths_agree_at(threads, false);
    paths_agree_at(2, true);
}

/* Under bf16 autocast both paths multiply the same bf16-rounded operands
 * (an f32 x rounded by oneDNN's reorder or by im2col's cast, both to
 * nearest even) and sum in f32: the f32 gradients agree to f32 rounding
 * (1e-4 of the largest), the bf16 outputs to one bf16 rounding (2^-8,
 * 1e-2 with room). On a CPU without bf16 units oneDNN has only its
 * reference code for bf16, which this test allows, so the bf16 plumbing
 * (dtypes, reorders, the bias) is checked on every machine. */
static void bf16_paths_agree(void) {
    lk__cpu_conv_allow_ref(true);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t runs = lk__cpu_conv_dnnl_runs();
        result a = run_case_in(&cases[k], LK__CONV_ONEDNN, false, LK_BF16);
#ifdef LK_HAVE_DNNL
        CHECK_MSG(lk__cpu_conv_dnnl_runs() >= runs + 3, "case %zu: bf16 did not run through oneDNN", k);
#else
        (void)runs;
#endif
        result b = run_case_in(&cases[k], LK__CONV_IM2COL, false, LK_BF16);
        double ey = rel_diff(a.y, b.y), ex = rel_diff(a.dx, b.dx), ew = rel_diff(a.dw, b.dw), eb = rel_diff(a.db, b.db);
        CHECK_MSG(ey < 1e-2 && ex < 1e-4 && ew < 1e-4 && eb < 1e-4,
                  "case %zu, bf16 autocast: onednn vs im2col rel diff y %g dx %g dw %g db %g", k, ey, ex, ew, eb);
        result_free(&a);
        result_free(&b);
    }
    lk__cpu_conv_allow_ref(false);
}

/* The oneDNN path gives the same bits twice in a row at each thread count. */
static void onednn_repeats_its_bits(void) {
    for (int threads = 1; threads <= 2; threads++) {
        lk_set_num_threads(threads);
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            result a = run_case(&cases[k], LK__CONV_ONEDNN, false), b = run_case(&cases[k], LK__CONV_ONEDNN, false);
            CHECK_MSG(same_bits(a.y, b.y) && same_bits(a.dx, b.dx) && same_bits(a.dw, b.dw) && same_bits(a.db, b.db),
                      "case %zu, %d threads: two oneDNN runs differ", k, threads);
            result_free(&a);
            result_free(&b);
        }
    }
    lk_set_num_threads(2);
}

/* Where oneDNN is built, its own kernels (not its reference code) can run
 * the ResNet's f32 shapes in all three directions. */
static void onednn_takes_resnet_shapes(void) {
#ifdef LK_HAVE_DNNL
    for (size_t k = 0; k < 5; k++) {
        const conv_case *c = &cases[k];
        lk__dnnl_conv_shape s;
        memset(&s, 0, sizeof s);
        long OH = (c->H + 2 * c->p.padding[0] - c->k) / c->p.stride[0] + 1;
        s.N = 64, s.C = c->C, s.H = s.W = c->H, s.O = c->O, s.kh = s.kw = c->k, s.OH = s.OW = OH;
        s.sh = s.sw = c->p.stride[0], s.ph = s.pw = c->p.padding[0], s.dh = s.dw = 1, s.G = 1;
        s.dt[0] = s.dt[1] = s.dt[2] = s.mul = s.bias_dt = LK_F32;
        for (int kind = LK__DNNL_CONV_FWD; kind <= LK__DNNL_CONV_BWD_WEIGHTS; kind++) {
            const char *impl = lk__dnnl_conv_impl(kind, &s, false);
            CHECK_MSG(impl && !strstr(impl, "ref"), "case %zu kind %d: oneDNN's implementation %s", k, kind,
                      impl ? impl : "(none)");
        }
    }
#endif
}

/* LK_CONV=auto's rule on the ResNet's f32 shapes: im2col for the
 * 1-channel stem, the 1x1 shortcut and (where oneDNN's layouts are
 * 16-blocked, AVX-512) the 8 -> 8 layers; oneDNN for the rest. */
static void auto_picks_by_shape(void) {
#ifdef LK_HAVE_DNNL
    bool block16 = lk__dnnl_f32_block() == 16;
    const bool want[5] = {false, !block16, true, false, true}; /* cases 0-4: oneDNN runs them */
    for (size_t k = 0; k < 5; k++) {
        int64_t runs = lk__cpu_conv_dnnl_runs();
        result r = run_case(&cases[k], LK__CONV_AUTO, false);
        bool ran = lk__cpu_conv_dnnl_runs() > runs;
        CHECK_MSG(ran == want[k], "case %zu (%d -> %d channels, %dx%d, block %d): auto %s oneDNN", k, cases[k].C,
                  cases[k].O, cases[k].k, cases[k].k, lk__dnnl_f32_block(), ran ? "took" : "did not take");
        result_free(&r);
    }
#endif
}

/* LK_CONV picks the path; a value it does not know is named in a warning
 * and the automatic choice runs. */
static void lk_conv_env(void) {
    setenv("LK_CONV", "im2col", 1);
    lk__cpu_conv_use(-1); /* read LK_CONV again */
    CHECK(lk__cpu_conv_path() == LK__CONV_IM2COL);
    setenv("LK_CONV", "onednn", 1);
    lk__cpu_conv_use(-1);
    CHECK(lk__cpu_conv_path() == LK__CONV_ONEDNN);
    lk_t_capture cap;
    CHECK(lk_t_capture_begin(&cap) == 0);
    setenv("LK_CONV", "fft", 1);
    lk__cpu_conv_use(-1);
    int p = lk__cpu_conv_path();
    char buf[512];
    ssize_t got = lk_t_capture_end(&cap, buf, sizeof buf);
    CHECK(p == LK__CONV_AUTO);
    CHECK_MSG(got > 0 && strstr(buf, "LK_CONV=fft is none of auto, onednn, im2col: convolutions take the automatic choice"),
              "stderr: %s", buf);
    unsetenv("LK_CONV");
    lk__cpu_conv_use(LK__CONV_AUTO);
}

LK_TEST_MAIN(LK_TEST_CASE(lk_conv_env), LK_TEST_CASE(paths_agree), LK_TEST_CASE(bf16_paths_agree), LK_TEST_CASE(onednn_repeats_its_bits), LK_TEST_CASE(onednn_takes_resnet_shapes), LK_TEST_CASE(auto_picks_by_shape))

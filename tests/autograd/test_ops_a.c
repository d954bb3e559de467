/* Tests for the softmax family, the classification losses, dropout,
 * layer_norm and embedding: finite-difference gradient checks on odd and
 * size-1 shapes for every option, values against PyTorch 1.13 references
 * (computed once with torch.nn.functional on the deterministic inputs of
 * det_input() and pasted below), dropout mask statistics and determinism,
 * and the error message of every kind of bad input. */
#include "backend/kernels.h"
#include "gradcheck.h"

/* Reference values: PyTorch 1.13 (Debian python3-torch), float32, on
 * x[i] = sin(0.37 i + 0.1) * 3 in row-major order; see each test for the call. */
static const float ref_ce_a_mean[] = {1.64381814f};
static const float ref_ce_a_sum[] = {7.80813599f};
static const float ref_ce_a_none[] = {1.96752453f, 0.662355483f, 1.49401689f, 0.0f, 3.68423915f};
static const float ref_ce_a_mean_grad[] = {0.00314087188f, 0.0111392103f, 0.0291337594f, -0.183601007f, 0.0646253452f, 0.0506103672f, 0.0249514598f, -0.0182396956f, 0.0246417616f, 0.00596571714f, -0.000399369543f, -0.00289828889f, -0.00416680472f, -0.00490331836f, -0.000500355731f, -0.000122031255f, 0.00276142219f, 0.0135767842f, 0.0453784317f, 0.113898903f, -0.174993157f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.00558745395f, 0.00259840861f, -0.187521949f, 0.00378098176f, 0.0116103459f, 0.0384684764f, 0.125476286f};
static const float ref_ce_b_mean[] = {3.25505996f};
static const float ref_ce_b_wsum[] = {43.1279716f};
static const float ref_ce_b_wmean_grad[] = {-0.0654849336f, 0.0389317311f, 0.0f, 0.0573041141f, 0.214116156f, 0.0f, 0.0231586788f, 0.0285185408f, 0.0f, -0.0149778621f, -0.281566411f, 0.0f, -0.00364819774f, -0.00381253241f, -0.00365019916f, -0.0066453875f, -0.138592422f, -0.132743478f, -0.173031121f, 0.0510012805f, 0.0955744684f, 0.183324724f, 0.0914036781f, 0.0408191979f};
static const float ref_nll_b_none[] = {3.00841451f, 20.6477108f, 0.0f, 5.43613958f, 8.08344364f, 5.95226145f};
static const float ref_bce_mean[] = {1.25274336f};
static const float ref_bce_dx[] = {0.166666672f, 0.325570047f, -0.109988749f, 0.2481886f, -0.211763099f, -1.33851087f, 0.159811571f, 0.196981177f, -0.088163726f, 0.291424662f, -0.128800794f, -2.16647482f};
static const float ref_bce_dt[] = {0.0f, -0.181483522f, -0.230371043f, -0.0276678111f, 0.138534084f, 0.23926948f, 0.0513971262f, -0.147256181f, -0.237326846f, -0.0714035556f, 0.107111812f, 0.318970799f};
static const float ref_bcel_sum[] = {22.5086193f};
static const float ref_bcel_dx[] = {0.574320376f, 0.244427085f, -0.241861582f, 0.943044782f, 0.464426279f, -0.0870560408f, 0.899952233f, 0.0216023922f, -0.219588041f, 0.29874596f, -1.00924253f, -3.25103903f};
static const float ref_bcel_dt[] = {-0.576784194f, -1.24429274f, -2.08130431f, -2.66024423f, -3.02416945f, -2.75698423f, -2.03857398f, -0.711582601f, -0.533680737f, 1.45735741f, 4.81094551f, 9.17749023f};
static const float ref_ln_y[] = {-1.64183903f, -0.589828074f, 0.453340501f, 1.27829599f, 1.68558276f, 1.25580275f, 0.937303007f, 0.25744468f, -0.732810974f, -1.92038405f, 1.7960577f, 0.0416452289f, -1.04784071f, -1.04902494f, 0.326558024f};
static const float ref_ln_dx[] = {0.080297865f, -0.0790325105f, -0.107807666f, -0.0237593204f, 0.130301803f, -0.0846925378f, 0.027709797f, 0.0794148743f, 0.0474288017f, -0.0698611885f, 0.0827687979f, 0.311182976f, 0.210126877f, -0.108173609f, -0.495904446f};
static const float ref_ln_dw[] = {0.137626022f, 0.544063866f, 1.72213447f, 2.34490657f, 2.05085707f};
static const float ref_ln_db[] = {1.22540307f, 1.09295964f, 0.893796802f, 0.654869795f, 0.408516765f};
static const float ref_softmax_d1[] = {0.0438493192f, 0.106081992f, 0.303441346f, 0.451421529f, 0.652709365f, 0.442496508f, 0.862294078f, 0.880499244f, 0.122413985f, 0.101292782f, 0.0152919842f, 0.0182079393f};
static const float ref_logsoftmax_d1[] = {-3.12699604f, -2.24354315f, -1.19256687f, -0.79535377f, -0.426623374f, -0.815322757f, -0.148158923f, -0.127266198f, -2.1003468f, -2.28974009f, -4.1804266f, -4.00589752f};

/* The deterministic input the references were computed on. */
static lk_tensor *det_input(int ndim, const int64_t *shape, bool grad) {
    lk_tensor *t = lk_tensor_empty(LK_F32, ndim, shape);
    float *d = t->data;
    for (int64_t i = 0; i < t->numel; i++) d[i] = sinf(0.37f * (float)i + 0.1f) * 3.0f;
    lk_tensor_set_requires_grad(t, grad);
    return t;
}

static lk_tensor *f32_data(int ndim, const int64_t *shape, const float *v) {
    return lk_tensor_from_data(LK_F32, ndim, shape, v);
}

static lk_tensor *i64_data(int ndim, const int64_t *shape, const int64_t *v) {
    return lk_tensor_from_data(LK_I64, ndim, shape, v);
}

/* |a - b| <= rtol |b| + atol for every element; prints the first misses. */
static void check_close_tol(const char *what, const lk_tensor *t, const float *ref, int64_t n, double rtol,
                            double atol) {
    CHECK_MSG(t != NULL, "%s: NULL (%s)", what, lk_last_error());
    if (!t) return;
    CHECK_MSG(t->numel == n, "%s: %lld elements, expected %lld", what, (long long)t->numel, (long long)n);
    int bad = 0;
    double maxd = 0;
    for (int64_t i = 0; i < n && i < t->numel; i++) {
        double a = lk_tensor_get(t, i), b = ref[i], d = fabs(a - b);
        if (d > maxd) maxd = d;
        if (!(d <= rtol * fabs(b) + atol)) {
            if (bad < 4) fprintf(stderr, "%s[%lld]: got %.9g, PyTorch %.9g\n", what, (long long)i, a, b);
            bad++;
        }
    }
    CHECK_MSG(bad == 0, "%s: %d elements differ (max |diff| %.3g)", what, bad, maxd);
}

/* The parity bound: f32 relative error 1e-5 (plus 1e-6 absolute near 0). */
static void check_close(const char *what, const lk_tensor *t, const float *ref, int64_t n) {
    check_close_tol(what, t, ref, n, 1e-5, 1e-6);
}

/* A failing op returns NULL; CHECK_ERR wants the status. */
#define OP_STATUS(call) ((call) ? LK_STATUS_OK : lk_last_status())

/* ---- lk_k_expf ----------------------------------------------------------------- */

static void expf_kernel_accuracy(void) {
    /* Every 61st float of the finite range (about 35M points) against double exp. */
    double maxrel = 0;
    float worst = 0;
    union { float f; uint32_t u; } a, b;
    a.f = 87.5f;
    b.f = 88.5f;
    for (uint32_t u = 0; u <= a.u; u += 61) { /* negative side: bits of -0 .. -87.5 */
        union { uint32_t u; float f; } v = {u | 0x80000000u};
        double rel = fabs(lk_k_expf(v.f) - exp((double)v.f)) / exp((double)v.f);
        if (rel > maxrel) maxrel = rel, worst = v.f;
    }
    for (uint32_t u = 0; u <= b.u; u += 61) {
        union { uint32_t u; float f; } v = {u};
        double rel = fabs(lk_k_expf(v.f) - exp((double)v.f)) / exp((double)v.f);
        if (rel > maxrel) maxrel = rel, worst = v.f;
    }
    CHECK_MSG(maxrel < 1.2e-7, "lk_k_expf: max relative error %.3g at x = %.9g", maxrel, (double)worst);
    CHECK(lk_k_expf(0.0f) == 1.0f);
    CHECK(lk_k_expf(-INFINITY) == 0.0f);
    CHECK(lk_k_expf(-100.0f) == 0.0f);
    CHECK(isinf(lk_k_expf(INFINITY)) && isinf(lk_k_expf(89.0f)));
    CHECK(isnan(lk_k_expf(NAN)));
    CHECK(isfinite(lk_k_expf(88.5f)) && fabs(lk_k_expf(88.5f) / exp(88.5) - 1) < 2e-7);
}

static void philox_x8_kernel(void) {
    uint32_t key[2] = {0x12345678u, 0x9abcdef0u}, out[4 * LK_K_LANES], ref[4];
    uint32_t ctrs[][4] = {{0, 0, 0, 0}, {0xFFFFFFFCu, 7, 3, 4}, {123, 456, 789, 1011}, {0xFFFFFFFFu, 0xFFFFFFFFu, 1, 2}};
    int bad = 0;
    for (int c = 0; c < 4; c++) {
        lk_k_philox4x32_10_x8(ctrs[c], key, out);
        for (uint32_t j = 0; j < LK_K_LANES; j++) {
            uint32_t lo = ctrs[c][0] + j, cc[4] = {lo, ctrs[c][1] + (lo < ctrs[c][0]), ctrs[c][2], ctrs[c][3]};
            lk_philox4x32_10(cc, key, ref);
            for (int k = 0; k < 4; k++) bad += ref[k] != out[4 * j + k];
        }
    }
    CHECK_MSG(bad == 0, "%d words of lk_k_philox4x32_10_x8 differ from lk_philox4x32_10", bad);
}

/* ---- softmax / log_softmax -------------------------------------------------------- */

static void softmax_values(void) {
    lk_scope_begin();
    lk_tensor *x = f32_data(LK_SHAPE(3), (float[]){1, 2, 3});
    lk_tensor *y = lk_softmax(x, 0), *ly = lk_log_softmax(x, -1);
    /* exp(k) / (e + e^2 + e^3) */
    check_close("softmax [1,2,3]", y, (float[]){0.0900305732f, 0.244728471f, 0.665240956f}, 3);
    check_close("log_softmax [1,2,3]", ly, (float[]){-2.40760596f, -1.40760596f, -0.407605964f}, 3);
    /* Max-subtracted: huge logits do not overflow; -inf gets probability 0. */
    lk_tensor *big = f32_data(LK_SHAPE(2, 3), (float[]){1000, 1001, 1002, -INFINITY, 0, -INFINITY});
    lk_tensor *yb = lk_softmax(big, 1), *lyb = lk_log_softmax(big, 1);
    check_close("softmax of large logits", yb,
                (float[]){0.0900305732f, 0.244728471f, 0.665240956f, 0.0f, 1.0f, 0.0f}, 6);
    CHECK(lyb && fabsf(((float *)lyb->data)[2] - -0.407605964f) < 1e-6f && ((float *)lyb->data)[4] == 0.0f &&
          isinf(((float *)lyb->data)[3]));
    /* A dim that is not the last: torch.softmax(x, 1) on [2, 3, 2]. */
    lk_tensor *x3 = det_input(LK_SHAPE(2, 3, 2), false);
    check_close("softmax dim 1", lk_softmax(x3, 1), ref_softmax_d1, 12);
    check_close("log_softmax dim 1", lk_log_softmax(x3, -2), ref_logsoftmax_d1, 12);
    /* Long rows (lanes plus a tail) sum to one; a 0-d input gives 1. */
    lk_tensor *lr = det_input(LK_SHAPE(3, 1001), false);
    lk_tensor *s = lk_sum(lk_softmax(lr, 1), (int[]){1}, 1, false);
    for (int i = 0; s && i < 3; i++) CHECK_NEAR(lk_tensor_get(s, i), 1.0, 1e-5);
    lk_tensor *sc = lk_tensor_scalar(3.0f);
    CHECK(lk_tensor_item(lk_softmax(sc, 0)) == 1.0f && lk_tensor_item(lk_log_softmax(sc, -1)) == 0.0f);
    lk_tensor_release(x);
    lk_tensor_release(big);
    lk_tensor_release(x3);
    lk_tensor_release(lr);
    lk_tensor_release(sc);
    lk_scope_end();
}

typedef struct {
    int dim, log;
} softmax_ctx;

static lk_tensor *f_softmax(lk_tensor **in, void *ctx) {
    softmax_ctx *c = ctx;
    return c->log ? lk_log_softmax(in[0], c->dim) : lk_softmax(in[0], c->dim);
}

static void softmax_gradchecks(void) {
    struct {
        int ndim;
        int64_t shape[4];
        int dim;
    } cases[] = {{2, {5, 7}, -1}, {2, {4, 13}, 0}, {3, {3, 1, 4}, 1}, {3, {2, 5, 3}, 1},
                 {1, {11}, 0},    {3, {2, 3, 1}, 2}, {4, {2, 3, 2, 5}, 1}, {2, {3, 17}, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        for (int log = 0; log < 2; log++) {
            lk_tensor *x = lk_gc_param(10 + (uint32_t)k, cases[k].ndim, cases[k].shape);
            softmax_ctx c = {cases[k].dim, log};
            char name[64];
            snprintf(name, sizeof name, "%s case %zu", log ? "log_softmax" : "softmax", k);
            lk_gradcheck(name, f_softmax, &x, 1, &c);
            lk_tensor_release(x);
        }
    /* A transposed (non-contiguous) input. */
    lk_tensor *x = lk_gc_param(9, LK_SHAPE(7, 5));
    lk_scope_begin();
    lk_tensor *xt = lk_transpose(x, 0, 1);
    lk_tensor *a = lk_softmax(xt, 1), *b = lk_softmax(lk_contiguous(xt), 1);
    CHECK(a && b && lk_tensor_same_shape(a, b));
    for (int64_t i = 0; a && b && i < a->numel; i++) CHECK(lk_tensor_get(a, i) == lk_tensor_get(b, i));
    lk_scope_end();
    lk_tensor_release(x);
}

/* ---- cross_entropy / nll_loss --------------------------------------------------------- */

static void cross_entropy_values(void) {
    lk_scope_begin();
    /* Hand-computed: rows [1,2,3] -> target 2, [1,1,1] -> target 0. */
    lk_tensor *x = f32_data(LK_SHAPE(2, 3), (float[]){1, 2, 3, 1, 1, 1});
    lk_tensor *t = i64_data(LK_SHAPE(2), (int64_t[]){2, 0});
    float l0 = 0.407605964f, l1 = 1.09861229f; /* -log(e^3 / (e + e^2 + e^3)), log 3 */
    CHECK_NEAR(lk_tensor_item(lk_cross_entropy(x, t, NULL)), (l0 + l1) / 2, 1e-6);
    lk_cross_entropy_opts o = lk_cross_entropy_opts_default();
    o.reduction = LK_REDUCTION_SUM;
    CHECK_NEAR(lk_tensor_item(lk_cross_entropy(x, t, &o)), l0 + l1, 2e-6);
    /* Label smoothing 0.3 on the uniform row changes nothing: every -log p is log 3. */
    o.reduction = LK_REDUCTION_NONE;
    o.label_smoothing = 0.3f;
    lk_tensor *ln = lk_cross_entropy(x, t, &o);
    CHECK(ln && ln->ndim == 1 && ln->shape[0] == 2);
    if (ln) CHECK_NEAR(lk_tensor_get(ln, 1), l1, 1e-6);
    /* i32 targets give the same. */
    lk_tensor *t32 = lk_tensor_cast(t, LK_I32);
    CHECK_NEAR(lk_tensor_item(lk_cross_entropy(x, t32, NULL)), (l0 + l1) / 2, 1e-6);

    /* PyTorch: F.cross_entropy(x[5, 7], [3, 0, 6, -100, 2], weight=0.5 + 0.25 c, label_smoothing=0.1). */
    lk_tensor *xa = det_input(LK_SHAPE(5, 7), true);
    lk_tensor *ta = i64_data(LK_SHAPE(5), (int64_t[]){3, 0, 6, -100, 2});
    float wv[7];
    for (int c = 0; c < 7; c++) wv[c] = 0.5f + 0.25f * (float)c;
    lk_tensor *wa = f32_data(LK_SHAPE(7), wv);
    o = (lk_cross_entropy_opts){LK_REDUCTION_MEAN, 0.1f, -100, wa};
    lk_tensor *lm = lk_cross_entropy(xa, ta, &o);
    check_close("ce weighted smoothed mean", lm, ref_ce_a_mean, 1);
    CHECK_OK(lk_backward(lm));
    check_close("ce weighted smoothed mean grad", xa->grad, ref_ce_a_mean_grad, 35);
    o.reduction = LK_REDUCTION_SUM;
    check_close("ce weighted smoothed sum", lk_cross_entropy(xa, ta, &o), ref_ce_a_sum, 1);
    o.reduction = LK_REDUCTION_NONE;
    check_close("ce weighted smoothed none", lk_cross_entropy(xa, ta, &o), ref_ce_a_none, 5);

    /* [N, C, d]: F.cross_entropy(x[2, 4, 3], [[0, 3, -100], [2, 1, 1]], ...). */
    lk_tensor *xb = det_input(LK_SHAPE(2, 4, 3), true);
    lk_tensor *tb = i64_data(LK_SHAPE(2, 3), (int64_t[]){0, 3, -100, 2, 1, 1});
    lk_tensor *wb = f32_data(LK_SHAPE(4), (float[]){1, 2, 3, 4});
    o = (lk_cross_entropy_opts){LK_REDUCTION_MEAN, 0.2f, -100, NULL};
    check_close("ce [N,C,d] smoothed mean", lk_cross_entropy(xb, tb, &o), ref_ce_b_mean, 1);
    o = (lk_cross_entropy_opts){LK_REDUCTION_SUM, 0.0f, -100, wb};
    check_close("ce [N,C,d] weighted sum", lk_cross_entropy(xb, tb, &o), ref_ce_b_wsum, 1);
    o = (lk_cross_entropy_opts){LK_REDUCTION_MEAN, 0.2f, -100, wb};
    CHECK_OK(lk_backward(lk_cross_entropy(xb, tb, &o)));
    check_close("ce [N,C,d] weighted smoothed mean grad", xb->grad, ref_ce_b_wmean_grad, 24);
    o = (lk_cross_entropy_opts){LK_REDUCTION_NONE, 0.0f, -100, wb};
    check_close("nll [N,C,d] weighted none", lk_nll_loss(lk_log_softmax(xb, 1), tb, &o), ref_nll_b_none, 6);
    /* Fused = composed, for every reduction, with a valid class (1) ignored. */
    lk_tensor *tb1 = i64_data(LK_SHAPE(2, 3), (int64_t[]){0, 3, 1, 2, 1, 1});
    for (int red = 0; red < 3; red++) {
        o = (lk_cross_entropy_opts){(lk_reduction)red, 0.0f, 1, wb};
        lk_tensor *a = lk_cross_entropy(xb, tb1, &o), *b = lk_nll_loss(lk_log_softmax(xb, 1), tb1, &o);
        CHECK(a && b && a->numel == b->numel);
        for (int64_t i = 0; a && b && i < a->numel; i++) CHECK_NEAR(lk_tensor_get(a, i), lk_tensor_get(b, i), 1e-5);
    }
    /* Every target ignored: mean is NaN (0/0) as in PyTorch, sum is 0. */
    lk_tensor *tn = i64_data(LK_SHAPE(2), (int64_t[]){-100, -100});
    CHECK(isnan(lk_tensor_item(lk_cross_entropy(x, tn, NULL))));
    o = (lk_cross_entropy_opts){LK_REDUCTION_SUM, 0.1f, -100, NULL};
    CHECK(lk_tensor_item(lk_cross_entropy(x, tn, &o)) == 0.0f);
    lk_tensor *objs[] = {x, t, t32, xa, ta, wa, xb, tb, tb1, wb, tn};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) lk_tensor_release(objs[i]);
    lk_scope_end();
}

typedef struct {
    lk_tensor *target;
    lk_cross_entropy_opts o;
    int nll; /* nll_loss(log_softmax(x, 1)) instead of cross_entropy(x) */
} ce_ctx;

static lk_tensor *f_ce(lk_tensor **in, void *ctx) {
    ce_ctx *c = ctx;
    if (c->nll) return lk_nll_loss(lk_log_softmax(in[0], in[0]->ndim == 1 ? 0 : 1), c->target, &c->o);
    return lk_cross_entropy(in[0], c->target, &c->o);
}

static void cross_entropy_gradchecks(void) {
    struct {
        int ndim;
        int64_t shape[4];
        int64_t target[16];
    } cases[] = {
        {2, {5, 7}, {3, 0, 6, 1, 2}},
        {2, {11, 5}, {0, 4, -100, 2, 2, 1, 3, -100, 0, 4, 1}},
        {2, {1, 13}, {12}},
        {2, {3, 1}, {0, -100, 0}},
        {3, {3, 4, 5}, {0, 1, 2, 3, -100, 3, 3, 2, 1, 0, 1, 1, -100, 2, 0}},
        {4, {2, 3, 1, 2}, {2, -100, 0, 1}},
        {1, {7}, {4}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int nd = cases[k].ndim;
        int64_t C = nd == 1 ? cases[k].shape[0] : cases[k].shape[1], tshape[4];
        int tnd = nd - 1;
        if (nd > 1) tshape[0] = cases[k].shape[0];
        for (int i = 2; i < nd; i++) tshape[i - 1] = cases[k].shape[i];
        lk_tensor *t = i64_data(tnd, tshape, cases[k].target);
        /* For "a valid class ignored": the same targets with -100 -> 0 and ignore_index 0. */
        int64_t t0v[16];
        for (int i = 0; i < 16; i++) t0v[i] = cases[k].target[i] == -100 ? 0 : cases[k].target[i];
        lk_tensor *t0 = i64_data(tnd, tshape, t0v);
        float wv[16];
        for (int c = 0; c < C; c++) wv[c] = 0.3f + 0.2f * (float)((c * 7) % 5);
        lk_tensor *w = f32_data(1, &C, wv);
        lk_tensor *x = lk_gc_param(30 + (uint32_t)k, nd, cases[k].shape);
        for (int red = 0; red < 3; red++)
            for (int variant = 0; variant < (C > 1 ? 4 : 3); variant++) { /* C = 1 would ignore everything */
                /* 0 plain, 1 weights, 2 smoothing, 3 weights + smoothing + a valid class ignored. */
                ce_ctx c = {variant == 3 ? t0 : t, {(lk_reduction)red, variant >= 2 ? 0.15f : 0.0f, variant == 3 ? 0 : -100,
                                (variant & 1) ? w : NULL}, 0};
                char name[96];
                snprintf(name, sizeof name, "cross_entropy case %zu red %d variant %d", k, red, variant);
                lk_gradcheck(name, f_ce, &x, 1, &c);
                if (variant == 0 || variant == 1) {
                    c.nll = 1;
                    snprintf(name, sizeof name, "nll_loss case %zu red %d variant %d", k, red, variant);
                    lk_gradcheck(name, f_ce, &x, 1, &c);
                }
            }
        lk_tensor_release(x);
        lk_tensor_release(w);
        lk_tensor_release(t);
        lk_tensor_release(t0);
    }
}

/* ---- binary cross-entropy --------------------------------------------------------------- */

static void bce_values(void) {
    lk_scope_begin();
    float pv[12], tv[12];
    for (int i = 0; i < 12; i++) {
        pv[i] = 0.5f + 0.45f * sinf((float)i);
        tv[i] = (float)(i % 3) / 2.0f;
    }
    lk_tensor *p = f32_data(LK_SHAPE(3, 4), pv), *t = f32_data(LK_SHAPE(3, 4), tv);
    lk_tensor *w = f32_data(LK_SHAPE(4), (float[]){1.0f, 1.1f, 1.2f, 1.3f});
    lk_tensor_set_requires_grad(p, true);
    lk_tensor_set_requires_grad(t, true);
    /* F.binary_cross_entropy(p, t, weight=[1, 1.1, 1.2, 1.3]) (mean) and its gradients. */
    lk_tensor *l = lk_binary_cross_entropy(p, t, w, LK_REDUCTION_MEAN);
    check_close("bce mean", l, ref_bce_mean, 1);
    CHECK_OK(lk_backward(l));
    check_close("bce d input", p->grad, ref_bce_dx, 12);
    check_close("bce d target", t->grad, ref_bce_dt, 12);
    lk_tensor_zero_grad(t, true);
    /* F.binary_cross_entropy_with_logits(x, t, pos_weight=0.5 + c, reduction='sum'). */
    lk_tensor *x = det_input(LK_SHAPE(3, 4), true);
    lk_tensor *pw = f32_data(LK_SHAPE(4), (float[]){0.5f, 1.5f, 2.5f, 3.5f});
    l = lk_binary_cross_entropy_with_logits(x, t, NULL, pw, LK_REDUCTION_SUM);
    check_close("bce logits sum", l, ref_bcel_sum, 1);
    CHECK_OK(lk_backward(l));
    check_close("bce logits d input", x->grad, ref_bcel_dx, 12);
    check_close("bce logits d target", t->grad, ref_bcel_dt, 12);
    /* Log clamped at -100: p = 0 with t = 1 costs 100, not inf. */
    lk_tensor *e = f32_data(LK_SHAPE(3), (float[]){0, 1, 0}), *et = f32_data(LK_SHAPE(3), (float[]){0, 1, 1});
    CHECK_NEAR(lk_tensor_item(lk_binary_cross_entropy(e, et, NULL, LK_REDUCTION_MEAN)), 100.0 / 3, 1e-4);
    /* Logits far out stay finite. */
    lk_tensor *far = f32_data(LK_SHAPE(2), (float[]){-200, 200}), *ft = f32_data(LK_SHAPE(2), (float[]){1, 0});
    CHECK_NEAR(lk_tensor_item(lk_binary_cross_entropy_with_logits(far, ft, NULL, NULL, LK_REDUCTION_SUM)), 400, 1e-3);
    lk_tensor *objs[] = {p, t, w, x, pw, e, et, far, ft};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) lk_tensor_release(objs[i]);
    lk_scope_end();
}

typedef struct {
    lk_tensor *weight, *pos_weight;
    lk_reduction red;
    int logits;
} bce_ctx;

static lk_tensor *f_bce(lk_tensor **in, void *ctx) {
    bce_ctx *c = ctx;
    if (c->logits) return lk_binary_cross_entropy_with_logits(in[0], in[1], c->weight, c->pos_weight, c->red);
    return lk_binary_cross_entropy(in[0], in[1], c->weight, c->red);
}

static void bce_gradchecks(void) {
    lk_rng r;
    lk_rng_init(&r, 77, LK_RNG_USER, 1, 0);
    int64_t shapes[][3] = {{5, 7}, {1, 13}, {11, 1}};
    for (int k = 0; k < 3; k++) {
        int64_t N = shapes[k][0], C = shapes[k][1];
        /* probabilities kept away from 0 and 1, where the clamps and 1/(x(1-x)) live */
        lk_tensor *p = lk_tensor_rand(&r, LK_SHAPE(N, C), 0.1f, 0.9f);
        lk_tensor *t = lk_tensor_rand(&r, LK_SHAPE(N, C), 0.0f, 1.0f);
        lk_tensor *x = lk_tensor_randn(&r, LK_SHAPE(N, C), 0.0f, 2.0f);
        lk_tensor *w = lk_tensor_rand(&r, LK_SHAPE(C), 0.5f, 1.5f);      /* broadcast over rows */
        lk_tensor *wcol = lk_tensor_rand(&r, LK_SHAPE(N, 1), 0.5f, 1.5f); /* broadcast over columns */
        lk_tensor *pw = lk_tensor_rand(&r, LK_SHAPE(C), 0.2f, 3.0f);
        lk_tensor_set_requires_grad(p, true);
        lk_tensor_set_requires_grad(t, true);
        lk_tensor_set_requires_grad(x, true);
        for (int red = 0; red < 3; red++)
            for (int variant = 0; variant < 3; variant++) {
                char name[96];
                bce_ctx c = {variant == 1 ? w : variant == 2 ? wcol : NULL, NULL, (lk_reduction)red, 0};
                lk_tensor *in[2] = {p, t};
                snprintf(name, sizeof name, "bce [%lld, %lld] red %d variant %d", (long long)N, (long long)C, red,
                         variant);
                lk_gradcheck(name, f_bce, in, 2, &c);
                c.logits = 1;
                c.pos_weight = variant >= 1 ? pw : NULL;
                in[0] = x;
                snprintf(name, sizeof name, "bce logits [%lld, %lld] red %d variant %d", (long long)N, (long long)C,
                         red, variant);
                lk_gradcheck(name, f_bce, in, 2, &c);
            }
        lk_tensor *objs[] = {p, t, x, w, wcol, pw};
        for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) lk_tensor_release(objs[i]);
    }
}

/* ---- dropout ------------------------------------------------------------------------------ */

static void dropout_statistics(void) {
    lk_scope_begin();
    const int64_t n = 200003;
    lk_tensor *x = lk_tensor_full(LK_F32, LK_SHAPE(n), 2.0);
    lk_tensor_set_requires_grad(x, true);
    float ps[] = {0.1f, 0.5f, 0.9f};
    for (int k = 0; k < 3; k++) {
        lk_rng r;
        lk_rng_init(&r, 5, LK_RNG_DROPOUT, 0, (uint32_t)k);
        lk_tensor *y = lk_dropout(x, ps[k], true, &r);
        CHECK(y != NULL);
        if (!y) continue;
        float scale = (float)(1.0 / (1.0 - ps[k]));
        int64_t zeros = 0, wrong = 0;
        for (int64_t i = 0; i < n; i++) {
            float v = ((float *)y->data)[i];
            if (v == 0.0f) zeros++;
            else if (v != 2.0f * scale) wrong++;
        }
        /* Binomial: sd = sqrt(p (1-p) / n) <= 0.0012; allow 5 sd. */
        double frac = (double)zeros / (double)n;
        CHECK_MSG(fabs(frac - ps[k]) < 0.006, "p = %g: dropped fraction %.4f", (double)ps[k], frac);
        CHECK_MSG(wrong == 0, "p = %g: %lld kept values not scaled by 1/(1-p)", (double)ps[k], (long long)wrong);
        /* Backward: the same mask and scale. */
        lk_tensor_zero_grad(x, true);
        CHECK_OK(lk_backward(lk_sum(y, NULL, 0, false)));
        int64_t gbad = 0;
        for (int64_t i = 0; x->grad && i < n; i++)
            gbad += ((float *)x->grad->data)[i] != (((float *)y->data)[i] == 0.0f ? 0.0f : scale);
        CHECK(x->grad && gbad == 0);
    }
    lk_tensor_release(x);
    lk_scope_end();
}

static void dropout_determinism_and_identity(void) {
    lk_scope_begin();
    lk_tensor *x = lk_gc_param(3, LK_SHAPE(13, 11));
    lk_rng r1, r2, r3;
    lk_rng_init(&r1, 99, LK_RNG_DROPOUT, 7, 0);
    lk_rng_init(&r2, 99, LK_RNG_DROPOUT, 7, 0);
    lk_rng_init(&r3, 99, LK_RNG_DROPOUT, 8, 0); /* the next step */
    lk_tensor *a = lk_dropout(x, 0.5f, true, &r1), *b = lk_dropout(x, 0.5f, true, &r2);
    lk_tensor *c = lk_dropout(x, 0.5f, true, &r3);
    CHECK(a && b && c);
    int same = 1, differ = 0;
    for (int64_t i = 0; a && b && c && i < a->numel; i++) {
        same &= ((float *)a->data)[i] == ((float *)b->data)[i];
        differ += ((float *)a->data)[i] != ((float *)c->data)[i];
    }
    CHECK_MSG(same, "the same rng key gave different masks");
    CHECK_MSG(differ > 20, "a different step gave nearly the same mask (%d differ)", differ);
    /* The stream advanced, so a second draw from r1 differs from the first. */
    lk_tensor *a2 = lk_dropout(x, 0.5f, true, &r1);
    int again = 0;
    for (int64_t i = 0; a && a2 && i < a->numel; i++) again += ((float *)a->data)[i] != ((float *)a2->data)[i];
    CHECK(again > 20);
    /* The mask is the stream's lk_rng_uniform() draws in order, even when the
     * stream starts mid-block, and the stream ends where per-element draws would. */
    lk_rng ra, rb;
    lk_rng_init(&ra, 7, LK_RNG_DROPOUT, 1, 2);
    lk_rng_init(&rb, 7, LK_RNG_DROPOUT, 1, 2);
    (void)lk_rng_u32(&ra);
    (void)lk_rng_u32(&rb);
    lk_tensor *d = lk_dropout(x, 0.3f, true, &ra);
    int mism = 0;
    for (int64_t i = 0; d && i < x->numel; i++)
        mism += (((float *)d->data)[i] == 0.0f) != (lk_rng_uniform(&rb) < 0.3f);
    CHECK(d && mism == 0);
    CHECK(lk_rng_u32(&ra) == lk_rng_u32(&rb));
    /* Identity when not training or p == 0: x itself, no tape node. */
    size_t tape = lk_tape_len();
    CHECK(lk_dropout(x, 0.5f, false, NULL) == x);
    CHECK(lk_dropout(x, 0.0f, true, &r1) == x);
    CHECK(lk_tape_len() == tape);
    /* p == 1: all zeros, zero gradient. */
    lk_tensor *z = lk_dropout(x, 1.0f, true, &r1);
    double s = 0;
    for (int64_t i = 0; z && i < z->numel; i++) s += fabs(((float *)z->data)[i]);
    CHECK(z && s == 0.0);
    lk_tensor_zero_grad(x, true);
    CHECK_OK(lk_backward(lk_sum(z, NULL, 0, false)));
    s = 0;
    for (int64_t i = 0; x->grad && i < x->numel; i++) s += fabs(((float *)x->grad->data)[i]);
    CHECK(x->grad && s == 0.0);
    lk_scope_end();
    lk_tensor_release(x);
}

/* Dropout's masks and its stream, bit for bit what they were when the mask
 * was drawn on the host (draw_keep_mask) before the backend drew it
 * (LK_OP_DROPOUT_MASK): an FNV-1a hash over a sequence of calls (odd
 * lengths, n < 4, n = 0, p = 1, streams that start mid-block, a counter
 * carrying across 2^32 in the x8 groups and in single blocks) of each keep
 * mask and the whole rng state after each call (counter, position and the
 * buffered block); the constant was printed by the host-drawn code. Each
 * mask is also the stream's per-element lk_rng_uniform() < p. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
static void dropout_mask_bits(void) {
    static const int64_t lens[] = {0, 1, 3, 5, 2, 37, 64, 65, 131, 1000, 7, 33, 4, 0, 999, 3, 32, 31, 257};
    static const float ps[] = {0.5f, 0.3f, 0.9f, 1.0f, 0.1f};
    uint64_t h = 1469598103934665603ull;
    int mism = 0, calls = 0;
    lk_scope_begin();
    for (int s = 0; s < 4; s++) {
        lk_rng ra, rb;
        memset(&ra, 0, sizeof ra); /* lk_rng_init leaves buf unset, and the hash reads it */
        lk_rng_init(&ra, 11 + (uint64_t)s, LK_RNG_DROPOUT, 3, (uint32_t)s);
        if (s >= 2) ra.ctr[0] = 0xFFFFFFFFu - (uint32_t)(s == 2 ? 5 : 1); /* the low word carries into ctr[1] */
        for (int k = 0; k < s; k++) (void)lk_rng_u32(&ra);            /* mid-block: 1..3 words buffered */
        rb = ra;
        for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++) {
            float p = ps[(c + (size_t)s) % 5];
            lk_tensor *x = lk_tensor_full(LK_F32, 1, (int64_t[]){lens[c]}, 1.0);
            lk_tensor *y = lk_dropout(x, p, true, &ra);
            CHECK(y);
            for (int64_t i = 0; y && i < lens[c]; i++) {
                uint8_t keep = ((float *)y->data)[i] != 0.0f;
                h = fnv(h, &keep, 1);
                if (p < 1.0f) mism += keep != !(lk_rng_uniform(&rb) < p);
                else mism += keep;
            }
            h = fnv(h, ra.ctr, sizeof ra.ctr);
            h = fnv(h, &ra.pos, sizeof ra.pos);
            h = fnv(h, ra.buf, sizeof ra.buf);
            calls++;
            lk_tensor_release(x);
        }
        CHECK(lk_rng_u32(&ra) == lk_rng_u32(&rb)); /* the stream ends where per-element draws would */
    }
    lk_scope_end();
    printf("dropout masks: %d calls, hash %016llx\n", calls, (unsigned long long)h);
    CHECK_MSG(mism == 0, "%d mask bits differ from the stream's per-element draws", mism);
    CHECK_MSG(h == 0x0b589333273762e0ull, "the masks or the stream changed: hash %016llx", (unsigned long long)h);
}

typedef struct {
    float p;
    uint32_t step;
} dropout_ctx;

/* The mask is replayed: every evaluation re-keys the stream identically. */
static lk_tensor *f_dropout(lk_tensor **in, void *ctx) {
    dropout_ctx *c = ctx;
    lk_rng r;
    lk_rng_init(&r, 2024, LK_RNG_DROPOUT, c->step, 0);
    return lk_mul(lk_dropout(in[0], c->p, true, &r), in[0]); /* x * dropout(x): a non-trivial gradient */
}

static void dropout_gradchecks(void) {
    int64_t shapes[][3] = {{5, 7, 1}, {1, 13, 3}, {11, 1, 1}};
    float ps[] = {0.3f, 0.5f, 0.9f};
    for (int k = 0; k < 3; k++) {
        lk_tensor *x = lk_gc_param(40 + (uint32_t)k, 3, shapes[k]);
        dropout_ctx c = {ps[k], (uint32_t)k};
        lk_gradcheck("dropout (replayed mask)", f_dropout, &x, 1, &c);
        lk_tensor_release(x);
    }
}

/* ---- layer_norm ------------------------------------------------------------------------------ */

static void layer_norm_values(void) {
    lk_scope_begin();
    /* Hand-computed: [1, 2, 3, 4] has mean 2.5 and biased variance 1.25. */
    lk_tensor *x = f32_data(LK_SHAPE(1, 4), (float[]){1, 2, 3, 4});
    float r = 1.0f / sqrtf(1.25f + 1e-5f);
    check_close("layer_norm [1,2,3,4]", lk_layer_norm(x, 1, NULL, NULL, 1e-5f),
                (float[]){-1.5f * r, -0.5f * r, 0.5f * r, 1.5f * r}, 4);
    /* F.layer_norm(x[3, 5], (5,), 1 + 0.1 k, 0.05 k, 1e-5); backward of sum(y * (x * 0.5 + 0.2)). */
    lk_tensor *xd = det_input(LK_SHAPE(3, 5), true);
    float wv[5], bv[5], rv[15];
    for (int k = 0; k < 5; k++) wv[k] = 1.0f + 0.1f * (float)k, bv[k] = 0.05f * (float)k;
    for (int i = 0; i < 15; i++) rv[i] = ((float *)xd->data)[i] * 0.5f + 0.2f;
    lk_tensor *w = f32_data(LK_SHAPE(5), wv), *b = f32_data(LK_SHAPE(5), bv), *R = f32_data(LK_SHAPE(3, 5), rv);
    lk_tensor_set_requires_grad(w, true);
    lk_tensor_set_requires_grad(b, true);
    lk_tensor *y = lk_layer_norm(xd, 1, w, b, 1e-5f);
    check_close("layer_norm y", y, ref_ln_y, 15);
    CHECK_OK(lk_backward(lk_sum(lk_mul(y, R), NULL, 0, false)));
    /* dx = rstd (dy - mean(dy) - xh mean(dy xh)) cancels O(1) terms down to
     * O(0.1): PyTorch's own f32 dx[10] is 3.3e-6 from the f64 result (ours
     * 7e-7), so the bound here is absolute, 5e-6. */
    check_close_tol("layer_norm dx", xd->grad, ref_ln_dx, 15, 1e-5, 5e-6);
    check_close("layer_norm dw", w->grad, ref_ln_dw, 5);
    check_close("layer_norm db", b->grad, ref_ln_db, 5);
    lk_tensor *objs[] = {x, xd, w, b, R};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) lk_tensor_release(objs[i]);
    lk_scope_end();
}

typedef struct {
    int k;
    float eps;
} ln_ctx;

static lk_tensor *f_ln(lk_tensor **in, void *ctx) {
    ln_ctx *c = ctx;
    return lk_layer_norm(in[0], c->k, in[1], in[2], c->eps);
}

static void layer_norm_gradchecks(void) {
    struct {
        int ndim;
        int64_t shape[4];
        int k, w, b;
    } cases[] = {{2, {5, 7}, 1, 1, 1},  {3, {3, 4, 5}, 2, 1, 1}, {3, {2, 1, 13}, 1, 0, 0}, {2, {4, 11}, 1, 1, 0},
                 {2, {4, 11}, 1, 0, 1}, {1, {17}, 1, 1, 1},       {2, {6, 1}, 1, 1, 1},     {4, {2, 3, 1, 9}, 3, 1, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        lk_tensor *in[3] = {lk_gc_param(50 + (uint32_t)k, cases[k].ndim, cases[k].shape), NULL, NULL};
        int nd = cases[k].ndim, kk = cases[k].k;
        if (cases[k].w) in[1] = lk_gc_param(60 + (uint32_t)k, kk, cases[k].shape + nd - kk);
        if (cases[k].b) in[2] = lk_gc_param(70 + (uint32_t)k, kk, cases[k].shape + nd - kk);
        ln_ctx c = {kk, 1e-5f};
        char name[64];
        snprintf(name, sizeof name, "layer_norm case %zu", k);
        /* Row length 1 normalises to exactly 0 (rstd ~ 316): only the bias moves the output. */
        lk_gradcheck(name, f_ln, in, 3, &c);
        for (int i = 0; i < 3; i++) lk_tensor_release(in[i]);
    }
}

/* ---- embedding ------------------------------------------------------------------------------- */

static lk_tensor *f_emb(lk_tensor **in, void *ctx) { return lk_embedding(in[0], ctx); }

static void embedding_tests(void) {
    lk_scope_begin();
    lk_tensor *w = lk_gc_param(80, LK_SHAPE(7, 5));
    lk_tensor *idx = lk_tensor_from_data(LK_I32, LK_SHAPE(2, 3), (int32_t[]){6, 0, 6, 2, 2, 6});
    lk_tensor *e = lk_embedding(w, idx);
    CHECK(e && e->ndim == 3 && e->shape[0] == 2 && e->shape[1] == 3 && e->shape[2] == 5);
    for (int j = 0; e && j < 5; j++) {
        CHECK(lk_tensor_get(e, 0 * 5 + j) == lk_tensor_get(w, 6 * 5 + j));
        CHECK(lk_tensor_get(e, 3 * 5 + j) == lk_tensor_get(w, 2 * 5 + j));
    }
    /* Backward: row 6 used three times gets three rows of the gradient; unused rows get 0. */
    CHECK_OK(lk_backward(lk_sum(e, NULL, 0, false)));
    CHECK(w->grad && lk_tensor_get(w->grad, 6 * 5) == 3.0f && lk_tensor_get(w->grad, 2 * 5 + 4) == 2.0f &&
          lk_tensor_get(w->grad, 1 * 5) == 0.0f);
    lk_tensor_zero_grad(w, true);
    lk_gradcheck("embedding i32 [2, 3] with repeats", f_emb, &w, 1, idx);
    lk_tensor *idx64 = i64_data(LK_SHAPE(5), (int64_t[]){0, 1, 2, 3, 4});
    lk_tensor *base = lk_tensor_from_data(LK_I64, LK_SHAPE(2, 3), (int64_t[]){1, 2, 3, 4, 5, 6});
    lk_tensor *tr = lk_transpose(base, 0, 1); /* owned by the scope */
    lk_gradcheck("embedding i64 [5]", f_emb, &w, 1, idx64);
    lk_gradcheck("embedding transposed idx", f_emb, &w, 1, tr);
    lk_tensor *i0 = lk_tensor_from_data(LK_I64, 0, NULL, (int64_t[]){3});
    lk_tensor *e0 = lk_embedding(w, i0);
    CHECK(e0 && e0->ndim == 1 && e0->shape[0] == 5 && lk_tensor_get(e0, 4) == lk_tensor_get(w, 3 * 5 + 4));
    lk_tensor *objs[] = {w, idx, idx64, base, i0};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) lk_tensor_release(objs[i]);
    lk_scope_end();
}

/* ---- bad input ------------------------------------------------------------------------------- */

static void bad_inputs(void) {
    lk_scope_begin();
    lk_tensor *x = lk_tensor_zeros(LK_F32, LK_SHAPE(4, 5)), *xi = lk_tensor_zeros(LK_I32, LK_SHAPE(4, 5));
    lk_tensor *t = i64_data(LK_SHAPE(4), (int64_t[]){0, 7, 1, 2}), *tok = i64_data(LK_SHAPE(4), (int64_t[]){0, 1, 2, 3});
    lk_tensor *t3 = i64_data(LK_SHAPE(3), (int64_t[]){0, 1, 2}), *tf = lk_tensor_zeros(LK_F32, LK_SHAPE(4));
    lk_tensor *w4 = lk_tensor_zeros(LK_F32, LK_SHAPE(4));
    lk_rng r;
    lk_rng_init(&r, 1, LK_RNG_DROPOUT, 0, 0);

    CHECK_ERR(OP_STATUS(lk_softmax(x, 2)), LK_STATUS_INVALID_ARGUMENT, "dim 2 is out of range for input of shape [4, 5]");
    CHECK_ERR(OP_STATUS(lk_log_softmax(xi, 1)), LK_STATUS_UNSUPPORTED, "log_softmax: input has dtype i32");

    CHECK_ERR(OP_STATUS(lk_cross_entropy(x, t, NULL)), LK_STATUS_INVALID_ARGUMENT,
              "cross_entropy: target[1] = 7 is out of range for 5 classes");
    lk_tensor *tneg = i64_data(LK_SHAPE(2, 2), (int64_t[]){0, 1, -3, 2});
    lk_tensor *x3 = lk_tensor_zeros(LK_F32, LK_SHAPE(2, 5, 2));
    CHECK_ERR(OP_STATUS(lk_cross_entropy(x3, tneg, NULL)), LK_STATUS_INVALID_ARGUMENT, "target[1, 0] = -3");
    CHECK_ERR(OP_STATUS(lk_cross_entropy(x, t3, NULL)), LK_STATUS_INVALID_ARGUMENT, "[4, 5] and [3]");
    CHECK_ERR(OP_STATUS(lk_cross_entropy(x, tf, NULL)), LK_STATUS_UNSUPPORTED, "target has dtype f32");
    CHECK_ERR(OP_STATUS(lk_cross_entropy(xi, tok, NULL)), LK_STATUS_UNSUPPORTED, "cross_entropy: input has dtype i32");
    lk_cross_entropy_opts o = lk_cross_entropy_opts_default();
    o.weight = w4;
    CHECK_ERR(OP_STATUS(lk_cross_entropy(x, tok, &o)), LK_STATUS_INVALID_ARGUMENT, "weight must hold one value per class");
    CHECK_ERR(OP_STATUS(lk_cross_entropy(x, tok, &o)), LK_STATUS_INVALID_ARGUMENT, "[4] and [4, 5]");
    o = lk_cross_entropy_opts_default();
    o.label_smoothing = 1.5f;
    CHECK_ERR(OP_STATUS(lk_cross_entropy(x, tok, &o)), LK_STATUS_INVALID_ARGUMENT, "label_smoothing = 1.5 is outside [0, 1]");
    CHECK_ERR(OP_STATUS(lk_nll_loss(x, tok, &o)), LK_STATUS_INVALID_ARGUMENT, "nll_loss: label_smoothing = 1.5 is not supported");
    o = lk_cross_entropy_opts_default();
    o.reduction = (lk_reduction)7;
    CHECK_ERR(OP_STATUS(lk_cross_entropy(x, tok, &o)), LK_STATUS_INVALID_ARGUMENT, "reduction 7");
    CHECK_ERR(OP_STATUS(lk_nll_loss(x, t, NULL)), LK_STATUS_INVALID_ARGUMENT, "nll_loss: target[1] = 7");
    lk_tensor *sc = lk_tensor_scalar(1.0f);
    CHECK_ERR(OP_STATUS(lk_cross_entropy(sc, tok, NULL)), LK_STATUS_INVALID_ARGUMENT, "must have a class dimension");

    lk_tensor *p = lk_tensor_full(LK_F32, LK_SHAPE(4, 5), 0.5), *p2 = lk_tensor_full(LK_F32, LK_SHAPE(4, 5), 0.5);
    ((float *)p2->data)[7] = 1.5f;
    CHECK_ERR(OP_STATUS(lk_binary_cross_entropy(p2, p, NULL, LK_REDUCTION_MEAN)), LK_STATUS_INVALID_ARGUMENT,
              "input[1, 2] = 1.5 is outside [0, 1]");
    CHECK_ERR(OP_STATUS(lk_binary_cross_entropy(p, x3, NULL, LK_REDUCTION_MEAN)), LK_STATUS_INVALID_ARGUMENT,
              "[4, 5] and [2, 5, 2]");
    CHECK_ERR(OP_STATUS(lk_binary_cross_entropy_with_logits(p, p, w4, NULL, LK_REDUCTION_SUM)),
              LK_STATUS_INVALID_ARGUMENT, "weight must broadcast to the input's shape: shapes [4] and [4, 5]");
    CHECK_ERR(OP_STATUS(lk_binary_cross_entropy_with_logits(p, p, NULL, w4, LK_REDUCTION_SUM)),
              LK_STATUS_INVALID_ARGUMENT, "pos_weight must broadcast");
    CHECK_ERR(OP_STATUS(lk_binary_cross_entropy_with_logits(xi, p, NULL, NULL, LK_REDUCTION_SUM)),
              LK_STATUS_UNSUPPORTED, "has dtype i32");

    CHECK_ERR(OP_STATUS(lk_dropout(x, 1.5f, true, &r)), LK_STATUS_INVALID_ARGUMENT, "p = 1.5 is outside [0, 1]");
    CHECK_ERR(OP_STATUS(lk_dropout(x, -0.1f, false, &r)), LK_STATUS_INVALID_ARGUMENT, "outside [0, 1]");
    CHECK_ERR(OP_STATUS(lk_dropout(x, 0.5f, true, NULL)), LK_STATUS_INVALID_ARGUMENT, "needs an rng stream");
    CHECK_ERR(OP_STATUS(lk_dropout(xi, 0.5f, true, &r)), LK_STATUS_UNSUPPORTED, "dropout: input has dtype i32");

    CHECK_ERR(OP_STATUS(lk_layer_norm(x, 3, NULL, NULL, 1e-5f)), LK_STATUS_INVALID_ARGUMENT,
              "normalized_ndim = 3 must be in [1, 2] for input of shape [4, 5]");
    CHECK_ERR(OP_STATUS(lk_layer_norm(x, 1, w4, NULL, 1e-5f)), LK_STATUS_INVALID_ARGUMENT,
              "weight must have the normalized shape (the input's last 1 dims): shapes [4] and [4, 5]");
    CHECK_ERR(OP_STATUS(lk_layer_norm(x, 2, NULL, w4, 1e-5f)), LK_STATUS_INVALID_ARGUMENT, "bias must have");
    CHECK_ERR(OP_STATUS(lk_layer_norm(x, 1, NULL, NULL, -1.0f)), LK_STATUS_INVALID_ARGUMENT, "eps = -1");

    lk_tensor *idx = i64_data(LK_SHAPE(2, 3), (int64_t[]){0, 1, 2, 3, 3, 10});
    CHECK_ERR(OP_STATUS(lk_embedding(x, idx)), LK_STATUS_INVALID_ARGUMENT,
              "embedding: idx[1, 2] = 10 is out of range for 4 embeddings");
    CHECK_ERR(OP_STATUS(lk_embedding(x, tf)), LK_STATUS_UNSUPPORTED, "idx has dtype f32");
    CHECK_ERR(OP_STATUS(lk_embedding(x3, tok)), LK_STATUS_INVALID_ARGUMENT, "weight must be [V, D] (2 dims), got shape [2, 5, 2]");
    CHECK_ERR(OP_STATUS(lk_embedding(xi, tok)), LK_STATUS_UNSUPPORTED, "weight has dtype i32");

    /* NULL in, NULL out, first error kept. */
    lk_clear_error();
    CHECK(lk_cross_entropy(lk_softmax(x, 9), tok, NULL) == NULL && strstr(lk_last_error(), "softmax: dim 9"));

    lk_tensor *objs[] = {x, xi, t, tok, t3, tf, w4, tneg, x3, sc, p, p2, idx};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) lk_tensor_release(objs[i]);
    lk_scope_end();
}

/* Zero-sized dims go through every op without touching memory. */
static void empty_inputs(void) {
    lk_scope_begin();
    lk_tensor *x0 = lk_gc_param(95, LK_SHAPE(0, 5)), *x1 = lk_gc_param(96, LK_SHAPE(5, 0));
    lk_tensor *t0 = lk_tensor_zeros(LK_I64, LK_SHAPE(0));
    CHECK(lk_softmax(x0, 1) && lk_log_softmax(x1, 1) && lk_softmax(x1, 0));
    lk_tensor *l = lk_cross_entropy(x0, t0, NULL);
    CHECK(l && isnan(lk_tensor_item(l))); /* mean over nothing: NaN, as PyTorch */
    lk_cross_entropy_opts o = lk_cross_entropy_opts_default();
    o.reduction = LK_REDUCTION_SUM;
    l = lk_cross_entropy(x0, t0, &o);
    CHECK(l && lk_tensor_item(l) == 0.0f);
    CHECK_OK(lk_backward(l));
    CHECK(lk_nll_loss(x0, t0, &o) && lk_layer_norm(x0, 1, NULL, NULL, 1e-5f) && lk_layer_norm(x1, 1, NULL, NULL, 1e-5f));
    lk_rng r;
    lk_rng_init(&r, 1, LK_RNG_DROPOUT, 0, 0);
    CHECK(lk_dropout(x0, 0.5f, true, &r) && lk_embedding(x1, t0));
    CHECK(lk_binary_cross_entropy(x0, x0, NULL, LK_REDUCTION_SUM) != NULL);
    lk_tensor_release(x0);
    lk_tensor_release(x1);
    lk_tensor_release(t0);
    lk_scope_end();
}

/* Every allocation of a forward + backward pass, failed in turn: each must
 * end in a clean OUT_OF_MEMORY error (no crash; ASan checks for leaks). */
static lk_tensor *alloc_chain(lk_tensor *x, lk_tensor *w, lk_tensor *t, lk_tensor *idx) {
    lk_rng r;
    lk_rng_init(&r, 3, LK_RNG_DROPOUT, 0, 0);
    lk_cross_entropy_opts o = {LK_REDUCTION_MEAN, 0.1f, 1, w};
    lk_tensor *h = lk_layer_norm(lk_add(x, lk_embedding(x, idx)), 1, w, w, 1e-5f);
    lk_tensor *l = lk_cross_entropy(lk_dropout(lk_log_softmax(h, 0), 0.2f, true, &r), t, &o);
    lk_tensor *b = lk_binary_cross_entropy_with_logits(h, lk_softmax(h, 1), NULL, w, LK_REDUCTION_SUM);
    return lk_add(l, lk_nll_loss(h, t, NULL) ? b : NULL);
}

static lk_status alloc_run(lk_tensor *x, lk_tensor *w, lk_tensor *t, lk_tensor *idx, long fail_at) {
    lk_scope_begin();
    lk_pool_trim();
    lk_clear_error();
    lk_alloc_fail_after(fail_at);
    lk_tensor *l = alloc_chain(x, w, t, idx);
    lk_status st = l ? lk_backward(l) : lk_last_status();
    lk_alloc_fail_after(0);
    lk_scope_end();
    lk_tape_reset();
    return st;
}

static void allocation_failures(void) {
    lk_tensor *x = lk_gc_param(97, LK_SHAPE(6, 5)), *w = lk_gc_param(98, LK_SHAPE(5));
    lk_tensor *t = i64_data(LK_SHAPE(6), (int64_t[]){0, 1, 2, 3, 4, 1});
    lk_tensor *idx = i64_data(LK_SHAPE(6), (int64_t[]){5, 4, 3, 2, 1, 0});
    CHECK_OK(alloc_run(x, w, t, idx, 0));
    uint64_t before = lk_alloc_count();
    CHECK_OK(alloc_run(x, w, t, idx, 0));
    long total = (long)(lk_alloc_count() - before), failed = 0;
    for (long n = 1; n <= total; n++) {
        lk_status st = alloc_run(x, w, t, idx, n);
        /* Some allocations are optional (a pool's bookkeeping), so a run may still succeed. */
        failed += st != LK_STATUS_OK;
        CHECK_MSG(st == LK_STATUS_OK || st == LK_STATUS_OUT_OF_MEMORY, "allocation %ld failed: %s: %s", n,
                  lk_status_str(st), lk_last_error());
    }
    CHECK_MSG(total > 20 && failed > total / 2, "%ld of %ld injected failures surfaced", failed, total);
    printf("     %ld of %ld injected allocation failures surfaced as errors\n", failed, total);
    lk_tensor_zero_grad(x, true);
    lk_tensor_zero_grad(w, true);
    lk_tensor *objs[] = {x, w, t, idx};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++) lk_tensor_release(objs[i]);
}

/* The fused loss allocates a handful of tensors per call, none per row,
 * and a repeated step allocates nothing from the system. */
static void steady_state_allocations(void) {
    lk_tensor *x = lk_gc_param(90, LK_SHAPE(64, 37));
    lk_tensor *w = lk_gc_param(91, LK_SHAPE(37));
    int64_t tv[64];
    for (int i = 0; i < 64; i++) tv[i] = (i * 5) % 37;
    lk_tensor *t = i64_data(LK_SHAPE(64), tv);
    for (int it = 0; it < 3; it++) {
        uint64_t before = lk_alloc_count();
        lk_scope_begin();
        lk_cross_entropy_opts o = {LK_REDUCTION_MEAN, 0.1f, -100, NULL};
        lk_tensor *h = lk_layer_norm(x, 1, w, NULL, 1e-5f);
        CHECK_OK(lk_backward(lk_cross_entropy(h, t, &o)));
        lk_scope_end();
        uint64_t n = lk_alloc_count() - before;
        /* scratch rows are lk_malloc'd per call (one or two), tensors come from the pool */
        if (it == 2) CHECK_MSG(n <= 4, "%llu allocations in a steady-state step", (unsigned long long)n);
    }
    lk_tensor_release(x);
    lk_tensor_release(w);
    lk_tensor_release(t);
}

LK_TEST_MAIN(LK_TEST_CASE(expf_kernel_accuracy), LK_TEST_CASE(philox_x8_kernel), LK_TEST_CASE(softmax_values), LK_TEST_CASE(softmax_gradchecks),
             LK_TEST_CASE(cross_entropy_values), LK_TEST_CASE(cross_entropy_gradchecks), LK_TEST_CASE(bce_values),
             LK_TEST_CASE(bce_gradchecks), LK_TEST_CASE(dropout_statistics),
             LK_TEST_CASE(dropout_determinism_and_identity), LK_TEST_CASE(dropout_mask_bits), LK_TEST_CASE(dropout_gradchecks),
             LK_TEST_CASE(layer_norm_values), LK_TEST_CASE(layer_norm_gradchecks), LK_TEST_CASE(embedding_tests),
             LK_TEST_CASE(bad_inputs), LK_TEST_CASE(empty_inputs), LK_TEST_CASE(allocation_failures), LK_TEST_CASE(steady_state_allocations))

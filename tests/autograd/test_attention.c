/* Causal self-attention: the fused op (LK_OP_ATTENTION, flash-style) against
 * the composed reference (materialised scores) in f32 over shapes that are
 * not tile or lane multiples; its gradient against finite differences, with
 * and without dropout; dropout's mask reproducible from the stream and the
 * share it keeps; bf16 under autocast against f32; PyTorch 1.13's values
 * (tools/gen_attention_fixtures.py prints them: explicit softmax(QK^T/sqrt(d)
 * + mask) V); the same bits on 1 and 2 threads; and the argument errors. */
#include <string.h>

#include "gradcheck.h"

typedef struct {
    int n_head;
    float p;
    bool naive;
} att_ctx;

static lk_tensor *att(lk_tensor **in, void *vctx) {
    att_ctx *c = vctx;
    lk_rng r; /* the same stream at every call: finite differences see one mask */
    lk_rng_init(&r, 99, LK_RNG_DROPOUT, 1, 2);
    return c->naive ? lk_causal_self_attention_naive(in[0], c->n_head, c->p, c->p > 0, &r)
                    : lk_causal_self_attention(in[0], c->n_head, c->p, c->p > 0, &r);
}

static double max_rel(const lk_tensor *a, const lk_tensor *b) {
    double m = 0, big = 1e-30;
    for (int64_t i = 0; i < a->numel; i++) big = fmax(big, fabs(lk_tensor_get(b, i)));
    for (int64_t i = 0; i < a->numel; i++) m = fmax(m, fabs(lk_tensor_get(a, i) - lk_tensor_get(b, i)) / big);
    return m;
}

/* fused and naive: outputs and qkv gradients (dy random) */
static void fused_matches_naive(void) {
    static const int64_t shapes[][4] = {{1, 1, 1, 8}, {2, 7, 2, 8}, {1, 64, 4, 16}, {2, 100, 3, 64}, {3, 33, 1, 5}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t B = shapes[s][0], T = shapes[s][1], H = shapes[s][2], D = shapes[s][3];
        lk_tensor *qkv = lk_gc_param(40 + (uint32_t)s, LK_SHAPE(B, T, 3 * H * D));
        lk_rng r;
        lk_rng_init(&r, 5, LK_RNG_USER, (uint32_t)s, 0);
        lk_tensor *dy = lk_tensor_randn(&r, 3, (int64_t[]){B, T, H * D}, 0.0f, 1.0f);
        lk_tensor *y[2], *g[2];
        for (int k = 0; k < 2; k++) {
            lk_tensor_zero_grad(qkv, true);
            lk_scope_begin();
            att_ctx c = {(int)H, 0.0f, k == 1};
            lk_tensor *out = att(&qkv, &c);
            CHECK_MSG(out != NULL, "%s", lk_last_error());
            if (!out) {
                lk_scope_end();
                return;
            }
            y[k] = lk_tensor_clone(out);
            CHECK_OK(lk_backward_with(out, dy));
            lk_scope_end();
            g[k] = lk_tensor_clone(qkv->grad);
        }
        double ey = max_rel(y[0], y[1]), eg = max_rel(g[0], g[1]);
        CHECK_MSG(ey < 2e-6 && eg < 2e-5, "B %lld T %lld H %lld D %lld: y differs by %.2g, dqkv by %.2g (of the largest)",
                  (long long)B, (long long)T, (long long)H, (long long)D, ey, eg);
        printf("fused vs naive B %lld T %lld H %lld D %lld: y %.1e, dqkv %.1e\n", (long long)B, (long long)T,
               (long long)H, (long long)D, ey, eg);
        for (int k = 0; k < 2; k++) lk_tensor_release(y[k]), lk_tensor_release(g[k]);
        lk_tensor_release(dy);
        lk_tensor_release(qkv);
    }
}

static void finite_differences(void) {
    for (int drop = 0; drop < 2; drop++) {
        lk_tensor *qkv = lk_gc_param(7, LK_SHAPE(2, 6, 3 * 2 * 4));
        att_ctx c = {2, drop ? 0.3f : 0.0f, false};
        lk_gradcheck(drop ? "attention_dropout" : "attention", att, &qkv, 1, &c);
        lk_tensor_release(qkv);
    }
}

static void dropout_mask(void) {
    lk_tensor *qkv = lk_gc_param(8, LK_SHAPE(2, 40, 3 * 2 * 8));
    lk_tensor_set_requires_grad(qkv, false);
    lk_scope_begin();
    att_ctx c = {2, 0.0f, false};
    lk_tensor *plain = att(&qkv, &c);
    c.p = 0.5f;
    lk_tensor *a = att(&qkv, &c), *b = att(&qkv, &c);
    CHECK(a && b && plain && !memcmp(a->data, b->data, (size_t)a->numel * 4)); /* the stream decides, nothing else */
    CHECK(memcmp(a->data, plain->data, (size_t)a->numel * 4) != 0);
    /* the stream moves on by the mask's draws: a second call from it draws another mask */
    lk_rng r;
    lk_rng_init(&r, 99, LK_RNG_DROPOUT, 1, 2);
    lk_tensor *first = lk_causal_self_attention(qkv, 2, 0.5f, true, &r), *second = lk_causal_self_attention(qkv, 2, 0.5f, true, &r);
    CHECK(first && second && memcmp(first->data, second->data, (size_t)first->numel * 4) != 0);
    /* not training: no dropout, whatever p */
    lk_tensor *eval = lk_causal_self_attention(qkv, 2, 0.5f, false, NULL);
    CHECK(eval && !memcmp(eval->data, plain->data, (size_t)eval->numel * 4));
    lk_scope_end();
    /* the share kept: with v = 1 everywhere each row of y is sum_j P_ij z_ij, whose mean over many rows is 1 */
    int64_t B = 4, T = 128, H = 2, D = 4, C = H * D;
    lk_tensor *ones = lk_tensor_zeros(LK_F32, 3, (int64_t[]){B, T, 3 * C});
    float *o = ones->data;
    for (int64_t i = 0; i < B * T; i++)
        for (int64_t d = 0; d < C; d++) o[i * 3 * C + 2 * C + d] = 1.0f;
    lk_scope_begin();
    lk_rng_init(&r, 3, LK_RNG_DROPOUT, 0, 0);
    lk_tensor *y = lk_causal_self_attention(ones, (int)H, 0.25f, true, &r);
    double mean = 0;
    for (int64_t i = 0; y && i < y->numel; i++) mean += lk_tensor_get(y, i);
    mean /= (double)(B * T * C);
    CHECK_MSG(fabs(mean - 1.0) < 0.03, "mean of the kept share x 1/(1-p): %.4f, expected ~1", mean);
    lk_scope_end();
    lk_tensor_release(ones);
    lk_tensor_release(qkv);
}

/* bf16 qkv under autocast: y bf16, within bf16's rounding of the f32 result */
static void bf16_autocast(void) {
    lk_tensor *qkv = lk_gc_param(9, LK_SHAPE(2, 50, 3 * 4 * 16));
    lk_tensor_set_requires_grad(qkv, false);
    lk_scope_begin();
    lk_tensor *ref = lk_causal_self_attention(qkv, 4, 0, false, NULL);
    lk_tensor *q16 = lk_tensor_cast(qkv, LK_BF16);
    lk_autocast_enter(LK_BF16);
    lk_tensor *y = lk_causal_self_attention(q16, 4, 0, false, NULL);
    lk_autocast_exit();
    CHECK(y && y->dtype == LK_BF16);
    double e = y && ref ? max_rel(y, ref) : 1;
    CHECK_MSG(e < 2e-2, "bf16 attention differs from f32 by %.3g of the largest (bf16 inputs: ~1e-2 expected)", e);
    printf("bf16 vs f32: %.2e of the largest\n", e);
    lk_tensor_release(q16);
    lk_scope_end();
    lk_tensor_release(qkv);
}

/* PyTorch 1.13 (tools/gen_attention_fixtures.py): qkv[i] = sin(0.37 i), [2, 5, 24], 2 heads;
 * y's first 8 values and sum(dqkv * (i % 7)) for L = sum(y * qkv[:B T C]) */
static void pytorch_values(void) {
    static const float want_y[8] = {-0.355254f, 0.006815f, 0.367961f, 0.679305f, 0.898708f, 0.996476f, 0.959375f, 0.792427f};
    const double want_gsum = 2.156250;
    float x[2 * 5 * 24];
    for (int i = 0; i < 2 * 5 * 24; i++) x[i] = sinf((float)i * 0.37f);
    lk_tensor *qkv = lk_tensor_from_data(LK_F32, 3, (int64_t[]){2, 5, 24}, x);
    lk_tensor_set_requires_grad(qkv, true);
    lk_scope_begin();
    lk_tensor *y = lk_causal_self_attention(qkv, 2, 0, false, NULL);
    lk_tensor *w = lk_tensor_from_data(LK_F32, 3, (int64_t[]){2, 5, 8}, x);
    CHECK_OK(lk_backward(lk_sum(lk_mul(y, w), NULL, 0, false)));
    for (int i = 0; i < 8; i++) CHECK_MSG(fabsf(((float *)y->data)[i] - want_y[i]) < 2e-6f, "y[%d] %.6f, torch %.6f", i, (double)((float *)y->data)[i], (double)want_y[i]);
    double gs = 0;
    for (int i = 0; i < 2 * 5 * 24; i++) gs += ((float *)qkv->grad->data)[i] * (i % 7);
    CHECK_MSG(fabs(gs - want_gsum) < 2e-5, "sum(dqkv * (i %% 7)) %.6f, torch %.6f", gs, want_gsum);
    lk_tensor_release(w);
    lk_scope_end();
    lk_tensor_release(qkv);
}

/* one task owns each output element: the same bits on 1 and 2 threads */
static void thread_count_bitwise(void) {
    lk_tensor *qkv = lk_gc_param(11, LK_SHAPE(2, 150, 3 * 3 * 16));
    lk_rng r;
    lk_rng_init(&r, 6, LK_RNG_USER, 0, 0);
    lk_tensor *dy = lk_tensor_randn(&r, 3, (int64_t[]){2, 150, 48}, 0.0f, 1.0f);
    lk_tensor *y[2], *g[2];
    int threads = lk_get_num_threads();
    for (int k = 0; k < 2; k++) {
        lk_set_num_threads(k ? 2 : 1);
        lk_tensor_zero_grad(qkv, true);
        lk_scope_begin();
        att_ctx c = {3, 0.2f, false};
        lk_tensor *out = att(&qkv, &c);
        y[k] = out ? lk_tensor_clone(out) : NULL;
        if (out) CHECK_OK(lk_backward_with(out, dy));
        lk_scope_end();
        g[k] = qkv->grad ? lk_tensor_clone(qkv->grad) : NULL;
    }
    lk_set_num_threads(threads);
    CHECK(y[0] && y[1] && !memcmp(y[0]->data, y[1]->data, (size_t)y[0]->numel * 4));
    CHECK(g[0] && g[1] && !memcmp(g[0]->data, g[1]->data, (size_t)g[0]->numel * 4));
    for (int k = 0; k < 2; k++) lk_tensor_release(y[k]), lk_tensor_release(g[k]);
    lk_tensor_release(dy);
    lk_tensor_release(qkv);
}

static void errors(void) {
    lk_tensor *bad = lk_tensor_zeros(LK_F32, 3, (int64_t[]){2, 4, 10});
    CHECK(!lk_causal_self_attention(bad, 2, 0, false, NULL) && strstr(lk_last_error(), "C divisible by n_head"));
    lk_tensor *two = lk_tensor_zeros(LK_F32, 2, (int64_t[]){4, 12});
    CHECK(!lk_causal_self_attention(two, 2, 0, false, NULL) && strstr(lk_last_error(), "expected [B, T, 3C]"));
    lk_tensor *ok = lk_tensor_zeros(LK_F32, 3, (int64_t[]){2, 4, 12});
    CHECK(!lk_causal_self_attention(ok, 2, 1.0f, true, NULL) && strstr(lk_last_error(), "outside [0, 1)"));
    CHECK(!lk_causal_self_attention(ok, 2, 0.1f, true, NULL) && strstr(lk_last_error(), "needs an rng stream"));
    lk_tensor *ints = lk_tensor_zeros(LK_I64, 3, (int64_t[]){2, 4, 12});
    CHECK(!lk_causal_self_attention(ints, 2, 0, false, NULL));
    lk_tensor *wide = lk_tensor_zeros(LK_F32, 3, (int64_t[]){1, 2, 3 * 300});
    CHECK(!lk_causal_self_attention(wide, 1, 0, false, NULL) && strstr(lk_last_error(), "at most 256"));
    lk_tensor_release(bad), lk_tensor_release(two), lk_tensor_release(ok), lk_tensor_release(ints), lk_tensor_release(wide);
}

LK_TEST_MAIN(LK_TEST_CASE(fused_matches_naive), LK_TEST_CASE(finite_differences), LK_TEST_CASE(dropout_mask),
             LK_TEST_CASE(bf16_autocast), LK_TEST_CASE(pytorch_values), LK_TEST_CASE(thread_count_bitwise), LK_TEST_CASE(errors))

/* autograd basics: tape, hooks, scopes, and gradient checks for matmul,
 * linear, element-wise, reductions, shape ops and regression losses. */
#include "gradcheck.h"

static lk_tensor *f_matmul(lk_tensor **in, void *ctx) { return lk_matmul(in[0], in[1]); }
static lk_tensor *f_matmul_t(lk_tensor **in, void *ctx) {
    return lk_matmul(lk_transpose(in[0], 0, 1), lk_transpose(in[1], 0, 1));
}
static lk_tensor *f_linear(lk_tensor **in, void *ctx) { return lk_linear(in[0], in[1], in[2]); }
static lk_tensor *f_mlp(lk_tensor **in, void *ctx) {
    return lk_mse_loss(lk_tanh(lk_linear(lk_relu(lk_linear(in[0], in[1], in[2])), in[3], NULL)), in[4],
                       LK_REDUCTION_MEAN);
}
static lk_tensor *f_add(lk_tensor **in, void *ctx) { return lk_add(in[0], in[1]); }
static lk_tensor *f_sub(lk_tensor **in, void *ctx) { return lk_sub(in[0], in[1]); }
static lk_tensor *f_mul(lk_tensor **in, void *ctx) { return lk_mul(in[0], in[1]); }
static lk_tensor *f_div(lk_tensor **in, void *ctx) { return lk_div(in[0], lk_add_scalar(lk_abs(in[1]), 1.0f)); }
static lk_tensor *f_sum01(lk_tensor **in, void *ctx) { return lk_sum(in[0], (int[]){0, 2}, 2, false); }
static lk_tensor *f_mean_k(lk_tensor **in, void *ctx) { return lk_mean(in[0], (int[]){-1}, 1, true); }
static lk_tensor *f_sum_all(lk_tensor **in, void *ctx) { return lk_sum(in[0], NULL, 0, false); }
static lk_tensor *f_shape(lk_tensor **in, void *ctx) {
    lk_tensor *r = lk_reshape(in[0], LK_SHAPE(3, -1));
    lk_tensor *parts[2] = {lk_slice(r, 1, 1, 3), lk_transpose(lk_slice(r, 1, 0, 3), 0, 1)};
    parts[1] = lk_transpose(parts[1], 0, 1);
    return lk_concat(parts, 2, 1);
}
static lk_tensor *f_batched(lk_tensor **in, void *ctx) { return lk_matmul(in[0], in[1]); }
static lk_tensor *f_losses(lk_tensor **in, void *ctx) {
    lk_tensor *a = lk_mse_loss(in[0], in[1], LK_REDUCTION_SUM);
    lk_tensor *b = lk_l1_loss(in[0], in[1], LK_REDUCTION_MEAN);
    lk_tensor *c = lk_smooth_l1_loss(in[0], in[1], LK_REDUCTION_NONE, 0.5f);
    return lk_add(lk_add(a, b), lk_sum(c, NULL, 0, false));
}

static void gc(const char *name, lk_gc_fn f, int n, int64_t shapes[][4], int *ndims) {
    lk_tensor *in[8] = {0};
    for (int i = 0; i < n; i++) in[i] = lk_gc_param(100 + (uint32_t)i, ndims[i], shapes[i]);
    lk_gradcheck(name, f, in, n, NULL);
    for (int i = 0; i < n; i++) lk_tensor_release(in[i]);
}

static void gradchecks(void) {
    gc("matmul", f_matmul, 2, (int64_t[][4]){{5, 7}, {7, 3}}, (int[]){2, 2});
    gc("matmul 3d@2d", f_matmul, 2, (int64_t[][4]){{2, 3, 4}, {4, 1}}, (int[]){3, 2});
    gc("matmul transposed views", f_matmul_t, 2, (int64_t[][4]){{7, 5}, {3, 7}}, (int[]){2, 2});
    gc("matmul batched", f_batched, 2, (int64_t[][4]){{3, 2, 5}, {3, 5, 4}}, (int[]){3, 3});
    gc("linear", f_linear, 3, (int64_t[][4]){{4, 1, 5}, {3, 5}, {3}}, (int[]){3, 2, 1});
    gc("mlp", f_mlp, 5, (int64_t[][4]){{6, 5}, {7, 5}, {7}, {3, 7}, {6, 3}}, (int[]){2, 2, 1, 2, 2});
    gc("add broadcast", f_add, 2, (int64_t[][4]){{2, 3, 4}, {3, 1}}, (int[]){3, 2});
    gc("sub broadcast", f_sub, 2, (int64_t[][4]){{1, 4}, {5, 1}}, (int[]){2, 2});
    gc("mul broadcast", f_mul, 2, (int64_t[][4]){{2, 1, 3}, {4, 3}}, (int[]){3, 2});
    gc("div broadcast", f_div, 2, (int64_t[][4]){{3, 4}, {4}}, (int[]){2, 1});
    gc("sum dims", f_sum01, 1, (int64_t[][4]){{2, 3, 5}}, (int[]){3});
    gc("mean keepdim", f_mean_k, 1, (int64_t[][4]){{4, 1, 3}}, (int[]){3});
    gc("sum all", f_sum_all, 1, (int64_t[][4]){{1, 7}}, (int[]){2});
    gc("reshape/slice/transpose/concat", f_shape, 1, (int64_t[][4]){{2, 9}}, (int[]){2});
    gc("regression losses", f_losses, 2, (int64_t[][4]){{3, 5}, {3, 5}}, (int[]){2, 2});
}

static int hook_order[8], hook_n;
static void record_hook(lk_tensor *p, void *ctx) { hook_order[hook_n++] = (int)(intptr_t)ctx; }

static void grad_hooks_fire_in_reverse(void) {
    lk_tensor *x = lk_gc_param(1, LK_SHAPE(4, 3));
    lk_tensor *w1 = lk_gc_param(2, LK_SHAPE(5, 3)), *w2 = lk_gc_param(3, LK_SHAPE(2, 5));
    lk_tensor_set_requires_grad(x, false);
    lk_tensor_set_grad_hook(w1, record_hook, (void *)1);
    lk_tensor_set_grad_hook(w2, record_hook, (void *)2);
    hook_n = 0;
    lk_scope_begin();
    lk_tensor *loss = lk_sum(lk_linear(lk_relu(lk_linear(x, w1, NULL)), w2, NULL), NULL, 0, false);
    CHECK_OK(lk_backward(loss));
    lk_scope_end();
    CHECK(hook_n == 2 && hook_order[0] == 2 && hook_order[1] == 1);
    CHECK(lk_tape_len() == 0);
    /* Gradients accumulate across passes. */
    float g0 = ((float *)w1->grad->data)[0];
    lk_scope_begin();
    loss = lk_sum(lk_linear(lk_relu(lk_linear(x, w1, NULL)), w2, NULL), NULL, 0, false);
    CHECK_OK(lk_backward(loss));
    lk_scope_end();
    CHECK_NEAR(((float *)w1->grad->data)[0], 2 * g0, 1e-5);
    lk_tensor_zero_grad(w1, false);
    CHECK(((float *)w1->grad->data)[0] == 0.0f);
    lk_tensor_zero_grad(w1, true);
    CHECK(w1->grad == NULL);
    lk_tensor_release(x);
    lk_tensor_release(w1);
    lk_tensor_release(w2);
}

static void no_grad_and_scopes(void) {
    lk_tensor *w = lk_gc_param(5, LK_SHAPE(3, 3));
    lk_scope_begin();
    bool prev = lk_set_grad_enabled(false);
    lk_tensor *y = lk_matmul(w, w);
    CHECK(y && !y->requires_grad && y->grad_fn == NULL);
    CHECK(lk_tape_len() == 0);
    lk_set_grad_enabled(prev);
    lk_tensor *z = lk_matmul(w, w);
    CHECK(z && z->requires_grad && lk_tape_len() == 1);
    lk_tensor *kept = lk_tensor_keep(z);
    lk_scope_end();
    CHECK(lk_tape_len() == 0 && kept->grad_fn == NULL);
    lk_tensor_release(kept);
    /* Steady state: the same step twice allocates nothing the second time. */
    lk_tensor *x = lk_gc_param(6, LK_SHAPE(8, 3));
    for (int it = 0; it < 3; it++) {
        uint64_t before = lk_alloc_count();
        lk_scope_begin();
        lk_tensor *loss = lk_mse_loss(lk_relu(lk_linear(x, w, NULL)), x, LK_REDUCTION_MEAN);
        CHECK_OK(lk_backward(loss));
        lk_scope_end();
        if (it == 2) CHECK_MSG(lk_alloc_count() == before, "%llu allocations in a steady-state step",
                               (unsigned long long)(lk_alloc_count() - before));
    }
    lk_tensor_release(x);
    lk_tensor_release(w);
}

static void bad_input(void) {
    lk_tensor *a = lk_tensor_zeros(LK_F32, LK_SHAPE(2, 3)), *b = lk_tensor_zeros(LK_F32, LK_SHAPE(4, 5));
    lk_tensor *i = lk_tensor_zeros(LK_I32, LK_SHAPE(2, 3));
    lk_scope_begin();
    CHECK(lk_matmul(a, b) == NULL && lk_last_status() == LK_STATUS_INVALID_ARGUMENT &&
          strstr(lk_last_error(), "[2, 3] and [4, 5]"));
    lk_clear_error();
    CHECK(lk_add(a, b) == NULL && strstr(lk_last_error(), "cannot broadcast"));
    lk_clear_error();
    CHECK(lk_relu(i) == NULL && lk_last_status() == LK_STATUS_UNSUPPORTED && strstr(lk_last_error(), "i32"));
    lk_clear_error();
    CHECK(lk_relu(i) == NULL && strstr(lk_last_error(), "RELU: input has dtype i32; this op supports f32, bf16 and f16"));
    lk_clear_error();
    /* NULL propagates and keeps the first error. */
    CHECK(lk_relu(lk_matmul(a, b)) == NULL && strstr(lk_last_error(), "matmul"));
    lk_clear_error();
    CHECK(lk_backward(lk_sum(a, NULL, 0, false)) == LK_STATUS_INVALID_USAGE);
    lk_clear_error();
    CHECK(lk_reshape(a, LK_SHAPE(4, -1)) == NULL && strstr(lk_last_error(), "6 elements"));
    lk_scope_end();
    lk_tensor_release(a);
    lk_tensor_release(b);
    lk_tensor_release(i);
}

static void half_conversions(void) {
    CHECK(lk_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(lk_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(lk_f32_to_f16(1.0f) == 0x3c00);
    CHECK(lk_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(lk_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(lk_f32_to_f16(5.9604645e-8f) == 0x0001);
    CHECK(lk_f16_to_f32(0x0001) == 5.9604645e-8f);
    CHECK(lk_f32_to_f16(-2.0f) == 0xc000);
    CHECK(isnan(lk_f16_to_f32(lk_f32_to_f16(NAN))));
    /* round to nearest even: 1 + 2^-8 is a tie between bf16 1.0 and 1.0078125 */
    CHECK(lk_f32_to_bf16(1.00390625f) == 0x3f80);
    CHECK(lk_f32_to_bf16(1.01171875f) == 0x3f82);
    /* every f16 round-trips through f32 */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = lk_f16_to_f32((uint16_t)h);
        if (!isnan(f) && lk_f32_to_f16(f) != h) bad++;
    }
    CHECK(bad == 0);
    /* the bulk conversions equal the scalar ones bit for bit (NaN: still NaN),
     * over ties, subnormals, overflow to inf and odd tail lengths */
    enum { N = 4099 };
    static float src[N], wide[N];
    static uint16_t half[N];
    lk_rng r;
    lk_rng_init(&r, 17, LK_RNG_DATA, 0, 0);
    for (int k = 0; k < N; k++) {
        uint32_t bits = lk_rng_u32(&r);
        memcpy(&src[k], &bits, 4);
    }
    src[0] = 1.00390625f, src[1] = 65520.0f, src[2] = -5.9604645e-8f, src[3] = 1e-40f, src[4] = INFINITY, src[5] = NAN;
    const uint32_t special[] = {0x3f818000u /* a tie rounding up (odd) */, 0xff81a5a5u /* a signalling NaN */,
                                0x7f7fffffu /* the largest: rounds to inf in bf16 */, 0x807fffffu, 0x80000000u};
    for (int k = 0; k < 5; k++) memcpy(&src[6 + k], &special[k], 4);
    const lk_dtype dts[2] = {LK_BF16, LK_F16};
    for (int d = 0; d < 2; d++) {
        int mism = 0;
        lk_f32_to_half_n(dts[d], half, src, N);
        for (int k = 0; k < N; k++) {
            uint16_t want = dts[d] == LK_BF16 ? lk_f32_to_bf16(src[k]) : lk_f32_to_f16(src[k]);
            bool nan = isnan(src[k]);
            float back = dts[d] == LK_BF16 ? lk_bf16_to_f32(half[k]) : lk_f16_to_f32(half[k]);
            /* bf16's bulk NaN is the scalar one, bit for bit; F16C keeps f16's payload */
            mism += nan && dts[d] == LK_F16 ? !isnan(back) : half[k] != want;
        }
        lk_half_to_f32_n(dts[d], wide, half, N);
        for (int k = 0; k < N; k++) {
            float want = dts[d] == LK_BF16 ? lk_bf16_to_f32(half[k]) : lk_f16_to_f32(half[k]);
            mism += isnan(want) ? !isnan(wide[k]) : memcmp(&want, &wide[k], 4) != 0;
        }
        CHECK_MSG(mism == 0, "%s: %d bulk conversions differ from the scalar ones", lk_dtype_name(dts[d]), mism);
    }
    lk_tensor *t = lk_tensor_from_data(LK_F32, LK_SHAPE(3), (float[]){1.5f, -2.25f, 3.0f});
    lk_tensor *h = lk_tensor_cast(t, LK_BF16), *back = lk_tensor_cast(h, LK_F32);
    CHECK(lk_tensor_get(back, 1) == -2.25);
    lk_tensor_release(t);
    lk_tensor_release(h);
    lk_tensor_release(back);
}

/* A leaf whose gradient is a strided view (here a transposed [4, 3]
 * buffer): each backward adds into it through LK_OP_COPY's accumulating
 * form, element for element, at the view's strides. */
static void strided_accumulation(void) {
    lk_tensor *x = lk_gc_param(7, LK_SHAPE(3, 4)), *c = lk_gc_param(8, LK_SHAPE(3, 4));
    lk_tensor_set_requires_grad(c, false);
    lk_tensor *buf = lk_tensor_zeros(LK_F32, 2, (int64_t[]){4, 3});
    x->grad = lk_transpose(buf, 0, 1); /* [3, 4], strides (1, 3): not contiguous */
    CHECK(x->grad && !lk_tensor_is_contiguous(x->grad));
    for (int pass = 1; pass <= 2; pass++) {
        lk_scope_begin();
        CHECK_OK(lk_backward(lk_sum(lk_mul(x, c), NULL, 0, false)));
        lk_scope_end();
    }
    const float *b = buf->data, *cd = c->data;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            CHECK_MSG(b[j * 3 + i] == cd[i * 4 + j] + cd[i * 4 + j], "grad[%d, %d] = %g, want %g", i, j,
                      (double)b[j * 3 + i], 2.0 * cd[i * 4 + j]);
    lk_tensor_release(buf);
    lk_tensor_release(c);
    lk_tensor_release(x);
}

/* A leaf whose gradient is marked stale (a sharded strategy's reused
 * buffer, garbage in it) has it overwritten by the backward's first write,
 * whichever path writes it: linear's GEMM straight into the gradient
 * (beta 0), an accumulation (layer norm's parameters, a bias: a copy),
 * conv2d's direct dW (declined for a stale one), a strided gradient. The
 * flag is gone after that write, so a second backward adds as before. */
static lk_tensor *stale_loss(lk_tensor **p) {
    lk_tensor *y = lk_layer_norm(lk_linear(p[0], p[1], p[2]), 1, p[3], p[4], 1e-5f);
    lk_tensor *c = lk_conv2d(p[5], p[6], p[7], (lk_conv2d_params){{1, 1}, {1, 1}, {1, 1}, 1});
    return lk_add(lk_sum(lk_mul(y, y), NULL, 0, false), lk_sum(lk_mul(c, c), NULL, 0, false));
}

static void stale_grads_are_overwritten(void) {
    enum { NP = 8 };
    int64_t shapes[NP][4] = {{5, 6}, {4, 6}, {4}, {4}, {4}, {2, 3, 5, 5}, {4, 3, 3, 3}, {4}};
    int nd[NP] = {2, 2, 1, 1, 1, 4, 4, 1};
    lk_tensor *p[NP], *ref[NP];
    for (int i = 0; i < NP; i++) p[i] = lk_gc_param(40 + (uint32_t)i, nd[i], shapes[i]);
    lk_scope_begin();
    CHECK_OK(lk_backward(stale_loss(p)));
    lk_scope_end();
    for (int i = 0; i < NP; i++) ref[i] = lk_tensor_clone(p[i]->grad);
    /* the linear weight's gradient a transposed view: the strided copy */
    lk_tensor *wbuf = lk_tensor_zeros(LK_F32, 2, (int64_t[]){6, 4});
    lk_tensor_release(p[1]->grad);
    p[1]->grad = lk_transpose(wbuf, 0, 1);
    for (int pass = 1; pass <= 2; pass++) {
        for (int i = 0; i < NP && pass == 1; i++) {
            lk_tensor_fill(p[i]->grad, 12345.0);
            p[i]->lk__grad_stale = true;
        }
        lk_scope_begin();
        CHECK_OK(lk_backward(stale_loss(p)));
        lk_scope_end();
        for (int i = 0; i < NP; i++) {
            CHECK_MSG(!p[i]->lk__grad_stale, "pass %d: parameter %d still marked stale", pass, i);
            double worst = 0;
            for (int64_t k = 0; k < p[i]->numel; k++) {
                double want = pass * lk_tensor_get(ref[i], k), got = lk_tensor_get(p[i]->grad, k);
                worst = fmax(worst, fabs(got - want) / (1e-6 + fabs(want)));
            }
            CHECK_MSG(worst < 1e-5, "pass %d: parameter %d's gradient off by %g (relative)", pass, i, worst);
        }
    }
    /* zeroing clears the mark */
    p[0]->lk__grad_stale = true;
    lk_tensor_zero_grad(p[0], false);
    CHECK(!p[0]->lk__grad_stale && lk_tensor_get(p[0]->grad, 0) == 0.0);
    for (int i = 0; i < NP; i++) lk_tensor_release(ref[i]), lk_tensor_release(p[i]);
    lk_tensor_release(wbuf);
}

LK_TEST_MAIN(LK_TEST_CASE(gradchecks), LK_TEST_CASE(grad_hooks_fire_in_reverse), LK_TEST_CASE(no_grad_and_scopes),
             LK_TEST_CASE(bad_input), LK_TEST_CASE(half_conversions), LK_TEST_CASE(strided_accumulation),
             LK_TEST_CASE(stale_grads_are_overwritten))

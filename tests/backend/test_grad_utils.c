/* The gradient utilities' descriptors on the CPU backend: LK_OP_NORM (the
 * raw sums gradient clipping combines, accumulated in double in index
 * order, and max |x| with NaN winning), LK_OP_NONFINITE (the first inf or
 * NaN, across the 4096-element blocks it tests at once) and LK_OP_UNSCALE
 * (the loss scaler's: every element scaled, each checked before scaling)
 * and LK_OP_CLAMP (clip_grad_value: NaN kept). */
#include <math.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "lk_test.h"

#define N 10007 /* more than two blocks of 4096, and a short last one */
static float xs[N], ys[N];

static double run_norm(double p) {
    lk_op_desc d = {.op = LK_OP_NORM, .dtype = {LK_F32, LK_F64}, .norm = {N, p}};
    double out = -1.0;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){xs, &out}));
    return out;
}

static void norms(void) {
    for (int i = 0; i < N; i++) xs[i] = (float)sin(i * 0.37) * (float)(1 + i % 5);
    double s2 = 0, s1 = 0, s3 = 0, mx = 0;
    for (int i = 0; i < N; i++) {
        s2 += (double)xs[i] * xs[i];
        s1 += fabs((double)xs[i]);
        s3 += pow(fabs((double)xs[i]), 3.0);
        if (fabs((double)xs[i]) > mx) mx = fabs((double)xs[i]);
    }
    CHECK(run_norm(2.0) == s2);
    CHECK(run_norm(1.0) == s1);
    CHECK(run_norm(3.0) == s3);
    CHECK(run_norm(INFINITY) == mx);
    xs[77] = NAN; /* a NaN wins the max, wherever it is */
    CHECK(isnan(run_norm(INFINITY)));
    CHECK(isnan(run_norm(2.0)));
    lk_op_desc bad = {.op = LK_OP_NORM, .dtype = {LK_F32, LK_F32}, .norm = {N, 2.0}};
    CHECK_ERR(lk__backend_run(LK_DEVICE_CPU, &bad, (void *[]){xs, ys}), LK_STATUS_UNSUPPORTED,
              "the cpu backend has no norm p=2 f32 -> f32 (10007)");
}

static int64_t run_nonfinite(void) {
    lk_op_desc d = {.op = LK_OP_NONFINITE, .dtype = {LK_F32, LK_I64}, .nonfinite = {N, 1.0f}};
    int64_t idx = -2;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){xs, &idx}));
    return idx;
}

static int64_t run_unscale(float mul) {
    lk_op_desc d = {.op = LK_OP_UNSCALE, .dtype = {LK_F32, LK_F32, LK_I64}, .nonfinite = {N, mul}};
    int64_t count = -2;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){xs, xs, &count})); /* in place */
    return count;
}

static void nonfinite(void) {
    for (int i = 0; i < N; i++) xs[i] = (float)(i % 13) - 6.0f;
    CHECK(run_nonfinite() == -1);
    xs[9000] = NAN;
    CHECK(run_nonfinite() == 9000);
    xs[5000] = -INFINITY; /* the first one, in an earlier block */
    CHECK(run_nonfinite() == 5000);
    xs[5000] = 0.0f;
    CHECK(run_nonfinite() == 9000);
}

static void unscale(void) {
    for (int i = 0; i < N; i++) xs[i] = (float)(i % 13) - 6.0f;
    xs[100] = 3e38f; /* finite, overflows once scaled: not counted */
    memcpy(ys, xs, sizeof ys);
    CHECK(run_unscale(2.0f) == 0);
    for (int i = 0; i < N; i++) CHECK_MSG(xs[i] == ys[i] * 2.0f, "element %d not scaled", i);
    memcpy(xs, ys, sizeof xs);
    xs[4096] = INFINITY, xs[N - 1] = NAN;
    CHECK(run_unscale(0.5f) == 2);
    for (int i = 0; i < N - 1; i++)
        if (i != 4096) CHECK_MSG(xs[i] == ys[i] * 0.5f, "element %d not scaled", i);
    CHECK(isinf(xs[4096]) && isnan(xs[N - 1]));
}

static void clamp(void) {
    float v[5] = {-3.0f, -0.5f, 0.0f, 2.5f, NAN}, want[5] = {-1.0f, -0.5f, 0.0f, 1.0f, NAN};
    lk_op_desc d = {.op = LK_OP_CLAMP, .dtype = {LK_F32, LK_F32}, .clamp = {5, -1.0f, 1.0f}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){v, v}));
    for (int i = 0; i < 4; i++) CHECK_MSG(v[i] == want[i], "element %d: %g, expected %g", i, v[i], want[i]);
    CHECK(isnan(v[4]));
}

LK_TEST_MAIN(LK_TEST_CASE(norms), LK_TEST_CASE(nonfinite), LK_TEST_CASE(unscale), LK_TEST_CASE(clamp))

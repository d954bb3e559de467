/* The CPU backend's regression losses (LK_OP_LOSS, LK_OP_LOSS_BACKWARD) over
 * every kind, reduction and input dtype, at sizes around the kernel's block
 * (1024) and lane count (8):
 * - per-element losses and gradients equal the scalar f32 formulas bit for
 *   bit (a 16-bit gradient: that value rounded once);
 * - a mean or sum is the long-double sum of the per-element losses rounded
 *   to f32, to within one f32 ulp (the eight double partial sums' error is
 *   below n * 2^-53 of the sum: the losses are >= 0), and exactly equal in
 *   at least 99% of the cases;
 * - a 16-bit input gives the f32 path's bits for the same (widened) values;
 * - an empty mean is NaN and an empty sum 0. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "lk_test.h"

enum { NMAX = 200704 };
static float xf[NMAX], yf[NMAX], out[NMAX], gd[NMAX], dx[NMAX];
static uint16_t xh[NMAX], yh[NMAX], dxh[NMAX];

static float value(lk_ploss_kind k, float beta, float x, float y) {
    float diff = x - y;
    switch (k) {
    case LK_PLOSS_MSE: return diff * diff;
    case LK_PLOSS_L1: return fabsf(diff);
    default: return fabsf(diff) < beta ? 0.5f * diff * diff / beta : fabsf(diff) - 0.5f * beta;
    }
}

static float grad(lk_ploss_kind k, float beta, float x, float y) {
    float diff = x - y;
    float sgn = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f);
    switch (k) {
    case LK_PLOSS_MSE: return 2.0f * diff;
    case LK_PLOSS_L1: return sgn;
    default: return fabsf(diff) < beta ? diff / beta : sgn;
    }
}

static float run_fwd(lk_dtype dt, lk_ploss_kind k, int red, int64_t n, float beta) {
    lk_op_desc d = {.op = LK_OP_LOSS, .dtype = {dt, dt, LK_F32}};
    d.loss = (lk_loss_params){k, red, n, beta};
    void *x = dt == LK_F32 ? (void *)xf : xh, *y = dt == LK_F32 ? (void *)yf : yh;
    out[0] = -1.0f;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){x, y, out}));
    return out[0];
}

static int64_t exact, within_ulp, cases;

static void one(lk_dtype dt, lk_ploss_kind k, int red, int64_t n) {
    float beta = 0.5f;
    /* the values the kernel sees: a 16-bit input's widened ones */
    if (dt != LK_F32) {
        lk_f32_to_half_n(dt, xh, xf, (size_t)n);
        lk_f32_to_half_n(dt, yh, yf, (size_t)n);
    }
    static float xv[NMAX], yv[NMAX];
    if (dt == LK_F32) {
        memcpy(xv, xf, (size_t)n * sizeof(float));
        memcpy(yv, yf, (size_t)n * sizeof(float));
    } else {
        lk_half_to_f32_n(dt, xv, xh, (size_t)n);
        lk_half_to_f32_n(dt, yv, yh, (size_t)n);
    }
    float got = run_fwd(dt, k, red, n, beta);
    if (red == LK_REDUCTION_NONE) {
        int bad = 0;
        for (int64_t i = 0; i < n && !bad; i++) bad = memcmp(&out[i], &(float){value(k, beta, xv[i], yv[i])}, 4) != 0;
        CHECK(!bad);
    } else {
        long double s = 0;
        for (int64_t i = 0; i < n; i++) s += value(k, beta, xv[i], yv[i]);
        float ref = red == LK_REDUCTION_SUM ? (float)s : n ? (float)(s / n) : NAN;
        if (n == 0) CHECK(red == LK_REDUCTION_SUM ? got == 0.0f : isnan(got));
        else {
            cases++;
            exact += got == ref;
            within_ulp += got == ref || got == nextafterf(ref, INFINITY) || got == nextafterf(ref, -INFINITY);
        }
        if (dt != LK_F32) { /* the f32 path over the same values gives the same bits */
            memcpy(xf, xv, (size_t)n * sizeof(float));
            memcpy(yf, yv, (size_t)n * sizeof(float));
            float f = run_fwd(LK_F32, k, red, n, beta);
            CHECK(memcmp(&f, &got, 4) == 0);
        }
    }
    /* backward */
    lk_op_desc d = {.op = LK_OP_LOSS_BACKWARD, .dtype = {dt, dt, LK_F32, dt}};
    d.loss = (lk_loss_params){k, red, n, beta};
    void *x = dt == LK_F32 ? (void *)xf : xh, *y = dt == LK_F32 ? (void *)yf : yh;
    void *g = dt == LK_F32 ? (void *)dx : dxh;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){x, y, gd, g}));
    float scale = red == LK_REDUCTION_MEAN ? 1.0f / (float)n : 1.0f;
    int bad = 0;
    for (int64_t i = 0; i < n && !bad; i++) {
        float gi = red == LK_REDUCTION_NONE ? gd[i] : gd[0] * scale;
        float want = gi * grad(k, beta, xv[i], yv[i]);
        if (dt == LK_F32) bad = memcmp(&dx[i], &want, 4) != 0;
        else {
            uint16_t w16;
            lk_f32_to_half_n(dt, &w16, &want, 1);
            bad = dxh[i] != w16;
        }
        if (bad) printf("  %s kind %d red %d n %lld: dx[%lld] differs\n", lk_dtype_name(dt), (int)k, red, (long long)n,
                        (long long)i);
    }
    CHECK(!bad);
}

static void every_kind_reduction_dtype_size(void) {
    static const int64_t sizes[] = {0, 1, 7, 8, 9, 1023, 1024, 1025, 5003, NMAX};
    static const lk_dtype dts[] = {LK_F32, LK_BF16, LK_F16};
    uint64_t s = 12345;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t di = 0; di < 3; di++)
            for (int k = 0; k < 3; k++)
                for (int red = 0; red < 3; red++) {
                    int64_t n = sizes[si];
                    for (int64_t i = 0; i < n; i++) { /* values across magnitudes, some equal pairs */
                        s = s * 6364136223846793005ull + 1442695040888963407ull;
                        float u = (float)(s >> 40) / (float)(1 << 24) - 0.5f;
                        float e = ldexpf(1.0f, (int)(s >> 20 & 7) - 3);
                        xf[i] = u * e;
                        yf[i] = (s >> 16 & 15) == 0 ? xf[i] : -u * 0.7f * e + 0.01f;
                        gd[i] = 1.0f + (float)(s >> 8 & 255) / 256.0f;
                    }
                    one(dts[di], (lk_ploss_kind)k, (lk_reduction[]){LK_REDUCTION_NONE, LK_REDUCTION_MEAN,
                                                                     LK_REDUCTION_SUM}[red], n);
                }
    printf("%lld reductions: %lld exactly the long-double sum rounded, %lld within one ulp\n", (long long)cases,
           (long long)exact, (long long)within_ulp);
    CHECK(within_ulp == cases);
    CHECK(exact * 100 >= cases * 99);
}

LK_TEST_MAIN(LK_TEST_CASE(every_kind_reduction_dtype_size))

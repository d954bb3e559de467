/* SyncBatchNorm's split passes on the CPU backend (LK_OP_BN_STATS,
 * LK_OP_BN_APPLY) against their definitions over [N, C, S] = [3, 2, 11]
 * (not a multiple of 8: the kernels' tails run). The data are small
 * integers and the coefficients powers of two, so every sum and product is
 * exact and the comparison is bit for bit. The per-channel finish
 * (LK_OP_BN_FINISH, _BACKWARD), which replaced host code in ops_norm.c,
 * against that host code's expressions, kept here: bit for bit, with f32
 * and bf16 (widened) strided parameters. */
#include <math.h>

#include "backend/backend_impl.h"
#include "lk_test.h"

enum { N = 3, C = 2, S = 11 };
static float x[N * C * S], g[N * C * S], y[N * C * S];

static lk_status run(lk_op_kind op, lk_bn_stat stat, bool backward, const float *gd, const float *k, void *out) {
    lk_op_desc d = {.op = op, .dtype = {LK_F32, LK_F32, LK_F32, op == LK_OP_BN_STATS ? LK_F64 : LK_F32}};
    d.bn_split = (lk_bn_split_params){N, C, S, stat, backward};
    return lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){x, (void *)gd, (void *)k, out});
}

static void stats(void) {
    for (int i = 0; i < N * C * S; i++) x[i] = (float)(i % 7) - 3.0f, g[i] = (float)(i % 5) - 2.0f;
    float mean[C] = {0.5f, -1.0f};
    double out[2 * C];
    for (int pass = 0; pass < 3; pass++) {
        CHECK_OK(run(LK_OP_BN_STATS, (lk_bn_stat)pass, false, pass == 2 ? g : NULL, pass ? mean : NULL, out));
        for (int c = 0; c < C; c++) {
            double a = 0, b = 0;
            for (int n = 0; n < N; n++)
                for (int s = 0; s < S; s++) {
                    int at = (n * C + c) * S + s;
                    float dv = x[at] - mean[c];
                    a += pass == 0 ? x[at] : pass == 1 ? dv * dv : g[at];
                    b += g[at] * dv;
                }
            CHECK_MSG(out[c] == a, "pass %d channel %d: %g, expected %g", pass, c, out[c], a);
            if (pass == 2) CHECK_MSG(out[C + c] == b, "grad channel %d: %g, expected %g", c, out[C + c], b);
        }
    }
}

static void apply(void) {
    for (int i = 0; i < N * C * S; i++) x[i] = (float)(i % 7) - 3.0f, g[i] = (float)(i % 5) - 2.0f;
    float kf[2 * C] = {0.5f, 2.0f, -1.0f, 0.25f}; /* scale, shift */
    CHECK_OK(run(LK_OP_BN_APPLY, LK_BN_SUM, false, NULL, kf, y));
    for (int i = 0; i < N * C * S; i++) {
        int c = i / S % C;
        CHECK_MSG(y[i] == x[i] * kf[c] + kf[C + c], "forward element %d", i);
    }
    float kb[4 * C] = {0.5f, -1.0f, 0.25f, 0.5f, 2.0f, 1.0f, -0.5f, 0.125f}; /* mean, k0, k1, k2 */
    CHECK_OK(run(LK_OP_BN_APPLY, LK_BN_SUM, true, g, kb, y));
    for (int i = 0; i < N * C * S; i++) {
        int c = i / S % C;
        CHECK_MSG(y[i] == g[i] * kb[2 * C + c] + (x[i] - kb[c]) * kb[3 * C + c] + kb[C + c], "backward element %d", i);
    }
}

/* ---- the finish: the host code ops_norm.c ran before it moved to the device ---- */
enum { FC = 5, SW = 2, SRV = 3 };
static uint32_t seed = 77;
static double urand(void) {
    seed = seed * 1664525u + 1013904223u;
    return (double)(seed >> 8) / 16777216.0;
}
static float get(lk_dtype t, const void *p, long i) {
    return t == LK_F32 ? ((const float *)p)[i] : lk_bf16_bits_to_f32(((const uint16_t *)p)[i]);
}
static void set(lk_dtype t, void *p, long i, float v) {
    if (t == LK_F32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = lk_f32_to_bf16_bits(v);
}

static void finish_case(lk_dtype pt, bool affine, bool running) {
    double v[2 * FC + 1], M = 37.0;
    for (int c = 0; c < FC; c++) v[c] = (urand() - 0.3) * 40, v[FC + c] = urand() * 50 + v[c] * v[c] / M;
    v[FC + 1] = v[1] * v[1] / M * (1 - 1e-15); /* rounds below the square: the clamp at 0 */
    v[2 * FC] = M;
    float eps = 1e-5f, mom = 0.1f;
    /* w at stride 2, b, running_mean contiguous, running_var at stride 3; one copy each for the op, one for the reference */
    uint32_t w[2][FC * SW] = {{0}}, b[2][FC] = {{0}}, rm[2][FC] = {{0}}, rv[2][FC * SRV] = {{0}}; /* room for f32 or bf16 */
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < FC * SRV; c++) {
            seed = 1000u + (unsigned)c; /* the same values in both copies */
            if (c < FC * SW) set(pt, w[r], c, (float)(urand() + 0.5));
            if (c < FC) set(pt, b[r], c, (float)(urand() - 0.5)), set(pt, rm[r], c, (float)(urand() - 0.5));
            set(pt, rv[r], c, (float)(urand() + 0.5));
        }
    float stats[2 * FC], coef[2 * FC];
    lk_op_desc d = {.op = LK_OP_BN_FINISH, .dtype = {LK_F64, pt, pt, pt, pt, LK_F32, LK_F32}};
    d.bn_finish = (lk_bn_finish_params){FC, eps, mom, {SW, 1, 1, SRV}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){v, affine ? w[0] : NULL, affine ? b[0] : NULL,
                                                          running ? rm[0] : NULL, running ? rv[0] : NULL, stats, coef}));
    for (long c = 0; c < FC; c++) { /* ops_norm.c's bn_sync_stats, as it was */
        double m = v[c] / M, q = v[FC + c] - v[c] * m;
        if (q < 0) q = 0;
        float mean = (float)m, invstd = (float)(1.0 / sqrt(q / M + (double)eps));
        if (running) {
            set(pt, rm[1], c, (1.0f - mom) * get(pt, rm[1], c) + mom * mean);
            set(pt, rv[1], c * SRV, (1.0f - mom) * get(pt, rv[1], c * SRV) + mom * (float)(q / (M - 1)));
        }
        float scale = invstd * (affine ? get(pt, w[1], c * SW) : 1.0f);
        float shift = (affine ? get(pt, b[1], c) : 0.0f) - mean * scale;
        CHECK_MSG(!memcmp(&stats[c], &mean, 4) && !memcmp(&stats[FC + c], &invstd, 4), "%s channel %ld: mean %.9g invstd "
                  "%.9g, the host code's %.9g %.9g", lk_dtype_name(pt), c, stats[c], stats[FC + c], mean, invstd);
        CHECK_MSG(!memcmp(&coef[c], &scale, 4) && !memcmp(&coef[FC + c], &shift, 4), "%s channel %ld: scale %.9g shift "
                  "%.9g, the host code's %.9g %.9g", lk_dtype_name(pt), c, coef[c], coef[FC + c], scale, shift);
    }
    CHECK_MSG(!memcmp(rm[0], rm[1], sizeof rm[0]) && !memcmp(rv[0], rv[1], sizeof rv[0]),
              "%s: running statistics differ from the host code's", lk_dtype_name(pt));
    CHECK_MSG(!memcmp(w[0], w[1], sizeof w[0]) && !memcmp(b[0], b[1], sizeof b[0]), "%s: w or b written", lk_dtype_name(pt));
}

static void finish(void) {
    finish_case(LK_F32, true, true);
    finish_case(LK_F32, false, false);
    finish_case(LK_BF16, true, true);
}

static void finish_backward(void) {
    double v[4 * FC], M = 37.0;
    float w[FC], st[2 * FC], dw[FC], db[FC], k[4 * FC];
    for (int c = 0; c < 4 * FC; c++) v[c] = (urand() - 0.5) * 30;
    for (int c = 0; c < FC; c++) w[c] = (float)(urand() + 0.5), st[c] = (float)(urand() - 0.5), st[FC + c] = (float)(urand() + 0.2);
    for (int with_w = 0; with_w < 2; with_w++) {
        lk_op_desc d = {.op = LK_OP_BN_FINISH_BACKWARD, .dtype = {LK_F64, LK_F32, LK_F64, LK_F32, LK_F32, LK_F32, LK_F32}};
        d.bn_finish = (lk_bn_finish_params){.C = FC};
        CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){v, with_w ? w : NULL, &M, st, dw, db, k}));
        const double *all = v + 2 * FC;
        for (long c = 0; c < FC; c++) { /* ops_norm.c's bn_sync_backward, as it was */
            float hdb = (float)v[c], hdw = (float)(v[FC + c] * st[FC + c]);
            float is = st[FC + c], k1 = (with_w ? w[c] : 1.0f) * is;
            float want[4] = {st[c], (float)(-(double)k1 * all[c] / M), k1, (float)(-(double)k1 * is * is * all[FC + c] / M)};
            CHECK_MSG(!memcmp(&db[c], &hdb, 4) && !memcmp(&dw[c], &hdw, 4), "channel %ld: db %.9g dw %.9g, the host code's "
                      "%.9g %.9g", c, db[c], dw[c], hdb, hdw);
            for (int r = 0; r < 4; r++)
                CHECK_MSG(!memcmp(&k[r * FC + c], &want[r], 4), "channel %ld coefficient %d: %.9g, the host code's %.9g", c,
                          r, k[r * FC + c], want[r]);
        }
    }
}

LK_TEST_MAIN(LK_TEST_CASE(stats), LK_TEST_CASE(apply), LK_TEST_CASE(finish), LK_TEST_CASE(finish_backward))

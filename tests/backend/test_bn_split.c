/* SyncBatchNorm's split passes on the CPU backend (LK_OP_BN_STATS,
 * LK_OP_BN_APPLY) against their definitions over [N, C, S] = [3, 2, 11]
 * (not a multiple of 8: the kernels' tails run). The data are small
 * integers and the coefficients powers of two, so every sum and product is
 * exact and the comparison is bit for bit. */
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

LK_TEST_MAIN(LK_TEST_CASE(stats), LK_TEST_CASE(apply))

/* Batch norm with bf16/f16 activations and f32 per-channel vectors (the
 * mixed precisions' case), which the CPU backend runs a plane at a time
 * (cpu/norm.c), against its definition: the f32 op on the widened
 * activations, its output rounded once. Bit for bit — outputs, batch
 * statistics, running statistics, dx, dw and db — in training and eval, on
 * a small [N, C, S] with kernel tails and on one large enough to be cut
 * across the compute threads. */
#include "backend/backend_impl.h"
#include "lk_test.h"

static uint64_t seed = 7;
static float draw(void) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(seed >> 40) / (double)(1ull << 24)) * 4.0f - 1.5f;
}

static int differ(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) != 0; }

/* One forward and one backward in dt and, as reference, in f32 over the widened values. */
static void check(lk_dtype dt, long N, long C, long S, bool training) {
    size_t n = (size_t)(N * C * S);
    float *xf = malloc(n * 4), *gf = malloc(n * 4), *yr = malloc(n * 4), *dxr = malloc(n * 4);
    uint16_t *xh = malloc(n * 2), *gh = malloc(n * 2), *yh = malloc(n * 2), *dxh = malloc(n * 2),
             *yrh = malloc(n * 2), *dxrh = malloc(n * 2);
    float w[64], b[64], rm[2][64], rv[2][64], st[2][128], dw[2][64], db[2][64];
    CHECK(C <= 64 && xf && gf && yr && dxr && xh && gh && yh && dxh && yrh && dxrh);
    for (size_t i = 0; i < n; i++) xf[i] = draw(), gf[i] = draw();
    lk_f32_to_half_n(dt, xh, xf, n), lk_half_to_f32_n(dt, xf, xh, n); /* the values dt holds */
    lk_f32_to_half_n(dt, gh, gf, n), lk_half_to_f32_n(dt, gf, gh, n);
    for (long c = 0; c < C; c++) {
        w[c] = 0.5f + 0.1f * (float)c, b[c] = 0.25f * (float)c - 1.0f;
        for (int k = 0; k < 2; k++) rm[k][c] = 0.1f * (float)c, rv[k][c] = 1.0f + 0.05f * (float)c;
    }
    lk_batch_norm_params p = {N, C, S, (double)(N * S), 1e-5f, 0.1f, training, {1, 1, 1, 1}, false};
    for (int k = 0; k < 2; k++) { /* k 0: dt, k 1: the f32 reference */
        lk_dtype a = k ? LK_F32 : dt;
        lk_op_desc f = {.op = LK_OP_BATCH_NORM, .dtype = {a, LK_F32, LK_F32, LK_F32, LK_F32, a, LK_F32}};
        f.batch_norm = p;
        CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &f, (void *[]){k ? (void *)xf : xh, w, b, rm[k], rv[k], k ? (void *)yr : yh, st[k]}));
        lk_op_desc g = {.op = LK_OP_BATCH_NORM_BACKWARD, .dtype = {a, a, LK_F32, LK_F32, a, LK_F32, LK_F32}};
        g.batch_norm = p;
        CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &g,
                                 (void *[]){k ? (void *)xf : xh, k ? (void *)gf : gh, st[k], w, k ? (void *)dxr : dxh, dw[k], db[k]}));
    }
    lk_f32_to_half_n(dt, yrh, yr, n), lk_f32_to_half_n(dt, dxrh, dxr, n);
    const char *what = differ(yh, yrh, n * 2)          ? "y"
                       : differ(dxh, dxrh, n * 2)      ? "dx"
                       : differ(st[0], st[1], 8 * (size_t)C) ? "batch statistics"
                       : differ(rm[0], rm[1], 4 * (size_t)C) || differ(rv[0], rv[1], 4 * (size_t)C) ? "running statistics"
                       : differ(dw[0], dw[1], 4 * (size_t)C) || differ(db[0], db[1], 4 * (size_t)C) ? "dw or db"
                                                                                                      : NULL;
    CHECK_MSG(!what, "%s [%ld, %ld, %ld] %s: %s differs from the f32 op on the widened values", lk_dtype_name(dt), N,
              C, S, training ? "training" : "eval", what);
    free(xf), free(gf), free(yr), free(dxr), free(xh), free(gh), free(yh), free(dxh), free(yrh), free(dxrh);
}

static void matches_f32_on_widened_values(void) {
    static const long shapes[][3] = {{3, 5, 37}, {2, 3, 1}, {1, 2, 8}, {8, 4, 8300}};
    int cases = 0;
    for (int dt = 0; dt < 2; dt++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int tr = 0; tr < 2; tr++)
                check(dt ? LK_F16 : LK_BF16, shapes[i][0], shapes[i][1], shapes[i][2], tr), cases++;
    printf("%d batch-norm cases in bf16 and f16 checked bit for bit against the f32 op\n", cases);
}

LK_TEST_MAIN(LK_TEST_CASE(matches_f32_on_widened_values))

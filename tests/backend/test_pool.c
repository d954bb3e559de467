/* The CPU backend's max pooling (LK_OP_POOL2D) against the plane kernel of
 * kernels/conv.h, bit for bit, values and indices: the 2x2 stride-2 fast
 * path over even and odd plane sizes (the last row or column left out),
 * values drawn from a few levels so windows tie, with +-0, +-inf and NaNs
 * (first maximum wins, the last NaN wins), in f32 and through bf16; and a
 * 3x3 stride-2 padded pool, which takes the plane kernel; and an input
 * large enough to be cut across the compute threads, forward and backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/kernels.h"
#include "lk_test.h"

enum { PLANES = 5, HMAX = 29 };
static float x[PLANES * HMAX * HMAX], y[PLANES * HMAX * HMAX], yr[PLANES * HMAX * HMAX];
static int idx[PLANES * HMAX * HMAX], idxr[PLANES * HMAX * HMAX];
static uint16_t xh[PLANES * HMAX * HMAX], yh[PLANES * HMAX * HMAX];

static uint64_t s = 99;
static float draw(int special) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    unsigned r = (unsigned)(s >> 33);
    if (special && r % 97 == 0) return NAN;
    if (special && r % 89 == 0) return -NAN;
    if (r % 31 == 0) return -INFINITY;
    if (r % 37 == 0) return INFINITY;
    if (r % 11 == 0) return -0.0f;
    if (r % 13 == 0) return 0.0f;
    return (float)(int)(r % 7) - 3.0f; /* few levels: ties */
}

static int bits_differ(const float *a, const float *b, long n) {
    for (long i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i])) {
            uint32_t u, v;
            memcpy(&u, &a[i], 4), memcpy(&v, &b[i], 4);
            if (u != v) return 1;
        } else if (memcmp(&a[i], &b[i], 4)) return 1;
    }
    return 0;
}

static void check(lk_dtype dt, long H, long W, long k, long st, long pad, int special) {
    long OH = (H + 2 * pad - k) / st + 1, OW = (W + 2 * pad - k) / st + 1, ni = H * W, no = OH * OW;
    for (long i = 0; i < PLANES * ni; i++) x[i] = draw(special);
    if (dt != LK_F32) { /* the values the kernel sees */
        lk_f32_to_half_n(dt, xh, x, (size_t)(PLANES * ni));
        lk_half_to_f32_n(dt, x, xh, (size_t)(PLANES * ni));
    }
    for (long c = 0; c < PLANES; c++)
        lk_k_max_pool_plane(x + c * ni, H, W, k, k, st, st, pad, pad, OH, OW, yr + c * no, idxr + c * no);
    lk_op_desc d = {.op = LK_OP_POOL2D, .dtype = {dt, dt, LK_I32}};
    d.pool = (lk_pool_params){LK_POOL_MAX, PLANES, H, W, OH, OW, k, k, st, st, pad, pad, false};
    void *xo = dt == LK_F32 ? (void *)x : xh, *yo = dt == LK_F32 ? (void *)y : yh;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){xo, yo, idx}));
    if (dt != LK_F32) lk_half_to_f32_n(dt, y, yh, (size_t)(PLANES * no)); /* a maximum is one of the inputs: exact */
    int bad = bits_differ(y, yr, PLANES * no) || memcmp(idx, idxr, (size_t)(PLANES * no) * sizeof(int));
    if (bad)
        printf("  %s %ldx%ld k%ld s%ld p%ld%s: differs from the plane kernel\n", lk_dtype_name(dt), H, W, k, st, pad,
               special ? " with NaNs" : "");
    CHECK(!bad);
}

static void max_pool_matches_plane_kernel(void) {
    static const long sizes[][2] = {{2, 2}, {3, 3}, {4, 6}, {7, 5}, {14, 14}, {28, 28}, {29, 27}, {1, 8},
                                     {4, 70}, {5, 65}, {2, 64}, {3, 33}}; /* rows of 16+ windows, and tails */
    int cases = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int special = 0; special < 2; special++)
            for (int dt = 0; dt < 2; dt++) {
                lk_dtype t = dt ? LK_BF16 : LK_F32;
                if (sizes[i][0] >= 2 && sizes[i][1] >= 2) check(t, sizes[i][0], sizes[i][1], 2, 2, 0, special), cases++;
                if (sizes[i][0] >= 2 && sizes[i][1] >= 2) check(t, sizes[i][0], sizes[i][1], 3, 2, 1, special), cases++;
            }
    printf("%d max-pool cases (2x2/2 fast path and 3x3/2 padded) match the plane kernel\n", cases);
    CHECK(cases >= 88);
}

/* An input of a megabyte or more is cut across the compute threads by
 * planes, forward and backward, and its 16-bit form widened in L2-sized
 * chunks: the same values, indices and input gradients as the plane
 * kernels one plane after another. */
static void large_input_cut_by_planes(void) {
    enum { P = 400, H = 28, W = 28, OH = 14, OW = 14 }; /* 313,600 inputs: over the 2^18 threshold */
    size_t ni = (size_t)P * H * W, no = (size_t)P * OH * OW;
    float *xl = malloc(ni * 4), *yl = malloc(no * 4), *yrl = malloc(no * 4), *dy = malloc(no * 4),
          *dx = malloc(ni * 4), *dxr = malloc(ni * 4);
    int *il = malloc(no * sizeof(int)), *irl = malloc(no * sizeof(int));
    uint16_t *xhl = malloc(ni * 2), *yhl = malloc(no * 2), *dyh = malloc(no * 2), *dxh = malloc(ni * 2);
    CHECK(xl && yl && yrl && dy && dx && dxr && il && irl && xhl && yhl && dyh && dxh);
    for (int dt = 0; dt < 2; dt++) {
        lk_dtype t = dt ? LK_BF16 : LK_F32;
        for (size_t i = 0; i < ni; i++) xl[i] = draw(1);
        for (size_t i = 0; i < no; i++) dy[i] = draw(0);
        if (dt) {
            lk_f32_to_half_n(t, xhl, xl, ni), lk_half_to_f32_n(t, xl, xhl, ni);
            lk_f32_to_half_n(t, dyh, dy, no), lk_half_to_f32_n(t, dy, dyh, no);
        }
        memset(dxr, 0, ni * 4);
        for (long c = 0; c < P; c++) {
            lk_k_max_pool_plane(xl + c * H * W, H, W, 2, 2, 2, 2, 0, 0, OH, OW, yrl + c * OH * OW, irl + c * OH * OW);
            lk_k_max_pool_backward_plane(dy + c * OH * OW, irl + c * OH * OW, OH * OW, dxr + c * H * W);
        }
        lk_op_desc f = {.op = LK_OP_POOL2D, .dtype = {t, t, LK_I32}};
        f.pool = (lk_pool_params){LK_POOL_MAX, P, H, W, OH, OW, 2, 2, 2, 2, 0, 0, false};
        CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &f, (void *[]){dt ? (void *)xhl : xl, dt ? (void *)yhl : yl, il}));
        if (dt) lk_half_to_f32_n(t, yl, yhl, no);
        CHECK_MSG(!bits_differ(yl, yrl, (long)no) && !memcmp(il, irl, no * sizeof(int)), "%s forward differs",
                  lk_dtype_name(t));
        lk_op_desc b = {.op = LK_OP_POOL2D_BACKWARD, .dtype = {t, LK_I32, t}};
        b.pool = f.pool;
        memset(dx, 0, ni * 4), memset(dxh, 0, ni * 2);
        CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &b, (void *[]){dt ? (void *)dyh : dy, irl, dt ? (void *)dxh : dx}));
        if (dt) lk_half_to_f32_n(t, dx, dxh, ni); /* each input gets one dy or none: exact */
        CHECK_MSG(!bits_differ(dx, dxr, (long)ni), "%s backward differs", lk_dtype_name(t));
    }
    free(xl), free(yl), free(yrl), free(dy), free(dx), free(dxr), free(il), free(irl);
    free(xhl), free(yhl), free(dyh), free(dxh);
}

LK_TEST_MAIN(LK_TEST_CASE(max_pool_matches_plane_kernel), LK_TEST_CASE(large_input_cut_by_planes))

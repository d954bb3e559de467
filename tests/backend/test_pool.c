/* The CPU backend's max pooling (LK_OP_POOL2D) against the plane kernel of
 * kernels/conv.h, bit for bit, values and indices: the 2x2 stride-2 fast
 * path over even and odd plane sizes (the last row or column left out),
 * values drawn from a few levels so windows tie, with +-0, +-inf and NaNs
 * (first maximum wins, the last NaN wins), in f32 and through bf16; and a
 * 3x3 stride-2 padded pool, which takes the plane kernel. */
#include <math.h>
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

LK_TEST_MAIN(LK_TEST_CASE(max_pool_matches_plane_kernel))

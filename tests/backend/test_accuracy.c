/* LK_OP_ACCURACY on the CPU backend against a plain loop (the definition
 * every backend's count must reproduce: argmax by strict '>' from
 * class 0, so ties keep the earlier class and NaN never wins a comparison):
 * logits drawn from a few levels so that ties are common, rows with NaN
 * first, in the middle and everywhere, -inf and +inf, one class, no rows;
 * targets i64, i32 and u8; bf16 and f16 logits against the loop over their
 * exactly widened values. The kernel's own 16-bit widening is checked
 * against the library's over all 65,536 bit patterns. */
#include <math.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/kernels.h"
#include "lk_test.h"

enum { ROWS = 203, MAXC = 13 };
static float xs[ROWS * MAXC];
static uint16_t hs[ROWS * MAXC];
static int64_t t64[ROWS];
static int32_t t32[ROWS];
static uint8_t t8[ROWS];

/* The definition, as the trainer's host loop counted before the op (and
 * torch's argmax on the first maximum): on f32 values. */
static int64_t host_hits(const float *l, int64_t n, int64_t c, const int64_t *y) {
    int64_t hit = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t arg = 0;
        for (int64_t k = 1; k < c; k++)
            if (l[i * c + k] > l[i * c + arg]) arg = k;
        hit += arg == y[i];
    }
    return hit;
}

static double run(lk_dtype xt, const void *x, lk_dtype tt, const void *t, int64_t n, int64_t c) {
    lk_op_desc d = {.op = LK_OP_ACCURACY, .dtype = {xt, tt, LK_F64}, .accuracy = {n, c}};
    double hits = -1;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){(void *)x, (void *)t, &hits}));
    return hits;
}

static uint32_t rng = 7;
static uint32_t next(void) { return rng = rng * 1664525u + 1013904223u, rng >> 8; }

static void fill(int64_t c) {
    static const float levels[] = {-2.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f};
    for (int64_t i = 0; i < ROWS * c; i++) xs[i] = levels[next() % 6];
    for (int64_t r = 0; r < ROWS; r++) {
        float *row = xs + r * c;
        switch (r % 9) { /* special rows */
        case 1: row[0] = NAN; break;
        case 2: row[c / 2] = NAN; break;
        case 3: for (int64_t k = 0; k < c; k++) row[k] = NAN; break;
        case 4: row[c - 1] = INFINITY; break;
        case 5: for (int64_t k = 0; k < c; k++) row[k] = -INFINITY; break;
        case 6: for (int64_t k = 0; k < c; k++) row[k] = 1.0f; break; /* all tied: class 0 */
        default: break;
        }
        t64[r] = (int64_t)(next() % (uint32_t)c);
        if (r % 5 == 0) t64[r] = 0; /* class 0 often: the rows with NaN first or all tied predict it */
        t32[r] = (int32_t)t64[r];
        t8[r] = (uint8_t)t64[r];
    }
}

static void against_host_loop(void) {
    static const int64_t cs[] = {1, 2, 4, 10, 13};
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        int64_t c = cs[ci];
        fill(c);
        double want = (double)host_hits(xs, ROWS, c, t64);
        CHECK_MSG(run(LK_F32, xs, LK_I64, t64, ROWS, c) == want, "C=%lld f32/i64: %g, host %g", (long long)c,
                  run(LK_F32, xs, LK_I64, t64, ROWS, c), want);
        CHECK(run(LK_F32, xs, LK_I32, t32, ROWS, c) == want);
        CHECK(run(LK_F32, xs, LK_U8, t8, ROWS, c) == want);
        CHECK(c == 1 || (want > 0 && want < ROWS)); /* the data tell a right count from a wrong one */
        for (int h = 0; h < 2; h++) { /* 16-bit logits: the loop over their widened values */
            lk_dtype dt = h ? LK_F16 : LK_BF16;
            static float w[ROWS * MAXC];
            lk_f32_to_half_n(dt, hs, xs, (size_t)(ROWS * c));
            lk_half_to_f32_n(dt, w, hs, (size_t)(ROWS * c));
            double want16 = (double)host_hits(w, ROWS, c, t64);
            CHECK_MSG(run(dt, hs, LK_I64, t64, ROWS, c) == want16, "C=%lld %s: %g, host %g", (long long)c,
                      lk_dtype_name(dt), run(dt, hs, LK_I64, t64, ROWS, c), want16);
        }
    }
    CHECK(run(LK_F32, xs, LK_I64, t64, 0, 4) == 0); /* no rows: 0, written */
    /* the tie and NaN rules in one small case each: [1, 3, 3] -> 1; [nan, 5] -> 0; [1, nan, 2] -> 2 */
    float tie[] = {1, 3, 3}, nan0[] = {NAN, 5}, nan1[] = {1, NAN, 2};
    CHECK(run(LK_F32, tie, LK_I64, (int64_t[]){1}, 1, 3) == 1 && run(LK_F32, tie, LK_I64, (int64_t[]){2}, 1, 3) == 0);
    CHECK(run(LK_F32, nan0, LK_I64, (int64_t[]){0}, 1, 2) == 1);
    CHECK(run(LK_F32, nan1, LK_I64, (int64_t[]){2}, 1, 3) == 1);
    lk_op_desc bad = {.op = LK_OP_ACCURACY, .dtype = {LK_F32, LK_F32, LK_F64}, .accuracy = {1, 3}};
    double out;
    CHECK_ERR(lk__backend_run(LK_DEVICE_CPU, &bad, (void *[]){tie, tie, &out}), LK_STATUS_UNSUPPORTED,
              "accuracy f32, target f32 -> f64 (1x3)");
}

static void widening_is_the_librarys(void) {
    int64_t bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t h = (uint16_t)b;
        float kb = lk_k_half_bits_to_f32(h, 1), kf = lk_k_half_bits_to_f32(h, 0);
        float lb = lk_bf16_bits_to_f32(h), lf = lk_f16_bits_to_f32(h);
        bad += isnan(lb) ? !isnan(kb) : memcmp(&kb, &lb, sizeof kb) != 0;
        bad += isnan(lf) ? !isnan(kf) : memcmp(&kf, &lf, sizeof kf) != 0;
    }
    CHECK_MSG(bad == 0, "%lld 16-bit patterns widen differently", (long long)bad);
}

LK_TEST_MAIN(LK_TEST_CASE(against_host_loop), LK_TEST_CASE(widening_is_the_librarys))

/* The reduction kernels every communicator uses (element-wise sum, avg, max,
 * min over n inputs, folded in the fixed order 0..n-1 so results are bitwise
 * reproducible), and the bf16/f16 <-> f32 converters (round to nearest even).
 * Kept private and self-contained so the dist layer does not depend on the
 * tensor implementation, only on the lk_dtype enum. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3") /* the loops below are the hot path of all_reduce; -O2 does not vectorise them */
#endif
#include <math.h>
#include <string.h>

#include "comm/comm_impl.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define LK_HAVE_F16C 1
#endif

size_t lk__dtype_size(lk_dtype dt) {
    switch (dt) {
    case LK_F32: return 4;
    case LK_F64: return 8;
    case LK_BF16: return 2;
    case LK_F16: return 2;
    case LK_I32: return 4;
    case LK_I64: return 8;
    case LK_U8: return 1;
    default: return 0;
    }
}

const char *lk__dtype_name(lk_dtype dt) {
    switch (dt) {
    case LK_F32: return "f32";
    case LK_F64: return "f64";
    case LK_BF16: return "bf16";
    case LK_F16: return "f16";
    case LK_I32: return "i32";
    case LK_I64: return "i64";
    case LK_U8: return "u8";
    default: return "?";
    }
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Branch-free (a select, not a jump, for NaN) so the reduce loops vectorise. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, quiet_nan = (x >> 16) | 0x40u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

float lk__bf16_to_f32(uint16_t h) { return bf16_to_f32(h); }
uint16_t lk__f32_to_bf16(float f) { return f32_to_bf16(f); }

float lk__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0) {
        float f = (float)mant * 0x1p-24f; /* zero or subnormal: exact */
        return sign ? -f : f;
    }
    if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
    else x = sign | ((exp + 112u) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t lk__f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00);
    if (x >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {                      /* below 2^-14: subnormal half or zero */
        float a;
        memcpy(&a, &x, 4);
        return sign | (uint16_t)nearbyintf(a * 0x1p24f); /* default rounding: nearest even */
    }
    x += 0xc8000fffu + ((x >> 13) & 1u); /* rebias exponent by -112 and round to nearest even */
    return sign | (uint16_t)(x >> 13);
}

/* Typed kernels. dst may alias any source at the same index, so each block
 * is accumulated in a private buffer before being written. */
#define BLOCK 512

#define DEF_REDUCE(NAME, T, ACC, LOAD, STORE, DIV)                                               \
    static void NAME(T *dst, const T *const *s, int n, size_t count, lk_reduce_op op, int avg) { \
        ACC acc[BLOCK];                                                                          \
        for (size_t b = 0; b < count; b += BLOCK) {                                              \
            size_t m = count - b < BLOCK ? count - b : BLOCK;                                    \
            const T *s0 = s[0] + b;                                                              \
            for (size_t i = 0; i < m; i++) acc[i] = LOAD(s0[i]);                                 \
            for (int k = 1; k < n; k++) {                                                        \
                const T *sk = s[k] + b;                                                          \
                if (op == LK_REDUCE_MAX) {                                                       \
                    for (size_t i = 0; i < m; i++) {                                             \
                        ACC v = LOAD(sk[i]);                                                     \
                        acc[i] = v > acc[i] ? v : acc[i];                                        \
                    }                                                                            \
                } else if (op == LK_REDUCE_MIN) {                                                \
                    for (size_t i = 0; i < m; i++) {                                             \
                        ACC v = LOAD(sk[i]);                                                     \
                        acc[i] = v < acc[i] ? v : acc[i];                                        \
                    }                                                                            \
                } else {                                                                         \
                    for (size_t i = 0; i < m; i++) acc[i] = (ACC)(acc[i] + LOAD(sk[i]));         \
                }                                                                                \
            }                                                                                    \
            if (op == LK_REDUCE_AVG)                                                             \
                for (size_t i = 0; i < m; i++) acc[i] = DIV(acc[i], avg);                        \
            T *d = dst + b;                                                                      \
            for (size_t i = 0; i < m; i++) d[i] = STORE(acc[i]);                                 \
        }                                                                                        \
    }

#define ID(x) (x)
#define FDIV(a, n) ((a) / (n))
/* Integer sums wrap (two's complement) instead of overflowing into UB. */
#define I64ADD_LOAD(x) ((uint64_t)(x))
static inline int64_t i64_div(uint64_t a, int n) { return (int64_t)a / n; }
#define I64DIV(a, n) ((uint64_t)i64_div((a), (n)))
#define I64STORE(x) ((int64_t)(x))
#define I32STORE(x) ((int32_t)(uint32_t)(x))

DEF_REDUCE(reduce_f32, float, float, ID, ID, FDIV)
DEF_REDUCE(reduce_f64, double, double, ID, ID, FDIV)
DEF_REDUCE(reduce_bf16, uint16_t, float, bf16_to_f32, f32_to_bf16, FDIV)
DEF_REDUCE(reduce_f16_soft, uint16_t, float, lk__f16_to_f32, lk__f32_to_f16, FDIV)
DEF_REDUCE(reduce_i64_sum, int64_t, uint64_t, I64ADD_LOAD, I64STORE, I64DIV)
DEF_REDUCE(reduce_i64_cmp, int64_t, int64_t, ID, ID, FDIV)
DEF_REDUCE(reduce_i32, int32_t, int64_t, ID, I32STORE, FDIV)
DEF_REDUCE(reduce_u8, uint8_t, uint32_t, ID, ID, FDIV)

/* Two f32 inputs summed (scale 1) or averaged (scale 0.5: x * 0.5f is
 * x / 2 exactly, the same bits as the general kernel's division): the case
 * of two ranks, and the bandwidth one. d may be a or b. */
static void sum2_f32(float *d, const float *a, const float *b, size_t n, float scale) {
    if (d == a || d == b) {
        const float *o = d == a ? b : a;
        if (scale == 1.0f)
            for (size_t i = 0; i < n; i++) d[i] += o[i];
        else
            for (size_t i = 0; i < n; i++) d[i] = (d[i] + o[i]) * scale;
        return;
    }
    for (size_t i = 0; i < n; i++) d[i] = (a[i] + b[i]) * scale;
}

#ifdef LK_HAVE_F16C
static void reduce_f16(uint16_t *dst, const uint16_t *const *s, int n, size_t count, lk_reduce_op op, int avg) {
    size_t vec = count & ~(size_t)7;
    for (size_t i = 0; i < vec; i += 8) {
        __m256 acc = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s[0] + i)));
        for (int k = 1; k < n; k++) {
            __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s[k] + i)));
            if (op == LK_REDUCE_MAX) acc = _mm256_max_ps(v, acc); /* v > acc ? v : acc */
            else if (op == LK_REDUCE_MIN) acc = _mm256_min_ps(v, acc);
            else acc = _mm256_add_ps(acc, v);
        }
        if (op == LK_REDUCE_AVG) acc = _mm256_div_ps(acc, _mm256_set1_ps((float)avg));
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(acc, _MM_FROUND_TO_NEAREST_INT));
    }
    if (vec < count) {
        const uint16_t *tail[64];
        const uint16_t **t = n <= 64 ? tail : NULL;
        if (t) {
            for (int k = 0; k < n; k++) t[k] = s[k] + vec;
            reduce_f16_soft(dst + vec, t, n, count - vec, op, avg);
        } else {
            for (size_t i = vec; i < count; i++) { /* rare: more than 64 ranks */
                float acc = lk__f16_to_f32(s[0][i]);
                for (int k = 1; k < n; k++) {
                    float v = lk__f16_to_f32(s[k][i]);
                    acc = op == LK_REDUCE_MAX ? (v > acc ? v : acc) : op == LK_REDUCE_MIN ? (v < acc ? v : acc) : acc + v;
                }
                if (op == LK_REDUCE_AVG) acc /= (float)avg;
                dst[i] = lk__f32_to_f16(acc);
            }
        }
    }
}
#else
#define reduce_f16 reduce_f16_soft
#endif

void lk__reduce(void *dst, const void *const *srcs, int n, size_t count, lk_dtype dt, lk_reduce_op op,
                int avg_div) {
    if (count == 0) return;
    if (avg_div < 1) avg_div = 1;
    switch (dt) {
    case LK_F32:
        if (n == 2 && (op == LK_REDUCE_SUM || (op == LK_REDUCE_AVG && avg_div == 2))) {
            sum2_f32(dst, srcs[0], srcs[1], count, op == LK_REDUCE_SUM ? 1.0f : 0.5f);
            return;
        }
        reduce_f32(dst, (const float *const *)srcs, n, count, op, avg_div);
        return;
    case LK_F64: reduce_f64(dst, (const double *const *)srcs, n, count, op, avg_div); return;
    case LK_BF16: reduce_bf16(dst, (const uint16_t *const *)srcs, n, count, op, avg_div); return;
    case LK_F16: reduce_f16(dst, (const uint16_t *const *)srcs, n, count, op, avg_div); return;
    case LK_I32: reduce_i32(dst, (const int32_t *const *)srcs, n, count, op, avg_div); return;
    case LK_I64:
        if (op == LK_REDUCE_SUM || op == LK_REDUCE_AVG)
            reduce_i64_sum(dst, (const int64_t *const *)srcs, n, count, op, avg_div);
        else reduce_i64_cmp(dst, (const int64_t *const *)srcs, n, count, op, avg_div);
        return;
    case LK_U8: reduce_u8(dst, (const uint8_t *const *)srcs, n, count, op, avg_div); return;
    default: LK_ASSERT(!"unsupported dtype in lk__reduce");
    }
}

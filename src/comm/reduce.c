/* The reduction kernels every communicator uses (element-wise sum, avg, max,
 * min over n inputs, folded in the fixed order 0..n-1 so results are bitwise
 * reproducible). The 16-bit conversions are lockstep/dtype.h's inline ones,
 * the same the tensor layer uses. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3") /* the loops below are the hot path of all_reduce; -O2 does not vectorise them */
#endif
#include <math.h>
#include <string.h>

#include "comm/comm_impl.h"

/* One of the files compiled once per instruction set (backend/isa.h): the
 * F16C path below is in the AVX2 and AVX-512 copies, or in the baseline
 * itself when that has F16C. */
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define LK_HAVE_F16C 1
#endif

static inline float bf16_to_f32(uint16_t h) { return lk_bf16_bits_to_f32(h); }
static inline uint16_t f32_to_bf16(float f) { return lk_f32_to_bf16_bits(f); }

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
DEF_REDUCE(reduce_f16_soft, uint16_t, float, lk_f16_bits_to_f32, lk_f32_to_f16_bits, FDIV)
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
                float acc = lk_f16_bits_to_f32(s[0][i]);
                for (int k = 1; k < n; k++) {
                    float v = lk_f16_bits_to_f32(s[k][i]);
                    acc = op == LK_REDUCE_MAX ? (v > acc ? v : acc) : op == LK_REDUCE_MIN ? (v < acc ? v : acc) : acc + v;
                }
                if (op == LK_REDUCE_AVG) acc /= (float)avg;
                dst[i] = lk_f32_to_f16_bits(acc);
            }
        }
    }
}
#else
#define reduce_f16 reduce_f16_soft
#endif

void LK_ISA(lk__reduce_run)(void *dst, const void *const *srcs, int n, size_t count, lk_dtype dt, lk_reduce_op op,
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

#if !LK_ISA_VARIANT
void lk__reduce(void *dst, const void *const *srcs, int n, size_t count, lk_dtype dt, lk_reduce_op op,
                int avg_div) {
    LK_ISA_PICK(lk__reduce_run)(dst, srcs, n, count, dt, op, avg_div);
}

void lk__reduce_divide(void *buf, size_t count, lk_dtype dt, int w) {
    const void *src[1] = {buf};
    lk__reduce(buf, src, 1, count, dt, LK_REDUCE_AVG, w);
}
#endif

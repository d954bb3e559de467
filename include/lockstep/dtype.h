/* lockstep/dtype.h — the one dtype table of the library, and the 16-bit
 * float conversions every layer uses (tensors, collectives, kernels).
 *
 * A new dtype is one X(...) row here plus the kernels that support it (the
 * backends' supports() says which). The conversions round to nearest even,
 * keep NaN a (quiet) NaN and are branch-free where that lets loops vectorise;
 * they are static inline so the reduction and cast loops can use them
 * element by element. */
#ifndef LOCKSTEP_DTYPE_H
#define LOCKSTEP_DTYPE_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "lockstep/core.h"

/* The most dimensions a tensor has (here, below the tensor layer, since the
 * backend's op descriptors are sized by it). */
#define LK_MAX_DIMS 8

#ifdef __cplusplus
extern "C" {
#endif

/* name, string, bytes, C type */
#define LK_DTYPE_LIST(X)           \
    X(F32, "f32", 4, float)        \
    X(F64, "f64", 8, double)       \
    X(BF16, "bf16", 2, uint16_t)   \
    X(F16, "f16", 2, uint16_t)     \
    X(I32, "i32", 4, int32_t)      \
    X(I64, "i64", 8, int64_t)      \
    X(U8, "u8", 1, uint8_t)

typedef enum {
#define LK__DTYPE_ENUM(name, str, size, ctype) LK_##name,
    LK_DTYPE_LIST(LK__DTYPE_ENUM)
#undef LK__DTYPE_ENUM
    LK_DTYPE_COUNT
} lk_dtype;

size_t lk_dtype_size(lk_dtype dt); /* 0 for a value outside the table */
const char *lk_dtype_name(lk_dtype dt); /* "?" for a value outside the table */
/* Parses "f32", "float32", "bf16", ... Returns INVALID_ARGUMENT naming the input. */
lk_status lk_dtype_parse(const char *s, lk_dtype *out);
bool lk_dtype_is_float(lk_dtype dt);

/* ---- 16-bit floats -------------------------------------------------------- */

static inline float lk_bf16_bits_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Branch-free: NaN is a select (kept quiet), so loops over it vectorise. */
static inline uint16_t lk_f32_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

static inline float lk_f16_bits_to_f32(uint16_t h) {
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

static inline uint16_t lk_f32_to_f16_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds to inf */
    if (x < 0x38800000u) {                                   /* below 2^-14: subnormal half or zero */
        float a;
        memcpy(&a, &x, 4);
        return (uint16_t)(sign | (uint16_t)nearbyintf(a * 0x1p24f)); /* default rounding: nearest even */
    }
    x += 0xc8000fffu + ((x >> 13) & 1u); /* rebias the exponent by -112 and round to nearest even */
    return (uint16_t)(sign | (uint16_t)(x >> 13));
}

/* Scalar conversions (round to nearest even; NaN stays NaN; src/core/dtype.c). */
uint16_t lk_f32_to_bf16(float f);
float lk_bf16_to_f32(uint16_t h);
uint16_t lk_f32_to_f16(float f);
float lk_f16_to_f32(uint16_t h);
/* The same over n values, vectorised (dt is LK_BF16 or LK_F16); bitwise
 * equal to the scalar conversions except for NaN payloads (still NaN).
 * Defined by the CPU backend (src/backend/cpu/convert.c: the copy for this
 * CPU's instruction set), so a core file may not call them. */
void lk_f32_to_half_n(lk_dtype dt, uint16_t *dst, const float *src, size_t n);
void lk_half_to_f32_n(lk_dtype dt, float *dst, const uint16_t *src, size_t n);

/* How a loss folds its per-element values (torch's `reduction`): used by the
 * losses of lockstep/autograd.h and carried in the backend's loss
 * descriptors, so it sits here, below both (the backend sits below the
 * tensor layer: docs/layers.txt). */
typedef enum { LK_REDUCTION_MEAN, LK_REDUCTION_SUM, LK_REDUCTION_NONE } lk_reduction;

#ifdef __cplusplus
}
#endif
#endif

/* The bulk 16-bit conversions every bf16/f16 path goes through (the public
 * lk_f32_to_half_n and lk_half_to_f32_n at the end of this file call the
 * copy for this CPU), and bf16x3's split of f16 values into bf16 parts (../cpu_lowp.c).
 * One of the files compiled once per instruction set (backend/isa.h): the
 * scalar loops below vectorise at each level, and the AVX-512 copy adds the
 * hand-written paths under `#ifdef __AVX512F__`, the F16C one those under
 * __F16C__; each gives the scalar loop's bits. */
#include <float.h>
#include <math.h>
#include <string.h>
#if defined(__AVX512F__) || (defined(__F16C__) && defined(__AVX__))
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_impl.h"
#include "lockstep/dtype.h"

#ifdef __AVX512F__
/* lk_f32_to_bf16_bits on 16 floats' bits at once (nearest even, a NaN kept
 * quiet), each result in its lane's low 16 bits: the bulk rounding and
 * bf16x3's split share it. GCC vectorises the scalar function into code
 * about 3x slower. */
static inline __m512i bf16_round16(__m512i u) {
    __m512i top = _mm512_srli_epi32(u, 16), odd = _mm512_and_si512(top, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(top, _mm512_set1_epi32(0x40)));
}
#endif

/* Branch-free loops the compiler vectorises (bf16), or the F16C
 * instructions (f16), which round to nearest even as the scalar code does. */
void LK_ISA(lk__cpu_f32_to_half_n)(lk_dtype dt, uint16_t *dst, const float *src, size_t n) {
    size_t i = 0;
    if (dt == LK_BF16) {
#ifdef __AVX512F__
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(bf16_round16(_mm512_loadu_si512(src + i))));
#endif
        for (; i < n; i++) dst[i] = lk_f32_to_bf16_bits(src[i]);
        return;
    }
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = lk_f32_to_f16_bits(src[i]);
}

void LK_ISA(lk__cpu_half_to_f32_n)(lk_dtype dt, float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    if (dt == LK_BF16) {
        for (; i < n; i++) {
            uint32_t u = (uint32_t)src[i] << 16;
            memcpy(&dst[i], &u, 4);
        }
        return;
    }
#ifdef __AVX512F__
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
#endif
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = lk_f16_bits_to_f32(src[i]);
}

/* n f16 values into their bf16 parts: hi[k] + lo[k] == src[k] exactly;
 * hi is written twice (A' and B' hold it in two blocks): to hi, and to hi2,
 * the copy multiplied by the other operand's lo, as 0 when it is inf or
 * NaN. So an inf meets only the other side's hi, as the f32 GEMM's product
 * would: inf x 1 stays inf instead of gaining the NaN of inf x lo(1) = inf x 0. */
void LK_ISA(lk__cpu_split_f16)(const uint16_t *src, uint16_t *hi, uint16_t *hi2, uint16_t *lo, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512F__
    /* lo's bf16 is the top half of the exact f32 difference */
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    for (; i + 16 <= n; i += 16) {
        __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i)));
        __m512i r = bf16_round16(_mm512_castps_si512(f));
        __mmask16 finite = _mm512_cmplt_epu32_mask(_mm512_and_si512(_mm512_castps_si512(f), abs), inf);
        __m512 d = _mm512_maskz_sub_ps(finite, f, _mm512_castsi512_ps(_mm512_slli_epi32(r, 16)));
        _mm256_storeu_si256((__m256i *)(hi + i), _mm512_cvtepi32_epi16(r));
        _mm256_storeu_si256((__m256i *)(hi2 + i), _mm512_cvtepi32_epi16(_mm512_maskz_mov_epi32(finite, r)));
        _mm256_storeu_si256((__m256i *)(lo + i),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(d), 16)));
    }
#endif
    for (; i < n; i++) {
        float f = lk_f16_bits_to_f32(src[i]);
        uint16_t h = lk_f32_to_bf16_bits(f);
        bool finite = fabsf(f) <= FLT_MAX;
        hi[i] = h;
        hi2[i] = finite ? h : 0;
        lo[i] = lk_f32_to_bf16_bits(finite ? f - lk_bf16_bits_to_f32(h) : 0.0f); /* exact */
    }
}

#if !LK_ISA_VARIANT
/* The public bulk conversions (lockstep/dtype.h): the copy for this CPU.
 * Defined here, in the backend, rather than in the tensor layer above it,
 * since the backend's own kernels call them. */
void lk_f32_to_half_n(lk_dtype dt, uint16_t *dst, const float *src, size_t n) {
    LK_ISA_PICK(lk__cpu_f32_to_half_n)(dt, dst, src, n);
}

void lk_half_to_f32_n(lk_dtype dt, float *dst, const uint16_t *src, size_t n) {
    LK_ISA_PICK(lk__cpu_half_to_f32_n)(dt, dst, src, n);
}
#endif

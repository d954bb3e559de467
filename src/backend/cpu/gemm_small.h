/* Private to the CPU backend: lockstep's own small-shape f32 GEMM
 * (gemm_small.c, one copy per instruction set) and the rule that routes a
 * GEMM to it or to OpenBLAS (gemm.c). */
#ifndef LK_BACKEND_CPU_GEMM_SMALL_H
#define LK_BACKEND_CPU_GEMM_SMALL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/isa.h"

/* C = alpha op(A) op(B) + beta C (row-major, f32) on the calling thread,
 * each C element one fused multiply-add chain over k in order, so its bits
 * depend on neither the instruction set nor a cut of M or N. False (C
 * untouched) only when its per-thread panel (K x 32 floats) cannot be
 * allocated. Call the copy for this CPU: LK_ISA_PICK(lk__sgemm_own)(...),
 * or LK_ISA(lk__sgemm_own) from a file compiled per instruction set. */
LK_ISA_DECLARE(bool, lk__sgemm_own, (bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                                     int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc));

/* Triangular shapes (causal attention's tiles), with off an offset:
 * C_LOWER: only C[i][j] for j <= i + off is wanted (tiles wholly above are
 * not written; elements above in a tile that straddles may be); A_LOWER:
 * op(A)[i][k] is zero for k > i + off; A_UPPER: op(A)[i][k] is zero for
 * k < i + off. The zeros must be there (a tile's rows share one range of
 * k, so some are read); with finite operands the result is the full GEMM's
 * bits. */
typedef enum { LK__TRI_NONE, LK__TRI_C_LOWER, LK__TRI_A_LOWER, LK__TRI_A_UPPER } lk__gemm_tri;
LK_ISA_DECLARE(bool, lk__sgemm_own_tri, (bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                                         lk__gemm_tri tri, int64_t off));

/* The copy for this CPU (lk__cpu_isa()), from the baseline files and tests. */
bool lk__cpu_sgemm_own(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
bool lk__cpu_sgemm_own_tri(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc, lk__gemm_tri tri, int64_t off);

/* Which GEMM runs a single-threaded piece: LK_GEMM=auto (the shape rule
 * of lk__cpu_gemm_own_shape), own (every f32 GEMM of the CPU backend's
 * OpenBLAS path and attention's tiles), blas (none). Read once; the setter
 * is for tests and benchmarks ((lk__gemm_mode)-1: read LK_GEMM again). */
typedef enum { LK__GEMM_AUTO = 0, LK__GEMM_OWN = 1, LK__GEMM_BLAS = 2 } lk__gemm_mode;
lk__gemm_mode lk__cpu_gemm_mode(void);
void lk__cpu_gemm_set_mode(lk__gemm_mode mode);
/* The fixed rule of LK_GEMM=auto (gemm.c says where it comes from), for
 * this CPU's level (lk__cpu_gemm_rule_level: cpuid's, never lowered by
 * LK_CPU_ISA); _rule: for a given level (AVX-512, or anything below). */
bool lk__cpu_gemm_own_shape(bool ta, bool tb, int64_t M, int64_t N, int64_t K);
bool lk__cpu_gemm_own_rule(lk_isa_level isa, bool ta, bool tb, int64_t M, int64_t N, int64_t K);
lk_isa_level lk__cpu_gemm_rule_level(void);
/* Whether the GEMM of that shape runs on lockstep's own kernel under the mode. */
static inline bool lk__cpu_gemm_own(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
    lk__gemm_mode m = lk__cpu_gemm_mode();
    return m == LK__GEMM_OWN || (m == LK__GEMM_AUTO && lk__cpu_gemm_own_shape(ta, tb, M, N, K));
}

#endif

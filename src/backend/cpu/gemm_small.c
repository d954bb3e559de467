/* lockstep's own f32 GEMM for the small shapes where OpenBLAS is weak (a
 * GPT's attention tiles, 64 x 64 x 32, and its linears at a few hundred to
 * a thousand token rows): C = alpha op(A) op(B) + beta C, row-major, any of
 * the four transposes, on the calling thread.
 *
 * Shape of the work: op(B) is packed in panels of NR columns (K x NR
 * floats, zero-padded past N), all of them when they fit in L2 (then blocks
 * of op(A)'s rows that fit in L1 meet every panel in turn, so A comes from
 * memory once), else one at a time against all of A; op(A) is never packed,
 * a register-blocked micro-kernel broadcasts its elements straight from
 * memory (MR row pointers advancing by 1, or one pointer advancing by lda
 * when A is transposed). MR x NR accumulators live in registers: 6 x 16 in
 * 12 ymm (AVX2 + FMA), 6 x 32 in 12 zmm (AVX-512), 6 x 16 in an array in
 * the plain C copy below them. The copies are the same source compiled per
 * instruction set (LK_ISA_SOURCES, backend/isa.h) and picked by cpuid.
 *
 * The bits: every C element is one fused multiply-add chain over k = 0,
 * 1, ..., K - 1 from +0 (never split over K, never reassociated), then
 * t = alpha acc and C = beta == 0 ? t : fma(beta, C, t). That does not
 * depend on the tile shape, the copy (the plain C one uses fmaf, exact on
 * any CPU), nor where a caller cuts M or N across threads, so the result is
 * the same at every thread count and instruction-set level. beta == 0 never
 * reads C (BLAS's rule: C may hold NaN).
 *
 * Causal attention's tiles are triangular (gemm_small.h, lk__gemm_tri):
 * the scores above the diagonal are never used, and the probabilities there
 * are zeros. The kernel skips those tiles and those k: a product that is an
 * exact zero adds nothing to a chain that starts at +0 (x + 0 = x, and +0 +
 * -0 = +0), so with finite operands the skipped form gives the full one's
 * bits. */
#include <math.h>

#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/gemm_small.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define MR 6
#if defined(__AVX512F__)
#define NR 32
#else
#define NR 16
#endif

/* The panel: op(B)[k][j0 + c] at bp[k NR + c], c < nc, zero beyond.
 * Pure data movement, so the vector forms below change no result. */
static void pack_b(bool tb, int64_t K, const float *B, int64_t ldb, int64_t j0, int64_t nc, float *bp) {
    int64_t k = 0;
#if defined(__AVX2__)
    if (nc == NR && !tb) { /* rows of 16 or 32 floats: vector copies (memcpy's rep movs was slow here) */
        for (; k < K; k++)
            for (int h = 0; h < NR; h += 8) _mm256_storeu_ps(bp + k * NR + h, _mm256_loadu_ps(B + k * ldb + j0 + h));
        return;
    }
    if (nc == NR) /* B^T: 8 x 8 blocks transposed in registers */
        for (; k + 8 <= K; k += 8)
            for (int g = 0; g < NR; g += 8) {
                const float *src = B + (j0 + g) * ldb + k;
                __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + ldb), r2 = _mm256_loadu_ps(src + 2 * ldb),
                       r3 = _mm256_loadu_ps(src + 3 * ldb), r4 = _mm256_loadu_ps(src + 4 * ldb),
                       r5 = _mm256_loadu_ps(src + 5 * ldb), r6 = _mm256_loadu_ps(src + 6 * ldb),
                       r7 = _mm256_loadu_ps(src + 7 * ldb);
                __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                       t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                       t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
                __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                       u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                       u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                       u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
                float *dst = bp + k * NR + g;
                _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
                _mm256_storeu_ps(dst + NR, _mm256_permute2f128_ps(u1, u5, 0x20));
                _mm256_storeu_ps(dst + 2 * NR, _mm256_permute2f128_ps(u2, u6, 0x20));
                _mm256_storeu_ps(dst + 3 * NR, _mm256_permute2f128_ps(u3, u7, 0x20));
                _mm256_storeu_ps(dst + 4 * NR, _mm256_permute2f128_ps(u0, u4, 0x31));
                _mm256_storeu_ps(dst + 5 * NR, _mm256_permute2f128_ps(u1, u5, 0x31));
                _mm256_storeu_ps(dst + 6 * NR, _mm256_permute2f128_ps(u2, u6, 0x31));
                _mm256_storeu_ps(dst + 7 * NR, _mm256_permute2f128_ps(u3, u7, 0x31));
            }
#endif
    for (; k < K; k++) {
        float *dst = bp + k * NR;
        for (int64_t c = 0; c < nc; c++) dst[c] = tb ? B[(j0 + c) * ldb + k] : B[k * ldb + j0 + c];
        for (int64_t c = nc; c < NR; c++) dst[c] = 0.0f;
    }
}

/* C's m x n corner (m <= MR, n <= NR) from the accumulators acc[r NR + c]. */
static void store_edge(const float *acc, int64_t m, int64_t n, float alpha, float beta, float *C, int64_t ldc) {
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c < n; c++) {
            float t = alpha * acc[r * NR + c];
            C[r * ldc + c] = beta == 0.0f ? t : fmaf(beta, C[r * ldc + c], t);
        }
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))

#if defined(__AVX512F__)
typedef __m512 vec;
#define VW 16
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vfma _mm512_fmadd_ps
#define vmul _mm512_mul_ps
#else
typedef __m256 vec;
#define VW 8
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vfma _mm256_fmadd_ps
#define vmul _mm256_mul_ps
#endif

/* One MR x NR tile: a[r] is op(A)'s row r at k = 0, advancing by ka per k;
 * rows past m repeat row 0 (computed, never stored). */
static void tile(int64_t K, const float *const a[MR], int64_t ka, const float *bp, int64_t m, int64_t n, float alpha,
                 float beta, float *C, int64_t ldc) {
    vec c00 = vzero(), c01 = vzero(), c10 = vzero(), c11 = vzero(), c20 = vzero(), c21 = vzero();
    vec c30 = vzero(), c31 = vzero(), c40 = vzero(), c41 = vzero(), c50 = vzero(), c51 = vzero();
    const float *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *a4 = a[4], *a5 = a[5];
    for (int64_t k = 0; k < K; k++) {
        vec b0 = vload(bp), b1 = vload(bp + VW), t;
        bp += NR;
        t = vset1(*a0);
        c00 = vfma(t, b0, c00), c01 = vfma(t, b1, c01);
        t = vset1(*a1);
        c10 = vfma(t, b0, c10), c11 = vfma(t, b1, c11);
        t = vset1(*a2);
        c20 = vfma(t, b0, c20), c21 = vfma(t, b1, c21);
        t = vset1(*a3);
        c30 = vfma(t, b0, c30), c31 = vfma(t, b1, c31);
        t = vset1(*a4);
        c40 = vfma(t, b0, c40), c41 = vfma(t, b1, c41);
        t = vset1(*a5);
        c50 = vfma(t, b0, c50), c51 = vfma(t, b1, c51);
        a0 += ka, a1 += ka, a2 += ka, a3 += ka, a4 += ka, a5 += ka;
    }
    vec acc[2 * MR] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
    if (m == MR && n == NR) {
        vec va = vset1(alpha), vb = vset1(beta);
        for (int r = 0; r < MR; r++)
            for (int h = 0; h < 2; h++) {
                float *p = C + r * ldc + h * VW;
                vec t = vmul(va, acc[2 * r + h]);
                vstore(p, beta == 0.0f ? t : vfma(vb, vload(p), t));
            }
        return;
    }
    float buf[MR * NR];
    for (int r = 0; r < MR; r++) {
        vstore(buf + r * NR, acc[2 * r]);
        vstore(buf + r * NR + VW, acc[2 * r + 1]);
    }
    store_edge(buf, m, n, alpha, beta, C, ldc);
}

#else /* the plain C copy: the same chains through fmaf */

static void tile(int64_t K, const float *const a[MR], int64_t ka, const float *bp, int64_t m, int64_t n, float alpha,
                 float beta, float *C, int64_t ldc) {
    float acc[MR * NR] = {0};
    for (int64_t k = 0; k < K; k++, bp += NR)
        for (int r = 0; r < MR; r++) {
            float x = a[r][k * ka];
            for (int c = 0; c < NR; c++) acc[r * NR + c] = fmaf(x, bp[c], acc[r * NR + c]);
        }
    store_edge(acc, m, n, alpha, beta, C, ldc);
}

#endif

/* The rows [i0, i0 + m) of op(A) need k in [*k0, *k1) only, under tri. */
static void k_range(lk__gemm_tri tri, int64_t off, int64_t i0, int64_t m, int64_t K, int64_t *k0, int64_t *k1) {
    *k0 = 0, *k1 = K;
    if (tri == LK__TRI_A_LOWER) { /* op(A)[i][k] = 0 for k > i + off */
        int64_t e = i0 + m + off;
        *k1 = e < 0 ? 0 : e < K ? e : K;
    } else if (tri == LK__TRI_A_UPPER) { /* op(A)[i][k] = 0 for k < i + off */
        int64_t b = i0 + off;
        *k0 = b < 0 ? 0 : b < K ? b : K;
    }
}

/* The tiles of rows [i0, i1) against the packed panels [jp0, jp1) (panel jp
 * at bps + jp K NR). */
static void tiles(int64_t i0, int64_t i1, int64_t jp0, int64_t jp1, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t abase, int64_t ia, int64_t ka, const float *bps, float beta, float *C,
                  int64_t ldc, lk__gemm_tri tri, int64_t off) {
    for (int64_t jp = jp0; jp < jp1; jp++) {
        int64_t j0 = jp * NR, n = N - j0 < NR ? N - j0 : NR;
        const float *bp = bps + (jp - jp0) * K * NR;
        for (int64_t r0 = i0; r0 < i1; r0 += MR) {
            int64_t m = M - r0 < MR ? M - r0 : MR, k0, k1;
            /* C[i][j] for j > i + off is not needed: a tile wholly there is skipped */
            if (tri == LK__TRI_C_LOWER && j0 > r0 + m - 1 + off) continue;
            k_range(tri, off, r0, m, K, &k0, &k1);
            const float *a[MR];
            for (int r = 0; r < MR; r++) a[r] = A + (r0 - abase + (r < m ? r : 0)) * ia + k0 * ka;
            tile(k1 - k0, a, ka, bp + k0 * NR, m, n, alpha, beta, C + r0 * ldc + j0, ldc);
        }
    }
}

/* op(B) packed whole when it takes at most this (it then sits in L2 while
 * blocks of op(A)'s rows, MC x K, stay in L1 and meet every panel: A is
 * read from memory once); else one panel at a time against all of A. */
#define PACK_ALL_BYTES (512 * 1024)
#define A_BLOCK_BYTES (16 * 1024)

bool LK_ISA(lk__sgemm_own_tri)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                               lk__gemm_tri tri, int64_t off) {
    if (M <= 0 || N <= 0) return true;
    int64_t panels = (N + NR - 1) / NR, Kp = K > 0 ? K : 1;
    bool all = (size_t)Kp * (size_t)(panels * NR) * sizeof(float) <= PACK_ALL_BYTES;
    size_t floats = (size_t)Kp * (all ? (size_t)(panels * NR) + (ta && K >= 256 ? MR : 0) : NR);
    float *bp = lk__cpu_scratch_for(LK__SCRATCH_OWN_GEMM, floats * sizeof(float));
    if (!bp) return false;
    /* op(A)[i][k] = ta ? A[k lda + i] : A[i lda + k] */
    int64_t ka = ta ? lda : 1, ia = ta ? 1 : lda;
    if (!all) {
        for (int64_t jp = 0; jp < panels; jp++) {
            pack_b(tb, K, B, ldb, jp * NR, N - jp * NR < NR ? N - jp * NR : NR, bp);
            tiles(0, M, jp, jp + 1, M, N, K, alpha, A, 0, ia, ka, bp, beta, C, ldc, tri, off);
        }
        return true;
    }
    for (int64_t jp = 0; jp < panels; jp++)
        pack_b(tb, K, B, ldb, jp * NR, N - jp * NR < NR ? N - jp * NR : NR, bp + jp * Kp * NR);
    bool pack_a = ta && K >= 256;
    if (pack_a) {
        /* op(A)'s rows are A's columns: one MR-row tile at a time, copied
         * into K x MR floats (the whole rows, L1-resident) that meet every
         * panel, instead of a line of A per k from L2/L3 per panel (the
         * weight gradients' long K: 0.66 -> 0.86x OpenBLAS; at attention's
         * K of 64 the copy costs more than it saves) */
        float *ap = bp + (size_t)panels * Kp * NR;
        for (int64_t i0 = 0; i0 < M; i0 += MR) {
            int64_t m = M - i0 < MR ? M - i0 : MR;
            for (int64_t k = 0; k < K; k++)
                for (int64_t r = 0; r < MR; r++) ap[k * MR + r] = A[k * lda + i0 + (r < m ? r : 0)];
            tiles(i0, i0 + m, 0, panels, M, N, K, alpha, ap, i0, 1, MR, bp, beta, C, ldc, tri, off);
        }
        return true;
    }
    int64_t mc = A_BLOCK_BYTES / (Kp * (int64_t)sizeof(float)) / MR * MR;
    if (mc < MR) mc = MR;
    for (int64_t i0 = 0; i0 < M; i0 += mc)
        tiles(i0, i0 + mc < M ? i0 + mc : M, 0, panels, M, N, K, alpha, A, 0, ia, ka, bp, beta, C, ldc, tri, off);
    return true;
}

bool LK_ISA(lk__sgemm_own)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    return LK_ISA(lk__sgemm_own_tri)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, LK__TRI_NONE, 0);
}

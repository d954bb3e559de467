/* lockstep's own f32 GEMM for the small shapes where OpenBLAS is weak (a
 * GPT's attention tiles, 64 x 64 x 32, and its linears at a few hundred to
 * a thousand token rows): C = alpha op(A) op(B) + beta C, row-major, any of
 * the four transposes, on the calling thread.
 *
 * Shape of the work: op(B) is packed in panels of NR columns (K x NR
 * floats, zero-padded past N), all of them when they fit in L2 (then blocks
 * of op(A)'s rows that fit in L1 meet every panel in turn, so A comes from
 * memory once), else one at a time against all of A; op(A) is not packed
 * there, a register-blocked micro-kernel broadcasts its elements straight
 * from memory (MR row pointers advancing by 1, or one pointer advancing by
 * lda when A is transposed). A transposed A with a long K (the weight
 * gradients, dW = X^T dY) takes a blocked form that cuts K into blocks
 * (gemm_ta_blocked below). MR x NR accumulators live in registers: 6 x 16 in
 * 12 ymm (AVX2 + FMA), 6 x 32 in 12 zmm (AVX-512), 6 x 16 in an array in
 * the plain C copy below them. The copies are the same source compiled per
 * instruction set (LK_ISA_SOURCES, backend/isa.h) and picked by cpuid.
 *
 * The bits: every C element is one fused multiply-add chain over k = 0,
 * 1, ..., K - 1 from +0 (never split into partial sums that are added,
 * never reassociated; a cut of K resumes the chain), then
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
                 float beta, float *C, int64_t ldc, const float *pin, float *pout, int64_t ldp) {
    vec c00 = vzero(), c01 = vzero(), c10 = vzero(), c11 = vzero(), c20 = vzero(), c21 = vzero();
    vec c30 = vzero(), c31 = vzero(), c40 = vzero(), c41 = vzero(), c50 = vzero(), c51 = vzero();
    if (pin) { /* the chains so far (an earlier block of k), resumed */
        c00 = vload(pin), c01 = vload(pin + VW), c10 = vload(pin + ldp), c11 = vload(pin + ldp + VW);
        c20 = vload(pin + 2 * ldp), c21 = vload(pin + 2 * ldp + VW), c30 = vload(pin + 3 * ldp);
        c31 = vload(pin + 3 * ldp + VW), c40 = vload(pin + 4 * ldp), c41 = vload(pin + 4 * ldp + VW);
        c50 = vload(pin + 5 * ldp), c51 = vload(pin + 5 * ldp + VW);
    }
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
    if (pout) { /* more blocks of k to come: the chains as they stand, no epilogue */
        for (int r = 0; r < MR; r++) vstore(pout + r * ldp, acc[2 * r]), vstore(pout + r * ldp + VW, acc[2 * r + 1]);
        return;
    }
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
                 float beta, float *C, int64_t ldc, const float *pin, float *pout, int64_t ldp) {
    float acc[MR * NR] = {0};
    for (int r = 0; r < MR && pin; r++)
        for (int c = 0; c < NR; c++) acc[r * NR + c] = pin[r * ldp + c];
    for (int64_t k = 0; k < K; k++, bp += NR)
        for (int r = 0; r < MR; r++) {
            float x = a[r][k * ka];
            for (int c = 0; c < NR; c++) acc[r * NR + c] = fmaf(x, bp[c], acc[r * NR + c]);
        }
    if (pout) {
        for (int r = 0; r < MR; r++)
            for (int c = 0; c < NR; c++) pout[r * ldp + c] = acc[r * NR + c];
        return;
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
                  const float *A, int64_t ia, int64_t ka, const float *bps, float beta, float *C,
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
            for (int r = 0; r < MR; r++) a[r] = A + (r0 + (r < m ? r : 0)) * ia + k0 * ka;
            tile(k1 - k0, a, ka, bp + k0 * NR, m, n, alpha, beta, C + r0 * ldc + j0, ldc, NULL, NULL, 0);
        }
    }
}

/* op(B) packed whole when it takes at most this (it then sits in L2 while
 * blocks of op(A)'s rows, MC x K, stay in L1 and meet every panel: A is
 * read from memory once); else one panel at a time against all of A. */
#define PACK_ALL_BYTES (512 * 1024)
#define A_BLOCK_BYTES (16 * 1024)

/* The weight gradients' shape: op(A) = A^T with a long K (the token rows),
 * dW = X^T dY. A's rows are k, so op(A)'s MR rows at one k are MR floats
 * side by side, but every k is another line of A, and of B: over all of
 * K, the micro-kernel runs from L3. So K is cut into blocks of at most
 * KC_MAX, GotoBLAS's way: a block of op(B), KC x NC (at most
 * PACK_ALL_BYTES, in L2), packed as panels of NR columns; op(A)'s MR rows
 * read in place, their KC lines of A staying in L1 while they meet every
 * panel of the block (packing them too, as KC x MR micro-panels, measured
 * 5-8% slower: the copy, not the reads, was the cost). The cut of K: the
 * chains of a C element cross the blocks through the partial sums (an MC x NC
 * f32 array): a tile of the next block reloads its accumulators from there
 * and resumes the same chain at the next k, and only the last block runs
 * the epilogue into C. Storing an f32 accumulator and loading it back is
 * exact, so each C element is still one FMA chain over k = 0 .. K - 1 in
 * order: the bits of the unblocked kernel, of every copy and of any cut of
 * M or N (the blocking of K depends on K alone). */
#define KC_MAX 256
#define PART_FLOATS (1024 * 1024) /* the partial sums' array, 4 MiB: rows of C at a time */

static bool gemm_ta_blocked(bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                            const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int64_t nkb = (K + KC_MAX - 1) / KC_MAX, kc_max = (K + nkb - 1) / nkb;
    int64_t ncp = PACK_ALL_BYTES / (int64_t)sizeof(float) / kc_max / NR, panels = (N + NR - 1) / NR;
    if (ncp < 1) ncp = 1;
    if (ncp > panels) ncp = panels;
    int64_t ldp = ncp * NR, mc = (M + MR - 1) / MR * MR;
    if (nkb > 1 && mc * ldp > PART_FLOATS) mc = PART_FLOATS / ldp / MR * MR;
    if (mc < MR) mc = MR;
    size_t floats = (size_t)(kc_max * ldp) + (nkb > 1 ? (size_t)(mc * ldp) : 0);
    float *bp = lk__cpu_scratch_for(LK__SCRATCH_OWN_GEMM, floats * sizeof(float));
    if (!bp) return false;
    float *part = bp + kc_max * ldp;
    for (int64_t jc = 0; jc < N; jc += ldp) {
        int64_t nc = N - jc < ldp ? N - jc : ldp, np = (nc + NR - 1) / NR;
        for (int64_t ic = 0; ic < M; ic += mc) {
            int64_t ie = ic + mc < M ? ic + mc : M;
            for (int64_t pc = 0; pc < K; pc += kc_max) {
                int64_t kc = K - pc < kc_max ? K - pc : kc_max;
                bool first = pc == 0, last = pc + kc == K;
                const float *Bk = tb ? B + pc : B + pc * ldb;
                for (int64_t jp = 0; jp < np; jp++)
                    pack_b(tb, kc, Bk, ldb, jc + jp * NR, nc - jp * NR < NR ? nc - jp * NR : NR, bp + jp * kc * NR);
                for (int64_t i0 = ic; i0 < ie; i0 += MR) {
                    int64_t m = M - i0 < MR ? M - i0 : MR;
                    /* op(A)'s MR rows at this block's k: MR floats of a line of A a k, not
                     * copied (a copy cost 5-8%): the block's kc lines stay in L1 across the
                     * panels; rows past m repeat row 0 (computed, never stored) */
                    const float *As = A + pc * lda + i0;
                    const float *a[MR];
                    for (int r = 0; r < MR; r++) a[r] = As + (r < m ? r : 0);
                    for (int64_t jp = 0; jp < np; jp++) {
                        int64_t j0 = jc + jp * NR;
                        float *p = part + (i0 - ic) * ldp + jp * NR;
                        tile(kc, a, lda, bp + jp * kc * NR, m, N - j0 < NR ? N - j0 : NR, alpha, beta, C + i0 * ldc + j0,
                             ldc, first ? NULL : p, last ? NULL : p, ldp);
                    }
                }
            }
        }
    }
    return true;
}

bool LK_ISA(lk__sgemm_own_tri)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                               lk__gemm_tri tri, int64_t off) {
    if (M <= 0 || N <= 0) return true;
    /* at attention's K of 64 the copies of the blocked form cost more than they save */
    if (ta && K >= 256 && tri == LK__TRI_NONE)
        return gemm_ta_blocked(tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    int64_t panels = (N + NR - 1) / NR, Kp = K > 0 ? K : 1;
    bool all = (size_t)Kp * (size_t)(panels * NR) * sizeof(float) <= PACK_ALL_BYTES;
    float *bp = lk__cpu_scratch_for(LK__SCRATCH_OWN_GEMM, (size_t)Kp * (all ? (size_t)(panels * NR) : NR) * sizeof(float));
    if (!bp) return false;
    /* op(A)[i][k] = ta ? A[k lda + i] : A[i lda + k] */
    int64_t ka = ta ? lda : 1, ia = ta ? 1 : lda;
    if (!all) {
        for (int64_t jp = 0; jp < panels; jp++) {
            pack_b(tb, K, B, ldb, jp * NR, N - jp * NR < NR ? N - jp * NR : NR, bp);
            tiles(0, M, jp, jp + 1, M, N, K, alpha, A, ia, ka, bp, beta, C, ldc, tri, off);
        }
        return true;
    }
    for (int64_t jp = 0; jp < panels; jp++)
        pack_b(tb, K, B, ldb, jp * NR, N - jp * NR < NR ? N - jp * NR : NR, bp + jp * Kp * NR);
    int64_t mc = A_BLOCK_BYTES / (Kp * (int64_t)sizeof(float)) / MR * MR;
    if (mc < MR) mc = MR;
    for (int64_t i0 = 0; i0 < M; i0 += mc)
        tiles(i0, i0 + mc < M ? i0 + mc : M, 0, panels, M, N, K, alpha, A, ia, ka, bp, beta, C, ldc, tri, off);
    return true;
}

bool LK_ISA(lk__sgemm_own)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    return LK_ISA(lk__sgemm_own_tri)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, LK__TRI_NONE, 0);
}

/* The CPU backend's f32 GEMM: OpenBLAS with transpose flags (no copies for
 * transposed views), or lockstep's own kernel (gemm_small.c) at the shapes
 * where OpenBLAS is weak, cut across the compute threads by parallel.c. */
#include <cblas.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/gemm_small.h"

static int gemm_mode = -1;

lk__gemm_mode lk__cpu_gemm_mode(void) {
    int m = __atomic_load_n(&gemm_mode, __ATOMIC_RELAXED);
    if (m < 0) {
        const char *v = lk_env_get("LK_GEMM");
        m = LK__GEMM_AUTO;
        if (v && !strcmp(v, "own")) m = LK__GEMM_OWN;
        else if (v && !strcmp(v, "blas")) m = LK__GEMM_BLAS;
        else if (v && *v && strcmp(v, "auto"))
            lk_log_warn("LK_GEMM=%s is none of auto, own, blas: f32 GEMMs take the automatic choice", v);
        __atomic_store_n(&gemm_mode, m, __ATOMIC_RELAXED);
    }
    return (lk__gemm_mode)m;
}

void lk__cpu_gemm_set_mode(lk__gemm_mode mode) { __atomic_store_n(&gemm_mode, (int)mode, __ATOMIC_RELAXED); }

/* LK_GEMM=auto's rule, fixed (never timed at run time, so a machine's runs
 * stay bitwise repeatable) and per instruction-set level of the CPU
 * (cpuid's AVX-512 foundation; not LK_CPU_ISA's lowering, so that running
 * lockstep's loops at a lower level never changes a result, isa.h's
 * promise: the own kernel's copies give the same bits, but it and OpenBLAS
 * do not; ranks on CPUs of different kinds may differ in the last bits, as
 * OpenBLAS's own per-CPU kernels already make them), from `bench/gemm_rate
 * --shapes` (docs/BENCHMARKS.md, "The GPT step"):
 *
 * AVX2 (measured on Zen 3): the GPT's linears at its token rows (M = batch
 * x T >= 512) with a short inner dimension (K <= 512: op(B)'s panel, K x
 * 16 floats, stays in L1/L2) and not a vocabulary-wide N, forward (NT) and
 * input gradient (NN), 1.03-1.24x OpenBLAS; not a few hundred rows (GPT-2
 * at 4 x 64 tokens, the mlp and the autoencoder at their batch of 256).
 *
 * AVX-512 (measured on Zen 4, 6 x 32 tiles): forward and input gradient
 * from 128 rows, 64 columns and 64 deep up to K = 4096, 1.03-1.14x
 * OpenBLAS at every such shape of the small GPT, GPT-2 124M at 4 x 64
 * tokens (its lm_head's forward too, N = 50304), the mlp and the
 * autoencoder at batch 256; not a thin N or K (the mlp's 10 classes:
 * 0.68-0.93x) nor the lm_head's input gradient (K = 50304, 0.98x).
 *
 * The weight gradients (TN, K = the token rows, the blocked form of
 * gemm_small.c): on AVX-512 from K = 256 (to 4096), 64 to 4096 rows and
 * 128 columns, 1.00-1.09x OpenBLAS at the small GPT's, GPT-2 124M's (but
 * its 50304-row lm_head, not measured), the mlp's and the autoencoder's;
 * not on AVX2, where the copy ran GPT-2's at 0.78-0.92x.
 * Attention's tiles take the own kernel whatever their shape
 * (attention.c). The decision is made on the whole GEMM, before any cut
 * across threads. */
bool lk__cpu_gemm_own_rule(lk_isa_level isa, bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
    (void)tb;
    if (ta) return isa >= LK_ISA_AVX512 && K >= 256 && K <= 4096 && M >= 64 && M <= 4096 && N >= 128;
    if (isa >= LK_ISA_AVX512) return M >= 128 && N >= 64 && K >= 64 && K <= 4096;
    return M >= 512 && K <= 512 && N <= 4096;
}

static int rule_level = -1; /* the CPU's, read once: cpuid traps in a VM, and this runs per GEMM */

lk_isa_level lk__cpu_gemm_rule_level(void) {
    int v = __atomic_load_n(&rule_level, __ATOMIC_RELAXED);
    if (v < 0) {
        v = lk__cpu_caps().avx512f ? LK_ISA_AVX512 : LK_ISA_AVX2;
        __atomic_store_n(&rule_level, v, __ATOMIC_RELAXED);
    }
    return (lk_isa_level)v;
}

bool lk__cpu_gemm_own_shape(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
    return lk__cpu_gemm_own_rule(lk__cpu_gemm_rule_level(), ta, tb, M, N, K);
}

bool lk__cpu_sgemm_own(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    return LK_ISA_PICK(lk__sgemm_own)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool lk__cpu_sgemm_own_tri(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc, lk__gemm_tri tri, int64_t off) {
    return LK_ISA_PICK(lk__sgemm_own_tri)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, tri, off);
}

/* One piece on the calling thread, on the kernel chosen for the whole GEMM. */
static void piece(bool own, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (own && lk__cpu_sgemm_own(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    /* else OpenBLAS (also when the own kernel's panel could not be allocated: it needs none of ours) */
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

void lk__cpu_sgemm1(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    piece(lk__cpu_gemm_own(ta, tb, M, N, K), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* A GEMM cut across the compute threads (BLAS itself runs single-threaded,
 * see parallel.c): by output columns when there are enough of them, else by
 * rows; cuts on 16-element boundaries. Each output element is computed by
 * one thread, so the result is bitwise repeatable for a given thread count
 * (BLAS's blocking over K can follow the cut's shape, so another thread count
 * may differ in the last bits). */
typedef struct {
    bool ta, tb, by_cols, own; /* own: the kernel, chosen on the whole GEMM's shape */
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int width;
} gemm_job;

static void gemm_task(void *ctx, int t) {
    const gemm_job *j = ctx;
    int64_t len = j->by_cols ? j->N : j->M;
    int64_t a, b;
    lk__task_range(len, t, j->width, 16, &a, &b);
    if (b <= a) return;
    if (j->by_cols)
        piece(j->own, j->ta, j->tb, j->M, b - a, j->K, j->alpha, j->A, j->lda, j->tb ? j->B + a * j->ldb : j->B + a, j->ldb,
               j->beta, j->C + a, j->ldc);
    else
        piece(j->own, j->ta, j->tb, b - a, j->N, j->K, j->alpha, j->ta ? j->A + a : j->A + a * j->lda, j->lda, j->B, j->ldb,
               j->beta, j->C + a * j->ldc, j->ldc);
}

void lk__cpu_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) { /* BLAS leaves C alone for K == 0 only when beta == 1 */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    bool by_cols;
    int width = lk__cpu_gemm_width(M, N, K, LK__CPU_SGEMM_SPLIT_FLOPS, &by_cols);
    /* Each piece packs the whole of the operand the cut does not divide (by
     * columns all of A, M x K; by rows all of B, K x N): cut the larger one,
     * so the smaller is the one packed twice. A GPT's tall activations
     * (B T rows, n_embd wide) against its weights made the column cut pack
     * every activation once per thread (bench/results/HISTORY.md). */
    if (width > 1) {
        bool cols = N >= M;
        if ((cols ? N : M) / 16 >= width) by_cols = cols;
    }
    if (width <= 1) {
        lk__cpu_sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    gemm_job job = {ta, tb, by_cols, lk__cpu_gemm_own(ta, tb, M, N, K), M, N, K, lda, ldb, ldc, alpha, beta, A, B, C, width};
    lk__parallel_run(width, gemm_task, &job);
}


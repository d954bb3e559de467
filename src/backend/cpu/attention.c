/* The CPU backend's causal self-attention (LK_OP_ATTENTION, _BACKWARD), f32,
 * flash-attention style on GEMMs: a task takes one head (b, h) and walks it
 * in tiles of QT query rows. For a tile it computes the scores against the
 * keys the tile can see, S = scale Q K^T, as one small GEMM into its own
 * [QT, T] scratch, turns them into probabilities row by row (masked beyond
 * the diagonal, max-subtracted, the row's logsumexp kept), and multiplies by
 * V with a second GEMM — the [T, T] matrix never exists, only a tile of it.
 * The backward recomputes each tile's probabilities from the kept logsumexp
 * (P = exp(S - lse)) and runs the four products of flash attention's
 * backward as GEMMs: dP = dO V^T, dQ = scale dS K, and into the head's dK
 * and dV (which only this task writes, beta 1 across its tiles) dK +=
 * scale dS^T Q, dV += (P z)^T dO, with dS = P (dP z - D_i) and D_i = dO_i .
 * O_i. Dropout's keep factors z come from lk_k_attn_keep, the position's
 * Philox word, as the GPU's row kernels (kernels/attention.h) draw them.
 * Each output element is one task's alone and every GEMM runs single-
 * threaded inside its task, so the bits do not depend on the thread count.
 * q, k, v rows are strided by 3C in qkv: the GEMMs read them in place. */
#include <cblas.h>

#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/gemm_small.h"

#define QT 64 /* query rows per tile: S's tile is QT x T floats per task */

typedef struct {
    const lk_attention_params *p;
    const float *qkv, *y, *lse, *dy;
    float *out, *lse_out, *dqkv;
    float *scratch; /* per task: 3 QT T floats */
    int width;
} attn_job;

/* One tile GEMM: lockstep's own kernel, which skips the triangle the
 * causal mask makes zero or unused (tri, off: gemm_small.h), unless
 * LK_GEMM=blas (then OpenBLAS on the full tile, the same values up to the
 * summation order). At T 64 OpenBLAS's packing made these 64 x 64 x 32
 * tiles run at 20-41 GFLOP/s in the step (docs/BENCHMARKS.md). */
static void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                  const float *B, int64_t ldb, float beta, float *C, int64_t ldc, lk__gemm_tri tri, int64_t off) {
    if (lk__cpu_gemm_mode() != LK__GEMM_BLAS &&
        LK_ISA(lk__sgemm_own_tri)(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, tri, off))
        return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* s[c] = exp(s[c] - m) in place over n; returns their sum (8 lanes, fixed order). */
static float exp_in_place(float *s, long n, float m) {
    float acc[8] = {0};
    long i = 0;
    for (; i < n - n % 8; i += 8)
        for (int l = 0; l < 8; l++) {
            float e = lk_k_expf(s[i + l] - m);
            s[i + l] = e;
            acc[l] += e;
        }
    float r = 0.0f;
    for (int l = 0; l < 8; l++) r += acc[l];
    for (; i < n; i++) {
        float e = lk_k_expf(s[i] - m);
        s[i] = e;
        r += e;
    }
    return r;
}

/* Tile [i0, i0 + m) of head (b, h): S = scale Q K[0, n)^T then, row by row,
 * P = exp(S - lse) where j <= i (0 beyond), with lse computed here (forward:
 * written to lse) or read (backward). */
static void tile_probs(const attn_job *j, int64_t b, int64_t h, int64_t i0, int64_t m, float *S, bool forward) {
    const lk_attention_params *p = j->p;
    int64_t C = p->H * p->D, ld = 3 * C, n = i0 + m, bh = b * p->H + h;
    const float *q = j->qkv + (b * p->T + i0) * ld + h * p->D, *k = j->qkv + b * p->T * ld + C + h * p->D;
    sgemm(false, true, m, n, p->D, p->scale, q, ld, k, ld, 0.0f, S, n, LK__TRI_C_LOWER, i0);
    for (int64_t r = 0; r < m; r++) {
        float *s = S + r * n;
        int64_t valid = i0 + r + 1;
        float L;
        if (forward) {
            float mx = lk_k_max8(s, (long)valid);
            float sum = exp_in_place(s, (long)valid, mx);
            L = mx + logf(sum);
            j->lse_out[bh * p->T + i0 + r] = L;
            float inv = 1.0f / sum;
            for (int64_t c = 0; c < valid; c++) s[c] *= inv;
        } else {
            L = j->lse[bh * p->T + i0 + r];
            exp_in_place(s, (long)valid, L);
        }
        for (int64_t c = valid; c < n; c++) s[c] = 0.0f;
    }
}

/* P z in place (dropout's keep factors); nothing without dropout. */
static void apply_keep(const attn_job *j, int64_t bh, int64_t i0, int64_t m, float *P) {
    const lk_attention_params *p = j->p;
    if (!(p->thr > 0.0f)) return;
    int64_t n = i0 + m;
    for (int64_t r = 0; r < m; r++)
        for (int64_t c = 0; c <= i0 + r; c++)
            P[r * n + c] *= lk_k_attn_keep(p->key, p->ctr, p->thr, p->keep_scale, p->T, bh, i0 + r, c);
}

static void forward_task(void *ctx, int task) {
    const attn_job *j = ctx;
    const lk_attention_params *p = j->p;
    int64_t tiles = (p->T + QT - 1) / QT, C = p->H * p->D, ld = 3 * C;
    float *S = j->scratch + (size_t)task * 3 * QT * (size_t)p->T;
    /* (head, tile) pairs round-robin: the causal tiles grow with i, so
     * neighbouring pairs go to different tasks */
    for (int64_t w = task; w < p->B * p->H * tiles; w += j->width) {
        int64_t bh = w / tiles, i0 = (w % tiles) * QT, b = bh / p->H, h = bh % p->H;
        int64_t m = p->T - i0 < QT ? p->T - i0 : QT, n = i0 + m;
        tile_probs(j, b, h, i0, m, S, true);
        apply_keep(j, bh, i0, m, S);
        const float *v = j->qkv + b * p->T * ld + 2 * C + h * p->D;
        sgemm(false, false, m, p->D, n, 1.0f, S, n, v, ld, 0.0f, j->out + (b * p->T + i0) * C + h * p->D, C, LK__TRI_A_LOWER,
              i0);
    }
}

static void backward_task(void *ctx, int task) {
    const attn_job *j = ctx;
    const lk_attention_params *p = j->p;
    int64_t C = p->H * p->D, ld = 3 * C, D = p->D;
    float *P = j->scratch + (size_t)task * 3 * QT * (size_t)p->T, *Pz = P + QT * p->T, *dS = Pz + QT * p->T;
    for (int64_t bh = task; bh < p->B * p->H; bh += j->width) {
        int64_t b = bh / p->H, h = bh % p->H;
        const float *q = j->qkv + b * p->T * ld + h * D, *k = q + C, *v = q + 2 * C;
        float *dq = j->dqkv + b * p->T * ld + h * D, *dk = dq + C, *dv = dq + 2 * C;
        const float *dO = j->dy + b * p->T * C + h * D, *O = j->y + b * p->T * C + h * D;
        for (int64_t t = 0; t < p->T; t++)
            for (int64_t d = 0; d < D; d++) dk[t * ld + d] = dv[t * ld + d] = 0.0f;
        for (int64_t i0 = 0; i0 < p->T; i0 += QT) {
            int64_t m = p->T - i0 < QT ? p->T - i0 : QT, n = i0 + m;
            tile_probs(j, b, h, i0, m, P, false);
            bool drop = p->thr > 0.0f;
            if (drop) {
                for (int64_t e = 0; e < m * n; e++) Pz[e] = P[e];
                apply_keep(j, bh, i0, m, Pz);
            }
            const float *pz = drop ? Pz : P;
            /* dV[0, n) += (P z)^T dO_tile */
            sgemm(true, false, n, D, m, 1.0f, pz, n, dO + i0 * C, C, 1.0f, dv, ld, LK__TRI_A_UPPER, -i0);
            /* dP = dO_tile V[0, n)^T, then dS = P (dP z - D_i) */
            sgemm(false, true, m, n, D, 1.0f, dO + i0 * C, C, v, ld, 0.0f, dS, n, LK__TRI_C_LOWER, i0);
            for (int64_t r = 0; r < m; r++) {
                int64_t i = i0 + r;
                float Di = lk_k_dot8(dO + i * C, O + i * C, (long)D);
                float *ds = dS + r * n;
                const float *pr = P + r * n;
                if (drop)
                    for (int64_t c = 0; c <= i; c++)
                        ds[c] = pr[c] * (ds[c] * lk_k_attn_keep(p->key, p->ctr, p->thr, p->keep_scale, p->T, bh, i, c) - Di);
                else
                    for (int64_t c = 0; c <= i; c++) ds[c] = pr[c] * (ds[c] - Di);
                for (int64_t c = i + 1; c < n; c++) ds[c] = 0.0f;
            }
            /* dQ_tile = scale dS K[0, n); dK[0, n) += scale dS^T Q_tile */
            sgemm(false, false, m, D, n, p->scale, dS, n, k, ld, 0.0f, dq + i0 * ld, ld, LK__TRI_A_LOWER, i0);
            sgemm(true, false, n, D, m, p->scale, dS, n, q + i0 * ld, ld, 1.0f, dk, ld, LK__TRI_A_UPPER, -i0);
        }
    }
}

lk_status LK_ISA(lk__cpu_attention)(const lk_op_desc *d, void *const *x) {
    const lk_attention_params *p = &d->attention;
    int64_t rows = p->B * p->H * p->T;
    if (rows == 0) return LK_STATUS_OK;
    bool fwd = d->op == LK_OP_ATTENTION;
    int64_t items = fwd ? p->B * p->H * ((p->T + QT - 1) / QT) : p->B * p->H;
    /* a tile's work is about QT T D multiply-adds: split only what pays for the wake-up */
    int width = rows * p->T * p->D >= (1 << 15) ? lk__parallel_width(items) : 1;
    size_t per = 3 * (size_t)QT * (size_t)p->T;
    float *scratch = lk_malloc((size_t)width * per * sizeof *scratch);
    if (!scratch)
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "cpu backend: attention: %d tiles of %d x %lld scores", width, QT,
                        (long long)p->T);
    attn_job j = {.p = p, .qkv = x[0], .scratch = scratch, .width = width};
    if (fwd) {
        j.out = x[1], j.lse_out = x[2];
        lk__parallel_run(width, forward_task, &j);
    } else {
        j.y = x[1], j.lse = x[2], j.dy = x[3], j.dqkv = x[4];
        lk__parallel_run(width, backward_task, &j);
    }
    lk_free(scratch);
    return LK_STATUS_OK;
}

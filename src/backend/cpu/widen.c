/* The CPU backend's bf16/f16 path for the op families whose kernels are f32
 * only (pooling, layer and batch norm, SyncBatchNorm's passes, embedding's
 * scatter-add): every 16-bit operand is widened into an f32 scratch array
 * (exact), the f32 kernel runs on an all-f32 copy of the descriptor, and the
 * operands the op writes are rounded back once. So a 16-bit activation is
 * normalised or pooled with f32 statistics and sums, exactly as the f32 op
 * would on the widened values, and its result is rounded once, which is
 * what torch's CPU kernels do for bf16 (they accumulate in float).
 * Pooling goes through it in chunks of planes (pool.c), batch norm with a
 * 16-bit weight, bias or running statistic in chunks of whole channels (one
 * whose only 16-bit operands are the activations runs natively, norm.c) and
 * layer norm in chunks of rows (below), so the
 * f32 scratch stays a few megabytes whatever the activation's size; the
 * scratch is one grow-only buffer per thread (like oneDNN's scratchpad), so
 * a repeated step neither allocates nor faults pages in. What an op keeps
 * for backward stays in its own 16-bit dtype. Chunking never changes a
 * result: channels and rows are independent, and each runs the same f32
 * arithmetic in the same order. */
#include <string.h>

#include "backend/cpu/cpu_impl.h"

static bool is_half(lk_dtype t) { return t == LK_BF16 || t == LK_F16; }

static _Thread_local void *arena[LK__SCRATCH_USES];
static _Thread_local size_t arena_cap[LK__SCRATCH_USES];

void *lk__cpu_scratch_for(int use, size_t bytes) {
    if (bytes > arena_cap[use]) {
        lk_aligned_free(arena[use]);
        arena_cap[use] = 0;
        if (!(arena[use] = lk_aligned_alloc(LK_ALIGN, bytes))) return NULL;
        arena_cap[use] = bytes;
    }
    return arena[use];
}

void lk__cpu_widen_thread_cleanup(void) {
    for (int u = 0; u < LK__SCRATCH_USES; u++) {
        lk_aligned_free(arena[u]);
        arena[u] = NULL;
        arena_cap[u] = 0;
    }
}

/* n elements of dtype t at p (element stride `stride`) into f32, and back. */
static void widen(lk_dtype t, const void *p, int64_t stride, float *dst, int64_t n) {
    if (t == LK_F32) {
        for (int64_t k = 0; k < n; k++) dst[k] = ((const float *)p)[k * stride];
    } else if (stride == 1) lk_half_to_f32_n(t, dst, p, (size_t)n);
    else
        for (int64_t k = 0; k < n; k++) {
            uint16_t h = ((const uint16_t *)p)[k * stride];
            dst[k] = t == LK_BF16 ? lk_bf16_bits_to_f32(h) : lk_f16_bits_to_f32(h);
        }
}

static void narrow(lk_dtype t, void *p, int64_t stride, const float *src, int64_t n) {
    if (t == LK_F32) {
        for (int64_t k = 0; k < n; k++) ((float *)p)[k * stride] = src[k];
    } else if (stride == 1) lk_f32_to_half_n(t, p, src, (size_t)n);
    else
        for (int64_t k = 0; k < n; k++)
            ((uint16_t *)p)[k * stride] = t == LK_BF16 ? lk_f32_to_bf16_bits(src[k]) : lk_f32_to_f16_bits(src[k]);
}

static size_t esize(lk_dtype t) { return t == LK_F32 ? 4 : t == LK_F64 ? 8 : 2; }


lk_status lk__cpu_run_widened(const lk_op_desc *d, void *const *x,
                              lk_status (*run)(const lk_op_desc *d, void *const *x)) {
    int n = lk__op_arity(d->op);
    lk_op_desc f = lk__op_widened(d);
    void *ops[LK_OP_MAX_OPERANDS];
    float *buf[LK_OP_MAX_OPERANDS] = {0};
    lk_status st = LK_STATUS_OK;
    size_t total = 0, at = 0;
    for (int i = 0; i < n; i++) { /* the scratch every 16-bit operand needs, carved from one buffer */
        int64_t count, stride;
        bool written;
        if (!is_half(d->dtype[i]) || !x[i]) continue;
        if (!lk__op_operand_extent(d, i, &count, &stride, &written))
            return lk_error(LK_STATUS_INTERNAL, "cpu backend: op %d has no 16-bit path", (int)d->op);
        total += (size_t)(count > 0 ? count : 1);
    }
    float *base = lk__cpu_scratch(total);
    if (total && !base) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        ops[i] = x[i];
        if (!is_half(d->dtype[i]) || !x[i]) continue;
        int64_t count, stride;
        bool written;
        lk__op_operand_extent(d, i, &count, &stride, &written);
        buf[i] = base + at;
        at += (size_t)(count > 0 ? count : 1);
        /* written operands are widened too: some accumulate (+=) into them */
        const uint16_t *h = x[i];
        if (stride == 1) lk_half_to_f32_n(d->dtype[i], buf[i], h, (size_t)count);
        else
            for (int64_t k = 0; k < count; k++)
                buf[i][k] = d->dtype[i] == LK_BF16 ? lk_bf16_bits_to_f32(h[k * stride]) : lk_f16_bits_to_f32(h[k * stride]);
        ops[i] = buf[i];
        if (d->op == LK_OP_BATCH_NORM && i >= 1 && i <= 4) f.batch_norm.stride[i - 1] = 1;
        if (d->op == LK_OP_BN_FINISH && i >= 1 && i <= 4) f.bn_finish.stride[i - 1] = 1; /* widened contiguous */
    }
    if ((st = run(&f, ops))) goto done;
    for (int i = 0; i < n; i++) {
        if (!buf[i]) continue;
        int64_t count, stride;
        bool written;
        lk__op_operand_extent(d, i, &count, &stride, &written);
        if (!written) continue;
        uint16_t *h = x[i];
        if (stride == 1) lk_f32_to_half_n(d->dtype[i], h, buf[i], (size_t)count);
        else
            for (int64_t k = 0; k < count; k++)
                h[k * stride] = d->dtype[i] == LK_BF16 ? lk_f32_to_bf16_bits(buf[i][k]) : lk_f32_to_f16_bits(buf[i][k]);
    }
done:
    return st;
}

/* Batch norm with a 16-bit operand, in chunks of whole channels: the
 * chunk's planes of x, y (forward) or x, dy, dx (backward) gathered into
 * contiguous f32 [N, cc, S] scratch, the per-channel vectors of the chunk
 * passed in place when f32 (the running statistics are updated where they
 * are) or widened, the f32 kernel run on the chunk as a batch norm of cc
 * channels. At least the compute threads' width of channels per chunk, so
 * the kernel still splits them across cores. */
lk_status lk__cpu_bn_half(const lk_op_desc *d, void *const *x,
                          lk_status (*run)(const lk_op_desc *d, void *const *x)) {
    const lk_batch_norm_params *p = &d->batch_norm;
    bool fwd = d->op == LK_OP_BATCH_NORM;
    /* the fused ReLU's forward runs in the chunks (the f32 kernel applies
     * it before the rounding); its backward would need y gathered too, and
     * the autograd fuses only with f32 per-channel vectors, so never here */
    if (!fwd && p->relu)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "cpu backend: batch_norm_backward with relu and a 16-bit weight or "
                        "statistic is not supported (expected f32 per-channel vectors)");
    long N = p->N, C = p->C, S = p->S;
    int64_t plane = (int64_t)N * S;
    long cc = plane > 0 && plane < (1 << 18) ? (long)((1 << 18) / plane) : 1;
    int width = lk__parallel_width(C);
    if (cc < width) cc = width;
    if (cc > C) cc = C;
    if (cc < 1) cc = 1;
    /* big operands: fwd x, y; bwd x, dy, dx. vectors: fwd w, b, rm, rv (strided), stats [2, C];
     * bwd stats, w, dw, db */
    const int big_f[] = {0, 5}, big_b[] = {0, 1, 4};
    const int *big = fwd ? big_f : big_b;
    int nbig = fwd ? 2 : 3;
    int64_t chunk = (int64_t)N * cc * S;
    float *base = lk__cpu_scratch((size_t)(nbig * chunk + 8 * cc + 1));
    if (!base) return LK_STATUS_OUT_OF_MEMORY;
    for (long c0 = 0; c0 < C; c0 += cc) {
        long n = C - c0 < cc ? C - c0 : cc;
        int64_t cn = (int64_t)N * n * S;
        lk_op_desc f = lk__op_widened(d);
        f.batch_norm.C = n;
        void *ops[7];
        float *b[7] = {0};
        float *at = base;
        for (int k = 0; k < nbig; k++) {
            int i = big[k];
            b[i] = at, at += cn;
            ops[i] = b[i];
            bool read = fwd ? i == 0 : i <= 1;
            if (read)
                for (long s = 0; s < N; s++)
                    widen(d->dtype[i], (const char *)x[i] + (size_t)((s * C + c0) * S) * esize(d->dtype[i]), 1,
                          b[i] + (int64_t)s * n * S, (int64_t)n * S);
        }
        /* the per-channel vectors */
        for (int i = 0; i < 7; i++) {
            bool isbig = false;
            for (int k = 0; k < nbig; k++) isbig |= big[k] == i;
            if (isbig) continue;
            bool stats = fwd ? i == 6 : i == 2;
            if (!x[i]) {
                ops[i] = NULL;
                continue;
            }
            if (stats) { /* [2, C] -> [2, n] */
                b[i] = at, at += 2 * n;
                ops[i] = b[i];
                if (!fwd) {
                    memcpy(b[i], (const float *)x[i] + c0, (size_t)n * sizeof(float));
                    memcpy(b[i] + n, (const float *)x[i] + C + c0, (size_t)n * sizeof(float));
                }
                continue;
            }
            int64_t stride = fwd ? p->stride[i - 1] : 1;
            if (d->dtype[i] == LK_F32) {
                ops[i] = (float *)x[i] + c0 * stride; /* in place, at its stride */
                continue;
            }
            b[i] = at, at += n;
            ops[i] = b[i];
            if (fwd) f.batch_norm.stride[i - 1] = 1;
            widen(d->dtype[i], (const uint16_t *)x[i] + c0 * stride, stride, b[i], n);
        }
        LK_TRY(run(&f, ops));
        /* written back: y or dx; the statistics; 16-bit running statistics, dw, db */
        int out = fwd ? 5 : 4;
        if (x[out])
            for (long s = 0; s < N; s++)
                narrow(d->dtype[out], (char *)x[out] + (size_t)((s * C + c0) * S) * esize(d->dtype[out]), 1,
                       b[out] + (int64_t)s * n * S, (int64_t)n * S);
        if (fwd && x[6]) {
            memcpy((float *)x[6] + c0, b[6], (size_t)n * sizeof(float));
            memcpy((float *)x[6] + C + c0, b[6] + n, (size_t)n * sizeof(float));
        }
        const int wr_f[] = {3, 4}, wr_b[] = {5, 6};
        for (int k = 0; k < 2; k++) {
            int i = fwd ? wr_f[k] : wr_b[k];
            if (x[i] && d->dtype[i] != LK_F32)
                narrow(d->dtype[i], (uint16_t *)x[i] + c0 * (fwd ? p->stride[i - 1] : 1), fwd ? p->stride[i - 1] : 1,
                       b[i], n);
        }
    }
    return LK_STATUS_OK;
}

/* Layer norm with a 16-bit operand, in chunks of rows: x, y (forward) or x,
 * dy, dx (backward) of the chunk widened, the f32 stats and the f32 dw/db
 * sums passed in place (rows run in order, so dw and db add as unchunked),
 * a 16-bit weight or bias widened once per chunk. */
lk_status lk__cpu_ln_half(const lk_op_desc *d, void *const *x,
                          lk_status (*run)(const lk_op_desc *d, void *const *x)) {
    const lk_layer_norm_params *p = &d->layer_norm;
    bool fwd = d->op == LK_OP_LAYER_NORM;
    int64_t M = p->M, L = p->L;
    int64_t rows = L > 0 && L < (1 << 18) ? (1 << 18) / L : 1;
    if (rows > M) rows = M > 0 ? M : 1;
    const int big_f[] = {0, 3}, big_b[] = {0, 1, 4};
    const int *big = fwd ? big_f : big_b;
    int nbig = fwd ? 2 : 3;
    /* fwd: w 1, b 2 (L each); bwd: w 3; dw 5 and db 6 must be f32 (they accumulate) */
    if (!fwd && ((x[5] && d->dtype[5] != LK_F32) || (x[6] && d->dtype[6] != LK_F32)))
        return lk__cpu_run_widened(d, x, run);
    float *base = lk__cpu_scratch((size_t)(nbig * rows * L + 2 * L + 1));
    if (!base) return LK_STATUS_OUT_OF_MEMORY;
    for (int64_t r0 = 0; r0 < M; r0 += rows) {
        int64_t n = M - r0 < rows ? M - r0 : rows;
        lk_op_desc f = lk__op_widened(d);
        f.layer_norm.M = n;
        void *ops[7];
        float *at = base;
        for (int k = 0; k < nbig; k++) {
            int i = big[k];
            ops[i] = x[i] ? at : NULL;
            if (x[i] && (fwd ? i == 0 : i <= 1))
                widen(d->dtype[i], (const char *)x[i] + (size_t)(r0 * L) * esize(d->dtype[i]), 1, at, n * L);
            at += n * L;
        }
        const int vec_f[] = {1, 2}, vec_b[] = {3};
        for (int k = 0; k < (fwd ? 2 : 1); k++) {
            int i = fwd ? vec_f[k] : vec_b[k];
            ops[i] = x[i];
            if (x[i] && d->dtype[i] != LK_F32) {
                widen(d->dtype[i], x[i], 1, at, L);
                ops[i] = at, at += L;
            }
        }
        int st = fwd ? 4 : 2; /* the f32 [M, 2] stats, in place */
        ops[st] = x[st] ? (float *)x[st] + 2 * r0 : NULL;
        if (!fwd) ops[5] = x[5], ops[6] = x[6];
        LK_TRY(run(&f, ops));
        int out = fwd ? 3 : 4;
        if (x[out]) narrow(d->dtype[out], (char *)x[out] + (size_t)(r0 * L) * esize(d->dtype[out]), 1, ops[out], n * L);
    }
    return LK_STATUS_OK;
}

/* The CUDA backend's row and reduction families: softmax / log-softmax and
 * their backward (one thread per row over the lane-blocked bodies of
 * backend/kernels/rows.h, or per column for a middle axis), the regression
 * losses (mse, l1, smooth_l1; f32, bf16 or f16 input and target),
 * cross-entropy and nll_loss over integer targets, the gradient utilities
 * (norm, first non-finite index, fused unscale), embedding's gather and
 * in-order scatter-add, binary cross-entropy (probabilities or logits) and
 * layer norm (one thread per row; the weight gradients one thread per
 * column, rows in order).
 *
 * Sums that the CPU runs in double in element order: the per-row losses of
 * cross-entropy and nll are summed by one thread in row order (the CPU's
 * bits; rows are few), the per-element losses and the norms by a fixed
 * two-level tree in double (deterministic; differs from the CPU's order by
 * double rounding only, far below the f32 result's ulp). Counts and maxima
 * are exact in any order. */
#include <string.h>

#include "backend/cuda/common.cuh"

namespace {

/* ---- a deterministic double sum: per-block partials, then one block ---- */

#ifndef RED_BLOCKS
#define RED_BLOCKS 256 /* partial sums per reduction (at most): one per block */
#endif

__device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = LK_CU_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

/* max |x| with the CPU's NaN rule: a NaN wins and stays. */
__device__ double nan_max(double acc, double a) { return acc != acc ? acc : (a > acc || a != a) ? a : acc; }

__device__ double block_max(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = LK_CU_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] = nan_max(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    return sh[0];
}

/* Block b takes the contiguous chunk b of the n elements (so the tree is
 * the same for every run of the same n). */
__device__ void chunk_of(int64_t n, int64_t *lo, int64_t *hi) {
    int64_t per = (n + gridDim.x - 1) / gridDim.x;
    *lo = per * blockIdx.x;
    *hi = *lo + per < n ? *lo + per : n;
}

__global__ void k_norm_partial(int64_t n, double p, const void *xv, int dt, double *part) {
    __shared__ double sh[LK_CU_THREADS];
    int64_t lo, hi;
    chunk_of(n, &lo, &hi);
    bool inf = isinf(p);
    double acc = 0.0;
    for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) {
        double v = (double)lk_cu_ld(xv, dt, k), a = fabs(v); /* a 16-bit gradient widened exactly, as the CPU */
        if (inf) acc = nan_max(acc, a);
        else acc += p == 2.0 ? v * v : p == 1.0 ? a : pow(a, p);
    }
    double r = inf ? block_max(acc, sh) : block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = r;
}

__global__ void k_reduce_partials(int nparts, bool max, const double *part, double *out) {
    __shared__ double sh[LK_CU_THREADS];
    double acc = 0.0;
    for (int k = threadIdx.x; k < nparts; k += blockDim.x) acc = max ? nan_max(acc, part[k]) : acc + part[k];
    double r = max ? block_max(acc, sh) : block_sum(acc, sh);
    if (threadIdx.x == 0) *out = r;
}

__global__ void k_nonfinite(int64_t n, const void *x, int dt, unsigned long long *first) {
    LK_CU_FOR(k, n) {
        if ((__float_as_uint(lk_cu_ld(x, dt, k)) & 0x7f800000u) == 0x7f800000u) atomicMin(first, (unsigned long long)k);
    }
}

/* live: NULL, or the per-step mul (1 / scale) in device memory, read over mul. */
__global__ void k_unscale(int64_t n, const float *x, float *y, float mul, unsigned long long *count,
                          const lk_unscale_live *live) {
    if (live) mul = live->mul;
    unsigned long long bad = 0;
    LK_CU_FOR(k, n) {
        float v = x[k];
        bad += (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
        y[k] = v * mul;
    }
    if (bad) atomicAdd(count, bad);
}

/* ---- accuracy: one block, each thread counting rows, the counts summed (exact in any order) ---- */

__global__ void k_accuracy(int64_t N, int64_t C, const void *x, int kind, const void *t, int tkind, double *hits) {
    __shared__ unsigned long long sh[LK_CU_THREADS];
    unsigned long long n = 0;
    for (int64_t r = threadIdx.x; r < N; r += blockDim.x) n += (unsigned long long)lk_k_row_hit(x, kind, C, r, t, tkind);
    sh[threadIdx.x] = n;
    __syncthreads();
    for (int s = LK_CU_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) *hits = (double)sh[0];
}

/* ---- softmax ---- */

__global__ void k_softmax_rows(int64_t rows, int64_t C, const float *x, float *y, int log_out) {
    LK_CU_FOR(o, rows) lk_k_softmax_row(x + o * C, y + o * C, (long)C, log_out);
}

/* The column form of lk_k_softmax_cols, one thread per (outer, j) column,
 * with the same statements in the same order. */
__global__ void k_softmax_cols(int64_t outer, int64_t C, int64_t inner, const float *x, float *y, int log_out) {
    LK_CU_FOR(t, outer * inner) {
        int64_t o = t / inner, j = t % inner;
        const float *xc = x + o * C * inner + j;
        float *yc = y + o * C * inner + j;
        float m = -INFINITY, s = 0.0f;
        for (int64_t c = 0; c < C; c++) m = xc[c * inner] > m ? xc[c * inner] : m;
        for (int64_t c = 0; c < C; c++) {
            float e = lk_k_expf(xc[c * inner] - m);
            yc[c * inner] = e;
            s += e;
        }
        s = log_out ? logf(s) : 1.0f / s;
        for (int64_t c = 0; c < C; c++) yc[c * inner] = log_out ? (xc[c * inner] - m) - s : yc[c * inner] * s;
    }
}

__global__ void k_softmax_backward_rows(int64_t rows, int64_t C, const float *y, const float *g, float *dx,
                                        int log_out) {
    LK_CU_FOR(o, rows) lk_k_softmax_backward_row(y + o * C, g + o * C, dx + o * C, (long)C, log_out);
}

__global__ void k_softmax_backward_cols(int64_t outer, int64_t C, int64_t inner, const float *y, const float *g,
                                        float *dx, int log_out) {
    LK_CU_FOR(t, outer * inner) {
        int64_t base = (t / inner) * C * inner + t % inner;
        float acc = 0.0f;
        for (int64_t c = 0; c < C; c++) {
            int64_t k = base + c * inner;
            acc += log_out ? g[k] : g[k] * y[k];
        }
        for (int64_t c = 0; c < C; c++) {
            int64_t k = base + c * inner;
            dx[k] = log_out ? g[k] - lk_k_expf(y[k]) * acc : y[k] * (g[k] - acc);
        }
    }
}

/* ---- regression losses ---- */

__global__ void k_loss_none(lk_loss_params p, const void *x, const void *t, float *out, int xt, int tt) {
    LK_CU_FOR(i, p.n) out[i] = lk_k_ploss(p.kind, lk_cu_ld(x, xt, i) - lk_cu_ld(t, tt, i), p.beta);
}

__global__ void k_loss_partial(lk_loss_params p, const void *x, const void *t, int xt, int tt, double *part) {
    __shared__ double sh[LK_CU_THREADS];
    int64_t lo, hi;
    chunk_of(p.n, &lo, &hi);
    double acc = 0.0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
        acc += lk_k_ploss(p.kind, lk_cu_ld(x, xt, i) - lk_cu_ld(t, tt, i), p.beta);
    double r = block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = r;
}

__global__ void k_loss_finish(const double *sum, int64_t n, bool mean, float *out) {
    out[0] = mean ? (n ? (float)(*sum / (double)n) : NAN) : (float)*sum;
}

__global__ void k_loss_backward(lk_loss_params p, const void *x, const void *t, const float *gd, void *dx, int xt,
                                int tt) {
    float scale = p.reduction == LK_REDUCTION_MEAN ? 1.0f / (float)p.n : 1.0f, beta = p.beta;
    LK_CU_FOR(i, p.n) {
        float gi = p.reduction == LK_REDUCTION_NONE ? gd[i] : gd[0] * scale;
        lk_cu_st(dx, xt, i, gi * lk_k_ploss_dx(p.kind, lk_cu_ld(x, xt, i) - lk_cu_ld(t, tt, i), beta));
    }
}

/* ---- binary cross-entropy (on probabilities or logits) ---- */

__device__ float bce_value(const lk_bce_params &p, const float *x, const float *t, const float *w, const float *pw,
                           int64_t i) {
    float v = p.logits ? lk_k_bce_logits(x[i], t[i], pw ? pw[i] : 1.0f) : lk_k_bce(x[i], t[i]);
    if (w) v *= w[i];
    return v;
}

__global__ void k_bce_none(lk_bce_params p, const float *x, const float *t, const float *w, const float *pw, float *out) {
    LK_CU_FOR(i, p.n) out[i] = bce_value(p, x, t, w, pw, i);
}

__global__ void k_bce_partial(lk_bce_params p, const float *x, const float *t, const float *w, const float *pw,
                              double *part) {
    __shared__ double sh[LK_CU_THREADS];
    int64_t lo, hi;
    chunk_of(p.n, &lo, &hi);
    double acc = 0.0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) acc += bce_value(p, x, t, w, pw, i);
    double r = block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = r;
}

__global__ void k_bce_finish(const double *sum, int64_t n, bool mean, float *out) {
    out[0] = mean ? (float)(*sum / (double)n) : (float)*sum; /* n = 0: NaN, as the CPU */
}

__global__ void k_bce_backward(lk_bce_params p, const float *x, const float *t, const float *w, const float *pw,
                               const float *gd, float *dx, float *dt) {
    float scale = p.reduction == LK_REDUCTION_MEAN ? 1.0f / (float)p.n : 1.0f;
    LK_CU_FOR(i, p.n) {
        float gi = p.reduction == LK_REDUCTION_NONE ? gd[i] : gd[0] * scale, pwi = pw ? pw[i] : 1.0f, v;
        if (dx) {
            v = p.logits ? lk_k_bce_logits_dx(x[i], t[i], pwi) : lk_k_bce_dx(x[i], t[i]);
            dx[i] = (w ? w[i] * v : v) * gi;
        }
        if (dt) {
            v = p.logits ? lk_k_bce_logits_dt(x[i], pwi) : lk_k_bce_dt(x[i]);
            dt[i] = (w ? w[i] * v : v) * gi;
        }
    }
}

/* ---- layer norm ---- */

__global__ void k_layer_norm(lk_layer_norm_params p, const float *x, const float *w, const float *b, float *y,
                             float *stats) {
    LK_CU_FOR(r, p.M) {
        float mean, rstd;
        lk_k_layer_norm_row(x + r * p.L, y + r * p.L, (long)p.L, w, b, p.eps, &mean, &rstd);
        if (stats) stats[2 * r] = mean, stats[2 * r + 1] = rstd;
    }
}

/* dx per row; dyw is [M, L] scratch for g * w when there is a w. */
__global__ void k_layer_norm_dx(lk_layer_norm_params p, const float *x, const float *g, const float *stats,
                                const float *w, float *dx, float *dyw) {
    LK_CU_FOR(r, p.M) {
        const float *dyr = g + r * p.L;
        if (w) {
            float *row = dyw + r * p.L;
            for (int64_t i = 0; i < p.L; i++) row[i] = dyr[i];
            lk_k_mul8(row, w, (long)p.L);
            dyr = row;
        }
        lk_k_layer_norm_backward_row(x + r * p.L, dyr, stats[2 * r], stats[2 * r + 1], (long)p.L, dx + r * p.L);
    }
}

/* dw and db per column, rows in order: the CPU's sums. */
__global__ void k_layer_norm_dwdb(lk_layer_norm_params p, const float *x, const float *g, const float *stats, float *dw,
                                  float *db) {
    LK_CU_FOR(i, p.L) {
        for (int64_t r = 0; r < p.M; r++) {
            int64_t k = r * p.L + i;
            if (dw) dw[i] += g[k] * ((x[k] - stats[2 * r]) * stats[2 * r + 1]);
            if (db) db[i] += g[k];
        }
    }
}

/* ---- cross-entropy and nll ---- */

/* Per row: the nll, the smoothing term and the weight into rs[3 * r ..]
 * (0 for an ignored row, which the sum skips by its target). gather and ex
 * are [rows, C] scratch (gather when D > 1, ex when no P is kept). */
__global__ void k_xent_rows(lk_xent_params p, const float *x, const void *tg, int tdt, const float *w, float *od,
                            float *P, float *gather, float *ex, float *rs) {
    const int64_t C = p.C, D = p.D, rows = p.N * p.D;
    LK_CU_FOR(r, rows) {
        int64_t t = lk_cu_index(tg, tdt, r);
        float *out3 = rs + 3 * r;
        if (t == p.ignore_index) {
            if (p.reduction == LK_REDUCTION_NONE) od[r] = 0.0f;
            out3[0] = out3[1] = out3[2] = 0.0f;
            continue;
        }
        const float *z = x + r * C;
        if (D > 1) {
            const float *base = x + (r / D) * C * D + r % D;
            float *row = gather + r * C;
            for (int64_t c = 0; c < C; c++) row[c] = base[c * D];
            z = row;
        }
        float wt = w ? w[t] : 1.0f, sm;
        float nll = lk_k_xent_row(z, P ? P + r * C : ex + r * C, (long)C, (long)t, wt, w, p.eps, P != NULL, &sm);
        if (p.reduction == LK_REDUCTION_NONE) od[r] = p.eps > 0.0f ? (1.0f - p.eps) * nll + sm * (p.eps / (float)C) : nll;
        out3[0] = nll, out3[1] = sm, out3[2] = wt;
    }
}

__global__ void k_nll_rows(lk_xent_params p, const float *x, const void *tg, int tdt, const float *w, float *od,
                           float *rs) {
    const int64_t C = p.C, D = p.D;
    LK_CU_FOR(r, p.N * D) {
        int64_t t = lk_cu_index(tg, tdt, r);
        float v = 0.0f, wt = 0.0f;
        if (t != p.ignore_index) {
            wt = w ? w[t] : 1.0f;
            v = -wt * x[(r / D) * C * D + t * D + r % D];
        }
        if (p.reduction == LK_REDUCTION_NONE) od[r] = v;
        rs[3 * r] = v, rs[3 * r + 1] = 0.0f, rs[3 * r + 2] = wt;
    }
}

/* One thread, rows in order, in double: the CPU's sums bit for bit. */
__global__ void k_class_finish(lk_xent_params p, bool nll, const void *tg, int tdt, const float *rs, float *od,
                               double *wsum_out) {
    double a = 0.0, b = 0.0, wsum = 0.0;
    for (int64_t r = 0; r < p.N * p.D; r++) {
        if (lk_cu_index(tg, tdt, r) == p.ignore_index) continue;
        a += rs[3 * r], b += rs[3 * r + 1], wsum += rs[3 * r + 2];
    }
    if (nll) {
        if (p.reduction == LK_REDUCTION_SUM) od[0] = (float)a;
        if (p.reduction == LK_REDUCTION_MEAN) od[0] = (float)(a / wsum);
    } else {
        float eps = p.eps;
        double es = p.C > 0 ? (double)eps / (double)p.C : 0.0;
        if (p.reduction == LK_REDUCTION_SUM) od[0] = (float)((1.0 - eps) * a + es * b);
        if (p.reduction == LK_REDUCTION_MEAN)
            od[0] = (float)(eps > 0.0f ? (1.0 - eps) * (a / wsum) + es * (b / wsum) : a / wsum);
    }
    *wsum_out = wsum;
}

__global__ void k_xent_backward(lk_xent_params p, const float *P, const void *tg, int tdt, const float *w,
                                const float *gd, float *dx, float *scratch) {
    const int64_t C = p.C, D = p.D;
    LK_CU_FOR(r, p.N * D) {
        int64_t t = lk_cu_index(tg, tdt, r);
        float *dst = D == 1 ? dx + r * C : scratch + r * C;
        if (t == p.ignore_index) {
            for (int64_t c = 0; c < C; c++) dst[c] = 0.0f;
        } else {
            float coef = p.reduction == LK_REDUCTION_NONE   ? gd[r]
                         : p.reduction == LK_REDUCTION_MEAN ? gd[0] / p.norm
                                                            : gd[0];
            lk_k_xent_row_grad(P + r * C, dst, (long)C, (long)t, w ? w[t] : 1.0f, w, p.W, p.eps, coef);
        }
        if (D > 1) {
            float *base = dx + (r / D) * C * D + r % D;
            for (int64_t c = 0; c < C; c++) base[c * D] = dst[c];
        }
    }
}

__global__ void k_nll_backward(lk_xent_params p, const void *tg, int tdt, const float *w, const float *gd, float *dx) {
    const int64_t C = p.C, D = p.D;
    LK_CU_FOR(r, p.N * D) {
        int64_t t = lk_cu_index(tg, tdt, r);
        if (t == p.ignore_index) continue;
        float coef = p.reduction == LK_REDUCTION_NONE ? gd[r] : p.reduction == LK_REDUCTION_MEAN ? gd[0] / p.norm : gd[0];
        dx[(r / D) * C * D + t * D + r % D] = -(w ? w[t] : 1.0f) * coef;
    }
}

/* ---- embedding ---- */

__global__ void k_embedding(lk_embedding_params p, const float *w, const void *idx, int it, float *out) {
    LK_CU_FOR(k, p.n * p.D) out[k] = w[lk_cu_index(idx, it, k / p.D) * p.D + k % p.D];
}

/* A bf16/f16 table: the rows' bits copied unchanged, as the CPU's memcpy. */
__global__ void k_embedding_u16(lk_embedding_params p, const uint16_t *w, const void *idx, int it, uint16_t *out) {
    LK_CU_FOR(k, p.n * p.D) out[k] = w[lk_cu_index(idx, it, k / p.D) * p.D + k % p.D];
}

/* One thread per column of dw's rows: the indices in order, so repeated
 * indices accumulate in the CPU's order (deterministic, same bits). */
__global__ void k_embedding_backward(lk_embedding_params p, const float *g, const void *idx, int it, float *dw) {
    LK_CU_FOR(c, p.D) {
        for (int64_t i = 0; i < p.n; i++) dw[lk_cu_index(idx, it, i) * p.D + c] += g[i * p.D + c];
    }
}

/* ---- launchers ---- */

/* A result a kernel left in device scratch, delivered to the op's output:
 * a stream-ordered copy when the output is device memory (the host does not
 * wait; clipping's norms, cross-entropy's total weight on a device), a copy
 * that waits for the kernel when it is host memory (read at once: the
 * compute stream is synchronised after it). */
static cudaError_t deliver(void *out, const void *dev_src, size_t bytes) {
    if (lk_cu_on_device(out)) return cudaMemcpyAsync(out, dev_src, bytes, cudaMemcpyDeviceToDevice, lk_cu_stream());
    cudaError_t e = cudaMemcpyAsync(out, dev_src, bytes, cudaMemcpyDeviceToHost, lk_cu_stream());
    return e == cudaSuccess ? cudaStreamSynchronize(lk_cu_stream()) : e;
}

cudaError_t reduce_to_host(double *part, int nparts, bool max, void *host_out) {
    k_reduce_partials<<<1, LK_CU_THREADS, 0, lk_cu_stream()>>>(nparts, max, part, part + RED_BLOCKS);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = deliver(host_out, part + RED_BLOCKS, sizeof(double));
    return e;
}

unsigned red_blocks(int64_t n) {
    int64_t b = (n + LK_CU_THREADS - 1) / LK_CU_THREADS;
    return b < 1 ? 1u : b > RED_BLOCKS ? RED_BLOCKS : (unsigned)b;
}

cudaError_t norm(const lk_op_desc *d, void *const *x) {
    double *part = NULL;
    cudaError_t e = lk_cu_scratch((void **)&part, (RED_BLOCKS + 1) * sizeof(double));
    if (e != cudaSuccess) return e;
    unsigned nb = red_blocks(d->norm.n);
    k_norm_partial<<<nb, LK_CU_THREADS, 0, lk_cu_stream()>>>(d->norm.n, d->norm.p, x[0], (int)d->dtype[0], part);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = reduce_to_host(part, (int)nb, isinf(d->norm.p), x[1]);
    lk_cu_scratch_free(part);
    return e;
}

/* The first non-finite index (-1: none) or unscale's count, as the i64 the
 * accumulator's bits make read as signed (~0 is -1). An output in device
 * memory is the accumulator itself, so nothing comes back to the host (the
 * trainer's step-status slots: its one read per step); a host output gets
 * the value through a scratch accumulator and a copy, which waits for the
 * kernel. */
cudaError_t nonfinite(const lk_op_desc *d, void *const *x) {
    bool unscale = d->op == LK_OP_UNSCALE;
    void *out = x[unscale ? 2 : 1];
    bool on_device = lk_cu_on_device(out);
    unsigned long long *acc = (unsigned long long *)out;
    cudaError_t e = on_device ? cudaSuccess : lk_cu_scratch((void **)&acc, sizeof *acc);
    if (e != cudaSuccess) return e;
    e = cudaMemsetAsync(acc, unscale ? 0 : 0xff, sizeof *acc, lk_cu_stream());
    int64_t n = d->nonfinite.n;
    if (e == cudaSuccess && n > 0) {
        if (unscale)
            k_unscale<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(n, (const float *)x[0], (float *)x[1], d->nonfinite.mul, acc,
                                                                          (const lk_unscale_live *)d->live);
        else k_nonfinite<<<lk_cu_blocks(n), LK_CU_THREADS, 0, lk_cu_stream()>>>(n, x[0], (int)d->dtype[0], acc);
        e = cudaGetLastError();
    }
    if (on_device) return e;
    unsigned long long v = 0;
    if (e == cudaSuccess) e = deliver(&v, acc, sizeof v);
    lk_cu_scratch_free(acc);
    if (e != cudaSuccess) return e;
    int64_t r = unscale ? (int64_t)v : v == ~0ull ? -1 : (int64_t)v;
    memcpy(out, &r, sizeof r); /* out is host memory here (on_device is false): no runtime call */
    return cudaSuccess;
}

cudaError_t softmax(const lk_op_desc *d, void *const *x) {
    const lk_softmax_params *p = &d->softmax;
    if (p->C <= 0 || p->inner <= 0 || p->outer <= 0) return cudaSuccess;
    int lo = p->log_out;
    if (d->op == LK_OP_SOFTMAX) {
        if (p->inner == 1)
            k_softmax_rows<<<lk_cu_blocks(p->outer), LK_CU_THREADS, 0, lk_cu_stream()>>>(p->outer, p->C, (const float *)x[0],
                                                                     (float *)x[1], lo);
        else
            k_softmax_cols<<<lk_cu_blocks(p->outer * p->inner), LK_CU_THREADS, 0, lk_cu_stream()>>>(p->outer, p->C, p->inner,
                                                                                 (const float *)x[0], (float *)x[1], lo);
    } else {
        if (p->inner == 1)
            k_softmax_backward_rows<<<lk_cu_blocks(p->outer), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                p->outer, p->C, (const float *)x[0], (const float *)x[1], (float *)x[2], lo);
        else
            k_softmax_backward_cols<<<lk_cu_blocks(p->outer * p->inner), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                p->outer, p->C, p->inner, (const float *)x[0], (const float *)x[1], (float *)x[2], lo);
    }
    return cudaGetLastError();
}

cudaError_t loss(const lk_op_desc *d, void *const *x) {
    const lk_loss_params *p = &d->loss;
    int xt = (int)d->dtype[0], tt = (int)d->dtype[1];
    if (d->op == LK_OP_LOSS_BACKWARD) {
        if (p->n > 0)
            k_loss_backward<<<lk_cu_blocks(p->n), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, x[0], x[1], (const float *)x[2], x[3], xt, tt);
        return cudaGetLastError();
    }
    if (p->reduction == LK_REDUCTION_NONE) {
        if (p->n > 0) k_loss_none<<<lk_cu_blocks(p->n), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, x[0], x[1], (float *)x[2], xt, tt);
        return cudaGetLastError();
    }
    double *part = NULL;
    cudaError_t e = lk_cu_scratch((void **)&part, (RED_BLOCKS + 1) * sizeof(double));
    if (e != cudaSuccess) return e;
    unsigned nb = red_blocks(p->n);
    k_loss_partial<<<nb, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, x[0], x[1], xt, tt, part);
    k_reduce_partials<<<1, LK_CU_THREADS, 0, lk_cu_stream()>>>((int)nb, false, part, part + RED_BLOCKS);
    k_loss_finish<<<1, 1, 0, lk_cu_stream()>>>(part + RED_BLOCKS, p->n, p->reduction == LK_REDUCTION_MEAN, (float *)x[2]);
    e = cudaGetLastError();
    lk_cu_scratch_free(part);
    return e;
}

cudaError_t bce(const lk_op_desc *d, void *const *x) {
    const lk_bce_params *p = &d->bce;
    const float *xd = (const float *)x[0], *td = (const float *)x[1], *w = (const float *)x[2],
                *pw = (const float *)x[3];
    if (d->op == LK_OP_BCE_BACKWARD) {
        if (p->n > 0)
            k_bce_backward<<<lk_cu_blocks(p->n), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, xd, td, w, pw, (const float *)x[4], (float *)x[5],
                                                                  (float *)x[6]);
        return cudaGetLastError();
    }
    if (p->reduction == LK_REDUCTION_NONE) {
        if (p->n > 0) k_bce_none<<<lk_cu_blocks(p->n), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, xd, td, w, pw, (float *)x[4]);
        return cudaGetLastError();
    }
    double *part = NULL;
    cudaError_t e = lk_cu_scratch((void **)&part, (RED_BLOCKS + 1) * sizeof(double));
    if (e != cudaSuccess) return e;
    unsigned nb = red_blocks(p->n);
    k_bce_partial<<<nb, LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, xd, td, w, pw, part);
    k_reduce_partials<<<1, LK_CU_THREADS, 0, lk_cu_stream()>>>((int)nb, false, part, part + RED_BLOCKS);
    k_bce_finish<<<1, 1, 0, lk_cu_stream()>>>(part + RED_BLOCKS, p->n, p->reduction == LK_REDUCTION_MEAN, (float *)x[4]);
    e = cudaGetLastError();
    lk_cu_scratch_free(part);
    return e;
}

cudaError_t layer_norm(const lk_op_desc *d, void *const *x) {
    const lk_layer_norm_params *p = &d->layer_norm;
    if (p->L <= 0 || p->M <= 0) return cudaSuccess;
    if (d->op == LK_OP_LAYER_NORM) {
        k_layer_norm<<<lk_cu_blocks(p->M), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, (const float *)x[0], (const float *)x[1],
                                                            (const float *)x[2], (float *)x[3], (float *)x[4]);
        return cudaGetLastError();
    }
    const float *xd = (const float *)x[0], *g = (const float *)x[1], *st = (const float *)x[2], *w = (const float *)x[3];
    float *dx = (float *)x[4], *dw = (float *)x[5], *db = (float *)x[6], *dyw = NULL;
    cudaError_t e = cudaSuccess;
    if (dx) {
        if (w && (e = lk_cu_scratch((void **)&dyw, (size_t)(p->M * p->L) * sizeof(float))) != cudaSuccess) return e;
        k_layer_norm_dx<<<lk_cu_blocks(p->M), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, xd, g, st, w, dx, dyw);
        e = cudaGetLastError();
        lk_cu_scratch_free(dyw);
    }
    if (e == cudaSuccess && (dw || db)) {
        k_layer_norm_dwdb<<<lk_cu_blocks(p->L), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, xd, g, st, dw, db);
        e = cudaGetLastError();
    }
    return e;
}

cudaError_t classify(const lk_op_desc *d, void *const *x) {
    const lk_xent_params *p = &d->xent;
    const int64_t rows = p->N * p->D, C = p->C;
    cudaError_t e = cudaSuccess;
    switch (d->op) {
    case LK_OP_XENT:
    case LK_OP_NLL: {
        bool nll = d->op == LK_OP_NLL;
        bool need_ex = !nll && x[4] == NULL, need_gather = !nll && p->D > 1;
        size_t floats = 3 * (size_t)rows + (need_ex ? (size_t)(rows * C) : 0) + (need_gather ? (size_t)(rows * C) : 0);
        float *s = NULL;
        if ((e = lk_cu_scratch((void **)&s, floats * sizeof(float) + sizeof(double))) != cudaSuccess) return e;
        double *wsum = (double *)s; /* first, for alignment */
        float *rs = (float *)(wsum + 1), *ex = rs + 3 * rows, *gather = ex + (need_ex ? rows * C : 0);
        int tdt = (int)d->dtype[1];
        if (rows > 0) {
            if (nll)
                k_nll_rows<<<lk_cu_blocks(rows), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, (const float *)x[0], x[1], tdt,
                                                                  (const float *)x[2], (float *)x[3], rs);
            else
                k_xent_rows<<<lk_cu_blocks(rows), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, (const float *)x[0], x[1], tdt,
                                                                   (const float *)x[2], (float *)x[3], (float *)x[4],
                                                                   gather, ex, rs);
        }
        k_class_finish<<<1, 1, 0, lk_cu_stream()>>>(*p, nll, x[1], tdt, rs, (float *)x[3], wsum);
        e = cudaGetLastError();
        if (e == cudaSuccess) e = deliver(x[nll ? 4 : 5], wsum, sizeof(double));
        lk_cu_scratch_free(s);
        return e;
    }
    case LK_OP_XENT_BACKWARD: {
        float *s = NULL;
        if (p->D > 1 && (e = lk_cu_scratch((void **)&s, (size_t)(rows * C) * sizeof(float))) != cudaSuccess) return e;
        if (rows > 0)
            k_xent_backward<<<lk_cu_blocks(rows), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, (const float *)x[0], x[1], (int)d->dtype[1],
                                                                   (const float *)x[2], (const float *)x[3],
                                                                   (float *)x[4], s);
        e = cudaGetLastError();
        lk_cu_scratch_free(s);
        return e;
    }
    case LK_OP_NLL_BACKWARD:
        if (rows > 0)
            k_nll_backward<<<lk_cu_blocks(rows), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, x[0], (int)d->dtype[0], (const float *)x[1],
                                                                  (const float *)x[2], (float *)x[3]);
        return cudaGetLastError();
    default: return cudaErrorInvalidValue;
    }
}

/* ---- causal self-attention: a thread per query row (forward, dq) or key
 * column (dk, dv), the bodies of kernels/attention.h ---- */
__global__ void k_attention(lk_attention_params p, const float *qkv, float *y, float *lse) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < p.B * p.H * p.T;
         r += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = r % p.T, bh = r / p.T;
        lk_k_attn_forward_row(qkv, y, lse, p.T, p.H, p.D, p.scale, p.key, p.ctr, p.thr, p.keep_scale, bh / p.H,
                              bh % p.H, i);
    }
}

__global__ void k_attention_backward(lk_attention_params p, const float *qkv, const float *y, const float *lse,
                                     const float *dy, float *dqkv, int columns) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < p.B * p.H * p.T;
         r += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = r % p.T, bh = r / p.T;
        if (columns)
            lk_k_attn_dkv_col(qkv, y, lse, dy, NULL, dqkv, p.T, p.H, p.D, p.scale, p.key, p.ctr, p.thr, p.keep_scale,
                              bh / p.H, bh % p.H, i);
        else
            lk_k_attn_dq_row(qkv, y, lse, dy, dqkv, p.T, p.H, p.D, p.scale, p.key, p.ctr, p.thr, p.keep_scale,
                             bh / p.H, bh % p.H, i);
    }
}

static cudaError_t attention(const lk_op_desc *d, void *const *x) {
    const lk_attention_params *p = &d->attention;
    int64_t rows = p->B * p->H * p->T;
    if (rows == 0) return cudaSuccess;
    if (d->op == LK_OP_ATTENTION) {
        k_attention<<<lk_cu_blocks(rows), LK_CU_THREADS, 0, lk_cu_stream()>>>(*p, (const float *)x[0], (float *)x[1],
                                                                            (float *)x[2]);
        return cudaGetLastError();
    }
    for (int columns = 0; columns < 2; columns++) { /* dq by rows, then dk and dv by columns: disjoint writes */
        k_attention_backward<<<lk_cu_blocks(rows), LK_CU_THREADS, 0, lk_cu_stream()>>>(
            *p, (const float *)x[0], (const float *)x[1], (const float *)x[2], (const float *)x[3], (float *)x[4],
            columns);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

} // namespace

extern "C" int lk__cuda_rows(const lk_op_desc *d, void *const *x) {
    LK_CU_REQUIRE_STREAM();
    bool widened = d->op == LK_OP_LAYER_NORM || d->op == LK_OP_LAYER_NORM_BACKWARD || d->op == LK_OP_EMBEDDING_BACKWARD ||
                   d->op == LK_OP_ATTENTION || d->op == LK_OP_ATTENTION_BACKWARD;
    if (widened && lk__op_has_half(d)) return lk__cuda_widened(d, x, lk__cuda_rows);
    switch (d->op) {
    case LK_OP_SOFTMAX:
    case LK_OP_SOFTMAX_BACKWARD: return (int)softmax(d, x);
    case LK_OP_LOSS:
    case LK_OP_LOSS_BACKWARD: return (int)loss(d, x);
    case LK_OP_XENT:
    case LK_OP_XENT_BACKWARD:
    case LK_OP_NLL:
    case LK_OP_NLL_BACKWARD: return (int)classify(d, x);
    case LK_OP_NORM: return (int)norm(d, x);
    case LK_OP_BCE:
    case LK_OP_BCE_BACKWARD: return (int)bce(d, x);
    case LK_OP_LAYER_NORM:
    case LK_OP_LAYER_NORM_BACKWARD: return (int)layer_norm(d, x);
    case LK_OP_NONFINITE:
    case LK_OP_UNSCALE: return (int)nonfinite(d, x);
    case LK_OP_ATTENTION:
    case LK_OP_ATTENTION_BACKWARD: return (int)attention(d, x);
    case LK_OP_EMBEDDING:
        if (d->embedding.n * d->embedding.D > 0 && d->dtype[0] != LK_F32)
            k_embedding_u16<<<lk_cu_blocks(d->embedding.n * d->embedding.D), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                d->embedding, (const uint16_t *)x[0], x[1], (int)d->dtype[1], (uint16_t *)x[2]);
        else if (d->embedding.n * d->embedding.D > 0)
            k_embedding<<<lk_cu_blocks(d->embedding.n * d->embedding.D), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                d->embedding, (const float *)x[0], x[1], (int)d->dtype[1], (float *)x[2]);
        return (int)cudaGetLastError();
    case LK_OP_EMBEDDING_BACKWARD:
        if (d->embedding.n * d->embedding.D > 0)
            k_embedding_backward<<<lk_cu_blocks(d->embedding.D), LK_CU_THREADS, 0, lk_cu_stream()>>>(
                d->embedding, (const float *)x[0], x[1], (int)d->dtype[1], (float *)x[2]);
        return (int)cudaGetLastError();
    case LK_OP_ACCURACY: { /* written even for no rows (0), as the CPU */
        int kind = d->dtype[0] == LK_F32 ? 0 : d->dtype[0] == LK_BF16 ? 1 : 2;
        int tkind = d->dtype[1] == LK_I64 ? 0 : d->dtype[1] == LK_I32 ? 1 : 2;
        k_accuracy<<<1, LK_CU_THREADS, 0, lk_cu_stream()>>>(d->accuracy.N, d->accuracy.C, x[0], kind, x[1], tkind, (double *)x[2]);
        return (int)cudaGetLastError();
    }
    default: return (int)cudaErrorInvalidValue;
    }
}

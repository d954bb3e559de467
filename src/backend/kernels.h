/* Kernel bodies: the element-wise and reduction math, written once as
 * static inline functions that both the C compiler (CPU backend, tests) and
 * nvcc (CUDA backend) compile, so the CPU tests check the math the GPU runs.
 * Only plain C arithmetic and <math.h> float functions here. */
#ifndef LK_KERNELS_H
#define LK_KERNELS_H

#include <math.h>

#ifdef __CUDACC__
#define LK_KERNEL __host__ __device__ static inline
#else
#define LK_KERNEL static inline
#endif

#define LK_UNARY_LIST(X)                                                         \
    X(RELU) X(GELU_TANH) X(GELU_EXACT) X(TANH) X(SIGMOID) X(EXP) X(LOG) X(SQRT) \
    X(ABS) X(LEAKY_RELU) X(ELU) X(SILU) X(NEG)

typedef enum {
#define LK__UNARY_ENUM(name) LK_UNARY_##name,
    LK_UNARY_LIST(LK__UNARY_ENUM)
#undef LK__UNARY_ENUM
    LK_UNARY_COUNT
} lk_unary_op;

#define LK_SQRT_2_OVER_PI 0.7978845608028654f
#define LK_GELU_COEF 0.044715f
#define LK_INV_SQRT_2 0.7071067811865476f

/* y = f(x); alpha is the op's parameter (leaky slope, elu alpha). */
LK_KERNEL float lk_k_unary(int op, float x, float alpha) {
    switch (op) {
    case LK_UNARY_RELU: return x > 0.0f ? x : 0.0f;
    case LK_UNARY_GELU_TANH: {
        float u = LK_SQRT_2_OVER_PI * (x + LK_GELU_COEF * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
    case LK_UNARY_GELU_EXACT: return 0.5f * x * (1.0f + erff(x * LK_INV_SQRT_2));
    case LK_UNARY_TANH: return tanhf(x);
    case LK_UNARY_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case LK_UNARY_EXP: return expf(x);
    case LK_UNARY_LOG: return logf(x);
    case LK_UNARY_SQRT: return sqrtf(x);
    case LK_UNARY_ABS: return fabsf(x);
    case LK_UNARY_LEAKY_RELU: return x > 0.0f ? x : alpha * x;
    case LK_UNARY_ELU: return x > 0.0f ? x : alpha * (expf(x) - 1.0f);
    case LK_UNARY_SILU: return x / (1.0f + expf(-x));
    case LK_UNARY_NEG: return -x;
    default: return x;
    }
}

/* dy/dx given x and y = f(x) (whichever is cheaper to use). */
LK_KERNEL float lk_k_unary_grad(int op, float x, float y, float alpha) {
    switch (op) {
    case LK_UNARY_RELU: return x > 0.0f ? 1.0f : 0.0f;
    case LK_UNARY_GELU_TANH: {
        float u = LK_SQRT_2_OVER_PI * (x + LK_GELU_COEF * x * x * x);
        float t = tanhf(u);
        float du = LK_SQRT_2_OVER_PI * (1.0f + 3.0f * LK_GELU_COEF * x * x);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    case LK_UNARY_GELU_EXACT: {
        float cdf = 0.5f * (1.0f + erff(x * LK_INV_SQRT_2));
        float pdf = 0.3989422804014327f * expf(-0.5f * x * x);
        return cdf + x * pdf;
    }
    case LK_UNARY_TANH: return 1.0f - y * y;
    case LK_UNARY_SIGMOID: return y * (1.0f - y);
    case LK_UNARY_EXP: return y;
    case LK_UNARY_LOG: return 1.0f / x;
    case LK_UNARY_SQRT: return 0.5f / y;
    case LK_UNARY_ABS: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    case LK_UNARY_LEAKY_RELU: return x > 0.0f ? 1.0f : alpha;
    case LK_UNARY_ELU: return x > 0.0f ? 1.0f : y + alpha;
    case LK_UNARY_SILU: {
        float s = 1.0f / (1.0f + expf(-x));
        return s * (1.0f + x * (1.0f - s));
    }
    case LK_UNARY_NEG: return -1.0f;
    default: return 1.0f;
    }
}

typedef enum { LK_BINARY_ADD, LK_BINARY_SUB, LK_BINARY_MUL, LK_BINARY_DIV } lk_binary_op;

LK_KERNEL float lk_k_binary(int op, float a, float b) {
    switch (op) {
    case LK_BINARY_ADD: return a + b;
    case LK_BINARY_SUB: return a - b;
    case LK_BINARY_MUL: return a * b;
    default: return a / b;
    }
}

/* Numerically stable log(sum(exp(x))) over a row, and the softmax of it. */
LK_KERNEL float lk_k_row_max(const float *x, long n) {
    float m = -INFINITY;
    for (long i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

LK_KERNEL float lk_k_row_logsumexp(const float *x, long n) {
    float m = lk_k_row_max(x, n);
    if (m == -INFINITY) return m;
    float s = 0.0f;
    for (long i = 0; i < n; i++) s += expf(x[i] - m);
    return m + logf(s);
}

#endif

/* ==== conv / pool / batch-norm kernel bodies (owner: ops_conv.c, ops_norm.c) ====
 * One image plane (or one channel) per call, so a CUDA backend can run them
 * one thread block per (sample, channel) and the CPU backend loops over
 * planes. Sizes are `long`; geometry follows PyTorch (NCHW, row-major).
 * Hot loops run in fixed blocks of 8 with a scalar tail: GCC's -O2 cost
 * model vectorises only loops whose trip count it knows, and the blocks
 * also fix the summation order of the sums. */
#ifndef LK_KERNELS_CONV_SECTION
#define LK_KERNELS_CONV_SECTION

#ifdef __CUDACC__
#define LK_KC_RESTRICT __restrict__
#else
#define LK_KC_RESTRICT restrict
#endif

LK_KERNEL void lk_k_row_copy(float *LK_KC_RESTRICT y, const float *LK_KC_RESTRICT x, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] = x[i + k];
    for (; i < n; i++) y[i] = x[i];
}

LK_KERNEL void lk_k_row_acc(float *LK_KC_RESTRICT y, const float *LK_KC_RESTRICT x, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] += x[i + k];
    for (; i < n; i++) y[i] += x[i];
}

LK_KERNEL void lk_k_row_zero(float *y, long n) {
    for (long i = 0; i < n; i++) y[i] = 0.0f;
}

/* Zeroes columns [0, lo) and [hi, OW) of `rows` rows of width OW (the
 * padding columns; strided loops, since GCC would turn a tiny row loop into
 * a memset call). */
LK_KERNEL void lk_k_zero_edges(float *r, long rows, long OW, long lo, long hi) {
    for (long t = 0; t < lo; t++)
        for (long q = 0; q < rows; q++) r[q * OW + t] = 0.0f;
    for (long t = hi; t < OW; t++)
        for (long q = 0; q < rows; q++) r[q * OW + t] = 0.0f;
}

/* Output positions o in [0, n_out) with 0 <= o * s + off < n_in: [*lo, *hi). */
LK_KERNEL void lk_k_valid_range(long off, long s, long n_in, long n_out, long *lo, long *hi) {
    long l = off >= 0 ? 0 : (-off + s - 1) / s;
    long h = (n_in - 1 - off) < 0 ? 0 : (n_in - 1 - off) / s + 1;
    if (h > n_out) h = n_out;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* im2col for one input plane x[H, W]: row r = ki * kw + kj of `cols` (rows
 * `ldc` floats apart, OH * OW used) gets x[oh * sh - ph + ki * dh,
 * ow * sw - pw + kj * dw] for every output position, 0 in the padding. */
LK_KERNEL void lk_k_im2col_plane(const float *LK_KC_RESTRICT x, long H, long W, long kh, long kw, long sh, long sw,
                                 long ph, long pw, long dh, long dw, long OH, long OW, float *LK_KC_RESTRICT cols,
                                 long ldc) {
    /* "same" geometry (stride 1, OW == W): the rows of a kernel tap are one
     * contiguous run of x shifted by the tap offset; copy it whole, then
     * zero the positions that wrapped around a row edge. */
    int same = sh == 1 && sw == 1 && OW == W;
    for (long ki = 0; ki < kh; ki++) {
        long oh_lo, oh_hi;
        lk_k_valid_range(ki * dh - ph, sh, H, OH, &oh_lo, &oh_hi);
        for (long kj = 0; kj < kw; kj++) {
            float *row = cols + (ki * kw + kj) * ldc;
            long off_w = kj * dw - pw, lo, hi;
            lk_k_valid_range(off_w, sw, W, OW, &lo, &hi);
            lk_k_row_zero(row, oh_lo * OW);
            if (same && oh_hi > oh_lo) {
                long base = (oh_lo - ph + ki * dh) * W + off_w, n = (oh_hi - oh_lo) * OW;
                long a = base < 0 ? -base : 0, b = base + n > H * W ? H * W - base : n;
                float *r = row + oh_lo * OW;
                lk_k_row_zero(r, a);
                lk_k_row_copy(r + a, x + base + a, b - a);
                lk_k_row_zero(r + b, n - b);
                lk_k_zero_edges(r, oh_hi - oh_lo, OW, lo, hi);
            } else {
                for (long oh = oh_lo; oh < oh_hi; oh++) {
                    float *r = row + oh * OW;
                    const float *xr = x + (oh * sh - ph + ki * dh) * W + off_w;
                    lk_k_row_zero(r, lo);
                    if (sw == 1)
                        lk_k_row_copy(r + lo, xr + lo, hi - lo);
                    else
                        for (long ow = lo; ow < hi; ow++) r[ow] = xr[ow * sw];
                    lk_k_row_zero(r + hi, OW - hi);
                }
            }
            lk_k_row_zero(row + oh_hi * OW, (OH - oh_hi) * OW);
        }
    }
}

/* The adjoint of lk_k_im2col_plane: dx[H, W] += the kh * kw rows of dcols
 * scattered back to the input positions they were read from. dcols is
 * scratch: in the "same" geometry its padding entries are zeroed so that
 * each tap adds one contiguous run. */
LK_KERNEL void lk_k_col2im_plane(float *LK_KC_RESTRICT dcols, long ldc, long H, long W, long kh, long kw, long sh,
                                 long sw, long ph, long pw, long dh, long dw, long OH, long OW,
                                 float *LK_KC_RESTRICT dx) {
    int same = sh == 1 && sw == 1 && OW == W;
    for (long ki = 0; ki < kh; ki++) {
        long oh_lo, oh_hi;
        lk_k_valid_range(ki * dh - ph, sh, H, OH, &oh_lo, &oh_hi);
        for (long kj = 0; kj < kw; kj++) {
            float *row = dcols + (ki * kw + kj) * ldc;
            long off_w = kj * dw - pw, lo, hi;
            lk_k_valid_range(off_w, sw, W, OW, &lo, &hi);
            if (same && oh_hi > oh_lo) {
                long base = (oh_lo - ph + ki * dh) * W + off_w, n = (oh_hi - oh_lo) * OW;
                long a = base < 0 ? -base : 0, b = base + n > H * W ? H * W - base : n;
                float *r = row + oh_lo * OW;
                lk_k_zero_edges(r, oh_hi - oh_lo, OW, lo, hi);
                lk_k_row_acc(dx + base + a, r + a, b - a);
                continue;
            }
            for (long oh = oh_lo; oh < oh_hi; oh++) {
                const float *r = row + oh * OW;
                float *xr = dx + (oh * sh - ph + ki * dh) * W + off_w;
                if (sw == 1)
                    lk_k_row_acc(xr + lo, r + lo, hi - lo);
                else
                    for (long ow = lo; ow < hi; ow++) xr[ow * sw] += r[ow];
            }
        }
    }
}

/* Sums over one (sample, channel) plane of S elements, in 8 lanes. */
LK_KERNEL float lk_k_plane_sum(const float *x, long S) {
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0.0f;
    long i = 0;
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) a[k] += x[i + k];
    for (; i < S; i++) s += x[i];
    return s + ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Max pooling of one plane; idx[o] = ih * W + iw of the maximum (the first
 * one; a NaN wins and propagates, as in PyTorch). */
LK_KERNEL void lk_k_max_pool_plane(const float *x, long H, long W, long kh, long kw, long sh, long sw, long ph,
                                   long pw, long OH, long OW, float *y, int *idx) {
    for (long oh = 0; oh < OH; oh++) {
        long h0 = oh * sh - ph, h1 = h0 + kh < H ? h0 + kh : H;
        h0 = h0 > 0 ? h0 : 0;
        for (long ow = 0; ow < OW; ow++) {
            long w0 = ow * sw - pw, w1 = w0 + kw < W ? w0 + kw : W;
            w0 = w0 > 0 ? w0 : 0;
            /* Branch-free (the position of a maximum in random data defeats
             * the branch predictor): the max, then the first index holding
             * it found from the back; a window with a NaN takes the exact
             * PyTorch loop (its last NaN wins). */
            float m = -INFINITY;
            int nan = 0;
            for (long ih = h0; ih < h1; ih++)
                for (long iw = w0; iw < w1; iw++) {
                    float v = x[ih * W + iw];
                    m = v > m ? v : m;
                    nan |= v != v;
                }
            long mi = h0 * W + w0;
            if (!nan) {
                for (long ih = h1 - 1; ih >= h0; ih--)
                    for (long iw = w1 - 1; iw >= w0; iw--) mi = x[ih * W + iw] == m ? ih * W + iw : mi;
            } else {
                m = -INFINITY;
                for (long ih = h0; ih < h1; ih++)
                    for (long iw = w0; iw < w1; iw++) {
                        float v = x[ih * W + iw];
                        if (v > m || v != v) {
                            m = v;
                            mi = ih * W + iw;
                        }
                    }
            }
            y[oh * OW + ow] = m;
            idx[oh * OW + ow] = (int)mi;
        }
    }
}

/* dx[idx[o]] += dy[o] over one plane. */
LK_KERNEL void lk_k_max_pool_backward_plane(const float *dy, const int *idx, long n_out, float *dx) {
    for (long o = 0; o < n_out; o++) dx[idx[o]] += dy[o];
}

/* The window of output (oh, ow) of PyTorch's avg_pool2d and its divisor;
 * returns 0 when the window holds no input element (output 0). */
LK_KERNEL int lk_k_avg_pool_window(long oh, long ow, long H, long W, long kh, long kw, long sh, long sw, long ph,
                                   long pw, int count_include_pad, long *h0, long *h1, long *w0, long *w1,
                                   float *div) {
    long hs = oh * sh - ph, ws = ow * sw - pw;
    long he = hs + kh < H + ph ? hs + kh : H + ph, we = ws + kw < W + pw ? ws + kw : W + pw;
    long pool = (he - hs) * (we - ws);
    hs = hs > 0 ? hs : 0;
    ws = ws > 0 ? ws : 0;
    he = he < H ? he : H;
    we = we < W ? we : W;
    *h0 = hs;
    *h1 = he;
    *w0 = ws;
    *w1 = we;
    if (hs >= he || ws >= we) return 0;
    *div = (float)(count_include_pad ? pool : (he - hs) * (we - ws));
    return 1;
}

LK_KERNEL void lk_k_avg_pool_plane(const float *x, long H, long W, long kh, long kw, long sh, long sw, long ph,
                                   long pw, int count_include_pad, long OH, long OW, float *y) {
    for (long oh = 0; oh < OH; oh++)
        for (long ow = 0; ow < OW; ow++) {
            long h0, h1, w0, w1;
            float div = 1.0f, s = 0.0f;
            if (lk_k_avg_pool_window(oh, ow, H, W, kh, kw, sh, sw, ph, pw, count_include_pad, &h0, &h1, &w0, &w1,
                                     &div))
                for (long ih = h0; ih < h1; ih++)
                    for (long iw = w0; iw < w1; iw++) s += x[ih * W + iw];
            y[oh * OW + ow] = s / div;
        }
}

LK_KERNEL void lk_k_avg_pool_backward_plane(const float *dy, long H, long W, long kh, long kw, long sh, long sw,
                                            long ph, long pw, int count_include_pad, long OH, long OW, float *dx) {
    for (long oh = 0; oh < OH; oh++)
        for (long ow = 0; ow < OW; ow++) {
            long h0, h1, w0, w1;
            float div = 1.0f;
            if (!lk_k_avg_pool_window(oh, ow, H, W, kh, kw, sh, sw, ph, pw, count_include_pad, &h0, &h1, &w0, &w1,
                                      &div))
                continue;
            float g = dy[oh * OW + ow] / div;
            for (long ih = h0; ih < h1; ih++)
                for (long iw = w0; iw < w1; iw++) dx[ih * W + iw] += g;
        }
}

/* PyTorch's adaptive pooling bins: [floor(o * I / O), ceil((o + 1) * I / O)). */
LK_KERNEL long lk_k_adaptive_start(long o, long n_in, long n_out) { return (o * n_in) / n_out; }
LK_KERNEL long lk_k_adaptive_end(long o, long n_in, long n_out) { return ((o + 1) * n_in + n_out - 1) / n_out; }

/* Adaptive average pooling of one plane, and its backward (dx += dy spread
 * evenly over each bin). */
LK_KERNEL void lk_k_adaptive_avg_plane(const float *x, long H, long W, long OH, long OW, float *y) {
    for (long oh = 0; oh < OH; oh++) {
        long h0 = lk_k_adaptive_start(oh, H, OH), h1 = lk_k_adaptive_end(oh, H, OH);
        for (long ow = 0; ow < OW; ow++) {
            long w0 = lk_k_adaptive_start(ow, W, OW), w1 = lk_k_adaptive_end(ow, W, OW);
            float s = 0.0f;
            for (long ih = h0; ih < h1; ih++) s += lk_k_plane_sum(x + ih * W + w0, w1 - w0);
            y[oh * OW + ow] = s / (float)((h1 - h0) * (w1 - w0));
        }
    }
}

LK_KERNEL void lk_k_adaptive_avg_backward_plane(const float *dy, long H, long W, long OH, long OW, float *dx) {
    for (long oh = 0; oh < OH; oh++) {
        long h0 = lk_k_adaptive_start(oh, H, OH), h1 = lk_k_adaptive_end(oh, H, OH);
        for (long ow = 0; ow < OW; ow++) {
            long w0 = lk_k_adaptive_start(ow, W, OW), w1 = lk_k_adaptive_end(ow, W, OW);
            float g = dy[oh * OW + ow] / (float)((h1 - h0) * (w1 - w0));
            for (long ih = h0; ih < h1; ih++)
                for (long iw = w0; iw < w1; iw++) dx[ih * W + iw] += g;
        }
    }
}

LK_KERNEL float lk_k_plane_sqdev(const float *x, long S, float mean) {
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0.0f;
    long i = 0;
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) a[k] += (x[i + k] - mean) * (x[i + k] - mean);
    for (; i < S; i++) s += (x[i] - mean) * (x[i] - mean);
    return s + ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* y = x * scale + shift (x and y distinct). */
LK_KERNEL void lk_k_plane_affine(const float *LK_KC_RESTRICT x, long S, float scale, float shift,
                                 float *LK_KC_RESTRICT y) {
    long i = 0;
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] = x[i + k] * scale + shift;
    for (; i < S; i++) y[i] = x[i] * scale + shift;
}

/* y += v in place. */
LK_KERNEL void lk_k_plane_add_scalar(float *y, long S, float v) {
    long i = 0;
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] += v;
    for (; i < S; i++) y[i] += v;
}

/* sum(dy) and sum(dy * (x - mean)) over the plane, added to *sg and *sgx. */
LK_KERNEL void lk_k_bn_backward_sums(const float *dy, const float *x, long S, float mean, float *sg, float *sgx) {
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ta = 0.0f, tb = 0.0f;
    long i = 0;
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) {
            a[k] += dy[i + k];
            b[k] += dy[i + k] * (x[i + k] - mean);
        }
    for (; i < S; i++) {
        ta += dy[i];
        tb += dy[i] * (x[i] - mean);
    }
    *sg += ta + ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    *sgx += tb + ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
}

/* dx = dy * k1 + (x - mean) * k2 + k0 (the fused training backward, with
 * the per-channel constants folded by the caller). */
LK_KERNEL void lk_k_bn_backward_plane(const float *LK_KC_RESTRICT dy, const float *LK_KC_RESTRICT x, long S,
                                      float mean, float k0, float k1, float k2, float *LK_KC_RESTRICT dx) {
    long i = 0;
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) dx[i + k] = dy[i + k] * k1 + (x[i + k] - mean) * k2 + k0;
    for (; i < S; i++) dx[i] = dy[i] * k1 + (x[i] - mean) * k2 + k0;
}

#endif /* LK_KERNELS_CONV_SECTION */

/* ==== softmax / cross-entropy / BCE / layer-norm kernel bodies
 *      (owner: autograd/ops_softmax.c, autograd/ops_layers.c) ====
 * Row loops run in blocks of 8 independent lanes with a scalar tail: a fixed
 * 8-wide block vectorises at any optimisation level (GCC's -O2 cost model
 * refuses loops of unknown trip count), and the lanes fix the summation
 * order, so results do not depend on the ISA or the compiler's choices. The
 * block bound is written n - n % 8 so that GCC does not warn about the tail
 * once n is a constant after inlining. */
#ifndef LK_KERNELS_OPS_A_SECTION
#define LK_KERNELS_OPS_A_SECTION

#include <stdint.h>

#define LK_K_LANES 8
#ifdef __CUDACC__
#define LK_K_RESTRICT __restrict__
#else
#define LK_K_RESTRICT restrict
#endif

/* exp(x) in plain arithmetic (no libm call, no floorf), so a block of them
 * vectorises: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, with n
 * rounded by the 1.5 * 2^23 trick, and Cephes' degree-6 polynomial. Max
 * relative error 1e-7 (< 2 ulp) on [-87.5, 88.5] (tests/autograd/test_ops_a.c
 * sweeps it); 0 below -87.5 (so exp(-inf) = 0 for masked rows), +inf above
 * 88.5, NaN stays NaN. */
LK_KERNEL float lk_k_expf(float x) {
    float xc = x >= -87.5f ? x : -87.5f; /* also maps NaN to a finite value before the int cast */
    xc = xc <= 88.5f ? xc : 88.5f;
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int i; float f; } s;
    s.i = ((n > 127.0f ? 127 : (int)n) + 127) << 23; /* 2^n for n in [-126, 127] */
    float y = p * s.f;
    y = n > 127.0f ? y * 2.0f : y; /* n = 128 near the overflow edge */
    y = x < -87.5f ? 0.0f : y;
    y = x > 88.5f ? INFINITY : y;
    return x != x ? x : y;
}

LK_KERNEL float lk_k_max8(const float *x, long n) {
    float m[LK_K_LANES];
    for (int j = 0; j < LK_K_LANES; j++) m[j] = -INFINITY;
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    float r = m[0];
    for (int j = 1; j < LK_K_LANES; j++) r = m[j] > r ? m[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

LK_KERNEL float lk_k_sum8(const float *x, long n) {
    float a[LK_K_LANES] = {0};
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) a[j] += x[i + j];
    float r = 0.0f;
    for (int j = 0; j < LK_K_LANES; j++) r += a[j];
    for (; i < n; i++) r += x[i];
    return r;
}

/* sum(x * y) over n elements. */
LK_KERNEL float lk_k_dot8(const float *x, const float *y, long n) {
    float a[LK_K_LANES] = {0};
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) a[j] += x[i + j] * y[i + j];
    float r = 0.0f;
    for (int j = 0; j < LK_K_LANES; j++) r += a[j];
    for (; i < n; i++) r += x[i] * y[i];
    return r;
}

/* y = exp(x - m); returns sum(y). The exp polynomial is a long dependent
 * chain, so the main loop takes 16 lanes at once (1.7x faster than 8 on the
 * AVX-512 build machine); rows shorter than 16 still get an 8-lane block. */
LK_KERNEL float lk_k_exp_sum8(const float *LK_K_RESTRICT x, float *LK_K_RESTRICT y, long n, float m) {
    float a[2 * LK_K_LANES] = {0};
    long i = 0;
    for (; i < n - n % (2 * LK_K_LANES); i += 2 * LK_K_LANES)
        for (int j = 0; j < 2 * LK_K_LANES; j++) {
            float e = lk_k_expf(x[i + j] - m);
            y[i + j] = e;
            a[j] += e;
        }
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) {
            float e = lk_k_expf(x[i + j] - m);
            y[i + j] = e;
            a[j] += e;
        }
    float r = 0.0f;
    for (int j = 0; j < 2 * LK_K_LANES; j++) r += a[j];
    for (; i < n; i++) {
        float e = lk_k_expf(x[i] - m);
        y[i] = e;
        r += e;
    }
    return r;
}

/* y = x * s + b. */
LK_KERNEL void lk_k_axpb8(const float *LK_K_RESTRICT x, float *LK_K_RESTRICT y, long n, float s, float b) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] = x[i + j] * s + b;
    for (; i < n; i++) y[i] = x[i] * s + b;
}

/* y *= s, in place. */
LK_KERNEL void lk_k_scale8(float *y, long n, float s) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] *= s;
    for (; i < n; i++) y[i] *= s;
}

/* y = (x - m) - logs, in that order as PyTorch does: m + logs would round
 * away the small part when the logits are large. */
LK_KERNEL void lk_k_log_softmax_finish8(const float *LK_K_RESTRICT x, float *LK_K_RESTRICT y, long n, float m,
                                        float logs) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] = (x[i + j] - m) - logs;
    for (; i < n; i++) y[i] = (x[i] - m) - logs;
}

/* Softmax (log_out = 0) or log-softmax (log_out = 1) of one contiguous row,
 * max-subtracted as PyTorch does: y = exp(x - m) / sum, or
 * y = (x - m) - log(sum). x and y must not overlap. */
LK_KERNEL void lk_k_softmax_row(const float *x, float *y, long n, int log_out) {
    float m = lk_k_max8(x, n);
    float s = lk_k_exp_sum8(x, y, n, m);
    if (log_out) lk_k_log_softmax_finish8(x, y, n, m, logf(s));
    else lk_k_scale8(y, n, 1.0f / s);
}

/* The same over the middle axis of a [C, inner] block (softmax over a dim
 * that is not the last): lanes run along `inner`. m and s are scratch of
 * `inner` floats each. */
LK_KERNEL void lk_k_softmax_cols(const float *x, float *y, long C, long inner, float *m, float *s, int log_out) {
    for (long j = 0; j < inner; j++) {
        m[j] = -INFINITY;
        s[j] = 0.0f;
    }
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++) m[j] = x[c * inner + j] > m[j] ? x[c * inner + j] : m[j];
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++) {
            float e = lk_k_expf(x[c * inner + j] - m[j]);
            y[c * inner + j] = e;
            s[j] += e;
        }
    for (long j = 0; j < inner; j++) s[j] = log_out ? logf(s[j]) : 1.0f / s[j];
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++)
            y[c * inner + j] = log_out ? (x[c * inner + j] - m[j]) - s[j] : y[c * inner + j] * s[j];
}

/* Backward of a softmax row from its output y and output gradient g:
 * softmax: dx = y * (g - sum(g * y)); log-softmax: dx = g - exp(y) * sum(g). */
LK_KERNEL void lk_k_softmax_backward_row(const float *LK_K_RESTRICT y, const float *LK_K_RESTRICT g,
                                          float *LK_K_RESTRICT dx, long n, int log_out) {
    long i = 0;
    if (log_out) {
        float sg = lk_k_sum8(g, n);
        for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = g[i + j] - lk_k_expf(y[i + j]) * sg;
        for (; i < n; i++) dx[i] = g[i] - lk_k_expf(y[i]) * sg;
    } else {
        float d = lk_k_dot8(g, y, n);
        for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = y[i + j] * (g[i + j] - d);
        for (; i < n; i++) dx[i] = y[i] * (g[i] - d);
    }
}

/* Column form of the above over a [C, inner] block; acc is scratch of `inner`. */
LK_KERNEL void lk_k_softmax_backward_cols(const float *y, const float *g, float *dx, long C, long inner, float *acc,
                                          int log_out) {
    for (long j = 0; j < inner; j++) acc[j] = 0.0f;
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++) acc[j] += log_out ? g[c * inner + j] : g[c * inner + j] * y[c * inner + j];
    for (long c = 0; c < C; c++)
        for (long j = 0; j < inner; j++) {
            long k = c * inner + j;
            dx[k] = log_out ? g[k] - lk_k_expf(y[k]) * acc[j] : y[k] * (g[k] - acc[j]);
        }
}

/* Fused log-softmax + weighted, label-smoothed NLL of one row of C logits z
 * for target t (0 <= t < C), as PyTorch composes it:
 *   nll = -w[t] * logp[t],  smooth = -sum_c w[c] * logp[c]  (w = 1 when NULL)
 * and loss = (1 - eps) * nll + eps / C * smooth (the caller combines, since
 * the mean divides both by the same total weight). Writes the softmax into p
 * (scratch of C floats; exact probabilities only when want_p). */
LK_KERNEL float lk_k_xent_row(const float *z, float *p, long C, long t, float wt, const float *w, float eps,
                              int want_p, float *smooth) {
    float m = lk_k_max8(z, C);
    float s = lk_k_exp_sum8(z, p, C, m);
    float logs = logf(s);
    float nll = -wt * ((z[t] - m) - logs);
    if (eps > 0.0f) {
        /* -sum_c w_c logp_c with -logp_c = (m - z_c) + logs, per element as
         * PyTorch's log_softmax rounds it (m + logs would lose digits). */
        float a[LK_K_LANES] = {0}, r = 0.0f;
        long i = 0;
        if (w) {
            for (; i < C - C % LK_K_LANES; i += LK_K_LANES)
                for (int j = 0; j < LK_K_LANES; j++) a[j] += w[i + j] * ((m - z[i + j]) + logs);
            for (; i < C; i++) r += w[i] * ((m - z[i]) + logs);
        } else {
            for (; i < C - C % LK_K_LANES; i += LK_K_LANES)
                for (int j = 0; j < LK_K_LANES; j++) a[j] += (m - z[i + j]) + logs;
            for (; i < C; i++) r += (m - z[i]) + logs;
        }
        for (int j = 0; j < LK_K_LANES; j++) r += a[j];
        *smooth = r;
    } else {
        *smooth = 0.0f;
    }
    if (want_p) lk_k_scale8(p, C, 1.0f / s);
    return nll;
}

/* Gradient of the row loss above w.r.t. the logits, scaled by coef:
 *   dx_c = coef * (p_c * ((1-eps) w_t + eps/C * W) - (1-eps) w_t [c == t] - eps/C * w_c)
 * where W = sum_c w_c (C when unweighted). */
LK_KERNEL void lk_k_xent_row_grad(const float *LK_K_RESTRICT p, float *LK_K_RESTRICT dx, long C, long t, float wt, const float *w, float W,
                                  float eps, float coef) {
    float es = eps / (float)C;
    float a = coef * ((1.0f - eps) * wt + es * W), b = coef * es;
    long i = 0;
    if (w) {
        for (; i < C - C % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = p[i + j] * a - b * w[i + j];
        for (; i < C; i++) dx[i] = p[i] * a - b * w[i];
    } else {
        for (; i < C - C % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = p[i + j] * a - b;
        for (; i < C; i++) dx[i] = p[i] * a - b;
    }
    dx[t] -= coef * (1.0f - eps) * wt;
}

/* Binary cross-entropy on probabilities, PyTorch's form with each log clamped
 * to >= -100 so x = 0 or 1 gives a finite loss:
 *   loss = (t - 1) * max(log1p(-x), -100) - t * max(log(x), -100). */
LK_KERNEL float lk_k_bce(float x, float t) {
    float l1 = log1pf(-x), l0 = logf(x);
    l1 = l1 > -100.0f ? l1 : -100.0f;
    l0 = l0 > -100.0f ? l0 : -100.0f;
    return (t - 1.0f) * l1 - t * l0;
}
/* d/dx as PyTorch computes it: (x - t) / max((1 - x) x, 1e-12). */
LK_KERNEL float lk_k_bce_dx(float x, float t) {
    float d = (1.0f - x) * x;
    return (x - t) / (d > 1e-12f ? d : 1e-12f);
}
/* d/dt: max(log1p(-x), -100) - max(log(x), -100). */
LK_KERNEL float lk_k_bce_dt(float x) {
    float l1 = log1pf(-x), l0 = logf(x);
    return (l1 > -100.0f ? l1 : -100.0f) - (l0 > -100.0f ? l0 : -100.0f);
}

/* Binary cross-entropy on logits, stable for any x:
 *   loss = (1 - t) x + (1 + (pw - 1) t) softplus(-x),
 *   softplus(-x) = max(-x, 0) + log1p(exp(-|x|))   (pw = 1: no pos_weight). */
LK_KERNEL float lk_k_softplus_neg(float x) {
    float ax = fabsf(x);
    return (x < 0.0f ? -x : 0.0f) + log1pf(expf(-ax));
}
LK_KERNEL float lk_k_bce_logits(float x, float t, float pw) {
    return (1.0f - t) * x + (1.0f + (pw - 1.0f) * t) * lk_k_softplus_neg(x);
}
/* d/dx = (1 + (pw - 1) t) sigmoid(x) - pw t;  d/dt = (pw - 1) softplus(-x) - x. */
LK_KERNEL float lk_k_bce_logits_dx(float x, float t, float pw) {
    float sg = x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
    return (1.0f + (pw - 1.0f) * t) * sg - pw * t;
}
LK_KERNEL float lk_k_bce_logits_dt(float x, float pw) { return (pw - 1.0f) * lk_k_softplus_neg(x) - x; }

/* y = x * w (+ b): the affine part of a normalisation. */
LK_KERNEL void lk_k_mul8(float *LK_K_RESTRICT y, const float *LK_K_RESTRICT w, long n) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] *= w[i + j];
    for (; i < n; i++) y[i] *= w[i];
}
LK_KERNEL void lk_k_add8(float *LK_K_RESTRICT y, const float *LK_K_RESTRICT b, long n) {
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) y[i + j] += b[i + j];
    for (; i < n; i++) y[i] += b[i];
}

/* Layer norm of one row of n: mean, biased variance (two passes, in lanes),
 * y = (x - mean) * rstd * w + b (w, b may be NULL). Returns mean and rstd. */
LK_KERNEL void lk_k_layer_norm_row(const float *x, float *y, long n, const float *w, const float *b, float eps,
                                   float *mean_out, float *rstd_out) {
    float mean = lk_k_sum8(x, n) / (float)n;
    float a[LK_K_LANES] = {0}, var = 0.0f;
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) a[j] += (x[i + j] - mean) * (x[i + j] - mean);
    for (int j = 0; j < LK_K_LANES; j++) var += a[j];
    for (; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)n;
    float rstd = 1.0f / sqrtf(var + eps);
    lk_k_axpb8(x, y, n, rstd, -mean * rstd);
    if (w) lk_k_mul8(y, w, n);
    if (b) lk_k_add8(y, b, n);
    *mean_out = mean;
    *rstd_out = rstd;
}

/* Backward of one layer-norm row (the fused formula): with xh = (x - mean) rstd
 * and dy = g * w (the caller passes dy, i.e. g itself when there is no w),
 *   dx = rstd * (dy - mean(dy) - xh * mean(dy * xh)). */
LK_KERNEL void lk_k_layer_norm_backward_row(const float *LK_K_RESTRICT x, const float *LK_K_RESTRICT dy, float mean,
                                            float rstd, long n, float *LK_K_RESTRICT dx) {
    float s1[LK_K_LANES] = {0}, s2[LK_K_LANES] = {0}, sdy = 0.0f, sdyx = 0.0f;
    long i = 0;
    for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) {
            s1[j] += dy[i + j];
            s2[j] += dy[i + j] * ((x[i + j] - mean) * rstd);
        }
    for (int j = 0; j < LK_K_LANES; j++) {
        sdy += s1[j];
        sdyx += s2[j];
    }
    for (; i < n; i++) {
        sdy += dy[i];
        sdyx += dy[i] * ((x[i] - mean) * rstd);
    }
    float m1 = sdy / (float)n, m2 = sdyx / (float)n;
    for (i = 0; i < n - n % LK_K_LANES; i += LK_K_LANES)
        for (int j = 0; j < LK_K_LANES; j++) dx[i + j] = rstd * (dy[i + j] - m1 - ((x[i + j] - mean) * rstd) * m2);
    for (; i < n; i++) dx[i] = rstd * (dy[i] - m1 - ((x[i] - mean) * rstd) * m2);
}

/* dw += g * (x - mean) rstd and db += g over one row (either may be NULL). */
LK_KERNEL void lk_k_layer_norm_param_grad_row(const float *LK_K_RESTRICT x, const float *LK_K_RESTRICT g, float mean,
                                              float rstd, long n, float *LK_K_RESTRICT dw, float *LK_K_RESTRICT db) {
    long i = 0;
    if (dw) {
        for (; i < n - n % LK_K_LANES; i += LK_K_LANES)
            for (int j = 0; j < LK_K_LANES; j++) dw[i + j] += g[i + j] * ((x[i + j] - mean) * rstd);
        for (; i < n; i++) dw[i] += g[i] * ((x[i] - mean) * rstd);
    }
    if (db) lk_k_add8(db, g, n);
}

/* Philox4x32-10 (the round function of src/core/rng.c) on LK_K_LANES
 * consecutive counters at once, ctr + j with the carry into ctr[1] as
 * lk_rng_u32 advances it; block j's four words land in out[4j .. 4j+3].
 * Lanes in arrays so the 32x32->64 multiplies vectorise; dropout masks come
 * from here (tests check it against lk_philox4x32_10). */
LK_KERNEL void lk_k_philox4x32_10_x8(const uint32_t ctr[4], const uint32_t key[2], uint32_t *out) {
    uint32_t x0[LK_K_LANES], x1[LK_K_LANES], x2[LK_K_LANES], x3[LK_K_LANES], k0 = key[0], k1 = key[1];
    for (int j = 0; j < LK_K_LANES; j++) {
        x0[j] = ctr[0] + (uint32_t)j;
        x1[j] = ctr[1] + (x0[j] < ctr[0] ? 1u : 0u);
        x2[j] = ctr[2];
        x3[j] = ctr[3];
    }
    for (int round = 0; round < 10; round++) {
        for (int j = 0; j < LK_K_LANES; j++) {
            uint64_t p0 = (uint64_t)0xD2511F53u * x0[j], p1 = (uint64_t)0xCD9E8D57u * x2[j];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ x1[j] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ x3[j] ^ k1;
            x0[j] = n0;
            x1[j] = (uint32_t)p1;
            x2[j] = n2;
            x3[j] = (uint32_t)p0;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    for (int j = 0; j < LK_K_LANES; j++) {
        out[4 * j] = x0[j];
        out[4 * j + 1] = x1[j];
        out[4 * j + 2] = x2[j];
        out[4 * j + 3] = x3[j];
    }
}

#endif /* LK_KERNELS_OPS_A_SECTION */

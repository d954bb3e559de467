/* Kernel bodies of the convolution, pooling and batch-norm families. Part of
 * backend/kernels.h (include that: it defines LK_KERNEL). */
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
 * a memset call); f32 and 16-bit elements (+0 is all zero bits in both). */
#define LK_K_ZERO_EDGES(NAME, T)                                                 \
    LK_KERNEL void NAME(T *r, long rows, long OW, long lo, long hi) {            \
        for (long t = 0; t < lo; t++)                                            \
            for (long q = 0; q < rows; q++) r[q * OW + t] = 0;                   \
        for (long t = hi; t < OW; t++)                                           \
            for (long q = 0; q < rows; q++) r[q * OW + t] = 0;                   \
    }
LK_K_ZERO_EDGES(lk_k_zero_edges, float)
LK_K_ZERO_EDGES(lk_k_zero_edges_u16, uint16_t)

/* Output positions o in [0, n_out) with 0 <= o * s + off < n_in: [*lo, *hi). */
LK_KERNEL void lk_k_valid_range(long off, long s, long n_in, long n_out, long *lo, long *hi) {
    long l = off >= 0 ? 0 : (-off + s - 1) / s;
    long h = (n_in - 1 - off) < 0 ? 0 : (n_in - 1 - off) / s + 1;
    if (h > n_out) h = n_out;
    if (l > h) l = h;
    *lo = l;
    *hi = h;
}

/* 16-bit rows (bf16 / f16 bits: +0 is all zero bits, as in f32), for the
 * 16-bit im2col below. */
LK_KERNEL void lk_k_row_copy_u16(uint16_t *LK_KC_RESTRICT y, const uint16_t *LK_KC_RESTRICT x, long n) {
    for (long i = 0; i < n; i++) y[i] = x[i];
}

LK_KERNEL void lk_k_row_zero_u16(uint16_t *y, long n) {
    for (long i = 0; i < n; i++) y[i] = 0;
}


/* im2col for one input plane x[H, W]: row r = ki * kw + kj of `cols` (rows
 * `ldc` elements apart, OH * OW used) gets x[oh * sh - ph + ki * dh,
 * ow * sw - pw + kj * dw] for every output position, 0 in the padding.
 * One body for the element type T and its row helpers (suffix SFX): f32
 * (lk_k_im2col_plane) and 16-bit (lk_k_im2col_plane_u16, the bits of a bf16
 * or f16 activation under autocast, unrolled without widening).
 * "same" geometry (stride 1, OW == W): the rows of a kernel tap are one
 * contiguous run of x shifted by the tap offset; copy it whole, then zero
 * the positions that wrapped around a row edge. */
#define LK_K_IM2COL_PLANE(NAME, T, SFX)                                                                        \
    LK_KERNEL void NAME(const T *LK_KC_RESTRICT x, long H, long W, long kh, long kw, long sh, long sw, long ph, \
                        long pw, long dh, long dw, long OH, long OW, T *LK_KC_RESTRICT cols, long ldc) {       \
        int same = sh == 1 && sw == 1 && OW == W;                                                              \
        for (long ki = 0; ki < kh; ki++) {                                                                     \
            long oh_lo, oh_hi;                                                                                 \
            lk_k_valid_range(ki * dh - ph, sh, H, OH, &oh_lo, &oh_hi);                                         \
            for (long kj = 0; kj < kw; kj++) {                                                                 \
                T *row = cols + (ki * kw + kj) * ldc;                                                          \
                long off_w = kj * dw - pw, lo, hi;                                                             \
                lk_k_valid_range(off_w, sw, W, OW, &lo, &hi);                                                  \
                lk_k_row_zero##SFX(row, oh_lo * OW);                                                           \
                if (same && oh_hi > oh_lo) {                                                                   \
                    long base = (oh_lo - ph + ki * dh) * W + off_w, n = (oh_hi - oh_lo) * OW;                  \
                    long a = base < 0 ? -base : 0, b = base + n > H * W ? H * W - base : n;                    \
                    T *r = row + oh_lo * OW;                                                                   \
                    lk_k_row_zero##SFX(r, a);                                                                  \
                    lk_k_row_copy##SFX(r + a, x + base + a, b - a);                                            \
                    lk_k_row_zero##SFX(r + b, n - b);                                                          \
                    lk_k_zero_edges##SFX(r, oh_hi - oh_lo, OW, lo, hi);                                        \
                } else {                                                                                       \
                    for (long oh = oh_lo; oh < oh_hi; oh++) {                                                  \
                        T *r = row + oh * OW;                                                                  \
                        const T *xr = x + (oh * sh - ph + ki * dh) * W + off_w;                                \
                        lk_k_row_zero##SFX(r, lo);                                                             \
                        if (sw == 1)                                                                           \
                            lk_k_row_copy##SFX(r + lo, xr + lo, hi - lo);                                      \
                        else                                                                                   \
                            for (long ow = lo; ow < hi; ow++) r[ow] = xr[ow * sw];                             \
                        lk_k_row_zero##SFX(r + hi, OW - hi);                                                   \
                    }                                                                                          \
                }                                                                                              \
                lk_k_row_zero##SFX(row + oh_hi * OW, (OH - oh_hi) * OW);                                       \
            }                                                                                                  \
        }                                                                                                      \
    }
LK_K_IM2COL_PLANE(lk_k_im2col_plane, float, )
LK_K_IM2COL_PLANE(lk_k_im2col_plane_u16, uint16_t, _u16)

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

/* The 8-lane sums below as one vector on a host compiler that has GCC's
 * vector extension: lane k of a vector add is a[k] += x[i + k], the same
 * arithmetic in the same order, so the bits do not depend on which runs.
 * GCC 12 turned the 8-lane loops into eight scalar chains fed by shuffles;
 * in ResNet-20's step batch norm's sums ran at a third of the cache's
 * bandwidth. Unaligned loads through memcpy. */
#if defined(__GNUC__) && !defined(__CUDACC__)
#define LK_KC_V8 1
typedef float lk_kc_v8 __attribute__((vector_size(32)));
/* (macros: a function passing a vector by value changes the baseline ABI) */
#define LK_KC_LOAD8(v, p) __builtin_memcpy(&(v), (p), sizeof(lk_kc_v8))
#define LK_KC_LANES(a, v) __builtin_memcpy((a), &(v), sizeof(lk_kc_v8))
#endif

/* An 8-lane sum's end: the tail's sum s plus the lanes, pairwise. */
LK_KERNEL float lk_k_lanes_fold(const float a[8], float s) {
    return s + ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Sums over one (sample, channel) plane of S elements, in 8 lanes. */
LK_KERNEL float lk_k_plane_sum(const float *x, long S) {
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0.0f;
    long i = 0;
#ifdef LK_KC_V8
    lk_kc_v8 v = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= S; i += 8) {
        lk_kc_v8 t;
        LK_KC_LOAD8(t, x + i);
        v += t;
    }
    LK_KC_LANES(a, v);
#else
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) a[k] += x[i + k];
#endif
    for (; i < S; i++) s += x[i];
    return lk_k_lanes_fold(a, s);
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
#ifdef LK_KC_V8
    lk_kc_v8 v = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= S; i += 8) {
        lk_kc_v8 d;
        LK_KC_LOAD8(d, x + i);
        d -= mean;
        v += d * d;
    }
    LK_KC_LANES(a, v);
#else
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) a[k] += (x[i + k] - mean) * (x[i + k] - mean);
#endif
    for (; i < S; i++) s += (x[i] - mean) * (x[i] - mean);
    return lk_k_lanes_fold(a, s);
}

/* y = x * scale + shift (x and y distinct). */
LK_KERNEL void lk_k_plane_affine(const float *LK_KC_RESTRICT x, long S, float scale, float shift,
                                 float *LK_KC_RESTRICT y) {
    long i = 0;
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) y[i + k] = x[i + k] * scale + shift;
    for (; i < S; i++) y[i] = x[i] * scale + shift;
}

/* y = max(0, x * scale + shift): the affine with batch norm's fused ReLU,
 * as the unary ReLU (v > 0 ? v : 0: NaN and -0 give +0). One loop: a
 * second pass over the plane just written cost a fifth of the forward. */
LK_KERNEL void lk_k_plane_affine_relu(const float *LK_KC_RESTRICT x, long S, float scale, float shift,
                                      float *LK_KC_RESTRICT y) {
    for (long i = 0; i < S; i++) {
        float v = x[i] * scale + shift;
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

/* out = y > 0 ? dy : 0: the ReLU's backward from its output y (y > 0
 * exactly where its input was > 0). */
LK_KERNEL void lk_k_plane_relu_mask(const float *LK_KC_RESTRICT dy, const float *LK_KC_RESTRICT y, long S,
                                    float *LK_KC_RESTRICT out) {
    for (long i = 0; i < S; i++) out[i] = y[i] > 0.0f ? dy[i] : 0.0f;
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
#ifdef LK_KC_V8
    lk_kc_v8 va = {0, 0, 0, 0, 0, 0, 0, 0}, vb = va;
    for (; i + 8 <= S; i += 8) {
        lk_kc_v8 g, t;
        LK_KC_LOAD8(g, dy + i);
        LK_KC_LOAD8(t, x + i);
        va += g;
        vb += g * (t - mean);
    }
    LK_KC_LANES(a, va);
    LK_KC_LANES(b, vb);
#else
    for (; i + 8 <= S; i += 8)
        for (int k = 0; k < 8; k++) {
            a[k] += dy[i + k];
            b[k] += dy[i + k] * (x[i + k] - mean);
        }
#endif
    for (; i < S; i++) {
        ta += dy[i];
        tb += dy[i] * (x[i] - mean);
    }
    *sg += lk_k_lanes_fold(a, ta);
    *sgx += lk_k_lanes_fold(b, tb);
}

/* Channel c of [N, C, S] dy and x: sum(dy) and sum(dy * (x - mean)) over
 * the batch and the plane, each plane's f32 sums added in double in order. */
LK_KERNEL void lk_k_bn_channel_grad_sums(const float *dy, const float *x, long N, long C, long S, long c, float mean,
                                         double *sg, double *sgx) {
    double g = 0, gx = 0;
    for (long i = 0; i < N; i++) {
        float a = 0.0f, q = 0.0f;
        lk_k_bn_backward_sums(dy + (i * C + c) * S, x + (i * C + c) * S, S, mean, &a, &q);
        g += a;
        gx += q;
    }
    *sg = g, *sgx = gx;
}

/* Channel c of [N, C, S] x: its sum and its sum of squares (SyncBatchNorm's
 * moments, which add over ranks). The squares are not summed as they are:
 * in f32 planes that loses the variance when the mean is large next to the
 * deviation. They come from the deviations from this batch's own mean m
 * (f32), sum(x^2) = sum((x - m)^2) + m * (2 sum(x) - M m), in double. */
LK_KERNEL void lk_k_bn_channel_moments(const float *x, long N, long C, long S, long c, double *sum, double *sumsq) {
    double s = 0, q = 0, M = (double)N * (double)S;
    for (long i = 0; i < N; i++) s += lk_k_plane_sum(x + (i * C + c) * S, S);
    float m = M > 0 ? (float)(s / M) : 0.0f;
    for (long i = 0; i < N; i++) q += lk_k_plane_sqdev(x + (i * C + c) * S, S, m);
    *sum = s;
    *sumsq = q + (double)m * (2.0 * s - M * (double)m);
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

/* SyncBatchNorm's forward finish for channel c (lk_bn_finish_params): from
 * the reduced sums (sum, sum of squares, count M at sums[2C]) the global
 * mean and invstd into stats [2, C], the running statistics' update (NULL
 * rm: none; rv then unused) and the apply pass's scale and shift into coef
 * [2, C]. The arithmetic, order and roundings of the host code it replaced
 * (ops_norm.c), so the CPU's bits did not move: the variance is the sum of
 * squares less sum * mean in double, clamped at 0 (rounding of a constant
 * channel), biased (over M) to normalise, unbiased (over M - 1) for the
 * running variance; the running statistics move in f32. */
LK_KERNEL void lk_k_bn_finish_channel(const double *sums, long C, long c, float eps, float momentum, const float *w,
                                      int64_t sw, const float *b, int64_t sb, float *rm, int64_t srm, float *rv,
                                      int64_t srv, float *stats, float *coef) {
    double M = sums[2 * C];
    double m = sums[c] / M, q = sums[C + c] - sums[c] * m;
    if (q < 0) q = 0;
    float mean = (float)m, invstd = (float)(1.0 / sqrt(q / M + (double)eps));
    stats[c] = mean;
    stats[C + c] = invstd;
    if (rm) {
        rm[c * srm] = (1.0f - momentum) * rm[c * srm] + momentum * mean;
        rv[c * srv] = (1.0f - momentum) * rv[c * srv] + momentum * (float)(q / (M - 1));
    }
    float scale = invstd * (w ? w[c * sw] : 1.0f);
    coef[c] = scale;
    coef[C + c] = (b ? b[c * sb] : 0.0f) - mean * scale;
}

/* SyncBatchNorm's backward finish for channel c: sums [4C] is this rank's
 * (sum of g, of g (x - mean)) then every rank's; M the forward's global
 * count. db and dw are this rank's (DDP averages them), coef [4, C] the
 * input gradient's mean, k0, k1, k2 from every rank's sums; NULL outputs are
 * not written. The host code's arithmetic, as the forward's. */
LK_KERNEL void lk_k_bn_finish_backward_channel(const double *sums, long C, long c, const float *w, double M,
                                               const float *stats, float *dw, float *db, float *coef) {
    const double *all = sums + 2 * C;
    float is = stats[C + c];
    if (db) db[c] = (float)sums[c];
    if (dw) dw[c] = (float)(sums[C + c] * is);
    if (coef) {
        float k1 = (w ? w[c] : 1.0f) * is;
        coef[c] = stats[c];
        coef[C + c] = (float)(-(double)k1 * all[c] / M);
        coef[2 * C + c] = k1;
        coef[3 * C + c] = (float)(-(double)k1 * is * is * all[C + c] / M);
    }
}

#endif /* LK_KERNELS_CONV_SECTION */

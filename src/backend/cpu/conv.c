/* The CPU backend's convolution loops around its GEMMs (f32; under
 * autocast also 16-bit im2col, a bias added to f32 sums and rounded to a
 * 16-bit output, and the bias gradient of a 16-bit dY): im2col and
 * col2im over a chunk of samples, the bias added while the chunk's GEMM
 * output goes to NCHW, and the bias gradient's per-channel sums. They run on
 * the plane kernels of kernels/conv.h, single-threaded: ops_conv.c already
 * runs one descriptor per chunk inside its own per-sample threaded tasks, so
 * threading here would only oversubscribe the cores. */
#include "backend/cpu/cpu_impl.h"

enum { BIAS_BLOCK = 256 }; /* floats of a 16-bit bias add's sums on the stack */

static inline float half_get(lk_dtype t, const void *p, long i) {
    uint16_t h = ((const uint16_t *)p)[i];
    return t == LK_BF16 ? lk_bf16_bits_to_f32(h) : lk_f16_bits_to_f32(h);
}

lk_status LK_ISA(lk__cpu_conv)(const lk_op_desc *d, void *const *x) {
    switch (d->op) {
    case LK_OP_IM2COL:
        if (d->dtype[0] != LK_F32) { /* bf16/f16 images into columns of that dtype */
            const lk_im2col_params *g = &d->im2col;
            long P = g->OH * g->OW, khw = g->kh * g->kw, HW = g->H * g->W;
            for (long j = 0; j < g->samples; j++)
                for (long c = 0; c < g->C; c++)
                    lk_k_im2col_plane_u16((const uint16_t *)x[0] + (j * g->C + c) * HW, g->H, g->W, g->kh, g->kw, g->sh,
                                     g->sw, g->ph, g->pw, g->dh, g->dw, g->OH, g->OW,
                                     (uint16_t *)x[1] + c * khw * g->ldc + j * P, g->ldc);
            return LK_STATUS_OK;
        }
        /* fall through */
    case LK_OP_COL2IM: {
        const lk_im2col_params *g = &d->im2col;
        long P = g->OH * g->OW, khw = g->kh * g->kw, HW = g->H * g->W;
        for (long j = 0; j < g->samples; j++)
            for (long c = 0; c < g->C; c++) {
                float *img = (float *)x[d->op == LK_OP_IM2COL ? 0 : 1] + (j * g->C + c) * HW;
                float *col = (float *)x[d->op == LK_OP_IM2COL ? 1 : 0] + c * khw * g->ldc + j * P;
                if (d->op == LK_OP_IM2COL)
                    lk_k_im2col_plane(img, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, g->OH,
                                      g->OW, col, g->ldc);
                else
                    lk_k_col2im_plane(col, g->ldc, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw,
                                      g->OH, g->OW, img);
            }
        return LK_STATUS_OK;
    }
    case LK_OP_BIAS_ADD: {
        const lk_bias_params *p = &d->bias;
        if (d->dtype[1] != LK_F32 || d->dtype[2] != LK_F32) { /* f32 sums + a bias of any float dtype, rounded once */
            const float *y = x[0];
            lk_dtype bt = d->dtype[1], ot = d->dtype[2];
            long ld = p->samples * p->P;
            for (long s = 0; s < p->samples; s++)
                for (long o = 0; o < p->O; o++) {
                    float bo = !x[1] ? 0.0f : bt == LK_F32 ? ((const float *)x[1])[o] : half_get(bt, x[1], o);
                    const float *yr = y + o * ld + s * p->P;
                    long off = (s * p->O + o) * p->P;
                    if (ot == LK_F32)
                        for (long i = 0; i < p->P; i++) ((float *)x[2])[off + i] = yr[i] + bo;
                    else /* rounded through the bulk conversion (F16C / AVX-512), a block at a time */
                        for (long i0 = 0; i0 < p->P; i0 += BIAS_BLOCK) {
                            float sum[BIAS_BLOCK];
                            long m = p->P - i0 < BIAS_BLOCK ? p->P - i0 : BIAS_BLOCK;
                            for (long i = 0; i < m; i++) sum[i] = yr[i0 + i] + bo;
                            lk_f32_to_half_n(ot, (uint16_t *)x[2] + off + i0, sum, (size_t)m);
                        }
                }
            return LK_STATUS_OK;
        }
        const float *y = x[0], *b = x[1];
        float *out = x[2];
        if (p->samples == 1 && y == out) { /* in place: the GEMM wrote NCHW already */
            if (b)
                for (long o = 0; o < p->O; o++) lk_k_plane_add_scalar(out + o * p->P, p->P, b[o]);
            return LK_STATUS_OK;
        }
        long ld = p->samples * p->P;
        for (long s = 0; s < p->samples; s++)
            for (long o = 0; o < p->O; o++)
                lk_k_plane_affine(y + o * ld + s * p->P, p->P, 1.0f, b ? b[o] : 0.0f, out + (s * p->O + o) * p->P);
        return LK_STATUS_OK;
    }
    case LK_OP_CHANNEL_SUM: {
        const lk_bias_params *p = &d->bias;
        const float *dy = x[0];
        float *db = x[1];
        if (d->dtype[0] != LK_F32) { /* a bf16/f16 dY: each plane widened, then the same f32 plane sums */
            float *buf = lk_malloc((size_t)(p->P > 0 ? p->P : 1) * sizeof *buf);
            if (!buf) return LK_STATUS_OUT_OF_MEMORY;
            for (long s = 0; s < p->samples; s++)
                for (long o = 0; o < p->O; o++) {
                    lk_half_to_f32_n(d->dtype[0], buf, (const uint16_t *)x[0] + (s * p->O + o) * p->P, (size_t)p->P);
                    db[o] += lk_k_plane_sum(buf, p->P);
                }
            lk_free(buf);
            return LK_STATUS_OK;
        }
        for (long s = 0; s < p->samples; s++)
            for (long o = 0; o < p->O; o++) db[o] += lk_k_plane_sum(dy + (s * p->O + o) * p->P, p->P);
        return LK_STATUS_OK;
    }
    default: break;
    }
    return lk_error(LK_STATUS_INTERNAL, "cpu backend: op %d is not a convolution op", (int)d->op);
}

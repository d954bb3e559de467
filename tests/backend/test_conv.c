/* The convolution's descriptors around its GEMMs (LK_OP_IM2COL,
 * LK_OP_COL2IM, LK_OP_BIAS_ADD, LK_OP_CHANNEL_SUM) on the CPU backend
 * against plain reference loops written from their definitions. The data
 * are small integers, so every sum is exact whatever order a kernel adds in
 * and the comparison is bit for bit. Two geometries: strided and dilated
 * (the general path) and stride 1 with OW == W (the kernels' "same" path). */
#include <string.h>

#include "backend/backend_impl.h"
#include "lk_test.h"

#define S 2 /* samples per chunk */
#define C 3

static float xs[S * C * 8 * 9], cols[C * 9 * S * 72], ref[C * 9 * S * 72], dx[S * C * 8 * 9], dref[S * C * 8 * 9];

static void geometry(lk_im2col_params *g, long H, long W, long kh, long kw, long sh, long sw, long ph, long pw,
                     long dh, long dw) {
    *g = (lk_im2col_params){S, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, 0, 0, 0};
    g->OH = (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1;
    g->OW = (W + 2 * pw - dw * (kw - 1) - 1) / sw + 1;
    g->ldc = S * g->OH * g->OW;
}

/* The column entry of (sample s, channel c, tap i j, output oh ow) is the
 * input under that tap, or 0 in the padding; col2im adds it back there. */
static void reference(const lk_im2col_params *g, const float *x, float *col, const float *dcol, float *d) {
    long P = g->OH * g->OW;
    for (long s = 0; s < S; s++)
        for (long c = 0; c < C; c++)
            for (long i = 0; i < g->kh; i++)
                for (long j = 0; j < g->kw; j++)
                    for (long oh = 0; oh < g->OH; oh++)
                        for (long ow = 0; ow < g->OW; ow++) {
                            long ih = oh * g->sh - g->ph + i * g->dh, iw = ow * g->sw - g->pw + j * g->dw;
                            long at = ((c * g->kh + i) * g->kw + j) * g->ldc + s * P + oh * g->OW + ow;
                            bool in = ih >= 0 && ih < g->H && iw >= 0 && iw < g->W;
                            long xi = ((s * C + c) * g->H + ih) * g->W + iw;
                            col[at] = in ? x[xi] : 0.0f;
                            if (in) d[xi] += dcol[at];
                        }
}

static void im2col_col2im_geometry(lk_im2col_params g, const char *what) {
    long n = S * C * g.H * g.W, ncols = C * g.kh * g.kw * g.ldc;
    for (long i = 0; i < n; i++) xs[i] = (float)((i * 7) % 13) - 6.0f;
    lk_op_desc d = {.op = LK_OP_IM2COL, .dtype = {LK_F32, LK_F32}, .im2col = g};
    memset(cols, 0xff, sizeof cols); /* every entry must be written, padding included */
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){xs, cols}));
    float dcol[sizeof ref / sizeof *ref];
    for (long i = 0; i < ncols; i++) dcol[i] = (float)((i * 5) % 11) - 5.0f;
    memset(dref, 0, sizeof dref);
    for (long i = 0; i < n; i++) dref[i] = 1.0f; /* col2im adds into dx */
    reference(&g, xs, ref, dcol, dref);
    CHECK_MSG(memcmp(cols, ref, (size_t)ncols * sizeof *ref) == 0, "%s: im2col differs from the reference", what);
    for (long i = 0; i < n; i++) dx[i] = 1.0f;
    d.op = LK_OP_COL2IM;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){dcol, dx}));
    CHECK_MSG(memcmp(dx, dref, (size_t)n * sizeof *dx) == 0, "%s: col2im differs from the reference", what);
    /* bf16 images into bf16 columns (autocast's 16-bit activations): the same
     * gather on 16-bit elements, +0 in the padding (the values are exact in bf16) */
    static uint16_t xh[sizeof xs / sizeof *xs], colh[sizeof cols / sizeof *cols];
    lk_f32_to_half_n(LK_BF16, xh, xs, (size_t)n);
    memset(colh, 0xff, sizeof colh);
    d.op = LK_OP_IM2COL, d.dtype[0] = d.dtype[1] = LK_BF16;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){xh, colh}));
    for (long i = 0; i < ncols; i++)
        CHECK_MSG(colh[i] == lk_f32_to_bf16_bits(ref[i]), "%s: bf16 im2col at %ld", what, i);
}

static void im2col_col2im(void) {
    lk_im2col_params g;
    geometry(&g, 8, 9, 3, 2, 2, 1, 1, 0, 1, 2);
    im2col_col2im_geometry(g, "strided, dilated");
    geometry(&g, 6, 7, 3, 3, 1, 1, 1, 1, 1, 1);
    im2col_col2im_geometry(g, "same");
}

/* bias_add scatters [O, samples*P] to [samples, O, P] adding b[o] (in place
 * for one sample); channel_sum adds every plane of o into db[o]. */
static void bias_add_channel_sum(void) {
    enum { O = 4, P = 5 };
    float y[O * S * P], b[O], out[S * O * P], db[O];
    for (int i = 0; i < O * S * P; i++) y[i] = (float)(i % 9) - 4.0f;
    for (int o = 0; o < O; o++) b[o] = (float)o - 1.5f;
    lk_op_desc d = {.op = LK_OP_BIAS_ADD, .dtype = {LK_F32, LK_F32, LK_F32}, .bias = {S, O, P}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){y, b, out}));
    for (int s = 0; s < S; s++)
        for (int o = 0; o < O; o++)
            for (int p = 0; p < P; p++)
                CHECK_MSG(out[(s * O + o) * P + p] == y[o * S * P + s * P + p] + b[o], "bias_add s %d o %d p %d", s, o,
                          p);
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){y, NULL, out})); /* no bias: the scatter alone */
    CHECK(out[(1 * O + 2) * P + 3] == y[2 * S * P + 1 * P + 3]);
    float one[O * P];
    memcpy(one, y, sizeof one);
    d.bias.samples = 1;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){one, b, one}));
    for (int i = 0; i < O * P; i++) CHECK_MSG(one[i] == y[i] + b[i / P], "in-place bias_add at %d", i);

    for (int o = 0; o < O; o++) db[o] = 10.0f;
    lk_op_desc s = {.op = LK_OP_CHANNEL_SUM, .dtype = {LK_F32, LK_F32}, .bias = {S, O, P}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &s, (void *[]){y, db})); /* y read as [S, O, P] here */
    for (int o = 0; o < O; o++) {
        float want = 10.0f;
        for (int k = 0; k < S; k++)
            for (int p = 0; p < P; p++) want += y[(k * O + o) * P + p];
        CHECK_MSG(db[o] == want, "channel_sum o %d: %g, expected %g", o, db[o], want);
    }
    /* a bf16 dY (autocast): each plane widened, the same f32 sums */
    uint16_t yh[O * S * P];
    lk_f32_to_half_n(LK_BF16, yh, y, O * S * P);
    float dbh[O];
    for (int o = 0; o < O; o++) dbh[o] = 10.0f;
    s.dtype[0] = LK_BF16;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &s, (void *[]){yh, dbh}));
    for (int o = 0; o < O; o++) CHECK_MSG(dbh[o] == db[o], "bf16 channel_sum o %d: %g, expected %g", o, dbh[o], db[o]);
    /* the gradient is f32: a bf16 db is named as unsupported */
    s.dtype[1] = LK_BF16;
    CHECK_ERR(lk__backend_run(LK_DEVICE_CPU, &s, (void *[]){yh, db}), LK_STATUS_UNSUPPORTED,
              "the cpu backend has no channel_sum bf16 -> bf16 (2x4x5)");
    /* f32 sums + a bf16 bias into a bf16 output: widened bias added in f32, rounded once */
    float yf[O * S * P];
    uint16_t bh[O], outh[S * O * P];
    for (int i = 0; i < O * S * P; i++) yf[i] = 1.0f + (float)i / 256.0f; /* not all exact in bf16 */
    for (int o = 0; o < O; o++) bh[o] = lk_f32_to_bf16_bits(0.5f + (float)o / 3.0f);
    lk_op_desc bd = {.op = LK_OP_BIAS_ADD, .dtype = {LK_F32, LK_BF16, LK_BF16}, .bias = {S, O, P}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &bd, (void *[]){yf, bh, outh}));
    for (int k = 0; k < S; k++)
        for (int o = 0; o < O; o++)
            for (int q = 0; q < P; q++) {
                float want = yf[o * S * P + k * P + q] + lk_bf16_bits_to_f32(bh[o]);
                CHECK_MSG(outh[(k * O + o) * P + q] == lk_f32_to_bf16_bits(want), "bf16 bias_add at %d %d %d", k, o, q);
            }
}

LK_TEST_MAIN(LK_TEST_CASE(im2col_col2im), LK_TEST_CASE(bias_add_channel_sum))

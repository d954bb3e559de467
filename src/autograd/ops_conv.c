/* conv2d and the 2-D pools (max, avg, adaptive avg) on NCHW f32, bf16 or f16, each with
 * its backward and PyTorch's exact semantics: output sizes, zero padding,
 * dilation, groups, ceil_mode, count_include_pad, adaptive bins.
 *
 * conv2d is im2col + GEMM through the backend vtable, one GEMM per group per
 * chunk of samples. A chunk is one sample when its image gives a GEMM at
 * least CONV_CHUNK_COLS wide (MNIST's 28x28 and 14x14 maps): the GEMM then
 * writes NCHW output directly. Smaller maps put `nb` samples' columns side by
 * side in one [C*kh*kw, nb*OH*OW] scratch matrix and scatter the [O,
 * nb*OH*OW] result to NCHW, adding the bias on the way. A 1x1, stride-1,
 * unpadded convolution skips im2col and multiplies the input planes
 * directly. Backward recomputes the columns (cheaper than keeping them per
 * layer): dW += dY * cols^T, dX = col2im(W^T * dY), db sums dY. Scratch
 * tensors come from the storage pool, so a repeated step allocates nothing.
 *
 * Under autocast (lk_autocast_enter(LK_BF16 or LK_F16)) conv2d is on the
 * lower list, as in torch: the GEMMs multiply operands of the region's
 * dtype D — the weight rounded once per call (or used as is when it is D),
 * a D input unrolled by a D im2col with no copy, an f32 input unrolled in
 * f32 and rounded by an LK_OP_COPY cast — products accumulated in f32 into
 * a per-task f32 scratch, the bias (rounded to D, as torch's) added to the
 * f32 sums and the output rounded once to D. Backward: dY (already D) feeds
 * the D GEMMs; dX and dW are f32 sums, rounded by lk__accum to the input's
 * and the weight's own dtypes (f32 master weights get f32 gradients, a
 * bf16 weight a bf16 one); db is the f32 sum of dY. Outside autocast,
 * input, weight and bias all bf16 (or all f16) run the same way in their
 * dtype (torch runs a bf16 module so); a mix of f32 and 16-bit operands is
 * an error naming them. The dtype is taken at forward time and kept in the
 * node (the rounded weight), so backward multiplies as forward did whatever
 * region it runs in. With every operand f32 outside autocast the f32 path
 * is unchanged, bit for bit. */
#include <string.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

/* ---- conv2d ------------------------------------------------------------------------ */

typedef struct {
    long N, C, H, W, O, kh, kw, OH, OW, G, Cg, Og, Kg, K, P;
    long sh, sw, ph, pw, dh, dw;
    bool pointwise; /* 1x1, stride 1, no padding: the input planes are the columns */
    long nb;        /* samples per chunk */
    long nchunks;   /* chunks of nb samples (the last may be short) */
    long cols_n, out_n; /* one chunk's im2col columns [K, nb*P] and output [O, nb*P], in elements */
} conv_geom;

/* Minimum GEMM width (columns) per chunk. Measured on one AVX-512 AMD EPYC core
 * with OpenBLAS: one sample per GEMM is as fast as any wider chunk once a sample
 * has >= ~200 output pixels (14x14, 28x28) — wider chunks only add the NCHW
 * scatter and leave the cache — while 7x7 and 4x4 maps gain ~20% from
 * batching 5..16 samples per GEMM. */
#define CONV_CHUNK_COLS 256

static void conv_geom_init(conv_geom *g, const lk_tensor *x, const lk_tensor *w, const int64_t *a) {
    g->N = x->shape[0], g->C = x->shape[1], g->H = x->shape[2], g->W = x->shape[3];
    g->O = w->shape[0], g->kh = w->shape[2], g->kw = w->shape[3];
    g->sh = a[0], g->sw = a[1], g->ph = a[2], g->pw = a[3], g->dh = a[4], g->dw = a[5], g->G = a[6];
    g->OH = (g->H + 2 * g->ph - g->dh * (g->kh - 1) - 1) / g->sh + 1;
    g->OW = (g->W + 2 * g->pw - g->dw * (g->kw - 1) - 1) / g->sw + 1;
    g->Cg = g->C / g->G, g->Og = g->O / g->G;
    g->Kg = g->Cg * g->kh * g->kw, g->K = g->C * g->kh * g->kw, g->P = g->OH * g->OW;
    g->pointwise = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
    long nb = g->P ? CONV_CHUNK_COLS / g->P : 1;
    if (g->pointwise || nb < 1) nb = 1;
    if (nb > g->N) nb = g->N > 0 ? g->N : 1;
    g->nb = nb;
    g->nchunks = (g->N + nb - 1) / nb;
    g->cols_n = g->K * nb * g->P, g->out_n = g->O * nb * g->P;
}

static lk_status im2col_chunk(lk_device dev, const conv_geom *g, lk_dtype xt, const void *x, long n0, long cur,
                              void *cols);

/* Element offset `i` into an array of `lowp` (LK_F32, LK_BF16 or LK_F16) elements. */
static inline const void *elem_at(const void *p, lk_dtype lowp, long i) {
    return (const char *)p + (size_t)i * (lowp == LK_F32 ? 4 : 2);
}

/* One GEMM of the convolution: C[M,N] (f32) = op(A) op(B) + beta C, with A
 * and B both f32 or both the autocast dtype. The f32 descriptor is the one
 * lk__gemm_f32 builds, so f32 mode runs exactly as before. */
static lk_status conv_gemm(lk_device dev, lk_dtype ab, bool ta, bool tb, long M, long N, long K, const void *A,
                           long lda, const void *B, long ldb, float beta, float *C, long ldc) {
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {ab, ab, LK_F32}};
    d.gemm = (lk_gemm_params){ta, tb, M, N, K, lda, ldb, ldc, 1.0f, beta};
    return lk__backend_run(dev, &d, (void *[]){(void *)A, (void *)B, C});
}

/* A worker task's failed GEMM, kept for the caller (the first one wins). */
static void note_failure(lk_status *slot, lk_status st) {
    lk_status none = LK_STATUS_OK;
    if (st) __atomic_compare_exchange_n(slot, &none, st, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

/* n contiguous elements of `from` rounded to `to` (an LK_OP_COPY cast). */
static lk_status cast_run(lk_device dev, lk_dtype from, const void *src, lk_dtype to, void *dst, long n) {
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {from, to}};
    d.copy = (lk_copy_params){1, {n}, {1}, {1}, false};
    return lk__backend_run(dev, &d, (void *[]){(void *)src, dst});
}

/* The B operand of one chunk's GEMMs, in the GEMM dtype `lowp`: the columns
 * (or, pointwise, the input planes) of x, whose dtype xt is f32 or lowp. An
 * f32 x under autocast is unrolled into the f32 `cols` and rounded into
 * `lcols`; a 16-bit x is unrolled into `lcols` directly (pointwise: used as
 * it is). *ld gets B's leading dimension. */
static const void *chunk_cols(lk_device dev, lk_status *st, const conv_geom *g, lk_dtype xt, const void *x, long n0,
                              long cur, float *cols, lk_dtype lowp, void *lcols, long *ld) {
    *ld = g->P;
    if (g->pointwise) {
        const void *B = elem_at(x, xt, n0 * g->C * g->P);
        if (xt == lowp) return B;
        note_failure(st, cast_run(dev, xt, B, lowp, lcols, g->K * g->P)); /* pointwise: cur = 1, K = C */
        return lcols;
    }
    *ld = cur * g->P;
    if (xt == lowp) {
        void *dst = lowp == LK_F32 ? (void *)cols : lcols;
        note_failure(st, im2col_chunk(dev, g, xt, x, n0, cur, dst));
        return dst;
    }
    note_failure(st, im2col_chunk(dev, g, LK_F32, x, n0, cur, cols));
    note_failure(st, cast_run(dev, LK_F32, cols, lowp, lcols, g->K * *ld));
    return lcols;
}

/* The im2col / col2im descriptor of the chunk of `cur` samples: columns
 * [K, cur*P], sample j of the chunk in columns [j*P, (j+1)*P). */
static lk_op_desc cols_desc(lk_op_kind op, const conv_geom *g, long cur) {
    lk_op_desc d = {.op = op, .dtype = {LK_F32, LK_F32}};
    d.im2col = (lk_im2col_params){cur,   g->C,  g->H,  g->W,  g->kh, g->kw, g->sh, g->sw,
                                  g->ph, g->pw, g->dh, g->dw, g->OH, g->OW, cur * g->P};
    return d;
}

static lk_status im2col_chunk(lk_device dev, const conv_geom *g, lk_dtype xt, const void *x, long n0, long cur,
                              void *cols) {
    lk_op_desc d = cols_desc(LK_OP_IM2COL, g, cur);
    d.dtype[0] = d.dtype[1] = xt;
    return lk__backend_run(dev, &d, (void *[]){(void *)elem_at(x, xt, n0 * g->C * g->H * g->W), cols});
}

static lk_status col2im_chunk(lk_device dev, const conv_geom *g, float *cols, long n0, long cur, float *dx) {
    lk_op_desc d = cols_desc(LK_OP_COL2IM, g, cur);
    return lk__backend_run(dev, &d, (void *[]){cols, dx + n0 * g->C * g->H * g->W});
}

/* out[cur, O, P] = y[O, cur*P] + b (b may be NULL; y == out when cur == 1,
 * f32 only); under autocast b and out are 16-bit, out rounded once. */
static lk_status bias_add_chunk(lk_device dev, const conv_geom *g, long cur, const float *y, lk_dtype bt,
                                const void *b, lk_dtype ot, void *out) {
    lk_op_desc d = {.op = LK_OP_BIAS_ADD, .dtype = {LK_F32, b ? bt : LK_F32, ot}};
    d.bias = (lk_bias_params){cur, g->O, g->P};
    return lk__backend_run(dev, &d, (void *[]){(void *)y, (void *)b, out});
}

/* ---- conv2d through oneDNN (lk__cpu_conv_dnnl) --------------------------------------------
 * On the CPU backend a convolution first goes to oneDNN's direct kernels
 * (LK_CONV, backend_impl.h), each task of lockstep's pool convolving its own
 * contiguous run of samples with a single-threaded primitive; where oneDNN
 * takes no such kernel for the shape and dtype, im2col + GEMM below runs
 * instead, from scratch. Backward-weights gives each task its own dW and db,
 * added in task order: the bits depend on the width (as im2col's do), never
 * on which thread ran what. */

typedef struct {
    lk__dnnl_conv_shape s; /* N: the whole batch; a task's own count replaces it */
    lk_dtype xt, lowp;     /* x's dtype; the multiplied one */
    const void *x, *w, *dy; /* forward: x, w (+ bias) -> y; backward: x, w, dY (in lowp) */
    void *y, *bias;
    float *dx, *dw, *db; /* backward: dX [N, ...]; dW [width][O*Kg], db [width][O] per task */
    size_t x_elem, y_elem; /* one sample's elements of x and y */
    long wsize;
    lk_status st;
    int width;
} conv_dnnl_job;

static void conv_dnnl_fwd_task(void *ctx, int t) {
    conv_dnnl_job *j = ctx;
    int64_t n0, n1;
    lk__task_range(j->s.N, t, j->width, 1, &n0, &n1);
    if (n1 <= n0) return;
    lk__dnnl_conv_shape s = j->s;
    s.N = n1 - n0;
    note_failure(&j->st, lk__cpu_conv_dnnl(LK__DNNL_CONV_FWD, &s, elem_at(j->x, s.dt[0], n0 * j->x_elem), j->w,
                                      (void *)elem_at(j->y, s.dt[2], n0 * j->y_elem), j->bias));
}

static void conv_dnnl_bwd_task(void *ctx, int t) {
    conv_dnnl_job *j = ctx;
    int64_t n0, n1;
    lk__task_range(j->s.N, t, j->width, 1, &n0, &n1);
    lk__dnnl_conv_shape s = j->s;
    s.N = n1 - n0;
    const void *dy = elem_at(j->dy, j->lowp, n0 * j->y_elem);
    if (j->dw || j->db) {
        float *dw = j->dw + t * j->wsize, *db = j->db ? j->db + t * s.O : NULL;
        if (n1 <= n0) { /* no samples: a zero share */
            memset(dw, 0, sizeof(float) * (size_t)j->wsize);
            if (db) memset(db, 0, sizeof(float) * (size_t)s.O);
        } else {
            s.dt[0] = j->xt, s.dt[1] = j->lowp, s.dt[2] = LK_F32, s.bias = db != NULL;
            note_failure(&j->st, lk__cpu_conv_dnnl(LK__DNNL_CONV_BWD_WEIGHTS, &s, elem_at(j->x, j->xt, n0 * j->x_elem), dy,
                                              dw, db));
        }
    }
    if (j->dx && n1 > n0) {
        s.dt[0] = j->lowp, s.dt[1] = j->lowp, s.dt[2] = LK_F32, s.bias = 0;
        note_failure(&j->st, lk__cpu_conv_dnnl(LK__DNNL_CONV_BWD_DATA, &s, dy, j->w, j->dx + n0 * j->x_elem, NULL));
    }
}

static lk__dnnl_conv_shape dnnl_shape(const conv_geom *g, lk_dtype lowp) {
    lk__dnnl_conv_shape s;
    memset(&s, 0, sizeof s); /* compared bytewise */
    s.N = g->N, s.C = g->C, s.H = g->H, s.W = g->W, s.O = g->O, s.kh = g->kh, s.kw = g->kw, s.OH = g->OH;
    s.OW = g->OW, s.sh = g->sh, s.sw = g->sw, s.ph = g->ph, s.pw = g->pw, s.dh = g->dh, s.dw = g->dw, s.G = g->G;
    s.mul = lowp;
    s.bias_dt = LK_F32;
    return s;
}

/* Forward through oneDNN: LK_STATUS_UNSUPPORTED when it takes no kernel
 * (out untouched or partly written: the caller recomputes it whole). */
static lk_status conv_dnnl_forward(const conv_geom *g, lk_dtype lowp, const lk_tensor *xc, const lk_tensor *w,
                                   const lk_tensor *b, lk_tensor *out) {
    if (lk__backend(xc->device) != &lk__cpu_backend || lk__cpu_conv_path() == LK__CONV_IM2COL || g->N == 0)
        return LK_STATUS_UNSUPPORTED;
    conv_dnnl_job j = {.s = dnnl_shape(g, lowp), .xt = xc->dtype, .lowp = lowp, .x = xc->data, .w = w->data,
                       .y = out->data, .bias = b ? b->data : NULL, .x_elem = (size_t)(g->C * g->H * g->W),
                       .y_elem = (size_t)(g->O * g->P), .width = lk__parallel_width(g->N)};
    j.s.dt[0] = xc->dtype, j.s.dt[1] = w->dtype, j.s.dt[2] = out->dtype;
    j.s.bias = b != NULL, j.s.bias_dt = b ? b->dtype : LK_F32;
    lk__parallel_run(j.width, conv_dnnl_fwd_task, &j);
    return j.st;
}

/* Backward through oneDNN, the gradients accumulated as the im2col path
 * does; UNSUPPORTED (nothing accumulated) when oneDNN takes no kernel. */
static lk_status conv_dnnl_backward(const conv_geom *g, lk_dtype lowp, lk_tensor *x, lk_tensor *w, lk_tensor *b,
                                    const lk_tensor *xc, const lk_tensor *wm, const void *dy, bool need_x, bool need_w,
                                    bool need_b) {
    if (lk__backend(xc->device) != &lk__cpu_backend || lk__cpu_conv_path() == LK__CONV_IM2COL || g->N == 0)
        return LK_STATUS_UNSUPPORTED;
    lk_device dev = xc->device;
    conv_dnnl_job j = {.s = dnnl_shape(g, lowp), .xt = xc->dtype, .lowp = lowp, .x = xc->data, .w = wm->data,
                       .dy = dy, .x_elem = (size_t)(g->C * g->H * g->W), .y_elem = (size_t)(g->O * g->P),
                       .wsize = g->O * g->Kg, .width = lk__parallel_width(g->N)};
    bool parts = need_w || need_b; /* backward-weights gives db with dW: run it for either */
    lk_tensor *dx = need_x ? lk__tensor_new_on(dev, LK_F32, 4, xc->shape) : NULL;
    lk_tensor *dwp = parts ? lk__tensor_new_on(dev, LK_F32, 1, (int64_t[]){j.width * j.wsize}) : NULL;
    lk_tensor *dbp = need_b ? lk__tensor_new_on(dev, LK_F32, 1, (int64_t[]){j.width * g->O}) : NULL;
    lk_tensor *dw = NULL, *db = NULL;
    lk_status st = LK_STATUS_OUT_OF_MEMORY;
    if ((need_x && !dx) || (parts && !dwp) || (need_b && !dbp)) goto done;
    j.dx = dx ? dx->data : NULL, j.dw = dwp ? dwp->data : NULL, j.db = dbp ? dbp->data : NULL;
    lk__parallel_run(j.width, conv_dnnl_bwd_task, &j);
    if ((st = j.st)) goto done;
    /* dW straight into a leaf's existing f32 gradient (as the im2col path
     * does), else summed into a new one for lk__accum */
    bool direct_w = need_w && !w->grad_fn && w->grad && !w->lk__grad_stale && w->grad->dtype == LK_F32 &&
                    lk_tensor_is_contiguous(w->grad); /* (a stale one is overwritten by lk__accum) */
    float *dwd = NULL;
    if (need_w && !direct_w) {
        if (!(dw = lk__tensor_zeros_on(dev, LK_F32, 4, wm->shape))) goto oom;
        dwd = dw->data;
    } else if (need_w) dwd = w->grad->data;
    if (need_b && !(db = lk__tensor_zeros_on(dev, LK_F32, 1, b->shape))) goto oom;
    for (int t = 0; t < j.width; t++) {
        if (dwd && (st = lk__axpy_f32(dev, j.wsize, 1.0f, j.dw + t * j.wsize, dwd))) goto done;
        if (db && (st = lk__axpy_f32(dev, g->O, 1.0f, j.db + t * g->O, db->data))) goto done;
    }
    lk__accum_move(x, dx), dx = NULL;
    lk__accum_move(w, dw), dw = NULL;
    lk__accum_move(b, db), db = NULL;
    st = LK_STATUS_OK;
    goto done;
oom:
    st = LK_STATUS_OUT_OF_MEMORY;
done:
    lk_tensor_release(dx);
    lk_tensor_release(dwp);
    lk_tensor_release(dbp);
    lk_tensor_release(dw);
    lk_tensor_release(db);
    return st;
}

/* Backward over one task's chunks: dW and db accumulated (task 0 into the
 * results, tasks 1.. into partials), dX written per sample; cols and dyt
 * are the task's scratch. */
typedef struct {
    const conv_geom *g;
    lk_device dev; /* whose backend runs the GEMMs */
    const void *xd, *gd;      /* x in dtype xt (f32 or lowp), dY in gt */
    const float *wd;
    lk_dtype xt, gt;
    float *dxd, *dwd, *dbd;   /* dX; task 0's dW and db */
    float *dw_part, *db_part; /* tasks 1..: dW [width-1][O*Kg], db [width-1][O] */
    float *cols;              /* [width][cols_n] */
    void *dyt;                /* [width][out_n], in the GEMM dtype */
    /* autocast: the GEMM dtype (LK_F32: off), the rounded weight and dY,
     * and each task's rounded columns [width][cols_n] */
    lk_dtype lowp;
    const void *wl, *gl;
    void *lcols;
    lk_status st; /* the first failed GEMM */
    int width;
} conv_bwd_job;

static void conv_bwd_task(void *ctx, int t) {
    conv_bwd_job *j = ctx;
    const conv_geom *g = j->g;
    int64_t c0, c1;
    lk__task_range(g->nchunks, t, j->width, 1, &c0, &c1);
    float *dwd = !j->dwd ? NULL : t == 0 ? j->dwd : j->dw_part + (t - 1) * g->O * g->Kg;
    float *dbd = !j->dbd ? NULL : t == 0 ? j->dbd : j->db_part + (t - 1) * g->O;
    float *cols = j->cols ? j->cols + t * g->cols_n : NULL;
    lk_dtype lowp = j->lowp;
    size_t esz = lowp == LK_F32 ? sizeof(float) : sizeof(uint16_t);
    char *dyt = j->dyt ? (char *)j->dyt + (size_t)(t * g->out_n) * esz : NULL;
    void *lcols = j->lcols ? (char *)j->lcols + (size_t)(t * g->cols_n) * esz : NULL;
    const void *gsrc = lowp == LK_F32 ? j->gd : j->gl; /* dY as the GEMMs take it */
    const void *wsrc = lowp == LK_F32 ? (const void *)j->wd : j->wl;
    for (long c = c0; c < c1; c++) {
        long n0 = c * g->nb, cur = g->N - n0 < g->nb ? g->N - n0 : g->nb, ld = cur * g->P;
        const void *dy = elem_at(gsrc, lowp, n0 * g->O * g->P);
        long lddy = g->P;
        if (cur > 1) { /* dY of the chunk as [O, cur*P], the layout of the columns: one
                        * LK_OP_COPY over [O, cur, P], planes in the same order as before */
            lk_op_desc d = {.op = LK_OP_COPY, .dtype = {lowp, lowp}};
            d.copy = (lk_copy_params){3, {g->O, cur, g->P}, {g->P, g->O * g->P, 1}, {ld, g->P, 1}, false};
            note_failure(&j->st, lk__backend_run(j->dev, &d, (void *[]){(void *)dy, dyt}));
            dy = dyt;
            lddy = ld;
        }
        if (dbd) {
            lk_op_desc d = {.op = LK_OP_CHANNEL_SUM, .dtype = {j->gt, LK_F32}};
            d.bias = (lk_bias_params){cur, g->O, g->P};
            note_failure(&j->st,
                         lk__backend_run(j->dev, &d, (void *[]){(void *)elem_at(j->gd, j->gt, n0 * g->O * g->P), dbd}));
        }
        if (dwd) {
            long ldb;
            const void *B = chunk_cols(j->dev, &j->st, g, j->xt, j->xd, n0, cur, cols, lowp, lcols, &ldb);
            for (long q = 0; q < g->G; q++)
                note_failure(&j->st, conv_gemm(j->dev, lowp, false, true, g->Og, g->Kg, ld, elem_at(dy, lowp, q * g->Og * lddy),
                                               lddy, elem_at(B, lowp, q * g->Kg * ldb), ldb, 1.0f,
                                               dwd + q * g->Og * g->Kg, g->Kg));
        }
        if (j->dxd) {
            if (g->pointwise) {
                for (long q = 0; q < g->G; q++)
                    note_failure(&j->st, conv_gemm(j->dev, lowp, true, false, g->Kg, g->P, g->Og,
                                                   elem_at(wsrc, lowp, q * g->Og * g->Kg), g->Kg,
                                                   elem_at(dy, lowp, q * g->Og * lddy), lddy, 0.0f,
                                                   j->dxd + n0 * g->C * g->P + q * g->Kg * g->P, g->P));
            } else {
                for (long q = 0; q < g->G; q++)
                    note_failure(&j->st, conv_gemm(j->dev, lowp, true, false, g->Kg, ld, g->Og,
                                                   elem_at(wsrc, lowp, q * g->Og * g->Kg), g->Kg,
                                                   elem_at(dy, lowp, q * g->Og * lddy), lddy, 0.0f,
                                                   cols + q * g->Kg * ld, ld));
                note_failure(&j->st, col2im_chunk(j->dev, g, cols, n0, cur, j->dxd));
            }
        }
    }
}

static void conv2d_backward(lk_node *n, lk_tensor *gout) {
    lk_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    lk_tensor *xc = n->saved[0], *wc = n->saved[1];
    lk_tensor *wl = n->saved[2]; /* autocast: the weight as forward rounded it (NULL: f32) */
    lk_dtype lowp = wl ? wl->dtype : LK_F32;
    conv_geom g;
    conv_geom_init(&g, xc, wc, n->a.i);
    bool need_x = x->requires_grad, need_w = w->requires_grad, need_b = b && b->requires_grad;
    if (lowp == LK_F32 || gout->dtype == lowp) { /* dY as the product takes it, without a copy */
        lk_tensor *gc = lk__contig_keep(gout);
        lk_status st = gc ? conv_dnnl_backward(&g, lowp, x, w, b, xc, lowp == LK_F32 ? wc : wl, gc->data, need_x,
                                               need_w, need_b)
                          : LK_STATUS_OUT_OF_MEMORY;
        lk_tensor_release(gc);
        if (st != LK_STATUS_UNSUPPORTED) return; /* done, or failed (it said why): as the im2col path's failure */
    }
    lk_dtype xt = xc->dtype;
    /* f32 columns: dX's GEMM output, and an f32 x's unrolled columns for dW */
    bool need_cols = !g.pointwise && (need_x || (need_w && xt == LK_F32));
    /* rounded columns for dW unless a 16-bit x is multiplied as it is (pointwise) */
    bool need_lcols = lowp != LK_F32 && need_w && !(g.pointwise && xt == lowp);
    int width = lk__parallel_width(g.nchunks);
    lk_device dev = xc->device; /* where x and so every buffer here lives */
    /* col2im accumulates into dx; the 1x1 path's GEMMs write all of it */
    lk_tensor *dx = !need_x ? NULL
                    : g.pointwise ? lk__tensor_new_on(dev, LK_F32, 4, xc->shape)
                                  : lk__tensor_zeros_on(dev, LK_F32, 4, xc->shape);
    /* dW accumulates straight into a leaf's existing f32 gradient (as linear
     * does); a 16-bit weight's gradient is summed in f32 and rounded by lk__accum */
    bool direct_w = need_w && !w->grad_fn && w->grad && !w->lk__grad_stale && w->grad->dtype == LK_F32 &&
                    lk_tensor_is_contiguous(w->grad); /* (a stale one is overwritten by lk__accum) */
    lk_tensor *dw = need_w && !direct_w ? lk__tensor_zeros_on(dev, LK_F32, 4, wc->shape) : NULL;
    lk_tensor *db = need_b ? lk__tensor_zeros_on(dev, LK_F32, 1, b->shape) : NULL;
    /* Per task: scratch columns and dY gathers; tasks 1.. also partial dW and db. */
    bool parts = width > 1;
    lk_tensor *cols = need_cols ? lk__tensor_new_on(dev, LK_F32, 1, (int64_t[]){width * g.cols_n}) : NULL;
    lk_tensor *dyt = g.nb > 1 ? lk__tensor_new_on(dev, lowp, 1, (int64_t[]){width * g.out_n}) : NULL;
    /* autocast: dY in the GEMM dtype (the output's dtype already: no copy); the
     * columns dW multiplies, rounded per task */
    lk_tensor *gl = NULL;
    if (lowp != LK_F32 && (need_w || need_x))
        gl = gout->dtype == lowp ? lk__contig_keep(gout) : lk_tensor_cast(gout, lowp);
    lk_tensor *lcols = need_lcols ? lk__tensor_new_on(dev, lowp, 1, (int64_t[]){width * g.cols_n}) : NULL;
    lk_tensor *dwp = need_w && parts ? lk__tensor_zeros_on(dev, LK_F32, 1, (int64_t[]){(width - 1) * g.O * g.Kg}) : NULL;
    lk_tensor *dbp = need_b && parts ? lk__tensor_zeros_on(dev, LK_F32, 1, (int64_t[]){(width - 1) * g.O}) : NULL;
    if ((need_x && !dx) || (need_w && !direct_w && !dw) || (need_b && !db) || (need_cols && !cols) ||
        (g.nb > 1 && !dyt) || (need_w && parts && !dwp) || (need_b && parts && !dbp) ||
        (lowp != LK_F32 && (need_w || need_x) && !gl) || (need_lcols && !lcols))
        goto done;
    conv_bwd_job job = {.g = &g,
                        .dev = xc->device,
                        .xd = xc->data,
                        .wd = wc->data,
                        .xt = xt,
                        .gt = gout->dtype,
                        .gd = gout->data,
                        .dxd = need_x ? dx->data : NULL,
                        .dwd = need_w ? (direct_w ? w->grad->data : dw->data) : NULL,
                        .dbd = need_b ? db->data : NULL,
                        .dw_part = dwp ? dwp->data : NULL,
                        .db_part = dbp ? dbp->data : NULL,
                        .cols = cols ? cols->data : NULL,
                        .dyt = dyt ? dyt->data : NULL,
                        .lowp = lowp,
                        .wl = wl ? wl->data : NULL,
                        .gl = gl ? gl->data : NULL,
                        .lcols = lcols ? lcols->data : NULL,
                        .width = width};
    /* a device's ops from this thread, in chunk order (lk__parallel_run_ordered) */
    (lk_device_is_host(job.dev) ? lk__parallel_run : lk__parallel_run_ordered)(width, conv_bwd_task, &job);
    if (job.st) goto done; /* a backend op failed (it said why): leave the gradients untouched */
    /* The partial sums of tasks 1.., added in task order: deterministic for a given thread count. */
    for (int t = 1; t < width; t++) {
        if (dwp && lk__axpy_f32(job.dev, g.O * g.Kg, 1.0f, job.dw_part + (t - 1) * g.O * g.Kg, job.dwd)) goto done;
        if (dbp && lk__axpy_f32(job.dev, g.O, 1.0f, job.db_part + (t - 1) * g.O, job.dbd)) goto done;
    }
    /* moved: the gradient slots take these buffers instead of copying them */
    lk__accum_move(x, dx), dx = NULL;
    lk__accum_move(w, dw), dw = NULL;
    lk__accum_move(b, db), db = NULL;
done:
    lk_tensor_release(dx);
    lk_tensor_release(dw);
    lk_tensor_release(db);
    lk_tensor_release(cols);
    lk_tensor_release(dyt);
    lk_tensor_release(dwp);
    lk_tensor_release(dbp);
    lk_tensor_release(gl);
    lk_tensor_release(lcols);
}

static lk_status conv2d_check(const lk_tensor *x, const lk_tensor *w, const lk_tensor *b, lk_conv2d_params p) {
    char sx[128], sw[128], sb[128];
    LK_TRY(lk__check_float("conv2d", x, "input"));
    LK_TRY(lk__check_float("conv2d", w, "weight"));
    if (b) LK_TRY(lk__check_float("conv2d", b, "bias"));
    if (lk_autocast_dtype() == LK_F32 && (w->dtype != x->dtype || (b && b->dtype != x->dtype)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "conv2d: input %s, weight %s%s%s: outside autocast every operand must have the same dtype "
                        "(f32, bf16 or f16); cast them with lk_tensor_cast or run under lk_autocast_enter",
                        lk_dtype_name(x->dtype), lk_dtype_name(w->dtype), b ? ", bias " : "",
                        b ? lk_dtype_name(b->dtype) : "");
    lk_shape_str(x, sx, sizeof sx);
    lk_shape_str(w, sw, sizeof sw);
    if (x->ndim != 4) return lk_error(LK_STATUS_INVALID_ARGUMENT, "conv2d: input must be [N, C, H, W], got %s", sx);
    if (w->ndim != 4)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "conv2d: weight must be [O, C/groups, kh, kw], got %s", sw);
    for (int i = 0; i < 2; i++) {
        if (p.stride[i] < 1 || p.dilation[i] < 1 || p.padding[i] < 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "conv2d: stride {%d, %d} and dilation {%d, %d} must be >= 1 and padding {%d, %d} >= 0",
                            p.stride[0], p.stride[1], p.dilation[0], p.dilation[1], p.padding[0], p.padding[1]);
    }
    if (p.groups < 1) return lk_error(LK_STATUS_INVALID_ARGUMENT, "conv2d: groups must be >= 1, got %d", p.groups);
    if (x->shape[1] % p.groups)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "conv2d: input channels %lld (input %s) are not divisible by groups %d", (long long)x->shape[1],
                        sx, p.groups);
    if (w->shape[0] % p.groups || w->shape[0] == 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "conv2d: output channels %lld (weight %s) must be a positive multiple of groups %d",
                        (long long)w->shape[0], sw, p.groups);
    if (w->shape[1] * p.groups != x->shape[1])
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "conv2d: input channels %lld do not match weight %s (groups %d), input %s: the weight's "
                        "dim 1 must be %lld",
                        (long long)x->shape[1], sw, p.groups, sx, (long long)x->shape[1] / p.groups);
    if (w->shape[2] < 1 || w->shape[3] < 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "conv2d: empty kernel in weight %s", sw);
    for (int i = 0; i < 2; i++) {
        int64_t eff = (int64_t)p.dilation[i] * (w->shape[2 + i] - 1) + 1, padded = x->shape[2 + i] + 2 * p.padding[i];
        if (eff > padded)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "conv2d: kernel %lldx%lld (dilation {%d, %d}) is larger than the padded input %lldx%lld "
                            "(input %s, padding {%d, %d})",
                            (long long)w->shape[2], (long long)w->shape[3], p.dilation[0], p.dilation[1],
                            (long long)(x->shape[2] + 2 * p.padding[0]), (long long)(x->shape[3] + 2 * p.padding[1]),
                            sx, p.padding[0], p.padding[1]);
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "conv2d: bias %s does not match weight %s (expected [%lld])",
                        lk_shape_str(b, sb, sizeof sb), sw, (long long)w->shape[0]);
    return LK_STATUS_OK;
}

/* Forward over the chunks [c0, c1) of one task, with its own scratch. */
typedef struct {
    const conv_geom *g;
    lk_device dev; /* whose backend runs the GEMMs */
    const void *xd, *bd;    /* x in dtype xt (f32 or lowp); the bias in the output's dtype */
    const float *wd;
    lk_dtype xt;
    void *od;               /* the output, in lowp */
    float *cols, *tmp;      /* cols [width][cols_n], tmp [width][out_n] */
    lk_dtype lowp;          /* the GEMM dtype (LK_F32: the f32 path) */
    const void *wl;         /* lowp: the weight in lowp */
    void *lcols;            /* lowp: columns [width][cols_n] */
    lk_status st;           /* the first failed GEMM */
    int width;
} conv_fwd_job;

static void conv_fwd_task(void *ctx, int t) {
    conv_fwd_job *j = ctx;
    const conv_geom *g = j->g;
    int64_t c0, c1;
    lk__task_range(g->nchunks, t, j->width, 1, &c0, &c1);
    float *cols = j->cols ? j->cols + t * g->cols_n : NULL;
    float *tmp = j->tmp ? j->tmp + t * g->out_n : NULL;
    bool lowp = j->lowp != LK_F32;
    void *lcols = j->lcols ? (char *)j->lcols + (size_t)(t * g->cols_n) * 2 : NULL;
    const void *A = !lowp ? (const void *)j->wd : j->wl;
    for (long c = c0; c < c1; c++) {
        long n0 = c * g->nb, cur = g->N - n0 < g->nb ? g->N - n0 : g->nb, ld = cur * g->P, ldb;
        const void *B = chunk_cols(j->dev, &j->st, g, j->xt, j->xd, n0, cur, cols, j->lowp, lcols, &ldb);
        /* f32 sums: NCHW output directly on the f32 path with one sample; else the task's scratch */
        float *C = cur > 1 || lowp ? tmp : (float *)j->od + n0 * g->O * g->P;
        for (long q = 0; q < g->G; q++)
            note_failure(&j->st, conv_gemm(j->dev, j->lowp, false, false, g->Og, ld, g->Kg,
                                           elem_at(A, j->lowp, q * g->Og * g->Kg), g->Kg,
                                           elem_at(B, j->lowp, q * g->Kg * ldb), ldb, 0.0f, C + q * g->Og * ld, ld));
        if (cur > 1 || j->bd || lowp) /* to NCHW, adding the bias (in place for one f32 sample), rounded to lowp */
            note_failure(&j->st, bias_add_chunk(j->dev, g, cur, C, j->lowp, j->bd, j->lowp,
                                                (void *)elem_at(j->od, j->lowp, n0 * g->O * g->P)));
    }
}

lk_tensor *lk_conv2d(lk_tensor *x, lk_tensor *w, lk_tensor *b, lk_conv2d_params p) {
    LK_OP_CHECK_INPUTS(x, w);
    if (lk__same_device("conv2d", 3, (lk_tensor *[]){x, w, b}) || conv2d_check(x, w, b, p)) return NULL;
    int64_t a[7] = {p.stride[0], p.stride[1], p.padding[0], p.padding[1], p.dilation[0], p.dilation[1], p.groups};
    conv_geom g;
    conv_geom_init(&g, x, w, a);
    /* the GEMM dtype: autocast's, else the operands' own (checked equal) */
    lk_dtype lowp = lk__autocast_dtype_for(LK_CAST_LOWER, x->dtype);
    bool lp = lowp != LK_F32;
    /* x as it is when it has the GEMM dtype (a 16-bit activation: no copy), else f32 */
    lk_tensor *xc = x->dtype == lowp ? lk__contig_keep(x) : lk__contig(x);
    lk_dtype xt = xc ? xc->dtype : LK_F32;
    /* the weight and bias: f32 on the f32 path; in lowp otherwise (rounded once per call unless already lowp) */
    lk_tensor *wc = !lp ? lk__contig(w) : NULL, *wl = NULL, *bc = NULL;
    if (lp) wl = w->dtype == lowp ? lk__contig_keep(w) : lk_tensor_cast(w, lowp);
    if (b) bc = !lp ? lk__contig(b) : b->dtype == lowp ? lk__contig_keep(b) : lk_tensor_cast(b, lowp);
    lk_tensor *out = lk__tensor_new_on(x->device, lowp, 4, (int64_t[]){g.N, g.O, g.OH, g.OW});
    lk_tensor *cols = NULL, *tmp = NULL, *lcols = NULL;
    if (!xc || (!lp && !wc) || (lp && !wl) || (b && !bc) || !out) {
        lk_tensor_release(out);
        out = NULL;
        goto done;
    }
    lk_status dst = conv_dnnl_forward(&g, lowp, xc, lp ? wl : wc, bc, out);
    if (dst != LK_STATUS_UNSUPPORTED) {
        if (dst) {
            char sx[128], sw[128];
            lk_error(dst, "conv2d: oneDNN's convolution failed (%s, input %s, weight %s)", lk_dtype_name(lowp),
                     lk_shape_str(x, sx, sizeof sx), lk_shape_str(w, sw, sizeof sw));
            lk_tensor_release(out);
            out = NULL;
            goto done;
        }
        goto record;
    }
    int width = lk__parallel_width(g.nchunks);
    bool need_cols = !g.pointwise && xt == LK_F32, need_lcols = lp && !(g.pointwise && xt == lowp);
    cols = need_cols ? lk__tensor_new_on(x->device, LK_F32, 1, (int64_t[]){width * g.cols_n}) : NULL;
    tmp = g.nb > 1 || lp ? lk__tensor_new_on(x->device, LK_F32, 1, (int64_t[]){width * g.out_n}) : NULL;
    lcols = need_lcols ? lk__tensor_new_on(x->device, lowp, 1, (int64_t[]){width * g.cols_n}) : NULL;
    if ((need_cols && !cols) || ((g.nb > 1 || lp) && !tmp) || (need_lcols && !lcols)) {
        lk_tensor_release(out);
        out = NULL;
        goto done;
    }
    conv_fwd_job job = {.g = &g,
                        .dev = x->device,
                        .xd = xc->data,
                        .xt = xt,
                        .wd = wc ? wc->data : NULL,
                        .bd = bc ? bc->data : NULL,
                        .od = out->data,
                        .cols = cols ? cols->data : NULL,
                        .tmp = tmp ? tmp->data : NULL,
                        .lowp = lowp,
                        .wl = wl ? wl->data : NULL,
                        .lcols = lcols ? lcols->data : NULL,
                        .width = width};
    (lk_device_is_host(job.dev) ? lk__parallel_run : lk__parallel_run_ordered)(width, conv_fwd_task, &job);
    if (job.st) {
        char sx[128], sw[128];
        lk_error(job.st, "conv2d: a backend op failed (%s GEMMs, input %s, weight %s)", lk_dtype_name(lowp),
                 lk_shape_str(x, sx, sizeof sx), lk_shape_str(w, sw, sizeof sw));
        lk_tensor_release(out);
        out = NULL;
        goto done;
    }
record:;
    lk_tensor *in[3] = {x, w, b};
    lk_node *n = lk__record("conv2d", conv2d_backward, out, b ? 3 : 2, in);
    if (n) {
        memcpy(n->a.i, a, sizeof a);
        n->saved[0] = lk_tensor_retain(xc);
        n->saved[1] = lk_tensor_retain(lp ? wl : wc); /* its shape; its data on the f32 path */
        n->saved[2] = lk_tensor_retain(wl); /* NULL on the f32 path: backward multiplies as forward did */
    }
done:
    lk_tensor_release(xc);
    lk_tensor_release(wc);
    lk_tensor_release(bc);
    lk_tensor_release(cols);
    lk_tensor_release(tmp);
    lk_tensor_release(wl);
    lk_tensor_release(lcols);
    return out ? lk__op_result(out) : NULL;
}

/* ---- pooling -----------------------------------------------------------------------
 * Same as input (torch.autocast has pooling on no list): a bf16/f16 input
 * gives an output and a gradient of its dtype; the backend sums and compares
 * in f32 and rounds each output element once. */

/* PyTorch's pooling_output_shape (dilation 1). */
static int64_t pool_out_size(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
    int64_t num = in + 2 * p - (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
    if (ceil_mode && (o - 1) * s >= in + p) o--;
    return o;
}

typedef struct {
    long planes, H, W, OH, OW, kh, kw, sh, sw, ph, pw;
    int count_include_pad;
} pool_geom;

/* Validates x ([N, C, H, W] or [C, H, W]) and the params; fills g and the output shape. */
static lk_status pool_setup(const char *op, const lk_tensor *x, lk_pool2d_params p, pool_geom *g, int64_t *oshape) {
    char sx[128];
    LK_TRY(lk__check_float(op, x, "input"));
    lk_shape_str(x, sx, sizeof sx);
    if (x->ndim != 3 && x->ndim != 4)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: input must be [N, C, H, W] or [C, H, W], got %s", op, sx);
    int s[2];
    for (int i = 0; i < 2; i++) {
        s[i] = p.stride[i] ? p.stride[i] : p.kernel[i];
        if (p.kernel[i] < 1 || s[i] < 1 || p.padding[i] < 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "%s: kernel {%d, %d} and stride {%d, %d} must be >= 1 (stride 0 means = kernel) and "
                            "padding {%d, %d} >= 0",
                            op, p.kernel[0], p.kernel[1], p.stride[0], p.stride[1], p.padding[0], p.padding[1]);
        if (p.padding[i] > p.kernel[i] / 2)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "%s: padding {%d, %d} must be at most half of kernel {%d, %d}", op, p.padding[0],
                            p.padding[1], p.kernel[0], p.kernel[1]);
    }
    int64_t H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
    int64_t OH = pool_out_size(H, p.kernel[0], s[0], p.padding[0], p.ceil_mode);
    int64_t OW = pool_out_size(W, p.kernel[1], s[1], p.padding[1], p.ceil_mode);
    if (OH < 1 || OW < 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: input %s is too small for kernel {%d, %d}, stride {%d, %d}, padding {%d, %d}: the output "
                        "would be %lldx%lld",
                        op, sx, p.kernel[0], p.kernel[1], s[0], s[1], p.padding[0], p.padding[1], (long long)OH,
                        (long long)OW);
    *g = (pool_geom){.planes = (long)(H * W > 0 ? x->numel / (H * W) : 0), .H = H, .W = W, .OH = OH, .OW = OW,
                     .kh = p.kernel[0], .kw = p.kernel[1], .sh = s[0], .sw = s[1], .ph = p.padding[0],
                     .pw = p.padding[1], .count_include_pad = p.count_include_pad};
    for (int i = 0; i < x->ndim - 2; i++) oshape[i] = x->shape[i];
    oshape[x->ndim - 2] = OH;
    oshape[x->ndim - 1] = OW;
    return LK_STATUS_OK;
}

static void pool_geom_save(lk_node *n, const pool_geom *g) {
    const long v[8] = {g->OH, g->OW, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw};
    for (int i = 0; i < 8; i++) n->a.i[i] = v[i];
    n->a.f[0] = (float)g->count_include_pad;
}

static void pool_geom_load(const lk_node *n, pool_geom *g) {
    const lk_tensor *x = n->in[0];
    g->H = x->shape[x->ndim - 2], g->W = x->shape[x->ndim - 1];
    g->planes = g->H * g->W > 0 ? (long)(x->numel / (g->H * g->W)) : 0;
    g->OH = n->a.i[0], g->OW = n->a.i[1], g->kh = n->a.i[2], g->kw = n->a.i[3];
    g->sh = n->a.i[4], g->sw = n->a.i[5], g->ph = n->a.i[6], g->pw = n->a.i[7];
    g->count_include_pad = n->a.f[0] != 0.0f;
}

/* The pooling descriptor for geometry g. */
static lk_op_desc pool_desc(lk_op_kind op, lk_pool_kind kind, const pool_geom *g) {
    lk_op_desc d = {.op = op};
    d.pool = (lk_pool_params){kind,  g->planes, g->H,  g->W,  g->OH, g->OW, g->kh,
                              g->kw, g->sh,     g->sw, g->ph, g->pw, g->count_include_pad};
    return d;
}

/* dx = zeros, then the backend adds the pooling's adjoint of gout into it. */
static void pool_backward(lk_node *n, lk_tensor *gout, lk_pool_kind kind, const pool_geom *g, const lk_tensor *idx) {
    lk_tensor *x = n->in[0];
    lk_tensor *dx = lk__tensor_zeros_on(x->device, x->dtype, x->ndim, x->shape); /* the input's dtype: its gradient's */
    if (!dx) return;
    lk_op_desc d = pool_desc(LK_OP_POOL2D_BACKWARD, kind, g);
    d.dtype[0] = gout->dtype, d.dtype[1] = idx ? LK_I32 : LK_F32, d.dtype[2] = x->dtype;
    if (lk__backend_run(x->device, &d, (void *[]){gout->data, idx ? idx->data : NULL, dx->data})) {
        lk_tensor_release(dx);
        return;
    }
    lk__accum_move(x, dx);
}

static void max_pool_backward(lk_node *n, lk_tensor *gout) {
    pool_geom g;
    pool_geom_load(n, &g);
    pool_backward(n, gout, LK_POOL_MAX, &g, n->saved[0]);
}

lk_tensor *lk_max_pool2d(lk_tensor *x, lk_pool2d_params p) {
    LK_OP_CHECK_INPUTS(x);
    pool_geom g;
    int64_t oshape[4];
    if (pool_setup("max_pool2d", x, p, &g, oshape)) return NULL;
    lk_tensor *xc = lk__contig_keep(x);
    lk_tensor *out = xc ? lk__tensor_new_on(x->device, x->dtype, x->ndim, oshape) : NULL;
    lk_tensor *idx = out ? lk__tensor_new_on(x->device, LK_I32, x->ndim, oshape) : NULL;
    if (!idx) {
        lk_tensor_release(xc);
        lk_tensor_release(out);
        return NULL;
    }
    lk_op_desc d = pool_desc(LK_OP_POOL2D, LK_POOL_MAX, &g);
    d.dtype[0] = x->dtype, d.dtype[1] = x->dtype, d.dtype[2] = LK_I32;
    if (lk__backend_run(xc->device, &d, (void *[]){xc->data, out->data, idx->data})) {
        lk_tensor_release(idx);
        lk_tensor_release(xc);
        lk_tensor_release(out);
        return NULL;
    }
    lk_node *n = lk__record("max_pool2d", max_pool_backward, out, 1, &x);
    if (n) {
        pool_geom_save(n, &g);
        n->saved[0] = lk_tensor_retain(idx);
    }
    lk_tensor_release(idx);
    lk_tensor_release(xc);
    return lk__op_result(out);
}

static void avg_pool_backward(lk_node *n, lk_tensor *gout) {
    pool_geom g;
    pool_geom_load(n, &g);
    pool_backward(n, gout, LK_POOL_AVG, &g, NULL);
}

lk_tensor *lk_avg_pool2d(lk_tensor *x, lk_pool2d_params p) {
    LK_OP_CHECK_INPUTS(x);
    pool_geom g;
    int64_t oshape[4];
    if (pool_setup("avg_pool2d", x, p, &g, oshape)) return NULL;
    lk_tensor *xc = lk__contig_keep(x);
    lk_tensor *out = xc ? lk__tensor_new_on(x->device, x->dtype, x->ndim, oshape) : NULL;
    if (!out) {
        lk_tensor_release(xc);
        return NULL;
    }
    lk_op_desc d = pool_desc(LK_OP_POOL2D, LK_POOL_AVG, &g);
    d.dtype[0] = d.dtype[1] = x->dtype, d.dtype[2] = LK_F32;
    if (lk__backend_run(xc->device, &d, (void *[]){xc->data, out->data, NULL})) {
        lk_tensor_release(xc);
        lk_tensor_release(out);
        return NULL;
    }
    lk_node *n = lk__record("avg_pool2d", avg_pool_backward, out, 1, &x);
    if (n) pool_geom_save(n, &g);
    lk_tensor_release(xc);
    return lk__op_result(out);
}

static void adaptive_avg_backward(lk_node *n, lk_tensor *gout) {
    lk_tensor *x = n->in[0];
    long H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
    pool_geom g = {.planes = H * W > 0 ? (long)(x->numel / (H * W)) : 0, .H = H, .W = W, .OH = n->a.i[0],
                   .OW = n->a.i[1]};
    pool_backward(n, gout, LK_POOL_ADAPTIVE_AVG, &g, NULL);
}

lk_tensor *lk_adaptive_avg_pool2d(lk_tensor *x, int out_h, int out_w) {
    LK_OP_CHECK_INPUTS(x);
    char sx[128];
    if (lk__check_float("adaptive_avg_pool2d", x, "input")) return NULL;
    lk_shape_str(x, sx, sizeof sx);
    if (x->ndim != 3 && x->ndim != 4)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "adaptive_avg_pool2d: input must be [N, C, H, W] or [C, H, W], got %s", sx), NULL;
    long H = x->shape[x->ndim - 2], W = x->shape[x->ndim - 1];
    if (out_h < 1 || out_w < 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "adaptive_avg_pool2d: output size %dx%d must be >= 1x1", out_h,
                        out_w), NULL;
    if (H < 1 || W < 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "adaptive_avg_pool2d: input %s has an empty image", sx), NULL;
    int64_t oshape[4];
    for (int i = 0; i < x->ndim - 2; i++) oshape[i] = x->shape[i];
    oshape[x->ndim - 2] = out_h;
    oshape[x->ndim - 1] = out_w;
    lk_tensor *xc = lk__contig_keep(x);
    lk_tensor *out = xc ? lk__tensor_new_on(x->device, x->dtype, x->ndim, oshape) : NULL;
    if (!out) {
        lk_tensor_release(xc);
        return NULL;
    }
    pool_geom g = {.planes = (long)(x->numel / (H * W)), .H = H, .W = W, .OH = out_h, .OW = out_w};
    lk_op_desc d = pool_desc(LK_OP_POOL2D, LK_POOL_ADAPTIVE_AVG, &g);
    d.dtype[0] = d.dtype[1] = x->dtype, d.dtype[2] = LK_F32;
    if (lk__backend_run(xc->device, &d, (void *[]){xc->data, out->data, NULL})) {
        lk_tensor_release(xc);
        lk_tensor_release(out);
        return NULL;
    }
    lk_node *n = lk__record("adaptive_avg_pool2d", adaptive_avg_backward, out, 1, &x);
    if (n) {
        n->a.i[0] = out_h;
        n->a.i[1] = out_w;
    }
    lk_tensor_release(xc);
    return lk__op_result(out);
}

/* Layer ops with state of their own: inverted dropout (its mask drawn from
 * the caller's Philox stream by the backend, on the tensor's device, and
 * kept for backward) and layer_norm (mean and
 * rstd per row kept for the fused backward). Row math in backend/kernels.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

/* ---- dropout ------------------------------------------------------------------- */

/* saved: 0 the keep mask (u8, input's shape); a.f[0]: the scale 1/(1-p). */
static void dropout_backward(lk_node *n, lk_tensor *g) {
    const lk_tensor *mask = n->saved[0];
    float scale = n->a.f[0];
    lk_tensor *dx = lk__tensor_new_on(g->device, g->dtype, g->ndim, g->shape);
    if (!dx) return;
    lk_op_desc d = {.op = LK_OP_MASK_SCALE, .dtype = {g->dtype, LK_U8, g->dtype}};
    d.mask_scale = (lk_mask_scale_params){g->numel, scale};
    if (lk__backend_run(g->device, &d, (void *[]){g->data, mask->data, dx->data})) {
        lk_tensor_release(dx);
        return;
    }
    lk__accum_move(n->in[0], dx);
}

/* The mask op for the next n draws of rng (keep[i] = !(u_i < p), u_i the
 * stream's i-th lk_rng_uniform()): the 1-3 words rng still buffers travel
 * in the descriptor, the rest are Philox blocks from rng's counter on, so
 * the backend draws on its own device what per-element draws would give. */
static lk_op_desc mask_desc(const lk_rng *rng, float p, int64_t n) {
    lk_op_desc d = {.op = LK_OP_DROPOUT_MASK, .dtype = {LK_U8}};
    lk_dropout_mask_params *m = &d.dropout_mask;
    m->n = n;
    m->thr = p * 16777216.0f;
    memcpy(m->key, rng->key, sizeof m->key);
    memcpy(m->ctr, rng->ctr, sizeof m->ctr);
    for (int w = rng->pos; w < 4 && m->head_n < n; w++) m->head[m->head_n++] = rng->buf[w];
    return d;
}

/* Advances rng past the mask's n draws exactly as the host draw did (the
 * state stays bitwise what it was): the buffered words are used up, whole
 * blocks only move the counter (carrying into ctr[1]), and a partial last
 * block is buffered with its unused words, as lk_rng_u32 leaves it. */
static void mask_advance(lk_rng *rng, const lk_dropout_mask_params *m) {
    rng->pos += m->head_n;
    int64_t rest = m->n - m->head_n;
    uint64_t c = ((uint64_t)rng->ctr[1] << 32 | rng->ctr[0]) + (uint64_t)(rest / 4);
    rng->ctr[0] = (uint32_t)c, rng->ctr[1] = (uint32_t)(c >> 32);
    if (rest % 4) {
        (void)lk_rng_u32(rng); /* pos is 4 here: refills buf from the counter and moves it on */
        rng->pos = (int)(rest % 4);
    }
}

lk_tensor *lk_dropout(lk_tensor *x, float p, bool training, lk_rng *rng) {
    LK_OP_CHECK_INPUTS(x);
    static const char *op = "dropout";
    if (!(p >= 0.0f && p <= 1.0f))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: probability p = %g is outside [0, 1]", op, (double)p), NULL;
    if (!training || p == 0.0f) return lk__op_result(lk_tensor_retain(x));
    if (lk__check_float(op, x, "input")) return NULL; /* LK_CAST_SAME: a bf16 activation stays bf16 */
    if (!rng)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: training with p = %g needs an rng stream (lk_rng_init(&r, seed, LK_RNG_DROPOUT, ...))", op,
                        (double)p),
               NULL;
    lk_tensor *xc = lk__contig_keep(x);
    lk_tensor *mask = xc ? lk__tensor_new_on(x->device, LK_U8, x->ndim, x->shape) : NULL;
    lk_dtype odt = lk__autocast_dtype_for(LK_CAST_SAME, x->dtype);
    lk_tensor *out = mask ? lk__tensor_new_on(x->device, odt, x->ndim, x->shape) : NULL;
    /* As PyTorch: out = x * noise, noise = keep / (1 - p), so inf * 0 stays
     * NaN; p == 1 draws nothing and zeroes everything. */
    float scale = p == 1.0f ? 0.0f : (float)(1.0 / (1.0 - (double)p));
    /* The mask is drawn by the op's backend, on the tensor's device: no
     * host buffer and no copy in. p == 1 keeps nothing and draws nothing
     * (the stream stays where it is). */
    lk_status st = LK_STATUS_OK;
    if (out) {
        lk_op_desc md = mask_desc(rng, p, x->numel);
        st = lk__backend_run(mask->device, &md, (void *[]){mask->data});
        if (!st && p < 1.0f) mask_advance(rng, &md.dropout_mask); /* a failed draw leaves the stream unchanged */
        lk_op_desc d = {.op = LK_OP_MASK_SCALE, .dtype = {xc->dtype, LK_U8, out->dtype}};
        d.mask_scale = (lk_mask_scale_params){x->numel, scale};
        if (!st) st = lk__backend_run(xc->device, &d, (void *[]){xc->data, mask->data, out->data});
    }
    if (st) {
        lk_tensor_release(out);
        out = NULL;
    }
    if (out) {
        lk_node *n = lk__record(op, dropout_backward, out, 1, &x);
        if (n) {
            n->a.f[0] = scale;
            n->saved[0] = lk_tensor_retain(mask);
        }
    }
    lk_tensor_release(mask);
    lk_tensor_release(xc);
    return lk__op_result(out);
}

/* ---- layer_norm ------------------------------------------------------------------ */

/* in: x, then weight and bias when given (a.i[0], a.i[1] say which).
 * a.i[2] rows M, a.i[3] row length. saved: 0 x (contiguous), 1 [M, 2] mean
 * and rstd per row, 2 weight (contiguous) or NULL. */
static void layer_norm_backward(lk_node *n, lk_tensor *g) {
    bool has_w = n->a.i[0] != 0, has_b = n->a.i[1] != 0;
    int64_t M = n->a.i[2], L = n->a.i[3];
    lk_tensor *x = n->saved[0], *stats = n->saved[1], *wt = n->saved[2];
    lk_tensor *xin = n->in[0], *win = has_w ? n->in[1] : NULL, *bin = has_b ? n->in[1 + has_w] : NULL;
    lk_tensor *dx = NULL, *dw = NULL, *db = NULL;
    /* dX in the input's dtype (rounded once by the backend); dW, dB summed in
     * f32 and rounded by lk__accum to a 16-bit parameter's dtype */
    if (xin->requires_grad && !(dx = lk__tensor_new_on(x->device, x->dtype, x->ndim, x->shape))) goto done;
    if (win && win->requires_grad && !(dw = lk__tensor_zeros_on(x->device, LK_F32, win->ndim, win->shape))) goto done;
    if (bin && bin->requires_grad && !(db = lk__tensor_zeros_on(x->device, LK_F32, bin->ndim, bin->shape))) goto done;
    lk_op_desc d = {.op = LK_OP_LAYER_NORM_BACKWARD,
                    .dtype = {x->dtype, g->dtype, LK_F32, wt ? wt->dtype : LK_F32, x->dtype, LK_F32, LK_F32}};
    d.layer_norm = (lk_layer_norm_params){M, L, 0.0f};
    if (lk__backend_run(x->device, &d,
                        (void *[]){x->data, g->data, stats->data, wt ? wt->data : NULL, dx ? dx->data : NULL,
                                   dw ? dw->data : NULL, db ? db->data : NULL}))
        goto done;
    lk__accum_move(xin, dx), dx = NULL;
    lk__accum_move(win, dw), dw = NULL;
    lk__accum_move(bin, db), db = NULL;
done:
    lk_tensor_release(dx);
    lk_tensor_release(dw);
    lk_tensor_release(db);
}

/* weight/bias must have exactly the normalized shape (x's last k dims). */
static lk_status check_norm_param(const lk_tensor *x, int k, const lk_tensor *p, const char *arg) {
    bool ok = p->ndim == k;
    for (int i = 0; ok && i < k; i++) ok = p->shape[i] == x->shape[x->ndim - k + i];
    if (ok) return LK_STATUS_OK;
    char what[96];
    snprintf(what, sizeof what, "%s must have the normalized shape (the input's last %d dims)", arg, k);
    return lk__error_shapes("layer_norm", what, p, x);
}

lk_tensor *lk_layer_norm(lk_tensor *x, int normalized_ndim, lk_tensor *weight, lk_tensor *bias, float eps) {
    LK_OP_CHECK_INPUTS(x);
    static const char *op = "layer_norm";
    if (lk__same_device(op, 3, (lk_tensor *[]){x, weight, bias})) return NULL;
    char s[128];
    if (lk__check_float(op, x, "input") || (weight && lk__check_float(op, weight, "weight")) ||
        (bias && lk__check_float(op, bias, "bias")))
        return NULL;
    if (normalized_ndim < 1 || normalized_ndim > x->ndim)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: normalized_ndim = %d must be in [1, %d] for input of shape %s",
                        op, normalized_ndim, x->ndim, lk_shape_str(x, s, sizeof s)),
               NULL;
    if (!(eps >= 0.0f && isfinite(eps)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: eps = %g must be finite and >= 0", op, (double)eps), NULL;
    if ((weight && check_norm_param(x, normalized_ndim, weight, "weight")) ||
        (bias && check_norm_param(x, normalized_ndim, bias, "bias")))
        return NULL;
    int64_t M = 1, L = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < x->ndim - normalized_ndim) M *= x->shape[i];
        else L *= x->shape[i];
    }
    lk_tensor *in[3] = {x, NULL, NULL};
    int n_in = 1;
    if (weight) in[n_in++] = weight;
    if (bias) in[n_in++] = bias;
    bool need = lk__needs_grad(n_in, in);
    /* same as input: each tensor in its own dtype (no f32 copies kept), the
     * row statistics in f32, the output in x's dtype */
    lk_tensor *xc = lk__contig_keep(x), *wc = NULL, *bc = NULL, *stats = NULL, *out = NULL;
    if (!xc || (weight && !(wc = lk__contig_keep(weight))) || (bias && !(bc = lk__contig_keep(bias)))) goto done;
    if (need && !(stats = lk__tensor_new_on(x->device, LK_F32, 2, (int64_t[]){M, 2}))) goto done;
    if (!(out = lk__tensor_new_on(x->device, x->dtype, x->ndim, x->shape))) goto done;
    lk_op_desc d = {.op = LK_OP_LAYER_NORM,
                    .dtype = {x->dtype, wc ? wc->dtype : LK_F32, bc ? bc->dtype : LK_F32, x->dtype, LK_F32}};
    d.layer_norm = (lk_layer_norm_params){M, L, eps};
    if (lk__backend_run(xc->device, &d,
                        (void *[]){xc->data, wc ? wc->data : NULL, bc ? bc->data : NULL, out->data,
                                   stats ? stats->data : NULL})) {
        lk_tensor_release(out);
        out = NULL;
        goto done;
    }
    lk_node *n = lk__record(op, layer_norm_backward, out, n_in, in);
    if (n) {
        n->a.i[0] = weight != NULL;
        n->a.i[1] = bias != NULL;
        n->a.i[2] = M;
        n->a.i[3] = L;
        n->saved[0] = lk_tensor_retain(xc);
        n->saved[1] = lk_tensor_retain(stats);
        n->saved[2] = lk_tensor_retain(wc);
    }
done:
    lk_tensor_release(xc);
    lk_tensor_release(wc);
    lk_tensor_release(bc);
    lk_tensor_release(stats);
    return lk__op_result(out);
}

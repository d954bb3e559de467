/* The softmax family and everything that consumes class indices: softmax
 * and log_softmax over any dim; cross_entropy (log-softmax and NLL fused in
 * one pass per row, with PyTorch 1.13's class weights, ignore_index, label
 * smoothing and reductions); nll_loss; binary_cross_entropy on probabilities
 * and on logits; and embedding lookup. The per-row math lives in
 * backend/kernels.h (the section "softmax / cross-entropy / BCE"); this file
 * validates arguments, lays out rows and records the tape. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

lk_cross_entropy_opts lk_cross_entropy_opts_default(void) {
    return (lk_cross_entropy_opts){LK_REDUCTION_MEAN, 0.0f, -100, NULL};
}

/* ---- shared helpers ------------------------------------------------------------ */

static lk_status check_reduction(const char *op, lk_reduction r) {
    if (r != LK_REDUCTION_MEAN && r != LK_REDUCTION_SUM && r != LK_REDUCTION_NONE)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: reduction %d is not LK_REDUCTION_MEAN (0), LK_REDUCTION_SUM (1) or LK_REDUCTION_NONE (2)",
                        op, (int)r);
    return LK_STATUS_OK;
}

static lk_status check_index_dtype(const char *op, const lk_tensor *t, const char *arg) {
    if (t->dtype != LK_I64 && t->dtype != LK_I32)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: %s has dtype %s; expected integer indices of dtype i64 (or i32)", op,
                        arg, lk_dtype_name(t->dtype));
    return LK_STATUS_OK;
}

/* Contiguous i32/i64 indices (t retained when already contiguous); caller releases. */
static lk_tensor *index_contig(lk_tensor *t) {
    return lk_tensor_is_contiguous(t) ? lk_tensor_retain(t) : lk_tensor_clone(t);
}

static inline int64_t index_at(const lk_tensor *t, int64_t i) {
    return t->dtype == LK_I64 ? ((const int64_t *)t->data)[i] : (int64_t)((const int32_t *)t->data)[i];
}

/* "[2, 0, 3]": the multi-index of flat element i of t (for error messages). */
static const char *index_str(const lk_tensor *t, int64_t i, char *buf, size_t n) {
    int64_t c[LK_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        c[d] = t->shape[d] ? i % t->shape[d] : 0;
        i = t->shape[d] ? i / t->shape[d] : 0;
    }
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && k < n; d++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)c[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

/* Caller-owned contiguous f32 copy of t broadcast to ref's shape (t retained
 * when it already is that). NULL with the error set when t does not broadcast
 * to exactly ref's shape. */
static lk_tensor *broadcast_to(const char *op, const char *what, lk_tensor *t, const lk_tensor *ref) {
    if (lk_tensor_same_shape(t, ref)) return lk__contig(t);
    int64_t st[LK_MAX_DIMS], zs[LK_MAX_DIMS] = {0};
    bool ok = t->ndim <= ref->ndim;
    for (int i = 0; ok && i < ref->ndim; i++) {
        int it = t->ndim - ref->ndim + i;
        if (it < 0 || t->shape[it] == 1) st[i] = 0;
        else if (t->shape[it] == ref->shape[i]) st[i] = t->stride[it];
        else ok = false;
    }
    if (!ok) {
        lk__error_shapes(op, what, t, ref);
        return NULL;
    }
    lk_tensor *out = lk__tensor_new_on(t->device, LK_F32, ref->ndim, ref->shape);
    if (!out) return NULL;
    static const float zero = 0.0f;
    if (lk__binary_f32(t->device, LK_BINARY_ADD, ref->ndim, ref->shape, t->data, st, &zero, zs, out->data)) {
        lk_tensor_release(out);
        return NULL;
    }
    return out;
}

/* ---- softmax / log_softmax ---------------------------------------------------------- */

/* x viewed as [outer, C, inner] around the softmax dim. */
typedef struct {
    int64_t outer, C, inner;
} dim_split;

static dim_split split_at(const lk_tensor *x, int d) {
    dim_split s = {1, x->ndim ? x->shape[d] : 1, 1};
    for (int i = 0; i < d; i++) s.outer *= x->shape[i];
    for (int i = d + 1; i < x->ndim; i++) s.inner *= x->shape[i];
    return s;
}

static void softmax_backward(lk_node *n, lk_tensor *g) {
    int log_out = (int)n->a.i[0];
    int64_t outer = n->a.i[1], C = n->a.i[2], inner = n->a.i[3];
    lk_tensor *y = n->out;
    lk_tensor *dx = lk__tensor_new_on(y->device, LK_F32, y->ndim, y->shape);
    if (!dx) return;
    lk_op_desc d = {.op = LK_OP_SOFTMAX_BACKWARD, .dtype = {LK_F32, LK_F32, LK_F32}};
    d.softmax = (lk_softmax_params){outer, C, inner, log_out};
    if (lk__backend_run(y->device, &d, (void *[]){y->data, g->data, dx->data})) {
        lk_tensor_release(dx);
        return;
    }
    lk__accum(n->in[0], dx);
    lk_tensor_release(dx);
}

static lk_tensor *softmax_op(lk_tensor *x, int dim, int log_out, const char *name) {
    if (lk__check_float(name, x, "input")) return NULL; /* LK_CAST_FP32: widened by lk__contig, f32 out */
    int d = x->ndim == 0 && (dim == 0 || dim == -1) ? 0 : lk__norm_dim(dim, x->ndim);
    if (d < 0 || (x->ndim > 0 && d >= x->ndim)) {
        char s[128];
        lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: dim %d is out of range for input of shape %s (expected %d..%d)", name,
                 dim, lk_shape_str(x, s, sizeof s), x->ndim ? -x->ndim : -1, x->ndim ? x->ndim - 1 : 0);
        return NULL;
    }
    dim_split s = split_at(x, d);
    lk_tensor *xc = lk__contig(x);
    if (!xc) return NULL;
    lk_tensor *out = lk__tensor_new_on(x->device, LK_F32, x->ndim, x->shape);
    lk_op_desc desc = {.op = LK_OP_SOFTMAX, .dtype = {LK_F32, LK_F32}};
    desc.softmax = (lk_softmax_params){s.outer, s.C, s.inner, log_out};
    if (out && lk__backend_run(xc->device, &desc, (void *[]){xc->data, out->data})) {
        lk_tensor_release(out);
        out = NULL;
    }
    if (out) {
        lk_node *n = lk__record(name, softmax_backward, out, 1, &x);
        if (n) {
            n->a.i[0] = log_out;
            n->a.i[1] = s.outer;
            n->a.i[2] = s.C;
            n->a.i[3] = s.inner;
        }
    }
    lk_tensor_release(xc);
    return lk__op_result(out);
}

lk_tensor *lk_softmax(lk_tensor *x, int dim) {
    LK_OP_CHECK_INPUTS(x);
    return softmax_op(x, dim, 0, "softmax");
}

lk_tensor *lk_log_softmax(lk_tensor *x, int dim) {
    LK_OP_CHECK_INPUTS(x);
    return softmax_op(x, dim, 1, "log_softmax");
}

/* ---- cross_entropy / nll_loss ------------------------------------------------------------ */

/* input [N, C, d...] (or [C]) seen as rows r = n * D + d of C classes, where
 * class c of row r sits at n * C * D + c * D + d. */
typedef struct {
    int64_t N, C, D;
    lk_tensor *t; /* targets, contiguous i32/i64, one per row (owned) */
    lk_tensor *w; /* class weights, contiguous f32 [C], or NULL (owned) */
    int64_t counted; /* rows whose target is not ignore_index (counted by the range check) */
} cls_args;

static void cls_args_release(cls_args *a) {
    lk_tensor_release(a->t);
    lk_tensor_release(a->w);
}

/* Validates input/target/weight/reduction and every target value. */
static lk_status cls_args_init(const char *op, lk_tensor *x, lk_tensor *target, const lk_cross_entropy_opts *o,
                               cls_args *a) {
    memset(a, 0, sizeof *a);
    LK_TRY(lk__same_device(op, 3, (lk_tensor *[]){x, target, o->weight}));
    LK_TRY(lk__check_float(op, x, "input")); /* LK_CAST_FP32: widened, the loss in f32 */
    LK_TRY(check_index_dtype(op, target, "target"));
    LK_TRY(check_reduction(op, o->reduction));
    char sx[128];
    if (x->ndim == 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: input must have a class dimension ([N, C], [N, C, d...] or [C]), got shape %s", op,
                        lk_shape_str(x, sx, sizeof sx));
    bool ok = target->ndim == x->ndim - 1;
    if (x->ndim == 1) {
        a->N = 1, a->C = x->shape[0], a->D = 1;
    } else {
        a->N = x->shape[0], a->C = x->shape[1], a->D = 1;
        for (int i = 2; i < x->ndim; i++) a->D *= x->shape[i];
        if (ok) ok = target->shape[0] == x->shape[0];
        for (int i = 2; ok && i < x->ndim; i++) ok = target->shape[i - 1] == x->shape[i];
    }
    if (!ok)
        return lk__error_shapes(op, "target must have the input's shape without the class dimension ([N, C, d...] -> [N, d...])",
                                x, target);
    if (a->C == 0 && a->N * a->D > 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: input of shape %s has 0 classes", op,
                        lk_shape_str(x, sx, sizeof sx));
    if (o->weight) {
        LK_TRY(lk__check_f32(op, o->weight, "weight"));
        if (o->weight->ndim != 1 || o->weight->shape[0] != a->C)
            return lk__error_shapes(op, "weight must hold one value per class (shape [C], C = input dim 1)", o->weight, x);
    }
    a->t = index_contig(target);
    if (!a->t) return lk_last_status();
    int64_t rows = a->N * a->D;
    /* The range check reads the targets on the host (an out-of-range class
     * must be this error, never a read outside the logits): a device's from
     * the loader's batch they were copied from when lk_batch_tensor made
     * them (no device read: on a GPU that would be a synchronisation in the
     * middle of forward), else copied to the host. */
    lk_tensor *ht = lk_device_is_host(a->t->device) ? lk_tensor_retain(a->t) : lk__tensor_host_shadow(a->t);
    if (!ht && !lk_device_is_host(a->t->device)) ht = lk_tensor_to(a->t, LK_DEVICE_CPU);
    if (!ht) {
        cls_args_release(a);
        return lk_last_status();
    }
    a->counted = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = index_at(ht, r);
        a->counted += t != o->ignore_index;
        if (t != o->ignore_index && (t < 0 || t >= a->C)) {
            char si[96];
            lk_tensor_release(ht);
            lk_tensor_release(a->t);
            a->t = NULL;
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "%s: target%s = %lld is out of range for %lld classes (expected 0 <= target < %lld, or "
                            "ignore_index = %lld)",
                            op, index_str(target, r, si, sizeof si), (long long)t, (long long)a->C, (long long)a->C,
                            (long long)o->ignore_index);
        }
    }
    lk_tensor_release(ht);
    if (o->weight && !(a->w = lk__contig(o->weight))) {
        cls_args_release(a);
        return lk_last_status();
    }
    return LK_STATUS_OK;
}

/* The op's total weight (the mean's divisor, kept for backward). Without
 * class weights it is the count of rows not ignored (a sum of 1.0s in f64:
 * exact), which the range check counted on the host: the device's copy is
 * not read back (a synchronisation on a GPU). With class weights, read. */
static lk_status scalars_total_weight(lk__scalars *ws, const cls_args *a, double *wsum) {
    if (!ws->dev || a->w) return lk__scalars_end(ws);
    lk_tensor_release(ws->dev);
    ws->dev = NULL;
    *wsum = (double)a->counted;
    return LK_STATUS_OK;
}

static lk_tensor *loss_out(lk_reduction red, const lk_tensor *shape_of) {
    return red == LK_REDUCTION_NONE ? lk__tensor_new_on(shape_of->device, LK_F32, shape_of->ndim, shape_of->shape)
                                    : lk__tensor_new_on(shape_of->device, LK_F32, 0, NULL);
}

/* a.i: 0 reduction, 1 ignore_index, 2 N, 3 C, 4 D; a.f: 0 total weight (the
 * mean's divisor), 1 label_smoothing, 2 sum of class weights.
 * saved: 0 softmax rows [N*D, C], 1 targets, 2 class weights or NULL. */
static void xent_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *P = n->saved[0], *tt = n->saved[1], *wt = n->saved[2], *x = n->in[0];
    lk_reduction red = (lk_reduction)n->a.i[0];
    int64_t ignore = n->a.i[1], N = n->a.i[2], C = n->a.i[3], D = n->a.i[4];
    float norm = n->a.f[0], eps = n->a.f[1], W = n->a.f[2];
    lk_tensor *dx = lk__tensor_new_on(x->device, LK_F32, x->ndim, x->shape);
    if (!dx) return;
    lk_op_desc d = {.op = LK_OP_XENT_BACKWARD, .dtype = {LK_F32, tt->dtype, LK_F32, LK_F32, LK_F32}};
    d.xent = (lk_xent_params){N, C, D, ignore, red, eps, norm, W};
    if (lk__backend_run(x->device, &d,
                        (void *[]){P ? P->data : NULL, tt->data, wt ? wt->data : NULL, g->data, dx->data})) {
        lk_tensor_release(dx);
        return;
    }
    lk__accum(x, dx);
    lk_tensor_release(dx);
}

lk_tensor *lk_cross_entropy(lk_tensor *logits, lk_tensor *target, const lk_cross_entropy_opts *opts) {
    LK_OP_CHECK_INPUTS(logits, target);
    static const char *op = "cross_entropy";
    lk_cross_entropy_opts o = opts ? *opts : lk_cross_entropy_opts_default();
    if (!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: label_smoothing = %g is outside [0, 1]", op,
                        (double)o.label_smoothing),
               NULL;
    cls_args a;
    if (cls_args_init(op, logits, target, &o, &a)) return NULL;
    const int64_t C = a.C, D = a.D, rows = a.N * a.D;
    const float eps = o.label_smoothing;
    bool need = lk__needs_grad(1, &logits);
    lk_tensor *xc = lk__contig(logits);
    lk_tensor *P = xc && need ? lk__tensor_new_on(xc->device, LK_F32, 2, (int64_t[]){rows, C}) : NULL;
    lk_tensor *out = xc && (P || !need) ? loss_out(o.reduction, target) : NULL;
    if (!out) goto done;
    const float *w = a.w ? a.w->data : NULL;
    double wsum = 0.0;
    lk_op_desc d = {.op = LK_OP_XENT, .dtype = {LK_F32, a.t->dtype, LK_F32, LK_F32, LK_F32, LK_F64}};
    d.xent = (lk_xent_params){a.N, C, D, o.ignore_index, o.reduction, eps, 0.0f, 0.0f};
    lk__scalars ws;
    lk_status st = lk__scalars_begin(&ws, xc->device, LK_F64, 1, &wsum);
    if (!st) st = lk__backend_run(xc->device, &d, (void *[]){xc->data, a.t->data, a.w ? a.w->data : NULL, out->data,
                                                          P ? P->data : NULL, lk__scalars_at(&ws, 0)});
    lk_status st2 = scalars_total_weight(&ws, &a, &wsum);
    if (st || st2) {
        lk_tensor_release(out);
        out = NULL;
        goto done;
    }
    lk_node *n = lk__record(op, xent_backward, out, 1, &logits);
    if (n) {
        float W = (float)C;
        if (w) { /* the class weights on the host (a copy when they live on a device) */
            lk_tensor *wh = lk_device_is_host(a.w->device) ? NULL : lk_tensor_to(a.w, LK_DEVICE_CPU);
            const float *wp = wh ? wh->data : w;
            W = wp ? 0.0f : NAN;
            for (int64_t c = 0; wp && c < C; c++) W += wp[c];
            lk_tensor_release(wh);
        }
        n->a.i[0] = o.reduction;
        n->a.i[1] = o.ignore_index;
        n->a.i[2] = a.N;
        n->a.i[3] = C;
        n->a.i[4] = D;
        n->a.f[0] = (float)wsum;
        n->a.f[1] = eps;
        n->a.f[2] = W;
        n->saved[0] = lk_tensor_retain(P);
        n->saved[1] = lk_tensor_retain(a.t);
        n->saved[2] = lk_tensor_retain(a.w);
    }
done:
    lk_tensor_release(P);
    lk_tensor_release(xc);
    cls_args_release(&a);
    return lk__op_result(out);
}

/* Same node layout as xent_backward, without the softmax. */
static void nll_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *tt = n->saved[1], *wt = n->saved[2], *x = n->in[0];
    lk_reduction red = (lk_reduction)n->a.i[0];
    int64_t ignore = n->a.i[1], N = n->a.i[2], C = n->a.i[3], D = n->a.i[4];
    float norm = n->a.f[0];
    lk_tensor *dx = lk__tensor_zeros_on(x->device, LK_F32, x->ndim, x->shape);
    if (!dx) return;
    lk_op_desc d = {.op = LK_OP_NLL_BACKWARD, .dtype = {tt->dtype, LK_F32, LK_F32, LK_F32}};
    d.xent = (lk_xent_params){N, C, D, ignore, red, 0.0f, norm, 0.0f};
    if (lk__backend_run(x->device, &d, (void *[]){tt->data, wt ? wt->data : NULL, g->data, dx->data})) {
        lk_tensor_release(dx);
        return;
    }
    lk__accum(x, dx);
    lk_tensor_release(dx);
}

lk_tensor *lk_nll_loss(lk_tensor *log_probs, lk_tensor *target, const lk_cross_entropy_opts *opts) {
    LK_OP_CHECK_INPUTS(log_probs, target);
    static const char *op = "nll_loss";
    lk_cross_entropy_opts o = opts ? *opts : lk_cross_entropy_opts_default();
    if (o.label_smoothing != 0.0f)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: label_smoothing = %g is not supported (PyTorch's nll_loss has none; apply it with "
                        "lk_cross_entropy on the logits)",
                        op, (double)o.label_smoothing),
               NULL;
    cls_args a;
    if (cls_args_init(op, log_probs, target, &o, &a)) return NULL;
    const int64_t C = a.C, D = a.D;
    lk_tensor *xc = lk__contig(log_probs);
    lk_tensor *out = xc ? loss_out(o.reduction, target) : NULL;
    double wsum = 0.0;
    lk_op_desc d = {.op = LK_OP_NLL, .dtype = {LK_F32, a.t->dtype, LK_F32, LK_F32, LK_F64}};
    d.xent = (lk_xent_params){a.N, C, D, o.ignore_index, o.reduction, 0.0f, 0.0f, 0.0f};
    lk__scalars ws = {0};
    lk_status st = out ? lk__scalars_begin(&ws, xc->device, LK_F64, 1, &wsum) : LK_STATUS_OK;
    if (out && !st)
        st = lk__backend_run(xc->device, &d, (void *[]){xc->data, a.t->data, a.w ? a.w->data : NULL, out->data,
                                                        lk__scalars_at(&ws, 0)});
    if (out && scalars_total_weight(&ws, &a, &wsum) && !st) st = lk_last_status();
    if (out && st) {
        lk_tensor_release(out);
        out = NULL;
    }
    if (out) {
        lk_node *n = lk__record(op, nll_backward, out, 1, &log_probs);
        if (n) {
            n->a.i[0] = o.reduction;
            n->a.i[1] = o.ignore_index;
            n->a.i[2] = a.N;
            n->a.i[3] = C;
            n->a.i[4] = D;
            n->a.f[0] = (float)wsum;
            n->saved[1] = lk_tensor_retain(a.t);
            n->saved[2] = lk_tensor_retain(a.w);
        }
    }
    lk_tensor_release(xc);
    cls_args_release(&a);
    return lk__op_result(out);
}

/* ---- binary cross-entropy ---------------------------------------------------------------- */

/* a.i: 0 reduction, 1 on logits. saved: 0 input, 1 target, 2 weight and
 * 3 pos_weight broadcast to the input's shape (or NULL). */
static void bce_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *xt = n->saved[0], *tt = n->saved[1], *wt = n->saved[2], *pwt = n->saved[3];
    lk_reduction red = (lk_reduction)n->a.i[0];
    bool logits = n->a.i[1] != 0;
    lk_tensor *dd[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++)
        if (n->in[k]->requires_grad && !(dd[k] = lk__tensor_new_on(xt->device, LK_F32, xt->ndim, xt->shape))) goto done;
    lk_op_desc d = {.op = LK_OP_BCE_BACKWARD, .dtype = {LK_F32, LK_F32, LK_F32, LK_F32, LK_F32, LK_F32, LK_F32}};
    d.bce = (lk_bce_params){xt->numel, red, logits};
    if (lk__backend_run(xt->device, &d,
                        (void *[]){xt->data, tt->data, wt ? wt->data : NULL, pwt ? pwt->data : NULL, g->data,
                                   dd[0] ? dd[0]->data : NULL, dd[1] ? dd[1]->data : NULL}))
        goto done;
    for (int k = 0; k < 2; k++)
        if (dd[k]) lk__accum(n->in[k], dd[k]);
done:
    lk_tensor_release(dd[0]);
    lk_tensor_release(dd[1]);
}

static lk_tensor *bce_op(lk_tensor *x, lk_tensor *t, lk_tensor *w, lk_tensor *pw, lk_reduction red, bool logits,
                         const char *op) {
    if (lk__same_device(op, 4, (lk_tensor *[]){x, t, w, pw})) return NULL;
    if (lk__check_float(op, x, "input") || lk__check_float(op, t, "target") || (w && lk__check_f32(op, w, "weight")) ||
        (pw && lk__check_f32(op, pw, "pos_weight")) || check_reduction(op, red))
        return NULL;
    if (!lk_tensor_same_shape(x, t)) return lk__error_shapes(op, "input and target must have the same shape", x, t), NULL;
    lk_tensor *xc = NULL, *tc = NULL, *wc = NULL, *pwc = NULL, *out = NULL;
    if (!(xc = lk__contig(x)) || !(tc = lk__contig(t))) goto done;
    if (w && !(wc = broadcast_to(op, "weight must broadcast to the input's shape", w, x))) goto done;
    if (pw && !(pwc = broadcast_to(op, "pos_weight must broadcast to the input's shape", pw, x))) goto done;
    const int64_t N = x->numel;
    if (!logits) { /* probabilities, checked on the host (a device's copied there first) */
        lk_tensor *hx = lk_device_is_host(xc->device) ? lk_tensor_retain(xc) : lk_tensor_to(xc, LK_DEVICE_CPU);
        if (!hx) goto done;
        const float *xd = hx->data;
        for (int64_t i = 0; i < N; i++)
            if (!(xd[i] >= 0.0f && xd[i] <= 1.0f)) {
                char si[96];
                lk_error(LK_STATUS_INVALID_ARGUMENT,
                         "%s: input%s = %g is outside [0, 1] (it takes probabilities; use "
                         "binary_cross_entropy_with_logits for logits)",
                         op, index_str(x, i, si, sizeof si), (double)xd[i]);
                lk_tensor_release(hx);
                goto done;
            }
        lk_tensor_release(hx);
    }
    if (!(out = loss_out(red, x))) goto done;
    lk_op_desc d = {.op = LK_OP_BCE, .dtype = {LK_F32, LK_F32, LK_F32, LK_F32, LK_F32}};
    d.bce = (lk_bce_params){N, red, logits};
    if (lk__backend_run(xc->device, &d, (void *[]){xc->data, tc->data, wc ? wc->data : NULL, pwc ? pwc->data : NULL,
                                                   out->data})) {
        lk_tensor_release(out);
        out = NULL;
        goto done;
    }
    lk_tensor *in[2] = {x, t};
    lk_node *n = lk__record(op, bce_backward, out, 2, in);
    if (n) {
        n->a.i[0] = red;
        n->a.i[1] = logits;
        n->saved[0] = lk_tensor_retain(xc);
        n->saved[1] = lk_tensor_retain(tc);
        n->saved[2] = lk_tensor_retain(wc);
        n->saved[3] = lk_tensor_retain(pwc);
    }
done:
    lk_tensor_release(xc);
    lk_tensor_release(tc);
    lk_tensor_release(wc);
    lk_tensor_release(pwc);
    return lk__op_result(out);
}

lk_tensor *lk_binary_cross_entropy(lk_tensor *input, lk_tensor *target, lk_tensor *weight, lk_reduction reduction) {
    LK_OP_CHECK_INPUTS(input, target);
    return bce_op(input, target, weight, NULL, reduction, false, "binary_cross_entropy");
}

lk_tensor *lk_binary_cross_entropy_with_logits(lk_tensor *input, lk_tensor *target, lk_tensor *weight,
                                               lk_tensor *pos_weight, lk_reduction reduction) {
    LK_OP_CHECK_INPUTS(input, target);
    return bce_op(input, target, weight, pos_weight, reduction, true, "binary_cross_entropy_with_logits");
}

/* ---- embedding --------------------------------------------------------------------------- */

/* saved: 0 indices (contiguous). Scatter-adds the rows of g into a dense
 * [V, D] gradient, so repeated indices accumulate. */
static void embedding_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *ic = n->saved[0], *w = n->in[0];
    int64_t D = w->shape[1];
    /* rows summed in f32 (a repeated index adds many rows); lk__accum rounds
     * the sum once to a 16-bit table's dtype */
    lk_tensor *dw = lk__tensor_zeros_on(w->device, LK_F32, 2, w->shape);
    if (!dw) return;
    lk_op_desc d = {.op = LK_OP_EMBEDDING_BACKWARD, .dtype = {g->dtype, ic->dtype, LK_F32}};
    d.embedding = (lk_embedding_params){ic->numel, w->shape[0], D};
    if (!lk__backend_run(w->device, &d, (void *[]){g->data, ic->data, dw->data})) lk__accum(w, dw);
    lk_tensor_release(dw);
}

lk_tensor *lk_embedding(lk_tensor *weight, lk_tensor *idx) {
    LK_OP_CHECK_INPUTS(weight, idx);
    static const char *op = "embedding";
    char s[128];
    if (lk__check_float(op, weight, "weight") || check_index_dtype(op, idx, "idx")) return NULL;
    if (weight->ndim != 2)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: weight must be [V, D] (2 dims), got shape %s", op,
                        lk_shape_str(weight, s, sizeof s)),
               NULL;
    if (idx->ndim + 1 > LK_MAX_DIMS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: idx of shape %s has %d dims; the output would exceed %d", op,
                        lk_shape_str(idx, s, sizeof s), idx->ndim, LK_MAX_DIMS),
               NULL;
    const int64_t V = weight->shape[0], D = weight->shape[1];
    lk_tensor *ic = index_contig(idx);
    if (!ic) return NULL;
    for (int64_t i = 0; i < ic->numel; i++) {
        int64_t v = index_at(ic, i);
        if (v < 0 || v >= V) {
            lk_error(LK_STATUS_INVALID_ARGUMENT,
                     "%s: idx%s = %lld is out of range for %lld embeddings (expected 0 <= index < %lld)", op,
                     index_str(idx, i, s, sizeof s), (long long)v, (long long)V, (long long)V);
            lk_tensor_release(ic);
            return NULL;
        }
    }
    int64_t shape[LK_MAX_DIMS];
    for (int i = 0; i < idx->ndim; i++) shape[i] = idx->shape[i];
    shape[idx->ndim] = D;
    /* the rows in the table's own dtype (a bf16 table gives bf16 rows) */
    lk_tensor *wc = lk__contig_keep(weight);
    lk_tensor *out = wc ? lk__tensor_new_on(wc->device, wc->dtype, idx->ndim + 1, shape) : NULL;
    lk_op_desc d = {.op = LK_OP_EMBEDDING, .dtype = {wc ? wc->dtype : LK_F32, ic->dtype, wc ? wc->dtype : LK_F32}};
    d.embedding = (lk_embedding_params){ic->numel, V, D};
    if (out && lk__backend_run(wc->device, &d, (void *[]){wc->data, ic->data, out->data})) {
        lk_tensor_release(out);
        out = NULL;
    }
    if (out) {
        lk_node *n = lk__record(op, embedding_backward, out, 1, &weight);
        if (n) n->saved[0] = lk_tensor_retain(ic);
    }
    lk_tensor_release(wc);
    lk_tensor_release(ic);
    return lk__op_result(out);
}

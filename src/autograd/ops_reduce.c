/* Reductions: sum and mean over any set of dims (or all), with keepdim.
 * The forward reuses the broadcast-reduction walker; the backward expands
 * the gradient back over the reduced dims. */
#include <math.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

lk_tensor *lk__expand(lk_tensor *t, int ndim, const int64_t *shape);

static void sum_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *x = n->in[0];
    float scale = n->a.f[0];
    /* g has the keepdim shape (saved in node->a.i[8..]) or the squeezed one. */
    int64_t kshape[LK_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) kshape[i] = (n->a.i[1] >> i) & 1 ? 1 : x->shape[i];
    lk_tensor *gk = lk__tensor_view(g, x->ndim, kshape, NULL, g->offset);
    if (!gk) return;
    int64_t s = 1;
    for (int i = x->ndim - 1; i >= 0; i--) {
        gk->stride[i] = s;
        s *= kshape[i];
    }
    lk_tensor *e = lk__expand(gk, x->ndim, x->shape);
    if (e && scale != 1.0f && lk__affine_f32(e->device, e->numel, scale, 0.0f, false, e->data, e->data)) {
        lk_tensor_release(e);
        e = NULL;
    }
    if (e) lk__accum(x, e);
    lk_tensor_release(e);
    lk_tensor_release(gk);
}

static lk_tensor *reduce(lk_tensor *x, const int *dims, int ndims, bool keepdim, bool mean, const char *name) {
    if (lk__check_float(name, x, "input")) return NULL; /* LK_CAST_FP32: summed in f32, f32 out */
    uint32_t mask = 0;
    if (ndims == 0) mask = (1u << x->ndim) - 1;
    for (int i = 0; i < ndims; i++) {
        int d = lk__norm_dim(dims[i], x->ndim);
        if (d < 0 || x->ndim == 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: dim %d out of range for a %d-d tensor", name, dims[i], x->ndim), NULL;
        if (mask & (1u << d))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: dim %d appears more than once in the list of dims", name, d), NULL;
        mask |= 1u << d;
    }
    int64_t kshape[LK_MAX_DIMS], oshape[LK_MAX_DIMS], count = 1;
    int on = 0;
    for (int i = 0; i < x->ndim; i++) {
        bool r = (mask >> i) & 1;
        kshape[i] = r ? 1 : x->shape[i];
        if (r) count *= x->shape[i];
        if (!r || keepdim) oshape[on++] = kshape[i];
    }
    lk_tensor *xc = lk__contig(x);
    if (!xc) return NULL;
    lk_tensor *r = lk__reduce_to_shape(xc, x->ndim, kshape);
    lk_tensor_release(xc);
    if (!r) return NULL;
    /* reduce_to_shape retains its input when nothing is reduced: copy then. */
    lk_tensor *out = lk__tensor_new_on(r->device, LK_F32, on, oshape);
    if (!out) {
        lk_tensor_release(r);
        return NULL;
    }
    float scale = mean ? (count ? 1.0f / (float)count : NAN) : 1.0f;
    lk_status st = lk__affine_f32(r->device, out->numel, scale, 0.0f, false, r->data, out->data);
    lk_tensor_release(r);
    if (st) {
        lk_tensor_release(out);
        return NULL;
    }
    lk_node *n = lk__record(name, sum_backward, out, 1, &x);
    if (n) {
        n->a.f[0] = scale;
        n->a.i[1] = mask;
    }
    return lk__op_result(out);
}

lk_tensor *lk_sum(lk_tensor *x, const int *dims, int ndims, bool keepdim) {
    LK_OP_CHECK_INPUTS(x);
    return reduce(x, dims, ndims, keepdim, false, "sum");
}

lk_tensor *lk_mean(lk_tensor *x, const int *dims, int ndims, bool keepdim) {
    LK_OP_CHECK_INPUTS(x);
    return reduce(x, dims, ndims, keepdim, true, "mean");
}

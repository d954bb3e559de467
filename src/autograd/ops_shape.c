/* Shape ops: reshape, transpose, slice, contiguous, flatten, concat, and
 * raw storage views. reshape/transpose/slice return views sharing storage;
 * their backward maps the gradient back onto the source's shape. The
 * element copies (concat, slice's backward, the clones of non-contiguous
 * views) are LK_OP_COPY descriptors on the source's backend. */
#include <string.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

lk_tensor *lk__expand(lk_tensor *t, int ndim, const int64_t *shape);

/* dst = src, same shape (dst typically a view into a fresh tensor); a
 * change of dtype stays the tensor layer's cast. */
static lk_status copy_into(lk_tensor *dst, const lk_tensor *src) {
    if (dst->dtype != src->dtype || dst->ndim != src->ndim) return lk_tensor_copy(dst, src);
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {src->dtype, dst->dtype}};
    d.copy.ndim = src->ndim;
    for (int i = 0; i < src->ndim; i++)
        d.copy.shape[i] = src->shape[i], d.copy.ss[i] = src->stride[i], d.copy.sd[i] = dst->stride[i];
    return lk__backend_run(src->device, &d, (void *[]){src->data, dst->data});
}

/* A contiguous copy of t (what lk_tensor_clone makes), through copy_into. */
static lk_tensor *clone(const lk_tensor *t) {
    lk_tensor *r = lk__tensor_new_on(t->device, t->dtype, t->ndim, t->shape);
    if (r && copy_into(r, t)) {
        lk_tensor_release(r);
        return NULL;
    }
    return r;
}

static void reshape_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *x = n->in[0];
    lk_tensor *v = lk__tensor_view(g, x->ndim, x->shape, NULL, g->offset);
    if (!v) return;
    int64_t s = 1;
    for (int i = x->ndim - 1; i >= 0; i--) {
        v->stride[i] = s;
        s *= x->shape[i];
    }
    lk__accum(x, v);
    lk_tensor_release(v);
}

lk_tensor *lk_reshape(lk_tensor *t, int ndim, const int64_t *shape_in) {
    LK_OP_CHECK_INPUTS(t);
    if (ndim < 0 || ndim > LK_MAX_DIMS) return lk_error(LK_STATUS_INVALID_ARGUMENT, "reshape: rank %d out of range", ndim), NULL;
    int64_t shape[LK_MAX_DIMS], known = 1;
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        shape[i] = shape_in[i];
        if (shape[i] == -1) {
            if (infer >= 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "reshape: more than one -1 in the new shape"), NULL;
            infer = i;
        } else known *= shape[i];
    }
    if (infer >= 0) shape[infer] = known ? t->numel / known : 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    if (n != t->numel) {
        char s[128];
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "reshape: cannot view %s (%lld elements) as %lld elements",
                        lk_shape_str(t, s, sizeof s), (long long)t->numel, (long long)n), NULL;
    }
    lk_tensor *src = lk_tensor_is_contiguous(t) ? lk_tensor_retain(t) : clone(t);
    if (!src) return NULL;
    int64_t stride[LK_MAX_DIMS], s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i];
    }
    lk_tensor *out = lk__tensor_view(src, ndim, shape, stride, src->offset);
    lk_tensor_release(src);
    if (!out) return NULL;
    lk__record("reshape", reshape_backward, out, 1, &t);
    return lk__op_result(out);
}

static void transpose_backward(lk_node *n, lk_tensor *g) {
    int d0 = (int)n->a.i[0], d1 = (int)n->a.i[1];
    int64_t shape[LK_MAX_DIMS], stride[LK_MAX_DIMS];
    memcpy(shape, g->shape, sizeof shape);
    memcpy(stride, g->stride, sizeof stride);
    shape[d0] = g->shape[d1], shape[d1] = g->shape[d0];
    stride[d0] = g->stride[d1], stride[d1] = g->stride[d0];
    lk_tensor *v = lk__tensor_view(g, g->ndim, shape, stride, g->offset);
    lk_tensor *c = v ? clone(v) : NULL;
    if (c) lk__accum(n->in[0], c);
    lk_tensor_release(v);
    lk_tensor_release(c);
}

lk_tensor *lk_transpose(lk_tensor *t, int d0, int d1) {
    LK_OP_CHECK_INPUTS(t);
    int a = lk__norm_dim(d0, t->ndim), b = lk__norm_dim(d1, t->ndim);
    if (a < 0 || b < 0 || t->ndim == 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "transpose: dims (%d, %d) out of range for a %d-d tensor", d0, d1, t->ndim), NULL;
    int64_t shape[LK_MAX_DIMS], stride[LK_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(stride, t->stride, sizeof stride);
    shape[a] = t->shape[b], shape[b] = t->shape[a];
    stride[a] = t->stride[b], stride[b] = t->stride[a];
    lk_tensor *out = lk__tensor_view(t, t->ndim, shape, stride, t->offset);
    if (!out) return NULL;
    lk_node *n = lk__record("transpose", transpose_backward, out, 1, &t);
    if (n) n->a.i[0] = a, n->a.i[1] = b;
    return lk__op_result(out);
}

static void slice_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *x = n->in[0];
    int dim = (int)n->a.i[0];
    int64_t start = n->a.i[1];
    lk_tensor *d = lk__tensor_zeros_on(x->device, LK_F32, x->ndim, x->shape);
    if (!d) return;
    lk_tensor *v = lk__tensor_view(d, d->ndim, g->shape, d->stride, start * d->stride[dim]);
    if (v && !copy_into(v, g)) lk__accum(x, d);
    lk_tensor_release(v);
    lk_tensor_release(d);
}

lk_tensor *lk_slice(lk_tensor *t, int dim, int64_t start, int64_t end) {
    LK_OP_CHECK_INPUTS(t);
    int d = lk__norm_dim(dim, t->ndim);
    if (d < 0 || t->ndim == 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "slice: dim %d out of range for a %d-d tensor", dim, t->ndim), NULL;
    if (start < 0) start += t->shape[d];
    if (end < 0) end += t->shape[d];
    if (end > t->shape[d]) end = t->shape[d];
    if (start < 0 || start > end)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "slice: range [%lld, %lld) invalid for dim %d of size %lld",
                        (long long)start, (long long)end, dim, (long long)t->shape[d]), NULL;
    int64_t shape[LK_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[d] = end - start;
    lk_tensor *out = lk__tensor_view(t, t->ndim, shape, t->stride, t->offset + start * t->stride[d]);
    if (!out) return NULL;
    lk_node *n = lk__record("slice", slice_backward, out, 1, &t);
    if (n) n->a.i[0] = d, n->a.i[1] = start;
    return lk__op_result(out);
}

static void identity_backward(lk_node *n, lk_tensor *g) { lk__accum(n->in[0], g); }

lk_tensor *lk_contiguous(lk_tensor *t) {
    LK_OP_CHECK_INPUTS(t);
    if (lk_tensor_is_contiguous(t)) return lk__op_result(lk_tensor_retain(t));
    lk_tensor *out = clone(t);
    if (!out) return NULL;
    lk__record("contiguous", identity_backward, out, 1, &t);
    return lk__op_result(out);
}

lk_tensor *lk_flatten(lk_tensor *x, int start_dim, int end_dim) {
    LK_OP_CHECK_INPUTS(x);
    if (x->ndim == 0) return lk_reshape(x, 1, (int64_t[]){1});
    int s = lk__norm_dim(start_dim, x->ndim), e = lk__norm_dim(end_dim, x->ndim);
    if (s < 0 || e < 0 || s > e)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "flatten: dims [%d, %d] invalid for a %d-d tensor", start_dim, end_dim, x->ndim), NULL;
    int64_t shape[LK_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < s; i++) shape[n++] = x->shape[i];
    int64_t m = 1;
    for (int i = s; i <= e; i++) m *= x->shape[i];
    shape[n++] = m;
    for (int i = e + 1; i < x->ndim; i++) shape[n++] = x->shape[i];
    return lk_reshape(x, n, shape);
}

lk_tensor *lk_tensor_view_storage(lk_tensor *base, int64_t offset_elems, int ndim, const int64_t *shape) {
    if (!base) return NULL;
    int64_t n = 1, stride[LK_MAX_DIMS];
    for (int i = ndim - 1; i >= 0; i--) {
        stride[i] = n;
        n *= shape[i];
    }
    if (offset_elems < 0 || (size_t)(offset_elems + n) * lk_dtype_size(base->dtype) > lk__storage_cap(base->storage))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "view_storage: range [%lld, %lld) outside the storage",
                        (long long)offset_elems, (long long)(offset_elems + n)), NULL;
    return lk__tensor_view(base, ndim, shape, stride, offset_elems);
}

/* ---- concat ------------------------------------------------------------------------ */

static void concat_backward(lk_node *n, lk_tensor *g) {
    int dim = (int)n->a.i[0];
    int64_t off = 0;
    for (int i = 0; i < n->n_in; i++) {
        lk_tensor *x = n->in[i];
        if (x->requires_grad) {
            lk_tensor *v = lk__tensor_view(g, g->ndim, x->shape, g->stride, g->offset + off * g->stride[dim]);
            lk_tensor *c = v ? clone(v) : NULL;
            if (c) lk__accum(x, c);
            lk_tensor_release(c);
            lk_tensor_release(v);
        }
        off += x->shape[dim];
    }
}

lk_tensor *lk_concat(lk_tensor *const *ts, int n, int dim) {
    if (n <= 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "concat: no tensors given"), NULL;
    for (int i = 0; i < n; i++)
        if (!ts[i]) return lk_last_status() ? NULL : (lk_error(LK_STATUS_INVALID_ARGUMENT, "concat: tensor %d is NULL", i), NULL);
    if (lk__same_device("concat", n, ts)) return NULL;
    const lk_tensor *t0 = ts[0];
    int d = lk__norm_dim(dim, t0->ndim);
    if (d < 0 || t0->ndim == 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "concat: dim %d out of range", dim), NULL;
    int64_t shape[LK_MAX_DIMS];
    memcpy(shape, t0->shape, sizeof shape);
    shape[d] = 0;
    lk_dtype dt = t0->dtype; /* same dtype stays; mixed float dtypes promote to f32, as the binary ops */
    for (int i = 0; i < n; i++) {
        if (lk__check_float("concat", ts[i], "input")) return NULL;
        dt = lk__promote(dt, ts[i]->dtype);
        if (ts[i]->ndim != t0->ndim) return lk__error_shapes("concat", "ranks differ", t0, ts[i]), NULL;
        for (int k = 0; k < t0->ndim; k++)
            if (k != d && ts[i]->shape[k] != t0->shape[k])
                return lk__error_shapes("concat", "sizes differ outside the concat dim", t0, ts[i]), NULL;
        shape[d] += ts[i]->shape[d];
    }
    lk_tensor *out = lk__tensor_new_on(t0->device, dt, t0->ndim, shape);
    if (!out) return NULL;
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        lk_tensor *v = lk__tensor_view(out, out->ndim, ts[i]->shape, out->stride, off * out->stride[d]);
        if (!v || copy_into(v, ts[i])) {
            lk_tensor_release(v);
            lk_tensor_release(out);
            return NULL;
        }
        lk_tensor_release(v);
        off += ts[i]->shape[d];
    }
    lk_node *node = lk__record("concat", concat_backward, out, n, ts);
    if (node) node->a.i[0] = d;
    return lk__op_result(out);
}

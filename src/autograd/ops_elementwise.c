/* Element-wise ops with NumPy broadcasting: add/sub/mul/div, scalar forms,
 * and the unary activations, each with its backward. */
#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

/* Strides of t as seen from a broadcast output of rank `ndim` (0 where t broadcasts). */
static void bcast_strides(const lk_tensor *t, int ndim, const int64_t *shape, int64_t *st) {
    for (int i = 0; i < ndim; i++) {
        int it = t->ndim - ndim + i;
        st[i] = (it >= 0 && t->shape[it] == shape[i]) ? t->stride[it] : 0;
    }
}

/* Caller-owned contiguous tensor of `shape` holding t broadcast to it. */
lk_tensor *lk__expand(lk_tensor *t, int ndim, const int64_t *shape) {
    lk_tensor *out = lk__tensor_new(LK_F32, ndim, shape);
    if (!out) return NULL;
    static const float zero = 0.0f;
    int64_t sa[LK_MAX_DIMS], sb[LK_MAX_DIMS] = {0};
    bcast_strides(t, ndim, shape, sa);
    if (lk__binary_f32(t->device, LK_BINARY_ADD, ndim, shape, t->data, sa, &zero, sb, out->data)) {
        lk_tensor_release(out);
        return NULL;
    }
    return out;
}

static lk_tensor *binary_raw(lk_binary_op op, lk_tensor *a, lk_tensor *b, const char *name) {
    int ndim;
    int64_t shape[LK_MAX_DIMS], sa[LK_MAX_DIMS], sb[LK_MAX_DIMS];
    if (lk__check_f32(name, a, "a") || lk__check_f32(name, b, "b")) return NULL;
    if (lk__broadcast_shape(name, a, b, &ndim, shape)) return NULL;
    lk_tensor *out = lk__tensor_new(LK_F32, ndim, shape);
    if (!out) return NULL;
    bcast_strides(a, ndim, shape, sa);
    bcast_strides(b, ndim, shape, sb);
    if (lk__binary_f32(a->device, op, ndim, shape, a->data, sa, b->data, sb, out->data)) {
        lk_tensor_release(out);
        return NULL;
    }
    return out;
}

static void accum_release(lk_tensor *t, lk_tensor *g) { lk__accum_move(t, g); }

static void binary_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *a = n->in[0], *b = n->in[1];
    int op = (int)n->a.i[0];
    switch (op) {
    case LK_BINARY_ADD:
        if (a->requires_grad) lk__accum(a, g);
        if (b->requires_grad) lk__accum(b, g);
        break;
    case LK_BINARY_SUB:
        if (a->requires_grad) lk__accum(a, g);
        if (b->requires_grad) {
            lk_tensor *ng = lk__tensor_new(LK_F32, g->ndim, g->shape);
            if (!ng) return;
            if (lk__unary_f32(g->device, LK_UNARY_NEG, g->numel, g->data, ng->data, 0)) {
                lk_tensor_release(ng);
                return;
            }
            accum_release(b, ng);
        }
        break;
    case LK_BINARY_MUL:
        if (a->requires_grad) accum_release(a, binary_raw(LK_BINARY_MUL, g, b, "mul backward"));
        if (b->requires_grad) accum_release(b, binary_raw(LK_BINARY_MUL, g, a, "mul backward"));
        break;
    case LK_BINARY_DIV:
        if (a->requires_grad) accum_release(a, binary_raw(LK_BINARY_DIV, g, b, "div backward"));
        if (b->requires_grad) { /* d(a/b)/db = -a/b^2 = -out/b */
            lk_tensor *t = binary_raw(LK_BINARY_MUL, g, n->out, "div backward");
            lk_tensor *u = t ? binary_raw(LK_BINARY_DIV, t, b, "div backward") : NULL;
            lk_tensor_release(t);
            if (u && lk__unary_f32(u->device, LK_UNARY_NEG, u->numel, u->data, u->data, 0)) {
                lk_tensor_release(u);
                return;
            }
            accum_release(b, u);
        }
        break;
    }
}

static lk_tensor *binary_op(lk_binary_op op, lk_tensor *a, lk_tensor *b, const char *name) {
    lk_tensor *out = binary_raw(op, a, b, name);
    if (!out) return NULL;
    lk_tensor *in[2] = {a, b};
    lk_node *n = lk__record(name, binary_backward, out, 2, in);
    if (n) n->a.i[0] = op;
    return lk__op_result(out);
}

lk_tensor *lk_add(lk_tensor *a, lk_tensor *b) {
    LK_OP_CHECK_INPUTS(a, b);
    return binary_op(LK_BINARY_ADD, a, b, "add");
}
lk_tensor *lk_sub(lk_tensor *a, lk_tensor *b) {
    LK_OP_CHECK_INPUTS(a, b);
    return binary_op(LK_BINARY_SUB, a, b, "sub");
}
lk_tensor *lk_mul(lk_tensor *a, lk_tensor *b) {
    LK_OP_CHECK_INPUTS(a, b);
    return binary_op(LK_BINARY_MUL, a, b, "mul");
}
lk_tensor *lk_div(lk_tensor *a, lk_tensor *b) {
    LK_OP_CHECK_INPUTS(a, b);
    return binary_op(LK_BINARY_DIV, a, b, "div");
}

/* ---- scalar affine: y = a * mul + add ---------------------------------------- */

static void affine_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *x = n->in[0];
    float m = n->a.f[0];
    if (m == 1.0f) {
        lk__accum(x, g);
        return;
    }
    lk_tensor *d = lk__tensor_new(LK_F32, g->ndim, g->shape);
    if (!d) return;
    if (lk__affine_f32(g->device, g->numel, m, 0.0f, false, g->data, d->data)) {
        lk_tensor_release(d);
        return;
    }
    accum_release(x, d);
}

static lk_tensor *affine(lk_tensor *x, float mul, float add, const char *name) {
    if (lk__check_f32(name, x, "input")) return NULL;
    lk_tensor *xc = lk__contig(x);
    if (!xc) return NULL;
    lk_tensor *out = lk__tensor_new(LK_F32, x->ndim, x->shape);
    if (out && lk__affine_f32(xc->device, out->numel, mul, add, true, xc->data, out->data)) {
        lk_tensor_release(out);
        out = NULL;
    }
    if (out) {
        lk_node *n = lk__record(name, affine_backward, out, 1, &x);
        if (n) n->a.f[0] = mul;
    }
    lk_tensor_release(xc);
    return lk__op_result(out);
}

lk_tensor *lk_add_scalar(lk_tensor *a, float s) {
    LK_OP_CHECK_INPUTS(a);
    return affine(a, 1.0f, s, "add_scalar");
}
lk_tensor *lk_mul_scalar(lk_tensor *a, float s) {
    LK_OP_CHECK_INPUTS(a);
    return affine(a, s, 0.0f, "mul_scalar");
}
lk_tensor *lk_neg(lk_tensor *a) {
    LK_OP_CHECK_INPUTS(a);
    return affine(a, -1.0f, 0.0f, "neg");
}

/* ---- unary ------------------------------------------------------------------- */

static void unary_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *x = n->saved[0], *y = n->out;
    lk_tensor *d = lk__tensor_new(LK_F32, g->ndim, g->shape);
    if (!d) return;
    if (lk__unary_backward_f32(x->device, (lk_unary_op)n->a.i[0], g->numel, x->data, y->data, g->data, d->data,
                               n->a.f[2], false)) {
        lk_tensor_release(d);
        return;
    }
    accum_release(n->in[0], d);
}

lk_tensor *lk__unary(lk_unary_op op, lk_tensor *x, float alpha, const char *name) {
    if (lk__check_f32(name, x, "input")) return NULL;
    lk_tensor *xc = lk__contig(x);
    if (!xc) return NULL;
    lk_tensor *out = lk__tensor_new(LK_F32, x->ndim, x->shape);
    if (out && lk__unary_f32(xc->device, op, out->numel, xc->data, out->data, alpha)) {
        lk_tensor_release(out);
        out = NULL;
    }
    if (out) {
        lk_node *n = lk__record(name, unary_backward, out, 1, &x);
        if (n) {
            n->a.i[0] = op;
            n->a.f[2] = alpha;
            n->saved[0] = lk_tensor_retain(xc);
        }
    }
    lk_tensor_release(xc);
    return lk__op_result(out);
}

#define UNARY(fn, OP, alpha)                         \
    lk_tensor *fn(lk_tensor *x) {                    \
        LK_OP_CHECK_INPUTS(x);                       \
        return lk__unary(LK_UNARY_##OP, x, alpha, #OP); \
    }
UNARY(lk_relu, RELU, 0)
UNARY(lk_tanh, TANH, 0)
UNARY(lk_sigmoid, SIGMOID, 0)
UNARY(lk_exp, EXP, 0)
UNARY(lk_log, LOG, 0)
UNARY(lk_sqrt, SQRT, 0)
UNARY(lk_abs, ABS, 0)
UNARY(lk_silu, SILU, 0)
#undef UNARY

lk_tensor *lk_gelu(lk_tensor *x, lk_gelu_approx approx) {
    LK_OP_CHECK_INPUTS(x);
    return lk__unary(approx == LK_GELU_TANH ? LK_UNARY_GELU_TANH : LK_UNARY_GELU_EXACT, x, 0, "gelu");
}
lk_tensor *lk_leaky_relu(lk_tensor *x, float slope) {
    LK_OP_CHECK_INPUTS(x);
    return lk__unary(LK_UNARY_LEAKY_RELU, x, slope, "leaky_relu");
}
lk_tensor *lk_elu(lk_tensor *x, float alpha) {
    LK_OP_CHECK_INPUTS(x);
    return lk__unary(LK_UNARY_ELU, x, alpha, "elu");
}

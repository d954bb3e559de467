/* Element-wise ops with NumPy broadcasting: add/sub/mul/div, scalar forms,
 * and the unary activations, each with its backward. They run in their
 * inputs' dtype (autocast's LK_CAST_SAME: a bf16 activation stays bf16; the
 * backend widens, computes in f32 and rounds once); f32 with 16-bit promotes
 * to f32. */
#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

/* Strides of t as seen from a broadcast output of rank `ndim` (0 where t broadcasts). */
static void bcast_strides(const lk_tensor *t, int ndim, const int64_t *shape, int64_t *st) {
    for (int i = 0; i < ndim; i++) {
        int it = t->ndim - ndim + i;
        st[i] = (it >= 0 && t->shape[it] == shape[i]) ? t->stride[it] : 0;
    }
}

/* Caller-owned contiguous tensor of `shape` (and t's dtype) holding t broadcast to it. */
lk_tensor *lk__expand(lk_tensor *t, int ndim, const int64_t *shape) {
    lk_tensor *out = lk__tensor_new_on(t->device, t->dtype, ndim, shape);
    if (!out) return NULL;
    static const float zero = 0.0f;
    int64_t sa[LK_MAX_DIMS], sb[LK_MAX_DIMS] = {0};
    bcast_strides(t, ndim, shape, sa);
    lk_op_desc d = {.op = LK_OP_BINARY, .dtype = {t->dtype, LK_F32, t->dtype}};
    d.binary.fn = LK_BINARY_ADD;
    d.binary.ndim = ndim;
    for (int i = 0; i < ndim; i++) d.binary.shape[i] = shape[i], d.binary.sa[i] = sa[i], d.binary.sb[i] = sb[i];
    /* the zero operand lives where the op runs (host memory on the CPU) */
    lk_tensor *z = lk_device_is_host(t->device) ? NULL : lk__tensor_new_on(t->device, LK_F32, 0, NULL);
    lk_status st = !lk_device_is_host(t->device) && !z ? LK_STATUS_OUT_OF_MEMORY : LK_STATUS_OK;
    if (!st && z) st = lk_device_memset(z->device, z->data, 0, sizeof zero);
    if (!st) st = lk__backend_run(t->device, &d, (void *[]){t->data, z ? z->data : (void *)&zero, out->data});
    lk_tensor_release(z);
    if (st) {
        lk_tensor_release(out);
        return NULL;
    }
    return out;
}

/* relu: max(0, a op b) in the same pass (lk_add_relu; the CPU backend only) */
static lk_tensor *binary_raw_relu(lk_binary_op op, lk_tensor *a, lk_tensor *b, const char *name, bool relu) {
    int ndim;
    int64_t shape[LK_MAX_DIMS], sa[LK_MAX_DIMS], sb[LK_MAX_DIMS];
    if (lk__check_float(name, a, "a") || lk__check_float(name, b, "b")) return NULL;
    if (lk__broadcast_shape(name, a, b, &ndim, shape)) return NULL;
    lk_dtype dt = lk__autocast_dtype_for(LK_CAST_SAME, lk__promote(a->dtype, b->dtype));
    lk_tensor *out = lk__tensor_new_on(a->device, dt, ndim, shape);
    if (!out) return NULL;
    bcast_strides(a, ndim, shape, sa);
    bcast_strides(b, ndim, shape, sb);
    lk_op_desc d = {.op = LK_OP_BINARY, .dtype = {a->dtype, b->dtype, dt}};
    d.binary.fn = op;
    d.binary.ndim = ndim;
    d.binary.relu = relu;
    for (int i = 0; i < ndim; i++) d.binary.shape[i] = shape[i], d.binary.sa[i] = sa[i], d.binary.sb[i] = sb[i];
    if (lk__backend_run(a->device, &d, (void *[]){a->data, b->data, out->data})) {
        lk_tensor_release(out);
        return NULL;
    }
    return out;
}

static lk_tensor *binary_raw(lk_binary_op op, lk_tensor *a, lk_tensor *b, const char *name) {
    return binary_raw_relu(op, a, b, name, false);
}

static void accum_release(lk_tensor *t, lk_tensor *g) { lk__accum_move(t, g); }

/* y = fn(x) over contiguous x and y of x's shape, each in its own dtype. */
static lk_status unary_run(lk_unary_op fn, const lk_tensor *x, lk_tensor *y, float alpha) {
    lk_op_desc d = {.op = LK_OP_UNARY, .dtype = {x->dtype, y->dtype}};
    d.unary = (lk_unary_params){fn, x->numel, alpha, false};
    return lk__backend_run(x->device, &d, (void *[]){x->data, y->data});
}

/* y = x * mul (+ add) over contiguous x and y, each in its own dtype. */
static lk_status affine_run(const lk_tensor *x, lk_tensor *y, float mul, float add, bool has_add) {
    lk_op_desc d = {.op = LK_OP_AFFINE, .dtype = {x->dtype, y->dtype}};
    d.affine = (lk_affine_params){x->numel, mul, add, has_add};
    return lk__backend_run(x->device, &d, (void *[]){x->data, y->data});
}

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
            lk_tensor *ng = lk__tensor_new_on(g->device, g->dtype, g->ndim, g->shape);
            if (!ng) return;
            if (unary_run(LK_UNARY_NEG, g, ng, 0)) {
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
            if (u && unary_run(LK_UNARY_NEG, u, u, 0)) {
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

/* The ReLU's mask, taken from the output y (y > 0 exactly where the sum
 * was: the mask the separate ReLU's backward takes from its input, the
 * same bits on the 16-bit path too), written once; then the add's
 * backward with it: what the two ops' backwards do, minus the sum that
 * the forward no longer writes. */
static void add_relu_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *a = n->in[0], *b = n->in[1], *y = n->out;
    lk_tensor *d = lk__tensor_new_on(g->device, g->dtype, g->ndim, g->shape);
    if (!d) return;
    lk_op_desc desc = {.op = LK_OP_UNARY_BACKWARD, .dtype = {y->dtype, y->dtype, g->dtype, d->dtype}};
    desc.unary = (lk_unary_params){LK_UNARY_RELU, g->numel, 0.0f, false};
    if (lk__backend_run(y->device, &desc, (void *[]){y->data, NULL, g->data, d->data})) {
        lk_tensor_release(d);
        return;
    }
    /* the second input takes d itself (one copy, not two: the copy was
     * 2% of ResNet-20's step) */
    if (a->requires_grad && b->requires_grad) lk__accum(a, d);
    lk__accum_move(b->requires_grad ? b : a, d);
}

lk_tensor *lk_add_relu(lk_tensor *a, lk_tensor *b) {
    LK_OP_CHECK_INPUTS(a, b);
    if (a->device.kind != LK_CPU) return lk_relu(lk_add(a, b)); /* the GPU backends: the two ops */
    lk_tensor *out = binary_raw_relu(LK_BINARY_ADD, a, b, "add_relu", true);
    if (!out) return NULL;
    lk_tensor *in[2] = {a, b};
    lk__record("add_relu", add_relu_backward, out, 2, in);
    return lk__op_result(out);
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
    lk_tensor *d = lk__tensor_new_on(g->device, g->dtype, g->ndim, g->shape);
    if (!d) return;
    if (affine_run(g, d, m, 0.0f, false)) {
        lk_tensor_release(d);
        return;
    }
    accum_release(x, d);
}

static lk_tensor *affine(lk_tensor *x, float mul, float add, const char *name) {
    if (lk__check_float(name, x, "input")) return NULL;
    lk_tensor *xc = lk__contig_keep(x);
    if (!xc) return NULL;
    lk_tensor *out = lk__tensor_new_on(x->device, lk__autocast_dtype_for(LK_CAST_SAME, x->dtype), x->ndim, x->shape);
    if (out && affine_run(xc, out, mul, add, true)) {
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
    lk_tensor *d = lk__tensor_new_on(g->device, g->dtype, g->ndim, g->shape);
    if (!d) return;
    lk_unary_op op = (lk_unary_op)n->a.i[0];
    /* hand over only what the derivative reads (lk_k_unary_grad): a 16-bit
     * operand the backend need not widen */
    bool from_y = op == LK_UNARY_TANH || op == LK_UNARY_SIGMOID || op == LK_UNARY_EXP || op == LK_UNARY_SQRT;
    bool from_x = !from_y && op != LK_UNARY_ELU;
    lk_op_desc desc = {.op = LK_OP_UNARY_BACKWARD, .dtype = {x->dtype, y->dtype, g->dtype, d->dtype}};
    desc.unary = (lk_unary_params){op, g->numel, n->a.f[2], false};
    if (lk__backend_run(x->device, &desc, (void *[]){from_y ? NULL : x->data, from_x ? NULL : y->data, g->data, d->data})) {
        lk_tensor_release(d);
        return;
    }
    accum_release(n->in[0], d);
}

lk_tensor *lk__unary(lk_unary_op op, lk_tensor *x, float alpha, const char *name) {
    if (lk__check_float(name, x, "input")) return NULL;
    lk_tensor *xc = lk__contig_keep(x);
    if (!xc) return NULL;
    lk_tensor *out = lk__tensor_new_on(x->device, lk__autocast_dtype_for(LK_CAST_SAME, x->dtype), x->ndim, x->shape);
    if (out && unary_run(op, xc, out, alpha)) {
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

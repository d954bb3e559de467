/* Regression losses: mse, l1, smooth_l1. (Classification losses live in
 * ops_softmax.c.) Each reduces with mean, sum or none as PyTorch does. */
#include <math.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

typedef lk_ploss_kind loss_kind;
#define LOSS_MSE LK_PLOSS_MSE
#define LOSS_L1 LK_PLOSS_L1
#define LOSS_SMOOTH_L1 LK_PLOSS_SMOOTH_L1

static void pointwise_loss_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *x = n->saved[0], *y = n->saved[1];
    loss_kind kind = (loss_kind)n->a.i[0];
    lk_reduction red = (lk_reduction)n->a.i[1];
    float beta = n->a.f[0];
    int64_t N = x->numel;
    lk_tensor *dx = lk__tensor_new(LK_F32, x->ndim, x->shape);
    if (!dx) return;
    lk_op_desc d = {.op = LK_OP_LOSS_BACKWARD, .dtype = {LK_F32, LK_F32, LK_F32, LK_F32}};
    d.loss = (lk_loss_params){kind, red, N, beta};
    if (lk__backend_run(x->device, &d, (void *[]){x->data, y->data, g->data, dx->data})) {
        lk_tensor_release(dx);
        return;
    }
    if (n->in[0]->requires_grad) lk__accum(n->in[0], dx);
    if (n->in[1]->requires_grad) {
        if (lk__unary_f32(dx->device, LK_UNARY_NEG, N, dx->data, dx->data, 0)) {
            lk_tensor_release(dx);
            return;
        }
        lk__accum(n->in[1], dx);
    }
    lk_tensor_release(dx);
}

static lk_tensor *pointwise_loss(lk_tensor *x, lk_tensor *y, lk_reduction red, loss_kind kind, float beta,
                                 const char *name) {
    /* autocast's LK_CAST_FP32: a 16-bit input is widened (lk__contig) and the loss is f32 */
    if (lk__check_float(name, x, "input") || lk__check_float(name, y, "target")) return NULL;
    if (!lk_tensor_same_shape(x, y)) return lk__error_shapes(name, "input and target differ", x, y), NULL;
    if (kind == LOSS_SMOOTH_L1 && !(beta >= 0.0f))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: beta must be >= 0, got %g", name, beta), NULL;
    if (kind == LOSS_SMOOTH_L1 && beta == 0.0f) kind = LOSS_L1; /* PyTorch: beta 0 is l1 */
    lk_tensor *xc = lk__contig(x), *yc = xc ? lk__contig(y) : NULL;
    lk_tensor *out = yc ? (red == LK_REDUCTION_NONE ? lk__tensor_new(LK_F32, x->ndim, x->shape)
                                                    : lk__tensor_new(LK_F32, 0, NULL))
                        : NULL;
    if (!out) {
        lk_tensor_release(xc);
        lk_tensor_release(yc);
        return NULL;
    }
    lk_op_desc d = {.op = LK_OP_LOSS, .dtype = {LK_F32, LK_F32, LK_F32}};
    d.loss = (lk_loss_params){kind, red, x->numel, beta};
    if (lk__backend_run(xc->device, &d, (void *[]){xc->data, yc->data, out->data})) {
        lk_tensor_release(out);
        lk_tensor_release(xc);
        lk_tensor_release(yc);
        return NULL;
    }
    lk_tensor *in[2] = {x, y};
    lk_node *n = lk__record(name, pointwise_loss_backward, out, 2, in);
    if (n) {
        n->a.i[0] = kind;
        n->a.i[1] = red;
        n->a.f[0] = beta;
        n->saved[0] = lk_tensor_retain(xc);
        n->saved[1] = lk_tensor_retain(yc);
    }
    lk_tensor_release(xc);
    lk_tensor_release(yc);
    return lk__op_result(out);
}

lk_tensor *lk_mse_loss(lk_tensor *input, lk_tensor *target, lk_reduction reduction) {
    LK_OP_CHECK_INPUTS(input, target);
    return pointwise_loss(input, target, reduction, LOSS_MSE, 0, "mse_loss");
}

lk_tensor *lk_l1_loss(lk_tensor *input, lk_tensor *target, lk_reduction reduction) {
    LK_OP_CHECK_INPUTS(input, target);
    return pointwise_loss(input, target, reduction, LOSS_L1, 0, "l1_loss");
}

lk_tensor *lk_smooth_l1_loss(lk_tensor *input, lk_tensor *target, lk_reduction reduction, float beta) {
    LK_OP_CHECK_INPUTS(input, target);
    return pointwise_loss(input, target, reduction, LOSS_SMOOTH_L1, beta, "smooth_l1_loss");
}

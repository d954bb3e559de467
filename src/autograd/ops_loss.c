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
    /* 16-bit x: rounded once by the backend */
    lk_tensor *dx = lk__tensor_new_on(x->device, x->dtype, x->ndim, x->shape);
    if (!dx) return;
    lk_op_desc d = {.op = LK_OP_LOSS_BACKWARD, .dtype = {x->dtype, y->dtype, LK_F32, dx->dtype}};
    d.loss = (lk_loss_params){kind, red, N, beta};
    if (lk__backend_run(x->device, &d, (void *[]){x->data, y->data, g->data, dx->data})) {
        lk_tensor_release(dx);
        return;
    }
    if (n->in[0]->requires_grad) lk__accum(n->in[0], dx);
    if (n->in[1]->requires_grad) {
        lk_op_desc nd = {.op = LK_OP_UNARY, .dtype = {dx->dtype, dx->dtype}};
        nd.unary = (lk_unary_params){LK_UNARY_NEG, N, 0.0f, false};
        if (lk__backend_run(dx->device, &nd, (void *[]){dx->data, dx->data})) {
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
    /* A 16-bit input (and target) is kept as it is, not widened into an f32
     * copy kept for backward: the backend widens each element as it reads it
     * (exact), so the loss is the f32 one at half the memory. */
    bool half = x->dtype != LK_F32;
    lk_tensor *xc = half ? lk__contig_keep(x) : lk__contig(x);
    lk_tensor *yc = !xc ? NULL : half ? lk__contig_keep(y) : lk__contig(y);
    lk_tensor *out = yc ? (red == LK_REDUCTION_NONE ? lk__tensor_new_on(x->device, LK_F32, x->ndim, x->shape)
                                                    : lk__tensor_new_on(x->device, LK_F32, 0, NULL))
                        : NULL;
    if (!out) {
        lk_tensor_release(xc);
        lk_tensor_release(yc);
        return NULL;
    }
    lk_op_desc d = {.op = LK_OP_LOSS, .dtype = {xc->dtype, yc->dtype, LK_F32}};
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

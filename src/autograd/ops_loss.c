/* Regression losses: mse, l1, smooth_l1. (Classification losses live in
 * ops_softmax.c.) Each reduces with mean, sum or none as PyTorch does. */
#include <math.h>

#include "autograd/autograd_impl.h"

typedef enum { LOSS_MSE, LOSS_L1, LOSS_SMOOTH_L1 } loss_kind;

static void pointwise_loss_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *x = n->saved[0], *y = n->saved[1];
    loss_kind kind = (loss_kind)n->a.i[0];
    lk_reduction red = (lk_reduction)n->a.i[1];
    float beta = n->a.f[0];
    int64_t N = x->numel;
    const float *xd = x->data, *yd = y->data, *gd = g->data;
    lk_tensor *dx = lk__tensor_new(LK_F32, x->ndim, x->shape);
    if (!dx) return;
    float *d = dx->data;
    float scale = red == LK_REDUCTION_MEAN ? 1.0f / (float)N : 1.0f;
    for (int64_t i = 0; i < N; i++) {
        float diff = xd[i] - yd[i], gi = red == LK_REDUCTION_NONE ? gd[i] : gd[0] * scale, v;
        switch (kind) {
        case LOSS_MSE: v = 2.0f * diff; break;
        case LOSS_L1: v = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f); break;
        default:
            v = fabsf(diff) < beta ? diff / beta : (diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f));
        }
        d[i] = gi * v;
    }
    if (n->in[0]->requires_grad) lk__accum(n->in[0], dx);
    if (n->in[1]->requires_grad) {
        for (int64_t i = 0; i < N; i++) d[i] = -d[i];
        lk__accum(n->in[1], dx);
    }
    lk_tensor_release(dx);
}

static lk_tensor *pointwise_loss(lk_tensor *x, lk_tensor *y, lk_reduction red, loss_kind kind, float beta,
                                 const char *name) {
    if (lk__check_f32(name, x, "input") || lk__check_f32(name, y, "target")) return NULL;
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
    const float *xd = xc->data, *yd = yc->data;
    float *od = out->data;
    double acc = 0;
    for (int64_t i = 0; i < x->numel; i++) {
        float diff = xd[i] - yd[i], v;
        switch (kind) {
        case LOSS_MSE: v = diff * diff; break;
        case LOSS_L1: v = fabsf(diff); break;
        default: v = fabsf(diff) < beta ? 0.5f * diff * diff / beta : fabsf(diff) - 0.5f * beta;
        }
        if (red == LK_REDUCTION_NONE) od[i] = v;
        else acc += v;
    }
    if (red == LK_REDUCTION_SUM) od[0] = (float)acc;
    if (red == LK_REDUCTION_MEAN) od[0] = x->numel ? (float)(acc / (double)x->numel) : NAN;
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

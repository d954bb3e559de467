/* Placeholder: these ops are being written (see the file's owner). They
 * link and fail cleanly until then. */
#include "autograd/autograd_impl.h"

static lk_tensor *not_yet(const char *op) {
    lk_error(LK_STATUS_UNSUPPORTED, "%s: not implemented yet", op);
    return NULL;
}

lk_tensor *lk_conv2d(lk_tensor *x, lk_tensor *w, lk_tensor *b, lk_conv2d_params p) {
    return not_yet("conv2d");
}

lk_tensor *lk_max_pool2d(lk_tensor *x, lk_pool2d_params p) {
    return not_yet("max_pool2d");
}

lk_tensor *lk_avg_pool2d(lk_tensor *x, lk_pool2d_params p) {
    return not_yet("avg_pool2d");
}

lk_tensor *lk_adaptive_avg_pool2d(lk_tensor *x, int out_h, int out_w) {
    return not_yet("adaptive_avg_pool2d");
}

lk_tensor *lk_batch_norm(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight, lk_tensor *bias, bool training, float momentum, float eps) {
    return not_yet("batch_norm");
}


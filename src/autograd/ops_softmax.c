/* Placeholder: these ops are being written (see the file's owner). They
 * link and fail cleanly until then. */
#include "autograd/autograd_impl.h"

static lk_tensor *not_yet(const char *op) {
    lk_error(LK_STATUS_UNSUPPORTED, "%s: not implemented yet", op);
    return NULL;
}

lk_tensor *lk_softmax(lk_tensor *x, int dim) {
    return not_yet("softmax");
}

lk_tensor *lk_log_softmax(lk_tensor *x, int dim) {
    return not_yet("log_softmax");
}

lk_tensor *lk_cross_entropy(lk_tensor *logits, lk_tensor *target, const lk_cross_entropy_opts *opts) {
    return not_yet("cross_entropy");
}

lk_tensor *lk_nll_loss(lk_tensor *log_probs, lk_tensor *target, const lk_cross_entropy_opts *opts) {
    return not_yet("nll_loss");
}

lk_tensor *lk_binary_cross_entropy(lk_tensor *input, lk_tensor *target, lk_tensor *weight, lk_reduction reduction) {
    return not_yet("binary_cross_entropy");
}

lk_tensor *lk_binary_cross_entropy_with_logits(lk_tensor *input, lk_tensor *target, lk_tensor *weight, lk_tensor *pos_weight, lk_reduction reduction) {
    return not_yet("binary_cross_entropy_with_logits");
}

lk_tensor *lk_dropout(lk_tensor *x, float p, bool training, lk_rng *rng) {
    return not_yet("dropout");
}

lk_tensor *lk_layer_norm(lk_tensor *x, int normalized_ndim, lk_tensor *weight, lk_tensor *bias, float eps) {
    return not_yet("layer_norm");
}

lk_tensor *lk_embedding(lk_tensor *weight, lk_tensor *idx) {
    return not_yet("embedding");
}

lk_cross_entropy_opts lk_cross_entropy_opts_default(void) { return (lk_cross_entropy_opts){LK_REDUCTION_MEAN, 0.0f, -100, NULL}; }

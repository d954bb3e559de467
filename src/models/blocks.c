/* Pieces the built-in models share: their construction stream, the
 * Linear/ReLU stack (autoencoder halves, mlp), flattening of image input, and
 * the input shape of the models that flatten it. */
#include <stdio.h>

#include "models/models_impl.h"

void lk__model_rng(lk_rng *rng, uint64_t seed) { lk_rng_init(rng, seed, LK_RNG_INIT, 0, 0); }

lk_layer *lk__mlp_stack(const int64_t *w, int n, double dropout, bool sigmoid, lk_rng *rng) {
    lk_layer *seq = lk_sequential_create(0, NULL);
    if (!seq) return NULL;
    for (int i = 0; i + 1 < n; i++) {
        if (lk_sequential_append(seq, lk_linear_create(w[i], w[i + 1], true, rng))) goto fail;
        if (i + 2 < n) {
            if (lk_sequential_append(seq, lk_relu_create())) goto fail;
            if (dropout > 0 && lk_sequential_append(seq, lk_dropout_create((float)dropout))) goto fail;
        }
    }
    if (sigmoid && lk_sequential_append(seq, lk_sigmoid_create())) goto fail;
    return seq;
fail:
    lk_layer_free(seq);
    return NULL;
}

lk_tensor *lk__flat_rows(lk_tensor *x) {
    if (!x) return NULL;
    if (x->ndim == 2) return x;
    return lk_reshape(x, LK_SHAPE(x->ndim ? x->shape[0] : 1, -1));
}

lk_status lk__flat_input_shape(const lk_model_args *a, int *ndim, int64_t shape[3], char *why, size_t why_size) {
    int64_t d = lk_model_args_int(a, "input_dim");
    *ndim = 1;
    shape[0] = d;
    snprintf(why, why_size, "input_dim %lld", (long long)d);
    return LK_STATUS_OK;
}

/* The autoencoder: encoder Linear stack input_dim-hidden...-latent_dim with
 * ReLU between, decoder mirrored (optional final sigmoid), trained with MSE
 * against its own (flattened) input. Parameter names as the PyTorch module
 * with `encoder`/`decoder` nn.Sequential ("encoder.0.weight"); those two are
 * its blocks. */
#include <string.h>

#include "models/models_impl.h"

static const lk_model_arg autoencoder_args[] = {
    {"input_dim", LK_ARG_INT, "784", "features of a flattened input sample"},
    {"hidden", LK_ARG_INT_LIST, "512,256", "encoder hidden widths (the decoder mirrors them)"},
    {"latent_dim", LK_ARG_INT, "64", "width of the code"},
    {"final_activation", LK_ARG_STRING, "none", "decoder output activation: none or sigmoid"},
};

static lk_status build_autoencoder(const lk_model_args *a, uint64_t seed, lk_layer **out) {
    const int64_t *hidden;
    int n_hidden = lk_model_args_list(a, "hidden", &hidden);
    int64_t w[LK_MODEL_MAX_WIDTHS + 2], rw[LK_MODEL_MAX_WIDTHS + 2];
    int n = 0;
    w[n++] = lk_model_args_int(a, "input_dim");
    for (int k = 0; k < n_hidden; k++) w[n++] = hidden[k];
    w[n++] = lk_model_args_int(a, "latent_dim");
    for (int k = 0; k < n; k++) rw[k] = w[n - 1 - k];
    const char *act = lk_model_args_string(a, "final_activation");
    bool sigmoid;
    if (!strcmp(act, "sigmoid")) sigmoid = true;
    else if (!strcmp(act, "none")) sigmoid = false;
    else return lk_error(LK_STATUS_INVALID_ARGUMENT, "model autoencoder: final_activation = '%s': expected none or sigmoid", act);
    lk_rng rng;
    lk__model_rng(&rng, seed);
    /* blocks: encoder, decoder, on rows of input_dim */
    lk_layer *m = lk__model_seq_create("Autoencoder", 1, &w[0]);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = lk_layer_add_child(m, "encoder", lk__mlp_stack(w, n, 0, false, &rng));
    if (!st) st = lk_layer_add_child(m, "decoder", lk__mlp_stack(rw, n, 0, sigmoid, &rng));
    if (st) {
        lk_layer_free(m);
        return st;
    }
    *out = m;
    return LK_STATUS_OK;
}

const lk_model_info lk__model_autoencoder = {
    .name = "autoencoder",
    .help = "MLP autoencoder (Lightning's classic example, deeper): MSE reconstruction",
    .loss = LK_LOSS_MSE,
    .target_is_input = true,
    .args = autoencoder_args,
    .n_args = (int)(sizeof autoencoder_args / sizeof autoencoder_args[0]),
    .build = build_autoencoder,
    .input_shape = lk__flat_input_shape,
    .loss_fn = lk__loss_reconstruction,
};

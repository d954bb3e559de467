/* The mlp: a classifier input_dim-hidden...-num_classes of Linear layers with
 * ReLU (and optional Dropout) between, in `layers` (nn.Sequential: names
 * "layers.0.weight"); cross-entropy. */
#include "models/models_impl.h"

static const lk_model_arg mlp_args[] = {
    {"input_dim", LK_ARG_INT, "784", "features of a flattened input sample"},
    {"hidden", LK_ARG_INT_LIST, "256,128", "hidden widths"},
    {"num_classes", LK_ARG_INT, "10", "output classes"},
    {"dropout", LK_ARG_FLOAT, "0.0", "dropout probability after each hidden ReLU (0: none)"},
};

static lk_status build_mlp(const lk_model_args *a, uint64_t seed, lk_layer **out) {
    double dropout = lk_model_args_float(a, "dropout");
    if (!(dropout >= 0 && dropout < 1))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model mlp: dropout = %g: expected a probability in [0, 1)", dropout);
    const int64_t *hidden;
    int n_hidden = lk_model_args_list(a, "hidden", &hidden);
    int64_t w[LK_MODEL_MAX_WIDTHS + 2];
    int n = 0;
    w[n++] = lk_model_args_int(a, "input_dim");
    for (int k = 0; k < n_hidden; k++) w[n++] = hidden[k];
    w[n++] = lk_model_args_int(a, "num_classes");
    lk_rng rng;
    lk__model_rng(&rng, seed);
    /* one block, `layers` (itself a Sequential a strategy can cut further), on rows of input_dim */
    lk_layer *m = lk__model_seq_create("MLP", 1, &w[0]);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = lk_layer_add_child(m, "layers", lk__mlp_stack(w, n, dropout, false, &rng));
    if (st) {
        lk_layer_free(m);
        return st;
    }
    *out = m;
    return LK_STATUS_OK;
}

const lk_model_info lk__model_mlp = {
    .name = "mlp",
    .help = "multi-layer perceptron classifier: cross-entropy",
    .loss = LK_LOSS_CROSS_ENTROPY,
    .target_is_input = false,
    .args = mlp_args,
    .n_args = (int)(sizeof mlp_args / sizeof mlp_args[0]),
    .build = build_mlp,
    .input_shape = lk__flat_input_shape,
    .loss_fn = lk__loss_classification,
};

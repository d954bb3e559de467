/* The cnn: conv1(3x3, pad 1)-bn1-ReLU-maxpool(2), conv2-bn2-ReLU-maxpool,
 * fc1 (C2 * (S/4)^2 -> hidden), ReLU, fc2 (-> num_classes); cross-entropy.
 * Takes [N, C, S, S] images or the same elements as flat rows. A sequence
 * of blocks (conv1, bn1, relu1, pool1, conv2, ..., fc1, relu3, fc2) that a
 * strategy can cut anywhere; the same ops in the same order as the
 * hand-written forward it replaced, so results are bitwise the same. */
#include <stdio.h>

#include "models/models_impl.h"

static const lk_model_arg cnn_args[] = {
    {"in_channels", LK_ARG_INT, "1", "input image channels"},
    {"image_size", LK_ARG_INT, "28", "input height = width (multiple of 4)"},
    {"channels", LK_ARG_INT_LIST, "32,64", "channels of the two conv blocks"},
    {"hidden", LK_ARG_INT, "128", "width of the first fully connected layer"},
    {"num_classes", LK_ARG_INT, "10", "output classes"},
};

static lk_status build_cnn(const lk_model_args *a, uint64_t seed, lk_layer **out) {
    int64_t cin = lk_model_args_int(a, "in_channels"), size = lk_model_args_int(a, "image_size");
    int64_t hidden = lk_model_args_int(a, "hidden"), classes = lk_model_args_int(a, "num_classes");
    const int64_t *ch;
    if (lk_model_args_list(a, "channels", &ch) != 2)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model cnn: channels = '%s': expected two widths (conv1, conv2)",
                        lk_model_args_string(a, "channels"));
    if (size % 4)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model cnn: image_size = %lld: expected a multiple of 4 (two 2x2 poolings)",
                        (long long)size);
    int64_t c1 = ch[0], c2 = ch[1];
    lk_layer *m = lk__model_seq_create("CNN", 3, (int64_t[]){cin, size, size});
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    lk_rng rng;
    lk__model_rng(&rng, seed);
    /* The blocks, in forward order. Only conv*, bn* and fc* hold tensors, so
     * the state dict is the PyTorch CNN's (conv1.weight, ..., fc2.bias);
     * the parameter-free blocks only name the cut points. */
    lk_conv2d_params cp = {{1, 1}, {1, 1}, {1, 1}, 1};
    lk_pool2d_params pool = {{2, 2}, {2, 2}, {0, 0}, true, false};
    lk_status st = lk_layer_add_child(m, "conv1", lk_conv2d_create(cin, c1, 3, 3, cp, true, &rng));
    if (!st) st = lk_layer_add_child(m, "bn1", lk_batch_norm2d_create(c1, 1e-5f, 0.1f, true, true));
    if (!st) st = lk_layer_add_child(m, "relu1", lk_relu_create());
    if (!st) st = lk_layer_add_child(m, "pool1", lk_max_pool2d_create(pool));
    if (!st) st = lk_layer_add_child(m, "conv2", lk_conv2d_create(c1, c2, 3, 3, cp, true, &rng));
    if (!st) st = lk_layer_add_child(m, "bn2", lk_batch_norm2d_create(c2, 1e-5f, 0.1f, true, true));
    if (!st) st = lk_layer_add_child(m, "relu2", lk_relu_create());
    if (!st) st = lk_layer_add_child(m, "pool2", lk_max_pool2d_create(pool));
    if (!st) st = lk_layer_add_child(m, "flatten", lk_flatten_create(1, -1));
    if (!st) st = lk_layer_add_child(m, "fc1", lk_linear_create(c2 * (size / 4) * (size / 4), hidden, true, &rng));
    if (!st) st = lk_layer_add_child(m, "relu3", lk_relu_create());
    if (!st) st = lk_layer_add_child(m, "fc2", lk_linear_create(hidden, classes, true, &rng));
    /* each batch norm and its ReLU in one op (same bits): relu1, relu2 stay as cut points, identities */
    if (!st) st = lk_layer_batch_norm_fuse_relu(lk_layer_get_child(m, "bn1"), lk_layer_get_child(m, "relu1"));
    if (!st) st = lk_layer_batch_norm_fuse_relu(lk_layer_get_child(m, "bn2"), lk_layer_get_child(m, "relu2"));
    if (st) {
        lk_layer_free(m);
        return st;
    }
    *out = m;
    return LK_STATUS_OK;
}

/* [in_channels, image_size, image_size] */
static lk_status cnn_input_shape(const lk_model_args *a, int *ndim, int64_t shape[3], char *why, size_t why_size) {
    int64_t c = lk_model_args_int(a, "in_channels"), s = lk_model_args_int(a, "image_size");
    *ndim = 3;
    shape[0] = c;
    shape[1] = shape[2] = s;
    snprintf(why, why_size, "in_channels %lld, image_size %lld", (long long)c, (long long)s);
    return LK_STATUS_OK;
}

const lk_model_info lk__model_cnn = {
    .name = "cnn",
    .help = "two conv+BN+ReLU+max-pool blocks and two fully connected layers: cross-entropy",
    .loss = LK_LOSS_CROSS_ENTROPY,
    .target_is_input = false,
    .args = cnn_args,
    .n_args = (int)(sizeof cnn_args / sizeof cnn_args[0]),
    .build = build_cnn,
    .input_shape = cnn_input_shape,
    .loss_fn = lk__loss_classification,
};

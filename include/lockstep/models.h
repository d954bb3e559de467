/* lockstep/models.h — the built-in models, registered by name for the CLI
 * (`model.class_path: autoencoder` in YAML), each with a table of init
 * arguments (name, type, default, help) that drives --help, YAML validation
 * and "did you mean" hints, and the loss it trains with.
 *
 *   autoencoder  encoder Linear 784-512-256-64 with ReLU between, decoder
 *                mirrored 64-256-512-784 (optional final sigmoid); MSE
 *                against the flattened input. Names as the PyTorch module
 *                with `encoder`/`decoder` nn.Sequential: "encoder.0.weight".
 *   mlp          classifier 784-256-128-10 (ReLU, optional Dropout) in
 *                `layers` (nn.Sequential); cross-entropy.
 *   cnn          conv1(3x3, pad 1)-bn1-ReLU-maxpool(2), conv2-bn2-ReLU-maxpool,
 *                fc1 (C2*7*7 -> 128), ReLU, fc2 (-> 10); cross-entropy.
 *
 * The PyTorch equivalents are written out in tools/gen_nn_fixtures.py; a
 * state dict from lockstep loads into them with strict=True.
 *
 *     lk_layer *m;
 *     lk_model_kv args[] = {{"hidden", "128,64"}, {"dropout", "0.1"}};
 *     if (lk_model_create("mlp", args, 2, 42, &m)) fprintf(stderr, "%s\n", lk_last_error());
 */
#ifndef LOCKSTEP_MODELS_H
#define LOCKSTEP_MODELS_H

#include "lockstep/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { LK_LOSS_MSE, LK_LOSS_CROSS_ENTROPY } lk_loss_kind;
typedef enum { LK_ARG_INT, LK_ARG_FLOAT, LK_ARG_BOOL, LK_ARG_STRING, LK_ARG_INT_LIST } lk_arg_type;

typedef struct lk_model_arg {
    const char *name;
    lk_arg_type type;
    const char *default_value; /* as text, the way YAML would give it */
    const char *help;
} lk_model_arg;

typedef struct lk_model_info {
    const char *name;
    const char *help;
    lk_loss_kind loss;
    bool target_is_input; /* autoencoder: reconstructs its input; else class labels */
    const lk_model_arg *args;
    int n_args;
} lk_model_info;

typedef struct lk_model_kv {
    const char *key, *value;
} lk_model_kv;

/* The registered models (static table; never NULL). */
const lk_model_info *lk_models(int *count);
/* The model of that name, or NULL with an error listing the registered ones. */
const lk_model_info *lk_model_find(const char *name);
/* "autoencoder" etc. built with the given args (unknown keys: an error that
 * suggests the nearest valid name; bad values: an error naming key, value and
 * the expected type) and parameters drawn by lk_layer_reset_parameters(seed).
 * *out is a new layer the caller frees with lk_layer_free. */
lk_status lk_model_create(const char *name, const lk_model_kv *args, int n_args, uint64_t seed, lk_layer **out);
/* The per-sample input the model built from these args takes: [input_dim]
 * for autoencoder and mlp (any sample of input_dim elements; they flatten
 * it), [in_channels, image_size, image_size] for cnn (or the same elements
 * as one flat row); `why` gets the args that set it ("input_dim 784"). */
lk_status lk_model_input_shape(const char *name, const lk_model_kv *args, int n_args, int *ndim, int64_t shape[3],
                               char *why, size_t why_size);
/* The model's training loss for a batch: MSE of output against x (reshaped
 * to the output's shape) for target_is_input models, cross-entropy of
 * output (logits) against the i64 labels y otherwise. Scope-owned result. */
lk_tensor *lk_model_loss(const lk_model_info *info, lk_tensor *output, lk_tensor *x, lk_tensor *y);

#ifdef __cplusplus
}
#endif
#endif

/* Internal to src/models: the parsed-arguments struct and its parser
 * (args.c), the built-in models' infos (one file each, listed in models.c)
 * and the pieces they share (blocks.c). */
#ifndef LK_MODELS_IMPL_H
#define LK_MODELS_IMPL_H

#include "lockstep/models.h"

/* Parsed values, indexed like the model's arg table. */
struct lk_model_args {
    const lk_model_info *info;
    const char *text[LK_MODEL_MAX_ARGS]; /* as given (or the default) */
    int64_t i[LK_MODEL_MAX_ARGS];        /* INT, BOOL (0/1) */
    double f[LK_MODEL_MAX_ARGS];         /* FLOAT */
    int64_t list[LK_MODEL_MAX_ARGS][LK_MODEL_MAX_WIDTHS];
    int list_n[LK_MODEL_MAX_ARGS];
};

/* ---- args.c ---- */

/* Parses args[0..n_args) against m's table into *p (defaults for the ones
 * not given): INVALID_ARGUMENT naming the model and the argument on an
 * unknown name (with the nearest valid one), a missing value or a value
 * of the wrong form. */
lk_status lk__model_args_parse(const lk_model_info *m, const lk_model_kv *args, int n_args, lk_model_args *p);

/* The built-in models (autoencoder.c, mlp.c, cnn.c). */
extern const lk_model_info lk__model_autoencoder;
extern const lk_model_info lk__model_mlp;
extern const lk_model_info lk__model_cnn;
extern const lk_model_info lk__model_gpt;
extern const lk_model_info lk__model_resnet;

/* ---- blocks.c ---- */

/* The construction stream every built-in builder draws from: (seed,
 * LK_RNG_INIT, 0), as lk_model_create always used. */
void lk__model_rng(lk_rng *rng, uint64_t seed);
/* Linear/ReLU stack through widths w[0..n) (a Sequential with children
 * "0", "1", ...), optional Dropout after each hidden ReLU, optional final
 * Sigmoid. NULL with the error set on failure. */
lk_layer *lk__mlp_stack(const int64_t *w, int n, double dropout, bool sigmoid, lk_rng *rng);
/* A built-in model's top layer, of type `type` (static string): its forward
 * brings the input to the model's per-sample shape — sample_ndim 1: rows
 * [N, -1] (a 2-d input untouched); 3: [N, shape...] from a 2-d input of flat
 * rows (other inputs untouched) — then runs its children in order. The
 * children added with lk_layer_add_child are its blocks (lk_model_blocks).
 * NULL with the error set on failure. */
lk_layer *lk__model_seq_create(const char *type, int sample_ndim, const int64_t *sample_shape);
/* True for a layer lk__model_seq_create made. */
bool lk__is_model_seq(const lk_layer *l);
/* Such a model's input as its first block takes it (lk_model_blocks_input). */
lk_tensor *lk__model_seq_input(const lk_layer *l, lk_tensor *x);
/* A built-in model whose blocks are not (all) its children (gpt: its
 * embedding and head stages gather layers from several places of the tree
 * that carries PyTorch's names). Its forward runs the blocks added with
 * lk__model_staged_add in order, so the blocks are the forward by
 * construction. `data`: the model's own (lk_free'd with the layer;
 * lk__model_staged_data). NULL with the error set on failure. */
lk_layer *lk__model_staged_create(const char *type, void *data);
/* Appends a block: `block` is one of the model's own layers (owned false:
 * its name is its dotted path) or a view the model owns (owned true,
 * freed with the model, even on failure). */
lk_status lk__model_staged_add(lk_layer *m, const char *name, lk_layer *block, bool owned);
bool lk__is_model_staged(const lk_layer *l);
void *lk__model_staged_data(const lk_layer *l);
lk_status lk__model_staged_blocks(const lk_layer *m, int *count, const lk_named_layer **blocks);
/* The built-ins' losses: MSE of output against x (reshaped to output's
 * shape when the sizes agree), and cross-entropy of logits against y. */
lk_tensor *lk__loss_reconstruction(lk_tensor *output, lk_tensor *x, lk_tensor *y);
lk_tensor *lk__loss_classification(lk_tensor *output, lk_tensor *x, lk_tensor *y);
/* The input shape of the models that flatten their input: [input_dim]. */
lk_status lk__flat_input_shape(const lk_model_args *a, int *ndim, int64_t shape[3], char *why, size_t why_size);

#endif

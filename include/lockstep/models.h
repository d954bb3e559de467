/* lockstep/models.h — the built-in models, registered by name for the CLI
 * (`model.class_path: autoencoder` in YAML), each with a table of init
 * arguments (name, type, default, help) that drives --help, YAML validation
 * and "did you mean" hints, a builder, and the loss it trains with.
 *
 *   autoencoder  encoder Linear 784-512-256-64 with ReLU between, decoder
 *                mirrored 64-256-512-784 (optional final sigmoid); MSE
 *                against the flattened input. Names as the PyTorch module
 *                with `encoder`/`decoder` nn.Sequential: "encoder.0.weight".
 *   mlp          classifier 784-256-128-10 (ReLU, optional Dropout) in
 *                `layers` (nn.Sequential); cross-entropy.
 *   cnn          conv1(3x3, pad 1)-bn1-ReLU-maxpool(2), conv2-bn2-ReLU-maxpool,
 *                fc1 (C2*7*7 -> 128), ReLU, fc2 (-> 10); cross-entropy.
 *   gpt (GPT)    nanoGPT's GPT-2: token + position embeddings, dropout,
 *                n_layer pre-LayerNorm blocks (causal self-attention,
 *                GELU MLP of 4 x n_embd, residuals), ln_f, lm_head tied to
 *                the token embedding; init args and defaults as nanoGPT's
 *                GPTConfig (n_layer 12, n_head 12, n_embd 768, block_size
 *                1024, vocab_size 50304, dropout 0, bias true) and GPT-2's
 *                initialisation. Input i64 tokens [B, T] (T <= block_size),
 *                output logits [B, T, vocab_size]; cross-entropy against
 *                the next tokens y [B, T]. Names as nanoGPT's model.py
 *                ("transformer.h.0.attn.c_attn.weight", "lm_head.weight"
 *                tied: docs/MODELS.md has the table).
 *   resnet (ResNet) torchvision's ResNet (depth 18/34 basic blocks, 50
 *                bottlenecks) and the CIFAR ResNets (20/32/44/56/110),
 *                width, small 3x3 stem for image_size <= 64 (else 7x7/2 +
 *                max-pool), kaiming fan_out init, zero_init_residual;
 *                torchvision's names ("layer1.0.conv1.weight",
 *                "layer2.0.downsample.0.weight", "fc.weight"); cross-entropy.
 *
 * The PyTorch equivalents are written out in tools/gen_nn_fixtures.py; a
 * state dict from lockstep loads into them with strict=True.
 *
 *     lk_layer *m;
 *     lk_model_kv args[] = {{"hidden", "128,64"}, {"dropout", "0.1"}};
 *     if (lk_model_create("mlp", args, 2, 42, &m)) fprintf(stderr, "%s\n", lk_last_error());
 *
 * A new built-in model is one file, src/models/<name>.c, that defines
 * `const lk_model_info lk__model_<name>` (its argument table, builder, input
 * shape and loss function), plus one line in the built-in list in src/models/models.c.
 * Its builder reads the parsed arguments by name:
 *
 *     static lk_status build_wide(const lk_model_args *a, uint64_t seed, lk_layer **out) {
 *         lk_rng rng;
 *         lk_rng_init(&rng, seed, LK_RNG_INIT, 0, 0);
 *         *out = lk_linear_create(lk_model_args_int(a, "input_dim"), lk_model_args_int(a, "width"), true, &rng);
 *         return *out ? LK_STATUS_OK : lk_last_status();
 *     }
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

/* A model's init arguments parsed against its table (defaults filled in,
 * every value checked against its type). Opaque; read with the accessors
 * below. At most LK_MODEL_MAX_ARGS arguments per model. */
typedef struct lk_model_args lk_model_args;
#define LK_MODEL_MAX_ARGS 16
#define LK_MODEL_MAX_WIDTHS 16 /* entries of an LK_ARG_INT_LIST */

/* Builds the architecture from parsed arguments; `seed` keys any randomness
 * the construction needs (lk_model_create redraws every parameter with
 * lk_layer_reset_parameters(seed) afterwards). *out: a new layer the caller
 * owns; on error NULL with the error set (a bad combination of values names
 * the argument, its value and what was expected). */
typedef lk_status (*lk_model_build_fn)(const lk_model_args *args, uint64_t seed, lk_layer **out);
/* The per-sample input shape the built model takes (ndim 1..3); `why` gets
 * the arguments that set it ("input_dim 784"). */
typedef lk_status (*lk_model_input_shape_fn)(const lk_model_args *args, int *ndim, int64_t shape[3], char *why,
                                             size_t why_size);

/* The loss the model trains with (scope-owned, one element) of its output
 * against the batch: x the input, y the labels (NULL for models whose target
 * is their input). */
typedef lk_tensor *(*lk_model_loss_fn)(lk_tensor *output, lk_tensor *x, lk_tensor *y);

typedef struct lk_model_info {
    const char *name;
    const char *help;
    lk_loss_kind loss;
    bool target_is_input; /* autoencoder: reconstructs its input; else class labels */
    const lk_model_arg *args;
    int n_args;
    lk_model_build_fn build;
    lk_model_input_shape_fn input_shape; /* (optional) NULL: the input is not checked before a run */
    lk_model_loss_fn loss_fn;            /* (optional) NULL: the loss by `loss` (lk_model_loss) */
    const char *alias;                   /* (optional) a second name lk_model_find accepts ("GPT") */
    /* The input is a sequence of token ids (i64 [T]) of at most the input
     * shape's length (gpt: block_size), not a sample of exactly that shape. */
    bool tokens;
} lk_model_info;

typedef struct lk_model_kv {
    const char *key, *value;
} lk_model_kv;

/* The registered models, in the built-in list's order (static table; never NULL). */
const lk_model_info *lk_models(int *count);
/* The model of that name, or NULL with an error listing the registered ones. */
const lk_model_info *lk_model_find(const char *name);
/* "autoencoder" etc. built with the given args (unknown keys: an error that
 * suggests the nearest valid name; bad values: an error naming key, value and
 * the expected type) and parameters drawn by lk_layer_reset_parameters(seed).
 * *out is a new layer the caller frees with lk_layer_free. */
lk_status lk_model_create(const char *name, const lk_model_kv *args, int n_args, uint64_t seed, lk_layer **out);
/* The same model, deferred (PyTorch's meta device): its structure, names,
 * shapes and dtypes, and no storage (nothing allocated, nothing drawn);
 * (*out)->deferred is set. lk_layer_materialize then gives it
 * lk_model_create's bits — or a pipeline stage materialises only its own
 * blocks, so a model bigger than one process's memory trains in stages.
 * Anything that reads a tensor before then is refused, naming it. */
lk_status lk_model_create_deferred(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                                   lk_layer **out);
/* The per-sample input the model built from these args takes: [input_dim]
 * for autoencoder and mlp (any sample of input_dim elements; they flatten
 * it), [in_channels, image_size, image_size] for cnn (or the same elements
 * as one flat row); `why` gets the args that set it ("input_dim 784").
 * *ndim 0: the model does not say (no input_shape function). */
lk_status lk_model_input_shape(const char *name, const lk_model_kv *args, int n_args, int *ndim, int64_t shape[3],
                               char *why, size_t why_size);
/* The model's training loss for a batch: its loss_fn — for the built-ins MSE
 * of output against x (reshaped to the output's shape) for target_is_input
 * models, cross-entropy of output (logits) against the i64 labels y
 * otherwise; the same by `loss` for an info without loss_fn. A missing x
 * (target_is_input) or y (otherwise) is an error. Scope-owned result. */
lk_tensor *lk_model_loss(const lk_model_info *info, lk_tensor *output, lk_tensor *x, lk_tensor *y);

/* ---- blocks: where a pipeline strategy cuts ---------------------------------------- */

/* A built-in model is a sequence of blocks: its forward brings the input to
 * the model's input shape (lk_model_input_shape: rows [N, input_dim], images
 * [N, C, S, S]) and then runs its top-level children in order, so for an
 * input of that shape running blocks [0, k) and then [k, n) is the model's
 * forward — the cut points of a pipeline. *count gets the number of blocks
 * and *blocks the array of them; both borrowed from `model`, valid until it
 * is freed or changed. A block's name is its dotted path in the model
 * when the block is one of the model's layers (lk_layer_get_child(model,
 * name) is the block; the prefix of its parameters' names: "conv1",
 * "encoder", "transformer.h.3"); a block that gathers layers from several
 * places of the tree is a view holding them as borrowed children
 * (lk_layer_add_child_ref) and has a name with no dot that is no child of
 * the model ("embedding", "head"). Either way a block's parameters are
 * those of its layer's tree (lk_layer_named_parameters(block)); their
 * names in the model's state dict are those the model gives the same
 * tensors. A tied parameter is in two blocks (gpt's wte: embedding and head).
 *   autoencoder  encoder, decoder
 *   mlp          layers (itself a Sequential: pass it here to cut inside)
 *   cnn          conv1 bn1 relu1 pool1 conv2 bn2 relu2 pool2 flatten fc1 relu3 fc2
 *   gpt          embedding (transformer.wte, .wpe, .drop: tokens [B, T] to
 *                [B, T, C]), transformer.h.0 .. transformer.h.<n_layer-1>,
 *                head (transformer.ln_f, lm_head: to logits [B, T, V])
 *   resnet       stem (conv1, bn1, relu, maxpool), layer1.0 .. layerS.B (every
 *                residual block), head (avgpool, flatten, fc)
 * A plain Sequential (lk_sequential_create) answers with its children too.
 * Any other layer computes something of its own between its children: an
 * INVALID_ARGUMENT error naming its type, *count 0 and *blocks NULL. */
lk_status lk_model_blocks(const lk_layer *model, int *count, const lk_named_layer **blocks);
/* What the model's forward does before its first block, applied to x: the
 * input brought to the model's input shape (the autoencoder and the mlp
 * flatten images [N, C, H, W] to rows, the cnn makes rows into images; the
 * others take x as it is). A pipeline's first stage runs it on each
 * micro-batch before its blocks. Nothing runs after the last block in any
 * of these models (the last block's output is the model's). Scope-owned
 * result (x itself when nothing is done); NULL with the error set. */
lk_tensor *lk_model_blocks_input(const lk_layer *model, lk_tensor *x);

/* ---- generation: sampling from a language model ----------------------------------- */

typedef struct lk_generate_config {
    int64_t max_new_tokens; /* tokens to add (>= 1; default 256) */
    double temperature;     /* logits / temperature (> 0; default 1) */
    int64_t top_k;          /* sample among the k most likely (0: all; default 0) */
    int64_t block_size;     /* feed at most the last block_size tokens (the model's context; 0: all) */
    uint64_t seed;          /* keys the draws: the same seed gives the same tokens */
} lk_generate_config;
lk_generate_config lk_generate_config_default(void);
/* Extends `prompt` (n_prompt >= 1 tokens) by max_new_tokens tokens sampled
 * from `net`, any layer whose forward maps i64 [1, t] to logits [1, t, V]
 * (run without gradients, in eval mode, restored after). *out (lk_malloc'd,
 * the caller lk_frees it) gets the prompt and the new tokens, *n_out their
 * count. Errors: a bad setting, a prompt token outside [0, V), a model
 * whose output is not [1, t, V]. */
lk_status lk_generate(lk_layer *net, const int64_t *prompt, int64_t n_prompt, const lk_generate_config *cfg,
                      int64_t **out, int64_t *n_out);

/* ---- parsed arguments, for builders ------------------------------------------------- */

/* The value of the argument `name` of the model's table. Asking for a name
 * the table does not declare, or with the accessor of another type, is a bug
 * in the model and panics. _int: LK_ARG_INT; _bool: LK_ARG_BOOL; _float:
 * LK_ARG_FLOAT; _string: the text as given (any type; borrowed, lives as long
 * as `a`); _list: LK_ARG_INT_LIST, returns the count, *values borrowed. */
int64_t lk_model_args_int(const lk_model_args *a, const char *name);
bool lk_model_args_bool(const lk_model_args *a, const char *name);
double lk_model_args_float(const lk_model_args *a, const char *name);
const char *lk_model_args_string(const lk_model_args *a, const char *name);
int lk_model_args_list(const lk_model_args *a, const char *name, const int64_t **values);

#ifdef __cplusplus
}
#endif
#endif

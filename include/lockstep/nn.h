/* lockstep/nn.h — layers (PyTorch's nn.Module building blocks) with named
 * parameters, buffers and children; initialisers; named tensor lists and
 * state dicts; flattening every parameter and gradient into one contiguous
 * buffer for the fused optimizers and DDP's bucketed all-reduce.
 *
 * Naming: an `lk_layer` is what PyTorch calls an nn.Module. The name
 * `lk_module` belongs to the trainer (the LightningModule equivalent).
 *
 * A layer is a plain struct: a type name, a forward function, parameters,
 * buffers and children in registration order, a training flag and private
 * data. Parameter and buffer names follow PyTorch's dotted convention for the
 * same architecture ("encoder.0.weight", "bn1.running_mean"), so a state dict
 * round-trips by name with the PyTorch module of the same structure.
 *
 * Ownership: a layer owns its parameters, buffers and children and frees them
 * in lk_layer_free (recursively). Built-in constructors return a new layer the
 * caller owns (or NULL with the error set).
 *
 * A custom layer in C (this compiles; tests/nn/test_layers.c runs it):
 *
 *     typedef struct { float scale; } my_impl;
 *     static lk_tensor *my_forward(lk_layer *self, lk_tensor *x) {
 *         my_impl *m = self->impl;
 *         lk_tensor *h = lk_layer_forward(lk_layer_child(self, 0), x);   // "fc"
 *         return lk_mul_scalar(lk_relu(h), m->scale);
 *     }
 *     static lk_layer *my_create(lk_rng *rng) {
 *         my_impl *m = lk_calloc(1, sizeof *m);
 *         if (!m) return NULL;
 *         m->scale = 2.0f;
 *         lk_layer *l = lk_layer_create("MyLayer", my_forward, m, NULL); // NULL destroy: impl is lk_free'd
 *         if (!l) { lk_free(m); return NULL; }
 *         if (lk_layer_add_child(l, "fc", lk_linear_create(4, 3, true, rng))) { lk_layer_free(l); return NULL; }
 *         return l;   // parameters: "fc.weight", "fc.bias"
 *     }
 *
 * Forward functions must read parameters through self->params[i].tensor (or
 * lk_layer_param) at call time and never cache the pointers elsewhere:
 * lk_params_flatten replaces every parameter tensor with a view.
 */
#ifndef LOCKSTEP_NN_H
#define LOCKSTEP_NN_H

#include "lockstep/autograd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ========================================================================
 * Named tensor lists (parameters, buffers, state dicts, optimizer state)
 * ====================================================================== */

typedef struct lk_named_tensor {
    char *name;        /* owned by the list */
    lk_tensor *tensor; /* one reference held by the list */
} lk_named_tensor;

/* Zero-initialise ({0}); free with lk_named_tensors_clear. */
typedef struct lk_named_tensors {
    int n, cap;
    lk_named_tensor *items;
} lk_named_tensors;

/* Appends (copies the name, retains t). On failure the list is unchanged. */
lk_status lk_named_tensors_append(lk_named_tensors *l, const char *name, lk_tensor *t);
/* Borrowed tensor with that name, or NULL. */
lk_tensor *lk_named_tensors_find(const lk_named_tensors *l, const char *name);
/* Releases every tensor and name; the list is empty (and reusable) after. */
void lk_named_tensors_clear(lk_named_tensors *l);

/* ========================================================================
 * The layer struct
 * ====================================================================== */

typedef struct lk_layer lk_layer;
typedef lk_tensor *(*lk_layer_forward_fn)(lk_layer *self, lk_tensor *x);
/* Frees self->impl (and anything it owns). NULL means lk_free(self->impl). */
typedef void (*lk_layer_destroy_fn)(lk_layer *self);
/* Re-draws this layer's own parameters (not its children's) from rng. */
typedef lk_status (*lk_layer_reset_fn)(lk_layer *self, lk_rng *rng);
/* Re-keys a layer's own random stream for one training step (Dropout's
 * mask): `stream` tells the layer apart from the others of the network and
 * the rank, `step` the optimizer step. */
typedef void (*lk_layer_reseed_fn)(lk_layer *self, uint64_t seed, uint32_t stream, uint64_t step);

typedef struct lk_named_layer {
    char *name;
    lk_layer *layer;
    bool borrowed; /* lk_layer_add_child_ref: the parent does not own (free) it */
} lk_named_layer;

struct lk_layer {
    const char *type;             /* "Linear", "Sequential", ... (static string) */
    lk_layer_forward_fn forward;
    lk_layer_destroy_fn destroy;  /* optional */
    lk_layer_reset_fn reset;      /* optional: lk_layer_reset_parameters uses it */
    lk_layer_reseed_fn reseed;    /* optional: layers that draw randomness; lk_layer_set_rng_step calls it */
    void *impl;                   /* private data of the layer type */
    bool training;                /* true after create; lk_layer_train sets it recursively */
    lk_named_tensors params;      /* own parameters, registration order */
    lk_named_tensors buffers;     /* own buffers (running stats, ...) */
    int n_children, cap_children;
    lk_named_layer *children;     /* registration order */
    /* A layer that draws randomness points this at its own stream (Dropout
     * does): activation checkpointing replays it in the recompute. */
    lk_rng *rng;
    bool checkpoint;              /* lk_layer_set_checkpoint */
    /* A repeated unit of a model (GPT's transformer blocks): what
     * lk_layer_checkpoint_policy with no class names recomputes when the
     * tree marks any. Set by the model's builder. */
    bool checkpoint_unit;
    struct lk__layer_hooks *hooks; /* lk_layer_add_hook; NULL when none */
    /* Deferred initialisation (lk_model_create_deferred sets it on the
     * root): the tree's tensors hold no storage yet, and
     * lk_layer_materialize draws them with lk_layer_reset_parameters from
     * this seed. */
    bool deferred;
    uint64_t deferred_seed;
};

/* A new layer with no parameters; takes ownership of impl (even on failure,
 * where it is freed with destroy or lk_free). */
lk_layer *lk_layer_create(const char *type, lk_layer_forward_fn forward, void *impl, lk_layer_destroy_fn destroy);
/* Frees the layer, its parameters, buffers and children. NULL does nothing. */
void lk_layer_free(lk_layer *l);

/* Registration. Each takes ownership of the tensor/child reference, even on
 * failure (duplicate or invalid name, NULL input, out of memory). A NULL
 * tensor/child (a failed constructor) returns that constructor's error.
 * Parameters get requires_grad = true. */
lk_status lk_layer_add_parameter(lk_layer *l, const char *name, lk_tensor *t);
lk_status lk_layer_add_buffer(lk_layer *l, const char *name, lk_tensor *t);
lk_status lk_layer_add_child(lk_layer *l, const char *name, lk_layer *child);
/* Adds a child l does not own: lk_layer_free(l) leaves it alone, and it
 * must outlive l. For a view over layers that live elsewhere in a tree (a
 * model's pipeline stage made of layers from several places: GPT's
 * embedding stage holds transformer.wte, .wpe and .drop), so the view's
 * named parameters, hooks and checkpointing see them. A view is not put
 * into the tree it borrows from (its parameters would be listed twice). On
 * failure nothing is added (child untouched). */
lk_status lk_layer_add_child_ref(lk_layer *l, const char *name, lk_layer *child);
/* Ties l's parameter `name` to the tensor t, which another layer holds:
 * PyTorch's `lm_head.weight = transformer.wte.weight`. t must have the
 * shape and dtype of the parameter it replaces. The state dict then lists
 * the tensor under both names (so PyTorch's module loads it with
 * strict=True), while named_parameters, lk_layer_num_parameters,
 * lk_params_flatten (one slot in the flat buffer), the optimizers and the
 * gradient reduction see it once, under its first name; both uses add into
 * its one gradient. Retains t; on error nothing has changed. */
lk_status lk_layer_tie_parameter(lk_layer *l, const char *name, lk_tensor *t);

/* Borrowed accessors (NULL when out of range / not found). */
lk_tensor *lk_layer_param(const lk_layer *l, int i);
lk_tensor *lk_layer_buffer(const lk_layer *l, int i);
lk_layer *lk_layer_child(const lk_layer *l, int i);
/* Dotted lookup: "encoder.0.weight" (parameters first, then buffers). */
lk_tensor *lk_layer_get_tensor(const lk_layer *l, const char *dotted_name);
lk_layer *lk_layer_get_child(const lk_layer *l, const char *dotted_name);

/* Runs l->forward, with l's hooks and checkpointing when set; NULL in
 * (layer or x), NULL out with the first error kept. */
lk_tensor *lk_layer_forward(lk_layer *l, lk_tensor *x);

/* ---- hooks at a layer's boundaries (where FSDP gathers and reduces) ------------
 * Each fires from lk_layer_forward of the layer it is set on, in the order
 * the hooks were added, on the thread running the forward or backward:
 *   BEFORE_FORWARD  at the start of the layer's forward, before its forward
 *                   function runs — and again before a checkpointed layer's
 *                   forward is recomputed in the backward
 *                   (lk_layer_recomputing() is then true);
 *   BEFORE_BACKWARD in the backward pass, just before the first gradient of
 *                   the layer's output is propagated into the layer (once
 *                   per backward; not when the output needs no gradient);
 *   AFTER_FORWARD   when the layer's forward returned (not after the
 *                   recompute of a checkpointed layer in the backward);
 *   AFTER_BACKWARD  in the backward pass, once every node the layer's
 *                   forward recorded has been differentiated: the gradients
 *                   its parameters get from this layer are final (a
 *                   parameter the layer shares with another layer may still
 *                   get more from that one). The layer's input then gets a
 *                   gradient even when it needs none (discarded).
 * The backward hooks need grad mode on and something in the layer that
 * requires a gradient during the forward. A hook returning an error stops
 * the forward (NULL) or the backward (lk_backward returns it). */
typedef enum {
    LK_LAYER_BEFORE_FORWARD,
    LK_LAYER_BEFORE_BACKWARD,
    LK_LAYER_AFTER_BACKWARD,
    LK_LAYER_AFTER_FORWARD,
} lk_layer_hook_when;
typedef lk_status (*lk_layer_hook_fn)(lk_layer *l, lk_layer_hook_when when, void *ctx);
/* Adds a hook (ctx borrowed while it is set). */
lk_status lk_layer_add_hook(lk_layer *l, lk_layer_hook_when when, lk_layer_hook_fn fn, void *ctx);
/* Removes every hook of l (not its children's). */
void lk_layer_clear_hooks(lk_layer *l);
/* AFTER_BACKWARD needs the layer's input to carry a gradient (it is the
 * signal that every node of the layer was differentiated), so when the
 * input needs none (the data into a model's first layer) one is computed
 * and discarded: for a Linear, a GEMM as large as its weight gradient's.
 * A user that can do without the hook in that case (fsdp reduces such a
 * unit after the whole backward) makes it optional: it is then skipped,
 * with the discarded gradient, whenever the input needs no gradient. */
lk_status lk_layer_set_after_backward_optional(lk_layer *l, bool optional);

/* ---- activation checkpointing ---------------------------------------------------
 * A checkpointed layer keeps only its input from the forward (its forward
 * runs with grad mode off: no intermediate activation is saved) and runs
 * its forward again in the backward, with grad mode on, in the autocast
 * dtype of the first run and with the random streams of the layers under
 * it (lk_layer.rng: Dropout's masks) rewound to where they were, so the
 * recompute is bitwise the first run; its gradients are those of the
 * plain layer. Layers with state a forward updates skip the update when
 * recomputing (BatchNorm's running statistics and batch count). */
lk_status lk_layer_set_checkpoint(lk_layer *l, bool on);
/* True while this thread recomputes a checkpointed layer's forward. */
bool lk_layer_recomputing(void);
/* Checkpoints the layers of l's tree whose type is one of types[0..n)
 * (FSDP's activation_checkpointing_policy: "Linear", "Sequential", ...; a
 * layer under one already checkpointed is left alone), or with n == 0 the
 * top-level blocks: the layers of the tree marked checkpoint_unit when there
 * are any (gpt: its transformer blocks transformer.h.N; the embeddings and
 * the head are not recomputed), else the children of the first layer from
 * l down that has more than one child (mlp: its Sequential's layers; cnn:
 * conv1 .. fc2; autoencoder: encoder and decoder). Returns how many it set
 * (0 with the error set on NULL arguments). */
int lk_layer_checkpoint_policy(lk_layer *l, const char *const *types, int n);
/* Turns checkpointing off in every layer of l's tree. */
void lk_layer_checkpoint_clear(lk_layer *l);
/* Sets the training flag on l and every descendant (dropout, batch norm). */
void lk_layer_train(lk_layer *l, bool training);

/* Every parameter (deduplicated by tensor, as PyTorch does) with its dotted
 * name, in PyTorch's order: own parameters, then children depth-first.
 * `out` is appended to; the list holds references to the live tensors. */
lk_status lk_layer_named_parameters(const lk_layer *l, lk_named_tensors *out);
lk_status lk_layer_named_buffers(const lk_layer *l, lk_named_tensors *out);
int64_t lk_layer_num_parameters(const lk_layer *l); /* total elements */

/* Re-initialises every parameter of the tree with the layer types' default
 * initialisers: the parameters of a layer whose first parameter has global
 * index k (named_parameters order) are drawn from the Philox stream keyed by
 * (seed, LK_RNG_INIT, k), so the result does not depend on anything but the
 * seed and the architecture. Buffers are reset too (running stats). A
 * layer holding no data for any of its own tensors (another pipeline
 * stage's) is skipped. */
lk_status lk_layer_reset_parameters(lk_layer *l, uint64_t seed);
/* A deferred model (l->deferred: lk_model_create_deferred; PyTorch's meta
 * device and reset_parameters) made real: every tensor of the tree still
 * deferred gets storage (its constructor's fill value: a BatchNorm's
 * running_var 1), then lk_layer_reset_parameters(l, l->deferred_seed)
 * draws the parameters — the bits lk_model_create gives, in the dtype and
 * on the device the tensors have now. A tensor given to another pipeline
 * stage before the call stays without storage (a stage materialises only
 * its own blocks: its peak never holds the whole model), and the streams
 * move past it. A layer that is not deferred is left alone (OK). */
lk_status lk_layer_materialize(lk_layer *l);
/* The same for the deferred tensors `keep` says yes to (a sharded
 * strategy materialises one unit at a time, so its peak holds one unit,
 * not the model): they get storage and their values (what
 * lk_layer_materialize gives them); tensors materialised before are left
 * as they are. l stays deferred until no deferred tensor is left. */
lk_status lk_layer_materialize_some(lk_layer *l, bool (*keep)(const lk_tensor *t, void *ctx), void *ctx);
/* Deferred construction of a layer tree of one's own (what
 * lk_model_create_deferred does for the registered models): between
 * lk_layer_defer_begin() and lk_layer_defer_end(root, seed) this thread's
 * tensor constructors (lk_tensor_empty, _zeros, _full) make tensors
 * without storage, and the initialisers only move their streams;
 * lk_layer_defer_end marks root deferred, with the seed
 * lk_layer_materialize gives lk_layer_reset_parameters. So the tree's
 * values must come from its layers' reset functions (the built-in layers'
 * do), drawing through the lk_init_* initialisers; values written by hand
 * at construction are not kept. root NULL only ends the deferral. */
void lk_layer_defer_begin(void);
lk_status lk_layer_defer_end(lk_layer *root, uint64_t seed);

/* Dropout masks: every Dropout layer in the tree (pre-order index d) draws
 * from the stream keyed by (seed, LK_RNG_DROPOUT, (rank << 16) | d, step).
 * Call once per optimizer step (the trainer does), so a run is reproducible
 * for a given seed, rank and step whatever happened before. Before the first
 * call a Dropout layer uses (0, rank 0, step 0). */
void lk_layer_set_rng_step(lk_layer *l, uint64_t seed, uint32_t rank, uint64_t step);

/* Zeroes (or drops, set_to_none) the gradient of every parameter. Gradients
 * in a flat buffer (lk_params_flatten) are always zeroed: the views stay. */
void lk_layer_zero_grad(lk_layer *l, bool set_to_none);

/* Casts every floating parameter of the tree to dt (f32, bf16 or f16) in
 * place, as torch's module.to(dtype) does for parameters: each slot gets a
 * new tensor of dt (values rounded to nearest even; requires_grad, name and
 * grad hook kept; a gradient is dropped). Buffers (running statistics) keep
 * their dtype. Parameters shared by several layers stay shared. Call before
 * lk_params_flatten (INVALID_USAGE after) and before creating an
 * optimizer. On failure nothing has changed. The *-true precisions. */
lk_status lk_layer_cast_parameters(lk_layer *l, lk_dtype dt);
/* Moves every parameter, gradient and buffer of l (and its children) to
 * `dev`, as torch's module.to(device): each tensor keeps its identity, its
 * values move (a parameter in a flat buffer leaves it for storage of its
 * own). The trainer moves the module to its device before flattening; the
 * module stays there after the run (move it back with LK_DEVICE_CPU). On
 * failure the tensors moved so far stay moved: move the layer back or free it. */
lk_status lk_layer_to(lk_layer *l, lk_device dev);

/* ========================================================================
 * Flat parameters and gradients
 * ====================================================================== */

/* Moves every parameter of the parameters' dtype (that of the first
 * floating parameter: f32, or bf16/f16 after lk_layer_cast_parameters) into
 * one contiguous, LK_ALIGN-aligned storage
 * (each parameter becomes a view into it, packed without gaps in
 * named_parameters order; values are kept) and sets every parameter's .grad
 * to a view into one contiguous gradient buffer (zeroed; an existing
 * gradient is copied in). `grad_buffer` may be a caller's contiguous tensor
 * of that dtype and at least lk_layer_num_parameters(l) elements (LK_ALIGN-aligned;
 * its memory must outlive the layer; the gradients become views of that
 * memory, the tensor itself is not kept) or NULL to allocate. On success *flat_params and *flat_grads (may be
 * NULL if not wanted) are new references the caller releases; flat_params->grad
 * is flat_grads, so clipping and the optimizers can treat the flat tensor as
 * one parameter. Call before creating the optimizer: parameter tensors held
 * elsewhere become stale. Parameters of another dtype are left alone. On failure
 * nothing has changed. */
lk_status lk_params_flatten(lk_layer *l, lk_tensor *grad_buffer, lk_tensor **flat_params, lk_tensor **flat_grads);
/* As lk_params_flatten, with the parameters placed in the memory of the
 * caller's tensor `param_buffer` (contiguous, of the parameters' dtype, at least
 * lk_layer_num_parameters elements, LK_ALIGN-aligned; NULL: allocated).
 * copy_values false leaves the buffer's contents as the parameters' values:
 * for memory several processes share, which one of them fills (DDP's shared parameters, lk_strategy_param_buffer). */
lk_status lk_params_flatten_into(lk_layer *l, lk_tensor *param_buffer, bool copy_values, lk_tensor *grad_buffer,
                                 lk_tensor **flat_params, lk_tensor **flat_grads);
/* True when t (typically a .grad) lives in a flat buffer made by
 * lk_params_flatten; the optimizers' zero_grad(set_to_none) zeroes such
 * gradients instead of dropping them, so the views stay. (May err on the
 * side of true for a buffer that has since been freed: zeroing is harmless.) */

/* ========================================================================
 * State dicts
 * ====================================================================== */

/* Parameters and buffers by dotted name in PyTorch's state_dict order (for
 * each layer: its parameters, then its buffers, then its children). The
 * tensors are the live ones (not copies). Appends to `out`. */
lk_status lk_state_dict_get(const lk_layer *l, lk_named_tensors *out);
/* Copies sd's tensors into the layer by name (casting dtypes as needed).
 * Every wrongly shaped tensor, and with `strict` every missing or unexpected
 * name, is listed in ONE INVALID_ARGUMENT error ("missing: bn1.running_mean
 * [32]; unexpected: fc3.weight [10, 5]; shape mismatch: fc1.weight: model
 * [128, 3136], given [128, 3000]"). On error nothing has been copied. */
lk_status lk_state_dict_load(lk_layer *l, const lk_named_tensors *sd, bool strict);

/* ========================================================================
 * Initialisers (in place, from the given Philox stream; PyTorch's nn.init
 * semantics). Values are drawn in f32 and rounded to the tensor's dtype
 * (f32, bf16, f16) and put on its device, so initialising before or after
 * lk_layer_cast_parameters / lk_layer_to gives the same bits. A tensor
 * without data (a model built deferred; another pipeline stage's) is not
 * written, and the stream moves past the values it would have taken; a
 * constant is kept for a deferred tensor's storage to come.
 * ====================================================================== */

typedef enum { LK_FAN_IN, LK_FAN_OUT } lk_fan_mode;

/* fan_in / fan_out as torch.nn.init._calculate_fan_in_and_fan_out (≥ 2 dims). */
lk_status lk_init_fans(const lk_tensor *t, int64_t *fan_in, int64_t *fan_out);
/* torch.nn.init.calculate_gain: "linear", "conv2d", "sigmoid", "tanh", "relu",
 * "leaky_relu" (param = negative slope), "selu". Unknown names: NAN. */
double lk_init_gain(const char *nonlinearity, double param);

lk_status lk_init_uniform(lk_tensor *t, lk_rng *rng, double lo, double hi);
lk_status lk_init_normal(lk_tensor *t, lk_rng *rng, double mean, double std);
/* N(mean, std) from the bulk sequence (lk_rng_fill_normal): many times
 * faster than lk_init_normal for large tensors, and a different sequence
 * (GPT-2's and ResNet's weights use it). */
lk_status lk_init_normal_bulk(lk_tensor *t, lk_rng *rng, double mean, double std);
lk_status lk_init_constant(lk_tensor *t, double value);
lk_status lk_init_zeros(lk_tensor *t);
lk_status lk_init_ones(lk_tensor *t);
lk_status lk_init_xavier_uniform(lk_tensor *t, lk_rng *rng, double gain);
lk_status lk_init_xavier_normal(lk_tensor *t, lk_rng *rng, double gain);
/* a: negative slope for leaky_relu; nonlinearity "relu" or "leaky_relu". */
lk_status lk_init_kaiming_uniform(lk_tensor *t, lk_rng *rng, double a, lk_fan_mode mode, const char *nonlinearity);
lk_status lk_init_kaiming_normal(lk_tensor *t, lk_rng *rng, double a, lk_fan_mode mode, const char *nonlinearity);

/* ========================================================================
 * Built-in layers. `init_rng` may be NULL: the parameters are then drawn
 * from the stream (0, LK_RNG_INIT, 0) — use lk_layer_reset_parameters or pass
 * a stream to get anything else. Defaults are PyTorch's.
 * ====================================================================== */

/* Linear: weight [out, in], bias [out]; U(-1/sqrt(in), 1/sqrt(in)) for both. */
lk_layer *lk_linear_create(int64_t in_features, int64_t out_features, bool bias, lk_rng *init_rng);
/* Conv2d: weight [out, in/groups, kh, kw], bias [out]; PyTorch's default init. */
lk_layer *lk_conv2d_create(int64_t in_channels, int64_t out_channels, int kh, int kw, lk_conv2d_params p, bool bias,
                           lk_rng *init_rng);
lk_layer *lk_max_pool2d_create(lk_pool2d_params p);
lk_layer *lk_avg_pool2d_create(lk_pool2d_params p);
lk_layer *lk_adaptive_avg_pool2d_create(int out_h, int out_w);

/* BatchNorm: momentum 0.1 and eps 1e-5 in PyTorch; momentum < 0 means
 * PyTorch's momentum=None (cumulative average over num_batches_tracked).
 * Parameters "weight", "bias" (affine); buffers "running_mean",
 * "running_var", "num_batches_tracked" (i64 scalar) when track_running_stats.
 * lk_batch_norm1d expects [N, C] (or [N, C, L] when the op supports it),
 * lk_batch_norm2d [N, C, H, W]. */
lk_layer *lk_batch_norm1d_create(int64_t num_features, float eps, float momentum, bool affine, bool track_running_stats);
lk_layer *lk_batch_norm2d_create(int64_t num_features, float eps, float momentum, bool affine, bool track_running_stats);
/* A BatchNorm layer followed by a ReLU as one op (lk_batch_norm_relu, the
 * same bits): bn (made by lk_batch_norm1d/2d_create) applies the ReLU to
 * its output from now on, and relu, the ReLU layer (lk_relu_create) that
 * follows it in a Sequential, when not NULL, becomes the identity (a
 * block whose forward calls the two itself passes NULL and skips the
 * ReLU). Names, parameters and buffers do not change: state dicts and
 * checkpoints are those of the unfused pair. Under SyncBatchNorm the layer
 * runs the two ops. INVALID_ARGUMENT when bn or relu is not of its type. */
lk_status lk_layer_batch_norm_fuse_relu(lk_layer *bn, lk_layer *relu);
/* SyncBatchNorm (PyTorch's convert_sync_batchnorm, in place): every
 * BatchNorm layer of the tree computes its training statistics with
 * lk_batch_norm_sync over `sum` (an all-reduce the caller provides, e.g. the
 * trainer's communicator; ctx borrowed while set). fn NULL turns it back
 * off. Returns how many layers it set. */
int lk_layer_sync_batchnorm(lk_layer *l, lk_sum_fn sum, void *ctx);
/* SyncBatchNorm over a reducer (what trainer.sync_batchnorm sets, with
 * lk_comm_bn_reducer over the strategy's data-parallel group): in training
 * every BatchNorm layer of the tree sums its statistics (sum, sum of
 * squares, count) over the ranks in one all-reduce per layer in the
 * forward and one (sum of dY, of dY * xhat) in the backward, on the
 * device's buffer when r->device_memory. Uneven batches weigh what they
 * hold. r is copied, its ctx borrowed while set; NULL turns it off (as does
 * lk_layer_sync_batchnorm, which replaces it). Returns how many layers it set. */
int lk_layer_sync_batchnorm_reducer(lk_layer *l, const lk_bn_reducer *r);
/* LayerNorm over the last `ndim` dims of the given shape; eps 1e-5 in PyTorch. */
lk_layer *lk_layer_norm_create(int ndim, const int64_t *normalized_shape, float eps, bool elementwise_affine);
/* The same with bias chosen apart (PyTorch 2.1's LayerNorm(bias=False),
 * nanoGPT's bias=False): elementwise_affine with bias false has a weight
 * and no bias. */
lk_layer *lk_layer_norm_create_ex(int ndim, const int64_t *normalized_shape, float eps, bool elementwise_affine, bool bias);
/* Dropout(p): masks from the layer's own stream, see lk_layer_set_rng_step. */
lk_layer *lk_dropout_create(float p);
/* Embedding: weight [num, dim] ~ N(0, 1). */
lk_layer *lk_embedding_create(int64_t num_embeddings, int64_t embedding_dim, lk_rng *init_rng);
/* Flatten(start_dim = 1, end_dim = -1) in PyTorch. */
lk_layer *lk_flatten_create(int start_dim, int end_dim);
lk_layer *lk_relu_create(void);
lk_layer *lk_gelu_create(lk_gelu_approx approx);
lk_layer *lk_tanh_create(void);
lk_layer *lk_sigmoid_create(void);
lk_layer *lk_leaky_relu_create(float negative_slope); /* PyTorch: 0.01 */
lk_layer *lk_elu_create(float alpha);                 /* PyTorch: 1.0 */
lk_layer *lk_silu_create(void);
lk_layer *lk_identity_create(void);

/* Sequential: children named "0", "1", ... in order. Takes ownership of the
 * given layers (all of them, even on failure; NULL entries make it fail with
 * the first constructor's error). */
lk_layer *lk_sequential_create(int n, lk_layer *const *layers);
/* Appends one layer as child "<n>" (takes ownership, even on failure). */
lk_status lk_sequential_append(lk_layer *seq, lk_layer *layer);
/* True when l is a Sequential: its forward runs its children in order and
 * nothing else, so it can be cut between any two of them. */
bool lk_layer_is_sequential(const lk_layer *l);

#ifdef __cplusplus
}
#endif
#endif

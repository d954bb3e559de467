/* The built-in layer types (Linear, Conv2d, pooling, BatchNorm, LayerNorm,
 * Dropout, Embedding, Flatten, activations, Sequential): their parameters
 * and buffers under PyTorch's names, PyTorch's default initialisation in a
 * reset function, and forward functions that call the autograd ops. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd/autograd_impl.h" /* SyncBatchNorm over a reducer */
#include "backend/backend_impl.h" /* batch norm's counter: LK_OP_INCREMENT */
#include "lockstep/nn.h"

/* A layer under construction that failed: frees it, keeps the error. */
static lk_layer *abandon(lk_layer *l) {
    lk_layer_free(l);
    return NULL;
}

/* Runs the layer's reset with the caller's stream, or the documented default. */
static lk_layer *init_with(lk_layer *l, lk_rng *init_rng) {
    if (!l) return NULL;
    lk_rng def;
    if (!init_rng) {
        lk_rng_init(&def, 0, LK_RNG_INIT, 0, 0);
        init_rng = &def;
    }
    if (l->reset && l->reset(l, init_rng)) return abandon(l);
    return l;
}

static lk_tensor *new_param(int ndim, const int64_t *shape) { return lk_tensor_zeros(LK_F32, ndim, shape); }

/* ---- Linear and Conv2d ---------------------------------------------------------------- */

/* PyTorch's reset_parameters for Linear and Conv2d: kaiming_uniform(a=sqrt(5))
 * gives U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias uses the same bound. */
static lk_status reset_fan_in(lk_layer *self, lk_rng *rng) {
    lk_tensor *w = lk_layer_param(self, 0), *b = lk_layer_param(self, 1);
    LK_TRY(lk_init_kaiming_uniform(w, rng, sqrt(5.0), LK_FAN_IN, "leaky_relu"));
    if (b) {
        int64_t fan_in;
        LK_TRY(lk_init_fans(w, &fan_in, NULL));
        double bound = fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0;
        LK_TRY(lk_init_uniform(b, rng, -bound, bound));
    }
    return LK_STATUS_OK;
}

static lk_tensor *linear_forward(lk_layer *self, lk_tensor *x) {
    return lk_linear(x, lk_layer_param(self, 0), lk_layer_param(self, 1));
}

lk_layer *lk_linear_create(int64_t in_features, int64_t out_features, bool bias, lk_rng *init_rng) {
    if (in_features <= 0 || out_features <= 0) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "Linear: in_features and out_features must be positive, got %lld and %lld",
                 (long long)in_features, (long long)out_features);
        return NULL;
    }
    lk_layer *l = lk_layer_create("Linear", linear_forward, NULL, NULL);
    if (!l) return NULL;
    l->reset = reset_fan_in;
    if (lk_layer_add_parameter(l, "weight", new_param(LK_SHAPE(out_features, in_features)))) return abandon(l);
    if (bias && lk_layer_add_parameter(l, "bias", new_param(LK_SHAPE(out_features)))) return abandon(l);
    return init_with(l, init_rng);
}

static lk_tensor *conv2d_forward(lk_layer *self, lk_tensor *x) {
    lk_conv2d_params *p = self->impl;
    return lk_conv2d(x, lk_layer_param(self, 0), lk_layer_param(self, 1), *p);
}

lk_layer *lk_conv2d_create(int64_t in_channels, int64_t out_channels, int kh, int kw, lk_conv2d_params p, bool bias,
                           lk_rng *init_rng) {
    if (p.groups <= 0) p.groups = 1;
    if (in_channels <= 0 || out_channels <= 0 || kh <= 0 || kw <= 0 || in_channels % p.groups ||
        out_channels % p.groups) {
        lk_error(LK_STATUS_INVALID_ARGUMENT,
                 "Conv2d: in_channels %lld and out_channels %lld must be positive multiples of groups %d, kernel %dx%d "
                 "positive",
                 (long long)in_channels, (long long)out_channels, p.groups, kh, kw);
        return NULL;
    }
    for (int i = 0; i < 2; i++)
        if (p.stride[i] <= 0 || p.dilation[i] <= 0 || p.padding[i] < 0) {
            lk_error(LK_STATUS_INVALID_ARGUMENT, "Conv2d: stride %dx%d and dilation %dx%d must be positive, padding %dx%d >= 0",
                     p.stride[0], p.stride[1], p.dilation[0], p.dilation[1], p.padding[0], p.padding[1]);
            return NULL;
        }
    lk_conv2d_params *pp = lk_malloc(sizeof *pp);
    if (!pp) return NULL;
    *pp = p;
    lk_layer *l = lk_layer_create("Conv2d", conv2d_forward, pp, NULL);
    if (!l) return NULL;
    l->reset = reset_fan_in;
    if (lk_layer_add_parameter(l, "weight", new_param(LK_SHAPE(out_channels, in_channels / p.groups, kh, kw))))
        return abandon(l);
    if (bias && lk_layer_add_parameter(l, "bias", new_param(LK_SHAPE(out_channels)))) return abandon(l);
    return init_with(l, init_rng);
}

/* ---- pooling ------------------------------------------------------------------------- */

static lk_tensor *max_pool_forward(lk_layer *self, lk_tensor *x) { return lk_max_pool2d(x, *(lk_pool2d_params *)self->impl); }
static lk_tensor *avg_pool_forward(lk_layer *self, lk_tensor *x) { return lk_avg_pool2d(x, *(lk_pool2d_params *)self->impl); }

static lk_layer *pool_create(const char *type, lk_layer_forward_fn fwd, lk_pool2d_params p) {
    if (p.kernel[0] <= 0 || p.kernel[1] <= 0 || p.stride[0] < 0 || p.stride[1] < 0 || p.padding[0] < 0 ||
        p.padding[1] < 0 || 2 * p.padding[0] > p.kernel[0] || 2 * p.padding[1] > p.kernel[1]) {
        lk_error(LK_STATUS_INVALID_ARGUMENT,
                 "%s: kernel %dx%d must be positive, stride %dx%d >= 0 (0: = kernel), padding %dx%d at most half "
                 "the kernel",
                 type, p.kernel[0], p.kernel[1], p.stride[0], p.stride[1], p.padding[0], p.padding[1]);
        return NULL;
    }
    lk_pool2d_params *pp = lk_malloc(sizeof *pp);
    if (!pp) return NULL;
    *pp = p;
    return lk_layer_create(type, fwd, pp, NULL);
}

lk_layer *lk_max_pool2d_create(lk_pool2d_params p) { return pool_create("MaxPool2d", max_pool_forward, p); }
lk_layer *lk_avg_pool2d_create(lk_pool2d_params p) { return pool_create("AvgPool2d", avg_pool_forward, p); }

static lk_tensor *adaptive_forward(lk_layer *self, lk_tensor *x) {
    int *o = self->impl;
    return lk_adaptive_avg_pool2d(x, o[0], o[1]);
}

lk_layer *lk_adaptive_avg_pool2d_create(int out_h, int out_w) {
    if (out_h <= 0 || out_w <= 0) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "AdaptiveAvgPool2d: output size %dx%d must be positive", out_h, out_w);
        return NULL;
    }
    int *o = lk_malloc(2 * sizeof *o);
    if (!o) return NULL;
    o[0] = out_h;
    o[1] = out_w;
    return lk_layer_create("AdaptiveAvgPool2d", adaptive_forward, o, NULL);
}

/* ---- BatchNorm ------------------------------------------------------------------------------ */

typedef struct {
    int64_t num_features;
    float eps, momentum;
    bool affine, track;
    int spatial; /* 1: BatchNorm1d, 2: BatchNorm2d */
    lk_sum_fn sync; /* SyncBatchNorm: sums over ranks (lk_layer_sync_batchnorm); NULL: this rank's batch */
    void *sync_ctx;
    lk_bn_reducer red; /* SyncBatchNorm over a reducer (lk_layer_sync_batchnorm_reducer); red.sum NULL: none */
    bool relu;         /* a ReLU after (lk_layer_batch_norm_fuse_relu) */
} bn_impl;

static lk_status bn_reset(lk_layer *self, lk_rng *rng) {
    bn_impl *b = self->impl;
    if (b->affine) {
        LK_TRY(lk_init_ones(lk_layer_param(self, 0)));
        LK_TRY(lk_init_zeros(lk_layer_param(self, 1)));
    }
    if (b->track) {
        LK_TRY(lk_tensor_fill(lk_layer_buffer(self, 0), 0.0));
        LK_TRY(lk_tensor_fill(lk_layer_buffer(self, 1), 1.0));
        LK_TRY(lk_tensor_fill(lk_layer_buffer(self, 2), 0.0));
    }
    return LK_STATUS_OK;
}

/* num_batches_tracked += by, on the counter's own device (LK_OP_INCREMENT). */
static lk_status bn_count(lk_tensor *nbt, int64_t by) {
    lk_op_desc d = {.op = LK_OP_INCREMENT, .dtype = {LK_I64}};
    d.increment = (lk_increment_params){1, by};
    return lk__backend_run(nbt->device, &d, (void *[]){nbt->data});
}

static lk_tensor *bn_forward(lk_layer *self, lk_tensor *x) {
    bn_impl *b = self->impl;
    bool ok_dims = b->spatial == 2 ? x->ndim == 4 : (x->ndim == 2 || x->ndim == 3);
    if (!ok_dims || x->shape[1] != b->num_features) {
        char s[128];
        lk_error(LK_STATUS_INVALID_ARGUMENT, "%s(%lld): expected input [N, %lld%s], got %s", self->type,
                 (long long)b->num_features, (long long)b->num_features,
                 b->spatial == 2 ? ", H, W" : "] or [N, C, L", lk_shape_str(x, s, sizeof s));
        return NULL;
    }
    lk_tensor *w = b->affine ? lk_layer_param(self, 0) : NULL, *bias = b->affine ? lk_layer_param(self, 1) : NULL;
    lk_tensor *rm = b->track ? lk_layer_buffer(self, 0) : NULL, *rv = b->track ? lk_layer_buffer(self, 1) : NULL;
    lk_tensor *nbt = b->track ? lk_layer_buffer(self, 2) : NULL;
    float factor = b->momentum < 0 ? 0.0f : b->momentum;
    bool counted = false;
    if (self->training && lk_layer_recomputing()) /* a checkpoint's recompute: the first run updated them */
        rm = rv = nbt = NULL;
    if (self->training && nbt && nbt->dtype == LK_I64) {
        /* Counted by an op on the counter's device: no read back per step.
         * momentum=None (cumulative average) needs the count as the factor
         * 1/count, so only that form reads it (on a device, one copy out). */
        if (bn_count(nbt, 1)) return NULL;
        counted = true;
        if (b->momentum < 0) {
            factor = 1.0f / (float)(int64_t)lk_tensor_get(nbt, 0); /* momentum=None: cumulative moving average */
        }
    }
    bool use_batch_stats = self->training || !b->track;
    /* PyTorch syncs in training only */
    bool synced = self->training && (b->red.sum || b->sync);
    lk_tensor *y;
    if (b->relu && !synced) y = lk_batch_norm_relu(x, rm, rv, w, bias, use_batch_stats, factor, b->eps);
    else {
        y = b->red.sum ? lk__batch_norm_sync_reducer(x, rm, rv, w, bias, use_batch_stats, factor, b->eps,
                                                     self->training ? &b->red : NULL)
                       : lk_batch_norm_sync(x, rm, rv, w, bias, use_batch_stats, factor, b->eps,
                                            self->training ? b->sync : NULL, b->sync_ctx);
        if (y && b->relu) y = lk_relu(y);
    }
    if (!y && counted) (void)bn_count(nbt, -1); /* undone; the op's error is the one reported */
    return y;
}

static lk_layer *bn_create(const char *type, int spatial, int64_t num_features, float eps, float momentum, bool affine,
                           bool track) {
    if (num_features <= 0 || !(eps > 0) || momentum > 1) {
        lk_error(LK_STATUS_INVALID_ARGUMENT,
                 "%s: num_features %lld must be positive, eps %g > 0, momentum %g <= 1 (< 0: cumulative average)", type,
                 (long long)num_features, eps, momentum);
        return NULL;
    }
    bn_impl *b = lk_malloc(sizeof *b);
    if (!b) return NULL;
    *b = (bn_impl){num_features, eps, momentum, affine, track, spatial, NULL, NULL, {0}, false};
    lk_layer *l = lk_layer_create(type, bn_forward, b, NULL);
    if (!l) return NULL;
    l->reset = bn_reset;
    if (affine && (lk_layer_add_parameter(l, "weight", new_param(LK_SHAPE(num_features))) ||
                   lk_layer_add_parameter(l, "bias", new_param(LK_SHAPE(num_features)))))
        return abandon(l);
    if (track && (lk_layer_add_buffer(l, "running_mean", lk_tensor_zeros(LK_F32, LK_SHAPE(num_features))) ||
                  lk_layer_add_buffer(l, "running_var", lk_tensor_zeros(LK_F32, LK_SHAPE(num_features))) ||
                  lk_layer_add_buffer(l, "num_batches_tracked", lk_tensor_zeros(LK_I64, 0, NULL))))
        return abandon(l);
    return init_with(l, NULL);
}

int lk_layer_sync_batchnorm(lk_layer *l, lk_sum_fn sum, void *ctx) {
    if (!l) return 0;
    int n = 0;
    if (l->forward == bn_forward) { /* the layer type is known by its forward function */
        bn_impl *b = l->impl;
        b->sync = sum;
        b->sync_ctx = sum ? ctx : NULL;
        b->red = (lk_bn_reducer){0};
        n++;
    }
    for (int i = 0; i < l->n_children; i++) n += lk_layer_sync_batchnorm(l->children[i].layer, sum, ctx);
    return n;
}

int lk_layer_sync_batchnorm_reducer(lk_layer *l, const lk_bn_reducer *r) {
    if (!l) return 0;
    int n = 0;
    if (l->forward == bn_forward) {
        bn_impl *b = l->impl;
        b->red = r && r->sum ? *r : (lk_bn_reducer){0};
        b->sync = NULL;
        b->sync_ctx = NULL;
        n++;
    }
    for (int i = 0; i < l->n_children; i++) n += lk_layer_sync_batchnorm_reducer(l->children[i].layer, r);
    return n;
}

lk_layer *lk_batch_norm1d_create(int64_t num_features, float eps, float momentum, bool affine, bool track_running_stats) {
    return bn_create("BatchNorm1d", 1, num_features, eps, momentum, affine, track_running_stats);
}
lk_layer *lk_batch_norm2d_create(int64_t num_features, float eps, float momentum, bool affine, bool track_running_stats) {
    return bn_create("BatchNorm2d", 2, num_features, eps, momentum, affine, track_running_stats);
}

/* ---- LayerNorm ---------------------------------------------------------------------------- */

typedef struct {
    int ndim;
    int64_t shape[LK_MAX_DIMS];
    float eps;
    bool affine;
} ln_impl;

static lk_status ln_reset(lk_layer *self, lk_rng *rng) {
    if (self->params.n >= 1) LK_TRY(lk_init_ones(lk_layer_param(self, 0)));
    if (self->params.n == 2) LK_TRY(lk_init_zeros(lk_layer_param(self, 1)));
    return LK_STATUS_OK;
}

static lk_tensor *ln_forward(lk_layer *self, lk_tensor *x) {
    ln_impl *n = self->impl;
    bool ok = x->ndim >= n->ndim;
    for (int i = 0; ok && i < n->ndim; i++) ok = x->shape[x->ndim - n->ndim + i] == n->shape[i];
    if (!ok) {
        char s[128], e[128];
        lk_tensor hdr = {.ndim = n->ndim};
        memcpy(hdr.shape, n->shape, sizeof n->shape);
        lk_error(LK_STATUS_INVALID_ARGUMENT, "LayerNorm: input %s does not end with the normalized shape %s",
                 lk_shape_str(x, s, sizeof s), lk_shape_str(&hdr, e, sizeof e));
        return NULL;
    }
    return lk_layer_norm(x, n->ndim, lk_layer_param(self, 0), lk_layer_param(self, 1), n->eps);
}

lk_layer *lk_layer_norm_create(int ndim, const int64_t *normalized_shape, float eps, bool elementwise_affine) {
    return lk_layer_norm_create_ex(ndim, normalized_shape, eps, elementwise_affine, true);
}

lk_layer *lk_layer_norm_create_ex(int ndim, const int64_t *normalized_shape, float eps, bool elementwise_affine, bool bias) {
    if (ndim <= 0 || ndim > LK_MAX_DIMS || !normalized_shape || !(eps > 0)) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "LayerNorm: normalized shape needs 1..%d dims (got %d) and eps > 0 (got %g)",
                 LK_MAX_DIMS, ndim, eps);
        return NULL;
    }
    ln_impl *n = lk_calloc(1, sizeof *n);
    if (!n) return NULL;
    n->ndim = ndim;
    for (int i = 0; i < ndim; i++) n->shape[i] = normalized_shape[i];
    n->eps = eps;
    n->affine = elementwise_affine;
    lk_layer *l = lk_layer_create("LayerNorm", ln_forward, n, NULL);
    if (!l) return NULL;
    l->reset = ln_reset;
    if (elementwise_affine && (lk_layer_add_parameter(l, "weight", new_param(ndim, normalized_shape)) ||
                               (bias && lk_layer_add_parameter(l, "bias", new_param(ndim, normalized_shape)))))
        return abandon(l);
    return init_with(l, NULL);
}

/* ---- Dropout ------------------------------------------------------------------------------------ */

typedef struct {
    float p;
    lk_rng rng;
} dropout_impl;

static lk_tensor *dropout_forward(lk_layer *self, lk_tensor *x) {
    dropout_impl *d = self->impl;
    return lk_dropout(x, d->p, self->training, &d->rng);
}

static void dropout_reseed(lk_layer *l, uint64_t seed, uint32_t stream, uint64_t step) {
    dropout_impl *d = l->impl;
    /* The counter's two coordinates: the layer's stream, and the step
     * folded to 32 bits (2^32 steps before a mask could repeat). */
    lk_rng_init(&d->rng, seed ^ (step >> 32) * 0x9E3779B97F4A7C15ull, LK_RNG_DROPOUT, stream, (uint32_t)step);
}

lk_layer *lk_dropout_create(float p) {
    if (!(p >= 0.0f && p <= 1.0f)) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "Dropout: probability has to be between 0 and 1, but got %g", p);
        return NULL;
    }
    dropout_impl *d = lk_calloc(1, sizeof *d);
    if (!d) return NULL;
    d->p = p;
    lk_rng_init(&d->rng, 0, LK_RNG_DROPOUT, 0, 0);
    lk_layer *l = lk_layer_create("Dropout", dropout_forward, d, NULL);
    if (l) l->rng = &d->rng; /* checkpointing rewinds it for the recompute */
    if (l) l->reseed = dropout_reseed;
    return l;
}

/* ---- Embedding, Flatten ------------------------------------------------------------------------- */

static lk_status embedding_reset(lk_layer *self, lk_rng *rng) { return lk_init_normal(lk_layer_param(self, 0), rng, 0.0, 1.0); }
static lk_tensor *embedding_forward(lk_layer *self, lk_tensor *x) { return lk_embedding(lk_layer_param(self, 0), x); }

lk_layer *lk_embedding_create(int64_t num_embeddings, int64_t embedding_dim, lk_rng *init_rng) {
    if (num_embeddings <= 0 || embedding_dim <= 0) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "Embedding: num_embeddings %lld and embedding_dim %lld must be positive",
                 (long long)num_embeddings, (long long)embedding_dim);
        return NULL;
    }
    lk_layer *l = lk_layer_create("Embedding", embedding_forward, NULL, NULL);
    if (!l) return NULL;
    l->reset = embedding_reset;
    if (lk_layer_add_parameter(l, "weight", new_param(LK_SHAPE(num_embeddings, embedding_dim)))) return abandon(l);
    return init_with(l, init_rng);
}

static lk_tensor *flatten_forward(lk_layer *self, lk_tensor *x) {
    int *d = self->impl;
    return lk_flatten(x, d[0], d[1]);
}

lk_layer *lk_flatten_create(int start_dim, int end_dim) {
    int *d = lk_malloc(2 * sizeof *d);
    if (!d) return NULL;
    d[0] = start_dim;
    d[1] = end_dim;
    return lk_layer_create("Flatten", flatten_forward, d, NULL);
}

/* ---- activations ------------------------------------------------------------------------------------ */

typedef struct {
    float a;
    lk_gelu_approx approx;
} act_impl;

static lk_tensor *relu_fw(lk_layer *self, lk_tensor *x) { return lk_relu(x); }
static lk_tensor *tanh_fw(lk_layer *self, lk_tensor *x) { return lk_tanh(x); }
static lk_tensor *sigmoid_fw(lk_layer *self, lk_tensor *x) { return lk_sigmoid(x); }
static lk_tensor *silu_fw(lk_layer *self, lk_tensor *x) { return lk_silu(x); }
static lk_tensor *identity_fw(lk_layer *self, lk_tensor *x) { return x; }
static lk_tensor *gelu_fw(lk_layer *self, lk_tensor *x) { return lk_gelu(x, ((act_impl *)self->impl)->approx); }
static lk_tensor *leaky_fw(lk_layer *self, lk_tensor *x) { return lk_leaky_relu(x, ((act_impl *)self->impl)->a); }
static lk_tensor *elu_fw(lk_layer *self, lk_tensor *x) { return lk_elu(x, ((act_impl *)self->impl)->a); }

static lk_layer *act_create(const char *type, lk_layer_forward_fn fw, float a, lk_gelu_approx approx) {
    act_impl *m = lk_malloc(sizeof *m);
    if (!m) return NULL;
    m->a = a;
    m->approx = approx;
    return lk_layer_create(type, fw, m, NULL);
}

lk_layer *lk_relu_create(void) { return act_create("ReLU", relu_fw, 0, LK_GELU_EXACT); }
lk_layer *lk_gelu_create(lk_gelu_approx approx) { return act_create("GELU", gelu_fw, 0, approx); }
lk_layer *lk_tanh_create(void) { return act_create("Tanh", tanh_fw, 0, LK_GELU_EXACT); }
lk_layer *lk_sigmoid_create(void) { return act_create("Sigmoid", sigmoid_fw, 0, LK_GELU_EXACT); }
lk_layer *lk_leaky_relu_create(float negative_slope) { return act_create("LeakyReLU", leaky_fw, negative_slope, LK_GELU_EXACT); }
lk_layer *lk_elu_create(float alpha) { return act_create("ELU", elu_fw, alpha, LK_GELU_EXACT); }
lk_layer *lk_silu_create(void) { return act_create("SiLU", silu_fw, 0, LK_GELU_EXACT); }

lk_status lk_layer_batch_norm_fuse_relu(lk_layer *bn, lk_layer *relu) {
    if (!bn || bn->forward != bn_forward)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_layer_batch_norm_fuse_relu: bn is %s (expected a BatchNorm1d/2d)",
                        bn ? bn->type : "NULL");
    if (relu && (strcmp(relu->type, "ReLU") || (relu->forward != relu_fw && relu->forward != identity_fw)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_layer_batch_norm_fuse_relu: relu is %s (expected a ReLU)",
                        relu->type);
    ((bn_impl *)bn->impl)->relu = true;
    if (relu) relu->forward = identity_fw; /* still a "ReLU" by name and type: the cut points stay */
    return LK_STATUS_OK;
}
lk_layer *lk_identity_create(void) { return act_create("Identity", identity_fw, 0, LK_GELU_EXACT); }

/* ---- Sequential ----------------------------------------------------------------------------------------- */

static lk_tensor *sequential_forward(lk_layer *self, lk_tensor *x) {
    for (int i = 0; i < self->n_children && x; i++) x = lk_layer_forward(self->children[i].layer, x);
    return x;
}

lk_status lk_sequential_append(lk_layer *seq, lk_layer *layer) {
    if (!seq || seq->forward != sequential_forward) {
        lk_layer_free(layer);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "sequential_append: %s is not a Sequential",
                        seq ? seq->type : "NULL");
    }
    char name[24];
    snprintf(name, sizeof name, "%d", seq->n_children);
    return lk_layer_add_child(seq, name, layer);
}

bool lk_layer_is_sequential(const lk_layer *l) { return l && l->forward == sequential_forward; }

lk_layer *lk_sequential_create(int n, lk_layer *const *layers) {
    lk_layer *seq = lk_layer_create("Sequential", sequential_forward, NULL, NULL);
    lk_status st = seq ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        if (st) {
            lk_layer_free(layers[i]);
            continue;
        }
        if (!layers[i]) {
            st = lk_last_status() ? lk_last_status()
                                  : lk_error(LK_STATUS_INVALID_ARGUMENT, "Sequential: layer %d is NULL", i);
            continue;
        }
        st = lk_sequential_append(seq, layers[i]);
    }
    if (st) return abandon(seq);
    return seq;
}

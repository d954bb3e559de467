/* Pieces the built-in models share: their construction stream, the
 * Linear/ReLU stack (autoencoder halves, mlp), the top layer every built-in
 * model is (a sequence of blocks after bringing the input to its shape), and
 * the input shape of the models that flatten it, and their two losses. */
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

typedef struct {
    int ndim;         /* 1: flat rows; 3: images */
    int64_t shape[3]; /* per sample, for images */
} model_seq;

/* The input as the blocks take it, with the ops the hand-written forwards
 * used (a reshape only when the layout differs, so the graph is the same). */
static lk_tensor *model_input(const model_seq *m, lk_tensor *x) {
    if (m->ndim == 1) return x->ndim == 2 ? x : lk_reshape(x, LK_SHAPE(x->ndim ? x->shape[0] : 1, -1));
    if (x->ndim == 2) return lk_reshape(x, LK_SHAPE(x->shape[0], m->shape[0], m->shape[1], m->shape[2]));
    return x;
}

static lk_tensor *model_seq_forward(lk_layer *self, lk_tensor *x) {
    x = model_input(self->impl, x);
    for (int i = 0; i < self->n_children && x; i++) x = lk_layer_forward(self->children[i].layer, x);
    return x;
}

lk_layer *lk__model_seq_create(const char *type, int sample_ndim, const int64_t *sample_shape) {
    model_seq *m = lk_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->ndim = sample_ndim;
    for (int i = 0; i < sample_ndim && i < 3; i++) m->shape[i] = sample_shape[i];
    return lk_layer_create(type, model_seq_forward, m, NULL);
}

bool lk__is_model_seq(const lk_layer *l) { return l && l->forward == model_seq_forward; }

lk_tensor *lk__model_seq_input(const lk_layer *l, lk_tensor *x) { return x ? model_input(l->impl, x) : NULL; }

lk_tensor *lk__loss_reconstruction(lk_tensor *output, lk_tensor *x, lk_tensor *y) {
    (void)y;
    lk_tensor *t = x->numel == output->numel ? lk_reshape(x, output->ndim, output->shape) : x;
    return lk_mse_loss(output, t, LK_REDUCTION_MEAN);
}

lk_tensor *lk__loss_classification(lk_tensor *output, lk_tensor *x, lk_tensor *y) {
    (void)x;
    return lk_cross_entropy(output, y, NULL);
}

lk_status lk__flat_input_shape(const lk_model_args *a, int *ndim, int64_t shape[3], char *why, size_t why_size) {
    int64_t d = lk_model_args_int(a, "input_dim");
    *ndim = 1;
    shape[0] = d;
    snprintf(why, why_size, "input_dim %lld", (long long)d);
    return LK_STATUS_OK;
}

/* ---- models whose blocks are views (gpt) ---- */

typedef struct {
    int n, cap;
    lk_named_layer *blocks; /* names owned; layer owned when !borrowed */
    void *data;
} model_staged;

static void staged_destroy(lk_layer *self) {
    model_staged *m = self->impl;
    if (!m) return;
    for (int i = 0; i < m->n; i++) {
        if (!m->blocks[i].borrowed) lk_layer_free(m->blocks[i].layer);
        lk_free(m->blocks[i].name);
    }
    lk_free(m->blocks);
    lk_free(m->data);
    lk_free(m);
}

static lk_tensor *staged_forward(lk_layer *self, lk_tensor *x) {
    model_staged *m = self->impl;
    for (int i = 0; i < m->n && x; i++) x = lk_layer_forward(m->blocks[i].layer, x);
    return x;
}

lk_layer *lk__model_staged_create(const char *type, void *data) {
    model_staged *m = lk_calloc(1, sizeof *m);
    if (!m) {
        lk_free(data);
        return NULL;
    }
    m->data = data;
    return lk_layer_create(type, staged_forward, m, staged_destroy);
}

bool lk__is_model_staged(const lk_layer *l) { return l && l->forward == staged_forward; }

void *lk__model_staged_data(const lk_layer *l) { return lk__is_model_staged(l) ? ((model_staged *)l->impl)->data : NULL; }

lk_status lk__model_staged_add(lk_layer *l, const char *name, lk_layer *block, bool owned) {
    if (!block) return lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_ARGUMENT, "block '%s': NULL layer", name);
    model_staged *m = lk__is_model_staged(l) ? l->impl : NULL;
    lk_status st = m ? LK_STATUS_OK : lk_error(LK_STATUS_INTERNAL, "model_staged_add: not a staged model");
    if (!st && m->n == m->cap) st = lk_vec_reserve(m->blocks, m->cap, m->n + 1, 8);
    char *nm = st ? NULL : lk_strdup(name);
    if (!st && !nm) st = LK_STATUS_OUT_OF_MEMORY;
    if (st) {
        if (owned) lk_layer_free(block);
        return st;
    }
    m->blocks[m->n++] = (lk_named_layer){nm, block, !owned};
    return LK_STATUS_OK;
}

lk_status lk__model_staged_blocks(const lk_layer *l, int *count, const lk_named_layer **blocks) {
    model_staged *m = l->impl;
    *count = m->n;
    *blocks = m->blocks;
    return LK_STATUS_OK;
}

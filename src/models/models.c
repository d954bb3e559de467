/* The built-in models (autoencoder, mlp, cnn) and their registry: one
 * argument table per model drives parsing and validation of init args (with
 * a nearest-name hint for typos), construction with PyTorch-equivalent
 * parameter names, seeding through lk_layer_reset_parameters, and the loss
 * each model trains with. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/models.h"

#define MAX_WIDTHS 16

/* ---- argument tables ---------------------------------------------------------------- */

static const lk_model_arg autoencoder_args[] = {
    {"input_dim", LK_ARG_INT, "784", "features of a flattened input sample"},
    {"hidden", LK_ARG_INT_LIST, "512,256", "encoder hidden widths (the decoder mirrors them)"},
    {"latent_dim", LK_ARG_INT, "64", "width of the code"},
    {"final_activation", LK_ARG_STRING, "none", "decoder output activation: none or sigmoid"},
};
static const lk_model_arg mlp_args[] = {
    {"input_dim", LK_ARG_INT, "784", "features of a flattened input sample"},
    {"hidden", LK_ARG_INT_LIST, "256,128", "hidden widths"},
    {"num_classes", LK_ARG_INT, "10", "output classes"},
    {"dropout", LK_ARG_FLOAT, "0.0", "dropout probability after each hidden ReLU (0: none)"},
};
static const lk_model_arg cnn_args[] = {
    {"in_channels", LK_ARG_INT, "1", "input image channels"},
    {"image_size", LK_ARG_INT, "28", "input height = width (multiple of 4)"},
    {"channels", LK_ARG_INT_LIST, "32,64", "channels of the two conv blocks"},
    {"hidden", LK_ARG_INT, "128", "width of the first fully connected layer"},
    {"num_classes", LK_ARG_INT, "10", "output classes"},
};

#define N_OF(a) (int)(sizeof a / sizeof a[0])
static const lk_model_info registry[] = {
    {"autoencoder", "MLP autoencoder (Lightning's classic example, deeper): MSE reconstruction", LK_LOSS_MSE, true,
     autoencoder_args, N_OF(autoencoder_args)},
    {"mlp", "multi-layer perceptron classifier: cross-entropy", LK_LOSS_CROSS_ENTROPY, false, mlp_args, N_OF(mlp_args)},
    {"cnn", "two conv+BN+ReLU+max-pool blocks and two fully connected layers: cross-entropy", LK_LOSS_CROSS_ENTROPY,
     false, cnn_args, N_OF(cnn_args)},
};

const lk_model_info *lk_models(int *count) {
    if (count) *count = N_OF(registry);
    return registry;
}

const lk_model_info *lk_model_find(const char *name) {
    for (int i = 0; i < N_OF(registry); i++)
        if (name && !strcmp(registry[i].name, name)) return &registry[i];
    char list[256] = "";
    for (int i = 0; i < N_OF(registry); i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", registry[i].name);
    lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown model '%s' (registered models: %s)", name ? name : "(null)", list);
    return NULL;
}

/* Parsed values, indexed like the model's arg table. */
typedef struct {
    const char *text[8];
    int64_t i[8];
    double f[8];
    int64_t list[8][MAX_WIDTHS];
    int list_n[8];
} parsed_args;

static lk_status parse_one(const lk_model_info *m, int k, const char *v, parsed_args *p) {
    const lk_model_arg *a = &m->args[k];
    char *end;
    p->text[k] = v;
    errno = 0;
    switch (a->type) {
    case LK_ARG_INT:
        p->i[k] = strtoll(v, &end, 10);
        if (end == v || *end || errno || p->i[k] <= 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %s = '%s': expected a positive integer", m->name, a->name, v);
        break;
    case LK_ARG_FLOAT:
        p->f[k] = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(p->f[k]))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %s = '%s': expected a number", m->name, a->name, v);
        break;
    case LK_ARG_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "1")) p->i[k] = 1;
        else if (!strcmp(v, "false") || !strcmp(v, "0")) p->i[k] = 0;
        else return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %s = '%s': expected true or false", m->name, a->name, v);
        break;
    case LK_ARG_STRING: break;
    case LK_ARG_INT_LIST: {
        /* "512,256", "[512, 256]" (YAML flow list as text) or "" */
        int n = 0;
        const char *s = v;
        while (*s == ' ' || *s == '[') s++;
        while (*s && *s != ']') {
            if (n == MAX_WIDTHS)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %s = '%s': at most %d widths", m->name, a->name, v, MAX_WIDTHS);
            long long w = strtoll(s, &end, 10);
            if (end == s || w <= 0)
                return lk_error(LK_STATUS_INVALID_ARGUMENT,
                                "model %s: %s = '%s': expected a comma-separated list of positive integers", m->name, a->name, v);
            p->list[k][n++] = w;
            s = end;
            while (*s == ' ' || *s == ',') s++;
        }
        p->list_n[k] = n;
        break;
    }
    }
    return LK_STATUS_OK;
}

static lk_status parse_args(const lk_model_info *m, const lk_model_kv *args, int n_args, parsed_args *p) {
    memset(p, 0, sizeof *p);
    for (int k = 0; k < m->n_args; k++) LK_TRY(parse_one(m, k, m->args[k].default_value, p));
    for (int j = 0; j < n_args; j++) {
        int found = -1;
        const char *names[8];
        for (int k = 0; k < m->n_args; k++) {
            if (args[j].key && !strcmp(args[j].key, m->args[k].name)) found = k;
            names[k] = m->args[k].name;
        }
        if (found < 0) {
            char list[256] = "";
            for (int k = 0; k < m->n_args; k++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", m->args[k].name);
            const char *near = args[j].key ? lk_suggest(args[j].key, names, m->n_args) : NULL;
            if (near)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: unknown argument '%s'; did you mean '%s'? (valid: %s)",
                                m->name, args[j].key, near, list);
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: unknown argument '%s' (valid: %s)", m->name,
                            args[j].key ? args[j].key : "(null)", list);
        }
        if (!args[j].value)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: argument '%s' has no value", m->name, args[j].key);
        LK_TRY(parse_one(m, found, args[j].value, p));
    }
    return LK_STATUS_OK;
}

/* ---- models -------------------------------------------------------------------------------- */

typedef struct {
    int64_t c, h, w; /* image geometry for reshaping flat input (cnn) */
} model_impl;

/* [N, ...] -> [N, prod(...)]: the models accept images or flat rows. */
static lk_tensor *flat_rows(lk_tensor *x) {
    if (!x) return NULL;
    if (x->ndim == 2) return x;
    return lk_reshape(x, LK_SHAPE(x->ndim ? x->shape[0] : 1, -1));
}

static lk_tensor *autoencoder_forward(lk_layer *self, lk_tensor *x) {
    lk_tensor *z = lk_layer_forward(lk_layer_child(self, 0), flat_rows(x));
    return lk_layer_forward(lk_layer_child(self, 1), z);
}

static lk_tensor *mlp_forward(lk_layer *self, lk_tensor *x) {
    return lk_layer_forward(lk_layer_child(self, 0), flat_rows(x));
}

static lk_tensor *cnn_forward(lk_layer *self, lk_tensor *x) {
    model_impl *m = self->impl;
    if (x->ndim == 2) x = lk_reshape(x, LK_SHAPE(x->shape[0], m->c, m->h, m->w));
    lk_pool2d_params pool = {{2, 2}, {2, 2}, {0, 0}, true, false};
    lk_tensor *h = x;
    for (int b = 0; b < 2; b++) {
        h = lk_layer_forward(lk_layer_child(self, 2 * b), h);     /* conv */
        h = lk_layer_forward(lk_layer_child(self, 2 * b + 1), h); /* bn */
        h = h ? lk_max_pool2d(lk_relu(h), pool) : NULL;
    }
    h = h ? lk_flatten(h, 1, -1) : NULL;
    h = lk_layer_forward(lk_layer_child(self, 4), h);
    h = h ? lk_relu(h) : NULL;
    return lk_layer_forward(lk_layer_child(self, 5), h);
}

/* Linear/ReLU stack through widths w[0..n), optional dropout after ReLUs,
 * optional final sigmoid. */
static lk_layer *mlp_stack(const int64_t *w, int n, double dropout, bool sigmoid, lk_rng *rng) {
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

static lk_status build_autoencoder(const parsed_args *p, lk_rng *rng, lk_layer **out) {
    int64_t w[MAX_WIDTHS + 2];
    int n = 0;
    w[n++] = p->i[0];
    for (int k = 0; k < p->list_n[1]; k++) w[n++] = p->list[1][k];
    w[n++] = p->i[2];
    int64_t rw[MAX_WIDTHS + 2];
    for (int k = 0; k < n; k++) rw[k] = w[n - 1 - k];
    bool sigmoid;
    if (!strcmp(p->text[3], "sigmoid")) sigmoid = true;
    else if (!strcmp(p->text[3], "none")) sigmoid = false;
    else return lk_error(LK_STATUS_INVALID_ARGUMENT, "model autoencoder: final_activation = '%s': expected none or sigmoid", p->text[3]);
    lk_layer *m = lk_layer_create("Autoencoder", autoencoder_forward, NULL, NULL);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = lk_layer_add_child(m, "encoder", mlp_stack(w, n, 0, false, rng));
    if (!st) st = lk_layer_add_child(m, "decoder", mlp_stack(rw, n, 0, sigmoid, rng));
    if (st) {
        lk_layer_free(m);
        return st;
    }
    *out = m;
    return LK_STATUS_OK;
}

static lk_status build_mlp(const parsed_args *p, lk_rng *rng, lk_layer **out) {
    if (!(p->f[3] >= 0 && p->f[3] < 1))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model mlp: dropout = %g: expected a probability in [0, 1)", p->f[3]);
    int64_t w[MAX_WIDTHS + 2];
    int n = 0;
    w[n++] = p->i[0];
    for (int k = 0; k < p->list_n[1]; k++) w[n++] = p->list[1][k];
    w[n++] = p->i[2];
    lk_layer *m = lk_layer_create("MLP", mlp_forward, NULL, NULL);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = lk_layer_add_child(m, "layers", mlp_stack(w, n, p->f[3], false, rng));
    if (st) {
        lk_layer_free(m);
        return st;
    }
    *out = m;
    return LK_STATUS_OK;
}

static lk_status build_cnn(const parsed_args *p, lk_rng *rng, lk_layer **out) {
    int64_t cin = p->i[0], size = p->i[1], hidden = p->i[3], classes = p->i[4];
    if (p->list_n[2] != 2)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model cnn: channels = '%s': expected two widths (conv1, conv2)", p->text[2]);
    if (size % 4)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model cnn: image_size = %lld: expected a multiple of 4 (two 2x2 poolings)",
                        (long long)size);
    int64_t c1 = p->list[2][0], c2 = p->list[2][1];
    model_impl *mi = lk_malloc(sizeof *mi);
    if (!mi) return LK_STATUS_OUT_OF_MEMORY;
    *mi = (model_impl){cin, size, size};
    lk_layer *m = lk_layer_create("CNN", cnn_forward, mi, NULL);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    lk_conv2d_params cp = {{1, 1}, {1, 1}, {1, 1}, 1};
    lk_status st = lk_layer_add_child(m, "conv1", lk_conv2d_create(cin, c1, 3, 3, cp, true, rng));
    if (!st) st = lk_layer_add_child(m, "bn1", lk_batch_norm2d_create(c1, 1e-5f, 0.1f, true, true));
    if (!st) st = lk_layer_add_child(m, "conv2", lk_conv2d_create(c1, c2, 3, 3, cp, true, rng));
    if (!st) st = lk_layer_add_child(m, "bn2", lk_batch_norm2d_create(c2, 1e-5f, 0.1f, true, true));
    if (!st) st = lk_layer_add_child(m, "fc1", lk_linear_create(c2 * (size / 4) * (size / 4), hidden, true, rng));
    if (!st) st = lk_layer_add_child(m, "fc2", lk_linear_create(hidden, classes, true, rng));
    if (st) {
        lk_layer_free(m);
        return st;
    }
    *out = m;
    return LK_STATUS_OK;
}

lk_status lk_model_create(const char *name, const lk_model_kv *args, int n_args, uint64_t seed, lk_layer **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model_create: NULL out");
    *out = NULL;
    const lk_model_info *m = lk_model_find(name);
    if (!m) return lk_last_status();
    if (n_args > 0 && !args) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %d args but no array", name, n_args);
    parsed_args p;
    LK_TRY(parse_args(m, args, n_args, &p));
    lk_rng rng;
    lk_rng_init(&rng, seed, LK_RNG_INIT, 0, 0);
    lk_layer *l = NULL;
    lk_status st = !strcmp(m->name, "autoencoder") ? build_autoencoder(&p, &rng, &l)
                   : !strcmp(m->name, "mlp")       ? build_mlp(&p, &rng, &l)
                                                   : build_cnn(&p, &rng, &l);
    if (!st) st = lk_layer_reset_parameters(l, seed);
    if (st) {
        lk_layer_free(l);
        return st;
    }
    *out = l;
    return LK_STATUS_OK;
}

lk_status lk_model_input_shape(const char *name, const lk_model_kv *args, int n_args, int *ndim, int64_t shape[3],
                               char *why, size_t why_size) {
    const lk_model_info *m = lk_model_find(name);
    if (!m) return lk_last_status();
    parsed_args p;
    LK_TRY(parse_args(m, args, n_args, &p));
    if (!strcmp(m->name, "cnn")) { /* [in_channels, image_size, image_size] */
        *ndim = 3;
        shape[0] = p.i[0];
        shape[1] = shape[2] = p.i[1];
        snprintf(why, why_size, "in_channels %lld, image_size %lld", (long long)p.i[0], (long long)p.i[1]);
    } else { /* autoencoder, mlp: flattened rows of input_dim */
        *ndim = 1;
        shape[0] = p.i[0];
        snprintf(why, why_size, "input_dim %lld", (long long)p.i[0]);
    }
    return LK_STATUS_OK;
}

lk_tensor *lk_model_loss(const lk_model_info *info, lk_tensor *output, lk_tensor *x, lk_tensor *y) {
    if (!info || !output) {
        if (!lk_last_status()) lk_error(LK_STATUS_INVALID_ARGUMENT, "model_loss: NULL %s", info ? "output" : "model info");
        return NULL;
    }
    if (info->target_is_input) {
        if (!x) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model_loss (%s): NULL input", info->name), NULL;
        lk_tensor *t = x->numel == output->numel ? lk_reshape(x, output->ndim, output->shape) : x;
        return info->loss == LK_LOSS_MSE ? lk_mse_loss(output, t, LK_REDUCTION_MEAN) : NULL;
    }
    if (!y) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model_loss (%s): NULL labels", info->name), NULL;
    if (info->loss == LK_LOSS_CROSS_ENTROPY) return lk_cross_entropy(output, y, NULL);
    return lk_mse_loss(output, y, LK_REDUCTION_MEAN);
}

/* The model registry: the built-in list (one file per model under
 * src/models/), construction through the model's builder with parameters
 * seeded by lk_layer_reset_parameters, the input shape and the loss each
 * model trains with. The init args are parsed in args.c, which the models
 * use too: this file alone names the models. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models_impl.h"
#include "tensor/tensor_impl.h" /* lk__tensor_defer: a deferred build */

/* ---- the built-in list ------------------------------------------------------------ */

/* Every built-in model, in the order --help lists them. A new model is one
 * file under src/models/ defining its lk_model_info, and one line here. */
static const lk_model_info *const builtin[] = {
    &lk__model_autoencoder,
    &lk__model_mlp,
    &lk__model_cnn,
    &lk__model_gpt,
    &lk__model_resnet,
};
#define N_BUILTIN (int)(sizeof builtin / sizeof builtin[0])

/* lk_models() hands out one array of infos (its callers index it): a copy of
 * the list's infos, made once. */
static lk_model_info registry[N_BUILTIN];
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;
static void registry_fill(void) {
    for (int i = 0; i < N_BUILTIN; i++) registry[i] = *builtin[i];
}

const lk_model_info *lk_models(int *count) {
    pthread_once(&registry_once, registry_fill);
    if (count) *count = N_BUILTIN;
    return registry;
}

const lk_model_info *lk_model_find(const char *name) {
    const lk_model_info *all = lk_models(NULL);
    for (int i = 0; i < N_BUILTIN; i++)
        if (name && (!strcmp(all[i].name, name) || (all[i].alias && !strcmp(all[i].alias, name)))) return &all[i];
    char list[256] = "";
    for (int i = 0; i < N_BUILTIN; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", all[i].name);
    lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown model '%s' (registered models: %s)", name ? name : "(null)", list);
    return NULL;
}

/* ---- creation ----------------------------------------------------------------------- */

static lk_status create(const char *name, const lk_model_kv *args, int n_args, uint64_t seed, bool deferred,
                        lk_layer **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model_create: NULL out");
    *out = NULL;
    const lk_model_info *m = lk_model_find(name);
    if (!m) return lk_last_status();
    if (n_args > 0 && !args) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %d args but no array", name, n_args);
    if (!m->build) return lk_error(LK_STATUS_INTERNAL, "model %s has no builder", m->name);
    lk_model_args p;
    LK_TRY(lk__model_args_parse(m, args, n_args, &p));
    lk_layer *l = NULL;
    bool was = lk__tensor_defer(deferred); /* the builder's own draws skip the tensors it makes */
    lk_status st = m->build(&p, seed, &l);
    lk__tensor_defer(was);
    if (!st && !l) st = lk_error(LK_STATUS_INTERNAL, "model %s: its builder returned no layer", m->name);
    if (!st && deferred) l->deferred = true, l->deferred_seed = seed;
    else if (!st) st = lk_layer_reset_parameters(l, seed);
    if (st) {
        lk_layer_free(l);
        return st;
    }
    *out = l;
    return LK_STATUS_OK;
}

lk_status lk_model_create(const char *name, const lk_model_kv *args, int n_args, uint64_t seed, lk_layer **out) {
    return create(name, args, n_args, seed, false, out);
}

lk_status lk_model_create_deferred(const char *name, const lk_model_kv *args, int n_args, uint64_t seed,
                                   lk_layer **out) {
    return create(name, args, n_args, seed, true, out);
}

lk_status lk_model_input_shape(const char *name, const lk_model_kv *args, int n_args, int *ndim, int64_t shape[3],
                               char *why, size_t why_size) {
    const lk_model_info *m = lk_model_find(name);
    if (!m) return lk_last_status();
    lk_model_args p;
    LK_TRY(lk__model_args_parse(m, args, n_args, &p));
    *ndim = 0;
    if (why_size) why[0] = 0;
    return m->input_shape ? m->input_shape(&p, ndim, shape, why, why_size) : LK_STATUS_OK;
}

/* ---- blocks ------------------------------------------------------------------------ */

lk_status lk_model_blocks(const lk_layer *model, int *count, const lk_named_layer **blocks) {
    if (count) *count = 0;
    if (blocks) *blocks = NULL;
    if (!model || !count || !blocks)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model_blocks: NULL %s", !model ? "model" : !count ? "count" : "blocks");
    if (lk__is_model_staged(model)) return lk__model_staged_blocks(model, count, blocks);
    if (!lk__is_model_seq(model) && !lk_layer_is_sequential(model))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model_blocks: a %s is not a sequence of blocks (expected a built-in model or a Sequential: "
                        "its forward runs code of its own between its children)",
                        model->type ? model->type : "layer");
    *count = model->n_children;
    *blocks = model->children;
    return LK_STATUS_OK;
}

lk_tensor *lk_model_blocks_input(const lk_layer *model, lk_tensor *x) {
    if (!model || !x) {
        if (!lk_last_status()) lk_error(LK_STATUS_INVALID_ARGUMENT, "model_blocks_input: NULL %s", model ? "input" : "model");
        return NULL;
    }
    return lk__is_model_seq(model) ? lk__model_seq_input(model, x) : x;
}

lk_tensor *lk_model_loss(const lk_model_info *info, lk_tensor *output, lk_tensor *x, lk_tensor *y) {
    if (!info || !output) {
        if (!lk_last_status()) lk_error(LK_STATUS_INVALID_ARGUMENT, "model_loss: NULL %s", info ? "output" : "model info");
        return NULL;
    }
    if (info->target_is_input && !x) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model_loss (%s): NULL input", info->name), NULL;
    if (!info->target_is_input && !y) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model_loss (%s): NULL labels", info->name), NULL;
    if (info->loss_fn) return info->loss_fn(output, x, y); /* the model brings its own */
    /* an info without a loss function: the loss its kind names */
    if (info->target_is_input)
        return info->loss == LK_LOSS_MSE ? lk__loss_reconstruction(output, x, y)
                                         : (lk_error(LK_STATUS_INVALID_ARGUMENT,
                                                     "model_loss (%s): a model whose target is its input trains with MSE",
                                                     info->name),
                                            NULL);
    if (info->loss == LK_LOSS_CROSS_ENTROPY) return lk__loss_classification(output, x, y);
    return lk_mse_loss(output, y, LK_REDUCTION_MEAN);
}

/* The model registry: the built-in list (one file per model under
 * src/models/), parsing and validation of init args against each model's
 * table (with a nearest-name hint for typos), construction through the
 * model's builder with parameters seeded by lk_layer_reset_parameters, the
 * input shape and the loss each model trains with. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models_impl.h"

/* ---- the built-in list ------------------------------------------------------------ */

/* Every built-in model, in the order --help lists them. A new model is one
 * file under src/models/ defining its lk_model_info, and one line here. */
static const lk_model_info *const builtin[] = {
    &lk__model_autoencoder,
    &lk__model_mlp,
    &lk__model_cnn,
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
        if (name && !strcmp(all[i].name, name)) return &all[i];
    char list[256] = "";
    for (int i = 0; i < N_BUILTIN; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", all[i].name);
    lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown model '%s' (registered models: %s)", name ? name : "(null)", list);
    return NULL;
}

/* ---- arguments -------------------------------------------------------------------- */

static lk_status parse_one(const lk_model_info *m, int k, const char *v, lk_model_args *p) {
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
            if (n == LK_MODEL_MAX_WIDTHS)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %s = '%s': at most %d widths", m->name, a->name, v, LK_MODEL_MAX_WIDTHS);
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

static lk_status parse_args(const lk_model_info *m, const lk_model_kv *args, int n_args, lk_model_args *p) {
    memset(p, 0, sizeof *p);
    p->info = m;
    /* the parsed values are indexed like the table: a longer table is a bug in the model */
    if (m->n_args > LK_MODEL_MAX_ARGS)
        return lk_error(LK_STATUS_INTERNAL, "model %s: %d arguments in its table (at most %d)", m->name, m->n_args,
                        LK_MODEL_MAX_ARGS);
    for (int k = 0; k < m->n_args; k++) LK_TRY(parse_one(m, k, m->args[k].default_value, p));
    for (int j = 0; j < n_args; j++) {
        int found = -1;
        const char *names[LK_MODEL_MAX_ARGS];
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

/* The table index of `name`, which must have type `type` (else a bug in the model: panic). */
static int arg_index(const lk_model_args *a, const char *name, lk_arg_type type) {
    const lk_model_info *m = a->info;
    for (int k = 0; k < m->n_args; k++)
        if (!strcmp(m->args[k].name, name)) {
            if (m->args[k].type != type && type != (lk_arg_type)-1)
                lk_panic("model %s: argument '%s' read with the accessor of another type", m->name, name);
            return k;
        }
    lk_panic("model %s: its builder reads argument '%s', which its table does not declare", m->name, name);
}

int64_t lk_model_args_int(const lk_model_args *a, const char *name) { return a->i[arg_index(a, name, LK_ARG_INT)]; }
bool lk_model_args_bool(const lk_model_args *a, const char *name) { return a->i[arg_index(a, name, LK_ARG_BOOL)] != 0; }
double lk_model_args_float(const lk_model_args *a, const char *name) { return a->f[arg_index(a, name, LK_ARG_FLOAT)]; }
const char *lk_model_args_string(const lk_model_args *a, const char *name) {
    return a->text[arg_index(a, name, (lk_arg_type)-1)];
}
int lk_model_args_list(const lk_model_args *a, const char *name, const int64_t **values) {
    int k = arg_index(a, name, LK_ARG_INT_LIST);
    if (values) *values = a->list[k];
    return a->list_n[k];
}

/* ---- creation ----------------------------------------------------------------------- */

lk_status lk_model_create(const char *name, const lk_model_kv *args, int n_args, uint64_t seed, lk_layer **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model_create: NULL out");
    *out = NULL;
    const lk_model_info *m = lk_model_find(name);
    if (!m) return lk_last_status();
    if (n_args > 0 && !args) return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %d args but no array", name, n_args);
    if (!m->build) return lk_error(LK_STATUS_INTERNAL, "model %s has no builder", m->name);
    lk_model_args p;
    LK_TRY(parse_args(m, args, n_args, &p));
    lk_layer *l = NULL;
    lk_status st = m->build(&p, seed, &l);
    if (!st && !l) st = lk_error(LK_STATUS_INTERNAL, "model %s: its builder returned no layer", m->name);
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
    lk_model_args p;
    LK_TRY(parse_args(m, args, n_args, &p));
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
    if (!lk__is_model_seq(model) && !lk_layer_is_sequential(model))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model_blocks: a %s is not a sequence of blocks (expected a built-in model or a Sequential: "
                        "its forward runs code of its own between its children)",
                        model->type ? model->type : "layer");
    *count = model->n_children;
    *blocks = model->children;
    return LK_STATUS_OK;
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

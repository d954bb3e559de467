/* model_registry: the built-in list as data — every registered model has a
 * builder and an input shape, is defined in exactly one file,
 * src/models/<name>.c, and the registry itself (models.c) names no model
 * (no strcmp chain: a new model is a file and a line in the list). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>

#include "lk_test.h"
#include "lockstep/models.h"

/* The whole file as a string (caller frees), or NULL. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static void every_builtin_has_a_builder(void) {
    int n = 0;
    const lk_model_info *m = lk_models(&n);
    CHECK(n >= 3);
    for (int i = 0; i < n; i++) {
        CHECK_MSG(m[i].build && m[i].input_shape && m[i].loss_fn, "model %s: builder %d, input_shape %d, loss_fn %d",
                  m[i].name, m[i].build != NULL, m[i].input_shape != NULL, m[i].loss_fn != NULL);
        CHECK_MSG(m[i].n_args <= LK_MODEL_MAX_ARGS, "model %s: %d args", m[i].name, m[i].n_args);
        CHECK(lk_model_find(m[i].name) == &m[i]);
        /* built with its defaults through lk_model_create: a layer with parameters */
        lk_layer *l = NULL;
        CHECK_OK(lk_model_create(m[i].name, NULL, 0, 3, &l));
        CHECK_MSG(l && lk_layer_num_parameters(l) > 0, "model %s built nothing", m[i].name);
        int nd = -1;
        int64_t shape[3];
        char why[128];
        CHECK_OK(lk_model_input_shape(m[i].name, NULL, 0, &nd, shape, why, sizeof why));
        CHECK_MSG(nd >= 1 && nd <= 3 && why[0], "model %s: input ndim %d (%s)", m[i].name, nd, why);
        lk_layer_free(l);
    }
}

static void one_file_per_model(void) {
    int n = 0;
    const lk_model_info *m = lk_models(&n);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/src/models", LK_SOURCE_DIR);
    for (int i = 0; i < n; i++) {
        char def[128];
        snprintf(def, sizeof def, "const lk_model_info lk__model_%s = {", m[i].name);
        int found = 0;
        char where[512] = "";
        DIR *d = opendir(dir);
        CHECK_MSG(d, "cannot open %s", dir);
        for (struct dirent *e; d && (e = readdir(d));) {
            size_t len = strlen(e->d_name);
            if (len < 3 || strcmp(e->d_name + len - 2, ".c")) continue;
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            char *s = slurp(path);
            if (s && strstr(s, def)) {
                found++;
                snprintf(where, sizeof where, "%s", e->d_name);
            }
            free(s);
        }
        if (d) closedir(d);
        char want[128];
        snprintf(want, sizeof want, "%s.c", m[i].name);
        CHECK_MSG(found == 1 && !strcmp(where, want), "model %s: defined in %d files (last %s), expected once in %s",
                  m[i].name, found, where, want);
    }
    /* the registry compares no model names: the builders do the work */
    char path[1024];
    snprintf(path, sizeof path, "%s/models.c", dir);
    char *s = slurp(path);
    CHECK_MSG(s, "cannot read %s", path);
    for (int i = 0; s && i < n; i++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", m[i].name);
        CHECK_MSG(!strstr(s, quoted), "src/models/models.c names model %s", quoted);
    }
    free(s);
}

/* A model brings its own loss: lk_model_loss calls the info's loss_fn. */
static int custom_calls;
static lk_tensor *custom_loss(lk_tensor *out, lk_tensor *x, lk_tensor *y) {
    custom_calls++;
    return lk_sum(out, NULL, 0, false);
}

static void a_model_brings_its_loss(void) {
    lk_model_info info = *lk_model_find("mlp");
    info.loss_fn = custom_loss;
    lk_tensor *x = lk_tensor_full(LK_F32, LK_SHAPE(2, 3), 0.5), *y = lk_tensor_full(LK_I64, LK_SHAPE(2), 1);
    CHECK(x && y);
    lk_scope_begin();
    lk_tensor *l = lk_model_loss(&info, x, x, y);
    CHECK(custom_calls == 1 && l && lk_tensor_item(l) == 3.0);
    /* the built-in's own: cross-entropy of uniform logits over 3 classes = log 3 */
    l = lk_model_loss(lk_model_find("mlp"), x, x, y);
    CHECK(l && fabs(lk_tensor_item(l) - log(3.0)) < 1e-6);
    lk_scope_end();
    lk_tensor_release(x);
    lk_tensor_release(y);
}

/* Small args for the models whose defaults are big (gpt: GPT-2 124M). */
static int small_args(const char *name, const lk_model_kv **args) {
    static const lk_model_kv gpt[] = {{"n_layer", "2"},     {"n_head", "2"},    {"n_embd", "32"},
                                      {"block_size", "16"}, {"vocab_size", "50"}, {"bias", "true"}};
    *args = NULL;
    if (!strcmp(name, "gpt")) return *args = gpt, 6;
    return 0;
}

/* Every tensor of both models: the same names, dtypes, shapes and bytes. */
static void same_bits(const char *what, const lk_layer *a, const lk_layer *b) {
    lk_named_tensors x = {0}, y = {0};
    CHECK_OK(lk_state_dict_get(a, &x));
    CHECK_OK(lk_state_dict_get(b, &y));
    CHECK_MSG(x.n == y.n && x.n > 0, "%s: %d against %d tensors", what, x.n, y.n);
    for (int i = 0; i < x.n && i < y.n; i++) {
        lk_tensor *p = x.items[i].tensor, *q = y.items[i].tensor;
        bool ok = !strcmp(x.items[i].name, y.items[i].name) && p->dtype == q->dtype && lk_tensor_same_shape(p, q) &&
                  lk_tensor_has_data(p) && lk_tensor_has_data(q) && !memcmp(p->data, q->data, lk_tensor_nbytes(p));
        CHECK_MSG(ok, "%s: %s differs", what, x.items[i].name);
    }
    lk_named_tensors_clear(&x);
    lk_named_tensors_clear(&y);
}

/* lk_model_create_deferred: every registered model built without storage
 * (names, shapes and counts as built whole; reading one is an error that
 * says why), then materialised: lk_model_create's bits, in f32 and cast to
 * bf16 before materialising (the bits of the whole model cast after). */
static void deferred_builds_the_same_bits(void) {
    int n = 0;
    const lk_model_info *m = lk_models(&n);
    for (int i = 0; i < n; i++) {
        const lk_model_kv *args;
        int na = small_args(m[i].name, &args);
        lk_layer *whole = NULL, *d = NULL;
        CHECK_OK(lk_model_create(m[i].name, args, na, 5, &whole));
        CHECK_OK(lk_model_create_deferred(m[i].name, args, na, 5, &d));
        if (!whole || !d) continue;
        CHECK_MSG(d->deferred && !whole->deferred, "model %s: deferred flag", m[i].name);
        CHECK(lk_layer_num_parameters(d) == lk_layer_num_parameters(whole));
        lk_named_tensors sd = {0};
        CHECK_OK(lk_state_dict_get(d, &sd));
        int held = 0;
        for (int k = 0; k < sd.n; k++) held += lk_tensor_has_data(sd.items[k].tensor);
        CHECK_MSG(held == 0, "model %s: %d tensors hold data before materialize", m[i].name, held);
        if (sd.n) {
            lk_tensor *c = lk_mul_scalar(sd.items[0].tensor, 2.0f); /* an op reads it */
            CHECK_MSG(!c && strstr(lk_last_error(), "holds no data on this rank: it was made without storage (deferred "
                                                   "initialisation: lk_layer_materialize gives the model's tensors "
                                                   "storage and values)"),
                      "model %s: %s", m[i].name,
                      lk_last_error());
            lk_tensor_release(c);
        }
        lk_named_tensors_clear(&sd);
        CHECK_OK(lk_layer_materialize(d));
        CHECK(!d->deferred);
        same_bits(m[i].name, whole, d);
        CHECK_OK(lk_layer_materialize(d)); /* materialised: nothing to do */
        lk_layer_free(d);
        /* bf16 before the draw, as bf16-true casts a deferred model */
        d = NULL;
        CHECK_OK(lk_model_create_deferred(m[i].name, args, na, 5, &d));
        CHECK_OK(lk_layer_cast_parameters(d, LK_BF16));
        CHECK_OK(lk_layer_materialize(d));
        CHECK_OK(lk_layer_cast_parameters(whole, LK_BF16));
        char what[64];
        snprintf(what, sizeof what, "%s bf16", m[i].name);
        same_bits(what, whole, d);
        lk_layer_free(d);
        lk_layer_free(whole);
    }
}

LK_TEST_MAIN(LK_TEST_CASE(every_builtin_has_a_builder), LK_TEST_CASE(one_file_per_model),
             LK_TEST_CASE(a_model_brings_its_loss), LK_TEST_CASE(deferred_builds_the_same_bits))

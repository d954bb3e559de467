/* c_api: the C API without its frictions (issue 48) — a module and a data
 * module made by their constructors (no compound literals), a data module
 * without setup() trains, the constructors take what they are given on
 * failure too (each part freed once), lk_trainer_get_metric returns
 * lk_status like the rest (lk_trainer_metric, deprecated, still answers),
 * and lk_log_accuracy logs what the logits say without the caller reading
 * logits->data. */
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"

static int destroyed; /* destroy calls, to check that failed constructors free self once */

/* x in [-1, 1)^4 from (seed, index); y = x0 > 0 */
static lk_status half_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    (void)epoch, (void)scratch;
    lk_rng rng;
    lk_rng_init(&rng, *(const uint64_t *)ctx, LK_RNG_USER, (uint32_t)index, 0);
    float *x = out[0];
    for (int k = 0; k < 4; k++) x[k] = 2.0f * lk_rng_uniform(&rng) - 1.0f;
    *(int64_t *)out[1] = x[0] > 0;
    return LK_STATUS_OK;
}

typedef struct {
    uint64_t seed[2];
    lk_dataset *train, *val;
} half_data;

static lk_dataset *half_dataset(lk_datamodule *dm, const char *split) {
    half_data *d = dm->self;
    return !strcmp(split, "train") ? d->train : !strcmp(split, "val") ? d->val : NULL;
}
static void half_destroy(lk_datamodule *dm) {
    half_data *d = dm->self;
    destroyed++;
    lk_dataset_free(d->train);
    lk_dataset_free(d->val);
    lk_free(d);
}
static const lk_datamodule_vtable no_setup_vt = {.dataset = half_dataset, .destroy = half_destroy}; /* no setup */

static half_data *half_data_create(void) {
    static const lk_dataset_vtable vt = {.kind = "half", .get = half_get};
    const lk_field f[2] = {{.name = "x", .dtype = LK_F32, .ndim = 1, .shape = {4}}, {.name = "y", .dtype = LK_I64}};
    half_data *d = lk_calloc(1, sizeof *d);
    if (!d) return NULL;
    d->seed[0] = 1, d->seed[1] = 2;
    CHECK_OK(lk_dataset_create(&vt, &d->seed[0], 256, 2, f, 0, &d->train));
    CHECK_OK(lk_dataset_create(&vt, &d->seed[1], 64, 2, f, 0, &d->val));
    return d;
}

typedef struct {
    double hits, rows; /* the accuracy counted by hand, over the last validation */
} counts;

static lk_tensor *train_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    (void)i, (void)tr;
    return lk_cross_entropy(lk_layer_forward(m->net, lk_batch_tensor(b, 0)), lk_batch_tensor(b, 1), NULL);
}
static lk_status val_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    lk_tensor *logits = lk_layer_forward(m->net, lk_batch_tensor(b, 0));
    if (!logits) return lk_last_status();
    counts *c = m->self;
    if (i == 0) c->hits = c->rows = 0;
    for (int64_t r = 0; r < b->size; r++) { /* the by-hand count the helper replaces */
        int64_t y = (int64_t)lk_tensor_get(lk_batch_tensor(b, 1), r);
        c->hits += (lk_tensor_get(logits, 2 * r + 1) > lk_tensor_get(logits, 2 * r)) == (y == 1);
        c->rows += 1;
    }
    return lk_log_accuracy(tr, "val_acc", logits, lk_batch_tensor(b, 1), NULL);
}
static void module_destroy(lk_module *m) {
    destroyed++;
    lk_free(m->self);
}
static const lk_module_vtable mod_vt = {.training_step = train_step, .validation_step = val_step, .destroy = module_destroy};

static void constructors_and_no_setup_train(void) {
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    CHECK_OK(lk_module_create("half", &mod_vt, lk_linear_create(4, 2, true, NULL), lk_calloc(1, sizeof(counts)), &m));
    CHECK_OK(lk_datamodule_create("half", &no_setup_vt, half_data_create(), 32, &dm));
    CHECK(m && dm && dm->batch_size == 32 && !strcmp(m->name, "half"));
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.max_epochs = 3;
    cfg.enable_progress_bar = cfg.enable_checkpointing = cfg.enable_tensorboard = cfg.enable_model_summary = false;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "/tmp/lk_test_c_api_%d", (int)getpid());
    lk_optim_settings o;
    lk_optim_settings_default(&o);
    o.lr = 0.05;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_trainer_create(&cfg, &o, NULL, &tr));
    CHECK_OK(lk_trainer_fit(tr, m, dm, NULL)); /* a data module without setup() */
    double acc = NAN, old = NAN;
    CHECK_OK(lk_trainer_get_metric(tr, "val_acc", &acc));
    counts *c = m->self;
    CHECK_MSG(fabs(acc - c->hits / c->rows) < 1e-12, "lk_log_accuracy %.6f, by hand %.6f", acc, c->hits / c->rows);
    CHECK_MSG(acc > 0.8, "the model learned x0 > 0: val_acc %.3f", acc);
    CHECK(lk_trainer_metric(tr, "val_acc", &old) && old == acc); /* the deprecated form still answers */
    CHECK_ERR(lk_trainer_get_metric(tr, "nope", &acc), LK_STATUS_INVALID_ARGUMENT,
              "metric 'nope' has no value on rank 0; logged metrics: ");
    CHECK(!lk_trainer_metric(tr, "nope", &old));
    lk_tensor *l3 = lk_tensor_zeros(LK_F32, 1, (int64_t[]){3}), *y3 = lk_tensor_zeros(LK_I64, 1, (int64_t[]){3});
    CHECK_ERR(lk_log_accuracy(tr, "acc", l3, y3, NULL), LK_STATUS_INVALID_ARGUMENT,
              "lk_log_accuracy: 'acc' needs logits [N, C] and class indices [N] on one device, got logits of 1 dims");
    lk_tensor_release(l3);
    lk_tensor_release(y3);
    lk_trainer_free(tr);
    destroyed = 0;
    lk_module_free(m);
    lk_datamodule_free(dm);
    CHECK(destroyed == 2);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_c_api_%d", (int)getpid());
    CHECK(system(rm) == 0);
}

static void failed_constructors_free_what_they_were_given(void) {
    lk_module *m = (lk_module *)1;
    destroyed = 0;
    /* a layer constructor that failed: its message comes along, self is freed */
    lk_clear_error();
    lk_status st = lk_module_create("half", &mod_vt, lk_linear_create(0, 2, true, NULL), lk_calloc(1, sizeof(counts)), &m);
    CHECK_MSG(st == LK_STATUS_INVALID_ARGUMENT && strstr(lk_last_error(), "lk_module_create: module 'half' has no network "
                                                                          "(Linear: in_features and out_features must be positive"),
              "%s", lk_last_error());
    CHECK(m == NULL && destroyed == 1);
    CHECK_ERR(lk_module_create("half", NULL, lk_linear_create(4, 2, true, NULL), NULL, &m), LK_STATUS_INVALID_ARGUMENT,
              "lk_module_create: module 'half' has no vtable");
    lk_datamodule *dm = (lk_datamodule *)1;
    CHECK_ERR(lk_datamodule_create("half", &no_setup_vt, half_data_create(), 0, &dm), LK_STATUS_INVALID_ARGUMENT,
              "lk_datamodule_create: data module 'half': batch_size 0, expected 1 or more");
    CHECK(dm == NULL && destroyed == 2);
    static const lk_datamodule_vtable no_dataset = {.destroy = half_destroy};
    CHECK_ERR(lk_datamodule_create("half", &no_dataset, half_data_create(), 8, &dm), LK_STATUS_INVALID_ARGUMENT,
              "needs a vtable with dataset()");
    CHECK(destroyed == 3);
}

LK_TEST_MAIN(LK_TEST_CASE(constructors_and_no_setup_train), LK_TEST_CASE(failed_constructors_free_what_they_were_given))

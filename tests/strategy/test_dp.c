/* The dp strategy (replicas on threads) trains the same parameters as one
 * process on the same batches; dp refuses what it cannot do. Runs through
 * the public trainer API. */
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/strategy.h"
#include "lockstep/trainer.h"

static const lk_model_kv model_args[] = {{"input_dim", "16"}, {"hidden", "[32, 16]"}, {"num_classes", "4"}};
static const lk_model_kv data_args[] = {{"num_samples", "640"}, {"input_shape", "[16]"}, {"num_classes", "4"},
                                        {"batch_size", "32"}, {"num_workers", "0"}};

/* Trains up to max_steps (from `resume`'s checkpoint when given; the last
 * checkpoint's path goes to `last` when given) and returns the parameters,
 * concatenated (caller frees). */
static float *train_ex(const char *strategy, int devices, int64_t max_steps, const char *resume, char *last,
                       size_t last_size, int64_t *n_out) {
    lk_trainer_config cfg;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.strategy, sizeof cfg.strategy, "%s", strategy);
    cfg.devices = devices;
    cfg.max_steps = max_steps;
    cfg.max_epochs = 5;
    cfg.enable_checkpointing = last != NULL;
    cfg.enable_progress_bar = false;
    cfg.enable_tensorboard = false;
    cfg.num_sanity_val_steps = 0;
    cfg.seed = 3;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "/tmp/lk_test_dp_%d", (int)getpid());
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    float *out = NULL;
    CHECK_OK(lk_module_create_builtin("mlp", model_args, 3, 3, &m));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data_args, 5, 3, &dm));
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    if (m && dm && tr) {
        CHECK_OK(lk_trainer_fit(tr, m, dm, resume));
        if (last) snprintf(last, last_size, "%s", lk_trainer_last_checkpoint(tr));
        lk_named_tensors ps = {0};
        CHECK_OK(lk_layer_named_parameters(m->net, &ps));
        int64_t n = 0;
        for (int i = 0; i < ps.n; i++) n += ps.items[i].tensor->numel;
        out = malloc((size_t)n * sizeof(float));
        int64_t k = 0;
        for (int i = 0; i < ps.n; i++)
            for (int64_t j = 0; j < ps.items[i].tensor->numel; j++) out[k++] = (float)lk_tensor_get(ps.items[i].tensor, j);
        *n_out = n;
        lk_named_tensors_clear(&ps);
    }
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    if (!last && !resume) {
        char rm[128];
        snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_dp_%d", (int)getpid());
        CHECK(system(rm) == 0);
    }
    return out;
}

/* Trains 12 steps. */
static float *train(const char *strategy, int devices, int64_t *n_out) {
    return train_ex(strategy, devices, 12, NULL, NULL, 0, n_out);
}

/* A dp run stopped after 5 steps and resumed from its last.ckpt ends with
 * the bits of an uninterrupted one: the replicas start the resumed run from
 * the loaded parameters, not from those they copied before the load. */
static void dp_resume_is_exact(void) {
    int64_t n1 = 0, n2 = 0;
    char last[1024] = "";
    float *a = train("dp", 2, &n1);
    float *part = train_ex("dp", 2, 5, NULL, last, sizeof last, &n2);
    CHECK_MSG(last[0] != 0, "the stopped run wrote no last.ckpt");
    float *b = last[0] ? train_ex("dp", 2, 12, last, NULL, 0, &n2) : NULL;
    CHECK(a && b && n1 == n2 && n1 > 0);
    if (a && b && n1 == n2) CHECK_MSG(!memcmp(a, b, (size_t)n1 * sizeof(float)), "the resumed dp run differs");
    free(a);
    free(part);
    free(b);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_dp_%d", (int)getpid());
    CHECK(system(rm) == 0);
}

static void dp_equals_single(void) {
    int64_t n1 = 0, n2 = 0;
    float *a = train("single", 1, &n1);
    float *b = train("dp", 2, &n2);
    CHECK(a && b && n1 == n2 && n1 > 0);
    if (a && b && n1 == n2) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < n1; i++) {
            num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            den += (double)a[i] * a[i];
        }
        double rel = sqrt(num / den);
        printf("dp x2 vs single after 12 Adam steps: relative error %.3g\n", rel);
        /* the two slices' mean losses, weighted by slice size, sum to the
         * batch mean: only the summation order differs */
        CHECK_MSG(rel <= 1e-5, "%.3g", rel);
    }
    free(a);
    free(b);
}

static lk_tensor *no_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) { return NULL; }
static const lk_module_vtable plain_vt = {.training_step = no_step};

static void dp_refuses_unreplicable_module(void) {
    lk_trainer_config cfg;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.strategy, sizeof cfg.strategy, "dp");
    cfg.devices = 2;
    cfg.enable_progress_bar = false;
    cfg.enable_checkpointing = false;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "/tmp/lk_test_dp2_%d", (int)getpid());
    lk_trainer *tr = NULL;
    lk_datamodule *dm = NULL;
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data_args, 5, 3, &dm));
    lk_module m = {.name = "custom", .vt = &plain_vt, .net = lk_linear_create(16, 4, true, NULL)};
    CHECK_ERR(lk_trainer_fit(tr, &m, dm, NULL), LK_STATUS_INVALID_ARGUMENT, "cannot be replicated");
    lk_layer_free(m.net);
    lk_trainer_free(tr);
    lk_datamodule_free(dm);
    cfg.devices = 4096;
    CHECK_ERR(lk_trainer_create(&cfg, NULL, NULL, &tr), LK_STATUS_INVALID_ARGUMENT, "more than the");
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_dp2_%d", (int)getpid());
    CHECK(system(rm) == 0);
}

/* dp's cut (which the trainer's prefetch stages too): contiguous slices
 * covering the batch, the first size % n one row longer. */
static void dp_slices_cover_the_batch(void) {
    static const struct {
        int64_t size;
        int n;
        int64_t rows[4];
    } cs[] = {{32, 2, {16, 16}}, {33, 2, {17, 16}}, {7, 3, {3, 2, 2}}, {1, 3, {1, 0, 0}}, {0, 2, {0, 0}}, {10, 4, {3, 3, 2, 2}}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        int64_t next = 0;
        for (int k = 0; k < cs[i].n; k++) {
            int64_t start = -1, rows = -1;
            lk_strategy_dp_slice(cs[i].size, cs[i].n, k, &start, &rows);
            CHECK_MSG(start == next && rows == cs[i].rows[k], "%lld rows over %d, replica %d: [%lld, +%lld), expected [%lld, +%lld)",
                      (long long)cs[i].size, cs[i].n, k, (long long)start, (long long)rows, (long long)next,
                      (long long)cs[i].rows[k]);
            next = start + rows;
        }
        CHECK(next == cs[i].size);
    }
}

LK_TEST_MAIN(LK_TEST_CASE(dp_equals_single), LK_TEST_CASE(dp_slices_cover_the_batch), LK_TEST_CASE(dp_refuses_unreplicable_module), LK_TEST_CASE(dp_resume_is_exact))

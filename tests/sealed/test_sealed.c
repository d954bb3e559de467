/* Training on a device the host cannot read (tests/sealed_device.h): the
 * mlp and the cnn fit with strategy single on sealed:0 give the CPU's bits
 * (parameters and losses), in f32 and bf16-mixed; a checkpoint written on
 * the sealed device resumes on the CPU and the other way round with the
 * bits of an uninterrupted run; after the second step the pool serves every
 * storage and a step copies the batch in, not the parameters. Any host read
 * of device memory outside the device's methods and backend is a SIGSEGV
 * (run under `gdb -batch -ex run -ex bt` to see where). */
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"
#include "sealed_device.h"

static const lk_model_kv mlp_args[] = {{"input_dim", "16"}, {"hidden", "[32, 16]"}, {"num_classes", "4"}};
static const lk_model_kv cnn_args[] = {{"image_size", "8"}, {"channels", "[4, 6]"}, {"hidden", "10"}, {"num_classes", "4"}};
static const lk_model_kv mlp_data[] = {{"num_samples", "640"}, {"input_shape", "[16]"}, {"num_classes", "4"},
                                       {"batch_size", "32"}, {"num_workers", "0"}};
static const lk_model_kv cnn_data[] = {{"num_samples", "320"}, {"input_shape", "[1, 8, 8]"}, {"num_classes", "4"},
                                       {"batch_size", "16"}, {"num_workers", "0"}};

typedef struct {
    const char *model, *accelerator, *precision, *strategy;
    int devices;
    int64_t max_steps;
    const char *resume; /* a checkpoint to resume from, or NULL */
    char *last;         /* where the last checkpoint's path goes, or NULL */
} run_spec;

typedef struct {
    float *params; /* concatenated, on the host (caller frees) */
    int64_t n;
    double loss; /* train_loss after the last step */
    sealed_stats before, after;
} run_out;

static char root[256];
static void setup(void);

static run_out fit(run_spec s) {
    run_out o = {0};
    if (!root[0]) setup(); /* a case run alone */
    lk_trainer_config cfg;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.accelerator, sizeof cfg.accelerator, "%s", s.accelerator);
    snprintf(cfg.strategy, sizeof cfg.strategy, "%s", s.strategy ? s.strategy : "single");
    snprintf(cfg.precision, sizeof cfg.precision, "%s", s.precision ? s.precision : "32-true");
    cfg.devices = s.devices ? s.devices : 1;
    cfg.max_steps = s.max_steps;
    cfg.max_epochs = 5;
    cfg.enable_checkpointing = true;
    cfg.enable_progress_bar = false;
    cfg.enable_tensorboard = false;
    cfg.enable_model_summary = false;
    cfg.num_sanity_val_steps = 0;
    cfg.log_every_n_steps = 1;
    cfg.seed = 3;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", root);
    bool cnn = !strcmp(s.model, "cnn");
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_module_create_builtin(s.model, cnn ? cnn_args : mlp_args, cnn ? 4 : 3, 3, &m));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", cnn ? cnn_data : mlp_data, 5, 3, &dm));
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    if (m && dm && tr) {
        o.before = sealed_get_stats();
        CHECK_OK(lk_trainer_fit(tr, m, dm, s.resume));
        o.after = sealed_get_stats();
        if (s.last) snprintf(s.last, 1024, "%s", lk_trainer_last_checkpoint(tr));
        CHECK(lk_trainer_metric(tr, "train_loss", &o.loss));
        CHECK(lk_device_equal(lk_device_default(), LK_DEVICE_CPU)); /* the run put the default back */
        lk_named_tensors ps = {0};
        CHECK_OK(lk_layer_named_parameters(m->net, &ps));
        for (int i = 0; i < ps.n; i++) o.n += ps.items[i].tensor->numel;
        o.params = calloc((size_t)o.n + 1, sizeof(float));
        int64_t k = 0;
        for (int i = 0; i < ps.n; i++) { /* one copy per parameter, wherever it lives */
            lk_tensor *h = lk_tensor_to(ps.items[i].tensor, LK_DEVICE_CPU);
            CHECK(h && h->dtype == LK_F32);
            if (h) memcpy(o.params + k, h->data, (size_t)h->numel * sizeof(float));
            k += ps.items[i].tensor->numel;
            lk_tensor_release(h);
        }
        lk_named_tensors_clear(&ps);
    }
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    return o;
}

static void same_bits(const char *what, run_out a, run_out b) {
    CHECK_MSG(a.params && b.params && a.n == b.n && a.n > 0, "%s: no parameters", what);
    if (a.params && b.params && a.n == b.n) {
        int64_t diff = 0;
        for (int64_t i = 0; i < a.n; i++) diff += memcmp(&a.params[i], &b.params[i], sizeof(float)) != 0;
        CHECK_MSG(diff == 0, "%s: %lld of %lld parameters differ", what, (long long)diff, (long long)a.n);
    }
    CHECK_MSG(memcmp(&a.loss, &b.loss, sizeof a.loss) == 0, "%s: loss %.9g vs %.9g", what, a.loss, b.loss);
    free(a.params);
    free(b.params);
}

static void single_fit(const char *model, const char *precision) {
    run_out cpu = fit((run_spec){.model = model, .accelerator = "cpu", .precision = precision, .max_steps = 6});
    run_out sd = fit((run_spec){.model = model, .accelerator = "sealed", .precision = precision, .max_steps = 6});
    CHECK_MSG(sd.after.ops > sd.before.ops, "nothing ran on the sealed device");
    char what[64];
    snprintf(what, sizeof what, "%s %s", model, precision);
    same_bits(what, cpu, sd);
}

static void mlp_single(void) { single_fit("mlp", "32-true"); }
static void cnn_single(void) { single_fit("cnn", "32-true"); }
static void mlp_bf16_mixed(void) { single_fit("mlp", "bf16-mixed"); }
static void cnn_bf16_mixed(void) { single_fit("cnn", "bf16-mixed"); }

static void setup(void) {
    snprintf(root, sizeof root, "/tmp/lk_test_sealed_%d", (int)getpid());
    sealed_device(0);
}

static void cleanup(void) {
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", root);
    CHECK(system(rm) == 0);
}

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(mlp_single), LK_TEST_CASE(cnn_single), LK_TEST_CASE(mlp_bf16_mixed),
             LK_TEST_CASE(cnn_bf16_mixed), LK_TEST_CASE(cleanup))

/* Training on a device the host cannot read (tests/sealed_device.h): the
 * mlp (with dropout) and the cnn (batch norm) fit with strategy single on
 * sealed:0 give the CPU's bits — parameters, training and validation losses
 * and accuracy — in f32 and bf16-mixed; a checkpoint written on the sealed
 * device resumes on the CPU and the other way round with the bits of an
 * uninterrupted run; after the second step the pool serves every storage,
 * and a step copies the batch in, never the parameters. Any host read of
 * device memory outside the device's methods and backend is a SIGSEGV
 * (run under `gdb -batch -ex run -ex bt` to see where), and a host pointer
 * handed to a device op is an error naming the op. */
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"
#include "sealed_device.h"

static const lk_model_kv mlp_args[] = {{"input_dim", "16"}, {"hidden", "[32, 16]"}, {"num_classes", "4"}, {"dropout", "0.25"}};
static const lk_model_kv cnn_args[] = {{"image_size", "8"}, {"channels", "[4, 6]"}, {"hidden", "10"}, {"num_classes", "4"}};
static const lk_model_kv mlp_data[] = {{"num_samples", "640"}, {"input_shape", "[16]"}, {"num_classes", "4"},
                                       {"batch_size", "32"}, {"num_workers", "0"}};
static const lk_model_kv cnn_data[] = {{"num_samples", "320"}, {"input_shape", "[1, 8, 8]"}, {"num_classes", "4"},
                                       {"batch_size", "16"}, {"num_workers", "0"}};

typedef struct {
    const char *model, *accelerator, *precision;
    int64_t max_steps;
    const char *resume; /* a checkpoint to resume from, or NULL */
    char *last;         /* where the last checkpoint's path goes (1024 bytes), or NULL */
    bool probe;         /* record the pool and the device's counters at every step */
} run_spec;

enum { MAX_STEPS = 64 };
typedef struct {
    float *params; /* concatenated, on the host (caller frees) */
    int64_t n, param_bytes;
    double loss, val_loss, val_acc; /* NAN when not logged */
    sealed_stats before, after;
    /* probe: at the start of step k's training_step */
    uint64_t misses[MAX_STEPS];
    sealed_stats at[MAX_STEPS];
    int64_t steps_seen;
} run_out;

static char root[256];
static void setup(void);

/* The probe: the built-in module's training_step, after a look at the counters. */
static const lk_module_vtable *base_vt;
static run_out *probe_out;
static lk_tensor *probe_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    int64_t k = lk_trainer_global_step(tr);
    if (probe_out && k < MAX_STEPS) {
        probe_out->misses[k] = lk_pool_get_stats().misses;
        probe_out->at[k] = sealed_get_stats();
        probe_out->steps_seen = k + 1;
    }
    return base_vt->training_step(m, b, i, tr);
}

static double metric(lk_trainer *tr, const char *name) {
    double v = NAN;
    return lk_trainer_metric(tr, name, &v) ? v : NAN;
}

static run_out fit(run_spec s) {
    run_out o = {.loss = NAN, .val_loss = NAN, .val_acc = NAN};
    if (!root[0]) setup(); /* a case run alone */
    lk_trainer_config cfg;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.accelerator, sizeof cfg.accelerator, "%s", s.accelerator);
    snprintf(cfg.strategy, sizeof cfg.strategy, "single");
    snprintf(cfg.precision, sizeof cfg.precision, "%s", s.precision ? s.precision : "32-true");
    cfg.devices = 1;
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
    CHECK_OK(lk_module_create_builtin(s.model, cnn ? cnn_args : mlp_args, cnn ? 4 : 4, 3, &m));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", cnn ? cnn_data : mlp_data, 5, 3, &dm));
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    static lk_module_vtable probe_vt;
    if (m && s.probe) {
        base_vt = m->vt;
        probe_vt = *m->vt;
        probe_vt.training_step = probe_step;
        m->vt = &probe_vt;
        probe_out = &o;
    }
    if (m && dm && tr) {
        o.before = sealed_get_stats();
        CHECK_OK(lk_trainer_fit(tr, m, dm, s.resume));
        o.after = sealed_get_stats();
        if (s.last) snprintf(s.last, 1024, "%s", lk_trainer_last_checkpoint(tr));
        o.loss = metric(tr, "train_loss");
        o.val_loss = metric(tr, "val_loss");
        o.val_acc = metric(tr, "val_acc");
        CHECK(lk_device_equal(lk_device_default(), LK_DEVICE_CPU)); /* the run put the default back */
        lk_named_tensors ps = {0};
        CHECK_OK(lk_layer_named_parameters(m->net, &ps));
        for (int i = 0; i < ps.n; i++) o.n += ps.items[i].tensor->numel;
        o.param_bytes = o.n * (int64_t)sizeof(float);
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
    probe_out = NULL;
    if (m && s.probe) m->vt = base_vt;
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    return o;
}

static bool same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* Compares and frees both runs' parameters. */
static void same_bits(const char *what, run_out *a, run_out *b) {
    CHECK_MSG(a->params && b->params && a->n == b->n && a->n > 0, "%s: no parameters", what);
    if (a->params && b->params && a->n == b->n) {
        int64_t diff = 0;
        for (int64_t i = 0; i < a->n; i++) diff += memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0;
        CHECK_MSG(diff == 0, "%s: %lld of %lld parameters differ", what, (long long)diff, (long long)a->n);
    }
    CHECK_MSG(same_double(a->loss, b->loss) && !isnan(a->loss), "%s: train_loss %.9g vs %.9g", what, a->loss, b->loss);
    CHECK_MSG(same_double(a->val_loss, b->val_loss), "%s: val_loss %.9g vs %.9g", what, a->val_loss, b->val_loss);
    CHECK_MSG(same_double(a->val_acc, b->val_acc), "%s: val_acc %.9g vs %.9g", what, a->val_acc, b->val_acc);
    free(a->params);
    free(b->params);
    a->params = b->params = NULL;
}

/* 20 steps: an epoch of 16 batches, its validation, and 4 steps more. */
static void single_fit(const char *model, const char *precision) {
    run_out cpu = fit((run_spec){.model = model, .accelerator = "cpu", .precision = precision, .max_steps = 20});
    run_out sd = fit((run_spec){.model = model, .accelerator = "sealed", .precision = precision, .max_steps = 20});
    CHECK_MSG(sd.after.ops > sd.before.ops, "nothing ran on the sealed device");
    CHECK_MSG(cpu.after.ops == cpu.before.ops, "the cpu run used the sealed device");
    CHECK_MSG(!isnan(sd.val_loss) && !isnan(sd.val_acc), "no validation metrics");
    char what[64];
    snprintf(what, sizeof what, "%s %s", model, precision);
    same_bits(what, &cpu, &sd);
}

static void mlp_single(void) { single_fit("mlp", "32-true"); }
static void cnn_single(void) { single_fit("cnn", "32-true"); }
static void mlp_bf16_mixed(void) { single_fit("mlp", "bf16-mixed"); }
static void cnn_bf16_mixed(void) { single_fit("cnn", "bf16-mixed"); }

/* Stopped after 5 steps on one device, resumed on the other to 12: the bits
 * of 12 uninterrupted steps on the CPU. */
static void checkpoint_crosses_devices(void) {
    static const char *const order[2][2] = {{"sealed", "cpu"}, {"cpu", "sealed"}};
    for (int m = 0; m < 2; m++) {
        const char *model = m ? "cnn" : "mlp";
        run_out whole = fit((run_spec){.model = model, .accelerator = "cpu", .max_steps = 12});
        for (int k = 0; k < 2; k++) {
            char last[1024] = "";
            run_out first = fit((run_spec){.model = model, .accelerator = order[k][0], .max_steps = 5, .last = last});
            free(first.params);
            CHECK_MSG(last[0], "%s on %s wrote no last.ckpt", model, order[k][0]);
            if (!last[0]) continue;
            run_out rest = fit((run_spec){.model = model, .accelerator = order[k][1], .max_steps = 12, .resume = last});
            char what[96];
            snprintf(what, sizeof what, "%s: 5 steps on %s, resumed on %s", model, order[k][0], order[k][1]);
            run_out w = whole;
            w.params = malloc((size_t)whole.n * sizeof(float) + 1);
            memcpy(w.params, whole.params, (size_t)whole.n * sizeof(float));
            same_bits(what, &w, &rest);
        }
        free(whole.params);
    }
}

/* From the third step on the pool serves every storage (no device
 * allocation, no miss), and a step copies in the batch's two fields, the
 * dropout masks (drawn on the host) and two small scalar arrays, never the
 * parameters; it copies out scalars (the loss, the logged metric, the
 * loss's weight sum, the non-finite check, batch norm's counters) and the
 * labels cross-entropy range-checks on the host, never a parameter. */
static void steps_copy_the_batch_only(void) {
    for (int m = 0; m < 2; m++) {
        const char *model = m ? "cnn" : "mlp";
        run_out o = fit((run_spec){.model = model, .accelerator = "sealed", .max_steps = 8, .probe = true});
        CHECK_MSG(o.steps_seen == 8, "%s: %lld steps probed", model, (long long)o.steps_seen);
        int64_t batch = m ? 16 : 32, batch_bytes = batch * (m ? 64 : 16) * 4 + batch * 8; /* x f32, y i64 */
        int64_t masks = m ? 0 : batch * (32 + 16);                                     /* the mlp's two dropouts (u8) */
        long max_in = 2 + (m ? 0 : 2) + 2, max_out = m ? 7 : 5;
        for (int k = 3; k < o.steps_seen; k++) {
            sealed_stats a = o.at[k - 1], b = o.at[k];
            CHECK_MSG(o.misses[k] == o.misses[2], "%s step %d: %llu pool misses since step 2", model, k - 1,
                      (unsigned long long)(o.misses[k] - o.misses[2]));
            CHECK_MSG(b.allocs == a.allocs, "%s step %d: %ld device allocations", model, k - 1, b.allocs - a.allocs);
            long in = b.copies_in - a.copies_in, out = b.copies_out - a.copies_out;
            int64_t bin = (int64_t)(b.bytes_in - a.bytes_in), bout = (int64_t)(b.bytes_out - a.bytes_out);
            if (k == 3) printf("%s: a step copies %ld in (%lld bytes), %ld out (%lld bytes); %lld parameter bytes\n", model,
                               in, (long long)bin, out, (long long)bout, (long long)o.param_bytes);
            CHECK_MSG(in <= max_in && bin <= batch_bytes + masks + 128, "%s step %d: %ld copies in, %lld bytes (the batch is %lld)",
                      model, k - 1, in, (long long)bin, (long long)batch_bytes);
            CHECK_MSG(out <= max_out && bout <= batch * 8 + 160, "%s step %d: %ld copies out, %lld bytes", model, k - 1, out,
                      (long long)bout);
        }
        free(o.params);
    }
}

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
             LK_TEST_CASE(cnn_bf16_mixed), LK_TEST_CASE(checkpoint_crosses_devices), LK_TEST_CASE(steps_copy_the_batch_only),
             LK_TEST_CASE(cleanup))

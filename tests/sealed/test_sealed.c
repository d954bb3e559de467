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
#include "lockstep/strategy.h"
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
    const char *strategy; /* NULL: single */
    int devices;          /* 0: 1 */
    int64_t max_steps;
    const char *resume; /* a checkpoint to resume from, or NULL */
    char *last;         /* where the last checkpoint's path goes (1024 bytes), or NULL */
    bool probe;         /* record the pool and the device's counters at every step */
    double clip;        /* trainer.gradient_clip_val (0: none) */
    const char *overflow; /* LK_TEST_GRAD_OVERFLOW (an inf gradient at RANK:STEP), or NULL */
    bool test_after;    /* lk_trainer_test and lk_trainer_predict after the fit */
} run_spec;

enum { MAX_STEPS = 64 };
typedef struct {
    float *params; /* concatenated, on the host (caller frees) */
    int64_t n, param_bytes;
    double loss, val_loss, val_acc, test_loss, test_acc; /* NAN when not logged */
    float pred[4]; /* test_after: the first prediction row (4 logits) */
    sealed_stats before, after;
    /* probe: at the start of step k's training_step */
    uint64_t misses[MAX_STEPS];
    sealed_stats at[MAX_STEPS];
    int64_t steps_seen;
    sealed_peer_stats peer_before, peer_after; /* copies between sealed:0 and sealed:1 */
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
    run_out o = {.loss = NAN, .val_loss = NAN, .val_acc = NAN, .test_loss = NAN, .test_acc = NAN};
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
    cfg.gradient_clip_val = s.clip;
    if (s.overflow) setenv("LK_TEST_GRAD_OVERFLOW", s.overflow, 1);
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", root);
    bool cnn = !strcmp(s.model, "cnn");
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_module_create_builtin(s.model, cnn ? cnn_args : mlp_args, cnn ? 4 : 4, 3, &m));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", cnn ? cnn_data : mlp_data, 5, 3, &dm));
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    unsetenv("LK_TEST_GRAD_OVERFLOW");
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
        o.peer_before = sealed_get_peer_stats();
        CHECK_OK(lk_trainer_fit(tr, m, dm, s.resume));
        o.after = sealed_get_stats();
        o.peer_after = sealed_get_peer_stats();
        if (s.last) snprintf(s.last, 1024, "%s", lk_trainer_last_checkpoint(tr));
        o.loss = metric(tr, "train_loss");
        o.val_loss = metric(tr, "val_loss");
        o.val_acc = metric(tr, "val_acc");
        if (s.test_after) { /* the module stays on the device after fit; test and predict run there */
            CHECK_OK(lk_trainer_test(tr, m, dm, NULL));
            o.test_loss = metric(tr, "test_loss");
            o.test_acc = metric(tr, "test_acc");
            CHECK_OK(lk_trainer_predict(tr, m, dm, NULL));
            char path[2200];
            snprintf(path, sizeof path, "%s/predictions.npy", lk_trainer_log_dir(tr));
            FILE *f = fopen(path, "rb");
            char buf[4096];
            size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
            if (f) fclose(f);
            /* .npy: the header's length at byte 8, the data after it */
            size_t hl = got > 10 ? (size_t)(unsigned char)buf[8] | (size_t)(unsigned char)buf[9] << 8 : 0;
            CHECK_MSG(got >= 10 + hl + sizeof o.pred, "%s: no predictions", path);
            if (got >= 10 + hl + sizeof o.pred) memcpy(o.pred, buf + 10 + hl, sizeof o.pred);
        }
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
        /* moving the trained module back to the host is one call; it then reads directly */
        if (strcmp(s.accelerator, "cpu") && lk_trainer_rank(tr) == 0) {
            CHECK_OK(lk_layer_to(m->net, LK_DEVICE_CPU));
            k = 0;
            for (int i = 0; i < ps.n; i++) {
                lk_tensor *p = ps.items[i].tensor;
                CHECK(p->device.kind == LK_CPU && (!p->grad || p->grad->device.kind == LK_CPU));
                if (p->device.kind == LK_CPU)
                    CHECK_MSG(!memcmp(o.params + k, p->data, (size_t)p->numel * sizeof(float)), "%s moved back differs",
                              ps.items[i].name);
                k += p->numel;
            }
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
    CHECK_MSG(same_double(a->test_loss, b->test_loss) && same_double(a->test_acc, b->test_acc),
              "%s: test_loss %.9g vs %.9g, test_acc %.9g vs %.9g", what, a->test_loss, b->test_loss, a->test_acc, b->test_acc);
    CHECK_MSG(!memcmp(a->pred, b->pred, sizeof a->pred), "%s: predictions %g vs %g", what, a->pred[0], b->pred[0]);
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

/* dp with two sealed devices: replica k on sealed:k (its batch slice is
 * copied there), the gradients summed on sealed:0 through peer copies (no
 * host in between), the parameters copied back out the same way: the bits
 * of dp x2 on the CPU. */
static void dp_two_devices(void) {
    for (int m = 0; m < 2; m++) {
        const char *model = m ? "cnn" : "mlp";
        run_spec s = {.model = model, .strategy = "dp", .devices = 2, .max_steps = 20};
        s.accelerator = "cpu";
        run_out cpu = fit(s);
        s.accelerator = "sealed";
        run_out sd = fit(s);
        CHECK_MSG(sd.after.copies_in_to[1] > sd.before.copies_in_to[1] &&
                      sd.after.copies_in_to[0] > sd.before.copies_in_to[0],
                  "%s: replica 1 got no data on sealed:1 (%ld copies in) or replica 0 none on sealed:0 (%ld)", model,
                  sd.after.copies_in_to[1] - sd.before.copies_in_to[1], sd.after.copies_in_to[0] - sd.before.copies_in_to[0]);
        long peer = sd.peer_after.copies - sd.peer_before.copies;
        size_t out = sd.after.bytes_out - sd.before.bytes_out, in = sd.after.bytes_in - sd.before.bytes_in;
        printf("%s dp x2: %ld peer copies (%zu bytes), %ld copies out (%zu bytes), %ld in (%zu bytes), params %lld bytes\n", model, peer,
               sd.peer_after.bytes - sd.peer_before.bytes, sd.after.copies_out - sd.before.copies_out, out,
               sd.after.copies_in - sd.before.copies_in, in, (long long)sd.param_bytes);
        /* The replica sync is device to device: every step sends the
         * gradients to sealed:0 and the parameters back as peer copies, and
         * nothing of it crosses the host (staged, it would copy at least
         * 2 x the parameters' bytes out per step; what does leave is the
         * losses, metrics and checkpoints). */
        CHECK_MSG(peer >= 2 * s.max_steps, "%s: %ld peer copies in %lld steps (expected 2 per step at least)", model, peer,
                  (long long)s.max_steps);
        CHECK_MSG(out < (size_t)(s.max_steps * sd.param_bytes), "%s: %zu bytes copied to the host in %lld steps of %lld "
                  "bytes of parameters: the replica sync goes through the host", model, out, (long long)s.max_steps,
                  (long long)sd.param_bytes);
        char what[64];
        snprintf(what, sizeof what, "%s dp x2", model);
        same_bits(what, &cpu, &sd);
    }
}

/* fp16 loss scaling with an overflow at step 2 (the scaler's found-inf
 * count read back in one copy, the step skipped), gradient clipping by
 * norm (the norms read back in one copy), then test and predict on the
 * fitted module where it is. */
static void mlp_scaler_clipping_test_predict(void) {
    run_spec s = {.model = "mlp", .precision = "16-mixed", .max_steps = 20, .clip = 0.5, .overflow = "0:2",
                  .test_after = true};
    s.accelerator = "cpu";
    run_out cpu = fit(s);
    s.accelerator = "sealed";
    run_out sd = fit(s);
    CHECK_MSG(!isnan(sd.test_loss) && !isnan(sd.test_acc), "no test metrics");
    same_bits("mlp 16-mixed, clipped, overflow at step 2", &cpu, &sd);
}

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
 * allocation, no miss), and a step copies in the batch's two fields and
 * the dropout masks (drawn on the host), nothing else, never the
 * parameters; it copies out scalars (the loss, the non-finite check,
 * batch norm's counters), never a parameter (sealed_syncs holds the count
 * of those reads). */
static void steps_copy_the_batch_only(void) {
    for (int m = 0; m < 2; m++) {
        const char *model = m ? "cnn" : "mlp";
        run_out o = fit((run_spec){.model = model, .accelerator = "sealed", .max_steps = 8, .probe = true});
        CHECK_MSG(o.steps_seen == 8, "%s: %lld steps probed", model, (long long)o.steps_seen);
        int64_t batch = m ? 16 : 32, batch_bytes = batch * (m ? 64 : 16) * 4 + batch * 8; /* x f32, y i64 */
        int64_t masks = m ? 0 : batch * (32 + 16);                                     /* the mlp's two dropouts (u8) */
        long max_in = 2 + (m ? 0 : 2), max_out = m ? 7 : 5;
        for (int k = 3; k < o.steps_seen; k++) {
            sealed_stats a = o.at[k - 1], b = o.at[k];
            CHECK_MSG(o.misses[k] == o.misses[2], "%s step %d: %llu pool misses since step 2", model, k - 1,
                      (unsigned long long)(o.misses[k] - o.misses[2]));
            CHECK_MSG(b.allocs == a.allocs, "%s step %d: %ld device allocations", model, k - 1, b.allocs - a.allocs);
            long in = b.copies_in - a.copies_in, out = b.copies_out - a.copies_out;
            int64_t bin = (int64_t)(b.bytes_in - a.bytes_in), bout = (int64_t)(b.bytes_out - a.bytes_out);
            if (k == 3) printf("%s: a step copies %ld in (%lld bytes), %ld out (%lld bytes); %lld parameter bytes\n", model,
                               in, (long long)bin, out, (long long)bout, (long long)o.param_bytes);
            CHECK_MSG(in == max_in && bin == batch_bytes + masks, "%s step %d: %ld copies in, %lld bytes (the batch is %lld)",
                      model, k - 1, in, (long long)bin, (long long)batch_bytes);
            CHECK_MSG(out <= max_out && bout <= batch * 8 + 160, "%s step %d: %ld copies out, %lld bytes", model, k - 1, out,
                      (long long)bout);
        }
        free(o.params);
    }
}

/* What is not there yet is refused before anything starts, naming it; the
 * device index comes from trainer.devices. */
static void refusals(void) {
    if (!root[0]) setup();
    lk_trainer_config cfg;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.accelerator, sizeof cfg.accelerator, "sealed");
    cfg.devices = 3;
    CHECK_ERR(lk_trainer_create(&cfg, NULL, NULL, &tr), LK_STATUS_INVALID_ARGUMENT,
              "trainer.devices=3 asks for more GPUs than the 2 visible");
    snprintf(cfg.accelerator, sizeof cfg.accelerator, "tpu");
    cfg.devices = 1;
    CHECK_ERR(lk_trainer_create(&cfg, NULL, NULL, &tr), LK_STATUS_INVALID_ARGUMENT,
              "trainer.accelerator 'tpu' is not one of cpu, gpu, cuda, auto");
    /* a device without a backend of its own cannot be the default: ops could not run there */
    static const lk_device_vtable bare = {.name = "bare", .alloc = sealed_alloc, .free = sealed_free, .memset = sealed_memset,
                                          .copy_to_host = sealed_to_host, .copy_from_host = sealed_from_host, .copy = sealed_copy};
    lk_device_kind k;
    CHECK_OK(lk_device_register(&bare, NULL, &k));
    CHECK_ERR(lk_device_set_default((lk_device){k, 0}), LK_STATUS_UNSUPPORTED, "no backend is registered for its kind");
    CHECK_OK(lk_device_set_default(sealed_device(0))); /* the sealed device has one */
    CHECK_OK(lk_device_set_default(LK_DEVICE_CPU));
    CHECK(tr == NULL);
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
             LK_TEST_CASE(cnn_bf16_mixed), LK_TEST_CASE(mlp_scaler_clipping_test_predict),
             LK_TEST_CASE(dp_two_devices),
             LK_TEST_CASE(checkpoint_crosses_devices), LK_TEST_CASE(steps_copy_the_batch_only), LK_TEST_CASE(refusals),
             LK_TEST_CASE(cleanup))

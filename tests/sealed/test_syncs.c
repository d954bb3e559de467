/* How often a training step waits for the device: every device->host copy
 * inside a step is a synchronisation on a GPU (the host stops until the
 * queue drains), so this counts the sealed device's copies out
 * (tests/sealed_device.h) per steady-state step (steps 3 to 7) for the
 * models and precisions issue 21 is about, prints them as a table (the one
 * in docs/GPU.md) and holds each at the bound reached, so a new read in the
 * step is a failure here. Nothing is read between forward and backward
 * (an op hook notes the copies out at the first backward op), and the
 * autoencoder's forward reads nothing at all. */
#include "sealed_harness.h"

static const lk_model_kv flat_data[] = {{"num_samples", "640"}, {"input_shape", "[16]"}, {"num_classes", "4"},
                                        {"batch_size", "32"}, {"num_workers", "0"}};

enum { STEPS = 8, FIRST = 3 };
typedef struct {
    const char *name, *model, *precision;
    double clip;
    long bound; /* copies out per step, at most */
    long fwd;   /* of which in forward (training_step), at most */
    long before; /* what a step read before this work (for the table) */
} config;

static int64_t seen;
/* per step: copies out when forward returned and when the first backward op ended */
static long out_fwd_end[STEPS + 1], out_bwd_first[STEPS + 1];
static bool in_bwd;
static void on_op(void *ctx, const char *op, bool backward, double t0, double t1) {
    (void)ctx, (void)op, (void)t0, (void)t1;
    if (!backward || in_bwd || seen < 1 || seen > STEPS + 1) return;
    in_bwd = true;
    out_bwd_first[seen - 1] = sealed_get_stats().copies_out;
}
/* Around the probed training_step (the harness has recorded the counters at its start). */
static void around_step(run_out *o, int64_t k, bool after) {
    if (after) {
        if (k <= STEPS) out_fwd_end[k] = sealed_get_stats().copies_out;
        return;
    }
    seen = o->steps_seen;
    in_bwd = false;
    lk_set_op_hook(on_op, NULL);
}

/* Fits STEPS + 1 steps on sealed:0; o.at[k] holds the counters at the start of step k. */
static run_out fit(const config *c) {
    seen = 0;
    run_out o = sh_fit((run_spec){.model = c->model, .accelerator = "sealed", .precision = c->precision, .clip = c->clip,
                                  .max_steps = STEPS + 1, .no_checkpointing = true, .probe = true,
                                  .step_hook = around_step});
    lk_set_op_hook(NULL, NULL);
    free(o.params);
    return o;
}

static void copies_out_per_step(void) {
    /* before: what each step read when this test was written (docs/GPU.md's table) */
    static const config cs[] = {
        /* the loss, the gradients' checks (and the scaler's found-inf) in one read */
        {"mlp f32", "mlp", "32-true", 0, 1, 0, 5},
        {"cnn f32", "cnn", "32-true", 0, 3, 2, 7}, /* forward: batch norm's two */
        {"mlp bf16-mixed", "mlp", "bf16-mixed", 0, 1, 0, 5},
        {"mlp 16-mixed, clipped", "mlp", "16-mixed", 0.5, 1, 0, 6}, /* clipping reads nothing */
        {"autoencoder (mse)", "autoencoder", "32-true", 0, 1, 0, 3},
    };
    printf("| run | copies out per step (before) | now | bytes out per step |\n|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const config *c = &cs[i];
        run_out o = fit(c);
        const sealed_stats *at = o.at;
        seen = o.steps_seen;
        CHECK_MSG(seen == STEPS + 1, "%s: %lld steps probed", c->name, (long long)seen);
        if (seen != STEPS + 1) continue;
        long most = 0;
        size_t bytes = 0;
        for (int k = FIRST; k < STEPS; k++) {
            long out = at[k + 1].copies_out - at[k].copies_out;
            if (out > most) most = out, bytes = at[k + 1].bytes_out - at[k].bytes_out;
        }
        printf("| %s | %ld | %ld | %zu |\n", c->name, c->before, most, bytes);
        for (int k = FIRST; k < STEPS; k++) {
            /* nothing read between forward and backward: the host queues
             * backward right behind forward (the loss is read after it) */
            CHECK_MSG(out_bwd_first[k] == out_fwd_end[k], "%s step %d: %ld copies out between forward and backward",
                      c->name, k, out_bwd_first[k] - out_fwd_end[k]);
            /* train_loss is logged from the one read after backward, and
             * cross-entropy reads neither the targets (their host copy) nor
             * its total weight (counted there) */
            CHECK_MSG(out_fwd_end[k] - at[k].copies_out <= c->fwd, "%s step %d: forward copies %ld out (at most %ld)",
                      c->name, k, out_fwd_end[k] - at[k].copies_out, c->fwd);
        }
        CHECK_MSG(most <= c->bound, "%s: %ld copies out in a steady step (at most %ld expected)", c->name, most, c->bound);
    }
}

/* A target out of range on the sealed device is still the range check's
 * error, found in the batch's host copy: the model has 3 classes, the
 * data 4. */
static void target_out_of_range(void) {
    lk_trainer_config cfg;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.accelerator, sizeof cfg.accelerator, "sealed");
    cfg.max_steps = 4;
    cfg.enable_checkpointing = cfg.enable_progress_bar = cfg.enable_tensorboard = cfg.enable_model_summary = false;
    cfg.num_sanity_val_steps = 0;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", sh_root);
    static const lk_model_kv three[] = {{"input_dim", "16"}, {"hidden", "[8]"}, {"num_classes", "3"}};
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_module_create_builtin("mlp", three, 3, 3, &m));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", flat_data, 5, 3, &dm));
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    sealed_stats before = sealed_get_stats();
    if (m && dm && tr) CHECK_ERR(lk_trainer_fit(tr, m, dm, NULL), LK_STATUS_INVALID_ARGUMENT, "= 3 is out of range for 3 classes");
    sealed_stats after = sealed_get_stats();
    CHECK_MSG(after.ops > before.ops, "nothing ran on the sealed device");
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
}

/* The checks read with the loss keep their messages and their promise: a
 * non-finite gradient (an inf written into the first parameter's gradient
 * at step 3, LK_TEST_GRAD_OVERFLOW) or a NaN loss at step 3
 * (LK_TEST_LOSS_NAN) ends the fit on the sealed device with the CPU's
 * message (parameter, element, value, loss: the same bits) and before the
 * optimizer touched a parameter at step 3: the parameters are those of a
 * fit of 3 steps. */
static void checks_after_the_read(void) {
    run_spec three = {.model = "mlp", .accelerator = "sealed", .max_steps = 3, .no_checkpointing = true};
    run_out ref = sh_fit(three);
    for (int kind = 0; kind < 2; kind++) {
        const char *want = kind ? "the loss is nan at step 3 (epoch 0, batch 3)"
                                : "non-finite gradient at step 3 (epoch 0, batch 3): parameter '";
        run_out o[2];
        for (int k = 0; k < 2; k++) {
            if (kind) setenv("LK_TEST_LOSS_NAN", "0:3", 1);
            o[k] = sh_fit((run_spec){.model = "mlp", .accelerator = k ? "sealed" : "cpu", .max_steps = 8,
                                     .no_checkpointing = true, .overflow = kind ? NULL : "0:3",
                                     .expect = LK_STATUS_ABORTED});
            unsetenv("LK_TEST_LOSS_NAN");
            CHECK_MSG(strstr(o[k].err, want), "%s: '%s' (expected '%s')", k ? "sealed" : "cpu", o[k].err, want);
        }
        CHECK_MSG(!strcmp(o[0].err, o[1].err), "cpu: '%s', sealed: '%s'", o[0].err, o[1].err);
        if (!kind) CHECK_MSG(strstr(o[1].err, "element 0 is inf (loss "), "%s", o[1].err);
        CHECK_MSG(o[1].params && ref.params && o[1].n == ref.n &&
                      !memcmp(o[1].params, ref.params, (size_t)ref.n * sizeof(float)),
                  "%s: the parameters after the failed step 3 are not those after 3 steps", want);
        free(o[0].params);
        free(o[1].params);
    }
    free(ref.params);
}

static void setup(void) {
    sh_root_init("syncs");
    sealed_device(0);
}

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(copies_out_per_step), LK_TEST_CASE(target_out_of_range),
             LK_TEST_CASE(checks_after_the_read), LK_TEST_CASE(cleanup))

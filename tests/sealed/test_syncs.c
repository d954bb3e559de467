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
/* per step: copies in when forward returned (dropout's masks are drawn on
 * the device: a forward copies nothing in, the batch came before it) */
static long in_fwd_end[STEPS + 1];
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
        if (k <= STEPS) in_fwd_end[k] = sealed_get_stats().copies_in;
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
        {"cnn f32", "cnn", "32-true", 0, 1, 0, 7}, /* batch norm's counters: counted on the device, not read */
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
        for (int k = FIRST; k < STEPS; k++) /* on a GPU a synchronous copy in waits for the queue too */
            CHECK_MSG(in_fwd_end[k] == at[k].copies_in, "%s step %d: forward copies %ld in (the dropout masks need none)",
                      c->name, k, in_fwd_end[k] - at[k].copies_in);
    }
}

/* ---- dp: the same one read per step, on device 0 ---------------------------------
 * dp x2 on sealed:0 and sealed:1: each replica's loss reaches device 0's
 * step status by a peer copy, and the step's one read there brings back
 * every replica's loss with the gradients' checks; sealed:1 is never read
 * in a step. Before, each device had 3: dp's read of the replica's loss,
 * train_loss read in training_step (replica 1's for its scratch trainer,
 * discarded) and, on sealed:0, the checks' read, on sealed:1 cross-entropy
 * reading the targets (no host copy known on the replica's thread). */
static void dp_copies_out_per_step(void) {
    static const struct {
        const char *name, *model, *precision;
        double clip;
        double before[2]; /* copies out per step from sealed:0, sealed:1 before this work */
    } cs[] = {
        {"dp x2 mlp f32", "mlp", "32-true", 0, {3, 3}},
        {"dp x2 cnn f32", "cnn", "32-true", 0, {3, 3}},
        {"dp x2 mlp bf16-mixed", "mlp", "bf16-mixed", 0, {3, 3}},
        {"dp x2 mlp 16-mixed, clipped", "mlp", "16-mixed", 0.5, {3, 3}},
    };
    printf("| dp run | copies out per step, sealed:0 (before) | now | sealed:1 (before) | now |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        seen = 0;
        run_out o = sh_fit((run_spec){.model = cs[i].model, .accelerator = "sealed", .precision = cs[i].precision,
                                      .clip = cs[i].clip, .strategy = "dp", .devices = 2, .max_steps = STEPS + 1,
                                      .no_checkpointing = true, .probe = true, .step_hook = around_step});
        lk_set_op_hook(NULL, NULL);
        free(o.params);
        CHECK_MSG(o.steps_seen == STEPS + 1, "%s: %lld steps probed", cs[i].name, (long long)o.steps_seen);
        if (o.steps_seen != STEPS + 1) continue;
        /* per step over the steady steps: replica 1's thread runs beside
         * replica 0's, so its reads of step k + 1 may come before step k + 1's
         * mark; the sum over the steps is exact */
        double per[2];
        for (int dev = 0; dev < 2; dev++)
            per[dev] = (double)(o.at[STEPS].copies_out_from[dev] - o.at[FIRST].copies_out_from[dev]) / (STEPS - FIRST);
        printf("| %s | %g | %g | %g | %g |\n", cs[i].name, cs[i].before[0], per[0], cs[i].before[1], per[1]);
        CHECK_MSG(per[0] == 1 && per[1] == 0, "%s: %g copies out of sealed:0 and %g of sealed:1 per steady step "
                  "(expected the one read, on sealed:0)", cs[i].name, per[0], per[1]);
        for (int k = FIRST; k < STEPS; k++) { /* replica 0's forward and backward, on the calling thread */
            CHECK_MSG(out_bwd_first[k] == out_fwd_end[k], "%s step %d: %ld copies out between forward and backward",
                      cs[i].name, k, out_bwd_first[k] - out_fwd_end[k]);
            CHECK_MSG(out_fwd_end[k] == o.at[k].copies_out, "%s step %d: forward copies %ld out", cs[i].name, k,
                      out_fwd_end[k] - o.at[k].copies_out);
        }
    }
}

/* A NaN loss in replica 1 only (its training_step's loss times NaN at
 * batch 3): the fit stops at step 3 with the message the CPU's dp gives
 * ("the loss is nan at step 3"), read with the gradients' checks in the
 * step's one read on sealed:0 (sealed:1 is not read), and before the
 * optimizer touched a parameter: the parameters are those of 3 steps. */
static const lk_module_vtable *nan_base_vt;
static lk_module_vtable nan_vt;
static lk_tensor *nan_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    lk_tensor *loss = nan_base_vt->training_step(m, b, i, tr);
    if (loss && tr != sh_fit_tr && i == 3) loss = lk_mul_scalar(loss, NAN); /* replica 1's scratch trainer */
    return loss;
}
static lk_status nan_replicate(lk_module *m, lk_module **out) {
    LK_TRY(nan_base_vt->replicate(m, out));
    (*out)->vt = &nan_vt;
    return LK_STATUS_OK;
}
static void nan_module(lk_module *m) {
    nan_base_vt = m->vt;
    nan_vt = *m->vt;
    nan_vt.training_step = nan_step;
    nan_vt.replicate = nan_replicate;
    m->vt = &nan_vt;
}
static sealed_stats nan_at3; /* the counters at step 3's start (replica 0's training_step) */
static void nan_around(run_out *o, int64_t k, bool after) {
    if (!after && k == 3) nan_at3 = o->at[3];
}
/* A dp fit over two devices that fails at step 3 (`fail` sets how), on
 * the CPU and on sealed devices: the message holds `want` (and `also`)
 * and is the CPU's, the parameters are those of a 3-step fit, and the
 * failed step copied `reads0` times out of sealed:0 and never out of
 * sealed:1. */
static void dp_fails_at_3(void (*fail)(run_spec *s), const char *want, const char *also, long reads0) {
    run_spec base = {.model = "mlp", .strategy = "dp", .devices = 2, .no_checkpointing = true};
    run_spec three = base;
    three.accelerator = "sealed", three.max_steps = 3;
    run_out ref = sh_fit(three);
    run_out o[2];
    for (int k = 0; k < 2; k++) {
        run_spec s = base;
        s.accelerator = k ? "sealed" : "cpu";
        s.max_steps = 8, s.expect = LK_STATUS_ABORTED;
        s.probe = true, s.step_hook = nan_around;
        fail(&s);
        o[k] = sh_fit(s);
        CHECK_MSG(strstr(o[k].err, want) && (!also || strstr(o[k].err, also)), "%s: '%s' (expected '%s')",
                  s.accelerator, o[k].err, want);
    }
    CHECK_MSG(!strcmp(o[0].err, o[1].err), "cpu: '%s', sealed: '%s'", o[0].err, o[1].err);
    CHECK_MSG(o[1].params && ref.params && o[1].n == ref.n && !memcmp(o[1].params, ref.params, (size_t)ref.n * sizeof(float)),
              "dp: the parameters after the failed step 3 are not those after 3 steps");
    long out0 = o[1].after.copies_out_from[0] - nan_at3.copies_out_from[0];
    long out1 = o[1].after.copies_out_from[1] - nan_at3.copies_out_from[1];
    CHECK_MSG(out0 == reads0 && out1 == 0, "dp: the failed step copied %ld out of sealed:0 and %ld out of sealed:1 "
              "(expected %ld, on sealed:0)", out0, out1, reads0);
    free(o[0].params);
    free(o[1].params);
    free(ref.params);
}

static void nan_in_replica_1(run_spec *s) { s->module_hook = nan_module; }
/* the one read, on sealed:0 */
static void dp_nan_in_one_replica(void) {
    dp_fails_at_3(nan_in_replica_1, "the loss is nan at step 3 (epoch 0, batch 3)", NULL, 1);
}

/* ---- validation and test: nothing read per batch ------------------------------
 * The built-in modules log val_loss / test_loss and (classifiers) val_acc /
 * test_acc per batch; on a device the values stay there (the loss copied
 * into a device slot, the accuracy's hit count by LK_OP_ACCURACY) and the
 * loop's end reads every slot in one copy. Counted: copies out inside each
 * validation/test step, and from the last step's end to the loop's
 * return; the metrics are the CPU's bit for bit. */
enum { EVAL_SAMPLES = 64, MAX_EVAL_STEPS = EVAL_SAMPLES + 2 }; /* per split (640 samples, 10% each) */
static const lk_module_vtable *eval_base_vt;
static int eval_calls;
static long eval_out[MAX_EVAL_STEPS]; /* copies out inside step k of the current loop */
static sealed_stats eval_last_end;          /* at the end of the latest step */
static lk_status eval_probe(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr, bool test) {
    long o0 = sealed_get_stats().copies_out;
    lk_status st = test ? eval_base_vt->test_step(m, b, i, tr) : eval_base_vt->validation_step(m, b, i, tr);
    eval_last_end = sealed_get_stats();
    if (eval_calls < MAX_EVAL_STEPS) eval_out[eval_calls] = eval_last_end.copies_out - o0;
    eval_calls++;
    return st;
}
static lk_status eval_probe_val(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) { return eval_probe(m, b, i, tr, false); }
static lk_status eval_probe_test(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) { return eval_probe(m, b, i, tr, true); }

typedef struct {
    double val_loss, val_acc, test_loss, test_acc, val_loss2, val_acc2;
    long end_reads[3]; /* copies out after validate's / test's / validate's again last step */
    long steps_out[3]; /* the most copies out in one step after the first (batch 0: the autoencoder's preview) */
    long first_out[3]; /* in step 0 */
    long allocs_again; /* device allocations of the second validate */
} eval_out_t;

/* validate, test, and validate again, of a freshly made module (seed 3) on
 * `accel`: EVAL_SAMPLES / batch batches in each split. */
static eval_out_t eval_run(const char *model, const char *accel, const char *precision, int batch, bool dp) {
    eval_out_t r = {NAN, NAN, NAN, NAN, NAN, NAN, {0}, {0}, {0}, 0};
    char bs[16];
    snprintf(bs, sizeof bs, "%d", batch);
    bool cnn = !strcmp(model, "cnn"), ae = !strcmp(model, "autoencoder");
    const lk_model_kv data[] = {{"num_samples", "640"}, {"input_shape", cnn ? "[1, 8, 8]" : "[16]"}, {"num_classes", "4"},
                                {"batch_size", bs}, {"num_workers", "0"}};
    lk_trainer_config cfg;
    sh_config(&cfg, &(run_spec){.model = model, .accelerator = accel, .precision = precision, .no_checkpointing = true,
                                .strategy = dp ? "dp" : NULL, .devices = dp ? 2 : 0});
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_module_create_builtin(model, cnn ? sh_cnn_args : ae ? sh_ae_args : sh_mlp_args, ae ? 3 : 4, 3, &m));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data, 5, 3, &dm));
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    if (!m || !dm || !tr) goto done;
    static lk_module_vtable vt;
    eval_base_vt = m->vt;
    vt = *m->vt;
    vt.validation_step = eval_probe_val;
    vt.test_step = eval_probe_test;
    m->vt = &vt;
    for (int pass = 0; pass < 3; pass++) {
        eval_calls = 0;
        long a0 = sealed_get_stats().allocs;
        lk_status st = pass == 1 ? lk_trainer_test(tr, m, dm, NULL) : lk_trainer_validate(tr, m, dm, NULL);
        CHECK_MSG(st == LK_STATUS_OK, "%s %s on %s: %s", pass == 1 ? "test" : "validate", model, accel, st ? lk_last_error() : "");
        CHECK_MSG(eval_calls == EVAL_SAMPLES / batch, "%s on %s: %d eval steps, expected %d", model, accel, eval_calls,
                  EVAL_SAMPLES / batch);
        r.end_reads[pass] = sealed_get_stats().copies_out - eval_last_end.copies_out;
        r.first_out[pass] = eval_out[0];
        for (int k = 1; k < eval_calls && k < MAX_EVAL_STEPS; k++)
            if (eval_out[k] > r.steps_out[pass]) r.steps_out[pass] = eval_out[k];
        if (pass == 0) r.val_loss = metric(tr, "val_loss"), r.val_acc = ae ? NAN : metric(tr, "val_acc");
        if (pass == 2) r.val_loss2 = metric(tr, "val_loss"), r.val_acc2 = ae ? NAN : metric(tr, "val_acc");
        if (pass == 2) r.allocs_again = sealed_get_stats().allocs - a0;
    }
    r.test_loss = metric(tr, "test_loss");
    if (!ae) r.test_acc = metric(tr, "test_acc");
    m->vt = eval_base_vt;
done:
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    return r;
}

static void copies_out_per_eval_batch(void) {
    static const struct {
        const char *model, *precision;
        long bound; /* copies out per validation/test step */
        int batch;  /* 1: 64 batches, two values each: the device's slots double once (64 -> 128) */
        bool dp;    /* dp over two devices: evaluation runs on device 0, its values wait there (read per batch before) */
    } cs[] = {
        {"mlp", "32-true", 0, 8, false}, {"cnn", "32-true", 0, 8, false}, {"mlp", "bf16-mixed", 0, 8, false},
        {"autoencoder", "32-true", 0, 8, false}, {"mlp", "32-true", 0, 1, false}, {"mlp", "32-true", 0, 8, true},
    };
    printf("| eval run | copies out per batch | in batch 0 | at the loop's end |\n|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const char *model = cs[i].model, *prec = cs[i].precision;
        bool ae = !strcmp(model, "autoencoder");
        eval_out_t cpu = eval_run(model, "cpu", prec, cs[i].batch, cs[i].dp);
        eval_out_t sd = eval_run(model, "sealed", prec, cs[i].batch, cs[i].dp);
        /* the second validate: the same values, and nothing new allocated on the device (the slots stay) */
        CHECK_MSG(same_double(sd.val_loss, sd.val_loss2) && same_double(sd.val_acc, sd.val_acc2),
                  "%s %s: a second validate gave other values", model, prec);
        CHECK_MSG(sd.allocs_again == 0, "%s %s batch %d: the second validate allocated %ld times on the device", model,
                  prec, cs[i].batch, sd.allocs_again);
        for (int pass = 0; pass < 3; pass++) {
            const char *what = pass == 1 ? "test" : pass ? "validate again" : "validate";
            printf("| %s%s %s %s, batch %d | %ld | %ld | %ld |\n", cs[i].dp ? "dp x2 " : "", model, prec, what, cs[i].batch,
                   sd.steps_out[pass], sd.first_out[pass], sd.end_reads[pass]);
            CHECK_MSG(sd.steps_out[pass] <= cs[i].bound, "%s %s %s: %ld copies out in one step (at most %ld)", model, prec,
                      what, sd.steps_out[pass], cs[i].bound);
            /* batch 0: the autoencoder copies its first reconstructions out for the picture */
            CHECK_MSG(sd.first_out[pass] <= cs[i].bound + ae, "%s %s %s: %ld copies out in step 0", model, prec, what,
                      sd.first_out[pass]);
            CHECK_MSG(sd.end_reads[pass] == 1, "%s %s %s: %ld copies out at the loop's end (expected the one read)", model,
                      prec, what, sd.end_reads[pass]);
        }
        CHECK_MSG(!isnan(sd.val_loss) && !isnan(sd.test_loss) && (ae || (!isnan(sd.val_acc) && !isnan(sd.test_acc))),
                  "%s: no eval metrics", model);
        CHECK_MSG(same_double(cpu.val_loss, sd.val_loss) && same_double(cpu.val_acc, sd.val_acc),
                  "%s %s: val_loss %.17g vs %.17g, val_acc %.17g vs %.17g", model, prec, cpu.val_loss, sd.val_loss,
                  cpu.val_acc, sd.val_acc);
        CHECK_MSG(same_double(cpu.test_loss, sd.test_loss) && same_double(cpu.test_acc, sd.test_acc),
                  "%s %s: test_loss %.17g vs %.17g, test_acc %.17g vs %.17g", model, prec, cpu.test_loss, sd.test_loss,
                  cpu.test_acc, sd.test_acc);
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

/* Batch norm's num_batches_tracked on the sealed device: a training
 * forward counts it with an op there and reads nothing back (momentum
 * 0.1); momentum=None reads the count once per forward (its factor
 * 1/count). Either way the count and the running statistics are the CPU's
 * bit for bit, and a forward that fails after counting (a SyncBatchNorm
 * whose all-reduce fails) takes its count back. */
static bool bits_equal(const lk_tensor *a, const lk_tensor *b) {
    lk_tensor *ha = lk_tensor_to(a, LK_DEVICE_CPU), *hb = lk_tensor_to(b, LK_DEVICE_CPU);
    bool same = ha && hb && ha->numel == hb->numel && ha->dtype == hb->dtype &&
                !memcmp(ha->data, hb->data, (size_t)ha->numel * lk_dtype_size(ha->dtype));
    lk_tensor_release(ha);
    lk_tensor_release(hb);
    return same;
}
static lk_status failing_sum(void *ctx, double *vals, int n) {
    (void)ctx, (void)vals, (void)n;
    return lk_error(LK_STATUS_REMOTE, "test all-reduce: peer gone");
}
static void batch_norm_counter(void) {
    lk_device dev = sealed_device(0);
    for (int cum = 0; cum < 2; cum++) {
        float momentum = cum ? -1.0f : 0.1f;
        lk_layer *cpu = lk_batch_norm1d_create(4, 1e-5f, momentum, true, true);
        lk_layer *sd = lk_batch_norm1d_create(4, 1e-5f, momentum, true, true);
        CHECK(cpu && sd);
        if (!cpu || !sd) return;
        CHECK_OK(lk_layer_to(sd, dev));
        lk_scope_begin();
        lk_rng r;
        lk_rng_init(&r, 17, LK_RNG_DATA, 0, 0);
        for (int k = 0; k < 3; k++) {
            lk_tensor *x = lk_tensor_randn(&r, 2, (int64_t[]){6, 4}, 0.5f, 2.0f), *xd = lk_tensor_to(x, dev);
            CHECK(lk_layer_forward(cpu, x) != NULL);
            sealed_stats a = sealed_get_stats();
            CHECK_OK(lk_device_set_thread_default(&dev)); /* the op's results on the sealed device */
            CHECK_MSG(lk_layer_forward(sd, xd) != NULL, "sealed forward: %s", lk_last_error());
            long out = sealed_get_stats().copies_out - a.copies_out;
            CHECK_OK(lk_device_set_thread_default(NULL));
            CHECK_MSG(out == cum, "momentum %g, forward %d: %ld copies out (%d expected)", (double)momentum, k, out, cum);
            lk_tensor_release(x);
            lk_tensor_release(xd);
        }
        /* a SyncBatchNorm whose all-reduce fails: after the count */
        lk_tensor *x = lk_tensor_randn(&r, 2, (int64_t[]){6, 4}, 0.5f, 2.0f), *xd = lk_tensor_to(x, dev);
        CHECK(lk_layer_sync_batchnorm(sd, failing_sum, NULL) == 1);
        CHECK_OK(lk_device_set_thread_default(&dev));
        CHECK_ERR(lk_layer_forward(sd, xd) ? LK_STATUS_OK : lk_last_status(), LK_STATUS_REMOTE, "peer gone");
        CHECK_OK(lk_device_set_thread_default(NULL));
        lk_tensor_release(x);
        lk_tensor_release(xd);
        lk_scope_end();
        static const char *const bufs[] = {"num_batches_tracked", "running_mean", "running_var"};
        for (int i = 0; i < 3; i++)
            CHECK_MSG(bits_equal(lk_layer_get_tensor(cpu, bufs[i]), lk_layer_get_tensor(sd, bufs[i])),
                      "momentum %g: %s differs from the CPU's", (double)momentum, bufs[i]);
        lk_tensor *n = lk_tensor_to(lk_layer_get_tensor(sd, "num_batches_tracked"), LK_DEVICE_CPU);
        CHECK_MSG(n && *(int64_t *)n->data == 3, "num_batches_tracked %lld after 3 forwards and a failed one",
                  n ? (long long)*(int64_t *)n->data : -1LL);
        lk_tensor_release(n);
        lk_layer_free(cpu);
        lk_layer_free(sd);
    }
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

/* An inf in the first gradient after dp's combination at step 3
 * (LK_TEST_GRAD_OVERFLOW): the CPU's message, whose "(loss ...)" is the
 * replicas' weighted mean read with the checks, the parameters of a
 * 3-step fit, and no read of sealed:1 in the failed step (sealed:0: the
 * one read and the element the message quotes). */
static void inf_gradient_at_3(run_spec *s) { s->overflow = "0:3"; }
/* the one read and the element the message quotes, on sealed:0 */
static void dp_nonfinite_gradient(void) {
    dp_fails_at_3(inf_gradient_at_3, "non-finite gradient at step 3 (epoch 0, batch 3): parameter '", "is inf (loss ", 2);
}

static void setup(void) {
    sh_root_init("syncs");
    sealed_device(0);
}

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(copies_out_per_step), LK_TEST_CASE(target_out_of_range),
             LK_TEST_CASE(copies_out_per_eval_batch), LK_TEST_CASE(batch_norm_counter), LK_TEST_CASE(checks_after_the_read),
             LK_TEST_CASE(dp_copies_out_per_step), LK_TEST_CASE(dp_nan_in_one_replica),
             LK_TEST_CASE(dp_nonfinite_gradient),
             LK_TEST_CASE(cleanup))

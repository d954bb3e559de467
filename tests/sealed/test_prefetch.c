/* The batch prefetch onto a device the CPU cannot read (src/train/
 * prefetch.c), on the tests' sealed_async device (tests/sealed_device.h),
 * whose copy stream defers every copy until an event after it is waited
 * for: a missing wait, or the loader's host memory reused before its copy
 * ran, gives wrong bits here. The mlp and the cnn fit, validate, test and
 * predict with the CPU's bits;
 * a step makes no synchronous batch copy and the asynchronous copies are
 * exactly (fields x batches taken); a mid-epoch resume, limit_train_batches,
 * a short last batch and gradient accumulation keep the CPU's bits; a
 * loader error on batch i + 1 (taken during step i) fails the fit at step
 * i + 1 with its message, as on the CPU. The device calls' fallbacks (cpu,
 * sealed without streams) are synchronous. */
#include <stdatomic.h>
#include <unistd.h>

#include "lk_test.h"
#include "lockstep/trainer.h"
#include "sealed_device.h"

static const lk_model_kv mlp_args[] = {{"input_dim", "16"}, {"hidden", "[32, 16]"}, {"num_classes", "4"}, {"dropout", "0.25"}};
static const lk_model_kv cnn_args[] = {{"image_size", "8"}, {"channels", "[4, 6]"}, {"hidden", "10"}, {"num_classes", "4"}};

typedef struct {
    const char *model, *accelerator;
    int64_t max_steps, max_epochs; /* max_epochs 0: 5 */
    const char *num_samples;       /* NULL: 640 (mlp, 20 batches of 32) or 320 (cnn, 20 of 16) */
    lk_count_or_fraction limit;    /* limit_train_batches; value 0: all */
    int64_t accum;                 /* accumulate_grad_batches (0: 1) */
    const char *resume;
    char *last;       /* last.ckpt's path goes here (1024 bytes), or NULL */
    int64_t fail_at;  /* > 0: the training set's get() fails at this call (0-based) */
    lk_status expect; /* the fit's status */
    bool test_after;  /* lk_trainer_test and lk_trainer_predict after the fit */
    const char *workers; /* data.num_workers (NULL: "0") */
} run_spec;

enum { MAX_STEPS = 64 };
typedef struct {
    float *params;
    int64_t n;
    double loss, val_loss, test_loss;
    float pred[4]; /* test_after: the first prediction row */
    long test_async; /* test_after: async copies made by test and predict */
    int64_t steps_seen; /* training_step calls */
    sealed_stats at[MAX_STEPS], before, after;
    sealed_async_counts aat[MAX_STEPS], abefore, aafter;
    uint64_t misses[MAX_STEPS]; /* the tensor pool's, at the start of every training_step */
    char err[1024];
} run_out;

static char root[256];
static void setup(void);

/* ---- the probe: counters at the start of every training_step ---- */
static const lk_module_vtable *base_vt;
static run_out *probe_out;
static lk_tensor *probe_step(lk_module *m, const lk_batch *b, int64_t i, lk_trainer *tr) {
    int64_t k = probe_out->steps_seen++;
    if (k < MAX_STEPS) {
        probe_out->at[k] = sealed_get_stats(), probe_out->aat[k] = sealed_async_get_stats();
        probe_out->misses[k] = lk_pool_get_stats().misses;
    }
    return base_vt->training_step(m, b, i, tr);
}

/* ---- a training set whose get() fails at the Nth call ---- */
typedef struct {
    lk_dataset *inner;
    int64_t fail_at;
    atomic_llong calls;
} failing;
static lk_status failing_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    (void)scratch;
    failing *f = ctx;
    if (atomic_fetch_add(&f->calls, 1) == f->fail_at)
        return lk_error(LK_STATUS_IO, "test: sample %lld cannot be read", (long long)index);
    return lk_dataset_get(f->inner, index, epoch, out);
}
static void failing_free(void *ctx) {
    failing *f = ctx;
    lk_dataset_free(f->inner);
    free(f);
}
static const lk_dataset_vtable failing_vt = {.kind = "failing", .get = failing_get, .free = failing_free};
static const lk_datamodule_vtable *base_dm_vt;
static lk_dataset *failing_train;
static int64_t fail_at;
static lk_dataset *failing_dataset(lk_datamodule *dm, const char *split) {
    lk_dataset *ds = base_dm_vt->dataset(dm, split);
    if (strcmp(split, "train") || !ds) return ds;
    if (!failing_train) {
        failing *f = calloc(1, sizeof *f);
        f->inner = lk_dataset_retain(ds);
        f->fail_at = fail_at;
        int nf = lk_dataset_nfields(ds);
        lk_field fields[LK_DATA_MAX_FIELDS];
        for (int i = 0; i < nf; i++) fields[i] = *lk_dataset_field(ds, i);
        CHECK_OK(lk_dataset_create(&failing_vt, f, lk_dataset_len(ds), nf, fields, 0, &failing_train));
    }
    return failing_train;
}

static double metric(lk_trainer *tr, const char *name) {
    double v = NAN;
    return lk_trainer_metric(tr, name, &v) ? v : NAN;
}

static run_out fit(run_spec s) {
    run_out o = {.loss = NAN, .val_loss = NAN, .test_loss = NAN};
    if (!root[0]) setup(); /* a case run alone */
    lk_trainer_config cfg;
    CHECK_OK(lk_trainer_config_default(&cfg));
    snprintf(cfg.accelerator, sizeof cfg.accelerator, "%s", s.accelerator);
    snprintf(cfg.strategy, sizeof cfg.strategy, "single");
    cfg.max_steps = s.max_steps;
    cfg.max_epochs = s.max_epochs ? s.max_epochs : 5;
    if (s.limit.value > 0) cfg.limit_train_batches = s.limit;
    if (s.accum) cfg.accumulate_grad_batches = s.accum;
    cfg.enable_checkpointing = true;
    cfg.enable_progress_bar = false;
    cfg.enable_tensorboard = false;
    cfg.enable_model_summary = false;
    cfg.num_sanity_val_steps = 0;
    cfg.log_every_n_steps = 1;
    cfg.seed = 3;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "%s", root);
    bool cnn = !strcmp(s.model, "cnn");
    const char *ns = s.num_samples ? s.num_samples : cnn ? "320" : "640";
    const lk_model_kv data[] = {{"num_samples", ns}, {"input_shape", cnn ? "[1, 8, 8]" : "[16]"}, {"num_classes", "4"},
                                {"batch_size", cnn ? "16" : "32"}, {"num_workers", s.workers ? s.workers : "0"}};
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    CHECK_OK(lk_module_create_builtin(s.model, cnn ? cnn_args : mlp_args, 4, 3, &m));
    CHECK_OK(lk_datamodule_create_builtin("synthetic", data, 5, 3, &dm));
    CHECK_OK(lk_trainer_create(&cfg, NULL, NULL, &tr));
    if (!m || !dm || !tr) goto out;
    static lk_module_vtable probe_vt;
    base_vt = m->vt;
    probe_vt = *m->vt;
    probe_vt.training_step = probe_step;
    m->vt = &probe_vt;
    probe_out = &o;
    static lk_datamodule_vtable dm_vt;
    if (s.fail_at > 0) {
        base_dm_vt = dm->vt;
        dm_vt = *dm->vt;
        dm_vt.dataset = failing_dataset;
        dm->vt = &dm_vt;
        fail_at = s.fail_at;
    }
    o.before = sealed_get_stats(), o.abefore = sealed_async_get_stats();
    lk_status st = lk_trainer_fit(tr, m, dm, s.resume);
    o.after = sealed_get_stats(), o.aafter = sealed_async_get_stats();
    snprintf(o.err, sizeof o.err, "%s", st ? lk_last_error() : "");
    CHECK_MSG(st == s.expect, "%s on %s: fit returned %d (%s), expected %d", s.model, s.accelerator, (int)st, o.err,
              (int)s.expect);
    if (s.last) snprintf(s.last, 1024, "%s", lk_trainer_last_checkpoint(tr));
    o.loss = metric(tr, "train_loss");
    o.val_loss = metric(tr, "val_loss");
    if (s.test_after && !st) { /* the module stays on the device after fit: test and predict run there */
        long a0 = sealed_async_get_stats().copies_async;
        CHECK_OK(lk_trainer_test(tr, m, dm, NULL));
        o.test_loss = metric(tr, "test_loss");
        CHECK_OK(lk_trainer_predict(tr, m, dm, NULL));
        o.test_async = sealed_async_get_stats().copies_async - a0;
        char path[2200];
        snprintf(path, sizeof path, "%s/predictions.npy", lk_trainer_log_dir(tr));
        FILE *f = fopen(path, "rb");
        char buf[4096];
        size_t got = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        size_t hl = got > 10 ? (size_t)(unsigned char)buf[8] | (size_t)(unsigned char)buf[9] << 8 : 0; /* .npy header */
        CHECK_MSG(got >= 10 + hl + sizeof o.pred, "%s: no predictions", path);
        if (got >= 10 + hl + sizeof o.pred) memcpy(o.pred, buf + 10 + hl, sizeof o.pred);
    }
    lk_named_tensors ps = {0};
    CHECK_OK(lk_layer_named_parameters(m->net, &ps));
    for (int i = 0; i < ps.n; i++) o.n += ps.items[i].tensor->numel;
    o.params = calloc((size_t)o.n + 1, sizeof(float));
    for (int64_t i = 0, k = 0; i < ps.n; k += ps.items[i].tensor->numel, i++) {
        lk_tensor *h = lk_tensor_to(ps.items[i].tensor, LK_DEVICE_CPU);
        CHECK(h && h->dtype == LK_F32);
        if (h) memcpy(o.params + k, h->data, (size_t)h->numel * sizeof(float));
        lk_tensor_release(h);
    }
    lk_named_tensors_clear(&ps);
    m->vt = base_vt;
    if (s.fail_at > 0) dm->vt = base_dm_vt;
out:
    probe_out = NULL;
    lk_trainer_free(tr);
    lk_module_free(m);
    lk_datamodule_free(dm);
    lk_dataset_free(failing_train);
    failing_train = NULL;
    return o;
}

static bool same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static void same_bits(const char *what, run_out *a, run_out *b) {
    CHECK_MSG(a->params && b->params && a->n == b->n && a->n > 0, "%s: no parameters", what);
    if (a->params && b->params && a->n == b->n) {
        int64_t diff = 0;
        for (int64_t i = 0; i < a->n; i++) diff += memcmp(&a->params[i], &b->params[i], sizeof(float)) != 0;
        CHECK_MSG(diff == 0, "%s: %lld of %lld parameters differ", what, (long long)diff, (long long)a->n);
    }
    CHECK_MSG(same_double(a->loss, b->loss) && !isnan(a->loss), "%s: train_loss %.9g vs %.9g", what, a->loss, b->loss);
    CHECK_MSG(same_double(a->val_loss, b->val_loss), "%s: val_loss %.9g vs %.9g", what, a->val_loss, b->val_loss);
    CHECK_MSG(same_double(a->test_loss, b->test_loss), "%s: test_loss %.9g vs %.9g", what, a->test_loss, b->test_loss);
    CHECK_MSG(!memcmp(a->pred, b->pred, sizeof a->pred), "%s: predictions %g vs %g", what, a->pred[0], b->pred[0]);
    CHECK_MSG(a->steps_seen == b->steps_seen, "%s: %lld vs %lld training steps", what, (long long)a->steps_seen,
              (long long)b->steps_seen);
    free(a->params);
    free(b->params);
    a->params = b->params = NULL;
}

/* ---- the device calls ---- */

/* On sealed_async a queued copy is not there until its event is waited
 * for; on the cpu and on sealed (no streams) every call is synchronous. */
static void device_calls(void) {
    lk_device d = sealed_async_device(0);
    float src[64], back[64];
    for (int i = 0; i < 64; i++) src[i] = (float)i + 0.5f;
    void *host = NULL, *dev = NULL;
    sealed_async_counts a0 = sealed_async_get_stats();
    CHECK_OK(lk_device_host_alloc(d, sizeof src, &host));
    CHECK(sealed_async_get_stats().host_allocs == a0.host_allocs + 1);
    memcpy(host, src, sizeof src);
    CHECK_OK(lk_device_alloc(d, sizeof src, &dev));
    lk_stream *s = NULL;
    lk_event *e = NULL;
    CHECK_OK(lk_device_stream_create(d, &s));
    CHECK(s != NULL);
    CHECK_OK(lk_device_copy_async(d, s, dev, host, sizeof src));
    CHECK_OK(lk_device_event_record(d, s, &e));
    CHECK(e != NULL);
    memset(back, 0, sizeof back);
    CHECK_OK(lk_device_copy(LK_DEVICE_CPU, back, d, dev, sizeof back));
    CHECK_MSG(isnan(back[0]), "the queued copy ran before anything waited for it (%g)", back[0]);
    CHECK_OK(lk_device_event_wait(d, NULL, e)); /* the default stream waits: the copy has run */
    CHECK_OK(lk_device_copy(LK_DEVICE_CPU, back, d, dev, sizeof back));
    CHECK(!memcmp(back, src, sizeof src));
    lk_device_event_free(d, e);
    /* host memory is read when the copy runs: changed before the event, the new bytes arrive */
    ((float *)host)[0] = -1;
    CHECK_OK(lk_device_copy_async(d, s, dev, host, sizeof src));
    CHECK_OK(lk_device_event_record(d, s, &e));
    CHECK_OK(lk_device_event_synchronize(d, e));
    CHECK_OK(lk_device_copy(LK_DEVICE_CPU, back, d, dev, sizeof back));
    CHECK(back[0] == -1 && back[1] == src[1]);
    lk_device_event_free(d, e);
    lk_device_stream_free(d, s);
    lk_device_free(d, dev, sizeof src);
    lk_device_host_free(d, host, sizeof src);
    CHECK(sealed_async_get_stats().host_frees == a0.host_frees + 1);
    /* no streams: NULL stream and events, synchronous copies */
    lk_device kinds[2] = {LK_DEVICE_CPU, sealed_device(0)};
    for (int k = 0; k < 2; k++) {
        d = kinds[k];
        CHECK_OK(lk_device_host_alloc(d, sizeof src, &host));
        memcpy(host, src, sizeof src);
        CHECK_OK(lk_device_stream_create(d, &s));
        CHECK(s == NULL);
        CHECK_OK(lk_device_alloc(d, sizeof src, &dev));
        CHECK_OK(lk_device_copy_async(d, s, dev, host, sizeof src));
        CHECK_OK(lk_device_event_record(d, s, &e));
        CHECK(e == NULL);
        CHECK_OK(lk_device_event_wait(d, NULL, e));
        CHECK_OK(lk_device_event_synchronize(d, e));
        CHECK_OK(lk_device_copy(LK_DEVICE_CPU, back, d, dev, sizeof back));
        CHECK(!memcmp(back, src, sizeof src));
        lk_device_free(d, dev, sizeof src);
        lk_device_host_free(d, host, sizeof src);
    }
}

/* ---- fits ---- */

/* 20 steps (an epoch of 16 batches, its validation, 4 steps more), then
 * test and predict: the CPU's bits; within the epoch a step copies nothing
 * of the batch synchronously (the mlp's two dropout masks are its only
 * copies in) and one asynchronous copy per field, its bytes; over the fit
 * one async copy per field of every batch taken: the 20 trained, the 21st
 * (taken during step 20 before max_steps stopped the fit) and the 2
 * validation batches; test and predict (2 batches each) copy theirs the
 * same way. */
static void fit_model(const char *model) {
    bool cnn = !strcmp(model, "cnn");
    run_out cpu = fit((run_spec){.model = model, .accelerator = "cpu", .max_steps = 20, .test_after = true});
    run_out sd = fit((run_spec){.model = model, .accelerator = "sealed_async", .max_steps = 20, .test_after = true});
    CHECK_MSG(sd.steps_seen == 20, "%s: %lld steps", model, (long long)sd.steps_seen);
    long masks = cnn ? 0 : 2;
    int64_t batch = cnn ? 16 : 32, batch_bytes = batch * (cnn ? 64 : 16) * 4 + batch * 8; /* x f32, y i64 */
    for (int k = 1; k < 15 && k < sd.steps_seen; k++) { /* from step k - 1's start to k's: batch k + 1's copies */
        long sync_in = sd.at[k].copies_in - sd.at[k - 1].copies_in;
        long async_in = sd.aat[k].copies_async - sd.aat[k - 1].copies_async;
        int64_t abytes = (int64_t)(sd.aat[k].bytes_async - sd.aat[k - 1].bytes_async);
        long waits = sd.aat[k].waits_default - sd.aat[k - 1].waits_default;
        CHECK_MSG(sync_in == masks, "%s step %d: %ld synchronous copies in (the dropout masks are %ld)", model, k, sync_in,
                  masks);
        CHECK_MSG(async_in == 2 && abytes == batch_bytes, "%s step %d: %ld async copies, %lld bytes (the batch: 2, %lld)",
                  model, k, async_in, (long long)abytes, (long long)batch_bytes);
        CHECK_MSG(waits == 1, "%s step %d: the default stream waited %ld times for a batch", model, k, waits);
        /* the staged batches' blocks come back from the pool: a repeated step allocates nothing */
        if (k >= 3)
            CHECK_MSG(sd.misses[k] == sd.misses[k - 1] && sd.at[k].allocs == sd.at[k - 1].allocs,
                      "%s step %d: %llu pool misses, %ld device allocations", model, k,
                      (unsigned long long)(sd.misses[k] - sd.misses[k - 1]), sd.at[k].allocs - sd.at[k - 1].allocs);
    }
    long async_all = sd.aafter.copies_async - sd.abefore.copies_async;
    CHECK_MSG(async_all == 2 * (21 + 2), "%s: %ld async copies over the fit, expected 2 fields x (21 + 2) batches", model,
              async_all);
    CHECK_MSG(sd.test_async == 2 * (2 + 2), "%s: %ld async copies in test and predict, expected 2 fields x 4 batches",
              model, sd.test_async);
    CHECK_MSG(sd.aafter.flushed - sd.abefore.flushed == async_all, "%s: %ld of %ld async copies ran", model,
              sd.aafter.flushed - sd.abefore.flushed, async_all);
    long hosts = sd.aafter.host_allocs - sd.abefore.host_allocs;
    CHECK_MSG(hosts > 0 && sd.aafter.host_frees - sd.abefore.host_frees == hosts,
              "%s: the loaders' buffers: %ld pinned allocations, %ld frees", model, hosts,
              sd.aafter.host_frees - sd.abefore.host_frees);
    same_bits(model, &cpu, &sd);
}
static void mlp_fit(void) { fit_model("mlp"); }
static void cnn_fit(void) { fit_model("cnn"); }

/* Stopped after 5 steps on sealed_async, resumed there at batch 5 to 12:
 * the bits of 12 uninterrupted steps on the CPU. */
static void resume_mid_epoch(void) {
    run_out whole = fit((run_spec){.model = "mlp", .accelerator = "cpu", .max_steps = 12});
    char last[1024] = "";
    run_out first = fit((run_spec){.model = "mlp", .accelerator = "sealed_async", .max_steps = 5, .last = last});
    free(first.params);
    CHECK_MSG(last[0], "no last.ckpt");
    if (!last[0]) return;
    run_out rest = fit((run_spec){.model = "mlp", .accelerator = "sealed_async", .max_steps = 12, .resume = last});
    CHECK_MSG(rest.steps_seen == 7, "resumed: %lld steps, expected 7", (long long)rest.steps_seen);
    whole.steps_seen = 7;
    same_bits("mlp: 5 steps, resumed to 12 on sealed_async", &whole, &rest);
}

/* 620 samples, 496 of them for training: 16 batches, the last of 16, and
 * 62 for validation: 2 batches. Two whole epochs with their short batch,
 * then limit_train_batches=7: exactly the batches trained (and validated)
 * are taken and copied. */
static void limits_and_short_batch(void) {
    run_spec s = {.model = "mlp", .max_steps = -1, .max_epochs = 2, .num_samples = "620"};
    s.accelerator = "cpu";
    run_out cpu = fit(s);
    s.accelerator = "sealed_async";
    run_out sd = fit(s);
    CHECK_MSG(sd.steps_seen == 32, "%lld steps, expected 2 x 16", (long long)sd.steps_seen);
    long a = sd.aafter.copies_async - sd.abefore.copies_async;
    size_t bytes = sd.aafter.bytes_async - sd.abefore.bytes_async, row = 16 * 4 + 8;
    CHECK_MSG(a == 2 * (32 + 4) && bytes == 2 * (496 + 62) * row, "%ld async copies (%zu bytes), expected 72 (%zu)", a,
              bytes, 2 * (496 + 62) * row);
    same_bits("mlp, 496 training samples, short last batch", &cpu, &sd);
    s.limit = (lk_count_or_fraction){.is_count = true, .value = 7};
    s.accelerator = "cpu";
    cpu = fit(s);
    s.accelerator = "sealed_async";
    sd = fit(s);
    a = sd.aafter.copies_async - sd.abefore.copies_async;
    CHECK_MSG(sd.steps_seen == 14 && a == 2 * (14 + 4), "limit 7: %lld steps, %ld async copies, expected 14 and 36",
              (long long)sd.steps_seen, a);
    same_bits("mlp, limit_train_batches=7", &cpu, &sd);
}

/* Two loader workers filling ahead of the two batches the trainer holds:
 * the bits of the CPU run. */
static void workers_fill_ahead(void) {
    run_spec s = {.model = "mlp", .max_steps = 20, .workers = "2"};
    s.accelerator = "cpu";
    run_out cpu = fit(s);
    s.accelerator = "sealed_async";
    run_out sd = fit(s);
    same_bits("mlp, 2 loader workers", &cpu, &sd);
}

/* accumulate_grad_batches=3 over an epoch boundary (16 batches: the
 * epoch's last optimizer step takes one): the CPU's bits. */
static void accumulation(void) {
    run_spec s = {.model = "mlp", .max_steps = 7, .accum = 3};
    s.accelerator = "cpu";
    run_out cpu = fit(s);
    s.accelerator = "sealed_async";
    run_out sd = fit(s);
    same_bits("mlp, accumulate_grad_batches=3", &cpu, &sd);
}

/* The training set fails inside batch 5 (sample 161 read): batch 5 is taken
 * during step 4, but steps 0..4 run and the fit fails at step 5 with the
 * loader's message, as on the CPU. */
static void loader_error_at_its_step(void) {
    const char *acc[2] = {"cpu", "sealed_async"};
    for (int k = 0; k < 2; k++) {
        run_out o = fit((run_spec){.model = "mlp", .accelerator = acc[k], .max_steps = 20, .fail_at = 32 * 5 + 1,
                                   .expect = LK_STATUS_IO});
        CHECK_MSG(o.steps_seen == 5, "%s: %lld steps ran before the failing batch, expected 5", acc[k],
                  (long long)o.steps_seen);
        CHECK_MSG(strstr(o.err, "loading batch 5 of epoch 0") && strstr(o.err, "cannot be read"), "%s: error '%s'",
                  acc[k], o.err);
        free(o.params);
    }
}

static void setup(void) {
    snprintf(root, sizeof root, "/tmp/lk_test_prefetch_%d", (int)getpid());
    sealed_async_device(0);
}

static void cleanup(void) {
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", root);
    CHECK(system(rm) == 0);
}

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(device_calls), LK_TEST_CASE(mlp_fit), LK_TEST_CASE(cnn_fit),
             LK_TEST_CASE(resume_mid_epoch), LK_TEST_CASE(limits_and_short_batch), LK_TEST_CASE(accumulation), LK_TEST_CASE(workers_fill_ahead),
             LK_TEST_CASE(loader_error_at_its_step), LK_TEST_CASE(cleanup))

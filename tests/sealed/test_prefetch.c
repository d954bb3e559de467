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
 * sealed without streams) are synchronous. dp x2 prefetches each replica's
 * slice onto its own device, with the CPU's dp bits. */
#include <stdatomic.h>

#include "sealed_harness.h"

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
static lk_datamodule_vtable dm_vt;
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

/* Every prefetch run is probed by training_step call (a resumed or
 * accumulating fit counts the calls it made); a run with fail_at trains on
 * the failing set. */
static void fail_train(lk_datamodule *dm) {
    base_dm_vt = dm->vt;
    dm_vt = *dm->vt;
    dm_vt.dataset = failing_dataset;
    dm->vt = &dm_vt;
}
static run_out fit(run_spec s) {
    s.probe = s.probe_by_call = true;
    if (s.fail_at > 0) s.datamodule_hook = fail_train, fail_at = s.fail_at;
    run_out o = sh_fit(s);
    lk_dataset_free(failing_train);
    failing_train = NULL;
    return o;
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
 * in synchronously (the mlp's two dropout masks are drawn on the device)
 * and one asynchronous copy per field, its bytes; over the fit
 * one async copy per field of every batch taken: the 20 trained, the 21st
 * (taken during step 20 before max_steps stopped the fit) and the 2
 * validation batches; test and predict (2 batches each) copy theirs the
 * same way. */
static void fit_model(const char *model) {
    bool cnn = !strcmp(model, "cnn");
    run_out cpu = fit((run_spec){.model = model, .accelerator = "cpu", .max_steps = 20, .test_after = true});
    run_out sd = fit((run_spec){.model = model, .accelerator = "sealed_async", .max_steps = 20, .test_after = true});
    CHECK_MSG(sd.steps_seen == 20, "%s: %lld steps", model, (long long)sd.steps_seen);
    int64_t batch = cnn ? 16 : 32, batch_bytes = batch * (cnn ? 64 : 16) * 4 + batch * 8; /* x f32, y i64 */
    for (int k = 1; k < 15 && k < sd.steps_seen; k++) { /* from step k - 1's start to k's: batch k + 1's copies */
        long sync_in = sd.at[k].copies_in - sd.at[k - 1].copies_in;
        long async_in = sd.aat[k].copies_async - sd.aat[k - 1].copies_async;
        int64_t abytes = (int64_t)(sd.aat[k].bytes_async - sd.aat[k - 1].bytes_async);
        long waits = sd.aat[k].waits_default - sd.aat[k - 1].waits_default;
        CHECK_MSG(sync_in == 0, "%s step %d: %ld synchronous copies in (the dropout masks need none)", model, k, sync_in);
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

/* The run on the cpu, then on sealed_async: the same bits. */
static void same_as_cpu(const char *what, run_spec s) {
    s.accelerator = "cpu";
    run_out cpu = fit(s);
    s.accelerator = "sealed_async";
    run_out sd = fit(s);
    same_bits(what, &cpu, &sd);
}

/* Two loader workers filling ahead of the two batches the trainer holds:
 * the bits of the CPU run. */
static void workers_fill_ahead(void) {
    same_as_cpu("mlp, 2 loader workers", (run_spec){.model = "mlp", .max_steps = 20, .workers = "2"});
}

/* accumulate_grad_batches=3 over an epoch boundary (16 batches: the
 * epoch's last optimizer step takes one): the CPU's bits. */
static void accumulation(void) {
    same_as_cpu("mlp, accumulate_grad_batches=3", (run_spec){.model = "mlp", .max_steps = 7, .accum = 3});
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

/* dp x2 on sealed_async:0 and :1: batch i + 1's slices are queued onto
 * their replicas' devices during step i, each device's default stream
 * waits for its slice once, and no step copies anything in synchronously
 * (before, each replica's forward copied its slice in); the CPU's bits. */
static void dp_slices(void) {
    run_spec s = {.model = "mlp", .strategy = "dp", .devices = 2, .max_steps = 20, .test_after = true};
    s.accelerator = "cpu";
    run_out cpu = fit(s);
    s.accelerator = "sealed_async";
    run_out sd = fit(s);
    CHECK_MSG(sd.steps_seen == 20, "dp: %lld steps", (long long)sd.steps_seen);
    int64_t batch_bytes = 32 * 16 * 4 + 32 * 8;
    /* replica 1's thread runs beside replica 0's (whose training_step marks
     * the steps): the counts are summed over steps 1 to 13, which take and
     * queue batches 3 to 15 (the epoch's last: step 15 queues none) */
    enum { FROM = 1, TO = 14, N = TO - FROM };
    sealed_stats a = sd.at[FROM], b = sd.at[TO];
    sealed_async_counts aa = sd.aat[FROM], ab = sd.aat[TO];
    long sync_in = b.copies_in - a.copies_in, waits = sd.aafter.waits_default - sd.abefore.waits_default;
    long to0 = ab.copies_async_to[0] - aa.copies_async_to[0], to1 = ab.copies_async_to[1] - aa.copies_async_to[1];
    int64_t bytes = (int64_t)(ab.bytes_async - aa.bytes_async);
    printf("dp x2, steps %d-%d: %ld synchronous copies in, async copies %ld to :0 and %ld to :1 (%lld bytes); "
           "%ld waits in the fit\n", FROM, TO - 1, sync_in, to0, to1, (long long)bytes, waits);
    CHECK_MSG(sync_in == 0, "dp: %ld synchronous copies in over %d steps (the slices are prefetched)", sync_in, N);
    CHECK_MSG(to0 == 2 * N && to1 == 2 * N && bytes == N * batch_bytes,
              "dp: %ld and %ld async copies to sealed_async:0 and :1, %lld bytes (expected %d each, %lld)", to0, to1,
              (long long)bytes, 2 * N, (long long)(N * batch_bytes));
    /* over the fit: once per device and step, once per validation batch (on device 0) */
    CHECK_MSG(waits == 2 * 20 + 2, "dp: the default streams waited %ld times in 20 steps and 2 validation batches "
              "(expected 42: once per device and batch)", waits);
    for (int k = 0; k < 16; k++) /* batch k's slices (2 fields each) were queued before step k's forward */
        for (int dev = 0; dev < 2; dev++)
            CHECK_MSG(sd.aat[k].copies_async_to[dev] - sd.abefore.copies_async_to[dev] >= 2 * (k + 1),
                      "dp step %d: %ld async copies to sealed_async:%d before its forward (batch %d's slice: %d)", k,
                      sd.aat[k].copies_async_to[dev] - sd.abefore.copies_async_to[dev], dev, k, 2 * (k + 1));
    CHECK_MSG(sd.aafter.flushed - sd.abefore.flushed == sd.aafter.copies_async - sd.abefore.copies_async,
              "dp: %ld of %ld async copies ran", sd.aafter.flushed - sd.abefore.flushed,
              sd.aafter.copies_async - sd.abefore.copies_async);
    same_bits("mlp dp x2", &cpu, &sd);
}

static void setup(void) {
    sh_root_init("prefetch");
    sealed_async_device(0);
}

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(device_calls), LK_TEST_CASE(mlp_fit), LK_TEST_CASE(cnn_fit),
             LK_TEST_CASE(resume_mid_epoch), LK_TEST_CASE(limits_and_short_batch), LK_TEST_CASE(accumulation), LK_TEST_CASE(workers_fill_ahead),
             LK_TEST_CASE(loader_error_at_its_step), LK_TEST_CASE(dp_slices), LK_TEST_CASE(cleanup))

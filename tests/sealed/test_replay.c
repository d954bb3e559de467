/* The training step replayed as graphs (src/backend/replay.c) on the
 * tests' capturing fake (tests/sealed_device.h's sealed_graph kind: ops,
 * memsets and copies within recorded between graph_begin and graph_end,
 * replayed on launch, host reads and allocations refused while capturing).
 *
 * Each case fits the same run twice, with LK_GRAPHS=0 (every op issued at
 * its call) and with the layer on, and asserts the two are the same bit for
 * bit: parameters, train/val metrics, step count. A probe at the start of
 * every step's training_step takes the layer's and the fake's counters, so
 * the per-step numbers (items issued eagerly, graph launches, captures) are
 * checked too: a steady step must be nothing but graph launches, also
 * where it needs per-step values (Adam's step, dropout's counter, the loss
 * scale), since those are read from the graphs' live slots
 * (lk__op_live_size) rather than baked into the captured descriptors.
 *
 * `--gpu` runs the mlp SGD case on cuda:0 (ctest gpu_replay, label gpu;
 * exit 77 without a GPU): the same fits, equal bits, graphs launched. */
#include <math.h>

#include "backend/replay.h"
#include "device/graph.h"
#include "gpu/gpu_test.h"
#include "sealed_harness.h"
#include "io/safetensors.h"

static const char *accel = "sealed_graph";

static void setup(void) {
    sh_root_init("sealed_replay");
    (void)sealed_register_capturing(0);
}

/* the counters at the start of step k (the probe) */
static lk__replay_stats at[MAX_STEPS];
static sealed_graph_counts gat[MAX_STEPS];
static void probe_hook(run_out *o, int64_t k, bool after) {
    (void)o;
    if (after || k >= MAX_STEPS) return;
    at[k] = lk__replay_get_stats();
    gat[k] = sealed_graph_get_stats();
}

typedef struct {
    run_out off, on;
    lk__replay_stats on0, on1; /* the layer's counters around the "on" fit */
    int64_t steps;
    lk__replay_stats step[MAX_STEPS]; /* step k's deltas (k + 1 < steps) */
} pair;

static run_out fit_with(run_spec s, const char *graphs) {
    setenv("LK_GRAPHS", graphs, 1);
    s.accelerator = s.accelerator ? s.accelerator : accel;
    s.probe = true;
    s.step_hook = probe_hook;
    memset(at, 0, sizeof at);
    run_out o = sh_fit(s);
    unsetenv("LK_GRAPHS");
    return o;
}

static lk__replay_stats delta(lk__replay_stats a, lk__replay_stats b) {
    return (lk__replay_stats){.steps = b.steps - a.steps,
                              .deferred = b.deferred - a.deferred,
                              .segments_eager = b.segments_eager - a.segments_eager,
                              .eager_items = b.eager_items - a.eager_items,
                              .captures = b.captures - a.captures,
                              .launches = b.launches - a.launches,
                              .capture_failures = b.capture_failures - a.capture_failures,
                              .mismatches = b.mismatches - a.mismatches,
                              .passthrough = b.passthrough - a.passthrough,
                              .drops = b.drops - a.drops};
}

/* Two checkpoints hold the same tensors bit for bit: the parameters, the
 * optimizer's state (momentum, Adam's moments), the grad scaler's. */
static void same_ckpt(const char *a, const char *b, const char *what) {
    lk_st_file *fa = NULL, *fb = NULL;
    CHECK_MSG(a[0] && b[0], "%s: no last checkpoint ('%s', '%s')", what, a, b);
    if (!a[0] || !b[0]) return;
    CHECK_OK(lk_safetensors_open(a, &fa));
    CHECK_OK(lk_safetensors_open(b, &fb));
    int n = fa ? lk_safetensors_count(fa) : 0, optim = 0;
    CHECK(fb && n > 0 && n == lk_safetensors_count(fb));
    for (int i = 0; fb && i < n; i++) {
        const lk_st_info *x = lk_safetensors_at(fa, i), *y = lk_safetensors_find(fb, x->name);
        CHECK_MSG(y && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes), "%s: checkpoint tensor '%s' differs",
                  what, x->name);
        optim += strstr(x->name, "optim") != NULL;
    }
    CHECK_MSG(optim > 0, "%s: no optimizer state in %s", what, a);
    lk_safetensors_close(fa), lk_safetensors_close(fb);
}

/* The run's run.json (beside the checkpoints folder of `last`) holds
 * `needle`: the graph counters and the accelerator a run reports. */
static void runjson_has(const char *last, const char *needle, const char *what) {
    char path[1200];
    snprintf(path, sizeof path, "%s", last);
    for (int up = 0; up < 2; up++) { /* .../version_N/checkpoints/last.ckpt -> .../version_N */
        char *slash = strrchr(path, '/');
        if (slash) *slash = 0;
    }
    strncat(path, "/run.json", sizeof path - strlen(path) - 1);
    FILE *f = fopen(path, "rb");
    char text[65536] = "";
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    CHECK_MSG(strstr(text, needle), "%s: %s does not hold '%s'", what, path, needle);
}

/* Both fits; the "on" one's per-step deltas; their last checkpoints
 * compared. The caller compares the runs and frees them. */
static pair run_pair(run_spec s, const char *what) {
    pair p = {0};
    char last_off[1024] = "", last_on[1024] = "";
    s.last = last_off;
    p.off = fit_with(s, "0");
    p.on0 = lk__replay_get_stats();
    s.last = last_on;
    p.on = fit_with(s, "1");
    p.on1 = lk__replay_get_stats();
    if (s.expect == LK_STATUS_OK) same_ckpt(last_off, last_on, what);
    p.steps = p.on.steps_seen < MAX_STEPS ? p.on.steps_seen : MAX_STEPS;
    for (int64_t k = 0; k + 1 < p.steps; k++) p.step[k] = delta(at[k], at[k + 1]);
    lk__replay_stats all = delta(p.on0, p.on1);
    printf("%-28s steps %lld: deferred %lld, eager segments %lld (%lld items), captures %lld, launches %lld, "
           "capture failures %lld, mismatches %lld, passthrough %lld, drops %lld\n",
           what, (long long)p.steps, (long long)all.deferred, (long long)all.segments_eager, (long long)all.eager_items,
           (long long)all.captures, (long long)all.launches, (long long)all.capture_failures,
           (long long)all.mismatches, (long long)all.passthrough, (long long)all.drops);
    printf("  per step (eager items / launches / captures):");
    for (int64_t k = 0; k + 1 < p.steps; k++)
        printf(" %lld/%lld/%lld", (long long)p.step[k].eager_items, (long long)p.step[k].launches,
               (long long)p.step[k].captures);
    printf("\n");
    CHECK_MSG(all.steps > 0 && all.deferred > 0, "%s: the layer deferred nothing (%lld steps opened)", what,
              (long long)all.steps);
    if (s.expect == LK_STATUS_OK) { /* run.json says what ran: the device kind, and the graphs with their counts */
        char needle[160];
        runjson_has(last_off, "\"graphs\": null", what);
        snprintf(needle, sizeof needle, "\"accelerator\": \"%s\"", accel);
        runjson_has(last_on, needle, what);
        snprintf(needle, sizeof needle, "\"launches\": %lld,", (long long)all.launches);
        runjson_has(last_on, needle, what);
        snprintf(needle, sizeof needle, "\"captures\": %lld,", (long long)all.captures);
        runjson_has(last_on, needle, what);
    }
    return p;
}

/* Steady steps (from `from` on): `segments` segments each, every one a
 * graph launch, no capture and nothing issued eagerly (every per-step
 * value of these runs is live: lk__op_live_size). */
static void assert_steady(const pair *p, int64_t from, int segments, const char *what) {
    CHECK_MSG(p->steps > from + 2, "%s: %lld steps, too few to see steady ones", what, (long long)p->steps);
    for (int64_t k = from; k + 1 < p->steps; k++) {
        const lk__replay_stats *d = &p->step[k];
        CHECK_MSG(d->captures == 0 && d->launches == segments && d->segments_eager == 0,
                  "%s: step %lld: %lld launches, %lld eager segments (%lld items; %lld mismatches), %lld captures; "
                  "%d launches and nothing eager expected",
                  what, (long long)k, (long long)d->launches, (long long)d->segments_eager, (long long)d->eager_items,
                  (long long)d->mismatches, (long long)d->captures, segments);
    }
}

/* A fit that, once steady, is nothing but graph launches (two a step),
 * bit for bit the fit without the layer. */
static void replays_fully(run_spec s, const char *what) {
    pair p = run_pair(s, what);
    same_bits(what, &p.off, &p.on);
    assert_steady(&p, 4, 2, what);
}

/* SGD without dropout: forward, backward and the checks replay (one graph
 * per batch parity), then the update (its step number in a live slot). */
static void mlp_sgd(void) {
    replays_fully((run_spec){.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 16}, "mlp f32 sgd");
}

/* Dropout's counter is in the first segment, Adam's step in the second. */
static void mlp_adamw_dropout(void) {
    replays_fully((run_spec){.model = "mlp", .optimizer = "adamw", .max_steps = 16}, "mlp adamw dropout");
}

static void cnn(void) {
    replays_fully((run_spec){.model = "cnn", .optimizer = "sgd", .max_steps = 12}, "cnn f32 sgd");
    replays_fully((run_spec){.model = "cnn", .max_steps = 10}, "cnn f32 adam");
}

static void autoencoder(void) {
    replays_fully((run_spec){.model = "autoencoder", .optimizer = "sgd", .max_steps = 12}, "autoencoder sgd");
    replays_fully((run_spec){.model = "autoencoder", .max_steps = 10}, "autoencoder adam");
}

static void mixed(void) {
    replays_fully((run_spec){.model = "mlp", .precision = "bf16-mixed", .optimizer = "sgd", .no_dropout = true, .max_steps = 12}, "mlp bf16-mixed sgd");
    /* 16-mixed: an inf gradient at step 6 (written from the host: one more
     * flush) runs that step eagerly and skips its update; the halved loss
     * scale is a live value, so the next steps replay the same graphs */
    pair h = run_pair((run_spec){.model = "mlp", .precision = "16-mixed", .optimizer = "sgd", .no_dropout = true,
                                 .max_steps = 14, .overflow = "0:6"},
                      "mlp 16-mixed sgd overflow");
    same_bits("mlp 16-mixed sgd overflow", &h.off, &h.on);
    CHECK(delta(h.on0, h.on1).launches > 0);
    for (int64_t k = 7; k + 1 < h.steps; k++) /* after the overflow's step: the same graphs, none captured */
        CHECK_MSG(h.step[k].captures == 0 && h.step[k].launches == 2, "16-mixed overflow: step %lld: %lld captures, "
                  "%lld launches", (long long)k, (long long)h.step[k].captures, (long long)h.step[k].launches);
    pair a = run_pair((run_spec){.model = "mlp", .precision = "16-mixed", .max_steps = 12, .overflow = "0:5"},
                      "mlp 16-mixed adam overflow");
    same_bits("mlp 16-mixed adam overflow", &a.off, &a.on);
}

/* Gradient accumulation (a micro-batch without an optimizer step ends its
 * own step) and clipping (its coefficient read from device memory inside
 * the second segment). */
static void accumulate_and_clip(void) {
    pair a = run_pair((run_spec){.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 8, .accum = 2},
                      "mlp sgd accumulate 2");
    same_bits("mlp sgd accumulate 2", &a.off, &a.on);
    CHECK(delta(a.on0, a.on1).launches > 0);
    replays_fully((run_spec){.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 12, .clip = 0.5}, "mlp sgd clip 0.5");
}

/* 100 samples in batches of 32: the last batch of each epoch is short (4),
 * a different segment: it runs eagerly, and the next epoch replays again. */
static void short_last_batch(void) {
    pair p = run_pair((run_spec){.model = "mlp", .optimizer = "sgd", .no_dropout = true, .num_samples = "100",
                                 .max_epochs = 4, .max_steps = -1},
                      "mlp sgd short last batch");
    same_bits("mlp sgd short last batch", &p.off, &p.on);
    CHECK(p.steps >= 12);
    CHECK_MSG(delta(p.on0, p.on1).launches > 0, "no graph launched");
}

/* Checkpoint at step 5, resume to 12, with the layer on both halves; equal to the same without it. */
static void resume(void) {
    char last_off[1024] = "", last_on[1024] = "";
    run_spec first = {.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 5};
    first.last = last_off;
    run_out a = fit_with(first, "0");
    first.last = last_on;
    run_out b = fit_with(first, "1");
    same_bits("resume: first half", &a, &b);
    run_out c = fit_with((run_spec){.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 12,
                                    .resume = last_off, .probe_by_call = true},
                         "0");
    lk__replay_stats s0 = lk__replay_get_stats();
    run_out d = fit_with((run_spec){.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 12,
                                    .resume = last_on, .probe_by_call = true},
                         "1");
    CHECK(delta(s0, lk__replay_get_stats()).launches > 0);
    same_bits("resume: second half", &c, &d);
}

/* The pool giving its blocks back (lk_pool_trim, as the out-of-memory
 * retry does) frees device memory: every cached graph is dropped, and the
 * next steps capture again — still equal. */
static void trim_hook(run_out *o, int64_t k, bool after) {
    probe_hook(o, k, after);
    if (!after && k == 8) lk_pool_trim();
}
static void pool_release(void) {
    run_spec s = {.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 16};
    run_out off = fit_with(s, "0");
    setenv("LK_GRAPHS", "1", 1);
    s.accelerator = accel, s.probe = true, s.step_hook = trim_hook;
    lk__replay_stats s0 = lk__replay_get_stats();
    run_out on = sh_fit(s);
    unsetenv("LK_GRAPHS");
    lk__replay_stats d = delta(s0, lk__replay_get_stats());
    lk__replay_stats after_trim = delta(at[9], at[15]);
    CHECK_MSG(d.drops >= 1, "the trim dropped no graph (%lld drops)", (long long)d.drops);
    CHECK_MSG(after_trim.captures > 0 && after_trim.launches > 0, "after the trim: %lld captures, %lld launches",
              (long long)after_trim.captures, (long long)after_trim.launches);
    same_bits("pool release", &off, &on);
}

/* The device refusing every capture: the segments run eagerly, the fit
 * neither fails nor differs. */
static void capture_refused(void) {
    run_spec s = {.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 10};
    run_out off = fit_with(s, "0");
    sealed_graph_refuse_next = 1000;
    lk__replay_stats s0 = lk__replay_get_stats();
    run_out on = fit_with(s, "1");
    lk__replay_stats d = delta(s0, lk__replay_get_stats());
    sealed_graph_refuse_next = 0;
    /* and it stops trying after a few refusals in a row (each try costs a capture and the eager issue) */
    CHECK_MSG(d.capture_failures > 0 && d.capture_failures <= 4 && d.launches == 0, "%lld capture failures, %lld launches",
              (long long)d.capture_failures, (long long)d.launches);
    CHECK(!on.err[0]);
    same_bits("capture refused", &off, &on);
}

/* A NaN loss at step 8, inside replayed steps: the same error as eager,
 * and the parameters as the eager fit left them. */
static void nan_loss(void) {
    setenv("LK_TEST_LOSS_NAN", "0:8", 1);
    run_spec s = {.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 16, .expect = LK_STATUS_ABORTED};
    run_out off = fit_with(s, "0");
    lk__replay_stats s0 = lk__replay_get_stats();
    run_out on = fit_with(s, "1");
    unsetenv("LK_TEST_LOSS_NAN");
    CHECK(delta(s0, lk__replay_get_stats()).launches > 0);
    CHECK_MSG(off.err[0] && !strcmp(off.err, on.err), "errors differ:\n  eager:  %s\n  replay: %s", off.err, on.err);
    /* the metrics of a failed fit are whatever was logged; the parameters must match */
    CHECK_MSG(off.n == on.n && off.params && on.params && !memcmp(off.params, on.params, (size_t)off.n * sizeof(float)),
              "parameters after the NaN differ");
    free(off.params), free(on.params);
}

/* ---- the dispatch's rules, one op at a time ------------------------------------ */

typedef struct {
    lk_device dev;
    const float *y;
    float *z;
    lk_status st;
} other_args;
static void *other_thread(void *p) {
    other_args *a = p;
    a->st = lk__axpy(a->dev, LK_F32, 4, 1.0f, a->y, a->z); /* z += y, y written by the step's deferred op */
    return NULL;
}

/* Inside an open step: an op from another thread issues the step's
 * deferred work first (never reordered), an op with a host operand is not
 * deferred (its error comes at the call), and an op the backend does not
 * take fails at the call with the message it has without the layer. */
static void dispatch_rules(void) {
    lk_device dev = sealed_register_capturing(0);
    const int64_t n = 4;
    CHECK_OK(lk_device_set_default(dev));
    lk_tensor *x = lk_tensor_full(LK_F32, 1, &n, 3.0), *y = lk_tensor_full(LK_F32, 1, &n, 0.0),
              *z = lk_tensor_full(LK_F32, 1, &n, 1.0);
    CHECK_OK(lk_device_set_default(LK_DEVICE_CPU));
    if (!x || !y || !z) return;
    /* what the unsupported op says without the layer */
    lk_op_desc bad = {.op = LK_OP_UNARY, .dtype = {LK_I64, LK_I64}};
    bad.unary = (lk_unary_params){.fn = LK_UNARY_EXP, .n = n};
    CHECK(lk__backend_run(dev, &bad, (void *[]){x->data, y->data}) != LK_STATUS_OK);
    char eager_msg[512];
    snprintf(eager_msg, sizeof eager_msg, "%s", lk_last_error());

    setenv("LK_GRAPHS", "1", 1);
    CHECK_OK(lk__replay_step_begin(dev));
    lk__replay_stats s0 = lk__replay_get_stats();
    CHECK_OK(lk__affine(dev, LK_F32, n, 2.0f, 0.0f, false, x->data, y->data)); /* y = 2x: deferred */
    CHECK(lk__replay_get_stats().deferred == s0.deferred + 1);
    other_args a = {dev, y->data, z->data, LK_STATUS_OK};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, &a) == 0);
    pthread_join(t, NULL);
    CHECK_OK(a.st);
    lk__replay_stats s1 = lk__replay_get_stats();
    CHECK_MSG(s1.segments_eager == s0.segments_eager + 1 && s1.deferred == s0.deferred + 1,
              "the other thread's op: %lld eager segments, %lld deferred", (long long)(s1.segments_eager - s0.segments_eager),
              (long long)(s1.deferred - s0.deferred));
    /* an unsupported op: the same error, at the call */
    CHECK(lk__backend_run(dev, &bad, (void *[]){x->data, y->data}) != LK_STATUS_OK);
    CHECK_MSG(!strcmp(eager_msg, lk_last_error()), "unsupported op inside a step: \"%s\" vs \"%s\"", lk_last_error(), eager_msg);
    /* a host operand: the deferred op first, then this one at the call (the sealed backend refuses it) */
    CHECK_OK(lk__affine(dev, LK_F32, n, 2.0f, 0.0f, false, x->data, y->data));
    float host[4] = {0};
    CHECK_ERR(lk__affine(dev, LK_F32, n, 1.0f, 0.0f, false, x->data, host), LK_STATUS_INTERNAL, "not device memory");
    lk__replay_stats s2 = lk__replay_get_stats();
    CHECK(s2.passthrough == s1.passthrough + 1 && s2.segments_eager + s2.launches > s1.segments_eager + s1.launches);
    CHECK_OK(lk__replay_step_end());
    unsetenv("LK_GRAPHS");
    float zh[4] = {0};
    CHECK_OK(lk_device_copy(LK_DEVICE_CPU, zh, dev, z->data, sizeof zh));
    for (int i = 0; i < 4; i++) CHECK_MSG(zh[i] == 7.0f, "z[%d] = %g, expected 1 + 2 * 3", i, zh[i]);
    lk_tensor_release(x), lk_tensor_release(y), lk_tensor_release(z);
}

static const lk_t_case cases[] = {
    LK_TEST_CASE(mlp_sgd),     LK_TEST_CASE(mlp_adamw_dropout), LK_TEST_CASE(cnn),
    LK_TEST_CASE(autoencoder), LK_TEST_CASE(mixed),             LK_TEST_CASE(short_last_batch),
    LK_TEST_CASE(resume),      LK_TEST_CASE(pool_release),      LK_TEST_CASE(capture_refused),
    LK_TEST_CASE(nan_loss),    LK_TEST_CASE(dispatch_rules),    LK_TEST_CASE(accumulate_and_clip),
};

/* --gpu: the mlp SGD fit on cuda:0, LK_GRAPHS=0 against on: the same bits,
 * and graphs were captured and launched (the cuda device's own capture). */
static void gpu_mlp_sgd(void) {
    pair p = run_pair((run_spec){.model = "mlp", .optimizer = "sgd", .no_dropout = true, .max_steps = 16}, "cuda:0 mlp f32 sgd");
    lk__replay_stats d = delta(p.on0, p.on1);
    same_bits("cuda:0 mlp f32 sgd", &p.off, &p.on);
    CHECK_MSG(d.captures > 0 && d.launches > 0 && d.capture_failures == 0,
              "cuda:0: %lld captures, %lld launches, %lld captures refused (LK_LOG_LEVEL=debug names the reason)",
              (long long)d.captures, (long long)d.launches, (long long)d.capture_failures);
}
static const lk_t_case gpu_cases[] = {LK_TEST_CASE(gpu_mlp_sgd)};
static int gpu_probe(void) {
    gpu_test_require();
    accel = "gpu";
    int rc = lk_t_run(gpu_cases, 1, 1, (char *[]){"test_sealed_replay", NULL});
    cleanup();
    return rc;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--gpu")) { /* the child checks for a GPU: CUDA must not start before the fork */
        sh_root_init("gpu_replay");
        return gpu_test_in_child(gpu_probe, "gpu_replay");
    }
    setup();
    int rc = lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
    cleanup();
    return rc;
}

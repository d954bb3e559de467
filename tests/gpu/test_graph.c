/* Graph capture behind the device vtable (issue 21; src/device/graph.h):
 * a small training step — linear, mse loss, backward, an SGD update with
 * momentum, zero_grad — run eagerly on one set of parameters, and captured
 * once on an identical second set and replayed K times: after K eager steps
 * and K replays the parameters are bitwise equal (the same kernels with the
 * same arguments on the same stream), the capture itself runs nothing, and
 * a read into host memory while capturing, or an allocation the tensor
 * pool cannot serve from its cache, fails with the error saying it is not
 * allowed, ends the capture, and leaves the device working.
 *
 * Both sets take one eager warm-up step first: it makes the gradients and
 * the momentum buffers, fills the tensor pool's cache (a pool miss inside a
 * capture would be a cudaMalloc, which is refused) and creates cuBLASLt's
 * handle and workspace; after it every step issues the same descriptors
 * (SGD's `first` is step 1 only), which is what a replay repeats.
 *
 * Without an argument it runs on cuda:0 (label gpu; exits 77 "no CUDA
 * device" without one), in a child process so that a fault is reported as
 * a failure. `--sealed` runs the same cases on a fake that captures as the
 * cuda device does (tests/sealed_device.h's sealed_graph kind) — the tests' sealed device (memory the host cannot
 * read) plus graph methods that record each op, memset and copy within
 * instead of running it, replay the record on launch, and refuse an
 * allocation, a free, a copy to or from the host, a synchronize or an op
 * with a host operand while recording — so that every CI run checks the
 * test's own logic and that the step needs nothing the capture forbids. */
#include "device/graph.h"
#include "gpu_test.h"
#include "lk_test.h"
#include "sealed_device.h"

enum { B = 16, IN = 8, OUT = 4, K = 5 };

static lk_device dev;
static const char *dev_name = "cuda:0";

/* --sealed: the tests' capturing fake, tests/sealed_device.h's sealed_graph
 * kind (sealed_register_capturing). */

/* ---- the step ------------------------------------------------------------------ */

typedef struct {
    lk_tensor *w, *b;
    lk_optimizer *opt;
} param_set;

static lk_tensor *w0, *b0, *x0, *t0; /* on the CPU: both sets start from these */
static lk_tensor *x, *t;             /* the batch on the device: fixed, as a replay needs */

static void make_data(void) {
    lk_rng rng;
    lk_rng_init(&rng, 11, 0, 0, 0);
    w0 = lk_tensor_randn(&rng, 2, (int64_t[]){OUT, IN}, 0, 0.4f);
    b0 = lk_tensor_randn(&rng, 1, (int64_t[]){OUT}, 0, 0.1f);
    x0 = lk_tensor_randn(&rng, 2, (int64_t[]){B, IN}, 0, 1);
    t0 = lk_tensor_randn(&rng, 2, (int64_t[]){B, OUT}, 0, 1);
    if (!w0 || !b0 || !x0 || !t0 || lk_device_set_default(dev)) {
        fprintf(stderr, "setup: %s\n", lk_last_error());
        exit(1);
    }
    x = lk_tensor_to(x0, dev), t = lk_tensor_to(t0, dev);
    if (!x || !t) {
        fprintf(stderr, "batch to %s: %s\n", dev_name, lk_last_error());
        exit(1);
    }
}

static lk_status make_set(param_set *s) {
    s->w = lk_tensor_to(w0, dev), s->b = lk_tensor_to(b0, dev);
    if (!s->w || !s->b) return lk_last_status();
    lk_tensor_set_requires_grad(s->w, true);
    lk_tensor_set_requires_grad(s->b, true);
    lk_named_tensors p = {0};
    lk_status st = lk_named_tensors_append(&p, "w", s->w);
    if (!st) st = lk_named_tensors_append(&p, "b", s->b);
    lk_optim_config c = lk_sgd_config_default();
    c.lr = 0.05, c.momentum = 0.9;
    if (!st) st = lk_optimizer_create(&c, &p, &s->opt);
    lk_named_tensors_clear(&p);
    return st;
}

static void free_set(param_set *s) {
    lk_optimizer_free(s->opt);
    lk_tensor_release(s->w), lk_tensor_release(s->b);
}

/* One training step, all on the device: what the capture records. */
static lk_status step(param_set *s) {
    lk_tensor *y = lk_linear(x, s->w, s->b);
    lk_tensor *loss = y ? lk_mse_loss(y, t, LK_REDUCTION_MEAN) : NULL;
    lk_status st = loss ? lk_backward(loss) : lk_last_status();
    if (!st) st = lk_optimizer_step(s->opt);
    if (!st) lk_optimizer_zero_grad(s->opt, false); /* zeros in place: the gradients keep their blocks */
    lk_tensor_release(loss);
    lk_tensor_release(y);
    return st;
}

/* t's bytes on the host (the caller frees them); NULL on failure. */
static float *to_host(const lk_tensor *d) {
    lk_tensor *h = lk_tensor_to(d, LK_DEVICE_CPU);
    if (!h) return NULL;
    float *v = malloc((size_t)h->numel * sizeof *v);
    if (v) memcpy(v, h->data, (size_t)h->numel * sizeof *v);
    lk_tensor_release(h);
    return v;
}

static bool same_bits(const lk_tensor *a, const lk_tensor *b, const char *what) {
    float *ha = to_host(a), *hb = to_host(b);
    bool same = ha && hb && !memcmp(ha, hb, (size_t)a->numel * sizeof *ha);
    if (!ha || !hb) fprintf(stderr, "%s to host: %s\n", what, lk_last_error());
    for (int64_t i = 0; ha && hb && i < a->numel && !same; i++)
        if (memcmp(&ha[i], &hb[i], sizeof ha[i])) {
            fprintf(stderr, "%s: first difference at %lld: %.9g vs %.9g\n", what, (long long)i, ha[i], hb[i]);
            break;
        }
    free(ha), free(hb);
    return same;
}

/* ---- cases ------------------------------------------------------------------------ */

static void replay_equals_eager(void) {
    param_set eager = {0}, graphed = {0};
    CHECK_OK(make_set(&eager));
    CHECK_OK(make_set(&graphed));
    if (lk_t_case_failed) return;
    CHECK_OK(step(&eager)); /* the warm-up (file comment) */
    CHECK_OK(step(&graphed));
    for (int k = 0; k < K; k++) CHECK_OK(step(&eager));
    lk_tensor *before = lk_tensor_to(graphed.w, LK_DEVICE_CPU);
    CHECK(before != NULL);

    lk_graph *g = NULL;
    CHECK_OK(lk__device_graph_begin(dev));
    CHECK_OK(step(&graphed));
    CHECK_OK(lk__device_graph_end(dev, &g));
    CHECK(g != NULL);
    if (!g || !before) return;
    /* capturing records the step without running it */
    lk_tensor *after_capture = lk_tensor_to(graphed.w, LK_DEVICE_CPU);
    CHECK(after_capture && !memcmp(before->data, after_capture->data, (size_t)before->numel * sizeof(float)));
    lk_tensor_release(after_capture);

    for (int k = 0; k < K; k++) CHECK_OK(lk__device_graph_launch(dev, g));
    CHECK_OK(lk_device_synchronize(dev));
    CHECK_MSG(same_bits(eager.w, graphed.w, "w"), "w after %d replays differs from %d eager steps", K, K);
    CHECK_MSG(same_bits(eager.b, graphed.b, "b"), "b after %d replays differs from %d eager steps", K, K);
    /* and the replays did train: w moved from where the warm-up left it */
    lk_tensor *moved = lk_tensor_to(graphed.w, LK_DEVICE_CPU);
    CHECK(moved && memcmp(before->data, moved->data, (size_t)before->numel * sizeof(float)));
    printf("%d replays of a %s step equal %d eager steps bit for bit\n", K, dev_name, K);
    lk_tensor_release(moved);
    lk_tensor_release(before);
    lk__device_graph_free(dev, g);
    free_set(&eager), free_set(&graphed);
}

static void host_read_while_capturing(void) {
    param_set s = {0};
    CHECK_OK(make_set(&s));
    if (lk_t_case_failed) return;
    CHECK_OK(step(&s)); /* warm-up */
    float host[OUT * IN];
    CHECK_OK(lk__device_graph_begin(dev));
    CHECK_ERR(lk_device_copy(LK_DEVICE_CPU, host, dev, s.w->data, sizeof host), LK_STATUS_INVALID_USAGE,
              "is not allowed while capturing a graph");
    printf("the read's error: %s\n", lk_last_error());
    /* the refusal ended the capture: no graph, and the reason again */
    lk_graph *g = NULL;
    CHECK_ERR(lk__device_graph_end(dev, &g), LK_STATUS_INVALID_USAGE, "not allowed while capturing");
    CHECK(g == NULL);
    CHECK_ERR(lk__device_graph_end(dev, &g), LK_STATUS_INVALID_USAGE, "no capture");

    /* the device still works, eagerly and capturing */
    lk_tensor *before = lk_tensor_to(s.w, LK_DEVICE_CPU);
    CHECK_OK(step(&s));
    CHECK_OK(lk_device_synchronize(dev));
    lk_tensor *after = lk_tensor_to(s.w, LK_DEVICE_CPU);
    CHECK(before && after && memcmp(before->data, after->data, sizeof host));
    CHECK_OK(lk__device_graph_begin(dev));
    CHECK_OK(step(&s));
    CHECK_OK(lk__device_graph_end(dev, &g));
    if (g) CHECK_OK(lk__device_graph_launch(dev, g));
    CHECK_OK(lk_device_copy(LK_DEVICE_CPU, host, dev, s.w->data, sizeof host));
    CHECK(after && memcmp(after->data, host, sizeof host));
    lk__device_graph_free(dev, g);
    lk_tensor_release(before), lk_tensor_release(after);
    free_set(&s);
}

/* A tensor of a size the pool has never cached needs the device's own
 * allocation (cuda: cudaMalloc), which a capture cannot record. */
static void pool_miss_while_capturing(void) {
    const int64_t n = 1234567; /* no step of this file takes a block of this size */
    CHECK_OK(lk__device_graph_begin(dev));
    lk_clear_error();
    lk_tensor *big = lk_tensor_full(LK_F32, 1, &n, 1.0);
    CHECK_MSG(big == NULL && strstr(lk_last_error(), "not allowed while capturing"),
              "a pool miss while capturing: got %p, \"%s\"", (void *)big, lk_last_error());
    lk_graph *g = NULL;
    CHECK_ERR(lk__device_graph_end(dev, &g), LK_STATUS_INVALID_USAGE, "not allowed while capturing");
    CHECK(g == NULL);
    /* outside a capture the same allocation works, and the device computes */
    lk_tensor *again = lk_tensor_full(LK_F32, 1, &n, 3.0);
    CHECK(again != NULL);
    float last = 0;
    if (again) CHECK_OK(lk_device_copy(LK_DEVICE_CPU, &last, dev, (float *)again->data + n - 1, sizeof last));
    CHECK(last == 3.0f);
    lk_tensor_release(big), lk_tensor_release(again);
}

static const lk_t_case cases[] = {LK_TEST_CASE(replay_equals_eager), LK_TEST_CASE(host_read_while_capturing),
                                  LK_TEST_CASE(pool_miss_while_capturing)};
static int g_argc;
static char **g_argv;

static int run_cases(void) {
    make_data();
    return lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), g_argc, g_argv);
}

static int gpu_probe(void) {
    gpu_test_require();
    dev = (lk_device){LK_CUDA, 0};
    return run_cases();
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--sealed")) {
        dev = sealed_register_capturing(0);
        dev_name = "sealed_graph";
        g_argc = argc - 1, g_argv = argv + 1;
        return run_cases();
    }
    g_argc = argc, g_argv = argv;
    /* the child checks for a GPU (exit 77 without one): CUDA must not be initialised before the fork */
    return gpu_test_in_child(gpu_probe, "gpu_graph");
}

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
 * cuda device does — the tests' sealed device (memory the host cannot
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

/* ---- --sealed: a device that captures as cuda does ---------------------------- */

typedef enum { REC_OP, REC_MEMSET, REC_COPY } rec_kind;
typedef struct {
    rec_kind kind;
    lk_op_desc d;
    void *x[LK_OP_MAX_OPERANDS];
    void *dst;
    const void *src;
    int value;
    size_t bytes;
} rec_item;
struct lk_graph { /* the fake's graph: what was recorded */
    int n, cap;
    rec_item *items;
};
static lk_graph *recording; /* non-NULL while capturing (the tests capture from one thread) */
static bool rec_active;      /* between graph_begin and graph_end */
static char rec_why[256];    /* why an early refusal ended the capture */

static void rec_drop(lk_graph *g) {
    if (g) free(g->items);
    free(g);
}

static lk_status rec_refuse(const char *what) {
    snprintf(rec_why, sizeof rec_why, "sealed:0: %s is not allowed while capturing a graph; the capture was ended", what);
    rec_drop(recording);
    recording = NULL;
    return lk_error(LK_STATUS_INVALID_USAGE, "%s", rec_why);
}

static lk_status rec_push(rec_item it) {
    if (recording->n == recording->cap) {
        int cap = recording->cap ? 2 * recording->cap : 64;
        rec_item *p = realloc(recording->items, (size_t)cap * sizeof *p);
        if (!p) return lk_error(LK_STATUS_OUT_OF_MEMORY, "graph record: no memory");
        recording->items = p, recording->cap = cap;
    }
    recording->items[recording->n++] = it;
    return LK_STATUS_OK;
}

static lk_status rec_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    *ptr = NULL;
    return recording ? rec_refuse("an allocation (the pool had no cached block)") : sealed_alloc(ctx, index, bytes, ptr);
}
static void rec_free(void *ctx, int index, void *ptr, size_t bytes) {
    if (recording) (void)rec_refuse("a free of device memory");
    sealed_free(ctx, index, ptr, bytes);
}
static lk_status rec_memset(void *ctx, int index, void *ptr, int value, size_t bytes) {
    if (recording) return rec_push((rec_item){.kind = REC_MEMSET, .dst = ptr, .value = value, .bytes = bytes});
    return sealed_memset(ctx, index, ptr, value, bytes);
}
static lk_status rec_to_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    return recording ? rec_refuse("a copy to host") : sealed_to_host(ctx, index, dst, src, bytes);
}
static lk_status rec_from_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    return recording ? rec_refuse("a copy from host") : sealed_from_host(ctx, index, dst, src, bytes);
}
static lk_status rec_copy(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    if (recording) return rec_push((rec_item){.kind = REC_COPY, .dst = dst, .src = src, .bytes = bytes});
    return sealed_copy(ctx, index, dst, src, bytes);
}
static lk_status rec_sync(void *ctx, int index) {
    (void)ctx, (void)index;
    return recording ? rec_refuse("synchronize") : LK_STATUS_OK;
}
static lk_status rec_begin(void *ctx, int index) {
    (void)ctx, (void)index;
    if (rec_active) return lk_error(LK_STATUS_INVALID_USAGE, "sealed:0: already capturing");
    recording = calloc(1, sizeof *recording);
    rec_active = recording != NULL, rec_why[0] = 0;
    return recording ? LK_STATUS_OK : lk_error(LK_STATUS_OUT_OF_MEMORY, "graph record: no memory");
}
static lk_status rec_end(void *ctx, int index, lk_graph **out) {
    (void)ctx, (void)index;
    *out = NULL;
    if (!rec_active) return lk_error(LK_STATUS_INVALID_USAGE, "sealed:0: graph capture end: no capture in progress");
    rec_active = false;
    if (!recording) return lk_error(LK_STATUS_INVALID_USAGE, "sealed:0: graph capture failed, no graph: %s", rec_why);
    *out = recording;
    recording = NULL;
    return LK_STATUS_OK;
}
static lk_status rec_launch(void *ctx, int index, lk_graph *g) {
    for (int i = 0; i < g->n; i++) {
        const rec_item *it = &g->items[i];
        lk_status st = it->kind == REC_OP       ? sealed_be_run(&it->d, it->x)
                       : it->kind == REC_MEMSET ? sealed_memset(ctx, index, it->dst, it->value, it->bytes)
                                                : sealed_copy(ctx, index, it->dst, it->src, it->bytes);
        if (st) return st;
    }
    return LK_STATUS_OK;
}
static void rec_graph_free(void *ctx, int index, lk_graph *g) {
    (void)ctx, (void)index;
    rec_drop(g);
}

static const lk_device_vtable rec_vtable = {
    .name = "sealed-graph",
    .host_addressable = false,
    .count = sealed_count,
    .alloc = rec_alloc,
    .free = rec_free,
    .memset = rec_memset,
    .copy_to_host = rec_to_host,
    .copy_from_host = rec_from_host,
    .copy = rec_copy,
    .synchronize = rec_sync,
    .graph_begin = rec_begin,
    .graph_end = rec_end,
    .graph_launch = rec_launch,
    .graph_free = rec_graph_free,
};

static lk_status rec_be_run(const lk_op_desc *d, void *const *x) {
    if (!recording) return sealed_be_run(d, x);
    rec_item it = {.kind = REC_OP, .d = *d};
    for (int i = 0; i < lk__op_arity(d->op); i++) {
        if (x[i] && !sealed_owns(x[i], 1)) return rec_refuse("an op with an operand in host memory (a read into host memory)");
        it.x[i] = x[i];
    }
    return rec_push(it);
}
static const lk_backend rec_backend = {.name = "sealed-graph", .supports = sealed_be_supports, .run = rec_be_run};

static lk_device rec_device(void) {
    pthread_once(&sealed_once, sealed_init_once);
    lk_device_kind k = LK_CPU;
    if (lk_device_register(&rec_vtable, NULL, &k) || lk__backend_register(k, &rec_backend)) {
        fprintf(stderr, "sealed-graph device: %s\n", lk_last_error());
        exit(1);
    }
    return (lk_device){k, 0};
}

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
              "not allowed while capturing");
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
        dev = rec_device();
        dev_name = "sealed-graph";
        g_argc = argc - 1, g_argv = argv + 1;
        return run_cases();
    }
    g_argc = argc, g_argv = argv;
    /* the child checks for a GPU (exit 77 without one): CUDA must not be initialised before the fork */
    return gpu_test_in_child(gpu_probe, "gpu_graph");
}

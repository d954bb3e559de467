/* Benchmark (a program, not a timed test): the cnn's and ResNet-20's
 * training step (forward, cross entropy, backward, Adam) on one core,
 * against a bound for the same work (issue 49's ">= 85% of a bound that
 * counts those passes at measured memory bandwidth"):
 *
 *   - every convolution timed alone at the shape the step gave it (one
 *     recording forward wraps each layer's forward to see its input and
 *     output), forward plus the backward the step runs (dX only where the
 *     input needs a gradient, dW, db), through the faster of lockstep's two
 *     conv paths (oneDNN, im2col + GEMM);
 *   - the Linear head's GEMMs with cblas_sgemm;
 *   - the memory-bound passes around them, forward and backward, in f32
 *     elements of the tensor T they touch: batch norm 8T (forward: moments
 *     read x, the apply reads x and writes y; backward: the sums read dy and
 *     x, dx reads dy and x and writes; the same 8T with a ReLU fused in,
 *     whose mask a kernel could take from x), ReLU 5T (2T + 3T), the residual add
 *     6T (3T each way: the shortcut's gradient is added into the branch's),
 *     max pooling 2 (Tin + Tout), global average pooling 2 Tin;
 *   - Adam's 28 bytes per parameter;
 *
 * the bytes at the bandwidth of a triad over the step's largest activation
 * (where those passes run: mostly cache, not DRAM; the DRAM triad is
 * printed beside it). Times are process CPU time (the machine may be shared;
 * one thread, so CPU time is the one-core cost without descheduling).
 *
 *   build/tests/test_models_bench_convnets_smoke            the table (~1-2 min)
 *   build/tests/test_models_bench_convnets_smoke --quick    one short iteration (ctest)
 *   build/tests/test_models_bench_convnets_smoke --layers   the table, each convolution's time on each path
 *   build/tests/test_models_bench_convnets_smoke --bf16 [...]   any of these in bf16-mixed
 *   build/tests/test_models_bench_convnets_smoke --steps resnet 64 [n]   10 s (or n steps, the first two untimed) of that step
 *                                        alone (perf record), and its last loss in hex (bits between builds)
 */
#include <cblas.h>

#include "backend/backend_impl.h"
#include "models/bench_triad.h"
#include "nn/nn_fixtures.h"

static double now(void) { return lk_time_cpu(); }

/* --bf16: bf16-mixed (the step's forward and each convolution of the bound
 * under bf16 autocast; the passes' activations and gradients are bf16, 2
 * bytes an element in the bound) */
static lk_dtype amp = LK_F32;

/* ---- recording the step's layers ------------------------------------------------ */

typedef struct {
    lk_layer *l;
    const char *type;
    int64_t in[4], out[4];
    int in_nd, out_nd;
    bool in_grad; /* the step computes the input's gradient */
    bool identity; /* its forward returned its input: a ReLU fused into the batch norm before it */
} rec;

static struct {
    lk_layer *l;
    lk_layer_forward_fn fw;
} wraps[256];
static int nwraps, nrecs;
static rec recs[512];
static bool recording;

static lk_tensor *rec_forward(lk_layer *self, lk_tensor *x) {
    lk_layer_forward_fn fw = NULL;
    for (int i = 0; i < nwraps && !fw; i++)
        if (wraps[i].l == self) fw = wraps[i].fw;
    lk_tensor *y = fw(self, x);
    if (recording && x && y && nrecs < 512) {
        rec *r = &recs[nrecs++];
        *r = (rec){.l = self, .type = self->type, .in_nd = x->ndim, .out_nd = y->ndim, .in_grad = x->requires_grad,
                   .identity = y == x};
        for (int d = 0; d < x->ndim && d < 4; d++) r->in[d] = x->shape[d];
        for (int d = 0; d < y->ndim && d < 4; d++) r->out[d] = y->shape[d];
    }
    return y;
}

static bool is(const char *t, const char *name) { return !strcmp(t, name); }

static void wrap_tree(lk_layer *l) {
    static const char *const kinds[] = {"Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "AdaptiveAvgPool2d",
                                        "Linear", "BasicBlock", "Bottleneck", "Dropout"};
    bool hit = false;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) hit |= is(l->type, kinds[k]);
    bool seen = false;
    for (int i = 0; i < nwraps; i++) seen |= wraps[i].l == l;
    if (hit && !seen && nwraps < 256) {
        wraps[nwraps].l = l, wraps[nwraps].fw = l->forward, nwraps++;
        l->forward = rec_forward;
    }
    for (int i = 0; i < l->n_children; i++) wrap_tree(l->children[i].layer);
}

static int64_t numel(const int64_t *s, int nd) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= s[d];
    return n;
}

/* ---- the bound's parts ------------------------------------------------------------ */

typedef struct {
    lk_tensor *x, *w, *b, *gy;
    lk_conv2d_params p;
} conv_job;

static void conv_once(conv_job *c) {
    lk_scope_begin();
    if (amp != LK_F32) lk_autocast_enter(amp);
    lk_tensor *y = lk_conv2d(c->x, c->w, c->b, c->p);
    if (amp != LK_F32) lk_autocast_exit();
    if (!y || lk_backward_with(y, c->gy)) lk_panic("bench conv: %s", lk_last_error());
    lk_scope_end();
}

static bool layers; /* --layers: each convolution's time on each path */

/* Best CPU seconds of one forward + backward of the recorded conv, over
 * both conv paths. */
static double conv_bound(const rec *r, bool quick) {
    lk_tensor *w = lk_layer_get_tensor(r->l, "weight"), *b = lk_layer_get_tensor(r->l, "bias");
    int kh = (int)w->shape[2], pad = (kh - 1) / 2;
    int H = (int)r->in[2], OH = (int)r->out[2];
    int s = OH > 1 ? (H + 2 * pad - kh) / (OH - 1) : 1;
    if (s < 1) s = 1;
    if ((H + 2 * pad - kh) / s + 1 != OH) lk_panic("bench conv: cannot tell the stride of %s", r->type);
    lk_rng rng;
    lk_rng_init(&rng, 7, LK_RNG_USER, 0, 0);
    conv_job c = {0};
    c.p = (lk_conv2d_params){{s, s}, {pad, pad}, {1, 1}, 1};
    c.x = lk_tensor_randn(&rng, r->in_nd, r->in, 0, 1);
    c.w = lk_tensor_randn(&rng, w->ndim, w->shape, 0, 0.1f);
    c.b = b ? lk_tensor_zeros(LK_F32, b->ndim, b->shape) : NULL;
    c.gy = lk_tensor_randn(&rng, r->out_nd, r->out, 0, 1);
    if (amp != LK_F32) { /* in the step, a convolution's input (but the stem's) and dY come as bf16 */
        lk_tensor *xl = r->in[1] > 1 ? lk_tensor_cast(c.x, amp) : NULL, *gl = lk_tensor_cast(c.gy, amp);
        if (xl) lk_tensor_release(c.x), c.x = xl;
        lk_tensor_release(c.gy), c.gy = gl;
    }
    lk_tensor_set_requires_grad(c.x, r->in_grad);
    lk_tensor_set_requires_grad(c.w, true);
    if (c.b) lk_tensor_set_requires_grad(c.b, true);
    double best = 1e30, per[2] = {1e30, 1e30};
    for (int path = 0; path < 2; path++) {
        lk__cpu_conv_use(path ? LK__CONV_ONEDNN : LK__CONV_IM2COL);
        conv_once(&c); /* primitives, scratch */
        for (int k = 0; k < (quick ? 1 : 7); k++) {
            double t0 = now();
            conv_once(&c);
            double t = now() - t0;
            if (t < per[path]) per[path] = t;
        }
        if (per[path] < best) best = per[path];
    }
    if (layers)
        printf("  conv [%lld,%lld,%lld,%lld] -> %lld k%d s%d%s: im2col %.3f ms, onednn %.3f ms\n", (long long)r->in[0],
               (long long)r->in[1], (long long)r->in[2], (long long)r->in[3], (long long)r->out[1], kh, s,
               r->in_grad ? "" : " (no dX)", per[0] * 1e3, per[1] * 1e3);
    lk__cpu_conv_use(LK__CONV_AUTO);
    lk_tensor_release(c.x), lk_tensor_release(c.w), lk_tensor_release(c.b), lk_tensor_release(c.gy);
    return best;
}

/* The Linear's forward, weight gradient and (when needed) input gradient. */
static double linear_bound(const rec *r, bool quick) {
    int B = (int)r->in[0], in = (int)r->in[r->in_nd - 1], out = (int)r->out[r->out_nd - 1];
    size_t e = (size_t)(B > out ? B : out) * (size_t)(in > out ? in : out);
    float *A = lk_aligned_alloc(64, e * 4), *W = lk_aligned_alloc(64, e * 4), *C = lk_aligned_alloc(64, e * 4);
    nn_hfill(A, (int64_t)e, 1, -1, 1);
    nn_hfill(W, (int64_t)e, 2, -1, 1);
    double best = 1e30;
    for (int k = 0; k < (quick ? 1 : 9); k++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, out, in, 1, A, in, W, in, 0, C, out);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, B, 1, A, out, W, in, 0, C, in);
        if (r->in_grad) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, in, out, 1, A, out, W, in, 0, C, in);
        double t = now() - t0;
        if (t < best) best = t;
    }
    lk_aligned_free(A), lk_aligned_free(W), lk_aligned_free(C);
    return best;
}

/* f32 elements the memory-bound passes of a recorded layer move (see the top). */
static double pass_elements(const rec *r) {
    if (r->identity) return 0; /* a fused ReLU: no pass of its own, the batch norm's 8T covers the pair */
    double ti = (double)numel(r->in, r->in_nd), to = (double)numel(r->out, r->out_nd);
    if (is(r->type, "BatchNorm2d")) return 8 * to;
    if (is(r->type, "ReLU") || is(r->type, "Dropout")) return 5 * to;
    if (is(r->type, "BasicBlock") || is(r->type, "Bottleneck")) return 6 * to;
    if (is(r->type, "MaxPool2d")) return 2 * (ti + to);
    if (is(r->type, "AdaptiveAvgPool2d")) return 2 * ti;
    return 0;
}

/* ---- one model at one batch ------------------------------------------------------- */

/* --steps: only the step, for a profiler (perf record) to see it alone */
static bool steps_only;
static int steps_count; /* --steps' optional count (0: 10 s) */

static void bench_model(const char *model, const lk_model_kv *args, int nargs, int B, bool quick) {
    lk_layer *m = NULL;
    if (lk_model_create(model, args, nargs, 1, &m)) {
        fprintf(stderr, "%s\n", lk_last_error());
        lk_t_failed_checks++;
        return;
    }
    lk_named_tensors ps = {0};
    CHECK_OK(lk_layer_named_parameters(m, &ps));
    lk_optim_config cfg = lk_adam_config_default();
    lk_optimizer *o = NULL;
    CHECK_OK(lk_optimizer_create(&cfg, &ps, &o));
    int64_t P = lk_layer_num_parameters(m);
    lk_tensor *x = nn_htensor(5, 0, 1, LK_SHAPE(B, 1, 28, 28));
    lk_tensor *y = nn_hlabels(6, B, 10);
    nwraps = nrecs = 0;
    wrap_tree(m);
    double t_total = 0;
    int done = 0;
    float last_loss = 0;
    for (int it = 0; quick ? it < 2 : steps_count ? it < steps_count : (t_total < (steps_only ? 10.0 : 2.0) || done < 5);
         it++) {
        recording = it == 0;
        double t0 = now();
        lk_scope_begin();
        if (amp != LK_F32) lk_autocast_enter(amp);
        lk_tensor *loss = lk_cross_entropy(lk_layer_forward(m, x), y, NULL);
        if (amp != LK_F32) lk_autocast_exit();
        lk_optimizer_zero_grad(o, false);
        lk_status st = lk_backward(loss);
        if (!st) st = lk_optimizer_step(o);
        if (!st) last_loss = lk_tensor_item(loss);
        lk_scope_end();
        recording = false;
        if (st) {
            fprintf(stderr, "%s: %s\n", model, lk_last_error());
            lk_t_failed_checks++;
            break;
        }
        if (it >= 2 || quick) t_total += now() - t0, done++; /* two warm-up steps */
    }
    double t_step = t_total / (done ? done : 1);
    if (steps_only) {
        /* the last loss in hex: a count of steps gives a value to compare bit for bit between builds */
        printf("%-10s %5d step %.2f ms (%d steps), last loss %a\n", model, B, t_step * 1e3, done, (double)last_loss);
        nrecs = 0;
    }
    /* the passes' working set: the largest activation */
    double tmax = 0, elems = 0, t_conv = 0, t_lin = 0;
    for (int i = 0; i < nrecs; i++) {
        double to = (double)numel(recs[i].out, recs[i].out_nd);
        if (to > tmax) tmax = to;
        elems += pass_elements(&recs[i]);
        if (is(recs[i].type, "Conv2d")) t_conv += conv_bound(&recs[i], quick);
        if (is(recs[i].type, "Linear")) t_lin += linear_bound(&recs[i], quick);
    }
    double bw = steps_only ? 1 : bench_triad((size_t)tmax, quick ? 1 : 9);
    double t_pass = elems * (amp == LK_F32 ? 4 : 2) / bw, t_adam = 28.0 * (double)P / bw;
    double bound = t_conv + t_lin + t_pass + t_adam;
    if (!steps_only)
    printf("%-10s %5d %9.0f %9.0f %7.1f%%   %8.2f %8.2f %6.2f %8.2f %6.2f  %6.1f\n", model, B, B / t_step, B / bound,
           100.0 * bound / t_step, t_step * 1e3, t_conv * 1e3, t_lin * 1e3, t_pass * 1e3, t_adam * 1e3, bw * 1e-9);
    fflush(stdout);
    for (int i = 0; i < nwraps; i++) wraps[i].l->forward = wraps[i].fw;
    lk_tensor_release(x);
    lk_tensor_release(y);
    lk_optimizer_free(o);
    lk_named_tensors_clear(&ps);
    lk_layer_free(m);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bf16")) amp = LK_BF16, argc--, argv++;
    bool quick = argc > 1 && !strcmp(argv[1], "--quick");
    layers = argc > 1 && !strcmp(argv[1], "--layers");
    lk_set_num_threads(1);
    openblas_set_num_threads(1);
    lk_log_set_level(LK_LOG_WARN);
    printf("one core, %s; DRAM bandwidth (triad over 3 x 32 MiB) %.1f GB/s\n",
           amp == LK_F32 ? "f32" : "bf16-mixed", bench_triad((size_t)8 << 20, quick ? 1 : 5) * 1e-9);
    printf("%-10s %5s %9s %9s %8s   %8s %8s %6s %8s %6s  %6s\n", "model", "batch", "smp/s", "bound/s", "of bound",
           "step ms", "conv ms", "fc ms", "pass ms", "adam", "GB/s");
    static const lk_model_kv resnet[] = {{"depth", "20"}, {"width", "8"}, {"in_channels", "1"},
                                         {"image_size", "28"}, {"num_classes", "10"}};
    static const lk_model_kv cnn[] = {{"in_channels", "1"}, {"image_size", "28"}, {"num_classes", "10"}};
    /* --steps MODEL BATCH: 10 s of that model's step and nothing else (perf record) */
    if (argc > 3 && !strcmp(argv[1], "--steps")) {
        steps_only = true;
        bool r = !strcmp(argv[2], "resnet");
        steps_count = argc > 4 ? atoi(argv[4]) : 0;
        bench_model(argv[2], r ? resnet : cnn, r ? 5 : 3, atoi(argv[3]), false);
        return lk_t_failed_checks ? 1 : 0;
    }
    int batches[] = {64, 256};
    for (int bi = 0; bi < (quick ? 1 : 2); bi++) {
        bench_model("resnet", resnet, 5, quick ? 8 : batches[bi], quick);
        bench_model("cnn", cnn, 3, quick ? 8 : batches[bi], quick);
    }
    return lk_t_failed_checks ? 1 : 0;
}

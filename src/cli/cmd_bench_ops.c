/* `lockstep bench ops`: GEMM throughput through lk_matmul against calling
 * cblas_sgemm directly on the same buffers, the training step's GEMMs in
 * every precision, the optimizer's update, and the forward+backward time of
 * a 784-512-256-64 MLP in f32 and under bf16 autocast, on 1 to N compute
 * threads. A benchmark, never a test: it prints tables. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "cli/cli.h"
#include "lockstep.h"

static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Repeats `fn` until ~`budget` seconds pass (at least 5 runs), in 7 rounds;
 * returns the median seconds per call. */
typedef void (*bench_fn)(void *ctx);
static double time_it(bench_fn fn, void *ctx, double budget) {
    fn(ctx); /* warm-up: caches, pool, BLAS threads */
    double t0 = lk_time_now();
    fn(ctx);
    double one = lk_time_now() - t0;
    int reps = one > 0 ? (int)(budget / 7 / one) : 100;
    if (reps < 3) reps = 3;
    double r[7];
    for (int k = 0; k < 7; k++) {
        t0 = lk_time_now();
        for (int i = 0; i < reps; i++) fn(ctx);
        r[k] = (lk_time_now() - t0) / reps;
    }
    return median(r, 7);
}

typedef struct {
    int64_t M, K, N;
    bool trans_b;
    lk_tensor *a, *b, *bt, *c;
} gemm_ctx;

static void run_direct(void *p) {
    gemm_ctx *g = p;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans, (int)g->M, (int)g->N, (int)g->K,
                1.0f, g->a->data, (int)g->K, g->trans_b ? g->bt->data : g->b->data, g->trans_b ? (int)g->K : (int)g->N,
                0.0f, g->c->data, (int)g->N);
}

static void run_lockstep(void *p) {
    gemm_ctx *g = p;
    lk_scope_begin();
    lk_tensor *r = lk_matmul(g->a, g->trans_b ? lk_transpose(g->bt, 0, 1) : g->b);
    if (!r) lk_panic("matmul failed: %s", lk_last_error());
    lk_scope_end();
}

typedef struct {
    lk_tensor *x, *w[3], *b[3];
    lk_dtype autocast; /* LK_F32: none */
} mlp_ctx;

static void run_mlp(void *p) {
    mlp_ctx *m = p;
    lk_scope_begin();
    if (m->autocast != LK_F32) lk_autocast_enter(m->autocast);
    lk_tensor *h = m->x;
    for (int i = 0; i < 3; i++) {
        h = lk_linear(h, m->w[i], m->b[i]);
        if (i < 2) h = lk_relu(h);
    }
    lk_tensor *loss = lk_mean(lk_mul(h, h), NULL, 0, false);
    if (m->autocast != LK_F32) lk_autocast_exit();
    if (!loss || lk_backward(loss)) lk_panic("mlp step failed: %s", lk_last_error());
    lk_scope_end();
}

/* One typed GEMM (C = A B^T, A [M,K], B [N,K], C f32) over raw buffers. */
typedef struct {
    lk_op_desc d;
    void *a, *b, *c;
} typed_ctx;

static void run_typed(void *p) {
    typed_ctx *t = p;
    if (lk__backend_run(LK_DEVICE_CPU, &t->d, (void *[]){t->a, t->b, t->c})) lk_panic("gemm: %s", lk_last_error());
}

/* The same f32 GEMM through oneDNN instead of OpenBLAS (split across the
 * pool as the low-precision ones are): is oneDNN faster for f32 too? */
static void run_dnnl_f32(void *p) {
    typed_ctx *t = p;
    if (lk__cpu_gemm_dnnl(&t->d, t->a, t->b, t->c)) lk_panic("onednn f32 gemm: %s", lk_last_error());
}

/* The thread counts a table steps through: 1, 2, 4, ... and the process's own. */
static int next_width(int w, int threads) { return w < threads && 2 * w > threads ? threads : 2 * w; }

/* The optimizer's update: AdamW (torch 1.13's single-tensor formula, f32
 * state) over n f32 parameters as one typed op per range, the range cut for
 * `width` compute threads as lk_optimizer_step cuts a flat group. Per
 * element it reads parameter, gradient and both moments and writes back
 * three (28 bytes), with a square root and one division (the division by
 * the step's constant is a multiply and two FMAs: kernels/optim.h). */
typedef struct {
    lk_op_desc d;
    float *p, *g, *m, *v;
    int width;
} optim_ctx;

static void optim_task(void *p, int t) {
    optim_ctx *o = p;
    int64_t a, b;
    lk__task_range(o->d.optim.n, t, o->width, 16, &a, &b);
    lk_op_desc d = o->d;
    d.optim.n = b - a;
    if (b > a && lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){o->p + a, o->g + a, o->m + a, o->v + a, NULL}))
        lk_panic("optimizer update: %s", lk_last_error());
}

static void run_optim(void *p) {
    optim_ctx *o = p;
    lk__parallel_run(o->width, optim_task, o);
}

/* Whether the update is bound by memory or by its arithmetic: bench train's
 * mlp's 235,146 parameters (784-256-128-10; 3.8 MB with gradient and
 * moments, more than a core's L2) and 16,384 (in cache), on 1..N threads. */
static void optim_table(double budget) {
    static const int64_t sizes[] = {235146, 16384};
    int threads = lk_get_num_threads();
    printf("\noptimizer update, AdamW in f32 (28 bytes, a sqrt and a division per parameter):\n");
    printf("%-12s %8s %12s %10s %8s\n", "parameters", "threads", "us/update", "ns/param", "GB/s");
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t n = sizes[s];
        float *buf = lk_aligned_alloc(LK_ALIGN, 4 * (size_t)n * sizeof(float));
        if (!buf) lk_panic("bench ops: no memory for the optimizer's buffers");
        for (int64_t i = 0; i < n; i++) {
            buf[i] = 0.01f * (float)(i % 13);                 /* parameter */
            buf[n + i] = 1e-3f * (float)(i % 7 - 3) + 5e-4f; /* gradient, never 0: no subnormal moments */
            buf[2 * n + i] = 0.0f, buf[3 * n + i] = 1e-6f;   /* moments */
        }
        optim_ctx o = {{.op = LK_OP_OPTIM_UPDATE, .dtype = {LK_F32, LK_F32, LK_F32, LK_F32, LK_F32}},
                       buf, buf + n, buf + 2 * n, buf + 3 * n, 1};
        o.d.optim = (lk_optim_params){LK_OPTIM_RULE_ADAM, n, 10, 1e-3, 0, 0, 1e-2, 0.9, 0.999, 1e-8, 0, false, false, true};
        for (int w = 1; w <= threads; w = next_width(w, threads)) {
            lk_set_num_threads(w);
            o.width = lk__parallel_width(w);
            double t = time_it(run_optim, &o, budget / 2);
            printf("%-12lld %8d %12.1f %10.3f %8.1f\n", (long long)n, w, t * 1e6, t * 1e9 / (double)n,
                   28.0 * (double)n / t / 1e9);
        }
        lk_set_num_threads(threads);
        lk_aligned_free(buf);
    }
}

/* The GEMMs of bf16-mixed and 16-mixed against f32, at the shapes of a
 * training step (forward x W^T, backward dY W and dY^T X), same buffers sizes. */
static void lowp_table(double budget) {
    printf("\nlow-precision GEMMs (C in f32): bf16 path: %s\n", lk__cpu_gemm_path(LK_BF16, LK_F32));
    printf("                                 f16 path:  %s\n", lk__cpu_gemm_path(LK_F16, LK_F32));
    static const struct { int64_t M, N, K; bool ta, tb; const char *what; } shapes[] = {
        {256, 512, 784, false, true, "fwd 784->512, batch 256"},
        {256, 784, 512, false, false, "bwd dX 512->784"},
        {512, 784, 256, true, false, "bwd dW 784x512"},
        {256, 64, 256, false, true, "fwd 256->64"},
        {1024, 1024, 1024, false, true, "square 1024"},
    };
    printf("%-16s %-26s %10s %15s %10s %10s %11s %8s %8s\n", "shape (MxNxK)", "case", "f32 GF/s", "f32 onednn GF/s",
           "bf16 GF/s", "f16 GF/s", "onednn/f32", "bf16/f32", "f16/f32");
    lk_rng rng;
    lk_rng_init(&rng, 2, LK_RNG_USER, 0, 0);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
        size_t na = (size_t)(M * K), nb = (size_t)(K * N);
        float *a = lk_aligned_alloc(LK_ALIGN, na * 4), *b = lk_aligned_alloc(LK_ALIGN, nb * 4);
        float *c = lk_aligned_alloc(LK_ALIGN, (size_t)(M * N) * 4);
        uint16_t *ah = lk_aligned_alloc(LK_ALIGN, na * 2), *bh = lk_aligned_alloc(LK_ALIGN, nb * 2);
        for (size_t i = 0; i < na; i++) a[i] = lk_rng_normal(&rng);
        for (size_t i = 0; i < nb; i++) b[i] = lk_rng_normal(&rng);
        double rate[3];
        static const lk_dtype dts[3] = {LK_F32, LK_BF16, LK_F16};
        for (int k = 0; k < 3; k++) {
            typed_ctx t = {.d = {.op = LK_OP_GEMM, .dtype = {dts[k], dts[k], LK_F32}}, .a = a, .b = b, .c = c};
            if (dts[k] != LK_F32) {
                lk_f32_to_half_n(dts[k], ah, a, na);
                lk_f32_to_half_n(dts[k], bh, b, nb);
                t.a = ah, t.b = bh;
            }
            bool ta = shapes[s].ta, tb = shapes[s].tb;
            t.d.gemm = (lk_gemm_params){ta, tb, M, N, K, ta ? M : K, tb ? K : N, N, 1.0f, 0.0f};
            double best = time_it(run_typed, &t, budget / 3);
            rate[k] = 2.0 * (double)M * (double)N * (double)K / best / 1e9;
        }
        /* f32 x f32 -> f32 through oneDNN: measured only (training's f32
         * GEMMs stay on OpenBLAS); "-" where oneDNN has no fast code */
        double dnnl = 0;
        typed_ctx t = {.d = {.op = LK_OP_GEMM, .dtype = {LK_F32, LK_F32, LK_F32}}, .a = a, .b = b, .c = c};
        t.d.gemm = (lk_gemm_params){shapes[s].ta, shapes[s].tb, M, N, K, shapes[s].ta ? M : K, shapes[s].tb ? K : N, N,
                                    1.0f, 0.0f};
        if (lk__cpu_gemm_dnnl(&t.d, a, b, c) == LK_STATUS_OK)
            dnnl = 2.0 * (double)M * (double)N * (double)K / time_it(run_dnnl_f32, &t, budget / 3) / 1e9;
        else lk_clear_error();
        char sh[64], dn[32] = "-", dr[32] = "-";
        snprintf(sh, sizeof sh, "%lldx%lldx%lld", (long long)M, (long long)N, (long long)K);
        if (dnnl > 0) snprintf(dn, sizeof dn, "%.1f", dnnl), snprintf(dr, sizeof dr, "%.2fx", dnnl / rate[0]);
        printf("%-16s %-26s %10.1f %15s %10.1f %10.1f %11s %7.2fx %7.2fx\n", sh, shapes[s].what, rate[0], dn, rate[1],
               rate[2], dr, rate[1] / rate[0], rate[2] / rate[0]);
        lk_aligned_free(a), lk_aligned_free(b), lk_aligned_free(c), lk_aligned_free(ah), lk_aligned_free(bh);
    }
}

/* ---- causal self-attention: the fused op against the composed one -------------------- */

typedef struct {
    lk_tensor *qkv, *dy;
    int n_head;
    bool naive;
    size_t peak; /* bytes the forward+backward held at most above what was live before */
} attn_ctx;

static void run_attention(void *vctx) {
    attn_ctx *c = vctx;
    size_t base = lk_pool_reset_peak();
    lk_scope_begin();
    lk_tensor *y = c->naive ? lk_causal_self_attention_naive(c->qkv, c->n_head, 0, false, NULL)
                            : lk_causal_self_attention(c->qkv, c->n_head, 0, false, NULL);
    if (!y || lk_backward_with(y, c->dy)) {
        fprintf(stderr, "lockstep bench ops: attention: %s\n", lk_last_error());
        exit(1);
    }
    lk_scope_end();
    c->peak = lk_pool_get_stats().bytes_live_peak - base;
    lk_tensor_zero_grad(c->qkv, true);
}

/* Forward + backward of one attention layer (B 4, H 4, head 64: GPT-2
 * small's head width) at T = 64, 256, 1024: time, and the bytes each way
 * holds at its peak beyond its inputs (the naive one keeps the [B H, T, T]
 * probabilities, and builds the scores and their gradients beside them). */
static void attention_table(double budget) {
    const int64_t B = 4, H = 4, D = 64, C = H * D;
    static const int64_t Ts[] = {64, 256, 1024};
    printf("\ncausal self-attention, forward+backward, B %lld, %lld heads of %lld (f32, %d compute threads):\n",
           (long long)B, (long long)H, (long long)D, lk_get_num_threads());
    printf("%-6s %12s %12s %8s %14s %14s\n", "T", "fused ms", "naive ms", "speedup", "fused peak MB", "naive peak MB");
    lk_rng rng;
    lk_rng_init(&rng, 2, LK_RNG_USER, 0, 0);
    /* a smoke-test budget (the CLI test's 0.01 s) skips the T = 1024 row: seconds of work, minutes under ASan */
    size_t nT = budget < 0.2 ? 2 : sizeof Ts / sizeof Ts[0];
    for (size_t k = 0; k < nT; k++) {
        int64_t T = Ts[k];
        attn_ctx c[2];
        c[0].qkv = lk_tensor_randn(&rng, LK_SHAPE(B, T, 3 * C), 0, 1);
        c[0].dy = lk_tensor_randn(&rng, LK_SHAPE(B, T, C), 0, 1);
        lk_tensor_set_requires_grad(c[0].qkv, true);
        c[0].n_head = (int)H, c[0].naive = false, c[0].peak = 0;
        c[1] = c[0];
        c[1].naive = true;
        /* interleaved, the best of three passes each (a pass is long enough
         * to time on its own: T 1024 takes most of a second here) */
        double tf = 1e30, tn = 1e30;
        for (int r = 0; r < 3; r++) {
            double t0 = lk_time_now();
            run_attention(&c[0]);
            double t1 = lk_time_now();
            run_attention(&c[1]);
            double t2 = lk_time_now();
            tf = t1 - t0 < tf ? t1 - t0 : tf;
            tn = t2 - t1 < tn ? t2 - t1 : tn;
        }
        printf("%-6lld %12.2f %12.2f %7.2fx %14.1f %14.1f\n", (long long)T, tf * 1e3, tn * 1e3, tn / tf,
               (double)c[0].peak / 1048576.0, (double)c[1].peak / 1048576.0);
        lk_tensor_release(c[0].qkv);
        lk_tensor_release(c[0].dy);
    }
}

int lk_cmd_bench_ops(int argc, char **argv) {
    double budget = 1.0;
    bool attention_only = false, conv_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc) budget = atof(argv[++i]);
        else if (!strcmp(argv[i], "--attention")) attention_only = true;
        else if (!strcmp(argv[i], "--conv")) conv_only = true;
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: lockstep bench ops [--seconds S] [--attention | --conv]\n"
                   "GFLOP/s of lk_matmul vs direct cblas_sgemm on the same buffers (median of 7 rounds,\n"
                   "about S seconds per cell); the training step's GEMMs in f32 (OpenBLAS and oneDNN), bf16 and f16;\n"
                   "the optimizer's update (AdamW over the mlp's parameters, and over a set that fits in cache)\n"
                   "on 1 to N compute threads; and forward+backward time of a 784-512-256-64 MLP at batch 256,\n"
                   "in f32 and under bf16 autocast (bf16-mixed), on 1 to N compute threads; and causal\n"
                   "self-attention's forward+backward, fused against composed, at T = 64, 256, 1024\n"
                   "(--attention: that table only); --conv: only conv2d's im2col + GEMM against oneDNN on the\n"
                   "ResNet-20's and the cnn's layer shapes, forward and forward + backward, batch 64 and 256.\n");
            return 0;
        } else {
            fprintf(stderr, "lockstep bench ops: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    printf("BLAS: %s; lockstep compute threads: %d (GEMMs split by lockstep, BLAS single-threaded)\n",
           openblas_get_config(), lk_get_num_threads());
    if (attention_only) {
        attention_table(budget);
        return 0;
    }
    if (conv_only) {
        lk__bench_conv_table(budget);
        return 0;
    }
    static const struct { int64_t M, K, N; bool tb; const char *what; } shapes[] = {
        {256, 784, 512, false, "MLP layer 1 (x @ W)"},
        {256, 784, 512, true, "MLP layer 1 (x @ W^T view)"},
        {256, 1024, 1024, false, "wide layer"},
        {256, 1024, 1024, true, "wide layer, W^T view"},
        {512, 512, 512, false, "square 512"},
        {1024, 1024, 1024, false, "square 1024"},
        {64, 784, 512, true, "batch 64, W^T view"},
    };
    printf("\n%-16s %-28s %12s %12s %8s\n", "shape (MxKxN)", "case", "cblas GF/s", "lockstep GF/s", "ratio");
    lk_rng rng;
    lk_rng_init(&rng, 1, LK_RNG_USER, 0, 0);
    bool prev = lk_set_grad_enabled(false);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        gemm_ctx g = {shapes[s].M, shapes[s].K, shapes[s].N, shapes[s].tb, NULL, NULL, NULL, NULL};
        g.a = lk_tensor_randn(&rng, LK_SHAPE(g.M, g.K), 0, 1);
        g.b = lk_tensor_randn(&rng, LK_SHAPE(g.K, g.N), 0, 1);
        g.bt = lk_tensor_randn(&rng, LK_SHAPE(g.N, g.K), 0, 1);
        g.c = lk_tensor_zeros(LK_F32, LK_SHAPE(g.M, g.N));
        double flops = 2.0 * (double)g.M * (double)g.K * (double)g.N;
        /* interleave to share the machine's noise */
        double td = time_it(run_direct, &g, budget / 2), tl = time_it(run_lockstep, &g, budget / 2);
        double td2 = time_it(run_direct, &g, budget / 2), tl2 = time_it(run_lockstep, &g, budget / 2);
        td = td < td2 ? td : td2;
        tl = tl < tl2 ? tl : tl2;
        char sh[64];
        snprintf(sh, sizeof sh, "%lldx%lldx%lld", (long long)g.M, (long long)g.K, (long long)g.N);
        printf("%-16s %-28s %12.1f %12.1f %7.1f%%\n", sh, shapes[s].what, flops / td / 1e9, flops / tl / 1e9,
               100.0 * td / tl);
        lk_tensor_release(g.a);
        lk_tensor_release(g.b);
        lk_tensor_release(g.bt);
        lk_tensor_release(g.c);
    }
    lk_set_grad_enabled(prev);

    lowp_table(budget);
    optim_table(budget);

    mlp_ctx m;
    static const int64_t widths[] = {784, 512, 256, 64};
    m.x = lk_tensor_randn(&rng, LK_SHAPE(256, 784), 0, 1);
    double flops = 0;
    for (int i = 0; i < 3; i++) {
        m.w[i] = lk_tensor_randn(&rng, LK_SHAPE(widths[i + 1], widths[i]), 0, 0.05f);
        m.b[i] = lk_tensor_zeros(LK_F32, LK_SHAPE(widths[i + 1]));
        lk_tensor_set_requires_grad(m.w[i], true);
        lk_tensor_set_requires_grad(m.b[i], true);
        flops += 2.0 * 256 * (double)widths[i] * (double)widths[i + 1];
    }
    /* forward 1x, backward 2x (dW for all, dX for layers 2..3) */
    double total_flops = flops * 3 - 2.0 * 256 * 784 * 512;
    /* f32, then under bf16 autocast (bf16-mixed's forward and backward), on 1..N threads */
    int threads = lk_get_num_threads();
    printf("\nMLP 784-512-256-64, batch 256, forward+backward (%.0f MFLOP):\n", total_flops / 1e6);
    printf("%-10s %8s %10s %10s %12s\n", "precision", "threads", "ms/step", "GFLOP/s", "samples/s");
    for (int p = 0; p < 2; p++) {
        m.autocast = p ? LK_BF16 : LK_F32;
        for (int w = 1; w <= threads; w = next_width(w, threads)) {
            lk_set_num_threads(w);
            double t = time_it(run_mlp, &m, budget * 2);
            printf("%-10s %8d %10.3f %10.1f %12.0f\n", p ? "bf16-mixed" : "32-true", w, t * 1e3, total_flops / t / 1e9,
                   256 / t);
        }
        lk_set_num_threads(threads);
    }
    lk_tensor_release(m.x);
    for (int i = 0; i < 3; i++) {
        lk_tensor_release(m.w[i]);
        lk_tensor_release(m.b[i]);
    }
    attention_table(budget);
    return 0;
}

/* gemm_rate: the machine bound for one benchmark cell of bench/compare.
 * It times, with cblas_sgemm (OpenBLAS, the BLAS both lockstep and Debian's
 * PyTorch link), exactly the GEMMs one training step of the model needs at
 * the cell's per-rank batch — forward, input gradient (not for the first
 * layer: no one needs d(input)) and weight gradient of every Linear, and of
 * every convolution as its im2col GEMM — and the memory bandwidth of a
 * memcpy over the optimizer's working set. With --procs W it runs W copies
 * at once, each with the cell's BLAS threads, so the rates are those a rank
 * sees while the other ranks compete for cores, caches and memory.
 * Element-wise work (bias, ReLU, BN, pooling, im2col, loss) is left out on
 * purpose: the bound is what the GEMMs and the optimizer's bytes alone cost.
 *
 * Build: cc -O2 -o gemm_rate bench/gemm_rate.c -lopenblas -lpthread
 * Usage: gemm_rate MODEL BATCH [--threads T] [--procs W] [--seconds S]
 * Prints one JSON object (per-rank figures: the fastest repetition, of the
 * slowest copy when W > 1).
 *
 * Per shape, OpenBLAS against lockstep's own small-shape GEMM
 * (src/backend/cpu/gemm_small.c), one thread, the GPT's GEMMs one by one:
 *   cc -O2 -DLK_OWN -o gemm_rate bench/gemm_rate.c -Lbuild -llockstep -Wl,-rpath,$PWD/build -lopenblas -lpthread
 *   gemm_rate --shapes L,H,C,T,V BATCH [--seconds S]
 * (the same L,H,C,T,V as bench/compare-gpt: 4,4,128,64,256 is the small
 * GPT, 12,12,768,64,50304 GPT-2 124M): every linear's forward, input and
 * weight gradient at BATCH x T rows, and attention's six tile GEMMs of one
 * head at T (q, k, v strided by 3C as the kernel reads them), each the
 * fastest of its repetitions in the thread's CPU time, alternating the two
 * kernels. The own kernel's copy is this CPU's best; LK_CPU_ISA=avx2 (or
 * baseline) measures a lower one here. */
#define _GNU_SOURCE
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int ta, tb, m, n, k; /* row-major C[m,n] = op(A) op(B) */
    float *a, *b, *c;
} gemm;

#define MAXG 96 /* ResNet-20: 21 convolutions x 3 GEMMs + the head's 2 */
static gemm g[MAXG];
static int ng;
static long n_params;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *buf(long n) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
    if (!p) {
        fprintf(stderr, "gemm_rate: out of memory (%ld floats)\n", n);
        exit(1);
    }
    for (long i = 0; i < n; i++) p[i] = 0.01f * (float)((i * 7919) % 201 - 100);
    return p;
}

static void add(int ta, int tb, int m, int n, int k) {
    if (ng == MAXG) exit(1);
    gemm *x = &g[ng++];
    *x = (gemm){ta, tb, m, n, k, buf((long)m * k), buf((long)k * n), buf((long)m * n)};
}

/* A Linear(in, out) at batch rows: forward y = x W^T, dx = dy W, dW = dy^T x. */
static void linear(int rows, int in, int out, int first) {
    add(0, 1, rows, out, in);
    if (!first) add(0, 0, rows, in, out);
    add(1, 0, out, in, rows);
    n_params += (long)in * out + out;
}

/* A 3x3 convolution as im2col GEMMs: M = output pixels of the batch,
 * K = cin * 9, N = cout. */
static void conv(int batch, int cin, int cout, int hw, int first) {
    int m = batch * hw * hw, k = cin * 9;
    add(0, 1, m, cout, k);
    if (!first) add(0, 0, m, k, cout);
    add(1, 0, cout, k, m);
    n_params += (long)cout * k + cout + 2L * cout; /* + BN weight, bias */
}

/* A k x k convolution (no bias, + BatchNorm) as im2col GEMMs, hw the output's side. */
static void conv_k(int batch, int cin, int cout, int hw, int k, int first) {
    int m = batch * hw * hw, kk = cin * k * k;
    add(0, 1, m, cout, kk);
    if (!first) add(0, 0, m, kk, cout);
    add(1, 0, cout, kk, m);
    n_params += (long)cout * kk + 2L * cout;
}

static void run_gemms(void) {
    for (int i = 0; i < ng; i++) {
        gemm *x = &g[i];
        int lda = x->ta ? x->m : x->k, ldb = x->tb ? x->k : x->n;
        cblas_sgemm(CblasRowMajor, x->ta ? CblasTrans : CblasNoTrans, x->tb ? CblasTrans : CblasNoTrans, x->m, x->n,
                    x->k, 1.0f, x->a, lda, x->b, ldb, 0.0f, x->c, x->n);
    }
}

typedef struct {
    char *dst, *src;
    size_t n;
} part;

static void *copy_part(void *arg) {
    part *p = arg;
    memcpy(p->dst, p->src, p->n);
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The fastest repetition: on a shared machine other work only ever adds
 * time, and a bound wants what the hardware can do. */
static double fastest(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[0];
}

/* One rank's measurement: the fastest GEMM time per step and the best memcpy
 * bandwidth (bytes read + written per second) over the Adam working set. */
static void measure(int threads, double seconds, double *gemm_s, double *bw) {
    openblas_set_num_threads(threads);
    enum { MAXR = 4096 };
    static double t[MAXR];
    for (int w = 0; w < 3; w++) run_gemms();
    int r = 0;
    double t_end = now() + seconds;
    while (r < MAXR && (r < 5 || now() < t_end)) {
        double t0 = now();
        run_gemms();
        t[r++] = now() - t0;
    }
    *gemm_s = fastest(t, r);
    /* Adam moves 28 bytes per parameter; copy 14 B/param (read 14, write 14). */
    size_t bytes = (size_t)n_params * 14;
    char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) exit(1);
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    part parts[64];
    pthread_t th[64];
    if (threads > 64) threads = 64;
    size_t chunk = (bytes / (size_t)threads + 63) / 64 * 64;
    r = 0;
    t_end = now() + seconds / 2;
    while (r < MAXR && (r < 5 || now() < t_end)) {
        double t0 = now();
        for (int i = 0; i < threads; i++) {
            size_t off = (size_t)i * chunk < bytes ? (size_t)i * chunk : bytes;
            parts[i] = (part){dst + off, src + off, bytes - off < chunk ? bytes - off : chunk};
            if (i) pthread_create(&th[i], NULL, copy_part, &parts[i]);
        }
        copy_part(&parts[0]);
        for (int i = 1; i < threads; i++) pthread_join(th[i], NULL);
        t[r++] = now() - t0;
    }
    *bw = 2.0 * (double)bytes / fastest(t, r);
    free(src);
    free(dst);
}

#ifdef LK_OWN
#include <stdbool.h>
#include <stdint.h>
/* liblockstep's (src/backend/cpu/gemm_small.h): the copy for this CPU */
bool lk__cpu_sgemm_own(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* backend/isa.h's (the levels as int): which copy runs */
int lk__cpu_isa_init(void);
const char *lk__cpu_isa_name(int level);

/* This thread's CPU time: a shared machine's other work then adds no
 * preemption to a call, only what it does to the caches. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The fastest of at least 5 calls over `seconds` of one GEMM, own or
 * OpenBLAS, in the thread's CPU time. */
static double time_one(int own, int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb,
                       float beta, float *c, int ldc, double seconds) {
    double best = 1e30, t_end = now() + seconds;
    for (int r = 0; r < 5 || now() < t_end; r++) {
        double t0 = cpu_now();
        if (own) lk__cpu_sgemm_own(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
        else
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a,
                        lda, b, ldb, beta, c, ldc);
        double t = cpu_now() - t0;
        if (t > 0 && t < best) best = t; /* a rare 0 (a migration?) is no measurement */
    }
    return best;
}

static double tot_blas, tot_own;

static void row(const char *what, int ta, int tb, int m, int n, int k, int lda, int ldb, int ldc, float beta,
                double seconds) {
    float *a = buf((long)(ta ? k : m) * lda), *b = buf((long)(tb ? n : k) * ldb), *c = buf((long)m * ldc);
    double tb_s = 1e30, to_s = 1e30;
    for (int i = 0; i < 3; i++) { /* alternating, so a burst of load hits both */
        double x = time_one(0, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, seconds / 6);
        double y = time_one(1, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc, seconds / 6);
        if (x < tb_s) tb_s = x;
        if (y < to_s) to_s = y;
    }
    double f = 2.0 * m * n * k * 1e-9;
    printf("%-22s %c%c %6d %6d %6d %9.1f %9.1f %7.2fx\n", what, ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, f / tb_s,
           f / to_s, tb_s / to_s);
    tot_blas += tb_s, tot_own += to_s;
    free(a), free(b), free(c);
}

static int shapes(const char *spec, int batch, double seconds) {
    int L, H, C, T, V;
    if (sscanf(spec, "%d,%d,%d,%d,%d", &L, &H, &C, &T, &V) != 5 || L < 1 || H < 1 || C < 1 || T < 1 || V < 1 || C % H) {
        fprintf(stderr, "gemm_rate: --shapes %s: expected L,H,C,T,V (positive, C divisible by H)\n", spec);
        return 2;
    }
    int R = batch * T, D = C / H;
    printf("GEMM GFLOP/s, 1 thread (CPU time), OpenBLAS against lockstep's own, its %s copy (gpt %s, %d x %d tokens)\n",
           lk__cpu_isa_name(lk__cpu_isa_init()), spec, batch, T);
    printf("%-22s op %6s %6s %6s %9s %9s %8s\n", "gemm", "M", "N", "K", "openblas", "own", "speedup");
    static const struct { const char *name; int in, out; } lin[] = {
        {"c_attn", 1, 3}, {"attn.c_proj", 1, 1}, {"mlp.c_fc", 1, 4}, {"mlp.c_proj", 4, 1}};
    char what[64];
    for (int i = 0; i < 5; i++) {
        int in = i < 4 ? lin[i].in * C : C, out = i < 4 ? lin[i].out * C : V;
        const char *nm = i < 4 ? lin[i].name : "lm_head";
        snprintf(what, sizeof what, "%s fwd", nm);
        row(what, 0, 1, R, out, in, in, in, out, 0.0f, seconds);
        snprintf(what, sizeof what, "%s dx", nm);
        row(what, 0, 0, R, in, out, out, in, in, 0.0f, seconds);
        snprintf(what, sizeof what, "%s dW", nm);
        row(what, 1, 0, out, in, R, out, in, in, 1.0f, seconds);
    }
    double lin_b = tot_blas, lin_o = tot_own;
    /* attention, one head, T x T causal (the full tile: T <= 64 is one tile) */
    int ld = 3 * C;
    row("attn S = Q K^T", 0, 1, T, T, D, ld, ld, T, 0.0f, seconds);
    row("attn O = P V", 0, 0, T, D, T, T, ld, C, 0.0f, seconds);
    row("attn dV += P^T dO", 1, 0, T, D, T, T, C, ld, 1.0f, seconds);
    row("attn dP = dO V^T", 0, 1, T, T, D, C, ld, T, 0.0f, seconds);
    row("attn dQ = dS K", 0, 0, T, D, T, T, ld, ld, 0.0f, seconds);
    row("attn dK += dS^T Q", 1, 0, T, D, T, T, ld, ld, 1.0f, seconds);
    printf("linears (one layer + head): openblas %.3f ms, own %.3f ms (%.2fx); attention, one head: %.1f us, %.1f us "
           "(%.2fx)\n",
           1e3 * lin_b, 1e3 * lin_o, lin_b / lin_o, 1e6 * (tot_blas - lin_b), 1e6 * (tot_own - lin_o),
           (tot_blas - lin_b) / (tot_own - lin_o));
    return 0;
}
#endif

int main(int argc, char **argv) {
#ifdef LK_OWN
    if (argc >= 4 && !strcmp(argv[1], "--shapes")) {
        openblas_set_num_threads(1);
        return shapes(argv[2], atoi(argv[3]), argc >= 6 && !strcmp(argv[4], "--seconds") ? atof(argv[5]) : 0.6);
    }
#endif
    if (argc < 3) {
        fprintf(stderr, "usage: gemm_rate autoencoder|mlp|cnn|resnet BATCH [--threads T] [--procs W] [--seconds S]\n");
        return 2;
    }
    const char *model = argv[1];
    int batch = atoi(argv[2]), threads = 1, procs = 1;
    double seconds = 0.5;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--procs")) procs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else {
            fprintf(stderr, "gemm_rate: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (batch < 1 || threads < 1 || procs < 1 || procs > 64 || !(seconds > 0)) {
        fprintf(stderr, "gemm_rate: batch %d, threads %d, procs %d, seconds %g: expected positive values (procs <= 64)\n",
                batch, threads, procs, seconds);
        return 2;
    }
    if (!strcmp(model, "autoencoder")) {
        static const int w[] = {784, 512, 256, 64, 256, 512, 784};
        for (int i = 0; i < 6; i++) linear(batch, w[i], w[i + 1], i == 0);
    } else if (!strcmp(model, "mlp")) {
        static const int w[] = {784, 256, 128, 10};
        for (int i = 0; i < 3; i++) linear(batch, w[i], w[i + 1], i == 0);
    } else if (!strcmp(model, "cnn")) {
        conv(batch, 1, 32, 28, 1);
        conv(batch, 32, 64, 14, 0);
        linear(batch, 64 * 7 * 7, 128, 0);
        linear(batch, 128, 10, 0);
    } else if (!strcmp(model, "resnet")) { /* ResNet-20, width 8, 28x28 (bench/compare's resnet) */
        conv_k(batch, 1, 8, 28, 3, 1);
        for (int i = 0; i < 6; i++) conv_k(batch, 8, 8, 28, 3, 0);
        for (int s = 1, w = 16, hw = 14; s < 3; s++, w *= 2, hw /= 2) {
            conv_k(batch, w / 2, w, hw, 3, 0);
            conv_k(batch, w / 2, w, hw, 1, 0); /* the projection shortcut */
            for (int i = 0; i < 5; i++) conv_k(batch, w, w, hw, 3, 0);
        }
        linear(batch, 32, 10, 0);
    } else {
        fprintf(stderr, "gemm_rate: unknown model '%s' (expected autoencoder, mlp, cnn or resnet)\n", model);
        return 2;
    }
    double flops = 0;
    for (int i = 0; i < ng; i++) flops += 2.0 * g[i].m * g[i].n * g[i].k;

    /* W copies at once; a pipe holds them at the start line, another brings
     * their figures back. */
    int go[2], back[2];
    if (pipe(go) || pipe(back)) return 1;
    for (int p = 0; p < procs; p++) {
        pid_t pid = fork();
        if (pid < 0) return 1;
        if (pid == 0) {
            close(go[1]);
            char c;
            if (read(go[0], &c, 1) < 0) _exit(1);
            double gs, bw;
            measure(threads, seconds, &gs, &bw);
            double out[2] = {gs, bw};
            if (write(back[1], out, sizeof out) != (ssize_t)sizeof out) _exit(1);
            _exit(0);
        }
    }
    close(go[0]);
    close(go[1]); /* releases them together */
    close(back[1]);
    double worst_gemm = 0, worst_bw = 1e300;
    for (int p = 0; p < procs; p++) {
        double out[2];
        if (read(back[0], out, sizeof out) != (ssize_t)sizeof out) {
            fprintf(stderr, "gemm_rate: a measuring process failed\n");
            return 1;
        }
        if (out[0] > worst_gemm) worst_gemm = out[0];
        if (out[1] < worst_bw) worst_bw = out[1];
    }
    while (wait(NULL) > 0) {
    }
    double adam_s = 28.0 * (double)n_params / worst_bw;
    /* 2-rank shared-memory all-reduce, per rank: reduce half (read own and
     * peer half, write the sum: 6 B/param) then fetch the other half (read
     * and write: 4 B/param). A rank has cores/W cores busy with its own
     * backward, so none of it is taken as hidden. */
    double allreduce_s = procs > 1 ? 10.0 * (double)n_params / worst_bw : 0.0;
    printf("{\"model\": \"%s\", \"batch\": %d, \"threads\": %d, \"procs\": %d, \"params\": %ld, \"gemms\": %d, "
           "\"gemm_flops_per_sample\": %.0f, \"gemm_ms\": %.4f, \"gemm_gflops\": %.2f, \"bandwidth_gbs\": %.2f, "
           "\"adam_ms\": %.4f, \"allreduce_ms\": %.4f, \"bound_step_ms\": %.4f, \"bound_samples_per_s\": %.1f}\n",
           model, batch, threads, procs, n_params, ng, flops / batch, 1e3 * worst_gemm, flops / worst_gemm * 1e-9,
           worst_bw * 1e-9, 1e3 * adam_s, 1e3 * allreduce_s, 1e3 * (worst_gemm + adam_s + allreduce_s),
           (double)batch * procs / (worst_gemm + adam_s + allreduce_s));
    return 0;
}

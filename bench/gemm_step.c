/* gemm_step: the in-step GEMM rate, gemm_rate's companion. A shared library
 * loaded into a training run with LD_PRELOAD that stands in front of
 * OpenBLAS's cblas_sgemm (the f32 GEMM every lockstep op reaches on a CPU
 * without AMX: linear, matmul, attention's tiles), times every call by its
 * shape and layout, and at exit times each of the step's shapes again alone
 * — same transposes, same leading dimensions, same thread, warm caches — so
 * the step's rate and the isolated rate come from one process, one load.
 *
 * It also keeps the wall time during which at least one GEMM runs (so two
 * compute threads running GEMMs side by side count once): that over the
 * timed window is the GEMM share of the step.
 *
 * Build: cc -O2 -shared -fPIC -o gemm_step.so bench/gemm_step.c -ldl -lpthread
 * Use:   GEMM_STEP_SKIP_S=3 GEMM_STEP_OUT=gemm.txt LD_PRELOAD=./gemm_step.so lockstep fit ...
 *        (GEMM_STEP_SKIP_S: seconds after the first GEMM left out, the
 *        warm-up steps; GEMM_STEP_OUT: the table's file, else stderr;
 *        GEMM_STEP_ISOLATED=0: no isolated timing at exit.)
 * A benchmark helper, never linked into lockstep: with one process per rank
 * each rank writes its own table (the file name gets ".<pid>").
 * It sees only what reaches cblas_sgemm: the GEMMs that LK_GEMM=auto sends
 * to lockstep's own kernel (src/backend/cpu/gemm_small.c: attention's tiles,
 * the forward and input gradients of lk__cpu_gemm_own_rule) pass it by; run with
 * LK_GEMM=blas for every GEMM, or profile the own kernel with perf. */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void (*sgemm_fn)(const enum CBLAS_ORDER, const enum CBLAS_TRANSPOSE, const enum CBLAS_TRANSPOSE,
                         const blasint, const blasint, const blasint, const float, const float *, const blasint,
                         const float *, const blasint, const float, float *, const blasint);

typedef struct {
    int used, ta, tb, beta1; /* beta1: accumulates onto C (beta != 0) */
    int m, n, k, lda, ldb, ldc;
    long calls;
    double s; /* summed per-call wall time (two threads' calls both count) */
    double alone_s; /* isolated seconds per call, at exit */
} shape;

#define NSHAPE 4096
static shape tab[NSHAPE];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static sgemm_fn real;
static double t_first = -1, t_last, skip_s, busy_s, busy_t0;
static int active;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void find_real(void) {
    if (!real) real = (sgemm_fn)dlsym(RTLD_NEXT, "cblas_sgemm");
    if (!real) {
        fprintf(stderr, "gemm_step: no cblas_sgemm after this library (is the program linked with a BLAS?)\n");
        _exit(1);
    }
}

void cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                 const blasint m, const blasint n, const blasint k, const float alpha, const float *a,
                 const blasint lda, const float *b, const blasint ldb, const float beta, float *c, const blasint ldc) {
    find_real();
    pthread_mutex_lock(&mu);
    double t0 = now();
    if (t_first < 0) t_first = t0;
    bool timed = t0 - t_first >= skip_s;
    if (timed && active++ == 0) busy_t0 = t0;
    pthread_mutex_unlock(&mu);
    real(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    double t1 = now();
    if (!timed) return;
    int tA = ta != CblasNoTrans, tB = tb != CblasNoTrans, b1 = beta != 0.0f;
    if (order == CblasColMajor) { /* as the row-major product C^T = B^T A^T */
        int t = tA;
        tA = tB, tB = t;
    }
    uint64_t h = ((uint64_t)m * 1000003u) ^ ((uint64_t)n * 10007u) ^ ((uint64_t)k * 101u) ^ (uint64_t)lda * 7u ^
                 (uint64_t)ldb * 13u ^ (uint64_t)ldc * 17u ^ (uint64_t)(tA | tB << 1 | b1 << 2);
    pthread_mutex_lock(&mu);
    if (--active == 0) busy_s += t1 - busy_t0;
    t_last = t1;
    for (uint64_t i = 0; i < NSHAPE; i++) {
        shape *s = &tab[(h + i) % NSHAPE];
        if (!s->used) *s = (shape){1, tA, tB, b1, m, n, k, lda, ldb, ldc, 0, 0, 0};
        else if (s->ta != tA || s->tb != tB || s->beta1 != b1 || s->m != m || s->n != n || s->k != k ||
                 s->lda != lda || s->ldb != ldb || s->ldc != ldc)
            continue;
        s->calls++;
        s->s += t1 - t0;
        break;
    }
    pthread_mutex_unlock(&mu);
}

static double flops(const shape *s) { return 2.0 * s->m * s->n * s->k; }

static int by_time(const void *x, const void *y) {
    const shape *a = x, *b = y;
    return a->s < b->s ? 1 : a->s > b->s ? -1 : 0;
}

static float *filled(size_t n) {
    float *p = malloc(n * sizeof *p + 64);
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = 0.01f * (float)((i * 7919) % 201 - 100);
    return p;
}

/* The shape alone, its own buffers sized by its leading dimensions: the
 * fastest of 5 rounds of about 40 ms each (others' load only ever adds). */
static double alone(const shape *s) {
    size_t ra = s->ta ? s->k : s->m, rb = s->tb ? s->n : s->k;
    float *a = filled(ra * s->lda), *b = filled(rb * s->ldb), *c = filled((size_t)s->m * s->ldc);
    double best = 0;
    if (a && b && c) {
        real(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->m, s->n, s->k,
             1.0f, a, s->lda, b, s->ldb, s->beta1 ? 1.0f : 0.0f, c, s->ldc);
        double t0 = now();
        real(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->m, s->n, s->k,
             1.0f, a, s->lda, b, s->ldb, s->beta1 ? 1.0f : 0.0f, c, s->ldc);
        double one = now() - t0;
        long reps = one > 0 ? (long)(0.04 / one) : 1000;
        if (reps < 1) reps = 1;
        for (int r = 0; r < 5; r++) {
            t0 = now();
            for (long i = 0; i < reps; i++)
                real(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->m, s->n,
                     s->k, 1.0f, a, s->lda, b, s->ldb, s->beta1 ? 1.0f : 0.0f, c, s->ldc);
            double t = (now() - t0) / (double)reps;
            if (r == 0 || t < best) best = t;
        }
    }
    free(a), free(b), free(c);
    return best;
}

__attribute__((constructor)) static void init(void) {
    const char *e = getenv("GEMM_STEP_SKIP_S");
    skip_s = e ? atof(e) : 0.0;
}

__attribute__((destructor)) static void report(void) {
    if (t_first < 0 || !real) return;
    pthread_mutex_lock(&mu);
    shape *v = malloc(sizeof tab);
    int n = 0;
    double total = 0, fl = 0;
    for (int i = 0; v && i < NSHAPE; i++)
        if (tab[i].used && tab[i].calls) v[n++] = tab[i], total += tab[i].s, fl += flops(&tab[i]) * tab[i].calls;
    double window = t_last - t_first - skip_s;
    pthread_mutex_unlock(&mu);
    if (!v) return;
    qsort(v, (size_t)n, sizeof *v, by_time);
    const char *iso = getenv("GEMM_STEP_ISOLATED");
    bool isolated = !iso || strcmp(iso, "0");
    double alone_total = 0;
    for (int i = 0; i < n; i++) {
        v[i].alone_s = isolated ? alone(&v[i]) : 0;
        alone_total += v[i].alone_s * v[i].calls;
    }
    const char *out = getenv("GEMM_STEP_OUT");
    char path[4096];
    FILE *f = stderr;
    if (out && *out) {
        snprintf(path, sizeof path, "%s.%d", out, (int)getpid());
        f = fopen(path, "w");
        if (!f) f = stderr;
    }
    fprintf(f, "gemm_step: %d shapes, %.3f s of GEMM calls (%.3f s wall with any running) in a %.3f s window "
               "(%.1f%% of it), %.2f GFLOP/s in the step",
            n, total, busy_s, window, window > 0 ? 100 * busy_s / window : 0, total > 0 ? fl / total * 1e-9 : 0);
    if (isolated) fprintf(f, ", %.2f GFLOP/s alone (step / alone %.1f%%)", fl / alone_total * 1e-9, 100 * alone_total / total);
    fprintf(f, "\n%-3s %-2s %7s %7s %7s %6s %6s %6s %8s %9s %6s %9s %9s %7s\n", "op", "b", "M", "N", "K", "lda",
            "ldb", "ldc", "calls", "step ms", "share", "step GF/s", "alone GF/s", "ratio");
    for (int i = 0; i < n; i++) {
        const shape *s = &v[i];
        double gs = flops(s) * s->calls / s->s * 1e-9, ga = s->alone_s > 0 ? flops(s) / s->alone_s * 1e-9 : 0;
        fprintf(f, "%c%c  %-2d %7d %7d %7d %6d %6d %6d %8ld %9.2f %5.1f%% %9.2f %9.2f %6.0f%%\n", s->ta ? 'T' : 'N',
                s->tb ? 'T' : 'N', s->beta1, s->m, s->n, s->k, s->lda, s->ldb, s->ldc, s->calls, 1e3 * s->s,
                100 * s->s / total, gs, ga, ga > 0 ? 100 * gs / ga : 0);
    }
    if (f != stderr) fclose(f);
    free(v);
}

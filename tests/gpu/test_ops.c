/* The cuda backend against the CPU backend, descriptor by descriptor (as
 * ggml's test-backend-ops does): every family the cuda backend supports,
 * in f32 and, where it takes them, bf16 and f16 operands. Each case fills
 * every operand (inputs, in/out state and outputs alike) from one seeded
 * stream, runs the descriptor on the CPU backend over host copies and
 * through the registry on cuda:0 over device copies (so supports() and the
 * dispatch are tested too), and compares every operand afterwards: the
 * outputs, and the inputs, which must come back untouched.
 *
 * Tolerances, per case (|gpu - cpu| <= rtol |cpu| + mtol max|cpu|):
 *   - exact (0, 0), compared bit for bit: plain f32 arithmetic (+ - * /,
 *     sqrt, selections) is correctly rounded on both sides and the kernels
 *     are built with --fmad=false, the CPU without contraction; copies,
 *     counts and indices; 16-bit results of exact f32 values (one rounding
 *     each side, the same one); the row losses, whose sums one GPU thread
 *     runs in the CPU's order, except where they call logf;
 *   - T_TRANSC (1e-5, 1e-6, parity_ops' bound for libm against vectorised
 *     transcendentals): CUDA's expf/tanhf/erff/logf are within 2 ulp of
 *     glibc's, not equal to them, and derivatives that cross zero (gelu's,
 *     silu's) cancel, hence the floor relative to the largest magnitude;
 *   - T_SUM (1e-6, 1e-6): f32 sums the GPU cannot run in the CPU's order
 *     (none today) and double tree sums rounded to f32;
 *   - T_GEMM (1e-5, 1e-5) f32 GEMM (cuBLAS blocks K differently), and the
 *     16-bit GEMMs' tolerances of gpu_gemm.
 * A 16-bit output whose f32 value differs by a few ulp can round to the
 * neighbouring 16-bit value: one 16-bit ulp is added to those outputs'
 * relative tolerance. f64 norms: 1e-12 relative (double sums in another
 * order).
 *
 *     test_gpu_ops                 all cases
 *     test_gpu_ops xent_ sgd       only cases whose name starts so */
#include <math.h>
#include <stdarg.h>

#include "backend/cuda/cuda_impl.h"
#include "gpu_test.h"
#include "lk_test.h"
#include "lockstep/autograd.h"
#ifdef LK_OPS_ALL_BACKENDS
/* test_backend_ops (backend_ops): the same table on the backends every
 * build has, with no CUDA: the CPU backend's copy for each instruction set
 * below this CPU's best, and the tests' debug backend on the debug device,
 * each against the CPU backend at its best level. Nothing of cuda runs. */
#include "debug_backend.h"
#define CUDA_TAKES(d) true
#else
#define CUDA_TAKES(d) lk__cuda_backend.supports(d)
#endif

static const lk_device gpu0 = {LK_CUDA, 0};

typedef struct {
    double rtol, mtol;
} tol;
static const tol T_EXACT = {0, 0}, T_TRANSC = {1e-5, 1e-6}, T_SUM = {1e-6, 1e-6}, T_GEMM = {1e-5, 1e-5};
static const tol T_GEMM_BF16 = {0, 1e-2}, T_GEMM_F16 = {0, 2e-3};

/* How an operand starts: uniform in [-2, 2) or positive in [0.1, 2.1), each
 * times 2^k for k in -3..3,
 * integers in [0, max) (targets, indices), a 0/1 mask, or absent (NULL). */
typedef enum { I_RAND, I_POS, I_IDX, I_MASK, I_NULL } init_kind;
typedef struct {
    int64_t n;
    init_kind k;
    int64_t max;
} opnd;

typedef struct op_case {
    const char *name;
    lk_op_desc d;
    opnd o[LK_OP_MAX_OPERANDS];
    tol t;
    void (*fix)(const struct op_case *c, void **ops); /* adjusts the host inputs before both runs, or NULL */
    /* the second run's descriptor has its live fields overwritten (0xA5
     * bytes) and `live` pointing at lk__op_live_fill of the real one, in
     * device memory on a GPU (host memory for the emulation and --table):
     * the kernels must read their per-step values from there */
    bool live;
} op_case;

static uint32_t rng = 12345;
static float urand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffffff) / 16777216.0f;
}

static void fill(lk_dtype dt, const opnd *o, void *p) {
    for (int64_t i = 0; i < o->n; i++) {
        /* magnitudes over 2^-3 .. 2^3, so that sums round and their order shows */
        float v = (o->k == I_POS ? 0.1f + 2.0f * urand() : 4.0f * urand() - 2.0f) * ldexpf(1.0f, (int)(urand() * 7) - 3);
        int64_t iv = o->k == I_MASK ? urand() < 0.7f : o->k == I_IDX ? (int64_t)(urand() * (float)o->max) % o->max : 0;
        switch (dt) {
        case LK_F32: ((float *)p)[i] = v; break;
        case LK_F64: ((double *)p)[i] = v; break;
        case LK_BF16: ((uint16_t *)p)[i] = lk_f32_to_bf16_bits(v); break;
        case LK_F16: ((uint16_t *)p)[i] = lk_f32_to_f16_bits(v); break;
        case LK_I32: ((int32_t *)p)[i] = (int32_t)iv; break;
        case LK_I64: ((int64_t *)p)[i] = iv; break;
        case LK_U8: ((uint8_t *)p)[i] = (uint8_t)iv; break;
        default: break;
        }
    }
}

static double value(lk_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case LK_F32: return ((const float *)p)[i];
    case LK_F64: return ((const double *)p)[i];
    case LK_BF16: return lk_bf16_bits_to_f32(((const uint16_t *)p)[i]);
    case LK_F16: return lk_f16_bits_to_f32(((const uint16_t *)p)[i]);
    case LK_I32: return ((const int32_t *)p)[i];
    case LK_I64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static int cases_run, cases_bad;
/* --table: no GPU; the "gpu" side is the CPU backend again over host copies.
 * Checks the table itself on every CUDA build (each descriptor valid and run
 * by the CPU, taken by the cuda backend's supports(), compared exactly). */
static bool table_only;

#ifdef LK_GPU_OPS_EMU
/* test_gpu_ops_emu: the cuda backend's kernels compiled for the host
 * emulation (tests/gpu/emu/) under these names, run over host memory in
 * place of the CPU backend's second run. GEMM is cuBLASLt's, not ours: skipped. */
int lk__emu_elementwise(const lk_op_desc *d, void *const *x);
int lk__emu_rows(const lk_op_desc *d, void *const *x);
int lk__emu_optim(const lk_op_desc *d, void *const *x);
int lk__emu_conv(const lk_op_desc *d, void *const *x);
static lk_status emu_run(const lk_op_desc *d, void *const *x) {
    static const lk__cuda_launchers emu = {lk__emu_elementwise, lk__emu_rows, lk__emu_optim, lk__emu_conv};
    int e = lk__cuda_launcher_for(&emu, d->op)(d, x);
    return e ? lk_error(LK_STATUS_DEVICE, "emulated launch failed: %d", e) : LK_STATUS_OK;
}
#define SECOND_RUN(d, x) emu_run(d, x)
#elif defined(LK_OPS_ALL_BACKENDS)
/* The backend under test for this pass over the table (main). */
static lk_status (*second_run)(const lk_op_desc *d, void *const *x);
static const char *second_name = "cpu";
#define SECOND_RUN(d, x) second_run(d, x)
#else
#define SECOND_RUN(d, x) lk__cpu_backend.run(d, x)
#endif

/* Operand i after both runs: element-wise within the case's tolerance. */
#ifdef LK_OPS_ALL_BACKENDS
/* The debug backend's sum-to adds each element straight into its
 * destination (debug_backend.h), not in the CPU's order: T_SUM for it. */
static bool sums_reordered;
#endif
static bool compare(const op_case *c, int i, const void *cpu, const void *gpu) {
    lk_dtype dt = c->d.dtype[i];
    size_t es = lk_dtype_size(dt);
    tol t = c->t;
#ifdef LK_OPS_ALL_BACKENDS
    if (sums_reordered && c->d.op == LK_OP_SUM_TO && t.rtol < T_SUM.rtol) t = T_SUM;
#endif
    bool exact = (t.rtol == 0 && t.mtol == 0) || dt == LK_I32 || dt == LK_I64 || dt == LK_U8;
    double rtol = t.rtol, maxref = 0;
    if (dt == LK_BF16 && !exact) rtol += 1.0 / 128;
    if (dt == LK_F16 && !exact) rtol += 1.0 / 1024;
    if (dt == LK_F64) rtol += 1e-12;
    for (int64_t k = 0; k < c->o[i].n; k++) {
        double r = fabs(value(dt, cpu, k));
        if (r > maxref && !isinf(r)) maxref = r;
    }
    for (int64_t k = 0; k < c->o[i].n; k++) {
        double want = value(dt, cpu, k), got = value(dt, gpu, k);
        bool ok;
        if (exact) ok = !memcmp((const char *)cpu + k * es, (const char *)gpu + k * es, es) || (isnan(want) && isnan(got));
        else if (isnan(want) || isnan(got)) ok = isnan(want) && isnan(got);
        else if (isinf(want) || isinf(got)) ok = want == got;
        else ok = fabs(got - want) <= rtol * fabs(want) + t.mtol * maxref;
        if (!ok) {
#ifdef LK_OPS_ALL_BACKENDS
            fprintf(stderr, "%s: operand %d (%s), element %lld: %s %.9g, cpu %.9g (rtol %g, mtol %g of max %g)\n",
                    c->name, i, lk_dtype_name(dt), (long long)k, second_name, got, want, rtol, t.mtol, maxref);
#else
            fprintf(stderr, "%s: operand %d (%s), element %lld: gpu %.9g, cpu %.9g (rtol %g, mtol %g of max %g)\n",
                    c->name, i, lk_dtype_name(dt), (long long)k, got, want, rtol, t.mtol, maxref);
#endif
            return false;
        }
    }
    return true;
}

static void run_case(const op_case *c) {
    int arity = lk__op_arity(c->d.op);
    void *host[LK_OP_MAX_OPERANDS] = {NULL}, *cpu[LK_OP_MAX_OPERANDS] = {NULL}, *gops[LK_OP_MAX_OPERANDS] = {NULL},
         *back[LK_OP_MAX_OPERANDS] = {NULL};
    size_t bytes[LK_OP_MAX_OPERANDS] = {0};
    char what[160];
    lk__op_desc_str(&c->d, what, sizeof what);
    cases_run++;
    int bad0 = lk_t_failed_checks;
    lk_op_desc d2 = c->d; /* the second run's */
    unsigned char live_h[256];
    void *live_dev = NULL;
    size_t live_n = c->live ? lk__op_live_size(&c->d) : 0;
    if (c->live) {
        CHECK_MSG(live_n > 0 && live_n <= sizeof live_h, "%s: live size %zu", c->name, live_n);
        if (live_n > sizeof live_h) live_n = sizeof live_h;
        lk__op_live_fill(&c->d, live_h);
        const lk_op_info *oi = lk__op_info(c->d.op);
        for (int f = 0; f < oi->n; f++)
            if (oi->f[f].live) memset((char *)&d2 + oi->f[f].off, 0xa5, oi->f[f].size);
        if (table_only) d2.live = live_h;
        else {
            CHECK_OK(lk_device_alloc(gpu0, live_n, &live_dev));
            CHECK_OK(lk_device_copy(gpu0, live_dev, LK_DEVICE_CPU, live_h, live_n));
            d2.live = live_dev;
        }
    }
    CHECK_MSG(CUDA_TAKES(&d2), "%s: the cuda backend does not take %s", c->name, what);
    for (int i = 0; i < arity; i++) {
        if (c->o[i].k == I_NULL) continue;
        bytes[i] = (size_t)c->o[i].n * lk_dtype_size(c->d.dtype[i]);
        size_t b = bytes[i] ? bytes[i] : 1;
        host[i] = malloc(b), cpu[i] = malloc(b), back[i] = malloc(b);
        fill(c->d.dtype[i], &c->o[i], host[i]);
    }
    if (c->fix) c->fix(c, host);
    for (int i = 0; i < arity; i++) {
        if (!host[i]) continue;
        memcpy(cpu[i], host[i], bytes[i]);
        if (table_only || lk__cuda_host_operand(&c->d, i)) {
            gops[i] = back[i]; /* a host result: the op writes it there */
            memcpy(back[i], host[i], bytes[i]);
            continue;
        }
        CHECK_OK(lk_device_alloc(gpu0, bytes[i] ? bytes[i] : 1, &gops[i]));
        if (bytes[i]) CHECK_OK(lk_device_copy(gpu0, gops[i], LK_DEVICE_CPU, host[i], bytes[i]));
    }
    CHECK_OK(lk__cpu_backend.run(&c->d, cpu));
    lk_status st = table_only ? SECOND_RUN(&d2, gops) : lk__backend_run(gpu0, &d2, gops);
#ifdef LK_OPS_ALL_BACKENDS
    CHECK_MSG(st == LK_STATUS_OK, "%s (%s) on the %s backend: %s", c->name, what, second_name, lk_last_error());
#else
    CHECK_MSG(st == LK_STATUS_OK, "%s (%s) on cuda:0: %s", c->name, what, lk_last_error());
#endif
    if (!table_only) CHECK_OK(lk_device_synchronize(gpu0));
    for (int i = 0; i < arity && st == LK_STATUS_OK; i++) {
        if (!host[i]) continue;
        if (!table_only && !lk__cuda_host_operand(&c->d, i) && bytes[i])
            CHECK_OK(lk_device_copy(LK_DEVICE_CPU, back[i], gpu0, gops[i], bytes[i]));
        CHECK_MSG(compare(c, i, cpu[i], back[i]), "%s (%s): operand %d differs", c->name, what, i);
    }
    for (int i = 0; i < arity; i++) {
        if (gops[i] && !table_only && !lk__cuda_host_operand(&c->d, i)) lk_device_free(gpu0, gops[i], bytes[i] ? bytes[i] : 1);
        free(host[i]), free(cpu[i]), free(back[i]);
    }
    if (live_dev) lk_device_free(gpu0, live_dev, live_n);
    if (lk_t_failed_checks != bad0) cases_bad++;
    else printf("ok   %s (%s)\n", c->name, what);
}

/* ---- the case table ------------------------------------------------------------ */

#define MAXC 416
static op_case table[MAXC];
static int ncases;

static op_case *add(const char *name, lk_op_kind op, tol t) {
    if (ncases == MAXC) { /* a table that outgrew MAXC must fail loudly, not overwrite memory */
        fprintf(stderr, "gpu_ops: more than %d cases: raise MAXC\n", MAXC);
        exit(1);
    }
    op_case *c = &table[ncases++];
    memset(c, 0, sizeof *c);
    c->name = name, c->d.op = op, c->t = t;
    return c;
}
static void dts(op_case *c, lk_dtype a, lk_dtype b, lk_dtype x, lk_dtype y) {
    c->d.dtype[0] = a, c->d.dtype[1] = b, c->d.dtype[2] = x, c->d.dtype[3] = y;
}
static void ops(op_case *c, int i, int64_t n, init_kind k, int64_t max) { c->o[i] = (opnd){n, k, max}; }

/* Attention's backward on the y and lse its forward gives for these qkv
 * (random ones would overflow exp(s - lse)): the forward's row bodies run
 * here over a widened copy, y rounded to the case's dtype. */
static void attention_consistent(const op_case *c, void **h) {
    const lk_attention_params *a = &c->d.attention;
    int64_t n = a->B * a->T * a->H * a->D;
    bool half = c->d.dtype[0] != LK_F32;
    float *q = malloc((size_t)(4 * n) * sizeof *q), *y = q + 3 * n;
    for (int64_t i = 0; i < 3 * n; i++) q[i] = half ? lk_bf16_bits_to_f32(((uint16_t *)h[0])[i]) : ((float *)h[0])[i];
    for (int64_t r = 0; r < a->B * a->H * a->T; r++)
        lk_k_attn_forward_row(q, y, h[2], a->T, a->H, a->D, a->scale, a->key, a->ctr, a->thr, a->keep_scale,
                              r / a->T / a->H, r / a->T % a->H, r % a->T);
    for (int64_t i = 0; i < n; i++) {
        if (half) ((uint16_t *)h[1])[i] = lk_f32_to_bf16_bits(y[i]);
        else ((float *)h[1])[i] = y[i];
    }
    free(q);
}

/* SyncBatchNorm's finish on sums a forward all-reduce could give: the
 * count (70, over two ranks of [5, C, 7]) after the [2C] sums, a sum of
 * squares at least sum^2 / count (a variance >= 0), and one channel whose
 * rounding goes below it (the clamp at 0); the backward's count operand. */
static void bn_finish_sums(const op_case *c, void **h) {
    long C = c->d.bn_finish.C;
    double *v = h[0], M = 70.0;
    if (c->d.op == LK_OP_BN_FINISH_BACKWARD) {
        *(double *)h[2] = M;
        return;
    }
    for (long k = 0; k < C; k++) v[C + k] = fabs(v[C + k]) * M + v[k] * v[k] / M;
    v[C] = v[0] * v[0] / M * (1.0 - 1e-15);
    v[2 * C] = M;
}

/* The non-finite ops need some: an inf at 777 and a NaN at 1500. */
static void put_nonfinite(const op_case *c, void **h) {
    (void)c;
    ((float *)h[0])[777] = INFINITY;
    ((float *)h[0])[1500] = NAN;
}
/* The same in a bf16 or f16 gradient (the *-true precisions' clipping). */
static void put_nonfinite_half(const op_case *c, void **h) {
    bool bf = c->d.dtype[0] == LK_BF16;
    ((uint16_t *)h[0])[777] = bf ? 0x7f80 : 0x7c00;  /* +inf */
    ((uint16_t *)h[0])[1500] = bf ? 0x7fc0 : 0x7e00; /* NaN */
}
/* Accuracy's logits [300, 7]: ties (rows of one value, and the maximum
 * twice) and NaN first or inside a row, in any float dtype, so that the
 * tie and NaN rules are compared too. */
static void put_ties(const op_case *c, void **h) {
    int64_t C = c->d.accuracy.C;
    size_t es = c->d.dtype[0] == LK_F32 ? 4 : 2;
    char *x = h[0];
    uint16_t nan16 = c->d.dtype[0] == LK_BF16 ? 0x7fc0 : 0x7e00;
    float nan32 = NAN;
    for (int64_t r = 0; r < c->d.accuracy.N; r++) {
        char *row = x + (size_t)(r * C) * es;
        if (r % 5 == 0)
            for (int64_t k = 1; k < C; k++) memcpy(row + (size_t)k * es, row, es); /* all tied: class 0 */
        if (r % 5 == 1) memcpy(row + 4 * es, row + 2 * es, es); /* one pair tied */
        if (r % 7 == 2) memcpy(row, es == 4 ? (const void *)&nan32 : (const void *)&nan16, es);
        if (r % 11 == 3) memcpy(row + 3 * es, es == 4 ? (const void *)&nan32 : (const void *)&nan16, es);
    }
}
/* Integer sources past float's 24 bits (an i64 -> f32 cast rounds, an i64
 * -> i32 keeps the low bits), and negative ones. */
static void big_ints(const op_case *c, void **h) {
    for (int64_t i = 0; i < c->o[0].n; i += 7) {
        int64_t v = (i & 8 ? -1 : 1) * (((int64_t)1 << (c->d.dtype[0] == LK_I64 ? 40 : 25)) + 3 * i + 1);
        if (c->d.dtype[0] == LK_I64) ((int64_t *)h[0])[i] = v;
        else if (c->d.dtype[0] == LK_I32) ((int32_t *)h[0])[i] = (int32_t)v;
    }
}
/* Cross-entropy / nll: rows 2 and 5 ignored (ignore_index 3 placed there). */
static void put_ignored(const op_case *c, void **h) {
    int ti = c->d.op == LK_OP_NLL_BACKWARD ? 0 : 1;
    if (c->d.dtype[ti] == LK_I64) ((int64_t *)h[ti])[2] = ((int64_t *)h[ti])[5] = c->d.xent.ignore_index;
    else ((int32_t *)h[ti])[2] = ((int32_t *)h[ti])[5] = (int32_t)c->d.xent.ignore_index;
}

/* BCE on probabilities: inputs in (0, 1) and targets in [0, 1]. */
static void probabilities(const op_case *c, void **h) {
    float *x = h[0], *t = h[1];
    for (int64_t i = 0; i < c->o[0].n; i++) {
        x[i] = 0.01f + 0.98f * (float)(i * 37 % 101) / 101.0f;
        t[i] = (float)(i * 13 % 7) / 6.0f;
    }
}

static const char *const unary_names[LK_UNARY_COUNT] = {"relu", "gelu_tanh", "gelu_exact", "tanh", "sigmoid",
                                                        "exp",  "log",       "sqrt",       "abs",  "leaky_relu",
                                                        "elu",  "silu",      "neg"};

/* A case's name, kept for the table's lifetime. */
static const char *case_name(const char *fmt, ...) {
    static char names[MAXC][64];
    static int nn;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(names[nn], sizeof names[nn], fmt, ap);
    va_end(ap);
    return names[nn++];
}

/* The bf16/f16 forms the CPU backend takes in the families whose f32 cases
 * are above: autocast's (16-bit activations, f32 parameters and
 * statistics) and the *-true precisions' (16-bit parameters too), and
 * SyncBatchNorm's passes in f32 and 16-bit. Exact: the cuda backend widens
 * exactly as the CPU does, runs the same f32 bodies in the same order and
 * rounds once. */
/* Every case of an op kind with per-step values again, those values read
 * from `live` (op_case.live): the same bits as the CPU's eager run. */
static void add_live_forms(void) {
    int n = ncases;
    for (int i = 0; i < n; i++) {
        if (!lk__op_live_size(&table[i].d)) continue;
        op_case *c = add(case_name("%s_live", table[i].name), table[i].d.op, table[i].t);
        const char *name = c->name;
        *c = table[i];
        c->name = name, c->live = true;
    }
}

static void add_half_forms(void) {
#define NAME(...) case_name(__VA_ARGS__)
    static const lk_dtype hd[2] = {LK_BF16, LK_F16};
    op_case *c;
    /* pooling, every kind both ways; the f16 adaptive backward with an f32 dY */
    static const char *const pool_names[] = {"max_pool", "avg_pool", "avg_pool_no_pad_count", "adaptive_avg_pool"};
    for (int k = 0; k < 4; k++)
        for (int bwd = 0; bwd < 2; bwd++)
            for (int h = 0; h < 2; h++) {
                lk_pool_kind kind = k == 0 ? LK_POOL_MAX : k == 3 ? LK_POOL_ADAPTIVE_AVG : LK_POOL_AVG;
                long OH = k == 3 ? 3 : 4, OW = 5, no = 6 * OH * OW, ni = 6 * 7 * 8;
                lk_dtype t = hd[h];
                c = add(NAME("%s%s_%s", pool_names[k], bwd ? "_backward" : "", lk_dtype_name(t)),
                        bwd ? LK_OP_POOL2D_BACKWARD : LK_OP_POOL2D, T_EXACT);
                c->d.pool = (lk_pool_params){kind, 6, 7, 8, OH, OW, 3, 2, 2, 2, 1, 1, k != 2};
                if (bwd) {
                    dts(c, k == 3 && h ? LK_F32 : t, kind == LK_POOL_MAX ? LK_I32 : LK_F32, t, 0);
                    ops(c, 0, no, I_RAND, 0), ops(c, 1, no, kind == LK_POOL_MAX ? I_IDX : I_NULL, 7 * 8);
                    ops(c, 2, ni, I_RAND, 0);
                } else {
                    dts(c, t, t, kind == LK_POOL_MAX ? LK_I32 : LK_F32, 0);
                    ops(c, 0, ni, I_RAND, 0), ops(c, 1, no, I_RAND, 0);
                    ops(c, 2, no, kind == LK_POOL_MAX ? I_IDX : I_NULL, 1);
                }
            }
    /* layer norm: autocast (bf16 x, f32 w/b, dw/db) and f16-true (every operand but the stats) */
    for (int k = 0; k < 4; k++) {
        bool bwd = k >= 2, truth = k & 1;
        lk_dtype t = truth ? LK_F16 : LK_BF16, pt = truth ? LK_F16 : LK_F32;
        c = add(NAME("layer_norm_affine%s_%s%s", bwd ? "_backward" : "", lk_dtype_name(t), truth ? "_true" : ""),
                bwd ? LK_OP_LAYER_NORM_BACKWARD : LK_OP_LAYER_NORM, T_EXACT);
        c->d.layer_norm = (lk_layer_norm_params){37, 45, 1e-5f};
        if (!bwd) { /* x, w, b, y, stats */
            for (int i = 0; i < 5; i++) c->d.dtype[i] = i == 0 || i == 3 ? t : i == 4 ? LK_F32 : pt;
            ops(c, 0, 37 * 45, I_RAND, 0), ops(c, 1, 45, I_RAND, 0), ops(c, 2, 45, I_RAND, 0);
            ops(c, 3, 37 * 45, I_RAND, 0), ops(c, 4, 74, I_RAND, 0);
        } else { /* x, dy, stats, w, dx, dw, db */
            for (int i = 0; i < 7; i++) c->d.dtype[i] = i <= 1 || i == 4 ? t : i == 2 ? LK_F32 : pt;
            ops(c, 0, 37 * 45, I_RAND, 0), ops(c, 1, 37 * 45, I_RAND, 0), ops(c, 2, 74, I_POS, 0);
            ops(c, 3, 45, I_RAND, 0), ops(c, 4, 37 * 45, I_RAND, 0), ops(c, 5, 45, I_RAND, 0), ops(c, 6, 45, I_RAND, 0);
        }
    }
    /* batch norm [5, 6, 7]: autocast (bf16 x, f32 parameters) and f16-true (16-bit parameters and running
     * statistics at their strides), training and eval, both directions */
    for (int k = 0; k < 6; k++) {
        bool bwd = k & 1, truth = (k >> 1) & 1, training = k < 4;
        lk_dtype t = truth ? LK_F16 : LK_BF16, pt = truth ? LK_F16 : LK_F32;
        c = add(NAME("batch_norm%s%s_%s%s", training ? "" : "_eval", bwd ? "_backward" : "", lk_dtype_name(t),
                     truth ? "_true" : ""),
                bwd ? LK_OP_BATCH_NORM_BACKWARD : LK_OP_BATCH_NORM, T_EXACT);
        c->d.batch_norm = (lk_batch_norm_params){5, 6, 7, 35.0, 1e-5f, 0.1f, training, {2, 1, 1, 3}, false};
        if (!bwd) { /* x, w (stride 2), b, running_mean, running_var (stride 3), y, stats */
            for (int i = 0; i < 7; i++) c->d.dtype[i] = i == 0 || i == 5 ? t : i == 6 ? LK_F32 : pt;
            ops(c, 0, 210, I_RAND, 0), ops(c, 1, 12, I_RAND, 0), ops(c, 2, 6, I_RAND, 0), ops(c, 3, 6, I_RAND, 0);
            ops(c, 4, 18, I_POS, 0), ops(c, 5, 210, I_RAND, 0), ops(c, 6, 12, I_RAND, 0);
        } else { /* x, dy, stats, w, dx, dw, db (dw 16-bit too when true) */
            for (int i = 0; i < 7; i++) c->d.dtype[i] = i <= 1 || i == 4 ? t : i == 2 || i == 6 ? LK_F32 : pt;
            ops(c, 0, 210, I_RAND, 0), ops(c, 1, 210, I_RAND, 0), ops(c, 2, 12, I_POS, 0), ops(c, 3, 6, I_RAND, 0);
            ops(c, 4, 210, I_RAND, 0), ops(c, 5, 6, I_RAND, 0), ops(c, 6, 6, training ? I_RAND : I_NULL, 0);
        }
    }
    /* SyncBatchNorm's passes over [5, 6, 7]: the three sums, the normalisation and the input gradient; f32 and 16-bit x / g / y */
    static const char *const stat_names[] = {"sum", "sqdev", "grad"};
    for (int k = 0; k < 6; k++) {
        lk_bn_stat stat = (lk_bn_stat)(k % 3);
        lk_dtype t = k < 3 ? LK_F32 : hd[k % 2];
        c = add(NAME("bn_stats_%s%s%s", stat_names[stat], k < 3 ? "" : "_", k < 3 ? "" : lk_dtype_name(t)),
                LK_OP_BN_STATS, T_EXACT);
        dts(c, t, stat == LK_BN_GRAD ? hd[(k + 1) % 2] : LK_F32, LK_F32, LK_F64);
        if (k < 3) c->d.dtype[1] = LK_F32;
        c->d.bn_split = (lk_bn_split_params){5, 6, 7, stat, false};
        ops(c, 0, 210, I_RAND, 0), ops(c, 1, 210, stat == LK_BN_GRAD ? I_RAND : I_NULL, 0);
        ops(c, 2, 6, stat == LK_BN_SUM ? I_NULL : I_RAND, 0), ops(c, 3, stat == LK_BN_GRAD ? 12 : 6, I_RAND, 0);
    }
    /* the moments (sum and sum of squares in one pass: SyncBatchNorm's forward), f32 and a 16-bit x */
    for (int k = 0; k < 2; k++) {
        lk_dtype t = k ? hd[0] : LK_F32;
        c = add(NAME("bn_stats_moments%s%s", k ? "_" : "", k ? lk_dtype_name(t) : ""), LK_OP_BN_STATS, T_EXACT);
        dts(c, t, LK_F32, LK_F32, LK_F64);
        c->d.bn_split = (lk_bn_split_params){5, 6, 7, LK_BN_MOMENTS, false};
        ops(c, 0, 210, I_RAND, 0), ops(c, 1, 210, I_NULL, 0), ops(c, 2, 6, I_NULL, 0), ops(c, 3, 12, I_RAND, 0);
    }
    for (int k = 0; k < 4; k++) {
        bool bwd = k & 1;
        lk_dtype t = k < 2 ? LK_F32 : hd[k % 2];
        c = add(NAME("bn_apply%s%s%s", bwd ? "_backward" : "", k < 2 ? "" : "_", k < 2 ? "" : lk_dtype_name(t)),
                LK_OP_BN_APPLY, T_EXACT);
        dts(c, t, t, LK_F32, t);
        c->d.bn_split = (lk_bn_split_params){5, 6, 7, LK_BN_SUM, bwd};
        ops(c, 0, 210, I_RAND, 0), ops(c, 1, 210, bwd ? I_RAND : I_NULL, 0), ops(c, 2, bwd ? 24 : 12, I_RAND, 0);
        ops(c, 3, 210, I_RAND, 0);
    }
    /* embedding: a 16-bit table's rows, and the scatter-add into a 16-bit or f32 gradient */
    for (int k = 0; k < 4; k++) {
        bool bwd = k & 1;
        lk_dtype t = hd[k >> 1];
        c = add(NAME("embedding%s_%s", bwd ? "_backward" : "", lk_dtype_name(t)),
                bwd ? LK_OP_EMBEDDING_BACKWARD : LK_OP_EMBEDDING, T_EXACT);
        dts(c, t, k >> 1 ? LK_I64 : LK_I32, bwd && k >> 1 ? LK_F32 : t, 0);
        c->d.embedding = (lk_embedding_params){300, 17, 24};
        ops(c, 0, bwd ? 300 * 24 : 17 * 24, I_RAND, 0), ops(c, 1, 300, I_IDX, 17);
        ops(c, 2, bwd ? 17 * 24 : 300 * 24, I_RAND, 0);
    }
    /* convolution's pieces under autocast: 16-bit im2col, a bias of any float dtype added to the f32 GEMM
     * output and rounded to a 16-bit output, the bias gradient of a 16-bit dY */
    lk_im2col_params ig = {2, 3, 7, 6, 3, 2, 2, 1, 1, 0, 1, 2, 4, 4, 35};
    for (int h = 0; h < 2; h++) {
        c = add(NAME("im2col_%s", lk_dtype_name(hd[h])), LK_OP_IM2COL, T_EXACT);
        dts(c, hd[h], hd[h], 0, 0);
        c->d.im2col = ig;
        ops(c, 0, 2 * 3 * 7 * 6, I_RAND, 0), ops(c, 1, 3 * 3 * 2 * 35, I_RAND, 0);
    }
    static const struct {
        const char *name;
        lk_dtype b, out;
        bool bias;
    } ba[] = {{"bias_add_bf16", LK_BF16, LK_BF16, true},
              {"bias_add_f32_bias_f16_out", LK_F32, LK_F16, true},
              {"bias_add_f16_bias_f32_out", LK_F16, LK_F32, true},
              {"bias_add_no_bias_bf16", LK_BF16, LK_BF16, false}};
    for (int k = 0; k < 4; k++) {
        c = add(ba[k].name, LK_OP_BIAS_ADD, T_EXACT);
        dts(c, LK_F32, ba[k].b, ba[k].out, 0);
        c->d.bias = (lk_bias_params){3, 4, 10};
        ops(c, 0, 120, I_RAND, 0), ops(c, 1, 4, ba[k].bias ? I_RAND : I_NULL, 0), ops(c, 2, 120, I_RAND, 0);
    }
    for (int h = 0; h < 2; h++) {
        c = add(NAME("channel_sum_%s", lk_dtype_name(hd[h])), LK_OP_CHANNEL_SUM, T_EXACT);
        dts(c, hd[h], LK_F32, 0, 0);
        c->d.bias = (lk_bias_params){3, 4, 10};
        ops(c, 0, 120, I_RAND, 0), ops(c, 1, 4, I_RAND, 0);
    }
    /* the gradient utilities on bf16-true / 16-true gradients: norms, the non-finite search, clipping by value */
    static const double ps[] = {2.0, 1.0, INFINITY, 3.0};
    for (int k = 0; k < 4; k++) {
        lk_dtype t = hd[k & 1];
        c = add(NAME("norm_p%g_%s", ps[k], lk_dtype_name(t)), LK_OP_NORM, isinf(ps[k]) ? T_EXACT : (tol){1e-12, 0});
        dts(c, t, LK_F64, 0, 0);
        c->d.norm = (lk_norm_params){100003, ps[k]};
        ops(c, 0, 100003, I_RAND, 0), ops(c, 1, 1, I_RAND, 0);
    }
    for (int k = 0; k < 4; k++) {
        lk_dtype t = hd[k & 1];
        bool bad = k & 2;
        c = add(NAME("nonfinite%s_%s", bad ? "_with_inf_nan" : "_clean", lk_dtype_name(t)), LK_OP_NONFINITE, T_EXACT);
        dts(c, t, LK_I64, 0, 0);
        c->d.nonfinite = (lk_nonfinite_params){5000, 1.0f};
        ops(c, 0, 5000, I_RAND, 0), ops(c, 1, 1, I_IDX, 1);
        if (bad) c->fix = put_nonfinite_half;
    }
    for (int h = 0; h < 2; h++) {
        c = add(NAME("clamp_%s", lk_dtype_name(hd[h])), LK_OP_CLAMP, T_EXACT);
        dts(c, hd[h], hd[h], 0, 0);
        c->d.clamp = (lk_clamp_params){2000, -0.5f, 0.75f};
        ops(c, 0, 2000, I_RAND, 0), ops(c, 1, 2000, I_RAND, 0);
    }
    /* accuracy's hit count (val_acc on a device): f32 / bf16 / f16 logits, i64 / i32 / u8 targets */
    static const lk_dtype acc_t[] = {LK_I64, LK_I32, LK_U8};
    for (int k = 0; k < 9; k++) {
        lk_dtype t = k < 3 ? LK_F32 : hd[k / 3 - 1];
        c = add(NAME("accuracy_%s_%s", lk_dtype_name(t), lk_dtype_name(acc_t[k % 3])), LK_OP_ACCURACY, T_EXACT);
        dts(c, t, acc_t[k % 3], LK_F64, 0);
        c->d.accuracy = (lk_accuracy_params){300, 7};
        ops(c, 0, 300 * 7, I_RAND, 0), ops(c, 1, 300, I_IDX, 7), ops(c, 2, 1, I_RAND, 0);
        c->fix = put_ties;
    }
    /* causal self-attention [B 2, T 13, H 3, D 8]: f32 and bf16 qkv, with
     * and without dropout; the backward on the forward's own y and lse
     * (attention_consistent), so its probabilities are real ones */
    for (int k = 0; k < 6; k++) {
        bool bwd = k >= 3, drop = k % 3 == 1, half = k % 3 == 2;
        lk_dtype t = half ? LK_BF16 : LK_F32;
        c = add(NAME("attention%s%s_%s", bwd ? "_backward" : "", drop ? "_dropout" : "", lk_dtype_name(t)),
                bwd ? LK_OP_ATTENTION_BACKWARD : LK_OP_ATTENTION, T_TRANSC);
        lk_attention_params *a = &c->d.attention;
        *a = (lk_attention_params){2, 13, 3, 8, 0.35355339f, drop ? 0.25f * 16777216.0f : 0.0f, drop ? 4.0f / 3.0f : 1.0f,
                                   {0x1234, 0x5678}, {7, 0, 0, 0}};
        int64_t n = 2 * 13 * 3 * 8;
        if (!bwd) {
            dts(c, t, t, LK_F32, 0);
            ops(c, 0, 3 * n, I_RAND, 0), ops(c, 1, n, I_RAND, 0), ops(c, 2, 2 * 3 * 13, I_RAND, 0);
        } else {
            dts(c, t, t, LK_F32, t), c->d.dtype[4] = t;
            ops(c, 0, 3 * n, I_RAND, 0), ops(c, 1, n, I_RAND, 0), ops(c, 2, 2 * 3 * 13, I_RAND, 0);
            ops(c, 3, n, I_RAND, 0), ops(c, 4, 3 * n, I_RAND, 0);
            c->fix = attention_consistent;
        }
    }
#undef NAME
}

static void build_table(void) {
#define NAME(...) case_name(__VA_ARGS__)
    /* GEMM through the registry (gpu_gemm covers the shapes and transposes) */
    static const lk_dtype gd[][2] = {{LK_F32, LK_F32}, {LK_BF16, LK_F32}, {LK_F16, LK_F16}, {LK_BF16, LK_BF16}};
    for (int k = 0; k < 4; k++) {
        op_case *c = add(NAME("gemm_%s_%s", lk_dtype_name(gd[k][0]), lk_dtype_name(gd[k][1])), LK_OP_GEMM,
                         gd[k][0] == LK_F32 ? T_GEMM : gd[k][1] == LK_F16 || gd[k][0] == LK_F16 ? T_GEMM_F16 : T_GEMM_BF16);
        dts(c, gd[k][0], gd[k][0], gd[k][1], 0);
        c->d.gemm = (lk_gemm_params){k & 1, k == 2, 33, 47, 65, k & 1 ? 33 : 65, k == 2 ? 65 : 47, 47, 1.5f, k ? 0.5f : 0.0f};
        ops(c, 0, 33 * 65, I_RAND, 0), ops(c, 1, 65 * 47, I_RAND, 0), ops(c, 2, 33 * 47, I_RAND, 0);
    }
    /* unary and its backward, every function, f32; a few in 16-bit and mixed */
    for (int fn = 0; fn < LK_UNARY_COUNT; fn++) {
        bool exact = fn == LK_UNARY_RELU || fn == LK_UNARY_ABS || fn == LK_UNARY_NEG || fn == LK_UNARY_SQRT ||
                     fn == LK_UNARY_LEAKY_RELU;
        bool pos = fn == LK_UNARY_LOG || fn == LK_UNARY_SQRT;
        float alpha = fn == LK_UNARY_LEAKY_RELU ? 0.1f : 1.0f;
        op_case *c = add(NAME("unary_%s", unary_names[fn]), LK_OP_UNARY, exact ? T_EXACT : T_TRANSC);
        dts(c, LK_F32, LK_F32, 0, 0);
        c->d.unary = (lk_unary_params){(lk_unary_op)fn, 3001, alpha, false};
        ops(c, 0, 3001, pos ? I_POS : I_RAND, 0), ops(c, 1, 3001, I_RAND, 0);
        bool bexact = fn == LK_UNARY_RELU || fn == LK_UNARY_ABS || fn == LK_UNARY_NEG || fn == LK_UNARY_LEAKY_RELU;
        for (int acc = 0; acc < 2; acc++) {
            c = add(NAME("unary_backward_%s%s", unary_names[fn], acc ? "_acc" : ""), LK_OP_UNARY_BACKWARD,
                    bexact ? T_EXACT : T_TRANSC);
            dts(c, LK_F32, LK_F32, LK_F32, LK_F32);
            c->d.unary = (lk_unary_params){(lk_unary_op)fn, 3001, alpha, acc};
            ops(c, 0, 3001, pos ? I_POS : I_RAND, 0), ops(c, 1, 3001, I_POS, 0), ops(c, 2, 3001, I_RAND, 0);
            ops(c, 3, 3001, I_RAND, 0);
        }
    }
    static const struct {
        lk_dtype in, out;
    } mix[] = {{LK_F32, LK_F32}, {LK_BF16, LK_BF16}, {LK_F16, LK_F16}, {LK_BF16, LK_F32}, {LK_F32, LK_F16}};
    for (int m = 0; m < 5; m++) {
        static char tags[5][24]; /* apart from names[]: snprintf's source must not overlap its destination */
        snprintf(tags[m], sizeof tags[m], "%s_%s", lk_dtype_name(mix[m].in), lk_dtype_name(mix[m].out));
        const char *tag = tags[m];
        static const int fns[] = {LK_UNARY_RELU, LK_UNARY_GELU_TANH, LK_UNARY_SIGMOID};
        for (int f = 0; f < 3; f++) {
            op_case *c = add(NAME("unary_%s_%s", unary_names[fns[f]], tag), LK_OP_UNARY, f ? T_TRANSC : T_EXACT);
            dts(c, mix[m].in, mix[m].out, 0, 0);
            c->d.unary = (lk_unary_params){(lk_unary_op)fns[f], 1025, 0, false};
            ops(c, 0, 1025, I_RAND, 0), ops(c, 1, 1025, I_RAND, 0);
            c = add(NAME("unary_backward_%s_%s", unary_names[fns[f]], tag), LK_OP_UNARY_BACKWARD,
                    f ? T_TRANSC : T_EXACT);
            dts(c, mix[m].in, mix[m].in, mix[m].in, mix[m].out);
            c->d.unary = (lk_unary_params){(lk_unary_op)fns[f], 1025, 0, true};
            for (int i = 0; i < 4; i++) ops(c, i, 1025, I_RAND, 0);
        }
        /* binary over broadcast strides: [4, 3, 5] = [4, 1, 5] (op) [3, 1] */
        for (int fn = LK_BINARY_ADD; fn <= LK_BINARY_DIV; fn++) {
            op_case *c = add(NAME("binary_%s_%s", lk__binary_name((lk_binary_op)fn), tag), LK_OP_BINARY, T_EXACT);
            dts(c, mix[m].in, mix[m].in, mix[m].out, 0);
            lk_binary_params *p = &c->d.binary;
            p->fn = (lk_binary_op)fn, p->ndim = 3;
            int64_t sh[3] = {4, 3, 5}, sa[3] = {5, 0, 1}, sb[3] = {0, 1, 0};
            memcpy(p->shape, sh, sizeof sh), memcpy(p->sa, sa, sizeof sa), memcpy(p->sb, sb, sizeof sb);
            ops(c, 0, 20, I_RAND, 0), ops(c, 1, 3, fn == LK_BINARY_DIV ? I_POS : I_RAND, 0), ops(c, 2, 60, I_RAND, 0);
        }
        op_case *c = add(NAME("axpy_%s", tag), LK_OP_AXPY, T_EXACT);
        dts(c, mix[m].in, mix[m].out, 0, 0);
        c->d.axpy = (lk_axpy_params){999, m ? 0.5f : 1.0f};
        ops(c, 0, 999, I_RAND, 0), ops(c, 1, 999, I_RAND, 0);
        c = add(NAME("affine_%s", tag), LK_OP_AFFINE, T_EXACT);
        dts(c, mix[m].in, mix[m].out, 0, 0);
        c->d.affine = (lk_affine_params){999, -1.5f, 0.25f, m & 1};
        ops(c, 0, 999, I_RAND, 0), ops(c, 1, 999, I_RAND, 0);
        /* sum-to: [6, 7, 9] onto [1, 7, 1] (innermost summed) and onto [7, 9] (bias-style) */
        for (int k = 0; k < 2; k++) {
            c = add(NAME("sum_to_%s_%s", k ? "rows" : "dims02", tag), LK_OP_SUM_TO, T_EXACT);
            dts(c, mix[m].in, mix[m].out, 0, 0);
            lk_sum_to_params *p = &c->d.sum_to;
            p->ndim = 3;
            int64_t sh[3] = {6, 7, 9}, sd0[3] = {0, 1, 0}, sd1[3] = {0, 9, 1};
            memcpy(p->shape, sh, sizeof sh), memcpy(p->sd, k ? sd1 : sd0, sizeof sd0);
            ops(c, 0, 378, I_RAND, 0), ops(c, 1, k ? 63 : 7, I_RAND, 0);
        }
        if (mix[m].in == mix[m].out) {
            c = add(NAME("mask_scale_%s", tag), LK_OP_MASK_SCALE, T_EXACT);
            dts(c, mix[m].in, LK_U8, mix[m].in, 0);
            c->d.mask_scale = (lk_mask_scale_params){777, 1.0f / 0.7f};
            ops(c, 0, 777, I_RAND, 0), ops(c, 1, 777, I_MASK, 0), ops(c, 2, 777, I_RAND, 0);
        }
    }
    /* strided copies: a transpose, a stride-0 source (linear's bias rows), a
     * repeated destination (serial), every element size, the accumulating form */
    static const lk_dtype cdt[] = {LK_F32, LK_BF16, LK_U8, LK_I64};
    for (int k = 0; k < 4; k++) {
        op_case *c = add(NAME("copy_transpose_%s", lk_dtype_name(cdt[k])), LK_OP_COPY, T_EXACT);
        dts(c, cdt[k], cdt[k], 0, 0);
        c->d.copy = (lk_copy_params){.ndim = 2, .shape = {37, 29}, .ss = {1, 37}, .sd = {29, 1}};
        ops(c, 0, 37 * 29, cdt[k] == LK_U8 || cdt[k] == LK_I64 ? I_IDX : I_RAND, 200);
        ops(c, 1, 37 * 29, cdt[k] == LK_U8 || cdt[k] == LK_I64 ? I_IDX : I_RAND, 200);
    }
    op_case *c = add("copy_bias_rows", LK_OP_COPY, T_EXACT);
    dts(c, LK_F32, LK_F32, 0, 0);
    c->d.copy = (lk_copy_params){.ndim = 2, .shape = {16, 10}, .ss = {0, 1}, .sd = {10, 1}};
    ops(c, 0, 10, I_RAND, 0), ops(c, 1, 160, I_RAND, 0);
    c = add("copy_accumulate_strided", LK_OP_COPY, T_EXACT);
    dts(c, LK_F32, LK_F32, 0, 0);
    c->d.copy = (lk_copy_params){.ndim = 3, .shape = {3, 4, 5}, .ss = {20, 5, 1}, .sd = {1, 15, 3}, .accumulate = true};
    ops(c, 0, 60, I_RAND, 0), ops(c, 1, 60, I_RAND, 0);
    c = add("copy_accumulate_repeated_dst", LK_OP_COPY, T_EXACT);
    dts(c, LK_F32, LK_F32, 0, 0);
    c->d.copy = (lk_copy_params){.ndim = 2, .shape = {50, 8}, .ss = {8, 1}, .sd = {0, 1}, .accumulate = true};
    ops(c, 0, 400, I_RAND, 0), ops(c, 1, 8, I_RAND, 0);
    /* casts (lk_tensor_copy / lk_tensor_cast): transposed f32 -> bf16, f16 -> f32, bf16 -> f16 */
    static const lk_dtype cast_pairs[][2] = {{LK_F32, LK_BF16}, {LK_F16, LK_F32}, {LK_BF16, LK_F16}, {LK_F32, LK_F16}};
    for (int k = 0; k < 4; k++) {
        c = add(NAME("copy_cast_%s_%s", lk_dtype_name(cast_pairs[k][0]), lk_dtype_name(cast_pairs[k][1])), LK_OP_COPY,
                T_EXACT);
        dts(c, cast_pairs[k][0], cast_pairs[k][1], 0, 0);
        c->d.copy = (lk_copy_params){.ndim = 2, .shape = {37, 29}, .ss = {1, 37}, .sd = {29, 1}};
        ops(c, 0, 37 * 29, I_RAND, 0), ops(c, 1, 37 * 29, I_RAND, 0);
    }
    /* casts with an integer or f64 side (copy.c's conversions): in range (a float to u8 from positive values) */
    static const lk_dtype icast[][2] = {{LK_I64, LK_F32}, {LK_F32, LK_I64}, {LK_F32, LK_I32}, {LK_BF16, LK_U8},
                                        {LK_I32, LK_I64}, {LK_I64, LK_I32}, {LK_U8, LK_F16},  {LK_F64, LK_BF16},
                                        {LK_F32, LK_F64}, {LK_I64, LK_U8},  {LK_I32, LK_F32}, {LK_F64, LK_I64}};
    for (int k = 0; k < 12; k++) {
        lk_dtype a = icast[k][0], b = icast[k][1];
        bool ia = a == LK_I32 || a == LK_I64 || a == LK_U8, ib = b == LK_I32 || b == LK_I64 || b == LK_U8;
        c = add(NAME("copy_cast_%s_%s", lk_dtype_name(a), lk_dtype_name(b)), LK_OP_COPY, T_EXACT);
        dts(c, a, b, 0, 0);
        c->d.copy = (lk_copy_params){.ndim = 2, .shape = {37, 29}, .ss = {1, 37}, .sd = {29, 1}};
        ops(c, 0, 37 * 29, ia ? I_IDX : b == LK_U8 ? I_POS : I_RAND, 250), ops(c, 1, 37 * 29, ib ? I_IDX : I_RAND, 100);
        if (ia) c->fix = big_ints;
    }
    /* a cast into a repeated destination (stride 0): the CPU's last write wins */
    c = add("copy_cast_repeated_dst_f32_bf16", LK_OP_COPY, T_EXACT);
    dts(c, LK_F32, LK_BF16, 0, 0);
    c->d.copy = (lk_copy_params){.ndim = 2, .shape = {50, 8}, .ss = {8, 1}, .sd = {0, 1}};
    ops(c, 0, 400, I_RAND, 0), ops(c, 1, 8, I_RAND, 0);
    /* fills: every other column of an f32 matrix, a bf16 vector, i64 and u8 */
    static const lk_dtype fdt[] = {LK_F32, LK_BF16, LK_I64, LK_U8};
    for (int k = 0; k < 4; k++) {
        c = add(NAME("fill_%s", lk_dtype_name(fdt[k])), LK_OP_FILL, T_EXACT);
        dts(c, fdt[k], 0, 0, 0);
        c->d.fill = k == 0 ? (lk_fill_params){.ndim = 2, .shape = {9, 7}, .sd = {14, 2}, .value = 0.1}
                           : (lk_fill_params){.ndim = 1, .shape = {300}, .sd = {1}, .value = k == 1 ? -3.3 : 7.0};
        ops(c, 0, k == 0 ? 9 * 14 : 300, fdt[k] == LK_I64 || fdt[k] == LK_U8 ? I_IDX : I_RAND, 100);
    }
    c = add("clamp", LK_OP_CLAMP, T_EXACT);
    dts(c, LK_F32, LK_F32, 0, 0);
    c->d.clamp = (lk_clamp_params){2000, -0.5f, 0.75f};
    ops(c, 0, 2000, I_RAND, 0), ops(c, 1, 2000, I_RAND, 0);
    /* softmax along rows (inner 1) and along a middle axis (inner 6), both directions */
    for (int k = 0; k < 8; k++) {
        bool bwd = k & 1, log_out = k & 2, cols = k & 4;
        c = add(NAME("%s%s_%s", log_out ? "log_softmax" : "softmax", bwd ? "_backward" : "", cols ? "cols" : "rows"),
                bwd ? LK_OP_SOFTMAX_BACKWARD : LK_OP_SOFTMAX, log_out ? T_TRANSC : T_EXACT);
        dts(c, LK_F32, LK_F32, LK_F32, 0);
        c->d.softmax = (lk_softmax_params){cols ? 5 : 37, cols ? 11 : 101, cols ? 6 : 1, log_out};
        int64_t n = cols ? 5 * 11 * 6 : 37 * 101;
        for (int i = 0; i < (bwd ? 3 : 2); i++) ops(c, i, n, bwd && i == 0 && !log_out ? I_POS : I_RAND, 0);
    }
    /* the regression losses, every kind and reduction, f32 and a bf16 input */
    static const char *const lk_names[] = {"mse", "l1", "smooth_l1"}, *const red_names[] = {"mean", "sum", "none"}; /* lk_reduction order */
    for (int kind = 0; kind < 3; kind++)
        for (int red = 0; red < 3; red++)
            for (int h = 0; h < 2; h++)
                for (int bwd = 0; bwd < 2; bwd++) {
                    lk_dtype xt = h ? LK_BF16 : LK_F32;
                    c = add(NAME("%s_%s%s%s", lk_names[kind], red_names[red], h ? "_bf16" : "", bwd ? "_backward" : ""),
                            bwd ? LK_OP_LOSS_BACKWARD : LK_OP_LOSS, red != LK_REDUCTION_NONE && !bwd ? T_SUM : T_EXACT);
                    dts(c, xt, xt, LK_F32, xt);
                    c->d.loss = (lk_loss_params){(lk_ploss_kind)kind, red, 4097, 0.5f};
                    ops(c, 0, 4097, I_RAND, 0), ops(c, 1, 4097, I_RAND, 0);
                    ops(c, 2, red == LK_REDUCTION_NONE ? 4097 : 1, I_RAND, 0);
                    if (bwd) ops(c, 3, 4097, I_RAND, 0);
                }
    /* cross-entropy and nll: rows [N, C] and [N, C, D], weights, smoothing, ignored rows, i32 / i64 targets */
    for (int k = 0; k < 6; k++) {
        bool spatial = k & 1, weighted = k & 2, i64 = k >= 4;
        int64_t N = spatial ? 4 : 16, C = spatial ? 5 : 10, D = spatial ? 3 : 1, rows = N * D;
        int red = k % 3;
        lk_dtype tt = i64 ? LK_I64 : LK_I32;
        lk_xent_params xp = {N, C, D, 3, red, weighted ? 0.1f : 0.0f, 9.5f, weighted ? 4.2f : (float)C};
        c = add(NAME("xent_%d_%s", k, red_names[red]), LK_OP_XENT, T_TRANSC);
        c->d.dtype[0] = LK_F32, c->d.dtype[1] = tt, c->d.dtype[2] = c->d.dtype[3] = c->d.dtype[4] = LK_F32;
        c->d.dtype[5] = LK_F64, c->d.xent = xp, c->fix = put_ignored;
        ops(c, 0, N * C * D, I_RAND, 0), ops(c, 1, rows, I_IDX, C), ops(c, 2, C, weighted ? I_POS : I_NULL, 0);
        ops(c, 3, red == LK_REDUCTION_NONE ? rows : 1, I_RAND, 0), ops(c, 4, rows * C, k == 3 ? I_NULL : I_RAND, 0);
        ops(c, 5, 1, I_RAND, 0);
        c = add(NAME("xent_backward_%d_%s", k, red_names[red]), LK_OP_XENT_BACKWARD, T_EXACT);
        c->d.dtype[0] = LK_F32, c->d.dtype[1] = tt, c->d.dtype[2] = c->d.dtype[3] = c->d.dtype[4] = LK_F32;
        c->d.xent = xp, c->fix = put_ignored;
        ops(c, 0, rows * C, I_POS, 0), ops(c, 1, rows, I_IDX, C), ops(c, 2, C, weighted ? I_POS : I_NULL, 0);
        ops(c, 3, red == LK_REDUCTION_NONE ? rows : 1, I_RAND, 0), ops(c, 4, N * C * D, I_RAND, 0);
        c = add(NAME("nll_%d_%s", k, red_names[red]), LK_OP_NLL, T_EXACT);
        c->d.dtype[0] = LK_F32, c->d.dtype[1] = tt, c->d.dtype[2] = c->d.dtype[3] = LK_F32, c->d.dtype[4] = LK_F64;
        c->d.xent = xp, c->fix = put_ignored;
        ops(c, 0, N * C * D, I_RAND, 0), ops(c, 1, rows, I_IDX, C), ops(c, 2, C, weighted ? I_POS : I_NULL, 0);
        ops(c, 3, red == LK_REDUCTION_NONE ? rows : 1, I_RAND, 0), ops(c, 4, 1, I_RAND, 0);
        c = add(NAME("nll_backward_%d_%s", k, red_names[red]), LK_OP_NLL_BACKWARD, T_EXACT);
        c->d.dtype[0] = tt, c->d.dtype[1] = c->d.dtype[2] = c->d.dtype[3] = LK_F32;
        c->d.xent = xp, c->fix = put_ignored;
        ops(c, 0, rows, I_IDX, C), ops(c, 1, C, weighted ? I_POS : I_NULL, 0), ops(c, 2, red == LK_REDUCTION_NONE ? rows : 1, I_RAND, 0);
        ops(c, 3, N * C * D, I_RAND, 0);
    }
    /* the gradient utilities */
    static const double ps[] = {2.0, 1.0, INFINITY, 3.0};
    for (int k = 0; k < 4; k++) {
        c = add(NAME("norm_p%g", ps[k]), LK_OP_NORM, T_EXACT);
        dts(c, LK_F32, LK_F64, 0, 0);
        c->d.norm = (lk_norm_params){100003, ps[k]};
        ops(c, 0, 100003, I_RAND, 0), ops(c, 1, 1, I_RAND, 0);
        c->t = isinf(ps[k]) ? T_EXACT : (tol){1e-12, 0}; /* double sums in another order */
    }
    for (int k = 0; k < 4; k++) {
        bool unscale = k & 1, bad = k & 2;
        c = add(NAME("%s%s", unscale ? "unscale" : "nonfinite", bad ? "_with_inf_nan" : "_clean"),
                unscale ? LK_OP_UNSCALE : LK_OP_NONFINITE, T_EXACT);
        dts(c, LK_F32, unscale ? LK_F32 : LK_I64, LK_I64, 0);
        c->d.nonfinite = (lk_nonfinite_params){5000, 1.0f / 1024};
        ops(c, 0, 5000, I_RAND, 0), ops(c, 1, unscale ? 5000 : 1, unscale ? I_RAND : I_IDX, 1), ops(c, 2, 1, I_IDX, 1);
        if (!unscale) c->o[2].k = I_NULL, c->o[2].n = 0;
        if (bad) c->fix = put_nonfinite;
    }
    /* embedding: repeated indices accumulate in order */
    for (int k = 0; k < 4; k++) {
        c = add(NAME("embedding%s_%s", k & 1 ? "_backward" : "", k & 2 ? "i64" : "i32"),
                k & 1 ? LK_OP_EMBEDDING_BACKWARD : LK_OP_EMBEDDING, T_EXACT);
        dts(c, LK_F32, k & 2 ? LK_I64 : LK_I32, LK_F32, 0);
        c->d.embedding = (lk_embedding_params){300, 17, 24};
        ops(c, 0, k & 1 ? 300 * 24 : 17 * 24, I_RAND, 0), ops(c, 1, 300, I_IDX, 17);
        ops(c, 2, k & 1 ? 17 * 24 : 300 * 24, I_RAND, 0);
    }
    /* convolution's pieces: 2 samples of 3 x 7 x 6, kernel 3 x 2, stride 2 x 1,
     * padding 1 x 0, dilation 1 x 2 -> 4 x 4, columns padded to ldc 35 */
    lk_im2col_params ig = {2, 3, 7, 6, 3, 2, 2, 1, 1, 0, 1, 2, 4, 4, 35};
    for (int k = 0; k < 2; k++) {
        c = add(k ? "col2im" : "im2col", k ? LK_OP_COL2IM : LK_OP_IM2COL, T_EXACT);
        dts(c, LK_F32, LK_F32, 0, 0);
        c->d.im2col = ig;
        ops(c, k, 2 * 3 * 7 * 6, I_RAND, 0), ops(c, 1 - k, 3 * 3 * 2 * 35, I_RAND, 0);
    }
    for (int k = 0; k < 3; k++) { /* bias add with and without a bias, then its gradient */
        bool sum = k == 2;
        c = add(sum ? "channel_sum" : k ? "bias_add_no_bias" : "bias_add", sum ? LK_OP_CHANNEL_SUM : LK_OP_BIAS_ADD,
                T_EXACT);
        dts(c, LK_F32, LK_F32, LK_F32, 0);
        c->d.bias = (lk_bias_params){3, 4, 10};
        ops(c, 0, 120, I_RAND, 0), ops(c, 1, sum ? 4 : 4, k == 1 ? I_NULL : I_RAND, 0);
        if (!sum) ops(c, 2, 120, I_RAND, 0);
    }
    /* pooling: 6 planes of 7 x 8, kernel 3 x 2, stride 2, padding 1 -> 4 x 5; adaptive to 3 x 5 */
    static const char *const pool_names[] = {"max_pool", "avg_pool", "avg_pool_no_pad_count", "adaptive_avg_pool"};
    for (int k = 0; k < 4; k++)
        for (int bwd = 0; bwd < 2; bwd++) {
            lk_pool_kind kind = k == 0 ? LK_POOL_MAX : k == 3 ? LK_POOL_ADAPTIVE_AVG : LK_POOL_AVG;
            long OH = k == 3 ? 3 : 4, OW = 5, no = 6 * OH * OW, ni = 6 * 7 * 8;
            c = add(NAME("%s%s", pool_names[k], bwd ? "_backward" : ""), bwd ? LK_OP_POOL2D_BACKWARD : LK_OP_POOL2D,
                    T_EXACT);
            c->d.pool = (lk_pool_params){kind, 6, 7, 8, OH, OW, 3, 2, 2, 2, 1, 1, k != 2};
            if (bwd) {
                dts(c, LK_F32, kind == LK_POOL_MAX ? LK_I32 : LK_F32, LK_F32, 0);
                ops(c, 0, no, I_RAND, 0), ops(c, 1, no, kind == LK_POOL_MAX ? I_IDX : I_NULL, 7 * 8);
                ops(c, 2, ni, I_RAND, 0);
            } else {
                dts(c, LK_F32, LK_F32, kind == LK_POOL_MAX ? LK_I32 : LK_F32, 0);
                ops(c, 0, ni, I_RAND, 0), ops(c, 1, no, I_RAND, 0);
                ops(c, 2, no, kind == LK_POOL_MAX ? I_IDX : I_NULL, 1);
            }
        }
    /* binary cross-entropy on probabilities and on logits, weights and pos_weight, both gradients */
    for (int k = 0; k < 12; k++) {
        bool logits = k & 1, bwd = k >= 6;
        int red = k / 2 % 3;
        c = add(NAME("bce%s_%s%s", logits ? "_logits" : "", red_names[red], bwd ? "_backward" : ""),
                bwd ? LK_OP_BCE_BACKWARD : LK_OP_BCE, red != LK_REDUCTION_NONE && !bwd ? T_SUM : T_TRANSC);
        for (int i = 0; i < 7; i++) c->d.dtype[i] = LK_F32;
        c->d.bce = (lk_bce_params){2049, red, logits};
        ops(c, 0, 2049, logits ? I_RAND : I_POS, 0), ops(c, 1, 2049, I_POS, 0), ops(c, 2, 2049, k & 2 ? I_POS : I_NULL, 0);
        ops(c, 3, 2049, logits && k % 3 ? I_POS : I_NULL, 0);
        if (!logits) c->fix = probabilities;
        if (bwd) {
            ops(c, 4, red == LK_REDUCTION_NONE ? 2049 : 1, I_RAND, 0), ops(c, 5, 2049, I_RAND, 0);
            ops(c, 6, 2049, k == 6 ? I_NULL : I_RAND, 0);
        } else {
            ops(c, 4, red == LK_REDUCTION_NONE ? 2049 : 1, I_RAND, 0);
        }
    }
    /* layer norm: 37 rows of 45, with and without affine parameters, every gradient */
    for (int k = 0; k < 4; k++) {
        bool bwd = k >= 2, affine = k & 1;
        c = add(NAME("layer_norm%s%s", affine ? "_affine" : "", bwd ? "_backward" : ""),
                bwd ? LK_OP_LAYER_NORM_BACKWARD : LK_OP_LAYER_NORM, T_EXACT);
        for (int i = 0; i < 7; i++) c->d.dtype[i] = LK_F32;
        c->d.layer_norm = (lk_layer_norm_params){37, 45, 1e-5f};
        if (!bwd) {
            ops(c, 0, 37 * 45, I_RAND, 0), ops(c, 1, 45, affine ? I_RAND : I_NULL, 0);
            ops(c, 2, 45, affine ? I_RAND : I_NULL, 0), ops(c, 3, 37 * 45, I_RAND, 0), ops(c, 4, 74, I_RAND, 0);
        } else { /* x, dy, stats (mean, rstd > 0), w, dx, dw, db */
            ops(c, 0, 37 * 45, I_RAND, 0), ops(c, 1, 37 * 45, I_RAND, 0), ops(c, 2, 74, I_POS, 0);
            ops(c, 3, 45, affine ? I_RAND : I_NULL, 0), ops(c, 4, 37 * 45, I_RAND, 0);
            ops(c, 5, 45, affine ? I_RAND : I_NULL, 0), ops(c, 6, 45, I_RAND, 0);
        }
    }
    /* batch norm [5, 6, 7]: training (running stats updated, strided w / running_var) and eval, both directions */
    for (int k = 0; k < 4; k++) {
        bool bwd = k & 1, training = !(k & 2);
        c = add(NAME("batch_norm%s%s", training ? "" : "_eval", bwd ? "_backward" : ""),
                bwd ? LK_OP_BATCH_NORM_BACKWARD : LK_OP_BATCH_NORM, T_EXACT);
        for (int i = 0; i < 7; i++) c->d.dtype[i] = LK_F32;
        c->d.batch_norm = (lk_batch_norm_params){5, 6, 7, 35.0, 1e-5f, 0.1f, training, {2, 1, 1, 3}, false};
        if (!bwd) { /* x, w (stride 2), b, running_mean, running_var (stride 3), y, stats */
            ops(c, 0, 210, I_RAND, 0), ops(c, 1, 12, I_RAND, 0), ops(c, 2, 6, I_RAND, 0), ops(c, 3, 6, I_RAND, 0);
            ops(c, 4, 18, I_POS, 0), ops(c, 5, 210, I_RAND, 0), ops(c, 6, 12, I_RAND, 0);
        } else { /* x, dy, stats (mean, invstd), w, dx, dw, db */
            ops(c, 0, 210, I_RAND, 0), ops(c, 1, 210, I_RAND, 0), ops(c, 2, 12, I_POS, 0), ops(c, 3, 6, I_RAND, 0);
            ops(c, 4, 210, I_RAND, 0), ops(c, 5, 6, I_RAND, 0), ops(c, 6, 6, training ? I_RAND : I_NULL, 0);
        }
    }
    /* the optimizer updates */
    static const struct {
        const char *name;
        lk_optim_params p;
        bool s1, s2;
    } opt[] = {
        {"sgd_plain", {LK_OPTIM_RULE_SGD, 0, 1, 0.1, 0, 0, 0, 0, 0, 0, 0, false, false, false}, false, false},
        {"sgd_momentum_first", {LK_OPTIM_RULE_SGD, 0, 1, 0.1, 0.9, 0.1, 1e-4, 0, 0, 0, 0, false, false, false}, false, false},
        {"sgd_nesterov", {LK_OPTIM_RULE_SGD, 0, 3, 0.05, 0.9, 0, 1e-2, 0, 0, 0, 0, true, false, false}, false, false},
        {"adam", {LK_OPTIM_RULE_ADAM, 0, 5, 1e-3, 0, 0, 0, 0.9, 0.999, 1e-8, 0, false, false, false}, true, false},
        {"adam_l2_amsgrad", {LK_OPTIM_RULE_ADAM, 0, 7, 1e-3, 0, 0, 1e-2, 0.9, 0.99, 1e-6, 0, false, false, false}, true, true},
        {"adamw_maximize", {LK_OPTIM_RULE_ADAM, 0, 2, 1e-2, 0, 0, 0.1, 0.8, 0.999, 1e-8, 0, false, true, true}, true, false},
        {"rmsprop", {LK_OPTIM_RULE_RMSPROP, 0, 4, 1e-2, 0, 0, 0, 0, 0, 1e-8, 0.99, false, false, false}, false, false},
        {"rmsprop_centered_momentum", {LK_OPTIM_RULE_RMSPROP, 0, 4, 1e-2, 0.9, 0, 1e-3, 0, 0, 1e-8, 0.9, false, false, false}, true, true},
    };
    for (size_t k = 0; k < sizeof opt / sizeof opt[0]; k++) {
        c = add(opt[k].name, LK_OP_OPTIM_UPDATE, T_EXACT);
        for (int i = 0; i < 5; i++) c->d.dtype[i] = LK_F32;
        c->d.optim = opt[k].p;
        c->d.optim.n = 4099;
        ops(c, 0, 4099, I_RAND, 0), ops(c, 1, 4099, I_RAND, 0), ops(c, 2, 4099, I_POS, 0);
        ops(c, 3, 4099, opt[k].s1 ? I_POS : I_NULL, 0), ops(c, 4, 4099, opt[k].s2 ? I_POS : I_NULL, 0);
        if (opt[k].p.rule == LK_OPTIM_RULE_RMSPROP && opt[k].s2) c->o[4].k = I_RAND; /* grad_avg */
    }
    /* bf16-true / 16-true: bf16 or f16 parameters and gradients, f32 state */
    static const size_t half_opt[] = {1, 4, 5, 7};
    for (size_t k = 0; k < sizeof half_opt / sizeof half_opt[0]; k++) {
        lk_dtype hd = k % 2 ? LK_F16 : LK_BF16;
        c = add(NAME("%s_%s", opt[half_opt[k]].name, lk_dtype_name(hd)), LK_OP_OPTIM_UPDATE, T_EXACT);
        for (int i = 0; i < 5; i++) c->d.dtype[i] = i < 2 ? hd : LK_F32;
        c->d.optim = opt[half_opt[k]].p;
        c->d.optim.n = 4099;
        ops(c, 0, 4099, I_RAND, 0), ops(c, 1, 4099, I_RAND, 0), ops(c, 2, 4099, I_POS, 0);
        ops(c, 3, 4099, opt[half_opt[k]].s1 ? I_POS : I_NULL, 0), ops(c, 4, 4099, opt[half_opt[k]].s2 ? I_POS : I_NULL, 0);
        if (opt[half_opt[k]].p.rule == LK_OPTIM_RULE_RMSPROP && opt[half_opt[k]].s2) c->o[4].k = I_RAND;
    }
    /* dropout's keep mask: buffered head words, a counter whose low word
     * carries inside the x8 groups and the single blocks, n < 4, odd n, p = 1 */
    static const struct {
        const char *name;
        int64_t n;
        int head_n;
        uint32_t c0;
        float p;
    } dm[] = {{"dropout_mask_head2_carry", 1001, 2, 0xFFFFFFF3u, 0.3f}, {"dropout_mask_small", 3, 0, 7, 0.5f},
              {"dropout_mask_head3_short", 2, 2, 0xFFFFFFFFu, 0.9f}, {"dropout_mask_p1", 77, 1, 5, 1.0f}};
    for (size_t k = 0; k < sizeof dm / sizeof dm[0]; k++) {
        c = add(dm[k].name, LK_OP_DROPOUT_MASK, T_EXACT);
        dts(c, LK_U8, 0, 0, 0);
        c->d.dropout_mask = (lk_dropout_mask_params){.n = dm[k].n, .key = {0x1234567u, 0x9abcdefu},
                                                    .ctr = {dm[k].c0, 41, 3, 9}, .head = {0x80000000u, 0x00000100u, 0xFFFFFFFFu},
                                                    .head_n = dm[k].head_n, .thr = dm[k].p * 16777216.0f};
        ops(c, 0, dm[k].n, I_IDX, 200);
    }
    for (int k = 0; k < 2; k++) { /* batch norm's counter, and its undo */
        c = add(k ? "increment_minus_one" : "increment", LK_OP_INCREMENT, T_EXACT);
        dts(c, LK_I64, 0, 0, 0);
        c->d.increment = (lk_increment_params){k ? 300 : 1, k ? -1 : 1};
        ops(c, 0, k ? 300 : 1, I_IDX, 1000);
    }
    add_half_forms();
    add_live_forms();
    /* clipping by norm on the device: the coefficient from raw norms (p = 2,
     * 1, inf; max_norm 0.5 clips, 1e6 clamps to 1), and the scaling by it */
    static const double cps[] = {2.0, 1.0, INFINITY, 2.0};
    for (int k = 0; k < 4; k++) {
        c = add(NAME("clip_coef_p%g%s", cps[k], k == 3 ? "_unclipped" : ""), LK_OP_CLIP_COEF, T_EXACT);
        dts(c, LK_F64, LK_F32, 0, 0);
        c->d.clip = (lk_clip_params){7, cps[k], k == 3 ? 1e6 : 0.5};
        ops(c, 0, 7, I_POS, 0), ops(c, 1, 1, I_RAND, 0);
    }
    static const lk_dtype sdt[] = {LK_F32, LK_BF16, LK_F16};
    for (int k = 0; k < 3; k++) {
        c = add(NAME("scale_by_%s", lk_dtype_name(sdt[k])), LK_OP_SCALE_BY, T_EXACT);
        dts(c, sdt[k], LK_F32, sdt[k], 0);
        c->d.clip = (lk_clip_params){.n = 2000};
        ops(c, 0, 2000, I_RAND, 0), ops(c, 1, 1, I_POS, 0), ops(c, 2, 2000, I_RAND, 0);
    }
    /* SyncBatchNorm's per-channel finish over C = 6: the forward with weight (stride 2), bias and running
     * statistics (running_var stride 3) in f32, bf16 and f16 (widened), and with none of them; the backward
     * with every output and with only dw and db (no input gradient, no weight). Last in the table, so the
     * cases before it keep the random inputs they had. */
    for (int k = 0; k < 4; k++) {
        lk_dtype pt = k == 1 ? LK_BF16 : k == 2 ? LK_F16 : LK_F32;
        bool bare = k == 3;
        c = add(NAME("bn_finish%s%s", bare ? "_bare" : "_", bare ? "" : lk_dtype_name(pt)), LK_OP_BN_FINISH, T_EXACT);
        for (int i = 0; i < 7; i++) c->d.dtype[i] = i == 0 ? LK_F64 : i <= 4 ? pt : LK_F32;
        c->d.bn_finish = (lk_bn_finish_params){6, 1e-5f, 0.1f, {bare ? 0 : 2, bare ? 0 : 1, bare ? 0 : 1, bare ? 0 : 3}};
        init_kind p = bare ? I_NULL : I_RAND;
        ops(c, 0, 13, I_RAND, 0), ops(c, 1, 12, p, 0), ops(c, 2, 6, p, 0), ops(c, 3, 6, p, 0);
        ops(c, 4, 18, bare ? I_NULL : I_POS, 0), ops(c, 5, 12, I_RAND, 0), ops(c, 6, 12, I_RAND, 0);
        c->fix = bn_finish_sums;
    }
    for (int k = 0; k < 2; k++) {
        c = add(NAME("bn_finish_backward%s", k ? "_no_dx" : ""), LK_OP_BN_FINISH_BACKWARD, T_EXACT);
        for (int i = 0; i < 7; i++) c->d.dtype[i] = i == 0 || i == 2 ? LK_F64 : LK_F32;
        c->d.bn_finish = (lk_bn_finish_params){.C = 6};
        ops(c, 0, 24, I_RAND, 0), ops(c, 1, 6, k ? I_NULL : I_RAND, 0), ops(c, 2, 1, I_POS, 0);
        ops(c, 3, 12, I_POS, 0), ops(c, 4, 6, I_RAND, 0), ops(c, 5, 6, I_RAND, 0), ops(c, 6, 24, k ? I_NULL : I_RAND, 0);
        c->fix = bn_finish_sums;
    }
#undef NAME
}

#ifndef LK_OPS_ALL_BACKENDS /* the cuda backend's own checks */
/* What the cuda backend lacks is an UNSUPPORTED error naming the op, the
 * backend and the device, never a silent run on the CPU. */
static void unsupported_is_an_error(void) {
    /* a bf16 mean: refused on purpose (see cuda_takes_what_cpu_takes) */
    lk_op_desc d = {.op = LK_OP_BN_STATS, .dtype = {LK_F32, LK_F32, LK_BF16, LK_F64}};
    d.bn_split = (lk_bn_split_params){2, 3, 4, LK_BN_SUM, false};
    void *x[4] = {NULL};
    int64_t fb = lk__backend_fallbacks();
    CHECK_ERR(lk__backend_run(gpu0, &d, x), LK_STATUS_UNSUPPORTED,
              "the cuda backend has no bn_stats");
    CHECK(strstr(lk_last_error(), "cuda:0 is not host-addressable"));
    CHECK(lk__backend_fallbacks() == fb);
    /* a host pointer where device memory belongs */
    float host[4] = {1, 2, 3, 4};
    lk_op_desc u = {.op = LK_OP_UNARY, .dtype = {LK_F32, LK_F32}};
    u.unary = (lk_unary_params){LK_UNARY_RELU, 4, 0, false};
    CHECK_ERR(lk__backend_run(gpu0, &u, (void *[]){host, host}), LK_STATUS_INVALID_ARGUMENT,
              "operand 0");
    CHECK(strstr(lk_last_error(), "is host memory, expected cuda device memory"));
    /* a live block in host memory: the kernel would read it from the device */
    void *dx = NULL;
    CHECK_OK(lk_device_alloc(gpu0, 4 * sizeof(float), &dx));
    lk_affine_live lv = {2.0f, 0.0f};
    lk_op_desc a = {.op = LK_OP_AFFINE, .dtype = {LK_F32, LK_F32}, .live = &lv};
    a.affine = (lk_affine_params){4, 1.0f, 0.0f, false};
    CHECK_ERR(lk__backend_run(gpu0, &a, (void *[]){dx, dx}), LK_STATUS_INVALID_ARGUMENT, "its live block");
    CHECK(strstr(lk_last_error(), "is host memory, expected cuda device memory"));
    lk_device_free(gpu0, dx, 4 * sizeof(float));
}

/* The operand the cuda backend keeps f32 where the CPU's supports() also
 * takes bf16/f16 (the one deliberate gap, backend.c's header): batch and
 * layer norm's saved statistics and SyncBatchNorm's mean / coefficients.
 * No caller makes them 16-bit (ops_norm.c allocates them f32), and the
 * CPU's 16-bit path reads them as f32 (norm.c's chunked batch / layer norm)
 * or past their end (widen.c's count for BN_STATS' mean and BN_APPLY's
 * forward coefficients), so there is nothing right to match. -1: none. */
static int kept_f32_operand(lk_op_kind op) {
    int keep = -1; /* ops.def's WIDEN(k) */
    return lk__op_widens(op, &keep) ? keep : -1;
}

/* For every descriptor of the table, and every way of making each of its
 * float operands f32, bf16 or f16 (a copy's two operands: every dtype):
 * what the CPU backend supports, the cuda backend supports too (a
 * mixed-precision run on a GPU never stops at UNSUPPORTED where the CPU
 * runs), but for kept_f32_operand's gap. */
static void cuda_takes_what_cpu_takes(void) {
    static const lk_dtype fdt[3] = {LK_F32, LK_BF16, LK_F16};
    static const lk_dtype all[LK_DTYPE_COUNT] = {LK_F32, LK_F64, LK_BF16, LK_F16, LK_I32, LK_I64, LK_U8};
    long taken = 0, gap = 0, reported = 0;
    for (int t = 0; t < ncases; t++) {
        const op_case *c = &table[t];
        bool copy = c->d.op == LK_OP_COPY;
        const lk_dtype *set = copy ? all : fdt;
        int fl[LK_OP_MAX_OPERANDS], nf = 0, nset = copy ? LK_DTYPE_COUNT : 3;
        for (int i = 0; i < lk__op_arity(c->d.op); i++)
            if (copy || c->d.dtype[i] == LK_F32 || c->d.dtype[i] == LK_BF16 || c->d.dtype[i] == LK_F16) fl[nf++] = i;
        long combos = 1;
        for (int k = 0; k < nf; k++) combos *= nset;
        for (long m = 0; m < combos; m++) {
            lk_op_desc d = c->d;
            long r = m;
            for (int k = 0; k < nf; k++, r /= nset) d.dtype[fl[k]] = set[r % nset];
            if (!lk__cpu_backend.supports(&d)) continue;
            taken++;
            if (lk__cuda_backend.supports(&d)) continue;
            int keep = kept_f32_operand(d.op);
            if (keep >= 0 && d.dtype[keep] != LK_F32) {
                gap++;
                continue;
            }
            char what[160];
            lk_t_failed_checks++;
            if (reported++ < 20)
                fprintf(stderr, "%s: the CPU backend takes %s, the cuda backend does not\n", c->name,
                        lk__op_desc_str(&d, what, sizeof what));
        }
    }
    CHECK(taken > 0);
    printf("supports(): %ld descriptors the CPU takes (the table's, over f32/bf16/f16 operands), %ld refused by cuda "
           "(16-bit statistics, on purpose), %ld refused otherwise\n", taken, gap, reported);
}

/* supports() refuses what no kernel here runs (no GPU needed to ask). */
static void supports_says_no(void) {
    lk_op_desc d = {.op = LK_OP_BN_STATS, .dtype = {LK_F32, LK_F32, LK_BF16, LK_F64}}; /* kept_f32_operand */
    CHECK(!lk__cuda_backend.supports(&d));
    d = (lk_op_desc){.op = LK_OP_BATCH_NORM, .dtype = {LK_BF16, LK_F32, LK_F32, LK_F32, LK_F32, LK_BF16, LK_BF16}};
    CHECK(!lk__cuda_backend.supports(&d));
    d.dtype[6] = LK_F32; /* the same with f32 statistics: taken */
    CHECK(lk__cuda_backend.supports(&d));
    d = (lk_op_desc){.op = LK_OP_COL2IM, .dtype = {LK_BF16, LK_BF16}}; /* f32 only, as the CPU */
    CHECK(!lk__cuda_backend.supports(&d));
    d = (lk_op_desc){.op = LK_OP_SOFTMAX, .dtype = {LK_BF16, LK_BF16}}; /* f32 only, as the CPU */
    CHECK(!lk__cuda_backend.supports(&d));
    d = (lk_op_desc){.op = LK_OP_GEMM, .dtype = {LK_BF16, LK_F16, LK_F32}};
    CHECK(!lk__cuda_backend.supports(&d));
    d = (lk_op_desc){.op = LK_OP_COPY, .dtype = {LK_BF16, LK_BF16}};
    d.copy.accumulate = true; /* accumulate: f32 only */
    CHECK(!lk__cuda_backend.supports(&d));
    d = (lk_op_desc){.op = LK_OP_UNARY, .dtype = {LK_F64, LK_F32}};
    CHECK(!lk__cuda_backend.supports(&d));
}

#endif

static bool selected(const char *name, int argc, char **argv) {
    if (argc <= 1) return true;
    for (int a = 1; a < argc; a++)
        if (!strncmp(name, argv[a], strlen(argv[a]))) return true;
    return false;
}

/* Every op kind has a case here, so a new op cannot reach the cuda
 * backend unchecked (the table is the cuda side of the one op harness). */
static void every_op_in_table(void) {
    bool seen[LK_OP_COUNT] = {false};
    for (int i = 0; i < ncases; i++) seen[table[i].d.op] = true;
    for (int k = 0; k < LK_OP_COUNT; k++) {
        lk_op_desc d = {.op = (lk_op_kind)k};
        char what[160];
        CHECK_MSG(seen[k], "op kind %d (%s) has no case in the gpu_ops table", k, lk__op_desc_str(&d, what, sizeof what));
    }
}

#ifdef LK_OPS_ALL_BACKENDS
static lk_isa_level isa_under_test;
/* The CPU backend with its loops taken from another instruction set's copy
 * (the level is a process-wide cache; the reference run takes the best). */
static lk_status cpu_at_level(const lk_op_desc *d, void *const *x) {
    int best = __atomic_load_n(&lk__cpu_isa_level, __ATOMIC_RELAXED);
    __atomic_store_n(&lk__cpu_isa_level, (int)isa_under_test, __ATOMIC_RELAXED);
    lk_status st = lk__cpu_backend.run(d, x);
    __atomic_store_n(&lk__cpu_isa_level, best, __ATOMIC_RELAXED);
    return st;
}
static lk_device dbg_dev;
/* Through the registry on the debug device: its own loops where it has
 * them, the CPU backend's (the counted fallback) elsewhere. */
static lk_status on_debug(const lk_op_desc *d, void *const *x) { return lk__backend_run(dbg_dev, d, x); }

/* ---- gradient checks: a backward descriptor against central differences of
 * its forward. L = sum w[i] y[i] for fixed random w, so dy = w; dL/dx[j] is
 * (L(x + h e_j) - L(x - h e_j)) / 2h with h = 1e-2 in double over f32
 * outputs: error O(h^2) from the curvature plus ~1e-5 from the rounding of
 * L, hence 2e-2 relative to max(1, |dx|): a wrong formula or a swapped
 * operand is off by far more. Inputs keep |x| >= 0.1, away from the kinks of
 * relu, abs, leaky_relu and elu at 0 (log and sqrt: x > 0). */
enum { GN = 12 };
static double weighted(const float *y, const float *w, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)w[i] * y[i];
    return s;
}
static void grad_close(const char *what, const char *be, int j, double fd, float an) {
    CHECK_MSG(fabs(fd - an) <= 2e-2 * fmax(1.0, fabs(an)), "%s on %s: dx[%d] = %.6g, central difference %.6g", what, be,
              j, (double)an, fd);
}
/* Central differences of sum(w * f(x)) against the backward's dx, element by element. */
static void fd_check(lk_status (*run)(const lk_op_desc *, void *const *), const lk_op_desc *f, const float *x,
                     const float *w, const float *dx, const char *what, const char *be) {
    float xp[GN], yp[GN];
    for (int j = 0; j < GN; j++) {
        const double h = 1e-2;
        memcpy(xp, x, sizeof xp);
        xp[j] = (float)(x[j] + h);
        CHECK_OK(run(f, (void *[]){xp, yp}));
        double up = weighted(yp, w, GN);
        xp[j] = (float)(x[j] - h);
        CHECK_OK(run(f, (void *[]){xp, yp}));
        double fd = (up - weighted(yp, w, GN)) / ((double)(float)(x[j] + h) - (double)(float)(x[j] - h));
        grad_close(what, be, j, fd, dx[j]);
    }
}
static void gradcheck_unary(lk_status (*run)(const lk_op_desc *, void *const *), const char *be) {
    for (int fn = 0; fn < LK_UNARY_COUNT; fn++) {
        bool pos = fn == LK_UNARY_LOG || fn == LK_UNARY_SQRT;
        float x[GN], y[GN], w[GN], dx[GN];
        for (int i = 0; i < GN; i++) {
            float m = 0.1f + 1.9f * (urand() * 0.25f + 0.5f);
            x[i] = pos || i % 2 ? m : -m;
            w[i] = urand();
        }
        lk_op_desc f = {.op = LK_OP_UNARY, .dtype = {LK_F32, LK_F32}};
        f.unary = (lk_unary_params){(lk_unary_op)fn, GN, 0.1f, false};
        lk_op_desc b = f;
        b.op = LK_OP_UNARY_BACKWARD;
        b.dtype[2] = b.dtype[3] = LK_F32;
        CHECK_OK(run(&f, (void *[]){x, y}));
        CHECK_OK(run(&b, (void *[]){x, y, w, dx}));
        fd_check(run, &f, x, w, dx, lk__unary_name((lk_unary_op)fn), be);
    }
}
static void gradcheck_softmax(lk_status (*run)(const lk_op_desc *, void *const *), const char *be) {
    for (int lg = 0; lg < 2; lg++) { /* [outer 2, C 3, inner 2] */
        float x[GN], y[GN], w[GN], dx[GN];
        for (int i = 0; i < GN; i++) x[i] = 2.0f * urand(), w[i] = urand();
        lk_op_desc f = {.op = LK_OP_SOFTMAX, .dtype = {LK_F32, LK_F32}};
        f.softmax = (lk_softmax_params){2, 3, 2, lg == 1};
        lk_op_desc b = f;
        b.op = LK_OP_SOFTMAX_BACKWARD;
        b.dtype[2] = LK_F32;
        CHECK_OK(run(&f, (void *[]){x, y}));
        CHECK_OK(run(&b, (void *[]){y, w, dx}));
        fd_check(run, &f, x, w, dx, lg ? "log_softmax" : "softmax", be);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    table_only = true;
    build_table();
    every_op_in_table();
    lk_isa_level best = lk__cpu_isa();
    for (int lvl = LK_ISA_BASELINE; lvl < (int)best; lvl++) {
        isa_under_test = (lk_isa_level)lvl;
        second_run = cpu_at_level, second_name = lk__cpu_isa_name(isa_under_test);
        printf("== cpu backend, %s copies, against %s\n", second_name, lk__cpu_isa_name(best));
        for (int i = 0; i < ncases; i++)
            if (selected(table[i].name, argc, argv)) run_case(&table[i]);
    }
    dbg_dev = dbg_backend_device();
    second_run = on_debug, second_name = "debug", sums_reordered = true;
    long before = dbg_backend_ran_total(), fb = lk__backend_fallbacks();
    printf("== debug backend on the debug device, against the cpu backend\n");
    for (int i = 0; i < ncases; i++)
        if (selected(table[i].name, argc, argv)) run_case(&table[i]);
    printf("debug backend: %ld descriptors run natively, %lld through the CPU fallback\n",
           dbg_backend_ran_total() - before, (long long)(lk__backend_fallbacks() - fb));
    CHECK(dbg_backend_ran_total() > before);
    int bad0 = lk_t_failed_checks;
    gradcheck_unary(lk__cpu_backend.run, "cpu"), gradcheck_unary(on_debug, "debug");
    gradcheck_softmax(lk__cpu_backend.run, "cpu"), gradcheck_softmax(on_debug, "debug");
    printf("gradient checks (unary x %d, softmax, log_softmax; cpu and debug): %s\n", LK_UNARY_COUNT,
           lk_t_failed_checks == bad0 ? "ok" : "FAILED");
    printf("%d descriptors compared, %d differ; %d failed checks\n", cases_run, cases_bad, lk_t_failed_checks);
    return lk_t_failed_checks ? 1 : 0;
}
#else
int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    table_only = argc > 1 && !strcmp(argv[1], "--table");
    if (table_only) argc--, argv++;
#ifdef LK_GPU_OPS_EMU
    table_only = true;
#endif
    if (!table_only) {
        gpu_test_require();
        CHECK(!strcmp(lk__backend(gpu0)->name, "cuda"));
    }
    build_table();
    for (int i = 0; i < ncases; i++) {
#ifdef LK_GPU_OPS_EMU
        if (table[i].d.op == LK_OP_GEMM) continue;
#endif
        if (selected(table[i].name, argc, argv)) run_case(&table[i]);
    }
    if (table_only) supports_says_no(), cuda_takes_what_cpu_takes(), every_op_in_table();
    else if (selected("unsupported", argc, argv)) unsupported_is_an_error();
    printf("%d descriptors compared, %d differ; %d failed checks\n", cases_run, cases_bad, lk_t_failed_checks);
    return lk_t_failed_checks ? 1 : 0;
}
#endif

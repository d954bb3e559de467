/* bf16 and f16 GEMMs on the CPU. oneDNN runs them where it is built and has
 * a real implementation for the shape on this CPU (AMX, AVX512-BF16/FP16, or
 * its AVX512 emulation); f16 on an AMX-BF16 CPU whose oneDNN has no f16 GEMM
 * runs as three bf16 GEMMs in one (bf16x3, below); otherwise A and B are
 * widened to f32 and the f32 GEMM runs — the same products accumulated in
 * f32, so the same result up to summation order, only slower. C is f32 or
 * the operands' 16-bit type (rounded to nearest even once, at the end). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

/* Rows x cols of a stored matrix (ld in elements) widened to a dense f32 block. */
static void widen(lk_dtype dt, const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, float *dst) {
    for (int64_t r = 0; r < rows; r++) lk_half_to_f32_n(dt, dst + r * cols, src + r * ld, (size_t)cols);
}

static lk_status gemm_via_f32(const lk_op_desc *d, const void *A, const void *B, void *C) {
    const lk_gemm_params *g = &d->gemm;
    lk_dtype ab = d->dtype[0], ct = d->dtype[2];
    int64_t ar = g->trans_a ? g->K : g->M, ac = g->trans_a ? g->M : g->K;
    int64_t br = g->trans_b ? g->N : g->K, bc = g->trans_b ? g->K : g->N;
    size_t na = (size_t)(ar * ac), nb = (size_t)(br * bc), nc = ct == LK_F32 ? 0 : (size_t)(g->M * g->N);
    float *buf = lk_aligned_alloc(LK_ALIGN, (na + nb + nc + 1) * sizeof(float));
    if (!buf) return lk_error(LK_STATUS_OUT_OF_MEMORY, "gemm %s: no room to widen the operands to f32", lk_dtype_name(ab));
    float *a = buf, *b = buf + na, *c = b + nb;
    widen(ab, A, ar, ac, g->lda, a);
    widen(ab, B, br, bc, g->ldb, b);
    lk_op_desc f = *d;
    f.dtype[0] = f.dtype[1] = f.dtype[2] = LK_F32;
    f.gemm.lda = ac > 0 ? ac : 1, f.gemm.ldb = bc > 0 ? bc : 1;
    lk_status st;
    if (ct == LK_F32) {
        st = lk__cpu_gemm_f32(&f, a, b, C);
    } else {
        if (g->beta != 0.0f) widen(ct, C, g->M, g->N, g->ldc, c);
        f.gemm.ldc = g->N > 0 ? g->N : 1;
        st = lk__cpu_gemm_f32(&f, a, b, c);
        for (int64_t r = 0; !st && r < g->M; r++)
            lk_f32_to_half_n(ct, (uint16_t *)C + r * g->ldc, c + r * g->N, (size_t)g->N);
    }
    lk_aligned_free(buf);
    return st;
}

/* LK_ONEDNN=0 sends every bf16/f16 GEMM through f32 (to compare the paths). */
static int dnnl_state = -1; /* -1: not read yet */

void lk__cpu_lowp_use_dnnl(bool on) { __atomic_store_n(&dnnl_state, on ? 1 : 0, __ATOMIC_RELAXED); }

static bool use_dnnl(void) {
    int s = __atomic_load_n(&dnnl_state, __ATOMIC_RELAXED);
    if (s < 0) {
        s = lk_env_get_long("LK_ONEDNN", 1) != 0;
        __atomic_store_n(&dnnl_state, s, __ATOMIC_RELAXED);
    }
    return s;
}

bool lk__cpu_lowp_dnnl_on(void) { return use_dnnl(); }

/* Which library runs the f32 GEMMs (32-true, the f32 ops, the 16-bit
 * fallback's widened panels): LK_F32_GEMM=auto (default), onednn or openblas.
 * auto takes oneDNN where its f32 kernels were measured faster for whole
 * training steps: an AMX-class Intel CPU (oneDNN's isa avx512_core_amx,
 * Sapphire Rapids and later), 3-17% on every cell of the mlp, autoencoder
 * and cnn (docs/BENCHMARKS.md, "f32 GEMMs: the automatic choice"). Elsewhere
 * OpenBLAS: on AMD EPYC (AVX-512) oneDNN's GEMMs alone were 2-23% ahead but
 * whole steps 0-7%, inside the noise, and a CPU without AVX-512 was never
 * measured. Either library sums in its own order, so the choice shows in a
 * 32-true result's last bits; it is fixed per machine (cpuid), never timed at
 * run time, so a machine's runs stay bitwise repeatable. */
static int f32_state = -1;

/* Whether oneDNN runs on AMX here (its isa avx512_core_amx: Sapphire Rapids
 * and later), from cpuid, asked once: the f32 library choice and the bf16
 * GEMMs' cut both follow it. */
static bool cpu_amx(void) {
    static int amx = -1;
    int a = __atomic_load_n(&amx, __ATOMIC_RELAXED);
    if (a < 0) {
#ifdef LK_HAVE_DNNL
        a = !strcmp(lk__dnnl_isa(), "avx512_core_amx");
#else
        a = 0;
#endif
        __atomic_store_n(&amx, a, __ATOMIC_RELAXED);
    }
    return a;
}

bool lk__cpu_f32_gemm_dnnl(void) {
    int s = __atomic_load_n(&f32_state, __ATOMIC_RELAXED);
    if (s < 0) {
        const char *v = lk_env_get("LK_F32_GEMM");
        if (v && (!*v || !strcmp(v, "auto"))) v = NULL;
        if (v && strcmp(v, "onednn") && strcmp(v, "openblas")) {
            lk_log_warn("LK_F32_GEMM=%s is none of auto, onednn, openblas: f32 GEMMs take the automatic choice (%s)", v,
                        cpu_amx() ? "onednn" : "openblas");
            v = NULL;
        }
#ifdef LK_HAVE_DNNL
        s = v ? !strcmp(v, "onednn") : cpu_amx();
#else
        s = 0; /* built without oneDNN: LK_F32_GEMM=onednn has nothing to take */
#endif
        __atomic_store_n(&f32_state, s, __ATOMIC_RELAXED);
    }
    return s;
}

void lk__cpu_f32_gemm_use_dnnl(bool on) { __atomic_store_n(&f32_state, on ? 1 : 0, __ATOMIC_RELAXED); }

/* One GEMM on the calling thread: oneDNN (single-threaded), else OpenBLAS
 * for f32 and the widening to f32 for 16-bit operands. */
static lk_status gemm_one(const lk_op_desc *d, const void *A, const void *B, void *C) {
    bool f32 = d->dtype[0] == LK_F32;
#ifdef LK_HAVE_DNNL
    if (f32 ? lk__cpu_f32_gemm_dnnl() : use_dnnl()) {
        lk_status st = lk__dnnl_gemm(d, A, B, C);
        if (st != LK_STATUS_UNSUPPORTED) return st;
    }
#else
    (void)use_dnnl;
#endif
    if (f32) {
        const lk_gemm_params *g = &d->gemm;
        lk__cpu_sgemm1(g->trans_a, g->trans_b, g->M, g->N, g->K, g->alpha, A, g->lda, B, g->ldb, g->beta, C, g->ldc);
        return LK_STATUS_OK;
    }
    return gemm_via_f32(d, A, B, C);
}

/* lockstep, not oneDNN's OpenMP, owns the process's threads (as with BLAS,
 * docs/ARCHITECTURE.md): a GEMM worth splitting is cut by output rows or
 * columns across the compute pool and every piece runs single-threaded.
 * oneDNN's own OpenMP team spun after each call and fought the pool's
 * workers (and other ranks): a 2-thread bf16 fit ran 1.6k-46k samples/s
 * from run to run, 72k with OMP_WAIT_POLICY=PASSIVE. */
typedef struct {
    const lk_op_desc *d;
    const char *A, *B;
    char *C;
    size_t ea, ec; /* element sizes of A/B and C */
    bool by_cols;
    bool dnnl_only; /* lk__cpu_gemm_dnnl: every piece through oneDNN, no fallback */
    int width;
    lk_status st[64];
} lowp_job;

/* One piece through oneDNN only (UNSUPPORTED where it has no fast code or
 * lockstep was built without it). */
static lk_status dnnl_one(const lk_op_desc *d, const void *A, const void *B, void *C) {
#ifdef LK_HAVE_DNNL
    return lk__dnnl_gemm(d, A, B, C);
#else
    (void)d, (void)A, (void)B, (void)C;
    return LK_STATUS_UNSUPPORTED;
#endif
}

static void lowp_task(void *ctx, int t) {
    lowp_job *j = ctx;
    const lk_gemm_params *g = &j->d->gemm;
    int64_t a, b;
    lk__task_range(j->by_cols ? g->N : g->M, t, j->width, 16, &a, &b);
    j->st[t] = LK_STATUS_OK;
    if (b <= a) return;
    lk_op_desc d = *j->d;
    const char *A = j->A, *B = j->B;
    char *C = j->C;
    if (j->by_cols) {
        d.gemm.N = b - a;
        B += (size_t)(g->trans_b ? a * g->ldb : a) * j->ea;
        C += (size_t)a * j->ec;
    } else {
        d.gemm.M = b - a;
        A += (size_t)(g->trans_a ? a : a * g->lda) * j->ea;
        C += (size_t)(a * g->ldc) * j->ec;
    }
    j->st[t] = j->dnnl_only ? dnnl_one(&d, A, B, C) : gemm_one(&d, A, B, C);
}

/* The work below which a GEMM runs whole on the calling thread. A cut
 * moves operands the caller has just written (the rounded weight, the
 * activations) to the other cores' caches, a cost that grows with their size
 * while the time saved shrinks with the kernel's speed. 8 MFLOP for f32 and
 * the 16-bit fallback. 256 MFLOP for bf16 through oneDNN on AMX, ~5x f32's
 * rate (bench ops): on a 2-core AMX Xeon, cut at 8 MFLOP, a bf16-mixed
 * mlp or autoencoder step (GEMMs up to 205 MFLOP) ran slower on two compute
 * threads than on one; uncut below 256 MFLOP, the autoencoder gained 16-28%
 * and the mlp 1-8%, the cnn nothing (docs/BENCHMARKS.md, "bf16 GEMMs on AMX
 * stay on one core"). Decided by cpuid, like the library choice: the cut
 * never depends on timing. */
static double split_flops(const lk_op_desc *d, bool dnnl_only) {
    bool amx_bf16 = d->dtype[0] == LK_BF16 && (dnnl_only || use_dnnl()) && cpu_amx();
    return (amx_bf16 ? 256.0 : 8.0) * 1024 * 1024;
}

/* The bf16 GEMM an f16 one runs as under bf16x3 (below): bf16 operands over
 * 3K, C in f32 (the caller sets the split operands' and C's leading
 * dimensions). */
static lk_op_desc bf16x3_desc(const lk_op_desc *d) {
    lk_op_desc e = *d;
    e.dtype[0] = e.dtype[1] = LK_BF16;
    e.dtype[2] = LK_F32;
    e.gemm.K = 3 * d->gemm.K;
    return e;
}

bool lk__cpu_gemm_cut(const lk_op_desc *d) {
    lk_op_desc e = d->dtype[0] == LK_F16 && lk__cpu_f16_via_bf16() ? bf16x3_desc(d) : *d; /* as it runs */
    const lk_gemm_params *g = &e.gemm;
    bool by_cols, openblas = e.dtype[0] == LK_F32 && !lk__cpu_f32_gemm_dnnl();
    return lk__cpu_gemm_width(g->M, g->N, g->K, openblas ? LK__CPU_SGEMM_SPLIT_FLOPS : split_flops(&e, false),
                              &by_cols) > 1;
}

static lk_status split_run(const lk_op_desc *d, const void *A, const void *B, void *C, bool dnnl_only) {
    const lk_gemm_params *g = &d->gemm;
    if (g->M == 0 || g->N == 0) return LK_STATUS_OK;
    bool by_cols;
    int width = lk__cpu_gemm_width(g->M, g->N, g->K, split_flops(d, dnnl_only), &by_cols);
    if (width > 64) width = 64;
    if (width <= 1) return dnnl_only ? dnnl_one(d, A, B, C) : gemm_one(d, A, B, C);
    lowp_job job = {d, A, B, C, lk_dtype_size(d->dtype[0]), lk_dtype_size(d->dtype[2]), by_cols, dnnl_only, width, {0}};
    lk__parallel_run(width, lowp_task, &job);
    for (int t = 0; t < width; t++)
        if (job.st[t]) return job.st[t];
    return LK_STATUS_OK;
}

/* ---- f16 as bf16 pairs (bf16x3) ---------------------------------------------
 * oneDNN 2 has no f16 GEMM on a CPU without AMX-FP16, so on an AMX-BF16 CPU
 * (Sapphire Rapids, Emerald Rapids) 16-mixed's GEMMs would fall back to f32.
 * They run on the bf16 units instead: every f16 value x is exactly hi + lo,
 * hi its rounding to bf16 (8 significant bits) and lo = x - hi (at most 3,
 * |lo| <= 2^-8 |x|; f16's exponent range lies inside bf16's, so both are
 * exact bf16 values, subnormal f16 included). Then
 *     a b = ah bh + ah bl + al bh + al bl,
 * every product exact in f32. The first three run as one bf16 GEMM over
 * K' = 3K, A' = [Ah Ah Al] and B' = [Bh; Bl; Bh], summed in f32 by AMX. The
 * fourth, at most 2^-16 |a b|, is left out: a dot product gains at most
 * 2^-16 sum |a b|, the order of f32 summation's own worst case over 256
 * terms and 32 times below the rounding each f16 operand already carries.
 * Three bf16 products on AMX take less time than one f32 product: 1.3x
 * f32's rate at the training steps' shapes with the split included, where
 * four (exact products) would be no faster than f32 (docs/BENCHMARKS.md,
 * "16-mixed on AMX"). An inf or NaN reaches C as the f32 GEMM's sum would
 * carry it (lk__cpu_split_f16, cpu/convert.c). */

/* Whether this CPU and oneDNN call for it (asked once; LK_ONEDNN=0 turns it
 * off with the rest of oneDNN, per call). */
bool lk__cpu_f16_via_bf16(void) {
    static int state = -1;
    int s = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (s < 0) {
#ifdef LK_HAVE_DNNL
        s = cpu_amx() && lk__dnnl_native(LK_BF16) && !lk__dnnl_native(LK_F16);
#else
        s = 0;
#endif
        __atomic_store_n(&state, s, __ATOMIC_RELAXED);
    }
    return s && use_dnnl();
}

/* Which of an operand's three blocks along K hold hi, hi2 and lo: A' = [Ah Ah Al], B' = [Bh; Bl; Bh]. */
typedef struct {
    int hi, hi2, lo;
} split_blocks;
static const split_blocks A_BLOCKS = {0, 1, 2}, B_BLOCKS = {0, 2, 1};

/* A stored rows x cols matrix (leading dimension ld) written to dst as its
 * three blocks along K: stacked (K runs down the stored rows: dst is 3 rows
 * x cols, leading dimension cols) or side by side (K runs along a row: dst
 * is rows x 3 cols). */
static void split_operand(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool k_down, split_blocks b,
                          uint16_t *dst) {
    int64_t step = k_down ? rows * cols : cols, ldd = k_down ? cols : 3 * cols;
    for (int64_t r = 0; r < rows; r++) {
        uint16_t *row = dst + r * ldd;
        LK_ISA_PICK(lk__cpu_split_f16)(src + r * ld, row + b.hi * step, row + b.hi2 * step, row + b.lo * step, cols);
    }
}


static lk_status gemm_f16_split(const lk_op_desc *d, const void *A, const void *B, void *C) {
    const lk_gemm_params *g = &d->gemm;
    if (g->M == 0 || g->N == 0) return LK_STATUS_OK;
    int64_t M = g->M, N = g->N, K = g->K;
    bool c16 = d->dtype[2] != LK_F32;
    size_t nb = (size_t)(3 * K * N), nc = c16 ? (size_t)(M * N) : 0;
    /* A in panels of C's rows, so the split copy stays a few MB whatever M */
    int64_t mp = K > 0 && M * K > (1 << 20) ? ((1 << 20) / K + 15) & ~(int64_t)15 : M;
    if (mp < 16) mp = 16;
    if (mp > M) mp = M;
    size_t na = (size_t)(3 * K * mp), up = LK_ALIGN - 1;
    size_t aoff = (nb * sizeof(uint16_t) + up) & ~up, coff = (aoff + na * sizeof(uint16_t) + up) & ~up;
    char *mem = lk__cpu_scratch_for(LK__SCRATCH_GEMM, coff + nc * sizeof(float));
    if (!mem)
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "gemm f16 %lldx%lldx%lld: no room (%zu bytes) to split its operands",
                        (long long)M, (long long)N, (long long)K, coff + nc * sizeof(float));
    uint16_t *bs = (uint16_t *)mem, *as = (uint16_t *)(mem + aoff);
    float *cs = (float *)(mem + coff);
    if (g->trans_b) split_operand(B, N, K, g->ldb, false, B_BLOCKS, bs);
    else split_operand(B, K, N, g->ldb, true, B_BLOCKS, bs);
    if (c16 && g->beta != 0.0f)
        for (int64_t r = 0; r < M; r++)
            lk_half_to_f32_n(d->dtype[2], cs + r * N, (const uint16_t *)C + r * g->ldc, (size_t)N);
    lk_op_desc e = bf16x3_desc(d);
    e.gemm.ldb = g->trans_b ? 3 * K : N;
    if (c16) e.gemm.ldc = N;
    lk_status st = LK_STATUS_OK;
    for (int64_t m0 = 0; m0 < M && !st; m0 += mp) {
        int64_t m = M - m0 < mp ? M - m0 : mp;
        const uint16_t *a = (const uint16_t *)A + (g->trans_a ? m0 : m0 * g->lda);
        if (g->trans_a) split_operand(a, K, m, g->lda, true, A_BLOCKS, as);
        else split_operand(a, m, K, g->lda, false, A_BLOCKS, as);
        e.gemm.M = m;
        e.gemm.lda = g->trans_a ? m : 3 * K;
        void *c = c16 ? (void *)(cs + m0 * N) : (void *)((float *)C + m0 * g->ldc);
        st = split_run(&e, as, bs, c, false);
    }
    for (int64_t r = 0; c16 && !st && r < M; r++)
        lk_f32_to_half_n(d->dtype[2], (uint16_t *)C + r * g->ldc, cs + r * N, (size_t)N);
    return st;
}

bool lk__cpu_gemm_native(lk_dtype dt) {
    if (dt == LK_F32) return true;
#ifdef LK_HAVE_DNNL
    return use_dnnl() && (lk__dnnl_native(dt) || (dt == LK_F16 && lk__cpu_f16_via_bf16()));
#else
    return false;
#endif
}

lk_status lk__cpu_gemm_lowp(const lk_op_desc *d, const void *A, const void *B, void *C) {
    if (d->dtype[0] == LK_F16 && d->dtype[1] == LK_F16 && d->gemm.K > 0 && lk__cpu_f16_via_bf16())
        return gemm_f16_split(d, A, B, C);
    return split_run(d, A, B, C, false);
}

lk_status lk__cpu_gemm_f32(const lk_op_desc *d, const void *A, const void *B, void *C) {
    const lk_gemm_params *g = &d->gemm;
    if (lk__cpu_f32_gemm_dnnl()) return lk__cpu_gemm_f32_dnnl(d, A, B, C);
    lk__cpu_sgemm(g->trans_a, g->trans_b, g->M, g->N, g->K, g->alpha, A, g->lda, B, g->ldb, g->beta, C, g->ldc);
    return LK_STATUS_OK;
}

lk_status lk__cpu_gemm_f32_dnnl(const lk_op_desc *d, const void *A, const void *B, void *C) {
    return split_run(d, A, B, C, false);
}

/* Measurement (bench ops): every piece through oneDNN, no fallback. */
lk_status lk__cpu_gemm_dnnl(const lk_op_desc *d, const void *A, const void *B, void *C) {
    return split_run(d, A, B, C, true);
}

/* The policy above is this file's, so the words for it are too; cpu_dnnl.c
 * only answers what oneDNN has (lk__dnnl_gemm_impl), and never calls back
 * here. */
const char *lk__cpu_gemm_path(lk_dtype ab, lk_dtype ct) {
#ifdef LK_HAVE_DNNL
    static _Thread_local char buf[320];
    if (ab == LK_F32 && !lk__cpu_f32_gemm_dnnl()) return "openblas sgemm";
    if (ab != LK_F32 && !lk__cpu_lowp_dnnl_on()) return "f32 fallback (LK_ONEDNN=0)";
    if (ab == LK_F16 && lk__cpu_f16_via_bf16()) {
        char bf[160];
        snprintf(bf, sizeof bf, "%s", lk__cpu_gemm_path(LK_BF16, LK_F32));
        snprintf(buf, sizeof buf, "bf16x3: each f16 split into two bf16, three bf16 products through %s", bf);
        return buf;
    }
    char impl[128];
    int native = lk__dnnl_gemm_impl(ab, ct, impl, sizeof impl);
    if (native < 0) return "f32 fallback (oneDNN has no CPU engine)";
    if (native) snprintf(buf, sizeof buf, "onednn %s (cpu isa %s)", impl, lk__dnnl_isa());
    else snprintf(buf, sizeof buf, "f32 fallback (oneDNN %s has no native %s GEMM on this cpu, isa %s)",
                  lk__dnnl_major() == 2 ? "2" : "3", lk_dtype_name(ab), lk__dnnl_isa());
    return buf;
#else
    (void)ct;
    return ab == LK_F32 ? "openblas sgemm" : "f32 fallback (built without oneDNN)";
#endif
}

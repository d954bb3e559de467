/* lockstep's own small-shape f32 GEMM (src/backend/cpu/gemm_small.c)
 * against a double-precision reference on the same inputs: every transpose,
 * M, N and K each over 1..67 (the edge tiles of 6 x 16 and 6 x 32) and a
 * grid of the three, several alpha/beta pairs, leading dimensions wider
 * than the matrices (their padding NaN: never read, C's never written), and
 * C full of NaN under beta 0 (never read). The tolerance is the bound of a
 * K-term fused multiply-add chain plus the epilogue's two roundings:
 * (K + 2) 2^-24 (|alpha| sum_k |a_ik b_kj| + |beta c_ij|), plus 1e-30.
 * Then the bits: the blocked form of a transposed A with a long K (the
 * weight gradients) gives the one FMA chain's bits exactly (a scalar fmaf
 * chain as reference), every instruction-set copy this CPU can run gives
 * the same C, a GEMM cut into row or column pieces gives the whole one's
 * bits, and LK_GEMM=own sends the backend's threaded GEMM through the same
 * chains; LK_GEMM=auto's rule per instruction-set level (the CPU's, so
 * that LK_CPU_ISA's lowering changes no routing). */
#include <stdint.h>
#include <unistd.h>

#include "backend/cpu/cpu_impl.h"
#include "backend/cpu/gemm_small.h"
#include "lk_capture.h"
#include "lk_test.h"

static float rnd(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

typedef struct {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float *A, *B, *C0; /* C0: C before the call */
} gcase;

/* Stored A (rows x cols at ld), padding NaN. */
static float *mat(int64_t rows, int64_t cols, int64_t ld, uint32_t seed, bool nan_fill) {
    float *p = malloc((size_t)(rows * ld + 1) * sizeof *p);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld; c++) p[r * ld + c] = c < cols && !nan_fill ? rnd(&seed) : NAN;
    return p;
}

static gcase make(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad, bool c_nan) {
    gcase g = {ta, tb, M, N, K, (ta ? M : K) + pad, (tb ? K : N) + pad, N + pad, NULL, NULL, NULL};
    g.A = mat(ta ? K : M, ta ? M : K, g.lda, 11u + (uint32_t)(M * 131 + K), false);
    g.B = mat(tb ? N : K, tb ? K : N, g.ldb, 29u + (uint32_t)(N * 7 + K * 3), false);
    g.C0 = mat(M, N, g.ldc, 5u + (uint32_t)N, c_nan);
    if (!c_nan) /* C's padding stays NaN: it must come back NaN */
        for (int64_t r = 0; r < M; r++)
            for (int64_t c = N; c < g.ldc; c++) g.C0[r * g.ldc + c] = NAN;
    return g;
}

static void drop(gcase *g) { free(g->A), free(g->B), free(g->C0); }

static float *run_own(const gcase *g, float alpha, float beta) {
    float *C = malloc((size_t)(g->M * g->ldc + 1) * sizeof *C);
    memcpy(C, g->C0, (size_t)(g->M * g->ldc + 1) * sizeof *C);
    CHECK(lk__cpu_sgemm_own(g->ta, g->tb, g->M, g->N, g->K, alpha, g->A, g->lda, g->B, g->ldb, beta, C, g->ldc));
    return C;
}

static int cases;

/* One shape against the double reference. */
static void check_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta, int64_t pad) {
    bool c_nan = beta == 0.0f;
    gcase g = make(ta, tb, M, N, K, pad, c_nan);
    float *C = run_own(&g, alpha, beta);
    double worst = 0;
    int64_t wi = 0, wj = 0;
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double s = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? g.A[k * g.lda + i] : g.A[i * g.lda + k], b = tb ? g.B[j * g.ldb + k] : g.B[k * g.ldb + j];
                s += a * b, mag += fabs(a * b);
            }
            double c0 = beta == 0.0f ? 0.0 : g.C0[i * g.ldc + j];
            double want = (double)alpha * s + (double)beta * c0;
            double tol = (double)(K + 2) * 0x1p-24 * (fabs(alpha) * mag + fabs(beta * c0)) + 1e-30;
            double err = fabs((double)C[i * g.ldc + j] - want) / tol;
            if (!(err <= worst)) worst = err, wi = i, wj = j; /* NaN is the worst */
        }
        for (int64_t j = N; j < g.ldc; j++) CHECK_MSG(isnan(C[i * g.ldc + j]), "C's padding written at %lld, %lld", (long long)i, (long long)j);
    }
    CHECK_MSG(worst <= 1.0, "%c%c M %lld N %lld K %lld alpha %g beta %g: C[%lld][%lld] = %.9g, %.3g of the tolerance",
              ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)M, (long long)N, (long long)K, alpha, beta, (long long)wi,
              (long long)wj, C[wi * g.ldc + wj], worst);
    free(C);
    drop(&g);
    cases++;
}

static const float alphas[] = {1.0f, 1.0f, 0.125f, -2.5f}, betas[] = {0.0f, 1.0f, 0.0f, -0.75f};

static void test_edges(void) {
    cases = 0;
    int n = 0;
    for (int t = 0; t < 4; t++)
        for (int64_t v = 1; v <= 67; v++, n++) {
            bool ta = t & 1, tb = t & 2;
            float al = alphas[n % 4], be = betas[n % 4];
            check_ref(ta, tb, v, 17, 9, al, be, n % 3);
            check_ref(ta, tb, 13, v, 9, al, be, n % 3);
            check_ref(ta, tb, 7, 35, v, al, be, n % 3);
        }
    CHECK(cases == 4 * 67 * 3);
}

static void test_grid(void) {
    static const int64_t Ms[] = {1, 2, 5, 6, 7, 12, 13, 31, 64, 67}, Ns[] = {1, 3, 8, 15, 16, 17, 31, 32, 33, 47, 64, 67},
                         Ks[] = {1, 2, 5, 16, 33, 67};
    int n = 0;
    for (int t = 0; t < 4; t++)
        for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
                for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++, n++)
                    check_ref(t & 1, t & 2, Ms[a], Ns[b], Ks[c], alphas[n % 4], betas[(n / 4) % 4], 1 + n % 5);
}

static bool same(const float *x, const float *y, size_t n) { return !memcmp(x, y, n * sizeof *x); }

/* The rule itself, in scalar code: C[i][j] = fma(beta, C, alpha chain)
 * where chain is one fmaf over k = 0 .. K - 1 from +0; rows [r0, r1). */
static int exact_rows(const gcase *g, float alpha, float beta, const float *C, int64_t r0, int64_t r1) {
    int bad = 0;
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = 0; j < g->N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < g->K; k++) {
                float a = g->ta ? g->A[k * g->lda + i] : g->A[i * g->lda + k];
                float b = g->tb ? g->B[j * g->ldb + k] : g->B[k * g->ldb + j];
                acc = fmaf(a, b, acc);
            }
            float t = alpha * acc, want = beta == 0.0f ? t : fmaf(beta, g->C0[i * g->ldc + j], t);
            if (memcmp(&want, &C[i * g->ldc + j], sizeof want)) bad++;
        }
    return bad;
}

/* A transposed A with K >= 256 (the weight gradients' shape) takes the
 * blocked form: K cut into blocks of at most 512 whose chains resume from
 * partial sums, N into blocks of packed panels, M into chunks of rows when
 * the partial sums would pass 4 MiB. Every C element must still be the one
 * chain in k order, bit for bit: K at one, two and three blocks and on
 * their edges, N over one and several blocks, M on the tiles' edges, and a
 * tall case (32,780 rows, 2 blocks of K) whose partial sums take two chunks
 * (checked at the chunks' seam and ends; the copies compare all of it). */
static void test_ta_blocked(void) {
    static const int64_t shapes[][3] = {{13, 40, 256}, {50, 300, 511}, {7, 33, 512}, {67, 600, 513},
                                        {6, 17, 1024}, {31, 290, 1500}, {1, 1, 700}};
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int tb = 0; tb < 2; tb++, n++) {
            float al = alphas[n % 4], be = betas[n % 4];
            gcase g = make(true, tb, shapes[s][0], shapes[s][1], shapes[s][2], 1 + n % 3, be == 0.0f);
            float *C = run_own(&g, al, be);
            int bad = exact_rows(&g, al, be, C, 0, g.M);
            CHECK_MSG(!bad, "T%c M %lld N %lld K %lld: %d elements are not the one FMA chain's bits", tb ? 'T' : 'N',
                      (long long)g.M, (long long)g.N, (long long)g.K, bad);
            free(C);
            drop(&g);
            if (s < 3) check_ref(true, tb, shapes[s][0], shapes[s][1], shapes[s][2], al, be, 2);
        }
    gcase g = make(true, false, 32780, 17, 513, 0, false);
    float *C = run_own(&g, 1.0f, 1.0f);
    int bad = exact_rows(&g, 1.0f, 1.0f, C, 0, 6) + exact_rows(&g, 1.0f, 1.0f, C, 32760, 32780);
    CHECK_MSG(!bad, "32780 x 17 x 513 TN: %d elements are not the one FMA chain's bits", bad);
    lk_isa_level best = lk__cpu_isa();
    for (int l = 0; l < (int)best; l++) {
        __atomic_store_n(&lk__cpu_isa_level, l, __ATOMIC_RELAXED);
        float *C2 = run_own(&g, 1.0f, 1.0f);
        CHECK_MSG(same(C, C2, (size_t)(g.M * g.ldc)), "32780 x 17 x 513 TN: the %s copy differs from %s",
                  lk__cpu_isa_name((lk_isa_level)l), lk__cpu_isa_name(best));
        free(C2);
    }
    __atomic_store_n(&lk__cpu_isa_level, (int)best, __ATOMIC_RELAXED);
    free(C);
    drop(&g);
}

/* Each copy this CPU runs (baseline, avx2, avx512 as built) gives the same bits. */
static void test_isa_copies(void) {
    lk_isa_level best = lk__cpu_isa();
    static const int64_t shapes[][3] = {{64, 64, 32}, {67, 33, 67}, {13, 49, 128}, {6, 16, 1}, {67, 300, 1030}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int t = 0; t < 4; t++) {
            gcase g = make(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 3, false);
            float *ref = run_own(&g, 0.5f, 1.0f);
            for (int l = 0; l < (int)best; l++) {
                __atomic_store_n(&lk__cpu_isa_level, l, __ATOMIC_RELAXED);
                float *C = run_own(&g, 0.5f, 1.0f);
                CHECK_MSG(same(C, ref, (size_t)(g.M * g.ldc)), "%s copy differs from %s at shape %zu, transposes %d",
                          lk__cpu_isa_name((lk_isa_level)l), lk__cpu_isa_name(best), s, t);
                free(C);
            }
            __atomic_store_n(&lk__cpu_isa_level, (int)best, __ATOMIC_RELAXED);
            free(ref);
            drop(&g);
        }
    printf("copies compared below %s: %d\n", lk__cpu_isa_name(best), (int)best);
}

/* Rows [0, m1) and [m1, M) (or columns) in two calls: the whole call's bits. */
static void test_cuts(void) {
    for (int t = 0; t < 8; t++) { /* t >= 4: K = 600, two blocks of K when A is transposed */
        bool ta = t & 1, tb = t & 2;
        gcase g = make(ta, tb, 45, 70, t < 4 ? 37 : 600, 2, false);
        float *ref = run_own(&g, 1.0f, 0.5f);
        for (int64_t cut = 1; cut < 45; cut += 7) {
            float *C = malloc((size_t)(g.M * g.ldc + 1) * sizeof *C);
            memcpy(C, g.C0, (size_t)(g.M * g.ldc + 1) * sizeof *C);
            const float *A2 = ta ? g.A + cut : g.A + cut * g.lda;
            CHECK(lk__cpu_sgemm_own(ta, tb, cut, g.N, g.K, 1.0f, g.A, g.lda, g.B, g.ldb, 0.5f, C, g.ldc));
            CHECK(lk__cpu_sgemm_own(ta, tb, g.M - cut, g.N, g.K, 1.0f, A2, g.lda, g.B, g.ldb, 0.5f, C + cut * g.ldc, g.ldc));
            CHECK_MSG(same(C, ref, (size_t)(g.M * g.ldc)), "row cut at %lld, transposes %d", (long long)cut, t);
            memcpy(C, g.C0, (size_t)(g.M * g.ldc + 1) * sizeof *C);
            int64_t jc = cut + 5;
            const float *B2 = tb ? g.B + jc * g.ldb : g.B + jc;
            CHECK(lk__cpu_sgemm_own(ta, tb, g.M, jc, g.K, 1.0f, g.A, g.lda, g.B, g.ldb, 0.5f, C, g.ldc));
            CHECK(lk__cpu_sgemm_own(ta, tb, g.M, g.N - jc, g.K, 1.0f, g.A, g.lda, B2, g.ldb, 0.5f, C + jc, g.ldc));
            CHECK_MSG(same(C, ref, (size_t)(g.M * g.ldc)), "column cut at %lld, transposes %d", (long long)jc, t);
            free(C);
        }
        free(ref);
        drop(&g);
    }
}

/* LK_GEMM=own: the backend's GEMM (cut across the compute threads when big
 * enough) gives the kernel's bits; blas and auto are accepted too. */
static void test_mode(void) {
    lk__gemm_mode old = lk__cpu_gemm_mode();
    lk__cpu_gemm_set_mode(LK__GEMM_OWN);
    for (int t = 0; t < 4; t++) {
        gcase g = make(t & 1, t & 2, 256, 192, 128, 1, false);
        float *ref = run_own(&g, 1.0f, 1.0f);
        float *C = malloc((size_t)(g.M * g.ldc + 1) * sizeof *C);
        memcpy(C, g.C0, (size_t)(g.M * g.ldc + 1) * sizeof *C);
        lk__cpu_sgemm(t & 1, t & 2, g.M, g.N, g.K, 1.0f, g.A, g.lda, g.B, g.ldb, 1.0f, C, g.ldc);
        CHECK_MSG(same(C, ref, (size_t)(g.M * g.ldc)), "LK_GEMM=own through lk__cpu_sgemm, transposes %d", t);
        free(C), free(ref);
        drop(&g);
    }
    CHECK(lk__cpu_gemm_own(false, false, 1, 1, 1));
    lk__cpu_gemm_set_mode(LK__GEMM_BLAS);
    CHECK(!lk__cpu_gemm_own(false, true, 64, 64, 32));
    lk__cpu_gemm_set_mode(old);
}

/* The triangular forms (causal attention's tiles) give the full GEMM's
 * bits where they promise values: C_LOWER on C[i][j], j <= i + off; A_LOWER
 * and A_UPPER on all of C, op(A)'s promised zeros (+0 and -0 mixed) being
 * skipped or added. */
static void test_tri(void) {
    static const int64_t offs[] = {0, 5, -7, 30};
    for (int t = 0; t < 4; t++)
        for (size_t o = 0; o < sizeof offs / sizeof *offs; o++)
            for (int tri = LK__TRI_C_LOWER; tri <= LK__TRI_A_UPPER; tri++) {
                bool ta = t & 1, tb = t & 2;
                int64_t off = offs[o];
                gcase g = make(ta, tb, 45, 53, 61, 2, false);
                for (int64_t i = 0; i < g.M && tri != LK__TRI_C_LOWER; i++)
                    for (int64_t k = 0; k < g.K; k++)
                        if (tri == LK__TRI_A_LOWER ? k > i + off : k < i + off) {
                            int64_t e = ta ? k * g.lda + i : i * g.lda + k;
                            g.A[e] = (k + i) % 2 ? 0.0f : -0.0f;
                        }
                float *ref = run_own(&g, 0.5f, 1.0f);
                float *C = malloc((size_t)(g.M * g.ldc + 1) * sizeof *C);
                memcpy(C, g.C0, (size_t)(g.M * g.ldc + 1) * sizeof *C);
                CHECK(lk__cpu_sgemm_own_tri(ta, tb, g.M, g.N, g.K, 0.5f, g.A, g.lda, g.B, g.ldb, 1.0f, C, g.ldc,
                                            (lk__gemm_tri)tri, off));
                int bad = 0;
                for (int64_t i = 0; i < g.M; i++)
                    for (int64_t j = 0; j < g.N; j++)
                        if ((tri != LK__TRI_C_LOWER || j <= i + off) &&
                            memcmp(&C[i * g.ldc + j], &ref[i * g.ldc + j], sizeof *C))
                            bad++;
                CHECK_MSG(!bad, "tri %d off %lld transposes %d: %d elements differ from the full GEMM", tri,
                          (long long)off, t, bad);
                free(C), free(ref);
                drop(&g);
            }
}

/* LK_GEMM=auto's fixed rule per instruction-set level: the GPT's linears
 * (small GPT 16 x 64 tokens, GPT-2 124M 4 x 64) forward and input gradient
 * on the own kernel from 512 rows with K <= 512 on AVX2, from 128 rows up
 * to K = 4096 on AVX-512; weight gradients (TN) from K = 256 on AVX-512
 * only. */
static void test_auto_rule(void) {
    static const struct {
        bool ta, tb;
        int64_t M, N, K;
        bool avx2, avx512;
    } rows[] = {
        {false, true, 1024, 384, 128, true, true},    /* small GPT c_attn forward */
        {false, false, 1024, 128, 512, true, true},   /* small GPT mlp.c_proj input gradient */
        {true, false, 384, 128, 1024, false, true},   /* small GPT c_attn weight gradient */
        {false, true, 256, 2304, 768, false, true},   /* GPT-2 c_attn forward at 4 x 64 */
        {false, false, 256, 768, 3072, false, true},  /* GPT-2 mlp.c_fc input gradient */
        {false, true, 256, 50304, 768, false, true},  /* GPT-2 lm_head forward */
        {false, false, 256, 768, 50304, false, false}, /* GPT-2 lm_head input gradient */
        {true, false, 3072, 768, 256, false, true},   /* GPT-2 mlp.c_fc weight gradient */
        {true, false, 50304, 768, 256, false, false}, /* GPT-2 lm_head weight gradient */
        {true, false, 64, 32, 64, false, false},      /* attention's dV, dK tiles (attention.c's own call) */
        {false, true, 256, 10, 128, false, false},    /* the mlp's 10 classes */
        {false, true, 64, 64, 32, false, false},      /* below the rows */
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        CHECK_MSG(lk__cpu_gemm_own_rule(LK_ISA_AVX2, rows[i].ta, rows[i].tb, rows[i].M, rows[i].N, rows[i].K) ==
                      rows[i].avx2, "avx2 rule, row %zu", i);
        CHECK_MSG(lk__cpu_gemm_own_rule(LK_ISA_BASELINE, rows[i].ta, rows[i].tb, rows[i].M, rows[i].N, rows[i].K) ==
                      rows[i].avx2, "baseline rule, row %zu", i);
        CHECK_MSG(lk__cpu_gemm_own_rule(LK_ISA_AVX512, rows[i].ta, rows[i].tb, rows[i].M, rows[i].N, rows[i].K) ==
                      rows[i].avx512, "avx512 rule, row %zu", i);
        CHECK(lk__cpu_gemm_own_shape(rows[i].ta, rows[i].tb, rows[i].M, rows[i].N, rows[i].K) ==
              (lk__cpu_caps().avx512f ? rows[i].avx512 : rows[i].avx2));
    }
    /* the CPU's level, not the loops': LK_CPU_ISA lowered changes no routing, so no result */
    lk_isa_level best = lk__cpu_isa();
    CHECK(lk__cpu_gemm_rule_level() == (lk__cpu_caps().avx512f ? LK_ISA_AVX512 : LK_ISA_AVX2));
    for (int l = 0; l < (int)best; l++) {
        __atomic_store_n(&lk__cpu_isa_level, l, __ATOMIC_RELAXED);
        for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
            CHECK_MSG(lk__cpu_gemm_own_shape(rows[i].ta, rows[i].tb, rows[i].M, rows[i].N, rows[i].K) ==
                          (lk__cpu_caps().avx512f ? rows[i].avx512 : rows[i].avx2),
                      "the rule moved with the loops' level %s, row %zu", lk__cpu_isa_name((lk_isa_level)l), i);
    }
    __atomic_store_n(&lk__cpu_isa_level, (int)best, __ATOMIC_RELAXED);
}

/* LK_GEMM picks the kernel; a value it does not know is named in a warning
 * and the automatic choice runs. */
static void test_env(void) {
    lk__gemm_mode old = lk__cpu_gemm_mode();
    static const struct { const char *v; lk__gemm_mode m; } vals[] = {
        {"own", LK__GEMM_OWN}, {"blas", LK__GEMM_BLAS}, {"auto", LK__GEMM_AUTO}};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        setenv("LK_GEMM", vals[i].v, 1);
        lk__cpu_gemm_set_mode((lk__gemm_mode)-1);
        CHECK_MSG(lk__cpu_gemm_mode() == vals[i].m, "LK_GEMM=%s", vals[i].v);
    }
    lk_t_capture cap;
    CHECK(lk_t_capture_begin(&cap) == 0);
    setenv("LK_GEMM", "fast", 1);
    lk__cpu_gemm_set_mode((lk__gemm_mode)-1);
    lk__gemm_mode m = lk__cpu_gemm_mode();
    char buf[512];
    ssize_t got = lk_t_capture_end(&cap, buf, sizeof buf);
    CHECK(m == LK__GEMM_AUTO);
    CHECK_MSG(got > 0 && strstr(buf, "LK_GEMM=fast is none of auto, own, blas: f32 GEMMs take the automatic choice"),
              "warning: %s", buf);
    unsetenv("LK_GEMM");
    lk__cpu_gemm_set_mode(old);
}

LK_TEST_MAIN(LK_TEST_CASE(test_edges), LK_TEST_CASE(test_tri), LK_TEST_CASE(test_grid), LK_TEST_CASE(test_ta_blocked),
             LK_TEST_CASE(test_isa_copies), LK_TEST_CASE(test_cuts),
             LK_TEST_CASE(test_mode), LK_TEST_CASE(test_auto_rule), LK_TEST_CASE(test_env))

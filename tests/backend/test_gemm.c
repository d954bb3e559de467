/* The typed GEMM op over every dtype combination the CPU backend supports —
 * f32, bf16 and f16 operands, C in f32 or the operands' type — for both
 * transposes, alpha/beta, padded leading dimensions and odd shapes, through
 * oneDNN (where built) and through the f32 fallback, against a double
 * reference on the same (already rounded) inputs. Products of two 16-bit
 * floats are exact in f32, so the only error is the f32 accumulation order
 * (bounded by K * 2^-24 of the sum of |products|) plus one final rounding
 * when C is 16-bit — but for f16 on an AMX-BF16 CPU (bf16x3, cpu_lowp.c),
 * which leaves out each product's lo x lo part, below 2^-16 of it. An
 * unsupported combination is refused with its name. */
#include "backend/backend_impl.h"
#include "lk_test.h"

static float rnd(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Fills a stored matrix (rows x cols, leading dim ld) of dtype dt with values
 * that dt represents exactly; also returns them widened. */
static int spread; /* > 0: values times 2^e, e uniform in [-spread, spread / 2] (f16's whole range at 24) */

static void fill(lk_dtype dt, void *p, float *wide, int64_t rows, int64_t cols, int64_t ld, uint32_t seed) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld; c++) {
            float v = rnd(&seed) * (c < cols ? 1.0f : 0.0f) + (c < cols ? 0.0f : NAN); /* padding: NaN, never read */
            if (spread) v = ldexpf(v, (int)((seed >> 3) % (uint32_t)(spread + spread / 2 + 1)) - spread);
            if (dt == LK_F32) ((float *)p)[r * ld + c] = v;
            else {
                uint16_t h;
                lk_f32_to_half_n(dt, &h, &v, 1);
                ((uint16_t *)p)[r * ld + c] = h;
                lk_half_to_f32_n(dt, &v, &h, 1);
            }
            wide[r * ld + c] = v;
        }
}

static int cases_run;
static bool dnnl_f32; /* run through lk__cpu_gemm_dnnl (bench ops' f32 onednn column) */

static void one(lk_dtype ab, lk_dtype ct, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    int64_t pad = 3;
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int64_t lda = ac + pad, ldb = bc + pad, ldc = N + pad;
    size_t es = lk_dtype_size(ab), cs = lk_dtype_size(ct);
    void *A = calloc((size_t)(ar * lda) + 1, es), *B = calloc((size_t)(br * ldb) + 1, es), *C = calloc((size_t)(M * ldc) + 1, cs);
    float *Aw = calloc((size_t)(ar * lda) + 1, 4), *Bw = calloc((size_t)(br * ldb) + 1, 4), *Cw = calloc((size_t)(M * ldc) + 1, 4);
    fill(ab, A, Aw, ar, ac, lda, 1u + (uint32_t)(M * 7 + N));
    fill(ab, B, Bw, br, bc, ldb, 2u + (uint32_t)(K * 5));
    fill(ct, C, Cw, M, N, ldc, 3u);
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {ab, ab, ct}};
    d.gemm = (lk_gemm_params){ta, tb, M, N, K, lda, ldb, ldc, alpha, beta};
    CHECK(lk__cpu_backend.supports(&d));
    if (dnnl_f32) {
        lk_status st = lk__cpu_gemm_dnnl(&d, A, B, C);
        if (st == LK_STATUS_UNSUPPORTED) { /* no fast oneDNN code for this shape: nothing measured */
            free(A), free(B), free(C), free(Aw), free(Bw), free(Cw);
            return;
        }
        CHECK_OK(st);
    } else CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){A, B, C}));
    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = Aw[ta ? k * lda + i : i * lda + k], b = Bw[tb ? j * ldb + k : k * ldb + j];
                acc += a * b, mag += fabs(a * b);
            }
            double want = alpha * acc + (beta != 0 ? beta * Cw[i * ldc + j] : 0);
            double got = ct == LK_F32 ? ((float *)C)[i * ldc + j] : 0;
            if (ct != LK_F32) {
                float f;
                lk_half_to_f32_n(ct, &f, (uint16_t *)C + i * ldc + j, 1);
                got = f;
            }
            double bound = (double)(K + 2) * 0x1p-23 * (fabs(alpha) * mag + fabs(beta * Cw[i * ldc + j]));
            if (ab == LK_F16 && !dnnl_f32 && lk__cpu_f16_via_bf16()) bound += fabs(alpha) * mag * 0x1p-16;
            if (ct == LK_BF16) bound += fabs(want) * 0x1p-8;
            if (ct == LK_F16) bound += fabs(want) * 0x1p-11 + 0x1p-24;
            double err = fabs(got - want);
            if (!(err <= bound)) worst = err > worst || isnan(err) ? (isnan(err) ? INFINITY : err) : worst;
        }
    char what[160];
    CHECK_MSG(worst == 0, "%s alpha %g beta %g: error %.3g beyond the bound", lk__op_desc_str(&d, what, sizeof what), alpha, beta, worst);
    cases_run++;
    free(A), free(B), free(C), free(Aw), free(Bw), free(Cw);
}

static void sweep(void) {
    static const lk_dtype combos[][2] = {{LK_F32, LK_F32}, {LK_BF16, LK_F32}, {LK_BF16, LK_BF16}, {LK_F16, LK_F32}, {LK_F16, LK_F16}};
    static const int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 11}, {13, 1, 9}, {1, 17, 3}, {33, 20, 64}, {64, 48, 130}, {7, 5, 0}};
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 4; t++) {
                one(combos[c][0], combos[c][1], t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, 0.0f);
                one(combos[c][0], combos[c][1], t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 0.5f, 1.0f);
            }
}

static void through_onednn(void) {
    lk__cpu_lowp_use_dnnl(true);
    cases_run = 0;
    sweep();
    printf("%d GEMM cases through the default path; bf16: %s\n", cases_run, lk__cpu_gemm_path(LK_BF16, LK_F32));
    printf("f16: %s\n", lk__cpu_gemm_path(LK_F16, LK_F32)); /* one call per printf: the text is one buffer */
}

/* The path each 16-bit dtype takes and whether it counts as native (the
 * trainer's precision line) agree, and LK_ONEDNN=0 says so in both. */
static void path_and_native_agree(void) {
    for (int off = 0; off < 2; off++) {
        lk__cpu_lowp_use_dnnl(!off);
        for (int k = 0; k < 2; k++) {
            lk_dtype dt = k ? LK_F16 : LK_BF16;
            char path[320];
            snprintf(path, sizeof path, "%s", lk__cpu_gemm_path(dt, LK_F32));
            bool fallback = !strncmp(path, "f32 fallback", 12);
            CHECK_MSG(lk__cpu_gemm_native(dt) == !fallback, "%s: native %d, path %s", lk_dtype_name(dt),
                      (int)lk__cpu_gemm_native(dt), path);
            if (off && !strstr(path, "built without oneDNN"))
                CHECK_MSG(!strcmp(path, "f32 fallback (LK_ONEDNN=0)"), "%s with LK_ONEDNN=0: %s", lk_dtype_name(dt),
                          path);
            if (dt == LK_F16) CHECK(lk__cpu_f16_via_bf16() == !strncmp(path, "bf16x3", 6));
        }
    }
    lk__cpu_lowp_use_dnnl(true);
}

static void through_f32_fallback(void) {
    lk__cpu_lowp_use_dnnl(false);
    cases_run = 0;
    sweep();
    lk__cpu_lowp_use_dnnl(true);
    printf("%d GEMM cases through the f32 fallback\n", cases_run);
}

/* bench ops times f32 x f32 -> f32 through oneDNN next to OpenBLAS: the
 * numbers mean something only if oneDNN computes the same GEMM (the
 * shapes it takes, strides, transposes, alpha and beta included). */
static void f32_through_onednn(void) {
    static const int64_t shapes[][3] = {{5, 7, 11}, {33, 20, 64}, {64, 48, 130}, {256, 64, 256}, {7, 5, 0}};
    dnnl_f32 = true;
    cases_run = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            one(LK_F32, LK_F32, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, 0.0f);
            one(LK_F32, LK_F32, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 0.5f, 1.0f);
        }
    dnnl_f32 = false;
    printf("%d f32 GEMM cases through oneDNN\n", cases_run);
    /* with oneDNN built in and working, it takes the larger shapes */
    if (!strncmp(lk__cpu_gemm_path(LK_BF16, LK_F32), "onednn", 6)) CHECK(cases_run >= 8);
}

/* LK_F32_GEMM=onednn: training's f32 GEMMs through oneDNN, split across
 * two compute threads (the 256^3 shape is cut), each piece falling back to
 * OpenBLAS where oneDNN has no fast code; with beta 1 a piece must never be
 * computed twice. */
static void f32_training_path_onednn(void) {
    static const int64_t shapes[][3] = {{5, 7, 11}, {64, 48, 130}, {256, 256, 256}, {300, 40, 70}, {7, 5, 0}};
    int threads = lk_get_num_threads();
    lk_set_num_threads(2);
    lk__cpu_f32_gemm_use_dnnl(true);
    cases_run = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            one(LK_F32, LK_F32, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, 0.0f);
            one(LK_F32, LK_F32, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 0.5f, 1.0f);
        }
    const char *path = lk__cpu_gemm_path(LK_F32, LK_F32);
    printf("%d f32 GEMM cases through the training path with LK_F32_GEMM=onednn: %s\n", cases_run, path);
    CHECK(cases_run == 40);
    lk__cpu_f32_gemm_use_dnnl(false);
    CHECK(!strcmp(lk__cpu_gemm_path(LK_F32, LK_F32), "openblas sgemm"));
    lk_set_num_threads(threads);
}

/* bf16x3 on an AMX-BF16 CPU (elsewhere the same checks hold for whatever
 * path f16 takes): A larger than one split panel (M x K > 2^20 elements,
 * both transposes), and values at f16's edges — its largest finite value,
 * its smallest subnormal, inf and NaN — which must come out as the f32
 * GEMM gives them (65504 exactly, not 65536 - 32 rounded; inf, not the NaN
 * of inf - inf in a split). */
static void f16_split_panels_and_edges(void) {
    printf("f16 path: %s\n", lk__cpu_gemm_path(LK_F16, LK_F32));
    one(LK_F16, LK_F32, false, true, 1100, 24, 1000, 1.0f, 0.0f);
    one(LK_F16, LK_F32, true, false, 1100, 24, 1000, 0.5f, 1.0f);
    one(LK_F16, LK_F16, false, false, 1100, 20, 1000, 1.0f, 1.0f);
    /* f16's whole exponent range, subnormals included: the bound is relative
     * to each dot product's sum of |products|, whatever their scale */
    spread = 24;
    for (int t = 0; t < 4; t++) {
        one(LK_F16, LK_F32, t & 1, t & 2, 64, 48, 130, 1.0f, 0.0f);
        one(LK_F16, LK_F32, t & 1, t & 2, 33, 20, 640, 0.5f, 1.0f);
    }
    spread = 0;
    /* C[i][j] = sum_k A[i][k] B[k][j], K = 2, B = [[1, 1], [0, 1]] */
    static const float a[][2] = {{65504.0f, 0.0f}, {0x1p-24f, 0.0f}, {INFINITY, 0.0f}, {-INFINITY, 1.0f},
                                 {NAN, 0.0f}, {65504.0f, -65504.0f}, {0.1f, 0.2f}};
    enum { M = sizeof a / sizeof a[0] };
    uint16_t A[M][2], B[2][2];
    float b[2][2] = {{1.0f, 1.0f}, {0.0f, 1.0f}}, C[M][2];
    lk_f32_to_half_n(LK_F16, &A[0][0], &a[0][0], 2 * M);
    lk_f32_to_half_n(LK_F16, &B[0][0], &b[0][0], 4);
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {LK_F16, LK_F16, LK_F32}};
    d.gemm = (lk_gemm_params){false, false, M, 2, 2, 2, 2, 2, 1.0f, 0.0f};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){A, B, C}));
    float w[M][2];
    lk_half_to_f32_n(LK_F16, &w[0][0], &A[0][0], 2 * M);
    for (int i = 0; i < M; i++) {
        float want[2] = {w[i][0], w[i][0] + w[i][1]};
        for (int j = 0; j < 2; j++)
            CHECK_MSG(isnan(want[j]) ? isnan(C[i][j]) : C[i][j] == want[j], "row %d col %d: %g, want %g", i, j,
                      (double)C[i][j], (double)want[j]);
    }
}

static void unsupported_is_named(void) {
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {LK_BF16, LK_F16, LK_F32}};
    d.gemm = (lk_gemm_params){false, false, 2, 2, 2, 2, 2, 2, 1.0f, 0.0f};
    float buf[8] = {0};
    CHECK_ERR(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){buf, buf, buf}), LK_STATUS_UNSUPPORTED,
              "the cpu backend has no gemm bf16 x f16 -> f32 (NN, 2x2x2)");
    d.dtype[0] = d.dtype[1] = LK_I32;
    CHECK(!lk__cpu_backend.supports(&d));
}

LK_TEST_MAIN(LK_TEST_CASE(through_onednn), LK_TEST_CASE(through_f32_fallback), LK_TEST_CASE(f32_through_onednn), LK_TEST_CASE(f32_training_path_onednn),
             LK_TEST_CASE(f16_split_panels_and_edges), LK_TEST_CASE(path_and_native_agree),
             LK_TEST_CASE(unsupported_is_named))

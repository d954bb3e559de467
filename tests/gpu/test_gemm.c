/* The cuBLASLt GEMM against the CPU backend's GEMM: f32 (exact and TF32),
 * bf16 and f16 inputs with f32 or 16-bit output, every transpose pair, odd
 * shapes (1, 5, 7, 11, 129, 257, 513) and alpha/beta != 1/0.
 *
 * Tolerances (max |gpu - cpu| over max |cpu|): both sides multiply the same
 * rounded inputs exactly and accumulate in f32, so with an f32 C only the
 * summation order differs: 1e-4. A 16-bit C adds one rounding of the result:
 * bf16 8 mantissa bits -> 1e-2, f16 11 bits -> 2e-3. TF32 rounds the f32
 * inputs to 10 mantissa bits before multiplying: 5e-3. */
#include <math.h>
#include <string.h>

#include "backend/cuda/gemm.h"
#include "gpu_test.h"
#include "lk_test.h"

static const lk_device gpu0 = {LK_CUDA, 0};

static float rnd(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void fill(void *p, lk_dtype t, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        float v = rnd(&seed);
        if (t == LK_F32) ((float *)p)[i] = v;
        else if (t == LK_BF16) ((uint16_t *)p)[i] = lk_f32_to_bf16_bits(v);
        else ((uint16_t *)p)[i] = lk_f32_to_f16_bits(v);
    }
}

static float get(const void *p, lk_dtype t, size_t i) {
    if (t == LK_F32) return ((const float *)p)[i];
    if (t == LK_BF16) return lk_bf16_bits_to_f32(((const uint16_t *)p)[i]);
    return lk_f16_bits_to_f32(((const uint16_t *)p)[i]);
}

static int cases_run, cases_bad;

/* Byte offset of every operand from its allocation: 0, or a misalignment
 * (an element past a 256-byte boundary, as a parameter inside a flat buffer
 * is) that the plan's alignment preferences must allow for; never less
 * than the operand's own element (an f32 C of a bf16 GEMM two bytes off
 * would be misaligned for any kernel: the fake GPU's cuBLASLt refused it). */
static size_t skew;
static size_t skew_for(size_t elem) { return skew && skew < elem ? elem : skew; }

static void one(lk_dtype ab, lk_dtype c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                unsigned flags, double tol) {
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {ab, ab, c}};
    int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
    d.gemm = (lk_gemm_params){ta, tb, M, N, K, lda, ldb, ldc, alpha, beta};
    size_t na = (size_t)(M * K), nb = (size_t)(K * N), nc = (size_t)(M * N);
    size_t ea = lk_dtype_size(ab), ec = lk_dtype_size(c);
    void *A = malloc(na * ea), *B = malloc(nb * ea), *C = malloc(nc * ec), *Cg = malloc(nc * ec);
    fill(A, ab, na, 1 + (unsigned)M), fill(B, ab, nb, 2 + (unsigned)N), fill(C, c, nc, 3 + (unsigned)K);
    void *mA = NULL, *mB = NULL, *mC = NULL;
    size_t sab = skew_for(ea), sc = skew_for(ec);
    CHECK_OK(lk_device_alloc(gpu0, na * ea + sab, &mA));
    CHECK_OK(lk_device_alloc(gpu0, nb * ea + sab, &mB));
    CHECK_OK(lk_device_alloc(gpu0, nc * ec + sc, &mC));
    void *dA = (char *)mA + sab, *dB = (char *)mB + sab, *dC = (char *)mC + sc;
    CHECK_OK(lk_device_copy(gpu0, dA, LK_DEVICE_CPU, A, na * ea));
    CHECK_OK(lk_device_copy(gpu0, dB, LK_DEVICE_CPU, B, nb * ea));
    CHECK_OK(lk_device_copy(gpu0, dC, LK_DEVICE_CPU, C, nc * ec));
    CHECK(lk__cuda_gemm_supports(&d));
    void *gops[3] = {dA, dB, dC}, *cops[3] = {A, B, C};
    CHECK_OK(lk__cuda_gemm_run(0, &d, gops, flags));
    CHECK_OK(lk_device_synchronize(gpu0));
    CHECK_OK(lk_device_copy(LK_DEVICE_CPU, Cg, gpu0, dC, nc * ec));
    CHECK_OK(lk__cpu_backend.run(&d, cops));
    double maxref = 0, maxdiff = 0;
    size_t at = 0;
    for (size_t i = 0; i < nc; i++) {
        double r = get(C, c, i), g = get(Cg, c, i);
        maxref = fmax(maxref, fabs(r));
        if (!(fabs(g - r) <= maxdiff)) maxdiff = fabs(g - r), at = i;
    }
    double err = maxdiff / (maxref > 0 ? maxref : 1);
    char buf[128];
    cases_run++;
    if (!(err <= tol)) cases_bad++;
    CHECK_MSG(err <= tol, "%s alpha %g beta %g%s: normalised error %.3g > %.1g (first worst at %zu: gpu %g cpu %g)",
              lk__op_desc_str(&d, buf, sizeof buf), alpha, beta, flags ? " tf32" : "", err, tol, at, get(Cg, c, at),
              get(C, c, at));
    lk_device_free(gpu0, mA, na * ea + sab), lk_device_free(gpu0, mB, nb * ea + sab),
        lk_device_free(gpu0, mC, nc * ec + sc);
    free(A), free(B), free(C), free(Cg);
}

static const int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 11}, {64, 128, 256}, {257, 129, 513}, {13, 1, 7}};

static void sweep(lk_dtype ab, lk_dtype c, unsigned flags, double tol) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            one(ab, c, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 1, 0, flags, tol);
            one(ab, c, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 0.5f, 2, flags, tol);
        }
}

static void f32(void) { sweep(LK_F32, LK_F32, 0, 1e-4); }
static void tf32(void) { sweep(LK_F32, LK_F32, LK__CUDA_GEMM_TF32, 5e-3); }
static void bf16(void) {
    sweep(LK_BF16, LK_F32, 0, 1e-4);
    sweep(LK_BF16, LK_BF16, 0, 1e-2);
}
static void f16(void) {
    sweep(LK_F16, LK_F32, 0, 1e-4);
    sweep(LK_F16, LK_F16, 0, 2e-3);
}

/* Operands off the 256-byte alignment cuBLASLt assumes by default, and the
 * same shapes again: the plans kept from the aligned sweeps must not be
 * reused for them (the alignment is part of a plan's key). */
static void misaligned(void) {
    skew = 4;
    sweep(LK_F32, LK_F32, 0, 1e-4);
    skew = 2;
    sweep(LK_BF16, LK_F32, 0, 1e-4);
    sweep(LK_F16, LK_F16, 0, 2e-3);
    skew = 0;
}

static void refused(void) {
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {LK_F32, LK_BF16, LK_F32}};
    d.gemm = (lk_gemm_params){false, false, 2, 2, 2, 2, 2, 2, 1, 0};
    CHECK(!lk__cuda_gemm_supports(&d));
    void *ops[3] = {0};
    CHECK_ERR(lk__cuda_gemm_run(0, &d, ops, 0), LK_STATUS_UNSUPPORTED, "cuda GEMM: ");
    d.dtype[1] = LK_F32, d.dtype[2] = LK_BF16; /* f32 inputs, bf16 output: not offered */
    CHECK(!lk__cuda_gemm_supports(&d));
    printf("%d GEMMs compared, %d outside tolerance\n", cases_run, cases_bad);
}

int main(int argc, char **argv) {
    /* --load (no GPU needed): cuBLASLt, which gemm.c dlopens instead of
     * linking, loads from this toolkit with every entry point it uses. */
    if (argc > 1 && !strcmp(argv[1], "--load")) {
        lk_status st = lk__cuda_gemm_load();
        printf("%s\n", st ? lk_last_error() : "cuBLASLt loaded, every entry point resolved");
        return st ? 1 : 0;
    }
    gpu_test_require();
    static const lk_t_case cases[] = {LK_TEST_CASE(f32),        LK_TEST_CASE(tf32),   LK_TEST_CASE(bf16),
                                      LK_TEST_CASE(f16),        LK_TEST_CASE(misaligned), LK_TEST_CASE(refused)};
    return lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}

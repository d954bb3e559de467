/* src/backend/cuda/gemm.c, unchanged, against the fake cuBLASLt
 * (libcublasLt.so.<major> from the fake's directory) over stub_runtime.cpp:
 * lockstep's row-major GEMM in every dtype combination gemm.c supports,
 * both transposes, K 0 and 4, beta 0 (C NaN, never read) and 1.5, padded
 * leading dimensions and operands 256-byte aligned or one element past it
 * (gemm.c's alignment promise to the heuristic), against a double
 * reference. Until the fake CUDA runtime runs gemm.c end to end, this is
 * what checks gemm.c's layouts, transposes and alignments without a GPU:
 * the few runtime and library calls gemm.c makes besides cuBLASLt are
 * stood in for below. Tolerance: 1e-6 of sum |alpha a b| + |beta c| for the
 * f32 accumulation, plus 2^-8 (bf16 out), 2^-11 (f16 out or TF32 inputs)
 * of |ref| + that sum. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/gemm.h"
#include "device/gpu.h"
#include "lockstep/dtype.h"

void *lk_stub_alloc(size_t n, int device); /* stub_runtime.cpp */
void lk_stub_copy(void *dst, const void *src, size_t n);
int lk_stub_sync(void);
void lk_stub_free(void *p);

/* ---- stand-ins for what gemm.c calls besides cuBLASLt ---------------------- */
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = lk_stub_alloc(n, 0);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
lk_status lk__cuda_stream(int device, struct CUstream_st **out) {
    (void)device;
    *out = (struct CUstream_st *)0x10; /* any non-NULL stream: the stub refuses only NULL */
    return LK_STATUS_OK;
}
bool lk__cuda_capturing(int device) {
    (void)device;
    return false;
}
lk_status lk__cuda_capture_refuse(int device, const char *what, int e) {
    (void)e;
    fprintf(stderr, "cuda:%d: capture refused: %s\n", device, what);
    return LK_STATUS_DEVICE;
}
lk_status lk_error(lk_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    return code;
}
void lk__error_trace(const char *file, int line) {
    (void)file;
    (void)line;
}
const char *lk__op_desc_str(const lk_op_desc *d, char *buf, size_t size) {
    snprintf(buf, size, "gemm dtypes %d %d %d", (int)d->dtype[0], (int)d->dtype[1], (int)d->dtype[2]);
    return buf;
}

/* ---- the cases ----------------------------------------------------------------- */
static size_t esz(lk_dtype t) { return t == LK_F32 ? 4 : 2; }
static double rd(const void *p, lk_dtype t, size_t i) {
    if (t == LK_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == LK_BF16 ? lk_bf16_bits_to_f32(h) : lk_f16_bits_to_f32(h);
}
static void wr(void *p, lk_dtype t, size_t i, float v) {
    if (t == LK_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = t == LK_BF16 ? lk_f32_to_bf16_bits(v) : lk_f32_to_f16_bits(v);
}

typedef struct {
    lk_dtype ab, c;
    unsigned flags;
    const char *name;
} types;

/* One GEMM; returns the number of wrong elements (or 1 for a refused call). */
static int one(const types *ty, bool ta, bool tb, int64_t K, bool misaligned, bool beta) {
    const int64_t M = 3, N = 5;
    lk_op_desc d;
    memset(&d, 0, sizeof d);
    d.op = LK_OP_GEMM;
    d.dtype[0] = d.dtype[1] = ty->ab, d.dtype[2] = ty->c;
    lk_gemm_params *g = &d.gemm;
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    g->trans_a = ta, g->trans_b = tb, g->M = M, g->N = N, g->K = K;
    g->lda = ac + 1, g->ldb = bc + 2, g->ldc = N + 3, g->alpha = 0.5f, g->beta = beta ? 1.5f : 0.0f;
    size_t off = misaligned, na = ar * g->lda + off, nb = br * g->ldb + off, nc = M * g->ldc + off;
    static unsigned char ha[4096], hb[4096], hc[4096], out[4096];
    for (size_t i = 0; i < na; i++) wr(ha, ty->ab, i, (float)((int)(i * 7 % 11) - 5) * 0.25f);
    for (size_t i = 0; i < nb; i++) wr(hb, ty->ab, i, (float)((int)(i * 5 % 13) - 6) * 0.5f);
    for (size_t i = 0; i < nc; i++) wr(hc, ty->c, i, beta ? (float)((int)(i % 7) - 3) : NAN);
    /* exactly the matrices' extents, so that a read past one leaves device memory */
    char *da = lk_stub_alloc(na * esz(ty->ab), 0), *db = lk_stub_alloc(nb * esz(ty->ab), 0);
    char *dc = lk_stub_alloc(nc * esz(ty->c), 0);
    lk_stub_copy(da, ha, na * esz(ty->ab));
    lk_stub_copy(db, hb, nb * esz(ty->ab));
    lk_stub_copy(dc, hc, nc * esz(ty->c));
    void *ops[3] = {da + off * esz(ty->ab), db + off * esz(ty->ab), dc + off * esz(ty->c)};
    lk_status st = lk__cuda_gemm_run(0, &d, ops, ty->flags);
    lk_stub_sync();
    if (st) {
        lk_stub_free(da), lk_stub_free(db), lk_stub_free(dc);
        fprintf(stderr, "FAIL %s trans %d %d K %lld misaligned %d beta %d: status %d\n", ty->name, ta, tb, (long long)K,
                misaligned, beta, (int)st);
        return 1;
    }
    lk_stub_copy(out, dc, nc * esz(ty->c));
    lk_stub_free(da), lk_stub_free(db), lk_stub_free(dc);
    int bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int64_t p = 0; p < K; p++) {
                double x = rd(ha, ty->ab, off + (ta ? p * g->lda + i : i * g->lda + p));
                double y = rd(hb, ty->ab, off + (tb ? j * g->ldb + p : p * g->ldb + j));
                ref += x * y, mag += fabs(x * y);
            }
            ref *= g->alpha, mag *= g->alpha;
            if (beta) {
                double c = rd(hc, ty->c, off + i * g->ldc + j);
                ref += g->beta * c, mag += fabs(g->beta * c);
            }
            double rel = ty->c == LK_BF16 ? 0x1p-8 : ty->c == LK_F16 || ty->flags ? 0x1p-11 : 0;
            double got = rd(out, ty->c, off + i * g->ldc + j), tol = 1e-6 * mag + rel * (fabs(ref) + mag);
            if (!(fabs(got - ref) <= tol) && bad++ < 3)
                fprintf(stderr, "FAIL %s trans %d %d K %lld misaligned %d beta %d: C(%lld,%lld) = %g, want %g\n",
                        ty->name, ta, tb, (long long)K, misaligned, beta, (long long)i, (long long)j, got, ref);
        }
    return bad;
}

int main(void) {
    static const types ty[] = {{LK_F32, LK_F32, 0, "f32"},        {LK_F32, LK_F32, LK__CUDA_GEMM_TF32, "tf32"},
                               {LK_BF16, LK_F32, 0, "bf16->f32"}, {LK_BF16, LK_BF16, 0, "bf16->bf16"},
                               {LK_F16, LK_F32, 0, "f16->f32"},   {LK_F16, LK_F16, 0, "f16->f16"}};
    int bad = 0, n = 0;
    for (size_t t = 0; t < sizeof ty / sizeof ty[0]; t++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int64_t K = 0; K <= 4; K += 4)
                    for (int mis = 0; mis < 2; mis++)
                        for (int beta = 0; beta < 2; beta++, n++) bad += one(&ty[t], ta, tb, K, mis, beta);
    if (bad) {
        fprintf(stderr, "%d wrong elements or refusals over %d GEMMs\n", bad, n);
        return 1;
    }
    printf("gemm.c over the fake cuBLASLt: %d GEMMs right\n", n);
    return 0;
}

/* The fake GPU's cuBLASLt: the entry points src/backend/cuda/gemm.c uses
 * (its LT_FUNCS list, plus cublasLtDestroy), built as libcublasLt.so.<major>
 * so that gemm.c's dlopen finds it first on the fake tests'
 * LD_LIBRARY_PATH. Its job is to refuse what the real library would refuse
 * and to compute the right answer, so that a wrong layout, transpose,
 * leading dimension, type or alignment in gemm.c fails without a GPU.
 *
 * Modelled: column-major D = alpha * op(A) * op(B) + beta * C with op from
 * CUBLASLT_MATMUL_DESC_TRANSA/TRANSB; the type combinations gemm.c may ask
 * for (A = B = f32 with C f32, compute 32F or 32F_FAST_TF32; A = B = bf16 or
 * f16 with C f32 or A's type, compute 32F; scale f32), anything else is
 * NOT_SUPPORTED; shape and leading-dimension checks (INVALID_VALUE) in both
 * the heuristic and the matmul; the attributes' sizes; the preference's
 * minimum alignments, carried in the algorithm the heuristic returns as
 * the real one carries them, and enforced on the pointers; every matrix's
 * whole extent in the fake's device memory, on one GPU; alpha and beta as
 * host pointers read at call time; beta == 0 never reading C; f32
 * accumulation in k order with exact inputs (TF32 inputs rounded to 10
 * mantissa bits, nearest even) and the output rounded to C's type, nearest
 * even. The work runs on the stream through lk_fake_enqueue, as the device
 * memory is readable only there.
 * Not modelled: device pointer mode, epilogues, batches, layout attributes
 * (order, batch count), other attributes (refused as NOT_SUPPORTED so that a
 * new use in gemm.c shows up here), the workspace's contents, the real
 * library's summation order (a test compares with a tolerance, not bits),
 * overlap of D with A or B (undefined on a GPU, not checked).
 * Every refusal prints one line on stderr saying why. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <cublasLt.h>

#include "fake.h"

struct cublasLtContext {
    int unused;
};

namespace {

struct Layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct Desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
};
struct Pref {
    uint64_t max_ws = 0;
    uint32_t align[4] = {256, 256, 256, 256};
};
enum Kind { HANDLE, DESC, LAYOUT, PREF };
const uint64_t ALGO_MAGIC = 0x6c6b66616b656c74ull; /* "lkfakelt": marks an algorithm this heuristic made */

/* Live objects, so that a destroyed or garbage descriptor is refused rather than read. */
std::mutex mu;
std::unordered_map<const void *, Kind> live;

cublasStatus_t fail(cublasStatus_t s, const char *fn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
cublasStatus_t fail(cublasStatus_t s, const char *fn, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake cuBLASLt: %s: %s (status %d)\n", fn, msg, (int)s);
    return s;
}

/* A new live object, stored into *out as the API's pointer type P. */
template <class P, class T> cublasStatus_t make(P *out, Kind k, const char *fn, const T &init) {
    if (!out) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL output pointer");
    T *p = new T(init);
    std::lock_guard<std::mutex> g(mu);
    live[p] = k;
    *out = (P)p;
    return CUBLAS_STATUS_SUCCESS;
}

template <class T> T *get(const void *p, Kind k) {
    std::lock_guard<std::mutex> g(mu);
    auto it = live.find(p);
    return it != live.end() && it->second == k ? (T *)p : nullptr;
}

template <class T> cublasStatus_t destroy(void *p, Kind k, const char *fn) {
    if (!p) return CUBLAS_STATUS_SUCCESS; /* as the real one: destroying NULL is a no-op */
    if (!get<T>(p, k)) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%p is not a live object of this kind", p);
    {
        std::lock_guard<std::mutex> g(mu);
        live.erase(p);
    }
    delete (T *)p;
    return CUBLAS_STATUS_SUCCESS;
}

size_t esize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
const char *tname(cudaDataType_t t) {
    return t == CUDA_R_32F ? "f32" : t == CUDA_R_16BF ? "bf16" : t == CUDA_R_16F ? "f16" : "unsupported type";
}
/* Elements a column-major matrix spans (0 when empty: its pointer is never read). */
uint64_t extent(const Layout &l) { return l.rows && l.cols ? (uint64_t)l.ld * (l.cols - 1) + l.rows : 0; }

/* The checks the heuristic and the matmul share: the descriptor's types
 * and the four layouts' shapes against each other. */
cublasStatus_t check_problem(const char *fn, const Desc &d, const Layout *L[4]) {
    static const char name[4] = {'A', 'B', 'C', 'D'};
    for (int i = 0; i < 4; i++) {
        const Layout &l = *L[i];
        if (l.type != CUDA_R_32F && l.type != CUDA_R_16BF && l.type != CUDA_R_16F)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c's type %d is not f32, bf16 or f16", name[i], (int)l.type);
        if (l.ld < 1 || (uint64_t)l.ld < l.rows)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                        "%c's ld %lld < its rows %llu (column-major: ld >= max(1, rows))", name[i], (long long)l.ld,
                        (unsigned long long)l.rows);
    }
    const Layout &a = *L[0], &b = *L[1], &c = *L[2], &dd = *L[3];
    if (d.scale != CUDA_R_32F)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "scale type %d is not CUDA_R_32F", (int)d.scale);
    if (a.type != b.type)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "A is %s but B is %s", tname(a.type), tname(b.type));
    bool ok = a.type == CUDA_R_32F ? c.type == CUDA_R_32F &&
                                         (d.compute == CUBLAS_COMPUTE_32F || d.compute == CUBLAS_COMPUTE_32F_FAST_TF32)
                                   : (c.type == CUDA_R_32F || c.type == a.type) && d.compute == CUBLAS_COMPUTE_32F;
    if (!ok)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "A/B %s, C %s with compute type %d is not a supported combination",
                    tname(a.type), tname(c.type), (int)d.compute);
    if (c.type != dd.type || c.rows != dd.rows || c.cols != dd.cols || c.ld != dd.ld)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                    "C's layout (%s %llux%llu ld %lld) differs from D's (%s %llux%llu ld %lld)", tname(c.type),
                    (unsigned long long)c.rows, (unsigned long long)c.cols, (long long)c.ld, tname(dd.type),
                    (unsigned long long)dd.rows, (unsigned long long)dd.cols, (long long)dd.ld);
    uint64_t am = d.transa == CUBLAS_OP_N ? a.rows : a.cols, ak = d.transa == CUBLAS_OP_N ? a.cols : a.rows;
    uint64_t bk = d.transb == CUBLAS_OP_N ? b.rows : b.cols, bn = d.transb == CUBLAS_OP_N ? b.cols : b.rows;
    if (am != c.rows || bn != c.cols || ak != bk)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                    "op(A) is %llux%llu (trans %d), op(B) %llux%llu (trans %d), C %llux%llu: want m x k, k x n, m x n",
                    (unsigned long long)am, (unsigned long long)ak, (int)d.transa, (unsigned long long)bk,
                    (unsigned long long)bn, (int)d.transb, (unsigned long long)c.rows, (unsigned long long)c.cols);
    return CUBLAS_STATUS_SUCCESS;
}

/* What an algorithm is valid for: the types and transposes it was chosen for. */
uint64_t fingerprint(const Desc &d, const Layout *L[4]) {
    return (uint64_t)d.compute | (uint64_t)d.transa << 8 | (uint64_t)d.transb << 10 | (uint64_t)L[0]->type << 16 |
           (uint64_t)L[2]->type << 32;
}

float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return sign ? -(float)m * 0x1p-24f : (float)m * 0x1p-24f; /* zero or subnormal, exact */
    return from_bits(sign | (e == 31 ? 0x7f800000u | m << 13 : (e + 112u) << 23 | m << 13));
}

uint16_t f32_to_f16(float f) {
    uint32_t x = to_bits(f), sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN, quiet */
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (and inf): inf */
    if (x < 0x38800000u) return (uint16_t)(sign | (uint32_t)std::nearbyint(from_bits(x) * 0x1p24f)); /* subnormal */
    uint32_t r = x + 0xfffu + ((x >> 13) & 1u); /* nearest even on the 13 dropped bits */
    return (uint16_t)(sign | (((r >> 23) - 112u) << 10 | ((r >> 13) & 0x3ffu)));
}

uint16_t f32_to_bf16(float f) {
    uint32_t u = to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float tf32(float f) {
    uint32_t u = to_bits(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return f; /* inf, NaN */
    return from_bits((u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu);
}

float load(const void *p, cudaDataType_t t, uint64_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return t == CUDA_R_16BF ? from_bits((uint32_t)h << 16) : f16_to_f32(h);
}

void store(void *p, cudaDataType_t t, uint64_t i, float v) {
    if (t == CUDA_R_32F)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = t == CUDA_R_16BF ? f32_to_bf16(v) : f32_to_f16(v);
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { return make(h, HANDLE, "cublasLtCreate", cublasLtContext{0}); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return destroy<cublasLtContext>(h, HANDLE, "cublasLtDestroy"); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    Desc init;
    init.compute = compute, init.scale = scale;
    return make(d, DESC, "cublasLtMatmulDescCreate", init);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    return destroy<Desc>(d, DESC, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t md, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t n) {
    const char *fn = "cublasLtMatmulDescSetAttribute";
    Desc *d = get<Desc>(md, DESC);
    if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%p is not a live matmul descriptor", (void *)md);
    if (attr != CUBLASLT_MATMUL_DESC_TRANSA && attr != CUBLASLT_MATMUL_DESC_TRANSB)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not modelled by the fake", (int)attr);
    if (!buf || n != sizeof(int32_t))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d takes an int32_t: got %zu bytes at %p", (int)attr, n,
                    buf);
    int32_t op;
    memcpy(&op, buf, sizeof op);
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "operation %d is not CUBLAS_OP_N or CUBLAS_OP_T", (int)op);
    (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = op;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    return make(l, LAYOUT, "cublasLtMatrixLayoutCreate", Layout{type, rows, cols, ld});
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    return destroy<Layout>(l, LAYOUT, "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    return make(p, PREF, "cublasLtMatmulPreferenceCreate", Pref{});
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    return destroy<Pref>(p, PREF, "cublasLtMatmulPreferenceDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t n) {
    const char *fn = "cublasLtMatmulPreferenceSetAttribute";
    Pref *p = get<Pref>(pref, PREF);
    if (!p) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%p is not a live preference", (void *)pref);
    bool ws = attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES;
    bool al = attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES;
    if (!ws && !al) return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not modelled by the fake", (int)attr);
    size_t want = ws ? sizeof(uint64_t) : sizeof(uint32_t);
    if (!buf || n != want)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d takes %zu bytes: got %zu at %p", (int)attr, want, n,
                    buf);
    if (ws)
        memcpy(&p->max_ws, buf, n);
    else
        memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, n);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t md, cublasLtMatrixLayout_t la,
                                              cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                                              cublasLtMatrixLayout_t ld, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned) {
    const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    const Desc *d = get<Desc>(md, DESC);
    const Layout *L[4] = {get<Layout>(la, LAYOUT), get<Layout>(lb, LAYOUT), get<Layout>(lc, LAYOUT),
                          get<Layout>(ld, LAYOUT)};
    const Pref *p = get<Pref>(pref, PREF);
    if (!get<cublasLtContext>(h, HANDLE) || !d || !L[0] || !L[1] || !L[2] || !L[3] || !p)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "a NULL or dead handle, descriptor, layout or preference");
    if (requested < 1 || !results || !returned)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "requested %d algorithms into %p, count into %p", requested,
                    (void *)results, (void *)returned);
    *returned = 0;
    cublasStatus_t s = check_problem(fn, *d, L);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    for (int i = 0; i < 4; i++) /* no kernel reads a matrix less aligned than its element */
        if (p->align[i] < esize(L[i]->type) || p->align[i] % esize(L[i]->type))
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                        "%c's minimum alignment %u bytes is not a multiple of its %zu-byte element", "ABCD"[i],
                        p -> align[i], esize(L[i]->type));
    memset(&results[0], 0, sizeof results[0]);
    uint64_t *a = results[0].algo.data;
    a[0] = ALGO_MAGIC;
    a[1] = fingerprint(*d, L);
    for (int i = 0; i < 4; i++) a[2 + i] = p->align[i]; /* the promise the matmul holds the pointers to */
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t md, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta,
                              const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t ws_bytes, cudaStream_t stream) {
    const char *fn = "cublasLtMatmul";
    const Desc *dp = get<Desc>(md, DESC);
    const Layout *L[4] = {get<Layout>(la, LAYOUT), get<Layout>(lb, LAYOUT), get<Layout>(lc, LAYOUT),
                          get<Layout>(ld, LAYOUT)};
    if (!get<cublasLtContext>(h, HANDLE) || !dp || !L[0] || !L[1] || !L[2] || !L[3])
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "a NULL or dead handle, descriptor or layout");
    if (!alpha || !beta || lk_fake_is_device(alpha, 4, nullptr) || lk_fake_is_device(beta, 4, nullptr))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                    "alpha %p or beta %p is NULL or device memory (pointer mode is host)", alpha, beta);
    float al, be; /* read now, as the real library reads host scalars */
    memcpy(&al, alpha, 4);
    memcpy(&be, beta, 4);
    cublasStatus_t s = check_problem(fn, *dp, L);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!algo || algo->data[0] != ALGO_MAGIC)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                    "the algorithm %p is NULL or not from cublasLtMatmulAlgoGetHeuristic", (const void *)algo);
    if (algo->data[1] != fingerprint(*dp, L))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "the algorithm was chosen for other types or transposes");
    if (ws_bytes > 0 && (!workspace || !lk_fake_is_device(workspace, ws_bytes, nullptr)))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "workspace %p of %zu bytes is not device memory", workspace,
                    ws_bytes);
    const void *ptr[4] = {A, B, C, D};
    int dev0 = -1;
    for (int i = 0; i < 4; i++) {
        uint64_t n = extent(*L[i]);
        if (n == 0 || (i == 2 && be == 0.0f)) continue; /* never read */
        uint64_t al = algo->data[2 + i], es = esize(L[i]->type);
        if ((uintptr_t)ptr[i] % al || (uintptr_t)ptr[i] % es)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                        "%c at %p is less aligned than the %llu bytes promised to the heuristic", "ABCD"[i], ptr[i],
                        (unsigned long long)(al > es ? al : es));
        int dev = -1;
        if (!lk_fake_is_device(ptr[i], n * es, &dev))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                        "%c: [%p, +%llu bytes) (ld %lld x %llu cols) is not device memory", "ABCD"[i], ptr[i],
                        (unsigned long long)(n * es), (long long)L[i] -> ld, (unsigned long long)L[i] -> cols);
        if (dev0 >= 0 && dev != dev0)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%c is on GPU %d, the other matrices on GPU %d", "ABCD"[i],
                        dev, dev0);
        dev0 = dev;
    }
    /* Copies of everything the queued work reads: the caller may destroy
     * its descriptors and change alpha and beta as soon as this returns. */
    const Desc d = *dp;
    const Layout a = *L[0], b = *L[1], c = *L[2];
    int err = lk_fake_enqueue((void *)stream, "cublasLtMatmul", [=]() {
        uint64_t m = c.rows, n = c.cols, k = d.transa == CUBLAS_OP_N ? a.cols : a.rows;
        bool t32 = d.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
        /* op(A) as f32 [k][m] and op(B) as f32 [n][k], converted once; each
         * output's sum still runs over p in order (acc[i] += ...), with the
         * loop over i innermost, where the compiler can vectorise it */
        std::vector<float> at(k * m), bt(n * k), acc(m), out(m * n);
        for (uint64_t p = 0; p < k; p++)
            for (uint64_t i = 0; i < m; i++) {
                float x = load(A, a.type, d.transa == CUBLAS_OP_N ? i + p * a.ld : p + i * a.ld);
                at[p * m + i] = t32 ? tf32(x) : x;
            }
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t p = 0; p < k; p++) {
                float y = load(B, b.type, d.transb == CUBLAS_OP_N ? p + j * b.ld : j + p * b.ld);
                bt[j * k + p] = t32 ? tf32(y) : y;
            }
        for (uint64_t j = 0; j < n; j++) {
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (uint64_t p = 0; p < k; p++) {
                const float y = bt[j * k + p], *x = &at[p * m];
                for (uint64_t i = 0; i < m; i++) acc[i] += x[i] * y;
            }
            for (uint64_t i = 0; i < m; i++)
                out[i + j * m] = be == 0.0f ? al * acc[i] : al * acc[i] + be * load(C, c.type, i + j * c.ld);
        }
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) store(D, c.type, i + j * c.ld, out[i + j * m]);
    });
    if (err)
        return fail(CUBLAS_STATUS_EXECUTION_FAILED, fn, "lk_fake_enqueue on stream %p refused the work: error %d",
                    (void *)stream, err);
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"

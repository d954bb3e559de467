/* GEMMs on the GPU through cuBLASLt: f32 (exact f32 unless the caller opts
 * into TF32), bf16 and f16 on tensor cores with f32 accumulation, over the
 * typed-op descriptor. cuBLASLt is column-major and lockstep row-major; a
 * row-major C = op(A) op(B) read column-major is C^T = op(B)^T op(A)^T, so
 * the operands are passed swapped (B first, M and N exchanged) and no data
 * is transposed. One cuBLASLt handle and one workspace per GPU, made on
 * first use (outside a graph capture: the workspace is a cudaMalloc). The
 * matmul goes on the GPU's compute stream (device/gpu.h), with the
 * kernels and copies, so it is ordered with them and can be captured.
 *
 * cuBLASLt is loaded with dlopen on the first GEMM, not linked: merely
 * loading it costs every process ~150 MB of resident memory and ~0.1-0.2 s
 * (its static initialisers), which a CUDA build would otherwise charge to
 * every CPU-only run, every rank and `lockstep --help`.
 *
 * A GEMM's plan (matmul descriptor, the three layouts and the algorithm
 * cuBLASLt's heuristic picked) is made once per shape and kept: a training
 * step repeats the same few shapes, and the heuristic query costs more than
 * launching a small GEMM. The plan's key includes the operands' alignment,
 * because cuBLASLt's algorithms assume 256-byte aligned matrices unless told
 * otherwise and a parameter inside a flat buffer is aligned only to its
 * offset. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/gemm.h"
#include "device/gpu.h"

#define MAX_GPUS 64
/* 32 MiB: what cuBLAS documents for Hopper's larger kernels; smaller parts
 * simply pick algorithms that need less. */
#define WORKSPACE_BYTES (32u << 20)
/* Distinct GEMM shapes kept; a model has a few dozen. Past this, a shape is
 * planned and freed per call (correct, slower), never evicted. */
#define MAX_PLANS 256

#define STR_(x) #x
#define STR(x) STR_(x)

/* The cuBLASLt entry points used, resolved once from the library. */
#define LT_FUNCS(X)                                                                                                    \
    X(cublasLtCreate)                                                                                                  \
    X(cublasLtMatmulDescCreate)                                                                                        \
    X(cublasLtMatmulDescSetAttribute)                                                                                  \
    X(cublasLtMatmulDescDestroy)                                                                                       \
    X(cublasLtMatrixLayoutCreate)                                                                                      \
    X(cublasLtMatrixLayoutDestroy)                                                                                     \
    X(cublasLtMatmulPreferenceCreate)                                                                                  \
    X(cublasLtMatmulPreferenceSetAttribute)                                                                            \
    X(cublasLtMatmulPreferenceDestroy)                                                                                 \
    X(cublasLtMatmulAlgoGetHeuristic)                                                                                  \
    X(cublasLtMatmul)
static struct {
#define X(f) __typeof__(f) *f;
    LT_FUNCS(X)
#undef X
} lt_fn;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static char lt_err[512];

static void lt_load(void) {
    /* The soname of the cuBLAS this was compiled against; then the file the
     * build linked its headers' library from, for an install whose loader
     * path does not name the toolkit's lib directory. */
    static const char *const names[] = {"libcublasLt.so." STR(CUBLAS_VER_MAJOR),
#ifdef LK_CUBLASLT_PATH
                                        LK_CUBLASLT_PATH,
#endif
    };
    void *h = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(lt_err, sizeof lt_err, "cannot load %s (cuBLASLt, part of the CUDA toolkit): %s", names[0], dlerror());
        return;
    }
#define X(f)                                                                                                           \
    if (!(*(void **)&lt_fn.f = dlsym(h, #f))) {                                                                       \
        snprintf(lt_err, sizeof lt_err, "%s has no %s: a cuBLAS older than the %d.x this was built with", names[0],   \
                 #f, CUBLAS_VER_MAJOR);                                                                                \
        return;                                                                                                        \
    }
    LT_FUNCS(X)
#undef X
}

static struct {
    cublasLtHandle_t lt;
    void *workspace;
} per_gpu[MAX_GPUS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

/* What a plan depends on: everything in the descriptor but alpha and beta
 * (passed per call), the device, TF32, and the operands' alignment. */
typedef struct {
    int device;
    lk_dtype a, b, c;
    bool trans_a, trans_b, tf32;
    int64_t M, N, K, lda, ldb, ldc;
    uint32_t align[3]; /* A, B, C: the largest power of two <= 256 dividing the address */
} plan_key;

typedef struct {
    plan_key key;
    cublasLtMatmulDesc_t md;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

static plan plans[MAX_PLANS];
static int nplans;

static bool ab_type(lk_dtype t) { return t == LK_F32 || t == LK_BF16 || t == LK_F16; }

const char *lk__cuda_gemm_path(lk_dtype dt) {
    switch (dt) { /* what run_gemm picks: the compute type follows A/B's dtype; TF32 only when asked */
    case LK_BF16: return "cublaslt bf16 on tensor cores, f32 accumulate";
    case LK_F16: return "cublaslt f16 on tensor cores, f32 accumulate";
    default:
        return lk__f32_matmul_reduced() ? "cublaslt f32 in TF32 on tensor cores, CUBLAS_COMPUTE_32F_FAST_TF32 "
                                          "(float32_matmul_precision high)"
                                        : "cublaslt f32, CUBLAS_COMPUTE_32F (no TF32)";
    }
}

bool lk__cuda_gemm_supports(const lk_op_desc *d) {
    if (d->op != LK_OP_GEMM) return false;
    lk_dtype a = d->dtype[0], b = d->dtype[1], c = d->dtype[2];
    if (a != b || !ab_type(a)) return false;
    if (a == LK_F32) return c == LK_F32;
    return c == LK_F32 || c == a;
}

static cudaDataType_t cuda_type(lk_dtype t) {
    return t == LK_BF16 ? CUDA_R_16BF : t == LK_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static lk_status lt_fail(cublasStatus_t s, const char *what, const lk_op_desc *d, int device) {
    char buf[128];
    return lk_error(LK_STATUS_DEVICE, "cuda:%d: cuBLASLt %s failed for %s: status %d", device, what,
                    lk__op_desc_str(d, buf, sizeof buf), (int)s);
}

lk_status lk__cuda_gemm_load(void) {
    pthread_once(&lt_once, lt_load);
    return lt_err[0] ? lk_error(LK_STATUS_UNSUPPORTED, "cuda GEMM: %s", lt_err) : LK_STATUS_OK;
}

static lk_status handle_for(int device, cublasLtHandle_t *lt, void **ws) {
    if (device < 0 || device >= MAX_GPUS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "cuda GEMM: device %d out of range (0..%d)", device, MAX_GPUS - 1);
    LK_TRY(lk__cuda_gemm_load());
    /* the first GEMM's handle and workspace (cudaMalloc) cannot be made inside a capture */
    pthread_mutex_lock(&mu);
    bool made = per_gpu[device].lt != NULL;
    pthread_mutex_unlock(&mu);
    if (!made && lk__cuda_capturing(device))
        return lk__cuda_capture_refuse(device, "the first GEMM on this GPU (it allocates cuBLASLt's workspace)", 0);
    pthread_mutex_lock(&mu);
    lk_status st = LK_STATUS_OK;
    if (!per_gpu[device].lt) {
        cublasStatus_t s = lt_fn.cublasLtCreate(&per_gpu[device].lt);
        if (s != CUBLAS_STATUS_SUCCESS) {
            per_gpu[device].lt = NULL;
            st = lk_error(LK_STATUS_DEVICE, "cuda:%d: cublasLtCreate failed: status %d", device, (int)s);
        } else if (cudaMalloc(&per_gpu[device].workspace, WORKSPACE_BYTES) != cudaSuccess) {
            cudaGetLastError();
            per_gpu[device].workspace = NULL; /* cuBLASLt runs without one, on fewer algorithms */
        }
    }
    *lt = per_gpu[device].lt;
    *ws = per_gpu[device].workspace;
    pthread_mutex_unlock(&mu);
    return st;
}

static uint32_t alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

static void plan_free(plan *p) {
    if (p->lc) lt_fn.cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) lt_fn.cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) lt_fn.cublasLtMatrixLayoutDestroy(p->la);
    if (p->md) lt_fn.cublasLtMatmulDescDestroy(p->md);
    memset(p, 0, sizeof *p);
}

/* Makes p for key k: the descriptor, the layouts and the heuristic's best
 * algorithm for this workspace and these alignments. */
static lk_status plan_make(plan *p, const plan_key *k, cublasLtHandle_t lt, size_t ws_bytes, const lk_op_desc *d) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    cublasComputeType_t compute = k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t ab = cuda_type(k->a), ct = cuda_type(k->c);
    /* Swapped operands (file comment): Lt's A is our B, Lt's B is our A. */
    cublasOperation_t op_a = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t a_rows = k->trans_b ? (uint64_t)k->K : (uint64_t)k->N, a_cols = k->trans_b ? (uint64_t)k->N : (uint64_t)k->K;
    uint64_t b_rows = k->trans_a ? (uint64_t)k->M : (uint64_t)k->K, b_cols = k->trans_a ? (uint64_t)k->K : (uint64_t)k->M;
    cublasStatus_t s = lt_fn.cublasLtMatmulDescCreate(&p->md, compute, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt_fn.cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt_fn.cublasLtMatmulDescSetAttribute(p->md, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b);
    if (s == CUBLAS_STATUS_SUCCESS) s = lt_fn.cublasLtMatrixLayoutCreate(&p->la, ab, a_rows, a_cols, k->ldb);
    if (s == CUBLAS_STATUS_SUCCESS) s = lt_fn.cublasLtMatrixLayoutCreate(&p->lb, ab, b_rows, b_cols, k->lda);
    if (s == CUBLAS_STATUS_SUCCESS) s = lt_fn.cublasLtMatrixLayoutCreate(&p->lc, ct, (uint64_t)k->N, (uint64_t)k->M, k->ldc);
    if (s != CUBLAS_STATUS_SUCCESS) {
        plan_free(p);
        return lt_fail(s, "layout", d, k->device);
    }
    cublasLtMatmulPreference_t pref = NULL;
    s = lt_fn.cublasLtMatmulPreferenceCreate(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt_fn.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                       sizeof ws_bytes);
    /* Lt's A is our B (align[1]), Lt's B our A (align[0]); C and D are one buffer. */
    const uint32_t al[4] = {k->align[1], k->align[0], k->align[2], k->align[2]};
    static const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = lt_fn.cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i]);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = lt_fn.cublasLtMatmulAlgoGetHeuristic(lt, p->md, p->la, p->lb, p->lc, p->lc, pref, 1, &heur, &found);
    if (pref) lt_fn.cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        plan_free(p);
        return lt_fail(s != CUBLAS_STATUS_SUCCESS ? s : CUBLAS_STATUS_NOT_SUPPORTED, "algorithm search", d, k->device);
    }
    p->algo = heur.algo;
    return LK_STATUS_OK;
}

/* The kept plan for k, made on first use; *tmp is set instead (to be freed
 * by the caller) once MAX_PLANS shapes are kept. */
static lk_status plan_for(const plan_key *k, cublasLtHandle_t lt, size_t ws_bytes, const lk_op_desc *d,
                          const plan **out, plan *tmp) {
    pthread_mutex_lock(&mu);
    for (int i = 0; i < nplans; i++)
        if (!memcmp(&plans[i].key, k, sizeof *k)) {
            *out = &plans[i];
            pthread_mutex_unlock(&mu);
            return LK_STATUS_OK;
        }
    lk_status st;
    if (nplans < MAX_PLANS) {
        st = plan_make(&plans[nplans], k, lt, ws_bytes, d);
        if (!st) *out = &plans[nplans++];
    } else {
        st = plan_make(tmp, k, lt, ws_bytes, d);
        if (!st) *out = tmp;
    }
    pthread_mutex_unlock(&mu);
    return st;
}

lk_status lk__cuda_gemm_run(int device, const lk_op_desc *d, void *const *operands, unsigned flags) {
    char buf[128];
    if (!lk__cuda_gemm_supports(d))
        return lk_error(LK_STATUS_UNSUPPORTED, "cuda GEMM: %s is not supported (A and B f32, bf16 or f16; C f32 or A's dtype)",
                        lk__op_desc_str(d, buf, sizeof buf));
    const lk_gemm_params *g = &d->gemm;
    if (g->M == 0 || g->N == 0) return LK_STATUS_OK;
    if (cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        return lk_error(LK_STATUS_DEVICE, "cuda GEMM: cannot select GPU %d", device);
    }
    cublasLtHandle_t lt = NULL;
    void *ws = NULL;
    cudaStream_t stream;
    LK_TRY(lk__cuda_stream(device, &stream));
    LK_TRY(handle_for(device, &lt, &ws));
    size_t ws_bytes = ws ? WORKSPACE_BYTES : 0;

    plan_key k;
    memset(&k, 0, sizeof k); /* the key is compared bytewise: padding included */
    k.device = device;
    k.a = d->dtype[0], k.b = d->dtype[1], k.c = d->dtype[2];
    k.trans_a = g->trans_a, k.trans_b = g->trans_b;
    k.tf32 = d->dtype[0] == LK_F32 && (flags & LK__CUDA_GEMM_TF32);
    k.M = g->M, k.N = g->N, k.K = g->K, k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
    for (int i = 0; i < 3; i++) k.align[i] = alignment(operands[i]);
    const plan *p = NULL;
    plan tmp = {0};
    LK_TRY(plan_for(&k, lt, ws_bytes, d, &p, &tmp));
    /* K == 0: cuBLASLt computes C = beta * C, as the CPU backend does. */
    cublasStatus_t s = lt_fn.cublasLtMatmul(lt, p->md, &g->alpha, operands[1], p->la, operands[0], p->lb, &g->beta,
                                            operands[2], p->lc, operands[2], p->lc, &p->algo, ws, ws_bytes, stream);
    if (p == &tmp) plan_free(&tmp);
    if (s == CUBLAS_STATUS_SUCCESS) return LK_STATUS_OK;
    if (lk__cuda_capturing(device)) { /* the capture refused something cuBLASLt did: said as such, and ended */
        char w[160];
        snprintf(w, sizeof w, "cuBLASLt's matmul for %s (status %d)", lk__op_desc_str(d, buf, sizeof buf), (int)s);
        return lk__cuda_capture_refuse(device, w, 0);
    }
    return lt_fail(s, "matmul", d, device);
}

/* GEMMs on the GPU through cuBLASLt: f32 (exact f32 unless the caller opts
 * into TF32), bf16 and f16 on tensor cores with f32 accumulation, over the
 * typed-op descriptor. cuBLASLt is column-major and lockstep row-major; a
 * row-major C = op(A) op(B) read column-major is C^T = op(B)^T op(A)^T, so
 * the operands are passed swapped (B first, M and N exchanged) and no data
 * is transposed. One cuBLASLt handle and one workspace per GPU, made on
 * first use. */
#include <pthread.h>
#include <stdio.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/gemm.h"

#define MAX_GPUS 64
/* 32 MiB: what cuBLAS documents for Hopper's larger kernels; smaller parts
 * simply pick algorithms that need less. */
#define WORKSPACE_BYTES (32u << 20)

static struct {
    cublasLtHandle_t lt;
    void *workspace;
} per_gpu[MAX_GPUS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static bool ab_type(lk_dtype t) { return t == LK_F32 || t == LK_BF16 || t == LK_F16; }

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

static lk_status handle_for(int device, cublasLtHandle_t *lt, void **ws) {
    if (device < 0 || device >= MAX_GPUS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "cuda GEMM: device %d out of range (0..%d)", device, MAX_GPUS - 1);
    pthread_mutex_lock(&mu);
    lk_status st = LK_STATUS_OK;
    if (!per_gpu[device].lt) {
        cublasStatus_t s = cublasLtCreate(&per_gpu[device].lt);
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
    LK_TRY(handle_for(device, &lt, &ws));

    bool f32 = d->dtype[0] == LK_F32;
    cublasComputeType_t compute = f32 && (flags & LK__CUDA_GEMM_TF32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t ab = cuda_type(d->dtype[0]), ct = cuda_type(d->dtype[2]);
    /* Swapped operands (file comment): Lt's A is our B, Lt's B is our A. */
    cublasOperation_t op_a = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t a_rows = g->trans_b ? (uint64_t)g->K : (uint64_t)g->N, a_cols = g->trans_b ? (uint64_t)g->N : (uint64_t)g->K;
    uint64_t b_rows = g->trans_a ? (uint64_t)g->M : (uint64_t)g->K, b_cols = g->trans_a ? (uint64_t)g->K : (uint64_t)g->M;

    cublasLtMatmulDesc_t md = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    lk_status st = LK_STATUS_OK;
    cublasStatus_t s = cublasLtMatmulDescCreate(&md, compute, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&la, ab, a_rows, a_cols, g->ldb);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&lb, ab, b_rows, b_cols, g->lda);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&lc, ct, (uint64_t)g->N, (uint64_t)g->M, g->ldc);
    if (s != CUBLAS_STATUS_SUCCESS) {
        st = lt_fail(s, "layout", d, device);
        goto done;
    }
    size_t ws_bytes = ws ? WORKSPACE_BYTES : 0;
    s = cublasLtMatmulPreferenceCreate(&pref);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                 sizeof ws_bytes);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulAlgoGetHeuristic(lt, md, la, lb, lc, lc, pref, 1, &heur, &found);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        st = lt_fail(s != CUBLAS_STATUS_SUCCESS ? s : CUBLAS_STATUS_NOT_SUPPORTED, "algorithm search", d, device);
        goto done;
    }
    /* K == 0: cuBLASLt computes C = beta * C, as the CPU backend does. */
    s = cublasLtMatmul(lt, md, &g->alpha, operands[1], la, operands[0], lb, &g->beta, operands[2], lc, operands[2], lc,
                       &heur.algo, ws, ws_bytes, 0);
    if (s != CUBLAS_STATUS_SUCCESS) st = lt_fail(s, "matmul", d, device);
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (md) cublasLtMatmulDescDestroy(md);
    return st;
}

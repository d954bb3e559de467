/* The CUDA backend's bf16/f16 path for the families whose kernels are f32
 * only — pooling and its adjoint, layer and batch norm and their backward,
 * SyncBatchNorm's passes and finish (BN_STATS, BN_APPLY, BN_FINISH),
 * embedding's scatter-add, the convolution's bias add and bias gradient —
 * with the CPU backend's
 * semantics (src/backend/cpu/widen.c): every 16-bit operand is widened into
 * f32 scratch (exact), the f32 launcher runs on an all-f32 copy of the
 * descriptor (the same kernels/ bodies as the CPU), and the operands the op
 * writes are rounded back once. Written operands are widened too, since
 * some accumulate (col2im-style +=, dw/db of layer norm, the bias
 * gradient). f32 operands are passed in place. The CPU runs the same
 * arithmetic in chunks of planes, channels or rows; chunking never changes
 * a value (they are independent), so the bits are the CPU's. The scratch is
 * stream-ordered (one cudaMallocAsync per op): correctness first, the
 * conversion kernels are cheap next to the op (docs/GPU.md). */
#include "backend/cuda/common.cuh"

namespace {

__global__ void k_widen(int64_t n, const void *h, int dt, int64_t stride, float *f) {
    LK_CU_FOR(k, n) f[k] = lk_cu_ld(h, dt, k * stride);
}

__global__ void k_narrow(int64_t n, const float *f, void *h, int dt, int64_t stride) {
    LK_CU_FOR(k, n) lk_cu_st(h, dt, k * stride, f[k]);
}

bool is_half(lk_dtype t) { return t == LK_BF16 || t == LK_F16; }

} // namespace

extern "C" int lk__cuda_widened(const lk_op_desc *d, void *const *x, lk__cuda_launcher run) {
    LK_CU_REQUIRE_STREAM();
    int n = lk__op_arity(d->op);
    lk_op_desc f = lk__op_widened(d);
    void *ops[LK_OP_MAX_OPERANDS] = {NULL};
    float *buf[LK_OP_MAX_OPERANDS] = {NULL};
    int64_t count[LK_OP_MAX_OPERANDS] = {0}, stride[LK_OP_MAX_OPERANDS] = {0};
    bool written[LK_OP_MAX_OPERANDS] = {false};
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        ops[i] = x[i];
        if (!is_half(d->dtype[i]) || !x[i]) continue;
        if (!lk__op_operand_extent(d, i, &count[i], &stride[i], &written[i])) return (int)cudaErrorInvalidValue;
        if (count[i] < 0) count[i] = 0;
        total += (size_t)count[i];
    }
    float *base = NULL;
    cudaError_t e = lk_cu_scratch((void **)&base, total * sizeof(float));
    if (e != cudaSuccess) return (int)e;
    size_t at = 0;
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        if (!is_half(d->dtype[i]) || !x[i]) continue;
        buf[i] = base + at;
        at += (size_t)count[i];
        ops[i] = buf[i];
        if (d->op == LK_OP_BATCH_NORM && i >= 1 && i <= 4) f.batch_norm.stride[i - 1] = 1;
        if (d->op == LK_OP_BN_FINISH && i >= 1 && i <= 4) f.bn_finish.stride[i - 1] = 1; /* widened contiguous */
        if (count[i] > 0) {
            k_widen<<<lk_cu_blocks(count[i]), LK_CU_THREADS, 0, lk_cu_stream()>>>(count[i], x[i], (int)d->dtype[i], stride[i], buf[i]);
            e = cudaGetLastError();
        }
    }
    if (e == cudaSuccess) e = (cudaError_t)run(&f, ops);
    for (int i = 0; i < n && e == cudaSuccess; i++) {
        if (!buf[i] || !written[i] || count[i] <= 0) continue;
        k_narrow<<<lk_cu_blocks(count[i]), LK_CU_THREADS, 0, lk_cu_stream()>>>(count[i], buf[i], x[i], (int)d->dtype[i], stride[i]);
        e = cudaGetLastError();
    }
    lk_cu_scratch_free(base);
    return (int)e;
}

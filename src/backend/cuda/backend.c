/* The cuda backend: the lk_backend the registry hands LK_CUDA's ops to,
 * registered by the cuda device kind when that kind registers (lazily:
 * device/cuda.c's lk__cuda_register; loading the library or `accelerator:
 * cpu` never initialises CUDA). supports() says yes exactly for the
 * descriptors the kernels here run — the cuBLASLt GEMM (gemm.c), the
 * element-wise families, strided copy, softmax, the regression and
 * classification losses, the gradient utilities, embedding and the
 * optimizer updates, convolution's im2col/col2im/bias pieces and pooling,
 * layer and batch norm, SyncBatchNorm's passes and BCE, dropout's mask and
 * the i64 increment (batch norm's counter), with every bf16/f16
 * form the CPU backend takes (see cuda_impl.h for which .cu file runs
 * which) — and everything else is the registry's UNSUPPORTED error naming
 * the op, its dtypes, this backend and the device: cuda memory is not
 * host-addressable, so there is no CPU fallback. Deliberately refused
 * although the CPU's supports() says yes: a bf16/f16 saved-statistics
 * operand (batch/layer norm's stats, SyncBatchNorm's mean and
 * coefficients; no caller makes one, and the CPU's 16-bit path reads
 * them as f32 or past their end).
 *
 * run() finds the GPU from the operands' pointers (the calling thread's
 * current device may belong to another GPU of a dp run), checks that every
 * data operand is device memory (a host pointer passed by mistake would
 * otherwise be an illegal address that poisons the whole CUDA context), and
 * queues the kernels on the GPU's compute stream (device/gpu.h's
 * lk__cuda_stream), in order with the device's copies and memsets. While
 * the calling thread captures a graph, an op whose result goes to host
 * memory is refused with an error saying so (the host would read it before
 * the graph runs), as is any launch the runtime refuses for the capture.
 * Nothing here has run on a GPU yet (docs/GPU.md). */
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/gemm.h"
#include "device/gpu.h"

static bool is_half(lk_dtype t) { return t == LK_BF16 || t == LK_F16; }
static bool is_elem(lk_dtype t) { return t == LK_F32 || is_half(t); }

static bool all_f32(const lk_op_desc *d) {
    for (int i = 0; i < lk__op_arity(d->op); i++)
        if (d->dtype[i] != LK_F32) return false;
    return true;
}

/* The families widen.cu runs with bf16/f16 operands (ops.def's WIDEN, the
 * CPU's list): taken when the all-f32 descriptor is, the operand whose
 * index *f32_operand gets (saved statistics, per-channel coefficients) kept
 * f32; -1: none. */
static bool widens(lk_op_kind op, int *f32_operand) { return lk__op_widens(op, f32_operand); }

static bool cuda_supports(const lk_op_desc *d) {
    int keep;
    if (widens(d->op, &keep) && lk__op_has_half(d)) {
        if (keep >= 0 && d->dtype[keep] != LK_F32) return false;
        lk_op_desc f = lk__op_widened(d);
        return cuda_supports(&f);
    }
    switch (d->op) {
    case LK_OP_GEMM: return lk__cuda_gemm_supports(d);
    case LK_OP_UNARY:
    case LK_OP_UNARY_BACKWARD:
    case LK_OP_BINARY:
    case LK_OP_AXPY:
    case LK_OP_AFFINE:
    case LK_OP_SUM_TO:
        for (int i = 0; i < lk__op_arity(d->op); i++)
            if (!is_elem(d->dtype[i])) return false;
        if (d->op == LK_OP_UNARY || d->op == LK_OP_UNARY_BACKWARD)
            return d->unary.fn >= 0 && d->unary.fn < LK_UNARY_COUNT;
        if (d->op == LK_OP_BINARY) /* the fused ReLU (lk_add_relu): CPU only */
            return d->binary.ndim >= 0 && d->binary.ndim <= LK_MAX_DIMS && d->binary.fn <= LK_BINARY_DIV && !d->binary.relu;
        if (d->op == LK_OP_SUM_TO) return d->sum_to.ndim >= 0 && d->sum_to.ndim <= LK_MAX_DIMS;
        return true;
    case LK_OP_MASK_SCALE:
        return is_elem(d->dtype[0]) && d->dtype[1] == LK_U8 && d->dtype[2] == d->dtype[0];
    case LK_OP_COPY: { /* any dtypes (a cast between two: copy.c's conversions); accumulate f32 only, as the CPU */
        size_t es = lk_dtype_size(d->dtype[0]);
        bool dims = d->copy.ndim >= 0 && d->copy.ndim <= LK_MAX_DIMS;
        if (d->dtype[0] != d->dtype[1]) return es && lk_dtype_size(d->dtype[1]) && dims && !d->copy.accumulate;
        return (es == 1 || es == 2 || es == 4 || es == 8) && dims && (!d->copy.accumulate || d->dtype[0] == LK_F32);
    }
    case LK_OP_FILL: { /* any element size; the value converted on the host by the CPU backend */
        size_t es = lk_dtype_size(d->dtype[0]);
        return (es == 1 || es == 2 || es == 4 || es == 8) && d->fill.ndim >= 0 && d->fill.ndim <= LK_MAX_DIMS;
    }
    case LK_OP_SOFTMAX:
    case LK_OP_SOFTMAX_BACKWARD: return all_f32(d);
    case LK_OP_LOSS:
    case LK_OP_LOSS_BACKWARD: /* x (and dx) and target f32, bf16 or f16; the rest f32: as the CPU */
        if (!is_elem(d->dtype[0]) || !is_elem(d->dtype[1]) || d->dtype[2] != LK_F32) return false;
        if (d->op == LK_OP_LOSS_BACKWARD && d->dtype[3] != d->dtype[0]) return false;
        return (unsigned)d->loss.kind <= LK_PLOSS_SMOOTH_L1 && d->loss.reduction >= 0 && d->loss.reduction <= 2;
    case LK_OP_XENT:
    case LK_OP_XENT_BACKWARD:
    case LK_OP_NLL:
    case LK_OP_NLL_BACKWARD: {
        int ti = d->op == LK_OP_NLL_BACKWARD ? 0 : 1;
        if (d->dtype[ti] != LK_I32 && d->dtype[ti] != LK_I64) return false;
        for (int i = 0; i < lk__op_arity(d->op); i++) {
            bool wsum = (d->op == LK_OP_XENT && i == 5) || (d->op == LK_OP_NLL && i == 4);
            if (i != ti && d->dtype[i] != (wsum ? LK_F64 : LK_F32)) return false;
        }
        return d->xent.reduction >= 0 && d->xent.reduction <= 2;
    }
    /* the gradient utilities on f32 or 16-bit gradients (bf16-true / 16-true clipping); unscale f32 only, as the CPU */
    case LK_OP_NORM: return is_elem(d->dtype[0]) && d->dtype[1] == LK_F64 && d->norm.p > 0;
    case LK_OP_NONFINITE: return is_elem(d->dtype[0]) && d->dtype[1] == LK_I64;
    case LK_OP_UNSCALE: return d->dtype[0] == LK_F32 && d->dtype[1] == LK_F32 && d->dtype[2] == LK_I64;
    case LK_OP_CLAMP: return is_elem(d->dtype[0]) && d->dtype[1] == d->dtype[0];
    case LK_OP_EMBEDDING: /* a row copy: table and output of one float dtype */
        return is_elem(d->dtype[0]) && (d->dtype[1] == LK_I32 || d->dtype[1] == LK_I64) && d->dtype[2] == d->dtype[0];
    case LK_OP_EMBEDDING_BACKWARD:
        return d->dtype[0] == LK_F32 && (d->dtype[1] == LK_I32 || d->dtype[1] == LK_I64) && d->dtype[2] == LK_F32;
    case LK_OP_OPTIM_UPDATE: /* parameters and gradients f32, bf16 or f16 (one dtype), state f32: as the CPU */
        return is_elem(d->dtype[0]) && d->dtype[1] == d->dtype[0] && d->dtype[2] == LK_F32 && d->dtype[3] == LK_F32 &&
               d->dtype[4] == LK_F32 && (unsigned)d->optim.rule <= LK_OPTIM_RULE_RMSPROP;
    /* convolution's pieces as autocast's conv2d uses them (the CPU's rules) */
    case LK_OP_IM2COL: return is_elem(d->dtype[0]) && d->dtype[1] == d->dtype[0];
    case LK_OP_COL2IM: return all_f32(d);
    case LK_OP_BIAS_ADD: return d->dtype[0] == LK_F32 && is_elem(d->dtype[1]) && is_elem(d->dtype[2]);
    case LK_OP_CHANNEL_SUM: return is_elem(d->dtype[0]) && d->dtype[1] == LK_F32;
    case LK_OP_POOL2D: /* f32 data, i32 indices (max only), as the CPU */
        return d->dtype[0] == LK_F32 && d->dtype[1] == LK_F32 &&
               (d->pool.kind != LK_POOL_MAX || d->dtype[2] == LK_I32) && (unsigned)d->pool.kind <= LK_POOL_ADAPTIVE_AVG;
    case LK_OP_POOL2D_BACKWARD:
        return d->dtype[0] == LK_F32 && d->dtype[2] == LK_F32 &&
               (d->pool.kind != LK_POOL_MAX || d->dtype[1] == LK_I32) && (unsigned)d->pool.kind <= LK_POOL_ADAPTIVE_AVG;
    case LK_OP_LAYER_NORM:
    case LK_OP_LAYER_NORM_BACKWARD:
    case LK_OP_BATCH_NORM:
    case LK_OP_BATCH_NORM_BACKWARD: return all_f32(d) && !d->batch_norm.relu; /* the fused ReLU: CPU only */
    case LK_OP_BCE:
    case LK_OP_BCE_BACKWARD: return all_f32(d) && d->bce.reduction >= 0 && d->bce.reduction <= 2;
    case LK_OP_BN_STATS:
        return d->dtype[0] == LK_F32 && d->dtype[1] == LK_F32 && d->dtype[2] == LK_F32 && d->dtype[3] == LK_F64 &&
               (unsigned)d->bn_split.stat <= LK_BN_MOMENTS;
    case LK_OP_BN_APPLY: return all_f32(d);
    case LK_OP_BN_FINISH: /* 16-bit w, b, running statistics widen (ops.def), as the CPU */
        for (int i = 1; i < 7; i++)
            if (d->dtype[i] != LK_F32) return false;
        return d->dtype[0] == LK_F64 && d->bn_finish.C >= 0;
    case LK_OP_BN_FINISH_BACKWARD:
        for (int i = 0; i < 7; i++)
            if (d->dtype[i] != (i == 0 || i == 2 ? LK_F64 : LK_F32)) return false;
        return d->bn_finish.C >= 0;
    case LK_OP_ATTENTION: /* f32 (16-bit operands widen: ops.def), as the CPU */
    case LK_OP_ATTENTION_BACKWARD:
        return all_f32(d) && d->attention.D >= 1 && d->attention.D <= LK_ATTENTION_MAX_D && d->attention.thr >= 0 &&
               d->attention.thr <= 16777216.0f;
    case LK_OP_ACCURACY: /* as the CPU: 16-bit logits read by the kernel itself */
        return is_elem(d->dtype[0]) && (d->dtype[1] == LK_I64 || d->dtype[1] == LK_I32 || d->dtype[1] == LK_U8) &&
               d->dtype[2] == LK_F64 && d->accuracy.N >= 0 && d->accuracy.C >= 0;
    case LK_OP_DROPOUT_MASK: /* as the CPU; a live head_n is clamped by the kernel (elementwise.cu) */
        return d->dtype[0] == LK_U8 && d->dropout_mask.n >= 0 &&
               (d->live || (d->dropout_mask.head_n >= 0 && d->dropout_mask.head_n <= 3 &&
                            d->dropout_mask.head_n <= d->dropout_mask.n));
    case LK_OP_INCREMENT: return d->dtype[0] == LK_I64 && d->increment.n >= 0;
    /* clip_grad_norm_ on the device (optim.cu), as the CPU */
    case LK_OP_CLIP_COEF:
        return d->dtype[0] == LK_F64 && d->dtype[1] == LK_F32 && d->clip.n >= 0 &&
               (d->clip.p == 1.0 || d->clip.p == 2.0 || (isinf(d->clip.p) && d->clip.p > 0));
    case LK_OP_SCALE_BY: return is_elem(d->dtype[0]) && d->dtype[1] == LK_F32 && d->dtype[2] == d->dtype[0];
    default: return false;
    }
}

/* Whether e is the runtime refusing a call because of a graph capture. */
static bool capture_error(cudaError_t e) {
    return e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureInvalidated ||
           e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureWrongThread;
}

/* The GPU that owns the operands, made current; -1 in *device when no
 * operand is a device pointer (nothing to run on: every one NULL or host).
 * A data operand in host memory is an error naming it. */
static lk_status pick_device(const lk_op_desc *d, void *const *x, int *device) {
    char what[160];
    *device = -1;
    for (int i = 0; i < lk__op_arity(d->op); i++) {
        if (!x[i] || lk__cuda_host_operand(d, i)) continue;
        struct cudaPointerAttributes a;
        cudaError_t e = cudaPointerGetAttributes(&a, x[i]);
        if (e != cudaSuccess) {
            cudaGetLastError();
            int cur = 0; /* a capture that refuses the query: said as such, and ended (gpu.h) */
            if (capture_error(e) && cudaGetDevice(&cur) == cudaSuccess)
                return lk__cuda_capture_refuse(cur, "cudaPointerGetAttributes (finding an op's GPU)", e);
            return lk_error(LK_STATUS_DEVICE, "cuda backend: %s: operand %d: %s", lk__op_desc_str(d, what, sizeof what),
                            i, cudaGetErrorString(e));
        }
        if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
            /* ops check that their tensors share a device (lk__same_device),
             * so this is a caller below the ops handing over host memory */
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "cuda backend: %s: operand %d (%p) is host memory, expected cuda device memory",
                            lk__op_desc_str(d, what, sizeof what), i, x[i]);
        if (*device < 0) *device = a.device;
        else if (a.device != *device)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "cuda backend: %s: operand %d is on cuda:%d, operand 0's on cuda:%d (one GPU per op)",
                            lk__op_desc_str(d, what, sizeof what), i, a.device, *device);
    }
    if (*device >= 0) {
        cudaError_t e = cudaSetDevice(*device);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return lk_error(LK_STATUS_DEVICE, "cuda:%d: cannot select the device: %s", *device, cudaGetErrorString(e));
        }
    }
    return LK_STATUS_OK;
}

/* Device (or managed) memory, as common.cuh's lk_cu_on_device. */
static bool on_device(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static lk_status cuda_run(const lk_op_desc *d, void *const *x) {
    char what[160];
    if (!cuda_supports(d))
        return lk_error(LK_STATUS_UNSUPPORTED, "the cuda backend has no %s", lk__op_desc_str(d, what, sizeof what));
    int device;
    LK_TRY(pick_device(d, x, &device));
    if (device < 0) { /* empty: no device operand; the host results the CPU would write */
        if (d->op == LK_OP_NORM) *(double *)x[1] = 0.0;
        if (d->op == LK_OP_NONFINITE) *(int64_t *)x[1] = -1;
        if (d->op == LK_OP_UNSCALE) *(int64_t *)x[2] = 0;
        return LK_STATUS_OK;
    }
    /* made here, where a failure can be reported: the launchers then find it (common.cuh) */
    cudaStream_t stream;
    LK_TRY(lk__cuda_stream(device, &stream));
    if (lk__cuda_capturing(device))
        for (int i = 0; i < lk__op_arity(d->op); i++)
            if (lk__cuda_host_operand(d, i) && x[i] && !on_device(x[i])) {
                char w[200];
                snprintf(w, sizeof w, "%s with its result in host memory (operand %d: a read into host memory)",
                         lk__op_desc_str(d, what, sizeof what), i);
                return lk__cuda_capture_refuse(device, w, 0);
            }
    /* the kernels read a live block themselves: host memory would fault there */
    if (d->live && !on_device(d->live))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "cuda backend: %s: its live block (%p) is host memory, expected cuda device memory",
                        lk__op_desc_str(d, what, sizeof what), d->live);
    if (d->op == LK_OP_GEMM) return lk__cuda_gemm_run(device, d, x, lk__f32_matmul_reduced() ? LK__CUDA_GEMM_TF32 : 0);
    static const lk__cuda_launchers launchers = {lk__cuda_elementwise, lk__cuda_rows, lk__cuda_optim, lk__cuda_conv};
    int e = lk__cuda_launcher_for(&launchers, d->op)(d, x);
    if (e == cudaSuccess) return LK_STATUS_OK;
    cudaGetLastError(); /* a launch error is not sticky: clear it so the next op starts clean */
    if (capture_error((cudaError_t)e)) return lk__cuda_capture_refuse(device, lk__op_desc_str(d, what, sizeof what), e);
    if (e == cudaErrorMemoryAllocation)
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "cuda:%d: %s: out of device memory for its scratch", device,
                        lk__op_desc_str(d, what, sizeof what));
    return lk_error(LK_STATUS_DEVICE, "cuda:%d: %s failed: %s", device, lk__op_desc_str(d, what, sizeof what),
                    cudaGetErrorString((cudaError_t)e));
}

const lk_backend lk__cuda_backend = {
    .name = "cuda",
    .supports = cuda_supports,
    .run = cuda_run,
};

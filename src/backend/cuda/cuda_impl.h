/* Private to the CUDA backend (src/backend/cuda/): what backend.c, the C
 * side that answers supports() and dispatches run(), needs from the kernel
 * files, which nvcc compiles as C++ (this header is included from both).
 * One launcher per file:
 *   elementwise.cu: unary and its backward, broadcast binary, axpy, affine,
 *     sum-to, mask-scale, strided copy and cast, fill, clamp — f32, bf16 and f16 per
 *     operand (widened, computed in f32, rounded once: the CPU's semantics);
 *     dropout's keep mask (Philox on the device) and the i64 increment;
 *   rows.cu: softmax / log-softmax and their backward, the regression
 *     losses, cross-entropy and nll_loss, the gradient utilities (norm,
 *     first non-finite, fused unscale), embedding, BCE, layer norm,
 *     accuracy's hit count (into device memory: no synchronisation);
 *   optim.cu: the optimizer updates (SGD, Adam/AdamW, RMSprop);
 *   conv.cu: im2col, col2im, bias add, bias gradient, pooling, batch norm,
 *     SyncBatchNorm's passes (BN_STATS, BN_APPLY) and its per-channel finish
 *     (BN_FINISH, _BACKWARD) (f32; im2col also 16-bit);
 *   widen.cu: the bf16/f16 forms of the f32-only families (pooling, the
 *     norms, SyncBatchNorm's passes, embedding's backward, bias add and
 *     gradient): widened into f32 scratch, the f32 launcher, rounded once.
 * Every launch, scratch allocation and copy goes on the current GPU's
 * compute stream (common.cuh's lk_cu_stream; device/gpu.h's
 * lk__cuda_stream), the stream the cuda device's copies and memsets and the
 * cuBLASLt GEMM use too, so work is ordered with them without events and
 * can be captured into a CUDA graph. A launcher returns a cudaError_t as
 * int (0: queued); it synchronises (the compute stream) only where the
 * descriptor hands a value back through a host pointer (the norm, the
 * non-finite index and count, cross-entropy's total weight); a device
 * pointer there gets a stream-ordered copy instead. Built only with
 * LK_HAVE_CUDA. */
#ifndef LK_BACKEND_CUDA_IMPL_H
#define LK_BACKEND_CUDA_IMPL_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend_impl.h"

/* backend.c: the backend device/cuda.c registers for LK_CUDA. */
extern const lk_backend lk__cuda_backend;

int lk__cuda_elementwise(const lk_op_desc *d, void *const *x);
int lk__cuda_rows(const lk_op_desc *d, void *const *x);
int lk__cuda_optim(const lk_op_desc *d, void *const *x);
int lk__cuda_conv(const lk_op_desc *d, void *const *x);

/* Which kernel file's launcher runs a (non-GEMM) descriptor; `l` holds one
 * launcher per file, in the order above (backend.c passes these, the host
 * emulation test its own builds of the same files). */
typedef int (*lk__cuda_launcher)(const lk_op_desc *d, void *const *x);
typedef struct {
    lk__cuda_launcher elementwise, rows, optim, conv;
} lk__cuda_launchers;

/* widen.cu: whether any operand of d is bf16/f16, and d run through `run`
 * (the f32 launcher of its family) on f32 scratch copies of its 16-bit
 * operands, the written ones rounded back once (the CPU's widen.c). */
int lk__cuda_widened(const lk_op_desc *d, void *const *x, lk__cuda_launcher run);

static inline lk__cuda_launcher lk__cuda_launcher_for(const lk__cuda_launchers *l, lk_op_kind op) {
    switch (op) { /* ops.def's cuda column; gemm runs through cuBLASLt (backend.c), never here */
#define LK__CUDA_FILE_elementwise l->elementwise
#define LK__CUDA_FILE_rows l->rows
#define LK__CUDA_FILE_optim l->optim
#define LK__CUDA_FILE_conv l->conv
#define LK__CUDA_FILE_gemm l->rows
#define LK_OP(KIND, name, arity, fields, cpu, cuda, widen) \
    case LK_OP_##KIND: return LK__CUDA_FILE_##cuda;
#include "backend/ops.def"
#undef LK_OP
#undef LK__CUDA_FILE_elementwise
#undef LK__CUDA_FILE_rows
#undef LK__CUDA_FILE_optim
#undef LK__CUDA_FILE_conv
#undef LK__CUDA_FILE_gemm
    default: return l->rows;
    }
}

/* The descriptor's operands that are host pointers by contract (written by
 * the op, read by the caller right after): everything else must be device
 * memory. */
static inline bool lk__cuda_host_operand(const lk_op_desc *d, int i) {
    switch (d->op) {
    case LK_OP_NORM:
    case LK_OP_NONFINITE: return i == 1;
    case LK_OP_UNSCALE: return i == 2;
    case LK_OP_XENT: return i == 5;
    case LK_OP_NLL: return i == 4;
    default: return false;
    }
}

#ifdef __cplusplus
}
#endif
#endif

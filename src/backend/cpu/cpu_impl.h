/* Private to the CPU backend (src/backend/cpu/): the kernels each family's
 * file provides to backend.c, which answers supports() and dispatches run().
 * One file per op family: gemm.c (f32 GEMM over OpenBLAS, or the own
 * small-shape kernel of gemm_small.c by a fixed shape rule; the bf16/f16
 * GEMMs are ../cpu_lowp.c and ../cpu_dnnl.c), elementwise.c (unary, its backward,
 * binary with broadcast, axpy, affine, sum-to-shape), softmax.c (softmax and
 * log-softmax, forward and backward), loss.c (mse, l1, smooth_l1), norm.c
 * (layer and batch norm), optim.c (the optimizers' update loops), pool.c (pooling),
 * xent.c (cross-entropy, nll), conv.c (the convolution's im2col, col2im,
 * bias and bias gradient), grads.c (norms and the non-finite check of
 * gradients), embedding.c (embedding's gather and scatter-add), copy.c
 * (strided copies and casts), widen.c (the bf16/f16 path of the f32-only
 * families: widen, run the f32 kernel, round once). */
#ifndef LK_BACKEND_CPU_IMPL_H
#define LK_BACKEND_CPU_IMPL_H

#include "backend/backend_impl.h"

/* The op families below (each LK_ISA_DECLAREd) live in the files compiled
 * once per instruction set (backend/isa.h, LK_ISA_SOURCES in
 * CMakeLists.txt); backend.c calls the copy for this CPU with LK_ISA_PICK.
 * Their supports() predicates exist in the baseline copy only. */

/* gemm.c: C = alpha op(A) op(B) + beta C in f32, cut across the compute threads. */
void lk__cpu_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* The same on the calling thread only (a piece of a GEMM another split cut). */
void lk__cpu_sgemm1(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* The work from which lk__cpu_sgemm is cut: below ~30 us of one core, a
 * second one does not pay. */
#define LK__CPU_SGEMM_SPLIT_FLOPS (4.0 * 1024 * 1024)
/* How many tasks a GEMM of M x N x K is cut into when it does at least
 * min_flops (1: run whole), and whether by C's columns (else its rows), in
 * pieces of at least 16: the rule of lk__cpu_sgemm and the oneDNN GEMMs. */
static inline int lk__cpu_gemm_width(int64_t M, int64_t N, int64_t K, double min_flops, bool *by_cols) {
    int width = 2.0 * (double)M * (double)N * (double)K >= min_flops ? lk__parallel_width(INT64_MAX) : 1;
    *by_cols = N >= 32 * width || N >= M;
    int64_t parts = (*by_cols ? N : M) / 16;
    if (width > parts) width = parts > 1 ? (int)parts : 1;
    return width;
}

/* elementwise.c: the element-wise families with every operand f32, bf16 or
 * f16 (each operand its own dtype). All-f32 descriptors take the vectorised
 * loops; the others widen their operands to f32, run the same loops and
 * round each output element once. */
bool lk__cpu_elementwise_supports(const lk_op_desc *d);
LK_ISA_DECLARE(lk_status, lk__cpu_elementwise, (const lk_op_desc *d, void *const *x));

/* softmax.c: LK_OP_SOFTMAX and LK_OP_SOFTMAX_BACKWARD, f32. */
LK_ISA_DECLARE(lk_status, lk__cpu_softmax, (const lk_op_desc *d, void *const *x));
/* loss.c: LK_OP_LOSS, LK_OP_BCE and their backwards, f32. */
LK_ISA_DECLARE(lk_status, lk__cpu_loss, (const lk_op_desc *d, void *const *x));
LK_ISA_DECLARE(lk_status, lk__cpu_bce, (const lk_op_desc *d, void *const *x));
/* norm.c: LK_OP_LAYER_NORM and LK_OP_LAYER_NORM_BACKWARD, f32. */
LK_ISA_DECLARE(lk_status, lk__cpu_layer_norm, (const lk_op_desc *d, void *const *x));
/* norm.c: LK_OP_BATCH_NORM and LK_OP_BATCH_NORM_BACKWARD, f32. */
LK_ISA_DECLARE(lk_status, lk__cpu_batch_norm, (const lk_op_desc *d, void *const *x));
bool lk__cpu_bn_native_half(const lk_op_desc *d, void *const *x);
/* norm.c: LK_OP_BN_STATS, LK_OP_BN_APPLY and LK_OP_BN_FINISH(_BACKWARD) (SyncBatchNorm's
 * passes and its per-channel finish), f32 (sums f64). */
LK_ISA_DECLARE(lk_status, lk__cpu_bn_split, (const lk_op_desc *d, void *const *x));
/* optim.c: LK_OP_OPTIM_UPDATE, f32. */
LK_ISA_DECLARE(lk_status, lk__cpu_optim_update, (const lk_op_desc *d, void *const *x));
/* pool.c: LK_OP_POOL2D and LK_OP_POOL2D_BACKWARD, f32 (i32 indices). */
LK_ISA_DECLARE(lk_status, lk__cpu_pool2d, (const lk_op_desc *d, void *const *x));
/* conv.c: LK_OP_IM2COL, LK_OP_COL2IM, LK_OP_BIAS_ADD, LK_OP_CHANNEL_SUM, f32. */
LK_ISA_DECLARE(lk_status, lk__cpu_conv, (const lk_op_desc *d, void *const *x));
/* grads.c: LK_OP_NORM, LK_OP_NONFINITE, LK_OP_UNSCALE and LK_OP_CLAMP, f32 (f64 sums, i64 index). */
LK_ISA_DECLARE(lk_status, lk__cpu_grads, (const lk_op_desc *d, void *const *x));
/* embedding.c: LK_OP_EMBEDDING and _BACKWARD, f32 rows, i32 or i64 indices. */
LK_ISA_DECLARE(lk_status, lk__cpu_embedding, (const lk_op_desc *d, void *const *x));
/* attention.c: LK_OP_ATTENTION and _BACKWARD, f32 (lse f32). */
LK_ISA_DECLARE(lk_status, lk__cpu_attention, (const lk_op_desc *d, void *const *x));
/* copy.c: LK_OP_COPY (copies and casts) and LK_OP_FILL, any dtype. */
LK_ISA_DECLARE(lk_status, lk__cpu_copy, (const lk_op_desc *d, void *const *x));
LK_ISA_DECLARE(lk_status, lk__cpu_fill, (const lk_op_desc *d, void *const *x));
/* widen.c: the bf16/f16 path of the f32-only families (pooling, the norms,
 * SyncBatchNorm's passes, embedding's backward): 16-bit operands widened to
 * f32 scratch, `run` on the all-f32 descriptor, written operands rounded
 * back once (lk__op_has_half / lk__op_widened in backend_impl.h say which
 * descriptors and run on what). */
lk_status lk__cpu_run_widened(const lk_op_desc *d, void *const *x,
                              lk_status (*run)(const lk_op_desc *d, void *const *x));
/* The calling thread's grow-only scratch buffers, one per use, so a
 * repeated step neither allocates nor faults pages in: the widening paths'
 * f32 arrays, the bf16x3 GEMMs' split operands (../cpu_lowp.c) and the own
 * GEMM's packed panel (gemm_small.c), batch norm's per-channel double
 * sums (norm.c), apart so that none can clobber
 * another. At least `bytes`, LK_ALIGN-aligned; NULL on OOM; valid until the next call for the same use on this thread
 * (lk__cpu_widen_thread_cleanup frees them). */
enum { LK__SCRATCH_WIDEN, LK__SCRATCH_GEMM, LK__SCRATCH_OWN_GEMM, LK__SCRATCH_NORM, LK__SCRATCH_USES };
void *lk__cpu_scratch_for(int use, size_t bytes);
/* The widening paths' f32 scratch: at least n floats. */
static inline float *lk__cpu_scratch(size_t n) { return lk__cpu_scratch_for(LK__SCRATCH_WIDEN, n * sizeof(float)); }
/* Batch norm and layer norm (forward and backward) with 16-bit operands, in
 * chunks of channels / rows through the same scratch. */
lk_status lk__cpu_bn_half(const lk_op_desc *d, void *const *x, lk_status (*run)(const lk_op_desc *d, void *const *x));
lk_status lk__cpu_ln_half(const lk_op_desc *d, void *const *x, lk_status (*run)(const lk_op_desc *d, void *const *x));
/* xent.c: cross-entropy and nll_loss, forward and backward (f32 data, i32
 * or i64 targets, f64 total weight). */
bool lk__cpu_xent_supports(const lk_op_desc *d);
LK_ISA_DECLARE(lk_status, lk__cpu_xent, (const lk_op_desc *d, void *const *x));

/* accuracy.c: LK_OP_ACCURACY (f32/bf16/f16 logits, i64/i32/u8 targets, f64 count). */
LK_ISA_DECLARE(lk_status, lk__cpu_accuracy, (const lk_op_desc *d, void *const *x));

#endif

/* Private: the per-device backend vtable and its registry. The autograd ops
 * do shape logic and build op descriptors for the math; the CPU backend
 * (src/backend/cpu/) is the reference every other backend is tested against.
 * One comment per method. */
#ifndef LK_BACKEND_IMPL_H
#define LK_BACKEND_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/isa.h"
#include "backend/kernels.h"
#include "lockstep/device.h"
#include "lockstep/dtype.h"

/* ---- typed ops ------------------------------------------------------------
 * A backend says which op descriptors it runs — the op, the dtype of every
 * operand, shapes and parameters — and runs them over its device's memory.
 * The autograd ops keep the shape logic and build descriptors; a new dtype or
 * device changes backends, never ops. Dispatch is once per op call: a
 * backend's run() loops over the elements itself (no per-element calls). */
#define LK_OP_MAX_OPERANDS 8
/* One kind per row of backend/ops.def, in its order (the operands of each
 * are listed there). */
typedef enum {
#define LK_OP(KIND, name, arity, fields, cpu, cuda, widen) LK_OP_##KIND,
#include "backend/ops.def"
#undef LK_OP
    LK_OP_COUNT
} lk_op_kind;

/* C[M,N] = alpha * op(A)[M,K] op(B)[K,N] + beta * C, row-major, leading
 * dimensions in elements, op(X) = X^T when the flag is set; products are
 * accumulated in f32 whatever the operands' dtype. */
typedef struct lk_gemm_params {
    bool trans_a, trans_b;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
} lk_gemm_params;

/* LK_OP_UNARY / LK_OP_UNARY_BACKWARD: n contiguous elements; alpha is the
 * function's parameter (leaky slope, elu alpha); acc (backward only) adds
 * into dx instead of overwriting it. x or y may be NULL in the backward when
 * the function's derivative does not read it (lk_k_unary_grad then sees 0). */
typedef struct lk_unary_params {
    lk_unary_op fn;
    int64_t n;
    float alpha;
    bool acc;
} lk_unary_params;

/* LK_OP_BINARY: out (contiguous, `shape`) = a (fn) b, where a and b are read
 * with strides in elements, 0 on the dimensions they broadcast on. */
typedef struct lk_binary_params {
    lk_binary_op fn;
    int ndim;
    int64_t shape[LK_MAX_DIMS], sa[LK_MAX_DIMS], sb[LK_MAX_DIMS];
    /* out = max(0, a op b) (x > 0 ? x : 0, the unary ReLU's formula) in the
     * same pass, before a 16-bit output's rounding (lk_add_relu; CPU only) */
    bool relu;
} lk_binary_params;

/* LK_OP_AXPY / LK_OP_AFFINE over n contiguous elements. */
typedef struct lk_axpy_params {
    int64_t n;
    float alpha;
} lk_axpy_params;
/* has_add: y = x * mul + add (turns -0 into +0 as the scalar ops do);
 * otherwise y = x * mul exactly. x and y may be the same array. */
typedef struct lk_affine_params {
    int64_t n;
    float mul, add;
    bool has_add;
} lk_affine_params;

/* LK_OP_SUM_TO: src is contiguous of `shape`; element i of it is added to
 * dst at the offset its multi-index has under the strides sd (0 on the
 * dimensions summed over). Sums run in src's order, innermost first. */
typedef struct lk_sum_to_params {
    int ndim;
    int64_t shape[LK_MAX_DIMS], sd[LK_MAX_DIMS];
} lk_sum_to_params;

/* LK_OP_SOFTMAX / LK_OP_SOFTMAX_BACKWARD over contiguous [outer, C, inner]
 * tensors, along C; log_out: log-softmax. */
typedef struct lk_softmax_params {
    int64_t outer, C, inner;
    bool log_out;
} lk_softmax_params;

/* LK_OP_LOSS / LK_OP_LOSS_BACKWARD over n contiguous elements. reduction is
 * an lk_reduction (lockstep/tensor.h): NONE writes n losses (backward: dout
 * has n), MEAN and SUM one (dout has one); mean and sum accumulate in
 * double. beta: smooth_l1's threshold (> 0; 0 is l1). The kinds and their
 * formulas: kernels/rows.h (lk_k_ploss). */
typedef struct lk_loss_params {
    lk_ploss_kind kind;
    int reduction;
    int64_t n;
    float beta;
} lk_loss_params;

/* LK_OP_LAYER_NORM / _BACKWARD over M contiguous rows of L: y = (x - mean)
 * * rstd * w + b with rstd = 1 / sqrt(var + eps) (biased variance); stats
 * holds [M, 2] mean and rstd per row, written forward and read backward;
 * dw and db accumulate (+=). */
typedef struct lk_layer_norm_params {
    int64_t M, L;
    float eps;
} lk_layer_norm_params;

/* LK_OP_OPTIM_UPDATE: torch.optim 1.13's single-tensor update of n
 * parameters p from gradients g, with the state arrays in place:
 *   SGD: s0 momentum_buffer (unused without momentum; `first`: step 1);
 *   ADAM (and AdamW): s0 exp_avg, s1 exp_avg_sq, s2 max_exp_avg_sq or NULL;
 *   RMSPROP: s0 square_avg, s1 momentum_buffer or NULL, s2 grad_avg or NULL.
 * Hyperparameters as the config holds them (double); the kernels round them
 * to f32 as PyTorch does. */
typedef enum { LK_OPTIM_RULE_SGD, LK_OPTIM_RULE_ADAM, LK_OPTIM_RULE_RMSPROP } lk_optim_rule;
typedef struct lk_optim_params {
    lk_optim_rule rule;
    int64_t n, step;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps, alpha;
    bool nesterov, maximize, adamw;
} lk_optim_params;

/* The f32 scalars of one update (kernels/optim.h), rounded once from the
 * descriptor's doubles as PyTorch rounds a Python float for an f32 tensor
 * op; the CPU and CUDA backends both build them here. Which state arrays
 * exist (amsgrad's max, RMSprop's momentum buffer and grad_avg) is the
 * caller's: the optimizer passes NULL for an absent one. */
static inline lk_k_sgd lk__optim_sgd_consts(const lk_optim_params *c) {
    return (lk_k_sgd){(float)c->weight_decay, (float)c->momentum, (float)(1.0 - c->dampening), (float)(-c->lr),
                      c->weight_decay != 0.0, c->momentum != 0.0, c->nesterov, c->maximize, c->step == 1};
}

static inline lk_k_adam lk__optim_adam_consts(const lk_optim_params *c, bool amsgrad) {
    const double bc1 = 1.0 - pow(c->beta1, (double)c->step), bc2 = 1.0 - pow(c->beta2, (double)c->step);
    const float decay = (float)(1.0 - c->lr * c->weight_decay), bc2s = (float)sqrt(bc2);
    return (lk_k_adam){(float)c->beta1, (float)c->beta2, (float)(1.0 - c->beta1), (float)(1.0 - c->beta2),
                       bc2s, 1.0f / bc2s, (float)c->eps, (float)(-(c->lr / bc1)), (float)c->weight_decay, decay,
                       c->maximize, !c->adamw && c->weight_decay != 0.0, c->adamw && decay != 1.0f, amsgrad};
}

static inline lk_k_rmsprop lk__optim_rmsprop_consts(const lk_optim_params *c, bool has_mom, bool centered) {
    return (lk_k_rmsprop){(float)c->alpha, (float)(1.0 - c->alpha), (float)c->eps, (float)c->weight_decay,
                          (float)c->momentum, (float)(-c->lr), c->weight_decay != 0.0, c->maximize, centered, has_mom};
}

/* LK_OP_OPTIM_UPDATE's per-step values (its `live` block, the rule's member):
 * the constants themselves, as lk__optim_*_consts compute them on the host
 * from the descriptor (in double, rounded once), with the flags that say
 * which state arrays exist left false; a backend takes those from its
 * operands (kernels/optim.h's lk_k_*_live). Constants, not step and lr,
 * because a device's pow would not round as glibc's does. */
typedef union lk_optim_live {
    lk_k_sgd sgd;
    lk_k_adam adam;
    lk_k_rmsprop rmsprop;
} lk_optim_live;

/* LK_OP_POOL2D / _BACKWARD over `planes` contiguous H x W planes into OH x
 * OW, PyTorch's geometry (kernels/conv.h); adaptive avg uses only the sizes. */
typedef enum { LK_POOL_MAX, LK_POOL_AVG, LK_POOL_ADAPTIVE_AVG } lk_pool_kind;
typedef struct lk_pool_params {
    lk_pool_kind kind;
    long planes, H, W, OH, OW, kh, kw, sh, sw, ph, pw;
    bool count_include_pad;
} lk_pool_params;

/* LK_OP_IM2COL / LK_OP_COL2IM: `samples` contiguous [C, H, W] images and
 * their columns [C*kh*kw, ldc]: sample j fills columns [j*OH*OW,
 * (j+1)*OH*OW) (ldc >= samples*OH*OW), PyTorch's conv geometry (zero
 * padding, stride, dilation; kernels/conv.h). */
typedef struct lk_im2col_params {
    long samples, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, ldc;
} lk_im2col_params;

/* LK_OP_BIAS_ADD / LK_OP_CHANNEL_SUM: `samples` NCHW blocks of O planes of
 * P elements. BIAS_ADD reads y as [O, samples*P] (a chunk's GEMM output)
 * and writes out as [samples, O, P]; y == out only when samples == 1 (the
 * bias added in place). CHANNEL_SUM reads dy as [samples, O, P] and adds
 * each plane's f32 sum into db[o], samples outer, in order. */
typedef struct lk_bias_params {
    long samples, O, P;
} lk_bias_params;

/* LK_OP_NORM over n contiguous elements, accumulated in double in index
 * order: p = INFINITY gives max |x| (from 0; a NaN wins and stays), p = 2
 * the sum of x*x, p = 1 the sum of |x|, other p the sum of pow(|x|, p). The
 * root is the caller's: gradient clipping rounds each tensor's norm to f32
 * before combining them, as PyTorch does. */
typedef struct lk_norm_params {
    int64_t n;
    double p;
} lk_norm_params;

/* LK_OP_NONFINITE over n contiguous elements: idx[0] = the index of the
 * first inf or NaN in x, or -1 (mul unused). LK_OP_UNSCALE, the loss
 * scaler's: y = x * mul exactly (y may be x itself) and count[0] = how many
 * elements of x were inf or NaN before scaling, in one fused pass over
 * memory (a separate check pass costs a third more). */
typedef struct lk_nonfinite_params {
    int64_t n;
    float mul;
} lk_nonfinite_params;

/* LK_OP_EMBEDDING / _BACKWARD: n indices (already checked to be in [0, V))
 * into V rows of D contiguous elements. */
typedef struct lk_embedding_params {
    int64_t n, V, D;
} lk_embedding_params;

/* LK_OP_COPY: dst[i] = src[i] over `shape`, each read and written at its
 * strides (elements, >= 0); src and dst must not overlap. With one dtype on
 * both sides the bits move unchanged (concat, slice's backward, the shape
 * ops' clones, linear's bias rows with source stride 0, conv's dY gather);
 * with two it is a cast (lk_tensor_copy, lk_tensor_cast): floats through
 * double (a 16-bit result rounded to nearest even from f32, as
 * lk_f32_to_half_n), integers through int64, float to integer truncated.
 * With `accumulate` (f32 only): dst[i] += src[i] instead, elements in
 * row-major order of `shape` (a strided gradient's accumulation). */
typedef struct lk_copy_params {
    int ndim;
    int64_t shape[LK_MAX_DIMS], ss[LK_MAX_DIMS], sd[LK_MAX_DIMS];
    bool accumulate;
} lk_copy_params;

/* LK_OP_FILL: dst[i] = value over `shape` at strides `sd`, value converted
 * to dst's dtype as a cast from f64 would (lk_tensor_fill, lk_tensor_full). */
typedef struct lk_fill_params {
    int ndim;
    int64_t shape[LK_MAX_DIMS], sd[LK_MAX_DIMS];
    double value;
} lk_fill_params;

/* LK_OP_BN_STATS / LK_OP_BN_APPLY: SyncBatchNorm's passes over contiguous
 * [N, C, S] x, split where the all-reduce of per-channel sums goes between
 * them (the op keeps the all-reduce and the per-channel scalars). Sums run
 * per plane in f32 and across the N planes of a channel in double, in order.
 * BN_STATS (g and mean NULL where unused) writes out[C], or [2C] for GRAD:
 *   SUM:   out[c] = sum of x over channel c;
 *   SQDEV: out[c] = sum of (x - mean[c])^2;
 *   GRAD:  out[c] = sum of g, out[C + c] = sum of g * (x - mean[c]);
 *   MOMENTS: out[c] = sum of x, out[C + c] = sum of x^2 (from the
 *          deviations from the channel's own mean: lk_k_bn_channel_moments).
 * BN_APPLY: forward (g NULL) y = x * coef[c] + coef[C + c] (coef [2, C]:
 * scale, shift); backward y = dx from g with coef [4, C] = mean, k0, k1, k2
 * (lk_k_bn_backward_plane). */
typedef enum { LK_BN_SUM, LK_BN_SQDEV, LK_BN_GRAD, LK_BN_MOMENTS } lk_bn_stat;
typedef struct lk_bn_split_params {
    long N, C, S;
    lk_bn_stat stat; /* BN_STATS */
    bool backward;   /* BN_APPLY */
} lk_bn_split_params;

/* LK_OP_BN_FINISH / _BACKWARD: SyncBatchNorm's per-channel values between
 * its all-reduce and the next pass, on the op's device (so a step with
 * SyncBatchNorm neither waits for a host copy nor stops a graph capture);
 * one thread per channel, PyTorch's SyncBatchNorm arithmetic (ops_norm.c):
 *   forward  (sums, w, b, running_mean, running_var, stats, coef): sums is
 *     the reduced f64 [2C + 1] of BN_STATS' MOMENTS plus the count M over
 *     every rank; stats [2, C] = the global mean and invstd (biased
 *     variance, eps), coef [2, C] = BN_APPLY's scale and shift; the running
 *     statistics (both or neither; strided, elements) move by momentum
 *     towards the mean and the unbiased variance (over M). w, b may be NULL
 *     (1 and 0); w, b, the running statistics may be strided (stride: w, b,
 *     running_mean, running_var) and 16-bit (widened, ops.def).
 *   backward (sums, w, count, stats, dw, db, coef): sums f64 [4C] is this
 *     rank's BN_STATS GRAD [2C] then the reduced [2C]; w f32 contiguous or
 *     NULL; count the forward's M (f64 [1], device memory: sums[2C] of the
 *     forward); stats the forward's; db = this rank's sum of g, dw = this
 *     rank's sum of g (x - mean) times invstd (each NULL: not written);
 *     coef [4, C] (NULL: not written) = BN_APPLY backward's mean, k0, k1, k2
 *     from the reduced sums. */
typedef struct lk_bn_finish_params {
    long C;
    float eps, momentum; /* forward */
    int64_t stride[4];   /* forward: w, b, running_mean, running_var */
} lk_bn_finish_params;

/* LK_OP_CLAMP over n contiguous elements (x and y may be the same array). */
typedef struct lk_clamp_params {
    int64_t n;
    float lo, hi;
} lk_clamp_params;

/* LK_OP_BCE / _BACKWARD over n contiguous elements, w and pos_w already
 * broadcast to them; reduction as for LK_OP_LOSS; logits: the stable form
 * on logits (pos_w only there). */
typedef struct lk_bce_params {
    int64_t n;
    int reduction;
    bool logits;
} lk_bce_params;

/* LK_OP_XENT / LK_OP_NLL and their backwards: input [N, C, D] (class c of
 * row r = n * D + d at n*C*D + c*D + d), one integer target per row (the
 * target operand's dtype: i32 or i64, values already checked), class weights
 * w [C] or NULL, label smoothing eps (xent only). Forward writes the losses
 * (reduction NONE) or their mean / sum into out and the total weight of the
 * counted rows into wsum (one f64); P [N*D, C] keeps each row's softmax for
 * the backward, which takes norm (that total weight) and W (sum of w, or C). */
typedef struct lk_xent_params {
    int64_t N, C, D, ignore_index;
    int reduction;
    float eps, norm, W;
} lk_xent_params;

/* LK_OP_BATCH_NORM / _BACKWARD over contiguous [N, C, S] x (S: the spatial
 * size), per channel: training normalises by the batch's mean and biased
 * variance (sums per plane in f32, across planes in double; M = N * S) and
 * updates the running statistics in place (unbiased variance); eval uses the
 * running statistics. stats is [2, C]: mean, then invstd. The per-channel
 * vectors w, b, running_mean, running_var may be strided (stride: elements;
 * NULL where absent); the backward's w is contiguous and dw, db are
 * overwritten. SyncBatchNorm's all-reduced statistics are LK_OP_BN_STATS /
 * LK_OP_BN_APPLY below. relu: batch norm then ReLU in one op (CPU only,
 * f32 per-channel vectors): the forward writes max(0, bn(x)) (x > 0 ? x : 0,
 * as the unary ReLU) in the pass that normalises; the backward reads that
 * output y (operand 7) and uses dy where y > 0, else 0 (the ReLU's mask:
 * y > 0 exactly where its input was), masking each plane in cache, so the
 * bits are those of LK_OP_BATCH_NORM followed by a separate ReLU. */
typedef struct lk_batch_norm_params {
    long N, C, S;
    double M;
    float eps, momentum;
    bool training;
    int64_t stride[4]; /* w, b, running_mean, running_var */
    bool relu;
} lk_batch_norm_params;

/* LK_OP_MASK_SCALE over n contiguous elements; x * 0 keeps inf * 0 = NaN,
 * as PyTorch's dropout does. */
typedef struct lk_mask_scale_params {
    int64_t n;
    float scale;
} lk_mask_scale_params;

/* LK_OP_ACCURACY: logits [N, C] contiguous (f32, bf16 or f16: widened
 * exactly), target [N] (i64, i32 or u8), hits[0] = (double) the number of
 * rows r whose predicted class is target[r], the class found as the
 * trainer's host loop finds it: the first index k with x[r, k] > the best
 * so far, from k = 0 (ties keep the earlier class; a NaN never wins a
 * comparison, so a row starting with NaN predicts class 0). Written, not
 * accumulated: the count of one batch (val_acc = hits / N on the host). */
typedef struct lk_accuracy_params {
    int64_t N, C;
} lk_accuracy_params;
/* LK_OP_DROPOUT_MASK: keep[i] = !((float)(w_i >> 8) < thr), w_0, w_1, ...
 * the stream's 32-bit words: first the head_n (0..3) words of head (those
 * the host's lk_rng still buffers), then Philox4x32-10 block b = 0, 1, ...
 * of (key, ctr + b), four words each in order, where ctr + b adds b to the
 * 64-bit counter ctr[1]:ctr[0] (ctr[2], ctr[3] kept), as lk_rng_u32
 * advances it. thr = p * 2^24, so the test is lk_rng_uniform() < p exactly
 * (the scaling is by a power of two); p = 1 (thr = 2^24) keeps nothing.
 * Each word is a pure function of (key, counter, index): any device draws
 * the host's mask bit for bit. */
typedef struct lk_dropout_mask_params {
    int64_t n;
    uint32_t key[2], ctr[4], head[3];
    int head_n;
    float thr;
} lk_dropout_mask_params;
/* Its per-step values (`live`): the stream's place, the fields of the same
 * names. With `live` set, head_n is not checked by supports (it may hold
 * anything); the CPU checks the block's, a kernel clamps it to 0..3. */
typedef struct lk_dropout_mask_live {
    uint32_t ctr[4], head[3];
    int head_n;
} lk_dropout_mask_live;

/* LK_OP_ATTENTION / _BACKWARD: causal multi-head self-attention on GPT-2's
 * packed projections, qkv [B, T, 3, H, D] -> y [B, T, H, D], in the
 * flash-attention manner: each query row runs over its keys j <= i with an
 * online softmax (running max and sum), so no [T, T] matrix exists; its
 * logsumexp lse [B, H, T] is kept, and the backward recomputes each
 * probability from it (kernels/attention.h). scale: 1/sqrt(D) as a rule.
 * Dropout on the probabilities when thr > 0 (thr = p * 2^24, keep_scale =
 * 1/(1-p)): probability (b, h, i, j) is kept by word e % 4 of the Philox
 * block of counter ctr + e / 4, e = ((b H + h) T + i) T + j — a pure
 * function of the position, so the backward draws the same mask without
 * storing it. */
typedef struct lk_attention_params {
    int64_t B, T, H, D;
    float scale, thr, keep_scale;
    uint32_t key[2], ctr[4];
} lk_attention_params;
#define LK_ATTENTION_MAX_D 256 /* a head's width: the row accumulators live in registers/stack */

/* LK_OP_INCREMENT over n contiguous i64 elements (two's complement wrap). */
typedef struct lk_increment_params {
    int64_t n, by;
} lk_increment_params;
/* LK_OP_CLIP_COEF: from n gradients' raw norms (LK_OP_NORM's outputs: max
 * |x| for p = inf, the sum of |x|^p otherwise) the coefficient
 * min(max_norm / (total + 1e-6), 1) of torch.nn.utils.clip_grad_norm_, in
 * clip.c's order and precisions (kernels/optim.h's lk_k_clip_coef); p is 1,
 * 2 or inf (another p needs libm's pow, which a GPU does not match).
 * LK_OP_SCALE_BY: y = x * coef[0] over n elements, exactly LK_OP_AFFINE
 * without add, the multiplier read where the op runs (a device's own
 * coefficient: no read by the host). p and max_norm unused. */
typedef struct lk_clip_params {
    int64_t n;
    double p, max_norm;
} lk_clip_params;

typedef struct lk_op_desc {
    lk_op_kind op;
    lk_dtype dtype[LK_OP_MAX_OPERANDS]; /* operand dtypes in run()'s order (see lk_op_kind) */
    /* NULL, or memory on the op's device holding its per-step values
     * (lk__op_live_size bytes in lk__op_live_fill's layout), which the
     * backend then reads when the op executes instead of the descriptor's
     * live fields: what lets a captured graph replay with new values. */
    const void *live;
    union {
        lk_gemm_params gemm;
        lk_unary_params unary;
        lk_binary_params binary;
        lk_axpy_params axpy;
        lk_affine_params affine;
        lk_sum_to_params sum_to;
        lk_mask_scale_params mask_scale;
        lk_softmax_params softmax;
        lk_loss_params loss;
        lk_layer_norm_params layer_norm;
        lk_batch_norm_params batch_norm;
        lk_optim_params optim;
        lk_pool_params pool;
        lk_bce_params bce;
        lk_xent_params xent;
        lk_im2col_params im2col;
        lk_bias_params bias;
        lk_norm_params norm;
        lk_nonfinite_params nonfinite;
        lk_embedding_params embedding;
        lk_copy_params copy;
        lk_fill_params fill;
        lk_bn_split_params bn_split;
        lk_bn_finish_params bn_finish;
        lk_clamp_params clamp;
        lk_accuracy_params accuracy;
        lk_dropout_mask_params dropout_mask;
        lk_attention_params attention;
        lk_increment_params increment;
        lk_clip_params clip;
    };
} lk_op_desc;

/* ---- descriptor fields (op_fields.c) ----------------------------------------
 * Each op kind's parameter fields, for comparing two descriptors field by
 * field (padding never counts) and naming the fields that differ. A field
 * marked live is a per-step value: Adam's step (its bias corrections), a
 * dropout mask's place in its Philox stream, the loss scale; the rest of a
 * steady training step's descriptors repeat exactly. */
typedef struct lk_op_field {
    const char *name;
    size_t off, size; /* within lk_op_desc */
    bool live;
} lk_op_field;
typedef struct lk_op_info {
    const char *name; /* "gemm", "optim_update", ... */
    const lk_op_field *f;
    int n;
} lk_op_info;
const lk_op_info *lk__op_info(lk_op_kind op);
/* Same kind, same dtypes and every field of the kind's table equal; with
 * but_live, the live fields may differ. */
bool lk__op_desc_same(const lk_op_desc *a, const lk_op_desc *b, bool but_live);
/* How many bytes of per-step values d's kind reads from `live` (0: none;
 * such an op must match exactly to replay), and those values of d, in the
 * layout its kernels read, into out (host memory). */
size_t lk__op_live_size(const lk_op_desc *d);
void lk__op_live_fill(const lk_op_desc *d, void *out);
/* LK_OP_AFFINE's per-step values: mul, add (the loss scale under
 * 16-mixed); LK_OP_UNSCALE's: mul (1 / scale). */
typedef struct lk_affine_live {
    float mul, add;
} lk_affine_live;
typedef struct lk_unscale_live {
    float mul;
} lk_unscale_live;
/* The descriptor a host-memory backend runs for d: d itself, or (`live`
 * set, an affine, unscale or dropout mask) a copy in *tmp with the live
 * fields read from `live`. An optimizer update reads its constants with
 * lk__optim_*_consts_of instead. */
const lk_op_desc *lk__op_live_apply(const lk_op_desc *d, lk_op_desc *tmp);
/* An update's constants from host memory: d's `live` block when set (the
 * state arrays' flags from the caller), else computed from its fields. */
static inline lk_k_sgd lk__optim_sgd_consts_of(const lk_op_desc *d) {
    return d->live ? ((const lk_optim_live *)d->live)->sgd : lk__optim_sgd_consts(&d->optim);
}
static inline lk_k_adam lk__optim_adam_consts_of(const lk_op_desc *d, bool amsgrad) {
    return d->live ? lk_k_adam_live(&((const lk_optim_live *)d->live)->adam, amsgrad)
                   : lk__optim_adam_consts(&d->optim, amsgrad);
}
static inline lk_k_rmsprop lk__optim_rmsprop_consts_of(const lk_op_desc *d, bool has_mom, bool centered) {
    return d->live ? lk_k_rmsprop_live(&((const lk_optim_live *)d->live)->rmsprop, has_mom, centered)
                   : lk__optim_rmsprop_consts(&d->optim, has_mom, centered);
}

/* How many operands run() takes for an op (GEMM 3, unary backward 4, ...;
 * ops.def's arity; 0 for a kind out of range). */
int lk__op_arity(lk_op_kind op);
/* The op's name in ops.def ("gemm", "optim_update"); "?" out of range. */
const char *lk__op_name(lk_op_kind op);
/* Whether a descriptor of op with a bf16/f16 operand runs as its f32 form on
 * widened scratch (ops.def's WIDEN), and which operand the cuda backend
 * keeps f32 (*keep_f32, -1: none; may be NULL). */
bool lk__op_widens(lk_op_kind op, int *keep_f32);
/* Operand i of d as the backends' 16-bit widening paths see it
 * (cpu/widen.c, cuda/widen.cu: one table, so the two widen the same
 * extents): its element count, its element stride (batch norm's strided
 * per-channel vectors; else 1) and whether the op writes it. False for an
 * op without a widened 16-bit path. */
bool lk__op_operand_extent(const lk_op_desc *d, int i, int64_t *count, int64_t *stride, bool *written);
/* Whether an operand of d is bf16 or f16; d with every such dtype made f32
 * (what a widening path runs on its f32 scratch). */
bool lk__op_has_half(const lk_op_desc *d);
lk_op_desc lk__op_widened(const lk_op_desc *d);

typedef struct lk_backend {
    const char *name;
    /* Whether run() takes this descriptor (every dtype and parameter). */
    bool (*supports)(const lk_op_desc *d);
    /* Runs it over the operands' memory, in the descriptor's order. */
    lk_status (*run)(const lk_op_desc *d, void *const *operands);
} lk_backend;

/* ---- the registry -----------------------------------------------------------
 * One backend per device kind; the CPU backend is LK_CPU's and every kind
 * without a backend of its own (host-addressable devices run the CPU's).
 * Registering NULL removes a kind's backend again (tests). */
lk_status lk__backend_register(lk_device_kind kind, const lk_backend *be);
const lk_backend *lk__backend(lk_device dev);
/* Runs d on dev's backend. A descriptor that backend does not support runs
 * on the CPU backend when dev is host-addressable (counted: see
 * lk__backend_fallbacks); otherwise, or when the CPU backend does not support
 * it either, it is an UNSUPPORTED error naming the op, the dtypes, the
 * backend and the device. */
lk_status lk__backend_run(lk_device dev, const lk_op_desc *d, void *const *operands);
/* Whether f32 GEMMs may take a reduced-precision mode (TF32 on a GPU):
 * lk_set_float32_matmul_precision("high" or "medium"). */
bool lk__f32_matmul_reduced(void);
/* Checks a float32_matmul_precision name (INVALID_ARGUMENT "<what> '<name>':
 * expected ..."); *level (may be NULL): 0 highest, 1 high, 2 medium. */
lk_status lk__f32_matmul_parse(const char *what, const char *precision, int *level);
/* How many descriptors ran on the CPU backend because their device's own
 * backend did not support them, since the process started (all threads). */
int64_t lk__backend_fallbacks(void);
/* "gemm bf16 x bf16 -> f32 (NT, 256x784x512)", "binary mul f32, bf16 -> f32
 * (4x3)" into buf, for messages and tests. */
const char *lk__op_desc_str(const lk_op_desc *d, char *buf, size_t size);
const char *lk__unary_name(lk_unary_op fn);   /* "relu", "gelu_tanh", ... */
const char *lk__binary_name(lk_binary_op fn); /* "add", "sub", "mul", "div" */

/* An f32 GEMM as a typed op on dev's backend. */
static inline lk_status lk__gemm_f32(lk_device dev, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                                     int64_t ldc) {
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {LK_F32, LK_F32, LK_F32}};
    d.gemm = (lk_gemm_params){ta, tb, M, N, K, lda, ldb, ldc, alpha, beta};
    void *ops[3] = {(void *)A, (void *)B, C}; /* a named array: this header also compiles as CUDA C++ */
    return lk__backend_run(dev, &d, ops);
}

/* The element-wise descriptors, all operands f32 (what the autograd ops use
 * today); each runs on dev's backend as above. */
lk_status lk__unary_f32(lk_device dev, lk_unary_op fn, int64_t n, const float *x, float *y, float alpha);
lk_status lk__unary_backward_f32(lk_device dev, lk_unary_op fn, int64_t n, const float *x, const float *y,
                                 const float *dy, float *dx, float alpha, bool acc);
lk_status lk__binary_f32(lk_device dev, lk_binary_op fn, int ndim, const int64_t *shape, const float *a,
                         const int64_t *sa, const float *b, const int64_t *sb, float *out);
lk_status lk__axpy_f32(lk_device dev, int64_t n, float alpha, const float *x, float *y);
lk_status lk__affine_f32(lk_device dev, int64_t n, float mul, float add, bool has_add, const float *x, float *y);
lk_status lk__sum_to_f32(lk_device dev, int ndim, const int64_t *shape, const float *src, const int64_t *sd,
                         float *dst);
/* axpy and affine with x and y both of dtype dt (f32, bf16 or f16: a
 * 16-bit element is widened, computed in f32 and rounded once). */
lk_status lk__axpy(lk_device dev, lk_dtype dt, int64_t n, float alpha, const void *x, void *y);
lk_status lk__affine(lk_device dev, lk_dtype dt, int64_t n, float mul, float add, bool has_add, const void *x, void *y);

/* cpu_lowp.c: GEMMs over bf16 or f16 A and B (the same dtype), C in f32 or
 * that dtype. oneDNN runs them where it is built and takes the shape (AMX,
 * AVX512-BF16/FP16 or its own emulation); f16 on an AMX-BF16 CPU without
 * oneDNN f16 code runs as bf16x3 (three bf16 products of exact bf16 splits);
 * otherwise A and B are widened to f32 and the f32 GEMM runs (correct, slower). */
lk_status lk__cpu_gemm_lowp(const lk_op_desc *d, const void *A, const void *B, void *C);
/* The same split, every piece through oneDNN in d's dtypes (f32 x f32 -> f32
 * too), never the fallback: UNSUPPORTED where oneDNN has no fast code for a
 * piece or lockstep was built without it. For bench ops' measurement only. */
lk_status lk__cpu_gemm_dnnl(const lk_op_desc *d, const void *A, const void *B, void *C);
/* Whether those GEMMs may use oneDNN (default: unless LK_ONEDNN=0): set, asked. */
void lk__cpu_lowp_use_dnnl(bool on);
bool lk__cpu_lowp_dnnl_on(void);
/* Whether the f32 GEMMs run through oneDNN, split as the 16-bit ones
 * (lk__cpu_gemm_f32_dnnl), rather than OpenBLAS: LK_F32_GEMM=auto|onednn|
 * openblas, read once; auto is oneDNN on an AMX-class CPU (cpu_lowp.c says
 * why). The setter is for tests. */
bool lk__cpu_f32_gemm_dnnl(void);
void lk__cpu_f32_gemm_use_dnnl(bool on);
lk_status lk__cpu_gemm_f32_dnnl(const lk_op_desc *d, const void *A, const void *B, void *C);
/* The CPU's f32 GEMM as its backend runs it: through oneDNN when the
 * above says so, else lk__cpu_sgemm. Here rather than only in the backend's
 * run() so that the bf16/f16 fallback, which widens to f32, runs it without
 * going back through lk__cpu_backend (cpu/backend.c names this file). */
lk_status lk__cpu_gemm_f32(const lk_op_desc *d, const void *A, const void *B, void *C);
/* Whether the CPU backend would cut d (a GEMM) across the compute threads
 * rather than run it whole on the calling thread: a caller with two
 * independent GEMMs that would each run whole (linear's backward) runs
 * them side by side instead. */
bool lk__cpu_gemm_cut(const lk_op_desc *d);
/* Whether f16 GEMMs run as bf16x3 (cpu_lowp.c): oneDNN runs bf16 on AMX here
 * but has no f16 GEMM, and LK_ONEDNN is not 0. */
bool lk__cpu_f16_via_bf16(void);
/* Whether GEMMs of dt run on the CPU's low-precision units (oneDNN's own
 * code for dt, or bf16x3 for f16) rather than widened to f32; f32: true. */
bool lk__cpu_gemm_native(lk_dtype dt);
/* Which path a GEMM of these dtypes takes on this machine ("onednn:avx512_core_bf16",
 * "f32 fallback"), for `lockstep env` and run.json. */
const char *lk__cpu_gemm_path(lk_dtype ab, lk_dtype c);
/* cpu/convert.c, one copy per instruction set (backend/isa.h): the bulk
 * conversions behind lk_f32_to_half_n and lk_half_to_f32_n, and bf16x3's
 * split of n f16 values into bf16 parts (hi + lo == src exactly; hi2 is hi
 * with 0 where src is inf or NaN, cpu_lowp.c says why). */
LK_ISA_DECLARE(void, lk__cpu_f32_to_half_n, (lk_dtype dt, uint16_t *dst, const float *src, size_t n));
LK_ISA_DECLARE(void, lk__cpu_half_to_f32_n, (lk_dtype dt, float *dst, const uint16_t *src, size_t n));
LK_ISA_DECLARE(void, lk__cpu_split_f16, (const uint16_t *src, uint16_t *hi, uint16_t *hi2, uint16_t *lo, int64_t n));
/* cpu_caps.c: the CPU's low-precision instructions (cpuid, at run time). */
typedef struct lk_cpu_caps {
    bool avx2, avx512f, avx512_bf16, avx512_fp16, amx_tile, amx_bf16, amx_fp16;
} lk_cpu_caps;
lk_cpu_caps lk__cpu_caps(void);
/* Whether the CPU multiplies dt natively (bf16: AVX512-BF16 or AMX-BF16;
 * f16: AVX512-FP16 or AMX-FP16; f32: always). */
bool lk__cpu_native(lk_dtype dt);
/* "avx2 yes, avx512f yes, avx512_bf16 yes, ..." into buf; returns buf. */
const char *lk__cpu_caps_str(char *buf, size_t size);

/* cpu_dnnl.c: oneDNN's convolutions on plain NCHW tensors, for conv2d
 * (src/autograd/ops_conv.c). kind and the operands a, b -> c (all plain,
 * contiguous): FWD x, W -> y (+ bias); BWD_DATA dY, W -> dX (f32);
 * BWD_WEIGHTS x, dY -> dW (f32, overwritten; bias: db, f32, overwritten).
 * dt: a's, b's and c's dtypes as the caller holds them; mul: the dtype
 * multiplied (f32 or bf16; an f32 operand of a bf16 product is rounded on
 * the way in); bias_dt: forward's bias. The struct is compared bytewise as
 * the cache key, so it has no padding: zero it before filling it. */
enum { LK__DNNL_CONV_FWD, LK__DNNL_CONV_BWD_DATA, LK__DNNL_CONV_BWD_WEIGHTS };
typedef struct lk__dnnl_conv_shape {
    long N, C, H, W, O, kh, kw, OH, OW, sh, sw, ph, pw, dh, dw, G;
    lk_dtype dt[3], mul, bias_dt;
    int bias; /* a bias (forward) or its gradient (backward-weights) */
} lk__dnnl_conv_shape;
#ifdef LK_HAVE_DNNL
/* cpu_dnnl.c: UNSUPPORTED (without setting an error) when oneDNN has no
 * implementation for this shape and dtype on this CPU. */
lk_status lk__dnnl_gemm(const lk_op_desc *d, const void *A, const void *B, void *C);
/* Frees this thread's cached primitives, engine and stream (lk_thread_cleanup). */
void lk__dnnl_thread_cleanup(void);
/* Whether oneDNN has its own (not reference) code for a dt x dt -> f32
 * GEMM on this CPU (probed once per dtype). */
bool lk__dnnl_native(lk_dtype dt);
/* oneDNN's best instruction set on this CPU, e.g. "avx512_core_amx". */
const char *lk__dnnl_isa(void);
/* Whether oneDNN has its own code for a GEMM of ab x ab -> ct on this CPU:
 * 1 yes (its implementation's name into impl), 0 only its reference code,
 * -1 no CPU engine. For lk__cpu_gemm_path (cpu_lowp.c). */
int lk__dnnl_gemm_impl(lk_dtype ab, lk_dtype ct, char *impl, size_t size);
/* oneDNN's major version (2 or 3). */
int lk__dnnl_major(void);
/* Channels per block of oneDNN's f32 blocked layouts on this CPU: 16 where
 * it runs AVX-512 (nChw16c, OIhw16i16o), else 8 (nChw8c). */
int lk__dnnl_f32_block(void);
/* UNSUPPORTED (no error set) when oneDNN has no direct kernel for it here
 * (any_impl 1: its GEMM-based code is taken too; 2: its reference code
 * too, for tests of the bf16 plumbing on a CPU without bf16 units). */
lk_status lk__dnnl_conv(int kind, const lk__dnnl_conv_shape *s, int any_impl, const void *a, const void *b, void *c,
                        void *bias);
/* The implementation oneDNN runs for it ("jit:avx2"), NULL when none is taken. */
const char *lk__dnnl_conv_impl(int kind, const lk__dnnl_conv_shape *s, int any_impl);
#endif

/* src/backend/cpu/conv_path.c: which code runs conv2d on the CPU backend:
 * LK_CONV=auto (default) | onednn | im2col, read once; the setter is for
 * tests and bench ops. auto: oneDNN's direct (jit) kernels where it has
 * them for the shape and dtype (bf16 only where its bf16 GEMMs run on bf16
 * units, as cpu_lowp.c decides) and where they were measured faster (at
 * least 8 input channels per group, at least a block of oneDNN's layout of
 * output channels per group, kernel larger than 1x1), else im2col + GEMM; onednn: oneDNN's
 * GEMM-based code too; im2col: never oneDNN. lk__cpu_conv_dnnl runs one through
 * oneDNN, or answers UNSUPPORTED (no error set) for the caller's im2col. */
enum { LK__CONV_AUTO, LK__CONV_ONEDNN, LK__CONV_IM2COL };
int lk__cpu_conv_path(void);
void lk__cpu_conv_use(int path);
/* Tests only: LK_CONV=onednn also takes oneDNN's reference code, and bf16
 * without bf16 units (slow; checks the bf16 path's dtypes on any CPU). */
void lk__cpu_conv_allow_ref(bool on);
/* How many convolutions (per task and direction) oneDNN has run (tests). */
int64_t lk__cpu_conv_dnnl_runs(void);
lk_status lk__cpu_conv_dnnl(int kind, const lk__dnnl_conv_shape *s, const void *a, const void *b, void *c, void *bias);
/* The oneDNN implementation LK_CONV=onednn runs for it, NULL when none (for bench ops). */
const char *lk__cpu_conv_dnnl_impl(int kind, const lk__dnnl_conv_shape *s);

/* Intra-op parallelism over independent items (the samples of a
 * convolution), for when one process owns several cores. BLAS's own
 * threading splits each GEMM, which for the many small per-sample GEMMs of a
 * convolution costs more in wake-ups than it gains; giving each core whole
 * samples and single-threaded GEMMs does not.
 * lk__parallel_width: how many tasks to cut `items` into (1 when this
 * process has one compute thread, as under DP's replicas or one rank per
 * core). lk__parallel_run: fn(ctx, t) for t in [0, width), task 0 on the
 * calling thread and the others on a parked pool (parallel.c). A task must
 * not record autograd nodes, and a task that fails must hand its message
 * back itself (the last error is per thread); tasks the pool cannot take run
 * on the caller, so results depend on the width, never on how many threads
 * ran it. */
int lk__parallel_width(int64_t items);
#define LK__PARALLEL_MAX 64 /* the most tasks lk__parallel_run cuts a job into */
/* Task t's share [*begin, *end) of n items cut `width` ways; cuts fall on
 * multiples of `align` (a power of two; 16 keeps vector loops whole). */
static inline void lk__task_range(int64_t n, int t, int width, int64_t align, int64_t *begin, int64_t *end) {
    *begin = (n * t / width) & ~(align - 1);
    *end = t + 1 == width ? n : (n * (t + 1) / width) & ~(align - 1);
}
void lk__parallel_run(int width, void (*fn)(void *ctx, int task), void *ctx);
/* How many tasks a streaming pass over n elements (the optimizer's flat
 * update, the gradients' zeroing) is cut into: one below 64K elements, where
 * waking a thread costs more than it saves. The passes over one buffer share
 * it, so each thread touches the same range in each (the lines already in
 * its cache). */
#define LK__PARALLEL_STREAM_MIN (64 << 10)
static inline int lk__parallel_stream_width(int64_t n) {
    return n >= LK__PARALLEL_STREAM_MIN ? lk__parallel_width(n / LK__PARALLEL_STREAM_MIN + 1) : 1;
}
/* Wakes parked workers so that they spin for the next job: for a caller
 * that knows a parallel phase is near (the optimizer's step after the
 * gradients' checks) and has work of its own to do meanwhile. */
void lk__parallel_prewake(void);
/* The same tasks one after another on the calling thread, each seeing the
 * width a pool thread would (so the bits are lk__parallel_run's): for tasks
 * that issue ops to a device the host cannot address, whose queue must get
 * them in the same order every step (a CUDA graph replays that order) and
 * gains nothing from several host threads launching. */
void lk__parallel_run_ordered(int width, void (*fn)(void *ctx, int task), void *ctx);
/* Frees the calling thread's scratch of the CPU backend's bf16/f16 paths
 * (the widening's f32 arrays, bf16x3's split operands: src/backend/cpu/widen.c;
 * lk_thread_cleanup). */
void lk__cpu_widen_thread_cleanup(void);
extern const lk_backend lk__cpu_backend;

#endif

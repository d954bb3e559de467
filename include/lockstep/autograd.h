/* lockstep/autograd.h — differentiable ops and reverse-mode autograd.
 *
 * Ops record themselves on a per-thread tape when grad mode is on and an
 * input requires grad; lk_backward(loss) runs the nodes its loss reaches in
 * reverse order of recording and accumulates into the .grad of leaf tensors
 * (parameters). The moment a leaf's gradient is final for this pass its
 * grad hook fires — the DDP strategy starts bucket all-reduces from there,
 * while backward goes on.
 *
 * Many graphs: several forward graphs may be alive at once on one thread
 * (a pipeline's micro-batches), and their backwards may run in any order.
 * A backward frees the nodes it reached that no live node still consumes:
 * its own graph. A subgraph two graphs share (one trunk, two heads) stays
 * until the last of them has run its backward, and each backward runs it
 * with its own gradient, so every graph's gradients are bitwise what its
 * backward alone gives. Parameters are leaves, not nodes: sharing them
 * keeps nothing alive; each backward adds into their .grad. A backward may
 * run forwards and backwards inside it (a custom function's, activation
 * checkpointing's recompute): such a nested backward accumulates into
 * leaves but fires no grad hooks — the outermost pass fires them when it
 * is done with the leaf — and it stops at the nodes of the passes around
 * it.
 *
 * Every op returns a new tensor owned by the innermost lk_scope (or by the
 * caller when none is open), or NULL with the error set. A NULL input makes
 * an op return NULL at once and keeps the first error, so a chain of ops is
 * checked once at its end:
 *
 *     lk_scope_begin();
 *     lk_tensor *h = lk_relu(lk_linear(x, w1, b1));
 *     lk_tensor *loss = lk_mse_loss(lk_linear(h, w2, b2), y, LK_REDUCTION_MEAN);
 *     if (!loss || lk_backward(loss)) fprintf(stderr, "%s\n", lk_last_error());
 *     lk_scope_end();   // intermediates and the tape are released
 *
 * Ops compute in f32 on the CPU reference backend (element-wise ops also
 * take bf16/f16 tensors: widened, computed in f32, rounded once); other
 * dtypes get a clear UNSUPPORTED error naming the op and dtype.
 */
#ifndef LOCKSTEP_AUTOGRAD_H
#define LOCKSTEP_AUTOGRAD_H

#include "lockstep/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- scopes: who owns an op's result ----------------------------------------- */

/* Autorelease scopes (per thread, nestable). lk_scope_end releases the
 * tensors adopted inside and the tape nodes recorded inside (a tensor kept
 * past it loses its grad_fn). */
void lk_scope_begin(void);
void lk_scope_end(void);
/* Hands a tensor the caller owns to the innermost scope (returns it). */
lk_tensor *lk_scope_adopt(lk_tensor *t);
/* Ends the innermost scope without releasing anything: its tensors (*n
 * references, in adoption order, in an array the caller frees with
 * lk_free after releasing each) go to the caller, and the tape nodes
 * recorded inside stay alive, so the graph's backward can run later —
 * it frees those nodes, or the enclosing scope's end does. What a
 * pipeline stage does per micro-batch, whose graphs do not end in the
 * order they began (1F1B): each one's tensors are released after its own
 * backward. NULL with *n 0 when the scope adopted nothing. */
lk_tensor **lk_scope_end_keep(int *n);
/* Keeps a scope-owned tensor alive past the scope: the caller now owns a reference. */
#define lk_tensor_keep(t) lk_tensor_retain(t)

/* ---- views (share storage; carry autograd when the source requires grad) ---- */

lk_tensor *lk_reshape(lk_tensor *t, int ndim, const int64_t *shape); /* one dim may be -1 */
lk_tensor *lk_transpose(lk_tensor *t, int d0, int d1);
lk_tensor *lk_slice(lk_tensor *t, int dim, int64_t start, int64_t end); /* [start, end) */
lk_tensor *lk_contiguous(lk_tensor *t); /* t itself (retained into the scope) when already contiguous */

/* A view of raw storage range of `t` as a new contiguous shape, without
 * autograd (strategies use it to make gradients views of a bucket). */
lk_tensor *lk_tensor_view_storage(lk_tensor *base, int64_t offset_elems, int ndim, const int64_t *shape);

/* ---- grad mode and backward ------------------------------------------------ */

bool lk_grad_enabled(void);
/* Sets grad mode for this thread; returns the previous mode. */
bool lk_set_grad_enabled(bool on);
#define lk_no_grad_begin() lk_set_grad_enabled(false)

void lk_tensor_set_requires_grad(lk_tensor *t, bool on);
/* grad <- 0 (keeping its memory, e.g. a bucket view), or drops it (set_to_none). */
void lk_tensor_zero_grad(lk_tensor *t, bool set_to_none);
/* Fires once per backward pass when t's gradient is final (leaves only). A
 * leaf that the pass does not reach gets its hook with grad left as it was. */
void lk_tensor_set_grad_hook(lk_tensor *t, lk_grad_hook fn, void *ctx);

/* d(loss)/d(leaf) accumulated into every reachable leaf's .grad. `loss` must
 * hold one element. Afterwards the nodes it reached are released, except
 * those another live graph still consumes (see "Many graphs" above). */
lk_status lk_backward(lk_tensor *loss);
/* The same with an explicit output gradient (same shape as `out`). */
lk_status lk_backward_with(lk_tensor *out, lk_tensor *grad_out);
/* Frees this thread's tape, scope stack and node cache. A thread that ran
 * ops calls it before it exits (the main thread need not). */
void lk_thread_cleanup(void);
/* Drops the whole tape of this thread, every live graph (scope ends do this
 * for the nodes recorded inside them, whether or not a backward ran). */
void lk_tape_reset(void);
/* The number of live nodes on this thread's tape, all graphs together. */
size_t lk_tape_len(void);

/* Op timing for profilers (trainer.profiler: advanced, trace). While a hook
 * is set on a thread, every op that thread runs reports (name, forward or
 * backward, start, end) in lk_time_now() seconds. A backward node is timed
 * exactly; a forward op is timed from the end of the op before it (or the
 * last lk_op_hook_mark) to its own end, so the short gaps between ops count
 * to the op that follows and the spans tile the forward pass without
 * overlap. Ops that record no tape name report "other". Off, the cost is
 * one branch per op. fn NULL clears the hook; the hook also marks. */
typedef void (*lk_op_hook)(void *ctx, const char *op, bool backward, double t_start, double t_end);
void lk_set_op_hook(lk_op_hook fn, void *ctx);
void lk_op_hook_mark(void);

/* ---- custom functions ------------------------------------------------------------
 * torch.autograd.Function: a forward the tape does not look inside and the
 * backward that goes with it. The forward runs with grad mode off (what it
 * computes is not recorded) inside a scope of its own: its temporaries go
 * when it returns, its result becomes the output. One node is recorded for
 * the output when grad mode is on and an input requires grad; its backward
 * receives the output's gradient (contiguous, the output's shape and dtype)
 * and fills grad_in[i] (NULL: none) for the inputs it differentiates, each
 * of that input's shape; they are added into the inputs' gradients. The
 * backward runs with grad mode off inside a scope (results of ops are fine
 * as grad_in) and may turn grad mode on, run a forward and a nested
 * lk_backward (a recompute). Every tensor whose gradient the backward
 * produces, parameters included, must be an input: a nested backward fires
 * no grad hooks, and the input's place is where the outer pass fires them.
 *
 *     // y = x * w, saving both for backward
 *     static lk_tensor *mul_fwd(lk_function_ctx *c, int n, lk_tensor *const *in) {
 *         (void)n;
 *         if (lk_function_save(c, in[0]) || lk_function_save(c, in[1])) return NULL;
 *         return lk_mul(in[0], in[1]);
 *     }
 *     static lk_status mul_bwd(lk_function_ctx *c, lk_tensor *g, lk_tensor **grad_in) {
 *         lk_tensor *x = lk_function_saved(c, 0), *w = lk_function_saved(c, 1);
 *         if (lk_function_needs_grad(c, 0)) grad_in[0] = lk_mul(g, w);
 *         if (lk_function_needs_grad(c, 1)) grad_in[1] = lk_mul(g, x);
 *         return lk_last_status();
 *     }
 *     static const lk_function my_mul = {"my_mul", mul_fwd, mul_bwd, NULL};
 *     ...
 *     lk_tensor *y = lk_function_apply(&my_mul, 2, (lk_tensor *[]){x, w}, NULL);
 *
 * (tests/autograd/test_graphs.c runs this one, and a recompute.) */
typedef struct lk_function_ctx lk_function_ctx;
typedef struct lk_function {
    const char *name; /* in errors and the profiler's op table */
    /* The output, as an op returns it, or NULL with the error set. */
    lk_tensor *(*forward)(lk_function_ctx *ctx, int n_in, lk_tensor *const *in);
    /* LK_STATUS_OK, or the error (set with lk_error) that stops the backward. */
    lk_status (*backward)(lk_function_ctx *ctx, lk_tensor *grad_out, lk_tensor **grad_in);
    /* (optional) frees the state given to lk_function_apply */
    void (*destroy)(void *state);
} lk_function;
/* Runs fn on in[0..n_in) and returns its output as an op does (NULL with
 * the error set on failure; a NULL input keeps the first error). `state`
 * is the function's (lk_function_state), given to fn->destroy when the
 * node goes — after the backward, or at once when none is recorded or on
 * failure. fn must outlive the node. */
lk_tensor *lk_function_apply(const lk_function *fn, int n_in, lk_tensor *const *in, void *state);
/* Keeps t (a reference) for the backward: torch's save_for_backward. */
lk_status lk_function_save(lk_function_ctx *ctx, lk_tensor *t);
/* The i-th saved tensor (borrowed), or NULL. */
lk_tensor *lk_function_saved(const lk_function_ctx *ctx, int i);
void *lk_function_state(const lk_function_ctx *ctx);
/* Whether input i requires a gradient in this call (false when no node
 * was recorded). */
bool lk_function_needs_grad(const lk_function_ctx *ctx, int i);
/* A view of t's memory without its graph (requires_grad false): torch's
 * detach. */
lk_tensor *lk_detach(lk_tensor *t);

/* ---- autocast (mixed precision) ---------------------------------------------
 * Inside an autocast region of dtype LK_BF16 or LK_F16 (per thread,
 * nestable), as torch.autocast: matmul and linear (forward and backward)
 * multiply in that dtype on the CPU's bf16/f16 units, accumulating in f32,
 * and return bf16/f16 tensors (conv2d multiplies so too, output f32);
 * element-wise ops, activations and dropout keep their input's dtype;
 * softmax, losses, normalisation and reductions widen to f32. Gradients
 * have their tensor's dtype; the parameters are the f32 master weights with
 * f32 gradients. docs/PRECISION.md has the op table.
 * LK_F32 turns autocast off inside an enclosing region. */
void lk_autocast_enter(lk_dtype dt);
void lk_autocast_exit(void);
/* The dtype the low-precision list runs in on this thread (LK_F32: off). */
lk_dtype lk_autocast_dtype(void);
/* The kernels GEMMs of dt x dt -> f32 take on this machine, e.g.
 * "onednn brg:avx512_core_amx (cpu isa avx512_core_amx)" or "f32 fallback
 * (...)" (a static per-thread string). */
const char *lk_autocast_gemm_path(lk_dtype dt);
/* How f32 matrix products may run, as torch.set_float32_matmul_precision:
 * "highest" (the default: f32 multiplies, f32 sums), "high" or "medium"
 * (a GPU may multiply f32 GEMMs in TF32, a 10-bit mantissa, on its tensor
 * cores; the CPU's f32 GEMMs stay exact). Process-wide; INVALID_ARGUMENT
 * naming the accepted values for anything else. trainer's
 * float32_matmul_precision sets it for a run. */
lk_status lk_set_float32_matmul_precision(const char *precision);
const char *lk_float32_matmul_precision(void); /* "highest", "high" or "medium" */
/* Whether this CPU multiplies dt in hardware (bf16: AVX512-BF16 or AMX;
 * f16: AVX512-FP16 or AMX-FP16); "cpu: avx512_bf16 yes, ..." into buf. */
bool lk_cpu_native(lk_dtype dt);
const char *lk_cpu_lowp_features(char *buf, size_t size);

/* ---- linear algebra ---------------------------------------------------------- */

/* a[..., M, K] @ b[K, N] or batched a[B, M, K] @ b[B, K, N]. Transposed views
 * (lk_transpose of a contiguous matrix) go to BLAS as flags, not copies. */
lk_tensor *lk_matmul(lk_tensor *a, lk_tensor *b);
/* x[..., in] @ w[out, in]^T + b[out]; b may be NULL. */
lk_tensor *lk_linear(lk_tensor *x, lk_tensor *w, lk_tensor *b);

/* ---- element-wise (broadcasting like NumPy) ---------------------------------- */

lk_tensor *lk_add(lk_tensor *a, lk_tensor *b);
/* lk_relu(lk_add(a, b)) with the same bits (output and gradients), the
 * ReLU in the add's pass on the CPU (a residual block's end); elsewhere the
 * two ops. */
lk_tensor *lk_add_relu(lk_tensor *a, lk_tensor *b);
lk_tensor *lk_sub(lk_tensor *a, lk_tensor *b);
lk_tensor *lk_mul(lk_tensor *a, lk_tensor *b);
lk_tensor *lk_div(lk_tensor *a, lk_tensor *b);
lk_tensor *lk_add_scalar(lk_tensor *a, float s);
lk_tensor *lk_mul_scalar(lk_tensor *a, float s);
lk_tensor *lk_neg(lk_tensor *a);

typedef enum { LK_GELU_EXACT, LK_GELU_TANH } lk_gelu_approx;
lk_tensor *lk_relu(lk_tensor *x);
lk_tensor *lk_gelu(lk_tensor *x, lk_gelu_approx approx);
lk_tensor *lk_tanh(lk_tensor *x);
lk_tensor *lk_sigmoid(lk_tensor *x);
lk_tensor *lk_exp(lk_tensor *x);
lk_tensor *lk_log(lk_tensor *x);
lk_tensor *lk_sqrt(lk_tensor *x);
lk_tensor *lk_abs(lk_tensor *x);
lk_tensor *lk_leaky_relu(lk_tensor *x, float negative_slope);
lk_tensor *lk_elu(lk_tensor *x, float alpha);
lk_tensor *lk_silu(lk_tensor *x);

/* ---- reductions ----------------------------------------------------------------- */

/* Over `dims[0..ndims)` (negative dims count from the end); ndims == 0: all. */
lk_tensor *lk_sum(lk_tensor *x, const int *dims, int ndims, bool keepdim);
lk_tensor *lk_mean(lk_tensor *x, const int *dims, int ndims, bool keepdim);
lk_tensor *lk_softmax(lk_tensor *x, int dim);
lk_tensor *lk_log_softmax(lk_tensor *x, int dim);

/* ---- losses ----------------------------------------------------------------------- */

/* lk_reduction (MEAN, SUM, NONE) is declared in lockstep/tensor.h, below the backend. */

typedef struct lk_cross_entropy_opts {
    lk_reduction reduction;   /* default MEAN */
    float label_smoothing;    /* default 0 */
    int64_t ignore_index;     /* default -100 */
    lk_tensor *weight;        /* per-class weights [C] or NULL */
} lk_cross_entropy_opts;
lk_cross_entropy_opts lk_cross_entropy_opts_default(void);

/* logits [N, C] (or [N, C, d...]), target i64 [N] (or [N, d...]) class indices.
 * Fused log_softmax + nll; PyTorch's semantics for weights, ignore_index and
 * label smoothing. opts may be NULL (defaults). */
lk_tensor *lk_cross_entropy(lk_tensor *logits, lk_tensor *target, const lk_cross_entropy_opts *opts);
lk_tensor *lk_nll_loss(lk_tensor *log_probs, lk_tensor *target, const lk_cross_entropy_opts *opts);
lk_tensor *lk_mse_loss(lk_tensor *input, lk_tensor *target, lk_reduction reduction);
lk_tensor *lk_l1_loss(lk_tensor *input, lk_tensor *target, lk_reduction reduction);
lk_tensor *lk_smooth_l1_loss(lk_tensor *input, lk_tensor *target, lk_reduction reduction, float beta);
/* input holds probabilities in [0, 1]; weight may be NULL. */
lk_tensor *lk_binary_cross_entropy(lk_tensor *input, lk_tensor *target, lk_tensor *weight, lk_reduction reduction);
lk_tensor *lk_binary_cross_entropy_with_logits(lk_tensor *input, lk_tensor *target, lk_tensor *weight,
                                               lk_tensor *pos_weight, lk_reduction reduction);

/* ---- shape (differentiable; declared in tensor.h: lk_reshape, lk_transpose,
 *      lk_slice, lk_contiguous) ------------------------------------------------------ */

lk_tensor *lk_concat(lk_tensor *const *ts, int n, int dim);
lk_tensor *lk_flatten(lk_tensor *x, int start_dim, int end_dim);

/* ---- layers ----------------------------------------------------------------------- */

/* Inverted dropout: zeroes with probability p and scales the rest by 1/(1-p).
 * The mask comes from `rng` (keyed by seed and step by the caller), so it is
 * reproducible. Identity when !training or p == 0. */
lk_tensor *lk_dropout(lk_tensor *x, float p, bool training, lk_rng *rng);
/* Normalises over the last `normalized_ndim` dims; weight/bias of that shape or NULL. */
lk_tensor *lk_layer_norm(lk_tensor *x, int normalized_ndim, lk_tensor *weight, lk_tensor *bias, float eps);
/* weight [V, D], idx i64/i32 of any shape -> [..., D]. Out-of-range indices are an error. */
lk_tensor *lk_embedding(lk_tensor *weight, lk_tensor *idx);
/* Causal multi-head self-attention on GPT-2's packed projections: qkv
 * [B, T, 3C] holds q, k and v side by side, each [B, T, n_head, C/n_head];
 * y [B, T, C] is, per head, softmax(q k^T / sqrt(C/n_head) + causal mask) v
 * with the heads side by side again (ready for c_proj). dropout_p drops
 * attention probabilities when training (mask from rng, as lk_dropout).
 * _naive materialises the [B*n_head, T, T] scores from the elementary ops:
 * the reference the fused version is checked and measured against. */
lk_tensor *lk_causal_self_attention(lk_tensor *qkv, int n_head, float dropout_p, bool training, lk_rng *rng);
lk_tensor *lk_causal_self_attention_naive(lk_tensor *qkv, int n_head, float dropout_p, bool training, lk_rng *rng);

typedef struct lk_conv2d_params {
    int stride[2], padding[2], dilation[2], groups;
} lk_conv2d_params;
#define LK_CONV2D_DEFAULT ((lk_conv2d_params){{1, 1}, {0, 0}, {1, 1}, 1})
/* x [N, C, H, W], w [O, C/groups, kh, kw], b [O] or NULL. */
lk_tensor *lk_conv2d(lk_tensor *x, lk_tensor *w, lk_tensor *b, lk_conv2d_params p);

typedef struct lk_pool2d_params {
    int kernel[2], stride[2], padding[2];
    bool count_include_pad; /* avg_pool2d only; default true as in PyTorch */
    bool ceil_mode;         /* default false */
} lk_pool2d_params;
/* stride {0,0} means "= kernel", as in PyTorch. */
lk_tensor *lk_max_pool2d(lk_tensor *x, lk_pool2d_params p);
lk_tensor *lk_avg_pool2d(lk_tensor *x, lk_pool2d_params p);
lk_tensor *lk_adaptive_avg_pool2d(lk_tensor *x, int out_h, int out_w);

/* x [N, C] or [N, C, H, W]. Training: batch statistics, and the running ones
 * (if given) updated with `momentum` and the unbiased variance, as PyTorch
 * does. Eval: the running statistics. weight/bias [C] or NULL. */
lk_tensor *lk_batch_norm(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                         lk_tensor *bias, bool training, float momentum, float eps);
/* lk_relu(lk_batch_norm(...)) with the same bits (output and every
 * gradient), in one op on the CPU: the ReLU is applied in the pass that
 * writes the output and its mask inside the batch norm's backward, no
 * pass of its own over memory each way. Elsewhere, or with a 16-bit
 * weight, bias or running statistic, it runs the two ops. */
lk_tensor *lk_batch_norm_relu(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                              lk_tensor *bias, bool training, float momentum, float eps);
/* SyncBatchNorm: in training the statistics cover the batch of every rank.
 * `sum` adds vals[0..n) over all ranks in place (an all-reduce with sum;
 * every rank calls it the same number of times), once each way: forward
 * sums per channel the values and their squares with the sample count
 * (2C + 1 values; ranks may hold different batch sizes); backward sums per
 * channel the output gradient and its product with the centred input (2C),
 * as PyTorch's SyncBatchNorm does. Weight
 * and bias gradients stay this rank's (DDP averages them); the input
 * gradient is that of the sum of every rank's loss. `sum` NULL or eval mode:
 * lk_batch_norm. ctx is borrowed until the backward pass is done. */
typedef lk_status (*lk_sum_fn)(void *ctx, double *vals, int n);
/* SyncBatchNorm's all-reduce where the sums may stay in device memory
 * (lk_layer_sync_batchnorm_reducer; lk_comm_bn_reducer makes one over a
 * communicator): `sum` adds vals[0..n), n doubles in dev's memory, over all
 * ranks in place. With device_memory false (a communicator that reads host
 * memory only) it is only handed host memory (dev the CPU): the op copies
 * a device's sums out first. */
typedef struct lk_bn_reducer {
    lk_status (*sum)(void *ctx, lk_device dev, double *vals, int n);
    void *ctx;
    bool device_memory;
} lk_bn_reducer;
lk_tensor *lk_batch_norm_sync(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                              lk_tensor *bias, bool training, float momentum, float eps, lk_sum_fn sum, void *ctx);

#ifdef __cplusplus
}
#endif
#endif

/* Private to src/autograd: the tape node and the helpers every op file uses
 * to check arguments, record itself and accumulate gradients.
 *
 * How an op is written (see ops_elementwise.c):
 *   1. LK_OP_CHECK_INPUTS(a, b) — NULL in, NULL out (the first error stays);
 *   2. validate dtypes/shapes with lk__check_f32 (or lk__check_float for
 *      an op that runs 16-bit tensors: see the autocast policy below) and
 *      lk__error_shapes;
 *   3. compute the output with lk__tensor_new_on(<an input>->device, ...)
 *      and the backend kernels: results live on their inputs' device (as
 *      torch's), never on the default device, which only the public
 *      constructors use; an op with optional tensor arguments passes them
 *      all to lk__same_device;
 *   4. lk__record(...) attaches a node when grad mode is on and an input
 *      requires grad; save what backward needs in node->saved / node->a;
 *   5. return lk__op_result(out) — hands it to the current scope.
 * The backward function receives the gradient of the output (contiguous, the
 * output's shape and dtype: bf16/f16 for a 16-bit output under autocast) and
 * calls lk__accum(node->in[i], g) for each input that requires grad;
 * lk__accum takes its own reference and rounds g to the input's dtype. */
#ifndef LK_AUTOGRAD_IMPL_H
#define LK_AUTOGRAD_IMPL_H

#include "lockstep/autograd.h"
#include "tensor/tensor_impl.h"

#define LK_NODE_INLINE_IN 4

typedef void (*lk_backward_fn)(lk_node *n, lk_tensor *gout);

struct lk_node {
    const char *name;
    lk_backward_fn backward;
    int n_in;
    lk_tensor **in; /* strong references; points at in_inline or a heap array */
    lk_tensor *in_inline[LK_NODE_INLINE_IN];
    lk_tensor *saved[4]; /* strong references to what backward needs (or NULL) */
    lk_tensor *out;      /* strong reference; the tape breaks the cycle */
    lk_tensor *grad;     /* gradient of out accumulated so far (owned) */
    struct {
        float f[8];
        int64_t i[8];
    } a; /* op arguments */
    lk_rng rng;   /* ops that draw randomness replay it in backward */
    void *extra;  /* op-owned heap memory, lk_free'd with the node */
    /* (optional) frees what extra owns beyond its own block (a custom
     * function's saved tensors); called before extra is lk_free'd */
    void (*release)(lk_node *n);
    /* bookkeeping of the tape (autograd.c), not for ops */
    uint64_t seq;   /* creation order on this thread: backward runs nodes in decreasing seq */
    uint64_t visit; /* the pass that last collected it (a per-thread generation) */
    int consumers;  /* live nodes that take out as an input */
    int pass;       /* depth of the running backward that holds it, 0 when none */
};

/* Records a node for `out` if grad mode is on and any input requires grad;
 * returns NULL otherwise (not an error) — or on allocation failure, which
 * then also returns NULL with the error set (check lk__record_failed). */
lk_node *lk__record(const char *name, lk_backward_fn bw, lk_tensor *out, int n_in, lk_tensor *const *in);
bool lk__needs_grad(int n_in, lk_tensor *const *in);
/* Adds g (contiguous, t's shape or broadcastable to it) into t's gradient,
 * which has t's dtype: a gradient of another dtype is converted first (an f32
 * gradient of a bf16 activation is rounded once, as torch's cast backward). */
lk_status lk__accum(lk_tensor *t, lk_tensor *g);
/* The same, taking over the caller's reference to g (NULL: nothing): a
 * freshly computed gradient becomes the slot itself instead of a copy. */
lk_status lk__accum_move(lk_tensor *t, lk_tensor *g);
/* Sums g over broadcast dimensions down to `shape` (new caller-owned tensor,
 * or g retained when the shapes already match). */
lk_tensor *lk__reduce_to_shape(lk_tensor *g, int ndim, const int64_t *shape);
/* Gives `out` to the innermost scope and returns it. */
lk_tensor *lk__op_result(lk_tensor *out);
/* Caller-owned contiguous f32 copy of t (t retained when already contiguous f32). */
lk_tensor *lk__contig(lk_tensor *t);

lk_status lk__check_f32(const char *op, const lk_tensor *t, const char *arg);
/* f32, bf16 or f16: what the element-wise backend descriptors take. */
lk_status lk__check_float(const char *op, const lk_tensor *t, const char *arg);
/* Caller-owned contiguous copy of t in its own dtype (t retained when contiguous). */
lk_tensor *lk__contig_keep(lk_tensor *t);

/* SyncBatchNorm over a reducer (the nn layer's, lk_layer_sync_batchnorm_reducer):
 * lk_batch_norm_sync's semantics, one all-reduce per direction, on the
 * op's device buffer when r->device_memory (r borrowed until the backward
 * is done). r NULL or eval: lk_batch_norm. */
lk_tensor *lk__batch_norm_sync_reducer(lk_tensor *x, lk_tensor *running_mean, lk_tensor *running_var, lk_tensor *weight,
                                       lk_tensor *bias, bool training, float momentum, float eps, const lk_bn_reducer *r);
/* The mark a scope keeps: nodes recorded after it have seq >= it. */
uint64_t lk__tape_mark(void);
/* Releases the nodes recorded at or after `mark` (scope ends call it). */
void lk__tape_truncate(uint64_t mark);
/* The scope stack (scope.c; below the tape, which it knows nothing of):
 * push a frame remembering `mark`, pop the innermost one (releasing its
 * tensors) and return its mark. */
void lk__scope_push(uint64_t mark);
uint64_t lk__scope_top_mark(void);
void lk__scope_pop(void);
/* Pops the innermost frame, handing its tensors to the caller (lk_scope_end_keep). */
lk_tensor **lk__scope_pop_keep(int *n);

/* ---- the autocast policy ------------------------------------------------------
 * One table says which dtype each op family runs in (docs/PRECISION.md has
 * it per op), as torch.autocast's op lists do:
 *   LK_CAST_LOWER: the GEMMs (matmul, linear, conv2d) run in the region's
 *     16-bit dtype and return it;
 *   LK_CAST_FP32: softmax, log_softmax, the losses and reductions widen
 *     a 16-bit input to f32 and return f32;
 *   LK_CAST_SAME: everything else (element-wise, activations, dropout,
 *     pooling, batch/layer norm, embedding, concat: f32 statistics inside,
 *     views) runs in its input's dtype; a binary op of f32 and 16-bit inputs
 *     promotes to f32. */
typedef enum { LK_CAST_LOWER, LK_CAST_FP32, LK_CAST_SAME } lk_cast_family;
/* The dtype an op of this family computes and returns for inputs of dtype
 * `in` (for binary ops: lk__promote of both) on the calling thread. */
lk_dtype lk__autocast_dtype_for(lk_cast_family fam, lk_dtype in);
/* torch's type promotion among float dtypes: equal stays, mixed is f32. */
static inline lk_dtype lk__promote(lk_dtype a, lk_dtype b) { return a == b ? a : LK_F32; }
lk_status lk__error_shapes(const char *op, const char *what, const lk_tensor *a, const lk_tensor *b);
/* Broadcast shape of a and b into out_shape; error names both shapes. */
lk_status lk__broadcast_shape(const char *op, const lk_tensor *a, const lk_tensor *b, int *ndim, int64_t *shape);
int lk__norm_dim(int dim, int ndim);

/* Every tensor of an op on one device, or every one in memory the CPU can
 * address (host-addressable devices' memory is one memory to the CPU
 * kernels): INVALID_ARGUMENT naming the op, the two arguments (by position
 * among t[]) and their devices otherwise. NULL entries (optional arguments
 * left out) are skipped. The op's results go on its first tensor
 * argument's device. */
lk_status lk__same_device(const char *op, int n, lk_tensor *const *t);

/* The op's required inputs: none NULL (NULL in, NULL out: the first error
 * stays) and all on one device. */
#define LK_OP_CHECK_INPUTS(...)                                              \
    do {                                                                     \
        lk_tensor *lk__ins[] = {__VA_ARGS__};                                \
        for (size_t lk__i = 0; lk__i < sizeof lk__ins / sizeof *lk__ins; lk__i++) \
            if (!lk__ins[lk__i]) {                                           \
                if (!lk_last_status())                                       \
                    lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: input %zu is NULL", __func__, lk__i); \
                return NULL;                                                 \
            }                                                                \
        if (lk__same_device(__func__, (int)(sizeof lk__ins / sizeof *lk__ins), lk__ins)) return NULL; \
    } while (0)

#endif

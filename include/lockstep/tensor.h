/* lockstep/tensor.h — n-dimensional tensors: dtype, device, shape, strides,
 * refcounted storage, views, casts and printing.
 *
 * The struct is visible (as in ggml) so kernels and strategies can read
 * shape and data without a call per field; its fields are read-only to
 * users — change a tensor only through these functions.
 *
 * Lifetime. A tensor holds one reference to its storage; views share it.
 * Whoever creates a tensor owns one reference and drops it with
 * lk_tensor_release(). Results of ops created while an lk_scope is open
 * belong to that scope instead and are released when it ends, so model
 * code never frees intermediates:
 *
 *     lk_scope_begin();
 *     lk_tensor *y = lk_relu(lk_matmul(x, w));   // owned by the scope
 *     float v = lk_tensor_item(lk_sum(y, NULL, 0, false));
 *     lk_scope_end();                            // y and friends released
 *
 * Storage comes from a caching pool keyed by size, so a training step that
 * repeats the same shapes allocates nothing after its first run.
 */
#ifndef LOCKSTEP_TENSOR_H
#define LOCKSTEP_TENSOR_H

#include "lockstep/core.h"
#include "lockstep/device.h"
#include "lockstep/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif



/* LK_MAX_DIMS (the most dimensions a tensor has) is in lockstep/dtype.h. */

typedef struct lk_storage lk_storage; /* opaque: bytes + refcount + device */
typedef struct lk_node lk_node;       /* autograd: the op that produced a tensor */
typedef struct lk_tensor lk_tensor;

/* Called the moment a leaf's gradient for this backward pass is final. */
typedef void (*lk_grad_hook)(lk_tensor *param, void *ctx);

struct lk_tensor {
    lk_dtype dtype;
    lk_device device;
    int ndim;
    int64_t shape[LK_MAX_DIMS];
    int64_t stride[LK_MAX_DIMS]; /* in elements */
    int64_t offset;              /* in elements, from the storage base */
    int64_t numel;
    void *data; /* storage base + offset (host pointer on the CPU) */
    lk_storage *storage;
    int refcount;

    /* autograd */
    bool requires_grad;
    lk_tensor *grad;   /* accumulated gradient of a leaf, or NULL */
    lk_node *grad_fn;  /* op that produced this tensor; NULL for leaves */
    lk_grad_hook grad_hook;
    void *grad_hook_ctx;
    char *name; /* parameter name, or NULL */
    int lk__pending; /* internal: uses left in the running backward pass */
    /* internal: grad's contents are not a gradient yet (a sharded
     * strategy's reused buffer): the backward's first write overwrites
     * them instead of adding, which saves zeroing the buffer first */
    bool lk__grad_stale;
};

/* ---- creation ------------------------------------------------------------ */

/* Uninitialised contiguous tensor. Returns NULL with the error set on failure. */
lk_tensor *lk_tensor_empty(lk_dtype dt, int ndim, const int64_t *shape);
lk_tensor *lk_tensor_zeros(lk_dtype dt, int ndim, const int64_t *shape);
lk_tensor *lk_tensor_full(lk_dtype dt, int ndim, const int64_t *shape, double value);
/* Copies `data` (contiguous, dtype `dt`). */
lk_tensor *lk_tensor_from_data(lk_dtype dt, int ndim, const int64_t *shape, const void *data);
/* Wraps caller memory without copying; the memory must outlive the tensor. */
lk_tensor *lk_tensor_wrap(lk_dtype dt, int ndim, const int64_t *shape, void *data);
lk_tensor *lk_tensor_scalar(float v);
/* U(lo, hi) or N(mean, std) from the given RNG stream (f32 only). */
lk_tensor *lk_tensor_rand(lk_rng *rng, int ndim, const int64_t *shape, float lo, float hi);
lk_tensor *lk_tensor_randn(lk_rng *rng, int ndim, const int64_t *shape, float mean, float std);
/* Shape helper: LK_SHAPE(2, 3) -> 2, (int64_t[]){2, 3}. */
#define LK_SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

/* ---- lifetime -------------------------------------------------------------- */

lk_tensor *lk_tensor_retain(lk_tensor *t);
void lk_tensor_release(lk_tensor *t); /* NULL does nothing */


/* ---- inspection ------------------------------------------------------------- */

bool lk_tensor_is_contiguous(const lk_tensor *t);
bool lk_tensor_same_shape(const lk_tensor *a, const lk_tensor *b);
/* "[2, 3]" into buf; returns buf. */
char *lk_shape_str(const lk_tensor *t, char *buf, size_t n);
size_t lk_tensor_nbytes(const lk_tensor *t);
/* False for a tensor that holds no data on this process: a parameter of a
 * pipeline stage other than this rank's, whose storage the strategy gave
 * back (it keeps its name and shape; an op on it is refused, naming it).
 * lk_strategy_sync_model makes such a model whole again. */
bool lk_tensor_has_data(const lk_tensor *t);
/* f32 scalar value of a one-element tensor (any float dtype). */
float lk_tensor_item(const lk_tensor *t);
/* Element i (row-major logical index) as double, any dtype/strides. */
double lk_tensor_get(const lk_tensor *t, int64_t i);
/* Prints dtype, shape and (up to `max_elems`) values to stdout. */
void lk_tensor_print(const lk_tensor *t, const char *label, int max_elems);
lk_status lk_tensor_set_name(lk_tensor *t, const char *name);

/* ---- copies and casts ----------------------------------------------------- */

/* dst <- src (same shape; any dtypes, any strides; float casts round to nearest even). */
lk_status lk_tensor_copy(lk_tensor *dst, const lk_tensor *src);
lk_tensor *lk_tensor_cast(const lk_tensor *t, lk_dtype dt); /* new contiguous tensor on t's device, no autograd */
/* A contiguous copy on `dev` (the caller owns it; no autograd). */
lk_tensor *lk_tensor_to(const lk_tensor *t, lk_device dev);
/* Marks t's storage as a flat buffer that other tensors view (the one
 * lk_params_flatten makes): lk_tensor_zero_grad(set_to_none) callers zero a
 * gradient that lives in one instead of dropping it. The mark goes with the
 * storage. */
void lk_tensor_mark_flat_buffer(lk_tensor *t);
bool lk_tensor_in_flat_buffer(const lk_tensor *t);
lk_tensor *lk_tensor_clone(const lk_tensor *t);              /* new contiguous copy on t's device, no autograd */
lk_status lk_tensor_fill(lk_tensor *t, double value);

/* The 16-bit conversions (lk_f32_to_bf16, lk_f32_to_half_n, ...) and
 * lk_reduction (a loss's folding) are in lockstep/dtype.h. */

/* ---- compute threads -------------------------------------------------------
 * Threads the CPU backend (BLAS) may use in this process. The trainer sets
 * each rank's share of the CPUs the process may use (its affinity mask /
 * local ranks) so ranks do not oversubscribe the machine; the
 * LK_NUM_THREADS environment variable overrides it (and any count set
 * here), capped at that share with a warning: threads beyond the cores only
 * spin against each other. */
void lk_set_num_threads(int n);
int lk_get_num_threads(void);

/* ---- storage pool statistics ---------------------------------------------- */
typedef struct lk_pool_stats {
    uint64_t hits, misses; /* storage requests served from the cache / by malloc */
    size_t bytes_cached, bytes_live;
    size_t bytes_live_peak; /* the most bytes_live has been since the last lk_pool_reset_peak */
    uint64_t oom_releases;  /* times a device ran out of memory and got its cached blocks back before a retry */
} lk_pool_stats;
lk_pool_stats lk_pool_get_stats(void);
/* Starts a new peak at the bytes live now, and returns them: the trainer
 * brackets each step with it, so the peak less that base is what the step's
 * activations and temporaries took. */
size_t lk_pool_reset_peak(void);
void lk_pool_trim(void); /* returns cached storage to the system */

#ifdef __cplusplus
}
#endif
#endif

/* Private to the tensor and autograd layers: raw constructors that bypass
 * scopes, element addressing, and the tape hooks scopes call. */
#ifndef LK_TENSOR_IMPL_H
#define LK_TENSOR_IMPL_H

#include "lockstep/tensor.h"

/* New contiguous tensor on `dev`, owned by the caller (never adopted by a
 * scope). An op makes its results with these on its inputs' device (one
 * device, checked by lk__same_device), never on the default device, which
 * is only where the public constructors (lk_tensor_empty, _zeros, ...) put
 * new tensors. */
lk_tensor *lk__tensor_new_on(lk_device dev, lk_dtype dt, int ndim, const int64_t *shape);
lk_tensor *lk__tensor_zeros_on(lk_device dev, lk_dtype dt, int ndim, const int64_t *shape);
lk_tensor *lk__tensor_full_on(lk_device dev, lk_dtype dt, int ndim, const int64_t *shape, double value);
/* View of base's storage with the given geometry (stride NULL: contiguous);
 * caller owns it; no autograd. */
lk_tensor *lk__tensor_view(lk_tensor *base, int ndim, const int64_t *shape, const int64_t *stride, int64_t offset);
/* Gives t memory of its own: its values are copied into a fresh contiguous
 * storage, and every other view keeps the old one (a parameter leaving a
 * buffer that is going away). On failure t is unchanged. */
lk_status lk__tensor_own_storage(lk_tensor *t);
/* t becomes a contiguous view of base's storage at `offset` elements (its
 * values copied there first when copy_values), keeping its identity: the
 * layers' slots, tied weights and autograd's saved references stay valid.
 * A sharded strategy puts each parameter of a unit into the unit's buffer
 * this way. On failure t is unchanged. */
lk_status lk__tensor_rehome(lk_tensor *t, lk_tensor *base, int64_t offset, bool copy_values);
/* A tensor that wraps caller memory (lk__tensor_wrap_on) and is nobody
 * else's view: it wraps `data` from now on (same shape, no copy). A sharded
 * strategy moves a unit's gradient views between buffers this way.
 * Whether it can: lk__tensor_rebasable. */
bool lk__tensor_rebasable(const lk_tensor *t);
void lk__tensor_rebase(lk_tensor *t, void *data);
/* Moves t's values to `dev` in place: t gets fresh contiguous storage there
 * (other views keep the old storage); its gradient is left alone. On
 * failure t is unchanged. lk_layer_to's step per tensor. */
lk_status lk__tensor_move_to(lk_tensor *t, lk_device dev);
/* Storage given back: t keeps its header, dtype, device and shape (its
 * identity: the layers' slots, tied weights and names stay), its storage
 * and data become NULL, and `why` (which tensor, whose it is, what makes it
 * whole again) is kept for the error any later access gets
 * (lk__tensor_check_data: every op's inputs, views, copies). A pipeline
 * stage drops the other stages' parameters this way (a deferred tensor
 * dropped becomes another stage's: it keeps no fill value). Restoring gives
 * t new storage of its shape, zeroed (the caller fills it) or holding a
 * deferred tensor's fill value. Both are no-ops on a tensor already in that
 * state. */
lk_status lk__tensor_drop_storage(lk_tensor *t, const char *why);
lk_status lk__tensor_restore_storage(lk_tensor *t);
/* Deferred initialisation (lk_model_create_deferred): while on, this
 * thread's public constructors (lk_tensor_empty, _zeros, _full) make
 * tensors without storage, each keeping its fill value (lk_tensor_fill on
 * one sets it; lk_tensor_cast, _to and lk__tensor_move_to keep it), until
 * lk__tensor_restore_storage gives it storage holding that value. Returns
 * the previous setting. */
bool lk__tensor_defer(bool on);
/* True for a tensor made deferred and not restored or dropped since; its
 * fill value into *fill (may be NULL). */
bool lk__tensor_is_deferred(const lk_tensor *t, double *fill);
/* A tensor's storage taken off it for a while and put back: while hidden
 * it holds no data (lk_tensor_has_data false; an op on it is refused), so
 * lk_layer_materialize_some draws into nothing but the tensors it makes
 * now. Nothing is freed or copied. */
typedef struct lk__hidden {
    lk_storage *storage;
    void *data;
    int64_t offset;
    int64_t stride[LK_MAX_DIMS];
} lk__hidden;
void lk__tensor_hide(lk_tensor *t, lk__hidden *h);
void lk__tensor_unhide(lk_tensor *t, const lk__hidden *h);
/* INVALID_USAGE naming `what`, the tensor, its shape and why it has no
 * data, when t's storage was dropped; OK otherwise (and for NULL). */
lk_status lk__tensor_check_data(const lk_tensor *t, const char *what);
/* lk_tensor_wrap for memory on `dev` (a strategy's device buffer). */
lk_tensor *lk__tensor_wrap_on(lk_device dev, lk_dtype dt, int ndim, const int64_t *shape, void *data);
/* Scalar results of backend ops (a norm, a count, an index, a weight sum)
 * for the host to read: on a host-addressable device the caller's host
 * array itself (nothing copied); on another device a device array copied
 * back over it by lk__scalars_end (one copy out, however many ops wrote
 * into it). Outputs only: an element no op wrote comes back undefined, so
 * the caller reads only the ones its ops wrote. */
typedef struct lk__scalars {
    lk_tensor *dev; /* NULL on a host-addressable device */
    void *host;
    size_t elem;
} lk__scalars;
lk_status lk__scalars_begin(lk__scalars *s, lk_device dev, lk_dtype dt, int64_t n, void *host);
void *lk__scalars_at(const lk__scalars *s, int64_t i); /* the operand pointer for element i */
/* Copies the values back (when on a device) and releases the device array;
 * safe after a failed begin. */
lk_status lk__scalars_end(lk__scalars *s);
/* Storage offset (elements, from t->data) of logical element i. */
int64_t lk__elem_offset(const lk_tensor *t, int64_t i);
void *lk__storage_data(const lk_storage *s);
size_t lk__storage_cap(const lk_storage *s);
bool lk__scope_active(void);
/* Frees this thread's scope stack (lk_thread_cleanup). */
void lk__scope_thread_cleanup(void);

/* Host shadows: a device tensor made by copying host memory that stays
 * valid and unchanged while `owner` (the loader's batch) is current, so cross-entropy's target range check reads the host copy
 * instead of reading the device (a synchronisation on a GPU). Per thread; a
 * new owner drops the previous one's; the shadow holds a reference to dev,
 * so its address is not reused while registered. Only a thread that turned
 * them on keeps any (the trainer's, for a run on a device: not dp's replica
 * threads, which would keep references past their end). Set by
 * lk_batch_tensor, cleared after each training step; off (and cleared) at
 * the end of a run. */
void lk__host_shadows_on(bool on);
void lk__host_shadow_set(lk_tensor *dev, const void *host, const void *owner, int field);
void lk__host_shadow_clear(void);
/* A host tensor over t's shadow (wrapping it, no copy; caller releases), or
 * NULL when t (all of it, contiguous) is not a registered device tensor:
 * cross-entropy's target range check. */
lk_tensor *lk__tensor_host_shadow(const lk_tensor *t);

#endif

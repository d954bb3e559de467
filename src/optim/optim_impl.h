/* Private to src/optim: what the schedulers need from the optimizer
 * (PyTorch keeps these as extra keys of each param_group). */
#ifndef LK_OPTIM_IMPL_H
#define LK_OPTIM_IMPL_H

#include "lockstep/optim.h"

/* group['initial_lr']: NAN until a scheduler sets it. */
double lk__optimizer_initial_lr(const lk_optimizer *o, int group);
void lk__optimizer_set_initial_lr(lk_optimizer *o, int group, double lr);
/* Tells the optimizer its step is near: the compute threads it will cut the
 * update across are woken now, so that they are spinning by the time it
 * posts the work instead of parked (on a 2-core KVM Xeon a parked worker took
 * long enough to wake that a 2-thread AdamW over the mlp's 235K parameters
 * was no faster than one thread: 0.19 ms). The trainer calls it before the
 * gradients' checks, which then overlap the wake-up. */
void lk__optimizer_prewake(const lk_optimizer *o);

/* The sharded update behind DDP's shared parameters (lk_strategy): the
 * parameters of the one group lie back to back in memory several processes
 * share, and so does the state, in `state` (lk__optimizer_state_floats of
 * them; -1: more than one group). This process then updates only elements
 * [lo, hi) of the group, and only the `owner` copies its state in now or
 * writes it when a checkpoint is loaded (the others read the same bytes).
 * Steps and hyperparameters stay per process, identical on every rank. */
int64_t lk__optimizer_state_floats(const lk_optimizer *o);
lk_status lk__optimizer_shard(lk_optimizer *o, int64_t lo, int64_t hi, float *state, bool owner);
/* After lk__optimizer_shard: the state now lives in `state` (borrowed; the
 * caller moved the values), element i of array k at state[k * stride + i -
 * base], which must cover [lo, hi). ZeRO keeps only its chunk this way
 * (base lo, stride the chunk's length) and switches to a whole copy
 * (0, numel) around a checkpoint; state_get and state_load refuse a chunk. */
lk_status lk__optimizer_state_layout(lk_optimizer *o, float *state, int64_t base, int64_t stride);
/* ZeRO's shard in one call, never holding the whole state twice: this
 * process updates [lo, hi) and keeps only that range of each state array, in
 * `chunk` (borrowed; n_state arrays of `stride` >= hi - lo floats), copied
 * from the group's own state, which is then freed, or zero when it was
 * deferred. As lk__optimizer_shard (owner) + lk__optimizer_state_layout
 * (lo, stride). On failure nothing changed. */
lk_status lk__optimizer_shard_chunk(lk_optimizer *o, int64_t lo, int64_t hi, float *chunk, int64_t stride);
/* While set (on this thread), optimizers created get no state memory: the
 * replicated state a ZeRO rank must never hold whole, not even for the
 * moment before lk__optimizer_shard_chunk. Such an optimizer must be sharded
 * that way before anything else. Returns the previous setting. */
bool lk__optimizer_defer_state(bool defer);

/* Sharded checkpoints (src/train/ckpt_shards.c): the state without its
 * per-element arrays (arrays false: hyperparameters and steps only, which
 * every rank holds whole even when a ZeRO strategy keeps a chunk of the
 * arrays), and the arrays' count and names ("exp_avg", ...) in the order
 * the state memory holds them. */
lk_status lk__optimizer_state_get_ex(const lk_optimizer *o, lk_named_tensors *out, bool arrays);
int lk__optimizer_state_arrays(const lk_optimizer *o);
/* Array k of the state of group 0's parameter p (its numel floats), where
 * the state lives now; NULL when p is not in group 0 or k is out of range. */
float *lk__optimizer_state_of(const lk_optimizer *o, const lk_tensor *p, int k);
const char *lk__optimizer_state_array_name(const lk_optimizer *o, int k);

/* lk_grad_scaler_unscale without the read, for a caller that reads the
 * counts with more (the trainer's one read per step): checks the gradients
 * and queues each one's unscale, its non-finite count into counts[i] (an
 * i64 per parameter on the gradients' device, written only for those with
 * a gradient), and marks the scaler unscaled. Nothing is queued on an error
 * (every gradient is checked first) or when the scaler is disabled. */
lk_status lk__grad_scaler_unscale_into(lk_grad_scaler *s, const lk_named_tensors *params, void *counts);

#endif

/* Private to src/train: the batch prefetch onto a training device the CPU
 * cannot read (prefetch.c says how it orders its copies). The fit loop
 * takes its batches through lk__prefetch_next instead of lk_loader_next;
 * lk_batch_tensor asks lk__prefetch_tensor for the staged copy first. */
#ifndef LK_TRAIN_PREFETCH_H
#define LK_TRAIN_PREFETCH_H

#include "lockstep/data.h"
#include "lockstep/device.h"
#include "lockstep/tensor.h"

typedef struct lk__prefetch lk__prefetch;

/* A prefetcher for device d (its copy stream, if the kind has one). */
lk_status lk__prefetch_create(lk_device d, lk__prefetch **out);
/* dp's: one for n devices (a copy stream each), batch b's rows cut as dp
 * cuts them (lk_strategy_dp_slice): replica k's slice goes to devs[k]. */
lk_status lk__prefetch_create_split(const lk_device *devs, int n, lk__prefetch **out);
/* Ends a pass left open (lk__prefetch_end) and frees; NULL does nothing. */
void lk__prefetch_free(lk__prefetch *p);
/* Starts a pass over `loader`, already started, of at most n batches: the
 * loader must hold 2 batches (lk_loader_config.hold >= 2), since batch i + 1
 * is taken while step i may still be reading batch i. */
lk_status lk__prefetch_begin(lk__prefetch *p, lk_loader *loader, int64_t n);
/* Batch i (already being copied onto the device), after starting batch
 * i + 1's copies; *out = NULL after n batches or at the loader's end. A
 * loader error on batch i + 1 is returned here at batch i + 1, not before. */
lk_status lk__prefetch_next(lk__prefetch *p, const lk_batch **out);
/* Waits for every copy still in flight and drops the staged tensors, so the
 * loader may be started again or freed; returns the first device error. */
lk_status lk__prefetch_end(lk__prefetch *p);
/* Field `field` of the current batch b on device d, staged: a new
 * reference (*out), after making the default stream wait for its copy; *out
 * = NULL when b is not a batch being prefetched onto d on this thread. b
 * may be the loader's batch or a view of some of its rows (dp's slice):
 * what is matched is the field's host rows. */
lk_status lk__prefetch_tensor(const lk_batch *b, int field, lk_device d, lk_tensor **out);
/* Makes p's current batch visible to lk__prefetch_tensor on the calling
 * thread too, until lk__prefetch_leave (dp's replica threads, around their
 * forward, while the thread that took the batch waits for them). */
lk_status lk__prefetch_enter(lk__prefetch *p);
void lk__prefetch_leave(lk__prefetch *p);

#endif

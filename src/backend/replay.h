/* Private: the training step replayed as a graph (issue 21; replay.c). Inside
 * a step that a strategy opens (lk__replay_step_begin) on a device that can
 * capture graphs, the backend dispatch and the device layer's memsets and
 * copies within defer their work into a segment instead of issuing it; the
 * segment is issued at the next point where the host needs the device (a
 * read, a copy from the host, a synchronize, an event, a free, the step's
 * end): as a cached graph's launch when the same segment was captured
 * before, captured now when it was seen once before, eagerly otherwise.
 * Results are those of eager execution, bit for bit. The hooks below are
 * called by src/backend/registry.c and, through the interceptor slot that
 * replay.c fills at load (device/graph.h), by src/device/device.c; each is
 * one relaxed load when no step is open. */
#ifndef LK_BACKEND_REPLAY_H
#define LK_BACKEND_REPLAY_H

#include "backend/backend_impl.h"
#include "device/graph.h"
#include "lockstep/device.h"

/* Counters since the process started (tests and bench read them). */
typedef struct lk__replay_stats {
    int64_t steps;          /* steps opened with the layer on */
    int64_t deferred;       /* ops, memsets and copies put into a segment */
    int64_t segments_eager; /* segments issued item by item */
    int64_t eager_items;    /* items those segments issued */
    int64_t captures;       /* graphs captured */
    int64_t launches;       /* graph launches */
    int64_t capture_failures; /* captures the device refused: the segment ran eagerly */
    int64_t mismatches;     /* eager segments whose ops and operands equal one seen before, but a value no live slot carries differs */
    int64_t passthrough;    /* ops issued at the call inside a step (host operand, another device or thread) */
    int64_t drops;          /* times the cached graphs were all dropped (a free of device memory, a new device) */
    int64_t cached;         /* graphs cached now */
} lk__replay_stats;

/* Any step open right now (a relaxed read: the hooks' fast path) is the
 * device layer's lk__device_intercept_open (device/graph.h): replay.c sets
 * it, the device layer and registry.c read it. */

/* Opens a step on dev for the calling thread when dev can capture graphs
 * and LK_GRAPHS is not 0 (else nothing happens). A step still open is
 * ended first. */
lk_status lk__replay_step_begin(lk_device dev);
/* Issues what is deferred and closes the step (nothing open: OK). */
lk_status lk__replay_step_end(void);

/* The hooks. *taken says the call was deferred (its status is then OK);
 * otherwise the caller issues the work itself, as without the layer. */
lk_status lk__replay_op(lk_device dev, const lk_backend *be, const lk_op_desc *d, void *const *x, bool *taken);
lk_status lk__replay_memset(lk_device dev, void *ptr, int value, size_t bytes, bool *taken);
lk_status lk__replay_copy(lk_device dev, void *dst, const void *src, size_t bytes, bool *taken);
/* The host is about to need dev (a read, a copy from the host, a
 * synchronize, an event): what is deferred for it is issued now. */
lk_status lk__replay_sync(lk_device dev);
/* Device memory from lk_device_alloc of a kind that can capture (an op
 * whose operand is none of it has a host operand: never deferred). */
void lk__replay_note_alloc(lk_device dev, void *ptr, size_t bytes);
/* Before the device frees ptr: issues what is deferred and drops every
 * cached graph of dev (they hold raw pointers). */
void lk__replay_note_free(lk_device dev, void *ptr, size_t bytes);

lk__replay_stats lk__replay_get_stats(void);

#endif

/* The batch prefetch onto a training device the CPU cannot read (cuda, the
 * tests' sealed devices): while step i computes, batch i + 1 is already
 * taken from the loader and its fields are being copied onto the device on
 * a copy stream, so the step finds its batch there instead of waiting for
 * a synchronous copy. It lives in train, not data: the layer order would
 * let the loader call the device layer, but the loader stays about host
 * buffers and order (it gets an allocator, the pinned one, and a hold of
 * two batches from the trainer), and the hand-off to the device is the
 * trainer's, as lk_batch_tensor is.
 *
 * Ordering, with S the default stream every op runs on (stream NULL; cuda:
 * the GPU's compute stream) and C this prefetcher's copy stream (cuda:
 * non-blocking, so the runtime orders nothing between S and C by itself):
 *  1. Before batch i + 1's copies, an event recorded on S is waited for on
 *     C: the device blocks the copies write come from the tensor pool and
 *     may have been freed by step i - 1 whose kernels are still queued on S.
 *  2. After the copies, an event `ready` is recorded on C; the first
 *     lk_batch_tensor of step i + 1 makes S wait for it, so no op reads the
 *     batch before it arrived.
 *  3. The copies read the loader's host memory until `ready` completes: the
 *     loader holds two batches (hold = 2), and batch i - 1's slot is
 *     released only by the lk_loader_next that takes batch i + 1, after
 *     this file waited on the host for batch i - 1's `ready` (long done:
 *     its copies were queued two steps before).
 *  4. Staged tensors are released only after their `ready` completed, so
 *     the pool never hands a block out with a copy still writing it.
 * Without a copy stream (a kind without streams/events/async copies, or
 * when none could be made) every copy is synchronous at the time it is
 * issued and the events are NULL: the same order, no overlap.
 * Under dp a prefetcher spans the replicas' devices: device k gets the
 * rows dp gives replica k (lk_strategy_dp_slice) on its own copy stream,
 * and points 1, 2 and 4 hold per device (point 2 on replica k's thread,
 * which sees the pass through lk__prefetch_enter while the thread that
 * took the batch waits for the replicas). */
#include <stdio.h>
#include <string.h>

#include "lockstep/strategy.h"
#include "tensor/tensor_impl.h"
#include "train/prefetch.h"

/* Device k's share of a staged batch: rows [start, start + rows) of every
 * field (dp's slice for replica k; the whole batch with one device). */
typedef struct {
    int64_t start, rows;
    lk_tensor *field[LK_DATA_MAX_FIELDS]; /* the fields' rows on the device */
    lk_event *ready;                      /* on the copy stream after the copies (NULL: they were synchronous) */
    bool waited;                          /* the default stream waits for `ready` already (touched only by
                                           * the thread running device k's step: dp's replica thread) */
} part;

typedef struct {
    const lk_batch *batch; /* the loader's, in its host memory; NULL: empty */
    part *part;            /* [n], one per device */
    lk_status err;         /* taking or staging this batch failed: returned at its turn */
    char msg[1024];
} staged;

struct lk__prefetch {
    int n;              /* devices: 1, or dp's replicas */
    lk_device *dev;     /* [n] */
    lk_stream **stream; /* [n]; NULL: synchronous copies */
    lk_loader *loader;  /* NULL: no pass open */
    int64_t left;       /* batches still to take from the loader in this pass */
    staged cur, next;
};

/* The passes open on this thread (and, for their forward, on dp's replica
 * threads: lk__prefetch_enter): lk_batch_tensor has only the batch to go
 * by. Two, for a validation pass inside a fit pass. */
enum { MAX_ACTIVE = 2 };
static _Thread_local lk__prefetch *active[MAX_ACTIVE];

lk_status lk__prefetch_create(lk_device d, lk__prefetch **out) { return lk__prefetch_create_split(&d, 1, out); }

lk_status lk__prefetch_create_split(const lk_device *devs, int n, lk__prefetch **out) {
    *out = NULL;
    if (n < 1) return lk_error(LK_STATUS_INTERNAL, "prefetch: %d devices", n);
    lk__prefetch *p = lk_calloc(1, sizeof *p);
    if (!p) return LK_STATUS_OUT_OF_MEMORY;
    p->n = n;
    p->dev = lk_calloc((size_t)n, sizeof *p->dev);
    p->stream = lk_calloc((size_t)n, sizeof *p->stream);
    p->cur.part = lk_calloc((size_t)n, sizeof *p->cur.part);
    p->next.part = lk_calloc((size_t)n, sizeof *p->next.part);
    lk_status st = p->dev && p->stream && p->cur.part && p->next.part ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    for (int k = 0; k < n && !st; k++) {
        p->dev[k] = devs[k];
        st = lk_device_stream_create(devs[k], &p->stream[k]);
    }
    if (st) {
        lk__prefetch_free(p);
        return st;
    }
    *out = p;
    return LK_STATUS_OK;
}

void lk__prefetch_free(lk__prefetch *p) {
    if (!p) return;
    if (p->cur.part && p->next.part) lk__prefetch_end(p);
    for (int k = 0; p->stream && k < p->n; k++) lk_device_stream_free(p->dev[k], p->stream[k]);
    lk_free(p->stream);
    lk_free(p->dev);
    lk_free(p->cur.part);
    lk_free(p->next.part);
    lk_free(p);
}

/* Waits for s's copies, then drops them; s is empty afterwards. */
static lk_status retire(lk__prefetch *p, staged *s) {
    lk_status st = LK_STATUS_OK;
    for (int k = 0; k < p->n; k++) {
        part *q = &s->part[k];
        bool queued = p->stream[k] && !q->ready && q->field[0]; /* staging failed between its copies and its event */
        lk_status e = queued ? lk_device_synchronize(p->dev[k]) : lk_device_event_synchronize(p->dev[k], q->ready);
        st = st ? st : e;
        lk_device_event_free(p->dev[k], q->ready);
        for (int f = 0; f < LK_DATA_MAX_FIELDS; f++) lk_tensor_release(q->field[f]);
        memset(q, 0, sizeof *q);
    }
    part *keep = s->part;
    memset(s, 0, sizeof *s);
    s->part = keep;
    return st;
}

/* The message without the "[rank R] " lk_error prepends, since lk_error
 * adds it again when the error is returned. */
static void keep_error(staged *s, lk_status st) {
    const char *m = lk_last_error();
    if (!strncmp(m, "[rank ", 6) && strstr(m, "] ")) m = strstr(m, "] ") + 2;
    s->err = st;
    snprintf(s->msg, sizeof s->msg, "%s", m);
}

/* Bytes of one row of a field. */
static int64_t row_bytes(const lk_array *a) {
    int64_t row = (int64_t)lk_dtype_size(a->dtype);
    for (int d = 1; d < a->ndim; d++) row *= a->shape[d];
    return row;
}

/* Queues b's fields onto the devices, device k's share of the rows onto
 * device k (ordering points 1 and 2 above, per device). */
static lk_status stage(lk__prefetch *p, staged *s, const lk_batch *b) {
    s->batch = b;
    for (int k = 0; k < p->n; k++) {
        part *q = &s->part[k];
        lk_device dev = p->dev[k];
        lk_stream *cs = p->stream[k];
        if (p->n == 1) q->start = 0, q->rows = b->size;
        else lk_strategy_dp_slice(b->size, p->n, k, &q->start, &q->rows);
        if (q->rows <= 0) continue; /* a replica without rows: nothing to copy */
        if (cs) {
            lk_event *freed = NULL;
            LK_TRY(lk_device_event_record(dev, NULL, &freed));
            lk_status st = lk_device_event_wait(dev, cs, freed);
            lk_device_event_free(dev, freed); /* the wait holds what it needs */
            LK_TRY(st);
        }
        for (int f = 0; f < b->nfields; f++) {
            const lk_array *a = &b->field[f];
            int64_t shape[LK_MAX_DIMS];
            memcpy(shape, a->shape, (size_t)a->ndim * sizeof *shape);
            if (a->ndim > 0) shape[0] = q->rows;
            lk_tensor *t = q->field[f] = lk__tensor_new_on(dev, a->dtype, a->ndim, shape);
            if (!t) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
            const char *src = (const char *)a->data + (a->ndim > 0 ? q->start * row_bytes(a) : 0);
            LK_TRY(lk_device_copy_async(dev, cs, t->data, src, lk_tensor_nbytes(t)));
        }
        if (cs) LK_TRY(lk_device_event_record(dev, cs, &q->ready));
    }
    return LK_STATUS_OK;
}

/* Takes the next batch from the loader into s and starts its copies; a
 * failure is kept in s for its turn, and ends the pass's taking. */
static void take(lk__prefetch *p, staged *s) {
    const lk_batch *b = NULL;
    p->left--;
    lk_status st = lk_loader_next(p->loader, &b);
    if (!st && b) st = stage(p, s, b);
    if (st) {
        keep_error(s, st);
        s->batch = NULL;
        p->left = 0;
    } else if (!b) {
        p->left = 0; /* the loader's epoch ended */
    }
}

lk_status lk__prefetch_begin(lk__prefetch *p, lk_loader *loader, int64_t n) {
    LK_TRY(lk__prefetch_end(p));
    int slot = -1;
    for (int k = 0; k < MAX_ACTIVE && slot < 0; k++)
        if (!active[k]) slot = k;
    if (slot < 0)
        return lk_error(LK_STATUS_INTERNAL, "prefetch: %d passes are open on this thread already", MAX_ACTIVE);
    active[slot] = p;
    p->loader = loader;
    p->left = n > 0 ? n : 0;
    return LK_STATUS_OK;
}

lk_status lk__prefetch_next(lk__prefetch *p, const lk_batch **out) {
    *out = NULL;
    if (!p->loader) return lk_error(LK_STATUS_INVALID_USAGE, "prefetch: next batch without lk__prefetch_begin");
    /* step i - 1 is over: its copies have long completed (point 3), and
     * its slot in the loader may go with the next lk_loader_next */
    LK_TRY(retire(p, &p->cur));
    if (!p->next.batch && !p->next.err) { /* the pass's first batch: nothing staged yet */
        if (p->left <= 0) return LK_STATUS_OK;
        take(p, &p->next);
    }
    staged emptied = p->cur; /* retired: its parts are zero */
    p->cur = p->next;
    p->next = emptied;
    if (p->cur.err) {
        lk_status st = p->cur.err;
        p->cur.err = 0;
        return lk_error(st, "%s", p->cur.msg);
    }
    if (!p->cur.batch) return LK_STATUS_OK;
    if (p->left > 0) take(p, &p->next); /* batch i + 1's copies overlap step i */
    *out = p->cur.batch;
    return LK_STATUS_OK;
}

lk_status lk__prefetch_end(lk__prefetch *p) {
    if (!p) return LK_STATUS_OK;
    lk_status st = retire(p, &p->cur), st2 = retire(p, &p->next);
    for (int k = 0; k < MAX_ACTIVE; k++)
        if (active[k] == p) active[k] = NULL;
    p->loader = NULL;
    p->left = 0;
    return st ? st : st2;
}

lk_status lk__prefetch_enter(lk__prefetch *p) {
    for (int k = 0; k < MAX_ACTIVE; k++)
        if (active[k] == p) return LK_STATUS_OK;
    for (int k = 0; k < MAX_ACTIVE; k++)
        if (!active[k]) {
            active[k] = p;
            return LK_STATUS_OK;
        }
    return lk_error(LK_STATUS_INTERNAL, "prefetch: %d passes are open on this thread already", MAX_ACTIVE);
}

void lk__prefetch_leave(lk__prefetch *p) {
    if (!p) return;
    for (int k = 0; k < MAX_ACTIVE; k++)
        if (active[k] == p) active[k] = NULL;
}

/* Whether field `field` of b is exactly what part q of the current batch
 * holds: the same host rows (dp's slice is a view of the loader's batch). */
static bool holds(const lk__prefetch *p, const part *q, const lk_batch *b, int field) {
    const lk_batch *cb = p->cur.batch;
    if (field >= cb->nfields || !q->field[field]) return false;
    const lk_array *a = &b->field[field], *c = &cb->field[field];
    const char *src = (const char *)c->data + (c->ndim > 0 ? q->start * row_bytes(c) : 0);
    if (a->data != src || a->dtype != c->dtype || a->ndim != c->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != (d ? c->shape[d] : q->rows)) return false;
    return true;
}

lk_status lk__prefetch_tensor(const lk_batch *b, int field, lk_device d, lk_tensor **out) {
    *out = NULL;
    if (field < 0 || field >= b->nfields) return LK_STATUS_OK;
    for (int k = 0; k < MAX_ACTIVE; k++) {
        lk__prefetch *p = active[k];
        if (!p || !p->cur.batch) continue;
        for (int j = 0; j < p->n; j++) {
            part *q = &p->cur.part[j];
            if (!lk_device_equal(p->dev[j], d) || !holds(p, q, b, field)) continue;
            if (!q->waited) { /* ordering point 2: once per batch and device, at its first use */
                LK_TRY(lk_device_event_wait(p->dev[j], NULL, q->ready));
                q->waited = true;
            }
            *out = lk_tensor_retain(q->field[field]);
            return LK_STATUS_OK;
        }
    }
    return LK_STATUS_OK;
}

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
 * issued and the events are NULL: the same order, no overlap. */
#include <stdio.h>
#include <string.h>

#include "tensor/tensor_impl.h"
#include "train/prefetch.h"

typedef struct {
    const lk_batch *batch;                 /* the loader's, in its host memory; NULL: empty */
    lk_tensor *field[LK_DATA_MAX_FIELDS];  /* the fields on the device */
    lk_event *ready;                       /* on the copy stream after the copies (NULL: they were synchronous) */
    bool waited;                           /* the default stream waits for `ready` already */
    lk_status err;                         /* taking or staging this batch failed: returned at its turn */
    char msg[1024];
} staged;

struct lk__prefetch {
    lk_device dev;
    lk_stream *stream; /* NULL: synchronous copies */
    lk_loader *loader; /* NULL: no pass open */
    int64_t left;      /* batches still to take from the loader in this pass */
    staged cur, next;
};

/* The passes open on this thread: lk_batch_tensor has only the batch to go
 * by. Two, for a validation pass inside a fit pass. */
enum { MAX_ACTIVE = 2 };
static _Thread_local lk__prefetch *active[MAX_ACTIVE];

lk_status lk__prefetch_create(lk_device d, lk__prefetch **out) {
    *out = NULL;
    lk__prefetch *p = lk_calloc(1, sizeof *p);
    if (!p) return LK_STATUS_OUT_OF_MEMORY;
    p->dev = d;
    lk_status st = lk_device_stream_create(d, &p->stream);
    if (st) {
        lk_free(p);
        return st;
    }
    *out = p;
    return LK_STATUS_OK;
}

void lk__prefetch_free(lk__prefetch *p) {
    if (!p) return;
    lk__prefetch_end(p);
    lk_device_stream_free(p->dev, p->stream);
    lk_free(p);
}

/* Waits for s's copies, then drops them; s is empty afterwards. */
static lk_status retire(lk__prefetch *p, staged *s) {
    bool queued = p->stream && !s->ready && s->field[0]; /* staging failed between its copies and its event */
    lk_status st = queued ? lk_device_synchronize(p->dev) : lk_device_event_synchronize(p->dev, s->ready);
    lk_device_event_free(p->dev, s->ready);
    for (int f = 0; f < LK_DATA_MAX_FIELDS; f++) lk_tensor_release(s->field[f]);
    memset(s, 0, sizeof *s);
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

/* Queues b's fields onto the device (ordering points 1 and 2 above). */
static lk_status stage(lk__prefetch *p, staged *s, const lk_batch *b) {
    s->batch = b;
    if (p->stream) {
        lk_event *freed = NULL;
        LK_TRY(lk_device_event_record(p->dev, NULL, &freed));
        lk_status st = lk_device_event_wait(p->dev, p->stream, freed);
        lk_device_event_free(p->dev, freed); /* the wait holds what it needs */
        LK_TRY(st);
    }
    for (int f = 0; f < b->nfields; f++) {
        const lk_array *a = &b->field[f];
        lk_tensor *t = s->field[f] = lk__tensor_new_on(p->dev, a->dtype, a->ndim, a->shape);
        if (!t) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
        LK_TRY(lk_device_copy_async(p->dev, p->stream, t->data, a->data, lk_tensor_nbytes(t)));
    }
    return p->stream ? lk_device_event_record(p->dev, p->stream, &s->ready) : LK_STATUS_OK;
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
    p->cur = p->next;
    memset(&p->next, 0, sizeof p->next);
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

lk_status lk__prefetch_tensor(const lk_batch *b, int field, lk_device d, lk_tensor **out) {
    *out = NULL;
    for (int k = 0; k < MAX_ACTIVE; k++) {
        lk__prefetch *p = active[k];
        if (!p || !p->cur.batch || p->cur.batch != b || !lk_device_equal(p->dev, d) || field < 0 ||
            field >= b->nfields || !p->cur.field[field])
            continue;
        if (!p->cur.waited) { /* ordering point 2: once per batch, at its first use */
            LK_TRY(lk_device_event_wait(p->dev, NULL, p->cur.ready));
            p->cur.waited = true;
        }
        *out = lk_tensor_retain(p->cur.field[field]);
        return LK_STATUS_OK;
    }
    return LK_STATUS_OK;
}

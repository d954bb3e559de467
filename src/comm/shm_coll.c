/* shm: the collectives' algorithms.
 *
 * all_reduce: each rank reduces its part from every rank's copy, always
 * folding rank 0, 1, ..., W-1 in that order, so every rank ends with the
 * same bits. When every rank's buffer lies in the segment, each rank writes
 * its reduced part straight into every buffer: two syncs in all, no copy-in
 * and no all-gather pass. Private buffers go through the staging slots
 * (reduce-scatter + all-gather over slices). Messages up to 64 KB take one
 * step (copy in, one sync, every rank reduces everything).
 *
 * Staging slots alternate between consecutive uses. A reader always
 * finishes reading a slot before it arrives at its next sync point, and a
 * writer reuses a slot only after waiting on a later sync point, so no
 * closing barrier is needed after staged collectives. Collectives that read
 * peers' own buffers (in-segment paths) end with a closing sync.
 */
#include <stdio.h>
#include <string.h>

#include "comm/shm_impl.h"

static int64_t offset_in(shm_comm *s, const void *p, size_t bytes) {
    const uint8_t *q = p;
    if (!p || !bytes || q < s->base || q + bytes > s->base + s->total) return -1;
    return (int64_t)(q - s->base);
}

/* Publishes what this rank is calling and (optionally) what peers may read,
 * syncs, and checks that every rank called the same collective. */
static lk_status enter(lk_comm *c, shm_comm *s, const lk__coll *op, int64_t off) {
    shm_slot *me = slot_of(s, s->rank);
    const int ix = (int)((s->tick + 1) & 1);
    shm_info *mi = &me->info[ix];
    mi->seq = op->seq;
    mi->kind = op->kind;
    mi->dt = op->kind == LK__COLL_BARRIER ? 0 : op->dt;
    mi->op = (op->kind == LK__COLL_ALL_REDUCE || op->kind == LK__COLL_REDUCE_SCATTER) ? (int)op->op : 0;
    mi->root = (op->kind == LK__COLL_BROADCAST || op->kind == LK__COLL_GATHER || op->kind == LK__COLL_SCATTER) ? op->root : 0;
    mi->count = op->kind == LK__COLL_BARRIER ? 0 : op->count;
    mi->off = off;
    atomic_store_explicit(&me->cur, ix, memory_order_relaxed); /* published by the tick's release */
    atomic_store_explicit(&me->in_coll, 1, memory_order_relaxed);
    atomic_store_explicit(&me->in_work, 0, memory_order_relaxed); /* its long work is over: it is here */
    s->cur = ix;
    uint64_t t0 = lk_time_ns();
    LK_TRY(lk__shm_sync_all(c, s, op));
    atomic_fetch_add_explicit(&c->arrival_wait_ns, lk_time_ns() - t0, memory_order_relaxed);
    bool same = true;
    for (int k = 0; k < s->world && same; k++) {
        shm_info *p = &slot_of(s, k)->info[ix];
        same = p->seq == mi->seq && p->kind == mi->kind && p->dt == mi->dt && p->op == mi->op && p->root == mi->root &&
               p->count == mi->count;
    }
    if (same) return LK_STATUS_OK;
    char list[1536];
    size_t len = 0;
    for (int k = 0; k < s->world && len < sizeof list - 180; k++) {
        char d[160];
        lk__shm_describe_info(&slot_of(s, k)->info[ix], d, sizeof d);
        len += (size_t)snprintf(list + len, sizeof list - len, "%srank %d called %s", k ? "; " : "", k, d);
    }
    return lk_error(LK_STATUS_INVALID_USAGE,
                    "collective mismatch (desync): the ranks issued different collectives at the same point: %s", list);
}

/* The offset rank k published for the collective in flight. */
static inline int64_t peer_off(shm_comm *s, int k) { return slot_of(s, k)->info[s->cur].off; }

static void leave(shm_comm *s, const lk__coll *op) {
    shm_slot *me = slot_of(s, s->rank);
    atomic_store_explicit(&me->seq_done, op->seq, memory_order_relaxed); /* diagnostics only */
    atomic_store_explicit(&me->active_ns, lk_time_ns(), memory_order_relaxed);
    atomic_store_explicit(&me->in_coll, 0, memory_order_relaxed);
}

/* Part k of n elements split W ways, aligned to cache lines. */
static inline void part(size_t n, int W, int k, size_t align, size_t *lo, size_t *hi) {
    size_t per = (n + (size_t)W - 1) / (size_t)W;
    per = (per + align - 1) / align * align;
    size_t a = per * (size_t)k, b = a + per;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

/* ------------------------------------------------------------------------
 * Collectives.
 * ---------------------------------------------------------------------- */
#define MAXW 256

static lk_status all_reduce(lk_comm *c, shm_comm *s, const lk__coll *op) {
    const int W = s->world, r = s->rank;
    const size_t esz = lk_dtype_size(op->dt), nb = op->count * esz;
    const int avg = op->op == LK_REDUCE_AVG ? W : 1;
    uint8_t *buf = op->recv;
    const void *srcs[MAXW];
    size_t align = 64 / esz ? 64 / esz : 1;

    if (nb <= s->small_bytes) { /* one step: copy in, sync, everyone reduces everything */
        uint64_t u = s->stage_ctr++;
        if (nb) memcpy(stage_of(s, r, u), buf, nb);
        LK_TRY(enter(c, s, op, -1));
        for (int k = 0; k < W; k++) srcs[k] = stage_of(s, k, u);
        lk__reduce(buf, srcs, W, op->count, op->dt, op->op, avg);
        return LK_STATUS_OK;
    }
    LK_TRY(enter(c, s, op, offset_in(s, buf, nb)));
    bool shared = true;
    for (int k = 0; k < W; k++) shared = shared && peer_off(s, k) >= 0;

    if (shared) {
        /* Every rank's buffer is in the segment: rank r reduces its part once
         * and writes the result into every rank's buffer, chunk by chunk
         * while it is in L1. No rank reads a part another rank writes, so
         * the whole collective is two syncs (all buffers ready, all parts
         * written) — no per-slice syncs for a late peer to stall, and no
         * second pass copying peers' parts back. */
        uint8_t *peer[MAXW];
        for (int k = 0; k < W; k++) peer[k] = s->base + peer_off(s, k);
        size_t lo, hi, chunk = s->chunk_shared / esz;
        part(op->count, W, r, align, &lo, &hi);
        for (size_t at = lo; at < hi; at += chunk) {
            size_t len = hi - at < chunk ? hi - at : chunk;
            for (int k = 0; k < W; k++) srcs[k] = peer[k] + at * esz;
            lk__reduce(buf + at * esz, srcs, W, len, op->dt, op->op, avg);
            for (int k = 0; k < W; k++)
                if (k != r) memcpy(peer[k] + at * esz, buf + at * esz, len * esz);
        }
        return lk__shm_sync_all(c, s, op); /* every part is in every buffer */
    }

    size_t step = STAGE_SLOT / esz;
    step = step / (align * (size_t)W) * (align * (size_t)W);
    for (size_t start = 0; start < op->count; start += step) {
        size_t len = op->count - start < step ? op->count - start : step, lo, hi;
        uint64_t u = s->stage_ctr++;
        memcpy(stage_of(s, r, u), buf + start * esz, len * esz);
        LK_TRY(lk__shm_sync_all(c, s, op));
        part(len, W, r, align, &lo, &hi);
        for (int k = 0; k < W; k++) srcs[k] = stage_of(s, k, u) + lo * esz;
        lk__reduce(stage_of(s, r, u) + lo * esz, srcs, W, hi - lo, op->dt, op->op, avg);
        LK_TRY(lk__shm_sync_all(c, s, op));
        for (int k = 0; k < W; k++) {
            part(len, W, k, align, &lo, &hi);
            if (hi > lo) memcpy(buf + (start + lo) * esz, stage_of(s, k, u) + lo * esz, (hi - lo) * esz);
        }
    }
    return LK_STATUS_OK;
}

static lk_status broadcast(lk_comm *c, shm_comm *s, const lk__coll *op) {
    const int r = s->rank, root = op->root;
    const size_t nb = op->count * lk_dtype_size(op->dt);
    uint8_t *buf = op->recv;
    LK_TRY(enter(c, s, op, r == root ? offset_in(s, buf, nb) : -1));
    if (!nb) return LK_STATUS_OK;
    int64_t roff = peer_off(s, root);
    if (roff >= 0) {
        if (r != root) memcpy(buf, s->base + roff, nb);
        return lk__shm_sync_all(c, s, op);
    }
    for (size_t start = 0; start < nb; start += STAGE_SLOT) {
        size_t len = nb - start < STAGE_SLOT ? nb - start : STAGE_SLOT;
        uint64_t u = s->stage_ctr++;
        if (r == root) memcpy(stage_of(s, r, u), buf + start, len);
        LK_TRY(lk__shm_sync_all(c, s, op));
        if (r != root) memcpy(buf + start, stage_of(s, root, u), len);
    }
    return LK_STATUS_OK;
}

/* all_gather and gather: every rank's send block goes to recv (all, or root only). */
static lk_status gather_like(lk_comm *c, shm_comm *s, const lk__coll *op, bool all) {
    const int W = s->world, r = s->rank;
    const size_t nb = op->count * lk_dtype_size(op->dt);
    const uint8_t *send = op->send;
    uint8_t *recv = op->recv;
    bool receiver = all || r == op->root;
    LK_TRY(enter(c, s, op, offset_in(s, send, nb)));
    if (!nb) return LK_STATUS_OK;
    if (receiver && recv + (size_t)r * nb != send) memmove(recv + (size_t)r * nb, send, nb);
    bool shared = true;
    for (int k = 0; k < W; k++) shared = shared && peer_off(s, k) >= 0;
    if (shared) {
        if (receiver)
            for (int k = 0; k < W; k++)
                if (k != r) memcpy(recv + (size_t)k * nb, s->base + peer_off(s, k), nb);
        return lk__shm_sync_all(c, s, op);
    }
    for (size_t start = 0; start < nb; start += STAGE_SLOT) {
        size_t len = nb - start < STAGE_SLOT ? nb - start : STAGE_SLOT;
        uint64_t u = s->stage_ctr++;
        memcpy(stage_of(s, r, u), send + start, len);
        LK_TRY(lk__shm_sync_all(c, s, op));
        if (receiver)
            for (int k = 0; k < W; k++)
                if (k != r) memcpy(recv + (size_t)k * nb + start, stage_of(s, k, u), len);
    }
    return LK_STATUS_OK;
}

/* reduce_scatter and scatter: block r of W send blocks goes to rank r,
 * reduced over all ranks' sends or taken from root's. */
static lk_status scatter_like(lk_comm *c, shm_comm *s, const lk__coll *op, bool reduce) {
    const int W = s->world, r = s->rank;
    const size_t esz = lk_dtype_size(op->dt), nb = op->count * esz;
    const uint8_t *send = op->send;
    uint8_t *recv = op->recv;
    const void *srcs[MAXW];
    bool sender = reduce || r == op->root;
    LK_TRY(enter(c, s, op, sender ? offset_in(s, send, nb * (size_t)W) : -1));
    if (!nb) return LK_STATUS_OK;
    bool shared = true;
    if (reduce)
        for (int k = 0; k < W; k++) shared = shared && peer_off(s, k) >= 0;
    else shared = peer_off(s, op->root) >= 0;
    if (shared) {
        if (reduce) {
            for (int k = 0; k < W; k++) srcs[k] = s->base + peer_off(s, k) + (size_t)r * nb;
            lk__reduce(recv, srcs, W, op->count, op->dt, op->op, op->op == LK_REDUCE_AVG ? W : 1);
        } else {
            memcpy(recv, s->base + peer_off(s, op->root) + (size_t)r * nb, nb);
        }
        return lk__shm_sync_all(c, s, op);
    }
    size_t step = STAGE_SLOT / ((size_t)W * esz); /* elements of each block per slice */
    for (size_t start = 0; start < op->count; start += step) {
        size_t len = op->count - start < step ? op->count - start : step;
        uint64_t u = s->stage_ctr++;
        /* A reduce stages only the blocks its peers read: its own block r is
         * reduced straight from its send buffer (no peer reads it), which
         * halves the copying at two ranks. The same values in the same rank
         * order: the same bits. A scatter's root stages every block. */
        if (sender)
            for (int j = 0; j < W; j++)
                if (!reduce || j != r)
                    memcpy(stage_of(s, r, u) + (size_t)j * len * esz, send + ((size_t)j * op->count + start) * esz,
                           len * esz);
        LK_TRY(lk__shm_sync_all(c, s, op));
        if (reduce) {
            for (int k = 0; k < W; k++)
                srcs[k] = k == r ? send + ((size_t)r * op->count + start) * esz : stage_of(s, k, u) + (size_t)r * len * esz;
            lk__reduce(recv + start * esz, srcs, W, len, op->dt, op->op, op->op == LK_REDUCE_AVG ? W : 1);
        } else {
            memcpy(recv + start * esz, stage_of(s, op->root, u) + (size_t)r * len * esz, len * esz);
        }
    }
    return LK_STATUS_OK;
}

lk_status lk__shm_run(lk_comm *c, const lk__coll *op) {
    shm_comm *s = c->impl;
    lk_status st;
    switch (op->kind) {
    case LK__COLL_ALL_REDUCE: st = all_reduce(c, s, op); break;
    case LK__COLL_BROADCAST: st = broadcast(c, s, op); break;
    case LK__COLL_ALL_GATHER: st = gather_like(c, s, op, true); break;
    case LK__COLL_GATHER: st = gather_like(c, s, op, false); break;
    case LK__COLL_REDUCE_SCATTER: st = scatter_like(c, s, op, true); break;
    case LK__COLL_SCATTER: st = scatter_like(c, s, op, false); break;
    case LK__COLL_BARRIER: st = enter(c, s, op, -1); break;
    default: return lk_error(LK_STATUS_INTERNAL, "shm: unknown collective %d", (int)op->kind);
    }
    if (!st) leave(s, op);
    return st;
}

/* shm: point-to-point through per-pair mailboxes, and process groups.
 *
 * Each ordered pair src -> dst has a control block (shm_mbox) and a data
 * slot of two chunks. A send posts its header (sequence number, dtype,
 * count), then writes its chunks into the slot as they become free,
 * alternating halves; a receive posts its header, and once the sender's
 * header for the same number is there and equal, reads the chunks out.
 * Chunk counters run over the pair's whole life, each with one writer, so
 * nothing is reset between messages. Both sides compare both headers, so
 * a receive of another dtype or size fails on both ranks at once, each
 * naming the pair, the number and both sides' dtype and count. A send is
 * done when the receiver has consumed every chunk (MPI_Ssend's meaning: a
 * send whose receive never comes times out on the sender, naming it).
 * Waiting, liveness and abort are the collectives' (shm_wait.c's
 * check_peer), per pair: only the peer is checked.
 *
 * Groups (lk_comm_split) are communicators with a segment of their own,
 * named after the group's job id (the parent's id, the split's number and
 * the colour), joined by the same rendezvous: a group's collectives and
 * mailboxes never share memory with its parent's or another group's, so
 * all of them run at once without interfering. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include "comm/shm_impl.h"

static size_t chunk_bytes(shm_comm *s) { return s->hdr->mdata_slot / 2; }

static uint64_t nchunks(shm_comm *s, const lk__p2p *op) {
    size_t bytes = op->count * lk_dtype_size(op->dt), h = chunk_bytes(s);
    return (bytes + h - 1) / h;
}

static bool same_header(const shm_msghdr *a, const lk__p2p *op) {
    return a->count == op->count && a->dt == (int32_t)op->dt;
}

static lk_status mismatch(lk_comm *c, const lk__p2p *op, const shm_msghdr *other) {
    return lk__p2p_mismatch(c, op, (lk_dtype)other->dt, (size_t)other->count);
}

lk_status lk__shm_p2p_start(lk_comm *c, lk__p2p *op) {
    shm_comm *s = c->impl;
    int me = s->rank;
    uint64_t now = lk_time_ns();
    op->t0 = op->prev = now;
    op->next_check = now + CHECK_NS;
    if (op->send) {
        if (!s->mdata_ready[op->peer]) {
            /* The slot's pages now: a full /dev/shm must be an error here,
             * not a SIGBUS in the middle of the copy. */
            off_t off = (off_t)(mdata_of(s, me, op->peer) - s->base);
            int rc = s->fd >= 0 ? posix_fallocate(s->fd, off, (off_t)s->hdr->mdata_slot) : 0;
            if (rc) {
                char d[200];
                lk__p2p_describe(c, op, d, sizeof d);
                return lk_error(LK_STATUS_OUT_OF_MEMORY, "%s: cannot reserve its %zu-byte mailbox in /dev/shm: %s (df -h "
                                "/dev/shm)", d, (size_t)s->hdr->mdata_slot, strerror(rc));
            }
            s->mdata_ready[op->peer] = true;
        }
        shm_mbox *mb = mbox_of(s, me, op->peer);
        shm_msghdr *h = &mb->send_hdr[op->seq & 1];
        h->seq = op->seq;
        h->count = op->count;
        h->dt = (int32_t)op->dt;
        op->base = atomic_load_explicit(&mb->written, memory_order_relaxed); /* this rank is its only writer */
        atomic_store_explicit(&mb->send_seq, op->seq, memory_order_release);
    } else {
        shm_mbox *mb = mbox_of(s, op->peer, me);
        shm_msghdr *h = &mb->recv_hdr[op->seq & 1];
        h->seq = op->seq;
        h->count = op->count;
        h->dt = (int32_t)op->dt;
        op->base = atomic_load_explicit(&mb->consumed, memory_order_relaxed);
        atomic_store_explicit(&mb->recv_seq, op->seq, memory_order_release);
    }
    return LK_STATUS_OK;
}

/* What the peer is doing, for a timeout message. */
static void peer_words(lk_comm *c, shm_comm *s, const lk__p2p *op, char *buf, size_t size) {
    shm_slot *sl = slot_of(s, op->peer);
    int pid = atomic_load(&sl->pid);
    shm_mbox *mb = op->send ? mbox_of(s, c->pg.rank, op->peer) : mbox_of(s, op->peer, c->pg.rank);
    char where[200];
    if (atomic_load(&sl->in_coll)) {
        shm_info *in = &sl->info[atomic_load(&sl->cur) & 1];
        lk__shm_describe_info(in, where, sizeof where);
    } else {
        snprintf(where, sizeof where, "not in a collective, %llu completed", (unsigned long long)atomic_load(&sl->seq_done));
    }
    if (op->send && op->phase == 0)
        snprintf(buf, size, "rank %d (pid %d, in: %s) has not posted recv #%llu from rank %d (its last: #%llu)", op->peer,
                 pid, where, (unsigned long long)op->seq, c->pg.rank,
                 (unsigned long long)atomic_load_explicit(&mb->recv_seq, memory_order_acquire));
    else if (!op->send && op->phase == 0)
        snprintf(buf, size, "rank %d (pid %d, in: %s) has not posted send #%llu to rank %d (its last: #%llu)", op->peer, pid,
                 where, (unsigned long long)op->seq, c->pg.rank,
                 (unsigned long long)atomic_load_explicit(&mb->send_seq, memory_order_acquire));
    else
        snprintf(buf, size, "rank %d (pid %d, in: %s) matched it but moved no data for that long", op->peer, pid, where);
}

/* Abort, the peer's liveness and the timeout, every 100 ms (or at the
 * timeout if sooner). The bound counts from the last movement. */
static lk_status check(lk_comm *c, shm_comm *s, lk__p2p *op) {
    uint64_t now = lk_time_ns();
    op->t0 += lk__paused_ns(now, &op->prev); /* a stopped process does not time out on resume */
    if (op->progressed) op->t0 = now;
    if (now < op->next_check) return LK_STATUS_OK;
    uint64_t limit = (uint64_t)(c->timeout_s * 1e9);
    char what[200];
    lk__p2p_describe(c, op, what, sizeof what);
    if (atomic_load(&c->abort_requested) || atomic_load(&c->failed)) {
        pthread_mutex_lock(&c->err_mu);
        lk_status st = lk_error(LK_STATUS_ABORTED, "%s: aborted while waiting: %s", what, c->err_msg);
        pthread_mutex_unlock(&c->err_mu);
        return st;
    }
    LK_TRY(lk__shm_check_peer(c, s, op->peer, what));
    if (now - op->t0 >= limit) {
        char peer[600];
        peer_words(c, s, op, peer, sizeof peer);
        return lk_error(LK_STATUS_TIMEOUT, "%s timed out after %.1f s (comm_timeout, LK_COMM_TIMEOUT): %s", what,
                        (double)(now - op->t0) * 1e-9, peer);
    }
    op->next_check = now + CHECK_NS;
    if (op->t0 + limit < op->next_check) op->next_check = op->t0 + limit;
    return LK_STATUS_OK;
}

static lk_status progress_send(lk_comm *c, shm_comm *s, lk__p2p *op, bool *done) {
    shm_mbox *mb = mbox_of(s, s->rank, op->peer);
    const uint64_t n = nchunks(s, op);
    if (op->phase == 0) {
        uint64_t r = atomic_load_explicit(&mb->recv_seq, memory_order_acquire);
        if (r >= op->seq) {
            /* r > seq: the receiver already finished this message, so it matched. */
            if (r == op->seq && !same_header(&mb->recv_hdr[op->seq & 1], op))
                return mismatch(c, op, &mb->recv_hdr[op->seq & 1]);
            op->phase = 1;
            op->progressed = true;
        }
    }
    /* Chunks go in as soon as a half is free, before the receive is
     * posted: a small message is in the slot when the receiver arrives. */
    const size_t h = chunk_bytes(s), bytes = op->count * lk_dtype_size(op->dt);
    uint8_t *slot = mdata_of(s, s->rank, op->peer);
    while (op->next < n && op->base + op->next - atomic_load_explicit(&mb->consumed, memory_order_acquire) < 2) {
        uint64_t k = op->base + op->next;
        size_t at = (size_t)op->next * h, len = bytes - at < h ? bytes - at : h;
        memcpy(slot + (k & 1) * h, (const uint8_t *)op->buf + at, len);
        atomic_store_explicit(&mb->written, k + 1, memory_order_release);
        op->next++;
        op->progressed = true;
    }
    if (op->phase == 1 && atomic_load_explicit(&mb->consumed, memory_order_acquire) >= op->base + n) {
        *done = true;
        return LK_STATUS_OK;
    }
    return check(c, s, op);
}

static lk_status progress_recv(lk_comm *c, shm_comm *s, lk__p2p *op, bool *done) {
    shm_mbox *mb = mbox_of(s, op->peer, s->rank);
    const uint64_t n = nchunks(s, op);
    if (op->phase == 0) {
        /* The sender cannot be past this message: it ends only when this
         * rank has read it all. */
        if (atomic_load_explicit(&mb->send_seq, memory_order_acquire) >= op->seq) {
            if (!same_header(&mb->send_hdr[op->seq & 1], op)) return mismatch(c, op, &mb->send_hdr[op->seq & 1]);
            op->phase = 1;
            op->progressed = true;
        }
    }
    if (op->phase == 1) {
        const size_t h = chunk_bytes(s), bytes = op->count * lk_dtype_size(op->dt);
        const uint8_t *slot = mdata_of(s, op->peer, s->rank);
        while (op->next < n && atomic_load_explicit(&mb->written, memory_order_acquire) > op->base + op->next) {
            uint64_t k = op->base + op->next;
            size_t at = (size_t)op->next * h, len = bytes - at < h ? bytes - at : h;
            memcpy((uint8_t *)op->buf + at, slot + (k & 1) * h, len);
            atomic_store_explicit(&mb->consumed, k + 1, memory_order_release);
            op->next++;
            op->progressed = true;
        }
        if (op->next == n) {
            *done = true;
            return LK_STATUS_OK;
        }
    }
    return check(c, s, op);
}

lk_status lk__shm_p2p_progress(lk_comm *c, lk__p2p *op, bool *done) {
    shm_comm *s = c->impl;
    return op->send ? progress_send(c, s, op, done) : progress_recv(c, s, op, done);
}


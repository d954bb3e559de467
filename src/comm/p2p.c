/* Point-to-point: lk_comm_send / lk_comm_recv and their async forms over
 * the backends' p2p_start / p2p_progress slots. Argument checks, the
 * per-pair sequence numbers, and the engine: a blocking call runs inline
 * when nothing else is in flight; async ones (and blocking ones queued
 * behind them) are progressed together, oldest first per direction of a
 * pair, by one thread per communicator, so a send to rank 1 and a receive
 * from rank 1 (or sends to two ranks) advance side by side instead of in
 * issue order as the collectives do. A failure is sticky, as a
 * collective's: the communicator is aborted and every later call fails. */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"

void lk__p2p_describe(const lk_comm *c, const lk__p2p *op, char *buf, size_t size) {
    if (op->send)
        snprintf(buf, size, "send #%llu from rank %d to rank %d (%s x %zu)", (unsigned long long)op->seq, c->pg.rank,
                 op->peer, lk_dtype_name(op->dt), op->count);
    else
        snprintf(buf, size, "recv #%llu by rank %d from rank %d (%s x %zu)", (unsigned long long)op->seq, c->pg.rank,
                 op->peer, lk_dtype_name(op->dt), op->count);
}

lk_status lk__p2p_mismatch(const lk_comm *c, const lk__p2p *op, lk_dtype other_dt, size_t other_count) {
    int src = op->send ? c->pg.rank : op->peer, dst = op->send ? op->peer : c->pg.rank;
    lk_dtype sdt = op->send ? op->dt : other_dt, rdt = op->send ? other_dt : op->dt;
    size_t sn = op->send ? op->count : other_count, rn = op->send ? other_count : op->count;
    return lk_error(LK_STATUS_INVALID_USAGE,
                    "point-to-point mismatch (desync) on the pair rank %d -> rank %d, message #%llu: rank %d sends %s x "
                    "%zu (%zu bytes), rank %d receives %s x %zu (%zu bytes)",
                    src, dst, (unsigned long long)op->seq, src, lk_dtype_name(sdt), sn, sn * lk_dtype_size(sdt), dst,
                    lk_dtype_name(rdt), rn, rn * lk_dtype_size(rdt));
}

/* Back-off while nothing moves: spin 20 µs (a peer on another core answers
 * within microseconds), yield until 2 ms, then sleep 50 µs at a time. */
typedef struct {
    uint64_t idle_since;
} backoff;

static void backoff_wait(backoff *b, bool moved) {
    if (moved) {
        b->idle_since = 0;
        return;
    }
    uint64_t now = lk_time_ns();
    if (!b->idle_since) b->idle_since = now;
    uint64_t idle = now - b->idle_since;
    if (idle < 20000) return;
    if (idle < 2000000) sched_yield();
    else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

static lk_status p2p_begin(lk_comm *c, lk__p2p *op) {
    char d[200];
    if (atomic_load(&c->failed)) {
        lk__p2p_describe(c, op, d, sizeof d);
        return lk__comm_failed_fast(c, d);
    }
    lk_status st = c->vt->p2p_start(c, op);
    if (st) lk__comm_fail(c, st);
    return st;
}

/* One step of op: *done when it finished (the status is then returned). */
static lk_status p2p_step(lk_comm *c, lk__p2p *op, bool *done) {
    *done = false;
    op->progressed = false;
    lk_status st = c->vt->p2p_progress(c, op, done);
    if (st) {
        *done = true;
        lk__comm_name_timeout_source(c, st);
        lk__comm_fail(c, st);
    }
    return st;
}

static lk_status run_inline(lk_comm *c, lk__p2p *op) {
    LK_TRY(p2p_begin(c, op));
    backoff b = {0};
    for (;;) {
        bool done;
        lk_status st = p2p_step(c, op, &done);
        if (done) return st;
        backoff_wait(&b, op->progressed);
    }
}

static void finish(lk_comm *c, lk_work *w, lk_status st) {
    pthread_mutex_lock(&c->mu);
    w->t_end = lk_time_now();
    w->status = st;
    if (st) snprintf(w->msg, sizeof w->msg, "%s", lk_last_error());
    w->done = true;
    c->p2p_pending--;
    pthread_cond_broadcast(&c->cv_done);
    pthread_mutex_unlock(&c->mu);
}

/* Whether an older op of the same direction of the same pair is still in
 * the list before w: only the oldest one may use the pair's mailbox. */
static bool blocked(lk_work *list, lk_work *w) {
    for (lk_work *e = list; e != w; e = e->next)
        if (e->p2p.send == w->p2p.send && e->p2p.peer == w->p2p.peer && !(w->p2p.group && e->p2p.group == w->p2p.group))
            return true; /* (a group's ops start together: its backend keeps their order on the pair) */
    return false;
}

static void *p2p_thread(void *arg) {
    lk_comm *c = arg;
    lk_work *list = NULL, **tail = &list; /* taken from the queue, in issue order; this thread's own */
    backoff b = {0};
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->p2p_head && !list && !c->p2p_stop) pthread_cond_wait(&c->cv_p2p, &c->mu);
        if (!c->p2p_head && !list) break;
        if (c->p2p_head) {
            *tail = c->p2p_head;
            while (*tail) tail = &(*tail)->next;
            c->p2p_head = c->p2p_tail = NULL;
        }
        pthread_mutex_unlock(&c->mu);
        bool moved = false;
        for (lk_work **pw = &list; *pw;) {
            lk_work *w = *pw;
            lk_status st = LK_STATUS_OK;
            bool done = false;
            if (!w->p2p_begun) {
                if (blocked(list, w)) {
                    pw = &w->next;
                    continue;
                }
                lk_clear_error();
                w->t_start = lk_time_now();
                w->p2p_begun = true;
                st = p2p_begin(c, &w->p2p);
                done = st != LK_STATUS_OK;
                moved = true;
            }
            if (!done && atomic_load(&c->failed)) {
                /* Another op failed: this one ends now instead of at its own check. */
                char d[200];
                lk__p2p_describe(c, &w->p2p, d, sizeof d);
                st = lk__comm_failed_fast(c, d);
                done = true;
                if (c->vt->p2p_cancel) c->vt->p2p_cancel(c, &w->p2p);
            }
            if (!done) {
                st = p2p_step(c, &w->p2p, &done);
                moved = moved || w->p2p.progressed;
            }
            if (done) {
                *pw = w->next;
                if (!*pw) tail = pw;
                w->next = NULL;
                finish(c, w, st);
                moved = true;
            } else {
                pw = &w->next;
            }
        }
        if (!list) tail = &list;
        backoff_wait(&b, moved);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Starts the p2p thread if it is not running (under c->mu). */
static lk_status start_thread(lk_comm *c, const char *fn) {
    if (c->p2p_started) return LK_STATUS_OK;
    if (pthread_create(&c->p2p_thread, NULL, p2p_thread, c))
        return lk_error(LK_STATUS_INTERNAL, "%s: cannot start the point-to-point thread", fn);
    c->p2p_started = true;
    c->p2p_stop = false;
    return LK_STATUS_OK;
}

static lk_status enqueue(lk_comm *c, const lk__p2p *op, lk_work **work, const char *fn) {
    lk_work *w = lk_calloc(1, sizeof *w);
    if (!w) return LK_STATUS_OUT_OF_MEMORY;
    w->is_p2p = true;
    w->p2p = *op;
    w->comm = c;
    if (c->p2p_group) { /* held: the group's end queues its ops together, knowing how many */
        w->p2p.group = c->p2p_group;
        lk_work **t = &c->p2p_held;
        while (*t) t = &(*t)->next;
        *t = w;
        c->p2p_nheld++;
        pthread_mutex_lock(&c->mu);
        c->p2p_pending++;
        pthread_mutex_unlock(&c->mu);
        *work = w;
        return LK_STATUS_OK;
    }
    pthread_mutex_lock(&c->mu);
    lk_status st = start_thread(c, fn);
    if (st) {
        pthread_mutex_unlock(&c->mu);
        lk_free(w);
        return st;
    }
    if (c->p2p_tail) c->p2p_tail->next = w;
    else c->p2p_head = w;
    c->p2p_tail = w;
    c->p2p_pending++;
    pthread_cond_signal(&c->cv_p2p);
    pthread_mutex_unlock(&c->mu);
    *work = w;
    return LK_STATUS_OK;
}

static lk_status issue(lk_comm *c, bool send, void *buf, size_t count, lk_dtype dt, int peer, lk_work **work) {
    const char *fn = send ? (work ? "lk_comm_send_async" : "lk_comm_send") : (work ? "lk_comm_recv_async" : "lk_comm_recv");
    if (!c) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: comm is NULL", fn);
    if (!c->vt->p2p_start || !c->vt->p2p_progress)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: the %s backend has no point-to-point (use shm or mpi)", fn, c->vt->name);
    if (!lk_dtype_size(dt))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: unsupported dtype %d (expected f32, f64, bf16, f16, i32, i64, u8)",
                        fn, (int)dt);
    if (peer < 0 || peer >= c->pg.world_size || peer == c->pg.rank)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: peer %d is not another rank (this is rank %d of %d)", fn, peer,
                        c->pg.rank, c->pg.world_size);
    if (count > ((size_t)1 << 50))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: count %zu is too large", fn, count);
    if (count && !buf) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: buffer is NULL with count %zu", fn, count);
    if (c->p2p_group && !work)
        return lk_error(LK_STATUS_INVALID_USAGE, "%s inside a point-to-point group (lk_comm_p2p_group_begin): only the "
                        "async forms, which the group's end posts", fn);
    if (c->p2p_group && c->p2p_nheld == LK__P2P_GROUP_MAX)
        return lk_error(LK_STATUS_INVALID_USAGE, "%s: a point-to-point group holds at most %d ops", fn, LK__P2P_GROUP_MAX);
    lk__p2p op;
    memset(&op, 0, sizeof op);
    op.send = send;
    op.peer = peer;
    op.buf = buf;
    op.count = count;
    op.dt = dt;
    op.seq = send ? ++c->p2p_send_seq[peer] : ++c->p2p_recv_seq[peer];
    if (work) return enqueue(c, &op, work, fn);
    /* Blocking: inline unless async sends or receives are in flight (an
     * older op of this pair may be among them). Only the issuing thread
     * enqueues, so the count cannot grow behind our back. */
    if (!atomic_load_explicit(&c->p2p_pending, memory_order_acquire)) return run_inline(c, &op);
    lk_work *w;
    LK_TRY(enqueue(c, &op, &w, fn));
    lk_status st = lk_work_wait(w);
    lk_work_free(w);
    return st;
}

lk_status lk_comm_send(lk_comm *c, const void *buf, size_t count, lk_dtype dt, int peer) {
    return issue(c, true, (void *)buf, count, dt, peer, NULL);
}
lk_status lk_comm_recv(lk_comm *c, void *buf, size_t count, lk_dtype dt, int peer) {
    return issue(c, false, buf, count, dt, peer, NULL);
}
lk_status lk_comm_send_async(lk_comm *c, const void *buf, size_t count, lk_dtype dt, int peer, lk_work **work) {
    if (!work) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_send_async: work is NULL");
    *work = NULL;
    return issue(c, true, (void *)buf, count, dt, peer, work);
}
lk_status lk_comm_recv_async(lk_comm *c, void *buf, size_t count, lk_dtype dt, int peer, lk_work **work) {
    if (!work) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_recv_async: work is NULL");
    *work = NULL;
    return issue(c, false, buf, count, dt, peer, work);
}

/* A group: on a backend that runs one (nccl) its ops are held here and
 * queued together at the end, each knowing the group's size, so the
 * backend can issue them as one; elsewhere they are posted as issued and
 * progress side by side already, and begin/end only check the pairing. */
lk_status lk_comm_p2p_group_begin(lk_comm *c) {
    if (!c) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_p2p_group_begin: comm is NULL");
    if (c->p2p_group)
        return lk_error(LK_STATUS_INVALID_USAGE, "lk_comm_p2p_group_begin: a group is open already (end it first)");
    c->p2p_group = ++c->p2p_groups_made;
    return LK_STATUS_OK;
}

lk_status lk_comm_p2p_group_end(lk_comm *c) {
    if (!c) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_p2p_group_end: comm is NULL");
    if (!c->p2p_group) return lk_error(LK_STATUS_INVALID_USAGE, "lk_comm_p2p_group_end: no group is open");
    c->p2p_group = 0;
    lk_work *held = c->p2p_held;
    int n = c->p2p_nheld;
    c->p2p_held = NULL;
    c->p2p_nheld = 0;
    if (!held) return LK_STATUS_OK;
    for (lk_work *w = held; w; w = w->next) w->p2p.group_n = c->vt->p2p_groups ? n : 0;
    if (!c->vt->p2p_groups)
        for (lk_work *w = held; w; w = w->next) w->p2p.group = 0;
    pthread_mutex_lock(&c->mu);
    lk_status st = start_thread(c, "lk_comm_p2p_group_end");
    if (st) { /* the held works fail: their owners wait for them and free them */
        for (lk_work *w = held, *nx; w; w = nx) {
            nx = w->next;
            w->next = NULL;
            w->status = st;
            snprintf(w->msg, sizeof w->msg, "%s", lk_last_error());
            w->done = true;
            c->p2p_pending--;
        }
        pthread_cond_broadcast(&c->cv_done);
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    lk_work *last = held;
    while (last->next) last = last->next;
    if (c->p2p_tail) c->p2p_tail->next = held;
    else c->p2p_head = held;
    c->p2p_tail = last;
    pthread_cond_signal(&c->cv_p2p);
    pthread_mutex_unlock(&c->mu);
    return LK_STATUS_OK;
}

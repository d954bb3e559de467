/* The generic communicator: argument checks, sequence numbers, the sticky
 * failure (first error wins, then everything fails fast), the async queue
 * run by one communication thread per communicator, and the "self" backend
 * for world size 1, which costs a function call and nothing else (no
 * segment, no thread). The backend list and lk_comm_create, which picks a
 * backend, are registry.c: the backends use this file, and this file names
 * none of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"

/* ------------------------------------------------------------------------
 * Names and descriptions.
 * ---------------------------------------------------------------------- */
const char *lk__coll_kind_name(lk__coll_kind k) {
    static const char *names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "gather", "scatter", "barrier"};
    return (unsigned)k < LK__COLL_COUNT ? names[k] : "?";
}

const char *lk_reduce_op_name(lk_reduce_op op) {
    static const char *names[] = {"sum", "avg", "max", "min"};
    return (unsigned)op < LK_REDUCE_COUNT ? names[op] : "?";
}

void lk__coll_describe(const lk__coll *op, char *buf, size_t size) {
    switch (op->kind) {
    case LK__COLL_BARRIER: snprintf(buf, size, "barrier #%llu", (unsigned long long)op->seq); break;
    case LK__COLL_ALL_REDUCE:
    case LK__COLL_REDUCE_SCATTER:
        snprintf(buf, size, "%s #%llu (%s x %zu, %s)", lk__coll_kind_name(op->kind), (unsigned long long)op->seq,
                 lk_dtype_name(op->dt), op->count, lk_reduce_op_name(op->op));
        break;
    case LK__COLL_ALL_GATHER:
        snprintf(buf, size, "%s #%llu (%s x %zu)", lk__coll_kind_name(op->kind), (unsigned long long)op->seq,
                 lk_dtype_name(op->dt), op->count);
        break;
    default:
        snprintf(buf, size, "%s #%llu (%s x %zu, root %d)", lk__coll_kind_name(op->kind), (unsigned long long)op->seq,
                 lk_dtype_name(op->dt), op->count, op->root);
    }
}

lk_comm_config lk_comm_config_default(void) {
    lk_comm_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.backend = "auto";
    /* The variable fills the default (within trainer.comm_timeout's bounds,
     * one range however the value is given); a caller's own timeout_s wins. */
    if (!lk_env_get_number("LK_COMM_TIMEOUT", 0.1, 1e6, &c.timeout_s)) c.timeout_s = 120.0;
    c.check_desync = lk_env_get_long("LK_COMM_CHECK_DESYNC", 1) != 0;
    return c;
}

/* ------------------------------------------------------------------------
 * Failure.
 * ---------------------------------------------------------------------- */
lk_status lk__comm_fail(lk_comm *c, lk_status st) {
    int expected = 0;
    pthread_mutex_lock(&c->err_mu);
    if (atomic_compare_exchange_strong(&c->failed, &expected, (int)st)) {
        snprintf(c->err_msg, sizeof c->err_msg, "%s", lk_last_error());
        pthread_mutex_unlock(&c->err_mu);
        if (c->vt->abort) c->vt->abort(c, c->err_msg);
    } else {
        pthread_mutex_unlock(&c->err_mu);
    }
    return st;
}

const char *lk__comm_timeout_words(const lk_comm *c, char *buf, size_t size) {
    if (!strcmp(c->timeout_from, "default"))
        snprintf(buf, size, "comm_timeout, the default; trainer.comm_timeout or LK_COMM_TIMEOUT sets it");
    else
        snprintf(buf, size, "comm_timeout from %s", c->timeout_from);
    return buf;
}

/* A backend that names the bound as "(comm_timeout, LK_COMM_TIMEOUT)"
 * (shm) gets the setting's actual source put in: the variable is not the
 * setting when a config's trainer.comm_timeout won over it. */
void lk__comm_name_timeout_source(lk_comm *c, lk_status st) {
    static const char generic[] = "(comm_timeout, LK_COMM_TIMEOUT)";
    const char *msg = lk_last_error(), *at = strstr(msg, generic);
    if (st != LK_STATUS_TIMEOUT || !at) return;
    char words[LK_PARAM_STR + 96];
    lk__comm_timeout_words(c, words, sizeof words);
    lk_error(st, "%.*s(%s)%s", (int)(at - msg), msg, words, at + sizeof generic - 1);
}

lk_status lk__comm_failed_fast(lk_comm *c, const char *what) {
    pthread_mutex_lock(&c->err_mu);
    lk_status st = lk_error(LK_STATUS_ABORTED, "%s: communicator already failed: %s", what, c->err_msg);
    pthread_mutex_unlock(&c->err_mu);
    return st;
}

lk_status lk_comm_error(lk_comm *c) {
    if (!c || !atomic_load(&c->failed)) return LK_STATUS_OK;
    pthread_mutex_lock(&c->err_mu);
    lk_status st = lk_error((lk_status)atomic_load(&c->failed), "%s", c->err_msg);
    pthread_mutex_unlock(&c->err_mu);
    return st;
}

lk_status lk_comm_abort(lk_comm *c, const char *reason) {
    if (!c) return LK_STATUS_ABORTED;
    atomic_store(&c->abort_requested, 1);
    lk_error(LK_STATUS_ABORTED, "lk_comm_abort: %s", reason ? reason : "lk_comm_abort");
    lk__comm_fail(c, LK_STATUS_ABORTED);
    return LK_STATUS_ABORTED;
}

lk_status lk_comm_long_work(lk_comm *c, int root, const char *what, const char *limit_name, double limit_s) {
    if (!c) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_long_work: comm is NULL");
    if (root < 0 || root >= c->pg.world_size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_long_work: root %d is out of range for world size %d", root,
                        c->pg.world_size);
    if (!(limit_s > 0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_long_work: limit %g s must be > 0", limit_s);
    c->long_root = root;
    c->long_seq = c->next_seq; /* the next collective this rank issues */
    c->long_start_ns = lk_time_ns();
    c->long_limit_s = limit_s;
    snprintf(c->long_what, sizeof c->long_what, "%s", what && *what ? what : "long work");
    snprintf(c->long_limit_name, sizeof c->long_limit_name, "%s", limit_name && *limit_name ? limit_name : "limit");
    if (c->vt->long_work) c->vt->long_work(c);
    return LK_STATUS_OK;
}

/* ------------------------------------------------------------------------
 * Create / free.
 * ---------------------------------------------------------------------- */
/* A communicator object without its backend (vt->init or vt->split fills
 * c->impl): locks, sequence numbers, the per-pair counters. NULL when out
 * of memory. */
lk_comm *lk__comm_new(const lk__comm_vtable *vt, const lk_pg_info *pg) {
    lk_comm *c = lk_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->p2p_send_seq = lk_calloc((size_t)pg->world_size, sizeof *c->p2p_send_seq);
    c->p2p_recv_seq = lk_calloc((size_t)pg->world_size, sizeof *c->p2p_recv_seq);
    if (!c->p2p_send_seq || !c->p2p_recv_seq) {
        lk_free(c->p2p_send_seq);
        lk_free(c->p2p_recv_seq);
        lk_free(c);
        return NULL;
    }
    c->vt = vt;
    c->pg = *pg;
    c->next_seq = 1;
    c->long_root = -1;
    pthread_mutex_init(&c->err_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv_work, NULL);
    pthread_cond_init(&c->cv_done, NULL);
    pthread_cond_init(&c->cv_p2p, NULL);
    return c;
}

/* Frees what comm_new made (the backend is already gone). */
void lk__comm_delete(lk_comm *c) {
    pthread_mutex_destroy(&c->err_mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv_work);
    pthread_cond_destroy(&c->cv_done);
    pthread_cond_destroy(&c->cv_p2p);
    lk_free(c->p2p_send_seq);
    lk_free(c->p2p_recv_seq);
    lk_free(c);
}

void lk__comm_drain(lk_comm *c) {
    pthread_mutex_lock(&c->mu);
    while (c->pending > 0 || c->p2p_pending > 0) pthread_cond_wait(&c->cv_done, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void lk_comm_set_leave_reason(lk_comm *c, const char *reason) {
    if (c) snprintf(c->leave_reason, sizeof c->leave_reason, "%s", reason ? reason : "");
}

/* Stops the point-to-point thread (p2p.c starts it on first use; it ends
 * when its queue is empty and p2p_stop is set). Here, beside the
 * collectives' thread's stop, so that comm.c needs nothing of p2p.c. */
static void stop_p2p_thread(lk_comm *c) {
    if (!c->p2p_started) return;
    pthread_mutex_lock(&c->mu);
    c->p2p_stop = true;
    pthread_cond_signal(&c->cv_p2p);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->p2p_thread, NULL);
    c->p2p_started = false;
}

void lk_comm_free(lk_comm *c) {
    if (!c) return;
    lk__comm_drain(c);
    stop_p2p_thread(c);
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_signal(&c->cv_work);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    c->vt->destroy(c);
    lk__comm_delete(c);
}

int lk_comm_rank(const lk_comm *c) { return c->pg.rank; }
int lk_comm_world_size(const lk_comm *c) { return c->pg.world_size; }
int lk_comm_local_rank(const lk_comm *c) { return c->pg.local_rank; }
int lk_comm_local_world_size(const lk_comm *c) { return c->pg.local_world_size; }
const char *lk_comm_backend(const lk_comm *c) { return c->vt->name; }
const lk_pg_info *lk_comm_pg(const lk_comm *c) { return &c->pg; }
double lk_comm_arrival_wait_s(const lk_comm *c) {
    return c ? 1e-9 * (double)atomic_load_explicit(&((lk_comm *)c)->arrival_wait_ns, memory_order_relaxed) : 0;
}

lk_status lk_comm_alloc_shared(lk_comm *c, size_t bytes, void **ptr) {
    if (!c || !ptr) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_alloc_shared: NULL argument");
    *ptr = NULL;
    if (c->vt->alloc_shared) return c->vt->alloc_shared(c, bytes, ptr);
    void *p = lk_aligned_alloc(LK_ALIGN, bytes ? (bytes + LK_ALIGN - 1) / LK_ALIGN * LK_ALIGN : LK_ALIGN);
    if (!p) return LK_STATUS_OUT_OF_MEMORY;
    memset(p, 0, bytes);
    *ptr = p;
    return LK_STATUS_OK;
}

bool lk_comm_shares_memory(const lk_comm *c) { return c && c->vt->shared_at && c->vt->alloc_shared; }

bool lk_comm_reads_device(const lk_comm *c) { return c && c->vt->device_memory; }

lk_status lk_comm_alloc_common(lk_comm *c, size_t bytes, void **ptr, bool *owner) {
    if (!c || !ptr || !owner) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_alloc_common: NULL argument");
    *ptr = NULL;
    *owner = c->pg.rank == 0;
    if (!lk_comm_shares_memory(c))
        return lk_error(LK_STATUS_UNSUPPORTED, "lk_comm_alloc_common: the %s backend has no memory every rank maps",
                        c->vt->name);
    /* Rank 0 allocates in its heap and tells the others where: a failure
     * there reaches every rank as an offset of -1. */
    void *mine = NULL;
    lk_status st = LK_STATUS_OK;
    int64_t off = -1;
    if (*owner) {
        st = lk_comm_alloc_shared(c, bytes, &mine);
        if (!st) off = c->vt->shared_offset(c, mine);
    }
    lk_status bst = lk_comm_broadcast(c, &off, 1, LK_I64, 0);
    if (bst) {
        if (mine) lk_comm_free_shared(c, mine);
        return bst;
    }
    if (off < 0)
        return st ? st : lk_error(LK_STATUS_OUT_OF_MEMORY, "lk_comm_alloc_common: rank 0 could not allocate %zu shared bytes", bytes);
    *ptr = *owner ? mine : c->vt->shared_at(c, 0, off);
    return LK_STATUS_OK;
}

lk_status lk_comm_peer_blocks(lk_comm *c, void *mine, void **peers, bool *all) {
    if (!c || !peers || !all) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_peer_blocks: NULL argument");
    *all = false;
    int W = lk_comm_world_size(c);
    int64_t off = mine && lk_comm_shares_memory(c) ? c->vt->shared_offset(c, mine) : -1;
    int64_t *offs = lk_calloc((size_t)(W > 0 ? W : 1), sizeof *offs);
    if (!offs) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = lk_comm_all_gather(c, &off, offs, 1, LK_I64);
    bool every = !st;
    for (int k = 0; k < W && every; k++) every = offs[k] >= 0;
    for (int k = 0; k < W && every; k++) peers[k] = c->vt->shared_at(c, k, offs[k]);
    *all = every;
    lk_free(offs);
    return st;
}

void lk_comm_free_shared(lk_comm *c, void *ptr) {
    if (!c || !ptr) return;
    if (c->vt->free_shared) c->vt->free_shared(c, ptr);
    else lk_aligned_free(ptr);
}

/* ------------------------------------------------------------------------
 * Issue: checks, then inline or queued.
 * ---------------------------------------------------------------------- */
static lk_status check(lk_comm *c, const lk__coll *op) {
    const char *k = lk__coll_kind_name(op->kind);
    if (!c) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_%s: comm is NULL", k);
    if (op->kind == LK__COLL_BARRIER) return LK_STATUS_OK;
    if (!lk_dtype_size(op->dt))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_%s: unsupported dtype %d (expected f32, f64, bf16, f16, i32, i64, u8)", k,
                        (int)op->dt);
    if ((op->kind == LK__COLL_ALL_REDUCE || op->kind == LK__COLL_REDUCE_SCATTER) && (unsigned)op->op >= LK_REDUCE_COUNT)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_%s: unknown reduce op %d (expected sum, avg, max, min)", k, (int)op->op);
    if ((op->kind == LK__COLL_BROADCAST || op->kind == LK__COLL_GATHER || op->kind == LK__COLL_SCATTER) &&
        (op->root < 0 || op->root >= c->pg.world_size))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_%s: root %d is out of range for world size %d", k, op->root,
                        c->pg.world_size);
    if (op->count > ((size_t)1 << 50) / (size_t)c->pg.world_size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_%s: count %zu is too large", k, op->count);
    if (op->count) {
        bool need_send = true, need_recv = true;
        bool root = c->pg.rank == op->root;
        if (op->kind == LK__COLL_GATHER) need_recv = root;
        if (op->kind == LK__COLL_SCATTER) need_send = root;
        if ((need_send && !op->send) || (need_recv && !op->recv))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_comm_%s: %s buffer is NULL with count %zu", k,
                            need_send && !op->send ? "send" : "recv", op->count);
    }
    return LK_STATUS_OK;
}

static lk_status run_one(lk_comm *c, const lk__coll *op) {
    if (atomic_load(&c->failed)) {
        char d[160];
        lk__coll_describe(op, d, sizeof d);
        return lk__comm_failed_fast(c, d);
    }
    lk_status st = c->vt->run(c, op);
    if (st) {
        lk__comm_name_timeout_source(c, st);
        lk__comm_fail(c, st);
    }
    return st;
}

static void *comm_thread(void *arg) {
    lk_comm *c = arg;
    /* Tests make the communicator artificially slow to prove that DDP hides
     * communication behind backward (tests/strategy/test_ddp.c). */
    long delay_ms = lk_env_get_long("LK_COMM_TEST_DELAY_MS", 0);
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stop) pthread_cond_wait(&c->cv_work, &c->mu);
        if (!c->head) break;
        lk_work *w = c->head;
        c->head = w->next;
        if (!c->head) c->tail = NULL;
        pthread_mutex_unlock(&c->mu);
        lk_clear_error();
        if (delay_ms > 0) {
            struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        w->t_start = lk_time_now();
        lk_status st = run_one(c, &w->op);
        w->t_end = lk_time_now();
        pthread_mutex_lock(&c->mu);
        w->status = st;
        if (st) snprintf(w->msg, sizeof w->msg, "%s", lk_last_error());
        w->done = true;
        c->pending--;
        pthread_cond_broadcast(&c->cv_done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Puts op on the communication thread's queue (starting it on first use). */
static lk_status enqueue(lk_comm *c, const lk__coll *op, lk_work **work) {
    lk_work *w = lk_calloc(1, sizeof *w);
    if (!w) return LK_STATUS_OUT_OF_MEMORY;
    w->op = *op;
    w->comm = c;
    if (c->vt == &lk__comm_self) {
        /* Nothing travels: complete now, no thread. */
        w->t_start = lk_time_now();
        w->status = run_one(c, op);
        w->t_end = lk_time_now();
        if (w->status) snprintf(w->msg, sizeof w->msg, "%s", lk_last_error());
        w->done = true;
        *work = w;
        return LK_STATUS_OK;
    }
    pthread_mutex_lock(&c->mu);
    if (!c->thread_started) {
        if (pthread_create(&c->thread, NULL, comm_thread, c)) {
            pthread_mutex_unlock(&c->mu);
            lk_free(w);
            return lk_error(LK_STATUS_INTERNAL, "lk_comm_%s: cannot start the communication thread", lk__coll_kind_name(op->kind));
        }
        c->thread_started = true;
    }
    if (c->tail) c->tail->next = w;
    else c->head = w;
    c->tail = w;
    c->pending++;
    pthread_cond_signal(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    *work = w;
    return LK_STATUS_OK;
}

static lk_status issue(lk_comm *c, lk__coll *op, lk_work **work) {
    if (work) *work = NULL;
    LK_TRY(check(c, op));
    op->seq = c->next_seq++;
    if (work) return enqueue(c, op, work);
    /* Blocking: run inline unless async work is still pending (it must go first).
     * Only the issuing thread enqueues, so pending cannot grow behind our back. */
    if (!atomic_load_explicit(&c->pending, memory_order_acquire)) return run_one(c, op);
    lk_work *w;
    LK_TRY(enqueue(c, op, &w));
    lk_status st = lk_work_wait(w);
    lk_work_free(w);
    return st;
}

lk_status lk_work_wait(lk_work *w) {
    if (!w) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_work_wait: work is NULL");
    lk_comm *c = w->comm;
    pthread_mutex_lock(&c->mu);
    while (!w->done) pthread_cond_wait(&c->cv_done, &c->mu);
    pthread_mutex_unlock(&c->mu);
    if (w->status) return lk_error(w->status, "%s", w->msg);
    return LK_STATUS_OK;
}

lk_status lk_work_test(lk_work *w, bool *done) {
    if (!w || !done) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_work_test: NULL argument");
    lk_comm *c = w->comm;
    pthread_mutex_lock(&c->mu);
    bool d = w->done;
    pthread_mutex_unlock(&c->mu);
    *done = d;
    if (d && w->status) return lk_error(w->status, "%s", w->msg);
    return LK_STATUS_OK;
}

void lk_work_times(const lk_work *w, double *t_start, double *t_end) {
    *t_start = w ? w->t_start : 0;
    *t_end = w ? w->t_end : 0;
}

void lk_work_free(lk_work *w) {
    if (!w) return;
    lk_comm *c = w->comm;
    pthread_mutex_lock(&c->mu);
    while (!w->done) pthread_cond_wait(&c->cv_done, &c->mu);
    pthread_mutex_unlock(&c->mu);
    lk_free(w);
}

/* ------------------------------------------------------------------------
 * The public collectives: fill a descriptor, issue.
 * ---------------------------------------------------------------------- */
#define COLL(KIND, SEND, RECV, COUNT, DT, OP, ROOT) \
    lk__coll op = {.kind = KIND, .send = SEND, .recv = RECV, .count = COUNT, .dt = DT, .op = OP, .root = ROOT}

lk_status lk_comm_all_reduce(lk_comm *c, void *buf, size_t count, lk_dtype dt, lk_reduce_op rop) {
    COLL(LK__COLL_ALL_REDUCE, buf, buf, count, dt, rop, 0);
    return issue(c, &op, NULL);
}
lk_status lk_comm_broadcast(lk_comm *c, void *buf, size_t count, lk_dtype dt, int root) {
    COLL(LK__COLL_BROADCAST, buf, buf, count, dt, LK_REDUCE_SUM, root);
    return issue(c, &op, NULL);
}
lk_status lk_comm_all_gather(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt) {
    COLL(LK__COLL_ALL_GATHER, send, recv, count, dt, LK_REDUCE_SUM, 0);
    return issue(c, &op, NULL);
}
lk_status lk_comm_reduce_scatter(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, lk_reduce_op rop) {
    COLL(LK__COLL_REDUCE_SCATTER, send, recv, count, dt, rop, 0);
    return issue(c, &op, NULL);
}
lk_status lk_comm_gather(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, int root) {
    COLL(LK__COLL_GATHER, send, recv, count, dt, LK_REDUCE_SUM, root);
    return issue(c, &op, NULL);
}
lk_status lk_comm_scatter(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, int root) {
    COLL(LK__COLL_SCATTER, send, recv, count, dt, LK_REDUCE_SUM, root);
    return issue(c, &op, NULL);
}
lk_status lk_comm_barrier(lk_comm *c) {
    COLL(LK__COLL_BARRIER, NULL, NULL, 0, LK_F32, LK_REDUCE_SUM, 0);
    return issue(c, &op, NULL);
}

#define NEED_WORK(w)                                                                     \
    do {                                                                                 \
        if (!(w)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: work is NULL", __func__); \
    } while (0)

lk_status lk_comm_all_reduce_async(lk_comm *c, void *buf, size_t count, lk_dtype dt, lk_reduce_op rop, lk_work **w) {
    NEED_WORK(w);
    COLL(LK__COLL_ALL_REDUCE, buf, buf, count, dt, rop, 0);
    return issue(c, &op, w);
}
lk_status lk_comm_broadcast_async(lk_comm *c, void *buf, size_t count, lk_dtype dt, int root, lk_work **w) {
    NEED_WORK(w);
    COLL(LK__COLL_BROADCAST, buf, buf, count, dt, LK_REDUCE_SUM, root);
    return issue(c, &op, w);
}
lk_status lk_comm_all_gather_async(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, lk_work **w) {
    NEED_WORK(w);
    COLL(LK__COLL_ALL_GATHER, send, recv, count, dt, LK_REDUCE_SUM, 0);
    return issue(c, &op, w);
}
lk_status lk_comm_reduce_scatter_async(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt,
                                       lk_reduce_op rop, lk_work **w) {
    NEED_WORK(w);
    COLL(LK__COLL_REDUCE_SCATTER, send, recv, count, dt, rop, 0);
    return issue(c, &op, w);
}
lk_status lk_comm_gather_async(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, int root,
                               lk_work **w) {
    NEED_WORK(w);
    COLL(LK__COLL_GATHER, send, recv, count, dt, LK_REDUCE_SUM, root);
    return issue(c, &op, w);
}
lk_status lk_comm_scatter_async(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, int root,
                                lk_work **w) {
    NEED_WORK(w);
    COLL(LK__COLL_SCATTER, send, recv, count, dt, LK_REDUCE_SUM, root);
    return issue(c, &op, w);
}
lk_status lk_comm_barrier_async(lk_comm *c, lk_work **w) {
    NEED_WORK(w);
    COLL(LK__COLL_BARRIER, NULL, NULL, 0, LK_F32, LK_REDUCE_SUM, 0);
    return issue(c, &op, w);
}

/* ------------------------------------------------------------------------
 * The self backend: world size 1, every collective is a local copy.
 * ---------------------------------------------------------------------- */
static lk_status self_init(lk_comm *c, const lk_comm_config *cfg) {
    (void)cfg;
    if (c->pg.world_size != 1) return lk_error(LK_STATUS_INVALID_ARGUMENT, "self backend needs world size 1");
    return LK_STATUS_OK;
}
static void self_destroy(lk_comm *c) { (void)c; }
static lk_status self_split(lk_comm *parent, lk_comm *child, int colour, int key) {
    (void)parent, (void)colour, (void)key;
    return child ? self_init(child, NULL) : LK_STATUS_OK;
}
static lk_status self_run(lk_comm *c, const lk__coll *op) {
    (void)c;
    size_t bytes = op->count * lk_dtype_size(op->dt);
    switch (op->kind) {
    case LK__COLL_ALL_REDUCE:
    case LK__COLL_BROADCAST:
    case LK__COLL_BARRIER: return LK_STATUS_OK; /* avg over one rank is the value itself */
    default:
        if (bytes && op->send != op->recv) memmove(op->recv, op->send, bytes);
        return LK_STATUS_OK;
    }
}
const lk__comm_vtable lk__comm_self = {
    .name = "self", .init = self_init, .destroy = self_destroy, .run = self_run, .split = self_split,
};

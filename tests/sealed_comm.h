/* A communicator that reads device memory, for the tests: what nccl is to
 * ddp, over the sealed device (sealed_device.h), so that the path of ddp
 * only a device-reading communicator reaches — device buckets averaged in
 * place, parameters broadcast from device memory, gradients converted on
 * the device when they travel in another dtype — runs on every CI machine.
 *
 * It declares device_memory (lk_comm_reads_device is true) and does each
 * collective on sealed memory the obvious way: the device buffer copied to
 * a host buffer through the sealed device's own copies (the only way the
 * host may touch it), the same collective on a host communicator (shm)
 * that this one owns, the result copied back. Host buffers (the trainer's
 * metrics, SyncBatchNorm's sums, flags) go to the host communicator as
 * they are, as nccl routes them. The averages are the shm communicator's,
 * so a run over this communicator must give the bits of a run over shm.
 * It counts what it did, per process, so a test can tell that ddp handed
 * it device memory (and in which dtype). Registered by name "sealed_nccl"
 * (lk__comm_register_test_backend): pick it with LK_COMM_BACKEND. */
#ifndef LK_TEST_SEALED_COMM_H
#define LK_TEST_SEALED_COMM_H

#include "comm/comm_impl.h"
#include "sealed_device.h"

typedef struct {
    long dev_all_reduce, dev_broadcast, dev_other, host_colls;
    unsigned dev_all_reduce_dtypes; /* bit dt set: a device all_reduce in dtype dt */
    /* its own copies of device memory to and from its host stand-ins (in
     * sealed_stats' copies_out / copies_in too): what nccl would not make,
     * for a test that counts the copies of the code around the collective */
    long stand_in_out, stand_in_in;
} sealed_comm_stats;
static sealed_comm_stats sealed_comm_counts; /* under sealed_arena.mu (sealed_comm_get_stats) */

typedef struct {
    lk_comm *host;
    lk_device dev; /* sealed:<local rank>, where this rank's buffers live */
} sealed_comm_impl;

/* Inside the sealed arena's reservation: device memory. */
static bool sealed_comm_on_device(const void *p) {
    const char *c = p;
    return p && sealed_arena.ready && c >= sealed_arena.base && c < sealed_arena.base + sealed_arena.cap;
}

static lk_status sealed_comm_init(lk_comm *c, const lk_comm_config *cfg) {
    sealed_comm_impl *m = lk_calloc(1, sizeof *m);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    lk_device d0 = sealed_device(0);
    m->dev = (lk_device){d0.kind, c->pg.local_rank % sealed_count(NULL)};
    lk_comm_config hc = *cfg; /* its own segment name, as nccl's host communicator */
    char job[128];
    snprintf(job, sizeof job, "%s-sealed", c->job_id);
    hc.job_id = job;
    hc.pg = &c->pg;
    hc.backend = "shm";
    lk_status st = lk_comm_create(&hc, &m->host);
    if (st) {
        lk_free(m);
        return st;
    }
    c->impl = m;
    return LK_STATUS_OK;
}

static void sealed_comm_destroy(lk_comm *c) {
    sealed_comm_impl *m = c->impl;
    lk_comm_free(m->host);
    lk_free(m);
    c->impl = NULL;
}

/* The collective op on the host communicator, with host buffers. */
static lk_status sealed_comm_host_run(lk_comm *h, const lk__coll *op, const void *send, void *recv) {
    switch (op->kind) {
    case LK__COLL_ALL_REDUCE:
        if (send != recv && op->count) memcpy(recv, send, op->count * lk_dtype_size(op->dt));
        return lk_comm_all_reduce(h, recv, op->count, op->dt, op->op);
    case LK__COLL_BROADCAST: return lk_comm_broadcast(h, recv, op->count, op->dt, op->root);
    case LK__COLL_ALL_GATHER: return lk_comm_all_gather(h, send, recv, op->count, op->dt);
    case LK__COLL_REDUCE_SCATTER: return lk_comm_reduce_scatter(h, send, recv, op->count, op->dt, op->op);
    case LK__COLL_GATHER: return lk_comm_gather(h, send, recv, op->count, op->dt, op->root);
    case LK__COLL_SCATTER: return lk_comm_scatter(h, send, recv, op->count, op->dt, op->root);
    default: return lk_comm_barrier(h);
    }
}

static lk_status sealed_comm_run(lk_comm *c, const lk__coll *op) {
    sealed_comm_impl *m = c->impl;
    bool dsend = sealed_comm_on_device(op->send), drecv = sealed_comm_on_device(op->recv);
    if (op->kind == LK__COLL_BARRIER || (!dsend && !drecv)) {
        pthread_mutex_lock(&sealed_arena.mu);
        sealed_comm_counts.host_colls++;
        pthread_mutex_unlock(&sealed_arena.mu);
        return sealed_comm_host_run(m->host, op, op->send, op->recv);
    }
    size_t es = lk_dtype_size(op->dt), W = (size_t)c->pg.world_size;
    size_t send_bytes = op->count * es * (op->kind == LK__COLL_REDUCE_SCATTER || op->kind == LK__COLL_SCATTER ? W : 1);
    size_t recv_bytes = op->count * es * (op->kind == LK__COLL_ALL_GATHER || op->kind == LK__COLL_GATHER ? W : 1);
    bool in_place = op->send == op->recv;
    /* Host stand-ins for the device sides (one buffer when in place). */
    void *hs = dsend ? lk_aligned_alloc(LK_ALIGN, send_bytes ? send_bytes : 1) : (void *)op->send;
    void *hr = !drecv ? op->recv : in_place ? hs : lk_aligned_alloc(LK_ALIGN, recv_bytes ? recv_bytes : 1);
    lk_status st = (dsend && !hs) || (drecv && !hr) ? LK_STATUS_OUT_OF_MEMORY : LK_STATUS_OK;
    if (!st && dsend) st = lk_device_copy(LK_DEVICE_CPU, hs, m->dev, op->send, send_bytes);
    if (!st) st = sealed_comm_host_run(m->host, op, hs, hr);
    if (!st && drecv) st = lk_device_copy(m->dev, op->recv, LK_DEVICE_CPU, hr, recv_bytes);
    if (dsend) lk_aligned_free(hs);
    if (drecv && !in_place) lk_aligned_free(hr);
    pthread_mutex_lock(&sealed_arena.mu);
    sealed_comm_counts.stand_in_out += dsend;
    sealed_comm_counts.stand_in_in += drecv;
    if (op->kind == LK__COLL_ALL_REDUCE) {
        sealed_comm_counts.dev_all_reduce++;
        sealed_comm_counts.dev_all_reduce_dtypes |= 1u << op->dt;
    } else if (op->kind == LK__COLL_BROADCAST) {
        sealed_comm_counts.dev_broadcast++;
    } else {
        sealed_comm_counts.dev_other++;
    }
    pthread_mutex_unlock(&sealed_arena.mu);
    return st;
}

static void sealed_comm_abort(lk_comm *c, const char *reason) {
    sealed_comm_impl *m = c->impl;
    if (m && m->host) lk_comm_abort(m->host, reason);
}

static const lk__comm_vtable sealed_comm_vtable = {
    .name = "sealed_nccl",
    .device_memory = true,
    .init = sealed_comm_init,
    .destroy = sealed_comm_destroy,
    .run = sealed_comm_run,
    .abort = sealed_comm_abort,
};

/* Registers the sealed device and this communicator (by name "sealed_nccl"). */
static inline void sealed_comm_register(void) {
    sealed_device(0);
    lk__comm_register_test_backend(&sealed_comm_vtable);
}

static inline sealed_comm_stats sealed_comm_get_stats(void) {
    pthread_mutex_lock(&sealed_arena.mu);
    sealed_comm_stats s = sealed_comm_counts;
    pthread_mutex_unlock(&sealed_arena.mu);
    return s;
}

#endif

/* The hierarchical communicator (built with MPI): Horovod's hierarchical
 * all-reduce for jobs that span nodes. Three communicators inside: `world`
 * (mpi, every rank; it also works out who shares a node, from the host
 * names), `node` (shm, the ranks of this node; none when a rank is alone on
 * its node) and `leaders` (mpi, local rank 0 of every node). An all-reduce
 * reduces inside the node through shared memory, the leaders all-reduce
 * the node sums over MPI, and each leader broadcasts the result to its node
 * through shared memory: the network carries one buffer per node instead of
 * one per rank. Every other collective runs flat on `world`.
 *
 * The order of additions is fixed by the topology (nodes x ranks per node),
 * so results are bitwise reproducible for a given topology, and differ in
 * the last bits from the flat mpi backend's. AVG is a SUM divided once at
 * the end. Each of the three steps is bounded by comm_timeout on its own.
 * Process groups (lk_comm_split) are groups of `world` and run flat;
 * point-to-point goes straight to `world`'s mpi sends and receives. */
#ifdef LK_HAVE_MPI
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"

typedef struct {
    lk_comm *world, *node, *leaders; /* node, leaders: NULL in a group made by split (flat) */
} hier_comm;

static void hier_free_parts(hier_comm *h) {
    lk_comm_free(h->leaders);
    lk_comm_free(h->node);
    lk_comm_free(h->world);
    lk_free(h);
}

static lk_status hier_init(lk_comm *c, const lk_comm_config *cfg) {
    hier_comm *h = lk_calloc(1, sizeof *h);
    if (!h) return LK_STATUS_OUT_OF_MEMORY;
    lk_comm_config wc = *cfg;
    wc.struct_size = sizeof wc;
    wc.backend = "mpi";
    wc.pg = &c->pg;
    wc.job_id = c->job_id;
    wc.timeout_s = c->timeout_s;
    wc.timeout_from = c->timeout_from;
    lk_status st = c->make_host(&wc, &h->world); /* lk_comm_create, through the registry (no file cycle) */
    if (st) {
        lk_free(h);
        return st;
    }
    c->pg = *lk_comm_pg(h->world); /* the node placement from the host names */
    if (c->pg.local_world_size > 1) {
        /* The node's shm group: its own segment name per node, so that
         * "nodes" sharing one /dev/shm (a test on one machine) cannot meet. */
        lk_pg_info np = c->pg;
        np.rank = np.local_rank;
        np.world_size = np.local_world_size;
        np.node_rank = 0;
        np.num_nodes = 1;
        char job[sizeof c->job_id + 16];
        snprintf(job, sizeof job, "%s-n%d", c->job_id, c->pg.node_rank);
        lk_comm_config ncfg = *cfg;
        ncfg.struct_size = sizeof ncfg;
        ncfg.backend = "shm";
        ncfg.pg = &np;
        ncfg.job_id = job;
        ncfg.timeout_s = c->timeout_s;
        ncfg.timeout_from = c->timeout_from;
        st = c->make_host(&ncfg, &h->node);
        /* every rank learns whether every node's group was made */
        int bad = st != LK_STATUS_OK, any = 0;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", st ? lk_last_error() : "");
        lk_status st2 = lk_comm_all_reduce(h->world, &bad, 1, LK_I32, LK_REDUCE_MAX);
        if (!st2) any = bad;
        if (st || st2 || any) {
            hier_free_parts(h);
            if (st) return lk_error(st, "hier backend: the shm group of node %d: %s", c->pg.node_rank, msg);
            if (st2) return st2;
            return lk_error(LK_STATUS_REMOTE, "hier backend: another node could not make its shm group");
        }
    }
    st = lk_comm_split(h->world, c->pg.local_rank == 0 ? 0 : LK_COMM_NO_GROUP, c->pg.node_rank, &h->leaders);
    if (st) {
        hier_free_parts(h);
        return st;
    }
    c->impl = h;
    return LK_STATUS_OK;
}

static void hier_destroy(lk_comm *c) {
    hier_comm *h = c->impl;
    if (h) hier_free_parts(h);
    c->impl = NULL;
}

/* The leaders' step is one all-reduce among the leaders. With two nodes
 * the mpi backend swaps the two node sums in eager-sized messages, both
 * directions of the link at once, and adds (pair_all_reduce in
 * comm_mpi.c: OpenMPI's own all-reduce of two, or one whole-buffer swap,
 * sends one direction at a time over TCP). */
static lk_status hier_run(lk_comm *c, const lk__coll *op) {
    hier_comm *h = c->impl;
    switch (op->kind) {
    case LK__COLL_ALL_REDUCE: {
        if (!op->count) return LK_STATUS_OK;
        if (!h->node && !h->leaders) return lk_comm_all_reduce(h->world, op->recv, op->count, op->dt, op->op);
        lk_reduce_op rop = op->op == LK_REDUCE_AVG ? LK_REDUCE_SUM : op->op;
        if (h->node) LK_TRY(lk_comm_all_reduce(h->node, op->recv, op->count, op->dt, rop));
        if (h->leaders) LK_TRY(lk_comm_all_reduce(h->leaders, op->recv, op->count, op->dt, rop));
        if (h->node) LK_TRY(lk_comm_broadcast(h->node, op->recv, op->count, op->dt, 0));
        if (op->op == LK_REDUCE_AVG) lk__reduce_divide(op->recv, op->count, op->dt, c->pg.world_size);
        return LK_STATUS_OK;
    }
    case LK__COLL_BROADCAST: return lk_comm_broadcast(h->world, op->recv, op->count, op->dt, op->root);
    case LK__COLL_ALL_GATHER: return lk_comm_all_gather(h->world, op->send, op->recv, op->count, op->dt);
    case LK__COLL_REDUCE_SCATTER:
        return lk_comm_reduce_scatter(h->world, op->send, op->recv, op->count, op->dt, op->op);
    case LK__COLL_GATHER: return lk_comm_gather(h->world, op->send, op->recv, op->count, op->dt, op->root);
    case LK__COLL_SCATTER: return lk_comm_scatter(h->world, op->send, op->recv, op->count, op->dt, op->root);
    case LK__COLL_BARRIER: return lk_comm_barrier(h->world);
    default: return lk_error(LK_STATUS_INTERNAL, "hier: unknown collective %d", (int)op->kind);
    }
}

static void hier_abort(lk_comm *c, const char *reason) {
    hier_comm *h = c->impl;
    if (!h) return;
    if (h->node) lk_comm_abort(h->node, reason);
    if (h->leaders) lk_comm_abort(h->leaders, reason);
    lk_comm_abort(h->world, reason);
}

/* A group: the same split of `world`, flat inside (a group's ranks need
 * not fill whole nodes). */
static lk_status hier_split(lk_comm *parent, lk_comm *child, int colour, int key) {
    hier_comm *ph = parent->impl;
    lk_comm *sub = NULL;
    LK_TRY(lk_comm_split(ph->world, colour < 0 ? LK_COMM_NO_GROUP : colour, key, &sub));
    if (!child) {
        lk_comm_free(sub);
        return LK_STATUS_OK;
    }
    hier_comm *h = lk_calloc(1, sizeof *h);
    if (!h) {
        lk_comm_free(sub);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    h->world = sub;
    child->impl = h;
    return LK_STATUS_OK;
}

/* Point-to-point: the op (numbered on this communicator, the same ranks as
 * world) is posted and progressed on world's mpi implementation. */
static lk_status hier_p2p_start(lk_comm *c, lk__p2p *op) {
    hier_comm *h = c->impl;
    return lk__comm_mpi.p2p_start(h->world, op);
}
static lk_status hier_p2p_progress(lk_comm *c, lk__p2p *op, bool *done) {
    hier_comm *h = c->impl;
    return lk__comm_mpi.p2p_progress(h->world, op, done);
}

const lk__comm_vtable lk__comm_hier = {
    .name = "hier",
    .init = hier_init,
    .destroy = hier_destroy,
    .run = hier_run,
    .abort = hier_abort,
    .split = hier_split,
    .p2p_start = hier_p2p_start,
    .p2p_progress = hier_p2p_progress,
};
#endif

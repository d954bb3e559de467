/* The hierarchical communicator (built with MPI): Horovod's hierarchical
 * all-reduce for jobs that span nodes. Three communicators inside: `world`
 * (mpi, every rank; it also works out who shares a node, from the host
 * names), `node` (shm, the ranks of this node; none when a rank is alone on
 * its node) and `leaders` (mpi, local rank 0 of every node). An all-reduce
 * reduces inside the node through shared memory, the leaders all-reduce
 * the node sums over MPI, and each leader broadcasts the result to its node
 * through shared memory: the network carries one buffer per node instead of
 * one per rank; large ones in chunks, the three steps overlapped. When the
 * ranks are laid out node by node, all-gather and reduce-scatter go
 * through the leaders the same way. Every other collective runs flat on
 * `world`.
 *
 * The order of additions is fixed by the topology (nodes x ranks per node),
 * so results are bitwise reproducible for a given topology, and differ in
 * the last bits from the flat mpi backend's. AVG is a SUM divided once at
 * the end. Each of the three steps is bounded by comm_timeout on its own.
 * Process groups (lk_comm_split) are groups of `world` and run flat;
 * point-to-point goes straight to `world`'s mpi sends and receives. */
#ifdef LK_HAVE_MPI
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_impl.h"

typedef struct {
    lk_comm *world, *node, *leaders; /* node, leaders: NULL in a group made by split (flat) */
    /* Every node runs g ranks and rank = node * g + local rank (mpirun's
     * default placement, --map-by ppr:g:node or slot): each node's ranks
     * are one block of an all-gather's output and a reduce-scatter's
     * input, so those can go through the node leaders too. Otherwise
     * (--map-by node, uneven nodes) they run flat on world. */
    bool blocked;
    int g;
    void *scratch; /* the reduce-scatter's node sum and leaders' result (scratch_bytes), kept between calls */
    size_t scratch_bytes;
    /* lk_comm_alloc_shared blocks taken from the node's shm heap (the rest
     * are lk_aligned_alloc's), so that free_shared gives each back where
     * it came from */
    pthread_mutex_t mu;
    void **in_node;
    int n_in_node, cap_in_node;
} hier_comm;

static void hier_free_parts(hier_comm *h) {
    lk_free(h->in_node);
    pthread_mutex_destroy(&h->mu);
    lk_aligned_free(h->scratch);
    lk_comm_free(h->leaders);
    lk_comm_free(h->node);
    lk_comm_free(h->world);
    lk_free(h);
}

static lk_status hier_init(lk_comm *c, const lk_comm_config *cfg) {
    hier_comm *h = lk_calloc(1, sizeof *h);
    if (!h) return LK_STATUS_OUT_OF_MEMORY;
    pthread_mutex_init(&h->mu, NULL);
    lk_comm_config wc = *cfg;
    wc.struct_size = sizeof wc;
    wc.backend = "mpi";
    wc.pg = &c->pg;
    wc.job_id = c->job_id;
    wc.timeout_s = c->timeout_s;
    wc.timeout_from = c->timeout_from;
    lk_status st = c->make_host(&wc, &h->world); /* lk_comm_create, through the registry (no file cycle) */
    if (st) {
        pthread_mutex_destroy(&h->mu);
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
    }
    /* Every rank (also one alone on its node: all take part) learns
     * whether every node's group was made, and whether the ranks are laid
     * out in node blocks of equal size (max of -g and g: all equal). */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st ? lk_last_error() : "");
    int g = c->pg.local_world_size;
    int32_t v[4] = {st != LK_STATUS_OK, c->pg.rank != c->pg.node_rank * g + c->pg.local_rank, -g, g};
    lk_status st2 = lk_comm_all_reduce(h->world, v, 4, LK_I32, LK_REDUCE_MAX);
    if (st || st2 || v[0]) {
        hier_free_parts(h);
        if (st) return lk_error(st, "hier backend: the shm group of node %d: %s", c->pg.node_rank, msg);
        if (st2) return st2;
        return lk_error(LK_STATUS_REMOTE, "hier backend: another node could not make its shm group");
    }
    h->blocked = !v[1] && -v[2] == v[3];
    h->g = g;
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

/* The pipeline's chunk (LK_COMM_HIER_CHUNK bytes, default 1 MiB; 0: the
 * three steps one after the other on the whole buffer). Every rank of a
 * node must see the same value (mpirun -x): it decides the node's
 * sequence of collectives, and a rank that differs fails with the shm
 * group's mismatch error. */
static size_t hier_chunk_bytes(void) {
    long v = lk_env_get_long("LK_COMM_HIER_CHUNK", 1L << 20);
    return v > 0 ? (size_t)v : 0;
}

/* Waits for and frees every leaders' work still in flight (after a
 * failure: abort made the waits return at once). */
static void drain(lk_work **x, int n) {
    for (int i = 0; i < n; i++)
        if (x[i]) {
            (void)lk_work_wait(x[i]);
            lk_work_free(x[i]);
            x[i] = NULL;
        }
}

/* The all-reduce in chunks, the three steps overlapped: the node reduces
 * chunk i+1 (shared memory, this thread) while the leaders exchange chunk
 * i (the leaders' communicator's own thread, over the network), and then
 * broadcasts chunk i-1 inside the node. On a link slower than shared
 * memory the network never waits for the node, and the intra-node legs
 * (18 ms of a 4 MiB all-reduce that takes 720 ms at 50 Mbit/s) disappear
 * behind the exchange but for one chunk's worth. Every element is added
 * in the same order as without chunks (the node's ranks in rank order,
 * then the leaders' node 0 + node 1 ...), so the bits are the unchunked
 * all-reduce's. Each rank of a node issues the same node collectives in
 * the same order: reduce 0, reduce 1, broadcast 0, reduce 2, broadcast 1,
 * ... At most two leaders' exchanges are in flight. */
static lk_status pipelined_all_reduce(hier_comm *h, char *buf, size_t count, lk_dtype dt, lk_reduce_op rop, size_t per) {
    size_t esz = lk_dtype_size(dt), nch = (count + per - 1) / per;
    lk_work *x[2] = {NULL, NULL};
    lk_status st = LK_STATUS_OK;
    for (size_t i = 0; i <= nch && !st; i++) {
        if (i < nch) {
            size_t n = i + 1 < nch ? per : count - i * per;
            st = lk_comm_all_reduce(h->node, buf + i * per * esz, n, dt, rop);
            if (!st && h->leaders) st = lk_comm_all_reduce_async(h->leaders, buf + i * per * esz, n, dt, rop, &x[i % 2]);
        }
        if (!st && i >= 1) {
            size_t j = i - 1, n = j + 1 < nch ? per : count - j * per;
            if (h->leaders) {
                st = lk_work_wait(x[j % 2]);
                lk_work_free(x[j % 2]);
                x[j % 2] = NULL;
            }
            if (!st) st = lk_comm_broadcast(h->node, buf + j * per * esz, n, dt, 0);
        }
    }
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", lk_last_error());
        if (h->leaders && (x[0] || x[1])) lk_comm_abort(h->leaders, msg);
        drain(x, 2);
        return lk_error(st, "%s", msg);
    }
    return LK_STATUS_OK;
}

static void *scratch(hier_comm *h, size_t bytes) {
    if (bytes > h->scratch_bytes) {
        lk_aligned_free(h->scratch);
        h->scratch_bytes = 0;
        h->scratch = lk_aligned_alloc(64, bytes);
        if (h->scratch) h->scratch_bytes = bytes;
    }
    return h->scratch;
}

/* All-gather through the leaders (blocked layouts): the node gathers its
 * g blocks into their place in the output, the leaders all-gather the
 * nodes' g-block pieces (on two nodes the mpi backend's chunked swap), and
 * each leader broadcasts the whole output to its node. A node's link
 * carries the other node's blocks once, instead of the 3/4 of the output a
 * flat ring of 4 ranks puts on it; the bits are moved, not computed, so
 * they are the flat all-gather's. */
static lk_status hier_all_gather(lk_comm *c, hier_comm *h, const lk__coll *op) {
    size_t esz = lk_dtype_size(op->dt), nodeblk = (size_t)h->g * op->count * esz;
    char *mine = (char *)op->recv + (size_t)c->pg.node_rank * nodeblk;
    if (h->node) LK_TRY(lk_comm_all_gather(h->node, op->send, mine, op->count, op->dt));
    else if (mine != (const char *)op->send) memcpy(mine, op->send, nodeblk);
    if (h->leaders) LK_TRY(lk_comm_all_gather(h->leaders, mine, op->recv, (size_t)h->g * op->count, op->dt));
    if (h->node) LK_TRY(lk_comm_broadcast(h->node, op->recv, (size_t)c->pg.world_size * op->count, op->dt, 0));
    return LK_STATUS_OK;
}

/* Reduce-scatter through the leaders (blocked layouts): the node
 * all-reduces the whole input (every rank's W blocks) through shared
 * memory, the leaders reduce-scatter the node sums in g-block pieces (on
 * two nodes the mpi backend's chunked swap: each leader sends the other
 * node's blocks and adds its own), and each leader scatters its node's
 * blocks to its ranks. The additions are the hierarchical all-reduce's
 * (the node's ranks in order, then the nodes), so a block's bits equal the
 * same block of hier's all-reduce. A node's link carries half the input
 * each way. */
static lk_status hier_reduce_scatter(lk_comm *c, hier_comm *h, const lk__coll *op) {
    size_t esz = lk_dtype_size(op->dt), W = (size_t)c->pg.world_size, g = (size_t)h->g, total = W * op->count;
    lk_reduce_op rop = op->op == LK_REDUCE_AVG ? LK_REDUCE_SUM : op->op;
    char *sum = scratch(h, (total + g * op->count) * esz);
    if (!sum) return LK_STATUS_OUT_OF_MEMORY;
    char *part = sum + total * esz; /* this node's g blocks, summed over the nodes */
    memcpy(sum, op->send, total * esz);
    if (h->node) LK_TRY(lk_comm_all_reduce(h->node, sum, total, op->dt, rop));
    if (h->leaders) LK_TRY(lk_comm_reduce_scatter(h->leaders, sum, part, g * op->count, op->dt, rop));
    if (h->node) LK_TRY(lk_comm_scatter(h->node, part, op->recv, op->count, op->dt, 0));
    else memcpy(op->recv, part, op->count * esz);
    if (op->op == LK_REDUCE_AVG) lk__reduce_divide(op->recv, op->count, op->dt, c->pg.world_size);
    return LK_STATUS_OK;
}

/* The leaders' step is one all-reduce among the leaders. With two nodes
 * the mpi backend swaps the two node sums in eager-sized messages, both
 * directions of the link at once, and adds (pair_swap in comm_mpi.c:
 * OpenMPI's own all-reduce of two, or one whole-buffer swap, sends one
 * direction at a time over TCP). */
static lk_status hier_run(lk_comm *c, const lk__coll *op) {
    hier_comm *h = c->impl;
    bool layered = h->node || h->leaders; /* not a group made by split */
    switch (op->kind) {
    case LK__COLL_ALL_REDUCE: {
        if (!op->count) return LK_STATUS_OK;
        if (!layered) return lk_comm_all_reduce(h->world, op->recv, op->count, op->dt, op->op);
        lk_reduce_op rop = op->op == LK_REDUCE_AVG ? LK_REDUCE_SUM : op->op;
        size_t per = hier_chunk_bytes() / lk_dtype_size(op->dt);
        if (h->node && per && op->count > per) {
            LK_TRY(pipelined_all_reduce(h, op->recv, op->count, op->dt, rop, per));
        } else {
            if (h->node) LK_TRY(lk_comm_all_reduce(h->node, op->recv, op->count, op->dt, rop));
            if (h->leaders) LK_TRY(lk_comm_all_reduce(h->leaders, op->recv, op->count, op->dt, rop));
            if (h->node) LK_TRY(lk_comm_broadcast(h->node, op->recv, op->count, op->dt, 0));
        }
        if (op->op == LK_REDUCE_AVG) lk__reduce_divide(op->recv, op->count, op->dt, c->pg.world_size);
        return LK_STATUS_OK;
    }
    case LK__COLL_BROADCAST: return lk_comm_broadcast(h->world, op->recv, op->count, op->dt, op->root);
    case LK__COLL_ALL_GATHER:
        if (layered && h->blocked && op->count) return hier_all_gather(c, h, op);
        return lk_comm_all_gather(h->world, op->send, op->recv, op->count, op->dt);
    case LK__COLL_REDUCE_SCATTER:
        if (layered && h->blocked && op->count) return hier_reduce_scatter(c, h, op);
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
    pthread_mutex_init(&h->mu, NULL);
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

/* Memory for collectives (DDP's gradient buckets, bench comm's buffer):
 * from the node's shm heap where the node has several ranks, so that the
 * node's all-reduce and broadcast read and write the ranks' buffers in
 * place (shm's in-segment path: no copies through its staging slots, about
 * half the memory traffic of the intra-node legs); the order of additions
 * is the same either way. A heap too small for the block falls back to
 * private memory (the staged path), as before. Not lk_comm_shares_memory:
 * the ranks of other nodes cannot map it. */
static lk_status hier_alloc_shared(lk_comm *c, size_t bytes, void **ptr) {
    hier_comm *h = c->impl;
    if (h->node && !lk_comm_alloc_shared(h->node, bytes, ptr)) {
        pthread_mutex_lock(&h->mu);
        bool kept = !lk_vec_reserve(h->in_node, h->cap_in_node, h->n_in_node + 1, 8);
        if (kept) h->in_node[h->n_in_node++] = *ptr;
        pthread_mutex_unlock(&h->mu);
        if (kept) return LK_STATUS_OK;
        lk_comm_free_shared(h->node, *ptr);
        *ptr = NULL;
        return LK_STATUS_OUT_OF_MEMORY;
    }
    size_t a = 64, size = bytes ? (bytes + a - 1) / a * a : a;
    void *p = lk_aligned_alloc(a, size);
    if (!p) return LK_STATUS_OUT_OF_MEMORY;
    memset(p, 0, bytes);
    *ptr = p;
    return LK_STATUS_OK;
}

static void hier_free_shared(lk_comm *c, void *ptr) {
    hier_comm *h = c->impl;
    pthread_mutex_lock(&h->mu);
    int i = 0;
    while (i < h->n_in_node && h->in_node[i] != ptr) i++;
    bool node = i < h->n_in_node;
    if (node) h->in_node[i] = h->in_node[--h->n_in_node];
    pthread_mutex_unlock(&h->mu);
    if (node) lk_comm_free_shared(h->node, ptr);
    else lk_aligned_free(ptr);
}

const lk__comm_vtable lk__comm_hier = {
    .name = "hier",
    .init = hier_init,
    .destroy = hier_destroy,
    .run = hier_run,
    .alloc_shared = hier_alloc_shared,
    .free_shared = hier_free_shared,
    .abort = hier_abort,
    .split = hier_split,
    .p2p_start = hier_p2p_start,
    .p2p_progress = hier_p2p_progress,
};
#endif

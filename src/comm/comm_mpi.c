/* The mpi communicator (built when CMake finds MPI): each collective maps to
 * its non-blocking MPI call on a private duplicate of MPI_COMM_WORLD,
 * completed by polling MPI_Test so comm_timeout and lk_comm_abort bound
 * every wait. bf16/f16 have no MPI type: they are widened to f32, reduced,
 * and rounded once. With check_desync each collective first all-gathers
 * the ranks' signatures (sequence, kind, dtype, count, op, root), so a
 * mismatch is reported instead of hanging or corrupting data.
 *
 * After any failure the process must not finalize collectively: MPI_Finalize
 * waits for every peer, and a stopped or wedged one never comes. So once a
 * communicator has failed, the exit handler aborts the whole MPI job
 * (MPI_Abort: mpirun kills every rank) instead, after the caller has printed
 * its error.
 *
 * A rank that dies (SIGKILL, a crash) is not reported by OpenMPI to its
 * peers: without ULFM a shared-memory transport just never completes, and
 * mpirun ends the job itself, SIGTERM to every other rank and SIGKILL one
 * second later (odls_base_sigkill_timeout), printing only its own notice.
 * So the ranks exchange pids and hosts at init, and a wait checks every
 * 100 ms whether a peer on this host is gone: the waiting rank then fails
 * the collective naming it ("rank 1 (pid N) died ... in all_reduce #7"),
 * which a process that survives SIGTERM long enough to print (lockstep fit
 * finishes its step on SIGTERM) reports before mpirun's SIGKILL. A process
 * that does not catch SIGTERM dies at once and says nothing; a dead peer on
 * another host is seen only if MPI's transport reports it (MPI_ERRORS_RETURN
 * makes that an error naming the collective).
 *
 * Groups are MPI_Comm_split of the parent's communicator. Point-to-point
 * is two messages per send on the group's communicator: a header
 * (sequence number, dtype, count) sent with MPI_Issend, so the send
 * completes only once the receiver has posted its receive (a send whose
 * receive never comes times out, named), then the data with MPI_Isend; the
 * receiver compares the header with its own before it posts the data's
 * receive, so a mismatch is named at once, on the receiver. Sends and
 * receives progress on lockstep's p2p thread next to the collectives'
 * thread: every MPI call of this file holds mpi_mu, which makes the calls
 * of the two threads serialized, as MPI_THREAD_SERIALIZED requires. */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"

/* Held around every MPI call (see the top of the file). */
static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;
#define LOCKED(stmt)                   \
    do {                               \
        pthread_mutex_lock(&mpi_mu);   \
        stmt;                          \
        pthread_mutex_unlock(&mpi_mu); \
    } while (0)

typedef struct {
    MPI_Comm comm;
    int rank, world;
    int *pids;    /* every rank's pid, for the liveness check */
    bool *local;  /* a peer on this host whose pid this process can see */
    /* every rank's host name (HOSTW bytes each, cut): a timeout names the
     * hosts whose ranks cannot be seen from here (a dead node, a cut link) */
    char *hosts;
    int *wranks; /* every rank's rank in MPI_COMM_WORLD (with hosts) */
    /* The job's nodes as the host names say (world communicator only; -1
     * when the exchange failed): this rank's node, index on it, counts. */
    int node_rank, num_nodes, local_rank, local_world;
    /* Two ranks on two hosts (a hier communicator's node leaders, or a flat
     * job of one rank per node): large all-reduces take pair_all_reduce. */
    bool remote_pair;
    char *ring; /* pair_swap's receive ring (ring_bytes), kept between calls */
    size_t ring_bytes;
} mpi_comm;

static uint64_t host_hash(void) {
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

/* What one rank contributes to the init exchange: pid, host hash (the full
 * name decides who shares a node), its rank in MPI_COMM_WORLD (what
 * messages call a rank, also in a group) and the host name cut to HOSTW - 1
 * bytes (for messages only). */
enum { HOSTW = 48, XW = 3 + HOSTW / 8 };

static lk_status wait_req(lk_comm *c, MPI_Request *req, const lk__coll *op, const char *label);

/* Who shares this host and can be checked for life (same pid namespace:
 * the pid is alive here at init). Collective over m->comm. Without it
 * (out of memory, an MPI error) waits fall back to comm_timeout alone.
 * waiter NULL: blocking calls, under mpi_mu held by the caller (init, when
 * every rank is starting). Otherwise (a group being made) non-blocking
 * calls waited for with waiter's bounds (its timeout, abort and dead-peer
 * checks), mpi_mu not held: a peer that dies or stops here fails the wait
 * instead of wedging this process inside MPI with the lock held; that
 * failure is the only error. */
static lk_status exchange_pids(mpi_comm *m, lk_comm *waiter) {
    static const lk__coll op = {.kind = LK__COLL_ALL_GATHER, .seq = UINT64_MAX};
    const char *what = "lk_comm_split (the new group's pid exchange)";
    int wrank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    int64_t me[XW] = {(int64_t)getpid(), (int64_t)host_hash(), wrank};
    gethostname((char *)&me[3], HOSTW - 1);
    ((char *)&me[3])[HOSTW - 1] = 0;
    int64_t *all = lk_malloc(sizeof me * (size_t)m->world);
    int fail = !all, any_fail = 1, rc;
    m->num_nodes = -1;
    if (!waiter) {
        MPI_Allreduce(&fail, &any_fail, 1, MPI_INT, MPI_MAX, m->comm); /* every rank takes part in the gather, or none */
        rc = any_fail ? MPI_SUCCESS : MPI_Allgather(me, XW, MPI_INT64_T, all, XW, MPI_INT64_T, m->comm);
    } else {
        MPI_Request req;
        LOCKED(rc = MPI_Iallreduce(&fail, &any_fail, 1, MPI_INT, MPI_MAX, m->comm, &req));
        lk_status st = rc == MPI_SUCCESS ? wait_req(waiter, &req, &op, what) : LK_STATUS_OK;
        if (!st && rc == MPI_SUCCESS && !any_fail) {
            LOCKED(rc = MPI_Iallgather(me, XW, MPI_INT64_T, all, XW, MPI_INT64_T, m->comm, &req));
            if (rc == MPI_SUCCESS) st = wait_req(waiter, &req, &op, what);
        }
        if (st) {
            lk_free(all);
            return st;
        }
    }
    if (any_fail || rc != MPI_SUCCESS) {
        lk_free(all);
        return LK_STATUS_OK;
    }
    m->pids = lk_calloc((size_t)m->world, sizeof *m->pids);
    m->local = lk_calloc((size_t)m->world, sizeof *m->local);
    m->hosts = lk_calloc((size_t)m->world, HOSTW);
    m->wranks = m->hosts ? lk_calloc((size_t)m->world, sizeof *m->wranks) : NULL;
    if (!m->wranks) { /* names for messages only: without them, no names */
        lk_free(m->hosts);
        m->hosts = NULL;
    }
    for (int k = 0; m->pids && m->local && k < m->world; k++) {
        m->pids[k] = (int)all[XW * k];
        m->local[k] = k != m->rank && all[XW * k + 1] == me[1] && lk__pid_alive(m->pids[k]);
        if (m->hosts) memcpy(m->hosts + (size_t)k * HOSTW, &all[XW * k + 3], HOSTW);
        if (m->wranks) m->wranks[k] = (int)all[XW * k + 2];
    }
    /* Nodes numbered in the order of their lowest rank, ranks on a node in
     * rank order: OpenMPI's local rank, and the node index that
     * rank / local_world_size gives only when ranks fill nodes in order
     * (mpirun's default; not --map-by node). */
    m->node_rank = m->local_rank = 0;
    m->num_nodes = m->local_world = 0;
    for (int k = 0; k < m->world; k++) {
        bool first = true;
        for (int j = 0; j < k && first; j++) first = all[XW * j + 1] != all[XW * k + 1];
        if (first && all[XW * k + 1] == me[1]) m->node_rank = m->num_nodes;
        if (first) m->num_nodes++;
        if (all[XW * k + 1] == me[1]) {
            if (k < m->rank) m->local_rank++;
            m->local_world++;
        }
    }
    m->remote_pair = m->world == 2 && all[XW * (1 - m->rank) + 1] != me[1];
    if (!m->pids || !m->local) {
        lk_free(m->pids);
        lk_free(m->local);
        lk_free(m->hosts);
        lk_free(m->wranks);
        m->pids = NULL;
        m->local = NULL;
        m->hosts = NULL;
        m->wranks = NULL;
    }
    lk_free(all);
    return LK_STATUS_OK;
}

static _Atomic int job_failed;  /* some communicator of this process failed */
static bool we_initialized;     /* MPI_Init was ours, so MPI_Finalize is ours too */

/* MPI_Abort asks the launcher to end the job, and waits for it. A rank
 * whose launcher it cannot reach (a node cut off under srun: PMIx_Abort
 * waits on the node's slurmstepd, which waits on srun across the dead link)
 * would wait forever after it has said why it failed: this ends it. It runs
 * only inside finalize_at_exit, when the process is already exiting after
 * a failure (lockstep's calls have returned their status by then). */
enum { ABORT_WAIT_S = 5 };
_Static_assert(ABORT_WAIT_S == 5, "abort_watchdog's message says 5 s");

static void *abort_watchdog(void *arg) {
    (void)arg;
    sleep(ABORT_WAIT_S);
    /* a literal, written with write(2): no formatting in a process that is ending */
    static const char msg[] = "lockstep: mpi backend: MPI_Abort did not end this rank within 5 s (its launcher is "
                              "unreachable: a cut link or a lost node?); exiting\n";
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) { /* nothing more to say */
    }
    _exit(1);
}

static void finalize_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    if (atomic_load(&job_failed)) {
        fflush(stdout);
        fflush(stderr);
        pthread_t t;
        if (!pthread_create(&t, NULL, abort_watchdog, NULL)) pthread_detach(t);
        MPI_Abort(MPI_COMM_WORLD, 1); /* does not return: the launcher ends every rank */
    }
    if (we_initialized) MPI_Finalize();
}

static lk_status mpi_err(int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    return lk_error(LK_STATUS_REMOTE, "%s failed: MPI error: %s", what, s);
}

static lk_status mpi_init(lk_comm *c, const lk_comm_config *cfg) {
    (void)cfg;
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin) return lk_error(LK_STATUS_INVALID_USAGE, "mpi backend: MPI was already finalized in this process");
    if (!inited) {
        /* This backend issues OpenMPI's non-blocking all-reduce (libnbc),
         * so that comm_timeout bounds every wait, and libnbc's default
         * choice of algorithm ran 1.4-2.5x slower than the blocking
         * MPI_Allreduce at 1-16 MiB across two namespace nodes;
         * Rabenseifner's (reduce-scatter, then all-gather) ran 2.5-2.9x
         * faster than that default, at or above the blocking call
         * (bench/results/HISTORY.md, "The flat mpi backend"). Chosen here
         * unless the user chose (the variable, or mpirun --mca, which sets
         * it); other MPIs ignore the name. */
        setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return lk_error(LK_STATUS_INTERNAL, "mpi backend: MPI_Init_thread failed");
        if (provided < MPI_THREAD_SERIALIZED)
            lk_log_warn("mpi backend: MPI provides thread level %d < SERIALIZED; async collectives run on a helper thread", provided);
        we_initialized = true;
    }
    /* Registered even when the caller initialised MPI: after a failure only
     * an abort can end the job. */
    static bool registered;
    if (!registered) {
        atexit(finalize_at_exit);
        registered = true;
    }
    mpi_comm *m = lk_calloc(1, sizeof *m);
    if (!m) return LK_STATUS_OUT_OF_MEMORY;
    pthread_mutex_lock(&mpi_mu);
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->world);
    (void)exchange_pids(m, NULL);
    pthread_mutex_unlock(&mpi_mu);
    if (c->pg.world_size != m->world || c->pg.rank != m->rank) {
        if (strcmp(c->pg.source, "none") && strcmp(c->pg.source, "openmpi") && strcmp(c->pg.source, "pmi") &&
            strcmp(c->pg.source, "slurm")) {
            int w = c->pg.world_size, r = c->pg.rank, mr = m->rank, mw = m->world;
            LOCKED(MPI_Comm_free(&m->comm));
            lk_free(m->pids);
            lk_free(m->local);
            lk_free(m->hosts);
            lk_free(m->wranks);
            lk_free(m);
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "mpi backend: the environment says rank %d of %d (%s) but MPI says rank %d of %d; start the "
                            "job with mpirun/srun",
                            r, w, c->pg.source, mr, mw);
        }
        /* MPI is the authority on who we are. */
        c->pg.rank = m->rank;
        c->pg.world_size = m->world;
        if (c->pg.local_world_size > m->world) c->pg.local_world_size = m->world;
    }
    /* Who shares a node is what the host names say (the launcher's
     * variables give the local rank but not the node under every mapping). */
    if (m->num_nodes > 0 && m->world == c->pg.world_size) {
        if (m->node_rank != c->pg.node_rank || m->num_nodes != c->pg.num_nodes || m->local_rank != c->pg.local_rank ||
            m->local_world != c->pg.local_world_size)
            lk_log_debug("mpi backend: host names place rank %d as local rank %d/%d on node %d/%d (the %s variables said "
                         "%d/%d on node %d/%d)",
                         m->rank, m->local_rank, m->local_world, m->node_rank, m->num_nodes, c->pg.source,
                         c->pg.local_rank, c->pg.local_world_size, c->pg.node_rank, c->pg.num_nodes);
        c->pg.node_rank = m->node_rank;
        c->pg.num_nodes = m->num_nodes;
        c->pg.local_rank = m->local_rank;
        c->pg.local_world_size = m->local_world;
    }
    c->impl = m;
    return LK_STATUS_OK;
}

static void mpi_destroy(lk_comm *c) {
    mpi_comm *m = c->impl;
    if (!m) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && !atomic_load(&c->failed)) LOCKED(MPI_Comm_free(&m->comm));
    lk_aligned_free(m->ring); /* NULL after a failed swap, whose receives may still land in it */
    lk_free(m->pids);
    lk_free(m->local);
    lk_free(m->hosts);
    lk_free(m->wranks);
    lk_free(m);
    c->impl = NULL;
}

static MPI_Datatype mpi_type(lk_dtype dt) {
    switch (dt) {
    case LK_F32: return MPI_FLOAT;
    case LK_F64: return MPI_DOUBLE;
    case LK_I32: return MPI_INT32_T;
    case LK_I64: return MPI_INT64_T;
    case LK_U8: return MPI_UINT8_T;
    case LK_BF16:
    case LK_F16: return MPI_UINT16_T; /* moved as bits; reduced as f32 */
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(lk_reduce_op op) {
    switch (op) {
    case LK_REDUCE_MAX: return MPI_MAX;
    case LK_REDUCE_MIN: return MPI_MIN;
    default: return MPI_SUM;
    }
}

/* What a wait names: `label`, or the collective op. */
static void describe(const lk__coll *op, const char *label, char *what, size_t size) {
    if (label) snprintf(what, size, "%s", label);
    else lk__coll_describe(op, what, size);
}

/* For a timeout: the ranks on hosts other than this rank's, by host
 * ("rank 2, 3 on node1"), which this rank cannot check for life (their pids
 * are another machine's): when MPI says only that "some rank did not
 * arrive", the node and the ranks a user should look at (a dead node, a
 * cut link). Empty when every rank is on this host or names are unknown. */
static void remote_ranks_words(const mpi_comm *m, char *buf, size_t size) {
    buf[0] = 0;
    if (!m->hosts) return;
    const char *mine = m->hosts + (size_t)m->rank * HOSTW;
    char list[512];
    size_t n = 0;
    int listed = 0;
    list[0] = 0;
    for (int k = 0; k < m->world && n + 64 < sizeof list; k++) {
        const char *hk = m->hosts + (size_t)k * HOSTW;
        bool seen = !strcmp(hk, mine);
        for (int j = 0; j < k && !seen; j++) seen = !strcmp(m->hosts + (size_t)j * HOSTW, hk);
        if (seen) continue; /* this rank's host, or a host listed already */
        n += (size_t)snprintf(list + n, sizeof list - n, "%s rank", listed ? ";" : "");
        for (int j = k, first = 1; j < m->world && n + 64 < sizeof list; j++)
            if (!strcmp(m->hosts + (size_t)j * HOSTW, hk)) {
                n += (size_t)snprintf(list + n, sizeof list - n, "%s %d", first ? "" : ",", m->wranks[j]);
                first = 0;
            }
        n += (size_t)snprintf(list + n, sizeof list - n, " on %.47s", hk);
        listed++;
    }
    if (!listed) return;
    if (snprintf(buf, size,
                 ": the ranks on this host (%.47s) are alive, so look at the other node%s:%s (stopped, died, or its "
                 "link is down)",
                 mine, listed > 1 ? "s" : "", list) >= (int)size)
        buf[size - 1] = 0; /* cut: the hosts first named are the ones that matter */
}

/* Completes req, polling so the wait is bounded and abortable: tight
 * MPI_Test polling first (it drives MPI's progress engine, as a blocking
 * call would), yielding between polls after 2 ms. c's timeout, abort flag
 * and peers' pids bound it; the caller does not hold mpi_mu. Errors name
 * `label`, or op when label is NULL. */
static lk_status wait_req(lk_comm *c, MPI_Request *req, const lk__coll *op, const char *label) {
    char what[200];
    mpi_comm *m = c->impl;
    uint64_t t0 = 0, prev = 0, limit = (uint64_t)(c->timeout_s * 1e9), next_check = 0;
    /* Announced long work of another rank (lk_comm_long_work): MPI cannot
     * tell who is late, so this collective waits up to that work's limit. */
    bool long_wait = c->long_root >= 0 && op->seq == c->long_seq && c->pg.rank != c->long_root &&
                     c->long_limit_s > c->timeout_s;
    if (long_wait) limit = (uint64_t)(c->long_limit_s * 1e9);
    for (unsigned long spins = 0;; spins++) {
        int done = 0;
        int rc;
        LOCKED(rc = MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (rc != MPI_SUCCESS) {
            describe(op, label, what, sizeof what);
            return mpi_err(rc, what);
        }
        if (done) return LK_STATUS_OK;
        if ((spins & 255) != 255) continue;
        uint64_t now = lk_time_ns();
        if (!t0) t0 = prev = now;
        t0 += lk__paused_ns(now, &prev); /* this process was stopped: that time does not count */
        if (now - t0 < 2000000ull) continue;
        sched_yield();
        if (atomic_load(&c->abort_requested)) {
            describe(op, label, what, sizeof what);
            return lk_error(LK_STATUS_ABORTED, "%s: aborted while waiting", what);
        }
        if (m->local && now >= next_check) {
            next_check = now + 100000000ull;
            for (int k = 0; k < m->world; k++) {
                if (!m->local[k] || lk__pid_alive(m->pids[k])) continue;
                describe(op, label, what, sizeof what);
                return lk_error(LK_STATUS_REMOTE,
                                "%s failed: rank %d (pid %d) died (process gone: killed, crashed or exited) while rank %d "
                                "waited for it in MPI; the job cannot continue (mpirun ends it)",
                                what, k, m->pids[k], m->rank);
            }
        }
        if (now - t0 >= limit && long_wait) {
            describe(op, label, what, sizeof what);
            return lk_error(LK_STATUS_TIMEOUT,
                            "%s timed out after %.1f s in MPI: rank %d's %s took longer than %s (%g s), or some rank did "
                            "not arrive",
                            what, (double)(now - t0) * 1e-9, c->long_root, c->long_what, c->long_limit_name, c->long_limit_s);
        }
        if (now - t0 >= limit) {
            char words[LK_PARAM_STR + 96], remote[640];
            describe(op, label, what, sizeof what);
            remote_ranks_words(m, remote, sizeof remote);
            return lk_error(LK_STATUS_TIMEOUT, "%s timed out after %.1f s (%s) in MPI; some rank did not arrive%s", what,
                            (double)(now - t0) * 1e-9, lk__comm_timeout_words(c, words, sizeof words), remote);
        }
    }
}

static lk_status finish(lk_comm *c, MPI_Request *req, const lk__coll *op) { return wait_req(c, req, op, NULL); }

typedef struct {
    uint64_t seq, count;
    int32_t kind, dt, op, root;
} sig_t_;

static lk_status check_sig(lk_comm *c, mpi_comm *m, const lk__coll *op) {
    sig_t_ me = {op->seq, op->kind == LK__COLL_BARRIER ? 0 : op->count, op->kind, op->kind == LK__COLL_BARRIER ? 0 : op->dt,
                 (op->kind == LK__COLL_ALL_REDUCE || op->kind == LK__COLL_REDUCE_SCATTER) ? (int)op->op : 0,
                 (op->kind == LK__COLL_BROADCAST || op->kind == LK__COLL_GATHER || op->kind == LK__COLL_SCATTER) ? op->root : 0};
    sig_t_ *all = lk_malloc(sizeof me * (size_t)m->world);
    if (!all) return LK_STATUS_OUT_OF_MEMORY;
    MPI_Request req;
    int rc;
    LOCKED(rc = MPI_Iallgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, m->comm, &req));
    lk_status st = rc == MPI_SUCCESS ? finish(c, &req, op) : mpi_err(rc, "signature exchange");
    if (!st) {
        bool same = true;
        for (int k = 0; k < m->world; k++) same = same && !memcmp(&all[k], &me, sizeof me);
        if (!same) {
            char list[1536];
            size_t len = 0;
            for (int k = 0; k < m->world && len < sizeof list - 180; k++) {
                lk__coll o = {.kind = (lk__coll_kind)all[k].kind, .dt = (lk_dtype)all[k].dt, .op = (lk_reduce_op)all[k].op,
                              .root = all[k].root, .count = all[k].count, .seq = all[k].seq};
                char d[160];
                lk__coll_describe(&o, d, sizeof d);
                len += (size_t)snprintf(list + len, sizeof list - len, "%srank %d called %s", k ? "; " : "", k, d);
            }
            st = lk_error(LK_STATUS_INVALID_USAGE,
                          "collective mismatch (desync): the ranks issued different collectives at the same point: %s", list);
        }
    }
    lk_free(all);
    return st;
}

static void widen(float *dst, const uint16_t *src, size_t n, lk_dtype dt) {
    for (size_t i = 0; i < n; i++) dst[i] = dt == LK_BF16 ? lk_bf16_bits_to_f32(src[i]) : lk_f16_bits_to_f32(src[i]);
}
static void narrow(uint16_t *dst, const float *src, size_t n, lk_dtype dt) {
    for (size_t i = 0; i < n; i++) dst[i] = dt == LK_BF16 ? lk_f32_to_bf16_bits(src[i]) : lk_f32_to_f16_bits(src[i]);
}

/* The collectives of two ranks on two hosts (all-reduce, all-gather,
 * reduce-scatter), as a swap in messages small enough for MPI's eager
 * protocol, both directions at once.
 *
 * Why: OpenMPI's TCP transport sends a message above its eager limit
 * (btl_tcp_eager_limit, 64 KiB) by rendezvous: the receiver answers before
 * the data moves, and the sender goes on in pipelined fragments, each
 * waiting for control messages from the other side. When both ranks send
 * at once (a swap, or the recursive doubling of MPI_Allreduce), those
 * control messages travel on the one TCP connection behind the other
 * direction's data, and the two directions take turns instead of sharing
 * the full-duplex link. Measured between two namespace nodes at 50 Mbit/s,
 * 4.4 MB each way: 1.13-1.43 s with MPI_Isend/MPI_Irecv of the whole buffer
 * (MPI_Waitall), 0.72-0.97 s in 64,000-byte messages, 0.70-0.79 s with the
 * eager limit raised to 8 MiB, and 0.70-0.79 s for plain TCP sockets both
 * ways (the link's 0.70 s). Eager messages need no answer, so posting
 * every chunk's receive ahead and keeping a window of sends in flight
 * keeps both directions busy. An all-gather and a reduce-scatter of two
 * are the same swap (of this rank's block, of the peer's block of the
 * input), so they take it too.
 *
 * Chunk k of the output is written only after the send of chunk k
 * completed (the all-reduce sends and overwrites one buffer); receives
 * that are added land in a ring of 2 x SWAP_WINDOW chunk buffers, kept on
 * the communicator between calls (a fresh 2 MiB allocation per call
 * faulted its pages in again each time), those that are not (all-gather)
 * straight in the output. Both ranks add rank 0's value to rank 1's
 * (max/min compare them in that order too), so they hold the same bits,
 * which are also those of any MPI all-reduce or reduce-scatter of two (one
 * addition per element). Every wait is wait_req's: comm_timeout, abort and
 * the dead-peer check bound each chunk. */
enum { TAG_SWAP = 103, SWAP_WINDOW = 32 };

static size_t pair_chunk_bytes(void) {
    long v = lk_env_get_long("LK_COMM_MPI_PAIR_CHUNK", 32768);
    return v > 0 ? (size_t)v : 0;
}

/* reduce: the op adds (all-reduce, reduce-scatter: f32/f64, to which 16-bit
 * floats were widened); an all-gather moves any dtype MPI has a type for. */
static bool use_pair_swap(const mpi_comm *m, lk_dtype dt, size_t n, bool reduce) {
    if (!m->remote_pair || (reduce && dt != LK_F32 && dt != LK_F64) || mpi_type(dt) == MPI_DATATYPE_NULL) return false;
    size_t chunk = pair_chunk_bytes();
    return chunk >= 16 && n * lk_dtype_size(dt) >= ((size_t)64 << 10) && n * lk_dtype_size(dt) > chunk;
}

/* out: the n elements this rank sends. land: where the peer's n elements
 * go, or NULL: into the ring, then dst = rank 0's + rank 1's, where this
 * rank's own are `mine` (dst may be mine, and may be out). */
static lk_status pair_swap(lk_comm *c, mpi_comm *m, const lk__coll *op, const void *out, void *land_to, const void *mine,
                           void *dst, size_t n, lk_dtype dt) {
    size_t esz = lk_dtype_size(dt), per = pair_chunk_bytes() / esz, nch = (n + per - 1) / per;
    enum { RW = 2 * SWAP_WINDOW };
    int peer = 1 - m->rank, rc = MPI_SUCCESS;
    MPI_Datatype t = mpi_type(dt);
    size_t ring_need = land_to ? 0 : (nch < RW ? nch : RW) * per * esz;
    if (ring_need > m->ring_bytes) {
        lk_aligned_free(m->ring);
        m->ring_bytes = 0;
        m->ring = lk_aligned_alloc(64, ring_need);
        if (!m->ring) return LK_STATUS_OUT_OF_MEMORY;
        m->ring_bytes = ring_need;
    }
    char *ring = m->ring;
    MPI_Request rq[RW], sq[SWAP_WINDOW];
    const char *src = out;
#define LK_CHUNK_N(k) ((k) + 1 < nch ? per : n - (k) * per)
#define LK_LAND(k) (land_to ? (char *)land_to + (k) * per * esz : ring + ((k) % RW) * per * esz)
    for (size_t k = 0; k < nch && k < RW && rc == MPI_SUCCESS; k++)
        LOCKED(rc = MPI_Irecv(LK_LAND(k), (int)LK_CHUNK_N(k), t, peer, TAG_SWAP, m->comm, &rq[k]));
    for (size_t k = 0; k < nch && k < SWAP_WINDOW && rc == MPI_SUCCESS; k++)
        LOCKED(rc = MPI_Isend(src + k * per * esz, (int)LK_CHUNK_N(k), t, peer, TAG_SWAP, m->comm, &sq[k]));
    lk_status st = rc == MPI_SUCCESS ? LK_STATUS_OK : mpi_err(rc, lk__coll_kind_name(op->kind));
    for (size_t k = 0; k < nch && !st; k++) {
        st = wait_req(c, &rq[k % RW], op, NULL);
        if (!st) st = wait_req(c, &sq[k % SWAP_WINDOW], op, NULL); /* chunk k of dst may be written now */
        if (st) break;
        if (!land_to) {
            char *land = LK_LAND(k), *to = (char *)dst + k * per * esz;
            const char *own = (const char *)mine + k * per * esz;
            const void *two[2] = {m->rank == 0 ? (const void *)own : land, m->rank == 0 ? (const void *)land : own};
            lk__reduce(to, two, 2, LK_CHUNK_N(k), dt, op->op == LK_REDUCE_AVG ? LK_REDUCE_SUM : op->op, 1);
        }
        if (k + RW < nch)
            LOCKED(rc = MPI_Irecv(LK_LAND(k + RW), (int)LK_CHUNK_N(k + RW), t, peer, TAG_SWAP, m->comm, &rq[k % RW]));
        if (rc == MPI_SUCCESS && k + SWAP_WINDOW < nch)
            LOCKED(rc = MPI_Isend(src + (k + SWAP_WINDOW) * per * esz, (int)LK_CHUNK_N(k + SWAP_WINDOW), t, peer, TAG_SWAP,
                                  m->comm, &sq[k % SWAP_WINDOW]));
        if (rc != MPI_SUCCESS) st = mpi_err(rc, lk__coll_kind_name(op->kind));
    }
#undef LK_LAND
#undef LK_CHUNK_N
    /* On failure receives may still be posted into the ring: the
     * communicator has failed and the job ends by MPI_Abort (see the top of
     * the file), so the ring is kept (reachable, not a leak) rather than
     * freed under a receive MPI may still complete. */
    static void *_Atomic abandoned;
    if (st && ring) {
        atomic_store(&abandoned, ring);
        m->ring = NULL;
        m->ring_bytes = 0;
    }
    return st;
}

static lk_status reduce_call(lk_comm *c, mpi_comm *m, const lk__coll *op, const void *send, void *recv, size_t n,
                             lk_dtype dt, bool scatter) {
    MPI_Request req;
    int cnt = (int)n;
    int rc;
    if (use_pair_swap(m, dt, n, true)) {
        if (scatter) { /* block r of the input is rank r's: send the peer's, add to this rank's */
            size_t nb = n * lk_dtype_size(dt);
            LK_TRY(pair_swap(c, m, op, (const char *)send + (size_t)(1 - m->rank) * nb, NULL,
                             (const char *)send + (size_t)m->rank * nb, recv, n, dt));
        } else {
            if (send != recv) memcpy(recv, send, n * lk_dtype_size(dt));
            LK_TRY(pair_swap(c, m, op, recv, NULL, recv, recv, n, dt));
        }
        if (op->op == LK_REDUCE_AVG) lk__reduce_divide(recv, n, dt, m->world);
        return LK_STATUS_OK;
    }
    LOCKED(rc = scatter ? MPI_Ireduce_scatter_block(send, recv, cnt, mpi_type(dt), mpi_op(op->op), m->comm, &req)
                        : MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, cnt, mpi_type(dt), mpi_op(op->op),
                                         m->comm, &req));
    if (rc != MPI_SUCCESS) return mpi_err(rc, lk__coll_kind_name(op->kind));
    LK_TRY(finish(c, &req, op));
    if (op->op == LK_REDUCE_AVG) lk__reduce_divide(recv, n, dt, m->world);
    return LK_STATUS_OK;
}

static lk_status mpi_run(lk_comm *c, const lk__coll *op) {
    mpi_comm *m = c->impl;
    if (c->check_desync && m->world > 1) LK_TRY(check_sig(c, m, op));
    if (op->count > (size_t)INT32_MAX / (size_t)m->world)
        return lk_error(LK_STATUS_UNSUPPORTED, "mpi backend: count %zu exceeds MPI's int counts", op->count);
    MPI_Request req;
    int rc = MPI_SUCCESS, n = (int)op->count;
    MPI_Datatype t = mpi_type(op->dt);
    bool half = op->dt == LK_BF16 || op->dt == LK_F16;
    switch (op->kind) {
    case LK__COLL_BARRIER: LOCKED(rc = MPI_Ibarrier(m->comm, &req)); break;
    case LK__COLL_BROADCAST: LOCKED(rc = MPI_Ibcast(op->recv, n, t, op->root, m->comm, &req)); break;
    case LK__COLL_ALL_GATHER:
        if (use_pair_swap(m, op->dt, op->count, false)) {
            size_t nb = op->count * lk_dtype_size(op->dt);
            char *own = (char *)op->recv + (size_t)m->rank * nb;
            if (own != (const char *)op->send) memcpy(own, op->send, nb);
            return pair_swap(c, m, op, own, (char *)op->recv + (size_t)(1 - m->rank) * nb, NULL, NULL, op->count, op->dt);
        }
        LOCKED(rc = MPI_Iallgather((const char *)op->recv + (size_t)m->rank * op->count * lk_dtype_size(op->dt) == (const char *)op->send
                                ? MPI_IN_PLACE
                                : op->send,
                            n, t, op->recv, n, t, m->comm, &req));
        break;
    case LK__COLL_GATHER: LOCKED(rc = MPI_Igather(op->send, n, t, op->recv, n, t, op->root, m->comm, &req)); break;
    case LK__COLL_SCATTER: LOCKED(rc = MPI_Iscatter(op->send, n, t, op->recv, n, t, op->root, m->comm, &req)); break;
    case LK__COLL_ALL_REDUCE:
    case LK__COLL_REDUCE_SCATTER: {
        bool scatter = op->kind == LK__COLL_REDUCE_SCATTER;
        if (!op->count) return LK_STATUS_OK;
        if (!half) return reduce_call(c, m, op, op->send, op->recv, op->count, op->dt, scatter);
        size_t in_n = scatter ? op->count * (size_t)m->world : op->count;
        float *in = lk_malloc(in_n * sizeof(float)), *out = scatter ? lk_malloc(op->count * sizeof(float)) : in;
        if (!in || !out) {
            lk_free(in);
            if (out != in) lk_free(out);
            return LK_STATUS_OUT_OF_MEMORY;
        }
        widen(in, op->send, in_n, op->dt);
        lk_status st = reduce_call(c, m, op, in, out, op->count, LK_F32, scatter);
        if (!st) narrow(op->recv, out, op->count, op->dt);
        lk_free(in);
        if (out != in) lk_free(out);
        return st;
    }
    default: return lk_error(LK_STATUS_INTERNAL, "mpi: unknown collective %d", (int)op->kind);
    }
    if (rc != MPI_SUCCESS) return mpi_err(rc, lk__coll_kind_name(op->kind));
    return finish(c, &req, op);
}

static void mpi_abort_cb(lk_comm *c, const char *reason) {
    (void)c;
    (void)reason; /* MPI cannot cancel collectives; waits see abort_requested and return */
    atomic_store(&job_failed, 1); /* and the exit aborts the job instead of finalizing */
}

/* A group: MPI_Comm_split of the parent's communicator (ranks ordered by
 * key, then parent rank, as lk_comm_split worked out). MPI_Comm_split
 * blocks and has no non-blocking form, and it runs under mpi_mu, which no
 * wait's timeout or dead-peer check can interrupt: a peer that died or
 * stopped before entering it would wedge this rank (and every MPI call of
 * its other threads) for good. So the ranks first meet in an MPI_Ibarrier
 * waited for with the parent's bounds (comm_timeout, abort, the dead-peer
 * check that names the rank), without the lock held; only ranks known to
 * have reached the split then enter it, and the new group's pid exchange
 * is bounded the same way. What stays unbounded is a peer dying in the
 * instants between its barrier and its MPI_Comm_split (mpirun then ends
 * the job) or being stopped exactly there. */
static lk_status mpi_split(lk_comm *parent, lk_comm *child, int colour, int key) {
    static const lk__coll arrive = {.kind = LK__COLL_BARRIER, .seq = UINT64_MAX};
    mpi_comm *pm = parent->impl;
    MPI_Comm nc = MPI_COMM_NULL;
    MPI_Request req;
    int rc;
    if (lk_env_get_long("LK_COMM_TEST_SPLIT_KILL", -1) == parent->pg.rank) raise(SIGKILL); /* tests only */
    LOCKED(rc = MPI_Ibarrier(pm->comm, &req));
    if (rc != MPI_SUCCESS) return mpi_err(rc, "lk_comm_split (MPI_Ibarrier)");
    LK_TRY(wait_req(parent, &req, &arrive, "lk_comm_split (the ranks' arrival before MPI_Comm_split)"));
    LOCKED(rc = MPI_Comm_split(pm->comm, colour < 0 ? MPI_UNDEFINED : colour, key, &nc));
    if (rc != MPI_SUCCESS) return mpi_err(rc, "lk_comm_split (MPI_Comm_split)");
    if (!child) {
        if (nc != MPI_COMM_NULL) LOCKED(MPI_Comm_free(&nc));
        return LK_STATUS_OK;
    }
    mpi_comm *m = lk_calloc(1, sizeof *m);
    if (!m) {
        LOCKED(MPI_Comm_free(&nc));
        return LK_STATUS_OUT_OF_MEMORY;
    }
    m->comm = nc;
    pthread_mutex_lock(&mpi_mu);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->world);
    pthread_mutex_unlock(&mpi_mu);
    lk_status st = exchange_pids(m, parent);
    if (st) {
        /* a peer failed the exchange: MPI_Comm_free is collective over the
         * group, so the communicator is left to the job's abort */
        lk_free(m->pids);
        lk_free(m->local);
        lk_free(m->hosts);
        lk_free(m->wranks);
        lk_free(m);
        return st;
    }
    if (m->rank != child->pg.rank || m->world != child->pg.world_size) {
        int mr = m->rank, mw = m->world;
        LOCKED(MPI_Comm_free(&m->comm));
        lk_free(m->pids);
        lk_free(m->local);
        lk_free(m->hosts);
        lk_free(m->wranks);
        lk_free(m);
        return lk_error(LK_STATUS_INTERNAL, "lk_comm_split: MPI made rank %d of %d, lockstep expected rank %d of %d", mr, mw,
                        child->pg.rank, child->pg.world_size);
    }
    child->impl = m;
    return LK_STATUS_OK;
}

/* ---- point-to-point ---- */
enum { TAG_HDR = 101, TAG_DATA = 102 };

typedef struct {
    uint64_t seq, count;
    int32_t dt, pad;
} p2p_hdr;

typedef struct {
    MPI_Request req[2]; /* send: header, data; receive: header, then data */
    p2p_hdr hdr;        /* what this side sends, or receives from the peer */
} p2p_priv;
_Static_assert(sizeof(p2p_priv) <= sizeof(((lk__p2p *)0)->priv), "lk__p2p.priv is too small for MPI's requests");

static lk_status mpi_p2p_start(lk_comm *c, lk__p2p *op) {
    mpi_comm *m = c->impl;
    p2p_priv *p = (p2p_priv *)op->priv;
    char what[200];
    if (op->count > (size_t)INT32_MAX) {
        lk__p2p_describe(c, op, what, sizeof what);
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: count exceeds MPI's int counts", what);
    }
    uint64_t now = lk_time_ns();
    op->t0 = op->prev = now;
    op->next_check = now + 100000000ull;
    p->req[0] = p->req[1] = MPI_REQUEST_NULL;
    int rc;
    if (op->send) {
        p->hdr = (p2p_hdr){op->seq, op->count, (int32_t)op->dt, 0};
        pthread_mutex_lock(&mpi_mu);
        rc = MPI_Issend(&p->hdr, (int)sizeof p->hdr, MPI_BYTE, op->peer, TAG_HDR, m->comm, &p->req[0]);
        if (rc == MPI_SUCCESS && op->count)
            rc = MPI_Isend(op->buf, (int)op->count, mpi_type(op->dt), op->peer, TAG_DATA, m->comm, &p->req[1]);
        pthread_mutex_unlock(&mpi_mu);
    } else {
        LOCKED(rc = MPI_Irecv(&p->hdr, (int)sizeof p->hdr, MPI_BYTE, op->peer, TAG_HDR, m->comm, &p->req[0]));
    }
    if (rc != MPI_SUCCESS) {
        lk__p2p_describe(c, op, what, sizeof what);
        return mpi_err(rc, what);
    }
    return LK_STATUS_OK;
}

static lk_status mpi_p2p_progress(lk_comm *c, lk__p2p *op, bool *done) {
    mpi_comm *m = c->impl;
    p2p_priv *p = (p2p_priv *)op->priv;
    char what[200];
    int rc = MPI_SUCCESS, flag = 0;
    if (op->send) {
        /* One at a time, so a timeout can tell which part is missing (a
         * completed request becomes MPI_REQUEST_NULL, which tests done). */
        int f0 = 0, f1 = 0;
        LOCKED(rc = MPI_Test(&p->req[0], &f0, MPI_STATUS_IGNORE));
        if (rc == MPI_SUCCESS) LOCKED(rc = MPI_Test(&p->req[1], &f1, MPI_STATUS_IGNORE));
        flag = f0 && f1;
    } else if (op->phase == 0) {
        LOCKED(rc = MPI_Test(&p->req[0], &flag, MPI_STATUS_IGNORE));
        if (rc == MPI_SUCCESS && flag) {
            if (p->hdr.seq != op->seq || p->hdr.count != op->count || p->hdr.dt != (int32_t)op->dt)
                return lk__p2p_mismatch(c, op, (lk_dtype)p->hdr.dt, (size_t)p->hdr.count);
            op->phase = 1;
            op->progressed = true;
            if (op->count)
                LOCKED(rc = MPI_Irecv(op->buf, (int)op->count, mpi_type(op->dt), op->peer, TAG_DATA, m->comm, &p->req[1]));
            flag = 0;
        }
    }
    if (rc == MPI_SUCCESS && !op->send && op->phase == 1) LOCKED(rc = MPI_Test(&p->req[1], &flag, MPI_STATUS_IGNORE));
    if (rc != MPI_SUCCESS) {
        lk__p2p_describe(c, op, what, sizeof what);
        return mpi_err(rc, what);
    }
    if (flag && (op->send || op->phase == 1)) {
        *done = true;
        return LK_STATUS_OK;
    }
    uint64_t now = lk_time_ns();
    op->t0 += lk__paused_ns(now, &op->prev);
    if (op->progressed) op->t0 = now;
    if (now < op->next_check) return LK_STATUS_OK;
    op->next_check = now + 100000000ull;
    lk__p2p_describe(c, op, what, sizeof what);
    if (atomic_load(&c->abort_requested)) return lk_error(LK_STATUS_ABORTED, "%s: aborted while waiting", what);
    if (m->local && m->local[op->peer] && !lk__pid_alive(m->pids[op->peer]))
        return lk_error(LK_STATUS_REMOTE,
                        "%s failed: rank %d (pid %d) died (process gone: killed, crashed or exited) while rank %d waited "
                        "for it in MPI; the job cannot continue (mpirun ends it)",
                        what, op->peer, m->pids[op->peer], m->rank);
    if ((double)(now - op->t0) * 1e-9 >= c->timeout_s) {
        char words[LK_PARAM_STR + 96];
        const char *why = op->send ? (p->req[0] != MPI_REQUEST_NULL ? "its receive was never posted"
                                                                   : "its receive was posted but took no data")
                          : op->phase == 0 ? "the matching send was never posted"
                                           : "the data did not arrive";
        return lk_error(LK_STATUS_TIMEOUT, "%s timed out after %.1f s (%s) in MPI: rank %d: %s", what,
                        (double)(now - op->t0) * 1e-9, lk__comm_timeout_words(c, words, sizeof words), op->peer, why);
    }
    return LK_STATUS_OK;
}

const lk__comm_vtable lk__comm_mpi = {
    .name = "mpi",
    .init = mpi_init,
    .destroy = mpi_destroy,
    .run = mpi_run,
    .abort = mpi_abort_cb,
    .split = mpi_split,
    .p2p_start = mpi_p2p_start,
    .p2p_progress = mpi_p2p_progress,
};

/* The raw loop's bound. OpenMPI's blocking calls poll without yielding
 * (mpi_yield_when_idle is off unless mpirun knows the node is
 * oversubscribed), so where ranks outnumber the free cores, as 4 ranks on
 * the namespace cluster's 2 shared cores, each message waits for the
 * receiver's next time slice: one MPI_Allreduce took 40-180 ms there at any
 * size (0.6-12 ms with mpi_yield_when_idle=1), and a loop sized from a
 * faster backend's time ran for many minutes, which looked like a hang.
 * A blocking call cannot be given a timeout, so a watchdog thread ends the
 * process with a message once limit_s has passed (mpirun then ends the
 * job); _exit is all it may call while the main thread is inside MPI. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    double limit_s;
    size_t bytes;
    int iters, wrank;
} raw_watch;

static void *raw_watchdog(void *arg) {
    raw_watch *w = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double end = (double)until.tv_sec + 1e-9 * (double)until.tv_nsec + w->limit_s;
    until.tv_sec = (time_t)end;
    until.tv_nsec = (long)((end - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    while (!w->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->cv, &w->mu, &until);
    if (!w->done) {
        char host[64] = "";
        gethostname(host, sizeof host - 1);
        fprintf(stderr,
                "bench comm: raw MPI_Allreduce (%zu bytes x %d calls) did not finish within %g s on rank %d (host "
                "%s): OpenMPI's blocking calls poll without yielding, so ranks that outnumber the free cores wait "
                "for each other's time slices (run mpirun with --mca mpi_yield_when_idle 1), or a rank is gone; "
                "ending this rank\n",
                w->bytes, w->iters, w->limit_s, w->wrank, host);
        fflush(stderr);
        _exit(3);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

lk_status lk__mpi_raw_allreduce_us(size_t bytes, int iters, double limit_s, double *us) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) return lk_error(LK_STATUS_INVALID_USAGE, "raw MPI bench: MPI is not initialised (create an mpi comm first)");
    size_t n = bytes / sizeof(float);
    float *buf = lk_aligned_alloc(64, n * sizeof(float) + 64);
    if (!buf) return LK_STATUS_OUT_OF_MEMORY;
    memset(buf, 0, n * sizeof(float)); /* zeros: the sum stays finite however many iterations */
    raw_watch w = {.done = false, .limit_s = limit_s, .bytes = bytes, .iters = iters, .wrank = -1};
    MPI_Comm_rank(MPI_COMM_WORLD, &w.wrank);
    pthread_t dog;
    bool watched = false;
    if (limit_s > 0) {
        pthread_mutex_init(&w.mu, NULL);
        pthread_cond_init(&w.cv, NULL);
        watched = pthread_create(&dog, NULL, raw_watchdog, &w) == 0;
        if (!watched) {
            pthread_mutex_destroy(&w.mu);
            pthread_cond_destroy(&w.cv);
            lk_aligned_free(buf);
            return lk_error(LK_STATUS_INTERNAL, "raw MPI bench: cannot start the watchdog thread");
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* warm-up */
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double t = (MPI_Wtime() - t0) / iters * 1e6;
    MPI_Allreduce(&t, us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (watched) {
        pthread_mutex_lock(&w.mu);
        w.done = true;
        pthread_cond_signal(&w.cv);
        pthread_mutex_unlock(&w.mu);
        pthread_join(dog, NULL);
        pthread_mutex_destroy(&w.mu);
        pthread_cond_destroy(&w.cv);
    }
    lk_aligned_free(buf);
    return LK_STATUS_OK;
}

lk_status lk__mpi_raw_pingpong_us(size_t bytes, int iters, double *us) {
    int inited = 0, rank = 0;
    MPI_Initialized(&inited);
    if (!inited) return lk_error(LK_STATUS_INVALID_USAGE, "raw MPI bench: MPI is not initialised (create an mpi comm first)");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    unsigned char *buf = lk_aligned_alloc(64, bytes + 64);
    if (!buf) return LK_STATUS_OUT_OF_MEMORY;
    memset(buf, 0, bytes);
    double t = 0;
    for (int pass = 0; pass < 2; pass++) { /* a warm-up round trip, then the timed ones */
        int n = pass ? iters : 1;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < n; i++) {
            if (rank == 0) {
                MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 7, MPI_COMM_WORLD);
                MPI_Recv(buf, (int)bytes, MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (rank == 1) {
                MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
            }
        }
        t = (MPI_Wtime() - t0) / n / 2 * 1e6; /* one way */
    }
    MPI_Allreduce(&t, us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    lk_aligned_free(buf);
    return LK_STATUS_OK;
}

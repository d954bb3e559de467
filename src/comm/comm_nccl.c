/* The nccl communicator: collectives on GPU memory through NCCL, for ranks
 * that each drive one GPU. Its unique id is made by rank 0 and broadcast
 * through a host communicator (shm on one node, mpi across nodes) that the
 * backend owns for its life; collectives run on a communication stream
 * that waits, through an event, for the work already queued on the GPU's
 * compute stream (device/gpu.h's lk__cuda_stream: the producer of the
 * buffer), and the compute stream waits, through an event back, for the
 * collective before the work queued after it (the optimizer reading the
 * reduced gradient). The communicator's timeout and abort
 * semantics are kept: NCCL runs non-blocking, completion and
 * ncclCommGetAsyncError are polled against a deadline, and a timeout or an
 * abort ends in ncclCommAbort with an error — never a silent hang.
 *
 * The bootstrap (first half) is plain bytes and built everywhere; the
 * backend (second half) only with LK_HAVE_NCCL. Status: the bootstrap is
 * unit-tested; the collectives have not run on a GPU yet (docs/GPU.md). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"
#include "comm/nccl_boot.h"

#define BOOT_MAGIC 0x4c4b4e43u /* "LKNC" */
#define BOOT_VERSION 1u

typedef struct {
    uint32_t magic, version;
    int32_t status; /* rank 0's lk_status making the id; 0: id is valid */
    char msg[372];  /* rank 0's error message when status != 0 */
    unsigned char id[LK__NCCL_ID_BYTES];
} boot_record; /* 512 bytes, the same layout on every rank of one build */

lk_status lk__nccl_bootstrap(const lk__nccl_transport *t, int rank, lk__nccl_id_fn make_id, void *id_ctx,
                             unsigned char id[LK__NCCL_ID_BYTES]) {
    boot_record r;
    memset(&r, 0, sizeof r);
    lk_status made = LK_STATUS_OK;
    if (rank == 0) {
        r.magic = BOOT_MAGIC;
        r.version = BOOT_VERSION;
        made = make_id(id_ctx, r.id);
        if (made) {
            r.status = (int32_t)made;
            snprintf(r.msg, sizeof r.msg, "%s", lk_last_error());
        }
    }
    lk_status st = t->broadcast(t->ctx, &r, sizeof r, 0);
    if (st)
        return lk_error(st, "NCCL id bootstrap: broadcast from rank 0 failed on rank %d: %s", rank, lk_last_error());
    if (rank == 0) {
        if (made) return lk_error(made, "NCCL id bootstrap: rank 0 could not create the NCCL unique id: %s", r.msg);
        memcpy(id, r.id, LK__NCCL_ID_BYTES);
        return LK_STATUS_OK;
    }
    if (r.magic != BOOT_MAGIC || r.version != BOOT_VERSION)
        return lk_error(LK_STATUS_INVALID_USAGE,
                        "NCCL id bootstrap: rank %d received bytes from rank 0 that are not an NCCL id record (magic "
                        "%08x version %u, expected %08x version %u): do all ranks run the same lockstep with the nccl "
                        "backend?",
                        rank, (unsigned)r.magic, (unsigned)r.version, BOOT_MAGIC, BOOT_VERSION);
    if (r.status)
        return lk_error(LK_STATUS_REMOTE, "NCCL id bootstrap: rank 0 could not create the NCCL unique id: %.*s", (int)sizeof r.msg,
                        r.msg);
    memcpy(id, r.id, LK__NCCL_ID_BYTES);
    return LK_STATUS_OK;
}

#ifdef LK_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "device/gpu.h"

_Static_assert(sizeof(ncclUniqueId) == LK__NCCL_ID_BYTES, "ncclUniqueId size changed");

typedef struct {
    lk_comm *host; /* bootstrap, and tells peers this rank aborted */
    ncclComm_t nc;
    cudaStream_t stream;  /* communication stream */
    cudaStream_t compute; /* the GPU's compute stream (not owned) */
    cudaEvent_t produced, done;
    int gpu;
    void *scratch; /* one float on the GPU: barrier's all-reduce */
    bool dead;     /* ncclCommAbort was called: destroy must not finalize */
    /* Point-to-point in device memory: NCCL calls are made in the order the
     * messages started here (tickets), whatever order their headers came in. */
    _Atomic uint64_t p2p_tickets, p2p_next;
    /* Point-to-point groups not yet issued (lk_comm_p2p_group): one ticket
     * each, their NCCL calls made together once every member's header is
     * through. The p2p thread's alone. */
    struct p2p_group {
        uint64_t id, ticket; /* id 0: a free slot */
        int n, joined, ready; /* members still to come in the NCCL group, started, headers through */
        lk__p2p *op[LK__P2P_GROUP_MAX];
    } groups[8];
} nccl_impl;

static lk_status host_broadcast(void *ctx, void *buf, size_t bytes, int root) {
    return lk_comm_broadcast((lk_comm *)ctx, buf, bytes, LK_U8, root);
}

static lk_status make_id(void *ctx, unsigned char id[LK__NCCL_ID_BYTES]) {
    (void)ctx;
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return lk_error(LK_STATUS_DEVICE, "ncclGetUniqueId: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
    memcpy(id, u.internal, LK__NCCL_ID_BYTES);
    return LK_STATUS_OK;
}

static void sleep_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* Waits until NCCL's state leaves ncclInProgress and, when `ev` is given,
 * the event has completed, within the communicator's timeout. On timeout or
 * abort request: ncclCommAbort (which also unblocks the GPU) and an error. */
static lk_status wait_nccl(lk_comm *c, nccl_impl *m, cudaEvent_t ev, const char *what) {
    uint64_t start = lk_time_ns(), prev = start;
    for (;;) {
        ncclResult_t as;
        ncclResult_t r = ncclCommGetAsyncError(m->nc, &as);
        if (r != ncclSuccess) as = r;
        if (as != ncclSuccess && as != ncclInProgress) {
            ncclCommAbort(m->nc), m->dead = true;
            return lk_error(LK_STATUS_REMOTE, "nccl: %s failed on rank %d: %s (%s); the communicator was aborted", what,
                            c->pg.rank, ncclGetErrorString(as), ncclGetLastError(NULL));
        }
        bool ready = as == ncclSuccess;
        if (ready && ev) {
            cudaError_t e = cudaEventQuery(ev);
            if (e != cudaSuccess && e != cudaErrorNotReady) {
                cudaGetLastError();
                ncclCommAbort(m->nc), m->dead = true;
                return lk_error(LK_STATUS_DEVICE, "nccl: %s on rank %d: %s", what, c->pg.rank, cudaGetErrorString(e));
            }
            ready = e == cudaSuccess;
        }
        if (ready) return LK_STATUS_OK;
        uint64_t now = lk_time_ns();
        start += lk__paused_ns(now, &prev); /* a stopped process does not time out on resume */
        if (atomic_load(&c->abort_requested)) {
            ncclCommAbort(m->nc), m->dead = true;
            return lk_error(LK_STATUS_ABORTED, "nccl: %s on rank %d: aborted (lk_comm_abort)", what, c->pg.rank);
        }
        if ((double)(now - start) * 1e-9 > c->timeout_s) {
            char words[LK_PARAM_STR + 96];
            ncclCommAbort(m->nc), m->dead = true;
            return lk_error(LK_STATUS_TIMEOUT,
                            "nccl: %s on rank %d did not complete within %.0f s (%s): a peer died, hangs or "
                            "is in another collective; the communicator was aborted",
                            what, c->pg.rank, c->timeout_s, lk__comm_timeout_words(c, words, sizeof words));
        }
        sleep_us(50);
    }
}

static lk_status setup(lk_comm *c, lk_comm *host, int gpu);

static lk_status nccl_init(lk_comm *c, const lk_comm_config *cfg) {
    int visible = lk__cuda_visible();
    if (visible == 0)
        return lk_error(LK_STATUS_UNSUPPORTED, "lk_comm_create: backend 'nccl' needs a CUDA device on every rank, but rank "
                        "%d has none: %s (use shm or mpi)", c->pg.rank, lk__cuda_why_none());
    int ids[LK__GPU_MAX], n = visible < LK__GPU_MAX ? visible : LK__GPU_MAX, gpu;
    for (int i = 0; i < n; i++) ids[i] = i;
    LK_TRY(lk__gpu_for_rank(ids, n, c->pg.local_rank, &gpu));
    /* The host communicator: its own shm segment name, so it never meets a
     * trainer's shm communicator of the same job. */
    lk_comm_config hc = *cfg;
    char job[128];
    snprintf(job, sizeof job, "%s-nccl", c->job_id);
    hc.job_id = job;
    hc.pg = &c->pg;
    hc.shared_bytes = 1 << 20;
    hc.backend = c->pg.world_size == 1 ? "self" : c->pg.local_world_size == c->pg.world_size ? "shm" : "mpi";
    lk_comm *host = NULL;
    LK_TRY(c->make_host(&hc, &host));
    return setup(c, host, gpu);
}

/* The NCCL communicator of c on GPU `gpu`, its id made by c's rank 0 and
 * sent over `host` (which it owns from here on, on failure too: freed). */
static lk_status setup(lk_comm *c, lk_comm *host, int gpu) {
    nccl_impl *m = lk_calloc(1, sizeof *m);
    if (!m) {
        lk_comm_abort(host, "out of memory"), lk_comm_free(host);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    m->gpu = gpu;
    m->host = host;
    lk_status st = LK_STATUS_OK;
    unsigned char id[LK__NCCL_ID_BYTES];
    if (!st) {
        lk__nccl_transport t = {m->host, host_broadcast};
        st = lk__nccl_bootstrap(&t, c->pg.rank, make_id, NULL, id);
    }
    if (!st && cudaSetDevice(gpu) != cudaSuccess) {
        cudaGetLastError();
        st = lk_error(LK_STATUS_DEVICE, "nccl: rank %d cannot select GPU %d", c->pg.rank, gpu);
    }
    if (!st) st = lk__cuda_stream(gpu, &m->compute);
    if (!st && (cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking) != cudaSuccess ||
                cudaEventCreateWithFlags(&m->produced, cudaEventDisableTiming) != cudaSuccess ||
                cudaEventCreateWithFlags(&m->done, cudaEventDisableTiming) != cudaSuccess ||
                cudaMalloc(&m->scratch, sizeof(float)) != cudaSuccess)) {
        cudaGetLastError();
        st = lk_error(LK_STATUS_DEVICE, "nccl: rank %d: cannot create its stream, events or scratch on GPU %d",
                      c->pg.rank, gpu);
    }
    if (!st) {
        ncclConfig_t ncfg = NCCL_CONFIG_INITIALIZER;
        ncfg.blocking = 0; /* so init and collectives can be bounded by the timeout */
        ncclUniqueId u;
        memcpy(u.internal, id, sizeof u.internal);
        ncclResult_t r = ncclCommInitRankConfig(&m->nc, c->pg.world_size, u, c->pg.rank, &ncfg);
        if (r != ncclSuccess && r != ncclInProgress)
            st = lk_error(LK_STATUS_DEVICE, "nccl: ncclCommInitRank on rank %d (GPU %d): %s", c->pg.rank, gpu,
                          ncclGetErrorString(r));
        else {
            c->impl = m;
            st = wait_nccl(c, m, NULL, "communicator init");
        }
    }
    if (st) {
        char msg[1024]; /* the cleanup below may set errors of its own */
        snprintf(msg, sizeof msg, "%s", lk_last_error());
        if (m->nc && !m->dead) ncclCommAbort(m->nc); /* abort frees it; never destroy after */
        if (m->scratch) cudaFree(m->scratch);
        if (m->done) cudaEventDestroy(m->done);
        if (m->produced) cudaEventDestroy(m->produced);
        if (m->stream) cudaStreamDestroy(m->stream);
        if (m->host) lk_comm_abort(m->host, lk_last_error()), lk_comm_free(m->host);
        lk_free(m);
        c->impl = NULL;
        return lk_error(st, "%s", msg);
    }
    return LK_STATUS_OK;
}

/* A group: the host communicator is split the same way (every rank of the
 * parent takes part), and the group's NCCL communicator is a fresh one over
 * a fresh unique id sent over the split host (which NCCL of every version
 * has; ncclCommSplit would share the parent's resources, 2.18 and later),
 * on the GPU the parent's rank drives. */
static lk_status nccl_split(lk_comm *parent, lk_comm *child, int colour, int key) {
    nccl_impl *pm = parent->impl;
    lk_comm *host = NULL;
    LK_TRY(lk_comm_split(pm->host, colour, key, &host));
    if (!child) return LK_STATUS_OK;
    return setup(child, host, pm->gpu);
}

static void nccl_destroy(lk_comm *c) {
    nccl_impl *m = c->impl;
    if (!m) return;
    cudaSetDevice(m->gpu);
    if (!m->dead) {
        /* Finalize flushes outstanding work, bounded like a collective (a
         * timeout there aborts, which frees the communicator). */
        ncclResult_t r = ncclCommFinalize(m->nc);
        if (r != ncclSuccess && r != ncclInProgress) ncclCommAbort(m->nc), m->dead = true;
        else (void)wait_nccl(c, m, NULL, "finalize");
    }
    if (!m->dead) ncclCommDestroy(m->nc); /* after ncclCommAbort the communicator is already gone */
    cudaFree(m->scratch);
    cudaEventDestroy(m->done);
    cudaEventDestroy(m->produced);
    cudaStreamDestroy(m->stream);
    lk_comm_free(m->host);
    lk_free(m);
    c->impl = NULL;
}

static bool nccl_type(lk_dtype dt, ncclDataType_t *out) {
    switch (dt) {
    case LK_F32: *out = ncclFloat32; return true;
    case LK_F64: *out = ncclFloat64; return true;
    case LK_F16: *out = ncclFloat16; return true;
    case LK_BF16: *out = ncclBfloat16; return true;
    case LK_I32: *out = ncclInt32; return true;
    case LK_I64: *out = ncclInt64; return true;
    case LK_U8: *out = ncclUint8; return true;
    default: return false;
    }
}

static ncclRedOp_t nccl_op(lk_reduce_op op) {
    switch (op) {
    case LK_REDUCE_AVG: return ncclAvg;
    case LK_REDUCE_MAX: return ncclMax;
    case LK_REDUCE_MIN: return ncclMin;
    default: return ncclSum;
    }
}

/* Whether p is host memory to the CUDA runtime (plain malloc, or pinned):
 * not a buffer NCCL can take. */
static bool host_memory(const void *p) {
    if (!p) return true;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* an unknown pointer is host memory to older runtimes */
        return true;
    }
    return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}

/* A collective on host memory — the trainer's logged metrics, SyncBatchNorm's
 * per-channel sums, join's flags, early stopping's decision — goes through
 * the host communicator this backend owns: every rank issues the same
 * collectives in the same order on this communicator, so they meet there in
 * the same order too, and callers need not know which memory NCCL takes. */
static lk_status host_run(nccl_impl *m, const lk__coll *op) {
    switch (op->kind) {
    case LK__COLL_ALL_REDUCE:
        if (op->send != op->recv && op->count)
            memcpy(op->recv, op->send, op->count * lk_dtype_size(op->dt));
        return lk_comm_all_reduce(m->host, op->recv, op->count, op->dt, op->op);
    case LK__COLL_BROADCAST: return lk_comm_broadcast(m->host, op->recv, op->count, op->dt, op->root);
    case LK__COLL_ALL_GATHER: return lk_comm_all_gather(m->host, op->send, op->recv, op->count, op->dt);
    case LK__COLL_REDUCE_SCATTER: return lk_comm_reduce_scatter(m->host, op->send, op->recv, op->count, op->dt, op->op);
    case LK__COLL_GATHER: return lk_comm_gather(m->host, op->send, op->recv, op->count, op->dt, op->root);
    case LK__COLL_SCATTER: return lk_comm_scatter(m->host, op->send, op->recv, op->count, op->dt, op->root);
    default: return lk_comm_barrier(m->host);
    }
}

static lk_status nccl_run(lk_comm *c, const lk__coll *op) {
    nccl_impl *m = c->impl;
    char what[160];
    lk__coll_describe(op, what, sizeof what);
    if (m->dead) return lk_error(LK_STATUS_ABORTED, "nccl: %s: the communicator was aborted earlier", what);
    if (op->kind != LK__COLL_BARRIER && host_memory(op->send) && host_memory(op->recv)) return host_run(m, op);
    ncclDataType_t t = ncclFloat32;
    if (op->kind != LK__COLL_BARRIER && !nccl_type(op->dt, &t))
        return lk_error(LK_STATUS_UNSUPPORTED, "nccl: %s: dtype %s has no NCCL type", what, lk_dtype_name(op->dt));
    if (cudaSetDevice(m->gpu) != cudaSuccess) return lk_error(LK_STATUS_DEVICE, "nccl: %s: cannot select GPU %d", what, m->gpu);
    /* Order after the producer: whatever the compute stream has queued
     * (kernels writing the buffer, copies into it) finishes first. The
     * legacy stream 0 would not do: the compute stream is non-blocking, so
     * nothing on it is ordered with stream 0. */
    if (cudaEventRecord(m->produced, m->compute) != cudaSuccess ||
        cudaStreamWaitEvent(m->stream, m->produced, 0) != cudaSuccess) {
        cudaGetLastError();
        return lk_error(LK_STATUS_DEVICE, "nccl: %s: cannot order the communication stream after the producer", what);
    }
    ncclResult_t r;
    switch (op->kind) {
    case LK__COLL_ALL_REDUCE:
        r = ncclAllReduce(op->send, op->recv, op->count, t, nccl_op(op->op), m->nc, m->stream);
        break;
    case LK__COLL_BROADCAST: r = ncclBroadcast(op->send, op->recv, op->count, t, op->root, m->nc, m->stream); break;
    case LK__COLL_ALL_GATHER: r = ncclAllGather(op->send, op->recv, op->count, t, m->nc, m->stream); break;
    case LK__COLL_REDUCE_SCATTER:
        r = ncclReduceScatter(op->send, op->recv, op->count, t, nccl_op(op->op), m->nc, m->stream);
        break;
    case LK__COLL_BARRIER: r = ncclAllReduce(m->scratch, m->scratch, 1, ncclFloat32, ncclSum, m->nc, m->stream); break;
    default:
        return lk_error(LK_STATUS_UNSUPPORTED, "nccl: %s is not implemented yet (all_reduce, broadcast, all_gather, "
                        "reduce_scatter, barrier are)", what);
    }
    if (r != ncclSuccess && r != ncclInProgress) {
        ncclCommAbort(m->nc), m->dead = true;
        return lk_error(LK_STATUS_DEVICE, "nccl: %s on rank %d: %s (%s)", what, c->pg.rank, ncclGetErrorString(r),
                        ncclGetLastError(m->nc));
    }
    /* Non-blocking NCCL may still be enqueueing; then the stream's event
     * marks completion, polled with the async error against the deadline. */
    LK_TRY(wait_nccl(c, m, NULL, what));
    /* The event back: the compute stream's later work (the optimizer, the
     * next step's kernels reusing the buffer) waits for the collective on
     * the device, not only because the host waits for it below. */
    if (cudaEventRecord(m->done, m->stream) != cudaSuccess || cudaStreamWaitEvent(m->compute, m->done, 0) != cudaSuccess) {
        cudaGetLastError();
        return lk_error(LK_STATUS_DEVICE, "nccl: %s: cannot record completion or order the compute stream after it", what);
    }
    return wait_nccl(c, m, m->done, what);
}

/* ---- point-to-point ----
 * A message in host memory travels whole on the host communicator (NCCL
 * cannot take it), with that backend's semantics. A message in device
 * memory is a header on the host communicator (sequence number, dtype,
 * count; the host send completes once the receiver took it), then the data
 * by ncclSend/ncclRecv (NCCL >= 2.7) on the communication stream, ordered
 * after the compute stream's producer and before its consumers as the
 * collectives are. Every message of this communicator, header or whole,
 * is one host message of the same pair and direction, in issue order, so
 * the host's sequence numbers are this communicator's. What the host
 * brings: a dead or aborted peer is seen during the header, a receive of
 * another dtype or count is named by the receiver at once (the pair, the
 * sequence number, both sides' sizes) before any NCCL call; its sender,
 * whose ncclSend then finds no receive, fails at comm_timeout. What NCCL
 * imposes: a communicator's sends and receives run one after another on
 * the GPU, each blocking until its peer's matching call runs. So the NCCL
 * calls are made in the order the messages started on this rank (issue
 * order, an older message of the same pair and direction first), not in
 * the order their headers came through, and the semantics are blocking
 * MPI_Ssend's: an exchange works when one side receives first (DeepSpeed's
 * even and odd pipeline stages), and one in which both ranks send first
 * waits for comm_timeout (an error naming the pair; the communicator is
 * aborted). A group (lk_comm_p2p_group_begin/end) is what lifts that:
 * its device messages take one place in the order, and once every one's
 * header is through their NCCL calls are made between ncclGroupStart and
 * ncclGroupEnd, which NCCL runs as one, sends and receives side by side
 * (a pipeline stage that sends its activation on and receives the next
 * stage's gradient at once needs exactly that). */
typedef struct {
    uint64_t seq, count;
    int32_t dt, pad;
} p2p_hdr;

typedef struct {
    lk_work *work;   /* the header's (or the whole host message's) transfer on the host communicator */
    cudaEvent_t ev;  /* device memory: recorded after the NCCL call */
    p2p_hdr hdr;     /* this side's, or the sender's once received */
    uint64_t ticket; /* device memory: its place in this rank's order of NCCL calls */
    bool host;       /* host memory: the whole message is the host's */
    bool ready;      /* a group's member: its header is through */
    int slot;        /* a group's member: nccl_impl.groups[slot - 1]; 0: none */
} p2p_priv;
_Static_assert(sizeof(p2p_priv) <= sizeof(((lk__p2p *)0)->priv), "lk__p2p.priv is too small for nccl's state");

static lk_status nccl_p2p_start(lk_comm *c, lk__p2p *op) {
    nccl_impl *m = c->impl;
    p2p_priv *p = (p2p_priv *)op->priv;
    char what[200];
    lk__p2p_describe(c, op, what, sizeof what);
    if (m->dead) return lk_error(LK_STATUS_ABORTED, "nccl: %s: the communicator was aborted earlier", what);
    memset(p, 0, sizeof *p);
    p->host = host_memory(op->buf);
    op->phase = 0;
    struct p2p_group *g = NULL;
    if (op->group) { /* the group's slot, taken by its first member to start */
        for (int i = 0; i < 8 && !g; i++)
            if (m->groups[i].id == op->group) g = &m->groups[i];
        for (int i = 0; i < 8 && !g; i++)
            if (!m->groups[i].id) {
                g = &m->groups[i];
                *g = (struct p2p_group){.id = op->group, .ticket = atomic_fetch_add(&m->p2p_tickets, 1), .n = op->group_n};
            }
        if (!g) return lk_error(LK_STATUS_INTERNAL, "nccl: %s: more than 8 point-to-point groups in flight", what);
        if (p->host) g->n--; /* a host message is the host communicator's: not in the NCCL group */
        else g->op[g->joined++] = op, p->slot = (int)(g - m->groups) + 1;
    }
    if (p->host)
        return op->send ? lk_comm_send_async(m->host, op->buf, op->count, op->dt, op->peer, &p->work)
                        : lk_comm_recv_async(m->host, op->buf, op->count, op->dt, op->peer, &p->work);
    ncclDataType_t t;
    if (!nccl_type(op->dt, &t))
        return lk_error(LK_STATUS_UNSUPPORTED, "nccl: %s: dtype %s has no NCCL type", what, lk_dtype_name(op->dt));
    if (op->send) p->hdr = (p2p_hdr){op->seq, op->count, (int32_t)op->dt, 0};
    p->ticket = g ? g->ticket : atomic_fetch_add(&m->p2p_tickets, 1);
    return op->send ? lk_comm_send_async(m->host, &p->hdr, sizeof p->hdr, LK_U8, op->peer, &p->work)
                    : lk_comm_recv_async(m->host, &p->hdr, sizeof p->hdr, LK_U8, op->peer, &p->work);
}

/* The header is through: the data's NCCL call, between the producer and
 * the consumers on the compute stream. */
static lk_status p2p_launch(lk_comm *c, nccl_impl *m, lk__p2p *op, p2p_priv *p, const char *what) {
    ncclDataType_t t = ncclFloat32;
    (void)nccl_type(op->dt, &t);
    if (cudaSetDevice(m->gpu) != cudaSuccess || cudaEventCreateWithFlags(&p->ev, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventRecord(m->produced, m->compute) != cudaSuccess || cudaStreamWaitEvent(m->stream, m->produced, 0) != cudaSuccess) {
        cudaGetLastError();
        return lk_error(LK_STATUS_DEVICE, "nccl: %s: cannot order the communication stream after the producer", what);
    }
    ncclResult_t r = op->send ? ncclSend(op->buf, op->count, t, op->peer, m->nc, m->stream)
                              : ncclRecv(op->buf, op->count, t, op->peer, m->nc, m->stream);
    if (r != ncclSuccess && r != ncclInProgress) {
        ncclCommAbort(m->nc), m->dead = true;
        return lk_error(LK_STATUS_DEVICE, "nccl: %s on rank %d: %s (%s)", what, c->pg.rank, ncclGetErrorString(r),
                        ncclGetLastError(NULL));
    }
    if (cudaEventRecord(p->ev, m->stream) != cudaSuccess || cudaStreamWaitEvent(m->compute, p->ev, 0) != cudaSuccess) {
        cudaGetLastError();
        return lk_error(LK_STATUS_DEVICE, "nccl: %s: cannot record completion or order the compute stream after it", what);
    }
    uint64_t now = lk_time_ns();
    op->t0 = op->prev = now;
    op->phase = 1;
    op->progressed = true;
    atomic_fetch_add(&m->p2p_next, 1);
    return LK_STATUS_OK;
}

/* Every member's header is through and the group's turn has come: its
 * NCCL calls as one NCCL group, between the producer and the consumers on
 * the compute stream, each member's event recorded after it. */
static lk_status group_launch(lk_comm *c, nccl_impl *m, struct p2p_group *g, const char *what) {
    if (cudaSetDevice(m->gpu) != cudaSuccess || cudaEventRecord(m->produced, m->compute) != cudaSuccess ||
        cudaStreamWaitEvent(m->stream, m->produced, 0) != cudaSuccess) {
        cudaGetLastError();
        return lk_error(LK_STATUS_DEVICE, "nccl: %s: cannot order the communication stream after the producer", what);
    }
    for (int i = 0; i < g->n; i++) {
        p2p_priv *q = (p2p_priv *)g->op[i]->priv;
        if (cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            return lk_error(LK_STATUS_DEVICE, "nccl: %s: cannot create an event", what);
        }
    }
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < g->n && (r == ncclSuccess || r == ncclInProgress); i++) {
        lk__p2p *o = g->op[i];
        ncclDataType_t t = ncclFloat32;
        (void)nccl_type(o->dt, &t);
        r = o->send ? ncclSend(o->buf, o->count, t, o->peer, m->nc, m->stream)
                    : ncclRecv(o->buf, o->count, t, o->peer, m->nc, m->stream);
    }
    ncclResult_t e = ncclGroupEnd(); /* (also after a failed call: the group is closed) */
    if (r == ncclSuccess || r == ncclInProgress) r = e;
    if (r != ncclSuccess && r != ncclInProgress) {
        ncclCommAbort(m->nc), m->dead = true;
        return lk_error(LK_STATUS_DEVICE, "nccl: %s (a group of %d) on rank %d: %s (%s)", what, g->n, c->pg.rank,
                        ncclGetErrorString(r), ncclGetLastError(NULL));
    }
    /* non-blocking NCCL may still be enqueueing the group: its events go after */
    if (r == ncclInProgress) LK_TRY(wait_nccl(c, m, NULL, what));
    uint64_t now = lk_time_ns();
    for (int i = 0; i < g->n; i++) {
        lk__p2p *o = g->op[i];
        p2p_priv *q = (p2p_priv *)o->priv;
        if (cudaEventRecord(q->ev, m->stream) != cudaSuccess || cudaStreamWaitEvent(m->compute, q->ev, 0) != cudaSuccess) {
            cudaGetLastError();
            return lk_error(LK_STATUS_DEVICE, "nccl: %s: cannot record completion or order the compute stream after it", what);
        }
        o->t0 = o->prev = now;
        o->phase = 1;
        o->progressed = true;
        q->slot = 0;
    }
    g->id = 0; /* the slot is free: the members go on alone */
    atomic_fetch_add(&m->p2p_next, 1);
    return LK_STATUS_OK;
}

static void p2p_release(p2p_priv *p) {
    lk_work_free(p->work); /* done (or failed) by now: no wait */
    p->work = NULL;
    if (p->ev) cudaEventDestroy(p->ev);
    p->ev = NULL;
}

static lk_status nccl_p2p_progress(lk_comm *c, lk__p2p *op, bool *done) {
    nccl_impl *m = c->impl;
    p2p_priv *p = (p2p_priv *)op->priv;
    char what[200];
    lk__p2p_describe(c, op, what, sizeof what);
    lk_status st = LK_STATUS_OK;
    if (op->phase == 0) { /* the host's part: it checks abort, the peer's life and the timeout itself */
        bool fin = !p->work; /* NULL: the header came earlier, its turn had not */
        st = p->work ? lk_work_test(p->work, &fin) : LK_STATUS_OK;
        if (!st && !fin) return LK_STATUS_OK;
        if (!st && p->work) lk_work_free(p->work), p->work = NULL; /* the header is through (kept in p->hdr) */
        if (!st && p->slot) { /* a group's member: checked now, issued with the others */
            struct p2p_group *g = &m->groups[p->slot - 1];
            if (!p->ready && !op->send && (p->hdr.seq != op->seq || p->hdr.count != op->count || p->hdr.dt != (int32_t)op->dt))
                st = lk__p2p_mismatch(c, op, (lk_dtype)p->hdr.dt, (size_t)p->hdr.count);
            else if (!p->ready) p->ready = true, g->ready++;
            if (!st && (g->ready < g->n || atomic_load(&m->p2p_next) != g->ticket)) {
                if (atomic_load(&c->abort_requested))
                    return lk_error(LK_STATUS_ABORTED, "nccl: %s on rank %d: aborted (lk_comm_abort)", what, c->pg.rank);
                return LK_STATUS_OK;
            }
            if (!st) st = group_launch(c, m, g, what);
            if (st) p2p_release(p);
            return st;
        }
        /* an older message's NCCL call first: issue order on the GPU */
        if (!st && !p->host && atomic_load(&m->p2p_next) != p->ticket) {
            if (atomic_load(&c->abort_requested))
                return lk_error(LK_STATUS_ABORTED, "nccl: %s on rank %d: aborted (lk_comm_abort)", what, c->pg.rank);
            return LK_STATUS_OK;
        }
        if (st) {
            char why[1024]; /* the host's message, copied before a new error is made */
            snprintf(why, sizeof why, "%s", lk_last_error());
            st = lk_error(st, "nccl: %s: %s", what, why);
        }
        else if (p->host) *done = true;
        else if (!op->send && (p->hdr.seq != op->seq || p->hdr.count != op->count || p->hdr.dt != (int32_t)op->dt))
            st = lk__p2p_mismatch(c, op, (lk_dtype)p->hdr.dt, (size_t)p->hdr.count);
        else st = p2p_launch(c, m, op, p, what);
        if (st || *done) p2p_release(p);
        return st;
    }
    /* NCCL's part: its async error and the event, polled against the deadline */
    ncclResult_t as;
    if (ncclCommGetAsyncError(m->nc, &as) != ncclSuccess) as = ncclInternalError;
    if (as != ncclSuccess && as != ncclInProgress) {
        ncclCommAbort(m->nc), m->dead = true;
        st = lk_error(LK_STATUS_REMOTE, "nccl: %s failed on rank %d: %s (%s); the communicator was aborted", what,
                      c->pg.rank, ncclGetErrorString(as), ncclGetLastError(NULL));
    } else if (as == ncclSuccess) {
        cudaError_t e = cudaEventQuery(p->ev);
        if (e == cudaSuccess) *done = true;
        else if (e != cudaErrorNotReady) {
            cudaGetLastError();
            ncclCommAbort(m->nc), m->dead = true;
            st = lk_error(LK_STATUS_DEVICE, "nccl: %s on rank %d: %s", what, c->pg.rank, cudaGetErrorString(e));
        }
    }
    uint64_t now = lk_time_ns();
    op->t0 += lk__paused_ns(now, &op->prev); /* a stopped process does not time out on resume */
    if (!st && !*done && atomic_load(&c->abort_requested)) {
        ncclCommAbort(m->nc), m->dead = true;
        st = lk_error(LK_STATUS_ABORTED, "nccl: %s on rank %d: aborted (lk_comm_abort)", what, c->pg.rank);
    }
    if (!st && !*done && (double)(now - op->t0) * 1e-9 > c->timeout_s) {
        char words[LK_PARAM_STR + 96];
        ncclCommAbort(m->nc), m->dead = true;
        st = lk_error(LK_STATUS_TIMEOUT,
                      "nccl: %s did not complete within %.0f s (%s) after its header went through: rank %d's matching "
                      "NCCL call never ran (it died, hangs, or sends to this rank first while this rank sends to it: "
                      "NCCL runs a communicator's sends and receives one after another); the communicator was aborted",
                      what, c->timeout_s, lk__comm_timeout_words(c, words, sizeof words), op->peer);
    }
    if (st || *done) p2p_release(p);
    return st;
}

/* Another op failed first: this one's header may still be in flight on
 * the host communicator, which is aborted so that its work ends now. */
static void nccl_p2p_cancel(lk_comm *c, lk__p2p *op) {
    nccl_impl *m = c->impl;
    p2p_priv *p = (p2p_priv *)op->priv;
    bool fin = true;
    if (p->work && !lk_work_test(p->work, &fin) && !fin) lk_comm_abort(m->host, "nccl: another point-to-point op failed");
    if (p->slot) m->groups[p->slot - 1].id = 0; /* its group is never issued: the communicator failed */
    p2p_release(p);
}

static void nccl_abort(lk_comm *c, const char *reason) {
    nccl_impl *m = c->impl;
    /* Peers learn through the host communicator; this rank's run loop sees
     * c->abort_requested and aborts NCCL from its own thread. */
    if (m && m->host) lk_comm_abort(m->host, reason);
}

const lk__comm_vtable lk__comm_nccl = {
    .name = "nccl",
    .split = nccl_split,
    .device_memory = true,
    .init = nccl_init,
    .destroy = nccl_destroy,
    .run = nccl_run,
    .abort = nccl_abort,
    .p2p_start = nccl_p2p_start,
    .p2p_progress = nccl_p2p_progress,
    .p2p_cancel = nccl_p2p_cancel,
    .p2p_groups = true,
};
#endif

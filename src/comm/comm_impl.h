/* Private to src/dist: the communicator vtable every backend fills, the
 * generic lk_comm (issue order, sequence numbers, the async queue and the
 * sticky failure), the collective descriptor, the reduction kernels and
 * the 16-bit float converters. Backends see only this header and dist.h. */
#ifndef LK_DIST_COMM_IMPL_H
#define LK_DIST_COMM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend/isa.h"
#include "lockstep/dist.h"

typedef enum {
    LK__COLL_ALL_REDUCE,
    LK__COLL_BROADCAST,
    LK__COLL_ALL_GATHER,
    LK__COLL_REDUCE_SCATTER,
    LK__COLL_GATHER,
    LK__COLL_SCATTER,
    LK__COLL_BARRIER,
    LK__COLL_COUNT
} lk__coll_kind;

/* One collective as issued. all_reduce/broadcast: send == recv == buf.
 * count is per rank (the block size for gather/scatter/all_gather/reduce_scatter). */
typedef struct lk__coll {
    lk__coll_kind kind;
    const void *send;
    void *recv;
    size_t count;
    lk_dtype dt;
    lk_reduce_op op;
    int root;
    uint64_t seq; /* issue order on this communicator, from 1 */
} lk__coll;

/* One point-to-point operation as issued (lk_comm_send/recv and their
 * async forms). Sends and receives are matched per ordered pair in issue
 * order: the n-th send from a to b meets the n-th receive by b from a. */
typedef struct lk__p2p {
    bool send;     /* a send to peer; else a receive from it */
    int peer;      /* the other rank, != this rank */
    void *buf;     /* count elements of dt (read for a send, written for a receive) */
    size_t count;
    lk_dtype dt;
    uint64_t seq;  /* on this ordered pair, from 1 */
    /* lk_comm_p2p_group_begin/end on a backend with p2p_groups: the group
     * (from 1; 0: none) and its number of ops, every member's start known
     * to be coming (they are queued together at the group's end). */
    uint64_t group;
    int group_n;
    /* Progress state: zero at issue, the backend's to use. */
    bool progressed; /* p2p_progress moved something (the waiter's back-off restarts) */
    int phase;
    uint64_t base, next, t0, prev, next_check;
    _Alignas(16) unsigned char priv[96]; /* backend handles (MPI requests) */
} lk__p2p;

/* "send #3 from rank 0 to rank 1 (f32 x 1024)", "recv #3 by rank 1 from rank 0 (f32 x 1024)" */
void lk__p2p_describe(const lk_comm *c, const lk__p2p *op, char *buf, size_t size);
/* INVALID_USAGE naming the pair, op's number and both sides' dtype and count
 * (the peer's are other_*): the same text on the sender and the receiver. */
lk_status lk__p2p_mismatch(const lk_comm *c, const lk__p2p *op, lk_dtype other_dt, size_t other_count);

const char *lk__coll_kind_name(lk__coll_kind k);
/* "all_reduce #7 (f32 x 1024, sum)" */
void lk__coll_describe(const lk__coll *op, char *buf, size_t size);

typedef struct lk__comm_vtable {
    const char *name;
    /* Collectives take device memory (nccl): a strategy on a GPU hands them
     * its device buffers instead of staging them through the host. */
    bool device_memory;
    /* Joins the group described by c->pg; sets c->impl. On failure leaves
     * nothing behind (the dispatcher will not call destroy). */
    lk_status (*init)(lk_comm *c, const lk_comm_config *cfg);
    /* Leaves the group and frees c->impl. */
    void (*destroy)(lk_comm *c);
    /* Runs one collective to completion, bounded by c->timeout_s. Called by
     * one thread at a time, in issue order. Arguments are already validated. */
    lk_status (*run)(lk_comm *c, const lk__coll *op);
    /* (optional) memory peers can read; default: lk_aligned_alloc. */
    lk_status (*alloc_shared)(lk_comm *c, size_t bytes, void **ptr);
    void (*free_shared)(lk_comm *c, void *ptr);
    /* (optional, with alloc_shared: every rank maps every rank's blocks)
     * offset of this rank's block p in its heap; the address of offset off
     * in rank k's heap as this process maps it. Make lk_comm_alloc_common. */
    int64_t (*shared_offset)(lk_comm *c, const void *p);
    void *(*shared_at)(lk_comm *c, int k, int64_t off);
    /* (optional) tells peers this rank gave up, quoting reason. Any thread. */
    void (*abort)(lk_comm *c, const char *reason);
    /* (optional) c->long_* was just set by lk_comm_long_work: publish it if
     * this rank is the one doing the work. Issuing thread. */
    void (*long_work)(lk_comm *c);
    /* (optional) lk_comm_split, called on every rank of parent once the
     * groups are known: child is prepared (its pg with the group's ranks,
     * timeout, job id, vt) or NULL on a rank whose colour is negative (mpi
     * still takes part in MPI_Comm_split). Sets child->impl; on failure
     * leaves nothing behind. No work of parent is in flight. */
    lk_status (*split)(lk_comm *parent, lk_comm *child, int colour, int key);
    /* (optional, both or neither) point-to-point. p2p_start posts op;
     * p2p_progress advances it without blocking and sets *done when it is
     * complete (a send: the receiver has all the data). Progress checks, at
     * most every 100 ms, abort, the peer's liveness and comm_timeout counted
     * while nothing moves; a failure names the pair and the sequence number.
     * Several ops may be active at once (on other pairs or directions, and
     * next to a collective on another thread); of one direction of one pair
     * only the oldest. */
    lk_status (*p2p_start)(lk_comm *c, lk__p2p *op);
    lk_status (*p2p_progress)(lk_comm *c, lk__p2p *op, bool *done);
    /* (optional) An op that started is ended by p2p.c without a last
     * p2p_progress (another op failed first, so this one fails fast): give
     * back what the backend holds for it (nccl: its event and its host
     * work). The communicator has failed; nothing more is sent. */
    void (*p2p_cancel)(lk_comm *c, lk__p2p *op);
    /* (optional) The ops of one lk_comm_p2p_group run together (NCCL's
     * ncclGroupStart/End: one that sends and receives must, since its
     * calls run one after another otherwise); they carry lk__p2p.group.
     * false: each op progresses alone (as they already do side by side). */
    bool p2p_groups;
} lk__comm_vtable;

/* The most ops one point-to-point group may hold. */
#define LK__P2P_GROUP_MAX 16

typedef struct lk__queue_item lk__queue_item;

struct lk_comm {
    const lk__comm_vtable *vt;
    void *impl;
    lk_pg_info pg;
    double timeout_s;
    char timeout_from[LK_PARAM_STR]; /* where timeout_s came from (lk_comm_config.timeout_from) */
    bool check_desync;
    char job_id[96];
    uint64_t next_seq; /* issuing thread only */
    _Atomic uint64_t arrival_wait_ns; /* collectives' wait for the last rank to arrive (backends that can tell) */
    /* lk_comm_long_work: collective long_seq may wait up to long_limit_s for
     * rank long_root (-1: none announced). Issuing thread writes; the run
     * that reads it was issued after (the queue's mutex orders them). */
    int long_root;
    uint64_t long_seq;
    uint64_t long_start_ns;
    double long_limit_s;
    char long_what[256];
    char long_limit_name[64];

    /* Sticky failure: first error wins; later calls fail with ABORTED. */
    _Atomic int failed; /* lk_status of the first failure, 0 while healthy */
    _Atomic int abort_requested;
    pthread_mutex_t err_mu;
    char err_msg[1024];
    /* lk_comm_set_leave_reason: why this rank is leaving early ("": no reason given) */
    char leave_reason[512];

    /* Async: works run in issue order on one thread, started on first use. */
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* queue non-empty or stop */
    pthread_cond_t cv_done; /* some work finished */
    pthread_t thread;
    bool thread_started, stop;
    lk_work *head, *tail; /* queued, not yet started */
    _Atomic long pending; /* issued and not finished (queued + running); changed under mu */
    size_t shared_bytes;

    /* Point-to-point (p2p.c): per-pair sequence numbers (issuing thread),
     * and async sends/receives progressed together on their own thread, so
     * that a send and a receive, or two pairs, never wait for each other
     * (the collectives' thread runs one thing at a time). */
    uint64_t *p2p_send_seq, *p2p_recv_seq; /* [world]: last issued to / from each rank */
    pthread_cond_t cv_p2p;                 /* p2p queue non-empty or stop */
    pthread_t p2p_thread;
    bool p2p_started, p2p_stop;
    lk_work *p2p_head, *p2p_tail; /* queued, not yet taken by the p2p thread */
    _Atomic long p2p_pending;     /* issued and not finished; changed under mu */
    /* an open lk_comm_p2p_group (issuing thread): its id, and its ops held
     * until its end queues them together */
    uint64_t p2p_group, p2p_groups_made;
    lk_work *p2p_held;
    int p2p_nheld;
    uint64_t nsplit;              /* lk_comm_split calls so far (equal on every rank): names shm groups */
    /* How a backend built on others (nccl, over a host communicator for its
     * bootstrap and host memory; hier, over mpi and a node's shm) makes
     * them: registry.c sets it
     * to lk_comm_create before vt->init, so the layered backend never names
     * the registry that lists it (no two-file cycle). NULL in split children,
     * which split their parent's host instead. */
    lk_status (*make_host)(const lk_comm_config *cfg, lk_comm **out);
};

struct lk_work {
    lk__coll op;
    bool is_p2p; /* a send or receive: p2p below, not op */
    bool p2p_begun;
    lk__p2p p2p;
    lk_comm *comm;
    lk_work *next;
    bool done; /* under comm->mu */
    lk_status status;
    char msg[1024];
    double t_start, t_end; /* when it ran (lk_time_now), for profilers' traces */
};

/* Registry: backends built into this library. */
extern const lk__comm_vtable lk__comm_self;
extern const lk__comm_vtable lk__comm_shm;
#ifdef LK_HAVE_NCCL
extern const lk__comm_vtable lk__comm_nccl; /* comm_nccl.c: GPU buffers only */
#endif
#ifdef LK_HAVE_MPI
extern const lk__comm_vtable lk__comm_mpi;
/* comm_hier.c: shm inside a node, mpi across (the hierarchical all-reduce) */
extern const lk__comm_vtable lk__comm_hier;
/* bench: raw MPI_Allreduce timing on MPI_COMM_WORLD (µs per call, the
 * slowest rank's), for the table. limit_s > 0: a rank whose loop has not
 * finished by then says so and exits (blocking MPI calls cannot time out). */
lk_status lk__mpi_raw_allreduce_us(size_t bytes, int iters, double limit_s, double *us);
/* bench: raw MPI_Send/MPI_Recv ping-pong between ranks 0 and 1 of
 * MPI_COMM_WORLD (µs one way, half the round trip). */
lk_status lk__mpi_raw_pingpong_us(size_t bytes, int iters, double *us);
#endif

/* Tests only: one more backend, found by name (lk_comm_config.backend or
 * LK_COMM_BACKEND) and never by "auto". It lets a test stand in for a
 * communicator no CI machine can run — tests/sealed_comm.h is nccl's shape
 * (device_memory) over the sealed device — so the code paths that only such
 * a backend reaches run in every CI build. Registering again replaces it;
 * NULL removes it. Not thread-safe against a concurrent lk_comm_create. */
void lk__comm_register_test_backend(const lk__comm_vtable *vt);

/* Waiting loops call this with each fresh clock reading: a jump of more than
 * LK__PAUSE_NS since the previous reading means this process did not run
 * (SIGSTOP, the whole job suspended). It returns the jump, which the caller
 * adds to its start time so that the pause does not count against a timeout;
 * 0 otherwise. *prev is updated. */
#define LK__PAUSE_NS 500000000ull
static inline uint64_t lk__paused_ns(uint64_t now, uint64_t *prev) {
    uint64_t gap = now > *prev ? now - *prev : 0;
    *prev = now;
    return gap > LK__PAUSE_NS ? gap : 0;
}

/* Sets the sticky failure (first one wins) and tells peers. Returns `st`. */
lk_status lk__comm_fail(lk_comm *c, lk_status st);
/* ABORTED "<what>: communicator already failed: <first error>". */
lk_status lk__comm_failed_fast(lk_comm *c, const char *what);
/* A timeout message naming "(comm_timeout, LK_COMM_TIMEOUT)" gets the
 * setting's actual source put in (the last error is rewritten). */
void lk__comm_name_timeout_source(lk_comm *c, lk_status st);
/* A communicator object for vt and pg without its backend (init or split
 * sets impl): locks, sequence numbers, per-pair counters; NULL when out of
 * memory. lk__comm_delete frees it once the backend is gone. */
lk_comm *lk__comm_new(const lk__comm_vtable *vt, const lk_pg_info *pg);
void lk__comm_delete(lk_comm *c);
/* Waits until no collective and no point-to-point work is pending. */
void lk__comm_drain(lk_comm *c);
/* The words a timeout message puts in parentheses after "timed out after
 * N s": the setting and where its value came from ("comm_timeout from
 * LK_COMM_TIMEOUT"). Returns buf. */
const char *lk__comm_timeout_words(const lk_comm *c, char *buf, size_t size);

/* ---- reductions (reduce.c) ---- */
/* dst[i] = op(srcs[0][i], ..., srcs[n-1][i]) folded strictly in order
 * 0..n-1 (sum, max, min); for AVG the sum is divided by avg_div. bf16/f16
 * accumulate in f32 and round once. dst may alias any src. */
void lk__reduce(void *dst, const void *const *srcs, int n, size_t count, lk_dtype dt, lk_reduce_op op,
                int avg_div);
/* buf[i] /= w in place, exactly as lk__reduce's AVG divides its sum: the
 * AVG of a library that only sums (MPI's all-reduce, hier's leaders). */
void lk__reduce_divide(void *buf, size_t count, lk_dtype dt, int w);
/* Its copy per instruction set (backend/isa.h); lk__reduce picks one. */
LK_ISA_DECLARE(void, lk__reduce_run,
               (void *dst, const void *const *srcs, int n, size_t count, lk_dtype dt, lk_reduce_op op, int avg_div));

/* ---- process helpers of the shm backend ---- */
/* true when pid exists and is not a zombie. */
bool lk__pid_alive(int pid);
/* One char of /proc/<pid>/stat: 'R', 'S', 'T' (stopped), 'Z', ... or '?' */
char lk__pid_state(int pid);
/* LK_JOB_NONCE's text as the number the shm rendezvous compares (never 0;
 * 0 for NULL or ""): the launcher's 16 hex digits read back as they were. */
uint64_t lk__job_nonce(const char *text);
/* The launcher, once its ranks are gone: removes the job's segment name if
 * it is that launch's (nonce) or stale (nobody holds the id), never another
 * live job's. */
void lk__shm_cleanup(const char *job_id, uint64_t nonce);

#endif

/* lockstep/dist.h — the distributed runtime: the process group read from the
 * environment, communicators (shm for the processes of one node, mpi for
 * many nodes) with blocking and asynchronous collectives that never wait
 * forever, shared-memory buffers for zero-copy gradient buckets, and the
 * torchrun-style launcher.
 *
 *     lk_comm_config cfg = lk_comm_config_default();    // backend "auto"
 *     lk_comm *comm;
 *     LK_TRY(lk_comm_create(&cfg, &comm));              // rendezvous
 *     float *grad;
 *     LK_TRY(lk_comm_alloc_shared(comm, n * sizeof(float), (void **)&grad));
 *     ...
 *     lk_work *w;
 *     LK_TRY(lk_comm_all_reduce_async(comm, grad, n, LK_F32, LK_REDUCE_AVG, &w));
 *     ... more backward compute ...
 *     lk_status st = lk_work_wait(w);                   // then lk_work_free(w)
 *     lk_comm_free_shared(comm, grad);
 *     lk_comm_free(comm);
 *
 * Rules every communicator keeps:
 *  - Collectives are matched by issue order: every rank must issue the same
 *    sequence. Each carries a sequence number and a signature (kind, dtype,
 *    count, op, root); a mismatch fails on every rank with INVALID_USAGE and
 *    a message listing what each rank called.
 *  - No wait is unbounded: comm_timeout (default 120 s, LK_COMM_TIMEOUT;
 *    trainer.comm_timeout, when a config sets it, wins over the variable)
 *    bounds each collective (TIMEOUT, naming the collective and the ranks
 *    that did not arrive); a dead peer is noticed within about 100 ms
 *    (REMOTE, naming the rank, its pid and the collective in flight).
 *  - After any failure the communicator is aborted: every later call fails
 *    fast with ABORTED and the first error's message. On mpi the whole MPI
 *    job is aborted (MPI_Abort) when the failed process exits, instead of a
 *    collective MPI_Finalize that a stalled peer would block forever.
 *  - Time during which the waiting process itself did not run (the whole job
 *    suspended with SIGSTOP/Ctrl-Z, then resumed) does not count: nobody is
 *    late when nobody could make progress.
 *  - Issue collectives on one communicator from one thread at a time; works
 *    may be waited on from any thread. Async collectives run in issue order
 *    on one communication thread per communicator (started on first use); a
 *    blocking collective issued while async work is pending queues behind it.
 *  - Results of all_reduce/reduce_scatter are bitwise identical on every
 *    rank and across runs: the reduction order is fixed (rank 0, 1, ..., W-1)
 *    whatever the chunking. bf16/f16 are reduced in f32 and rounded to
 *    nearest even once.
 *
 * Environment: LK_COMM_TIMEOUT (seconds), LK_COMM_BACKEND (force shm|mpi|nccl|self),
 * LK_JOB_ID (names the shm segment; set by the launcher), LK_JOB_NONCE (set
 * by the launcher: ranks of two launches with one job id never pair up), LK_COMM_SHM_BYTES
 * (per-rank shared heap), LK_COMM_CHECK_DESYNC=0 (mpi: skip the signature
 * exchange), LK_COMM_SHM_SMALL / LK_COMM_SHM_SLICE (shm tuning: single-step
 * threshold and pipeline slice in bytes; must be equal on all ranks).
 */
#ifndef LOCKSTEP_DIST_H
#define LOCKSTEP_DIST_H

#include "lockstep/core.h"
#include "lockstep/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Process group: who am I, from the environment.
 * ---------------------------------------------------------------------- */
typedef struct lk_pg_info {
    int rank;             /* 0..world_size-1 */
    int local_rank;       /* 0..local_world_size-1, index on this node */
    int world_size;       /* processes in the job */
    int local_world_size; /* processes on this node */
    int node_rank;        /* 0..num_nodes-1 */
    int num_nodes;
    int master_port;      /* 0 when not set */
    char master_addr[128]; /* "" when not set */
    char job_id[96];      /* "" when none could be derived */
    const char *source;   /* "none", "torchrun", "openmpi", "pmi", "slurm" (static string) */
} lk_pg_info;

/* Reads the process group from the environment, first match wins:
 * torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
 * MASTER_ADDR, MASTER_PORT), OpenMPI (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/
 * LOCAL_SIZE), MPICH/PMI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
 * MPI_LOCALNRANKS), SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
 * SLURM_NODEID, SLURM_NNODES, SLURM_NTASKS_PER_NODE). No variables at all:
 * a single process (world 1). Fails with INVALID_ARGUMENT naming the
 * variable and value when a value is not a number or out of range. */
lk_status lk_pg_info_from_env(lk_pg_info *out);
/* Writes a one-line description ("rank 1/4 local 1/4 node 0/1 (torchrun)"). */
void lk_pg_info_format(const lk_pg_info *pg, char *buf, size_t size);

/* ------------------------------------------------------------------------
 * Communicators.
 * ---------------------------------------------------------------------- */
typedef enum {
    LK_REDUCE_SUM,
    LK_REDUCE_AVG, /* sum, then divided by world size (integers truncate) */
    LK_REDUCE_MAX,
    LK_REDUCE_MIN,
    LK_REDUCE_COUNT
} lk_reduce_op;
const char *lk_reduce_op_name(lk_reduce_op op);

typedef struct lk_comm lk_comm;
typedef struct lk_work lk_work;

typedef struct lk_comm_config {
    size_t struct_size;   /* sizeof(lk_comm_config), set by the default */
    const char *backend;  /* "auto" (world 1: self; one node: shm; several nodes: hier with several
                             ranks per node, else mpi), "shm", "mpi", "hier" (shm in a node, mpi
                             between nodes), "self"; LK_COMM_BACKEND overrides "auto" */
    double timeout_s;     /* bound on every wait; the default: LK_COMM_TIMEOUT, else 120 */
    const char *job_id;   /* names the shm segment; NULL: pg->job_id / LK_JOB_ID */
    const lk_pg_info *pg; /* borrowed, copied; NULL: lk_pg_info_from_env() */
    size_t shared_bytes;  /* shm: bytes per rank for lk_comm_alloc_shared (virtual until touched);
                             0: LK_COMM_SHM_BYTES, else the node's /dev/shm size divided
                             by its ranks, at least 1 GiB */
    bool check_desync;    /* mpi: exchange signatures before each collective (shm checks for free) */
    /* Where timeout_s came from, as the timeout message names it
     * ("LK_COMM_TIMEOUT", "trainer.comm_timeout in run.yaml:4:3"); NULL:
     * worked out from the value (the variable's, 120's "default", else
     * "lk_comm_config.timeout_s"). */
    const char *timeout_from;
} lk_comm_config;
lk_comm_config lk_comm_config_default(void);

/* Joins the group (rendezvous). On failure nothing is left behind (no
 * segment, no thread) and *out is NULL. The caller owns *out. */
lk_status lk_comm_create(const lk_comm_config *cfg, lk_comm **out);
/* Waits for pending async work, leaves the group, frees. NULL is a no-op.
 * Not collective: a peer still waiting on this rank sees it leave (REMOTE). */
void lk_comm_free(lk_comm *c);
/* Marks the communicator failed with `reason`: peers waiting on this rank fail
 * with REMOTE quoting it, pending and later calls fail with ABORTED.
 * Safe from any thread; returns LK_STATUS_ABORTED (so `return lk_comm_abort(...)`). */
lk_status lk_comm_abort(lk_comm *c, const char *reason);
/* Why this rank is about to leave (lk_comm_free) while peers may still wait
 * for it: the error that ended its run. A peer that finds it gone quotes
 * the reason instead of guessing at a desynchronisation (shm; other
 * backends ignore it). NULL or "" clears it. */
void lk_comm_set_leave_reason(lk_comm *c, const char *reason);
/* OK while healthy; otherwise the status of the first failure, with its
 * message set as this thread's last error. */
lk_status lk_comm_error(lk_comm *c);
/* Announces long work of one rank that the others will wait for in their
 * next collective (rank 0 writing a checkpoint, downloading data), so that
 * the wait gets its own bound instead of comm_timeout. Every rank calls it at
 * the same point, before `root` starts the work; nothing travels. Until root
 * enters its next collective, peers waiting on root give up only after
 * limit_s counted from this call, saying that root was busy with `what`
 * (root's text is the one shown, e.g. "writing checkpoint runs/x/last.ckpt")
 * and naming the setting `limit_name` (e.g. "trainer.checkpoint_timeout").
 * Other ranks stay bounded by comm_timeout on shm; mpi cannot tell which rank
 * is late, so its next collective waits up to limit_s for any rank. */
lk_status lk_comm_long_work(lk_comm *c, int root, const char *what, const char *limit_name, double limit_s);

int lk_comm_rank(const lk_comm *c);
int lk_comm_world_size(const lk_comm *c);
int lk_comm_local_rank(const lk_comm *c);
int lk_comm_local_world_size(const lk_comm *c);
const char *lk_comm_backend(const lk_comm *c); /* "self", "shm", "mpi", "nccl" */
const lk_pg_info *lk_comm_pg(const lk_comm *c);
/* Seconds this rank's collectives have spent waiting for the last rank to
 * arrive, summed since creation: the stragglers' share of communication
 * time, apart from moving and reducing the data. shm measures it; mpi
 * cannot tell (MPI_Allreduce is one call) and reports 0. */
double lk_comm_arrival_wait_s(const lk_comm *c);

/* Backends compiled into this build, in preference order, e.g. "shm mpi". */
int lk_comm_backend_count(void);
const char *lk_comm_backend_name_at(int i);

/* Memory every rank of the node can read. With the shm backend it lies inside
 * the job's segment, so collectives on it skip the copy through staging
 * (DDP keeps its gradient buckets here); other backends return ordinary
 * aligned memory. Not collective; 64-byte aligned; zero-filled. Free with
 * lk_comm_free_shared before lk_comm_free. OUT_OF_MEMORY names the
 * per-rank capacity (lk_comm_config.shared_bytes) when exhausted. */
lk_status lk_comm_alloc_shared(lk_comm *c, size_t bytes, void **ptr);
void lk_comm_free_shared(lk_comm *c, void *ptr);
/* One block every rank reads and writes: the same bytes, not a copy per
 * rank (shm only; other backends return UNSUPPORTED, an error every rank
 * sees alike). Collective. Rank 0 allocates it in its heap (*owner true
 * there, false elsewhere): only the owner frees it with lk_comm_free_shared,
 * and the others must be done with it first. Zero-filled, 64-byte aligned. */
lk_status lk_comm_alloc_common(lk_comm *c, size_t bytes, void **ptr, bool *owner);
/* Every rank's block of the same role, as this process maps it: mine is
 * this rank's block from lk_comm_alloc_shared (or NULL where it has none);
 * peers[k] (world size entries) becomes rank k's, readable in place, and
 * *all true, when every rank passed one and the backend maps them all
 * (shm on one node); else *all false on every rank and peers untouched.
 * Collective. Reading a peer's block needs the writer's own ordering (a
 * barrier after it writes): nothing here synchronises the bytes. */
lk_status lk_comm_peer_blocks(lk_comm *c, void *mine, void **peers, bool *all);
/* Whether the ranks map the same memory, i.e. lk_comm_alloc_common can
 * succeed (shm on one node: true; mpi, self: false). What a strategy asks
 * before it keeps one copy of something for every rank. */
bool lk_comm_shares_memory(const lk_comm *c);
/* Whether the collectives take device memory (nccl: true; shm, mpi, self:
 * false, they read host memory). What a strategy on a GPU asks before it
 * hands the communicator a device buffer rather than a host copy of it. */
bool lk_comm_reads_device(const lk_comm *c);
/* SyncBatchNorm's reducer over c (lk_layer_sync_batchnorm_reducer,
 * lockstep/nn.h): f64 sums all-reduced over c, given device memory when
 * lk_comm_reads_device(c). c is borrowed by the reducer. */
struct lk_bn_reducer;
void lk_comm_bn_reducer(lk_comm *c, struct lk_bn_reducer *out);

/* Blocking collectives. `count` is in elements of `dt`. Buffers may be
 * ordinary memory or from lk_comm_alloc_shared; sizes 0 are fine.
 *  all_reduce:     buf[count] in place on every rank.
 *  broadcast:      buf[count] from root to all.
 *  all_gather:     recv[world*count] = rank 0's send, rank 1's send, ...
 *  reduce_scatter: send[world*count] reduced; rank r gets block r in recv[count].
 *  gather:         root's recv[world*count] = everyone's send[count]; recv unused elsewhere.
 *  scatter:        rank r's recv[count] = root's send block r; send unused elsewhere.
 * For all_gather/reduce_scatter/gather/scatter send and recv must not overlap
 * (except: all_gather with send == recv + rank*count is allowed). */
lk_status lk_comm_all_reduce(lk_comm *c, void *buf, size_t count, lk_dtype dt, lk_reduce_op op);
lk_status lk_comm_broadcast(lk_comm *c, void *buf, size_t count, lk_dtype dt, int root);
lk_status lk_comm_all_gather(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt);
lk_status lk_comm_reduce_scatter(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt,
                                 lk_reduce_op op);
lk_status lk_comm_gather(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, int root);
lk_status lk_comm_scatter(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, int root);
lk_status lk_comm_barrier(lk_comm *c);

/* Async forms: queue the collective on the communication thread and return
 * at once with *work (caller owns; lk_work_free). Buffers must stay valid and
 * untouched until the work completes. Argument errors are returned here;
 * failures while running are returned by lk_work_wait. */
lk_status lk_comm_all_reduce_async(lk_comm *c, void *buf, size_t count, lk_dtype dt, lk_reduce_op op,
                                   lk_work **work);
lk_status lk_comm_broadcast_async(lk_comm *c, void *buf, size_t count, lk_dtype dt, int root, lk_work **work);
lk_status lk_comm_all_gather_async(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt,
                                   lk_work **work);
lk_status lk_comm_reduce_scatter_async(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt,
                                       lk_reduce_op op, lk_work **work);
lk_status lk_comm_gather_async(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, int root,
                               lk_work **work);
lk_status lk_comm_scatter_async(lk_comm *c, const void *send, void *recv, size_t count, lk_dtype dt, int root,
                                lk_work **work);
lk_status lk_comm_barrier_async(lk_comm *c, lk_work **work);

/* ------------------------------------------------------------------------
 * Process groups: communicators over a subset of the ranks.
 *
 * lk_comm_split is MPI_Comm_split: collective over c (every rank calls it,
 * in the same order as its collectives); the ranks that pass one colour
 * form a group, ordered by key, then by their rank in c. A negative colour
 * (LK_COMM_NO_GROUP) joins no group: *out is NULL and OK is returned. The
 * group is a communicator of the same backend with every rule above (its
 * own sequence numbers, timeouts, dead-peer checks and abort; comm_timeout
 * and its source are c's), independent of c once made: the groups and c
 * may run collectives and point-to-point at the same time (shm: each group
 * its own segment; mpi: MPI_Comm_split; nccl: a fresh NCCL communicator
 * whose id travels over the split host communicator). Free it with
 * lk_comm_free, before or after c. If any rank fails to join its group,
 * every rank's call fails (naming that rank) and no group is left.
 *
 *     // 4 ranks as 2 stages x 2 replicas: rank = stage * 2 + replica
 *     lk_comm_mesh_2d mesh;
 *     LK_TRY(lk_comm_mesh_2d_create(world, 2, 2, &mesh));
 *     lk_comm_all_reduce(mesh.dp, grad, n, LK_F32, LK_REDUCE_AVG); // my stage's replicas
 *     lk_comm_send(mesh.pp, act, m, LK_F32, mesh.pp_rank + 1);     // the next stage
 *     lk_comm_mesh_2d_free(&mesh);
 * ---------------------------------------------------------------------- */
#define LK_COMM_NO_GROUP (-1)
lk_status lk_comm_split(lk_comm *c, int colour, int key, lk_comm **out);

/* Data parallel x pipeline on dp_size * pp_size == world ranks, laid out as
 * rank = pp_rank * dp_size + dp_rank (torch's DeviceMesh over ("pp", "dp"):
 * the last dimension varies fastest). The replicas of one stage are
 * neighbours, so the data-parallel all-reduces, the most bytes of a step,
 * stay among consecutive ranks (one node, when nodes hold consecutive
 * ranks), and only the smaller stage-to-stage sends cross; Megatron and
 * DeepSpeed put the pipeline outermost for the same reason. */
typedef struct lk_comm_mesh_2d {
    lk_comm *dp; /* this rank's data-parallel group: its stage's dp_size replicas, rank dp_rank */
    lk_comm *pp; /* this rank's pipeline: pp_size stages of replica dp_rank, rank pp_rank */
    int dp_size, pp_size;
    int dp_rank, pp_rank;
} lk_comm_mesh_2d;
/* Collective over c; every rank passes the same sizes (checked: a mismatch
 * fails everywhere with INVALID_ARGUMENT). On failure *out holds no group. */
lk_status lk_comm_mesh_2d_create(lk_comm *c, int dp_size, int pp_size, lk_comm_mesh_2d *out);
/* Frees both groups (not c). Safe on a zeroed or already freed mesh. */
void lk_comm_mesh_2d_free(lk_comm_mesh_2d *mesh);

/* ------------------------------------------------------------------------
 * Point-to-point.
 *
 * lk_comm_send sends buf[count] of dt to rank `peer`, lk_comm_recv receives
 * count elements of dt from it. They are matched per ordered pair in issue
 * order: the n-th send from a to b meets the n-th receive by b from a
 * (n is the pair's sequence number, counted apart from the collectives).
 * Both sides must agree on dt and count: a mismatch fails both at once
 * (shm; mpi: the receiver at once, the sender at its timeout) with
 * INVALID_USAGE naming the pair, the sequence number and both sides' dtype
 * and count. A send completes when the receiver has the data (as
 * MPI_Ssend), so two ranks that both send first and receive second wait for
 * each other: order the pair (even ranks send first, odd receive first) or
 * use the async forms, which progress together on a thread of their own
 * (never behind a collective). The same bounds as the collectives:
 * comm_timeout counted while nothing moves (TIMEOUT naming the pair, the
 * number and what the peer is doing), a dead or aborted peer within about
 * 100 ms (REMOTE naming the pair), and any failure aborts the communicator.
 * Issue from one thread at a time (the collectives' rule); peer != own rank.
 * nccl: device memory moves by ncclSend/ncclRecv after a header on its host
 * communicator (a mismatch is named by the receiver at once; its sender
 * fails at comm_timeout), in the order the messages started on this rank,
 * and NCCL runs a rank's sends and receives one after another even in the
 * async forms: post an exchange as one group (lk_comm_p2p_group_begin) or
 * order it (one side receives first), or both sides wait for
 * comm_timeout; host memory is the host communicator's.
 * self has no point-to-point (UNSUPPORTED). */
lk_status lk_comm_send(lk_comm *c, const void *buf, size_t count, lk_dtype dt, int peer);
lk_status lk_comm_recv(lk_comm *c, void *buf, size_t count, lk_dtype dt, int peer);
/* Async forms: *work as for the async collectives; the buffer must stay
 * valid (and, for a send, unchanged) until the work completes. */
lk_status lk_comm_send_async(lk_comm *c, const void *buf, size_t count, lk_dtype dt, int peer, lk_work **work);
lk_status lk_comm_recv_async(lk_comm *c, void *buf, size_t count, lk_dtype dt, int peer, lk_work **work);

/* A point-to-point group (torch.distributed.batch_isend_irecv, NCCL's
 * ncclGroupStart/End): the async sends and receives issued between begin
 * and end are posted together at the end and may complete in any order;
 * wait for their works after the end. On nccl their NCCL calls are made
 * as one group, so an exchange in which both ranks send and receive at
 * once works there (without a group NCCL runs a rank's calls one after
 * another: both sending first waits for comm_timeout); elsewhere the ops
 * progress side by side anyway. Blocking send/recv inside a group is
 * INVALID_USAGE, as are nested groups and more than 16 ops. Issuing thread. */
lk_status lk_comm_p2p_group_begin(lk_comm *c);
lk_status lk_comm_p2p_group_end(lk_comm *c);

/* Blocks until done; returns the collective's status (message set on this
 * thread). May be called again; returns the same status. */
lk_status lk_work_wait(lk_work *w);
/* *done = whether it finished; returns its status once done, OK before. */
lk_status lk_work_test(lk_work *w, bool *done);
/* When the work ran (lk_time_now seconds; 0 until it started / finished).
 * Read it after lk_work_wait. For profilers' traces. */
void lk_work_times(const lk_work *w, double *t_start, double *t_end);
/* Waits if still running, then frees. NULL is a no-op. */
void lk_work_free(lk_work *w);

/* ------------------------------------------------------------------------
 * Launcher: N local processes with the torchrun variables set.
 *
 * Each child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK=0,
 * MASTER_ADDR, MASTER_PORT and LK_JOB_ID, runs in its own process group and
 * dies with the launcher (PR_SET_PDEATHSIG). Rank 0 keeps the launcher's
 * stdout/stderr (a terminal stays a terminal); the other ranks' lines are
 * prefixed "[rank R] " (unless a line already starts so), or every rank's
 * with prefix_all. SIGINT/SIGTERM/SIGHUP/SIGUSR1 are forwarded to every child. When
 * a child fails, the others get term_delay_s to report, then SIGTERM, then
 * SIGKILL after kill_grace_s; the exit code is the first failing child's
 * (128+signal when killed). The job's shm segment name is removed at exit.
 * ---------------------------------------------------------------------- */
typedef struct lk_launch_options {
    size_t struct_size;
    const char *master_addr; /* default "127.0.0.1" */
    int master_port;         /* 0: a free port */
    const char *job_id;      /* NULL: a fresh unique one */
    bool prefix_all;         /* prefix rank 0's lines too */
    double term_delay_s;     /* default 2 */
    double kill_grace_s;     /* default 3 */
    bool quiet;              /* no "lockstep launch:" status lines */
    /* (optional) ddp_spawn: each rank is a fork of this process that runs
     * child_main(child_ctx) with its rank's environment and exits with its
     * return value, instead of executing argv (which is then only used in
     * messages). Fork before starting threads of your own. */
    int (*child_main)(void *ctx);
    void *child_ctx;
    /* (optional) the file each rank executes, argv then passed unchanged
     * (argv[0] included): "/proc/self/exe" runs this very program again
     * under its own name. NULL: argv[0], looked up in PATH. */
    const char *exec_path;
    /* torchrun's --max-restarts: when a rank fails (not when the launcher
     * is signalled), stop the others and start all ranks again, up to this
     * many times, with TORCHELASTIC_RESTART_COUNT = 1, 2, ... (0 at first)
     * and a fresh job id and port; the trainer resumes from last.ckpt when
     * the count is above 0. Default 0: no restart. */
    int max_restarts;
} lk_launch_options;
lk_launch_options lk_launch_options_default(void);
/* "/lockstep-<sanitised job id>": the POSIX shared-memory name of a job's
 * shm segment, for launchers that remove what a failed job left behind. */
void lk_comm_shm_segment_name(const char *job_id, char *buf, size_t size);

/* Runs argv (argv[0] looked up in PATH; NULL-terminated) as `nprocs` ranks and
 * waits for all. *exit_code is 0 when all succeeded, else the first failing
 * child's code. Returns non-OK only when the launch itself failed. */
lk_status lk_launch(int nprocs, char *const argv[], const lk_launch_options *opt, int *exit_code);

#ifdef __cplusplus
}
#endif
#endif

/* The shm communicator: the processes of one node share one POSIX shared
 * memory segment per job. Local rank 0 creates it, the others attach with
 * retries until comm_timeout, and it is unlinked the moment every rank has
 * attached (so nothing can leak after that, whatever kills whom).
 *
 * Segment: header | one control slot per rank (progress tick, pid, state,
 * the collective in flight) | two staging slots per rank | one heap per rank
 * (lk_comm_alloc_shared). Ranks synchronise by publishing a monotonically
 * increasing tick and waiting until every peer's tick reaches theirs
 * (spin, then yield, then sleep), checking timeout, abort and peers'
 * liveness (pid alive and not a zombie, state not aborted) while they wait.
 *
 * all_reduce: each rank reduces its part from every rank's copy, always
 * folding rank 0, 1, ..., W-1 in that order, so every rank ends with the
 * same bits. When every rank's buffer lies in the segment, each rank writes
 * its reduced part straight into every buffer: two syncs in all, no copy-in
 * and no all-gather pass. Private buffers go through the staging slots
 * (reduce-scatter + all-gather over slices). Messages up to 64 KB take one
 * step (copy in, one sync, every rank reduces everything).
 *
 * Staging slots alternate between consecutive uses. A reader always
 * finishes reading a slot before it arrives at its next sync point, and a
 * writer reuses a slot only after waiting on a later sync point, so no
 * closing barrier is needed after staged collectives. Collectives that read
 * peers' own buffers (in-segment paths) end with a closing sync.
 *
 * Who may join (the job's identity is its job id, so its segment name):
 * two jobs started on one host with the same LK_JOB_ID or MASTER_PORT must
 * never pair up, whatever order their ranks run in. The claims are abstract
 * unix sockets named after the segment (bind is atomic and exclusive, the
 * kernel releases it when the process dies, nothing is left in any file
 * system): rank 0 holds "<name>" for the communicator's life, so a second
 * job's rank 0 fails at once, naming the holder's pid (SO_PEERCRED).
 *  - Ranks of one `lockstep launch` share LK_JOB_NONCE, a random number the
 *    launcher makes per attempt. Rank 0 writes it into the header and also
 *    holds "<name>#<nonce>"; a joiner attaches only to a segment with its
 *    own nonce, and fails at once when "<name>" is held by a rank 0 that is
 *    not its launch's (its "#<nonce>" is not held). So the first job to
 *    claim the id wins and no rank of the other can enter it: this holds in
 *    every interleaving.
 *  - Ranks started without the launcher (RANK/WORLD_SIZE/MASTER_PORT) share
 *    nothing the other job could not have, so rank k (k > 0) also holds
 *    "<name>/rank<k>", and whoever finds a rank's name held fails at once
 *    and leaves a connection queued on the holder's socket. After every rank
 *    has attached, each checks its queue (the "seal"): a queued connection
 *    means a second process wanted its rank while the job formed, so the
 *    job's ranks may come from two jobs, and it aborts before any
 *    collective, which needs every rank. Guarantee: a set of ranks stops
 *    before its first collective as soon as one of its members finds a
 *    notice at its seal, that is, when the other job's process for that
 *    rank made its claim before that seal. So ranks of two jobs can only
 *    complete a collective together if every one of their rivals claimed
 *    after the rank it rivals had sealed, which is indistinguishable from
 *    one job formed and a second started later; two jobs started together
 *    (every claim before any seal) never mix, and both fail. A job started
 *    after the first one sealed fails at once and the first runs on (as a
 *    second torchrun fails to bind MASTER_PORT).
 * The steps (claim, open, slot, publish, wait, seal, done) can each stop the
 * process (LK_COMM_TEST_RDV_PAUSE) so tests force every interleaving. */
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#define LINE 128                   /* two cache lines: adjacent-line prefetch must not couple ranks */
#define SHM_MAGIC 0x34304d48534b4cULL /* "LKSHM04" */
#define STAGE_SLOT ((size_t)1 << 20)  /* bytes per staging slot; two per rank */
#define SMALL_BYTES_DEFAULT ((size_t)64 << 10)   /* single-step all_reduce up to this; LK_COMM_SHM_SMALL */
#define CHUNK_SHARED_DEFAULT ((size_t)16 << 10) /* in-segment all_reduce: bytes reduced, then written to every rank, at a time; LK_COMM_SHM_SLICE */
#define CHECK_NS 100000000ull            /* liveness/abort checks every 100 ms while waiting */

enum { ST_EMPTY = 0, ST_ATTACHED = 1, ST_ABORTED = 2, ST_LEFT = 3 };

typedef struct {
    _Atomic uint64_t magic; /* set last by the creator */
    uint32_t version;
    int32_t world;
    int32_t creator_pid;
    int32_t pad;
    uint64_t total, slots_off, slot_bytes, stage_off, stage_bytes, heap_off, heap_bytes;
    _Atomic int32_t attached;
    uint64_t small_bytes, chunk_shared; /* the creator's tunables: every rank must run the same algorithm */
    char job_id[96];
    /* The creator's LK_JOB_NONCE (0: none). Added in version 5 after the old
     * fields, so an older segment reads as 0 and the magic could stay. */
    uint64_t nonce;
} shm_header;

typedef struct {
    uint64_t seq;
    int32_t kind, dt, op, root;
    uint64_t count;
    int64_t off; /* offset of the buffer peers read in place, or -1 */
} shm_info;

typedef struct {
    alignas(LINE) _Atomic uint64_t tick;
    alignas(LINE) _Atomic int32_t pid;
    _Atomic int32_t state;
    int32_t world;
    _Atomic uint64_t seq_done;
    _Atomic uint64_t active_ns;
    _Atomic int32_t in_coll;
    _Atomic int32_t cpu; /* the core this rank last arrived from */
    _Atomic int32_t cur; /* which info[] describes the collective in flight */
    /* lk_comm_long_work announced by this rank: busy with work_what since
     * work_start_ns, allowed work_limit_ns; cleared when it enters its next
     * collective. in_work is stored last (release) and read first. */
    _Atomic int32_t in_work;
    _Atomic uint64_t work_start_ns, work_limit_ns;
    char work_what[256];
    char work_limit_name[64];
    /* What this rank called, indexed by the parity of the entry tick: a rank
     * may publish its next collective while a peer still checks this one. */
    alignas(LINE) shm_info info[2];
    alignas(LINE) char reason[512];
} shm_slot;

typedef struct {
    size_t off, size;
} blk;

typedef struct {
    uint8_t *base;
    size_t total;
    shm_header *hdr;
    int rank, world;
    uint64_t tick;      /* my progress; equal on all ranks between collectives */
    uint64_t stage_ctr; /* staging uses so far; equal on all ranks */
    int cur;            /* info[] index of the collective in flight */
    char name[256];
    bool unlinked;
    size_t small_bytes, chunk_shared; /* tunables: rank 0's, from the header */
    uint64_t spin_ns;           /* spin this long before yielding: 0 when ranks outnumber cores */
    int fd;                     /* kept open to reserve heap pages (posix_fallocate) */
    bool pid_visible[256];      /* peers' pids mean something here (same pid namespace) */
    pthread_mutex_t heap_mu;
    blk *blks;
    int nblk, cap;
    /* Rendezvous: who may join (see the top of the file). */
    uint64_t nonce;        /* LK_JOB_NONCE: this rank's launch; 0 when started without lockstep launch */
    int claim_fd;          /* held while the communicator lives: "<name>" (rank 0) or "<name>/rank<k>"; -1 */
    int nonce_fd;          /* rank 0 of a launch: "<name>#<nonce>"; -1 */
    bool created;          /* rank 0 made the segment under the name, so it removes the name */
    unsigned pause_mask;   /* LK_COMM_TEST_RDV_PAUSE: steps that stop this process */
    char sockbase[96];     /* abstract socket names are sockbase + a suffix */
    char ident[200];       /* the identity as messages name it */
    char remedy[160];      /* what to do when two jobs share it */
} shm_comm;

static inline shm_slot *slot_of(shm_comm *s, int k) {
    return (shm_slot *)(s->base + s->hdr->slots_off + (size_t)k * s->hdr->slot_bytes);
}
static inline uint8_t *stage_of(shm_comm *s, int k, uint64_t use) {
    return s->base + s->hdr->stage_off + (size_t)k * s->hdr->stage_bytes + (use & 1) * STAGE_SLOT;
}
static inline uint8_t *heap_of(shm_comm *s, int k) { return s->base + s->hdr->heap_off + (size_t)k * s->hdr->heap_bytes; }

/* ------------------------------------------------------------------------
 * Helpers shared with the launcher.
 * ---------------------------------------------------------------------- */
void lk_comm_shm_segment_name(const char *job_id, char *buf, size_t size) {
    char clean[200];
    size_t n = 0;
    for (const char *p = job_id ? job_id : ""; *p && n < sizeof clean - 1; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
        clean[n++] = ok ? ch : '_';
    }
    clean[n] = 0;
    snprintf(buf, size, "/lockstep-%s", clean);
}

char lk__pid_state(int pid) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return '?';
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = 0;
    char *rp = strrchr(line, ')'); /* comm may contain spaces and parentheses */
    return rp && rp[1] == ' ' && rp[2] ? rp[2] : '?';
}

bool lk__pid_alive(int pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) != 0 && errno != EPERM) return false;
    char st = lk__pid_state(pid);
    return st != 'Z' && st != 'X';
}

static const char *pid_state_word(int pid) {
    switch (lk__pid_state(pid)) {
    case 'T':
    case 't': return "stopped";
    case 'R': return "running";
    case 'S':
    case 'D': return "sleeping";
    case 'Z': return "zombie";
    case '?': return "gone";
    default: return "alive";
    }
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------
 * Waiting.
 * ---------------------------------------------------------------------- */
static void describe_info(shm_info *sl, char *buf, size_t size) {
    lk__coll o = {.kind = (lk__coll_kind)sl->kind, .dt = (lk_dtype)sl->dt, .op = (lk_reduce_op)sl->op, .root = sl->root,
                  .count = sl->count, .seq = sl->seq};
    lk__coll_describe(&o, buf, size);
}

static void describe_slot_op(shm_slot *sl, char *buf, size_t size) { describe_info(&sl->info[atomic_load(&sl->cur) & 1], buf, size); }

/* Fails with REMOTE when peer k is dead, aborted or gone; OK while it may still come. */
static lk_status check_peer(lk_comm *c, shm_comm *s, int k, const char *what) {
    shm_slot *sl = slot_of(s, k);
    int pid = atomic_load(&sl->pid);
    int state = atomic_load(&sl->state);
    if (state == ST_ABORTED)
        return lk_error(LK_STATUS_REMOTE, "%s failed: rank %d (pid %d) aborted: %.400s", what, k, pid, sl->reason);
    if (state == ST_LEFT && sl->reason[0])
        return lk_error(LK_STATUS_REMOTE, "%s failed: rank %d (pid %d) stopped after %llu collectives, on an error of its own: %.400s",
                        what, k, pid, (unsigned long long)atomic_load(&sl->seq_done), sl->reason);
    if (state == ST_LEFT)
        return lk_error(LK_STATUS_REMOTE,
                        "%s failed: rank %d (pid %d) left the communicator (lk_comm_free) after %llu collectives; did the "
                        "ranks issue different numbers of collectives?",
                        what, k, pid, (unsigned long long)atomic_load(&sl->seq_done));
    if (s->pid_visible[k] && !lk__pid_alive(pid))
        return lk_error(LK_STATUS_REMOTE,
                        "%s failed: rank %d (pid %d) died (process gone: killed or exited without lk_comm_free) while "
                        "rank %d waited for it; the job cannot continue",
                        what, k, pid, c->pg.rank);
    return LK_STATUS_OK;
}

/* Whether peer k, still missing from the sync point `target`, is past its
 * bound: comm_timeout of waiting (`waited_ns`, pauses excluded), or, while
 * it announced long work, that work's own limit counted from its start. */
static bool peer_late(shm_comm *s, int k, uint64_t target, uint64_t now, uint64_t waited_ns, uint64_t limit_ns,
                      uint64_t paused_ns) {
    shm_slot *sl = slot_of(s, k);
    if (k == s->rank || atomic_load_explicit(&sl->tick, memory_order_acquire) >= target) return false;
    if (waited_ns < limit_ns) return false;
    if (atomic_load_explicit(&sl->in_work, memory_order_acquire)) {
        uint64_t busy = now - atomic_load(&sl->work_start_ns);
        busy = busy > paused_ns ? busy - paused_ns : 0;
        return busy >= atomic_load(&sl->work_limit_ns);
    }
    return true;
}

/* The error for a wait that ran out: names every rank that did not arrive,
 * its pid, state and what it was doing. Called only when peer_late() found
 * one, so the list is never empty. */
static lk_status timeout_error(lk_comm *c, shm_comm *s, uint64_t target, const char *what, double waited) {
    char missing[1536] = "";
    size_t len = 0;
    int nmiss = 0, nwork = 0;
    char bound[400] = "";
    for (int k = 0; k < s->world && len < sizeof missing - 500; k++) {
        shm_slot *sl = slot_of(s, k);
        if (k == s->rank || atomic_load_explicit(&sl->tick, memory_order_acquire) >= target) continue;
        char where[400];
        int pid = atomic_load(&sl->pid);
        uint64_t now = lk_time_ns();
        uint64_t idle_ns = now - atomic_load(&sl->active_ns);
        if (atomic_load_explicit(&sl->in_work, memory_order_acquire)) {
            double busy = (double)(now - atomic_load(&sl->work_start_ns)) * 1e-9;
            double lim = (double)atomic_load(&sl->work_limit_ns) * 1e-9;
            snprintf(where, sizeof where, "%.200s for %.1f s, limit %g s: %.60s", sl->work_what, busy, lim,
                     sl->work_limit_name);
            if (!nwork++)
                snprintf(bound, sizeof bound, "rank %d's %.200s took longer than %.60s (%g s)", k, sl->work_what,
                         sl->work_limit_name, lim);
        } else if (atomic_load(&sl->in_coll)) describe_slot_op(sl, where, sizeof where);
        else snprintf(where, sizeof where, "not in a collective, %llu completed",
                      (unsigned long long)atomic_load(&sl->seq_done));
        len += (size_t)snprintf(missing + len, sizeof missing - len, "%srank %d (pid %d, %s, last active %.1f s ago, in: %s)",
                                nmiss ? "; " : "", k, pid, pid_state_word(pid), (double)idle_ns * 1e-9, where);
        nmiss++;
    }
    if (nwork == nmiss && nwork)
        return lk_error(LK_STATUS_TIMEOUT, "%s timed out after %.1f s: %s; %d rank%s did not arrive: %s", what, waited,
                        bound, nmiss, nmiss == 1 ? "" : "s", missing);
    return lk_error(LK_STATUS_TIMEOUT, "%s timed out after %.1f s (comm_timeout, LK_COMM_TIMEOUT): %d rank%s did not arrive: %s",
                    what, waited, nmiss, nmiss == 1 ? "" : "s", missing);
}

/* Waits until every peer's tick reaches s->tick. */
static lk_status wait_all(lk_comm *c, shm_comm *s, const lk__coll *op) {
    const uint64_t target = s->tick;
    int k = 0;
    for (; k < s->world; k++)
        if (atomic_load_explicit(&slot_of(s, k)->tick, memory_order_acquire) < target) break;
    if (k == s->world) return LK_STATUS_OK;

    /* Spin briefly (a peer on another core arrives within microseconds), but
     * not when the peer we wait for last ran on our own core: then only
     * yielding lets it run. After 2 ms, sleep: the core is needed elsewhere. */
    const int mycpu = sched_getcpu();
    uint64_t t0 = lk_time_ns(), spin_until = t0 + s->spin_ns, prev = t0, paused = 0;
    uint64_t limit = (uint64_t)(c->timeout_s * 1e9);
    uint64_t next_check = t0 + (limit < CHECK_NS ? limit : CHECK_NS);
    for (unsigned long spins = 1;; spins++) {
        for (; k < s->world; k++)
            if (atomic_load_explicit(&slot_of(s, k)->tick, memory_order_acquire) < target) break;
        if (k == s->world) return LK_STATUS_OK;
        bool same_core = atomic_load_explicit(&slot_of(s, k)->cpu, memory_order_relaxed) == mycpu;
        if (!same_core && (spins & 63)) {
            cpu_relax();
            continue;
        }
        uint64_t now = lk_time_ns();
        /* This process was stopped (the whole job suspended, then resumed):
         * nobody could make progress meanwhile, so none of it counts. */
        uint64_t gap = lk__paused_ns(now, &prev);
        t0 += gap;
        paused += gap;
        if (!same_core && now < spin_until) continue;
        if (now - t0 < 2000000ull) sched_yield();
        else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
        if (now >= next_check) {
            char what[160];
            lk__coll_describe(op, what, sizeof what);
            if (atomic_load(&c->abort_requested) || atomic_load(&c->failed)) {
                pthread_mutex_lock(&c->err_mu);
                lk_status st = lk_error(LK_STATUS_ABORTED, "%s: aborted while waiting: %s", what, c->err_msg);
                pthread_mutex_unlock(&c->err_mu);
                return st;
            }
            bool late = false;
            for (int j = 0; j < s->world; j++) {
                if (j == s->rank || atomic_load_explicit(&slot_of(s, j)->tick, memory_order_acquire) >= target) continue;
                LK_TRY(check_peer(c, s, j, what));
                late = late || peer_late(s, j, target, now, now - t0, limit, paused);
            }
            if (late) return timeout_error(c, s, target, what, (double)(now - t0) * 1e-9);
            /* Next check in 100 ms, or at comm_timeout if that comes first;
             * past it (every missing rank is within its announced long work)
             * the checks keep the ordinary pace. */
            next_check = now + CHECK_NS;
            if (now - t0 < limit && t0 + limit < next_check) next_check = t0 + limit;
        }
    }
}

static inline lk_status sync_all(lk_comm *c, shm_comm *s, const lk__coll *op) {
    s->tick++;
    int cpu = sched_getcpu(); /* where we run now, so a waiter on the same core yields instead of spinning */
    shm_slot *me = slot_of(s, s->rank);
    if (atomic_load_explicit(&me->cpu, memory_order_relaxed) != cpu) atomic_store_explicit(&me->cpu, cpu, memory_order_relaxed);
    atomic_store_explicit(&slot_of(s, s->rank)->tick, s->tick, memory_order_release);
    return wait_all(c, s, op);
}

static int64_t offset_in(shm_comm *s, const void *p, size_t bytes) {
    const uint8_t *q = p;
    if (!p || !bytes || q < s->base || q + bytes > s->base + s->total) return -1;
    return (int64_t)(q - s->base);
}

/* Publishes what this rank is calling and (optionally) what peers may read,
 * syncs, and checks that every rank called the same collective. */
static lk_status enter(lk_comm *c, shm_comm *s, const lk__coll *op, int64_t off) {
    shm_slot *me = slot_of(s, s->rank);
    const int ix = (int)((s->tick + 1) & 1);
    shm_info *mi = &me->info[ix];
    mi->seq = op->seq;
    mi->kind = op->kind;
    mi->dt = op->kind == LK__COLL_BARRIER ? 0 : op->dt;
    mi->op = (op->kind == LK__COLL_ALL_REDUCE || op->kind == LK__COLL_REDUCE_SCATTER) ? (int)op->op : 0;
    mi->root = (op->kind == LK__COLL_BROADCAST || op->kind == LK__COLL_GATHER || op->kind == LK__COLL_SCATTER) ? op->root : 0;
    mi->count = op->kind == LK__COLL_BARRIER ? 0 : op->count;
    mi->off = off;
    atomic_store_explicit(&me->cur, ix, memory_order_relaxed); /* published by the tick's release */
    atomic_store_explicit(&me->in_coll, 1, memory_order_relaxed);
    atomic_store_explicit(&me->in_work, 0, memory_order_relaxed); /* its long work is over: it is here */
    s->cur = ix;
    uint64_t t0 = lk_time_ns();
    LK_TRY(sync_all(c, s, op));
    atomic_fetch_add_explicit(&c->arrival_wait_ns, lk_time_ns() - t0, memory_order_relaxed);
    bool same = true;
    for (int k = 0; k < s->world && same; k++) {
        shm_info *p = &slot_of(s, k)->info[ix];
        same = p->seq == mi->seq && p->kind == mi->kind && p->dt == mi->dt && p->op == mi->op && p->root == mi->root &&
               p->count == mi->count;
    }
    if (same) return LK_STATUS_OK;
    char list[1536];
    size_t len = 0;
    for (int k = 0; k < s->world && len < sizeof list - 180; k++) {
        char d[160];
        describe_info(&slot_of(s, k)->info[ix], d, sizeof d);
        len += (size_t)snprintf(list + len, sizeof list - len, "%srank %d called %s", k ? "; " : "", k, d);
    }
    return lk_error(LK_STATUS_INVALID_USAGE,
                    "collective mismatch (desync): the ranks issued different collectives at the same point: %s", list);
}

/* The offset rank k published for the collective in flight. */
static inline int64_t peer_off(shm_comm *s, int k) { return slot_of(s, k)->info[s->cur].off; }

static void leave(shm_comm *s, const lk__coll *op) {
    shm_slot *me = slot_of(s, s->rank);
    atomic_store_explicit(&me->seq_done, op->seq, memory_order_relaxed); /* diagnostics only */
    atomic_store_explicit(&me->active_ns, lk_time_ns(), memory_order_relaxed);
    atomic_store_explicit(&me->in_coll, 0, memory_order_relaxed);
}

/* Part k of n elements split W ways, aligned to cache lines. */
static inline void part(size_t n, int W, int k, size_t align, size_t *lo, size_t *hi) {
    size_t per = (n + (size_t)W - 1) / (size_t)W;
    per = (per + align - 1) / align * align;
    size_t a = per * (size_t)k, b = a + per;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

/* ------------------------------------------------------------------------
 * Collectives.
 * ---------------------------------------------------------------------- */
#define MAXW 256

static lk_status all_reduce(lk_comm *c, shm_comm *s, const lk__coll *op) {
    const int W = s->world, r = s->rank;
    const size_t esz = lk_dtype_size(op->dt), nb = op->count * esz;
    const int avg = op->op == LK_REDUCE_AVG ? W : 1;
    uint8_t *buf = op->recv;
    const void *srcs[MAXW];
    size_t align = 64 / esz ? 64 / esz : 1;

    if (nb <= s->small_bytes) { /* one step: copy in, sync, everyone reduces everything */
        uint64_t u = s->stage_ctr++;
        if (nb) memcpy(stage_of(s, r, u), buf, nb);
        LK_TRY(enter(c, s, op, -1));
        for (int k = 0; k < W; k++) srcs[k] = stage_of(s, k, u);
        lk__reduce(buf, srcs, W, op->count, op->dt, op->op, avg);
        return LK_STATUS_OK;
    }
    LK_TRY(enter(c, s, op, offset_in(s, buf, nb)));
    bool shared = true;
    for (int k = 0; k < W; k++) shared = shared && peer_off(s, k) >= 0;

    if (shared) {
        /* Every rank's buffer is in the segment: rank r reduces its part once
         * and writes the result into every rank's buffer, chunk by chunk
         * while it is in L1. No rank reads a part another rank writes, so
         * the whole collective is two syncs (all buffers ready, all parts
         * written) — no per-slice syncs for a late peer to stall, and no
         * second pass copying peers' parts back. */
        uint8_t *peer[MAXW];
        for (int k = 0; k < W; k++) peer[k] = s->base + peer_off(s, k);
        size_t lo, hi, chunk = s->chunk_shared / esz;
        part(op->count, W, r, align, &lo, &hi);
        for (size_t at = lo; at < hi; at += chunk) {
            size_t len = hi - at < chunk ? hi - at : chunk;
            for (int k = 0; k < W; k++) srcs[k] = peer[k] + at * esz;
            lk__reduce(buf + at * esz, srcs, W, len, op->dt, op->op, avg);
            for (int k = 0; k < W; k++)
                if (k != r) memcpy(peer[k] + at * esz, buf + at * esz, len * esz);
        }
        return sync_all(c, s, op); /* every part is in every buffer */
    }

    size_t step = STAGE_SLOT / esz;
    step = step / (align * (size_t)W) * (align * (size_t)W);
    for (size_t start = 0; start < op->count; start += step) {
        size_t len = op->count - start < step ? op->count - start : step, lo, hi;
        uint64_t u = s->stage_ctr++;
        memcpy(stage_of(s, r, u), buf + start * esz, len * esz);
        LK_TRY(sync_all(c, s, op));
        part(len, W, r, align, &lo, &hi);
        for (int k = 0; k < W; k++) srcs[k] = stage_of(s, k, u) + lo * esz;
        lk__reduce(stage_of(s, r, u) + lo * esz, srcs, W, hi - lo, op->dt, op->op, avg);
        LK_TRY(sync_all(c, s, op));
        for (int k = 0; k < W; k++) {
            part(len, W, k, align, &lo, &hi);
            if (hi > lo) memcpy(buf + (start + lo) * esz, stage_of(s, k, u) + lo * esz, (hi - lo) * esz);
        }
    }
    return LK_STATUS_OK;
}

static lk_status broadcast(lk_comm *c, shm_comm *s, const lk__coll *op) {
    const int r = s->rank, root = op->root;
    const size_t nb = op->count * lk_dtype_size(op->dt);
    uint8_t *buf = op->recv;
    LK_TRY(enter(c, s, op, r == root ? offset_in(s, buf, nb) : -1));
    if (!nb) return LK_STATUS_OK;
    int64_t roff = peer_off(s, root);
    if (roff >= 0) {
        if (r != root) memcpy(buf, s->base + roff, nb);
        return sync_all(c, s, op);
    }
    for (size_t start = 0; start < nb; start += STAGE_SLOT) {
        size_t len = nb - start < STAGE_SLOT ? nb - start : STAGE_SLOT;
        uint64_t u = s->stage_ctr++;
        if (r == root) memcpy(stage_of(s, r, u), buf + start, len);
        LK_TRY(sync_all(c, s, op));
        if (r != root) memcpy(buf + start, stage_of(s, root, u), len);
    }
    return LK_STATUS_OK;
}

/* all_gather and gather: every rank's send block goes to recv (all, or root only). */
static lk_status gather_like(lk_comm *c, shm_comm *s, const lk__coll *op, bool all) {
    const int W = s->world, r = s->rank;
    const size_t nb = op->count * lk_dtype_size(op->dt);
    const uint8_t *send = op->send;
    uint8_t *recv = op->recv;
    bool receiver = all || r == op->root;
    LK_TRY(enter(c, s, op, offset_in(s, send, nb)));
    if (!nb) return LK_STATUS_OK;
    if (receiver && recv + (size_t)r * nb != send) memmove(recv + (size_t)r * nb, send, nb);
    bool shared = true;
    for (int k = 0; k < W; k++) shared = shared && peer_off(s, k) >= 0;
    if (shared) {
        if (receiver)
            for (int k = 0; k < W; k++)
                if (k != r) memcpy(recv + (size_t)k * nb, s->base + peer_off(s, k), nb);
        return sync_all(c, s, op);
    }
    for (size_t start = 0; start < nb; start += STAGE_SLOT) {
        size_t len = nb - start < STAGE_SLOT ? nb - start : STAGE_SLOT;
        uint64_t u = s->stage_ctr++;
        memcpy(stage_of(s, r, u), send + start, len);
        LK_TRY(sync_all(c, s, op));
        if (receiver)
            for (int k = 0; k < W; k++)
                if (k != r) memcpy(recv + (size_t)k * nb + start, stage_of(s, k, u), len);
    }
    return LK_STATUS_OK;
}

/* reduce_scatter and scatter: block r of W send blocks goes to rank r,
 * reduced over all ranks' sends or taken from root's. */
static lk_status scatter_like(lk_comm *c, shm_comm *s, const lk__coll *op, bool reduce) {
    const int W = s->world, r = s->rank;
    const size_t esz = lk_dtype_size(op->dt), nb = op->count * esz;
    const uint8_t *send = op->send;
    uint8_t *recv = op->recv;
    const void *srcs[MAXW];
    bool sender = reduce || r == op->root;
    LK_TRY(enter(c, s, op, sender ? offset_in(s, send, nb * (size_t)W) : -1));
    if (!nb) return LK_STATUS_OK;
    bool shared = true;
    if (reduce)
        for (int k = 0; k < W; k++) shared = shared && peer_off(s, k) >= 0;
    else shared = peer_off(s, op->root) >= 0;
    if (shared) {
        if (reduce) {
            for (int k = 0; k < W; k++) srcs[k] = s->base + peer_off(s, k) + (size_t)r * nb;
            lk__reduce(recv, srcs, W, op->count, op->dt, op->op, op->op == LK_REDUCE_AVG ? W : 1);
        } else {
            memcpy(recv, s->base + peer_off(s, op->root) + (size_t)r * nb, nb);
        }
        return sync_all(c, s, op);
    }
    size_t step = STAGE_SLOT / ((size_t)W * esz); /* elements of each block per slice */
    for (size_t start = 0; start < op->count; start += step) {
        size_t len = op->count - start < step ? op->count - start : step;
        uint64_t u = s->stage_ctr++;
        if (sender)
            for (int j = 0; j < W; j++)
                memcpy(stage_of(s, r, u) + (size_t)j * len * esz, send + ((size_t)j * op->count + start) * esz, len * esz);
        LK_TRY(sync_all(c, s, op));
        if (reduce) {
            for (int k = 0; k < W; k++) srcs[k] = stage_of(s, k, u) + (size_t)r * len * esz;
            lk__reduce(recv + start * esz, srcs, W, len, op->dt, op->op, op->op == LK_REDUCE_AVG ? W : 1);
        } else {
            memcpy(recv + start * esz, stage_of(s, op->root, u) + (size_t)r * len * esz, len * esz);
        }
    }
    return LK_STATUS_OK;
}

static lk_status shm_run(lk_comm *c, const lk__coll *op) {
    shm_comm *s = c->impl;
    lk_status st;
    switch (op->kind) {
    case LK__COLL_ALL_REDUCE: st = all_reduce(c, s, op); break;
    case LK__COLL_BROADCAST: st = broadcast(c, s, op); break;
    case LK__COLL_ALL_GATHER: st = gather_like(c, s, op, true); break;
    case LK__COLL_GATHER: st = gather_like(c, s, op, false); break;
    case LK__COLL_REDUCE_SCATTER: st = scatter_like(c, s, op, true); break;
    case LK__COLL_SCATTER: st = scatter_like(c, s, op, false); break;
    case LK__COLL_BARRIER: st = enter(c, s, op, -1); break;
    default: return lk_error(LK_STATUS_INTERNAL, "shm: unknown collective %d", (int)op->kind);
    }
    if (!st) leave(s, op);
    return st;
}

/* ------------------------------------------------------------------------
 * Shared heap: each rank allocates from its own region; the block list is
 * private to the process (only the owner allocates there).
 * ---------------------------------------------------------------------- */
static void shm_free_shared(lk_comm *c, void *ptr);

static lk_status shm_alloc_shared(lk_comm *c, size_t bytes, void **ptr) {
    shm_comm *s = c->impl;
    size_t size = (bytes ? bytes : 1) + 255;
    size &= ~(size_t)255;
    pthread_mutex_lock(&s->heap_mu);
    size_t cap = s->hdr->heap_bytes, at = 0;
    int i = 0;
    for (; i < s->nblk; i++) {
        if (s->blks[i].off - at >= size) break;
        at = s->blks[i].off + s->blks[i].size;
    }
    if (cap - at < size || at > cap) {
        size_t used = 0;
        for (int j = 0; j < s->nblk; j++) used += s->blks[j].size;
        pthread_mutex_unlock(&s->heap_mu);
        return lk_error(LK_STATUS_OUT_OF_MEMORY,
                        "lk_comm_alloc_shared: %zu bytes do not fit in rank %d's shared heap (%zu of %zu bytes in use); "
                        "raise lk_comm_config.shared_bytes or LK_COMM_SHM_BYTES",
                        bytes, s->rank, used, cap);
    }
    if (s->nblk == s->cap && lk_vec_reserve(s->blks, s->cap, s->nblk + 1, 16)) {
        pthread_mutex_unlock(&s->heap_mu);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    memmove(s->blks + i + 1, s->blks + i, (size_t)(s->nblk - i) * sizeof *s->blks);
    s->blks[i] = (blk){at, size};
    s->nblk++;
    pthread_mutex_unlock(&s->heap_mu);
    uint8_t *p = heap_of(s, s->rank) + at;
    int rc = s->fd >= 0 ? posix_fallocate(s->fd, (off_t)(p - s->base), (off_t)size) : 0;
    if (rc) {
        shm_free_shared(c, p);
        return lk_error(LK_STATUS_OUT_OF_MEMORY,
                        "lk_comm_alloc_shared: cannot reserve %zu bytes in /dev/shm: %s (is /dev/shm too small? "
                        "df -h /dev/shm)",
                        bytes, strerror(rc));
    }
    memset(p, 0, bytes);
    *ptr = p;
    return LK_STATUS_OK;
}

static void shm_free_shared(lk_comm *c, void *ptr) {
    shm_comm *s = c->impl;
    size_t off = (size_t)((uint8_t *)ptr - heap_of(s, s->rank));
    pthread_mutex_lock(&s->heap_mu);
    for (int i = 0; i < s->nblk; i++)
        if (s->blks[i].off == off) {
            memmove(s->blks + i, s->blks + i + 1, (size_t)(s->nblk - i - 1) * sizeof *s->blks);
            s->nblk--;
            break;
        }
    pthread_mutex_unlock(&s->heap_mu);
}

static int64_t shm_shared_offset(lk_comm *c, const void *p) {
    shm_comm *s = c->impl;
    return (int64_t)((const uint8_t *)p - heap_of(s, s->rank));
}

static void *shm_shared_at(lk_comm *c, int k, int64_t off) { return heap_of(c->impl, k) + off; }

/* ------------------------------------------------------------------------
 * Rendezvous.
 * ---------------------------------------------------------------------- */

/* The shm backend joins the processes of one node: a MASTER_ADDR that does
 * not resolve, or resolves to another host, is a launch mistake. */
static lk_status check_master_addr(const char *addr) {
    if (!addr || !*addr) return LK_STATUS_OK;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(addr, NULL, &hints, &res);
    if (rc)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "MASTER_ADDR='%s' does not resolve (%s); expected this host's name or address",
                        addr, gai_strerror(rc));
    bool local = false;
    struct ifaddrs *ifs = NULL;
    getifaddrs(&ifs);
    for (struct addrinfo *a = res; a && !local; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            uint32_t ip = ntohl(((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr);
            if ((ip >> 24) == 127 || ip == 0) local = true;
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
                if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == ((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr)
                    local = true;
        } else if (a->ai_family == AF_INET6) {
            const struct in6_addr *ip6 = &((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
            if (IN6_IS_ADDR_LOOPBACK(ip6)) local = true;
            for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
                if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6 &&
                    !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, ip6, sizeof *ip6))
                    local = true;
        }
    }
    if (ifs) freeifaddrs(ifs);
    freeaddrinfo(res);
    if (!local)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "MASTER_ADDR='%s' is not an address of this host: the shm backend joins the processes of one node "
                        "(start multi-node jobs with mpirun/srun for the mpi backend, or set MASTER_ADDR=127.0.0.1)",
                        addr);
    return LK_STATUS_OK;
}

static void layout(int W, size_t heap, shm_header *h) {
    const size_t page = 4096;
    h->slots_off = page;
    h->slot_bytes = sizeof(shm_slot);
    h->stage_off = (h->slots_off + (size_t)W * h->slot_bytes + page - 1) / page * page;
    h->stage_bytes = 2 * STAGE_SLOT;
    h->heap_off = h->stage_off + (size_t)W * h->stage_bytes;
    h->heap_bytes = (heap + page - 1) / page * page;
    h->total = h->heap_off + (size_t)W * h->heap_bytes;
}

static void unmap(shm_comm *s) {
    if (s->base) munmap(s->base, s->total);
    s->base = NULL;
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

static bool same_segment(const char *name, int fd);

/* ------------------------------------------------------------------------
 * Identity: the claims that keep two jobs with one job id apart.
 * ---------------------------------------------------------------------- */
enum { RDV_CLAIM, RDV_OPEN, RDV_SLOT, RDV_PUBLISH, RDV_WAIT, RDV_SEAL, RDV_DONE, RDV_NSTEPS };
static const char *const rdv_step_names[RDV_NSTEPS] = {"claim", "open", "slot", "publish", "wait", "seal", "done"};

/* LK_COMM_TEST_RDV_PAUSE: "all" or a comma-separated list of step names. */
static unsigned rdv_pause_mask(void) {
    const char *v = lk_env_get("LK_COMM_TEST_RDV_PAUSE");
    if (!v || !*v) return 0;
    char buf[160];
    snprintf(buf, sizeof buf, "%s", v);
    unsigned mask = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        int i = 0;
        while (i < RDV_NSTEPS && strcmp(t, rdv_step_names[i])) i++;
        if (!strcmp(t, "all")) mask = (1u << RDV_NSTEPS) - 1;
        else if (i < RDV_NSTEPS) mask |= 1u << i;
        else lk_log_warn("LK_COMM_TEST_RDV_PAUSE: unknown step '%s' (expected all or claim, open, slot, publish, wait, "
                         "seal, done): ignored", t);
    }
    return mask;
}

/* Tests stop here (SIGSTOP) and continue the process when they choose: the
 * steps of two jobs' ranks then run in the order the test forces. */
static void rdv_step(const shm_comm *s, int step) {
    if (s->pause_mask >> step & 1u) raise(SIGSTOP);
}

static uint64_t fnv1a64(const char *p) {
    uint64_t h = 1469598103934665603ull;
    for (; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

/* LK_JOB_NONCE as a number: the launcher's 16 hex digits, or any other text
 * hashed; never 0, which means "no nonce". */
static uint64_t parse_nonce(const char *v) {
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 16);
    uint64_t n = !*end && !errno && strlen(v) == 16 ? (uint64_t)x : fnv1a64(v);
    return n ? n : 1;
}

/* The abstract socket names of a segment: "lockstep-<job>" (hashed when long:
 * an address holds 107 bytes). Abstract names live in the network namespace:
 * ranks in containers that share /dev/shm but not the network do not see
 * each other's claims, and only the segment's own checks remain. */
static void sock_base(const char *segname, char *buf, size_t size) {
    const char *n = segname[0] == '/' ? segname + 1 : segname;
    if (strlen(n) <= 64) snprintf(buf, size, "%s", n);
    else snprintf(buf, size, "%.40s~%016llx", n, (unsigned long long)fnv1a64(n));
}

static socklen_t sock_addr(const char *base, const char *suffix, struct sockaddr_un *a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "%s%s", base, suffix); /* sun_path[0] = 0: abstract */
    if (n < 0) n = 0;
    if ((size_t)n > sizeof a->sun_path - 2) n = (int)(sizeof a->sun_path - 2);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Whether a live process holds the name (listens on it); its pid in *pid
 * (0: unknown: its queue is full). The connection stays queued on the
 * holder's socket: for a rank of a job without a nonce that is the notice
 * it reads at its seal. */
static bool probe_name(const struct sockaddr_un *a, socklen_t len, int *pid) {
    if (pid) *pid = 0;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    int rc = connect(fd, (const struct sockaddr *)a, len), e = errno;
    if (rc == 0 && pid) {
        struct ucred cr;
        socklen_t cl = sizeof cr;
        if (!getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl)) *pid = cr.pid;
    }
    close(fd);
    return rc == 0 || e == EAGAIN;
}

/* Takes the name for this process (released when *fd is closed or the
 * process dies; close-on-exec, but a child forked without exec keeps it
 * until it exits): 0 taken; 1 a live process holds it (pid in *holder, 0
 * unknown), and now has our connection queued; -1 error (errno). Probing
 * before binding makes "find it held" and "tell the holder" one step: the
 * holder can only miss the notice if it looked before we found it held. */
static int claim_name(const struct sockaddr_un *a, socklen_t len, int *fd, int *holder) {
    for (int tries = 0;; tries++) {
        if (probe_name(a, len, holder)) return 1;
        int sfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (sfd < 0) return -1;
        /* The queue holds the notices (and probes) of other jobs' ranks; a
         * full one still reads as held, only without the holder's pid. */
        if (!bind(sfd, (const struct sockaddr *)a, len) && !listen(sfd, 128)) {
            *fd = sfd;
            return 0;
        }
        int e = errno;
        close(sfd);
        if (e != EADDRINUSE) {
            errno = e;
            return -1;
        }
        /* Bound but not listening yet (its holder is between the two calls),
         * or just released. Something that binds and never listens is not
         * lockstep: after 2 s it counts as a holder. */
        if (tries >= 2000) {
            *holder = 0;
            return 1;
        }
        sleep_ms(1);
    }
}

static void holder_words(int pid, char *buf, size_t size) {
    if (pid > 0) snprintf(buf, size, "pid %d", pid);
    else snprintf(buf, size, "a live process (its pid unknown)");
}

/* The pids of the ranks attached to the segment now under the name, for
 * messages ("" when there is none). */
static void segment_pids(const char *name, char *buf, size_t size) {
    buf[0] = 0;
    int fd = shm_open(name, O_RDONLY, 0600);
    if (fd < 0) return;
    struct stat st;
    shm_header *h = NULL;
    size_t map = 0; /* the header page and the control slots, not the heaps */
    if (!fstat(fd, &st) && (size_t)st.st_size >= 4096) {
        map = (size_t)st.st_size < 4096 + MAXW * sizeof(shm_slot) ? (size_t)st.st_size : 4096 + MAXW * sizeof(shm_slot);
        h = mmap(NULL, map, PROT_READ, MAP_SHARED, fd, 0);
        if (h == MAP_FAILED) h = NULL;
    }
    if (h && atomic_load(&h->magic) == SHM_MAGIC && h->world > 0 && h->world <= MAXW &&
        h->slots_off + (uint64_t)h->world * h->slot_bytes <= (uint64_t)map) {
        size_t len = (size_t)snprintf(buf, size, "; its ranks: ");
        int n = 0;
        for (int k = 0; k < h->world && len + 40 < size; k++) {
            const shm_slot *sl = (const shm_slot *)((const uint8_t *)h + h->slots_off + (size_t)k * h->slot_bytes);
            int pid = atomic_load(&((shm_slot *)sl)->pid);
            if (pid) len += (size_t)snprintf(buf + len, size - len, "%s%d = pid %d", n++ ? ", " : "", k, pid);
        }
        if (!n) buf[0] = 0;
    }
    if (h) munmap(h, map);
    close(fd);
}

/* Step 1: rank 0 takes "<name>#<nonce>" (a launch's) and then "<name>";
 * without a nonce, rank k > 0 takes "<name>/rank<k>". Joiners of a launch
 * take nothing: the nonce keeps them out of other segments. */
static lk_status claim(shm_comm *s) {
    struct sockaddr_un a;
    socklen_t len;
    char suffix[40], who[64], pids[400];
    int holder = 0, rc;
    if (s->rank == 0 && s->nonce) {
        snprintf(suffix, sizeof suffix, "#%016llx", (unsigned long long)s->nonce);
        len = sock_addr(s->sockbase, suffix, &a);
        rc = claim_name(&a, len, &s->nonce_fd, &holder);
        if (rc < 0) return lk_error(LK_STATUS_IO, "rendezvous: cannot claim the socket @%s: %s", a.sun_path + 1, strerror(errno));
        if (rc > 0) {
            holder_words(holder, who, sizeof who);
            return lk_error(LK_STATUS_INVALID_USAGE,
                            "rendezvous: rank 0 of this launch of %s is already running as %s (two processes started with "
                            "RANK=0 and the same LK_JOB_NONCE?)",
                            s->ident, who);
        }
    }
    if (s->rank == 0) {
        len = sock_addr(s->sockbase, "", &a);
        rc = claim_name(&a, len, &s->claim_fd, &holder);
        if (rc < 0) return lk_error(LK_STATUS_IO, "rendezvous: cannot claim the socket @%s: %s", a.sun_path + 1, strerror(errno));
        if (rc > 0) {
            holder_words(holder, who, sizeof who);
            segment_pids(s->name, pids, sizeof pids);
            return lk_error(LK_STATUS_INVALID_USAGE,
                            "rendezvous: %s is already in use on this host: %s holds it (rank 0 of another job, shm segment "
                            "%s%s); two jobs cannot share it: %s, or stop the other job",
                            s->ident, who, s->name, pids, s->remedy);
        }
        return LK_STATUS_OK;
    }
    if (s->nonce) return LK_STATUS_OK;
    snprintf(suffix, sizeof suffix, "/rank%d", s->rank);
    len = sock_addr(s->sockbase, suffix, &a);
    rc = claim_name(&a, len, &s->claim_fd, &holder);
    if (rc < 0) return lk_error(LK_STATUS_IO, "rendezvous: cannot claim the socket @%s: %s", a.sun_path + 1, strerror(errno));
    if (rc > 0) {
        holder_words(holder, who, sizeof who);
        segment_pids(s->name, pids, sizeof pids);
        return lk_error(LK_STATUS_INVALID_USAGE,
                        "rendezvous: rank %d of %s is already held on this host by %s, a live process of another job (shm "
                        "segment %s%s); two jobs cannot share it: %s, or stop the other job",
                        s->rank, s->ident, who, s->name, pids, s->remedy);
    }
    return LK_STATUS_OK;
}

/* A joiner of a launch waiting for its segment: "<name>" held while
 * "<name>#<our nonce>" is not means rank 0 of another job holds the id (our
 * rank 0 takes its nonce's name first and releases it last), so ours cannot
 * get it: fail now instead of at comm_timeout. */
static lk_status check_foreign_holder(shm_comm *s) {
    struct sockaddr_un a;
    int holder = 0;
    socklen_t len = sock_addr(s->sockbase, "", &a);
    if (!probe_name(&a, len, &holder)) return LK_STATUS_OK;
    char suffix[40], who[64];
    snprintf(suffix, sizeof suffix, "#%016llx", (unsigned long long)s->nonce);
    len = sock_addr(s->sockbase, suffix, &a);
    if (probe_name(&a, len, NULL)) return LK_STATUS_OK;
    holder_words(holder, who, sizeof who);
    return lk_error(LK_STATUS_INVALID_USAGE,
                    "rendezvous: %s is already in use on this host: %s holds it, and it is not rank 0 of this rank's launch "
                    "(another job with the same id; shm segment %s): %s, or stop the other job",
                    s->ident, who, s->name, s->remedy);
}

/* Step 6, after every rank attached: a notice queued on this rank's claim
 * means another process wanted this rank while the job formed (see the top
 * of the file). This rank then aborts with the reason in its slot: no
 * collective can complete without it, and a peer that sealed first fails
 * its first collective quoting that reason. */
static lk_status seal(shm_comm *s) {
    shm_slot *me = slot_of(s, s->rank);
    if (!s->nonce && s->claim_fd >= 0) {
        int fd = accept4(s->claim_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            struct ucred cr = {0};
            socklen_t cl = sizeof cr;
            if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl)) cr.pid = 0;
            close(fd);
            char who[64], pids[400];
            holder_words(cr.pid, who, sizeof who);
            segment_pids(s->name, pids, sizeof pids);
            lk_status st = lk_error(LK_STATUS_INVALID_USAGE,
                                    "rendezvous: %s also wanted rank %d of %s while this job formed (shm segment %s%s): "
                                    "two jobs with the same id started together on this host, so this job's ranks may "
                                    "come from both, and it stops before any collective mixes their data: %s",
                                    who, s->rank, s->ident, s->name, pids, s->remedy);
            snprintf(me->reason, sizeof me->reason, "%s", lk_last_error());
            atomic_store(&me->state, ST_ABORTED);
            return st;
        }
    }
    return LK_STATUS_OK;
}

/* The launcher, after its ranks are gone: removes the segment name when it
 * is its job's (same nonce), or nobody holds the id any more (a stale one).
 * Another live job's segment is left alone. */
void lk__shm_cleanup(const char *job_id, uint64_t nonce) {
    char name[256], base[96];
    lk_comm_shm_segment_name(job_id, name, sizeof name);
    int fd = shm_open(name, O_RDONLY, 0600);
    if (fd < 0) return;
    bool ours = false;
    struct stat st;
    if (!fstat(fd, &st) && (size_t)st.st_size >= sizeof(shm_header)) {
        shm_header *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, fd, 0);
        if (h != MAP_FAILED) {
            ours = atomic_load(&h->magic) == SHM_MAGIC && h->nonce == nonce;
            munmap(h, sizeof *h);
        }
    }
    struct sockaddr_un a;
    sock_base(name, base, sizeof base);
    socklen_t len = sock_addr(base, "", &a);
    if ((ours || !probe_name(&a, len, NULL)) && same_segment(name, fd)) shm_unlink(name);
    close(fd);
}

uint64_t lk__job_nonce(const char *text) { return parse_nonce(text); }

/* Creator (rank 0): a fresh segment; a stale one left by a dead job is replaced. */
static lk_status create_segment(lk_comm *c, shm_comm *s) {
    shm_header want = {0};
    layout(s->world, c->shared_bytes, &want);
    for (int attempt = 0;; attempt++) {
        int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 && errno == EEXIST && attempt < 100) {
            int ofd = shm_open(s->name, O_RDWR, 0600);
            int owner = 0;
            if (ofd >= 0) {
                struct stat st;
                if (!fstat(ofd, &st) && (size_t)st.st_size >= sizeof(shm_header)) {
                    shm_header *h = mmap(NULL, sizeof *h, PROT_READ, MAP_SHARED, ofd, 0);
                    if (h != MAP_FAILED) {
                        owner = h->creator_pid;
                        munmap(h, sizeof *h);
                    }
                }
                close(ofd);
            }
            if (!owner && attempt < 50) { /* its creator is still writing the header */
                sleep_ms(2);
                continue;
            }
            /* We hold the id's claim, so a live creator is a job we cannot
             * see claims of (another network namespace sharing /dev/shm). */
            if (owner && lk__pid_alive(owner) && owner != getpid()) {
                char pids[400];
                segment_pids(s->name, pids, sizeof pids);
                return lk_error(LK_STATUS_INVALID_USAGE,
                                "rendezvous: %s is already in use on this host: shm segment %s belongs to a live job "
                                "(creator pid %d%s); two jobs cannot share it: %s, or stop the other job",
                                s->ident, s->name, owner, pids, s->remedy);
            }
            shm_unlink(s->name); /* stale: its creator is gone */
            continue;
        }
        if (fd < 0) return lk_error(LK_STATUS_IO, "shm_open(%s) failed: %s", s->name, strerror(errno));
        if (ftruncate(fd, (off_t)want.total)) {
            int e = errno;
            close(fd);
            shm_unlink(s->name);
            return lk_error(LK_STATUS_IO, "ftruncate(%s, %zu) failed: %s", s->name, (size_t)want.total, strerror(e));
        }
        /* Reserve the control and staging pages now: a full /dev/shm must be an
         * error here, not a SIGBUS in the middle of a collective. */
        int rc = posix_fallocate(fd, 0, (off_t)want.heap_off);
        if (rc) {
            close(fd);
            shm_unlink(s->name);
            return lk_error(LK_STATUS_OUT_OF_MEMORY, "cannot reserve %zu bytes in /dev/shm for %s: %s (is /dev/shm too small?)",
                            (size_t)want.heap_off, s->name, strerror(rc));
        }
        void *p = mmap(NULL, want.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            shm_unlink(s->name);
            return lk_error(LK_STATUS_IO, "mmap(%s, %zu bytes) failed: %s", s->name, (size_t)want.total, strerror(errno));
        }
        s->base = p;
        s->total = want.total;
        s->hdr = p;
        s->fd = fd;
        s->created = true;
        shm_header *h = s->hdr;
        h->version = 5;
        h->nonce = s->nonce;
        h->world = s->world;
        h->creator_pid = getpid();
        h->total = want.total;
        h->slots_off = want.slots_off;
        h->slot_bytes = want.slot_bytes;
        h->stage_off = want.stage_off;
        h->stage_bytes = want.stage_bytes;
        h->heap_off = want.heap_off;
        h->heap_bytes = want.heap_bytes;
        h->small_bytes = s->small_bytes;
        h->chunk_shared = s->chunk_shared;
        snprintf(h->job_id, sizeof h->job_id, "%s", c->job_id);
        atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
        return LK_STATUS_OK;
    }
}

/* Whether the name still refers to the object we opened as fd: rank 0
 * replaces a stale segment by unlinking it and creating a new one under the
 * same name, and a mapping of the old one would never see its header. */
static bool same_segment(const char *name, int fd) {
    struct stat mine, now;
    int nfd = shm_open(name, O_RDONLY, 0600);
    if (nfd < 0) return false;
    bool same = !fstat(fd, &mine) && !fstat(nfd, &now) && mine.st_ino == now.st_ino && mine.st_dev == now.st_dev;
    close(nfd);
    return same;
}

static lk_status attach_segment(lk_comm *c, shm_comm *s, uint64_t deadline) {
    char why[700] = "not created yet";
    uint64_t next_probe = 0;
    while (lk_time_ns() < deadline) {
        if (s->nonce && lk_time_ns() >= next_probe) {
            LK_TRY(check_foreign_holder(s));
            next_probe = lk_time_ns() + 20000000ull; /* each probe queues a connection on the holder */
        }
        int fd = shm_open(s->name, O_RDWR, 0600);
        if (fd < 0) {
            sleep_ms(2);
            continue;
        }
        struct stat st;
        if (fstat(fd, &st) || (size_t)st.st_size < sizeof(shm_header)) {
            if (!fstat(fd, &st))
                snprintf(why, sizeof why, "it exists with %lld bytes, less than lockstep's %zu-byte header: being created, or "
                         "a stale file rank 0 has not replaced", (long long)st.st_size, sizeof(shm_header));
            close(fd);
            sleep_ms(1);
            continue;
        }
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return lk_error(LK_STATUS_IO, "mmap(%s) failed: %s", s->name, strerror(errno));
        }
        shm_header *h = p;
        /* Wait for the creator to finish the header, but only while the name
         * still means this file: a stale one is replaced, not completed. */
        bool replaced = false;
        for (int i = 1; atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC && lk_time_ns() < deadline; i++) {
            sleep_ms(1);
            if (i % 20 == 0 && !same_segment(s->name, fd)) {
                replaced = true;
                break;
            }
        }
        uint64_t magic = atomic_load_explicit(&h->magic, memory_order_acquire);
        if (replaced || magic != SHM_MAGIC || h->total != (uint64_t)st.st_size || !lk__pid_alive(h->creator_pid)) {
            if (replaced) snprintf(why, sizeof why, "a stale file was there and has been replaced");
            else if (magic != SHM_MAGIC)
                snprintf(why, sizeof why,
                         "/dev/shm%.256s exists (%lld bytes) but has no lockstep header (magic 0x%016llx, expected 0x%016llx); "
                         "rank 0 never replaced it: a leftover of another program or version? remove it",
                         s->name, (long long)st.st_size, (unsigned long long)magic, (unsigned long long)SHM_MAGIC);
            else snprintf(why, sizeof why, "stale: its creator pid %d is gone", h->creator_pid);
            munmap(p, (size_t)st.st_size); /* stale or foreign: wait for the real one */
            close(fd);
            sleep_ms(5);
            continue;
        }
        if (h->nonce != s->nonce) {
            /* A live job's segment, not our launch's: never take a slot in it. */
            int owner = h->creator_pid;
            const char *how = !h->nonce ? ", started without 'lockstep launch'"
                              : s->nonce ? ", started by another 'lockstep launch'"
                                         : ", started by 'lockstep launch'";
            char pids[400];
            munmap(p, (size_t)st.st_size);
            close(fd);
            segment_pids(s->name, pids, sizeof pids);
            return lk_error(LK_STATUS_INVALID_USAGE,
                            "rendezvous: %s is already in use on this host: shm segment %s belongs to another job (its rank "
                            "0 is pid %d%s%s); two jobs cannot share it: %s, or stop the other job",
                            s->ident, s->name, owner, how, pids, s->remedy);
        }
        s->base = p;
        s->total = (size_t)st.st_size;
        s->hdr = h;
        s->fd = fd;
        return LK_STATUS_OK;
    }
    return lk_error(LK_STATUS_TIMEOUT,
                    "rendezvous: rank %d waited %.1f s for local rank 0 to create shm segment %s (%s); is rank 0 running, "
                    "with the same LK_JOB_ID/MASTER_PORT?",
                    s->rank, c->timeout_s, s->name, why);
}

static lk_status rendezvous(lk_comm *c, shm_comm *s) {
    uint64_t t0 = lk_time_ns(), deadline = t0 + (uint64_t)(c->timeout_s * 1e9);
    rdv_step(s, RDV_CLAIM);
    LK_TRY(claim(s));
    rdv_step(s, RDV_OPEN);
    if (s->rank == 0) LK_TRY(create_segment(c, s));
    else LK_TRY(attach_segment(c, s, deadline));
    rdv_step(s, RDV_SLOT);
    shm_header *h = s->hdr;
    if (h->world != s->world)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "rendezvous: WORLD_SIZE mismatch: rank %d has world size %d but rank 0 created the job with world "
                        "size %d",
                        s->rank, s->world, h->world);
    s->small_bytes = h->small_bytes; /* rank 0's choice wins, whatever this rank's environment says */
    s->chunk_shared = h->chunk_shared;
    shm_slot *me = slot_of(s, s->rank);
    int expected = 0, mypid = getpid();
    if (!atomic_compare_exchange_strong(&me->pid, &expected, mypid))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "rendezvous: rank %d of %s is already taken by pid %d (shm segment %s): two processes started with "
                        "the same RANK, or two jobs with the same id (%s)",
                        s->rank, s->ident, expected, s->name, s->remedy);
    me->world = s->world;
    atomic_store(&me->active_ns, lk_time_ns());
    rdv_step(s, RDV_PUBLISH);
    atomic_store(&me->state, ST_ATTACHED);
    atomic_fetch_add(&h->attached, 1);
    rdv_step(s, RDV_WAIT);
    uint64_t next_check = lk_time_ns() + CHECK_NS;
    while (atomic_load(&h->attached) < s->world) {
        uint64_t now = lk_time_ns();
        if (now >= deadline) {
            char missing[512] = "";
            size_t len = 0;
            int n = 0;
            for (int k = 0; k < s->world && len < sizeof missing - 16; k++)
                if (atomic_load(&slot_of(s, k)->state) == ST_EMPTY)
                    len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d", n++ ? ", " : "", k);
            return lk_error(LK_STATUS_TIMEOUT,
                            "rendezvous timed out after %.1f s: %d of %d ranks attached to %s (missing rank%s %s); "
                            "WORLD_SIZE=%d does not match the processes started?",
                            (double)(now - t0) * 1e-9, atomic_load(&h->attached), s->world, s->name, n == 1 ? "" : "s",
                            missing, s->world);
        }
        if (now >= next_check) {
            for (int k = 0; k < s->world; k++) {
                shm_slot *sl = slot_of(s, k);
                int pid = atomic_load(&sl->pid);
                if (k != s->rank && pid && !lk__pid_alive(pid))
                    return lk_error(LK_STATUS_REMOTE, "rendezvous: rank %d (pid %d) died while the job was starting", k, pid);
            }
            next_check = now + CHECK_NS;
        }
        sleep_ms(1);
    }
    rdv_step(s, RDV_SEAL);
    LK_TRY(seal(s));
    rdv_step(s, RDV_DONE);
    /* Peers in another pid namespace (containers sharing /dev/shm) have pids
     * that mean nothing here: for them only timeouts and abort states count. */
    for (int k = 0; k < s->world; k++) s->pid_visible[k] = lk__pid_alive(atomic_load(&slot_of(s, k)->pid));
    /* Everyone is in: remove the name now, so no crash can leak it. Rank 0
     * holds the id, so the name is still its segment; another rank removes
     * it only while it still is (rank 0 may have moved on to a new
     * communicator under the same name). */
    if (s->rank == 0 || same_segment(s->name, s->fd)) shm_unlink(s->name);
    s->unlinked = true;
    return LK_STATUS_OK;
}

/* Releases the claims: "<name>" before "<name>#<nonce>", so a joiner never
 * sees the id held and its launch's name free while its own rank 0 has it. */
static void release_claims(shm_comm *s) {
    if (s->claim_fd >= 0) close(s->claim_fd);
    if (s->nonce_fd >= 0) close(s->nonce_fd);
    s->claim_fd = s->nonce_fd = -1;
}

static void shm_destroy(lk_comm *c) {
    shm_comm *s = c->impl;
    if (!s) return;
    if (s->base) {
        shm_slot *me = slot_of(s, s->rank);
        if (atomic_load(&me->state) == ST_ATTACHED) {
            /* the reason first: a peer reads it once it sees ST_LEFT (seq_cst store below) */
            snprintf(me->reason, sizeof me->reason, "%s", c->leave_reason);
            atomic_store(&me->state, ST_LEFT);
        }
    }
    if (!s->unlinked && s->created) shm_unlink(s->name);
    unmap(s);
    release_claims(s); /* after the name is gone: the next job with this id may start now */
    pthread_mutex_destroy(&s->heap_mu);
    lk_free(s->blks);
    lk_free(s);
    c->impl = NULL;
}

/* How messages name the identity, and what to change: the job id, or the
 * MASTER_PORT it was derived from (lk_pg_info_from_env). */
static void describe_identity(const lk_comm *c, shm_comm *s) {
    char pre[32];
    int port = c->pg.master_port;
    snprintf(pre, sizeof pre, "p%d-", port);
    const char *env_id = getenv("LK_JOB_ID");
    bool from_port = port > 0 && !strncmp(c->job_id, pre, strlen(pre)) && !(env_id && !strcmp(env_id, c->job_id));
    if (from_port) {
        snprintf(s->ident, sizeof s->ident, "job id '%s' (derived from MASTER_PORT=%d)", c->job_id, port);
        snprintf(s->remedy, sizeof s->remedy, "give one of the jobs another MASTER_PORT (or its own LK_JOB_ID)");
    } else {
        snprintf(s->ident, sizeof s->ident, "job id '%s'", c->job_id);
        snprintf(s->remedy, sizeof s->remedy, "start one of the jobs with another --job-id (lockstep launch) or LK_JOB_ID");
    }
}

static lk_status shm_init(lk_comm *c, const lk_comm_config *cfg) {
    (void)cfg;
    const lk_pg_info *pg = &c->pg;
    if (pg->world_size > MAXW)
        return lk_error(LK_STATUS_UNSUPPORTED, "shm backend: world size %d exceeds the maximum of %d", pg->world_size, MAXW);
    if (pg->local_world_size != pg->world_size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "shm backend: the job spans %d nodes (world %d, %d on this node); shm joins processes of one node "
                        "(use the mpi backend)",
                        pg->num_nodes, pg->world_size, pg->local_world_size);
    LK_TRY(check_master_addr(pg->master_addr));
    if (!c->job_id[0])
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "shm backend: no job id to name the shared segment: set LK_JOB_ID (or MASTER_PORT), or start "
                        "with 'lockstep launch'");
    shm_comm *s = lk_calloc(1, sizeof *s);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->rank = pg->rank;
    s->world = pg->world_size;
    s->fd = -1;
    s->claim_fd = s->nonce_fd = -1;
    s->nonce = parse_nonce(lk_env_get("LK_JOB_NONCE"));
    s->pause_mask = rdv_pause_mask();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->spin_ns = cores > 0 && pg->local_world_size > cores ? 0 : 20000;
    long small = lk_env_get_long("LK_COMM_SHM_SMALL", (long)SMALL_BYTES_DEFAULT);
    long slice = lk_env_get_long("LK_COMM_SHM_SLICE", (long)CHUNK_SHARED_DEFAULT);
    s->small_bytes = small >= 0 && (size_t)small <= STAGE_SLOT ? (size_t)small : SMALL_BYTES_DEFAULT;
    s->chunk_shared = slice >= 4096 ? (size_t)slice : CHUNK_SHARED_DEFAULT;
    pthread_mutex_init(&s->heap_mu, NULL);
    lk_comm_shm_segment_name(c->job_id, s->name, sizeof s->name);
    sock_base(s->name, s->sockbase, sizeof s->sockbase);
    describe_identity(c, s);
    c->impl = s;
    lk_status st = rendezvous(c, s);
    if (st) {
        /* A failed start leaves nothing behind; only the rank that made the
         * segment removes the name: a rank refused by another job must not
         * take that job's segment away. */
        if (s->created && !s->unlinked) shm_unlink(s->name);
        s->unlinked = true;
        if (s->base) {
            shm_slot *me = slot_of(s, s->rank);
            /* an abort (the seal's) keeps its reason for the peers */
            int attached = ST_ATTACHED;
            if (atomic_load(&me->pid) == getpid()) atomic_compare_exchange_strong(&me->state, &attached, ST_LEFT);
        }
        unmap(s);
        release_claims(s);
        pthread_mutex_destroy(&s->heap_mu);
        lk_free(s);
        c->impl = NULL;
        return st;
    }
    return LK_STATUS_OK;
}

/* This rank announces long work: peers waiting on it read the slot. */
static void shm_long_work(lk_comm *c) {
    shm_comm *s = c->impl;
    if (!s || !s->base || c->long_root != s->rank) return;
    shm_slot *me = slot_of(s, s->rank);
    snprintf(me->work_what, sizeof me->work_what, "%s", c->long_what);
    snprintf(me->work_limit_name, sizeof me->work_limit_name, "%s", c->long_limit_name);
    atomic_store(&me->work_start_ns, c->long_start_ns);
    atomic_store(&me->work_limit_ns, (uint64_t)(c->long_limit_s * 1e9));
    atomic_store_explicit(&me->in_work, 1, memory_order_release);
}

static void shm_abort(lk_comm *c, const char *reason) {
    shm_comm *s = c->impl;
    if (!s || !s->base) return;
    shm_slot *me = slot_of(s, s->rank);
    snprintf(me->reason, sizeof me->reason, "%s", reason ? reason : "");
    atomic_store(&me->state, ST_ABORTED);
}

const lk__comm_vtable lk__comm_shm = {
    .name = "shm",
    .init = shm_init,
    .destroy = shm_destroy,
    .run = shm_run,
    .alloc_shared = shm_alloc_shared,
    .free_shared = shm_free_shared,
    .shared_offset = shm_shared_offset,
    .shared_at = shm_shared_at,
    .abort = shm_abort,
    .long_work = shm_long_work,
};

/* shm: waiting and liveness. Ranks synchronise by publishing a
 * monotonically increasing tick and waiting until every peer's tick reaches
 * theirs (spin, then yield, then sleep), checking timeout, abort and peers'
 * liveness (pid alive and not a zombie, state not aborted) while they wait;
 * a wait that runs out names every rank that did not arrive, its pid, state
 * and what it was doing. Also the process helpers the launcher shares. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/shm_impl.h"

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

void lk__shm_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------
 * Waiting.
 * ---------------------------------------------------------------------- */
void lk__shm_describe_info(shm_info *sl, char *buf, size_t size) {
    lk__coll o = {.kind = (lk__coll_kind)sl->kind, .dt = (lk_dtype)sl->dt, .op = (lk_reduce_op)sl->op, .root = sl->root,
                  .count = sl->count, .seq = sl->seq};
    lk__coll_describe(&o, buf, size);
}

static void describe_slot_op(shm_slot *sl, char *buf, size_t size) { lk__shm_describe_info(&sl->info[atomic_load(&sl->cur) & 1], buf, size); }

/* Fails with REMOTE when peer k is dead, aborted or gone; OK while it may still come. */
lk_status lk__shm_check_peer(lk_comm *c, shm_comm *s, int k, const char *what) {
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
                LK_TRY(lk__shm_check_peer(c, s, j, what));
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

lk_status lk__shm_sync_all(lk_comm *c, shm_comm *s, const lk__coll *op) {
    s->tick++;
    int cpu = sched_getcpu(); /* where we run now, so a waiter on the same core yields instead of spinning */
    shm_slot *me = slot_of(s, s->rank);
    if (atomic_load_explicit(&me->cpu, memory_order_relaxed) != cpu) atomic_store_explicit(&me->cpu, cpu, memory_order_relaxed);
    atomic_store_explicit(&slot_of(s, s->rank)->tick, s->tick, memory_order_release);
    return wait_all(c, s, op);
}

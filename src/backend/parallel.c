/* Compute threads: lockstep, not BLAS, owns the parallelism of a process.
 * OpenBLAS runs single-threaded; lk__parallel_run cuts work (GEMMs by rows or
 * columns, convolutions by samples, the optimizer by ranges) across a pool
 * of workers. Why not BLAS's own threads: they spin for ~0.1 s after every
 * call, so they fight every non-GEMM op that runs in parallel after them
 * (a third of a CNN step's CPU time went to their sched_yield), and they
 * split each small per-sample convolution GEMM at a loss.
 *
 * Workers start on first use. Between jobs a worker spins briefly (the next
 * GEMM of a step usually follows within microseconds), then parks on a
 * condition variable, so an idle pool costs nothing. A caller that knows a
 * cut phase is near wakes them early (lk__parallel_prewake: the optimizer's
 * step), since a parked worker can take longer to wake than its share
 * saves. One job at a time: a caller that finds the pool busy, or that is
 * itself a task, runs its tasks inline, which gives the same results.
 * Workers are detached and stay parked at exit. After fork() the child has
 * no workers (pthread_atfork), so ranks that ddp_spawn forks start their own. */
#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "backend/backend_impl.h"
#include "backend/threads.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define PARALLEL_MAX LK__PARALLEL_MAX
#define SPIN_NS 100000 /* a worker's spin before it parks */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int nworkers;        /* started; worker w runs task w + 1 */
    atomic_uint_fast64_t gen; /* job generation: bumped (under mu) to post a job */
    atomic_uint_fast64_t poke; /* bumped (under mu) by lk__parallel_prewake */
    void (*fn)(void *ctx, int task);
    void *ctx;
    int width;           /* tasks in the posted job */
    atomic_int pending;  /* workers still running it */
    bool busy;
    uint64_t start_gen[PARALLEL_MAX];
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static atomic_int compute_threads; /* set once at first use, then by lk_set_num_threads */
static atomic_int local_ranks = 1;  /* ranks sharing this node's CPUs (lk__threads_for_ranks) */
static atomic_bool threads_from_env; /* compute_threads is LK_NUM_THREADS's */
static atomic_int capped_to;         /* the count the "more than the CPUs" warning named (0: none yet) */
static _Thread_local bool in_task;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void reset_in_child(void) {
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.go, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.nworkers = 0;
    atomic_store(&pool.pending, 0);
    pool.busy = false;
}

int lk__cpus_available(void) {
    /* The affinity mask, not the machine: under taskset, a cpuset or a
     * batch system's binding the process may run on fewer CPUs than are
     * online, and threads beyond those only take turns. */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN); /* more CPUs than a cpu_set_t holds, or no affinity call */
    return n > 0 ? (int)n : 1;
}

/* The CPUs a rank may use: what the process may run on, shared among the
 * ranks on its node (at least 1, at most the pool's width). */
static int rank_share(int local, int *cpus) {
    *cpus = lk__cpus_available();
    int s = *cpus / (local > 0 ? local : 1);
    return s < 1 ? 1 : s > PARALLEL_MAX ? PARALLEL_MAX : s;
}

/* LK_NUM_THREADS as this rank can use it: 0 when unset or unusable (said
 * once), else at most the rank's share of the CPUs. More threads than
 * cores spin against each other (100000, once silently cut to 64 on two
 * cores, ran 5.8x slower than the default): the cap is said once per
 * count it leads to, with what was asked and why. */
static int env_threads(int local) {
    if (!lk_env_is_set("LK_NUM_THREADS")) return 0;
    long v = lk_env_get_long("LK_NUM_THREADS", LONG_MIN);
    if (v == LONG_MIN) return 0; /* not an integer: lk_env_get_long said so */
    int cpus, share = rank_share(local, &cpus);
    if (v <= 0) {
        lk__env_warn_once("LK_NUM_THREADS", "LK_NUM_THREADS=%ld is not a positive number of threads: ignored, "
                          "as if it were unset (the default: %d, this rank's share of %d CPU%s)", v, share, cpus,
                          cpus == 1 ? "" : "s");
        return 0;
    }
    if (v <= share) return (int)v;
    if (atomic_exchange(&capped_to, share) != share) {
        if (cpus / (local > 0 ? local : 1) > PARALLEL_MAX)
            lk_warn0("LK_NUM_THREADS=%ld is more than the %d compute threads a rank can use: using %d", v, PARALLEL_MAX,
                     share);
        else
            lk_warn0("LK_NUM_THREADS=%ld asks for more compute threads than the %d core%s available to this rank "
                     "(%d CPU%s this process may run on, %d rank%s on this node): using %d",
                     v, share, share == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s", local, local == 1 ? "" : "s", share);
    }
    return share;
}

int lk__threads_preview(int local, const char **from) {
    int cpus, share = rank_share(local, &cpus), env = env_threads(local);
    if (from) *from = env > 0 ? "LK_NUM_THREADS" : "default";
    return env > 0 ? env : share;
}

static void init_threads(void) {
    pthread_atfork(NULL, NULL, reset_in_child);
    int cpus, local = atomic_load(&local_ranks), n = rank_share(local, &cpus), env = env_threads(local);
    atomic_store(&threads_from_env, env > 0);
    atomic_store(&compute_threads, env > 0 ? env : n);
    openblas_set_num_threads(1);
}

void lk_set_num_threads(int n) {
    pthread_once(&init_once, init_threads);
    int env = env_threads(atomic_load(&local_ranks));
    atomic_store(&threads_from_env, env > 0);
    if (env > 0) n = env;
    atomic_store(&compute_threads, n < 1 ? 1 : n > PARALLEL_MAX ? PARALLEL_MAX : n);
}

void lk__threads_for_ranks(int local) {
    /* Before the pool's first use, so that it starts with this share. */
    atomic_store(&local_ranks, local > 0 ? local : 1);
    int cpus;
    lk_set_num_threads(rank_share(local, &cpus));
}

const char *lk__num_threads_from(void) {
    pthread_once(&init_once, init_threads);
    return atomic_load(&threads_from_env) ? "LK_NUM_THREADS" : "default";
}

int lk_get_num_threads(void) {
    pthread_once(&init_once, init_threads);
    return atomic_load(&compute_threads);
}

int lk__parallel_width(int64_t items) {
    if (in_task) return 1;
    int t = lk_get_num_threads();
    return items < t ? (int)(items > 1 ? items : 1) : t;
}

static void *worker(void *arg) {
    int w = (int)(intptr_t)arg;
    in_task = true;
    uint64_t seen = pool.start_gen[w]; /* the generation before the job that started us */
    for (;;) {
        /* Spin a little for the next job, then park. */
        uint64_t t0 = lk_time_ns();
        for (unsigned spins = 1; atomic_load_explicit(&pool.gen, memory_order_acquire) == seen; spins++) {
            cpu_relax();
            if (!(spins & 255) && lk_time_ns() - t0 > SPIN_NS) break;
        }
        pthread_mutex_lock(&pool.mu);
        uint64_t poked = atomic_load_explicit(&pool.poke, memory_order_relaxed);
        while (atomic_load_explicit(&pool.gen, memory_order_relaxed) == seen &&
               atomic_load_explicit(&pool.poke, memory_order_relaxed) == poked)
            pthread_cond_wait(&pool.go, &pool.mu);
        if (atomic_load_explicit(&pool.gen, memory_order_relaxed) == seen) { /* woken ahead of a job: spin for it */
            pthread_mutex_unlock(&pool.mu);
            continue;
        }
        seen = atomic_load_explicit(&pool.gen, memory_order_relaxed);
        bool mine = w + 1 < pool.width;
        void (*fn)(void *, int) = pool.fn;
        void *ctx = pool.ctx;
        pthread_mutex_unlock(&pool.mu);
        if (!mine) continue;
        fn(ctx, w + 1);
        if (atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool.mu);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
    return NULL;
}

void lk__parallel_prewake(void) {
    if (in_task || lk_get_num_threads() < 2) return;
    pthread_mutex_lock(&pool.mu);
    if (pool.nworkers > 0 && !pool.busy) {
        atomic_fetch_add_explicit(&pool.poke, 1, memory_order_relaxed);
        pthread_cond_broadcast(&pool.go);
    }
    pthread_mutex_unlock(&pool.mu);
}

void lk__parallel_run_ordered(int width, void (*fn)(void *ctx, int task), void *ctx) {
    if (width > PARALLEL_MAX) width = PARALLEL_MAX;
    bool was = in_task;
    for (int t = 0; t < (width > 1 ? width : 1); t++) {
        in_task = was || t > 0; /* as the pool runs them: task 0 as the caller, the others as its workers */
        fn(ctx, t);
    }
    in_task = was;
}

void lk__parallel_run(int width, void (*fn)(void *ctx, int task), void *ctx) {
    if (width > PARALLEL_MAX) width = PARALLEL_MAX;
    if (width <= 1 || in_task) {
        for (int t = 0; t < (width > 1 ? width : 1); t++) fn(ctx, t);
        return;
    }
    pthread_once(&init_once, init_threads);
    pthread_mutex_lock(&pool.mu);
    if (pool.busy) {
        pthread_mutex_unlock(&pool.mu);
        for (int t = 0; t < width; t++) fn(ctx, t);
        return;
    }
    pool.busy = true;
    while (pool.nworkers < width - 1) {
        pthread_t tid;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pool.start_gen[pool.nworkers] = atomic_load(&pool.gen);
        int rc = pthread_create(&tid, &attr, worker, (void *)(intptr_t)pool.nworkers);
        pthread_attr_destroy(&attr);
        if (rc) break; /* fewer workers: the caller runs the tasks left over */
        pool.nworkers++;
    }
    int helpers = pool.nworkers < width - 1 ? pool.nworkers : width - 1;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.width = width;
    atomic_store(&pool.pending, helpers);
    atomic_fetch_add_explicit(&pool.gen, 1, memory_order_release);
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.mu);

    in_task = true;
    fn(ctx, 0);
    for (int t = helpers + 1; t < width; t++) fn(ctx, t);
    in_task = false;
    /* The helpers finish within a task's time: spin briefly, then sleep. */
    uint64_t t0 = lk_time_ns();
    for (unsigned spins = 1; atomic_load_explicit(&pool.pending, memory_order_acquire) > 0; spins++) {
        cpu_relax();
        if (!(spins & 255) && lk_time_ns() - t0 > SPIN_NS) break;
    }
    pthread_mutex_lock(&pool.mu);
    while (atomic_load_explicit(&pool.pending, memory_order_acquire) > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pool.busy = false;
    pthread_mutex_unlock(&pool.mu);
}

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
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "backend/backend_impl.h"

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

static void init_threads(void) {
    pthread_atfork(NULL, NULL, reset_in_child);
    long env = lk_env_get_long("LK_NUM_THREADS", 0), cores = sysconf(_SC_NPROCESSORS_ONLN);
    long n = env > 0 ? env : cores > 0 ? cores : 1;
    atomic_store(&compute_threads, (int)(n > PARALLEL_MAX ? PARALLEL_MAX : n));
    openblas_set_num_threads(1);
}

void lk_set_num_threads(int n) {
    pthread_once(&init_once, init_threads);
    long env = lk_env_get_long("LK_NUM_THREADS", 0);
    if (env > 0) n = (int)env;
    atomic_store(&compute_threads, n < 1 ? 1 : n > PARALLEL_MAX ? PARALLEL_MAX : n);
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

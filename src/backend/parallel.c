/* The intra-op thread pool behind lk__parallel_run. Workers start on first
 * use and park on a condition variable between jobs, so a job costs a
 * wake-up (microseconds), not a thread start (~50 us on a VM): cheap enough
 * for the optimizer's one pass per step, not only for convolutions.
 *
 * One job at a time: a caller that finds the pool busy (another thread's
 * job in flight) runs all its tasks itself, which gives the same results.
 * Workers are detached and simply stay parked at exit. After fork() the
 * child has no workers (pthread_atfork resets the pool), so ranks that
 * ddp_spawn forks start their own. */
#include <cblas.h>
#include <pthread.h>
#include <stdint.h>

#include "backend/backend_impl.h"

#define PARALLEL_MAX 64

static struct {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int nworkers;   /* started; worker w runs task w + 1 */
    uint64_t gen;   /* job generation: bumped to post a job */
    void (*fn)(void *ctx, int task);
    void *ctx;
    int width;      /* tasks in the posted job */
    int pending;    /* workers still running it */
    bool busy;
    uint64_t start_gen[PARALLEL_MAX];
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .go = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void reset_in_child(void) {
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.go, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.nworkers = 0;
    pool.pending = 0;
    pool.busy = false;
}

static void register_atfork(void) { pthread_atfork(NULL, NULL, reset_in_child); }

static void *worker(void *arg) {
    int w = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.mu);
    uint64_t seen = pool.start_gen[w]; /* the generation before the job that started us */
    for (;;) {
        while (pool.gen == seen) pthread_cond_wait(&pool.go, &pool.mu);
        seen = pool.gen;
        if (w + 1 >= pool.width) continue;
        void (*fn)(void *, int) = pool.fn;
        void *ctx = pool.ctx;
        pthread_mutex_unlock(&pool.mu);
        fn(ctx, w + 1);
        pthread_mutex_lock(&pool.mu);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

int lk__parallel_width(int64_t items) {
    int t = openblas_get_num_threads();
    if (t > PARALLEL_MAX) t = PARALLEL_MAX;
    return items < t ? (int)(items > 1 ? items : 1) : t;
}

void lk__parallel_run(int width, void (*fn)(void *ctx, int task), void *ctx) {
    if (width > PARALLEL_MAX) width = PARALLEL_MAX;
    pthread_mutex_lock(&pool.mu);
    if (width <= 1 || pool.busy) {
        pthread_mutex_unlock(&pool.mu);
        for (int t = 0; t < (width > 1 ? width : 1); t++) fn(ctx, t);
        return;
    }
    pool.busy = true;
    /* Each task's GEMMs run on its own core: BLAS must not split them again
     * (set before any worker can start a task). */
    int blas = openblas_get_num_threads();
    openblas_set_num_threads(1);
    pthread_once(&atfork_once, register_atfork);
    while (pool.nworkers < width - 1) {
        pthread_t tid;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pool.start_gen[pool.nworkers] = pool.gen;
        int rc = pthread_create(&tid, &attr, worker, (void *)(intptr_t)pool.nworkers);
        pthread_attr_destroy(&attr);
        if (rc) break; /* fewer workers: the caller runs the tasks left over */
        pool.nworkers++;
    }
    int helpers = pool.nworkers < width - 1 ? pool.nworkers : width - 1;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.width = width;
    pool.pending = helpers;
    pool.gen++;
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.mu);

    fn(ctx, 0);
    for (int t = helpers + 1; t < width; t++) fn(ctx, t);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pool.busy = false;
    pthread_mutex_unlock(&pool.mu);
    openblas_set_num_threads(blas);
}

/* Helpers for the multi-process dist tests: run a function as W ranks in
 * forked children (each with its own communicator), collect their exit
 * codes and small results through a shared anonymous mapping, with a hard
 * deadline so a test can never hang; and the per-(rank, index, seed) data
 * every collective test checks against a double-precision reference. */
#ifndef LK_TEST_DIST_UTIL_H
#define LK_TEST_DIST_UTIL_H

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm_impl.h"
#include "lk_test.h"

#define DU_MAXW 8
#define DU_NRES 4096

/* Shared between the parent and the forked ranks. */
typedef struct {
    lk_status status[DU_MAXW]; /* what each rank reports */
    char msg[DU_MAXW][1024];   /* its message */
    double t[DU_MAXW];         /* a time each rank reports */
    int pid[DU_MAXW];
    int ready[DU_MAXW];
    uint64_t hash[DU_MAXW][DU_NRES]; /* result hashes, for bitwise comparisons */
    int nhash[DU_MAXW];
    volatile int stop; /* the parent asks the ranks to finish (they agree on it through a collective) */
} du_shared;

static du_shared *du;
static char du_job[96];

static inline du_shared *du_map(void) {
    if (!du) {
        du = mmap(NULL, sizeof *du, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (du == MAP_FAILED) {
            perror("mmap");
            exit(2);
        }
    }
    memset(du, 0, sizeof *du);
    return du;
}

typedef int (*du_rank_fn)(int rank, int world, void *arg); /* returns 0 on success */

static inline lk_pg_info du_pg(int rank, int world) {
    lk_pg_info pg;
    memset(&pg, 0, sizeof pg);
    pg.rank = pg.local_rank = rank;
    pg.world_size = pg.local_world_size = world;
    pg.num_nodes = 1;
    pg.source = "test";
    snprintf(pg.job_id, sizeof pg.job_id, "%s", du_job);
    return pg;
}

/* A communicator for this rank of the current test job. */
static inline lk_status du_comm(int rank, int world, const char *backend, double timeout, lk_comm **out) {
    lk_comm_config cfg = lk_comm_config_default();
    lk_pg_info pg = du_pg(rank, world);
    cfg.pg = &pg;
    cfg.backend = backend;
    cfg.timeout_s = timeout;
    cfg.shared_bytes = 64u << 20;
    return lk_comm_create(&cfg, out);
}

/* A rank's shm communicator (30 s timeout), or NULL with the reason on
 * stderr: the first lines of a rank function of a multi-process test. */
static inline lk_comm *du_shm_rank_comm(int rank, int world) {
    lk_comm *comm = NULL;
    if (du_comm(rank, world, "shm", 30, &comm)) {
        fprintf(stderr, "rank %d: %s\n", rank, lk_last_error());
        return NULL;
    }
    return comm;
}

static inline bool du_segment_exists(const char *job) {
    char name[256], path[300];
    lk_comm_shm_segment_name(job, name, sizeof name);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* Forks `world` ranks running fn (a fresh job id each time). */
static inline void du_start(int world, du_rank_fn fn, void *arg, int *pid) {
    static int job_counter;
    snprintf(du_job, sizeof du_job, "t%d-%d-%llx", (int)getpid(), ++job_counter, (unsigned long long)(lk_time_ns() & 0xffffff));
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < world; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            lk_t_case_failed = 0;
            du->pid[r] = getpid();
            int rc = fn(r, world, arg);
            fflush(stdout);
            fflush(stderr);
            exit(rc || lk_t_case_failed ? 1 : 0); /* exit, not _exit: leak checkers run in the ranks too */
        }
        du->pid[r] = pid[r];
    }
}

/* Waits up to deadline_s for the ranks, SIGKILLing stragglers; codes[r] =
 * exit code (128+signal if killed). Returns how many exited 0. */
static inline int du_wait(int world, const int *pid, double deadline_s, int *codes) {
    int ok = 0, left = world;
    double t_end = lk_time_now() + deadline_s;
    bool killed = false;
    while (left > 0) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < world; r++)
                if (pid[r] == p) {
                    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                    if (codes) codes[r] = code;
                    ok += code == 0;
                    left--;
                }
            continue;
        }
        if (!killed && lk_time_now() > t_end) {
            fprintf(stderr, "du_wait: deadline %.0f s passed, killing the ranks\n", deadline_s);
            for (int r = 0; r < world; r++) {
                kill(pid[r], SIGKILL);
                kill(pid[r], SIGCONT);
            }
            killed = true;
        }
        usleep(2000);
    }
    return ok;
}

static inline int du_run(int world, du_rank_fn fn, void *arg, double deadline_s, int *codes, int *pids) {
    int pid[DU_MAXW];
    du_start(world, fn, arg, pid);
    if (pids) memcpy(pids, pid, sizeof(int) * (size_t)world);
    return du_wait(world, pid, deadline_s, codes);
}

/* ---- data: value of element i on rank r, dtype-representable ---- */
static inline uint64_t du_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A double exactly representable in dt: floats in [-4, 4) with the dtype's
 * precision, integers in [-1000, 1000]. */
static inline double du_value(lk_dtype dt, uint64_t seed, int rank, size_t i) {
    uint64_t h = du_mix(seed * 0x100000001b3ull ^ du_mix(((uint64_t)rank << 40) ^ i));
    double u = (double)(h >> 11) * 0x1p-53 * 8.0 - 4.0;
    switch (dt) {
    case LK_F32: return (double)(float)u;
    case LK_F64: return u;
    case LK_BF16: return (double)lk_bf16_bits_to_f32(lk_f32_to_bf16_bits((float)u));
    case LK_F16: return (double)lk_f16_bits_to_f32(lk_f32_to_f16_bits((float)u));
    case LK_I32:
    case LK_I64: return (double)((int64_t)(h % 2001) - 1000);
    case LK_U8: return (double)(h % 200);
    default: return 0;
    }
}

static inline void du_store(void *buf, lk_dtype dt, size_t i, double v) {
    switch (dt) {
    case LK_F32: ((float *)buf)[i] = (float)v; break;
    case LK_F64: ((double *)buf)[i] = v; break;
    case LK_BF16: ((uint16_t *)buf)[i] = lk_f32_to_bf16_bits((float)v); break;
    case LK_F16: ((uint16_t *)buf)[i] = lk_f32_to_f16_bits((float)v); break;
    case LK_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LK_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case LK_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

static inline double du_load(const void *buf, lk_dtype dt, size_t i) {
    switch (dt) {
    case LK_F32: return ((const float *)buf)[i];
    case LK_F64: return ((const double *)buf)[i];
    case LK_BF16: return lk_bf16_bits_to_f32(((const uint16_t *)buf)[i]);
    case LK_F16: return lk_f16_bits_to_f32(((const uint16_t *)buf)[i]);
    case LK_I32: return ((const int32_t *)buf)[i];
    case LK_I64: return (double)((const int64_t *)buf)[i];
    case LK_U8: return ((const uint8_t *)buf)[i];
    default: return 0;
    }
}

static inline void du_fill(void *buf, lk_dtype dt, uint64_t seed, int rank, size_t n) {
    for (size_t i = 0; i < n; i++) du_store(buf, dt, i, du_value(dt, seed, rank, i));
}

static inline uint64_t du_hash(const void *buf, size_t bytes) {
    const uint8_t *p = buf;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Reference reduction of element i over `world` ranks in double; integer avg
 * truncates like C division. */
static inline double du_ref_reduce(lk_dtype dt, lk_reduce_op op, uint64_t seed, int world, size_t i) {
    double acc = du_value(dt, seed, 0, i);
    for (int k = 1; k < world; k++) {
        double v = du_value(dt, seed, k, i);
        if (op == LK_REDUCE_MAX) acc = v > acc ? v : acc;
        else if (op == LK_REDUCE_MIN) acc = v < acc ? v : acc;
        else acc += v;
    }
    if (op == LK_REDUCE_AVG) {
        if (dt == LK_I32 || dt == LK_I64) acc = (double)((int64_t)acc / world);
        else acc /= world;
    }
    return acc;
}

/* Tolerance for a reduced value: the dtype's rounding of the result plus
 * f32 accumulation error over `world` terms (sums of inputs of magnitude < 4). */
static inline double du_tol(lk_dtype dt, double ref, int world) {
    double a = ref < 0 ? -ref : ref;
    switch (dt) {
    case LK_F32: return a * 0x1p-23 + world * 4.0 * 0x1p-23;
    case LK_F64: return a * 0x1p-51 + world * 4.0 * 0x1p-51;
    case LK_BF16: return a * 0x1p-8 + world * 4.0 * 0x1p-23 + 1e-30;
    case LK_F16: return a * 0x1p-11 + world * 4.0 * 0x1p-23 + 0x1p-24;
    default: return 0;
    }
}

#endif

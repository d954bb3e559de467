/* Clocks, the single table of every LK_* environment variable (with the
 * config key or flag that wins over it, core.h's one precedence rule), and
 * the once-only warnings about their values. */
#define _POSIX_C_SOURCE 200809L
#include "lockstep/core.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double lk_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t lk_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double lk_time_cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const lk_env_var env_vars[] = {
    {"LK_LOG_LEVEL", "info", "log level: debug, info, warn, error, off", NULL},
    {"LK_NUM_THREADS", NULL,
     "compute threads per rank (default: the CPUs this process may use / local ranks; more than that is capped)", NULL},
    {"LK_COMM_TIMEOUT", "120", "seconds any collective may wait before failing", "trainer.comm_timeout"},
    {"LK_MEMORY_LIMIT_MB", NULL, "per-rank cap on the MiB lockstep allocates on the host (0 or unset: none)",
     "trainer.memory_limit_mb"},
    {"LK_COMM_BACKEND", NULL, "force a communicator backend: shm, mpi, nccl, self", NULL},
    {"LK_JOB_ID", NULL, "job id naming the shared-memory segment (the launcher sets it for its ranks: lockstep "
                        "launch --job-id, else a fresh one)", NULL},
    {"LK_JOB_NONCE", NULL, "set by the launcher: a random number per launch; an shm rank joins only a segment made by "
                           "its own launch's rank 0, so two jobs with the same LK_JOB_ID never pair up", NULL},
    {"LK_DATA_ROOT", NULL, "default root for datasets", "data.init_args.root"},
    {"PL_GLOBAL_SEED", NULL, "Lightning's: the seed when the config sets neither seed_everything nor trainer.seed",
     "seed_everything or trainer.seed"},
    {"PL_SEED_WORKERS", NULL, "Lightning's: accepted; lockstep always seeds data workers", NULL},
    {"LK_COMM_SHM_BYTES", NULL,
     "per-rank shared heap of the shm communicator in bytes, virtual until touched (default: /dev/shm's size / "
     "ranks on the node, at least 1 GiB)", NULL},
    {"LK_COMM_CHECK_DESYNC", "1", "mpi: exchange collective signatures to catch desync (0: off)", NULL},
    {"LK_COMM_SHM_SMALL", "65536", "shm: all-reduce messages up to this many bytes take one step", NULL},
    {"LK_COMM_SHM_SLICE", "16384", "shm: bytes an in-segment all-reduce reduces, then writes to every rank, at a time",
     NULL},
    {"LK_COMM_MPI_PAIR_CHUNK", "32768", "mpi: two ranks on two hosts (hier's node leaders) all-reduce f32/f64 "
                                        "buffers of 64 KiB and more by swapping them in messages of this many bytes, "
                                        "both directions at once (0: MPI's own all-reduce)", NULL},
    {"LK_SHARD_INLINE", "1 on the CPU, 0 on a GPU",
     "deepspeed_stage_2 / fsdp: 1 reduces small units after the backward and gathers stage 2's units after the step "
     "on the calling thread (no thread hand-offs); 0 hands each unit's reduction to the communication thread as its "
     "backward ends", NULL},
    {"LK_COMM_TEST_DELAY_MS", "0", "tests only: delay every asynchronous collective by this many ms", NULL},
    {"LK_COMM_TEST_RDV_PAUSE", NULL, "tests only: all, or a comma-separated list of the shm rendezvous steps claim, "
                                     "open, slot, publish, wait, seal, done: the process stops itself (SIGSTOP) before "
                                     "each, so a test can interleave two jobs' ranks", NULL},
    {"LK_COMM_TEST_SPLIT_KILL", NULL, "tests only: that rank of an mpi communicator kills itself (SIGKILL) inside "
                                      "lk_comm_split, after the ranks' all_gather, just before MPI_Comm_split", NULL},
    {"LK_TEST_STEP_DELAY_MS", "0", "tests only: sleep this many ms after every optimizer step (signal tests)", NULL},
    {"LK_TEST_GRAD_OVERFLOW", NULL, "tests only: RANK:STEP makes that rank's first gradient +inf after the "
                                    "all-reduce of that optimizer step (loss scaler tests)", NULL},
    {"LK_TEST_LOSS_NAN", NULL, "tests only: RANK:STEP makes that rank's loss check see NaN at that step (one rank's "
                               "non-finite loss under ddp)", NULL},
    {"LK_TEST_SHARD_CRASH", NULL, "tests only: RANK:STEP ends that rank in the sharded checkpoint save at that step "
                                  "(rank 0: its new set built, not swapped in; others: after staging the shard)", NULL},
    {"LK_MAX_RESTARTS", "0",
     "restart the ranks (lockstep fit from last.ckpt) up to N times after a failure: lockstep fit with devices > 1, "
     "lockstep launch", "lockstep launch --max-restarts"},
    {"LK_ALLOW_OVERSUBSCRIBE", "0", "1: allow more ranks (trainer.devices) than CPU cores", NULL},
    {"LK_ONEDNN", "1", "0: run bf16/f16 GEMMs through f32 instead of oneDNN (to compare)", NULL},
    {"LK_F32_GEMM", "auto", "onednn|openblas: which library runs the f32 GEMMs (32-true, f32 ops); auto: oneDNN on an "
                        "AMX-class CPU, where it was measured faster, else OpenBLAS (the two differ in the last bits)", NULL},
    {"LK_GEMM", "auto", "own|blas: which kernel runs the CPU's f32 GEMMs on OpenBLAS's path (attention's tiles, "
                    "linears); auto: lockstep's own at the shapes of a fixed rule (src/backend/cpu/gemm.c), else "
                    "OpenBLAS (the two differ in the last bits)", NULL},
    {"LK_CPU_ISA", "auto", "avx512|avx2|baseline: the highest instruction set lockstep's own CPU loops may use (only "
                       "lowers the CPU's; every level gives the same bits), to run a weaker CPU's code here", NULL},
    {"LK_GRAPHS", "1", "0: issue a training step's device work op by op instead of replaying it as graphs (single "
                       "strategy, devices that capture)", NULL},
    {"LK_NVML_LIBRARY", "libnvidia-ml.so.1", "NVML library dlopened for GPU stats (tests point it at a missing file)",
     NULL},
};

const lk_env_var *lk_env_vars(int *count) {
    *count = (int)(sizeof env_vars / sizeof env_vars[0]);
    return env_vars;
}

const char *lk_env_get(const char *name) {
    const char *v = getenv(name);
    if (v && *v) return v;
    for (size_t i = 0; i < sizeof env_vars / sizeof env_vars[0]; i++)
        if (!strcmp(env_vars[i].name, name)) return env_vars[i].default_value;
    return NULL;
}

bool lk_env_is_set(const char *name) {
    const char *v = getenv(name);
    return v && *v;
}

/* A bad value is said once per variable (rank 0), never silently replaced
 * by the default: LK_NUM_THREADS=four would otherwise look like a setting
 * that took. One bit per declared variable, shared by every reader. */
static _Atomic unsigned long long warned;

void lk__env_warn_once(const char *name, const char *fmt, ...) {
    unsigned long long bit = 0;
    for (size_t i = 0; i < sizeof env_vars / sizeof env_vars[0] && i < 64; i++)
        if (!strcmp(env_vars[i].name, name)) bit = 1ull << i;
    if (bit && (atomic_fetch_or(&warned, bit) & bit)) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    lk_warn0("%s", msg);
}

static void bad_value(const char *name, const char *v, const char *what) {
    lk__env_warn_once(name, "%s='%s' is not %s: ignored, as if it were unset", name, v, what);
}

long lk_env_get_long(const char *name, long fallback) {
    const char *v = lk_env_get(name);
    if (!v) return fallback;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end != v && *end == 0 && !errno) return x;
    bad_value(name, v, "an integer");
    return fallback;
}

double lk_env_get_double(const char *name, double fallback) {
    const char *v = lk_env_get(name);
    if (!v) return fallback;
    char *end;
    double x = strtod(v, &end);
    if (end != v && *end == 0 && isfinite(x)) return x;
    bad_value(name, v, "a finite number");
    return fallback;
}

bool lk_env_get_number(const char *name, double lo, double hi, double *out) {
    if (!lk_env_is_set(name)) return false;
    double x = lk_env_get_double(name, NAN); /* not a number: said there */
    if (isnan(x)) return false;
    if (x < lo || x > hi) {
        lk__env_warn_once(name, "%s=%s is outside %g..%g: ignored, as if it were unset", name, getenv(name), lo, hi);
        return false;
    }
    *out = x;
    return true;
}

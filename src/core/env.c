/* Clocks, and the single table of every LK_* environment variable. */
#define _POSIX_C_SOURCE 200809L
#include "lockstep/core.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
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
    {"LK_LOG_LEVEL", "info", "log level: debug, info, warn, error, off"},
    {"LK_NUM_THREADS", NULL, "BLAS/compute threads per rank (default: cores / local ranks)"},
    {"LK_COMM_TIMEOUT", "120", "seconds any collective may wait before failing"},
    {"LK_COMM_BACKEND", NULL, "force a communicator backend: shm, mpi, nccl, self"},
    {"LK_JOB_ID", NULL, "job id naming the shared-memory segment (set by the launcher)"},
    {"LK_DATA_ROOT", NULL, "default root for datasets"},
    {"PL_GLOBAL_SEED", NULL, "Lightning's: the seed when the config sets neither seed_everything nor trainer.seed"},
    {"PL_SEED_WORKERS", NULL, "Lightning's: accepted; lockstep always seeds data workers"},
    {"LK_COMM_SHM_BYTES", "1073741824", "per-rank shared heap of the shm communicator (virtual until touched)"},
    {"LK_COMM_CHECK_DESYNC", "1", "mpi: exchange collective signatures to catch desync (0: off)"},
    {"LK_COMM_SHM_SMALL", "65536", "shm: all-reduce messages up to this many bytes take one step"},
    {"LK_COMM_SHM_SLICE", "16384", "shm: bytes an in-segment all-reduce reduces, then writes to every rank, at a time"},
    {"LK_COMM_TEST_DELAY_MS", "0", "tests only: delay every asynchronous collective by this many ms"},
    {"LK_TEST_STEP_DELAY_MS", "0", "tests only: sleep this many ms after every optimizer step (signal tests)"},
    {"LK_TEST_GRAD_OVERFLOW", NULL, "tests only: RANK:STEP makes that rank's first gradient +inf after the "
                                    "all-reduce of that optimizer step (loss scaler tests)"},
    {"LK_TEST_LOSS_NAN", NULL, "tests only: RANK:STEP makes that rank's loss check see NaN at that step (one rank's "
                               "non-finite loss under ddp)"},
    {"LK_MAX_RESTARTS", "0", "lockstep fit with devices > 1: restart the ranks from last.ckpt up to N times after a failure"},
    {"LK_ALLOW_OVERSUBSCRIBE", "0", "1: allow more ranks (trainer.devices) than CPU cores"},
    {"LK_ONEDNN", "1", "0: run bf16/f16 GEMMs through f32 instead of oneDNN (to compare)"},
    {"LK_F32_GEMM", "auto", "onednn|openblas: which library runs the f32 GEMMs (32-true, f32 ops); auto: oneDNN on an "
                        "AMX-class CPU, where it was measured faster, else OpenBLAS (the two differ in the last bits)"},
    {"LK_CPU_ISA", "auto", "avx512|avx2|baseline: the highest instruction set lockstep's own CPU loops may use (only "
                       "lowers the CPU's; every level gives the same bits), to run a weaker CPU's code here"},
    {"LK_GRAPHS", "1", "0: issue a training step's device work op by op instead of replaying it as graphs (single strategy, devices that capture)"},
    {"LK_NVML_LIBRARY", "libnvidia-ml.so.1", "NVML library dlopened for GPU stats (tests point it at a missing file)"},
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

/* A value that is not a number is said once per variable (rank 0), never
 * silently replaced by the default: LK_NUM_THREADS=four would otherwise
 * look like a setting that took. */
static _Atomic unsigned long long warned;

static void bad_value(const char *name, const char *v, const char *what) {
    unsigned long long bit = 0;
    for (size_t i = 0; i < sizeof env_vars / sizeof env_vars[0] && i < 64; i++)
        if (!strcmp(env_vars[i].name, name)) bit = 1ull << i;
    if (bit && (atomic_fetch_or(&warned, bit) & bit)) return;
    lk_warn0("%s='%s' is not %s: ignored, as if it were unset", name, v, what);
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

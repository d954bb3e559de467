/* lockstep/core.h — status codes and the last error, rank-aware logging,
 * the one allocator (with its failure-injection hook), arenas, growable
 * arrays, files written atomically, the counter-based Philox RNG and
 * clocks. Every other layer stands on this.
 *
 * Error contract: every fallible function returns an lk_status; 0 is success.
 * The message (what failed, where, what was expected) is kept per thread and
 * read with lk_last_error(). Library code never exits the process.
 *
 *     lk_status st = lk_something(...);
 *     if (st) fprintf(stderr, "error: %s\n", lk_last_error());
 */
#ifndef LOCKSTEP_CORE_H
#define LOCKSTEP_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LK_VERSION_MAJOR 0
#define LK_VERSION_MINOR 1
#define LK_VERSION_PATCH 0
#define LK_VERSION_STRING "0.1.0"

#if defined(__GNUC__)
#define LK_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define LK_NODISCARD __attribute__((warn_unused_result))
#else
#define LK_PRINTF(f, a)
#define LK_NODISCARD
#endif

/* ------------------------------------------------------------------------
 * Status codes: one X-macro table, so enum and strings cannot drift.
 * ---------------------------------------------------------------------- */
#define LK_STATUS_LIST(X)                                  \
    X(OK, "ok")                                            \
    X(INVALID_ARGUMENT, "invalid argument")                \
    X(INVALID_USAGE, "invalid usage")                      \
    X(OUT_OF_MEMORY, "out of memory")                      \
    X(IO, "i/o error")                                     \
    X(DEVICE, "device error")                              \
    X(REMOTE, "remote rank failed")                        \
    X(TIMEOUT, "timed out")                                \
    X(ABORTED, "aborted")                                  \
    X(UNSUPPORTED, "unsupported")                          \
    X(INTERNAL, "internal error")

typedef enum {
#define LK__STATUS_ENUM(name, str) LK_STATUS_##name,
    LK_STATUS_LIST(LK__STATUS_ENUM)
#undef LK__STATUS_ENUM
    LK_STATUS_COUNT_
} lk_status;

/* "invalid argument" etc.; never NULL. */
const char *lk_status_str(lk_status s);

/* Sets this thread's last error to the formatted message and returns `code`,
 * so a failing path reads `return lk_error(LK_STATUS_IO, "...", ...)`.
 * When a rank is known (lk_log_set_rank) the message is prefixed "[rank R] ". */
lk_status lk_error(lk_status code, const char *fmt, ...) LK_PRINTF(2, 3);
lk_status lk_errorv(lk_status code, const char *fmt, va_list ap);
/* The message of the last error on this thread ("" when none). */
const char *lk_last_error(void);
/* Status of the last error on this thread (LK_STATUS_OK when none). */
lk_status lk_last_status(void);
/* Where the error passed through LK_TRY, innermost first ("" when none). */
const char *lk_last_error_trace(void);
void lk_clear_error(void);
/* Internal: appends "file:line" to the trace. */
void lk__error_trace(const char *file, int line);
/* Problems gathered for one error ("a; b; c"): appends sep (after the first
 * item) and the formatted item to the string in buf while there is room,
 * and counts every item in *n, those past the room included. */
void lk__list_add(char *buf, size_t size, int *n, const char *sep, const char *fmt, ...) LK_PRINTF(5, 6);

/* Returns from the calling function with the callee's status on failure. */
#define LK_TRY(call)                                  \
    do {                                              \
        lk_status lk__st = (call);                    \
        if (lk__st != LK_STATUS_OK) {                 \
            lk__error_trace(__FILE__, __LINE__);      \
            return lk__st;                            \
        }                                             \
    } while (0)

/* Internal invariants only (never bad input): prints, calls the panic hook
 * (the trainer flushes its logs there), then aborts. */
typedef void (*lk_panic_hook)(const char *msg);
void lk_set_panic_hook(lk_panic_hook hook);
#ifdef __cplusplus
#define LK_NORETURN [[noreturn]] /* this header is C11; C++ (CUDA files, tests) includes it too */
#else
#define LK_NORETURN _Noreturn
#endif
LK_NORETURN void lk__panic(const char *file, int line, const char *fmt, ...) LK_PRINTF(3, 4);
#define lk_panic(...) lk__panic(__FILE__, __LINE__, __VA_ARGS__)
#define LK_ASSERT(cond) \
    do { if (!(cond)) lk_panic("assertion failed: %s", #cond); } while (0)

/* ------------------------------------------------------------------------
 * Logging. Messages carry "[rank R]" once a rank is set; the *0 variants
 * print on rank 0 only. Level from LK_LOG_LEVEL (debug|info|warn|error).
 * ---------------------------------------------------------------------- */
typedef enum { LK_LOG_DEBUG, LK_LOG_INFO, LK_LOG_WARN, LK_LOG_ERROR, LK_LOG_OFF } lk_log_level;

void lk_log_set_rank(int rank, int world_size); /* rank < 0: unknown */
int lk_log_rank(void);
void lk_log_set_level(lk_log_level level);
lk_log_level lk_log_get_level(void);
/* Where the level came from: "LK_LOG_LEVEL", "lk_log_set_level" or "default". */
const char *lk__log_level_from(void);
void lk_logf(lk_log_level level, bool rank0_only, const char *fmt, ...) LK_PRINTF(3, 4);
#define lk_log_debug(...) lk_logf(LK_LOG_DEBUG, false, __VA_ARGS__)
#define lk_log_info(...) lk_logf(LK_LOG_INFO, false, __VA_ARGS__)
#define lk_log_warn(...) lk_logf(LK_LOG_WARN, false, __VA_ARGS__)
#define lk_log_err(...) lk_logf(LK_LOG_ERROR, false, __VA_ARGS__)
#define lk_log0(...) lk_logf(LK_LOG_INFO, true, __VA_ARGS__)
#define lk_warn0(...) lk_logf(LK_LOG_WARN, true, __VA_ARGS__)

/* ------------------------------------------------------------------------
 * Memory. lk_malloc is the only allocator: on failure it returns NULL and
 * sets an OUT_OF_MEMORY error naming the size. Tests can make the Nth
 * allocation from now fail with lk_alloc_fail_after(N) (0 disables).
 * ---------------------------------------------------------------------- */
#define LK_ALIGN 64 /* cache line; also enough for AVX-512 loads */
void *lk_malloc(size_t size);
void *lk_calloc(size_t n, size_t size);
void *lk_realloc(void *p, size_t size);
void lk_free(void *p);
/* `align` a power of two ≥ sizeof(void*); free with lk_aligned_free. */
void *lk_aligned_alloc(size_t align, size_t size);
void lk_aligned_free(void *p);
char *lk_strdup(const char *s);
void lk_alloc_fail_after(long n);
/* Allocations so far on all threads (for "no allocation in the hot loop" tests). */
uint64_t lk_alloc_count(void);
/* Live bytes and a cap, for the whole process (a rank): every lk_ block
 * counts its usable size from allocation to free, and the blocks of the
 * shared heap (lk_comm_alloc_shared) count for the rank that allocates
 * them. With a limit set, an allocation that would take the live bytes past
 * it fails as OUT_OF_MEMORY naming the bytes asked, what they were for
 * (when the caller said), the bytes live and the limit with `from`, the
 * setting that gave it (e.g. "trainer.memory_limit_mb"; NULL: a generic
 * name). 0 removes the limit. Thread-safe; the count is one atomic add. */
void lk_alloc_set_limit(uint64_t bytes, const char *from);
uint64_t lk_alloc_limit(void);
uint64_t lk_alloc_live_bytes(void);
uint64_t lk_alloc_peak_bytes(void); /* the most live at once since start (or lk_alloc_reset_peak) */
void lk_alloc_reset_peak(void);     /* the peak starts again from what is live now */
/* Internal: names what this thread's next allocations are for in an
 * out-of-memory error ("the flat gradient buffer"; a string that outlives
 * them; NULL: nothing); returns the previous label, to put back. */
const char *lk__alloc_what(const char *what);
/* Internal: memory lk_malloc did not hand out but the rank holds (its
 * shared heap): counted and capped like lk_malloc's. charge fails with the
 * error set; uncharge cannot fail. */
lk_status lk__alloc_charge(size_t bytes);
void lk__alloc_uncharge(size_t bytes);
/* Internal: after an allocation failed, restates a refusal by the cap on
 * this thread with what it was for ("a f32 tensor of shape [4096, 4096]");
 * any other error is left alone. Returns the last status. */
lk_status lk__alloc_oom_for(const char *fmt, ...) LK_PRINTF(1, 2);
/* Internal: whether this thread's last error is a refusal by the memory
 * limit (a wrapper then keeps that message, which says more than its own). */
bool lk__alloc_refused(void);

/* Bump arena: allocations are LK_ALIGN-aligned and live until reset/free.
 * Grows by chaining blocks; after the first step nothing more is allocated. */
typedef struct lk_arena lk_arena;
lk_arena *lk_arena_create(size_t block_size);
void *lk_arena_alloc(lk_arena *a, size_t size);
void lk_arena_reset(lk_arena *a);
void lk_arena_free(lk_arena *a);
size_t lk_arena_used(const lk_arena *a);

/* Growable arrays. lk_vec_reserve(items, cap, need, first) makes room for
 * `need` elements in the array `items` (an lvalue pointer, lk_malloc'd or
 * NULL) whose capacity in elements is the lvalue `cap` (an int or a size_t):
 * nothing happens when need <= cap, otherwise the capacity doubles, starting
 * from `first` when it is 0, until it holds `need`, with one lk_realloc.
 * Evaluates to LK_STATUS_OK, or to LK_STATUS_OUT_OF_MEMORY with the error set
 * and `items` and `cap` unchanged (so the caller still owns and frees them).
 *
 *     if (l->n == l->cap) LK_TRY(lk_vec_reserve(l->items, l->cap, l->n + 1, 16));
 *     l->items[l->n++] = x;
 */
#define lk_vec_reserve(items, cap, need, first)                                        \
    _Generic(&(cap), int *: lk__vec_reserve_int, size_t *: lk__vec_reserve_size)(    \
        (void *)&(items), &(cap), (size_t)(need), sizeof *(items), (size_t)(first))
/* Internal: `pitems` is the address of the caller's element pointer. */
lk_status lk__vec_reserve_int(void *pitems, int *cap, size_t need, size_t elem, size_t first);
lk_status lk__vec_reserve_size(void *pitems, size_t *cap, size_t need, size_t elem, size_t first);

/* ------------------------------------------------------------------------
 * Files written atomically. Every output file of a run (logs, run info,
 * profiles, images, the saved config) is written to "<path>.tmp.<pid>",
 * synced and renamed, so a crash or a full disk never leaves a torn file
 * under the final name.
 * ---------------------------------------------------------------------- */
#define LK_FILE_PATH_MAX 4096
/* Writes `len` bytes to `path` atomically: "<path>.tmp.<pid>", fsync, rename.
 * On failure the temporary file is removed and `path` is untouched. */
lk_status lk_file_write_atomic(const char *path, const void *data, size_t len);
/* mkdir -p; existing directories are fine, a file in the way is an IO error. */
lk_status lk_file_mkdirs(const char *path);
/* Writes all `len` bytes to the open `fd` (retrying EINTR and short writes);
 * `path` only names the file in the error message. */
lk_status lk_file_write_all(int fd, const char *path, const void *data, size_t len);
/* Removes, from `dir` only (not below), the regular files "<name>.tmp.<pid>"
 * whose writer died before its rename (pid no longer running here); returns
 * how many. Cannot fail: what cannot be read or removed is left alone. */
int lk_file_remove_stale_tmp(const char *dir);

/* ------------------------------------------------------------------------
 * Philox4x32-10 (Salmon et al., SC'11): counter-based, so any (key, counter)
 * pair can be computed independently — the foundation of reproducibility
 * that does not depend on thread or rank counts.
 * ---------------------------------------------------------------------- */
void lk_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A stream over the counter space. Keyed by (seed, purpose); the counter's
 * upper words carry (a, b) coordinates such as (rank, epoch) or (epoch,
 * sample index), the lower ones advance. */
typedef struct lk_rng {
    uint32_t key[2];
    uint32_t ctr[4];
    uint32_t buf[4];
    int pos; /* next unused word of buf; 4 = empty */
    int has_spare;
    float spare; /* second Box-Muller output */
} lk_rng;

/* Well-known purposes, so streams never overlap by accident. */
enum {
    LK_RNG_INIT = 1,    /* parameter initialisation */
    LK_RNG_DROPOUT = 2, /* dropout masks */
    LK_RNG_SHUFFLE = 3, /* sampler permutations */
    LK_RNG_AUGMENT = 4, /* data transforms */
    LK_RNG_DATA = 5,    /* synthetic datasets */
    LK_RNG_USER = 16
};

void lk_rng_init(lk_rng *r, uint64_t seed, uint32_t purpose, uint32_t a, uint32_t b);
uint32_t lk_rng_u32(lk_rng *r);
uint64_t lk_rng_u64(lk_rng *r);
float lk_rng_uniform(lk_rng *r);                /* [0, 1), 24 random bits */
double lk_rng_uniform_f64(lk_rng *r);           /* [0, 1), 53 random bits */
float lk_rng_normal(lk_rng *r);                 /* N(0, 1), Box-Muller */
/* The stream as after n calls of lk_rng_u32 / n calls of lk_rng_normal,
 * without computing the values in between (O(1) but for one block): what a
 * deferred initialiser does for a tensor this process does not hold. */
void lk_rng_skip(lk_rng *r, uint64_t n);
void lk_rng_skip_normal(lk_rng *r, uint64_t n);
/* x[i] = mean + std * N(0, 1) for n values: the fast bulk path (f32
 * polynomial Box-Muller, vectorised), its own sequence, not n calls of
 * lk_rng_normal. Continues the stream at the next whole block. x NULL:
 * the stream advances as if n values were written. */
void lk_rng_fill_normal(lk_rng *r, float *x, int64_t n, float mean, float std);
bool lk_rng_bernoulli(lk_rng *r, float p);       /* true with probability p */
uint32_t lk_rng_below(lk_rng *r, uint32_t n);   /* uniform in [0, n), unbiased */
/* Fisher-Yates shuffle of `idx[0..n)`. */
void lk_rng_shuffle_i64(lk_rng *r, int64_t *idx, int64_t n);

/* ------------------------------------------------------------------------
 * Clocks and environment.
 * ---------------------------------------------------------------------- */
double lk_time_now(void);      /* monotonic seconds */
double lk_time_cpu(void);      /* this process's CPU seconds */
uint64_t lk_time_ns(void);     /* monotonic nanoseconds */

/* Every LK_* environment variable is declared once (src/core/env.c) so
 * `lockstep env` can list them.
 *
 * One precedence rule for a variable that a config key (or a command-line
 * flag) can also set, as in Lightning: the key, when the config sets it
 * (a -c file or a --section.key override), wins; otherwise the variable,
 * when it is set; otherwise the built-in default. `setting` names that key
 * (NULL: the variable is the only way to set it). */
typedef struct lk_env_var {
    const char *name;
    const char *default_value;
    const char *help;
    const char *setting; /* the config key or flag that wins over the variable, or NULL */
} lk_env_var;
const lk_env_var *lk_env_vars(int *count);
/* getenv for a declared variable, falling back to its default. */
const char *lk_env_get(const char *name);
/* True when the variable is set to something (lk_env_get cannot tell a
 * set variable from its declared default). */
bool lk_env_is_set(const char *name);
/* lk_env_get parsed as a number; a value that is not one is warned about
 * once per variable and the fallback used. */
long lk_env_get_long(const char *name, long fallback);
double lk_env_get_double(const char *name, double fallback);
/* The variable as a number in [lo, hi]: true with *out set when it is set
 * and valid. A value that is not a number or lies outside [lo, hi] is
 * warned about once per variable (rank 0) and false returned, as if the
 * variable were unset. */
bool lk_env_get_number(const char *name, double lo, double hi, double *out);
/* A warning about variable `name`'s value, said once per process and
 * variable (rank 0), however many places read it. */
void lk__env_warn_once(const char *name, const char *fmt, ...) LK_PRINTF(2, 3);


/* ------------------------------------------------------------------------
 * Parameter tables. One table per configurable thing (trainer, a model, a
 * data module, an optimizer) drives YAML validation, `--help`, the
 * "did you mean" hint and --print_config, so they cannot drift apart.
 * Values live in the caller's config struct at `offset`:
 *   BOOL -> bool, INT -> int64_t, FLOAT -> double, STRING/ENUM -> char[LK_PARAM_STR],
 *   INTS -> lk_int_list, FLOATS -> lk_float_list, COUNT_OR_FRACTION -> lk_count_or_fraction.
 *
 *     typedef struct { int64_t epochs; double lr; } my_cfg;
 *     static const lk_param my_params[] = {
 *         {"epochs", LK_PARAM_INT, offsetof(my_cfg, epochs), "10", 1, 1e9, NULL, "passes over the data"},
 *         {"lr", LK_PARAM_FLOAT, offsetof(my_cfg, lr), "0.001", 0, 1e9, NULL, "learning rate"},
 *     };
 * ---------------------------------------------------------------------- */
#define LK_PARAM_STR 256
#define LK_PARAM_LIST_MAX 16
typedef enum { LK_PARAM_BOOL, LK_PARAM_INT, LK_PARAM_FLOAT, LK_PARAM_STRING, LK_PARAM_ENUM, LK_PARAM_INTS, LK_PARAM_FLOATS,
               LK_PARAM_COUNT_OR_FRACTION } lk_param_type;
/* Lightning's "int or float" flags (limit_train_batches: 10 vs 0.25): an
 * integer written without a point or exponent is a count, anything else a
 * fraction in [0, 1]. */
typedef struct lk_count_or_fraction { double value; bool is_count; } lk_count_or_fraction;
typedef struct lk_int_list { int n; int64_t v[LK_PARAM_LIST_MAX]; } lk_int_list;
typedef struct lk_float_list { int n; double v[LK_PARAM_LIST_MAX]; } lk_float_list;

typedef struct lk_param {
    const char *name;
    lk_param_type type;
    size_t offset;       /* offsetof(config struct, field) */
    const char *def;     /* default as text ("0.001", "true", "[784, 512]"); NULL: empty/zero */
    double min, max;     /* numeric bounds, inclusive; min > max means unbounded */
    const char *choices; /* ENUM: "a|b|c"; STRING: NULL */
    const char *help;
} lk_param;

/* Fills every field with its default. */
lk_status lk_params_defaults(const lk_param *table, int n, void *cfg);
/* Parses `value` (YAML scalar text; lists as "[1, 2]" or "1,2") into `key`.
 * `where` prefixes messages (e.g. "examples/mlp.yaml:12: model.init_args").
 * Unknown keys name the nearest valid key; bad values say what was expected. */
lk_status lk_params_set(const lk_param *table, int n, void *cfg, const char *where, const char *key, const char *value);
const lk_param *lk_params_find(const lk_param *table, int n, const char *key);
/* The current value as YAML text into buf. */
char *lk_params_format(const lk_param *p, const void *cfg, char *buf, size_t size);
/* One line per key: name, type, default, help, indented by `indent`. */
void lk_params_print_help(const lk_param *table, int n, void *file, const char *prefix);
/* The candidate nearest to `word` by edit distance, or NULL when none is close. */
const char *lk_suggest(const char *word, const char *const *candidates, int n);

#ifdef __cplusplus
}
#endif
#endif

/* src/train/loggers.h — the trainer's output pieces, private to src/train:
 * metric loggers (a small vtable, a fan-out list, CSVLogger and
 * TensorBoardLogger with PyTorch Lightning's layout and formats), the
 * progress display (an in-place bar on a terminal, plain lines otherwise),
 * the run.json writer (schema in docs/RUN_JSON.md) and PNG image grids.
 * None of these knows about ranks: the trainer creates them on rank 0 only
 * (errors always print, through lk_log_err). Nothing here reads the clock
 * for anything but display, rates and TensorBoard's wall_time field.
 *
 *     lk_logger *list, *csv, *tb;
 *     LK_TRY(lk_logger_list_create(&list));
 *     LK_TRY(lk_csv_logger_create("runs", "lightning_logs", -1, &csv));
 *     LK_TRY(lk_logger_list_add(list, csv));            // list owns csv now
 *     LK_TRY(lk_tb_logger_create(lk_logger_log_dir(csv), &tb));
 *     LK_TRY(lk_logger_list_add(list, tb));
 *     const char *names[] = {"epoch", "train_loss"};
 *     double values[] = {0, 0.25};
 *     LK_TRY(lk_logger_log_metrics(list, 49, names, values, 2));
 *     LK_TRY(lk_logger_finalize(list, "success"));
 *     lk_logger_free(list);
 */
#ifndef LK_TRAIN_LOGGERS_H
#define LK_TRAIN_LOGGERS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "lockstep/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LK_LOG_DIR_MAX 4096

/* ========================================================================
 * Loggers
 * ====================================================================== */

typedef struct lk_logger lk_logger;

/* One vtable per logger kind. Every method gets the logger it was called on. */
typedef struct lk_logger_vtable {
    const char *kind; /* "csv", "tensorboard", "list": used in error messages */
    /* Records the run's hyperparameters, as YAML text (the merged config). */
    lk_status (*log_hyperparams)(lk_logger *lg, const char *yaml);
    /* One logging call: `n` metrics at `step` (the global step). Names and
     * values are borrowed for the call only. */
    lk_status (*log_metrics)(lk_logger *lg, int64_t step, const char *const *names, const double *values, int n);
    /* Makes everything logged so far durable (optional: NULL means nothing to do). */
    lk_status (*flush)(lk_logger *lg);
    /* The run ended with `status` ("success", "failed", "interrupted", as in
     * Lightning); flushes. Further logging calls are errors. */
    lk_status (*finalize)(lk_logger *lg, const char *status);
    /* Releases the logger's resources (the base struct included). */
    void (*destroy)(lk_logger *lg);
} lk_logger_vtable;

/* The common head of every logger; implementations embed it first. */
struct lk_logger {
    const lk_logger_vtable *vt;
    char log_dir[LK_LOG_DIR_MAX]; /* where this logger writes ("" when none) */
    int version;                  /* the version_N number, -1 when not versioned */
    int finalized;
};

/* Dispatchers. Each checks for NULL and for logging after finalize. */
lk_status lk_logger_log_hyperparams(lk_logger *lg, const char *yaml);
/* Hyperparameters as key/value text pairs, written as a flat YAML mapping
 * (values are written verbatim: they must already be YAML scalars). */
lk_status lk_logger_log_hyperparams_kv(lk_logger *lg, const char *const *keys, const char *const *values, int n);
lk_status lk_logger_log_metrics(lk_logger *lg, int64_t step, const char *const *names, const double *values, int n);
lk_status lk_logger_flush(lk_logger *lg);
lk_status lk_logger_finalize(lk_logger *lg, const char *status);
/* The directory the logger writes into (borrowed; "" for an empty list). */
const char *lk_logger_log_dir(const lk_logger *lg);
/* Version number N of .../version_N, -1 when none. */
int lk_logger_version(const lk_logger *lg);
/* Frees the logger; NULL is a no-op. Does not finalize. */
void lk_logger_free(lk_logger *lg);

/* Several loggers at once. Each call goes to every child in the order they
 * were added, even when one fails; the first failure is returned, its
 * message naming the child's kind. log_dir/version are the first child's. */
lk_status lk_logger_list_create(lk_logger **out);
/* Takes ownership of `child` (also on failure: it is freed then). */
lk_status lk_logger_list_add(lk_logger *list, lk_logger *child);
int lk_logger_list_count(const lk_logger *list);

/* Lightning's versioned directory: `<root>/<name>/version_<N>`, N the given
 * version, or (version < 0) one more than the largest existing version_<k>
 * (0 when none). root NULL or "" is "."; name NULL is "lightning_logs" and ""
 * drops that level, as in Lightning. Creates the directories (an automatic
 * version is claimed with mkdir, so two runs never share one) and writes the
 * path to `out` (size `size`); the chosen N to *out_version when not NULL. */
lk_status lk_log_dir_resolve(const char *root, const char *name, int version, char *out, size_t size,
                             int *out_version);

/* CSVLogger: metrics.csv and hparams.yaml in `<root>/<name>/version_N`
 * (root, name and version as in lk_log_dir_resolve).
 * metrics.csv is Lightning's: the sorted union of all metric names seen plus
 * "step", one row per log_metrics call, empty cells where a metric was not
 * logged. Rows are buffered and written every `flush_every` rows (default
 * 10), on flush and on finalize: appended (all or nothing) while the
 * header is unchanged, and the whole file rewritten through a temporary file
 * + rename when new columns appear. Values are written with the fewest
 * digits that read back as the same double (Python's repr, as Lightning
 * writes them); integral values like epoch 3 read "3". A failed write keeps
 * the rows for the next attempt. */
lk_status lk_csv_logger_create(const char *root, const char *name, int version, lk_logger **out);
/* Same, writing into an existing or to-be-created directory `dir` as is. */
lk_status lk_csv_logger_create_in(const char *dir, lk_logger **out);
void lk_csv_logger_set_flush_every(lk_logger *csv, int rows);

/* TensorBoardLogger: an event file
 * `<dir>/events.out.tfevents.<unix time>.<hostname>.<pid>.0` (TFRecord
 * framing with masked CRC32C; the first record is file_version
 * "brain.Event:2"; each log_metrics call is one Event{wall_time, step,
 * summary{value{tag, simple_value}...}}; hyperparameters go in as a text
 * summary "hparams" at step 0, and for the HParams tab through
 * lk_tb_logger_log_hparams_session). The file is flushed after every call so a
 * running TensorBoard sees it. */
lk_status lk_tb_logger_create(const char *dir, lk_logger **out);
/* Same with Lightning's versioned directory (see lk_log_dir_resolve). */
lk_status lk_tb_logger_create_versioned(const char *root, const char *name, int version, lk_logger **out);
/* The event file's path (borrowed). */
const char *lk_tb_logger_path(const lk_logger *tb);
/* TensorBoard's HParams tab, as Lightning's TensorBoardLogger fills it:
 * hp_metric = -1 at step 0, then the hparams plugin's experiment, session
 * start (each "key: value" line of `flat_yaml`: numbers, booleans, the
 * rest as text) and session end summaries. */
lk_status lk_tb_logger_log_hparams_session(lk_logger *tb, const char *flat_yaml);

/* CRC32C (Castagnoli) of `len` bytes, continuing from `crc` (start with 0). */
uint32_t lk_crc32c(uint32_t crc, const void *data, size_t len);
/* TFRecord's masked form of a CRC. */
uint32_t lk_crc32c_mask(uint32_t crc);

/* ========================================================================
 * Progress
 * ====================================================================== */

typedef struct lk_progress lk_progress;

typedef enum {
    LK_PROGRESS_AUTO = 0, /* bar when the stream is a terminal, lines otherwise */
    LK_PROGRESS_BAR,      /* in-place bar (ANSI erase-line + carriage return) */
    LK_PROGRESS_LINES,    /* a plain line every `every_n_steps` and at the end */
    LK_PROGRESS_OFF
} lk_progress_mode;

typedef struct lk_progress_options {
    FILE *out;              /* borrowed; NULL: stdout */
    lk_progress_mode mode;  /* AUTO: isatty(fileno(out)) */
    int every_n_steps;      /* LINES mode: a line every N steps (log_every_n_steps); <= 0: 50 */
    int width;              /* terminal columns; <= 0: asked from the terminal, else 80 */
    double refresh_s;       /* BAR mode: redraw at most every refresh_s seconds; <= 0: 0.1 */
    double (*clock)(void);  /* seconds, monotonic; NULL: lk_time_now (tests inject one) */
    int ascii;              /* 1: '#' bar; 0: Unicode blocks; -1: blocks when LC_ALL/LC_CTYPE/LANG say UTF-8 */
} lk_progress_options;

lk_progress_options lk_progress_options_default(void);
lk_status lk_progress_create(const lk_progress_options *opt, lk_progress **out);
void lk_progress_free(lk_progress *p); /* NULL is a no-op; ends a drawn bar's line */
/* True when drawing the in-place bar (resolved mode). */
int lk_progress_is_bar(const lk_progress *p);
/* Token models (gpt): each training step consumes `tokens_per_step` tokens
 * (all data-parallel ranks together); the training rate then also shows
 * tokens per second ("41.2 it/s, 10.5k tok/s"). <= 0: off (the default). */
void lk_progress_set_tokens(lk_progress *p, double tokens_per_step);

/* A training epoch. `epoch` is 0-based (Lightning's current_epoch) and shown
 * 1-based: "Epoch 4/10" is epoch 3 of max_epochs 10; max_epochs <= 0 shows no
 * denominator. total_steps < 0 when the epoch length is unknown. */
void lk_progress_begin_epoch(lk_progress *p, int64_t epoch, int64_t max_epochs, int64_t total_steps);
/* `done` batches of this epoch are finished; the metrics (borrowed) are the
 * ones shown on the bar, replacing the previous set. */
void lk_progress_update(lk_progress *p, int64_t done, const char *const *names, const double *values, int n);
/* Ends the epoch: the bar is drawn final and its line ended; LINES mode
 * prints the epoch summary with these metrics (n = 0 keeps the last set). */
void lk_progress_end_epoch(lk_progress *p, const char *const *names, const double *values, int n);

/* Evaluation loops ("Validation", "Sanity Checking", "Testing",
 * "Predicting"). Inside a training epoch the bar temporarily replaces the
 * epoch's bar, which comes back afterwards; outside one it is left on its
 * own line. LINES mode prints only the summary line at the end. */
void lk_progress_begin_eval(lk_progress *p, const char *stage, int64_t total_steps);
void lk_progress_update_eval(lk_progress *p, int64_t done);
void lk_progress_end_eval(lk_progress *p, const char *const *names, const double *values, int n);

/* Prints one line (a newline is added) without breaking a drawn bar: the
 * bar is erased, the line printed and the bar redrawn below it. Prints in
 * every mode, OFF included: it is for messages, not progress. */
void lk_progress_printf(lk_progress *p, const char *fmt, ...) LK_PRINTF(2, 3);

/* ========================================================================
 * run.json (schema: docs/RUN_JSON.md)
 * ====================================================================== */

typedef struct lk_runinfo_times {
    double data_ms, forward_ms, backward_ms, comm_exposed_ms, optimizer_ms; /* mean per step */
    double comm_wait_ms; /* the part of comm_exposed_ms spent waiting for the last rank to arrive */
} lk_runinfo_times;

/* Everything is borrowed; NULL strings are written as null. */
typedef struct lk_runinfo {
    const char *command;        /* "fit", "validate", "test", "predict" */
    const char *status;         /* "ok" or "error" */
    const char *error;          /* the error message when status is "error" */
    int n_metrics;              /* final value of every logged metric */
    const char *const *metric_names;
    const double *metric_values;
    const char *best_monitor;   /* ModelCheckpoint's monitor, NULL when none */
    double best_score;          /* NaN: none yet (null) */
    const char *best_path;
    int64_t epochs;             /* completed epochs */
    int64_t global_step;        /* optimizer steps */
    double samples_per_s;       /* training samples per second, all ranks together */
    double wall_s;              /* the whole command */
    double time_to_first_step_s;
    int world_size;
    const char *strategy;
    const char *comm_backend;   /* the communicator's backend (shm, nccl, mpi, self); NULL without one (dp) */
    const char *accelerator;
    const char *precision;      /* trainer.precision as given ("32-true", "bf16-mixed", ...) */
    const char *gemm_path;      /* the kernels the precision's GEMMs take on this machine */
    const char *cpu_isa;        /* the instruction set lockstep's own CPU loops run (backend/isa.h) */
    const char *version;        /* NULL: LK_VERSION_STRING */
    const char *git_revision;   /* NULL: the revision the library was built from */
    const char *log_dir;
    const char *last_checkpoint;
    lk_runinfo_times step_time;
    /* The training step replayed as graphs (backend/replay.c) during this
     * run: written only when used is set (else null). */
    struct {
        bool used;
        int64_t steps, captures, launches, eager_segments, eager_ops, refused;
    } graphs;
    double step_peak_mb;        /* tensor memory of one forward + backward beyond what was live before it; 0: unknown */
    /* a pipeline (stages > 0): the measured share of the schedule's time in
     * messages (the stages' idle time and transfers), the mean over the
     * ranks (rank 0's alone when the ranks' were not gathered), rank 0's
     * (the first stage's), and the theory's; each rank's schedule time and
     * time in messages, [run_s, comm_s] x pipe_n_ranks (0: not gathered) */
    int pipe_stages, pipe_chunks, pipe_n_ranks;
    int pipe_virtual; /* the model's stages per rank (interleaved_1f1b) */
    double pipe_bubble, pipe_bubble_first, pipe_bubble_theory;
    const double *pipe_rank_times;
    bool has_model_state;       /* model_state_bytes below is known (a strategy wrapped the module) */
    int64_t model_state_bytes[4]; /* this rank's parameters, gradients, optimizer state, gathered (lk_strategy_get_memory) */
    /* Per rank (n_ranks rows of 6: parameters, gradients, optimizer_state,
     * gathered, alloc_peak_bytes, max_rss_bytes; a model state column -1:
     * unknown), and the per-rank cap (0: none) with the setting that gave it. */
    int n_ranks;
    const int64_t *rank_memory;
    int64_t memory_limit_bytes;
    const char *memory_limit_from;
    const char *config_yaml;    /* the merged config, YAML text */
    /* Settings an LK_* variable can also give, with where each effective
     * value came from (one rule: a config key beats the variable, which
     * beats the default); written as "settings": {name: {value, from}}. */
    int n_settings;
    const struct lk_runinfo_setting {
        const char *name;   /* "comm_timeout" */
        const char *text;   /* the value as a string; NULL: `number` is the value (null when not finite) */
        double number;
        const char *from;   /* "LK_COMM_TIMEOUT", "trainer.comm_timeout in run.yaml:4:3", "default", ... */
    } *settings;
} lk_runinfo;
/* A pipeline rank's share of its schedule's time in messages, from
 * [run_s, comm_s] (NAN when it ran no schedule). */
static inline double lk__pipe_share(const double t[2]) { return t[0] > 0 ? t[1] / t[0] : NAN; }
typedef struct lk_runinfo_setting lk_runinfo_setting;

/* A runinfo with numbers zeroed, best_score NaN, status "ok". */
lk_runinfo lk_runinfo_default(void);
/* Writes `info` as JSON to `path` through a temporary file, fsync and rename. */
lk_status lk_runinfo_write(const char *path, const lk_runinfo *info);
/* The same JSON text, malloc'd with lk_malloc (caller lk_frees). */
lk_status lk_runinfo_to_json(const lk_runinfo *info, char **out);
/* ckpt_path "best" in a new process: the best checkpoint of the newest
 * run under `logs_dir` (its version_N/run.json) whose file is still there.
 * Returns false, out empty, when no run recorded one. */
bool lk__runinfo_find_best(const char *logs_dir, char *out, size_t size);

/* Removes the temporaries of writers that died before their rename
 * (lk_file_remove_stale_tmp) from root, root/version_N and
 * root/version_N/checkpoints; returns how many. Cannot fail. */
int lk__out_remove_stale_tmp(const char *root);

/* ========================================================================
 * Images
 * ====================================================================== */

/* Writes `n` grayscale images (`images`: [n, h, w] row-major, values in [0,1],
 * clamped; NaN is drawn black) as a PNG grid of `cols` columns, each image
 * scaled up `scale` times (nearest), separated and framed by `pad` pixels of
 * mid-gray. Written atomically. */
lk_status lk_image_grid_png(const char *path, const float *images, int n, int h, int w, int cols, int scale,
                            int pad);
/* reconstructions.png: a row of `n` images above a row of their `n`
 * reconstructions (both [n, h, w]), scale and 2-pixel separators. */
lk_status lk_image_recon_png(const char *path, const float *originals, const float *recons, int n, int h, int w,
                             int scale);
/* The same with each row named in a band above it ("input",
 * "reconstruction", black on the separators' gray, font pixels of scale x
 * scale): what the autoencoder writes. */
lk_status lk_image_recon_png_labeled(const char *path, const float *originals, const float *recons, int n, int h,
                                     int w, int scale);

#ifdef __cplusplus
}
#endif
#endif

/* What `lockstep bench train` makes of its measured table once every cell
 * has run: the reason a failed cell gives, the recommendations drawn from
 * the numbers, and the two SVG charts. Pure functions of the table (no
 * processes, no clocks), so tests/cli/test_bench_report.c checks them on a
 * synthetic table. The command itself (running the cells) stays in
 * cmd_bench_train.c. */
#ifndef LK_CLI_BENCH_REPORT_H
#define LK_CLI_BENCH_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "lockstep.h"

/* The step phases a cell records, in run.json's step_time order. WAIT is
 * the part of COMM (exposed communication) spent waiting for the last rank. */
enum { LK__BT_DATA, LK__BT_FORWARD, LK__BT_BACKWARD, LK__BT_COMM, LK__BT_OPT, LK__BT_WAIT, LK__BT_PHASES };

/* One measured cell: a model x strategy x devices x per-device batch. */
typedef struct {
    const char *model, *strategy; /* borrowed from argv */
    const char *precision;        /* trainer.precision of the run (borrowed; NULL: 32-true) */
    int devices, batch;
    double sps;               /* samples/s over all devices; meaningless unless ok */
    double eff;               /* scaling: sps / (devices x the 1-device sps), NAN where not measured */
    double t[LK__BT_PHASES];  /* ms per step, steady state */
    double steal;             /* the hypervisor's share of CPU time during the run, or NAN */
    double step_mb;           /* run.json's step_peak_mb (activations of one step, per process), or NAN */
    double bubble;            /* pipeline: the measured share of the step the stages sat idle (run.json's
                               * pipeline.bubble), or NAN for a strategy without stages */
    double bubble_theory;     /* pipeline: its schedule's (p-1)/(m+p-1), or NAN */
    double bubble_slowest;    /* pipeline: the least idle rank's share (the slowest stage, the schedule's critical
                               * path: run.json's pipeline.bubble_per_rank), or NAN */
    double spread;            /* the noise this run measured around sps, as a fraction (0.15: 15%): its repeats'
                               * range over their median, or identical cells' difference; 0: not measured */
    bool ok;                  /* the cell's (median) run finished and its run.json was read */
    char error[240];          /* why it failed (the run's own error message); "" when ok */
    char log[520];            /* the failed run's log file; "" when ok */
} lk__bench_cell;

#define LK__BENCH_LINE 640

/* A short form (at most `cap`-1 bytes, e.g. "out of memory", "timed out")
 * of a failed cell's full error message, for the table's column. Cannot fail. */
void lk__bench_short_reason(const char *full, char *out, size_t cap);

/* Recommendations drawn only from the ok cells of the table: the best cell,
 * per strategy its scaling at the largest device count and which phases the
 * loss is made of, dp against ddp, batch-size sensitivity. `cores` is the
 * machine's core count (0: unknown), to say when ranks outnumber cores.
 * Writes at most `max` lines of LK__BENCH_LINE bytes each (no newline) and
 * returns how many; a table with no ok cell gives one line saying so.
 * Cannot fail. */
int lk__bench_recommend(const lk__bench_cell *cells, int n, int cores, char (*lines)[LK__BENCH_LINE], int max);

/* The run's noise as the recommendations use it: the largest spread of
 * the ok cells (a fraction), 0 when none was measured. Cannot fail. */
double lk__bench_noise(const lk__bench_cell *cells, int n);

/* When the table has several precisions: per (model, strategy, devices,
 * batch) each precision's samples/s against the first precision's, e.g.
 * "bf16-mixed: 1.50x the samples/s of 32-true (autoencoder ddp x2 batch
 * 256: 19178 vs 12780)". Returns the lines written. Cannot fail. */
int lk__bench_recommend_precision(const lk__bench_cell *cells, int n, char (*lines)[LK__BENCH_LINE], int max);

/* Chart 1: samples/s as grouped bars, a group per (model, strategy,
 * devices), a bar per batch size, with axes, ticks, legend and title.
 * A pipeline cell's bar carries its measured bubble against the theory.
 * Failed cells are not drawn; a note under the chart names them. */
lk_status lk__bench_svg_throughput(FILE *f, const lk__bench_cell *cells, int n);

/* Chart 2: scaling efficiency against the device count, a line per (model,
 * strategy, batch), with the ideal 100% line. Failed cells are left out
 * and named in a note. */
lk_status lk__bench_svg_scaling(FILE *f, const lk__bench_cell *cells, int n);

/* The scaling chart's path for `--plot PATH`: PATH with "-scaling" before
 * its extension (bench.svg -> bench-scaling.svg), or appended where PATH
 * has none. Returns false when it does not fit in `cap`. */
bool lk__bench_scaling_path(const char *plot, char *out, size_t cap);

#endif

/* The report of `lockstep bench train` on a synthetic table (no runs):
 * failed cells never count as numbers, each recommendation cites the
 * figures it comes from, and the two SVG charts carry axes, legend, the
 * ideal line and a note for the cells they leave out. The table's figures
 * are the issue-6 table of record (docs/BENCHMARKS.md), so the expected
 * sentences can be checked by hand. */
#include <math.h>
#include <stdarg.h>

#include "cli/bench_report.h"
#include "lk_test.h"

static lk__bench_cell mk(const char *strategy, int devices, int batch, double sps, double eff, double data, double fwd,
                         double bwd, double comm, double wait, double opt) {
    lk__bench_cell c = {.model = "autoencoder", .strategy = strategy, .devices = devices, .batch = batch,
                        .sps = sps, .eff = eff, .steal = 0, .bubble = NAN, .bubble_theory = NAN,
                        .bubble_slowest = NAN, .ok = true};
    c.t[LK__BT_DATA] = data, c.t[LK__BT_FORWARD] = fwd, c.t[LK__BT_BACKWARD] = bwd;
    c.t[LK__BT_COMM] = comm, c.t[LK__BT_WAIT] = wait, c.t[LK__BT_OPT] = opt;
    return c;
}

/* A failed cell with a throughput that must never show (what the old code
 * reported as 0 could as well have been anything). */
static lk__bench_cell failed(const char *strategy, int devices, int batch) {
    lk__bench_cell c = mk(strategy, devices, batch, 1e9, 0, 0, 0, 0, 0, 0, 0);
    c.ok = false;
    snprintf(c.error, sizeof c.error, "trainer.devices=%d is more than the 2 CPU cores available on this machine "
             "(set LK_ALLOW_OVERSUBSCRIBE=1 to run anyway)", devices);
    return c;
}

static int table(lk__bench_cell *t) {
    int n = 0;
    t[n++] = mk("independent", 1, 256, 22078, 1, 0.02, 4.39, 6.88, 0, 0, 0.30);
    t[n++] = mk("independent", 2, 256, 41808, 0.945, 0.12, 4.54, 7.06, 0, 0, 0.53);
    t[n++] = mk("ddp", 1, 64, 19831, 1, 0.02, 1.19, 1.79, 0, 0, 0.23);
    t[n++] = mk("ddp", 2, 64, 35918, 0.914, 0.05, 1.22, 2.01, 0.06, 0, 0.22);
    t[n++] = mk("ddp", 1, 128, 21439, 1, 0.02, 2.23, 3.46, 0, 0, 0.26);
    t[n++] = mk("ddp", 2, 128, 41077, 0.958, 0.09, 2.30, 3.51, 0.07, 0, 0.25);
    t[n++] = mk("ddp", 1, 256, 22068, 1, 0.02, 4.39, 6.87, 0, 0, 0.32);
    t[n++] = mk("ddp", 2, 256, 42392, 0.960, 0.17, 4.45, 6.95, 0.15, 0.07, 0.35);
    t[n++] = failed("ddp", 4, 256);
    t[n++] = mk("dp", 1, 64, 19886, 1, 0.02, 1.19, 1.77, 0, 0, 0.24);
    t[n++] = mk("dp", 2, 64, 33086, 0.843, 0.01, 1.23, 1.90, 0.11, 0, 0.42);
    t[n++] = mk("dp", 1, 128, 21351, 1, 0.02, 2.24, 3.47, 0, 0, 0.26);
    t[n++] = mk("dp", 2, 128, 36861, 0.871, 0.10, 2.31, 3.79, 0.12, 0, 0.47);
    t[n++] = mk("dp", 1, 256, 22221, 1, 0.01, 4.35, 6.85, 0, 0, 0.31);
    t[n++] = mk("dp", 2, 256, 41024, 0.922, 0.01, 4.45, 6.99, 0.14, 0, 0.54);
    t[n++] = failed("dp", 4, 256);
    return n;
}

static char lines[32][LK__BENCH_LINE];

/* The line that starts with `prefix`, or NULL. */
static const char *line_starting(int n, const char *prefix) {
    for (int i = 0; i < n; i++)
        if (!strncmp(lines[i], prefix, strlen(prefix))) return lines[i];
    return NULL;
}

/* Each needle must appear in the line (reported with the whole line). */
static void check_has(const char *line, const char *prefix, ...) {
    CHECK_MSG(line != NULL, "no line starts with \"%s\"", prefix);
    if (!line) return;
    va_list ap;
    va_start(ap, prefix);
    for (const char *s; (s = va_arg(ap, const char *));)
        CHECK_MSG(strstr(line, s) != NULL, "\"%s\" not in: %s", s, line);
    va_end(ap);
}

static void test_best_cell_ignores_failed_cells(void) {
    lk__bench_cell t[32];
    int n = lk__bench_recommend(t, table(t), 2, lines, 32);
    CHECK(n >= 5);
    for (int i = 0; i < n; i++) {
        CHECK_MSG(!strstr(lines[i], "1,000,000,000") && !strstr(lines[i], "4 devices"),
                  "a failed cell leaked into: %s", lines[i]);
        CHECK_MSG(!strstr(lines[i], "independent, "), "independent recommended: %s", lines[i]);
    }
    check_has(line_starting(n, "best for autoencoder"), "best for autoencoder",
              "best for autoencoder on this machine: ddp, 2 devices, batch 256: 42,392 samples/s",
              "1.91x the best 1-device cell, dp at batch 256: 22,221", NULL);
    check_has(line_starting(n, "2 of 16 cells failed"), "2 of 16 cells failed", "left out", NULL);
}

static void test_scaling_loss_is_split_into_phases(void) {
    lk__bench_cell t[32];
    int n = lk__bench_recommend(t, table(t), 2, lines, 32);
    /* 2 devices: step 12.07 ms against 11.60; each phase's growth / 12.07 */
    check_has(line_starting(n, "ddp at 2 devices"), "ddp at 2 devices",
              "ddp at 2 devices (batch 256) scales 96.0% (91.4-96.0% over batch sizes); the 4.0 points lost are",
              "data loading +1.2", "forward+backward +1.2", "exposed communication (less the wait) +0.7",
              "waiting for the slowest rank +0.6", "optimizer +0.2", "outside the measured phases +0.1",
              "the 2-device step: 12.07 ms against 11.60 ms at 1", "mostly data loading",
              "independent copies (no communication) reach only 94.5% here", NULL);
    check_has(line_starting(n, "dp at 2 devices"), "dp at 2 devices", "dp at 2 devices (batch 256) scales 92.2%",
              "the 7.8 points lost are", "independent copies (no communication) reach 94.5% here, so 2.3 points are the "
              "strategy's own", NULL);
    CHECK(!line_starting(n, "independent at"));
}

/* A strategy that cuts the model runs the same batch on N devices: its
 * ideal step is the 1-device step over N, so each phase's loss is N tN - t1
 * over N TN, and its schedule (forward+backward) holds the loss, not "time
 * between steps" as when it was read as data parallel's. */
static void test_pipeline_scaling_loss(void) {
    lk__bench_cell t[2] = {
        mk("pipeline", 1, 256, 15303, 1, 0.03, 6.10, 9.80, 0, 0, 0.80),
        mk("pipeline", 2, 256, 20414, 0, 0.03, 12.20, 0, 0.01, 0, 0.30),
    };
    t[1].eff = (0.03 + 6.10 + 9.80 + 0.80) / (2 * (0.03 + 12.20 + 0.01 + 0.30));
    t[1].bubble = 0.22, t[1].bubble_theory = 1.0 / 9;
    int nl = lk__bench_recommend(t, 2, 2, lines, 32);
    check_has(line_starting(nl, "pipeline at 2 devices"), "pipeline at 2 devices",
              "pipeline at 2 devices (batch 256) scales 66.7%; the 33.3 points lost are forward+backward +33.9",
              "optimizer -0.8", "2 x the 2-device step: 2 x 12.54 ms against 16.73 ms at 1",
              "mostly forward+backward: the stages wait on each other (the bubble, their unequal compute) and run "
              "smaller micro-batches", NULL);
    CHECK(!strstr(line_starting(nl, "pipeline at 2 devices"), "outside the measured phases +"));
}

static void test_dp_against_ddp_and_batch_size(void) {
    lk__bench_cell t[32];
    int n = lk__bench_recommend(t, table(t), 2, lines, 32);
    check_has(line_starting(n, "dp against ddp"), "dp against ddp", "dp against ddp at 2 devices:",
              "batch 64 7.9% slower (33,086 against 35,918 samples/s)", "batch 128 10.3% slower",
              "batch 256 3.2% slower (41,024 against 42,392", "dp loses up to 10.3% to its central replica",
              "use ddp", NULL);
    check_has(line_starting(n, "batch size"), "batch size", "batch size (ddp, 2 devices): 64: 35,918, 128: 41,077, "
              "256: 42,392 samples/s; +18.0% from 64 to 256, +3.2% from 128 to 256", "gain has flattened", NULL);
}

/* Issue 48: the same table measured on a noisy machine, where two
 * identical 1-device cells differed by 15%: dp's 3-10% losses are inside
 * that noise and are no advice; the noise itself is stated. */
static void test_no_advice_inside_the_noise(void) {
    lk__bench_cell t[32];
    int n = table(t);
    t[2].spread = t[9].spread = 0.15; /* ddp x1 and dp x1 batch 64: 15% apart in that run */
    n = lk__bench_recommend(t, n, 2, lines, 32);
    const char *dp = line_starting(n, "dp against ddp");
    check_has(dp, "dp against ddp", "batch 128 10.3% slower", "every difference is within the 15.0% noise this run "
              "measured: no advice", NULL);
    CHECK_MSG(dp && !strstr(dp, "use ddp"), "advice inside the noise: %s", dp ? dp : "");
    check_has(line_starting(n, "noise:"), "noise:", "differed by up to 15.0%; a smaller difference is not advice", NULL);
    check_has(line_starting(n, "batch size"), "batch size", "+18.0% from 64 to 256", NULL);
    /* a difference beyond the noise is still advice */
    n = table(t);
    t[2].spread = t[9].spread = 0.05;
    n = lk__bench_recommend(t, n, 2, lines, 32);
    check_has(line_starting(n, "dp against ddp"), "dp against ddp", "neither wins", "within 5.0% count as even", NULL);
}

static void test_more_ranks_than_cores_is_named(void) {
    lk__bench_cell t[32];
    int n = lk__bench_recommend(t, table(t), 1, lines, 32);
    check_has(line_starting(n, "ddp at 2 devices"), "ddp at 2 devices",
              "2 ranks share 1 core, so each runs at most 50% of the time", NULL);
}

static void test_no_ok_cell(void) {
    lk__bench_cell t[2] = {failed("ddp", 4, 64), failed("dp", 4, 64)};
    int n = lk__bench_recommend(t, 2, 2, lines, 32);
    CHECK(n == 1);
    check_has(lines[0], "no cell", "no cell finished", NULL);
    CHECK(lk__bench_recommend(t, 2, 2, lines, 0) == 0); /* no room: nothing written */
}

static void test_short_reason(void) {
    char s[48];
    lk__bench_short_reason("trainer.devices=4 is more than the 2 CPU cores available on this machine", s, sizeof s);
    CHECK(!strcmp(s, "more devices than cores"));
    lk__bench_short_reason("", s, sizeof s);
    CHECK(!strcmp(s, "unknown error"));
    const char *lng = "command line: trainer.strategy: expected one of auto|single|ddp|ddp_spawn|dp, got 'bogus'";
    lk__bench_short_reason(lng, s, sizeof s);
    CHECK_MSG(strlen(s) <= 40 && !strncmp(s, "command line:", 13) && strstr(s, "..."), "got \"%s\"", s);
    char tiny[6];
    lk__bench_short_reason(lng, tiny, sizeof tiny);
    CHECK(strlen(tiny) < sizeof tiny);
}

static void test_scaling_path(void) {
    char p[64];
    CHECK(lk__bench_scaling_path("out/bench.svg", p, sizeof p) && !strcmp(p, "out/bench-scaling.svg"));
    CHECK(lk__bench_scaling_path("out.d/bench", p, sizeof p) && !strcmp(p, "out.d/bench-scaling"));
    CHECK(lk__bench_scaling_path("bench", p, sizeof p) && !strcmp(p, "bench-scaling"));
    CHECK(!lk__bench_scaling_path("a-rather-long-name.svg", p, 12));
}

/* Draws a chart into memory. */
static char *draw(lk_status (*fn)(FILE *, const lk__bench_cell *, int), const lk__bench_cell *t, int n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK_OK(fn(f, t, n));
    fclose(f);
    return buf;
}

static int count(const char *s, const char *needle) {
    int k = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) k++;
    return k;
}

static void test_charts(void) {
    lk__bench_cell t[32];
    int n = table(t);
    t[0].model = "a<b&c"; /* text from the command line is escaped */
    t[1].model = "a<b&c";
    char *bars = draw(lk__bench_svg_throughput, t, n);
    CHECK(!strncmp(bars, "<svg ", 5) && strstr(bars, "</svg>\n"));
    CHECK(strstr(bars, "Training throughput by strategy, devices and batch size"));
    CHECK(strstr(bars, ">samples/s</text>") && strstr(bars, ">strategy and device count</text>"));
    CHECK(strstr(bars, ">per-device batch</text>") && strstr(bars, ">40,000</text>"));
    CHECK(count(bars, "<rect x=") >= 14 + 3);   /* a bar per ok cell, a legend swatch per batch size */
    CHECK(count(bars, "samples/s</title>") == 14); /* exactly the ok cells */
    CHECK(strstr(bars, "not shown: 2 failed cells"));
    CHECK(strstr(bars, "ddp x4 batch 256: more devices than cores"));
    CHECK(!strstr(bars, "1,000,000,000"));
    CHECK(strstr(bars, "a&lt;b&amp;c") && !strstr(bars, "a<b&c"));
    free(bars);
    char *sc = draw(lk__bench_svg_scaling, t, n);
    CHECK(!strncmp(sc, "<svg ", 5) && strstr(sc, "</svg>\n"));
    CHECK(strstr(sc, "Scaling efficiency against the ideal") && strstr(sc, ">scaling efficiency</text>"));
    CHECK(strstr(sc, ">ideal (linear)</text>") && strstr(sc, ">100%</text>"));
    CHECK(strstr(sc, "devices (processes"));
    CHECK(count(sc, "<polyline") == 7); /* independent (model a<b&c) at 256; ddp and dp at 64, 128, 256 */
    CHECK(strstr(sc, "not shown: 2 failed cells"));
    free(sc);
    /* no failed cell: no note */
    bars = draw(lk__bench_svg_throughput, t, 8);
    CHECK(!strstr(bars, "not shown"));
    free(bars);
}

/* A pipeline cell's measured bubble is said against its schedule's theory,
 * in the recommendations and on its bar; cells without stages say nothing. */
static void test_pipeline_bubble(void) {
    lk__bench_cell t[4] = {
        mk("single", 1, 256, 12243, 1, 0.02, 8.0, 13.0, 0, 0, 0.4),
        mk("pipeline", 2, 256, 15979, 0.65, 0.02, 4.0, 7.0, 3.0, 0, 0.2),
        mk("pipeline", 2, 64, 9000, 0.6, 0.02, 1.0, 2.0, 1.0, 0, 0.1),
        mk("ddp", 2, 256, 22000, 0.9, 0.02, 4.0, 7.0, 0.5, 0, 0.2),
    };
    t[1].bubble = 0.33, t[1].bubble_theory = 1.0 / 9;
    t[2].bubble = 0.12, t[2].bubble_theory = 1.0 / 9;
    int nl = lk__bench_recommend(t, 4, 2, lines, 32);
    const char *l = line_starting(nl, "pipeline's bubble (stages idle) against its schedule's theory:");
    CHECK(l && strstr(l, " x2 batch 256 33.0% against 11.1%, x2 batch 64 12.0% against 11.1%"));
    CHECK(l && strstr(l, "Up to 21.9 points above the theory"));
    CHECK(!line_starting(nl, "ddp's bubble"));
    t[1].bubble = 0.14;
    nl = lk__bench_recommend(t, 4, 2, lines, 32);
    l = line_starting(nl, "pipeline's bubble");
    CHECK(l && strstr(l, "Within 5 points of the theory"));
    t[1].bubble = 0.02; /* below the theory: rank 0's alone, a first stage that computes more */
    t[2].bubble = 0.10;
    nl = lk__bench_recommend(t, 4, 2, lines, 32);
    l = line_starting(nl, "pipeline's bubble");
    CHECK(l && strstr(l, "Up to 9.1 points below the theory, which assumes equal stages"));
    /* the mean far above the theory, the slowest stage within 5 points of it: the stages differ */
    t[1].bubble = 0.27, t[1].bubble_slowest = 0.147;
    t[2].bubble = 0.12, t[2].bubble_slowest = 0.11;
    nl = lk__bench_recommend(t, 4, 2, lines, 32);
    l = line_starting(nl, "pipeline's bubble");
    CHECK(l && strstr(l, "x2 batch 256 27.0% against 11.1% (slowest stage 14.7%)"));
    CHECK(l && strstr(l, "The slowest stage idles within 5 points of the theory (+3.6 points at most)"));
    t[1].bubble_slowest = 0.30; /* the slowest stage waits too: messages cost more than the schedule allows */
    nl = lk__bench_recommend(t, 4, 2, lines, 32);
    l = line_starting(nl, "pipeline's bubble");
    CHECK(l && strstr(l, "Up to 15.9 points above the theory"));
    t[1].bubble_slowest = t[2].bubble_slowest = NAN;
    t[1].bubble = 0.14, t[2].bubble = 0.12;
    char *bars = draw(lk__bench_svg_throughput, t, 4);
    CHECK(strstr(bars, "pipeline x2 batch 256: 15,979 samples/s; bubble 14.0% (theory 11.1%)</title>"));
    CHECK(strstr(bars, ">bubble 14% / 11%</text>") && strstr(bars, "in a pipeline's bar: measured bubble / theory"));
    CHECK(strstr(bars, "ddp x2 batch 256: 22,000 samples/s</title>"));
    free(bars);
    bars = draw(lk__bench_svg_throughput, t + 3, 1); /* no pipeline: no word of bubbles */
    CHECK(!strstr(bars, "bubble"));
    free(bars);
}

/* Group labels stand apart however long the strategy's name: the centres
 * of two neighbouring "model_parallel" groups (x1 and x2) are at least a
 * label's width (~7 px a character at 12 px) apart, at one batch size
 * where the bars are narrow. */
static int label_x(const char *svg, const char *name, int nth) {
    size_t n = strlen(name);
    for (const char *p = strstr(svg, "<text x='"); p; p = strstr(p + 1, "<text x='")) {
        const char *gt = strchr(p, '>'), *mid = strstr(p, "text-anchor='middle'");
        if (gt && mid && mid < gt && !strncmp(gt + 1, name, n) && !strncmp(gt + 1 + n, "</text>", 7) && !nth--)
            return atoi(p + 9);
    }
    return -1;
}

static void test_long_names_do_not_overlap(void) {
    lk__bench_cell t[] = {mk("model_parallel", 1, 256, 9000, 1, 0, 1, 1, 0, 0, 0),
                          mk("model_parallel", 2, 256, 9100, 0.5, 0, 1, 1, 0, 0, 0),
                          mk("pipeline", 2, 256, 12000, 0.6, 0, 1, 1, 0, 0, 0)};
    char *bars = draw(lk__bench_svg_throughput, t, 3);
    int a = label_x(bars, "model_parallel", 0), b = label_x(bars, "model_parallel", 1), c = label_x(bars, "pipeline", 0);
    CHECK(a > 0 && b > a && c > b);
    CHECK(b - a >= 7 * 14 && c - b >= 7 * (14 + 8) / 2);
    free(bars);
}

LK_TEST_MAIN(LK_TEST_CASE(test_best_cell_ignores_failed_cells), LK_TEST_CASE(test_pipeline_bubble),
             LK_TEST_CASE(test_pipeline_scaling_loss), LK_TEST_CASE(test_long_names_do_not_overlap), LK_TEST_CASE(test_scaling_loss_is_split_into_phases),
             LK_TEST_CASE(test_dp_against_ddp_and_batch_size), LK_TEST_CASE(test_no_advice_inside_the_noise),
             LK_TEST_CASE(test_more_ranks_than_cores_is_named),
             LK_TEST_CASE(test_no_ok_cell), LK_TEST_CASE(test_short_reason), LK_TEST_CASE(test_scaling_path),
             LK_TEST_CASE(test_charts))

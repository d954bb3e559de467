/* The report of `lockstep bench train` once its cells have run: a short
 * reason for each failed cell, recommendations read off the measured table,
 * and the two SVG charts (throughput as grouped bars; scaling efficiency
 * against the ideal line). Everything here is a function of the table, with
 * no processes or clocks, so tests/cli/test_bench_report.c can check it on
 * a synthetic table. Failed cells are never drawn or used as numbers: a
 * failure is not 0 samples/s. */
#include "cli/bench_report.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#define MAXK 64 /* distinct models, strategies, batch sizes or device counts a report tells apart */

/* ---- small helpers ---------------------------------------------------- */

/* Appends printf output to a fixed line, truncating (a long report line is
 * cut, never overflowed). */
static void cat(char *line, const char *fmt, ...) {
    size_t len = strlen(line);
    if (len + 1 >= LK__BENCH_LINE) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + len, LK__BENCH_LINE - len, fmt, ap);
    va_end(ap);
}

/* 42392.4 -> "42,392": samples/s read better with thousands separators. */
static const char *thousands(double v, char *buf, size_t cap) {
    char raw[32];
    snprintf(raw, sizeof raw, "%.0f", v < 0 ? 0 : v);
    size_t n = strlen(raw), o = 0;
    for (size_t i = 0; i < n && o + 2 < cap; i++) {
        if (i && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = raw[i];
    }
    buf[o] = 0;
    return buf;
}

static bool is_strategy(const lk__bench_cell *c) {
    /* `independent` is N unconnected copies: a ceiling to compare with,
     * not a way to train one model, so it is never recommended. */
    return strcmp(c->strategy, "independent") != 0;
}

/* The ok cell with these coordinates, or NULL. */
static const lk__bench_cell *find(const lk__bench_cell *cells, int n, const char *model, const char *strategy,
                                  int devices, int batch) {
    for (int i = 0; i < n; i++)
        if (cells[i].ok && cells[i].devices == devices && cells[i].batch == batch &&
            !strcmp(cells[i].model, model) && !strcmp(cells[i].strategy, strategy))
            return &cells[i];
    return NULL;
}

/* The step time the phases account for (WAIT is inside COMM). */
static double step_ms(const lk__bench_cell *c) {
    return c->t[LK__BT_DATA] + c->t[LK__BT_FORWARD] + c->t[LK__BT_BACKWARD] + c->t[LK__BT_COMM] + c->t[LK__BT_OPT];
}

/* Distinct strings in order of first appearance; returns the count. */
static int distinct_str(const char **out, const char *s, int k) {
    for (int i = 0; i < k; i++)
        if (!strcmp(out[i], s)) return k;
    if (k < MAXK) out[k++] = s;
    return k;
}

static int distinct_int(int *out, int v, int k) {
    for (int i = 0; i < k; i++)
        if (out[i] == v) return k;
    if (k < MAXK) out[k++] = v;
    return k;
}

static void sort_ints(int *v, int k) {
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            int t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
}

/* ---- failed cells ----------------------------------------------------- */

void lk__bench_short_reason(const char *full, char *out, size_t cap) {
    if (!cap) return;
    /* The failures a benchmark run meets most, by the words of their
     * messages; anything else is shown as its first words. */
    static const struct {
        const char *needle, *label;
    } kinds[] = {
        {"CPU cores available", "more devices than cores"},
        {"out of memory", "out of memory"},
        {"Cannot allocate memory", "out of memory"},
        {"timed out", "timed out"},
        {"killed by signal", "killed by a signal"},
        {"no run.json", "no run.json"},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (full && strstr(full, kinds[i].needle)) {
            snprintf(out, cap, "%s", kinds[i].label);
            return;
        }
    const char *s = full && *full ? full : "unknown error";
    size_t len = strlen(s), keep = 32;
    if (len < cap && len <= keep) {
        snprintf(out, cap, "%s", s);
        return;
    }
    if (keep + 4 > cap) keep = cap > 4 ? cap - 4 : 0;
    while (keep > 8 && s[keep] != ' ') keep--; /* cut at a word */
    snprintf(out, cap, "%.*s...", (int)keep, s);
}

/* ---- recommendations -------------------------------------------------- */

typedef struct {
    const char *name, *why;
    double pts; /* points of scaling efficiency this phase costs */
} loss_part;

/* Where an N-device cell loses scaling against its 1-device cell. With the
 * same per-device batch, ideal scaling keeps the step time; efficiency is
 * about T1/TN, so the loss 1 - T1/TN = sum over phases of (tN - t1)/TN: each
 * phase's growth divided by the N-device step, in points of efficiency.
 * A strategy that cuts the model (pipeline, model_parallel: a cell with
 * stages) runs the same batch on N devices, whose ideal step is T1/N:
 * efficiency is T1/(N TN), so each phase counts N tN - t1 over N TN (the
 * pipeline's forwards and backwards are one phase, its schedule, whose
 * excess is the bubble and the micro-batches' smaller GEMMs).
 * What the phases do not account for (the measured efficiency is not
 * exactly that) is its own part. Returns the parts, largest first. */
static int loss_parts(const lk__bench_cell *one, const lk__bench_cell *many, loss_part *p) {
    bool cut = !isnan(many->bubble_theory); /* the model in stages: the batch is not multiplied by N */
    double n = cut ? (double)many->devices : 1.0, tn = n * step_ms(many);
    if (!(tn > 0)) return 0;
    const double *a = one->t, *b = many->t;
    double d[5] = {
        n * (b[LK__BT_COMM] - b[LK__BT_WAIT]) - (a[LK__BT_COMM] - a[LK__BT_WAIT]),
        n * b[LK__BT_WAIT] - a[LK__BT_WAIT],
        n * b[LK__BT_DATA] - a[LK__BT_DATA],
        n * (b[LK__BT_FORWARD] + b[LK__BT_BACKWARD]) - a[LK__BT_FORWARD] - a[LK__BT_BACKWARD],
        n * b[LK__BT_OPT] - a[LK__BT_OPT],
    };
    static const char *names[5] = {"exposed communication (less the wait)", "waiting for the slowest rank", "data loading",
                                   "forward+backward", "optimizer"};
    static const char *whys[5] = {
        "the gradient exchange is not hidden behind backward",
        "ranks wait for a straggler (a busy or stolen core)",
        "the loader has no idle core left to prepare batches",
        "the ranks share caches and memory bandwidth",
        "the optimizer step slows (memory-bound, bandwidth shared)",
    };
    int k = 0;
    double sum = 0;
    for (int i = 0; i < 5; i++) {
        const char *why = whys[i];
        if (cut && i == 3) /* the schedule's forwards and backwards */
            why = "the stages wait on each other (the bubble, their unequal compute) and run smaller micro-batches";
        p[k] = (loss_part){names[i], why, 100 * d[i] / tn};
        sum += p[k++].pts;
    }
    p[k++] = (loss_part){"outside the measured phases", "time between steps (synchronisation, logging)",
                         100 * (1 - many->eff) - sum};
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && p[j].pts > p[j - 1].pts; j--) {
            loss_part t = p[j];
            p[j] = p[j - 1];
            p[j - 1] = t;
        }
    return k;
}

/* One line per strategy of one model: its scaling at its largest device
 * count, for the batch size that is fastest there, and what the loss is made of. */
static void strategy_line(const lk__bench_cell *cells, int n, const char *model, const char *strategy, int cores,
                          char *line) {
    int dmax = 0;
    for (int i = 0; i < n; i++)
        if (cells[i].ok && cells[i].devices > dmax && !strcmp(cells[i].model, model) &&
            !strcmp(cells[i].strategy, strategy))
            dmax = cells[i].devices;
    if (dmax < 2) return;
    const lk__bench_cell *best = NULL;
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        const lk__bench_cell *c = &cells[i];
        if (!c->ok || c->devices != dmax || strcmp(c->model, model) || strcmp(c->strategy, strategy)) continue;
        if (!best || c->sps > best->sps) best = c;
        if (!isnan(c->eff)) lo = fmin(lo, c->eff), hi = fmax(hi, c->eff);
    }
    const lk__bench_cell *one = find(cells, n, model, strategy, 1, best->batch);
    if (!one || isnan(best->eff)) {
        snprintf(line, LK__BENCH_LINE, "%s at %d devices (batch %d): no 1-device cell at batch %d measured, so no "
                 "scaling to judge", strategy, dmax, best->batch, best->batch);
        return;
    }
    snprintf(line, LK__BENCH_LINE, "%s at %d devices (batch %d) scales %.1f%%", strategy, dmax, best->batch,
             100 * best->eff);
    if (hi > lo) cat(line, " (%.1f-%.1f%% over batch sizes)", 100 * lo, 100 * hi);
    double loss = 100 * (1 - best->eff);
    if (loss <= 0.05) {
        cat(line, ": no loss against %d x its 1-device throughput", dmax);
    } else {
        loss_part p[6];
        int k = loss_parts(one, best, p);
        cat(line, "; the %.1f points lost are", loss);
        int shown = 0;
        for (int i = 0; i < k; i++) /* a negative part is a phase that got faster */
            if (fabs(p[i].pts) >= 0.05) cat(line, "%s %s %+.1f", shown++ ? "," : "", p[i].name, p[i].pts);
        if (isnan(best->bubble_theory))
            cat(line, " (each phase's growth over the %d-device step: %.2f ms against %.2f ms at 1)", dmax,
                step_ms(best), step_ms(one));
        else /* the model in stages: the same batch, so the ideal step is the 1-device one over N */
            cat(line, " (each phase's growth over %d x the %d-device step: %d x %.2f ms against %.2f ms at 1)", dmax,
                dmax, dmax, step_ms(best), step_ms(one));
        if (k && p[0].pts >= 0.05) cat(line, "; mostly %s: %s", p[0].name, p[0].why);
    }
    if (cores > 0 && dmax > cores)
        cat(line, "; %d ranks share %d core%s, so each runs at most %.0f%% of the time", dmax, cores,
            cores > 1 ? "s" : "", 100.0 * cores / dmax);
    /* The machine's own ceiling: N unconnected copies lose what sharing
     * caches and memory costs, which no strategy can win back. */
    const lk__bench_cell *ind = find(cells, n, model, "independent", dmax, best->batch);
    if (ind && !isnan(ind->eff) && ind->eff > best->eff)
        cat(line, "; independent copies (no communication) reach %.1f%% here, so %.1f points are the strategy's own "
                  "and the rest the machine's", 100 * ind->eff, 100 * (ind->eff - best->eff));
    else if (ind && !isnan(ind->eff))
        cat(line, "; independent copies (no communication) reach only %.1f%% here: %s loses nothing beyond what the "
                  "machine's shared caches and memory cost", 100 * ind->eff, strategy);
}

/* dp against ddp at the largest device count both measured. */
static void dp_line(const lk__bench_cell *cells, int n, const char *model, char *line) {
    int dmax = 0;
    for (int i = 0; i < n; i++) {
        const lk__bench_cell *c = &cells[i];
        if (c->ok && c->devices > 1 && c->devices > dmax && !strcmp(c->model, model) && !strcmp(c->strategy, "dp") &&
            find(cells, n, model, "ddp", c->devices, c->batch))
            dmax = c->devices;
    }
    if (!dmax) return;
    snprintf(line, LK__BENCH_LINE, "dp against ddp at %d devices:", dmax);
    int slower = 0, faster = 0, pairs = 0;
    double worst = 0;
    /* a difference counts only beyond 1% and beyond the noise the run measured around either cell */
    double even = 100 * lk__bench_noise(cells, n);
    if (even < 1) even = 1;
    for (int i = 0; i < n; i++) {
        const lk__bench_cell *dp = &cells[i];
        if (!dp->ok || dp->devices != dmax || strcmp(dp->model, model) || strcmp(dp->strategy, "dp")) continue;
        const lk__bench_cell *ddp = find(cells, n, model, "ddp", dmax, dp->batch);
        if (!ddp || !(ddp->sps > 0)) continue;
        double pct = 100 * (1 - dp->sps / ddp->sps);
        char a[32], b[32];
        cat(line, "%s batch %d %.1f%% %s (%s against %s samples/s)", pairs++ ? "," : "", dp->batch, fabs(pct),
            pct >= 0 ? "slower" : "faster", thousands(dp->sps, a, sizeof a), thousands(ddp->sps, b, sizeof b));
        if (pct > even) slower++;
        if (pct < -even) faster++;
        if (pct > worst) worst = pct;
    }
    if (slower == pairs)
        cat(line, ". dp loses up to %.1f%% to its central replica (one process gathers, updates and broadcasts "
                  "for every device): use ddp", worst);
    else if (faster == pairs)
        cat(line, ". dp is faster at every batch size measured: prefer dp for this model on this machine");
    else if (even > 1 && !slower && !faster)
        cat(line, ". every difference is within the %.1f%% noise this run measured: no advice (run --repeats 3 "
                  "or more on a quieter machine to tell them apart)", even);
    else
        cat(line, ". neither wins at every batch size (differences within %.1f%% count as even)", even);
}

/* A strategy with stages (pipeline): each cell's measured bubble, the
 * share of the step its stages sat idle (the mean over the ranks), against
 * its schedule's theory (p-1)/(m+p-1); more than 5 points above it means
 * the stages wait on each other beyond what the schedule itself costs.
 * Where the slowest stage's own idle share is within 5 points of the
 * theory, the schedule holds on the critical path and the excess is the
 * faster stages waiting on it (unequal stages). */
static void bubble_line(const lk__bench_cell *cells, int n, const char *model, const char *strategy, char *line) {
    int shown = 0;
    double worst = -1, least = 1; /* the measured bubble's largest and smallest excess over the theory */
    double slow_worst = -1;       /* the slowest stage's largest excess (where known) */
    bool slow_known = true;
    for (int i = 0; i < n; i++) {
        const lk__bench_cell *c = &cells[i];
        if (!c->ok || isnan(c->bubble) || c->devices < 2 || strcmp(c->model, model) || strcmp(c->strategy, strategy))
            continue;
        if (!shown++) snprintf(line, LK__BENCH_LINE, "%s's bubble (stages idle) against its schedule's theory:", strategy);
        cat(line, "%s x%d batch %d %.1f%% against %.1f%%", shown > 1 ? "," : "", c->devices, c->batch,
            100 * c->bubble, 100 * c->bubble_theory);
        if (!isnan(c->bubble_slowest)) cat(line, " (slowest stage %.1f%%)", 100 * c->bubble_slowest);
        if (c->bubble - c->bubble_theory > worst) worst = c->bubble - c->bubble_theory;
        if (c->bubble - c->bubble_theory < least) least = c->bubble - c->bubble_theory;
        if (isnan(c->bubble_slowest)) slow_known = false;
        else if (c->bubble_slowest - c->bubble_theory > slow_worst) slow_worst = c->bubble_slowest - c->bubble_theory;
    }
    if (!shown) return;
    if (worst > 0.05 && slow_known && slow_worst <= 0.05)
        cat(line, ". The slowest stage idles within 5 points of the theory (%+.1f points at most): the schedule holds "
                  "on the critical path, and the mean's excess is the faster stages waiting on the slowest (the stages' "
                  "times differ: split by measured time, --trainer.pipeline.split time)", 100 * slow_worst);
    else if (worst > 0.05)
        cat(line, ". Up to %.1f points above the theory: the stages' times differ (split by measured time: "
                  "--trainer.pipeline.split time) or each message costs more than the schedule allows for; more "
                  "micro-batches (--trainer.pipeline.chunks) shrink the theory itself", 100 * worst);
    else if (least < -0.05) /* rank 0's alone (the ranks' not gathered): a first stage that computes more waits less */
        cat(line, ". Up to %.1f points below the theory, which assumes equal stages: a stage that computes more "
                  "than the others waits less, and they wait more (split by measured time: --trainer.pipeline.split "
                  "time)", -100 * least);
    else
        cat(line, ". Within 5 points of the theory: the schedule, not the split, bounds it; more micro-batches "
                  "(--trainer.pipeline.chunks) shrink it");
}

/* How samples/s change with the per-device batch for the best cell's
 * (strategy, devices). */
static void batch_line(const lk__bench_cell *cells, int n, const lk__bench_cell *best, char *line) {
    int b[MAXK], nb = 0;
    for (int i = 0; i < n; i++)
        if (find(cells, n, best->model, best->strategy, best->devices, cells[i].batch))
            nb = distinct_int(b, cells[i].batch, nb);
    if (nb < 2) return;
    sort_ints(b, nb);
    snprintf(line, LK__BENCH_LINE, "batch size (%s, %d device%s):", best->strategy, best->devices,
             best->devices > 1 ? "s" : "");
    for (int i = 0; i < nb; i++) {
        char a[32];
        cat(line, "%s %d: %s", i ? "," : "", b[i],
            thousands(find(cells, n, best->model, best->strategy, best->devices, b[i])->sps, a, sizeof a));
    }
    const lk__bench_cell *first = find(cells, n, best->model, best->strategy, best->devices, b[0]);
    const lk__bench_cell *prev = find(cells, n, best->model, best->strategy, best->devices, b[nb - 2]);
    const lk__bench_cell *last = find(cells, n, best->model, best->strategy, best->devices, b[nb - 1]);
    double all = 100 * (last->sps / first->sps - 1), step = 100 * (last->sps / prev->sps - 1);
    cat(line, " samples/s; %+.1f%% from %d to %d", all, b[0], b[nb - 1]);
    if (nb > 2) cat(line, ", %+.1f%% from %d to %d", step, b[nb - 2], b[nb - 1]);
    double lo = first->sps, hi = first->sps, noise = 100 * lk__bench_noise(cells, n);
    for (int i = 1; i < nb; i++) {
        double v = find(cells, n, best->model, best->strategy, best->devices, b[i])->sps;
        lo = v < lo ? v : lo, hi = v > hi ? v : hi;
    }
    if (noise > 0 && 100 * (hi / lo - 1) <= noise)
        cat(line, ": all within the %.1f%% noise this run measured, so no batch size is clearly faster", noise);
    else if (best->batch == b[nb - 1] && step < 5)
        cat(line, ": the largest batch is fastest but the gain has flattened; larger ones will add little");
    else if (best->batch == b[nb - 1])
        cat(line, ": still rising, a larger batch may be faster (if the model trains as well with it)");
    else
        cat(line, ": batch %d is fastest; larger batches do not pay here", best->batch);
}

double lk__bench_noise(const lk__bench_cell *cells, int n) {
    double noise = 0;
    for (int i = 0; i < n; i++)
        if (cells[i].ok && cells[i].spread > noise) noise = cells[i].spread;
    return noise;
}

int lk__bench_recommend(const lk__bench_cell *cells, int n, int cores, char (*lines)[LK__BENCH_LINE], int max) {
    int k = 0, failed = 0;
    const char *models[MAXK];
    int nm = 0;
    for (int i = 0; i < n; i++) {
        if (!cells[i].ok) failed++;
        else nm = distinct_str(models, cells[i].model, nm);
    }
#define NEXT() (k < max ? (lines[k][0] = 0, lines[k]) : NULL)
#define KEEP(l) (k += (l) && (l)[0] ? 1 : 0)
    for (int m = 0; m < nm; m++) {
        const lk__bench_cell *best = NULL, *best1 = NULL;
        for (int i = 0; i < n; i++) {
            const lk__bench_cell *c = &cells[i];
            if (!c->ok || !is_strategy(c) || strcmp(c->model, models[m])) continue;
            if (!best || c->sps > best->sps) best = c;
            if (c->devices == 1 && (!best1 || c->sps > best1->sps)) best1 = c;
        }
        if (!best) continue;
        char *l = NEXT(), a[32], b[32];
        if (!l) break;
        snprintf(l, LK__BENCH_LINE, "best for %s on this machine: %s, %d device%s, batch %d: %s samples/s",
                 best->model, best->strategy, best->devices, best->devices > 1 ? "s" : "", best->batch,
                 thousands(best->sps, a, sizeof a));
        if (best1 && best1 != best)
            cat(l, " (%.2fx the best 1-device cell, %s at batch %d: %s)", best->sps / best1->sps, best1->strategy,
                best1->batch, thousands(best1->sps, b, sizeof b));
        KEEP(l);
        const char *strategies[MAXK];
        int ns = 0;
        for (int i = 0; i < n; i++)
            if (cells[i].ok && !strcmp(cells[i].model, models[m])) ns = distinct_str(strategies, cells[i].strategy, ns);
        for (int s = 0; s < ns; s++) {
            if (!strcmp(strategies[s], "independent")) continue;
            if (!(l = NEXT())) break;
            strategy_line(cells, n, models[m], strategies[s], cores, l);
            KEEP(l);
            if (!(l = NEXT())) break;
            bubble_line(cells, n, models[m], strategies[s], l);
            KEEP(l);
        }
        if ((l = NEXT())) {
            dp_line(cells, n, models[m], l);
            KEEP(l);
        }
        if ((l = NEXT())) {
            batch_line(cells, n, best, l);
            KEEP(l);
        }
    }
    char *l;
    double noise = lk__bench_noise(cells, n);
    if (nm && noise > 0 && (l = NEXT())) {
        snprintf(l, LK__BENCH_LINE, "noise: cells this run measured twice (repeats, or identical 1-device cells of "
                 "different strategies) differed by up to %.1f%%; a smaller difference is not advice", 100 * noise);
        KEEP(l);
    }
    if (!nm && (l = NEXT())) {
        snprintf(l, LK__BENCH_LINE, "no cell finished, so there is nothing to recommend (the notes above say why)");
        KEEP(l);
    } else if (failed && (l = NEXT())) {
        snprintf(l, LK__BENCH_LINE, "%d of %d cells failed and are left out of these lines and the charts "
                 "(the notes above say why)", failed, n);
        KEEP(l);
    }
#undef NEXT
#undef KEEP
    return k;
}

/* ---- charts ----------------------------------------------------------- */

/* Text from the command line goes into the SVG escaped. */
static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '\'': fputs("&apos;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
}

/* A tick step of 1, 2 or 5 x 10^k giving at most about 6 ticks up to top. */
static double tick_step(double top) {
    double raw = top / 6, p = pow(10, floor(log10(raw)));
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
}

/* Colours (Okabe-Ito, distinguishable with colour blindness) by strategy
 * name so a strategy keeps its colour across charts and runs. */
static const char *strategy_colour(const char *s, int index) {
    if (!strcmp(s, "ddp")) return "#0072B2";
    if (!strcmp(s, "dp")) return "#D55E00";
    if (!strcmp(s, "independent")) return "#7f7f7f";
    if (!strcmp(s, "single")) return "#009E73";
    static const char *more[] = {"#CC79A7", "#E69F00", "#56B4E9", "#000000"};
    return more[index % 4];
}

/* Batch sizes as shades from light to dark. */
static const char *batch_shade(int i, int n) {
    static const char *shades[] = {"#9ecae1", "#6baed6", "#3182bd", "#08519c", "#08306b", "#041a3a"};
    if (n <= 1) return shades[2];
    int k = n > 4 ? i : 1 + i * 3 / (n - 1);
    return shades[k > 5 ? 5 : k];
}

/* How many failed cells fit on a note line of a chart `w` px wide (a cell
 * takes about 380 px at 12 px type). */
static int note_per_line(int w) { return w > 420 ? (w - 40) / 380 : 1; }

/* How many text lines failed_note writes: a heading, then the cells, at
 * most six. */
static int failed_note_lines(const lk__bench_cell *cells, int n, int w) {
    int failed = 0, per = note_per_line(w);
    for (int i = 0; i < n; i++) failed += !cells[i].ok;
    return failed ? 1 + ((failed > 6 ? 6 : failed) + per - 1) / per : 0;
}

/* A note under a chart naming its failed cells (they are not drawn), from
 * baseline y down, 16 px a line. */
static void failed_note(FILE *f, const lk__bench_cell *cells, int n, int x, int y, int w) {
    int failed = 0, per = note_per_line(w);
    for (int i = 0; i < n; i++) failed += !cells[i].ok;
    if (!failed) return;
    fprintf(f, "<text x='%d' y='%d' fill='#b00000'>not shown: %d failed cell%s (the table's notes give the full "
               "reasons):", x, y, failed, failed > 1 ? "s" : "");
    int shown = 0;
    for (int i = 0; i < n && shown < 6; i++) {
        if (cells[i].ok) continue;
        char why[48];
        lk__bench_short_reason(cells[i].error, why, sizeof why);
        if (shown % per == 0)
            fprintf(f, "</text>\n<text x='%d' y='%d' fill='#b00000'>", x + 12, y + 16 * (1 + shown / per));
        else fputs(", ", f);
        shown++;
        xml_text(f, cells[i].model);
        fputc(' ', f);
        xml_text(f, cells[i].strategy);
        fprintf(f, " x%d batch %d: ", cells[i].devices, cells[i].batch);
        xml_text(f, why);
    }
    if (failed > shown) fprintf(f, ", and %d more", failed - shown);
    fputs("</text>\n", f);
}

/* A point marker per batch size (circle, hollow square, triangle, hollow
 * diamond), so lines stay apart in grey print as well as by dash. */
static void marker(FILE *f, int b, double x, double y, const char *col) {
    switch (b % 4) {
    case 0: fprintf(f, "<circle cx='%.1f' cy='%.1f' r='4' fill='%s'/>", x, y, col); break;
    case 1:
        fprintf(f, "<rect x='%.1f' y='%.1f' width='8' height='8' fill='white' stroke='%s' stroke-width='2'/>", x - 4,
                y - 4, col);
        break;
    case 2:
        fprintf(f, "<polygon points='%.1f,%.1f %.1f,%.1f %.1f,%.1f' fill='%s'/>", x, y - 5, x - 5, y + 4, x + 5, y + 4,
                col);
        break;
    default:
        fprintf(f, "<polygon points='%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f' fill='white' stroke='%s' "
                   "stroke-width='2'/>", x, y - 5, x + 5, y, x, y + 5, x - 5, y, col);
    }
    fputc('\n', f);
}

static void svg_open(FILE *f, int w, int h, const char *title, const char *subtitle) {
    fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' viewBox='0 0 %d %d' "
               "font-family='DejaVu Sans, Helvetica, Arial, sans-serif' font-size='12'>\n", w, h, w, h);
    fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
    fprintf(f, "<text x='%d' y='26' font-size='16' font-weight='bold' text-anchor='middle'>%s</text>\n", w / 2, title);
    fprintf(f, "<text x='%d' y='44' fill='#555' text-anchor='middle'>%s</text>\n", w / 2, subtitle);
}

/* The y axis: gridlines, ticks and labels from 0 to top, and its title. */
static void y_axis(FILE *f, double top, double step, int x0, int x1, int y0, int y1, const char *fmt_pct,
                   const char *title) {
    for (double v = 0; v <= top + step / 2; v += step) {
        double y = y0 - (y0 - y1) * v / top;
        fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='#e4e4e4'/>\n", x0, y, x1, y);
        fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='black'/>\n", x0 - 5, y, x0, y);
        char lab[32];
        if (fmt_pct) snprintf(lab, sizeof lab, fmt_pct, v);
        else thousands(v, lab, sizeof lab);
        fprintf(f, "<text x='%d' y='%.1f' text-anchor='end' dominant-baseline='middle'>%s</text>\n", x0 - 8, y + 1, lab);
    }
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n", x0, y0, x0, y1);
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n", x0, y0, x1, y0);
    fprintf(f, "<text transform='translate(%d,%d) rotate(-90)' text-anchor='middle'>%s</text>\n", x0 - 62,
            (y0 + y1) / 2, title);
}

lk_status lk__bench_svg_throughput(FILE *f, const lk__bench_cell *cells, int n) {
    /* Groups: (model, strategy, devices) in table order; bars: batch sizes. */
    int group[MAXK * 4], ng = 0, batches[MAXK], nb = 0, nmod = 0;
    const char *models[MAXK];
    for (int i = 0; i < n; i++) {
        nb = distinct_int(batches, cells[i].batch, nb);
        nmod = distinct_str(models, cells[i].model, nmod);
        int g = 0;
        while (g < ng && !(cells[group[g]].devices == cells[i].devices &&
                           !strcmp(cells[group[g]].strategy, cells[i].strategy) &&
                           !strcmp(cells[group[g]].model, cells[i].model)))
            g++;
        if (g == ng && ng < MAXK * 4) group[ng++] = i;
    }
    sort_ints(batches, nb);
    double top = 0;
    for (int i = 0; i < n; i++)
        if (cells[i].ok && cells[i].sps > top) top = cells[i].sps;
    if (!(top > 0)) top = 1;
    double step = tick_step(top * 1.08);
    top = ceil(top * 1.08 / step) * step;
    int bw = nb > 4 ? 16 : 22, gw = nb * bw, gap = gw + 28 < 88 ? 88 - gw : 28; /* room for "independent" */
    /* and for the longest strategy name under its group (~7 px a character
     * at the labels' size), so "model_parallel" does not run into its neighbour */
    for (int g = 0; g < ng; g++) {
        int need = 7 * (int)strlen(cells[group[g]].strategy) + 12;
        if (gw + gap < need) gap = need - gw;
    }
    int x0 = 90, plot_w = ng * (gw + gap), legend_w = 150, w = x0 + plot_w + legend_w + 20;
    if (w < 640) w = 640;
    int y1 = 70, y0 = 370, h = y0 + (nmod > 1 ? 84 : 70) + 20;
    h += 16 * failed_note_lines(cells, n, w);
    bool piped = false;
    for (int i = 0; i < n; i++) piped |= cells[i].ok && !isnan(cells[i].bubble);
    svg_open(f, w, h, "Training throughput by strategy, devices and batch size",
             piped ? "samples/s over all devices (higher is better); per-device batch; each bar a cell's median run; "
                     "in a pipeline's bar: measured bubble / theory"
                   : "samples/s over all devices (higher is better); per-device batch; each bar a cell's median run");
    y_axis(f, top, step, x0, x0 + plot_w, y0, y1, NULL, "samples/s");
    for (int g = 0; g < ng; g++) {
        const lk__bench_cell *gc = &cells[group[g]];
        int gx = x0 + gap / 2 + g * (gw + gap);
        for (int b = 0; b < nb; b++) {
            int x = gx + b * bw;
            const lk__bench_cell *c = NULL;
            bool measured = false;
            for (int i = 0; i < n; i++)
                if (cells[i].devices == gc->devices && cells[i].batch == batches[b] &&
                    !strcmp(cells[i].strategy, gc->strategy) && !strcmp(cells[i].model, gc->model)) {
                    measured = true;
                    if (cells[i].ok) c = &cells[i];
                }
            if (!c) {
                if (measured) /* a failed cell: a mark, not a zero-height bar */
                    fprintf(f, "<text transform='translate(%d,%d) rotate(-90)' font-size='10' fill='#b00000'>"
                               "failed</text>\n", x + bw / 2 + 4, y0 - 4);
                continue;
            }
            double bh = (y0 - y1) * c->sps / top;
            fprintf(f, "<rect x='%d' y='%.1f' width='%d' height='%.1f' fill='%s' stroke='white' stroke-width='0.5'>"
                       "<title>", x, y0 - bh, bw - 2, bh, batch_shade(b, nb));
            xml_text(f, c->strategy);
            char a[32];
            fprintf(f, " x%d batch %d: %s samples/s", c->devices, c->batch, thousands(c->sps, a, sizeof a));
            if (!isnan(c->bubble))
                fprintf(f, "; bubble %.1f%% (theory %.1f%%)", 100 * c->bubble, 100 * c->bubble_theory);
            fputs("</title></rect>\n", f);
            fprintf(f, "<text transform='translate(%d,%.1f) rotate(-90)' font-size='9' fill='#333'>%s</text>\n",
                    x + bw / 2 + 3, y0 - bh - 3, a);
            /* a pipeline's bubble inside its bar, bottom up, where the bar is tall enough to hold it */
            if (!isnan(c->bubble) && bh > 100)
                fprintf(f, "<text transform='translate(%d,%d) rotate(-90)' font-size='9' fill='white'>bubble "
                           "%.0f%% / %.0f%%</text>\n",
                        x + bw / 2 + 2, y0 - 4, 100 * c->bubble, 100 * c->bubble_theory);
        }
        fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>", gx + gw / 2, y0 + 18);
        xml_text(f, gc->strategy);
        fprintf(f, "</text>\n<text x='%d' y='%d' text-anchor='middle' fill='#333'>%d device%s</text>\n", gx + gw / 2,
                y0 + 33, gc->devices, gc->devices > 1 ? "s" : "");
        if (nmod > 1) {
            fprintf(f, "<text x='%d' y='%d' text-anchor='middle' fill='#555' font-size='10'>", gx + gw / 2, y0 + 47);
            xml_text(f, gc->model);
            fputs("</text>\n", f);
        }
    }
    /* the strategy groups are separated by a faint line for reading */
    for (int g = 1; g < ng; g++)
        if (strcmp(cells[group[g]].strategy, cells[group[g - 1]].strategy) ||
            strcmp(cells[group[g]].model, cells[group[g - 1]].model)) {
            int x = x0 + g * (gw + gap);
            fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#bbb' stroke-dasharray='3,3'/>\n", x, y1, x,
                    y0 + 36);
        }
    int lx = x0 + plot_w + 24;
    fprintf(f, "<text x='%d' y='%d' font-weight='bold'>per-device batch</text>\n", lx, y1 + 4);
    for (int b = 0; b < nb; b++) {
        fprintf(f, "<rect x='%d' y='%d' width='14' height='14' fill='%s'/>", lx, y1 + 14 + 20 * b,
                batch_shade(b, nb));
        fprintf(f, "<text x='%d' y='%d'>%d</text>\n", lx + 20, y1 + 26 + 20 * b, batches[b]);
    }
    int ny = y0 + (nmod > 1 ? 64 : 52);
    fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>strategy and device count</text>\n", x0 + plot_w / 2, ny);
    failed_note(f, cells, n, 10, ny + 24, w);
    fputs("</svg>\n", f);
    return ferror(f) ? lk_error(LK_STATUS_IO, "bench train: writing the throughput chart failed") : LK_STATUS_OK;
}

lk_status lk__bench_svg_scaling(FILE *f, const lk__bench_cell *cells, int n) {
    int devs[MAXK], nd = 0, batches[MAXK], nb = 0, ns = 0;
    const char *series_m[MAXK], *series_s[MAXK]; /* (model, strategy): a colour each */
    double top = 1.1;
    for (int i = 0; i < n; i++) {
        nd = distinct_int(devs, cells[i].devices, nd);
        nb = distinct_int(batches, cells[i].batch, nb);
        int s = 0; /* a series with no ok cell has nothing to draw and no legend entry */
        while (s < ns && !(!strcmp(series_m[s], cells[i].model) && !strcmp(series_s[s], cells[i].strategy))) s++;
        if (s == ns && ns < MAXK && cells[i].ok) series_m[ns] = cells[i].model, series_s[ns++] = cells[i].strategy;
        if (cells[i].ok && !isnan(cells[i].eff) && cells[i].eff > top) top = cells[i].eff;
    }
    sort_ints(devs, nd);
    sort_ints(batches, nb);
    int nmod = 0;
    const char *models[MAXK];
    for (int i = 0; i < n; i++) nmod = distinct_str(models, cells[i].model, nmod);
    top = ceil(top * 10 + 0.01) / 10 * 100; /* in %, a little headroom above the highest point */
    double step = top > 150 ? 25 : 10;
    top = ceil(top / step) * step;
    int x0 = 90, plot_w = nd > 1 ? 120 * (nd - 1) + 80 : 200, y1 = 70, y0 = 370;
    int legend_w = 220, w = x0 + plot_w + legend_w;
    if (w < 800) w = 800, plot_w = w - x0 - legend_w;
    int legend_end = y1 + 4 + 26 + 20 * ns + 26 + 20 * nb + 20;
    int note_y = legend_end > y0 + 50 ? legend_end + 14 : y0 + 64, nl = failed_note_lines(cells, n, w);
    int h = note_y + 18 + 16 * nl + 16;
    svg_open(f, w, h, "Scaling efficiency against the ideal",
             "samples/s at N devices / (N x samples/s at 1 device), same per-device batch; 100% is linear scaling");
    y_axis(f, top, step, x0, x0 + plot_w, y0, y1, "%.0f%%", "scaling efficiency");
#define XPOS(d) (nd > 1 ? x0 + 40 + (plot_w - 80) * (d) / (nd - 1) : x0 + plot_w / 2)
#define YPOS(e) (y0 - (y0 - y1) * (100 * (e)) / top)
    for (int d = 0; d < nd; d++) {
        fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n", XPOS(d), y0, XPOS(d), y0 + 5);
        fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>%d</text>\n", XPOS(d), y0 + 19, devs[d]);
    }
    fprintf(f, "<text x='%d' y='%d' text-anchor='middle'>devices (processes; on the CPU a device is a core)</text>\n",
            x0 + plot_w / 2, y0 + 40);
    fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='black' stroke-width='1.5' stroke-dasharray='8,4'/>\n",
            x0, YPOS(1.0), x0 + plot_w, YPOS(1.0));
    static const char *dashes[] = {"", "6,3", "2,3", "9,3,2,3", "12,4"};
    for (int s = 0; s < ns; s++) {
        const char *col = strategy_colour(series_s[s], s);
        for (int b = 0; b < nb; b++) {
            const char *dash = dashes[b % 5];
            double px[MAXK], py[MAXK], pe[MAXK];
            int np = 0;
            for (int d = 0; d < nd; d++) {
                const lk__bench_cell *c = find(cells, n, series_m[s], series_s[s], devs[d], batches[b]);
                if (!c || isnan(c->eff)) continue;
                px[np] = XPOS(d), py[np] = YPOS(c->eff), pe[np++] = c->eff;
            }
            if (np > 1) {
                fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' stroke-dasharray='%s' points='", col,
                        dash);
                for (int i = 0; i < np; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", px[i], py[i]);
                fputs("'/>\n", f);
            }
            for (int i = 0; i < np; i++) {
                marker(f, b, px[i], py[i], col);
                if (i || pe[i] != 1) /* the 1-device points are all 100%: one label would hide the others */
                    fprintf(f, "<text x='%.1f' y='%.1f' font-size='10' fill='%s'>%.1f%%</text>\n", px[i] + 8,
                            py[i] + 4, col, 100 * pe[i]);
            }
        }
    }
    int lx = x0 + plot_w + 24, ly = y1 + 4;
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black' stroke-width='1.5' stroke-dasharray='8,4'/>",
            lx, ly - 4, lx + 30, ly - 4);
    fprintf(f, "<text x='%d' y='%d'>ideal (linear)</text>\n", lx + 36, ly);
    ly += 26;
    fprintf(f, "<text x='%d' y='%d' font-weight='bold'>strategy</text>\n", lx, ly);
    for (int s = 0; s < ns; s++) {
        ly += 20;
        fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='%s' stroke-width='3'/><text x='%d' y='%d'>", lx,
                ly - 4, lx + 30, ly - 4, strategy_colour(series_s[s], s), lx + 36, ly);
        xml_text(f, series_s[s]);
        if (nmod > 1) {
            fputs(" (", f);
            xml_text(f, series_m[s]);
            fputs(")", f);
        }
        fputs("</text>\n", f);
    }
    ly += 26;
    fprintf(f, "<text x='%d' y='%d' font-weight='bold'>per-device batch</text>\n", lx, ly);
    for (int b = 0; b < nb; b++) {
        ly += 20;
        fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#444' stroke-width='2' stroke-dasharray='%s'/>", lx,
                ly - 4, lx + 30, ly - 4, dashes[b % 5]);
        marker(f, b, lx + 15, ly - 4, "#444");
        fprintf(f, "<text x='%d' y='%d'>%d</text>\n", lx + 36, ly, batches[b]);
    }
#undef XPOS
#undef YPOS
    fprintf(f, "<text x='10' y='%d' fill='#555'>1-device cells are 100%% by definition; a cell without a "
               "1-device cell at its batch size has no point.</text>\n", note_y);
    failed_note(f, cells, n, 10, note_y + 18, w);
    fputs("</svg>\n", f);
    return ferror(f) ? lk_error(LK_STATUS_IO, "bench train: writing the scaling chart failed") : LK_STATUS_OK;
}

bool lk__bench_scaling_path(const char *plot, char *out, size_t cap) {
    const char *slash = strrchr(plot, '/'), *dot = strrchr(plot, '.');
    if (dot && (dot == plot || (slash && dot < slash) || dot[-1] == '/')) dot = NULL; /* ".svg" or "dir.x/plot" */
    int len = dot ? (int)(dot - plot) : (int)strlen(plot);
    int w = snprintf(out, cap, "%.*s-scaling%s", len, plot, dot ? dot : "");
    return w >= 0 && (size_t)w < cap;
}

static const char *prec(const lk__bench_cell *c) { return c->precision ? c->precision : "32-true"; }

int lk__bench_recommend_precision(const lk__bench_cell *cells, int n, char (*lines)[LK__BENCH_LINE], int max) {
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        const lk__bench_cell *a = &cells[i];
        if (!a->ok || !(a->sps > 0)) continue;
        /* the baseline is the first cell of the same configuration in table order */
        const lk__bench_cell *base = NULL;
        for (int j = 0; j < i && !base; j++) {
            const lk__bench_cell *b = &cells[j];
            if (!strcmp(b->model, a->model) && !strcmp(b->strategy, a->strategy) && b->devices == a->devices &&
                b->batch == a->batch && strcmp(prec(b), prec(a)))
                base = b;
        }
        if (!base || !base->ok || !(base->sps > 0)) continue;
        snprintf(lines[k++], LK__BENCH_LINE, "%s: %.2fx the samples/s of %s (%s %s x%d batch %d: %.0f vs %.0f)",
                 prec(a), a->sps / base->sps, prec(base), a->model, a->strategy, a->devices, a->batch, a->sps,
                 base->sps);
    }
    return k;
}

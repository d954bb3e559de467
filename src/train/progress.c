/* The progress display. On a terminal: one in-place bar per epoch in tqdm's
 * shape (Lightning's TQDMProgressBar), redrawn at most ~10 times a second and
 * kept within the terminal's width so carriage-return redraws never wrap;
 * evaluation bars replace it for a while and give it back. Anywhere else
 * (CI logs, pipes, files): plain lines, one every N steps and one per epoch,
 * so logs stay readable and grep-able. The clock is only read for display
 * (rates, ETA, throttling) and can be injected, so tests check exact text. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "train/loggers.h"

#define PROG_METRICS 16
#define PROG_NAME 48
#define LINE_MAX_BYTES 2048

typedef struct {
    int n;
    char name[PROG_METRICS][PROG_NAME];
    double value[PROG_METRICS];
} metric_set;

typedef struct {
    int active;
    char label[64];
    int64_t done, total;
    double t0, last_draw;
} bar_state;

struct lk_progress {
    FILE *out;
    lk_progress_mode mode; /* resolved: BAR, LINES or OFF */
    int every;
    int width_opt, width;
    double refresh;
    double (*clock)(void);
    int ascii;
    int64_t epoch, max_epochs;
    bar_state train, eval;
    metric_set train_m, eval_m;
    int64_t last_line_done;
    int drawn; /* a bar is on screen, the cursor at the end of its line */
    double tokens_per_step; /* > 0: the training rate shows tok/s too */
};

void lk_progress_set_tokens(lk_progress *p, double tokens_per_step) {
    if (p) p->tokens_per_step = tokens_per_step;
}

lk_progress_options lk_progress_options_default(void) {
    return (lk_progress_options){NULL, LK_PROGRESS_AUTO, 50, 0, 0.1, NULL, -1};
}

/* Block characters need a UTF-8 terminal; the C library's locale is "C"
 * unless the program called setlocale, so ask the environment, in POSIX's
 * order of precedence. */
static int locale_is_utf8(void) {
    const char *vars[] = {"LC_ALL", "LC_CTYPE", "LANG"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(vars[i]);
        if (!v || !v[0]) continue;
        return strcasestr(v, "utf-8") || strcasestr(v, "utf8");
    }
    return 0;
}

lk_status lk_progress_create(const lk_progress_options *opt, lk_progress **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_progress_create: out is NULL");
    *out = NULL;
    lk_progress_options o = opt ? *opt : lk_progress_options_default();
    lk_progress *p = lk_calloc(1, sizeof *p);
    if (!p) return lk_last_status();
    p->out = o.out ? o.out : stdout;
    p->mode = o.mode;
    if (p->mode == LK_PROGRESS_AUTO) p->mode = isatty(fileno(p->out)) ? LK_PROGRESS_BAR : LK_PROGRESS_LINES;
    p->every = o.every_n_steps > 0 ? o.every_n_steps : 50;
    p->width_opt = o.width;
    p->refresh = o.refresh_s > 0 ? o.refresh_s : 0.1;
    p->clock = o.clock ? o.clock : lk_time_now;
    p->ascii = o.ascii >= 0 ? o.ascii != 0 : !locale_is_utf8();
    *out = p;
    return LK_STATUS_OK;
}

void lk_progress_free(lk_progress *p) {
    if (!p) return;
    if (p->drawn) {
        fputc('\n', p->out);
        fflush(p->out);
    }
    lk_free(p);
}

int lk_progress_is_bar(const lk_progress *p) { return p && p->mode == LK_PROGRESS_BAR; }

/* ------------------------------------------------------------------------
 * Formatting
 * ---------------------------------------------------------------------- */

static int term_width(const lk_progress *p) {
    if (p->width_opt > 0) return p->width_opt;
    struct winsize ws;
    if (ioctl(fileno(p->out), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20) return ws.ws_col;
    return 80;
}

/* tqdm's interval: MM:SS, or H:MM:SS from an hour on. */
static void fmt_interval(char *buf, size_t size, double s) {
    if (!(s >= 0) || s > 3.6e8) {
        snprintf(buf, size, "?");
        return;
    }
    long t = (long)s; /* truncated, as tqdm does */
    if (t >= 3600) snprintf(buf, size, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, size, "%02ld:%02ld", t / 60, t % 60);
}

static void fmt_rate(char *buf, size_t size, int64_t done, double elapsed) {
    if (done <= 0 || elapsed <= 0) snprintf(buf, size, "? it/s");
    else if (done / elapsed >= 1) snprintf(buf, size, "%.1f it/s", (double)done / elapsed);
    else snprintf(buf, size, "%.2f s/it", elapsed / (double)done);
}

/* ", 10.5k tok/s" after the rate when the run's steps carry tokens */
static void add_tokens(const lk_progress *p, char *buf, size_t size, int64_t done, double elapsed) {
    if (p->tokens_per_step <= 0 || done <= 0 || elapsed <= 0) return;
    double r = (double)done * p->tokens_per_step / elapsed;
    size_t n = strlen(buf);
    if (r >= 1e6) snprintf(buf + n, size - n, ", %.2fM tok/s", r / 1e6);
    else if (r >= 1e3) snprintf(buf + n, size - n, ", %.1fk tok/s", r / 1e3);
    else snprintf(buf + n, size - n, ", %.0f tok/s", r);
}

/* Four significant digits, exponents shortened the way tqdm does (1e-5). */
static void fmt_value(char *buf, size_t size, double v) {
    char t[48];
    snprintf(t, sizeof t, "%.4g", v);
    char *e = strchr(t, 'e');
    if (e && (e[1] == '+' || e[1] == '-')) {
        char *d = e + 2;
        while (*d == '0' && d[1]) memmove(d, d + 1, strlen(d));
        if (e[1] == '+') memmove(e + 1, e + 2, strlen(e + 1));
    }
    snprintf(buf, size, "%s", t);
}

static void put(char *buf, size_t size, size_t *at, const char *fmt, ...) LK_PRINTF(4, 5);
static void put(char *buf, size_t size, size_t *at, const char *fmt, ...) {
    if (*at >= size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, size - *at, fmt, ap);
    va_end(ap);
    if (n > 0) *at += (size_t)n < size - *at ? (size_t)n : size - *at - 1;
}

static void put_metrics(char *buf, size_t size, size_t *at, const metric_set *m, const char *first_sep,
                        const char *sep) {
    for (int i = 0; i < m->n; i++) {
        char v[48];
        fmt_value(v, sizeof v, m->value[i]);
        put(buf, size, at, "%s%s=%s", i ? sep : first_sep, m->name[i], v);
    }
}

/* Display columns of UTF-8 text (every glyph used here is one column). */
static int columns(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* Cuts `s` after `cols` display columns. */
static void cut_columns(char *s, int cols) {
    int n = 0;
    for (char *q = s; *q; q++) {
        if (((unsigned char)*q & 0xC0) != 0x80 && n++ == cols) {
            *q = 0;
            return;
        }
    }
}

/* One bar line: "Epoch 4/10  45%|████▌     | 97/215 [00:02<00:03, 41.2 it/s, a=1]". */
static void render_bar(const lk_progress *p, const bar_state *b, const metric_set *m, double now, char *line,
                       size_t size) {
    double elapsed = now - b->t0;
    char el[32], eta[32], rate[64], tail[LINE_MAX_BYTES];
    fmt_interval(el, sizeof el, elapsed);
    fmt_rate(rate, sizeof rate, b->done, elapsed);
    if (b == &p->train) add_tokens(p, rate, sizeof rate, b->done, elapsed);
    size_t at = 0;
    if (b->total > 0) {
        double remaining = b->done > 0 && elapsed > 0 ? (double)(b->total - b->done) * elapsed / (double)b->done : -1;
        fmt_interval(eta, sizeof eta, remaining);
        put(tail, sizeof tail, &at, "| %lld/%lld [%s<%s, %s", (long long)b->done, (long long)b->total, el, eta, rate);
    } else {
        put(tail, sizeof tail, &at, " %lld [%s, %s", (long long)b->done, el, rate);
    }
    put_metrics(tail, sizeof tail, &at, m, ", ", ", ");
    put(tail, sizeof tail, &at, "]");
    size_t lat = 0;
    if (b->total > 0) {
        double frac = (double)b->done / (double)b->total;
        if (frac > 1) frac = 1;
        if (frac < 0) frac = 0;
        char head[96];
        snprintf(head, sizeof head, "%s %3d%%|", b->label, (int)(frac * 100));
        /* a steady 20 cells (a bar that changes length as metrics change
         * looks jittery), narrower only when the line would not fit */
        int cells = p->width - 1 - columns(head) - columns(tail);
        if (cells > 20) cells = 20;
        if (cells < 10) cells = 10;
        put(line, size, &lat, "%s", head);
        /* eighths of a cell, as tqdm draws them */
        static const char *const part[8] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
        int64_t done = b->done < 0 ? 0 : b->done > b->total ? b->total : b->done;
        int eighths = (int)(done * cells * 8 / b->total); /* integers: 2/5 of 20 cells is 8, not 7.99 */
        int full = eighths / 8, rest = eighths % 8, used = full;
        if (p->ascii) full = eighths / 8, rest = 0, used = full;
        for (int i = 0; i < full; i++) put(line, size, &lat, "%s", p->ascii ? "#" : "█");
        if (rest) {
            put(line, size, &lat, "%s", part[rest]);
            used++;
        }
        for (int i = used; i < cells; i++) put(line, size, &lat, " ");
    } else {
        put(line, size, &lat, "%s:", b->label);
    }
    put(line, size, &lat, "%s", tail);
    cut_columns(line, p->width - 1);
}

static void draw(lk_progress *p, const bar_state *b, const metric_set *m, double now) {
    char line[LINE_MAX_BYTES * 2];
    render_bar(p, b, m, now, line, sizeof line);
    fprintf(p->out, "\r%s\033[K", line);
    fflush(p->out);
    p->drawn = 1;
}

/* The bar that belongs on screen now: evaluation's while one runs. */
static void redraw(lk_progress *p, double now) {
    if (p->eval.active) draw(p, &p->eval, &p->eval_m, now);
    else if (p->train.active) draw(p, &p->train, &p->train_m, now);
}

static void erase(lk_progress *p) {
    if (!p->drawn) return;
    fputs("\r\033[K", p->out);
    p->drawn = 0;
}

static void set_metrics(metric_set *m, const char *const *names, const double *values, int n) {
    if (n < 0 || (n > 0 && (!names || !values))) n = 0;
    m->n = 0;
    for (int i = 0; i < n && m->n < PROG_METRICS; i++) {
        if (!names[i]) continue;
        snprintf(m->name[m->n], PROG_NAME, "%s", names[i]);
        m->value[m->n++] = values[i];
    }
}

static void epoch_label(const lk_progress *p, char *buf, size_t size, int upper) {
    if (p->max_epochs > 0)
        snprintf(buf, size, "%s %lld/%lld", upper ? "Epoch" : "epoch", (long long)p->epoch + 1,
                 (long long)p->max_epochs);
    else
        snprintf(buf, size, "%s %lld", upper ? "Epoch" : "epoch", (long long)p->epoch + 1);
}

/* ------------------------------------------------------------------------
 * Training epochs
 * ---------------------------------------------------------------------- */

void lk_progress_begin_epoch(lk_progress *p, int64_t epoch, int64_t max_epochs, int64_t total_steps) {
    if (!p || p->mode == LK_PROGRESS_OFF) return;
    p->epoch = epoch;
    p->max_epochs = max_epochs;
    p->width = term_width(p);
    p->train = (bar_state){1, "", 0, total_steps, p->clock(), -1e30};
    epoch_label(p, p->train.label, sizeof p->train.label, 1);
    p->train_m.n = 0;
    p->last_line_done = -1;
    if (p->mode == LK_PROGRESS_BAR) {
        draw(p, &p->train, &p->train_m, p->train.t0);
        p->train.last_draw = p->train.t0;
    }
}

void lk_progress_update(lk_progress *p, int64_t done, const char *const *names, const double *values, int n) {
    if (!p || p->mode == LK_PROGRESS_OFF || !p->train.active) return;
    p->train.done = done;
    set_metrics(&p->train_m, names, values, n);
    double now = p->clock();
    if (p->mode == LK_PROGRESS_BAR) {
        if (p->eval.active) return; /* shown again when evaluation ends */
        if (now - p->train.last_draw < p->refresh && done != p->train.total) return;
        draw(p, &p->train, &p->train_m, now);
        p->train.last_draw = now;
        return;
    }
    if (done <= 0 || done % p->every != 0 || done == p->last_line_done) return;
    if (p->train.total > 0 && done >= p->train.total) return; /* the epoch's own line follows */
    p->last_line_done = done;
    char line[LINE_MAX_BYTES], label[64], rate[64];
    size_t at = 0;
    epoch_label(p, label, sizeof label, 0);
    fmt_rate(rate, sizeof rate, done, now - p->train.t0);
    add_tokens(p, rate, sizeof rate, done, now - p->train.t0);
    if (p->train.total > 0)
        put(line, sizeof line, &at, "%s step %lld/%lld (%d%%) %s", label, (long long)done,
            (long long)p->train.total, (int)(100.0 * (double)done / (double)p->train.total), rate);
    else
        put(line, sizeof line, &at, "%s step %lld %s", label, (long long)done, rate);
    put_metrics(line, sizeof line, &at, &p->train_m, " ", " ");
    fprintf(p->out, "%s\n", line);
    fflush(p->out);
}

void lk_progress_end_epoch(lk_progress *p, const char *const *names, const double *values, int n) {
    if (!p || p->mode == LK_PROGRESS_OFF || !p->train.active) return;
    if (n > 0) set_metrics(&p->train_m, names, values, n);
    double now = p->clock();
    if (p->mode == LK_PROGRESS_BAR) {
        p->eval.active = 0;
        draw(p, &p->train, &p->train_m, now);
        fputc('\n', p->out);
        fflush(p->out);
        p->drawn = 0;
    } else {
        char line[LINE_MAX_BYTES], label[64], el[32], rate[64];
        size_t at = 0;
        epoch_label(p, label, sizeof label, 0);
        fmt_interval(el, sizeof el, now - p->train.t0);
        fmt_rate(rate, sizeof rate, p->train.done, now - p->train.t0);
        add_tokens(p, rate, sizeof rate, p->train.done, now - p->train.t0);
        put(line, sizeof line, &at, "%s done %lld steps in %s (%s)", label, (long long)p->train.done, el, rate);
        put_metrics(line, sizeof line, &at, &p->train_m, " ", " ");
        fprintf(p->out, "%s\n", line);
        fflush(p->out);
    }
    p->train.active = 0;
}

/* ------------------------------------------------------------------------
 * Evaluation loops
 * ---------------------------------------------------------------------- */

void lk_progress_begin_eval(lk_progress *p, const char *stage, int64_t total_steps) {
    if (!p || p->mode == LK_PROGRESS_OFF) return;
    if (!p->train.active) p->width = term_width(p);
    p->eval = (bar_state){1, "", 0, total_steps, p->clock(), -1e30};
    snprintf(p->eval.label, sizeof p->eval.label, "%s", stage && stage[0] ? stage : "Validation");
    p->eval_m.n = 0;
    if (p->mode == LK_PROGRESS_BAR) {
        draw(p, &p->eval, &p->eval_m, p->eval.t0);
        p->eval.last_draw = p->eval.t0;
    }
}

void lk_progress_update_eval(lk_progress *p, int64_t done) {
    if (!p || p->mode == LK_PROGRESS_OFF || !p->eval.active) return;
    p->eval.done = done;
    if (p->mode != LK_PROGRESS_BAR) return;
    double now = p->clock();
    if (now - p->eval.last_draw < p->refresh && done != p->eval.total) return;
    draw(p, &p->eval, &p->eval_m, now);
    p->eval.last_draw = now;
}

void lk_progress_end_eval(lk_progress *p, const char *const *names, const double *values, int n) {
    if (!p || p->mode == LK_PROGRESS_OFF || !p->eval.active) return;
    set_metrics(&p->eval_m, names, values, n);
    double now = p->clock();
    if (p->mode == LK_PROGRESS_BAR) {
        if (p->train.active) { /* transient inside an epoch: the epoch's bar comes back */
            p->eval.active = 0;
            draw(p, &p->train, &p->train_m, now);
            p->train.last_draw = now;
        } else {
            draw(p, &p->eval, &p->eval_m, now);
            fputc('\n', p->out);
            fflush(p->out);
            p->drawn = 0;
            p->eval.active = 0;
        }
        return;
    }
    char line[LINE_MAX_BYTES], label[64], el[32], rate[32];
    size_t at = 0;
    put(line, sizeof line, &at, "%s", p->eval.label);
    if (p->train.active) {
        epoch_label(p, label, sizeof label, 0);
        put(line, sizeof line, &at, " %s", label);
    }
    fmt_interval(el, sizeof el, now - p->eval.t0);
    fmt_rate(rate, sizeof rate, p->eval.done, now - p->eval.t0);
    put(line, sizeof line, &at, ": %lld batches in %s (%s)", (long long)p->eval.done, el, rate);
    put_metrics(line, sizeof line, &at, &p->eval_m, " ", " ");
    fprintf(p->out, "%s\n", line);
    fflush(p->out);
    p->eval.active = 0;
}

void lk_progress_printf(lk_progress *p, const char *fmt, ...) {
    if (!p) return;
    FILE *out = p->out;
    int was_drawn = p->drawn;
    erase(p);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
    if (was_drawn) redraw(p, p->clock());
    fflush(out);
}

/* The logger interface (dispatchers, the fan-out list, Lightning's
 * versioned log directory) and the CSVLogger. metrics.csv follows
 * Lightning's _ExperimentWriter: sorted union of metric names plus "step",
 * one row per logging call, rows buffered and saved in batches. Lightning
 * appends while the header is unchanged and rewrites the file when new
 * columns appear; we do the same, but every write is all-or-nothing: the
 * rewrite goes through a temporary file + rename, and a failed append is
 * truncated back, so a crash or a full disk never leaves a torn file. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/loggers.h"

/* ------------------------------------------------------------------------
 * Dispatchers
 * ---------------------------------------------------------------------- */

static lk_status check_open(const lk_logger *lg, const char *what) {
    if (!lg) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: logger is NULL", what);
    if (lg->finalized)
        return lk_error(LK_STATUS_INVALID_USAGE, "%s: the %s logger (%s) was already finalized", what,
                        lg->vt->kind, lg->log_dir);
    return LK_STATUS_OK;
}

lk_status lk_logger_log_hyperparams(lk_logger *lg, const char *yaml) {
    LK_TRY(check_open(lg, "log_hyperparams"));
    return lg->vt->log_hyperparams(lg, yaml ? yaml : "");
}

lk_status lk_logger_log_hyperparams_kv(lk_logger *lg, const char *const *keys, const char *const *values, int n) {
    LK_TRY(check_open(lg, "log_hyperparams"));
    if (n < 0 || (n > 0 && (!keys || !values)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "log_hyperparams: %d pairs with NULL keys or values", n);
    size_t len = 4;
    for (int i = 0; i < n; i++) {
        if (!keys[i] || !values[i])
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "log_hyperparams: pair %d has a NULL key or value", i);
        len += strlen(keys[i]) + strlen(values[i]) + 3;
    }
    char *text = lk_malloc(len);
    if (!text) return lk_last_status();
    size_t at = 0;
    if (n == 0) at += (size_t)snprintf(text, len, "{}\n");
    for (int i = 0; i < n; i++) at += (size_t)snprintf(text + at, len - at, "%s: %s\n", keys[i], values[i]);
    lk_status st = lg->vt->log_hyperparams(lg, text);
    lk_free(text);
    return st;
}

lk_status lk_logger_log_metrics(lk_logger *lg, int64_t step, const char *const *names, const double *values, int n) {
    LK_TRY(check_open(lg, "log_metrics"));
    if (n < 0 || (n > 0 && (!names || !values)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "log_metrics: %d metrics with NULL names or values", n);
    for (int i = 0; i < n; i++) {
        if (!names[i] || !names[i][0])
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "log_metrics: metric %d at step %lld has an empty name", i,
                            (long long)step);
        for (const char *c = names[i]; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) /* one CSV line per row, one TensorBoard tag per line */
                return lk_error(LK_STATUS_INVALID_ARGUMENT,
                                "log_metrics: metric name '%s' contains a control character (byte %d)", names[i],
                                (int)(c - names[i]));
    }
    return lg->vt->log_metrics(lg, step, names, values, n);
}

lk_status lk_logger_flush(lk_logger *lg) {
    LK_TRY(check_open(lg, "flush"));
    return lg->vt->flush ? lg->vt->flush(lg) : LK_STATUS_OK;
}

lk_status lk_logger_finalize(lk_logger *lg, const char *status) {
    LK_TRY(check_open(lg, "finalize"));
    lk_status st = lg->vt->finalize(lg, status ? status : "success");
    lg->finalized = 1;
    return st;
}

const char *lk_logger_log_dir(const lk_logger *lg) { return lg ? lg->log_dir : ""; }
int lk_logger_version(const lk_logger *lg) { return lg ? lg->version : -1; }

void lk_logger_free(lk_logger *lg) {
    if (lg) lg->vt->destroy(lg);
}

/* ------------------------------------------------------------------------
 * The fan-out list
 * ---------------------------------------------------------------------- */

typedef struct {
    lk_logger base;
    lk_logger **child;
    int n, cap;
} logger_list;

/* Keeps the first failure (its message prefixed with the child's kind) and
 * goes on with the other children, so one broken logger loses no data in
 * the others. */
static void keep_first(lk_status *first, char *msg, size_t size, lk_status st, const lk_logger *c) {
    if (st == LK_STATUS_OK || *first != LK_STATUS_OK) return;
    *first = st;
    snprintf(msg, size, "%s logger: %s", c->vt->kind, lk_last_error());
}

#define LIST_FANOUT(call)                                                   \
    logger_list *l = (logger_list *)lg;                                     \
    lk_status first = LK_STATUS_OK;                                         \
    char msg[1024] = "";                                                    \
    for (int i = 0; i < l->n; i++) {                                        \
        lk_logger *c = l->child[i];                                         \
        keep_first(&first, msg, sizeof msg, (call), c);                     \
    }                                                                       \
    return first ? lk_error(first, "%s", msg) : LK_STATUS_OK

static lk_status list_hparams(lk_logger *lg, const char *yaml) { LIST_FANOUT(lk_logger_log_hyperparams(c, yaml)); }
static lk_status list_metrics(lk_logger *lg, int64_t step, const char *const *names, const double *values, int n) {
    LIST_FANOUT(lk_logger_log_metrics(c, step, names, values, n));
}
static lk_status list_flush(lk_logger *lg) { LIST_FANOUT(lk_logger_flush(c)); }
static lk_status list_finalize(lk_logger *lg, const char *status) {
    LIST_FANOUT(c->finalized ? LK_STATUS_OK : lk_logger_finalize(c, status));
}
static void list_destroy(lk_logger *lg) {
    logger_list *l = (logger_list *)lg;
    for (int i = 0; i < l->n; i++) lk_logger_free(l->child[i]);
    lk_free(l->child);
    lk_free(l);
}

static const lk_logger_vtable list_vt = {"list", list_hparams, list_metrics, list_flush, list_finalize, list_destroy};

lk_status lk_logger_list_create(lk_logger **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_logger_list_create: out is NULL");
    *out = NULL;
    logger_list *l = lk_calloc(1, sizeof *l);
    if (!l) return lk_last_status();
    l->base.vt = &list_vt;
    l->base.version = -1;
    *out = &l->base;
    return LK_STATUS_OK;
}

lk_status lk_logger_list_add(lk_logger *list, lk_logger *child) {
    if (!list || list->vt != &list_vt) {
        lk_logger_free(child);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_logger_list_add: not a logger list");
    }
    if (!child) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_logger_list_add: child logger is NULL");
    logger_list *l = (logger_list *)list;
    if (l->n == l->cap && lk_vec_reserve(l->child, l->cap, l->n + 1, 4)) {
        lk_logger_free(child);
        return lk_last_status();
    }
    l->child[l->n++] = child;
    if (!list->log_dir[0] && child->log_dir[0]) {
        snprintf(list->log_dir, sizeof list->log_dir, "%s", child->log_dir);
        list->version = child->version;
    }
    return LK_STATUS_OK;
}

int lk_logger_list_count(const lk_logger *list) {
    return list && list->vt == &list_vt ? ((const logger_list *)list)->n : 0;
}

/* ------------------------------------------------------------------------
 * Files and directories
 * ---------------------------------------------------------------------- */

static int is_version_name(const char *s, long *v);

int lk__out_remove_stale_tmp(const char *root) {
    int n = lk_file_remove_stale_tmp(root);
    DIR *d = opendir(root);
    if (!d) return n;
    struct dirent *e;
    char sub[LK_LOG_DIR_MAX + 300];
    while ((e = readdir(d))) {
        long v;
        if (!is_version_name(e->d_name, &v)) continue;
        if (snprintf(sub, sizeof sub, "%s/%s", root, e->d_name) >= (int)sizeof sub - 16) continue;
        n += lk_file_remove_stale_tmp(sub);
        strcat(sub, "/checkpoints");
        n += lk_file_remove_stale_tmp(sub);
    }
    closedir(d);
    return n;
}

/* Appends all of `data` or nothing: a failed write is truncated back. */
static lk_status append_all(const char *path, const void *data, size_t len) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return lk_error(LK_STATUS_IO, "cannot open %s for appending: %s", path, strerror(errno));
    struct stat sb;
    lk_status st = LK_STATUS_OK;
    if (fstat(fd, &sb) != 0) st = lk_error(LK_STATUS_IO, "cannot stat %s: %s", path, strerror(errno));
    if (!st) {
        /* No fsync: appends are frequent and a power cut losing the last
         * rows is acceptable; a torn row is not, hence the truncate. */
        st = lk_file_write_all(fd, path, data, len);
        if (st && ftruncate(fd, sb.st_size) != 0) { /* the message already says what failed */ }
    }
    close(fd);
    return st;
}

static int is_version_name(const char *s, long *v) {
    if (strncmp(s, "version_", 8) != 0 || !s[8]) return 0;
    long x = 0;
    for (const char *p = s + 8; *p; p++) {
        if (*p < '0' || *p > '9' || x > 100000000) return 0;
        x = x * 10 + (*p - '0');
    }
    *v = x;
    return 1;
}

lk_status lk_log_dir_resolve(const char *root, const char *name, int version, char *out, size_t size,
                             int *out_version) {
    if (!out || size == 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_log_dir_resolve: no output buffer");
    out[0] = 0;
    if (!root || !root[0]) root = ".";
    if (!name) name = "lightning_logs";
    if (strchr(name, '/'))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "logger name '%s': expected a single directory name", name);
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/') rl--; /* "runs/" gives runs/lightning_logs, not runs//... */
    char parent[LK_LOG_DIR_MAX];
    if (snprintf(parent, sizeof parent, "%.*s%s%s", (int)rl, root, name[0] && root[rl - 1] != '/' ? "/" : "",
                 name) >= (int)sizeof parent)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "log directory too long: %.64s...", root);
    LK_TRY(lk_file_mkdirs(parent));
    int v = version;
    if (version < 0) {
        DIR *d = opendir(parent);
        if (!d) return lk_error(LK_STATUS_IO, "cannot list %s: %s", parent, strerror(errno));
        long max = -1;
        struct dirent *e;
        while ((e = readdir(d))) {
            long k;
            if (!is_version_name(e->d_name, &k) || k <= max) continue;
            /* Lightning counts directories only */
            char sub[LK_LOG_DIR_MAX + 300];
            struct stat sb;
            snprintf(sub, sizeof sub, "%s/%s", parent, e->d_name);
            if (stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode)) max = k;
        }
        closedir(d);
        v = (int)(max + 1);
    }
    for (int tries = 0;; tries++) {
        if (snprintf(out, size, "%s/version_%d", parent, v) >= (int)size) {
            out[0] = 0;
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "log directory does not fit in %zu bytes: %s/version_%d",
                            size, parent, v);
        }
        if (mkdir(out, 0777) == 0) break;
        if (errno != EEXIST) return lk_error(LK_STATUS_IO, "cannot create directory %s: %s", out, strerror(errno));
        if (version >= 0) { /* an explicit version may be reused, as in Lightning */
            struct stat sb;
            if (stat(out, &sb) != 0 || !S_ISDIR(sb.st_mode))
                return lk_error(LK_STATUS_IO, "log directory %s exists and is not a directory", out);
            break;
        }
        if (tries > 1000) return lk_error(LK_STATUS_IO, "cannot claim a free version directory under %s", parent);
        v++; /* another run claimed it between the listing and mkdir */
    }
    if (out_version) *out_version = v;
    return LK_STATUS_OK;
}

/* ------------------------------------------------------------------------
 * Growable text buffer
 * ---------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_reserve(sbuf *b, size_t more) {
    if (!b->oom && lk_vec_reserve(b->p, b->cap, b->len + more + 1, 1024)) b->oom = 1;
}

static void sb_put(sbuf *b, const char *s, size_t n) {
    sb_reserve(b, n);
    if (b->oom) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* The fewest significant digits that read back as the same double, like
 * Python's repr (which Lightning's csv module uses); integral values are
 * written without exponent, "nan"/"inf"/"-inf" as Python writes them. */
static void format_number(char *buf, size_t size, double v) {
    if (isnan(v)) {
        snprintf(buf, size, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, size, v < 0 ? "-inf" : "inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, size, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* RFC 4180 quoting, only where needed (Python's QUOTE_MINIMAL). */
static void sb_put_csv_field(sbuf *b, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        sb_puts(b, s);
        return;
    }
    sb_put(b, "\"", 1);
    for (const char *p = s; *p; p++) {
        if (*p == '"') sb_put(b, "\"\"", 2);
        else sb_put(b, p, 1);
    }
    sb_put(b, "\"", 1);
}

/* ------------------------------------------------------------------------
 * CSVLogger
 * ---------------------------------------------------------------------- */

typedef struct {
    int col;
    double v;
} csv_cell;

typedef struct {
    int64_t step;
    int first, n; /* cells[first .. first+n) */
} csv_row;

typedef struct {
    lk_logger base;
    char metrics_path[LK_LOG_DIR_MAX + 16];
    char hparams_path[LK_LOG_DIR_MAX + 16];
    char **cols; /* column names, in the order first seen; cols[0] is "step" */
    int ncols, cap_cols;
    int header_cols; /* columns in the file's header; 0: no file written yet */
    csv_row *rows;
    int nrows, cap_rows;
    csv_cell *cells;
    int ncells, cap_cells;
    int flush_every;
    int hparams_written;
} csv_logger;

static int find_col(const csv_logger *c, const char *name) {
    for (int i = 0; i < c->ncols; i++)
        if (!strcmp(c->cols[i], name)) return i;
    return -1;
}

static lk_status add_col(csv_logger *c, const char *name, int *idx) {
    if (c->ncols == c->cap_cols) LK_TRY(lk_vec_reserve(c->cols, c->cap_cols, c->ncols + 1, 16));
    char *s = lk_strdup(name);
    if (!s) return lk_last_status();
    c->cols[c->ncols] = s;
    *idx = c->ncols++;
    return LK_STATUS_OK;
}

/* Column indices in header order: byte order of the names, which is the
 * code-point order Python's sort gives Lightning. Insertion sort: a few
 * dozen columns, and no global context for qsort. */
static void sort_cols(const csv_logger *c, int *order) {
    for (int i = 0; i < c->ncols; i++) {
        int x = order[i] = i, j = i;
        while (j > 0 && strcmp(c->cols[order[j - 1]], c->cols[x]) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = x;
    }
}

/* Splits one CSV line into at most `max` fields in place (quotes honoured). */
static int split_csv(char *line, char **field, int max) {
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == max) return n + 1;
        char *w = p, *start = p;
        if (*p == '"') {
            p++;
            for (;;) {
                if (!*p) break;
                if (*p == '"' && p[1] == '"') *w++ = '"', p += 2;
                else if (*p == '"') { p++; break; }
                else *w++ = *p++;
            }
            while (*p && *p != ',') p++;
        } else {
            while (*p && *p != ',') *w++ = *p++;
        }
        char sep = *p;
        *w = 0;
        field[n++] = start;
        if (sep != ',') return n;
        p++;
    }
}

/* Appends the file's existing data rows, re-ordered into `order`, to `out`. */
static lk_status copy_old_rows(csv_logger *c, const int *order, sbuf *out) {
    FILE *f = fopen(c->metrics_path, "r");
    if (!f) return lk_error(LK_STATUS_IO, "cannot reopen %s to add columns: %s", c->metrics_path, strerror(errno));
    lk_status st = LK_STATUS_OK;
    char *line = NULL, **field = NULL;
    int *pos = NULL; /* old field index -> new position */
    size_t lcap = 0;
    ssize_t len;
    int nold = 0;
    int maxf = c->ncols + 1;
    field = lk_malloc((size_t)maxf * sizeof *field);
    pos = lk_malloc((size_t)maxf * sizeof *pos);
    const char **cell = lk_malloc((size_t)c->ncols * sizeof *cell);
    if (!field || !pos || !cell) {
        st = lk_last_status();
        goto done;
    }
    for (long lineno = 1; (len = getline(&line, &lcap, f)) >= 0; lineno++) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        int nf = split_csv(line, field, maxf);
        if (lineno == 1) {
            if (nf > c->header_cols || nf > c->ncols) {
                st = lk_error(LK_STATUS_IO, "%s:1: header has %d columns, expected %d (was the file edited?)",
                              c->metrics_path, nf, c->header_cols);
                goto done;
            }
            nold = nf;
            for (int i = 0; i < nf; i++) {
                int col = find_col(c, field[i]), k = 0;
                if (col < 0) {
                    st = lk_error(LK_STATUS_IO, "%s:1: unknown column '%s' (was the file edited?)", c->metrics_path,
                                  field[i]);
                    goto done;
                }
                while (order[k] != col) k++;
                pos[i] = k;
            }
            continue;
        }
        if (len == 0) continue;
        if (nf != nold) {
            st = lk_error(LK_STATUS_IO, "%s:%ld: %d fields, expected %d (was the file edited?)", c->metrics_path,
                          lineno, nf, nold);
            goto done;
        }
        for (int k = 0; k < c->ncols; k++) cell[k] = "";
        for (int i = 0; i < nf; i++) cell[pos[i]] = field[i];
        for (int k = 0; k < c->ncols; k++) {
            if (k) sb_put(out, ",", 1);
            sb_puts(out, cell[k]);
        }
        sb_put(out, "\n", 1);
    }
    if (ferror(f)) st = lk_error(LK_STATUS_IO, "cannot read %s: %s", c->metrics_path, strerror(errno));
done:
    free(line); /* getline's buffer comes from the C library */
    lk_free(field);
    lk_free(pos);
    lk_free((void *)cell);
    fclose(f);
    return st;
}

static lk_status csv_save(csv_logger *c) {
    int rewrite = c->header_cols != c->ncols;
    if (!c->nrows && !rewrite) return LK_STATUS_OK;
    if (!c->nrows && !c->header_cols) return LK_STATUS_OK; /* nothing logged yet: no file, as in Lightning */
    lk_status st = LK_STATUS_OK;
    sbuf out = {0};
    int *order = lk_malloc((size_t)c->ncols * sizeof *order);
    int *at = lk_malloc((size_t)c->ncols * sizeof *at); /* column -> position in order */
    double *val = lk_malloc((size_t)c->ncols * sizeof *val);
    unsigned char *has = lk_malloc((size_t)c->ncols);
    if (!order || !at || !val || !has) {
        st = lk_last_status();
        goto done;
    }
    sort_cols(c, order);
    for (int k = 0; k < c->ncols; k++) at[order[k]] = k;
    if (rewrite) {
        for (int k = 0; k < c->ncols; k++) {
            if (k) sb_put(&out, ",", 1);
            sb_put_csv_field(&out, c->cols[order[k]]);
        }
        sb_put(&out, "\n", 1);
        if (c->header_cols) {
            st = copy_old_rows(c, order, &out);
            if (st) goto done;
        }
    }
    for (int r = 0; r < c->nrows; r++) {
        const csv_row *row = &c->rows[r];
        memset(has, 0, (size_t)c->ncols);
        has[at[0]] = 1;
        val[at[0]] = (double)row->step;
        for (int i = 0; i < row->n; i++) {
            const csv_cell *cl = &c->cells[row->first + i];
            has[at[cl->col]] = 1;
            val[at[cl->col]] = cl->v;
        }
        for (int k = 0; k < c->ncols; k++) {
            if (k) sb_put(&out, ",", 1);
            if (!has[k]) continue;
            char num[40];
            if (order[k] == 0) snprintf(num, sizeof num, "%lld", (long long)row->step);
            else format_number(num, sizeof num, val[k]);
            sb_puts(&out, num);
        }
        sb_put(&out, "\n", 1);
    }
    if (out.oom) {
        st = lk_last_status();
        goto done;
    }
    st = rewrite ? lk_file_write_atomic(c->metrics_path, out.p, out.len) : append_all(c->metrics_path, out.p, out.len);
    if (!st) {
        c->header_cols = c->ncols;
        c->nrows = 0;
        c->ncells = 0;
    }
done:
    lk_free(out.p);
    lk_free(order);
    lk_free(at);
    lk_free(val);
    lk_free(has);
    return st;
}

static lk_status csv_hparams(lk_logger *lg, const char *yaml) {
    csv_logger *c = (csv_logger *)lg;
    size_t n = strlen(yaml);
    const char *text = n ? yaml : "{}\n";
    if (!n) n = 3;
    lk_status st;
    if (text[n - 1] == '\n') {
        st = lk_file_write_atomic(c->hparams_path, text, n);
    } else {
        char *t = lk_malloc(n + 1);
        if (!t) return lk_last_status();
        memcpy(t, text, n);
        t[n] = '\n';
        st = lk_file_write_atomic(c->hparams_path, t, n + 1);
        lk_free(t);
    }
    if (!st) c->hparams_written = 1;
    return st;
}

static lk_status csv_metrics(lk_logger *lg, int64_t step, const char *const *names, const double *values, int n) {
    csv_logger *c = (csv_logger *)lg;
    if (c->nrows == c->cap_rows) LK_TRY(lk_vec_reserve(c->rows, c->cap_rows, c->nrows + 1, 64));
    if (c->ncells + n > c->cap_cells) LK_TRY(lk_vec_reserve(c->cells, c->cap_cells, (size_t)(c->ncells + n), 256));
    csv_row *row = &c->rows[c->nrows];
    row->step = step;
    row->first = c->ncells;
    row->n = 0;
    for (int i = 0; i < n; i++) {
        int col = find_col(c, names[i]);
        if (col == 0) continue; /* "step" is the step argument, as in Lightning */
        if (col < 0) LK_TRY(add_col(c, names[i], &col));
        int j = 0; /* a name given twice in one call: the last value wins */
        while (j < row->n && c->cells[row->first + j].col != col) j++;
        c->cells[row->first + j] = (csv_cell){col, values[i]};
        if (j == row->n) row->n++;
    }
    c->ncells += row->n;
    c->nrows++;
    if (c->nrows >= c->flush_every) return csv_save(c);
    return LK_STATUS_OK;
}

static lk_status csv_flush(lk_logger *lg) { return csv_save((csv_logger *)lg); }

static lk_status csv_finalize(lk_logger *lg, const char *status) {
    csv_logger *c = (csv_logger *)lg;
    lk_status st = csv_save(c);
    if (!c->hparams_written) {
        lk_status st2 = csv_hparams(lg, "");
        if (!st) st = st2;
    }
    return st;
}

static void csv_destroy(lk_logger *lg) {
    csv_logger *c = (csv_logger *)lg;
    for (int i = 0; i < c->ncols; i++) lk_free(c->cols[i]);
    lk_free(c->cols);
    lk_free(c->rows);
    lk_free(c->cells);
    lk_free(c);
}

static const lk_logger_vtable csv_vt = {"csv", csv_hparams, csv_metrics, csv_flush, csv_finalize, csv_destroy};

static lk_status csv_create(const char *dir, int version, lk_logger **out) {
    csv_logger *c = lk_calloc(1, sizeof *c);
    if (!c) return lk_last_status();
    c->base.vt = &csv_vt;
    c->base.version = version;
    c->flush_every = 10; /* rows, i.e. 10 × log_every_n_steps steps: appends are cheap */
    snprintf(c->base.log_dir, sizeof c->base.log_dir, "%s", dir);
    snprintf(c->metrics_path, sizeof c->metrics_path, "%s/metrics.csv", dir);
    snprintf(c->hparams_path, sizeof c->hparams_path, "%s/hparams.yaml", dir);
    int idx;
    lk_status st = add_col(c, "step", &idx);
    if (st) {
        csv_destroy(&c->base);
        return st;
    }
    if (access(c->metrics_path, F_OK) == 0)
        lk_warn0("%s exists: it will be replaced when the new metrics are saved", c->metrics_path);
    *out = &c->base;
    return LK_STATUS_OK;
}

lk_status lk_csv_logger_create(const char *root, const char *name, int version, lk_logger **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_csv_logger_create: out is NULL");
    *out = NULL;
    char dir[LK_LOG_DIR_MAX];
    int v;
    LK_TRY(lk_log_dir_resolve(root, name, version, dir, sizeof dir, &v));
    return csv_create(dir, v, out);
}

lk_status lk_csv_logger_create_in(const char *dir, lk_logger **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_csv_logger_create_in: out is NULL");
    *out = NULL;
    if (!dir || !dir[0]) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_csv_logger_create_in: empty directory");
    if (strlen(dir) >= LK_LOG_DIR_MAX)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "log directory too long: %.64s...", dir);
    LK_TRY(lk_file_mkdirs(dir));
    return csv_create(dir, -1, out);
}

void lk_csv_logger_set_flush_every(lk_logger *csv, int rows) {
    if (csv && csv->vt == &csv_vt) ((csv_logger *)csv)->flush_every = rows > 0 ? rows : 1;
}

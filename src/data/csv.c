/* Numeric CSV files as (features, label) arrays, and the CSV dataset. The
 * whole file is read once and parsed in two passes (count, then convert),
 * so the arrays are allocated exactly once. Every bad cell is reported with
 * file, line, column (and its header name) and the text found; nothing is
 * silently turned into NaN or zero. Quoting is accepted around a cell but
 * delimiters inside quotes are not (numeric data has none). */
#include "data/data_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

lk_csv_config lk_csv_config_default(void) {
    lk_csv_config c = {',', -1, -1, NULL, LK_I64, 0};
    return c;
}

typedef struct {
    const char *p; /* cell text, unquoted, trimmed */
    size_t n;
} cell;

/* Splits one line (without its newline) into at most `max` cells; returns
 * the count (which may exceed max: the caller reports it). */
static int split_line(const char *s, size_t len, char delim, cell *cells, int max) {
    int count = 0;
    size_t i = 0;
    for (;;) {
        size_t start = i;
        while (i < len && s[i] != delim) i++;
        size_t a = start, b = i;
        while (a < b && isspace((unsigned char)s[a])) a++;
        while (b > a && isspace((unsigned char)s[b - 1])) b--;
        if (b - a >= 2 && s[a] == '"' && s[b - 1] == '"') a++, b--;
        if (count < max) cells[count] = (cell){s + a, b - a};
        count++;
        if (i >= len) break;
        i++;
    }
    return count;
}

static bool parse_double(cell c, double *v) {
    char buf[64];
    if (c.n == 0 || c.n >= sizeof buf) return false;
    memcpy(buf, c.p, c.n);
    buf[c.n] = 0;
    char *end;
    errno = 0;
    *v = strtod(buf, &end);
    return *end == 0 && errno != ERANGE;
}

typedef struct {
    const char *s;
    size_t len;
    size_t line_no;
} line_t;

/* Next non-empty line at *pos; false at the end. */
static bool next_line(const char *buf, size_t size, size_t *pos, size_t *line_no, line_t *out) {
    while (*pos < size) {
        size_t a = *pos, b = a;
        while (b < size && buf[b] != '\n') b++;
        *pos = b < size ? b + 1 : b;
        (*line_no)++;
        size_t e = b;
        if (e > a && buf[e - 1] == '\r') e--;
        size_t t = a;
        while (t < e && isspace((unsigned char)buf[t])) t++;
        if (t == e) continue; /* blank */
        *out = (line_t){buf + a, e - a, *line_no};
        return true;
    }
    return false;
}

static lk_status read_file(const char *path, char **buf, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return lk_error(LK_STATUS_IO, "cannot open %s: %s", path, strerror(errno));
    lk_status st = LK_STATUS_OK;
    long n = -1;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        st = lk_error(LK_STATUS_IO, "%s: cannot determine the size (not a regular file?)", path);
    *buf = NULL;
    if (!st && !(*buf = lk_malloc((size_t)n + 1))) st = LK_STATUS_OUT_OF_MEMORY;
    if (!st) st = lk__read_exact(f, path, *buf, (size_t)n, 0);
    fclose(f);
    if (st) {
        lk_free(*buf);
        *buf = NULL;
        return st;
    }
    (*buf)[n] = 0;
    *size = (size_t)n;
    return LK_STATUS_OK;
}

#define CSV_MAX_COLS 65536

lk_status lk_csv_read(const char *path, const lk_csv_config *cfg_in, lk_array *features, lk_array *labels) {
    lk_csv_config cfg = cfg_in ? *cfg_in : lk_csv_config_default();
    memset(features, 0, sizeof *features);
    if (labels) memset(labels, 0, sizeof *labels);
    bool want_label = cfg.label_column != LK_CSV_NO_LABEL || cfg.label_name;
    if (want_label && !labels)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: a label column is configured but no labels array given",
                        path);
    if (want_label && cfg.label_dtype != LK_I64 && cfg.label_dtype != LK_I32 && cfg.label_dtype != LK_F32)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: label dtype %d, expected i64, i32 or f32", path,
                        (int)cfg.label_dtype);
    char *buf = NULL;
    size_t size = 0, pos = 0, line_no = 0;
    LK_TRY(read_file(path, &buf, &size));
    cell *cells = lk_malloc(CSV_MAX_COLS * sizeof *cells);
    cell *hcells = lk_malloc(CSV_MAX_COLS * sizeof *hcells);
    lk_status st = (cells && hcells) ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    line_t first = {0}, ln;
    int ncols = 0;
    bool has_header = false;
    if (!st && !next_line(buf, size, &pos, &line_no, &first))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: the file has no data lines", path);
    if (!st) {
        ncols = split_line(first.s, first.len, cfg.delimiter, hcells, CSV_MAX_COLS);
        if (ncols > CSV_MAX_COLS)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: line %zu has %d columns, at most %d supported", path,
                          first.line_no, ncols, CSV_MAX_COLS);
    }
    if (!st) {
        if (cfg.header >= 0) has_header = cfg.header == 1;
        else {
            double v;
            for (int c = 0; c < ncols && !has_header; c++) has_header = !parse_double(hcells[c], &v);
        }
    }
    /* Which column is the label. */
    int label_col = -1;
    if (!st && cfg.label_name) {
        if (!has_header)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: label_name '%s' given but the file has no header line",
                          path, cfg.label_name);
        for (int c = 0; !st && c < ncols; c++)
            if (hcells[c].n == strlen(cfg.label_name) && !memcmp(hcells[c].p, cfg.label_name, hcells[c].n)) label_col = c;
        if (!st && label_col < 0) {
            char names[512] = "";
            for (int c = 0, k = 0; c < ncols && k < (int)sizeof names - 40; c++)
                k += snprintf(names + k, sizeof names - (size_t)k, "%s'%.*s'", c ? ", " : "", (int)hcells[c].n,
                              hcells[c].p);
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: no column named '%s'; the header has %s", path,
                          cfg.label_name, names);
        }
    } else if (!st && want_label) {
        label_col = cfg.label_column < 0 ? ncols + cfg.label_column : cfg.label_column;
        if (label_col < 0 || label_col >= ncols)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: label_column %d but the lines have %d columns", path,
                          cfg.label_column, ncols);
    }
    int nfeat = ncols - (label_col >= 0 ? 1 : 0);
    if (!st && nfeat < 1)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: no feature columns (%d columns, one of them the label)",
                      path, ncols);
    /* Pass 1: count rows and check widths. */
    int64_t rows = 0;
    size_t data_start = has_header ? pos : 0, data_line0 = has_header ? line_no : 0;
    if (!st) {
        size_t p = data_start, l = data_line0;
        while (next_line(buf, size, &p, &l, &ln)) {
            int k = split_line(ln.s, ln.len, cfg.delimiter, cells, CSV_MAX_COLS);
            if (k != ncols) {
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: line %zu has %d columns, expected %d (as on line %zu)",
                              path, ln.line_no, k, ncols, first.line_no);
                break;
            }
            rows++;
        }
    }
    if (!st && rows == 0) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "csv %s: a header but no data lines", path);
    if (!st) st = lk_array_alloc(features, LK_F32, 2, (int64_t[]){rows, nfeat});
    if (!st && label_col >= 0) st = lk_array_alloc(labels, cfg.label_dtype, 1, (int64_t[]){rows});
    /* Pass 2: convert. */
    if (!st) {
        size_t p = data_start, l = data_line0;
        float *x = features->data;
        for (int64_t r = 0; !st && next_line(buf, size, &p, &l, &ln); r++) {
            split_line(ln.s, ln.len, cfg.delimiter, cells, CSV_MAX_COLS);
            for (int c = 0, j = 0; c < ncols; c++) {
                double v;
                if (!parse_double(cells[c], &v)) {
                    char hn[80] = "";
                    if (has_header) snprintf(hn, sizeof hn, " ('%.*s')", (int)hcells[c].n, hcells[c].p);
                    st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                                  "csv %s: line %zu, column %d%s: '%.*s' is not a number", path, ln.line_no, c + 1, hn,
                                  (int)(cells[c].n > 40 ? 40 : cells[c].n), cells[c].p);
                    break;
                }
                /* NaN and inf (strtod reads "nan", "inf") and values beyond
                 * f32 would make the loss nan: refused with the cell */
                bool f32_cell = c != label_col || cfg.label_dtype == LK_F32;
                if (!isfinite(v) || (f32_cell && !isfinite((float)v))) {
                    char hn[80] = "";
                    if (has_header) snprintf(hn, sizeof hn, " ('%.*s')", (int)hcells[c].n, hcells[c].p);
                    st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                                  "csv %s: line %zu (data row %lld), column %d%s: '%.*s' is %s; NaN and inf inputs make "
                                  "the loss nan",
                                  path, ln.line_no, (long long)r, c + 1, hn, (int)(cells[c].n > 40 ? 40 : cells[c].n),
                                  cells[c].p, isfinite(v) ? "beyond f32's range (+-3.4e38)" : "not a finite number");
                    break;
                }
                if (c != label_col) {
                    x[r * nfeat + j++] = (float)v;
                    continue;
                }
                if (cfg.label_dtype == LK_F32) {
                    ((float *)labels->data)[r] = (float)v;
                } else if (v != floor(v) || fabs(v) > 9.0e15 || (cfg.label_dtype == LK_I32 && fabs(v) > 2147483647.0)) {
                    st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                                  "csv %s: line %zu, column %d: label '%.*s' is not an integer class (set label_dtype "
                                  "f32 for regression)",
                                  path, ln.line_no, c + 1, (int)cells[c].n, cells[c].p);
                    break;
                } else if (cfg.label_dtype == LK_I64) {
                    ((int64_t *)labels->data)[r] = (int64_t)v;
                } else {
                    ((int32_t *)labels->data)[r] = (int32_t)v;
                }
            }
        }
    }
    lk_free(cells);
    lk_free(hcells);
    lk_free(buf);
    if (st) {
        lk_array_release(features);
        if (labels) lk_array_release(labels);
    }
    return st;
}

lk_status lk_dataset_csv_create(const char *path, const lk_csv_config *cfg, lk_dataset **out) {
    *out = NULL;
    lk_array a[2];
    memset(a, 0, sizeof a);
    LK_TRY(lk_csv_read(path, cfg, &a[0], &a[1]));
    lk_status st = a[1].data && cfg ? lk__labels_check(&a[1], cfg->num_classes, path) : LK_STATUS_OK;
    if (!st) st = lk_dataset_from_arrays(a[1].data ? 2 : 1, a, NULL, false, out);
    lk_array_release(&a[0]);
    lk_array_release(&a[1]);
    return st;
}

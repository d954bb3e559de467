/* NumPy's .npy format (versions 1.0-3.0): the magic "\x93NUMPY", a version,
 * a little-endian header length, then a Python dict literal giving descr,
 * fortran_order and shape, then the raw data. The header is parsed by hand:
 * it is a small, fixed grammar and a JSON/Python parser would accept more
 * than NumPy writes. Also the npy-backed dataset. */
#include "data/data_internal.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Finds 'key' in the header dict and returns the text after its colon. */
static const char *dict_value(const char *h, const char *key) {
    char q1[40], q2[40];
    snprintf(q1, sizeof q1, "'%s'", key);
    snprintf(q2, sizeof q2, "\"%s\"", key);
    const char *p = strstr(h, q1);
    if (!p) p = strstr(h, q2);
    if (!p) return NULL;
    p += strlen(q1);
    while (isspace((unsigned char)*p)) p++;
    if (*p != ':') return NULL;
    p++;
    while (isspace((unsigned char)*p)) p++;
    return p;
}

typedef struct {
    size_t fsize;  /* element size in the file */
    lk_dtype dt;   /* dtype in memory */
    char kind;     /* f, i, u, b */
    bool big;      /* big-endian in the file */
} npy_type;

static bool parse_descr(const char *d, npy_type *t) {
    char order = d[0];
    if (order != '<' && order != '>' && order != '|' && order != '=') return false;
    t->big = order == '>';
    t->kind = d[1];
    if (!t->kind || !strchr("fiub", t->kind)) return false; /* also stops at the terminator */
    char *end;
    long sz = strtol(d + 2, &end, 10);
    if (end == d + 2 || (*end != '\'' && *end != '"')) return false;
    t->fsize = (size_t)sz;
    switch (t->kind) {
    case 'f':
        if (sz == 4) t->dt = LK_F32;
        else if (sz == 8) t->dt = LK_F64;
        else if (sz == 2) t->dt = LK_F16;
        else return false;
        return true;
    case 'i':
        if (sz == 1 || sz == 2 || sz == 4) t->dt = LK_I32;
        else if (sz == 8) t->dt = LK_I64;
        else return false;
        return true;
    case 'u':
        if (sz == 1) t->dt = LK_U8;
        else if (sz == 2) t->dt = LK_I32;
        else if (sz == 4) t->dt = LK_I64;
        else return false;
        return true;
    case 'b':
        if (sz != 1) return false;
        t->dt = LK_U8;
        return true;
    default: return false;
    }
}

static lk_status parse_header(const char *path, const char *h, npy_type *t, int *ndim, int64_t *shape) {
    const char *d = dict_value(h, "descr");
    if (!d || (*d != '\'' && *d != '"'))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: npy header has no simple 'descr' (structured arrays are not supported): %s", path, h);
    if (!parse_descr(d + 1, t)) {
        int n = 0;
        while (d[1 + n] && d[1 + n] != '\'' && d[1 + n] != '"' && n < 16) n++;
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: npy dtype '%.*s' is not supported; expected one of f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 b1",
                        path, n, d + 1);
    }
    const char *fo = dict_value(h, "fortran_order");
    if (!fo || (strncmp(fo, "False", 5) && strncmp(fo, "True", 4)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: npy header lacks fortran_order: %s", path, h);
    if (!strncmp(fo, "True", 4))
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: array is in Fortran order; save it with np.save(path, np.ascontiguousarray(a))", path);
    const char *s = dict_value(h, "shape");
    if (!s || *s != '(') return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: npy header lacks a shape tuple: %s", path, h);
    s++;
    *ndim = 0;
    for (;;) {
        while (isspace((unsigned char)*s)) s++;
        if (*s == ')') break;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || errno)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: bad npy shape near '%.20s'", path, s);
        if (*ndim == LK_MAX_DIMS)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: npy array has more than %d dims", path, LK_MAX_DIMS);
        shape[(*ndim)++] = v;
        s = end;
        while (isspace((unsigned char)*s)) s++;
        if (*s == ',') s++;
        else if (*s != ')') return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: bad npy shape near '%.20s'", path, s);
    }
    return LK_STATUS_OK;
}

static void convert(const uint8_t *src, void *dst, size_t n, const npy_type *t) {
    uint8_t tmp[8];
    for (size_t i = 0; i < n; i++) {
        const uint8_t *e = src + i * t->fsize;
        if (t->big && t->fsize > 1) {
            for (size_t b = 0; b < t->fsize; b++) tmp[b] = e[t->fsize - 1 - b];
            e = tmp;
        }
        size_t es = lk_data_dtype_size(t->dt);
        if (es == t->fsize) {
            memcpy((uint8_t *)dst + i * es, e, es);
            continue;
        }
        /* widening conversions (the host is little-endian) */
        if (t->dt == LK_I32) {
            int32_t v = t->kind == 'i' ? (t->fsize == 1 ? (int8_t)e[0] : (int16_t)(e[0] | (e[1] << 8)))
                                       : (int32_t)(uint16_t)(e[0] | (e[1] << 8));
            ((int32_t *)dst)[i] = v;
        } else { /* u4 -> i64 */
            uint32_t u;
            memcpy(&u, e, 4);
            ((int64_t *)dst)[i] = u;
        }
    }
}

/* check_finite: each block is checked for NaN/inf right after it is read,
 * while it is in the cache (a separate pass over a 400 MB array cost a
 * third of the read). */
static lk_status npy_read(const char *path, lk_array *out, bool check_finite) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return lk_error(LK_STATUS_IO, "cannot open %s: %s", path, strerror(errno));
    uint8_t pre[12];
    char *header = NULL;
    lk_status st = lk__read_exact(f, path, pre, 10, 0);
    if (!st && memcmp(pre, "\x93NUMPY", 6))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: not an npy file (no \\x93NUMPY magic)", path);
    if (!st && (pre[6] < 1 || pre[6] > 3))
        st = lk_error(LK_STATUS_UNSUPPORTED, "%s: npy version %d.%d, expected 1.0, 2.0 or 3.0", path, pre[6], pre[7]);
    size_t hlen = 0, off = 10;
    if (!st) {
        if (pre[6] == 1) hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
        else {
            st = lk__read_exact(f, path, pre + 10, 2, 10);
            hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
            off = 12;
        }
    }
    if (!st && hlen > (1u << 24)) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: npy header length %zu is implausible", path, hlen);
    if (!st && !(header = lk_malloc(hlen + 1))) st = LK_STATUS_OUT_OF_MEMORY;
    if (!st) st = lk__read_exact(f, path, header, hlen, off);
    npy_type t = {0};
    int ndim = 0;
    int64_t shape[LK_MAX_DIMS];
    if (!st) {
        header[hlen] = 0;
        st = parse_header(path, header, &t, &ndim, shape);
    }
    off += hlen;
    int64_t n = 0;
    char sb[160];
    if (!st) {
        n = lk__shape_numel(ndim, shape);
        if (n < 0 || (uint64_t)n > SIZE_MAX / 8)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: npy shape %s is too large", path,
                          lk_data_shape_str(ndim, shape, sb, sizeof sb));
    }
    if (!st) {
        struct stat s;
        size_t need = (size_t)n * t.fsize;
        if (fstat(fileno(f), &s) == 0 && (uint64_t)s.st_size < off + need)
            st = lk_error(LK_STATUS_IO, "%s: truncated: shape %s needs %zu bytes of data, the file has %lld", path,
                          lk_data_shape_str(ndim, shape, sb, sizeof sb), need, (long long)s.st_size - (long long)off);
    }
    if (!st) st = lk__array_alloc_uninit(out, t.dt, ndim, shape);
    if (!st) {
        size_t es = lk_data_dtype_size(t.dt);
        bool check = check_finite && t.kind == 'f';
        if (t.fsize == es && !t.big) {
            /* in blocks of 1 MiB when checking; one read otherwise */
            size_t per = check ? (1u << 20) / es : (size_t)n;
            for (size_t at = 0; !st && at < (size_t)n; at += per) {
                size_t k = (size_t)n - at < per ? (size_t)n - at : per;
                st = lk__read_exact(f, path, (uint8_t *)out->data + at * es, k * es, off + at * es);
                int64_t bad = !st && check ? lk__first_nonfinite((uint8_t *)out->data + at * es, (int64_t)k, t.dt) : -1;
                if (bad >= 0) st = lk__nonfinite_error(out, (int64_t)at + bad, path);
            }
        } else {
            uint8_t buf[1 << 14];
            size_t per = sizeof buf / t.fsize;
            for (size_t at = 0; !st && at < (size_t)n; at += per) {
                size_t k = (size_t)n - at < per ? (size_t)n - at : per;
                st = lk__read_exact(f, path, buf, k * t.fsize, off + at * t.fsize);
                if (!st) convert(buf, (uint8_t *)out->data + at * es, k, &t);
                int64_t bad = !st && check ? lk__first_nonfinite((uint8_t *)out->data + at * es, (int64_t)k, t.dt) : -1;
                if (bad >= 0) st = lk__nonfinite_error(out, (int64_t)at + bad, path);
            }
        }
    }
    lk_free(header);
    fclose(f);
    if (st) lk_array_release(out);
    return st;
}

lk_status lk_npy_read(const char *path, lk_array *out) { return npy_read(path, out, false); }

static const char *npy_descr(lk_dtype dt) {
    switch (dt) {
    case LK_F32: return "<f4";
    case LK_F64: return "<f8";
    case LK_F16: return "<f2";
    case LK_I32: return "<i4";
    case LK_I64: return "<i8";
    case LK_U8: return "|u1";
    default: return NULL;
    }
}

static lk_status npy_write_body(const char *tmp, const void *ctx) {
    const lk_array *a = ctx;
    char dict[512];
    int k = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", npy_descr(a->dtype));
    /* Python's tuple syntax: "()", "(3,)", "(3, 4)". */
    for (int i = 0; i < a->ndim; i++)
        k += snprintf(dict + k, sizeof dict - (size_t)k, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (a->ndim == 1) dict[k++] = ',';
    k += snprintf(dict + k, sizeof dict - (size_t)k, "), }");
    /* Pad with spaces so the data starts on a 64-byte boundary, then '\n'. */
    size_t total = 10 + (size_t)k + 1;
    size_t pad = (64 - total % 64) % 64;
    uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    size_t hlen = (size_t)k + pad + 1;
    pre[8] = (uint8_t)hlen;
    pre[9] = (uint8_t)(hlen >> 8);
    FILE *f = fopen(tmp, "wb");
    if (!f) return lk_error(LK_STATUS_IO, "cannot create %s: %s", tmp, strerror(errno));
    lk_status st = LK_STATUS_OK;
    bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)k, f) == (size_t)k;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    size_t nb = lk_array_nbytes(a);
    ok = ok && fwrite(a->data, 1, nb, f) == nb;
    if (fclose(f) != 0) ok = false;
    if (!ok) st = lk_error(LK_STATUS_IO, "%s: write failed (disk full?): %s", tmp, strerror(errno));
    return st;
}

lk_status lk_npy_write(const char *path, const lk_array *a) {
    if (!npy_descr(a->dtype))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy write %s: dtype %d has no numpy equivalent (bf16?)", path,
                        (int)a->dtype);
    if (a->ndim < 0 || a->ndim > LK_MAX_DIMS || !a->data || lk_array_numel(a) < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy write %s: bad array (%d dims)", path, a->ndim);
    return lk__write_atomic(path, npy_write_body, a);
}

lk_status lk_dataset_npy_create(const char *x_path, const char *y_path, lk_dataset **out) {
    *out = NULL;
    lk_array a[2];
    memset(a, 0, sizeof a);
    int n = y_path ? 2 : 1;
    /* NaN/inf inputs and targets are refused here, once (the reader checks
     * each block as it reads it) */
    lk_status st = npy_read(x_path, &a[0], true);
    if (!st && y_path) st = npy_read(y_path, &a[1], true);
    if (!st && a[0].ndim < 1)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: a 0-d array is not a dataset; expected shape [N, ...]", x_path);
    if (!st && y_path && (a[1].ndim < 1 || a[1].shape[0] != a[0].shape[0])) {
        char s0[160], s1[160];
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "npy dataset: %s has shape %s but %s has shape %s; expected the "
                      "same number of samples",
                      x_path, lk_data_shape_str(a[0].ndim, a[0].shape, s0, sizeof s0), y_path,
                      lk_data_shape_str(a[1].ndim, a[1].shape, s1, sizeof s1));
    }
    if (!st) st = lk_dataset_from_arrays(n, a, NULL, false, out);
    lk_array_release(&a[0]);
    lk_array_release(&a[1]);
    return st;
}

/* A small, strict .npy reader and writer for tests (fixtures written by
 * NumPy, see tools/gen_op_fixtures.py). It owns nothing beyond the tensors
 * it returns.
 *
 * Supported: format versions 1.0, 2.0 and 3.0 (the header is the same
 * Python dict literal; 1.0 has a 16-bit header length, 2.0/3.0 a 32-bit one),
 * C order, dtypes '<f4', '<f8', '<i8', '<i4' and '|u1' (also '<u1'), up to
 * LK_MAX_DIMS dims. Anything else — a bad magic, an unknown version, a
 * Fortran-order array, a big-endian or other dtype, a malformed header, a
 * file shorter or longer than its header says — is an error that names the
 * file and what was expected. NumPy arrays are little-endian on disk; so is
 * every host lockstep targets, which the reader checks once.
 *
 *     lk_tensor *t;
 *     if (lk_npy_load("x.npy", &t)) fprintf(stderr, "%s\n", lk_last_error());
 *     ...
 *     lk_tensor_release(t);            // caller owns it
 *
 *     lk_npy_save("y.npy", t);         // any strides; written C order
 */
#ifndef LK_TEST_NPY_H
#define LK_TEST_NPY_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep.h"

/* Longest header accepted: NumPy's own readers cap it (max_header_size). */
#define LK_NPY_MAX_HEADER 10000

static const struct {
    const char *descr;
    lk_dtype dt;
} lk_npy_dtypes[] = {
    {"<f4", LK_F32}, {"<f8", LK_F64}, {"<i8", LK_I64}, {"<i4", LK_I32}, {"|u1", LK_U8}, {"<u1", LK_U8},
};

/* ---- header parsing: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } ---- */

typedef struct {
    const char *p, *end, *path, *start;
} lk_npy_cur;

static inline void lk_npy_ws(lk_npy_cur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static inline bool lk_npy_eat(lk_npy_cur *c, char ch) {
    lk_npy_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A Python string literal ('...' or "...", no escapes) into buf. */
static inline lk_status lk_npy_str(lk_npy_cur *c, char *buf, size_t n, const char *what) {
    lk_npy_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: expected a quoted %s at offset %d", c->path, what,
                        (int)(c->p - c->start));
    char q = *c->p++;
    size_t len = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || len + 1 >= n)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: unsupported or too long %s", c->path, what);
        buf[len++] = *c->p++;
    }
    if (c->p >= c->end) return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: unterminated %s", c->path, what);
    c->p++;
    buf[len] = 0;
    return LK_STATUS_OK;
}

/* A tuple of non-negative ints: (), (5,), (2, 3), (2, 3,). */
static inline lk_status lk_npy_shape(lk_npy_cur *c, int *ndim, int64_t *shape) {
    if (!lk_npy_eat(c, '('))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: 'shape' must be a tuple", c->path);
    *ndim = 0;
    for (;;) {
        if (lk_npy_eat(c, ')')) return LK_STATUS_OK;
        lk_npy_ws(c);
        if (c->p >= c->end || *c->p < '0' || *c->p > '9')
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: 'shape' holds a non-integer or negative dim",
                            c->path);
        int64_t v = 0;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            if (v > (INT64_MAX - 9) / 10)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: dim %d overflows", c->path, *ndim);
            v = v * 10 + (*c->p++ - '0');
        }
        if (c->p < c->end && *c->p == 'L') c->p++; /* Python 2 longs */
        if (*ndim == LK_MAX_DIMS)
            return lk_error(LK_STATUS_UNSUPPORTED, "npy %s: more than %d dims", c->path, LK_MAX_DIMS);
        shape[(*ndim)++] = v;
        if (lk_npy_eat(c, ',')) continue;
        if (lk_npy_eat(c, ')')) return LK_STATUS_OK;
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: expected ',' or ')' in 'shape'", c->path);
    }
}

static inline lk_status lk_npy_parse_header(const char *path, const char *h, size_t len, lk_dtype *dt, int *ndim,
                                     int64_t *shape) {
    lk_npy_cur c = {h, h + len, path, h};
    bool have_descr = false, have_order = false, have_shape = false;
    char key[32], val[32];
    if (!lk_npy_eat(&c, '{'))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header is not a dict literal", path);
    while (!lk_npy_eat(&c, '}')) {
        LK_TRY(lk_npy_str(&c, key, sizeof key, "key"));
        if (!lk_npy_eat(&c, ':'))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: expected ':' after '%s'", path, key);
        if (!strcmp(key, "descr")) {
            LK_TRY(lk_npy_str(&c, val, sizeof val, "descr"));
            size_t i, n = sizeof lk_npy_dtypes / sizeof lk_npy_dtypes[0];
            for (i = 0; i < n && strcmp(val, lk_npy_dtypes[i].descr); i++) {
            }
            if (i == n)
                return lk_error(LK_STATUS_UNSUPPORTED,
                                "npy %s: dtype '%s' unsupported (expected '<f4', '<f8', '<i8', '<i4' or '|u1')", path,
                                val);
            *dt = lk_npy_dtypes[i].dt;
            have_descr = true;
        } else if (!strcmp(key, "fortran_order")) {
            lk_npy_ws(&c);
            if ((size_t)(c.end - c.p) >= 5 && !memcmp(c.p, "False", 5)) c.p += 5;
            else if ((size_t)(c.end - c.p) >= 4 && !memcmp(c.p, "True", 4))
                return lk_error(LK_STATUS_UNSUPPORTED, "npy %s: Fortran-order arrays unsupported (expected C order)",
                                path);
            else
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: 'fortran_order' must be True or False",
                                path);
            have_order = true;
        } else if (!strcmp(key, "shape")) {
            LK_TRY(lk_npy_shape(&c, ndim, shape));
            have_shape = true;
        } else {
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: unknown key '%s'", path, key);
        }
        if (!lk_npy_eat(&c, ',')) {
            if (lk_npy_eat(&c, '}')) break;
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: expected ',' or '}' after '%s'", path, key);
        }
    }
    if (!have_descr || !have_order || !have_shape)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header lacks '%s'", path,
                        !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    lk_npy_ws(&c);
    if (c.p != c.end)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header: trailing characters after the dict", path);
    return LK_STATUS_OK;
}

static inline bool lk_npy_host_is_le(void) {
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

/* ---- reading ------------------------------------------------------------------------- */

/* Loads `path` into a new contiguous CPU tensor the caller owns (*out = NULL on error). */
static inline lk_status lk_npy_load(const char *path, lk_tensor **out) {
    *out = NULL;
    if (!lk_npy_host_is_le())
        return lk_error(LK_STATUS_UNSUPPORTED, "npy %s: big-endian hosts are not supported", path);
    FILE *f = fopen(path, "rb");
    if (!f) return lk_error(LK_STATUS_IO, "npy %s: cannot open: %s", path, strerror(errno));
    lk_status st = LK_STATUS_OK;
    char *hdr = NULL;
    lk_tensor *t = NULL;
    unsigned char pre[12];
    size_t got = fread(pre, 1, 10, f);
    if (got < 10 || memcmp(pre, "\x93NUMPY", 6)) {
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: not a .npy file (bad magic; expected \\x93NUMPY)", path);
        goto done;
    }
    int major = pre[6], minor = pre[7];
    size_t hlen, pre_len;
    if (major == 1) {
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
        pre_len = 10;
    } else if (major == 2 || major == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: truncated before the header", path);
            goto done;
        }
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
        pre_len = 12;
    } else {
        st = lk_error(LK_STATUS_UNSUPPORTED, "npy %s: format version %d.%d unsupported (expected 1.0, 2.0 or 3.0)",
                      path, major, minor);
        goto done;
    }
    if (hlen == 0 || hlen > LK_NPY_MAX_HEADER) {
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: header length %zu out of range (1..%d)", path, hlen,
                      LK_NPY_MAX_HEADER);
        goto done;
    }
    hdr = lk_malloc(hlen + 1);
    if (!hdr) {
        st = lk_error(LK_STATUS_OUT_OF_MEMORY, "npy %s: header of %zu bytes", path, hlen);
        goto done;
    }
    if (fread(hdr, 1, hlen, f) != hlen) {
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: truncated header (%zu bytes expected)", path, hlen);
        goto done;
    }
    hdr[hlen] = 0;
    lk_dtype dt = LK_F32;
    int ndim = 0;
    int64_t shape[LK_MAX_DIMS];
    if ((st = lk_npy_parse_header(path, hdr, hlen, &dt, &ndim, shape))) goto done;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] && numel > INT64_MAX / 8 / shape[i]) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "npy %s: shape too large", path);
            goto done;
        }
        numel *= shape[i];
    }
    size_t nbytes = (size_t)numel * lk_dtype_size(dt);
    /* The data must be exactly what the header promises: compare with the file size. */
    long here = ftell(f);
    if (here < 0 || fseek(f, 0, SEEK_END) != 0) {
        st = lk_error(LK_STATUS_IO, "npy %s: cannot seek: %s", path, strerror(errno));
        goto done;
    }
    long size = ftell(f);
    if (size < 0 || fseek(f, here, SEEK_SET) != 0) {
        st = lk_error(LK_STATUS_IO, "npy %s: cannot seek: %s", path, strerror(errno));
        goto done;
    }
    if ((size_t)here != pre_len + hlen || (size_t)(size - here) != nbytes) {
        st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                      "npy %s: %ld data bytes, but the header's %s shape with %lld elements needs %zu", path,
                      size - here, lk_dtype_name(dt), (long long)numel, nbytes);
        goto done;
    }
    t = lk_tensor_empty(dt, ndim, shape);
    if (!t) {
        st = lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
        goto done;
    }
    if (nbytes && fread(t->data, 1, nbytes, f) != nbytes) {
        st = lk_error(LK_STATUS_IO, "npy %s: read of %zu data bytes failed", path, nbytes);
        goto done;
    }
done:
    fclose(f);
    lk_free(hdr);
    if (st) lk_tensor_release(t);
    else *out = t;
    return st;
}

/* ---- writing ------------------------------------------------------------------------- */

/* Writes t (CPU; f32, f64, i64, i32 or u8; any strides) as a version 1.0 .npy. */
static inline lk_status lk_npy_save(const char *path, const lk_tensor *t) {
    const char *descr = NULL;
    for (size_t i = 0; i < sizeof lk_npy_dtypes / sizeof lk_npy_dtypes[0] && !descr; i++)
        if (lk_npy_dtypes[i].dt == t->dtype) descr = lk_npy_dtypes[i].descr;
    if (!descr)
        return lk_error(LK_STATUS_UNSUPPORTED, "npy %s: cannot write dtype %s (f32, f64, i64, i32, u8 only)", path,
                        lk_dtype_name(t->dtype));
    if (t->device.kind != LK_CPU)
        return lk_error(LK_STATUS_UNSUPPORTED, "npy %s: tensor is not on the CPU", path);
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < t->ndim; i++)
        n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%lld%s", (long long)t->shape[i],
                      t->ndim == 1 ? "," : i + 1 < t->ndim ? ", " : "");
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "), }");
    /* Pad with spaces and a final newline so the data starts 64-byte aligned. */
    int total = (10 + n + 1 + 63) / 64 * 64;
    while (10 + n + 1 < total) hdr[n++] = ' ';
    hdr[n++] = '\n';
    lk_tensor *c = lk_tensor_clone(t); /* contiguous, C order */
    if (!c) return lk_last_status();
    FILE *f = fopen(path, "wb");
    if (!f) {
        lk_tensor_release(c);
        return lk_error(LK_STATUS_IO, "npy %s: cannot create: %s", path, strerror(errno));
    }
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
    size_t nbytes = lk_tensor_nbytes(c);
    bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n &&
              (nbytes == 0 || fwrite(c->data, 1, nbytes, f) == nbytes);
    ok = (fclose(f) == 0) && ok;
    lk_tensor_release(c);
    if (!ok) return lk_error(LK_STATUS_IO, "npy %s: write failed: %s", path, strerror(errno));
    return LK_STATUS_OK;
}

#endif

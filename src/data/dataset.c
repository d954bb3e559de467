/* The dataset handle and the datasets that need no file: arrays in memory
 * and the compositions (subset, range, random split, field selection).
 * Also the small array helpers every reader shares. A dataset is immutable
 * after creation, which is what lets loader workers read it concurrently
 * without locks; only its reference count changes. */
#include "backend/backend_impl.h"
#include "data/data_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- arrays ---------------------------------------------------------------- */

size_t lk_data_dtype_size(lk_dtype dt) { return lk_dtype_size(dt); }

static const char *dtype_name(lk_dtype dt) {
    switch (dt) {
#define LK__DT_NAME(name, str, size, ctype) \
    case LK_##name: return str;
        LK_DTYPE_LIST(LK__DT_NAME)
#undef LK__DT_NAME
    default: return "?";
    }
}

int64_t lk__shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

int64_t lk_array_numel(const lk_array *a) { return lk__shape_numel(a->ndim, a->shape); }

size_t lk_array_nbytes(const lk_array *a) { return (size_t)lk_array_numel(a) * lk_data_dtype_size(a->dtype); }

char *lk_data_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t k = 0;
    if (n == 0) return buf;
    buf[0] = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

lk_status lk_array_alloc(lk_array *a, lk_dtype dt, int ndim, const int64_t *shape) {
    LK_TRY(lk__array_alloc_uninit(a, dt, ndim, shape));
    memset(a->data, 0, lk_array_nbytes(a));
    return LK_STATUS_OK;
}

/* Readers fill every byte, and leaving the pages untouched means a header
 * that claims far more data than the file holds costs address space, not
 * memory, until the read fails. */
lk_status lk__array_alloc_uninit(lk_array *a, lk_dtype dt, int ndim, const int64_t *shape) {
    a->data = NULL;
    if (ndim < 0 || ndim > LK_MAX_DIMS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "array: %d dims, expected 0..%d", ndim, LK_MAX_DIMS);
    size_t es = lk_data_dtype_size(dt);
    if (!es) return lk_error(LK_STATUS_INVALID_ARGUMENT, "array: unknown dtype %d", (int)dt);
    int64_t n = lk__shape_numel(ndim, shape);
    char sb[160];
    if (n < 0 || (uint64_t)n > SIZE_MAX / es)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "array: shape %s of %s is too large or negative",
                        lk_data_shape_str(ndim, shape, sb, sizeof sb), dtype_name(dt));
    size_t bytes = (size_t)n * es;
    void *p = lk_aligned_alloc(LK_ALIGN, bytes ? bytes : 1);
    if (!p)
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "array: out of memory allocating %zu bytes for %s %s", bytes,
                        dtype_name(dt), lk_data_shape_str(ndim, shape, sb, sizeof sb));
    a->dtype = dt;
    a->ndim = ndim;
    for (int i = 0; i < LK_MAX_DIMS; i++) a->shape[i] = i < ndim ? shape[i] : 0;
    a->data = p;
    return LK_STATUS_OK;
}

void lk_array_release(lk_array *a) {
    if (!a || !a->data) return;
    lk_aligned_free(a->data);
    a->data = NULL;
}

lk_status lk__read_exact(FILE *f, const char *path, void *buf, size_t n, size_t offset) {
    size_t got = fread(buf, 1, n, f);
    if (got != n) {
        if (ferror(f))
            return lk_error(LK_STATUS_IO, "%s: read error at byte %zu: %s", path, offset + got, strerror(errno));
        return lk_error(LK_STATUS_IO, "%s: truncated: expected %zu bytes at offset %zu, file has only %zu more",
                        path, n, offset, got);
    }
    return LK_STATUS_OK;
}

lk_status lk__write_atomic(const char *path, lk__write_fn fn, const void *ctx) {
    size_t n = strlen(path) + 32;
    char *tmp = lk_malloc(n);
    if (!tmp) return lk_error(LK_STATUS_OUT_OF_MEMORY, "writing %s: out of memory", path);
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    lk_status st = fn(tmp, ctx);
    if (!st) {
        int fd = open(tmp, O_RDONLY);
        if (fd < 0 || fsync(fd) != 0)
            st = lk_error(LK_STATUS_IO, "%s: cannot sync: %s", tmp, strerror(errno));
        if (fd >= 0) close(fd);
    }
    if (!st && rename(tmp, path) != 0)
        st = lk_error(LK_STATUS_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st) unlink(tmp);
    lk_free(tmp);
    return st;
}

/* ---- the handle --------------------------------------------------------------- */

void lk__field_init(lk_field *f, const char *name, int pos, lk_dtype dt, int ndim, const int64_t *shape) {
    memset(f, 0, sizeof *f);
    if (name) snprintf(f->name, sizeof f->name, "%s", name);
    else if (pos < 2) snprintf(f->name, sizeof f->name, "%s", pos == 0 ? "x" : "y");
    else snprintf(f->name, sizeof f->name, "f%d", pos);
    f->dtype = dt;
    f->ndim = ndim;
    for (int i = 0; i < ndim; i++) f->shape[i] = shape[i];
}

size_t lk_field_nbytes(const lk_field *f) {
    return (size_t)lk__shape_numel(f->ndim, f->shape) * lk_data_dtype_size(f->dtype);
}

lk_status lk_dataset_create(const lk_dataset_vtable *vt, void *ctx, int64_t len, int nfields,
                            const lk_field *fields, size_t scratch_bytes, lk_dataset **out) {
    *out = NULL;
    lk_status st = LK_STATUS_OK;
    if (!vt || !vt->get) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "dataset: vtable without a get function");
    else if (len < 0) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "dataset '%s': length %lld, expected >= 0", vt->kind ? vt->kind : "?", (long long)len);
    else if (nfields < 1 || nfields > LK_DATA_MAX_FIELDS)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "dataset '%s': %d fields, expected 1..%d", vt->kind ? vt->kind : "?",
                      nfields, LK_DATA_MAX_FIELDS);
    for (int f = 0; !st && f < nfields; f++) {
        const lk_field *fd = &fields[f];
        if (!lk_data_dtype_size(fd->dtype) || fd->ndim < 0 || fd->ndim > LK_MAX_DIMS ||
            lk__shape_numel(fd->ndim, fd->shape) < 0)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "dataset '%s': field %d ('%s') has a bad dtype or shape",
                          vt->kind ? vt->kind : "?", f, fd->name);
    }
    lk_dataset *ds = NULL;
    if (!st) {
        ds = lk_calloc(1, sizeof *ds);
        if (!ds) st = LK_STATUS_OUT_OF_MEMORY;
    }
    if (st) {
        if (vt && vt->free) vt->free(ctx);
        return st;
    }
    ds->vt = vt;
    ds->ctx = ctx;
    ds->len = len;
    ds->nfields = nfields;
    memcpy(ds->fields, fields, (size_t)nfields * sizeof *fields);
    ds->scratch_bytes = scratch_bytes;
    atomic_init(&ds->refcount, 1);
    *out = ds;
    return LK_STATUS_OK;
}

lk_dataset *lk_dataset_retain(lk_dataset *ds) {
    if (ds) atomic_fetch_add(&ds->refcount, 1);
    return ds;
}

void lk_dataset_free(lk_dataset *ds) {
    if (!ds) return;
    if (atomic_fetch_sub(&ds->refcount, 1) != 1) return;
    if (ds->vt->free) ds->vt->free(ds->ctx);
    lk_free(ds);
}

int64_t lk_dataset_len(const lk_dataset *ds) { return ds->len; }
int lk_dataset_nfields(const lk_dataset *ds) { return ds->nfields; }
const lk_field *lk_dataset_field(const lk_dataset *ds, int f) {
    return (f >= 0 && f < ds->nfields) ? &ds->fields[f] : NULL;
}
int lk_dataset_field_index(const lk_dataset *ds, const char *name) {
    for (int f = 0; f < ds->nfields; f++)
        if (!strcmp(ds->fields[f].name, name)) return f;
    return -1;
}
const char *lk_dataset_kind(const lk_dataset *ds) { return ds->vt->kind ? ds->vt->kind : "custom"; }
size_t lk_dataset_scratch_bytes(const lk_dataset *ds) { return ds->scratch_bytes; }

lk_status lk_dataset_get(const lk_dataset *ds, int64_t index, uint64_t epoch, void *const *out) {
    if (index < 0 || index >= ds->len)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "dataset '%s': sample %lld out of range [0, %lld)",
                        lk_dataset_kind(ds), (long long)index, (long long)ds->len);
    void *scratch = NULL;
    if (ds->scratch_bytes) {
        scratch = lk_aligned_alloc(LK_ALIGN, ds->scratch_bytes);
        if (!scratch) return lk_error(LK_STATUS_OUT_OF_MEMORY, "dataset '%s': out of memory for %zu bytes of scratch",
                                      lk_dataset_kind(ds), ds->scratch_bytes);
    }
    lk_status st = ds->vt->get(ds->ctx, index, epoch, scratch, out);
    lk_aligned_free(scratch);
    return st;
}

/* ---- arrays as a dataset ------------------------------------------------------ */

typedef struct {
    int nfields;
    void *data[LK_DATA_MAX_FIELDS];
    size_t row_bytes[LK_DATA_MAX_FIELDS];
    bool owned;
} arrays_ctx;

static lk_status arrays_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    const arrays_ctx *c = ctx;
    for (int f = 0; f < c->nfields; f++)
        memcpy(out[f], (const char *)c->data[f] + (size_t)index * c->row_bytes[f], c->row_bytes[f]);
    return LK_STATUS_OK;
}

static void arrays_prefetch(void *ctx, int64_t index) {
    const arrays_ctx *c = ctx;
    for (int f = 0; f < c->nfields; f++) {
        const char *row = (const char *)c->data[f] + (size_t)index * c->row_bytes[f];
        for (size_t at = 0; at < c->row_bytes[f]; at += 64) __builtin_prefetch(row + at);
    }
}

static void arrays_free(void *ctx) {
    arrays_ctx *c = ctx;
    if (c->owned)
        for (int f = 0; f < c->nfields; f++) lk_aligned_free(c->data[f]);
    lk_free(c);
}

static const lk_dataset_vtable arrays_vt = {"arrays", arrays_get, arrays_free, arrays_prefetch};

/* Every exponent bit set (inf or NaN) in an IEEE value whose exponent field
 * is M: (x & M) + (M's lowest bit) carries into the top bit exactly then.
 * OR-ing that over a block is branch-free, so it vectorises; the top bit of
 * the OR says whether the block holds one. */
#define FINITE_BLOCK 4096
#define FIRST_BAD(T, M)                                                                 \
    do {                                                                                \
        const T *p = data;                                                              \
        const T lo = (T)((M) & (T)(~(M) + 1)), top = (T)((T)1 << (sizeof(T) * 8 - 1)); \
        for (int64_t b = 0; b < n; b += FINITE_BLOCK) {                                 \
            int64_t e = n - b < FINITE_BLOCK ? n : b + FINITE_BLOCK;                    \
            T acc = 0;                                                                  \
            for (int64_t i = b; i < e; i++) acc |= (T)((T)(p[i] & (M)) + lo);           \
            if (!(acc & top)) continue;                                                 \
            for (int64_t i = b; i < e; i++)                                             \
                if ((T)((T)(p[i] & (M)) + lo) & top) return i;                          \
        }                                                                               \
        return -1;                                                                      \
    } while (0)

int64_t lk__first_nonfinite(const void *data, int64_t n, lk_dtype dt) {
    switch (dt) {
    case LK_F32: FIRST_BAD(uint32_t, 0x7f800000u);
    case LK_F64: FIRST_BAD(uint64_t, 0x7ff0000000000000ull);
    case LK_F16: FIRST_BAD(uint16_t, 0x7c00u);
    case LK_BF16: FIRST_BAD(uint16_t, 0x7f80u);
    default: return -1;
    }
}

lk_status lk__finite_check(const lk_array *a, const char *path) {
    if (!a || !a->data) return LK_STATUS_OK;
    return lk__nonfinite_error(a, lk__first_nonfinite(a->data, lk_array_numel(a), a->dtype), path);
}

lk_status lk__nonfinite_error(const lk_array *a, int64_t at, const char *path) {
    if (at < 0) return LK_STATUS_OK;
    /* nan or +-inf: a set mantissa is a NaN; the sign bit is the top one */
    size_t es = lk_data_dtype_size(a->dtype);
    uint64_t bits = 0;
    memcpy(&bits, (const unsigned char *)a->data + (size_t)at * es, es); /* little-endian host */
    uint64_t mant = es == 8 ? bits & 0xfffffffffffffull : es == 4 ? bits & 0x7fffffu
                    : a->dtype == LK_F16 ? bits & 0x3ffu : bits & 0x7fu;
    bool neg = bits >> (es * 8 - 1);
    const char *what = mant ? "nan" : neg ? "-inf" : "inf";
    char idx[200], sb[160];
    size_t k = 0;
    int64_t rest = at;
    int64_t stride[LK_MAX_DIMS], s = 1;
    for (int d = a->ndim - 1; d >= 0; d--) stride[d] = s, s *= a->shape[d];
    k += (size_t)snprintf(idx, sizeof idx, "[");
    for (int d = 0; d < a->ndim && k < sizeof idx; d++) {
        k += (size_t)snprintf(idx + k, sizeof idx - k, "%s%lld", d ? ", " : "", (long long)(rest / stride[d]));
        rest %= stride[d];
    }
    if (k < sizeof idx) snprintf(idx + k, sizeof idx - k, "]");
    return lk_error(LK_STATUS_INVALID_ARGUMENT,
                    "%s: element %lld (index %s in shape %s) is %s: a NaN or inf input makes the loss nan at the first "
                    "step that reads it; replace it (numpy.nan_to_num) or drop that sample",
                    path, (long long)at, idx, lk_data_shape_str(a->ndim, a->shape, sb, sizeof sb), what);
}

lk_status lk__labels_check(const lk_array *labels, int64_t num_classes, const char *path) {
    if (num_classes <= 0 || !labels || !labels->data) return LK_STATUS_OK;
    int64_t n = lk_array_numel(labels);
    for (int64_t i = 0; i < n; i++) {
        int64_t v;
        switch (labels->dtype) {
        case LK_U8: v = ((const uint8_t *)labels->data)[i]; break;
        case LK_I32: v = ((const int32_t *)labels->data)[i]; break;
        case LK_I64: v = ((const int64_t *)labels->data)[i]; break;
        default: return LK_STATUS_OK; /* floating targets are not class labels */
        }
        if (v < 0 || v >= num_classes)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: label %lld at sample %lld is outside [0, %lld) (num_classes %lld)",
                            path, (long long)v, (long long)i, (long long)num_classes, (long long)num_classes);
    }
    return LK_STATUS_OK;
}

lk_status lk_dataset_from_arrays(int nfields, lk_array *arrays, const char *const *names, bool borrow,
                                 lk_dataset **out) {
    *out = NULL;
    if (nfields < 1 || nfields > LK_DATA_MAX_FIELDS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "dataset from arrays: %d arrays, expected 1..%d", nfields,
                        LK_DATA_MAX_FIELDS);
    lk_field fields[LK_DATA_MAX_FIELDS];
    int64_t len = -1;
    char sb[160];
    for (int f = 0; f < nfields; f++) {
        const lk_array *a = &arrays[f];
        if (a->ndim < 1 || a->ndim > LK_MAX_DIMS || !a->data || !lk_data_dtype_size(a->dtype) || lk_array_numel(a) < 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "dataset from arrays: array %d has %d dims%s; expected 1..%d dims with data", f, a->ndim,
                            a->data ? "" : " and no data", LK_MAX_DIMS);
        if (len >= 0 && a->shape[0] != len)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "dataset from arrays: array %d has %lld samples (shape %s), array 0 has %lld", f,
                            (long long)a->shape[0], lk_data_shape_str(a->ndim, a->shape, sb, sizeof sb),
                            (long long)len);
        len = a->shape[0];
        lk__field_init(&fields[f], names ? names[f] : NULL, f, a->dtype, a->ndim - 1, a->shape + 1);
    }
    arrays_ctx *c = lk_calloc(1, sizeof *c);
    if (!c) return LK_STATUS_OUT_OF_MEMORY;
    c->nfields = nfields;
    for (int f = 0; f < nfields; f++) {
        c->data[f] = arrays[f].data;
        c->row_bytes[f] = lk_field_nbytes(&fields[f]);
    }
    c->owned = false; /* until the handle exists, the caller keeps the data */
    lk_status st = lk_dataset_create(&arrays_vt, c, len, nfields, fields, 0, out);
    if (st) return st;
    c->owned = !borrow;
    if (!borrow)
        for (int f = 0; f < nfields; f++) arrays[f].data = NULL;
    return LK_STATUS_OK;
}

/* Materialize cuts the rows across the compute-thread pool; each task keeps
 * its first failure (status and message: the last error is per thread). */
typedef struct {
    lk_dataset *src;
    int nf, width;
    int64_t n;
    char *base[LK_DATA_MAX_FIELDS];
    size_t row[LK_DATA_MAX_FIELDS];
    lk_status st[LK_MATERIALIZE_MAX_THREADS];
    char err[LK_MATERIALIZE_MAX_THREADS][256];
} copy_job;

static void copy_rows(void *ctx, int t) {
    copy_job *j = ctx;
    void *dst[LK_DATA_MAX_FIELDS];
    int64_t begin, end;
    lk__task_range(j->n, t, j->width, 1, &begin, &end);
    for (int64_t i = begin; i < end && !j->st[t]; i++) {
        for (int f = 0; f < j->nf; f++) dst[f] = j->base[f] + (size_t)i * j->row[f];
        j->st[t] = lk_dataset_get(j->src, i, 0, dst);
    }
    if (j->st[t]) snprintf(j->err[t], sizeof j->err[t], "%s", lk_last_error());
}

lk_status lk_dataset_materialize(lk_dataset *src, int threads, lk_dataset **out) {
    *out = NULL;
    lk_array arrays[LK_DATA_MAX_FIELDS];
    const char *names[LK_DATA_MAX_FIELDS];
    memset(arrays, 0, sizeof arrays);
    copy_job *j = lk_calloc(1, sizeof *j);
    if (!j) return LK_STATUS_OUT_OF_MEMORY;
    j->src = src;
    j->nf = lk_dataset_nfields(src);
    j->n = lk_dataset_len(src);
    int64_t most = j->n / 1024; /* not worth a thread below that many rows each */
    j->width = threads < 1 || most < 2 ? 1 : threads > most ? (int)most : threads;
    if (j->width > LK_MATERIALIZE_MAX_THREADS) j->width = LK_MATERIALIZE_MAX_THREADS;
    lk_status st = LK_STATUS_OK;
    for (int f = 0; f < j->nf && !st; f++) {
        const lk_field *fd = lk_dataset_field(src, f);
        int64_t shape[LK_MAX_DIMS + 1];
        shape[0] = j->n;
        for (int d = 0; d < fd->ndim; d++) shape[d + 1] = fd->shape[d];
        /* Uninitialised: every row is written below, and not zeroing first
         * halves the memory traffic of a large copy. */
        st = lk__array_alloc_uninit(&arrays[f], fd->dtype, fd->ndim + 1, shape);
        names[f] = fd->name;
        j->base[f] = arrays[f].data;
        j->row[f] = lk_field_nbytes(fd);
    }
    if (!st) lk__parallel_run(j->width, copy_rows, j);
    for (int t = 0; t < j->width && !st; t++)
        if (j->st[t]) st = lk_error(j->st[t], "%s", j->err[t]);
    if (!st) st = lk_dataset_from_arrays(j->nf, arrays, names, false, out);
    for (int f = 0; f < j->nf; f++) lk_array_release(&arrays[f]);
    lk_free(j);
    return st;
}

/* ---- subset and range ------------------------------------------------------------ */

typedef struct {
    lk_dataset *src;
    int64_t *indices; /* NULL for a range */
    int64_t start;
} subset_ctx;

static lk_status subset_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    const subset_ctx *c = ctx;
    int64_t i = c->indices ? c->indices[index] : c->start + index;
    return c->src->vt->get(c->src->ctx, i, epoch, scratch, out);
}

static void subset_prefetch(void *ctx, int64_t index) {
    const subset_ctx *c = ctx;
    lk__dataset_prefetch(c->src, c->indices ? c->indices[index] : c->start + index);
}

static void subset_free(void *ctx) {
    subset_ctx *c = ctx;
    lk_dataset_free(c->src);
    lk_free(c->indices);
    lk_free(c);
}

static const lk_dataset_vtable subset_vt = {"subset", subset_get, subset_free, subset_prefetch};

static lk_status make_subset(lk_dataset *src, int64_t *indices, int64_t start, int64_t n, lk_dataset **out) {
    subset_ctx *c = lk_calloc(1, sizeof *c);
    if (!c) {
        lk_free(indices);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    c->src = lk_dataset_retain(src);
    c->indices = indices;
    c->start = start;
    return lk_dataset_create(&subset_vt, c, n, src->nfields, src->fields, src->scratch_bytes, out);
}

lk_status lk_dataset_subset(lk_dataset *src, const int64_t *indices, int64_t n, lk_dataset **out) {
    *out = NULL;
    if (n < 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "subset: %lld indices, expected >= 0", (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (indices[i] < 0 || indices[i] >= src->len)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "subset of '%s': indices[%lld] = %lld is out of range [0, %lld)", lk_dataset_kind(src),
                            (long long)i, (long long)indices[i], (long long)src->len);
    int64_t *copy = lk_malloc((size_t)(n ? n : 1) * sizeof *copy);
    if (!copy) return LK_STATUS_OUT_OF_MEMORY;
    if (n) memcpy(copy, indices, (size_t)n * sizeof *copy);
    return make_subset(src, copy, 0, n, out);
}

lk_status lk_dataset_range(lk_dataset *src, int64_t start, int64_t end, lk_dataset **out) {
    *out = NULL;
    if (start < 0 || end < start || end > src->len)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "range of '%s': [%lld, %lld) is not within [0, %lld)",
                        lk_dataset_kind(src), (long long)start, (long long)end, (long long)src->len);
    return make_subset(src, NULL, start, end - start, out);
}

lk_status lk_dataset_random_split(lk_dataset *src, int nparts, const double *sizes, uint64_t seed,
                                  lk_dataset **outs) {
    if (nparts < 1) return lk_error(LK_STATUS_INVALID_ARGUMENT, "random split: %d parts, expected >= 1", nparts);
    for (int p = 0; p < nparts; p++) outs[p] = NULL;
    int64_t n = src->len, counts[64];
    if (nparts > 64) return lk_error(LK_STATUS_INVALID_ARGUMENT, "random split: %d parts, expected <= 64", nparts);
    double total = 0;
    bool whole = true, fractions = true;
    for (int p = 0; p < nparts; p++) {
        if (!(sizes[p] >= 0) || !isfinite(sizes[p]))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "random split: size %d is %g, expected >= 0", p, sizes[p]);
        total += sizes[p];
        whole = whole && sizes[p] == floor(sizes[p]);
        fractions = fractions && sizes[p] <= 1;
    }
    /* Whole numbers summing to len are counts (PyTorch's lengths);
     * otherwise fractions summing to 1. */
    if (whole && total == (double)n) {
        for (int p = 0; p < nparts; p++) counts[p] = (int64_t)sizes[p];
    } else if (fractions && fabs(total - 1.0) < 1e-9) {
        int64_t sum = 0;
        for (int p = 0; p < nparts; p++) sum += counts[p] = (int64_t)floor((double)n * sizes[p]);
        for (int p = 0; sum < n; p = (p + 1) % nparts, sum++) counts[p]++; /* PyTorch: round-robin from the first */
    } else {
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "random split of %lld samples: sizes sum to %g; expected counts summing to %lld or "
                        "fractions summing to 1",
                        (long long)n, total, (long long)n);
    }
    int64_t *perm = lk_malloc((size_t)(n ? n : 1) * sizeof *perm);
    if (!perm) return LK_STATUS_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    lk_rng r;
    lk_rng_init(&r, seed, LK_RNG_SHUFFLE, 0xFFFFFFFFu, 0xFFFFFFFFu); /* apart from every sampler epoch */
    lk_rng_shuffle_i64(&r, perm, n);
    int64_t at = 0;
    lk_status st = LK_STATUS_OK;
    for (int p = 0; p < nparts && !st; p++) {
        st = lk_dataset_subset(src, perm + at, counts[p], &outs[p]);
        at += counts[p];
    }
    lk_free(perm);
    if (st)
        for (int p = 0; p < nparts; p++) {
            lk_dataset_free(outs[p]);
            outs[p] = NULL;
        }
    return st;
}

/* ---- concatenation ----------------------------------------------------------------- */

typedef struct {
    int n;
    lk_dataset **srcs;
    int64_t *ends; /* ends[i]: one past the last index of source i */
} concat_ctx;

/* The source holding `index`, and the index within it. */
static const lk_dataset *concat_find(const concat_ctx *c, int64_t index, int64_t *local) {
    int lo = 0, hi = c->n - 1; /* first source whose end exceeds index */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (c->ends[mid] > index) hi = mid;
        else lo = mid + 1;
    }
    *local = index - (lo ? c->ends[lo - 1] : 0);
    return c->srcs[lo];
}

static void concat_prefetch(void *ctx, int64_t index) {
    int64_t i;
    const lk_dataset *s = concat_find(ctx, index, &i);
    lk__dataset_prefetch(s, i);
}

static lk_status concat_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    int64_t i;
    const lk_dataset *s = concat_find(ctx, index, &i);
    return s->vt->get(s->ctx, i, epoch, scratch, out);
}

static void concat_free(void *ctx) {
    concat_ctx *c = ctx;
    for (int i = 0; i < c->n; i++) lk_dataset_free(c->srcs[i]);
    lk_free(c->srcs);
    lk_free(c->ends);
    lk_free(c);
}

static const lk_dataset_vtable concat_vt = {"concat", concat_get, concat_free, concat_prefetch};

lk_status lk_dataset_concat(int n, lk_dataset *const *srcs, lk_dataset **out) {
    *out = NULL;
    if (n < 1) return lk_error(LK_STATUS_INVALID_ARGUMENT, "concat: %d datasets, expected >= 1", n);
    const lk_dataset *a = srcs[0];
    size_t scratch = 0;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const lk_dataset *b = srcs[i];
        bool same = b->nfields == a->nfields;
        for (int f = 0; same && f < a->nfields; f++) {
            const lk_field *x = &a->fields[f], *y = &b->fields[f];
            same = x->dtype == y->dtype && x->ndim == y->ndim &&
                   !memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof x->shape[0]);
        }
        if (!same) {
            char sa[160] = "", sb[160] = "";
            int f = 0;
            while (f < a->nfields && f < b->nfields && a->fields[f].dtype == b->fields[f].dtype &&
                   a->fields[f].ndim == b->fields[f].ndim &&
                   !memcmp(a->fields[f].shape, b->fields[f].shape, (size_t)a->fields[f].ndim * sizeof(int64_t)))
                f++;
            if (f < a->nfields && f < b->nfields) {
                lk_data_shape_str(a->fields[f].ndim, a->fields[f].shape, sa, sizeof sa);
                lk_data_shape_str(b->fields[f].ndim, b->fields[f].shape, sb, sizeof sb);
            }
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "concat: dataset %d ('%s', %d fields) does not match dataset 0 ('%s', %d fields) at field "
                            "%d: dtype %s %s vs %s %s",
                            i, lk_dataset_kind(b), b->nfields, lk_dataset_kind(a), a->nfields, f,
                            f < b->nfields ? dtype_name(b->fields[f].dtype) : "-", sb,
                            f < a->nfields ? dtype_name(a->fields[f].dtype) : "-", sa);
        }
        if (b->len > INT64_MAX - total) return lk_error(LK_STATUS_INVALID_ARGUMENT, "concat: total length overflows");
        total += b->len;
        if (b->scratch_bytes > scratch) scratch = b->scratch_bytes;
    }
    concat_ctx *c = lk_calloc(1, sizeof *c);
    if (!c) return LK_STATUS_OUT_OF_MEMORY;
    c->srcs = lk_calloc((size_t)n, sizeof *c->srcs);
    c->ends = lk_calloc((size_t)n, sizeof *c->ends);
    if (!c->srcs || !c->ends) {
        concat_free(c);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    c->n = n;
    for (int i = 0; i < n; i++) {
        c->srcs[i] = lk_dataset_retain(srcs[i]);
        c->ends[i] = (i ? c->ends[i - 1] : 0) + srcs[i]->len;
    }
    return lk_dataset_create(&concat_vt, c, total, a->nfields, a->fields, scratch, out);
}

/* ---- field selection ------------------------------------------------------------- */

typedef struct {
    lk_dataset *src;
    int nfields;
    int map[LK_DATA_MAX_FIELDS];
    int src_nfields;
    size_t src_bytes[LK_DATA_MAX_FIELDS];
    size_t src_scratch; /* the source's own scratch comes first */
} select_ctx;

/* Unselected or repeated source fields are read into scratch after the
 * source's own scratch: the source always writes every field. */
static lk_status select_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    const select_ctx *c = ctx;
    void *src_out[LK_DATA_MAX_FIELDS];
    char *spare = scratch ? (char *)scratch + c->src_scratch : NULL; /* NULL: every field is in use */
    int first_use[LK_DATA_MAX_FIELDS];
    for (int s = 0; s < c->src_nfields; s++) first_use[s] = -1;
    for (int i = 0; i < c->nfields; i++)
        if (first_use[c->map[i]] < 0) first_use[c->map[i]] = i;
    for (int s = 0; s < c->src_nfields; s++) {
        if (first_use[s] >= 0) src_out[s] = out[first_use[s]];
        else {
            src_out[s] = spare;
            spare += (c->src_bytes[s] + LK_ALIGN - 1) & ~(size_t)(LK_ALIGN - 1);
        }
    }
    LK_TRY(c->src->vt->get(c->src->ctx, index, epoch, scratch, src_out));
    for (int i = 0; i < c->nfields; i++)
        if (first_use[c->map[i]] != i) memcpy(out[i], src_out[c->map[i]], c->src_bytes[c->map[i]]);
    return LK_STATUS_OK;
}

static void select_prefetch(void *ctx, int64_t index) { lk__dataset_prefetch(((const select_ctx *)ctx)->src, index); }

static void select_free(void *ctx) {
    select_ctx *c = ctx;
    lk_dataset_free(c->src);
    lk_free(c);
}

static const lk_dataset_vtable select_vt = {"select", select_get, select_free, select_prefetch};

lk_status lk_dataset_select(lk_dataset *src, int nfields, const int *src_fields, const char *const *names,
                            lk_dataset **out) {
    *out = NULL;
    if (nfields < 1 || nfields > LK_DATA_MAX_FIELDS)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "select: %d fields, expected 1..%d", nfields, LK_DATA_MAX_FIELDS);
    lk_field fields[LK_DATA_MAX_FIELDS];
    bool used[LK_DATA_MAX_FIELDS] = {false};
    for (int i = 0; i < nfields; i++) {
        if (src_fields[i] < 0 || src_fields[i] >= src->nfields)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "select from '%s': field %d does not exist (it has %d)",
                            lk_dataset_kind(src), src_fields[i], src->nfields);
        fields[i] = src->fields[src_fields[i]];
        used[src_fields[i]] = true;
        if (names && names[i]) snprintf(fields[i].name, sizeof fields[i].name, "%s", names[i]);
    }
    select_ctx *c = lk_calloc(1, sizeof *c);
    if (!c) return LK_STATUS_OUT_OF_MEMORY;
    c->nfields = nfields;
    c->src_nfields = src->nfields;
    c->src_scratch = (src->scratch_bytes + LK_ALIGN - 1) & ~(size_t)(LK_ALIGN - 1);
    size_t scratch = c->src_scratch;
    for (int i = 0; i < nfields; i++) c->map[i] = src_fields[i];
    for (int s = 0; s < src->nfields; s++) {
        c->src_bytes[s] = lk_field_nbytes(&src->fields[s]);
        if (!used[s]) scratch += (c->src_bytes[s] + LK_ALIGN - 1) & ~(size_t)(LK_ALIGN - 1);
    }
    c->src = lk_dataset_retain(src);
    return lk_dataset_create(&select_vt, c, src->len, nfields, fields, scratch, out);
}

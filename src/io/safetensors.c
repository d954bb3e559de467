/* Safetensors I/O for checkpoints and weight exchange with PyTorch. The
 * writer streams tensors with large writes into "<path>.tmp.<pid>", fsyncs,
 * renames and fsyncs the directory, so a file under its final name is
 * always complete; a byte-count fault hook lets tests simulate short writes
 * and a full disk. The reader maps the file and validates every header
 * field against the file before handing out a single pointer, so corrupt
 * or hostile files produce an error naming the file and tensor, never a
 * crash. JSON goes through cJSON. */
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend_impl.h"
#include "tensor/tensor_impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (the format is little-endian)"
#endif

/* ---- dtypes ------------------------------------------------------------------ */

typedef struct {
    const char *name;
    size_t size;
    int dtype; /* lk_dtype or -1 */
} st_dtype;

/* Every dtype of the format (safetensors 0.4), so files holding types
 * lockstep cannot compute with can still be opened and listed. */
static const st_dtype st_dtypes[] = {
    {"F64", 8, LK_F64}, {"F32", 4, LK_F32},  {"F16", 2, LK_F16},  {"BF16", 2, LK_BF16},   {"I64", 8, LK_I64},
    {"I32", 4, LK_I32}, {"U8", 1, LK_U8},    {"I16", 2, -1},      {"I8", 1, -1},          {"U16", 2, -1},
    {"U32", 4, -1},     {"U64", 8, -1},      {"BOOL", 1, -1},     {"F8_E4M3", 1, -1},     {"F8_E5M2", 1, -1},
};
#define N_ST_DTYPES (int)(sizeof st_dtypes / sizeof st_dtypes[0])

const char *lk_safetensors_dtype_name(lk_dtype dt) {
    for (int i = 0; i < N_ST_DTYPES; i++)
        if (st_dtypes[i].dtype == (int)dt) return st_dtypes[i].name;
    return "?";
}

static const st_dtype *find_dtype(const char *name) {
    for (int i = 0; i < N_ST_DTYPES; i++)
        if (!strcmp(st_dtypes[i].name, name)) return &st_dtypes[i];
    return NULL;
}

static char *shape_text(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t k = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < size) snprintf(buf + k, size - k, "]");
    return buf;
}

/* ---- writing ------------------------------------------------------------------ */

static long long hook_limit = -1, hook_written;
static int hook_errno = ENOSPC;

void lk__safetensors_fail_after(long long nbytes, int err) {
    hook_limit = nbytes;
    hook_written = 0;
    hook_errno = err ? err : ENOSPC;
}

#define WRITE_BUF (8u << 20)   /* small tensors are gathered into one buffer */
#define WRITE_CHUNK (1u << 30) /* below Linux's 2 GiB per write() */

typedef struct {
    int fd;
    const char *path; /* the final name, for messages */
    unsigned char *buf;
    size_t blen;
    uint64_t written, total;
} writer;

/* write(2), or pwrite(2) at `at` when at >= 0, with the fault hook in front. */
static ssize_t raw_write(int fd, const void *p, size_t n, off_t at) {
    if (hook_limit >= 0) {
        long long left = hook_limit - hook_written;
        if (left <= 0) {
            errno = hook_errno;
            return -1;
        }
        if ((long long)n > left) n = (size_t)left;
    }
    ssize_t w = at >= 0 ? pwrite(fd, p, n, at) : write(fd, p, n);
    if (w > 0 && hook_limit >= 0) hook_written += w;
    return w;
}

/* Writes n bytes at the end (at < 0) or at offset `at`. */
static lk_status write_at(writer *w, const void *p, size_t n, off_t at) {
    const unsigned char *s = p;
    while (n) {
        ssize_t k = raw_write(w->fd, s, n < WRITE_CHUNK ? n : WRITE_CHUNK, at);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return lk_error(LK_STATUS_IO, "writing '%s': %s (after %llu of %llu bytes; the previous file is kept)", w->path,
                            k < 0 ? strerror(errno) : "write returned 0", (unsigned long long)w->written,
                            (unsigned long long)w->total);
        s += k;
        n -= (size_t)k;
        w->written += (uint64_t)k;
        if (at >= 0) at += k;
    }
    return LK_STATUS_OK;
}

static lk_status write_all(writer *w, const void *p, size_t n) { return write_at(w, p, n, -1); }

static lk_status flush_buf(writer *w) {
    lk_status st = write_all(w, w->buf, w->blen);
    w->blen = 0;
    return st;
}

static lk_status put(writer *w, const void *p, size_t n) {
    if (n >= WRITE_BUF / 2) { /* big: straight from the caller's memory */
        if (w->blen) LK_TRY(flush_buf(w));
        return write_all(w, p, n);
    }
    if (w->blen + n > WRITE_BUF) LK_TRY(flush_buf(w));
    memcpy(w->buf + w->blen, p, n);
    w->blen += n;
    return LK_STATUS_OK;
}

/* A big tensor is checksummed and written a slice at a time, so that
 * write(2) copies bytes the checksum has just brought into the cache
 * instead of reading the tensor from memory a second time. */
#define CRC_SLICE (256u << 10)

/* One tensor's bytes: small ones are gathered into the buffer, big ones go
 * straight from the tensor's memory; *crc gets their CRC-32C. */
static lk_status put_tensor(writer *w, const void *p, size_t n, uint32_t *crc) {
    const unsigned char *s = p;
    if (n < WRITE_BUF / 2) {
        *crc = lk__crc32c(0, s, n);
        return put(w, s, n);
    }
    if (w->blen) LK_TRY(flush_buf(w));
    uint32_t c = 0;
    for (size_t at = 0; at < n;) {
        size_t k = n - at < CRC_SLICE ? n - at : CRC_SLICE;
        c = lk__crc32c(c, s + at, k);
        LK_TRY(write_all(w, s + at, k));
        at += k;
    }
    *crc = c;
    return LK_STATUS_OK;
}

/* A resolved entry: what the header says and where the bytes are. */
typedef struct {
    const char *name;
    lk_dtype dtype;
    int ndim;
    const int64_t *shape;
    const lk_tensor *tensor; /* non-contiguous source, copied when written */
    lk_tensor *host;         /* a device tensor's copy on the host (owned) */
    const void *data;
    size_t nbytes;
    uint64_t begin;
    uint32_t crc; /* of the bytes written, known once they are */
} wentry;

static lk_status resolve(const char *path, const lk_st_entry *e, wentry *out) {
    const char *name = e->name;
    if (!name) return lk_error(LK_STATUS_INVALID_ARGUMENT, "writing '%s': a tensor has no name", path);
    if (!strcmp(name, "__metadata__"))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "writing '%s': '__metadata__' is reserved and cannot name a tensor", path);
    memset(out, 0, sizeof *out);
    out->name = name;
    if (e->tensor) {
        const lk_tensor *t = e->tensor;
        if (!lk_device_is_host(t->device)) { /* the bytes cross to the host once, here */
            if (!(out->host = lk_tensor_to(t, LK_DEVICE_CPU)))
                return lk_error(lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY,
                                "writing '%s': tensor '%s' could not be copied from its device: %s", path, name,
                                lk_last_error());
            t = out->host;
        }
        out->dtype = t->dtype;
        out->ndim = t->ndim;
        out->shape = t->shape;
        if (lk_tensor_is_contiguous(t)) out->data = t->data;
        else out->tensor = t;
    } else {
        out->dtype = e->dtype;
        out->ndim = e->ndim;
        out->shape = e->shape;
        out->data = e->data;
    }
    if ((unsigned)out->dtype >= LK_DTYPE_COUNT)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "writing '%s': tensor '%s' has an invalid dtype %d", path, name,
                        (int)out->dtype);
    if (out->ndim < 0 || out->ndim > LK_ST_MAX_DIMS || (out->ndim && !out->shape))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "writing '%s': tensor '%s' has an invalid rank %d", path, name, out->ndim);
    uint64_t numel = 1;
    for (int i = 0; i < out->ndim; i++) {
        if (out->shape[i] < 0 || (out->shape[i] && numel > (UINT64_MAX >> 4) / (uint64_t)out->shape[i]))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "writing '%s': tensor '%s' has an invalid size %lld in dimension %d",
                            path, name, (long long)out->shape[i], i);
        numel *= (uint64_t)out->shape[i];
    }
    out->nbytes = (size_t)(numel * lk_dtype_size(out->dtype));
    if (out->nbytes && !out->data && !out->tensor)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "writing '%s': tensor '%s' has no data", path, name);
    return LK_STATUS_OK;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp((*(const wentry *const *)a)->name, (*(const wentry *const *)b)->name);
}

/* The JSON header, padded with spaces to a multiple of 8 bytes. Without
 * `with_crc` each checksum is "00000000", a stand-in of the same length:
 * the header is written before the data (whose checksums are computed as
 * it is written) and rewritten in place after it. */
static lk_status build_header(const char *path, wentry *ents, int n, const lk_st_meta *meta, int nmeta, bool with_crc,
                              char **out, size_t *len) {
    size_t plen = strlen(LK_ST_CRC_PREFIX), klen = 0;
    for (int i = 0; i < n; i++)
        if (strlen(ents[i].name) > klen) klen = strlen(ents[i].name);
    char *key = n ? lk_malloc(plen + klen + 1) : NULL;
    if (n && !key) return LK_STATUS_OUT_OF_MEMORY;
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && (nmeta > 0 || n > 0)) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (int i = 0; ok && i < nmeta; i++) {
            const char *why = !meta[i].key || !meta[i].value ? "has a NULL key or value"
                              : !strncmp(meta[i].key, LK_ST_CRC_PREFIX, plen)
                                  ? "uses the reserved prefix '" LK_ST_CRC_PREFIX "' (the writer stores the checksums)"
                              : cJSON_GetObjectItemCaseSensitive(m, meta[i].key) ? "given twice"
                                                                                 : NULL;
            if (why) {
                cJSON_Delete(root);
                lk_free(key);
                if (!meta[i].key || !meta[i].value)
                    return lk_error(LK_STATUS_INVALID_ARGUMENT, "writing '%s': metadata entry %d %s", path, i, why);
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "writing '%s': metadata key '%s' %s", path, meta[i].key, why);
            }
            ok = cJSON_AddStringToObject(m, meta[i].key, meta[i].value) != NULL;
        }
        for (int i = 0; ok && i < n; i++) {
            char hex[16];
            snprintf(hex, sizeof hex, "%08x", with_crc ? (unsigned)ents[i].crc : 0u);
            memcpy(key, LK_ST_CRC_PREFIX, plen);
            strcpy(key + plen, ents[i].name);
            ok = cJSON_AddStringToObject(m, key, hex) != NULL;
        }
    }
    lk_free(key);
    for (int i = 0; ok && i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(root, ents[i].name);
        cJSON *shape = t ? cJSON_CreateArray() : NULL, *offs = shape ? cJSON_CreateArray() : NULL;
        ok = t && shape && offs && cJSON_AddStringToObject(t, "dtype", lk_safetensors_dtype_name(ents[i].dtype));
        if (shape) cJSON_AddItemToObject(t, "shape", shape);
        if (offs) cJSON_AddItemToObject(t, "data_offsets", offs);
        for (int d = 0; ok && d < ents[i].ndim; d++) ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ents[i].shape[d]));
        if (ok) ok = cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)ents[i].begin)) &&
                     cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(ents[i].begin + ents[i].nbytes)));
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return lk_error(LK_STATUS_OUT_OF_MEMORY, "writing '%s': out of memory building the header", path);
    size_t l = strlen(json), padded = (l + 7) & ~(size_t)7;
    char *h = lk_malloc(8 + padded);
    if (!h) {
        cJSON_free(json);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    uint64_t hl = padded;
    memcpy(h, &hl, 8); /* little-endian host */
    memcpy(h + 8, json, l);
    memset(h + 8 + l, ' ', padded - l);
    cJSON_free(json);
    *out = h;
    *len = 8 + padded;
    return LK_STATUS_OK;
}

static lk_status write_body(writer *w, wentry **order, int n) {
    for (int i = 0; i < n; i++) {
        wentry *e = order[i];
        e->crc = 0; /* the CRC of no bytes */
        if (!e->nbytes) continue;
        if (e->tensor) {
            lk_tensor *c = lk_tensor_clone(e->tensor);
            if (!c) return LK_STATUS_OUT_OF_MEMORY;
            lk_status st = put_tensor(w, c->data, e->nbytes, &e->crc);
            lk_tensor_release(c);
            LK_TRY(st);
        } else {
            LK_TRY(put_tensor(w, e->data, e->nbytes, &e->crc));
        }
    }
    return w->blen ? flush_buf(w) : LK_STATUS_OK;
}

static lk_status sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return lk_error(LK_STATUS_IO, "opening directory '%s' to sync '%s': %s", dir, path, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r && e != EINVAL) /* some file systems cannot sync directories */
        return lk_error(LK_STATUS_IO, "syncing directory '%s' after writing '%s': %s", dir, path, strerror(e));
    return LK_STATUS_OK;
}

lk_status lk_safetensors_write(const char *path, const lk_st_entry *entries, int n, const lk_st_meta *meta,
                               int nmeta) {
    if (!path || n < 0 || (n && !entries) || nmeta < 0 || (nmeta && !meta))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_safetensors_write: invalid arguments");
    wentry *ents = lk_calloc((size_t)n + 1, sizeof *ents);
    wentry **order = lk_calloc((size_t)n + 1, sizeof *order);
    char *header = NULL, *tmp = NULL;
    size_t hlen = 0;
    writer w = {.fd = -1, .path = path};
    lk_status st = ents && order ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; !st && i < n; i++) {
        st = entries[i].tensor ? lk__tensor_check_data(entries[i].tensor, "lk_safetensors_write") : LK_STATUS_OK;
        if (!st) st = resolve(path, &entries[i], &ents[i]);
        order[i] = &ents[i];
    }
    if (!st && n > 1) { /* duplicate names */
        qsort(order, (size_t)n, sizeof *order, cmp_names);
        for (int i = 1; !st && i < n; i++)
            if (!strcmp(order[i - 1]->name, order[i]->name))
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "writing '%s': tensor name '%s' given twice", path, order[i]->name);
    }
    if (!st) { /* data order: element size descending (keeps every tensor aligned), then input order */
        int k = 0;
        uint64_t off = 0;
        for (size_t size = 8; size >= 1; size /= 2)
            for (int i = 0; i < n; i++)
                if (lk_dtype_size(ents[i].dtype) == size) {
                    ents[i].begin = off;
                    off += ents[i].nbytes;
                    order[k++] = &ents[i];
                }
        w.total = off;
        st = build_header(path, ents, n, meta, nmeta, false, &header, &hlen);
        w.total += hlen;
    }
    if (!st) {
        size_t tl = strlen(path) + 32;
        tmp = lk_malloc(tl);
        w.buf = lk_aligned_alloc(4096, WRITE_BUF);
        if (!tmp || !w.buf) st = LK_STATUS_OUT_OF_MEMORY;
        else snprintf(tmp, tl, "%s.tmp.%d", path, (int)getpid());
    }
    if (!st) {
        w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (w.fd < 0) st = lk_error(LK_STATUS_IO, "cannot create '%s' (for '%s'): %s", tmp, path, strerror(errno));
    }
    if (!st) st = put(&w, header, hlen);
    if (!st) st = write_body(&w, order, n);
    if (!st && n) { /* the header again, now with the checksums: the same length */
        char *full = NULL;
        size_t flen = 0;
        st = build_header(path, ents, n, meta, nmeta, true, &full, &flen);
        if (!st && flen != hlen) st = lk_error(LK_STATUS_INTERNAL, "writing '%s': the header changed length", path);
        if (!st) st = write_at(&w, full, flen, 0);
        lk_free(full);
    }
    if (!st && fsync(w.fd)) st = lk_error(LK_STATUS_IO, "syncing '%s': %s", tmp, strerror(errno));
    if (w.fd >= 0) {
        if (close(w.fd) && !st) st = lk_error(LK_STATUS_IO, "closing '%s': %s", tmp, strerror(errno));
        w.fd = -1;
        if (!st && rename(tmp, path))
            st = lk_error(LK_STATUS_IO, "renaming '%s' to '%s': %s", tmp, path, strerror(errno));
        if (st) unlink(tmp);
        else st = sync_dir(path);
    }
    lk_free(tmp);
    lk_aligned_free(w.buf);
    lk_free(header);
    lk_free(order);
    for (int i = 0; ents && i < n; i++) lk_tensor_release(ents[i].host);
    lk_free(ents);
    return st;
}

/* ---- reading -------------------------------------------------------------------- */

struct lk_st_file {
    char *path;
    const unsigned char *base; /* the whole file */
    size_t size;
    bool mapped;
    lk_st_info *infos; /* by data offset */
    int n;
    int *by_name; /* indices sorted by name */
    char **meta_keys, **meta_values;
    int nmeta;
    char **crc_names; /* the checksum keys' tensor names, in metadata order */
    uint32_t *crc_values;
    int ncrc;
    int verified; /* tensors checked against their checksum */
};

static lk_status bad(const lk_st_file *f, const char *fmt, ...) LK_PRINTF(2, 3);
static lk_status bad(const lk_st_file *f, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s", f->path, msg);
}

/* A JSON number that is a whole, non-negative, exactly representable value. */
static bool json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

static const char *json_kind(const cJSON *j) {
    if (!j) return "missing";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsBool(j)) return "a boolean";
    return "null";
}

static int cmp_by_offset(const void *a, const void *b) {
    const lk_st_info *x = a, *y = b;
    const unsigned char *px = x->data, *py = y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}
static int cmp_by_name(const void *a, const void *b, void *ctx) { /* glibc qsort_r */
    const lk_st_file *f = ctx;
    return strcmp(f->infos[*(const int *)a].name, f->infos[*(const int *)b].name);
}

/* 8 hex digits, either case. */
static bool parse_crc(const char *v, uint32_t *out) {
    uint32_t x = 0;
    for (int i = 0; i < 8; i++) {
        char c = v[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return false;
        x = x << 4 | (uint32_t)d;
    }
    *out = x;
    return v[8] == 0;
}

static lk_status parse_metadata(lk_st_file *f, const cJSON *m) {
    if (!cJSON_IsObject(m)) return bad(f, "'__metadata__' must be an object of strings, got %s", json_kind(m));
    int cnt = cJSON_GetArraySize(m);
    f->meta_keys = lk_calloc((size_t)cnt + 1, sizeof *f->meta_keys);
    f->meta_values = lk_calloc((size_t)cnt + 1, sizeof *f->meta_values);
    f->crc_names = lk_calloc((size_t)cnt + 1, sizeof *f->crc_names);
    f->crc_values = lk_calloc((size_t)cnt + 1, sizeof *f->crc_values);
    if (!f->meta_keys || !f->meta_values || !f->crc_names || !f->crc_values) return LK_STATUS_OUT_OF_MEMORY;
    size_t plen = strlen(LK_ST_CRC_PREFIX);
    for (const cJSON *e = m->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->string)
            return bad(f, "metadata '%s' must be a string, got %s", e->string ? e->string : "?", json_kind(e));
        if (!strncmp(e->string, LK_ST_CRC_PREFIX, plen)) {
            /* a checksum: kept apart (duplicates are found when they are
             * matched to the tensors, in O(n log n) for big models) */
            uint32_t v;
            if (!parse_crc(e->valuestring, &v))
                return bad(f, "metadata '%.300s' is '%.40s', expected a crc32c checksum of 8 hex digits", e->string,
                           e->valuestring);
            if (!(f->crc_names[f->ncrc] = lk_strdup(e->string + plen))) return LK_STATUS_OUT_OF_MEMORY;
            f->crc_values[f->ncrc++] = v;
            continue;
        }
        for (int i = 0; i < f->nmeta; i++)
            if (!strcmp(f->meta_keys[i], e->string)) return bad(f, "metadata key '%s' appears twice", e->string);
        char *k = lk_strdup(e->string), *v = lk_strdup(e->valuestring);
        if (!k || !v) {
            lk_free(k);
            lk_free(v);
            return LK_STATUS_OUT_OF_MEMORY;
        }
        f->meta_keys[f->nmeta] = k;
        f->meta_values[f->nmeta] = v;
        f->nmeta++;
    }
    return LK_STATUS_OK;
}

/* Checksumming a file is a pass over all its data: above 8 MiB it is cut
 * into equal byte ranges, one per compute thread (a model's tensors vary
 * from bytes to gigabytes, so ranges balance where whole tensors would
 * not). Each task checksums the pieces of the tensors inside its range;
 * a tensor's pieces are then joined with lk__crc32c_combine. */
#define CRC_TASK_MIN (4u << 20)

typedef struct {
    const lk_st_file *f;
    const unsigned char *buf; /* the data buffer: the first tensor's offset */
    size_t len;
    int width;
    const int *first_task, *last_task; /* the tasks each tensor's bytes fall in */
    const int *base;                   /* its first piece in piece[] */
    uint32_t *piece;
} crc_job;

static void task_range(const crc_job *j, int t, size_t *lo, size_t *hi) {
    *lo = j->len / (size_t)j->width * (size_t)t;
    *hi = t + 1 == j->width ? j->len : j->len / (size_t)j->width * (size_t)(t + 1);
}

static void crc_task(void *ctx, int t) {
    const crc_job *j = ctx;
    size_t lo, hi;
    task_range(j, t, &lo, &hi);
    for (int i = 0; i < j->f->n; i++) { /* tensors in offset order */
        if (j->first_task[i] > t) break;
        if (j->last_task[i] < t) continue;
        const lk_st_info *in = &j->f->infos[i];
        size_t b = (size_t)((const unsigned char *)in->data - j->buf), e = b + in->nbytes;
        size_t pb = b > lo ? b : lo, pe = e < hi ? e : hi;
        j->piece[j->base[i] + t - j->first_task[i]] = lk__crc32c(0, j->buf + pb, pe - pb);
    }
}

static lk_status checksum_all(const lk_st_file *f, uint32_t *got) {
    size_t len = 0;
    for (int i = 0; i < f->n; i++) len += f->infos[i].nbytes;
    int width = len >= 2 * (size_t)CRC_TASK_MIN ? lk__parallel_width((int64_t)(len / CRC_TASK_MIN)) : 1;
    if (width <= 1 || f->n == 0) {
        for (int i = 0; i < f->n; i++) got[i] = lk__crc32c(0, f->infos[i].data, f->infos[i].nbytes);
        return LK_STATUS_OK;
    }
    int *first = lk_malloc((size_t)f->n * sizeof *first), *last = lk_malloc((size_t)f->n * sizeof *last),
        *base = lk_malloc((size_t)f->n * sizeof *base);
    uint32_t *piece = lk_malloc(((size_t)f->n + (size_t)width) * sizeof *piece);
    if (!first || !last || !base || !piece) {
        lk_free(first), lk_free(last), lk_free(base), lk_free(piece);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    crc_job j = {f, f->infos[0].data, len, width, first, last, base, piece};
    /* which tasks each tensor's bytes fall in (an empty one: the task of its offset) */
    int nb = 0;
    for (int i = 0, t = 0; i < f->n; i++) {
        size_t b = (size_t)((const unsigned char *)f->infos[i].data - j.buf), e = b + f->infos[i].nbytes, lo, hi;
        for (task_range(&j, t, &lo, &hi); t + 1 < width && b >= hi; task_range(&j, ++t, &lo, &hi)) {}
        first[i] = t;
        int u = t;
        for (task_range(&j, u, &lo, &hi); u + 1 < width && e > hi; task_range(&j, ++u, &lo, &hi)) {}
        last[i] = u;
        base[i] = nb;
        nb += u - t + 1;
    }
    lk__parallel_run(width, crc_task, &j);
    for (int i = 0; i < f->n; i++) {
        size_t b = (size_t)((const unsigned char *)f->infos[i].data - j.buf), e = b + f->infos[i].nbytes;
        uint32_t c = piece[base[i]];
        for (int t = first[i] + 1; t <= last[i]; t++) {
            size_t lo, hi;
            task_range(&j, t, &lo, &hi);
            c = lk__crc32c_combine(c, piece[base[i] + t - first[i]], (e < hi ? e : hi) - lo);
        }
        got[i] = c;
    }
    lk_free(first), lk_free(last), lk_free(base), lk_free(piece);
    return LK_STATUS_OK;
}

/* Matches the checksums to the tensors and checks every tensor's bytes:
 * all tensors have one or none does (a file lockstep wrote has all; a key
 * lost or added means the header was edited or damaged), and each one
 * holds. Runs before the handle exists, so no caller sees corrupt data. */
static lk_status verify_checksums(lk_st_file *f) {
    for (int i = 0; i < f->ncrc; i++) {
        lk_st_info *in = (lk_st_info *)lk_safetensors_find(f, f->crc_names[i]);
        if (!in)
            return bad(f, "metadata '" LK_ST_CRC_PREFIX "%.300s' is the checksum of a tensor '%.300s' that the file does "
                          "not hold (the header was edited or damaged)",
                       f->crc_names[i], f->crc_names[i]);
        if (in->has_crc32c) return bad(f, "tensor '%s' has two crc32c checksums", in->name);
        in->has_crc32c = true;
        in->crc32c = f->crc_values[i];
    }
    if (f->ncrc == 0) return LK_STATUS_OK; /* an older lockstep's file, or another writer's */
    for (int i = 0; i < f->n; i++)
        if (!f->infos[i].has_crc32c)
            return bad(f, "tensor '%s' has no crc32c checksum (metadata '" LK_ST_CRC_PREFIX "%s') while %d other "
                          "tensor%s of the file %s one: the header was edited or damaged",
                       f->infos[i].name, f->infos[i].name, f->ncrc, f->ncrc > 1 ? "s" : "", f->ncrc > 1 ? "have" : "has");
    uint32_t *got = lk_malloc(((size_t)f->n + 1) * sizeof *got);
    if (!got) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = checksum_all(f, got);
    if (st) {
        lk_free(got);
        return st;
    }
    char others[512] = "";
    int nothers = 0, first = -1;
    uint32_t first_got = 0;
    for (int i = 0; i < f->n; i++) {
        const lk_st_info *in = &f->infos[i];
        if (got[i] == in->crc32c) continue;
        if (first < 0) first = i, first_got = got[i];
        else lk__list_add(others, sizeof others, &nothers, ", ", "'%s'", in->name);
    }
    lk_free(got);
    if (first >= 0) {
        const lk_st_info *in = &f->infos[first];
        char more[600] = "";
        if (nothers)
            snprintf(more, sizeof more, " (%d more tensor%s fail%s too: %s)", nothers, nothers > 1 ? "s" : "",
                     nothers > 1 ? "" : "s", others);
        return bad(f, "tensor '%s' fails its crc32c check (stored %08x, computed %08x): the file is corrupt (its bytes "
                      "changed after lockstep wrote it: a disk, copy or transfer error); use an intact copy or another "
                      "checkpoint%s",
                   in->name, (unsigned)in->crc32c, (unsigned)first_got, more);
    }
    f->verified = f->n;
    return LK_STATUS_OK;
}

static lk_status parse_entry(lk_st_file *f, const cJSON *e, const unsigned char *buffer, size_t buflen,
                             lk_st_info *info, uint64_t *begin_out) {
    const char *name = e->string;
    if (!cJSON_IsObject(e)) return bad(f, "tensor '%s': expected an object with dtype, shape and data_offsets, got %s", name, json_kind(e));
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd)) return bad(f, "tensor '%s': 'dtype' must be a string, got %s", name, json_kind(jd));
    const st_dtype *dt = find_dtype(jd->valuestring);
    if (!dt) {
        char list[256];
        size_t k = 0;
        for (int i = 0; i < N_ST_DTYPES && k < sizeof list; i++)
            k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", st_dtypes[i].name);
        return bad(f, "tensor '%s' has unknown dtype '%.64s' (expected one of %s)", name, jd->valuestring, list);
    }
    if (!cJSON_IsArray(js)) return bad(f, "tensor '%s': 'shape' must be an array of integers, got %s", name, json_kind(js));
    int ndim = cJSON_GetArraySize(js);
    if (ndim > LK_ST_MAX_DIMS) return bad(f, "tensor '%s' has %d dimensions (at most %d supported)", name, ndim, LK_ST_MAX_DIMS);
    int64_t *shape = lk_calloc((size_t)ndim + 1, sizeof *shape);
    if (!shape) return LK_STATUS_OUT_OF_MEMORY;
    info->shape = shape; /* owned by the info from here */
    uint64_t numel = 1;
    bool overflow = false;
    int d = 0;
    for (const cJSON *x = js->child; x; x = x->next, d++) {
        uint64_t v;
        if (!json_uint(x, &v)) return bad(f, "tensor '%s': shape[%d] must be a non-negative integer", name, d);
        shape[d] = (int64_t)v;
        if (v && numel > UINT64_MAX / v) overflow = true;
        else numel *= v;
    }
    if (overflow || numel > (uint64_t)INT64_MAX / dt->size) return bad(f, "tensor '%s': shape too large", name);
    uint64_t b, en;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_uint(jo->child, &b) || !json_uint(jo->child->next, &en))
        return bad(f, "tensor '%s': 'data_offsets' must be [begin, end] with non-negative integers", name);
    char sb[256];
    if (en < b) return bad(f, "tensor '%s': data_offsets [%llu, %llu] end before they begin", name, (unsigned long long)b, (unsigned long long)en);
    if (en - b != numel * dt->size)
        return bad(f, "tensor '%s': dtype %s and shape %s need %llu bytes, but data_offsets [%llu, %llu] span %llu", name,
                   dt->name, shape_text(ndim, shape, sb, sizeof sb), (unsigned long long)(numel * dt->size),
                   (unsigned long long)b, (unsigned long long)en, (unsigned long long)(en - b));
    if (en > buflen)
        return bad(f, "tensor '%s': data_offsets [%llu, %llu] go past the end of the data (%zu bytes; the file is %zu bytes%s)",
                   name, (unsigned long long)b, (unsigned long long)en, buflen, f->size,
                   " — truncated?");
    info->name = lk_strdup(name);
    if (!info->name) return LK_STATUS_OUT_OF_MEMORY;
    info->dtype_name = dt->name;
    info->dtype = dt->dtype;
    info->elem_size = dt->size;
    info->ndim = ndim;
    info->numel = (int64_t)numel;
    info->data = buffer + b;
    info->nbytes = (size_t)(en - b);
    *begin_out = b;
    return LK_STATUS_OK;
}

static lk_status parse_header(lk_st_file *f) {
    if (f->size < 8)
        return bad(f, "file too short to be safetensors (%zu bytes; the format starts with an 8-byte header length)", f->size);
    uint64_t hl;
    memcpy(&hl, f->base, 8);
    if (hl > f->size - 8)
        return bad(f, "header length %llu goes beyond the end of the file (%zu bytes) — truncated or not safetensors",
                   (unsigned long long)hl, f->size);
    if (hl > LK_ST_MAX_HEADER) return bad(f, "header length %llu exceeds the %u-byte limit", (unsigned long long)hl, LK_ST_MAX_HEADER);
    const char *h = (const char *)f->base + 8;
    if (hl < 2 || h[0] != '{') return bad(f, "the header is not a JSON object (it must start with '{')");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(h, (size_t)hl, &end, 0);
    if (!root) {
        size_t pos = end && end >= h && end <= h + hl ? (size_t)(end - h) : 0;
        return bad(f, "invalid JSON in the header at byte %zu of %llu", pos, (unsigned long long)hl);
    }
    lk_status st = LK_STATUS_OK;
    for (const char *p = end; p < h + hl && !st; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            st = bad(f, "unexpected bytes after the JSON header at byte %zu of %llu", (size_t)(p - h), (unsigned long long)hl);
    if (!st && !cJSON_IsObject(root)) st = bad(f, "the header must be a JSON object, got %s", json_kind(root));
    const unsigned char *buffer = f->base + 8 + hl;
    size_t buflen = f->size - 8 - (size_t)hl;
    int cnt = st ? 0 : cJSON_GetArraySize(root);
    if (!st) {
        f->infos = lk_calloc((size_t)cnt + 1, sizeof *f->infos);
        if (!f->infos) st = LK_STATUS_OUT_OF_MEMORY;
    }
    bool have_meta = false;
    for (const cJSON *e = st ? NULL : root->child; e && !st; e = e->next) {
        if (!e->string) {
            st = bad(f, "header entry without a name");
        } else if (!strcmp(e->string, "__metadata__")) {
            if (have_meta) st = bad(f, "'__metadata__' appears twice");
            else st = parse_metadata(f, e);
            have_meta = true;
        } else {
            uint64_t b;
            lk_st_info *info = &f->infos[f->n++];
            st = parse_entry(f, e, buffer, buflen, info, &b);
        }
    }
    cJSON_Delete(root);
    if (st) return st;
    /* names unique */
    f->by_name = lk_calloc((size_t)f->n + 1, sizeof *f->by_name);
    if (!f->by_name) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < f->n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_by_name, f);
    for (int i = 1; i < f->n; i++)
        if (!strcmp(f->infos[f->by_name[i - 1]].name, f->infos[f->by_name[i]].name))
            return bad(f, "tensor '%s' appears twice in the header", f->infos[f->by_name[i]].name);
    /* the buffer must be covered exactly: sorted by offset, each tensor
     * starts where the previous one ended */
    qsort(f->infos, (size_t)f->n, sizeof *f->infos, cmp_by_offset);
    size_t at = 0;
    const char *prev = NULL;
    for (int i = 0; i < f->n; i++) {
        size_t b = (size_t)((const unsigned char *)f->infos[i].data - buffer);
        if (b < at)
            return bad(f, "tensor '%s' (data_offsets [%zu, %zu]) overlaps tensor '%s' (which ends at %zu)", f->infos[i].name,
                       b, b + f->infos[i].nbytes, prev, at);
        if (b > at)
            return bad(f, "gap in the data before tensor '%s' (bytes [%zu, %zu] belong to no tensor)", f->infos[i].name, at, b);
        at = b + f->infos[i].nbytes;
        prev = f->infos[i].name;
    }
    if (at != buflen)
        return bad(f, "%zu bytes of data after the last tensor%s%s%s (the tensors cover %zu of %zu bytes)", buflen - at,
                   prev ? " '" : "", prev ? prev : "", prev ? "'" : "", at, buflen);
    /* by_name held indices into the unsorted array: rebuild */
    for (int i = 0; i < f->n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_by_name, f);
    return verify_checksums(f);
}

/* The note for a file without checksums, once per path in a process (a
 * run may open the same checkpoint for fit, then test): a small table of
 * path hashes; past its size the note repeats, which is harmless. */
static void note_unverified(const char *path) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t seen[64];
    static int nseen;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = path; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    pthread_mutex_lock(&mu);
    bool first = true;
    for (int i = 0; i < nseen && first; i++) first = seen[i] != h;
    if (first && nseen < 64) seen[nseen++] = h;
    pthread_mutex_unlock(&mu);
    if (first)
        lk_log0("note: %s has no tensor checksums (written by a lockstep before they existed, or by another tool): "
                "its tensor data is loaded without a corruption check", path);
}

static lk_status open_common(lk_st_file *f, lk_st_file **out) {
    lk_status st = parse_header(f);
    if (st) {
        lk_safetensors_close(f);
        return st;
    }
    *out = f;
    return LK_STATUS_OK;
}

lk_status lk_safetensors_open_memory(const void *data, size_t size, const char *name, lk_st_file **out) {
    *out = NULL;
    lk_st_file *f = lk_calloc(1, sizeof *f);
    if (!f) return LK_STATUS_OUT_OF_MEMORY;
    f->path = lk_strdup(name ? name : "<memory>");
    if (!f->path) {
        lk_free(f);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    f->base = data;
    f->size = data ? size : 0;
    return open_common(f, out);
}

lk_status lk_safetensors_open(const char *path, lk_st_file **out) {
    *out = NULL;
    if (!path) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_safetensors_open: NULL path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lk_error(LK_STATUS_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) {
        int e = errno;
        close(fd);
        return lk_error(LK_STATUS_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return lk_error(LK_STATUS_IO, "'%s' is not a regular file", path);
    }
    lk_st_file *f = lk_calloc(1, sizeof *f);
    if (!f || !(f->path = lk_strdup(path))) {
        lk_free(f);
        close(fd);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    f->size = (size_t)sb.st_size;
    if (f->size) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            lk_safetensors_close(f);
            return lk_error(LK_STATUS_IO, "cannot map '%s' (%zu bytes): %s", path, (size_t)sb.st_size, strerror(e));
        }
        f->base = m;
        f->mapped = true;
    }
    close(fd);
    LK_TRY(open_common(f, out));
    if ((*out)->n && !(*out)->verified) note_unverified(path);
    return LK_STATUS_OK;
}

void lk_safetensors_close(lk_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) {
        lk_free((void *)f->infos[i].name);
        lk_free((void *)f->infos[i].shape);
    }
    lk_free(f->infos);
    lk_free(f->by_name);
    for (int i = 0; i < f->nmeta; i++) {
        lk_free(f->meta_keys[i]);
        lk_free(f->meta_values[i]);
    }
    lk_free(f->meta_keys);
    lk_free(f->meta_values);
    for (int i = 0; i < f->ncrc; i++) lk_free(f->crc_names[i]);
    lk_free(f->crc_names);
    lk_free(f->crc_values);
    if (f->mapped) munmap((void *)f->base, f->size);
    lk_free(f->path);
    lk_free(f);
}

const char *lk_safetensors_path(const lk_st_file *f) { return f ? f->path : NULL; }
int lk_safetensors_verified(const lk_st_file *f) { return f ? f->verified : 0; }
int lk_safetensors_count(const lk_st_file *f) { return f ? f->n : 0; }
const lk_st_info *lk_safetensors_at(const lk_st_file *f, int i) { return f && i >= 0 && i < f->n ? &f->infos[i] : NULL; }

const lk_st_info *lk_safetensors_find(const lk_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->infos[f->by_name[mid]].name, name);
        if (!c) return &f->infos[f->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

lk_status lk_safetensors_get(const lk_st_file *f, const char *name, const lk_st_info **out) {
    if (!f || !name) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_safetensors_get: NULL argument");
    *out = lk_safetensors_find(f, name);
    if (*out) return LK_STATUS_OK;
    const char **names = lk_malloc(((size_t)f->n + 1) * sizeof *names);
    const char *s = NULL;
    if (names) {
        for (int i = 0; i < f->n; i++) names[i] = f->infos[i].name;
        s = lk_suggest(name, names, f->n);
    }
    lk_status st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s has no tensor '%s'%s%s%s (it holds %d tensors)", f->path, name,
                            s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "", f->n);
    lk_free(names);
    return st;
}

lk_status lk_safetensors_read_into(const lk_st_file *f, const char *name, lk_tensor *dst) {
    const lk_st_info *in;
    LK_TRY(lk_safetensors_get(f, name, &in));
    if (!dst) return lk_error(LK_STATUS_INVALID_ARGUMENT, "reading '%s' from %s: NULL destination", name, f->path);
    LK_TRY(lk__tensor_check_data(dst, "lk_safetensors_read_into"));
    if (!lk_device_is_host(dst->device)) { /* read on the host, then one copy to the device */
        lk_tensor *h = lk__tensor_new_on(LK_DEVICE_CPU, dst->dtype, dst->ndim, dst->shape);
        if (!h) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
        lk_status st = lk_safetensors_read_into(f, name, h);
        if (!st) st = lk_tensor_copy(dst, h);
        lk_tensor_release(h);
        return st;
    }
    bool same = in->ndim == dst->ndim;
    for (int i = 0; same && i < in->ndim; i++) same = in->shape[i] == dst->shape[i];
    if (!same) {
        char a[256], b[256];
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tensor '%s' in %s has shape %s, the model expects %s", name, f->path,
                        shape_text(in->ndim, in->shape, a, sizeof a), shape_text(dst->ndim, dst->shape, b, sizeof b));
    }
    if (in->dtype < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tensor '%s' in %s has dtype %s, which lockstep tensors cannot hold", name,
                        f->path, in->dtype_name);
    lk_dtype sdt = (lk_dtype)in->dtype;
    if (sdt != dst->dtype && !(lk_dtype_is_float(sdt) && lk_dtype_is_float(dst->dtype)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tensor '%s' in %s has dtype %s, the model expects %s", name, f->path,
                        in->dtype_name, lk_safetensors_dtype_name(dst->dtype));
    if (!in->nbytes) return LK_STATUS_OK;
    if (sdt == dst->dtype && lk_tensor_is_contiguous(dst)) {
        memcpy(dst->data, in->data, in->nbytes);
        return LK_STATUS_OK;
    }
    /* strided or converting copy: the source must be aligned for its type */
    void *tmp = NULL;
    const void *src = in->data;
    if ((uintptr_t)src % in->elem_size) {
        tmp = lk_aligned_alloc(LK_ALIGN, in->nbytes);
        if (!tmp) return LK_STATUS_OUT_OF_MEMORY;
        memcpy(tmp, src, in->nbytes);
        src = tmp;
    }
    lk_tensor *s = lk_tensor_wrap(sdt, in->ndim, in->shape, (void *)src);
    lk_status st = s ? lk_tensor_copy(dst, s) : LK_STATUS_OUT_OF_MEMORY;
    lk_tensor_release(s);
    lk_aligned_free(tmp);
    return st;
}

const char *lk_safetensors_meta(const lk_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_values[i];
    return NULL;
}
int lk_safetensors_meta_count(const lk_st_file *f) { return f ? f->nmeta : 0; }
const char *lk_safetensors_meta_key(const lk_st_file *f, int i) { return f && i >= 0 && i < f->nmeta ? f->meta_keys[i] : NULL; }
const char *lk_safetensors_meta_value(const lk_st_file *f, int i) {
    return f && i >= 0 && i < f->nmeta ? f->meta_values[i] : NULL;
}

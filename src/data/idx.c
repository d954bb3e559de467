/* The idx format (LeCun's MNIST files: a 4-byte magic 00 00 <type> <ndim>,
 * ndim big-endian u32 dims, then big-endian data), plain or gzip, and the
 * datasets built on it: an image/label file pair and the MNIST-style
 * directory lookup. zlib's gzread reads both plain and compressed files,
 * so compression is detected from the bytes, never from the file name. */
#include "data/data_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static int is_big_endian_host(void) {
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 0;
}

static void swap_bytes(void *data, size_t n, size_t es) {
    if (es == 1 || is_big_endian_host()) return;
    uint8_t *p = data;
    for (size_t i = 0; i < n; i++, p += es)
        for (size_t a = 0, b = es - 1; a < b; a++, b--) {
            uint8_t t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

static lk_status gz_read_exact(gzFile g, const char *path, void *buf, size_t n, size_t offset) {
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done > (1u << 30) ? (1u << 30) : n - done;
        int got = gzread(g, (char *)buf + done, (unsigned)chunk);
        if (got < 0) {
            int err;
            const char *msg = gzerror(g, &err);
            return lk_error(LK_STATUS_IO, "%s: corrupt or unreadable at byte %zu: %s", path, offset + done, msg);
        }
        if (got == 0)
            return lk_error(LK_STATUS_IO, "%s: truncated: expected %zu bytes at offset %zu, got only %zu%s", path, n,
                            offset, done, gzdirect(g) ? "" : " (after decompression)");
        done += (size_t)got;
    }
    return LK_STATUS_OK;
}

/* type byte -> (file element size, dtype in memory) */
static bool idx_type(uint8_t t, size_t *fsize, lk_dtype *dt, const char **name) {
    switch (t) {
    case 0x08: *fsize = 1; *dt = LK_U8; *name = "u8"; return true;
    case 0x09: *fsize = 1; *dt = LK_I32; *name = "i8"; return true;
    case 0x0B: *fsize = 2; *dt = LK_I32; *name = "i16"; return true;
    case 0x0C: *fsize = 4; *dt = LK_I32; *name = "i32"; return true;
    case 0x0D: *fsize = 4; *dt = LK_F32; *name = "f32"; return true;
    case 0x0E: *fsize = 8; *dt = LK_F64; *name = "f64"; return true;
    default: return false;
    }
}

lk_status lk_idx_read(const char *path, lk_array *out) {
    memset(out, 0, sizeof *out);
    gzFile g = gzopen(path, "rb");
    if (!g) return lk_error(LK_STATUS_IO, "cannot open %s: %s", path, strerror(errno ? errno : ENOMEM));
    gzbuffer(g, 1u << 17);
    uint8_t magic[4];
    lk_status st = gz_read_exact(g, path, magic, 4, 0);
    size_t fsize = 0;
    lk_dtype dt = LK_U8;
    const char *tname = "";
    if (!st && (magic[0] || magic[1] || !idx_type(magic[2], &fsize, &dt, &tname)))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                      "%s: not an idx file: magic bytes %02x %02x %02x %02x, expected 00 00 <type 08|09|0b|0c|0d|0e> "
                      "<ndim>",
                      path, magic[0], magic[1], magic[2], magic[3]);
    int ndim = st ? 0 : magic[3];
    if (!st && (ndim < 1 || ndim > LK_MAX_DIMS))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: idx header has %d dims, expected 1..%d", path, ndim, LK_MAX_DIMS);
    uint32_t dims[LK_MAX_DIMS];
    if (!st) st = gz_read_exact(g, path, dims, (size_t)ndim * 4, 4);
    int64_t shape[LK_MAX_DIMS];
    int64_t n = 0;
    char sb[160];
    if (!st) {
        swap_bytes(dims, (size_t)ndim, 4);
        for (int i = 0; i < ndim; i++) shape[i] = dims[i];
        n = lk__shape_numel(ndim, shape);
        if (n < 0 || (uint64_t)n > SIZE_MAX / 8)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: idx shape %s is too large", path,
                          lk_data_shape_str(ndim, shape, sb, sizeof sb));
    }
    size_t header = 4 + (size_t)ndim * 4, payload = (size_t)n * fsize;
    /* A plain file's size is known up front: refuse a truncated one before
     * allocating what its header claims. */
    if (!st && gzdirect(g)) {
        struct stat sbuf;
        if (stat(path, &sbuf) == 0 && (uint64_t)sbuf.st_size < header + payload)
            st = lk_error(LK_STATUS_IO, "%s: truncated: header says %s %s = %zu bytes of data, the file has %lld",
                          path, tname, lk_data_shape_str(ndim, shape, sb, sizeof sb), payload,
                          (long long)sbuf.st_size - (long long)header);
    } else if (!st) {
        /* gzip: deflate expands at most 1032:1, so a header claiming more
         * than the compressed file could hold is corrupt; refuse it before
         * allocating (found by fuzzing). */
        struct stat sbuf;
        if (stat(path, &sbuf) == 0 && (double)(header + payload) > 1032.0 * (double)sbuf.st_size + 64.0)
            st = lk_error(LK_STATUS_IO,
                          "%s: truncated or corrupt: header says %s %s = %zu bytes of data, more than a gzip file of "
                          "%lld bytes can hold",
                          path, tname, lk_data_shape_str(ndim, shape, sb, sizeof sb), payload, (long long)sbuf.st_size);
    }
    if (!st) st = lk__array_alloc_uninit(out, dt, ndim, shape);
    if (!st) {
        if (fsize == lk_data_dtype_size(dt)) {
            st = gz_read_exact(g, path, out->data, payload, header);
            if (!st) swap_bytes(out->data, (size_t)n, fsize);
        } else {
            /* i8/i16 widen to i32: read in chunks and convert. */
            uint8_t buf[1 << 14];
            int32_t *dst = out->data;
            size_t per = sizeof buf / fsize;
            for (size_t at = 0; !st && at < (size_t)n; at += per) {
                size_t k = (size_t)n - at < per ? (size_t)n - at : per;
                st = gz_read_exact(g, path, buf, k * fsize, header + at * fsize);
                for (size_t i = 0; !st && i < k; i++)
                    dst[at + i] = fsize == 1 ? (int32_t)(int8_t)buf[i]
                                             : (int32_t)(int16_t)(uint16_t)((buf[2 * i] << 8) | buf[2 * i + 1]);
            }
        }
    }
    gzclose(g);
    if (st) lk_array_release(out);
    return st;
}

static lk_status idx_write_body(const char *tmp, const void *ctx) {
    const lk_array *a = ctx;
    size_t n = strlen(tmp);
    bool gz = n > 7 && strstr(tmp, ".gz.tmp.") != NULL;
    uint8_t type = a->dtype == LK_U8 ? 0x08 : a->dtype == LK_I32 ? 0x0C : a->dtype == LK_F32 ? 0x0D : 0x0E;
    size_t es = lk_data_dtype_size(a->dtype);
    uint8_t head[4 + 4 * LK_MAX_DIMS] = {0, 0, type, (uint8_t)a->ndim};
    for (int i = 0; i < a->ndim; i++) {
        uint32_t d = (uint32_t)a->shape[i];
        head[4 + 4 * i] = (uint8_t)(d >> 24);
        head[5 + 4 * i] = (uint8_t)(d >> 16);
        head[6 + 4 * i] = (uint8_t)(d >> 8);
        head[7 + 4 * i] = (uint8_t)d;
    }
    gzFile g = gzopen(tmp, gz ? "wb6" : "wbT"); /* T: plain, no compression */
    if (!g) return lk_error(LK_STATUS_IO, "cannot create %s: %s", tmp, strerror(errno ? errno : ENOMEM));
    lk_status st = LK_STATUS_OK;
    size_t hn = 4 + 4 * (size_t)a->ndim;
    if (gzwrite(g, head, (unsigned)hn) != (int)hn) st = lk_error(LK_STATUS_IO, "%s: write failed", tmp);
    /* Big-endian elements, converted a block at a time. */
    uint8_t buf[1 << 14];
    size_t total = (size_t)lk_array_numel(a), per = sizeof buf / es;
    for (size_t at = 0; !st && at < total; at += per) {
        size_t k = total - at < per ? total - at : per;
        memcpy(buf, (const uint8_t *)a->data + at * es, k * es);
        swap_bytes(buf, k, es);
        if (gzwrite(g, buf, (unsigned)(k * es)) != (int)(k * es))
            st = lk_error(LK_STATUS_IO, "%s: write failed at element %zu (disk full?)", tmp, at);
    }
    if (gzclose(g) != Z_OK && !st) st = lk_error(LK_STATUS_IO, "%s: write failed on close (disk full?)", tmp);
    return st;
}

lk_status lk_idx_write(const char *path, const lk_array *a) {
    if (a->dtype != LK_U8 && a->dtype != LK_I32 && a->dtype != LK_F32 && a->dtype != LK_F64)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "idx write %s: dtype %d unsupported, expected u8, i32, f32 or f64",
                        path, (int)a->dtype);
    if (a->ndim < 1 || a->ndim > LK_MAX_DIMS || !a->data)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "idx write %s: %d dims, expected 1..%d with data", path, a->ndim,
                        LK_MAX_DIMS);
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] < 0 || a->shape[i] > (int64_t)UINT32_MAX)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "idx write %s: dim %d = %lld does not fit idx's u32", path, i,
                            (long long)a->shape[i]);
    return lk__write_atomic(path, idx_write_body, a);
}

/* ---- datasets ------------------------------------------------------------------- */

/* The pair, with labels checked against num_classes (0: unchecked) and,
 * when `side` > 0, the images' header against [N, side, side]: MNIST's
 * 28x28, whose consumers reshape to 784 pixels or [1, 28, 28]; another
 * geometry is reported here, with the file, not by a reshape or a matmul at
 * the first batch. Float data (idx types 0d, 0e) must be finite. */
static lk_status idx_pair_load(const char *images_path, const char *labels_path, int64_t num_classes, int64_t side,
                               lk_dataset **out) {
    *out = NULL;
    lk_array a[2];
    LK_TRY(lk_idx_read(images_path, &a[0]));
    char sb[160];
    lk_status st = LK_STATUS_OK;
    if (side > 0 && (a[0].ndim != 3 || a[0].shape[1] != side || a[0].shape[2] != side)) {
        char geo[64] = "";
        if (a[0].ndim == 3) snprintf(geo, sizeof geo, " (%lldx%lld images)", (long long)a[0].shape[1], (long long)a[0].shape[2]);
        st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                      "%s: the idx header's dimensions are %s%s; MNIST-layout images (Fashion-MNIST, MNIST) are "
                      "%lldx%lld: expected [N, %lld, %lld]",
                      images_path, lk_data_shape_str(a[0].ndim, a[0].shape, sb, sizeof sb), geo, (long long)side,
                      (long long)side, (long long)side, (long long)side);
    }
    if (!st) st = lk__finite_check(&a[0], images_path);
    if (st) {
        lk_array_release(&a[0]);
        return st;
    }
    st = lk_idx_read(labels_path, &a[1]);
    if (!st) st = lk__finite_check(&a[1], labels_path);
    if (st) {
        lk_array_release(&a[0]);
        lk_array_release(&a[1]);
        return st;
    }
    if (a[1].ndim != 1 || a[0].shape[0] != a[1].shape[0]) {
        char s0[160], s1[160];
        st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                      "idx pair: %s has shape %s and %s has shape %s; expected N images and N labels of shape [N]",
                      images_path, lk_data_shape_str(a[0].ndim, a[0].shape, s0, sizeof s0), labels_path,
                      lk_data_shape_str(a[1].ndim, a[1].shape, s1, sizeof s1));
    }
    if (!st) st = lk__labels_check(&a[1], num_classes, labels_path);
    if (!st) st = lk_dataset_from_arrays(2, a, NULL, false, out);
    lk_array_release(&a[0]);
    lk_array_release(&a[1]);
    return st;
}

lk_status lk_dataset_idx_pair_create(const char *images_path, const char *labels_path, lk_dataset **out) {
    return idx_pair_load(images_path, labels_path, 0, 0, out);
}

/* What cannot be read when a look into `dir` failed with *err: the
 * directory itself when it is the culprit (no search permission, not a
 * directory), else the file. */
static const char *culprit(const char *dir, const char *file, int *err) {
    struct stat s;
    if (stat(dir, &s) != 0) {
        if (errno == ENOENT) return file;
        *err = errno;
        return dir;
    }
    if (!S_ISDIR(s.st_mode)) {
        *err = ENOTDIR;
        return dir;
    }
    if (access(dir, X_OK) != 0) {
        *err = errno;
        return dir;
    }
    return file;
}

/* Finds "<dir>/<base>" or "<dir>/<base>.gz"; appends each try to `tried`.
 * 1: found (in `found`); 0: neither is there; -1: a look failed for
 * another reason than absence (permissions, not a directory): *err holds
 * it and `found` the path it failed on. Only ENOENT means "not there":
 * a directory that exists but cannot be read is reported as such, never
 * as a dataset to install. */
static int find_file(const char *dir, const char *base, char *found, size_t n, char *tried, size_t tn, int *err) {
    static const char *const ext[] = {".gz", ""};
    for (int e = 0; e < 2; e++) {
        if (snprintf(found, n, "%s/%s%s", dir, base, ext[e]) >= (int)n) continue;
        struct stat s;
        if (stat(found, &s) == 0) {
            if (S_ISREG(s.st_mode)) return 1;
        } else if (errno != ENOENT) {
            *err = errno;
            return -1;
        }
        size_t k = strlen(tried);
        if (k + 4 < tn && snprintf(tried + k, tn - k, "%s%s", k ? ", " : "", found) >= (int)(tn - k))
            tried[tn - 1] = 0;
    }
    return 0;
}

lk_status lk__mnist_locate(const char *root, const char *split, char *img, char *lab, size_t size, char *dir_used,
                           size_t dir_size, const char **from) {
    const char *prefix;
    if (!split || !strcmp(split, "train")) prefix = "train";
    else if (!strcmp(split, "test") || !strcmp(split, "t10k")) prefix = "t10k";
    else return lk_error(LK_STATUS_INVALID_ARGUMENT, "mnist: split '%s', expected 'train' or 'test'", split);
    /* Where to look, each with the setting it comes from: a root given
     * wins over LK_DATA_ROOT, which wins over the Debian package's place. */
    char dirs[3][PATH_MAX];
    const char *froms[3];
    int ndirs = 0;
    if (root && *root) {
        snprintf(dirs[ndirs], PATH_MAX, "%s", root);
        froms[ndirs++] = "data.init_args.root";
    } else {
        const char *env = lk_env_is_set("LK_DATA_ROOT") ? getenv("LK_DATA_ROOT") : NULL;
        if (env) {
            snprintf(dirs[ndirs], PATH_MAX, "%s", env);
            froms[ndirs++] = "LK_DATA_ROOT";
            snprintf(dirs[ndirs], PATH_MAX, "%.*s/fashion-mnist", PATH_MAX - 20, env);
            froms[ndirs++] = "LK_DATA_ROOT";
        }
        snprintf(dirs[ndirs], PATH_MAX, "/usr/share/datasets/fashion-mnist");
        froms[ndirs++] = "default";
    }
    char img_base[64], lab_base[64], tried[4096] = "";
    snprintf(img_base, sizeof img_base, "%s-images-idx3-ubyte", prefix);
    snprintf(lab_base, sizeof lab_base, "%s-labels-idx1-ubyte", prefix);
    for (int d = 0; d < ndirs; d++) {
        int err = 0, fi = find_file(dirs[d], img_base, img, size, tried, sizeof tried, &err);
        int fl = fi == 1 ? find_file(dirs[d], lab_base, lab, size, tried, sizeof tried, &err) : 0;
        if (fi < 0 || fl < 0) {
            /* A place the user pointed at that cannot be read ends the
             * search: falling through to another copy would train on data
             * they did not ask for. */
            const char *what = culprit(dirs[d], fi < 0 ? img : lab, &err);
            bool def = !strcmp(froms[d], "default");
            return lk_error(LK_STATUS_IO, "mnist %s split: cannot read %s: %s (%s%s)", prefix, what, strerror(err),
                            def ? "the default directory" : "from ", def ? "" : froms[d]);
        }
        if (fi == 1 && fl == 1) {
            if (dir_used) snprintf(dir_used, dir_size, "%s", dirs[d]);
            if (from) *from = froms[d];
            return LK_STATUS_OK;
        }
    }
    return lk_error(LK_STATUS_IO,
                    "mnist %s split not found; tried %s (install dataset-fashion-mnist, set LK_DATA_ROOT, or pass "
                    "the directory holding %s[.gz])",
                    prefix, tried, img_base);
}

lk_status lk__dataset_mnist_create_from(const char *root, const char *split, lk_dataset **out, char *dir_used,
                                        size_t dir_size, const char **from) {
    *out = NULL;
    char img[PATH_MAX + 64], lab[PATH_MAX + 64];
    LK_TRY(lk__mnist_locate(root, split, img, lab, sizeof img, dir_used, dir_size, from));
    return idx_pair_load(img, lab, 10, 28, out); /* MNIST and Fashion-MNIST: 10 classes of 28x28 */
}

lk_status lk_dataset_mnist_create(const char *root, const char *split, lk_dataset **out) {
    return lk__dataset_mnist_create_from(root, split, out, NULL, 0, NULL);
}

lk_status lk_data_mnist_download(const char *root, const char *base_url, long timeout_s) {
    static const char *const files[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    if (!base_url) base_url = LK_FASHION_MNIST_URL;
    size_t bl = strlen(base_url);
    const char *sep = bl && base_url[bl - 1] == '/' ? "" : "/";
    for (int i = 0; i < 4; i++) {
        char dest[PATH_MAX], url[PATH_MAX];
        if (snprintf(dest, sizeof dest, "%s/%s", root, files[i]) >= (int)sizeof dest ||
            snprintf(url, sizeof url, "%s%s%s", base_url, sep, files[i]) >= (int)sizeof url)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "mnist download: root or URL too long");
        struct stat sb;
        int rc = stat(dest, &sb);
        if (rc == 0 && S_ISREG(sb.st_mode)) continue;
        if (rc != 0 && errno != ENOENT) { /* there but unreadable: say so instead of downloading over it */
            int err = errno;
            const char *what = culprit(root, dest, &err);
            return lk_error(LK_STATUS_IO, "mnist download: cannot read %s: %s", what, strerror(err));
        }
        LK_TRY(lk_data_download(url, dest, timeout_s));
        /* A proxy's error page saved as data would fail much later: check now. */
        lk_array a;
        lk_status st = lk_idx_read(dest, &a);
        lk_array_release(&a);
        if (st) {
            char msg[1200];
            snprintf(msg, sizeof msg, "%s", lk_last_error());
            unlink(dest);
            return lk_error(st, "mnist download: %s is not valid idx data (%s); removed it", url, msg);
        }
    }
    return LK_STATUS_OK;
}

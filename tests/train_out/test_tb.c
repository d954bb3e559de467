/* train_out: the TensorBoardLogger's event file, read back by a decoder
 * written here independently of src/train/logger_tb.c (bit-at-a-time
 * CRC32C, its own varint and wire-type parsing), and by tools/tb_read.py
 * under /usr/bin/python3 when that exists. Both check every CRC. */
#include <dirent.h>

#include "out_test.h"

/* Bit-at-a-time CRC32C: deliberately not the library's table. */
static uint32_t ref_crc32c(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}
static uint32_t ref_mask(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }
static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void crc_vectors(void) {
    CHECK(lk_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(ref_crc32c((const unsigned char *)"123456789", 9) == 0xE3069283u);
    CHECK(lk_crc32c(0, "", 0) == 0);
    /* incremental == one shot */
    CHECK(lk_crc32c(lk_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u);
    /* RFC 3720 B.4: 32 bytes of zeros */
    unsigned char z[32] = {0};
    CHECK(lk_crc32c(0, z, 32) == 0x8A9136AAu);
    CHECK(lk_crc32c_mask(0xE3069283u) == ref_mask(0xE3069283u));
}

/* A decoded scalar or text value. */
typedef struct {
    int64_t step;
    char tag[64];
    float value;
    int is_text;
    double wall;
} scalar;

typedef struct {
    const unsigned char *p, *end;
    int bad;
} rd;

static uint64_t rd_varint(rd *r) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->p >= r->end) break;
        unsigned char b = *r->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return v;
    }
    r->bad = 1;
    return 0;
}

/* Next field: number, wire type, and for LEN/fixed the bytes. */
static int rd_field(rd *r, int *num, int *wt, uint64_t *v, rd *sub) {
    if (r->p >= r->end || r->bad) return 0;
    uint64_t key = rd_varint(r);
    *num = (int)(key >> 3);
    *wt = (int)(key & 7);
    size_t n = 0;
    switch (*wt) {
    case 0: *v = rd_varint(r); return !r->bad;
    case 1: n = 8; break;
    case 5: n = 4; break;
    case 2: n = (size_t)rd_varint(r); break;
    default: r->bad = 1; return 0;
    }
    if ((size_t)(r->end - r->p) < n) {
        r->bad = 1;
        return 0;
    }
    *sub = (rd){r->p, r->p + n, 0};
    if (*wt != 2) *v = le(r->p, (int)n);
    r->p += n;
    return 1;
}

/* Reads the whole file: returns the number of scalars (-1 on any error). */
static int decode_events(const char *path, scalar *out, int max, char *version, size_t vsize) {
    size_t len;
    unsigned char *blob = (unsigned char *)out_read_file(path, &len);
    if (!blob) return -1;
    int count = 0, records = 0;
    size_t pos = 0;
    while (pos < len) {
        if (len - pos < 12) goto bad;
        uint64_t n = le(blob + pos, 8);
        if ((uint32_t)le(blob + pos + 8, 4) != ref_mask(ref_crc32c(blob + pos, 8))) goto bad;
        if (len - pos - 12 < n + 4) goto bad;
        const unsigned char *data = blob + pos + 12;
        if ((uint32_t)le(data + n, 4) != ref_mask(ref_crc32c(data, n))) goto bad;
        pos += 12 + n + 4;
        rd ev = {data, data + n, 0}, sub;
        int num, wt;
        uint64_t v;
        int64_t step = 0;
        double wall = 0;
        int first = count;
        while (rd_field(&ev, &num, &wt, &v, &sub)) {
            if (num == 1 && wt == 1) memcpy(&wall, &v, 8);
            else if (num == 2 && wt == 0) step = (int64_t)v;
            else if (num == 3 && wt == 2) snprintf(version, vsize, "%.*s", (int)(sub.end - sub.p), sub.p);
            else if (num == 5 && wt == 2) {
                rd val;
                while (rd_field(&sub, &num, &wt, &v, &val)) {
                    if (num != 1 || wt != 2 || count >= max) continue;
                    scalar *s = &out[count++];
                    memset(s, 0, sizeof *s);
                    rd f;
                    while (rd_field(&val, &num, &wt, &v, &f)) {
                        if (num == 1 && wt == 2) snprintf(s->tag, sizeof s->tag, "%.*s", (int)(f.end - f.p), f.p);
                        else if (num == 2 && wt == 5) {
                            uint32_t u = (uint32_t)v;
                            memcpy(&s->value, &u, 4);
                        } else if (num == 8 && wt == 2) s->is_text = 1;
                    }
                    if (val.bad) goto bad;
                }
                if (sub.bad) goto bad;
            }
        }
        if (ev.bad) goto bad;
        for (int i = first; i < count; i++) out[i].step = step, out[i].wall = wall;
        records++;
        if (records == 1 && wall < 1e9) goto bad;
    }
    free(blob);
    return count;
bad:
    free(blob);
    return -1;
}

static int find_event_file(const char *dir, char *path, size_t size) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) {
            snprintf(path, size, "%s/%s", dir, e->d_name);
            found++;
        }
    closedir(d);
    return found;
}

static const char *names1[] = {"train_loss", "epoch"};
static const double vals1[] = {0.693147, 0};
static const char *names2[] = {"val_loss", "val_acc", "epoch", "lr-Adam"};
static const double vals2[] = {0.25, 0.8853, 1, 1e-3};

/* Writes the standard sample: hparams, two logging calls, a big step and a
 * negative one. Returns the event file path in `path`. */
static void write_sample(const char *root, char *path, size_t size) {
    lk_logger *tb = NULL;
    CHECK_OK(lk_tb_logger_create_versioned(root, NULL, -1, &tb));
    if (!tb) return;
    snprintf(path, size, "%s", lk_tb_logger_path(tb));
    CHECK_OK(lk_logger_log_hyperparams(tb, "model:\n  lr: 0.001\n"));
    CHECK_OK(lk_logger_log_metrics(tb, 49, names1, vals1, 2));
    CHECK_OK(lk_logger_log_metrics(tb, 215, names2, vals2, 4));
    double big = 3.5;
    CHECK_OK(lk_logger_log_metrics(tb, (int64_t)1 << 40, names1, &big, 1));
    CHECK_OK(lk_logger_log_metrics(tb, -1, names1, &big, 1));
    CHECK_OK(lk_logger_finalize(tb, "success"));
    lk_logger_free(tb);
}

static void event_file(void) {
    char root[256], path[LK_LOG_DIR_MAX + 256], found[LK_LOG_DIR_MAX + 256], want[512];
    out_tmpdir(root, sizeof root, "tb");
    write_sample(root, path, sizeof path);
    snprintf(want, sizeof want, "%s/lightning_logs/version_0", root);
    CHECK(find_event_file(want, found, sizeof found) == 1);
    CHECK_STR(found, path);
    char host[256] = "";
    gethostname(host, sizeof host);
    snprintf(want, sizeof want, ".%s.%ld.", host, (long)getpid());
    CHECK_MSG(strstr(path, want) != NULL, "%s lacks %s", path, want);
    scalar s[16];
    char version[64] = "";
    int n = decode_events(path, s, 16, version, sizeof version);
    CHECK(n == 9);
    CHECK_STR(version, "brain.Event:2");
    if (n != 9) return;
    CHECK(s[0].is_text && !strcmp(s[0].tag, "hparams") && s[0].step == 0);
    for (int i = 0; i < 2; i++) {
        CHECK(s[1 + i].step == 49 && !strcmp(s[1 + i].tag, names1[i]) && s[1 + i].value == (float)vals1[i]);
        CHECK(s[1 + i].wall > 1.6e9);
    }
    for (int i = 0; i < 4; i++)
        CHECK(s[3 + i].step == 215 && !strcmp(s[3 + i].tag, names2[i]) && s[3 + i].value == (float)vals2[i]);
    CHECK(s[7].step == (int64_t)1 << 40 && s[7].value == 3.5f);
    CHECK(s[8].step == -1 && !strcmp(s[8].tag, "train_loss"));
    /* the decoder is not fooled by a flipped bit anywhere in the data */
    size_t len;
    char *blob = out_read_file(path, &len);
    for (size_t at = 0; blob && at < len; at += 7) {
        blob[at] ^= 0x10;
        FILE *f = fopen(path, "wb");
        fwrite(blob, 1, len, f);
        fclose(f);
        CHECK_MSG(decode_events(path, s, 16, version, sizeof version) < 0, "flip at byte %zu not detected", at);
        blob[at] ^= 0x10;
    }
    free(blob);
    out_rm_rf(root);
}

/* tools/tb_read.py: CRC32C and protobuf in Python, from the format's docs. */
static void python_reader(void) {
    if (access("/usr/bin/python3", X_OK) != 0) {
        printf("skipped: no /usr/bin/python3\n");
        return;
    }
    char root[256], path[LK_LOG_DIR_MAX + 256], cmd[LK_LOG_DIR_MAX + 512];
    out_tmpdir(root, sizeof root, "tbpy");
    write_sample(root, path, sizeof path);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tools/tb_read.py '%s' 2>&1", LK_SOURCE_DIR, path);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p) return;
    char out[4096] = "";
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    CHECK(pclose(p) == 0);
    CHECK_STR(out, "file_version\tbrain.Event:2\n"
                   "0\thparams\ttext:26\n"
                   "49\ttrain_loss\t0.693147\n"
                   "49\tepoch\t0\n"
                   "215\tval_loss\t0.25\n"
                   "215\tval_acc\t0.8853\n"
                   "215\tepoch\t1\n"
                   "215\tlr-Adam\t0.001\n"
                   "1099511627776\ttrain_loss\t3.5\n"
                   "-1\ttrain_loss\t3.5\n");
    /* and it notices corruption */
    size_t len;
    char *blob = out_read_file(path, &len);
    if (blob) {
        blob[len - 3] ^= 1;
        FILE *f = fopen(path, "wb");
        fwrite(blob, 1, len, f);
        fclose(f);
        free(blob);
        p = popen(cmd, "r");
        n = fread(out, 1, sizeof out - 1, p);
        out[n] = 0;
        CHECK(pclose(p) != 0);
        CHECK(strstr(out, "CRC mismatch") != NULL);
    }
    out_rm_rf(root);
}

/* TensorBoard's own loader, where it is installed for /usr/bin/python3. */
static void tensorboard_reader(void) {
    if (system("/usr/bin/python3 -c 'import tensorboard' >/dev/null 2>&1") != 0) {
        printf("skipped: tensorboard is not importable by /usr/bin/python3\n");
        return;
    }
    char root[256], path[LK_LOG_DIR_MAX + 256], cmd[16384];
    out_tmpdir(root, sizeof root, "tbtb");
    write_sample(root, path, sizeof path);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s/tools/tb_read.py --tensorboard '%s' > '%s/a' && "
             "/usr/bin/python3 %s/tools/tb_read.py '%s' > '%s/b' && cmp '%s/a' '%s/b'",
             LK_SOURCE_DIR, path, root, LK_SOURCE_DIR, path, root, root, root);
    CHECK_MSG(system(cmd) == 0, "TensorBoard's reader disagrees: %s", cmd);
    out_rm_rf(root);
}

static void bad_dir(void) {
    lk_logger *tb = NULL;
    CHECK_ERR(lk_tb_logger_create("/proc/definitely/not/here", &tb), LK_STATUS_IO, "/proc/definitely");
    CHECK(tb == NULL);
    CHECK_ERR(lk_tb_logger_create("", &tb), LK_STATUS_INVALID_ARGUMENT, "empty");
}

LK_TEST_MAIN(LK_TEST_CASE(crc_vectors), LK_TEST_CASE(event_file), LK_TEST_CASE(python_reader),
             LK_TEST_CASE(tensorboard_reader), LK_TEST_CASE(bad_dir))

/* The TensorBoardLogger: scalar summaries in a TensorFlow event file, with no
 * protobuf or TensorFlow dependency. The file is a sequence of TFRecords
 * (uint64 length LE, masked CRC32C of the length, the bytes, masked CRC32C
 * of the bytes); each record is a serialized tensorflow.Event, encoded here
 * by hand:
 *   Event        { double wall_time = 1; int64 step = 2;
 *                  string file_version = 3; Summary summary = 5; }
 *   Summary      { repeated Value value = 1; }
 *   Value        { string tag = 1; float simple_value = 2;
 *                  TensorProto tensor = 8; SummaryMetadata metadata = 9; }
 * Hyperparameters go in as a text summary (the text plugin's tensor of
 * DT_STRING) so TensorBoard's Text tab shows the merged config. wall_time
 * is the real clock, which TensorBoard plots against; it orders nothing. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "train/loggers.h"

/* ------------------------------------------------------------------------
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78), byte-wise table
 * ---------------------------------------------------------------------- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[i] = c;
    }
}

uint32_t lk_crc32c(uint32_t crc, const void *data, size_t len) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    while (len--) crc = crc_table[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

uint32_t lk_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ------------------------------------------------------------------------
 * Protobuf wire format, by hand
 * ---------------------------------------------------------------------- */

typedef struct {
    unsigned char *p;
    size_t len, cap;
    int oom;
} pb;

static void pb_bytes(pb *b, const void *s, size_t n) {
    if (b->oom || n == 0) return;
    if (lk_vec_reserve(b->p, b->cap, b->len + n, 256)) {
        b->oom = 1;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void pb_varint(pb *b, uint64_t v) {
    unsigned char t[10];
    int n = 0;
    do {
        t[n] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v) t[n] |= 0x80;
        n++;
    } while (v);
    pb_bytes(b, t, (size_t)n);
}

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };

static void pb_key(pb *b, int field, int wt) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wt); }

static void pb_le(pb *b, uint64_t v, int n) {
    unsigned char t[8];
    for (int i = 0; i < n; i++) t[i] = (unsigned char)(v >> (8 * i));
    pb_bytes(b, t, (size_t)n);
}

static void pb_double(pb *b, int field, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    pb_key(b, field, WT_FIXED64);
    pb_le(b, u, 8);
}

static void pb_float(pb *b, int field, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    pb_key(b, field, WT_FIXED32);
    pb_le(b, u, 4);
}

static void pb_int64(pb *b, int field, int64_t v) {
    pb_key(b, field, WT_VARINT);
    pb_varint(b, (uint64_t)v); /* negative int64: ten bytes, two's complement */
}

static void pb_lenbytes(pb *b, int field, const void *s, size_t n) {
    pb_key(b, field, WT_LEN);
    pb_varint(b, n);
    pb_bytes(b, s, n);
}

static void pb_string(pb *b, int field, const char *s) { pb_lenbytes(b, field, s, strlen(s)); }

/* Appends a nested message: key, length, body; then frees the body. */
static void pb_message(pb *b, int field, pb *body) {
    if (body->oom) b->oom = 1;
    pb_lenbytes(b, field, body->p, body->len);
    lk_free(body->p);
    *body = (pb){0};
}

/* ------------------------------------------------------------------------
 * The logger
 * ---------------------------------------------------------------------- */

typedef struct {
    lk_logger base;
    char path[LK_LOG_DIR_MAX + 256];
    FILE *f;
} tb_logger;

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Frames `event` as one TFRecord, writes and flushes it. */
static lk_status write_record(tb_logger *t, pb *event) {
    if (event->oom) {
        lk_free(event->p);
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "tensorboard logger: cannot encode an event for %s", t->path);
    }
    unsigned char head[12], tail[4];
    uint64_t n = event->len;
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(n >> (8 * i));
    uint32_t c = lk_crc32c_mask(lk_crc32c(0, head, 8));
    for (int i = 0; i < 4; i++) head[8 + i] = (unsigned char)(c >> (8 * i));
    c = lk_crc32c_mask(lk_crc32c(0, event->p, event->len));
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(c >> (8 * i));
    int ok = fwrite(head, 1, 12, t->f) == 12 && fwrite(event->p, 1, event->len, t->f) == event->len &&
             fwrite(tail, 1, 4, t->f) == 4 && fflush(t->f) == 0;
    lk_free(event->p);
    *event = (pb){0};
    if (!ok) return lk_error(LK_STATUS_IO, "cannot write %s: %s", t->path, strerror(errno));
    return LK_STATUS_OK;
}

static lk_status tb_metrics(lk_logger *lg, int64_t step, const char *const *names, const double *values, int n) {
    tb_logger *t = (tb_logger *)lg;
    pb summary = {0}, value = {0}, event = {0};
    for (int i = 0; i < n; i++) {
        pb_string(&value, 1, names[i]);
        pb_float(&value, 2, (float)values[i]);
        pb_message(&summary, 1, &value);
    }
    pb_double(&event, 1, wall_time());
    pb_int64(&event, 2, step);
    pb_message(&event, 5, &summary);
    return write_record(t, &event);
}

static lk_status tb_hparams(lk_logger *lg, const char *yaml) {
    tb_logger *t = (tb_logger *)lg;
    /* The text plugin renders markdown: a fenced block keeps the YAML as is. */
    size_t n = strlen(yaml);
    char *md = lk_malloc(n + 16);
    if (!md) return lk_last_status();
    int len = snprintf(md, n + 16, "```\n%s%s```", yaml, n && yaml[n - 1] != '\n' ? "\n" : "");
    pb plugin = {0}, meta = {0}, shape = {0}, tensor = {0}, value = {0}, summary = {0}, event = {0};
    pb_string(&plugin, 1, "text");
    pb_message(&meta, 1, &plugin);
    pb_key(&tensor, 1, WT_VARINT);
    pb_varint(&tensor, 7); /* DT_STRING */
    pb_message(&tensor, 2, &shape); /* a scalar: empty TensorShapeProto */
    pb_lenbytes(&tensor, 8, md, (size_t)len);
    lk_free(md);
    pb_string(&value, 1, "hparams");
    pb_message(&value, 8, &tensor);
    pb_message(&value, 9, &meta);
    pb_message(&summary, 1, &value);
    pb_double(&event, 1, wall_time());
    pb_int64(&event, 2, 0);
    pb_message(&event, 5, &summary);
    return write_record(t, &event);
}

/* One Summary of the hparams plugin (what torch.utils.tensorboard's
 * hparams() writes): Value{tag, metadata{plugin_data{"hparams", content}}},
 * content being an HParamsPluginData whose field `which` (2 experiment,
 * 3 session_start_info, 4 session_end_info) holds `body`. */
static lk_status hparams_summary(tb_logger *t, const char *tag, int which, pb *body) {
    pb content = {0}, plugin = {0}, meta = {0}, value = {0}, summary = {0}, event = {0};
    pb_message(&content, which, body); /* version 0: the default, not written */
    pb_string(&plugin, 1, "hparams");
    pb_message(&plugin, 2, &content);
    pb_message(&meta, 1, &plugin);
    pb_string(&value, 1, tag);
    pb_message(&value, 9, &meta);
    pb_message(&summary, 1, &value);
    pb_double(&event, 1, wall_time());
    pb_int64(&event, 2, 0);
    pb_message(&event, 5, &summary);
    return write_record(t, &event);
}

lk_status lk_tb_logger_log_hparams_session(lk_logger *lg, const char *flat_yaml) {
    tb_logger *t = (tb_logger *)lg;
    /* hp_metric -1 at step 0, as Lightning's default_hp_metric: the metric the HParams tab lists */
    const char *hp_name = "hp_metric";
    double hp_value = -1;
    LK_TRY(tb_metrics(lg, 0, &hp_name, &hp_value, 1));
    pb infos = {0}, start = {0}, info = {0}, entry = {0}, val = {0}, name = {0}, metric = {0};
    char line[1024];
    for (const char *p = flat_yaml ? flat_yaml : ""; *p;) {
        size_t n = strcspn(p, "\n");
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), p);
        p += n + (p[n] == '\n');
        char *colon = strstr(line, ": ");
        if (!colon || line[0] == ' ' || line[0] == '#') continue; /* "key: value" lines only */
        *colon = 0;
        const char *key = line, *v = colon + 2;
        char *end;
        double x = strtod(v, &end);
        bool number = end != v && !*end, boolean = !strcmp(v, "true") || !strcmp(v, "false");
        /* google.protobuf.Value: number_value 2, string_value 3, bool_value 4;
         * HParamInfo.type: DATA_TYPE_STRING 1, BOOL 2, FLOAT64 3 */
        if (number) pb_double(&val, 2, x);
        else if (boolean) pb_key(&val, 4, WT_VARINT), pb_varint(&val, v[0] == 't');
        else pb_string(&val, 3, v);
        pb_string(&entry, 1, key);
        pb_message(&entry, 2, &val);
        pb_message(&start, 1, &entry); /* SessionStartInfo.hparams: map<string, Value> */
        pb_string(&info, 1, key);
        pb_key(&info, 4, WT_VARINT);
        pb_varint(&info, number ? 3 : boolean ? 2 : 1);
        pb_message(&infos, 4, &info); /* Experiment.hparam_infos */
    }
    pb_string(&name, 2, hp_name); /* MetricName.tag */
    pb_message(&metric, 1, &name);
    pb_message(&infos, 5, &metric); /* Experiment.metric_infos */
    pb_double(&start, 5, wall_time()); /* SessionStartInfo.start_time_secs */
    pb end = {0};
    pb_key(&end, 1, WT_VARINT);
    pb_varint(&end, 1); /* SessionEndInfo.status: STATUS_SUCCESS */
    lk_status st = hparams_summary(t, "_hparams_/experiment", 2, &infos);
    if (!st) st = hparams_summary(t, "_hparams_/session_start_info", 3, &start);
    if (!st) st = hparams_summary(t, "_hparams_/session_end_info", 4, &end);
    lk_free(infos.p), lk_free(start.p), lk_free(end.p);
    return st;
}

static lk_status tb_flush(lk_logger *lg) {
    tb_logger *t = (tb_logger *)lg;
    if (fflush(t->f) != 0 || fsync(fileno(t->f)) != 0)
        return lk_error(LK_STATUS_IO, "cannot flush %s: %s", t->path, strerror(errno));
    return LK_STATUS_OK;
}

static lk_status tb_finalize(lk_logger *lg, const char *status) {
    tb_logger *t = (tb_logger *)lg;
    lk_status st = tb_flush(lg);
    if (fclose(t->f) != 0 && !st) st = lk_error(LK_STATUS_IO, "cannot close %s: %s", t->path, strerror(errno));
    t->f = NULL;
    return st;
}

static void tb_destroy(lk_logger *lg) {
    tb_logger *t = (tb_logger *)lg;
    if (t->f) fclose(t->f);
    lk_free(t);
}

static const lk_logger_vtable tb_vt = {"tensorboard", tb_hparams, tb_metrics, tb_flush, tb_finalize, tb_destroy};

static atomic_int tb_uid;

static lk_status tb_create(const char *dir, int version, lk_logger **out) {
    tb_logger *t = lk_calloc(1, sizeof *t);
    if (!t) return lk_last_status();
    t->base.vt = &tb_vt;
    t->base.version = version;
    snprintf(t->base.log_dir, sizeof t->base.log_dir, "%s", dir);
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *h = host; *h; h++)
        if (*h == '/') *h = '_';
    /* PyTorch's SummaryWriter name; the trailing counter and O_EXCL keep two
     * loggers of one process in the same second apart. */
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 1000; tries++) {
        snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%010lld.%s.%ld.%d", dir, (long long)time(NULL), host,
                 (long)getpid(), atomic_fetch_add(&tb_uid, 1));
        fd = open(t->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(t->f = fdopen(fd, "wb"))) {
        lk_status st = lk_error(LK_STATUS_IO, "cannot create TensorBoard event file %s: %s", t->path, strerror(errno));
        if (fd >= 0) close(fd);
        lk_free(t);
        return st;
    }
    pb event = {0};
    pb_double(&event, 1, wall_time());
    pb_string(&event, 3, "brain.Event:2");
    lk_status st = write_record(t, &event);
    if (st) {
        tb_destroy(&t->base);
        return st;
    }
    *out = &t->base;
    return LK_STATUS_OK;
}

lk_status lk_tb_logger_create(const char *dir, lk_logger **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_tb_logger_create: out is NULL");
    *out = NULL;
    if (!dir || !dir[0]) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_tb_logger_create: empty directory");
    if (strlen(dir) >= LK_LOG_DIR_MAX)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "log directory too long: %.64s...", dir);
    LK_TRY(lk_file_mkdirs(dir));
    return tb_create(dir, -1, out);
}

lk_status lk_tb_logger_create_versioned(const char *root, const char *name, int version, lk_logger **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_tb_logger_create_versioned: out is NULL");
    *out = NULL;
    char dir[LK_LOG_DIR_MAX];
    int v;
    LK_TRY(lk_log_dir_resolve(root, name, version, dir, sizeof dir, &v));
    return tb_create(dir, v, out);
}

const char *lk_tb_logger_path(const lk_logger *tb) {
    return tb && tb->vt == &tb_vt ? ((const tb_logger *)tb)->path : "";
}

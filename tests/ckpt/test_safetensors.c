/* Safetensors I/O: round trips of every dtype (empty and 0-d tensors
 * included) checked by an independent reader written here (its own header
 * parse with cJSON, its own offset checks, its own bitwise CRC-32C of every
 * tensor), read_into with shape and dtype checks, every corruption class
 * giving a clear error that names the file and tensor, a changed byte
 * anywhere in the tensor data refused at open naming its tensor, files
 * without checksums opening with a note, random damage never crashing, and
 * the write fault hook leaving the previous file intact. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <unistd.h>

#include "lk_test.h"
#include "io/safetensors.h"

static char tmpdir[256];

static void setup(void) {
    if (tmpdir[0]) return;
    snprintf(tmpdir, sizeof tmpdir, "%s/lk_st_test_%d", LK_BUILD_DIR, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "cannot create %s\n", tmpdir);
}

static void teardown(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", tmpdir);
}

static const char *tpath(const char *name) {
    static char buf[8][512];
    static int k;
    setup();
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

static void write_all_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

/* ---- a reference set of tensors ------------------------------------------------ */

#define NT 16
typedef struct {
    char name[64];
    lk_dtype dt;
    int ndim;
    int64_t shape[4];
    unsigned char *data;
    size_t nbytes;
} ref_tensor;

static ref_tensor refs[NT];
static int nrefs;

static void make_refs(void) {
    if (nrefs) return;
    static const int64_t shapes[][5] = {/* ndim, dims */ {0}, {1, 5}, {2, 3, 4}, {1, 0}, {3, 2, 0, 3}, {2, 1, 1}};
    lk_rng r;
    lk_rng_init(&r, 7, LK_RNG_USER, 0, 0);
    for (int d = 0; d < LK_DTYPE_COUNT; d++) {
        for (int s = 0; s < 6 && nrefs < NT; s++) {
            if ((d + s) % 3) continue; /* a spread of (dtype, shape) pairs */
            ref_tensor *t = &refs[nrefs++];
            t->dt = (lk_dtype)d;
            t->ndim = (int)shapes[s][0];
            int64_t numel = 1;
            for (int i = 0; i < t->ndim; i++) numel *= (t->shape[i] = shapes[s][i + 1]);
            snprintf(t->name, sizeof t->name, "layer.%d.%s_%d", nrefs, lk_dtype_name(t->dt), s);
            t->nbytes = (size_t)numel * lk_dtype_size(t->dt);
            t->data = malloc(t->nbytes + 1);
            for (size_t i = 0; i < t->nbytes; i++) t->data[i] = (unsigned char)lk_rng_u32(&r);
            /* keep floats free of NaN payload surprises: not needed for raw bytes */
        }
    }
    /* every dtype at least once */
    for (int d = 0; d < LK_DTYPE_COUNT; d++) {
        bool seen = false;
        for (int i = 0; i < nrefs; i++) seen |= refs[i].dt == (lk_dtype)d;
        if (!seen && nrefs < NT) {
            ref_tensor *t = &refs[nrefs++];
            t->dt = (lk_dtype)d;
            t->ndim = 1;
            t->shape[0] = 3;
            snprintf(t->name, sizeof t->name, "extra.%s", lk_dtype_name(t->dt));
            t->nbytes = 3 * lk_dtype_size(t->dt);
            t->data = malloc(t->nbytes);
            for (size_t i = 0; i < t->nbytes; i++) t->data[i] = (unsigned char)lk_rng_u32(&r);
        }
    }
}

static const lk_st_meta ref_meta[] = {
    {"format", "pt"},
    {"epoch", "3"},
    {"config", "trainer:\n  max_epochs: 3\n  name: \"quoted \\\" and \\\\ back\"\n"},
    {"unicode", "héllo ✓"},
    {"empty", ""},
};
#define NMETA (int)(sizeof ref_meta / sizeof ref_meta[0])

static lk_status write_refs(const char *path) {
    make_refs();
    lk_st_entry e[NT];
    for (int i = 0; i < nrefs; i++)
        e[i] = (lk_st_entry){.name = refs[i].name, .dtype = refs[i].dt, .ndim = refs[i].ndim, .shape = refs[i].shape,
                             .data = refs[i].data};
    return lk_safetensors_write(path, e, nrefs, ref_meta, NMETA);
}

/* ---- the independent reader ------------------------------------------------------ */

/* CRC-32C one bit at a time, from the definition (reflected polynomial
 * 0x82F63B78, initial and final inversion): nothing shared with crc32c.c. */
static uint32_t crc32c_bitwise(const void *data, size_t n) {
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static const char *st_name(lk_dtype d) {
    static const char *n[] = {"F32", "F64", "BF16", "F16", "I32", "I64", "U8"};
    return n[d];
}

/* Parses the file bytes itself and checks them against refs and ref_meta. */
static void independent_check(const unsigned char *b, size_t len) {
    CHECK(len >= 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    CHECK(n % 8 == 0);
    CHECK(8 + n <= len);
    char *h = malloc(n + 1);
    memcpy(h, b + 8, n);
    h[n] = 0;
    size_t jl = strlen(h);
    while (jl && h[jl - 1] == ' ') jl--; /* padding: spaces only */
    CHECK(h[0] == '{' && h[jl - 1] == '}');
    cJSON *root = cJSON_Parse(h);
    CHECK(root != NULL);
    if (!root) {
        free(h);
        return;
    }
    size_t buflen = len - 8 - n;
    const unsigned char *buf = b + 8 + n;
    CHECK(cJSON_GetArraySize(root) == nrefs + 1);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    /* the caller's strings, then one checksum per tensor */
    CHECK(cJSON_IsObject(meta) && cJSON_GetArraySize(meta) == NMETA + nrefs);
    for (int i = 0; i < NMETA; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, ref_meta[i].key);
        CHECK(cJSON_IsString(v) && !strcmp(v->valuestring, ref_meta[i].value));
    }
    for (int i = 0; i < nrefs; i++) {
        char key[128], want[16];
        snprintf(key, sizeof key, "lk.crc32c.%.64s", refs[i].name);
        snprintf(want, sizeof want, "%08x", (unsigned)crc32c_bitwise(refs[i].data, refs[i].nbytes));
        cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
        CHECK_MSG(cJSON_IsString(v) && !strcmp(v->valuestring, want), "%s: %s, expected %s", key,
                  cJSON_IsString(v) ? v->valuestring : "missing", want);
    }
    /* coverage: every byte of the buffer belongs to exactly one tensor */
    unsigned char *owner = calloc(buflen + 1, 1);
    for (int i = 0; i < nrefs; i++) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(root, refs[i].name);
        CHECK(cJSON_IsObject(t));
        if (!t) continue;
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
        CHECK(cJSON_IsString(dt) && !strcmp(dt->valuestring, st_name(refs[i].dt)));
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
        CHECK(cJSON_GetArraySize(sh) == refs[i].ndim);
        for (int d = 0; d < refs[i].ndim && d < cJSON_GetArraySize(sh); d++)
            CHECK(cJSON_GetArrayItem(sh, d)->valuedouble == (double)refs[i].shape[d]);
        cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        CHECK(cJSON_GetArraySize(off) == 2);
        size_t b0 = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble, b1 = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        CHECK(b1 - b0 == refs[i].nbytes && b1 <= buflen);
        CHECK(b0 % lk_dtype_size(refs[i].dt) == 0); /* lockstep's writer keeps tensors aligned */
        if (b1 <= buflen && b1 >= b0) {
            CHECK(!refs[i].nbytes || !memcmp(buf + b0, refs[i].data, refs[i].nbytes));
            for (size_t k = b0; k < b1; k++) owner[k]++;
        }
    }
    for (size_t k = 0; k < buflen; k++) CHECK_MSG(owner[k] == 1, "byte %zu owned %d times", k, owner[k]);
    free(owner);
    cJSON_Delete(root);
    free(h);
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_round_trip(void) {
    const char *p = tpath("rt.safetensors");
    CHECK_OK(write_refs(p));
    size_t len = 0;
    unsigned char *b = read_all(p, &len);
    CHECK(b != NULL);
    if (b) independent_check(b, len);
    free(b);
    lk_st_file *f;
    CHECK_OK(lk_safetensors_open(p, &f));
    if (!f) return;
    CHECK(lk_safetensors_count(f) == nrefs);
    for (int i = 0; i < nrefs; i++) {
        const lk_st_info *in = lk_safetensors_find(f, refs[i].name);
        CHECK(in != NULL);
        if (!in) continue;
        CHECK(in->dtype == (int)refs[i].dt && !strcmp(in->dtype_name, st_name(refs[i].dt)));
        CHECK(in->ndim == refs[i].ndim && in->nbytes == refs[i].nbytes);
        for (int d = 0; d < in->ndim; d++) CHECK(in->shape[d] == refs[i].shape[d]);
        CHECK(!in->nbytes || !memcmp(in->data, refs[i].data, in->nbytes));
        CHECK((uintptr_t)in->data % in->elem_size == 0);
        /* and through read_into */
        lk_tensor *t = lk_tensor_empty(refs[i].dt, refs[i].ndim, refs[i].shape);
        CHECK_OK(lk_safetensors_read_into(f, refs[i].name, t));
        CHECK(!in->nbytes || !memcmp(t->data, refs[i].data, in->nbytes));
        lk_tensor_release(t);
    }
    /* file order is by element size, largest first */
    for (int i = 1; i < lk_safetensors_count(f); i++)
        CHECK(lk_safetensors_at(f, i - 1)->elem_size >= lk_safetensors_at(f, i)->elem_size);
    CHECK(lk_safetensors_meta_count(f) == NMETA);
    for (int i = 0; i < NMETA; i++) {
        CHECK(lk_safetensors_meta(f, ref_meta[i].key) && !strcmp(lk_safetensors_meta(f, ref_meta[i].key), ref_meta[i].value));
        CHECK(!strcmp(lk_safetensors_meta_key(f, i), ref_meta[i].key));
    }
    CHECK(lk_safetensors_meta(f, "nope") == NULL);
    /* the checksums were all checked, and are the reader's, not metadata */
    CHECK(lk_safetensors_verified(f) == nrefs);
    char ckey[128];
    snprintf(ckey, sizeof ckey, "lk.crc32c.%.64s", refs[0].name);
    CHECK(lk_safetensors_meta(f, ckey) == NULL);
    for (int i = 0; i < nrefs; i++) CHECK(lk_safetensors_at(f, i)->has_crc32c);
    lk_safetensors_close(f);
    lk_safetensors_close(NULL);

    /* no tensors, no metadata: the smallest valid file */
    p = tpath("empty.safetensors");
    CHECK_OK(lk_safetensors_write(p, NULL, 0, NULL, 0));
    CHECK_OK(lk_safetensors_open(p, &f));
    CHECK(lk_safetensors_count(f) == 0 && lk_safetensors_meta_count(f) == 0);
    lk_safetensors_close(f);
}

static void test_tensors_and_read_into(void) {
    const char *p = tpath("model.safetensors");
    lk_rng r;
    lk_rng_init(&r, 1, LK_RNG_USER, 0, 0);
    lk_tensor *w = lk_tensor_randn(&r, LK_SHAPE(4, 3), 0, 1);
    lk_tensor *wt = lk_transpose(w, 0, 1); /* [3, 4], not contiguous */
    lk_tensor *ids = lk_tensor_full(LK_I64, LK_SHAPE(2), 7);
    lk_tensor_set_name(w, "encoder.0.weight");
    lk_st_entry e[] = {{.name = "encoder.0.weight", .tensor = w}, {.name = "encoder.0.weight_t", .tensor = wt},
                       {.name = "ids", .tensor = ids}};
    CHECK_OK(lk_safetensors_write(p, e, 3, NULL, 0));
    lk_st_file *f;
    CHECK_OK(lk_safetensors_open(p, &f));
    if (!f) return;
    const lk_st_info *in;
    CHECK_OK(lk_safetensors_get(f, "encoder.0.weight_t", &in));
    CHECK(in->ndim == 2 && in->shape[0] == 3 && in->shape[1] == 4);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) CHECK(((const float *)in->data)[i * 4 + j] == ((float *)w->data)[j * 3 + i]);
    /* shape mismatch: the message names tensor, file and both shapes */
    lk_tensor *small = lk_tensor_zeros(LK_F32, LK_SHAPE(2, 3));
    char want[700];
    snprintf(want, sizeof want, "tensor 'encoder.0.weight' in %s has shape [4, 3], the model expects [2, 3]", p);
    CHECK_ERR(lk_safetensors_read_into(f, "encoder.0.weight", small), LK_STATUS_INVALID_ARGUMENT, want);
    lk_tensor *r3 = lk_tensor_zeros(LK_F32, LK_SHAPE(4, 3, 1));
    CHECK_ERR(lk_safetensors_read_into(f, "encoder.0.weight", r3), LK_STATUS_INVALID_ARGUMENT, "expects [4, 3, 1]");
    snprintf(want, sizeof want, "%s has no tensor 'encoder.0.weigth' (did you mean 'encoder.0.weight'?)", p);
    CHECK_ERR(lk_safetensors_read_into(f, "encoder.0.weigth", small), LK_STATUS_INVALID_ARGUMENT, want);
    /* dtype: floats convert, others must match */
    lk_tensor *d64 = lk_tensor_zeros(LK_F64, LK_SHAPE(4, 3));
    CHECK_OK(lk_safetensors_read_into(f, "encoder.0.weight", d64));
    for (int i = 0; i < 12; i++) CHECK(((double *)d64->data)[i] == (double)((float *)w->data)[i]);
    lk_tensor *i32 = lk_tensor_zeros(LK_I32, LK_SHAPE(2));
    CHECK_ERR(lk_safetensors_read_into(f, "ids", i32), LK_STATUS_INVALID_ARGUMENT, "has dtype I64, the model expects I32");
    lk_tensor *f2 = lk_tensor_zeros(LK_F32, LK_SHAPE(2));
    CHECK_ERR(lk_safetensors_read_into(f, "ids", f2), LK_STATUS_INVALID_ARGUMENT, "'ids'");
    /* into a strided destination */
    lk_tensor *dst = lk_tensor_zeros(LK_F32, LK_SHAPE(4, 3));
    lk_tensor *dstt = lk_transpose(dst, 0, 1); /* [3, 4] view */
    CHECK_OK(lk_safetensors_read_into(f, "encoder.0.weight_t", dstt));
    CHECK(!memcmp(dst->data, w->data, 12 * sizeof(float)));
    lk_safetensors_close(f);
    lk_tensor *objs[] = {w, wt, ids, small, r3, d64, i32, f2, dst, dstt};
    for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) lk_tensor_release(objs[i]);
}

static void test_write_errors(void) {
    float x = 1;
    int64_t one = 1;
    lk_st_entry dup[] = {{.name = "a", .dtype = LK_F32, .ndim = 1, .shape = &one, .data = &x},
                         {.name = "a", .dtype = LK_F32, .ndim = 1, .shape = &one, .data = &x}};
    const char *p = tpath("bad_write.safetensors");
    CHECK_ERR(lk_safetensors_write(p, dup, 2, NULL, 0), LK_STATUS_INVALID_ARGUMENT, "tensor name 'a' given twice");
    lk_st_entry res[] = {{.name = "__metadata__", .dtype = LK_F32, .ndim = 1, .shape = &one, .data = &x}};
    CHECK_ERR(lk_safetensors_write(p, res, 1, NULL, 0), LK_STATUS_INVALID_ARGUMENT, "reserved");
    lk_st_entry nodata[] = {{.name = "w", .dtype = LK_F32, .ndim = 1, .shape = &one, .data = NULL}};
    CHECK_ERR(lk_safetensors_write(p, nodata, 1, NULL, 0), LK_STATUS_INVALID_ARGUMENT, "tensor 'w' has no data");
    int64_t neg = -2;
    lk_st_entry negs[] = {{.name = "n", .dtype = LK_F32, .ndim = 1, .shape = &neg, .data = &x}};
    CHECK_ERR(lk_safetensors_write(p, negs, 1, NULL, 0), LK_STATUS_INVALID_ARGUMENT, "tensor 'n' has an invalid size -2");
    lk_st_meta m2[] = {{"k", "1"}, {"k", "2"}};
    CHECK_ERR(lk_safetensors_write(p, NULL, 0, m2, 2), LK_STATUS_INVALID_ARGUMENT, "metadata key 'k' given twice");
    lk_st_meta mc[] = {{"lk.crc32c.w", "00000000"}};
    CHECK_ERR(lk_safetensors_write(p, NULL, 0, mc, 1), LK_STATUS_INVALID_ARGUMENT,
              "metadata key 'lk.crc32c.w' uses the reserved prefix 'lk.crc32c.'");
    CHECK_ERR(lk_safetensors_write("/nonexistent/dir/x.safetensors", NULL, 0, NULL, 0), LK_STATUS_IO,
              "/nonexistent/dir/x.safetensors");
    CHECK(access(p, F_OK) != 0);
}

static int count_tmp_files(void) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

/* A failing disk (short write, then ENOSPC or EIO) at many points of the
 * write: the error names the file, the previous checkpoint is intact and
 * loadable, no temporary file is left behind. */
static void test_fault_hook(void) {
    const char *p = tpath("ckpt.safetensors");
    CHECK_OK(write_refs(p));
    size_t len0 = 0;
    unsigned char *before = read_all(p, &len0);
    /* a second, different version to attempt */
    float big[4096];
    for (int i = 0; i < 4096; i++) big[i] = (float)i;
    int64_t shape = 4096;
    lk_st_entry e[] = {{.name = "new.weight", .dtype = LK_F32, .ndim = 1, .shape = &shape, .data = big}};
    long long points[] = {0, 1, 7, 8, 100, 1000, 8000, 16383};
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
        for (int k = 0; k < 2; k++) {
            lk__safetensors_fail_after(points[i], k ? EIO : ENOSPC);
            lk_clear_error();
            lk_status st = lk_safetensors_write(p, e, 1, ref_meta, 1);
            lk__safetensors_fail_after(-1, 0);
            CHECK_MSG(st == LK_STATUS_IO, "fail after %lld: %s", points[i], lk_last_error());
            CHECK(strstr(lk_last_error(), k ? "Input/output error" : "No space left on device") != NULL);
            CHECK(strstr(lk_last_error(), p) != NULL);
            size_t len1;
            unsigned char *after = read_all(p, &len1);
            CHECK(after && len1 == len0 && !memcmp(before, after, len0));
            free(after);
            CHECK(count_tmp_files() == 0);
        }
    }
    lk_st_file *f;
    CHECK_OK(lk_safetensors_open(p, &f));
    CHECK(lk_safetensors_count(f) == nrefs);
    lk_safetensors_close(f);
    CHECK_OK(lk_safetensors_write(p, e, 1, NULL, 0)); /* the hook is off again */
    CHECK_OK(lk_safetensors_open(p, &f));
    CHECK(lk_safetensors_count(f) == 1 && lk_safetensors_find(f, "new.weight"));
    lk_safetensors_close(f);
    free(before);
}

/* Builds a file from a header text and `datalen` data bytes. */
static void craft(const char *path, const char *header, size_t datalen) {
    size_t hl = strlen(header), padded = (hl + 7) & ~(size_t)7;
    unsigned char *b = calloc(8 + padded + datalen + 1, 1);
    uint64_t n = padded;
    memcpy(b, &n, 8);
    memcpy(b + 8, header, hl);
    memset(b + 8 + hl, ' ', padded - hl);
    write_all_file(path, b, 8 + padded + datalen);
    free(b);
}

static void expect_open_error(const char *path, const char *needle, const char *needle2) {
    lk_st_file *f = (lk_st_file *)1;
    lk_clear_error();
    lk_status st = lk_safetensors_open(path, &f);
    CHECK_MSG(st == LK_STATUS_INVALID_ARGUMENT && f == NULL, "%s: expected an error, got %s", needle, lk_last_error());
    CHECK_MSG(strstr(lk_last_error(), path) != NULL, "message does not name the file: %s", lk_last_error());
    CHECK_MSG(strstr(lk_last_error(), needle) != NULL, "expected '%s' in: %s", needle, lk_last_error());
    if (needle2) CHECK_MSG(strstr(lk_last_error(), needle2) != NULL, "expected '%s' in: %s", needle2, lk_last_error());
    if (st == LK_STATUS_OK) lk_safetensors_close(f);
}

static void test_corruptions(void) {
    const char *p = tpath("corrupt.safetensors");
    /* truncated: a valid file cut short */
    const char *good = tpath("good.safetensors");
    CHECK_OK(write_refs(good));
    size_t len = 0;
    unsigned char *b = read_all(good, &len);
    write_all_file(p, b, len - 3);
    expect_open_error(p, "go past the end of the data", "truncated");
    write_all_file(p, b, 5);
    expect_open_error(p, "too short", NULL);
    write_all_file(p, b, 0);
    expect_open_error(p, "too short", NULL);
    write_all_file(p, b, 20);
    expect_open_error(p, "header length", "beyond the end of the file");
    /* header length far beyond the file */
    unsigned char hb[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    write_all_file(p, hb, 16);
    expect_open_error(p, "beyond the end of the file", NULL);
    /* trailing garbage after the last tensor */
    unsigned char *longer = calloc(len + 16, 1);
    memcpy(longer, b, len);
    write_all_file(p, longer, len + 16);
    expect_open_error(p, "16 bytes of data after the last tensor", NULL);
    free(longer);
    free(b);
    struct {
        const char *header;
        size_t datalen;
        const char *needle, *needle2;
    } cases[] = {
        {"{bad json", 0, "invalid JSON in the header", NULL},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}} x", 4, "unexpected bytes after the JSON", NULL},
        {"[1, 2]", 0, "not a JSON object", NULL},
        {"{\"w\": {\"dtype\": \"F128\", \"shape\": [1], \"data_offsets\": [0, 16]}}", 16, "tensor 'w' has unknown dtype 'F128'", "BF16"},
        {"{\"w\": {\"dtype\": 3, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "tensor 'w': 'dtype' must be a string", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 20, "tensor 'w': dtype F32 and shape [2, 3] need 24 bytes", "span 20"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4, "tensor 'w': data_offsets [0, 8] go past the end", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"v\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "overlaps tensor", "'v'"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"v\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", 12, "gap in the data before tensor 'v'", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8, "tensor 'w' appears twice", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4, "tensor 'w': shape[0] must be a non-negative integer", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4, "shape[0] must be a non-negative integer", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", 4, "tensor 'w': data_offsets [4, 0] end before they begin", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4, "tensor 'w': 'data_offsets' must be [begin, end]", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": \"1\", \"data_offsets\": [0, 4]}}", 4, "'shape' must be an array", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], \"data_offsets\": [0, 4]}}", 4, "tensor 'w': shape too large", NULL},
        {"{\"w\": [1, 2]}", 0, "tensor 'w': expected an object", NULL},
        {"{\"__metadata__\": {\"epoch\": 3}}", 0, "metadata 'epoch' must be a string, got a number", NULL},
        {"{\"__metadata__\": [\"x\"]}", 0, "'__metadata__' must be an object of strings", NULL},
        {"{\"__metadata__\": {}, \"__metadata__\": {}}", 0, "'__metadata__' appears twice", NULL},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4, "tensor 'w' has 65 dimensions", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        craft(p, cases[i].header, cases[i].datalen);
        expect_open_error(p, cases[i].needle, cases[i].needle2);
    }
    /* a tensor lockstep cannot hold still opens, lists and reads raw, but not into a tensor */
    craft(p, "{\"mask\": {\"dtype\": \"BOOL\", \"shape\": [3], \"data_offsets\": [0, 3]}}", 3);
    lk_st_file *f;
    CHECK_OK(lk_safetensors_open(p, &f));
    if (f) {
        const lk_st_info *in = lk_safetensors_find(f, "mask");
        CHECK(in && in->dtype == -1 && !strcmp(in->dtype_name, "BOOL") && in->nbytes == 3);
        lk_tensor *t = lk_tensor_zeros(LK_U8, LK_SHAPE(3));
        CHECK_ERR(lk_safetensors_read_into(f, "mask", t), LK_STATUS_INVALID_ARGUMENT, "dtype BOOL, which lockstep tensors cannot hold");
        lk_tensor_release(t);
        lk_safetensors_close(f);
    }
    CHECK_ERR(lk_safetensors_open("/nonexistent/x.safetensors", &f), LK_STATUS_IO, "cannot open '/nonexistent/x.safetensors'");
    CHECK_ERR(lk_safetensors_open(tmpdir, &f), LK_STATUS_IO, "not a regular file");
}

/* Every prefix of a valid file and thousands of random byte changes: each
 * either opens (and then reads back consistently) or fails cleanly. */
static void test_random_damage(void) {
    const char *good = tpath("damage.safetensors");
    CHECK_OK(write_refs(good));
    size_t len = 0;
    unsigned char *b = read_all(good, &len);
    for (size_t cut = 0; cut < len; cut++) {
        lk_st_file *f;
        lk_status st = lk_safetensors_open_memory(b, cut, "cut", &f);
        CHECK_MSG(st == LK_STATUS_INVALID_ARGUMENT && !f, "prefix of %zu bytes opened", cut);
    }
    unsigned char *m = malloc(len);
    lk_rng r;
    lk_rng_init(&r, 99, LK_RNG_USER, 1, 0);
    uint64_t hl;
    memcpy(&hl, b, 8);
    int opened = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(m, b, len);
        int nflip = 1 + (int)lk_rng_below(&r, 4);
        for (int k = 0; k < nflip; k++) {
            size_t at = lk_rng_below(&r, (uint32_t)(8 + hl)); /* mostly the header */
            m[at] = (unsigned char)lk_rng_u32(&r);
        }
        lk_st_file *f;
        lk_status st = lk_safetensors_open_memory(m, len, "damaged", &f);
        if (st == LK_STATUS_OK) {
            opened++;
            for (int i = 0; i < lk_safetensors_count(f); i++) {
                const lk_st_info *in = lk_safetensors_at(f, i);
                CHECK((const unsigned char *)in->data + in->nbytes <= m + len);
                unsigned sum = 0; /* every byte is readable (ASan checks) */
                for (size_t k = 0; k < in->nbytes; k++) sum += ((const unsigned char *)in->data)[k];
                CHECK(sum <= 255u * in->nbytes);
            }
            lk_safetensors_close(f);
        } else {
            CHECK(st == LK_STATUS_INVALID_ARGUMENT && !f && strstr(lk_last_error(), "damaged"));
        }
    }
    printf("  random damage: %d of 3000 damaged files still valid\n", opened);
    free(m);
    free(b);
}

/* Allocation failures while opening: clean error, no leak (ASan). */
static void test_open_alloc_failures(void) {
    const char *good = tpath("oom.safetensors");
    CHECK_OK(write_refs(good));
    int n;
    for (n = 1; n < 1000; n++) {
        lk_st_file *f;
        lk_alloc_fail_after(n);
        lk_status st = lk_safetensors_open(good, &f);
        lk_alloc_fail_after(0);
        if (!st) {
            lk_safetensors_close(f);
            break;
        }
        CHECK(st == LK_STATUS_OUT_OF_MEMORY && !f);
    }
    CHECK(n > 5 && n < 1000);
    for (n = 1; n < 1000; n++) {
        lk_alloc_fail_after(n);
        lk_status st = write_refs(good);
        lk_alloc_fail_after(0);
        if (!st) break;
        CHECK(st == LK_STATUS_OUT_OF_MEMORY);
        CHECK(count_tmp_files() == 0);
    }
    CHECK(n < 1000);
}

/* ---- checksums -------------------------------------------------------------------------- */

/* Known answers (RFC 3720 B.4 and the customary "123456789"), the hardware
 * and table paths against each other and against the bitwise definition at
 * every alignment and at lengths around the three-stream blocks, and
 * chaining (a checksum continued over a second piece). */
static void test_crc32c(void) {
    CHECK(lk__crc32c(0, "123456789", 9) == 0xe3069283u);
    CHECK(lk__crc32c_portable(0, "123456789", 9) == 0xe3069283u);
    CHECK(lk__crc32c(0, NULL, 0) == 0);
    unsigned char v[32];
    memset(v, 0, 32);
    CHECK(lk__crc32c(0, v, 32) == 0x8a9136aau);
    memset(v, 0xff, 32);
    CHECK(lk__crc32c(0, v, 32) == 0x62a8ab43u);
    for (int i = 0; i < 32; i++) v[i] = (unsigned char)i;
    CHECK(lk__crc32c(0, v, 32) == 0x46dd794eu);
    for (int i = 0; i < 32; i++) v[i] = (unsigned char)(31 - i);
    CHECK(lk__crc32c(0, v, 32) == 0x113fdb5cu);
    printf("  crc32c: %s\n", lk__crc32c_hardware() ? "SSE4.2 instruction" : "table (no SSE4.2)");
    size_t big = 3 * 8192 * 2 + 3 * 256 * 3 + 77;
    unsigned char *b = malloc(big + 8);
    lk_rng r;
    lk_rng_init(&r, 5, LK_RNG_USER, 0, 0);
    for (size_t i = 0; i < big + 8; i++) b[i] = (unsigned char)lk_rng_u32(&r);
    static const size_t lens[] = {0, 1, 7, 8, 9, 63, 255, 256, 767, 768, 769, 1000, 24575, 24576, 24577, 50000};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int off = 0; off < 8; off++) {
            uint32_t want = crc32c_bitwise(b + off, lens[li]);
            CHECK_MSG(lk__crc32c(0, b + off, lens[li]) == want, "length %zu at offset %d", lens[li], off);
            CHECK_MSG(lk__crc32c_portable(0, b + off, lens[li]) == want, "table: length %zu at offset %d", lens[li], off);
        }
    uint32_t whole = crc32c_bitwise(b, big);
    CHECK(lk__crc32c(0, b, big) == whole);
    for (size_t cut = 0; cut < big; cut += 4099) { /* in two pieces, cut anywhere: continued, and joined */
        CHECK_MSG(lk__crc32c(lk__crc32c(0, b, cut), b + cut, big - cut) == whole, "cut at %zu", cut);
        CHECK_MSG(lk__crc32c_combine(lk__crc32c(0, b, cut), lk__crc32c(0, b + cut, big - cut), big - cut) == whole,
                  "joined at %zu", cut);
    }
    CHECK(lk__crc32c_combine(whole, 0, 0) == whole);
    free(b);
}

/* One bit changed anywhere in the tensor data (every byte of every tensor
 * in turn) is refused at open, naming the file and the tensor holding the
 * byte; two damaged tensors are both named. */
static void test_checksum_flips(void) {
    const char *p = tpath("flip.safetensors"), *q = tpath("flipped.safetensors");
    CHECK_OK(write_refs(p));
    size_t len = 0;
    unsigned char *b = read_all(p, &len);
    lk_st_file *f;
    CHECK_OK(lk_safetensors_open_memory(b, len, p, &f)); /* pointers into b: the bytes' offsets */
    if (!f) return;
    unsigned char *m = malloc(len);
    int nt = lk_safetensors_count(f), named = 0, nonempty = 0;
    for (int i = 0; i < nt; i++) {
        const lk_st_info *in = lk_safetensors_at(f, i);
        size_t begin = (size_t)((const unsigned char *)in->data - b);
        nonempty += in->nbytes > 0;
        for (size_t k = 0; k < in->nbytes; k++) {
            memcpy(m, b, len);
            m[begin + k] ^= (unsigned char)(1u << (k % 8));
            lk_st_file *g = (lk_st_file *)1;
            lk_clear_error();
            lk_status st = lk_safetensors_open_memory(m, len, "mem", &g);
            char needle[200];
            snprintf(needle, sizeof needle, "mem: tensor '%s' fails its crc32c check (stored %08x, computed ", in->name,
                     (unsigned)in->crc32c);
            CHECK_MSG(st == LK_STATUS_INVALID_ARGUMENT && !g && strstr(lk_last_error(), needle),
                      "byte %zu of tensor '%s' changed: %s", k, in->name, lk_last_error());
            if (k == in->nbytes / 2) { /* and once per tensor through a file, the whole message */
                write_all_file(q, m, len);
                char want[800];
                snprintf(want, sizeof want,
                         "%s: tensor '%s' fails its crc32c check (stored %08x, computed %08x): the file is corrupt", q,
                         in->name, (unsigned)in->crc32c,
                         (unsigned)crc32c_bitwise(m + begin, in->nbytes));
                CHECK_ERR(lk_safetensors_open(q, &g), LK_STATUS_INVALID_ARGUMENT, want);
                CHECK(g == NULL);
                named++;
            }
        }
    }
    CHECK_MSG(named == nonempty && nonempty > nt / 2, "%d of %d tensors named, %d not empty", named, nt, nonempty);
    /* two tensors at once */
    const lk_st_info *t0 = lk_safetensors_at(f, 0), *t1 = lk_safetensors_at(f, 1);
    CHECK(t0->nbytes && t1->nbytes);
    memcpy(m, b, len);
    m[(const unsigned char *)t0->data - b] ^= 1;
    m[(const unsigned char *)t1->data - b] ^= 1;
    char want[300];
    snprintf(want, sizeof want, "tensor '%s' fails its crc32c check", t0->name);
    lk_st_file *g;
    CHECK_ERR(lk_safetensors_open_memory(m, len, "two", &g), LK_STATUS_INVALID_ARGUMENT, want);
    snprintf(want, sizeof want, "(1 more tensor fails too: '%s')", t1->name);
    CHECK_MSG(strstr(lk_last_error(), want) != NULL, "expected '%s' in: %s", want, lk_last_error());
    lk_safetensors_close(f);
    free(m);
    free(b);
}

/* Files over 8 MiB are checksummed on several threads, cut into equal
 * byte ranges whatever the tensors: tensors spanning several ranges, empty
 * ones on the cuts, and a changed byte on either side of a cut. */
static void test_checksum_threads(void) {
    int threads = lk_get_num_threads();
    lk_set_num_threads(5);
    static const size_t sizes[] = {3, 0, (9u << 20) + 4, 1, 0, (7u << 20) + 8, 1000, 0};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    lk_st_entry e[NS];
    unsigned char *data[NS];
    int64_t shape[NS];
    char names[NS][32];
    lk_rng r;
    lk_rng_init(&r, 3, LK_RNG_USER, 0, 0);
    for (int i = 0; i < NS; i++) {
        data[i] = malloc(sizes[i] + 1);
        for (size_t k = 0; k < sizes[i]; k++) data[i][k] = (unsigned char)lk_rng_u32(&r);
        shape[i] = (int64_t)sizes[i];
        snprintf(names[i], sizeof names[i], "t%d", i);
        e[i] = (lk_st_entry){.name = names[i], .dtype = LK_U8, .ndim = 1, .shape = &shape[i], .data = data[i]};
    }
    const char *p = tpath("big.safetensors");
    CHECK_OK(lk_safetensors_write(p, e, NS, NULL, 0));
    size_t len = 0;
    unsigned char *b = read_all(p, &len);
    lk_st_file *f;
    CHECK_OK(lk_safetensors_open_memory(b, len, "big", &f));
    CHECK(f && lk_safetensors_verified(f) == NS);
    for (int i = 0; f && i < NS; i++) {
        const lk_st_info *in = lk_safetensors_find(f, names[i]);
        CHECK(in && in->crc32c == lk__crc32c(0, data[i], sizes[i]));
    }
    uint64_t hl;
    memcpy(&hl, b, 8);
    size_t total = len - 8 - (size_t)hl;
    /* around each of the 4 ranges' cuts, and the ends */
    size_t cuts[] = {0, total / 4 - 1, total / 4, total / 2 - 1, total / 2, total / 4 * 3, total - 1};
    for (size_t k = 0; f && k < sizeof cuts / sizeof cuts[0]; k++) {
        size_t at = 8 + (size_t)hl + cuts[k];
        const char *owner = NULL;
        for (int i = 0; i < NS; i++) {
            const lk_st_info *in = lk_safetensors_at(f, i);
            size_t tb = (size_t)((const unsigned char *)in->data - b);
            if (at >= tb && at < tb + in->nbytes) owner = in->name;
        }
        b[at] ^= 0x10;
        char want[200];
        snprintf(want, sizeof want, "big: tensor '%s' fails its crc32c check", owner ? owner : "?");
        lk_st_file *g;
        CHECK_ERR(lk_safetensors_open_memory(b, len, "big", &g), LK_STATUS_INVALID_ARGUMENT, want);
        b[at] ^= 0x10;
    }
    lk_safetensors_close(f);
    free(b);
    for (int i = 0; i < NS; i++) free(data[i]);
    lk_set_num_threads(threads);
}

/* Rewrites the header of the file image `b` through `edit` (on its
 * __metadata__ object) into `out`, data unchanged. */
static void edit_meta(const unsigned char *b, size_t len, const char *out, void (*edit)(cJSON *meta, void *ctx),
                      void *ctx) {
    uint64_t hl;
    memcpy(&hl, b, 8);
    cJSON *root = cJSON_ParseWithLength((const char *)b + 8, (size_t)hl);
    CHECK(root != NULL);
    if (!root) return;
    edit(cJSON_GetObjectItemCaseSensitive(root, "__metadata__"), ctx);
    char *js = cJSON_PrintUnformatted(root);
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7, dl = len - 8 - (size_t)hl;
    unsigned char *o = malloc(8 + padded + dl + 1);
    uint64_t n = padded;
    memcpy(o, &n, 8);
    memcpy(o + 8, js, jl);
    memset(o + 8 + jl, ' ', padded - jl);
    memcpy(o + 8 + padded, b + 8 + hl, dl);
    write_all_file(out, o, 8 + padded + dl);
    free(o);
    cJSON_free(js);
    cJSON_Delete(root);
}

static void strip_crcs(cJSON *meta, void *ctx) { /* as an older lockstep wrote its files */
    (void)ctx;
    for (cJSON *e = meta->child, *next; e; e = next) {
        next = e->next;
        if (!strncmp(e->string, "lk.crc32c.", 10)) cJSON_DeleteItemFromObjectCaseSensitive(meta, e->string);
    }
}
static void drop_one_crc(cJSON *meta, void *ctx) { cJSON_DeleteItemFromObjectCaseSensitive(meta, ctx); }
static void add_ghost_crc(cJSON *meta, void *ctx) {
    (void)ctx;
    cJSON_AddStringToObject(meta, "lk.crc32c.ghost.weight", "00000000");
}
static void bad_hex_crc(cJSON *meta, void *ctx) { cJSON_ReplaceItemInObjectCaseSensitive(meta, ctx, cJSON_CreateString("12345g78")); }
static void short_crc(cJSON *meta, void *ctx) { cJSON_ReplaceItemInObjectCaseSensitive(meta, ctx, cJSON_CreateString("1234567")); }
static void dup_crc(cJSON *meta, void *ctx) { cJSON_AddStringToObject(meta, ctx, "00000000"); }

/* stdout (where notes go) into a file while `fn` runs; returns what it got. */
static char *capture_stdout(void (*fn)(void *), void *ctx) {
    const char *path = tpath("stdout.txt");
    fflush(stdout);
    int saved = dup(1);
    FILE *f = fopen(path, "w");
    dup2(fileno(f), 1);
    fn(ctx);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(f);
    size_t n = 0;
    char *s = (char *)read_all(path, &n);
    if (s) s[n] = 0;
    return s;
}

static void open_close(void *path) {
    lk_st_file *f = NULL;
    CHECK_OK(lk_safetensors_open(path, &f));
    CHECK(f && lk_safetensors_verified(f) == 0 && lk_safetensors_count(f) == nrefs);
    lk_safetensors_close(f);
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p++) n++;
    return n;
}

/* A file without checksums (an older lockstep's, PyTorch's) opens and
 * reads, with a note naming it, once per path; damaged checksum keys are
 * errors naming the key or tensor. */
static void test_checksum_absent_or_damaged(void) {
    const char *good = tpath("crcs.safetensors");
    CHECK_OK(write_refs(good));
    size_t len = 0;
    unsigned char *b = read_all(good, &len);
    const char *old1 = tpath("old1.safetensors"), *old2 = tpath("old2.safetensors");
    edit_meta(b, len, old1, strip_crcs, NULL);
    edit_meta(b, len, old2, strip_crcs, NULL);
    char *out = capture_stdout(open_close, (void *)old1);
    char note[600];
    snprintf(note, sizeof note,
             "note: %s has no tensor checksums (written by a lockstep before they existed, or by another tool): its "
             "tensor data is loaded without a corruption check", old1);
    CHECK_MSG(out && count(out, note) == 1, "expected the note once, got: %s", out ? out : "(nothing)");
    free(out);
    out = capture_stdout(open_close, (void *)old1); /* the same path again: no second note */
    CHECK_MSG(out && !strstr(out, "no tensor checksums"), "noted twice: %s", out ? out : "");
    free(out);
    out = capture_stdout(open_close, (void *)old2); /* another file: its own note */
    CHECK_MSG(out && count(out, old2) == 1 && strstr(out, "no tensor checksums"), "got: %s", out ? out : "");
    free(out);
    /* and its tensors read back as written */
    lk_st_file *f;
    CHECK_OK(lk_safetensors_open(old1, &f));
    for (int i = 0; f && i < nrefs; i++) {
        const lk_st_info *in = lk_safetensors_find(f, refs[i].name);
        CHECK(in && !in->has_crc32c && (!in->nbytes || !memcmp(in->data, refs[i].data, in->nbytes)));
    }
    lk_safetensors_close(f);

    const char *p = tpath("crcbad.safetensors");
    char key[128], want[400];
    snprintf(key, sizeof key, "lk.crc32c.%.64s", refs[2].name);
    edit_meta(b, len, p, drop_one_crc, key);
    snprintf(want, sizeof want, "tensor '%s' has no crc32c checksum (metadata '%s') while %d other tensors of the file "
             "have one: the header was edited or damaged", refs[2].name, key, nrefs - 1);
    expect_open_error(p, want, NULL);
    edit_meta(b, len, p, add_ghost_crc, NULL);
    expect_open_error(p, "metadata 'lk.crc32c.ghost.weight' is the checksum of a tensor 'ghost.weight' that the file "
                         "does not hold", NULL);
    edit_meta(b, len, p, bad_hex_crc, key);
    snprintf(want, sizeof want, "metadata '%s' is '12345g78', expected a crc32c checksum of 8 hex digits", key);
    expect_open_error(p, want, NULL);
    edit_meta(b, len, p, short_crc, key);
    expect_open_error(p, "is '1234567', expected a crc32c checksum of 8 hex digits", NULL);
    edit_meta(b, len, p, dup_crc, key);
    snprintf(want, sizeof want, "tensor '%s' has two crc32c checksums", refs[2].name);
    expect_open_error(p, want, NULL);
    free(b);
}

static void cleanup(void) {
    for (int i = 0; i < nrefs; i++) free(refs[i].data);
    nrefs = 0;
    teardown();
}

LK_TEST_MAIN(LK_TEST_CASE(test_round_trip), LK_TEST_CASE(test_tensors_and_read_into), LK_TEST_CASE(test_write_errors),
             LK_TEST_CASE(test_fault_hook), LK_TEST_CASE(test_corruptions), LK_TEST_CASE(test_random_damage),
             LK_TEST_CASE(test_open_alloc_failures), LK_TEST_CASE(test_crc32c), LK_TEST_CASE(test_checksum_flips),
             LK_TEST_CASE(test_checksum_threads),
             LK_TEST_CASE(test_checksum_absent_or_damaged), LK_TEST_CASE(cleanup))

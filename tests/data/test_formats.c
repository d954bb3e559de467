/* data formats: idx/idx.gz, npy (against NumPy-written fixtures), csv and
 * token files, each read back exactly and each kind of bad input refused
 * with a message naming the file and what was expected. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp */
#endif
#include <math.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "lk_test.h"

static char tmpdir[256];

static const char *tmp(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
}

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s/lk_data_test_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    CHECK(mkdtemp(tmpdir) != NULL);
}

static void teardown(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    CHECK(system(cmd) == 0);
}

/* ---- idx --------------------------------------------------------------------- */

static void idx_roundtrip(void) {
    setup();
    lk_dtype dts[] = {LK_U8, LK_I32, LK_F32, LK_F64};
    const char *names[] = {"a.idx", "a.idx.gz"};
    for (int d = 0; d < 4; d++)
        for (int z = 0; z < 2; z++) {
            lk_array a, b;
            CHECK_OK(lk_array_alloc(&a, dts[d], 3, (int64_t[]){5, 3, 7}));
            for (int64_t i = 0; i < 105; i++) {
                if (dts[d] == LK_U8) ((uint8_t *)a.data)[i] = (uint8_t)(i * 7);
                else if (dts[d] == LK_I32) ((int32_t *)a.data)[i] = (int32_t)(i * 100003 - 5000000);
                else if (dts[d] == LK_F32) ((float *)a.data)[i] = (float)i * 0.37f - 3.0f;
                else ((double *)a.data)[i] = (double)i * 1e-3 - 7.0;
            }
            CHECK_OK(lk_idx_write(tmp(names[z]), &a));
            CHECK_OK(lk_idx_read(tmp(names[z]), &b));
            CHECK(b.dtype == dts[d] && b.ndim == 3 && b.shape[0] == 5 && b.shape[1] == 3 && b.shape[2] == 7);
            CHECK(b.data && memcmp(a.data, b.data, lk_array_nbytes(&a)) == 0);
            lk_array_release(&a);
            lk_array_release(&b);
        }
    /* The .gz one is really compressed; the plain one is exactly header + data. */
    lk_array a;
    CHECK_OK(lk_array_alloc(&a, LK_U8, 2, (int64_t[]){100, 100}));
    CHECK_OK(lk_idx_write(tmp("z.idx.gz"), &a));
    CHECK_OK(lk_idx_write(tmp("z.idx"), &a));
    FILE *f = fopen(tmp("z.idx.gz"), "rb");
    fseek(f, 0, SEEK_END);
    CHECK(ftell(f) < 1000);
    fclose(f);
    f = fopen(tmp("z.idx"), "rb");
    fseek(f, 0, SEEK_END);
    CHECK(ftell(f) == 4 + 8 + 10000);
    fclose(f);
    lk_array_release(&a);
    teardown();
}

static void idx_widening_and_endianness(void) {
    setup();
    /* i16 big-endian: -2, 300; i8: -1, 5. */
    uint8_t i16[] = {0, 0, 0x0B, 1, 0, 0, 0, 2, 0xFF, 0xFE, 0x01, 0x2C};
    uint8_t i8[] = {0, 0, 0x09, 1, 0, 0, 0, 2, 0xFF, 0x05};
    write_bytes(tmp("i16.idx"), i16, sizeof i16);
    write_bytes(tmp("i8.idx"), i8, sizeof i8);
    lk_array a;
    CHECK_OK(lk_idx_read(tmp("i16.idx"), &a));
    CHECK(a.dtype == LK_I32 && a.shape[0] == 2);
    if (a.data) CHECK(((int32_t *)a.data)[0] == -2 && ((int32_t *)a.data)[1] == 300);
    lk_array_release(&a);
    CHECK_OK(lk_idx_read(tmp("i8.idx"), &a));
    if (a.data) CHECK(((int32_t *)a.data)[0] == -1 && ((int32_t *)a.data)[1] == 5);
    lk_array_release(&a);
    teardown();
}

static void idx_errors(void) {
    setup();
    lk_array a;
    CHECK_ERR(lk_idx_read(tmp("missing.idx"), &a), LK_STATUS_IO, "missing.idx");
    CHECK(a.data == NULL);
    uint8_t bad_magic[] = {1, 2, 8, 1, 0, 0, 0, 1, 0};
    write_bytes(tmp("bad.idx"), bad_magic, sizeof bad_magic);
    CHECK_ERR(lk_idx_read(tmp("bad.idx"), &a), LK_STATUS_INVALID_ARGUMENT, "not an idx file: magic bytes 01 02 08 01");
    uint8_t bad_type[] = {0, 0, 0x42, 1, 0, 0, 0, 1, 0};
    write_bytes(tmp("type.idx"), bad_type, sizeof bad_type);
    CHECK_ERR(lk_idx_read(tmp("type.idx"), &a), LK_STATUS_INVALID_ARGUMENT, "expected 00 00 <type");
    uint8_t many_dims[] = {0, 0, 8, 9};
    write_bytes(tmp("dims.idx"), many_dims, sizeof many_dims);
    CHECK_ERR(lk_idx_read(tmp("dims.idx"), &a), LK_STATUS_INVALID_ARGUMENT, "9 dims, expected 1..8");
    /* Header claims 60000 x 28 x 28 but there are 10 bytes: refused before allocating. */
    uint8_t trunc[4 + 12 + 10] = {0, 0, 8, 3, 0, 0, 0xEA, 0x60, 0, 0, 0, 28, 0, 0, 0, 28};
    write_bytes(tmp("trunc.idx"), trunc, sizeof trunc);
    CHECK_ERR(lk_idx_read(tmp("trunc.idx"), &a), LK_STATUS_IO, "truncated: header says u8 [60000, 28, 28] = 47040000 bytes");
    /* Same, compressed: more than a gzip file that small can hold (deflate
     * expands at most 1032:1), refused before allocating. */
    gzFile g = gzopen(tmp("trunc.idx.gz"), "wb");
    gzwrite(g, trunc, sizeof trunc);
    gzclose(g);
    CHECK_ERR(lk_idx_read(tmp("trunc.idx.gz"), &a), LK_STATUS_IO, "more than a gzip file of");
    CHECK(a.data == NULL);
    /* A plausible claim (10 x 28 x 28) with 10 bytes of data: found while reading. */
    trunc[6] = 0, trunc[7] = 10;
    g = gzopen(tmp("trunc2.idx.gz"), "wb");
    gzwrite(g, trunc, sizeof trunc);
    gzclose(g);
    CHECK_ERR(lk_idx_read(tmp("trunc2.idx.gz"), &a), LK_STATUS_IO, "truncated: expected 7840 bytes at offset 16, got only 10");
    CHECK(a.data == NULL);
    /* A gzip stream cut in half. */
    lk_array big;
    CHECK_OK(lk_array_alloc(&big, LK_F32, 1, (int64_t[]){50000}));
    for (int i = 0; i < 50000; i++) ((float *)big.data)[i] = (float)i;
    CHECK_OK(lk_idx_write(tmp("big.idx.gz"), &big));
    lk_array_release(&big);
    FILE *f = fopen(tmp("big.idx.gz"), "rb");
    char buf[200000];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes(tmp("cut.idx.gz"), buf, n / 2);
    lk_status st = lk_idx_read(tmp("cut.idx.gz"), &a);
    CHECK(st == LK_STATUS_IO && strstr(lk_last_error(), "cut.idx.gz"));
    CHECK(a.data == NULL);
    /* Writing refuses what idx cannot hold. */
    lk_array i64 = {.dtype = LK_I64, .ndim = 1, .shape = {2}, .data = (int64_t[]){1, 2}};
    CHECK_ERR(lk_idx_write(tmp("x.idx"), &i64), LK_STATUS_INVALID_ARGUMENT, "expected u8, i32, f32 or f64");
    CHECK_ERR(lk_idx_write("/nonexistent-dir/x.idx", &(lk_array){.dtype = LK_U8, .ndim = 1, .shape = {1}, .data = "a"}),
              LK_STATUS_IO, "/nonexistent-dir/x.idx");
    teardown();
}

static void fashion_mnist(void) {
    lk_dataset *tr = NULL, *te = NULL;
    lk_status st = lk_dataset_mnist_create("/usr/share/datasets/fashion-mnist", "train", &tr);
    if (st == LK_STATUS_IO && strstr(lk_last_error(), "not found")) {
        printf("skip fashion_mnist: %s\n", lk_last_error());
        return;
    }
    CHECK_OK(st);
    CHECK_OK(lk_dataset_mnist_create(NULL, "test", &te));
    if (!tr || !te) return;
    CHECK(lk_dataset_len(tr) == 60000 && lk_dataset_len(te) == 10000);
    const lk_field *x = lk_dataset_field(tr, 0), *y = lk_dataset_field(tr, 1);
    CHECK(x->dtype == LK_U8 && x->ndim == 2 && x->shape[0] == 28 && x->shape[1] == 28);
    CHECK(y->dtype == LK_U8 && y->ndim == 0);
    /* Reference values computed with NumPy from the same files. */
    static const int first_labels[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
    static const uint8_t row14[28] = {0, 0, 1, 4, 6, 7, 2, 0, 0, 0, 0, 0, 237, 226,
                                      217, 223, 222, 219, 222, 221, 216, 223, 229, 215, 218, 255, 77, 0};
    uint8_t img[784], lab;
    int64_t counts[10] = {0}, total = 0;
    for (int64_t i = 0; i < 60000; i++) {
        CHECK_OK(lk_dataset_get(tr, i, 0, (void *[]){img, &lab}));
        if (i < 10) CHECK(lab == first_labels[i]);
        if (i == 0) {
            int64_t s = 0;
            for (int k = 0; k < 784; k++) s += img[k];
            CHECK(s == 76247);
            CHECK(memcmp(img + 14 * 28, row14, 28) == 0);
        }
        if (lab < 10) counts[lab]++;
        for (int k = 0; k < 784; k++) total += img[k];
    }
    CHECK(total == 3431114169LL);
    for (int c = 0; c < 10; c++) CHECK(counts[c] == 6000);
    lk_dataset_free(tr);
    lk_dataset_free(te);
    CHECK_ERR(lk_dataset_mnist_create("/nonexistent", "train", &tr), LK_STATUS_IO,
              "tried /nonexistent/train-images-idx3-ubyte.gz, /nonexistent/train-images-idx3-ubyte");
    CHECK(tr == NULL);
    CHECK_ERR(lk_dataset_mnist_create(NULL, "valid", &tr), LK_STATUS_INVALID_ARGUMENT, "expected 'train' or 'test'");
}

/* A label outside the declared classes fails at load, naming the label file
 * and the sample, instead of in cross_entropy steps later. */
static void label_out_of_range(void) {
    setup();
    lk_array img, lab;
    CHECK_OK(lk_array_alloc(&img, LK_U8, 3, (int64_t[]){20, 28, 28}));
    CHECK_OK(lk_array_alloc(&lab, LK_U8, 1, (int64_t[]){20}));
    for (int i = 0; i < 20; i++) ((uint8_t *)lab.data)[i] = (uint8_t)(i % 10);
    CHECK_OK(lk_idx_write(tmp("train-images-idx3-ubyte"), &img));
    CHECK_OK(lk_idx_write(tmp("train-labels-idx1-ubyte"), &lab));
    lk_dataset *ds = NULL;
    CHECK_OK(lk_dataset_mnist_create(tmpdir, "train", &ds)); /* labels 0..9 load */
    lk_dataset_free(ds);
    ds = NULL;
    ((uint8_t *)lab.data)[17] = 250;
    CHECK_OK(lk_idx_write(tmp("train-labels-idx1-ubyte"), &lab));
    CHECK_ERR(lk_dataset_mnist_create(tmpdir, "train", &ds), LK_STATUS_INVALID_ARGUMENT,
              "train-labels-idx1-ubyte: label 250 at sample 17 is outside [0, 10) (num_classes 10)");
    CHECK(ds == NULL);
    /* the plain pair declares no classes and loads */
    CHECK_OK(lk_dataset_idx_pair_create(tmp("train-images-idx3-ubyte"), tmp("train-labels-idx1-ubyte"), &ds));
    lk_dataset_free(ds);
    lk_array_release(&img);
    lk_array_release(&lab);
    /* csv with num_classes: negative labels too */
    write_bytes(tmp("c.csv"), "1,2,0\n3,4,-1\n", 13);
    lk_csv_config cfg = lk_csv_config_default();
    CHECK_OK(lk_dataset_csv_create(tmp("c.csv"), &cfg, &ds)); /* unchecked by default */
    lk_dataset_free(ds);
    ds = NULL;
    cfg.num_classes = 3;
    CHECK_ERR(lk_dataset_csv_create(tmp("c.csv"), &cfg, &ds), LK_STATUS_INVALID_ARGUMENT,
              "c.csv: label -1 at sample 1 is outside [0, 3) (num_classes 3)");
    CHECK(ds == NULL);
    teardown();
}

/* ---- inputs a model cannot train on ------------------------------------------- */

/* NaN and inf in npy, idx (float types) and csv inputs are refused when the
 * dataset is opened, naming the file and the first bad position (flat and
 * per-dimension index; csv: line, data row and column), wherever it lies
 * in the vectorised check's blocks; finite data and the array readers
 * themselves (an array may hold NaN) are unaffected. */
static void nonfinite_inputs(void) {
    setup();
    lk_dataset *ds = NULL;
    lk_array a, y;
    /* npy x, f32: one NaN at [2, 1, 3] */
    CHECK_OK(lk_array_alloc(&a, LK_F32, 3, (int64_t[]){3, 4, 5}));
    for (int i = 0; i < 60; i++) ((float *)a.data)[i] = (float)i * 0.5f;
    CHECK_OK(lk_npy_write(tmp("x.npy"), &a));
    CHECK_OK(lk_dataset_npy_create(tmp("x.npy"), NULL, &ds)); /* finite: loads */
    lk_dataset_free(ds);
    ds = NULL;
    ((float *)a.data)[2 * 20 + 1 * 5 + 3] = NAN;
    CHECK_OK(lk_npy_write(tmp("x.npy"), &a));
    char want[600];
    snprintf(want, sizeof want, "%s: element 48 (index [2, 1, 3] in shape [3, 4, 5]) is nan: a NaN or inf input makes "
             "the loss nan", tmp("x.npy"));
    CHECK_ERR(lk_dataset_npy_create(tmp("x.npy"), NULL, &ds), LK_STATUS_INVALID_ARGUMENT, want);
    CHECK(ds == NULL);
    lk_array r;
    CHECK_OK(lk_npy_read(tmp("x.npy"), &r)); /* the reader alone returns what the file holds */
    lk_array_release(&r);
    lk_array_release(&a);
    /* npy y, f64 (regression targets): -inf; at every position around the
     * 4096-element blocks, the first bad one is the one named */
    CHECK_OK(lk_array_alloc(&a, LK_F32, 2, (int64_t[]){10000, 1}));
    memset(a.data, 0, 40000);
    CHECK_OK(lk_npy_write(tmp("x2.npy"), &a));
    lk_array_release(&a);
    static const int64_t at[] = {0, 4095, 4096, 8191, 9999};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        CHECK_OK(lk_array_alloc(&y, LK_F64, 1, (int64_t[]){10000}));
        for (int i = 0; i < 10000; i++) ((double *)y.data)[i] = 1e300;
        ((double *)y.data)[at[k]] = -INFINITY;
        if (at[k] < 9999) ((double *)y.data)[9999] = NAN; /* a later one is not the first */
        CHECK_OK(lk_npy_write(tmp("y.npy"), &y));
        snprintf(want, sizeof want, "y.npy: element %lld (index [%lld] in shape [10000]) is -inf", (long long)at[k],
                 (long long)at[k]);
        CHECK_ERR(lk_dataset_npy_create(tmp("x2.npy"), tmp("y.npy"), &ds), LK_STATUS_INVALID_ARGUMENT, want);
        lk_array_release(&y);
    }
    /* f16: +inf is 0x7c00 */
    CHECK_OK(lk_array_alloc(&a, LK_F16, 2, (int64_t[]){2, 3}));
    memset(a.data, 0, 12);
    ((uint16_t *)a.data)[4] = 0x7c00;
    CHECK_OK(lk_npy_write(tmp("h.npy"), &a));
    lk_array_release(&a);
    CHECK_ERR(lk_dataset_npy_create(tmp("h.npy"), NULL, &ds), LK_STATUS_INVALID_ARGUMENT,
              "h.npy: element 4 (index [1, 1] in shape [2, 3]) is inf");
    /* idx f32 images (type 0x0d) with an inf; u8 idx data cannot hold one */
    CHECK_OK(lk_array_alloc(&a, LK_F32, 3, (int64_t[]){4, 2, 2}));
    CHECK_OK(lk_array_alloc(&y, LK_U8, 1, (int64_t[]){4}));
    memset(a.data, 0, 64);
    memset(y.data, 1, 4);
    ((float *)a.data)[13] = INFINITY;
    CHECK_OK(lk_idx_write(tmp("img.idx"), &a));
    CHECK_OK(lk_idx_write(tmp("lab.idx"), &y));
    CHECK_ERR(lk_dataset_idx_pair_create(tmp("img.idx"), tmp("lab.idx"), &ds), LK_STATUS_INVALID_ARGUMENT,
              "img.idx: element 13 (index [3, 0, 1] in shape [4, 2, 2]) is inf");
    ((float *)a.data)[13] = 0;
    CHECK_OK(lk_idx_write(tmp("img.idx"), &a));
    CHECK_OK(lk_dataset_idx_pair_create(tmp("img.idx"), tmp("lab.idx"), &ds));
    lk_dataset_free(ds);
    ds = NULL;
    lk_array_release(&a);
    lk_array_release(&y);
    /* csv: strtod's "nan", "inf", "-Infinity", and a value beyond f32 */
    lk_array x, l;
    lk_csv_config cfg = lk_csv_config_default();
    static const struct {
        const char *text, *needle;
    } cases[] = {
        {"a,b,y\n1,2,0\n3,nan,1\n", "line 3 (data row 1), column 2 ('b'): 'nan' is not a finite number; NaN and inf inputs make the loss nan"},
        {"a,b,y\n\n1,inf,0\n", "line 3 (data row 0), column 2 ('b'): 'inf' is not a finite number"},
        {"1,2,0\n3,4,1\n-Infinity,4,1\n", "line 3 (data row 2), column 1: '-Infinity' is not a finite number"},
        {"a,b,y\n1,2,0\n1e39,2,0\n", "line 3 (data row 1), column 1 ('a'): '1e39' is beyond f32's range (+-3.4e38)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        write_bytes(tmp("f.csv"), cases[k].text, strlen(cases[k].text));
        CHECK_ERR(lk_csv_read(tmp("f.csv"), &cfg, &x, &l), LK_STATUS_INVALID_ARGUMENT, cases[k].needle);
        CHECK_ERR(lk_dataset_csv_create(tmp("f.csv"), &cfg, &ds), LK_STATUS_INVALID_ARGUMENT, "f.csv: line 3");
    }
    cfg.label_dtype = LK_F32; /* regression targets: checked too */
    write_bytes(tmp("f.csv"), "a,y\n1,2\n3,NaN\n", 14);
    CHECK_ERR(lk_csv_read(tmp("f.csv"), &cfg, &x, &l), LK_STATUS_INVALID_ARGUMENT,
              "line 3 (data row 1), column 2 ('y'): 'NaN' is not a finite number");
    write_bytes(tmp("f.csv"), "a,y\n1,2\n3,-1e300\n", 17);
    CHECK_ERR(lk_csv_read(tmp("f.csv"), &cfg, &x, &l), LK_STATUS_INVALID_ARGUMENT, "'-1e300' is beyond f32's range");
    teardown();
}

/* MNIST-layout files whose idx header holds another geometry than 28x28
 * (a 32x32 set dropped into the fashion_mnist directory) are refused when
 * opened, naming the file, the header's dimensions and the expected ones,
 * instead of a reshape error at the first batch. */
static void mnist_geometry(void) {
    setup();
    lk_array img, lab;
    CHECK_OK(lk_array_alloc(&lab, LK_U8, 1, (int64_t[]){5}));
    CHECK_OK(lk_idx_write(tmp("train-labels-idx1-ubyte"), &lab));
    lk_dataset *ds = NULL;
    char want[600];
    CHECK_OK(lk_array_alloc(&img, LK_U8, 3, (int64_t[]){5, 32, 32}));
    CHECK_OK(lk_idx_write(tmp("train-images-idx3-ubyte"), &img));
    snprintf(want, sizeof want, "%s: the idx header's dimensions are [5, 32, 32] (32x32 images); MNIST-layout images "
             "(Fashion-MNIST, MNIST) are 28x28: expected [N, 28, 28]", tmp("train-images-idx3-ubyte"));
    CHECK_ERR(lk_dataset_mnist_create(tmpdir, "train", &ds), LK_STATUS_INVALID_ARGUMENT, want);
    CHECK(ds == NULL);
    lk_array_release(&img);
    CHECK_OK(lk_array_alloc(&img, LK_U8, 2, (int64_t[]){5, 784})); /* flat rows: also not the layout */
    CHECK_OK(lk_idx_write(tmp("train-images-idx3-ubyte"), &img));
    CHECK_ERR(lk_dataset_mnist_create(tmpdir, "train", &ds), LK_STATUS_INVALID_ARGUMENT,
              "train-images-idx3-ubyte: the idx header's dimensions are [5, 784]; MNIST-layout images");
    /* the generic pair takes any geometry */
    CHECK_OK(lk_dataset_idx_pair_create(tmp("train-images-idx3-ubyte"), tmp("train-labels-idx1-ubyte"), &ds));
    lk_dataset_free(ds);
    lk_array_release(&img);
    lk_array_release(&lab);
    teardown();
}

/* ---- npy --------------------------------------------------------------------- */

static const char *fixture(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/tests/data/fixtures/%s", LK_SOURCE_DIR, name);
    return buf;
}

static void npy_fixtures(void) {
    static const struct {
        const char *file;
        lk_dtype dt;
    } cases[] = {
        {"arange_le_f4.npy", LK_F32}, {"arange_be_f4.npy", LK_F32}, {"arange_le_f8.npy", LK_F64},
        {"arange_be_f8.npy", LK_F64}, {"arange_le_i2.npy", LK_I32}, {"arange_be_i2.npy", LK_I32},
        {"arange_i1.npy", LK_I32},    {"arange_le_u2.npy", LK_I32}, {"arange_le_u4.npy", LK_I64},
        {"arange_le_i4.npy", LK_I32}, {"arange_le_i8.npy", LK_I64}, {"arange_be_i8.npy", LK_I64},
        {"arange_u1.npy", LK_U8},     {"arange_le_f2.npy", LK_F16}, {"v2.npy", LK_F32},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        lk_array a;
        lk_status st = lk_npy_read(fixture(cases[c].file), &a);
        CHECK_MSG(st == LK_STATUS_OK, "%s: %s", cases[c].file, lk_last_error());
        if (st) continue;
        CHECK_MSG(a.dtype == cases[c].dt && a.ndim == 3 && a.shape[0] == 2 && a.shape[1] == 3 && a.shape[2] == 4,
                  "%s: dtype %d ndim %d", cases[c].file, (int)a.dtype, a.ndim);
        for (int64_t i = 0; i < 24; i++) {
            double v = 0;
            switch (a.dtype) {
            case LK_F32: v = ((float *)a.data)[i]; break;
            case LK_F64: v = ((double *)a.data)[i]; break;
            case LK_I32: v = ((int32_t *)a.data)[i]; break;
            case LK_I64: v = (double)((int64_t *)a.data)[i]; break;
            case LK_U8: v = ((uint8_t *)a.data)[i]; break;
            case LK_F16: v = lk_f16_to_f32(((uint16_t *)a.data)[i]); break;
            default: break;
            }
            CHECK_MSG(v == (double)i, "%s[%lld] = %g", cases[c].file, (long long)i, v);
        }
        lk_array_release(&a);
    }
    lk_array b;
    CHECK_OK(lk_npy_read(fixture("bool.npy"), &b));
    if (b.data)
        for (int i = 0; i < 24; i++) CHECK(((uint8_t *)b.data)[i] == (i % 3 == 0));
    lk_array_release(&b);
    CHECK_OK(lk_npy_read(fixture("scalar.npy"), &b));
    CHECK(b.ndim == 0 && b.dtype == LK_F32 && b.data && *(float *)b.data == 2.5f);
    lk_array_release(&b);
    CHECK_ERR(lk_npy_read(fixture("fortran.npy"), &b), LK_STATUS_INVALID_ARGUMENT, "np.ascontiguousarray");
    CHECK_ERR(lk_npy_read(fixture("complex.npy"), &b), LK_STATUS_INVALID_ARGUMENT, "npy dtype '<c8' is not supported");
    CHECK(b.data == NULL);
}

static void npy_roundtrip_and_errors(void) {
    setup();
    lk_dtype dts[] = {LK_F32, LK_F64, LK_I32, LK_I64, LK_U8, LK_F16};
    for (int d = 0; d < 6; d++)
        for (int nd = 0; nd <= 3; nd++) {
            int64_t shape[3] = {3, 1, 5};
            lk_array a, b;
            CHECK_OK(lk_array_alloc(&a, dts[d], nd, shape));
            for (size_t i = 0; i < lk_array_nbytes(&a); i++) ((uint8_t *)a.data)[i] = (uint8_t)(i * 13 + 1);
            CHECK_OK(lk_npy_write(tmp("r.npy"), &a));
            CHECK_OK(lk_npy_read(tmp("r.npy"), &b));
            CHECK(b.dtype == a.dtype && b.ndim == nd);
            for (int i = 0; i < nd; i++) CHECK(b.shape[i] == shape[i]);
            CHECK(b.data && memcmp(a.data, b.data, lk_array_nbytes(&a)) == 0);
            lk_array_release(&a);
            lk_array_release(&b);
        }
    /* NumPy itself reads what we write, when it is there (numpy lives with the Debian python). */
    if (access("/usr/bin/python3", X_OK) == 0) {
        lk_array a;
        CHECK_OK(lk_array_alloc(&a, LK_F32, 2, (int64_t[]){2, 3}));
        for (int i = 0; i < 6; i++) ((float *)a.data)[i] = (float)i / 4;
        CHECK_OK(lk_npy_write(tmp("np.npy"), &a));
        lk_array_release(&a);
        char cmd[1024];
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c \"import numpy as np,sys; a=np.load('%s'); "
                 "sys.exit(0 if a.dtype==np.float32 and a.shape==(2,3) and (a.ravel()==np.arange(6)/4).all() else 1)\" "
                 "2>/dev/null",
                 tmp("np.npy"));
        int rc = system(cmd);
        if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127) printf("skip numpy check\n");
        else CHECK_MSG(rc == 0, "numpy rejected our npy (rc %d)", rc);
    }
    lk_array b;
    write_bytes(tmp("junk.npy"), "hello world, not npy", 20);
    CHECK_ERR(lk_npy_read(tmp("junk.npy"), &b), LK_STATUS_INVALID_ARGUMENT, "not an npy file");
    /* Cut a valid file short. */
    FILE *f = fopen(fixture("arange_le_f8.npy"), "rb");
    char buf[400];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_bytes(tmp("short.npy"), buf, n - 9);
    CHECK_ERR(lk_npy_read(tmp("short.npy"), &b), LK_STATUS_IO, "truncated: shape [2, 3, 4] needs 192 bytes of data, the file has 183");
    write_bytes(tmp("hdr.npy"), buf, 30);
    CHECK_ERR(lk_npy_read(tmp("hdr.npy"), &b), LK_STATUS_IO, "hdr.npy: truncated");
    /* Found by fuzzing: a header that ends inside the dtype string. */
    const char cut_descr[] = "\x93NUMPY\x01\x00\x0c\x00{'descr': '|";
    write_bytes(tmp("cut.npy"), cut_descr, sizeof cut_descr - 1);
    CHECK_ERR(lk_npy_read(tmp("cut.npy"), &b), LK_STATUS_INVALID_ARGUMENT, "npy dtype '|' is not supported");
    lk_array bf = {.dtype = LK_BF16, .ndim = 1, .shape = {1}, .data = (uint16_t[]){0}};
    CHECK_ERR(lk_npy_write(tmp("bf.npy"), &bf), LK_STATUS_INVALID_ARGUMENT, "no numpy equivalent");
    CHECK(access(tmp("bf.npy"), F_OK) != 0);
    teardown();
}

/* ---- csv --------------------------------------------------------------------- */

static void csv_read(void) {
    setup();
    const char *text = "a,b,label\n1, 2.5 ,0\r\n\n-3,4e2,\"2\"\n5,6,1\n";
    write_bytes(tmp("a.csv"), text, strlen(text));
    lk_array x, y;
    lk_csv_config cfg = lk_csv_config_default();
    CHECK_OK(lk_csv_read(tmp("a.csv"), &cfg, &x, &y));
    CHECK(x.dtype == LK_F32 && x.ndim == 2 && x.shape[0] == 3 && x.shape[1] == 2);
    CHECK(y.dtype == LK_I64 && y.ndim == 1 && y.shape[0] == 3);
    if (x.data && y.data) {
        const float ex[] = {1, 2.5f, -3, 400, 5, 6};
        for (int i = 0; i < 6; i++) CHECK(((float *)x.data)[i] == ex[i]);
        CHECK(((int64_t *)y.data)[0] == 0 && ((int64_t *)y.data)[1] == 2 && ((int64_t *)y.data)[2] == 1);
    }
    lk_array_release(&x);
    lk_array_release(&y);
    /* Label by name, first column; f32 labels. */
    cfg.label_name = "a";
    cfg.label_dtype = LK_F32;
    CHECK_OK(lk_csv_read(tmp("a.csv"), &cfg, &x, &y));
    CHECK(x.shape[1] == 2 && y.dtype == LK_F32);
    if (x.data && y.data) CHECK(((float *)y.data)[1] == -3 && ((float *)x.data)[2] == 400 && ((float *)x.data)[3] == 2);
    lk_array_release(&x);
    lk_array_release(&y);
    /* No header, no label, tab separated. */
    write_bytes(tmp("t.tsv"), "1\t2\n3\t4\n", 8);
    cfg = lk_csv_config_default();
    cfg.delimiter = '\t';
    cfg.label_column = LK_CSV_NO_LABEL;
    CHECK_OK(lk_csv_read(tmp("t.tsv"), &cfg, &x, NULL));
    CHECK(x.shape[0] == 2 && x.shape[1] == 2);
    if (x.data) CHECK(((float *)x.data)[3] == 4);
    lk_array_release(&x);
    /* As a dataset. */
    lk_dataset *ds;
    CHECK_OK(lk_dataset_csv_create(tmp("a.csv"), NULL, &ds));
    if (ds) {
        CHECK(lk_dataset_len(ds) == 3 && lk_dataset_nfields(ds) == 2);
        float xv[2];
        int64_t yv;
        CHECK_OK(lk_dataset_get(ds, 1, 0, (void *[]){xv, &yv}));
        CHECK(xv[0] == -3 && xv[1] == 400 && yv == 2);
    }
    lk_dataset_free(ds);
    teardown();
}

static void csv_errors(void) {
    setup();
    lk_array x, y;
    lk_csv_config cfg = lk_csv_config_default();
    write_bytes(tmp("w.csv"), "a,b,c\n1,2,3\n4,5\n", 17);
    CHECK_ERR(lk_csv_read(tmp("w.csv"), &cfg, &x, &y), LK_STATUS_INVALID_ARGUMENT, "line 3 has 2 columns, expected 3 (as on line 1)");
    write_bytes(tmp("n.csv"), "a,b,c\n1,2,3\n4,x5,6\n", 19);
    CHECK_ERR(lk_csv_read(tmp("n.csv"), &cfg, &x, &y), LK_STATUS_INVALID_ARGUMENT, "line 3, column 2 ('b'): 'x5' is not a number");
    write_bytes(tmp("e.csv"), "a,b\n1,\n", 7);
    CHECK_ERR(lk_csv_read(tmp("e.csv"), &cfg, &x, &y), LK_STATUS_INVALID_ARGUMENT, "line 2, column 2 ('b'): '' is not a number");
    write_bytes(tmp("l.csv"), "1,2,0.5\n", 8);
    CHECK_ERR(lk_csv_read(tmp("l.csv"), &cfg, &x, &y), LK_STATUS_INVALID_ARGUMENT, "label '0.5' is not an integer class");
    cfg.label_name = "target";
    write_bytes(tmp("h.csv"), "a,b\n1,2\n", 8);
    CHECK_ERR(lk_csv_read(tmp("h.csv"), &cfg, &x, &y), LK_STATUS_INVALID_ARGUMENT, "no column named 'target'; the header has 'a', 'b'");
    cfg = lk_csv_config_default();
    cfg.label_column = 5;
    CHECK_ERR(lk_csv_read(tmp("h.csv"), &cfg, &x, &y), LK_STATUS_INVALID_ARGUMENT, "label_column 5 but the lines have 2 columns");
    write_bytes(tmp("empty.csv"), "\n\n", 2);
    CHECK_ERR(lk_csv_read(tmp("empty.csv"), NULL, &x, &y), LK_STATUS_INVALID_ARGUMENT, "no data lines");
    CHECK_ERR(lk_csv_read(tmp("none.csv"), NULL, &x, &y), LK_STATUS_IO, "none.csv");
    CHECK(x.data == NULL && y.data == NULL);
    teardown();
}

/* ---- tokens ------------------------------------------------------------------ */

static void tokens(void) {
    setup();
    /* llm.c format: 1 KiB header, then 20 u16 tokens 100..119. */
    int32_t header[256] = {20240520, 1, 20};
    uint16_t toks[20];
    for (int i = 0; i < 20; i++) toks[i] = (uint16_t)(100 + i);
    FILE *f = fopen(tmp("t.bin"), "wb");
    fwrite(header, 4, 256, f);
    fwrite(toks, 2, 20, f);
    fclose(f);
    write_bytes(tmp("raw.bin"), toks, sizeof toks);
    lk_tokens_config cfg = lk_tokens_config_default();
    cfg.seq_len = 4;
    for (int raw = 0; raw < 2; raw++) {
        lk_dataset *ds = NULL;
        CHECK_OK(lk_dataset_tokens_create(tmp(raw ? "raw.bin" : "t.bin"), &cfg, &ds));
        if (!ds) continue;
        CHECK(lk_dataset_len(ds) == 4); /* windows start at 0, 4, 8, 12 (12 + 5 <= 20) */
        int64_t x[4], y[4];
        CHECK_OK(lk_dataset_get(ds, 3, 0, (void *[]){x, y}));
        for (int i = 0; i < 4; i++) CHECK(x[i] == 112 + i && y[i] == 113 + i);
        lk_dataset_free(ds);
    }
    cfg.stride = 3;
    cfg.dtype = LK_I32;
    lk_dataset *ds = NULL;
    CHECK_OK(lk_dataset_tokens_create(tmp("t.bin"), &cfg, &ds));
    if (ds) {
        CHECK(lk_dataset_len(ds) == 6); /* 0, 3, ..., 15 */
        int32_t x[4], y[4];
        CHECK_OK(lk_dataset_get(ds, 5, 0, (void *[]){x, y}));
        CHECK(x[0] == 115 && y[3] == 119);
        CHECK(lk_dataset_field(ds, 0)->dtype == LK_I32);
    }
    lk_dataset_free(ds);
    /* Errors: token count disagreeing with the size, vocab, odd raw size, too short. */
    header[2] = 30;
    f = fopen(tmp("bad.bin"), "wb");
    fwrite(header, 4, 256, f);
    fwrite(toks, 2, 20, f);
    fclose(f);
    cfg = lk_tokens_config_default();
    cfg.seq_len = 4;
    CHECK_ERR(lk_dataset_tokens_create(tmp("bad.bin"), &cfg, &ds), LK_STATUS_IO, "header says 30 tokens (60 bytes after the header), the file has 40");
    cfg.vocab_size = 110;
    CHECK_ERR(lk_dataset_tokens_create(tmp("raw.bin"), &cfg, &ds), LK_STATUS_INVALID_ARGUMENT, "token 10 is 110, expected < vocab_size 110");
    cfg.vocab_size = 0;
    write_bytes(tmp("odd.bin"), toks, 7);
    CHECK_ERR(lk_dataset_tokens_create(tmp("odd.bin"), &cfg, &ds), LK_STATUS_INVALID_ARGUMENT, "odd size (7 bytes)");
    cfg.seq_len = 20;
    CHECK_ERR(lk_dataset_tokens_create(tmp("raw.bin"), &cfg, &ds), LK_STATUS_INVALID_ARGUMENT, "20 tokens, fewer than one window of seq_len + 1 = 21");
    cfg.seq_len = 0;
    CHECK_ERR(lk_dataset_tokens_create(tmp("raw.bin"), &cfg, &ds), LK_STATUS_INVALID_ARGUMENT, "seq_len 0");
    CHECK(ds == NULL);
    teardown();
}

LK_TEST_MAIN(LK_TEST_CASE(idx_roundtrip), LK_TEST_CASE(idx_widening_and_endianness), LK_TEST_CASE(idx_errors),
             LK_TEST_CASE(fashion_mnist), LK_TEST_CASE(npy_fixtures), LK_TEST_CASE(npy_roundtrip_and_errors),
             LK_TEST_CASE(csv_read), LK_TEST_CASE(csv_errors), LK_TEST_CASE(label_out_of_range), LK_TEST_CASE(tokens),
             LK_TEST_CASE(nonfinite_inputs), LK_TEST_CASE(mnist_geometry))

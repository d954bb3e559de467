/* datasets and transforms: arrays, subset/range/random split, field
 * selection, synthetic data, and every transform op checked element by
 * element against a direct computation, including its determinism in
 * (seed, epoch, index) and its shape errors. */
#include <unistd.h>

#include "lk_test.h"

static lk_dataset *counting_dataset(int64_t n) {
    /* x: f32 [2] = (i, -i); y: i64 = i % 3 */
    lk_array a[2];
    CHECK_OK(lk_array_alloc(&a[0], LK_F32, 2, (int64_t[]){n, 2}));
    CHECK_OK(lk_array_alloc(&a[1], LK_I64, 1, (int64_t[]){n}));
    for (int64_t i = 0; i < n; i++) {
        ((float *)a[0].data)[2 * i] = (float)i;
        ((float *)a[0].data)[2 * i + 1] = (float)-i;
        ((int64_t *)a[1].data)[i] = i % 3;
    }
    lk_dataset *ds = NULL;
    CHECK_OK(lk_dataset_from_arrays(2, a, NULL, false, &ds));
    CHECK(a[0].data == NULL && a[1].data == NULL); /* taken */
    return ds;
}

static void arrays(void) {
    lk_dataset *ds = counting_dataset(10);
    CHECK(lk_dataset_len(ds) == 10 && lk_dataset_nfields(ds) == 2);
    CHECK(!strcmp(lk_dataset_field(ds, 0)->name, "x") && !strcmp(lk_dataset_field(ds, 1)->name, "y"));
    CHECK(lk_dataset_field_index(ds, "y") == 1 && lk_dataset_field_index(ds, "z") == -1);
    CHECK(lk_dataset_field(ds, 2) == NULL);
    CHECK(lk_field_nbytes(lk_dataset_field(ds, 0)) == 8);
    float x[2];
    int64_t y;
    CHECK_OK(lk_dataset_get(ds, 7, 0, (void *[]){x, &y}));
    CHECK(x[0] == 7 && x[1] == -7 && y == 1);
    CHECK_ERR(lk_dataset_get(ds, 10, 0, (void *[]){x, &y}), LK_STATUS_INVALID_ARGUMENT, "sample 10 out of range [0, 10)");
    lk_dataset_free(ds);
    lk_dataset_free(NULL);
    /* Borrowed data; mismatched counts are refused and leave the arrays alone. */
    uint8_t buf[6] = {1, 2, 3, 4, 5, 6};
    int32_t lab[3] = {0, 1, 2};
    lk_array a[2] = {{LK_U8, 2, {3, 2}, buf}, {LK_I32, 1, {2}, lab}};
    CHECK_ERR(lk_dataset_from_arrays(2, a, NULL, true, &ds), LK_STATUS_INVALID_ARGUMENT, "array 1 has 2 samples (shape [2]), array 0 has 3");
    CHECK(ds == NULL && a[0].data == buf);
    a[1].shape[0] = 3;
    CHECK_OK(lk_dataset_from_arrays(2, a, (const char *const[]){"img", "lab"}, true, &ds));
    CHECK(a[0].data == buf); /* borrowed: untouched */
    uint8_t px[2];
    int32_t l;
    CHECK_OK(lk_dataset_get(ds, 2, 0, (void *[]){px, &l}));
    CHECK(px[0] == 5 && px[1] == 6 && l == 2 && lk_dataset_field_index(ds, "lab") == 1);
    lk_dataset_free(ds);
}

static void subsets_and_splits(void) {
    lk_dataset *ds = counting_dataset(10), *sub = NULL, *rng = NULL;
    CHECK_OK(lk_dataset_subset(ds, (int64_t[]){9, 0, 4}, 3, &sub));
    CHECK_OK(lk_dataset_range(ds, 2, 5, &rng));
    lk_dataset_free(ds); /* the derived ones keep it alive */
    float x[2];
    int64_t y;
    CHECK(lk_dataset_len(sub) == 3 && lk_dataset_len(rng) == 3);
    CHECK_OK(lk_dataset_get(sub, 0, 0, (void *[]){x, &y}));
    CHECK(x[0] == 9 && y == 0);
    CHECK_OK(lk_dataset_get(rng, 2, 0, (void *[]){x, &y}));
    CHECK(x[0] == 4);
    lk_dataset *bad = NULL;
    CHECK_ERR(lk_dataset_subset(rng, (int64_t[]){0, 3}, 2, &bad), LK_STATUS_INVALID_ARGUMENT, "indices[1] = 3 is out of range [0, 3)");
    CHECK_ERR(lk_dataset_range(rng, 1, 4, &bad), LK_STATUS_INVALID_ARGUMENT, "[1, 4) is not within [0, 3)");
    lk_dataset_free(sub);
    lk_dataset_free(rng);

    /* Random split: disjoint, covering, sized as asked, deterministic in the seed. */
    ds = counting_dataset(103);
    lk_dataset *parts[3], *again[3];
    CHECK_OK(lk_dataset_random_split(ds, 3, (double[]){0.5, 0.3, 0.2}, 7, parts));
    CHECK_OK(lk_dataset_random_split(ds, 3, (double[]){0.5, 0.3, 0.2}, 7, again));
    int seen[103] = {0};
    /* As torch.utils.data.random_split(range(103), [0.5, 0.3, 0.2]): floor(51.5, 30.9, 20.6) =
     * 51, 30, 20, the two left over go to the first parts round-robin. */
    int64_t expect[3] = {52, 31, 20};
    for (int p = 0; p < 3; p++) {
        if (!parts[p]) continue;
        CHECK(lk_dataset_len(parts[p]) == expect[p]);
        for (int64_t i = 0; i < lk_dataset_len(parts[p]); i++) {
            float x2[2];
            CHECK_OK(lk_dataset_get(parts[p], i, 0, (void *[]){x, &y}));
            CHECK_OK(lk_dataset_get(again[p], i, 0, (void *[]){x2, &y}));
            CHECK(x[0] == x2[0]);
            seen[(int)x[0]]++;
        }
    }
    for (int i = 0; i < 103; i++) CHECK(seen[i] == 1);
    for (int p = 0; p < 3; p++) {
        lk_dataset_free(parts[p]);
        lk_dataset_free(again[p]);
    }
    CHECK_OK(lk_dataset_random_split(ds, 2, (double[]){100, 3}, 1, parts));
    CHECK(lk_dataset_len(parts[0]) == 100 && lk_dataset_len(parts[1]) == 3);
    lk_dataset_free(parts[0]);
    lk_dataset_free(parts[1]);
    CHECK_ERR(lk_dataset_random_split(ds, 2, (double[]){0.5, 0.4}, 1, parts), LK_STATUS_INVALID_ARGUMENT,
              "sizes sum to 0.9; expected counts summing to 103 or fractions summing to 1");
    CHECK(parts[0] == NULL && parts[1] == NULL);
    lk_dataset_free(ds);
}

static void concat(void) {
    lk_dataset *a = counting_dataset(3), *b = counting_dataset(5), *empty = counting_dataset(0), *c = NULL;
    CHECK_OK(lk_dataset_concat(4, (lk_dataset *[]){a, empty, b, a}, &c));
    lk_dataset_free(a);
    if (c) {
        CHECK(lk_dataset_len(c) == 11);
        static const float expect[11] = {0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2};
        for (int64_t i = 0; i < 11; i++) {
            float x[2];
            int64_t y;
            CHECK_OK(lk_dataset_get(c, i, 0, (void *[]){x, &y}));
            CHECK(x[0] == expect[i]);
        }
    }
    lk_dataset_free(c);
    lk_dataset *img = NULL;
    lk_synthetic_config sc = lk_synthetic_config_default();
    CHECK_OK(lk_dataset_synthetic_create(&sc, &img));
    CHECK_ERR(lk_dataset_concat(2, (lk_dataset *[]){b, img}, &c), LK_STATUS_INVALID_ARGUMENT,
              "dataset 1 ('synthetic', 2 fields) does not match dataset 0 ('arrays', 2 fields) at field 0: dtype f32 [16] vs f32 [2]");
    CHECK(c == NULL);
    lk_dataset_free(img);
    lk_dataset_free(b);
    lk_dataset_free(empty);
}

static void select_fields(void) {
    lk_dataset *ds = counting_dataset(5), *sel = NULL;
    /* (y, x, x): reorder and repeat, as an autoencoder reads (x, x). */
    CHECK_OK(lk_dataset_select(ds, 3, (int[]){1, 0, 0}, (const char *const[]){"label", "in", "target"}, &sel));
    if (sel) {
        CHECK(lk_dataset_nfields(sel) == 3 && !strcmp(lk_dataset_field(sel, 2)->name, "target"));
        int64_t y;
        float a[2], b[2];
        CHECK_OK(lk_dataset_get(sel, 4, 0, (void *[]){&y, a, b}));
        CHECK(y == 1 && a[0] == 4 && b[0] == 4 && b[1] == -4);
    }
    lk_dataset_free(sel);
    /* Dropping a field reads it into scratch. */
    CHECK_OK(lk_dataset_select(ds, 1, (int[]){1}, NULL, &sel));
    if (sel) {
        CHECK(lk_dataset_scratch_bytes(sel) >= 8);
        int64_t y;
        CHECK_OK(lk_dataset_get(sel, 2, 0, (void *[]){&y}));
        CHECK(y == 2);
    }
    lk_dataset_free(sel);
    CHECK_ERR(lk_dataset_select(ds, 1, (int[]){2}, NULL, &sel), LK_STATUS_INVALID_ARGUMENT, "field 2 does not exist (it has 2)");
    lk_dataset_free(ds);
}

static void synthetic(void) {
    lk_synthetic_config cfg = lk_synthetic_config_default();
    cfg.len = 2000;
    cfg.dim = 8;
    cfg.classes = 3;
    cfg.noise = 0.05f;
    cfg.seed = 11;
    lk_dataset *a = NULL, *b = NULL;
    CHECK_OK(lk_dataset_synthetic_create(&cfg, &a));
    CHECK_OK(lk_dataset_synthetic_create(&cfg, &b));
    if (!a || !b) return;
    int64_t counts[3] = {0};
    for (int64_t i = 0; i < 2000; i++) {
        float xa[8], xb[8];
        int64_t ya, yb;
        CHECK_OK(lk_dataset_get(a, i, 0, (void *[]){xa, &ya}));
        CHECK_OK(lk_dataset_get(b, 1999 - i, 0, (void *[]){xb, &yb}));
        if (ya >= 0 && ya < 3) counts[ya]++;
        else CHECK(0);
    }
    for (int c = 0; c < 3; c++) CHECK(counts[c] > 550 && counts[c] < 780);
    /* Order-independent: sample 5 is the same whoever reads it when. */
    float x1[8], x2[8];
    int64_t y1, y2;
    CHECK_OK(lk_dataset_get(a, 5, 0, (void *[]){x1, &y1}));
    CHECK_OK(lk_dataset_get(b, 5, 3, (void *[]){x2, &y2}));
    CHECK(memcmp(x1, x2, sizeof x1) == 0 && y1 == y2);
    lk_dataset_free(a);
    lk_dataset_free(b);

    /* Regression without noise is exactly affine: with dim 1, any three samples are collinear. */
    cfg.kind = LK_SYNTH_REGRESSION;
    cfg.noise = 0;
    cfg.dim = 1;
    cfg.out_dim = 2;
    CHECK_OK(lk_dataset_synthetic_create(&cfg, &a));
    if (a) {
        CHECK(lk_dataset_field(a, 1)->dtype == LK_F32 && lk_dataset_field(a, 1)->shape[0] == 2);
        float xs[3], ys[3][2];
        for (int i = 0; i < 3; i++) CHECK_OK(lk_dataset_get(a, i, 0, (void *[]){&xs[i], ys[i]}));
        for (int o = 0; o < 2; o++) {
            double s1 = (ys[1][o] - ys[0][o]) / (xs[1] - xs[0]), s2 = (ys[2][o] - ys[0][o]) / (xs[2] - xs[0]);
            CHECK_NEAR(s1, s2, 1e-4 * (1 + fabs(s1)));
        }
    }
    lk_dataset_free(a);
    cfg.kind = LK_SYNTH_IMAGES;
    cfg.dim = 12;
    cfg.noise = 0.1f;
    CHECK_OK(lk_dataset_synthetic_create(&cfg, &a));
    if (a) {
        const lk_field *f = lk_dataset_field(a, 0);
        CHECK(f->ndim == 3 && f->shape[0] == 1 && f->shape[1] == 12 && f->shape[2] == 12);
        float img[144];
        int64_t y;
        CHECK_OK(lk_dataset_get(a, 3, 0, (void *[]){img, &y}));
        for (int i = 0; i < 144; i++) CHECK(img[i] >= 0 && img[i] <= 1);
    }
    lk_dataset_free(a);
    cfg.dim = 0;
    CHECK_ERR(lk_dataset_synthetic_create(&cfg, &a), LK_STATUS_INVALID_ARGUMENT, "dim 0, expected 1..");
}

/* A u8 [2, 3, 4] image per sample: value = 10 * index + position. */
static lk_dataset *image_dataset(int64_t n) {
    lk_array a[2];
    CHECK_OK(lk_array_alloc(&a[0], LK_U8, 4, (int64_t[]){n, 2, 3, 4}));
    CHECK_OK(lk_array_alloc(&a[1], LK_U8, 1, (int64_t[]){n}));
    for (int64_t i = 0; i < n; i++) {
        for (int k = 0; k < 24; k++) ((uint8_t *)a[0].data)[i * 24 + k] = (uint8_t)(10 * i + k);
        ((uint8_t *)a[1].data)[i] = (uint8_t)i;
    }
    lk_dataset *ds = NULL;
    CHECK_OK(lk_dataset_from_arrays(2, a, NULL, false, &ds));
    return ds;
}

static void transforms_deterministic(void) {
    lk_dataset *ds = image_dataset(4), *m = NULL;
    lk_transform *t = NULL;
    CHECK_OK(lk_transform_create(&t));
    CHECK_OK(lk_transform_cast(t, LK_F32));
    CHECK_OK(lk_transform_scale(t, 0.5f, 1.0f));
    CHECK_OK(lk_transform_normalize(t, 2, (float[]){1, 2}, (float[]){2, 4}));
    CHECK_OK(lk_transform_reshape(t, 2, (int64_t[]){-1, 4}));
    CHECK_OK(lk_transform_clamp(t, -1.0f, 3.0f));
    CHECK_OK(lk_dataset_map(ds, 0, t, 1, &m));
    lk_transform_free(t);
    if (!m) return;
    const lk_field *f = lk_dataset_field(m, 0);
    CHECK(f->dtype == LK_F32 && f->ndim == 2 && f->shape[0] == 6 && f->shape[1] == 4);
    CHECK(lk_dataset_field(m, 1)->dtype == LK_U8); /* the other field passes through */
    float x[24];
    uint8_t y;
    CHECK_OK(lk_dataset_get(m, 3, 0, (void *[]){x, &y}));
    CHECK(y == 3);
    for (int k = 0; k < 24; k++) {
        int c = k / 12;
        float v = ((float)(30 + k) * 0.5f + 1.0f - (c ? 2.0f : 1.0f)) * (c ? 0.25f : 0.5f);
        v = v < -1 ? -1 : v > 3 ? 3 : v;
        CHECK_NEAR(x[k], v, 1e-6);
    }
    lk_dataset_free(m);
    lk_dataset_free(ds);
}

static void transforms_random(void) {
    lk_dataset *ds = image_dataset(64), *m = NULL, *m2 = NULL;
    lk_transform *t = NULL;
    CHECK_OK(lk_transform_create(&t));
    CHECK_OK(lk_transform_random_hflip(t, 0.5f));
    CHECK_OK(lk_transform_random_crop(t, 3, 3, 1));
    CHECK_OK(lk_dataset_map(ds, 0, t, 99, &m));
    CHECK_OK(lk_dataset_map(ds, 0, t, 99, &m2));
    lk_transform_free(t);
    if (!m || !m2) return;
    const lk_field *f = lk_dataset_field(m, 0);
    CHECK(f->dtype == LK_U8 && f->ndim == 3 && f->shape[0] == 2 && f->shape[1] == 3 && f->shape[2] == 3);
    int flips = 0, differ_epoch = 0;
    for (int64_t i = 0; i < 64; i++) {
        uint8_t a[18], b[18], c[18], lab;
        CHECK_OK(lk_dataset_get(m, i, 5, (void *[]){a, &lab}));
        CHECK_OK(lk_dataset_get(m2, i, 5, (void *[]){b, &lab}));
        CHECK_OK(lk_dataset_get(m, i, 6, (void *[]){c, &lab}));
        CHECK(memcmp(a, b, sizeof a) == 0); /* same (seed, epoch, index) -> same draw */
        differ_epoch += memcmp(a, c, sizeof a) != 0;
        /* Every output pixel is zero padding or a source pixel of the same channel, and the crop
         * is a window: reconstruct (flip, oy, ox) from the result by brute force. */
        int found = 0;
        for (int flip = 0; flip < 2 && !found; flip++)
            for (int oy = -1; oy <= 1 && !found; oy++)
                for (int ox = -1; ox <= 2 && !found; ox++) {
                    int ok = 1;
                    for (int ch = 0; ch < 2; ch++)
                        for (int r = 0; r < 3; r++)
                            for (int col = 0; col < 3; col++) {
                                int sy = oy + r, sx = ox + col;
                                int v = 0;
                                if (sy >= 0 && sy < 3 && sx >= 0 && sx < 4) {
                                    int srcx = flip ? 3 - sx : sx;
                                    v = (uint8_t)(10 * i + ch * 12 + sy * 4 + srcx);
                                }
                                ok &= a[ch * 9 + r * 3 + col] == v;
                            }
                    if (ok) {
                        found = 1;
                        flips += flip;
                    }
                }
        CHECK_MSG(found, "sample %lld is not a flipped/cropped window of the source", (long long)i);
    }
    CHECK(flips > 15 && flips < 49);
    CHECK(differ_epoch > 32);
    lk_dataset_free(m);
    lk_dataset_free(m2);

    /* Noise: mean ~0, std as asked. */
    lk_synthetic_config sc = lk_synthetic_config_default();
    sc.kind = LK_SYNTH_REGRESSION;
    sc.dim = 4096;
    sc.len = 2;
    lk_dataset *syn = NULL;
    CHECK_OK(lk_dataset_synthetic_create(&sc, &syn));
    CHECK_OK(lk_transform_create(&t));
    CHECK_OK(lk_transform_gaussian_noise(t, 0.5f));
    CHECK_OK(lk_dataset_map(syn, 0, t, 3, &m));
    lk_transform_free(t);
    if (m) {
        static float clean[4096], noisy[4096];
        float yv[1];
        CHECK_OK(lk_dataset_get(syn, 1, 0, (void *[]){clean, yv}));
        CHECK_OK(lk_dataset_get(m, 1, 0, (void *[]){noisy, yv}));
        double s = 0, s2 = 0;
        for (int i = 0; i < 4096; i++) {
            double d = noisy[i] - clean[i];
            s += d;
            s2 += d * d;
        }
        CHECK_NEAR(s / 4096, 0.0, 0.05);
        CHECK_NEAR(sqrt(s2 / 4096), 0.5, 0.03);
    }
    lk_dataset_free(m);
    lk_dataset_free(syn);
    lk_dataset_free(ds);
}

static void transform_errors(void) {
    lk_dataset *ds = image_dataset(2), *m = NULL;
    lk_transform *t = NULL;
    CHECK_OK(lk_transform_create(&t));
    CHECK_OK(lk_transform_scale(t, 2, 0));
    CHECK_ERR(lk_dataset_map(ds, 0, t, 0, &m), LK_STATUS_INVALID_ARGUMENT, "transform op 0 (scale) on field 'x': needs f32 data");
    lk_transform_free(t);
    CHECK_OK(lk_transform_create(&t));
    CHECK_OK(lk_transform_cast(t, LK_F32));
    CHECK_OK(lk_transform_normalize(t, 3, (float[]){0, 0, 0}, (float[]){1, 1, 1}));
    CHECK_ERR(lk_dataset_map(ds, 0, t, 0, &m), LK_STATUS_INVALID_ARGUMENT, "3 means/stds but the sample shape is [2, 3, 4]");
    lk_transform_free(t);
    CHECK_OK(lk_transform_create(&t));
    CHECK_OK(lk_transform_reshape(t, 2, (int64_t[]){5, -1}));
    CHECK_ERR(lk_dataset_map(ds, 0, t, 0, &m), LK_STATUS_INVALID_ARGUMENT, "cannot view [2, 3, 4] (24 elements) as [5, -1]");
    lk_transform_free(t);
    CHECK_OK(lk_transform_create(&t));
    CHECK_OK(lk_transform_random_crop(t, 6, 2, 1));
    CHECK_ERR(lk_dataset_map(ds, 0, t, 0, &m), LK_STATUS_INVALID_ARGUMENT, "H + 2*pad >= 6");
    CHECK_ERR(lk_dataset_map(ds, 4, t, 0, &m), LK_STATUS_INVALID_ARGUMENT, "field 4 does not exist");
    CHECK(m == NULL);
    CHECK_ERR(lk_transform_normalize(t, 1, (float[]){0}, (float[]){0}), LK_STATUS_INVALID_ARGUMENT, "std > 0");
    CHECK_ERR(lk_transform_random_hflip(t, 1.5f), LK_STATUS_INVALID_ARGUMENT, "p = 1.5, expected 0..1");
    CHECK_ERR(lk_transform_cast(t, LK_BF16), LK_STATUS_INVALID_ARGUMENT, "expected f32, f64, i32, i64 or u8");
    CHECK_ERR(lk_transform_reshape(t, 2, (int64_t[]){-1, -1}), LK_STATUS_INVALID_ARGUMENT, "-1 once");
    lk_transform_free(t);
    lk_transform_free(NULL);
    /* Labels: u8 -> i64 cast on field 1. */
    CHECK_OK(lk_transform_create(&t));
    CHECK_OK(lk_transform_cast(t, LK_I64));
    CHECK_OK(lk_dataset_map(ds, 1, t, 0, &m));
    lk_transform_free(t);
    if (m) {
        uint8_t img[24];
        int64_t y = -1;
        CHECK(lk_dataset_field(m, 1)->dtype == LK_I64);
        CHECK_OK(lk_dataset_get(m, 1, 0, (void *[]){img, &y}));
        CHECK(y == 1 && img[0] == 10);
    }
    lk_dataset_free(m);
    lk_dataset_free(ds);
}

/* A custom dataset through the public vtable. */
static lk_status squares_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    *(int64_t *)out[0] = index * index + *(int64_t *)ctx;
    return LK_STATUS_OK;
}
static void squares_free(void *ctx) { lk_free(ctx); }
static const lk_dataset_vtable squares_vt = {.kind = "squares", .get = squares_get, .free = squares_free};

static void custom_dataset(void) {
    int64_t *ctx = lk_malloc(sizeof *ctx);
    *ctx = 1;
    lk_field f = {"v", LK_I64, 0, {0}};
    lk_dataset *ds = NULL;
    CHECK_OK(lk_dataset_create(&squares_vt, ctx, 100, 1, &f, 0, &ds));
    int64_t v;
    CHECK_OK(lk_dataset_get(ds, 9, 0, (void *[]){&v}));
    CHECK(v == 82 && !strcmp(lk_dataset_kind(ds), "squares"));
    lk_dataset_free(ds);
    /* On failure the context is freed too (ASan checks there is no leak). */
    ctx = lk_malloc(sizeof *ctx);
    CHECK_ERR(lk_dataset_create(&squares_vt, ctx, -1, 1, &f, 0, &ds), LK_STATUS_INVALID_ARGUMENT, "length -1");
    CHECK(ds == NULL);
}

/* Materialize: the same bytes as reading each sample, for any thread
 * count; a sample that fails names itself, whichever thread read it. */
static lk_status failing_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    if (index == *(int64_t *)ctx) return lk_error(LK_STATUS_IO, "sample %lld: unreadable", (long long)index);
    *(int64_t *)out[0] = index;
    return LK_STATUS_OK;
}
static const lk_dataset_vtable failing_vt = {.kind = "failing", .get = failing_get, .free = squares_free};

static void materialize(void) {
    lk_synthetic_config cfg = lk_synthetic_config_default();
    cfg.len = 5000;
    cfg.dim = 33;
    cfg.classes = 4;
    cfg.seed = 5;
    lk_dataset *src = NULL, *m1 = NULL, *m3 = NULL;
    CHECK_OK(lk_dataset_synthetic_create(&cfg, &src));
    if (!src) return;
    CHECK_OK(lk_dataset_materialize(src, 1, &m1));
    CHECK_OK(lk_dataset_materialize(src, 3, &m3));
    if (m1 && m3) {
        CHECK(lk_dataset_len(m3) == 5000 && lk_dataset_nfields(m3) == 2 && !strcmp(lk_dataset_field(m3, 0)->name, "x"));
        int same = 1;
        for (int64_t i = 0; i < 5000; i += 7) {
            float a[33], b[33], c[33];
            int64_t ya, yb, yc;
            CHECK_OK(lk_dataset_get(src, i, 0, (void *[]){a, &ya}));
            CHECK_OK(lk_dataset_get(m1, i, 0, (void *[]){b, &yb}));
            CHECK_OK(lk_dataset_get(m3, i, 0, (void *[]){c, &yc}));
            same &= !memcmp(a, b, sizeof a) && !memcmp(a, c, sizeof a) && ya == yb && ya == yc;
        }
        CHECK(same);
    }
    lk_dataset_free(m1);
    lk_dataset_free(m3);
    lk_dataset_free(src);

    int64_t *bad = lk_malloc(sizeof *bad);
    *bad = 4321;
    lk_field f = {"v", LK_I64, 0, {0}};
    CHECK_OK(lk_dataset_create(&failing_vt, bad, 5000, 1, &f, 0, &src));
    for (int threads = 1; threads <= 4 && src; threads += 3) {
        lk_dataset *m = NULL;
        CHECK_ERR(lk_dataset_materialize(src, threads, &m), LK_STATUS_IO, "sample 4321: unreadable");
        CHECK(m == NULL);
    }
    lk_dataset_free(src);
}

/* A built-in model and data module whose samples do not fit are refused
 * once the data is set up, naming both sides' settings and the value that
 * fits, instead of a matmul shape error at the first step. */
static lk_status fit_builtin(const char *model, const lk_model_kv *margs, int nm, const char *shape) {
    lk_trainer_config cfg;
    lk_trainer_config_default(&cfg);
    cfg.max_steps = 1;
    cfg.enable_progress_bar = cfg.enable_checkpointing = cfg.enable_tensorboard = cfg.enable_model_summary = false;
    cfg.logger_set = true, cfg.n_loggers = 0;
    cfg.num_sanity_val_steps = 0;
    snprintf(cfg.default_root_dir, sizeof cfg.default_root_dir, "/tmp/lk_test_dataset_%d", (int)getpid());
    lk_model_kv dargs[] = {{"num_samples", "40"}, {"input_shape", shape}, {"num_classes", "4"}, {"batch_size", "8"}};
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_trainer *tr = NULL;
    lk_status st = lk_module_create_builtin(model, margs, nm, 1, &m);
    if (!st) st = lk_datamodule_create_builtin("synthetic", dargs, 4, 1, &dm);
    if (!st) st = lk_trainer_create(&cfg, NULL, NULL, &tr);
    if (!st) st = lk_trainer_fit(tr, m, dm, NULL);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", lk_last_error());
    lk_trainer_free(tr);
    lk_datamodule_free(dm);
    lk_module_free(m);
    if (st) lk_error(st, "%s", msg);
    return st;
}

static void model_data_mismatch(void) {
    lk_model_kv mlp[] = {{"input_dim", "1024"}, {"hidden", "[8]"}, {"num_classes", "4"}};
    CHECK_ERR(fit_builtin("mlp", mlp, 3, "[16]"), LK_STATUS_INVALID_ARGUMENT,
              "model mlp expects samples of [1024] (input_dim 1024), but data synthetic gives [16] (input_shape [16]) "
              "(model.init_args.input_dim: 16 fits the data)");
    mlp[0].value = "16";
    CHECK_OK(fit_builtin("mlp", mlp, 3, "[16]"));
    CHECK_OK(fit_builtin("mlp", mlp, 3, "[1, 4, 4]")); /* mlp flattens any sample of 16 */
    lk_model_kv cnn[] = {{"image_size", "8"}, {"channels", "[2, 2]"}, {"hidden", "4"}, {"num_classes", "4"}};
    CHECK_ERR(fit_builtin("cnn", cnn, 4, "[1, 12, 12]"), LK_STATUS_INVALID_ARGUMENT,
              "model cnn expects samples of [1, 8, 8] (in_channels 1, image_size 8), but data synthetic gives [1, 12, 12] "
              "(input_shape [1, 12, 12]) (model.init_args in_channels: 1 and image_size: 12 fit the data)");
    CHECK_ERR(fit_builtin("cnn", cnn, 4, "[2, 8, 4]"), LK_STATUS_INVALID_ARGUMENT, "but data synthetic gives [2, 8, 4]");
    CHECK_OK(fit_builtin("cnn", cnn, 4, "[1, 8, 8]"));
    CHECK_OK(fit_builtin("cnn", cnn, 4, "[64]")); /* one flat row of 1x8x8 */
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf /tmp/lk_test_dataset_%d", (int)getpid());
    CHECK(system(rm) == 0);
}

/* fashion_mnist's augmentation touches the training split only: with
 * random_hflip 1 every training image is the plain one mirrored, the
 * validation images (carved from the same file) and the test images are
 * unchanged; a random crop keeps the image's size and, with padding, moves
 * it by at most `padding` pixels, drawn anew each epoch. */
static lk_datamodule *fmnist_dm(const char *flip, const char *pad) {
    lk_model_kv args[] = {{"flatten", "false"}, {"random_hflip", flip}, {"random_crop_padding", pad},
                          {"num_workers", "0"}};
    lk_datamodule *dm = NULL;
    lk_status st = lk_datamodule_create_builtin("fashion_mnist", args, 4, 1, &dm);
    if (!st) st = dm->vt->setup(dm, "fit");
    if (st) {
        if (st == LK_STATUS_IO) printf("skip fashion_mnist_augment: %s\n", lk_last_error());
        else CHECK_OK(st);
        lk_datamodule_free(dm);
        return NULL;
    }
    return dm;
}

static void fashion_mnist_augment(void) {
    lk_datamodule *plain = fmnist_dm("0", "0");
    if (!plain) return;
    lk_datamodule *flip = fmnist_dm("1", "0"), *crop = fmnist_dm("0", "2");
    CHECK(flip && crop);
    if (!flip || !crop) return;
    float a[784], b[784], c[784];
    int64_t ya, yb;
    const char *splits[] = {"train", "val", "test"};
    for (int sp = 0; sp < 3; sp++) {
        lk_dataset *p = plain->vt->dataset(plain, splits[sp]), *f = flip->vt->dataset(flip, splits[sp]);
        CHECK(lk_dataset_len(p) == lk_dataset_len(f));
        for (int64_t i = 0; i < 50; i++) {
            CHECK_OK(lk_dataset_get(p, i, 0, (void *[]){a, &ya}));
            CHECK_OK(lk_dataset_get(f, i, 0, (void *[]){b, &yb}));
            CHECK(ya == yb);
            int same = 1, mirrored = 1;
            for (int r = 0; r < 28; r++)
                for (int x = 0; x < 28; x++) {
                    same &= a[r * 28 + x] == b[r * 28 + x];
                    mirrored &= a[r * 28 + x] == b[r * 28 + 27 - x];
                }
            if (sp == 0) CHECK(mirrored);
            else CHECK(same);
        }
    }
    /* crops: the same pixels shifted by (dy, dx) in [-2, 2], black where they
     * left the frame; some image moves, and the draws differ between epochs */
    lk_dataset *p = plain->vt->dataset(plain, "train"), *cr = crop->vt->dataset(crop, "train");
    int moved = 0, epochs_differ = 0;
    for (int64_t i = 0; i < 20; i++) {
        CHECK_OK(lk_dataset_get(p, i, 0, (void *[]){a, &ya}));
        CHECK_OK(lk_dataset_get(cr, i, 0, (void *[]){b, &yb}));
        CHECK_OK(lk_dataset_get(cr, i, 1, (void *[]){c, &yb}));
        int found = 0;
        for (int dy = -2; dy <= 2 && !found; dy++)
            for (int dx = -2; dx <= 2 && !found; dx++) {
                int ok = 1;
                for (int r = 0; r < 28 && ok; r++)
                    for (int x = 0; x < 28 && ok; x++) {
                        int sr = r + dy, sx = x + dx;
                        float want = sr >= 0 && sr < 28 && sx >= 0 && sx < 28 ? a[sr * 28 + sx] : 0.0f;
                        ok = b[r * 28 + x] == want;
                    }
                if (ok) found = 1, moved += dy || dx;
            }
        CHECK(found);
        epochs_differ += memcmp(b, c, sizeof b) != 0;
    }
    CHECK(moved > 0 && epochs_differ > 0);
    lk_datamodule_free(plain);
    lk_datamodule_free(flip);
    lk_datamodule_free(crop);
}

LK_TEST_MAIN(LK_TEST_CASE(arrays), LK_TEST_CASE(subsets_and_splits), LK_TEST_CASE(concat), LK_TEST_CASE(select_fields),
             LK_TEST_CASE(synthetic), LK_TEST_CASE(transforms_deterministic), LK_TEST_CASE(transforms_random),
             LK_TEST_CASE(transform_errors), LK_TEST_CASE(custom_dataset), LK_TEST_CASE(materialize),
             LK_TEST_CASE(model_data_mismatch), LK_TEST_CASE(fashion_mnist_augment))

/* data under failure injection, the SQLite way: fail the Nth allocation for
 * N = 1, 2, ... until the call succeeds, and require each failure to be a
 * clean OUT_OF_MEMORY with a message, an empty output and (under ASan) no
 * leak. Covers every reader, the compositions and the loader. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp */
#endif
#include <stdlib.h>
#include <unistd.h>

#include "lk_test.h"

static char dir[256];

static const char *path(const char *name) {
    static char buf[2][512];
    static int k;
    k ^= 1;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

typedef lk_status (*op_fn)(void *ctx);

/* Runs op with the Nth allocation failing for every N until it succeeds. */
static void fail_every_allocation(const char *name, op_fn op, void *ctx, void (*cleanup)(void *ctx)) {
    int failures = 0;
    for (long n = 1; n < 10000; n++) {
        lk_alloc_fail_after(n);
        lk_clear_error();
        lk_status st = op(ctx);
        lk_alloc_fail_after(0);
        if (st == LK_STATUS_OK) {
            if (cleanup) cleanup(ctx);
            CHECK_MSG(failures == n - 1 && failures > 0, "%s: %d injected failures", name, failures);
            return;
        }
        failures++;
        CHECK_MSG(st == LK_STATUS_OUT_OF_MEMORY, "%s: allocation %ld: got %s: %s", name, n, lk_status_str(st), lk_last_error());
        CHECK_MSG(lk_last_error()[0] != 0, "%s: allocation %ld failed without a message", name, n);
    }
    CHECK_MSG(0, "%s never succeeded", name);
}

static lk_array arr;
static lk_dataset *ds;
static void release_arr(void *c) { lk_array_release(&arr); }
static void free_ds(void *c) {
    lk_dataset_free(ds);
    ds = NULL;
}

static lk_status op_idx(void *c) { return lk_idx_read(path("a.idx.gz"), &arr); }
static lk_status op_npy(void *c) { return lk_npy_read(path("a.npy"), &arr); }
static lk_status op_csv_ds(void *c) { return lk_dataset_csv_create(path("a.csv"), NULL, &ds); }
static lk_status op_idx_pair(void *c) { return lk_dataset_idx_pair_create(path("a.idx.gz"), path("l.idx"), &ds); }
static lk_status op_tokens(void *c) {
    lk_tokens_config t = lk_tokens_config_default();
    t.seq_len = 3;
    return lk_dataset_tokens_create(path("t.bin"), &t, &ds);
}
static lk_status op_synth(void *c) {
    lk_synthetic_config s = lk_synthetic_config_default();
    return lk_dataset_synthetic_create(&s, &ds);
}
static lk_status op_npy_write(void *c) { return lk_npy_write(path("w.npy"), c); }

static lk_dataset *base;
static lk_dataset *parts[2];
static void free_parts(void *c) {
    lk_dataset_free(parts[0]);
    lk_dataset_free(parts[1]);
}
static lk_status op_split(void *c) { return lk_dataset_random_split(base, 2, (double[]){0.75, 0.25}, 1, parts); }
static lk_status op_map(void *c) {
    lk_transform *t = NULL;
    LK_TRY(lk_transform_create(&t));
    lk_status st = lk_transform_cast(t, LK_F32);
    if (!st) st = lk_transform_scale(t, 2, 0);
    if (!st) st = lk_transform_random_hflip(t, 0.5f);
    if (!st) st = lk_transform_normalize(t, 1, (float[]){0}, (float[]){1});
    if (!st) st = lk_transform_gaussian_noise(t, 0.1f);
    if (!st) st = lk_dataset_map(base, 0, t, 0, &ds);
    lk_transform_free(t);
    return st;
}
static lk_status op_concat(void *c) { return lk_dataset_concat(3, (lk_dataset *[]){base, base, base}, &ds); }
static lk_status op_select(void *c) { return lk_dataset_select(base, 2, (int[]){0, 0}, NULL, &ds); }

static lk_loader *loader;
static void free_loader(void *c) {
    lk_loader_free(loader);
    loader = NULL;
}
static lk_status op_loader(void *c) {
    lk_loader_config cfg = lk_loader_config_default();
    cfg.batch_size = 4;
    cfg.num_workers = *(int *)c;
    LK_TRY(lk_loader_create(base, &cfg, &loader));
    lk_status st = lk_loader_start(loader, 0, 0);
    const lk_batch *b;
    while (!st && !(st = lk_loader_next(loader, &b)) && b) {}
    if (st) free_loader(NULL);
    return st;
}

static void readers(void) {
    snprintf(dir, sizeof dir, "/tmp/lk_data_fault_XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    lk_array a;
    CHECK_OK(lk_array_alloc(&a, LK_U8, 3, (int64_t[]){6, 4, 4}));
    CHECK_OK(lk_idx_write(path("a.idx.gz"), &a));
    CHECK_OK(lk_npy_write(path("a.npy"), &a));
    lk_array l;
    CHECK_OK(lk_array_alloc(&l, LK_U8, 1, (int64_t[]){6}));
    CHECK_OK(lk_idx_write(path("l.idx"), &l));
    lk_array_release(&l);
    FILE *f = fopen(path("a.csv"), "w");
    fputs("a,b,y\n1,2,0\n3,4,1\n", f);
    fclose(f);
    f = fopen(path("t.bin"), "wb");
    uint16_t toks[16] = {0};
    fwrite(toks, 2, 16, f);
    fclose(f);

    fail_every_allocation("idx read", op_idx, NULL, release_arr);
    fail_every_allocation("npy read", op_npy, NULL, release_arr);
    fail_every_allocation("csv dataset", op_csv_ds, NULL, free_ds);
    fail_every_allocation("idx pair", op_idx_pair, NULL, free_ds);
    fail_every_allocation("tokens", op_tokens, NULL, free_ds);
    fail_every_allocation("synthetic", op_synth, NULL, free_ds);
    fail_every_allocation("npy write", op_npy_write, &a, NULL);
    lk_array_release(&a);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static void compositions_and_loader(void) {
    lk_array a[2];
    CHECK_OK(lk_array_alloc(&a[0], LK_U8, 2, (int64_t[]){20, 3}));
    CHECK_OK(lk_array_alloc(&a[1], LK_I64, 1, (int64_t[]){20}));
    CHECK_OK(lk_dataset_from_arrays(2, a, NULL, false, &base));
    fail_every_allocation("random split", op_split, NULL, free_parts);
    fail_every_allocation("map", op_map, NULL, free_ds);
    fail_every_allocation("select", op_select, NULL, free_ds);
    fail_every_allocation("concat", op_concat, NULL, free_ds);
    int workers0 = 0, workers2 = 2;
    fail_every_allocation("loader (no workers)", op_loader, &workers0, free_loader);
    fail_every_allocation("loader (2 workers)", op_loader, &workers2, free_loader);
    lk_dataset_free(base);
}

LK_TEST_MAIN(LK_TEST_CASE(readers), LK_TEST_CASE(compositions_and_loader))

/* The distributed sampler and the prefetching loader: shards that cover the
 * data as PyTorch's DistributedSampler does, batches that are identical for
 * any worker count and any resume point, errors that reach the caller with
 * their message, and no allocation or hang whatever the caller does. */
#include <stdatomic.h>
#include <unistd.h>

#include "lk_test.h"

/* ---- sampler ----------------------------------------------------------------- */

static void sampler_shards(void) {
    int64_t lens[] = {0, 1, 5, 10, 11, 97};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int w = 1; w <= 4; w++)
            for (int drop = 0; drop < 2; drop++)
                for (int shuf = 0; shuf < 2; shuf++) {
                    int64_t n = lens[li];
                    int64_t per = drop ? n / w : (n + w - 1) / w;
                    int64_t *merged = lk_calloc((size_t)(per * w + 1), sizeof *merged);
                    int *count = lk_calloc((size_t)n + 1, sizeof *count);
                    for (int r = 0; r < w; r++) {
                        lk_sampler_config c = {n, r, w, shuf, drop, 5, false};
                        lk_sampler *s = NULL;
                        CHECK_OK(lk_sampler_create(&c, &s));
                        if (!s) continue;
                        lk_sampler_set_epoch(s, 3);
                        CHECK(lk_sampler_len(s) == per);
                        for (int64_t k = 0; k < per; k++) {
                            int64_t v = lk_sampler_indices(s)[k];
                            CHECK(v >= 0 && v < n);
                            merged[r + k * w] = v; /* rank r holds positions r, r + w, ... */
                            if (v >= 0 && v < n) count[v]++;
                        }
                        lk_sampler_free(s);
                    }
                    /* The interleaved shards are one permutation, padded by its own start. */
                    for (int64_t p = n; p < per * w; p++) CHECK(merged[p] == merged[p - n]);
                    for (int64_t i = 0; i < n; i++) {
                        if (drop) CHECK(count[i] <= 1);
                        else CHECK(count[i] >= 1);
                        if (!shuf && (drop ? i < per * w : 1)) CHECK(merged[i] == i); /* torch: no shuffle = identity */
                    }
                    lk_free(merged);
                    lk_free(count);
                }
}

/* Without shuffling the layout must be PyTorch's exactly. Expected lists printed by
 * torch.utils.data.DistributedSampler(range(n), num_replicas=W, rank=r, shuffle=False, drop_last=d). */
static void sampler_matches_pytorch(void) {
    static const struct {
        int64_t n;
        int w;
        bool drop;
        int64_t per;
        int64_t idx[4][4];
    } cases[] = {
        {10, 4, false, 3, {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}}},
        {10, 4, true, 2, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
        {3, 4, false, 1, {{0}, {1}, {2}, {0}}},
        {11, 3, false, 4, {{0, 3, 6, 9}, {1, 4, 7, 10}, {2, 5, 8, 0}}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int r = 0; r < cases[c].w; r++) {
            lk_sampler_config sc = {cases[c].n, r, cases[c].w, false, cases[c].drop, 0, false};
            lk_sampler *s = NULL;
            CHECK_OK(lk_sampler_create(&sc, &s));
            if (!s) continue;
            CHECK(lk_sampler_len(s) == cases[c].per);
            for (int64_t k = 0; k < cases[c].per; k++)
                CHECK_MSG(lk_sampler_indices(s)[k] == cases[c].idx[r][k], "case %zu rank %d position %lld", c, r,
                          (long long)k);
            lk_sampler_free(s);
        }
}

static void sampler_epochs(void) {
    lk_sampler_config c = {1000, 1, 2, true, false, 42, false};
    lk_sampler *a = NULL, *b = NULL, *other_rank = NULL;
    CHECK_OK(lk_sampler_create(&c, &a));
    CHECK_OK(lk_sampler_create(&c, &b));
    c.rank = 0;
    CHECK_OK(lk_sampler_create(&c, &other_rank));
    if (!a || !b || !other_rank) return;
    lk_sampler_set_epoch(a, 7);
    lk_sampler_set_epoch(b, 7);
    CHECK(memcmp(lk_sampler_indices(a), lk_sampler_indices(b), 500 * sizeof(int64_t)) == 0);
    lk_sampler_set_epoch(b, 8);
    int same = 0;
    for (int i = 0; i < 500; i++) same += lk_sampler_indices(a)[i] == lk_sampler_indices(b)[i];
    CHECK(same < 20);
    /* Ranks of one epoch are disjoint when n divides evenly. */
    lk_sampler_set_epoch(other_rank, 7);
    int seen[1000] = {0};
    for (int i = 0; i < 500; i++) {
        seen[lk_sampler_indices(a)[i]]++;
        seen[lk_sampler_indices(other_rank)[i]]++;
    }
    for (int i = 0; i < 1000; i++) CHECK(seen[i] == 1);
    uint64_t before = lk_alloc_count();
    lk_sampler_set_epoch(a, 9);
    CHECK(lk_alloc_count() == before);
    lk_sampler_free(a);
    lk_sampler_free(b);
    lk_sampler_free(other_rank);
    lk_sampler_free(NULL);
    lk_sampler *bad = NULL;
    lk_sampler_config badc = {10, 2, 2, false, false, 0, false};
    CHECK_ERR(lk_sampler_create(&badc, &bad), LK_STATUS_INVALID_ARGUMENT, "rank 2 of world size 2");
}

/* ---- loader ------------------------------------------------------------------ */

/* x: i64 [3] = (i, 2i, 3i); y: f32 = i / 2 */
static lk_dataset *seq_dataset(int64_t n) {
    lk_array a[2];
    CHECK_OK(lk_array_alloc(&a[0], LK_I64, 2, (int64_t[]){n, 3}));
    CHECK_OK(lk_array_alloc(&a[1], LK_F32, 1, (int64_t[]){n}));
    for (int64_t i = 0; i < n; i++) {
        for (int k = 0; k < 3; k++) ((int64_t *)a[0].data)[3 * i + k] = (k + 1) * i;
        ((float *)a[1].data)[i] = (float)i / 2;
    }
    lk_dataset *ds = NULL;
    CHECK_OK(lk_dataset_from_arrays(2, a, NULL, false, &ds));
    return ds;
}

/* Runs one epoch from `start`, appending every sample's x[0] to out; returns the count. */
static int64_t run_epoch(lk_loader *l, uint64_t epoch, int64_t start, int64_t *out, int64_t *batch_sizes) {
    int64_t n = 0, nb = 0;
    CHECK_OK(lk_loader_start(l, epoch, start));
    const lk_batch *b;
    for (;;) {
        lk_status st = lk_loader_next(l, &b);
        CHECK_OK(st);
        if (st || !b) break;
        CHECK(b->index == start + nb && b->epoch == epoch);
        CHECK(b->nfields == 2 && b->field[0].ndim == 2 && b->field[0].shape[0] == b->size && b->field[0].shape[1] == 3);
        CHECK(b->field[1].ndim == 1 && b->field[1].shape[0] == b->size && b->field[1].dtype == LK_F32);
        const int64_t *x = b->field[0].data;
        const float *y = b->field[1].data;
        for (int64_t i = 0; i < b->size; i++) {
            CHECK(x[3 * i] == b->sample_index[i] && x[3 * i + 2] == 3 * x[3 * i] && y[i] == (float)x[3 * i] / 2);
            out[n++] = x[3 * i];
        }
        if (batch_sizes) batch_sizes[nb] = b->size;
        nb++;
    }
    return n;
}

static void loader_same_for_any_worker_count(void) {
    lk_dataset *ds = seq_dataset(103);
    int64_t ref[200], got[200], sizes[20];
    int64_t nref = -1;
    int workers[] = {0, 1, 2, 4};
    for (int wi = 0; wi < 4; wi++)
        for (int pf = 1; pf <= 3; pf += 2) {
            lk_loader_config c = lk_loader_config_default();
            c.batch_size = 10;
            c.seed = 3;
            c.num_workers = workers[wi];
            c.prefetch = pf;
            lk_loader *l = NULL;
            CHECK_OK(lk_loader_create(ds, &c, &l));
            if (!l) continue;
            CHECK(lk_loader_len(l) == 11);
            int64_t n = run_epoch(l, 2, 0, got, sizes);
            CHECK(n == 103);
            CHECK(sizes[10] == 3 && sizes[0] == 10);
            if (nref < 0) {
                nref = n;
                memcpy(ref, got, sizeof got);
                int seen[103] = {0};
                for (int i = 0; i < 103; i++) seen[ref[i]]++;
                for (int i = 0; i < 103; i++) CHECK(seen[i] == 1);
            } else {
                CHECK_MSG(memcmp(ref, got, (size_t)n * sizeof *got) == 0, "workers %d prefetch %d differ", workers[wi], pf);
            }
            /* Another epoch is another order; the same epoch again is the same. */
            run_epoch(l, 3, 0, got, NULL);
            CHECK(memcmp(ref, got, 103 * sizeof *got) != 0);
            run_epoch(l, 2, 0, got, NULL);
            CHECK(memcmp(ref, got, 103 * sizeof *got) == 0);
            CHECK(lk_loader_wait_seconds(l) >= 0);
            lk_loader_free(l);
        }
    lk_dataset_free(ds);
}

static void loader_resume_and_drop_last(void) {
    lk_dataset *ds = seq_dataset(50);
    lk_loader_config c = lk_loader_config_default();
    c.batch_size = 8;
    c.drop_last = true;
    c.num_workers = 2;
    lk_loader *l = NULL;
    CHECK_OK(lk_loader_create(ds, &c, &l));
    if (!l) return;
    CHECK(lk_loader_len(l) == 6);
    int64_t full[64], part[64];
    CHECK(run_epoch(l, 1, 0, full, NULL) == 48);
    CHECK(run_epoch(l, 1, 4, part, NULL) == 16);
    CHECK(memcmp(full + 32, part, 16 * sizeof *part) == 0);
    CHECK(run_epoch(l, 1, 6, part, NULL) == 0);
    CHECK_ERR(lk_loader_start(l, 1, 7), LK_STATUS_INVALID_ARGUMENT, "start batch 7, expected 0..6");
    /* Restarting mid-epoch, with batches still in flight, is clean. */
    CHECK_OK(lk_loader_start(l, 1, 0));
    const lk_batch *b;
    CHECK_OK(lk_loader_next(l, &b));
    CHECK(run_epoch(l, 1, 0, part, NULL) == 48);
    CHECK(memcmp(full, part, 48 * sizeof *part) == 0);
    lk_loader_free(l);
    lk_dataset_free(ds);
}

static void loader_ranks_cover_dataset(void) {
    lk_dataset *ds = seq_dataset(23);
    int seen[23] = {0};
    int64_t total = 0;
    for (int r = 0; r < 3; r++) {
        lk_loader_config c = lk_loader_config_default();
        c.batch_size = 4;
        c.rank = r;
        c.world_size = 3;
        c.seed = 9;
        lk_loader *l = NULL;
        CHECK_OK(lk_loader_create(ds, &c, &l));
        if (!l) continue;
        CHECK(lk_loader_len(l) == 2); /* ceil(23 / 3) = 8 samples per rank */
        int64_t got[16];
        int64_t n = run_epoch(l, 0, 0, got, NULL);
        CHECK(n == 8);
        for (int64_t i = 0; i < n; i++) seen[got[i]]++;
        total += n;
        lk_loader_free(l);
    }
    CHECK(total == 24);
    int dup = 0;
    for (int i = 0; i < 23; i++) {
        CHECK(seen[i] >= 1);
        dup += seen[i] - 1;
    }
    CHECK(dup == 1); /* one padded sample */
    lk_dataset_free(ds);
}

static void loader_no_alloc_in_steady_state(void) {
    lk_dataset *ds = seq_dataset(200);
    lk_transform *t = NULL;
    lk_dataset *m = NULL;
    CHECK_OK(lk_transform_create(&t));
    CHECK_OK(lk_transform_cast(t, LK_F32));
    CHECK_OK(lk_transform_random_hflip(t, 0.5f));
    CHECK_OK(lk_dataset_map(ds, 0, t, 1, &m));
    lk_transform_free(t);
    lk_loader_config c = lk_loader_config_default();
    c.batch_size = 16;
    c.num_workers = 2;
    lk_loader *l = NULL;
    CHECK_OK(lk_loader_create(m, &c, &l));
    if (!l) return;
    const lk_batch *b;
    CHECK_OK(lk_loader_start(l, 0, 0)); /* starts the threads */
    while (lk_loader_next(l, &b) == LK_STATUS_OK && b) {}
    uint64_t before = lk_alloc_count();
    for (int e = 1; e < 3; e++) {
        CHECK_OK(lk_loader_start(l, (uint64_t)e, 0));
        int64_t nb = 0;
        while (lk_loader_next(l, &b) == LK_STATUS_OK && b) nb++;
        CHECK(nb == 13);
    }
    CHECK_MSG(lk_alloc_count() == before, "%llu allocations while iterating",
              (unsigned long long)(lk_alloc_count() - before));
    lk_loader_free(l);
    lk_dataset_free(m);
    lk_dataset_free(ds);
}

/* Fails on sample 37 in odd epochs, after a little work so failures race with other workers. */
static lk_status flaky_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    if (index == 37 && epoch % 2 == 1) return lk_error(LK_STATUS_IO, "disk on fire reading record %lld", (long long)index);
    *(int64_t *)out[0] = index;
    return LK_STATUS_OK;
}
static const lk_dataset_vtable flaky_vt = {.kind = "flaky", .get = flaky_get};

/* Prefetch hints: a dataset that counts them per index, under a subset
 * that reverses the order, so a hint must arrive at the mapped index. */
static atomic_int hinted[50];
static lk_status hinted_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    (void)ctx, (void)epoch, (void)scratch;
    *(int64_t *)out[0] = index;
    return LK_STATUS_OK;
}
static void hinted_prefetch(void *ctx, int64_t index) {
    (void)ctx;
    if (index >= 0 && index < 50) atomic_fetch_add(&hinted[index], 1);
}
static const lk_dataset_vtable hinted_vt = {.kind = "hinted", .get = hinted_get, .prefetch = hinted_prefetch};

static void loader_passes_prefetch_hints(void) {
    lk_field f = {"v", LK_I64, 0, {0}};
    lk_dataset *src = NULL, *sub = NULL;
    CHECK_OK(lk_dataset_create(&hinted_vt, NULL, 50, 1, &f, 0, &src));
    int64_t rev[40];
    for (int i = 0; i < 40; i++) rev[i] = 49 - i; /* samples 49..10 of the source */
    CHECK_OK(lk_dataset_subset(src, rev, 40, &sub));
    for (int workers = 0; workers <= 2; workers += 2) {
        for (int i = 0; i < 50; i++) atomic_store(&hinted[i], 0);
        lk_loader_config c = lk_loader_config_default();
        c.batch_size = 7;
        c.seed = 1;
        c.num_workers = workers;
        lk_loader *l = NULL;
        CHECK_OK(lk_loader_create(sub, &c, &l));
        if (!l) continue;
        CHECK_OK(lk_loader_start(l, 0, 0));
        int64_t n = 0;
        const lk_batch *b;
        while (!lk_loader_next(l, &b) && b) n += b->size;
        CHECK(n == 40);
        for (int i = 0; i < 50; i++)
            CHECK_MSG(atomic_load(&hinted[i]) == (i >= 10), "workers %d: source sample %d hinted %d times", workers, i,
                      atomic_load(&hinted[i]));
        lk_loader_free(l);
    }
    lk_dataset_free(sub);
    lk_dataset_free(src);
}

static void loader_errors(void) {
    lk_field f = {"v", LK_I64, 0, {0}};
    lk_dataset *ds = NULL;
    CHECK_OK(lk_dataset_create(&flaky_vt, NULL, 100, 1, &f, 0, &ds));
    for (int workers = 0; workers <= 3; workers += 3) {
        lk_loader_config c = lk_loader_config_default();
        c.batch_size = 10;
        c.shuffle = false;
        c.num_workers = workers;
        lk_loader *l = NULL;
        CHECK_OK(lk_loader_create(ds, &c, &l));
        if (!l) continue;
        const lk_batch *b = NULL;
        CHECK_ERR(lk_loader_next(l, &b), LK_STATUS_INVALID_USAGE, "before lk_loader_start");
        CHECK_OK(lk_loader_start(l, 1, 0));
        int ok = 0;
        lk_status st;
        while ((st = lk_loader_next(l, &b)) == LK_STATUS_OK && b) ok++;
        CHECK(ok == 3 && st == LK_STATUS_IO && b == NULL);
        CHECK(strstr(lk_last_error(), "loading batch 3 of epoch 1 (sample 37 of 'flaky'): disk on fire reading record 37"));
        CHECK_ERR(lk_loader_next(l, &b), LK_STATUS_IO, "the epoch stopped there");
        /* A new epoch reads again. */
        int64_t n = 0;
        CHECK_OK(lk_loader_start(l, 2, 0));
        while (lk_loader_next(l, &b) == LK_STATUS_OK && b) n += b->size;
        CHECK(n == 100);
        lk_loader_free(l);
    }
    lk_loader_config c = lk_loader_config_default();
    lk_loader *l = NULL;
    c.batch_size = 0;
    CHECK_ERR(lk_loader_create(ds, &c, &l), LK_STATUS_INVALID_ARGUMENT, "batch_size 0, expected >= 1");
    c = lk_loader_config_default();
    c.world_size = 2;
    c.rank = 5;
    CHECK_ERR(lk_loader_create(ds, &c, &l), LK_STATUS_INVALID_ARGUMENT, "rank 5 of world size 2");
    CHECK(l == NULL);
    lk_dataset_free(ds);
}

static void loader_free_while_busy(void) {
    /* Freed with workers blocked on a full ring, mid-epoch, or never started: no hang, no leak. */
    lk_synthetic_config sc = lk_synthetic_config_default();
    sc.len = 5000;
    sc.dim = 64;
    lk_dataset *ds = NULL;
    CHECK_OK(lk_dataset_synthetic_create(&sc, &ds));
    for (int k = 0; k < 3; k++) {
        lk_loader_config c = lk_loader_config_default();
        c.batch_size = 32;
        c.num_workers = 3;
        lk_loader *l = NULL;
        CHECK_OK(lk_loader_create(ds, &c, &l));
        if (k >= 1) CHECK_OK(lk_loader_start(l, 0, 0));
        const lk_batch *b;
        if (k == 2) CHECK_OK(lk_loader_next(l, &b));
        lk_loader_free(l);
    }
    lk_loader_free(NULL);
    lk_dataset_free(ds);
}

static atomic_int live_allocs;
static void *counting_alloc(void *ctx, size_t n) {
    atomic_fetch_add(&live_allocs, 1);
    (*(int *)ctx)++;
    return lk_aligned_alloc(LK_ALIGN, n);
}
static void counting_free(void *ctx, void *p) {
    atomic_fetch_sub(&live_allocs, 1);
    lk_aligned_free(p);
}

static void loader_host_allocator(void) {
    lk_dataset *ds = seq_dataset(10);
    int calls = 0;
    lk_loader_config c = lk_loader_config_default();
    c.batch_size = 4;
    c.num_workers = 1;
    c.prefetch = 2;
    c.alloc = counting_alloc;
    c.free = counting_free;
    c.alloc_ctx = &calls;
    lk_loader *l = NULL;
    CHECK_OK(lk_loader_create(ds, &c, &l));
    CHECK(calls == 3 * 2); /* (1 + workers * prefetch) slots x 2 fields */
    int64_t got[16];
    CHECK(run_epoch(l, 0, 0, got, NULL) == 10);
    lk_loader_free(l);
    CHECK(atomic_load(&live_allocs) == 0);
    c.free = NULL;
    CHECK_ERR(lk_loader_create(ds, &c, &l), LK_STATUS_INVALID_ARGUMENT, "both alloc and free");
    lk_dataset_free(ds);
}

/* hold = 2 (the trainer's device prefetch): the batch taken before the
 * last one keeps its memory and contents while workers fill ahead, and
 * the ring has one slot more for it; the order and contents of an epoch
 * are those of hold = 1. */
static void loader_hold_two(void) {
    lk_dataset *ds = seq_dataset(203);
    for (int workers = 0; workers <= 3; workers += 3) {
        int calls = 0;
        lk_loader_config c = lk_loader_config_default();
        c.batch_size = 4;
        c.shuffle = true;
        c.num_workers = workers;
        c.prefetch = 2;
        c.hold = 2;
        c.alloc = counting_alloc, c.free = counting_free, c.alloc_ctx = &calls;
        lk_loader *l = NULL;
        CHECK_OK(lk_loader_create(ds, &c, &l));
        if (!l) continue;
        CHECK_MSG(calls == (2 + workers * 2) * 2, "workers %d: %d buffers, expected (2 + workers x prefetch) x 2 fields",
                  workers, calls);
        CHECK_OK(lk_loader_start(l, 1, 0));
        const lk_batch *prev = NULL, *b = NULL;
        int64_t prev_x[4 * 3], batches = 0;
        while (lk_loader_next(l, &b) == LK_STATUS_OK && b) {
            if (prev) { /* taken one call ago: still there, unchanged, and not the same slot */
                CHECK(prev != b && prev->index == b->index - 1);
                CHECK_MSG(!memcmp(prev->field[0].data, prev_x, (size_t)prev->size * 3 * sizeof(int64_t)),
                          "workers %d: batch %lld changed while held", workers, (long long)prev->index);
            }
            if (workers) usleep(200); /* let the workers run ahead into the free slots */
            memcpy(prev_x, b->field[0].data, (size_t)b->size * 3 * sizeof(int64_t));
            prev = b;
            batches++;
        }
        CHECK(batches == 51);
        int64_t got[203], ref[203];
        CHECK(run_epoch(l, 2, 0, got, NULL) == 203);
        lk_loader_free(l);
        c.hold = 1, c.alloc = NULL, c.free = NULL;
        CHECK_OK(lk_loader_create(ds, &c, &l));
        CHECK(run_epoch(l, 2, 0, ref, NULL) == 203);
        CHECK(!memcmp(got, ref, sizeof got));
        lk_loader_free(l);
        CHECK(atomic_load(&live_allocs) == 0);
    }
    lk_loader_config c = lk_loader_config_default();
    lk_loader *l = NULL;
    c.hold = 9;
    CHECK_ERR(lk_loader_create(ds, &c, &l), LK_STATUS_INVALID_ARGUMENT, "loader: hold 9, expected 1..8");
    lk_dataset_free(ds);
}

/* Rank-0 prepare: a fake two-rank reduction run in one process. */
static int prepared;
static lk_status prep_ok(void *ctx) {
    prepared++;
    return LK_STATUS_OK;
}
static lk_status prep_fail(void *ctx) { return lk_error(LK_STATUS_IO, "cannot write %s", (const char *)ctx); }
static lk_status reduce_with(void *ctx, int *st) {
    int other = *(int *)ctx;
    if (other > *st) *st = other;
    return LK_STATUS_OK;
}

static void prepare(void) {
    int remote_ok = 0, remote_fail = LK_STATUS_IO;
    prepared = 0;
    CHECK_OK(lk_data_prepare(0, prep_ok, NULL, reduce_with, &remote_ok));
    CHECK_OK(lk_data_prepare(1, prep_ok, NULL, reduce_with, &remote_ok));
    CHECK(prepared == 1); /* only local rank 0 prepares */
    CHECK_ERR(lk_data_prepare(0, prep_fail, "/data/x", reduce_with, &remote_ok), LK_STATUS_IO, "cannot write /data/x");
    CHECK_ERR(lk_data_prepare(1, prep_ok, NULL, reduce_with, &remote_fail), LK_STATUS_REMOTE, "data prepare failed on another rank (i/o error)");
    CHECK_OK(lk_data_prepare(0, prep_ok, NULL, NULL, NULL));
    CHECK_ERR(lk_data_prepare(-1, prep_ok, NULL, NULL, NULL), LK_STATUS_INVALID_ARGUMENT, "local rank -1");
}

LK_TEST_MAIN(LK_TEST_CASE(sampler_shards), LK_TEST_CASE(sampler_matches_pytorch), LK_TEST_CASE(sampler_epochs), LK_TEST_CASE(loader_same_for_any_worker_count),
             LK_TEST_CASE(loader_resume_and_drop_last), LK_TEST_CASE(loader_ranks_cover_dataset),
             LK_TEST_CASE(loader_no_alloc_in_steady_state), LK_TEST_CASE(loader_errors), LK_TEST_CASE(loader_passes_prefetch_hints),
             LK_TEST_CASE(loader_free_while_busy), LK_TEST_CASE(loader_host_allocator), LK_TEST_CASE(loader_hold_two), LK_TEST_CASE(prepare))

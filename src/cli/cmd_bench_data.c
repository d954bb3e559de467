/* `lockstep bench data`: loader throughput (samples/s) on Fashion-MNIST,
 * through the same pipeline the fashion_mnist data module uses (u8 -> f32,
 * scale to [0, 1], flatten), and through an augmentation pipeline, per
 * worker count. A benchmark, not a test: it prints a table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "lockstep.h"

static int run(const char *name, lk_dataset *ds, int workers, int epochs, int64_t batch) {
    lk_loader_config c = lk_loader_config_default();
    c.batch_size = batch;
    c.num_workers = workers;
    lk_loader *l;
    if (lk_loader_create(ds, &c, &l)) return 1;
    const lk_batch *b;
    lk_status st = lk_loader_start(l, 0, 0); /* warm-up epoch: threads, caches */
    while (!st && !(st = lk_loader_next(l, &b)) && b) {
    }
    double t0 = lk_time_now(), wait = 0;
    int64_t samples = 0;
    for (int e = 1; e <= epochs && !st; e++) {
        st = lk_loader_start(l, (uint64_t)e, 0);
        while (!st && !(st = lk_loader_next(l, &b)) && b) samples += b->size;
        wait += lk_loader_wait_seconds(l);
    }
    double dt = lk_time_now() - t0;
    if (!st)
        printf("%-30s %7d %12.0f %9.1f%%\n", name, workers, (double)samples / dt, 100.0 * wait / dt);
    lk_loader_free(l);
    return st ? 1 : 0;
}

int lk_cmd_bench_data(int argc, char **argv) {
    int epochs = 3;
    int64_t batch = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--epochs") && i + 1 < argc) epochs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch-size") && i + 1 < argc) batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: lockstep bench data [--batch-size 256] [--epochs 3]\n"
                   "Loader samples/s on Fashion-MNIST train for 0, 1 and 2 worker threads, after a warm-up epoch;\n"
                   "'waiting' is the share of the time the consumer waited for a batch.\n");
            return 0;
        } else {
            fprintf(stderr, "lockstep bench data: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    lk_log_set_level(LK_LOG_WARN);
    double t0 = lk_time_now();
    lk_dataset *fm = NULL, *flat = NULL, *aug = NULL;
    lk_transform *t = NULL, *ta = NULL;
    int rc = 1;
    if (lk_dataset_mnist_create(NULL, "train", &fm)) goto done;
    printf("Fashion-MNIST train (60000 x 28 x 28, idx.gz) read and decompressed in %.3f s\n", lk_time_now() - t0);
    if (lk_transform_create(&t) || lk_transform_cast(t, LK_F32) || lk_transform_scale(t, 1.0f / 255, 0) ||
        lk_transform_reshape(t, 1, (int64_t[]){784}) || lk_dataset_map(fm, 0, t, 1, &flat))
        goto done;
    if (lk_transform_create(&ta) || lk_transform_cast(ta, LK_F32) || lk_transform_scale(ta, 1.0f / 255, 0) ||
        lk_transform_normalize(ta, 1, (float[]){0.2860f}, (float[]){0.3530f}) ||
        lk_transform_reshape(ta, 3, (int64_t[]){1, 28, 28}) || lk_transform_random_crop(ta, 28, 28, 2) ||
        lk_transform_random_hflip(ta, 0.5f) || lk_dataset_map(fm, 0, ta, 1, &aug))
        goto done;
    printf("\nbatch %lld, %d epochs after one warm-up epoch\n", (long long)batch, epochs);
    printf("%-30s %7s %12s %10s\n", "pipeline", "workers", "samples/s", "waiting");
    rc = 0;
    for (int w = 0; w <= 2 && !rc; w++) rc = run("f32 [0,1] flattened (trainer)", flat, w, epochs, batch);
    for (int w = 0; w <= 2 && !rc; w++) rc = run("f32 normalized + crop + flip", aug, w, epochs, batch);
done:
    if (rc || !fm) fprintf(stderr, "lockstep bench data: error: %s\n", lk_last_error());
    lk_transform_free(t);
    lk_transform_free(ta);
    lk_dataset_free(aug);
    lk_dataset_free(flat);
    lk_dataset_free(fm);
    return rc || !fm ? 1 : 0;
}

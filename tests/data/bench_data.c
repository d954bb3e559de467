/* Data loader throughput: samples/s for Fashion-MNIST (raw and through a
 * typical augmentation pipeline) and a synthetic image set, per worker
 * count. A program, not a test: it prints a table.
 *
 *   build-xxx/tests/bench_data [epochs=3] [batch=128]
 */
#include <stdio.h>
#include <stdlib.h>

#include "lockstep.h"

static void die(lk_status st) {
    fprintf(stderr, "bench_data: %s\n", lk_last_error());
    exit(st ? 1 : 0);
}
#define OK(call)                  \
    do {                          \
        lk_status st_ = (call);   \
        if (st_) die(st_);        \
    } while (0)

static void run(const char *name, lk_dataset *ds, int workers, int epochs, int64_t batch) {
    lk_loader_config c = lk_loader_config_default();
    c.batch_size = batch;
    c.num_workers = workers;
    lk_loader *l;
    OK(lk_loader_create(ds, &c, &l));
    const lk_batch *b;
    OK(lk_loader_start(l, 0, 0)); /* warm-up epoch: threads, page cache */
    while (!lk_loader_next(l, &b) && b) {}
    double t0 = lk_time_now(), wait = 0;
    int64_t samples = 0;
    double checksum = 0;
    for (int e = 1; e <= epochs; e++) {
        OK(lk_loader_start(l, (uint64_t)e, 0));
        lk_status st;
        while (!(st = lk_loader_next(l, &b)) && b) {
            samples += b->size;
            checksum += (double)((const unsigned char *)b->field[0].data)[0]; /* touch the batch */
        }
        if (st) die(st);
        wait += lk_loader_wait_seconds(l);
    }
    double dt = lk_time_now() - t0;
    printf("%-28s %7d %12.0f %10.1f %9.1f%%\n", name, workers, (double)samples / dt,
           (double)samples * (double)lk_field_nbytes(lk_dataset_field(ds, 0)) / dt / 1e6, 100.0 * wait / dt);
    (void)checksum;
    lk_loader_free(l);
}

int main(int argc, char **argv) {
    int epochs = argc > 1 ? atoi(argv[1]) : 3;
    int64_t batch = argc > 2 ? atoll(argv[2]) : 128;
    lk_log_set_level(LK_LOG_WARN);
    double t0 = lk_time_now();
    lk_dataset *fm = NULL;
    lk_status st = lk_dataset_mnist_create(NULL, "train", &fm);
    if (st) fprintf(stderr, "bench_data: Fashion-MNIST skipped: %s\n", lk_last_error());
    else printf("Fashion-MNIST train (60000 x 28 x 28, idx.gz) read and decompressed in %.3f s\n", lk_time_now() - t0);

    lk_transform *t;
    OK(lk_transform_create(&t));
    OK(lk_transform_cast(t, LK_F32));
    OK(lk_transform_scale(t, 1.0f / 255, 0));
    OK(lk_transform_normalize(t, 1, (float[]){0.2860f}, (float[]){0.3530f}));
    OK(lk_transform_reshape(t, 3, (int64_t[]){1, 28, 28}));
    OK(lk_transform_random_crop(t, 28, 28, 2));
    OK(lk_transform_random_hflip(t, 0.5f));

    lk_synthetic_config sc = lk_synthetic_config_default();
    sc.kind = LK_SYNTH_IMAGES;
    sc.len = 20000;
    sc.dim = 28;
    lk_dataset *syn;
    OK(lk_dataset_synthetic_create(&sc, &syn));

    printf("\nbatch %lld, %d epochs after one warm-up epoch\n", (long long)batch, epochs);
    printf("%-28s %7s %12s %10s %10s\n", "dataset", "workers", "samples/s", "MB/s (x)", "waiting");
    int workers[] = {0, 1, 2, 4};
    for (int w = 0; w < 4; w++) {
        if (fm) run("fashion-mnist u8", fm, workers[w], epochs, batch);
    }
    if (fm) {
        lk_dataset *aug;
        OK(lk_dataset_map(fm, 0, t, 1, &aug));
        for (int w = 0; w < 4; w++) run("fashion-mnist f32 augmented", aug, workers[w], epochs, batch);
        lk_dataset_free(aug);
    }
    for (int w = 0; w < 4; w++) run("synthetic images 28x28", syn, workers[w], 1, batch);
    lk_transform_free(t);
    lk_dataset_free(syn);
    lk_dataset_free(fm);
    return 0;
}

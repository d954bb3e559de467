/* Checkpoint I/O throughput against the disk: writes a safetensors file of
 * N MB (a few large tensors and many small ones, like a model plus its
 * optimizer state) with lk_safetensors_write (fsync included), reads it back
 * into tensors from the page cache (hot) and after dropping the file's
 * cached pages (cold), and times `dd if=/dev/zero bs=1M conv=fsync` of the
 * same size in the same run as the disk's sequential write speed. Virtual
 * disks vary a lot from one write to the next, so dd and lockstep alternate
 * for REPS rounds and the median of each is reported (best in brackets); the
 * hot read is the median of REPS too. Writing and reading check every
 * tensor's CRC-32C: its own cost is printed alone (the checksum of the whole
 * state in memory). DIR=/dev/shm takes the disk out (fsync is free there).
 *   build/tests/bench_safetensors [DIR=.] [MB=400] [REPS=5] */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lockstep.h"
#include "io/safetensors.h"

static void drop_cache(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    long mb = argc > 2 ? atol(argv[2]) : 400;
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    if (reps < 1 || reps > 50) reps = 5;
    char path[1024], ddpath[1024], cmd[3000];
    snprintf(path, sizeof path, "%s/bench.safetensors", dir);
    snprintf(ddpath, sizeof ddpath, "%s/bench.dd", dir);

    /* 90% in 8 large tensors, the rest in 4 KB..64 KB pieces */
    size_t total = (size_t)mb << 20, big = total * 9 / 10 / 8;
    int nt = 0, cap = 64;
    lk_tensor **ts = malloc(sizeof *ts * (size_t)cap);
    char **names = malloc(sizeof *names * (size_t)cap);
    size_t left = total;
    lk_rng r;
    lk_rng_init(&r, 1, LK_RNG_USER, 0, 0);
    while (left >= 4) {
        size_t bytes = nt < 8 ? big : 4096u << lk_rng_below(&r, 5);
        if (bytes > left) bytes = left & ~(size_t)3;
        if (nt == cap) {
            cap *= 2;
            ts = realloc(ts, sizeof *ts * (size_t)cap);
            names = realloc(names, sizeof *names * (size_t)cap);
        }
        int64_t n = (int64_t)(bytes / 4);
        ts[nt] = lk_tensor_empty(LK_F32, 1, &n);
        memset(ts[nt]->data, nt & 0xff, bytes); /* touch: real memory, not zero pages */
        names[nt] = malloc(32);
        snprintf(names[nt], 32, "layer.%d.weight", nt);
        nt++;
        left -= bytes;
    }
    lk_st_entry *e = calloc((size_t)nt, sizeof *e);
    for (int i = 0; i < nt; i++) e[i] = (lk_st_entry){.name = names[i], .tensor = ts[i]};
    double gb = (double)total / 1e9;

    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of='%s' bs=1M count=%ld conv=fsync status=none", ddpath, mb);
    double dd_t[50], w_t[50];
    for (int k = 0; k < reps; k++) {
        unlink(path); /* both start from the same state: neither file exists */
        sync();
        double t0 = lk_time_now();
        if (system(cmd)) fprintf(stderr, "dd failed\n");
        dd_t[k] = lk_time_now() - t0;
        unlink(ddpath);
        sync();
        t0 = lk_time_now();
        if (lk_safetensors_write(path, e, nt, NULL, 0)) {
            fprintf(stderr, "error: %s\n", lk_last_error());
            return 1;
        }
        w_t[k] = lk_time_now() - t0;
    }
    qsort(dd_t, (size_t)reps, sizeof(double), cmp_double);
    qsort(w_t, (size_t)reps, sizeof(double), cmp_double);
    double dd_s = dd_t[reps / 2], w_s = w_t[reps / 2];

    double rd[2] = {0, 0}, t0, hot[50];
    for (int pass = 0; pass < reps + 1; pass++) { /* reps hot reads, then a cold one */
        if (pass == reps) drop_cache(path);
        t0 = lk_time_now();
        lk_st_file *f;
        if (lk_safetensors_open(path, &f)) {
            fprintf(stderr, "error: %s\n", lk_last_error());
            return 1;
        }
        for (int i = 0; i < nt; i++)
            if (lk_safetensors_read_into(f, names[i], ts[i])) {
                fprintf(stderr, "error: %s\n", lk_last_error());
                return 1;
            }
        lk_safetensors_close(f);
        if (pass < reps) hot[pass] = lk_time_now() - t0;
        else rd[1] = lk_time_now() - t0;
    }
    qsort(hot, (size_t)reps, sizeof(double), cmp_double);
    rd[0] = hot[reps / 2];
    unlink(path);
    printf("safetensors %ld MB, %d tensors, in %s\n", mb, nt, dir);
    printf("  dd conv=fsync write : %6.3f s  %6.2f GB/s  (best %.2f GB/s, median of %d)\n", dd_s, gb / dd_s, gb / dd_t[0], reps);
    printf("  lockstep write+fsync: %6.3f s  %6.2f GB/s  (best %.2f GB/s; median %.0f%% of dd's)\n", w_s, gb / w_s,
           gb / w_t[0], 100 * dd_s / w_s);
    printf("  lockstep read (hot) : %6.3f s  %6.2f GB/s  (best %.2f GB/s)\n", rd[0], gb / rd[0], gb / hot[0]);
    printf("  lockstep read (cold): %6.3f s  %6.2f GB/s\n", rd[1], gb / rd[1]);
#ifdef LK_ST_CRC_PREFIX
    double crc_t[50];
    uint32_t sink = 0;
    for (int k = 0; k < reps; k++) {
        t0 = lk_time_now();
        for (int i = 0; i < nt; i++) sink ^= lk__crc32c(0, ts[i]->data, (size_t)ts[i]->numel * 4);
        crc_t[k] = lk_time_now() - t0;
    }
    qsort(crc_t, (size_t)reps, sizeof(double), cmp_double);
    printf("  crc32c of the tensors: %6.3f s  %6.2f GB/s  (best %.2f GB/s; %s, one thread; %08x)\n", crc_t[reps / 2],
           gb / crc_t[reps / 2], gb / crc_t[0], lk__crc32c_hardware() ? "SSE4.2" : "table", (unsigned)sink);
#endif
    for (int i = 0; i < nt; i++) {
        lk_tensor_release(ts[i]);
        free(names[i]);
    }
    free(ts);
    free(names);
    free(e);
    return 0;
}

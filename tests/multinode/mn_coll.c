/* The collectives that cross the nodes, for test_hier_paths.sh: makes a
 * communicator (argv[1]: the backend, default hier) and checks, on every
 * rank, an all-reduce (f32, 3.1 MB: hier's chunked pipeline), an
 * all-gather and a reduce-scatter (sum and avg) of values whose sums depend
 * on the order of additions:
 *   - each result is within 1e-6 x the sum of its terms' magnitudes of the
 *     sum computed here in double;
 *   - each result is bitwise the same as with the pipeline and the two-host
 *     swap turned off (LK_COMM_HIER_CHUNK=0, LK_COMM_MPI_PAIR_CHUNK=0:
 *     whole-buffer steps and OpenMPI's own collectives of two), and the
 *     all-reduce also with a 256 KiB pipeline chunk (13 chunks, the last
 *     one short);
 *   - argv[2] "blocked" (ranks laid out node by node, 2 nodes of 2):
 *     the all-reduce is bitwise (a0 + a1) + (a2 + a3), the hierarchical
 *     order, and the reduce-scatter's block is bitwise the all-reduce's.
 * Every rank sets the same variables at the same point (they decide the
 * sequence of collectives inside a node). Prints "coll BACKEND rank R/W
 * ok" or what differed; exit 0 on success. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep.h"

/* rank r's value i: a spread of magnitudes and signs, so a different order
 * of additions gives different bits */
static float val(int r, size_t i) {
    uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 977u);
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    float m = (float)(x & 0xffffu) / 65536.0f - 0.5f;
    return ldexpf(m, (int)((x >> 16) % 24) - 12);
}

static int fails;
#define FAIL(...)                                    \
    do {                                             \
        if (fails++ < 8) fprintf(stderr, __VA_ARGS__); \
    } while (0)

static void conf(const char *hier_chunk, const char *pair_chunk) {
    if (hier_chunk) setenv("LK_COMM_HIER_CHUNK", hier_chunk, 1);
    else unsetenv("LK_COMM_HIER_CHUNK");
    if (pair_chunk) setenv("LK_COMM_MPI_PAIR_CHUNK", pair_chunk, 1);
    else unsetenv("LK_COMM_MPI_PAIR_CHUNK");
}

static int ok(lk_status st, const char *what) {
    if (st) FAIL("coll: %s: %s\n", what, lk_last_error());
    return !st;
}

int main(int argc, char **argv) {
    lk_comm_config cfg = lk_comm_config_default();
    cfg.backend = argc > 1 ? argv[1] : "hier";
    cfg.timeout_s = 20;
    bool blocked = argc > 2 && !strcmp(argv[2], "blocked");
    lk_comm *c = NULL;
    if (lk_comm_create(&cfg, &c)) {
        fprintf(stderr, "coll: %s\n", lk_last_error());
        return 1;
    }
    int W = lk_comm_world_size(c), r = lk_comm_rank(c);
    const size_t NAR = 3 * 262144 + 12345, NAG = 40000, NRS = 50000;
    float *ar[3], *ag[2], *rs[2], *rsin = malloc(NRS * (size_t)W * sizeof(float));
    for (int k = 0; k < 3; k++) ar[k] = malloc(NAR * sizeof(float));
    for (int k = 0; k < 2; k++) ag[k] = malloc(NAG * (size_t)W * sizeof(float)), rs[k] = malloc(NRS * sizeof(float));
    float *rsavg = malloc(NRS * sizeof(float)), *arrs = malloc(NRS * (size_t)W * sizeof(float));
    float mine[NAG];
    for (size_t i = 0; i < NAG; i++) mine[i] = val(r, i);
    for (size_t i = 0; i < NRS * (size_t)W; i++) rsin[i] = val(r + 7, i);
    /* 0: the reference (no pipeline, OpenMPI's collectives of two); 1: the
     * defaults; 2 (all-reduce only): the pipeline in 256 KiB chunks */
    const char *hc[3] = {"0", NULL, "262144"}, *pc[3] = {"0", NULL, NULL};
    for (int k = 0; k < 3; k++) {
        conf(hc[k], pc[k]);
        for (size_t i = 0; i < NAR; i++) ar[k][i] = val(r, i);
        ok(lk_comm_all_reduce(c, ar[k], NAR, LK_F32, LK_REDUCE_SUM), "all_reduce");
        if (k == 2) break;
        ok(lk_comm_all_gather(c, mine, ag[k], NAG, LK_F32), "all_gather");
        ok(lk_comm_reduce_scatter(c, rsin, rs[k], NRS, LK_F32, LK_REDUCE_SUM), "reduce_scatter");
    }
    conf(NULL, NULL);
    ok(lk_comm_reduce_scatter(c, rsin, rsavg, NRS, LK_F32, LK_REDUCE_AVG), "reduce_scatter (avg)");
    memcpy(arrs, rsin, NRS * (size_t)W * sizeof(float));
    ok(lk_comm_all_reduce(c, arrs, NRS * (size_t)W, LK_F32, LK_REDUCE_SUM), "all_reduce (of the reduce-scatter's input)");
    if (!fails) {
        for (size_t i = 0; i < NAR; i++) {
            double want = 0, mag = 0; /* float rounding is relative to the terms, not to their (cancelled) sum */
            for (int q = 0; q < W; q++) want += val(q, i), mag += fabs(val(q, i));
            if (fabs(ar[1][i] - want) > 1e-6 * mag)
                FAIL("coll: all_reduce element %zu is %.9g, the sum is %.9g\n", i, ar[1][i], want);
            if (memcmp(&ar[0][i], &ar[1][i], 4) || memcmp(&ar[2][i], &ar[1][i], 4))
                FAIL("coll: all_reduce element %zu: %.9g (reference) %.9g (default) %.9g (256 KiB chunks) differ\n", i,
                     ar[0][i], ar[1][i], ar[2][i]);
            if (blocked && W == 4) {
                float h = (val(0, i) + val(1, i)) + (val(2, i) + val(3, i));
                if (memcmp(&h, &ar[1][i], 4))
                    FAIL("coll: all_reduce element %zu is %.9g, the hierarchical order gives %.9g\n", i, ar[1][i], h);
            }
        }
        for (size_t i = 0; i < NAG * (size_t)W; i++) {
            float want = val((int)(i / NAG), i % NAG);
            if (memcmp(&ag[0][i], &want, 4) || memcmp(&ag[1][i], &want, 4))
                FAIL("coll: all_gather element %zu is %.9g / %.9g, rank %zu sent %.9g\n", i, ag[0][i], ag[1][i], i / NAG,
                     want);
        }
        for (size_t i = 0; i < NRS; i++) {
            size_t at = (size_t)r * NRS + i;
            double want = 0, mag = 0;
            for (int q = 0; q < W; q++) want += val(q + 7, at), mag += fabs(val(q + 7, at));
            if (fabs(rs[1][i] - want) > 1e-6 * mag)
                FAIL("coll: reduce_scatter element %zu is %.9g, the sum is %.9g\n", i, rs[1][i], want);
            if (fabs(rsavg[i] - want / W) > 1e-6 * mag / W)
                FAIL("coll: reduce_scatter (avg) element %zu is %.9g, the mean is %.9g\n", i, rsavg[i], want / W);
            if (memcmp(&rs[0][i], &rs[1][i], 4))
                FAIL("coll: reduce_scatter element %zu: %.9g (reference) %.9g (default) differ\n", i, rs[0][i], rs[1][i]);
            if (blocked && memcmp(&arrs[at], &rs[1][i], 4))
                FAIL("coll: reduce_scatter element %zu is %.9g, the all-reduce's is %.9g\n", i, rs[1][i], arrs[at]);
        }
    }
    printf("coll %s rank %d/%d %s\n", lk_comm_backend(c), r, W, fails ? "FAIL" : "ok");
    fflush(stdout);
    lk_comm_free(c);
    for (int k = 0; k < 3; k++) free(ar[k]);
    for (int k = 0; k < 2; k++) free(ag[k]), free(rs[k]);
    free(rsin), free(rsavg), free(arrs);
    return fails ? 1 : 0;
}

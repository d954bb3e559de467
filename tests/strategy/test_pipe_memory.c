/* 1F1B's memory bound, measured: an mlp (64-256-256-256-10, 7 blocks) cut
 * evenly into p = 2 and 3 stages, each a forked rank on shm, runs 8
 * micro-batches of 32 rows with gpipe, with 1f1b, and one micro-batch alone
 * (the schedule with chunks 1); each rank measures the most tensor memory
 * the run held beyond what was live before it (the pool's live-bytes peak,
 * after a first run made the gradients and caches). GPipe keeps every
 * micro-batch's activations until the backwards; 1F1B must hold at most
 * p - stage micro-batches' worth (the schedule's live micro-batches, the
 * checker's figure), so stage k's 1f1b peak is at most (p - k) times its
 * one-micro-batch peak (1 KiB of slack for a loss's element), and at most
 * its gpipe peak. interleaved_1f1b (the 7 blocks cut into 2p stages, 2 per
 * rank) is measured beside them: it keeps more micro-batch-stages alive
 * (Megatron-LM's longer warm-up), each a stage of half the size, and at
 * most gpipe's. The table it prints is docs/STRATEGIES.md's. */
#include <string.h>

#include "comm/dist_util.h"
#include "lockstep/autograd.h"
#include "lockstep/models.h"
#include "lockstep/pipeline.h"

enum { M = 8, ROWS = 32, IN = 64, CLASSES = 10 };

typedef struct cfg {
    const char *schedule;
    int chunks;
    int v; /* the model's stages per rank */
} cfg;

typedef struct data {
    const lk_model_info *info;
    lk_tensor *x[M], *y[M];
} data;

static lk_tensor *input_of(void *ctx, int c) { return ((data *)ctx)->x[c]; }
static lk_tensor *loss_of(void *ctx, int c, lk_tensor *out) {
    data *d = ctx;
    return lk_model_loss(d->info, out, d->x[c], d->y[c]);
}

static int stage_rank(int rank, int world, void *arg) {
    const cfg *cf = arg;
    lk_comm *comm = du_shm_rank_comm(rank, world);
    if (!comm) return 1;
    lk_model_kv a[] = {{"input_dim", "64"}, {"hidden", "256,256,256"}, {"num_classes", "10"}};
    lk_layer *net = NULL;
    CHECK_OK(lk_model_create("mlp", a, 3, 7, &net));
    if (!net) return 1;
    data d = {.info = lk_model_find("mlp")};
    lk_rng rng;
    lk_rng_init(&rng, 99, 0, 0, 0);
    for (int c = 0; c < M; c++) {
        int64_t xs[2] = {ROWS, IN}, ys[1] = {ROWS};
        d.x[c] = lk_tensor_randn(&rng, 2, xs, 0.0f, 1.0f);
        d.y[c] = lk_tensor_zeros(LK_I64, 1, ys);
        for (int i = 0; i < ROWS; i++) ((int64_t *)d.y[c]->data)[i] = (c * 7 + i * 3) % CLASSES;
    }
    int nb = 0;
    const lk_named_layer *blocks = NULL;
    CHECK_OK(lk_model_blocks(lk_layer_get_child(net, "layers"), &nb, &blocks));
    /* the model's stage g holds blocks [nb g / n, nb (g + 1) / n); this rank stages rank, rank + world, ... */
    int n = world * cf->v, nmine = 0, count[4] = {0};
    lk_layer *mine[16];
    for (int j = 0; j < cf->v; j++) {
        int g = j * world + rank, lo = nb * g / n, hi = nb * (g + 1) / n;
        for (int b = lo; b < hi; b++) mine[nmine++] = blocks[b].layer;
        count[j] = hi - lo;
    }
    lk_pipe_schedule *s = NULL;
    CHECK_OK(lk_pipe_schedule_make_virtual(cf->schedule, world, cf->v, cf->chunks, &s));
    lk_pipe_stage st = {.comm = comm, .blocks = mine, .nblocks = nmine, .stage_blocks = count, .ctx = &d,
                        .input = input_of, .loss = loss_of, .loss_mul = 1.0f / (float)cf->chunks};
    /* the first run makes the parameters' gradients and fills the pool's caches */
    CHECK_OK(lk_pipe_run(s, &st, NULL));
    lk_named_tensors ps = {0};
    CHECK_OK(lk_layer_named_parameters(net, &ps));
    for (int i = 0; i < ps.n; i++) lk_tensor_zero_grad(ps.items[i].tensor, false);
    size_t live0 = lk_pool_reset_peak();
    CHECK_OK(lk_pipe_run(s, &st, NULL));
    du->t[rank] = (double)(lk_pool_get_stats().bytes_live_peak - live0);
    lk_named_tensors_clear(&ps);
    lk_pipe_schedule_free(s);
    for (int c = 0; c < M; c++) lk_tensor_release(d.x[c]), lk_tensor_release(d.y[c]);
    lk_layer_free(net);
    lk_comm_free(comm);
    return 0;
}

/* Each stage's peak bytes under `schedule` over `chunks` micro-batches. */
static bool measure(int p, const char *schedule, int chunks, double *peak) {
    du_map();
    cfg cf = {schedule, chunks, !strcmp(schedule, "interleaved_1f1b") ? 2 : 1};
    int codes[DU_MAXW];
    int ok = du_run(p, stage_rank, &cf, 60, codes, NULL);
    CHECK_MSG(ok == p, "%s, %d stages, %d chunks: %d of %d ranks passed", schedule, p, chunks, ok, p);
    for (int k = 0; k < p; k++) peak[k] = du->t[k];
    return ok == p;
}

static void bound(int p) {
    double one[4], gpipe[4], f1b1[4], il[4];
    if (!measure(p, "1f1b", 1, one) || !measure(p, "gpipe", M, gpipe) || !measure(p, "1f1b", M, f1b1) ||
        !measure(p, "interleaved_1f1b", M, il))
        return;
    printf("p = %d, m = %d, %d rows per micro-batch: peak tensor memory per stage (KiB)\n", p, M, ROWS);
    printf("stage | one micro-batch | gpipe | 1f1b | 1f1b / one | bound p - stage | interleaved_1f1b (2 stages per rank)\n");
    for (int k = 0; k < p; k++) {
        printf("%5d | %15.1f | %5.1f | %4.1f | %10.2f | %15d | %.1f\n", k, one[k] / 1024, gpipe[k] / 1024, f1b1[k] / 1024,
               f1b1[k] / one[k], p - k, il[k] / 1024);
        CHECK_MSG(il[k] <= gpipe[k], "rank %d: interleaved held %.0f bytes, more than gpipe's %.0f", k, il[k], gpipe[k]);
        /* 1 KiB over: the small tensors outside the micro-batches (a
         * loss's element, the next activation's header) */
        CHECK_MSG(f1b1[k] <= (p - k) * one[k] + 1024, "stage %d: 1f1b held %.0f bytes, more than %d micro-batches' %.0f", k,
                  f1b1[k], p - k, (p - k) * one[k]);
        CHECK_MSG(f1b1[k] <= gpipe[k], "stage %d: 1f1b held %.0f bytes, more than gpipe's %.0f", k, f1b1[k], gpipe[k]);
    }
    /* the first stage is where the schedules differ most: m against p micro-batches */
    CHECK_MSG(gpipe[0] >= 0.5 * M * one[0] / p, "stage 0: gpipe held %.0f bytes, under what %d micro-batches need", gpipe[0], M);
}

static void two_stages(void) { bound(2); }
static void three_stages(void) { bound(3); }

LK_TEST_MAIN(LK_TEST_CASE(two_stages), LK_TEST_CASE(three_stages))

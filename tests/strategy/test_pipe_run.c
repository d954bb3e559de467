/* The pipeline interpreter (lk_pipe_run) against one process: an mlp cut
 * into 2 and 3 stages and a tiny gpt cut into 2 and 3 stages, each rank a
 * forked process on the shm communicator, run gpipe and 1f1b over 4
 * micro-batches. Every rank also runs the whole model on the same
 * micro-batches one after another (the arithmetic the pipeline must
 * reproduce: each micro-batch's loss times 1/4, gradients accumulated in
 * micro-batch order) and checks that the gradients of the parameters its
 * stage holds are bitwise the same, and the last stage that its loss sum is.
 * The gpt's token embedding is tied to its head, so its gradient has a part
 * on the first stage and a part on the last: their sum is checked (within
 * float rounding: the one process adds the parts in another order).
 * interleaved_1f1b cuts both into 4 stages over 2 ranks (each rank holds
 * stages k and k + 2): the same bits. */
#include <math.h>
#include <string.h>

#include "comm/dist_util.h"
#include "lockstep/autograd.h"
#include "lockstep/models.h"
#include "lockstep/pipeline.h"

enum { M = 4, ROWS = 3 }; /* micro-batches, rows each */

typedef struct cfg {
    const char *model, *schedule;
    int stages; /* ranks */
    int v;      /* the model's stages per rank */
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

static lk_status build(const char *model, lk_layer **net, lk_layer **cut) {
    if (!strcmp(model, "mlp")) {
        lk_model_kv a[] = {{"input_dim", "12"}, {"hidden", "16,8"}, {"num_classes", "5"}};
        LK_TRY(lk_model_create("mlp", a, 3, 7, net));
        *cut = lk_layer_get_child(*net, "layers"); /* Linear ReLU Linear ReLU Linear */
    } else {
        lk_model_kv a[] = {{"n_layer", "2"},   {"n_head", "2"},     {"n_embd", "16"},
                           {"block_size", "8"}, {"vocab_size", "32"}, {"dropout", "0"}};
        LK_TRY(lk_model_create("gpt", a, 6, 7, net));
        *cut = *net; /* embedding, transformer.h.0, transformer.h.1, head */
    }
    return LK_STATUS_OK;
}

static void make_data(const char *model, data *d) {
    d->info = lk_model_find(model);
    lk_rng rng;
    lk_rng_init(&rng, 99, 0, 0, 0);
    for (int c = 0; c < M; c++) {
        if (!strcmp(model, "mlp")) {
            int64_t xs[2] = {ROWS, 12}, ys[1] = {ROWS};
            d->x[c] = lk_tensor_randn(&rng, 2, xs, 0.0f, 1.0f);
            d->y[c] = lk_tensor_zeros(LK_I64, 1, ys);
            for (int i = 0; i < ROWS; i++) ((int64_t *)d->y[c]->data)[i] = (c * 7 + i * 3) % 5;
        } else {
            int64_t s[2] = {ROWS, 8};
            d->x[c] = lk_tensor_zeros(LK_I64, 2, s);
            d->y[c] = lk_tensor_zeros(LK_I64, 2, s);
            for (int i = 0; i < ROWS * 8; i++) {
                ((int64_t *)d->x[c]->data)[i] = (c * 13 + i * 5) % 32;
                ((int64_t *)d->y[c]->data)[i] = (c * 11 + i * 7 + 1) % 32;
            }
        }
    }
}

static void free_data(data *d) {
    for (int c = 0; c < M; c++) lk_tensor_release(d->x[c]), lk_tensor_release(d->y[c]);
}

/* The whole model over the micro-batches one after another. */
static double reference(lk_layer *net, data *d) {
    double sum = 0.0;
    for (int c = 0; c < M; c++) {
        lk_scope_begin();
        lk_tensor *loss = lk_model_loss(d->info, lk_layer_forward(net, d->x[c]), d->x[c], d->y[c]);
        CHECK(loss != NULL);
        if (loss) {
            sum += lk_tensor_item(loss);
            CHECK_OK(lk_backward(lk_mul_scalar(loss, 1.0f / M)));
        }
        lk_scope_end();
    }
    return sum;
}

static bool same_bits(const lk_tensor *a, const lk_tensor *b) {
    return a && b && a->numel == b->numel && !memcmp(a->data, b->data, (size_t)a->numel * sizeof(float));
}

static int stage_rank(int rank, int world, void *arg) {
    const cfg *cf = arg;
    lk_comm *comm = du_shm_rank_comm(rank, world);
    if (!comm) return 1;
    lk_layer *ref = NULL, *net = NULL, *ref_cut, *cut;
    CHECK_OK(build(cf->model, &ref, &ref_cut));
    CHECK_OK(build(cf->model, &net, &cut));
    data d;
    make_data(cf->model, &d);
    double ref_loss = reference(ref, &d);

    /* the model's stage g holds blocks [nb g / n, nb (g + 1) / n): an even
     * cut; this rank holds stages rank, rank + world, ... */
    int nb = 0, n = world * cf->v, nmine = 0, count[4] = {0}, mine_idx[16];
    const lk_named_layer *blocks = NULL;
    CHECK_OK(lk_model_blocks(cut, &nb, &blocks));
    lk_layer *mine[16];
    for (int j = 0; j < cf->v; j++) {
        int g = j * world + rank, lo = nb * g / n, hi = nb * (g + 1) / n;
        for (int b = lo; b < hi; b++) mine_idx[nmine] = b, mine[nmine++] = blocks[b].layer;
        count[j] = hi - lo;
    }
    lk_pipe_schedule *s = NULL;
    CHECK_OK(lk_pipe_schedule_make_virtual(cf->schedule, world, cf->v, M, &s));
    lk_pipe_stage st = {.comm = comm, .blocks = mine, .nblocks = nmine, .stage_blocks = count, .ctx = &d,
                        .input = input_of, .loss = loss_of, .loss_mul = 1.0f / M};
    double loss = 0.0;
    if (cf->v > 1) { /* local stages that do not add up to the stage's blocks: refused before any message */
        int bad[4] = {count[0] + 1, count[1], 0, 0};
        lk_pipe_stage wrong = st;
        wrong.stage_blocks = bad;
        CHECK_ERR(lk_pipe_run(s, &wrong, &loss), LK_STATUS_INVALID_ARGUMENT, "stage_blocks gives its 2 local stages");
        wrong.stage_blocks = NULL;
        CHECK_ERR(lk_pipe_run(s, &wrong, &loss), LK_STATUS_INVALID_ARGUMENT, "runs 2 stages per rank but the stage "
                  "gives no stage_blocks");
    }
    lk_status rs = lk_pipe_run(s, &st, &loss);
    CHECK_MSG(rs == LK_STATUS_OK, "rank %d: %s", rank, lk_last_error());
    if (rank == world - 1) CHECK_MSG(loss == ref_loss, "loss sum %.17g, one process %.17g", loss, ref_loss);

    /* the gradients of this stage's parameters, by name in the whole model */
    lk_named_tensors ps = {0}, rps = {0};
    CHECK_OK(lk_layer_named_parameters(net, &ps));
    CHECK_OK(lk_layer_named_parameters(ref, &rps));
    int checked = 0;
    for (int q = 0; q < nmine; q++) {
        lk_named_tensors bp = {0};
        CHECK_OK(lk_layer_named_parameters(blocks[mine_idx[q]].layer, &bp));
        for (int i = 0; i < bp.n; i++) {
            const lk_tensor *p = bp.items[i].tensor;
            int j = 0;
            while (j < ps.n && ps.items[j].tensor != p) j++;
            CHECK(j < ps.n);
            if (j >= ps.n) continue;
            const char *name = ps.items[j].name;
            const lk_tensor *rg = lk_named_tensors_find(&rps, name)->grad;
            if (!strcmp(name, "transformer.wte.weight") || !strcmp(name, "lm_head.weight")) {
                /* tied: the first and the last stage each hold a part; their sum is the gradient */
                int64_t n = p->grad->numel;
                float *sum = lk_calloc((size_t)n, sizeof(float));
                memcpy(sum, p->grad->data, (size_t)n * sizeof(float));
                if (rank == 0 && world > 1) CHECK_OK(lk_comm_recv(comm, sum, (size_t)n, LK_F32, world - 1));
                double worst = 0.0;
                if (rank == 0) {
                    if (world > 1) {
                        const float *own = p->grad->data;
                        for (int64_t e = 0; e < n; e++) sum[e] += own[e];
                    }
                    for (int64_t e = 0; e < n; e++) {
                        double diff = fabs((double)sum[e] - (double)((const float *)rg->data)[e]);
                        worst = diff > worst ? diff : worst;
                    }
                    CHECK_MSG(worst < 1e-6, "%s: the parts' sum is %.3g from one process's gradient", name, worst);
                }
                if (rank == world - 1 && world > 1) CHECK_OK(lk_comm_send(comm, p->grad->data, (size_t)n, LK_F32, 0));
                lk_free(sum);
            } else {
                CHECK_MSG(same_bits(p->grad, rg), "rank %d: %s's gradient differs from one process's", rank, name);
            }
            checked++;
        }
        lk_named_tensors_clear(&bp);
    }
    CHECK(checked > 0);
    lk_named_tensors_clear(&ps);
    lk_named_tensors_clear(&rps);
    lk_pipe_schedule_free(s);
    free_data(&d);
    lk_layer_free(net);
    lk_layer_free(ref);
    lk_comm_free(comm);
    return 0;
}

static void run_case(const char *model, const char *schedule, int stages) {
    du_map();
    cfg cf = {model, schedule, stages, !strcmp(schedule, "interleaved_1f1b") ? 2 : 1};
    int codes[DU_MAXW];
    int ok = du_run(stages, stage_rank, &cf, 60, codes, NULL);
    CHECK_MSG(ok == stages, "%s on %d stages with %s: %d of %d ranks passed", model, stages, schedule, ok, stages);
}

static void mlp_stages(void) {
    run_case("mlp", "gpipe", 2);
    run_case("mlp", "1f1b", 2);
    run_case("mlp", "1f1b", 3);
    run_case("mlp", "interleaved_1f1b", 2);
}

static void gpt_stages(void) {
    run_case("gpt", "1f1b", 2);
    run_case("gpt", "gpipe", 3);
    run_case("gpt", "1f1b", 4);
    run_case("gpt", "interleaved_1f1b", 2);
}

LK_TEST_MAIN(LK_TEST_CASE(mlp_stages), LK_TEST_CASE(gpt_stages))

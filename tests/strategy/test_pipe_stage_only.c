/* Each pipeline stage holds only its own blocks (issue 47): the mlp, the
 * autoencoder and the gpt (the examples' shapes) cut by model_parallel and
 * pipeline into 2 and 3 stages and 2 stages x 2 replicas, each rank a
 * forked process on shm. After lk_strategy_wrap every rank must hold data
 * for exactly its stage's blocks' parameters and buffers (the gpt's tied
 * token embedding on both the first and the last stage), so its held bytes
 * are its blocks' bytes, computed here from the blocks themselves, and
 * the memory report says the same; every other stage's tensor keeps its
 * shape and holds no data, and touching one (a clone, the whole model's
 * forward) is an error that names the tensor and the stage, not a crash.
 * What still needs the whole model works: rank 0's checkpoint state dict
 * holds every stage's values (single's initial bits), and
 * lk_strategy_sync_model makes every rank's model whole and single's again,
 * until the next optimizer step gives the other stages' storage back.
 *
 * The parent prints each stage's held bytes beside the whole model's, and
 * the bytes it gave back beside how much its resident set grows when
 * sync_model makes it whole again (the storage really went back to the
 * system: the large blocks are mappings); docs/PIPELINE.md's table. Only
 * the bytes are checked, never the resident set. */
#include <string.h>

#include "comm/dist_util.h"
#include "lockstep/models.h"
#include "lockstep/strategy.h"

typedef struct cfg {
    const char *model, *strategy;
    int world, stages; /* stages < world: stages x replicas */
    bool deferred;     /* built by lk_model_create_deferred: each rank materialises its stage */
} cfg;

enum { R_HELD, R_WHOLE, R_RSS0, R_RSS1, R_BUILT, R_PEAK };

/* docs/ERRORS.md's entry: the whole mlp's forward on stage 0 of 2 */
#define MLP_DROPPED \
    "holds no data on this rank: 'layers.2.weight' belongs to another pipeline stage than this rank's (stage 0 of 2)"

static int64_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (!f) return -1;
    int n = fscanf(f, "%ld %ld", &pages, &res);
    fclose(f);
    return n == 2 ? (int64_t)res * sysconf(_SC_PAGESIZE) : -1;
}

static lk_status build(const char *model, bool deferred, lk_layer **net) {
    lk_status (*create)(const char *, const lk_model_kv *, int, uint64_t, lk_layer **) =
        deferred ? lk_model_create_deferred : lk_model_create;
    if (!strcmp(model, "mlp")) { /* examples/mlp.yaml, without dropout */
        lk_model_kv a[] = {{"input_dim", "784"}, {"hidden", "512,256"}, {"num_classes", "10"}, {"dropout", "0"}};
        return create("mlp", a, 4, 7, net);
    }
    if (!strcmp(model, "autoencoder")) return create("autoencoder", NULL, 0, 7, net);
    if (!strcmp(model, "custom")) { /* a model of one's own in C: a Sequential of Linear and ReLU layers */
        if (deferred) lk_layer_defer_begin();
        lk_layer *seq = lk_sequential_create(0, NULL);
        const int64_t w[] = {784, 256, 128, 64, 10};
        lk_status st = seq ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
        for (int i = 0; i < 4 && !st; i++) {
            st = lk_sequential_append(seq, lk_linear_create(w[i], w[i + 1], true, NULL));
            if (!st && i < 3) st = lk_sequential_append(seq, lk_relu_create());
        }
        if (deferred) lk_layer_defer_end(st ? NULL : seq, 7);
        else if (!st) st = lk_layer_reset_parameters(seq, 7);
        if (st) lk_layer_free(seq);
        *net = st ? NULL : seq;
        return st;
    }
    lk_model_kv a[] = {{"n_layer", "4"},     {"n_head", "4"},        {"n_embd", "128"}, {"block_size", "64"},
                       {"vocab_size", "256"}, {"dropout", "0"}, {"bias", "false"}}; /* examples/gpt.yaml */
    return create("gpt", a, 7, 7, net);
}

/* The blocks as the strategy cuts them: a lone Sequential block (the mlp's
 * layers) is cut inside. */
typedef struct blocks {
    int n;
    char name[64][96];
    lk_layer *layer[64];
} blocks;

static void list_blocks(lk_layer *net, blocks *b) {
    int nb = 0;
    const lk_named_layer *bl = NULL;
    CHECK_OK(lk_model_blocks(net, &nb, &bl));
    b->n = 0;
    if (nb == 1 && bl[0].layer->n_children > 1)
        for (int i = 0; i < bl[0].layer->n_children && b->n < 64; i++, b->n++) {
            snprintf(b->name[b->n], sizeof b->name[b->n], "%s.%s", bl[0].name, bl[0].layer->children[i].name);
            b->layer[b->n] = bl[0].layer->children[i].layer;
        }
    else
        for (int i = 0; i < nb && b->n < 64; i++, b->n++) {
            snprintf(b->name[b->n], sizeof b->name[b->n], "%s", bl[i].name);
            b->layer[b->n] = bl[i].layer;
        }
}

/* Whether t is a parameter or buffer of blocks [lo, hi). */
static bool in_blocks(const blocks *b, int lo, int hi, const lk_tensor *t) {
    bool in = false;
    for (int i = lo; i < hi && !in; i++) {
        lk_named_tensors l = {0};
        CHECK_OK(lk_state_dict_get(b->layer[i], &l));
        for (int j = 0; j < l.n && !in; j++) in = l.items[j].tensor == t;
        lk_named_tensors_clear(&l);
    }
    return in;
}

static bool same_bits(const lk_tensor *a, const lk_tensor *b) {
    return a->numel == b->numel && lk_tensor_has_data(a) && lk_tensor_has_data(b) &&
           !memcmp(a->data, b->data, lk_tensor_nbytes(a));
}

static lk_tensor *model_input(const char *model) {
    lk_rng rng;
    lk_rng_init(&rng, 5, 0, 0, 0);
    if (strcmp(model, "gpt")) return lk_tensor_randn(&rng, 2, (int64_t[]){2, 784}, 0.0f, 1.0f);
    lk_tensor *x = lk_tensor_zeros(LK_I64, 2, (int64_t[]){2, 8});
    for (int i = 0; i < 16; i++) ((int64_t *)x->data)[i] = (i * 37) % 256;
    return x;
}

static int stage_rank(int rank, int world, void *arg) {
    const cfg *cf = arg;
    lk_comm *comm = du_shm_rank_comm(rank, world);
    if (!comm) return 1;
    lk_layer *net = NULL, *ref = NULL;
    CHECK_OK(build(cf->model, false, &ref)); /* single's model: the same seed */
    uint64_t base = lk_alloc_live_bytes();
    lk_alloc_reset_peak();
    CHECK_OK(build(cf->model, cf->deferred, &net));
    if (!net || !ref) return 1;
    du->hash[rank][R_BUILT] = lk_alloc_live_bytes() - base; /* what the model's construction allocated */
    blocks b;
    list_blocks(net, &b);
    /* each stage's blocks named (the balanced split is the strategy's own business) */
    int p = cf->stages, dp = world / p, stage = rank / dp, first[9];
    char split[512] = "";
    for (int k = 0; k <= p; k++) first[k] = b.n * k / p;
    for (int k = 1; k < p; k++)
        snprintf(split + strlen(split), sizeof split - strlen(split), "%s%s", k > 1 ? "," : "", b.name[first[k]]);
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = cf->strategy;
    sc.comm = comm;
    sc.pipe_split = split;
    sc.pipe_stages = p < world ? p : 0;
    lk_strategy *s = NULL;
    CHECK_OK(lk_strategy_create(&sc, &s));
    if (!s) return 1;
    lk_named_tensors sd = {0}, rsd = {0};
    CHECK_OK(lk_state_dict_get(net, &sd));
    CHECK_OK(lk_state_dict_get(ref, &rsd));
    int nb = 0;
    const lk_named_layer *bl = NULL;
    CHECK_OK(lk_model_blocks(net, &nb, &bl));
    CHECK_OK(lk_strategy_set_blocks(s, bl, nb));
    CHECK_OK(lk_strategy_wrap(s, net));
    du->hash[rank][R_PEAK] = lk_alloc_peak_bytes() - base; /* the most it held from the build to the wrap's end */

    /* what this rank holds: its blocks' tensors (a tied one once), nothing else */
    int64_t held = 0, want = 0, whole = 0;
    const lk_tensor *gone = NULL;
    const char *gone_name = NULL;
    for (int i = 0; i < sd.n; i++) {
        lk_tensor *t = sd.items[i].tensor;
        bool seen = false;
        for (int q = 0; q < i && !seen; q++) seen = sd.items[q].tensor == t;
        bool mine = in_blocks(&b, first[stage], first[stage + 1], t);
        CHECK_MSG(mine == lk_tensor_has_data(t), "%s %d x %d, rank %d (stage %d): '%s' %s", cf->model, p, dp, rank,
                  stage, sd.items[i].name, mine ? "is its block's but holds no data" : "is another stage's but holds data");
        if (!mine && !gone) gone = t, gone_name = sd.items[i].name;
        if (seen) continue;
        whole += (int64_t)lk_tensor_nbytes(t);
        if (mine) want += (int64_t)lk_tensor_nbytes(t);
        if (lk_tensor_has_data(t)) held += (int64_t)lk_tensor_nbytes(t);
    }
    CHECK_MSG(held == want && want > 0 && held < whole, "%s %d x %d, rank %d: holds %lld bytes, its blocks' are %lld "
              "(the whole model's %lld)", cf->model, p, dp, rank, (long long)held, (long long)want, (long long)whole);
    CHECK_MSG(lk_strategy_get_memory(s).param_bytes == held, "rank %d: the memory report says %lld, held %lld", rank,
              (long long)lk_strategy_get_memory(s).param_bytes, (long long)held);
    du->hash[rank][R_HELD] = (uint64_t)held;
    du->hash[rank][R_WHOLE] = (uint64_t)whole;
    /* Deferred, the construction allocates no tensor storage (the layers'
     * headers and names only) and the rank's peak is its stage's: its
     * tensors, moved into the flat parameter buffer, and the flat gradient
     * buffer (2 x held), never the other stages'. */
    if (cf->deferred) {
        CHECK_MSG(du->hash[rank][R_BUILT] < 256 * 1024 && du->hash[rank][R_BUILT] < (uint64_t)whole / 8,
                  "%s deferred: the build allocated %llu bytes (the whole model's tensors are %lld)", cf->model,
                  (unsigned long long)du->hash[rank][R_BUILT], (long long)whole);
        CHECK_MSG(du->hash[rank][R_PEAK] <= 2 * (uint64_t)held + 256 * 1024,
                  "%s deferred, rank %d: peak %llu bytes from the build to the wrap's end; its stage holds %lld",
                  cf->model, rank, (unsigned long long)du->hash[rank][R_PEAK], (long long)held);
    }

    /* another stage's tensor: named and refused, never read */
    CHECK(gone != NULL);
    if (gone) {
        char stage_s[32];
        snprintf(stage_s, sizeof stage_s, "stage %d of %d", stage, p);
        lk_tensor *c = lk_tensor_clone(gone);
        CHECK(c == NULL);
        CHECK_MSG(strstr(lk_last_error(), gone_name) && strstr(lk_last_error(), "holds no data") &&
                  strstr(lk_last_error(), stage_s), "rank %d: cloning '%s': %s", rank, gone_name, lk_last_error());
        lk_tensor_release(c);
        lk_scope_begin();
        lk_tensor *x = model_input(cf->model);
        lk_tensor *y = lk_layer_forward(net, x);
        CHECK_MSG(y == NULL && strstr(lk_last_error(), "holds no data on this rank") &&
                  strstr(lk_last_error(), stage_s), "rank %d: the whole model's forward: %s", rank, lk_last_error());
        if (rank == 0 && !strcmp(cf->model, "mlp") && p == 2 && dp == 1 && !strcmp(cf->strategy, "pipeline")) {
            printf("the whole mlp's forward on stage 0 of 2: %s\n", lk_last_error()); /* (docs/PIPELINE.md shows it) */
            CHECK(strstr(lk_last_error(), MLP_DROPPED) != NULL);
        }
        lk_tensor_release(x);
        lk_scope_end();
    }

    /* the whole model again on every rank: single's bits, and it runs */
    du->hash[rank][R_RSS0] = (uint64_t)rss_bytes();
    CHECK_OK(lk_strategy_sync_model(s));
    du->hash[rank][R_RSS1] = (uint64_t)rss_bytes();
    for (int i = 0; i < sd.n; i++)
        CHECK_MSG(same_bits(sd.items[i].tensor, rsd.items[i].tensor), "rank %d after sync_model: '%s' is not single's",
                  rank, sd.items[i].name);
    lk_scope_begin();
    lk_tensor *x = model_input(cf->model);
    CHECK(lk_layer_forward(net, x) != NULL);
    lk_tensor_release(x);
    lk_scope_end();
    /* an optimizer step makes the copies stale: given back again */
    CHECK_OK(lk_strategy_after_step(s));
    CHECK(!gone || !lk_tensor_has_data(gone));

    /* the checkpoint's state dict (a collective): rank 0's has every stage's values, single's bits */
    lk_named_tensors ck = {0};
    CHECK_OK(lk_strategy_state_dict(s, net, &ck));
    CHECK(ck.n == rsd.n);
    for (int i = 0; rank == 0 && i < ck.n && i < rsd.n; i++)
        CHECK_MSG(!strcmp(ck.items[i].name, rsd.items[i].name) && same_bits(ck.items[i].tensor, rsd.items[i].tensor),
                  "%s: rank 0's state dict entry '%s' is not single's", cf->model, ck.items[i].name);
    lk_named_tensors_clear(&ck);
    /* the gather made nothing resident: what was dropped still is */
    CHECK(!gone || !lk_tensor_has_data(gone));
    CHECK_OK(lk_strategy_after_step(s)); /* (rank 0 gives the gathered copies' memory back) */

    lk_named_tensors_clear(&sd);
    lk_named_tensors_clear(&rsd);
    lk_strategy_free(s);
    lk_layer_free(net);
    lk_layer_free(ref);
    lk_comm_free(comm);
    return 0;
}

static void run_case(const char *model, const char *strategy, int world, int stages, bool deferred) {
    du_map();
    cfg cf = {model, strategy, world, stages, deferred};
    int codes[DU_MAXW] = {0};
    int ok = du_run(world, stage_rank, &cf, 120, codes, NULL);
    CHECK_MSG(ok == world, "%s, %s on %d ranks as %d stages: %d of %d ranks passed (rank 0's exit code %d)", model,
              strategy, world, stages, ok, world, codes[0]);
    if (ok != world) return;
    const double kib = 1024.0;
    printf("| %s | %s %d%s%s | %.1f |", model, strategy, stages, world > stages ? " x 2" : "",
           deferred ? ", deferred" : "", (double)du->hash[0][R_WHOLE] / kib);
    for (int r = 0; r < world; r += world / stages)
        printf(" %.1f (%.2f)", (double)du->hash[r][R_HELD] / kib,
               (double)du->hash[r][R_HELD] / (double)du->hash[r][R_WHOLE]);
    printf(" |");
    for (int r = 0; r < world; r += world / stages)
        printf(" %.1f / %+.1f", (double)(du->hash[r][R_WHOLE] - du->hash[r][R_HELD]) / kib,
               ((double)(int64_t)du->hash[r][R_RSS1] - (double)(int64_t)du->hash[r][R_RSS0]) / kib);
    printf(" |");
    for (int r = 0; r < world; r += world / stages) printf(" %.1f", (double)du->hash[r][R_PEAK] / kib);
    printf(" |\n");
}

static void stage_only(void) {
    printf("| model | strategy | whole model, KiB | each stage's parameters + buffers held, KiB (share) | "
           "each stage's given back, KiB / its RSS growth when sync_model makes it whole again, KiB | "
           "each stage's peak from the build to the wrap's end, KiB |\n");
    for (int deferred = 0; deferred < 2; deferred++) {
        run_case("mlp", "model_parallel", 2, 2, deferred);
        run_case("mlp", "pipeline", 2, 2, deferred);
        run_case("mlp", "pipeline", 3, 3, deferred);
        run_case("mlp", "pipeline", 4, 2, deferred);
        run_case("autoencoder", "model_parallel", 2, 2, deferred);
        run_case("autoencoder", "pipeline", 2, 2, deferred);
        run_case("gpt", "model_parallel", 2, 2, deferred);
        run_case("gpt", "pipeline", 3, 3, deferred);
        run_case("gpt", "pipeline", 4, 2, deferred);
        run_case("custom", "pipeline", 2, 2, deferred); /* lk_layer_defer_begin / _end */
    }
}

LK_TEST_MAIN(LK_TEST_CASE(stage_only))

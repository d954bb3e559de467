/* The pipeline strategies' checks before training, on one process (one
 * stage): a model without blocks, a split naming no block or the wrong
 * number of them, model_parallel asked for several micro-batches, an
 * unknown schedule; and the split of two Linear blocks into one stage
 * holding every parameter. The runs over several stages are
 * strategy_pipeline_fit's. */
#include "lk_test.h"
#include "lockstep/nn.h"
#include "lockstep/strategy.h"

static lk_strategy *make(const char *name, int chunks, const char *schedule, const char *split) {
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = name;
    sc.pipe_chunks = chunks;
    sc.pipe_schedule = schedule;
    sc.pipe_split = split;
    lk_strategy *s = NULL;
    lk_status st = lk_strategy_create(&sc, &s);
    return st ? NULL : s;
}

static void refused_at_create(void) {
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = "model_parallel";
    sc.pipe_chunks = 4;
    lk_strategy *s = NULL;
    CHECK_ERR(lk_strategy_create(&sc, &s), LK_STATUS_INVALID_ARGUMENT, "model_parallel runs one micro-batch");
    CHECK(s == NULL);
    sc.name = "pipeline";
    sc.pipe_schedule = "zero_bubble";
    CHECK_ERR(lk_strategy_create(&sc, &s), LK_STATUS_INVALID_ARGUMENT, "trainer.pipeline.schedule");
    CHECK(s == NULL);
}

static void blocks_checked(void) {
    lk_strategy *s = make("pipeline", 2, "gpipe", NULL);
    CHECK(s && lk_strategy_needs_blocks(s));
    if (!s) return;
    CHECK_ERR(lk_strategy_set_blocks(s, NULL, 0), LK_STATUS_INVALID_ARGUMENT, "the model has no blocks to cut into stages");
    lk_strategy_free(s);
    /* one stage: a split names no first block */
    s = make("pipeline", 2, "1f1b", "b");
    lk_layer *a = lk_linear_create(3, 4, true, NULL), *b = lk_linear_create(4, 2, true, NULL);
    lk_named_layer bl[2] = {{"a", a, false}, {"b", b, false}};
    CHECK_ERR(lk_strategy_set_blocks(s, bl, 2), LK_STATUS_INVALID_ARGUMENT, "names more first blocks for 1 stages");
    lk_strategy_free(s);
    s = make("pipeline", 2, "1f1b", "c");
    CHECK_ERR(lk_strategy_set_blocks(s, bl, 2), LK_STATUS_INVALID_ARGUMENT, "names 'c', which is no block of the model (its blocks: a, b)");
    lk_strategy_free(s);
    /* the single default (non-pipeline) strategies need no blocks */
    lk_strategy *single = make("single", 0, NULL, NULL);
    CHECK(single && !lk_strategy_needs_blocks(single));
    CHECK_OK(lk_strategy_set_blocks(single, NULL, 0));
    lk_strategy_free(single);
    lk_layer_free(a);
    lk_layer_free(b);
}

static void one_stage_holds_all(void) {
    lk_layer *ls[2] = {lk_linear_create(3, 4, true, NULL), lk_linear_create(4, 2, true, NULL)};
    lk_layer *net = lk_sequential_create(2, ls);
    lk_strategy *s = make("model_parallel", 0, NULL, NULL);
    CHECK(s != NULL);
    if (!s) return;
    CHECK_OK(lk_strategy_set_blocks(s, net->children, net->n_children));
    CHECK_OK(lk_strategy_wrap(s, net));
    CHECK(lk_strategy_local_params(s)->n == 4);
    lk_strategy_free(s);
    lk_layer_free(net);
}

LK_TEST_MAIN(LK_TEST_CASE(refused_at_create), LK_TEST_CASE(blocks_checked), LK_TEST_CASE(one_stage_holds_all))

/* model_blocks: lk_model_blocks, the cut points a pipeline strategy will
 * use. For every built-in model the blocks (names as documented) run one
 * after the other on the model's input shape give bitwise the model's
 * forward — the output, every gradient and the batch-norm running
 * statistics in training mode — whatever layout the input came in; a
 * Sequential answers with its children; any other layer is refused. */
#include "nn/nn_fixtures.h"

/* The blocks of m run in order on x (already in the model's input shape). */
static lk_tensor *run_blocks(lk_layer *m, lk_tensor *x) {
    int n = 0;
    const lk_named_layer *b = NULL;
    CHECK_OK(lk_model_blocks(m, &n, &b));
    for (int i = 0; i < n && x; i++) x = lk_layer_forward(b[i].layer, x);
    return x;
}

static void expect_names(const char *model, const char *want) {
    lk_layer *m = NULL;
    CHECK_OK(lk_model_create(model, NULL, 0, 1, &m));
    int n = 0;
    const lk_named_layer *b = NULL;
    CHECK_OK(lk_model_blocks(m, &n, &b));
    char got[256] = "";
    for (int i = 0; i < n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? " " : "", b[i].name);
    CHECK_MSG(!strcmp(got, want), "%s blocks: '%s', expected '%s'", model, got, want);
    lk_layer_free(m);
}

static void block_names(void) {
    expect_names("autoencoder", "encoder decoder");
    expect_names("mlp", "layers");
    expect_names("cnn", "conv1 bn1 relu1 pool1 conv2 bn2 relu2 pool2 flatten fc1 relu3 fc2");
}

/* Two models from one seed: one runs its forward on `x_model`, the other its
 * blocks on `x_blocks` (the same values in the model's input shape); the
 * outputs, gradients of a loss and buffers must match bitwise. */
static void same_as_forward(const char *model, const lk_model_kv *args, int n_args, lk_tensor *x_model,
                            lk_tensor *x_blocks, lk_tensor *y) {
    lk_layer *a = NULL, *b = NULL;
    CHECK_OK(lk_model_create(model, args, n_args, 5, &a));
    CHECK_OK(lk_model_create(model, args, n_args, 5, &b));
    if (!a || !b) goto done;
    const lk_model_info *info = lk_model_find(model);
    /* one graph at a time: a backward today frees the thread's whole tape */
    lk_scope_begin();
    lk_tensor *oa = lk_layer_forward(a, x_model);
    lk_tensor *ka = oa ? lk_tensor_clone(oa) : NULL; /* a new reference of ours, past the scope */
    CHECK_OK(lk_backward(lk_model_loss(info, oa, x_blocks, y)));
    lk_scope_end();
    lk_scope_begin();
    lk_tensor *ob = run_blocks(b, x_blocks);
    CHECK_MSG(ka && ob && nn_rel_err(ka, ob) == 0, "%s: blocks' output differs from the forward's (%.3g)", model,
              nn_rel_err(ka, ob));
    CHECK_OK(lk_backward(lk_model_loss(info, ob, x_blocks, y)));
    lk_scope_end();
    lk_tensor_release(ka);
    lk_named_tensors sa = {0}, sb = {0}, pa = {0}, pb = {0};
    CHECK_OK(lk_state_dict_get(a, &sa));
    CHECK_OK(lk_state_dict_get(b, &sb));
    for (int i = 0; i < sa.n && i < sb.n; i++)
        CHECK_MSG(nn_rel_err(sa.items[i].tensor, sb.items[i].tensor) == 0, "%s: %s differs", model, sa.items[i].name);
    CHECK_OK(lk_layer_named_parameters(a, &pa));
    CHECK_OK(lk_layer_named_parameters(b, &pb));
    for (int i = 0; i < pa.n && i < pb.n; i++) {
        lk_tensor *ga = pa.items[i].tensor->grad, *gb = pb.items[i].tensor->grad;
        CHECK_MSG(ga && gb && nn_rel_err(ga, gb) == 0, "%s: gradient of %s differs", model, pa.items[i].name);
    }
    lk_named_tensors_clear(&sa);
    lk_named_tensors_clear(&sb);
    lk_named_tensors_clear(&pa);
    lk_named_tensors_clear(&pb);
done:
    lk_layer_free(a);
    lk_layer_free(b);
}

static void blocks_compose_to_the_forward(void) {
    lk_tensor *rows = nn_htensor(11, 0.0, 1.0, LK_SHAPE(4, 64));
    lk_tensor *imgs = nn_htensor(11, 0.0, 1.0, LK_SHAPE(4, 1, 8, 8)); /* the same values as images */
    lk_tensor *y = nn_hlabels(12, 4, 10);
    lk_model_kv ae[] = {{"input_dim", "64"}, {"hidden", "32,16"}, {"latent_dim", "8"}};
    lk_model_kv mlp[] = {{"input_dim", "64"}, {"hidden", "32,16"}, {"dropout", "0.25"}};
    lk_model_kv cnn[] = {{"image_size", "8"}, {"channels", "4,8"}, {"hidden", "16"}};
    same_as_forward("autoencoder", ae, 3, rows, rows, NULL);
    same_as_forward("autoencoder", ae, 3, imgs, rows, NULL); /* images flattened by the model first */
    same_as_forward("mlp", mlp, 3, rows, rows, y);
    same_as_forward("cnn", cnn, 3, imgs, imgs, y);
    same_as_forward("cnn", cnn, 3, rows, imgs, y); /* flat rows made images by the model first */
    lk_tensor_release(rows);
    lk_tensor_release(imgs);
    lk_tensor_release(y);
}

static void sequential_and_other_layers(void) {
    lk_layer *m = NULL;
    CHECK_OK(lk_model_create("mlp", NULL, 0, 1, &m));
    int n = -1;
    const lk_named_layer *b = NULL;
    /* inside a block that is a Sequential: mlp's layers (Linear ReLU Linear ReLU Linear) */
    CHECK_OK(lk_model_blocks(lk_layer_get_child(m, "layers"), &n, &b));
    CHECK(n == 5 && b && !strcmp(b[0].name, "0") && !strcmp(b[0].layer->type, "Linear") && !strcmp(b[1].layer->type, "ReLU"));
    CHECK_ERR(lk_model_blocks(lk_layer_get_child(m, "layers.0"), &n, &b), LK_STATUS_INVALID_ARGUMENT,
              "model_blocks: a Linear is not a sequence of blocks");
    CHECK(n == 0 && b == NULL);
    CHECK_ERR(lk_model_blocks(NULL, &n, &b), LK_STATUS_INVALID_ARGUMENT, "model_blocks: NULL model");
    lk_layer_free(m);
}

LK_TEST_MAIN(LK_TEST_CASE(block_names), LK_TEST_CASE(blocks_compose_to_the_forward),
             LK_TEST_CASE(sequential_and_other_layers))

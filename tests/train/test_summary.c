/* The model summary (trainer.enable_model_summary): the exact table
 * Lightning prints for the autoencoder of its documentation, deeper rows,
 * eval-mode layers, frozen parameters, and the "999  " / "1.0 K" / "100 K" /
 * "1.2 M" abbreviations at their edges. */
#include "lk_test.h"
#include "lockstep/trainer.h"

static lk_layer *seq3(lk_layer *a, lk_layer *b, lk_layer *c) {
    lk_layer *v[3] = {a, b, c};
    return lk_sequential_create(3, v);
}

static void expect_table(const lk_layer *net, int depth, const char *want) {
    char *got = NULL;
    CHECK_OK(lk_model_summary(net, depth, &got));
    CHECK_MSG(got && !strcmp(got, want), "got:\n%s\nwant:\n%s", got ? got : "(null)", want);
    lk_free(got);
}

/* Lightning's LitAutoEncoder (784-64-3, mirrored): the table its docs show. */
static lk_layer *lit_autoencoder(void) {
    lk_layer *root = lk_layer_create("LitAutoEncoder", NULL, NULL, NULL);
    lk_layer_add_child(root, "encoder", seq3(lk_linear_create(784, 64, true, NULL), lk_relu_create(),
                                             lk_linear_create(64, 3, true, NULL)));
    lk_layer_add_child(root, "decoder", seq3(lk_linear_create(3, 64, true, NULL), lk_relu_create(),
                                             lk_linear_create(64, 784, true, NULL)));
    return root;
}

static void lightning_autoencoder_table(void) {
    lk_layer *net = lit_autoencoder();
    expect_table(net, 1,
                 "  | Name    | Type       | Params | Mode \n"
                 "-----------------------------------------------\n"
                 "0 | encoder | Sequential | 50.4 K | train\n"
                 "1 | decoder | Sequential | 51.2 K | train\n"
                 "-----------------------------------------------\n"
                 "101 K     Trainable params\n"
                 "0         Non-trainable params\n"
                 "101 K     Total params\n"
                 "0.407     Total estimated model params size (MB)\n"
                 "8         Modules in train mode\n"
                 "0         Modules in eval mode\n");
    lk_layer_free(net);
}

static void every_layer_with_eval_and_frozen(void) {
    lk_layer *net = lit_autoencoder();
    lk_layer_train(lk_layer_child(net, 1), false);                           /* decoder in eval mode */
    lk_tensor_set_requires_grad(lk_layer_param(lk_layer_get_child(net, "encoder.2"), 0), false); /* 192 frozen */
    expect_table(net, -1,
                 "  | Name      | Type       | Params | Mode \n"
                 "-------------------------------------------------\n"
                 "0 | encoder   | Sequential | 50.4 K | train\n"
                 "1 | encoder.0 | Linear     | 50.2 K | train\n"
                 "2 | encoder.1 | ReLU       | 0      | train\n"
                 "3 | encoder.2 | Linear     | 195    | train\n"
                 "4 | decoder   | Sequential | 51.2 K | eval \n"
                 "5 | decoder.0 | Linear     | 256    | eval \n"
                 "6 | decoder.1 | ReLU       | 0      | eval \n"
                 "7 | decoder.2 | Linear     | 51.0 K | eval \n"
                 "-------------------------------------------------\n"
                 "101 K     Trainable params\n"
                 "192       Non-trainable params\n"
                 "101 K     Total params\n"
                 "0.407     Total estimated model params size (MB)\n"
                 "4         Modules in train mode\n"
                 "4         Modules in eval mode\n");
    lk_layer_free(net);
}

static void count_abbreviations(void) {
    lk_layer *net = lk_layer_create("Net", NULL, NULL, NULL);
    lk_layer_add_child(net, "a", lk_linear_create(999, 1, false, NULL));
    lk_layer_add_child(net, "b", lk_linear_create(1000, 1, false, NULL));
    lk_layer_add_child(net, "c", lk_linear_create(99999, 1, false, NULL));
    lk_layer_add_child(net, "d", lk_linear_create(100000, 1, false, NULL));
    lk_layer_add_child(net, "e", lk_linear_create(1234567, 1, false, NULL));
    expect_table(net, 1,
                 "  | Name | Type   | Params  | Mode \n"
                 "-----------------------------------------\n"
                 "0 | a    | Linear | 999     | train\n"
                 "1 | b    | Linear | 1.0 K   | train\n"
                 "2 | c    | Linear | 100.0 K | train\n"
                 "3 | d    | Linear | 100 K   | train\n"
                 "4 | e    | Linear | 1.2 M   | train\n"
                 "-----------------------------------------\n"
                 "1.4 M     Trainable params\n"
                 "0         Non-trainable params\n"
                 "1.4 M     Total params\n"
                 "5.746     Total estimated model params size (MB)\n"
                 "5         Modules in train mode\n"
                 "0         Modules in eval mode\n");
    lk_layer_free(net);
}

static void null_net_is_an_error(void) {
    char *out = (char *)1;
    CHECK_ERR(lk_model_summary(NULL, 1, &out), LK_STATUS_INVALID_ARGUMENT, "the network is NULL");
    CHECK(out == NULL);
}

LK_TEST_MAIN(LK_TEST_CASE(lightning_autoencoder_table), LK_TEST_CASE(every_layer_with_eval_and_frozen),
             LK_TEST_CASE(count_abbreviations), LK_TEST_CASE(null_net_is_an_error))

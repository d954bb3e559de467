/* nn layers: forward and backward parity with PyTorch for every built-in
 * layer (fixtures from tools/gen_nn_fixtures.py), a custom layer written as
 * the header shows, PyTorch-ordered names, state-dict strict loading errors,
 * flattening into one contiguous buffer, initialiser statistics and
 * dropout reproducibility. */
#include "nn/nn_fixtures.h"

/* ---- parity with PyTorch: the cases of layer_cases() in the same order ---- */

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[4];
    double range;
} layer_case;

static const layer_case cases[] = {
    {"linear", 2, {4, 5}, 1.0},
    {"linear_nobias", 3, {2, 3, 6}, 1.0},
    {"conv2d", 4, {2, 3, 6, 5}, 1.0},
    {"conv2d_s2", 4, {2, 2, 7, 6}, 1.0},
    {"maxpool2d", 4, {2, 3, 6, 6}, 1.0},
    {"maxpool2d_s1p1", 4, {1, 2, 5, 4}, 1.0},
    {"avgpool2d", 4, {2, 2, 7, 6}, 1.0},
    {"adaptive_avgpool2d", 4, {2, 3, 7, 5}, 1.0},
    {"batchnorm1d", 2, {6, 4}, 2.0},
    {"batchnorm2d", 4, {3, 3, 4, 3}, 2.0},
    {"layernorm", 3, {3, 4, 5}, 2.0},
    {"relu", 2, {3, 7}, 3.0},
    {"gelu", 2, {3, 7}, 3.0},
    {"gelu_tanh", 2, {3, 7}, 3.0},
    {"tanh", 2, {3, 7}, 3.0},
    {"sigmoid", 2, {3, 7}, 3.0},
    {"leaky_relu", 2, {3, 7}, 3.0},
    {"elu", 2, {3, 7}, 3.0},
    {"silu", 2, {3, 7}, 3.0},
    {"flatten", 4, {2, 3, 2, 2}, 1.0},
    {"sequential", 2, {4, 5}, 1.0},
    {"batchnorm2d_plain", 4, {2, 3, 3, 4}, 2.0},
    {"layernorm_plain", 2, {4, 6}, 2.0},
    {"batchnorm1d_3d", 3, {4, 3, 5}, 2.0},
};

static lk_layer *make_case(int ci) {
    lk_conv2d_params cp = LK_CONV2D_DEFAULT;
    switch (ci) {
    case 0: return lk_linear_create(5, 3, true, NULL);
    case 1: return lk_linear_create(6, 2, false, NULL);
    case 2: cp.padding[0] = cp.padding[1] = 1; return lk_conv2d_create(3, 4, 3, 3, cp, true, NULL);
    case 3:
        cp.stride[0] = cp.stride[1] = 2;
        cp.padding[0] = 1;
        return lk_conv2d_create(2, 3, 3, 2, cp, false, NULL);
    case 4: return lk_max_pool2d_create((lk_pool2d_params){{2, 2}, {0, 0}, {0, 0}, true, false});
    case 5: return lk_max_pool2d_create((lk_pool2d_params){{3, 3}, {1, 1}, {1, 1}, true, false});
    case 6: return lk_avg_pool2d_create((lk_pool2d_params){{3, 3}, {2, 2}, {1, 1}, true, false});
    case 7: return lk_adaptive_avg_pool2d_create(3, 2);
    case 8: return lk_batch_norm1d_create(4, 1e-5f, 0.1f, true, true);
    case 9: return lk_batch_norm2d_create(3, 1e-5f, 0.2f, true, true);
    case 10: return lk_layer_norm_create(2, (int64_t[]){4, 5}, 1e-5f, true);
    case 11: return lk_relu_create();
    case 12: return lk_gelu_create(LK_GELU_EXACT);
    case 13: return lk_gelu_create(LK_GELU_TANH);
    case 14: return lk_tanh_create();
    case 15: return lk_sigmoid_create();
    case 16: return lk_leaky_relu_create(0.1f);
    case 17: return lk_elu_create(0.7f);
    case 18: return lk_silu_create();
    case 19: return lk_flatten_create(1, -1);
    case 20:
        return lk_sequential_create(3, (lk_layer *[]){lk_linear_create(5, 8, true, NULL), lk_tanh_create(),
                                                      lk_linear_create(8, 2, true, NULL)});
    case 21: return lk_batch_norm2d_create(3, 1e-5f, 0.1f, false, false);
    case 22: return lk_layer_norm_create(1, (int64_t[]){6}, 1e-3f, false);
    case 23: return lk_batch_norm1d_create(3, 1e-5f, 0.1f, true, true);
    }
    return NULL;
}

static void run_case(int ci) {
    const layer_case *c = &cases[ci];
    uint64_t seed = 1000 * (uint64_t)(ci + 1);
    char fx[256];
    lk_layer *l = make_case(ci);
    CHECK_MSG(l != NULL, "%s: create failed: %s", c->name, lk_last_error());
    if (!l) return;
    lk_named_tensors ps = {0}, bufs = {0};
    CHECK_OK(lk_layer_named_parameters(l, &ps));
    CHECK_OK(lk_layer_named_buffers(l, &bufs));
    for (int k = 0; k < ps.n; k++) nn_hfill(ps.items[k].tensor->data, ps.items[k].tensor->numel, seed + 1 + (uint64_t)k, -0.5, 0.5);
    lk_tensor *x = nn_htensor(seed, -c->range, c->range, c->ndim, c->shape);
    lk_tensor_set_requires_grad(x, true);
    lk_scope_begin();
    lk_tensor *y = lk_layer_forward(l, x);
    if (!y && nn_unimplemented()) {
        printf("SKIP layer %s: %s\n", c->name, lk_last_error());
        lk_clear_error();
        goto done;
    }
    CHECK_MSG(y != NULL, "%s: forward failed: %s", c->name, lk_last_error());
    if (!y) goto done;
    snprintf(fx, sizeof fx, "layer.%s.y", c->name);
    lk_tensor *want = nn_fixture(fx);
    snprintf(fx, sizeof fx, "%s forward", c->name);
    nn_check_close(fx, y, want, 1e-5);
    lk_tensor_release(want);
    lk_tensor *r = nn_htensor(seed + 100, -1.0, 1.0, y->ndim, y->shape);
    lk_status st = lk_backward_with(y, r);
    lk_tensor_release(r);
    if (st && nn_unimplemented()) {
        printf("SKIP layer %s backward: %s\n", c->name, lk_last_error());
        lk_clear_error();
        goto done;
    }
    CHECK_MSG(st == LK_STATUS_OK, "%s: backward failed: %s", c->name, lk_last_error());
    snprintf(fx, sizeof fx, "layer.%s.dx", c->name);
    want = nn_fixture(fx);
    snprintf(fx, sizeof fx, "%s dx", c->name);
    nn_check_close(fx, x->grad, want, 1e-5);
    lk_tensor_release(want);
    for (int k = 0; k < ps.n; k++) {
        snprintf(fx, sizeof fx, "layer.%s.d.%s", c->name, ps.items[k].name);
        want = nn_fixture(fx);
        snprintf(fx, sizeof fx, "%s d%s", c->name, ps.items[k].name);
        nn_check_close(fx, ps.items[k].tensor->grad, want, 1e-5);
        lk_tensor_release(want);
    }
    for (int k = 0; k < bufs.n; k++) {
        snprintf(fx, sizeof fx, "layer.%s.buf.%s", c->name, bufs.items[k].name);
        want = nn_fixture(fx);
        snprintf(fx, sizeof fx, "%s buffer %s", c->name, bufs.items[k].name);
        nn_check_close(fx, bufs.items[k].tensor, want, 1e-5);
        lk_tensor_release(want);
    }
    if (!strncmp(c->name, "batchnorm", 9)) {
        lk_layer_train(l, false);
        bool prev = lk_set_grad_enabled(false);
        lk_tensor *ye = lk_layer_forward(l, x);
        lk_set_grad_enabled(prev);
        snprintf(fx, sizeof fx, "layer.%s.y_eval", c->name);
        want = nn_fixture(fx);
        snprintf(fx, sizeof fx, "%s eval forward", c->name);
        nn_check_close(fx, ye, want, 1e-5);
        lk_tensor_release(want);
        /* eval does not touch the running statistics or the counter */
        const lk_tensor *nbt = lk_layer_get_tensor(l, "num_batches_tracked");
        CHECK(!nbt || lk_tensor_get(nbt, 0) == 1);
    }
done:
    lk_scope_end();
    lk_tensor_release(x);
    lk_named_tensors_clear(&ps);
    lk_named_tensors_clear(&bufs);
    lk_layer_free(l);
}

static void parity_all_layers(void) {
    for (int ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) run_case(ci);
}

static void parity_batchnorm_cumulative(void) {
    lk_layer *bn = lk_batch_norm1d_create(4, 1e-5f, -1.0f, true, true); /* momentum=None */
    lk_scope_begin();
    for (int k = 0; k < 3; k++) {
        lk_tensor *x = nn_htensor(95000 + (uint64_t)k, -2, 2, LK_SHAPE(6, 4));
        CHECK(lk_layer_forward(bn, x) != NULL);
        lk_tensor_release(x);
    }
    lk_scope_end();
    lk_tensor *want = nn_fixture("layer.batchnorm_cumulative.buf.running_mean");
    nn_check_close("cumulative running_mean", lk_layer_get_tensor(bn, "running_mean"), want, 1e-6);
    lk_tensor_release(want);
    want = nn_fixture("layer.batchnorm_cumulative.buf.running_var");
    nn_check_close("cumulative running_var", lk_layer_get_tensor(bn, "running_var"), want, 1e-6);
    lk_tensor_release(want);
    lk_layer_free(bn);
}

static void parity_embedding(void) {
    lk_layer *e = lk_embedding_create(10, 4, NULL);
    CHECK(e != NULL);
    if (!e) return;
    lk_tensor *w = lk_layer_param(e, 0);
    nn_hfill(w->data, w->numel, 90001, -0.5, 0.5);
    lk_tensor *idx = nn_hlabels(90000, 6, 10);
    lk_scope_begin();
    lk_tensor *y = lk_layer_forward(e, lk_reshape(idx, LK_SHAPE(2, 3)));
    if (!y && nn_unimplemented()) {
        printf("SKIP embedding: %s\n", lk_last_error());
        lk_clear_error();
    } else if (y) {
        lk_tensor *want = nn_fixture("layer.embedding.y");
        nn_check_close("embedding forward", y, want, 1e-6);
        lk_tensor_release(want);
        lk_tensor *r = nn_htensor(90100, -1, 1, y->ndim, y->shape);
        CHECK_OK(lk_backward_with(y, r));
        lk_tensor_release(r);
        want = nn_fixture("layer.embedding.d.weight");
        nn_check_close("embedding dweight", w->grad, want, 1e-6);
        lk_tensor_release(want);
    } else {
        CHECK_MSG(false, "embedding forward: %s", lk_last_error());
    }
    lk_scope_end();
    lk_tensor_release(idx);
    lk_layer_free(e);
}

/* ---- a custom layer, exactly as in nn.h ------------------------------------------------ */

typedef struct {
    float scale;
} my_impl;
static lk_tensor *my_forward(lk_layer *self, lk_tensor *x) {
    my_impl *m = self->impl;
    lk_tensor *h = lk_layer_forward(lk_layer_child(self, 0), x); /* "fc" */
    return lk_mul_scalar(lk_relu(h), m->scale);
}
static lk_layer *my_create(lk_rng *rng) {
    my_impl *m = lk_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->scale = 2.0f;
    lk_layer *l = lk_layer_create("MyLayer", my_forward, m, NULL);
    if (!l) return NULL;
    if (lk_layer_add_child(l, "fc", lk_linear_create(4, 3, true, rng))) {
        lk_layer_free(l);
        return NULL;
    }
    return l;
}

static void custom_layer_and_names(void) {
    lk_rng rng;
    lk_rng_init(&rng, 1, LK_RNG_INIT, 0, 0);
    lk_layer *my = my_create(&rng);
    CHECK(my != NULL);
    /* A model: Sequential(MyLayer, BatchNorm1d(3)) with an own parameter "scale". */
    lk_layer *root = lk_layer_create("Root", NULL, NULL, NULL);
    CHECK_OK(lk_layer_add_parameter(root, "scale", lk_tensor_full(LK_F32, LK_SHAPE(1), 1.0)));
    CHECK_OK(lk_layer_add_child(root, "body", lk_sequential_create(2, (lk_layer *[]){my, lk_batch_norm1d_create(3, 1e-5f, 0.1f, true, true)})));
    lk_named_tensors ps = {0}, sd = {0};
    CHECK_OK(lk_layer_named_parameters(root, &ps));
    const char *want[] = {"scale", "body.0.fc.weight", "body.0.fc.bias", "body.1.weight", "body.1.bias"};
    CHECK(ps.n == 5);
    for (int i = 0; i < ps.n && i < 5; i++) CHECK_MSG(!strcmp(ps.items[i].name, want[i]), "param %d: %s", i, ps.items[i].name);
    CHECK_OK(lk_state_dict_get(root, &sd));
    const char *want_sd[] = {"scale", "body.0.fc.weight", "body.0.fc.bias", "body.1.weight", "body.1.bias",
                             "body.1.running_mean", "body.1.running_var", "body.1.num_batches_tracked"};
    CHECK(sd.n == 8);
    for (int i = 0; i < sd.n && i < 8; i++) CHECK_MSG(!strcmp(sd.items[i].name, want_sd[i]), "sd %d: %s", i, sd.items[i].name);
    CHECK(sd.items[7].tensor->dtype == LK_I64 && sd.items[7].tensor->ndim == 0);
    CHECK(lk_layer_num_parameters(root) == 1 + 12 + 3 + 3 + 3);
    CHECK(lk_layer_get_tensor(root, "body.0.fc.bias") == ps.items[2].tensor);
    CHECK(lk_layer_get_child(root, "body.0.fc") != NULL && lk_layer_get_child(root, "body.7") == NULL);
    /* forward of the custom layer: 2 * relu(fc(x)) */
    lk_tensor *x = nn_htensor(5, -1, 1, LK_SHAPE(2, 4));
    lk_scope_begin();
    lk_tensor *y = lk_layer_forward(my, x);
    lk_tensor *ref = lk_mul_scalar(lk_relu(lk_linear(x, lk_layer_get_tensor(root, "body.0.fc.weight"),
                                                      lk_layer_get_tensor(root, "body.0.fc.bias"))), 2.0f);
    CHECK(y && ref && nn_rel_err(y, ref) == 0.0);
    lk_scope_end();
    /* train/eval is recursive */
    lk_layer_train(root, false);
    CHECK(!lk_layer_get_child(root, "body.1")->training && !my->training);
    /* registration errors */
    CHECK_ERR(lk_layer_add_parameter(root, "scale", lk_tensor_zeros(LK_F32, LK_SHAPE(1))), LK_STATUS_INVALID_ARGUMENT, "already taken");
    CHECK_ERR(lk_layer_add_child(root, "a.b", lk_relu_create()), LK_STATUS_INVALID_ARGUMENT, "no '.'");
    lk_tensor_release(x);
    lk_named_tensors_clear(&ps);
    lk_named_tensors_clear(&sd);
    lk_layer_free(root);
}

/* ---- state dicts --------------------------------------------------------------------------- */

static lk_layer *small_net(void) {
    lk_layer *net = lk_layer_create("Net", NULL, NULL, NULL);
    lk_layer_add_child(net, "fc1", lk_linear_create(4, 3, true, NULL));
    lk_layer_add_child(net, "bn1", lk_batch_norm1d_create(3, 1e-5f, 0.1f, true, true));
    lk_layer_add_child(net, "fc2", lk_linear_create(3, 2, true, NULL));
    return net;
}

static void state_dict_roundtrip_and_errors(void) {
    lk_layer *a = small_net(), *b = small_net();
    CHECK_OK(lk_layer_reset_parameters(a, 7));
    CHECK_OK(lk_layer_reset_parameters(b, 8));
    lk_named_tensors sd = {0};
    CHECK_OK(lk_state_dict_get(a, &sd));
    CHECK(sd.n == 2 + 5 + 2);
    CHECK(nn_rel_err(lk_layer_get_tensor(a, "fc1.weight"), lk_layer_get_tensor(b, "fc1.weight")) > 0);
    CHECK_OK(lk_state_dict_load(b, &sd, true));
    for (int i = 0; i < sd.n; i++) CHECK(nn_rel_err(lk_layer_get_tensor(b, sd.items[i].name), sd.items[i].tensor) == 0);

    /* every mismatch in one message, with both shapes; nothing copied on error */
    lk_named_tensors bad = {0};
    lk_tensor *w_wrong = lk_tensor_zeros(LK_F32, LK_SHAPE(3, 5));
    lk_tensor *extra = lk_tensor_zeros(LK_F32, LK_SHAPE(10, 5));
    for (int i = 0; i < sd.n; i++) {
        if (!strcmp(sd.items[i].name, "bn1.running_mean")) continue;          /* missing */
        if (!strcmp(sd.items[i].name, "fc1.weight")) lk_named_tensors_append(&bad, "fc1.weight", w_wrong);
        else lk_named_tensors_append(&bad, sd.items[i].name, sd.items[i].tensor);
    }
    lk_named_tensors_append(&bad, "fc3.weight", extra);                        /* unexpected */
    lk_layer *c = small_net();
    CHECK_OK(lk_layer_reset_parameters(c, 9));
    float before = ((float *)lk_layer_get_tensor(c, "fc2.bias")->data)[0];
    CHECK_ERR(lk_state_dict_load(c, &bad, true), LK_STATUS_INVALID_ARGUMENT, "missing: bn1.running_mean [3]");
    CHECK(strstr(lk_last_error(), "unexpected: fc3.weight [10, 5]"));
    CHECK(strstr(lk_last_error(), "shape mismatch: fc1.weight: model [3, 4], given [3, 5]"));
    CHECK(((float *)lk_layer_get_tensor(c, "fc2.bias")->data)[0] == before);
    /* non-strict: missing/unexpected are fine, a wrong shape is still an error */
    CHECK_ERR(lk_state_dict_load(c, &bad, false), LK_STATUS_INVALID_ARGUMENT, "shape mismatch: fc1.weight");
    CHECK(!strstr(lk_last_error(), "missing"));
    lk_tensor_release(w_wrong);
    lk_tensor_release(extra);
    lk_named_tensors_clear(&bad);
    lk_named_tensors_clear(&sd);
    lk_layer_free(a);
    lk_layer_free(b);
    lk_layer_free(c);
}

/* ---- flattening ---------------------------------------------------------------------------- */

static void flatten_params(void) {
    lk_layer *net = small_net();
    CHECK_OK(lk_layer_reset_parameters(net, 3));
    lk_named_tensors before = {0};
    CHECK_OK(lk_state_dict_get(net, &before));
    float w01 = ((float *)lk_layer_get_tensor(net, "fc1.weight")->data)[1];
    int64_t n = lk_layer_num_parameters(net);
    float *buf = lk_aligned_alloc(LK_ALIGN, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) buf[i] = 99.0f; /* must be zeroed */
    lk_tensor *fp = NULL, *fg = NULL;
    int64_t n1[1] = {n};
    lk_tensor *off_by_one = lk_tensor_wrap(LK_F32, 1, n1, buf + 1), *whole = lk_tensor_wrap(LK_F32, 1, n1, buf);
    CHECK_ERR(lk_params_flatten(net, off_by_one, &fp, &fg), LK_STATUS_INVALID_ARGUMENT, "aligned");
    CHECK_OK(lk_params_flatten(net, whole, &fp, &fg));
    lk_tensor_release(off_by_one);
    lk_tensor_release(whole); /* the views keep the memory, not the tensor */
    CHECK(fp && fg && fp->numel == n && fg->numel == n && fg->data == buf && fp->grad == fg);
    CHECK(((uintptr_t)fp->data % LK_ALIGN) == 0);
    lk_named_tensors ps = {0};
    CHECK_OK(lk_layer_named_parameters(net, &ps));
    int64_t off = 0;
    for (int i = 0; i < ps.n; i++) {
        lk_tensor *p = ps.items[i].tensor;
        CHECK((float *)p->data == (float *)fp->data + off);
        CHECK(p->grad && (float *)p->grad->data == buf + off && p->requires_grad);
        CHECK(p->name && !strcmp(p->name, ps.items[i].name));
        off += p->numel;
    }
    CHECK(off == n && buf[0] == 0.0f && buf[n - 1] == 0.0f);
    CHECK(((float *)lk_layer_get_tensor(net, "fc1.weight")->data)[1] == w01);
    /* backward accumulates into the flat buffer */
    lk_tensor *x = nn_htensor(11, -1, 1, LK_SHAPE(5, 4));
    lk_scope_begin();
    lk_tensor *loss = lk_sum(lk_layer_forward(lk_layer_get_child(net, "fc1"), x), NULL, 0, false);
    CHECK_OK(lk_backward(loss));
    lk_scope_end();
    CHECK(buf[0] != 0.0f);
    CHECK(lk_tensor_in_flat_buffer(lk_layer_get_tensor(net, "fc1.weight")->grad));
    lk_layer_zero_grad(net, true); /* flat gradients are zeroed, never dropped */
    CHECK(buf[0] == 0.0f && lk_layer_get_tensor(net, "fc1.weight")->grad != NULL);
    /* values (and the buffers) are unchanged by flattening */
    lk_named_tensors after = {0};
    CHECK_OK(lk_state_dict_get(net, &after));
    CHECK(after.n == before.n);
    for (int i = 0; i < before.n && i < after.n; i++) CHECK(nn_rel_err(after.items[i].tensor, before.items[i].tensor) == 0);
    lk_tensor_release(x);
    lk_named_tensors_clear(&ps);
    lk_named_tensors_clear(&before);
    lk_named_tensors_clear(&after);
    lk_layer_free(net);
    lk_tensor_release(fp);
    lk_tensor_release(fg);
    lk_aligned_free(buf);
}

/* bf16-true / 16-true: the parameters cast in place (rounded to nearest
 * even, as lk_tensor_cast), buffers kept f32, a shared parameter still
 * shared, then flattened into bf16 buffers; refused once flat. */
static void cast_parameters(void) {
    lk_layer *net = small_net();
    CHECK_OK(lk_layer_reset_parameters(net, 5));
    /* fc3 shares fc2's weight (tied weights) */
    lk_layer *fc3 = lk_linear_create(3, 2, false, NULL);
    lk_layer_add_child(net, "fc3", fc3);
    lk_tensor *w2 = lk_layer_get_tensor(net, "fc2.weight");
    lk_tensor_release(lk_layer_param(fc3, 0));
    fc3->params.items[0].tensor = lk_tensor_retain(w2);
    lk_tensor *w1_f32 = lk_tensor_cast(lk_layer_get_tensor(net, "fc1.weight"), LK_F32);
    lk_tensor *w1_ref = lk_tensor_cast(w1_f32, LK_BF16);
    int64_t n = lk_layer_num_parameters(net);
    CHECK_ERR(lk_layer_cast_parameters(net, LK_I32), LK_STATUS_INVALID_ARGUMENT, "not one of f32, bf16, f16");
    CHECK_OK(lk_layer_cast_parameters(net, LK_BF16));
    lk_tensor *w1 = lk_layer_get_tensor(net, "fc1.weight");
    CHECK(w1->dtype == LK_BF16 && w1->requires_grad);
    CHECK(!memcmp(w1->data, w1_ref->data, lk_tensor_nbytes(w1_ref)));
    CHECK(lk_layer_get_tensor(net, "bn1.weight")->dtype == LK_BF16);
    CHECK(lk_layer_get_tensor(net, "bn1.running_mean")->dtype == LK_F32); /* buffers keep theirs */
    CHECK(lk_layer_get_tensor(net, "fc2.weight") == lk_layer_param(fc3, 0)); /* still tied */
    CHECK(lk_layer_num_parameters(net) == n);
    CHECK_OK(lk_layer_cast_parameters(net, LK_BF16)); /* already: nothing to do */
    lk_tensor *fp = NULL, *fg = NULL;
    int64_t n1[1] = {n};
    lk_tensor *f32buf = lk_tensor_zeros(LK_F32, 1, n1);
    CHECK_ERR(lk_params_flatten(net, f32buf, &fp, &fg), LK_STATUS_INVALID_ARGUMENT, "contiguous bf16 tensor");
    CHECK_OK(lk_params_flatten(net, NULL, &fp, &fg));
    CHECK(fp && fg && fp->dtype == LK_BF16 && fg->dtype == LK_BF16 && fp->numel == n);
    w1 = lk_layer_get_tensor(net, "fc1.weight");
    CHECK(w1->data == fp->data && w1->grad && w1->grad->dtype == LK_BF16 && !memcmp(w1->data, w1_ref->data, lk_tensor_nbytes(w1_ref)));
    CHECK(w1->name && !strcmp(w1->name, "fc1.weight"));
    CHECK_ERR(lk_layer_cast_parameters(net, LK_F32), LK_STATUS_INVALID_USAGE, "cast the parameters before flattening");
    CHECK(lk_layer_get_tensor(net, "fc1.weight")->dtype == LK_BF16); /* nothing changed */
    lk_tensor_release(f32buf);
    lk_tensor_release(fp);
    lk_tensor_release(fg);
    lk_tensor_release(w1_f32);
    lk_tensor_release(w1_ref);
    lk_layer_free(net);
}

/* ---- initialisers: statistics against PyTorch's distributions ------------------------- */

static void stats(const lk_tensor *t, double *mean, double *var, double *lo, double *hi) {
    double s = 0, s2 = 0;
    *lo = INFINITY, *hi = -INFINITY;
    for (int64_t i = 0; i < t->numel; i++) {
        double v = ((float *)t->data)[i];
        s += v, s2 += v * v;
        if (v < *lo) *lo = v;
        if (v > *hi) *hi = v;
    }
    *mean = s / (double)t->numel;
    *var = s2 / (double)t->numel - *mean * *mean;
}

static void init_statistics(void) {
    double m, v, lo, hi;
    /* Linear(400, 300): weight ~ U(-1/20, 1/20): var = b^2/3 */
    lk_rng rng;
    lk_rng_init(&rng, 5, LK_RNG_INIT, 0, 0);
    lk_layer *lin = lk_linear_create(400, 300, true, &rng);
    double b = 1.0 / 20.0;
    stats(lk_layer_param(lin, 0), &m, &v, &lo, &hi);
    CHECK(lo >= -b && hi < b && hi > 0.99 * b && lo < -0.99 * b);
    CHECK_NEAR(m, 0, 5e-4);
    CHECK_NEAR(v / (b * b / 3), 1.0, 0.01);
    stats(lk_layer_param(lin, 1), &m, &v, &lo, &hi);
    CHECK(lo >= -b && hi < b);
    /* Conv2d(16, 32, 3x3): fan_in 144 */
    lk_layer *conv = lk_conv2d_create(16, 32, 3, 3, LK_CONV2D_DEFAULT, true, &rng);
    b = 1.0 / 12.0;
    stats(lk_layer_param(conv, 0), &m, &v, &lo, &hi);
    CHECK(lo >= -b && hi < b && hi > 0.95 * b);
    CHECK_NEAR(v / (b * b / 3), 1.0, 0.05);
    /* the named initialisers */
    lk_tensor *t = lk_tensor_empty(LK_F32, LK_SHAPE(500, 200));
    CHECK_OK(lk_init_xavier_uniform(t, &rng, 1.0));
    double a = sqrt(6.0 / 700.0);
    stats(t, &m, &v, &lo, &hi);
    CHECK(lo >= -a && hi < a);
    CHECK_NEAR(v / (2.0 / 700.0), 1.0, 0.02);
    CHECK_OK(lk_init_xavier_normal(t, &rng, 2.0));
    stats(t, &m, &v, &lo, &hi);
    CHECK_NEAR(v / (4 * 2.0 / 700.0), 1.0, 0.02);
    CHECK_OK(lk_init_kaiming_uniform(t, &rng, 0, LK_FAN_IN, "relu"));
    stats(t, &m, &v, &lo, &hi);
    CHECK_NEAR(v / (2.0 / 200.0), 1.0, 0.02);
    CHECK_OK(lk_init_kaiming_normal(t, &rng, 0, LK_FAN_OUT, "relu"));
    stats(t, &m, &v, &lo, &hi);
    CHECK_NEAR(v / (2.0 / 500.0), 1.0, 0.02);
    CHECK_NEAR(m, 0, 0.002);
    CHECK_OK(lk_init_normal(t, &rng, 3.0, 0.5));
    stats(t, &m, &v, &lo, &hi);
    CHECK_NEAR(m, 3.0, 0.005);
    CHECK_NEAR(v, 0.25, 0.005);
    CHECK_OK(lk_init_ones(t));
    CHECK(lk_tensor_get(t, 777) == 1.0);
    CHECK_OK(lk_init_zeros(t));
    CHECK(lk_tensor_get(t, 777) == 0.0);
    CHECK_NEAR(lk_init_gain("tanh", 0), 5.0 / 3.0, 1e-12);
    CHECK_NEAR(lk_init_gain("leaky_relu", sqrt(5.0)), sqrt(1.0 / 3.0), 1e-12);
    lk_tensor *v1 = lk_tensor_empty(LK_F32, LK_SHAPE(5));
    CHECK_ERR(lk_init_xavier_uniform(v1, &rng, 1.0), LK_STATUS_INVALID_ARGUMENT, "fewer than 2 dimensions");
    CHECK_ERR(lk_init_kaiming_uniform(t, &rng, 0, LK_FAN_IN, "swish"), LK_STATUS_INVALID_ARGUMENT, "swish");
    /* reset_parameters: keyed by (seed, parameter index), so same seed = same values */
    lk_layer *n1 = small_net(), *n2 = small_net();
    CHECK_OK(lk_layer_reset_parameters(n1, 42));
    CHECK_OK(lk_layer_reset_parameters(n2, 42));
    CHECK(nn_rel_err(lk_layer_get_tensor(n1, "fc2.weight"), lk_layer_get_tensor(n2, "fc2.weight")) == 0);
    CHECK_OK(lk_layer_reset_parameters(n2, 43));
    CHECK(nn_rel_err(lk_layer_get_tensor(n1, "fc2.weight"), lk_layer_get_tensor(n2, "fc2.weight")) > 0);
    CHECK(lk_tensor_get(lk_layer_get_tensor(n1, "bn1.running_var"), 0) == 1.0);
    lk_layer_free(n1);
    lk_layer_free(n2);
    lk_tensor_release(t);
    lk_tensor_release(v1);
    lk_layer_free(lin);
    lk_layer_free(conv);
}

/* ---- dropout: keyed masks ----------------------------------------------------------------- */

static void dropout_masks(void) {
    lk_layer *d = lk_sequential_create(2, (lk_layer *[]){lk_dropout_create(0.3f), lk_dropout_create(0.3f)});
    CHECK(d != NULL);
    CHECK(lk_dropout_create(1.5f) == NULL && strstr(lk_last_error(), "between 0 and 1"));
    lk_tensor *x = lk_tensor_full(LK_F32, LK_SHAPE(10000), 1.0);
    lk_scope_begin();
    lk_layer_set_rng_step(d, 1, 0, 5);
    lk_tensor *y1 = lk_layer_forward(lk_layer_child(d, 0), x);
    if (!y1 && nn_unimplemented()) {
        printf("SKIP dropout: %s\n", lk_last_error());
        lk_clear_error();
        goto done;
    }
    lk_tensor *z1 = lk_layer_forward(lk_layer_child(d, 1), x);
    lk_layer_set_rng_step(d, 1, 0, 5);
    lk_tensor *y2 = lk_layer_forward(lk_layer_child(d, 0), x);
    lk_layer_set_rng_step(d, 1, 0, 6);
    lk_tensor *y3 = lk_layer_forward(lk_layer_child(d, 0), x);
    lk_layer_set_rng_step(d, 1, 1, 5);
    lk_tensor *y4 = lk_layer_forward(lk_layer_child(d, 0), x);
    CHECK(y1 && y2 && y3 && y4 && z1);
    if (y1 && y2 && y3 && y4 && z1) {
        CHECK(nn_rel_err(y1, y2) == 0);  /* same (seed, rank, step): same mask */
        CHECK(nn_rel_err(y1, y3) > 0);   /* next step: another */
        CHECK(nn_rel_err(y1, y4) > 0);   /* another rank: another */
        CHECK(nn_rel_err(y1, z1) > 0);   /* two dropout layers: two streams */
        double kept = 0, s = 0;
        for (int64_t i = 0; i < y1->numel; i++) {
            double v = lk_tensor_get(y1, i);
            kept += v != 0;
            s += v;
            if (v != 0) CHECK_NEAR(v, 1.0 / 0.7, 1e-6);
        }
        CHECK_NEAR(kept / 10000, 0.7, 0.02);
        CHECK_NEAR(s / 10000, 1.0, 0.03);
    }
    lk_layer_train(d, false);
    lk_tensor *ye = lk_layer_forward(lk_layer_child(d, 0), x);
    CHECK(ye && nn_rel_err(ye, x) == 0);
done:
    lk_scope_end();
    lk_tensor_release(x);
    lk_layer_free(d);
}

static void bad_input(void) {
    CHECK(lk_linear_create(0, 3, true, NULL) == NULL && strstr(lk_last_error(), "positive"));
    CHECK(lk_conv2d_create(3, 4, 3, 3, (lk_conv2d_params){{1, 1}, {0, 0}, {1, 1}, 2}, true, NULL) == NULL &&
          strstr(lk_last_error(), "groups"));
    CHECK(lk_batch_norm2d_create(3, 0.0f, 0.1f, true, true) == NULL && strstr(lk_last_error(), "eps"));
    lk_layer *bn = lk_batch_norm2d_create(3, 1e-5f, 0.1f, true, true);
    lk_tensor *x = lk_tensor_zeros(LK_F32, LK_SHAPE(2, 4, 3, 3));
    lk_scope_begin();
    lk_clear_error();
    CHECK(lk_layer_forward(bn, x) == NULL && strstr(lk_last_error(), "expected input [N, 3, H, W], got [2, 4, 3, 3]"));
    lk_clear_error();
    CHECK(lk_layer_forward(NULL, x) == NULL && lk_last_status() == LK_STATUS_INVALID_ARGUMENT);
    lk_scope_end();
    CHECK(lk_sequential_create(2, (lk_layer *[]){lk_relu_create(), lk_linear_create(-1, 2, true, NULL)}) == NULL);
    lk_tensor_release(x);
    lk_layer_free(bn);
    lk_layer_free(NULL);
}

LK_TEST_MAIN(LK_TEST_CASE(parity_all_layers), LK_TEST_CASE(parity_batchnorm_cumulative), LK_TEST_CASE(parity_embedding), LK_TEST_CASE(custom_layer_and_names),
             LK_TEST_CASE(state_dict_roundtrip_and_errors), LK_TEST_CASE(flatten_params), LK_TEST_CASE(cast_parameters), LK_TEST_CASE(init_statistics),
             LK_TEST_CASE(dropout_masks), LK_TEST_CASE(bad_input))

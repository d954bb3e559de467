/* resnet: the model against PyTorch 1.13 (tools/gen_resnet_fixtures.py
 * writes tests/fixtures/resnet/: torchvision's ResNet written out in plain
 * torch.nn with its module names, small stem), and the model's contracts.
 *
 * Parity, PyTorch's initial weights loaded by name (strict), training mode:
 *   - a stride-2 BasicBlock with its downsample (layer2.0 of depth 20,
 *     width 4) and a stride-2 Bottleneck with its downsample (layer2.0 of
 *     depth 50, width 2): output, input gradient and every parameter's
 *     gradient to 1e-5 normwise (max |diff| / max |ref|; f32 sums in
 *     another order, measured about 1e-6);
 *   - a CIFAR ResNet-20 of width 4 on 1 x 8 x 8 images: logits and loss to
 *     1e-5, every gradient to 1e-4 (20 layers of batch norm over 4 x 2 x 2
 *     values at the last stage amplify rounding; measured below 2e-5);
 *   - the same in bf16-mixed (autocast bf16) against the f32 reference:
 *     loss to 2e-2 relative, the gradients all together to 0.3 in the L2
 *     norm (||g - g_ref|| / ||g_ref||). Not tighter because bf16 itself
 *     is not: 8 bits of mantissa through 19 convolutions and batch norms
 *     over 4 x 2 x 2 values at the last stage; PyTorch 1.13's own
 *     torch.autocast(bf16) is 0.32 off its f32 gradients (loss 3.4e-3) on
 *     this net; lockstep measured 0.21 (loss 4.5e-5);
 *   - 5 SGD steps (lr 0.1, momentum 0.9, weight decay 5e-4): each loss to
 *     1e-4, every parameter and every running statistic (running_mean,
 *     running_var, num_batches_tracked) after them to 1e-4 normwise.
 * Contracts: torchvision's names (a state dict lockstep writes has exactly
 * the fixture's names and shapes: what the torch module loads strictly),
 * the init statistics, the blocks run in order are the forward bitwise,
 * bad init args and inputs. */
#include "nn/nn_fixtures.h"

#define RN_DIR LK_SOURCE_DIR "/tests/fixtures/resnet"

static lk_tensor *fx(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.npy", RN_DIR, name);
    lk_tensor *t = NULL;
    lk_status st = lk_npy_load(path, &t);
    CHECK_MSG(st == LK_STATUS_OK, "fixture %s: %s", name, lk_last_error());
    return t;
}

/* Loads "<prefix><name>" for every state-dict entry of l (strict). */
static void load_fixture_state(lk_layer *l, const char *prefix) {
    lk_named_tensors sd = {0}, w = {0};
    CHECK_OK(lk_state_dict_get(l, &sd));
    for (int i = 0; i < sd.n; i++) {
        char n[256];
        snprintf(n, sizeof n, "%s%s", prefix, sd.items[i].name);
        lk_tensor *t = fx(n), *m = sd.items[i].tensor;
        if (t && t->ndim != m->ndim && t->numel == m->numel) { /* a 0-d count comes back as [1] */
            lk_tensor *r = lk_tensor_empty(t->dtype, m->ndim, m->shape);
            if (r) memcpy(r->data, t->data, (size_t)t->numel * lk_dtype_size(t->dtype));
            lk_tensor_release(t);
            t = r;
        }
        if (t) CHECK_OK(lk_named_tensors_append(&w, sd.items[i].name, t));
        lk_tensor_release(t);
    }
    CHECK_OK(lk_state_dict_load(l, &w, true));
    lk_named_tensors_clear(&sd);
    lk_named_tensors_clear(&w);
}

/* Every parameter's gradient against the fixture: each to `tol` normwise,
 * or (tol < 0) all of them together to -tol in the L2 norm,
 * ||g - g_ref|| / ||g_ref|| over the concatenation (bf16-mixed). */
static double grads_vs_fixture(lk_layer *m, const char *prefix, double tol) {
    lk_named_tensors ps = {0};
    CHECK_OK(lk_layer_named_parameters(m, &ps));
    double worst = 0, d2 = 0, r2 = 0;
    for (int i = 0; i < ps.n; i++) {
        char n[256];
        snprintf(n, sizeof n, "%s%s", prefix, ps.items[i].name);
        lk_tensor *want = fx(n), *got = ps.items[i].tensor->grad;
        double e = got && want ? nn_rel_err(got, want) : INFINITY;
        if (e > worst) worst = e;
        if (tol >= 0) nn_check_close(n, got, want, tol);
        for (int64_t j = 0; got && want && got->numel == want->numel && j < got->numel; j++) {
            double a = lk_tensor_get(got, j), b = lk_tensor_get(want, j);
            d2 += (a - b) * (a - b);
            r2 += b * b;
        }
        CHECK_MSG(got && want && got->numel == want->numel, "%s: missing or misshapen", n);
        lk_tensor_release(want);
    }
    double l2 = sqrt(d2 / (r2 > 0 ? r2 : 1));
    if (tol < 0) CHECK_MSG(l2 <= -tol, "%s: gradients' L2 relative error %.3g > %.2g", prefix, l2, -tol);
    printf("  %s: %d gradients, worst relative error %.3g (normwise per tensor), %.3g (L2, all together)\n", prefix, ps.n,
           worst, l2);
    lk_named_tensors_clear(&ps);
    return worst;
}

static const lk_model_kv net_args[] = {{"depth", "20"}, {"width", "4"}, {"in_channels", "1"}, {"image_size", "8"}};

/* One block of a model built with `args`, with the fixture's weights: its
 * output, input gradient and parameter gradients against the fixture. */
static void block_parity(const char *tag, const lk_model_kv *args, int n_args, const char *path) {
    lk_layer *m = NULL;
    CHECK_OK(lk_model_create("resnet", args, n_args, 1, &m));
    lk_layer *blk = m ? lk_layer_get_child(m, path) : NULL;
    CHECK_MSG(blk != NULL, "%s: no block %s", tag, path);
    if (!blk) goto done;
    char p[64];
    snprintf(p, sizeof p, "%s.w.", tag);
    load_fixture_state(blk, p);
    snprintf(p, sizeof p, "%s.x", tag);
    lk_tensor *x = fx(p);
    snprintf(p, sizeof p, "%s.dy", tag);
    lk_tensor *dy = fx(p);
    snprintf(p, sizeof p, "%s.y", tag);
    lk_tensor *want_y = fx(p);
    snprintf(p, sizeof p, "%s.dx", tag);
    lk_tensor *want_dx = fx(p);
    if (!x || !dy || !want_y || !want_dx) goto rel;
    lk_tensor_set_requires_grad(x, true);
    lk_layer_zero_grad(blk, true);
    lk_scope_begin();
    lk_tensor *y = lk_layer_forward(blk, x);
    nn_check_close("block y", y, want_y, 1e-5);
    if (y) CHECK_OK(lk_backward_with(y, dy));
    lk_scope_end();
    nn_check_close("block dx", x->grad, want_dx, 1e-5);
    snprintf(p, sizeof p, "%s.g.", tag);
    grads_vs_fixture(blk, p, 1e-5);
rel:
    lk_tensor_release(x);
    lk_tensor_release(dy);
    lk_tensor_release(want_y);
    lk_tensor_release(want_dx);
done:
    lk_layer_free(m);
}

static void parity_basic_block(void) { block_parity("basic", net_args, 4, "layer2.0"); }

static void parity_bottleneck(void) {
    lk_model_kv a[] = {{"depth", "50"}, {"width", "2"}, {"in_channels", "1"}, {"image_size", "8"}};
    block_parity("bottleneck", a, 4, "layer2.0");
}

static lk_layer *fixture_net(void) {
    lk_layer *m = NULL;
    CHECK_OK(lk_model_create("resnet", net_args, 4, 1, &m));
    if (m) load_fixture_state(m, "net.w.");
    return m;
}

/* loss and gradients of m on (x, labels), under autocast dt (LK_F32: off) */
static double loss_and_grads(lk_layer *m, lk_tensor *x, lk_tensor *labels, lk_dtype dt, lk_tensor **logits_out) {
    const lk_model_info *info = lk_model_find("resnet");
    lk_layer_zero_grad(m, true);
    lk_scope_begin();
    if (dt != LK_F32) lk_autocast_enter(dt);
    lk_tensor *logits = lk_layer_forward(m, x);
    lk_tensor *loss = logits ? lk_model_loss(info, logits, x, labels) : NULL;
    if (dt != LK_F32) lk_autocast_exit();
    CHECK_MSG(loss != NULL, "resnet forward: %s", lk_last_error());
    double v = loss ? lk_tensor_get(loss, 0) : NAN;
    if (logits_out) *logits_out = logits ? lk_tensor_cast(logits, LK_F32) : NULL;
    if (loss) CHECK_OK(lk_backward(loss));
    lk_scope_end();
    return v;
}

static void net_parity(lk_dtype dt) {
    lk_layer *m = fixture_net();
    lk_tensor *x = fx("net.x"), *labels = fx("net.labels"), *want_y = fx("net.y"), *want_loss = fx("net.loss");
    if (!m || !x || !labels || !want_y || !want_loss) goto done;
    lk_tensor *logits = NULL;
    double loss = loss_and_grads(m, x, labels, dt, &logits), wl = lk_tensor_get(want_loss, 0);
    double rel = fabs(loss - wl) / fabs(wl);
    printf("%s: loss %.9g, PyTorch f32 %.9g (relative %.3g)\n", dt == LK_F32 ? "f32" : "bf16-mixed", loss, wl, rel);
    CHECK_MSG(rel <= (dt == LK_F32 ? 1e-5 : 2e-2), "loss %.9g, PyTorch %.9g", loss, wl);
    if (dt == LK_F32) nn_check_close("logits", logits, want_y, 1e-5);
    grads_vs_fixture(m, "net.g.", dt == LK_F32 ? 1e-4 : -0.3);
    lk_tensor_release(logits);
done:
    lk_tensor_release(x);
    lk_tensor_release(labels);
    lk_tensor_release(want_y);
    lk_tensor_release(want_loss);
    lk_layer_free(m);
}

static void parity_net_f32(void) { net_parity(LK_F32); }
static void parity_net_bf16_mixed(void) { net_parity(LK_BF16); }

/* 5 SGD steps: losses, parameters and running statistics as torch's */
static void parity_sgd_running_stats(void) {
    lk_layer *m = fixture_net();
    lk_tensor *labels = fx("net.labels"), *want_losses = fx("net.sgd.loss");
    if (!m || !labels || !want_losses) goto done;
    lk_named_tensors ps = {0};
    CHECK_OK(lk_layer_named_parameters(m, &ps));
    lk_optim_config c = lk_sgd_config_default();
    c.lr = 0.1;
    c.momentum = 0.9;
    c.weight_decay = 5e-4;
    lk_optimizer *opt = NULL;
    CHECK_OK(lk_optimizer_create(&c, &ps, &opt));
    for (int s = 0; s < 5 && opt; s++) {
        char n[32];
        snprintf(n, sizeof n, "net.sgd.x%d", s);
        lk_tensor *x = fx(n);
        double l = x ? loss_and_grads(m, x, labels, LK_F32, NULL) : NAN, w = lk_tensor_get(want_losses, s);
        printf("SGD step %d: loss %.9g, PyTorch %.9g\n", s, l, w);
        CHECK_MSG(fabs(l - w) <= 1e-4 * fabs(w), "SGD step %d: loss %.9g, PyTorch %.9g", s, l, w);
        CHECK_OK(lk_optimizer_step(opt));
        lk_tensor_release(x);
    }
    lk_named_tensors sd = {0};
    CHECK_OK(lk_state_dict_get(m, &sd));
    double worst = 0;
    int n_stats = 0;
    for (int i = 0; i < sd.n; i++) {
        char n[256];
        snprintf(n, sizeof n, "net.sgd.s.%s", sd.items[i].name);
        lk_tensor *want = fx(n);
        double e = want ? nn_rel_err(sd.items[i].tensor, want) : INFINITY;
        if (e > worst) worst = e;
        if (strstr(n, "running_")) n_stats++;
        nn_check_close(n, sd.items[i].tensor, want, 1e-4);
        lk_tensor_release(want);
    }
    printf("after 5 SGD steps: %d state entries (%d running statistics), worst relative error %.3g\n", sd.n, n_stats, worst);
    lk_named_tensors_clear(&sd);
    lk_named_tensors_clear(&ps);
    lk_optimizer_free(opt);
done:
    lk_tensor_release(labels);
    lk_tensor_release(want_losses);
    lk_layer_free(m);
}

/* torchvision's names: resnet18's state dict (small stem) has exactly the
 * names torchvision's has (minus nothing: maxpool holds no tensors), and a
 * depth-20 net's is the fixture's, entry for entry with its shapes. */
static void names(void) {
    lk_layer *m = NULL;
    lk_model_kv r18[] = {{"depth", "18"}, {"num_classes", "1000"}};
    CHECK_OK(lk_model_create("ResNet", r18, 2, 1, &m));
    if (!m) return;
    lk_named_tensors sd = {0};
    CHECK_OK(lk_state_dict_get(m, &sd));
    /* torchvision resnet18: 62 parameters + 3 x 20 batch-norm buffers = 122 */
    CHECK_MSG(sd.n == 122, "resnet18 state dict: %d entries, torchvision's has 122", sd.n);
    static const char *const want[] = {"conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked",
                                       "layer1.0.conv1.weight", "layer1.1.bn2.running_var",
                                       "layer2.0.downsample.0.weight", "layer2.0.downsample.1.bias",
                                       "layer4.1.conv2.weight", "fc.weight", "fc.bias"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK_MSG(lk_named_tensors_find(&sd, want[i]) != NULL, "resnet18 has no %s", want[i]);
    CHECK(lk_named_tensors_find(&sd, "layer1.0.downsample.0.weight") == NULL);
    CHECK_MSG(lk_layer_num_parameters(m) == 11689512 - 9408 + 1728, "resnet18 (small stem): %lld parameters",
              (long long)lk_layer_num_parameters(m));
    lk_tensor *fcw = lk_named_tensors_find(&sd, "fc.weight");
    CHECK(fcw && fcw->shape[0] == 1000 && fcw->shape[1] == 512);
    lk_named_tensors_clear(&sd);
    lk_layer_free(m);
    /* the imagenet stem at 224: torchvision's resnet18 to the parameter */
    lk_model_kv in[] = {{"depth", "18"}, {"num_classes", "1000"}, {"image_size", "224"}};
    CHECK_OK(lk_model_create("resnet", in, 3, 1, &m));
    CHECK_MSG(m && lk_layer_num_parameters(m) == 11689512, "resnet18 (imagenet stem): %lld parameters, torchvision 11689512",
              m ? (long long)lk_layer_num_parameters(m) : -1LL);
    lk_layer_free(m);
    lk_model_kv r50[] = {{"depth", "50"}, {"num_classes", "1000"}, {"stem", "imagenet"}};
    CHECK_OK(lk_model_create("resnet", r50, 3, 1, &m));
    CHECK_MSG(m && lk_layer_num_parameters(m) == 25557032, "resnet50: %lld parameters, torchvision 25557032",
              m ? (long long)lk_layer_num_parameters(m) : -1LL);
    lk_layer_free(m);
    lk_model_kv r34[] = {{"depth", "34"}, {"num_classes", "1000"}, {"stem", "imagenet"}};
    CHECK_OK(lk_model_create("resnet", r34, 3, 1, &m));
    CHECK_MSG(m && lk_layer_num_parameters(m) == 21797672, "resnet34: %lld parameters, torchvision 21797672",
              m ? (long long)lk_layer_num_parameters(m) : -1LL);
    lk_layer_free(m);
    /* depth 20: the fixture's names and shapes, entry for entry */
    CHECK_OK(lk_model_create("resnet", net_args, 4, 1, &m));
    if (!m) return;
    CHECK_OK(lk_state_dict_get(m, &sd));
    for (int i = 0; i < sd.n; i++) {
        char n[256];
        snprintf(n, sizeof n, "net.w.%s", sd.items[i].name);
        lk_tensor *t = fx(n);
        CHECK_MSG(t && t->numel == sd.items[i].tensor->numel, "%s", n);
        lk_tensor_release(t);
    }
    CHECK_MSG(sd.n == 6 + 9 * 12 + 2 * 6 + 2, "depth 20: %d state entries", sd.n);
    lk_named_tensors_clear(&sd);
    lk_layer_free(m);
}

/* Kaiming fan_out: a conv's weights have std sqrt(2 / (out * k * k));
 * BN weight 1, bias 0; zero_init_residual zeroes bn2 of every block. */
static void init_stats(void) {
    lk_layer *m = NULL;
    lk_model_kv a[] = {{"depth", "20"}, {"zero_init_residual", "true"}};
    CHECK_OK(lk_model_create("resnet", a, 2, 3, &m));
    if (!m) return;
    lk_tensor *w = lk_layer_get_tensor(m, "layer3.0.conv2.weight"); /* [64, 64, 3, 3]: fan_out 576 */
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < w->numel; i++) s += lk_tensor_get(w, i), s2 += lk_tensor_get(w, i) * lk_tensor_get(w, i);
    double mean = s / (double)w->numel, sd = sqrt(s2 / (double)w->numel - mean * mean), want = sqrt(2.0 / 576.0);
    CHECK_MSG(fabs(sd - want) < 0.03 * want && fabs(mean) < 0.03 * want, "conv std %.5f (want %.5f), mean %.5f", sd, want, mean);
    CHECK(lk_tensor_get(lk_layer_get_tensor(m, "layer1.0.bn1.weight"), 0) == 1.0);
    CHECK(lk_tensor_get(lk_layer_get_tensor(m, "layer1.0.bn2.weight"), 3) == 0.0);
    CHECK(lk_tensor_get(lk_layer_get_tensor(m, "layer3.2.bn2.weight"), 0) == 0.0);
    CHECK(lk_tensor_get(lk_layer_get_tensor(m, "layer3.2.bn2.running_var"), 0) == 1.0);
    lk_layer_free(m);
}

/* the blocks: stem, every residual block, head; run in order = the forward */
static void blocks(void) {
    lk_layer *m = fixture_net();
    if (!m) return;
    int n = 0;
    const lk_named_layer *b = NULL;
    CHECK_OK(lk_model_blocks(m, &n, &b));
    CHECK_MSG(n == 11 && !strcmp(b[0].name, "stem") && !strcmp(b[1].name, "layer1.0") && !strcmp(b[9].name, "layer3.2") &&
                  !strcmp(b[10].name, "head"),
              "%d blocks", n);
    lk_tensor *x = fx("net.x");
    lk_layer_train(m, false); /* eval: the running statistics do not move */
    lk_scope_begin();
    lk_tensor *whole = lk_layer_forward(m, x);
    lk_tensor *h = x;
    for (int i = 0; i < n && h; i++) h = lk_layer_forward(b[i].layer, h);
    CHECK(whole && h && whole->numel == h->numel && !memcmp(whole->data, h->data, (size_t)h->numel * 4));
    /* flat rows are images */
    lk_tensor *flat = lk_reshape(x, LK_SHAPE(4, 64));
    lk_tensor *fo = flat ? lk_layer_forward(m, flat) : NULL;
    CHECK(whole && fo && !memcmp(whole->data, fo->data, (size_t)fo->numel * 4));
    lk_scope_end();
    lk_tensor_release(x);
    lk_layer_free(m);
}

static void bad_input(void) {
    lk_layer *m = NULL;
    lk_model_kv d[] = {{"depth", "19"}};
    CHECK_ERR(lk_model_create("resnet", d, 1, 1, &m), LK_STATUS_INVALID_ARGUMENT,
              "model resnet: depth = 19: expected 18, 34 or 50 (torchvision's) or 20, 32, 44, 56, 110 (the CIFAR family, 6n+2)");
    lk_model_kv small[] = {{"depth", "18"}, {"image_size", "16"}, {"stem", "imagenet"}};
    CHECK_ERR(lk_model_create("resnet", small, 3, 1, &m), LK_STATUS_INVALID_ARGUMENT,
              
              "model resnet: image_size = 16 is too small for the imagenet stem and 4 stages (it halves the image 5 times): expected image_size >= 32 (or stem: small)");
    lk_model_kv tiny[] = {{"depth", "20"}, {"image_size", "2"}};
    CHECK_ERR(lk_model_create("resnet", tiny, 2, 1, &m), LK_STATUS_INVALID_ARGUMENT,
              "model resnet: image_size = 2 is too small for the small stem and 3 stages");
    lk_model_kv st[] = {{"stem", "big"}};
    CHECK_ERR(lk_model_create("resnet", st, 1, 1, &m), LK_STATUS_INVALID_ARGUMENT,
              "model resnet: stem = 'big': expected auto, small or imagenet");
    lk_model_kv cs[] = {{"depth", "56"}, {"stem", "imagenet"}};
    CHECK_ERR(lk_model_create("resnet", cs, 2, 1, &m), LK_STATUS_INVALID_ARGUMENT,
              "model resnet: stem = imagenet with depth 56: the CIFAR family (20..110) has its 3x3 stem");
    lk_model_kv w[] = {{"width", "-1"}};
    CHECK_ERR(lk_model_create("resnet", w, 1, 1, &m), LK_STATUS_INVALID_ARGUMENT, "model resnet: width = '-1': expected auto or an integer in [1, 65536]");
    CHECK_OK(lk_model_create("resnet", net_args, 4, 1, &m));
    if (!m) return;
    lk_scope_begin();
    lk_tensor *x3 = lk_tensor_zeros(LK_F32, 4, (int64_t[]){2, 3, 8, 8});
    CHECK(lk_layer_forward(m, x3) == NULL);
    const char *want = "model resnet: expected images [N, 1, H, W] with H, W >= 4 (small stem, 3 stages) or flat rows [N, 64], got [2, 3, 8, 8]";
    CHECK_MSG(strstr(lk_last_error(), want), "%s", lk_last_error());
    lk_clear_error();
    lk_tensor *x2 = lk_tensor_zeros(LK_F32, 4, (int64_t[]){2, 1, 2, 2});
    CHECK(lk_layer_forward(m, x2) == NULL);
    CHECK_MSG(strstr(lk_last_error(), "with H, W >= 4"), "%s", lk_last_error());
    lk_clear_error();
    lk_tensor_release(x3);
    lk_tensor_release(x2);
    lk_scope_end();
    lk_layer_free(m);
}

LK_TEST_MAIN(LK_TEST_CASE(parity_basic_block), LK_TEST_CASE(parity_bottleneck), LK_TEST_CASE(parity_net_f32),
             LK_TEST_CASE(parity_net_bf16_mixed), LK_TEST_CASE(parity_sgd_running_stats), LK_TEST_CASE(names),
             LK_TEST_CASE(init_stats), LK_TEST_CASE(blocks), LK_TEST_CASE(bad_input))

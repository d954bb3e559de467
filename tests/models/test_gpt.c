/* gpt: the model against PyTorch 1.13 (tools/gen_gpt_fixtures.py writes
 * tests/fixtures/gpt/: nanoGPT's GPT in plain torch.nn with the explicit
 * attention), and the model's own contracts.
 *
 * Parity, tiny GPT (2 layers, 2 heads, 32 wide, block 16, vocab 64, batch
 * 2 x 16) with PyTorch's initial weights loaded by name (strict):
 *   - f32: logits and loss to 1e-5 relative, every parameter's gradient to
 *     2e-5 (normwise: max |diff| / max |ref|; PyTorch's own f32 GEMMs sum in
 *     another order, measured errors are about 1e-6);
 *   - bf16-mixed (autocast bf16) against the f32 reference: loss to 1e-3,
 *     every gradient to 2e-2 (bf16 keeps 8 bits, 2^-8 = 3.9e-3 per
 *     rounding; measured: loss 1.5e-5, worst gradient 5.9e-3);
 *   - one block (transformer.h.0): output and input gradient, 1e-5;
 *   - 10 AdamW steps with nanoGPT's groups (decay 0.1 on >= 2-dim
 *     parameters, none on biases and LayerNorm weights): each loss to 1e-5
 *     and every final parameter to 5e-5 normwise (llm.c's test_gpt2 checks
 *     the same way; measured 1.9e-5 with the fused attention).
 * Contracts: names and the tied lm_head.weight (state dict twice,
 * parameters once, one gradient, GPT-2 init statistics), blocks [0, k) +
 * [k, n) = the forward bitwise (output and gradients, dropout on),
 * activation checkpointing of the Blocks bitwise with dropout on, bad init
 * args and inputs. */
#include "lockstep/trainer.h" /* lk_model_summary */
#include "nn/nn_fixtures.h"

#define GPT_DIR LK_SOURCE_DIR "/tests/fixtures/gpt"

static lk_tensor *fx(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.npy", GPT_DIR, name);
    lk_tensor *t = NULL;
    lk_status st = lk_npy_load(path, &t);
    CHECK_MSG(st == LK_STATUS_OK, "fixture %s: %s", name, lk_last_error());
    return t;
}

static const lk_model_kv tiny[] = {{"n_layer", "2"},    {"n_head", "2"},     {"n_embd", "32"},
                                   {"block_size", "16"}, {"vocab_size", "64"}, {"dropout", "0.0"}};

/* The tiny GPT with PyTorch's initial weights. */
static lk_layer *tiny_gpt(void) {
    lk_layer *m = NULL;
    CHECK_OK(lk_model_create("gpt", tiny, 6, 1, &m));
    if (!m) return NULL;
    lk_named_tensors sd = {0}, w = {0};
    CHECK_OK(lk_state_dict_get(m, &sd));
    for (int i = 0; i < sd.n; i++) {
        char n[256];
        snprintf(n, sizeof n, "w.%s", sd.items[i].name);
        lk_tensor *t = fx(n);
        if (t) CHECK_OK(lk_named_tensors_append(&w, sd.items[i].name, t));
        lk_tensor_release(t);
    }
    CHECK_OK(lk_state_dict_load(m, &w, true));
    lk_named_tensors_clear(&sd);
    lk_named_tensors_clear(&w);
    return m;
}

/* loss and gradients of m on the fixture batch, under autocast dt (LK_F32: off) */
static double loss_and_grads(lk_layer *m, lk_dtype dt, lk_tensor **logits_out) {
    lk_tensor *x = fx("x"), *y = fx("y");
    const lk_model_info *info = lk_model_find("gpt");
    lk_layer_zero_grad(m, true);
    lk_scope_begin();
    if (dt != LK_F32) lk_autocast_enter(dt);
    lk_tensor *logits = lk_layer_forward(m, x);
    lk_tensor *loss = logits ? lk_model_loss(info, logits, x, y) : NULL;
    if (dt != LK_F32) lk_autocast_exit();
    CHECK_MSG(loss != NULL, "gpt forward: %s", lk_last_error());
    double v = loss ? lk_tensor_get(loss, 0) : NAN;
    if (logits_out) *logits_out = logits ? lk_tensor_cast(logits, LK_F32) : NULL;
    if (loss) CHECK_OK(lk_backward(loss));
    lk_scope_end();
    lk_tensor_release(x);
    lk_tensor_release(y);
    return v;
}

static double grads_vs_fixture(lk_layer *m, double tol, bool verbose) {
    lk_named_tensors ps = {0};
    CHECK_OK(lk_layer_named_parameters(m, &ps));
    double worst = 0;
    for (int i = 0; i < ps.n; i++) {
        char n[256];
        snprintf(n, sizeof n, "g.%s", ps.items[i].name);
        lk_tensor *want = fx(n), *got = ps.items[i].tensor->grad;
        double e = got && want ? nn_rel_err(got, want) : INFINITY;
        if (e > worst) worst = e;
        nn_check_close(n, got, want, tol);
        lk_tensor_release(want);
    }
    if (verbose) printf("  %d gradients, worst relative error %.3g\n", ps.n, worst);
    lk_named_tensors_clear(&ps);
    return worst;
}

static void parity_f32(void) {
    lk_layer *m = tiny_gpt();
    if (!m) return;
    lk_tensor *logits = NULL;
    double loss = loss_and_grads(m, LK_F32, &logits);
    lk_tensor *want_logits = fx("logits"), *want_loss = fx("loss");
    double wl = want_loss ? lk_tensor_get(want_loss, 0) : NAN;
    printf("f32: loss %.9g, PyTorch %.9g\n", loss, wl);
    CHECK_MSG(fabs(loss - wl) <= 1e-5 * fabs(wl), "loss %.9g, PyTorch %.9g", loss, wl);
    nn_check_close("logits", logits, want_logits, 1e-5);
    grads_vs_fixture(m, 2e-5, true);
    lk_tensor_release(logits);
    lk_tensor_release(want_logits);
    lk_tensor_release(want_loss);
    lk_layer_free(m);
}

static void parity_bf16_mixed(void) {
    lk_layer *m = tiny_gpt();
    if (!m) return;
    double loss = loss_and_grads(m, LK_BF16, NULL);
    lk_tensor *want_loss = fx("loss");
    double wl = want_loss ? lk_tensor_get(want_loss, 0) : NAN;
    printf("bf16-mixed: loss %.9g, PyTorch f32 %.9g (relative %.3g)\n", loss, wl, fabs(loss - wl) / fabs(wl));
    CHECK_MSG(fabs(loss - wl) <= 1e-3 * fabs(wl), "bf16-mixed loss %.9g, PyTorch f32 %.9g", loss, wl);
    grads_vs_fixture(m, 2e-2, true);
    lk_tensor_release(want_loss);
    lk_layer_free(m);
}

static void parity_block(void) {
    lk_layer *m = tiny_gpt();
    if (!m) return;
    lk_layer *blk = lk_layer_get_child(m, "transformer.h.0");
    lk_tensor *x = fx("block.x"), *dy = fx("block.dy"), *want_y = fx("block.y"), *want_dx = fx("block.dx");
    lk_tensor_set_requires_grad(x, true);
    lk_scope_begin();
    lk_tensor *y = lk_layer_forward(blk, x);
    nn_check_close("block y", y, want_y, 1e-5);
    if (y) CHECK_OK(lk_backward_with(y, dy));
    lk_scope_end();
    nn_check_close("block dx", x->grad, want_dx, 1e-5);
    lk_tensor_release(x);
    lk_tensor_release(dy);
    lk_tensor_release(want_y);
    lk_tensor_release(want_dx);
    lk_layer_free(m);
}

/* nanoGPT's configure_optimizers: decay on parameters of >= 2 dims; as two
 * groups (nanoGPT's form) or one group with the others exempt
 * (lk_optimizer_no_weight_decay, what optimizer.weight_decay_params uses). */
static void adamw_steps(bool one_group) {
    lk_layer *m = tiny_gpt();
    if (!m) return;
    lk_named_tensors ps = {0}, decay = {0}, nodecay = {0};
    CHECK_OK(lk_layer_named_parameters(m, &ps));
    for (int i = 0; i < ps.n; i++)
        CHECK_OK(lk_named_tensors_append(ps.items[i].tensor->ndim >= 2 ? &decay : &nodecay, ps.items[i].name,
                                         ps.items[i].tensor));
    lk_optim_config c = lk_adamw_config_default();
    c.lr = 1e-3;
    c.beta1 = 0.9;
    c.beta2 = 0.95;
    c.eps = 1e-8;
    c.weight_decay = 0.1;
    lk_optimizer *opt = NULL;
    if (one_group) {
        CHECK_OK(lk_optimizer_create(&c, &ps, &opt));
        for (int i = 0; opt && i < nodecay.n; i++) CHECK_OK(lk_optimizer_no_weight_decay(opt, nodecay.items[i].name));
        if (opt) CHECK_ERR(lk_optimizer_no_weight_decay(opt, "nope"), LK_STATUS_INVALID_ARGUMENT,
                           "optimizer_no_weight_decay: the optimizer has no parameter 'nope'");
    } else {
        CHECK_OK(lk_optimizer_create(&c, &decay, &opt));
        CHECK_OK(lk_optimizer_add_param_group(opt, &nodecay, NAN, 0.0));
    }
    lk_tensor *want_losses = fx("adamw.loss");
    for (int s = 0; s < 10 && opt; s++) {
        double l = loss_and_grads(m, LK_F32, NULL);
        double w = want_losses ? lk_tensor_get(want_losses, s) : NAN;
        CHECK_MSG(fabs(l - w) <= 1e-5 * fabs(w), "AdamW step %d: loss %.9g, PyTorch %.9g", s, l, w);
        if (s == 0 || s == 9) printf("AdamW step %d: loss %.9g, PyTorch %.9g\n", s, l, w);
        CHECK_OK(lk_optimizer_step(opt));
    }
    double worst = 0, key_bias = 0;
    for (int i = 0; i < ps.n; i++) {
        char n[256];
        snprintf(n, sizeof n, "adamw.p.%s", ps.items[i].name);
        lk_tensor *want = fx(n);
        lk_tensor *got = ps.items[i].tensor;
        if (want && strstr(n, "c_attn.bias")) {
            /* The key part of c_attn's bias, [C, 2C), has an exact gradient
             * of 0 (q . b_k adds one constant to a whole row of scores,
             * which softmax ignores): both sides' gradients there are
             * rounding noise, which Adam's normalisation turns into steps
             * of up to about lr. Checked to 10 steps x lr; the query and
             * value parts tightly, with the rest. */
            int64_t C = got->numel / 3;
            for (int64_t j = C; j < 2 * C; j++) {
                double d = fabs(lk_tensor_get(got, j) - lk_tensor_get(want, j));
                if (d > key_bias) key_bias = d;
                ((float *)want->data)[j] = ((float *)got->data)[j];
            }
            CHECK_MSG(key_bias <= 10 * c.lr, "%s: the key bias moved %.3g from PyTorch's (> 10 x lr)", n, key_bias);
        }
        double e = nn_rel_err(got, want);
        if (e > worst) worst = e;
        /* 5e-5: the fused attention's dq sums in another order than
         * PyTorch's GEMMs (gradients agree to ~5e-7), and Adam's
         * normalisation magnifies that in parameters with small gradients:
         * measured 1.9e-5 on c_attn.bias's query part after 10 steps */
        nn_check_close(n, ps.items[i].tensor, want, 5e-5);
        lk_tensor_release(want);
    }
    printf("AdamW (%s): %d parameters after 10 steps, worst relative error %.3g (key biases: %.3g absolute)\n",
           one_group ? "one group, exemptions" : "two groups", ps.n, worst, key_bias);
    lk_tensor_release(want_losses);
    lk_optimizer_free(opt);
    lk_named_tensors_clear(&ps);
    lk_named_tensors_clear(&decay);
    lk_named_tensors_clear(&nodecay);
    lk_layer_free(m);
}

static void parity_adamw_steps(void) { adamw_steps(false); }
static void parity_adamw_steps_one_group(void) { adamw_steps(true); }

/* ---- the model's own contracts ---------------------------------------------------- */

/* the tied weight's grad hook (where DDP marks a bucket ready): its
 * gradient's sum of squares when it fired */
static double hook_sq;
static int hook_fired;
static void tied_hook(lk_tensor *t, void *ctx) {
    (void)ctx;
    hook_fired++;
    hook_sq = 0;
    for (int64_t i = 0; t->grad && i < t->grad->numel; i++) hook_sq += lk_tensor_get(t->grad, i) * lk_tensor_get(t->grad, i);
}

static void names_and_tying(void) {
    lk_layer *m = NULL;
    CHECK_OK(lk_model_create("GPT", tiny, 6, 3, &m)); /* the alias */
    if (!m) return;
    lk_named_tensors sd = {0}, ps = {0};
    CHECK_OK(lk_state_dict_get(m, &sd));
    CHECK_OK(lk_layer_named_parameters(m, &ps));
    /* nanoGPT's: 2 + 12 per block + 2, and lm_head.weight in the state dict only */
    CHECK_MSG(ps.n == 2 + 12 * 2 + 2 && sd.n == ps.n + 1, "%d parameters, %d state-dict entries", ps.n, sd.n);
    CHECK(!strcmp(ps.items[0].name, "transformer.wte.weight") && !strcmp(ps.items[1].name, "transformer.wpe.weight"));
    CHECK(!strcmp(ps.items[2].name, "transformer.h.0.ln_1.weight"));
    CHECK(!strcmp(ps.items[4].name, "transformer.h.0.attn.c_attn.weight"));
    CHECK(!strcmp(sd.items[sd.n - 1].name, "lm_head.weight"));
    CHECK(lk_layer_get_tensor(m, "lm_head.weight") == lk_layer_get_tensor(m, "transformer.wte.weight"));
    CHECK(lk_layer_get_tensor(m, "transformer.h.1.mlp.c_proj.bias") != NULL);
    /* 64*32 + 16*32 + 2 * (12*32*32 + 13*32) + 2*32 */
    CHECK_MSG(lk_layer_num_parameters(m) == 64 * 32 + 16 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 64,
              "%lld parameters", (long long)lk_layer_num_parameters(m));
    /* GPT-2's init: std 0.02, c_proj 0.02/sqrt(2 n_layer) = 0.01, LayerNorm 1/0 */
    lk_tensor *w = lk_layer_get_tensor(m, "transformer.h.0.mlp.c_fc.weight");
    lk_tensor *p = lk_layer_get_tensor(m, "transformer.h.0.mlp.c_proj.weight");
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < w->numel; i++) s1 += lk_tensor_get(w, i) * lk_tensor_get(w, i);
    for (int64_t i = 0; i < p->numel; i++) s2 += lk_tensor_get(p, i) * lk_tensor_get(p, i);
    s1 = sqrt(s1 / (double)w->numel);
    s2 = sqrt(s2 / (double)p->numel);
    CHECK_MSG(fabs(s1 - 0.02) < 0.002 && fabs(s2 - 0.01) < 0.001, "init std %.4g (0.02), c_proj %.4g (0.01)", s1, s2);
    CHECK(lk_tensor_get(lk_layer_get_tensor(m, "transformer.ln_f.weight"), 0) == 1.0);
    CHECK(lk_tensor_get(lk_layer_get_tensor(m, "transformer.h.0.attn.c_attn.bias"), 5) == 0.0);
    /* both uses' gradients are in before the tied weight's hook fires, once */
    lk_tensor *wte = lk_layer_get_tensor(m, "transformer.wte.weight");
    lk_tensor_set_grad_hook(wte, tied_hook, NULL);
    lk_tensor *x = fx("x");
    lk_scope_begin();
    lk_tensor *out = lk_layer_forward(m, x);
    if (out) CHECK_OK(lk_backward(lk_sum(out, NULL, 0, false)));
    lk_scope_end();
    double fin = 0;
    for (int64_t i = 0; wte->grad && i < wte->grad->numel; i++) fin += lk_tensor_get(wte->grad, i) * lk_tensor_get(wte->grad, i);
    CHECK_MSG(hook_fired == 1 && hook_sq == fin && fin > 0, "tied weight's hook: fired %d, |g|^2 %.9g then, %.9g at the end",
              hook_fired, hook_sq, fin);
    lk_tensor_set_grad_hook(wte, NULL, NULL);
    lk_layer_zero_grad(m, true);
    lk_tensor_release(x);
    /* flattened: the tied weight has one slot */
    lk_tensor *flat = NULL;
    CHECK_OK(lk_params_flatten(m, NULL, &flat, NULL));
    CHECK(flat && flat->numel == lk_layer_num_parameters(m));
    CHECK(lk_layer_get_tensor(m, "lm_head.weight") == lk_layer_get_tensor(m, "transformer.wte.weight"));
    lk_tensor_release(flat);
    lk_named_tensors_clear(&sd);
    lk_named_tensors_clear(&ps);
    lk_layer_free(m);
    /* bias false: no Linear or LayerNorm bias */
    lk_model_kv nb[] = {{"n_layer", "1"}, {"n_head", "2"}, {"n_embd", "8"}, {"block_size", "4"}, {"vocab_size", "16"}, {"bias", "false"}};
    CHECK_OK(lk_model_create("gpt", nb, 6, 3, &m));
    lk_named_tensors nps = {0};
    if (m) CHECK_OK(lk_layer_named_parameters(m, &nps));
    for (int i = 0; i < nps.n; i++) CHECK_MSG(!strstr(nps.items[i].name, "bias"), "bias false: %s", nps.items[i].name);
    CHECK_MSG(nps.n == 2 + 6 + 1, "bias false: %d parameters", nps.n);
    lk_named_tensors_clear(&nps);
    lk_layer_free(m);
}

static const lk_model_kv drop[] = {{"n_layer", "3"},    {"n_head", "2"},     {"n_embd", "16"},
                                   {"block_size", "8"}, {"vocab_size", "32"}, {"dropout", "0.2"}};

static lk_tensor *tokens(uint64_t seed, int64_t b, int64_t t, int vocab) {
    lk_tensor *x = nn_hlabels(seed, b * t, vocab);
    lk_tensor *r = lk_tensor_empty(LK_I64, 2, (int64_t[]){b, t});
    if (x && r) memcpy(r->data, x->data, (size_t)(b * t) * sizeof(int64_t));
    lk_tensor_release(x);
    return r;
}

/* Runs (forward via blocks [0,k) then [k,n) when cut >= 0, else the
 * model's forward) and backward; returns the logits (a copy). */
static lk_tensor *run(lk_layer *m, lk_tensor *x, lk_tensor *y, int cut) {
    lk_layer_zero_grad(m, true);
    lk_layer_set_rng_step(m, 9, 0, 4);
    lk_scope_begin();
    lk_tensor *h = x;
    if (cut >= 0) {
        int n = 0;
        const lk_named_layer *b = NULL;
        CHECK_OK(lk_model_blocks(m, &n, &b));
        for (int i = 0; i < cut && h; i++) h = lk_layer_forward(b[i].layer, h);
        for (int i = cut; i < n && h; i++) h = lk_layer_forward(b[i].layer, h);
    } else {
        h = lk_layer_forward(m, x);
    }
    lk_tensor *loss = h ? lk_model_loss(lk_model_find("gpt"), h, x, y) : NULL;
    CHECK_MSG(loss != NULL, "%s", lk_last_error());
    if (loss) CHECK_OK(lk_backward(loss));
    lk_tensor *keep = h ? lk_tensor_clone(h) : NULL;
    lk_scope_end();
    return keep;
}

static void same_grads(lk_layer *a, lk_layer *b, const char *what) {
    lk_named_tensors pa = {0}, pb = {0};
    CHECK_OK(lk_layer_named_parameters(a, &pa));
    CHECK_OK(lk_layer_named_parameters(b, &pb));
    CHECK(pa.n == pb.n);
    for (int i = 0; i < pa.n && i < pb.n; i++) {
        lk_tensor *ga = pa.items[i].tensor->grad, *gb = pb.items[i].tensor->grad;
        CHECK_MSG(ga && gb && ga->numel == gb->numel && !memcmp(ga->data, gb->data, (size_t)ga->numel * 4),
                  "%s: gradient of %s differs", what, pa.items[i].name);
    }
    lk_named_tensors_clear(&pa);
    lk_named_tensors_clear(&pb);
}

static void blocks(void) {
    lk_layer *a = NULL, *b = NULL;
    CHECK_OK(lk_model_create("gpt", drop, 6, 5, &a));
    CHECK_OK(lk_model_create("gpt", drop, 6, 5, &b));
    if (!a || !b) goto done;
    int n = 0;
    const lk_named_layer *bl = NULL;
    CHECK_OK(lk_model_blocks(a, &n, &bl));
    char got[256] = "";
    for (int i = 0; i < n; i++) snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? " " : "", bl[i].name);
    CHECK_MSG(!strcmp(got, "embedding transformer.h.0 transformer.h.1 transformer.h.2 head"), "blocks: %s", got);
    CHECK(n == 5 && bl[1].layer == lk_layer_get_child(a, "transformer.h.0"));
    /* the views' parameters: the embedding holds wte and wpe, the head ln_f and the tied wte */
    lk_named_tensors ep = {0}, hp = {0};
    CHECK_OK(lk_layer_named_parameters(bl[0].layer, &ep));
    CHECK_OK(lk_layer_named_parameters(bl[n - 1].layer, &hp));
    CHECK_MSG(ep.n == 2 && ep.items[0].tensor == lk_layer_get_tensor(a, "transformer.wte.weight"), "embedding: %d", ep.n);
    CHECK_MSG(hp.n == 3 && hp.items[2].tensor == lk_layer_get_tensor(a, "transformer.wte.weight"), "head: %d", hp.n);
    lk_named_tensors_clear(&ep);
    lk_named_tensors_clear(&hp);
    /* ModelSummary's top-level rows are the blocks */
    char *sum = NULL;
    CHECK_OK(lk_model_summary(a, 1, &sum));
    CHECK_MSG(sum && strstr(sum, "| embedding       | GPTEmbedding |") && strstr(sum, "| transformer.h.2 | Block ") &&
                  strstr(sum, "| head            | GPTHead "),
              "summary:\n%s", sum ? sum : "");
    lk_free(sum);
    lk_tensor *x = tokens(21, 3, 8, 32), *y = tokens(22, 3, 8, 32);
    lk_tensor *oa = run(a, x, y, -1);
    for (int k = 0; k <= n; k++) {
        lk_tensor *ob = run(b, x, y, k);
        char what[64];
        snprintf(what, sizeof what, "blocks [0,%d) + [%d,%d)", k, k, n);
        CHECK_MSG(oa && ob && !memcmp(oa->data, ob->data, (size_t)oa->numel * 4), "%s: output differs", what);
        same_grads(a, b, what);
        lk_tensor_release(ob);
    }
    lk_tensor_release(oa);
    lk_tensor_release(x);
    lk_tensor_release(y);
done:
    lk_layer_free(a);
    lk_layer_free(b);
}

/* trainer.activation_checkpointing's policy on a gpt: the Blocks, recomputed
 * bitwise with dropout on (the attention's and the residuals' masks replayed). */
static void checkpointing(void) {
    lk_layer *a = NULL, *b = NULL;
    CHECK_OK(lk_model_create("gpt", drop, 6, 5, &a));
    CHECK_OK(lk_model_create("gpt", drop, 6, 5, &b));
    if (!a || !b) goto done;
    int k = lk_layer_checkpoint_policy(b, NULL, 0);
    CHECK_MSG(k == 3, "checkpoint policy set %d layers, expected the 3 blocks", k);
    CHECK(lk_layer_get_child(b, "transformer.h.2")->checkpoint && !lk_layer_get_child(b, "lm_head")->checkpoint);
    lk_tensor *x = tokens(31, 2, 8, 32), *y = tokens(32, 2, 8, 32);
    lk_tensor *oa = run(a, x, y, -1), *ob = run(b, x, y, -1);
    CHECK_MSG(oa && ob && !memcmp(oa->data, ob->data, (size_t)oa->numel * 4), "checkpointed output differs");
    same_grads(a, b, "activation checkpointing");
    /* and the dropout is on: another step's masks give another output */
    lk_layer_set_rng_step(a, 9, 0, 5);
    lk_scope_begin();
    lk_tensor *o2 = lk_layer_forward(a, x);
    CHECK(o2 && oa && memcmp(o2->data, oa->data, (size_t)oa->numel * 4));
    lk_scope_end();
    lk_tensor_release(oa);
    lk_tensor_release(ob);
    lk_tensor_release(x);
    lk_tensor_release(y);
done:
    lk_layer_free(a);
    lk_layer_free(b);
}

static void bad_input(void) {
    lk_layer *m = NULL;
    lk_model_kv heads[] = {{"n_embd", "30"}, {"n_head", "4"}};
    CHECK_ERR(lk_model_create("gpt", heads, 2, 1, &m), LK_STATUS_INVALID_ARGUMENT,
              "model gpt: n_embd = 30 is not divisible by n_head = 4");
    lk_model_kv zero[] = {{"n_layer", "0"}};
    CHECK_ERR(lk_model_create("gpt", zero, 1, 1, &m), LK_STATUS_INVALID_ARGUMENT, "model gpt: n_layer = '0': expected a positive integer");
    lk_model_kv vocab[] = {{"vocab_size", "-3"}};
    CHECK_ERR(lk_model_create("gpt", vocab, 1, 1, &m), LK_STATUS_INVALID_ARGUMENT, "model gpt: vocab_size = '-3'");
    lk_model_kv big[] = {{"block_size", "4294967296"}};
    CHECK_ERR(lk_model_create("gpt", big, 1, 1, &m), LK_STATUS_INVALID_ARGUMENT,
              "model gpt: block_size = 4294967296: expected an integer in [1, 2^31]");
    lk_model_kv dr[] = {{"dropout", "1.0"}};
    CHECK_ERR(lk_model_create("gpt", dr, 1, 1, &m), LK_STATUS_INVALID_ARGUMENT,
              "model gpt: dropout = 1: expected a probability in [0, 1)");
    CHECK_OK(lk_model_create("gpt", tiny, 6, 1, &m));
    if (!m) return;
    lk_tensor *x = tokens(41, 1, 17, 64);
    lk_scope_begin();
    CHECK(lk_layer_forward(m, x) == NULL);
    CHECK_MSG(strstr(lk_last_error(), "model gpt: a sequence of 17 tokens is longer than block_size = 16"), "%s", lk_last_error());
    lk_clear_error();
    lk_tensor *f = lk_tensor_zeros(LK_F32, 2, (int64_t[]){1, 4});
    CHECK(lk_layer_forward(m, f) == NULL);
    CHECK_MSG(strstr(lk_last_error(), "model gpt: expected token ids i64 [B, T] (or [T]), got f32 [1, 4]"), "%s", lk_last_error());
    lk_clear_error();
    lk_tensor_release(f);
    lk_scope_end();
    lk_tensor_release(x);
    lk_layer_free(m);
}

LK_TEST_MAIN(LK_TEST_CASE(parity_f32), LK_TEST_CASE(parity_bf16_mixed), LK_TEST_CASE(parity_block),
             LK_TEST_CASE(parity_adamw_steps), LK_TEST_CASE(parity_adamw_steps_one_group), LK_TEST_CASE(names_and_tying), LK_TEST_CASE(blocks),
             LK_TEST_CASE(checkpointing), LK_TEST_CASE(bad_input))

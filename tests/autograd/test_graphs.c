/* Many graphs on one thread: several forward graphs alive at once, their
 * backwards run in another order than their forwards, each freeing only its
 * own nodes; a subgraph two graphs share lives until the last of them has
 * run its backward; leaf hooks count per pass. */
#include <string.h>

#include "gradcheck.h"
#include "lockstep/nn.h"

enum { NG = 4 };

/* A small net: loss_k = mse(tanh(linear(relu(linear(x_k, w1, b1)), w2)), y_k). */
static lk_tensor *net_loss(lk_tensor *x, lk_tensor *y, lk_tensor *w1, lk_tensor *b1, lk_tensor *w2) {
    lk_tensor *h = lk_relu(lk_linear(x, w1, b1));
    return lk_mse_loss(lk_tanh(lk_linear(h, w2, NULL)), y, LK_REDUCTION_MEAN);
}

static lk_tensor *copy_grad(const lk_tensor *p) { return p->grad ? lk_tensor_clone(p->grad) : NULL; }

static bool same_bits(const lk_tensor *a, const lk_tensor *b) {
    return a && b && a->numel == b->numel && !memcmp(a->data, b->data, (size_t)a->numel * sizeof(float));
}

static int hooks_fired[3];
static void count_hook(lk_tensor *p, void *ctx) {
    (void)p;
    hooks_fired[(intptr_t)ctx]++;
}

static void four_graphs_out_of_order(void) {
    lk_tensor *w1 = lk_gc_param(1, LK_SHAPE(6, 5)), *b1 = lk_gc_param(2, LK_SHAPE(6)), *w2 = lk_gc_param(3, LK_SHAPE(3, 6));
    lk_tensor *p[3] = {w1, b1, w2};
    lk_tensor *x[NG], *y[NG];
    for (int k = 0; k < NG; k++) {
        x[k] = lk_gc_param(10 + (uint32_t)k, LK_SHAPE(4, 5));
        y[k] = lk_gc_param(20 + (uint32_t)k, LK_SHAPE(4, 3));
        lk_tensor_set_requires_grad(y[k], false);
    }
    /* one by one: forward, backward, the gradients */
    lk_tensor *ref[NG][4];
    size_t nodes = 0;
    for (int k = 0; k < NG; k++) {
        for (int i = 0; i < 3; i++) lk_tensor_zero_grad(p[i], true);
        lk_tensor_zero_grad(x[k], true);
        lk_scope_begin();
        lk_tensor *loss = net_loss(x[k], y[k], w1, b1, w2);
        nodes = lk_tape_len();
        CHECK_OK(lk_backward(loss));
        CHECK(lk_tape_len() == 0);
        lk_scope_end();
        for (int i = 0; i < 3; i++) ref[k][i] = copy_grad(p[i]);
        ref[k][3] = copy_grad(x[k]);
    }
    CHECK(nodes > 4);
    /* four alive at once, backwards in the order 2, 0, 3, 1 */
    for (int i = 0; i < 3; i++) lk_tensor_set_grad_hook(p[i], count_hook, (void *)(intptr_t)i);
    lk_scope_begin();
    lk_tensor *loss[NG];
    for (int k = 0; k < NG; k++) loss[k] = net_loss(x[k], y[k], w1, b1, w2);
    CHECK(lk_tape_len() == NG * nodes);
    static const int order[NG] = {2, 0, 3, 1};
    for (int j = 0; j < NG; j++) {
        int k = order[j];
        for (int i = 0; i < 3; i++) lk_tensor_zero_grad(p[i], true);
        lk_tensor_zero_grad(x[k], true);
        memset(hooks_fired, 0, sizeof hooks_fired);
        CHECK_OK(lk_backward(loss[k]));
        CHECK_MSG(lk_tape_len() == (size_t)(NG - 1 - j) * nodes, "after backward %d: %zu nodes live, want %zu", j,
                  lk_tape_len(), (size_t)(NG - 1 - j) * nodes);
        CHECK(loss[k]->grad_fn == NULL); /* its graph is gone, the others' are not */
        for (int o = j + 1; o < NG; o++) CHECK(loss[order[o]]->grad_fn != NULL);
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(same_bits(p[i]->grad, ref[k][i]), "graph %d: parameter %d's gradient differs", k, i);
            CHECK_MSG(hooks_fired[i] == 1, "graph %d: parameter %d's hook fired %d times", k, i, hooks_fired[i]);
        }
        CHECK_MSG(same_bits(x[k]->grad, ref[k][3]), "graph %d: the input's gradient differs", k);
    }
    CHECK_ERR(lk_backward(loss[2]), LK_STATUS_INVALID_USAGE, "does not require grad");
    lk_scope_end();
    CHECK(lk_tape_len() == 0);
    for (int k = 0; k < NG; k++) {
        for (int i = 0; i < 4; i++) lk_tensor_release(ref[k][i]);
        lk_tensor_release(x[k]);
        lk_tensor_release(y[k]);
    }
    for (int i = 0; i < 3; i++) lk_tensor_release(p[i]);
}

/* Two heads on one trunk: the trunk's nodes stay until both heads' backwards
 * have run, and each head's gradients are those of running it alone. */
static void shared_trunk(void) {
    lk_tensor *x = lk_gc_param(30, LK_SHAPE(4, 5)), *w1 = lk_gc_param(31, LK_SHAPE(6, 5)), *w2 = lk_gc_param(32, LK_SHAPE(2, 6));
    lk_tensor *ga[2], *gb[2];
    for (int head = 0; head < 2; head++) { /* alone */
        lk_tensor_zero_grad(x, true);
        lk_tensor_zero_grad(w1, true);
        lk_scope_begin();
        lk_tensor *h = lk_relu(lk_linear(x, w1, NULL));
        lk_tensor *l = head == 0 ? lk_sum(lk_linear(h, w2, NULL), NULL, 0, false) : lk_sum(lk_mul(h, h), NULL, 0, false);
        CHECK_OK(lk_backward(l));
        lk_scope_end();
        (head == 0 ? ga : gb)[0] = copy_grad(x);
        (head == 0 ? ga : gb)[1] = copy_grad(w1);
    }
    lk_tensor_zero_grad(x, true);
    lk_tensor_zero_grad(w1, true);
    lk_scope_begin();
    lk_tensor *h = lk_relu(lk_linear(x, w1, NULL));
    size_t trunk = lk_tape_len();
    lk_tensor *la = lk_sum(lk_linear(h, w2, NULL), NULL, 0, false);
    lk_tensor *lb = lk_sum(lk_mul(h, h), NULL, 0, false);
    size_t all = lk_tape_len();
    CHECK_OK(lk_backward(lb)); /* the later head first */
    CHECK(same_bits(x->grad, gb[0]) && same_bits(w1->grad, gb[1]));
    CHECK_MSG(lk_tape_len() == all - 2 && h->grad_fn, "%zu nodes live, want %zu (the trunk and head a)", lk_tape_len(),
              all - 2);
    lk_tensor_zero_grad(x, true);
    lk_tensor_zero_grad(w1, true);
    CHECK_OK(lk_backward(la));
    CHECK(same_bits(x->grad, ga[0]) && same_bits(w1->grad, ga[1]));
    CHECK(lk_tape_len() == 0 && h->grad_fn == NULL);
    (void)trunk;
    lk_scope_end();
    /* a scope's end still drops what was recorded inside it, backward or not */
    lk_scope_begin();
    lk_tensor *kept = lk_tensor_keep(lk_relu(lk_linear(x, w1, NULL)));
    lk_scope_begin();
    lk_tensor *inner = lk_sum(kept, NULL, 0, false);
    CHECK(lk_tape_len() == 3 && inner->grad_fn);
    lk_scope_end();
    CHECK(lk_tape_len() == 2 && kept->grad_fn);
    lk_scope_end();
    CHECK(lk_tape_len() == 0 && kept->grad_fn == NULL);
    lk_tensor_release(kept);
    for (int i = 0; i < 2; i++) {
        lk_tensor_release(ga[i]);
        lk_tensor_release(gb[i]);
    }
    lk_tensor_release(x);
    lk_tensor_release(w1);
    lk_tensor_release(w2);
}

static lk_tensor *f_net(lk_tensor **in, void *ctx) {
    (void)ctx;
    return net_loss(in[0], in[4], in[1], in[2], in[3]);
}

/* The net the tests above run, checked against finite differences once. */
static void net_gradcheck(void) {
    lk_tensor *in[5] = {lk_gc_param(40, LK_SHAPE(4, 5)), lk_gc_param(41, LK_SHAPE(6, 5)), lk_gc_param(42, LK_SHAPE(6)),
                        lk_gc_param(43, LK_SHAPE(3, 6)), lk_gc_param(44, LK_SHAPE(4, 3))};
    lk_gradcheck("net", f_net, in, 5, NULL);
    for (int i = 0; i < 5; i++) lk_tensor_release(in[i]);
}

/* ---- lk_function ------------------------------------------------------------ */

/* The header's example: y = x * w. */
static lk_tensor *mul_fwd(lk_function_ctx *c, int n, lk_tensor *const *in) {
    (void)n;
    if (lk_function_save(c, in[0]) || lk_function_save(c, in[1])) return NULL;
    return lk_mul(in[0], in[1]);
}
static lk_status mul_bwd(lk_function_ctx *c, lk_tensor *g, lk_tensor **grad_in) {
    lk_tensor *x = lk_function_saved(c, 0), *w = lk_function_saved(c, 1);
    if (lk_function_needs_grad(c, 0)) grad_in[0] = lk_mul(g, w);
    if (lk_function_needs_grad(c, 1)) grad_in[1] = lk_mul(g, x);
    return lk_last_status();
}
static const lk_function my_mul = {"my_mul", mul_fwd, mul_bwd, NULL};

/* A recompute: the forward keeps only its inputs; the backward runs the
 * forward again with grad mode on and differentiates it with a nested
 * backward. y = tanh(linear(x, w, b)) * 2. */
static int destroyed, fwd_grad_on;
static void count_destroy(void *state) { destroyed += *(int *)state; }
static lk_tensor *body(lk_tensor *x, lk_tensor *w, lk_tensor *b) { return lk_mul_scalar(lk_tanh(lk_linear(x, w, b)), 2.0f); }
static lk_tensor *re_fwd(lk_function_ctx *c, int n, lk_tensor *const *in) {
    (void)n;
    fwd_grad_on += lk_grad_enabled();
    for (int i = 0; i < 3; i++)
        if (lk_function_save(c, in[i])) return NULL;
    return body(in[0], in[1], in[2]);
}
static lk_status re_bwd(lk_function_ctx *c, lk_tensor *g, lk_tensor **grad_in) {
    lk_tensor *x = lk_detach(lk_function_saved(c, 0));
    if (!x) return lk_last_status();
    lk_tensor_set_requires_grad(x, true);
    size_t live = lk_tape_len();
    bool prev = lk_set_grad_enabled(true); /* a forward inside the backward */
    lk_tensor *y = body(x, lk_function_saved(c, 1), lk_function_saved(c, 2));
    lk_set_grad_enabled(prev);
    CHECK(lk_tape_len() > live);
    lk_status st = y ? lk_backward_with(y, g) : lk_last_status(); /* and a nested backward */
    CHECK(lk_tape_len() == live); /* it freed its own graph, not the outer one */
    if (!st) grad_in[0] = x->grad; /* the parameters' gradients went straight into them */
    return st;
}
static lk_tensor *id_fwd(lk_function_ctx *c, int n, lk_tensor *const *in) {
    (void)c;
    (void)n;
    return in[0];
}
static lk_status id_bwd(lk_function_ctx *c, lk_tensor *g, lk_tensor **grad_in) {
    (void)c;
    grad_in[0] = g;
    return LK_STATUS_OK;
}
static const lk_function recompute = {"recompute", re_fwd, re_bwd, count_destroy};

static lk_tensor *f_my_mul(lk_tensor **in, void *ctx) {
    (void)ctx;
    return lk_function_apply(&my_mul, 2, in, NULL);
}
static lk_tensor *f_recompute(lk_tensor **in, void *ctx) {
    (void)ctx;
    return lk_tanh(lk_function_apply(&recompute, 3, in, NULL));
}

static void function_gradcheck(void) {
    lk_tensor *in[3] = {lk_gc_param(50, LK_SHAPE(4, 5)), lk_gc_param(51, LK_SHAPE(4, 5)), NULL};
    lk_gradcheck("my_mul", f_my_mul, in, 2, NULL);
    lk_tensor_set_requires_grad(in[0], false); /* one input without a gradient */
    lk_gradcheck("my_mul x fixed", f_my_mul, in, 2, NULL);
    CHECK(in[0]->grad == NULL);
    lk_tensor_release(in[0]);
    lk_tensor_release(in[1]);
    lk_tensor *r[3] = {lk_gc_param(52, LK_SHAPE(3, 5)), lk_gc_param(53, LK_SHAPE(4, 5)), lk_gc_param(54, LK_SHAPE(4))};
    lk_gradcheck("recompute", f_recompute, r, 3, NULL);
    for (int i = 0; i < 3; i++) lk_tensor_release(r[i]);
    CHECK(lk_tape_len() == 0);
}

/* A forward run inside a backward, and its nested backward: the gradients
 * are bitwise those of the plain graph, every hook fires once, from the
 * outer pass, and the state goes with the node. */
static void nested_forward_in_backward(void) {
    lk_tensor *x = lk_gc_param(60, LK_SHAPE(3, 5)), *w = lk_gc_param(61, LK_SHAPE(4, 5)), *b = lk_gc_param(62, LK_SHAPE(4));
    lk_tensor *p[3] = {x, w, b}, *ref[3];
    lk_scope_begin();
    CHECK_OK(lk_backward(lk_sum(lk_tanh(body(x, w, b)), NULL, 0, false)));
    lk_scope_end();
    for (int i = 0; i < 3; i++) {
        ref[i] = copy_grad(p[i]);
        lk_tensor_zero_grad(p[i], true);
        lk_tensor_set_grad_hook(p[i], count_hook, (void *)(intptr_t)i);
    }
    memset(hooks_fired, 0, sizeof hooks_fired);
    int *state = lk_malloc(sizeof *state);
    *state = 1;
    destroyed = fwd_grad_on = 0;
    lk_scope_begin();
    lk_tensor *y = lk_function_apply(&recompute, 3, p, state);
    CHECK(y && y->grad_fn && lk_tape_len() == 1 && fwd_grad_on == 0);
    lk_tensor *loss = lk_sum(lk_tanh(y), NULL, 0, false);
    CHECK_OK(lk_backward(loss));
    CHECK(lk_tape_len() == 0 && destroyed == 1);
    lk_scope_end();
    lk_free(state);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(same_bits(p[i]->grad, ref[i]), "input %d: the recomputed gradient differs", i);
        CHECK_MSG(hooks_fired[i] == 1, "input %d: its hook fired %d times", i, hooks_fired[i]);
        lk_tensor_release(ref[i]);
    }
    /* without grad mode: no node, the state goes at once */
    state = lk_malloc(sizeof *state);
    *state = 1;
    lk_scope_begin();
    bool prev = lk_set_grad_enabled(false);
    y = lk_function_apply(&recompute, 3, p, state);
    lk_set_grad_enabled(prev);
    CHECK(y && !y->grad_fn && destroyed == 2 && lk_tape_len() == 0);
    lk_scope_end();
    lk_free(state);
    /* an identity function's output is a tensor of its own */
    lk_scope_begin();
    lk_tensor *same = lk_function_apply(&(lk_function){"id", id_fwd, id_bwd, NULL}, 1, &w, NULL);
    CHECK(same && same != w && same->grad_fn && !w->grad_fn && same->data == w->data);
    lk_scope_end();
    CHECK_ERR(lk_function_apply(&(lk_function){"broken", NULL, id_bwd, NULL}, 1, &w, NULL) ? 0 : lk_last_status(),
              LK_STATUS_INVALID_ARGUMENT, "needs a function with forward and backward");
    for (int i = 0; i < 3; i++) lk_tensor_release(p[i]);
}

/* ---- layer hooks ------------------------------------------------------------------ */

static char events[256];
static lk_status log_hook(lk_layer *l, lk_layer_hook_when when, void *ctx) {
    (void)l;
    char e[8];
    snprintf(e, sizeof e, "%c%d%s ", "FBA"[when], (int)(intptr_t)ctx, lk_layer_recomputing() ? "r" : "");
    strncat(events, e, sizeof events - strlen(events) - 1);
    /* after backward: this layer's parameter gradients are there */
    if (when == LK_LAYER_AFTER_BACKWARD && lk_layer_param(l, 0) && !lk_layer_param(l, 0)->grad)
        strncat(events, "(no grad!) ", sizeof events - strlen(events) - 1);
    return LK_STATUS_OK;
}

/* Linear, Tanh, Linear, each with every hook; the middle one checkpointed
 * in the second run: the hooks fire in the documented order, the recompute
 * fires the middle layer's BEFORE_FORWARD again, the gradients are the
 * same bits. */
static void layer_hooks_order(void) {
    lk_rng rng;
    lk_rng_init(&rng, 5, LK_RNG_INIT, 0, 0);
    lk_layer *seq = lk_sequential_create(3, (lk_layer *[]){lk_linear_create(5, 6, true, &rng), lk_tanh_create(),
                                                            lk_linear_create(6, 2, true, &rng)});
    CHECK(seq != NULL);
    for (int k = 0; k < 3; k++)
        for (int w = 0; w < 3; w++) CHECK_OK(lk_layer_add_hook(lk_layer_child(seq, k), w, log_hook, (void *)(intptr_t)k));
    lk_tensor *x = lk_gc_param(70, LK_SHAPE(3, 5));
    lk_tensor_set_requires_grad(x, false); /* the first layer's input needs no gradient: its hooks fire all the same */
    lk_tensor *ref = NULL;
    static const char *const want[2] = {"F0 F1 F2 B2 A2 B1 A1 B0 A0 ", "F0 F1 F2 B2 A2 B1 F1r A1 B0 A0 "};
    for (int run = 0; run < 2; run++) {
        CHECK_OK(lk_layer_set_checkpoint(lk_layer_child(seq, 1), run == 1));
        lk_layer_zero_grad(seq, true);
        events[0] = '\0';
        lk_scope_begin();
        CHECK_OK(lk_backward(lk_sum(lk_layer_forward(seq, x), NULL, 0, false)));
        lk_scope_end();
        CHECK_MSG(!strcmp(events, want[run]), "run %d: hooks fired \"%s\", want \"%s\"", run, events, want[run]);
        lk_tensor *g = lk_layer_param(lk_layer_child(seq, 0), 0)->grad;
        if (run == 0) ref = lk_tensor_clone(g);
        else CHECK_MSG(same_bits(g, ref), "the checkpointed run's first-layer gradient differs");
    }
    CHECK(lk_tape_len() == 0);
    /* no grad mode: only BEFORE_FORWARD, and no recompute */
    events[0] = '\0';
    lk_scope_begin();
    bool prev = lk_set_grad_enabled(false);
    CHECK(lk_layer_forward(seq, x) != NULL);
    lk_set_grad_enabled(prev);
    lk_scope_end();
    CHECK_MSG(!strcmp(events, "F0 F1 F2 "), "no grad: hooks fired \"%s\"", events);
    CHECK_ERR(lk_layer_add_hook(seq, (lk_layer_hook_when)7, log_hook, NULL), LK_STATUS_INVALID_ARGUMENT,
              "one of LK_LAYER_BEFORE_FORWARD");
    lk_tensor_release(ref);
    lk_tensor_release(x);
    lk_layer_free(seq);
}

LK_TEST_MAIN(LK_TEST_CASE(layer_hooks_order), LK_TEST_CASE(four_graphs_out_of_order), LK_TEST_CASE(shared_trunk), LK_TEST_CASE(net_gradcheck),
             LK_TEST_CASE(function_gradcheck), LK_TEST_CASE(nested_forward_in_backward))

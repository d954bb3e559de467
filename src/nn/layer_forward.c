/* A layer's forward and what hangs on it: the layer hooks (before forward,
 * before backward, after backward) and activation checkpointing (a
 * checkpointed layer keeps its input only and runs its forward again inside
 * the backward, replaying its dropout streams and autocast dtype). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "lockstep/nn.h"
#include "tensor/tensor_impl.h"

/* ---- hooks and activation checkpointing ------------------------------------------ */

typedef struct hook {
    lk_layer_hook_when when;
    lk_layer_hook_fn fn;
    void *ctx;
} hook;

struct lk__layer_hooks {
    int n, cap;
    hook *v;
    bool has[4]; /* any hook of each kind */
    bool after_backward_optional; /* lk_layer_set_after_backward_optional */
};

static _Thread_local int recomputing; /* depth of checkpoint recomputes running on this thread */

bool lk_layer_recomputing(void) { return recomputing > 0; }

lk_status lk_layer_add_hook(lk_layer *l, lk_layer_hook_when when, lk_layer_hook_fn fn, void *ctx) {
    if (!l || !fn || (unsigned)when > LK_LAYER_AFTER_FORWARD)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "layer_add_hook: needs a layer, a hook function and one of "
                        "LK_LAYER_BEFORE_FORWARD, LK_LAYER_AFTER_FORWARD, LK_LAYER_BEFORE_BACKWARD, LK_LAYER_AFTER_BACKWARD");
    if (!l->hooks && !(l->hooks = lk_calloc(1, sizeof *l->hooks))) return LK_STATUS_OUT_OF_MEMORY;
    struct lk__layer_hooks *h = l->hooks;
    if (h->n == h->cap) LK_TRY(lk_vec_reserve(h->v, h->cap, h->n + 1, 4));
    h->v[h->n++] = (hook){when, fn, ctx};
    h->has[when] = true;
    return LK_STATUS_OK;
}

lk_status lk_layer_set_after_backward_optional(lk_layer *l, bool optional) {
    if (!l) return lk_error(LK_STATUS_INVALID_ARGUMENT, "layer_set_after_backward_optional: NULL layer");
    if (!l->hooks && !(l->hooks = lk_calloc(1, sizeof *l->hooks))) return LK_STATUS_OUT_OF_MEMORY;
    l->hooks->after_backward_optional = optional;
    return LK_STATUS_OK;
}

void lk_layer_clear_hooks(lk_layer *l) {
    if (!l || !l->hooks) return;
    lk_free(l->hooks->v);
    lk_free(l->hooks);
    l->hooks = NULL;
}

static lk_status fire(lk_layer *l, lk_layer_hook_when when) {
    const struct lk__layer_hooks *h = l->hooks;
    for (int i = 0; h && i < h->n; i++)
        if (h->v[i].when == when) LK_TRY(h->v[i].fn(l, when, h->v[i].ctx));
    return LK_STATUS_OK;
}

lk_status lk_layer_set_checkpoint(lk_layer *l, bool on) {
    if (!l) return lk_error(LK_STATUS_INVALID_ARGUMENT, "layer_set_checkpoint: NULL layer");
    l->checkpoint = on;
    return LK_STATUS_OK;
}

/* Every parameter of l's tree, once each (tied ones once), in
 * named_parameters order; and the random streams of the tree. */
typedef struct {
    lk_tensor **p;
    int np, capp;
    lk_rng **rng;
    int nr, capr;
} tree_refs;

static lk_status collect_refs(lk_layer *l, tree_refs *r) {
    for (int i = 0; i < l->params.n; i++) {
        lk_tensor *t = l->params.items[i].tensor;
        bool seen = false;
        for (int j = 0; j < r->np && !seen; j++) seen = r->p[j] == t;
        if (seen) continue;
        if (r->np == r->capp) LK_TRY(lk_vec_reserve(r->p, r->capp, r->np + 1, 8));
        r->p[r->np++] = t;
    }
    if (l->rng) {
        if (r->nr == r->capr) LK_TRY(lk_vec_reserve(r->rng, r->capr, r->nr + 1, 4));
        r->rng[r->nr++] = l->rng;
    }
    for (int c = 0; c < l->n_children; c++) LK_TRY(collect_refs(l->children[c].layer, r));
    return LK_STATUS_OK;
}

/* What a checkpoint node keeps: the layer, the autocast dtype of the first
 * run and where the tree's random streams stood before it. */
typedef struct {
    lk_layer *l;
    lk_dtype autocast;
    int nr;
    lk_rng **rng;
    lk_rng *before;
} ckpt_state;

static void ckpt_destroy(void *p) {
    ckpt_state *c = p;
    lk_free(c->rng);
    lk_free(c->before);
    lk_free(c);
}

static lk_tensor *ckpt_forward(lk_function_ctx *ctx, int n, lk_tensor *const *in) {
    (void)n;
    ckpt_state *c = lk_function_state(ctx);
    if (lk_function_save(ctx, in[0])) return NULL; /* the input: all the forward keeps */
    return c->l->forward(c->l, in[0]);
}

static void swap_rngs(ckpt_state *c) {
    for (int i = 0; i < c->nr; i++) {
        lk_rng t = *c->rng[i];
        *c->rng[i] = c->before[i];
        c->before[i] = t;
    }
}

static lk_status ckpt_backward(lk_function_ctx *ctx, lk_tensor *g, lk_tensor **grad_in) {
    ckpt_state *c = lk_function_state(ctx);
    lk_tensor *x = lk_detach(lk_function_saved(ctx, 0));
    if (!x) return lk_last_status();
    lk_tensor_set_requires_grad(x, lk_function_needs_grad(ctx, 0));
    /* The recompute: the first run's autocast dtype and random streams, grad
     * mode on; the streams are put back after it (they are where the first
     * run left them for whatever comes next). */
    swap_rngs(c);
    recomputing++;
    lk_autocast_enter(c->autocast);
    bool prev = lk_set_grad_enabled(true);
    lk_status st = fire(c->l, LK_LAYER_BEFORE_FORWARD);
    lk_tensor *y = st ? NULL : c->l->forward(c->l, x);
    lk_set_grad_enabled(prev);
    lk_autocast_exit();
    recomputing--;
    swap_rngs(c);
    if (!st && !y) st = lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INTERNAL, "checkpoint: the recompute of %s failed", c->l->type);
    /* the recomputed graph, differentiated at once: the parameters'
     * gradients go straight into them, the input's comes back */
    if (!st && y->grad_fn) st = lk_backward_with(y, g);
    /* a layer whose forward returns its input (an identity: a ReLU fused
     * into the batch norm before it) passes the gradient through; x has
     * none of its own then */
    if (!st && lk_function_needs_grad(ctx, 0)) grad_in[0] = y == x ? g : x->grad;
    return st;
}

static const lk_function ckpt_fn = {"checkpoint", ckpt_forward, ckpt_backward, ckpt_destroy};

static lk_tensor *checkpointed(lk_layer *l, lk_tensor *x) {
    tree_refs r = {0};
    ckpt_state *c = lk_calloc(1, sizeof *c);
    lk_status st = c ? collect_refs(l, &r) : LK_STATUS_OUT_OF_MEMORY;
    lk_tensor **in = st ? NULL : lk_malloc((size_t)(r.np + 1) * sizeof *in);
    if (!st && !in) st = LK_STATUS_OUT_OF_MEMORY;
    if (!st && r.nr && !(c->before = lk_malloc((size_t)r.nr * sizeof *c->before))) st = LK_STATUS_OUT_OF_MEMORY;
    if (st) {
        lk_free(r.p);
        lk_free(r.rng);
        lk_free(in);
        lk_free(c);
        return NULL;
    }
    c->l = l;
    c->autocast = lk_autocast_dtype();
    c->nr = r.nr;
    c->rng = r.rng;
    for (int i = 0; i < r.nr; i++) c->before[i] = *r.rng[i];
    /* the parameters are inputs, so the pass fires their grad hooks after
     * this node (a nested backward fires none) */
    in[0] = x;
    for (int i = 0; i < r.np; i++) in[i + 1] = r.p[i];
    lk_tensor *y = lk_function_apply(&ckpt_fn, r.np + 1, in, c);
    lk_free(in);
    lk_free(r.p);
    return y;
}

/* The layer's backward hooks hang on two pass-through functions: one on
 * its output (runs first in the backward: BEFORE_BACKWARD), one on its
 * input that also takes its parameters (recorded before the layer's ops,
 * so it runs after all of them: AFTER_BACKWARD). */
static lk_tensor *pass_forward(lk_function_ctx *ctx, int n, lk_tensor *const *in) {
    (void)ctx;
    (void)n;
    return in[0];
}
static lk_status pass_backward(lk_function_ctx *ctx, lk_tensor *g, lk_tensor **grad_in, lk_layer_hook_when when) {
    LK_TRY(fire(lk_function_state(ctx), when));
    grad_in[0] = g;
    return LK_STATUS_OK;
}
static lk_status before_bw(lk_function_ctx *ctx, lk_tensor *g, lk_tensor **grad_in) {
    return pass_backward(ctx, g, grad_in, LK_LAYER_BEFORE_BACKWARD);
}
static lk_status after_bw(lk_function_ctx *ctx, lk_tensor *g, lk_tensor **grad_in) {
    return pass_backward(ctx, g, grad_in, LK_LAYER_AFTER_BACKWARD);
}
static const lk_function before_bw_fn = {"layer_before_backward", pass_forward, before_bw, NULL};
static const lk_function after_bw_fn = {"layer_after_backward", pass_forward, after_bw, NULL};

static lk_tensor *after_backward_boundary(lk_layer *l, lk_tensor *x) {
    tree_refs r = {0};
    if (collect_refs(l, &r)) return NULL;
    lk_free(r.rng);
    lk_tensor **in = lk_malloc((size_t)(r.np + 1) * sizeof *in);
    lk_tensor *y = NULL;
    if (in) {
        in[0] = x;
        for (int i = 0; i < r.np; i++) in[i + 1] = r.p[i];
        y = lk_function_apply(&after_bw_fn, r.np + 1, in, l);
    }
    lk_free(in);
    lk_free(r.p);
    return y;
}

lk_tensor *lk_layer_forward(lk_layer *l, lk_tensor *x) {
    if (!l || !x) {
        if (!lk_last_status()) lk_error(LK_STATUS_INVALID_ARGUMENT, "layer_forward: NULL %s", l ? "input" : "layer");
        return NULL;
    }
    if (!l->forward) {
        lk_error(LK_STATUS_INVALID_USAGE, "layer_forward: %s has no forward function", l->type);
        return NULL;
    }
    if (!l->hooks && !l->checkpoint) return l->forward(l, x);
    const bool *has = l->hooks ? l->hooks->has : (const bool[4]){false, false, false, false};
    if (has[LK_LAYER_BEFORE_FORWARD] && fire(l, LK_LAYER_BEFORE_FORWARD)) return NULL;
    bool grad = lk_grad_enabled();
    bool boundary = grad && has[LK_LAYER_AFTER_BACKWARD] && (x->requires_grad || !l->hooks->after_backward_optional);
    if (boundary && !(x = after_backward_boundary(l, x))) return NULL;
    lk_tensor *y = l->checkpoint && grad ? checkpointed(l, x) : l->forward(l, x);
    if (y && grad && has[LK_LAYER_BEFORE_BACKWARD] && y->requires_grad)
        y = lk_function_apply(&before_bw_fn, 1, &y, l);
    if (y && has[LK_LAYER_AFTER_FORWARD] && fire(l, LK_LAYER_AFTER_FORWARD)) return NULL;
    return y;
}

static void checkpoint_rec(lk_layer *l, const char *const *types, int n, int *count) {
    for (int i = 0; i < n; i++)
        if (!strcmp(l->type, types[i])) {
            l->checkpoint = true;
            (*count)++;
            return; /* the layers under it are recomputed with it */
        }
    for (int c = 0; c < l->n_children; c++) checkpoint_rec(l->children[c].layer, types, n, count);
}

/* Checkpoints the layers marked checkpoint_unit (not below one that is). */
static int mark_units(lk_layer *l) {
    if (l->checkpoint_unit) {
        l->checkpoint = true;
        return 1;
    }
    int n = 0;
    for (int c = 0; c < l->n_children; c++) n += mark_units(l->children[c].layer);
    return n;
}

void lk_layer_checkpoint_clear(lk_layer *l) {
    if (!l) return;
    l->checkpoint = false;
    for (int c = 0; c < l->n_children; c++) lk_layer_checkpoint_clear(l->children[c].layer);
}

int lk_layer_checkpoint_policy(lk_layer *l, const char *const *types, int n) {
    if (!l || (n > 0 && !types)) {
        lk_error(LK_STATUS_INVALID_ARGUMENT, "layer_checkpoint_policy: NULL %s", l ? "type list" : "layer");
        return 0;
    }
    int count = 0;
    if (n > 0) {
        checkpoint_rec(l, types, n, &count);
        return count;
    }
    if ((count = mark_units(l)) > 0) return count;
    while (l->n_children == 1) l = l->children[0].layer;
    for (int c = 0; c < l->n_children; c++, count++) l->children[c].layer->checkpoint = true;
    return count;
}

void lk_layer_train(lk_layer *l, bool training) {
    if (!l) return;
    l->training = training;
    for (int i = 0; i < l->n_children; i++) lk_layer_train(l->children[i].layer, training);
}

/* Custom autograd functions (lk_function, torch.autograd.Function's shape):
 * the forward runs with grad mode off inside a scope of its own, one node
 * is recorded for its output with the function's context (state, saved
 * tensors, which inputs need a gradient) in the node's extra block, and the
 * node's backward calls the function's backward inside a scope and
 * accumulates the gradients it returns into the inputs. Also lk_detach. */
#include <string.h>

#include "autograd/autograd_impl.h"

struct lk_function_ctx {
    const lk_function *fn;
    void *state;
    lk_tensor **saved;
    int n_saved, cap_saved;
    int n_in;
    bool needs[]; /* n_in flags */
};

static void ctx_clear(lk_function_ctx *c) {
    for (int i = 0; i < c->n_saved; i++) lk_tensor_release(c->saved[i]);
    lk_free(c->saved);
    c->saved = NULL;
    c->n_saved = c->cap_saved = 0;
    if (c->fn->destroy && c->state) c->fn->destroy(c->state);
    c->state = NULL;
}

static void node_ctx_release(lk_node *n) { ctx_clear(n->extra); } /* the node lk_free's the block itself */

lk_status lk_function_save(lk_function_ctx *ctx, lk_tensor *t) {
    if (!ctx || !t) return lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_ARGUMENT, "function_save: NULL argument");
    if (ctx->n_saved == ctx->cap_saved) LK_TRY(lk_vec_reserve(ctx->saved, ctx->cap_saved, ctx->n_saved + 1, 4));
    ctx->saved[ctx->n_saved++] = lk_tensor_retain(t);
    return LK_STATUS_OK;
}

lk_tensor *lk_function_saved(const lk_function_ctx *ctx, int i) {
    return ctx && i >= 0 && i < ctx->n_saved ? ctx->saved[i] : NULL;
}

void *lk_function_state(const lk_function_ctx *ctx) { return ctx ? ctx->state : NULL; }

bool lk_function_needs_grad(const lk_function_ctx *ctx, int i) { return ctx && i >= 0 && i < ctx->n_in && ctx->needs[i]; }

static void function_backward(lk_node *n, lk_tensor *g) {
    lk_function_ctx *c = n->extra;
    const char *name = c->fn->name ? c->fn->name : "function";
    lk_tensor *inline_gin[8] = {0}, **gin = inline_gin;
    if (c->n_in > 8 && !(gin = lk_calloc((size_t)c->n_in, sizeof *gin))) return;
    lk_scope_begin(); /* what the backward builds, its results included, goes at its end */
    lk_status st = c->fn->backward(c, g, gin);
    if (st && !lk_last_status()) lk_error(st, "%s: backward failed", name);
    for (int i = 0; !st && i < c->n_in; i++) {
        if (!gin[i] || !c->needs[i]) continue;
        lk_tensor *x = n->in[i];
        if (!lk_tensor_same_shape(gin[i], x)) {
            lk__error_shapes(name, "backward's gradient for an input has another shape than the input", gin[i], x);
            break;
        }
        /* A gradient handed through unchanged (a pass-through: the layers'
         * hook nodes, an identity) that only this node holds moves on
         * instead of being copied: the next node adopts it. */
        if (gin[i] == g && n->grad == g && g->refcount == 1) {
            n->grad = NULL;
            if (lk__accum_move(x, g)) break;
            continue;
        }
        if (lk__accum(x, gin[i])) break;
    }
    lk_scope_end();
    if (gin != inline_gin) lk_free(gin);
}

lk_tensor *lk_function_apply(const lk_function *fn, int n_in, lk_tensor *const *in, void *state) {
    const char *name = fn && fn->name ? fn->name : "function";
    lk_status st = LK_STATUS_OK;
    if (!fn || !fn->forward || !fn->backward || n_in < 0 || (n_in > 0 && !in))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "function_apply (%s): needs a function with forward and backward and "
                      "its %d inputs", name, n_in);
    for (int i = 0; !st && i < n_in; i++)
        if (!in[i]) st = lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: input %d is NULL", name, i);
    if (!st && n_in > 0 && lk__same_device(name, n_in, in)) st = lk_last_status();
    lk_function_ctx *c = st ? NULL : lk_calloc(1, sizeof *c + (size_t)n_in * sizeof(bool));
    if (!st && !c) st = LK_STATUS_OUT_OF_MEMORY;
    if (st) {
        if (fn && fn->destroy && state) fn->destroy(state);
        return NULL;
    }
    c->fn = fn;
    c->state = state;
    c->n_in = n_in;
    bool rec = lk__needs_grad(n_in, in);
    for (int i = 0; i < n_in; i++) c->needs[i] = rec && in[i]->requires_grad;

    bool prev = lk_set_grad_enabled(false);
    lk_scope_begin(); /* the forward's temporaries go when it returns */
    lk_tensor *out = fn->forward(c, n_in, in);
    lk_tensor *keep = out ? lk_tensor_retain(out) : NULL;
    lk_scope_end();
    lk_set_grad_enabled(prev);
    if (!keep && !lk_last_status()) lk_error(LK_STATUS_INVALID_USAGE, "%s: forward returned no tensor", name);
    /* The node's output must be a tensor of its own: an input handed back
     * (identity), or a tensor with a graph or a gradient of its own, gets
     * a view over the same memory. */
    bool own = keep && !keep->grad_fn && !keep->requires_grad;
    for (int i = 0; own && i < n_in; i++) own = keep != in[i];
    if (keep && rec && !own) {
        lk_tensor *v = lk__tensor_view(keep, keep->ndim, keep->shape, keep->stride, keep->offset);
        lk_tensor_release(keep);
        keep = v;
    }
    if (!keep || !rec) {
        ctx_clear(c);
        lk_free(c);
        return keep ? lk__op_result(keep) : NULL;
    }
    lk_node *n = lk__record(name, function_backward, keep, n_in, in);
    if (!n) {
        ctx_clear(c);
        lk_free(c);
        lk_tensor_release(keep);
        return NULL;
    }
    n->extra = c;
    n->release = node_ctx_release;
    return lk__op_result(keep);
}

lk_tensor *lk_detach(lk_tensor *t) {
    LK_OP_CHECK_INPUTS(t);
    return lk__op_result(lk__tensor_view(t, t->ndim, t->shape, t->stride, t->offset));
}

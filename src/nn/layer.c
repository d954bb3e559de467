/* The generic layer machinery: named tensor lists, layer lifetime and
 * registration, PyTorch-ordered dotted names for parameters, buffers and
 * state dicts, strict state-dict loading that reports every mismatch at once,
 * parameter re-initialisation keyed by parameter index, and flattening of
 * parameters and gradients into single contiguous buffers (the memory layout
 * the fused optimizers and DDP's gradient buckets rely on). The forward, its
 * hooks and activation checkpointing are layer_forward.c. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "lockstep/nn.h"
#include "tensor/tensor_impl.h"

/* ---- named tensor lists ------------------------------------------------------- */

lk_status lk_named_tensors_append(lk_named_tensors *l, const char *name, lk_tensor *t) {
    if (!l || !name || !t) return lk_error(LK_STATUS_INVALID_ARGUMENT, "named_tensors_append: NULL argument");
    if (l->n == l->cap) LK_TRY(lk_vec_reserve(l->items, l->cap, l->n + 1, 16));
    char *nm = lk_strdup(name);
    if (!nm) return LK_STATUS_OUT_OF_MEMORY;
    l->items[l->n].name = nm;
    l->items[l->n].tensor = lk_tensor_retain(t);
    l->n++;
    return LK_STATUS_OK;
}

lk_tensor *lk_named_tensors_find(const lk_named_tensors *l, const char *name) {
    if (!l || !name) return NULL;
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].name, name)) return l->items[i].tensor;
    return NULL;
}

void lk_named_tensors_clear(lk_named_tensors *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) {
        lk_free(l->items[i].name);
        lk_tensor_release(l->items[i].tensor);
    }
    lk_free(l->items);
    l->items = NULL;
    l->n = l->cap = 0;
}

/* ---- lifetime and registration -------------------------------------------------- */

static void free_impl(lk_layer_destroy_fn destroy, lk_layer *tmp, void *impl) {
    if (destroy) {
        tmp->impl = impl;
        destroy(tmp);
    } else {
        lk_free(impl);
    }
}

lk_layer *lk_layer_create(const char *type, lk_layer_forward_fn forward, void *impl, lk_layer_destroy_fn destroy) {
    lk_layer *l = lk_calloc(1, sizeof *l);
    if (!l) {
        lk_layer tmp = {0};
        free_impl(destroy, &tmp, impl);
        return NULL;
    }
    l->type = type ? type : "Layer";
    l->forward = forward;
    l->destroy = destroy;
    l->impl = impl;
    l->training = true;
    return l;
}

void lk_layer_free(lk_layer *l) {
    if (!l) return;
    for (int i = 0; i < l->n_children; i++) {
        if (!l->children[i].borrowed) lk_layer_free(l->children[i].layer);
        lk_free(l->children[i].name);
    }
    lk_free(l->children);
    lk_named_tensors_clear(&l->params);
    lk_named_tensors_clear(&l->buffers);
    lk_layer_clear_hooks(l);
    free_impl(l->destroy, l, l->impl);
    lk_free(l);
}

/* PyTorch rejects "" and names containing "."; so do we (they would break
 * the dotted paths). */
static lk_status check_name(const lk_layer *l, const char *what, const char *name) {
    if (!name || !*name || strchr(name, '.'))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s '%s' of %s: a name must be non-empty and contain no '.'", what,
                        name ? name : "(null)", l->type);
    if (lk_named_tensors_find(&l->params, name) || lk_named_tensors_find(&l->buffers, name))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s '%s' of %s: the name is already taken", what, name, l->type);
    for (int i = 0; i < l->n_children; i++)
        if (!strcmp(l->children[i].name, name))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s '%s' of %s: the name is already taken by a child", what,
                            name, l->type);
    return LK_STATUS_OK;
}

static lk_status add_tensor(lk_layer *l, lk_named_tensors *list, const char *what, const char *name, lk_tensor *t) {
    if (!t) return lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_ARGUMENT, "%s '%s': NULL tensor", what, name);
    lk_status st = l ? check_name(l, what, name) : lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: NULL layer", what);
    if (!st) st = lk_named_tensors_append(list, name, t);
    lk_tensor_release(t); /* the list holds its own reference now */
    return st;
}

lk_status lk_layer_add_parameter(lk_layer *l, const char *name, lk_tensor *t) {
    if (t) lk_tensor_set_requires_grad(t, true);
    return add_tensor(l, l ? &l->params : NULL, "parameter", name, t);
}

lk_status lk_layer_add_buffer(lk_layer *l, const char *name, lk_tensor *t) {
    return add_tensor(l, l ? &l->buffers : NULL, "buffer", name, t);
}

lk_status lk_layer_add_child(lk_layer *l, const char *name, lk_layer *child) {
    if (!child) return lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_ARGUMENT, "child '%s': NULL layer", name);
    lk_status st = l ? check_name(l, "child", name) : lk_error(LK_STATUS_INVALID_ARGUMENT, "add_child: NULL layer");
    if (!st && l->n_children == l->cap_children)
        st = lk_vec_reserve(l->children, l->cap_children, l->n_children + 1, 4);
    char *nm = st ? NULL : lk_strdup(name);
    if (!st && !nm) st = LK_STATUS_OUT_OF_MEMORY;
    if (st) {
        lk_layer_free(child);
        return st;
    }
    l->children[l->n_children] = (lk_named_layer){nm, child, false};
    l->n_children++;
    return LK_STATUS_OK;
}

lk_status lk_layer_add_child_ref(lk_layer *l, const char *name, lk_layer *child) {
    if (!child) return lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_ARGUMENT, "child '%s': NULL layer", name);
    lk_status st = l ? check_name(l, "child", name) : lk_error(LK_STATUS_INVALID_ARGUMENT, "add_child_ref: NULL layer");
    if (!st && l->n_children == l->cap_children)
        st = lk_vec_reserve(l->children, l->cap_children, l->n_children + 1, 4);
    char *nm = st ? NULL : lk_strdup(name);
    if (!st && !nm) st = LK_STATUS_OUT_OF_MEMORY;
    if (st) return st;
    l->children[l->n_children] = (lk_named_layer){nm, child, true};
    l->n_children++;
    return LK_STATUS_OK;
}

lk_status lk_layer_tie_parameter(lk_layer *l, const char *name, lk_tensor *t) {
    if (!l || !name || !t) return lk_error(LK_STATUS_INVALID_ARGUMENT, "tie_parameter: NULL %s", !l ? "layer" : !name ? "name" : "tensor");
    for (int i = 0; i < l->params.n; i++) {
        lk_named_tensor *p = &l->params.items[i];
        if (strcmp(p->name, name)) continue;
        char s1[128], s2[128];
        if (!lk_tensor_same_shape(p->tensor, t) || p->tensor->dtype != t->dtype)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "tie_parameter: %s.%s is %s %s, the tensor tied to it %s %s",
                            l->type, name, lk_dtype_name(p->tensor->dtype), lk_shape_str(p->tensor, s1, sizeof s1),
                            lk_dtype_name(t->dtype), lk_shape_str(t, s2, sizeof s2));
        lk_tensor *old = p->tensor;
        p->tensor = lk_tensor_retain(t);
        lk_tensor_set_requires_grad(t, true);
        lk_tensor_release(old);
        return LK_STATUS_OK;
    }
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "tie_parameter: %s has no parameter '%s'", l->type, name);
}

lk_tensor *lk_layer_param(const lk_layer *l, int i) {
    return l && i >= 0 && i < l->params.n ? l->params.items[i].tensor : NULL;
}
lk_tensor *lk_layer_buffer(const lk_layer *l, int i) {
    return l && i >= 0 && i < l->buffers.n ? l->buffers.items[i].tensor : NULL;
}
lk_layer *lk_layer_child(const lk_layer *l, int i) {
    return l && i >= 0 && i < l->n_children ? l->children[i].layer : NULL;
}

/* Follows "a.b.c" through children; *rest points at the last component. */
static const lk_layer *walk_path(const lk_layer *l, const char *path, const char **rest) {
    while (l) {
        const char *dot = strchr(path, '.');
        if (!dot) {
            *rest = path;
            return l;
        }
        const lk_layer *next = NULL;
        for (int i = 0; i < l->n_children && !next; i++)
            if (strlen(l->children[i].name) == (size_t)(dot - path) &&
                !strncmp(l->children[i].name, path, (size_t)(dot - path)))
                next = l->children[i].layer;
        l = next;
        path = dot + 1;
    }
    return NULL;
}

lk_tensor *lk_layer_get_tensor(const lk_layer *l, const char *dotted_name) {
    const char *last;
    if (!l || !dotted_name) return NULL;
    const lk_layer *o = walk_path(l, dotted_name, &last);
    if (!o) return NULL;
    lk_tensor *t = lk_named_tensors_find(&o->params, last);
    return t ? t : lk_named_tensors_find(&o->buffers, last);
}

lk_layer *lk_layer_get_child(const lk_layer *l, const char *dotted_name) {
    const char *last;
    if (!l || !dotted_name) return NULL;
    const lk_layer *o = walk_path(l, dotted_name, &last);
    if (!o) return NULL;
    for (int i = 0; i < o->n_children; i++)
        if (!strcmp(o->children[i].name, last)) return o->children[i].layer;
    return NULL;
}

/* ---- named traversal --------------------------------------------------------------- */

enum { WALK_PARAMS = 1, WALK_BUFFERS = 2 };

static bool contains_tensor(const lk_named_tensors *out, const lk_tensor *t) {
    for (int i = 0; i < out->n; i++)
        if (out->items[i].tensor == t) return true;
    return false;
}

static lk_status walk_named(const lk_layer *l, const char *prefix, int what, bool dedup, lk_named_tensors *out) {
    char name[512];
    for (int pass = 0; pass < 2; pass++) {
        if (!(what & (pass ? WALK_BUFFERS : WALK_PARAMS))) continue;
        const lk_named_tensors *src = pass ? &l->buffers : &l->params;
        for (int i = 0; i < src->n; i++) {
            if (dedup && contains_tensor(out, src->items[i].tensor)) continue;
            int w = snprintf(name, sizeof name, "%s%s", prefix, src->items[i].name);
            if (w < 0 || (size_t)w >= sizeof name)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "parameter name '%s%s' is longer than %zu characters",
                                prefix, src->items[i].name, sizeof name - 1);
            LK_TRY(lk_named_tensors_append(out, name, src->items[i].tensor));
        }
    }
    for (int c = 0; c < l->n_children; c++) {
        int w = snprintf(name, sizeof name, "%s%s.", prefix, l->children[c].name);
        if (w < 0 || (size_t)w >= sizeof name)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "layer path '%s%s' is too long", prefix, l->children[c].name);
        LK_TRY(walk_named(l->children[c].layer, name, what, dedup, out));
    }
    return LK_STATUS_OK;
}

lk_status lk_layer_named_parameters(const lk_layer *l, lk_named_tensors *out) {
    if (!l || !out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "named_parameters: NULL argument");
    return walk_named(l, "", WALK_PARAMS, true, out);
}

lk_status lk_layer_named_buffers(const lk_layer *l, lk_named_tensors *out) {
    if (!l || !out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "named_buffers: NULL argument");
    return walk_named(l, "", WALK_BUFFERS, true, out);
}

lk_status lk_state_dict_get(const lk_layer *l, lk_named_tensors *out) {
    if (!l || !out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "state_dict_get: NULL argument");
    return walk_named(l, "", WALK_PARAMS | WALK_BUFFERS, false, out);
}

int64_t lk_layer_num_parameters(const lk_layer *l) {
    lk_named_tensors ps = {0};
    int64_t n = 0;
    if (lk_layer_named_parameters(l, &ps) == LK_STATUS_OK)
        for (int i = 0; i < ps.n; i++) n += ps.items[i].tensor->numel;
    lk_named_tensors_clear(&ps);
    return n;
}

/* ---- reset, dropout streams, zero_grad ---------------------------------------------- */

static lk_status reset_rec(lk_layer *l, uint64_t seed, int64_t *index, lk_named_tensors *seen) {
    int64_t first = *index;
    for (int i = 0; i < l->params.n; i++)
        if (!contains_tensor(seen, l->params.items[i].tensor)) {
            LK_TRY(lk_named_tensors_append(seen, "p", l->params.items[i].tensor));
            (*index)++;
        }
    /* a layer this process holds nothing of (another pipeline stage's) has
     * nothing to draw into: its stream is its own, keyed by `first` */
    bool holds = !l->params.n && !l->buffers.n;
    for (int i = 0; i < l->params.n && !holds; i++) holds = lk_tensor_has_data(l->params.items[i].tensor);
    for (int i = 0; i < l->buffers.n && !holds; i++) holds = lk_tensor_has_data(l->buffers.items[i].tensor);
    if (l->reset && holds) {
        lk_rng rng;
        lk_rng_init(&rng, seed, LK_RNG_INIT, (uint32_t)first, 0);
        LK_TRY(l->reset(l, &rng));
    }
    for (int c = 0; c < l->n_children; c++) LK_TRY(reset_rec(l->children[c].layer, seed, index, seen));
    return LK_STATUS_OK;
}

lk_status lk_layer_reset_parameters(lk_layer *l, uint64_t seed) {
    if (!l) return lk_error(LK_STATUS_INVALID_ARGUMENT, "reset_parameters: NULL layer");
    lk_named_tensors seen = {0};
    int64_t index = 0;
    lk_status st = reset_rec(l, seed, &index, &seen);
    lk_named_tensors_clear(&seen);
    return st;
}

lk_status lk_layer_materialize_some(lk_layer *l, bool (*keep)(const lk_tensor *t, void *ctx), void *ctx) {
    if (!l) return lk_error(LK_STATUS_INVALID_ARGUMENT, "materialize: NULL layer");
    if (!l->deferred) return LK_STATUS_OK;
    lk_named_tensors all = {0};
    lk_status st = lk_layer_named_parameters(l, &all);
    if (!st) st = lk_layer_named_buffers(l, &all);
    /* the tensors made earlier (another unit's) are hidden while the
     * streams run, so only the ones made now are drawn into (a hidden
     * one's saved storage is never NULL: it held data). The lists hold
     * each tensor once (a tied weight too). */
    lk__hidden *hid = st ? NULL : lk_calloc((size_t)all.n + 1, sizeof *hid);
    if (!st && !hid) st = LK_STATUS_OUT_OF_MEMORY;
    int left = 0, nmade = 0;
    for (int i = 0; !st && i < all.n; i++) {
        lk_tensor *t = all.items[i].tensor;
        if (!lk__tensor_is_deferred(t, NULL)) {
            if (lk_tensor_has_data(t)) lk__tensor_hide(t, &hid[i]);
        } else if (keep && !keep(t, ctx)) {
            left++;
        } else {
            st = lk__tensor_restore_storage(t);
            if (st) st = lk_error(st, "materialize: storage for '%s': %s", all.items[i].name, lk_last_error());
            nmade++;
        }
    }
    if (!st && nmade) st = lk_layer_reset_parameters(l, l->deferred_seed);
    for (int i = 0; hid && i < all.n; i++)
        if (hid[i].storage) lk__tensor_unhide(all.items[i].tensor, &hid[i]);
    lk_free(hid);
    lk_named_tensors_clear(&all);
    if (!st && !left) l->deferred = false;
    return st;
}

lk_status lk_layer_materialize(lk_layer *l) { return lk_layer_materialize_some(l, NULL, NULL); }

void lk_layer_defer_begin(void) { (void)lk__tensor_defer(true); }

lk_status lk_layer_defer_end(lk_layer *root, uint64_t seed) {
    (void)lk__tensor_defer(false);
    if (root) root->deferred = true, root->deferred_seed = seed;
    return LK_STATUS_OK;
}

static void rng_step_rec(lk_layer *l, uint64_t seed, uint32_t rank, uint64_t step, uint32_t *d) {
    if (l->reseed) l->reseed(l, seed, (rank << 16) | (*d & 0xffffu), step), (*d)++;
    for (int c = 0; c < l->n_children; c++) rng_step_rec(l->children[c].layer, seed, rank, step, d);
}

void lk_layer_set_rng_step(lk_layer *l, uint64_t seed, uint32_t rank, uint64_t step) {
    uint32_t d = 0;
    if (l) rng_step_rec(l, seed, rank, step, &d);
}

void lk_layer_zero_grad(lk_layer *l, bool set_to_none) {
    if (!l) return;
    for (int i = 0; i < l->params.n; i++) {
        lk_tensor *p = l->params.items[i].tensor;
        lk_tensor_zero_grad(p, set_to_none && !lk_tensor_in_flat_buffer(p->grad));
    }
    for (int c = 0; c < l->n_children; c++) lk_layer_zero_grad(l->children[c].layer, set_to_none);
}

/* ---- flattening --------------------------------------------------------------------------- */

typedef struct {
    lk_tensor **slot; /* where the layer keeps the parameter */
    const char *name; /* dotted name (borrowed from the names list) */
    int alias;        /* index of the first slot holding the same tensor, or -1 */
} flat_slot;

typedef struct {
    flat_slot *v;
    int n, cap;
} slot_vec;

/* The dtype the flat buffers take: that of the first floating parameter
 * (every parameter after lk_layer_cast_parameters; f32 by default). */
static bool first_float_dtype(const lk_layer *l, lk_dtype *dt) {
    for (int i = 0; i < l->params.n; i++)
        if (lk_dtype_is_float(l->params.items[i].tensor->dtype)) return (*dt = l->params.items[i].tensor->dtype), true;
    for (int c = 0; c < l->n_children; c++)
        if (first_float_dtype(l->children[c].layer, dt)) return true;
    return false;
}

static lk_dtype params_dtype(const lk_layer *l) {
    lk_dtype dt = LK_F32;
    first_float_dtype(l, &dt);
    return dt;
}

static lk_status collect_slots_of(lk_layer *l, lk_dtype dt, slot_vec *sv) {
    for (int i = 0; i < l->params.n; i++) {
        lk_tensor *t = l->params.items[i].tensor;
        if (t->dtype != dt) continue;
        if (sv->n == sv->cap) LK_TRY(lk_vec_reserve(sv->v, sv->cap, sv->n + 1, 32));
        int alias = -1;
        for (int j = 0; j < sv->n && alias < 0; j++)
            if (*sv->v[j].slot == t) alias = j;
        sv->v[sv->n++] = (flat_slot){&l->params.items[i].tensor, NULL, alias};
    }
    for (int c = 0; c < l->n_children; c++) LK_TRY(collect_slots_of(l->children[c].layer, dt, sv));
    return LK_STATUS_OK;
}

lk_status lk_layer_cast_parameters(lk_layer *l, lk_dtype dt) {
    if (!l) return lk_error(LK_STATUS_INVALID_ARGUMENT, "cast_parameters: NULL layer");
    if (dt != LK_F32 && dt != LK_BF16 && dt != LK_F16)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "cast_parameters: dtype %s is not one of f32, bf16, f16", lk_dtype_name(dt));
    lk_dtype from = params_dtype(l);
    if (from == dt) return LK_STATUS_OK;
    slot_vec sv = {0};
    lk_status st = collect_slots_of(l, from, &sv);
    lk_tensor **nv = st ? NULL : lk_calloc((size_t)sv.n + 1, sizeof *nv);
    if (!st && !nv) st = LK_STATUS_OUT_OF_MEMORY;
    /* Every new tensor first, so that a failure leaves the layer as it was. */
    for (int i = 0; !st && i < sv.n; i++) {
        lk_tensor *p = *sv.v[i].slot;
        if (sv.v[i].alias >= 0) continue;
        if (lk_tensor_in_flat_buffer(p))
            st = lk_error(LK_STATUS_INVALID_USAGE, "cast_parameters: parameter %s lives in a flat buffer "
                          "(lk_params_flatten): cast the parameters before flattening them", p->name ? p->name : "?");
        else if (!(nv[i] = lk_tensor_cast(p, dt))) st = lk_last_status();
        else {
            nv[i]->requires_grad = p->requires_grad;
            nv[i]->grad_hook = p->grad_hook;
            nv[i]->grad_hook_ctx = p->grad_hook_ctx;
            if (p->name && lk_tensor_set_name(nv[i], p->name)) st = lk_last_status();
        }
    }
    for (int i = 0; !st && i < sv.n; i++) {
        lk_tensor *old = *sv.v[i].slot;
        *sv.v[i].slot = sv.v[i].alias >= 0 ? lk_tensor_retain(*sv.v[sv.v[i].alias].slot) : nv[i];
        if (sv.v[i].alias < 0) nv[i] = NULL;
        lk_tensor_release(old); /* its gradient goes with it: it had the old dtype */
    }
    for (int i = 0; nv && i < sv.n; i++) lk_tensor_release(nv[i]);
    lk_free(nv);
    lk_free(sv.v);
    return st;
}

lk_status lk_layer_to(lk_layer *l, lk_device dev) {
    if (!l) return lk_error(LK_STATUS_INVALID_ARGUMENT, "layer_to: NULL layer");
    lk_named_tensors ps = {0}, bs = {0};
    lk_status st = lk_layer_named_parameters(l, &ps);
    if (!st) st = lk_layer_named_buffers(l, &bs);
    /* Each tensor keeps its identity (the layer's slots, a user's pointers
     * and tied weights stay valid); only its storage changes device. A
     * parameter in a flat buffer (lk_params_flatten) leaves it: moving a
     * trained module back to the host after a fit is one call. */
    for (int i = 0; !st && i < ps.n; i++) {
        lk_tensor *p = ps.items[i].tensor;
        st = lk__tensor_move_to(p, dev);
        if (!st && p->grad) st = lk__tensor_move_to(p->grad, dev);
    }
    for (int i = 0; !st && i < bs.n; i++) st = lk__tensor_move_to(bs.items[i].tensor, dev);
    lk_named_tensors_clear(&ps);
    lk_named_tensors_clear(&bs);
    return st;
}

lk_status lk_params_flatten(lk_layer *l, lk_tensor *grad_buffer, lk_tensor **flat_params, lk_tensor **flat_grads) {
    return lk_params_flatten_into(l, NULL, true, grad_buffer, flat_params, flat_grads);
}

/* A caller's buffer for flatten: the parameters' dtype, contiguous and
 * LK_ALIGN-aligned (the flat views and the optimizers' loops assume all
 * three). */
static lk_status check_flat_buffer(const lk_tensor *b, lk_dtype dt, const char *what) {
    if (!b) return LK_STATUS_OK;
    if (b->dtype != dt || !lk_tensor_is_contiguous(b))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "params_flatten: the %s buffer must be a contiguous %s tensor (the "
                        "parameters' dtype), got %s%s", what, lk_dtype_name(dt), lk_dtype_name(b->dtype),
                        lk_tensor_is_contiguous(b) ? "" : " (not contiguous)");
    if (((uintptr_t)b->data % LK_ALIGN) != 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "params_flatten: the %s buffer %p is not %d-byte aligned", what,
                        b->data, LK_ALIGN);
    return LK_STATUS_OK;
}

lk_status lk_params_flatten_into(lk_layer *l, lk_tensor *param_buffer, bool copy_values, lk_tensor *grad_buffer,
                                 lk_tensor **flat_params, lk_tensor **flat_grads) {
    if (flat_params) *flat_params = NULL;
    if (flat_grads) *flat_grads = NULL;
    if (!l) return lk_error(LK_STATUS_INVALID_ARGUMENT, "params_flatten: NULL layer");
    lk_dtype dt = params_dtype(l);
    LK_TRY(check_flat_buffer(grad_buffer, dt, "gradient"));
    LK_TRY(check_flat_buffer(param_buffer, dt, "parameter"));
    if (!param_buffer) copy_values = true;
    slot_vec sv = {0};
    lk_named_tensors names = {0};
    lk_tensor **pv = NULL, **gv = NULL, *flat = NULL, *gflat = NULL;
    lk_status st = collect_slots_of(l, dt, &sv);
    if (!st) st = lk_layer_named_parameters(l, &names);
    int64_t total = 0;
    if (!st) {
        /* named_parameters dedups like collect_slots and walks in the same
         * order, so the k-th unique slot is the k-th name. */
        int k = 0;
        for (int i = 0; i < sv.n; i++) {
            if (sv.v[i].alias >= 0) continue;
            while (k < names.n && names.items[k].tensor != *sv.v[i].slot) k++;
            sv.v[i].name = k < names.n ? names.items[k].name : "?";
            total += (*sv.v[i].slot)->numel;
        }
        pv = lk_calloc((size_t)sv.n + 1, sizeof *pv);
        gv = lk_calloc((size_t)sv.n + 1, sizeof *gv);
        if (!pv || !gv) st = LK_STATUS_OUT_OF_MEMORY;
        for (int b = 0; b < 2 && !st; b++) {
            const lk_tensor *buf = b ? grad_buffer : param_buffer;
            if (buf && buf->numel < total)
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "params_flatten: the %s buffer holds %lld elements, the parameters %lld",
                              b ? "gradient" : "parameter", (long long)buf->numel, (long long)total);
        }
    }
    int64_t n1[1] = {total};
    /* The buffers live where the parameters do (the module was moved to
     * the training device first; lk_layer_to). */
    lk_device dev = sv.n ? (*sv.v[0].slot)->device : lk_device_default();
    if (!st && !(flat = param_buffer ? lk__tensor_wrap_on(param_buffer->device, dt, 1, n1, param_buffer->data)
                                     : lk__tensor_new_on(dev, dt, 1, n1)))
        st = lk_last_status();
    if (!st) {
        gflat = grad_buffer ? lk__tensor_wrap_on(grad_buffer->device, dt, 1, n1, grad_buffer->data)
                            : lk__tensor_new_on(dev, dt, 1, n1);
        if (!gflat) st = lk_last_status();
        else if (total) st = lk_device_memset(gflat->device, gflat->data, 0, (size_t)total * lk_dtype_size(dt));
    }
    /* Make every view before changing anything, so failure leaves the layer as it was. */
    int64_t off = 0;
    for (int i = 0; !st && i < sv.n; i++) {
        if (sv.v[i].alias >= 0) continue;
        lk_tensor *p = *sv.v[i].slot;
        pv[i] = lk_tensor_view_storage(flat, off, p->ndim, p->shape);
        gv[i] = pv[i] ? lk_tensor_view_storage(gflat, off, p->ndim, p->shape) : NULL;
        if (!pv[i] || !gv[i]) st = lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
        else if (lk_tensor_set_name(pv[i], sv.v[i].name)) st = lk_last_status();
        off += p->numel;
    }
    if (!st) {
        for (int i = 0; i < sv.n; i++) {
            lk_tensor *old = *sv.v[i].slot;
            if (sv.v[i].alias >= 0) {
                *sv.v[i].slot = lk_tensor_retain(*sv.v[sv.v[i].alias].slot);
                lk_tensor_release(old);
                continue;
            }
            lk_tensor *p = pv[i];
            if (copy_values) lk_tensor_copy(p, old);
            if (old->grad) lk_tensor_copy(gv[i], old->grad);
            p->requires_grad = old->requires_grad;
            p->grad = gv[i];
            p->grad_hook = old->grad_hook;
            p->grad_hook_ctx = old->grad_hook_ctx;
            gv[i] = NULL;
            pv[i] = NULL;
            *sv.v[i].slot = p;
            lk_tensor_release(old);
        }
        flat->requires_grad = true;
        flat->grad = lk_tensor_retain(gflat);
        lk_tensor_mark_flat_buffer(gflat);
        lk_tensor_mark_flat_buffer(flat);
        if (flat_params) *flat_params = lk_tensor_retain(flat);
        if (flat_grads) *flat_grads = lk_tensor_retain(gflat);
    }
    for (int i = 0; pv && gv && i < sv.n; i++) {
        lk_tensor_release(pv[i]);
        lk_tensor_release(gv[i]);
    }
    lk_free(pv);
    lk_free(gv);
    lk_tensor_release(flat);
    lk_tensor_release(gflat);
    lk_free(sv.v);
    lk_named_tensors_clear(&names);
    return st;
}

/* ---- state dict loading ------------------------------------------------------------------------ */

typedef struct {
    char buf[1900];
    size_t len;
    int count, dropped;
} report;

static void report_add(report *r, const char *fmt, ...) LK_PRINTF(2, 3);
static void report_add(report *r, const char *fmt, ...) {
    r->count++;
    if (r->len >= sizeof r->buf - 64) {
        r->dropped++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(r->buf + r->len, sizeof r->buf - r->len, fmt, ap);
    va_end(ap);
    if (w < 0 || r->len + (size_t)w >= sizeof r->buf - 64) {
        r->buf[r->len] = '\0';
        r->dropped++;
        return;
    }
    r->len += (size_t)w;
}

lk_status lk_state_dict_load(lk_layer *l, const lk_named_tensors *sd, bool strict) {
    if (!l || !sd) return lk_error(LK_STATUS_INVALID_ARGUMENT, "state_dict_load: NULL argument");
    lk_named_tensors own = {0};
    LK_TRY(lk_state_dict_get(l, &own));
    report r = {.len = 0};
    char s1[128], s2[128];
    if (strict) {
        bool first = true;
        for (int i = 0; i < own.n; i++)
            if (!lk_named_tensors_find(sd, own.items[i].name)) {
                report_add(&r, "%s%s %s", first ? "missing: " : ", ", own.items[i].name,
                           lk_shape_str(own.items[i].tensor, s1, sizeof s1));
                first = false;
            }
        if (!first) report_add(&r, "; ");
        first = true;
        for (int i = 0; i < sd->n; i++)
            if (!lk_named_tensors_find(&own, sd->items[i].name)) {
                report_add(&r, "%s%s %s", first ? "unexpected: " : ", ", sd->items[i].name,
                           lk_shape_str(sd->items[i].tensor, s1, sizeof s1));
                first = false;
            }
        if (!first) report_add(&r, "; ");
    }
    bool first = true;
    for (int i = 0; i < own.n; i++) {
        lk_tensor *given = lk_named_tensors_find(sd, own.items[i].name);
        if (given && !lk_tensor_same_shape(given, own.items[i].tensor)) {
            report_add(&r, "%s%s: model %s, given %s", first ? "shape mismatch: " : ", ", own.items[i].name,
                       lk_shape_str(own.items[i].tensor, s1, sizeof s1), lk_shape_str(given, s2, sizeof s2));
            first = false;
        }
    }
    lk_status st = LK_STATUS_OK;
    if (r.count) {
        while (r.len >= 2 && r.buf[r.len - 2] == ';') r.buf[r.len -= 2] = '\0';
        if (r.dropped)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "state_dict_load into %s: %s ... and %d more", l->type, r.buf,
                          r.dropped);
        else
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "state_dict_load into %s: %s", l->type, r.buf);
    }
    for (int i = 0; !st && i < own.n; i++) {
        lk_tensor *given = lk_named_tensors_find(sd, own.items[i].name);
        if (given && given != own.items[i].tensor) st = lk_tensor_copy(own.items[i].tensor, given);
    }
    lk_named_tensors_clear(&own);
    return st;
}

/* The tape and reverse-mode differentiation: grad mode, node recording,
 * lk_backward, gradient accumulation into leaves and their ready hooks, and
 * the argument checks shared by every op. */
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

static _Thread_local bool grad_off; /* default: grad mode on */
enum { AUTOCAST_DEPTH = 16 };
static _Thread_local lk_dtype autocast_stack[AUTOCAST_DEPTH];
static _Thread_local int autocast_n;
static _Thread_local lk_node **tape;
static _Thread_local size_t tape_n, tape_max;
static _Thread_local lk_node *node_free; /* free list through ->extra */
static _Thread_local uint64_t tape_seq;   /* the next node's seq */
/* The nodes of the running backward passes, innermost last (a nested
 * backward pushes its own above its caller's), and the search's stack. */
static _Thread_local lk_node **pass_stack;
static _Thread_local size_t pass_n, pass_max;
static _Thread_local lk_node **dfs;
static _Thread_local size_t dfs_max;
static _Thread_local int pass_depth;      /* backward passes running on this thread */
static _Thread_local uint64_t visit_gen;  /* marks the nodes one collection saw */
/* Op timing (lk_set_op_hook): the hook, and the end of the last op timed. */
static _Thread_local lk_op_hook op_hook;
static _Thread_local void *op_hook_ctx;
static _Thread_local double op_mark;
static _Thread_local const char *op_name; /* set by lk__record, which every op calls with its name */
static _Thread_local bool op_in_backward;  /* ops a backward node runs belong to that node's time */

void lk_set_op_hook(lk_op_hook fn, void *ctx) {
    op_hook = fn;
    op_hook_ctx = ctx;
    op_name = NULL;
    op_mark = fn ? lk_time_now() : 0;
}

void lk_op_hook_mark(void) { op_mark = lk_time_now(); }

bool lk_grad_enabled(void) { return !grad_off; }
bool lk_set_grad_enabled(bool on) {
    bool prev = !grad_off;
    grad_off = !on;
    return prev;
}

size_t lk_tape_len(void) { return tape_n; }

void lk_tensor_set_requires_grad(lk_tensor *t, bool on) { t->requires_grad = on; }

void lk_tensor_zero_grad(lk_tensor *t, bool set_to_none) {
    t->lk__grad_stale = false;
    if (!t->grad) return;
    if (set_to_none) {
        lk_tensor_release(t->grad);
        t->grad = NULL;
    } else {
        lk_tensor_fill(t->grad, 0.0);
    }
}

void lk_tensor_set_grad_hook(lk_tensor *t, lk_grad_hook fn, void *ctx) {
    t->grad_hook = fn;
    t->grad_hook_ctx = ctx;
}

bool lk__needs_grad(int n_in, lk_tensor *const *in) {
    if (grad_off) return false;
    for (int i = 0; i < n_in; i++)
        if (in[i] && in[i]->requires_grad) return true;
    return false;
}

/* ---- the tape -------------------------------------------------------------------
 * Every live node of this thread, in creation order (seq increasing). The
 * tape owns its nodes (a node holds its output, so output and node keep
 * each other alive: the tape breaks the cycle). Several graphs may live on
 * it at once; a node leaves it when
 *   - a backward that reached it is done and no live node consumes its
 *     output any more (consumers == 0): a subgraph two graphs share (the
 *     trunk under two heads) stays until the last of them has run its
 *     backward — each backward runs it once with its own gradient, so each
 *     graph's gradients are what its backward alone would give;
 *   - a scope recorded it and ends (lk_scope_end), backward or not;
 *   - lk_tape_reset drops everything.
 * Parameters are leaves, not nodes: sharing them between graphs keeps
 * nothing alive; each backward accumulates into their .grad.
 * Backward runs the nodes it reaches in decreasing seq, which is the order
 * one tape walked in reverse gave, so results do not depend on what else is
 * alive. */

static void node_release(lk_node *n) {
    if (n->release) n->release(n);
    for (int i = 0; i < n->n_in; i++) {
        lk_node *p = n->in[i]->grad_fn; /* NULL once its producer is gone */
        if (p) p->consumers--;
        lk_tensor_release(n->in[i]);
    }
    for (int i = 0; i < 4; i++) lk_tensor_release(n->saved[i]);
    if (n->out) {
        n->out->grad_fn = NULL;
        lk_tensor_release(n->out);
    }
    lk_tensor_release(n->grad);
    if (n->in != n->in_inline) lk_free(n->in);
    lk_free(n->extra);
    n->backward = NULL; /* dead: tape_compact drops it */
    n->extra = node_free;
    node_free = n;
}

uint64_t lk__tape_mark(void) { return tape_seq; }

void lk__tape_truncate(uint64_t mark) {
    while (tape_n > 0 && tape[tape_n - 1]->seq >= mark) node_release(tape[--tape_n]);
}

/* Drops the released nodes from the tape, keeping the order. */
static void tape_compact(void) {
    size_t k = 0;
    for (size_t i = 0; i < tape_n; i++)
        if (tape[i]->backward) tape[k++] = tape[i];
    tape_n = k;
}

void lk_tape_reset(void) { lk__tape_truncate(0); }

void lk_scope_begin(void) { lk__scope_push(tape_seq); }

void lk_scope_end(void) {
    lk__tape_truncate(lk__scope_top_mark()); /* the part of the tape recorded inside it, first */
    lk__scope_pop();
}

/* The nodes stay: they are older than any scope opened after this one, and
 * the enclosing scope's mark is older still, so its end (or the graph's
 * backward) frees them. */
lk_tensor **lk_scope_end_keep(int *n) { return lk__scope_pop_keep(n); }

void lk_thread_cleanup(void) {
    lk_tape_reset();
    lk_free(tape);
    tape = NULL;
    tape_n = tape_max = 0;
    lk_free(pass_stack);
    pass_stack = NULL;
    pass_n = pass_max = 0;
    lk_free(dfs);
    dfs = NULL;
    dfs_max = 0;
    while (node_free) {
        lk_node *n = node_free;
        node_free = n->extra;
        lk_free(n);
    }
    lk__scope_thread_cleanup();
    lk__cpu_widen_thread_cleanup(); /* the CPU backend's 16-bit scratch */
#ifdef LK_HAVE_DNNL
    lk__dnnl_thread_cleanup(); /* the thread's cached oneDNN primitives */
#endif
}

lk_node *lk__record(const char *name, lk_backward_fn bw, lk_tensor *out, int n_in, lk_tensor *const *in) {
    if (op_hook) op_name = name;
    if (!lk__needs_grad(n_in, in)) return NULL;
    if (tape_n == tape_max && lk_vec_reserve(tape, tape_max, tape_n + 1, 256)) return NULL;
    lk_node *n = node_free;
    if (n) node_free = n->extra;
    else if (!(n = lk_malloc(sizeof *n))) return NULL;
    memset(n, 0, sizeof *n);
    n->name = name;
    n->backward = bw;
    n->n_in = n_in;
    n->in = n->in_inline;
    if (n_in > LK_NODE_INLINE_IN && !(n->in = lk_malloc((size_t)n_in * sizeof *n->in))) {
        n->backward = NULL;
        n->extra = node_free;
        node_free = n;
        return NULL;
    }
    for (int i = 0; i < n_in; i++) {
        n->in[i] = lk_tensor_retain(in[i]);
        if (in[i]->grad_fn) in[i]->grad_fn->consumers++;
    }
    n->out = lk_tensor_retain(out);
    n->seq = tape_seq++;
    out->requires_grad = true;
    out->grad_fn = n;
    tape[tape_n++] = n;
    return n;
}

lk_tensor *lk__op_result(lk_tensor *out) {
    if (op_hook && !op_in_backward) {
        op_hook(op_hook_ctx, op_name ? op_name : "other", false, op_mark, lk_time_now());
        op_name = NULL;
        op_mark = lk_time_now(); /* the hook's own time counts to no op */
    }
    return lk_scope_adopt(out);
}

lk_tensor *lk__contig(lk_tensor *t) {
    if (t->dtype == LK_F32 && lk_tensor_is_contiguous(t)) return lk_tensor_retain(t);
    return lk_tensor_cast(t, LK_F32);
}

lk_tensor *lk__contig_keep(lk_tensor *t) {
    return lk_tensor_is_contiguous(t) ? lk_tensor_retain(t) : lk_tensor_clone(t);
}

/* Whether tensors on a and b may meet in one op: the same device, or memory
 * the CPU addresses on both sides, which is one memory to the CPU kernels
 * (the loader's batch, a strategy's flat buffers, a host-addressable
 * device's tensors mix freely). */
static bool one_memory(lk_device a, lk_device b) {
    return lk_device_equal(a, b) || (lk_device_is_host(a) && lk_device_is_host(b));
}

lk_status lk__same_device(const char *op, int n, lk_tensor *const *t) {
    int first = -1;
    for (int i = 0; i < n; i++) {
        if (!t[i]) continue;
        LK_TRY(lk__tensor_check_data(t[i], op)); /* a tensor whose storage was given back: named, not read */
        if (first < 0) {
            first = i;
            continue;
        }
        if (one_memory(t[first]->device, t[i]->device)) continue;
        char a[32], b[32];
        lk_device_str(t[first]->device, a, sizeof a);
        lk_device_str(t[i]->device, b, sizeof b);
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: expected all tensors on one device, but argument %d is on %s and argument %d on %s "
                        "(an op runs on its inputs' device: move one with lk_tensor_to)",
                        op, first, a, i, b);
    }
    return LK_STATUS_OK;
}

lk_status lk__check_float(const char *op, const lk_tensor *t, const char *arg) {
    if (t->dtype != LK_F32 && t->dtype != LK_BF16 && t->dtype != LK_F16)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: %s has dtype %s; this op supports f32, bf16 and f16 (cast with lk_tensor_cast)",
                        op, arg, lk_dtype_name(t->dtype));
    return LK_STATUS_OK;
}

lk_status lk__check_f32(const char *op, const lk_tensor *t, const char *arg) {
    if (t->dtype != LK_F32)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: %s has dtype %s; this op supports f32 only (cast with lk_tensor_cast)",
                        op, arg, lk_dtype_name(t->dtype));
    return LK_STATUS_OK;
}

lk_status lk__error_shapes(const char *op, const char *what, const lk_tensor *a, const lk_tensor *b) {
    char sa[128], sb[128];
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s: shapes %s and %s", op, what, lk_shape_str(a, sa, sizeof sa),
                    lk_shape_str(b, sb, sizeof sb));
}

int lk__norm_dim(int dim, int ndim) {
    if (dim < 0) dim += ndim;
    return (dim < 0 || dim >= (ndim ? ndim : 1)) ? -1 : dim;
}

lk_status lk__broadcast_shape(const char *op, const lk_tensor *a, const lk_tensor *b, int *ndim, int64_t *shape) {
    int n = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n; i++) {
        int ia = a->ndim - n + i, ib = b->ndim - n + i;
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) return lk__error_shapes(op, "cannot broadcast", a, b);
        shape[i] = da == 1 ? db : da;
    }
    *ndim = n;
    return LK_STATUS_OK;
}

/* Sums over the leading extra dims and the dims where `shape` has 1. */
lk_tensor *lk__reduce_to_shape(lk_tensor *g, int ndim, const int64_t *shape) {
    bool same = g->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = g->shape[i] == shape[i];
    if (same) return lk_tensor_retain(g);
    lk_tensor *r = lk__tensor_zeros_on(g->device, LK_F32, ndim, shape);
    if (!r) return NULL;
    /* Strides of r seen from g's shape: 0 where r broadcasts. */
    int64_t rs[LK_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++) {
        int ir = ndim - g->ndim + i;
        rs[i] = (ir >= 0 && shape[ir] != 1) ? r->stride[ir] : 0;
    }
    /* A 16-bit g is summed into f32 (lk__accum rounds the sum once). */
    lk_op_desc d = {.op = LK_OP_SUM_TO, .dtype = {g->dtype, LK_F32}};
    d.sum_to.ndim = g->ndim;
    for (int i = 0; i < g->ndim; i++) d.sum_to.shape[i] = g->shape[i], d.sum_to.sd[i] = rs[i];
    if (lk__backend_run(g->device, &d, (void *[]){g->data, r->data})) {
        lk_tensor_release(r);
        return NULL;
    }
    return r;
}

static lk_status add_into(lk_tensor **slot, lk_tensor *g, bool persistent, bool overwrite) {
    if (*slot && overwrite) return lk_tensor_copy(*slot, g); /* (any strides, g's dtype rounded to the slot's) */
    if (!*slot) {
        /* Take g itself when nobody else can see its storage. */
        if (!persistent && g->refcount == 1 && lk_tensor_is_contiguous(g)) {
            *slot = lk_tensor_retain(g);
            return LK_STATUS_OK;
        }
        *slot = lk_tensor_clone(g);
        return *slot ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    }
    lk_tensor *d = *slot;
    if (!one_memory(d->device, g->device)) {
        /* a gradient kept from before its tensor moved */
        char a[32], b[32];
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "backward: a gradient on %s cannot be added to the one already held on %s (zero the "
                        "gradients after moving the parameters)",
                        lk_device_str(g->device, a, sizeof a), lk_device_str(d->device, b, sizeof b));
    }
    if (lk_tensor_is_contiguous(d) && lk_tensor_is_contiguous(g)) {
        if (d->dtype == LK_F32 && g->dtype == LK_F32) return lk__axpy_f32(d->device, d->numel, 1.0f, g->data, d->data);
        lk_op_desc ad = {.op = LK_OP_AXPY, .dtype = {g->dtype, d->dtype}}; /* a 16-bit grad: widen, add, round once */
        ad.axpy = (lk_axpy_params){d->numel, 1.0f};
        return lk__backend_run(d->device, &ad, (void *[]){g->data, d->data});
    }
    if (d->dtype != LK_F32 || g->dtype != LK_F32)
        return lk_error(LK_STATUS_UNSUPPORTED, "backward: accumulating a %s gradient into a strided %s gradient",
                        lk_dtype_name(g->dtype), lk_dtype_name(d->dtype));
    /* a strided view on either side: LK_OP_COPY's accumulating form, same
     * element order (row-major over the shape) as a per-element walk */
    lk_op_desc cd = {.op = LK_OP_COPY, .dtype = {LK_F32, LK_F32}};
    cd.copy.ndim = d->ndim;
    cd.copy.accumulate = true;
    for (int i = 0; i < d->ndim; i++)
        cd.copy.shape[i] = d->shape[i], cd.copy.ss[i] = g->stride[i], cd.copy.sd[i] = d->stride[i];
    return lk__backend_run(d->device, &cd, (void *[]){g->data, d->data});
}


lk_status lk__accum_move(lk_tensor *t, lk_tensor *g) {
    if (!g) return LK_STATUS_OK;
    if (!t->requires_grad) {
        lk_tensor_release(g);
        return LK_STATUS_OK;
    }
    lk_tensor *r = lk__reduce_to_shape(g, t->ndim, t->shape);
    lk_tensor_release(g); /* r holds g itself when no reduction was needed: then it is ours alone */
    if (!r) return lk_last_status();
    if (r->dtype != t->dtype) { /* the gradient has its tensor's dtype: f32 for master weights, 16-bit for activations */
        lk_tensor *c = lk_tensor_cast(r, t->dtype);
        lk_tensor_release(r);
        if (!c) return lk_last_status();
        r = c;
    }
    bool overwrite = !t->grad_fn && t->lk__grad_stale;
    if (!t->grad_fn) t->lk__grad_stale = false;
    lk_status st = t->grad_fn ? add_into(&t->grad_fn->grad, r, false, false) : add_into(&t->grad, r, true, overwrite);
    lk_tensor_release(r);
    return st;
}

/* The caller keeps its reference, so g is never adopted: always a copy or a sum. */
lk_status lk__accum(lk_tensor *t, lk_tensor *g) { return lk__accum_move(t, lk_tensor_retain(g)); }

static void mark_leaf_uses(lk_node *n, int delta, bool fire) {
    for (int i = 0; i < n->n_in; i++) {
        lk_tensor *t = n->in[i];
        if (!t->requires_grad || t->grad_fn) continue;
        if (!fire) {
            t->lk__pending += delta;
            continue;
        }
        if (--t->lk__pending == 0 && t->grad_hook) t->grad_hook(t, t->grad_hook_ctx);
    }
}

static int by_seq_desc(const void *a, const void *b) {
    uint64_t x = (*(lk_node *const *)a)->seq, y = (*(lk_node *const *)b)->seq;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Pushes every node reachable from root onto pass_stack (from `base` on),
 * sorted by decreasing seq, and marks them as this pass's. The nodes of an
 * enclosing pass are a boundary: a nested backward neither runs nor frees
 * them (a gradient it sends into one is picked up by that pass, if the
 * node is still ahead of it there). */
static lk_status collect(lk_node *root, size_t base) {
    uint64_t gen = ++visit_gen;
    size_t top = 0;
    if (!dfs && !(dfs = lk_malloc((dfs_max = 64) * sizeof *dfs))) return LK_STATUS_OUT_OF_MEMORY;
    dfs[top++] = root;
    root->visit = gen;
    while (top) {
        lk_node *n = dfs[--top];
        if (pass_n == pass_max && lk_vec_reserve(pass_stack, pass_max, pass_n + 1, 256)) return LK_STATUS_OUT_OF_MEMORY;
        pass_stack[pass_n++] = n;
        n->pass = pass_depth;
        for (int i = 0; i < n->n_in; i++) {
            lk_node *p = n->in[i]->grad_fn;
            if (!p || p->visit == gen || p->pass) continue;
            p->visit = gen;
            if (top == dfs_max && lk_vec_reserve(dfs, dfs_max, top + 1, 64)) return LK_STATUS_OUT_OF_MEMORY;
            dfs[top++] = p;
        }
    }
    qsort(pass_stack + base, pass_n - base, sizeof *pass_stack, by_seq_desc);
    return LK_STATUS_OK;
}

/* The end of a pass: the gradients it left on its nodes dropped, and the
 * nodes no live node consumes any more released — consumers before their
 * producers (decreasing seq), so a chain goes at once and a subgraph
 * another graph still consumes stays, with everything under it. */
static void finish_pass(size_t base) {
    bool freed = false;
    for (size_t i = base; i < pass_n; i++) {
        lk_node *n = pass_stack[i];
        n->pass = 0;
        lk_tensor_release(n->grad);
        n->grad = NULL;
        if (n->consumers == 0) {
            node_release(n);
            freed = true;
        }
    }
    pass_n = base;
    if (freed) tape_compact();
}

lk_status lk_backward_with(lk_tensor *out, lk_tensor *grad_out) {
    if (!out || !grad_out) return lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_ARGUMENT, "backward: NULL tensor");
    if (!out->requires_grad || !out->grad_fn)
        return lk_error(LK_STATUS_INVALID_USAGE,
                        "backward: the tensor does not require grad (no parameter with requires_grad took part, "
                        "or it was computed with grad mode off), or its graph was already freed");
    if (out->grad_fn->pass)
        return lk_error(LK_STATUS_INVALID_USAGE, "backward: the graph of this tensor is being differentiated by a "
                        "backward that is still running on this thread");
    if (!lk_tensor_same_shape(out, grad_out)) return lk__error_shapes("backward", "output and its gradient differ", out, grad_out);
    if (lk__same_device("backward", 2, (lk_tensor *[]){out, grad_out})) return lk_last_status();
    size_t base = pass_n;
    pass_depth++;
    /* Only the outermost pass counts leaf uses and fires grad hooks: a
     * nested one (a recompute's, a custom function's) adds into the leaves
     * the outer pass will count as final when it is done with them. */
    bool outer = pass_depth == 1;
    lk_status st = collect(out->grad_fn, base);
    if (!st && outer) {
        for (size_t i = base; i < pass_n; i++)
            for (int k = 0; k < pass_stack[i]->n_in; k++)
                if (!pass_stack[i]->in[k]->grad_fn) pass_stack[i]->in[k]->lk__pending = 0;
        for (size_t i = base; i < pass_n; i++) mark_leaf_uses(pass_stack[i], 1, false);
    }

    bool prev = lk_set_grad_enabled(false);
    if (!st) {
        lk_tensor *g0 = grad_out->dtype == out->dtype && lk_tensor_is_contiguous(grad_out)
                            ? lk_tensor_retain(grad_out)
                            : lk_tensor_cast(grad_out, out->dtype);
        if (!g0) st = lk_last_status();
        else {
            lk_tensor_release(out->grad_fn->grad);
            out->grad_fn->grad = g0;
        }
    }
    /* pass_stack may move while a node runs (a nested pass pushes above
     * this one's part): index it afresh each time */
    for (size_t i = base; i < pass_n && !st; i++) {
        lk_node *n = pass_stack[i];
        if (n->grad) {
            lk_clear_error();
            if (op_hook && outer) {
                double t0 = lk_time_now();
                op_in_backward = true;
                n->backward(n, n->grad);
                op_in_backward = false;
                op_hook(op_hook_ctx, n->name, true, t0, lk_time_now());
            } else {
                n->backward(n, n->grad);
            }
            st = lk_last_status();
            lk_tensor_release(n->grad);
            n->grad = NULL;
        }
        if (!st && outer) mark_leaf_uses(n, 0, true);
    }
    lk_set_grad_enabled(prev);
    finish_pass(base);
    pass_depth--;
    return st;
}

lk_status lk_backward(lk_tensor *loss) {
    if (!loss) return lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_ARGUMENT, "backward: NULL loss");
    if (loss->numel != 1) {
        char s[128];
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "backward: the loss must hold one element, got shape %s (reduce it with lk_sum or lk_mean)",
                        lk_shape_str(loss, s, sizeof s));
    }
    lk_tensor *one = lk__tensor_full_on(loss->device, LK_F32, loss->ndim, loss->shape, 1.0);
    if (!one) return lk_last_status();
    lk_status st = lk_backward_with(loss, one);
    lk_tensor_release(one);
    return st;
}

/* ---- autocast -------------------------------------------------------------------- */

void lk_autocast_enter(lk_dtype dt) {
    if (autocast_n < AUTOCAST_DEPTH) autocast_stack[autocast_n] = dt == LK_BF16 || dt == LK_F16 ? dt : LK_F32;
    autocast_n++; /* deeper than the stack: the innermost recorded region stays in force */
}

void lk_autocast_exit(void) {
    if (autocast_n > 0) autocast_n--;
}

lk_dtype lk_autocast_dtype(void) {
    if (autocast_n == 0) return LK_F32;
    return autocast_stack[(autocast_n < AUTOCAST_DEPTH ? autocast_n : AUTOCAST_DEPTH) - 1];
}

lk_dtype lk__autocast_dtype_for(lk_cast_family fam, lk_dtype in) {
    switch (fam) {
    case LK_CAST_LOWER: {
        lk_dtype dt = lk_autocast_dtype();
        return dt == LK_F32 ? in : dt; /* outside a region a GEMM runs in its inputs' dtype */
    }
    case LK_CAST_FP32: return LK_F32;
    case LK_CAST_SAME: break;
    }
    return in;
}

const char *lk_autocast_gemm_path(lk_dtype dt) { return lk__cpu_gemm_path(dt, LK_F32); }
bool lk_cpu_native(lk_dtype dt) { return lk__cpu_native(dt); }
const char *lk_cpu_lowp_features(char *buf, size_t size) { return lk__cpu_caps_str(buf, size); }

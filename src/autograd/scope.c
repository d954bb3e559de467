/* Autorelease scopes: a per-thread stack of tensor lists. An op's result
 * goes to the innermost scope; popping a frame releases its tensors. Each
 * frame also keeps an opaque mark for the tape (the seq of the first node
 * recorded inside it); lk_scope_begin/end in autograd.c pair the two, so
 * this file knows nothing of the tape (and the tensor layer nothing of
 * either). */
#include <string.h>

#include "autograd/autograd_impl.h"

/* Each frame keeps its capacity after it ends, so steady-state steps
 * allocate nothing here either. */
typedef struct {
    lk_tensor **items;
    int n, max;
    uint64_t mark;
} scope_frame;

static _Thread_local scope_frame *scopes;
static _Thread_local int scope_depth, scope_max;

void lk__scope_push(uint64_t mark) {
    if (scope_depth == scope_max) {
        int old = scope_max;
        if (lk_vec_reserve(scopes, scope_max, scope_depth + 1, 8)) lk_panic("out of memory growing the scope stack");
        memset(scopes + old, 0, (size_t)(scope_max - old) * sizeof *scopes);
    }
    scope_frame *f = &scopes[scope_depth++];
    f->n = 0;
    f->mark = mark;
}

uint64_t lk__scope_top_mark(void) {
    LK_ASSERT(scope_depth > 0);
    return scopes[scope_depth - 1].mark;
}

void lk__scope_pop(void) {
    LK_ASSERT(scope_depth > 0);
    scope_frame *f = &scopes[--scope_depth];
    for (int i = f->n - 1; i >= 0; i--) lk_tensor_release(f->items[i]);
    f->n = 0;
}

lk_tensor **lk__scope_pop_keep(int *n) {
    LK_ASSERT(scope_depth > 0);
    scope_frame *f = &scopes[--scope_depth];
    *n = f->n;
    lk_tensor **out = f->n ? lk_malloc((size_t)f->n * sizeof *out) : NULL;
    if (f->n && !out) lk_panic("out of memory handing over a scope's tensors");
    if (f->n) memcpy(out, f->items, (size_t)f->n * sizeof *out);
    f->n = 0;
    return out;
}

bool lk__scope_active(void) { return scope_depth > 0; }

void lk__scope_thread_cleanup(void) {
    for (int i = 0; i < scope_max; i++) lk_free(scopes[i].items);
    lk_free(scopes);
    scopes = NULL;
    scope_depth = scope_max = 0;
}

lk_tensor *lk_scope_adopt(lk_tensor *t) {
    if (!t || scope_depth == 0) return t;
    scope_frame *f = &scopes[scope_depth - 1];
    if (f->n == f->max && lk_vec_reserve(f->items, f->max, f->n + 1, 64)) lk_panic("out of memory growing a scope");
    f->items[f->n++] = t;
    return t;
}

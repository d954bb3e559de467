/* matmul and linear. Operands that are transposed views of row-major
 * matrices reach BLAS as transpose flags with their own leading dimension:
 * no copies. linear fuses the bias: the output starts as the broadcast bias
 * and GEMM accumulates onto it (beta = 1). Under autocast both are
 * LK_CAST_LOWER: operands rounded to the region's bf16/f16 (an input already
 * in it is used as is, no copy), products accumulated in f32, the output
 * rounded once to bf16/f16 as torch's; a gradient has its tensor's dtype (the
 * f32 weights' dW is a bf16 x bf16 -> f32 GEMM into their f32 grad). */
#include <stdio.h>
#include <string.h>

#include "autograd/autograd_impl.h"
#include "backend/backend_impl.h"

/* How a 2-D matrix view can be handed to a GEMM: its memory, whether it is
 * stored transposed, and its leading dimension in elements. */
typedef struct {
    void *p;
    bool trans;
    int64_t ld;
} blas_mat;

static bool as_blas(const lk_tensor *t, int d0, int d1, blas_mat *m) {
    m->p = t->data;
    if (t->stride[d1] == 1 && t->stride[d0] >= (t->shape[d1] > 1 ? t->shape[d1] : 1)) {
        m->trans = false;
        m->ld = t->stride[d0] > 0 ? t->stride[d0] : 1;
        if (t->shape[d0] == 1) m->ld = t->shape[d1] > 1 ? t->shape[d1] : 1;
        return true;
    }
    if (t->stride[d0] == 1 && t->stride[d1] >= (t->shape[d0] > 1 ? t->shape[d0] : 1)) {
        m->trans = true;
        m->ld = t->stride[d1] > 0 ? t->stride[d1] : 1;
        if (t->shape[d1] == 1) m->ld = t->shape[d0] > 1 ? t->shape[d0] : 1;
        return true;
    }
    return false;
}

/* C[M,N] (+)= op(A) op(B) for 2-D tensors (views allowed), as a typed GEMM
 * over the operands' own dtypes: the backend says whether it runs them. */
static lk_status gemm2d(const lk_tensor *A, bool ta, const lk_tensor *B, bool tb, float beta, lk_tensor *C) {
    blas_mat a = {0}, b = {0};
    lk_tensor *ac = NULL, *bc = NULL;
    if (!as_blas(A, 0, 1, &a)) {
        ac = lk_tensor_clone(A);
        if (!ac) return lk_last_status();
        as_blas(ac, 0, 1, &a);
    }
    if (!as_blas(B, 0, 1, &b)) {
        bc = lk_tensor_clone(B);
        if (!bc) {
            lk_tensor_release(ac);
            return lk_last_status();
        }
        as_blas(bc, 0, 1, &b);
    }
    int64_t M = ta ? A->shape[1] : A->shape[0], K = ta ? A->shape[0] : A->shape[1];
    int64_t N = tb ? B->shape[0] : B->shape[1];
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {A->dtype, B->dtype, C->dtype}};
    d.gemm = (lk_gemm_params){a.trans != ta, b.trans != tb, M, N, K, a.ld, b.ld,
                              C->stride[0] > 0 ? C->stride[0] : (N ? N : 1), 1.0f, beta};
    lk_status st = lk__backend_run(C->device, &d, (void *[]){a.p, b.p, C->data});
    lk_tensor_release(ac);
    lk_tensor_release(bc);
    return st;
}

/* The same panel as a view, not rounded. */
static lk_tensor *round_panel_view(const lk_tensor *t, int dim, int64_t r0, int64_t nr) {
    int64_t shape[2] = {t->shape[0], t->shape[1]};
    shape[dim] = nr;
    return lk__tensor_view((lk_tensor *)t, 2, shape, t->stride, t->offset + r0 * t->stride[dim]);
}

/* Under autocast a large f32 operand (a master weight) is rounded to
 * the GEMM's 16-bit dtype in panels, never as a whole copy: each panel of
 * about LOWP_PANEL elements covers a block of C's rows (A) or columns (B), so
 * every element of C is still one GEMM over the whole K, rounded once — the
 * same bits as rounding the operands whole — while the transient copy stays
 * small next to the step's 16-bit activations. */
enum { LOWP_PANEL = 1 << 19 };

/* Rows [r0, r0 + nr) (dim 0) or columns (dim 1) of the 2-D view t, rounded to dt. */
static lk_tensor *round_panel(const lk_tensor *t, int dim, int64_t r0, int64_t nr, lk_dtype dt) {
    lk_tensor *v = round_panel_view(t, dim, r0, nr);
    if (!v || t->dtype != LK_F32 || v->stride[1] != 1 || !lk_device_is_host(t->device)) { /* the cast op */
        lk_tensor *r = v ? lk_tensor_cast(v, dt) : NULL;
        lk_tensor_release(v);
        return r;
    }
    /* rows of a column panel are contiguous: round them row by row (the
     * generic strided copy goes element by element) */
    lk_tensor *r = lk__tensor_new_on(v->device, dt, 2, v->shape);
    for (int64_t i = 0; r && i < v->shape[0]; i++)
        lk_f32_to_half_n(dt, (uint16_t *)r->data + i * v->shape[1], (const float *)v->data + i * v->stride[0],
                         (size_t)v->shape[1]);
    lk_tensor_release(v);
    return r;
}

/* Rows per panel of an operand of `rows` x K: all of them unless it is to
 * be rounded and larger than a panel; then equal panels, a multiple of 16
 * rows each (few distinct GEMM shapes: oneDNN caches a primitive per shape). */
static int64_t panel_rows(bool round, int64_t rows, int64_t K) {
    if (!round || rows * K <= LOWP_PANEL) return rows > 0 ? rows : 1;
    int64_t p = (rows * K + LOWP_PANEL - 1) / LOWP_PANEL, r = (rows + p - 1) / p;
    return (r + 15) & ~(int64_t)15;
}

/* C = op(A) op(B) (+ beta C) with an operand that is not in dt rounded in
 * panels (A over C's rows, B over C's columns); operands already in dt as they are. */
static lk_status gemm2d_round(const lk_tensor *A, bool ta, const lk_tensor *B, bool tb, float beta, lk_tensor *C,
                              lk_dtype dt) {
    int64_t M = C->shape[0], N = C->shape[1], K = ta ? A->shape[0] : A->shape[1];
    bool ra = A->dtype != dt, rb = B->dtype != dt;
    int64_t mc = panel_rows(ra, M, K), nc = panel_rows(rb, N, K);
    lk_status st = LK_STATUS_OK;
    for (int64_t m0 = 0; m0 < M && !st; m0 += mc) {
        int64_t nm = M - m0 < mc ? M - m0 : mc;
        lk_tensor *a = ra ? round_panel(A, ta ? 1 : 0, m0, nm, dt) : round_panel_view(A, ta ? 1 : 0, m0, nm);
        for (int64_t n0 = 0; n0 < N && !st; n0 += nc) {
            int64_t nn = N - n0 < nc ? N - n0 : nc;
            lk_tensor *bp = rb ? round_panel(B, tb ? 0 : 1, n0, nn, dt) : round_panel_view(B, tb ? 0 : 1, n0, nn);
            lk_tensor *cv = lk__tensor_view(C, 2, (int64_t[]){nm, nn}, C->stride, C->offset + m0 * C->stride[0] + n0 * C->stride[1]);
            st = a && bp && cv ? gemm2d(a, ta, bp, tb, beta, cv) : lk_last_status();
            lk_tensor_release(bp);
            lk_tensor_release(cv);
        }
        lk_tensor_release(a);
    }
    return st;
}

/* 2-D view of a [..., M, K] tensor folded to [prod(...)*M, K] when its rows are contiguous. */
static lk_tensor *fold_rows(lk_tensor *t) {
    int64_t K = t->shape[t->ndim - 1], M = t->numel / (K ? K : 1);
    if (t->ndim == 2) return lk_tensor_retain(t);
    lk_tensor *c = lk__contig_keep(t);
    if (!c) return NULL;
    lk_tensor *v = lk__tensor_view(c, 2, (int64_t[]){M, K}, (int64_t[]){K, 1}, c->offset);
    lk_tensor_release(c);
    return v;
}

/* ---- matmul -------------------------------------------------------------------- */

static void matmul_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *a = n->in[0], *b = n->in[1];
    bool batched = n->a.i[0];
    /* autocast: the forward's low-precision operands, and g rounded the same way */
    lk_tensor *gl = n->saved[0] ? (g->dtype == n->saved[0]->dtype ? lk_tensor_retain(g) : lk_tensor_cast(g, n->saved[0]->dtype))
                                : NULL;
    if (n->saved[0]) {
        if (!gl) return;
        a = n->saved[0], b = n->saved[1], g = gl;
    }
    lk_tensor *ga = n->in[0], *gb = n->in[1]; /* where the gradients go (f32 leaves or nodes) */
    if (!batched) {
        lk_tensor *a2 = fold_rows(a), *g2 = fold_rows(g);
        if (!a2 || !g2) goto done2;
        if (ga->requires_grad) {
            lk_tensor *da = lk__tensor_new_on(a->device, ga->dtype, a->ndim, a->shape);
            if (!da) goto done2;
            lk_tensor *da2 = fold_rows(da);
            if (da2 && !gemm2d(g2, false, b, true, 0.0f, da2)) lk__accum(ga, da);
            lk_tensor_release(da2);
            lk_tensor_release(da);
        }
        if (gb->requires_grad) {
            lk_tensor *db = lk__tensor_new_on(a->device, gb->dtype, 2, b->shape);
            if (db && !gemm2d(a2, true, g2, false, 0.0f, db)) lk__accum(gb, db);
            lk_tensor_release(db);
        }
    done2:
        lk_tensor_release(a2);
        lk_tensor_release(g2);
        lk_tensor_release(gl);
        return;
    }
    int64_t B = a->shape[0];
    lk_tensor *da = ga->requires_grad ? lk__tensor_new_on(a->device, ga->dtype, 3, a->shape) : NULL;
    lk_tensor *db = gb->requires_grad ? lk__tensor_new_on(a->device, gb->dtype, 3, b->shape) : NULL;
    for (int64_t i = 0; i < B; i++) {
        lk_tensor *ai = lk__tensor_view(a, 2, a->shape + 1, a->stride + 1, a->offset + i * a->stride[0]);
        lk_tensor *bi = lk__tensor_view(b, 2, b->shape + 1, b->stride + 1, b->offset + i * b->stride[0]);
        lk_tensor *gi = lk__tensor_view(g, 2, g->shape + 1, g->stride + 1, g->offset + i * g->stride[0]);
        if (da) {
            lk_tensor *dai = lk__tensor_view(da, 2, da->shape + 1, da->stride + 1, i * da->stride[0]);
            if (dai) gemm2d(gi, false, bi, true, 0.0f, dai);
            lk_tensor_release(dai);
        }
        if (db) {
            lk_tensor *dbi = lk__tensor_view(db, 2, db->shape + 1, db->stride + 1, i * db->stride[0]);
            if (dbi) gemm2d(ai, true, gi, false, 0.0f, dbi);
            lk_tensor_release(dbi);
        }
        lk_tensor_release(ai);
        lk_tensor_release(bi);
        lk_tensor_release(gi);
    }
    if (da) lk__accum(ga, da);
    if (db) lk__accum(gb, db);
    lk_tensor_release(da);
    lk_tensor_release(db);
    lk_tensor_release(gl);
}

lk_tensor *lk_matmul(lk_tensor *a, lk_tensor *b) {
    LK_OP_CHECK_INPUTS(a, b);
    lk_dtype lowp = lk__autocast_dtype_for(LK_CAST_LOWER, LK_F32);
    lk_status (*check)(const char *, const lk_tensor *, const char *) = lowp == LK_F32 ? lk__check_f32 : lk__check_float;
    if (check("matmul", a, "a") || check("matmul", b, "b")) return NULL;
    bool batched = a->ndim == 3 && b->ndim == 3;
    if (a->ndim < 2 || (b->ndim != 2 && !batched))
        return lk__error_shapes("matmul", "expected a[..., M, K] @ b[K, N] or a[B, M, K] @ b[B, K, N]", a, b), NULL;
    if (a->shape[a->ndim - 1] != b->shape[b->ndim - 2] || (batched && a->shape[0] != b->shape[0]))
        return lk__error_shapes("matmul", "inner dimensions differ", a, b), NULL;
    int64_t shape[LK_MAX_DIMS];
    for (int i = 0; i < a->ndim - 1; i++) shape[i] = a->shape[i];
    shape[a->ndim - 1] = b->shape[b->ndim - 1];
    lk_tensor *out = lk__tensor_new_on(a->device, lowp, a->ndim, shape);
    if (!out) return NULL;
    lk_status st = LK_STATUS_OK;
    lk_tensor *al = NULL, *bl = NULL, *a_in = a, *b_in = b;
    if (lowp != LK_F32) { /* autocast: multiply the operands in bf16/f16 (rounded unless they are), accumulate in f32 */
        al = a->dtype == lowp ? lk_tensor_retain(a) : lk_tensor_cast(a, lowp);
        bl = b->dtype == lowp ? lk_tensor_retain(b) : lk_tensor_cast(b, lowp);
        if (!al || !bl) st = lk_last_status();
        a = al, b = bl;
    }
    if (st) {
    } else if (!batched) {
        lk_tensor *a2 = fold_rows(a), *o2 = fold_rows(out);
        st = (a2 && o2) ? gemm2d(a2, false, b, false, 0.0f, o2) : lk_last_status();
        lk_tensor_release(a2);
        lk_tensor_release(o2);
    } else {
        for (int64_t i = 0; i < a->shape[0] && !st; i++) {
            lk_tensor *ai = lk__tensor_view(a, 2, a->shape + 1, a->stride + 1, a->offset + i * a->stride[0]);
            lk_tensor *bi = lk__tensor_view(b, 2, b->shape + 1, b->stride + 1, b->offset + i * b->stride[0]);
            lk_tensor *oi = lk__tensor_view(out, 2, out->shape + 1, out->stride + 1, i * out->stride[0]);
            st = (ai && bi && oi) ? gemm2d(ai, false, bi, false, 0.0f, oi) : lk_last_status();
            lk_tensor_release(ai);
            lk_tensor_release(bi);
            lk_tensor_release(oi);
        }
    }
    if (st) {
        lk_tensor_release(al);
        lk_tensor_release(bl);
        lk_tensor_release(out);
        return NULL;
    }
    lk_tensor *in[2] = {a_in, b_in};
    lk_node *n = lk__record("matmul", matmul_backward, out, 2, in);
    if (n) {
        n->a.i[0] = batched;
        n->saved[0] = lk_tensor_retain(al); /* NULL unless autocast */
        n->saved[1] = lk_tensor_retain(bl);
    }
    lk_tensor_release(al);
    lk_tensor_release(bl);
    return lk__op_result(out);
}

/* ---- linear ---------------------------------------------------------------------- */

/* linear's two backward GEMMs, dX = dY W and dW (+)= dY^T X: the same
 * FLOPs, independent, both reading dY. On the CPU with two or more compute
 * threads, two that the backend would each run whole on one core (bf16 on
 * AMX below 256 MFLOP: cpu_lowp.c) run side by side, one per core, from
 * PAIR_MFLOP each: on a 2-core AMX Xeon that took the bf16-mixed
 * autoencoder's backward from 1.6 to 1.25 ms, while the mlp's 17-MFLOP
 * pairs lost more to the hand-over than they gained (docs/BENCHMARKS.md). */
#define PAIR_MFLOP 32.0

typedef struct {
    lk_tensor *gg, *ww, *dx2, *x2, *dw;
    lk_dtype lowp;
    float dw_beta;
    lk_status st[2];
    char msg[2][256];
} lin_pair;

static void lin_pair_task(void *ctx, int t) {
    lin_pair *j = ctx;
    lk_status st;
    if (t == 0)
        st = j->lowp == LK_F32 ? gemm2d(j->gg, false, j->ww, false, 0.0f, j->dx2)
                               : gemm2d_round(j->gg, false, j->ww, false, 0.0f, j->dx2, j->lowp);
    else
        st = gemm2d(j->gg, true, j->x2, false, j->dw_beta, j->dw);
    j->st[t] = st;
    if (st) snprintf(j->msg[t], sizeof j->msg[t], "%s", lk_last_error());
}

/* Whether j's two GEMMs run side by side (see lin_pair). */
static bool pair_linear(const lin_pair *j, lk_device dev) {
    int64_t M = j->gg->shape[0], out_f = j->gg->shape[1], in_f = j->dx2->shape[1];
    if (!lk_device_is_host(dev) || lk__parallel_width(2) < 2 || 2.0 * M * out_f * in_f < PAIR_MFLOP * 1024 * 1024)
        return false;
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {j->gg->dtype, j->gg->dtype, j->dx2->dtype}};
    d.gemm = (lk_gemm_params){.M = M, .N = in_f, .K = out_f};
    return !lk__cpu_gemm_cut(&d);
}

/* saved: 0 x folded to [M, in] (f32 outside autocast; under it the 16-bit
 * input itself or its rounded copy); 1 w
 * rounded, only for a weight that is not a leaf (a leaf is rounded again
 * here: one transient copy instead of every layer's kept all step).
 * a.i[0]: autocast on, a.i[1] its dtype. */
static void linear_backward(lk_node *n, lk_tensor *g) {
    lk_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    lk_tensor *x2 = n->saved[0];
    lk_dtype lowp = n->a.i[0] ? (lk_dtype)n->a.i[1] : LK_F32;
    int64_t M = x2->shape[0], out_f = w->shape[0];
    lk_tensor *g2 = lk__tensor_view(g, 2, (int64_t[]){M, out_f}, (int64_t[]){out_f, 1}, g->offset);
    if (!g2) return;
    /* dY in the forward's dtype (it is already, unless the output's gradient came in f32) */
    lk_tensor *gg = lowp == LK_F32 || g2->dtype == lowp ? lk_tensor_retain(g2) : lk_tensor_cast(g2, lowp);
    lk_tensor *dx = NULL, *dx2 = NULL, *dw = NULL;
    if (!gg) goto done;
    lin_pair j = {.gg = gg, .ww = n->saved[1] ? n->saved[1] : w, /* a leaf weight: rounded in panels */
                  .x2 = x2, .lowp = lowp};
    if (x->requires_grad) {
        dx = lk__tensor_new_on(x->device, x->dtype, x->ndim, x->shape); /* bf16 for a bf16 activation */
        dx2 = dx ? lk__tensor_view(dx, 2, (int64_t[]){M, x2->shape[1]}, (int64_t[]){x2->shape[1], 1}, 0) : NULL;
        if (!dx2) goto done;
    }
    if (w->requires_grad) {
        /* Accumulate straight into w->grad when it is a plain contiguous leaf
         * gradient (the common case: saves a temporary and an add). gg and
         * x2 are both in the forward's dtype already: nothing to round. */
        if (!w->grad_fn && w->grad && lk_tensor_is_contiguous(w->grad)) {
            j.dw = lk_tensor_retain(w->grad), j.dw_beta = w->lk__grad_stale ? 0.0f : 1.0f;
            w->lk__grad_stale = false;
        } else {
            dw = lk__tensor_new_on(x2->device, LK_F32, 2, w->shape);
            if (!dw) goto done;
            j.dw = lk_tensor_retain(dw);
        }
    }
    j.dx2 = dx2;
    if (dx2 && j.dw && pair_linear(&j, x->device)) {
        lk__parallel_run(2, lin_pair_task, &j);
    } else {
        if (dx2) lin_pair_task(&j, 0);
        if (j.dw) lin_pair_task(&j, 1);
    }
    for (int t = 0; t < 2; t++)
        if (j.st[t]) lk_error(j.st[t], "%s", j.msg[t]);
    lk_tensor_release(j.dw);
    lk_tensor_release(dx2); /* the view's reference before the slot takes dx's buffer */
    dx2 = NULL;
    if (dx && !j.st[0]) {
        lk__accum_move(x, dx); /* the slot takes the buffer */
        dx = NULL;
    }
    if (dw && !j.st[1]) {
        lk__accum_move(w, dw);
        dw = NULL;
    }
    if (b && b->requires_grad) {
        lk_tensor *db = lk__tensor_zeros_on(g2->device, LK_F32, 1, b->shape);
        /* the column sums of g2 [M, out_f], row after row, in f32 (g2 may be bf16/f16) */
        lk_op_desc sd = {.op = LK_OP_SUM_TO, .dtype = {g2->dtype, LK_F32}};
        sd.sum_to = (lk_sum_to_params){.ndim = 2, .shape = {M, out_f}, .sd = {0, 1}};
        if (db && !lk__backend_run(g2->device, &sd, (void *[]){g2->data, db->data})) lk__accum(b, db);
        lk_tensor_release(db);
    }
done:
    lk_tensor_release(dx2);
    lk_tensor_release(dx);
    lk_tensor_release(dw);
    lk_tensor_release(gg);
    lk_tensor_release(g2);
}

lk_tensor *lk_linear(lk_tensor *x, lk_tensor *w, lk_tensor *b) {
    LK_OP_CHECK_INPUTS(x, w);
    if (lk__same_device("linear", 3, (lk_tensor *[]){x, w, b})) return NULL;
    lk_dtype lowp = lk__autocast_dtype_for(LK_CAST_LOWER, LK_F32);
    lk_status (*check)(const char *, const lk_tensor *, const char *) = lowp == LK_F32 ? lk__check_f32 : lk__check_float;
    if (check("linear", x, "input") || check("linear", w, "weight")) return NULL;
    if (b && check("linear", b, "bias")) return NULL;
    if (w->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
        return lk__error_shapes("linear", "input [..., in] does not match weight [out, in]", x, w), NULL;
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return lk__error_shapes("linear", "bias must be [out] for weight [out, in]", b, w), NULL;
    int64_t in_f = w->shape[1], out_f = w->shape[0], M = x->numel / (in_f ? in_f : 1);
    /* autocast: x in the region's dtype. An input already in it (a previous
     * layer's bf16 output) is used and kept as is: no copy. An f32 input,
     * the batch included, is rounded once and its rounded copy kept for
     * backward's dW, as torch's autocast keeps it: rounding the batch again
     * there cost a bf16-mixed mlp step 8% of its time on an AMX Xeon (the
     * batch is cold: the loader's thread wrote it), for 0.1 MB less step
     * memory at batch 256 (docs/BENCHMARKS.md). */
    lk_tensor *xc = lowp == LK_F32 ? lk__contig(x) : x->dtype == lowp ? lk__contig_keep(x) : lk_tensor_cast(x, lowp);
    if (!xc) return NULL;
    lk_tensor *x2 = lk__tensor_view(xc, 2, (int64_t[]){M, in_f}, (int64_t[]){in_f, 1}, xc->offset);
    lk_tensor_release(xc);
    if (!x2) return NULL;

    int64_t shape[LK_MAX_DIMS];
    for (int i = 0; i < x->ndim - 1; i++) shape[i] = x->shape[i];
    shape[x->ndim - 1] = out_f;
    lk_tensor *out = lk__tensor_new_on(x->device, lowp, x->ndim, shape);
    lk_tensor *o2 = out ? lk__tensor_view(out, 2, (int64_t[]){M, out_f}, (int64_t[]){out_f, 1}, 0) : NULL;
    lk_status st = o2 ? LK_STATUS_OK : lk_last_status();
    if (!st && b) { /* the output starts as the bias (rounded to bf16/f16 under autocast, as torch's epilogue) */
        lk_tensor *bc = b->dtype == lowp ? lk__contig_keep(b) : lk_tensor_cast(b, lowp);
        if (!bc) st = lk_last_status();
        else {
            /* one LK_OP_COPY from the bias broadcast over the rows (source
             * stride 0): the same bits, one row memcpy at a time, as before */
            lk_op_desc d = {.op = LK_OP_COPY, .dtype = {lowp, lowp}};
            d.copy.ndim = 2;
            d.copy.shape[0] = M, d.copy.shape[1] = out_f;
            d.copy.ss[0] = 0, d.copy.ss[1] = 1, d.copy.sd[0] = out_f, d.copy.sd[1] = 1;
            st = lk__backend_run(out->device, &d, (void *[]){bc->data, o2->data});
            lk_tensor_release(bc);
        }
    }
    /* autocast: an f32 leaf weight (the master weight) is rounded in panels
     * per call, here and again in backward; any other f32 weight is rounded
     * whole once and kept for backward */
    lk_tensor *wl = NULL;
    if (!st && lowp != LK_F32 && w->dtype != lowp && w->grad_fn && !(wl = lk_tensor_cast(w, lowp))) st = lk_last_status();
    if (!st) st = lowp == LK_F32 ? gemm2d(x2, false, w, true, b ? 1.0f : 0.0f, o2)
                                 : gemm2d_round(x2, false, wl ? wl : w, true, b ? 1.0f : 0.0f, o2, lowp);
    lk_tensor_release(o2);
    if (st) {
        lk_tensor_release(out);
        lk_tensor_release(x2);
        lk_tensor_release(wl);
        return NULL;
    }
    lk_tensor *in[3] = {x, w, b};
    lk_node *n = lk__record("linear", linear_backward, out, b ? 3 : 2, in);
    if (n) {
        n->saved[0] = lk_tensor_retain(x2);
        n->saved[1] = lk_tensor_retain(wl); /* NULL for a leaf weight: rounded again in backward */
        n->a.i[0] = lowp != LK_F32;
        n->a.i[1] = lowp;
    }
    lk_tensor_release(x2);
    lk_tensor_release(wl);
    return lk__op_result(out);
}

/* oneDNN GEMMs for bf16 and f16 (built when libdnnl is found). oneDNN picks
 * the instructions at run time — AMX on Sapphire Rapids and later,
 * AVX512-BF16 on Cooper Lake and Zen 4/5, AVX512-FP16 for f16 on Sapphire
 * Rapids — so one binary serves every machine. Primitives are created once
 * per (dtypes, shape, strides, alpha, beta) and cached per thread (a memory
 * object's data handle is per call state, and the dp strategy runs replicas
 * on threads): a training step that repeats its shapes creates none. A shape
 * oneDNN has only its reference code for is handed back as UNSUPPORTED, and
 * the caller's f32 path runs instead (oneDNN's reference GEMM is slower than
 * widening to f32). oneDNN runs on OpenMP threads; every call here is told
 * to use one, because lockstep's own pool splits the GEMM (cpu_lowp.c). */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "backend/backend_impl.h"

enum { CACHE = 64 };

typedef struct {
    lk_dtype dt[3];
    lk_gemm_params g;
    dnnl_primitive_t prim; /* NULL: oneDNN has no fast implementation (remembered) */
    dnnl_memory_t a, b, c;
    uint64_t used;
} entry;

typedef struct {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    entry e[CACHE];
    int n;
    uint64_t tick;
} cache;

static _Thread_local cache *tl;

static dnnl_data_type_t dnnl_dt(lk_dtype t) {
    return t == LK_BF16 ? dnnl_bf16 : t == LK_F16 ? dnnl_f16 : dnnl_f32;
}

static void entry_free(entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->a) dnnl_memory_destroy(e->a);
    if (e->b) dnnl_memory_destroy(e->b);
    if (e->c) dnnl_memory_destroy(e->c);
    memset(e, 0, sizeof *e);
}

static bool same(const entry *e, const lk_op_desc *d) {
    const lk_gemm_params *x = &e->g, *y = &d->gemm;
    return e->dt[0] == d->dtype[0] && e->dt[1] == d->dtype[1] && e->dt[2] == d->dtype[2] && x->trans_a == y->trans_a &&
           x->trans_b == y->trans_b && x->M == y->M && x->N == y->N && x->K == y->K && x->lda == y->lda &&
           x->ldb == y->ldb && x->ldc == y->ldc && x->alpha == y->alpha && x->beta == y->beta;
}

/* The primitive for d, or NULL when oneDNN offers only its reference code
 * or none; *impl names the implementation it chose. */
static dnnl_primitive_t make(const lk_op_desc *d, dnnl_engine_t eng, const char **impl) {
    const lk_gemm_params *g = &d->gemm;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t ad = {g->M, g->K}, bd = {g->K, g->N}, cd = {g->M, g->N};
    dnnl_dims_t as = {g->trans_a ? 1 : g->lda, g->trans_a ? g->lda : 1};
    dnnl_dims_t bs = {g->trans_b ? 1 : g->ldb, g->trans_b ? g->ldb : 1};
    dnnl_dims_t cs = {g->ldc, 1};
    if (dnnl_memory_desc_init_by_strides(&a_md, 2, ad, dnnl_dt(d->dtype[0]), as) ||
        dnnl_memory_desc_init_by_strides(&b_md, 2, bd, dnnl_dt(d->dtype[1]), bs) ||
        dnnl_memory_desc_init_by_strides(&c_md, 2, cd, dnnl_dt(d->dtype[2]), cs))
        return NULL;
    dnnl_matmul_desc_t md;
    if (dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md)) return NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    if (dnnl_primitive_attr_create(&attr)) return NULL;
    bool ok = true;
    if (g->alpha != 1.0f) ok = !dnnl_primitive_attr_set_output_scales(attr, 1, 0, &g->alpha);
    if (ok && g->beta != 0.0f) {
        ok = !dnnl_post_ops_create(&po) && !dnnl_post_ops_append_sum(po, g->beta) &&
             !dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (ok) ok = !dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL);
    const char *name = "";
    if (ok) ok = !dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) && !strstr(name, "ref");
    if (ok) ok = !dnnl_primitive_create(&prim, pd);
    if (impl) *impl = ok ? name : NULL;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return ok ? prim : NULL;
}

static lk_status setup(void) {
    if (tl) return LK_STATUS_OK;
    /* One OpenMP thread for every oneDNN call on this thread: lockstep's pool
     * already cut the GEMM (cpu_lowp.c). Set before the first primitive is
     * made, not just before the first execution: set only after making it,
     * oneDNN's executions still started OpenMP teams of one thread per core
     * on the main thread and the pool's worker (gdb, a 2-thread bf16-mixed
     * fit: 5 threads instead of 3, six times the context switches). */
    omp_set_num_threads(1);
    cache *c = lk_calloc(1, sizeof *c);
    if (!c) return LK_STATUS_OUT_OF_MEMORY;
    if (dnnl_engine_create(&c->eng, dnnl_cpu, 0) || dnnl_stream_create(&c->strm, c->eng, dnnl_stream_default_flags)) {
        lk_free(c);
        return lk_error(LK_STATUS_INTERNAL, "oneDNN: cannot create the CPU engine");
    }
    tl = c;
    return LK_STATUS_OK;
}

lk_status lk__dnnl_gemm(const lk_op_desc *d, const void *A, const void *B, void *C) {
    if (d->gemm.K == 0) return LK_STATUS_UNSUPPORTED;
    LK_TRY(setup());
    cache *c = tl;
    entry *e = NULL;
    for (int i = 0; i < c->n && !e; i++)
        if (same(&c->e[i], d)) e = &c->e[i];
    if (!e) {
        if (c->n < CACHE) e = &c->e[c->n++];
        else { /* evict the least recently used */
            e = &c->e[0];
            for (int i = 1; i < CACHE; i++)
                if (c->e[i].used < e->used) e = &c->e[i];
            entry_free(e);
        }
        e->dt[0] = d->dtype[0], e->dt[1] = d->dtype[1], e->dt[2] = d->dtype[2];
        e->g = d->gemm;
        e->prim = make(d, c->eng, NULL);
        if (e->prim) {
            const dnnl_memory_desc_t *a_md, *b_md, *c_md;
            const_dnnl_primitive_desc_t pd;
            dnnl_primitive_get_primitive_desc(e->prim, &pd);
            a_md = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
            b_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
            c_md = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
            if (dnnl_memory_create(&e->a, a_md, c->eng, DNNL_MEMORY_NONE) ||
                dnnl_memory_create(&e->b, b_md, c->eng, DNNL_MEMORY_NONE) ||
                dnnl_memory_create(&e->c, c_md, c->eng, DNNL_MEMORY_NONE)) {
                entry_free(e);
                e->dt[0] = d->dtype[0], e->dt[1] = d->dtype[1], e->dt[2] = d->dtype[2];
                e->g = d->gemm; /* remembered as "no fast path" */
            }
        }
    }
    e->used = ++c->tick;
    if (!e->prim) return LK_STATUS_UNSUPPORTED;
    dnnl_memory_set_data_handle(e->a, (void *)A);
    dnnl_memory_set_data_handle(e->b, (void *)B);
    dnnl_memory_set_data_handle(e->c, C);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    if (dnnl_primitive_execute(e->prim, c->strm, 3, args) || dnnl_stream_wait(c->strm))
        return lk_error(LK_STATUS_INTERNAL, "oneDNN: a %s x %s GEMM failed to run", lk_dtype_name(d->dtype[0]),
                        lk_dtype_name(d->dtype[1]));
    return LK_STATUS_OK;
}

static void conv_thread_cleanup(void);

void lk__dnnl_thread_cleanup(void) {
    conv_thread_cleanup(); /* before the engine its primitives belong to */
    cache *c = tl;
    if (!c) return;
    for (int i = 0; i < c->n; i++) entry_free(&c->e[i]);
    dnnl_stream_destroy(c->strm);
    dnnl_engine_destroy(c->eng);
    lk_free(c);
    tl = NULL;
}

const char *lk__dnnl_isa(void) {
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    default: return "older than avx2";
    }
}

/* Whether oneDNN has its own code for a 256^3 ab x ab -> ct GEMM on this
 * CPU (-1: no CPU engine); impl, when given, gets the implementation's name. */
static int probe(lk_dtype ab, lk_dtype ct, char *impl, size_t size) {
    dnnl_engine_t eng;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0)) return -1;
    lk_op_desc d = {.op = LK_OP_GEMM, .dtype = {ab, ab, ct}};
    d.gemm = (lk_gemm_params){false, true, 256, 256, 256, 256, 256, 256, 1.0f, 0.0f};
    const char *name = NULL;
    dnnl_primitive_t p = make(&d, eng, &name);
    if (p && impl) snprintf(impl, size, "%s", name);
    if (p) dnnl_primitive_destroy(p);
    dnnl_engine_destroy(eng);
    return p != NULL;
}

bool lk__dnnl_native(lk_dtype ab) {
    static int known[2] = {-1, -1}; /* bf16, f16 */
    if (ab != LK_BF16 && ab != LK_F16) return ab == LK_F32;
    int *k = &known[ab == LK_F16], v = __atomic_load_n(k, __ATOMIC_RELAXED);
    if (v < 0) {
        v = probe(ab, LK_F32, NULL, 0) > 0;
        __atomic_store_n(k, v, __ATOMIC_RELAXED);
    }
    return v;
}

int lk__dnnl_gemm_impl(lk_dtype ab, lk_dtype ct, char *impl, size_t size) { return probe(ab, ct, impl, size); }

int lk__dnnl_major(void) { return (int)dnnl_version()->major; }

int lk__dnnl_f32_block(void) {
    /* the ISA values are nested bit sets: every AVX-512 level holds avx512_core's bits */
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    return (isa & (unsigned)dnnl_cpu_isa_avx512_core) == (unsigned)dnnl_cpu_isa_avx512_core ? 16 : 8;
}

/* ---- convolutions -------------------------------------------------------------------
 * oneDNN's direct convolutions (forward, backward-data, backward-weights
 * with the bias's gradient) on plain NCHW tensors. The primitives pick their
 * own layouts (format "any": nChw8c and OIhw8i8o on AVX2, 16-blocked on
 * AVX-512): their jit kernels on blocked layouts ran 1.5-6x faster than
 * the same primitives forced onto NCHW (which fall back to oneDNN's own
 * im2col + GEMM), more than paying for a reorder of each operand to and
 * from NCHW; an operand whose chosen layout is already plain is used in
 * place. Entries are cached per thread by (kind, shape, dtypes, bias), like
 * the GEMMs; the blocked copies live in per-thread scratch that only grows,
 * shared by every entry (one convolution runs at a time on a thread).
 * Single-threaded primitives (setup()) run the same kernel with the same
 * blocking every call, so a step's bits repeat run to run. */

enum { CONV_CACHE = 96, CONV_OPS = 3 };

typedef struct {
    int kind;
    lk__dnnl_conv_shape s;
    int any_impl;             /* 1: accepted oneDNN's GEMM-based code too; 2: its reference code too (tests) */
    dnnl_primitive_t prim;    /* NULL: no implementation taken (remembered) */
    dnnl_memory_t user[CONV_OPS]; /* the caller's plain tensors: inputs a, b, output c */
    dnnl_memory_t mem[CONV_OPS];  /* the primitive's: the user's memory or a blocked copy */
    dnnl_memory_t bias;
    dnnl_primitive_t reorder[CONV_OPS]; /* NULL: the primitive takes the plain layout */
    size_t bytes[CONV_OPS];   /* size of a blocked copy */
    int arg[CONV_OPS];        /* DNNL_ARG_* of a, b, c */
    uint64_t used;
    char impl[48];
} conv_entry;

typedef struct {
    conv_entry e[CONV_CACHE];
    int n;
    uint64_t tick;
    void *buf[CONV_OPS]; /* blocked copies */
    size_t cap[CONV_OPS];
} conv_cache;

static _Thread_local conv_cache *tl_conv;

static void conv_entry_free(conv_entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    for (int i = 0; i < CONV_OPS; i++) {
        if (e->reorder[i]) dnnl_primitive_destroy(e->reorder[i]);
        if (e->mem[i] && e->mem[i] != e->user[i]) dnnl_memory_destroy(e->mem[i]);
        if (e->user[i]) dnnl_memory_destroy(e->user[i]);
    }
    if (e->bias) dnnl_memory_destroy(e->bias);
    memset(e, 0, sizeof *e);
}

static bool conv_same(const conv_entry *e, int kind, const lk__dnnl_conv_shape *s, int any_impl) {
    return e->kind == kind && e->any_impl == any_impl && !memcmp(&e->s, s, sizeof *s);
}

/* The plain (NCHW, [G,]OIHW, X) descriptor of a tensor, or a format-any
 * one of the same dims for the primitive to choose. */
static int conv_md(dnnl_memory_desc_t *md, const lk__dnnl_conv_shape *s, char which, lk_dtype dt, bool any) {
    dnnl_dims_t d;
    dnnl_format_tag_t tag;
    int nd = 4;
    if (which == 'x') d[0] = s->N, d[1] = s->C, d[2] = s->H, d[3] = s->W, tag = dnnl_nchw;
    else if (which == 'y') d[0] = s->N, d[1] = s->O, d[2] = s->OH, d[3] = s->OW, tag = dnnl_nchw;
    else if (s->G == 1) d[0] = s->O, d[1] = s->C, d[2] = s->kh, d[3] = s->kw, tag = dnnl_oihw;
    else nd = 5, d[0] = s->G, d[1] = s->O / s->G, d[2] = s->C / s->G, d[3] = s->kh, d[4] = s->kw, tag = dnnl_goihw;
    return dnnl_memory_desc_init_by_tag(md, nd, d, dnnl_dt(dt), any ? dnnl_format_tag_any : tag);
}

/* The operation descriptor of `kind` over format-any tensors of the given dtypes. */
static int conv_desc(dnnl_convolution_desc_t *cd, int kind, const lk__dnnl_conv_shape *s, const lk_dtype dt[3],
                     lk_dtype bias_dt) {
    dnnl_memory_desc_t x, w, y, b;
    dnnl_dims_t st = {s->sh, s->sw}, dil = {s->dh - 1, s->dw - 1}, pl = {s->ph, s->pw};
    /* right padding as oneDNN counts it: whatever the last window needs beyond W */
    dnnl_dims_t pr = {(s->OH - 1) * s->sh + (s->kh - 1) * s->dh + 1 - s->H - s->ph,
                      (s->OW - 1) * s->sw + (s->kw - 1) * s->dw + 1 - s->W - s->pw};
    dnnl_dims_t bd = {s->O};
    if (kind == LK__DNNL_CONV_FWD) {
        if (conv_md(&x, s, 'x', dt[0], true) || conv_md(&w, s, 'w', dt[1], true) || conv_md(&y, s, 'y', dt[2], true) ||
            (s->bias && dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_dt(bias_dt), dnnl_x)))
            return 1;
        return dnnl_dilated_convolution_forward_desc_init(cd, dnnl_forward_training, dnnl_convolution_direct, &x, &w,
                                                          s->bias ? &b : NULL, &y, st, dil, pl, pr);
    }
    if (kind == LK__DNNL_CONV_BWD_DATA) { /* a = dY, b = W, c = dX */
        if (conv_md(&y, s, 'y', dt[0], true) || conv_md(&w, s, 'w', dt[1], true) || conv_md(&x, s, 'x', dt[2], true))
            return 1;
        return dnnl_dilated_convolution_backward_data_desc_init(cd, dnnl_convolution_direct, &x, &w, &y, st, dil, pl,
                                                                pr);
    }
    /* a = X, b = dY, c = dW (and db) */
    if (conv_md(&x, s, 'x', dt[0], true) || conv_md(&y, s, 'y', dt[1], true) || conv_md(&w, s, 'w', dt[2], true) ||
        (s->bias && dnnl_memory_desc_init_by_tag(&b, 1, bd, dnnl_f32, dnnl_x)))
        return 1;
    return dnnl_dilated_convolution_backward_weights_desc_init(cd, dnnl_convolution_direct, &x, &w, s->bias ? &b : NULL,
                                                               &y, st, dil, pl, pr);
}

/* Fills e (kind and shape set) with its primitive, memories and reorders;
 * leaves e->prim NULL when oneDNN has only its reference code (or, unless
 * any_impl, only its GEMM-based code, which is what lockstep's im2col path
 * already is). */
static void conv_make(conv_entry *e, dnnl_engine_t eng) {
    const lk__dnnl_conv_shape *s = &e->s;
    lk_dtype ab = s->mul;
    /* the primitive's dtypes: the multiplied operands in ab; forward's output
     * in the caller's dtype, a backward's f32 */
    lk_dtype fwd[3] = {ab, ab, ab}, dt[3] = {ab, ab, e->kind == LK__DNNL_CONV_FWD ? s->dt[2] : LK_F32};
    dnnl_convolution_desc_t cd, hd;
    dnnl_primitive_desc_t pd = NULL, hint = NULL;
    bool ok = !conv_desc(&cd, e->kind, s, dt, s->bias_dt);
    if (ok && e->kind != LK__DNNL_CONV_FWD) /* a backward primitive is made from its forward's */
        ok = !conv_desc(&hd, LK__DNNL_CONV_FWD, s, fwd, LK_F32) && !dnnl_primitive_desc_create(&hint, &hd, NULL, eng, NULL);
    if (ok) ok = !dnnl_primitive_desc_create(&pd, &cd, NULL, eng, hint);
    const char *name = "";
    if (ok) ok = !dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
    if (ok && e->any_impl < 2) ok = !strstr(name, "ref");
    if (ok && e->any_impl < 1) ok = !strstr(name, "gemm");
    if (ok) ok = !dnnl_primitive_create(&e->prim, pd);
    if (ok) snprintf(e->impl, sizeof e->impl, "%s", name); /* the name belongs to pd */
    static const dnnl_query_t q[3][CONV_OPS] = {
        {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md},
        {dnnl_query_diff_dst_md, dnnl_query_weights_md, dnnl_query_diff_src_md},
        {dnnl_query_src_md, dnnl_query_diff_dst_md, dnnl_query_diff_weights_md}};
    static const int args[3][CONV_OPS] = {{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                                          {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
                                          {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS}};
    static const char which[3][CONV_OPS] = {{'x', 'w', 'y'}, {'y', 'w', 'x'}, {'x', 'y', 'w'}};
    for (int i = 0; ok && i < CONV_OPS; i++) {
        /* the caller's tensor: plain, in its own dtype (an f32 x of an autocast
         * region is rounded by its reorder) */
        lk_dtype udt = s->dt[i];
        dnnl_memory_desc_t umd;
        const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(pd, q[e->kind][i], 0);
        e->arg[i] = args[e->kind][i];
        ok = !conv_md(&umd, s, which[e->kind][i], udt, false) &&
             !dnnl_memory_create(&e->user[i], &umd, eng, DNNL_MEMORY_NONE);
        if (ok && dnnl_memory_desc_equal(&umd, pmd)) {
            e->mem[i] = e->user[i];
            continue;
        }
        dnnl_primitive_desc_t rpd = NULL;
        bool out = i == 2;
        ok = ok && !dnnl_memory_create(&e->mem[i], pmd, eng, DNNL_MEMORY_NONE) &&
             !dnnl_reorder_primitive_desc_create(&rpd, out ? pmd : &umd, eng, out ? &umd : pmd, eng, NULL) &&
             !dnnl_primitive_create(&e->reorder[i], rpd);
        if (rpd) dnnl_primitive_desc_destroy(rpd);
        e->bytes[i] = dnnl_memory_desc_get_size(pmd);
    }
    if (ok && s->bias) {
        dnnl_memory_desc_t bmd;
        dnnl_dims_t bd = {s->O};
        ok = !dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_dt(e->kind == LK__DNNL_CONV_FWD ? s->bias_dt : LK_F32),
                                           dnnl_x) &&
             !dnnl_memory_create(&e->bias, &bmd, eng, DNNL_MEMORY_NONE);
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (hint) dnnl_primitive_desc_destroy(hint);
    if (!ok) { /* remembered as "not taken" */
        int kind = e->kind;
        lk__dnnl_conv_shape keep = e->s;
        int any = e->any_impl;
        conv_entry_free(e);
        e->kind = kind, e->s = keep, e->any_impl = any;
    }
}

/* The thread's entry for (kind, s), made on first use. */
static lk_status conv_get(int kind, const lk__dnnl_conv_shape *s, int any_impl, conv_entry **out) {
    LK_TRY(setup());
    if (!tl_conv && !(tl_conv = lk_calloc(1, sizeof *tl_conv)))
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "oneDNN: no memory for the convolutions' primitive cache");
    conv_cache *c = tl_conv;
    conv_entry *e = NULL;
    for (int i = 0; i < c->n && !e; i++)
        if (conv_same(&c->e[i], kind, s, any_impl)) e = &c->e[i];
    if (!e) {
        if (c->n < CONV_CACHE) e = &c->e[c->n++];
        else { /* evict the least recently used */
            e = &c->e[0];
            for (int i = 1; i < CONV_CACHE; i++)
                if (c->e[i].used < e->used) e = &c->e[i];
            conv_entry_free(e);
        }
        e->kind = kind, e->s = *s, e->any_impl = any_impl;
        conv_make(e, tl->eng);
    }
    e->used = ++c->tick;
    *out = e;
    return LK_STATUS_OK;
}

lk_status lk__dnnl_conv(int kind, const lk__dnnl_conv_shape *s, int any_impl, const void *a, const void *b, void *c,
                        void *bias) {
    if (s->mul != LK_F32 && s->mul != LK_BF16) return LK_STATUS_UNSUPPORTED;
    conv_entry *e;
    LK_TRY(conv_get(kind, s, any_impl, &e));
    if (!e->prim) return LK_STATUS_UNSUPPORTED;
    conv_cache *cc = tl_conv;
    void *ptr[CONV_OPS] = {(void *)a, (void *)b, c};
    dnnl_stream_t strm = tl->strm;
    bool fail = false;
    for (int i = 0; i < CONV_OPS && !fail; i++) {
        fail = dnnl_memory_set_data_handle(e->user[i], ptr[i]) != dnnl_success;
        if (!e->reorder[i] || fail) continue;
        if (cc->cap[i] < e->bytes[i]) { /* grow this slot's blocked copy */
            lk_aligned_free(cc->buf[i]);
            cc->cap[i] = 0;
            if (!(cc->buf[i] = lk_aligned_alloc(64, e->bytes[i])))
                return lk_error(LK_STATUS_OUT_OF_MEMORY, "oneDNN: no memory for a convolution's blocked copy (%zu bytes)",
                                e->bytes[i]);
            cc->cap[i] = e->bytes[i];
        }
        fail = dnnl_memory_set_data_handle(e->mem[i], cc->buf[i]) != dnnl_success;
        if (!fail && i < 2) {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, e->user[i]}, {DNNL_ARG_TO, e->mem[i]}};
            fail = dnnl_primitive_execute(e->reorder[i], strm, 2, ra) != dnnl_success;
        }
    }
    dnnl_exec_arg_t args[4] = {{e->arg[0], e->mem[0]}, {e->arg[1], e->mem[1]}, {e->arg[2], e->mem[2]}};
    int nargs = 3;
    if (!fail && e->bias && bias) {
        fail = dnnl_memory_set_data_handle(e->bias, bias) != dnnl_success;
        args[nargs++] = (dnnl_exec_arg_t){kind == LK__DNNL_CONV_FWD ? DNNL_ARG_BIAS : DNNL_ARG_DIFF_BIAS, e->bias};
    }
    if (!fail) fail = dnnl_primitive_execute(e->prim, strm, nargs, args) != dnnl_success;
    if (!fail && e->reorder[2]) {
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, e->mem[2]}, {DNNL_ARG_TO, e->user[2]}};
        fail = dnnl_primitive_execute(e->reorder[2], strm, 2, ra) != dnnl_success;
    }
    if (fail || dnnl_stream_wait(strm))
        return lk_error(LK_STATUS_INTERNAL, "oneDNN: a %s convolution (%s, input [%ld, %ld, %ld, %ld], %ld outputs) failed to run",
                        lk_dtype_name(s->mul), kind == LK__DNNL_CONV_FWD ? "forward"
                                                 : kind == LK__DNNL_CONV_BWD_DATA ? "backward-data" : "backward-weights",
                        s->N, s->C, s->H, s->W, s->O);
    return LK_STATUS_OK;
}

const char *lk__dnnl_conv_impl(int kind, const lk__dnnl_conv_shape *s, int any_impl) {
    conv_entry *e;
    return !conv_get(kind, s, any_impl, &e) && e->prim ? e->impl : NULL;
}

static void conv_thread_cleanup(void) {
    conv_cache *c = tl_conv;
    if (!c) return;
    for (int i = 0; i < c->n; i++) conv_entry_free(&c->e[i]);
    for (int i = 0; i < CONV_OPS; i++) lk_aligned_free(c->buf[i]);
    lk_free(c);
    tl_conv = NULL;
}

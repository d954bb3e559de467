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

void lk__dnnl_thread_cleanup(void) {
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

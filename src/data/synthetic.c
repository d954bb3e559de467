/* Synthetic datasets: every sample is a pure function of (seed, index),
 * drawn from its own Philox stream, so samples need no memory, any rank can
 * produce any sample, and results do not depend on reading order. Used by
 * tests, benchmarks and the examples that must run without downloads. */
#include "data/data_internal.h"

#include <math.h>
#include <string.h>

lk_synthetic_config lk_synthetic_config_default(void) {
    lk_synthetic_config c = {LK_SYNTH_CLASSIFICATION, 1024, 16, 4, 1, 0.1f, 0};
    return c;
}

typedef struct {
    lk_synthetic_config cfg;
    float *params; /* classification: centres [classes, dim]; regression: W [out, dim] then b [out] */
} synth_ctx;

static void sample_rng(lk_rng *r, const synth_ctx *c, int64_t index) {
    lk_rng_init(r, c->cfg.seed, LK_RNG_DATA, (uint32_t)index, (uint32_t)((uint64_t)index >> 32));
}

static lk_status synth_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    const synth_ctx *c = ctx;
    const lk_synthetic_config *g = &c->cfg;
    lk_rng r;
    sample_rng(&r, c, index);
    float *x = out[0];
    switch (g->kind) {
    case LK_SYNTH_CLASSIFICATION: {
        int64_t y = lk_rng_below(&r, (uint32_t)g->classes);
        const float *centre = c->params + y * g->dim;
        lk_rng_fill_normal(&r, x, g->dim, 0.0f, g->noise);
        for (int64_t i = 0; i < g->dim; i++) x[i] += centre[i];
        *(int64_t *)out[1] = y;
        break;
    }
    case LK_SYNTH_REGRESSION: {
        lk_rng_fill_normal(&r, x, g->dim, 0.0f, 1.0f);
        float *y = out[1];
        const float *w = c->params, *b = c->params + g->out_dim * g->dim;
        for (int64_t o = 0; o < g->out_dim; o++) {
            double acc = b[o];
            for (int64_t i = 0; i < g->dim; i++) acc += (double)w[o * g->dim + i] * x[i];
            y[o] = (float)acc + g->noise * lk_rng_normal(&r);
        }
        break;
    }
    case LK_SYNTH_IMAGES: {
        /* A Gaussian blob whose position encodes the class (classes sit on a
         * circle), jittered, on a noisy background: learnable by an MLP or
         * a CNN, and pictures a person can check. */
        int64_t y = lk_rng_below(&r, (uint32_t)g->classes);
        int64_t h = g->dim, w = g->dim;
        double ang = 6.283185307179586 * (double)y / (double)g->classes;
        double cy = h * (0.5 + 0.3 * sin(ang)) + lk_rng_normal(&r) * 0.05 * h;
        double cx = w * (0.5 + 0.3 * cos(ang)) + lk_rng_normal(&r) * 0.05 * w;
        double s2 = 2.0 * (0.12 * h) * (0.12 * h);
        lk_rng_fill_normal(&r, x, h * w, 0.0f, g->noise); /* the background noise */
        for (int64_t i = 0; i < h; i++)
            for (int64_t j = 0; j < w; j++) {
                double d = ((double)i - cy) * ((double)i - cy) + ((double)j - cx) * ((double)j - cx);
                double v = exp(-d / s2) + x[i * w + j];
                x[i * w + j] = (float)(v < 0 ? 0 : v > 1 ? 1 : v);
            }
        *(int64_t *)out[1] = y;
        break;
    }
    }
    return LK_STATUS_OK;
}

static void synth_free(void *ctx) {
    synth_ctx *c = ctx;
    lk_free(c->params);
    lk_free(c);
}

static const lk_dataset_vtable synth_vt = {"synthetic", synth_get, synth_free, NULL}; /* computed, nothing to load */

lk_status lk_dataset_synthetic_create(const lk_synthetic_config *cfg, lk_dataset **out) {
    *out = NULL;
    const lk_synthetic_config *g = cfg;
    if (g->len < 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "synthetic: len %lld, expected >= 0", (long long)g->len);
    if (g->dim < 1 || g->dim > (1 << 20))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "synthetic: dim %lld, expected 1..%d", (long long)g->dim, 1 << 20);
    if (g->kind != LK_SYNTH_REGRESSION && (g->classes < 1 || g->classes > (1 << 20)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "synthetic: classes %lld, expected 1..%d", (long long)g->classes,
                        1 << 20);
    if (g->kind == LK_SYNTH_REGRESSION && (g->out_dim < 1 || g->out_dim > (1 << 16)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "synthetic: out_dim %lld, expected 1..%d", (long long)g->out_dim,
                        1 << 16);
    if (g->kind != LK_SYNTH_CLASSIFICATION && g->kind != LK_SYNTH_REGRESSION && g->kind != LK_SYNTH_IMAGES)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "synthetic: kind %d unknown", (int)g->kind);
    if (!(g->noise >= 0) || !isfinite(g->noise))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "synthetic: noise %g, expected >= 0", (double)g->noise);
    if (g->kind == LK_SYNTH_IMAGES && g->dim > 4096)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "synthetic images: side %lld, expected <= 4096", (long long)g->dim);
    synth_ctx *c = lk_calloc(1, sizeof *c);
    if (!c) return LK_STATUS_OUT_OF_MEMORY;
    c->cfg = *g;
    size_t np = g->kind == LK_SYNTH_CLASSIFICATION ? (size_t)(g->classes * g->dim)
              : g->kind == LK_SYNTH_REGRESSION    ? (size_t)(g->out_dim * (g->dim + 1))
                                                  : 1;
    c->params = lk_malloc(np * sizeof *c->params);
    if (!c->params) {
        lk_free(c);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    /* Parameters come from counters no sample index reaches (2^64 - 1). */
    lk_rng r;
    lk_rng_init(&r, g->seed, LK_RNG_DATA, 0xFFFFFFFFu, 0xFFFFFFFFu);
    float scale = g->kind == LK_SYNTH_REGRESSION ? 1.0f / sqrtf((float)g->dim) : 1.0f;
    for (size_t i = 0; i < np; i++) c->params[i] = scale * lk_rng_normal(&r);
    lk_field f[2];
    if (g->kind == LK_SYNTH_IMAGES) lk__field_init(&f[0], "x", 0, LK_F32, 3, (int64_t[]){1, g->dim, g->dim});
    else lk__field_init(&f[0], "x", 0, LK_F32, 1, &g->dim);
    if (g->kind == LK_SYNTH_REGRESSION) lk__field_init(&f[1], "y", 1, LK_F32, 1, &g->out_dim);
    else lk__field_init(&f[1], "y", 1, LK_I64, 0, NULL);
    return lk_dataset_create(&synth_vt, c, g->len, 2, f, 0, out);
}

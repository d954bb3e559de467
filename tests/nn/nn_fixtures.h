/* Shared by the nn, optim and models tests: the hash values that
 * tools/gen_nn_fixtures.py computes identically in numpy (so inputs,
 * weights and gradients need no fixture files), fixture loading, the
 * normwise comparison every parity check uses, and the skip rule for ops
 * that other layers have not implemented yet. */
#ifndef LK_NN_FIXTURES_H
#define LK_NN_FIXTURES_H

#include "lk_test.h"
#include "npy.h"

#define NN_FIXTURE_DIR LK_SOURCE_DIR "/tests/fixtures/nn"

/* hvals(seed, n, lo, hi) of gen_nn_fixtures.py: integer hash, then
 * lo + (hi - lo) * u in double, rounded to f32 — exact on both sides. */
static inline float nn_hval(uint64_t seed, uint64_t i, double lo, double hi) {
    const uint64_t M = 0xFFFFFFFFull;
    uint64_t x = (i * 2654435761ull + seed * 40503ull + 12345ull) & M;
    x ^= x >> 15;
    x = (x * 0x2C1B3C6Dull) & M;
    x ^= x >> 12;
    x = (x * 0x297A2D39ull) & M;
    x ^= x >> 15;
    double u = (double)x / 4294967296.0;
    return (float)(lo + (hi - lo) * u);
}

static inline void nn_hfill(float *d, int64_t n, uint64_t seed, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) d[i] = nn_hval(seed, (uint64_t)i, lo, hi);
}

/* New f32 tensor of the given shape filled with hvals (caller releases). */
static inline lk_tensor *nn_htensor(uint64_t seed, double lo, double hi, int ndim, const int64_t *shape) {
    lk_tensor *t = lk_tensor_empty(LK_F32, ndim, shape);
    if (t) nn_hfill(t->data, t->numel, seed, lo, hi);
    return t;
}

static inline lk_tensor *nn_hlabels(uint64_t seed, int64_t n, int classes) {
    lk_tensor *t = lk_tensor_empty(LK_I64, 1, (int64_t[]){n});
    for (int64_t i = 0; t && i < n; i++) {
        double u = (double)nn_hval(seed, (uint64_t)i, 0.0, 1.0);
        int64_t c = (int64_t)floor(u * classes);
        ((int64_t *)t->data)[i] = c < classes ? c : classes - 1;
    }
    return t;
}

/* tests/fixtures/nn/<name>.npy (caller releases; NULL + failed CHECK if absent). */
static inline lk_tensor *nn_fixture(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.npy", NN_FIXTURE_DIR, name);
    lk_tensor *t = NULL;
    lk_status st = lk_npy_load(path, &t);
    CHECK_MSG(st == LK_STATUS_OK, "fixture %s: %s", name, lk_last_error());
    return t;
}

/* Writes a tensor next to the build for debugging a parity failure. */
static inline lk_status nn_dump(const char *path, const lk_tensor *t) { return lk_npy_save(path, t); }

/* max|a - b| / max(max|b|, floor): the normwise relative error. Prints the
 * first differing values and the maximum difference on failure. */
static inline double nn_rel_err(const lk_tensor *a, const lk_tensor *b) {
    if (!a || !b || a->numel != b->numel) return INFINITY;
    double md = 0, mb = 0;
    for (int64_t i = 0; i < a->numel; i++) {
        double x = lk_tensor_get(a, i), y = lk_tensor_get(b, i);
        double d = fabs(x - y);
        if (isnan(d)) return INFINITY;
        if (d > md) md = d;
        if (fabs(y) > mb) mb = fabs(y);
    }
    return md / (mb > 1e-12 ? mb : 1e-12);
}

static inline bool nn_check_close(const char *what, const lk_tensor *got, const lk_tensor *want, double tol) {
    char s1[128] = "?", s2[128] = "?";
    if (!got || !want || got->numel != want->numel) {
        CHECK_MSG(false, "%s: shape %s, expected %s", what, got ? lk_shape_str(got, s1, sizeof s1) : "NULL",
                  want ? lk_shape_str(want, s2, sizeof s2) : "NULL");
        return false;
    }
    double e = nn_rel_err(got, want);
    if (!(e <= tol)) {
        int shown = 0;
        for (int64_t i = 0; i < got->numel && shown < 3; i++) {
            double x = lk_tensor_get(got, i), y = lk_tensor_get(want, i);
            if (fabs(x - y) > tol * (fabs(y) + 1e-6)) {
                fprintf(stderr, "  %s[%lld]: got %.9g want %.9g\n", what, (long long)i, x, y);
                shown++;
            }
        }
    }
    CHECK_MSG(e <= tol, "%s: relative error %.3g > %.1g", what, e, tol);
    return e <= tol;
}

/* Ops owned by other engineers fail with "not implemented yet" until they
 * land; such a case prints SKIP instead of failing. */
static inline bool nn_unimplemented(void) {
    return lk_last_status() == LK_STATUS_UNSUPPORTED && strstr(lk_last_error(), "not implemented");
}
#define NN_SKIP_IF_UNIMPLEMENTED(what)                                                  \
    if (nn_unimplemented()) {                                                           \
        printf("SKIP %s: %s\n", (what), lk_last_error());                               \
        lk_clear_error();                                                               \
        return;                                                                         \
    }

/* set_hash_weights of gen_nn_fixtures.py on a lockstep layer. */
static inline void nn_set_hash_weights(lk_layer *m, uint64_t seed) {
    lk_named_tensors ps = {0};
    CHECK_OK(lk_layer_named_parameters(m, &ps));
    double bound = 1.0;
    for (int k = 0; k < ps.n; k++) {
        const char *name = ps.items[k].name;
        lk_tensor *p = ps.items[k].tensor;
        /* second-to-last component starts with "bn": keep the defaults */
        const char *last = strrchr(name, '.');
        const char *prev = last;
        while (prev && prev > name && prev[-1] != '.') prev--;
        if (prev && !strncmp(prev, "bn", 2)) continue;
        if (p->ndim >= 2) {
            int64_t fan = p->shape[1];
            for (int d = 2; d < p->ndim; d++) fan *= p->shape[d];
            bound = 1.0 / sqrt((double)fan);
        }
        nn_hfill(p->data, p->numel, seed + (uint64_t)k, -bound, bound);
    }
    lk_named_tensors_clear(&ps);
}

#endif

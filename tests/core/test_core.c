/* core: Philox known answers, RNG helpers, errors, allocator hook, arena. */
#include <math.h>
#include <stddef.h>

#include "lk_test.h"

static void philox_known_answers(void) {
    /* Random123 kat_vectors: philox4x32 10 CTR[4] KEY[2] -> OUT[4]. */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
         0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
         0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        lk_philox4x32_10(kat[i], kat[i] + 4, out);
        for (int j = 0; j < 4; j++) CHECK_MSG(out[j] == kat[i][6 + j], "vector %d word %d: %08x", i, j, out[j]);
    }
}

static void rng_distributions(void) {
    lk_rng r;
    lk_rng_init(&r, 42, LK_RNG_USER, 0, 0);
    double s = 0, s2 = 0, u = 0;
    int n = 200000, bern = 0;
    for (int i = 0; i < n; i++) {
        float x = lk_rng_normal(&r);
        s += x;
        s2 += (double)x * x;
        float v = lk_rng_uniform(&r);
        CHECK(v >= 0.0f && v < 1.0f);
        u += v;
        bern += lk_rng_bernoulli(&r, 0.25f);
    }
    CHECK_NEAR(s / n, 0.0, 0.01);
    CHECK_NEAR(s2 / n, 1.0, 0.02);
    CHECK_NEAR(u / n, 0.5, 0.005);
    CHECK_NEAR((double)bern / n, 0.25, 0.005);
    /* Same key and coordinates: same stream; other coordinates: another. */
    lk_rng a, b, c;
    lk_rng_init(&a, 7, LK_RNG_DROPOUT, 3, 9);
    lk_rng_init(&b, 7, LK_RNG_DROPOUT, 3, 9);
    lk_rng_init(&c, 7, LK_RNG_DROPOUT, 4, 9);
    int same = 1, diff = 0;
    for (int i = 0; i < 100; i++) {
        uint32_t x = lk_rng_u32(&a), y = lk_rng_u32(&b), z = lk_rng_u32(&c);
        same &= x == y;
        diff += x != z;
    }
    CHECK(same);
    CHECK(diff > 95);
    int64_t idx[100], seen[100] = {0};
    for (int i = 0; i < 100; i++) idx[i] = i;
    lk_rng_shuffle_i64(&a, idx, 100);
    for (int i = 0; i < 100; i++) seen[idx[i]]++;
    for (int i = 0; i < 100; i++) CHECK(seen[i] == 1);
    for (int i = 0; i < 1000; i++) CHECK(lk_rng_below(&a, 7) < 7);
}

/* Skipping is drawing without the values: after lk_rng_skip(n) (or
 * _skip_normal, or a bulk fill into NULL) the stream goes on exactly as
 * after n draws, from any position inside a block and across the normal's
 * spare value. Deferred initialisation stands on it. */
static void rng_skip(void) {
    for (int used = 0; used < 6; used++)
        for (uint64_t n = 0; n < 14; n++) {
            lk_rng a, b;
            lk_rng_init(&a, 11, LK_RNG_INIT, 2, 5);
            for (int i = 0; i < used; i++) (void)lk_rng_u32(&a);
            b = a;
            for (uint64_t i = 0; i < n; i++) (void)lk_rng_u32(&a);
            lk_rng_skip(&b, n);
            int same = 1;
            for (int i = 0; i < 9; i++) same &= lk_rng_u32(&a) == lk_rng_u32(&b);
            CHECK_MSG(same, "lk_rng_skip(%llu) after %d words", (unsigned long long)n, used);
        }
    for (int spare = 0; spare < 2; spare++)
        for (uint64_t n = 0; n < 9; n++) {
            lk_rng a, b;
            lk_rng_init(&a, 11, LK_RNG_INIT, 3, 0);
            if (spare) (void)lk_rng_normal(&a); /* leaves a spare value */
            b = a;
            for (uint64_t i = 0; i < n; i++) (void)lk_rng_normal(&a);
            lk_rng_skip_normal(&b, n);
            int same = 1;
            for (int i = 0; i < 5; i++) {
                float x = lk_rng_normal(&a), y = lk_rng_normal(&b);
                same &= memcmp(&x, &y, sizeof x) == 0;
            }
            CHECK_MSG(same, "lk_rng_skip_normal(%llu), spare %d", (unsigned long long)n, spare);
        }
    int64_t sizes[] = {0, 1, 3, 4, 5, 255, 256, 257, 1000};
    for (int k = 0; k < 9; k++) {
        lk_rng a, b;
        lk_rng_init(&a, 5, LK_RNG_INIT, 0, 0);
        (void)lk_rng_u32(&a); /* a partly used block: the fill starts at the next one either way */
        b = a;
        float *x = malloc(sizeof *x * (size_t)(sizes[k] + 1));
        lk_rng_fill_normal(&a, x, sizes[k], 0.0f, 1.0f);
        lk_rng_fill_normal(&b, NULL, sizes[k], 0.0f, 1.0f);
        free(x);
        float y[7], z[7];
        lk_rng_fill_normal(&a, y, 7, 0.0f, 1.0f);
        lk_rng_fill_normal(&b, z, 7, 0.0f, 1.0f);
        CHECK_MSG(!memcmp(y, z, sizeof y) && lk_rng_u32(&a) == lk_rng_u32(&b), "fill_normal(NULL, %lld)",
                  (long long)sizes[k]);
    }
}

static lk_status fails_inner(void) { return lk_error(LK_STATUS_IO, "cannot open '%s'", "x.bin"); }
static lk_status fails_outer(void) {
    LK_TRY(fails_inner());
    return LK_STATUS_OK;
}

/* The bulk path: the same Box-Muller as a double reference over the same
 * Philox words, the normal CDF at several points, and a stream that
 * continues block by block. */
static void rng_fill_normal(void) {
    enum { N = 1 << 20 };
    float *x = lk_malloc(sizeof(float) * N);
    if (!x) return;
    lk_rng r;
    lk_rng_init(&r, 3, LK_RNG_DATA, 17, 5);
    lk_rng_fill_normal(&r, x, N, 0.0f, 1.0f);
    double maxerr = 0;
    for (uint32_t j = 0; j < 4096; j++) {
        uint32_t w[4], ctr[4] = {j, 0, 17, 5}, key[2] = {r.key[0], r.key[1]};
        lk_philox4x32_10(ctr, key, w);
        for (int h = 0; h < 2; h++) {
            double u1 = ((w[2 * h] >> 8) + 1) / 16777216.0, u2 = (w[2 * h + 1] >> 8) / 16777216.0;
            double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
            double e0 = fabs(x[4 * j + 2 * h] - rad * cos(th)), e1 = fabs(x[4 * j + 2 * h + 1] - rad * sin(th));
            maxerr = fmax(maxerr, fmax(e0, e1) / (1 + rad));
        }
    }
    CHECK_MSG(maxerr < 2e-6, "max error against the double reference %g", maxerr);
    static const double z[] = {-3, -2, -1, -0.5, 0, 0.5, 1, 2, 3};
    for (size_t k = 0; k < sizeof z / sizeof z[0]; k++) {
        int64_t below = 0;
        for (int i = 0; i < N; i++) below += x[i] < z[k];
        double phi = 0.5 * erfc(-z[k] / sqrt(2.0));
        CHECK_MSG(fabs((double)below / N - phi) < 0.0015, "P(x < %g) = %g, expected %g", z[k], (double)below / N, phi);
    }
    double s2 = 0, s4 = 0;
    for (int i = 0; i < N; i++) s2 += (double)x[i] * x[i], s4 += (double)x[i] * x[i] * x[i] * x[i];
    CHECK_NEAR(s2 / N, 1.0, 0.01);
    CHECK_NEAR(s4 / N, 3.0, 0.05);
    /* In pieces of whole blocks: the same values; mean and std applied. */
    float y[1000];
    lk_rng_init(&r, 3, LK_RNG_DATA, 17, 5);
    lk_rng_fill_normal(&r, y, 300, 2.0f, 0.5f);
    lk_rng_fill_normal(&r, y + 300, 700, 2.0f, 0.5f);
    int same = 1;
    for (int i = 0; i < 1000; i++) same &= fabsf(y[i] - (2.0f + 0.5f * x[i])) < 1e-6f;
    CHECK(same);
    /* A partial block is not reused: 10 values take 3 blocks. */
    lk_rng_init(&r, 3, LK_RNG_DATA, 17, 5);
    lk_rng_fill_normal(&r, y, 10, 0.0f, 1.0f);
    uint32_t w[4], ctr[4] = {3, 0, 17, 5}, key[2] = {r.key[0], r.key[1]};
    lk_philox4x32_10(ctr, key, w);
    CHECK(lk_rng_u32(&r) == w[0]);
    lk_free(x);
}

static void errors(void) {
    CHECK(strcmp(lk_status_str(LK_STATUS_TIMEOUT), "timed out") == 0);
    CHECK(fails_outer() == LK_STATUS_IO);
    CHECK(strstr(lk_last_error(), "cannot open 'x.bin'") != NULL);
    CHECK(strstr(lk_last_error_trace(), "test_core.c") != NULL);
    CHECK(lk_last_status() == LK_STATUS_IO);
    lk_clear_error();
    CHECK(lk_last_error()[0] == 0);
    lk_log_set_rank(3, 4);
    lk_error(LK_STATUS_REMOTE, "peer died");
    CHECK(strcmp(lk_last_error(), "[rank 3] peer died") == 0);
    lk_log_set_rank(-1, 0);
}

static void alloc_failure_hook(void) {
    lk_alloc_fail_after(2);
    void *a = lk_malloc(16);
    void *b = lk_malloc(16);
    CHECK(a != NULL);
    CHECK(b == NULL);
    CHECK(lk_last_status() == LK_STATUS_OUT_OF_MEMORY);
    void *c = lk_malloc(16);
    CHECK(c != NULL);
    lk_free(a);
    lk_free(c);
    void *al = lk_aligned_alloc(LK_ALIGN, 100);
    CHECK(al && ((uintptr_t)al % LK_ALIGN) == 0);
    lk_aligned_free(al);
}

static void arena(void) {
    lk_arena *a = lk_arena_create(1024);
    CHECK(a != NULL);
    void *p = lk_arena_alloc(a, 10), *q = lk_arena_alloc(a, 5000);
    CHECK(p && q && ((uintptr_t)p % LK_ALIGN) == 0 && ((uintptr_t)q % LK_ALIGN) == 0);
    memset(q, 1, 5000);
    lk_arena_reset(a);
    uint64_t before = lk_alloc_count();
    for (int i = 0; i < 3; i++) {
        CHECK(lk_arena_alloc(a, 10) != NULL);
        CHECK(lk_arena_alloc(a, 5000) != NULL);
        lk_arena_reset(a);
    }
    CHECK(lk_alloc_count() == before); /* steady state allocates nothing */
    lk_arena_free(a);
    lk_arena_free(NULL);
}

typedef struct {
    bool flag;
    int64_t epochs;
    double lr;
    char name[LK_PARAM_STR];
    char mode[LK_PARAM_STR];
    lk_int_list widths;
    lk_count_or_fraction limit;
} cfg_t;

static const lk_param cfg_params[] = {
    {"flag", LK_PARAM_BOOL, offsetof(cfg_t, flag), "false", 0, -1, NULL, "a switch"},
    {"max_epochs", LK_PARAM_INT, offsetof(cfg_t, epochs), "10", 1, 1000, NULL, "passes"},
    {"learning_rate", LK_PARAM_FLOAT, offsetof(cfg_t, lr), "1e-3", 0, 10, NULL, "step size"},
    {"name", LK_PARAM_STRING, offsetof(cfg_t, name), "\"run\"", 0, -1, NULL, "a name"},
    {"mode", LK_PARAM_ENUM, offsetof(cfg_t, mode), "min", 0, -1, "min|max", "direction"},
    {"widths", LK_PARAM_INTS, offsetof(cfg_t, widths), "[784, 512, 64]", 1, 1e6, NULL, "layer widths"},
    {"limit", LK_PARAM_COUNT_OR_FRACTION, offsetof(cfg_t, limit), "1.0", 0, 1e9, NULL, "batches"},
};
#define NP (int)(sizeof cfg_params / sizeof cfg_params[0])

static void param_tables(void) {
    cfg_t c;
    CHECK_OK(lk_params_defaults(cfg_params, NP, &c));
    CHECK(!c.flag && c.epochs == 10 && c.lr == 1e-3 && !strcmp(c.name, "run") && !strcmp(c.mode, "min"));
    CHECK(c.widths.n == 3 && c.widths.v[2] == 64);
    CHECK_OK(lk_params_set(cfg_params, NP, &c, "trainer", "max_epochs", "3"));
    CHECK(c.epochs == 3);
    CHECK_OK(lk_params_set(cfg_params, NP, &c, "trainer", "widths", "1,2"));
    CHECK(c.widths.n == 2 && c.widths.v[1] == 2);
    CHECK_ERR(lk_params_set(cfg_params, NP, &c, "trainer", "max_epoch", "3"), LK_STATUS_INVALID_ARGUMENT,
              "unknown key 'trainer.max_epoch' (did you mean 'max_epochs'?)");
    CHECK_ERR(lk_params_set(cfg_params, NP, &c, "trainer", "max_epochs", "many"), LK_STATUS_INVALID_ARGUMENT,
              "trainer.max_epochs: expected an integer, got 'many'");
    CHECK_ERR(lk_params_set(cfg_params, NP, &c, "trainer", "max_epochs", "0"), LK_STATUS_INVALID_ARGUMENT,
              "expected a value in [1, 1000], got '0'");
    CHECK_ERR(lk_params_set(cfg_params, NP, &c, "cb", "mode", "middle"), LK_STATUS_INVALID_ARGUMENT, "one of min|max");
    CHECK_ERR(lk_params_set(cfg_params, NP, &c, "x", "flag", "maybe"), LK_STATUS_INVALID_ARGUMENT, "true or false");
    CHECK(lk_params_set(cfg_params, NP, &c, "x", "zzzzzzzz", "1") && !strstr(lk_last_error(), "did you mean"));
    char buf[128];
    CHECK(!strcmp(lk_params_format(&cfg_params[2], &c, buf, sizeof buf), "0.001"));
    CHECK(!strcmp(lk_params_format(&cfg_params[5], &c, buf, sizeof buf), "[1, 2]"));
    /* Lightning's int-or-float flags: 1 is one batch, 1.0 the whole epoch */
    CHECK(!c.limit.is_count && c.limit.value == 1.0);
    CHECK_OK(lk_params_set(cfg_params, NP, &c, "trainer", "limit", "1"));
    CHECK(c.limit.is_count && c.limit.value == 1.0);
    CHECK(!strcmp(lk_params_format(&cfg_params[6], &c, buf, sizeof buf), "1"));
    CHECK_OK(lk_params_set(cfg_params, NP, &c, "trainer", "limit", "0.25"));
    CHECK(!c.limit.is_count && c.limit.value == 0.25);
    CHECK(!strcmp(lk_params_format(&cfg_params[6], &c, buf, sizeof buf), "0.25"));
    CHECK_ERR(lk_params_set(cfg_params, NP, &c, "trainer", "limit", "1.5"), LK_STATUS_INVALID_ARGUMENT,
              "expected an integer count or a fraction in [0.0, 1.0], got '1.5'");
    c.lr = 0.1 + 0.2; /* formatting must read back exactly */
    CHECK(strtod(lk_params_format(&cfg_params[2], &c, buf, sizeof buf), NULL) == c.lr);
}

LK_TEST_MAIN(LK_TEST_CASE(param_tables), LK_TEST_CASE(philox_known_answers), LK_TEST_CASE(rng_distributions), LK_TEST_CASE(rng_fill_normal), LK_TEST_CASE(rng_skip),
             LK_TEST_CASE(errors),
             LK_TEST_CASE(alloc_failure_hook), LK_TEST_CASE(arena))

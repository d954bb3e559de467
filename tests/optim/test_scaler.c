/* The fp16 loss scaler against torch.cuda.amp.GradScaler (1.13): the update
 * rule (halve on an overflow, grow after growth_interval clean steps, the
 * tracker's resets, f32 rounding of odd factors from
 * tools/grad_scaler_reference.py, no growth past f32), unscale (the f32
 * reciprocal, inf and NaN found in the same pass, every gradient unscaled),
 * that a step skipped on found_inf leaves parameters and optimizer state
 * untouched, the state round trip and PyTorch's argument checks. */
#include <float.h>

#include "lk_test.h"

static lk_grad_scaler *make(double init, double growth, double backoff, int64_t interval) {
    lk_grad_scaler_config c = lk_grad_scaler_config_default();
    c.init_scale = init, c.growth_factor = growth, c.backoff_factor = backoff, c.growth_interval = interval;
    lk_grad_scaler *s = NULL;
    CHECK_OK(lk_grad_scaler_create(&c, &s));
    return s;
}

static void scaler_defaults(void) {
    lk_grad_scaler_config c = lk_grad_scaler_config_default();
    CHECK(c.init_scale == 65536.0 && c.growth_factor == 2.0 && c.backoff_factor == 0.5 && c.growth_interval == 2000);
    CHECK(c.enabled);
    lk_grad_scaler *s = NULL;
    CHECK_OK(lk_grad_scaler_create(&c, &s));
    CHECK(lk_grad_scaler_scale(s) == 65536.0f);
    /* 1999 clean steps keep 2^16; the 2000th doubles it */
    for (int i = 0; i < 1999; i++) CHECK_OK(lk_grad_scaler_update(s, false));
    CHECK(lk_grad_scaler_scale(s) == 65536.0f && lk_grad_scaler_growth_tracker(s) == 1999);
    CHECK_OK(lk_grad_scaler_update(s, false));
    CHECK(lk_grad_scaler_scale(s) == 131072.0f && lk_grad_scaler_growth_tracker(s) == 0);
    lk_grad_scaler_free(s);
    lk_grad_scaler_free(NULL);
}

static void scaler_update_rule(void) {
    lk_grad_scaler *s = make(8.0, 2.0, 0.5, 3);
    /* clean, clean, inf (tracker resets before growth), clean x3 (grows), inf, inf */
    static const bool inf[] = {0, 0, 1, 0, 0, 0, 1, 1, 0};
    static const float want_scale[] = {8, 8, 4, 4, 4, 8, 4, 2, 2};
    static const int want_tracker[] = {1, 2, 0, 1, 2, 0, 0, 0, 1};
    for (int i = 0; i < 9; i++) {
        CHECK_OK(lk_grad_scaler_update(s, inf[i]));
        CHECK_MSG(lk_grad_scaler_scale(s) == want_scale[i] && lk_grad_scaler_growth_tracker(s) == want_tracker[i],
                  "step %d: scale %g tracker %lld, expected %g %d", i, (double)lk_grad_scaler_scale(s),
                  (long long)lk_grad_scaler_growth_tracker(s), (double)want_scale[i], want_tracker[i]);
    }
    lk_grad_scaler_free(s);

    /* Odd factors: each product rounded to f32 (python3 tools/grad_scaler_reference.py). */
    static const bool odd_inf[] = {0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0};
    static const struct { float scale; int tracker; } odd[] = {
        {1.234567017e+03f, 1}, {2.098763916e+03f, 0}, {2.098763916e+03f, 1}, {6.296291504e+02f, 0},
        {6.296291504e+02f, 1}, {1.070369507e+03f, 0}, {3.211108398e+02f, 0}, {9.633325195e+01f, 0},
        {9.633325195e+01f, 1}, {1.637665253e+02f, 0}, {1.637665253e+02f, 1}, {2.784031067e+02f, 0},
    };
    s = make(1234.567, 1.7, 0.3, 2);
    for (int i = 0; i < 12; i++) {
        CHECK_OK(lk_grad_scaler_update(s, odd_inf[i]));
        CHECK_MSG(lk_grad_scaler_scale(s) == odd[i].scale && lk_grad_scaler_growth_tracker(s) == odd[i].tracker,
                  "odd step %d: scale %.9e tracker %lld, the reference gives %.9e %d", i, (double)lk_grad_scaler_scale(s),
                  (long long)lk_grad_scaler_growth_tracker(s), (double)odd[i].scale, odd[i].tracker);
    }
    lk_grad_scaler_free(s);

    /* No growth past f32: the scale stays, the tracker still resets. */
    s = make(FLT_MAX / 1.5, 2.0, 0.5, 1);
    float before = lk_grad_scaler_scale(s);
    CHECK_OK(lk_grad_scaler_update(s, false));
    CHECK(lk_grad_scaler_scale(s) == before && lk_grad_scaler_growth_tracker(s) == 0);
    lk_grad_scaler_free(s);
}

static lk_tensor *param(const float *v, int64_t n, const float *g) {
    lk_tensor *p = lk_tensor_from_data(LK_F32, 1, &n, v);
    lk_tensor_set_requires_grad(p, true);
    p->grad = lk_tensor_from_data(LK_F32, 1, &n, g);
    return p;
}

static void scaler_unscale(void) {
    lk_grad_scaler *s = make(1234.567, 2.0, 0.5, 2000);
    const float inv = 8.100005798e-04f; /* (float)(1.0 / (double)(float)1234.567), as PyTorch's reciprocal */
    float v[5] = {0}, g1[5] = {1.0f, -2.5f, 1e6f, 0.0f, 3e-3f}, g2[3] = {7.0f, 8.0f, 9.0f};
    lk_tensor *a = param(v, 5, g1), *b = param(v, 3, g2), *c = param(v, 2, g1);
    lk_tensor_release(c->grad);
    c->grad = NULL; /* no gradient: skipped, as in PyTorch */
    lk_named_tensors ps = {0};
    lk_named_tensors_append(&ps, "a", a);
    lk_named_tensors_append(&ps, "c", c);
    lk_named_tensors_append(&ps, "b", b);
    bool found = true;
    CHECK_OK(lk_grad_scaler_unscale(s, &ps, &found));
    CHECK(!found);
    for (int k = 0; k < 5; k++) CHECK(((float *)a->grad->data)[k] == g1[k] * inv);
    for (int k = 0; k < 3; k++) CHECK(((float *)b->grad->data)[k] == g2[k] * inv);
    /* once per step */
    CHECK_ERR(lk_grad_scaler_unscale(s, &ps, &found), LK_STATUS_INVALID_USAGE,
              "unscale has already been called since the last update");
    CHECK_OK(lk_grad_scaler_update(s, found));

    /* inf in one gradient, NaN in another: found, and every other element still unscaled */
    const float specials[2] = {INFINITY, NAN};
    for (int t = 0; t < 2; t++) {
        memcpy(a->grad->data, g1, sizeof g1);
        memcpy(b->grad->data, g2, sizeof g2);
        ((float *)b->grad->data)[t + 1] = specials[t];
        found = false;
        float inv_t = (float)(1.0 / (double)lk_grad_scaler_scale(s)); /* t = 1: the halved scale */
        CHECK_OK(lk_grad_scaler_unscale(s, &ps, &found));
        CHECK_MSG(found, "a %s gradient was not found", t ? "NaN" : "inf");
        for (int k = 0; k < 5; k++) CHECK(((float *)a->grad->data)[k] == g1[k] * inv_t);
        CHECK(((float *)b->grad->data)[0] == g2[0] * inv_t);
        CHECK(!isfinite(((float *)b->grad->data)[t + 1]));
        CHECK_OK(lk_grad_scaler_update(s, found));
    }
    CHECK(lk_grad_scaler_scale(s) == (float)1234.567 / 4);
    /* -inf, and the overflow sits in a long tensor's tail (past any block) */
    int64_t n = 10001;
    lk_tensor *big = lk_tensor_zeros(LK_F32, 1, &n);
    lk_tensor_set_requires_grad(big, true);
    big->grad = lk_tensor_zeros(LK_F32, 1, &n);
    ((float *)big->grad->data)[n - 1] = -INFINITY;
    lk_named_tensors one = {0};
    lk_named_tensors_append(&one, "big", big);
    CHECK_OK(lk_grad_scaler_unscale(s, &one, &found));
    CHECK(found);
    lk_named_tensors_clear(&one);
    lk_tensor_release(big);

    /* a disabled scaler: scale 1, nothing touched */
    lk_grad_scaler_config dc = lk_grad_scaler_config_default();
    dc.enabled = false;
    dc.growth_factor = 0.5; /* not checked when disabled, as in PyTorch */
    lk_grad_scaler *d = NULL;
    CHECK_OK(lk_grad_scaler_create(&dc, &d));
    CHECK(lk_grad_scaler_scale(d) == 1.0f && !lk_grad_scaler_is_enabled(d));
    memcpy(a->grad->data, g1, sizeof g1);
    CHECK_OK(lk_grad_scaler_unscale(d, &ps, &found));
    CHECK(!found && ((float *)a->grad->data)[1] == g1[1]);
    lk_named_tensors st = {0};
    CHECK_OK(lk_grad_scaler_state_get(d, &st));
    CHECK(st.n == 0);
    lk_grad_scaler_free(d);

    lk_named_tensors_clear(&ps);
    lk_tensor_release(a);
    lk_tensor_release(b);
    lk_tensor_release(c);
    lk_grad_scaler_free(s);
}

/* The protocol a trainer follows: on found_inf the optimizer step is not
 * taken, so parameters and Adam's state (its step count too) stay. */
static void scaler_skipped_step_leaves_parameters(void) {
    float v[4] = {1.0f, -2.0f, 0.5f, 0.25f}, g[4] = {0.1f, 0.2f, -0.3f, 0.4f};
    lk_tensor *p = param(v, 4, g);
    lk_named_tensors ps = {0};
    lk_named_tensors_append(&ps, "w", p);
    lk_optim_config oc = lk_adam_config_default();
    lk_optimizer *o = NULL;
    CHECK_OK(lk_optimizer_create(&oc, &ps, &o));
    lk_grad_scaler *s = make(65536.0, 2.0, 0.5, 2000);
    for (int step = 0; step < 3; step++) {
        for (int k = 0; k < 4; k++) ((float *)p->grad->data)[k] = g[k] * lk_grad_scaler_scale(s);
        if (step == 1) ((float *)p->grad->data)[2] = INFINITY; /* this step overflows */
        float before[4];
        memcpy(before, p->data, sizeof before);
        bool found;
        CHECK_OK(lk_grad_scaler_unscale(s, &ps, &found));
        CHECK(found == (step == 1));
        if (!found) {
            for (int k = 0; k < 4; k++) CHECK(((float *)p->grad->data)[k] == g[k]); /* 2^16 scales exactly */
            CHECK_OK(lk_optimizer_step(o));
        }
        CHECK_OK(lk_grad_scaler_update(s, found));
        CHECK(memcmp(before, p->data, sizeof before) != 0 || step == 1);
        if (step == 1) CHECK(!memcmp(before, p->data, sizeof before));
        lk_optimizer_zero_grad(o, false);
    }
    CHECK(lk_grad_scaler_scale(s) == 32768.0f && lk_grad_scaler_growth_tracker(s) == 1);
    lk_named_tensors st = {0};
    CHECK_OK(lk_optimizer_state_get(o, &st));
    const lk_tensor *steps = lk_named_tensors_find(&st, "state.w.step");
    CHECK(steps && lk_tensor_get(steps, 0) == 2.0); /* two steps taken, the skipped one not counted */
    lk_named_tensors_clear(&st);
    lk_optimizer_free(o);
    lk_named_tensors_clear(&ps);
    lk_tensor_release(p);
    lk_grad_scaler_free(s);
}

static void scaler_state_round_trip(void) {
    lk_grad_scaler *s = make(1024.0, 3.0, 0.25, 5);
    for (int i = 0; i < 3; i++) CHECK_OK(lk_grad_scaler_update(s, i == 0));
    lk_named_tensors st = {0};
    CHECK_OK(lk_grad_scaler_state_get(s, &st));
    CHECK(st.n == 5);
    const char *keys[5] = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"};
    const double want[5] = {256.0, 3.0, 0.25, 5, 2};
    for (int i = 0; i < 5; i++) {
        const lk_tensor *t = lk_named_tensors_find(&st, keys[i]);
        CHECK_MSG(t && lk_tensor_get(t, 0) == want[i], "state '%s' = %g, expected %g", keys[i], t ? lk_tensor_get(t, 0) : NAN,
                  want[i]);
        if (t) CHECK(t->dtype == (i >= 3 ? LK_I64 : LK_F64));
    }
    /* a fresh scaler with other settings takes them all from the state */
    lk_grad_scaler *r = make(65536.0, 2.0, 0.5, 2000);
    CHECK_OK(lk_grad_scaler_state_load(r, &st));
    for (int i = 0; i < 8; i++) {
        bool inf = i == 5;
        CHECK_OK(lk_grad_scaler_update(s, inf));
        CHECK_OK(lk_grad_scaler_update(r, inf));
        CHECK(lk_grad_scaler_scale(r) == lk_grad_scaler_scale(s));
        CHECK(lk_grad_scaler_growth_tracker(r) == lk_grad_scaler_growth_tracker(s));
    }
    /* bad states change nothing */
    float keep = lk_grad_scaler_scale(r);
    lk_named_tensors bad = {0};
    CHECK_ERR(lk_grad_scaler_state_load(r, &bad), LK_STATUS_INVALID_ARGUMENT, "source state is empty");
    for (int i = 0; i < 4; i++) lk_named_tensors_append(&bad, st.items[i].name, st.items[i].tensor);
    CHECK_ERR(lk_grad_scaler_state_load(r, &bad), LK_STATUS_INVALID_ARGUMENT, "missing _growth_tracker");
    lk_tensor *x = lk_tensor_full(LK_F64, 0, NULL, 1.0);
    lk_named_tensors_append(&bad, "_growth_tracker", st.items[4].tensor);
    lk_named_tensors_append(&bad, "_scale_typo", x);
    CHECK_ERR(lk_grad_scaler_state_load(r, &bad), LK_STATUS_INVALID_ARGUMENT, "unexpected _scale_typo");
    lk_named_tensors_clear(&bad);
    lk_tensor *tr = lk_tensor_full(LK_I64, 0, NULL, 7.0); /* >= growth_interval 5 */
    for (int i = 0; i < 4; i++) lk_named_tensors_append(&bad, st.items[i].name, st.items[i].tensor);
    lk_named_tensors_append(&bad, "_growth_tracker", tr);
    CHECK_ERR(lk_grad_scaler_state_load(r, &bad), LK_STATUS_INVALID_ARGUMENT, "_growth_tracker 7 is not in");
    CHECK(lk_grad_scaler_scale(r) == keep);
    lk_named_tensors_clear(&bad);
    lk_tensor_release(tr);
    lk_tensor_release(x);
    lk_named_tensors_clear(&st);
    lk_grad_scaler_free(r);
    lk_grad_scaler_free(s);
}

static void scaler_checks(void) {
    lk_grad_scaler_config c = lk_grad_scaler_config_default();
    lk_grad_scaler *s = (lk_grad_scaler *)1;
    c.growth_factor = 1.0;
    CHECK_ERR(lk_grad_scaler_create(&c, &s), LK_STATUS_INVALID_ARGUMENT, "the growth factor must be > 1.0, got 1");
    CHECK(s == NULL);
    c = lk_grad_scaler_config_default();
    c.backoff_factor = 1.0;
    CHECK_ERR(lk_grad_scaler_create(&c, &s), LK_STATUS_INVALID_ARGUMENT, "the backoff factor must be < 1.0");
    c = lk_grad_scaler_config_default();
    c.growth_interval = 0;
    CHECK_ERR(lk_grad_scaler_create(&c, &s), LK_STATUS_INVALID_ARGUMENT, "growth_interval must be a positive integer, got 0");
    c = lk_grad_scaler_config_default();
    c.init_scale = 1e39;
    CHECK_ERR(lk_grad_scaler_create(&c, &s), LK_STATUS_INVALID_ARGUMENT, "init_scale must be a positive finite float32");
}

LK_TEST_MAIN(LK_TEST_CASE(scaler_defaults), LK_TEST_CASE(scaler_update_rule), LK_TEST_CASE(scaler_unscale),
             LK_TEST_CASE(scaler_skipped_step_leaves_parameters), LK_TEST_CASE(scaler_state_round_trip),
             LK_TEST_CASE(scaler_checks))

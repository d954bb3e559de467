/* RMSprop against torch.optim.RMSprop's update (1.13, single tensor):
 * three steps, plain and with weight decay + momentum + centered, compared
 * bitwise with tools/rmsprop_reference.py (which follows PyTorch's ops one
 * by one in float32; no torch needed). Also its state names, a save/load
 * round trip in the middle and PyTorch's argument checks. */
#include "lk_test.h"

/* python3 tools/rmsprop_reference.py */
static const float expect_plain[3][4] = {
    {9.000000954e-01f, -1.899999976e+00f, 4.000000060e-01f, 9.999000281e-02f},
    {8.104678392e-01f, -1.810467720e+00f, 3.550986946e-01f, 1.895183027e-01f},
    {7.301174402e-01f, -1.730117321e+00f, 3.262892365e-01f, 2.698665857e-01f},
};
static const float expect_all[3][4] = {
    {9.666672349e-01f, -1.966666937e+00f, 4.666668177e-01f, 3.322258964e-02f},
    {9.205240011e-01f, -1.919980526e+00f, 4.330670834e-01f, 2.410338446e-02f},
    {8.695837259e-01f, -1.868213773e+00f, 4.041325450e-01f, 3.081425652e-02f},
};

static lk_tensor *make_param(void) {
    static const float p0[4] = {1.0f, -2.0f, 0.5f, 0.0f};
    int64_t shape[1] = {4};
    lk_tensor *p = lk_tensor_zeros(LK_F32, 1, shape);
    memcpy(p->data, p0, sizeof p0);
    lk_tensor_set_requires_grad(p, true);
    p->grad = lk_tensor_zeros(LK_F32, 1, shape);
    return p;
}

static void set_grad(lk_tensor *p, int t) {
    float *g = p->grad->data;
    g[0] = (float)(0.1 * (t + 1)), g[1] = (float)(-0.3 * (t + 1)), g[2] = (float)(0.7 / (t + 1));
    g[3] = (float)(-1e-3 * (t + 1));
}

/* Runs 3 steps; with reload, the state goes through state_get/state_load
 * into a fresh optimizer after step 1. */
static void run(const char *name, const lk_optim_config *cfg, const float expect[3][4], bool reload) {
    lk_tensor *p = make_param();
    lk_named_tensors ps = {0};
    lk_named_tensors_append(&ps, "w", p);
    lk_optimizer *o = NULL;
    CHECK_OK(lk_optimizer_create(cfg, &ps, &o));
    for (int t = 0; t < 3 && o; t++) {
        set_grad(p, t);
        CHECK_OK(lk_optimizer_step(o));
        const float *d = p->data;
        for (int i = 0; i < 4; i++)
            CHECK_MSG(d[i] == expect[t][i], "%s step %d [%d]: %.9e, PyTorch's formula gives %.9e (diff %.3g)", name,
                      t + 1, i, (double)d[i], (double)expect[t][i], (double)(d[i] - expect[t][i]));
        if (reload && t == 0) {
            lk_named_tensors st = {0};
            CHECK_OK(lk_optimizer_state_get(o, &st));
            CHECK(lk_named_tensors_find(&st, "state.w.square_avg") != NULL);
            CHECK((lk_named_tensors_find(&st, "state.w.momentum_buffer") != NULL) == (cfg->momentum > 0));
            CHECK((lk_named_tensors_find(&st, "state.w.grad_avg") != NULL) == cfg->centered);
            CHECK(lk_named_tensors_find(&st, "param_groups.0.alpha") != NULL);
            lk_optimizer *o2 = NULL;
            CHECK_OK(lk_optimizer_create(cfg, &ps, &o2));
            CHECK_OK(lk_optimizer_state_load(o2, &st));
            lk_named_tensors_clear(&st);
            lk_optimizer_free(o);
            o = o2;
        }
    }
    lk_optimizer_free(o);
    lk_named_tensors_clear(&ps);
    lk_tensor_release(p);
}

static void rmsprop_matches_pytorch(void) {
    lk_optim_config c;
    CHECK_OK(lk_optim_config_for("RMSprop", &c));
    CHECK(c.kind == LK_OPTIM_RMSPROP && c.lr == 1e-2 && c.alpha == 0.99 && c.eps == 1e-8 && !c.centered);
    run("plain", &c, expect_plain, false);
    run("plain, reloaded after step 1", &c, expect_plain, true);
    c.alpha = 0.9, c.eps = 1e-6, c.weight_decay = 0.1, c.momentum = 0.5, c.centered = true;
    run("momentum+centered+wd", &c, expect_all, false);
    run("momentum+centered+wd, reloaded after step 1", &c, expect_all, true);
}

static void rmsprop_checks(void) {
    lk_optim_config c = lk_rmsprop_config_default();
    c.alpha = -0.1;
    CHECK_ERR(lk_optim_config_validate(&c), LK_STATUS_INVALID_ARGUMENT, "RMSprop: Invalid alpha value: -0.1");
    c = lk_rmsprop_config_default();
    c.momentum = -1;
    CHECK_ERR(lk_optim_config_validate(&c), LK_STATUS_INVALID_ARGUMENT, "RMSprop: Invalid momentum value: -1");
    c = lk_rmsprop_config_default();
    c.eps = -1;
    CHECK_ERR(lk_optim_config_validate(&c), LK_STATUS_INVALID_ARGUMENT, "RMSprop: Invalid epsilon value: -1");
}

LK_TEST_MAIN(LK_TEST_CASE(rmsprop_matches_pytorch), LK_TEST_CASE(rmsprop_checks))

/* optim: SGD/Adam/AdamW trajectories over 100 steps against PyTorch 1.13
 * (fixtures from tools/gen_nn_fixtures.py; tolerance 1e-6 for SGD and 1e-5
 * for Adam/AdamW, normwise relative, as the issue sets them), the same over
 * flattened parameters, parameter groups, state save/load mid-run, every
 * scheduler's lr (and momentum) sequence, zero_grad, gradient clipping and
 * PyTorch's hyperparameter checks. */
#include <time.h>

#include "nn/nn_fixtures.h"
#include "optim/optim_impl.h"

#define N_STEPS 100
static const int64_t P0_SHAPE[2] = {3, 4}, P1_SHAPE[1] = {5};

static void make_params(lk_named_tensors *ps) {
    lk_tensor *p0 = nn_htensor(1, -1, 1, 2, P0_SHAPE), *p1 = nn_htensor(2, -1, 1, 1, P1_SHAPE);
    lk_tensor_set_requires_grad(p0, true);
    lk_tensor_set_requires_grad(p1, true);
    lk_named_tensors_append(ps, "p0", p0);
    lk_named_tensors_append(ps, "p1", p1);
    lk_tensor_release(p0);
    lk_tensor_release(p1);
}

/* g = hvals(10000 + 7 step + k) + 0.5 p, written into the existing .grad
 * (allocated on first use), as the generator does. */
static void set_grads(lk_named_tensors *ps, int step) {
    for (int k = 0; k < ps->n; k++) {
        lk_tensor *p = ps->items[k].tensor;
        if (!p->grad) p->grad = lk_tensor_zeros(LK_F32, p->ndim, p->shape);
        float *g = p->grad->data, *d = p->data;
        for (int64_t i = 0; i < p->numel; i++) g[i] = nn_hval(10000 + 7 * (uint64_t)step + (uint64_t)k, (uint64_t)i, -1, 1) + 0.5f * d[i];
    }
}

typedef struct {
    const char *name;
    lk_optim_config cfg;
    double tol;
} opt_case;

static int opt_cases(opt_case *c) {
    int n = 0;
    lk_optim_config s = lk_sgd_config_default(), a = lk_adam_config_default(), w = lk_adamw_config_default();
    c[n++] = (opt_case){"sgd", s, 1e-6};
    c[n - 1].cfg.lr = 0.1;
    c[n++] = (opt_case){"sgd_momentum", s, 1e-6};
    c[n - 1].cfg.lr = 0.05, c[n - 1].cfg.momentum = 0.9, c[n - 1].cfg.dampening = 0.1, c[n - 1].cfg.weight_decay = 0.01;
    c[n++] = (opt_case){"sgd_nesterov", s, 1e-6};
    c[n - 1].cfg.lr = 0.05, c[n - 1].cfg.momentum = 0.9, c[n - 1].cfg.nesterov = true, c[n - 1].cfg.weight_decay = 1e-3;
    c[n++] = (opt_case){"sgd_maximize", s, 1e-6};
    c[n - 1].cfg.lr = 0.01, c[n - 1].cfg.momentum = 0.5, c[n - 1].cfg.maximize = true;
    c[n++] = (opt_case){"adam", a, 1e-5};
    c[n - 1].cfg.lr = 1e-2;
    c[n++] = (opt_case){"adam_wd_amsgrad", a, 1e-5};
    c[n - 1].cfg.lr = 1e-2, c[n - 1].cfg.weight_decay = 0.1, c[n - 1].cfg.amsgrad = true;
    c[n++] = (opt_case){"adamw", w, 1e-5};
    c[n - 1].cfg.lr = 1e-2, c[n - 1].cfg.weight_decay = 0.05;
    c[n++] = (opt_case){"adamw_amsgrad", w, 1e-5};
    c[n - 1].cfg.lr = 5e-3, c[n - 1].cfg.beta1 = 0.8, c[n - 1].cfg.beta2 = 0.99, c[n - 1].cfg.eps = 1e-6,
              c[n - 1].cfg.amsgrad = true;
    return n;
}

/* Compares step `step` of the trajectory fixture with the parameters. */
static bool check_traj(const char *name, int step, const lk_tensor *traj, const lk_named_tensors *ps, double tol) {
    int64_t n = traj->shape[1];
    lk_tensor *got = lk_tensor_empty(LK_F32, 1, &n);
    int64_t off = 0;
    for (int k = 0; k < ps->n; k++) {
        memcpy((float *)got->data + off, ps->items[k].tensor->data, (size_t)ps->items[k].tensor->numel * sizeof(float));
        off += ps->items[k].tensor->numel;
    }
    lk_tensor *want = lk_tensor_from_data(LK_F32, 1, &n, (float *)traj->data + step * n);
    char what[128];
    snprintf(what, sizeof what, "%s step %d", name, step + 1);
    bool ok = nn_check_close(what, got, want, tol);
    lk_tensor_release(got);
    lk_tensor_release(want);
    return ok;
}

static void run_opt(const char *name, const lk_optim_config *cfg, double tol, bool flat, bool groups, int save_at) {
    char fx[128];
    snprintf(fx, sizeof fx, "optim.%s.traj", name);
    lk_tensor *traj = nn_fixture(fx);
    if (!traj) return;
    lk_named_tensors ps = {0};
    lk_layer *holder = NULL;
    lk_tensor *fp = NULL, *fg = NULL;
    make_params(&ps);
    if (flat) {
        /* The same two tensors as parameters of a layer, flattened into one buffer. */
        holder = lk_layer_create("Holder", NULL, NULL, NULL);
        lk_layer_add_parameter(holder, "p0", lk_tensor_retain(ps.items[0].tensor));
        lk_layer_add_parameter(holder, "p1", lk_tensor_retain(ps.items[1].tensor));
        lk_named_tensors_clear(&ps);
        CHECK_OK(lk_params_flatten(holder, NULL, &fp, &fg));
        CHECK_OK(lk_layer_named_parameters(holder, &ps));
    }
    lk_optimizer *o = NULL;
    if (groups) {
        lk_named_tensors g0 = {0}, g1 = {0};
        lk_named_tensors_append(&g0, "p0", ps.items[0].tensor);
        lk_named_tensors_append(&g1, "p1", ps.items[1].tensor);
        CHECK_OK(lk_optimizer_create(cfg, &g0, &o));
        CHECK_OK(lk_optimizer_set_lr(o, 0, 1e-2));
        CHECK_OK(lk_optimizer_add_param_group(o, &g1, 1e-3, 0.1));
        CHECK_ERR(lk_optimizer_add_param_group(o, &g1, NAN, NAN), LK_STATUS_INVALID_ARGUMENT, "more than one parameter group");
        lk_named_tensors_clear(&g0);
        lk_named_tensors_clear(&g1);
    } else {
        CHECK_OK(lk_optimizer_create(cfg, &ps, &o));
    }
    bool ok = o != NULL;
    for (int step = 0; step < N_STEPS && ok; step++) {
        set_grads(&ps, step);
        CHECK_OK(lk_optimizer_step(o));
        ok = check_traj(name, step, traj, &ps, tol);
        if (step + 1 == save_at) {
            /* Continue in a fresh optimizer from the saved state. */
            lk_named_tensors st = {0};
            CHECK_OK(lk_optimizer_state_get(o, &st));
            lk_optimizer_free(o);
            lk_optim_config other = *cfg;
            other.lr = 123; /* restored by the load */
            CHECK_OK(lk_optimizer_create(&other, &ps, &o));
            CHECK_OK(lk_optimizer_state_load(o, &st));
            CHECK_NEAR(lk_optimizer_get_lr(o, 0), cfg->lr, 0);
            lk_named_tensors_clear(&st);
        }
    }
    if (flat) CHECK(fp && (float *)ps.items[1].tensor->data == (float *)fp->data + 12);
    lk_optimizer_zero_grad(o, true);
    for (int k = 0; k < ps.n; k++)
        CHECK_MSG(flat ? (ps.items[k].tensor->grad && lk_tensor_get(ps.items[k].tensor->grad, 0) == 0) : !ps.items[k].tensor->grad,
                  "%s: zero_grad(set_to_none) with%s flat gradients", name, flat ? "" : "out");
    lk_optimizer_free(o);
    lk_named_tensors_clear(&ps);
    lk_layer_free(holder);
    lk_tensor_release(fp);
    lk_tensor_release(fg);
    lk_tensor_release(traj);
}

static void optimizer_parity(void) {
    opt_case c[16];
    int n = opt_cases(c);
    for (int i = 0; i < n; i++) run_opt(c[i].name, &c[i].cfg, c[i].tol, false, false, 0);
}

static void optimizer_parity_flat(void) {
    opt_case c[16];
    int n = opt_cases(c);
    for (int i = 0; i < n; i++) run_opt(c[i].name, &c[i].cfg, c[i].tol, true, false, 0);
}

/* A flat group large enough to be cut across threads updates bitwise the
 * same with 1, 2 or 3 compute threads, for every optimizer, whether the
 * trainer woke the threads ahead of the step (lk__optimizer_prewake, some of
 * them after a pause long enough for the workers to have parked) or not. */
static void flat_update_any_threads(void) {
    opt_case cases[16];
    int nc = opt_cases(cases);
    static const int64_t big[2] = {300, 501}, small[1] = {77}; /* 150,377 elements: not a multiple of 16 */
    for (int c = 0; c < nc; c++) {
        lk_tensor *result[3] = {NULL};
        for (int threads = 1; threads <= 3; threads++) {
            lk_set_num_threads(threads);
            lk_layer *holder = lk_layer_create("Holder", NULL, NULL, NULL);
            lk_tensor *a = nn_htensor(3, -1, 1, 2, big), *b = nn_htensor(4, -1, 1, 1, small);
            lk_tensor_set_requires_grad(a, true);
            lk_tensor_set_requires_grad(b, true);
            lk_layer_add_parameter(holder, "a", a);
            lk_layer_add_parameter(holder, "b", b);
            lk_tensor *fp = NULL, *fg = NULL;
            lk_named_tensors ps = {0};
            lk_optimizer *o = NULL;
            CHECK_OK(lk_params_flatten(holder, NULL, &fp, &fg));
            CHECK_OK(lk_layer_named_parameters(holder, &ps));
            CHECK_OK(lk_optimizer_create(&cases[c].cfg, &ps, &o));
            for (int step = 0; step < 4 && o; step++) {
                set_grads(&ps, step);
                if (step == 2) nanosleep(&(struct timespec){0, 2000000}, NULL); /* 2 ms: the workers park */
                if (step >= 1) lk__optimizer_prewake(o);
                CHECK_OK(lk_optimizer_step(o));
            }
            result[threads - 1] = fp ? lk_tensor_clone(fp) : NULL;
            lk_optimizer_free(o);
            lk_named_tensors_clear(&ps);
            lk_layer_free(holder);
            lk_tensor_release(fp);
            lk_tensor_release(fg);
        }
        for (int t = 1; t < 3; t++)
            CHECK_MSG(result[0] && result[t] && !memcmp(result[0]->data, result[t]->data, (size_t)result[0]->numel * 4),
                      "%s: %d threads differ from 1", cases[c].name, t + 1);
        for (int t = 0; t < 3; t++) lk_tensor_release(result[t]);
    }
    lk_set_num_threads(2);
}

static void optimizer_groups(void) {
    lk_optim_config a = lk_adam_config_default();
    a.lr = 5e-3;
    run_opt("adam_groups", &a, 1e-5, false, true, 0);
}

static void optimizer_state_resume(void) {
    opt_case c[16];
    int n = opt_cases(c);
    for (int i = 0; i < n; i++) run_opt(c[i].name, &c[i].cfg, c[i].tol, false, false, 37);
    /* bad state: unknown parameter, wrong shape */
    lk_named_tensors ps = {0}, st = {0};
    make_params(&ps);
    lk_optimizer *o;
    lk_optim_config cfg = lk_adam_config_default();
    CHECK_OK(lk_optimizer_create(&cfg, &ps, &o));
    lk_tensor *w = lk_tensor_zeros(LK_F32, LK_SHAPE(2, 2)), *s = lk_tensor_zeros(LK_I64, 0, NULL);
    lk_named_tensors_append(&st, "state.p0.exp_avg", w);
    lk_named_tensors_append(&st, "state.q.step", s);
    CHECK_ERR(lk_optimizer_state_load(o, &st), LK_STATUS_INVALID_ARGUMENT, "state.p0.exp_avg: shape [2, 2], expected [3, 4]");
    CHECK(strstr(lk_last_error(), "state.q.step: no parameter"));
    lk_tensor_release(w);
    lk_tensor_release(s);
    lk_named_tensors_clear(&st);
    lk_named_tensors_clear(&ps);
    lk_optimizer_free(o);
}

static void invalid_hyperparameters(void) {
    lk_named_tensors ps = {0};
    make_params(&ps);
    lk_optimizer *o = NULL;
    lk_optim_config c = lk_sgd_config_default();
    c.lr = -0.1;
    CHECK_ERR(lk_optimizer_create(&c, &ps, &o), LK_STATUS_INVALID_ARGUMENT, "Invalid learning rate: -0.1");
    c = lk_sgd_config_default();
    c.nesterov = true;
    CHECK_ERR(lk_optimizer_create(&c, &ps, &o), LK_STATUS_INVALID_ARGUMENT, "Nesterov momentum requires a momentum and zero dampening");
    c.momentum = 0.9, c.dampening = 0.1;
    CHECK_ERR(lk_optimizer_create(&c, &ps, &o), LK_STATUS_INVALID_ARGUMENT, "zero dampening");
    c = lk_sgd_config_default();
    c.momentum = -1;
    CHECK_ERR(lk_optimizer_create(&c, &ps, &o), LK_STATUS_INVALID_ARGUMENT, "Invalid momentum value");
    c = lk_sgd_config_default();
    c.weight_decay = -1e-4;
    CHECK_ERR(lk_optimizer_create(&c, &ps, &o), LK_STATUS_INVALID_ARGUMENT, "Invalid weight_decay value");
    c = lk_adam_config_default();
    c.beta1 = 1.0;
    CHECK_ERR(lk_optimizer_create(&c, &ps, &o), LK_STATUS_INVALID_ARGUMENT, "Invalid beta parameter at index 0: 1");
    c = lk_adamw_config_default();
    c.beta2 = -0.5;
    CHECK_ERR(lk_optimizer_create(&c, &ps, &o), LK_STATUS_INVALID_ARGUMENT, "Invalid beta parameter at index 1: -0.5");
    c = lk_adam_config_default();
    c.eps = -1e-8;
    CHECK_ERR(lk_optimizer_create(&c, &ps, &o), LK_STATUS_INVALID_ARGUMENT, "Invalid epsilon value");
    CHECK(o == NULL);
    CHECK_ERR(lk_optim_config_for("adagrad", &c), LK_STATUS_INVALID_ARGUMENT, "expected sgd, adam, adamw or rmsprop");
    CHECK_OK(lk_optim_config_for("AdamW", &c));
    CHECK(c.kind == LK_OPTIM_ADAMW && c.weight_decay == 1e-2 && c.lr == 1e-3);
    lk_named_tensors empty = {0};
    c = lk_adam_config_default();
    CHECK_ERR(lk_optimizer_create(&c, &empty, &o), LK_STATUS_INVALID_ARGUMENT, "empty parameter list");
    CHECK_OK(lk_optimizer_create(&c, &ps, &o));
    CHECK_ERR(lk_optimizer_set_lr(o, 0, -1), LK_STATUS_INVALID_ARGUMENT, "Invalid learning rate");
    CHECK_ERR(lk_optimizer_set_lr(o, 3, 1), LK_STATUS_INVALID_ARGUMENT, "no parameter group 3");
    lk_optimizer_free(o);
    lk_optimizer_free(NULL);
    lk_named_tensors_clear(&ps);
}

/* ---- schedulers ----------------------------------------------------------------------------- */

typedef enum { SK_STEP, SK_MULTI, SK_EXP, SK_COS, SK_LIN, SK_SEQ, SK_ONE, SK_ONE3, SK_PLAT } sk;

static lk_status make_sched(sk k, lk_optimizer *o, lk_scheduler **s) {
    switch (k) {
    case SK_STEP: return lk_step_lr_create(o, 7, 0.5, s);
    case SK_MULTI: return lk_multistep_lr_create(o, (int[]){10, 30, 30, 60}, 4, 0.3, s);
    case SK_EXP: return lk_exponential_lr_create(o, 0.97, s);
    case SK_COS: return lk_cosine_annealing_lr_create(o, 30, 0.001, s);
    case SK_LIN: return lk_linear_lr_create(o, 0.25, 1.0, 10, s);
    case SK_SEQ: {
        lk_scheduler *a = NULL, *b = NULL;
        LK_TRY(lk_linear_lr_create(o, 0.1, 1.0, 10, &a));
        LK_TRY(lk_cosine_annealing_lr_create(o, 90, 0.0, &b));
        return lk_sequential_lr_create(o, (lk_scheduler *[]){a, b}, 2, (int[]){10}, s);
    }
    case SK_ONE: return lk_one_cycle_lr_create(o, &(lk_one_cycle_config){1.0, 100, 0.3, false, true, 0.85, 0.95, 25, 1e4, false}, s);
    case SK_ONE3: {
        lk_one_cycle_config c = lk_one_cycle_config_default(0.01, 101);
        c.three_phase = true;
        c.anneal_linear = true;
        return lk_one_cycle_lr_create(o, &c, s);
    }
    case SK_PLAT: {
        lk_plateau_config c = lk_plateau_config_default();
        c.factor = 0.5, c.patience = 3, c.cooldown = 2, c.min_lr = 1e-3;
        return lk_reduce_lr_on_plateau_create(o, &c, s);
    }
    }
    return LK_STATUS_INTERNAL;
}

static double plateau_metric(int s) { return s < 20 ? 1.0 / (1 + s) : 0.05 + 0.001 * ((s * 7) % 5); }

static void run_sched(const char *name, sk k, bool resume) {
    char fx[128];
    snprintf(fx, sizeof fx, "sched.%s.lr", name);
    lk_tensor *lrs = nn_fixture(fx);
    snprintf(fx, sizeof fx, "sched.%s.mom", name);
    lk_tensor *moms = nn_fixture(fx);
    if (!lrs || !moms) return;
    lk_named_tensors ps = {0};
    make_params(&ps);
    lk_optim_config c = k == SK_ONE3 ? lk_adam_config_default() : lk_sgd_config_default();
    if (k == SK_ONE3) c.lr = 0.01;
    else c.lr = 0.1, c.momentum = 0.9;
    lk_optimizer *o = NULL;
    lk_scheduler *s = NULL;
    CHECK_OK(lk_optimizer_create(&c, &ps, &o));
    CHECK_OK(make_sched(k, o, &s));
    if (!s) goto done;
    double worst = 0;
    int bad_at = -1;
    for (int step = 0; step <= N_STEPS; step++) {
        if (step > 0) {
            if (k == SK_PLAT) CHECK_OK(lk_scheduler_step_metric(s, plateau_metric(step - 1)));
            else CHECK_OK(lk_scheduler_step(s));
        }
        if (resume && step == 45) {
            /* Save, rebuild optimizer + scheduler, load both, go on. */
            lk_named_tensors os = {0}, ss = {0};
            CHECK_OK(lk_optimizer_state_get(o, &os));
            CHECK_OK(lk_scheduler_state_get(s, &ss));
            lk_scheduler_free(s);
            lk_optimizer_free(o);
            CHECK_OK(lk_optimizer_create(&c, &ps, &o));
            CHECK_OK(make_sched(k, o, &s));
            CHECK_OK(lk_optimizer_state_load(o, &os));
            CHECK_OK(lk_scheduler_state_load(s, &ss));
            lk_named_tensors_clear(&os);
            lk_named_tensors_clear(&ss);
        }
        double want = lk_tensor_get(lrs, step), got = lk_optimizer_get_lr(o, 0);
        double wm = lk_tensor_get(moms, step), gm = lk_optimizer_get_momentum(o, 0);
        double e = fmax(fabs(got - want) / fmax(fabs(want), 1e-300), fabs(gm - wm) / fmax(fabs(wm), 1e-300));
        if (got == want && gm == wm) e = 0;
        if (e > worst) worst = e, bad_at = step;
        CHECK(lk_scheduler_last_lr(s, 0) == got);
    }
    /* PyTorch runs the same recursive double arithmetic: allow a few ulps. */
    CHECK_MSG(worst <= 1e-12, "scheduler %s%s: relative error %.3g at step %d", name, resume ? " (resumed)" : "", worst, bad_at);
done:
    lk_scheduler_free(s);
    lk_optimizer_free(o);
    lk_named_tensors_clear(&ps);
    lk_tensor_release(lrs);
    lk_tensor_release(moms);
}

static const struct {
    const char *name;
    sk k;
} sched_cases[] = {{"step", SK_STEP},     {"multistep", SK_MULTI}, {"exponential", SK_EXP},
                   {"cosine", SK_COS},    {"linear", SK_LIN},      {"sequential", SK_SEQ},
                   {"onecycle", SK_ONE},  {"onecycle_adam3", SK_ONE3}, {"plateau", SK_PLAT}};

static void scheduler_parity(void) {
    for (size_t i = 0; i < sizeof sched_cases / sizeof sched_cases[0]; i++) run_sched(sched_cases[i].name, sched_cases[i].k, false);
}

static void scheduler_resume(void) {
    for (size_t i = 0; i < sizeof sched_cases / sizeof sched_cases[0]; i++) run_sched(sched_cases[i].name, sched_cases[i].k, true);
}

static void scheduler_errors(void) {
    lk_named_tensors ps = {0};
    make_params(&ps);
    lk_optimizer *o;
    lk_optim_config c = lk_sgd_config_default();
    CHECK_OK(lk_optimizer_create(&c, &ps, &o));
    lk_scheduler *s = NULL;
    CHECK_ERR(lk_linear_lr_create(o, 1.5, 1.0, 5, &s), LK_STATUS_INVALID_ARGUMENT, "starting multiplicative factor");
    CHECK_ERR(lk_cosine_annealing_lr_create(o, 0, 0, &s), LK_STATUS_INVALID_ARGUMENT, "T_max");
    lk_plateau_config pc = lk_plateau_config_default();
    pc.factor = 1.0;
    CHECK_ERR(lk_reduce_lr_on_plateau_create(o, &pc, &s), LK_STATUS_INVALID_ARGUMENT, "Factor should be < 1.0");
    lk_one_cycle_config oc = lk_one_cycle_config_default(0.1, 10);
    CHECK_ERR(lk_one_cycle_lr_create(o, &oc, &s), LK_STATUS_INVALID_ARGUMENT, "momentum > 0");
    oc.cycle_momentum = false;
    CHECK_OK(lk_one_cycle_lr_create(o, &oc, &s));
    for (int i = 0; i < 10; i++) CHECK_OK(lk_scheduler_step(s));
    CHECK_ERR(lk_scheduler_step(s), LK_STATUS_INVALID_USAGE, "total steps is 10");
    lk_scheduler_free(s);
    lk_scheduler *a;
    CHECK_OK(lk_step_lr_create(o, 3, 0.5, &a));
    CHECK_ERR(lk_sequential_lr_create(o, (lk_scheduler *[]){a}, 1, NULL, &s), LK_STATUS_OK, "");
    lk_scheduler_free(s);
    lk_named_tensors st = {0};
    CHECK_OK(lk_plateau_config_default().factor == 0.1 ? LK_STATUS_OK : LK_STATUS_INTERNAL);
    CHECK_OK(lk_step_lr_create(o, 3, 0.5, &s));
    CHECK_ERR(lk_scheduler_state_load(s, &st), LK_STATUS_INVALID_ARGUMENT, "missing last_epoch");
    /* every value is checked; the hyperparameters are optional, and replace the scheduler's */
    CHECK_OK(lk_scheduler_state_get(s, &st));
    lk_named_tensors bad = {0};
    for (int i = 0; i < st.n; i++) {
        const char *nm = st.items[i].name;
        double v = !strcmp(nm, "last_epoch") ? NAN : !strcmp(nm, "step_size") ? 0.0 : lk_tensor_get(st.items[i].tensor, 0);
        lk_tensor *t = lk_tensor_full(LK_F64, 0, NULL, v);
        CHECK_OK(lk_named_tensors_append(&bad, nm, t));
        lk_tensor_release(t);
    }
    CHECK_ERR(lk_scheduler_state_load(s, &bad), LK_STATUS_INVALID_ARGUMENT,
              "last_epoch is nan, expected a whole number from -1 to 2^53, step_size is 0, expected a whole number from 1");
    lk_named_tensors_clear(&bad);
    lk_scheduler *s7;
    CHECK_OK(lk_step_lr_create(o, 7, 0.5, &s7));
    for (int i = 0; i < st.n; i++) /* a state without its hyperparameters keeps step_size 7 */
        if (strcmp(st.items[i].name, "step_size") && strcmp(st.items[i].name, "gamma"))
            CHECK_OK(lk_named_tensors_append(&bad, st.items[i].name, st.items[i].tensor));
    CHECK_OK(lk_scheduler_state_load(s7, &bad));
    lk_named_tensors_clear(&bad);
    lk_named_tensors_clear(&st);
    CHECK_OK(lk_scheduler_state_get(s7, &st));
    CHECK(lk_tensor_get(lk_named_tensors_find(&st, "step_size"), 0) == 7);
    CHECK_OK(lk_scheduler_state_get(s, &bad)); /* the full state: step_size 3 replaces 7 */
    CHECK_OK(lk_scheduler_state_load(s7, &bad));
    lk_named_tensors_clear(&st);
    CHECK_OK(lk_scheduler_state_get(s7, &st));
    CHECK(lk_tensor_get(lk_named_tensors_find(&st, "step_size"), 0) == 3);
    lk_named_tensors_clear(&st);
    lk_named_tensors_clear(&bad);
    lk_scheduler_free(s7);
    lk_scheduler_free(s);
    lk_optimizer_free(o);
    lk_named_tensors_clear(&ps);
}

/* ---- gradient clipping ------------------------------------------------------------------------- */

static void clipping(void) {
    lk_named_tensors ps = {0};
    make_params(&ps);
    set_grads(&ps, 3);
    double ss = 0, mx = 0, l1 = 0;
    for (int k = 0; k < ps.n; k++)
        for (int64_t i = 0; i < ps.items[k].tensor->numel; i++) {
            double g = lk_tensor_get(ps.items[k].tensor->grad, i);
            ss += g * g, l1 += fabs(g), mx = fmax(mx, fabs(g));
        }
    double total;
    lk_tensor *g0 = lk_tensor_clone(ps.items[0].tensor->grad);
    CHECK_OK(lk_clip_grad_norm(&ps, 1e9, 2.0, &total)); /* no clipping needed: unchanged */
    CHECK_NEAR(total, sqrt(ss), 1e-5 * sqrt(ss));
    CHECK(nn_rel_err(ps.items[0].tensor->grad, g0) == 0);
    CHECK_OK(lk_clip_grad_norm(&ps, 0.5, 2.0, &total));
    double after = 0;
    for (int k = 0; k < ps.n; k++)
        for (int64_t i = 0; i < ps.items[k].tensor->numel; i++) after += pow(lk_tensor_get(ps.items[k].tensor->grad, i), 2);
    CHECK_NEAR(sqrt(after), 0.5, 1e-5);
    set_grads(&ps, 3);
    CHECK_OK(lk_clip_grad_norm(&ps, 0.1, INFINITY, &total));
    CHECK_NEAR(total, mx, 1e-6);
    set_grads(&ps, 3);
    CHECK_OK(lk_clip_grad_norm(&ps, 0.1, 1.0, &total));
    CHECK_NEAR(total, l1, 1e-5 * l1);
    /* inf and NaN gradients: no error; the norm says so and the gradients follow PyTorch */
    set_grads(&ps, 3);
    ((float *)ps.items[1].tensor->grad->data)[2] = INFINITY;
    CHECK_OK(lk_clip_grad_norm(&ps, 1.0, 2.0, &total));
    CHECK(isinf(total) && lk_tensor_get(ps.items[0].tensor->grad, 0) == 0.0);
    set_grads(&ps, 3);
    ((float *)ps.items[1].tensor->grad->data)[2] = NAN;
    CHECK_OK(lk_clip_grad_norm(&ps, 1.0, INFINITY, &total));
    CHECK(isnan(total) && isnan(lk_tensor_get(ps.items[0].tensor->grad, 0)));
    set_grads(&ps, 3);
    CHECK_OK(lk_clip_grad_value(&ps, 0.25));
    for (int k = 0; k < ps.n; k++)
        for (int64_t i = 0; i < ps.items[k].tensor->numel; i++) CHECK(fabs(lk_tensor_get(ps.items[k].tensor->grad, i)) <= 0.25);
    CHECK_ERR(lk_clip_grad_norm(&ps, 1.0, -2.0, &total), LK_STATUS_INVALID_ARGUMENT, "norm_type");
    CHECK_ERR(lk_clip_grad_value(&ps, -1), LK_STATUS_INVALID_ARGUMENT, "clip_value");
    lk_tensor_release(g0);
    lk_named_tensors_clear(&ps);
}

/* Clipping by norm without total_norm (the trainer's call) computes the
 * coefficient where the gradients are (LK_OP_CLIP_COEF, LK_OP_SCALE_BY)
 * instead of reading the norms: the gradients come out bit for bit as with
 * total_norm asked for (the host's arithmetic), for p = 2, 1, inf, clipping
 * or not, with an inf or a NaN gradient, with a parameter that has no
 * gradient, and for bf16 gradients. */
static void clipping_without_a_read(void) {
    static const double ps[] = {2.0, 1.0, INFINITY};
    static const double maxes[] = {0.5, 0.05, 1e9};
    for (int bad = 0; bad < 4; bad++) /* none, inf, NaN, p0 without a gradient */
        for (int k = 0; k < 3; k++)
            for (int mi = 0; mi < 3; mi++)
                for (int half = 0; half < 2; half++) {
                    lk_named_tensors a = {0}, b = {0};
                    make_params(&a), make_params(&b);
                    set_grads(&a, 5), set_grads(&b, 5);
                    lk_named_tensors *both[2] = {&a, &b};
                    for (int w = 0; w < 2; w++) {
                        lk_named_tensors *x = both[w];
                        if (bad == 1) ((float *)x->items[1].tensor->grad->data)[2] = INFINITY;
                        if (bad == 2) ((float *)x->items[1].tensor->grad->data)[3] = NAN;
                        for (int j = 0; half && j < x->n; j++) {
                            lk_tensor *h = lk_tensor_cast(x->items[j].tensor->grad, LK_BF16);
                            lk_tensor_release(x->items[j].tensor->grad);
                            x->items[j].tensor->grad = h;
                        }
                        if (bad == 3) {
                            lk_tensor_release(x->items[0].tensor->grad);
                            x->items[0].tensor->grad = NULL;
                        }
                    }
                    double total = 0;
                    CHECK_OK(lk_clip_grad_norm(&a, maxes[mi], ps[k], &total));
                    CHECK_OK(lk_clip_grad_norm(&b, maxes[mi], ps[k], NULL));
                    for (int j = 0; j < a.n; j++) {
                        lk_tensor *ga = a.items[j].tensor->grad, *gb = b.items[j].tensor->grad;
                        CHECK_MSG((!ga && !gb) || (ga && gb && !memcmp(ga->data, gb->data, lk_tensor_nbytes(ga))),
                                  "p=%g max %g case %d %s: gradient %d differs with and without the read", ps[k],
                                  maxes[mi], bad, half ? "bf16" : "f32", j);
                    }
                    lk_named_tensors_clear(&a);
                    lk_named_tensors_clear(&b);
                }
    /* another p still reads (the coefficient needs libm's pow) and clips as before */
    lk_named_tensors c = {0};
    make_params(&c);
    set_grads(&c, 5);
    CHECK_OK(lk_clip_grad_norm(&c, 0.5, 3.0, NULL));
    lk_named_tensors_clear(&c);
}

/* bf16-true / 16-true: 16-bit parameters and gradients with f32 state. Each
 * update is the f32 update of the widened values, rounded once: bitwise the
 * same as an f32 optimizer whose parameters are reset to the widened 16-bit
 * ones before each step and rounded after it. Clipping of 16-bit gradients
 * takes the norm of the widened values (the same sum, in the same order). */
static void half_parameters(void) {
    opt_case cases[16];
    int nc = opt_cases(cases);
    lk_dtype dts[2] = {LK_BF16, LK_F16};
    for (int di = 0; di < 2; di++)
        for (int c = 0; c < nc; c++) {
            lk_named_tensors h = {0}, r = {0};
            make_params(&r);
            for (int k = 0; k < r.n; k++) {
                lk_tensor *t = lk_tensor_cast(r.items[k].tensor, dts[di]);
                lk_tensor_set_requires_grad(t, true);
                lk_named_tensors_append(&h, r.items[k].name, t);
                lk_tensor_release(t);
            }
            lk_optimizer *oh = NULL, *orf = NULL;
            CHECK_OK(lk_optimizer_create(&cases[c].cfg, &h, &oh));
            CHECK_OK(lk_optimizer_create(&cases[c].cfg, &r, &orf));
            bool same = true;
            for (int step = 0; step < 20 && oh && orf; step++) {
                set_grads(&r, step); /* f32 gradients, then their 16-bit rounding for both */
                for (int k = 0; k < h.n; k++) {
                    lk_tensor *ph = h.items[k].tensor, *pr = r.items[k].tensor;
                    lk_tensor_release(ph->grad);
                    ph->grad = lk_tensor_cast(pr->grad, dts[di]);
                    CHECK_OK(lk_tensor_copy(pr->grad, ph->grad));
                    CHECK_OK(lk_tensor_copy(pr, ph));
                }
                CHECK_OK(lk_optimizer_step(oh));
                CHECK_OK(lk_optimizer_step(orf));
                for (int k = 0; k < h.n; k++) {
                    lk_tensor *want = lk_tensor_cast(r.items[k].tensor, dts[di]);
                    same = same && !memcmp(want->data, h.items[k].tensor->data, lk_tensor_nbytes(want));
                    lk_tensor_release(want);
                }
            }
            CHECK_MSG(same, "%s in %s: not the f32 update rounded once", cases[c].name, lk_dtype_name(dts[di]));
            lk_optimizer_free(oh);
            lk_optimizer_free(orf);
            /* clipping: the norm of the widened gradients, the scaled gradients rounded */
            double th = 0, tr = 0;
            CHECK_OK(lk_clip_grad_norm(&h, 1e9, 2.0, &th));
            CHECK_OK(lk_clip_grad_norm(&r, 1e9, 2.0, &tr));
            CHECK(th == tr && th > 0);
            CHECK_OK(lk_clip_grad_norm(&h, 0.5 * th, 2.0, &th));
            double after = 0;
            for (int k = 0; k < h.n; k++)
                for (int64_t i = 0; i < h.items[k].tensor->numel; i++) after += pow(lk_tensor_get(h.items[k].tensor->grad, i), 2);
            CHECK_NEAR(sqrt(after), 0.5 * tr, (di ? 2e-3 : 1e-2) * tr);
            CHECK_OK(lk_clip_grad_value(&h, 0.125));
            for (int k = 0; k < h.n; k++)
                for (int64_t i = 0; i < h.items[k].tensor->numel; i++) CHECK(fabs(lk_tensor_get(h.items[k].tensor->grad, i)) <= 0.125);
            lk_named_tensors_clear(&h);
            lk_named_tensors_clear(&r);
        }
    /* one group, one dtype */
    lk_named_tensors mix = {0};
    make_params(&mix);
    lk_tensor *b = lk_tensor_cast(mix.items[1].tensor, LK_BF16);
    lk_tensor_release(mix.items[1].tensor);
    mix.items[1].tensor = b;
    lk_optimizer *o = NULL;
    lk_optim_config sc = lk_sgd_config_default();
    CHECK_ERR(lk_optimizer_create(&sc, &mix, &o), LK_STATUS_INVALID_ARGUMENT, "one group updates parameters of one dtype");
    lk_named_tensors_clear(&mix);
}

LK_TEST_MAIN(LK_TEST_CASE(optimizer_parity), LK_TEST_CASE(half_parameters), LK_TEST_CASE(optimizer_parity_flat), LK_TEST_CASE(flat_update_any_threads), LK_TEST_CASE(optimizer_groups),
             LK_TEST_CASE(optimizer_state_resume), LK_TEST_CASE(invalid_hyperparameters), LK_TEST_CASE(scheduler_parity),
             LK_TEST_CASE(scheduler_resume), LK_TEST_CASE(scheduler_errors), LK_TEST_CASE(clipping),
             LK_TEST_CASE(clipping_without_a_read))

/* The public step API — lk_strategy_attach, lk_strategy_training_step and
 * lk_strategy_optimizer_step — driven directly, with no trainer: `single`
 * gives the parameters of a hand-written forward/backward/step loop bit for
 * bit (with gradient accumulation and a loss scale), and `dp` over two
 * replicas on threads gives the same parameters within float rounding (each
 * replica's loss is the mean over its half of the batch, weighted by its
 * share), with replica 1 a copy of replica 0 after every step. A
 * non-finite loss reaches check_loss once backward has run, and stops the
 * step. */
#include <math.h>
#include <string.h>

#include "lk_test.h"
#include "lockstep/autograd.h"
#include "lockstep/strategy.h"
#include "lockstep/trainer.h"

enum { IN = 6, HID = 8, OUT = 3, B = 10, STEPS = 6, ACCUM = 3, NREP = 2 };

static float xs[STEPS][B][IN], ys[STEPS][B][OUT];

static void make_data(void) {
    for (int t = 0; t < STEPS; t++)
        for (int i = 0; i < B; i++) {
            for (int j = 0; j < IN; j++) xs[t][i][j] = sinf(0.37f * (float)(t * 31 + i * 7 + j));
            for (int j = 0; j < OUT; j++) ys[t][i][j] = cosf(0.21f * (float)(t * 13 + i * 5 + j));
        }
}

static lk_batch batch_of(int t) {
    lk_batch b = {0};
    b.index = t;
    b.size = B;
    b.nfields = 2;
    b.field[0] = (lk_array){.dtype = LK_F32, .ndim = 2, .shape = {B, IN}, .data = xs[t]};
    b.field[1] = (lk_array){.dtype = LK_F32, .ndim = 2, .shape = {B, OUT}, .data = ys[t]};
    return b;
}

static lk_layer *make_net(void) {
    lk_layer *layers[3] = {lk_linear_create(IN, HID, true, NULL), lk_tanh_create(), lk_linear_create(HID, OUT, true, NULL)};
    lk_layer *net = lk_sequential_create(3, layers);
    CHECK(net != NULL);
    CHECK_OK(lk_layer_reset_parameters(net, 7));
    return net;
}

typedef struct ctx {
    lk_layer *nets[NREP];
    int calls[NREP];
} ctx;

static lk_tensor *forward(void *c, int k, const lk_batch *b, int64_t batch_idx) {
    (void)batch_idx;
    ctx *x = c;
    x->calls[k]++;
    lk_tensor *in = lk_batch_tensor(b, 0), *y = lk_batch_tensor(b, 1);
    return lk_mse_loss(lk_layer_forward(x->nets[k], in), y, LK_REDUCTION_MEAN);
}

static lk_status replicate(void *c, int k, lk_layer **net) {
    ctx *x = c;
    *net = x->nets[k] = make_net();
    return *net ? LK_STATUS_OK : lk_last_status();
}

static void free_replica(void *c, int k) {
    ctx *x = c;
    lk_layer_free(x->nets[k]);
    x->nets[k] = NULL;
}

static const float loss_scale = 5.0f; /* not a power of two: the order of the scalings shows in the bits */

/* The reference: the loop a single process runs by hand. Returns the flat
 * parameters after STEPS micro-batches (ACCUM per optimizer step). */
static float *reference(int64_t *n_out) {
    lk_layer *net = make_net();
    lk_tensor *fp = NULL, *fg = NULL;
    CHECK_OK(lk_params_flatten(net, NULL, &fp, &fg));
    lk_named_tensors params = {0};
    CHECK_OK(lk_layer_named_parameters(net, &params));
    lk_optim_config oc = lk_adam_config_default();
    lk_optimizer *o = NULL;
    CHECK_OK(lk_optimizer_create(&oc, &params, &o));
    ctx x = {.nets = {net}};
    for (int t = 0; t < STEPS; t++) {
        lk_batch b = batch_of(t);
        lk_scope_begin();
        lk_tensor *loss = forward(&x, 0, &b, t);
        loss = lk_mul_scalar(loss, 1.0f / (float)ACCUM);
        loss = lk_mul_scalar(loss, loss_scale);
        CHECK_OK(lk_backward(loss));
        lk_scope_end();
        if ((t + 1) % ACCUM == 0) {
            float *g = fg->data;
            for (int64_t i = 0; i < fg->numel; i++) g[i] /= loss_scale;
            CHECK_OK(lk_optimizer_step(o));
            memset(fg->data, 0, lk_tensor_nbytes(fg));
        }
    }
    *n_out = fp->numel;
    float *out = lk_calloc((size_t)fp->numel, sizeof(float));
    memcpy(out, fp->data, lk_tensor_nbytes(fp));
    lk_optimizer_free(o);
    lk_named_tensors_clear(&params);
    lk_tensor_release(fp);
    lk_tensor_release(fg);
    lk_layer_free(net);
    return out;
}

/* The same loop through a strategy's step. */
static float *through_strategy(const char *name, int devices, int64_t *n_out, double *last_loss) {
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = name;
    sc.devices = devices;
    lk_strategy *s = NULL;
    CHECK_OK(lk_strategy_create(&sc, &s));
    CHECK(!strcmp(lk_strategy_name(s), devices > 1 ? "dp" : "single"));
    ctx x = {.nets = {make_net()}};
    int64_t total = lk_layer_num_parameters(x.nets[0]);
    lk_tensor *gbuf = NULL, *pbuf = NULL, *fp = NULL, *fg = NULL;
    bool copy = false;
    CHECK_OK(lk_strategy_grad_buffer(s, total, &gbuf));
    CHECK_OK(lk_strategy_param_buffer(s, total, &pbuf, &copy));
    CHECK(gbuf && gbuf->dtype == LK_F32 && gbuf->numel == total && !pbuf && copy);
    CHECK_OK(lk_params_flatten_into(x.nets[0], pbuf, copy, gbuf, &fp, &fg));
    CHECK(fg->data == gbuf->data); /* the optimizer's flat gradient is the strategy's buffer */
    lk_named_tensors params = {0}, buffers = {0};
    CHECK_OK(lk_layer_named_parameters(x.nets[0], &params));
    CHECK_OK(lk_layer_named_buffers(x.nets[0], &buffers));
    lk_tensor *arr[16];
    const char *names[16];
    for (int i = 0; i < params.n; i++) arr[i] = params.items[i].tensor, names[i] = params.items[i].name;
    CHECK_OK(lk_strategy_setup(s, arr, names, params.n, NULL, 0));
    lk_optim_config oc = lk_adam_config_default();
    lk_optimizer *o = NULL;
    CHECK_OK(lk_optimizer_create(&oc, &params, &o));
    CHECK_OK(lk_strategy_shard_optimizer(s, o));

    lk_step_args a0 = {.batch = NULL};
    lk_step_result r;
    CHECK_ERR(lk_strategy_training_step(s, &a0, &r), LK_STATUS_INVALID_USAGE, "call lk_strategy_attach first");
    lk_step_fn fn = {.ctx = &x, .forward = forward, .replicate = replicate, .free_replica = free_replica};
    CHECK_OK(lk_strategy_attach(s, &fn));
    for (int t = 0; t < STEPS; t++) {
        lk_batch b = batch_of(t);
        bool sync = (t + 1) % ACCUM == 0;
        lk_step_args a = {.batch = &b, .batch_idx = t, .sync = sync, .loss_mul = 1.0f / (float)ACCUM,
                          .loss_scale = loss_scale, .autocast = LK_F32};
        CHECK_OK(lk_strategy_training_step(s, &a, &r));
        CHECK(isfinite(r.loss) && r.loss > 0);
        *last_loss = r.loss;
        if (sync) {
            float *g = fg->data;
            for (int64_t i = 0; i < fg->numel; i++) g[i] /= loss_scale;
            CHECK_OK(lk_strategy_optimizer_step(s, o, false));
            for (int64_t i = 0; i < fg->numel; i++) CHECK_MSG(g[i] == 0.0f, "gradient %lld not zeroed", (long long)i);
            if (devices > 1) { /* replica 1 holds replica 0's parameters again */
                lk_named_tensors p1 = {0};
                CHECK_OK(lk_layer_named_parameters(x.nets[1], &p1));
                for (int i = 0; i < p1.n; i++)
                    CHECK(!memcmp(p1.items[i].tensor->data, params.items[i].tensor->data,
                                  lk_tensor_nbytes(params.items[i].tensor)));
                lk_named_tensors_clear(&p1);
            }
        }
    }
    for (int k = 0; k < devices; k++) CHECK_MSG(x.calls[k] == STEPS, "replica %d ran %d forwards", k, x.calls[k]);
    lk_strategy_detach(s);
    CHECK(x.nets[1] == NULL); /* dp gave its replica back */
    *n_out = fp->numel;
    float *out = lk_calloc((size_t)fp->numel, sizeof(float));
    memcpy(out, fp->data, lk_tensor_nbytes(fp));
    lk_optimizer_free(o);
    lk_strategy_free(s);
    lk_named_tensors_clear(&params);
    lk_named_tensors_clear(&buffers);
    lk_tensor_release(fp);
    lk_tensor_release(fg);
    lk_layer_free(x.nets[0]);
    return out;
}

static void single_matches_hand_loop(void) {
    int64_t n_ref, n;
    double loss;
    float *ref = reference(&n_ref);
    float *got = through_strategy("single", 1, &n, &loss);
    CHECK(n == n_ref);
    CHECK_MSG(!memcmp(ref, got, (size_t)n * sizeof(float)), "single's step changed the parameters' bits");
    lk_free(ref);
    lk_free(got);
}

static void dp_matches_single(void) {
    int64_t n_ref, n;
    double l1, l2;
    float *ref = through_strategy("single", 1, &n_ref, &l1);
    float *got = through_strategy("dp", NREP, &n, &l2);
    CHECK(n == n_ref);
    CHECK_NEAR(l2, l1, 1e-6 * fabs(l1) + 1e-7);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)got[i] - (double)ref[i]));
    CHECK_MSG(worst < 1e-5, "dp's parameters differ from single's by %g", worst);
    lk_free(ref);
    lk_free(got);
}

static void dp_needs_replicas(void) {
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = "dp";
    sc.devices = NREP;
    lk_strategy *s = NULL;
    CHECK_OK(lk_strategy_create(&sc, &s));
    ctx x = {.nets = {make_net()}};
    lk_tensor *fp = NULL, *fg = NULL, *gbuf = NULL;
    CHECK_OK(lk_strategy_grad_buffer(s, lk_layer_num_parameters(x.nets[0]), &gbuf));
    CHECK_OK(lk_params_flatten(x.nets[0], gbuf, &fp, &fg));
    lk_named_tensors params = {0};
    CHECK_OK(lk_layer_named_parameters(x.nets[0], &params));
    lk_tensor *arr[16];
    for (int i = 0; i < params.n; i++) arr[i] = params.items[i].tensor;
    CHECK_OK(lk_strategy_setup(s, arr, NULL, params.n, NULL, 0));
    lk_step_fn fn = {.ctx = &x, .forward = forward};
    CHECK_ERR(lk_strategy_attach(s, &fn), LK_STATUS_INVALID_ARGUMENT, "needs replicas of the module");
    lk_strategy_free(s);
    lk_named_tensors_clear(&params);
    lk_tensor_release(fp);
    lk_tensor_release(fg);
    lk_layer_free(x.nets[0]);
}

/* A non-finite loss: check_loss sees it once backward has run (the loss is
 * read after backward is queued: on a GPU, reading it between forward and
 * backward would stall the queue), the step returns check_loss's error and
 * the parameters are untouched (the optimizer step is the caller's). */
typedef struct {
    ctx x;
    const lk_tensor *fg;
    int checks;
    bool grads_at_check; /* some gradient element was non-zero when check_loss ran */
} nan_ctx;

static lk_tensor *nan_forward(void *c, int k, const lk_batch *b, int64_t batch_idx) {
    lk_tensor *loss = forward(c, k, b, batch_idx);
    return loss && batch_idx == 1 ? lk_mul_scalar(loss, NAN) : loss;
}

static lk_status nan_check(void *c, double loss) {
    nan_ctx *n = c;
    n->checks++;
    const float *g = n->fg->data;
    n->grads_at_check = false;
    for (int64_t i = 0; i < n->fg->numel; i++) n->grads_at_check |= g[i] != 0.0f;
    return isfinite(loss) ? LK_STATUS_OK : lk_error(LK_STATUS_ABORTED, "test: the loss is %g", loss);
}

static void nan_loss_checked_after_backward(void) {
    lk_strategy_config sc = lk_strategy_config_default();
    lk_strategy *s = NULL;
    CHECK_OK(lk_strategy_create(&sc, &s));
    nan_ctx n = {.x = {.nets = {make_net()}}};
    int64_t total = lk_layer_num_parameters(n.x.nets[0]);
    lk_tensor *gbuf = NULL, *fp = NULL, *fg = NULL;
    CHECK_OK(lk_strategy_grad_buffer(s, total, &gbuf));
    CHECK_OK(lk_params_flatten(n.x.nets[0], gbuf, &fp, &fg));
    n.fg = fg;
    lk_named_tensors params = {0};
    CHECK_OK(lk_layer_named_parameters(n.x.nets[0], &params));
    lk_tensor *arr[16];
    for (int i = 0; i < params.n; i++) arr[i] = params.items[i].tensor;
    CHECK_OK(lk_strategy_setup(s, arr, NULL, params.n, NULL, 0));
    lk_step_fn fn = {.ctx = &n, .forward = nan_forward, .check_loss = nan_check};
    CHECK_OK(lk_strategy_attach(s, &fn));
    float *before = lk_calloc((size_t)fp->numel, sizeof(float));
    memcpy(before, fp->data, lk_tensor_nbytes(fp));
    lk_step_result r;
    for (int t = 0; t < 2; t++) {
        lk_batch b = batch_of(t);
        lk_step_args a = {.batch = &b, .batch_idx = t, .sync = false, .loss_mul = 1.0f, .loss_scale = 1.0f, .autocast = LK_F32};
        lk_status st = lk_strategy_training_step(s, &a, &r);
        CHECK_MSG(n.checks == t + 1 && n.grads_at_check, "step %d: check_loss ran %d times, %s backward", t, n.checks,
                  n.grads_at_check ? "after" : "before");
        if (t == 0) CHECK_OK(st);
        else CHECK_MSG(st == LK_STATUS_ABORTED && strstr(lk_last_error(), "test: the loss is"), "step 1: %s: %s",
                       lk_status_str(st), lk_last_error());
    }
    CHECK(isnan(r.loss));
    CHECK_MSG(!memcmp(before, fp->data, lk_tensor_nbytes(fp)), "the parameters changed");
    lk_free(before);
    lk_strategy_free(s);
    lk_named_tensors_clear(&params);
    lk_tensor_release(fp);
    lk_tensor_release(fg);
    lk_layer_free(n.x.nets[0]);
}

int main(int argc, char **argv) {
    make_data();
    static const lk_t_case cases[] = {LK_TEST_CASE(single_matches_hand_loop), LK_TEST_CASE(dp_matches_single),
                                      LK_TEST_CASE(dp_needs_replicas), LK_TEST_CASE(nan_loss_checked_after_backward)};
    return lk_t_run(cases, (int)(sizeof cases / sizeof cases[0]), argc, argv);
}

/* What a strategy is (lk_strategy_info: names, Lightning's aliases and class
 * names, the process model) and the parameter layout and state it owns:
 * lk_strategy_wrap makes one unit over every parameter for the replica
 * strategies (the parameters and gradients views of its flat buffers, the
 * layout the trainer made before the strategy owned it), the local
 * parameters are the network's, clipping by norm through the strategy gives
 * lk_clip_grad_norm's bits, the state dict is the network's, rank 0 writes
 * checkpoints, and a one-process strategy's data-parallel group is this
 * process alone. */
#include <math.h>
#include <string.h>

#include "lk_test.h"
#include "lockstep/autograd.h"
#include "lockstep/strategy.h"

static void info_by_name(void) {
    const lk_strategy_info *i = lk_strategy_info_get("ddp");
    CHECK(i && !strcmp(i->name, "ddp") && i->process_model == LK_PROCESS_PER_DEVICE && !i->forks && i->ddp_options);
    CHECK(!strcmp(i->class_name, "DDPStrategy"));
    i = lk_strategy_info_get("ddp_spawn");
    CHECK(i && i->forks && i->process_model == LK_PROCESS_PER_DEVICE);
    i = lk_strategy_info_get("dp");
    CHECK(i && i->process_model == LK_PROCESS_THREADS && !i->ddp_options);
    i = lk_strategy_info_get("single");
    CHECK(i && i->process_model == LK_PROCESS_SINGLE);
    i = lk_strategy_info_get("auto");
    CHECK(i && i->process_model == LK_PROCESS_PER_DEVICE && i->class_name == NULL);
    /* Lightning's aliases and class names, with or without a module path */
    static const struct {
        const char *given, *is;
    } as[] = {{"ddp_find_unused_parameters_true", "ddp"},
              {"ddp_fork", "ddp_spawn"},
              {"ddp_notebook", "ddp_spawn"},
              {"single_device", "single"},
              {"DDPStrategy", "ddp"},
              {"lightning.pytorch.strategies.DDPStrategy", "ddp"},
              {"pytorch_lightning.strategies.DataParallelStrategy", "dp"},
              {"SingleDeviceStrategy", "single"},
              {"DDPSpawnStrategy", "ddp_spawn"}};
    for (size_t k = 0; k < sizeof as / sizeof as[0]; k++) {
        i = lk_strategy_info_get(as[k].given);
        CHECK_MSG(i && !strcmp(i->name, as[k].is), "%s -> %s", as[k].given, i ? i->name : "NULL");
    }
    CHECK(lk_strategy_info_get("dpp") == NULL);
    CHECK(lk_strategy_info_get("strategies.ddp") == NULL); /* a module path takes a class name */
    CHECK(lk_strategy_info_get(NULL) == NULL);
    /* init_args: DDPStrategy's options, none for the others */
    const char *const *keys = lk_strategy_init_args("DDPStrategy");
    bool bucket = false;
    for (int k = 0; keys[k]; k++) bucket |= !strcmp(keys[k], "bucket_cap_mb");
    CHECK(bucket);
    CHECK(lk_strategy_init_args("DataParallelStrategy")[0] == NULL);
    /* the create path takes the same names */
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = "SingleDeviceStrategy";
    lk_strategy *s = NULL;
    CHECK_OK(lk_strategy_create(&sc, &s));
    CHECK(s && !strcmp(lk_strategy_name(s), "single"));
    lk_strategy_free(s);
    lk_ddp_options d = lk_ddp_options_default();
    CHECK(d.bucket_cap_mb == 25.0 && d.broadcast_buffers && !d.report_unused && d.comm_dtype == LK_F32 && d.shared_params);
}

static lk_layer *make_net(void) {
    lk_layer *layers[3] = {lk_linear_create(5, 7, true, NULL), lk_tanh_create(), lk_linear_create(7, 3, true, NULL)};
    lk_layer *net = lk_sequential_create(3, layers);
    CHECK(net != NULL);
    CHECK_OK(lk_layer_reset_parameters(net, 11));
    return net;
}

/* Gradients of a fixed loss on `net`. */
static void backward_once(lk_layer *net) {
    lk_rng rng;
    lk_rng_init(&rng, 3, LK_RNG_INIT, 0, 0);
    lk_scope_begin();
    lk_tensor *x = lk_tensor_randn(&rng, LK_SHAPE(4, 5), 0, 1);
    lk_tensor *loss = lk_sum(lk_mul_scalar(lk_layer_forward(net, lk_scope_adopt(x)), 3.0f), NULL, 0, false);
    CHECK_OK(lk_backward(loss));
    lk_scope_end();
}

static void single_layout(void) {
    lk_layer *net = make_net(), *ref = make_net();
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = "single";
    lk_strategy *s = NULL;
    CHECK_OK(lk_strategy_create(&sc, &s));
    CHECK(!lk_strategy_wrapped(s) && lk_strategy_local_params(s)->n == 0 && lk_strategy_num_units(s) == 0);
    CHECK(lk_strategy_dp_size(s) == 1 && lk_strategy_dp_rank(s) == 0 && lk_strategy_dp_comm(s) == NULL);
    CHECK(lk_strategy_writes_checkpoint(s));
    CHECK_OK(lk_strategy_wrap(s, net));
    CHECK(lk_strategy_wrapped(s));
    CHECK_ERR(lk_strategy_wrap(s, net), LK_STATUS_INVALID_USAGE, "already wraps");
    /* one unit over every parameter, in registration order */
    lk_named_tensors np = {0};
    CHECK_OK(lk_layer_named_parameters(net, &np));
    const lk_named_tensors *local = lk_strategy_local_params(s);
    CHECK(local->n == np.n && np.n == 4);
    CHECK(lk_strategy_num_units(s) == 1);
    lk_tensor *fp = NULL, *fg = NULL;
    CHECK_OK(lk_strategy_unit(s, 0, &fp, &fg));
    CHECK_ERR(lk_strategy_unit(s, 1, &fp, &fg), LK_STATUS_INVALID_ARGUMENT, "unit 1 of 1");
    CHECK(fp && fg && fp->numel == lk_layer_num_parameters(net) && fg->numel == fp->numel);
    int64_t off = 0;
    for (int i = 0; i < np.n; i++) {
        lk_tensor *p = local->items[i].tensor;
        CHECK(!strcmp(local->items[i].name, np.items[i].name) && p == np.items[i].tensor);
        CHECK(p->data == (float *)fp->data + off);
        CHECK(p->grad && p->grad->data == (float *)fg->data + off);
        off += p->numel;
    }
    /* clipping by norm through the strategy: lk_clip_grad_norm's bits on the whole model */
    backward_once(net);
    backward_once(ref);
    lk_named_tensors rp = {0};
    CHECK_OK(lk_layer_named_parameters(ref, &rp));
    CHECK_OK(lk_strategy_clip_grad_norm(s, 0.5, 2.0));
    CHECK_OK(lk_clip_grad_norm(&rp, 0.5, 2.0, NULL));
    for (int i = 0; i < np.n; i++) {
        lk_tensor *g = local->items[i].tensor->grad, *h = rp.items[i].tensor->grad;
        CHECK(g && h && g->numel == h->numel && !memcmp(g->data, h->data, (size_t)g->numel * sizeof(float)));
    }
    /* the state dict a checkpoint writes is the network's, whole */
    lk_named_tensors sd = {0}, want = {0};
    CHECK_OK(lk_strategy_state_dict(s, net, &sd));
    CHECK_OK(lk_state_dict_get(net, &want));
    CHECK(sd.n == want.n);
    for (int i = 0; i < sd.n && i < want.n; i++)
        CHECK(!strcmp(sd.items[i].name, want.items[i].name) && sd.items[i].tensor->data == want.items[i].tensor->data);
    CHECK_OK(lk_strategy_state_dict_loaded(s));
    double v[2] = {1.5, -2};
    CHECK_OK(lk_strategy_dp_reduce(s, v, 2, LK_REDUCE_SUM)); /* a group of one: as it is */
    CHECK(v[0] == 1.5 && v[1] == -2);
    lk_named_tensors_clear(&sd);
    lk_named_tensors_clear(&want);
    lk_named_tensors_clear(&np);
    lk_named_tensors_clear(&rp);
    lk_strategy_free(s); /* the parameters keep their values and get their own gradients back */
    lk_layer_free(net);
    lk_layer_free(ref);
}

/* dp's replicas are threads of this process, fed by one loader: its
 * data-parallel group is this process alone. */
static void dp_group(void) {
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = "dp";
    sc.devices = 2;
    lk_strategy *s = NULL;
    CHECK_OK(lk_strategy_create(&sc, &s));
    CHECK(s && !strcmp(lk_strategy_name(s), "dp"));
    CHECK(lk_strategy_dp_size(s) == 1 && lk_strategy_dp_comm(s) == NULL && lk_strategy_writes_checkpoint(s));
    lk_strategy_free(s);
}

LK_TEST_MAIN(LK_TEST_CASE(info_by_name), LK_TEST_CASE(single_layout), LK_TEST_CASE(dp_group))

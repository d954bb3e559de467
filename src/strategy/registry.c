/* The strategy registry: name -> vtable and what the strategy is
 * (lk_strategy_info; "auto", Lightning's aliases and class names, each
 * class's init_args), and lk_strategy_create, which picks the vtable. The
 * one file naming the strategies: they use strategy.c's shared code, never
 * this. A new strategy is a new file in this folder that fills an
 * lk_strategy_vt and a line in `registry` below. */
#include <string.h>

#include "strategy/strategy_impl.h"

/* Every name a strategy answers to: its vtable and what it is. ddp_spawn
 * is ddp here: how the ranks were started (forked) is the launcher's
 * business. "auto" has no vtable: lk_strategy_create resolves it (single
 * for one process, ddp for several). A new strategy is a line here. */
static const struct entry {
    lk_strategy_info info;
    const lk_strategy_vt *vt;
} registry[] = {
    {{"auto", NULL, LK_PROCESS_PER_DEVICE, false, true}, NULL},
    {{"single", "SingleDeviceStrategy", LK_PROCESS_SINGLE, false, false}, &lk__strategy_single},
    {{"ddp", "DDPStrategy", LK_PROCESS_PER_DEVICE, false, true}, &lk__strategy_ddp},
    /* Lightning 1.x's class; 2.x writes DDPStrategy with start_method spawn */
    {{"ddp_spawn", "DDPSpawnStrategy", LK_PROCESS_PER_DEVICE, true, true}, &lk__strategy_ddp},
    {{"dp", "DataParallelStrategy", LK_PROCESS_THREADS, false, false}, &lk__strategy_dp},
    /* pipelines (pipeline.c): stages of blocks, one per process */
    {{"model_parallel", NULL, LK_PROCESS_PER_DEVICE, false, false}, &lk__strategy_model_parallel},
    /* PipelineStrategy: lockstep's own class name (Lightning has none), so
     * the strategy node takes its keys (chunks, schedule, split, stages) */
    {{"pipeline", "PipelineStrategy", LK_PROCESS_PER_DEVICE, false, false}, &lk__strategy_pipeline},
    /* lockstep's own ZeRO (no DeepSpeed inside): stage 1 over ddp (zero.c,
     * which reads ddp's options: buckets, broadcast_buffers, comm hooks),
     * stages 2 and 3 fsdp.c's. DeepSpeedStrategy's stage defaults to 2, as
     * Lightning's: stage 2 comes first; init_args.stage picks another
     * (trainer_config.c). */
    {{"deepspeed_stage_2", "DeepSpeedStrategy", LK_PROCESS_PER_DEVICE, false, false}, &lk__strategy_zero2},
    {{"deepspeed_stage_1", "DeepSpeedStrategy", LK_PROCESS_PER_DEVICE, false, true}, &lk__strategy_zero1},
    /* fsdp.c: parameters sharded too (FSDPStrategy; DeepSpeedStrategy stage 3) */
    {{"fsdp", "FSDPStrategy", LK_PROCESS_PER_DEVICE, false, false}, &lk__strategy_fsdp},
    {{"deepspeed_stage_3", "DeepSpeedStrategy", LK_PROCESS_PER_DEVICE, false, false}, &lk__strategy_zero3},
};
#define NREG ((int)(sizeof registry / sizeof registry[0]))

/* Lightning's other names for them. */
static const struct {
    const char *from, *to;
    bool offload; /* the name also asks for cpu_offload (lk_strategy_name_offloads) */
} aliases[] = {
    {"ddp_find_unused_parameters_true", "ddp", false}, /* unused parameters get zero gradients in the flat buffer */
    {"ddp_find_unused_parameters_false", "ddp", false},
    {"ddp_spawn_find_unused_parameters_true", "ddp_spawn", false},
    {"ddp_spawn_find_unused_parameters_false", "ddp_spawn", false},
    {"ddp_fork", "ddp_spawn", false}, /* lockstep's ddp_spawn forks */
    {"ddp_notebook", "ddp_spawn", false},
    {"single_device", "single", false},
    {"deepspeed_stage_3_offload", "deepspeed_stage_3", true},
    {"deepspeed_stage_2_offload", "deepspeed_stage_2", true},
    {"fsdp_cpu_offload", "fsdp", true},
};

bool lk_strategy_name_offloads(const char *name) {
    for (size_t i = 0; name && i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(name, aliases[i].from)) return aliases[i].offload;
    return false;
}

static const char *const strategy_names[] = {"auto", "single", "ddp", "ddp_spawn", "dp", "deepspeed_stage_1",
                                             "deepspeed_stage_2", "deepspeed_stage_3", "fsdp", "model_parallel",
                                             "pipeline"};

const char *const *lk_strategy_names(int *count) {
    *count = (int)(sizeof strategy_names / sizeof strategy_names[0]);
    return strategy_names;
}

/* A test's stand-in strategy (lk__strategy_register_test): by its name only. */
static struct entry test_entry;

void lk__strategy_register_test(const lk_strategy_info *info, const lk_strategy_vt *vt) {
    test_entry.info = *info;
    test_entry.vt = vt;
}

static const struct entry *find_entry(const char *name) {
    if (!name) return NULL;
    if (test_entry.vt && !strcmp(name, test_entry.info.name)) return &test_entry;
    for (size_t k = 0; k < sizeof aliases / sizeof aliases[0]; k++)
        if (!strcmp(name, aliases[k].from)) name = aliases[k].to;
    const char *dot = strrchr(name, '.'); /* lightning.pytorch.strategies.DDPStrategy -> DDPStrategy */
    const char *cls = dot ? dot + 1 : name;
    for (int i = 0; i < NREG; i++)
        if (!strcmp(name, registry[i].info.name) || (registry[i].info.class_name && !strcmp(cls, registry[i].info.class_name)))
            return &registry[i];
    return NULL;
}

const lk_strategy_info *lk_strategy_info_get(const char *name) {
    const struct entry *e = find_entry(name);
    return e ? &e->info : NULL;
}

/* class_path's names and each one's init_args. DDPStrategy takes the
 * options of PyTorch's DistributedDataParallel that lockstep has (and
 * accepts find_unused_parameters, gradient_as_bucket_view and static_graph,
 * which change nothing here: an unused parameter's gradient is a zero in
 * the flat buffer, gradients are always views of the buckets, and the
 * graph is never assumed static), Lightning's ddp_comm_hook (by name:
 * bf16_compress, fp16_compress), start_method (spawn and fork: ddp_spawn)
 * and lockstep's shared_params. */
static const char *const ddp_args[] = {"bucket_cap_mb", "broadcast_buffers", "ddp_comm_hook", "find_unused_parameters",
                                       "gradient_as_bucket_view", "shared_params", "start_method", "static_graph",
                                       NULL};
static const char *const no_args[] = {NULL};
/* DeepSpeedStrategy: stage (1, 2 or 3) and the DeepSpeed switches that
 * change nothing in lockstep's ZeRO (booleans: the gradients are always
 * contiguous buffers; stage 2 and 3 always overlap their reduce-scatters
 * with the backward). */
/* state_dict_type (FSDPStrategy's spelling): full (one checkpoint file) or
 * sharded (a set of one file per rank, docs/CHECKPOINTS.md). */
/* offload_optimizer: trainer.fsdp_cpu_offload (stages 2 and 3 on a GPU). */
static const char *const zero_args[] = {"stage", "contiguous_gradients", "overlap_comm", "state_dict_type",
                                        "offload_optimizer", NULL};
/* FSDPStrategy: PyTorch FSDP's options lockstep has (sharding_strategy,
 * auto_wrap_policy as layer class names, lockstep's min_num_params,
 * forward_prefetch, backward_prefetch, activation_checkpointing_policy),
 * cpu_offload (trainer.fsdp_cpu_offload: on a GPU the chunks and the
 * optimizer in host memory; on the CPU they are there already), and those
 * that change nothing here: limit_all_gathers (at most the next unit is
 * prefetched), use_orig_params and sync_module_states (the parameters keep
 * their tensors; rank 0's values are broadcast at the start), and
 * mixed_precision null (the trainer's precision decides); state_dict_type
 * full or sharded is trainer.state_dict_type. */
static const char *const fsdp_args[] = {"sharding_strategy", "auto_wrap_policy", "min_num_params", "cpu_offload",
                                        "forward_prefetch", "backward_prefetch", "limit_all_gathers",
                                        "use_orig_params", "sync_module_states", "state_dict_type",
                                        "activation_checkpointing_policy", "mixed_precision", NULL};
/* PipelineStrategy: trainer.pipeline's keys (chunks, schedule, split, stages, virtual_stages). */
static const char *const pipe_args[] = {"chunks", "schedule", "split", "stages", "virtual_stages", NULL};
static const char *const class_names[] = {"DDPStrategy", "DDPSpawnStrategy", "DataParallelStrategy",
                                          "SingleDeviceStrategy", "DeepSpeedStrategy", "FSDPStrategy",
                                          "PipelineStrategy"};

const char *const *lk_strategy_class_names(int *count) {
    *count = (int)(sizeof class_names / sizeof class_names[0]);
    return class_names;
}

const char *const *lk_strategy_init_args(const char *class_name) {
    const struct entry *e = find_entry(class_name);
    if (e && (e->vt == &lk__strategy_zero1 || e->vt == &lk__strategy_zero2 || e->vt == &lk__strategy_zero3)) return zero_args;
    if (e && e->vt == &lk__strategy_fsdp) return fsdp_args;
    if (e && e->vt == &lk__strategy_pipeline) return pipe_args;
    return e && e->info.ddp_options ? ddp_args : no_args;
}

lk_ddp_options lk_ddp_options_default(void) {
    return (lk_ddp_options){.bucket_cap_mb = 25.0, .broadcast_buffers = true, .report_unused = false,
                            .comm_dtype = LK_F32, .shared_params = true};
}

lk_strategy_config lk_strategy_config_default(void) {
    return (lk_strategy_config){.name = "auto", .comm = NULL, .devices = 1, .ddp = NULL, .param_dtype = LK_F32,
                                .device = LK_DEVICE_CPU};
}

lk_status lk_strategy_create(const lk_strategy_config *cfg, lk_strategy **out) {
    *out = NULL;
    const char *name = cfg->name ? cfg->name : "auto";
    int world = cfg->comm ? lk_comm_world_size(cfg->comm) : 1;
    const struct entry *e = find_entry(name);
    const lk_strategy_vt *vt = e ? e->vt : NULL;
    if (e && !vt) vt = world > 1 ? &lk__strategy_ddp : &lk__strategy_single; /* auto */
    /* dp over one device is one replica on this thread: exactly single */
    if (vt == &lk__strategy_dp && cfg->devices <= 1) vt = &lk__strategy_single;
    if (!vt) {
        int n;
        const char *const *names = lk_strategy_names(&n);
        const char *s = lk_suggest(name, names, n);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown strategy '%s'%s%s%s (expected auto, single, ddp, ddp_spawn, dp, "
                        "deepspeed_stage_1, deepspeed_stage_2, deepspeed_stage_3, fsdp, model_parallel or pipeline)", name,
                        s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "");
    }
    if (vt == &lk__strategy_single && world > 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy 'single' runs one process, but %d were started", world);
    lk_ddp_options ddp = cfg->ddp ? *cfg->ddp : lk_ddp_options_default();
    if (ddp.comm_dtype != LK_F32 && ddp.comm_dtype != LK_BF16 && ddp.comm_dtype != LK_F16)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "ddp gradients travel as f32, bf16 or f16, not %s",
                        lk_dtype_name(ddp.comm_dtype));
    if (cfg->param_dtype != LK_F32 && cfg->param_dtype != LK_BF16 && cfg->param_dtype != LK_F16)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategies train f32, bf16 or f16 parameters, not %s",
                        lk_dtype_name(cfg->param_dtype));
    if (cfg->param_dtype != LK_F32 && ddp.comm_dtype != LK_F32 && ddp.comm_dtype != cfg->param_dtype)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s gradients travel as themselves or as f32, not %s",
                        lk_dtype_name(cfg->param_dtype), lk_dtype_name(ddp.comm_dtype));
    if (!(ddp.bucket_cap_mb > 0))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "bucket_cap_mb must be > 0, got %g", ddp.bucket_cap_mb);
    lk_strategy *s = lk_calloc(1, sizeof *s);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->vt = vt;
    s->cfg = *cfg;
    s->flat_dev = cfg->device; /* (an offloading strategy's create moves it to the host) */
    s->ddp = ddp;
    s->cfg.ddp = &s->ddp; /* the copy: the caller's may go */
    s->fsdp = cfg->fsdp ? *cfg->fsdp : lk_fsdp_options_default();
    s->cfg.fsdp = &s->fsdp; /* (its wrap_types is copied by fsdp.c's create) */
    s->comm = cfg->comm;
    s->rank = cfg->comm ? lk_comm_rank(cfg->comm) : 0;
    s->world = world;
    s->sync = true;
    lk_status st = vt->create ? vt->create(s) : LK_STATUS_OK;
    if (st) {
        lk_free(s);
        return st;
    }
    /* The data-parallel group: the communicator's ranks unless the strategy
     * names a subgroup; none (this process alone) without a communicator. */
    s->dp_comm = vt->dp_comm ? vt->dp_comm(s) : s->comm;
    s->dp_size = s->dp_comm ? lk_comm_world_size(s->dp_comm) : 1;
    s->dp_rank = s->dp_comm ? lk_comm_rank(s->dp_comm) : 0;
    *out = s;
    return LK_STATUS_OK;
}

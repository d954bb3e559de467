/* The Trainer object: its creation from the config (checks, the process
 * group and communicator, the device, the strategy), its accessors and its
 * end. The loops live beside it: run.c (what every loop sets up), fit.c,
 * eval.c (validate, test), predict.c; outputs.c opens the loggers;
 * module.c holds the module and batch helpers; faults.c the test-only
 * fault hooks. optim_factory.c, grads.c, step.c, step_checks.c,
 * callbacks.c, checkpoint.c, signals.c and runsummary.c are the parts
 * the loops call. Only rank 0 prints and writes files; every decision
 * that ends a loop is taken from values that are identical on every rank,
 * so ranks never diverge. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lockstep/config.h"
#include "backend/backend_impl.h"
#include "backend/threads.h"
#include "device/gpu.h"
#include "train/accelerator.h"
#include "train/train_impl.h"

/* The checks that need nothing started, and the dtypes they decide: the
 * steps' autocast, the parameters' and the one ddp gradients travel in. */
static lk_status check_config(const lk_trainer_config *cfg, lk_dtype *autocast, lk_dtype *param_dtype,
                              lk_dtype *comm_dtype) {
    *autocast = *param_dtype = *comm_dtype = LK_F32;
    if (cfg->deterministic && !cfg->deterministic_warn && cfg->max_time > 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "trainer.deterministic is true but trainer.max_time is set: stopping on wall time "
                        "depends on machine speed, so runs would not be reproducible");
    LK_TRY(lk__precision_parse(cfg->precision, autocast, param_dtype));
    if (cfg->float32_matmul_precision[0])
        LK_TRY(lk__f32_matmul_parse("trainer.float32_matmul_precision", cfg->float32_matmul_precision, NULL));
    *comm_dtype = !strcmp(cfg->ddp_comm_hook, "bf16_compress")   ? LK_BF16
                  : !strcmp(cfg->ddp_comm_hook, "fp16_compress") ? LK_F16
                                                                  : LK_F32;
    if (*param_dtype != LK_F32 && *comm_dtype != LK_F32 && *comm_dtype != *param_dtype)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "trainer.ddp_comm_hook %s sends %s gradients, but under trainer.precision %s the gradients are "
                        "%s: use %s (averaged in place, half the bytes) or none (averaged in f32)",
                        cfg->ddp_comm_hook, lk_dtype_name(*comm_dtype), cfg->precision, lk_dtype_name(*param_dtype),
                        *param_dtype == LK_BF16 ? "bf16_compress" : "fp16_compress");
    return LK_STATUS_OK;
}

lk_status lk_trainer_config_check(const lk_trainer_config *cfg) {
    lk_dtype autocast, param_dtype, comm_dtype;
    return check_config(cfg, &autocast, &param_dtype, &comm_dtype);
}

lk_status lk_trainer_create(const lk_trainer_config *cfg, const lk_optim_settings *optim, const char *config_yaml,
                            lk_trainer **out) {
    *out = NULL;
    LK_TRY(lk__accelerator_check(cfg)); /* device/gpu_select.c: before anything starts */
    lk_dtype autocast, param_dtype, comm_dtype;
    LK_TRY(check_config(cfg, &autocast, &param_dtype, &comm_dtype));
    lk_trainer *tr = lk_calloc(1, sizeof *tr);
    if (!tr) return LK_STATUS_OUT_OF_MEMORY;
    tr->autocast = autocast;
    tr->param_dtype = param_dtype;
    tr->cfg = *cfg;
    if (optim) tr->opt = *optim;
    else lk_optim_settings_default(&tr->opt);
    tr->config_yaml = config_yaml ? lk_strdup(config_yaml) : NULL;
    /* Lightning's aliases become the names they stand for, as its Trainer
     * does: what the log, run.json and checkpoints say. */
    const char *canon = lk__precision_name(cfg->precision);
    if (canon != cfg->precision) {
        if (strcmp(cfg->precision, "32")) /* Lightning warns for these two, not for 32 */
            lk_warn0("trainer.precision %s is Lightning's older name for %s: it runs %s (write %s to say so)",
                     cfg->precision, canon, canon, canon);
        snprintf(tr->cfg.precision, sizeof tr->cfg.precision, "%s", canon);
    }
    if (cfg->deterministic_warn && cfg->max_time > 0)
        lk_warn0("trainer.deterministic is \"warn\" and trainer.max_time is set: stopping on wall time depends on "
                 "machine speed, so runs may not be reproducible");
    tr->best_score = NAN;
    tr->t_start = lk_time_now();
    tr->prev_f32_matmul = lk_float32_matmul_precision(); /* process-wide, as torch's: put back by lk_trainer_free */
    if (cfg->float32_matmul_precision[0]) lk_set_float32_matmul_precision(cfg->float32_matmul_precision);
    tr->replay_at_start = lk__replay_get_stats();
    lk_status st = lk__callbacks_init(tr);
    if (!st) st = lk_pg_info_from_env(&tr->pg);
    if (st) goto fail;
    tr->rank = tr->pg.rank;
    tr->world = tr->pg.world_size;
    /* What the strategy is decides how this process runs: one rank of a
     * launched job, a launcher, or one process driving every device. An
     * unknown name is lk_strategy_create's error, below (as one rank). */
    const lk_strategy_info *si = lk_strategy_info_get(cfg->strategy);
    lk_process_model pm = si ? si->process_model : LK_PROCESS_PER_DEVICE;
    bool dp = pm == LK_PROCESS_THREADS;
    /* The training device: the CPU, or (kind, index for this local rank) */
    st = lk__accelerator_device(cfg, dp ? 0 : tr->pg.local_rank, &tr->dev);
    if (st) goto fail;
    if (tr->dev.kind == LK_CUDA && tr->rank == 0)
        lk_log_warn("GPU training is new in lockstep and has run only on emulations of a GPU in its tests so far "
                    "(issue 21): `ctest -L gpu` in a CUDA build checks this machine's GPU against the CPU");
    if (tr->dev.kind == LK_CPU) {
        /* On the CPU a device is a core: more ranks than cores only fight
         * over them (LK_ALLOW_OVERSUBSCRIBE=1 permits it, e.g. for tests). */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cfg->devices > cores && !lk_env_get_long("LK_ALLOW_OVERSUBSCRIBE", 0)) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "trainer.devices=%lld is more than the %ld CPU cores available on this machine "
                          "(set LK_ALLOW_OVERSUBSCRIBE=1 to run anyway)",
                          (long long)cfg->devices, cores);
            goto fail;
        }
    }
    int64_t want = (cfg->devices > 0 ? cfg->devices : 1) * (cfg->num_nodes > 0 ? cfg->num_nodes : 1);
    if (dp) { /* one process drives every device */
        tr->dp_devices = (int)(cfg->devices > 0 ? cfg->devices : 1);
        want = 1;
        if (cfg->num_nodes > 1) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy '%s' runs on one node (num_nodes=%lld): use ddp",
                          si->name, (long long)cfg->num_nodes);
            goto fail;
        }
    }
    if (tr->world == 1 && want > 1 && !strcmp(tr->pg.source, "none") && cfg->num_nodes <= 1 &&
        pm == LK_PROCESS_PER_DEVICE) { /* auto, or a ddp */
        /* A program of the user's started alone: this process becomes the
         * job's launcher, and its first run starts the ranks (self_launch.c).
         * More than one node needs a launcher on each, so that stays an error. */
        tr->launcher = (int)want;
        *out = tr;
        return LK_STATUS_OK;
    }
    if (tr->world == 1 && want > 1 && cfg->num_nodes > 1) { /* fit's own launcher starts ranks on this node only */
        st = lk_error(LK_STATUS_INVALID_USAGE,
                      "trainer.devices=%lld x num_nodes=%lld needs %lld processes: a job on several nodes needs a "
                      "launcher on every node, and `lockstep fit` and `lockstep launch` start processes on this one "
                      "only: start the ranks with mpirun (e.g. mpirun -np %lld -H node1:%lld,node2:%lld lockstep fit "
                      "...) or srun --ntasks-per-node=%lld (lockstep reads the rank variables they set)",
                      (long long)(cfg->devices > 0 ? cfg->devices : 1), (long long)cfg->num_nodes, (long long)want,
                      (long long)want,
                      (long long)(cfg->devices > 0 ? cfg->devices : 1), (long long)(cfg->devices > 0 ? cfg->devices : 1),
                      (long long)(cfg->devices > 0 ? cfg->devices : 1));
        goto fail;
    }
    if (tr->world == 1 && want > 1) {
        st = lk_error(LK_STATUS_INVALID_USAGE,
                      "trainer.devices=%lld x num_nodes=%lld needs %lld processes, but this one was started alone: "
                      "run it through `lockstep fit` (which launches them) or `lockstep launch -n %lld -- ...`",
                      (long long)cfg->devices, (long long)cfg->num_nodes, (long long)want, (long long)want);
        goto fail;
    }
    if (tr->world > 1 && cfg->devices > 0 && want != tr->world) {
        st = lk_error(LK_STATUS_INVALID_USAGE,
                      "the launcher started %d processes (%s), but trainer.devices=%lld x num_nodes=%lld = %lld",
                      tr->world,
                      !strcmp(tr->pg.source, "openmpi") ? "OMPI_COMM_WORLD_SIZE"
                      : !strcmp(tr->pg.source, "slurm") ? "SLURM_NTASKS"
                      : !strcmp(tr->pg.source, "pmi")   ? "PMI_SIZE"
                                                        : "WORLD_SIZE",
                      (long long)cfg->devices, (long long)cfg->num_nodes, (long long)want);
        goto fail;
    }
    if (pm == LK_PROCESS_SINGLE && tr->world > 1) {
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "trainer.strategy '%s' runs one process, but %d were started",
                      si->name, tr->world);
        goto fail;
    }
    lk_log_set_rank(tr->rank, tr->world);
    /* The rank's memory cap, before the communicator's shared heap and the
     * model are allocated (a process-wide setting: dp's replicas, threads of
     * one process, share it). */
    double limit_mb = cfg->memory_limit_mb;
    const char *limit_from = "trainer.memory_limit_mb";
    if (limit_mb <= 0 && lk_env_get_number("LK_MEMORY_LIMIT_MB", 0, 1e9, &limit_mb)) limit_from = "LK_MEMORY_LIMIT_MB";
    if (limit_mb > 0) {
        tr->prev_memory_limit = lk_alloc_limit();
        tr->set_memory_limit = true;
        tr->memory_limit_from = limit_from;
        lk_alloc_set_limit((uint64_t)(limit_mb * 1024.0 * 1024.0), limit_from);
    }
    lk__faults_init(tr); /* faults.c: the tests' LK_TEST_* hooks */
    /* Ranks on one node share its cores: BLAS threads that outnumber them
     * spin against each other. */
    lk__threads_for_ranks(tr->pg.local_world_size > 0 ? tr->pg.local_world_size : 1);
    lk_trainer_config_comm_timeout_from(cfg, tr->comm_timeout_from, sizeof tr->comm_timeout_from);
    /* room for every rank's memory at the end of a fit, taken now so that
     * the end allocates nothing (a rank at its memory limit still reports) */
    if (!(tr->rank_memory = lk_calloc((size_t)(tr->world > 1 ? tr->world : 1) * LK__MEM_COLS, sizeof(int64_t))) ||
        !(tr->rank_pipe = lk_calloc((size_t)(tr->world > 1 ? tr->world : 1) * 2, sizeof(double)))) {
        st = LK_STATUS_OUT_OF_MEMORY;
        goto fail;
    }
    const char *forced = lk_env_get("LK_COMM_BACKEND");
    tr->comm_backend_from = forced && *forced && strcmp(forced, "auto") ? "LK_COMM_BACKEND" : "default";
    if (tr->world > 1) {
        lk_comm_config cc = lk_comm_config_default();
        cc.timeout_s = cfg->comm_timeout; /* LK_COMM_TIMEOUT is in it unless the config set the key */
        cc.timeout_from = tr->comm_timeout_from;
        /* Ranks on GPUs talk over nccl where it was built (Lightning's
         * default there), unless LK_COMM_BACKEND names another, or ranks
         * share a GPU (LK_ALLOW_OVERSUBSCRIBE), which nccl refuses: shm. */
        bool shared_gpu = tr->pg.local_world_size > lk_device_count(LK_CUDA);
        for (int i = 0; tr->dev.kind == LK_CUDA && !shared_gpu && !(forced && *forced) && i < lk_comm_backend_count(); i++)
            if (!strcmp(lk_comm_backend_name_at(i), "nccl")) cc.backend = "nccl";
        cc.pg = &tr->pg;
        st = lk_comm_create(&cc, &tr->comm);
        if (st) goto fail;
        /* devices x num_nodes equal to the world size can still disagree
         * with where the launcher put the ranks (num_nodes differing between
         * nodes' command lines, or ranks per node): Lightning refuses that
         * for SLURM too. The communicator's placement is the host names'
         * on mpi/hier, the launcher's variables elsewhere. */
        const lk_pg_info *at = lk_comm_pg(tr->comm);
        if (!dp && cfg->devices > 0 && (at->num_nodes != cfg->num_nodes || at->local_world_size != cfg->devices)) {
            char host[64] = "";
            gethostname(host, sizeof host - 1);
            st = lk_error(LK_STATUS_INVALID_USAGE,
                          "trainer.num_nodes=%lld x devices=%lld does not match where the launcher put the %d ranks: "
                          "%d node(s), %d rank(s) on this one (rank %d on host '%s', node %d; as the %s backend places "
                          "them): set trainer.num_nodes=%d and trainer.devices=%d on every node",
                          (long long)cfg->num_nodes, (long long)cfg->devices, tr->world, at->num_nodes,
                          at->local_world_size, tr->rank, host, at->node_rank, lk_comm_backend(tr->comm), at->num_nodes,
                          at->local_world_size);
            goto fail;
        }
    }
    lk_strategy_config sc = lk_strategy_config_default();
    sc.name = cfg->strategy;
    if (tr->world == 1 && !dp) sc.name = "auto"; /* one process: auto is single, nothing to reduce across processes */
    sc.devices = tr->dp_devices;
    sc.comm = tr->comm;
    /* ddp's options from the trainer's keys (and trainer.strategy's init_args, which set them) */
    lk_ddp_options ddp = lk_ddp_options_default();
    ddp.bucket_cap_mb = cfg->bucket_cap_mb;
    ddp.shared_params = cfg->ddp_shared_params;
    ddp.broadcast_buffers = cfg->ddp_broadcast_buffers;
    ddp.comm_dtype = comm_dtype;
    sc.ddp = &ddp;
    sc.param_dtype = param_dtype;
    sc.device = tr->dev;
    /* model_parallel and pipeline: trainer.pipeline.*; chunks only where the strategy runs several */
    sc.pipe_chunks = !strcmp(cfg->strategy, "model_parallel") ? 1 : (int)cfg->pipeline_chunks;
    sc.pipe_schedule = cfg->pipeline_schedule;
    sc.pipe_split = cfg->pipeline_split;
    sc.pipe_stages = (int)cfg->pipeline_stages;
    sc.pipe_virtual_stages = (int)cfg->pipeline_virtual_stages;
    /* fsdp, deepspeed_stage_3: trainer.fsdp_* (FSDPStrategy's init_args set them) */
    lk_fsdp_options fo = lk_fsdp_options_default();
    for (int k = 0; k < 4; k++)
        if (!strcmp(cfg->fsdp_sharding_strategy, lk_fsdp_sharding_name((lk_fsdp_sharding)k))) fo.sharding = (lk_fsdp_sharding)k;
    fo.wrap_types = cfg->fsdp_auto_wrap_policy;
    fo.min_num_params = cfg->fsdp_min_num_params;
    fo.forward_prefetch = cfg->fsdp_forward_prefetch;
    fo.backward_prefetch = cfg->fsdp_backward_prefetch;
    fo.cpu_offload = cfg->fsdp_cpu_offload || lk_strategy_name_offloads(cfg->strategy); /* (a C API caller's name) */
    sc.fsdp = &fo;
    st = lk_strategy_create(&sc, &tr->strat);
    if (st) goto fail;
    tr->params = lk_strategy_local_params(tr->strat);
    const lk_strategy_info *made = lk_strategy_info_get(lk_strategy_name(tr->strat));
    if (comm_dtype != LK_F32 && !(made && made->ddp_options) && tr->rank == 0)
        lk_log_warn("trainer.ddp_comm_hook %s has no effect: the strategy is %s on %d process%s (it compresses ddp's "
                    "gradient all-reduce between processes)",
                    cfg->ddp_comm_hook, dp ? si->name : lk_strategy_name(tr->strat), tr->world, tr->world == 1 ? "" : "es");
    *out = tr;
    return LK_STATUS_OK;
fail:
    lk_trainer_free(tr);
    return st;
}

void lk_trainer_free(lk_trainer *tr) {
    if (!tr) return;
    lk__run_cleanup(tr);
    if (tr->prev_f32_matmul) lk_set_float32_matmul_precision(tr->prev_f32_matmul);
    if (tr->set_memory_limit) lk_alloc_set_limit(tr->prev_memory_limit, NULL);
    lk_free(tr->rank_memory);
    lk_free(tr->rank_pipe);
    lk_strategy_free(tr->strat); /* with the parameter layout it made (tr->params) */
    lk_comm_free(tr->comm);
    lk_free(tr->metrics);
    lk_free(tr->ckpt_rows);
    for (int j = 0; j < tr->nckpts; j++) lk_free(tr->ckpts[j].topk);
    lk_free(tr->config_yaml);
    lk_free(tr);
}

int lk_trainer_rank(const lk_trainer *tr) { return tr->launcher ? -1 : tr->rank; }
int lk_trainer_world_size(const lk_trainer *tr) { return tr->launcher ? tr->launcher : tr->world; }
int64_t lk_trainer_current_epoch(const lk_trainer *tr) { return tr->epoch; }
int64_t lk_trainer_global_step(const lk_trainer *tr) { return tr->global_step; }
const char *lk_trainer_log_dir(const lk_trainer *tr) { return tr->log_dir; }
const char *lk_trainer_last_checkpoint(const lk_trainer *tr) { return tr->last_ckpt; }
const char *lk_trainer_best_checkpoint(const lk_trainer *tr) { return tr->best_ckpt; }

/* The run's summary once a command ends: run.json (rank 0; the struct
 * lk_runinfo filled from the trainer's metrics, best checkpoint, step counts,
 * throughput and mean step phases, and written by runinfo.c) and the
 * profiler's table of mean phase times per optimizer step. Both read the
 * trainer's state and change nothing in it. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/gemm_path.h"
#include "backend/isa.h"
#include "backend/threads.h"
#include "device/gpu.h"
#include "lockstep/pipeline.h"
#include "train/train_impl.h"

#ifndef LK_GIT_REV
#define LK_GIT_REV "unknown"
#endif

/* Writes run.json on rank 0. A failure to write it (the disk that failed
 * the checkpoint is usually full for run.json too) is a warning and leaves
 * the run's own error as the last error: the first failure is the one the
 * user must see. */
void lk__write_runinfo(lk_trainer *tr, const char *command, lk_status st) {
    if (tr->rank != 0 || !tr->log_dir[0]) return;
    char first[2048];
    snprintf(first, sizeof first, "%s", lk_last_error());
    const char *names[128];
    double vals[128];
    int k = 0;
    for (int i = 0; i < tr->nmetrics && k < 128; i++)
        if (tr->metrics[i].has_value) {
            names[k] = tr->metrics[i].name;
            vals[k++] = tr->metrics[i].value;
        }
    lk_runinfo ri = lk_runinfo_default();
    ri.command = command;
    ri.status = st ? "error" : "ok";
    ri.error = st ? lk_last_error() : NULL;
    ri.n_metrics = k;
    ri.metric_names = names;
    ri.metric_values = vals;
    ri.best_monitor = tr->nckpts && tr->ckpts[0].c.monitor[0] ? tr->ckpts[0].c.monitor : NULL;
    ri.best_score = tr->best_score;
    ri.best_path = tr->best_ckpt[0] ? tr->best_ckpt : NULL;
    ri.epochs = tr->epoch;
    ri.global_step = tr->global_step;
    ri.wall_s = lk_time_now() - tr->t_start;
    /* Each data-parallel replica sees its own samples; the ranks of one
     * pipeline (or one model cut into stages) see the same ones: count the
     * replicas, not the ranks. */
    double replicas = tr->strat ? (double)lk_strategy_dp_size(tr->strat) : (double)tr->world;
    if (tr->t_steady > 0 && tr->t_train_end > tr->t_steady && tr->timed_steps > 5)
        ri.samples_per_s = (double)(tr->samples_seen - tr->samples_steady) * replicas / (tr->t_train_end - tr->t_steady);
    else
        ri.samples_per_s = tr->train_time > 0 ? (double)tr->samples_seen * replicas / tr->train_time : 0;
    ri.time_to_first_step_s = tr->t_first_step > 0 ? tr->t_first_step - tr->t_start : 0;
    ri.world_size = tr->world;
    ri.strategy = tr->dp_devices ? "dp" : lk_strategy_name(tr->strat);
    /* the device this rank trained on: cpu, gpu (cuda) or a registered kind's name */
    char kind[32];
    lk_device_str((lk_device){tr->dev.kind, 0}, kind, sizeof kind);
    char *colon = strchr(kind, ':');
    if (colon) *colon = 0;
    ri.accelerator = tr->dev.kind == LK_CPU ? "cpu" : tr->dev.kind == LK_CUDA ? "gpu" : kind;
    lk__replay_stats rs = lk__replay_get_stats(), r0 = tr->replay_at_start;
    if (rs.steps > r0.steps) {
        ri.graphs.used = true;
        ri.graphs.steps = rs.steps - r0.steps;
        ri.graphs.captures = rs.captures - r0.captures;
        ri.graphs.launches = rs.launches - r0.launches;
        ri.graphs.eager_segments = rs.segments_eager - r0.segments_eager;
        ri.graphs.eager_ops = rs.eager_items - r0.eager_items;
        ri.graphs.refused = rs.capture_failures - r0.capture_failures;
    }
    ri.precision = tr->cfg.precision;
    ri.gemm_path = lk__train_gemm_path(tr);
    ri.cpu_isa = lk__cpu_isa_name(lk__cpu_isa());
    ri.comm_backend = tr->comm ? lk_comm_backend(tr->comm) : NULL;
    ri.git_revision = LK_GIT_REV;
    ri.log_dir = tr->log_dir;
    ri.last_checkpoint = tr->last_ckpt[0] ? tr->last_ckpt : NULL;
    double n = tr->timed_steps > 0 ? (double)tr->timed_steps : 1;
    double z[6] = {0};
    if (tr->t_steady > 0 && tr->timed_steps > 5) { /* steady state, like samples_per_s: the steps after the 5th */
        n = (double)(tr->timed_steps - 5);
        memcpy(z, tr->sum_at_steady, sizeof z);
    }
    ri.step_time = (lk_runinfo_times){1e3 * (tr->sum_data - z[0]) / n, 1e3 * (tr->sum_fwd - z[1]) / n,
                                      1e3 * (tr->sum_bwd - z[2]) / n, 1e3 * (tr->sum_comm - z[3]) / n,
                                      1e3 * (tr->sum_opt - z[4]) / n, 1e3 * (tr->sum_comm_wait - z[5]) / n};
    ri.step_peak_mb = (double)tr->step_peak_bytes / (1024.0 * 1024.0);
    lk_strategy_stats pst = tr->strat ? lk_strategy_get_stats(tr->strat) : (lk_strategy_stats){0};
    if (pst.pipe_stages > 0) {
        ri.pipe_stages = pst.pipe_stages;
        ri.pipe_chunks = pst.pipe_chunks;
        ri.pipe_virtual = pst.pipe_virtual > 1 ? pst.pipe_virtual : 1;
        /* the mean over the ranks of each rank's idle share (every stage's,
         * as the theory counts every stage's idle time), when a fit gathered
         * them; rank 0's alone otherwise */
        ri.pipe_bubble = lk__pipe_share((const double[]){pst.pipe_run_s, pst.pipe_comm_s});
        ri.pipe_bubble_first = ri.pipe_bubble;
        int nr = tr->rank_pipe && tr->n_rank_memory > 1 ? tr->n_rank_memory : 0;
        double sum = 0;
        for (int r = 0; r < nr; r++) sum += lk__pipe_share(tr->rank_pipe + 2 * r);
        if (nr > 0) ri.pipe_n_ranks = nr, ri.pipe_rank_times = tr->rank_pipe, ri.pipe_bubble = sum / nr;
        /* interleaved, v stages per rank: (p - 1) / (v m + p - 1) */
        ri.pipe_bubble_theory = lk_pipe_bubble_theory(pst.pipe_stages, pst.pipe_chunks * (pst.pipe_virtual > 1 ? pst.pipe_virtual : 1));
    }
    if (!tr->dp_devices && lk_strategy_wrapped(tr->strat)) { /* dp's replicas are threads: one process holds them all */
        lk_strategy_memory mem = lk_strategy_get_memory(tr->strat);
        ri.has_model_state = true;
        ri.model_state_bytes[0] = mem.param_bytes;
        ri.model_state_bytes[1] = mem.grad_bytes;
        ri.model_state_bytes[2] = mem.optim_state_bytes;
        ri.model_state_bytes[3] = mem.gathered_bytes;
    }
    ri.n_ranks = tr->n_rank_memory;
    ri.rank_memory = tr->rank_memory;
    ri.memory_limit_bytes = (int64_t)lk_alloc_limit();
    ri.memory_limit_from = tr->set_memory_limit ? tr->memory_limit_from : "lk_alloc_set_limit";
    ri.config_yaml = tr->config_yaml;
    /* The settings an LK_* variable can also give, and where each value came from */
    lk_runinfo_setting set[6];
    int ns = 0;
    set[ns++] = (lk_runinfo_setting){"comm_timeout", NULL, tr->cfg.comm_timeout, tr->comm_timeout_from};
    set[ns++] = (lk_runinfo_setting){"num_threads", NULL, lk_get_num_threads(), lk__num_threads_from()};
    set[ns++] = (lk_runinfo_setting){"comm_backend", ri.comm_backend, NAN, tr->comm_backend_from}; /* null without one (dp) */
    static const char *const levels[] = {"debug", "info", "warn", "error", "off"};
    set[ns++] = (lk_runinfo_setting){"log_level", levels[lk_log_get_level()], 0, lk__log_level_from()};
    const char *data_dir, *data_from;
    if (lk__builtin_data_root(tr->dm, &data_dir, &data_from))
        set[ns++] = (lk_runinfo_setting){"data_root", data_dir, 0, data_from};
    ri.n_settings = ns;
    ri.settings = set;
    char path[LK_PATH + 16];
    snprintf(path, sizeof path, "%s/run.json", tr->log_dir);
    lk_status wst = lk_runinfo_write(path, &ri);
    if (wst) {
        lk_log_warn("could not write %s: %s", path, lk_last_error());
        if (st) lk_error(st, "%s", first);
    }
}

/* This process's peak resident set in bytes (ru_maxrss: KiB on Linux);
 * -1 when the system will not say. */
static int64_t max_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return (int64_t)ru.ru_maxrss * 1024;
}

void lk__memory_collect(lk_trainer *tr) {
    int64_t mine[LK__MEM_COLS] = {-1, -1, -1, -1, (int64_t)lk_alloc_peak_bytes(), max_rss_bytes()};
    if (!tr->dp_devices && tr->strat && lk_strategy_wrapped(tr->strat)) { /* dp: replicas are threads, not ranks */
        lk_strategy_memory m = lk_strategy_get_memory(tr->strat);
        mine[LK__MEM_PARAMS] = m.param_bytes;
        mine[LK__MEM_GRADS] = m.grad_bytes;
        mine[LK__MEM_OPTIM] = m.optim_state_bytes;
        mine[LK__MEM_GATHERED] = m.gathered_bytes;
    }
    if (!tr->rank_memory) return; /* a trainer that failed to create */
    int n = tr->comm && tr->world > 1 ? tr->world : 1;
    memcpy(tr->rank_memory, mine, sizeof mine);
    /* rank_memory has room for every rank (lk_trainer_create): nothing is
     * allocated here, so a rank at its memory limit still meets the others */
    if (n > 1 && lk_comm_gather(tr->comm, mine, tr->rank_memory, LK__MEM_COLS, LK_I64, 0)) {
        lk_log_warn("memory per rank: could not gather it: %s", lk_last_error());
        memcpy(tr->rank_memory, mine, sizeof mine);
        n = 1;
    }
    /* a pipeline's bubble per rank (every stage's, not only rank 0's) */
    lk_strategy_stats pst = tr->strat ? lk_strategy_get_stats(tr->strat) : (lk_strategy_stats){0};
    double pipe[2] = {pst.pipe_run_s, pst.pipe_comm_s};
    memcpy(tr->rank_pipe, pipe, sizeof pipe);
    if (n > 1 && pst.pipe_stages > 0 && lk_comm_gather(tr->comm, pipe, tr->rank_pipe, 2, LK_F64, 0)) {
        lk_log_warn("pipeline bubble per rank: could not gather it: %s", lk_last_error());
        memcpy(tr->rank_pipe, pipe, sizeof pipe);
        n = 1;
    }
    if (tr->rank != 0) n = 1; /* the others keep their own row */
    tr->n_rank_memory = n;
    if (tr->rank != 0) return;
    const double mib = 1024.0 * 1024.0;
    uint64_t cap = lk_alloc_limit();
    char limit[96] = "";
    if (cap) snprintf(limit, sizeof limit, ", limit %.1f MiB per rank (%s)", (double)cap / mib, tr->memory_limit_from);
    lk_log0("memory per rank (MiB): model state = parameters + gradients + optimizer state + gathered; peak = lockstep's "
            "peak live bytes, the process's peak RSS%s", limit);
    for (int r = 0; r < n; r++) {
        const int64_t *v = tr->rank_memory + (size_t)r * LK__MEM_COLS;
        char state[160] = "model state unknown (dp's replicas are threads of one process)";
        if (v[LK__MEM_PARAMS] >= 0)
            snprintf(state, sizeof state, "model state %.2f = %.2f + %.2f + %.2f + %.2f",
                     (double)(v[LK__MEM_PARAMS] + v[LK__MEM_GRADS] + v[LK__MEM_OPTIM] + v[LK__MEM_GATHERED]) / mib,
                     (double)v[LK__MEM_PARAMS] / mib, (double)v[LK__MEM_GRADS] / mib, (double)v[LK__MEM_OPTIM] / mib,
                     (double)v[LK__MEM_GATHERED] / mib);
        lk_log0("  rank %d: %s; peak %.2f, peak RSS %.2f", r, state, (double)v[LK__MEM_ALLOC_PEAK] / mib,
                (double)v[LK__MEM_MAX_RSS] / mib);
    }
}

const char *lk__train_gemm_path(const lk_trainer *tr) {
    return lk__backend_gemm_path(tr->dev.kind, tr->autocast);
}

void lk__print_profile(lk_trainer *tr) {
    if (tr->rank != 0 || !strcmp(tr->cfg.profiler, "none") || tr->timed_steps == 0) return; /* every profiler shows the phases */
    double n = (double)tr->timed_steps;
    double tot = tr->sum_data + tr->sum_fwd + tr->sum_bwd + tr->sum_comm + tr->sum_opt;
    printf("\nprofiler (%s): %lld optimizer steps, mean per step\n", tr->cfg.profiler, (long long)tr->timed_steps);
    const char *names[] = {"data wait", "forward", "backward", "exposed comm", "optimizer"};
    double v[] = {tr->sum_data, tr->sum_fwd, tr->sum_bwd, tr->sum_comm, tr->sum_opt};
    for (int i = 0; i < 5; i++) {
        printf("  %-14s %9.3f ms  %5.1f%%\n", names[i], 1e3 * v[i] / n, tot > 0 ? 100 * v[i] / tot : 0);
        if (i == 3 && tr->sum_comm_wait > 0) /* exposed comm = waiting for the last rank + moving the data */
            printf("    %-12s %9.3f ms  (waiting for the last rank to arrive)\n", "of which", 1e3 * tr->sum_comm_wait / n);
    }
}

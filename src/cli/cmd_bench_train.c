/* `lockstep bench train`: training throughput per model x strategy x
 * devices x per-device batch size, with scaling efficiency and the step
 * time split into data wait, forward, backward, exposed communication and
 * optimizer — the shape of the classic Lightning DP-vs-DDP study. Each cell
 * is a real `lockstep fit` run on synthetic data (steady state, read back
 * from its run.json). Writes a table (a failed cell says why, never 0
 * samples/s), recommendations drawn from it, and optionally CSV and two SVG
 * charts (bench_report.c). */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/bench_report.h"
#include "cli/cli.h"
#include "lockstep.h"

#define MAXV 8
#define MAXR 15

typedef lk__bench_cell cell;

/* The machine's CPU time so far, and the part a hypervisor stole (in
 * clock ticks, /proc/stat's first line); false where there is no such file.
 * Steal on any core stalls every rank of a synchronous job, but costs an
 * independent process only its own share: a run it hit is not comparable. */
static bool cpu_ticks(double *total, double *steal) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return false;
    double v[8] = {0};
    int n = fscanf(f, "cpu %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    if (n != 8) return false;
    *total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    *steal = v[7];
    return true;
}

/* One row of the table: a model x strategy x batch size, its cells per
 * device count, every round's run of each. */
typedef struct {
    cell runs[MAXV][MAXR];
    cell *out[MAXV];
    int n;
} row_t;

static int parse_list(int argc, char **argv, int *i, const char **out, int max) {
    int n = 0;
    while (*i + 1 < argc && argv[*i + 1][0] != '-' && n < max) out[n++] = argv[++*i];
    return n;
}

static const char *prec_of(const cell *c) { return c->precision ? c->precision : "32-true"; }

static char self_exe[1024];

/* Removes the runs' directory and all in it (nftw, depth first). */
static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    remove(path); /* what cannot be removed is left; the rest goes on */
    return 0;
}
static void remove_tree(const char *dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }
static char extra_args[4096]; /* after `--`: appended to every fit, shell-quoted */

/* Reads samples/s and the step split of one run into c (summing samples/s
 * and averaging the split when called for several concurrent copies). */
static bool read_run(cell *c, const char *root, int copies) {
    char path[700];
    snprintf(path, sizeof path, "%s/lightning_logs/version_0/run.json", root);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    if (!j) return false;
    c->sps += cJSON_GetNumberValue(cJSON_GetObjectItem(j, "samples_per_s"));
    const cJSON *pk = cJSON_GetObjectItem(j, "step_peak_mb");
    c->step_mb = cJSON_IsNumber(pk) ? pk->valuedouble : NAN; /* per process: the same in each copy */
    const cJSON *pp = cJSON_GetObjectItem(j, "pipeline"), *bu = cJSON_GetObjectItem(pp, "bubble"),
                *bt = cJSON_GetObjectItem(pp, "bubble_theory");
    c->bubble = cJSON_IsNumber(bu) ? bu->valuedouble : NAN;
    c->bubble_theory = cJSON_IsNumber(bt) ? bt->valuedouble : NAN;
    c->bubble_slowest = NAN;
    const cJSON *per = cJSON_GetObjectItem(pp, "bubble_per_rank"), *v;
    cJSON_ArrayForEach(v, per) if (cJSON_IsNumber(v) && !(v->valuedouble >= c->bubble_slowest)) c->bubble_slowest = v->valuedouble;
    cJSON *st = cJSON_GetObjectItem(j, "step_time");
    static const char *keys[6] = {"data_ms", "forward_ms", "backward_ms", "comm_exposed_ms", "optimizer_ms", "comm_wait_ms"};
    for (int k = 0; k < 6; k++) {
        const cJSON *v = cJSON_GetObjectItem(st, keys[k]);
        c->t[k] += cJSON_IsNumber(v) ? v->valuedouble / copies : 0;
    }
    cJSON_Delete(j);
    return true;
}

/* Why a run failed, in its own words: the first "error: " line of its log
 * (the fit's message names the key, rank or limit), else the log's last
 * line, else what the shell's status says. */
/* Copies src into dst[cap], cut to fit (a reason is for reading, and its
 * start says the most). */
static void copy_cut(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

static void failure_reason(cell *c, const char *log, int rc, bool ran) {
    copy_cut(c->log, sizeof c->log, log);
    char line[1024], last[1024] = "";
    FILE *f = fopen(log, "r");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        const char *e = strstr(line, "error: ");
        if (e) {
            e += 7;
            int skip = 0; /* a rank's own "[rank R] " after "error: ": the cell's message starts after it */
            if (sscanf(e, "[rank %*d] %n", &skip) == 0 && skip > 0) e += skip;
            copy_cut(c->error, sizeof c->error, e);
            fclose(f);
            return;
        }
        if (line[0]) copy_cut(last, sizeof last, line);
    }
    if (f) fclose(f);
    if (last[0]) copy_cut(c->error, sizeof c->error, last);
    else if (rc != -1 && WIFSIGNALED(rc)) snprintf(c->error, sizeof c->error, "killed by signal %d", WTERMSIG(rc));
    else if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc))
        snprintf(c->error, sizeof c->error, "exited with status %d and printed nothing", WEXITSTATUS(rc));
    else if (ran) snprintf(c->error, sizeof c->error, "finished but wrote no run.json");
    else snprintf(c->error, sizeof c->error, "could not be started");
}

/* A strategy of the list, "pipeline:interleaved_1f1b" naming a pipeline
 * schedule too (so that schedules compare in one run's rounds): its name
 * in `base`, the schedule in *schedule (NULL when none is named). */
static void strategy_variant(const char *s, char *base, size_t n, const char **schedule) {
    const char *colon = strchr(s, ':');
    size_t len = colon ? (size_t)(colon - s) : strlen(s);
    snprintf(base, n, "%.*s", (int)(len < n ? len : n - 1), s);
    *schedule = colon && colon[1] ? colon + 1 : NULL;
}

/* A cell is one `lockstep fit`. The pseudo-strategy "independent" runs N
 * single-device fits at once, with no communication at all: the throughput
 * N devices of this machine reach when they share its caches and memory
 * bandwidth, the ceiling any strategy's scaling is measured against. */
static bool run_cell(cell *c, int steps, const char *tmp, int rep) {
    bool indep = !strcmp(c->strategy, "independent");
    int copies = indep ? c->devices : 1;
    char root[512], cmd[16384];
    size_t len = 0;
    long samples = (long)steps * c->batch * (indep ? 1 : c->devices) * 5 / 4 + 64; /* 80% train split */
    /* per-device batch B: dp's one loader feeds all replicas, so it loads N x B */
    char base[64];
    const char *schedule;
    strategy_variant(c->strategy, base, sizeof base, &schedule);
    char sched_arg[96] = ""; /* a schedule on one device is a pipeline of one stage: 1f1b's */
    if (schedule && c->devices > 1) snprintf(sched_arg, sizeof sched_arg, " --trainer.pipeline.schedule %s", schedule);
    const lk_strategy_info *si = lk_strategy_info_get(base); /* NULL: independent */
    int loader_batch = si && si->process_model == LK_PROCESS_THREADS ? c->batch * c->devices : c->batch;
    /* gpt (any token model) trains on synthetic token ids: 64 per sample
     * (the GPT-2-124M cell is batch 4 x 64 tokens) of its default
     * vocabulary; `-- --model.init_args.vocab_size V --data.init_args.num_classes V`
     * for another model shape */
    const lk_model_info *mi = lk_model_find(c->model);
    if (!mi) lk_clear_error();
    bool tok = mi && mi->tokens;
    const char *input = tok ? "[64]" : !strcmp(c->model, "cnn") ? "[1, 28, 28]" : "[784]";
    char data_extra[160] = "--data.init_args.num_classes 10";
    if (tok) {
        const char *vocab = "50304";
        for (int i = 0; i < mi->n_args; i++)
            if (!strcmp(mi->args[i].name, "vocab_size")) vocab = mi->args[i].default_value;
        snprintf(data_extra, sizeof data_extra, "--data.init_args.task tokens --data.init_args.num_classes %s", vocab);
    }
    len += (size_t)snprintf(cmd + len, sizeof cmd - len, "(");
    for (int k = 0; k < copies && len < sizeof cmd; k++) {
        snprintf(root, sizeof root, "%s/%s-%s-%s-%d-%d-r%d-%d", tmp, c->model, c->strategy, prec_of(c), c->devices,
                 c->batch, rep, k);
        len += (size_t)snprintf(
            cmd + len, sizeof cmd - len,
            "'%s' fit --model.class_path %s --data.class_path synthetic "
            "--data.init_args.num_samples %ld --data.init_args.input_shape '%s' %s "
            "--data.init_args.batch_size %d --data.init_args.num_workers 1 "
            "--trainer.devices %d --trainer.strategy %s%s --trainer.precision %s --trainer.max_steps %d --trainer.max_epochs 1 "
            "--trainer.limit_val_batches 0 --trainer.num_sanity_val_steps 0 --trainer.enable_checkpointing false "
            "--trainer.enable_progress_bar false --trainer.enable_tensorboard false "
            "--trainer.default_root_dir '%s'%s > '%s.log' 2>&1 %s",
            self_exe, c->model, samples, input, data_extra, loader_batch, indep ? 1 : c->devices, indep ? "single" : base,
            sched_arg, prec_of(c), steps, root, extra_args, root, copies > 1 ? "&" : "");
    }
    if (len + 16 >= sizeof cmd) {
        snprintf(c->error, sizeof c->error, "its fit command line is longer than %zu bytes", sizeof cmd);
        return false;
    }
    snprintf(cmd + len, sizeof cmd - len, "%s)", copies > 1 ? " wait" : "");
    /* With `&`, the shell's status is wait's: each copy's run.json says whether it finished. */
    double tot0, st0, tot1, st1;
    bool ticks = cpu_ticks(&tot0, &st0);
    int rc = system(cmd);
    ticks = ticks && cpu_ticks(&tot1, &st1) && tot1 > tot0;
    c->steal = ticks ? (st1 - st0) / (tot1 - tot0) : NAN;
    /* Every copy is read even when the shell failed: the failing copy's
     * log (not the first one's) says why. */
    bool ok = rc == 0;
    for (int k = 0; k < copies; k++) {
        snprintf(root, sizeof root, "%s/%s-%s-%s-%d-%d-r%d-%d", tmp, c->model, c->strategy, prec_of(c), c->devices,
                 c->batch, rep, k);
        if (read_run(c, root, copies)) continue;
        char log[sizeof root + 8];
        snprintf(log, sizeof log, "%s.log", root);
        failure_reason(c, log, rc, rc != -1);
        ok = false;
        break;
    }
    if (!ok) {
        c->sps = 0;
        fprintf(stderr, "bench train: %s %s %s x%d batch %d failed: %s\n", c->model, c->strategy, prec_of(c),
                c->devices, c->batch, c->error);
        return false;
    }
    c->ok = true;
    return true;
}

/* The run with the median samples/s (the lower middle for an even count);
 * failed runs count as 0, so a cell is ok only if its median run is. */
static cell median_run(const cell *runs, int n) {
    int order[MAXR];
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && runs[order[j]].sps < runs[order[j - 1]].sps; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    return runs[order[(n - 1) / 2]];
}

/* Writes one chart to path; false (with the reason on stderr) on failure. */
static bool write_chart(const char *path, lk_status (*draw)(FILE *, const cell *, int), const cell *cells, int n) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench train: cannot write the chart %s\n", path);
        return false;
    }
    lk_status st = draw(f, cells, n);
    if (fclose(f) || st) {
        fprintf(stderr, "bench train: writing %s failed%s%s\n", path, st ? ": " : "", st ? lk_last_error() : "");
        return false;
    }
    printf("wrote %s\n", path);
    return true;
}

/* A CSV field: quoted, with quotes doubled, since error messages hold commas. */
static void csv_quoted(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* A count on the command line: digits only, from 1 to max. */
static bool whole(const char *s, long max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 1 || v > max || !isdigit((unsigned char)s[0])) return false;
    *out = (int)v;
    return true;
}

static int bad_number(const char *opt, const char *v, long max) {
    fprintf(stderr, "lockstep bench train: %s '%s' is not a whole number from 1 to %ld\n", opt, v, max);
    return 2;
}

int lk_cmd_bench_train(int argc, char **argv) {
    const char *models[MAXV] = {"autoencoder"}, *strategies[MAXV] = {"ddp"}, *dev_s[MAXV] = {"1", "2"},
               *batch_s[MAXV] = {"64", "128", "256"}, *precisions[MAXV] = {"32-true"};
    int nm = 1, ns = 1, nd = 2, nb = 3, np = 1, steps = 60, repeats = 1;
    const char *csv = NULL, *plot = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { /* the rest goes to every `lockstep fit` */
            size_t len = 0;
            for (int k = i + 1; k < argc; k++) {
                if (strchr(argv[k], '\'')) {
                    fprintf(stderr, "lockstep bench train: fit argument %s contains a quote\n", argv[k]);
                    return 2;
                }
                int w = snprintf(extra_args + len, sizeof extra_args - len, " '%s'", argv[k]);
                if (w < 0 || (size_t)w >= sizeof extra_args - len) {
                    fprintf(stderr, "lockstep bench train: fit arguments after -- are too long\n");
                    return 2;
                }
                len += (size_t)w;
            }
            break;
        }
        if (!strcmp(argv[i], "--model") || !strcmp(argv[i], "--models")) nm = parse_list(argc, argv, &i, models, MAXV);
        else if (!strcmp(argv[i], "--strategies")) ns = parse_list(argc, argv, &i, strategies, MAXV);
        else if (!strcmp(argv[i], "--devices") || !strcmp(argv[i], "--gpus")) nd = parse_list(argc, argv, &i, dev_s, MAXV);
        else if (!strcmp(argv[i], "--batch-sizes")) nb = parse_list(argc, argv, &i, batch_s, MAXV);
        else if (!strcmp(argv[i], "--precision") || !strcmp(argv[i], "--precisions"))
            np = parse_list(argc, argv, &i, precisions, MAXV);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            if (!whole(argv[++i], 1000000000, &steps)) return bad_number("--steps", argv[i], 1000000000);
        } else if (!strcmp(argv[i], "--repeats") && i + 1 < argc) {
            if (!whole(argv[++i], MAXR, &repeats)) return bad_number("--repeats", argv[i], MAXR);
        }
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
        else if (!strcmp(argv[i], "--plot") && i + 1 < argc) plot = argv[++i];
        else if (!strcmp(argv[i], "--help")) {
            printf("usage: lockstep bench train [--model M...] [--strategies ddp single...] [--devices 1 2...]\n"
                   "       [--batch-sizes 64 128 256...] [--precision 32-true bf16-mixed 16-mixed...]\n"
                   "       [--steps N] [--repeats R] [--csv FILE] [--plot FILE.svg]\n"
                   "       [-- FIT ARGS...]   (e.g. -- --trainer.bucket_cap_mb 1: added to every fit)\n"
                   "Each cell is a `lockstep fit` run of N optimizer steps on synthetic 28x28 data; throughput\n"
                   "and the step-time split are steady-state figures (from step 5 on) read from run.json;\n"
                   "(wait) is the part of comm_ms spent waiting for the last rank to arrive (stragglers).\n"
                   "--repeats R runs R rounds, each running every cell once (all strategies, batch sizes and\n"
                   "device counts in turn), so drifting machine load hits the cells alike; each cell reports\n"
                   "its median run, and scaling is the median over rounds of (N-device run) / (N x the\n"
                   "1-device run of the same round), with the range of those ratios after the columns.\n"
                   "A strategy may name a pipeline schedule, `pipeline:interleaved_1f1b` (or gpipe, 1f1b), so\n"
                   "that schedules compare in one run's rounds; on one device it is a pipeline of one stage.\n"
                   "Strategy `independent` runs N single-device fits at once (no communication): the\n"
                   "throughput N devices of this machine reach while sharing its caches and memory, the\n"
                   "ceiling for any strategy's scaling.\n"
                   "step_MB is the tensor memory one forward + backward took beyond what was live before it\n"
                   "(activations, saved tensors, temporaries), per process (rank 0's run.json step_peak_mb).\n"
                   "steal is the share of the machine's CPU time a hypervisor took during the cell's median run\n"
                   "(/proc/stat): on a shared VM it stalls every rank of ddp or dp, so a cell it hit is noise.\n"
                   "bubble/th (pipeline cells): the measured share of the step its stages sat idle waiting on\n"
                   "each other (the mean over the ranks), then its schedule's theory (p-1)/(m+p-1) for p stages\n"
                   "and m micro-batches ((p-1)/(vm+p-1) with v stages per rank, interleaved_1f1b); the\n"
                   "recommendations give the slowest stage's own share beside it.\n"
                   "--gpus is another name for --devices (on the CPU a device is a core).\n"
                   "A cell whose run fails shows `failed` and a short reason, with the full message in a note\n"
                   "under the table; it is left out of the scaling, the recommendations and the charts, and\n"
                   "the command exits with status 1. A device count above this machine's cores is said before\n"
                   "the table and its cells are not run (LK_ALLOW_OVERSUBSCRIBE=1 runs them). The runs'\n"
                   "temporary directory ($TMPDIR or /tmp, lkbench.*) is removed at the end, failures or not.\n"
                   "The recommendations after the table are read off its\n"
                   "ok cells: the best cell, each strategy's scaling at its largest device count and which\n"
                   "phases the loss is in, dp against ddp, and how the batch size matters. A difference no\n"
                   "larger than the noise the run measured (the range of a cell's repeats, or the difference\n"
                   "between 1-device cells of two strategies, which run the same process) is not advice.\n"
                   "--csv adds status (ok|failed) and error columns after the measured ones; a failed cell's\n"
                   "numbers are empty. --plot FILE.svg writes the throughput chart to FILE.svg and the\n"
                   "scaling-efficiency chart to FILE-scaling.svg.\n"
                   "--precision runs every cell in each trainer.precision given; scaling compares cells of one\n"
                   "precision, and the recommendations add each precision's speed against the first one's.\n");
            return 0;
        } else {
            fprintf(stderr, "lockstep bench train: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    int v;
    for (int d = 0; d < nd; d++)
        if (!whole(dev_s[d], 4096, &v)) return bad_number("--devices", dev_s[d], 4096);
    for (int b = 0; b < nb; b++)
        if (!whole(batch_s[b], 1 << 24, &v)) return bad_number("--batch-sizes", batch_s[b], 1 << 24);
    if (!nm || !ns || !nd || !nb || !np || steps < 10) {
        fprintf(stderr, "lockstep bench train: an empty list, or --steps under 10\n");
        return 2;
    }
    ssize_t len = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (len <= 0) {
        fprintf(stderr, "lockstep bench train: cannot find this program's path\n");
        return 1;
    }
    self_exe[len] = 0;
    /* Cells that cannot run are said up front and not started: a rank per
     * core is what the fit itself insists on (it refuses more, and every
     * such cell would fail after starting its processes). */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    bool oversubscribe = lk_env_get_long("LK_ALLOW_OVERSUBSCRIBE", 0) != 0;
    int nd_ok = 0;
    for (int d = 0; d < nd; d++) {
        if (cores > 0 && atoi(dev_s[d]) > cores && !oversubscribe)
            printf("bench train: --devices %s is more than the %ld CPU cores of this machine: its cells are skipped "
                   "(each rank needs a core; set LK_ALLOW_OVERSUBSCRIBE=1 to run them anyway)\n", dev_s[d], cores);
        else dev_s[nd_ok++] = dev_s[d];
    }
    if (!nd_ok) {
        fprintf(stderr, "lockstep bench train: no device count given fits the %ld CPU cores of this machine\n", cores);
        return 2;
    }
    nd = nd_ok;
    /* the runs' directories, removed at the end whatever happened (a failed cell's message is in the table's notes) */
    const char *tmpdir = getenv("TMPDIR");
    char tmp[256];
    if (!tmpdir || !*tmpdir || strlen(tmpdir) > 200) tmpdir = "/tmp";
    snprintf(tmp, sizeof tmp, "%.200s/lkbench.XXXXXX", tmpdir);
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "lockstep bench train: cannot make a directory %s: %s\n", tmp, strerror(errno));
        return 1;
    }
    int n = 0;
    cell *cells = calloc((size_t)(nm * ns * np * nb * nd), sizeof *cells);
    int *partial = calloc((size_t)(nm * ns * np * nb * nd), sizeof *partial); /* failed runs of a cell that is ok */
    if (!cells || !partial) {
        free(cells);
        free(partial);
        fprintf(stderr, "lockstep bench train: out of memory for %d cells\n", nm * ns * np * nb * nd);
        remove_tree(tmp);
        return 1;
    }
    int sw = 11; /* the strategy column: as wide as its longest name (deepspeed_stage_1, pipeline:interleaved_1f1b) */
    for (int s = 0; s < ns; s++) sw = (int)strlen(strategies[s]) > sw ? (int)strlen(strategies[s]) : sw;
    printf("%-12s %-*s %-10s %7s %6s %12s %8s %8s %8s %9s %8s %8s %8s %8s %6s %11s  %s\n", "model", sw, "strategy",
           "precision", "devices", "batch", "samples/s", "scaling", "data_ms", "fwd_ms", "bwd_ms", "comm_ms", "(wait)",
           "opt_ms", "step_MB", "steal", "bubble/th", repeats > 1 ? "scaling range" : "");
    /* Rounds: every cell runs once per round, all strategies and batch
     * sizes in turn, so the cells a table compares (ddp against its
     * `independent` ceiling, 2 devices against 1) see the same drift of a
     * shared machine instead of minutes apart. */
    int nrows = 0;
    row_t *rows = calloc((size_t)(nm * ns * np * nb), sizeof *rows);
    if (!rows) {
        free(cells);
        free(partial);
        remove_tree(tmp);
        return 1;
    }
    for (int m = 0; m < nm; m++)
        for (int s = 0; s < ns; s++)
            for (int p = 0; p < np; p++)
            for (int b = 0; b < nb; b++) {
                row_t *w = &rows[nrows++];
                for (int d = 0; d < nd; d++) {
                    cell c = {.model = models[m], .strategy = strategies[s], .devices = atoi(dev_s[d]),
                              .batch = atoi(batch_s[b]), .precision = precisions[p]};
                    char base[64];
                    const char *schedule;
                    strategy_variant(c.strategy, base, sizeof base, &schedule);
                    const lk_strategy_info *si = lk_strategy_info_get(base);
                    if (si && si->process_model == LK_PROCESS_SINGLE && c.devices > 1) continue;
                    for (int r = 0; r < repeats; r++) w->runs[w->n][r] = c;
                    w->out[w->n++] = &cells[n++];
                }
            }
    double tot0 = 0, st0 = 0, tot1, st1;
    bool ticks = cpu_ticks(&tot0, &st0);
    for (int r = 0; r < repeats; r++) {
        if (repeats > 1) fprintf(stderr, "bench train: round %d of %d\n", r + 1, repeats);
        for (int i = 0; i < nrows; i++)
            for (int d = 0; d < rows[i].n; d++) run_cell(&rows[i].runs[d][r], steps, tmp, r);
    }
    int nfail = 0; /* footnotes: the failed cells, numbered in table order */
    for (int i = 0; i < nrows; i++) {
        row_t *w = &rows[i];
        /* Scaling pairs each N-device run with the 1-device run of the same
         * round and takes the median of those ratios: a shared machine's
         * speed drifts over minutes, and a ratio of neighbours cancels most
         * of the drift that a ratio of two cells' medians would keep. A
         * round where either run failed has no ratio: a failure is not a
         * throughput of 0. */
        int base = -1;
        for (int d = 0; d < w->n; d++)
            if (w->runs[d][0].devices == 1) base = d;
        for (int d = 0; d < w->n; d++) {
            cell *c = w->out[d];
            *c = median_run(w->runs[d], repeats);
            for (int r = 0; r < repeats; r++) partial[c - cells] += c->ok && !w->runs[d][r].ok;
            double ratio[MAXR], lo = NAN, hi = NAN;
            int nr = 0;
            for (int r = 0; c->ok && base >= 0 && r < repeats; r++) {
                const cell *one = &w->runs[base][r], *many = &w->runs[d][r];
                if (!one->ok || !many->ok || !(one->sps > 0)) continue;
                double e = many->sps / (c->devices * one->sps);
                int j = nr++;
                for (; j > 0 && ratio[j - 1] > e; j--) ratio[j] = ratio[j - 1];
                ratio[j] = e;
            }
            c->eff = nr ? ratio[(nr - 1) / 2] : NAN;
            /* the noise around this cell: its repeats' range over their median */
            double rlo = INFINITY, rhi = 0;
            int nok = 0;
            for (int r = 0; c->ok && r < repeats; r++)
                if (w->runs[d][r].ok) {
                    nok++;
                    rlo = fmin(rlo, w->runs[d][r].sps), rhi = fmax(rhi, w->runs[d][r].sps);
                }
            c->spread = nok > 1 && c->sps > 0 ? (rhi - rlo) / c->sps : 0;
            if (nr) lo = ratio[0], hi = ratio[nr - 1];
            if (!c->ok) {
                char why[48];
                lk__bench_short_reason(c->error, why, sizeof why);
                printf("%-12s %-*s %-10s %7d %6d %12s  [%d] %s\n", c->model, sw, c->strategy, prec_of(c), c->devices,
                       c->batch, "failed", ++nfail, why);
                continue;
            }
            char range[32] = "", eff[16] = "-";
            if (nr > 1 && c->devices > 1) snprintf(range, sizeof range, "%5.1f-%.1f%%", 100 * lo, 100 * hi);
            if (!isnan(c->eff)) snprintf(eff, sizeof eff, "%.1f%%", 100 * c->eff);
            char steal[16] = "-";
            if (!isnan(c->steal)) snprintf(steal, sizeof steal, "%.1f%%", 100 * c->steal);
            char bubble[24] = "-"; /* a pipeline's measured idle share / its schedule's theory */
            if (!isnan(c->bubble))
                snprintf(bubble, sizeof bubble, "%.1f/%.1f%%", 100 * c->bubble, 100 * c->bubble_theory);
            printf("%-12s %-*s %-10s %7d %6d %12.0f %8s %8.2f %8.2f %9.2f %8.2f %8.2f %8.2f %8.1f %6s %11s  %s\n",
                   c->model, sw, c->strategy, prec_of(c), c->devices, c->batch, c->sps, eff, c->t[0], c->t[1], c->t[2],
                   c->t[3], c->t[5], c->t[4], c->step_mb, steal, bubble, range);
        }
    }
    free(rows);
    /* 1-device cells of different strategies run the same single process:
     * their difference is noise too, measured whatever --repeats is */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            cell *a = &cells[i], *b = &cells[j];
            if (i == j || !a->ok || !b->ok || a->devices != 1 || b->devices != 1 || a->batch != b->batch ||
                strcmp(a->model, b->model) || strcmp(prec_of(a), prec_of(b)) || !(b->sps > 0) || a->sps < b->sps)
                continue;
            double diff = a->sps / b->sps - 1;
            a->spread = fmax(a->spread, diff), b->spread = fmax(b->spread, diff);
        }
    /* The footnotes: each failed cell's full reason and where its log is
     * (the run's directory is kept when any cell failed). */
    for (int i = 0, k = 0; i < n; i++)
        if (!cells[i].ok)
            printf("[%d] %s %s %s x%d batch %d failed: %s\n", ++k, cells[i].model, cells[i].strategy,
                   prec_of(&cells[i]), cells[i].devices, cells[i].batch, cells[i].error);
    for (int i = 0; i < n; i++)
        if (partial[i])
            printf("note: %s %s x%d batch %d: %d of %d runs failed; the cell is the median of all its runs, the "
                   "scaling of the rounds that ran (stderr says why)\n",
                   cells[i].model, cells[i].strategy, cells[i].devices, cells[i].batch, partial[i], repeats);
    free(partial);
    if (ticks && cpu_ticks(&tot1, &st1) && tot1 > tot0)
        printf("hypervisor steal over the whole benchmark: %.2f%% of all CPU time\n",
               100 * (st1 - st0) / (tot1 - tot0));
    char lines[64][LK__BENCH_LINE];
    printf("\nrecommendations (from the measured cells above):\n");
    /* per precision (cells are in row order, so each precision's cells are
     * filtered into one table of its own), then the precisions compared */
    cell *sub = calloc((size_t)n + 1, sizeof *sub);
    for (int p = 0; sub && p < np; p++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(prec_of(&cells[i]), precisions[p])) sub[k++] = cells[i];
        int nl = lk__bench_recommend(sub, k, cores > 0 ? (int)cores : 0, lines, 64);
        for (int i = 0; i < nl; i++) printf("  - %s%s%s\n", np > 1 ? precisions[p] : "", np > 1 ? ": " : "", lines[i]);
    }
    free(sub);
    if (np > 1) {
        int nl = lk__bench_recommend_precision(cells, n, lines, 64);
        for (int i = 0; i < nl; i++) printf("  - %s\n", lines[i]);
    }
    if (repeats < 3)
        printf("  - each cell is %s (--repeats %d): on a shared machine run --repeats 3 or more before deciding\n",
               repeats == 1 ? "one run" : "the lower of two runs", repeats);
    bool all_ok = true;
    for (int i = 0; i < n; i++) all_ok &= cells[i].ok;
    if (csv) {
        FILE *f = fopen(csv, "w");
        if (!f) {
            fprintf(stderr, "bench train: cannot write %s\n", csv);
            all_ok = false;
        } else {
            /* The columns in their order, then status and error:
             * a failed cell's numbers are empty, never 0. */
            fprintf(f, "model,strategy,devices,batch_size,samples_per_s,scaling_efficiency,data_ms,forward_ms,backward_ms,"
                       "comm_exposed_ms,optimizer_ms,status,error,precision,step_peak_mb,bubble,bubble_theory\n");
            for (int i = 0; i < n; i++) {
                const cell *c = &cells[i];
                fprintf(f, "%s,%s,%d,%d,", c->model, c->strategy, c->devices, c->batch);
                if (c->ok) {
                    fprintf(f, "%.1f,", c->sps);
                    if (!isnan(c->eff)) fprintf(f, "%.4f", c->eff);
                    fprintf(f, ",%.3f,%.3f,%.3f,%.3f,%.3f,ok,,%s,", c->t[0], c->t[1], c->t[2], c->t[3], c->t[4],
                            prec_of(c));
                    if (!isnan(c->step_mb)) fprintf(f, "%.2f", c->step_mb);
                    fputc(',', f);
                    if (!isnan(c->bubble)) fprintf(f, "%.4f,%.4f", c->bubble, c->bubble_theory);
                    else fputc(',', f);
                    fputc('\n', f);
                } else {
                    fputs(",,,,,,,failed,", f);
                    csv_quoted(f, c->error);
                    fprintf(f, ",%s,,,\n", prec_of(c));
                }
            }
            if (fclose(f)) {
                fprintf(stderr, "bench train: writing %s failed\n", csv);
                all_ok = false;
            } else {
                printf("wrote %s\n", csv);
            }
        }
    }
    /* The charts group by strategy: with several precisions each strategy
     * is drawn once per precision ("ddp bf16-mixed"). */
    char (*labels)[64] = np > 1 ? calloc((size_t)n + 1, sizeof *labels) : NULL;
    for (int i = 0; labels && i < n; i++) {
        snprintf(labels[i], sizeof labels[i], "%s %s", cells[i].strategy, prec_of(&cells[i]));
        cells[i].strategy = labels[i];
    }
    if (plot) {
        char scaling[1200];
        all_ok &= write_chart(plot, lk__bench_svg_throughput, cells, n);
        if (!lk__bench_scaling_path(plot, scaling, sizeof scaling)) {
            fprintf(stderr, "bench train: --plot path %s is too long\n", plot);
            all_ok = false;
        } else {
            all_ok &= write_chart(scaling, lk__bench_svg_scaling, cells, n);
        }
    }
    free(cells);
    free(labels);
    remove_tree(tmp);
    return all_ok ? 0 : 1;
}

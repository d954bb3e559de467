/* The advanced and trace profilers (trainer.profiler: advanced | trace |
 * pytorch). `advanced` times every autograd op of the training steps, forward
 * and backward, through autograd's op hook, and prints a table at the end of
 * fit: op, calls, total ms, mean us, share of the step time. `trace` keeps,
 * for the first profiler_trace_steps optimizer steps, the spans of each
 * step's phases (data, forward, backward, exposed comm, optimizer), of every
 * op, and of each ddp gradient bucket's all-reduce (its own track: it runs on
 * the communication thread); at the end of fit rank 0 gathers every rank's
 * events and writes <log_dir>/trace.json in Chrome's Trace Event Format, one
 * process (pid) per rank, which Perfetto and chrome://tracing open. The
 * `simple` profiler's phase table stays in trainer.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/config.h"
#include "train/train_impl.h"

/* A bound on memory whatever the model: about 40 MB of events per rank. */
#define MAX_EVENTS (1 << 20)

enum { TID_MAIN = 0, TID_COMM = 1, TID_PIPE = 2 };
enum { EV_PHASE, EV_OP, EV_OP_BACKWARD, EV_BUCKET, EV_PIPE };

typedef struct {
    const char *name; /* static: phase and op names are string literals */
    double t0, t1;
    int64_t step;
    int64_t bytes;    /* EV_BUCKET */
    int bucket;       /* EV_BUCKET; EV_PIPE: the micro-batch (-1: none) */
    uint8_t kind;
    bool comm_thread; /* EV_BUCKET: ran on the communication thread */
} trace_ev;

typedef struct {
    const char *name;
    int64_t calls[2];  /* [0] forward, [1] backward */
    double total_s[2];
} op_stat;

struct lk_profiler {
    lk_trainer *tr;
    bool ops, trace;
    op_stat *tab;
    int ntab, cap_tab;
    trace_ev *ev;
    size_t nev, cap_ev;
    bool dropped;
    int64_t step, first_step, max_steps;
};

static bool tracing_now(const lk_profiler *p) { return p->trace && p->step - p->first_step < p->max_steps; }

static void add_event(lk_profiler *p, trace_ev e) {
    if (p->nev == p->cap_ev) {
        if (p->cap_ev >= MAX_EVENTS) {
            p->dropped = true;
            return;
        }
        if (lk_vec_reserve(p->ev, p->cap_ev, p->nev + 1, 4096)) {
            p->dropped = true; /* a trace with a gap beats a failed fit; the end of fit says so */
            return;
        }
    }
    e.step = p->step;
    p->ev[p->nev++] = e;
}

static op_stat *op_entry(lk_profiler *p, const char *name) {
    for (int i = 0; i < p->ntab; i++) /* pointer first: names are literals, compared by text only when they differ */
        if (p->tab[i].name == name || !strcmp(p->tab[i].name, name)) return &p->tab[i];
    if (p->ntab == p->cap_tab && lk_vec_reserve(p->tab, p->cap_tab, p->ntab + 1, 64)) return NULL;
    p->tab[p->ntab] = (op_stat){.name = name};
    return &p->tab[p->ntab++];
}

static void on_op(void *ctx, const char *op, bool backward, double t0, double t1) {
    lk_profiler *p = ctx;
    op_stat *s = op_entry(p, op);
    if (s) {
        s->calls[backward]++;
        s->total_s[backward] += t1 - t0;
    }
    if (tracing_now(p)) add_event(p, (trace_ev){.name = op, .t0 = t0, .t1 = t1, .kind = backward ? EV_OP_BACKWARD : EV_OP});
}

static void on_bucket(void *ctx, int bucket, size_t bytes, double t0, double t1, bool comm_thread) {
    lk_profiler *p = ctx;
    if (tracing_now(p))
        add_event(p, (trace_ev){.name = "all_reduce", .t0 = t0, .t1 = t1, .bytes = (int64_t)bytes, .bucket = bucket,
                                .kind = EV_BUCKET, .comm_thread = comm_thread});
}

/* A pipeline schedule's action (lk_pipe_kind's order): its own track, so
 * the forwards, backwards and the time spent in messages (the bubble) of
 * each micro-batch show per rank. */
static void on_pipe(void *ctx, int kind, int chunk, double t0, double t1) {
    static const char *const names[] = {"forward", "backward", "messages", "reduce gradients", "optimizer step"};
    lk_profiler *p = ctx;
    if (tracing_now(p) && kind >= 0 && kind < 5)
        add_event(p, (trace_ev){.name = names[kind], .t0 = t0, .t1 = t1, .bucket = chunk, .kind = EV_PIPE});
}

lk_status lk__prof_create(lk_trainer *tr) {
    const char *name = tr->cfg.profiler;
    bool trace = !strcmp(name, "trace") || !strcmp(name, "pytorch");
    if (!trace && strcmp(name, "advanced")) return LK_STATUS_OK;
    lk_profiler *p = lk_calloc(1, sizeof *p);
    if (!p) return LK_STATUS_OUT_OF_MEMORY;
    p->tr = tr;
    p->ops = true;
    p->trace = trace;
    p->first_step = -1;
    p->max_steps = tr->cfg.profiler_trace_steps;
    tr->prof = p;
    if (trace) lk_strategy_set_bucket_hook(tr->strat, on_bucket, p);
    if (trace) lk_strategy_set_pipe_hook(tr->strat, on_pipe, p);
    return LK_STATUS_OK;
}

void lk__prof_free(lk_trainer *tr) {
    lk_profiler *p = tr->prof;
    if (!p) return;
    lk_set_op_hook(NULL, NULL);
    if (tr->strat) lk_strategy_set_bucket_hook(tr->strat, NULL, NULL);
    if (tr->strat) lk_strategy_set_pipe_hook(tr->strat, NULL, NULL);
    lk_free(p->tab);
    lk_free(p->ev);
    lk_free(p);
    tr->prof = NULL;
}

void lk__prof_forward_begin(lk_profiler *p, int64_t step) {
    if (!p) return;
    if (p->first_step < 0) p->first_step = step;
    p->step = step;
    lk_set_op_hook(on_op, p); /* also marks: the batch wait is not the first op's */
}

void lk__prof_backward_end(lk_profiler *p, double t_data, double t_fwd, double t_bwd, double t_comm, double t_end) {
    if (!p) return;
    lk_set_op_hook(NULL, NULL); /* validation and the optimizer are not ops of the step */
    if (!tracing_now(p)) return;
    add_event(p, (trace_ev){.name = "data", .t0 = t_data, .t1 = t_fwd, .kind = EV_PHASE});
    add_event(p, (trace_ev){.name = "forward", .t0 = t_fwd, .t1 = t_bwd, .kind = EV_PHASE});
    add_event(p, (trace_ev){.name = "backward", .t0 = t_bwd, .t1 = t_comm, .kind = EV_PHASE});
    if (t_end > t_comm) add_event(p, (trace_ev){.name = "comm wait", .t0 = t_comm, .t1 = t_end, .kind = EV_PHASE});
}

void lk__prof_optimizer(lk_profiler *p, double t0, double t1) {
    if (p && tracing_now(p)) add_event(p, (trace_ev){.name = "optimizer", .t0 = t0, .t1 = t1, .kind = EV_PHASE});
}

static int cmp_op_total(const void *a, const void *b) {
    const op_stat *x = a, *y = b;
    double tx = x->total_s[0] + x->total_s[1], ty = y->total_s[0] + y->total_s[1];
    return tx < ty ? 1 : tx > ty ? -1 : strcmp(x->name, y->name);
}

static void print_ops(lk_trainer *tr) {
    lk_profiler *p = tr->prof;
    double step_s = tr->sum_data + tr->sum_fwd + tr->sum_bwd + tr->sum_comm + tr->sum_opt;
    printf("\nper-op times: the autograd ops of the training steps on rank 0, %lld optimizer steps\n",
           (long long)tr->timed_steps);
    if (p->ntab == 0) {
        printf("  (no ops timed: with strategy dp the replicas run their ops on their own threads)\n");
        return;
    }
    qsort(p->tab, (size_t)p->ntab, sizeof *p->tab, cmp_op_total);
    printf("  %-28s %9s %11s %11s %9s\n", "op", "calls", "total ms", "mean us", "% of step");
    double sum[2] = {0, 0};
    for (int i = 0; i < p->ntab; i++)
        for (int d = 0; d < 2; d++) {
            const op_stat *s = &p->tab[i];
            if (!s->calls[d]) continue;
            char name[64];
            snprintf(name, sizeof name, "%.40s%s", s->name, d ? " (backward)" : "");
            printf("  %-28s %9lld %11.3f %11.2f %8.1f%%\n", name, (long long)s->calls[d], 1e3 * s->total_s[d],
                   1e6 * s->total_s[d] / (double)s->calls[d], step_s > 0 ? 100 * s->total_s[d] / step_s : 0);
            sum[d] += s->total_s[d];
        }
    printf("  %-28s %9s %11.3f %11s %8.1f%%\n", "all ops, forward", "", 1e3 * sum[0], "",
           step_s > 0 ? 100 * sum[0] / step_s : 0);
    printf("  %-28s %9s %11.3f %11s %8.1f%%\n", "all ops, backward", "", 1e3 * sum[1], "",
           step_s > 0 ? 100 * sum[1] / step_s : 0);
    printf("  (a forward op counts from the end of the op before it; %% of step: of data + forward + backward + "
           "exposed comm + optimizer)\n");
    fflush(stdout);
}

/* This rank's events as JSON objects separated by ",\n" (no brackets), with
 * times in microseconds from `origin`. */
static lk_status rank_json(lk_profiler *p, int rank, double origin, char **out, size_t *len) {
    FILE *f = open_memstream(out, len);
    if (!f) return lk_error(LK_STATUS_OUT_OF_MEMORY, "profiler: no memory for rank %d's trace", rank);
    fprintf(f,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"rank %d\"}},\n"
            "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"main: steps and ops\"}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"ddp gradient all-reduce\"}},\n"
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"pipeline schedule\"}}",
            rank, rank, rank, rank, rank, TID_MAIN, rank, TID_COMM, rank, TID_PIPE);
    static const char *const cats[] = {"step", "op", "op_backward", "comm", "pipeline"};
    for (size_t i = 0; i < p->nev; i++) {
        const trace_ev *e = &p->ev[i];
        char name[96];
        if (e->kind == EV_BUCKET) snprintf(name, sizeof name, "all_reduce bucket %d", e->bucket);
        else if (e->kind == EV_PIPE && e->bucket >= 0) snprintf(name, sizeof name, "%s %d", e->name, e->bucket);
        else snprintf(name, sizeof name, "%.64s%s", e->name, e->kind == EV_OP_BACKWARD ? " backward" : "");
        for (char *c = name; *c; c++) /* op names are identifiers; keep the JSON valid whatever they are */
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '_';
        fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"step\":%lld",
                name, cats[e->kind], 1e6 * (e->t0 - origin), 1e6 * (e->t1 - e->t0), rank,
                e->kind == EV_BUCKET ? TID_COMM : e->kind == EV_PIPE ? TID_PIPE : TID_MAIN, (long long)e->step);
        if (e->kind == EV_BUCKET)
            fprintf(f, ",\"bytes\":%lld,\"thread\":\"%s\"", (long long)e->bytes, e->comm_thread ? "comm" : "main");
        if (e->kind == EV_PIPE && e->bucket >= 0) fprintf(f, ",\"micro_batch\":%d", e->bucket);
        fputs("}}", f);
    }
    if (fclose(f)) return lk_error(LK_STATUS_OUT_OF_MEMORY, "profiler: no memory for rank %d's trace", rank);
    return LK_STATUS_OK;
}

/* Collective when tracing over several ranks: every rank's events travel to
 * rank 0 in one gather (each padded with spaces, which JSON ignores, to the
 * longest), so a multi-node run needs no shared file system. Over the
 * world, not the data-parallel group: the trace shows every rank's track,
 * whichever group (pipeline stage) it is in. */
static lk_status write_trace(lk_trainer *tr) {
    lk_profiler *p = tr->prof;
    double origin = p->nev ? p->ev[0].t0 : lk_time_now();
    for (size_t i = 0; i < p->nev; i++)
        if (p->ev[i].t0 < origin) origin = p->ev[i].t0;
    /* One clock origin for all ranks: on one node the monotonic clock is
     * shared, so the ranks' tracks line up. */
    if (tr->world > 1) LK_TRY(lk_comm_all_reduce(tr->comm, &origin, 1, LK_F64, LK_REDUCE_MIN));
    char *mine = NULL, *all = NULL;
    size_t len = 0;
    lk_status st = rank_json(p, tr->rank, origin, &mine, &len);
    int64_t longest = (int64_t)len;
    if (!st && tr->world > 1) st = lk_comm_all_reduce(tr->comm, &longest, 1, LK_I64, LK_REDUCE_MAX);
    char *send = NULL;
    if (!st && tr->world > 1) {
        send = lk_malloc((size_t)longest);
        if (tr->rank == 0) all = lk_malloc((size_t)longest * (size_t)tr->world);
        /* every rank learns whether all have the memory, so none waits in a gather another skipped */
        int32_t ok = send && (tr->rank != 0 || all);
        st = lk_comm_all_reduce(tr->comm, &ok, 1, LK_I32, LK_REDUCE_MIN);
        if (!st && !ok) st = lk_error(LK_STATUS_OUT_OF_MEMORY, "profiler: a rank had no memory to gather the trace");
        if (!st) {
            memcpy(send, mine, len);
            memset(send + len, ' ', (size_t)longest - len);
            st = lk_comm_gather(tr->comm, send, all, (size_t)longest, LK_U8, 0);
        }
    }
    if (!st && tr->rank == 0) {
        char path[LK_PATH + 16];
        snprintf(path, sizeof path, "%s/trace.json", tr->log_dir);
        FILE *f = NULL;
        char *doc = NULL;
        size_t dlen = 0;
        if (!(f = open_memstream(&doc, &dlen))) st = lk_error(LK_STATUS_OUT_OF_MEMORY, "profiler: no memory for %s", path);
        else {
            fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
            for (int r = 0; r < tr->world; r++) {
                if (r) fputs(",\n", f);
                if (tr->world > 1) fwrite(all + (size_t)r * (size_t)longest, 1, (size_t)longest, f);
                else fwrite(mine, 1, len, f);
            }
            fputs("\n]}\n", f);
            fclose(f);
            st = lk_file_write_atomic(path, doc, dlen);
            if (!st)
                lk_log0("profiler (trace): the first %lld steps of %d rank%s in %s (open it at ui.perfetto.dev)%s",
                        (long long)p->max_steps, tr->world, tr->world > 1 ? "s" : "", path,
                        p->dropped ? "; events beyond the per-rank bound were dropped" : "");
            free(doc);
        }
    }
    free(mine);
    lk_free(send);
    lk_free(all);
    return st;
}

lk_status lk__prof_finish(lk_trainer *tr) {
    lk_profiler *p = tr->prof;
    if (!p) return LK_STATUS_OK;
    lk_set_op_hook(NULL, NULL);
    if (tr->rank == 0 && p->ops) print_ops(tr);
    if (!p->trace) return LK_STATUS_OK;
    bool has_dir = tr->log_dir[0] != '\0'; /* only rank 0 knows it: tell the others whether to gather */
    if (tr->world > 1) {
        int32_t v = has_dir;
        LK_TRY(lk_comm_broadcast(tr->comm, &v, 1, LK_I32, 0));
        has_dir = v != 0;
    }
    if (!has_dir) {
        if (tr->rank == 0) lk_log_warn("profiler (trace): no log directory (fast_dev_run?), so no trace.json");
        return LK_STATUS_OK;
    }
    return write_trace(tr);
}

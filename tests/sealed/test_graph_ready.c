/* How far a training step is from a CUDA graph, measured on the sealed
 * device. A graph replays a recorded sequence of kernel launches with the
 * same arguments and the same pointers, so this test records every op
 * descriptor the sealed backend runs in steady steps (FIRST..LAST + 1) with
 * its operand pointers — a recording backend registered for the sealed kind
 * in front of tests/sealed_device.h's — and compares step k with step k + 1:
 * the same op kinds in the same order, the same operand pointers, the same
 * descriptor fields (compared field by field from a table, so padding never
 * counts and the fields that differ are named); and finds the period after
 * which the pointers repeat (a graph per step parity serves a period of 2).
 * It also counts, per steady step, the tensor pool's misses (device
 * allocations), the device's copies in, out and within and its memsets,
 * and replays step 5's record (ops, memsets, copies within) over the arena
 * as step 7 found it: with step 5's descriptors unchanged except for `live`,
 * pointing at device memory that holds lk__op_live_fill of step 7's (what a
 * graph replay copies in before launching), the arena must end as the eager
 * step 7 left it, byte for byte. Every field that differs between steps
 * must be one its op reads from `live` (op_fields.c marks it live).
 * The table it prints is docs/GPU.md's "What a CUDA graph of the step
 * needs"; each number is held at the bound reached and the fields allowed
 * to differ are listed per run, so a new per-step-varying parameter, a
 * pointer that moves, or an allocation in the step fails here. */
#include <stddef.h>

#include "sealed_harness.h"

enum { FIRST = 3, LAST = 13, STEPS = LAST + 2 };

/* ---- descriptor fields, per op kind: the library's table (op_fields.c) ------ */
typedef lk_op_field field;
typedef lk_op_info op_info;

static void every_op_has_fields(void) {
    for (int k = 0; k < LK_OP_COUNT; k++)
        CHECK_MSG(lk__op_info(k) && lk__op_info(k)->n > 0, "op kind %d has no entry in op_fields.c's table", k);
}

/* ---- the recording backend ------------------------------------------------------ */
typedef struct {
    lk_op_desc d;
    void *x[LK_OP_MAX_OPERANDS];
    int n;
    long seq; /* position among the step's ops and device calls */
} rec_op;
/* The device's own calls in a step, which a graph would hold too (memsets,
 * copies within) or feed from outside (copies in, with the bytes copied). */
typedef enum { CALL_MEMSET, CALL_COPY, CALL_COPY_IN } call_kind;
typedef struct {
    call_kind what;
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    void *data; /* CALL_COPY_IN: the host bytes as they were copied */
    long seq;
} rec_call;
enum { MAX_CALLS = 64 };
static struct {
    pthread_mutex_t mu;
    int64_t step; /* the step being recorded, or -1 */
    rec_op *ops[STEPS];
    int n[STEPS], cap[STEPS];
    rec_call calls[STEPS][MAX_CALLS];
    int ncalls[STEPS];
    long seq;
    bool oom;
    pthread_t owner; /* the thread that runs the steps (the probe's hook runs on it) */
    long foreign;    /* ops of a recorded step issued from any other thread */
} rec = {.mu = PTHREAD_MUTEX_INITIALIZER, .step = -1};

static lk_status rec_run(const lk_op_desc *d, void *const *x) {
    pthread_mutex_lock(&rec.mu);
    int64_t k = rec.step;
    if (k >= FIRST && k < STEPS) {
        if (!pthread_equal(pthread_self(), rec.owner)) rec.foreign++;
        if (rec.n[k] == rec.cap[k]) {
            int cap = rec.cap[k] ? 2 * rec.cap[k] : 256;
            rec_op *p = realloc(rec.ops[k], (size_t)cap * sizeof *p);
            if (p) rec.ops[k] = p, rec.cap[k] = cap;
            else rec.oom = true;
        }
        if (rec.n[k] < rec.cap[k]) {
            rec_op *r = &rec.ops[k][rec.n[k]++];
            r->d = *d;
            r->n = lk__op_arity(d->op);
            r->seq = rec.seq++;
            for (int i = 0; i < LK_OP_MAX_OPERANDS; i++) r->x[i] = i < r->n ? x[i] : NULL;
        }
    }
    pthread_mutex_unlock(&rec.mu);
    return sealed_be_run(d, x);
}
static const lk_backend rec_backend = {.name = "sealed_recording", .supports = sealed_be_supports, .run = rec_run};

static void rec_note_call(call_kind what, void *dst, const void *src, size_t bytes, int value) {
    pthread_mutex_lock(&rec.mu);
    int64_t k = rec.step;
    if (k >= FIRST && k < STEPS) {
        if (rec.ncalls[k] == MAX_CALLS) rec.oom = true;
        else {
            rec_call *c = &rec.calls[k][rec.ncalls[k]++];
            *c = (rec_call){what, dst, src, bytes, value, NULL, rec.seq++};
            if (what == CALL_COPY_IN && (c->data = malloc(bytes ? bytes : 1))) memcpy(c->data, src, bytes);
            else if (what == CALL_COPY_IN) rec.oom = true;
        }
    }
    pthread_mutex_unlock(&rec.mu);
}
static lk_status rec_memset(void *ctx, int index, void *ptr, int value, size_t bytes) {
    rec_note_call(CALL_MEMSET, ptr, NULL, bytes, value);
    return sealed_memset(ctx, index, ptr, value, bytes);
}
static lk_status rec_copy(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    rec_note_call(CALL_COPY, dst, src, bytes, 0);
    return sealed_copy(ctx, index, dst, src, bytes);
}
static lk_status rec_from_host(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    rec_note_call(CALL_COPY_IN, dst, src, bytes, 0);
    return sealed_from_host(ctx, index, dst, src, bytes);
}
/* The sealed device under its own name, with those three calls noted
 * (registered before sealed_device() registers the plain one, so the name
 * is this vtable's). */
static lk_device_vtable rec_vtable;

static void rec_reset(void) {
    for (int k = 0; k < STEPS; k++) {
        free(rec.ops[k]), rec.ops[k] = NULL, rec.n[k] = rec.cap[k] = 0;
        for (int i = 0; i < rec.ncalls[k]; i++) free(rec.calls[k][i].data);
        rec.ncalls[k] = 0;
    }
    rec.step = -1;
    rec.seq = 0;
    rec.oom = false;
    rec.foreign = 0;
}

/* The probe's hook: step k's window runs from the start of its
 * training_step to the start of the next one (forward, backward, the
 * optimizer, the read, the next batch's copy in). */
static void replay_at(int64_t k);
static void around_step(run_out *o, int64_t k, bool after) {
    (void)o;
    if (after) return;
    pthread_mutex_lock(&rec.mu);
    rec.step = -1;
    pthread_mutex_unlock(&rec.mu);
    replay_at(k);
    pthread_mutex_lock(&rec.mu);
    rec.step = k < STEPS ? k : -1;
    rec.owner = pthread_self();
    pthread_mutex_unlock(&rec.mu);
}

/* ---- comparing two steps ------------------------------------------------------ */
typedef struct {
    int nops;            /* in step a */
    bool same_kinds;     /* the same number of ops, kinds in the same order */
    int ptr_diff;        /* ops with an operand pointer that differs */
    int param_diff;      /* ops with a descriptor field (or dtype) that differs */
    int fixed_diff;      /* of those, ops where a field not marked live (or a dtype) differs */
    char fields[512];    /* "optim_update.step (live) x6, ..." */
    char ptr_ops[512];   /* "copy x2 (operands 0), ..." */
} cmp_out;

/* Appends "op.field" to a list of distinct names with counts. */
typedef struct {
    char name[64];
    int count;
    unsigned operands; /* pointer lists: which operand indices differed */
} tally;
static void tally_add(tally *t, int *nt, int max, const char *name, unsigned operands) {
    for (int i = 0; i < *nt; i++)
        if (!strcmp(t[i].name, name)) {
            t[i].count++;
            t[i].operands |= operands;
            return;
        }
    if (*nt == max) return;
    snprintf(t[*nt].name, sizeof t[*nt].name, "%s", name);
    t[*nt].count = 1;
    t[*nt].operands = operands;
    (*nt)++;
}
static void tally_str(const tally *t, int nt, bool operands, char *buf, size_t size) {
    buf[0] = 0;
    size_t len = 0;
    for (int i = 0; i < nt && len < size; i++) {
        char ops_s[64] = "";
        if (operands) {
            size_t l = (size_t)snprintf(ops_s, sizeof ops_s, " (operand");
            for (int j = 0; j < LK_OP_MAX_OPERANDS; j++)
                if (t[i].operands >> j & 1) l += (size_t)snprintf(ops_s + l, sizeof ops_s - l, " %d", j);
            snprintf(ops_s + l, sizeof ops_s - l, ")");
        }
        len += (size_t)snprintf(buf + len, size - len, "%s%s x%d%s", i ? ", " : "", t[i].name, t[i].count, ops_s);
    }
}

static cmp_out compare(int a, int b) {
    cmp_out c = {.nops = rec.n[a]};
    c.same_kinds = rec.n[a] == rec.n[b];
    for (int i = 0; c.same_kinds && i < rec.n[a]; i++) c.same_kinds = rec.ops[a][i].d.op == rec.ops[b][i].d.op;
    if (!c.same_kinds) return c;
    tally fields[32], ptrs[32];
    int nf = 0, np = 0;
    for (int i = 0; i < rec.n[a]; i++) {
        const rec_op *x = &rec.ops[a][i], *y = &rec.ops[b][i];
        const op_info *oi = lk__op_info(x->d.op);
        unsigned moved = 0;
        for (int j = 0; j < x->n; j++) moved |= (unsigned)(x->x[j] != y->x[j]) << j;
        if (moved) c.ptr_diff++, tally_add(ptrs, &np, 32, oi->name, moved);
        bool differs = memcmp(x->d.dtype, y->d.dtype, sizeof x->d.dtype) != 0, fixed = differs;
        char name[64];
        if (differs) snprintf(name, sizeof name, "%s.dtype", oi->name), tally_add(fields, &nf, 32, name, 0);
        for (int f = 0; f < oi->n; f++) {
            const field *fl = &oi->f[f];
            if (!memcmp((const char *)&x->d + fl->off, (const char *)&y->d + fl->off, fl->size)) continue;
            differs = true;
            fixed |= !fl->live;
            /* named with whether the backend reads it from `live` (a replay supplies it there) */
            snprintf(name, sizeof name, "%s.%s%s", oi->name, fl->name, fl->live ? " (live)" : "");
            tally_add(fields, &nf, 32, name, 0);
        }
        c.param_diff += differs;
        c.fixed_diff += fixed;
    }
    tally_str(fields, nf, false, c.fields, sizeof c.fields);
    tally_str(ptrs, np, true, c.ptr_ops, sizeof c.ptr_ops);
    return c;
}

/* ---- replaying a recorded step --------------------------------------------------
 * What a graph would do, on the sealed device: the arena as it was at the
 * start of step REPLAY_AS, then step REPLAY_FROM's record run over it (its
 * ops with their recorded operands, its memsets and copies within), the
 * batch's copies in taken from step REPLAY_AS (a graph is fed its batch
 * from outside), and the arena compared byte for byte with what the eager
 * step REPLAY_AS left. Two steps apart: the same batch parity. Once as
 * recorded, once with each op of a kind with per-step values given `live`:
 * a slot of live_dev (sealed memory) holding lk__op_live_fill of step
 * REPLAY_AS's descriptor, the recorded descriptor otherwise unchanged (what
 * a graph replay does: one copy into the slots, then the launches); the
 * eager arena is put back after. */
enum { REPLAY_FROM = 5, REPLAY_AS = 7, LIVE_BYTES = 1 << 16 };
typedef struct {
    bool on;
    char *start;        /* the arena at the start of step REPLAY_AS */
    size_t nstart;
    long diff[2];       /* bytes that differ: as recorded, with live blocks; -1: not run */
    int live_ops;       /* ops the second replay gave a live block */
    char why[256];      /* why it did not run */
} replay_state;
static replay_state rp;
/* The live slots, in the arena: allocated once in setup, before any fit, so
 * they sit below every snapshot's high-water mark at a fixed place; their
 * bytes are not the step's state and are left out of the comparison. */
static char *live_dev;

/* Whether steps a and b made the same device calls (kind, destination, source, size, value) in the same order. */
static bool same_calls(int a, int b) {
    if (rec.ncalls[a] != rec.ncalls[b]) return false;
    for (int j = 0; j < rec.ncalls[a]; j++) {
        const rec_call *x = &rec.calls[a][j], *y = &rec.calls[b][j];
        if (x->what != y->what || x->dst != y->dst || x->bytes != y->bytes || x->value != y->value ||
            (x->what == CALL_COPY && x->src != y->src))
            return false;
    }
    return true;
}

/* Runs step a's record over the arena (the caller holds it open); with
 * live, each op with per-step values reads step b's from a live slot. */
static bool replay_run(int a, int b, bool live) {
    size_t used = 0;
    for (int i = 0, j = 0; i < rec.n[a] || j < rec.ncalls[a];) {
        if (j >= rec.ncalls[a] || (i < rec.n[a] && rec.ops[a][i].seq < rec.calls[a][j].seq)) {
            const rec_op *r = &rec.ops[a][i], *q = &rec.ops[b][i];
            lk_op_desc d = r->d;
            size_t n = live ? lk__op_live_size(&d) : 0;
            if (n) {
                /* what the replay layer checks before it replays: only live fields differ */
                if (!lk__op_desc_same(&r->d, &q->d, true) || used + n > LIVE_BYTES) {
                    snprintf(rp.why, sizeof rp.why, "op %d of step %d differs from step %d's beyond its live fields "
                             "(or the live slots are full)", i, a, b);
                    return false;
                }
                lk__op_live_fill(&q->d, live_dev + used);
                d.live = live_dev + used;
                used += (n + 15) & ~(size_t)15;
                rp.live_ops++;
            }
            if (sealed_be_run(&d, r->x)) return false;
            i++;
            continue;
        }
        const rec_call *c = &rec.calls[a][j], *cb = &rec.calls[b][j];
        if (c->what == CALL_MEMSET) memset(c->dst, c->value, c->bytes);
        else if (c->what == CALL_COPY) memmove(c->dst, c->src, c->bytes);
        else memcpy(cb->dst, cb->data, cb->bytes);
        j++;
    }
    return true;
}

static void replay_at(int64_t k) {
    if (!rp.on) return;
    if (k == REPLAY_AS) {
        sealed_open();
        rp.nstart = sealed_arena.bump;
        rp.start = malloc(rp.nstart ? rp.nstart : 1);
        if (rp.start) memcpy(rp.start, sealed_arena.base, rp.nstart);
        sealed_close();
        return;
    }
    if (k != REPLAY_AS + 1 || !rp.start) return;
    cmp_out c = compare(REPLAY_FROM, REPLAY_AS);
    sealed_open();
    size_t n = sealed_arena.bump;
    char *eager = n == rp.nstart ? malloc(n ? n : 1) : NULL;
    if (n != rp.nstart) snprintf(rp.why, sizeof rp.why, "the arena grew during step %d", REPLAY_AS);
    else if (!c.same_kinds || c.ptr_diff)
        snprintf(rp.why, sizeof rp.why, "steps %d and %d ran other ops or pointers", REPLAY_FROM, REPLAY_AS);
    else if (!same_calls(REPLAY_FROM, REPLAY_AS))
        snprintf(rp.why, sizeof rp.why, "steps %d and %d made other device calls", REPLAY_FROM, REPLAY_AS);
    else if (eager) {
        memcpy(eager, sealed_arena.base, n);
        size_t lo = (size_t)(live_dev - sealed_arena.base), hi = lo + LIVE_BYTES; /* the live slots: not compared */
        for (int live = 0; live < 2; live++) {
            memcpy(sealed_arena.base, rp.start, n);
            rp.diff[live] = -1;
            rp.live_ops = 0;
            if (!replay_run(REPLAY_FROM, REPLAY_AS, live)) continue;
            long d = 0;
            for (size_t i = 0; i < n; i++) d += (i < lo || i >= hi) && sealed_arena.base[i] != eager[i];
            rp.diff[live] = d;
        }
        memcpy(sealed_arena.base, eager, n); /* the fit goes on from the eager step */
    }
    sealed_close();
    free(eager);
    free(rp.start);
    rp.start = NULL;
}

/* ---- the runs ----------------------------------------------------------------- */
enum { MAX_PERIOD = 4 };
typedef struct {
    const char *name, *model, *precision;
    const char *threads;        /* LK_NUM_THREADS for the fit (NULL: the machine's cores) */
    bool order_may_vary;        /* conv's chunks issued from several host threads: only the op counts are held */
    int ops;                    /* bound: ops (kernel launches on a GPU) per steady step */
    int period;                 /* bound: the pointers repeat every `period` steps (MAX_PERIOD + 1: not within MAX_PERIOD) */
    int ptr_diff;               /* bound: ops whose pointers differ from the next step's */
    int param_diff;             /* bound: ops whose descriptor differs from the next step's */
    const char *fields_allowed; /* "op.field" names that may differ, space-separated */
    long allocs;                /* bound: pool misses per steady step */
    long copies_in, copies_out, copies_within; /* bounds per steady step */
    double clip;                               /* gradient_clip_val (0: none) */
} config;

/* Whether every "op.field xN" of `fields` is named in `list`. */
static bool allowed(const char *list, const char *fields) {
    char buf[512], l[520];
    snprintf(buf, sizeof buf, "%s", fields);
    snprintf(l, sizeof l, " %s ", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        char *sp = strchr(tok, ' ');
        if (sp) *sp = 0;
        char pat[80];
        snprintf(pat, sizeof pat, " %s ", tok);
        if (!strstr(l, pat)) return false;
    }
    return true;
}

/* Whether steps a and b ran the same number of each op kind (in any order). */
static bool same_counts(int a, int b) {
    int na[LK_OP_COUNT] = {0}, nb[LK_OP_COUNT] = {0};
    for (int i = 0; i < rec.n[a]; i++) na[rec.ops[a][i].d.op]++;
    for (int i = 0; i < rec.n[b]; i++) nb[rec.ops[b][i].d.op]++;
    return !memcmp(na, nb, sizeof na);
}

static void steady_steps(void) {
    /* The bounds are the numbers measured with the pool's lowest-address
     * order on devices (docs/GPU.md's table): a regression raises one of
     * them. With LIFO order the pointers repeated every 2 steps (f32) or 4
     * (mixed precision), and 12 (mlp), 19 (mixed), 23 (cnn) and 7
     * (autoencoder) ops' pointers differed from the next step's. */
    static const config cs[] = {
        /* name, model, precision, threads, order may vary, ops, period, pointers, params, fields, misses, in, out, within, clip */
        {"mlp f32", "mlp", "32-true", NULL, false, 37, 2, 4, 3, "dropout_mask.ctr optim_update.step", 0, 2, 1, 2, 0},
        {"mlp bf16-mixed", "mlp", "bf16-mixed", NULL, false, 49, 2, 4, 3, "dropout_mask.ctr optim_update.step", 0, 2, 1, 1, 0},
        {"mlp 16-mixed", "mlp", "16-mixed", NULL, false, 51, 2, 4, 3, "dropout_mask.ctr optim_update.step", 0, 2, 1, 1, 0},
        {"mlp 16-mixed, clipped", "mlp", "16-mixed", NULL, false, 64, 2, 4, 3, "dropout_mask.ctr optim_update.step", 0, 2,
         1, 1, 0.5},
        {"cnn f32, 1 thread", "cnn", "32-true", "1", false, 87, 2, 10, 1, "optim_update.step", 0, 2, 1, 3, 0},
        /* conv cut into 2 tasks: on a device they run in order on the calling thread, so the op order holds */
        {"cnn f32, 2 threads", "cnn", "32-true", "2", false, 89, 2, 10, 1, "optim_update.step", 0, 2, 1, 3, 0},
        {"autoencoder f32", "autoencoder", "32-true", NULL, false, 59, 2, 4, 1, "optim_update.step", 0, 2, 1, 2, 0},
    };
    printf("| run | ops per step | pointers differ from step k+1 | pointers repeat every | params differ | fields that "
           "differ | pool misses | copies in / out / within | memsets |\n|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        const config *c = &cs[i];
        rec_reset();
        rp = (replay_state){.on = !c->order_may_vary, .diff = {-1, -1}};
        if (c->threads) setenv("LK_NUM_THREADS", c->threads, 1);
        run_out o = sh_fit((run_spec){.model = c->model, .accelerator = "sealed", .precision = c->precision,
                                      .clip = c->clip, .max_steps = STEPS + 1, .no_checkpointing = true, .probe = true,
                                      .step_hook = around_step});
        unsetenv("LK_NUM_THREADS");
        rec.step = -1;
        free(rp.start); /* a fit that ended before the replay */
        rp.start = NULL;
        free(o.params);
        CHECK_MSG(!rec.oom, "%s: the recorder ran out of memory", c->name);
        CHECK_MSG(o.steps_seen == STEPS + 1, "%s: %lld steps probed", c->name, (long long)o.steps_seen);
        if (o.steps_seen != STEPS + 1) continue;
        int nops = rec.n[FIRST], ptr1 = 0, par = 0, reordered = 0, fixed = 0;
        char fields[512] = "", ptr_ops[512] = "";
        long allocs = 0, in = 0, out = 0, within = 0, memsets = 0;
        for (int k = FIRST; k <= LAST; k++) {
            CHECK_MSG(rec.n[k] > 0 && same_counts(k, k + 1), "%s: step %d ran %d ops, step %d %d (or other kinds)",
                      c->name, k, rec.n[k], k + 1, rec.n[k + 1]);
            cmp_out d1 = compare(k, k + 1);
            if (!d1.same_kinds) {
                reordered++;
                d1.ptr_diff = rec.n[k]; /* an op list that is not the same list: no pointer lines up */
            }
            CHECK_MSG(d1.same_kinds || c->order_may_vary, "%s: steps %d and %d ran their ops in another order", c->name,
                      k, k + 1);
            if (d1.ptr_diff > ptr1) ptr1 = d1.ptr_diff, snprintf(ptr_ops, sizeof ptr_ops, "%s", d1.ptr_ops);
            if (d1.param_diff > par) par = d1.param_diff;
            if (d1.fixed_diff > fixed) fixed = d1.fixed_diff;
            if (strlen(d1.fields) > strlen(fields)) snprintf(fields, sizeof fields, "%s", d1.fields);
            const sealed_stats *s0 = &o.at[k], *s1 = &o.at[k + 1];
            long m = (long)(o.misses[k + 1] - o.misses[k]);
            if (m > allocs) allocs = m;
            if (s1->copies_in - s0->copies_in > in) in = s1->copies_in - s0->copies_in;
            if (s1->copies_out - s0->copies_out > out) out = s1->copies_out - s0->copies_out;
            if (s1->copies_within - s0->copies_within > within) within = s1->copies_within - s0->copies_within;
            if (s1->memsets - s0->memsets > memsets) memsets = s1->memsets - s0->memsets;
        }
        /* the period: the smallest p with step k's pointers those of step k + p for every k recorded */
        int period = MAX_PERIOD + 1;
        for (int p = MAX_PERIOD; p >= 1; p--) {
            bool repeats = true;
            for (int k = FIRST; k + p < STEPS && repeats; k++) {
                cmp_out d = compare(k, k + p);
                repeats = d.same_kinds && d.ptr_diff == 0;
            }
            if (repeats) period = p;
        }
        char per[32];
        if (period <= MAX_PERIOD) snprintf(per, sizeof per, "%d step%s", period, period > 1 ? "s" : "");
        else snprintf(per, sizeof per, "not within %d steps", MAX_PERIOD);
        printf("| %s | %d | %d | %s | %d | %s | %ld | %ld / %ld / %ld | %ld |\n", c->name, nops, ptr1, per, par,
               fields[0] ? fields : "none", allocs, in, out, within, memsets);
        if (rp.on)
            printf("|   | replay of step %d's record as step %d: %ld bytes of the arena differ as recorded, %ld with "
                   "`live` set on %d ops (lk__op_live_fill of step %d's descriptors)%s%s |\n", REPLAY_FROM, REPLAY_AS,
                   rp.diff[0], rp.diff[1], rp.live_ops, REPLAY_AS, rp.why[0] ? ": " : "", rp.why);
        if (reordered) printf("|   | op order differs in %d of %d step pairs |\n", reordered, LAST - FIRST + 1);
        else if (ptr_ops[0]) printf("|   | pointers that differ from step k+1: %s |\n", ptr_ops);
        /* a queue takes its ops in the order one thread issues them: every
         * op of a step comes from the thread running it (conv's tasks too) */
        CHECK_MSG(rec.foreign == 0, "%s: %ld ops of the recorded steps were issued from another thread", c->name,
                  rec.foreign);
        CHECK_MSG(nops <= c->ops, "%s: %d ops per step (at most %d)", c->name, nops, c->ops);
        CHECK_MSG(period <= c->period, "%s: the pointers repeat every %d steps (at most %d expected)", c->name, period,
                  c->period);
        CHECK_MSG(ptr1 <= c->ptr_diff, "%s: %d ops' pointers differ from the next step's (at most %d): %s", c->name,
                  ptr1, c->ptr_diff, ptr_ops);
        /* with the order varying, op i of one step may be another chunk's op in the next: only counts hold */
        CHECK_MSG(c->order_may_vary || par <= c->param_diff, "%s: %d ops' parameters differ (at most %d): %s", c->name,
                  par, c->param_diff, fields);
        CHECK_MSG(c->order_may_vary || allowed(c->fields_allowed, fields), "%s: fields differ that did not: %s (allowed: %s)",
                  c->name, fields, c->fields_allowed);
        /* every per-step field is one the backend reads from `live` */
        CHECK_MSG(c->order_may_vary || fixed == 0, "%s: %d ops differ from the next step's in a field not marked live "
                  "in op_fields.c: %s", c->name, fixed, fields);
        /* the replay: step 7's live blocks are all that stand between step 5's record and step 7 */
        CHECK_MSG(!rp.on || (rp.diff[1] == 0 && !rp.why[0]),
                  "%s: the replay of step %d as step %d left %ld bytes different from the eager step%s%s", c->name,
                  REPLAY_FROM, REPLAY_AS, rp.diff[1], rp.why[0] ? ": " : "", rp.why);
        CHECK_MSG(!rp.on || rp.why[0] || rp.diff[0] > 0, "%s: the replay as recorded matched the eager step (%ld bytes differ): "
                  "the comparison sees nothing", c->name, rp.diff[0]);
        CHECK_MSG(allocs <= c->allocs, "%s: %ld pool misses in a steady step (at most %ld)", c->name, allocs, c->allocs);
        CHECK_MSG(in <= c->copies_in && out <= c->copies_out && within <= c->copies_within,
                  "%s: copies in / out / within %ld / %ld / %ld per step (at most %ld / %ld / %ld)", c->name, in, out,
                  within, c->copies_in, c->copies_out, c->copies_within);
    }
    rec_reset();
}

static lk_device sealed0; /* setup's */

/* ---- the pool's order ------------------------------------------------------------
 * Which cached block a request gets: on the sealed device the lowest
 * address, whatever order the blocks came back in (so a step that frees its
 * blocks in the order it took them gets the same pointers next time); on
 * the host the block freed last, as before. A size no other case uses, so
 * the class starts empty. */
static void pool_order(void) {
    const lk_device *devs[2] = {&sealed0, NULL}; /* NULL: the host */
    const int64_t n = 100003;
    for (int h = 0; h < 2; h++) {
        CHECK_OK(lk_device_set_thread_default(devs[h]));
        lk_tensor *t[3];
        void *p[3];
        for (int i = 0; i < 3; i++) t[i] = lk_tensor_empty(LK_F32, 1, &n), p[i] = t[i] ? t[i]->data : NULL;
        CHECK(t[0] && t[1] && t[2]);
        for (int round = 0; round < 2; round++) {
            /* round 0: freed in the order taken; round 1: in reverse */
            for (int i = 0; i < 3; i++) lk_tensor_release(t[round ? 2 - i : i]);
            void *q[3];
            for (int i = 0; i < 3; i++) t[i] = lk_tensor_empty(LK_F32, 1, &n), q[i] = t[i] ? t[i]->data : NULL;
            if (h == 0) { /* the lowest address first, either way */
                void *lo = p[0], *mid = p[1], *hi = p[2], *tmp;
                if ((uintptr_t)lo > (uintptr_t)mid) tmp = lo, lo = mid, mid = tmp;
                if ((uintptr_t)mid > (uintptr_t)hi) tmp = mid, mid = hi, hi = tmp;
                if ((uintptr_t)lo > (uintptr_t)mid) tmp = lo, lo = mid, mid = tmp;
                CHECK_MSG(q[0] == lo && q[1] == mid && q[2] == hi,
                          "sealed, round %d: blocks %p %p %p handed out, expected %p %p %p (lowest address first)", round,
                          q[0], q[1], q[2], lo, mid, hi);
                memcpy(p, q, sizeof p);
            } else { /* LIFO: the last freed first */
                void *want0 = round ? p[0] : p[2], *want2 = round ? p[2] : p[0];
                CHECK_MSG(q[0] == want0 && q[1] == p[1] && q[2] == want2, "host, round %d: blocks %p %p %p handed out, "
                          "expected %p %p %p (the block freed last first)", round, q[0], q[1], q[2], want0, p[1], want2);
                memcpy(p, q, sizeof p);
            }
        }
        for (int i = 0; i < 3; i++) lk_tensor_release(t[i]);
    }
    CHECK_OK(lk_device_set_thread_default(NULL));
}

static void setup(void) {
    sh_root_init("graph_ready");
    /* the sealed device with its memsets and copies noted, under the plain one's name */
    pthread_once(&sealed_once, sealed_init_once);
    rec_vtable = sealed_vtable;
    rec_vtable.memset = rec_memset, rec_vtable.copy = rec_copy, rec_vtable.copy_from_host = rec_from_host;
    lk_device_kind kind = LK_CPU;
    if (lk_device_register(&rec_vtable, NULL, &kind)) {
        fprintf(stderr, "graph_ready: %s\n", lk_last_error());
        abort();
    }
    sealed0 = sealed_device(0); /* registers the sealed backend: once, as the recorder replaces it */
    void *slots = NULL;
    if (sealed_alloc(NULL, 0, LIVE_BYTES, &slots)) {
        fprintf(stderr, "graph_ready: %s\n", lk_last_error());
        abort();
    }
    live_dev = slots;
    if (sealed0.kind != kind) {
        fprintf(stderr, "graph_ready: the sealed device was registered before the recording one\n");
        abort();
    }
    if (lk__backend_register(sealed0.kind, &rec_backend)) { /* in front of the sealed backend, for this process */
        fprintf(stderr, "graph_ready: %s\n", lk_last_error());
        abort();
    }
}

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(every_op_has_fields), LK_TEST_CASE(pool_order),
             LK_TEST_CASE(steady_steps), LK_TEST_CASE(cleanup))

/* Pipeline schedules as data (lockstep/pipeline.h): one generator per
 * schedule writes each stage's list of actions; one checker runs all the
 * lists against each other as a rendezvous transport would, so that a
 * schedule that would deadlock, leave a message unmatched or skip a
 * micro-batch is refused before any rank starts; one printer shows them.
 * The interpreter that trains with a schedule lives with the pipeline
 * strategy; it reads these lists and nothing else about the schedule. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/pipeline.h"

struct lk_pipe_schedule {
    char name[32];
    int p, m;
    int v;       /* stages per rank: rank k holds stages k, k + p, ..., k + (v - 1) p (interleaved) */
    bool training;
    lk_pipe_action **acts; /* [p] lists */
    int *n, *cap;
};

static const char *const names[] = {"gpipe", "1f1b", "interleaved_1f1b", "forward", NULL};
enum { GPIPE, ONE_F_ONE_B, INTERLEAVED, FORWARD };

const char *const *lk_pipe_schedule_names(void) { return names; }

double lk_pipe_bubble_theory(int stages, int chunks) {
    if (stages < 1 || chunks < 1) return 0.0;
    return (double)(stages - 1) / (double)(chunks + stages - 1);
}

double lk_pipe_schedule_bubble_theory(const lk_pipe_schedule *s) {
    if (!s || !s->training) return 0.0;
    return (double)(s->p - 1) / (double)(s->v * s->m + s->p - 1);
}

static lk_pipe_schedule *alloc_schedule(const char *name, int p, int v, int m, bool training) {
    lk_pipe_schedule *s = lk_calloc(1, sizeof *s);
    if (!s) return NULL;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->p = p, s->v = v, s->m = m, s->training = training;
    s->acts = lk_calloc((size_t)p, sizeof *s->acts);
    s->n = lk_calloc((size_t)p, sizeof *s->n);
    s->cap = lk_calloc((size_t)p, sizeof *s->cap);
    if (!s->acts || !s->n || !s->cap) {
        lk_pipe_schedule_free(s);
        return NULL;
    }
    return s;
}

void lk_pipe_schedule_free(lk_pipe_schedule *s) {
    if (!s) return;
    for (int k = 0; s->acts && k < s->p; k++) lk_free(s->acts[k]);
    lk_free(s->acts);
    lk_free(s->n);
    lk_free(s->cap);
    lk_free(s);
}

static bool push(lk_pipe_schedule *s, int stage, lk_pipe_action a) {
    if (s->n[stage] == s->cap[stage]) {
        int cap = s->cap[stage] ? 2 * s->cap[stage] : 16;
        lk_pipe_action *na = lk_realloc(s->acts[stage], (size_t)cap * sizeof *na);
        if (!na) return false;
        s->acts[stage] = na, s->cap[stage] = cap;
    }
    s->acts[stage][s->n[stage]++] = a;
    return true;
}

static lk_pipe_action compute(lk_pipe_kind kind, int chunk) { return (lk_pipe_action){.kind = kind, .chunk = chunk}; }
static lk_pipe_op op(bool send, lk_pipe_msg msg, int chunk, int peer) {
    return (lk_pipe_op){.send = send, .msg = msg, .chunk = chunk, .peer = peer};
}

/* Appends a COMM action of the ops whose `use` is set (nothing when none is). */
static bool comm2(lk_pipe_schedule *s, int stage, bool use0, lk_pipe_op a, bool use1, lk_pipe_op b) {
    lk_pipe_action x = {.kind = LK_PIPE_COMM, .chunk = -1};
    if (use0) x.ops[x.nops++] = a;
    if (use1) x.ops[x.nops++] = b;
    return x.nops == 0 || push(s, stage, x);
}
static bool comm1(lk_pipe_schedule *s, int stage, bool use, lk_pipe_op a) { return comm2(s, stage, use, a, false, a); }

/* The receive of micro-batch c's input and the send of its output. */
#define RECV_ACT(c) op(false, LK_PIPE_ACTIVATION, (c), k - 1)
#define SEND_ACT(c) op(true, LK_PIPE_ACTIVATION, (c), k + 1)
#define RECV_GRAD(c) op(false, LK_PIPE_GRADIENT, (c), k + 1)
#define SEND_GRAD(c) op(true, LK_PIPE_GRADIENT, (c), k - 1)

static bool gen_forward(lk_pipe_schedule *s, int k) {
    bool first = k == 0, last = k == s->p - 1;
    for (int c = 0; c < s->m; c++)
        if (!comm1(s, k, !first, RECV_ACT(c)) || !push(s, k, compute(LK_PIPE_FORWARD, c)) || !comm1(s, k, !last, SEND_ACT(c)))
            return false;
    return true;
}

static bool gen_tail(lk_pipe_schedule *s, int k) {
    return push(s, k, compute(LK_PIPE_REDUCE_GRADS, -1)) && push(s, k, compute(LK_PIPE_OPTIMIZER_STEP, -1));
}

/* GPipe: every forward (the activations of all m micro-batches kept), then
 * every backward in the same order. */
static bool gen_gpipe(lk_pipe_schedule *s, int k) {
    bool first = k == 0, last = k == s->p - 1;
    if (!gen_forward(s, k)) return false;
    for (int c = 0; c < s->m; c++)
        if (!comm1(s, k, !last, RECV_GRAD(c)) || !push(s, k, compute(LK_PIPE_BACKWARD, c)) ||
            !comm1(s, k, !first, SEND_GRAD(c)))
            return false;
    return gen_tail(s, k);
}

/* 1F1B (PipeDream-Flush, Megatron's non-interleaved schedule): stage k runs
 * w = p - 1 - k forwards to fill the pipe, then alternates one forward and
 * one backward (the oldest micro-batch's), then drains the last w
 * backwards. A stage's output and the gradient it waits for travel as one
 * COMM of two ops, and so do the gradient it sends back and the next
 * input it waits for, which is what keeps neighbours from each waiting on
 * the other's send. */
static bool gen_1f1b(lk_pipe_schedule *s, int k) {
    int p = s->p, m = s->m;
    bool first = k == 0, last = k == p - 1;
    int w = p - 1 - k < m ? p - 1 - k : m, r = m - w;
    for (int i = 0; i < w; i++)
        if (!comm1(s, k, !first, RECV_ACT(i)) || !push(s, k, compute(LK_PIPE_FORWARD, i)) || !comm1(s, k, !last, SEND_ACT(i)))
            return false;
    if (r > 0 && !comm1(s, k, !first, RECV_ACT(w))) return false;
    for (int j = 0; j < r; j++) {
        int f = w + j;
        if (!push(s, k, compute(LK_PIPE_FORWARD, f)) || !comm2(s, k, !last, SEND_ACT(f), !last, RECV_GRAD(j)) ||
            !push(s, k, compute(LK_PIPE_BACKWARD, j)) ||
            !comm2(s, k, !first, SEND_GRAD(j), !first && j < r - 1, RECV_ACT(f + 1)))
            return false;
    }
    for (int i = r; i < m; i++)
        if (!comm1(s, k, !last, RECV_GRAD(i)) || !push(s, k, compute(LK_PIPE_BACKWARD, i)) ||
            !comm1(s, k, !first, SEND_GRAD(i)))
            return false;
    return gen_tail(s, k);
}

/* ---- interleaved: several stages per rank ----------------------------------------
 * With v stages per rank, rank k holds stages k, k + p, ..., k + (v - 1) p
 * (its "local" stages 0 .. v-1), so a micro-batch passes every rank v
 * times and each pass is 1/v of a rank's work: the pipe fills and drains
 * in 1/v of the time, and the bubble is (p - 1) / (v m + p - 1)
 * (Narayanan et al., 2021; Megatron-LM's interleaved schedule,
 * torch.distributed.pipelining's ScheduleInterleaved1F1B). */

/* The i-th forward (or backward) of a rank: micro-batches in groups of p
 * (the last group what is left), each group through local stage 0, 1, ...
 * (backwards: v - 1 down to 0). Every rank runs the same order, so a
 * stage's input is always the one its neighbour made next. */
static void virtual_order(const lk_pipe_schedule *s, int i, bool backward, int *chunk, int *local) {
    int p = s->p, v = s->v, full = s->m / p;
    int group = i / (p * v), g = group < full ? p : s->m - full * p;
    int within = i - group * p * v;
    *chunk = group * p + within % g;
    *local = backward ? v - 1 - within / g : within / g;
}

typedef struct work {
    lk_pipe_kind kind; /* FORWARD or BACKWARD */
    int chunk, local;
} work;

/* What rank k's compute w sends on (false: nothing; the model's last
 * stage makes the loss, its first sends no gradient back). */
static bool output_op(const lk_pipe_schedule *s, int k, const work *w, lk_pipe_op *o) {
    int g = w->local * s->p + k, n = s->p * s->v;
    bool fwd = w->kind == LK_PIPE_FORWARD;
    if (fwd ? g == n - 1 : g == 0) return false;
    *o = (lk_pipe_op){true, fwd ? LK_PIPE_ACTIVATION : LK_PIPE_GRADIENT, w->chunk, (fwd ? g + 1 : g - 1) % s->p, w->local};
    return true;
}

/* Interleaved 1F1B, generated for every rank at once by running the
 * ranks in rounds. Each rank has its order of computes in steps: a
 * warm-up of single forwards (the first group through every local stage
 * but the last, then more for the ranks after it to fill the pipe), then
 * steps of one forward and one backward (Megatron-LM's steady state: every
 * rank's step costs the same, so the ranks stay in step), then single
 * backwards. In a round every rank runs its next step if the inputs are
 * here (else it waits, keeping its order, so what it holds stays bounded),
 * then posts one COMM: its outputs sent on, and whatever its neighbours
 * made in the round received (an activation from the previous rank, a
 * gradient from the next, kept until their compute comes). Every message
 * of a round is sent and received in that round's COMMs, so no rank waits
 * on another's later action: the lists cannot deadlock however the
 * transport blocks, and each pair's messages are in one order on both
 * sides. */
static bool gen_interleaved_steps(lk_pipe_schedule *s, bool all_forwards_first, bool *stuck) {
    int p = s->p, v = s->v, m = s->m, total = m * v, nst = p * v;
    int g0 = m < p ? m : p; /* the first group's micro-batches */
    size_t per = (size_t)total * 2;
    work *seq = lk_calloc((size_t)p * per, sizeof *seq);
    int *n = lk_calloc((size_t)p, sizeof *n), *pos = lk_calloc((size_t)p, sizeof *pos);
    int *ran = lk_calloc((size_t)p * 2, sizeof *ran), *nran = lk_calloc((size_t)p, sizeof *nran);
    unsigned char *pair = lk_calloc((size_t)p * per, 1); /* a steady step's forward: its backward runs with it */
    /* [(stage * m + chunk) * 2 + backward]: the round from which its input is here (0: not yet) */
    int *here = lk_calloc((size_t)nst * (size_t)m * 2, sizeof *here);
    bool ok = seq && n && pos && ran && nran && pair && here;
    for (int k = 0; ok && k < p; k++) {
        work *q = seq + (size_t)k * per;
        /* Megatron-LM's warm-up: two forwards more per rank after this one keep the steps in phase */
        int w = all_forwards_first || !s->training ? total : (v - 1) * g0 + 2 * (p - 1 - k), f = 0, b = 0;
        if (w > total) w = total;
#define NEXT(bwd, idx) (q[n[k]].kind = (bwd) ? LK_PIPE_BACKWARD : LK_PIPE_FORWARD, virtual_order(s, (idx), (bwd), &q[n[k]].chunk, &q[n[k]].local), n[k]++)
        while (f < w) NEXT(false, f), f++;
        while (s->training && f < total) pair[(size_t)k * per + (size_t)n[k]] = 1, NEXT(false, f), f++, NEXT(true, b), b++;
        while (s->training && b < total) NEXT(true, b), b++;
#undef NEXT
    }
#define HERE(g, c, bwd) here[((size_t)(g) * (size_t)m + (size_t)(c)) * 2 + (bwd)]
    for (int c = 0; ok && c < m; c++) HERE(0, c, 0) = 1; /* the batch */
    for (int round = 1; ok; round++) {
        bool left = false, moved = false;
        for (int k = 0; k < p; k++) {
            nran[k] = 0;
            if (pos[k] == n[k]) continue;
            left = true;
            const work *w = &seq[(size_t)k * per + (size_t)pos[k]];
            int len = pair[(size_t)k * per + (size_t)pos[k]] ? 2 : 1, ready = 1;
            for (int j = 0; j < len; j++) {
                int g = w[j].local * p + k, at = HERE(g, w[j].chunk, w[j].kind == LK_PIPE_BACKWARD);
                /* the last stage's backward of the forward in its own step: the loss is made there */
                bool own = j == 1 && g == nst - 1 && w[0].local == w[1].local && w[0].chunk == w[1].chunk;
                ready &= own || (at && at <= round);
            }
            if (!ready) continue;
            for (int j = 0; j < len && ok; j++) {
                ran[2 * k + nran[k]++] = pos[k]++;
                ok = push(s, k, (lk_pipe_action){.kind = w[j].kind, .chunk = w[j].chunk, .vstage = w[j].local});
            }
            moved = true;
        }
        if (!left) break;
        if (!moved) ok = false, *stuck = true; /* the orders wait on each other (micro-batches not a multiple of p) */
        /* the round's messages: each rank's outputs, sent; its neighbours' outputs, received */
        for (int k = 0; ok && k < p; k++) {
            lk_pipe_action x = {.kind = LK_PIPE_COMM, .chunk = -1};
            lk_pipe_op o;
            for (int j = 0; j < nran[k]; j++)
                if (output_op(s, k, &seq[(size_t)k * per + (size_t)ran[2 * k + j]], &o)) x.ops[x.nops++] = o;
            for (int q = 0; q < p; q++)
                for (int j = 0; q != k && j < nran[q]; j++) {
                    const work *w = &seq[(size_t)q * per + (size_t)ran[2 * q + j]];
                    if (!output_op(s, q, w, &o) || o.peer != k) continue;
                    int g = w->local * p + q + (w->kind == LK_PIPE_FORWARD ? 1 : -1); /* the receiving stage */
                    x.ops[x.nops++] = (lk_pipe_op){false, o.msg, o.chunk, q, g / p};
                }
            if (x.nops) ok = push(s, k, x);
        }
        /* what the round made is here for the next */
        for (int k = 0; ok && k < p; k++)
            for (int j = 0; j < nran[k]; j++) {
                const work *w = &seq[(size_t)k * per + (size_t)ran[2 * k + j]];
                int g = w->local * p + k;
                if (w->kind == LK_PIPE_FORWARD && g == nst - 1) HERE(g, w->chunk, 1) = round + 1; /* its loss */
                else if (w->kind == LK_PIPE_FORWARD) HERE(g + 1, w->chunk, 0) = round + 1;
                else if (g > 0) HERE(g - 1, w->chunk, 1) = round + 1;
            }
    }
#undef HERE
    for (int k = 0; ok && s->training && k < p; k++) ok = gen_tail(s, k);
    lk_free(seq), lk_free(n), lk_free(pos), lk_free(ran), lk_free(nran), lk_free(pair), lk_free(here);
    return ok;
}

/* Where the 1F1B orders wait on each other (micro-batches in an uneven
 * last group on 3 or more ranks: an epoch's short last batch), the same
 * rounds with every forward first (GPipe's order, which always moves):
 * correct, with more activations kept for that batch. */
static bool gen_interleaved(lk_pipe_schedule *s) {
    bool stuck = false;
    if (gen_interleaved_steps(s, false, &stuck)) return true;
    if (!stuck) return false;
    for (int k = 0; k < s->p; k++) s->n[k] = 0;
    return gen_interleaved_steps(s, true, &stuck);
}

lk_status lk_pipe_schedule_make(const char *name, int stages, int chunks, lk_pipe_schedule **out) {
    return lk_pipe_schedule_make_virtual(name, stages, name && !strcmp(name, "interleaved_1f1b") ? 2 : 1, chunks, out);
}

lk_status lk_pipe_schedule_make_virtual(const char *name, int stages, int virtual_stages, int chunks,
                                        lk_pipe_schedule **out) {
    if (!out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_pipe_schedule_make: out is NULL");
    *out = NULL;
    if (!name) name = "1f1b";
    int which = -1;
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) which = i;
    if (which < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline schedule '%s' is unknown (expected gpipe, 1f1b, "
                        "interleaved_1f1b or forward)", name);
    if (stages < 1 || stages > 4096)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline: %d stages (expected 1..4096)", stages);
    if (chunks < 1 || chunks > 65536)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline: %d micro-batches (chunks; expected 1..65536)", chunks);
    int v = virtual_stages;
    if (v < 1 || v > 64)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline: %d virtual stages per rank (expected 1..64)", v);
    if (v > 1 && (which == GPIPE || which == ONE_F_ONE_B))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline schedule %s runs one stage per rank, not %d (several "
                        "stages per rank: interleaved_1f1b)", name, v);
    if (v > 1 && stages < 2)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline: %d stages per rank need at least 2 ranks (one rank "
                        "would send to itself; use schedule 1f1b)", v);
    if ((int64_t)stages * v > 4096)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline: %d ranks x %d stages each is over 4096 stages", stages, v);
    lk_pipe_schedule *s = alloc_schedule(name, stages, v, chunks, which != FORWARD);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    /* several stages per rank: every rank's lists at once, in rounds (a
     * forward-only one too); one stage per rank: each rank's by itself */
    bool ok = true;
    if (which == INTERLEAVED || v > 1) ok = gen_interleaved(s);
    else
        for (int k = 0; k < stages && ok; k++)
            ok = which == GPIPE ? gen_gpipe(s, k) : which == ONE_F_ONE_B ? gen_1f1b(s, k) : gen_forward(s, k);
    if (!ok) {
        lk_pipe_schedule_free(s);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    *out = s;
    return LK_STATUS_OK;
}

lk_status lk_pipe_schedule_from_lists(const char *name, int stages, int chunks, bool training,
                                      const lk_pipe_action *const *lists, const int *n, lk_pipe_schedule **out) {
    if (!out || !lists || !n || stages < 1 || chunks < 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_pipe_schedule_from_lists: bad arguments");
    *out = NULL;
    lk_pipe_schedule *s = alloc_schedule(name ? name : "custom", stages, 1, chunks, training);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    for (int k = 0; k < stages; k++)
        for (int i = 0; i < n[k]; i++)
            if (!push(s, k, lists[k][i])) {
                lk_pipe_schedule_free(s);
                return LK_STATUS_OUT_OF_MEMORY;
            }
    *out = s;
    return LK_STATUS_OK;
}

const char *lk_pipe_schedule_name(const lk_pipe_schedule *s) { return s ? s->name : NULL; }
bool lk_pipe_schedule_training(const lk_pipe_schedule *s) { return s && s->training; }
int lk_pipe_schedule_stages(const lk_pipe_schedule *s) { return s ? s->p : 0; }
int lk_pipe_schedule_chunks(const lk_pipe_schedule *s) { return s ? s->m : 0; }
int lk_pipe_schedule_virtual(const lk_pipe_schedule *s) { return s ? s->v : 0; }
int lk_pipe_schedule_length(const lk_pipe_schedule *s, int stage) {
    return s && stage >= 0 && stage < s->p ? s->n[stage] : 0;
}
const lk_pipe_action *lk_pipe_schedule_action(const lk_pipe_schedule *s, int stage, int i) {
    if (!s || stage < 0 || stage >= s->p || i < 0 || i >= s->n[stage]) return NULL;
    return &s->acts[stage][i];
}

/* ---- printing ------------------------------------------------------------------ */

/* With several stages per rank, a compute or message also names the
 * model's stage it belongs to ("F3s2": micro-batch 3's forward on stage 2). */
static int fmt_op(char *b, size_t size, const lk_pipe_op *o, const lk_pipe_schedule *s, int k) {
    int n = snprintf(b, size, "%c%c%d", o->send ? '>' : '<', o->msg == LK_PIPE_ACTIVATION ? 'a' : 'g', o->chunk);
    if (s->v > 1 && n >= 0 && (size_t)n < size) n += snprintf(b + n, size - (size_t)n, "s%d", o->vstage * s->p + k);
    return n;
}

/* "F3", "[>a3 <g0]", "R"; a message to a stage that is not the neighbour
 * its kind goes to also names the peer ("<a3@5"). */
static void fmt_action(char *b, size_t size, const lk_pipe_action *a, const lk_pipe_schedule *s, int stage) {
    char g[16] = "";
    if (s->v > 1) snprintf(g, sizeof g, "s%d", a->vstage * s->p + stage);
    switch (a->kind) {
    case LK_PIPE_FORWARD: snprintf(b, size, "F%d%s", a->chunk, g); return;
    case LK_PIPE_BACKWARD: snprintf(b, size, "B%d%s", a->chunk, g); return;
    case LK_PIPE_REDUCE_GRADS: snprintf(b, size, "R"); return;
    case LK_PIPE_OPTIMIZER_STEP: snprintf(b, size, "S"); return;
    case LK_PIPE_COMM: break;
    }
    size_t at = 0;
    if (a->nops > 1) at += (size_t)snprintf(b, size, "[");
    for (int i = 0; i < a->nops && at < size; i++) {
        const lk_pipe_op *o = &a->ops[i];
        if (i) at += (size_t)snprintf(b + at, size - at, " ");
        if (at < size) at += (size_t)fmt_op(b + at, size - at, o, s, stage);
        int n = s->p * s->v, gs = o->vstage * s->p + stage;
        bool usual = (o->msg == LK_PIPE_ACTIVATION) == o->send ? o->peer == (gs + 1) % s->p
                                                               : o->peer == (gs - 1 + n) % s->p;
        if (!usual && at < size) at += (size_t)snprintf(b + at, size - at, "@%d", o->peer);
    }
    if (a->nops > 1 && at < size) snprintf(b + at, size - at, "]");
}

lk_status lk_pipe_schedule_print(const lk_pipe_schedule *s, FILE *f) {
    if (!s || !f) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_pipe_schedule_print: NULL argument");
    if (s->v > 1)
        fprintf(f, "schedule %s: %d ranks x %d stages each (rank k holds stages k, k+%d, ...), %d micro-batch%s\n",
                s->name, s->p, s->v, s->p, s->m, s->m == 1 ? "" : "es");
    else
        fprintf(f, "schedule %s: %d stage%s, %d micro-batch%s\n", s->name, s->p, s->p == 1 ? "" : "s", s->m,
                s->m == 1 ? "" : "es");
    fprintf(f, "  F3/B3: forward/backward of micro-batch 3; >a3/<a3: send/receive its activation (to the next stage,\n"
               "  from the previous); >g3/<g3: send/receive its gradient (to the previous, from the next);\n"
               "  [..]: posted together, then waited for together; R: reduce gradients; S: optimizer step\n");
    if (s->v > 1) fprintf(f, "  s5: of the model's stage 5\n");
    for (int k = 0; k < s->p; k++) {
        fprintf(f, "%s %d:", s->v > 1 ? "rank" : "stage", k);
        for (int i = 0; i < s->n[k]; i++) {
            char b[96];
            fmt_action(b, sizeof b, &s->acts[k][i], s, k);
            fprintf(f, " %s", b);
        }
        fputc('\n', f);
    }
    lk_pipe_report r;
    lk_status st = lk_pipe_schedule_check(s, &r);
    if (st) {
        fprintf(f, "check: FAILED: %s\n", lk_last_error());
        return st;
    }
    fprintf(f, "check: complete, every message matched, no deadlock with blocking sends (%d rounds)\n", r.steps);
    if (!s->training) return LK_STATUS_OK;
    fprintf(f, s->v > 1 ? "micro-batches whose activations a rank keeps at most (one per stage it holds), per rank:"
                        : "micro-batches whose activations a stage keeps at most, per stage:");
    for (int k = 0; k < s->p && k < 64; k++) fprintf(f, " %d", r.peak_alive[k]);
    fprintf(f, "%s\n", s->p > 64 ? " ..." : "");
    fprintf(f, "bubble: theory (p-1)/(%sm+p-1) = %.1f%%; simulated with a backward costing two forwards and free "
                   "messages: %.1f%%\n",
                s->v > 1 ? "v" : "", 100.0 * lk_pipe_schedule_bubble_theory(s), 100.0 * r.bubble);
    return LK_STATUS_OK;
}

/* ---- the checker ----------------------------------------------------------------- */

/* A message op of a stage's current COMM action, posted and maybe matched. */
typedef struct posted {
    bool live, matched;
    long seq;          /* n-th op on its (stage, peer, direction) */
    double t_post, t_match;
} posted;

/* Per stage: how many ops it posted to / from each peer it talks to. */
typedef struct chan {
    int peer;
    long sends, recvs;
} chan;

typedef struct sim {
    const lk_pipe_schedule *s;
    int *pc;            /* next action per stage */
    posted (*cur)[LK_PIPE_MAX_OPS]; /* the current COMM's ops */
    bool *cur_posted;
    chan **ch;
    int *nch, *capch;
    double *clock, *busy;
    /* completeness, [stage * m + chunk]: bit 0 forward, 1 backward, 2 input
     * in, 3 output sent, 4 gradient in, 5 gradient sent */
    unsigned char *done;
    int *alive, *reduced, *stepped;
} sim;

static const char *msg_name(lk_pipe_msg m) { return m == LK_PIPE_ACTIVATION ? "activation" : "gradient"; }

static chan *chan_of(sim *x, int k, int peer) {
    for (int i = 0; i < x->nch[k]; i++)
        if (x->ch[k][i].peer == peer) return &x->ch[k][i];
    if (x->nch[k] == x->capch[k]) {
        int cap = x->capch[k] ? 2 * x->capch[k] : 4;
        chan *n = lk_realloc(x->ch[k], (size_t)cap * sizeof *n);
        if (!n) return NULL;
        x->ch[k] = n, x->capch[k] = cap;
    }
    x->ch[k][x->nch[k]] = (chan){.peer = peer};
    return &x->ch[k][x->nch[k]++];
}

static lk_status fault(const sim *x, int k, int i, const char *fmt, const char *what) {
    char b[96];
    fmt_action(b, sizeof b, &x->s->acts[k][i], x->s, k);
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline schedule %s (%d %s, %d micro-batches): %s %d, action %d (%s): %s%s",
                    x->s->name, x->s->p, x->s->v > 1 ? "ranks" : "stages", x->s->m, x->s->v > 1 ? "rank" : "stage", k, i,
                    b, fmt, what ? what : "");
}

/* The bookkeeping of a compute action (and its completeness rules). */
static lk_status run_compute(sim *x, int k, int i) {
    const lk_pipe_schedule *s = x->s;
    const lk_pipe_action *a = &s->acts[k][i];
    int m = s->m, g = a->vstage * s->p + k; /* the model's stage */
    bool first = g == 0, last = g == s->p * s->v - 1, compute = a->kind == LK_PIPE_FORWARD || a->kind == LK_PIPE_BACKWARD;
    if (compute && (a->chunk < 0 || a->chunk >= m)) return fault(x, k, i, "micro-batch out of range", NULL);
    if (compute && (a->vstage < 0 || a->vstage >= s->v)) return fault(x, k, i, "a stage this rank does not hold", NULL);
    unsigned char *d = compute ? &x->done[(size_t)g * (size_t)m + (size_t)a->chunk] : NULL;
    double unit = 1.0 / s->v; /* a stage's share of the rank's forward */
    switch (a->kind) {
    case LK_PIPE_FORWARD:
        if (*d & 1) return fault(x, k, i, "a second forward of this micro-batch", NULL);
        if (!first && !(*d & 4)) return fault(x, k, i, "its input activation was not received before", NULL);
        if (x->reduced[k]) return fault(x, k, i, "a forward after the gradients were reduced", NULL);
        *d |= 1;
        if (s->training) x->alive[k]++; /* a forward-only schedule keeps no activation for a backward */
        x->clock[k] += unit, x->busy[k] += unit;
        break;
    case LK_PIPE_BACKWARD:
        if (!s->training) return fault(x, k, i, "a backward in a forward-only schedule", NULL);
        if (!(*d & 1)) return fault(x, k, i, "a backward before its forward", NULL);
        if (*d & 2) return fault(x, k, i, "a second backward of this micro-batch", NULL);
        if (!last && !(*d & 16)) return fault(x, k, i, "its output's gradient was not received before", NULL);
        *d |= 2;
        x->alive[k]--;
        x->clock[k] += 2 * unit, x->busy[k] += 2 * unit;
        break;
    case LK_PIPE_REDUCE_GRADS:
        if (!s->training) return fault(x, k, i, "a gradient reduction in a forward-only schedule", NULL);
        if (x->reduced[k]++) return fault(x, k, i, "the gradients reduced twice", NULL);
        for (int c = 0; c < m * s->v; c++)
            if (!(x->done[((size_t)(c / m) * (size_t)s->p + (size_t)k) * (size_t)m + (size_t)(c % m)] & 2)) {
                char w[64];
                if (s->v > 1) snprintf(w, sizeof w, " (micro-batch %d of stage %d)", c % m, c / m * s->p + k);
                else snprintf(w, sizeof w, " (micro-batch %d)", c);
                return fault(x, k, i, "the gradients reduced before every backward ran", w);
            }
        break;
    case LK_PIPE_OPTIMIZER_STEP:
        if (!s->training) return fault(x, k, i, "an optimizer step in a forward-only schedule", NULL);
        if (!x->reduced[k]) return fault(x, k, i, "an optimizer step before the gradients were reduced", NULL);
        if (x->stepped[k]++) return fault(x, k, i, "a second optimizer step", NULL);
        break;
    case LK_PIPE_COMM: break;
    }
    return LK_STATUS_OK;
}

/* Posts stage k's COMM action i: numbers its ops per pair and direction,
 * checks each against the stage's state, and matches those whose partner
 * op is already posted. */
static lk_status post(sim *x, int k, int i) {
    const lk_pipe_schedule *s = x->s;
    const lk_pipe_action *a = &s->acts[k][i];
    int m = s->m;
    if (a->nops < 1 || a->nops > LK_PIPE_MAX_OPS) return fault(x, k, i, "a message action needs 1 to 4 ops", NULL);
    for (int j = 0; j < a->nops; j++) {
        const lk_pipe_op *o = &a->ops[j];
        if (o->peer < 0 || o->peer >= s->p || o->peer == k) return fault(x, k, i, "a message to no other stage", NULL);
        if (o->chunk < 0 || o->chunk >= m) return fault(x, k, i, "a message of a micro-batch out of range", NULL);
        if (o->vstage < 0 || o->vstage >= s->v) return fault(x, k, i, "a message of a stage this rank does not hold", NULL);
        /* activations go to the model's next stage, gradients to the previous one */
        int n = s->p * s->v, g = o->vstage * s->p + k, to = (o->msg == LK_PIPE_ACTIVATION) == o->send ? g + 1 : g - 1;
        if (to < 0 || to >= n) return fault(x, k, i, o->send ? "a message sent past the model's first or last stage"
                                                            : "a message received from before the model's first stage "
                                                              "or past its last", NULL);
        if (s->v > 1 && o->peer != to % s->p)
            return fault(x, k, i, "a message to a rank that does not hold the neighbouring stage", NULL);
        unsigned char *d = &x->done[(size_t)g * (size_t)m + (size_t)o->chunk];
        if (o->send && o->msg == LK_PIPE_ACTIVATION && !(*d & 1))
            return fault(x, k, i, "an activation sent before its forward ran", NULL);
        if (o->send && o->msg == LK_PIPE_GRADIENT && !(*d & 2))
            return fault(x, k, i, "a gradient sent before its backward ran", NULL);
        if (!o->send && o->msg == LK_PIPE_GRADIENT && (*d & 2))
            return fault(x, k, i, "a gradient received after its backward ran", NULL);
        if (!o->send && o->msg == LK_PIPE_ACTIVATION && (*d & 1))
            return fault(x, k, i, "an activation received after its forward ran", NULL);
        unsigned char bit = o->send ? (o->msg == LK_PIPE_ACTIVATION ? 8 : 32) : (o->msg == LK_PIPE_ACTIVATION ? 4 : 16);
        if (*d & bit) return fault(x, k, i, "the same message a second time", NULL);
        *d |= bit;
        chan *c = chan_of(x, k, o->peer);
        if (!c) return LK_STATUS_OUT_OF_MEMORY;
        x->cur[k][j] = (posted){.live = true, .seq = o->send ? c->sends++ : c->recvs++, .t_post = x->clock[k]};
    }
    for (int j = a->nops; j < LK_PIPE_MAX_OPS; j++) x->cur[k][j] = (posted){0};
    x->cur_posted[k] = true;
    /* match against the partners' current actions */
    for (int j = 0; j < a->nops; j++) {
        const lk_pipe_op *o = &a->ops[j];
        int q = o->peer;
        if (!x->cur_posted[q]) continue;
        const lk_pipe_action *b = &s->acts[q][x->pc[q]];
        for (int l = 0; l < b->nops; l++) {
            const lk_pipe_op *u = &b->ops[l];
            posted *pu = &x->cur[q][l], *po = &x->cur[k][j];
            if (u->peer != k || u->send == o->send || pu->matched || pu->seq != po->seq) continue;
            /* the same message, between neighbouring stages (interleaved: the stages either side) */
            int gk = o->vstage * s->p + k, gq = u->vstage * s->p + q, gs = o->send ? gk : gq, gr = o->send ? gq : gk;
            if (u->msg != o->msg || u->chunk != o->chunk || gr - gs != (o->msg == LK_PIPE_ACTIVATION ? 1 : -1)) {
                char w[256];
                snprintf(w, sizeof w, ": stage %d's %s #%ld %s stage %d is %s %d, stage %d's %s #%ld is %s %d", k,
                         o->send ? "send" : "receive", po->seq + 1, o->send ? "to" : "from", q, msg_name(o->msg),
                         o->chunk, q, u->send ? "send" : "receive", pu->seq + 1, msg_name(u->msg), u->chunk);
                return fault(x, k, i, "a message meets another one (mismatch)", w);
            }
            pu->matched = po->matched = true;
            pu->t_match = po->t_match = po->t_post > pu->t_post ? po->t_post : pu->t_post;
        }
    }
    return LK_STATUS_OK;
}

static void describe_stuck(const sim *x, int k, char *b, size_t size) {
    const lk_pipe_action *a = &x->s->acts[k][x->pc[k]];
    char f[96];
    fmt_action(f, sizeof f, a, x->s, k);
    size_t at = (size_t)snprintf(b, size, "%s %d waits in action %d (%s):", x->s->v > 1 ? "rank" : "stage", k, x->pc[k], f);
    for (int j = 0; j < a->nops && at < size; j++)
        if (!x->cur[k][j].matched)
            at += (size_t)snprintf(b + at, size - at, " its %s of %s %d %s stage %d is not met;", a->ops[j].send ? "send" : "receive",
                                   msg_name(a->ops[j].msg), a->ops[j].chunk, a->ops[j].send ? "to" : "from", a->ops[j].peer);
}

lk_status lk_pipe_schedule_check(const lk_pipe_schedule *s, lk_pipe_report *report) {
    if (!s) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_pipe_schedule_check: NULL schedule");
    int p = s->p, m = s->m;
    if ((double)p * s->v * (double)m > (double)(1 << 26))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline schedule check: %d stages x %d micro-batches is too large "
                        "to simulate (at most 2^26)", p, m);
    sim x = {.s = s};
    x.pc = lk_calloc((size_t)p, sizeof *x.pc);
    x.cur = lk_calloc((size_t)p, sizeof *x.cur);
    x.cur_posted = lk_calloc((size_t)p, sizeof *x.cur_posted);
    x.ch = lk_calloc((size_t)p, sizeof *x.ch);
    x.nch = lk_calloc((size_t)p, sizeof *x.nch);
    x.capch = lk_calloc((size_t)p, sizeof *x.capch);
    x.clock = lk_calloc((size_t)p, sizeof *x.clock);
    x.busy = lk_calloc((size_t)p, sizeof *x.busy);
    x.done = lk_calloc((size_t)p * (size_t)s->v * (size_t)m, 1);
    x.alive = lk_calloc((size_t)p, sizeof *x.alive);
    x.reduced = lk_calloc((size_t)p, sizeof *x.reduced);
    x.stepped = lk_calloc((size_t)p, sizeof *x.stepped);
    lk_pipe_report r;
    memset(&r, 0, sizeof r);
    lk_status st = LK_STATUS_OK;
    if (!x.pc || !x.cur || !x.cur_posted || !x.ch || !x.nch || !x.capch || !x.clock || !x.busy || !x.done || !x.alive ||
        !x.reduced || !x.stepped) {
        st = LK_STATUS_OUT_OF_MEMORY;
        goto out;
    }
    for (;;) {
        bool moved = false, all_done = true;
        for (int k = 0; k < p && !st; k++) {
            /* run stage k until it blocks */
            while (x.pc[k] < s->n[k] && !st) {
                int i = x.pc[k];
                const lk_pipe_action *a = &s->acts[k][i];
                if (a->kind != LK_PIPE_COMM) {
                    st = run_compute(&x, k, i);
                    if (k < 64 && x.alive[k] > r.peak_alive[k]) r.peak_alive[k] = x.alive[k];
                    if (x.alive[k] > r.peak_alive_max) r.peak_alive_max = x.alive[k];
                    x.pc[k]++;
                    moved = true;
                    continue;
                }
                if (!x.cur_posted[k]) {
                    st = post(&x, k, i);
                    moved = true;
                    if (st) break;
                }
                bool all = true;
                double t = x.clock[k];
                for (int j = 0; j < a->nops; j++) {
                    all = all && x.cur[k][j].matched;
                    if (x.cur[k][j].t_match > t) t = x.cur[k][j].t_match;
                }
                if (!all) break;
                x.clock[k] = t;
                x.cur_posted[k] = false;
                x.pc[k]++;
                moved = true;
            }
            if (x.pc[k] < s->n[k]) all_done = false;
        }
        if (st) goto out;
        r.steps++;
        if (all_done) break;
        if (!moved) {
            char msg[2048];
            size_t at = 0;
            msg[0] = 0;
            for (int k = 0; k < p && at < sizeof msg - 1; k++)
                if (x.pc[k] < s->n[k]) {
                    describe_stuck(&x, k, msg + at, sizeof msg - at);
                    at = strlen(msg);
                    if (at < sizeof msg - 1) msg[at++] = ' ', msg[at] = 0;
                }
            while (at > 0 && (msg[at - 1] == ' ' || msg[at - 1] == ';')) msg[--at] = 0;
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "pipeline schedule %s (%d stages, %d micro-batches) deadlocks with blocking sends: %s", s->name,
                          p, m, msg);
            goto out;
        }
    }
    /* complete: every stage did all of its part */
    for (int g = 0; g < p * s->v && !st; g++) {
        bool first = g == 0, last = g == p * s->v - 1;
        for (int c = 0; c < m && !st; c++) {
            unsigned char d = x.done[(size_t)g * (size_t)m + (size_t)c];
            const char *missing = !(d & 1)                           ? "its forward"
                                  : s->training && !(d & 2)           ? "its backward"
                                  : !last && !(d & 8)                 ? "the send of its activation"
                                  : s->training && !first && !(d & 32) ? "the send of its gradient"
                                                                      : NULL;
            if (missing)
                st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                              "pipeline schedule %s (%d stages, %d micro-batches) is incomplete: stage %d never runs %s "
                              "for micro-batch %d",
                              s->name, p * s->v, m, g, missing, c);
        }
    }
    for (int k = 0; k < p && !st; k++) {
        if (s->training && (!x.reduced[k] || !x.stepped[k]))
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "pipeline schedule %s (%d stages, %d micro-batches) is incomplete: stage %d never %s", s->name, p,
                          m, k, !x.reduced[k] ? "reduces its gradients" : "steps its optimizer");
    }
    if (st) goto out;
    double span = 0.0, idle = 0.0;
    for (int k = 0; k < p; k++) span = x.clock[k] > span ? x.clock[k] : span;
    for (int k = 0; k < p; k++) idle += span > 0 ? 1.0 - x.busy[k] / span : 0.0;
    r.makespan = span;
    r.bubble = idle / p;
    if (report) *report = r;
out:
    for (int k = 0; x.ch && k < p; k++) lk_free(x.ch[k]);
    lk_free(x.pc), lk_free(x.cur), lk_free(x.cur_posted), lk_free(x.ch), lk_free(x.nch), lk_free(x.capch);
    lk_free(x.clock), lk_free(x.busy), lk_free(x.done), lk_free(x.alive), lk_free(x.reduced), lk_free(x.stepped);
    return st;
}

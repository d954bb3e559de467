/* The pipeline interpreter (lk_pipe_run): runs one stage's list of a
 * schedule — the only place that turns the schedule's actions into
 * forwards, backwards and messages. Each micro-batch keeps its own graph
 * (several are alive at once: 1F1B starts micro-batch k+1's forward before
 * k's backward), from a leaf that stands for the input the previous stage
 * sent (its gradient is what goes back) to the output that goes on (or the
 * loss). A micro-batch's tensors are its own, not the run's: its forward
 * runs in a scope whose tensors it keeps (lk_scope_end_keep), released
 * after its backward, and the activation and gradient it received are
 * released once used, so a stage holds the activations of the micro-batches
 * its schedule has in flight and no more (1F1B: at most p - stage). */
#include <string.h>

#include "lockstep/autograd.h"
#include "lockstep/pipeline.h"

/* An activation's header: dtype, ndim, dims. A gradient needs none: its
 * receiver made the tensor it belongs to. */
enum { HDR = 2 + LK_MAX_DIMS };

typedef struct chunk_state {
    lk_tensor *in;   /* the input leaf (stages after the first: received, owned here), or stage 0's input */
    lk_tensor *out;  /* the stage's output (its graph alive until the backward) */
    lk_tensor *loss; /* the last stage's (scaled) loss */
    lk_tensor *gout; /* the gradient of out, received (owned here) */
    lk_tensor **kept; /* the forward's tensors (out, loss and what the graph saved), released after the backward */
    int nkept;
    bool in_owned;
    int64_t hdr[HDR];
} chunk_state;

/* Gives back what the micro-batch's forward made (its graph's nodes went
 * with its backward, or go with the run's scope). */
static void release_forward(chunk_state *x) {
    for (int i = x->nkept - 1; i >= 0; i--) lk_tensor_release(x->kept[i]);
    lk_free(x->kept);
    x->kept = NULL;
    x->nkept = 0;
    x->out = x->loss = NULL;
    if (!x->in_owned) x->in = NULL; /* stage 0's input was the forward's */
}

static void release_in(chunk_state *x) {
    if (x->in_owned) lk_tensor_release(x->in);
    x->in = NULL;
    x->in_owned = false;
}

typedef struct run {
    const lk_pipe_schedule *s;
    const lk_pipe_stage *st;
    int k, p, v, m;
    int *first;          /* [v + 1] each local stage's first block in st->blocks */
    chunk_state *c;      /* [v * m]: local stage j's micro-batch c at j * m + c */
    double loss_sum;
    int *nbwd, *bwd_total; /* [v] backwards run so far per local stage, and in the list */
} run;

static chunk_state *state(run *r, int vstage, int c) { return &r->c[(size_t)vstage * (size_t)r->m + (size_t)c]; }
static bool is_first(const run *r, int vstage) { return vstage == 0 && r->k == 0; }
static bool is_last(const run *r, int vstage) { return vstage == r->v - 1 && r->k == r->p - 1; }

static lk_status forward_body(run *r, int c, int j) {
    chunk_state *x = state(r, j, c);
    int g = j * r->p + r->k; /* the model's stage */
    lk_tensor *h = is_first(r, j) ? r->st->input(r->st->ctx, c) : x->in;
    if (!h) return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline stage %d: no input for micro-batch %d%s", g, c,
                            is_first(r, j) ? "" : " (its activation never arrived)");
    if (is_first(r, j)) x->in = h;
    for (int b = r->first[j]; b < r->first[j + 1] && h; b++) h = lk_layer_forward(r->st->blocks[b], h);
    if (!h) return lk_error(lk_last_status(), "pipeline stage %d, micro-batch %d: %s", g, c, lk_last_error());
    x->out = h;
    if (is_last(r, j) && r->st->output && !lk_pipe_schedule_training(r->s)) {
        lk_status st = r->st->output(r->st->ctx, c, h);
        if (st) return lk_error(st, "pipeline last stage, micro-batch %d: output: %s", c, lk_last_error());
    } else if (is_last(r, j)) {
        lk_tensor *loss = r->st->loss(r->st->ctx, c, h);
        if (!loss) return lk_error(lk_last_status(), "pipeline last stage, micro-batch %d: loss: %s", c, lk_last_error());
        float w = r->st->chunk_weight ? r->st->chunk_weight[c] : 1.0f;
        r->loss_sum += (double)lk_tensor_item(loss) * w;
        float mul = (r->st->loss_mul > 0 ? r->st->loss_mul : 1.0f) * w;
        x->loss = mul == 1.0f ? loss : lk_mul_scalar(loss, mul);
        if (!x->loss) return lk_last_status();
    }
    return LK_STATUS_OK;
}

/* The forward in a scope of the micro-batch's own, whose tensors it keeps. */
static lk_status forward(run *r, int c, int j) {
    lk_scope_begin();
    lk_status st = forward_body(r, c, j);
    chunk_state *x = state(r, j, c);
    x->kept = lk_scope_end_keep(&x->nkept);
    return st;
}

static lk_status backward(run *r, int c, int j) {
    chunk_state *x = state(r, j, c);
    lk_status st;
    if (r->st->before_backward) r->st->before_backward(r->st->ctx, c, j, r->nbwd[j] == r->bwd_total[j] - 1);
    r->nbwd[j]++;
    if (is_last(r, j)) st = lk_backward(x->loss);
    else if (!x->gout)
        st = lk_error(LK_STATUS_INTERNAL, "pipeline stage %d: micro-batch %d's gradient is missing", j * r->p + r->k, c);
    else st = lk_backward_with(x->out, x->gout);
    if (st) return st;
    /* its graph is gone: its activations go too (the input's gradient, still to send, is the input's) */
    lk_tensor_release(x->gout);
    x->gout = NULL;
    release_forward(x);
    return LK_STATUS_OK;
}

/* Posts the ops of one COMM action and waits for all of them. An
 * activation's data can only be received once its header says how much,
 * so the action goes in two rounds: the activations' headers (host
 * memory), waiting for the received ones only; then every data message —
 * activations and gradients, sent and received — posted as one group
 * (lk_comm_p2p_group_begin) and waited for together. Only the headers
 * are waited for between the rounds: a data send waited for there would
 * need its peer's receive, which that peer may post only in its own
 * second round, after a header this rank sends in its first (the cause of
 * the deadlock pipelines had on nccl). And on nccl, where a rank's calls
 * otherwise run one after another, the group is what lets a stage send
 * its activation on and receive the next stage's gradient at once. */
static lk_status comm_body(run *r, const lk_pipe_action *a) {
    lk_comm *cm = r->st->comm;
    lk_work *w[8] = {0};
    int nw = 0;
    lk_status st = LK_STATUS_OK;
    lk_tensor *sent[LK_PIPE_MAX_OPS] = {0}; /* the contiguous activations sent (this action's scope holds them) */
    /* round 1: the activations' headers */
    for (int i = 0; i < a->nops && !st; i++) {
        const lk_pipe_op *o = &a->ops[i];
        chunk_state *x = state(r, o->vstage, o->chunk);
        if (o->msg != LK_PIPE_ACTIVATION) continue;
        if (o->send) {
            lk_tensor *t = sent[i] = lk_contiguous(x->out);
            if (!t) return lk_last_status();
            memset(x->hdr, 0, sizeof x->hdr);
            x->hdr[0] = t->dtype, x->hdr[1] = t->ndim;
            for (int d = 0; d < t->ndim; d++) x->hdr[2 + d] = t->shape[d];
            st = lk_comm_send_async(cm, x->hdr, HDR, LK_I64, o->peer, &w[nw++]);
        } else {
            st = lk_comm_recv_async(cm, x->hdr, HDR, LK_I64, o->peer, &w[nw++]);
        }
    }
    for (int i = 0, j = 0; i < a->nops && !st; i++) {
        const lk_pipe_op *o = &a->ops[i];
        if (o->msg != LK_PIPE_ACTIVATION) continue;
        if (!o->send) st = lk_work_wait(w[j]);
        j++;
    }
    /* round 2: the data, as one group */
    bool grouped = false;
    if (!st) st = lk_comm_p2p_group_begin(cm), grouped = !st;
    for (int i = 0; i < a->nops && !st; i++) {
        const lk_pipe_op *o = &a->ops[i];
        chunk_state *x = state(r, o->vstage, o->chunk);
        if (o->send && o->msg == LK_PIPE_ACTIVATION) {
            st = lk_comm_send_async(cm, sent[i]->data, (size_t)sent[i]->numel, sent[i]->dtype, o->peer, &w[nw++]);
        } else if (o->send) { /* the gradient of this stage's input */
            const lk_tensor *g = x->in ? x->in->grad : NULL;
            if (!g) {
                st = lk_error(LK_STATUS_INTERNAL, "pipeline stage %d: micro-batch %d's input got no gradient",
                              o->vstage * r->p + r->k, o->chunk);
                break;
            }
            st = lk_comm_send_async(cm, g->data, (size_t)g->numel, g->dtype, o->peer, &w[nw++]);
        } else if (o->msg == LK_PIPE_ACTIVATION) {
            int64_t dt = x->hdr[0], nd = x->hdr[1];
            if (nd < 0 || nd > LK_MAX_DIMS || dt < 0 || dt >= LK_DTYPE_COUNT) {
                st = lk_error(LK_STATUS_INVALID_USAGE, "pipeline stage %d: the header of activation %d from stage %d is "
                              "corrupt (dtype %lld, %lld dims)", r->k, o->chunk, o->peer, (long long)dt, (long long)nd);
                break;
            }
            lk_tensor *in = lk_tensor_empty((lk_dtype)dt, (int)nd, x->hdr + 2);
            if (!in) {
                st = lk_last_status();
                break;
            }
            in->requires_grad = true; /* a leaf: its gradient goes back to the previous stage */
            x->in = in;
            x->in_owned = true;
            st = lk_comm_recv_async(cm, in->data, (size_t)in->numel, in->dtype, o->peer, &w[nw++]);
        } else {
            x->gout = lk_tensor_empty(x->out->dtype, x->out->ndim, x->out->shape);
            if (!x->gout) {
                st = lk_last_status();
                break;
            }
            st = lk_comm_recv_async(cm, x->gout->data, (size_t)x->gout->numel, x->gout->dtype, o->peer, &w[nw++]);
        }
    }
    if (grouped) { /* ended on a failure too: what it holds is posted, then failed by the abort that follows */
        lk_status ge = lk_comm_p2p_group_end(cm);
        if (!st) st = ge;
    }
    for (int j = 0; j < nw; j++) {
        lk_status sj = lk_work_wait(w[j]);
        if (!st) st = sj;
    }
    for (int j = 0; j < nw; j++) lk_work_free(w[j]);
    /* a sent gradient was the input's last use */
    for (int i = 0; i < a->nops && !st; i++)
        if (a->ops[i].send && a->ops[i].msg == LK_PIPE_GRADIENT) release_in(state(r, a->ops[i].vstage, a->ops[i].chunk));
    return st;
}

/* A scope of its own for what the sends make (a contiguous copy), gone once they completed. */
static lk_status comm(run *r, const lk_pipe_action *a) {
    lk_scope_begin();
    lk_status st = comm_body(r, a);
    lk_scope_end();
    return st;
}

lk_status lk_pipe_run(const lk_pipe_schedule *s, const lk_pipe_stage *st, double *loss_sum) {
    if (loss_sum) *loss_sum = 0.0;
    if (!s || !st || !st->comm || (st->nblocks > 0 && !st->blocks))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_pipe_run: NULL schedule, stage, communicator or blocks");
    run r = {.s = s, .st = st, .k = lk_comm_rank(st->comm), .p = lk_comm_world_size(st->comm),
             .v = lk_pipe_schedule_virtual(s), .m = lk_pipe_schedule_chunks(s)};
    if (r.p != lk_pipe_schedule_stages(s))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_pipe_run: the schedule has %d stages but the pipeline group %d ranks",
                        lk_pipe_schedule_stages(s), r.p);
    if (r.v > 1 && !st->stage_blocks)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_pipe_run: the schedule runs %d stages per rank but the stage "
                        "gives no stage_blocks", r.v);
    bool out_only = st->output && !lk_pipe_schedule_training(s); /* the last stage hands its outputs over, no loss */
    if ((r.k == 0 && !st->input) || (r.k == r.p - 1 && !st->loss && !out_only))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_pipe_run: stage %d needs %s", r.k,
                        r.k == 0 && !st->input ? "an input function (stage 0)" : "a loss function (the last stage)");
    LK_TRY(lk_pipe_schedule_check(s, NULL));
    int m = r.m, nc = r.v * m;
    r.c = lk_calloc((size_t)nc, sizeof *r.c);
    r.first = lk_calloc((size_t)r.v + 1, sizeof *r.first);
    r.nbwd = lk_calloc((size_t)r.v, sizeof *r.nbwd);
    r.bwd_total = lk_calloc((size_t)r.v, sizeof *r.bwd_total);
    if (!r.c || !r.first || !r.nbwd || !r.bwd_total) {
        lk_free(r.c), lk_free(r.first), lk_free(r.nbwd), lk_free(r.bwd_total);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    bool counts_ok = true;
    for (int j = 0; j < r.v; j++) {
        int nb = st->stage_blocks ? st->stage_blocks[j] : st->nblocks;
        counts_ok = counts_ok && nb >= 0;
        r.first[j + 1] = r.first[j] + nb;
    }
    int given = r.first[r.v];
    if (!counts_ok || given != st->nblocks) {
        lk_free(r.c), lk_free(r.first), lk_free(r.nbwd), lk_free(r.bwd_total);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_pipe_run: stage_blocks gives its %d local stages %d blocks in "
                        "all, but the stage holds %d", r.v, given, st->nblocks);
    }
    for (int i = 0; i < lk_pipe_schedule_length(s, r.k); i++) {
        const lk_pipe_action *a = lk_pipe_schedule_action(s, r.k, i);
        if (a->kind == LK_PIPE_BACKWARD) r.bwd_total[a->vstage]++;
    }
    lk_status res = LK_STATUS_OK;
    lk_scope_begin();
    double t_run = lk_time_now();
    for (int i = 0; i < lk_pipe_schedule_length(s, r.k) && !res; i++) {
        const lk_pipe_action *a = lk_pipe_schedule_action(s, r.k, i);
        double t0 = st->times || st->on_action ? lk_time_now() : 0;
        switch (a->kind) {
        case LK_PIPE_FORWARD: res = forward(&r, a->chunk, a->vstage); break;
        case LK_PIPE_BACKWARD: res = backward(&r, a->chunk, a->vstage); break;
        case LK_PIPE_COMM: res = comm(&r, a); break;
        case LK_PIPE_REDUCE_GRADS: res = st->reduce_grads ? st->reduce_grads(st->ctx) : LK_STATUS_OK; break;
        case LK_PIPE_OPTIMIZER_STEP: res = st->optimizer_step ? st->optimizer_step(st->ctx) : LK_STATUS_OK; break;
        }
        double t1 = st->times || st->on_action ? lk_time_now() : 0;
        if (st->times && (a->kind == LK_PIPE_FORWARD || a->kind == LK_PIPE_BACKWARD)) st->times->compute_s += t1 - t0;
        else if (st->times && a->kind == LK_PIPE_COMM) st->times->comm_s += t1 - t0;
        if (st->on_action && !res) st->on_action(st->ctx, a, t0, t1);
    }
    if (st->times) st->times->total_s += lk_time_now() - t_run;
    lk_scope_end(); /* the graphs no backward ran for (a forward-only schedule, a failure) */
    for (int c = 0; c < nc; c++) {
        lk_tensor_release(r.c[c].gout);
        release_forward(&r.c[c]);
        release_in(&r.c[c]);
    }
    lk_free(r.c), lk_free(r.first), lk_free(r.nbwd), lk_free(r.bwd_total);
    if (res) {
        char why[1024];
        snprintf(why, sizeof why, "%s", lk_last_error());
        lk_comm_abort(st->comm, why); /* the other stages wait on this one: stop them too */
        return lk_error(res, "%s", why);
    }
    if (loss_sum) *loss_sum = r.k == r.p - 1 ? r.loss_sum : 0.0;
    return LK_STATUS_OK;
}

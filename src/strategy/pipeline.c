/* The model_parallel and pipeline strategies: the network's blocks cut into
 * consecutive stages, one per rank of a pipeline group; each step runs this
 * rank's list of a schedule (lockstep/pipeline.h, lk_pipe_run) over the
 * batch cut into micro-batches (model_parallel: one), so activations go
 * forward and their gradients come back through point-to-point messages and
 * each stage's parameters accumulate their gradients over the micro-batches.
 * The trainer then clips (the global norm over every stage) and steps each
 * rank's optimizer, which holds only its stage's parameters and state.
 *
 * With trainer.pipeline.stages below the devices, the ranks form a 2-D mesh
 * (lk_comm_mesh_2d: rank = stage * replicas + replica): each replica is a
 * whole pipeline fed its own shard of the data, and the replicas of one
 * stage average their gradients once per optimizer step, in buckets of the
 * stage's flat gradient buffer started as the last micro-batch's backward
 * completes them (ddp's scheme; the rest after the schedule).
 *
 * Each stage holds only its own blocks: after the cut a rank gives back
 * the storage of the other stages' parameters and buffers (they keep name
 * and shape, hold no data, and any use of one is refused naming it), and
 * updates only its own: nothing moves after a step. Where the whole model
 * is needed it is brought: a checkpoint gathers every stage's parameters
 * and buffers to rank 0 (the strategy's state dict, into copies there)
 * and every stage's optimizer state by parameter name, so the one
 * consolidated file resumes here bitwise and in single or ddp; validation,
 * test and predict run forward-only through the stages (eval_forward), and
 * the end of fit (and an evaluation of a module whose steps run its net
 * directly) gives the dropped tensors storage again and broadcasts the
 * blocks to every rank (lk_strategy_sync_model), which then runs the whole
 * model as single does, until the next step drops them again. Every rank
 * still builds the whole model before the cut (single's bits: one seeded
 * stream over the whole model). On GPUs the messages move over nccl, each
 * COMM action one NCCL group (pipe_run.c).
 *
 * The split: by parameter count (the default: known before anything runs,
 * the same on every machine), named blocks, or by measured time (a profile
 * of each block on rank 0's first batch, broadcast, then the contiguous
 * split whose slowest stage is fastest; Sequential blocks are cut inside
 * for finer cut points). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "lockstep/autograd.h"
#include "lockstep/pipeline.h"
#include "optim/optim_impl.h" /* lk__optimizer_state_get_ex: the state by parameter name */
#include "strategy/strategy_impl.h"
#include "tensor/tensor_impl.h" /* lk__tensor_drop_storage: the other stages' tensors given back */

typedef struct pipe_self {
    bool mp;                 /* model_parallel: one micro-batch */
    int chunks;
    char schedule[32];
    char split[512];
    bool by_time;            /* trainer.pipeline.split time: the split waits for profile_blocks */
    int p;                   /* stages: the pipeline group's ranks */
    int v;                   /* the model's stages per rank (interleaved_1f1b: rank k holds stages k, k + p, ...) */
    int nst;                 /* the model's stages, p * v (one per rank but interleaved) */
    int stage;               /* this rank's (in the pipeline group) */
    int dp;                  /* replicas of each stage (the world / p) */
    lk_comm_mesh_2d mesh;    /* dp > 1: the stage's replicas (dp) and this replica's pipeline (pp) */
    lk_comm *pp;             /* the pipeline group: mesh.pp, or the communicator when dp is 1 */
    /* the blocks (descended into a lone Sequential), names owned */
    int nblocks;
    char **bname;
    lk_layer **blayer;
    int *first;              /* [nst + 1] the first block of each of the model's stages, first[nst] = nblocks */
    lk_layer **myblocks;     /* this rank's blocks, its local stages' in order */
    int *mycount;            /* [v] how many of them each local stage runs */
    int nmy;
    lk_named_tensors *stage_params; /* [p] each rank's parameters (its stages') */
    struct owned {
        lk_tensor **t; /* what rank k of the pipeline alone updates (its stages'): its parameters (a tied one at its first holder) and its blocks' buffers */
        int n;
    } *own; /* [p] */
    bool stale;              /* an optimizer step ran since every rank's copy of the whole model was made current */
    /* The other stages' parameters and buffers, whose storage this rank gave
     * back after the cut (lk__tensor_drop_storage): they keep their shapes
     * and names, hold no data, and are made whole again only where the
     * whole model is needed (lk_strategy_sync_model). */
    lk_tensor **dropped;
    char **dropped_name;     /* ... their state-dict names */
    int ndropped;
    bool whole;              /* every dropped tensor has storage again (sync_model), until the next step drops them */
    bool trim;               /* rank 0 received other stages' tensors for a checkpoint: trim the pool at the next step */
    int64_t *held_bytes;     /* [p] each stage's parameters and buffers once the others are dropped */
    int64_t model_bytes;     /* the whole model's (a tied weight once) */
    /* tied parameters (gpt's wte: the embedding's and the head's) held by
     * several stages: each holder's gradient is its blocks' part; the parts
     * are summed over the world before the optimizer step */
    int ntied;
    struct tied {
        lk_tensor *t;
        int first; /* the first stage holding it: its norm is counted there */
    } *tied;
    void *scratch; /* zeros for the ranks that hold no part (in the training device's memory: the holders' is) */
    size_t scratch_bytes;
    lk_pipe_schedule *sched;
    /* the step in flight */
    lk_batch *mb;            /* [chunks] the micro-batches (views of the batch's rows) */
    float *weight;           /* [chunks] a short batch's micro-batch weights (rows_c * m / rows) */
    int64_t full_rows;       /* the first batch's rows: later batches with fewer are an epoch's short last one */
    lk_pipe_schedule *short_sched; /* the schedule for a short batch of fewer rows than chunks (its m) */
    lk_pipe_schedule *fwd_sched;   /* evaluation's forward-only schedule (its m) */
    int eval_m;                    /* ... the micro-batches of the batch in flight */
    bool eval_noted, whole_noted;  /* ... said once on rank 0 (validation's micro-batches; test's whole batches) */
    lk_tensor *eval_out;           /* ... the last stage's outputs, joined (owned until handed over) */
    int64_t steps_run;
    lk_strategy *s;
    /* pipeline x ddp: the stage's flat gradient buffer in buckets of about
     * bucket_cap_mb, cut walking backwards as ddp cuts them; during a sync
     * step's last backward each parameter's grad-ready hook counts its
     * bucket down and complete buckets are all-reduced (average) over the
     * stage's replicas in index order while the backward goes on */
    struct pbucket {
        int64_t offset, count;
        int nparams, ready;
        lk_work *work;
    } *bk;
    int nbk, next_bk;
    struct pslot {
        struct pipe_self *ps;
        int bucket;
        int vstage;      /* the local stage whose blocks hold the parameter */
    } *slots;
    bool *bk_armed;      /* [v] the local stage's last backward of a sync step is running (or ran) */
    lk_status bk_err;    /* the first failure of a launch, returned when the step waits */
} pipe_self;

static lk_status create(lk_strategy *s, bool mp) {
    pipe_self *ps = lk_calloc(1, sizeof *ps);
    if (!ps) return LK_STATUS_OUT_OF_MEMORY;
    s->self = ps;
    ps->s = s;
    ps->mp = mp;
    const char *name = mp ? "model_parallel" : "pipeline";
    ps->p = s->cfg.pipe_stages > 0 ? s->cfg.pipe_stages : s->world;
    if (ps->p > s->world || s->world % ps->p)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: trainer.pipeline.stages = %d does not divide the %d "
                        "devices (devices = stages x replicas: use a divisor of %d, or 0 for one stage per device)",
                        name, ps->p, s->world, s->world);
    ps->dp = s->world / ps->p;
    if (mp && s->cfg.pipe_chunks > 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy model_parallel runs one micro-batch, but "
                        "trainer.pipeline.chunks is %d (use strategy pipeline)", s->cfg.pipe_chunks);
    ps->chunks = mp ? 1 : s->cfg.pipe_chunks > 0 ? s->cfg.pipe_chunks : 4;
    snprintf(ps->schedule, sizeof ps->schedule, "%s", s->cfg.pipe_schedule && *s->cfg.pipe_schedule ? s->cfg.pipe_schedule : "1f1b");
    bool interleaved = !strcmp(ps->schedule, "interleaved_1f1b");
    ps->v = s->cfg.pipe_virtual_stages > 0 ? s->cfg.pipe_virtual_stages : interleaved ? 2 : 1;
    if (ps->v > 1 && !interleaved)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: trainer.pipeline.virtual_stages = %d needs schedule "
                        "interleaved_1f1b (schedule %s runs one stage per rank)", name, ps->v, ps->schedule);
    if (mp && interleaved)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy model_parallel runs one micro-batch, one stage per "
                        "process: schedule interleaved_1f1b needs strategy pipeline");
    if (interleaved && ps->p > 1 && ps->chunks % ps->p)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: schedule interleaved_1f1b needs trainer.pipeline.chunks "
                        "to be a multiple of the %d stages' ranks (Megatron-LM's rule: the micro-batches pass in "
                        "groups of one per rank), got %d", name, ps->p, ps->chunks);
    if (interleaved && ps->p < 2)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: schedule interleaved_1f1b needs at least 2 stages' "
                        "ranks (devices / replicas), got %d", name, ps->p);
    ps->nst = ps->p * ps->v;
    snprintf(ps->split, sizeof ps->split, "%s", s->cfg.pipe_split ? s->cfg.pipe_split : "");
    ps->by_time = !strcmp(ps->split, "time"); /* known before the blocks: a run materialises a deferred model whole */
    if (ps->chunks < 1 || ps->chunks > 65536)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: trainer.pipeline.chunks must be 1..65536, got %d", name,
                        ps->chunks);
    if (s->world > 1 && !s->comm) return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s needs a communicator", name);
    lk_status st = lk_pipe_schedule_make_virtual(ps->schedule, ps->p, ps->v, ps->chunks, &ps->sched);
    if (st) return lk_error(st, "strategy %s: trainer.pipeline.schedule: %s", name, lk_last_error());
    LK_TRY(lk_pipe_schedule_check(ps->sched, NULL));
    /* stages x replicas: the groups made here, on every rank alike (create is collective) */
    ps->pp = s->comm;
    if (ps->dp > 1) {
        st = lk_comm_mesh_2d_create(s->comm, ps->dp, ps->p, &ps->mesh);
        if (st) return lk_error(st, "strategy %s: the %d x %d mesh of stages x replicas: %s", name, ps->p, ps->dp,
                                lk_last_error());
        ps->pp = ps->mesh.pp;
    }
    ps->stage = ps->pp ? lk_comm_rank(ps->pp) : 0;
    return LK_STATUS_OK;
}

static void pipe_free(lk_strategy *s);

/* strategy.c frees the head alone when create fails: the state goes here */
static lk_status create_mp(lk_strategy *s) {
    lk_status st = create(s, true);
    if (st) pipe_free(s);
    return st;
}
static lk_status create_pipe(lk_strategy *s) {
    lk_status st = create(s, false);
    if (st) pipe_free(s);
    return st;
}

static void pipe_free(lk_strategy *s) {
    pipe_self *ps = s->self;
    if (!ps) return;
    for (int i = 0; i < ps->nblocks && ps->bname; i++) lk_free(ps->bname[i]);
    lk_free(ps->bname);
    lk_free(ps->blayer);
    lk_free(ps->first);
    lk_free(ps->myblocks);
    lk_free(ps->mycount);
    lk_free(ps->bk_armed);
    for (int k = 0; ps->stage_params && k < ps->p; k++) lk_named_tensors_clear(&ps->stage_params[k]);
    lk_free(ps->stage_params);
    for (int k = 0; ps->own && k < ps->p; k++) lk_free(ps->own[k].t);
    lk_free(ps->own);
    for (int i = 0; i < ps->ndropped; i++) lk_free(ps->dropped_name[i]);
    lk_free(ps->dropped);
    lk_free(ps->dropped_name);
    lk_free(ps->held_bytes);
    lk_comm_mesh_2d_free(&ps->mesh);
    lk_pipe_schedule_free(ps->sched);
    lk_pipe_schedule_free(ps->short_sched);
    lk_pipe_schedule_free(ps->fwd_sched);
    lk_tensor_release(ps->eval_out);
    lk_free(ps->mb);
    lk_free(ps->weight);
    lk_free(ps->tied);
    for (int b = 0; b < ps->nbk; b++) lk_work_free(ps->bk[b].work);
    lk_free(ps->bk);
    lk_free(ps->slots);
    if (ps->scratch && lk_device_is_host(s->cfg.device)) lk_free(ps->scratch);
    else if (ps->scratch) lk_device_free(s->cfg.device, ps->scratch, ps->scratch_bytes);
    lk_free(ps);
    s->self = NULL;
}

static char *dup_name(const char *a, const char *b) {
    size_t n = strlen(a) + (b ? strlen(b) + 1 : 0) + 1;
    char *r = lk_malloc(n);
    if (r) snprintf(r, n, b ? "%s.%s" : "%s", a, b ? b : "");
    return r;
}

/* The stages' boundaries balanced by parameter count: stage k's first block
 * is the one whose prefix sum comes nearest k/p of the total, leaving at
 * least one block to each stage. */
static void split_balanced(pipe_self *ps, const int64_t *np) {
    int64_t total = 0;
    for (int i = 0; i < ps->nblocks; i++) total += np[i];
    ps->first[0] = 0;
    for (int k = 1; k < ps->nst; k++) {
        double target = (double)total * k / ps->nst;
        int lo = ps->first[k - 1] + 1, hi = ps->nblocks - (ps->nst - k), best = lo;
        double best_d = INFINITY;
        int64_t pre = 0;
        for (int i = 0; i < lo; i++) pre += np[i];
        for (int i = lo; i <= hi; i++) {
            double d = fabs((double)pre - target);
            if (d < best_d) best_d = d, best = i;
            pre += np[i];
        }
        ps->first[k] = best;
    }
    ps->first[ps->nst] = ps->nblocks;
}

static lk_status split_named(pipe_self *ps, const char *name) {
    char buf[512], list[1024];
    snprintf(buf, sizeof buf, "%s", ps->split);
    size_t len = 0;
    list[0] = 0;
    for (int i = 0; i < ps->nblocks && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", ps->bname[i]);
    int k = 1;
    ps->first[0] = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        int at = -1;
        for (int i = 0; i < ps->nblocks; i++)
            if (!strcmp(ps->bname[i], tok)) at = i;
        if (at < 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: trainer.pipeline.split names '%s', which is no "
                            "block of the model (its blocks: %s)", name, tok, list);
        if (k >= ps->nst)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: trainer.pipeline.split '%s' names %s first blocks "
                            "for %d stages (expected %d: each stage's first block after the first stage's)",
                            name, ps->split, "more", ps->nst, ps->nst - 1);
        if (at <= ps->first[k - 1])
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: trainer.pipeline.split: '%s' does not come after "
                            "the previous stage's first block (blocks in order: %s)", name, tok, list);
        ps->first[k++] = at;
    }
    if (k != ps->nst)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: trainer.pipeline.split '%s' names %d first block%s "
                        "for %d stages (expected %d: each stage's first block after the first stage's)",
                        name, ps->split, k - 1, k - 1 == 1 ? "" : "s", ps->nst, ps->nst - 1);
    ps->first[ps->nst] = ps->nblocks;
    return LK_STATUS_OK;
}

static bool is_seq(const lk_layer *l) { return l->type && !strcmp(l->type, "Sequential") && l->n_children > 1; }

/* Appends block `l` named `name` to the list, or (expand) its children in
 * its place when it is a Sequential, recursively. */
static lk_status add_block(pipe_self *ps, int *cap, const char *name, lk_layer *l, bool expand) {
    if (expand && is_seq(l)) {
        for (int i = 0; i < l->n_children; i++) {
            char *nm = dup_name(name, l->children[i].name);
            if (!nm) return LK_STATUS_OUT_OF_MEMORY;
            lk_status st = add_block(ps, cap, nm, l->children[i].layer, true);
            lk_free(nm);
            LK_TRY(st);
        }
        return LK_STATUS_OK;
    }
    if (ps->nblocks == *cap) {
        int nc = *cap ? 2 * *cap : 16;
        char **nn = lk_realloc(ps->bname, (size_t)nc * sizeof *nn);
        if (!nn) return LK_STATUS_OUT_OF_MEMORY;
        ps->bname = nn;
        lk_layer **nl = lk_realloc(ps->blayer, (size_t)nc * sizeof *nl);
        if (!nl) return LK_STATUS_OUT_OF_MEMORY;
        ps->blayer = nl;
        *cap = nc;
    }
    if (!(ps->bname[ps->nblocks] = dup_name(name, NULL))) return LK_STATUS_OUT_OF_MEMORY;
    ps->blayer[ps->nblocks++] = l;
    return LK_STATUS_OK;
}

/* The split's line on rank 0: each stage's blocks, parameters and (split
 * by time) measured milliseconds. */
static void log_split(lk_strategy *s, const int64_t *np, const double *ms) {
    pipe_self *ps = s->self;
    if (s->rank != 0) return;
    char line[2048];
    const char *how = ps->by_time ? "split by measured time" : ps->split[0] ? "trainer.pipeline.split" : "balanced by parameter count";
    size_t len = (size_t)snprintf(line, sizeof line, "%s: %d stage%s (%s; schedule %s, %d micro-batch%s):", s->vt->name,
                                  ps->nst, ps->nst == 1 ? "" : "s", how, ps->schedule, ps->chunks, ps->chunks == 1 ? "" : "es");
    if (ps->v > 1)
        len -= 1, len += (size_t)snprintf(line + len, sizeof line - len, ", %d per rank (rank k holds stages k, k+%d, ...):",
                                          ps->v, ps->p);
    if (ps->dp > 1) len -= 1, len += (size_t)snprintf(line + len, sizeof line - len, " x %d data-parallel replicas:", ps->dp);
    for (int k = 0; k < ps->nst && len < sizeof line; k++) {
        int64_t c = 0;
        double t = 0;
        for (int i = ps->first[k]; i < ps->first[k + 1]; i++) c += np[i], t += ms ? ms[i] : 0;
        len += (size_t)snprintf(line + len, sizeof line - len, " [%s%s%s: %lld params", ps->bname[ps->first[k]],
                                ps->first[k + 1] - ps->first[k] > 1 ? " .. " : "",
                                ps->first[k + 1] - ps->first[k] > 1 ? ps->bname[ps->first[k + 1] - 1] : "", (long long)c);
        if (len < sizeof line)
            len += (size_t)(ms ? snprintf(line + len, sizeof line - len, ", %.3f ms]", t) : snprintf(line + len, sizeof line - len, "]"));
    }
    lk_log0("%s", line);
}

static lk_status set_blocks(lk_strategy *s, const lk_named_layer *blocks, int n) {
    pipe_self *ps = s->self;
    const char *name = s->vt->name;
    /* trainer.pipeline.split: time (measured, lk_strategy_profile_blocks),
     * parameters (the default, spelled out), or the first block of each
     * stage after the first */
    if (ps->by_time || !strcmp(ps->split, "parameters")) ps->split[0] = 0;
    if (n < 1) return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: the model has no blocks to cut into stages", name);
    /* A lone Sequential block (the mlp's "layers") is cut inside, and so
     * are the Sequential blocks of a model with fewer blocks than stages
     * (the autoencoder's encoder and decoder in 4 interleaved stages: a
     * split then names their children, "encoder.2"). Split by time, every
     * Sequential block is: finer cut points let the measured times
     * balance; otherwise the cuts stay the model's own blocks, as they
     * always were. */
    int cap = 0;
    lk_status st = LK_STATUS_OK;
    bool lone = n == 1 && ps->nst > 1 && is_seq(blocks[0].layer);
    bool few = n < ps->nst;
    for (int i = 0; i < n && !st; i++) {
        if ((lone || few) && !ps->by_time && is_seq(blocks[i].layer))
            for (int j = 0; j < blocks[i].layer->n_children && !st; j++) {
                char *nm = dup_name(blocks[i].name, blocks[i].layer->children[j].name);
                st = nm ? add_block(ps, &cap, nm, blocks[i].layer->children[j].layer, false) : LK_STATUS_OUT_OF_MEMORY;
                lk_free(nm);
            }
        else st = add_block(ps, &cap, blocks[i].name, blocks[i].layer, ps->by_time);
    }
    LK_TRY(st);
    n = ps->nblocks;
    if (ps->nst > n && ps->v > 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: %d stages (%d ranks x trainer.pipeline.virtual_stages "
                        "%d) but the model has only %d block%s to cut: use fewer", name, ps->nst, ps->p, ps->v, n,
                        n == 1 ? "" : "s");
    if (ps->p > n && ps->dp == 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: %d stages (one per process) but the model has only %d "
                        "block%s to cut: use at most %d devices", name, ps->p, n, n == 1 ? "" : "s", n);
    if (ps->p > n)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: %d stages (trainer.pipeline.stages) but the model has "
                        "only %d block%s to cut: use at most %d stage%s", name, ps->p, n, n == 1 ? "" : "s", n,
                        n == 1 ? "" : "s");
    ps->first = lk_calloc((size_t)ps->nst + 1, sizeof *ps->first);
    ps->stage_params = lk_calloc((size_t)ps->p, sizeof *ps->stage_params);
    int64_t *np = lk_calloc((size_t)n, sizeof *np);
    st = ps->first && ps->stage_params && np ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < n && !st; i++) np[i] = lk_layer_num_parameters(ps->blayer[i]);
    if (!st) {
        if (ps->split[0]) st = split_named(ps, name);
        else split_balanced(ps, np); /* by time: until the profile, which replaces it */
    }
    if (!st && !ps->by_time) log_split(s, np, NULL);
    lk_free(np);
    return st;
}

/* The contiguous split of blocks with times t[0..n) into p stages whose
 * slowest stage is the fastest possible (dynamic programming over the
 * prefix sums: best[k][j] the slowest of the first j blocks in k stages). */
static lk_status split_by_time(pipe_self *ps, const double *t) {
    int n = ps->nblocks, p = ps->nst;
    double *pre = lk_calloc((size_t)n + 1, sizeof *pre), *best = lk_calloc((size_t)(p + 1) * (size_t)(n + 1), sizeof *best);
    int *cut = lk_calloc((size_t)(p + 1) * (size_t)(n + 1), sizeof *cut);
    if (!pre || !best || !cut) {
        lk_free(pre), lk_free(best), lk_free(cut);
        return LK_STATUS_OUT_OF_MEMORY;
    }
#define B(k, j) best[(size_t)(k) * (size_t)(n + 1) + (size_t)(j)]
#define C(k, j) cut[(size_t)(k) * (size_t)(n + 1) + (size_t)(j)]
    for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + t[i];
    for (int j = 0; j <= n; j++) B(1, j) = pre[j];
    for (int k = 2; k <= p; k++)
        for (int j = k; j <= n; j++) {
            B(k, j) = INFINITY;
            for (int i = k - 1; i < j; i++) { /* the last stage is blocks [i, j) */
                double v = fmax(B(k - 1, i), pre[j] - pre[i]);
                if (v < B(k, j)) B(k, j) = v, C(k, j) = i;
            }
        }
    ps->first[p] = n;
    for (int k = p, j = n; k >= 2; k--) j = ps->first[k - 1] = C(k, j);
    ps->first[0] = 0;
#undef B
#undef C
    lk_free(pre), lk_free(best), lk_free(cut);
    return LK_STATUS_OK;
}

static bool materializes(const lk_strategy *s) { return !((const pipe_self *)s->self)->by_time; }

static bool wants_profile(const lk_strategy *s) {
    const pipe_self *ps = s->self;
    return ps->by_time && !s->wrapped;
}

/* One forward and backward of block b on a copy of *h (a leaf, so the
 * time is the block's alone), timed; *h becomes the block's output. The
 * input's gradient is computed as a stage computes it: for every block
 * but the first (the batch itself needs none). */
static lk_status time_block(lk_layer *b, lk_tensor **h, bool first, double *sec) {
    enum { REPEATS = 5 }; /* after one warm-up: the least of five (a shared machine's noise only adds) */
    double least = INFINITY;
    lk_tensor *next = NULL;
    lk_status st = LK_STATUS_OK;
    for (int r = 0; r <= REPEATS && !st; r++) {
        lk_scope_begin();
        lk_tensor *in = lk_tensor_clone(*h);
        if (!in) st = lk_last_status();
        bool fl = in && (in->dtype == LK_F32 || in->dtype == LK_BF16 || in->dtype == LK_F16);
        if (fl && !first) in->requires_grad = true;
        double t0 = lk_time_now();
        lk_tensor *out = st ? NULL : lk_layer_forward(b, in);
        lk_tensor *g = out ? lk_tensor_full(out->dtype, out->ndim, out->shape, 1.0) : NULL;
        if (!st && (!out || !g)) st = lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
        if (!st && out->requires_grad) st = lk_backward_with(out, g);
        double t1 = lk_time_now();
        if (!st && r > 0) least = fmin(least, t1 - t0);
        if (!st && r == REPEATS && !(next = lk_tensor_clone(out))) st = lk_last_status();
        lk_tensor_release(g);
        lk_tensor_release(in);
        lk_scope_end();
        lk_layer_zero_grad(b, true);
    }
    if (st) return st;
    lk_tensor_release(*h);
    *h = next;
    *sec = least;
    return LK_STATUS_OK;
}

static lk_status profile_blocks(lk_strategy *s, lk_tensor *x) {
    pipe_self *ps = s->self;
    int n = ps->nblocks;
    double *t = lk_calloc((size_t)n, sizeof *t);
    int64_t *np = lk_calloc((size_t)n, sizeof *np);
    if (!t || !np) {
        lk_free(t), lk_free(np);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    lk_status st = LK_STATUS_OK;
    if (s->rank == 0) {
        /* the rows one micro-batch has: what each stage runs at a time */
        int64_t rows = x->ndim ? x->shape[0] : 1, mrows = rows / ps->chunks > 0 ? rows / ps->chunks : 1;
        bool grad = lk_set_grad_enabled(true);
        lk_scope_begin();
        lk_tensor *v = x->ndim && mrows < rows ? lk_slice(x, 0, 0, mrows) : x;
        lk_tensor *h = v ? lk_tensor_clone(v) : NULL;
        lk_scope_end();
        if (!h) st = lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
        /* eval mode: batch norm's running statistics and dropout's draws stay as they were */
        for (int i = 0; i < n; i++) lk_layer_train(ps->blayer[i], false);
        for (int i = 0; i < n && !st; i++) {
            st = time_block(ps->blayer[i], &h, i == 0, &t[i]);
            if (st) st = lk_error(st, "strategy %s: trainer.pipeline.split time: profiling block %s: %s", s->vt->name,
                                  ps->bname[i], lk_last_error());
        }
        for (int i = 0; i < n; i++) lk_layer_train(ps->blayer[i], true);
        lk_set_grad_enabled(grad);
        lk_tensor_release(h);
    }
    /* rank 0's failure reaches every rank as a NaN time, so none waits */
    if (st && s->rank == 0) t[0] = NAN;
    lk_status bs = s->world > 1 ? lk_comm_broadcast(s->comm, t, (size_t)n, LK_F64, 0) : LK_STATUS_OK;
    if (!st) st = bs;
    if (!st && isnan(t[0]))
        st = lk_error(LK_STATUS_REMOTE, "strategy %s: trainer.pipeline.split time: rank 0 failed to profile the blocks",
                      s->vt->name);
    for (int i = 0; i < n && !st; i++) t[i] *= 1e3, np[i] = lk_layer_num_parameters(ps->blayer[i]);
    if (!st) st = split_by_time(ps, t);
    if (!st) log_split(s, np, t);
    if (!st) ps->by_time = false; /* done: wrap takes this split */
    lk_free(t), lk_free(np);
    return st;
}

/* The rank holding block i: the model's stage j is rank j % p's. */
static int rank_of_block(const pipe_self *ps, int i) {
    int j = 0;
    while (j + 1 < ps->nst && ps->first[j + 1] <= i) j++;
    return j % ps->p;
}

/* Rank k's parameters, named as the network names them (the same tensors). */
static lk_status stage_params(pipe_self *ps, const lk_named_tensors *all) {
    for (int k = 0; k < ps->p; k++) {
        lk_named_tensors mine = {0};
        for (int i = 0; i < ps->nblocks; i++)
            if (rank_of_block(ps, i) == k) LK_TRY(lk_layer_named_parameters(ps->blayer[i], &mine));
        for (int j = 0; j < all->n; j++) {
            bool in = false;
            for (int q = 0; q < mine.n && !in; q++) in = mine.items[q].tensor == all->items[j].tensor;
            if (!in) continue;
            lk_status st = LK_STATUS_OK;
            for (int o = 0; o < k && !st; o++)
                if (lk_named_tensors_find(&ps->stage_params[o], all->items[j].name)) {
                    bool known = false;
                    for (int q = 0; q < ps->ntied; q++) known |= ps->tied[q].t == all->items[j].tensor;
                    if (known) break;
                    struct tied *nt = lk_realloc(ps->tied, (size_t)(ps->ntied + 1) * sizeof *nt);
                    if (!nt) st = LK_STATUS_OUT_OF_MEMORY;
                    else ps->tied = nt, ps->tied[ps->ntied++] = (struct tied){all->items[j].tensor, o};
                    break;
                }
            if (!st) st = lk_named_tensors_append(&ps->stage_params[k], all->items[j].name, all->items[j].tensor);
            if (st) {
                lk_named_tensors_clear(&mine);
                return st;
            }
        }
        lk_named_tensors_clear(&mine);
    }
    return LK_STATUS_OK;
}

/* What each pipeline rank alone updates (its stages'): its parameters (a tied one counted at its
 * first holder, whose copy every holder matches) and its blocks' buffers. */
static lk_status owned_lists(pipe_self *ps) {
    if (!(ps->own = lk_calloc((size_t)ps->p, sizeof *ps->own))) return LK_STATUS_OUT_OF_MEMORY;
    for (int k = 0; k < ps->p; k++) {
        lk_named_tensors bufs = {0};
        lk_status st = LK_STATUS_OK;
        for (int i = 0; i < ps->nblocks && !st; i++)
            if (rank_of_block(ps, i) == k) st = lk_layer_named_buffers(ps->blayer[i], &bufs);
        struct owned *o = &ps->own[k];
        o->t = st ? NULL : lk_calloc((size_t)(ps->stage_params[k].n + bufs.n) + 1, sizeof *o->t);
        if (!st && !o->t) st = LK_STATUS_OUT_OF_MEMORY;
        for (int j = 0; !st && j < ps->stage_params[k].n; j++) {
            lk_tensor *t = ps->stage_params[k].items[j].tensor;
            bool other = false;
            for (int q = 0; q < ps->ntied; q++) other |= ps->tied[q].t == t && ps->tied[q].first != k;
            if (!other) o->t[o->n++] = t;
        }
        for (int j = 0; !st && j < bufs.n; j++) o->t[o->n++] = bufs.items[j].tensor;
        lk_named_tensors_clear(&bufs);
        LK_TRY(st);
    }
    return LK_STATUS_OK;
}

/* Every rank gets every stage's tensors, from the stage's first replica
 * (world rank k * dp; its replicas hold the same values). Every rank holds
 * the whole model here (before the drop, or made whole by sync_model). */
static lk_status sync_params(lk_strategy *s) {
    pipe_self *ps = s->self;
    if (s->world == 1) return LK_STATUS_OK;
    for (int k = 0; k < ps->p; k++)
        for (int j = 0; j < ps->own[k].n; j++) {
            lk_tensor *t = ps->own[k].t[j];
            LK_TRY(lk_comm_broadcast(s->comm, t->data, (size_t)t->numel, t->dtype, k * ps->dp));
        }
    ps->stale = false;
    return LK_STATUS_OK;
}

/* Rank 0 gets every stage's tensors into its state dict `out` (for the one
 * consolidated checkpoint it writes): point-to-point from each stage's
 * first replica, the others idle. A tensor rank 0 holds no data for is
 * received into a new one that takes its place in `out` (every entry
 * naming it: a tied weight has two), so the other stages' blocks are
 * resident on rank 0 only for the checkpoint's life. */
static lk_status gather_params(lk_strategy *s, lk_named_tensors *out) {
    pipe_self *ps = s->self;
    for (int k = 1; k < ps->p; k++) {
        int src = k * ps->dp;
        if (s->rank != src && s->rank != 0) continue;
        for (int j = 0; j < ps->own[k].n; j++) {
            lk_tensor *t = ps->own[k].t[j];
            if (s->rank == src) {
                LK_TRY(lk_comm_send(s->comm, t->data, (size_t)t->numel, t->dtype, 0));
                continue;
            }
            lk_tensor *into = t;
            if (!lk_tensor_has_data(t)) {
                into = lk__tensor_new_on(t->device, t->dtype, t->ndim, t->shape);
                if (!into) return lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
                ps->trim = true;
            }
            lk_status st = lk_comm_recv(s->comm, into->data, (size_t)into->numel, into->dtype, src);
            for (int i = 0; !st && into != t && i < out->n; i++)
                if (out->items[i].tensor == t) {
                    lk_tensor_release(t);
                    out->items[i].tensor = lk_tensor_retain(into);
                }
            if (into != t) lk_tensor_release(into);
            LK_TRY(st);
        }
    }
    return LK_STATUS_OK; /* the others' copies stay stale: ps->stale unchanged */
}

/* The other stages' tensors given back (after the cut, and after each step
 * that follows a sync_model): they keep shape and name, hold no data. */
static lk_status drop_others(lk_strategy *s) {
    pipe_self *ps = s->self;
    for (int i = 0; i < ps->ndropped; i++) {
        char why[384];
        snprintf(why, sizeof why, "'%s' belongs to another pipeline stage than this rank's (stage %d of %d): "
                 "strategy %s gave back its storage after the cut (lk_strategy_sync_model makes the whole model "
                 "current on every rank)", ps->dropped_name[i], ps->stage, ps->p, s->vt->name);
        LK_TRY(lk__tensor_drop_storage(ps->dropped[i], why));
    }
    ps->whole = ps->ndropped == 0;
    ps->trim = false;
    if (ps->ndropped) lk_pool_trim(); /* the storage pool's cached blocks count as live: given back to the system */
    return LK_STATUS_OK;
}

/* The whole model before it runs whole (a C module's evaluation, the end
 * of fit): the dropped tensors get storage again, then every stage's
 * values go to every rank. The next optimizer step drops them again. */
static lk_status sync_model(lk_strategy *s) {
    pipe_self *ps = s->self;
    if (!ps->whole) {
        for (int i = 0; i < ps->ndropped; i++) {
            lk_status st = lk__tensor_restore_storage(ps->dropped[i]);
            if (st) return lk_error(st, "strategy %s: making the whole model current on stage %d: room for '%s': %s",
                                    s->vt->name, ps->stage, ps->dropped_name[i], lk_last_error());
        }
        ps->whole = true;
        ps->stale = s->world > 1;
    }
    return ps->stale ? sync_params(s) : LK_STATUS_OK;
}

/* The checkpoint's state dict: rank 0's (the writer's) holds every stage's
 * current values; another rank's entries of the tensors it dropped hold no
 * data (only rank 0 writes). */
static lk_status state_dict(lk_strategy *s, lk_layer *net, lk_named_tensors *out) {
    pipe_self *ps = s->self;
    LK_TRY(lk_state_dict_get(net, out));
    if (ps->own && (ps->stale || !ps->whole) && s->world > 1) LK_TRY(gather_params(s, out));
    return LK_STATUS_OK;
}

/* Whether tensor t (of the state dict) stays on stage k: it is in none of
 * the other stages' lists, or stage k uses it too (a tied weight). */
static bool stays_on(const pipe_self *ps, int k, const lk_tensor *t) {
    for (int q = 0; q < ps->stage_params[k].n; q++)
        if (ps->stage_params[k].items[q].tensor == t) return true;
    for (int o = 0; o < ps->p; o++)
        for (int j = 0; o != k && j < ps->own[o].n; j++)
            if (ps->own[o].t[j] == t) return false;
    return true;
}

/* The tensors this rank gives back (the ones that do not stay on its
 * stage) with their names, and each stage's bytes once they are gone. */
static lk_status list_dropped(lk_strategy *s, lk_layer *net) {
    pipe_self *ps = s->self;
    lk_named_tensors sd = {0};
    LK_TRY(lk_state_dict_get(net, &sd));
    ps->held_bytes = lk_calloc((size_t)ps->p, sizeof *ps->held_bytes);
    ps->dropped = lk_calloc((size_t)sd.n + 1, sizeof *ps->dropped);
    ps->dropped_name = lk_calloc((size_t)sd.n + 1, sizeof *ps->dropped_name);
    lk_status st = ps->held_bytes && ps->dropped && ps->dropped_name ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < sd.n && !st; i++) {
        lk_tensor *t = sd.items[i].tensor;
        bool seen = false; /* a tied weight: one tensor, two names */
        for (int q = 0; q < i && !seen; q++) seen = sd.items[q].tensor == t;
        if (seen) continue;
        int64_t b = (int64_t)lk_tensor_nbytes(t);
        ps->model_bytes += b;
        for (int k = 0; k < ps->p; k++)
            if (stays_on(ps, k, t)) ps->held_bytes[k] += b;
        if (stays_on(ps, ps->stage, t)) continue;
        if (!(ps->dropped_name[ps->ndropped] = dup_name(sd.items[i].name, NULL))) st = LK_STATUS_OUT_OF_MEMORY;
        else ps->dropped[ps->ndropped++] = t;
    }
    lk_named_tensors_clear(&sd);
    return st;
}

/* The memory report's parameters: what this rank holds while it trains,
 * its stage's (a tied weight on each stage using it). Its blocks' buffers
 * are in held_bytes too; the report's gradients and optimizer state are the
 * stage's already (the flat buffer and the optimizer hold no more). */
static void memory(const lk_strategy *s, lk_strategy_memory *m) {
    const pipe_self *ps = s->self;
    if (ps->held_bytes) m->param_bytes = ps->held_bytes[ps->stage];
}

/* ---- pipeline x ddp: the replicas' all-reduce in buckets ---------------------- */

/* Starts the complete buckets in index order (every replica the same
 * collectives in the same order). */
static void launch_buckets(pipe_self *ps) {
    lk_strategy *s = ps->s;
    while (ps->next_bk < ps->nbk && ps->bk[ps->next_bk].ready >= ps->bk[ps->next_bk].nparams) {
        struct pbucket *b = &ps->bk[ps->next_bk++];
        void *buf = (char *)s->flat_grad + (size_t)b->offset * lk_dtype_size(s->cfg.param_dtype);
        lk_status st = lk_comm_all_reduce_async(ps->mesh.dp, buf, (size_t)b->count, s->cfg.param_dtype, LK_REDUCE_AVG,
                                                &b->work);
        s->stats.allreduce_calls++;
        s->stats.bytes_reduced += (uint64_t)b->count * lk_dtype_size(s->cfg.param_dtype);
        if (st && !ps->bk_err) ps->bk_err = st;
    }
}

static void on_grad_ready(lk_tensor *p, void *ctx) {
    (void)p;
    struct pslot *slot = ctx;
    pipe_self *ps = slot->ps;
    if (!ps->bk_armed[slot->vstage]) return; /* an earlier micro-batch's backward: its gradients are not final */
    ps->bk[slot->bucket].ready++;
    launch_buckets(ps);
}

static void stage_before_backward(void *ctx, int chunk, int vstage, bool last) {
    (void)chunk;
    pipe_self *ps = ctx;
    if (last) ps->bk_armed[vstage] = true;
}

/* vs[i]: the local stage whose blocks hold local parameter i (all 0 with
 * one stage per rank), in one walk over this rank's blocks. */
static lk_status local_stages(const lk_strategy *s, int *vs) {
    const pipe_self *ps = s->self;
    for (int j = 0, b = 0; ps->v > 1 && j < ps->v; j++)
        for (int end = b + ps->mycount[j]; b < end; b++) {
            lk_named_tensors l = {0};
            LK_TRY(lk_layer_named_parameters(ps->myblocks[b], &l));
            for (int q = 0; q < l.n; q++)
                for (int i = 0; i < s->local.n; i++)
                    if (s->local_arr[i] == l.items[q].tensor) vs[i] = j;
            lk_named_tensors_clear(&l);
        }
    return LK_STATUS_OK;
}

/* The flat gradient buffer packs this stage's parameters in registration
 * order (lk_strategy_setup); buckets are cut walking backwards, the order
 * the backward finishes them, so each is one contiguous range. */
static lk_status buckets_setup(lk_strategy *s) {
    pipe_self *ps = s->self;
    int n = s->local.n;
    ps->bk = lk_calloc((size_t)(n ? n : 1), sizeof *ps->bk);
    ps->slots = lk_calloc((size_t)(n ? n : 1), sizeof *ps->slots);
    int *vs = lk_calloc((size_t)(n ? n : 1), sizeof *vs);
    lk_status st = ps->bk && ps->slots && vs ? local_stages(s, vs) : LK_STATUS_OUT_OF_MEMORY;
    if (st) {
        lk_free(vs);
        return st;
    }
    int64_t cap = (int64_t)(s->ddp.bucket_cap_mb * 1024 * 1024 / (double)lk_dtype_size(s->cfg.param_dtype));
    if (cap < 1) cap = 1;
    int64_t off = s->flat_numel;
    for (int i = n - 1; i >= 0; i--) {
        lk_tensor *p = s->local_arr[i];
        off -= p->numel;
        if (ps->nbk == 0 || ps->bk[ps->nbk - 1].count >= cap) ps->bk[ps->nbk++] = (struct pbucket){0};
        struct pbucket *b = &ps->bk[ps->nbk - 1];
        b->offset = off;
        b->count += p->numel;
        b->nparams++;
        ps->slots[i] = (struct pslot){ps, ps->nbk - 1, vs[i]};
        lk_tensor_set_grad_hook(p, on_grad_ready, &ps->slots[i]);
    }
    lk_free(vs);
    if (off != 0)
        return lk_error(LK_STATUS_INTERNAL, "strategy %s: the stage's parameters hold %lld of its %lld gradient "
                        "elements", s->vt->name, (long long)(s->flat_numel - off), (long long)s->flat_numel);
    s->stats.buckets = ps->nbk;
    lk_log0("%s: each stage's replicas average its gradients in buckets (stage 0: %d of up to %g MB, "
            "trainer.bucket_cap_mb), each started as the last micro-batch's backward completes it", s->vt->name,
            ps->nbk, s->ddp.bucket_cap_mb);
    return LK_STATUS_OK;
}

/* After the schedule: the buckets no hook completed (parameters the step
 * did not reach, or a failed run) started in order, then every one waited
 * for; the averages are then in the flat buffer. On a failure (rc) only
 * what was started is waited for, so nothing is left in flight. */
static lk_status buckets_finish(pipe_self *ps, lk_status rc) {
    if (!rc) {
        for (int b = ps->next_bk; b < ps->nbk; b++) ps->bk[b].ready = ps->bk[b].nparams;
        launch_buckets(ps);
    }
    lk_status st = ps->bk_err;
    for (int b = 0; b < ps->nbk; b++) {
        if (!ps->bk[b].work) continue;
        lk_status sb = lk_work_wait(ps->bk[b].work);
        if (!st) st = sb;
        lk_work_free(ps->bk[b].work);
        ps->bk[b].work = NULL;
    }
    for (int b = 0; b < ps->nbk; b++) ps->bk[b].ready = 0;
    ps->next_bk = 0;
    for (int j = 0; j < ps->v; j++) ps->bk_armed[j] = false;
    ps->bk_err = LK_STATUS_OK;
    return rc ? rc : st;
}

static lk_status wrap(lk_strategy *s, lk_layer *net) {
    pipe_self *ps = s->self;
    if (!ps->first)
        return lk_error(LK_STATUS_INVALID_USAGE, "strategy %s: the model's blocks were not given before wrap "
                        "(lk_strategy_set_blocks)", s->vt->name);
    if (ps->by_time) { /* a C caller that gave no batch to profile */
        lk_warn0("strategy %s: trainer.pipeline.split time, but no batch was profiled (lk_strategy_profile_blocks): "
                 "the stages are balanced by parameter count", s->vt->name);
        ps->by_time = false;
    }
    lk_named_tensors all = {0};
    LK_TRY(lk_layer_named_parameters(net, &all));
    lk_status st = stage_params(ps, &all);
    lk_named_tensors_clear(&all);
    LK_TRY(st);
    /* the parameters no block holds (none in the models lockstep builds) would never train */
    LK_TRY(lk_layer_named_parameters(net, &all));
    int64_t held = -ps->ntied; /* a tied parameter counts once */
    for (int k = 0; k < ps->p; k++) held += ps->stage_params[k].n;
    int nall = all.n;
    lk_named_tensors_clear(&all);
    if (held != nall)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: %lld of the model's %d parameters are in no block",
                        s->vt->name, (long long)(nall - held), nall);
    /* A stage of parameter-free blocks (a lone ReLU) would have nothing to
     * optimise: say so here rather than through its optimizer's refusal. */
    for (int k = 0; k < ps->p; k++)
        if (!ps->stage_params[k].n && ps->v > 1)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: rank %d's %d stages of %d hold no parameters: "
                            "every rank needs a block with parameters; move trainer.pipeline.split or use fewer "
                            "trainer.pipeline.virtual_stages", s->vt->name, k, ps->v, ps->nst);
        else if (!ps->stage_params[k].n)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: stage %d of %d (%s%s%s) holds no parameters: "
                            "every stage needs a block with parameters; move trainer.pipeline.split or use fewer "
                            "stages (trainer.pipeline.stages, or devices)", s->vt->name, k, ps->p,
                            ps->bname[ps->first[k]], ps->first[k + 1] - ps->first[k] > 1 ? " .. " : "",
                            ps->first[k + 1] - ps->first[k] > 1 ? ps->bname[ps->first[k + 1] - 1] : "");
    LK_TRY(owned_lists(ps));
    /* this rank's blocks, local stage by local stage (what lk_pipe_run runs) */
    ps->myblocks = lk_calloc((size_t)ps->nblocks, sizeof *ps->myblocks);
    ps->mycount = lk_calloc((size_t)ps->v, sizeof *ps->mycount);
    ps->bk_armed = lk_calloc((size_t)ps->v, sizeof *ps->bk_armed);
    if (!ps->myblocks || !ps->mycount || !ps->bk_armed) return LK_STATUS_OUT_OF_MEMORY;
    for (int j = 0; j < ps->v; j++) {
        int g = j * ps->p + ps->stage;
        for (int i = ps->first[g]; i < ps->first[g + 1]; i++) ps->myblocks[ps->nmy++] = ps->blayer[i];
        ps->mycount[j] = ps->first[g + 1] - ps->first[g];
    }
    const lk_named_tensors *mine = &ps->stage_params[ps->stage];
    for (int j = 0; j < mine->n; j++) LK_TRY(lk_named_tensors_append(&s->local, mine->items[j].name, mine->items[j].tensor));
    LK_TRY(list_dropped(s, net));
    /* the buffers this rank keeps: its blocks' and any in no block */
    lk_named_tensors bufs = {0};
    lk_status bst = lk_layer_named_buffers(net, &bufs);
    for (int i = 0; i < bufs.n && !bst; i++)
        if (stays_on(ps, ps->stage, bufs.items[i].tensor))
            bst = lk_named_tensors_append(&s->local_buffers, bufs.items[i].name, bufs.items[i].tensor);
    lk_named_tensors_clear(&bufs);
    LK_TRY(bst);
    int np = s->local.n, nb = s->local_buffers.n;
    s->local_arr = lk_calloc((size_t)np + 1, sizeof *s->local_arr);
    s->local_names = lk_calloc((size_t)np + 1, sizeof *s->local_names);
    s->buffer_arr = lk_calloc((size_t)nb + 1, sizeof *s->buffer_arr);
    if (!s->local_arr || !s->local_names || !s->buffer_arr) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < np; i++) {
        s->local_arr[i] = s->local.items[i].tensor;
        s->local_names[i] = s->local.items[i].name;
    }
    for (int i = 0; i < nb; i++) s->buffer_arr[i] = s->local_buffers.items[i].tensor;
    /* On GPUs the activations and gradients move in device memory: over nccl, whose point-to-point runs
     * each COMM action's messages as one NCCL group (pipe_run.c), so a stage that sends and receives at
     * once cannot deadlock there. */
    if (!lk_device_is_host(s->cfg.device) && s->world > 1 && !lk_comm_reads_device(s->comm))
        return lk_error(LK_STATUS_UNSUPPORTED, "strategy %s on %s needs a communicator that reads device memory "
                        "(nccl: one rank per GPU)", s->vt->name, lk_device_str(s->cfg.device, (char[32]){0}, 32));
    /* Each stage holds only its own blocks from here. A model built
     * deferred (lk_model_create_deferred: no storage yet) is built
     * stage-only: the other stages' tensors are marked another's, then
     * this rank materialises the rest, drawing single's bits from the seed
     * (the streams skip the tensors it does not hold), so no rank's peak
     * ever holds the whole model and every replica of a stage draws the
     * same values. A model built whole first gets every stage's values
     * from the stage's first replica, then gives the other stages' storage
     * back. */
    bool stage_only = net->deferred;
    if (!stage_only) LK_TRY(sync_params(s)); /* every rank starts from stage k's values of stage k's blocks */
    LK_TRY(drop_others(s));
    if (stage_only) LK_TRY(lk_layer_materialize(net));
    if (ps->p > 1 && s->rank == 0) {
        char line[1024];
        size_t len = (size_t)snprintf(line, sizeof line, "%s: each stage holds only its own blocks' parameters and "
                                      "buffers, %s (MiB; the whole model %.3f):", s->vt->name,
                                      stage_only ? "each materialised alone from the deferred model"
                                                 : "the other stages' storage given back",
                                      (double)ps->model_bytes / 1048576.0);
        for (int k = 0; k < ps->p && len < sizeof line; k++)
            len += (size_t)snprintf(line + len, sizeof line - len, " %s %d %.3f", ps->v > 1 ? "rank" : "stage", k,
                                    (double)ps->held_bytes[k] / 1048576.0);
        lk_log0("%s", line);
    }
    /* the replicas' gradient buckets are made by the first training step
     * (training_step), so a strategy wrapped only to evaluate (lockstep
     * test, predict) neither sets grad hooks nor reports buckets */
    return lk_strategy_setup(s, s->local_arr, s->local_names, np, s->buffer_arr, nb);
}

/* ---- the step ------------------------------------------------------------- */

static lk_tensor *stage_input(void *ctx, int chunk) {
    pipe_self *ps = ctx;
    return ps->s->fn.pipe_input(ps->s->fn.ctx, &ps->mb[chunk]);
}

static lk_tensor *stage_loss(void *ctx, int chunk, lk_tensor *out) {
    pipe_self *ps = ctx;
    return ps->s->fn.pipe_loss(ps->s->fn.ctx, out, &ps->mb[chunk]);
}

static void stage_action(void *ctx, const lk_pipe_action *a, double t0, double t1) {
    pipe_self *ps = ctx;
    lk_strategy *s = ps->s;
    if (s->pipe_fn) s->pipe_fn(s->pipe_ctx, (int)a->kind, a->kind == LK_PIPE_COMM ? a->ops[0].chunk : a->chunk, t0, t1);
}

/* A tied parameter's gradient parts summed where every holder sees it (the
 * ranks holding no part add zeros): then each holder's optimizer makes the
 * same update. The gradients are final here (the step's last micro-batch). */
static lk_status reduce_tied(lk_strategy *s) {
    pipe_self *ps = s->self;
    for (int q = 0; q < ps->ntied && ps->p > 1; q++) {
        lk_tensor *t = ps->tied[q].t;
        bool mine = false;
        for (int i = 0; i < s->local.n && !mine; i++) mine = s->local.items[i].tensor == t;
        size_t bytes = (size_t)t->numel * lk_dtype_size(t->dtype);
        void *buf = mine && t->grad ? t->grad->data : NULL;
        if (!buf) {
            bool host = lk_device_is_host(s->cfg.device);
            if (bytes > ps->scratch_bytes) {
                if (host) lk_free(ps->scratch);
                else lk_device_free(s->cfg.device, ps->scratch, ps->scratch_bytes);
                ps->scratch = NULL, ps->scratch_bytes = 0;
                if (host && !(ps->scratch = lk_malloc(bytes))) return LK_STATUS_OUT_OF_MEMORY;
                if (!host) LK_TRY(lk_device_alloc(s->cfg.device, bytes, &ps->scratch));
                ps->scratch_bytes = bytes;
            }
            if (host) memset(ps->scratch, 0, bytes);
            else LK_TRY(lk_device_memset(s->cfg.device, ps->scratch, 0, bytes));
            buf = ps->scratch;
        }
        LK_TRY(lk_comm_all_reduce(ps->pp, buf, (size_t)t->numel, t->dtype, LK_REDUCE_SUM));
    }
    return LK_STATUS_OK;
}

/* The batch's rows cut into m micro-batches (views) that differ by at most
 * one row, and each one's weight rows_c * m / rows (ps->mb, ps->weight). */
static lk_status cut_batch(pipe_self *ps, const lk_batch *b, int m) {
    if (!ps->mb && !(ps->mb = lk_calloc((size_t)ps->chunks, sizeof *ps->mb))) return LK_STATUS_OUT_OF_MEMORY;
    if (!ps->weight && !(ps->weight = lk_calloc((size_t)ps->chunks, sizeof *ps->weight))) return LK_STATUS_OUT_OF_MEMORY;
    int64_t base = b->size / m, extra = b->size % m, at = 0;
    for (int c = 0; c < m; c++) {
        int64_t rows = base + (c < extra);
        lk_batch *x = &ps->mb[c];
        *x = *b;
        x->size = rows;
        x->sample_index = b->sample_index ? b->sample_index + at : NULL;
        for (int f = 0; f < b->nfields; f++) {
            lk_array *fa = &x->field[f];
            if (fa->ndim < 1 || fa->shape[0] != b->size) continue; /* not per sample */
            size_t row = lk_array_nbytes(fa) / (size_t)fa->shape[0];
            fa->shape[0] = rows;
            fa->data = (char *)fa->data + (size_t)at * row;
        }
        ps->weight[c] = (float)((double)rows * m / (double)b->size);
        at += rows;
    }
    return LK_STATUS_OK;
}

static lk_status training_step(lk_strategy *s, const lk_step_args *a, lk_step_result *r) {
    pipe_self *ps = s->self;
    const lk_step_fn *fn = &s->fn;
    const lk_batch *b = a->batch;
    int m = ps->chunks;
    if (!fn->pipe_input || !fn->pipe_loss)
        return lk_error(LK_STATUS_INVALID_USAGE, "strategy %s: the caller gave no pipe_input/pipe_loss", s->vt->name);
    /* The batch size must divide into the chunks (checked on the first
     * batch, before any update). An epoch's short last batch is cut into
     * micro-batches that differ by at most one row, each loss weighted by
     * its rows, so the step still takes the batch's mean, as torch's
     * tensor_split chunks would; with fewer rows than chunks, that many
     * micro-batches of one row (the schedule made for them). */
    if (!ps->full_rows) {
        if (b->size % m)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: batch %lld has %lld samples, which do not divide into "
                            "trainer.pipeline.chunks = %d equal micro-batches (make the batch size a multiple of the chunks)",
                            s->vt->name, (long long)b->index, (long long)b->size, m);
        ps->full_rows = b->size;
    }
    if (b->size < 1) return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: an empty batch", s->vt->name);
    const lk_pipe_schedule *sched = ps->sched;
    if (b->size < m) {
        m = (int)b->size;
        if (!ps->short_sched || lk_pipe_schedule_chunks(ps->short_sched) != m) {
            lk_pipe_schedule_free(ps->short_sched);
            ps->short_sched = NULL;
            LK_TRY(lk_pipe_schedule_make_virtual(ps->schedule, ps->p, ps->v, m, &ps->short_sched));
        }
        sched = ps->short_sched;
    }
    LK_TRY(cut_batch(ps, b, m));
    int64_t extra = b->size % m;
    /* each micro-batch's loss is its mean: 1/m of it makes the batch's mean
     * (m = 1: untouched, the bits single has), then accumulation and the
     * loss scaler as the local step applies them */
    float mul = a->loss_mul / (float)m;
    if (a->loss_scale != 1.0f) mul *= a->loss_scale;
    lk_pipe_stage st = {.comm = ps->pp, .blocks = ps->myblocks, .nblocks = ps->nmy, .stage_blocks = ps->mycount, .ctx = ps,
                        .input = stage_input, .loss = stage_loss, .loss_mul = mul,
                        .chunk_weight = extra ? ps->weight : NULL};
    struct lk_pipe_times times = {0};
    st.times = &times;
    if (ps->dp > 1 && !ps->bk) LK_TRY(buckets_setup(s));
    bool bucketed = a->sync && ps->dp > 1;
    if (bucketed) st.before_backward = stage_before_backward;
    if (s->pipe_fn) st.on_action = stage_action;
    double t0 = lk_time_now(), loss_sum = 0;
    if (fn->step_begin) fn->step_begin(fn->ctx);
    lk_autocast_enter(a->autocast);
    lk_status rc = lk_pipe_run(sched, &st, &loss_sum);
    lk_autocast_exit();
    double t1 = lk_time_now();
    /* the loss is the last stage's: every rank logs and checks the same value */
    if (!rc && ps->p > 1) rc = lk_comm_broadcast(ps->pp, &loss_sum, 1, LK_F64, ps->p - 1);
    /* the replicas of this stage average their gradients once per optimizer
     * step (none inside accumulation, as ddp's no_sync): the buckets the
     * last backward started, and the rest */
    if (bucketed) rc = buckets_finish(ps, rc);
    double t2 = lk_time_now();
    r->t_fwd = t1 - t0; /* forwards and backwards interleave: booked as one */
    r->t_bwd = 0;
    r->t_comm = t2 - t1; /* the loss's broadcast and the replicas' all-reduce */
    if (fn->step_end) fn->step_end(fn->ctx, t1, t1, t2);
    if (rc) return rc;
    /* the measured bubble (run.json), past the first step's allocations and the full-size schedule only */
    s->stats.pipe_stages = ps->p;
    s->stats.pipe_chunks = ps->chunks;
    s->stats.pipe_virtual = ps->v;
    if (ps->steps_run++ > 0 && sched == ps->sched) {
        s->stats.pipe_run_s += times.total_s;
        s->stats.pipe_comm_s += times.comm_s;
    }
    if (a->sync) LK_TRY(reduce_tied(s));
    r->loss = loss_sum / m;
    if (fn->pipe_log_loss) LK_TRY(fn->pipe_log_loss(fn->ctx, r->loss));
    if (fn->check_loss) LK_TRY(fn->check_loss(fn->ctx, r->loss));
    return LK_STATUS_OK;
}

/* ---- evaluation: a forward-only schedule ---------------------------------
 * Validation inside fit runs the batch through the stages as training
 * does, forwards only (micro-batches flow stage 0 -> last, nothing comes
 * back), so no rank needs the other stages' blocks; the last stage's
 * outputs, joined in row order, are broadcast over the pipeline group and
 * every rank runs the module's step on them (the same loss and metrics on
 * every rank: what single computes on that batch). */

static lk_status stage_output(void *ctx, int chunk, lk_tensor *out) {
    pipe_self *ps = ctx;
    int64_t at = 0, rows = 0;
    for (int c = 0; c < chunk; c++) at += ps->mb[c].size;
    for (int c = 0; c < ps->eval_m; c++) rows += ps->mb[c].size;
    if (!ps->eval_out) {
        int64_t shape[LK_MAX_DIMS];
        for (int d = 0; d < out->ndim; d++) shape[d] = out->shape[d];
        shape[0] = rows;
        if (out->ndim < 1 || !(ps->eval_out = lk_tensor_empty(out->dtype, out->ndim, shape)))
            return out->ndim < 1 ? lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline evaluation: the model's output has no rows")
                                 : lk_last_status();
    }
    lk_tensor *all = ps->eval_out;
    if (out->dtype != all->dtype || out->ndim != all->ndim || out->shape[0] != ps->mb[chunk].size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline evaluation: micro-batch %d's output differs in dtype or "
                        "shape from micro-batch 0's", chunk);
    lk_tensor *c = lk_contiguous(out);
    if (!c) return lk_last_status();
    size_t row = lk_tensor_nbytes(all) / (size_t)(rows ? rows : 1);
    if (lk_tensor_nbytes(c) != row * (size_t)out->shape[0])
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "pipeline evaluation: micro-batch %d's output rows differ in size", chunk);
    /* (on a GPU both live in its memory: a copy there, never a host touch) */
    return lk_device_copy(all->device, (char *)all->data + (size_t)at * row, c->device, c->data, lk_tensor_nbytes(c));
}

static bool evals_forward(const lk_strategy *s) { return s->attached && s->fn.pipe_input; }

static lk_status eval_forward(lk_strategy *s, const lk_batch *b, bool whole, lk_tensor **out) {
    pipe_self *ps = s->self;
    *out = NULL;
    if (b->size < 1) return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s: an empty batch", s->vt->name);
    int m = whole ? 1 : b->size < ps->chunks ? (int)b->size : ps->chunks;
    if (!ps->fwd_sched || lk_pipe_schedule_chunks(ps->fwd_sched) != m) {
        lk_pipe_schedule_free(ps->fwd_sched);
        ps->fwd_sched = NULL;
        LK_TRY(lk_pipe_schedule_make_virtual("forward", ps->p, ps->v, m, &ps->fwd_sched));
    }
    LK_TRY(cut_batch(ps, b, m));
    ps->eval_m = m;
    if (whole && !ps->whole_noted) {
        ps->whole_noted = true;
        lk_log0("%s: test and predict run forward-only through the %d stages, each batch whole (one micro-batch: "
                "the whole model's matrix shapes, so its bits), the last stage's outputs sent to every stage",
                s->vt->name, ps->nst);
    } else if (!whole && !ps->eval_noted) {
        ps->eval_noted = true;
        lk_log0("%s: evaluation runs forward-only through the %d stages (%d micro-batch%s per batch), the last "
                "stage's outputs sent to every stage", s->vt->name, ps->nst, m, m == 1 ? "" : "es");
    }
    lk_pipe_stage st = {.comm = ps->pp, .blocks = ps->myblocks, .nblocks = ps->nmy, .stage_blocks = ps->mycount, .ctx = ps,
                        .input = stage_input, .output = stage_output};
    lk_status rc = lk_pipe_run(ps->fwd_sched, &st, NULL);
    /* the last stage's outputs to every stage: a header (dtype, ndim, dims), then the data */
    int64_t hdr[2 + LK_MAX_DIMS] = {0};
    lk_tensor *all = ps->eval_out;
    ps->eval_out = NULL;
    if (!rc && ps->stage == ps->p - 1) {
        hdr[0] = all->dtype, hdr[1] = all->ndim;
        for (int d = 0; d < all->ndim; d++) hdr[2 + d] = all->shape[d];
    }
    if (!rc && ps->p > 1) rc = lk_comm_broadcast(ps->pp, hdr, 2 + LK_MAX_DIMS, LK_I64, ps->p - 1);
    if (!rc && ps->stage != ps->p - 1) {
        lk_tensor_release(all);
        if (hdr[0] < 0 || hdr[0] >= LK_DTYPE_COUNT || hdr[1] < 1 || hdr[1] > LK_MAX_DIMS)
            return lk_error(LK_STATUS_INTERNAL, "strategy %s: the last stage's output header is corrupt", s->vt->name);
        if (!(all = lk_tensor_empty((lk_dtype)hdr[0], (int)hdr[1], hdr + 2))) rc = lk_last_status();
    }
    if (!rc && ps->p > 1) rc = lk_comm_broadcast(ps->pp, all->data, (size_t)all->numel, all->dtype, ps->p - 1);
    if (rc) {
        lk_tensor_release(all);
        return rc;
    }
    *out = all;
    return LK_STATUS_OK;
}

/* After the optimizer step: each stage changed only its own blocks; the
 * other stages' copies wait for a checkpoint or an evaluation. */
static lk_status after_step(lk_strategy *s) {
    pipe_self *ps = s->self;
    ps->stale = s->world > 1;
    /* made whole for an evaluation of the whole model: stale now, given back again */
    if (ps->whole && ps->ndropped) return drop_others(s); /* (it trims the pool) */
    /* a checkpoint's copies of the other stages' tensors (rank 0) sit in the
     * storage pool's cache once written: given back, or rank 0 would keep
     * the whole model's memory after its first checkpoint */
    if (ps->trim) lk_pool_trim();
    ps->trim = false;
    return LK_STATUS_OK;
}

/* torch.nn.utils.clip_grad_norm_ over the whole model: the squares summed
 * on each stage, then over the stages, one coefficient for all. */
static lk_status clip_grad_norm(lk_strategy *s, double max_norm, double norm_type) {
    pipe_self *ps = s->self;
    if (norm_type != 2.0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s clips by the 2-norm only, not %g", s->vt->name, norm_type);
    double sq = 0;
    for (int i = 0; i < s->local.n; i++) {
        const lk_tensor *g = s->local.items[i].tensor->grad;
        if (!g) continue;
        bool other = false; /* a tied parameter's norm is its first holder's to count */
        for (int q = 0; q < ps->ntied; q++) other |= ps->tied[q].t == s->local.items[i].tensor && ps->tied[q].first != ps->stage;
        if (other) continue;
        if (g->dtype != LK_F32 || !lk_device_is_host(g->device))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy %s clips f32 gradients on the host only, not %s",
                            s->vt->name, lk_dtype_name(g->dtype));
        const float *d = g->data;
        for (int64_t j = 0; j < g->numel; j++) sq += (double)d[j] * d[j];
    }
    /* over the stages: the replicas hold the same averaged gradients */
    if (ps->p > 1) LK_TRY(lk_comm_all_reduce(ps->pp, &sq, 1, LK_F64, LK_REDUCE_SUM));
    double coef = max_norm / (sqrt(sq) + 1e-6);
    if (!(coef < 1.0)) return LK_STATUS_OK;
    for (int i = 0; i < s->local.n; i++) {
        lk_tensor *g = s->local.items[i].tensor->grad;
        if (!g) continue;
        float *d = g->data;
        for (int64_t j = 0; j < g->numel; j++) d[j] *= (float)coef;
    }
    return LK_STATUS_OK;
}

/* The stages of one pipeline see the same samples: the data-parallel group
 * is this stage's replicas (none: this process alone). */
static lk_comm *dp_comm(lk_strategy *s) {
    pipe_self *ps = s->self;
    return ps->dp > 1 ? ps->mesh.dp : NULL;
}

/* ---- the optimizer's state in a checkpoint --------------------------------
 * Each stage's optimizer holds its own blocks' state, under the net's
 * parameter names. A checkpoint is one consolidated file (rank 0 writes
 * it), so rank 0 gathers every stage's entries by name; on a load every
 * rank keeps the entries of its own parameters. The file is then the one
 * single or ddp writes, and loads into them (and theirs into a pipeline). */

/* A list of named tensors as one byte string, so that a stage's state of
 * any optimizer goes to rank 0 as two messages (its length, then it):
 * per entry the name's length and bytes, dtype, ndim, dims, the data. */
static lk_status pack_named(const lk_named_tensors *l, uint8_t **out, int64_t *len) {
    size_t n = 0;
    for (int i = 0; i < l->n; i++)
        n += 4 + strlen(l->items[i].name) + 8 + 8 * (size_t)l->items[i].tensor->ndim + lk_tensor_nbytes(l->items[i].tensor);
    uint8_t *b = lk_malloc(n ? n : 1), *at = b;
    if (!b) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < l->n; i++) {
        const lk_tensor *t = l->items[i].tensor;
        uint32_t nl = (uint32_t)strlen(l->items[i].name);
        int32_t dn[2] = {(int32_t)t->dtype, (int32_t)t->ndim};
        size_t nb = lk_tensor_nbytes(t);
        if (!lk_tensor_is_contiguous(t)) {
            lk_free(b);
            return lk_error(LK_STATUS_INTERNAL, "pipeline: optimizer state '%s' is not a contiguous tensor",
                            l->items[i].name);
        }
        memcpy(at, &nl, 4), at += 4;
        memcpy(at, l->items[i].name, nl), at += nl;
        memcpy(at, dn, 8), at += 8;
        memcpy(at, t->shape, 8 * (size_t)t->ndim), at += 8 * (size_t)t->ndim;
        lk_status st = lk_device_copy(LK_DEVICE_CPU, at, t->device, t->data, nb); /* (a GPU's state: copied out) */
        if (st) return lk_free(b), st;
        at += nb;
    }
    *out = b;
    *len = (int64_t)n;
    return LK_STATUS_OK;
}

/* Appends the entries of a packed list whose names `into` lacks (a tied
 * parameter's state, held by each of its stages alike, is kept once). */
static lk_status unpack_named(const uint8_t *b, int64_t len, int from, lk_named_tensors *into) {
    const uint8_t *at = b, *end = b + len;
    char name[600];
    while (at < end) {
        uint32_t nl;
        int32_t dn[2];
        int64_t shape[LK_MAX_DIMS];
        bool ok = end - at >= 4 && (memcpy(&nl, at, 4), at += 4, nl < sizeof name && end - at >= (ptrdiff_t)nl + 8);
        if (ok) {
            memcpy(name, at, nl), name[nl] = 0, at += nl;
            memcpy(dn, at, 8), at += 8;
            ok = dn[0] >= 0 && dn[0] < LK_DTYPE_COUNT && dn[1] >= 0 && dn[1] <= LK_MAX_DIMS &&
                 end - at >= 8 * (ptrdiff_t)dn[1];
        }
        if (ok) memcpy(shape, at, 8 * (size_t)dn[1]), at += 8 * (size_t)dn[1];
        lk_tensor *t = ok ? lk_tensor_empty((lk_dtype)dn[0], dn[1], shape) : NULL;
        if (ok && !t) return lk_last_status();
        size_t nb = t ? lk_tensor_nbytes(t) : 0;
        if (!ok || end - at < (ptrdiff_t)nb) {
            lk_tensor_release(t);
            return lk_error(LK_STATUS_INTERNAL, "pipeline: the optimizer state rank %d sent for the checkpoint is "
                            "truncated or corrupt", from);
        }
        lk_status st = lk_device_copy(t->device, t->data, LK_DEVICE_CPU, at, nb); /* (the default device's: a GPU's) */
        at += nb;
        if (!st) st = lk_named_tensors_find(into, name) ? LK_STATUS_OK : lk_named_tensors_append(into, name, t);
        lk_tensor_release(t);
        LK_TRY(st);
    }
    return LK_STATUS_OK;
}

/* The whole model's optimizer state on rank 0 (every stage's, point to
 * point from each stage's first replica: the replicas hold the same); on
 * the other ranks their own. Every rank calls it (checkpoint.c gathers
 * with the state dict). Without the arrays (a sharded set's metadata,
 * which this strategy never writes) no message moves: this rank's own. */
static lk_status optimizer_state(lk_strategy *s, lk_optimizer *o, lk_named_tensors *out, bool arrays) {
    pipe_self *ps = s->self;
    LK_TRY(lk__optimizer_state_get_ex(o, out, arrays));
    if (!arrays || s->world == 1 || ps->p == 1) return LK_STATUS_OK;
    for (int k = 1; k < ps->p; k++) {
        int src = k * ps->dp;
        if (s->rank != src && s->rank != 0) continue;
        uint8_t *buf = NULL;
        int64_t len = 0;
        lk_status st;
        if (s->rank == src) {
            st = pack_named(out, &buf, &len);
            if (!st) st = lk_comm_send(s->comm, &len, 1, LK_I64, 0);
            if (!st) st = lk_comm_send(s->comm, buf, (size_t)len, LK_U8, 0);
        } else {
            st = lk_comm_recv(s->comm, &len, 1, LK_I64, src);
            if (!st && (len < 0 || !(buf = lk_malloc(len ? (size_t)len : 1)))) st = LK_STATUS_OUT_OF_MEMORY;
            if (!st) st = lk_comm_recv(s->comm, buf, (size_t)len, LK_U8, src);
            if (!st) st = unpack_named(buf, len, src, out);
        }
        lk_free(buf);
        if (st) return lk_error(st, "strategy %s: gathering stage %d's optimizer state for a checkpoint: %s", s->vt->name,
                                k, lk_last_error());
    }
    return LK_STATUS_OK;
}

/* Whether "state.<param>.<field>" names a parameter of stage k. */
static bool state_of(const pipe_self *ps, int k, const char *name) {
    const char *rest = name + 6, *dot = strrchr(rest, '.');
    if (!dot) return false;
    size_t n = (size_t)(dot - rest);
    for (int j = 0; j < ps->stage_params[k].n; j++) {
        const char *pn = ps->stage_params[k].items[j].name;
        if (strlen(pn) == n && !strncmp(pn, rest, n)) return true;
    }
    return false;
}

/* A checkpoint's optimizer state (any strategy's: every parameter's
 * entries) loaded into this stage's optimizer: the hyperparameters and its
 * own parameters' entries; the other stages' are theirs. An entry of no
 * stage's parameter stays, so that the optimizer names it as unknown. */
static lk_status optimizer_state_load(lk_strategy *s, lk_optimizer *o, const lk_named_tensors *state) {
    pipe_self *ps = s->self;
    lk_named_tensors mine = {0};
    lk_status st = LK_STATUS_OK;
    for (int i = 0; i < state->n && !st; i++) {
        const char *nm = state->items[i].name;
        bool keep = true;
        if (!strncmp(nm, "state.", 6) && !state_of(ps, ps->stage, nm)) {
            bool other = false;
            for (int k = 0; k < ps->p && !other; k++) other = state_of(ps, k, nm);
            keep = !other;
        }
        if (keep) st = lk_named_tensors_append(&mine, nm, state->items[i].tensor);
    }
    if (!st) st = lk_optimizer_state_load(o, &mine);
    lk_named_tensors_clear(&mine);
    return st;
}

/* Every rank read from the file every tensor it holds data for: each copy it holds is current. */
static lk_status state_dict_loaded(lk_strategy *s) {
    pipe_self *ps = s->self;
    ps->stale = false;
    return LK_STATUS_OK;
}

const lk_strategy_vt lk__strategy_model_parallel = {
    .name = "model_parallel",
    .summary = "model_parallel, the model's blocks in stages, one per process",
    .create = create_mp,
    .free = pipe_free,
    .set_blocks = set_blocks,
    .wants_profile = wants_profile,
    .materializes = materializes,
    .profile_blocks = profile_blocks,
    .wrap = wrap,
    .training_step = training_step,
    .after_step = after_step,
    .clip_grad_norm = clip_grad_norm,
    .state_dict = state_dict,
    .sync_model = sync_model,
    .dp_comm = dp_comm,
    .optimizer_state = optimizer_state,
    .optimizer_state_load = optimizer_state_load,
    .state_dict_loaded = state_dict_loaded,
    .memory = memory,
    .evals_forward = evals_forward,
    .eval_forward = eval_forward,
};

const lk_strategy_vt lk__strategy_pipeline = {
    .name = "pipeline",
    .summary = "pipeline, the model's blocks in stages, one per process, micro-batches in a schedule",
    .create = create_pipe,
    .free = pipe_free,
    .set_blocks = set_blocks,
    .wants_profile = wants_profile,
    .materializes = materializes,
    .profile_blocks = profile_blocks,
    .wrap = wrap,
    .training_step = training_step,
    .after_step = after_step,
    .clip_grad_norm = clip_grad_norm,
    .state_dict = state_dict,
    .sync_model = sync_model,
    .dp_comm = dp_comm,
    .optimizer_state = optimizer_state,
    .optimizer_state_load = optimizer_state_load,
    .state_dict_loaded = state_dict_loaded,
    .memory = memory,
    .evals_forward = evals_forward,
    .eval_forward = eval_forward,
};

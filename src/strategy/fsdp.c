/* Fully sharded data parallel (`fsdp`, Lightning's FSDPStrategy) and ZeRO
 * stage 3 (`deepspeed_stage_3`): lockstep's own implementation, no PyTorch
 * or DeepSpeed inside. The network is cut into units (the auto-wrap
 * policy: the model's repeated blocks by default, or layers of the named
 * classes, or by parameter count) plus the root, which holds every
 * parameter no unit does (and every parameter two units share: GPT's tied
 * wte/lm_head). Each unit's parameters are laid out back to back in a flat
 * range padded to S equal chunks (S the shard group's size: never refused
 * for a count S does not divide), and rank r keeps chunk r only: its
 * master parameters (what the optimizer updates), its gradients and its
 * optimizer state — FSDP's 16 Psi / N.
 *
 * The unit's whole parameters exist only around its use: they are
 * all-gathered into the unit's `full` buffer just before its forward (the
 * next unit's gather is issued while this one computes: forward prefetch,
 * in the order the first forward recorded), released after it
 * (reshard_after_forward; SHARD_GRAD_OP keeps them to the backward),
 * gathered again before its backward (the unit before it prefetched), and
 * released after its backward once its gradients were reduce-scattered into
 * each rank's chunk (one reduce-scatter in flight while the backward goes
 * on). `full` and `gfull` are anonymous mappings whose pages go back to the
 * kernel on release (madvise DONTNEED: the next touch reads zeros), so the
 * tensors keep their addresses — autograd's saved references and the
 * layers' slots never move — while the memory is really given back, and a
 * released gradient buffer is a zeroed one.
 *
 * HYBRID_SHARD shards inside a node and replicates across nodes (the shard
 * group is the node's ranks; the chunks' gradients are then all-reduced
 * over the ranks with the same local rank); NO_SHARD is one chunk per rank
 * (S = 1) with the gradients all-reduced: ddp's arithmetic in FSDP's
 * structure. Accumulation keeps the unreduced whole gradients of every unit
 * until the micro-batch that syncs (memory for speed, as FSDP's no_sync).
 *
 * On a device (GPUs) every buffer above is that device's memory and the
 * shard group's communicator must read it (nccl): the gathers and
 * reduce-scatters run on the device's buffers, the few host-side
 * collectives (clipping's norms, a checkpoint's optimizer state) through
 * the communicator's host path. A released unit keeps its device memory
 * (there is no madvise for it, and the tensors must keep their addresses):
 * on a GPU the sharding saves the optimizer state's and the gradients'
 * chunks, not yet the whole parameters' memory between uses.
 *
 * cpu_offload on a GPU (FSDP's CPUOffload, DeepSpeed's offload_optimizer:
 * Lightning's *_offload names) keeps the master chunks, their gradients
 * and the optimizer state in host memory (s->flat_dev is the host), and
 * the optimizer steps on the CPU: a gather first copies this rank's chunk
 * into its place in the unit's device buffer and all-gathers in place; a
 * reduce-scatter lands in one device staging chunk (`rs_stage`: one is in
 * flight at a time) copied to the host chunk when it is waited for. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend_impl.h"
#include "backend/kernels.h" /* lk_k_clip_total / lk_k_clip_coef_of: the combination lk_clip_grad_norm uses */
#include "optim/optim_impl.h"
#include "strategy/strategy_impl.h"
#include "tensor/tensor_impl.h"

typedef struct fsdp fsdp;

typedef struct unit {
    fsdp *f;
    lk_layer *layer;      /* the wrapped layer; NULL for the root */
    char *name;           /* its dotted path ("" for the root) */
    int np;
    lk_tensor **p;        /* borrowed: the net's parameters, named_parameters order */
    const char **pname;   /* borrowed from f->named: their state-dict names */
    int *pglobal;         /* their index in the net's named_parameters (clipping's order) */
    int64_t *poff;        /* where each starts in the unit's flat range */
    int64_t numel, chunk; /* elements; chunk = ceil(numel / S) */
    size_t map_bytes;     /* chunk * S elements, rounded to pages */
    void *full, *gfull;   /* the gathered parameters and whole gradients (gown, or a slot of f->gring) */
    void *gown;           /* the unit's own mapping for its whole gradients (gfull elsewhere: a slot of f->gring) */
    lk_tensor *full_t, *gfull_t;
    int64_t shard_off;    /* the unit's chunk in f->shards and in the shards' gradients (elements) */
    void *mine;           /* this rank's master chunk: in f->shards, or in `full` when the parameters stay whole */
    bool gathered;        /* full holds the current parameters */
    bool reduced;         /* this step's reduction was issued */
    bool grads_stale;     /* gfull was released after a reduction: zero it before it is written again */
    bool grads_charged;   /* gfull's bytes are charged to the rank (from the unit's backward to its release) */
    bool full_shared;     /* full is a block of the shard group's shared memory (in_segment), counted by its allocator */
    bool full_common;     /* stage 2 on one node (trainer.ddp_shared_params): full is the node's one copy
                           * (lk_comm_alloc_common) every rank maps; each rank's optimizer writes its chunk in
                           * place and the gathers after a step are one barrier (share_chunks) */
    bool full_owner;      /* this rank allocated the common copy (frees it) */
    lk_work *gather;      /* a prefetch in flight */
    int pos;              /* position in the recorded forward order (-1: not seen) */
} unit;

struct fsdp {
    lk_strategy *s; /* back: the hooks get the unit only */
    lk_fsdp_options o;
    char wrap_types[512];
    lk_comm *shard, *replica; /* owned when split (HYBRID_SHARD); NULL: a group of one */
    bool own_groups;
    int S, sr, R;
    unit *u;                  /* u[0] is the root */
    int nu;
    lk_named_tensors named;   /* the net's named parameters (references) */
    void *shards;             /* every unit's chunk, back to back: the master parameters */
    size_t shard_bytes;       /* its allocation */
    bool shards_shared;       /* shards is a block of the shard group's shared memory (in_segment) */
    int64_t shard_numel;
    lk_tensor *shards_t;
    int *shard_unit;
    int nshard;
    int *order;               /* units in the order the forward reached them */
    int norder;
    bool order_done, in_fwd;
    unit *rs_unit;            /* the unit whose reduce-scatter is in flight */
    lk_work *rs_work;
    int *pend;                /* units whose reductions wait for the backward's end (defer_bytes) */
    int npend;
    int64_t pend_bytes;       /* their whole gradients' bytes */
    int64_t defer_bytes;      /* below this, reductions wait: min(the largest unit's bytes, bucket_cap_mb); 0: never */
    bool inline_sched;        /* LK_SHARD_INLINE: small units' reductions and stage 2's gathers on this thread */
    bool sync;                /* this backward reduces */
    bool hold;                /* every unit gathered for a state dict, until the next forward */
    bool saving;              /* gathering for a state dict: not a step's peak */
    bool params_whole;        /* deepspeed_stage_2: parameters replicated, chunks all-gathered after the step */
    bool common_live;         /* some unit's parameters are in such a copy (full_common) */
    /* fsdp on one node over shm: every rank's master chunks (f->shards) in
     * the segment, each rank's as this process maps it (peer_shards[k]): a
     * unit's gather copies them straight into `full`, with no collective.
     * They change only at a step or a load, each followed by a barrier
     * (share_chunks), and a rank steps only after the step's last
     * reduce-scatter, which every rank joins after its last gather. */
    bool direct;
    void **peer_shards;
    lk_optimizer *optim;      /* borrowed: lk_strategy_shard_optimizer's (the pieces' state) */
    bool offload;             /* cpu_offload on a GPU: the chunks (master, gradients, state) on the host */
    void *rs_stage;           /* offload: the reduce-scatter's device output, the largest chunk */
    size_t rs_stage_bytes;
    int64_t gathered_bytes, peak_gathered_bytes;
    /* On one node over shm: a ring in the segment that lends the units
     * their whole gradients' memory for the time they are live, so that
     * the reduce-scatters read them in place (see take_slot). */
    uint8_t *gring;
    size_t gring_cap;
    struct gslot { int unit; size_t off, bytes; bool live; } *gq; /* the loans, oldest first (circular) */
    int gq_cap, gq_front, gq_n;
};

static fsdp *f_of(const lk_strategy *s) { return s->self; }
static size_t esz(const lk_strategy *s) { return lk_dtype_size(s->cfg.param_dtype); }
static void *at(void *base, size_t es, int64_t i) { return (char *)base + i * (int64_t)es; }
static bool on_host(const lk_strategy *s) { return lk_device_is_host(s->cfg.device); }
/* Where the master chunks and their gradients live: the training device, or the host (offload). */
static lk_device home(const lk_strategy *s) { return s->flat_dev; }

/* A copy between the chunks' home and the training device (either way; a memcpy on the CPU). */
static lk_status xcopy(lk_device dd, void *dst, lk_device sd, const void *src, size_t bytes) {
    if (lk_device_is_host(dd) && lk_device_is_host(sd)) return memcpy(dst, src, bytes), LK_STATUS_OK;
    return lk_device_copy(dd, dst, sd, src, bytes);
}

/* Zeroing inside the parameters' memory (host or device). */
static lk_status mzero(lk_strategy *s, void *p, size_t bytes) {
    if (on_host(s)) return memset(p, 0, bytes), LK_STATUS_OK;
    return lk_device_memset(s->cfg.device, p, 0, bytes);
}

lk_fsdp_options lk_fsdp_options_default(void) {
    return (lk_fsdp_options){.sharding = LK_FSDP_FULL_SHARD, .wrap_types = NULL, .min_num_params = 0,
                             .forward_prefetch = true, .backward_prefetch = true};
}

const char *lk_fsdp_sharding_name(lk_fsdp_sharding s) {
    static const char *const names[] = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"};
    return (unsigned)s < 4 ? names[s] : "?";
}

/* ---- create: the shard and replica groups ---------------------------------------- */

static void f_free(lk_strategy *s);

static lk_status f_create_(lk_strategy *s) {
    const char *name = s->vt->name;
    if (!s->comm) return lk_error(LK_STATUS_INVALID_ARGUMENT, "strategy '%s' needs a communicator", name);
    if (!lk_device_is_host(s->cfg.device) && !lk_comm_reads_device(s->comm))
        return lk_error(LK_STATUS_UNSUPPORTED, "strategy '%s' on %s needs a communicator that reads device memory (nccl: "
                        "one rank per GPU); this one (%s) would copy every unit's gather and reduce-scatter through the "
                        "host. Use ddp or deepspeed_stage_1 there", name, lk_device_str(s->cfg.device, (char[32]){0}, 32),
                        lk_comm_backend(s->comm));
    fsdp *f = lk_calloc(1, sizeof *f);
    if (!f) return LK_STATUS_OUT_OF_MEMORY;
    s->self = f;
    f->s = s;
    f->o = s->cfg.fsdp ? *s->cfg.fsdp : lk_fsdp_options_default();
    f->offload = f->o.cpu_offload && !lk_device_is_host(s->cfg.device);
    if (f->offload) s->flat_dev = LK_DEVICE_CPU; /* the gradient chunks with the master chunks */
    if (f->o.wrap_types) snprintf(f->wrap_types, sizeof f->wrap_types, "%s", f->o.wrap_types);
    f->o.wrap_types = f->wrap_types;
    /* ZeRO-2: the parameters stay whole (their chunks all-gathered after the
     * step, in place), gradients and optimizer state sharded as FULL_SHARD's */
    f->params_whole = s->vt == &lk__strategy_zero2;
    if (f->params_whole) f->o.sharding = LK_FSDP_FULL_SHARD;
    if ((unsigned)f->o.sharding > LK_FSDP_HYBRID_SHARD)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: unknown sharding strategy %d", name, (int)f->o.sharding);
    int W = s->world, L = lk_comm_local_world_size(s->comm);
    switch (f->o.sharding) {
    case LK_FSDP_FULL_SHARD:
    case LK_FSDP_SHARD_GRAD_OP:
        f->shard = s->comm;
        break;
    case LK_FSDP_NO_SHARD:
        f->replica = s->comm;
        break;
    case LK_FSDP_HYBRID_SHARD: {
        /* the node's ranks shard; the ranks with one local rank replicate */
        const lk_pg_info *pg = lk_comm_pg(s->comm);
        int node = pg && pg->num_nodes > 1 ? pg->node_rank : (L > 0 ? s->rank / L : 0);
        int nodes = pg && pg->num_nodes > 1 ? pg->num_nodes : (L > 0 ? W / L : 1);
        if (nodes <= 1) {
            f->shard = s->comm; /* one node: FULL_SHARD */
            break;
        }
        if (L <= 0 || W != L * nodes)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: HYBRID_SHARD needs the same number of ranks on every node "
                            "(%d ranks, %d per node on this one, %d nodes)", name, W, L, nodes);
        LK_TRY(lk_comm_split(s->comm, node, s->rank, &f->shard));
        LK_TRY(lk_comm_split(s->comm, lk_comm_local_rank(s->comm), s->rank, &f->replica));
        f->own_groups = true;
        break;
    }
    }
    f->S = f->shard ? lk_comm_world_size(f->shard) : 1;
    f->sr = f->shard ? lk_comm_rank(f->shard) : 0;
    f->R = f->replica ? lk_comm_world_size(f->replica) : 1;
    return LK_STATUS_OK;
}

static lk_status f_create(lk_strategy *s) {
    lk_status st = f_create_(s);
    if (st) f_free(s);
    return st;
}

/* ---- the units --------------------------------------------------------------------- */

static bool type_listed(const char *types, const char *type) {
    size_t n = strlen(type);
    for (const char *p = types; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        while (len && *p == ' ') p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if (len == n && !strncmp(p, type, n)) return true;
        p = e ? e + 1 : NULL;
    }
    return false;
}

typedef struct {
    lk_layer **v;
    char **path;
    int n, cap;
} pick;

static lk_status pick_add(pick *k, lk_layer *l, const char *path) {
    if (k->n == k->cap) {
        int cap = k->cap ? 2 * k->cap : 8;
        lk_layer **v = lk_realloc(k->v, (size_t)cap * sizeof *v);
        if (!v) return LK_STATUS_OUT_OF_MEMORY;
        k->v = v;
        char **p = lk_realloc(k->path, (size_t)cap * sizeof *p);
        if (!p) return LK_STATUS_OUT_OF_MEMORY;
        k->path = p;
        k->cap = cap;
    }
    if (!(k->path[k->n] = lk_strdup(path))) return LK_STATUS_OUT_OF_MEMORY;
    k->v[k->n++] = l;
    return LK_STATUS_OK;
}

static void join_path(char *out, size_t size, const char *prefix, const char *name) {
    snprintf(out, size, "%s%s%s", prefix, *prefix ? "." : "", name);
}

/* By class: every layer of a listed type, not below one picked. */
static lk_status pick_types(lk_layer *l, const char *path, const char *types, pick *k) {
    if (*path && type_listed(types, l->type)) return pick_add(k, l, path);
    for (int c = 0; c < l->n_children; c++) {
        char sub[512];
        join_path(sub, sizeof sub, path, l->children[c].name);
        LK_TRY(pick_types(l->children[c].layer, sub, types, k));
    }
    return LK_STATUS_OK;
}

/* The default: the layers the model marks as its repeated units (gpt's
 * blocks), else the children of the first layer with several (the
 * autoencoder's encoder and decoder, the mlp's layers), as activation
 * checkpointing's default policy picks them. */
static int pick_marked(lk_layer *l, const char *path, pick *k, lk_status *st) {
    if (l->checkpoint_unit && *path) {
        *st = pick_add(k, l, path);
        return 1;
    }
    int n = 0;
    for (int c = 0; c < l->n_children && !*st; c++) {
        char sub[512];
        join_path(sub, sizeof sub, path, l->children[c].name);
        n += pick_marked(l->children[c].layer, sub, k, st);
    }
    return n;
}

static lk_status pick_default(lk_layer *net, pick *k) {
    lk_status st = LK_STATUS_OK;
    if (pick_marked(net, "", k, &st) > 0 || st) return st;
    char path[512] = "";
    lk_layer *l = net;
    while (l->n_children == 1) {
        char sub[512];
        join_path(sub, sizeof sub, path, l->children[0].name);
        snprintf(path, sizeof path, "%s", sub);
        l = l->children[0].layer;
    }
    for (int c = 0; c < l->n_children; c++) {
        char sub[512];
        join_path(sub, sizeof sub, path, l->children[c].name);
        LK_TRY(pick_add(k, l->children[c].layer, sub));
    }
    return LK_STATUS_OK;
}

/* By size (torch's size_based_auto_wrap_policy): bottom up, a layer is
 * wrapped when the parameters under it that no wrapped layer took reach
 * min_num_params. Returns those left to the layer's parent. */
static int64_t pick_size(lk_layer *l, const char *path, int64_t min, pick *k, lk_status *st) {
    int64_t left = 0;
    for (int i = 0; i < l->params.n; i++) left += l->params.items[i].tensor->numel;
    for (int c = 0; c < l->n_children && !*st; c++) {
        char sub[512];
        join_path(sub, sizeof sub, path, l->children[c].name);
        left += pick_size(l->children[c].layer, sub, min, k, st);
    }
    if (*path && left >= min && !*st) {
        *st = pick_add(k, l, path);
        return 0;
    }
    return left;
}

/* Which unit holds each parameter: the unit of the layers that use it, or
 * the root when layers of two units (or a unit and the root) use it. */
static void assign(lk_layer *l, const pick *k, int cur, const lk_named_tensors *named, int *owner) {
    for (int j = 0; j < k->n; j++)
        if (k->v[j] == l) cur = j + 1;
    for (int i = 0; i < l->params.n; i++) {
        const lk_tensor *t = l->params.items[i].tensor;
        for (int g = 0; g < named->n; g++)
            if (named->items[g].tensor == t) {
                owner[g] = owner[g] < 0 ? cur : owner[g] == cur ? cur : 0;
                break;
            }
    }
    for (int c = 0; c < l->n_children; c++) assign(l->children[c].layer, k, cur, named, owner);
}

/* A released unit's pages: MADV_FREE lets the kernel take them when it
 * needs memory, and leaves them in place when it does not (no fault and
 * no zeroing by the kernel at the next use: a gather overwrites every
 * byte, and the gradients are zeroed by us just before the unit's next
 * backward, as a zero_grad would — 300,000 page faults in 200 mlp steps
 * with MADV_DONTNEED on both). */
#ifdef MADV_FREE
#define RELEASE_PARAMS MADV_FREE
#else
#define RELEASE_PARAMS MADV_DONTNEED
#endif

/* A whole buffer: anonymous pages on the host, the device's memory (zeroed) otherwise. */
static void *map_pages(lk_strategy *s, size_t bytes) {
    if (!on_host(s)) {
        void *p = NULL;
        if (lk_device_alloc(s->cfg.device, bytes, &p)) return NULL;
        if (lk_device_memset(s->cfg.device, p, 0, bytes)) return lk_device_free(s->cfg.device, p, bytes), NULL;
        return p;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void unmap_pages(lk_strategy *s, void *p, size_t bytes) {
    if (!p) return;
    if (on_host(s)) munmap(p, bytes);
    else lk_device_free(s->cfg.device, p, bytes);
}

/* A released buffer's pages back to the kernel (the host's only: see the top). */
static void give_back(lk_strategy *s, void *p, size_t bytes) {
    if (on_host(s)) (void)madvise(p, bytes, RELEASE_PARAMS);
}

/* Whether what a rank sends to the all-gathers lives in the shard group's
 * shared memory (one node over shm, on the host): there every rank copies
 * its peers' chunks straight from their memory, where a private buffer is
 * first copied into the communicator's staging slots and out again. fsdp's
 * master chunks (1/N of the model, kept for the whole run) and stage 2's
 * whole parameters (never released) cost no more memory there. The whole
 * gradients stay private mappings: their pages go back after each
 * reduction, which shared memory would not allow. */
static bool in_segment(const lk_strategy *s) {
    const fsdp *f = f_of(s);
    return on_host(s) && f->S > 1 && !f->offload && lk_comm_shares_memory(f->shard);
}

/* This rank's chunk of the unit's whole values into its master chunk
 * (nothing to copy where the master chunk lives inside them: stage 2). */
static lk_status keep_chunk(lk_strategy *s, unit *u) {
    void *in_full = at(u->full, esz(s), u->chunk * u->f->sr);
    return u->mine != in_full ? xcopy(home(s), u->mine, s->cfg.device, in_full, (size_t)u->chunk * esz(s))
                              : LK_STATUS_OK;
}

/* What this rank sends to a unit's all-gather: its master chunk, or with
 * the chunk on the host (offload) the chunk copied into its own place in
 * the unit's device buffer first (the all-gather then runs in place). */
static lk_status gather_source(lk_strategy *s, unit *u, const void **src) {
    *src = u->mine;
    if (!u->f->offload) return LK_STATUS_OK;
    void *place = at(u->full, esz(s), u->chunk * u->f->sr);
    *src = place;
    return lk_device_copy(s->cfg.device, place, LK_DEVICE_CPU, u->mine, (size_t)u->chunk * esz(s));
}

/* ---- gather, release, reduce ----------------------------------------------------------- */

/* The whole buffers are mappings outside lockstep's allocator: what a rank
 * holds in them is charged to it by hand, so trainer.memory_limit_mb sees
 * gathered units and live whole gradients (and refuses them by name). */
static lk_status charge(const unit *u, const char *what) {
    if (!on_host(u->f->s)) return LK_STATUS_OK; /* the device's memory: not the host's limit */
    if (!lk__alloc_charge(u->map_bytes)) return LK_STATUS_OK;
    lk_pool_trim(); /* the storage pool's cached blocks count as live: given back, then once more (as the pool does) */
    if (!lk__alloc_charge(u->map_bytes)) return LK_STATUS_OK;
    return lk__alloc_oom_for("%s of unit '%s'", what, *u->name ? u->name : "(root)"); /* named only when refused */
}

static lk_status count_gathered(fsdp *f, unit *u, bool on) {
    int64_t b = (int64_t)u->map_bytes;
    if (u->full_shared) { /* its allocation counts it, for as long as it lives */
    } else if (on) LK_TRY(charge(u, "the gathered parameters"));
    else if (on_host(f->s)) lk__alloc_uncharge(u->map_bytes);
    f->gathered_bytes += on ? b : -b;
    if (!f->saving && f->gathered_bytes > f->peak_gathered_bytes) f->peak_gathered_bytes = f->gathered_bytes;
    return LK_STATUS_OK;
}

/* ---- the gradient ring ---------------------------------------------------------------
 *
 * stage 2's and fsdp's whole gradients live only from a unit's backward to
 * the end of its reduce-scatter. In a private mapping (which gives its
 * pages back after) the shm reduce-scatter first copies every block a peer
 * reads into the communicator's staging slots, a slice at a time, each
 * slice a sync. On one node over shm the units therefore borrow their
 * whole gradients from a ring in the segment, twice the largest unit: the
 * peers then reduce straight from each other's slot, as ddp's buckets are
 * reduced, in one sync. That is the memory the stage promises anyway (the
 * unit being computed and the reduction in flight, at most one largest
 * unit each, the small units that wait for the backward's end under one).
 * A unit the ring cannot take (full, under accumulation's kept gradients
 * or a wrap) uses its own mapping, as before: slower, never wrong. The
 * loans end in the order they began (the reductions run in the backward's
 * order); one ended out of order frees its space when the older ones do. */
static bool in_ring(const unit *u) { return u->gfull != u->gown; }

static size_t slot_bytes(const unit *u) { return ((size_t)(u->chunk * u->f->S) * esz(u->f->s) + 63) / 64 * 64; }

static bool ring_take(fsdp *f, int unit_ix, size_t bytes, size_t *off) {
    if (!f->gring || bytes > f->gring_cap || f->gq_n == f->gq_cap) return false;
    size_t at = 0;
    if (f->gq_n) {
        const struct gslot *front = &f->gq[f->gq_front], *back = &f->gq[(f->gq_front + f->gq_n - 1) % f->gq_cap];
        size_t head = back->off + back->bytes, tail = front->off;
        if (back->off < front->off) { /* wrapped: the free space is [head, tail) */
            if (head + bytes > tail) return false;
            at = head;
        } else if (head + bytes <= f->gring_cap) at = head;
        else if (bytes <= tail) at = 0;
        else return false;
    }
    f->gq[(f->gq_front + f->gq_n++) % f->gq_cap] = (struct gslot){unit_ix, at, bytes, true};
    *off = at;
    return true;
}

static void ring_give(fsdp *f, int unit_ix) {
    for (int i = 0; i < f->gq_n; i++) {
        struct gslot *q = &f->gq[(f->gq_front + i) % f->gq_cap];
        if (q->live && q->unit == unit_ix) q->live = false;
    }
    while (f->gq_n && !f->gq[f->gq_front].live) f->gq_front = (f->gq_front + 1) % f->gq_cap, f->gq_n--;
}

/* The unit's gradient views (each parameter's, and the whole) moved to base. */
static bool can_point(const unit *u) {
    if (u->gfull_t && !lk__tensor_rebasable(u->gfull_t)) return false;
    for (int i = 0; i < u->np; i++)
        if (!u->p[i]->grad || u->p[i]->grad->data != at(u->gfull, esz(u->f->s), u->poff[i]) ||
            !lk__tensor_rebasable(u->p[i]->grad))
            return false;
    return true;
}

static void point(unit *u, void *base) {
    size_t e = esz(u->f->s);
    for (int i = 0; i < u->np; i++) {
        lk_tensor *g = u->p[i]->grad;
        if (g && g->data == at(u->gfull, e, u->poff[i])) lk__tensor_rebase(g, at(base, e, u->poff[i]));
    }
    if (u->gfull_t && u->gfull_t->data == u->gfull) lk__tensor_rebase(u->gfull_t, base);
    u->gfull = base;
}

/* A slot for the unit's whole gradients, if the ring has one: the padding
 * between and after its parameters zeroed (the reduce-scatter sums it into
 * the chunks' padding, which must stay zero), the parameters' ranges left
 * to zero_grads, which marks them stale (the backward's first write
 * overwrites them). */
static bool take_slot(unit *u) {
    fsdp *f = u->f;
    size_t off, bytes = slot_bytes(u), e = esz(f->s);
    if (!u->layer || !u->numel || !can_point(u) || !ring_take(f, (int)(u - f->u), bytes, &off)) return false;
    uint8_t *base = f->gring + off;
    point(u, base);
    size_t covered = 0;
    for (int i = 0; i < u->np; i++) {
        size_t a = (size_t)u->poff[i] * e, b = a + (size_t)u->p[i]->numel * e;
        if (a > covered) memset(base + covered, 0, a - covered);
        if (b > covered) covered = b;
    }
    if (bytes > covered) memset(base + covered, 0, bytes - covered);
    u->grads_stale = true;
    return true;
}

/* The unit's whole gradients are about to be written (its backward): a
 * slot of the ring (counted by the ring's allocation), or its own mapping,
 * counted here. */
static lk_status grads_live(unit *u) {
    if (u->grads_charged || !u->numel) return LK_STATUS_OK;
    if (!take_slot(u)) LK_TRY(charge(u, "the whole gradients"));
    u->grads_charged = true;
    return LK_STATUS_OK;
}

static void grads_gone(unit *u) {
    if (!u->grads_charged) return;
    if (in_ring(u)) { /* the loan ends: back to its own mapping */
        ring_give(u->f, (int)(u - u->f->u));
        point(u, u->gown);
    } else if (on_host(u->f->s)) lk__alloc_uncharge(u->map_bytes);
    u->grads_charged = false;
}

static lk_status comm_fail(lk_comm *c, lk_status st) {
    return st && c && lk_comm_error(c) ? lk_last_status() : st;
}

/* The unit's whole parameters into `full`: its prefetch waited for, or a
 * blocking all-gather over the shard group. */
static lk_status gather(lk_strategy *s, unit *u) {
    fsdp *f = f_of(s);
    if (u->gather) {
        double t0 = lk_time_now();
        lk_status st = lk_work_wait(u->gather);
        lk_work_free(u->gather);
        u->gather = NULL;
        s->stats.comm_exposed_s += lk_time_now() - t0;
        if (st) return comm_fail(f->shard, st);
        u->gathered = true;
        return LK_STATUS_OK;
    }
    if (u->gathered || !u->numel) return LK_STATUS_OK;
    LK_TRY(count_gathered(f, u, true)); /* (before the all-gather: every rank refuses its own, and the job ends) */
    if (u->full_common) { /* every chunk is in place: the caller's barrier (share_chunks) made them everyone's */
        u->gathered = true;
        return LK_STATUS_OK;
    }
    if (f->direct) { /* the chunks straight from every rank's shards (see f->direct) */
        double t0 = lk_time_now();
        size_t cb = (size_t)u->chunk * esz(s);
        for (int k = 0; k < f->S; k++)
            memcpy(at(u->full, esz(s), u->chunk * k), k == f->sr ? u->mine : at(f->peer_shards[k], esz(s), u->shard_off), cb);
        s->stats.comm_exposed_s += lk_time_now() - t0;
        u->gathered = true;
        return LK_STATUS_OK;
    }
    double t0 = lk_time_now();
    const void *src;
    lk_status st = gather_source(s, u, &src);
    if (!st)
        st = f->S > 1 ? lk_comm_all_gather(f->shard, src, u->full, (size_t)u->chunk, s->cfg.param_dtype)
             : src != u->full ? xcopy(s->cfg.device, u->full, home(s), src, (size_t)u->chunk * esz(s))
                              : LK_STATUS_OK;
    s->stats.comm_exposed_s += lk_time_now() - t0;
    if (st) return comm_fail(f->shard, st);
    u->gathered = true;
    return LK_STATUS_OK;
}

/* Issues the unit's all-gather without waiting (a prefetch). */
static lk_status prefetch(lk_strategy *s, unit *u) {
    fsdp *f = f_of(s);
    if (!u || u->gathered || u->gather || !u->numel || f->S == 1) return LK_STATUS_OK;
    if (u->full_common) return gather(s, u); /* nothing to issue */
    if (f->direct) return gather(s, u);      /* the copy now, where the all-gather was issued (and charged) */
    LK_TRY(count_gathered(f, u, true));
    const void *src;
    LK_TRY(gather_source(s, u, &src));
    return lk_comm_all_gather_async(f->shard, src, u->full, (size_t)u->chunk, s->cfg.param_dtype, &u->gather);
}

/* The unit's whole parameters go (their pages back to the kernel). With
 * one chunk per rank (NO_SHARD) they stay: nothing would be saved. */
static void release(lk_strategy *s, unit *u) {
    fsdp *f = f_of(s);
    if (!u->gathered || f->S == 1 || f->hold || f->params_whole || u == &f->u[0]) return; /* the root stays whole */
    give_back(s, u->full, u->map_bytes);
    u->gathered = false;
    count_gathered(f, u, false);
}

/* The unit's whole gradients are about to be written again after a
 * reduction released them (or in a slot the ring just lent, which holds
 * another unit's values): each parameter's gradient is marked stale, so
 * the backward's first write overwrites it (a GEMM's beta 0, a copy for an
 * accumulation) instead of adding to it. That replaces zeroing the whole
 * buffer first: one pass over the unit's gradients, memory-bound, on the
 * step's critical path (0.6 ms a step on the autoencoder). The padding
 * between and after the parameters is written by nobody and stays zero. */
static void zero_grads(unit *u) {
    if (!u->grads_stale) return;
    u->grads_stale = false;
    for (int i = 0; i < u->np; i++) u->p[i]->lk__grad_stale = true;
}

/* Before the whole gradients are read: a parameter the backward never
 * wrote (unused this step, or its unit not reached) holds zeros, as a
 * zeroed buffer would have. */
static lk_status settle_grads(lk_strategy *s, unit *u) {
    for (int i = 0; i < u->np; i++) {
        lk_tensor *p = u->p[i];
        if (!p->lk__grad_stale) continue;
        p->lk__grad_stale = false;
        LK_TRY(mzero(s, at(u->gfull, esz(s), u->poff[i]), (size_t)p->numel * esz(s)));
    }
    return LK_STATUS_OK;
}

/* The reduce-scatter in flight finished: its unit's chunk of the averaged
 * gradients is in place, averaged over the replicas too, and the whole
 * gradients go. */
static lk_status finish_reduce(lk_strategy *s) {
    fsdp *f = f_of(s);
    unit *u = f->rs_unit;
    if (!u) return LK_STATUS_OK;
    f->rs_unit = NULL;
    lk_status st = LK_STATUS_OK;
    double t0 = lk_time_now();
    if (f->rs_work) {
        st = lk_work_wait(f->rs_work);
        lk_work_free(f->rs_work);
        f->rs_work = NULL;
        st = comm_fail(f->shard, st);
    }
    void *mine = at(s->flat_grad, esz(s), u->shard_off);
    if (!st && f->offload && f->S > 1) /* the staged chunk to its home */
        st = lk_device_copy(LK_DEVICE_CPU, mine, s->cfg.device, f->rs_stage, (size_t)u->chunk * esz(s));
    if (!st && f->R > 1) st = comm_fail(f->replica, lk_comm_all_reduce(f->replica, mine, (size_t)u->chunk,
                                                                          s->cfg.param_dtype, LK_REDUCE_AVG));
    s->stats.comm_exposed_s += lk_time_now() - t0;
    if (!in_ring(u)) give_back(s, u->gfull, u->map_bytes);
    u->grads_stale = true; /* overwritten by the next backward (zero_grads) */
    grads_gone(u);
    return st;
}

/* The unit's gradients are final: reduce-scatter them into this rank's
 * chunk (the previous unit's reduction finished first: one in flight).
 * async: on the communication thread, finished by the next reduction or
 * the backward's end; otherwise on this thread, finished here (the
 * backward's end, where nothing is left to overlap it with: as ddp's last
 * bucket, it saves two thread hand-offs and keeps the communication thread
 * off this rank's core). */
static lk_status reduce(lk_strategy *s, unit *u, bool async) {
    fsdp *f = f_of(s);
    LK_TRY(finish_reduce(s));
    u->reduced = true;
    if (!u->numel) return LK_STATUS_OK;
    LK_TRY(settle_grads(s, u));
    void *mine = at(s->flat_grad, esz(s), u->shard_off);
    s->stats.allreduce_calls++;
    s->stats.bytes_reduced += (size_t)(u->chunk * f->S) * esz(s);
    f->rs_unit = u;
    if (f->S == 1) return xcopy(home(s), mine, s->cfg.device, u->gfull, (size_t)u->chunk * esz(s));
    void *out = f->offload ? f->rs_stage : mine;
    if (async)
        return lk_comm_reduce_scatter_async(f->shard, u->gfull, out, (size_t)u->chunk, s->cfg.param_dtype, LK_REDUCE_AVG,
                                            &f->rs_work);
    double t0 = lk_time_now();
    lk_status st = lk_comm_reduce_scatter(f->shard, u->gfull, out, (size_t)u->chunk, s->cfg.param_dtype, LK_REDUCE_AVG);
    s->stats.comm_exposed_s += lk_time_now() - t0;
    if (st) return comm_fail(f->shard, st);
    return finish_reduce(s); /* the chunk's home, the replicas, the whole gradients released */
}

/* The deferred reductions, in the order the backward finished their units
 * (the same on every rank). */
static lk_status flush_pending(lk_strategy *s, bool async) {
    fsdp *f = f_of(s);
    lk_status st = LK_STATUS_OK;
    for (int i = 0; i < f->npend && !st; i++) st = reduce(s, &f->u[f->pend[i]], async);
    f->npend = 0;
    f->pend_bytes = 0;
    return st;
}

/* A unit's backward is done (a synced one). Small units wait: their
 * reductions run with the backward's last, on this thread, instead of one
 * collective handed to the communication thread per unit, whose hand-offs
 * and peer waits cost more than they overlap on a small model (the mlp's
 * second and third layers, a few hundred microseconds of backward left to
 * hide them behind). What waits stays under one largest unit's whole
 * gradients (defer_bytes), and the reduction in flight ends before one
 * more waits: beside the unit being computed, the whole gradients held
 * are at most one largest unit's, as without the wait (one in flight). A
 * unit that would pass it sends what waited, then itself, asynchronously
 * as before. */
static lk_status unit_backward_done(lk_strategy *s, unit *u) {
    fsdp *f = f_of(s);
    int64_t b = u->chunk * f->S * (int64_t)esz(s);
    if (u->numel && f->pend_bytes + b < f->defer_bytes) {
        LK_TRY(finish_reduce(s));
        u->reduced = true;
        f->pend[f->npend++] = (int)(u - f->u);
        f->pend_bytes += b;
        return LK_STATUS_OK;
    }
    /* the backward's last unit: nothing is left to overlap its reduction
     * (and what waited) with, so both run here, as the deferred ones at the
     * backward's end do, without two hand-offs to the communication thread */
    bool last = f->order_done && u->pos == 0;
    LK_TRY(flush_pending(s, !last));
    return reduce(s, u, !last);
}

/* ---- the hooks --------------------------------------------------------------------- */

static unit *at_pos(fsdp *f, int pos) { return pos >= 0 && pos < f->norder ? &f->u[f->order[pos]] : NULL; }

/* Before the unit's forward: its parameters (waiting for the prefetch),
 * and the next unit's gather issued. The first forward records the order. */
static lk_status before_forward(lk_strategy *s, unit *u) {
    fsdp *f = f_of(s);
    if (!f->order_done && u->pos < 0 && !lk_layer_recomputing()) {
        u->pos = f->norder;
        f->order[f->norder++] = (int)(u - f->u);
    }
    LK_TRY(gather(s, u));
    if (f->o.forward_prefetch && f->order_done && u->pos >= 0 && !lk_layer_recomputing())
        LK_TRY(prefetch(s, at_pos(f, u->pos + 1)));
    return LK_STATUS_OK;
}

/* The backward starts with the forward's last unit: kept gathered (FSDP's
 * too), instead of released and gathered again at once. */
static bool last_of_forward(const fsdp *f, const unit *u) { return f->order_done && u->pos == f->norder - 1; }

static lk_status on_unit(lk_layer *l, lk_layer_hook_when when, void *ctx) {
    (void)l;
    unit *u = ctx;
    fsdp *f = u->f;
    lk_strategy *s = f->s;
    switch (when) {
    case LK_LAYER_BEFORE_FORWARD:
        return before_forward(s, u);
    case LK_LAYER_AFTER_FORWARD:
        /* training: FULL_SHARD gives them back now (gathered again for the
         * backward), SHARD_GRAD_OP keeps them; a forward without a backward
         * (validation, prediction) always gives them back */
        if (!lk_grad_enabled() || (f->o.sharding != LK_FSDP_SHARD_GRAD_OP && !last_of_forward(f, u))) release(s, u);
        return LK_STATUS_OK;
    case LK_LAYER_BEFORE_BACKWARD:
        LK_TRY(grads_live(u));
        zero_grads(u);
        LK_TRY(gather(s, u));
        if (f->o.backward_prefetch && u->pos > 0) LK_TRY(prefetch(s, at_pos(f, u->pos - 1)));
        return LK_STATUS_OK;
    case LK_LAYER_AFTER_BACKWARD:
        release(s, u);
        return f->sync ? unit_backward_done(s, u) : LK_STATUS_OK;
    }
    return LK_STATUS_OK;
}

/* The root (the parameters no unit holds) stays whole on every rank: it
 * is gathered again after each optimizer step, so a forward that reaches
 * it outside any hook (a module's own code around its layers) always sees
 * current values. Its hook on the net only ends the order's recording. */
static lk_status on_root(lk_layer *l, lk_layer_hook_when when, void *ctx) {
    (void)l;
    (void)when;
    fsdp *f = ((unit *)ctx)->f;
    if (f->norder > 0) f->order_done = true;
    return LK_STATUS_OK;
}

/* ---- wrap ----------------------------------------------------------------------------- */

static lk_status build_unit(lk_strategy *s, unit *u, lk_layer *layer, const char *path, const int *owner, int id) {
    fsdp *f = f_of(s);
    u->f = f;
    u->layer = layer;
    u->pos = -1;
    if (!(u->name = lk_strdup(path))) return LK_STATUS_OUT_OF_MEMORY;
    int n = 0;
    for (int g = 0; g < f->named.n; g++) n += owner[g] == id;
    u->p = lk_calloc((size_t)n + 1, sizeof *u->p);
    u->pname = lk_calloc((size_t)n + 1, sizeof *u->pname);
    u->pglobal = lk_calloc((size_t)n + 1, sizeof *u->pglobal);
    u->poff = lk_calloc((size_t)n + 1, sizeof *u->poff);
    if (!u->p || !u->pname || !u->pglobal || !u->poff) return LK_STATUS_OUT_OF_MEMORY;
    for (int g = 0; g < f->named.n; g++) {
        if (owner[g] != id) continue;
        lk_tensor *t = f->named.items[g].tensor;
        if (t->dtype != s->cfg.param_dtype)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: parameter '%s' has dtype %s, the strategy shards %s", s->vt->name,
                            f->named.items[g].name, lk_dtype_name(t->dtype), lk_dtype_name(s->cfg.param_dtype));
        u->p[u->np] = t;
        u->pname[u->np] = f->named.items[g].name;
        u->pglobal[u->np] = g;
        u->poff[u->np] = u->numel;
        u->numel += t->numel;
        u->np++;
    }
    u->chunk = (u->numel + f->S - 1) / f->S;
    if (u->numel && u->chunk < 1) u->chunk = 1;
    long page = sysconf(_SC_PAGESIZE);
    size_t bytes = (size_t)(u->chunk * f->S) * esz(s), pg = page > 0 ? (size_t)page : 4096;
    u->map_bytes = bytes ? (bytes + pg - 1) / pg * pg : 0;
    if (!u->numel) return LK_STATUS_OK;
    void *mem = NULL;
    if (f->params_whole && in_segment(s) && s->ddp.shared_params) { /* collective: every rank, units in the same order */
        LK_TRY(lk_comm_alloc_common(f->shard, u->map_bytes, &mem, &u->full_owner));
        u->full = mem, u->full_shared = u->full_common = f->common_live = true;
    } else if (f->params_whole && in_segment(s)) { /* (a full /dev/shm or the memory cap: a private mapping, as before) */
        if (!lk_comm_alloc_shared(f->shard, u->map_bytes, &mem)) u->full = mem, u->full_shared = true;
        else lk_clear_error();
    }
    if ((!u->full && !(u->full = map_pages(s, u->map_bytes))) || !(u->gfull = u->gown = map_pages(s, u->map_bytes)))
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "%s: could not map %zu bytes for unit '%s'", s->vt->name, u->map_bytes,
                        *path ? path : "(root)");
    int64_t shape[1] = {u->chunk * f->S};
    if (!(u->full_t = lk__tensor_wrap_on(s->cfg.device, s->cfg.param_dtype, 1, shape, u->full)) ||
        !(u->gfull_t = lk__tensor_wrap_on(s->cfg.device, s->cfg.param_dtype, 1, shape, u->gfull)))
        return lk_last_status();
    return LK_STATUS_OK;
}

/* Every parameter of the unit becomes a view of its full buffer (values
 * copied in), with its gradient a view of gfull. */
static lk_status rehome(lk_strategy *s, unit *u) {
    for (int i = 0; i < u->np; i++) {
        lk_tensor *p = u->p[i];
        /* into the node's one copy only rank 0's values go (the others wait at setup's barrier) */
        LK_TRY(lk__tensor_rehome(p, u->full_t, u->poff[i], !u->full_common || u->full_owner));
        lk_tensor *g = lk__tensor_wrap_on(s->cfg.device, s->cfg.param_dtype, p->ndim, p->shape,
                                          at(u->gfull, esz(s), u->poff[i]));
        if (!g) return lk_last_status();
        lk_tensor_release(p->grad);
        p->grad = g;
    }
    return LK_STATUS_OK;
}

/* (lk_layer_materialize_some) Whether t is one of unit u's parameters. */
static bool in_unit(const lk_tensor *t, void *ctx) {
    const unit *u = ctx;
    for (int i = 0; i < u->np; i++)
        if (u->p[i] == t) return true;
    return false;
}

static lk_status f_wrap(lk_strategy *s, lk_layer *net) {
    fsdp *f = f_of(s);
    /* A deferred model (lk_model_create_deferred) is materialised here one
     * unit at a time, each copied into its whole buffer, its chunk kept and
     * its pages given back before the next is drawn: the rank's peak holds
     * its shards and one unit, never the model. Every rank draws the same
     * values from the seed, so nothing is broadcast. */
    bool deferred = net->deferred;
    LK_TRY(lk_layer_named_parameters(net, &f->named));
    LK_TRY(lk_layer_named_buffers(net, &s->local_buffers));
    pick k = {0};
    lk_status st = LK_STATUS_OK;
    const char *types = f->o.wrap_types;
    if (types && !strcmp(types, "none")) {
    } else if (types && *types) st = pick_types(net, "", types, &k);
    else if (f->o.min_num_params > 0) (void)pick_size(net, "", f->o.min_num_params, &k, &st);
    else st = pick_default(net, &k);
    if (!st && types && *types && strcmp(types, "none") && k.n == 0)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: auto_wrap_policy '%s' names no layer of this model (its layer "
                      "classes are the types the model summary lists)", s->vt->name, types);
    int *owner = st ? NULL : lk_malloc(((size_t)f->named.n + 1) * sizeof *owner);
    if (!st && !owner) st = LK_STATUS_OUT_OF_MEMORY;
    for (int g = 0; !st && g < f->named.n; g++) owner[g] = -1;
    if (!st) assign(net, &k, 0, &f->named, owner);
    for (int g = 0; !st && g < f->named.n; g++)
        if (owner[g] < 0) owner[g] = 0;
    /* the units: the root, then every picked layer that holds a parameter */
    if (!st && !(f->u = lk_calloc((size_t)k.n + 1, sizeof *f->u))) st = LK_STATUS_OUT_OF_MEMORY;
    if (!st && !(f->order = lk_calloc((size_t)k.n + 1, sizeof *f->order))) st = LK_STATUS_OUT_OF_MEMORY;
    if (!st) {
        f->nu = 1;
        st = build_unit(s, &f->u[0], NULL, "", owner, 0);
    }
    for (int j = 0; !st && j < k.n; j++) {
        bool any = false;
        for (int g = 0; g < f->named.n && !any; g++) any = owner[g] == j + 1;
        if (!any) continue;
        st = build_unit(s, &f->u[f->nu], k.v[j], k.path[j], owner, j + 1);
        if (!st) f->nu++;
    }
    for (int j = 0; j < k.n; j++) lk_free(k.path[j]);
    lk_free(k.v);
    lk_free(k.path);
    lk_free(owner);
    LK_TRY(st);
    /* reductions wait while their units' whole gradients stay under the
     * largest unit's (unit_backward_done) and under ddp's bucket size */
    if (!(f->pend = lk_calloc((size_t)f->nu + 1, sizeof *f->pend))) return LK_STATUS_OUT_OF_MEMORY;
    double cap = s->ddp.bucket_cap_mb * 1024 * 1024;
    for (int i = 1; i < f->nu; i++) {
        int64_t b = f->u[i].chunk * f->S * (int64_t)esz(s);
        if (b > f->defer_bytes) f->defer_bytes = b;
    }
    if ((double)f->defer_bytes > cap) f->defer_bytes = (int64_t)cap;
    /* On by default on the CPU (LK_SHARD_INLINE=0 hands every unit's
     * reduction to the communication thread as it finishes). Measured in
     * alternating fits with one core per rank (docs/STRATEGIES.md): stage
     * 2 on the mlp 1.05-1.06x the asynchronous schedule on an idle machine
     * and 1.5x with the cores contended; the autoencoder and fsdp alike
     * either way. A hand-off costs a thread wake-up, and that thread takes
     * its core from the rank's own compute. On a GPU the communication
     * thread takes no core from the kernels and nothing was measured, so
     * the hand-offs stay (LK_SHARD_INLINE=1 asks for the other). */
    f->inline_sched = lk_env_get_long("LK_SHARD_INLINE", on_host(s) ? 1 : 0) == 1;
    if (!f->inline_sched) f->defer_bytes = 0;
    /* rank 0's values everywhere (as ddp's broadcast), then each rank's
     * chunk into the master shards; the whole copies go */
    int64_t total = 0;
    for (int i = 0; i < f->nu; i++) {
        unit *u = &f->u[i];
        u->shard_off = total;
        total += (u->chunk + 15) / 16 * 16; /* each chunk 64-byte aligned */
        if (u->numel) f->nshard++;
    }
    f->shard_numel = total;
    size_t sbytes = (size_t)(total ? total : 1) * esz(s);
    f->shard_bytes = (sbytes + LK_ALIGN - 1) / LK_ALIGN * LK_ALIGN;
    void *mem = NULL; /* (stage 2's chunks live in its whole parameters; a failure: private memory, as before) */
    if (in_segment(s) && !f->params_whole && !lk_comm_alloc_shared(f->shard, f->shard_bytes, &mem)) {
        f->shards = mem; /* (zeroed) */
        f->shards_shared = true;
    } else if (lk_device_is_host(home(s))) {
        lk_clear_error();
        if (!(f->shards = lk_aligned_alloc(LK_ALIGN, f->shard_bytes))) return LK_STATUS_OUT_OF_MEMORY;
        memset(f->shards, 0, sbytes);
    } else {
        LK_TRY(lk_device_alloc(home(s), f->shard_bytes, &f->shards));
        LK_TRY(lk_device_memset(home(s), f->shards, 0, sbytes));
    }
    if (f->offload) { /* the reduce-scatters' device landing place: the largest chunk */
        for (int i = 0; i < f->nu; i++)
            if ((size_t)f->u[i].chunk * esz(s) > f->rs_stage_bytes) f->rs_stage_bytes = (size_t)f->u[i].chunk * esz(s);
        if (f->rs_stage_bytes) LK_TRY(lk_device_alloc(s->cfg.device, f->rs_stage_bytes, &f->rs_stage));
    }
    int64_t n1[1] = {total};
    if (!(f->shards_t = lk__tensor_wrap_on(home(s), s->cfg.param_dtype, 1, n1, f->shards))) return lk_last_status();
    /* the optimizer's parameters: arrays strategy.c frees after its last use of them */
    s->local_arr = lk_calloc((size_t)f->nshard + 1, sizeof *s->local_arr);
    s->local_names = lk_calloc((size_t)f->nshard + 1, sizeof *s->local_names);
    f->shard_unit = lk_calloc((size_t)f->nshard + 1, sizeof *f->shard_unit);
    if (!s->local_arr || !s->local_names || !f->shard_unit) return LK_STATUS_OUT_OF_MEMORY;
    int j = 0;
    for (int i = 0; i < f->nu; i++) {
        unit *u = &f->u[i];
        if (!u->numel) continue;
        if (deferred) LK_TRY(lk_layer_materialize_some(net, in_unit, u));
        LK_TRY(rehome(s, u));
        if (u->full_common) LK_TRY(lk_comm_barrier(f->shard)); /* rank 0's values are in: everyone's */
        else if (s->world > 1 && !deferred)
            LK_TRY(lk_comm_broadcast(s->comm, u->full, (size_t)u->numel, s->cfg.param_dtype, 0));
        bool inside = f->params_whole && !f->offload; /* stage 2's master chunk is its place in the whole values */
        u->mine = inside ? at(u->full, esz(s), u->chunk * f->sr) : at(f->shards, esz(s), u->shard_off);
        LK_TRY(keep_chunk(s, u));
        u->gathered = true;
        LK_TRY(count_gathered(f, u, true));
        release(s, u); /* (the root stays) */
        /* what the optimizer sees: the unit's chunk, FSDP's flat parameter */
        char name[600];
        snprintf(name, sizeof name, "%s%s_flat_param", u->name, *u->name ? "." : "");
        lk_tensor *t = inside ? lk_tensor_view_storage(u->full_t, u->chunk * f->sr, 1, (int64_t[]){u->chunk})
                              : lk_tensor_view_storage(f->shards_t, u->shard_off, 1, (int64_t[]){u->chunk});
        if (!t) return lk_last_status();
        t->requires_grad = true;
        f->shard_unit[j] = i;
        lk_status st2 = lk_named_tensors_append(&s->local, name, t);
        lk_tensor_release(t);
        LK_TRY(st2);
        s->local_arr[j] = t;
        s->local_names[j] = s->local.items[j].name;
        j++;
    }
    /* the buffers last (a BatchNorm's reset fills them; its parameters,
     * hidden now, are not drawn again) */
    if (deferred) LK_TRY(lk_layer_materialize(net));
    /* the gradient ring (see take_slot), unless a memory limit is set: it
     * is resident from here on, where the private mappings hold memory
     * only from a unit's backward to its reduction (up to one largest
     * unit's gradients more at the backward's start, all of the ring in
     * the forward), and under a limit the smallest footprint wins. Without
     * it (a limit, a full /dev/shm) every unit keeps its own mapping. */
    size_t largest = 0;
    for (int i = 1; i < f->nu; i++)
        if (f->u[i].numel && slot_bytes(&f->u[i]) > largest) largest = slot_bytes(&f->u[i]);
    if (in_segment(s) && largest && !lk_alloc_limit()) {
        f->gq_cap = 2 * f->nu + 2;
        if (!(f->gq = lk_calloc((size_t)f->gq_cap, sizeof *f->gq))) return LK_STATUS_OUT_OF_MEMORY;
        void *ring = NULL;
        if (!lk_comm_alloc_shared(f->shard, 2 * largest, &ring)) f->gring = ring, f->gring_cap = 2 * largest;
        else lk_clear_error();
    }
    /* fsdp on one node over shm: from here the gathers read the peers'
     * chunks in place (f->direct), once every rank's are in. The same test
     * on every rank (a rank whose shards fell back to private memory passes
     * NULL, and then no rank reads in place). */
    if (in_segment(s) && !f->params_whole && f->shard == s->comm) {
        if (!(f->peer_shards = lk_calloc((size_t)f->S, sizeof *f->peer_shards))) return LK_STATUS_OUT_OF_MEMORY;
        LK_TRY(lk_comm_peer_blocks(f->shard, f->shards_shared ? f->shards : NULL, f->peer_shards, &f->direct));
        if (f->direct) LK_TRY(lk_comm_barrier(f->shard));
    }
    if (s->rank == 0) { /* what was wrapped, once: the units, the root, the chunks */
        char line[1024];
        size_t len = (size_t)snprintf(line, sizeof line, "%s: %d unit%s (%s), %s %s", s->vt->name, f->nu - 1,
                                      f->nu == 2 ? "" : "s",
                                      f->o.wrap_types[0] ? f->o.wrap_types
                                      : f->o.min_num_params > 0 ? "min_num_params" : "default policy",
                                      f->common_live    ? "parameters whole (one copy on the node, chunks written in place),"
                                      : f->params_whole ? "parameters whole," : lk_fsdp_sharding_name(f->o.sharding),
                                      f->S > 1 ? "over" : "");
        if (f->S > 1 && len < sizeof line) len += (size_t)snprintf(line + len, sizeof line - len, " %d ranks:", f->S);
        for (int i = 1; i < f->nu && len < sizeof line; i++)
            if (i < 3 || i == f->nu - 1)
                len += (size_t)snprintf(line + len, sizeof line - len, " [%s: %lld params]", f->u[i].name, (long long)f->u[i].numel);
            else if (i == 3)
                len += (size_t)snprintf(line + len, sizeof line - len, " ..");
        if (len < sizeof line)
            len += (size_t)snprintf(line + len, sizeof line - len, " [root: %lld params, kept whole]",
                                    (long long)f->u[0].numel);
        if (f->direct && len < sizeof line)
            len += (size_t)snprintf(line + len, sizeof line - len, "; gathers read the peers' chunks in place");
        if (f->gring && len < sizeof line)
            len += (size_t)snprintf(line + len, sizeof line - len,
                                    "; whole gradients reduced in place from a %.1f MiB ring in shared memory",
                                    (double)f->gring_cap / (1024.0 * 1024.0));
        if (f->offload && len < sizeof line)
            snprintf(line + len, sizeof line - len, "; cpu_offload: master chunks, their gradients and the optimizer "
                     "state in host memory, the optimizer on the CPU");
        lk_log0("%s", line);
    }
    /* the hooks: the root on the net, each unit on its layer */
    LK_TRY(lk_layer_add_hook(net, LK_LAYER_AFTER_FORWARD, on_root, &f->u[0]));
    for (int i = 1; i < f->nu; i++) {
        for (int w = 0; w < 4; w++) LK_TRY(lk_layer_add_hook(f->u[i].layer, (lk_layer_hook_when)w, on_unit, &f->u[i]));
        /* a unit fed the data (no gradient wanted) is reduced after the backward instead of
         * paying for an input gradient nobody reads (f_finish_backward reduces what was not) */
        LK_TRY(lk_layer_set_after_backward_optional(f->u[i].layer, true));
    }
    /* the parameters' old storage (the whole model, built on every rank) is
     * in the storage pool now, counted as live: given back */
    lk_pool_trim();
    int nb = s->local_buffers.n;
    if (!(s->buffer_arr = lk_calloc((size_t)nb + 1, sizeof *s->buffer_arr))) return LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; i < nb; i++) s->buffer_arr[i] = s->local_buffers.items[i].tensor;
    return lk_strategy_setup(s, s->local_arr, s->local_names, f->nshard, s->buffer_arr, nb);
}

/* The shards' gradients: one flat buffer (zeroed by lk_strategy_zero_grad);
 * the buffers from rank 0, as ddp starts. */
static lk_status f_setup(lk_strategy *s) {
    fsdp *f = f_of(s);
    LK_TRY(lk__strategy_alloc_flat(s, f->shard_numel));
    /* the shard tensors are views at their units' offsets, not packed: each
     * one's gradient is the view at the same offset */
    for (int j = 0; j < f->nshard; j++) {
        lk_tensor *t = s->local_arr[j];
        lk_tensor *g = lk__tensor_wrap_on(home(s), s->cfg.param_dtype, 1, t->shape,
                                          at(s->flat_grad, esz(s), f->u[f->shard_unit[j]].shard_off));
        if (!g) return lk_last_status();
        lk_tensor_release(t->grad);
        t->grad = g;
    }
    for (int i = 0; i < s->nbuffers && s->world > 1; i++) {
        lk_tensor *b = s->buffers[i];
        LK_TRY(lk_comm_broadcast(s->comm, b->data, (size_t)b->numel, b->dtype, 0));
    }
    return LK_STATUS_OK;
}

static void f_free(lk_strategy *s) {
    fsdp *f = f_of(s);
    if (!f) return;
    if (f->rs_work) {
        (void)lk_work_wait(f->rs_work);
        lk_work_free(f->rs_work);
    }
    for (int i = 0; i < f->nu; i++) {
        unit *u = &f->u[i];
        if (u->gather) {
            (void)lk_work_wait(u->gather);
            lk_work_free(u->gather);
            u->gather = NULL;
            u->gathered = true; /* (charged when it was issued) */
        }
        /* the net outlives the strategy: its parameters leave the mappings
         * with the values last gathered (lk_strategy_state_dict gathers them
         * all first), their gradients with theirs */
        for (int k = 0; k < u->np && u->full; k++) {
            lk_tensor *p = u->p[k];
            if (p->storage && p->data >= u->full && (char *)p->data < (char *)u->full + u->map_bytes)
                (void)lk__tensor_own_storage(p);
            if (p->grad && p->grad->data >= u->gfull && (char *)p->grad->data < (char *)u->gfull + u->map_bytes) {
                lk_tensor *own = lk_tensor_to(p->grad, p->grad->device);
                lk_tensor_release(p->grad);
                p->grad = own;
                if (own && p->lk__grad_stale) lk_tensor_zero_grad(p, false); /* (never written since the last step) */
            }
        }
        if (u->gathered && u->numel) count_gathered(f, u, false); /* what was charged goes back */
        grads_gone(u);
        lk_tensor_release(u->full_t);
        lk_tensor_release(u->gfull_t);
        if (u->full_common) { /* the owner frees it, as ddp_free its shared parameters */
            if (u->full_owner) lk_comm_free_shared(f->shard, u->full);
        } else if (u->full_shared) lk_comm_free_shared(f->shard, u->full);
        else unmap_pages(s, u->full, u->map_bytes);
        unmap_pages(s, u->gown, u->map_bytes);
        lk_free(u->name);
        lk_free(u->p);
        lk_free(u->pname);
        lk_free(u->pglobal);
        lk_free(u->poff);
    }
    if (s->net) lk_layer_clear_hooks(s->net);
    for (int i = 1; i < f->nu; i++) lk_layer_clear_hooks(f->u[i].layer);
    if (f->gring) lk_comm_free_shared(f->shard, f->gring);
    lk_free(f->gq);
    lk_free(f->u);
    lk_free(f->pend);
    lk_free(f->order);
    lk_named_tensors_clear(&f->named);
    lk_free(f->shard_unit);
    lk_free(f->peer_shards);
    lk_tensor_release(f->shards_t);
    if (f->shards_shared) lk_comm_free_shared(f->shard, f->shards);
    else if (lk_device_is_host(home(s))) lk_aligned_free(f->shards);
    else lk_device_free(home(s), f->shards, f->shard_bytes);
    if (f->rs_stage) lk_device_free(s->cfg.device, f->rs_stage, f->rs_stage_bytes);
    if (f->own_groups) {
        lk_comm_free(f->shard);
        lk_comm_free(f->replica);
    }
    lk_free(f);
    s->self = NULL;
}

/* ---- the step ----------------------------------------------------------------------- */

static void release_held(lk_strategy *s) {
    fsdp *f = f_of(s);
    if (!f->hold) return;
    f->hold = false;
    for (int i = 0; i < f->nu; i++) release(s, &f->u[i]);
}

static lk_status f_before_forward(lk_strategy *s) {
    release_held(s);
    LK_TRY(grads_live(&f_of(s)->u[0])); /* the root's gradients, for the backward to come */
    return gather(s, &f_of(s)->u[0]);
}

static void f_begin_backward(lk_strategy *s, bool sync) {
    fsdp *f = f_of(s);
    f->sync = sync;
    zero_grads(&f->u[0]); /* the root's gradients come from anywhere in the backward (charged before the forward) */
    for (int i = 0; i < f->nu && sync; i++) f->u[i].reduced = false;
}

/* After the backward: the root's gradients reduced (after the last unit's
 * reduce-scatter, still in flight, then both waited for). Units the
 * backward did not reach (no gradient flowed through them) are reduced
 * too, so every rank issues the same collectives. */
static lk_status f_finish_backward(lk_strategy *s) {
    fsdp *f = f_of(s);
    lk_status st = f->sync ? flush_pending(s, false) : LK_STATUS_OK;
    for (int i = f->nu - 1; f->sync && i >= 0 && !st; i--)
        if (!f->u[i].reduced) {
            zero_grads(&f->u[i]); /* (a unit the backward did not reach: no gradient, zeros reduced) */
            st = reduce(s, &f->u[i], false);
        }
    if (!st) st = finish_reduce(s);
    for (int i = 0; i < f->nu; i++) {
        unit *u = &f->u[i];
        if (u->gather) { /* a prefetch nobody waited for (a unit the backward skipped) */
            lk_status w = lk_work_wait(u->gather);
            lk_work_free(u->gather);
            u->gather = NULL;
            u->gathered = true;
            if (!st) st = comm_fail(f->shard, w);
        }
        release(s, u);
    }
    return st;
}

/* Stage 2 on the node's one copy, or fsdp reading its peers' chunks in
 * place (f->direct): every rank wrote its chunks (its optimizer, or a
 * checkpoint's load); once all have, they are everyone's. The gradient reduce-scatters before a step keep any rank
 * from writing while another still reads the parameters in its backward.
 * Timed as the all-gathers it replaces. Collective (a no-op elsewhere). */
static lk_status share_chunks(lk_strategy *s) {
    fsdp *f = f_of(s);
    if (!f->common_live && !f->direct) return LK_STATUS_OK;
    double t0 = lk_time_now();
    lk_status st = lk_comm_barrier(f->shard);
    s->stats.comm_exposed_s += lk_time_now() - t0;
    return comm_fail(f->shard, st);
}

/* The optimizer updated the chunks: every gathered copy is stale; the
 * root is gathered again at once (it stays whole). After a skipped step
 * too: every rank issues the same collectives. */
static lk_status f_after_step(lk_strategy *s) {
    fsdp *f = f_of(s);
    LK_TRY(share_chunks(s));
    if (f->norder > 0) f->order_done = true;
    f->hold = false;
    for (int i = 0; i < f->nu; i++) {
        unit *u = &f->u[i];
        if (f->S == 1 || i == 0 || f->params_whole) {
            if (u->gathered) count_gathered(f, u, false);
            u->gathered = false; /* refreshed below (the root; every unit of stage 2) or at the next use */
        } else release(s, u);
    }
    /* stage 2: the units the next forward reaches first are gathered here,
     * on this thread, up to ddp's bucket size (a small model's all: one
     * hand-off to the communication thread per unit cost more than the
     * loader's wait and the first unit's forward hide, and the first
     * unit's forward waits for its own gather at once); the rest are
     * issued now and waited for by their forward's hook, overlapping the
     * forwards of the units before them. In the forward's order: the same
     * on every rank. */
    if (f->params_whole) {
        double cap = f->inline_sched ? s->ddp.bucket_cap_mb * 1024 * 1024 : 0, done = 0;
        for (int p = 0; p < f->norder; p++) {
            unit *u = at_pos(f, p);
            done += (double)u->map_bytes;
            LK_TRY(done <= cap ? gather(s, u) : prefetch(s, u));
        }
        for (int i = 1; i < f->nu; i++) /* units no forward reached (yet) */
            if (f->u[i].pos < 0) LK_TRY(prefetch(s, &f->u[i]));
    }
    return gather(s, &f->u[0]);
}

/* Clipping by the total norm: each original parameter's raw norm over the
 * part of it in this rank's chunks, summed (max for inf) over the shard
 * group, then combined in the net's parameter order exactly as
 * lk_clip_grad_norm does; only the split of each sum differs from ddp's. */
static lk_status f_clip_grad_norm(lk_strategy *s, double max_norm, double norm_type) {
    fsdp *f = f_of(s);
    if (!(norm_type > 0.0)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "clip_grad_norm: norm_type must be > 0 (or INFINITY), got %g", norm_type);
    bool inf = isinf(norm_type);
    int n = f->named.n;
    double *norms = lk_calloc((size_t)n + 1, sizeof *norms);
    if (!norms) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = LK_STATUS_OK;
    /* on a device the norms are written where the gradients are, then read back (n doubles) */
    lk_device gd = home(s); /* where the gradient chunks are */
    lk_tensor *dn = lk_device_is_host(gd) ? NULL : lk__tensor_new_on(gd, LK_F64, 1, (int64_t[]){n + 1});
    double *out = dn ? dn->data : norms;
    if (!lk_device_is_host(gd) && !dn) st = lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
    if (dn && !st) st = lk_device_memset(gd, dn->data, 0, (size_t)(n + 1) * sizeof(double));
    for (int i = 0; i < f->nu && !st; i++) {
        unit *u = &f->u[i];
        int64_t lo = u->chunk * f->sr, hi = lo + u->chunk;
        for (int k = 0; k < u->np && !st; k++) {
            int64_t a = u->poff[k] > lo ? u->poff[k] : lo, b = u->poff[k] + u->p[k]->numel < hi ? u->poff[k] + u->p[k]->numel : hi;
            if (b <= a) continue;
            lk_op_desc nd = {.op = LK_OP_NORM, .dtype = {s->cfg.param_dtype, LK_F64}};
            nd.norm = (lk_norm_params){b - a, inf ? INFINITY : norm_type};
            st = lk__backend_run(gd, &nd, (void *[]){at(s->flat_grad, esz(s), u->shard_off + a - lo), &out[u->pglobal[k]]});
        }
    }
    if (dn && !st) st = lk_device_copy(LK_DEVICE_CPU, norms, gd, dn->data, (size_t)n * sizeof(double));
    lk_tensor_release(dn);
    if (!st && f->S > 1) st = lk_comm_all_reduce(f->shard, norms, (size_t)n, LK_F64, inf ? LK_REDUCE_MAX : LK_REDUCE_SUM);
    float coef = st || n == 0 ? 1.0f : lk_k_clip_coef_of(lk_k_clip_total(norms, n, inf ? INFINITY : norm_type), max_norm);
    lk_free(norms);
    LK_TRY(st);
    if (s->flat_numel)
        LK_TRY(lk__affine(gd, s->cfg.param_dtype, s->flat_numel, coef, 0.0f, false, s->flat_grad, s->flat_grad));
    return LK_STATUS_OK;
}

/* ---- the state ------------------------------------------------------------------------- */

/* The whole model for a checkpoint: every unit gathered (collective, in
 * unit order) and held until the next forward. */
static lk_status f_state_dict(lk_strategy *s, lk_layer *net, lk_named_tensors *out) {
    fsdp *f = f_of(s);
    f->hold = false;
    f->saving = true; /* the whole model for a moment: not what a step holds (the peak reported) */
    lk_status st = LK_STATUS_OK;
    for (int i = 0; i < f->nu && !st; i++) st = gather(s, &f->u[i]);
    f->saving = false;
    f->hold = true;
    LK_TRY(st);
    return lk_state_dict_get(net, out);
}

/* A whole checkpoint was loaded into the parameters (into the units' full
 * buffers, every rank): each rank keeps its chunks. */
static lk_status f_state_dict_loaded(lk_strategy *s) {
    fsdp *f = f_of(s);
    f->hold = false;
    for (int i = 0; i < f->nu; i++) {
        unit *u = &f->u[i];
        if (!u->numel) continue;
        LK_TRY(keep_chunk(s, u));
        if (!u->gathered) {
            u->gathered = true;
            LK_TRY(count_gathered(f, u, true));
        }
        release(s, u);
    }
    return share_chunks(s); /* the peers read these chunks in place: every rank's are in first */
}

/* The optimizer's state under the net's parameter names, as a replica
 * strategy's optimizer writes it: each unit's chunk state all-gathered and
 * cut per parameter (collective). */
static const char *const state_arrays[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"};

#define NARRAYS ((int)(sizeof state_arrays / sizeof *state_arrays))

static lk_status f_optimizer_state(lk_strategy *s, lk_optimizer *o, lk_named_tensors *out, bool arrays) {
    fsdp *f = f_of(s);
    lk_named_tensors mine = {0};
    lk_status st = lk__optimizer_state_get_ex(o, &mine, arrays);
    int n = f->named.n;
    /* each parameter's unit and place in it; each unit's arrays gathered whole */
    int *gu = lk_calloc((size_t)n + 1, sizeof *gu), *gk = lk_calloc((size_t)n + 1, sizeof *gk);
    int *shard_of = lk_calloc((size_t)f->nu + 1, sizeof *shard_of);
    float **whole = lk_calloc((size_t)(f->nshard * NARRAYS) + 1, sizeof *whole);
    if (!st && (!gu || !gk || !shard_of || !whole)) st = LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; !st && i < f->nu; i++)
        for (int k = 0; k < f->u[i].np; k++) {
            gu[f->u[i].pglobal[k]] = i;
            gk[f->u[i].pglobal[k]] = k;
        }
    for (int j = 0; !st && j < f->nshard; j++) shard_of[f->shard_unit[j]] = j;
    char key[700];
    for (int j = 0; !st && j < f->nshard; j++) {
        unit *u = &f->u[f->shard_unit[j]];
        for (int a = 0; !st && a < NARRAYS; a++) {
            snprintf(key, sizeof key, "state.%s.%s", s->local_names[j], state_arrays[a]);
            lk_tensor *t = lk_named_tensors_find(&mine, key);
            if (!t) continue; /* every rank has the same arrays: the same optimizer, the same steps */
            /* on a device the optimizer gave a device copy: gathered on the host (the checkpoint's side) */
            lk_tensor *h = lk_device_is_host(t->device) ? lk_tensor_retain(t) : lk_tensor_to(t, LK_DEVICE_CPU);
            float *w = whole[j * NARRAYS + a] = lk_aligned_alloc(LK_ALIGN, (size_t)(u->chunk * f->S) * sizeof(float) + LK_ALIGN);
            if (!h) st = lk_last_status();
            else if (!w) st = LK_STATUS_OUT_OF_MEMORY;
            else if (f->S > 1) st = lk_comm_all_gather(f->shard, h->data, w, (size_t)u->chunk, LK_F32);
            else memcpy(w, h->data, (size_t)u->chunk * sizeof(float));
            lk_tensor_release(h);
        }
    }
    /* in lk_optimizer_state_get's order: the groups, every step, then each parameter's arrays */
    for (int i = 0; !st && i < mine.n; i++)
        if (strncmp(mine.items[i].name, "state.", 6)) st = lk_named_tensors_append(out, mine.items[i].name, mine.items[i].tensor);
    for (int g = 0; !st && g < n; g++) {
        snprintf(key, sizeof key, "state.%s.step", s->local_names[shard_of[gu[g]]]);
        lk_tensor *step = lk_named_tensors_find(&mine, key);
        snprintf(key, sizeof key, "state.%s.step", f->named.items[g].name);
        if (step) st = lk_named_tensors_append(out, key, step);
    }
    for (int g = 0; !st && g < n; g++) {
        unit *u = &f->u[gu[g]];
        lk_tensor *p = u->p[gk[g]];
        for (int a = 0; !st && a < NARRAYS; a++) {
            const float *w = whole[shard_of[gu[g]] * NARRAYS + a];
            if (!w) continue;
            lk_tensor *v = lk_tensor_from_data(LK_F32, p->ndim, p->shape, w + u->poff[gk[g]]);
            if (!v) st = lk_last_status();
            snprintf(key, sizeof key, "state.%s.%s", f->named.items[g].name, state_arrays[a]);
            if (!st) st = lk_named_tensors_append(out, key, v);
            lk_tensor_release(v);
        }
    }
    for (int j = 0; whole && j < f->nshard * NARRAYS; j++) lk_aligned_free(whole[j]);
    lk_free(whole);
    lk_free(gu);
    lk_free(gk);
    lk_free(shard_of);
    lk_named_tensors_clear(&mine);
    return st;
}

/* The inverse: a state under the net's names (from any strategy's
 * checkpoint) cut into this rank's chunks. */
static lk_status f_optimizer_state_load(lk_strategy *s, lk_optimizer *o, const lk_named_tensors *state) {
    fsdp *f = f_of(s);
    lk_named_tensors conv = {0};
    lk_status st = LK_STATUS_OK;
    for (int i = 0; !st && i < state->n; i++)
        if (strncmp(state->items[i].name, "state.", 6)) st = lk_named_tensors_append(&conv, state->items[i].name, state->items[i].tensor);
    for (int j = 0; !st && j < f->nshard; j++) {
        unit *u = &f->u[f->shard_unit[j]];
        char key[700];
        snprintf(key, sizeof key, "state.%s.step", u->pname[0]);
        lk_tensor *step = lk_named_tensors_find(state, key);
        if (step) {
            snprintf(key, sizeof key, "state.%s.step", s->local_names[j]);
            st = lk_named_tensors_append(&conv, key, step);
        }
        int64_t lo = u->chunk * f->sr, hi = lo + u->chunk;
        for (int a = 0; !st && a < NARRAYS; a++) {
            snprintf(key, sizeof key, "state.%s.%s", u->pname[0], state_arrays[a]);
            if (!lk_named_tensors_find(state, key)) continue;
            lk_tensor *c = lk_tensor_zeros(LK_F32, 1, (int64_t[]){u->chunk});
            if (!c) st = lk_last_status();
            for (int k = 0; !st && k < u->np; k++) {
                snprintf(key, sizeof key, "state.%s.%s", u->pname[k], state_arrays[a]);
                lk_tensor *v = lk_named_tensors_find(state, key);
                if (!v || v->dtype != LK_F32 || v->numel != u->p[k]->numel || !lk_tensor_is_contiguous(v)) {
                    st = lk_error(LK_STATUS_INVALID_ARGUMENT, "optimizer state: '%s' is %s (expected %lld f32 elements, "
                                  "as every parameter of its FSDP unit has)", key, v ? "of another shape or dtype" : "missing",
                                  (long long)u->p[k]->numel);
                    break;
                }
                int64_t s0 = u->poff[k], e0 = s0 + v->numel, a0 = s0 > lo ? s0 : lo, b0 = e0 < hi ? e0 : hi;
                if (b0 > a0) /* (both where the process's default device put them: a GPU's in a GPU run) */
                    st = lk_device_copy(c->device, (float *)c->data + (a0 - lo), v->device,
                                        (const float *)v->data + (a0 - s0), (size_t)(b0 - a0) * sizeof(float));
            }
            snprintf(key, sizeof key, "state.%s.%s", s->local_names[j], state_arrays[a]);
            if (!st) st = lk_named_tensors_append(&conv, key, c);
            lk_tensor_release(c);
        }
    }
    if (!st) st = lk_optimizer_state_load(o, &conv);
    lk_named_tensors_clear(&conv);
    return st;
}

/* A sharded checkpoint's pieces (docs/CHECKPOINTS.md): each parameter's
 * intersection with this rank's chunk of its unit, its values in the
 * master chunk and its optimizer state in the chunk's arrays. Not a
 * collective. */
static lk_status f_shard_pieces(lk_strategy *s, lk_shard_piece **out, int *n) {
    fsdp *f = f_of(s);
    lk_optimizer *o = f->optim;
    int arrays = o ? lk__optimizer_state_arrays(o) : 0;
    if (arrays > LK_SHARD_MAX_STATE)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s: a sharded checkpoint holds at most %d optimizer state arrays "
                        "(this optimizer has %d)", s->vt->name, LK_SHARD_MAX_STATE, arrays);
    lk_shard_piece *p = lk_calloc((size_t)f->named.n + 1, sizeof *p);
    if (!p) return LK_STATUS_OUT_OF_MEMORY;
    int m = 0;
    for (int j = 0; j < f->nshard; j++) {
        unit *u = &f->u[f->shard_unit[j]];
        int64_t lo = u->chunk * f->sr, hi = lo + u->chunk;
        for (int k = 0; k < u->np; k++) {
            lk_tensor *t = u->p[k];
            int64_t s0 = u->poff[k], a = s0 > lo ? s0 : lo, b = s0 + t->numel < hi ? s0 + t->numel : hi;
            if (b <= a) continue;
            p[m] = (lk_shard_piece){.name = u->pname[k], .dtype = t->dtype, .ndim = t->ndim, .shape = t->shape,
                                    .numel = t->numel, .lo = a - s0, .hi = b - s0, .value = at(u->mine, esz(s), a - lo)};
            for (int q = 0; q < arrays; q++) {
                float *st = lk__optimizer_state_of(o, s->local_arr[j], q);
                if (!st) continue;
                p[m].state[p[m].nstate++] = st + (a - lo);
            }
            m++;
        }
    }
    *out = p;
    *n = m;
    return LK_STATUS_OK;
}

/* Every rank filled its chunks: the whole copies are stale; the root (and
 * every unit of stage 2) is gathered again at once, the other units at
 * their next use. Collective. */
static lk_status f_shard_pieces_loaded(lk_strategy *s) {
    fsdp *f = f_of(s);
    LK_TRY(share_chunks(s));
    f->hold = false;
    for (int i = 0; i < f->nu; i++) {
        unit *u = &f->u[i];
        if (u->gathered) count_gathered(f, u, false);
        u->gathered = false;
    }
    for (int i = 0; i < f->nu; i++)
        if (i == 0 || f->params_whole || f->S == 1) LK_TRY(gather(s, &f->u[i]));
    return LK_STATUS_OK;
}

static lk_status f_shard_optimizer(lk_strategy *s, lk_optimizer *o) {
    f_of(s)->optim = o;
    if (o && lk_optimizer_num_groups(o) != 1)
        return lk_error(LK_STATUS_UNSUPPORTED, "%s updates each unit's flat chunk with one parameter group (this optimizer "
                        "has %d: optimizer.weight_decay_params other than all splits them); use ddp or deepspeed_stage_1/2 "
                        "for several groups", s->vt->name, lk_optimizer_num_groups(o));
    return LK_STATUS_OK;
}

static void f_memory(const lk_strategy *s, lk_strategy_memory *m) {
    const fsdp *f = f_of(s);
    m->param_bytes = f->shard_numel * (int64_t)esz(s);
    m->grad_bytes = f->shard_numel * (int64_t)esz(s);
    m->gathered_bytes = f->peak_gathered_bytes;
    if (f->params_whole) { /* stage 2: the whole (padded) parameters, the master chunks inside them */
        m->param_bytes = 0;
        for (int i = 0; i < f->nu; i++) m->param_bytes += f->u[i].chunk * f->S * (int64_t)esz(s);
        m->gathered_bytes = 0;
    }
}

static lk_status f_join(lk_strategy *s) {
    return lk_error(LK_STATUS_UNSUPPORTED, "%s: uneven inputs (join) are not supported: every rank gathers each unit "
                    "for every batch; give every rank the same number of batches (use_distributed_sampler, drop_last) "
                    "or use ddp", s->vt->name);
}

static bool f_materializes(const lk_strategy *s) { (void)s; return true; }
static bool f_shares_params(const lk_strategy *s) { (void)s; return false; }

#define FSDP_VT(NAME, SUMMARY)                                                                                         \
    {                                                                                                                  \
        .name = NAME, .summary = SUMMARY, .create = f_create, .free = f_free, .wrap = f_wrap, .setup = f_setup,        \
        .training_step = lk__strategy_local_step, .before_forward = f_before_forward,                                  \
        .begin_backward = f_begin_backward, .finish_backward = f_finish_backward, .after_step = f_after_step,          \
        .shard_optimizer = f_shard_optimizer, .shares_params = f_shares_params, .join = f_join,                        \
        .clip_grad_norm = f_clip_grad_norm, .state_dict = f_state_dict, .state_dict_loaded = f_state_dict_loaded,      \
        .optimizer_state = f_optimizer_state, .optimizer_state_load = f_optimizer_state_load, .memory = f_memory,      \
        .shard_pieces = f_shard_pieces, .shard_pieces_loaded = f_shard_pieces_loaded,                                  \
        .materializes = f_materializes,                                                                              \
    }

const lk_strategy_vt lk__strategy_fsdp =
    FSDP_VT("fsdp", "fsdp (lockstep's fully sharded data parallel: parameters, gradients and optimizer state sharded)");
const lk_strategy_vt lk__strategy_zero2 =
    FSDP_VT("deepspeed_stage_2", "deepspeed_stage_2 (lockstep's ZeRO-2: gradients reduce-scattered per unit during the "
                                 "backward, gradients and optimizer state sharded)");
const lk_strategy_vt lk__strategy_zero3 =
    FSDP_VT("deepspeed_stage_3", "deepspeed_stage_3 (lockstep's ZeRO-3: parameters, gradients and optimizer state sharded)");

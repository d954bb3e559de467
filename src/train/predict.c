/* The predict command: predict_step over the predict (or test) set, and
 * its output: every rank keeps the rows predict_step returned
 * together with the dataset index of each row; at the end the rows are
 * gathered on rank 0 and written as one .npy in dataset order, each sample
 * once. A sample seen twice (a sampler that pads repeats its first samples)
 * is kept once, so the file has exactly the rows of the predicted samples. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lockstep/data.h"
#include "train/prefetch.h"
#include "train/train_impl.h"

#define PRED_MAX_DIMS 6 /* per-sample dims carried through the agreement below */

struct lk__pred {
    float *rows;     /* [n][cols] */
    int64_t *index;  /* [n] dataset index of each row */
    int64_t n, cap, cols;
    int sdim;        /* per-sample dims (the prediction's ndim - 1) */
    int64_t sshape[PRED_MAX_DIMS];
};

lk_status lk__pred_create(lk__pred **out) {
    *out = lk_calloc(1, sizeof **out);
    if (!*out) return LK_STATUS_OUT_OF_MEMORY;
    (*out)->cols = -1;
    return LK_STATUS_OK;
}

void lk__pred_free(lk__pred *p) {
    if (!p) return;
    lk_free(p->rows);
    lk_free(p->index);
    lk_free(p);
}

lk_status lk__pred_add(lk__pred *p, const lk_tensor *t, const lk_batch *b) {
    if (t->dtype != LK_F32) return lk_error(LK_STATUS_INTERNAL, "lk__pred_add: expected f32 rows");
    if (t->ndim < 1 || t->shape[0] != b->size || t->ndim - 1 > PRED_MAX_DIMS)
        return lk_error(LK_STATUS_INVALID_USAGE,
                        "predict_step returned a tensor of %d dims (first %lld) for batch %lld of %lld samples: "
                        "expected one row per sample, shape [%lld, ...] with at most %d more dims",
                        t->ndim, (long long)(t->ndim ? t->shape[0] : 0), (long long)b->index, (long long)b->size,
                        (long long)b->size, PRED_MAX_DIMS);
    if (!b->sample_index) return lk_error(LK_STATUS_INTERNAL, "predict: the loader gave no sample indices");
    int64_t cols = b->size ? t->numel / b->size : 0;
    if (p->cols < 0) {
        p->cols = cols;
        p->sdim = t->ndim - 1;
        for (int d = 1; d < t->ndim; d++) p->sshape[d - 1] = t->shape[d];
    } else {
        bool same = p->sdim == t->ndim - 1;
        for (int d = 1; same && d < t->ndim; d++) same = p->sshape[d - 1] == t->shape[d];
        if (!same)
            return lk_error(LK_STATUS_INVALID_USAGE,
                            "predict_step: batch %lld returned rows of %lld values, earlier batches %lld "
                            "(every row must have the same shape)",
                            (long long)b->index, (long long)cols, (long long)p->cols);
    }
    if (p->n + b->size > p->cap) {
        int64_t cap = p->cap ? p->cap : 256;
        while (cap < p->n + b->size) cap *= 2;
        float *r = lk_realloc(p->rows, (size_t)(cap * (p->cols ? p->cols : 1)) * sizeof *r);
        if (!r) return LK_STATUS_OUT_OF_MEMORY;
        p->rows = r;
        int64_t *ix = lk_realloc(p->index, (size_t)cap * sizeof *ix);
        if (!ix) return LK_STATUS_OUT_OF_MEMORY;
        p->index = ix;
        p->cap = cap;
    }
    /* the rows from wherever t lives, in one copy (a memcpy on the CPU) */
    LK_TRY(lk_device_copy(LK_DEVICE_CPU, p->rows + p->n * p->cols, t->device, t->data,
                          (size_t)(b->size * p->cols) * sizeof(float)));
    memcpy(p->index + p->n, b->sample_index, (size_t)b->size * sizeof(int64_t));
    p->n += b->size;
    return LK_STATUS_OK;
}

/* Every rank of comm must call this (it runs collectives); only its rank 0
 * gathers, and writes when `writes`. */
lk_status lk__pred_write(lk__pred *p, lk_comm *comm, int rank, int world, bool writes, int64_t dataset_len,
                         const char *path, int64_t *rows_out, char *shape_out, size_t shape_size) {
    *rows_out = 0;
    /* Agree on the row shape and the largest shard: [rows, cols, sdim, shape...]
     * by MAX; then every rank checks its own against it and all learn
     * whether any disagreed, so no rank is left waiting in the gather. */
    double meta[3 + PRED_MAX_DIMS];
    meta[0] = (double)p->n, meta[1] = (double)p->cols, meta[2] = p->n ? p->sdim : -1;
    for (int d = 0; d < PRED_MAX_DIMS; d++) meta[3 + d] = p->n && d < p->sdim ? (double)p->sshape[d] : -1;
    if (world > 1) LK_TRY(lk_comm_all_reduce(comm, meta, 3 + PRED_MAX_DIMS, LK_F64, LK_REDUCE_MAX));
    int64_t max_rows = (int64_t)meta[0], cols = (int64_t)meta[1];
    int sdim = (int)meta[2];
    double bad = 0;
    if (p->n) {
        bad = p->cols != cols || p->sdim != sdim;
        for (int d = 0; d < p->sdim && !bad; d++) bad = (double)p->sshape[d] != meta[3 + d];
    }
    if (world > 1) LK_TRY(lk_comm_all_reduce(comm, &bad, 1, LK_F64, LK_REDUCE_MAX));
    if (bad)
        return lk_error(LK_STATUS_INVALID_USAGE,
                        "predict_step returned rows of different shapes on different ranks (%lld values here, "
                        "up to %lld on another)",
                        (long long)p->cols, (long long)cols);
    if (max_rows == 0) {
        if (shape_out) snprintf(shape_out, shape_size, "0");
        return LK_STATUS_OK; /* nothing predicted (limit_predict_batches 0): no file */
    }
    float *all_rows = NULL;
    int64_t *all_index = NULL, *send_index = NULL, *slot = NULL;
    float *send_rows = NULL;
    lk_status st = LK_STATUS_OK;
    if (world > 1) {
        /* Pad every shard to max_rows; padded rows carry index -1. */
        send_rows = lk_calloc((size_t)(max_rows * cols) + 1, sizeof *send_rows);
        send_index = lk_malloc((size_t)max_rows * sizeof *send_index);
        if (rank == 0) {
            all_rows = lk_malloc((size_t)(world * max_rows * cols) * sizeof *all_rows + 1);
            all_index = lk_malloc((size_t)(world * max_rows) * sizeof *all_index);
        }
        if (!send_rows || !send_index || (rank == 0 && (!all_rows || !all_index))) st = LK_STATUS_OUT_OF_MEMORY;
        double oom = st ? 1 : 0;
        lk_status cs = lk_comm_all_reduce(comm, &oom, 1, LK_F64, LK_REDUCE_MAX);
        if (!st && cs) st = cs;
        if (!st && oom) st = lk_error(LK_STATUS_OUT_OF_MEMORY, "predict: another rank could not allocate the gather");
        if (!st) {
            if (p->n) memcpy(send_rows, p->rows, (size_t)(p->n * cols) * sizeof *send_rows);
            if (p->n) memcpy(send_index, p->index, (size_t)p->n * sizeof *send_index);
            for (int64_t i = p->n; i < max_rows; i++) send_index[i] = -1;
            st = lk_comm_gather(comm, send_rows, all_rows, (size_t)(max_rows * cols), LK_F32, 0);
            if (!st) st = lk_comm_gather(comm, send_index, all_index, (size_t)max_rows, LK_I64, 0);
        }
    } else {
        all_rows = p->rows;
        all_index = p->index;
    }
    int64_t total = world > 1 ? world * max_rows : p->n;
    if (!st && rank == 0 && writes) {
        /* slot[dataset index] = first gathered row with that index */
        slot = lk_malloc((size_t)(dataset_len > 0 ? dataset_len : 1) * sizeof *slot);
        if (!slot) st = LK_STATUS_OUT_OF_MEMORY;
        for (int64_t i = 0; !st && i < dataset_len; i++) slot[i] = -1;
        for (int64_t r = 0; !st && r < total; r++) {
            int64_t ix = all_index[r];
            if (ix < 0) continue;
            if (ix >= dataset_len) {
                st = lk_error(LK_STATUS_INTERNAL, "predict: sample index %lld outside the dataset of %lld",
                              (long long)ix, (long long)dataset_len);
                break;
            }
            if (slot[ix] < 0) slot[ix] = r;
        }
        int64_t n = 0;
        for (int64_t i = 0; !st && i < dataset_len; i++) n += slot[i] >= 0;
        float *out = st ? NULL : lk_malloc((size_t)(n * cols) * sizeof *out + 1);
        if (!st && !out) st = LK_STATUS_OUT_OF_MEMORY;
        if (!st) {
            int64_t k = 0;
            for (int64_t i = 0; i < dataset_len; i++)
                if (slot[i] >= 0) memcpy(out + (k++) * cols, all_rows + slot[i] * cols, (size_t)cols * sizeof *out);
            lk_array a = {.dtype = LK_F32, .ndim = 1 + sdim, .data = out};
            a.shape[0] = n;
            for (int d = 0; d < sdim; d++) a.shape[1 + d] = (int64_t)meta[3 + d];
            st = lk_npy_write(path, &a);
            *rows_out = n;
            if (shape_out) {
                size_t k2 = (size_t)snprintf(shape_out, shape_size, "%lld", (long long)n);
                for (int d = 0; d < sdim && k2 < shape_size; d++)
                    k2 += (size_t)snprintf(shape_out + k2, shape_size - k2, " x %lld", (long long)a.shape[1 + d]);
            }
        }
        lk_free(out);
    }
    lk_free(slot);
    if (world > 1) {
        lk_free(send_rows);
        lk_free(send_index);
        lk_free(all_rows);
        lk_free(all_index);
        /* every rank learns whether rank 0 wrote the file */
        int32_t code = (int32_t)st;
        lk_status cs = lk_comm_all_reduce(comm, &code, 1, LK_I32, LK_REDUCE_MAX);
        if (!st && cs) st = cs;
        if (!st && code) st = lk_error((lk_status)code, "rank 0 failed to write the predictions");
    }
    return st;
}

lk_status lk_trainer_predict(lk_trainer *tr, lk_module *m, lk_datamodule *dm, const char *ckpt_path) {
    if (tr->launcher) return lk__self_launch(tr, "predict");
    lk_loader *loader = NULL;
    lk_status st = lk__begin_run(tr, m, dm, "predict");
    lk_dataset *ds = st ? NULL : dm->vt->dataset(dm, "predict");
    if (!st && !ds) ds = dm->vt->dataset(dm, "test");
    if (!st && !ds) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "data module '%s' has no predict (or test) set", dm->name);
    if (!st && !m->vt->predict_step && !m->vt->forward)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "module '%s' has no predict_step (and no forward)", m->name);
    if (!st) st = lk__eval_pipeline_setup(tr); /* a pipeline predicts through its stages */
    if (!st && ckpt_path && *ckpt_path) {
        char path[LK_PATH];
        st = lk__ckpt_resolve(tr, ckpt_path, path, sizeof path);
        if (!st) st = lk__ckpt_load(tr, path, false);
    }
    /* A pipeline's stages run each batch forward-only and hand every rank
     * the last stage's output, which predict_step takes as its forward's
     * (eval.c's validation does the same); otherwise the whole model runs
     * here, refreshed. */
    bool piped = !st && lk_strategy_evals_forward(tr->strat) && lk__module_forward_only_via_module(m);
    if (!st && !piped) st = lk_strategy_sync_model(tr->strat);
    if (!st) st = lk__make_loader(tr, ds, false, &loader);
    if (!st && !tr->log_dir[0]) st = lk__open_outputs(tr, true);
    lk__pred *pred = NULL;
    if (!st) st = lk__pred_create(&pred);
    int64_t n = st ? 0 : lk__limit_batches(tr->cfg.limit_predict_batches, lk_loader_len(loader));
    if (!st) st = lk_loader_start(loader, 0, 0);
    lk__prefetch *pf = NULL;
    if (!st) st = lk__eval_prefetcher(tr, &pf);
    if (!st && pf) st = lk__prefetch_begin(pf, loader, n);
    tr->stage = "predict";
    lk_layer_train(m->net, false);
    bool prev = lk_set_grad_enabled(false);
    /* (the stages of one pipeline read the same shard: they run the same batches) */
    for (int64_t i = 0; i < n && !st; i++) {
        const lk_batch *b = NULL;
        st = pf ? lk__prefetch_next(pf, &b) : lk_loader_next(loader, &b);
        if (st || !b) break;
        lk_scope_begin();
        lk_autocast_enter(tr->autocast);
        lk_tensor *out = NULL; /* the stages' output, which predict_step's lk_module_forward answers */
        if (piped) st = lk_strategy_eval_forward(tr->strat, b, true, &out); /* whole: single's bits */
        lk__module_forward_replay(out);
        lk_tensor *p = st ? NULL : lk_module_predict_step(m, b, i, tr);
        lk__module_forward_replay(NULL);
        lk_autocast_exit();
        if (st) {
            lk_tensor_release(out);
            lk_scope_end();
            break;
        }
        if (!p) st = lk_last_status() ? lk_last_status() : lk_error(LK_STATUS_INVALID_USAGE, "predict_step returned nothing");
        lk_tensor *c = p ? lk_tensor_cast(p, LK_F32) : NULL;
        if (p && !c) st = lk_last_status() ? lk_last_status() : LK_STATUS_OUT_OF_MEMORY;
        if (c) st = lk__pred_add(pred, c, b);
        lk_tensor_release(c);
        lk_tensor_release(out);
        lk_scope_end();
    }
    lk_status end = lk__prefetch_end(pf);
    if (!st) st = end;
    lk_set_grad_enabled(prev);
    lk_layer_train(m->net, true);
    /* Rows of every rank, in dataset order, each sample once, in one .npy on
     * rank 0. A rank that failed above must not leave the others waiting in
     * the gather: all agree first. */
    if (tr->world > 1) {
        int32_t code = (int32_t)st;
        lk_status cs = lk_comm_all_reduce(tr->comm, &code, 1, LK_I32, LK_REDUCE_MAX);
        if (!st && cs) st = cs;
        if (!st && code) st = lk_error((lk_status)code, "another rank failed in predict");
    }
    char path[LK_PATH + 64] = "", shape[128] = "";
    int64_t rows = 0;
    snprintf(path, sizeof path, "%s/predictions.npy", tr->log_dir);
    /* The rows come from the data-parallel group, whose ranks saw different
     * samples (another group's are the same samples again); rank 0's group
     * writes the file. With several groups, the world then learns whether
     * it did. */
    int dp = lk_strategy_dp_size(tr->strat);
    if (!st)
        st = lk__pred_write(pred, lk_strategy_dp_comm(tr->strat), lk_strategy_dp_rank(tr->strat), dp, tr->rank == 0,
                            lk_dataset_len(ds), path, &rows, shape, sizeof shape);
    if (dp < tr->world) {
        int32_t code = (int32_t)st;
        lk_status cs = lk_comm_all_reduce(tr->comm, &code, 1, LK_I32, LK_REDUCE_MAX);
        if (!st && cs) st = cs;
        if (!st && code) st = lk_error((lk_status)code, "another data-parallel group failed in predict");
    }
    lk__pred_free(pred);
    if (!st && tr->rank == 0) {
        if (rows) lk_log0("predictions: %s f32 in %s (dataset order; numpy.load reads it)", shape, path);
        else lk_log0("predictions: none (no predict batch ran)");
    }
    lk__write_runinfo(tr, "predict", st);
    lk_loader_free(loader);
    lk__run_end_on_device(tr);
    return st;
}

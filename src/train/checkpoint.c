/* Checkpoints: one safetensors file holding the model's state dict under
 * PyTorch's names, the optimizer, scheduler and fp16 loss scaler state
 * ("grad_scaler.<GradScaler.state_dict key>"), and metadata (epoch,
 * step, position inside the epoch, callback state, config, world size).
 * Rank 0 writes through a temporary file and rename, the others wait at a
 * barrier; a checkpoint is never half-written under its final name. Also
 * the ModelCheckpoint callback (last.ckpt and the top-k by a monitor).
 * With trainer.state_dict_type sharded and a sharded strategy, a
 * checkpoint is a set of per-rank shards instead (ckpt_shards.c): this
 * file writes and reads its trainer state as it does a whole file. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "optim/optim_impl.h" /* lk__optimizer_state_get_ex: a sharded set's trainer state */
#include "train/ckpt_shards.h"
#include "train/train_impl.h"

#define CKPT_FORMAT "lockstep-checkpoint"
#define CKPT_VERSION "1"

static lk_status append_prefixed(lk_named_tensors *dst, const lk_named_tensors *src, const char *prefix) {
    char name[512];
    for (int i = 0; i < src->n; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, src->items[i].name);
        LK_TRY(lk_named_tensors_append(dst, name, src->items[i].tensor));
    }
    return LK_STATUS_OK;
}

/* Where a ModelCheckpoint instance writes: its dirpath, else the log
 * directory's checkpoints/ (the default_root_dir's without a logger). */
static void instance_dir(const lk_trainer *tr, const lk_ckpt_state *k, char *dir, size_t size) {
    if (k->c.dirpath[0]) snprintf(dir, size, "%s", k->c.dirpath);
    else if (tr->log_dir[0]) snprintf(dir, size, "%s/checkpoints", tr->log_dir);
    else snprintf(dir, size, "%s/checkpoints", tr->cfg.default_root_dir[0] ? tr->cfg.default_root_dir : ".");
}

/* Whether path names a file directly inside dir: the only files top-k ever
 * deletes. */
static bool file_in_dir(const char *path, const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    return !strncmp(path, dir, n) && path[n] == '/' && path[n + 1] && !strchr(path + n + 1, '/');
}

lk_status lk__ckpt_save(lk_trainer *tr, const char *path) { return lk__ckpt_save_ex(tr, path, false); }

/* The state dict's entries that are not parameters (buffers): a sharded
 * set's trainer state holds them whole, the shards hold the parameters. */
static lk_status buffers_only(const lk_layer *net, lk_named_tensors *out) {
    lk_named_tensors sd = {0}, params = {0};
    lk_status st = lk_state_dict_get(net, &sd);
    if (!st) st = lk_layer_named_parameters(net, &params);
    for (int i = 0; !st && i < sd.n; i++) {
        bool param = false;
        for (int j = 0; j < params.n && !param; j++) param = !strcmp(sd.items[i].name, params.items[j].name);
        if (!param) st = lk_named_tensors_append(out, sd.items[i].name, sd.items[i].tensor);
    }
    lk_named_tensors_clear(&sd);
    lk_named_tensors_clear(&params);
    return st;
}

static lk_status write_state(lk_trainer *tr, const char *path, bool weights_only, const lk_st_meta *extra, int nextra);

/* weights_only (ModelCheckpoint save_weights_only): the model's state dict
 * and the metadata, no optimizer.* or lr_scheduler.* tensors; marked so
 * that resuming from it fails with a reason instead of a missing tensor. */
lk_status lk__ckpt_save_ex(lk_trainer *tr, const char *path, bool weights_only) {
    /* shards staged by every rank (ckpt_callback): rank 0 makes the set */
    if (tr->shard_stage[0]) return lk__shards_write_set(tr, path, weights_only, write_state);
    return write_state(tr, path, weights_only, NULL, 0);
}

/* extra: a sharded set's trainer state (its metadata beside the usual):
 * the buffers, and the optimizer's steps and hyperparameters without its
 * arrays, which the shards hold. */
static lk_status write_state(lk_trainer *tr, const char *path, bool weights_only, const lk_st_meta *extra, int nextra) {
    lk_named_tensors all = {0}, part = {0};
    /* the whole model's state dict, as the strategy gathers it (replicas: as
     * it is, here; a collective gather ran on every rank in ckpt_callback) */
    lk_status st = extra ? buffers_only(tr->module->net, &all)
                   : tr->ckpt_state_ready ? append_prefixed(&all, &tr->ckpt_state, "")
                                          : lk_strategy_state_dict(tr->strat, tr->module->net, &all);
    if (!st && tr->optim && !weights_only) {
        /* a sharded set keeps the arrays in the shards: here the hyperparameters and steps only (under the
         * net's names: lk_strategy_optimizer_state_ex); a whole file gets everything, gathered with the state
         * dict when that is a collective (fsdp's is too) */
        if (extra) st = lk_strategy_optimizer_state_ex(tr->strat, tr->optim, &part, false);
        else if (!tr->ckpt_state_ready) st = lk_strategy_optimizer_state(tr->strat, tr->optim, &part);
        if (!st) st = append_prefixed(&all, tr->ckpt_state_ready && !extra ? &tr->ckpt_optim : &part, "optimizer.");
        lk_named_tensors_clear(&part);
    }
    if (!st && tr->sched && !weights_only) {
        st = lk_scheduler_state_get(tr->sched, &part);
        if (!st) st = append_prefixed(&all, &part, "lr_scheduler.");
        lk_named_tensors_clear(&part);
    }
    if (!st && tr->scaler) { /* Lightning keeps it as checkpoint["MixedPrecision"] */
        st = lk_grad_scaler_state_get(tr->scaler, &part);
        if (!st) st = append_prefixed(&all, &part, "grad_scaler.");
        lk_named_tensors_clear(&part);
    }
    lk_st_entry *e = st ? NULL : lk_calloc((size_t)all.n + 1, sizeof *e);
    if (!st && !e) st = LK_STATUS_OUT_OF_MEMORY;
    for (int i = 0; !st && i < all.n; i++) e[i] = (lk_st_entry){.name = all.items[i].name, .tensor = all.items[i].tensor};
    char epoch[32], step[32], batch[32], world[16], seed[32];
    snprintf(epoch, sizeof epoch, "%lld", (long long)(tr->epoch + (tr->at_epoch_end ? 1 : 0)));
    snprintf(step, sizeof step, "%lld", (long long)tr->global_step);
    snprintf(batch, sizeof batch, "%lld", (long long)(tr->at_epoch_end ? 0 : tr->resume_batch));
    snprintf(world, sizeof world, "%d", tr->world);
    snprintf(seed, sizeof seed, "%lld", (long long)tr->cfg.seed);
    lk_st_meta meta[22 + 6 * (2 * LK_MAX_CALLBACKS + 2)] = {
        {"format", CKPT_FORMAT}, {"format_version", CKPT_VERSION}, {"lockstep_version", LK_VERSION_STRING},
        {"model", tr->module->name ? tr->module->name : ""}, {"epoch", epoch}, {"global_step", step},
        {"batch_in_epoch", batch}, {"world_size", world}, {"strategy", lk_strategy_name(tr->strat)},
        {"seed", seed}, {"config", tr->config_yaml ? tr->config_yaml : ""},
        {"hparams", tr->module->hparams_yaml ? tr->module->hparams_yaml : ""},
        {"precision", tr->cfg.precision}, /* Lightning's full name: lk_trainer_create resolved an alias */
    };
    int nmeta = 13;
    /* the ranks that read different data (a pipeline's stages read the same): what the data position scales by */
    char dpsize[16];
    snprintf(dpsize, sizeof dpsize, "%d", lk_strategy_dp_size(tr->strat));
    meta[nmeta++] = (lk_st_meta){"data_parallel_size", dpsize};
    if (weights_only) meta[nmeta++] = (lk_st_meta){"weights_only", "true"};
    for (int i = 0; i < nextra && i < 4; i++) meta[nmeta++] = extra[i];
    /* The logged metrics (inside an epoch with every rank's sums so far:
     * lk__metrics_gather) and a validation still due (trainer.c). */
    char *mtext = st ? NULL : lk__metrics_state(tr);
    if (!st && !mtext) st = LK_STATUS_OUT_OF_MEMORY;
    if (!st) meta[nmeta++] = (lk_st_meta){"metrics", mtext};
    if (!tr->at_epoch_end && tr->resume_batch > 0 && tr->val_pending) meta[nmeta++] = (lk_st_meta){"val_pending", "true"};
    /* Callback state: instance 0 under the original key names, instance i
     * under "<key>.<i>" (keys and values are kept in `cbtext`). */
    enum { KEYLEN = 48, VALLEN = 64 };
    char (*keys)[KEYLEN] = st ? NULL : lk_calloc(6 * (2 * LK_MAX_CALLBACKS + 2), KEYLEN);
    char (*vals)[VALLEN] = st ? NULL : lk_calloc(6 * (2 * LK_MAX_CALLBACKS + 2), VALLEN);
    char (*dirs)[LK_PATH2] = st ? NULL : lk_calloc(LK_MAX_CALLBACKS + 1, LK_PATH2);
    char *topk[LK_MAX_CALLBACKS + 1] = {0};
    if (!st && (!keys || !vals || !dirs)) st = LK_STATUS_OUT_OF_MEMORY;
    int nk = 0;
    for (int j = 0; !st && j < tr->nckpts; j++) {
        const lk_ckpt_state *k = &tr->ckpts[j];
        char sfx[16] = "";
        if (j) snprintf(sfx, sizeof sfx, ".%d", j);
        /* "<score>\t<path>" lines, whole: a list cut short would name a
         * file that is not the one to delete */
        size_t cap = 1;
        for (int i = 0; i < k->ntopk; i++) cap += strlen(k->topk[i].path) + 32;
        char *tk = topk[j] = lk_malloc(cap);
        if (!tk) {
            st = LK_STATUS_OUT_OF_MEMORY;
            break;
        }
        size_t len = 0;
        tk[0] = 0;
        for (int i = 0; i < k->ntopk; i++)
            len += (size_t)snprintf(tk + len, cap - len, "%s%.17g\t%s", i ? "\n" : "", k->topk[i].score, k->topk[i].path);
        snprintf(keys[nk], KEYLEN, "best_monitor%s", sfx);
        meta[nmeta++] = (lk_st_meta){keys[nk++], k->c.monitor};
        snprintf(keys[nk], KEYLEN, "best_score%s", sfx);
        snprintf(vals[nk], VALLEN, "%.17g", k->best_score);
        meta[nmeta++] = (lk_st_meta){keys[nk], vals[nk]};
        nk++;
        snprintf(keys[nk], KEYLEN, "best_path%s", sfx);
        meta[nmeta++] = (lk_st_meta){keys[nk++], k->best_path};
        snprintf(keys[nk], KEYLEN, "top_k%s", sfx);
        meta[nmeta++] = (lk_st_meta){keys[nk++], tk};
        snprintf(keys[nk], KEYLEN, "dirpath%s", sfx); /* Lightning's ModelCheckpoint state["dirpath"] */
        instance_dir(tr, k, dirs[j], LK_PATH2);
        meta[nmeta++] = (lk_st_meta){keys[nk++], dirs[j]};
    }
    for (int j = 0; !st && j < tr->nes; j++) {
        char sfx[16] = "";
        if (j) snprintf(sfx, sizeof sfx, ".%d", j);
        snprintf(keys[nk], KEYLEN, "early_stopping_wait%s", sfx);
        snprintf(vals[nk], VALLEN, "%d", tr->es[j].wait);
        meta[nmeta++] = (lk_st_meta){keys[nk], vals[nk]};
        nk++;
        snprintf(keys[nk], KEYLEN, "early_stopping_best%s", sfx);
        snprintf(vals[nk], VALLEN, "%.17g", tr->es[j].best);
        meta[nmeta++] = (lk_st_meta){keys[nk], vals[nk]};
        nk++;
    }
    if (!st) st = lk_safetensors_write(path, e, all.n, meta, nmeta);
    lk_free(mtext);
    lk_free(keys);
    lk_free(vals);
    lk_free(dirs);
    for (int j = 0; j <= LK_MAX_CALLBACKS; j++) lk_free(topk[j]);
    lk_free(e);
    lk_named_tensors_clear(&all);
    return st;
}

static const char *meta_or(const lk_st_file *f, const char *key, const char *dflt) {
    const char *v = lk_safetensors_meta(f, key);
    return v ? v : dflt;
}

/* Copies every tensor of `live` from the file under prefix; lists every
 * missing or misshaped tensor in one error before copying anything. */
static lk_status load_named(const lk_st_file *f, const lk_named_tensors *live, const char *prefix, const char *what) {
    char msg[4096] = "";
    int bad = 0;
    char name[512];
    for (int i = 0; i < live->n; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, live->items[i].name);
        const lk_st_info *info = lk_safetensors_find(f, name);
        const lk_tensor *t = live->items[i].tensor;
        char one[1024];
        if (!info) {
            snprintf(one, sizeof one, "%smissing '%s'", bad ? "; " : "", name);
        } else {
            bool same = info->ndim == t->ndim;
            for (int d = 0; same && d < t->ndim; d++) same = info->shape[d] == t->shape[d];
            if (same) continue;
            char want[128], got[160] = "[";
            lk_shape_str(t, want, sizeof want);
            for (int d = 0; d < info->ndim; d++) {
                char x[24];
                snprintf(x, sizeof x, "%s%lld", d ? ", " : "", (long long)info->shape[d]);
                strncat(got, x, sizeof got - strlen(got) - 2);
            }
            strcat(got, "]");
            snprintf(one, sizeof one, "%s'%s' has shape %s, the %s expects %s", bad ? "; " : "", name, got, what, want);
        }
        if (bad < 12) strncat(msg, one, sizeof msg - strlen(msg) - 1);
        bad++;
    }
    if (bad)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint %s does not fit the %s (%d problem%s): %s%s",
                        lk_safetensors_path(f), what, bad, bad > 1 ? "s" : "", msg, bad > 12 ? "; ..." : "");
    /* a tensor this rank holds no data for (a pipeline stage's copy of
     * another stage's parameter, its storage given back) was checked above
     * and is another rank's to read */
    for (int i = 0; i < live->n; i++) {
        if (!lk_tensor_has_data(live->items[i].tensor)) continue;
        snprintf(name, sizeof name, "%s%s", prefix, live->items[i].name);
        LK_TRY(lk_safetensors_read_into(f, name, live->items[i].tensor));
    }
    return LK_STATUS_OK;
}

lk_status lk_module_load_weights(lk_module *m, const char *path) {
    if (!m || !m->net) return lk_error(LK_STATUS_INVALID_ARGUMENT, "load_weights: a module with a network is required");
    lk_st_file *f;
    LK_TRY(lk_safetensors_open(path, &f));
    lk_named_tensors sd = {0};
    lk_status st = lk_state_dict_get(m->net, &sd);
    if (!st) st = load_named(f, &sd, "", "model");
    lk_named_tensors_clear(&sd);
    lk_safetensors_close(f);
    return st;
}

/* The weights are saved in the parameters' dtype (f32 for 32-true and the
 * mixed precisions, bf16/f16 for the *-true ones) and the optimizer state in
 * f32 always, so a checkpoint resumes in any other precision: loading casts
 * the weights to this run's parameter dtype (widening is exact; f32 to a
 * 16-bit dtype rounds to nearest even, as module.to(dtype) does). Only the
 * fp16 loss scaler's state is precision-specific. Said in one line each, so
 * that a run resumed in another precision is never silent about it. A
 * checkpoint written before the "precision" key existed is known to be
 * 16-mixed by its scaler state. */
static const char *weights_dtype(const char *precision) {
    return !strcmp(precision, "bf16-true") ? "bf16" : !strcmp(precision, "16-true") ? "f16" : "f32";
}

static void precision_note(lk_trainer *tr, const lk_st_file *f, const char *path, bool restore_training) {
    bool has_scaler = false;
    for (int i = 0; i < lk_safetensors_count(f) && !has_scaler; i++)
        has_scaler = !strncmp(lk_safetensors_at(f, i)->name, "grad_scaler.", 12);
    const char *saved = lk_safetensors_meta(f, "precision");
    if (!saved || !*saved) saved = has_scaler ? "16-mixed" : NULL;
    const char *now = tr->cfg.precision; /* already the full name; a file's may be an alias */
    if (saved && strcmp(lk__precision_name(saved), now)) {
        const char *from = weights_dtype(lk__precision_name(saved)), *to = weights_dtype(now);
        lk_log0("%s was saved in precision %s, this run uses %s: the %s weights are %s%s", path, saved, now, from,
                !strcmp(from, to) ? "loaded as they are" : !strcmp(to, "f32") ? "widened to f32 (exact)"
                : !strcmp(from, "f32") ? (to[0] == 'b' ? "rounded to bf16" : "rounded to f16")
                                       : (to[0] == 'b' ? "converted to bf16 (rounded)" : "converted to f16 (rounded)"),
                restore_training ? ", the f32 optimizer state as it is" : "");
    }
    if (!restore_training) return;
    if (has_scaler && !tr->scaler)
        lk_log0("%s: its grad_scaler.* state (16-mixed's loss scaler) is ignored: precision %s has no loss scaler",
                path, now);
    else if (!has_scaler && tr->scaler)
        lk_log0("%s has no loss scaler state: the scaler starts from trainer.grad_scaler_init_scale (%g)", path,
                (double)tr->cfg.grad_scaler_init_scale);
}

/* Metadata a user's file may hold anything in: parsed whole, in range, or
 * an error naming the file, the key, the value and what was expected. */
static lk_status meta_int(const lk_st_file *f, const char *path, const char *key, long long dflt, long long lo,
                          long long hi, long long *out) {
    const char *v = lk_safetensors_meta(f, key);
    *out = dflt;
    if (!v) return LK_STATUS_OK;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "checkpoint %s: metadata '%s' is '%.40s%s', expected an integer from %lld to %lld", path, key, v,
                        strlen(v) > 40 ? "..." : "", lo, hi);
    *out = x;
    return LK_STATUS_OK;
}

/* A score: a number, nan (none yet) or +-inf; nothing else. */
static lk_status parse_score(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || (errno == ERANGE && isinf(x))) return LK_STATUS_INVALID_ARGUMENT;
    *out = x;
    return LK_STATUS_OK;
}

static lk_status meta_real(const lk_st_file *f, const char *path, const char *key, double *out) {
    const char *v = lk_safetensors_meta(f, key);
    *out = NAN;
    if (v && parse_score(v, out))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint %s: metadata '%s' is '%.40s%s', expected a number, nan or inf",
                        path, key, v, strlen(v) > 40 ? "..." : "");
    return LK_STATUS_OK;
}

/* top_k: "<score>\t<path>" lines, each score finite and each path whole. */
static lk_status meta_topk(const lk_st_file *f, const char *path, const char *key, lk_ckpt_state *k) {
    const char *tk = meta_or(f, key, "");
    k->ntopk = 0;
    for (int line = 1; *tk; line++) {
        const char *nl = strchr(tk, '\n'), *tab = memchr(tk, '\t', nl ? (size_t)(nl - tk) : strlen(tk));
        size_t len = nl ? (size_t)(nl - tk) : strlen(tk);
        char num[64];
        double score = NAN;
        size_t nlen = tab ? (size_t)(tab - tk) : 0, plen = tab ? len - nlen - 1 : 0;
        if (nlen < sizeof num) memcpy(num, tk, nlen), num[nlen] = 0;
        if (!tab || nlen >= sizeof num || parse_score(num, &score) || !isfinite(score) || plen == 0 || plen >= LK_PATH2)
            return lk_error(LK_STATUS_INVALID_ARGUMENT,
                            "checkpoint %s: metadata '%s' line %d is '%.40s%s', expected a finite score, a tab and a "
                            "path of under %d bytes", path, key, line, tk, len > 40 ? "..." : "", LK_PATH2);
        lk_topk *n = lk_realloc(k->topk, (size_t)(k->ntopk + 1) * sizeof *n);
        if (!n) return LK_STATUS_OUT_OF_MEMORY;
        k->topk = n;
        n[k->ntopk].score = score;
        memcpy(n[k->ntopk].path, tab + 1, plen);
        n[k->ntopk].path[plen] = 0;
        k->ntopk++;
        tk = nl ? nl + 1 : tk + len;
    }
    return LK_STATUS_OK;
}

/* The loop's counters and the callbacks' state. Counters stay below 2^53
 * (a double holds them exactly, and a step can still be added). */
static lk_status load_counters(lk_trainer *tr, const lk_st_file *f, const char *path) {
    const long long big = 1LL << 53;
    long long epoch, step, batch, world;
    LK_TRY(meta_int(f, path, "epoch", 0, 0, big, &epoch));
    LK_TRY(meta_int(f, path, "global_step", 0, 0, big, &step));
    /* (times world_size below, within int64) */
    LK_TRY(meta_int(f, path, "batch_in_epoch", 0, 0, INT32_MAX, &batch));
    LK_TRY(meta_int(f, path, "world_size", 1, 1, 1 << 24, &world));
    long long dp; /* absent before it was written: the world read the data */
    LK_TRY(meta_int(f, path, "data_parallel_size", world, 1, 1 << 24, &dp));
    for (int j = 0; j < tr->nckpts; j++) {
        lk_ckpt_state *k = &tr->ckpts[j];
        char key[48], sfx[16] = "";
        if (j) snprintf(sfx, sizeof sfx, ".%d", j);
        snprintf(key, sizeof key, "best_score%s", sfx);
        LK_TRY(meta_real(f, path, key, &k->best_score));
        snprintf(key, sizeof key, "best_path%s", sfx);
        const char *bp = meta_or(f, key, "");
        if (strlen(bp) >= sizeof k->best_path)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint %s: metadata '%s' is longer than %d bytes", path, key,
                            (int)sizeof k->best_path - 1);
        snprintf(k->best_path, sizeof k->best_path, "%s", bp);
        snprintf(key, sizeof key, "top_k%s", sfx);
        LK_TRY(meta_topk(f, path, key, k));
        snprintf(key, sizeof key, "dirpath%s", sfx);
        snprintf(k->loaded_dir, sizeof k->loaded_dir, "%s", meta_or(f, key, ""));
        k->loaded = true;
    }
    for (int j = 0; j < tr->nes; j++) {
        char key[48], sfx[16] = "";
        long long wait;
        if (j) snprintf(sfx, sizeof sfx, ".%d", j);
        snprintf(key, sizeof key, "early_stopping_wait%s", sfx);
        LK_TRY(meta_int(f, path, key, 0, 0, 1 << 30, &wait));
        tr->es[j].wait = (int)wait;
        snprintf(key, sizeof key, "early_stopping_best%s", sfx);
        LK_TRY(meta_real(f, path, key, &tr->es[j].best));
    }
    const char *vp = meta_or(f, "val_pending", "false");
    if (strcmp(vp, "true") && strcmp(vp, "false"))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint %s: metadata 'val_pending' is '%.40s%s', expected true or false",
                        path, vp, strlen(vp) > 40 ? "..." : "");
    const char *mt = lk_safetensors_meta(f, "metrics");
    tr->epoch_restored = false;
    if (mt) LK_TRY(lk__metrics_restore(tr, path, mt, world));
    /* Inside an epoch the epoch's sums so far came back (a checkpoint
     * without them resumes the epoch's row from the resumed batches). */
    tr->epoch_restored = tr->epoch_restored && batch > 0;
    tr->val_pending = batch > 0 && !strcmp(vp, "true");
    tr->epoch = epoch;
    tr->global_step = step;
    tr->resume_batch = batch;
    int dp_now = lk_strategy_dp_size(tr->strat);
    if (dp != dp_now) {
        lk_warn0("%s was written by %lld process%s, this run has %d (counting those that read different data): "
                 "weights, optimizer state and counters are restored, but the data order differs from an "
                 "uninterrupted run",
                 path, dp, dp > 1 ? "es" : "", dp_now);
        tr->resume_batch = tr->resume_batch * dp / dp_now;
    }
    if (tr->nckpts) { /* what ckpt_path=best and run.json report */
        tr->best_score = tr->ckpts[0].best_score;
        snprintf(tr->best_ckpt, sizeof tr->best_ckpt, "%s", tr->ckpts[0].best_path);
    }
    return LK_STATUS_OK;
}

void lk__ckpt_adopt(lk_trainer *tr) {
    for (int j = 0; j < tr->nckpts; j++) {
        lk_ckpt_state *k = &tr->ckpts[j];
        if (!k->loaded) continue;
        k->loaded = false;
        char dir[LK_PATH2];
        instance_dir(tr, k, dir, sizeof dir);
        /* A checkpoint from before the dirpath key: its directory is the
         * one its top-k files are in, when they all share one. */
        bool same = k->loaded_dir[0] ? !strcmp(k->loaded_dir, dir) : true;
        for (int i = 0; same && i < k->ntopk; i++) same = file_in_dir(k->topk[i].path, dir);
        if (same) continue;
        char which[32] = "";
        if (tr->nckpts > 1) snprintf(which, sizeof which, " %d", j + 1);
        if (k->ntopk || !isnan(k->best_score))
            lk_warn0("ModelCheckpoint%s: the checkpoint's instance saved into %s, this run saves into %s: its best "
                     "score and top-k files are not taken over (nor ever deleted), only its best path %s",
                     which, k->loaded_dir[0] ? k->loaded_dir : "another directory", dir,
                     k->best_path[0] ? k->best_path : "(none)");
        k->ntopk = 0;
        k->best_score = NAN;
        if (j == 0) tr->best_score = NAN;
    }
}

static lk_status ckpt_load(lk_trainer *tr, const char *path, bool restore_training, lk_st_file *f, lk__shard_set *set);

/* A checkpoint file, or a sharded set (a directory, ckpt_shards.c) whose
 * trainer state stands for the file and whose shards hold the parameters
 * and the optimizer's arrays. */
lk_status lk__ckpt_load(lk_trainer *tr, const char *path, bool restore_training) {
    lk_st_file *f;
    lk__shard_set *set = NULL;
    if (lk__shards_is_set(path)) {
        LK_TRY(lk__shards_open(path, &set));
        f = lk__shards_state(set);
    } else {
        LK_TRY(lk_safetensors_open(path, &f));
    }
    lk_status st = ckpt_load(tr, path, restore_training, f, set);
    if (set) lk__shards_close(set);
    else lk_safetensors_close(f);
    return st;
}

static lk_status ckpt_load(lk_trainer *tr, const char *path, bool restore_training, lk_st_file *f, lk__shard_set *set) {
    lk_status st = LK_STATUS_OK;
    const char *fmt = lk_safetensors_meta(f, "format");
    if (!fmt || strcmp(fmt, CKPT_FORMAT))
        lk_log_warn("%s has no lockstep checkpoint metadata: loading its weights by name only", path);
    const char *ver = fmt ? lk_safetensors_meta(f, "format_version") : NULL;
    if (ver && strcmp(ver, CKPT_VERSION)) {
        return lk_error(LK_STATUS_UNSUPPORTED,
                        "checkpoint %s has format_version '%.20s'; this lockstep %s reads version %s", path, ver,
                        LK_VERSION_STRING, CKPT_VERSION);
    }
    const char *model = lk_safetensors_meta(f, "model");
    if (model && tr->module->name && *model && strcmp(model, tr->module->name))
        lk_log_warn("%s was written for model '%s', this run uses '%s'", path, model, tr->module->name);
    const char *wo = lk_safetensors_meta(f, "weights_only");
    if (restore_training && wo && !strcmp(wo, "true")) {
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "ckpt_path: %s was saved with ModelCheckpoint save_weights_only: true and holds no optimizer "
                        "state to resume fit from (use it with validate, test or predict, or as model weights)", path);
    }
    precision_note(tr, f, path, restore_training);
    lk_named_tensors sd = {0}, part = {0};
    st = lk_state_dict_get(tr->module->net, &sd);
    if (set) { /* everything checked before anything is loaded, then each rank's pieces */
        if (!st) st = lk__shards_check(set, &sd, restore_training && fmt ? tr->optim : NULL);
        if (!st) st = lk__shards_load_model(tr, set, &sd);
    } else {
        if (!st) st = load_named(f, &sd, "", "model");
    }
    lk_named_tensors_clear(&sd);
    /* every rank read the whole model: a sharded strategy keeps its part
     * (a set's pieces were the part already) */
    if (!st && !set) st = lk_strategy_state_dict_loaded(tr->strat);
    if (!st && restore_training && fmt) st = lk_strategy_check_resume(tr->strat);
    if (!st && restore_training && fmt) {
        if (tr->optim) {
            st = lk__optimizer_state_get_ex(tr->optim, &part, !set); /* a set into ZeRO: its state stays a chunk */
            /* The live state may be empty before the first step: load what
             * the file has under "optimizer." by name. */
            lk_named_tensors fromfile = {0};
            for (int i = 0; !st && i < lk_safetensors_count(f); i++) {
                const lk_st_info *info = lk_safetensors_at(f, i);
                if (strncmp(info->name, "optimizer.", 10)) continue;
                lk_tensor *t = info->dtype >= 0 ? lk_tensor_empty((lk_dtype)info->dtype, info->ndim, info->shape) : NULL;
                if (!t) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint %s: optimizer tensor '%s' has dtype %s",
                                      path, info->name, info->dtype_name);
                if (!st) st = lk_safetensors_read_into(f, info->name, t);
                if (!st) st = lk_named_tensors_append(&fromfile, info->name + 10, t);
                lk_tensor_release(t);
            }
            /* a set into replicas: the arrays whole from the shards */
            if (!st && set && !lk_strategy_shards_state(tr->strat)) st = lk__shards_optim_whole(set, tr->optim, &fromfile);
            if (!st && lk_strategy_optimizer_state_load(tr->strat, tr->optim, &fromfile))
                st = lk_error(lk_last_status(), "checkpoint %s: %s", path, lk_last_error());
            bool done; /* a set into a sharded strategy: the arrays of its pieces, after the steps */
            if (!st && set) st = lk__shards_optim_pieces(tr, set, &done);
            lk_named_tensors_clear(&fromfile);
            lk_named_tensors_clear(&part);
        }
        if (!st && tr->sched) {
            lk_named_tensors fromfile = {0};
            for (int i = 0; !st && i < lk_safetensors_count(f); i++) {
                const lk_st_info *info = lk_safetensors_at(f, i);
                if (strncmp(info->name, "lr_scheduler.", 13) || info->dtype < 0) continue;
                lk_tensor *t = lk_tensor_empty((lk_dtype)info->dtype, info->ndim, info->shape);
                if (!t) st = lk_last_status();
                if (!st) st = lk_safetensors_read_into(f, info->name, t);
                if (!st) st = lk_named_tensors_append(&fromfile, info->name + 13, t);
                lk_tensor_release(t);
            }
            if (!st && fromfile.n && lk_scheduler_state_load(tr->sched, &fromfile))
                st = lk_error(lk_last_status(), "checkpoint %s: %s", path, lk_last_error());
            lk_named_tensors_clear(&fromfile);
        }
        if (!st && tr->scaler) {
            /* A checkpoint of a run without the scaler (32-true, bf16-mixed)
             * has none: the scaler then starts from its configuration, as
             * Lightning's does when "MixedPrecision" is absent. */
            lk_named_tensors fromfile = {0};
            for (int i = 0; !st && i < lk_safetensors_count(f); i++) {
                const lk_st_info *info = lk_safetensors_at(f, i);
                if (strncmp(info->name, "grad_scaler.", 12) || info->dtype < 0) continue;
                lk_tensor *t = lk_tensor_empty((lk_dtype)info->dtype, info->ndim, info->shape);
                if (!t) st = lk_last_status();
                if (!st) st = lk_safetensors_read_into(f, info->name, t);
                if (!st) st = lk_named_tensors_append(&fromfile, info->name + 12, t);
                lk_tensor_release(t);
            }
            if (!st && fromfile.n && lk_grad_scaler_state_load(tr->scaler, &fromfile))
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint %s: %s", path, lk_last_error());
            lk_named_tensors_clear(&fromfile);
        }
        if (!st) st = load_counters(tr, f, path);
    }
    return st;
}

lk_status lk__ckpt_resolve(lk_trainer *tr, const char *spec, char *out, size_t size) {
    if (!strcmp(spec, "best")) {
        if (tr->best_ckpt[0]) {
            snprintf(out, size, "%s", tr->best_ckpt);
            return LK_STATUS_OK;
        }
        /* a new process (validate, test, predict): the best file the newest fit recorded in its run.json */
        char dir[LK_PATH];
        snprintf(dir, sizeof dir, "%s/lightning_logs", tr->cfg.default_root_dir[0] ? tr->cfg.default_root_dir : ".");
        if (lk__runinfo_find_best(dir, out, size)) return LK_STATUS_OK;
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "ckpt_path: 'best' found no best checkpoint: no run under %s/version_*/run.json recorded one "
                        "that still exists (a fit records it when a ModelCheckpoint monitors a metric); pass last or "
                        "a path", dir);
    }
    if (!strcmp(spec, "last")) {
        if (tr->last_ckpt[0] && access(tr->last_ckpt, R_OK) == 0) {
            snprintf(out, size, "%s", tr->last_ckpt);
            return LK_STATUS_OK;
        }
        /* the newest version_N/checkpoints/last.ckpt under default_root_dir */
        char dir[LK_PATH];
        snprintf(dir, sizeof dir, "%s/lightning_logs", tr->cfg.default_root_dir[0] ? tr->cfg.default_root_dir : ".");
        DIR *d = opendir(dir);
        long best = -1;
        if (d) {
            struct dirent *de;
            while ((de = readdir(d))) {
                long v;
                char probe[LK_PATH + 300];
                if (sscanf(de->d_name, "version_%ld", &v) != 1 || v <= best) continue;
                snprintf(probe, sizeof probe, "%s/%s/checkpoints/last.ckpt", dir, de->d_name);
                if (access(probe, R_OK) == 0) best = v;
            }
            closedir(d);
        }
        if (best < 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "ckpt_path: 'last' found no %s/version_*/checkpoints/last.ckpt",
                            dir);
        snprintf(out, size, "%s/version_%ld/checkpoints/last.ckpt", dir, best);
        return LK_STATUS_OK;
    }
    if (access(spec, R_OK) != 0)
        return lk_error(LK_STATUS_IO, "ckpt_path: cannot read '%s': %s (expected last, best or a checkpoint file)", spec,
                        strerror(errno));
    snprintf(out, size, "%s", spec);
    return LK_STATUS_OK;
}

/* "{epoch}-{val_loss:.3f}" -> "epoch=3-val_loss=0.123" (Lightning's auto_insert_metric_name). */
static lk_status render_name(lk_trainer *tr, const char *tpl, bool auto_insert, char *out, size_t size) {
    size_t k = 0;
    out[0] = 0;
    for (const char *p = tpl; *p && k + 1 < size;) {
        if (*p != '{') {
            out[k++] = *p++;
            out[k] = 0;
            continue;
        }
        const char *end = strchr(p, '}');
        if (!end) return lk_error(LK_STATUS_INVALID_ARGUMENT, "ModelCheckpoint filename '%s': unclosed '{'", tpl);
        char key[128] = "", fmt[32] = "";
        const char *colon = memchr(p, ':', (size_t)(end - p));
        size_t kl = (size_t)((colon ? colon : end) - p - 1);
        if (kl >= sizeof key) kl = sizeof key - 1;
        memcpy(key, p + 1, kl);
        if (colon) snprintf(fmt, sizeof fmt, "%%%.*s", (int)(end - colon - 1), colon + 1);
        double v;
        if (!strcmp(key, "epoch")) v = (double)tr->epoch;
        else if (!strcmp(key, "step")) v = (double)tr->global_step;
        else if (!lk_trainer_metric(tr, key, &v))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "ModelCheckpoint filename: '{%s}' was never logged", key);
        char val[64];
        size_t fl = strlen(fmt);
        if (fmt[0] && strpbrk(fmt, "efg")) snprintf(val, sizeof val, fmt, v);
        else if (fl >= 2 && fmt[fl - 1] == 'd' && strspn(fmt + 1, "0123456789+- ") == fl - 2) {
            /* Python's {epoch:02d}: the width and flags, on an integer */
            char f2[40];
            snprintf(f2, sizeof f2, "%.*slld", (int)(fl - 1), fmt);
            snprintf(val, sizeof val, f2, (long long)llround(v));
        } else snprintf(val, sizeof val, "%lld", (long long)llround(v));
        k += (size_t)(auto_insert ? snprintf(out + k, size - k, "%s=%s", key, val) : snprintf(out + k, size - k, "%s", val));
        p = end + 1;
    }
    return LK_STATUS_OK;
}

/* When the callback runs: at the end of a validation or an epoch (top-k
 * and last.ckpt), on a step (the instances due then), or at a stop inside
 * an epoch (last.ckpt of every instance that keeps one, no top-k: a resume
 * must find the top-k lists an uninterrupted run has there). */
typedef enum { CKPT_EVAL, CKPT_STEPS, CKPT_STOP } ckpt_when;
static lk_status ckpt_callback(lk_trainer *tr, ckpt_when when);
lk_status lk__ckpt_callback(lk_trainer *tr) { return ckpt_callback(tr, CKPT_EVAL); }
lk_status lk__ckpt_callback_last(lk_trainer *tr) { return ckpt_callback(tr, CKPT_STEPS); }
lk_status lk__ckpt_callback_stop(lk_trainer *tr) { return ckpt_callback(tr, CKPT_STOP); }

static bool due_steps(const lk_trainer *tr, const lk_ckpt_state *k) {
    return k->c.every_n_train_steps > 0 && tr->global_step > 0 && tr->global_step % k->c.every_n_train_steps == 0;
}

bool lk__ckpt_due_steps(const lk_trainer *tr) {
    if (!tr->cfg.enable_checkpointing || tr->cfg.fast_dev_run) return false;
    for (int j = 0; j < tr->nckpts; j++)
        if (due_steps(tr, &tr->ckpts[j])) return true;
    return false;
}

lk_status lk__callbacks_init(lk_trainer *tr) {
    const lk_trainer_config *c = &tr->cfg;
    tr->nckpts = tr->nes = 0;
    if (!c->enable_checkpointing && c->n_checkpoints > 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "trainer.enable_checkpointing is false but trainer.callbacks has %d ModelCheckpoint%s "
                        "(remove them or set enable_checkpointing: true)", c->n_checkpoints,
                        c->n_checkpoints > 1 ? "s" : "");
    if (c->enable_checkpointing) {
        for (int i = 0; i < c->n_checkpoints && i < LK_MAX_CALLBACKS; i++) tr->ckpts[tr->nckpts++].c = c->checkpoints[i];
        /* The flat keys are Lightning's default ModelCheckpoint when the list
         * has none, and one more instance when trainer.monitor is set. */
        if (c->n_checkpoints == 0 || c->monitor[0]) {
            lk_ckpt_state *k = &tr->ckpts[tr->nckpts++];
            k->flat = true;
            snprintf(k->c.monitor, sizeof k->c.monitor, "%s", c->monitor);
            snprintf(k->c.mode, sizeof k->c.mode, "%s", c->monitor_mode);
            snprintf(k->c.filename, sizeof k->c.filename, "%s", c->checkpoint_filename);
            k->c.save_top_k = c->monitor[0] ? c->save_top_k : 0;
            k->c.save_last = c->save_last;
            k->c.every_n_train_steps = c->every_n_train_steps;
            k->c.every_n_epochs = 1;
            k->c.auto_insert_metric_name = true;
        }
    }
    for (int j = 0; j < tr->nckpts; j++) tr->ckpts[j].best_score = NAN;
    for (int i = 0; i < c->n_early_stopping && i < LK_MAX_CALLBACKS; i++) tr->es[tr->nes++].c = c->early_stopping[i];
    if (c->early_stopping_monitor[0]) {
        lk_early_stopping_config *e = &tr->es[tr->nes++].c;
        snprintf(e->monitor, sizeof e->monitor, "%s", c->early_stopping_monitor);
        snprintf(e->mode, sizeof e->mode, "%s", c->early_stopping_mode);
        e->min_delta = c->early_stopping_min_delta;
        e->patience = c->early_stopping_patience;
        e->strict = true;
        e->check_finite = c->early_stopping_check_finite;
        e->stopping_threshold = c->early_stopping_stopping_threshold;
        e->divergence_threshold = c->early_stopping_divergence_threshold;
    }
    for (int j = 0; j < tr->nes; j++) tr->es[j].best = NAN, tr->es[j].wait = 0;
    return LK_STATUS_OK;
}

/* One ModelCheckpoint instance: top-k by its monitor (or by step when it
 * has none), then last.ckpt. `wrote_last` avoids writing the same
 * last.ckpt twice when instances share a directory. */
static lk_status ckpt_one(lk_trainer *tr, lk_ckpt_state *k, bool primary, ckpt_when when, char *wrote_last,
                          size_t wl_size) {
    bool last_only = when != CKPT_EVAL;
    const lk_checkpoint_config *c = &k->c;
    char dir[LK_PATH2];
    instance_dir(tr, k, dir, sizeof dir);
    lk_status st = lk_file_mkdirs(dir);
    /* The flat instance without a monitor keeps last.ckpt only; step-driven
     * saves of the flat instance are last.ckpt only (its old meaning). */
    bool topk = !(k->flat && (last_only || !c->monitor[0])) && c->save_top_k != 0;
    if (!k->flat && !last_only) /* Lightning: every_n_train_steps instances save on steps, not at epoch ends; */
        topk = topk && (c->every_n_train_steps > 0 /* a step due on the epoch's last batch saves here */
                            ? tr->at_epoch_end && due_steps(tr, k)
                            : c->every_n_epochs > 0 && (tr->epoch + 1) % c->every_n_epochs == 0);
    if (when == CKPT_STOP) { /* no top-k here; but a monitor no validation ever fed is said, as below */
        double v;
        if (c->save_top_k != 0 && c->monitor[0] && !tr->val_ran && !k->warned && !lk_trainer_metric(tr, c->monitor, &v)) {
            k->warned = true;
            lk_log_warn("ModelCheckpoint: %s '%s' has no value at step %lld (no validation has run yet); "
                        "saving last.ckpt only, no top-k checkpoint",
                        k->flat ? "trainer.monitor" : "monitor", c->monitor, (long long)tr->global_step);
        }
        topk = false;
    }
    bool no_value = false;
    if (!st && topk) {
        double v;
        bool have = c->monitor[0] ? lk_trainer_metric(tr, c->monitor, &v) : (v = (double)tr->global_step, true);
        bool max = !c->monitor[0] || !strcmp(c->mode, "max");
        if (!have) {
            /* As Lightning: a metric missing after validation ran is a
             * misconfiguration; before any validation (max_steps inside the
             * first epoch, check_val_every_n_epoch > epochs, limit_val_batches
             * 0) top-k is skipped and last.ckpt saved instead. */
            char names[1024];
            lk__metrics_available(tr, names, sizeof names);
            if (tr->val_ran)
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "ModelCheckpoint: %s '%s' was never logged; logged metrics: %s",
                              k->flat ? "trainer.monitor" : "monitor", c->monitor, names);
            else if (!k->warned) {
                k->warned = true;
                lk_log_warn("ModelCheckpoint: %s '%s' has no value at step %lld (no validation has run yet); "
                            "saving last.ckpt only, no top-k checkpoint",
                            k->flat ? "trainer.monitor" : "monitor", c->monitor, (long long)tr->global_step);
            }
            no_value = true;
        } else if (isfinite(v)) {
            int worst = -1;
            for (int i = 0; i < k->ntopk; i++)
                if (worst < 0 || (max ? k->topk[i].score < k->topk[worst].score : k->topk[i].score > k->topk[worst].score))
                    worst = i;
            bool keep = c->save_top_k < 0 || k->ntopk < c->save_top_k ||
                        (worst >= 0 && (max ? v > k->topk[worst].score : v < k->topk[worst].score));
            if (keep) {
                char name[512], path[LK_PATH2];
                st = render_name(tr, c->filename, c->auto_insert_metric_name, name, sizeof name);
                if (!st && snprintf(path, sizeof path, "%s/%s.ckpt", dir, name) >= (int)sizeof path)
                    st = lk_error(LK_STATUS_INVALID_ARGUMENT, "ModelCheckpoint: the path %s/%s.ckpt is longer than %d bytes",
                                  dir, name, LK_PATH2 - 1);
                if (!st) st = lk__ckpt_save_ex(tr, path, c->save_weights_only);
                if (!st && c->verbose) lk_log0("ModelCheckpoint: saved %s", path);
                if (!st) {
                    if (c->save_top_k > 0 && k->ntopk >= c->save_top_k) {
                        /* lk__ckpt_adopt kept only files of this directory; checked again here
                         * because a deletion cannot be taken back */
                        if (strcmp(k->topk[worst].path, path) && file_in_dir(k->topk[worst].path, dir))
                            lk__shards_remove(k->topk[worst].path); /* a file, or a sharded set's directory */
                        k->topk[worst] = k->topk[--k->ntopk];
                    }
                    for (int i = 0; i < k->ntopk; i++) /* the same name again (e.g. {epoch} twice in an epoch) */
                        if (!strcmp(k->topk[i].path, path)) k->topk[i] = k->topk[--k->ntopk];
                    lk_topk *n = lk_realloc(k->topk, (size_t)(k->ntopk + 1) * sizeof *n);
                    if (n) {
                        k->topk = n;
                        n[k->ntopk].score = v;
                        snprintf(n[k->ntopk].path, LK_PATH2, "%s", path);
                        k->ntopk++;
                    }
                    if (isnan(k->best_score) || (max ? v > k->best_score : v < k->best_score)) {
                        k->best_score = v;
                        snprintf(k->best_path, sizeof k->best_path, "%s", path);
                    }
                    if (primary) {
                        tr->best_score = k->best_score;
                        snprintf(tr->best_ckpt, sizeof tr->best_ckpt, "%s", k->best_path);
                    }
                }
            }
        }
    }
    if (!st && (c->save_last || (k->flat && last_only) || no_value)) {
        char path[LK_PATH2];
        if (snprintf(path, sizeof path, "%s/last.ckpt", dir) >= (int)sizeof path)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "ModelCheckpoint: the path %s/last.ckpt is longer than %d bytes",
                            dir, LK_PATH2 - 1);
        if (strcmp(wrote_last, path)) {
            st = lk__ckpt_save(tr, path);
            if (!st) snprintf(wrote_last, wl_size, "%s", path);
            if (!st && (!tr->last_ckpt[0] || primary)) snprintf(tr->last_ckpt, sizeof tr->last_ckpt, "%s", path);
        }
    }
    return st;
}

static lk_status ckpt_callback(lk_trainer *tr, ckpt_when when) {
    const lk_trainer_config *c = &tr->cfg;
    if (!c->enable_checkpointing || c->fast_dev_run) return LK_STATUS_OK;
    /* Inside an epoch the checkpoint keeps every rank's epoch sums so far. */
    if (!tr->at_epoch_end && tr->resume_batch > 0) LK_TRY(lk__metrics_gather(tr));
    /* The others wait for this write in the all_reduce below: bound that wait
     * by checkpoint_timeout, not comm_timeout, and name the write. */
    if (tr->world > 1) {
        char what[LK_PATH + 64];
        snprintf(what, sizeof what, "checkpoint write to %s/checkpoints", tr->log_dir[0] ? tr->log_dir : "(no log dir)");
        LK_TRY(lk_comm_long_work(tr->comm, 0, what, "trainer.checkpoint_timeout", c->checkpoint_timeout));
    }
    lk_status st = LK_STATUS_OK;
    /* trainer.state_dict_type sharded: no gather; every rank stages its own
     * shard, which rank 0's sets take (ckpt_shards.c). */
    bool sharded = lk__shards_wanted(tr);
    if (sharded) {
        char dir[LK_PATH2];
        instance_dir(tr, &tr->ckpts[0], dir, sizeof dir);
        st = tr->nckpts ? lk__shards_stage(tr, dir) : LK_STATUS_OK;
    } else if (!strcmp(c->state_dict_type, "sharded") && !tr->shard_noted) {
        tr->shard_noted = true;
        lk_log0("trainer.state_dict_type sharded: strategy %s holds every parameter whole on each rank, so its "
                "checkpoints stay one file (sets are written by deepspeed_stage_1/2/3 and fsdp)", lk_strategy_name(tr->strat));
    }
    /* A sharded strategy's state dict is a gather every rank takes part in,
     * while only the writer knows which files (top-k, last) are due: every
     * rank gathers once here and the writer's files share the result. A
     * failed gather is this rank's error, agreed below like a failed write.
     * Replicas keep reading theirs inside the write (views, no collective). */
    if (!sharded && lk_strategy_state_dict_collective(tr->strat)) {
        st = lk_strategy_state_dict(tr->strat, tr->module->net, &tr->ckpt_state);
        if (!st && tr->optim) st = lk_strategy_optimizer_state(tr->strat, tr->optim, &tr->ckpt_optim);
        tr->ckpt_state_ready = !st;
    }
    if (!st && lk_strategy_writes_checkpoint(tr->strat)) {
        char wrote_last[LK_PATH2] = "";
        for (int j = 0; !st && j < tr->nckpts; j++)
            if (when != CKPT_STEPS || due_steps(tr, &tr->ckpts[j]))
                st = ckpt_one(tr, &tr->ckpts[j], j == 0, when, wrote_last, sizeof wrote_last);
    }
    lk__shards_unstage(tr); /* the sets hold their own links to the shards */
    lk_named_tensors_clear(&tr->ckpt_state);
    lk_named_tensors_clear(&tr->ckpt_optim);
    tr->ckpt_state_ready = false;
    lk_free(tr->ckpt_rows); /* another checkpoint (OnExceptionCheckpoint) must not take them */
    tr->ckpt_rows = NULL;
    /* Everyone learns whether rank 0 succeeded, and nobody runs ahead of a
     * checkpoint that is still being written. */
    int32_t code = (int32_t)st;
    if (tr->world > 1) {
        lk_status cs = lk_comm_all_reduce(tr->comm, &code, 1, LK_I32, LK_REDUCE_MAX);
        if (cs) return cs;
    }
    if (code && !st)
        return lk_error((lk_status)code, lk_strategy_state_dict_collective(tr->strat)
                                             ? "another rank failed to gather the state dict for a checkpoint, or "
                                               "rank 0 to write it"
                                             : "rank 0 failed to write a checkpoint");
    return st;
}

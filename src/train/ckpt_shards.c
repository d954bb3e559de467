/* Sharded checkpoint sets (ckpt_shards.h, docs/CHECKPOINTS.md): each rank
 * writes the pieces of the parameters it owns (and their optimizer state)
 * instead of a gather to rank 0; a load asks each rank's pieces under its
 * current layout and fills them from whichever shard files cover them, so
 * a set saved at one world size loads at any other, and into the replicas.
 *
 * Why staging: only rank 0 knows which files a ModelCheckpoint writes now
 * (top-k, last; the monitor's value may differ per rank), while every rank
 * holds a shard. So every rank writes its shard once into a staging
 * directory, all agree it worked, and rank 0 then makes each due set from
 * the staged files (hard links, a copy where linking fails), adds the
 * trainer state and the index, and swaps the set in. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "optim/optim_impl.h"
#include "train/ckpt_shards.h"

#define SHARD_FORMAT "lockstep-checkpoint-shard"
#define RANGE_PREFIX "range."

/* Test hook: LK_TEST_SHARD_CRASH=RANK:STEP ends this process in the save at
 * global step STEP, as a crash would: rank 0 with its new set built but
 * not yet swapped in, another rank after staging its shard. Unset: nothing. */
static void crash_point(const lk_trainer *tr) {
    const char *v = lk_env_get("LK_TEST_SHARD_CRASH");
    int rank;
    long long step;
    if (v && sscanf(v, "%d:%lld", &rank, &step) == 2 && rank == tr->rank && step == tr->global_step) {
        fprintf(stderr, "LK_TEST_SHARD_CRASH: rank %d ends itself in the save at step %lld\n", rank, step);
        _exit(3);
    }
}

static void shard_name(char *out, size_t size, int r, int n) {
    snprintf(out, size, "shard-%05d-of-%05d.safetensors", r + 1, n);
}

bool lk__shards_wanted(const lk_trainer *tr) {
    return !strcmp(tr->cfg.state_dict_type, "sharded") && lk_strategy_shards_state(tr->strat);
}

bool lk__shards_is_set(const char *path) {
    struct stat sb;
    return path && !stat(path, &sb) && S_ISDIR(sb.st_mode);
}

/* Only the files a set holds are removed, then the directory: anything
 * else in it (a user's file) keeps the directory, with a warning. */
int lk__shards_remove(const char *path) {
    if (!lk__shards_is_set(path)) return unlink(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *de;
    char f[LK_PATH2 + 300];
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        bool ours = (!strncmp(n, "shard-", 6) && strstr(n, ".safetensors")) || !strncmp(n, LK_SHARDS_STATE, 25) ||
                    !strncmp(n, LK_SHARDS_INDEX, 28);
        if (!ours) continue;
        snprintf(f, sizeof f, "%s/%s", path, n);
        unlink(f);
    }
    closedir(d);
    int r = rmdir(path);
    if (r) lk_log_warn("checkpoint set %s: not removed whole (%s): it holds files that are not the set's", path,
                       strerror(errno));
    return r;
}

/* ---- writing ---------------------------------------------------------------------------------- */

lk_status lk__shards_stage(lk_trainer *tr, const char *dir) {
    /* rank 0 names the staging directory and the set; the others learn both */
    struct {
        char id[40];
        char dir[LK_PATH2];
    } msg;
    memset(&msg, 0, sizeof msg);
    lk_status st = LK_STATUS_OK;
    if (tr->rank == 0) {
        static unsigned counter;
        unsigned long long h = (unsigned long long)(lk_time_now() * 1e9) ^ ((unsigned long long)getpid() << 32) ^
                               (unsigned long long)tr->global_step * 0x9e3779b97f4a7c15ull ^ ++counter;
        h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33; /* mixed: two saves in one run differ */
        snprintf(msg.id, sizeof msg.id, "%016llx", h);
        if (snprintf(msg.dir, sizeof msg.dir, "%s/.shards-%s", dir, msg.id) >= (int)sizeof msg.dir)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "sharded checkpoint: the path %s/.shards-%s is too long", dir, msg.id);
        if (!st) st = lk_file_mkdirs(msg.dir);
        if (st) msg.dir[0] = 0; /* the others then fail alike */
    }
    if (tr->world > 1) LK_TRY(lk_comm_broadcast(tr->comm, &msg, sizeof msg, LK_U8, 0));
    if (!st && !msg.dir[0])
        st = lk_error(LK_STATUS_IO, "sharded checkpoint: rank 0 could not make the staging directory");
    lk_shard_piece *p = NULL;
    int n = 0;
    if (!st) st = lk_strategy_shard_pieces(tr->strat, &p, &n);
    int nst = tr->optim ? lk__optimizer_state_arrays(tr->optim) : 0;
    /* names: "<param>" and "optimizer.state.<param>.<array>" per piece; metadata: one range per piece */
    int ne = n * (1 + nst), nm = 0;
    lk_st_entry *e = st ? NULL : lk_calloc((size_t)ne + 1, sizeof *e);
    lk_st_meta *m = st ? NULL : lk_calloc((size_t)n + 8, sizeof *m);
    char (*names)[512] = st ? NULL : lk_calloc((size_t)ne + 1, 512);
    char (*vals)[160] = st ? NULL : lk_calloc((size_t)n + 1, 160);
    char (*keys)[512] = st ? NULL : lk_calloc((size_t)n + 1, 512);
    int64_t *len = st ? NULL : lk_calloc((size_t)n + 1, sizeof *len);
    if (!st && (!e || !m || !names || !vals || !keys || !len)) st = LK_STATUS_OUT_OF_MEMORY;
    char rank_s[16], world_s[16];
    snprintf(rank_s, sizeof rank_s, "%d", tr->rank);
    snprintf(world_s, sizeof world_s, "%d", tr->world);
    int k = 0;
    for (int i = 0; !st && i < n; i++) {
        if (p[i].nstate && p[i].nstate != nst)
            st = lk_error(LK_STATUS_INVALID_USAGE, "sharded checkpoint: the strategy holds %d optimizer state arrays "
                          "of '%s', the optimizer has %d", p[i].nstate, p[i].name, nst);
        len[i] = p[i].hi - p[i].lo;
        snprintf(names[k], 512, "%s", p[i].name);
        e[k++] = (lk_st_entry){.name = names[k - 1], .dtype = p[i].dtype, .ndim = 1, .shape = &len[i],
                               .data = p[i].value};
        for (int j = 0; j < p[i].nstate; j++) {
            snprintf(names[k], 512, "optimizer.state.%s.%s", p[i].name, lk__optimizer_state_array_name(tr->optim, j));
            e[k++] = (lk_st_entry){.name = names[k - 1], .dtype = LK_F32, .ndim = 1, .shape = &len[i],
                                   .data = p[i].state[j]};
        }
        /* "lo hi d0,d1,...": the range and the whole tensor's shape */
        int w = snprintf(vals[i], 160, "%lld %lld ", (long long)p[i].lo, (long long)p[i].hi);
        for (int d = 0; d < p[i].ndim && w < 150; d++)
            w += snprintf(vals[i] + w, (size_t)(160 - w), "%s%lld", d ? "," : "", (long long)p[i].shape[d]);
        snprintf(keys[i], 512, RANGE_PREFIX "%s", p[i].name);
        m[nm++] = (lk_st_meta){keys[i], vals[i]};
    }
    if (!st) {
        m[nm++] = (lk_st_meta){"format", SHARD_FORMAT};
        m[nm++] = (lk_st_meta){"set_id", msg.id};
        m[nm++] = (lk_st_meta){"shard", rank_s};
        m[nm++] = (lk_st_meta){"shards", world_s};
        m[nm++] = (lk_st_meta){"strategy", lk_strategy_name(tr->strat)};
        char path[LK_PATH2 + 64], fname[64];
        shard_name(fname, sizeof fname, tr->rank, tr->world);
        snprintf(path, sizeof path, "%s/%s", msg.dir, fname);
        st = lk_safetensors_write(path, e, k, m, nm);
    }
    lk_free(p);
    lk_free(e);
    lk_free(m);
    lk_free(names);
    lk_free(vals);
    lk_free(keys);
    lk_free(len);
    if (!st && tr->rank != 0) crash_point(tr);
    /* every rank learns whether every shard is on disk before rank 0 uses them */
    int32_t code = (int32_t)st;
    lk_status cs = tr->world > 1 ? lk_comm_all_reduce(tr->comm, &code, 1, LK_I32, LK_REDUCE_MAX) : LK_STATUS_OK;
    if (cs || code) {
        if (tr->rank == 0 && msg.dir[0]) {
            snprintf(tr->shard_stage, sizeof tr->shard_stage, "%s", msg.dir);
            lk__shards_unstage(tr);
        }
        if (cs) return cs; /* a rank gone: the staging went, the previous checkpoint stays */
        return st ? st : lk_error((lk_status)code, "sharded checkpoint: another rank failed to write its shard");
    }
    snprintf(tr->shard_stage, sizeof tr->shard_stage, "%s", msg.dir);
    snprintf(tr->shard_set_id, sizeof tr->shard_set_id, "%s", msg.id);
    return LK_STATUS_OK;
}

void lk__shards_unstage(lk_trainer *tr) {
    if (!tr->shard_stage[0]) return;
    if (tr->rank == 0) {
        DIR *d = opendir(tr->shard_stage);
        struct dirent *de;
        char f[LK_PATH2 + 300];
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            snprintf(f, sizeof f, "%s/%s", tr->shard_stage, de->d_name);
            unlink(f);
        }
        if (d) closedir(d);
        rmdir(tr->shard_stage);
    }
    tr->shard_stage[0] = 0;
}

static lk_status copy_file(const char *from, const char *to) {
    if (!link(from, to)) return LK_STATUS_OK;
    FILE *in = fopen(from, "rb");
    if (!in) return lk_error(LK_STATUS_IO, "sharded checkpoint: cannot read %s: %s", from, strerror(errno));
    int fd = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fclose(in);
        return lk_error(LK_STATUS_IO, "sharded checkpoint: cannot create %s: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t got;
    lk_status st = LK_STATUS_OK;
    while (!st && (got = fread(buf, 1, sizeof buf, in)) > 0) st = lk_file_write_all(fd, to, buf, got);
    if (!st && fsync(fd)) st = lk_error(LK_STATUS_IO, "sharded checkpoint: syncing %s: %s", to, strerror(errno));
    close(fd);
    fclose(in);
    return st;
}

static void sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* JSON string contents: the names are parameters' (dots, digits, letters),
 * escaped anyway. */
static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

/* The index, from the shards themselves (opened and verified here). */
static lk_status write_index(const char *tmp, int nshards, const char *id) {
    char path[LK_PATH2 + 200], fname[64];
    snprintf(path, sizeof path, "%s/%s", tmp, LK_SHARDS_INDEX);
    size_t cap = 0;
    char *text = NULL;
    FILE *f = open_memstream(&text, &cap);
    if (!f) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = LK_STATUS_OK;
    lk_st_file **sf = lk_calloc((size_t)nshards + 1, sizeof *sf);
    if (!sf) st = LK_STATUS_OUT_OF_MEMORY;
    long long total = 0;
    for (int r = 0; !st && r < nshards; r++) {
        char p2[LK_PATH2 + 200];
        shard_name(fname, sizeof fname, r, nshards);
        snprintf(p2, sizeof p2, "%s/%s", tmp, fname);
        st = lk_safetensors_open(p2, &sf[r]);
        for (int i = 0; !st && i < lk_safetensors_count(sf[r]); i++) total += (long long)lk_safetensors_at(sf[r], i)->nbytes;
    }
    if (!st) {
        fprintf(f, "{\n  \"metadata\": {\"format\": \"lockstep-checkpoint-set\", \"format_version\": \"1\", "
                   "\"set_id\": \"%s\", \"shards\": %d, \"total_size\": %lld, \"trainer_state\": \"%s\"},\n",
                id, nshards, total, LK_SHARDS_STATE);
        /* weight_map: each parameter's first file (a parameter split over
         * several files is in each one's ranges below) */
        fprintf(f, "  \"weight_map\": {");
        int nw = 0;
        for (int r = 0; r < nshards; r++) {
            shard_name(fname, sizeof fname, r, nshards);
            for (int i = 0; i < lk_safetensors_count(sf[r]); i++) {
                const char *nm = lk_safetensors_at(sf[r], i)->name;
                if (!strncmp(nm, "optimizer.", 10)) continue;
                bool seen = false;
                for (int q = 0; q < r && !seen; q++) seen = lk_safetensors_find(sf[q], nm) != NULL;
                if (seen) continue;
                fprintf(f, "%s\n    ", nw++ ? "," : "");
                json_str(f, nm);
                fprintf(f, ": \"%s\"", fname);
            }
        }
        /* the buffers rank 0 keeps whole in the trainer state */
        char sp[LK_PATH2 + 200];
        snprintf(sp, sizeof sp, "%s/%s", tmp, LK_SHARDS_STATE);
        lk_st_file *tf = NULL;
        if (!lk_safetensors_open(sp, &tf)) {
            for (int i = 0; i < lk_safetensors_count(tf); i++) {
                const char *nm = lk_safetensors_at(tf, i)->name;
                if (!strncmp(nm, "optimizer.", 10) || !strncmp(nm, "lr_scheduler.", 13) || !strncmp(nm, "grad_scaler.", 12))
                    continue;
                fprintf(f, "%s\n    ", nw++ ? "," : "");
                json_str(f, nm);
                fprintf(f, ": \"%s\"", LK_SHARDS_STATE);
            }
            lk_safetensors_close(tf);
        }
        fprintf(f, "\n  },\n  \"lockstep_files\": {");
        for (int r = 0; r < nshards; r++) {
            shard_name(fname, sizeof fname, r, nshards);
            fprintf(f, "%s\n    \"%s\": {\"set_id\": \"%s\", \"ranges\": {", r ? "," : "", fname, id);
            int np = 0;
            for (int i = 0; i < lk_safetensors_meta_count(sf[r]); i++) {
                const char *key = lk_safetensors_meta_key(sf[r], i);
                if (strncmp(key, RANGE_PREFIX, strlen(RANGE_PREFIX))) continue;
                const char *nm = key + strlen(RANGE_PREFIX);
                const lk_st_info *info = lk_safetensors_find(sf[r], nm);
                long long lo = 0, hi = 0;
                char shape[128] = "";
                sscanf(lk_safetensors_meta_value(sf[r], i), "%lld %lld %127s", &lo, &hi, shape);
                fprintf(f, "%s\n      ", np++ ? "," : "");
                json_str(f, nm);
                fprintf(f, ": {\"lo\": %lld, \"hi\": %lld, \"shape\": [%s], \"dtype\": \"%s\"}", lo, hi, shape,
                        info ? info->dtype_name : "?");
            }
            fprintf(f, "\n    }}");
        }
        fprintf(f, "\n  }\n}\n");
    }
    fclose(f);
    for (int r = 0; sf && r < nshards; r++) lk_safetensors_close(sf[r]);
    lk_free(sf);
    if (!st) st = lk_file_write_atomic(path, text, strlen(text));
    free(text);
    return st;
}

lk_status lk__shards_write_set(lk_trainer *tr, const char *path, bool weights_only, lk__shards_state_writer write_state) {
    if (!tr->shard_stage[0]) return lk_error(LK_STATUS_INVALID_USAGE, "sharded checkpoint %s: no shards were staged", path);
    char tmp[LK_PATH2 + 64], a[LK_PATH2 + 200], b[LK_PATH2 + 200], fname[64];
    snprintf(tmp, sizeof tmp, "%s.tmp-%s", path, tr->shard_set_id);
    if (lk__shards_is_set(tmp)) lk__shards_remove(tmp);
    if (mkdir(tmp, 0755) && errno != EEXIST)
        return lk_error(LK_STATUS_IO, "sharded checkpoint: cannot make %s: %s", tmp, strerror(errno));
    lk_status st = LK_STATUS_OK;
    for (int r = 0; !st && r < tr->world; r++) {
        shard_name(fname, sizeof fname, r, tr->world);
        snprintf(a, sizeof a, "%s/%s", tr->shard_stage, fname);
        snprintf(b, sizeof b, "%s/%s", tmp, fname);
        st = copy_file(a, b);
    }
    char nshards[16];
    snprintf(nshards, sizeof nshards, "%d", tr->world);
    lk_st_meta extra[] = {{"set_id", tr->shard_set_id}, {"shards", nshards}, {"state_dict_type", "sharded"}};
    snprintf(b, sizeof b, "%s/%s", tmp, LK_SHARDS_STATE);
    if (!st) st = write_state(tr, b, weights_only, extra, 3);
    if (!st) st = write_index(tmp, tr->world, tr->shard_set_id); /* last: the set is whole */
    sync_dir(tmp);
    if (!st) crash_point(tr);
    /* swapped in: the previous checkpoint under that name (set or file)
     * stays whole until the new set is in its place */
    if (!st) {
        struct stat sb;
        if (!lstat(path, &sb)) {
            if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) == 0) {
                lk__shards_remove(tmp); /* the previous one, now under the temporary name */
            } else { /* a filesystem without the exchange: moved aside first */
                snprintf(a, sizeof a, "%s.old-%s", path, tr->shard_set_id);
                if (rename(path, a) || rename(tmp, path))
                    st = lk_error(LK_STATUS_IO, "sharded checkpoint: cannot move %s to %s: %s", tmp, path, strerror(errno));
                else lk__shards_remove(a);
            }
        } else if (rename(tmp, path)) {
            st = lk_error(LK_STATUS_IO, "sharded checkpoint: cannot move %s to %s: %s", tmp, path, strerror(errno));
        }
    }
    if (st) lk__shards_remove(tmp);
    char dir[LK_PATH2];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    sync_dir(slash ? dir : ".");
    return st;
}

/* ---- reading ---------------------------------------------------------------------------------- */

typedef struct srange {
    const char *name; /* the file's */
    int file;
    int64_t lo, hi, numel;
    int ndim;
    int64_t shape[LK_MAX_DIMS];
} srange;

struct lk__shard_set {
    char path[LK_PATH2];
    char id[40];
    lk_st_file *state;
    lk_st_file **files;
    int nfiles;
    srange *r;
    int nr;
};

lk_st_file *lk__shards_state(const lk__shard_set *set) { return set->state; }

void lk__shards_close(lk__shard_set *set) {
    if (!set) return;
    for (int i = 0; i < set->nfiles; i++) lk_safetensors_close(set->files[i]);
    lk_free(set->files);
    lk_safetensors_close(set->state);
    lk_free(set->r);
    lk_free(set);
}

static lk_status parse_range(const char *file, const char *name, const char *v, srange *r) {
    char *end;
    r->lo = strtoll(v, &end, 10);
    r->hi = strtoll(end, &end, 10);
    r->ndim = 0;
    r->numel = 1;
    bool ok = *end == ' ';
    if (ok) end++;
    while (ok && *end && r->ndim < LK_MAX_DIMS) {
        char *e2;
        long long d = strtoll(end, &e2, 10);
        if (e2 == end || d < 0) { ok = false; break; }
        r->shape[r->ndim++] = d;
        r->numel *= d;
        end = *e2 == ',' ? e2 + 1 : e2;
        if (*e2 && *e2 != ',') ok = false;
    }
    if (!ok || !(0 <= r->lo && r->lo <= r->hi && r->hi <= r->numel))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint shard %s: metadata '" RANGE_PREFIX "%s' is '%.60s', "
                        "expected 'lo hi shape' with 0 <= lo <= hi <= the shape's elements", file, name, v);
    return LK_STATUS_OK;
}

lk_status lk__shards_open(const char *path, lk__shard_set **out) {
    *out = NULL;
    lk__shard_set *set = lk_calloc(1, sizeof *set);
    if (!set) return LK_STATUS_OUT_OF_MEMORY;
    snprintf(set->path, sizeof set->path, "%s", path);
    char p[LK_PATH2 + 64], fname[64];
    lk_status st = LK_STATUS_OK;
    snprintf(p, sizeof p, "%s/%s", path, LK_SHARDS_INDEX);
    FILE *ix = fopen(p, "rb");
    char *itext = NULL;
    if (!ix) {
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: %s is missing (%s): the set is incomplete (a "
                      "save that did not finish writes none) or the directory is not a checkpoint set",
                      path, LK_SHARDS_INDEX, strerror(errno));
    } else {
        fseek(ix, 0, SEEK_END);
        long n = ftell(ix);
        fseek(ix, 0, SEEK_SET);
        itext = n >= 0 ? lk_malloc((size_t)n + 1) : NULL;
        if (!itext || fread(itext, 1, (size_t)n, ix) != (size_t)n) st = lk_error(LK_STATUS_IO, "checkpoint set %s: cannot read %s", path, LK_SHARDS_INDEX);
        else itext[n] = 0;
        fclose(ix);
    }
    snprintf(p, sizeof p, "%s/%s", path, LK_SHARDS_STATE);
    if (!st && access(p, F_OK))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: %s is missing (expected rank 0's training state)",
                      path, LK_SHARDS_STATE);
    if (!st && lk_safetensors_open(p, &set->state))
        st = lk_error(lk_last_status(), "checkpoint set %s: %s cannot be read: %s", path, LK_SHARDS_STATE, lk_last_error());
    const char *id = st ? NULL : lk_safetensors_meta(set->state, "set_id");
    const char *ns = st ? NULL : lk_safetensors_meta(set->state, "shards");
    char *end = NULL;
    long nshards = ns ? strtol(ns, &end, 10) : 0;
    if (!st && (!id || !ns || *end || nshards < 1 || nshards > (1 << 20) || strlen(id) >= sizeof set->id))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: %s has no valid set_id and shards metadata",
                      path, LK_SHARDS_STATE);
    if (!st) {
        snprintf(set->id, sizeof set->id, "%s", id);
        char want[80];
        snprintf(want, sizeof want, "\"set_id\": \"%s\"", id);
        if (!strstr(itext, want))
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: %s belongs to another checkpoint set (expected "
                          "set_id %s, the one of %s): the set's files come from different saves", path, LK_SHARDS_INDEX,
                          id, LK_SHARDS_STATE);
    }
    lk_free(itext);
    if (!st && !(set->files = lk_calloc((size_t)nshards, sizeof *set->files))) st = LK_STATUS_OUT_OF_MEMORY;
    if (!st) set->nfiles = (int)nshards;
    /* every file present, readable and of this set before anything is loaded */
    for (int r = 0; !st && r < set->nfiles; r++) {
        shard_name(fname, sizeof fname, r, set->nfiles);
        snprintf(p, sizeof p, "%s/%s", path, fname);
        if (access(p, F_OK)) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: shard file %s is missing (expected shard %d of "
                          "%d of set %s)", path, fname, r + 1, set->nfiles, set->id);
            break;
        }
        if (lk_safetensors_open(p, &set->files[r])) {
            st = lk_error(lk_last_status(), "checkpoint set %s: shard file %s cannot be read (truncated or corrupt?): %s",
                          path, fname, lk_last_error());
            break;
        }
        const char *fid = lk_safetensors_meta(set->files[r], "set_id"), *fr = lk_safetensors_meta(set->files[r], "shard");
        char rs[16];
        snprintf(rs, sizeof rs, "%d", r);
        if (!fid || strcmp(fid, set->id))
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: shard file %s belongs to another checkpoint "
                          "set (set_id %s, expected %s): a file from another run or another save", path, fname,
                          fid ? fid : "(none)", set->id);
        else if (!fr || strcmp(fr, rs))
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: shard file %s says it is shard '%s', expected %d",
                          path, fname, fr ? fr : "(none)", r);
        for (int i = 0; !st && i < lk_safetensors_meta_count(set->files[r]); i++) {
            const char *key = lk_safetensors_meta_key(set->files[r], i);
            if (strncmp(key, RANGE_PREFIX, strlen(RANGE_PREFIX))) continue;
            srange *nr = lk_realloc(set->r, (size_t)(set->nr + 1) * sizeof *nr);
            if (!nr) { st = LK_STATUS_OUT_OF_MEMORY; break; }
            set->r = nr;
            srange *x = &set->r[set->nr];
            memset(x, 0, sizeof *x);
            x->name = key + strlen(RANGE_PREFIX);
            x->file = r;
            st = parse_range(p, x->name, lk_safetensors_meta_value(set->files[r], i), x);
            const lk_st_info *info = st ? NULL : lk_safetensors_find(set->files[r], x->name);
            if (!st && (!info || info->numel != x->hi - x->lo))
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint shard %s: tensor '%s' %s (its range [%lld, %lld) "
                              "says %lld elements)", p, x->name, info ? "has another length" : "is missing",
                              (long long)x->lo, (long long)x->hi, (long long)(x->hi - x->lo));
            if (!st) set->nr++;
        }
    }
    if (st) {
        lk__shards_close(set);
        return st;
    }
    *out = set;
    return LK_STATUS_OK;
}

/* Whether `name` is whole in the set: its ranges tile [0, numel) of one
 * shape; *first: one of its ranges (the whole tensor's shape). */
static bool covered(const lk__shard_set *set, const char *name, const srange **first) {
    int64_t at = 0, numel = -1;
    *first = NULL;
    for (bool moved = true; moved;) { /* ranges in any order: find the one starting at `at` */
        moved = false;
        for (int i = 0; i < set->nr; i++) {
            const srange *x = &set->r[i];
            if (strcmp(x->name, name) || x->lo != at || x->hi == x->lo) continue;
            if (!*first) *first = x, numel = x->numel;
            if (x->numel != numel) return false;
            at = x->hi;
            moved = true;
            break;
        }
    }
    if (!*first) { /* an empty tensor: one empty range */
        for (int i = 0; i < set->nr; i++)
            if (!strcmp(set->r[i].name, name) && set->r[i].numel == 0) *first = &set->r[i];
        return *first != NULL;
    }
    return at == numel;
}

/* [lo, hi) of `name` (field NULL: its values; else optimizer array `field`)
 * into dst (hi - lo elements of dt), from whichever files hold it. */
static lk_status read_range(const lk__shard_set *set, const char *name, const char *field, int64_t lo, int64_t hi,
                            void *dst, lk_dtype dt) {
    char tname[600];
    if (field) snprintf(tname, sizeof tname, "optimizer.state.%s.%s", name, field);
    else snprintf(tname, sizeof tname, "%s", name);
    int64_t done = 0;
    for (int i = 0; i < set->nr && lo < hi; i++) {
        const srange *x = &set->r[i];
        if (strcmp(x->name, name)) continue;
        int64_t a = lo > x->lo ? lo : x->lo, b = hi < x->hi ? hi : x->hi;
        if (b <= a) continue;
        const lk_st_info *info;
        LK_TRY(lk_safetensors_get(set->files[x->file], tname, &info));
        if (info->dtype < 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: '%s' has dtype %s", set->path, tname, info->dtype_name);
        int64_t cnt = b - a;
        const char *src = (const char *)info->data + (size_t)(a - x->lo) * info->elem_size;
        char *out = (char *)dst + (size_t)(a - lo) * lk_dtype_size(dt);
        if ((lk_dtype)info->dtype == dt) {
            memcpy(out, src, (size_t)cnt * info->elem_size);
        } else { /* another precision: converted as a whole checkpoint's load converts */
            lk_tensor *s = lk_tensor_wrap((lk_dtype)info->dtype, 1, &cnt, (void *)src);
            lk_tensor *d = lk_tensor_wrap(dt, 1, &cnt, out);
            lk_status st = s && d ? lk_tensor_copy(d, s) : lk_last_status();
            lk_tensor_release(s);
            lk_tensor_release(d);
            LK_TRY(st);
        }
        done += cnt;
    }
    if (done != hi - lo)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: elements [%lld, %lld) of '%s' are in no shard",
                        set->path, (long long)lo, (long long)hi, tname);
    return LK_STATUS_OK;
}

static bool has_state(const lk__shard_set *set, const char *name) {
    char key[600];
    snprintf(key, sizeof key, "optimizer.state.%s.step", name);
    return lk_safetensors_find(set->state, key) != NULL;
}

lk_status lk__shards_check(const lk__shard_set *set, const lk_named_tensors *live, const lk_optimizer *optim) {
    char msg[2048] = "";
    int bad = 0;
    for (int i = 0; i < live->n; i++) {
        const char *name = live->items[i].name;
        const lk_tensor *t = live->items[i].tensor;
        if (lk_safetensors_find(set->state, name)) continue; /* a buffer: load_named checks it */
        const srange *x;
        char one[700] = "";
        if (!covered(set, name, &x)) {
            snprintf(one, sizeof one, "'%s' is not whole in the shards", name);
        } else {
            bool same = x->ndim == t->ndim;
            for (int d = 0; same && d < t->ndim; d++) same = x->shape[d] == t->shape[d];
            if (!same) snprintf(one, sizeof one, "'%s' has another shape in the set", name);
        }
        if (!one[0] && optim && has_state(set, name)) {
            for (int k = 0; k < lk__optimizer_state_arrays(optim) && !one[0]; k++) {
                char tn[600];
                snprintf(tn, sizeof tn, "optimizer.state.%s.%s", name, lk__optimizer_state_array_name(optim, k));
                for (int j = 0; j < set->nr && !one[0]; j++)
                    if (!strcmp(set->r[j].name, name) && !lk_safetensors_find(set->files[set->r[j].file], tn))
                        snprintf(one, sizeof one, "'%s' is not in every shard of '%s' (saved with another optimizer?)",
                                 tn, name);
            }
        }
        if (!one[0]) continue;
        if (bad < 8) snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%s%s", bad ? "; " : "", one);
        bad++;
    }
    if (bad)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s does not fit the model (%d problem%s): %s%s",
                        set->path, bad, bad > 1 ? "s" : "", msg, bad > 8 ? "; ..." : "");
    return LK_STATUS_OK;
}

lk_status lk__shards_load_model(lk_trainer *tr, const lk__shard_set *set, const lk_named_tensors *live) {
    for (int i = 0; i < live->n; i++)
        if (lk_safetensors_find(set->state, live->items[i].name))
            LK_TRY(lk_safetensors_read_into(set->state, live->items[i].name, live->items[i].tensor));
    if (!lk_strategy_wrapped(tr->strat)) { /* validate, test, predict: the plain net, every tensor whole */
        for (int i = 0; i < live->n; i++) {
            lk_tensor *t = live->items[i].tensor;
            if (lk_safetensors_find(set->state, live->items[i].name)) continue;
            if (!lk_tensor_is_contiguous(t) || !lk_device_is_host(t->device))
                return lk_error(LK_STATUS_UNSUPPORTED, "checkpoint set %s: '%s' is not a contiguous host tensor here",
                                set->path, live->items[i].name);
            LK_TRY(read_range(set, live->items[i].name, NULL, 0, t->numel, t->data, t->dtype));
        }
        return LK_STATUS_OK;
    }
    lk_shard_piece *p;
    int n;
    LK_TRY(lk_strategy_shard_pieces(tr->strat, &p, &n));
    lk_status st = LK_STATUS_OK;
    for (int i = 0; !st && i < n; i++) st = read_range(set, p[i].name, NULL, p[i].lo, p[i].hi, p[i].value, p[i].dtype);
    lk_free(p);
    /* every rank takes part, even one whose read failed: the others would wait */
    lk_status st2 = lk_strategy_shard_pieces_loaded(tr->strat);
    return st ? st : st2;
}

lk_status lk__shards_optim_whole(const lk__shard_set *set, const lk_optimizer *o, lk_named_tensors *fromfile) {
    for (int i = 0; i < set->nr; i++) {
        const srange *x = &set->r[i];
        bool first = true; /* each parameter once */
        for (int j = 0; j < i && first; j++) first = strcmp(set->r[j].name, x->name) != 0;
        if (!first || !has_state(set, x->name)) continue;
        for (int k = 0; k < lk__optimizer_state_arrays(o); k++) {
            const char *field = lk__optimizer_state_array_name(o, k);
            lk_tensor *t = lk_tensor_empty(LK_F32, x->ndim, x->shape);
            if (!t) return lk_last_status();
            lk_status st = read_range(set, x->name, field, 0, x->numel, t->data, LK_F32);
            char name[600];
            snprintf(name, sizeof name, "state.%s.%s", x->name, field);
            if (!st) st = lk_named_tensors_append(fromfile, name, t);
            lk_tensor_release(t);
            LK_TRY(st);
        }
    }
    return LK_STATUS_OK;
}

lk_status lk__shards_optim_pieces(lk_trainer *tr, const lk__shard_set *set, bool *done) {
    *done = false;
    if (!tr->optim || !lk_strategy_shards_state(tr->strat)) return LK_STATUS_OK;
    lk_shard_piece *p;
    int n;
    LK_TRY(lk_strategy_shard_pieces(tr->strat, &p, &n));
    lk_status st = LK_STATUS_OK;
    int nst = lk__optimizer_state_arrays(tr->optim);
    for (int i = 0; !st && i < n; i++) {
        if (p[i].nstate != nst || !has_state(set, p[i].name)) continue; /* no state yet: zeros, as the load left them */
        for (int k = 0; !st && k < nst; k++)
            st = read_range(set, p[i].name, lk__optimizer_state_array_name(tr->optim, k), p[i].lo, p[i].hi, p[i].state[k],
                            LK_F32);
    }
    lk_free(p);
    *done = !st;
    return st;
}

/* ---- export ------------------------------------------------------------------------------------ */

lk_status lk__shards_export(const char *path, const char *out, bool with_opt, int *ntensors) {
    lk__shard_set *set;
    LK_TRY(lk__shards_open(path, &set));
    int cap = set->nr * 4 + lk_safetensors_count(set->state) + 1;
    lk_st_entry *e = lk_calloc((size_t)cap, sizeof *e);
    lk_tensor **owned = lk_calloc((size_t)cap, sizeof *owned);
    char (*names)[600] = lk_calloc((size_t)cap, 600);
    lk_status st = e && owned && names ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    int k = 0;
    /* the parameters whole, in the order of the first shard that holds them */
    for (int i = 0; !st && i < set->nr; i++) {
        const srange *x = &set->r[i], *first;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(set->r[j].name, x->name);
        if (seen) continue;
        if (!covered(set, x->name, &first)) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "checkpoint set %s: '%s' is not whole in the shards", path, x->name);
            break;
        }
        const lk_st_info *info = lk_safetensors_find(set->files[x->file], x->name);
        int nf = with_opt && has_state(set, x->name) ? 0 : -1;
        /* the values, then (with_opt) every optimizer array the first file has for it */
        const char *fields[LK_SHARD_MAX_STATE + 1] = {NULL};
        char pre[600];
        snprintf(pre, sizeof pre, "optimizer.state.%s.", x->name);
        for (int q = 0; nf >= 0 && q < lk_safetensors_count(set->files[x->file]); q++) {
            const char *tn = lk_safetensors_at(set->files[x->file], q)->name;
            if (!strncmp(tn, pre, strlen(pre)) && nf < LK_SHARD_MAX_STATE) fields[nf++] = tn + strlen(pre);
        }
        for (int f = -1; !st && f < (nf < 0 ? 0 : nf); f++) {
            lk_dtype dt = f < 0 ? (lk_dtype)info->dtype : LK_F32;
            lk_tensor *t = lk_tensor_empty(dt, x->ndim, x->shape);
            if (!t) { st = lk_last_status(); break; }
            owned[k] = t;
            st = read_range(set, x->name, f < 0 ? NULL : fields[f], 0, x->numel, t->data, dt);
            if (f < 0) snprintf(names[k], 600, "%s", x->name);
            else snprintf(names[k], 600, "optimizer.state.%s.%s", x->name, fields[f]);
            e[k] = (lk_st_entry){.name = names[k], .tensor = t};
            k++;
        }
    }
    /* the buffers (and with_opt the training state) as rank 0 saved them */
    for (int i = 0; !st && i < lk_safetensors_count(set->state); i++) {
        const lk_st_info *info = lk_safetensors_at(set->state, i);
        bool train_state = !strncmp(info->name, "optimizer.", 10) || !strncmp(info->name, "lr_scheduler.", 13) ||
                           !strncmp(info->name, "grad_scaler.", 12);
        if ((train_state && !with_opt) || info->dtype < 0) continue;
        e[k++] = (lk_st_entry){.name = info->name, .dtype = (lk_dtype)info->dtype, .ndim = info->ndim,
                               .shape = info->shape, .data = info->data};
    }
    lk_st_meta meta[] = {{"format", "pt"}};
    if (!st) st = lk_safetensors_write(out, e, k, meta, 1);
    for (int i = 0; owned && i < cap; i++) lk_tensor_release(owned[i]);
    lk_free(owned);
    lk_free(e);
    lk_free(names);
    lk__shards_close(set);
    if (!st && ntensors) *ntensors = k;
    return st;
}

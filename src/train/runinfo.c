/* run.json: the run summary scripts read instead of scraping logs. One
 * struct the trainer fills, one writer; the schema (docs/RUN_JSON.md) is
 * versioned by "schema_version" and only ever grows. Written through a
 * temporary file + rename so a reader never sees half a file. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "train/loggers.h"

#ifndef LK_GIT_REV
#define LK_GIT_REV ""
#endif

#define LK_RUNINFO_SCHEMA 1

lk_runinfo lk_runinfo_default(void) {
    lk_runinfo r;
    memset(&r, 0, sizeof r);
    r.status = "ok";
    r.best_score = NAN;
    r.world_size = 1;
    return r;
}

/* cJSON writes NaN and infinities as null already; saying so keeps the
 * contract visible here: JSON has no NaN, a missing number is null. */
static cJSON *number_or_null(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }
static cJSON *string_or_null(const char *s) { return s ? cJSON_CreateString(s) : cJSON_CreateNull(); }

static int add(cJSON *obj, const char *key, cJSON *item) {
    if (!item) return 0;
    if (cJSON_GetObjectItemCaseSensitive(obj, key)) return cJSON_ReplaceItemInObjectCaseSensitive(obj, key, item);
    return cJSON_AddItemToObject(obj, key, item);
}

/* cJSON's formatted output indents with tabs and writes "key":<tab>value;
 * this re-indents cJSON's compact output with two spaces and "key": value,
 * empty containers on one line. Strings are copied untouched. */
static char *pretty(const char *in) {
    size_t n = strlen(in), cap = 2 * n + 64, at = 0;
    int depth = 0, in_str = 0, esc = 0;
    char *out = lk_malloc(cap);
    if (!out) return NULL;
#define EMIT(c)                                                  \
    do {                                                         \
        if (at + 1 >= cap) {                                     \
            char *q = lk_realloc(out, cap *= 2);                 \
            if (!q) {                                            \
                lk_free(out);                                    \
                return NULL;                                     \
            }                                                    \
            out = q;                                             \
        }                                                        \
        out[at++] = (c);                                         \
    } while (0)
#define NEWLINE()                                                \
    do {                                                         \
        EMIT('\n');                                              \
        for (int k = 0; k < 2 * depth; k++) EMIT(' ');           \
    } while (0)
    for (const char *p = in; *p; p++) {
        char c = *p;
        if (in_str) {
            EMIT(c);
            if (esc) esc = 0;
            else if (c == '\\') esc = 1;
            else if (c == '"') in_str = 0;
            continue;
        }
        switch (c) {
        case '"': in_str = 1; EMIT(c); break;
        case '{':
        case '[':
            EMIT(c);
            if (p[1] == '}' || p[1] == ']') {
                EMIT(*++p);
                break;
            }
            depth++;
            NEWLINE();
            break;
        case '}':
        case ']':
            depth--;
            NEWLINE();
            EMIT(c);
            break;
        case ',': EMIT(c); NEWLINE(); break;
        case ':': EMIT(c); EMIT(' '); break;
        default: EMIT(c);
        }
    }
    EMIT('\n');
    EMIT(0);
#undef EMIT
#undef NEWLINE
    return out;
}

lk_status lk_runinfo_to_json(const lk_runinfo *info, char **out) {
    if (!info || !out) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_runinfo_to_json: NULL argument");
    *out = NULL;
    if (info->n_metrics < 0 || (info->n_metrics > 0 && (!info->metric_names || !info->metric_values)))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "run.json: %d metrics without names or values", info->n_metrics);
    if (info->n_settings < 0 || (info->n_settings > 0 && !info->settings))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "run.json: %d settings without their table", info->n_settings);
    cJSON *root = cJSON_CreateObject(), *metrics = cJSON_CreateObject(), *best = cJSON_CreateObject(),
          *times = cJSON_CreateObject();
    int ok = root && metrics && best && times;
    const char *status = info->status ? info->status : "ok";
    ok = ok && add(root, "schema_version", cJSON_CreateNumber(LK_RUNINFO_SCHEMA));
    ok = ok && add(root, "command", string_or_null(info->command));
    ok = ok && add(root, "status", cJSON_CreateString(status));
    ok = ok && add(root, "error", string_or_null(strcmp(status, "ok") ? (info->error ? info->error : "") : NULL));
    for (int i = 0; ok && i < info->n_metrics; i++) {
        if (!info->metric_names[i]) continue;
        ok = add(metrics, info->metric_names[i], number_or_null(info->metric_values[i]));
    }
    ok = ok && add(root, "metrics", metrics);
    if (ok) metrics = NULL; /* owned by root now */
    ok = ok && add(best, "monitor", string_or_null(info->best_monitor));
    ok = ok && add(best, "score", number_or_null(info->best_score));
    ok = ok && add(best, "path", string_or_null(info->best_path));
    ok = ok && add(root, "best", best);
    if (ok) best = NULL;
    ok = ok && add(root, "epochs", cJSON_CreateNumber((double)info->epochs));
    ok = ok && add(root, "global_step", cJSON_CreateNumber((double)info->global_step));
    ok = ok && add(root, "samples_per_s", number_or_null(info->samples_per_s));
    ok = ok && add(root, "wall_s", number_or_null(info->wall_s));
    ok = ok && add(root, "time_to_first_step_s", number_or_null(info->time_to_first_step_s));
    ok = ok && add(root, "step_peak_mb", info->step_peak_mb > 0 ? cJSON_CreateNumber(info->step_peak_mb) : cJSON_CreateNull());
    if (info->pipe_stages > 0) {
        cJSON *pp = cJSON_CreateObject();
        ok = ok && pp && add(pp, "stages", cJSON_CreateNumber(info->pipe_stages));
        ok = ok && pp && add(pp, "chunks", cJSON_CreateNumber(info->pipe_chunks));
        ok = ok && pp && add(pp, "stages_per_rank", cJSON_CreateNumber(info->pipe_virtual > 0 ? info->pipe_virtual : 1));
        ok = ok && pp && add(pp, "bubble", number_or_null(info->pipe_bubble));
        ok = ok && pp && add(pp, "bubble_first_stage", number_or_null(info->pipe_bubble_first));
        if (info->pipe_n_ranks > 0) {
            cJSON *per = cJSON_CreateArray();
            ok = ok && per && add(pp, "bubble_per_rank", per);
            for (int r = 0; ok && r < info->pipe_n_ranks; r++) {
                cJSON *v = number_or_null(lk__pipe_share(info->pipe_rank_times + 2 * r));
                ok = v && cJSON_AddItemToArray(per, v);
            }
        }
        ok = ok && pp && add(pp, "bubble_theory", number_or_null(info->pipe_bubble_theory));
        ok = ok && add(root, "pipeline", pp);
    }
    if (info->has_model_state) {
        cJSON *ms = cJSON_CreateObject();
        ok = ok && ms && add(ms, "parameters", cJSON_CreateNumber((double)info->model_state_bytes[0]));
        ok = ok && ms && add(ms, "gradients", cJSON_CreateNumber((double)info->model_state_bytes[1]));
        ok = ok && ms && add(ms, "optimizer_state", cJSON_CreateNumber((double)info->model_state_bytes[2]));
        ok = ok && ms && add(ms, "gathered", cJSON_CreateNumber((double)info->model_state_bytes[3]));
        ok = ok && ms && add(root, "model_state_bytes", ms);
        if (!ok) cJSON_Delete(ms);
    } else {
        ok = ok && add(root, "model_state_bytes", cJSON_CreateNull());
    }
    if (ok && info->n_ranks > 0) { /* each rank's memory: "memory": {limit_bytes, limit_from, ranks: [...]} */
        static const char *const cols[] = {"parameters", "gradients", "optimizer_state", "gathered", "alloc_peak_bytes",
                                           "max_rss_bytes"};
        cJSON *mem = cJSON_CreateObject(), *ranks = cJSON_CreateArray();
        ok = mem && ranks;
        for (int r = 0; ok && r < info->n_ranks; r++) {
            cJSON *row = cJSON_CreateObject();
            ok = row && add(row, "rank", cJSON_CreateNumber(r));
            for (int k = 0; ok && k < 6; k++) {
                int64_t v = info->rank_memory[r * 6 + k];
                ok = add(row, cols[k], v < 0 ? cJSON_CreateNull() : cJSON_CreateNumber((double)v));
            }
            if (ok) ok = cJSON_AddItemToArray(ranks, row);
            else cJSON_Delete(row);
        }
        ok = ok && add(mem, "limit_bytes", info->memory_limit_bytes > 0 ? cJSON_CreateNumber((double)info->memory_limit_bytes)
                                                                      : cJSON_CreateNull());
        ok = ok && add(mem, "limit_from", string_or_null(info->memory_limit_bytes > 0 ? info->memory_limit_from : NULL));
        if (ok) {
            ok = add(mem, "ranks", ranks);
            if (ok) ranks = NULL;
        }
        cJSON_Delete(ranks);
        ok = ok && add(root, "memory", mem);
        if (!ok) cJSON_Delete(mem);
    } else {
        ok = ok && add(root, "memory", cJSON_CreateNull());
    }
    ok = ok && add(root, "world_size", cJSON_CreateNumber(info->world_size));
    ok = ok && add(root, "strategy", string_or_null(info->strategy));
    ok = ok && add(root, "comm_backend", string_or_null(info->comm_backend));
    ok = ok && add(root, "precision", string_or_null(info->precision));
    ok = ok && add(root, "gemm_path", string_or_null(info->gemm_path));
    ok = ok && add(root, "cpu_isa", string_or_null(info->cpu_isa));
    ok = ok && add(root, "accelerator", string_or_null(info->accelerator));
    ok = ok && add(root, "version", cJSON_CreateString(info->version ? info->version : LK_VERSION_STRING));
    const char *rev = info->git_revision ? info->git_revision : LK_GIT_REV;
    ok = ok && add(root, "git_revision", string_or_null(rev[0] ? rev : NULL));
    ok = ok && add(root, "log_dir", string_or_null(info->log_dir));
    ok = ok && add(root, "last_checkpoint", string_or_null(info->last_checkpoint));
    const lk_runinfo_times *t = &info->step_time;
    ok = ok && add(times, "data_ms", number_or_null(t->data_ms));
    ok = ok && add(times, "forward_ms", number_or_null(t->forward_ms));
    ok = ok && add(times, "backward_ms", number_or_null(t->backward_ms));
    ok = ok && add(times, "comm_exposed_ms", number_or_null(t->comm_exposed_ms));
    ok = ok && add(times, "optimizer_ms", number_or_null(t->optimizer_ms));
    ok = ok && add(times, "comm_wait_ms", number_or_null(t->comm_wait_ms));
    ok = ok && add(root, "step_time", times);
    if (ok) times = NULL;
    if (info->graphs.used) {
        cJSON *g = cJSON_CreateObject();
        int gok = g != NULL;
        gok = gok && add(g, "steps", cJSON_CreateNumber((double)info->graphs.steps));
        gok = gok && add(g, "captures", cJSON_CreateNumber((double)info->graphs.captures));
        gok = gok && add(g, "launches", cJSON_CreateNumber((double)info->graphs.launches));
        gok = gok && add(g, "eager_segments", cJSON_CreateNumber((double)info->graphs.eager_segments));
        gok = gok && add(g, "eager_ops", cJSON_CreateNumber((double)info->graphs.eager_ops));
        gok = gok && add(g, "refused", cJSON_CreateNumber((double)info->graphs.refused));
        if (gok && ok && add(root, "graphs", g)) g = NULL; /* owned by root now */
        else ok = 0;
        cJSON_Delete(g);
    } else {
        ok = ok && add(root, "graphs", cJSON_CreateNull());
    }
    cJSON *settings = ok ? cJSON_CreateObject() : NULL;
    ok = ok && settings;
    for (int i = 0; ok && i < info->n_settings; i++) {
        const lk_runinfo_setting *e = &info->settings[i];
        cJSON *one = e->name ? cJSON_CreateObject() : NULL;
        if (!e->name) continue;
        ok = one && add(one, "value", e->text ? cJSON_CreateString(e->text) : number_or_null(e->number)) &&
             add(one, "from", string_or_null(e->from));
        if (ok && add(settings, e->name, one)) one = NULL; /* owned by settings now */
        else ok = 0;
        cJSON_Delete(one);
    }
    if (ok && add(root, "settings", settings)) settings = NULL;
    else ok = 0;
    cJSON_Delete(settings);
    ok = ok && add(root, "config", string_or_null(info->config_yaml));
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    cJSON_Delete(metrics);
    cJSON_Delete(best);
    cJSON_Delete(times);
    if (!text) return lk_error(LK_STATUS_OUT_OF_MEMORY, "run.json: cannot build the JSON document");
    *out = pretty(text);
    cJSON_free(text);
    return *out ? LK_STATUS_OK : lk_last_status();
}

lk_status lk_runinfo_write(const char *path, const lk_runinfo *info) {
    if (!path || !path[0]) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_runinfo_write: empty path");
    char *text;
    LK_TRY(lk_runinfo_to_json(info, &text));
    lk_status st = lk_file_write_atomic(path, text, strlen(text));
    lk_free(text);
    return st;
}

/* best.path of one run.json, when it names a readable file. */
static bool best_of(const char *run_json, char *out, size_t size) {
    FILE *f = fopen(run_json, "rb");
    if (!f) return false;
    char buf[1 << 16]; /* run.json is a few KiB */
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *root = cJSON_Parse(buf);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "best"), "path");
    bool ok = cJSON_IsString(p) && p->valuestring[0] && strlen(p->valuestring) < size && access(p->valuestring, R_OK) == 0;
    if (ok) snprintf(out, size, "%s", p->valuestring);
    cJSON_Delete(root);
    return ok;
}

bool lk__runinfo_find_best(const char *logs_dir, char *out, size_t size) {
    out[0] = 0;
    DIR *d = opendir(logs_dir);
    if (!d) return false;
    long newest = -1;
    struct dirent *de;
    char probe[4096], path[4096];
    while ((de = readdir(d))) { /* validate/test runs record no best: older fits are looked at too */
        long v;
        if (sscanf(de->d_name, "version_%ld", &v) != 1 || v <= newest) continue;
        snprintf(probe, sizeof probe, "%s/%s/run.json", logs_dir, de->d_name);
        if (best_of(probe, path, sizeof path)) newest = v, snprintf(out, size, "%s", path);
    }
    closedir(d);
    return newest >= 0;
}

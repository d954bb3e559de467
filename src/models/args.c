/* A model's init args: parsing and validation against the model's table
 * (with a nearest-name hint for typos), and the typed accessors its
 * builder reads them with. Apart from models.c, which names every model,
 * so that the models can use this without needing the list. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/models_impl.h"

/* ---- arguments -------------------------------------------------------------------- */

static lk_status parse_one(const lk_model_info *m, int k, const char *v, lk_model_args *p) {
    const lk_model_arg *a = &m->args[k];
    char *end;
    p->text[k] = v;
    errno = 0;
    switch (a->type) {
    case LK_ARG_INT:
        p->i[k] = strtoll(v, &end, 10);
        if (end == v || *end || errno || p->i[k] <= 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %s = '%s': expected a positive integer", m->name, a->name, v);
        break;
    case LK_ARG_FLOAT:
        p->f[k] = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(p->f[k]))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %s = '%s': expected a number", m->name, a->name, v);
        break;
    case LK_ARG_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "1")) p->i[k] = 1;
        else if (!strcmp(v, "false") || !strcmp(v, "0")) p->i[k] = 0;
        else return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %s = '%s': expected true or false", m->name, a->name, v);
        break;
    case LK_ARG_STRING: break;
    case LK_ARG_INT_LIST: {
        /* "512,256", "[512, 256]" (YAML flow list as text) or "" */
        int n = 0;
        const char *s = v;
        while (*s == ' ' || *s == '[') s++;
        while (*s && *s != ']') {
            if (n == LK_MODEL_MAX_WIDTHS)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: %s = '%s': at most %d widths", m->name, a->name, v, LK_MODEL_MAX_WIDTHS);
            long long w = strtoll(s, &end, 10);
            if (end == s || w <= 0)
                return lk_error(LK_STATUS_INVALID_ARGUMENT,
                                "model %s: %s = '%s': expected a comma-separated list of positive integers", m->name, a->name, v);
            p->list[k][n++] = w;
            s = end;
            while (*s == ' ' || *s == ',') s++;
        }
        p->list_n[k] = n;
        break;
    }
    }
    return LK_STATUS_OK;
}

lk_status lk__model_args_parse(const lk_model_info *m, const lk_model_kv *args, int n_args, lk_model_args *p) {
    memset(p, 0, sizeof *p);
    p->info = m;
    /* the parsed values are indexed like the table: a longer table is a bug in the model */
    if (m->n_args > LK_MODEL_MAX_ARGS)
        return lk_error(LK_STATUS_INTERNAL, "model %s: %d arguments in its table (at most %d)", m->name, m->n_args,
                        LK_MODEL_MAX_ARGS);
    for (int k = 0; k < m->n_args; k++) LK_TRY(parse_one(m, k, m->args[k].default_value, p));
    for (int j = 0; j < n_args; j++) {
        int found = -1;
        const char *names[LK_MODEL_MAX_ARGS];
        for (int k = 0; k < m->n_args; k++) {
            if (args[j].key && !strcmp(args[j].key, m->args[k].name)) found = k;
            names[k] = m->args[k].name;
        }
        if (found < 0) {
            char list[256] = "";
            for (int k = 0; k < m->n_args; k++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", m->args[k].name);
            const char *near = args[j].key ? lk_suggest(args[j].key, names, m->n_args) : NULL;
            if (near)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: unknown argument '%s'; did you mean '%s'? (valid: %s)",
                                m->name, args[j].key, near, list);
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: unknown argument '%s' (valid: %s)", m->name,
                            args[j].key ? args[j].key : "(null)", list);
        }
        if (!args[j].value)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model %s: argument '%s' has no value", m->name, args[j].key);
        LK_TRY(parse_one(m, found, args[j].value, p));
    }
    return LK_STATUS_OK;
}

/* The table index of `name`, which must have type `type` (else a bug in the model: panic). */
static int arg_index(const lk_model_args *a, const char *name, lk_arg_type type) {
    const lk_model_info *m = a->info;
    for (int k = 0; k < m->n_args; k++)
        if (!strcmp(m->args[k].name, name)) {
            if (m->args[k].type != type && type != (lk_arg_type)-1)
                lk_panic("model %s: argument '%s' read with the accessor of another type", m->name, name);
            return k;
        }
    lk_panic("model %s: its builder reads argument '%s', which its table does not declare", m->name, name);
}

int64_t lk_model_args_int(const lk_model_args *a, const char *name) { return a->i[arg_index(a, name, LK_ARG_INT)]; }
bool lk_model_args_bool(const lk_model_args *a, const char *name) { return a->i[arg_index(a, name, LK_ARG_BOOL)] != 0; }
double lk_model_args_float(const lk_model_args *a, const char *name) { return a->f[arg_index(a, name, LK_ARG_FLOAT)]; }
const char *lk_model_args_string(const lk_model_args *a, const char *name) {
    return a->text[arg_index(a, name, (lk_arg_type)-1)];
}
int lk_model_args_list(const lk_model_args *a, const char *name, const int64_t **values) {
    int k = arg_index(a, name, LK_ARG_INT_LIST);
    if (values) *values = a->list[k];
    return a->list_n[k];
}

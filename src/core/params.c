/* Parameter tables: defaults, parsing with validation, formatting, help and
 * the "did you mean" hint, for every configurable struct in lockstep. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/core.h"

static const char *type_name(lk_param_type t) {
    static const char *const names[] = {"bool", "int", "float", "string", "enum", "int list", "float list",
                                        "int | float"};
    return names[t];
}

static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = c < del ? (c < ins ? c : ins) : (del < ins ? del : ins);
        }
    return d[la][lb];
}

const char *lk_suggest(const char *word, const char *const *candidates, int n) {
    const char *best = NULL;
    int bestd = 1 << 30;
    for (int i = 0; i < n; i++) {
        int dd = edit_distance(word, candidates[i]);
        /* a candidate containing the word (or contained in it) is close too */
        if (strstr(candidates[i], word) || strstr(word, candidates[i])) dd = dd < 3 ? dd : 3;
        if (dd < bestd) bestd = dd, best = candidates[i];
    }
    size_t len = strlen(word);
    int limit = len <= 4 ? 2 : (int)(len / 3) + 1;
    return bestd <= limit ? best : NULL;
}

const lk_param *lk_params_find(const lk_param *table, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcmp(table[i].name, key)) return &table[i];
    return NULL;
}

static const char *trim(const char *s, char *buf, size_t size) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n >= 2 && ((s[0] == '"' && s[n - 1] == '"') || (s[0] == '\'' && s[n - 1] == '\''))) s++, n -= 2;
    if (n >= size) n = size - 1;
    memcpy(buf, s, n);
    buf[n] = 0;
    return buf;
}

static lk_status bad_value(const lk_param *p, const char *where, const char *value, const char *expected) {
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s%s%s: expected %s, got '%s'", where ? where : "", where && *where ? "." : "",
                    p->name, expected, value);
}

static lk_status parse_number(const lk_param *p, const char *where, const char *v, bool integer, double *out) {
    char *end;
    errno = 0;
    double x;
    if (integer) {
        long long i = strtoll(v, &end, 10);
        if (*end == '.' || *end == 'e' || *end == 'E') { /* "1e3" or "10.0" that are whole numbers */
            x = strtod(v, &end);
            if (*end || x != floor(x)) return bad_value(p, where, v, "an integer");
        } else x = (double)i;
    } else {
        x = strtod(v, &end);
        if (!strcmp(v, ".inf") || !strcmp(v, "inf")) x = INFINITY, end = (char *)v + strlen(v);
        if (!strcmp(v, "-.inf") || !strcmp(v, "-inf")) x = -INFINITY, end = (char *)v + strlen(v);
        if (!strcmp(v, ".nan") || !strcmp(v, "nan") || !strcmp(v, ".NaN")) x = NAN, end = (char *)v + strlen(v);
    }
    if (end == v || *end || errno == ERANGE) return bad_value(p, where, v, integer ? "an integer" : "a number");
    if (p->min <= p->max && (isnan(x) || x < p->min || x > p->max)) {
        char exp[128];
        snprintf(exp, sizeof exp, "a value in [%g, %g]", p->min, p->max);
        return bad_value(p, where, v, exp);
    }
    *out = x;
    return LK_STATUS_OK;
}

lk_status lk_params_set(const lk_param *table, int n, void *cfg, const char *where, const char *key, const char *value) {
    const lk_param *p = lk_params_find(table, n, key);
    if (!p) {
        const char *names[128];
        int k = n < 128 ? n : 128;
        for (int i = 0; i < k; i++) names[i] = table[i].name;
        const char *s = lk_suggest(key, names, k);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown key '%s%s%s'%s%s%s", where ? where : "",
                        where && *where ? "." : "", key, s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "");
    }
    char vb[LK_PARAM_STR * 4];
    const char *v = trim(value ? value : "", vb, sizeof vb);
    char *field = (char *)cfg + p->offset;
    switch (p->type) {
    case LK_PARAM_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "1") || !strcmp(v, "yes")) *(bool *)field = true;
        else if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "0") || !strcmp(v, "no")) *(bool *)field = false;
        else return bad_value(p, where, v, "true or false");
        return LK_STATUS_OK;
    case LK_PARAM_INT:
    case LK_PARAM_FLOAT: {
        double x;
        LK_TRY(parse_number(p, where, v, p->type == LK_PARAM_INT, &x));
        if (p->type == LK_PARAM_INT) *(int64_t *)field = (int64_t)x;
        else *(double *)field = x;
        return LK_STATUS_OK;
    }
    case LK_PARAM_COUNT_OR_FRACTION: {
        lk_count_or_fraction *cf = (lk_count_or_fraction *)field;
        bool is_count = v[0] && !strpbrk(v, ".eEn");
        double x;
        if (is_count) {
            LK_TRY(parse_number(p, where, v, true, &x));
        } else {
            char *end;
            x = strtod(v, &end);
            if (end == v || *end || !(x >= 0.0 && x <= 1.0))
                return bad_value(p, where, v, "an integer count or a fraction in [0.0, 1.0]");
        }
        cf->value = x;
        cf->is_count = is_count;
        return LK_STATUS_OK;
    }
    case LK_PARAM_STRING:
        if (strlen(v) >= LK_PARAM_STR) return bad_value(p, where, v, "a string shorter than 256 bytes");
        if (!strcmp(v, "null") || !strcmp(v, "~")) v = "";
        strcpy(field, v);
        return LK_STATUS_OK;
    case LK_PARAM_ENUM: {
        const char *c = p->choices;
        size_t lv = strlen(v);
        while (c && *c) {
            const char *bar = strchr(c, '|');
            size_t lc = bar ? (size_t)(bar - c) : strlen(c);
            if (lc == lv && !strncmp(c, v, lv)) {
                strcpy(field, v);
                return LK_STATUS_OK;
            }
            c = bar ? bar + 1 : NULL;
        }
        char exp[300];
        snprintf(exp, sizeof exp, "one of %s", p->choices);
        return bad_value(p, where, v, exp);
    }
    case LK_PARAM_INTS:
    case LK_PARAM_FLOATS: {
        char buf[LK_PARAM_STR * 4];
        snprintf(buf, sizeof buf, "%s", v);
        char *s = buf;
        if (*s == '[') s++;
        size_t L = strlen(s);
        if (L && s[L - 1] == ']') s[--L] = 0;
        int cnt = 0;
        double vals[LK_PARAM_LIST_MAX];
        for (char *tok = strtok(s, ", "); tok; tok = strtok(NULL, ", ")) {
            if (cnt == LK_PARAM_LIST_MAX) return bad_value(p, where, v, "at most 16 values");
            LK_TRY(parse_number(p, where, tok, p->type == LK_PARAM_INTS, &vals[cnt]));
            cnt++;
        }
        if (p->type == LK_PARAM_INTS) {
            lk_int_list *l = (lk_int_list *)field;
            l->n = cnt;
            for (int i = 0; i < cnt; i++) l->v[i] = (int64_t)vals[i];
        } else {
            lk_float_list *l = (lk_float_list *)field;
            l->n = cnt;
            for (int i = 0; i < cnt; i++) l->v[i] = vals[i];
        }
        return LK_STATUS_OK;
    }
    }
    return lk_error(LK_STATUS_INTERNAL, "parameter '%s' has an unknown type", p->name);
}

lk_status lk_params_defaults(const lk_param *table, int n, void *cfg) {
    for (int i = 0; i < n; i++) {
        const lk_param *p = &table[i];
        char *field = (char *)cfg + p->offset;
        if (p->def) {
            LK_TRY(lk_params_set(table, n, cfg, "(default)", p->name, p->def));
            continue;
        }
        switch (p->type) {
        case LK_PARAM_BOOL: *(bool *)field = false; break;
        case LK_PARAM_INT: *(int64_t *)field = 0; break;
        case LK_PARAM_FLOAT: *(double *)field = 0; break;
        case LK_PARAM_STRING:
        case LK_PARAM_ENUM: field[0] = 0; break;
        case LK_PARAM_INTS: ((lk_int_list *)field)->n = 0; break;
        case LK_PARAM_FLOATS: ((lk_float_list *)field)->n = 0; break;
        case LK_PARAM_COUNT_OR_FRACTION: *(lk_count_or_fraction *)field = (lk_count_or_fraction){1.0, false}; break;
        }
    }
    return LK_STATUS_OK;
}

static void fmt_double(double x, char *buf, size_t size) {
    if (isnan(x)) snprintf(buf, size, ".nan");
    else if (isinf(x)) snprintf(buf, size, x > 0 ? ".inf" : "-.inf");
    else {
        snprintf(buf, size, "%.17g", x);
        /* shortest text that reads back the same */
        for (int prec = 1; prec <= 17; prec++) {
            char t[64];
            snprintf(t, sizeof t, "%.*g", prec, x);
            if (strtod(t, NULL) == x) {
                snprintf(buf, size, "%s", t);
                break;
            }
        }
        if (!strpbrk(buf, ".en")) strncat(buf, ".0", size - strlen(buf) - 1);
    }
}

char *lk_params_format(const lk_param *p, const void *cfg, char *buf, size_t size) {
    const char *field = (const char *)cfg + p->offset;
    switch (p->type) {
    case LK_PARAM_BOOL: snprintf(buf, size, "%s", *(const bool *)field ? "true" : "false"); break;
    case LK_PARAM_INT: snprintf(buf, size, "%lld", (long long)*(const int64_t *)field); break;
    case LK_PARAM_FLOAT: fmt_double(*(const double *)field, buf, size); break;
    case LK_PARAM_COUNT_OR_FRACTION: {
        const lk_count_or_fraction *cf = (const lk_count_or_fraction *)field;
        if (cf->is_count) snprintf(buf, size, "%lld", (long long)cf->value);
        else fmt_double(cf->value, buf, size);
        break;
    }
    case LK_PARAM_STRING:
    case LK_PARAM_ENUM: snprintf(buf, size, "%s", field[0] ? field : "null"); break;
    case LK_PARAM_INTS:
    case LK_PARAM_FLOATS: {
        size_t k = (size_t)snprintf(buf, size, "[");
        int cnt = p->type == LK_PARAM_INTS ? ((const lk_int_list *)field)->n : ((const lk_float_list *)field)->n;
        for (int i = 0; i < cnt && k < size; i++) {
            char t[64];
            if (p->type == LK_PARAM_INTS) snprintf(t, sizeof t, "%lld", (long long)((const lk_int_list *)field)->v[i]);
            else fmt_double(((const lk_float_list *)field)->v[i], t, sizeof t);
            k += (size_t)snprintf(buf + k, size - k, "%s%s", i ? ", " : "", t);
        }
        if (k < size) snprintf(buf + k, size - k, "]");
        break;
    }
    }
    return buf;
}

void lk_params_print_help(const lk_param *table, int n, void *file, const char *prefix) {
    FILE *f = file;
    for (int i = 0; i < n; i++) {
        const lk_param *p = &table[i];
        char name[128], ty[96];
        snprintf(name, sizeof name, "%s%s%s", prefix ? prefix : "", prefix && *prefix ? "." : "", p->name);
        if (p->type == LK_PARAM_ENUM) snprintf(ty, sizeof ty, "%s", p->choices);
        else snprintf(ty, sizeof ty, "%s", type_name(p->type));
        fprintf(f, "  --%-36s %-18s (default: %s)\n      %s\n", name, ty, p->def ? p->def : "null", p->help);
    }
}

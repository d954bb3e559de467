/* The YAML config tree: nodes that remember file:line:col, merging sources
 * in order (maps merge, everything else replaces), loading files and
 * strings, dotted-path lookup and setting, applying a map to an lk_param
 * table with located errors, pruning nulls. Types are not decided here: the
 * tree holds text and the parameter tables (params.c) validate it. libyaml's
 * side is config_yaml.c, the command line config_args.c. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "core/config_impl.h"

/* ---- lifetime and loading ---------------------------------------------------------- */

lk_config *lk_config_create(void) {
    lk_config *cfg = lk_calloc(1, sizeof *cfg);
    if (!cfg) return NULL;
    cfg->root = lk__cfg_node_new(LK_CONFIG_MAP, "", 0, 0);
    if (!cfg->root) {
        lk_free(cfg);
        return NULL;
    }
    return cfg;
}

void lk_config_free(lk_config *cfg) {
    if (!cfg) return;
    lk__cfg_node_free(cfg->root);
    for (int i = 0; i < cfg->nfiles; i++) lk_free(cfg->files[i]);
    lk_free(cfg->files);
    lk_free(cfg);
}

lk_status lk_config_load_string(lk_config *cfg, const char *yaml, size_t len, const char *name) {
    if (!cfg || (!yaml && len)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_config_load_string: NULL argument");
    const char *file = lk__cfg_intern_file(cfg, name ? name : "<string>");
    if (!file) return LK_STATUS_OUT_OF_MEMORY;
    lk_config_node *tree;
    LK_TRY(lk__cfg_parse_yaml(yaml ? yaml : "", len, file, &tree));
    if (!tree || lk_config_node_is_null(tree)) { /* empty document */
        lk__cfg_node_free(tree);
        return LK_STATUS_OK;
    }
    if (tree->type != LK_CONFIG_MAP) {
        lk_status st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: the top level of a config must be a mapping (key: value), got %s%s%s%s",
                                file, tree->line, tree->col, lk__cfg_type_word(tree->type), tree->text ? " '" : "",
                                tree->text ? tree->text : "", tree->text ? "'" : "");
        lk__cfg_node_free(tree);
        return st;
    }
    return lk__cfg_merge_root(cfg, tree);
}

lk_status lk_config_load_file(lk_config *cfg, const char *path) {
    if (!cfg || !path) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_config_load_file: NULL argument");
    FILE *f = fopen(path, "rb");
    if (!f) return lk_error(LK_STATUS_IO, "cannot open config file '%s': %s", path, strerror(errno));
    size_t cap = 1 << 14, len = 0;
    char *buf = lk_malloc(cap);
    lk_status st = buf ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
    /* A config is kilobytes; a bound keeps -c /dev/zero or a mistaken
     * multi-gigabyte file from reading until memory runs out. Pipes
     * (-c <(...)) are read as files are. */
    enum { MAX_CONFIG_BYTES = 64 << 20 };
    while (!st) {
        if (len == cap && cap >= MAX_CONFIG_BYTES) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "config file '%s' is larger than %d MiB: a config is a YAML file of a few KB (is it the right "
                          "file?)", path, MAX_CONFIG_BYTES >> 20);
            break;
        }
        if (len == cap) {
            char *nb = lk_realloc(buf, cap * 2);
            if (!nb) {
                st = LK_STATUS_OUT_OF_MEMORY;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) st = lk_error(LK_STATUS_IO, "cannot read config file '%s': %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (!st) st = lk_config_load_string(cfg, buf, len, path);
    lk_free(buf);
    return st;
}

/* Offset of the first byte that is not well-formed UTF-8 (no overlongs,
 * surrogates or code points past U+10FFFF), or (size_t)-1. */
size_t lk__cfg_utf8_invalid_at(const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (s[i]) {
        unsigned c = s[i];
        int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
        if (n < 0) return i;
        unsigned cp = n == 0 ? c : n == 1 ? c & 0x1f : n == 2 ? c & 0x0f : c & 0x07;
        for (int k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        static const unsigned min[] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += (size_t)n + 1;
    }
    return (size_t)-1;
}

static void zero_lines(lk_config_node *n) {
    n->line = n->col = n->key_line = n->key_col = 0;
    for (int i = 0; i < n->n; i++) zero_lines(n->kids[i]);
}

/* Parses an override value: YAML scalars and flow collections as YAML,
 * anything else (block syntax, "a: b") as a string. */
lk_status lk__cfg_parse_value(const char *value, const char *file, lk_config_node **out) {
    size_t len = strlen(value);
    const char *v = value;
    while (*v == ' ' || *v == '\t') v++;
    bool flow = *v == '[' || *v == '{';
    lk_config_node *tree = NULL;
    lk_status st = lk__cfg_parse_yaml(value, len, file, &tree);
    /* a plain scalar must be the text as typed: "path #1" is not a comment */
    if (!st && tree && tree->type == LK_CONFIG_SCALAR && !tree->quoted && strcmp(tree->text, value) &&
        !lk_config_node_is_null(tree)) {
        lk__cfg_node_free(tree);
        tree = NULL;
        st = LK_STATUS_INVALID_ARGUMENT; /* taken as a string below */
    }
    /* "{epoch}-{val_loss:.4f}" is a file-name template, not YAML: a value
     * starting with '{' that does not parse, or parses to keys without
     * values ("{epoch}"), is taken as the string typed (a real mapping such
     * as "{days: 1}" has values). */
    if (*v == '{' && st != LK_STATUS_OUT_OF_MEMORY) {
        bool keys_only = !st && tree && tree->type == LK_CONFIG_MAP && tree->n > 0;
        for (int i = 0; keys_only && i < tree->n; i++) keys_only = lk_config_node_is_null(tree->kids[i]);
        if (st || keys_only) {
            lk__cfg_node_free(tree);
            tree = NULL;
            st = LK_STATUS_INVALID_ARGUMENT;
            flow = false; /* taken as a string below */
        }
    }
    if (!st && tree && (tree->type == LK_CONFIG_SCALAR || flow)) {
        zero_lines(tree);
        *out = tree;
        return LK_STATUS_OK;
    }
    bool empty = !st && !tree; /* only blanks or a comment */
    lk__cfg_node_free(tree);
    if (st == LK_STATUS_OUT_OF_MEMORY) return st;
    if (flow) { /* drop lk__cfg_parse_yaml's "FILE:" in front of "LINE:COL: problem" */
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", lk_last_error());
        const char *m = strstr(msg, file);
        m = m ? m + strlen(file) + 1 : msg;
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "value '%s' at %s", value, m);
    }
    v = empty ? "null" : value;
    /* a string scalar, provided it is text YAML can hold */
    size_t bad_at = lk__cfg_utf8_invalid_at(value);
    if (bad_at != (size_t)-1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "value '%s' cannot be held in YAML: invalid UTF-8 at byte %zu", value,
                        bad_at);
    lk_config_node *n = lk__cfg_node_new(LK_CONFIG_SCALAR, file, 0, 0);
    if (!n || !(n->text = lk_strdup(v))) {
        lk__cfg_node_free(n);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    n->quoted = !empty;
    *out = n;
    return LK_STATUS_OK;
}

/* Wraps `leaf` in maps from the innermost key of path[0..end) outwards
 * ("a.b" + 3 -> {a: {b: 3}}); takes `leaf` (freed on failure). */
lk_status lk__cfg_wrap_path(const char *path, const char *end, lk_config_node *leaf, const char *file,
                           lk_config_node **out) {
    lk_config_node *cur = leaf;
    while (1) {
        const char *dot = end;
        while (dot > path && dot[-1] != '.') dot--;
        size_t kl = (size_t)(end - dot);
        cur->key = lk_malloc(kl + 1);
        if (!cur->key) {
            lk__cfg_node_free(cur);
            return LK_STATUS_OUT_OF_MEMORY;
        }
        memcpy(cur->key, dot, kl);
        cur->key[kl] = 0;
        lk_config_node *m = lk__cfg_node_new(LK_CONFIG_MAP, file, 0, 0);
        if (!m || lk__cfg_node_append(m, cur)) {
            lk__cfg_node_free(m);
            lk__cfg_node_free(cur);
            return LK_STATUS_OUT_OF_MEMORY;
        }
        cur = m;
        if (dot == path) break;
        end = dot - 1;
    }
    *out = cur;
    return LK_STATUS_OK;
}

lk_status lk__cfg_set_path(lk_config *cfg, const char *path, const char *value, const char *origin, bool only_default) {
    if (!cfg || !path || !value) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_config_set: NULL argument");
    if (only_default && lk_config_get(cfg, path)) return LK_STATUS_OK;
    int parts = 1;
    for (const char *s = path; *s; s++) parts += *s == '.';
    const char *prev = path;
    for (const char *s = path;; s++)
        if (*s == '.' || *s == 0) {
            if (s == prev) return lk_error(LK_STATUS_INVALID_ARGUMENT, "invalid key '%s': empty part", path);
            prev = s + 1;
            if (!*s) break;
        }
    if (lk__cfg_utf8_invalid_at(path) != (size_t)-1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "invalid key '%s': not UTF-8", path);
    if (parts >= LK_CONFIG_MAX_DEPTH)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "key '%s' is nested deeper than %d levels", path, LK_CONFIG_MAX_DEPTH);
    const char *file = lk__cfg_intern_file(cfg, origin ? origin : "command line");
    if (!file) return LK_STATUS_OUT_OF_MEMORY;
    lk_config_node *leaf = NULL;
    lk_status st = lk__cfg_parse_value(value, file, &leaf);
    if (st) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", lk_last_error());
        const char *m = msg;
        if (!strncmp(m, "[rank ", 6) && strstr(m, "] ")) m = strstr(m, "] ") + 2;
        return lk_error(st, "%s: --%s: %s", file, path, m);
    }
    lk_config_node *cur;
    LK_TRY(lk__cfg_wrap_path(path, path + strlen(path), leaf, file, &cur));
    return lk__cfg_merge_root(cfg, cur);
}

lk_status lk_config_set(lk_config *cfg, const char *path, const char *value, const char *origin) {
    return lk__cfg_set_path(cfg, path, value, origin, false);
}

lk_status lk_config_set_override(lk_config *cfg, const char *path, const char *value) {
    return lk__cfg_set_path(cfg, path, value, NULL, false);
}

lk_status lk_config_set_default(lk_config *cfg, const char *path, const char *value, const char *origin) {
    return lk__cfg_set_path(cfg, path, value, origin, true);
}

/* ---- lookup ------------------------------------------------------------------------- */

const lk_config_node *lk_config_root(const lk_config *cfg) { return cfg ? cfg->root : NULL; }

const lk_config_node *lk_config_node_get(const lk_config_node *node, const char *path) {
    if (!node || !path) return NULL;
    const char *s = path;
    while (*s && node) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        if (node->type == LK_CONFIG_MAP) {
            node = lk__cfg_map_find(node, s, len);
        } else if (node->type == LK_CONFIG_SEQ) {
            long idx = 0;
            size_t i = 0;
            for (; i < len && isdigit((unsigned char)s[i]) && idx < 1000000000; i++) idx = idx * 10 + (s[i] - '0');
            node = len && i == len && idx < node->n ? node->kids[idx] : NULL;
        } else {
            node = NULL;
        }
        if (!dot) break;
        s = dot + 1;
    }
    return node;
}

const lk_config_node *lk_config_get(const lk_config *cfg, const char *path) {
    return cfg ? lk_config_node_get(cfg->root, path) : NULL;
}

lk_config_type lk_config_node_type(const lk_config_node *n) { return n ? n->type : LK_CONFIG_SCALAR; }
const char *lk_config_node_text(const lk_config_node *n) { return n && n->type == LK_CONFIG_SCALAR ? n->text : NULL; }
bool lk_config_node_quoted(const lk_config_node *n) { return n && n->quoted; }
bool lk_config_node_is_null(const lk_config_node *n) {
    if (!n || n->type != LK_CONFIG_SCALAR || n->quoted) return false;
    const char *t = n->text;
    return !*t || !strcmp(t, "null") || !strcmp(t, "~") || !strcmp(t, "Null") || !strcmp(t, "NULL");
}
int lk_config_node_count(const lk_config_node *n) { return n ? n->n : 0; }
const lk_config_node *lk_config_node_child(const lk_config_node *n, int i) {
    return n && i >= 0 && i < n->n ? n->kids[i] : NULL;
}
const char *lk_config_node_key(const lk_config_node *n) { return n ? n->key : NULL; }
const char *lk_config_node_file(const lk_config_node *n) { return n ? n->file : NULL; }
int lk_config_node_line(const lk_config_node *n) { return n ? n->line : 0; }
int lk_config_node_column(const lk_config_node *n) { return n ? n->col : 0; }

static char *where_at(const char *file, int line, int col, char *buf, size_t size) {
    if (line > 0) snprintf(buf, size, "%s:%d:%d", file, line, col);
    else snprintf(buf, size, "%s", file && *file ? file : "<config>");
    return buf;
}

char *lk_config_node_where(const lk_config_node *n, char *buf, size_t size) {
    if (!n) {
        snprintf(buf, size, "<config>");
        return buf;
    }
    return where_at(n->file, n->line, n->col, buf, size);
}

char *lk_config_node_origin(const lk_config_node *n, const char *key, char *buf, size_t size) {
    if (n && n->file && !strcmp(n->file, "command line")) {
        snprintf(buf, size, "--%s on the command line", key);
        return buf;
    }
    char w[1024];
    snprintf(buf, size, "%s in %s", key, lk_config_node_where(n, w, sizeof w));
    return buf;
}

/* ---- applying to parameter tables ----------------------------------------------------- */

static const char *param_type_word(const lk_param *p) {
    switch (p->type) {
    case LK_PARAM_BOOL: return "a bool";
    case LK_PARAM_INT: return "an int";
    case LK_PARAM_FLOAT: return "a float";
    case LK_PARAM_STRING: return "a string";
    case LK_PARAM_ENUM: return "one of the choices";
    case LK_PARAM_INTS: return "an int list";
    case LK_PARAM_FLOATS: return "a float list";
    case LK_PARAM_COUNT_OR_FRACTION: return "an int count or a float fraction";
    }
    return "a value";
}

/* Re-raises the last error with "where: " in front (dropping a rank prefix
 * that the inner lk_error may have added, since lk_error adds it again). */
static lk_status relocate(lk_status st, const char *where) {
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", lk_last_error());
    const char *m = msg;
    if (!strncmp(m, "[rank ", 6) && strstr(m, "] ")) m = strstr(m, "] ") + 2;
    return lk_error(st, "%s: %s", where, m);
}

lk_status lk_config_apply_params(const lk_config_node *map, const lk_param *table, int n, void *cfg,
                                 const char *prefix) {
    return lk_config_apply_params_except(map, table, n, cfg, prefix, NULL, 0);
}

lk_status lk_config_apply_params_except(const lk_config_node *map, const lk_param *table, int n, void *cfg,
                                        const char *prefix, const char *const *skip, int nskip) {
    char where[1024];
    const char *pre = prefix ? prefix : "";
    const char *dot = *pre ? "." : "";
    if (!map || lk_config_node_is_null(map)) return LK_STATUS_OK;
    if (map->type != LK_CONFIG_MAP)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s: expected a mapping of keys, got %s%s%s%s",
                        lk_config_node_where(map, where, sizeof where), *pre ? pre : "config", lk__cfg_type_word(map->type),
                        map->text ? " '" : "", map->text ? map->text : "", map->text ? "'" : "");
    for (int i = 0; i < map->n; i++) {
        const lk_config_node *c = map->kids[i];
        bool skipped = false;
        for (int k = 0; k < nskip && !skipped; k++) skipped = !strcmp(c->key, skip[k]);
        if (skipped) continue; /* the caller reads this one itself */
        const lk_param *p = lk_params_find(table, n, c->key);
        if (!p) {
            lk_status st = lk_params_set(table, n, cfg, prefix, c->key, "");
            if (!st) st = lk_error(LK_STATUS_INTERNAL, "unknown key '%s%s%s'", pre, dot, c->key);
            return relocate(st, where_at(c->file, c->key_line ? c->key_line : c->line, c->key_col ? c->key_col : c->col,
                                         where, sizeof where));
        }
        lk_config_node_where(c, where, sizeof where);
        bool list = p->type == LK_PARAM_INTS || p->type == LK_PARAM_FLOATS;
        if (c->type == LK_CONFIG_MAP || (c->type == LK_CONFIG_SEQ && !list))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s%s%s: expected %s, got %s", where, pre, dot, c->key,
                            param_type_word(p), lk__cfg_type_word(c->type));
        if (c->type == LK_CONFIG_SCALAR) {
            lk_status st = lk_params_set(table, n, cfg, prefix, c->key, c->text);
            if (st) return relocate(st, where);
            continue;
        }
        /* a sequence for a list parameter: "[a, b, ...]" from scalar items */
        char text[LK_PARAM_STR * 4];
        size_t k = (size_t)snprintf(text, sizeof text, "[");
        for (int j = 0; j < c->n; j++) {
            const lk_config_node *e = c->kids[j];
            if (e->type != LK_CONFIG_SCALAR)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s%s%s[%d]: expected %s, got %s",
                                lk_config_node_where(e, where, sizeof where), pre, dot, c->key, j,
                                p->type == LK_PARAM_INTS ? "an int" : "a float", lk__cfg_type_word(e->type));
            if (strpbrk(e->text, ", \t[]")) /* would split or merge items when joined */
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s%s%s[%d]: expected %s, got '%s'",
                                lk_config_node_where(e, where, sizeof where), pre, dot, c->key, j,
                                p->type == LK_PARAM_INTS ? "an int" : "a float", e->text);
            if (k < sizeof text) k += (size_t)snprintf(text + k, sizeof text - k, "%s%s", j ? ", " : "", e->text);
        }
        if (k < sizeof text) snprintf(text + k, sizeof text - k, "]");
        if (k + 1 >= sizeof text)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s%s%s: list too long (at most %d values)", where, pre,
                            dot, c->key, LK_PARAM_LIST_MAX);
        lk_status st = lk_params_set(table, n, cfg, prefix, c->key, text);
        if (st) return relocate(st, where);
    }
    return LK_STATUS_OK;
}

/* ---- pruning ----------------------------------------------------------------------------- */

/* Drops map entries that are null, and maps that become empty by it. */
static void drop_nulls(lk_config_node *n) {
    int k = 0;
    for (int i = 0; i < n->n; i++) {
        lk_config_node *c = n->kids[i];
        if (c->type == LK_CONFIG_MAP) drop_nulls(c);
        else if (c->type == LK_CONFIG_SEQ)
            for (int j = 0; j < c->n; j++)
                if (c->kids[j]->type == LK_CONFIG_MAP) drop_nulls(c->kids[j]);
        bool gone = n->type == LK_CONFIG_MAP && ((c->type == LK_CONFIG_SCALAR && lk_config_node_is_null(c)) ||
                                                 (c->type == LK_CONFIG_MAP && c->n == 0));
        if (gone) lk__cfg_node_free(c);
        else n->kids[k++] = c;
    }
    n->n = k;
}

void lk_config_drop_nulls(lk_config *cfg) {
    if (cfg && cfg->root) drop_nulls(cfg->root);
}


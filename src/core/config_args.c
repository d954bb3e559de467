/* The command line of `lockstep fit` and friends: config files, overrides
 * and leftovers, and where an override lands in the tree — as LightningCLI's
 * parser (jsonargparse) places it beside a class_path or in a list. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "core/config_impl.h"

/* ---- command-line arguments ---------------------------------------------------------------- */

static lk_status args_push(lk_config_args *a, lk_config_arg_kind kind, const char *key, size_t klen, const char *value) {
    lk_config_arg *items = lk_realloc(a->items, (size_t)(a->n + 1) * sizeof *items);
    if (!items) return LK_STATUS_OUT_OF_MEMORY;
    a->items = items;
    lk_config_arg *it = &items[a->n];
    it->kind = kind;
    it->key = NULL;
    it->value = value;
    if (key) {
        if (!(it->key = lk_malloc(klen + 1))) return LK_STATUS_OUT_OF_MEMORY;
        memcpy(it->key, key, klen);
        it->key[klen] = 0;
    }
    a->n++;
    return LK_STATUS_OK;
}

static lk_status rest_push(lk_config_args *a, char *arg) {
    char **r = lk_realloc(a->rest, (size_t)(a->nrest + 1) * sizeof *r);
    if (!r) return LK_STATUS_OUT_OF_MEMORY;
    a->rest = r;
    a->rest[a->nrest++] = arg;
    return LK_STATUS_OK;
}

static lk_status args_parse(int argc, char **argv, const char *const *flags, int nflags, lk_config_args *out) {
    for (int i = 0; i < argc; i++) {
        char *a = argv[i];
        const char *eq = strchr(a, '=');
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        bool is_flag = false;
        for (int f = 0; f < nflags && !is_flag; f++)
            is_flag = strlen(flags[f]) == name_len && !strncmp(flags[f], a, name_len);
        if (is_flag || a[0] != '-' || !strcmp(a, "-")) {
            LK_TRY(rest_push(out, a));
            continue;
        }
        if (!strcmp(a, "--")) {
            for (; i < argc; i++) LK_TRY(rest_push(out, argv[i]));
            break;
        }
        bool config = !strcmp(a, "-c") || !strcmp(a, "--config") || !strncmp(a, "--config=", 9) ||
                      (!strncmp(a, "-c", 2) && a[2] != '-' && a[2]);
        if (config) {
            const char *path;
            if (!strncmp(a, "--config=", 9)) path = a + 9;
            else if (a[1] == 'c' && a[2]) path = a[2] == '=' ? a + 3 : a + 2; /* -cFILE, -c=FILE */
            else if (i + 1 < argc) path = argv[++i];
            else return lk_error(LK_STATUS_INVALID_USAGE, "option '%s' expects a config file path", a);
            if (!*path) return lk_error(LK_STATUS_INVALID_USAGE, "option '%s' expects a config file path", a);
            LK_TRY(args_push(out, LK_CONFIG_ARG_FILE, NULL, 0, path));
            continue;
        }
        if (a[1] != '-' || !a[2] || a[2] == '=' || a[2] == '-')
            return lk_error(LK_STATUS_INVALID_USAGE, "unknown option '%s' (overrides are written --key.path VALUE)", a);
        const char *key = a + 2;
        size_t klen = name_len - 2;
        const char *value;
        if (eq) value = eq + 1;
        else if (i + 1 < argc) value = argv[++i];
        else return lk_error(LK_STATUS_INVALID_USAGE, "option '%s' expects a value (--%s VALUE or --%s=VALUE)", a, key, key);
        LK_TRY(args_push(out, LK_CONFIG_ARG_OVERRIDE, key, klen, value));
    }
    return LK_STATUS_OK;
}

lk_status lk_config_args_parse(int argc, char **argv, const char *const *flags, int nflags, lk_config_args *out) {
    memset(out, 0, sizeof *out);
    lk_status st = args_parse(argc, argv, flags, nflags, out);
    if (st) lk_config_args_free(out);
    return st;
}

void lk_config_args_free(lk_config_args *args) {
    if (!args) return;
    for (int i = 0; i < args->n; i++) lk_free(args->items[i].key);
    lk_free(args->items);
    lk_free(args->rest);
    memset(args, 0, sizeof *args);
}

/* ---- overrides as jsonargparse (LightningCLI's parser) reads them ---------------------------- */

/* In a map with a class_path, these are the keys of the map itself; any other
 * key is an argument of the class. */
static bool class_own_key(const char *k, size_t len) {
    return (len == 10 && !strncmp(k, "class_path", 10)) || (len == 9 && !strncmp(k, "init_args", 9)) ||
           (len == 11 && !strncmp(k, "dict_kwargs", 11));
}

static bool has_class_path(const lk_config_node *n) {
    return n && n->type == LK_CONFIG_MAP && lk__cfg_map_find(n, "class_path", 10);
}

static bool is_index(const char *s, size_t len) {
    if (!len || len > 9) return false;
    for (size_t i = 0; i < len; i++)
        if (!isdigit((unsigned char)s[i])) return false;
    return true;
}

static lk_status key_push(char *out, size_t size, size_t *at, const char *part, size_t len) {
    if (*at + len + 2 > size) return lk_error(LK_STATUS_INVALID_ARGUMENT, "override key too long");
    if (*at) out[(*at)++] = '.';
    memcpy(out + *at, part, len);
    *at += len;
    out[*at] = 0;
    return LK_STATUS_OK;
}

/* The path an override `key` names in the tree as loaded so far, the way
 * jsonargparse reads it (so `--optimizer.lr 0.5` is not set beside a
 * class_path, where nothing reads it):
 *  - inside a map with a class_path, a key other than class_path, init_args
 *    and dict_kwargs is short for init_args.<key>: --optimizer.lr 0.5 sets
 *    optimizer.init_args.lr, --model.hidden [64] model.init_args.hidden;
 *  - inside a sequence, a part that is not an index names its last element:
 *    --trainer.callbacks.patience 3 after --trainer.callbacks+=EarlyStopping;
 *  - a last part ending in '+' appends the value to the sequence there
 *    (*append). *through_seq: the path passes an element of a sequence. */
static lk_status resolve_key(const lk_config *cfg, const char *key, char *out, size_t size, bool *append,
                             bool *through_seq) {
    *append = *through_seq = false;
    size_t at = 0;
    out[0] = 0;
    const lk_config_node *node = cfg->root;
    const char *s = key;
    while (*s) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        if (!dot && len > 1 && s[len - 1] == '+') {
            *append = true;
            len--;
        }
        if (node && node->type == LK_CONFIG_SEQ) {
            if (!is_index(s, len)) { /* the last element, then this part again inside it */
                if (!node->n)
                    return lk_error(LK_STATUS_INVALID_ARGUMENT,
                                    "command line: --%s: '%.*s' is an empty list, so '%.*s' names no element of it "
                                    "(add one first: --%.*s+=CLASS_NAME)",
                                    key, (int)(s - key - 1), key, (int)len, s, (int)(s - key - 1), key);
                char idx[16];
                snprintf(idx, sizeof idx, "%d", node->n - 1);
                LK_TRY(key_push(out, size, &at, idx, strlen(idx)));
                node = node->kids[node->n - 1];
                *through_seq = true;
                continue;
            }
            long i = strtol(s, NULL, 10);
            if (i >= node->n)
                return lk_error(LK_STATUS_INVALID_ARGUMENT, "command line: --%s: '%.*s' has %d element%s, no index %ld",
                                key, (int)(s - key - 1), key, node->n, node->n == 1 ? "" : "s", i);
            LK_TRY(key_push(out, size, &at, s, len));
            node = node->kids[i];
            *through_seq = true;
        } else {
            if (has_class_path(node) && !class_own_key(s, len)) {
                LK_TRY(key_push(out, size, &at, "init_args", 9));
                node = lk__cfg_map_find(node, "init_args", 9);
            }
            LK_TRY(key_push(out, size, &at, s, len));
            node = node && node->type == LK_CONFIG_MAP ? lk__cfg_map_find(node, s, len) : NULL;
        }
        if (!dot) break;
        s = dot + 1;
    }
    return LK_STATUS_OK;
}

/* The node at a resolved path (maps by key, sequences by index); NULL when absent. */
static lk_config_node *node_at(lk_config_node *node, const char *path, const char *end) {
    const char *s = path;
    while (node && s < end) {
        const char *dot = memchr(s, '.', (size_t)(end - s));
        size_t len = dot ? (size_t)(dot - s) : (size_t)(end - s);
        if (node->type == LK_CONFIG_MAP) node = lk__cfg_map_find(node, s, len);
        else if (node->type == LK_CONFIG_SEQ && is_index(s, len)) {
            long i = strtol(s, NULL, 10);
            node = i < node->n ? node->kids[i] : NULL;
        } else node = NULL;
        s = dot ? dot + 1 : end;
    }
    return node;
}

/* An element given by its class name alone stands for {class_path: NAME}. */
static lk_status as_class_map(lk_config_node *n, const char *file) {
    if (n->type != LK_CONFIG_SCALAR || !n->text || !strcmp(n->text, "null")) return LK_STATUS_OK;
    lk_config_node *cp = lk__cfg_node_new(LK_CONFIG_SCALAR, file, n->line, n->col);
    if (!cp || !(cp->key = lk_strdup("class_path")) || lk__cfg_node_append(n, cp)) {
        lk__cfg_node_free(cp);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    cp->text = n->text;
    cp->quoted = n->quoted;
    n->text = NULL;
    n->type = LK_CONFIG_MAP;
    return LK_STATUS_OK;
}

static lk_status set_override(lk_config *cfg, const char *key, const char *value) {
    char path[1024];
    bool append, through_seq;
    LK_TRY(resolve_key(cfg, key, path, sizeof path, &append, &through_seq));
    if (!append && !through_seq) return lk__cfg_set_path(cfg, path, value, NULL, false);
    const char *file = lk__cfg_intern_file(cfg, "command line");
    if (!file) return LK_STATUS_OUT_OF_MEMORY;
    lk_config_node *leaf = NULL;
    lk_status st = lk__cfg_parse_value(value, file, &leaf);
    if (st) return lk_error(st, "command line: --%s: %s", key, lk_last_error());
    if (append) { /* onto the sequence at `path`, made when absent or null */
        lk_config_node *seq = node_at(cfg->root, path, path + strlen(path));
        if (!seq || (seq->type == LK_CONFIG_SCALAR && (!seq->text || !strcmp(seq->text, "null")))) {
            if ((st = lk__cfg_set_path(cfg, path, "[]", NULL, false))) {
                lk__cfg_node_free(leaf);
                return st;
            }
            seq = node_at(cfg->root, path, path + strlen(path));
        }
        if (!seq || seq->type != LK_CONFIG_SEQ) {
            lk__cfg_node_free(leaf);
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "command line: --%s: '%s' is not a list, so nothing can be appended to it",
                            key, path);
        }
        if ((st = as_class_map(leaf, file)) || (st = lk__cfg_node_append(seq, leaf))) lk__cfg_node_free(leaf);
        return st;
    }
    /* through a sequence element: merge {rest...: value} into the element at the
     * deepest index on the path */
    const char *cut = NULL; /* end of the element's path */
    for (const char *s = path;; s++)
        if (*s == '.' || !*s) {
            lk_config_node *n = node_at(cfg->root, path, s);
            if (n && n->type == LK_CONFIG_SEQ && *s) {
                const char *e = strchr(s + 1, '.');
                cut = e ? e : s + strlen(s);
            }
            if (!*s) break;
        }
    lk_config_node *elem = cut ? node_at(cfg->root, path, cut) : NULL;
    if (!elem) {
        lk__cfg_node_free(leaf);
        return lk_error(LK_STATUS_INTERNAL, "command line: --%s: no element at '%s'", key, path);
    }
    if (!*cut) { /* the element itself */
        if ((st = as_class_map(leaf, file))) {
            lk__cfg_node_free(leaf);
            return st;
        }
        leaf->key = NULL;
        lk_config_node tmp = *elem;
        *elem = *leaf;
        *leaf = tmp;
        lk__cfg_node_free(leaf);
        return LK_STATUS_OK;
    }
    if ((st = as_class_map(elem, file))) {
        lk__cfg_node_free(leaf);
        return st;
    }
    if (elem->type != LK_CONFIG_MAP) {
        lk__cfg_node_free(leaf);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "command line: --%s: '%.*s' is %s, not a mapping", key,
                        (int)(cut - path), path, lk__cfg_type_word(elem->type));
    }
    lk_config_node *src;
    LK_TRY(lk__cfg_wrap_path(cut + 1, cut + strlen(cut), leaf, file, &src));
    if ((st = lk__cfg_merge_reserve(elem, src))) {
        lk__cfg_node_free(src);
        return st;
    }
    lk__cfg_merge_move(elem, src);
    return LK_STATUS_OK;
}

lk_status lk_config_load_args(lk_config *cfg, const lk_config_args *args) {
    /* Files first, then overrides, each in command-line order: an override
     * wins over every file wherever it was typed ("--trainer.max_epochs 3
     * -c a.yaml" keeps 3), as the help says. Among the overrides, class paths
     * go first, so that `--optimizer.lr 0.5 --optimizer.class_path SGD` reads
     * lr as SGD's argument whichever was typed first. */
    for (int i = 0; i < args->n; i++)
        if (args->items[i].kind == LK_CONFIG_ARG_FILE) LK_TRY(lk_config_load_file(cfg, args->items[i].value));
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < args->n; i++) {
            const lk_config_arg *a = &args->items[i];
            if (a->kind == LK_CONFIG_ARG_FILE) continue;
            size_t kl = strlen(a->key);
            bool cp = kl >= 10 && !strcmp(a->key + kl - 10, "class_path") && (kl == 10 || a->key[kl - 11] == '.');
            if (cp == !pass) LK_TRY(set_override(cfg, a->key, a->value));
        }
    return LK_STATUS_OK;
}

/* The config tree's nodes: making, freeing, copying (YAML aliases) and
 * merging them (maps merge, everything else replaces), and the interned
 * source names the nodes point at. Below both config.c and config_yaml.c. */
#include <stdlib.h>
#include <string.h>

#include "core/config_impl.h"

/* ---- nodes ----------------------------------------------------------------- */

lk_config_node *lk__cfg_node_new(lk_config_type type, const char *file, int line, int col) {
    lk_config_node *n = lk_calloc(1, sizeof *n);
    if (!n) return NULL;
    n->type = type;
    n->file = file;
    n->line = line;
    n->col = col;
    return n;
}

void lk__cfg_node_free(lk_config_node *n) {
    if (!n) return;
    for (int i = 0; i < n->n; i++) lk__cfg_node_free(n->kids[i]);
    lk_free(n->kids);
    lk_free(n->key);
    lk_free(n->text);
    lk_free(n);
}

lk_status lk__cfg_node_reserve(lk_config_node *n, int want) {
    if (want <= n->cap) return LK_STATUS_OK;
    return lk_vec_reserve(n->kids, n->cap, (size_t)want, 4);
}

lk_status lk__cfg_node_append(lk_config_node *parent, lk_config_node *kid) {
    LK_TRY(lk__cfg_node_reserve(parent, parent->n + 1));
    parent->kids[parent->n++] = kid;
    return LK_STATUS_OK;
}

lk_config_node *lk__cfg_map_find(const lk_config_node *map, const char *key, size_t len) {
    for (int i = 0; i < map->n; i++)
        if (!strncmp(map->kids[i]->key, key, len) && map->kids[i]->key[len] == 0) return map->kids[i];
    return NULL;
}

int lk__cfg_map_index(const lk_config_node *map, const char *key) {
    for (int i = 0; i < map->n; i++)
        if (!strcmp(map->kids[i]->key, key)) return i;
    return -1;
}

/* A deep copy of `src` (for YAML aliases), counting nodes against *budget. */
lk_config_node *lk__cfg_node_copy(const lk_config_node *src, long *budget) {
    if (--*budget < 0) return NULL;
    lk_config_node *n = lk__cfg_node_new(src->type, src->file, src->line, src->col);
    if (!n) return NULL;
    n->quoted = src->quoted;
    n->key_line = src->key_line;
    n->key_col = src->key_col;
    if ((src->text && !(n->text = lk_strdup(src->text))) || (src->key && !(n->key = lk_strdup(src->key))) ||
        lk__cfg_node_reserve(n, src->n)) {
        lk__cfg_node_free(n);
        return NULL;
    }
    for (int i = 0; i < src->n; i++) {
        lk_config_node *k = lk__cfg_node_copy(src->kids[i], budget);
        if (!k) {
            lk__cfg_node_free(n);
            return NULL;
        }
        n->kids[n->n++] = k;
    }
    return n;
}

const char *lk__cfg_type_word(lk_config_type t) {
    return t == LK_CONFIG_MAP ? "a mapping" : t == LK_CONFIG_SEQ ? "a sequence" : "a scalar";
}

/* ---- merging ----------------------------------------------------------------- */

/* First pass: grows every destination map so that the second pass cannot
 * fail — a failed load leaves the config exactly as it was. */
lk_status lk__cfg_merge_reserve(lk_config_node *dst, const lk_config_node *src) {
    int extra = 0;
    for (int i = 0; i < src->n; i++) {
        lk_config_node *d = lk__cfg_map_find(dst, src->kids[i]->key, strlen(src->kids[i]->key));
        if (!d) extra++;
        else if (d->type == LK_CONFIG_MAP && src->kids[i]->type == LK_CONFIG_MAP)
            LK_TRY(lk__cfg_merge_reserve(d, src->kids[i]));
    }
    return lk__cfg_node_reserve(dst, dst->n + extra);
}

/* Second pass: moves src's children into dst (maps merge, the rest
 * replaces) and frees what is left of src. Cannot fail. */
void lk__cfg_merge_move(lk_config_node *dst, lk_config_node *src) {
    for (int i = 0; i < src->n; i++) {
        lk_config_node *s = src->kids[i];
        int j = lk__cfg_map_index(dst, s->key);
        if (j < 0) {
            dst->kids[dst->n++] = s;
        } else if (dst->kids[j]->type == LK_CONFIG_MAP && s->type == LK_CONFIG_MAP) {
            lk__cfg_merge_move(dst->kids[j], s);
        } else {
            lk__cfg_node_free(dst->kids[j]);
            dst->kids[j] = s;
        }
    }
    src->n = 0;
    lk__cfg_node_free(src);
}

lk_status lk__cfg_merge_root(lk_config *cfg, lk_config_node *src) {
    lk_status st = lk__cfg_merge_reserve(cfg->root, src);
    if (st) {
        lk__cfg_node_free(src);
        return st;
    }
    lk__cfg_merge_move(cfg->root, src);
    return LK_STATUS_OK;
}

const char *lk__cfg_intern_file(lk_config *cfg, const char *name) {
    for (int i = 0; i < cfg->nfiles; i++)
        if (!strcmp(cfg->files[i], name)) return cfg->files[i];
    char **f = lk_realloc(cfg->files, (size_t)(cfg->nfiles + 1) * sizeof *f);
    if (!f) return NULL;
    cfg->files = f;
    char *s = lk_strdup(name);
    if (!s) return NULL;
    cfg->files[cfg->nfiles++] = s;
    return s;
}


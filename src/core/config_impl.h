/* Inside the config tree (src/core/config*.c): the node and tree structs
 * and the helpers the three files share. config.c owns the nodes, merging,
 * loading, setting, lookup and parameter tables; config_yaml.c talks to
 * libyaml (parsing and emitting); config_args.c reads the command line and
 * places overrides as LightningCLI's parser does. */
#ifndef LOCKSTEP_CORE_CONFIG_IMPL_H
#define LOCKSTEP_CORE_CONFIG_IMPL_H

#include "lockstep/config.h"

struct lk_config_node {
    lk_config_type type;
    bool quoted;          /* scalar: quoted, block or !!str in the source */
    int line, col;        /* where the value starts (1-based; 0 = command line) */
    int key_line, key_col; /* where its key starts, for nodes inside a map */
    const char *file;     /* interned in the owning lk_config */
    char *key;            /* key in the parent map, or NULL */
    char *text;           /* scalar text */
    lk_config_node **kids;
    int n, cap;
};

struct lk_config {
    lk_config_node *root;
    char **files; /* every source name, so nodes can point at them */
    int nfiles;
};

/* Bounds what one source may expand to (aliases of aliases grow
 * exponentially — "billion laughs"); real configs have hundreds of nodes. */
#define MAX_NODES 100000

lk_config_node *lk__cfg_node_new(lk_config_type type, const char *file, int line, int col);
void lk__cfg_node_free(lk_config_node *n);
lk_status lk__cfg_node_reserve(lk_config_node *n, int want);
lk_status lk__cfg_node_append(lk_config_node *parent, lk_config_node *kid);
lk_config_node *lk__cfg_map_find(const lk_config_node *map, const char *key, size_t len);
int lk__cfg_map_index(const lk_config_node *map, const char *key);
/* A deep copy of `src` (for YAML aliases), counting nodes against *budget. */
lk_config_node *lk__cfg_node_copy(const lk_config_node *src, long *budget);
const char *lk__cfg_type_word(lk_config_type t);
/* Merging src into dst (maps merge, the rest replaces) in two passes: the
 * first reserves (may fail, nothing changed), the second moves and frees src. */
lk_status lk__cfg_merge_reserve(lk_config_node *dst, const lk_config_node *src);
void lk__cfg_merge_move(lk_config_node *dst, lk_config_node *src);
lk_status lk__cfg_merge_root(lk_config *cfg, lk_config_node *src);
const char *lk__cfg_intern_file(lk_config *cfg, const char *name);
size_t lk__cfg_utf8_invalid_at(const char *str);
/* YAML text into a tree (config_yaml.c); `file` names it in messages. */
lk_status lk__cfg_parse_yaml(const char *yaml, size_t len, const char *file, lk_config_node **out);
/* An override's value text as a node: a scalar or a flow collection. */
lk_status lk__cfg_parse_value(const char *value, const char *file, lk_config_node **out);
/* Wraps `leaf` in maps from the innermost key of path[0..end) outwards. */
lk_status lk__cfg_wrap_path(const char *path, const char *end, lk_config_node *leaf, const char *file,
                            lk_config_node **out);
lk_status lk__cfg_set_path(lk_config *cfg, const char *path, const char *value, const char *origin, bool only_default);

#endif

/* lockstep/config.h — the YAML config tree behind `lockstep fit -c a.yaml
 * -c b.yaml --trainer.max_epochs 3`: maps, sequences and scalars, each node
 * remembering the file, line and column it came from, so that every later
 * validation error can point at the exact place in the user's file.
 *
 * The tree holds text only; types are given by the parameter tables
 * (core.h, lk_param) when a map is applied to a config struct with
 * lk_config_apply_params.
 *
 * Merge semantics (lk_config_load_file, lk_config_load_string, lk_config_set):
 *   - a map merged into a map merges key by key, recursively; keys keep the
 *     order in which they were first seen, new keys are appended;
 *   - anything else replaces what was there: scalars, sequences (sequences
 *     are never concatenated), a map replacing a scalar, `key: null`
 *     replacing a map;
 *   - sources are applied in the order they are given, so the last one wins:
 *     `-c a.yaml -c b.yaml --x 1` gives b over a and the override over both;
 *     an override placed before a `-c` file is overridden by that file
 *     (jsonargparse's rule: command-line order is the precedence).
 *   - every top-level document must be a mapping (or empty); an empty
 *     plain value (`key:`) is the scalar "null"; a key may appear only once
 *     per mapping in one document.
 *
 *     lk_config *cfg = lk_config_create();
 *     lk_status st = lk_config_load_file(cfg, "examples/mlp.yaml");
 *     if (!st) st = lk_config_set(cfg, "trainer.max_epochs", "3", NULL);
 *     if (!st) st = lk_config_apply_params(lk_config_get(cfg, "trainer"), table, n, &tcfg, "trainer");
 *     if (st) fprintf(stderr, "error: %s\n", lk_last_error());
 *     lk_config_free(cfg);
 */
#ifndef LOCKSTEP_CONFIG_H
#define LOCKSTEP_CONFIG_H

#include <stdio.h>

#include "lockstep/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lk_config lk_config;           /* opaque: the tree and the files it was read from */
typedef struct lk_config_node lk_config_node; /* opaque: one node, owned by its lk_config */

typedef enum { LK_CONFIG_SCALAR, LK_CONFIG_MAP, LK_CONFIG_SEQ } lk_config_type;

/* Nesting deeper than this in a source is rejected (keeps recursion bounded). */
#define LK_CONFIG_MAX_DEPTH 64

/* ------------------------------------------------------------------------
 * Lifetime and loading.
 * ---------------------------------------------------------------------- */

/* An empty config (its root is an empty map). NULL on out-of-memory. */
lk_config *lk_config_create(void);
void lk_config_free(lk_config *cfg); /* NULL does nothing */

/* Parses the YAML file at `path` and merges it into `cfg` (semantics above).
 * Errors: IO naming the path when it cannot be read; INVALID_ARGUMENT
 * "FILE:LINE:COL: <libyaml's problem>" for malformed YAML, a non-mapping
 * top level, a duplicate key, aliases that expand too far, nesting deeper
 * than LK_CONFIG_MAX_DEPTH. On failure `cfg` is left unchanged. */
lk_status lk_config_load_file(lk_config *cfg, const char *path);
/* The same for YAML text (`len` bytes); `name` stands for the file name in
 * locations and messages (e.g. "<string>"). */
lk_status lk_config_load_string(lk_config *cfg, const char *yaml, size_t len, const char *name);

/* Sets the node at dotted `path` ("trainer.max_epochs") to `value`, parsed
 * as YAML: a scalar ("3", "null", "'quoted'") or a flow collection
 * ("[1, 2]", "{a: 1}"); any other text becomes a string scalar. Missing
 * intermediate maps are created (a null scalar on the way becomes a map).
 * `origin` names the source in later messages (NULL: "command line").
 * Fails (cfg unchanged) when a non-null scalar or a sequence lies on the
 * path, or a flow collection in `value` is malformed. */
lk_status lk_config_set(lk_config *cfg, const char *path, const char *value, const char *origin);
/* lk_config_set(cfg, path, value, "command line"). */
lk_status lk_config_set_override(lk_config *cfg, const char *path, const char *value);
/* Like lk_config_set, but only when nothing exists at `path` yet (used to
 * fill defaults in for --print_config); does nothing otherwise. */
lk_status lk_config_set_default(lk_config *cfg, const char *path, const char *value, const char *origin);

/* ------------------------------------------------------------------------
 * Lookup and iteration. Every accessor accepts NULL and then returns
 * NULL / 0, so chains like lk_config_node_text(lk_config_get(cfg, "x"))
 * need no checks. Nodes are borrowed: valid until the next change to cfg.
 * ---------------------------------------------------------------------- */

const lk_config_node *lk_config_root(const lk_config *cfg);
/* The node at dotted `path` below the root; NULL when absent. Sequence
 * elements are addressed by index ("trainer.devices.0"). "" is the root. */
const lk_config_node *lk_config_get(const lk_config *cfg, const char *path);
const lk_config_node *lk_config_node_get(const lk_config_node *node, const char *path);

lk_config_type lk_config_node_type(const lk_config_node *node); /* NULL: LK_CONFIG_SCALAR */
/* A scalar's text ("3", "null", "hello"); NULL for maps, sequences and NULL. */
const char *lk_config_node_text(const lk_config_node *node);
/* True for a scalar that is a string whatever its text: quoted, a block
 * scalar (| or >) or tagged !!str in its source (so "null" or "3" is meant
 * as a string), or plain text YAML can only write back quoted (tabs, ...). */
bool lk_config_node_quoted(const lk_config_node *node);
/* True for an unquoted null, ~ or empty value. */
bool lk_config_node_is_null(const lk_config_node *node);
/* Children of a map (in key order) or a sequence; 0 for scalars. */
int lk_config_node_count(const lk_config_node *node);
const lk_config_node *lk_config_node_child(const lk_config_node *node, int i);
/* The key under which this node sits in its parent map; NULL otherwise. */
const char *lk_config_node_key(const lk_config_node *node);
/* Where the node was defined: file name (or origin), 1-based line and
 * column (0 for command-line values). */
const char *lk_config_node_file(const lk_config_node *node);
int lk_config_node_line(const lk_config_node *node);
int lk_config_node_column(const lk_config_node *node);
/* "FILE:LINE:COL" (or just FILE when the line is 0) into buf; returns buf. */
char *lk_config_node_where(const lk_config_node *node, char *buf, size_t size);
/* Where the value of dotted key `key` came from, as messages and run.json
 * name a setting's source: "trainer.comm_timeout in run.yaml:4:3", or
 * "--trainer.comm_timeout on the command line" for an override. */
char *lk_config_node_origin(const lk_config_node *node, const char *key, char *buf, size_t size);

/* ------------------------------------------------------------------------
 * Applying a map to a parameter table (core.h). Every key of `map` must be
 * in the table (otherwise the lk_params_set "unknown key ... (did you mean
 * ...)" error), every value must parse and lie in range; a mapping or a
 * sequence where a scalar is expected (or the reverse) is an error naming
 * the key, what was found and the expected type. All messages start with
 * the node's FILE:LINE:COL. `prefix` is the dotted path of `map` used in
 * messages ("trainer"). A NULL or null map applies nothing. Keys applied
 * before a failing one keep their new values.
 * ---------------------------------------------------------------------- */
lk_status lk_config_apply_params(const lk_config_node *map, const lk_param *table, int n, void *cfg,
                                 const char *prefix);
/* Same, leaving the keys named in skip[0..nskip) to the caller (values whose
 * form the table cannot hold, such as a list of callbacks). */
lk_status lk_config_apply_params_except(const lk_config_node *map, const lk_param *table, int n, void *cfg,
                                        const char *prefix, const char *const *skip, int nskip);

/* ------------------------------------------------------------------------
 * Emitting. The output is YAML that loads back to the same tree (same
 * keys in the same order, same scalar texts, quoted scalars quoted).
 * ---------------------------------------------------------------------- */
lk_status lk_config_emit_yaml(const lk_config *cfg, FILE *f);
/* Removes every null map entry (and maps left empty by that), as
 * jsonargparse's --print_config=skip_null shows a config. Cannot fail. */
void lk_config_drop_nulls(lk_config *cfg);
lk_status lk_config_node_emit_yaml(const lk_config_node *node, FILE *f);
/* The YAML text as a NUL-terminated string; the caller frees it with lk_free. */
lk_status lk_config_node_to_yaml(const lk_config_node *node, char **out, size_t *len);

/* ------------------------------------------------------------------------
 * Command-line arguments. Parses, in order:
 *   -c FILE, --config FILE, --config=FILE       a config file (repeatable)
 *   --a.b.c VALUE, --a.b.c=VALUE, --key VALUE   an override (any --name)
 *   anything in `flags` (matched on the part before '='), positional
 *   arguments, and everything after "--"       leftovers, for the caller
 * `flags` lists the options that take no value, such as "--help", "-h",
 * "--print_config". Every element of argv is parsed (pass argc - 1,
 * argv + 1 to skip a program or subcommand name). Values and leftovers are
 * borrowed from argv; keys are owned by `out`.
 * ---------------------------------------------------------------------- */
typedef enum { LK_CONFIG_ARG_FILE, LK_CONFIG_ARG_OVERRIDE } lk_config_arg_kind;
typedef struct lk_config_arg {
    lk_config_arg_kind kind;
    char *key;         /* OVERRIDE: dotted path without the dashes (owned by the args); FILE: NULL */
    const char *value; /* FILE: the path; OVERRIDE: the value text */
} lk_config_arg;
typedef struct lk_config_args {
    lk_config_arg *items; /* files and overrides, in command-line order */
    int n;
    char **rest; /* leftovers, in order */
    int nrest;
} lk_config_args;

/* Fills `out` (free with lk_config_args_free). INVALID_USAGE naming the
 * option when a value is missing or an option is not understood. */
lk_status lk_config_args_parse(int argc, char **argv, const char *const *flags, int nflags, lk_config_args *out);
void lk_config_args_free(lk_config_args *args);
/* Loads every file of `args` in order, then applies every override in order:
 * overrides beat files wherever they stand on the command line. */
lk_status lk_config_load_args(lk_config *cfg, const lk_config_args *args);

#ifdef __cplusplus
}
#endif
#endif

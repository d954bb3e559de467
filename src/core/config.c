/* The YAML config tree: parsing files and strings with libyaml into nodes
 * that remember file:line:col, merging sources in order (maps merge,
 * everything else replaces), dotted-path lookup and overrides, applying a
 * map to an lk_param table with located errors, emitting YAML that loads
 * back to the same tree, and splitting command-line arguments into config
 * files, overrides and leftovers. Types are not decided here: the tree
 * holds text and the parameter tables (params.c) validate it. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

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

/* ---- nodes ----------------------------------------------------------------- */

static lk_config_node *node_new(lk_config_type type, const char *file, int line, int col) {
    lk_config_node *n = lk_calloc(1, sizeof *n);
    if (!n) return NULL;
    n->type = type;
    n->file = file;
    n->line = line;
    n->col = col;
    return n;
}

static void node_free(lk_config_node *n) {
    if (!n) return;
    for (int i = 0; i < n->n; i++) node_free(n->kids[i]);
    lk_free(n->kids);
    lk_free(n->key);
    lk_free(n->text);
    lk_free(n);
}

static lk_status node_reserve(lk_config_node *n, int want) {
    if (want <= n->cap) return LK_STATUS_OK;
    return lk_vec_reserve(n->kids, n->cap, (size_t)want, 4);
}

static lk_status node_append(lk_config_node *parent, lk_config_node *kid) {
    LK_TRY(node_reserve(parent, parent->n + 1));
    parent->kids[parent->n++] = kid;
    return LK_STATUS_OK;
}

static lk_config_node *map_find(const lk_config_node *map, const char *key, size_t len) {
    for (int i = 0; i < map->n; i++)
        if (!strncmp(map->kids[i]->key, key, len) && map->kids[i]->key[len] == 0) return map->kids[i];
    return NULL;
}

static int map_index(const lk_config_node *map, const char *key) {
    for (int i = 0; i < map->n; i++)
        if (!strcmp(map->kids[i]->key, key)) return i;
    return -1;
}

/* A deep copy of `src` (for YAML aliases), counting nodes against *budget. */
static lk_config_node *node_copy(const lk_config_node *src, long *budget) {
    if (--*budget < 0) return NULL;
    lk_config_node *n = node_new(src->type, src->file, src->line, src->col);
    if (!n) return NULL;
    n->quoted = src->quoted;
    n->key_line = src->key_line;
    n->key_col = src->key_col;
    if ((src->text && !(n->text = lk_strdup(src->text))) || (src->key && !(n->key = lk_strdup(src->key))) ||
        node_reserve(n, src->n)) {
        node_free(n);
        return NULL;
    }
    for (int i = 0; i < src->n; i++) {
        lk_config_node *k = node_copy(src->kids[i], budget);
        if (!k) {
            node_free(n);
            return NULL;
        }
        n->kids[n->n++] = k;
    }
    return n;
}

static const char *type_word(lk_config_type t) {
    return t == LK_CONFIG_MAP ? "a mapping" : t == LK_CONFIG_SEQ ? "a sequence" : "a scalar";
}

/* ---- merging ----------------------------------------------------------------- */

/* First pass: grows every destination map so that the second pass cannot
 * fail — a failed load leaves the config exactly as it was. */
static lk_status merge_reserve(lk_config_node *dst, const lk_config_node *src) {
    int extra = 0;
    for (int i = 0; i < src->n; i++) {
        lk_config_node *d = map_find(dst, src->kids[i]->key, strlen(src->kids[i]->key));
        if (!d) extra++;
        else if (d->type == LK_CONFIG_MAP && src->kids[i]->type == LK_CONFIG_MAP)
            LK_TRY(merge_reserve(d, src->kids[i]));
    }
    return node_reserve(dst, dst->n + extra);
}

/* Second pass: moves src's children into dst (maps merge, the rest
 * replaces) and frees what is left of src. Cannot fail. */
static void merge_move(lk_config_node *dst, lk_config_node *src) {
    for (int i = 0; i < src->n; i++) {
        lk_config_node *s = src->kids[i];
        int j = map_index(dst, s->key);
        if (j < 0) {
            dst->kids[dst->n++] = s;
        } else if (dst->kids[j]->type == LK_CONFIG_MAP && s->type == LK_CONFIG_MAP) {
            merge_move(dst->kids[j], s);
        } else {
            node_free(dst->kids[j]);
            dst->kids[j] = s;
        }
    }
    src->n = 0;
    node_free(src);
}

static lk_status merge_root(lk_config *cfg, lk_config_node *src) {
    lk_status st = merge_reserve(cfg->root, src);
    if (st) {
        node_free(src);
        return st;
    }
    merge_move(cfg->root, src);
    return LK_STATUS_OK;
}

static const char *intern_file(lk_config *cfg, const char *name) {
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

/* ---- parsing ------------------------------------------------------------------- */

typedef struct {
    char *name;
    lk_config_node *node;
    bool owned; /* a scalar's own copy: the scalar itself may become a key and be freed */
} anchor;

typedef struct {
    const char *file;
    const char *input; /* the source text, for locating reader errors */
    size_t input_len;
    yaml_parser_t parser;
    lk_config_node *stack[LK_CONFIG_MAX_DEPTH + 1];
    char *pending_key[LK_CONFIG_MAX_DEPTH + 1]; /* a map's key waiting for its value */
    int key_line[LK_CONFIG_MAX_DEPTH + 1], key_col[LK_CONFIG_MAX_DEPTH + 1];
    int depth;
    lk_config_node *root;
    anchor *anchors;
    int nanchors;
    long budget;
} builder;

static bool is_core_tag(const unsigned char *tag, const char *name) {
    if (!tag) return false;
    const char *t = (const char *)tag;
    return !strncmp(t, "tag:yaml.org,2002:", 18) && !strcmp(t + 18, name);
}

static lk_status parse_error(builder *b) {
    yaml_parser_t *p = &b->parser;
    if (p->error == YAML_MEMORY_ERROR) return lk_error(LK_STATUS_OUT_OF_MEMORY, "%s: out of memory parsing YAML", b->file);
    yaml_mark_t m = p->problem_mark;
    if (p->error == YAML_READER_ERROR) { /* only a byte offset: count lines up to it */
        size_t line = 1, col = 1;
        for (size_t i = 0; i < p->problem_offset && i < b->input_len; i++) {
            if (b->input[i] == '\n') line++, col = 1;
            else if (((unsigned char)b->input[i] & 0xc0) != 0x80) col++;
        }
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%zu:%zu: invalid YAML: %s (byte %zu)", b->file, line, col,
                        p->problem ? p->problem : "unreadable input", p->problem_offset);
    }
    if (p->context)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%zu:%zu: invalid YAML: %s %s (line %zu, column %zu)", b->file,
                        m.line + 1, m.column + 1, p->problem ? p->problem : "syntax error", p->context,
                        p->context_mark.line + 1, p->context_mark.column + 1);
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%zu:%zu: invalid YAML: %s", b->file, m.line + 1, m.column + 1,
                    p->problem ? p->problem : "syntax error");
}

static lk_status oom(builder *b) { return lk_error(LK_STATUS_OUT_OF_MEMORY, "%s: out of memory building the config tree", b->file); }

/* Attaches a finished or opened node to the collection on top of the stack
 * (or makes it the root). Takes ownership of `n` in every case. */
static lk_status attach(builder *b, lk_config_node *n) {
    if (b->depth == 0) {
        b->root = n;
        return LK_STATUS_OK;
    }
    lk_config_node *parent = b->stack[b->depth - 1];
    int d = b->depth - 1;
    if (parent->type == LK_CONFIG_SEQ) {
        if (node_append(parent, n)) {
            node_free(n);
            return oom(b);
        }
        return LK_STATUS_OK;
    }
    if (!b->pending_key[d]) { /* n is a key */
        lk_status st = LK_STATUS_OK;
        if (n->type != LK_CONFIG_SCALAR)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: a mapping key must be a scalar, got %s", b->file,
                          n->line, n->col, type_word(n->type));
        else if (map_find(parent, n->text, strlen(n->text))) {
            const lk_config_node *first = map_find(parent, n->text, strlen(n->text));
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: duplicate key '%s' (first defined at line %d)", b->file,
                          n->line, n->col, n->text, first->key_line);
        }
        if (!st) {
            b->pending_key[d] = n->text;
            b->key_line[d] = n->line;
            b->key_col[d] = n->col;
            n->text = NULL;
        }
        node_free(n);
        return st;
    }
    n->key = b->pending_key[d];
    n->key_line = b->key_line[d];
    n->key_col = b->key_col[d];
    b->pending_key[d] = NULL;
    if (node_append(parent, n)) {
        node_free(n);
        return oom(b);
    }
    return LK_STATUS_OK;
}

static lk_status add_anchor(builder *b, const unsigned char *name, lk_config_node *n) {
    if (!name) return LK_STATUS_OK;
    anchor *a = lk_realloc(b->anchors, (size_t)(b->nanchors + 1) * sizeof *a);
    if (!a) return oom(b);
    b->anchors = a;
    bool owned = n->type == LK_CONFIG_SCALAR;
    long budget = 1;
    lk_config_node *target = owned ? node_copy(n, &budget) : n;
    char *s = lk_strdup((const char *)name);
    if (!s || !target) {
        lk_free(s);
        if (owned) node_free(target);
        return oom(b);
    }
    a[b->nanchors].name = s;
    a[b->nanchors].node = target;
    a[b->nanchors].owned = owned;
    b->nanchors++;
    return LK_STATUS_OK;
}

static int node_depth(const lk_config_node *n) {
    int d = 0;
    for (int i = 0; i < n->n; i++) {
        int k = node_depth(n->kids[i]);
        if (k > d) d = k;
    }
    return d + (n->type != LK_CONFIG_SCALAR);
}

static int probe_write(void *data, unsigned char *bytes, size_t size) {
    char *out = data; /* keeps the first 8 bytes: "k: " and what follows */
    size_t have = strlen(out);
    for (size_t i = 0; i < size && have < 8; i++) out[have++] = (char)bytes[i];
    out[have] = 0;
    return 1;
}

/* Whether libyaml would write `text` as a plain value in block context.
 * A plain scalar it would have to quote (tabs, a trailing space after
 * folding, ...) is a string whatever its style, and is marked quoted at
 * load, so that emitting and loading again gives the same tree. */
static bool plain_emittable(const char *text) {
    yaml_emitter_t em;
    if (!yaml_emitter_initialize(&em)) return true;
    char out[16] = {0};
    yaml_emitter_set_output(&em, probe_write, out);
    yaml_emitter_set_unicode(&em, 1);
    yaml_emitter_set_width(&em, -1);
    yaml_event_t ev;
    int ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) && yaml_emitter_emit(&em, &ev) &&
             yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) && yaml_emitter_emit(&em, &ev) &&
             yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE) &&
             yaml_emitter_emit(&em, &ev) &&
             yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)"k", 1, 1, 1, YAML_PLAIN_SCALAR_STYLE) &&
             yaml_emitter_emit(&em, &ev) &&
             yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)text, (int)strlen(text), 1, 1,
                                          YAML_PLAIN_SCALAR_STYLE) &&
             yaml_emitter_emit(&em, &ev) && yaml_mapping_end_event_initialize(&ev) && yaml_emitter_emit(&em, &ev) &&
             yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(&em, &ev) &&
             yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(&em, &ev) && yaml_emitter_flush(&em);
    yaml_emitter_delete(&em);
    return !ok || (out[3] != '\'' && out[3] != '"');
}

/* One event into the tree. */
static lk_status on_event(builder *b, yaml_event_t *ev, int *docs) {
    int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
    switch (ev->type) {
    case YAML_DOCUMENT_START_EVENT:
        if (++*docs > 1)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: more than one YAML document in a config file", b->file,
                            line, col);
        return LK_STATUS_OK;
    case YAML_SCALAR_EVENT: {
        if (--b->budget < 0) goto too_big;
        const yaml_event_t *e = ev;
        if (memchr(e->data.scalar.value, 0, e->data.scalar.length))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: a NUL character in a value is not supported", b->file,
                            line, col);
        lk_config_node *n = node_new(LK_CONFIG_SCALAR, b->file, line, col);
        if (!n) return oom(b);
        bool plain = e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE || e->data.scalar.style == YAML_ANY_SCALAR_STYLE;
        const unsigned char *tag = e->data.scalar.tag;
        n->quoted = !plain;
        if (is_core_tag(tag, "str")) n->quoted = true;
        if (is_core_tag(tag, "int") || is_core_tag(tag, "float") || is_core_tag(tag, "bool") || is_core_tag(tag, "null"))
            n->quoted = false;
        const char *v = (const char *)e->data.scalar.value;
        if (!n->quoted && e->data.scalar.length == 0) v = "null";
        else if (!n->quoted && !plain_emittable(v)) n->quoted = true;
        n->text = lk_strdup(v);
        if (!n->text) {
            node_free(n);
            return oom(b);
        }
        if (e->data.scalar.anchor && add_anchor(b, e->data.scalar.anchor, n)) {
            node_free(n);
            return LK_STATUS_OUT_OF_MEMORY;
        }
        return attach(b, n);
    }
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        if (--b->budget < 0) goto too_big;
        if (b->depth >= LK_CONFIG_MAX_DEPTH)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: nesting deeper than %d levels", b->file, line, col,
                            LK_CONFIG_MAX_DEPTH);
        bool map = ev->type == YAML_MAPPING_START_EVENT;
        lk_config_node *n = node_new(map ? LK_CONFIG_MAP : LK_CONFIG_SEQ, b->file, line, col);
        if (!n) return oom(b);
        const unsigned char *anc = map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor;
        if (anc && add_anchor(b, anc, n)) {
            node_free(n);
            return LK_STATUS_OUT_OF_MEMORY;
        }
        LK_TRY(attach(b, n)); /* the parent owns it from here on */
        b->stack[b->depth] = n;
        b->pending_key[b->depth] = NULL;
        b->depth++;
        return LK_STATUS_OK;
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        if (b->depth > 0) b->depth--;
        return LK_STATUS_OK;
    case YAML_ALIAS_EVENT: {
        const char *name = (const char *)ev->data.alias.anchor;
        for (int i = b->nanchors - 1; i >= 0; i--)
            if (!strcmp(b->anchors[i].name, name)) {
                if (b->depth + node_depth(b->anchors[i].node) > LK_CONFIG_MAX_DEPTH)
                    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: alias '*%s' nests deeper than %d levels",
                                    b->file, line, col, name, LK_CONFIG_MAX_DEPTH);
                lk_config_node *n = node_copy(b->anchors[i].node, &b->budget);
                if (!n) {
                    if (b->budget < 0) goto too_big;
                    return oom(b);
                }
                /* the copy sits where the alias is */
                n->line = line;
                n->col = col;
                lk_free(n->key);
                n->key = NULL;
                return attach(b, n);
            }
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: unknown alias '*%s'", b->file, line, col, name);
    }
    default:
        return LK_STATUS_OK;
    }
too_big:
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: the document expands to more than %d nodes", b->file, line, col,
                    MAX_NODES);
}

static void builder_clear(builder *b) {
    /* pending keys of maps still open (on error) belong to nobody else */
    for (int d = 0; d < b->depth; d++) lk_free(b->pending_key[d]);
    node_free(b->root);
    for (int i = 0; i < b->nanchors; i++) {
        lk_free(b->anchors[i].name);
        if (b->anchors[i].owned) node_free(b->anchors[i].node);
    }
    lk_free(b->anchors);
}

/* Parses `len` bytes into a tree (*out; NULL for an empty document). The
 * whole tree uses `file` (interned) for locations. */
static lk_status parse_yaml(const char *yaml, size_t len, const char *file, lk_config_node **out) {
    builder *b = lk_calloc(1, sizeof *b);
    if (!b) return LK_STATUS_OUT_OF_MEMORY;
    b->file = file;
    b->input = yaml;
    b->input_len = len;
    b->budget = MAX_NODES;
    *out = NULL;
    if (!yaml_parser_initialize(&b->parser)) {
        lk_free(b);
        return lk_error(LK_STATUS_OUT_OF_MEMORY, "%s: cannot initialise the YAML parser", file);
    }
    yaml_parser_set_input_string(&b->parser, (const unsigned char *)yaml, len);
    lk_status st = LK_STATUS_OK;
    int docs = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&b->parser, &ev)) {
            st = parse_error(b);
            break;
        }
        bool end = ev.type == YAML_STREAM_END_EVENT;
        st = on_event(b, &ev, &docs);
        yaml_event_delete(&ev);
        if (st || end) break;
    }
    yaml_parser_delete(&b->parser);
    if (!st) {
        *out = b->root;
        b->root = NULL;
    }
    builder_clear(b);
    lk_free(b);
    return st;
}

/* ---- lifetime and loading ---------------------------------------------------------- */

lk_config *lk_config_create(void) {
    lk_config *cfg = lk_calloc(1, sizeof *cfg);
    if (!cfg) return NULL;
    cfg->root = node_new(LK_CONFIG_MAP, "", 0, 0);
    if (!cfg->root) {
        lk_free(cfg);
        return NULL;
    }
    return cfg;
}

void lk_config_free(lk_config *cfg) {
    if (!cfg) return;
    node_free(cfg->root);
    for (int i = 0; i < cfg->nfiles; i++) lk_free(cfg->files[i]);
    lk_free(cfg->files);
    lk_free(cfg);
}

lk_status lk_config_load_string(lk_config *cfg, const char *yaml, size_t len, const char *name) {
    if (!cfg || (!yaml && len)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_config_load_string: NULL argument");
    const char *file = intern_file(cfg, name ? name : "<string>");
    if (!file) return LK_STATUS_OUT_OF_MEMORY;
    lk_config_node *tree;
    LK_TRY(parse_yaml(yaml ? yaml : "", len, file, &tree));
    if (!tree || lk_config_node_is_null(tree)) { /* empty document */
        node_free(tree);
        return LK_STATUS_OK;
    }
    if (tree->type != LK_CONFIG_MAP) {
        lk_status st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: the top level of a config must be a mapping (key: value), got %s%s%s%s",
                                file, tree->line, tree->col, type_word(tree->type), tree->text ? " '" : "",
                                tree->text ? tree->text : "", tree->text ? "'" : "");
        node_free(tree);
        return st;
    }
    return merge_root(cfg, tree);
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
static size_t utf8_invalid_at(const char *str) {
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
static lk_status parse_value(const char *value, const char *file, lk_config_node **out) {
    size_t len = strlen(value);
    const char *v = value;
    while (*v == ' ' || *v == '\t') v++;
    bool flow = *v == '[' || *v == '{';
    lk_config_node *tree = NULL;
    lk_status st = parse_yaml(value, len, file, &tree);
    /* a plain scalar must be the text as typed: "path #1" is not a comment */
    if (!st && tree && tree->type == LK_CONFIG_SCALAR && !tree->quoted && strcmp(tree->text, value) &&
        !lk_config_node_is_null(tree)) {
        node_free(tree);
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
            node_free(tree);
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
    node_free(tree);
    if (st == LK_STATUS_OUT_OF_MEMORY) return st;
    if (flow) { /* drop parse_yaml's "FILE:" in front of "LINE:COL: problem" */
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", lk_last_error());
        const char *m = strstr(msg, file);
        m = m ? m + strlen(file) + 1 : msg;
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "value '%s' at %s", value, m);
    }
    v = empty ? "null" : value;
    /* a string scalar, provided it is text YAML can hold */
    size_t bad_at = utf8_invalid_at(value);
    if (bad_at != (size_t)-1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "value '%s' cannot be held in YAML: invalid UTF-8 at byte %zu", value,
                        bad_at);
    lk_config_node *n = node_new(LK_CONFIG_SCALAR, file, 0, 0);
    if (!n || !(n->text = lk_strdup(v))) {
        node_free(n);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    n->quoted = !empty;
    *out = n;
    return LK_STATUS_OK;
}

/* Wraps `leaf` in maps from the innermost key of path[0..end) outwards
 * ("a.b" + 3 -> {a: {b: 3}}); takes `leaf` (freed on failure). */
static lk_status wrap_path(const char *path, const char *end, lk_config_node *leaf, const char *file,
                           lk_config_node **out) {
    lk_config_node *cur = leaf;
    while (1) {
        const char *dot = end;
        while (dot > path && dot[-1] != '.') dot--;
        size_t kl = (size_t)(end - dot);
        cur->key = lk_malloc(kl + 1);
        if (!cur->key) {
            node_free(cur);
            return LK_STATUS_OUT_OF_MEMORY;
        }
        memcpy(cur->key, dot, kl);
        cur->key[kl] = 0;
        lk_config_node *m = node_new(LK_CONFIG_MAP, file, 0, 0);
        if (!m || node_append(m, cur)) {
            node_free(m);
            node_free(cur);
            return LK_STATUS_OUT_OF_MEMORY;
        }
        cur = m;
        if (dot == path) break;
        end = dot - 1;
    }
    *out = cur;
    return LK_STATUS_OK;
}

static lk_status set_path(lk_config *cfg, const char *path, const char *value, const char *origin, bool only_default) {
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
    if (utf8_invalid_at(path) != (size_t)-1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "invalid key '%s': not UTF-8", path);
    if (parts >= LK_CONFIG_MAX_DEPTH)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "key '%s' is nested deeper than %d levels", path, LK_CONFIG_MAX_DEPTH);
    const char *file = intern_file(cfg, origin ? origin : "command line");
    if (!file) return LK_STATUS_OUT_OF_MEMORY;
    lk_config_node *leaf = NULL;
    lk_status st = parse_value(value, file, &leaf);
    if (st) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", lk_last_error());
        const char *m = msg;
        if (!strncmp(m, "[rank ", 6) && strstr(m, "] ")) m = strstr(m, "] ") + 2;
        return lk_error(st, "%s: --%s: %s", file, path, m);
    }
    lk_config_node *cur;
    LK_TRY(wrap_path(path, path + strlen(path), leaf, file, &cur));
    return merge_root(cfg, cur);
}

lk_status lk_config_set(lk_config *cfg, const char *path, const char *value, const char *origin) {
    return set_path(cfg, path, value, origin, false);
}

lk_status lk_config_set_override(lk_config *cfg, const char *path, const char *value) {
    return set_path(cfg, path, value, NULL, false);
}

lk_status lk_config_set_default(lk_config *cfg, const char *path, const char *value, const char *origin) {
    return set_path(cfg, path, value, origin, true);
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
            node = map_find(node, s, len);
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
                        lk_config_node_where(map, where, sizeof where), *pre ? pre : "config", type_word(map->type),
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
                            param_type_word(p), type_word(c->type));
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
                                p->type == LK_PARAM_INTS ? "an int" : "a float", type_word(e->type));
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
        if (gone) node_free(c);
        else n->kids[k++] = c;
    }
    n->n = k;
}

void lk_config_drop_nulls(lk_config *cfg) {
    if (cfg && cfg->root) drop_nulls(cfg->root);
}

/* ---- emitting -------------------------------------------------------------------------- */

typedef struct {
    FILE *f;
    char *buf;
    size_t len, cap;
    bool failed;
} sink;

static int sink_write(void *data, unsigned char *bytes, size_t size) {
    sink *s = data;
    if (s->f) {
        if (fwrite(bytes, 1, size, s->f) != size) s->failed = true;
        return !s->failed;
    }
    if (lk_vec_reserve(s->buf, s->cap, s->len + size + 1, 1024)) {
        s->failed = true;
        return 0;
    }
    memcpy(s->buf + s->len, bytes, size);
    s->len += size;
    s->buf[s->len] = 0;
    return 1;
}

/* Flow style reads better for short lists of numbers ("[784, 256]"); it
 * is used only where every item is plain text that flow context keeps. */
static bool flow_ok(const lk_config_node *n) {
    if (n->n == 0) return true;
    for (int i = 0; i < n->n; i++) {
        const lk_config_node *e = n->kids[i];
        if (e->type != LK_CONFIG_SCALAR || e->quoted || !*e->text) return false;
        for (const char *s = e->text; *s; s++)
            if (!isalnum((unsigned char)*s) && !strchr("._+-", *s)) return false;
        if (e->text[0] == '-' && !isdigit((unsigned char)e->text[1]) && e->text[1] != '.') return false;
    }
    return true;
}

static int emit_node(yaml_emitter_t *em, const lk_config_node *n) {
    yaml_event_t ev;
    if (n->type == LK_CONFIG_SCALAR) {
        size_t len = strlen(n->text);
        yaml_scalar_style_t style = n->quoted ? YAML_DOUBLE_QUOTED_SCALAR_STYLE : YAML_PLAIN_SCALAR_STYLE;
        /* quoted_implicit always: libyaml then falls back to quotes, not a
         * "!" tag, for plain text it cannot write plain */
        if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)n->text, (int)len, !n->quoted, 1, style))
            return 0;
        return yaml_emitter_emit(em, &ev);
    }
    if (n->type == LK_CONFIG_SEQ) {
        if (!yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                                  flow_ok(n) ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE) ||
            !yaml_emitter_emit(em, &ev))
            return 0;
        for (int i = 0; i < n->n; i++)
            if (!emit_node(em, n->kids[i])) return 0;
        yaml_sequence_end_event_initialize(&ev);
        return yaml_emitter_emit(em, &ev);
    }
    if (!yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, n->n ? YAML_BLOCK_MAPPING_STYLE : YAML_FLOW_MAPPING_STYLE) ||
        !yaml_emitter_emit(em, &ev))
        return 0;
    for (int i = 0; i < n->n; i++) {
        const lk_config_node *k = n->kids[i];
        /* keys that would read back as something else are quoted */
        lk_config_node key = {.type = LK_CONFIG_SCALAR, .text = k->key, .quoted = false};
        if (!*k->key) key.quoted = true;
        if (!emit_node(em, &key) || !emit_node(em, k)) return 0;
    }
    yaml_mapping_end_event_initialize(&ev);
    return yaml_emitter_emit(em, &ev);
}

static lk_status emit(const lk_config_node *n, sink *s) {
    if (!n) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_config_emit_yaml: NULL node");
    yaml_emitter_t em;
    if (!yaml_emitter_initialize(&em)) return LK_STATUS_OUT_OF_MEMORY;
    yaml_emitter_set_output(&em, sink_write, s);
    yaml_emitter_set_unicode(&em, 1);
    yaml_emitter_set_width(&em, -1);
    yaml_emitter_set_indent(&em, 2);
    yaml_event_t ev;
    int ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) && yaml_emitter_emit(&em, &ev) &&
             yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) && yaml_emitter_emit(&em, &ev) &&
             emit_node(&em, n) && yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(&em, &ev) &&
             yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(&em, &ev) && yaml_emitter_flush(&em);
    lk_status st = LK_STATUS_OK;
    if (!ok) {
        if (s->failed) st = s->f ? lk_error(LK_STATUS_IO, "writing YAML: %s", strerror(errno)) : LK_STATUS_OUT_OF_MEMORY;
        else st = lk_error(LK_STATUS_INVALID_ARGUMENT, "cannot emit the config as YAML: %s",
                           em.problem ? em.problem : "emitter error");
    }
    yaml_emitter_delete(&em);
    return st;
}

lk_status lk_config_node_emit_yaml(const lk_config_node *node, FILE *f) {
    if (!f) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_config_emit_yaml: NULL file");
    sink s = {.f = f};
    return emit(node, &s);
}

lk_status lk_config_emit_yaml(const lk_config *cfg, FILE *f) { return lk_config_node_emit_yaml(lk_config_root(cfg), f); }

lk_status lk_config_node_to_yaml(const lk_config_node *node, char **out, size_t *len) {
    sink s = {0};
    lk_status st = emit(node, &s);
    if (st) {
        lk_free(s.buf);
        return st;
    }
    if (!s.buf && !(s.buf = lk_calloc(1, 1))) return LK_STATUS_OUT_OF_MEMORY;
    *out = s.buf;
    if (len) *len = s.len;
    return LK_STATUS_OK;
}

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
    return n && n->type == LK_CONFIG_MAP && map_find(n, "class_path", 10);
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
                node = map_find(node, "init_args", 9);
            }
            LK_TRY(key_push(out, size, &at, s, len));
            node = node && node->type == LK_CONFIG_MAP ? map_find(node, s, len) : NULL;
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
        if (node->type == LK_CONFIG_MAP) node = map_find(node, s, len);
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
    lk_config_node *cp = node_new(LK_CONFIG_SCALAR, file, n->line, n->col);
    if (!cp || !(cp->key = lk_strdup("class_path")) || node_append(n, cp)) {
        node_free(cp);
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
    if (!append && !through_seq) return set_path(cfg, path, value, NULL, false);
    const char *file = intern_file(cfg, "command line");
    if (!file) return LK_STATUS_OUT_OF_MEMORY;
    lk_config_node *leaf = NULL;
    lk_status st = parse_value(value, file, &leaf);
    if (st) return lk_error(st, "command line: --%s: %s", key, lk_last_error());
    if (append) { /* onto the sequence at `path`, made when absent or null */
        lk_config_node *seq = node_at(cfg->root, path, path + strlen(path));
        if (!seq || (seq->type == LK_CONFIG_SCALAR && (!seq->text || !strcmp(seq->text, "null")))) {
            if ((st = set_path(cfg, path, "[]", NULL, false))) {
                node_free(leaf);
                return st;
            }
            seq = node_at(cfg->root, path, path + strlen(path));
        }
        if (!seq || seq->type != LK_CONFIG_SEQ) {
            node_free(leaf);
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "command line: --%s: '%s' is not a list, so nothing can be appended to it",
                            key, path);
        }
        if ((st = as_class_map(leaf, file)) || (st = node_append(seq, leaf))) node_free(leaf);
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
        node_free(leaf);
        return lk_error(LK_STATUS_INTERNAL, "command line: --%s: no element at '%s'", key, path);
    }
    if (!*cut) { /* the element itself */
        if ((st = as_class_map(leaf, file))) {
            node_free(leaf);
            return st;
        }
        leaf->key = NULL;
        lk_config_node tmp = *elem;
        *elem = *leaf;
        *leaf = tmp;
        node_free(leaf);
        return LK_STATUS_OK;
    }
    if ((st = as_class_map(elem, file))) {
        node_free(leaf);
        return st;
    }
    if (elem->type != LK_CONFIG_MAP) {
        node_free(leaf);
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "command line: --%s: '%.*s' is %s, not a mapping", key,
                        (int)(cut - path), path, type_word(elem->type));
    }
    lk_config_node *src;
    LK_TRY(wrap_path(cut + 1, cut + strlen(cut), leaf, file, &src));
    if ((st = merge_reserve(elem, src))) {
        node_free(src);
        return st;
    }
    merge_move(elem, src);
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

/* libyaml's side of the config tree: parsing YAML into nodes that remember
 * file:line:col (anchors and aliases expanded within a node budget, depth
 * bounded) and emitting a tree as YAML that loads back to the same tree. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "core/config_impl.h"

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
        if (lk__cfg_node_append(parent, n)) {
            lk__cfg_node_free(n);
            return oom(b);
        }
        return LK_STATUS_OK;
    }
    if (!b->pending_key[d]) { /* n is a key */
        lk_status st = LK_STATUS_OK;
        if (n->type != LK_CONFIG_SCALAR)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: a mapping key must be a scalar, got %s", b->file,
                          n->line, n->col, lk__cfg_type_word(n->type));
        else if (lk__cfg_map_find(parent, n->text, strlen(n->text))) {
            const lk_config_node *first = lk__cfg_map_find(parent, n->text, strlen(n->text));
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s:%d:%d: duplicate key '%s' (first defined at line %d)", b->file,
                          n->line, n->col, n->text, first->key_line);
        }
        if (!st) {
            b->pending_key[d] = n->text;
            b->key_line[d] = n->line;
            b->key_col[d] = n->col;
            n->text = NULL;
        }
        lk__cfg_node_free(n);
        return st;
    }
    n->key = b->pending_key[d];
    n->key_line = b->key_line[d];
    n->key_col = b->key_col[d];
    b->pending_key[d] = NULL;
    if (lk__cfg_node_append(parent, n)) {
        lk__cfg_node_free(n);
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
    lk_config_node *target = owned ? lk__cfg_node_copy(n, &budget) : n;
    char *s = lk_strdup((const char *)name);
    if (!s || !target) {
        lk_free(s);
        if (owned) lk__cfg_node_free(target);
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
        lk_config_node *n = lk__cfg_node_new(LK_CONFIG_SCALAR, b->file, line, col);
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
            lk__cfg_node_free(n);
            return oom(b);
        }
        if (e->data.scalar.anchor && add_anchor(b, e->data.scalar.anchor, n)) {
            lk__cfg_node_free(n);
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
        lk_config_node *n = lk__cfg_node_new(map ? LK_CONFIG_MAP : LK_CONFIG_SEQ, b->file, line, col);
        if (!n) return oom(b);
        const unsigned char *anc = map ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor;
        if (anc && add_anchor(b, anc, n)) {
            lk__cfg_node_free(n);
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
                lk_config_node *n = lk__cfg_node_copy(b->anchors[i].node, &b->budget);
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
    lk__cfg_node_free(b->root);
    for (int i = 0; i < b->nanchors; i++) {
        lk_free(b->anchors[i].name);
        if (b->anchors[i].owned) lk__cfg_node_free(b->anchors[i].node);
    }
    lk_free(b->anchors);
}

/* Parses `len` bytes into a tree (*out; NULL for an empty document). The
 * whole tree uses `file` (interned) for locations. */
lk_status lk__cfg_parse_yaml(const char *yaml, size_t len, const char *file, lk_config_node **out) {
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

lk_status lk_config_emit_yaml(const lk_config *cfg, FILE *f) { return lk_config_node_emit_yaml(cfg ? cfg->root : NULL, f); }

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


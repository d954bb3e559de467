/* The YAML config tree: merge order, overrides, command-line parsing,
 * emit/load round trips, locations, and every error class a user can hit
 * (malformed YAML, unknown key, wrong type, out of range, missing file),
 * plus allocation-failure injection. */
#include <stddef.h>
#include <unistd.h>

#include "lk_test.h"

typedef struct {
    int64_t max_epochs;
    double lr;
    bool fast;
    char precision[LK_PARAM_STR];
    char name[LK_PARAM_STR];
    lk_int_list devices;
    lk_float_list betas;
} tcfg;

static const lk_param tparams[] = {
    {"max_epochs", LK_PARAM_INT, offsetof(tcfg, max_epochs), "10", 0, 1e9, NULL, "epochs"},
    {"lr", LK_PARAM_FLOAT, offsetof(tcfg, lr), "0.001", 0, 10, NULL, "learning rate"},
    {"fast", LK_PARAM_BOOL, offsetof(tcfg, fast), "false", 1, 0, NULL, "fast"},
    {"precision", LK_PARAM_ENUM, offsetof(tcfg, precision), "32-true", 1, 0, "32-true|16-mixed|bf16-mixed", "precision"},
    {"name", LK_PARAM_STRING, offsetof(tcfg, name), NULL, 1, 0, NULL, "a name"},
    {"devices", LK_PARAM_INTS, offsetof(tcfg, devices), "[0]", 0, 1024, NULL, "devices"},
    {"betas", LK_PARAM_FLOATS, offsetof(tcfg, betas), "[0.9, 0.999]", 0, 1, NULL, "betas"},
};
#define NT (int)(sizeof tparams / sizeof tparams[0])

static char tmpdir[256];

static void setup(void);

static const char *write_tmp(const char *name, const char *text) {
    static char paths[8][512];
    if (!tmpdir[0]) setup();
    static int k;
    char *p = paths[k++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    return p;
}

static const char *text_at(lk_config *c, const char *path) { return lk_config_node_text(lk_config_get(c, path)); }

static bool streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static void test_merge_order(void) {
    const char *a = write_tmp("a.yaml", "trainer:\n  max_epochs: 5\n  devices: [0, 1]\n  precision: 32-true\n"
                                        "model:\n  class_path: mlp\n  init_args:\n    hidden: [256, 128]\n    dropout: 0.1\n");
    const char *b = write_tmp("b.yaml", "trainer:\n  max_epochs: 7\nmodel:\n  init_args:\n    hidden: [64]\n"
                                        "data: {class_path: synthetic}\n");
    lk_config *c = lk_config_create();
    CHECK_OK(lk_config_load_file(c, a));
    CHECK_OK(lk_config_load_file(c, b));
    CHECK(streq(text_at(c, "trainer.max_epochs"), "7"));
    CHECK(streq(text_at(c, "trainer.precision"), "32-true"));
    CHECK(lk_config_node_count(lk_config_get(c, "trainer.devices")) == 2);
    CHECK(streq(text_at(c, "trainer.devices.1"), "1"));
    CHECK(text_at(c, "trainer.devices.2") == NULL);
    /* sequences replace, they do not concatenate */
    CHECK(lk_config_node_count(lk_config_get(c, "model.init_args.hidden")) == 1);
    CHECK(streq(text_at(c, "model.init_args.hidden.0"), "64"));
    CHECK(streq(text_at(c, "model.init_args.dropout"), "0.1"));
    CHECK(streq(text_at(c, "model.class_path"), "mlp"));
    /* key order: first seen, new keys appended */
    const lk_config_node *root = lk_config_root(c);
    CHECK(lk_config_node_count(root) == 3);
    CHECK(streq(lk_config_node_key(lk_config_node_child(root, 0)), "trainer"));
    CHECK(streq(lk_config_node_key(lk_config_node_child(root, 1)), "model"));
    CHECK(streq(lk_config_node_key(lk_config_node_child(root, 2)), "data"));
    /* each node remembers its own source */
    const lk_config_node *me = lk_config_get(c, "trainer.max_epochs");
    CHECK(streq(lk_config_node_file(me), b));
    CHECK(lk_config_node_line(me) == 2 && lk_config_node_column(me) == 15);
    const lk_config_node *pr = lk_config_get(c, "trainer.precision");
    CHECK(streq(lk_config_node_file(pr), a));
    CHECK(lk_config_node_line(pr) == 4 && lk_config_node_column(pr) == 14);
    char w[512];
    snprintf(w, sizeof w, "%s:4:14", a);
    CHECK(streq(lk_config_node_where(pr, w + 256, 256), w));
    /* a null replaces a map; a map replaces a scalar */
    const char *s2 = "model: null\ndata:\n  init_args: {seed: 3}\n";
    CHECK_OK(lk_config_load_string(c, s2, strlen(s2), "<s>"));
    CHECK(lk_config_node_is_null(lk_config_get(c, "model")));
    CHECK(streq(text_at(c, "data.init_args.seed"), "3"));
    CHECK(streq(text_at(c, "data.class_path"), "synthetic"));
    CHECK_OK(lk_config_load_string(c, "model: {a: 1}", 13, "<s>"));
    CHECK(streq(text_at(c, "model.a"), "1"));
    lk_config_free(c);
}

static void test_overrides(void) {
    const char *a = write_tmp("o.yaml", "trainer:\n  max_epochs: 5\nmodel: mlp\n");
    lk_config *c = lk_config_create();
    CHECK_OK(lk_config_load_file(c, a));
    CHECK_OK(lk_config_set_override(c, "trainer.max_epochs", "3"));
    CHECK(streq(text_at(c, "trainer.max_epochs"), "3"));
    CHECK(streq(lk_config_node_file(lk_config_get(c, "trainer.max_epochs")), "command line"));
    CHECK(lk_config_node_line(lk_config_get(c, "trainer.max_epochs")) == 0);
    CHECK_OK(lk_config_set_override(c, "trainer.callbacks.early.patience", "4")); /* creates maps */
    CHECK(streq(text_at(c, "trainer.callbacks.early.patience"), "4"));
    CHECK_OK(lk_config_set_override(c, "trainer.devices", "[1, 2]"));
    CHECK(lk_config_node_type(lk_config_get(c, "trainer.devices")) == LK_CONFIG_SEQ);
    CHECK(streq(text_at(c, "trainer.devices.1"), "2"));
    CHECK_OK(lk_config_set_override(c, "trainer.opt", "{name: adam, lr: 0.1}"));
    /* a file-name template needs no extra quoting on the command line */
    CHECK_OK(lk_config_set_override(c, "trainer.fn", "{epoch}-{val_loss:.4f}"));
    CHECK(streq(text_at(c, "trainer.fn"), "{epoch}-{val_loss:.4f}"));
    CHECK_OK(lk_config_set_override(c, "trainer.fn2", "{epoch}"));
    CHECK(streq(text_at(c, "trainer.fn2"), "{epoch}"));
    CHECK(streq(text_at(c, "trainer.opt.lr"), "0.1"));
    CHECK_OK(lk_config_set_override(c, "model.init_args.x", "1")); /* a scalar on the path becomes a map */
    CHECK(streq(text_at(c, "model.init_args.x"), "1"));
    CHECK_OK(lk_config_set_override(c, "s1", "'3'"));
    CHECK(streq(text_at(c, "s1"), "3") && lk_config_node_quoted(lk_config_get(c, "s1")));
    CHECK_OK(lk_config_set_override(c, "s2", "a: b")); /* not a flow collection: a string */
    CHECK(streq(text_at(c, "s2"), "a: b") && lk_config_node_quoted(lk_config_get(c, "s2")));
    CHECK_OK(lk_config_set_override(c, "s3", ""));
    CHECK(lk_config_node_is_null(lk_config_get(c, "s3")));
    CHECK_OK(lk_config_set_override(c, "s4", "- x"));
    CHECK(streq(text_at(c, "s4"), "- x"));
    CHECK_OK(lk_config_set_override(c, "s5", "path/to/file #1"));
    CHECK(streq(text_at(c, "s5"), "path/to/file #1"));
    CHECK_ERR(lk_config_set_override(c, "trainer.devices", "[1, 2"), LK_STATUS_INVALID_ARGUMENT, "--trainer.devices");
    CHECK(streq(text_at(c, "trainer.devices.0"), "1")); /* unchanged */
    CHECK_ERR(lk_config_set_override(c, "a..b", "1"), LK_STATUS_INVALID_ARGUMENT, "empty part");
    CHECK_ERR(lk_config_set_override(c, "x", "a\x80" "b"), LK_STATUS_INVALID_ARGUMENT, "cannot be held in YAML");
    /* set_default only fills holes */
    CHECK_OK(lk_config_set_default(c, "trainer.max_epochs", "99", "default"));
    CHECK(streq(text_at(c, "trainer.max_epochs"), "3"));
    CHECK_OK(lk_config_set_default(c, "trainer.seed", "7", "default"));
    CHECK(streq(text_at(c, "trainer.seed"), "7"));
    CHECK(streq(lk_config_node_file(lk_config_get(c, "trainer.seed")), "default"));
    lk_config_free(c);
}

static void test_args(void) {
    const char *a = write_tmp("args_a.yaml", "trainer:\n  max_epochs: 5\n  lr: 0.5\n");
    const char *b = write_tmp("args_b.yaml", "trainer:\n  max_epochs: 6\n  lr: 0.25\n");
    char fa[600], fb[600];
    snprintf(fa, sizeof fa, "--config=%s", b);
    snprintf(fb, sizeof fb, "-c%s", b);
    char *argv[] = {"-c", (char *)a, "--trainer.max_epochs", "3", "--print_config", fa, "--trainer.lr=0.125",
                    "fit", "--ckpt_path", "last", "--help", "--", "--trainer.x", "1"};
    int argc = (int)(sizeof argv / sizeof argv[0]);
    const char *flags[] = {"--print_config", "--help", "-h"};
    lk_config_args args;
    CHECK_OK(lk_config_args_parse(argc, argv, flags, 3, &args));
    CHECK(args.n == 5);
    if (args.n == 5) {
        CHECK(args.items[0].kind == LK_CONFIG_ARG_FILE && streq(args.items[0].value, a));
        CHECK(args.items[1].kind == LK_CONFIG_ARG_OVERRIDE && streq(args.items[1].key, "trainer.max_epochs") &&
              streq(args.items[1].value, "3"));
        CHECK(args.items[2].kind == LK_CONFIG_ARG_FILE && streq(args.items[2].value, b));
        CHECK(streq(args.items[3].key, "trainer.lr") && streq(args.items[3].value, "0.125"));
        CHECK(streq(args.items[4].key, "ckpt_path") && streq(args.items[4].value, "last"));
    }
    CHECK(args.nrest == 6);
    if (args.nrest == 6) {
        CHECK(streq(args.rest[0], "--print_config") && streq(args.rest[1], "fit") && streq(args.rest[2], "--help"));
        CHECK(streq(args.rest[3], "--") && streq(args.rest[4], "--trainer.x"));
    }
    /* files in order, then overrides in order: the max_epochs override beats
     * b.yaml although b.yaml comes after it (the help says overrides win) */
    lk_config *c = lk_config_create();
    CHECK_OK(lk_config_load_args(c, &args));
    CHECK(streq(text_at(c, "trainer.max_epochs"), "3"));
    CHECK(streq(text_at(c, "trainer.lr"), "0.125"));
    CHECK(streq(text_at(c, "ckpt_path"), "last"));
    lk_config_free(c);
    lk_config_args_free(&args);

    char *argv2[] = {fb, "--trainer.max_epochs=2", "--print_config=skip_null"};
    CHECK_OK(lk_config_args_parse(3, argv2, flags, 3, &args));
    CHECK(args.n == 2 && args.nrest == 1 && streq(args.items[0].value, b) && streq(args.rest[0], "--print_config=skip_null"));
    lk_config_args_free(&args);

    char *bad1[] = {"--trainer.max_epochs"};
    CHECK_ERR(lk_config_args_parse(1, bad1, flags, 3, &args), LK_STATUS_INVALID_USAGE, "expects a value");
    char *bad2[] = {"-c"};
    CHECK_ERR(lk_config_args_parse(1, bad2, flags, 3, &args), LK_STATUS_INVALID_USAGE, "config file path");
    char *bad3[] = {"-x"};
    CHECK_ERR(lk_config_args_parse(1, bad3, flags, 3, &args), LK_STATUS_INVALID_USAGE, "unknown option '-x'");
    /* a missing file named on the command line */
    char *miss[] = {"-c", "/nonexistent/dir/cfg.yaml"};
    CHECK_OK(lk_config_args_parse(2, miss, flags, 3, &args));
    c = lk_config_create();
    CHECK_ERR(lk_config_load_args(c, &args), LK_STATUS_IO, "/nonexistent/dir/cfg.yaml");
    lk_config_free(c);
    lk_config_args_free(&args);
}

/* Structural equality: types, keys, order, texts and quotedness. */
static bool same_tree(const lk_config_node *a, const lk_config_node *b, const char *at) {
    if (lk_config_node_type(a) != lk_config_node_type(b)) {
        fprintf(stderr, "  %s: type differs\n", at);
        return false;
    }
    if (lk_config_node_type(a) == LK_CONFIG_SCALAR) {
        if (strcmp(lk_config_node_text(a), lk_config_node_text(b)) ||
            lk_config_node_quoted(a) != lk_config_node_quoted(b)) {
            fprintf(stderr, "  %s: '%s'(%d) vs '%s'(%d)\n", at, lk_config_node_text(a), lk_config_node_quoted(a),
                    lk_config_node_text(b), lk_config_node_quoted(b));
            return false;
        }
        return true;
    }
    if (lk_config_node_count(a) != lk_config_node_count(b)) {
        fprintf(stderr, "  %s: %d vs %d children\n", at, lk_config_node_count(a), lk_config_node_count(b));
        return false;
    }
    for (int i = 0; i < lk_config_node_count(a); i++) {
        const lk_config_node *x = lk_config_node_child(a, i), *y = lk_config_node_child(b, i);
        const char *kx = lk_config_node_key(x), *ky = lk_config_node_key(y);
        if ((kx || ky) && !(kx && ky && !strcmp(kx, ky))) {
            fprintf(stderr, "  %s: key '%s' vs '%s'\n", at, kx ? kx : "(none)", ky ? ky : "(none)");
            return false;
        }
        char sub[512];
        snprintf(sub, sizeof sub, "%s.%s", at, kx ? kx : "[]");
        if (!same_tree(x, y, sub)) return false;
    }
    return true;
}

static const char *round_trip_src =
    "seed_everything: 42\n"
    "trainer:\n"
    "  max_epochs: 3\n"
    "  devices: [0, 1]\n"
    "  precision: \"32-true\"\n"
    "  empty_map: {}\n"
    "  empty_seq: []\n"
    "  nothing:\n"
    "  tilde: ~\n"
    "  quoted_null: 'null'\n"
    "  quoted_num: \"3\"\n"
    "  colon: 'a: b'\n"
    "  hash: 'x #y'\n"
    "  spaces: '  lead and trail  '\n"
    "  multi: \"line1\\nline2\"\n"
    "  block: |\n"
    "    literal\n"
    "    text\n"
    "  unicode: héllo wörld\n"
    "  neg: [-1, -.5, 1e-3, .inf, -inf, x-y]\n"
    "  'key with: colon': 1\n"
    "  '': empty key\n"
    "  callbacks:\n"
    "    - class_path: ModelCheckpoint\n"
    "      init_args: {monitor: val_loss, mode: min}\n"
    "    - [1, [2, 3]]\n"
    "    - plain, with comma\n"
    "model:\n"
    "  init_args:\n"
    "    hidden: [256, 128]\n"
    "    act: &act relu\n"
    "    act2: *act\n";

static void test_round_trip(void) {
    lk_config *c = lk_config_create();
    CHECK_OK(lk_config_load_string(c, round_trip_src, strlen(round_trip_src), "rt.yaml"));
    CHECK_OK(lk_config_set_override(c, "trainer.cli", "a: b"));
    CHECK_OK(lk_config_set_override(c, "trainer.cli2", "[x, 'y z', {k: v}]"));
    CHECK(streq(text_at(c, "trainer.nothing"), "null") && lk_config_node_is_null(lk_config_get(c, "trainer.nothing")));
    CHECK(lk_config_node_is_null(lk_config_get(c, "trainer.tilde")));
    CHECK(!lk_config_node_is_null(lk_config_get(c, "trainer.quoted_null")));
    CHECK(streq(text_at(c, "trainer.block"), "literal\ntext\n"));
    CHECK(streq(text_at(c, "model.init_args.act2"), "relu"));
    CHECK(streq(text_at(c, "trainer.callbacks.0.init_args.monitor"), "val_loss"));
    char *y1 = NULL, *y2 = NULL;
    size_t l1 = 0, l2 = 0;
    CHECK_OK(lk_config_node_to_yaml(lk_config_root(c), &y1, &l1));
    lk_config *d = lk_config_create();
    CHECK_OK(lk_config_load_string(d, y1, l1, "emitted"));
    CHECK_MSG(same_tree(lk_config_root(c), lk_config_root(d), "root"), "emitted YAML:\n%s", y1);
    CHECK_OK(lk_config_node_to_yaml(lk_config_root(d), &y2, &l2));
    CHECK(l1 == l2 && !strcmp(y1, y2)); /* emitting is a fixed point */
    CHECK(strstr(y1, "devices: [0, 1]") != NULL); /* short number lists read as flow */
    /* and through a FILE, as --print_config does */
    const char *p = write_tmp("rt_out.yaml", "");
    FILE *f = fopen(p, "w");
    CHECK_OK(lk_config_emit_yaml(c, f));
    fclose(f);
    lk_config *e = lk_config_create();
    CHECK_OK(lk_config_load_file(e, p));
    CHECK(same_tree(lk_config_root(c), lk_config_root(e), "root"));
    /* a sub-tree on its own */
    char *y3 = NULL;
    CHECK_OK(lk_config_node_to_yaml(lk_config_get(c, "model.init_args"), &y3, NULL));
    CHECK(y3 && !strncmp(y3, "hidden: [256, 128]\n", 19));
    lk_free(y1);
    lk_free(y2);
    lk_free(y3);
    lk_config_free(c);
    lk_config_free(d);
    lk_config_free(e);
    /* an empty config emits a document that loads back empty */
    c = lk_config_create();
    CHECK_OK(lk_config_node_to_yaml(lk_config_root(c), &y1, &l1));
    d = lk_config_create();
    CHECK_OK(lk_config_load_string(d, y1, l1, "empty"));
    CHECK(lk_config_node_count(lk_config_root(d)) == 0);
    lk_free(y1);
    lk_config_free(c);
    lk_config_free(d);
}

static void test_yaml_errors(void) {
    lk_config *c = lk_config_create();
    CHECK_OK(lk_config_load_string(c, "trainer: {max_epochs: 5}", 24, "good.yaml"));
    const char *bad = write_tmp("bad.yaml", "trainer:\n  max_epochs: 5\n  devices: [0, 1\n  lr: 3\n");
    char want[600];
    CHECK_ERR(lk_config_load_file(c, bad), LK_STATUS_INVALID_ARGUMENT, "invalid YAML");
    snprintf(want, sizeof want, "%s:4:5:", bad);
    CHECK_MSG(strstr(lk_last_error(), want), "%s", lk_last_error());
    CHECK(streq(text_at(c, "trainer.max_epochs"), "5")); /* unchanged */
    CHECK(lk_config_node_count(lk_config_get(c, "trainer")) == 1);
    const char *tabs = write_tmp("tabs.yaml", "trainer:\n\tmax_epochs: 5\n");
    CHECK_ERR(lk_config_load_file(c, tabs), LK_STATUS_INVALID_ARGUMENT, "tabs.yaml:2:1: invalid YAML");
    CHECK_ERR(lk_config_load_string(c, "a: 1\na: 2\n", 10, "dup.yaml"), LK_STATUS_INVALID_ARGUMENT,
              "dup.yaml:2:1: duplicate key 'a' (first defined at line 1)");
    CHECK_ERR(lk_config_load_string(c, "- 1\n- 2\n", 8, "list.yaml"), LK_STATUS_INVALID_ARGUMENT,
              "list.yaml:1:1: the top level of a config must be a mapping");
    CHECK_ERR(lk_config_load_string(c, "just text", 9, "s.yaml"), LK_STATUS_INVALID_ARGUMENT, "got a scalar 'just text'");
    CHECK_ERR(lk_config_load_string(c, "a: 1\n---\nb: 2\n", 14, "docs.yaml"), LK_STATUS_INVALID_ARGUMENT,
              "more than one YAML document");
    CHECK_ERR(lk_config_load_string(c, "? [a]\n: 1\n", 10, "ck.yaml"), LK_STATUS_INVALID_ARGUMENT,
              "a mapping key must be a scalar");
    CHECK_ERR(lk_config_load_string(c, "a: *nope\n", 9, "al.yaml"), LK_STATUS_INVALID_ARGUMENT, "unknown alias");
    CHECK_ERR(lk_config_load_string(c, "a: \"x\\0y\"\n", 10, "nul.yaml"), LK_STATUS_INVALID_ARGUMENT, "NUL");
    CHECK_ERR(lk_config_load_file(c, "/nonexistent/x.yaml"), LK_STATUS_IO, "cannot open config file '/nonexistent/x.yaml'");
    CHECK_ERR(lk_config_load_string(c, "a: 1\nbb: \x80\n", 10, "utf.yaml"), LK_STATUS_INVALID_ARGUMENT,
              "utf.yaml:2:5: invalid YAML: invalid leading UTF-8 octet (byte 9)");
    /* billion laughs: each level doubles */
    char lol[2048];
    size_t k = (size_t)snprintf(lol, sizeof lol, "a0: &a0 [x, x]\n");
    for (int i = 1; i < 30; i++) k += (size_t)snprintf(lol + k, sizeof lol - k, "a%d: &a%d [*a%d, *a%d]\n", i, i, i - 1, i - 1);
    CHECK_ERR(lk_config_load_string(c, lol, k, "lol.yaml"), LK_STATUS_INVALID_ARGUMENT, "expands to more than");
    /* deep nesting */
    char deep[1024];
    k = 0;
    for (int i = 0; i < 100; i++) deep[k++] = '[';
    for (int i = 0; i < 100; i++) deep[k++] = ']';
    CHECK_ERR(lk_config_load_string(c, deep, k, "deep.yaml"), LK_STATUS_INVALID_ARGUMENT, "nesting deeper than");
    k = (size_t)snprintf(deep, sizeof deep, "a: &x ");
    for (int i = 0; i < 60; i++) deep[k++] = '[';
    for (int i = 0; i < 60; i++) deep[k++] = ']';
    k += (size_t)snprintf(deep + k, sizeof deep - k, "\nb: [[[[[[[[[[*x]]]]]]]]]]\n");
    CHECK_ERR(lk_config_load_string(c, deep, k, "deep2.yaml"), LK_STATUS_INVALID_ARGUMENT, "nests deeper than");
    CHECK(streq(text_at(c, "trainer.max_epochs"), "5"));
    CHECK(lk_config_node_count(lk_config_root(c)) == 1);
    /* empty and comment-only sources change nothing */
    CHECK_OK(lk_config_load_string(c, "", 0, "empty.yaml"));
    CHECK_OK(lk_config_load_string(c, "# just a comment\n", 17, "comment.yaml"));
    CHECK_OK(lk_config_load_string(c, "---\n", 4, "dashes.yaml"));
    CHECK(lk_config_node_count(lk_config_root(c)) == 1);
    lk_config_free(c);
}

static void test_apply_params(void) {
    tcfg t;
    CHECK_OK(lk_params_defaults(tparams, NT, &t));
    lk_config *c = lk_config_create();
    const char *src = "trainer:\n"
                      "  max_epochs: 7\n"
                      "  lr: 1e-2\n"
                      "  fast: true\n"
                      "  precision: bf16-mixed\n"
                      "  name: \"run 1\"\n"
                      "  devices: [2, 3]\n"
                      "  betas:\n    - 0.5\n    - 0.75\n";
    CHECK_OK(lk_config_load_string(c, src, strlen(src), "ok.yaml"));
    CHECK_OK(lk_config_apply_params(lk_config_get(c, "trainer"), tparams, NT, &t, "trainer"));
    CHECK(t.max_epochs == 7 && t.lr == 0.01 && t.fast && !strcmp(t.precision, "bf16-mixed") && !strcmp(t.name, "run 1"));
    CHECK(t.devices.n == 2 && t.devices.v[0] == 2 && t.devices.v[1] == 3);
    CHECK(t.betas.n == 2 && t.betas.v[1] == 0.75);
    /* a scalar for a list parameter */
    CHECK_OK(lk_config_set_override(c, "trainer.devices", "4"));
    CHECK_OK(lk_config_apply_params(lk_config_get(c, "trainer"), tparams, NT, &t, "trainer"));
    CHECK(t.devices.n == 1 && t.devices.v[0] == 4);
    /* absent and null sections apply nothing */
    CHECK_OK(lk_config_apply_params(lk_config_get(c, "nothing"), tparams, NT, &t, "nothing"));
    lk_config_free(c);

    struct {
        const char *yaml, *want;
    } cases[] = {
        {"trainer:\n  max_epoch: 3\n", "e.yaml:2:3: unknown key 'trainer.max_epoch' (did you mean 'max_epochs'?)"},
        {"trainer:\n  zzzzzzzzzzzzzz: 3\n", "e.yaml:2:3: unknown key 'trainer.zzzzzzzzzzzzzz'"},
        {"trainer:\n  max_epochs: abc\n", "e.yaml:2:15: trainer.max_epochs: expected an integer, got 'abc'"},
        {"trainer:\n  max_epochs: -1\n", "e.yaml:2:15: trainer.max_epochs: expected a value in [0, 1e+09], got '-1'"},
        {"trainer:\n  lr: 11\n", "e.yaml:2:7: trainer.lr: expected a value in [0, 10], got '11'"},
        {"trainer:\n  max_epochs: {a: 1}\n", "e.yaml:2:15: trainer.max_epochs: expected an int, got a mapping"},
        {"trainer:\n  max_epochs:\n    - 1\n", "e.yaml:3:5: trainer.max_epochs: expected an int, got a sequence"},
        {"trainer:\n  fast: maybe\n", "e.yaml:2:9: trainer.fast: expected true or false, got 'maybe'"},
        {"trainer:\n  precision: 64\n", "trainer.precision: expected one of 32-true|16-mixed|bf16-mixed, got '64'"},
        {"trainer:\n  devices: [1, [2]]\n", "e.yaml:2:16: trainer.devices[1]: expected an int, got a sequence"},
        {"trainer:\n  devices: [1, x]\n", "e.yaml:2:12: trainer.devices: expected an integer, got 'x'"},
        {"trainer:\n  devices: [1, \"2, 3\"]\n", "e.yaml:2:16: trainer.devices[1]: expected an int, got '2, 3'"},
        {"trainer:\n  betas: [0.5, 2]\n", "trainer.betas: expected a value in [0, 1], got '2'"},
        {"trainer: [1, 2]\n", "e.yaml:1:10: trainer: expected a mapping of keys, got a sequence"},
        {"trainer: fast\n", "e.yaml:1:10: trainer: expected a mapping of keys, got a scalar 'fast'"},
        {"trainer:\n  max_epochs: null\n", "trainer.max_epochs: expected an integer, got 'null'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        c = lk_config_create();
        CHECK_OK(lk_config_load_string(c, cases[i].yaml, strlen(cases[i].yaml), "e.yaml"));
        CHECK_ERR(lk_config_apply_params(lk_config_get(c, "trainer"), tparams, NT, &t, "trainer"),
                  LK_STATUS_INVALID_ARGUMENT, cases[i].want);
        lk_config_free(c);
    }
    /* an override's errors name the command line */
    c = lk_config_create();
    CHECK_OK(lk_config_set_override(c, "trainer.max_epochs", "many"));
    CHECK_ERR(lk_config_apply_params(lk_config_get(c, "trainer"), tparams, NT, &t, "trainer"), LK_STATUS_INVALID_ARGUMENT,
              "command line: trainer.max_epochs: expected an integer, got 'many'");
    lk_config_free(c);
    /* the rank prefix appears once */
    lk_log_set_rank(1, 2);
    c = lk_config_create();
    CHECK_OK(lk_config_load_string(c, "trainer: {max_epoch: 1}", 23, "r.yaml"));
    lk_clear_error();
    CHECK(lk_config_apply_params(lk_config_get(c, "trainer"), tparams, NT, &t, "trainer") != LK_STATUS_OK);
    CHECK_MSG(!strncmp(lk_last_error(), "[rank 1] r.yaml:1:11: unknown key", 33), "%s", lk_last_error());
    lk_log_set_rank(-1, 0);
    lk_config_free(c);
}

/* SQLite-style: fail the Nth allocation until the load succeeds; every
 * failure must be clean (ASan checks leaks) and leave the tree unchanged. */
static void test_alloc_failures(void) {
    lk_config *c = lk_config_create();
    CHECK_OK(lk_config_load_string(c, "trainer: {max_epochs: 5, devices: [0]}\n", 39, "base"));
    char *before = NULL, *after = NULL;
    CHECK_OK(lk_config_node_to_yaml(lk_config_root(c), &before, NULL));
    int n;
    for (n = 1; n < 10000; n++) {
        lk_alloc_fail_after(n);
        lk_status st = lk_config_load_string(c, round_trip_src, strlen(round_trip_src), "rt.yaml");
        lk_alloc_fail_after(0);
        if (!st) break;
        CHECK(st == LK_STATUS_OUT_OF_MEMORY);
        CHECK_OK(lk_config_node_to_yaml(lk_config_root(c), &after, NULL));
        CHECK_MSG(!strcmp(before, after), "allocation %d changed the tree", n);
        lk_free(after);
    }
    CHECK(n > 10 && n < 10000);
    CHECK(streq(text_at(c, "trainer.max_epochs"), "3"));
    for (n = 1; n < 1000; n++) {
        lk_alloc_fail_after(n);
        lk_status st = lk_config_set_override(c, "a.b.c", "[1, 2, 3]");
        lk_alloc_fail_after(0);
        if (!st) break;
        CHECK(st == LK_STATUS_OUT_OF_MEMORY);
        CHECK(lk_config_get(c, "a") == NULL);
    }
    CHECK(streq(text_at(c, "a.b.c.2"), "3"));
    lk_free(before);
    lk_config_free(c);
    lk_config_free(NULL);
}

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s/lk_config_test_%d", LK_BUILD_DIR, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "cannot create %s\n", tmpdir);
}

static void teardown(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", tmpdir);
}

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(test_merge_order), LK_TEST_CASE(test_overrides), LK_TEST_CASE(test_args),
             LK_TEST_CASE(test_round_trip), LK_TEST_CASE(test_yaml_errors), LK_TEST_CASE(test_apply_params),
             LK_TEST_CASE(test_alloc_failures), LK_TEST_CASE(teardown))

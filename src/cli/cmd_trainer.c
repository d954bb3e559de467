/* `lockstep fit|validate|test|predict`: LightningCLI over the library.
 * Config files (-c, repeatable, merged in order) and dotted overrides make
 * one config tree; every section is validated against its parameter table
 * before anything starts; with devices > 1 the program relaunches itself as
 * that many ranks (Lightning's subprocess launcher) and waits for them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/cli.h"
#include "device/gpu.h"
#include "train/accelerator.h"
#include "lockstep.h"
#include "lockstep/config.h"
#include "lockstep/trainer.h"

typedef struct {
    lk_trainer_config trainer;
    lk_optim_settings optim;
    const char *model;
    const char *data;
    lk_model_kv model_args[64], data_args[64];
    int n_model_args, n_data_args;
    const char *ckpt_path;
    int64_t seed;
    char *owned[128]; /* YAML text of list-valued init_args */
    int n_owned;
    bool quiet; /* --print_config: stdout carries the YAML alone */
} run_spec;

static void run_spec_free(run_spec *rs) {
    for (int i = 0; i < rs->n_owned; i++) lk_free(rs->owned[i]);
    rs->n_owned = 0;
}

static const char *const top_keys[] = {"seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler", "ckpt_path"};
#define N_TOP (int)(sizeof top_keys / sizeof top_keys[0])

static void print_help(const char *cmd) {
    printf("usage: lockstep %s [-c CONFIG.yaml]... [--SECTION.KEY VALUE]... [--print_config[=skip_null]] [--help]\n\n", cmd);
    printf("Config files are merged in order (later files win); --section.key overrides beat files.\n"
           "Beside a class_path, --section.key is short for --section.init_args.key (--optimizer.lr 0.5);\n"
           "--trainer.callbacks+=NAME appends a callback, --trainer.callbacks.KEY sets the last one's argument,\n"
           "--trainer.callbacks.N.KEY the N-th one's (as LightningCLI).\n"
           "Top-level sections: seed_everything, trainer, model, data, optimizer, lr_scheduler, ckpt_path.\n\n");
    int n;
    printf("trainer:\n");
    const lk_param *tp = lk_trainer_params(&n);
    lk_params_print_help(tp, n, stdout, "trainer");
    for (int pass = 0; pass < 2; pass++) {
        const lk_callback_info *ci = pass ? lk_logger_infos(&n) : lk_callback_infos(&n);
        printf(pass ? "\ntrainer.logger: false | true | a class_path entry or a list of them:\n"
                    : "\ntrainer.callbacks: a list of {class_path, init_args} (class_path may carry a module path):\n");
        for (int i = 0; i < n; i++) {
            printf("  %-22s %s\n", ci[i].name, ci[i].help);
            lk_params_print_help(ci[i].params, ci[i].n_params, stdout, "init_args");
        }
    }
    printf("\ntrainer.strategy: a name above, or {class_path: CLASS, init_args: {...}} (init_args set the keys above):\n");
    const char *const *classes = lk_strategy_class_names(&n);
    for (int i = 0; i < n; i++) {
        printf("  %-22s -> %-9s init_args:", classes[i], lk_strategy_info_get(classes[i])->name);
        const char *const *keys = lk_strategy_init_args(classes[i]);
        if (!keys[0]) printf(" none");
        for (int k = 0; keys[k]; k++) printf("%s %s", k ? "," : "", keys[k]);
        printf("\n");
    }
    printf("\noptimizer / lr_scheduler (one table; lr_scheduler.class_path sets optimizer.scheduler):\n");
    const lk_param *op = lk_optim_settings_params(&n);
    lk_params_print_help(op, n, stdout, "optimizer");
    printf("\nmodel.class_path (and its model.init_args):\n");
    const lk_model_info *mi = lk_models(&n);
    for (int i = 0; i < n; i++) {
        printf("  %-14s %s\n", mi[i].name, mi[i].help);
        for (int k = 0; k < mi[i].n_args; k++)
            printf("      --model.init_args.%-22s (default: %s) %s\n", mi[i].args[k].name,
                   mi[i].args[k].default_value ? mi[i].args[k].default_value : "null", mi[i].args[k].help);
    }
    printf("\ndata.class_path (and its data.init_args):\n");
    const lk_datamodule_info *di = lk_datamodules(&n);
    for (int i = 0; i < n; i++) {
        printf("  %-14s %s\n", di[i].name, di[i].help);
        lk_params_print_help(di[i].params, di[i].n_params, stdout, "data.init_args");
    }
    printf("\nckpt_path: last | best | PATH   checkpoint to resume from (fit) or evaluate\n");
}

static lk_status where_error(const lk_config_node *node, const char *what) {
    char w[512];
    lk_config_node_where(node, w, sizeof w);
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %s", w, what);
}

/* class_path + init_args of a section into (name, kv list). */
static lk_status read_class(run_spec *rs, const lk_config_node *sec, const char *section, const char **name,
                            lk_model_kv *kv, int *n) {
    *n = 0;
    if (!sec || lk_config_node_is_null(sec)) return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s.class_path is required", section);
    if (lk_config_node_type(sec) != LK_CONFIG_MAP) return where_error(sec, "expected a mapping with class_path and init_args");
    for (int i = 0; i < lk_config_node_count(sec); i++) {
        const lk_config_node *c = lk_config_node_child(sec, i);
        const char *key = lk_config_node_key(c);
        if (strcmp(key, "class_path") && strcmp(key, "init_args")) {
            char msg[256];
            const char *cands[] = {"class_path", "init_args"};
            const char *s = lk_suggest(key, cands, 2);
            snprintf(msg, sizeof msg, "unknown key '%s.%s'%s%s%s (expected class_path and init_args)", section, key,
                     s ? " (did you mean '" : "", s ? s : "", s ? "'?)" : "");
            return where_error(c, msg);
        }
    }
    const lk_config_node *cp = lk_config_node_get(sec, "class_path");
    if (!cp || lk_config_node_type(cp) != LK_CONFIG_SCALAR || lk_config_node_is_null(cp))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s.class_path is required (a name such as %s)", section,
                        !strcmp(section, "model") ? "autoencoder, mlp or cnn" : "fashion_mnist or synthetic");
    *name = lk_config_node_text(cp);
    const char *dot = strrchr(*name, '.'); /* "lockstep.models.mlp" -> "mlp" */
    if (dot) *name = dot + 1;
    const lk_config_node *ia = lk_config_node_get(sec, "init_args");
    if (!ia || lk_config_node_is_null(ia)) return LK_STATUS_OK;
    if (lk_config_node_type(ia) != LK_CONFIG_MAP) return where_error(ia, "init_args must be a mapping");
    for (int i = 0; i < lk_config_node_count(ia) && *n < 64; i++) {
        const lk_config_node *c = lk_config_node_child(ia, i);
        kv[*n].key = lk_config_node_key(c);
        if (lk_config_node_type(c) == LK_CONFIG_SCALAR) kv[*n].value = lk_config_node_text(c);
        else { /* a flow list such as [784, 512]: pass it as YAML text */
            char *y = NULL;
            size_t len;
            LK_TRY(lk_config_node_to_yaml(c, &y, &len));
            for (size_t k = 0; k < len; k++)
                if (y[k] == '\n') y[k] = ' ';
            kv[*n].value = y;
            if (rs->n_owned < 128) rs->owned[rs->n_owned++] = y;
            else lk_free(y), kv[*n].value = "";
        }
        (*n)++;
    }
    return LK_STATUS_OK;
}

/* Builds the module (model) or the data module. Their init_args were read
 * as text, so a bad value fails inside the builder, whose message knows the
 * key but not where it was written: the keys are then tried one at a time,
 * and the first that fails on its own gets its node's FILE:LINE:COL in
 * front (as trainer keys have). When no single key fails alone (a
 * combination does), the builder's own message stands. */
static lk_status build_class(const lk_config *cfg, const char *section, const char *name, const lk_model_kv *kv,
                             int n, uint64_t seed, lk_module **module, lk_datamodule **dm) {
    bool is_model = !strcmp(section, "model");
    /* The model deferred (nothing allocated or drawn): the run materialises
     * it, whole or (model_parallel, pipeline) each rank its stage. */
    lk_status st = is_model ? lk_module_create_builtin_deferred(name, kv, n, seed, module)
                            : lk_datamodule_create_builtin(name, kv, n, seed, dm);
    if (!st || st == LK_STATUS_OUT_OF_MEMORY) return st;
    char first[2048];
    snprintf(first, sizeof first, "%s", lk_last_error());
    for (int i = 0; i < n; i++) {
        lk_module *m1 = NULL;
        lk_datamodule *d1 = NULL;
        lk_status s1 = is_model ? lk_module_create_builtin_deferred(name, &kv[i], 1, seed, &m1)
                                : lk_datamodule_create_builtin(name, &kv[i], 1, seed, &d1);
        lk_module_free(m1);
        lk_datamodule_free(d1);
        if (!s1) continue;
        if (s1 == LK_STATUS_OUT_OF_MEMORY) break;
        char path[256], w[512];
        snprintf(path, sizeof path, "%s.init_args.%s", section, kv[i].key);
        const lk_config_node *node = lk_config_get(cfg, path);
        if (!node) break; /* the key came from elsewhere: nothing to point at */
        lk_config_node_where(node, w, sizeof w);
        return lk_error(s1, "%s: %s", w, lk_last_error());
    }
    return lk_error(st, "%s", first);
}

static bool is_rank0_or_alone(void) {
    const char *r = getenv("RANK");
    return !r || !strcmp(r, "0");
}

/* One seed runs, and config.yaml says which: seed_everything (Lightning's
 * name; true picks one at random) and trainer.seed (its alias) must agree
 * unless exactly one of them was typed on the command line, which then wins
 * with a warning. With neither, PL_GLOBAL_SEED is used when set, as
 * Lightning's seed_everything() does. Both keys are rewritten to the seed
 * that runs. */
static lk_status resolve_seed(lk_config *cfg, run_spec *rs) {
    static const lk_param sp[] = {{"seed_everything", LK_PARAM_INT, 0, "0", 0, 4294967295.0, NULL, "seed"}};
    const lk_config_node *se = lk_config_get(cfg, "seed_everything"), *ts = lk_config_get(cfg, "trainer.seed");
    const char *se_text = lk_config_node_text(se);
    bool has_ts = ts && !lk_config_node_is_null(ts);
    bool has_se = se && !lk_config_node_is_null(se) && !(se_text && (!strcmp(se_text, "false") || !strcmp(se_text, "False")));
    int64_t seed = rs->trainer.seed; /* trainer.seed, or its default */
    char w[256], w2[256];
    if (has_se) {
        int64_t v;
        if (se_text && (!strcmp(se_text, "true") || !strcmp(se_text, "True"))) {
            /* Lightning draws a seed and records it; so does config.yaml here */
            /* Ranks started by this command inherit PL_GLOBAL_SEED (set below), so all draw the same. */
            const char *env = getenv("PL_GLOBAL_SEED");
            if (env && *env) LK_TRY(lk_params_set(sp, 1, &v, "PL_GLOBAL_SEED", "seed_everything", env));
            else v = (int64_t)((lk_time_ns() ^ ((uint64_t)getpid() << 16)) % 4294967296ull);
            if (is_rank0_or_alone() && !rs->quiet) lk_log_info("seed_everything: true -> seed %lld", (long long)v);
        } else {
            lk_config_node_where(se, w, sizeof w);
            LK_TRY(lk_params_set(sp, 1, &v, w, "seed_everything", se_text ? se_text : ""));
        }
        if (has_ts && v != seed) {
            bool se_cli = !strcmp(lk_config_node_file(se) ? lk_config_node_file(se) : "", "command line");
            bool ts_cli = !strcmp(lk_config_node_file(ts) ? lk_config_node_file(ts) : "", "command line");
            lk_config_node_where(se, w, sizeof w);
            lk_config_node_where(ts, w2, sizeof w2);
            if (se_cli == ts_cli)
                return lk_error(LK_STATUS_INVALID_ARGUMENT,
                                "seed_everything: %lld (%s) and trainer.seed: %lld (%s) disagree: set one of them "
                                "(seed_everything is Lightning's name, trainer.seed its alias)",
                                (long long)v, w, (long long)seed, w2);
            if (is_rank0_or_alone())
                lk_log_warn("seed %lld from %s (%s) wins over %s: %lld (%s)", (long long)(se_cli ? v : seed),
                            se_cli ? "--seed_everything" : "--trainer.seed", "command line",
                            se_cli ? "trainer.seed" : "seed_everything", (long long)(se_cli ? seed : v), se_cli ? w2 : w);
            if (se_cli) seed = v;
        } else {
            seed = v;
        }
    } else if (!has_ts && getenv("PL_GLOBAL_SEED") && *getenv("PL_GLOBAL_SEED")) {
        int64_t v;
        LK_TRY(lk_params_set(sp, 1, &v, "PL_GLOBAL_SEED", "seed_everything", getenv("PL_GLOBAL_SEED")));
        if (is_rank0_or_alone() && !rs->quiet) lk_log_info("seed %lld from PL_GLOBAL_SEED", (long long)v);
        seed = v;
    }
    const char *sw = getenv("PL_SEED_WORKERS");
    if (sw && !strcmp(sw, "0") && is_rank0_or_alone())
        lk_log_warn("PL_SEED_WORKERS=0: lockstep always seeds data workers (seed_everything(workers=True))");
    rs->trainer.seed = seed;
    char val[32];
    snprintf(val, sizeof val, "%lld", (long long)seed);
    setenv("PL_GLOBAL_SEED", val, 1); /* as Lightning's seed_everything() leaves it */
    char o1[256], o2[256]; /* copies: setting a key replaces the node its origin came from */
    snprintf(o1, sizeof o1, "%s", has_se && lk_config_node_file(se) ? lk_config_node_file(se) : "(default)");
    snprintf(o2, sizeof o2, "%s", has_ts && lk_config_node_file(ts) ? lk_config_node_file(ts) : "(default)");
    LK_TRY(lk_config_set(cfg, "seed_everything", val, o1));
    LK_TRY(lk_config_set(cfg, "trainer.seed", val, o2));
    return LK_STATUS_OK;
}

/* PyTorch's optimizer and scheduler arguments with no key in lockstep's
 * table: those that pick torch's implementation are accepted at any value
 * (the arithmetic is the same), the others at the value that means what
 * lockstep does; another value is refused saying why (docs/LIGHTNING.md). */
static lk_status torch_arg(const lk_config_node *c, const char *sec, const char *key) {
    static const struct {
        const char *name, *only, *why; /* only: the one value accepted (NULL: any) */
    } args[] = {
        {"foreach", NULL, NULL},    /* torch's multi-tensor kernels */
        {"fused", NULL, NULL},      /* torch's fused CUDA kernel */
        {"capturable", NULL, NULL}, /* CUDA graph capture */
        {"verbose", NULL, NULL},    /* torch prints each lr change (deprecated in torch 2.2) */
        {"differentiable", "false", "lockstep does not differentiate through the optimizer step"},
        {"maximize", "false", "lockstep's optimizers minimise: return the negated objective as the loss"},
        {"last_epoch", "-1", "a scheduler starts from its beginning, and a resumed run restores its position from the "
                             "checkpoint: use ckpt_path"},
    };
    for (size_t k = 0; k < sizeof args / sizeof args[0]; k++) {
        if (strcmp(key, args[k].name)) continue;
        const char *t = lk_config_node_text(c);
        if (!args[k].only || lk_config_node_is_null(c) || (t && !strcasecmp(t, args[k].only))) return LK_STATUS_OK;
        char msg[512];
        snprintf(msg, sizeof msg, "%s.init_args.%s: %s is not supported (only %s): %s", sec, key,
                 t ? t : "(a collection)", args[k].only, args[k].why);
        return where_error(c, msg);
    }
    return LK_STATUS_OK;
}

static lk_status read_spec(lk_config *cfg, run_spec *rs) {
    const lk_config_node *root = lk_config_root(cfg);
    for (int i = 0; root && i < lk_config_node_count(root); i++) {
        const lk_config_node *c = lk_config_node_child(root, i);
        const char *key = lk_config_node_key(c);
        bool ok = false;
        for (int k = 0; k < N_TOP; k++) ok |= !strcmp(key, top_keys[k]);
        if (!ok) {
            char msg[512];
            const char *s = lk_suggest(key, top_keys, N_TOP);
            snprintf(msg, sizeof msg, "unknown top-level key '%s'%s%s%s (expected one of seed_everything, trainer, "
                     "model, data, optimizer, lr_scheduler, ckpt_path)", key, s ? " (did you mean '" : "", s ? s : "",
                     s ? "'?)" : "");
            return where_error(c, msg);
        }
    }
    int n;
    const lk_param *tp = lk_trainer_params(&n);
    LK_TRY(lk_trainer_config_default(&rs->trainer));
    (void)tp;
    LK_TRY(lk_trainer_config_apply(lk_config_get(cfg, "trainer"), &rs->trainer));
    LK_TRY(resolve_seed(cfg, rs));
    const lk_param *op = lk_optim_settings_params(&n);
    LK_TRY(lk_optim_settings_default(&rs->optim));
    for (int pass = 0; pass < 2; pass++) {
        const char *sec = pass ? "lr_scheduler" : "optimizer";
        const lk_config_node *node = lk_config_get(cfg, sec);
        if (!node || lk_config_node_is_null(node)) continue;
        const lk_config_node *cp = lk_config_node_get(node, "class_path");
        if (cp) { /* LightningCLI form: class_path + init_args */
            const char *name = lk_config_node_text(cp);
            const char *dot = strrchr(name, '.');
            char lower[64];
            snprintf(lower, sizeof lower, "%s", dot ? dot + 1 : name);
            for (char *p = lower; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
            static const struct { const char *from, *to; } alias[] = {
                {"steplr", "step"}, {"multisteplr", "multistep"}, {"exponentiallr", "exponential"},
                {"cosineannealinglr", "cosine"}, {"linearlr", "linear"}, {"onecyclelr", "onecycle"},
                {"reducelronplateau", "plateau"}};
            for (size_t k = 0; k < sizeof alias / sizeof alias[0]; k++)
                if (!strcmp(lower, alias[k].from)) snprintf(lower, sizeof lower, "%s", alias[k].to);
            char w[256];
            lk_config_node_where(cp, w, sizeof w);
            LK_TRY(lk_params_set(op, n, &rs->optim, w, pass ? "scheduler" : "name", lower));
            /* torch's OneCycleLR cycles the momentum unless told not to (the flat key's default keeps lockstep's false) */
            if (pass && !strcmp(lower, "onecycle")) rs->optim.cycle_momentum = true;
            /* PyTorch's argument names that lockstep's table spells differently
             * or that choose how torch runs rather than what it computes (the
             * full init_args LightningCLI writes; torch_arg checks them) */
            static const char *const torch_names[] = {"betas", "T_max", "total_iters", "foreach", "fused",
                                                      "capturable", "differentiable", "maximize", "last_epoch",
                                                      "verbose", "eps"};
            const lk_config_node *ia = lk_config_node_get(node, "init_args");
            char prefix[64];
            snprintf(prefix, sizeof prefix, "%s.init_args", sec);
            /* eps is Adam's in optimizer and ReduceLROnPlateau's (a smallest lr change) in lr_scheduler;
             * null is torch's None, which for these arguments is the default (OneCycleLR's total_steps) */
            const char *skip[64];
            int nskip = 0;
            for (int k = 0; k < (pass ? 11 : 10); k++) skip[nskip++] = torch_names[k];
            for (int i = 0; i < lk_config_node_count(ia) && nskip < 64; i++)
                if (lk_config_node_is_null(lk_config_node_child(ia, i)))
                    skip[nskip++] = lk_config_node_key(lk_config_node_child(ia, i));
            LK_TRY(lk_config_apply_params_except(ia, op, n, &rs->optim, prefix, skip, nskip));
            for (int i = 0; i < lk_config_node_count(ia); i++) {
                const lk_config_node *c = lk_config_node_child(ia, i);
                const char *key = lk_config_node_key(c);
                lk_config_node_where(c, w, sizeof w);
                LK_TRY(torch_arg(c, sec, key));
                if (pass && !strcmp(key, "eps") && !lk_config_node_is_null(c)) {
                    static const lk_param ep[] = {{"eps", LK_PARAM_FLOAT, 0, "1e-8", 0, 1, NULL, "plateau eps"}};
                    LK_TRY(lk_params_set(ep, 1, &rs->optim.plateau_eps, w, "eps",
                                         lk_config_node_text(c) ? lk_config_node_text(c) : ""));
                } else if (!strcmp(key, "betas")) {
                    const lk_config_node *b0 = lk_config_node_child(c, 0), *b1 = lk_config_node_child(c, 1);
                    if (lk_config_node_type(c) != LK_CONFIG_SEQ || lk_config_node_count(c) != 2 ||
                        !lk_config_node_text(b0) || !lk_config_node_text(b1))
                        return where_error(c, "optimizer.init_args.betas: expected two numbers, e.g. [0.9, 0.999]");
                    LK_TRY(lk_params_set(op, n, &rs->optim, w, "beta1", lk_config_node_text(b0)));
                    LK_TRY(lk_params_set(op, n, &rs->optim, w, "beta2", lk_config_node_text(b1)));
                } else if (!strcmp(key, "T_max") || !strcmp(key, "total_iters")) { /* CosineAnnealingLR, LinearLR */
                    if (!lk_config_node_text(c)) return where_error(c, "expected an integer number of epochs or steps");
                    LK_TRY(lk_params_set(op, n, &rs->optim, w, "step_size", lk_config_node_text(c)));
                }
            }
        } else {
            LK_TRY(lk_config_apply_params(node, op, n, &rs->optim, sec));
        }
    }
    LK_TRY(read_class(rs, lk_config_get(cfg, "model"), "model", &rs->model, rs->model_args, &rs->n_model_args));
    LK_TRY(read_class(rs, lk_config_get(cfg, "data"), "data", &rs->data, rs->data_args, &rs->n_data_args));
    const lk_config_node *ck = lk_config_get(cfg, "ckpt_path");
    rs->ckpt_path = ck && !lk_config_node_is_null(ck) ? lk_config_node_text(ck) : NULL;
    return LK_STATUS_OK;
}

/* Writes every default into the tree, so --print_config and config.yaml
 * show the whole configuration and feed back unchanged. */
/* The value as YAML text: strings quoted, so "{epoch}-{step}" stays a string. */
static const char *yaml_value(const lk_param *p, const void *obj, char *buf, size_t size) {
    if (p->type != LK_PARAM_STRING) return lk_params_format(p, obj, buf, size);
    const char *s = (const char *)obj + p->offset;
    size_t k = 0;
    buf[k++] = '"';
    for (; *s && k + 3 < size; s++) {
        if (*s == '"' || *s == '\\') buf[k++] = '\\';
        buf[k++] = *s;
    }
    buf[k++] = '"';
    buf[k] = 0;
    return buf;
}

static lk_status fill_defaults(lk_config *cfg, const run_spec *rs) {
    int n;
    char path[256], val[1024];
    const lk_param *tp = lk_trainer_params(&n);
    LK_TRY(lk_config_set_default(cfg, "seed_everything", "0", "(default)"));
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "trainer.%s", tp[i].name);
        LK_TRY(lk_config_set_default(cfg, path, yaml_value(&tp[i], &rs->trainer, val, sizeof val), "(default)"));
    }
    const lk_param *op = lk_optim_settings_params(&n);
    const lk_config_node *o = lk_config_get(cfg, "optimizer");
    if (!o || !lk_config_node_get(o, "class_path"))
        for (int i = 0; i < n; i++) {
            snprintf(path, sizeof path, "optimizer.%s", op[i].name);
            LK_TRY(lk_config_set_default(cfg, path, yaml_value(&op[i], &rs->optim, val, sizeof val), "(default)"));
        }
    const lk_model_info *mi = lk_model_find(rs->model);
    for (int i = 0; mi && i < mi->n_args; i++) {
        snprintf(path, sizeof path, "model.init_args.%s", mi->args[i].name);
        if (mi->args[i].default_value)
            LK_TRY(lk_config_set_default(cfg, path, mi->args[i].default_value, "(default)"));
    }
    const lk_datamodule_info *di = lk_datamodules(&n);
    for (int d = 0; d < n; d++) {
        if (strcmp(di[d].name, rs->data)) continue;
        for (int i = 0; i < di[d].n_params; i++) {
            snprintf(path, sizeof path, "data.init_args.%s", di[d].params[i].name);
            if (!di[d].params[i].def) continue;
            bool str = di[d].params[i].type == LK_PARAM_STRING;
            snprintf(val, sizeof val, str ? "\"%s\"" : "%s", di[d].params[i].def);
            LK_TRY(lk_config_set_default(cfg, path, val, "(default)"));
        }
    }
    return LK_STATUS_OK;
}

/* A message of a rank other than 0 keeps its rank in front ("[rank 1]
 * lockstep fit: error: ..."): the launcher relays such a line as it is
 * instead of adding a second "[rank 1] ". Rank 0's lines are not prefixed
 * by the launcher and keep the usual "lockstep fit: error: " start. */
static int fail(const char *cmd, int code) {
    const char *msg = lk_last_error();
    int rank, len = 0;
    if (sscanf(msg, "[rank %d] %n", &rank, &len) == 1 && len > 0 && rank > 0)
        fprintf(stderr, "[rank %d] lockstep %s: error: %s\n", rank, cmd, msg + len);
    else
        fprintf(stderr, "lockstep %s: error: %s\n", cmd, msg);
    return code;
}

/* Runs the command in this process (one rank, or the only one). */
typedef struct {
    const char *cmd;
    run_spec *rs;
    lk_module *module;
    lk_datamodule *dm;
    const char *yaml;
} local_run;

static int run_local(void *ctx) {
    local_run *x = ctx;
    int rc = 0;
    lk_trainer *tr = NULL;
    lk_status st = lk_trainer_create(&x->rs->trainer, &x->rs->optim, x->yaml, &tr);
    if (!st) {
        if (!strcmp(x->cmd, "fit")) st = lk_trainer_fit(tr, x->module, x->dm, x->rs->ckpt_path);
        else if (!strcmp(x->cmd, "validate")) st = lk_trainer_validate(tr, x->module, x->dm, x->rs->ckpt_path);
        else if (!strcmp(x->cmd, "test")) st = lk_trainer_test(tr, x->module, x->dm, x->rs->ckpt_path);
        else st = lk_trainer_predict(tr, x->module, x->dm, x->rs->ckpt_path);
    }
    if (st) {
        rc = fail(x->cmd, 1);
        /* stopped by SIGINT/SIGTERM/SIGHUP/SIGUSR1 after saving: exit as the signal would (128 + N) */
        const char *by = st == LK_STATUS_ABORTED ? strstr(lk_last_error(), "stopped by signal ") : NULL;
        int sig = by ? atoi(by + 18) : 0;
        if (sig > 0 && sig < 64) rc = 128 + sig;
    } else if (lk_trainer_rank(tr) == 0 && lk_trainer_log_dir(tr)[0]) {
        const char *last = lk_trainer_last_checkpoint(tr), *best = lk_trainer_best_checkpoint(tr);
        if (!strcmp(x->cmd, "fit")) {
            if (best[0]) printf("best checkpoint: %s\n", best);
            if (last[0]) printf("last checkpoint: %s\n", last);
        } else if (last[0]) {
            printf("checkpoint:      %s\n", last);
        }
        char png[2200];
        snprintf(png, sizeof png, "%s/metrics.csv", lk_trainer_log_dir(tr)); /* only a file that exists */
        if (access(png, R_OK) == 0) printf("logs:            %s\n", png);
        else printf("logs:            %s\n", lk_trainer_log_dir(tr));
        snprintf(png, sizeof png, "%s/reconstructions.png", lk_trainer_log_dir(tr));
        if (access(png, R_OK) == 0) printf("picture:         %s\n", png);
    }
    lk_trainer_free(tr);
    return rc;
}

int lk_cmd_fit(int argc, char **argv) {
    const char *cmd = argv[0];
    static const char *const flags[] = {"--help", "-h", "--print_config"};
    lk_config_args args;
    if (lk_config_args_parse(argc - 1, argv + 1, flags, 3, &args)) return fail(cmd, 2);
    bool print_config = false, skip_null = false;
    for (int i = 0; i < args.nrest; i++) {
        if (!strcmp(args.rest[i], "--help") || !strcmp(args.rest[i], "-h")) {
            print_help(cmd);
            lk_config_args_free(&args);
            return 0;
        }
        if (!strcmp(args.rest[i], "--print_config")) print_config = true;
        else if (!strcmp(args.rest[i], "--print_config=skip_null")) print_config = skip_null = true;
        else if (!strncmp(args.rest[i], "--print_config=", 15)) {
            lk_error(LK_STATUS_INVALID_USAGE, "'%s': lockstep understands --print_config and --print_config=skip_null",
                     args.rest[i]);
            lk_config_args_free(&args);
            return fail(cmd, 2);
        } else {
            lk_error(LK_STATUS_INVALID_USAGE, "unexpected argument '%s' (see 'lockstep %s --help')", args.rest[i], cmd);
            lk_config_args_free(&args);
            return fail(cmd, 2);
        }
    }
    lk_config *cfg = lk_config_create();
    run_spec rs;
    memset(&rs, 0, sizeof rs);
    rs.quiet = print_config;
    lk_module *module = NULL;
    lk_datamodule *dm = NULL;
    char *yaml = NULL;
    size_t ylen = 0;
    int rc = 0;
    /* Everything is validated, and the module and data module built, here:
     * bad input is reported before any process is launched. */
    if (!cfg || lk_config_load_args(cfg, &args) || read_spec(cfg, &rs) || fill_defaults(cfg, &rs) ||
        build_class(cfg, "model", rs.model, rs.model_args, rs.n_model_args, (uint64_t)rs.trainer.seed, &module, NULL) ||
        build_class(cfg, "data", rs.data, rs.data_args, rs.n_data_args, (uint64_t)rs.trainer.seed, NULL, &dm)) {
        rc = fail(cmd, 2);
        goto out;
    }
    if (lk_trainer_config_check(&rs.trainer)) { /* the precision and what depends on it, once, before launching */
        rc = fail(cmd, 2);
        goto out;
    }
    if (skip_null) lk_config_drop_nulls(cfg);
    lk_config_node_to_yaml(lk_config_root(cfg), &yaml, &ylen);
    if (print_config) {
        fputs(yaml ? yaml : "", stdout);
        goto out;
    }
    /* A GPU request (accelerator gpu|cuda) is settled before ranks are
     * launched, so a missing GPU is one error, not one per rank
     * (device/gpu_select.c; it queries CUDA only when a GPU is asked for). */
    if (lk__accelerator_check(&rs.trainer)) {
        rc = fail(cmd, 1);
        goto out;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (rs.trainer.devices > cores && !lk_env_get_long("LK_ALLOW_OVERSUBSCRIBE", 0)) {
        lk_error(LK_STATUS_INVALID_ARGUMENT,
                 "trainer.devices=%lld is more than the %ld CPU cores available on this machine "
                 "(set LK_ALLOW_OVERSUBSCRIBE=1 to run anyway)", (long long)rs.trainer.devices, cores);
        rc = fail(cmd, 2);
        goto out;
    }
    local_run local = {cmd, &rs, module, dm, yaml};
    bool launched = getenv("WORLD_SIZE") || getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("SLURM_NTASKS");
    int64_t devices = rs.trainer.devices > 0 ? rs.trainer.devices : 1;
    /* (an unknown name is the trainer's error, in the ranks as in one process) */
    const lk_strategy_info *si = lk_strategy_info_get(rs.trainer.strategy);
    /* (num_nodes > 1 needs a launcher on every node: the trainer says so, before any rank starts) */
    if (!launched && devices > 1 && rs.trainer.num_nodes <= 1 && (!si || si->process_model == LK_PROCESS_PER_DEVICE)) {
        /* Lightning's subprocess launcher: run this same command as N ranks. */
        char **child = calloc((size_t)argc + 2, sizeof *child);
        child[0] = "/proc/self/exe";
        for (int i = 0; i < argc; i++) child[i + 1] = argv[i];
        lk_launch_options lo = lk_launch_options_default();
        lo.quiet = true;
        lo.max_restarts = lk_cli_max_restarts_from_env(NULL); /* launch --max-restarts for fit's own ranks */
        if (si && si->forks) { /* fork this process instead of executing it again */
            lo.child_main = run_local;
            lo.child_ctx = &local;
            lk_log_info("strategy %s: the %lld ranks are forked from this process (PyTorch would spawn fresh "
                        "interpreters); from there they train exactly as ddp, which is what run.json records",
                        si->name, (long long)devices);
        }
        int code = 0;
        if (lk_launch((int)devices, child, &lo, &code)) rc = fail(cmd, 1);
        else rc = code;
        free(child);
    } else {
        rc = run_local(&local);
    }
out:
    lk_free(yaml);
    lk_module_free(module);
    lk_datamodule_free(dm);
    lk_config_free(cfg);
    lk_config_args_free(&args);
    run_spec_free(&rs);
    return rc;
}

/* For `lockstep generate` (cmd_generate.c): the config's module and data
 * module built exactly as fit builds them (every section validated, the
 * defaults written into `cfg`), the seed that runs and trainer.default_root_dir. */
lk_status lk_cli_build_from_config(lk_config *cfg, lk_module **module, lk_datamodule **dm, int64_t *seed,
                                   char *root_dir, size_t size) {
    *module = NULL;
    *dm = NULL;
    run_spec rs;
    memset(&rs, 0, sizeof rs);
    lk_status st = read_spec(cfg, &rs);
    if (!st) st = fill_defaults(cfg, &rs);
    if (!st) st = build_class(cfg, "model", rs.model, rs.model_args, rs.n_model_args, (uint64_t)rs.trainer.seed, module, NULL);
    if (!st) st = lk_layer_materialize((*module)->net); /* whole: generate runs it on this process */
    if (!st) st = build_class(cfg, "data", rs.data, rs.data_args, rs.n_data_args, (uint64_t)rs.trainer.seed, NULL, dm);
    *seed = rs.trainer.seed;
    snprintf(root_dir, size, "%s", rs.trainer.default_root_dir[0] ? rs.trainer.default_root_dir : ".");
    run_spec_free(&rs);
    if (st) {
        lk_module_free(*module);
        lk_datamodule_free(*dm);
        *module = NULL;
        *dm = NULL;
    }
    return st;
}

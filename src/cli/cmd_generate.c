/* `lockstep generate -c config.yaml --ckpt_path last --prompt TEXT`: text
 * sampled from a trained language model. A command of its own rather than
 * a mode of `predict`: predict runs the trainer's loop over a data module's
 * batches on every rank, while generation is one process feeding its own
 * output back one token at a time — it needs the config's model, a
 * checkpoint and a tokenizer, not a loader, a strategy or ranks.
 *
 * The model and data module are built from the config exactly as fit
 * builds them; the weights come from the checkpoint (last: the newest
 * version_N/checkpoints/last.ckpt under trainer.default_root_dir; best: the
 * best_path that checkpoint records; or a path). The tokenizer is the one
 * meta.json beside the data's token files names (written by lockstep
 * prepare and the Bible default), else bytes; --tokenizer/--vocab/--merges
 * override. The context is cropped to the model's block_size. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "io/safetensors.h"
#include "train/train_impl.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lockstep generate -c CONFIG.yaml [--SECTION.KEY VALUE]... --prompt TEXT [--ckpt_path last|best|PATH]\n"
            "                         [--max_new_tokens 256] [--temperature 0.8] [--top_k 200] [--seed S]\n"
            "                         [--tokenizer bytes|gpt2 --vocab vocab.json --merges merges.txt] [--out FILE]\n\n"
            "Samples text from the config's model with a checkpoint's weights; prints it and writes it to the\n"
            "run directory (generated.txt beside the checkpoints/ folder, or --out FILE).\n"
            "  --prompt TEXT        the start of the text; \\n, \\t and \\\\ are read as escapes\n"
            "  --ckpt_path          last (default; the newest run under trainer.default_root_dir), best, or a file\n"
            "  --max_new_tokens N   tokens to add (default 256)\n"
            "  --temperature T      > 0; below 1 is more conservative (default 0.8)\n"
            "  --top_k K            sample among the K most likely tokens (default 200; 0: all)\n"
            "  --seed S             the same seed gives the same text (default: the config's seed)\n"
            "  --tokenizer          default: meta.json beside the data's token files, else bytes\n");
}

static int fail(int code) {
    fprintf(stderr, "lockstep generate: error: %s\n", lk_last_error());
    return code;
}

/* \n, \t, \\ in place (a shell passes them literally). */
static size_t unescape(char *s) {
    size_t k = 0;
    for (size_t i = 0; s[i]; i++) {
        if (s[i] == '\\' && (s[i + 1] == 'n' || s[i + 1] == 't' || s[i + 1] == '\\')) {
            s[k++] = s[i + 1] == 'n' ? '\n' : s[i + 1] == 't' ? '\t' : '\\';
            i++;
        } else {
            s[k++] = s[i];
        }
    }
    s[k] = 0;
    return k;
}

static lk_status parse_i64(const char *opt, const char *v, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end)
        return lk_error(LK_STATUS_INVALID_USAGE, "%s '%s': expected an integer", opt, v);
    *out = x;
    return LK_STATUS_OK;
}

/* last: the newest version_N/checkpoints/last.ckpt under root/lightning_logs;
 * best: the best_path recorded in that checkpoint. */
static lk_status resolve_ckpt(const char *spec, const char *root, char *out, size_t size) {
    if (strcmp(spec, "last") && strcmp(spec, "best")) {
        if (access(spec, R_OK) != 0)
            return lk_error(LK_STATUS_IO, "--ckpt_path: cannot read '%s': %s (expected last, best or a checkpoint file)",
                            spec, strerror(errno));
        snprintf(out, size, "%s", spec);
        return LK_STATUS_OK;
    }
    char dir[PATH_MAX - 64];
    snprintf(dir, sizeof dir, "%s/lightning_logs", root);
    DIR *d = opendir(dir);
    long best = -1;
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            long v;
            char probe[PATH_MAX + 300];
            if (sscanf(de->d_name, "version_%ld", &v) != 1 || v <= best) continue;
            snprintf(probe, sizeof probe, "%s/%s/checkpoints/last.ckpt", dir, de->d_name);
            if (access(probe, R_OK) == 0) best = v;
        }
        closedir(d);
    }
    if (best < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "--ckpt_path %s: found no %s/version_*/checkpoints/last.ckpt (train first with lockstep fit, "
                        "or pass a checkpoint file)",
                        spec, dir);
    snprintf(out, size, "%s/version_%ld/checkpoints/last.ckpt", dir, best);
    if (!strcmp(spec, "last")) return LK_STATUS_OK;
    lk_st_file *f;
    LK_TRY(lk_safetensors_open(out, &f));
    const char *bp = lk_safetensors_meta(f, "best_path");
    lk_status st = LK_STATUS_OK;
    if (!bp || !*bp)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                      "--ckpt_path best: %s records no best checkpoint (the run monitored no metric); pass last or a path",
                      out);
    else if (access(bp, R_OK) != 0)
        st = lk_error(LK_STATUS_IO, "--ckpt_path best: %s names %s, which cannot be read: %s", out, bp, strerror(errno));
    else snprintf(out, size, "%s", bp);
    lk_safetensors_close(f);
    return st;
}

/* The tokenizer meta.json beside `data_file` names; bytes when there is none. */
static lk_status tokenizer_from_meta(const char *data_file, lk_tokenizer **tok, char *from, size_t size) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", data_file);
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, sizeof path - (size_t)(slash ? slash + 1 - path : 0), "meta.json");
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(from, size, "bytes (no meta.json beside %s)", data_file);
        return lk_tokenizer_bytes_create(tok);
    }
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *o = cJSON_Parse(buf);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "tokenizer");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(o, "vocab"), *merges = cJSON_GetObjectItemCaseSensitive(o, "merges");
    lk_status st;
    if (!cJSON_IsString(kind))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: no \"tokenizer\" string (expected bytes or gpt2)", path);
    else if (!strcmp(kind->valuestring, "bytes"))
        st = lk_tokenizer_bytes_create(tok);
    else if (!strcmp(kind->valuestring, "gpt2") && cJSON_IsString(vocab) && cJSON_IsString(merges))
        st = lk_tokenizer_gpt2_create(vocab->valuestring, merges->valuestring, tok);
    else
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: tokenizer \"%s\" (expected bytes, or gpt2 with vocab and merges paths)",
                      path, kind->valuestring);
    if (!st) snprintf(from, size, "%s (%s)", lk_tokenizer_kind(*tok), path);
    cJSON_Delete(o);
    return st;
}

int lk_cmd_generate(int argc, char **argv) {
    const char *prompt_arg = NULL, *ckpt = NULL, *tokenizer = NULL, *vocab = NULL, *merges = NULL, *out_file = NULL;
    lk_generate_config gc = lk_generate_config_default();
    gc.temperature = 0.8;
    gc.top_k = 200;
    bool seed_given = false;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return 1;
    int nrest = 0;
    rest[nrest++] = argv[0];
    lk_status st = LK_STATUS_OK;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(rest);
            return 0;
        }
        static const char *const opts[] = {"--prompt", "--ckpt_path", "--max_new_tokens", "--temperature", "--top_k",
                                           "--seed", "--tokenizer", "--vocab", "--merges", "--out"};
        int o = -1;
        for (int k = 0; k < 10; k++)
            if (!strcmp(a, opts[k])) o = k;
        if (o < 0) {
            rest[nrest++] = argv[i]; /* -c FILE and --section.key overrides: the config's */
            continue;
        }
        if (i + 1 >= argc) {
            st = lk_error(LK_STATUS_INVALID_USAGE, "%s needs a value (see 'lockstep generate --help')", a);
            break;
        }
        const char *v = argv[++i];
        switch (o) {
        case 0: prompt_arg = v; break;
        case 1: ckpt = v; break;
        case 2: st = parse_i64(a, v, &gc.max_new_tokens); break;
        case 3: {
            char *end;
            errno = 0;
            gc.temperature = strtod(v, &end);
            if (errno || end == v || *end) st = lk_error(LK_STATUS_INVALID_USAGE, "--temperature '%s': expected a number", v);
            break;
        }
        case 4: st = parse_i64(a, v, &gc.top_k); break;
        case 5: {
            int64_t s = 0;
            st = parse_i64(a, v, &s);
            if (!st && s < 0) st = lk_error(LK_STATUS_INVALID_USAGE, "--seed %lld: expected >= 0", (long long)s);
            gc.seed = (uint64_t)s;
            seed_given = true;
            break;
        }
        case 6: tokenizer = v; break;
        case 7: vocab = v; break;
        case 8: merges = v; break;
        default: out_file = v; break;
        }
    }
    /* the settings first: a mistake costs no model build */
    if (!st && !prompt_arg) st = lk_error(LK_STATUS_INVALID_USAGE, "--prompt TEXT is required (see 'lockstep generate --help')");
    if (!st && !prompt_arg[0]) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "--prompt is empty; expected at least one character");
    if (!st && gc.max_new_tokens < 1)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "--max_new_tokens %lld, expected >= 1", (long long)gc.max_new_tokens);
    if (!st && !(gc.temperature > 0))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "--temperature %g, expected > 0 (a small value is nearly greedy)",
                      gc.temperature);
    if (!st && gc.top_k < 0)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "--top_k %lld, expected >= 0 (0: every token)", (long long)gc.top_k);
    if (!st && tokenizer && strcmp(tokenizer, "bytes") && strcmp(tokenizer, "gpt2"))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "--tokenizer '%s': expected bytes or gpt2", tokenizer);
    if (!st && tokenizer && !strcmp(tokenizer, "gpt2") && (!vocab || !merges))
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "--tokenizer gpt2 needs --vocab vocab.json and --merges merges.txt");
    if (st) {
        free(rest);
        return fail(2);
    }
    lk_config_args args;
    memset(&args, 0, sizeof args);
    lk_config *cfg = NULL;
    lk_module *m = NULL;
    lk_datamodule *dm = NULL;
    lk_tokenizer *tok = NULL;
    int32_t *ptok = NULL;
    int64_t *prompt = NULL, *seq = NULL, nseq = 0, np = 0;
    char *text = NULL, root[LK_PARAM_STR + 8], path[PATH_MAX], tok_from[PATH_MAX + 64], outp[PATH_MAX + 32];
    int64_t seed = 0;
    int rc = 2;
    char *prompt_buf = lk_strdup(prompt_arg);
    size_t plen = prompt_buf ? unescape(prompt_buf) : 0;
    st = prompt_buf ? lk_config_args_parse(nrest - 1, rest + 1, NULL, 0, &args) : LK_STATUS_OUT_OF_MEMORY;
    if (!st && args.nrest)
        st = lk_error(LK_STATUS_INVALID_USAGE, "unexpected argument '%s' (see 'lockstep generate --help')", args.rest[0]);
    if (!st && !(cfg = lk_config_create())) st = LK_STATUS_OUT_OF_MEMORY;
    if (!st) st = lk_config_load_args(cfg, &args);
    if (!st) st = lk_cli_build_from_config(cfg, &m, &dm, &seed, root, sizeof root);
    if (st) goto out;
    if (!seed_given) gc.seed = (uint64_t)seed;
    /* the context: the model's block_size, else the data's */
    const lk_config_node *bs = lk_config_get(cfg, "model.init_args.block_size");
    if (!bs || !lk_config_node_text(bs)) bs = lk_config_get(cfg, "data.init_args.block_size");
    if (bs && lk_config_node_text(bs)) gc.block_size = atoll(lk_config_node_text(bs));
    /* the tokenizer */
    if (tokenizer) {
        st = !strcmp(tokenizer, "gpt2") ? lk_tokenizer_gpt2_create(vocab, merges, &tok) : lk_tokenizer_bytes_create(&tok);
        snprintf(tok_from, sizeof tok_from, "%s (--tokenizer)", tokenizer);
    } else if (lk__dm_is_tokens(dm)) {
        st = tokenizer_from_meta(lk__dm_tokens_train_file(dm), &tok, tok_from, sizeof tok_from);
    } else {
        st = lk_tokenizer_bytes_create(&tok);
        snprintf(tok_from, sizeof tok_from, "bytes (the data module is not tokens)");
    }
    rc = 1;
    if (!st) st = lk_tokenizer_encode(tok, prompt_buf, plen, &ptok, &np);
    if (!st && np < 1) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "--prompt encodes to no tokens");
    if (!st && !(prompt = lk_malloc((size_t)np * sizeof *prompt))) st = LK_STATUS_OUT_OF_MEMORY;
    for (int64_t i = 0; !st && i < np; i++) prompt[i] = ptok[i];
    if (!st) st = resolve_ckpt(ckpt ? ckpt : "last", root, path, sizeof path);
    if (!st) st = lk_module_load_weights(m, path);
    if (!st) {
        lk_log_info("generate: %s, tokenizer %s, %lld prompt tokens, context %lld, temperature %g, top_k %lld, seed %llu",
                    path, tok_from, (long long)np, (long long)gc.block_size, gc.temperature, (long long)gc.top_k,
                    (unsigned long long)gc.seed);
        st = lk_generate(m->net, prompt, np, &gc, &seq, &nseq);
        if (st && strstr(lk_last_error(), "outside the model's vocabulary"))
            st = lk_error(st, "%s (--prompt, tokenizer %s)", lk_last_error(), tok_from);
    }
    /* A model whose vocabulary is padded past the tokenizer's (GPT-2's
     * 50304 for 50257) may draw a padding id: it has no text, so it is left
     * out and counted. */
    int64_t dropped = 0, k = 0;
    int32_t *keep = st ? NULL : lk_malloc((size_t)nseq * sizeof *keep);
    if (!st && !keep) st = LK_STATUS_OUT_OF_MEMORY;
    for (int64_t i = 0; !st && i < nseq; i++) {
        if (seq[i] >= lk_tokenizer_vocab_size(tok)) dropped++;
        else keep[k++] = (int32_t)seq[i];
    }
    size_t tlen = 0;
    if (!st) st = lk_tokenizer_decode(tok, keep, k, &text, &tlen);
    lk_free(keep);
    if (!st && dropped)
        lk_log_warn("generate: %lld sampled token(s) lie beyond the tokenizer's %lld and were left out", (long long)dropped,
                    (long long)lk_tokenizer_vocab_size(tok));
    if (!st) {
        if (out_file) snprintf(outp, sizeof outp, "%s", out_file);
        else {
            /* the run directory: version_N/ above checkpoints/, else beside the file */
            char dir[PATH_MAX];
            snprintf(dir, sizeof dir, "%s", path);
            char *slash = strrchr(dir, '/');
            if (slash) *slash = 0;
            else snprintf(dir, sizeof dir, ".");
            size_t dl = strlen(dir);
            if (dl >= 12 && !strcmp(dir + dl - 12, "/checkpoints")) dir[dl - 12] = 0;
            else if (!strcmp(dir, "checkpoints")) snprintf(dir, sizeof dir, ".");
            snprintf(outp, sizeof outp, "%s/generated.txt", dir);
        }
        fwrite(text, 1, tlen, stdout);
        if (tlen == 0 || text[tlen - 1] != '\n') fputc('\n', stdout);
        fflush(stdout);
        st = lk_file_write_atomic(outp, text, tlen);
        if (!st) fprintf(stderr, "generated %lld tokens; written to %s\n", (long long)(nseq - np), outp);
    }
    if (!st) rc = 0;
out:
    if (st) rc = fail(rc);
    lk_free(text);
    lk_free(seq);
    lk_free(prompt);
    lk_free(ptok);
    lk_free(prompt_buf);
    lk_tokenizer_free(tok);
    lk_module_free(m);
    lk_datamodule_free(dm);
    lk_config_free(cfg);
    lk_config_args_free(&args);
    free(rest);
    return rc;
}

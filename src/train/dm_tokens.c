/* The `tokens` data module: token files for language models (llm.c's or
 * nanoGPT's u16 format, as `lockstep prepare` writes them). Training reads
 * `samples_per_epoch` windows of block_size + 1 tokens at positions drawn
 * from (seed, epoch, sample), validation (and test, predict) reads the
 * validation file's sequential, non-overlapping windows; the distributed
 * sampler shards both. With no file named it trains on the King James
 * Bible of Debian's bible-kjv packages, byte-tokenised by local rank 0
 * once into the data directory while the other ranks wait (the trainer's
 * prepare_data barrier), so a fresh machine needs no download. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "train/train_impl.h"

extern char **environ;

typedef struct {
    char root[LK_PARAM_STR], train_path[LK_PARAM_STR], val_path[LK_PARAM_STR];
    int64_t block_size, batch_size, num_workers, samples_per_epoch, vocab_size;
    double val_fraction;
} tok_args;

#define P(name, type, field, def, lo, hi, help) {name, LK_PARAM_##type, offsetof(tok_args, field), def, lo, hi, NULL, help}

const lk_param lk__dm_tokens_params[LK__DM_TOKENS_NPARAMS] = {
    P("root", STRING, root, "", 1, 0,
      "directory with train.bin and val.bin (lockstep prepare --out DIR); empty: the King James Bible, byte "
      "tokens, prepared once into $LK_DATA_ROOT/bible-kjv (else ~/.cache/lockstep/bible-kjv)"),
    P("train_path", STRING, train_path, "", 1, 0, "training token file (overrides root/train.bin)"),
    P("val_path", STRING, val_path, "", 1, 0, "validation token file (overrides root/val.bin)"),
    P("block_size", INT, block_size, "128", 1, 1e7, "tokens per sample (T); each window reads T + 1"),
    P("batch_size", INT, batch_size, "32", 1, 1e7, "samples per batch on each rank"),
    P("num_workers", INT, num_workers, "1", 0, 256, "loader threads per rank (0: load inline)"),
    P("samples_per_epoch", INT, samples_per_epoch, "0", 0, 1e12,
      "random training windows per epoch over all ranks (0: training tokens / block_size)"),
    P("vocab_size", INT, vocab_size, "0", 0, 65536,
      "tokens must be below it (0: the vocabulary in meta.json beside the files, else unchecked; the model's "
      "vocab_size is checked either way)"),
    P("val_fraction", FLOAT, val_fraction, "0.1", 0.0001, 0.9, "the Bible default: share of the text kept for validation (its end)"),
};

#define tok_params lk__dm_tokens_params
_Static_assert(sizeof lk__dm_tokens_params / sizeof lk__dm_tokens_params[0] == LK__DM_TOKENS_NPARAMS, "the table's size");

typedef struct {
    tok_args a;
    uint64_t seed;
    lk_dataset *train, *val;
    char dir[LK_PATH];      /* the default corpus' directory ("" when files were named) */
    const char *dir_from;   /* LK_DATA_ROOT or default */
    char train_file[LK_PATH + 32], val_file[LK_PATH + 32];
    const char *train_from, *val_from; /* the settings that named them */
    int largest;            /* the largest token of both files, once set up */
} tok_self;

static const lk_datamodule_vtable tok_vt;

/* ---- the Bible default -------------------------------------------------------------- */

/* $LK_DATA_ROOT/bible-kjv, else the user's cache directory. */
static lk_status default_dir(char *out, size_t size, const char **from) {
    const char *root = lk_env_is_set("LK_DATA_ROOT") ? getenv("LK_DATA_ROOT") : NULL;
    if (root) {
        *from = "LK_DATA_ROOT";
        snprintf(out, size, "%s/bible-kjv", root);
        return LK_STATUS_OK;
    }
    *from = "default";
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(out, size, "%s/lockstep/bible-kjv", xdg);
    else if (home && *home) snprintf(out, size, "%s/.cache/lockstep/bible-kjv", home);
    else
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "data tokens: no place for the Bible's token files: set LK_DATA_ROOT (or HOME), or name files "
                        "with data.init_args.root / train_path");
    return LK_STATUS_OK;
}

#define BIBLE_BIN "/usr/bin/bible"
#define BIBLE_TIMEOUT_S 120

/* `bible -l0 Gen1:1-Rev22:21` into `dest`: one verse per line whatever
 * COLUMNS says (the default width follows the terminal), bounded by a
 * timeout so a stuck child cannot hang the ranks waiting at the barrier. */
static lk_status run_bible(const char *dest) {
    if (access(BIBLE_BIN, X_OK) != 0)
        return lk_error(LK_STATUS_IO,
                        "data tokens: the default corpus needs %s (Debian packages bible-kjv and bible-kjv-text: "
                        "scripts/deps.sh installs them), or name your token files with data.init_args.root or train_path",
                        BIBLE_BIN);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, dest, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    char *argv[] = {"bible", "-l0", "Gen1:1-Rev22:21", NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, BIBLE_BIN, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) return lk_error(LK_STATUS_IO, "data tokens: cannot start %s: %s", BIBLE_BIN, strerror(rc));
    int status = 0;
    double t0 = lk_time_now();
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return lk_error(LK_STATUS_IO, "data tokens: waiting for %s: %s", BIBLE_BIN, strerror(errno));
        if (lk_time_now() - t0 > BIBLE_TIMEOUT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return lk_error(LK_STATUS_TIMEOUT, "data tokens: %s ran for more than %d s; killed", BIBLE_BIN, BIBLE_TIMEOUT_S);
        }
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return lk_error(LK_STATUS_IO, "data tokens: %s -l0 Gen1:1-Rev22:21 failed (%s %d)", BIBLE_BIN,
                        WIFEXITED(status) ? "exit status" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return LK_STATUS_OK;
}

static lk_status write_meta(const char *dir, const char *tokenizer, int64_t vocab, int64_t ntrain, int64_t nval,
                            const char *source, const char *vocab_json, const char *merges_txt) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return LK_STATUS_OUT_OF_MEMORY;
    cJSON_AddStringToObject(o, "tokenizer", tokenizer);
    cJSON_AddNumberToObject(o, "vocab_size", (double)vocab);
    cJSON_AddNumberToObject(o, "train_tokens", (double)ntrain);
    cJSON_AddNumberToObject(o, "val_tokens", (double)nval);
    if (source) cJSON_AddStringToObject(o, "source", source);
    if (vocab_json) cJSON_AddStringToObject(o, "vocab", vocab_json);
    if (merges_txt) cJSON_AddStringToObject(o, "merges", merges_txt);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return LK_STATUS_OUT_OF_MEMORY;
    char path[LK_PATH + 16];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    size_t n = strlen(text);
    text[n] = '\n'; /* cJSON's buffer ends in its NUL: write the newline over it */
    lk_status st = lk_file_write_atomic(path, text, n + 1);
    cJSON_free(text);
    return st;
}

lk_status lk__tokens_prepare_dir(const char *dir, const char *text, size_t len, const lk_tokenizer *tok,
                                 double val_fraction, const char *source, const char *vocab_json,
                                 const char *merges_txt, int64_t *ntrain, int64_t *nval) {
    if (val_fraction < 0 || val_fraction >= 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "prepare: val_fraction %g, expected in [0, 1)", val_fraction);
    if (lk_tokenizer_vocab_size(tok) > 65536)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "prepare: a vocabulary of %lld tokens does not fit the u16 token files (at most 65536)",
                        (long long)lk_tokenizer_vocab_size(tok));
    /* The split is on the text (its last val_fraction), as nanoGPT's
     * prepare.py does, so a BPE token never straddles the two files. */
    size_t cut = len - (size_t)((double)len * val_fraction);
    while (cut < len && cut > 0 && ((unsigned char)text[cut] & 0xC0) == 0x80) cut++; /* not inside a UTF-8 character */
    int32_t *t[2] = {NULL, NULL};
    int64_t n[2] = {0, 0};
    lk_status st = lk_tokenizer_encode(tok, text, cut, &t[0], &n[0]);
    if (!st) st = lk_tokenizer_encode(tok, text + cut, len - cut, &t[1], &n[1]);
    if (!st) st = lk_file_mkdirs(dir);
    for (int k = 0; k < 2 && !st; k++) {
        uint16_t *u = lk_malloc((size_t)(n[k] ? n[k] : 1) * sizeof *u);
        if (!u) {
            st = LK_STATUS_OUT_OF_MEMORY;
            break;
        }
        for (int64_t i = 0; i < n[k]; i++) u[i] = (uint16_t)t[k][i];
        char path[LK_PATH + 16];
        snprintf(path, sizeof path, "%s/%s", dir, k ? "val.bin" : "train.bin");
        st = lk_tokens_write(path, u, n[k]);
        lk_free(u);
    }
    /* meta.json last: its presence says the pair is complete */
    if (!st)
        st = write_meta(dir, lk_tokenizer_kind(tok), lk_tokenizer_vocab_size(tok), n[0], n[1], source, vocab_json,
                        merges_txt);
    lk_free(t[0]);
    lk_free(t[1]);
    if (!st) {
        if (ntrain) *ntrain = n[0];
        if (nval) *nval = n[1];
    }
    return st;
}

/* The vocabulary meta.json beside `file` declares (0: none, or no file). */
static int64_t meta_vocab(const char *file) {
    char path[LK_PATH + 16];
    snprintf(path, sizeof path, "%s", file);
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, sizeof path - (size_t)(slash ? slash + 1 - path : 0), "meta.json");
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *o = cJSON_Parse(buf);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "vocab_size");
    int64_t vocab = cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble <= 65536 ? (int64_t)v->valuedouble : 0;
    cJSON_Delete(o);
    return vocab;
}

/* Local rank 0, before any rank sets up: the Bible's token files, unless
 * they are there (meta.json is written last, so its presence means both
 * files are complete). */
static lk_status tok_prepare(lk_datamodule *dm) {
    tok_self *s = dm->self;
    if (s->a.root[0] || s->a.train_path[0]) return LK_STATUS_OK;
    LK_TRY(default_dir(s->dir, sizeof s->dir, &s->dir_from));
    char meta[LK_PATH + 16];
    snprintf(meta, sizeof meta, "%s/meta.json", s->dir);
    if (access(meta, R_OK) == 0) return LK_STATUS_OK;
    LK_TRY(lk_file_mkdirs(s->dir));
    char txt[LK_PATH + 64];
    snprintf(txt, sizeof txt, "%s/input.txt.tmp.%ld", s->dir, (long)getpid());
    lk_status st = run_bible(txt);
    char *text = NULL;
    size_t len = 0;
    if (!st) {
        FILE *f = fopen(txt, "rb");
        struct stat sb;
        if (!f || fstat(fileno(f), &sb) != 0) st = lk_error(LK_STATUS_IO, "data tokens: cannot read %s: %s", txt, strerror(errno));
        else if (sb.st_size < 1024)
            st = lk_error(LK_STATUS_IO, "data tokens: %s printed only %lld bytes (expected about 4.3 MB of text)",
                          BIBLE_BIN, (long long)sb.st_size);
        else if (!(text = lk_malloc((size_t)sb.st_size))) st = LK_STATUS_OUT_OF_MEMORY;
        else if (fread(text, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size)
            st = lk_error(LK_STATUS_IO, "data tokens: short read of %s", txt);
        else len = (size_t)sb.st_size;
        if (f) fclose(f);
    }
    lk_tokenizer *tok = NULL;
    if (!st) st = lk_tokenizer_bytes_create(&tok);
    int64_t ntr = 0, nva = 0;
    if (!st)
        st = lk__tokens_prepare_dir(s->dir, text, len, tok, s->a.val_fraction, "bible-kjv: bible -l0 Gen1:1-Rev22:21",
                                    NULL, NULL, &ntr, &nva);
    if (!st) {
        /* the text too, as nanoGPT keeps input.txt beside its .bin files */
        char keep[LK_PATH + 16];
        snprintf(keep, sizeof keep, "%s/input.txt", s->dir);
        if (rename(txt, keep) != 0) unlink(txt);
        lk_log0("data tokens: the King James Bible, %zu bytes, as byte tokens into %s (%lld train, %lld val tokens)",
                len, s->dir, (long long)ntr, (long long)nva);
    } else {
        unlink(txt);
    }
    lk_tokenizer_free(tok);
    lk_free(text);
    return st;
}

/* ---- setup ------------------------------------------------------------------------------ */

static lk_status locate(tok_self *s) {
    if (s->a.train_path[0]) {
        snprintf(s->train_file, sizeof s->train_file, "%s", s->a.train_path);
        s->train_from = "data.init_args.train_path";
    } else if (s->a.root[0]) {
        snprintf(s->train_file, sizeof s->train_file, "%s/train.bin", s->a.root);
        s->train_from = "data.init_args.root";
    } else {
        if (!s->dir[0]) LK_TRY(default_dir(s->dir, sizeof s->dir, &s->dir_from));
        snprintf(s->train_file, sizeof s->train_file, "%s/train.bin", s->dir);
        s->train_from = !strcmp(s->dir_from, "LK_DATA_ROOT") ? "LK_DATA_ROOT (the Bible default)" : "the Bible default";
    }
    if (s->a.val_path[0]) {
        snprintf(s->val_file, sizeof s->val_file, "%s", s->a.val_path);
        s->val_from = "data.init_args.val_path";
    } else if (s->a.root[0] || !s->a.train_path[0]) {
        const char *d = s->a.root[0] ? s->a.root : s->dir;
        snprintf(s->val_file, sizeof s->val_file, "%s/val.bin", d);
        s->val_from = s->a.root[0] ? "data.init_args.root" : s->train_from;
    } else {
        /* train_path alone: val.bin beside it */
        snprintf(s->val_file, sizeof s->val_file, "%s", s->a.train_path);
        char *slash = strrchr(s->val_file, '/');
        snprintf(slash ? slash + 1 : s->val_file, sizeof s->val_file - (size_t)(slash ? slash + 1 - s->val_file : 0),
                 "val.bin");
        s->val_from = "data.init_args.train_path (val.bin beside it; set data.init_args.val_path)";
    }
    return LK_STATUS_OK;
}

/* One file's checks, each error naming the file and the setting. */
static lk_status open_split(tok_self *s, const char *file, const char *from, bool train, lk_dataset **out) {
    if (access(file, R_OK) != 0)
        return lk_error(LK_STATUS_IO, "data tokens: cannot read %s token file %s: %s (named by %s)",
                        train ? "training" : "validation", file, strerror(errno), from);
    int64_t n = 0;
    int largest = -1;
    lk_status st = lk_tokens_file_info(file, &n, &largest);
    if (st) return lk_error(st, "data tokens (%s): %s", from, lk_last_error());
    int64_t T = s->a.block_size;
    if (n < T + 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "data tokens: %s has %lld tokens, but data.init_args.block_size %lld needs %lld per window "
                        "(block_size + 1); use a block_size of at most %lld or more data",
                        file, (long long)n, (long long)T, (long long)T + 1, (long long)(n > 1 ? n - 1 : 0));
    int64_t vocab = s->a.vocab_size;
    const char *vfrom = "data.init_args.vocab_size";
    if (vocab == 0) vocab = meta_vocab(file), vfrom = "the vocab_size of meta.json beside it";
    if (vocab > 0 && largest >= vocab)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "data tokens: %s holds token %d, outside a vocabulary of %lld (%s); expected every token "
                        "< %lld (a vocab_size of at least %d, or data tokenized for this vocabulary)",
                        file, largest, (long long)vocab, vfrom, (long long)vocab, largest + 1);
    if (largest > s->largest) s->largest = largest;
    lk_tokens_config c = lk_tokens_config_default();
    c.seq_len = T;
    if (train) {
        c.samples = s->a.samples_per_epoch > 0 ? s->a.samples_per_epoch : (n - 1) / T;
        if (c.samples < 1) c.samples = 1;
        c.seed = s->seed;
    }
    return lk_dataset_tokens_create(file, &c, out);
}

static lk_status tok_setup(lk_datamodule *dm, const char *stage) {
    tok_self *s = dm->self;
    if (s->val) return LK_STATUS_OK; /* once */
    LK_TRY(locate(s));
    if (!strcmp(stage, "fit")) LK_TRY(open_split(s, s->train_file, s->train_from, true, &s->train));
    return open_split(s, s->val_file, s->val_from, false, &s->val);
}

static lk_dataset *tok_dataset(lk_datamodule *dm, const char *split) {
    tok_self *s = dm->self;
    if (!strcmp(split, "train")) return s->train;
    /* validation, test and predict all read the validation file */
    return s->val;
}

static void tok_destroy(lk_datamodule *dm) {
    tok_self *s = dm->self;
    if (!s) return;
    lk_dataset_free(s->train);
    lk_dataset_free(s->val);
    lk_free(s);
}

static const lk_datamodule_vtable tok_vt = {
    .prepare_data = tok_prepare, .setup = tok_setup, .dataset = tok_dataset, .destroy = tok_destroy};

lk_status lk__dm_tokens_create(const lk_model_kv *args, int n_args, uint64_t seed, lk_datamodule **out) {
    *out = NULL;
    tok_self *s = lk_calloc(1, sizeof *s);
    lk_datamodule *dm = lk_calloc(1, sizeof *dm);
    if (!s || !dm) {
        lk_free(s);
        lk_free(dm);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    dm->self = s;
    dm->vt = &tok_vt;
    dm->name = "tokens";
    s->seed = seed;
    s->largest = -1;
    lk_status st = lk_params_defaults(tok_params, LK__DM_TOKENS_NPARAMS, &s->a);
    for (int i = 0; !st && i < n_args; i++)
        st = lk_params_set(tok_params, LK__DM_TOKENS_NPARAMS, &s->a, "data.init_args", args[i].key, args[i].value);
    if (!st && s->a.val_path[0] && !s->a.train_path[0] && !s->a.root[0])
        st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                      "data.init_args.val_path is set without train_path or root: name the training file too");
    if (st) {
        lk_datamodule_free(dm);
        return st;
    }
    dm->batch_size = s->a.batch_size;
    dm->num_workers = (int)s->a.num_workers;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f) {
        fprintf(f, "data:\n  class_path: tokens\n");
        for (int i = 0; i < n_args; i++) fprintf(f, "  %s: %s\n", args[i].key, args[i].value);
        fclose(f);
        dm->hparams_yaml = lk_strdup(buf);
        free(buf);
    }
    *out = dm;
    return LK_STATUS_OK;
}

bool lk__dm_is_tokens(const lk_datamodule *dm) { return dm && dm->vt == &tok_vt; }

/* The value of a model argument: as given, else its table's default. */
static const char *model_arg(const lk_model_info *info, const lk_model_kv *args, int n, const char *key) {
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(args[i].key, key)) return args[i].value;
    for (int i = 0; i < info->n_args; i++)
        if (!strcmp(info->args[i].name, key)) return info->args[i].default_value;
    return NULL;
}

lk_status lk__dm_tokens_check_model(const lk_model_info *info, const lk_model_kv *args, int n_args,
                                    const lk_datamodule *dm) {
    const tok_self *s = dm->self;
    const char *v = model_arg(info, args, n_args, "vocab_size");
    long long vocab = v ? atoll(v) : 0;
    if (vocab > 0 && s->largest >= vocab)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model %s has model.init_args.vocab_size %lld, but the token data (%s) holds token %d; "
                        "expected a vocab_size of at least %d",
                        info->name, vocab, s->train ? s->train_file : s->val_file, s->largest, s->largest + 1);
    const char *b = model_arg(info, args, n_args, "block_size");
    long long block = b ? atoll(b) : 0;
    if (block > 0 && s->a.block_size > block)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "data.init_args.block_size %lld is longer than model %s's model.init_args.block_size %lld (its "
                        "position table); expected data block_size <= %lld",
                        (long long)s->a.block_size, info->name, block, block);
    return LK_STATUS_OK;
}

const char *lk__dm_tokens_train_file(const lk_datamodule *dm) {
    tok_self *s = dm->self;
    if (!s->train_file[0] && locate(s)) return ""; /* no place for the default: no meta.json either */
    return s->train_file;
}

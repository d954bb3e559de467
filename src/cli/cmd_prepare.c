/* `lockstep prepare --input FILE.txt --out DIR`: a text file into token
 * files the `tokens` data module reads — DIR/train.bin and DIR/val.bin in
 * llm.c's format (the last val_fraction of the text is validation, as
 * nanoGPT's prepare.py splits) and DIR/meta.json (tokenizer, vocabulary,
 * counts), from which `lockstep generate` learns how to decode. Bytes as
 * tokens by default; GPT-2's BPE from a vocab.json and merges.txt. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "lockstep.h"
#include "train/train_impl.h"

static void usage(FILE *f) {
    fprintf(f, "usage: lockstep prepare --input FILE.txt --out DIR [--val_fraction 0.1]\n"
               "                        [--tokenizer bytes|gpt2 --vocab vocab.json --merges merges.txt]\n\n"
               "Writes DIR/train.bin and DIR/val.bin (u16 tokens with llm.c's header) and DIR/meta.json.\n"
               "  --input FILE         the text (UTF-8 or any bytes)\n"
               "  --out DIR            where the files go (created)\n"
               "  --val_fraction F     share of the text, from its end, for validation (default 0.1; 0: none)\n"
               "  --tokenizer bytes    each byte a token, vocabulary 256 (default)\n"
               "  --tokenizer gpt2     GPT-2's byte-level BPE: needs --vocab and --merges (read locally)\n"
               "Train with: data: {class_path: tokens, init_args: {root: DIR}}\n");
}

static int fail(int code, const char *fmt, const char *arg) {
    fprintf(stderr, "lockstep prepare: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    return code;
}

int lk_cmd_prepare(int argc, char **argv) {
    const char *input = NULL, *out = NULL, *tokenizer = "bytes", *vocab = NULL, *merges = NULL, *vf = "0.1";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = !strcmp(a, "--input") ? &input : !strcmp(a, "--out") ? &out
                         : !strcmp(a, "--tokenizer") ? &tokenizer : !strcmp(a, "--vocab") ? &vocab
                         : !strcmp(a, "--merges") ? &merges : !strcmp(a, "--val_fraction") ? &vf : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!dst) return fail(2, "unexpected argument '%s' (see 'lockstep prepare --help')", a);
        if (i + 1 >= argc) return fail(2, "%s needs a value (see 'lockstep prepare --help')", a);
        *dst = argv[++i];
    }
    if (!input || !out) return fail(2, "%s", "--input FILE and --out DIR are required (see 'lockstep prepare --help')");
    char *end;
    errno = 0;
    double val_fraction = strtod(vf, &end);
    if (errno || end == vf || *end || !(val_fraction >= 0 && val_fraction < 1))
        return fail(2, "--val_fraction '%s': expected a number in [0, 1)", vf);
    bool gpt2 = !strcmp(tokenizer, "gpt2");
    if (!gpt2 && strcmp(tokenizer, "bytes")) return fail(2, "--tokenizer '%s': expected bytes or gpt2", tokenizer);
    if (gpt2 && (!vocab || !merges))
        return fail(2, "%s", "--tokenizer gpt2 needs --vocab vocab.json and --merges merges.txt (GPT-2's files; "
                             "lockstep downloads nothing)");
    if (!gpt2 && (vocab || merges))
        return fail(2, "%s", "--vocab/--merges are for --tokenizer gpt2 (bytes needs no files)");
    FILE *f = fopen(input, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (f) fclose(f);
        fprintf(stderr, "lockstep prepare: error: cannot read --input %s: %s\n", input, f ? "not a regular file" : strerror(errno));
        return 1;
    }
    size_t len = (size_t)sb.st_size;
    char *text = lk_malloc(len ? len : 1);
    bool ok = text && fread(text, 1, len, f) == len;
    fclose(f);
    if (!ok) {
        lk_free(text);
        return fail(1, "cannot read --input %s (short read or out of memory)", input);
    }
    if (len == 0) {
        lk_free(text);
        return fail(1, "--input %s is empty: nothing to tokenize", input);
    }
    lk_tokenizer *tok = NULL;
    lk_status st = gpt2 ? lk_tokenizer_gpt2_create(vocab, merges, &tok) : lk_tokenizer_bytes_create(&tok);
    /* meta.json records absolute paths, so generate finds them from anywhere */
    char av[PATH_MAX], am[PATH_MAX];
    if (gpt2 && !realpath(vocab, av)) snprintf(av, sizeof av, "%s", vocab);
    if (gpt2 && !realpath(merges, am)) snprintf(am, sizeof am, "%s", merges);
    char src[PATH_MAX];
    if (!realpath(input, src)) snprintf(src, sizeof src, "%s", input);
    int64_t ntr = 0, nva = 0;
    if (!st)
        st = lk__tokens_prepare_dir(out, text, len, tok, val_fraction, src, gpt2 ? av : NULL, gpt2 ? am : NULL, &ntr,
                                    &nva);
    int64_t vsize = lk_tokenizer_vocab_size(tok);
    lk_tokenizer_free(tok);
    lk_free(text);
    if (st) {
        fprintf(stderr, "lockstep prepare: error: %s\n", lk_last_error());
        return 1;
    }
    printf("%s: %zu bytes -> %lld tokens (%s, vocabulary %lld)\n", input, len, (long long)(ntr + nva), tokenizer,
           (long long)vsize);
    printf("wrote %s/train.bin  %lld tokens\n", out, (long long)ntr);
    printf("wrote %s/val.bin    %lld tokens\n", out, (long long)nva);
    printf("wrote %s/meta.json\n", out);
    return 0;
}

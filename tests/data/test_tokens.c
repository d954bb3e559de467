/* Token data for language models: the tokenizers (bytes round trip, GPT-2
 * BPE on a handmade vocabulary checked against a tokenisation derived by
 * hand), the tokens data module (random training windows reproducible from
 * the seed, sequential validation windows, two ranks' shards disjoint, the
 * Bible default, every bad-input error) and sampling from a tiny model. */
#include <sys/stat.h>
#include <unistd.h>

#include "lk_test.h"
#include "train/train_impl.h"

static char dir[256];

static const char *tmp(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/lk_test_tokens_%d", (int)getpid());
    mkdir(dir, 0777);
}

static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "cleanup of %s failed\n", dir);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
}

/* ---- tokenizers ------------------------------------------------------------------- */

static void bytes_roundtrip(void) {
    lk_tokenizer *t = NULL;
    CHECK_OK(lk_tokenizer_bytes_create(&t));
    CHECK(lk_tokenizer_vocab_size(t) == 256 && !strcmp(lk_tokenizer_kind(t), "bytes"));
    const char text[] = "In the beginning\n\xc3\xa9\x00\xff!";
    size_t n = sizeof text - 1;
    int32_t *tok = NULL;
    int64_t nt = 0;
    CHECK_OK(lk_tokenizer_encode(t, text, n, &tok, &nt));
    CHECK(nt == (int64_t)n);
    for (int64_t i = 0; tok && i < nt; i++) CHECK(tok[i] == (unsigned char)text[i]);
    char *back = NULL;
    size_t bl = 0;
    CHECK_OK(lk_tokenizer_decode(t, tok, nt, &back, &bl));
    CHECK(bl == n && back && !memcmp(back, text, n));
    lk_free(back);
    int32_t bad[] = {65, 256};
    CHECK_ERR(lk_tokenizer_decode(t, bad, 2, &back, &bl), LK_STATUS_INVALID_ARGUMENT,
              "token 256 at position 1 is not in the bytes vocabulary (size 256)");
    lk_free(tok);
    lk_tokenizer_free(t);

    /* prepare: train/val split on the text, llm.c files, meta.json */
    setup();
    char big[1000];
    for (int i = 0; i < 1000; i++) big[i] = (char)('a' + i % 26);
    CHECK_OK(lk_tokenizer_bytes_create(&t));
    int64_t ntr = 0, nva = 0;
    CHECK_OK(lk__tokens_prepare_dir(tmp("p"), big, 1000, t, 0.1, "test", NULL, NULL, &ntr, &nva));
    CHECK(ntr == 900 && nva == 100);
    int64_t cnt = 0;
    int largest = 0;
    CHECK_OK(lk_tokens_file_info(tmp("p/train.bin"), &cnt, &largest));
    CHECK(cnt == 900 && largest == 'z');
    struct stat sb;
    CHECK(stat(tmp("p/val.bin"), &sb) == 0 && sb.st_size == 1024 + 200);
    CHECK(access(tmp("p/meta.json"), R_OK) == 0);
    lk_tokenizer_free(t);
    teardown();
}

/* GPT-2's byte map, written independently of the library's: printable
 * Latin-1 maps to itself, the other bytes to 256, 257, ... in order. */
static unsigned cp_of(int b) {
    int next = 256;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
        if (c == b) return printable ? (unsigned)c : (unsigned)next;
        if (!printable) next++;
    }
    return 0;
}

static void bpe_handmade(void) {
    setup();
    /* vocab: the 256 byte symbols with id = byte, then the merged ones */
    FILE *f = fopen(tmp("vocab.json"), "w");
    fprintf(f, "{");
    for (int b = 0; b < 256; b++) fprintf(f, "%s\"\\u%04x\": %d", b ? ", " : "", cp_of(b), b);
    fprintf(f, ", \"he\": 256, \"ll\": 257, \"hell\": 258, \"\\u0120w\": 259, \"or\": 260, \"\\u0120wor\": 261, "
               "\"'s\": 262}");
    fclose(f);
    const char merges[] = "#version: 0.2\nh e\nl l\nhe ll\n\xc4\xa0 w\no r\n\xc4\xa0w or\n' s\n";
    write_file(tmp("merges.txt"), merges, sizeof merges - 1);
    lk_tokenizer *t = NULL;
    CHECK_OK(lk_tokenizer_gpt2_create(tmp("vocab.json"), tmp("merges.txt"), &t));
    if (!t) {
        teardown();
        return;
    }
    CHECK(lk_tokenizer_vocab_size(t) == 263 && !strcmp(lk_tokenizer_kind(t), "gpt2"));
    /* Worked out by hand from the pattern and the merge ranks:
     * "hello" -> h e l l o -> he ll o -> hell o        = 258 111
     * " world" -> Ġw o r l d -> Ġw or l d -> Ġwor l d   = 261 108 100
     * "'s" (a contraction piece) -> 's                  = 262
     * "\n\nhi": \s+(?!\S) takes "\n", then "\n" alone    = 10 10, then "hi" = 104 105
     * "  there": " " (whitespace before a word keeps its last space for it), " there" -> Ġ t he r e
     *                                                   = 32, 32 116 256 114 101
     * " don't" -> " don" + "'t"                         = 32 100 111 110, 39 116 */
    const char text[] = "hello world's\n\nhi  there don't";
    int32_t want[] = {258, 111, 261, 108, 100, 262, 10, 10, 104, 105, 32, 32, 116, 256, 114, 101, 32, 100, 111, 110, 39, 116};
    int nw = (int)(sizeof want / sizeof want[0]);
    int32_t *tok = NULL;
    int64_t n = 0;
    CHECK_OK(lk_tokenizer_encode(t, text, sizeof text - 1, &tok, &n));
    CHECK_MSG(n == nw, "%lld tokens, expected %d", (long long)n, nw);
    for (int i = 0; tok && i < nw && i < n; i++) CHECK_MSG(tok[i] == want[i], "token %d is %d, expected %d", i, tok[i], want[i]);
    char *back = NULL;
    size_t bl = 0;
    CHECK_OK(lk_tokenizer_decode(t, tok, n, &back, &bl));
    CHECK(back && bl == sizeof text - 1 && !memcmp(back, text, bl));
    lk_free(back);
    lk_free(tok);
    /* bytes outside ASCII survive (UTF-8 letters form one piece) */
    const char utf[] = " caf\xc3\xa9 \xe2\x82\xac""5";
    CHECK_OK(lk_tokenizer_encode(t, utf, sizeof utf - 1, &tok, &n));
    CHECK_OK(lk_tokenizer_decode(t, tok, n, &back, &bl));
    CHECK(back && bl == sizeof utf - 1 && !memcmp(back, utf, bl));
    lk_free(back);
    lk_free(tok);
    lk_tokenizer_free(t);
    /* bad files */
    write_file(tmp("bad_merges.txt"), "h e\nhe\n", 7);
    CHECK_ERR(lk_tokenizer_gpt2_create(tmp("vocab.json"), tmp("bad_merges.txt"), &t), LK_STATUS_INVALID_ARGUMENT,
              "bad_merges.txt:2: \"he\", expected two symbols separated by one space");
    write_file(tmp("small.json"), "{\"a\": 0}", 8);
    CHECK_ERR(lk_tokenizer_gpt2_create(tmp("small.json"), tmp("merges.txt"), &t), LK_STATUS_INVALID_ARGUMENT,
              "no token for byte 0x00");
    CHECK_ERR(lk_tokenizer_gpt2_create(tmp("none.json"), tmp("merges.txt"), &t), LK_STATUS_IO, "cannot open vocab file");
    CHECK(t == NULL);
    teardown();
}

/* ---- the data module ------------------------------------------------------------------ */

static lk_datamodule *make_dm(const lk_model_kv *kv, int n, uint64_t seed) {
    lk_datamodule *dm = NULL;
    CHECK_OK(lk_datamodule_create_builtin("tokens", kv, n, seed, &dm));
    return dm;
}

/* A corpus whose windows say where they start: token i is i % 251. */
static void write_corpus(const char *name, int64_t n) {
    uint16_t *t = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) t[i] = (uint16_t)(i % 251);
    CHECK_OK(lk_tokens_write(tmp(name), t, n));
    free(t);
}

static void windows(void) {
    setup();
    mkdir(tmp("c"), 0777);
    write_corpus("c/train.bin", 5000);
    write_corpus("c/val.bin", 100);
    lk_model_kv kv[] = {{"root", tmp("c")}, {"block_size", "8"}, {"samples_per_epoch", "64"}, {"num_workers", "0"}};
    lk_datamodule *a = make_dm(kv, 4, 7), *b = make_dm(kv, 4, 7), *c = make_dm(kv, 4, 8);
    if (!a || !b || !c) goto out;
    CHECK_OK(a->vt->setup(a, "fit"));
    CHECK_OK(b->vt->setup(b, "fit"));
    CHECK_OK(c->vt->setup(c, "fit"));
    lk_dataset *ta = a->vt->dataset(a, "train"), *tb = b->vt->dataset(b, "train"), *tc = c->vt->dataset(c, "train");
    lk_dataset *va = a->vt->dataset(a, "val");
    CHECK(ta && lk_dataset_len(ta) == 64);
    CHECK(va && lk_dataset_len(va) == 12); /* (100 - 1) / 8 non-overlapping windows */
    if (!ta || !va) goto out;
    int same_epoch = 0, differ_epoch = 0, differ_seed = 0;
    for (int64_t i = 0; i < 64; i++) {
        int64_t x[8], y[8], x2[8], y2[8], x3[8], y3[8], x4[8], y4[8];
        CHECK_OK(lk_dataset_get(ta, i, 3, (void *[]){x, y}));
        CHECK_OK(lk_dataset_get(tb, i, 3, (void *[]){x2, y2}));
        CHECK_OK(lk_dataset_get(ta, i, 4, (void *[]){x3, y3}));
        CHECK_OK(lk_dataset_get(tc, i, 3, (void *[]){x4, y4}));
        same_epoch += !memcmp(x, x2, sizeof x) && !memcmp(y, y2, sizeof y);
        differ_epoch += x[0] != x3[0];
        differ_seed += x[0] != x4[0];
        /* a window of the corpus: consecutive tokens, y one ahead of x */
        for (int k = 0; k < 8; k++) CHECK(y[k] == (x[k] + 1) % 251 && (k == 0 || x[k] == (x[k - 1] + 1) % 251));
    }
    CHECK(same_epoch == 64);                   /* (seed, epoch, sample) decides: reproducible */
    CHECK(differ_epoch > 50 && differ_seed > 50); /* another epoch or seed reads other windows */
    /* validation: sequential, non-overlapping */
    for (int64_t i = 0; i < 12; i++) {
        int64_t x[8], y[8];
        CHECK_OK(lk_dataset_get(va, i, 5, (void *[]){x, y}));
        CHECK(x[0] == i * 8 && y[7] == i * 8 + 8);
    }
    /* two ranks' shards of either split: disjoint, together everything */
    for (int split = 0; split < 2; split++) {
        int64_t len = split ? 12 : 64;
        int seen[64] = {0};
        for (int r = 0; r < 2; r++) {
            lk_sampler_config sc = {.len = len, .rank = r, .world_size = 2, .shuffle = !split, .seed = 7, .no_pad = split};
            lk_sampler *s = NULL;
            CHECK_OK(lk_sampler_create(&sc, &s));
            if (!s) continue;
            lk_sampler_set_epoch(s, 2);
            for (int64_t k = 0; k < lk_sampler_len(s); k++) seen[lk_sampler_indices(s)[k]]++;
            lk_sampler_free(s);
        }
        for (int64_t i = 0; i < len; i++) CHECK_MSG(seen[i] == 1, "split %d sample %lld seen %d times", split, (long long)i, seen[i]);
    }
    /* the model's vocab_size and block_size against the data */
    static const lk_model_arg margs[] = {{"vocab_size", LK_ARG_INT, "300", "v"}, {"block_size", LK_ARG_INT, "8", "b"}};
    lk_model_info mi = {.name = "toy", .args = margs, .n_args = 2};
    CHECK_OK(lk__dm_tokens_check_model(&mi, NULL, 0, a));
    CHECK_ERR(lk__dm_tokens_check_model(&mi, (lk_model_kv[]){{"vocab_size", "200"}}, 1, a), LK_STATUS_INVALID_ARGUMENT,
              "model toy has model.init_args.vocab_size 200, but the token data");
    CHECK_ERR(lk__dm_tokens_check_model(&mi, (lk_model_kv[]){{"block_size", "4"}}, 1, a), LK_STATUS_INVALID_ARGUMENT,
              "data.init_args.block_size 8 is longer than model toy's model.init_args.block_size 4");
out:
    lk_datamodule_free(a);
    lk_datamodule_free(b);
    lk_datamodule_free(c);
    teardown();
}

static void bad_input(void) {
    setup();
    mkdir(tmp("c"), 0777);
    write_corpus("c/train.bin", 300);
    write_corpus("c/val.bin", 40);
    lk_datamodule *dm = NULL;
    /* a missing file: its path and the setting that named it */
    dm = make_dm((lk_model_kv[]){{"root", tmp("none")}}, 1, 0);
    if (dm) CHECK_ERR(dm->vt->setup(dm, "fit"), LK_STATUS_IO, "/none/train.bin: No such file or directory (named by data.init_args.root)");
    lk_datamodule_free(dm);
    dm = make_dm((lk_model_kv[]){{"train_path", tmp("c/train.bin")}, {"val_path", tmp("c/nothere.bin")}, {"block_size", "8"}}, 3, 0);
    if (dm) CHECK_ERR(dm->vt->setup(dm, "fit"), LK_STATUS_IO, "nothere.bin: No such file or directory (named by data.init_args.val_path)");
    lk_datamodule_free(dm);
    /* a header whose count disagrees with the size */
    int32_t head[256] = {20240520, 1, 500};
    uint16_t toks[300] = {0};
    FILE *f = fopen(tmp("bad.bin"), "wb");
    fwrite(head, 4, 256, f);
    fwrite(toks, 2, 300, f);
    fclose(f);
    dm = make_dm((lk_model_kv[]){{"train_path", tmp("bad.bin")}, {"val_path", tmp("c/val.bin")}, {"block_size", "8"}}, 3, 0);
    if (dm) CHECK_ERR(dm->vt->setup(dm, "fit"), LK_STATUS_IO, "header says 500 tokens (1000 bytes after the header), the file has 600; expected 2024 bytes");
    lk_datamodule_free(dm);
    write_file(tmp("odd.bin"), toks, 5);
    dm = make_dm((lk_model_kv[]){{"train_path", tmp("odd.bin")}, {"val_path", tmp("c/val.bin")}}, 2, 0);
    if (dm) CHECK_ERR(dm->vt->setup(dm, "fit"), LK_STATUS_INVALID_ARGUMENT, "data tokens (data.init_args.train_path): ");
    lk_datamodule_free(dm);
    /* block_size + 1 longer than the data */
    dm = make_dm((lk_model_kv[]){{"root", tmp("c")}, {"block_size", "40"}}, 2, 0);
    if (dm) CHECK_ERR(dm->vt->setup(dm, "fit"), LK_STATUS_INVALID_ARGUMENT,
                      "val.bin has 40 tokens, but data.init_args.block_size 40 needs 41 per window (block_size + 1); use a block_size of at most 39");
    lk_datamodule_free(dm);
    /* tokens outside the vocabulary: the largest token and the vocabulary */
    dm = make_dm((lk_model_kv[]){{"root", tmp("c")}, {"block_size", "8"}, {"vocab_size", "200"}}, 3, 0);
    if (dm) CHECK_ERR(dm->vt->setup(dm, "fit"), LK_STATUS_INVALID_ARGUMENT,
                      "train.bin holds token 250, outside a vocabulary of 200 (data.init_args.vocab_size)");
    lk_datamodule_free(dm);
    /* meta.json's vocabulary when vocab_size is 0 */
    write_file(tmp("c/meta.json"), "{\"tokenizer\": \"bytes\", \"vocab_size\": 100}", 42);
    dm = make_dm((lk_model_kv[]){{"root", tmp("c")}, {"block_size", "8"}}, 2, 0);
    if (dm) CHECK_ERR(dm->vt->setup(dm, "fit"), LK_STATUS_INVALID_ARGUMENT, "outside a vocabulary of 100 (the vocab_size of meta.json beside it)");
    lk_datamodule_free(dm);
    /* settings */
    CHECK_ERR(lk_datamodule_create_builtin("tokens", (lk_model_kv[]){{"block_sise", "8"}}, 1, 0, &dm),
              LK_STATUS_INVALID_ARGUMENT, "block_size");
    CHECK_ERR(lk_datamodule_create_builtin("tokens", (lk_model_kv[]){{"val_path", "v.bin"}}, 1, 0, &dm),
              LK_STATUS_INVALID_ARGUMENT, "val_path is set without train_path or root");
    teardown();
}

/* The default corpus: the King James Bible from Debian's bible-kjv,
 * prepared by the data module's prepare_data into $LK_DATA_ROOT/bible-kjv. */
static void bible_default(void) {
    if (access("/usr/bin/bible", X_OK) != 0) {
        printf("SKIP bible_default: /usr/bin/bible absent (scripts/deps.sh installs bible-kjv)\n");
        return;
    }
    setup();
    setenv("LK_DATA_ROOT", dir, 1);
    lk_datamodule *dm = make_dm((lk_model_kv[]){{"block_size", "64"}, {"num_workers", "0"}}, 2, 1);
    if (dm) {
        CHECK_OK(dm->vt->prepare_data(dm));
        CHECK_OK(dm->vt->setup(dm, "fit"));
        int64_t ntr = 0, nva = 0;
        int largest = 0;
        CHECK_OK(lk_tokens_file_info(tmp("bible-kjv/train.bin"), &ntr, &largest));
        CHECK_OK(lk_tokens_file_info(tmp("bible-kjv/val.bin"), &nva, NULL));
        CHECK_MSG(ntr + nva > 4000000 && nva > 400000 && largest < 128, "%lld + %lld tokens, largest %d", (long long)ntr,
                  (long long)nva, largest);
        lk_dataset *va = dm->vt->dataset(dm, "val");
        CHECK(va && lk_dataset_len(va) == (nva - 1) / 64);
        /* the text starts at Genesis */
        lk_dataset *tr = dm->vt->dataset(dm, "train");
        lk_tokens_config c = lk_tokens_config_default();
        c.seq_len = 24;
        lk_dataset *seq = NULL;
        CHECK_OK(lk_dataset_tokens_create(tmp("bible-kjv/train.bin"), &c, &seq));
        int64_t x[24], y[24];
        if (seq) CHECK_OK(lk_dataset_get(seq, 0, 0, (void *[]){x, y}));
        char s[25] = {0};
        for (int i = 0; seq && i < 24; i++) s[i] = (char)x[i];
        CHECK_MSG(!strcmp(s, "\nGenesis 1\n\n  1 In the b"), "starts with \"%s\"", s);
        lk_dataset_free(seq);
        CHECK(tr && lk_dataset_len(tr) == (ntr - 1) / 64);
        /* a second prepare finds the files and does nothing */
        struct stat a, b;
        stat(tmp("bible-kjv/train.bin"), &a);
        CHECK_OK(dm->vt->prepare_data(dm));
        stat(tmp("bible-kjv/train.bin"), &b);
        CHECK(a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec);
    }
    lk_datamodule_free(dm);
    unsetenv("LK_DATA_ROOT");
    teardown();
}

/* ---- generation --------------------------------------------------------------------- */

static lk_layer *tiny_lm(int64_t V, uint64_t seed) {
    lk_rng rng;
    lk_rng_init(&rng, seed, LK_RNG_INIT, 0, 0);
    lk_layer *parts[2] = {lk_embedding_create(V, 8, &rng), lk_linear_create(8, V, true, &rng)};
    return lk_sequential_create(2, parts);
}

/* logits [t, V] instead of [1, t, V] */
static lk_tensor *squash_forward(lk_layer *self, lk_tensor *x) {
    return lk_reshape(lk_layer_forward(lk_layer_child(self, 0), x), 2, (int64_t[]){-1, 3});
}

static void generate(void) {
    lk_layer *net = tiny_lm(11, 5);
    CHECK(net != NULL);
    if (!net) return;
    int64_t prompt[] = {1, 2, 3};
    lk_generate_config c = lk_generate_config_default();
    c.max_new_tokens = 20;
    c.seed = 42;
    c.block_size = 4;
    int64_t *a = NULL, *b = NULL, *g = NULL, na = 0, nb = 0, ng = 0;
    CHECK_OK(lk_generate(net, prompt, 3, &c, &a, &na));
    CHECK_OK(lk_generate(net, prompt, 3, &c, &b, &nb));
    CHECK(na == 23 && nb == 23 && a && b && !memcmp(a, b, sizeof *a * 23)); /* the seed decides */
    for (int64_t i = 0; a && i < na; i++) CHECK(a[i] >= 0 && a[i] < 11);
    CHECK(a && a[0] == 1 && a[1] == 2 && a[2] == 3);
    c.seed = 43;
    lk_free(b);
    CHECK_OK(lk_generate(net, prompt, 3, &c, &b, &nb));
    CHECK(b && memcmp(a, b, sizeof *a * 23) != 0);
    /* top_k 1 is greedy: each token the argmax of the model's logits on the
     * last block_size tokens, computed here without the sampler */
    c.top_k = 1;
    c.temperature = 0.5;
    CHECK_OK(lk_generate(net, prompt, 3, &c, &g, &ng));
    for (int64_t n = 3; g && n < ng; n++) {
        int64_t t = n > 4 ? 4 : n;
        lk_scope_begin();
        lk_tensor *x = lk_scope_adopt(lk_tensor_from_data(LK_I64, 2, (int64_t[]){1, t}, g + n - t));
        lk_tensor *y = lk_layer_forward(net, x);
        const float *row = (const float *)y->data + (t - 1) * 11;
        int64_t best = 0;
        for (int64_t v = 1; v < 11; v++)
            if (row[v] > row[best]) best = v;
        CHECK_MSG(g[n] == best, "greedy token %lld is %lld, argmax %lld", (long long)n, (long long)g[n], (long long)best);
        lk_scope_end();
    }
    lk_free(a);
    lk_free(b);
    lk_free(g);
    /* errors */
    c = lk_generate_config_default();
    int64_t *o = NULL, no = 0;
    CHECK_ERR(lk_generate(net, prompt, 0, &c, &o, &no), LK_STATUS_INVALID_ARGUMENT, "the prompt is empty");
    CHECK_ERR(lk_generate(net, (int64_t[]){1, 11}, 2, &c, &o, &no), LK_STATUS_INVALID_ARGUMENT,
              "prompt token 1 is 11, outside the model's vocabulary of 11");
    c.max_new_tokens = 0;
    CHECK_ERR(lk_generate(net, prompt, 3, &c, &o, &no), LK_STATUS_INVALID_ARGUMENT, "max_new_tokens 0, expected >= 1");
    c = lk_generate_config_default();
    c.temperature = 0;
    CHECK_ERR(lk_generate(net, prompt, 3, &c, &o, &no), LK_STATUS_INVALID_ARGUMENT, "temperature 0, expected > 0");
    c = lk_generate_config_default();
    c.top_k = -1;
    CHECK_ERR(lk_generate(net, prompt, 3, &c, &o, &no), LK_STATUS_INVALID_ARGUMENT, "top_k -1, expected >= 0");
    CHECK(o == NULL && net->training); /* eval mode only while generating */
    lk_layer_free(net);
    /* a model that does not map tokens to [1, t, V] */
    lk_rng rng;
    lk_rng_init(&rng, 1, LK_RNG_INIT, 0, 0);
    lk_layer *sq = lk_layer_create("Squash", squash_forward, NULL, NULL);
    CHECK_OK(lk_layer_add_child(sq, "emb", lk_embedding_create(5, 3, &rng)));
    c = lk_generate_config_default();
    CHECK_ERR(lk_generate(sq, prompt, 3, &c, &o, &no), LK_STATUS_INVALID_ARGUMENT,
              "generate: the model maps tokens [1, 1] to [1, 3]; generation needs logits [1, 1, vocab_size]");
    lk_layer_free(sq);
}

LK_TEST_MAIN(LK_TEST_CASE(bytes_roundtrip), LK_TEST_CASE(bpe_handmade), LK_TEST_CASE(windows), LK_TEST_CASE(bad_input),
             LK_TEST_CASE(bible_default), LK_TEST_CASE(generate))

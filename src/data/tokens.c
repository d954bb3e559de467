/* Token files for language models: u16 token streams, either with llm.c's
 * 1 KiB header (magic 20240520, version 1, token count) or raw as nanoGPT
 * writes them. The file is mapped read-only, so a corpus larger than memory
 * costs only what the loader touches and every worker reads it without
 * locks. Windows of seq_len + 1 tokens become ("x", "y") pairs: at fixed
 * strides (validation: sequential, non-overlapping), or, with `samples`
 * set, at positions drawn from (seed, epoch, sample index) — nanoGPT's
 * random training batches made reproducible, so a resumed epoch reads the
 * same windows. Also the writer of llm.c's format (lockstep prepare). */
#include "data/data_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_BYTES 1024

lk_tokens_config lk_tokens_config_default(void) {
    lk_tokens_config c = {0, 0, LK_I64, 0, 0, 0};
    return c;
}

typedef struct {
    void *map;
    size_t map_bytes;
    const uint16_t *tokens;
    int64_t ntokens, seq_len, stride;
    lk_dtype dtype;
    bool random;
    uint64_t seed;
} tokens_ctx;

/* The first token of sample `index` of `epoch`: a Philox draw keyed by the
 * seed and (epoch, index) in random mode, so it depends on nothing else
 * (not the rank, the worker or what was read before). */
static int64_t window_start(const tokens_ctx *c, int64_t index, uint64_t epoch) {
    if (!c->random) return index * c->stride;
    lk_rng r;
    lk_rng_init(&r, c->seed, LK_RNG_DATA, (uint32_t)epoch, (uint32_t)index);
    uint64_t span = (uint64_t)(c->ntokens - c->seq_len); /* starts 0 .. ntokens - seq_len - 1 */
    return (int64_t)(lk_rng_u64(&r) % span); /* span << 2^64: the modulo's bias is negligible */
}

static lk_status tokens_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    const tokens_ctx *c = ctx;
    const uint16_t *t = c->tokens + window_start(c, index, epoch);
    if (c->dtype == LK_I64) {
        int64_t *x = out[0], *y = out[1];
        for (int64_t i = 0; i < c->seq_len; i++) x[i] = t[i], y[i] = t[i + 1];
    } else {
        int32_t *x = out[0], *y = out[1];
        for (int64_t i = 0; i < c->seq_len; i++) x[i] = t[i], y[i] = t[i + 1];
    }
    return LK_STATUS_OK;
}

static void tokens_free(void *ctx) {
    tokens_ctx *c = ctx;
    if (c->map) munmap(c->map, c->map_bytes);
    lk_free(c);
}

static const lk_dataset_vtable tokens_vt = {"tokens", tokens_get, tokens_free, NULL};

/* Maps `path` and checks its header and size: *c gets the map and the
 * tokens; on failure nothing is left mapped. */
static lk_status tokens_open(const char *path, tokens_ctx *c) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lk_error(LK_STATUS_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat s;
    if (fstat(fd, &s) != 0 || !S_ISREG(s.st_mode)) {
        close(fd);
        return lk_error(LK_STATUS_IO, "%s: not a regular file", path);
    }
    size_t bytes = (size_t)s.st_size;
    if (bytes < 4) {
        close(fd);
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "%s: %zu bytes is too short for a token file (expected llm.c's 1024-byte header and u16 tokens, "
                        "or raw u16 tokens)",
                        path, bytes);
    }
    void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return lk_error(LK_STATUS_IO, "%s: mmap of %zu bytes failed: %s", path, bytes, strerror(errno));
    c->map = map;
    c->map_bytes = bytes;
    lk_status st = LK_STATUS_OK;
    int32_t head[3] = {0, 0, 0};
    if (bytes >= sizeof head) memcpy(head, map, sizeof head);
    if (head[0] == LLMC_MAGIC) {
        if (head[1] != 1)
            st = lk_error(LK_STATUS_UNSUPPORTED, "%s: llm.c token file version %d, expected 1 (u16 tokens)", path, head[1]);
        else if (bytes < LLMC_HEADER_BYTES || head[2] < 0 ||
                 (uint64_t)head[2] * 2 != bytes - LLMC_HEADER_BYTES)
            st = lk_error(LK_STATUS_IO,
                          "%s: header says %d tokens (%lld bytes after the header), the file has %lld; expected %lld "
                          "bytes in all (1024-byte header + 2 per token): truncated, or not written for this header",
                          path, head[2], (long long)head[2] * 2, (long long)bytes - LLMC_HEADER_BYTES,
                          (long long)LLMC_HEADER_BYTES + 2 * (long long)head[2]);
        c->tokens = (const uint16_t *)((const char *)map + LLMC_HEADER_BYTES);
        c->ntokens = head[2];
    } else {
        if (bytes % 2)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "%s: no llm.c header (magic %d) and an odd size (%zu bytes), so not raw u16 tokens either",
                          path, LLMC_MAGIC, bytes);
        c->tokens = map;
        c->ntokens = (int64_t)(bytes / 2);
    }
    if (st) {
        munmap(map, bytes);
        c->map = NULL;
    }
    return st;
}

static int max_token(const tokens_ctx *c) {
    uint16_t m = 0;
    for (int64_t i = 0; i < c->ntokens; i++) m = c->tokens[i] > m ? c->tokens[i] : m;
    return m;
}

lk_status lk_tokens_file_info(const char *path, int64_t *ntokens, int *largest) {
    tokens_ctx c = {0};
    LK_TRY(tokens_open(path, &c));
    if (ntokens) *ntokens = c.ntokens;
    if (largest) *largest = c.ntokens ? max_token(&c) : -1;
    munmap(c.map, c.map_bytes);
    return LK_STATUS_OK;
}

lk_status lk_dataset_tokens_create(const char *path, const lk_tokens_config *cfg, lk_dataset **out) {
    *out = NULL;
    if (cfg->seq_len < 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tokens %s: seq_len %lld, expected >= 1", path,
                        (long long)cfg->seq_len);
    if (cfg->stride < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tokens %s: stride %lld, expected >= 0", path, (long long)cfg->stride);
    if (cfg->samples < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tokens %s: samples %lld, expected >= 0", path,
                        (long long)cfg->samples);
    if (cfg->dtype != LK_I64 && cfg->dtype != LK_I32)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tokens %s: dtype %d, expected i64 or i32", path, (int)cfg->dtype);
    tokens_ctx *c = lk_calloc(1, sizeof *c);
    if (!c) return LK_STATUS_OUT_OF_MEMORY;
    lk_status st = tokens_open(path, c);
    if (st) {
        lk_free(c);
        return st;
    }
    c->seq_len = cfg->seq_len;
    c->stride = cfg->stride ? cfg->stride : cfg->seq_len;
    c->dtype = cfg->dtype;
    c->random = cfg->samples > 0;
    c->seed = cfg->seed;
    if (c->ntokens < c->seq_len + 1)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %lld tokens, fewer than one window of seq_len + 1 = %lld", path,
                      (long long)c->ntokens, (long long)c->seq_len + 1);
    if (!st && cfg->vocab_size > 0)
        for (int64_t i = 0; i < c->ntokens; i++)
            if (c->tokens[i] >= cfg->vocab_size) {
                st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                              "%s: token %lld is %u, expected < vocab_size %lld (the largest token in the file is %d: "
                              "a vocabulary of at least %d, or data tokenized for this one)",
                              path, (long long)i, c->tokens[i], (long long)cfg->vocab_size, max_token(c),
                              max_token(c) + 1);
                break;
            }
    if (st) {
        tokens_free(c);
        return st;
    }
    int64_t n = c->random ? cfg->samples : (c->ntokens - 1 - c->seq_len) / c->stride + 1;
    lk_field f[2];
    lk__field_init(&f[0], "x", 0, cfg->dtype, 1, &c->seq_len);
    lk__field_init(&f[1], "y", 1, cfg->dtype, 1, &c->seq_len);
    return lk_dataset_create(&tokens_vt, c, n, 2, f, 0, out);
}

/* llm.c's layout: 256 little-endian i32 (magic, version 1, count, zeros),
 * then the u16 tokens. */
typedef struct {
    const uint16_t *tokens;
    int64_t n;
} tokens_body;

static lk_status tokens_write_body(const char *tmp, const void *ctx) {
    const tokens_body *b = ctx;
    int32_t head[256] = {LLMC_MAGIC, 1, (int32_t)b->n};
    FILE *f = fopen(tmp, "wb");
    if (!f) return lk_error(LK_STATUS_IO, "cannot create %s: %s", tmp, strerror(errno));
    bool ok = fwrite(head, sizeof head, 1, f) == 1 &&
              (b->n == 0 || fwrite(b->tokens, 2, (size_t)b->n, f) == (size_t)b->n);
    if (fclose(f) != 0) ok = false;
    return ok ? LK_STATUS_OK : lk_error(LK_STATUS_IO, "%s: write failed (disk full?): %s", tmp, strerror(errno));
}

lk_status lk_tokens_write(const char *path, const uint16_t *tokens, int64_t n) {
    if (n < 0 || n > INT32_MAX)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "tokens write %s: %lld tokens; llm.c's header holds at most %d (split the corpus into shards)",
                        path, (long long)n, INT32_MAX);
    tokens_body b = {tokens, n};
    return lk__write_atomic(path, tokens_write_body, &b);
}

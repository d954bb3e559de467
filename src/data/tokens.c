/* Token files for language models: u16 token streams, either with llm.c's
 * 1 KiB header (magic 20240520, version 1, token count) or raw as nanoGPT
 * writes them. The file is mapped read-only, so a corpus larger than memory
 * costs only what the loader touches and every worker reads it without
 * locks. Windows of seq_len + 1 tokens become ("x", "y") pairs. */
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
    lk_tokens_config c = {0, 0, LK_I64, 0};
    return c;
}

typedef struct {
    void *map;
    size_t map_bytes;
    const uint16_t *tokens;
    int64_t ntokens, seq_len, stride;
    lk_dtype dtype;
} tokens_ctx;

static lk_status tokens_get(void *ctx, int64_t index, uint64_t epoch, void *scratch, void *const *out) {
    const tokens_ctx *c = ctx;
    const uint16_t *t = c->tokens + index * c->stride;
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

lk_status lk_dataset_tokens_create(const char *path, const lk_tokens_config *cfg, lk_dataset **out) {
    *out = NULL;
    if (cfg->seq_len < 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tokens %s: seq_len %lld, expected >= 1", path,
                        (long long)cfg->seq_len);
    if (cfg->stride < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tokens %s: stride %lld, expected >= 0", path, (long long)cfg->stride);
    if (cfg->dtype != LK_I64 && cfg->dtype != LK_I32)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "tokens %s: dtype %d, expected i64 or i32", path, (int)cfg->dtype);
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
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %zu bytes is too short for a token file", path, bytes);
    }
    void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return lk_error(LK_STATUS_IO, "%s: mmap of %zu bytes failed: %s", path, bytes, strerror(errno));
    tokens_ctx *c = lk_calloc(1, sizeof *c);
    if (!c) {
        munmap(map, bytes);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    c->map = map;
    c->map_bytes = bytes;
    c->seq_len = cfg->seq_len;
    c->stride = cfg->stride ? cfg->stride : cfg->seq_len;
    c->dtype = cfg->dtype;
    lk_status st = LK_STATUS_OK;
    int32_t head[3] = {0, 0, 0};
    if (bytes >= sizeof head) memcpy(head, map, sizeof head);
    if (head[0] == LLMC_MAGIC) {
        if (head[1] != 1)
            st = lk_error(LK_STATUS_UNSUPPORTED, "%s: llm.c token file version %d, expected 1 (u16 tokens)", path, head[1]);
        else if (bytes < LLMC_HEADER_BYTES || head[2] < 0 ||
                 (uint64_t)head[2] * 2 != bytes - LLMC_HEADER_BYTES)
            st = lk_error(LK_STATUS_IO, "%s: header says %d tokens (%lld bytes after the header), the file has %lld",
                          path, head[2], (long long)head[2] * 2, (long long)bytes - LLMC_HEADER_BYTES);
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
    if (!st && c->ntokens < c->seq_len + 1)
        st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: %lld tokens, fewer than one window of seq_len + 1 = %lld", path,
                      (long long)c->ntokens, (long long)c->seq_len + 1);
    if (!st && cfg->vocab_size > 0)
        for (int64_t i = 0; i < c->ntokens; i++)
            if (c->tokens[i] >= cfg->vocab_size) {
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "%s: token %lld is %u, expected < vocab_size %lld", path,
                              (long long)i, c->tokens[i], (long long)cfg->vocab_size);
                break;
            }
    if (st) {
        tokens_free(c);
        return st;
    }
    int64_t n = (c->ntokens - 1 - c->seq_len) / c->stride + 1;
    lk_field f[2];
    lk__field_init(&f[0], "x", 0, cfg->dtype, 1, &c->seq_len);
    lk__field_init(&f[1], "y", 1, cfg->dtype, 1, &c->seq_len);
    return lk_dataset_create(&tokens_vt, c, n, 2, f, 0, out);
}

/* The distributed sampler: one permutation of the dataset per epoch, the
 * same on every rank because it is drawn from the Philox stream keyed by
 * (seed, epoch) alone, padded or cut to a multiple of the world size, then
 * dealt out round-robin (rank r takes positions r, r + W, ...), which is
 * PyTorch's DistributedSampler layout. All memory is allocated at
 * creation: changing epoch allocates nothing. */
#include "data/data_internal.h"

struct lk_sampler {
    lk_sampler_config cfg;
    int64_t per_rank;
    int64_t *perm;    /* [len] */
    int64_t *indices; /* [per_rank] */
};

lk_status lk_sampler_create(const lk_sampler_config *cfg, lk_sampler **out) {
    *out = NULL;
    if (cfg->len < 0) return lk_error(LK_STATUS_INVALID_ARGUMENT, "sampler: dataset length %lld, expected >= 0", (long long)cfg->len);
    if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "sampler: rank %d of world size %d; expected 0 <= rank < world_size",
                        cfg->rank, cfg->world_size);
    int64_t w = cfg->world_size;
    int64_t per = cfg->drop_last ? cfg->len / w : (cfg->len + w - 1) / w;
    if (!cfg->drop_last && cfg->len == 0) per = 0;
    if (cfg->no_pad) per = cfg->len > cfg->rank ? (cfg->len - cfg->rank + w - 1) / w : 0;
    lk_sampler *s = lk_calloc(1, sizeof *s);
    if (!s) return LK_STATUS_OUT_OF_MEMORY;
    s->cfg = *cfg;
    s->per_rank = per;
    s->perm = lk_malloc((size_t)(cfg->len ? cfg->len : 1) * sizeof *s->perm);
    s->indices = lk_malloc((size_t)(per ? per : 1) * sizeof *s->indices);
    if (!s->perm || !s->indices) {
        lk_sampler_free(s);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    lk_sampler_set_epoch(s, 0);
    *out = s;
    return LK_STATUS_OK;
}

void lk_sampler_free(lk_sampler *s) {
    if (!s) return;
    lk_free(s->perm);
    lk_free(s->indices);
    lk_free(s);
}

void lk_sampler_set_epoch(lk_sampler *s, uint64_t epoch) {
    int64_t n = s->cfg.len;
    for (int64_t i = 0; i < n; i++) s->perm[i] = i;
    if (s->cfg.shuffle) {
        lk_rng r;
        lk_rng_init(&r, s->cfg.seed, LK_RNG_SHUFFLE, (uint32_t)epoch, (uint32_t)(epoch >> 32));
        lk_rng_shuffle_i64(&r, s->perm, n);
    }
    /* Position p of the padded permutation is perm[p mod n]: padding repeats
     * the start, as often as needed when n < world size. */
    int64_t w = s->cfg.world_size;
    for (int64_t k = 0; k < s->per_rank; k++) s->indices[k] = s->perm[(s->cfg.rank + k * w) % n];
}

int64_t lk_sampler_len(const lk_sampler *s) { return s->per_rank; }
const int64_t *lk_sampler_indices(const lk_sampler *s) { return s->indices; }

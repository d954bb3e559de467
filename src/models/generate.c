/* Autoregressive sampling from a language model: any layer whose forward
 * maps i64 tokens [1, t] to logits [1, t, V]. Each step feeds the last
 * block_size tokens (the model's context), takes the last position's
 * logits, divides by the temperature, keeps the top k and draws the next
 * token from their softmax with a Philox stream keyed by the seed — so a
 * seed gives the same text on any machine, as nanoGPT's sample.py does
 * with torch.manual_seed (the draws differ from PyTorch's, not the method). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lockstep/autograd.h"
#include "lockstep/device.h"
#include "lockstep/models.h"

lk_generate_config lk_generate_config_default(void) {
    lk_generate_config c = {.max_new_tokens = 256, .temperature = 1.0, .top_k = 0, .block_size = 0, .seed = 0};
    return c;
}

/* The model's logits for tokens ctx[0..t): the last position's V values
 * into *row (lk_malloc'd on the first call, V into *vocab). */
static lk_status last_logits(lk_layer *net, const int64_t *ctx, int64_t t, float **row, int64_t *vocab) {
    lk_status st = LK_STATUS_OK;
    lk_scope_begin();
    lk_tensor *x = lk_scope_adopt(lk_tensor_from_data(LK_I64, 2, (int64_t[]){1, t}, ctx));
    lk_tensor *y = x ? lk_layer_forward(net, x) : NULL;
    if (!y) {
        st = lk_last_status();
        goto out;
    }
    if (y->ndim != 3 || y->shape[0] != 1 || y->shape[1] != t || y->shape[2] < 1) {
        char s[96];
        st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                      "generate: the model maps tokens [1, %lld] to %s; generation needs logits [1, %lld, vocab_size]",
                      (long long)t, lk_shape_str(y, s, sizeof s), (long long)t);
        goto out;
    }
    int64_t V = y->shape[2];
    if (*row && *vocab != V) {
        st = lk_error(LK_STATUS_INTERNAL, "generate: the model's vocabulary changed from %lld to %lld", (long long)*vocab,
                      (long long)V);
        goto out;
    }
    if (!*row && !(*row = lk_malloc((size_t)V * sizeof **row))) {
        st = LK_STATUS_OUT_OF_MEMORY;
        goto out;
    }
    *vocab = V;
    lk_tensor *sl = lk_slice(y, 1, t - 1, t), *last = sl ? lk_contiguous(sl) : NULL;
    lk_tensor *f = last ? lk_tensor_cast(last, LK_F32) : NULL;
    if (!f) {
        st = lk_last_status();
        goto out;
    }
    st = lk_device_copy(LK_DEVICE_CPU, *row, f->device, f->data, (size_t)V * sizeof(float));
    lk_tensor_release(f);
out:
    lk_scope_end();
    return st;
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* One token drawn from softmax(logits / T) over the top k (ties at the
 * k-th value kept, as nanoGPT's `logits < v[-1]` mask does). */
static int64_t sample(float *logits, int64_t V, const lk_generate_config *c, float *scratch, lk_rng *rng) {
    float thresh = -INFINITY;
    if (c->top_k > 0 && c->top_k < V) {
        memcpy(scratch, logits, (size_t)V * sizeof *scratch);
        qsort(scratch, (size_t)V, sizeof *scratch, cmp_desc);
        thresh = scratch[c->top_k - 1];
    }
    float mx = -INFINITY;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] >= thresh && logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int64_t i = 0; i < V; i++) {
        double p = logits[i] >= thresh ? exp(((double)logits[i] - mx) / c->temperature) : 0.0;
        scratch[i] = (float)p;
        sum += p;
    }
    double u = lk_rng_uniform_f64(rng) * sum, acc = 0;
    int64_t last = 0;
    for (int64_t i = 0; i < V; i++) {
        if (scratch[i] <= 0) continue;
        last = i;
        acc += scratch[i];
        if (u < acc) return i;
    }
    return last; /* rounding left u at the very top */
}

lk_status lk_generate(lk_layer *net, const int64_t *prompt, int64_t n_prompt, const lk_generate_config *cfg,
                      int64_t **out, int64_t *n_out) {
    *out = NULL;
    *n_out = 0;
    if (!net) return lk_error(LK_STATUS_INVALID_ARGUMENT, "generate: no model");
    if (n_prompt < 1) return lk_error(LK_STATUS_INVALID_ARGUMENT, "generate: the prompt is empty; expected at least one token");
    if (cfg->max_new_tokens < 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "generate: max_new_tokens %lld, expected >= 1",
                        (long long)cfg->max_new_tokens);
    if (!(cfg->temperature > 0) || !isfinite(cfg->temperature))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "generate: temperature %g, expected > 0 (a small value is nearly greedy)",
                        cfg->temperature);
    if (cfg->top_k < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "generate: top_k %lld, expected >= 0 (0: every token)",
                        (long long)cfg->top_k);
    if (cfg->block_size < 0)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "generate: block_size %lld, expected >= 0 (0: no crop)",
                        (long long)cfg->block_size);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "generate: prompt token %lld is %lld, expected >= 0", (long long)i,
                            (long long)prompt[i]);
    int64_t total = n_prompt + cfg->max_new_tokens;
    int64_t *seq = lk_malloc((size_t)total * sizeof *seq);
    if (!seq) return LK_STATUS_OUT_OF_MEMORY;
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    bool was_training = net->training, grad = lk_set_grad_enabled(false);
    lk_layer_train(net, false); /* dropout off, as model.eval() */
    float *row = NULL, *scratch = NULL;
    int64_t V = 0;
    /* The vocabulary from one token first, so a prompt token outside it is
     * an error naming it rather than an embedding lookup out of range. */
    lk_status st = last_logits(net, (int64_t[]){0}, 1, &row, &V);
    for (int64_t i = 0; !st && i < n_prompt; i++)
        if (prompt[i] >= V)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "generate: prompt token %lld is %lld, outside the model's vocabulary of %lld (its logits' last "
                          "dimension)",
                          (long long)i, (long long)prompt[i], (long long)V);
    if (!st && !(scratch = lk_malloc((size_t)V * sizeof *scratch))) st = LK_STATUS_OUT_OF_MEMORY;
    lk_rng rng;
    lk_rng_init(&rng, cfg->seed, LK_RNG_USER + 1, 0, 0);
    for (int64_t n = n_prompt; !st && n < total; n++) {
        int64_t t = cfg->block_size > 0 && n > cfg->block_size ? cfg->block_size : n;
        st = last_logits(net, seq + n - t, t, &row, &V);
        if (!st) seq[n] = sample(row, V, cfg, scratch, &rng);
    }
    lk_layer_train(net, was_training);
    lk_set_grad_enabled(grad);
    lk_free(row);
    lk_free(scratch);
    if (st) {
        lk_free(seq);
        return st;
    }
    *out = seq;
    *n_out = total;
    return LK_STATUS_OK;
}

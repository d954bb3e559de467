/* The gpt: nanoGPT's GPT-2 (model.py) with its module names, so a state
 * dict loads into nanoGPT's GPT with strict=True and the other way round.
 *
 *   GPT
 *   ├ transformer
 *   │  ├ wte   Embedding [V, C]      token embedding (tied to lm_head.weight)
 *   │  ├ wpe   Embedding [block, C]  position embedding
 *   │  ├ drop  Dropout
 *   │  ├ h     0 .. n_layer-1: Block
 *   │  │       ├ ln_1  LayerNorm [C]
 *   │  │       ├ attn  c_attn Linear C -> 3C, causal self-attention
 *   │  │       │       (lk_causal_self_attention; attn_dropout's stream
 *   │  │       │       drops probabilities), c_proj Linear C -> C, resid_dropout
 *   │  │       ├ ln_2  LayerNorm [C]
 *   │  │       └ mlp   c_fc C -> 4C, GELU (exact), c_proj 4C -> C, dropout
 *   │  └ ln_f  LayerNorm [C]
 *   └ lm_head  Linear C -> V, no bias, weight tied to transformer.wte.weight
 *
 * x = drop(wte(idx) + wpe(0..T-1)); x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
 * per block; logits = lm_head(ln_f(x)). Shapes: B batch, T tokens (<=
 * block_size), C n_embd, V vocab_size.
 *
 * The forward is a sequence of blocks a pipeline can cut (lk_model_blocks):
 * "embedding" (a view over wte, wpe and drop), "transformer.h.N" (the
 * Block layers themselves), "head" (a view over ln_f and lm_head). The
 * Blocks are the model's checkpoint units (trainer.activation_checkpointing). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "models/models_impl.h"

static const lk_model_arg gpt_args[] = {
    {"n_layer", LK_ARG_INT, "12", "transformer blocks"},
    {"n_head", LK_ARG_INT, "12", "attention heads (n_embd divisible by it)"},
    {"n_embd", LK_ARG_INT, "768", "embedding width C"},
    {"block_size", LK_ARG_INT, "1024", "longest sequence (position embeddings)"},
    {"vocab_size", LK_ARG_INT, "50304", "tokens (GPT-2's 50257 padded to a multiple of 64)"},
    {"dropout", LK_ARG_FLOAT, "0.0", "dropout probability (embeddings, attention, residuals, MLP)"},
    {"bias", LK_ARG_BOOL, "true", "biases in the Linear and LayerNorm layers (false: none, as GPTConfig's bias)"},
};

typedef struct {
    int64_t n_layer, n_head, n_embd, block_size, vocab_size;
    double dropout;
} gpt_cfg;

/* ---- layers of a block ------------------------------------------------------------ */

typedef struct {
    int n_head;
    float dropout;
} attn_impl;

/* c_attn -> causal self-attention -> c_proj -> resid_dropout; the
 * attention probabilities are dropped with attn_dropout's stream, so the
 * trainer re-keys it per step and checkpointing replays it like any
 * Dropout's. */
static lk_tensor *attn_forward(lk_layer *self, lk_tensor *x) {
    attn_impl *a = self->impl;
    lk_layer *c_attn = lk_layer_child(self, 0), *c_proj = lk_layer_child(self, 1);
    lk_layer *attn_drop = lk_layer_child(self, 2), *resid_drop = lk_layer_child(self, 3);
    lk_tensor *qkv = lk_layer_forward(c_attn, x);
    lk_tensor *y = qkv ? lk_causal_self_attention(qkv, a->n_head, a->dropout, attn_drop->training, attn_drop->rng) : NULL;
    return lk_layer_forward(resid_drop, lk_layer_forward(c_proj, y));
}

/* c_fc -> GELU -> c_proj -> dropout: the children in order */
static lk_tensor *mlp_forward(lk_layer *self, lk_tensor *x) {
    for (int i = 0; i < self->n_children && x; i++) x = lk_layer_forward(self->children[i].layer, x);
    return x;
}

/* x + attn(ln_1(x)), then + mlp(ln_2(x)) */
static lk_tensor *block_forward(lk_layer *self, lk_tensor *x) {
    lk_tensor *a = lk_layer_forward(lk_layer_child(self, 1), lk_layer_forward(lk_layer_child(self, 0), x));
    x = a ? lk_add(x, a) : NULL;
    lk_tensor *m = x ? lk_layer_forward(lk_layer_child(self, 3), lk_layer_forward(lk_layer_child(self, 2), x)) : NULL;
    return m ? lk_add(x, m) : NULL;
}

static lk_layer *linear(int64_t in, int64_t out, bool bias) { return lk_linear_create(in, out, bias, NULL); }
static lk_layer *layer_norm(int64_t c, bool bias) { return lk_layer_norm_create_ex(1, &c, 1e-5f, true, bias); }

static lk_layer *block_create(const gpt_cfg *g, bool bias) {
    int64_t C = g->n_embd;
    float p = (float)g->dropout;
    lk_layer *blk = lk_layer_create("Block", block_forward, NULL, NULL);
    attn_impl *ai = lk_calloc(1, sizeof *ai);
    if (!blk || !ai) {
        lk_free(ai);
        lk_layer_free(blk);
        return NULL;
    }
    *ai = (attn_impl){(int)g->n_head, p};
    lk_layer *attn = lk_layer_create("CausalSelfAttention", attn_forward, ai, NULL);
    lk_layer *mlp = lk_layer_create("MLP", mlp_forward, NULL, NULL);
    lk_status st = lk_layer_add_child(blk, "ln_1", layer_norm(C, bias));
    if (!st) st = lk_layer_add_child(blk, "attn", attn);
    else lk_layer_free(attn);
    if (!st) st = lk_layer_add_child(blk, "ln_2", layer_norm(C, bias));
    if (!st) st = lk_layer_add_child(blk, "mlp", mlp);
    else lk_layer_free(mlp);
    if (!st) st = lk_layer_add_child(attn, "c_attn", linear(C, 3 * C, bias));
    if (!st) st = lk_layer_add_child(attn, "c_proj", linear(C, C, bias));
    if (!st) st = lk_layer_add_child(attn, "attn_dropout", lk_dropout_create(p));
    if (!st) st = lk_layer_add_child(attn, "resid_dropout", lk_dropout_create(p));
    if (!st) st = lk_layer_add_child(mlp, "c_fc", linear(C, 4 * C, bias));
    if (!st) st = lk_layer_add_child(mlp, "gelu", lk_gelu_create(LK_GELU_EXACT));
    if (!st) st = lk_layer_add_child(mlp, "c_proj", linear(4 * C, C, bias));
    if (!st) st = lk_layer_add_child(mlp, "dropout", lk_dropout_create(p));
    if (st) {
        lk_layer_free(blk);
        return NULL;
    }
    blk->checkpoint_unit = true; /* what activation checkpointing recomputes */
    return blk;
}

/* ---- the embedding and head stages (views) ---------------------------------------- */

/* tokens [B, T] (or one sequence [T]) -> drop(wte(idx) + wpe[0:T]) [B, T, C].
 * The positions are the first T rows of wpe (a slice: the gradient lands
 * in those rows, as wpe(arange(T)) would put it). */
static lk_tensor *embedding_forward(lk_layer *self, lk_tensor *idx) {
    const gpt_cfg *g = self->impl;
    lk_layer *wte = lk_layer_child(self, 0), *wpe = lk_layer_child(self, 1), *drop = lk_layer_child(self, 2);
    char s[128];
    if ((idx->dtype != LK_I64 && idx->dtype != LK_I32) || idx->ndim < 1 || idx->ndim > 2)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model gpt: expected token ids i64 [B, T] (or [T]), got %s %s", lk_dtype_name(idx->dtype),
                        lk_shape_str(idx, s, sizeof s)),
               NULL;
    int64_t T = idx->shape[idx->ndim - 1];
    if (T > g->block_size || T < 1)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model gpt: a sequence of %lld tokens %s block_size = %lld (model.init_args.block_size)",
                        (long long)T, T < 1 ? "is empty; expected 1 ..." : "is longer than", (long long)g->block_size),
               NULL;
    if (idx->ndim == 1) idx = lk_reshape(idx, LK_SHAPE(1, T));
    lk_tensor *tok = lk_layer_forward(wte, idx);
    lk_tensor *pos = lk_slice(lk_layer_param(wpe, 0), 0, 0, T);
    lk_tensor *x = tok && pos ? lk_add(tok, pos) : NULL;
    return lk_layer_forward(drop, x);
}

/* [B, T, C] -> lm_head(ln_f(x)) [B, T, V] */
static lk_tensor *head_forward(lk_layer *self, lk_tensor *x) {
    return lk_layer_forward(lk_layer_child(self, 1), lk_layer_forward(lk_layer_child(self, 0), x));
}

/* ---- GPT-2's initialisation --------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* nanoGPT's _init_weights and its scaled c_proj: Linear and Embedding
 * weights N(0, 0.02), the residual projections (attn.c_proj, mlp.c_proj)
 * N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1. The root
 * draws every parameter (the layers below have no reset of their own), in
 * named_parameters order from the one stream lk_layer_reset_parameters
 * hands it; the tied lm_head.weight is wte's, drawn once. */
static lk_status gpt_reset(lk_layer *self, lk_rng *rng) {
    const gpt_cfg *g = lk__model_staged_data(self);
    lk_named_tensors ps = {0};
    lk_status st = lk_layer_named_parameters(self, &ps);
    for (int i = 0; !st && i < ps.n; i++) {
        const char *n = ps.items[i].name;
        lk_tensor *t = ps.items[i].tensor;
        if (ends_with(n, ".bias")) st = lk_init_zeros(t);
        else if (strstr(n, ".ln_") || ends_with(n, "ln_f.weight")) st = lk_init_ones(t);
        else if (ends_with(n, "c_proj.weight")) st = lk_init_normal_bulk(t, rng, 0.0, 0.02 / sqrt(2.0 * (double)g->n_layer));
        else st = lk_init_normal_bulk(t, rng, 0.0, 0.02);
    }
    lk_named_tensors_clear(&ps);
    return st;
}

static void drop_resets(lk_layer *l) {
    l->reset = NULL;
    for (int i = 0; i < l->n_children; i++) drop_resets(l->children[i].layer);
}

/* ---- the builder ---------------------------------------------------------------------- */

static lk_status check_args(const lk_model_args *a, gpt_cfg *g, bool *bias) {
    static const char *const sizes[] = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size"};
    int64_t *dst[] = {&g->n_layer, &g->n_head, &g->n_embd, &g->block_size, &g->vocab_size};
    for (int i = 0; i < 5; i++) {
        *dst[i] = lk_model_args_int(a, sizes[i]);
        if (*dst[i] < 1 || *dst[i] > ((int64_t)1 << 31))
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "model gpt: %s = %lld: expected an integer in [1, 2^31]",
                            sizes[i], (long long)*dst[i]);
    }
    if (g->n_embd % g->n_head)
        return lk_error(LK_STATUS_INVALID_ARGUMENT,
                        "model gpt: n_embd = %lld is not divisible by n_head = %lld (each head gets n_embd / n_head "
                        "channels)",
                        (long long)g->n_embd, (long long)g->n_head);
    g->dropout = lk_model_args_float(a, "dropout");
    if (!(g->dropout >= 0 && g->dropout < 1))
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model gpt: dropout = %g: expected a probability in [0, 1)", g->dropout);
    *bias = lk_model_args_bool(a, "bias");
    return LK_STATUS_OK;
}

static lk_status build_gpt(const lk_model_args *a, uint64_t seed, lk_layer **out) {
    (void)seed; /* every parameter is drawn by gpt_reset */
    gpt_cfg *g = lk_calloc(1, sizeof *g), *ge = lk_calloc(1, sizeof *ge);
    bool bias = true;
    lk_status st = g && ge ? check_args(a, g, &bias) : LK_STATUS_OUT_OF_MEMORY;
    if (st) {
        lk_free(g);
        lk_free(ge);
        return st;
    }
    *ge = *g;
    lk_layer *m = lk__model_staged_create("GPT", g);
    lk_layer *tr = lk_layer_create("ModuleDict", NULL, NULL, NULL);
    lk_layer *h = lk_layer_create("ModuleList", NULL, NULL, NULL);
    lk_layer *emb = lk_layer_create("GPTEmbedding", embedding_forward, ge, NULL);
    lk_layer *head = lk_layer_create("GPTHead", head_forward, NULL, NULL);
    if (!m || !tr || !h || !emb || !head) {
        lk_layer_free(m), lk_layer_free(tr), lk_layer_free(h), lk_layer_free(emb), lk_layer_free(head);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    int64_t C = g->n_embd;
    float p = (float)g->dropout;
    st = lk_layer_add_child(m, "transformer", tr);
    if (!st) st = lk_layer_add_child(tr, "wte", lk_embedding_create(g->vocab_size, C, NULL));
    if (!st) st = lk_layer_add_child(tr, "wpe", lk_embedding_create(g->block_size, C, NULL));
    if (!st) st = lk_layer_add_child(tr, "drop", lk_dropout_create(p));
    if (!st) st = lk_layer_add_child(tr, "h", h);
    else lk_layer_free(h);
    for (int64_t i = 0; !st && i < g->n_layer; i++) {
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)i);
        st = lk_layer_add_child(h, name, block_create(g, bias));
    }
    if (!st) st = lk_layer_add_child(tr, "ln_f", layer_norm(C, bias));
    if (!st) st = lk_layer_add_child(m, "lm_head", linear(C, g->vocab_size, false));
    /* weight tying: lm_head.weight = transformer.wte.weight */
    if (!st) st = lk_layer_tie_parameter(lk_layer_get_child(m, "lm_head"), "weight",
                                         lk_layer_get_tensor(m, "transformer.wte.weight"));
    /* the blocks: the two views borrow the layers they run */
    if (!st) st = lk_layer_add_child_ref(emb, "wte", lk_layer_get_child(m, "transformer.wte"));
    if (!st) st = lk_layer_add_child_ref(emb, "wpe", lk_layer_get_child(m, "transformer.wpe"));
    if (!st) st = lk_layer_add_child_ref(emb, "drop", lk_layer_get_child(m, "transformer.drop"));
    if (!st) st = lk_layer_add_child_ref(head, "ln_f", lk_layer_get_child(m, "transformer.ln_f"));
    if (!st) st = lk_layer_add_child_ref(head, "lm_head", lk_layer_get_child(m, "lm_head"));
    if (!st) st = lk__model_staged_add(m, "embedding", emb, true);
    else lk_layer_free(emb);
    emb = NULL;
    for (int64_t i = 0; !st && i < g->n_layer; i++) {
        char name[48];
        snprintf(name, sizeof name, "transformer.h.%lld", (long long)i);
        st = lk__model_staged_add(m, name, lk_layer_child(h, (int)i), false);
    }
    if (!st) st = lk__model_staged_add(m, "head", head, true);
    else lk_layer_free(head);
    if (st) {
        lk_layer_free(m);
        return st;
    }
    drop_resets(m);
    m->reset = gpt_reset;
    *out = m;
    return LK_STATUS_OK;
}

/* [block_size]: token sequences of at most that length (info.tokens) */
static lk_status gpt_input_shape(const lk_model_args *a, int *ndim, int64_t shape[3], char *why, size_t why_size) {
    *ndim = 1;
    shape[0] = lk_model_args_int(a, "block_size");
    snprintf(why, why_size, "block_size %lld: token ids, at most that many", (long long)shape[0]);
    return LK_STATUS_OK;
}

/* cross-entropy of logits [B*T, V] against the next tokens y [B*T] */
static lk_tensor *gpt_loss(lk_tensor *logits, lk_tensor *x, lk_tensor *y) {
    (void)x;
    if (logits->ndim != 3 || y->numel != logits->shape[0] * logits->shape[1]) {
        char s1[128], s2[128];
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "model gpt: loss of logits %s against targets %s: expected [B, T, V] and [B, T]",
                        lk_shape_str(logits, s1, sizeof s1), lk_shape_str(y, s2, sizeof s2)),
               NULL;
    }
    int64_t N = logits->shape[0] * logits->shape[1];
    return lk_cross_entropy(lk_reshape(logits, LK_SHAPE(N, logits->shape[2])), lk_reshape(y, LK_SHAPE(N)), NULL);
}

const lk_model_info lk__model_gpt = {
    .name = "gpt",
    .help = "nanoGPT's GPT-2 decoder (causal self-attention, GELU MLP, tied lm_head): next-token cross-entropy",
    .loss = LK_LOSS_CROSS_ENTROPY,
    .target_is_input = false,
    .args = gpt_args,
    .n_args = (int)(sizeof gpt_args / sizeof gpt_args[0]),
    .build = build_gpt,
    .input_shape = gpt_input_shape, /* tokens [T] with T up to block_size (the forward checks it too) */
    .loss_fn = gpt_loss,
    .alias = "GPT",
    .tokens = true,
};

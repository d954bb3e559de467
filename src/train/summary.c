/* The model summary Lightning prints at fit start (its ModelSummary
 * callback, trainer.enable_model_summary): one row per layer down to
 * max_depth — index, dotted name, type, parameter count, train/eval mode —
 * then trainable, non-trainable and total parameter counts, the estimated
 * size in MB and how many layers are in train and eval mode. Column widths,
 * dividers and the "1.2 K" / "100 K" abbreviations follow Lightning's
 * _format_summary_table and get_human_readable_count, so a user who knows
 * Lightning's table reads this one the same way. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train_impl.h"

typedef struct {
    char name[256];
    const char *type;
    char params[32];
    bool training;
} summary_row;

typedef struct {
    summary_row *rows;
    int n, cap;
    int64_t n_train, n_eval; /* every descendant layer, whatever max_depth shows */
} summary_rows;

/* Python's f"{v:,d}": digits with a comma every three. */
static void with_commas(long long v, char *out, size_t size) {
    char digits[32];
    snprintf(digits, sizeof digits, "%lld", v);
    size_t n = strlen(digits), k = 0;
    for (size_t i = 0; i < n && k + 2 < size; i++) {
        if (i > 0 && (n - i) % 3 == 0) out[k++] = ',';
        out[k++] = digits[i];
    }
    out[k] = '\0';
}

/* Lightning's get_human_readable_count: "66  ", "1.2 K", "100 K", "3.4 M".
 * The unit of plain counts is a space, so they end in two spaces, as there. */
static void human_count(int64_t number, char *out, size_t size) {
    static const char *const labels[] = {" ", "K", "M", "B", "T"};
    int digits = number > 0 ? (int)floor(log10((double)number)) + 1 : 1;
    int groups = (digits + 2) / 3;
    if (groups > 5) groups = 5; /* no abbreviation beyond trillions */
    int index = groups - 1;
    double v = (double)number * pow(10.0, -3.0 * index);
    if (index < 1 || v >= 100) {
        char c[40];
        with_commas((long long)v, c, sizeof c);
        if (snprintf(out, size, "%s %s", c, labels[index]) >= (int)size) out[size - 1] = '\0';
    } else if (snprintf(out, size, "%.1f %s", v, labels[index]) >= (int)size) {
        out[size - 1] = '\0';
    }
}

static int64_t count_params(const lk_layer *l, bool trainable_only, lk_status *st) {
    lk_named_tensors p = {0};
    int64_t n = 0;
    *st = lk_layer_named_parameters(l, &p); /* deduplicated, as PyTorch's parameters() */
    for (int i = 0; !*st && i < p.n; i++)
        if (!trainable_only || p.items[i].tensor->requires_grad) n += p.items[i].tensor->numel;
    lk_named_tensors_clear(&p);
    return n;
}

static lk_status collect(const lk_layer *l, const char *prefix, int depth, int max_depth, summary_rows *r) {
    for (int i = 0; i < l->n_children; i++) {
        const lk_layer *c = l->children[i].layer;
        if (c->training) r->n_train++;
        else r->n_eval++;
        char name[256];
        if (snprintf(name, sizeof name, "%s%s%s", prefix, prefix[0] ? "." : "", l->children[i].name) >= (int)sizeof name)
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_model_summary: layer name '%s.%s' is over %zu characters",
                            prefix, l->children[i].name, sizeof name - 1);
        if (max_depth < 0 || depth <= max_depth) {
            if (r->n == r->cap) LK_TRY(lk_vec_reserve(r->rows, r->cap, r->n + 1, 16));
            summary_row *row = &r->rows[r->n++];
            snprintf(row->name, sizeof row->name, "%s", name);
            row->type = c->type;
            row->training = c->training;
            lk_status st;
            human_count(count_params(c, false, &st), row->params, sizeof row->params);
            LK_TRY(st);
        }
        LK_TRY(collect(c, name, depth + 1, max_depth, r));
    }
    return LK_STATUS_OK;
}

static int imax(int a, int b) { return a > b ? a : b; }

lk_status lk_model_summary(const lk_layer *net, int max_depth, char **out) {
    *out = NULL;
    if (!net) return lk_error(LK_STATUS_INVALID_ARGUMENT, "lk_model_summary: the network is NULL");
    summary_rows r = {0};
    lk_status st = LK_STATUS_OK;
    /* A model whose pipeline blocks are not its children (gpt: embedding,
     * transformer.h.N, head) shows its blocks as the top-level rows; the
     * train/eval counts stay those of its own tree. */
    int nb = 0;
    const lk_named_layer *bl = NULL;
    bool staged = lk_model_blocks(net, &nb, &bl) == LK_STATUS_OK && bl && bl != net->children;
    if (!bl) lk_clear_error();
    if (staged) {
        st = collect(net, "", 1, 0, &r); /* the counts only */
        for (int i = 0; !st && i < nb && max_depth != 0; i++) {
            if (r.n == r.cap && (st = lk_vec_reserve(r.rows, r.cap, r.n + 1, 16))) break;
            summary_row *row = &r.rows[r.n++];
            snprintf(row->name, sizeof row->name, "%s", bl[i].name);
            row->type = bl[i].layer->type;
            /* a view's own flag is not the model's (lk_layer_train walks the
             * model's tree): its layers' is */
            const lk_layer *bk = bl[i].layer;
            row->training = bk->n_children && bk->children[0].borrowed ? bk->children[0].layer->training : bk->training;
            human_count(count_params(bl[i].layer, false, &st), row->params, sizeof row->params);
            if (!st && (max_depth < 0 || max_depth >= 2)) {
                summary_rows sub = {0};
                st = collect(bl[i].layer, bl[i].name, 2, max_depth, &sub);
                for (int k = 0; !st && k < sub.n; k++) {
                    if (r.n == r.cap && (st = lk_vec_reserve(r.rows, r.cap, r.n + 1, 16))) break;
                    r.rows[r.n++] = sub.rows[k];
                }
                lk_free(sub.rows);
            }
        }
    } else {
        st = collect(net, "", 1, max_depth, &r);
    }
    int64_t total = st ? 0 : count_params(net, false, &st);
    int64_t trainable = st ? 0 : count_params(net, true, &st);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = st ? NULL : open_memstream(&buf, &len);
    if (!st && !f) st = lk_error(LK_STATUS_OUT_OF_MEMORY, "lk_model_summary: no memory for the table");
    if (st) {
        lk_free(r.rows);
        return st;
    }
    /* Columns: index, Name, Type, Params, Mode; each as wide as its widest
     * cell or its header. The dividers span the columns plus three
     * characters per column and one more, as Lightning counts them. */
    int w[5] = {1, 4, 4, 6, 4};
    for (int i = 0; i < r.n; i++) {
        char idx[16];
        w[0] = imax(w[0], snprintf(idx, sizeof idx, "%d", i));
        w[1] = imax(w[1], (int)strlen(r.rows[i].name));
        w[2] = imax(w[2], (int)strlen(r.rows[i].type));
        w[3] = imax(w[3], (int)strlen(r.rows[i].params));
        w[4] = imax(w[4], r.rows[i].training ? 5 : 4);
    }
    int total_width = w[0] + w[1] + w[2] + w[3] + w[4] + 3 * 6;
    fprintf(f, "%-*s | %-*s | %-*s | %-*s | %-*s\n", w[0], " ", w[1], "Name", w[2], "Type", w[3], "Params", w[4], "Mode");
    for (int k = 0; k < total_width; k++) fputc('-', f);
    for (int i = 0; i < r.n; i++)
        fprintf(f, "\n%-*d | %-*s | %-*s | %-*s | %-*s", w[0], i, w[1], r.rows[i].name, w[2], r.rows[i].type, w[3],
                r.rows[i].params, w[4], r.rows[i].training ? "train" : "eval");
    fputc('\n', f);
    for (int k = 0; k < total_width; k++) fputc('-', f);
    char c[40], size_mb[48];
    human_count(trainable, c, sizeof c);
    fprintf(f, "\n%-10sTrainable params", c);
    human_count(total - trainable, c, sizeof c);
    fprintf(f, "\n%-10sNon-trainable params", c);
    human_count(total, c, sizeof c);
    fprintf(f, "\n%-10sTotal params", c);
    /* The parameters' bytes (4 each in f32, 2 in bf16/f16: Lightning's
     * precision_megabytes) in decimal megabytes, printed with three decimals
     * and thousands commas. */
    double mb = (double)total * 4e-6;
    lk_named_tensors ps = {0};
    if (lk_layer_named_parameters(net, &ps) == LK_STATUS_OK) {
        double bytes = 0;
        for (int i = 0; i < ps.n; i++) bytes += (double)lk_tensor_nbytes(ps.items[i].tensor);
        mb = bytes * 1e-6;
    } else {
        lk_clear_error();
    }
    lk_named_tensors_clear(&ps);
    char frac[16];
    snprintf(frac, sizeof frac, "%.3f", mb - floor(mb));
    long long whole = (long long)floor(mb);
    if (frac[0] == '1') whole++, snprintf(frac, sizeof frac, "0.000"); /* .9995 rounds up */
    with_commas(whole, c, sizeof c);
    if (snprintf(size_mb, sizeof size_mb, "%s%s", c, frac + 1) >= (int)sizeof size_mb) size_mb[0] = '\0';
    fprintf(f, "\n%-10sTotal estimated model params size (MB)", size_mb);
    fprintf(f, "\n%-10lldModules in train mode", (long long)r.n_train);
    fprintf(f, "\n%-10lldModules in eval mode\n", (long long)r.n_eval);
    fclose(f);
    lk_free(r.rows);
    /* open_memstream's buffer comes from malloc: hand the caller lk_malloc memory. */
    *out = lk_strdup(buf ? buf : "");
    free(buf);
    return *out ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
}

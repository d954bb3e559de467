/* Tokenizers for language-model data: bytes as tokens (vocabulary 256, no
 * files) and GPT-2's byte-level BPE from the vocab.json and merges.txt a
 * user hands in (no network). `lockstep prepare` encodes text into token
 * files with them and `lockstep generate` decodes samples back to text.
 *
 * GPT-2 BPE, as its encoder.py defines it: the text is split by the GPT-2
 * pre-tokenisation pattern
 *     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (written out below as a scanner, first alternative that matches wins);
 * each piece's bytes are mapped to printable code points (bytes_to_unicode)
 * and merged pairwise, lowest merge rank first, until no ranked pair is
 * left; the resulting symbols are looked up in vocab.json. Decoding maps
 * the symbols' code points back to bytes. Unicode letters and digits
 * outside ASCII are classified by the C library's C.UTF-8 locale
 * (iswalpha/iswdigit_l, thread-safe through a locale object); without that
 * locale every non-ASCII code point counts as a letter. */
#include "data/data_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <locale.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

/* ---- a string -> int hash map (open addressing, FNV-1a) -------------------- */

typedef struct {
    char **keys; /* owned */
    int32_t *vals;
    size_t cap, n;
} strmap;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static void strmap_free(strmap *m) {
    for (size_t i = 0; m->keys && i < m->cap; i++) lk_free(m->keys[i]);
    lk_free(m->keys);
    lk_free(m->vals);
    memset(m, 0, sizeof *m);
}

static lk_status strmap_init(strmap *m, size_t expect) {
    size_t cap = 64;
    while (cap < expect * 2) cap *= 2;
    m->keys = lk_calloc(cap, sizeof *m->keys);
    m->vals = lk_calloc(cap, sizeof *m->vals);
    m->cap = cap;
    m->n = 0;
    if (!m->keys || !m->vals) {
        strmap_free(m);
        return LK_STATUS_OUT_OF_MEMORY;
    }
    return LK_STATUS_OK;
}

/* The slot of key (s, n): where it is, or the empty slot where it would go. */
static size_t strmap_slot(const strmap *m, const char *s, size_t n) {
    size_t i = (size_t)fnv(s, n) & (m->cap - 1);
    while (m->keys[i] && !(strlen(m->keys[i]) == n && !memcmp(m->keys[i], s, n))) i = (i + 1) & (m->cap - 1);
    return i;
}

/* -1 when absent. */
static int32_t strmap_get(const strmap *m, const char *s, size_t n) {
    size_t i = strmap_slot(m, s, n);
    return m->keys[i] ? m->vals[i] : -1;
}

/* Adds (s, v) unless s is there (the first value stays: returns false). The
 * map was sized for its keys at init, so it never fills. */
static lk_status strmap_put(strmap *m, const char *s, size_t n, int32_t v, bool *added) {
    size_t i = strmap_slot(m, s, n);
    *added = !m->keys[i];
    if (!*added) return LK_STATUS_OK;
    char *k = lk_malloc(n + 1);
    if (!k) return LK_STATUS_OUT_OF_MEMORY;
    memcpy(k, s, n);
    k[n] = 0;
    m->keys[i] = k;
    m->vals[i] = v;
    m->n++;
    return LK_STATUS_OK;
}

/* ---- the tokenizer ------------------------------------------------------------ */

struct lk_tokenizer {
    bool bpe;
    int64_t vocab_size; /* bytes: 256; bpe: largest id + 1 */
    strmap encoder;     /* bpe: symbol (UTF-8 of mapped bytes) -> id */
    strmap ranks;       /* bpe: "a b" -> merge rank */
    char **decoder;     /* bpe: id -> symbol (borrowed from encoder's keys), NULL for gaps */
    uint16_t byte_to_cp[256];
    int16_t cp_to_byte[324]; /* the mapped code points are < 324 */
    locale_t utf8;       /* (locale_t)0 when the C library has no C.UTF-8 */
};

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * other 68 to 256, 257, ... in byte order, so every byte is a visible
 * character and BPE never sees whitespace or control bytes. */
static void byte_map(lk_tokenizer *t) {
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        t->byte_to_cp[b] = (uint16_t)(printable ? b : next++);
    }
    for (int c = 0; c < 324; c++) t->cp_to_byte[c] = -1;
    for (int b = 0; b < 256; b++) t->cp_to_byte[t->byte_to_cp[b]] = (int16_t)b;
}

lk_status lk_tokenizer_bytes_create(lk_tokenizer **out) {
    *out = lk_calloc(1, sizeof **out);
    if (!*out) return LK_STATUS_OUT_OF_MEMORY;
    (*out)->vocab_size = 256;
    return LK_STATUS_OK;
}

void lk_tokenizer_free(lk_tokenizer *t) {
    if (!t) return;
    strmap_free(&t->encoder);
    strmap_free(&t->ranks);
    lk_free(t->decoder);
    if (t->utf8) freelocale(t->utf8);
    lk_free(t);
}

int64_t lk_tokenizer_vocab_size(const lk_tokenizer *t) { return t ? t->vocab_size : 0; }
const char *lk_tokenizer_kind(const lk_tokenizer *t) { return t && t->bpe ? "gpt2" : "bytes"; }

static lk_status read_text(const char *path, const char *what, char **buf, size_t *len) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return lk_error(LK_STATUS_IO, "cannot open %s %s: %s", what, path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = lk_malloc(cap);
    while (b) {
        if (n + 1 >= cap) {
            char *nb = lk_realloc(b, cap * 2);
            if (!nb) break;
            b = nb;
            cap *= 2;
        }
        size_t k = fread(b + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    bool err = ferror(f);
    fclose(f);
    if (!b) return LK_STATUS_OUT_OF_MEMORY;
    if (err) {
        lk_free(b);
        return lk_error(LK_STATUS_IO, "reading %s %s failed", what, path);
    }
    b[n] = 0;
    *buf = b;
    *len = n;
    return LK_STATUS_OK;
}

/* The UTF-8 of code point c into out (1-4 bytes); returns the length. */
static int utf8_put(uint32_t c, char *out) {
    if (c < 0x80) return out[0] = (char)c, 1;
    if (c < 0x800) return out[0] = (char)(0xC0 | (c >> 6)), out[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return out[0] = (char)(0xE0 | (c >> 12)), out[1] = (char)(0x80 | ((c >> 6) & 0x3F)),
               out[2] = (char)(0x80 | (c & 0x3F)), 3;
    out[0] = (char)(0xF0 | (c >> 18)), out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F)), out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* The code point at s[0..n) and its length; a malformed sequence is one
 * byte (its value), as Python's surrogateescape would keep it apart. */
static uint32_t utf8_get(const unsigned char *s, size_t n, int *len) {
    unsigned char c = s[0];
    int k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (k == 0 || (size_t)k > n) return *len = 1, c;
    uint32_t v = k == 1 ? c : k == 2 ? c & 0x1F : k == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return *len = 1, c;
        v = (v << 6) | (s[i] & 0x3F);
    }
    *len = k;
    return v;
}

lk_status lk_tokenizer_gpt2_create(const char *vocab_json, const char *merges_txt, lk_tokenizer **out) {
    *out = NULL;
    if (!vocab_json || !*vocab_json || !merges_txt || !*merges_txt)
        return lk_error(LK_STATUS_INVALID_ARGUMENT, "gpt2 tokenizer: needs both vocab.json and merges.txt paths");
    lk_tokenizer *t = lk_calloc(1, sizeof *t);
    if (!t) return LK_STATUS_OUT_OF_MEMORY;
    t->bpe = true;
    byte_map(t);
    t->utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    char *text = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    lk_status st = read_text(vocab_json, "vocab file", &text, &len);
    if (!st) {
        root = cJSON_ParseWithLength(text, len);
        if (!root || !cJSON_IsObject(root))
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "vocab file %s: not a JSON object {\"token\": id, ...}%s%.40s",
                          vocab_json, cJSON_GetErrorPtr() ? " near: " : "", cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "");
    }
    int nv = st ? 0 : cJSON_GetArraySize(root);
    if (!st && nv == 0) st = lk_error(LK_STATUS_INVALID_ARGUMENT, "vocab file %s: empty", vocab_json);
    if (!st) st = strmap_init(&t->encoder, (size_t)nv);
    int64_t maxid = -1;
    for (cJSON *e = st ? NULL : root->child; e && !st; e = e->next) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (v < 0 || v > 2147483647.0 || v != (double)(int64_t)v) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "vocab file %s: token \"%s\" has id %s, expected an integer >= 0",
                          vocab_json, e->string, cJSON_IsNumber(e) ? "out of range" : "that is not a number");
            break;
        }
        bool added;
        st = strmap_put(&t->encoder, e->string, strlen(e->string), (int32_t)v, &added);
        if (!st && !added)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "vocab file %s: token \"%s\" appears twice", vocab_json, e->string);
        if ((int64_t)v > maxid) maxid = (int64_t)v;
    }
    cJSON_Delete(root);
    lk_free(text);
    text = NULL;
    if (!st) {
        t->vocab_size = maxid + 1;
        t->decoder = lk_calloc((size_t)t->vocab_size, sizeof *t->decoder);
        if (!t->decoder) st = LK_STATUS_OUT_OF_MEMORY;
        for (size_t i = 0; !st && i < t->encoder.cap; i++) {
            if (!t->encoder.keys[i]) continue;
            int32_t id = t->encoder.vals[i];
            if (t->decoder[id])
                st = lk_error(LK_STATUS_INVALID_ARGUMENT, "vocab file %s: id %d is given to \"%s\" and \"%s\"",
                              vocab_json, id, t->decoder[id], t->encoder.keys[i]);
            t->decoder[id] = t->encoder.keys[i];
        }
    }
    /* Every byte must have a symbol, or some text could not be encoded. */
    for (int b = 0; !st && b < 256; b++) {
        char s[4];
        int k = utf8_put(t->byte_to_cp[b], s);
        if (strmap_get(&t->encoder, s, (size_t)k) < 0)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "vocab file %s: no token for byte 0x%02x (symbol \"%.*s\"); a GPT-2 byte-level vocabulary has "
                          "all 256",
                          vocab_json, b, k, s);
    }
    if (!st) st = read_text(merges_txt, "merges file", &text, &len);
    if (!st) {
        size_t lines = 1;
        for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
        st = strmap_init(&t->ranks, lines);
    }
    int32_t rank = 0;
    size_t lineno = 0;
    for (char *p = text, *nl; !st && p && *p; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        if (n && p[n - 1] == '\r') n--;
        if (n == 0 || (lineno == 1 && !strncmp(p, "#version", 8))) continue;
        const char *sp = memchr(p, ' ', n);
        if (!sp || sp == p || sp == p + n - 1 || memchr(sp + 1, ' ', (size_t)(p + n - sp - 1))) {
            st = lk_error(LK_STATUS_INVALID_ARGUMENT, "merges file %s:%zu: \"%.*s\", expected two symbols separated by "
                          "one space",
                          merges_txt, lineno, (int)(n > 60 ? 60 : n), p);
            break;
        }
        bool added;
        st = strmap_put(&t->ranks, p, n, rank, &added);
        if (!st && added) rank++; /* a repeated merge keeps its first (lowest) rank */
    }
    lk_free(text);
    if (st) {
        lk_tokenizer_free(t);
        return st;
    }
    *out = t;
    return LK_STATUS_OK;
}

/* ---- GPT-2 pre-tokenisation --------------------------------------------------- */

enum { C_LETTER, C_NUMBER, C_SPACE, C_OTHER };

static bool is_unicode_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int char_class(const lk_tokenizer *t, uint32_t c) {
    if (c < 0x80) {
        if ((c | 32) >= 'a' && (c | 32) <= 'z') return C_LETTER;
        if (c >= '0' && c <= '9') return C_NUMBER;
        return is_unicode_space(c) ? C_SPACE : C_OTHER;
    }
    if (is_unicode_space(c)) return C_SPACE;
    if (!t->utf8) return C_LETTER;
    if (iswdigit_l((wint_t)c, t->utf8)) return C_NUMBER;
    if (iswalpha_l((wint_t)c, t->utf8)) return C_LETTER;
    return C_OTHER;
}

/* The length of the pre-token starting at s[i] (s has n bytes). */
static size_t pretoken(const lk_tokenizer *t, const unsigned char *s, size_t n, size_t i) {
    /* 's 't 're 've 'm 'll 'd */
    if (s[i] == '\'' && i + 1 < n) {
        static const char *const contr[] = {"s", "t", "re", "ve", "m", "ll", "d"};
        for (int k = 0; k < 7; k++) {
            size_t L = strlen(contr[k]);
            if (i + 1 + L <= n && !memcmp(s + i + 1, contr[k], L)) return 1 + L;
        }
    }
    int len;
    size_t j = i + (s[i] == ' ' && i + 1 < n ? 1 : 0); /* the optional leading space */
    uint32_t c = utf8_get(s + j, n - j, &len);
    int cls = char_class(t, c);
    if (cls != C_SPACE) {
        /* ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: a run of one class */
        size_t k = j + (size_t)len;
        while (k < n) {
            uint32_t d = utf8_get(s + k, n - k, &len);
            if (char_class(t, d) != cls) break;
            k += (size_t)len;
        }
        return k - i;
    }
    /* whitespace from s[i]: `\s+(?!\S)` leaves the last one to the next
     * piece when text follows, unless the run is a single character (then
     * `\s+` takes it) */
    size_t k = i, last = i;
    while (k < n) {
        uint32_t d = utf8_get(s + k, n - k, &len);
        if (char_class(t, d) != C_SPACE) break;
        last = k;
        k += (size_t)len;
    }
    if (k < n && last > i) return last - i;
    return k - i;
}

/* ---- BPE on one pre-token ------------------------------------------------------ */

typedef struct {
    int32_t *tok;
    int64_t n, cap;
} tokbuf;

static lk_status tokbuf_push(tokbuf *b, int32_t v) {
    if (b->n == b->cap) {
        int64_t cap = b->cap ? b->cap * 2 : 1024;
        int32_t *p = lk_realloc(b->tok, (size_t)cap * sizeof *p);
        if (!p) return LK_STATUS_OUT_OF_MEMORY;
        b->tok = p;
        b->cap = cap;
    }
    b->tok[b->n++] = v;
    return LK_STATUS_OK;
}

/* The symbols of a piece are contiguous spans of its mapped UTF-8 text `w`,
 * so merging two neighbours extends the left span over the right one.
 * The whole piece is merged at once, however long (a line of 1000 dashes),
 * as GPT-2's encoder does: small pieces use the stack, long ones the heap. */
static lk_status bpe_piece(const lk_tokenizer *t, const unsigned char *piece, size_t plen, tokbuf *out) {
    enum { SMALL = 64 };
    char wsmall[SMALL * 2], ksmall[SMALL * 4 + 2], asmall[SMALL * 2], bsmall[SMALL * 2];
    size_t ssmall[SMALL + 1];
    char *wbuf = wsmall, *key = ksmall, *pa = asmall, *pb = bsmall, *heap = NULL;
    size_t *start = ssmall;
    if (plen > SMALL) { /* one block: wbuf 2n, key 4n + 2, a 2n, b 2n, then the n + 1 starts */
        heap = lk_malloc(plen * 10 + 2 + (plen + 1) * sizeof *start + sizeof *start);
        if (!heap) return LK_STATUS_OUT_OF_MEMORY;
        wbuf = heap, key = wbuf + 2 * plen, pa = key + 4 * plen + 2, pb = pa + 2 * plen;
        start = (size_t *)(void *)(pb + 2 * plen + (sizeof *start - (uintptr_t)(pb + 2 * plen) % sizeof *start) % sizeof *start);
    }
    size_t wl = 0, nsym = 0;
    for (size_t i = 0; i < plen; i++) {
        start[nsym++] = wl;
        wl += (size_t)utf8_put(t->byte_to_cp[piece[i]], wbuf + wl);
    }
    start[nsym] = wl;
    for (;;) {
        int32_t best = INT32_MAX;
        size_t at = SIZE_MAX;
        for (size_t i = 0; i + 1 < nsym; i++) {
            size_t la = start[i + 1] - start[i], lb = start[i + 2] - start[i + 1];
            memcpy(key, wbuf + start[i], la);
            key[la] = ' ';
            memcpy(key + la + 1, wbuf + start[i + 1], lb);
            int32_t r = strmap_get(&t->ranks, key, la + lb + 1);
            if (r >= 0 && r < best) best = r, at = i;
        }
        if (at == SIZE_MAX) break;
        /* merge every occurrence of that pair, left to right */
        size_t la = start[at + 1] - start[at], lb = start[at + 2] - start[at + 1];
        memcpy(pa, wbuf + start[at], la);
        memcpy(pb, wbuf + start[at + 1], lb);
        size_t k = 0;
        for (size_t i = 0; i < nsym; k++) {
            start[k] = start[i];
            if (i + 1 < nsym && start[i + 1] - start[i] == la && start[i + 2] - start[i + 1] == lb &&
                !memcmp(wbuf + start[i], pa, la) && !memcmp(wbuf + start[i + 1], pb, lb))
                i += 2;
            else
                i += 1;
        }
        start[k] = wl;
        nsym = k;
    }
    lk_status st = LK_STATUS_OK;
    for (size_t i = 0; i < nsym && !st; i++) {
        int32_t id = strmap_get(&t->encoder, wbuf + start[i], start[i + 1] - start[i]);
        if (id < 0)
            st = lk_error(LK_STATUS_INVALID_ARGUMENT,
                          "gpt2 tokenizer: merges produce \"%.*s\", which vocab.json does not have (vocab and merges "
                          "from different tokenizers?)",
                          (int)(start[i + 1] - start[i] > 200 ? 200 : start[i + 1] - start[i]), wbuf + start[i]);
        else st = tokbuf_push(out, id);
    }
    lk_free(heap);
    return st;
}

lk_status lk_tokenizer_encode(const lk_tokenizer *t, const char *text, size_t len, int32_t **tokens, int64_t *n) {
    *tokens = NULL;
    *n = 0;
    tokbuf b = {0};
    const unsigned char *s = (const unsigned char *)text;
    lk_status st = LK_STATUS_OK;
    if (!t->bpe) {
        b.tok = lk_malloc((len ? len : 1) * sizeof *b.tok);
        if (!b.tok) return LK_STATUS_OUT_OF_MEMORY;
        for (size_t i = 0; i < len; i++) b.tok[i] = s[i];
        b.n = (int64_t)len;
    } else {
        for (size_t i = 0; i < len && !st;) {
            size_t k = pretoken(t, s, len, i);
            st = bpe_piece(t, s + i, k, &b);
            i += k;
        }
    }
    if (st) {
        lk_free(b.tok);
        return st;
    }
    *tokens = b.tok;
    *n = b.n;
    return LK_STATUS_OK;
}

lk_status lk_tokenizer_decode(const lk_tokenizer *t, const int32_t *tokens, int64_t n, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    size_t cap = (size_t)n * (t->bpe ? 8 : 1) + 1, k = 0;
    char *out = lk_malloc(cap);
    if (!out) return LK_STATUS_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= t->vocab_size || (t->bpe && !t->decoder[tokens[i]])) {
            lk_free(out);
            return lk_error(LK_STATUS_INVALID_ARGUMENT, "decode: token %d at position %lld is not in the %s vocabulary "
                            "(size %lld)",
                            tokens[i], (long long)i, lk_tokenizer_kind(t), (long long)t->vocab_size);
        }
        if (!t->bpe) {
            out[k++] = (char)tokens[i];
            continue;
        }
        const unsigned char *s = (const unsigned char *)t->decoder[tokens[i]];
        size_t sl = strlen((const char *)s);
        for (size_t j = 0; j < sl;) {
            int cl;
            uint32_t c = utf8_get(s + j, sl - j, &cl);
            j += (size_t)cl;
            if (k + 5 >= cap) {
                char *p = lk_realloc(out, cap * 2);
                if (!p) {
                    lk_free(out);
                    return LK_STATUS_OUT_OF_MEMORY;
                }
                out = p;
                cap *= 2;
            }
            /* a symbol of vocab.json made of code points outside the byte
             * map (not a GPT-2 byte-level vocabulary) decodes as itself */
            if (c < 324 && t->cp_to_byte[c] >= 0) out[k++] = (char)t->cp_to_byte[c];
            else {
                char u[4];
                int ul = utf8_put(c, u);
                for (int q = 0; q < ul; q++) out[k++] = u[q];
            }
        }
    }
    out[k] = 0;
    *text = out;
    *len = k;
    return LK_STATUS_OK;
}

/* Per-step values read from a descriptor's `live` block (op_fields.c's
 * lk__op_live_size / lk__op_live_fill; issue 21's graph replay of the
 * step): for each op kind with live fields and several parameter sets, a
 * descriptor whose live fields hold other values (another step's, or 0xA5
 * bytes) but whose `live` holds lk__op_live_fill of the real descriptor
 * must write, bit for bit, what the real descriptor writes without `live`.
 * Run on the CPU backend (live in host memory), on the sealed device (live
 * in its arena, readable only while an op runs) and on the debug device
 * with tests/debug_backend.h's own loops in front. Each case also checks
 * that the other step's values alone give other bits, so a backend that
 * ignored `live` fails here. And lk__op_live_size is > 0 exactly for the
 * kinds whose table marks a field live. */
#include <string.h>

#include "backend/backend_impl.h"
#include "debug_backend.h"
#include "lk_test.h"
#include "sealed_device.h"

enum { MAXB = 4096 * 8 };

/* One op with its operands' initial contents; x[i] NULL where absent. */
typedef struct {
    const char *name;
    lk_op_desc d;     /* the real descriptor */
    lk_op_desc other; /* the same op with another step's live values */
    int nx;
    size_t bytes[LK_OP_MAX_OPERANDS];
    unsigned char init[LK_OP_MAX_OPERANDS][MAXB];
} op_case;

static uint32_t seed = 12345;
static uint32_t next(void) { return seed = seed * 1664525u + 1013904223u, seed >> 8; }
static float unit(void) { return (float)(next() & 0xffff) / 65536.0f; } /* [0, 1) */

static void fill_f32(op_case *c, int i, int64_t n, float lo, float hi) {
    c->bytes[i] = (size_t)n * sizeof(float);
    float *p = (float *)c->init[i];
    for (int64_t k = 0; k < n; k++) p[k] = lo + (hi - lo) * unit();
}
static void fill_bf16(op_case *c, int i, int64_t n, float lo, float hi) {
    c->bytes[i] = (size_t)n * 2;
    uint16_t *p = (uint16_t *)c->init[i];
    for (int64_t k = 0; k < n; k++) {
        float v = lo + (hi - lo) * unit();
        uint32_t u;
        memcpy(&u, &v, 4);
        p[k] = (uint16_t)(u >> 16);
    }
}
static void fill_zero(op_case *c, int i, size_t bytes) { c->bytes[i] = bytes; }

/* Where the op runs: its operands and live block in that device's memory. */
typedef enum { ON_CPU, ON_SEALED, ON_DEBUG } where;
static const char *const where_name[] = {"cpu", "sealed", "debug"};
static lk_device dev_of[3];

static void *dev_alloc(where w, size_t bytes) {
    void *p = NULL;
    if (w == ON_SEALED) CHECK_OK(sealed_alloc(NULL, 0, bytes ? bytes : 1, &p));
    else p = calloc(1, bytes ? bytes : 1);
    return p;
}
static void dev_free(where w, void *p, size_t bytes) {
    if (w == ON_SEALED) sealed_free(NULL, 0, p, bytes ? bytes : 1);
    else free(p);
}
static void dev_put(where w, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (w == ON_SEALED) CHECK_OK(sealed_from_host(NULL, 0, dst, src, bytes));
    else memcpy(dst, src, bytes);
}
static void dev_get(where w, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (w == ON_SEALED) CHECK_OK(sealed_to_host(NULL, 0, dst, src, bytes));
    else memcpy(dst, src, bytes);
}

/* Runs d over fresh copies of the case's operands on w; the operands'
 * final bytes into out[i]. live: NULL or a host copy of the block to put
 * into w's memory. */
static lk_status run_on(where w, const op_case *c, lk_op_desc d, const void *live, size_t live_n,
                        unsigned char out[][MAXB]) {
    void *x[LK_OP_MAX_OPERANDS] = {0};
    for (int i = 0; i < c->nx; i++)
        if (c->bytes[i]) x[i] = dev_alloc(w, c->bytes[i]), dev_put(w, x[i], c->init[i], c->bytes[i]);
    void *lv = NULL;
    if (live) lv = dev_alloc(w, live_n), dev_put(w, lv, live, live_n);
    d.live = lv;
    lk_status st = lk__backend_run(dev_of[w], &d, x);
    for (int i = 0; i < c->nx; i++)
        if (x[i]) dev_get(w, out[i], x[i], c->bytes[i]), dev_free(w, x[i], c->bytes[i]);
    if (lv) dev_free(w, lv, live_n);
    return st;
}

static unsigned char eager[LK_OP_MAX_OPERANDS][MAXB], got[LK_OP_MAX_OPERANDS][MAXB];

/* The first operand whose bytes differ between a and b (-1: none). */
static int differs(const op_case *c, unsigned char a[][MAXB], unsigned char b[][MAXB]) {
    for (int i = 0; i < c->nx; i++)
        if (c->bytes[i] && memcmp(a[i], b[i], c->bytes[i])) return i;
    return -1;
}

/* Overwrites every live field of d (its kind's table) with `byte`. */
static void smash_live(lk_op_desc *d, unsigned char byte) {
    const lk_op_info *oi = lk__op_info(d->op);
    for (int f = 0; f < oi->n; f++)
        if (oi->f[f].live) memset((char *)d + oi->f[f].off, byte, oi->f[f].size);
}

static void check_case(const op_case *c) {
    unsigned char live[256];
    size_t n = lk__op_live_size(&c->d);
    CHECK_MSG(n > 0 && n <= sizeof live, "%s: live size %zu", c->name, n);
    if (n == 0 || n > sizeof live) return;
    memset(live, 0x5a, sizeof live);
    lk__op_live_fill(&c->d, live);
    CHECK_MSG(lk__op_desc_same(&c->d, &c->other, true) && !lk__op_desc_same(&c->d, &c->other, false),
              "%s: the other step's descriptor differs in something other than its live fields", c->name);
    lk_op_desc smashed = c->d;
    smash_live(&smashed, 0xa5);
    for (int w = ON_CPU; w <= ON_DEBUG; w++) {
        CHECK_OK(run_on((where)w, c, c->d, NULL, 0, eager));
        /* the other step's values matter: without `live` they give other bits */
        CHECK_OK(run_on((where)w, c, c->other, NULL, 0, got));
        /* (a mask of 1 to 3 bits may agree by chance; the 0xA5 descriptor's
         * head_n is out of range, so ignoring `live` fails there anyway) */
        bool few = c->d.op == LK_OP_DROPOUT_MASK && c->d.dropout_mask.n < 4;
        CHECK_MSG(few || differs(c, eager, got) >= 0, "%s on %s: the other step's values gave the same bits (the case sees "
                  "nothing)", c->name, where_name[w]);
        const lk_op_desc *with[2] = {&c->other, &smashed};
        for (int k = 0; k < 2; k++) {
            memset(got, 0, sizeof got);
            lk_status st = run_on((where)w, c, *with[k], live, n, got);
            CHECK_MSG(st == LK_STATUS_OK, "%s on %s (%s): %s", c->name, where_name[w], k ? "0xA5 live fields" : "another "
                      "step's live fields", lk_last_error());
            int i = differs(c, eager, got);
            CHECK_MSG(i < 0, "%s on %s, %s in the descriptor, the real ones in live: operand %d differs from the "
                      "eager run", c->name, where_name[w], k ? "0xA5 bytes" : "another step's values", i);
        }
    }
}

/* ---- the cases ------------------------------------------------------------------ */
enum { N = 1037 };

static op_case cs; /* one at a time: the operand images are large */

static void affine(void) {
    for (int add = 0; add < 2; add++)
        for (int bf = 0; bf < 2; bf++) {
            memset(&cs, 0, sizeof cs);
            cs.name = add ? (bf ? "affine bf16 with add" : "affine with add") : (bf ? "affine bf16" : "affine");
            lk_dtype dt = bf ? LK_BF16 : LK_F32;
            cs.d = (lk_op_desc){.op = LK_OP_AFFINE, .dtype = {dt, dt}, .affine = {N, 65536.0f, add ? 0.25f : 0.0f, add}};
            cs.other = cs.d;
            cs.other.affine.mul = 32768.0f, cs.other.affine.add = add ? -3.0f : 1.0f;
            cs.nx = 2;
            if (bf) fill_bf16(&cs, 0, N, -2, 2), fill_bf16(&cs, 1, N, -2, 2);
            else fill_f32(&cs, 0, N, -2, 2), fill_f32(&cs, 1, N, -2, 2);
            check_case(&cs);
        }
}

static void unscale(void) {
    memset(&cs, 0, sizeof cs);
    cs.name = "unscale";
    cs.d = (lk_op_desc){.op = LK_OP_UNSCALE, .dtype = {LK_F32, LK_F32, LK_I64}, .nonfinite = {N, 1.0f / 65536.0f}};
    cs.other = cs.d;
    cs.other.nonfinite.mul = 1.0f / 3.0f;
    cs.nx = 3;
    fill_f32(&cs, 0, N, -1000, 1000), fill_f32(&cs, 1, N, 0, 1), fill_zero(&cs, 2, 8);
    ((float *)cs.init[0])[17] = 1.0f / 0.0f; /* one non-finite: the count is written too */
    check_case(&cs);
}

static void dropout_mask(void) {
    static const int64_t ns[] = {1037, 7, 3, 1};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (int h = 0; h <= 3; h++) {
            int64_t n = ns[a];
            if (h > n) continue;
            memset(&cs, 0, sizeof cs);
            char *name = (char *)cs.init[1]; /* scratch for the name: operand 1 is unused */
            snprintf(name, 64, "dropout_mask n %lld head_n %d", (long long)n, h);
            cs.name = name;
            /* ctr[0] near 2^32: the blocks carry into ctr[1] */
            lk_dropout_mask_params p = {n, {0x9e3779b9u, 0x7f4a7c15u}, {0xfffffffeu, 7u, 3u, 1u},
                                        {next() << 8, next() << 8, next() << 8}, h, 0.3f * 16777216.0f};
            cs.d = (lk_op_desc){.op = LK_OP_DROPOUT_MASK, .dtype = {LK_U8}, .dropout_mask = p};
            cs.other = cs.d;
            cs.other.dropout_mask.ctr[0] = 5u, cs.other.dropout_mask.ctr[1] = 9u;
            for (int i = 0; i < 3; i++) cs.other.dropout_mask.head[i] = ~cs.d.dropout_mask.head[i];
            cs.other.dropout_mask.head_n = h == 0 && n > 0 ? 1 : 0;
            cs.nx = 1;
            fill_zero(&cs, 0, (size_t)n);
            check_case(&cs);
        }
}

/* An update over N parameters: p, g, then the state arrays named by has[]. */
static void optim(const char *name, lk_optim_params o, bool bf16, const bool has[3], lk_optim_params other) {
    memset(&cs, 0, sizeof cs);
    cs.name = name;
    lk_dtype dt = bf16 ? LK_BF16 : LK_F32;
    o.n = other.n = N;
    cs.d = (lk_op_desc){.op = LK_OP_OPTIM_UPDATE, .dtype = {dt, dt, LK_F32, LK_F32, LK_F32}, .optim = o};
    cs.other = cs.d;
    cs.other.optim = other;
    cs.nx = 5;
    if (bf16) fill_bf16(&cs, 0, N, -1, 1), fill_bf16(&cs, 1, N, -1, 1);
    else fill_f32(&cs, 0, N, -1, 1), fill_f32(&cs, 1, N, -1, 1);
    for (int i = 0; i < 3; i++)
        if (has[i]) fill_f32(&cs, 2 + i, N, o.rule == LK_OPTIM_RULE_SGD ? -1 : 0, 1); /* squares stay >= 0 */
    check_case(&cs);
}

static void optim_update(void) {
    const bool none[3] = {false, false, false}, one[3] = {true, false, false}, two[3] = {true, true, false},
               three[3] = {true, true, true}, sq_gavg[3] = {true, false, true};
    /* Adam / AdamW: the step's bias corrections, lr, beta1 (OneCycle's momentum) */
    lk_optim_params adam = {.rule = LK_OPTIM_RULE_ADAM, .step = 7, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    lk_optim_params adam2 = adam;
    adam2.step = 8, adam2.lr = 2e-3, adam2.beta1 = 0.85;
    optim("adam", adam, false, two, adam2);
    optim("adam bf16", adam, true, two, adam2);
    lk_optim_params l2 = adam, l2b = adam2;
    l2.weight_decay = l2b.weight_decay = 0.01;
    optim("adam l2, amsgrad", l2, false, three, l2b);
    lk_optim_params aw = l2, awb = l2b;
    aw.adamw = awb.adamw = true;
    optim("adamw", aw, false, two, awb);
    lk_optim_params awm = aw, awmb = awb;
    awm.maximize = awmb.maximize = true, awm.step = 1;
    optim("adamw step 1, maximize, amsgrad", awm, false, three, awmb);
    /* SGD: lr, momentum; step 1 (`first`) against a later step */
    lk_optim_params sgd = {.rule = LK_OPTIM_RULE_SGD, .step = 1, .lr = 0.1, .momentum = 0.9, .dampening = 0.1};
    lk_optim_params sgd2 = sgd;
    sgd2.step = 2, sgd2.lr = 0.05, sgd2.momentum = 0.85;
    optim("sgd momentum, step 1", sgd, false, one, sgd2);
    sgd.step = 4, sgd2.step = 5;
    optim("sgd momentum", sgd, false, one, sgd2);
    sgd.nesterov = sgd2.nesterov = true, sgd.dampening = sgd2.dampening = 0.0, sgd.weight_decay = sgd2.weight_decay = 1e-4;
    optim("sgd nesterov, weight decay", sgd, false, one, sgd2);
    lk_optim_params plain = {.rule = LK_OPTIM_RULE_SGD, .step = 3, .lr = 0.1}, plain2 = plain;
    plain2.lr = 0.2, plain2.step = 4;
    optim("sgd plain", plain, false, none, plain2);
    /* RMSprop: lr, momentum; centered or not */
    lk_optim_params rms = {.rule = LK_OPTIM_RULE_RMSPROP, .step = 3, .lr = 1e-2, .alpha = 0.99, .eps = 1e-8};
    lk_optim_params rms2 = rms;
    rms2.lr = 3e-3, rms2.step = 4;
    optim("rmsprop", rms, false, one, rms2);
    optim("rmsprop centered", rms, false, sq_gavg, rms2);
    rms.momentum = 0.9, rms2.momentum = 0.8, rms.weight_decay = rms2.weight_decay = 0.01;
    optim("rmsprop momentum, centered, weight decay", rms, false, three, rms2);
}

/* lk__op_live_size > 0 exactly for the kinds with live fields, and those
 * are the four of issue 21 (an optimizer update under each rule). */
static void live_sizes(void) {
    for (int k = 0; k < LK_OP_COUNT; k++) {
        const lk_op_info *oi = lk__op_info((lk_op_kind)k);
        CHECK_MSG(oi != NULL, "op kind %d has no field table", k);
        if (!oi) continue;
        bool marked = false;
        for (int f = 0; f < oi->n; f++) marked |= oi->f[f].live;
        bool listed = k == LK_OP_OPTIM_UPDATE || k == LK_OP_DROPOUT_MASK || k == LK_OP_AFFINE || k == LK_OP_UNSCALE;
        CHECK_MSG(marked == listed, "%s: live fields %s", oi->name, marked ? "marked (not a live kind)" : "missing");
        for (int r = 0; r < (k == LK_OP_OPTIM_UPDATE ? 3 : 1); r++) {
            lk_op_desc d = {.op = (lk_op_kind)k};
            if (k == LK_OP_OPTIM_UPDATE) d.optim.rule = (lk_optim_rule)r;
            size_t n = lk__op_live_size(&d);
            CHECK_MSG((n > 0) == listed, "%s (rule %d): live size %zu", oi->name, r, n);
        }
    }
}

static void setup(void) {
    dev_of[ON_CPU] = LK_DEVICE_CPU;
    dev_of[ON_SEALED] = sealed_device(0);
    dev_of[ON_DEBUG] = dbg_backend_device();
}

LK_TEST_MAIN(LK_TEST_CASE(setup), LK_TEST_CASE(live_sizes), LK_TEST_CASE(affine), LK_TEST_CASE(unscale),
             LK_TEST_CASE(dropout_mask), LK_TEST_CASE(optim_update))

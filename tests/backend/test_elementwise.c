/* The element-wise op descriptors and the backend registry.
 *
 * bf16/f16 operands: the CPU backend widens each operand, computes in f32 and
 * rounds each output element once, so its result must equal, bit for bit,
 * the f32 descriptor over the widened inputs rounded once to the output's
 * dtype; operands of different dtypes mix. The registry: a device kind's own
 * backend runs what it supports; what it lacks runs on the CPU backend when
 * the device is host-addressable (and lk__backend_fallbacks counts it),
 * otherwise it is an UNSUPPORTED error naming the op, the dtypes, the
 * backend and the device. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "lk_test.h"
#include "lockstep/device.h"
#include "lockstep/dtype.h"

#define N 37 /* not a multiple of 8 or 16: the vector loops' tails run too */

static float xs[N], ys[N], gs[N];

static void fill(void) {
    for (int i = 0; i < N; i++) {
        xs[i] = (float)(i - 18) * 0.173f + 0.0071f * (float)(i * i % 7); /* both signs, not representable in bf16 */
        ys[i] = 0.5f + (float)i * 0.0913f;                                 /* positive: log, sqrt, div */
        gs[i] = 1.0f - (float)(i % 5) * 0.377f;
    }
}

static uint16_t round_to(lk_dtype dt, float v) { return dt == LK_BF16 ? lk_f32_to_bf16_bits(v) : lk_f32_to_f16_bits(v); }
static float widen(lk_dtype dt, uint16_t h) { return dt == LK_BF16 ? lk_bf16_bits_to_f32(h) : lk_f16_bits_to_f32(h); }

/* Runs d with every input in `in` and the output (last operand) in `out`
 * over xs / ys / gs rounded to `in`, and the same descriptor in f32 over the
 * rounded values; the results must agree after rounding the f32 one once. */
static void check_lowp(lk_op_desc d, lk_dtype in, lk_dtype out, const char *what) {
    int arity = lk__op_arity(d.op), wr = arity - 1;
    const float *src[4] = {xs, ys, gs, gs};
    if (d.op == LK_OP_UNARY && (d.unary.fn == LK_UNARY_LOG || d.unary.fn == LK_UNARY_SQRT)) src[0] = ys;
    uint16_t h[4][N];
    float f[4][N], got32[N];
    bool out_read = d.op == LK_OP_AXPY || (d.op == LK_OP_UNARY_BACKWARD && d.unary.acc);
    void *lops[4], *fops[4];
    for (int k = 0; k < arity; k++) {
        lk_dtype dt = k == wr ? out : in;
        bool load = k != wr || out_read;
        for (int i = 0; i < N; i++) {
            float v = load ? src[k][i] : 0.0f;
            if (dt == LK_F32) f[k][i] = v;
            else h[k][i] = round_to(dt, v), f[k][i] = widen(dt, h[k][i]);
        }
        if (dt == LK_F32) memcpy(got32, f[k], sizeof got32);
        lops[k] = dt == LK_F32 ? (void *)got32 : (void *)h[k];
        fops[k] = f[k];
        d.dtype[k] = dt;
    }
    lk_op_desc fd = d;
    for (int k = 0; k < 4; k++) fd.dtype[k] = LK_F32;
    CHECK(lk__cpu_backend.supports(&d));
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, lops));
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &fd, fops));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        float want = out == LK_F32 ? f[wr][i] : widen(out, round_to(out, f[wr][i]));
        float got = out == LK_F32 ? got32[i] : widen(out, h[wr][i]);
        if (memcmp(&want, &got, sizeof got) && !(want != want && got != got) && !bad++)
            fprintf(stderr, "%s %s -> %s: element %d: %.9g, the f32 result rounded once is %.9g\n", what,
                    lk_dtype_name(in), lk_dtype_name(out), i, got, want);
    }
    CHECK_MSG(bad == 0, "%s %s -> %s: %d elements differ", what, lk_dtype_name(in), lk_dtype_name(out), bad);
}

static void lowp_equals_f32_rounded_once(void) {
    fill();
    const lk_dtype cfg[][2] = {{LK_BF16, LK_BF16}, {LK_F16, LK_F16}, {LK_BF16, LK_F32}, {LK_F16, LK_BF16}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        lk_dtype in = cfg[c][0], out = cfg[c][1];
        for (int fn = 0; fn < LK_UNARY_COUNT; fn++) {
            lk_op_desc d = {.op = LK_OP_UNARY};
            d.unary = (lk_unary_params){(lk_unary_op)fn, N, 0.2f, false};
            check_lowp(d, in, out, lk__unary_name((lk_unary_op)fn));
            d.op = LK_OP_UNARY_BACKWARD;
            d.unary.acc = fn % 2 == 0; /* both forms */
            check_lowp(d, in, out, "unary_backward");
        }
        for (int fn = 0; fn < 4; fn++) { /* [37] (op) [37] and a broadcast [1] operand */
            lk_op_desc d = {.op = LK_OP_BINARY};
            d.binary.fn = (lk_binary_op)fn;
            d.binary.ndim = 1;
            d.binary.shape[0] = N, d.binary.sa[0] = 1, d.binary.sb[0] = fn % 2;
            check_lowp(d, in, out, lk__binary_name((lk_binary_op)fn));
        }
        lk_op_desc d = {.op = LK_OP_AXPY};
        d.axpy = (lk_axpy_params){N, -0.75f};
        check_lowp(d, in, out, "axpy");
        d = (lk_op_desc){.op = LK_OP_AFFINE};
        d.affine = (lk_affine_params){N, 1.7f, -0.3f, true};
        check_lowp(d, in, out, "affine");
    }
}

/* sum_to in bf16: 37 x 3 summed over rows into 3 (f32 sums, one rounding). */
static void sum_to_lowp(void) {
    float src[N * 3], want[3] = {0, 0, 0};
    uint16_t hs[N * 3], hd[3] = {0, 0, 0};
    for (int i = 0; i < N * 3; i++) hs[i] = lk_f32_to_bf16_bits((float)i * 0.37f - 11.0f), src[i] = lk_bf16_bits_to_f32(hs[i]);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < 3; j++) want[j] += src[i * 3 + j];
    lk_op_desc d = {.op = LK_OP_SUM_TO, .dtype = {LK_BF16, LK_BF16}};
    d.sum_to.ndim = 2;
    d.sum_to.shape[0] = N, d.sum_to.shape[1] = 3, d.sum_to.sd[0] = 0, d.sum_to.sd[1] = 1;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){hs, hd}));
    for (int j = 0; j < 3; j++) CHECK(hd[j] == lk_f32_to_bf16_bits(want[j]));
}

/* ---- the registry ------------------------------------------------------------- */

static long narrow_ran;
/* A backend that takes only f32 unary descriptors. */
static bool narrow_supports(const lk_op_desc *d) {
    return d->op == LK_OP_UNARY && d->dtype[0] == LK_F32 && d->dtype[1] == LK_F32;
}
static lk_status narrow_run(const lk_op_desc *d, void *const *x) {
    narrow_ran++;
    const float *in = x[0];
    float *out = x[1];
    for (int64_t i = 0; i < d->unary.n; i++) out[i] = lk_k_unary(d->unary.fn, in[i], d->unary.alpha);
    return LK_STATUS_OK;
}
static const lk_backend narrow = {.name = "narrow", .supports = narrow_supports, .run = narrow_run};

static lk_status host_alloc(void *ctx, int index, size_t bytes, void **ptr) {
    (void)ctx, (void)index;
    *ptr = lk_aligned_alloc(LK_ALIGN, bytes ? bytes : 1);
    return *ptr ? LK_STATUS_OK : LK_STATUS_OUT_OF_MEMORY;
}
static void host_free(void *ctx, int index, void *ptr, size_t bytes) {
    (void)ctx, (void)index, (void)bytes;
    lk_aligned_free(ptr);
}
static lk_status host_copy(void *ctx, int index, void *dst, const void *src, size_t bytes) {
    (void)ctx, (void)index;
    memcpy(dst, src, bytes);
    return LK_STATUS_OK;
}
static lk_status host_memset(void *ctx, int index, void *p, int v, size_t bytes) {
    (void)ctx, (void)index;
    memset(p, v, bytes);
    return LK_STATUS_OK;
}
static const lk_device_vtable hosty = {.name = "hosty", .host_addressable = true, .alloc = host_alloc, .free = host_free};
/* Memory the CPU cannot read, as far as the registry knows (copies only). */
static const lk_device_vtable farry = {.name = "farry",
                                       .host_addressable = false,
                                       .alloc = host_alloc,
                                       .free = host_free,
                                       .memset = host_memset,
                                       .copy_to_host = host_copy,
                                       .copy_from_host = host_copy,
                                       .copy = host_copy};

static void fallback_is_counted(void) {
    fill();
    lk_device_kind k = LK_CPU;
    CHECK_OK(lk_device_register(&hosty, NULL, &k));
    lk_device dev = {k, 0};
    CHECK(lk__backend(dev) == &lk__cpu_backend); /* no backend of its own yet: the CPU's */
    CHECK_OK(lk__backend_register(k, &narrow));
    CHECK(lk__backend(dev) == &narrow);
    float y[N], z[N];
    int64_t fb = lk__backend_fallbacks();
    /* supported: runs on its own backend, no fallback */
    CHECK_OK(lk__unary_f32(dev, LK_UNARY_TANH, N, xs, y, 0));
    CHECK(narrow_ran == 1 && lk__backend_fallbacks() == fb);
    /* not supported: the CPU backend runs it on the host-addressable memory, counted once */
    CHECK_OK(lk__binary_f32(dev, LK_BINARY_MUL, 1, (int64_t[]){N}, xs, (int64_t[]){1}, ys, (int64_t[]){1}, z));
    CHECK(narrow_ran == 1 && lk__backend_fallbacks() == fb + 1);
    for (int i = 0; i < N; i++) CHECK(z[i] == xs[i] * ys[i] && y[i] == tanhf(xs[i]));
    /* neither backend has it: named */
    lk_op_desc d = {.op = LK_OP_UNARY, .dtype = {LK_I32, LK_F32}};
    d.unary = (lk_unary_params){LK_UNARY_RELU, 4, 0, false};
    CHECK_ERR(lk__backend_run(dev, &d, (void *[]){y, z}), LK_STATUS_UNSUPPORTED,
              "the narrow backend has no unary relu i32 -> f32 (4) (device hosty:0), and neither has the cpu backend");
    CHECK(lk__backend_fallbacks() == fb + 1);
    CHECK_OK(lk__backend_register(k, NULL)); /* removed again: the CPU's */
    CHECK(lk__backend(dev) == &lk__cpu_backend);
}

static void unsupported_is_named(void) {
    float buf[8] = {0};
    lk_device_kind k = LK_CPU;
    CHECK_OK(lk_device_register(&farry, NULL, &k));
    lk_device dev = {k, 0};
    CHECK_OK(lk__backend_register(k, &narrow));
    int64_t fb = lk__backend_fallbacks();
    lk_op_desc d = {.op = LK_OP_BINARY, .dtype = {LK_F32, LK_BF16, LK_F32}};
    d.binary.fn = LK_BINARY_DIV;
    d.binary.ndim = 2, d.binary.shape[0] = 2, d.binary.shape[1] = 3;
    CHECK_ERR(lk__backend_run(dev, &d, (void *[]){buf, buf, buf}), LK_STATUS_UNSUPPORTED,
              "the narrow backend has no binary div f32, bf16 -> f32 (2x3), and device farry:0 is not "
              "host-addressable, so the CPU backend cannot run it there");
    CHECK(lk__backend_fallbacks() == fb); /* no fallback for memory the CPU cannot read */
    CHECK_OK(lk__backend_register(k, NULL));
    /* the CPU backend's own answer for a dtype no family takes */
    lk_op_desc u = {.op = LK_OP_UNARY_BACKWARD, .dtype = {LK_F32, LK_F32, LK_F64, LK_F32}};
    u.unary = (lk_unary_params){LK_UNARY_SILU, 5, 0, true};
    CHECK(!lk__cpu_backend.supports(&u));
    CHECK_ERR(lk__backend_run(LK_DEVICE_CPU, &u, (void *[]){buf, buf, buf, buf}), LK_STATUS_UNSUPPORTED,
              "the cpu backend has no unary_backward silu x f32, y f32, dy f64 -> dx f32 (5) (device cpu)");
    /* kinds out of range */
    CHECK_ERR(lk__backend_register(LK_CPU, &narrow), LK_STATUS_INVALID_ARGUMENT, "kind 0 is the CPU's own backend");
    CHECK_ERR(lk__backend_register(LK_DEVICE_KIND_MAX, &narrow), LK_STATUS_INVALID_ARGUMENT, "device kind 8 out of range");
}

/* Every op kind has an arity within the operand table and a name in messages. */
static void every_kind_is_described(void) {
    for (int k = 0; k < LK_OP_COUNT; k++) {
        lk_op_desc d = {.op = (lk_op_kind)k};
        char buf[200];
        lk__op_desc_str(&d, buf, sizeof buf);
        CHECK_MSG(lk__op_arity((lk_op_kind)k) > 0 && lk__op_arity((lk_op_kind)k) <= LK_OP_MAX_OPERANDS,
                  "op %d: arity %d", k, lk__op_arity((lk_op_kind)k));
        CHECK_MSG(strncmp(buf, "op ", 3) != 0, "op %d has no description (\"%s\")", k, buf);
    }
}

/* LK_OP_DROPOUT_MASK against its definition: the head words first, then
 * the words of Philox blocks ctr, ctr + 1, ... (the low counter word
 * carrying into the next), keep = !(uniform < p) on each; n from 0 to 99
 * (the x8 groups, single blocks and partial tails), every head length.
 * LK_OP_INCREMENT adds with two's complement wrap. */
static void dropout_mask_and_increment(void) {
    static uint8_t keep[100];
    const uint32_t key[2] = {0xdeadbeefu, 42}, head[3] = {0x00000000u, 0xffffffffu, 0x4c000000u};
    int bad = 0;
    for (int h = 0; h <= 3; h++)
        for (int64_t n = h; n < 100; n++) {
            lk_op_desc d = {.op = LK_OP_DROPOUT_MASK, .dtype = {LK_U8}};
            d.dropout_mask = (lk_dropout_mask_params){.n = n, .key = {key[0], key[1]}, .ctr = {0xfffffffdu, 7, 1, 2},
                                                      .head = {head[0], head[1], head[2]}, .head_n = h, .thr = 0.3f * 16777216.0f};
            memset(keep, 0xAA, sizeof keep);
            CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){keep}));
            uint32_t ctr[4] = {0xfffffffdu, 7, 1, 2}, w[4];
            for (int64_t i = 0; i < n; i++) {
                uint32_t word;
                if (i < h) {
                    word = head[i];
                } else {
                    int64_t j = i - h;
                    if (j % 4 == 0) {
                        lk_philox4x32_10(ctr, key, w);
                        if (++ctr[0] == 0) ctr[1]++;
                    }
                    word = w[j % 4];
                }
                bad += keep[i] != !((float)(word >> 8) * (1.0f / 16777216.0f) < 0.3f);
            }
            bad += keep[n] != 0xAA; /* nothing past n */
        }
    CHECK_MSG(bad == 0, "%d mask bytes differ from the definition", bad);
    int64_t v[3] = {5, -1, INT64_MAX};
    lk_op_desc d = {.op = LK_OP_INCREMENT, .dtype = {LK_I64}};
    d.increment = (lk_increment_params){3, 1};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){v}));
    CHECK(v[0] == 6 && v[1] == 0 && v[2] == INT64_MIN);
    d.increment.by = -1;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){v}));
    CHECK(v[0] == 5 && v[1] == -1 && v[2] == INT64_MAX);
}

/* ReLU with every operand in bf16 (or f16) runs on the bits (relu16 in
 * elementwise.c): over every one of the 65536 inputs, and dy taken from
 * every pattern too (NaNs of both signs and payloads, infinities,
 * subnormals, -0), forward and backward give exactly the bits of the f32
 * loop over the widened operands rounded once — the NaNs' bits included,
 * which check_lowp lets pass as any NaN. */
static void relu16_every_bit_pattern(void) {
    enum { M = 65536 };
    static uint16_t h[M], dy[M], got[M];
    static float f[M], fdy[M], fout[M];
    const lk_dtype dts[] = {LK_BF16, LK_F16};
    for (size_t c = 0; c < 2; c++) {
        lk_dtype dt = dts[c];
        for (int i = 0; i < M; i++) {
            h[i] = (uint16_t)i, dy[i] = (uint16_t)(i * 40503u + 12345u); /* every pattern once, in another order */
            f[i] = widen(dt, h[i]), fdy[i] = widen(dt, dy[i]);
        }
        lk_op_desc d = {.op = LK_OP_UNARY, .dtype = {dt, dt}};
        d.unary = (lk_unary_params){LK_UNARY_RELU, M - 3, 0.0f, false}; /* a tail the vector loop leaves */
        lk_op_desc fd = d;
        fd.dtype[0] = fd.dtype[1] = LK_F32;
        CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){h, got}));
        CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &fd, (void *[]){f, fout}));
        int bad = 0;
        for (int i = 0; i < M - 3; i++)
            if (got[i] != round_to(dt, fout[i]) && !bad++)
                fprintf(stderr, "relu %s: input 0x%04x gives 0x%04x, the f32 loop rounded 0x%04x\n", lk_dtype_name(dt),
                        h[i], got[i], round_to(dt, fout[i]));
        CHECK_MSG(bad == 0, "relu %s forward: %d of %d inputs differ", lk_dtype_name(dt), bad, M - 3);
        d.op = fd.op = LK_OP_UNARY_BACKWARD;
        d.dtype[2] = d.dtype[3] = dt, fd.dtype[2] = fd.dtype[3] = LK_F32;
        CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){h, NULL, dy, got}));
        CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &fd, (void *[]){f, NULL, fdy, fout}));
        bad = 0;
        for (int i = 0; i < M - 3; i++)
            if (got[i] != round_to(dt, fout[i]) && !bad++)
                fprintf(stderr, "relu backward %s: x 0x%04x dy 0x%04x gives 0x%04x, the f32 loop rounded 0x%04x\n",
                        lk_dtype_name(dt), h[i], dy[i], got[i], round_to(dt, fout[i]));
        CHECK_MSG(bad == 0, "relu %s backward: %d of %d inputs differ", lk_dtype_name(dt), bad, M - 3);
    }
}

/* A dense 16-bit binary op longer than the backend's blocks (cpu/
 * elementwise.c runs it a block at a time, a broadcast one over whole
 * widened arrays): [3, 1, 1000] in bf16 and f16, each output element the f32
 * operation on the widened inputs, rounded once, and the broadcast form of
 * the same op agrees with it bit for bit. */
static void lowp_binary_in_blocks(void) {
    enum { R = 3, C = 1000, M = R * C };
    static uint16_t a[M], b[M], o[M], ob[M];
    const lk_dtype dts[] = {LK_BF16, LK_F16};
    for (int t = 0; t < 2; t++) {
        lk_dtype dt = dts[t];
        for (int i = 0; i < M; i++)
            a[i] = round_to(dt, (float)(i % 97) * 0.173f - 7.0f), b[i] = round_to(dt, 0.5f + (float)(i % 13) * 0.0913f);
        for (int fn = 0; fn < 4; fn++) {
            lk_op_desc d = {.op = LK_OP_BINARY, .dtype = {dt, dt, dt}};
            d.binary.fn = (lk_binary_op)fn;
            d.binary.ndim = 3;
            d.binary.shape[0] = R, d.binary.shape[1] = 1, d.binary.shape[2] = C;
            d.binary.sa[0] = d.binary.sb[0] = C, d.binary.sa[1] = d.binary.sb[1] = 7, d.binary.sa[2] = d.binary.sb[2] = 1;
            CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){a, b, o}));
            int bad = 0;
            for (int i = 0; i < M; i++) {
                float x = widen(dt, a[i]), y = widen(dt, b[i]);
                float want = fn == 0 ? x + y : fn == 1 ? x - y : fn == 2 ? x * y : x / y;
                if (o[i] != round_to(dt, want) && !bad++)
                    fprintf(stderr, "%s %s [3, 1, 1000]: element %d: %g, want %g\n", lk__binary_name((lk_binary_op)fn),
                            lk_dtype_name(dt), i, widen(dt, o[i]), widen(dt, round_to(dt, want)));
            }
            CHECK_MSG(bad == 0, "%s %s: %d elements differ from the f32 result rounded once",
                      lk__binary_name((lk_binary_op)fn), lk_dtype_name(dt), bad);
            /* the same op with b broadcast over a size-1 middle dimension of stride 0: the whole-array path */
            d.binary.shape[0] = 1, d.binary.shape[1] = R, d.binary.sb[1] = 0, d.binary.sa[1] = C;
            d.binary.sa[0] = d.binary.sb[0] = M;
            CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){a, b, ob}));
            bad = 0;
            for (int i = 0; i < M; i++) {
                float x = widen(dt, a[i]), y = widen(dt, b[i % C]);
                float want = fn == 0 ? x + y : fn == 1 ? x - y : fn == 2 ? x * y : x / y;
                bad += ob[i] != round_to(dt, want);
            }
            CHECK_MSG(bad == 0, "%s %s broadcast: %d elements differ", lk__binary_name((lk_binary_op)fn),
                      lk_dtype_name(dt), bad);
        }
    }
}

LK_TEST_MAIN(LK_TEST_CASE(lowp_equals_f32_rounded_once), LK_TEST_CASE(sum_to_lowp), LK_TEST_CASE(fallback_is_counted),
             LK_TEST_CASE(unsupported_is_named), LK_TEST_CASE(every_kind_is_described),
             LK_TEST_CASE(dropout_mask_and_increment), LK_TEST_CASE(relu16_every_bit_pattern),
             LK_TEST_CASE(lowp_binary_in_blocks))

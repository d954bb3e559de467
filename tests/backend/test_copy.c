/* LK_OP_COPY on the CPU backend against a reference multi-index loop: a
 * transposed source, a destination slab (concat's), size-1 and size-0
 * dimensions, a scalar, 2-byte elements; bits move unchanged (NaN payloads
 * included); a dtype change is a cast, element by element as the scalar
 * conversions; fills (LK_OP_FILL, and a large one cut across threads);
 * a stride-0 source (linear's bias rows), conv's dY gather, and the f32
 * accumulating form (strided gradient accumulation). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "lk_test.h"

static uint32_t src[4096], dst[4096], ref[4096];

static void reference(const lk_copy_params *p, size_t es) {
    int64_t n = 1;
    for (int k = 0; k < p->ndim; k++) n *= p->shape[k];
    for (int64_t i = 0; i < n; i++) {
        int64_t r = i, os = 0, od = 0;
        for (int k = p->ndim - 1; k >= 0; k--) {
            os += (r % p->shape[k]) * p->ss[k], od += (r % p->shape[k]) * p->sd[k];
            r /= p->shape[k];
        }
        memcpy((char *)ref + od * (int64_t)es, (const char *)src + os * (int64_t)es, es);
    }
}

static void check_copy(lk_copy_params p, lk_dtype dt, const char *what) {
    size_t es = lk_dtype_size(dt);
    for (int i = 0; i < 4096; i++) src[i] = 0x7fc00000u + (uint32_t)i * 2654435761u % 977; /* NaN payloads too */
    memset(dst, 0xab, sizeof dst);
    memset(ref, 0xab, sizeof ref);
    reference(&p, es);
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {dt, dt}, .copy = p};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){src, dst}));
    CHECK_MSG(memcmp(dst, ref, sizeof dst) == 0, "%s: copy differs from the reference", what);
}

static void copies(void) {
    /* [4, 5, 6] read transposed (dims 0 and 2 swapped) into contiguous */
    check_copy((lk_copy_params){3, {6, 5, 4}, {1, 6, 30}, {20, 4, 1}, false}, LK_F32, "transposed source");
    /* a [3, 2, 7] block into a [3, 5, 7] slab at offset 0 (concat along dim 1) */
    check_copy((lk_copy_params){3, {3, 2, 7}, {14, 7, 1}, {35, 7, 1}, false}, LK_F32, "concat slab");
    /* fully contiguous, with size-1 dims in between */
    check_copy((lk_copy_params){4, {3, 1, 8, 1}, {8, 8, 1, 1}, {8, 8, 1, 1}, false}, LK_F32, "contiguous");
    check_copy((lk_copy_params){0, {0}, {0}, {0}, false}, LK_F32, "scalar");
    check_copy((lk_copy_params){2, {5, 0}, {3, 1}, {0, 1}, false}, LK_F32, "empty");
    check_copy((lk_copy_params){2, {9, 11}, {1, 9}, {11, 1}, false}, LK_BF16, "bf16 transposed");
    check_copy((lk_copy_params){2, {4, 3}, {6, 2}, {3, 1}, false}, LK_F64, "f64 strided");
    /* a row broadcast down 7 rows (source stride 0: linear's bias) */
    check_copy((lk_copy_params){2, {7, 9}, {0, 1}, {9, 1}, false}, LK_F32, "broadcast row");
    /* [O=3, cur=4, P=5] planes of NCHW dY gathered into [O, cur*P] (conv's dY) */
    check_copy((lk_copy_params){3, {3, 4, 5}, {5, 15, 1}, {20, 5, 1}, false}, LK_BF16, "conv dY gather");
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {LK_F32, LK_DTYPE_COUNT}, .copy = {1, {3}, {1}, {1}, false}};
    CHECK_ERR(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){src, dst}), LK_STATUS_UNSUPPORTED, "the cpu backend has no copy f32 -> ?");
}

/* A dtype change is a cast (lk_tensor_copy and lk_tensor_cast run on it):
 * strided or contiguous (the bulk f32 <-> 16-bit conversions), each element
 * as the scalar conversions give it; integers exactly through int64, floats
 * to integers truncated. */
static void casts(void) {
    static float f[64], fb[64];
    static uint16_t h[64];
    static int64_t i64[64];
    static int32_t i32[64];
    for (int i = 0; i < 64; i++) f[i] = (float)(i - 20) * 0.3337f + (i == 5 ? 1e30f : 0) + (i == 6 ? NAN : 0);
    /* f32 -> bf16, source read transposed ([8, 8]) */
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {LK_F32, LK_BF16}, .copy = {2, {8, 8}, {1, 8}, {8, 1}, false}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){f, h}));
    bool ok = true;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) ok = ok && h[r * 8 + c] == lk_f32_to_bf16(f[c * 8 + r]);
    CHECK_MSG(ok, "strided f32 -> bf16");
    /* contiguous f32 -> f16 and back (the bulk paths) */
    d = (lk_op_desc){.op = LK_OP_COPY, .dtype = {LK_F32, LK_F16}, .copy = {1, {64}, {1}, {1}, false}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){f, h}));
    ok = true;
    for (int i = 0; i < 64; i++) ok = ok && h[i] == lk_f32_to_f16(f[i]);
    CHECK_MSG(ok, "contiguous f32 -> f16");
    d.dtype[0] = LK_F16, d.dtype[1] = LK_F32;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){h, fb}));
    ok = true;
    for (int i = 0; i < 64; i++) ok = ok && (isnan(fb[i]) ? isnan(lk_f16_to_f32(h[i])) : fb[i] == lk_f16_to_f32(h[i]));
    CHECK_MSG(ok, "contiguous f16 -> f32");
    /* i64 -> i32 and back, exactly (values past 2^53 would lose bits through double) */
    for (int i = 0; i < 64; i++) i64[i] = (int64_t)i * 1000003 - 7;
    d = (lk_op_desc){.op = LK_OP_COPY, .dtype = {LK_I64, LK_I32}, .copy = {1, {64}, {1}, {1}, false}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){i64, i32}));
    ok = true;
    for (int i = 0; i < 64; i++) ok = ok && i32[i] == (int32_t)i64[i];
    CHECK_MSG(ok, "i64 -> i32");
    int64_t big = (INT64_C(1) << 60) + 1, back = 0;
    d = (lk_op_desc){.op = LK_OP_COPY, .dtype = {LK_I64, LK_I64}, .copy = {0, {0}, {0}, {0}, false}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){&big, &back}));
    CHECK(back == big);
    /* f32 -> i64 truncates toward zero */
    float neg = -2.75f;
    d.dtype[0] = LK_F32;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){&neg, &back}));
    CHECK(back == -2);
}

/* LK_OP_FILL: a strided view (every other column) and a contiguous block,
 * in f32, bf16 and i64; the rest untouched. */
static void fills(void) {
    static float f[40];
    static uint16_t h[16];
    static int64_t q[5];
    for (int i = 0; i < 40; i++) f[i] = -1.0f;
    lk_op_desc d = {.op = LK_OP_FILL, .dtype = {LK_F32}, .fill = {2, {4, 5}, {10, 2}, 2.5}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){f}));
    bool ok = true;
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 10; c++) ok = ok && f[r * 10 + c] == (c % 2 == 0 ? 2.5f : -1.0f);
    CHECK_MSG(ok, "strided f32 fill");
    d = (lk_op_desc){.op = LK_OP_FILL, .dtype = {LK_BF16}, .fill = {1, {16}, {1}, 0.1}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){h}));
    ok = true;
    for (int i = 0; i < 16; i++) ok = ok && h[i] == lk_f32_to_bf16(0.1f);
    CHECK_MSG(ok, "bf16 fill");
    d = (lk_op_desc){.op = LK_OP_FILL, .dtype = {LK_I64}, .fill = {1, {5}, {1}, -3.0}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){q}));
    CHECK(q[0] == -3 && q[4] == -3);
    /* a float outside an integer's range: defined (saturated; NaN 0), never
     * C's undefined cast, which UBSan reports (the f64 fill of a loss
     * scaler's growth factor 1e163 computed one: found by fuzz_resume) */
    static double big[1];
    d = (lk_op_desc){.op = LK_OP_FILL, .dtype = {LK_F64}, .fill = {1, {1}, {1}, 1.4e163}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){big}));
    CHECK(big[0] == 1.4e163);
    d = (lk_op_desc){.op = LK_OP_FILL, .dtype = {LK_I64}, .fill = {1, {5}, {1}, 1e300}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){q}));
    CHECK(q[0] == INT64_MAX && q[4] == INT64_MAX);
    lk_tensor *src = lk_tensor_empty(LK_F64, 1, (int64_t[]){4});
    double *sv = src ? src->data : NULL;
    if (sv) sv[0] = 1e300, sv[1] = -1e300, sv[2] = NAN, sv[3] = -7.9;
    lk_tensor *i64 = src ? lk_tensor_cast(src, LK_I64) : NULL, *i32 = src ? lk_tensor_cast(src, LK_I32) : NULL,
              *u8 = src ? lk_tensor_cast(src, LK_U8) : NULL;
    CHECK_MSG(i64 && i32 && u8, "casts of f64 to integers");
    if (i64 && i32 && u8) {
        const int64_t *a = i64->data;
        const int32_t *b = i32->data;
        const uint8_t *c = u8->data;
        CHECK(a[0] == INT64_MAX && a[1] == INT64_MIN && a[2] == 0 && a[3] == -7);
        CHECK(b[0] == INT32_MAX && b[1] == INT32_MIN && b[2] == 0 && b[3] == -7);
        CHECK(c[0] == 255 && c[1] == 0 && c[2] == 0 && c[3] == 0);
    }
    lk_tensor_release(src), lk_tensor_release(i64), lk_tensor_release(i32), lk_tensor_release(u8);
}

/* A contiguous fill large enough to be cut across the compute threads
 * (lk_strategy_zero_grad's): every element set, with 1, 2 and 3 threads, for
 * zero, -0.0 (not memset's zero), a value, in 4-, 2- and 8-byte dtypes,
 * n not a multiple of the cut's 16; nothing past the end touched. */
static void fills_cut(void) {
    enum { N = 300007 };
    static uint64_t buf[N + 1];
    static const struct { lk_dtype dt; double v; uint64_t bits; } cases[] = {
        {LK_F32, 0.0, 0}, {LK_F32, -0.0, 0x80000000u}, {LK_F32, 1.5, 0x3fc00000u},
        {LK_BF16, -2.0, 0xc000u}, {LK_I64, 7.0, 7}, {LK_I64, 0.0, 0},
    };
    for (int threads = 1; threads <= 3; threads++) {
        lk_set_num_threads(threads);
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            size_t es = lk_dtype_size(cases[c].dt);
            memset(buf, 0xa5, sizeof buf);
            lk_op_desc d = {.op = LK_OP_FILL, .dtype = {cases[c].dt}, .fill = {1, {N}, {1}, cases[c].v}};
            CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){buf}));
            int64_t bad = -1;
            for (int64_t i = 0; i < N && bad < 0; i++) {
                uint64_t b = 0;
                memcpy(&b, (char *)buf + i * (int64_t)es, es);
                if (b != cases[c].bits) bad = i;
            }
            const unsigned char *end = (const unsigned char *)buf + (size_t)N * es;
            CHECK_MSG(bad < 0 && end[0] == 0xa5 && end[es - 1] == 0xa5,
                      "%d threads, %s fill with %g: element %lld wrong or past the end touched", threads,
                      lk_dtype_name(cases[c].dt), cases[c].v, (long long)bad);
        }
    }
    lk_set_num_threads(2);
}

/* The accumulating form: dst[i] += src[i] in f32, each sum exactly the
 * reference's (one add per element); 16-bit accumulation is refused. */
static void check_accumulate(lk_copy_params p, const char *what) {
    static float fs[4096], fd[4096], fr[4096];
    for (int i = 0; i < 4096; i++) fs[i] = (float)(i % 97) * 0.37f - 11.0f, fd[i] = fr[i] = (float)(i % 13) * 1.9f;
    int64_t n = 1;
    for (int k = 0; k < p.ndim; k++) n *= p.shape[k];
    for (int64_t i = 0; i < n; i++) {
        int64_t r = i, os = 0, od = 0;
        for (int k = p.ndim - 1; k >= 0; k--) {
            os += (r % p.shape[k]) * p.ss[k], od += (r % p.shape[k]) * p.sd[k];
            r /= p.shape[k];
        }
        fr[od] += fs[os];
    }
    p.accumulate = true;
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {LK_F32, LK_F32}, .copy = p};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){fs, fd}));
    CHECK_MSG(memcmp(fd, fr, sizeof fd) == 0, "%s: accumulation differs from the reference", what);
}

static void accumulates(void) {
    check_accumulate((lk_copy_params){3, {6, 5, 4}, {1, 6, 30}, {20, 4, 1}, false}, "transposed source");
    check_accumulate((lk_copy_params){2, {8, 16}, {16, 1}, {16, 1}, false}, "contiguous");
    check_accumulate((lk_copy_params){3, {3, 2, 7}, {14, 7, 1}, {35, 7, 1}, false}, "strided destination");
    check_accumulate((lk_copy_params){2, {7, 9}, {0, 1}, {9, 1}, false}, "broadcast source");
    check_accumulate((lk_copy_params){0, {0}, {0}, {0}, false}, "scalar");
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {LK_BF16, LK_BF16}, .copy = {1, {3}, {1}, {1}, true}};
    CHECK_ERR(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){src, dst}), LK_STATUS_UNSUPPORTED,
              "the cpu backend has no copy accumulate bf16 -> bf16 (3)");
}

LK_TEST_MAIN(LK_TEST_CASE(copies), LK_TEST_CASE(casts), LK_TEST_CASE(fills), LK_TEST_CASE(fills_cut),
             LK_TEST_CASE(accumulates))

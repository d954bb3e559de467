/* LK_OP_COPY on the CPU backend against a reference multi-index loop: a
 * transposed source, a destination slab (concat's), size-1 and size-0
 * dimensions, a scalar, 2-byte elements; bits move unchanged (NaN payloads
 * included); between float dtypes a cast (widen, round once to nearest
 * even: conv's autocast columns), other dtype changes refused;
 * a stride-0 source (linear's bias rows), conv's dY gather, and the f32
 * accumulating form (strided gradient accumulation). */
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
    /* f32 -> bf16 / f16 and back: each element rounded once, as the tensor layer's cast */
    float fs[7] = {1.0f, 1.00390625f, -3.14159f, 1e-7f, 65504.0f, 1e30f, -0.0f};
    uint16_t hb[7], hh[7];
    float back[7];
    lk_op_desc d = {.op = LK_OP_COPY, .dtype = {LK_F32, LK_BF16}, .copy = {1, {7}, {1}, {1}, false}};
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){fs, hb}));
    d.dtype[1] = LK_F16;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){fs, hh}));
    d.dtype[0] = LK_BF16, d.dtype[1] = LK_F32;
    CHECK_OK(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){hb, back}));
    for (int i = 0; i < 7; i++) {
        CHECK_MSG(hb[i] == lk_f32_to_bf16_bits(fs[i]), "cast to bf16 at %d", i);
        CHECK_MSG(hh[i] == lk_f32_to_f16_bits(fs[i]), "cast to f16 at %d", i);
        CHECK_MSG(back[i] == lk_bf16_bits_to_f32(hb[i]), "bf16 widened at %d", i);
    }
    d.dtype[0] = LK_F32, d.dtype[1] = LK_I32;
    CHECK_ERR(lk__backend_run(LK_DEVICE_CPU, &d, (void *[]){src, dst}), LK_STATUS_UNSUPPORTED,
              "the cpu backend has no copy f32 -> i32 (7)");
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

LK_TEST_MAIN(LK_TEST_CASE(copies), LK_TEST_CASE(accumulates))

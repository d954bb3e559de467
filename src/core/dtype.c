/* The dtype table (lockstep/dtype.h): sizes, names and the names users type. */
#include <string.h>

#include "lockstep/dtype.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[] = {
#define LK__DTYPE_INFO(name, str, size, ctype) {str, size},
    LK_DTYPE_LIST(LK__DTYPE_INFO)
#undef LK__DTYPE_INFO
};

size_t lk_dtype_size(lk_dtype dt) { return (unsigned)dt < LK_DTYPE_COUNT ? dtype_info[dt].size : 0; }
const char *lk_dtype_name(lk_dtype dt) { return (unsigned)dt < LK_DTYPE_COUNT ? dtype_info[dt].name : "?"; }
bool lk_dtype_is_float(lk_dtype dt) { return dt == LK_F32 || dt == LK_F64 || dt == LK_BF16 || dt == LK_F16; }

lk_status lk_dtype_parse(const char *s, lk_dtype *out) {
    static const struct { const char *alias; lk_dtype dt; } aliases[] = {
        {"float32", LK_F32}, {"float", LK_F32}, {"float64", LK_F64}, {"double", LK_F64},
        {"bfloat16", LK_BF16}, {"float16", LK_F16}, {"half", LK_F16}, {"int32", LK_I32},
        {"int64", LK_I64}, {"long", LK_I64}, {"uint8", LK_U8},
    };
    for (int i = 0; i < LK_DTYPE_COUNT; i++)
        if (!strcmp(s, dtype_info[i].name)) return (*out = (lk_dtype)i), LK_STATUS_OK;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(s, aliases[i].alias)) return (*out = aliases[i].dt), LK_STATUS_OK;
    return lk_error(LK_STATUS_INVALID_ARGUMENT, "unknown dtype '%s' (expected f32, f64, bf16, f16, i32, i64 or u8)", s);
}

/* ---- half-precision conversions (round to nearest even) ------------------------ */

uint16_t lk_f32_to_bf16(float f) { return lk_f32_to_bf16_bits(f); }
float lk_bf16_to_f32(uint16_t h) { return lk_bf16_bits_to_f32(h); }
uint16_t lk_f32_to_f16(float f) { return lk_f32_to_f16_bits(f); }
float lk_f16_to_f32(uint16_t h) { return lk_f16_bits_to_f32(h); }

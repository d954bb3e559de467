/* The CPU backend's embedding lookup, f32 (or, forward, bf16/f16) rows with i32 or i64 indices: the
 * forward gathers rows, the backward scatter-adds the output gradient's rows
 * into the weight gradient in index order, so repeated indices accumulate
 * the same way every time. The op has checked every index against V. */
#include <string.h>

#include "backend/cpu/cpu_impl.h"

static inline int64_t index_at(lk_dtype dt, const void *idx, int64_t i) {
    return dt == LK_I64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

lk_status LK_ISA(lk__cpu_embedding)(const lk_op_desc *d, void *const *x) {
    const lk_embedding_params *p = &d->embedding;
    lk_dtype it = d->dtype[1];
    if (d->op == LK_OP_EMBEDDING) {
        /* a row copy: any float dtype, table and output alike (bits unchanged) */
        size_t row = (size_t)p->D * (d->dtype[0] == LK_F32 ? 4 : 2);
        const char *w = x[0];
        char *out = x[2];
        for (int64_t i = 0; i < p->n; i++) memcpy(out + (size_t)i * row, w + (size_t)index_at(it, x[1], i) * row, row);
        return LK_STATUS_OK;
    }
    const float *g = x[0];
    float *dw = x[2];
    for (int64_t i = 0; i < p->n; i++) lk_k_add8(dw + index_at(it, x[1], i) * p->D, g + i * p->D, p->D);
    return LK_STATUS_OK;
}

/* The CPU backend's LK_OP_ACCURACY: the rows of [N, C] logits whose first
 * maximum is their target, counted in row order over the kernel body the
 * CUDA backend runs too (backend/kernels/rows.h), so a device keeps the
 * count the trainer's host loop makes. */
#include "backend/cpu/cpu_impl.h"
#include "backend/kernels.h"

/* The kernel's codes for the operand dtypes (supports() has checked them). */
static int logits_kind(lk_dtype t) { return t == LK_F32 ? 0 : t == LK_BF16 ? 1 : 2; }
static int target_kind(lk_dtype t) { return t == LK_I64 ? 0 : t == LK_I32 ? 1 : 2; }

lk_status LK_ISA(lk__cpu_accuracy)(const lk_op_desc *d, void *const *x) {
    int kind = logits_kind(d->dtype[0]), tkind = target_kind(d->dtype[1]);
    int64_t hits = 0;
    for (int64_t r = 0; r < d->accuracy.N; r++) hits += lk_k_row_hit(x[0], kind, d->accuracy.C, r, x[1], tkind);
    *(double *)x[2] = (double)hits;
    return LK_STATUS_OK;
}

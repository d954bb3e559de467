/* Private: the cuBLASLt GEMM over the typed-op GEMM descriptor
 * (backend/backend_impl.h), on cuda device memory. The cuda backend
 * (backend.c) runs LK_OP_GEMM through it; gpu_gemm also calls it directly,
 * with the TF32 flag. Built only with LK_HAVE_CUDA. */
#ifndef LK_BACKEND_CUDA_GEMM_H
#define LK_BACKEND_CUDA_GEMM_H

#include "backend/backend_impl.h"

/* Flags for lk__cuda_gemm_run. */
enum {
    LK__CUDA_GEMM_TF32 = 1, /* f32 GEMMs may multiply in TF32 (10-bit mantissa): an explicit opt-in, never the default */
};

/* What a GEMM of dtype dt (A and B) runs through (lk__backend_gemm_path's
 * cuda answer); f32 says whether TF32 is on. Cannot fail. */
const char *lk__cuda_gemm_path(lk_dtype dt);
/* Whether the descriptor is a GEMM this runs: A and B both f32, bf16 or
 * f16; C f32, or for 16-bit A/B also their own dtype; products accumulate
 * in f32 in every case. Cannot fail. */
bool lk__cuda_gemm_supports(const lk_op_desc *d);
/* Loads cuBLASLt (dlopen, once per process; gemm.c says why it is not
 * linked) and resolves every entry point used: UNSUPPORTED naming the
 * library and what was missing otherwise. lk__cuda_gemm_run calls it; it
 * needs no GPU, so a test can check the toolkit's library loads. */
lk_status lk__cuda_gemm_load(void);
/* Runs it on GPU `device` over device pointers operands = {A, B, C}
 * (row-major, as the descriptor says), on the GPU's compute stream; returns
 * once queued (lk_device_synchronize waits). UNSUPPORTED for a descriptor
 * supports() refuses; DEVICE with cuBLASLt's status otherwise. */
lk_status lk__cuda_gemm_run(int device, const lk_op_desc *d, void *const *operands, unsigned flags);

#endif

/* Private: which kernels a GEMM takes on this machine, said in words for
 * `lockstep env`, run.json and the fit's opening lines. A backend question,
 * so it is answered here (registry.c) rather than by the device layer. */
#ifndef LK_BACKEND_GEMM_PATH_H
#define LK_BACKEND_GEMM_PATH_H

#include "lockstep/device.h"
#include "lockstep/dtype.h"

/* The path of a GEMM whose A and B are dt on a device of `kind`: the cuda
 * backend's cuBLASLt form on LK_CUDA ("cublaslt bf16 on tensor cores, ..."),
 * NULL there in a build without CUDA; the CPU backend's (C in f32:
 * "openblas sgemm", "onednn ...", "f32 fallback (...)") on every other kind.
 * The string is static or per thread; cannot fail. */
const char *lk__backend_gemm_path(lk_device_kind kind, lk_dtype dt);

#endif

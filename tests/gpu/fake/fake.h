/* The fake GPU's internal interface, between its CUDA runtime
 * (fake_cudart.cpp), its cuBLASLt (fake_cublaslt.cpp, built as
 * libcublasLt.so.<major> so that gemm.c's dlopen finds it first) and the
 * kernel files' host emulation (emu/cuda_runtime.h with LK_FAKE_GPU).
 * Test-only: never part of the library. See fake_cudart.cpp's opening
 * comment for what the fake models and checks. */
#ifndef LK_FAKE_GPU_H
#define LK_FAKE_GPU_H

#include <stddef.h>

#include <functional>

/* Queues fn on stream s (a stream of the fake runtime; NULL, the legacy
 * stream, is refused), to run later in stream order on the fake GPU, or
 * records it into the graph being captured when s captures. `what` names
 * the work in error messages. fn runs with the fake's device memory
 * readable and writable (the host may touch it at no other time). Returns
 * the cudaError_t value (0: queued), which is also kept as the calling
 * thread's last error, as a failed launch is. */
int lk_fake_enqueue(void *s, const char *what, std::function<void()> fn);

/* Whether [p, p + n) lies inside one allocation of the fake's device
 * memory (cudaMalloc or cudaMallocAsync); *device gets its GPU. */
bool lk_fake_is_device(const void *p, size_t n, int *device);

#endif

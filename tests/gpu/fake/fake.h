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

/* As lk_fake_enqueue, for work that may have to wait for something outside
 * this process (fake_nccl.cpp's collectives waiting for their peers):
 * step() is called, with device memory accessible, whenever the host waits
 * for the stream, until it returns true; meanwhile the stream's later work
 * waits and an event query says "not ready". Refused in a capture. */
int lk_fake_enqueue_poll(void *s, const char *what, std::function<bool()> step);

/* Runs the work queued on stream s as far as it can go without blocking:
 * true when none is left. What an asynchronous library's progress call
 * does. */
bool lk_fake_progress(void *s);

/* The GPU a stream belongs to, as the fake numbers its GPUs (the same on
 * every process: what CUDA_VISIBLE_DEVICES selects from); -1 when s is not
 * a live stream. */
int lk_fake_stream_gpu(void *s);

/* The calling thread's current GPU (cudaSetDevice), numbered as
 * lk_fake_stream_gpu numbers them. */
int lk_fake_current_gpu(void);

/* Whether [p, p + n) lies inside one allocation of the fake's device
 * memory (cudaMalloc or cudaMallocAsync); *device gets its GPU. */
bool lk_fake_is_device(const void *p, size_t n, int *device);

#endif

/* CUDA kernels over the shared kernel bodies (backend/kernels.h): the same
 * element-wise math the CPU reference runs and the tests check. Compiled
 * whenever nvcc is found, so the bodies stay nvcc-clean; the CUDA backend's
 * vtable (memory, cuBLAS GEMM, launches) is not written yet and nothing
 * links these kernels into liblockstep so far. */
#include "backend/kernels.h"

extern "C" {

__global__ void lk_cuda_unary(int op, long n, const float *x, float *y, float alpha) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = lk_k_unary(op, x[i], alpha);
}

__global__ void lk_cuda_unary_backward(int op, long n, const float *x, const float *y, const float *dy, float *dx,
                                       float alpha) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dx[i] = dy[i] * lk_k_unary_grad(op, x[i], y[i], alpha);
}

__global__ void lk_cuda_binary(int op, long n, const float *a, const float *b, float *out) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = lk_k_binary(op, a[i], b[i]);
}

}

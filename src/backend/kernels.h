/* Kernel bodies: the element-wise and reduction math, written once as
 * static inline functions that both the C compiler (CPU backend, tests) and
 * nvcc (CUDA backend) compile, so the CPU tests check the math the GPU runs.
 * Only plain C arithmetic and <math.h> float functions here. One header per
 * family under backend/kernels/; this one defines LK_KERNEL and includes
 * them all. */
#ifndef LK_KERNELS_H
#define LK_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LK_KERNEL __host__ __device__ static inline
#else
#define LK_KERNEL static inline
#endif

#include "backend/kernels/elementwise.h"
#include "backend/kernels/conv.h"
#include "backend/kernels/rows.h"
#include "backend/kernels/optim.h"
#include "backend/kernels/attention.h"

#endif

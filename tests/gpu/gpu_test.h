/* The gpu tests' common start: without a visible CUDA device they print
 * "no CUDA device" and exit 77, which tests/gpu/tests.cmake declares as
 * ctest's skip code, so a GPU-less machine reports them skipped. */
#ifndef LK_GPU_TEST_H
#define LK_GPU_TEST_H

#include <stdio.h>
#include <stdlib.h>

#include "device/gpu.h"

#define LK_GPU_SKIP 77

static inline void gpu_test_require(void) {
    if (lk__cuda_visible() == 0) {
        printf("no CUDA device: skipped (%s)\n", lk__cuda_why_none());
        exit(LK_GPU_SKIP);
    }
    if (lk__cuda_register()) {
        fprintf(stderr, "cuda device did not register: %s\n", lk_last_error());
        exit(1);
    }
}

#endif

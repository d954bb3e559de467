/* The built-in list: every device kind the library brings besides the CPU,
 * with its backend. Adding a built-in device kind is a row here (its device
 * file in src/device/, its backend folder in src/backend/); neither the
 * device registry (device.c) nor the backend registry (registry.c) names a
 * kind itself. The CPU device and backend are kind 0's from the start; the
 * rows below register on first use (lk_device_parse of their name, the
 * trainer's accelerator, the gpu tests), through registry.c's
 * lk__builtin_register. Data only, so that nothing here calls back into
 * the registry that reads it. */
#include "backend/builtin.h"
#include "device/gpu.h"

#ifdef LK_HAVE_CUDA
#include "backend/cuda/cuda_impl.h"
#define CUDA_BACKEND (&lk__cuda_backend)
#else
#define CUDA_BACKEND NULL /* the device's registration says this build has none */
#endif

const lk__builtin_kind lk__builtin_kinds[] = {
    {"cuda", LK_CUDA, lk__cuda_device_register, CUDA_BACKEND},
};
const int lk__builtin_count = (int)(sizeof lk__builtin_kinds / sizeof *lk__builtin_kinds);

/* Private to src/device: the built-in device kinds' vtables. */
#ifndef LK_DEVICE_IMPL_H
#define LK_DEVICE_IMPL_H

#include "lockstep/device.h"

extern const lk_device_vtable lk__device_cpu; /* cpu.c: host memory */

#endif

/* lockstep — train neural networks on every device you have.
 * The umbrella header: every public header, trainer.h included. Build with
 * `cc prog.c $(pkg-config --cflags --libs lockstep)` (README: "Using
 * lockstep from C"; examples/custom_module.c is a complete program). */
#ifndef LOCKSTEP_H
#define LOCKSTEP_H
#include "lockstep/core.h"
#include "lockstep/device.h"
#include "lockstep/dtype.h"
#include "lockstep/tensor.h"
#include "lockstep/autograd.h"
#include "lockstep/strategy.h"
#include "lockstep/pipeline.h"
#include "lockstep/data.h"
#include "lockstep/dist.h"
#include "lockstep/nn.h"
#include "lockstep/config.h"
#include "lockstep/optim.h"
#include "lockstep/models.h"
#include "lockstep/trainer.h"
#endif

/* lockstep — train neural networks on every device you have.
 * The umbrella header: include this, link -llockstep. */
#ifndef LOCKSTEP_H
#define LOCKSTEP_H
#include "lockstep/core.h"
#include "lockstep/device.h"
#include "lockstep/tensor.h"
#include "lockstep/autograd.h"
#include "lockstep/strategy.h"
#include "lockstep/data.h"
#include "lockstep/dist.h"
#include "lockstep/nn.h"
#include "lockstep/config.h"
#include "lockstep/optim.h"
#include "lockstep/models.h"
#endif

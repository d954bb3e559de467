/* Private to src/nn (and the built-in models): hooks between the generic
 * layer machinery (layer.c) and the built-in layer types (layers.c). */
#ifndef LK_NN_IMPL_H
#define LK_NN_IMPL_H

#include "lockstep/nn.h"

/* Re-keys a Dropout layer's mask stream; false when l is not a Dropout. */
bool lk__dropout_reseed(lk_layer *l, uint64_t seed, uint32_t stream, uint64_t step);

#endif

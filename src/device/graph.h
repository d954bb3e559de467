/* Private: graph capture through the device vtable (lockstep/device.h's
 * graph_* methods), for backend/replay.c, which captures a training step's
 * segments and replays them (docs/GPU.md, "The step as a graph"). A kind
 * without the methods (the cpu device) answers every call with an error
 * naming it; nothing is captured and nothing crashes. */
#ifndef LK_DEVICE_GRAPH_H
#define LK_DEVICE_GRAPH_H

#include "lockstep/device.h"

/* Whether d's kind can capture graphs (all four methods present). */
bool lk__device_can_capture(lk_device d);
/* Records the calling thread's work on d until lk__device_graph_end. */
lk_status lk__device_graph_begin(lk_device d);
/* The recorded work as a graph (*out NULL on failure). */
lk_status lk__device_graph_end(lk_device d, lk_graph **out);
/* Replays g on d's compute stream (asynchronous, ordered with d's ops). */
lk_status lk__device_graph_launch(lk_device d, lk_graph *g);
void lk__device_graph_free(lk_device d, lk_graph *g); /* NULL does nothing */

#endif

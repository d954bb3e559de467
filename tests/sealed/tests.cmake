lk_add_test(NAME sealed_train SOURCES sealed/test_sealed.c LABELS unit TIMEOUT 300)
lk_add_test(NAME sealed_ddp SOURCES sealed/test_sealed_ddp.c LABELS unit multiproc TIMEOUT 300)
# The batch prefetch onto the device (src/train/prefetch.c) on sealed_async,
# whose copy stream defers its copies until an event is waited for.
lk_add_test(NAME sealed_prefetch SOURCES sealed/test_prefetch.c LABELS unit TIMEOUT 300)
lk_add_test(NAME sealed_syncs SOURCES sealed/test_syncs.c LABELS unit TIMEOUT 300)
# What stands between a training step and a CUDA graph: the ops, pointers
# and descriptor fields that change from one steady step to the next.
lk_add_test(NAME sealed_graph_ready SOURCES sealed/test_graph_ready.c LABELS unit TIMEOUT 300)
# Issue 21: the training step replayed as graphs (src/backend/replay.c) on
# the capturing fake: the same fits with LK_GRAPHS=0 and on, bit for bit,
# and the per-step launches, captures and eager items.
lk_add_test(NAME sealed_replay SOURCES sealed/test_replay.c LABELS unit TIMEOUT 600)
if(LK_HAVE_CUDA)
  add_test(NAME gpu_replay COMMAND test_sealed_replay --gpu)
  set_tests_properties(gpu_replay PROPERTIES LABELS gpu TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
# SyncBatchNorm's all-reduces on sealed device memory (device-reading
# communicator) and staged through the host (shm): one each way, the CPU's bits.
lk_add_test(NAME sealed_sync_bn SOURCES sealed/test_sync_bn_dev.c LABELS unit multiproc TIMEOUT 120)

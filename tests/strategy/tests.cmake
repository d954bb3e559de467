lk_add_test(NAME strategy_ddp SOURCES strategy/test_ddp.c LABELS multiproc threads TIMEOUT 180)
lk_add_test(NAME strategy_dp SOURCES strategy/test_dp.c LABELS unit threads TIMEOUT 120)
lk_add_test(NAME strategy_step SOURCES strategy/test_step.c LABELS unit threads TIMEOUT 60)
lk_add_test(NAME strategy_layout SOURCES strategy/test_layout.c LABELS unit TIMEOUT 60)
# The overlap check times backward against a slowed communicator: alone, it
# measures the strategy rather than the other tests' load.
set_tests_properties(strategy_ddp PROPERTIES RUN_SERIAL TRUE)
# Pipeline schedules as data: every gpipe/1f1b/forward schedule for 1..8 stages x 1..16 micro-batches complete, matched, deadlock-free, bubble = theory; the checker catches broken lists.
lk_add_test(NAME strategy_pipe_schedule SOURCES strategy/test_pipe_schedule.c LABELS unit TIMEOUT 60)
# The pipeline interpreter against one process: mlp and a tiny gpt on 2-4 stages (forked ranks, shm), gpipe and 1f1b, gradients bitwise.
lk_add_test(NAME strategy_pipe_run SOURCES strategy/test_pipe_run.c LABELS multiproc TIMEOUT 120)
# 1F1B's memory bound measured: each stage's peak tensor memory under gpipe and 1f1b (mlp, 2 and 3 stages, 8 micro-batches) against one micro-batch's.
lk_add_test(NAME strategy_pipe_memory SOURCES strategy/test_pipe_memory.c LABELS multiproc TIMEOUT 120)
# Each stage holds only its own blocks: mlp, autoencoder and gpt on 2-3 stages and 2 x 2 (forked ranks, shm): a rank's held bytes are its blocks', another stage's tensor is a named error, rank 0's state dict and sync_model are single's bits.
lk_add_test(NAME strategy_pipe_stage_only SOURCES strategy/test_pipe_stage_only.c LABELS multiproc TIMEOUT 180)
# model_parallel and pipeline through `lockstep fit` (mlp, 2-3 stages, gpipe and 1f1b) against single after 20 steps:
# bitwise where the arithmetic is the same, 1e-5 otherwise; accumulation, clipping, bf16-mixed; bad input refused.
lk_add_script_test(NAME strategy_pipeline_fit SCRIPT strategy/test_pipeline_fit.sh LABELS multiproc TIMEOUT 240)
lk_add_test(NAME strategy_pipeline_checks SOURCES strategy/test_pipeline_strategy.c LABELS unit TIMEOUT 60)
# pipeline x data parallel: 4 devices as 2 stages x 2 replicas (mlp, 20 steps) bitwise ddp accumulating the same micro-batches, near single; clipping, accumulation, validation on the stages' current blocks.
lk_add_script_test(NAME strategy_pipeline_dp SCRIPT strategy/test_pipeline_dp.sh LABELS multiproc TIMEOUT 240)
# A pipeline's checkpoint resumed: 2 stages and 2 x 2, 10 + 10 steps bitwise 20 (weights and optimizer state); model_parallel <-> single bitwise, ddp resumes it; another model shape refused.
lk_add_script_test(NAME strategy_pipeline_resume SCRIPT strategy/test_pipeline_resume.sh LABELS multiproc TIMEOUT 240)
# trainer.pipeline.split time: the profiled split is bitwise that split named (2 stages, 2 x 2), the autoencoder cut inside its halves.
lk_add_script_test(NAME strategy_pipeline_split_time SCRIPT strategy/test_pipeline_split_time.sh LABELS multiproc TIMEOUT 120)
# Validation inside fit as a forward-only schedule over the stages: val_loss model_parallel bitwise single, pipeline 2/3 stages and 2 x 2 within 1e-7.
lk_add_script_test(NAME strategy_pipeline_eval SCRIPT strategy/test_pipeline_eval.sh LABELS multiproc TIMEOUT 120)
# ZeRO stages 1 and 2 against ddp on 2, 3 and 4 ranks: bitwise, with clipping, accumulation, bf16-mixed,
# 16-mixed, a parameter count no world size divides, exact resume, the class node and the refusals.
lk_add_script_test(NAME strategy_zero SCRIPT strategy/test_zero.sh LABELS multiproc TIMEOUT 300)
# fsdp and deepspeed_stage_3 against ddp on 2, 3 and 4 ranks: bitwise, every sharding strategy and wrap
# policy, clipping, accumulation, bf16/16-mixed, an uneven parameter count, a GPT with tied weights and
# activation checkpointing, exact resume and resume across strategies, the class node and the refusals.
lk_add_script_test(NAME strategy_fsdp SCRIPT strategy/test_fsdp.sh LABELS multiproc TIMEOUT 400)
# Sharded checkpoint sets: saved by stage 2 on 2 ranks, resumed at 1 (single, stage 1), 2, 3 and ddp == from the
# whole checkpoint, bitwise; export loads in torch by name; missing, truncated, foreign shards and no index refused.
lk_add_script_test(NAME strategy_ckpt_shards SCRIPT strategy/test_ckpt_shards.sh LABELS multiproc TIMEOUT 300)
if(LK_HAVE_MPI AND LK_MPIRUN)
  string(REPLACE ";" " " LK_ZERO_MPIRUN_FLAGS "${LK_MPIRUN_FLAGS}")
  add_test(NAME strategy_zero_mpi COMMAND bash ${PROJECT_SOURCE_DIR}/tests/strategy/test_zero.sh mpi
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(strategy_zero_mpi PROPERTIES TIMEOUT 180 LABELS "multiproc;mpi"
                       ENVIRONMENT "${LK_MPI_TEST_ENV};LK_BIN=$<TARGET_FILE:lockstep>;LK_MPIRUN=${LK_MPIRUN};LK_MPIRUN_FLAGS=${LK_ZERO_MPIRUN_FLAGS}")
  add_test(NAME strategy_fsdp_mpi COMMAND bash ${PROJECT_SOURCE_DIR}/tests/strategy/test_fsdp.sh mpi
           WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(strategy_fsdp_mpi PROPERTIES TIMEOUT 180 LABELS "multiproc;mpi"
                       ENVIRONMENT "${LK_MPI_TEST_ENV};LK_BIN=$<TARGET_FILE:lockstep>;LK_MPIRUN=${LK_MPIRUN};LK_MPIRUN_FLAGS=${LK_ZERO_MPIRUN_FLAGS}")
endif()
# Memory per rank: run.json's model state against lockstep's ZeRO formulas (ddp, deepspeed_stage_1/2, N = 1, 2, 4);
# trainer.memory_limit_mb: ddp's replicated Adam state stops on every rank with the allocator's error, stage 2 trains.
lk_add_script_test(NAME strategy_memory SCRIPT strategy/test_memory.sh LABELS multiproc TIMEOUT 240)
# `lockstep test` and `predict` under model_parallel and pipeline run forward-only through the stages: from one single checkpoint, test metrics == single's and predictions.npy == single's file, at 2 stages, 3 stages gpipe and 2 x 2.
lk_add_script_test(NAME strategy_pipeline_predict SCRIPT strategy/test_pipeline_predict.sh LABELS multiproc TIMEOUT 180)
# A model bigger than one rank's memory (a GPT of 325 MiB under trainer.memory_limit_mb 310) trains on 4 pipeline
# stages (each rank materialising only its own from the deferred model) and under fsdp on 4 ranks (one unit at a time);
# ddp under the same limit is refused at the start.
lk_add_script_test(NAME strategy_pipeline_bigger_than_a_rank SCRIPT strategy/test_pipeline_bigger_than_a_rank.sh
                   LABELS multiproc TIMEOUT 240)

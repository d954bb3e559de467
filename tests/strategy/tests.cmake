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
# model_parallel and pipeline through `lockstep fit` (mlp, 2-3 stages, gpipe and 1f1b) against single after 20 steps:
# bitwise where the arithmetic is the same, 1e-5 otherwise; accumulation, clipping, bf16-mixed; bad input refused.
lk_add_script_test(NAME strategy_pipeline_fit SCRIPT strategy/test_pipeline_fit.sh LABELS multiproc TIMEOUT 240)
lk_add_test(NAME strategy_pipeline_checks SOURCES strategy/test_pipeline_strategy.c LABELS unit TIMEOUT 60)

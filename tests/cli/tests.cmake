lk_add_script_test(NAME cli_fit SCRIPT cli/test_fit.sh LABELS multiproc TIMEOUT 300)
lk_add_script_test(NAME cli_errors SCRIPT cli/test_errors.sh LABELS unit TIMEOUT 120)
# LK_* variables against their config keys and flags: one precedence rule, and
# the source of each effective value in `lockstep env` and run.json
lk_add_script_test(NAME cli_settings SCRIPT cli/test_settings.sh LABELS multiproc TIMEOUT 180)
# bench train's report (recommendations, charts) on a synthetic table; its
# source is part of the program, not the library, so the test compiles it in.
lk_add_test(NAME cli_bench_report SOURCES cli/test_bench_report.c ${PROJECT_SOURCE_DIR}/src/cli/bench_report.c
            LABELS unit TIMEOUT 60)
lk_add_script_test(NAME cli_bench_train SCRIPT cli/test_bench_train.sh LABELS multiproc TIMEOUT 180)
# bench ops at a tiny budget: every table printed (its numbers are not checked)
lk_add_script_test(NAME cli_bench_ops SCRIPT cli/test_bench_ops.sh LABELS unit TIMEOUT 120)
lk_add_script_test(NAME cli_profiler SCRIPT cli/test_profiler.sh LABELS multiproc TIMEOUT 300)
lk_add_script_test(NAME cli_lightning_cfg SCRIPT cli/test_lightning_cfg.sh LABELS multiproc TIMEOUT 300)
# --section.key as jsonargparse reads it beside a class_path, and the
# --trainer.callbacks forms (the last entry, an index, +=)
lk_add_script_test(NAME cli_overrides SCRIPT cli/test_overrides.sh LABELS unit TIMEOUT 120)
# issue 48: a config as Lightning writes it (nulls, its flags lockstep has no
# key for), every problem in one run, val_check_interval as Lightning counts
# it, devices 0, num_nodes, ckpt_path best in a new process
lk_add_script_test(NAME cli_conformance SCRIPT cli/test_conformance.sh LABELS unit TIMEOUT 180)
# issue 48: the npy and csv data modules (the user's files, no C), 1 and 2 ranks, predict order
lk_add_script_test(NAME cli_data_files SCRIPT cli/test_data_files.sh LABELS multiproc TIMEOUT 180)
# lockstep prepare (bytes, a handmade GPT-2 vocabulary), the tokens data
# module's config errors and lockstep generate's errors
lk_add_script_test(NAME cli_tokens SCRIPT cli/test_tokens.sh LABELS unit TIMEOUT 120)
# A tiny GPT on the Bible default end to end: rank-0 preparation on 2 ranks,
# exact resume with random windows, generate (skips without the gpt model)
lk_add_script_test(NAME cli_gpt_tokens SCRIPT cli/test_gpt_tokens.sh LABELS multiproc TIMEOUT 240)
lk_add_script_test(NAME cli_pipeline_schedule SCRIPT cli/test_pipeline_schedule.sh LABELS unit TIMEOUT 30)
# issue 48: LightningCLI configs as Lightning 2.x writes them (tests/cli/lightning_configs)
# train with only the model and data class_path changed; the flag table covers them
lk_add_script_test(NAME cli_lightning_configs SCRIPT cli/test_lightning_configs.sh LABELS multiproc TIMEOUT 180)

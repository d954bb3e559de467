lk_add_script_test(NAME resume_exact SCRIPT resume/test_resume.sh LABELS multiproc fault TIMEOUT 300)
lk_add_script_test(NAME export_torch SCRIPT resume/test_export_torch.sh LABELS unit parity TIMEOUT 120)
lk_add_script_test(NAME resume_xprec SCRIPT resume/test_xprec.sh LABELS multiproc TIMEOUT 300)
lk_add_script_test(NAME resume_ckpt_tamper SCRIPT resume/test_ckpt_tamper.sh LABELS fault TIMEOUT 300)
# fuzz_resume's committed corpus (seed checkpoints and regression inputs),
# each a fit resumed from it, replayed without libFuzzer.
lk_add_test(NAME fuzz_replay_resume SOURCES ../fuzz/fuzz_resume.c ../fuzz/replay.c LABELS unit TIMEOUT 120
            ARGS ${PROJECT_SOURCE_DIR}/fuzz/corpus/fuzz_resume)
lk_add_script_test(NAME resume_sched SCRIPT resume/test_resume_sched.sh LABELS multiproc fault TIMEOUT 300)

lk_add_script_test(NAME errors_catalog SCRIPT docs/test_errors_catalog.sh LABELS unit TIMEOUT 30)
lk_add_script_test(NAME make_run_target SCRIPT docs/test_make_run.sh LABELS unit TIMEOUT 30)
# issue 48: docs/TUTORIAL.md's marked commands, run as written
lk_add_script_test(NAME docs_tutorial SCRIPT docs/test_tutorial.sh LABELS multiproc TIMEOUT 180)

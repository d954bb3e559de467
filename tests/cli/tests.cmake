lk_add_script_test(NAME cli_fit SCRIPT cli/test_fit.sh LABELS multiproc TIMEOUT 300)
lk_add_script_test(NAME cli_errors SCRIPT cli/test_errors.sh LABELS unit TIMEOUT 120)
lk_add_script_test(NAME cli_lightning_cfg SCRIPT cli/test_lightning_cfg.sh LABELS multiproc TIMEOUT 300)

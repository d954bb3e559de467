lk_add_script_test(NAME errors_catalog SCRIPT docs/test_errors_catalog.sh LABELS unit TIMEOUT 30)

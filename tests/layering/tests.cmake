# The layering of src/ and include/ against docs/layers.txt (tools/check_layers.py):
# no include or use pointing up a layer, no two files that need each other,
# beyond the known violations listed in layering/known_violations.txt; and the
# check itself shown failing on a planted upward include and cycle.
lk_add_script_test(NAME layering SCRIPT layering/test_layering.sh LABELS unit TIMEOUT 60)

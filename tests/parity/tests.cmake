# Parity with PyTorch: every op against the committed fixtures in
# tests/fixtures/ops (written by tools/gen_op_fixtures.py; see docs/PARITY.md).
lk_add_test(NAME parity_ops SOURCES parity/test_parity_ops.c LABELS unit parity TIMEOUT 60)

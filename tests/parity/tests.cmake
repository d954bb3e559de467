# Parity with PyTorch: every op against the committed fixtures in
# tests/fixtures/ops (written by tools/gen_op_fixtures.py; see docs/PARITY.md).
lk_add_test(NAME parity_ops SOURCES parity/test_parity_ops.c LABELS unit parity TIMEOUT 60)
# Autocast (bf16/f16 mixed precision) against torch.autocast and float64:
# tests/fixtures/autocast, written by tools/gen_autocast_fixtures.py (see docs/PRECISION.md).
lk_add_test(NAME parity_autocast SOURCES parity/test_autocast.c LABELS unit parity TIMEOUT 120)
lk_add_test(NAME parity_true16 SOURCES parity/test_true16.c LABELS unit parity TIMEOUT 120)

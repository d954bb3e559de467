#!/usr/bin/env bash
# accelerator: gpu through `lockstep fit` on a machine without a GPU (or a
# build without CUDA): one error from the launcher naming what was asked and
# why there is no GPU, before any rank starts — not one error per rank.
source "$LK_SOURCE_DIR/tests/cli/lib.sh"
write_synth
if "$LK_BIN" env | grep -qE "^gpus +: [0-9]+ visible to CUDA"; then
  echo "a GPU is visible: this test is for GPU-less machines"; exit 77
fi
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.accelerator gpu --trainer.devices '[0, 2]' 2>&1); rc=$?
check "gpu without a GPU fails with exit 1" [ "$rc" = 1 ]
check "the error names the devices asked for" grep -qF "trainer.devices=[0, 2]" <<<"$out"
check "the error says why (no device or no CUDA build)" grep -qE "sees no CUDA device|needs the CUDA backend" <<<"$out"
check "no rank was launched" bash -c "! grep -q '\[rank ' <<<\"\$1\"" _ "$out"
check "nothing was written" [ ! -d "$T/runs" ]
out=$("$LK_BIN" fit -c "$T/synth.yaml" --trainer.accelerator cuda 2>&1); rc=$?
check "accelerator cuda is gpu's synonym" bash -c '[ "$1" = 1 ] && grep -qE "'"'"'cuda'"'"'" <<<"$2"' _ "$rc" "$out"
finish

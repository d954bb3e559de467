#!/usr/bin/env bash
# `lockstep export` writes weights that PyTorch loads with strict=True into
# the module of the same architecture (runs where /usr/bin/python3 has torch;
# prints a skip otherwise). The output comparison on the same inputs is in
# tests/train/test_weights.c (lockstep -> PyTorch and PyTorch -> lockstep).
source "$(dirname "$0")/../cli/lib.sh"
write_synth
src=${LK_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
"$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_steps 5 --trainer.enable_progress_bar false >/dev/null 2>&1
check "export weights" "$LK_BIN" export --ckpt "$(latest)/checkpoints/last.ckpt" --out "$T/w.safetensors"
if [ -x /usr/bin/python3 ]; then
  /usr/bin/python3 "$src/tools/torch_check_weights.py" "$T/w.safetensors" mlp '{"input_dim": 16, "hidden": [32], "num_classes": 4}'
  rc=$?
  if [ $rc = 77 ]; then echo "skip: torch is not importable by /usr/bin/python3"
  else check "pytorch load_state_dict(strict=True)" test $rc = 0; fi
fi
# bf16-true and 16-true: the weights in their own dtype, loaded into the
# module converted to it (torch's module.to(torch.bfloat16))
for prec in bf16-true 16-true; do
  "$LK_BIN" fit -c "$T/synth.yaml" --trainer.max_steps 5 --trainer.precision $prec --trainer.enable_progress_bar false >/dev/null 2>&1
  check "export $prec weights" "$LK_BIN" export --ckpt "$(latest)/checkpoints/last.ckpt" --out "$T/w-$prec.safetensors"
  if [ -x /usr/bin/python3 ]; then
    out=$(/usr/bin/python3 "$src/tools/torch_check_weights.py" "$T/w-$prec.safetensors" mlp '{"input_dim": 16, "hidden": [32], "num_classes": 4}'); rc=$?
    if [ $rc = 77 ]; then echo "skip: torch is not importable by /usr/bin/python3"
    else
      want=torch.bfloat16; [ $prec = 16-true ] && want=torch.float16
      check "pytorch loads the $prec weights with strict=True as $want ($out)" bash -c "[ $rc = 0 ] && grep -q '($want)' <<<'$out'"
    fi
  fi
done
finish

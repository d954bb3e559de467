# Every instruction-set level lockstep's own loops can run on this CPU gives
# the same bits (src/backend/isa.h): short fits under LK_CPU_ISA=auto and
# under each lower level, their last.ckpt tensors (parameters and optimizer
# state) compared byte for byte. The fits cover the copied files: the mlp
# with dropout (element-wise, dropout's mask and scaling, cross-entropy,
# Adam; 16-bit conversions under bf16-mixed and 16-mixed), the autoencoder
# (MSE, AdamW with weight decay), the cnn (im2col, pooling, batch norm,
# SGD with momentum), 2-rank ddp (the all-reduce's sums, RMSprop) and an
# mlp wide and tall enough for LK_GEMM=auto's own GEMM on AVX-512.
# On a CPU with nothing above the build's baseline there is nothing to
# compare: skipped (77).
. "$(dirname "$0")/../cli/lib.sh"
auto=$("$LK_BIN" env 2>/dev/null | sed -n 's/^cpu loops *: \([a-z0-9]*\) .*/\1/p')
case "$auto" in
  avx512) lower="avx2 baseline" ;;
  avx2) lower="baseline" ;;
  *) echo "skip: lockstep's loops run '$auto' here; no lower level to compare"; exit 77 ;;
esac
# The bytes after a checkpoint's header (8-byte length, then JSON): every
# tensor, none of the metadata (paths, times).
tensors() {
  local n
  n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
  tail -c +$((n + 9)) "$1" | cksum
}
# fit NAME LEVEL ARGS...: one fit under LK_CPU_ISA=LEVEL; prints its tensors' checksum
fit() {
  local name=$1 level=$2; shift 2
  local root="$T/$name-$level"
  if ! LK_CPU_ISA=$level LK_NUM_THREADS=1 LK_ALLOW_OVERSUBSCRIBE=1 "$LK_BIN" fit --data.class_path synthetic \
      --data.init_args.num_samples 384 --data.init_args.num_classes 4 --data.init_args.batch_size 32 \
      --data.init_args.num_workers 1 --trainer.max_steps 6 --trainer.max_epochs 1 --trainer.limit_val_batches 1 \
      --trainer.enable_progress_bar false --trainer.enable_tensorboard false --seed_everything 5 \
      --trainer.default_root_dir "$root" "$@" >"$root.log" 2>&1; then
    echo "fit failed: $(tail -2 "$root.log")"
    return
  fi
  grep -q "\"cpu_isa\":[[:space:]]*\"$level\"" "$root"/lightning_logs/version_*/run.json 2>/dev/null ||
    [ "$level" = auto ] || { echo "run.json does not say cpu_isa $level"; return; }
  tensors "$root"/lightning_logs/version_*/checkpoints/last.ckpt
}
mlp=(--model.class_path mlp --model.init_args.input_dim 40 --model.init_args.hidden '[48, 24]'
     --model.init_args.num_classes 4 --model.init_args.dropout 0.25 --data.init_args.input_shape '[40]')
ae=(--model.class_path autoencoder --model.init_args.input_dim 40 --model.init_args.hidden '[32]'
    --model.init_args.latent_dim 8 --data.init_args.input_shape '[40]'
    --optimizer.name adamw --optimizer.weight_decay 0.01)
cnn=(--model.class_path cnn --model.init_args.image_size 8 --model.init_args.channels '[4, 8]'
     --model.init_args.hidden 16 --model.init_args.num_classes 4 --data.init_args.input_shape '[1, 8, 8]'
     --optimizer.name sgd --optimizer.lr 0.05 --optimizer.momentum 0.9)
# 256 rows x 1024 inputs: on an AVX-512 CPU LK_GEMM=auto sends the first
# layer's forward to lockstep's own GEMM (src/backend/cpu/gemm.c; K deep
# enough that OpenBLAS's bits differ), whose rule must follow the CPU, not
# LK_CPU_ISA's lowering (on an AVX2 CPU it stays on OpenBLAS at every level)
wide=(--model.class_path mlp --model.init_args.input_dim 1024 --model.init_args.hidden '[128]'
      --model.init_args.num_classes 4 --data.init_args.input_shape '[1024]' --data.init_args.batch_size 256
      --data.init_args.num_samples 768)
ddp=("${mlp[@]}" --trainer.devices 2 --trainer.strategy ddp --optimizer.name rmsprop --optimizer.lr 0.001)
for p in 32-true bf16-mixed 16-mixed; do
  for m in mlp ae cnn ddp wide; do
    eval "args=(\"\${$m[@]}\")"
    ref=$(fit "$m-$p" auto "${args[@]}" --trainer.precision "$p")
    check "$m $p at $auto: a checkpoint ($ref)" grep -qE '^[0-9]+ [0-9]+$' <<<"$ref"
    for l in $lower; do
      got=$(fit "$m-$p" "$l" "${args[@]}" --trainer.precision "$p")
      check "$m $p: LK_CPU_ISA=$l gives $auto's bits ($got)" test "$got" = "$ref"
    done
  done
done
finish

#!/usr/bin/env bash
# The resnet through `lockstep fit` (a smoke test, not the example's
# training run): a CIFAR ResNet-20 of width 4 on synthetic 1x8x8 images,
# ddp on 2 ranks, a few steps with SyncBatchNorm off; the exported state
# dict has torchvision's names; an image size the stem cannot take is
# refused before training.
source "$(dirname "$0")/../cli/lib.sh"
cat >"$T/rn.yaml" <<YAML
seed_everything: 3
trainer:
  max_steps: 4
  max_epochs: 5
  enable_progress_bar: false
  enable_tensorboard: false
  num_sanity_val_steps: 0
  limit_val_batches: 1
  devices: 2
  strategy: ddp
model:
  class_path: ResNet
  init_args: {depth: 20, width: 4, in_channels: 1, image_size: 8, num_classes: 3}
data:
  class_path: synthetic
  init_args: {num_samples: 160, input_shape: [1, 8, 8], num_classes: 3, batch_size: 8}
optimizer:
  name: sgd
  lr: 0.05
YAML
"$LK_BIN" fit -c "$T/rn.yaml" --trainer.default_root_dir "$T/r" >"$T/r.log" 2>&1
check "resnet ddp 2: fit runs ($(tail -1 "$T/r.log"))" test -f "$T/r/lightning_logs/version_0/checkpoints/last.ckpt"
"$LK_BIN" export --ckpt "$T/r/lightning_logs/version_0/checkpoints/last.ckpt" --out "$T/r.st" >/dev/null 2>&1
check "resnet: exported names are torchvision's" grep -qa "layer2.0.downsample.1.running_mean" "$T/r.st"
expect_fail "resnet: an image size the stem cannot take" 2 \
  "model resnet: image_size = 16 is too small for the imagenet stem and 4 stages" \
  "$LK_BIN" fit -c "$T/rn.yaml" --trainer.default_root_dir "$T/bad" --model.init_args.depth 18 \
  --model.init_args.stem imagenet --model.init_args.image_size 16
finish

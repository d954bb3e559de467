#!/usr/bin/env bash
# The user's own files from the CLI (issue 48): the npy and csv data
# modules train the mlp with no C, on 1 and 2 ranks, validate on val_split
# or separate files, predict in the files' row order, and name the file
# and what is wrong when a file is missing or does not fit.
source "$(dirname "$0")/lib.sh"
cd "$T" || exit 1
q="--trainer.enable_progress_bar false --trainer.default_root_dir $T/runs"
latest() { ls -d "$T"/runs/lightning_logs/version_* | sort -t_ -k3 -n | tail -1; }
acc() { sed -n 's/.*"val_acc":[[:space:]]*\([0-9.e-]*\).*/\1/p' "$(latest)/run.json" | head -1; }

# a CSV of 16 features and a label (the signs of the first two features): awk, no Python needed
awk 'BEGIN { srand(3); printf "f0"; for (i = 1; i < 16; i++) printf ",f%d", i; print ",label";
  for (n = 0; n < 400; n++) { for (i = 0; i < 16; i++) { v[i] = rand() * 2 - 1; printf "%s%.5f", i ? "," : "", v[i] }
  print "," (v[0] > 0) + 2 * (v[1] > 0) } }' > train.csv
head -41 train.csv > val.csv
"$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --model.init_args.num_classes 4 \
  --data.class_path csv --data.init_args.path train.csv --data.init_args.label label --trainer.max_epochs 8 $q >csv.out 2>&1
a=$(acc)
check "csv: the mlp trains on the user's CSV, label by name (val_acc $a > 0.6)" awk -v a="$a" 'BEGIN { exit !(a > 0.6) }'
"$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --model.init_args.num_classes 4 \
  --data.class_path csv --data.init_args.path train.csv --data.init_args.label 16 --data.init_args.val_path val.csv \
  --trainer.devices 2 --trainer.strategy ddp --trainer.max_epochs 2 $q >csv2.out 2>&1
check "csv: label by index, a separate val_path, ddp on 2 ranks" grep -q '"status":[[:space:]]*"ok"' "$(latest)/run.json"
check "csv: run.json says 2 ranks" grep -q '"world_size":[[:space:]]*2' "$(latest)/run.json"
expect_fail "csv: an unknown label column names the file and the header" 1 "csv train.csv: no column named 'nope'; the header has 'f0'" \
  "$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --data.class_path csv --data.init_args.path train.csv --data.init_args.label nope $q
expect_fail "csv: path is required" 1 "data.init_args.path is required" \
  "$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --data.class_path csv $q
expect_fail "csv: a label above num_classes names the file" 1 "train.csv" \
  "$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --data.class_path csv --data.init_args.path train.csv --data.init_args.num_classes 2 $q

if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  /usr/bin/python3 - <<'PY'
import numpy as np
r = np.random.default_rng(0)
x = r.standard_normal((300, 16)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0)
np.save("train_x.npy", x); np.save("train_y.npy", y)
np.save("head_x.npy", x[:40]); np.save("bad_y.npy", y[:40])
np.save("u8_x.npy", (np.clip(x, -1, 1) * 127 + 128).astype(np.uint8)); np.save("i32_y.npy", y.astype(np.int32))
PY
  # the issue's command, as written
  "$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --data.class_path npy \
    --data.init_args.x train_x.npy --data.init_args.y train_y.npy --trainer.max_epochs 8 $q >npy.out 2>&1
  a=$(acc)
  check "npy: the issue's command trains the mlp on the user's arrays (val_acc $a > 0.6)" awk -v a="$a" 'BEGIN { exit !(a > 0.6) }'
  ck="$(latest)/checkpoints/last.ckpt"
  "$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --data.class_path npy \
    --data.init_args.x u8_x.npy --data.init_args.y i32_y.npy --data.init_args.scale 0.00392156862745098 \
    --trainer.devices 2 --trainer.max_epochs 2 $q >npy2.out 2>&1
  check "npy: u8 inputs (scaled) and i32 labels on 2 ranks" grep -q '"status":[[:space:]]*"ok"' "$(latest)/run.json"
  # predictions follow the files' row order: predicting the first 40 rows gives the first 40 rows of predicting all
  "$LK_BIN" predict --model.class_path mlp --model.init_args.input_dim 16 --data.class_path npy \
    --data.init_args.x train_x.npy --data.init_args.y train_y.npy --ckpt_path "$ck" $q >p1.out 2>&1
  p_all="$(latest)/predictions.npy"
  "$LK_BIN" predict --model.class_path mlp --model.init_args.input_dim 16 --data.class_path npy \
    --data.init_args.x train_x.npy --data.init_args.y train_y.npy --data.init_args.predict_x head_x.npy --ckpt_path "$ck" $q >p2.out 2>&1
  p_head="$(latest)/predictions.npy"
  check "npy: predict writes one row per input row, in the input's order" /usr/bin/python3 -c "
import numpy as np, sys
a, h = np.load('$p_all'), np.load('$p_head')
sys.exit(0 if a.shape[0] == 300 and h.shape[0] == 40 and np.allclose(a[:40], h, atol=1e-6) else 1)"
  expect_fail "npy: x and y of different lengths name both files" 1 "train_x.npy has shape [300, 16] but bad_y.npy has shape [40]" \
    "$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --data.class_path npy --data.init_args.x train_x.npy --data.init_args.y bad_y.npy $q
  expect_fail "npy: a missing file is named" 1 "cannot open missing.npy" \
    "$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --data.class_path npy --data.init_args.x missing.npy --data.init_args.y train_y.npy $q
  expect_fail "npy: augmentation of inputs that are not images names the init arg and the sample shape" 1 \
    "data.init_args.random_crop_padding: the training inputs are [16] per sample; a crop and a flip need images" \
    "$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --data.class_path npy --data.init_args.x train_x.npy \
    --data.init_args.y train_y.npy --data.init_args.random_crop_padding 2 $q
  expect_fail "npy: y is required with x" 1 "data.init_args.y is required with x" \
    "$LK_BIN" fit --model.class_path mlp --model.init_args.input_dim 16 --data.class_path npy --data.init_args.x train_x.npy $q
else
  echo "skipped the npy checks: /usr/bin/python3 with numpy writes their files"
fi
# an image folder as torchvision's ImageFolder: root/<class>/*.png (PNGs written with Python's zlib alone)
if command -v python3 >/dev/null; then
  python3 - <<'PY'
import zlib, struct, random, os
def png(path, w, h, px):
    raw = b"".join(b"\x00" + bytes(px[y * w:(y + 1) * w]) for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
r = random.Random(1)
for split, n in (("imgs", 40), ("imgs_test", 6)):
    for c, name in enumerate(("left", "right")):  # which half of the 8x8 image is bright
        os.makedirs(f"{split}/{name}", exist_ok=True)
        for i in range(n):
            png(f"{split}/{name}/{i:03d}.png", 8, 8,
                [min(255, max(0, (200 if (x < 4) == (c == 0) else 40) + r.randint(-30, 30))) for y in range(8) for x in range(8)])
os.makedirs("odd/left", exist_ok=True); os.makedirs("odd/right", exist_ok=True)
png("odd/left/a.png", 8, 8, [0] * 64); png("odd/right/b.png", 6, 8, [0] * 48)
os.makedirs("broken/left", exist_ok=True); open("broken/left/x.png", "wb").write(b"not a png")
PY
  img="--model.class_path mlp --model.init_args.input_dim 64 --model.init_args.num_classes 2 --data.class_path image_folder --data.init_args.batch_size 8"
  "$LK_BIN" fit $img --data.init_args.root imgs --data.init_args.test_root imgs_test --trainer.devices 2 --trainer.max_epochs 6 $q >img.out 2>&1
  a=$(acc)
  check "image_folder: the mlp trains on the user's PNGs with ddp on 2 ranks (val_acc $a > 0.8)" bash -c \
    "awk -v a='$a' 'BEGIN { exit !(a > 0.8) }' && grep -q '\"world_size\":[[:space:]]*2' $(latest)/run.json"
  # a random crop (padding 1: the bright half moves by at most one pixel) still learns it; a flip would swap the classes
  "$LK_BIN" fit $img --data.init_args.root imgs --data.init_args.random_crop_padding 1 --trainer.max_epochs 6 $q >img2.out 2>&1
  a=$(acc)
  check "image_folder: trains with random_crop_padding 1 (val_acc $a > 0.8)" awk -v a="$a" 'BEGIN { exit !(a > 0.8) }'
  out=$("$LK_BIN" test $img --data.init_args.root imgs --data.init_args.test_root imgs_test --ckpt_path "$(latest)/checkpoints/last.ckpt" $q 2>&1)
  check "image_folder: test runs on test_root" grep -q "test_acc" <<<"$out"
  expect_fail "image_folder: images of two sizes name the file and both sizes" 1 "odd/right/b.png is 6x8 but the images before it are 8x8" \
    "$LK_BIN" fit $img --data.init_args.root odd --data.init_args.val_split 0 $q
  expect_fail "image_folder: an undecodable image is named" 1 "image_folder: cannot decode broken/left/x.png" \
    "$LK_BIN" fit $img --data.init_args.root broken $q
  expect_fail "image_folder: a root without class directories says the layout" 1 "has no class directories (expected" \
    "$LK_BIN" fit $img --data.init_args.root imgs/left $q
else
  echo "skipped the image_folder checks: python3 writes their PNGs"
fi

finish

#!/usr/bin/env bash
# `lockstep fit --trainer.accelerator gpu` where GPUs are visible (the fake
# GPU's two): the bad `devices` forms fail with one error before any rank
# starts, and ddp over two GPUs, which picks nccl, ends cleanly on every
# rank when NCCL cannot start (LK_FAKE_NCCL_FAIL=id makes the fake's
# ncclGetUniqueId fail; on a real machine: a driver or network failure),
# with rank 0's reason on each.
source "$LK_SOURCE_DIR/tests/cli/lib.sh"
write_synth
fit() { timeout 120 "$LK_BIN" fit -c "$T/synth.yaml" --trainer.accelerator gpu "$@" 2>&1; }
out=$(fit --trainer.devices '[0, 5]'); rc=$?
check "devices [0, 5] with 2 GPUs fails with exit 1" [ "$rc" = 1 ]
check "the error names GPU 5 and the visible ones" grep -qF "trainer.devices=[0, 5] names GPU 5, but only 2 GPUs are visible (indices 0..1)" <<<"$out"
check "no rank was launched" bash -c "! grep -q '\[rank ' <<<\"\$1\"" _ "$out"
out=$(fit --trainer.devices 3); rc=$?
check "devices 3 with 2 GPUs fails with exit 1" [ "$rc" = 1 ]
check "the error says more than visible" grep -qF "trainer.devices=3 asks for more GPUs than the 2 visible" <<<"$out"
check "nothing was written" [ ! -d "$T/runs" ]
out=$(LK_FAKE_NCCL_FAIL=id fit --trainer.devices 2 --trainer.strategy ddp); rc=$?
check "ddp x 2 whose NCCL cannot start fails (exit 1, not a hang: $rc)" [ "$rc" = 1 ]
check "rank 1 reports rank 0's NCCL error" grep -qF "[rank 1] lockstep fit: error: NCCL id bootstrap: rank 0 could not create the NCCL unique id" <<<"$out"
check "the reason is NCCL's, with its last error" grep -qF "ncclGetUniqueId: unhandled system error (fake NCCL) (ncclGetUniqueId: failed on purpose" <<<"$out"
# float32_matmul_precision: the hint on a GPU with tensor cores, then TF32 in run.json
latest() { ls -d "$T"/runs/lightning_logs/version_* | sort -t_ -k3 -n | tail -1; }
out=$(fit --trainer.max_epochs 1 --trainer.enable_progress_bar false); rc=$?
check "a 32-true fit on the GPU trains (exit $rc)" [ "$rc" = 0 ]
check "it says the GPU's TF32 tensor cores could be used" grep -qF "has TF32 tensor cores: trainer.float32_matmul_precision high" <<<"$out"
check "run.json: f32 GEMMs without TF32" grep -q '"gemm_path":[[:space:]]*"cublaslt f32, CUBLAS_COMPUTE_32F (no TF32)"' "$(latest)/run.json"
out=$(fit --trainer.max_epochs 1 --trainer.enable_progress_bar false --trainer.float32_matmul_precision high); rc=$?
check "float32_matmul_precision high trains (exit $rc)" [ "$rc" = 0 ]
check "without the hint" bash -c '! grep -q "TF32 tensor cores:" <<<"$1"' _ "$out"
check "run.json: f32 GEMMs in TF32" grep -q '"gemm_path":[[:space:]]*"cublaslt f32 in TF32' "$(latest)/run.json"
out=$(fit --trainer.devices 2 --trainer.strategy ddp --trainer.max_epochs 1 --trainer.enable_progress_bar false); rc=$?
check "ddp x 2 over nccl trains (exit $rc)" [ "$rc" = 0 ]
check "and says so in run.json" grep -q '"comm_backend":[[:space:]]*"nccl"' "$(latest)/run.json"
finish

lk_add_test(NAME trainer_api SOURCES train/test_trainer.c LABELS unit TIMEOUT 120)
lk_add_test(NAME trainer_weights SOURCES train/test_weights.c LABELS unit parity TIMEOUT 60)
lk_add_test(NAME trainer_faults SOURCES train/test_trainer_faults.c LABELS unit fault TIMEOUT 120)
lk_add_test(NAME train_summary SOURCES train/test_summary.c LABELS unit TIMEOUT 60)
lk_add_script_test(NAME train_grad_scaler SCRIPT train/test_grad_scaler.sh LABELS multiproc TIMEOUT 300)
lk_add_script_test(NAME train_activation_checkpointing SCRIPT train/test_activation_checkpointing.sh LABELS multiproc TIMEOUT 300)
# The module contract: forward + loss give every step for free; training_step alone works as before.
lk_add_test(NAME module_contract SOURCES train/test_module_contract.c LABELS unit TIMEOUT 60)
# A tiny gpt through lk_trainer_fit on a token file: activation checkpointing bitwise (dropout on; single,
# bf16-mixed + accumulation + clipping, dp x2), 16-mixed and bf16-true train.
lk_add_test(NAME train_gpt_fit SOURCES train/test_gpt_fit.c LABELS unit TIMEOUT 120)
# The gpt through `lockstep fit` (synthetic tokens): ddp x2 and bf16-mixed checkpointing bitwise, nanoGPT's AdamW
# groups with warm-up + cosine, exact resume, block_size against the data.
lk_add_script_test(NAME train_gpt_cli SCRIPT train/test_gpt_cli.sh LABELS multiproc TIMEOUT 180)
# 4 ranks as 2 data-parallel groups: sampler, metrics, EarlyStopping, checkpoints and predict per group.
lk_add_test(NAME train_dp_groups SOURCES train/test_dp_groups.c LABELS multiproc TIMEOUT 180)
# resnet through the CLI: ddp x2 on synthetic images, torchvision's names exported, a too-small image refused.
lk_add_script_test(NAME train_resnet_cli SCRIPT train/test_resnet_cli.sh LABELS multiproc TIMEOUT 180)
# trainer.sync_batchnorm through the CLI: ddp x2 batch 8 = 1 process batch 16, ddp x3 with a short last batch
# = 1 process batch 12; strategy dp refused; one process or no BatchNorm: a warning.
lk_add_script_test(NAME train_sync_batchnorm SCRIPT train/test_sync_batchnorm.sh LABELS multiproc TIMEOUT 180)

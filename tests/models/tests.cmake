lk_add_test(NAME models SOURCES models/test_models.c LABELS unit parity TIMEOUT 120)
# The benchmark program; ctest only runs its one-iteration smoke mode.
lk_add_test(NAME models_bench_smoke SOURCES models/bench_models.c LABELS unit ARGS --quick TIMEOUT 60)
# issue 49: the cnn's and ResNet-20's step against a bound that counts the memory-bound passes
lk_add_test(NAME models_bench_convnets_smoke SOURCES models/bench_convnets.c LABELS unit ARGS --quick TIMEOUT 60)
# The built-in list: a builder per model, one file per model, no name compared in the registry.
# gpt at its defaults is GPT-2 124M: ~8 s here, ~55 s under ASan on 2 busy cores
lk_add_test(NAME model_registry SOURCES models/test_model_registry.c LABELS unit TIMEOUT 240)
# lk_model_blocks: the cut points; blocks run in order are bitwise the model's forward (output, gradients, buffers).
lk_add_test(NAME model_blocks SOURCES models/test_model_blocks.c LABELS unit TIMEOUT 60)
# gpt: parity with nanoGPT's GPT in PyTorch 1.13 (tools/gen_gpt_fixtures.py: loss, logits, every gradient in f32
# and bf16-mixed, one block, 10 AdamW steps), names and tying, blocks = forward, checkpointing bitwise, bad input.
lk_add_test(NAME model_gpt SOURCES models/test_gpt.c LABELS unit parity TIMEOUT 120)
# resnet: parity with torchvision's ResNet in PyTorch 1.13 (tools/gen_resnet_fixtures.py: a basic block, a bottleneck,
# a CIFAR ResNet-20 in f32 and bf16-mixed, 5 SGD steps with the running statistics), names, init, blocks, bad input.
lk_add_test(NAME model_resnet SOURCES models/test_resnet.c LABELS unit parity TIMEOUT 120)
# the same torch fixtures with conv2d on im2col + GEMM (model_resnet: oneDNN's kernels where it has them)
add_test(NAME model_resnet_im2col COMMAND test_model_resnet WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
set_tests_properties(model_resnet_im2col PROPERTIES TIMEOUT 120 LABELS "unit;parity" ENVIRONMENT LK_CONV=im2col)

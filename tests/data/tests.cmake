# The data layer: file formats, datasets and transforms, sampler and loader
# (threads), failure injection.
lk_add_test(NAME data_formats SOURCES data/test_formats.c LABELS unit TIMEOUT 60)
lk_add_test(NAME data_dataset SOURCES data/test_dataset.c LABELS unit threads TIMEOUT 60)
lk_add_test(NAME data_loader SOURCES data/test_loader.c LABELS unit threads TIMEOUT 60)
lk_add_test(NAME data_faults SOURCES data/test_faults.c LABELS fault threads TIMEOUT 60)
lk_add_test(NAME data_download SOURCES data/test_download.c LABELS unit TIMEOUT 60)
# The loader benchmark is `lockstep bench data` (src/cli/cmd_bench_data.c).
lk_add_test(NAME data_eval_sampler SOURCES data/test_eval_sampler.c LABELS unit TIMEOUT 30)
# The data readers' fuzz corpus replayed without libFuzzer.
lk_add_test(NAME fuzz_replay_data_readers SOURCES ../fuzz/fuzz_data_readers.c ../fuzz/replay.c LABELS unit TIMEOUT 60
            ARGS ${PROJECT_SOURCE_DIR}/fuzz/corpus/fuzz_data_readers)
lk_add_test(NAME data_fetch SOURCES data/test_fetch.c LABELS unit TIMEOUT 90)
# Token data for language models: tokenizers (bytes, GPT-2 BPE on a handmade
# vocabulary), the tokens data module (random/sequential windows, shards, the
# Bible default, bad input) and generation with a tiny model.
lk_add_test(NAME data_tokens SOURCES data/test_tokens.c LABELS unit TIMEOUT 60)
# GPT-2 BPE against a Python reference of GPT-2's encoder on the Bible and a
# Unicode sample (skips without python3's regex module or bible-kjv)
lk_add_script_test(NAME data_bpe_reference SCRIPT data/test_bpe_reference.sh LABELS unit TIMEOUT 120)

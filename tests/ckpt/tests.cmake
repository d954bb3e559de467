lk_add_test(NAME ckpt_safetensors SOURCES ckpt/test_safetensors.c LABELS unit fault TIMEOUT 60)
# PyTorch cross-check: only where Debian's python3 (with python3-torch) is installed.
if(EXISTS /usr/bin/python3)
  lk_add_test(NAME ckpt_safetensors_python SOURCES ckpt/test_st_python.c LABELS unit parity TIMEOUT 120)
endif()

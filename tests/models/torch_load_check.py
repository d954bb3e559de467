#!/usr/bin/python3
"""Loads a state dict written by tests/models/test_models.c (names.txt + one
.npy per tensor) into the PyTorch module of the same architecture
(tools/gen_nn_fixtures.py: make_model) with load_state_dict(strict=True),
runs it in eval mode on x.npy and compares with lockstep's output y.npy.

usage: torch_load_check.py DIR MODEL KWARGS_JSON [DIR MODEL KWARGS_JSON ...]
(several models in one run: importing torch is the slow part)
exit 0: every one loaded and its outputs agree; 1: a mismatch or load error (printed)."""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from gen_nn_fixtures import make_model  # noqa: E402


def check(d, model, kw):
    kw = json.loads(kw)
    for k, v in kw.items():
        if isinstance(v, list):
            kw[k] = tuple(v)
    m = make_model(model, **kw)
    with open(os.path.join(d, "names.txt")) as f:
        names = [line.strip() for line in f if line.strip()]
    sd = {n: torch.from_numpy(np.load(os.path.join(d, f"{i}.npy"))) for i, n in enumerate(names)}
    try:
        m.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        print(f"load_state_dict(strict=True) failed: {e}")
        return 1
    m.eval()
    x = torch.from_numpy(np.load(os.path.join(d, "x.npy")))
    want = np.load(os.path.join(d, "y.npy"))
    with torch.no_grad():
        got = m(x).numpy()
    err = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-12)
    print(f"{model}: {len(names)} tensors loaded strictly; output relative error {err:.3g}")
    return 0 if err <= 1e-5 else 1


def main():
    args = sys.argv[1:]
    if not args or len(args) % 3:
        print(__doc__)
        return 2
    rc = 0
    for i in range(0, len(args), 3):
        rc |= check(*args[i:i + 3])
    return rc


if __name__ == "__main__":
    sys.exit(main())

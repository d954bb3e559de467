#!/usr/bin/env python3
"""Loads a weights-only safetensors file (as `lockstep export` writes it) into
the PyTorch module of the same architecture with load_state_dict(strict=True);
with X.npy and Y.npy, runs the module on X in eval mode and compares with Y
(lockstep's output). Exit 0 on success, 1 on a mismatch, 77 when torch is
not importable (the caller skips).
usage: torch_check_weights.py FILE MODEL KWARGS_JSON [X.npy Y.npy]"""
import json
import os
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError:
    sys.exit(77)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_nn_fixtures import make_model  # noqa: E402

DT = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def read_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out = {}
    for name, e in h.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        a = np.frombuffer(data[lo:hi], dtype=DT[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(a.copy())
    return out


def main():
    path, model, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
    m = make_model(model, **kw)
    try:
        m.load_state_dict(read_safetensors(path), strict=True)
    except RuntimeError as e:
        print(f"load_state_dict(strict=True) failed: {e}")
        return 1
    if len(sys.argv) > 5:
        m.eval()
        with torch.no_grad():
            got = m(torch.from_numpy(np.load(sys.argv[4]))).numpy()
        want = np.load(sys.argv[5])
        err = float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-12)
        print(f"pytorch vs lockstep outputs: max relative difference {err:.3g}")
        if err > 1e-5:
            return 1
    print("loaded with strict=True")
    return 0


if __name__ == "__main__":
    sys.exit(main())

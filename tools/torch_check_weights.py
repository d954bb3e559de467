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

DT = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8, "F16": np.float16}


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
        if e["dtype"] == "BF16":  # numpy has no bf16: the top half of an f32, exactly
            u = np.frombuffer(data[lo:hi], dtype=np.uint16).astype(np.uint32) << 16
            out[name] = torch.from_numpy(u.view(np.float32).reshape(e["shape"]).copy()).to(torch.bfloat16)
            continue
        a = np.frombuffer(data[lo:hi], dtype=DT[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(a.copy())
    return out


def main():
    path, model, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
    m = make_model(model, **kw)
    sd = read_safetensors(path)
    # bf16-true / 16-true checkpoints: the module in that dtype, as Lightning's
    # module.to(dtype), and the weights loaded as they are (no cast)
    low = {t.dtype for t in sd.values()} & {torch.bfloat16, torch.float16}
    if low:
        m.to(low.pop())
    try:
        m.load_state_dict(sd, strict=True)
        for k, v in m.state_dict().items():
            if k in sd and not torch.equal(v, sd[k].to(v.dtype)) or (k in sd and v.dtype != sd[k].dtype and v.is_floating_point()):
                print(f"{k}: loaded {v.dtype}, file {sd[k].dtype}")
                return 1
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
    print("loaded with strict=True (%s)" % ", ".join(sorted({str(t.dtype) for t in sd.values()})))
    return 0


if __name__ == "__main__":
    sys.exit(main())

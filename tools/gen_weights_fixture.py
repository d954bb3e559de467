#!/usr/bin/env python3
"""Writes tests/fixtures/weights/: a weights-only safetensors file of a PyTorch
mlp (input 16, hidden (32,), 4 classes) and of a cnn (8x8 images), as
PyTorch users ship weights, plus inputs x and PyTorch's outputs y, so
lk_module_load_weights can be checked against PyTorch.
Run with Debian's PyTorch: /usr/bin/python3 tools/gen_weights_fixture.py"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_nn_fixtures import make_model  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "weights")
DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def save_safetensors(path, sd):
    """The safetensors layout: u64 header length, JSON header, data."""
    header, blobs, off = {}, [], 0
    for name, t in sd.items():
        b = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(11)
    cases = [("mlp", dict(input_dim=16, hidden=(32,), num_classes=4), (5, 16)),
             ("cnn", dict(image_size=8, channels=(4, 6), hidden=10, num_classes=3), (3, 1, 8, 8))]
    for name, kw, xshape in cases:
        m = make_model(name, **kw)
        for p in m.parameters():  # away from the defaults, so loading visibly matters
            p.data.normal_(0, 0.5)
        for b in m.buffers():
            if b.dtype == torch.float32:
                b.data.uniform_(0.5, 1.5)
        m.eval()
        x = torch.randn(*xshape)
        with torch.no_grad():
            y = m(x)
        save_safetensors(os.path.join(OUT, f"{name}.safetensors"), m.state_dict())
        np.save(os.path.join(OUT, f"{name}_x.npy"), x.numpy())
        np.save(os.path.join(OUT, f"{name}_y.npy"), y.numpy())
    print("wrote", OUT)


if __name__ == "__main__":
    main()

"""Independent cross-check of lockstep's safetensors files with PyTorch.

Usage: st_check.py IN OUT
Reads IN (written by tests/ckpt/test_st_python.c) with a reader written here
from the format description alone (struct + json, no `safetensors` package),
checks the layout rules, the metadata (strings only, as the safetensors
library requires) and every tensor's CRC-32C in it ("lk.crc32c.<name>",
computed here from the definition), and compares every tensor with the
values the C side generated (the same formula) through numpy and torch;
then writes OUT with a
writer of its own, deliberately unaligned and holding dtypes lockstep cannot
compute with, for the C side to read back.
"""
import json
import struct
import sys

import numpy as np
import torch

# name, safetensors dtype, shape: must match test_st_python.c
TENSORS = [
    ("a.f32", "F32", [2, 3]),
    ("b.f64", "F64", [4]),
    ("c.bf16", "BF16", [3, 2]),
    ("d.f16", "F16", [5]),
    ("e.i32", "I32", [2, 2]),
    ("f.i64", "I64", [3]),
    ("g.u8", "U8", [7]),
    ("h.scalar", "F32", []),
    ("i.empty", "F32", [0, 3]),
]
TORCH = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
         "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8, "BOOL": torch.bool, "I16": torch.int16}
SIZE = {"F32": 4, "F64": 8, "BF16": 2, "F16": 2, "I32": 4, "I64": 8, "U8": 1, "BOOL": 1, "I16": 2}


def crc32c(data):
    """CRC-32C bit by bit from the definition (reflected 0x82F63B78)."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def expected(t, dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    i = np.arange(n, dtype=np.int64)
    v = (i * 7 + t * 3) % 23
    if dtype != "U8":
        v = v - 11
    return torch.tensor(v.astype(np.float64)).to(TORCH[dtype]).reshape(shape)


def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0, "header length not a multiple of 8"
    header = raw[8:8 + n].decode("utf-8")
    assert header.rstrip(" ") == header.strip(), "padding must be trailing spaces"
    meta = json.loads(header)
    data = raw[8 + n:]
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in meta.items() if k != "__metadata__")
    at = 0
    for b, e, k in spans:
        assert b == at, f"{k}: begins at {b}, previous tensor ended at {at}"
        at = e
    assert at == len(data), f"tensors cover {at} of {len(data)} bytes"
    out = {}
    md = meta.get("__metadata__", {})
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in md.items()), md
    for k, v in meta.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        assert md.get("lk.crc32c." + k) == "%08x" % crc32c(data[b:e]), (k, md.get("lk.crc32c." + k))
        shape = v["shape"]
        numel = int(np.prod(shape)) if shape else 1
        assert e - b == numel * SIZE[v["dtype"]], k
        buf = bytearray(data[b:e])
        t = torch.frombuffer(buf, dtype=TORCH[v["dtype"]]) if e > b else torch.empty(0, dtype=TORCH[v["dtype"]])
        out[k] = t.reshape(shape)
    return out, meta.get("__metadata__", {})


def main():
    src, dst = sys.argv[1], sys.argv[2]
    tensors, meta = read(src)
    assert set(tensors) == {t[0] for t in TENSORS}, sorted(tensors)
    for i, (name, dtype, shape) in enumerate(TENSORS):
        got = tensors[name]
        want = expected(i, dtype, shape)
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        assert list(got.shape) == shape, (name, list(got.shape), shape)
        assert torch.equal(got, want), (name, got, want)
        if dtype not in ("BF16",):  # numpy has no bfloat16; the torch check covers it
            assert np.array_equal(got.numpy(), want.numpy()), name
    assert meta.get("format") == "pt" and meta.get("writer") == "lockstep", meta
    assert sorted(k for k in meta if k.startswith("lk.crc32c.")) == sorted("lk.crc32c." + t[0] for t in TENSORS), meta

    # Our own writer: a 5-byte U8 tensor first, so the F32 after it sits at an
    # odd offset; BOOL and I16 are valid safetensors dtypes lockstep only lists.
    out = [
        ("u8_odd", expected(0, "U8", [5])),
        ("w.f32", expected(1, "F32", [2, 3])),
        ("w.bf16", expected(2, "BF16", [4])),
        ("w.f16", expected(3, "F16", [2, 2])),
        ("w.f64", expected(4, "F64", [3])),
        ("w.i64", expected(5, "I64", [2])),
        ("w.i32", expected(6, "I32", [3])),
        ("mask", torch.tensor([True, False, True])),
        ("w.i16", torch.tensor([-3, 4], dtype=torch.int16)),
        ("scalar", torch.tensor(2.5, dtype=torch.float32)),
    ]
    names = {v: k for k, v in TORCH.items()}
    header, blobs, at = {"__metadata__": {"source": "python", "format": "pt"}}, [], 0
    for name, t in out:
        b = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    print("st_check.py: ok,", len(tensors), "tensors checked,", len(out), "written")


if __name__ == "__main__":
    main()

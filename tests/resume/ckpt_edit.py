#!/usr/bin/python3
"""Writes a copy of a lockstep checkpoint with edits, as a user's broken or
hand-made file would have them:

    ckpt_edit.py IN OUT [meta:KEY=VALUE] [f64:NAME=VALUE] [i64:NAME=VALUE]

meta: sets a metadata string; f64/i64: overwrites a scalar tensor's bytes
(it must already have that dtype). Only the standard library: it parses the
safetensors header itself (8-byte little-endian length, JSON, data)."""
import json
import struct
import sys

src, dst, edits = sys.argv[1], sys.argv[2], sys.argv[3:]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
for e in edits:
    kind, _, kv = e.partition(":")
    key, _, val = kv.partition("=")
    if kind == "meta":
        header["__metadata__"][key] = val
        continue
    info = header[key]
    want = {"f64": "F64", "i64": "I64"}[kind]
    if info["dtype"] != want:
        sys.exit(f"{key} has dtype {info['dtype']}, not {want}")
    struct.pack_into("<d" if kind == "f64" else "<q", data, info["data_offsets"][0],
                     float(val) if kind == "f64" else int(val))
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))

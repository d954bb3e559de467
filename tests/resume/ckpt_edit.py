#!/usr/bin/python3
"""Writes a copy of a lockstep checkpoint with edits, as a user's broken or
hand-made file would have them:

    ckpt_edit.py IN OUT [meta:KEY=VALUE] [f64:NAME=VALUE] [i64:NAME=VALUE]
                        [flip:NAME] [strip-crc]
    ckpt_edit.py --list IN

meta: sets a metadata string; f64/i64: overwrites a scalar tensor's bytes
(it must already have that dtype) and, as a careful hand would, updates the
tensor's checksum so that what is tested is the value; flip: changes one
byte in the middle of tensor NAME and leaves its checksum as it was, as a
disk or a copy would; strip-crc: removes every checksum (a checkpoint of a
lockstep from before they existed). --list prints the tensor names, one a
line. Only the standard library: it parses the safetensors header itself
(8-byte little-endian length, JSON, data) and computes CRC-32C itself."""
import json
import struct
import sys

CRC = "lk.crc32c."


def _table():
    t = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


TABLE = _table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])


if sys.argv[1] == "--list":
    header, _ = load(sys.argv[2])
    for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"] if kv[0] != "__metadata__" else [-1]):
        if k != "__metadata__":
            print(k)
    sys.exit(0)

src, dst, edits = sys.argv[1], sys.argv[2], sys.argv[3:]
header, data = load(src)
meta = header.setdefault("__metadata__", {})
for e in edits:
    kind, _, kv = e.partition(":")
    key, _, val = kv.partition("=")
    if kind == "meta":
        meta[key] = val
        continue
    if kind == "strip-crc":
        for k in [k for k in meta if k.startswith(CRC)]:
            del meta[k]
        continue
    info = header[key]
    b, end = info["data_offsets"]
    if kind == "flip":
        if end == b:
            sys.exit(f"{key} is empty: no byte to flip")
        data[(b + end) // 2] ^= 0x40
        continue
    want = {"f64": "F64", "i64": "I64"}[kind]
    if info["dtype"] != want:
        sys.exit(f"{key} has dtype {info['dtype']}, not {want}")
    struct.pack_into("<d" if kind == "f64" else "<q", data, b, float(val) if kind == "f64" else int(val))
    if CRC + key in meta:
        meta[CRC + key] = "%08x" % crc32c(data[b:end])
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))

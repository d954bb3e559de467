#!/usr/bin/env python3
"""Turns a CUDA kernel file into C++ for the host emulation (cuda_runtime.h
here): every launch `kernel<<<grid, block, shared_bytes, stream>>>(args)`
becomes `lk_emu_launch(grid, block, shared_bytes, stream, kernel, args)`: the
arguments are evaluated at the launch, as a GPU launch copies them, even
when the fake GPU (tests/gpu/fake/) runs the kernel later.
The launch configuration is passed through as written, so a launch without
a stream (the legacy stream 0) finds no matching lk_emu_launch and does not
compile. Nothing else changes.

    cu2cpp.py in.cu out.cpp
"""
import re
import sys

src = open(sys.argv[1]).read()
out, pos = [], 0
launch = re.compile(r"([A-Za-z_][\w:]*(?:<[\w\s,]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
while True:
    m = launch.search(src, pos)
    if not m:
        out.append(src[pos:])
        break
    out.append(src[pos:m.start()])
    depth, i = 1, m.end()
    while depth:  # the launch's argument list, to its closing parenthesis
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        i += 1
    args = src[m.end():i - 1]
    out.append("lk_emu_launch(%s, %s%s)" % (m.group(2), m.group(1), (", " + args) if args.strip() else ""))
    pos = i
open(sys.argv[2], "w").write('#line 1 "%s"\n' % sys.argv[1] + "".join(out))

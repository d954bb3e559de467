#!/usr/bin/env python3
"""The scale sequence of torch.cuda.amp.GradScaler (PyTorch 1.13), for
tests/optim/test_scaler.c. torch 1.13 has no CPU kernel for
_amp_update_scale_, so this follows that kernel's arithmetic
(aten/src/ATen/native/cuda/AmpKernels.cu): the scale is an f32, the factors
are doubles, each product is rounded back to f32; a growth that would not
be finite is not taken; the growth tracker counts clean steps and resets on
an overflow or a growth. unscale_ multiplies by
self._scale.double().reciprocal().float(). Needs no torch.

    python3 tools/grad_scaler_reference.py
"""
import math
import struct


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0] if math.isfinite(x) and abs(x) < 3.5e38 else math.inf


def update(scale, tracker, found_inf, growth, backoff, interval):
    if found_inf:
        return f32(scale * backoff), 0
    if tracker + 1 == interval:
        grown = f32(scale * growth)
        return (grown if math.isfinite(grown) else scale), 0
    return scale, tracker + 1


def run(init, growth, backoff, interval, infs):
    scale, tracker, out = f32(init), 0, []
    for inf in infs:
        scale, tracker = update(scale, tracker, inf, growth, backoff, interval)
        out.append((scale, tracker))
    return out


if __name__ == "__main__":
    steps = [0, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0]
    print("odd factors (init 1234.567, growth 1.7, backoff 0.3, interval 2):")
    for s, t in run(1234.567, 1.7, 0.3, 2, steps):
        print("    {%.9ef, %d}," % (s, t))
    print("inv_scale of 1234.567 (f32):", "%.9e" % f32(1.0 / f32(1234.567)))

#!/usr/bin/env python3
"""Reference values for tests/optim/test_rmsprop.c: torch.optim.RMSprop's
single-tensor update (PyTorch 1.13, torch/optim/rmsprop.py), one PyTorch op
per line, each result rounded to float32 as a CPU float32 tensor op rounds it
(scalars are rounded to float32 once, as the C kernels do). Pure Python, so it
runs without torch; prints the parameters after each step as C arrays."""
import math
import struct


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def rmsprop(p, grads, lr, alpha, eps, wd, momentum, centered):
    n = len(p)
    sq, buf, ga = [0.0] * n, [0.0] * n, [0.0] * n
    a, oma, e, w, m, nlr = f32(alpha), f32(1 - alpha), f32(eps), f32(wd), f32(momentum), f32(-lr)
    out = []
    for g in grads:
        for i in range(n):
            gi = f32(g[i])
            if wd:
                gi = f32(gi + f32(w * p[i]))                   # grad.add(param, alpha=weight_decay)
            s = f32(f32(sq[i] * a) + f32(f32(oma * gi) * gi))  # square_avg.mul_(alpha).addcmul_(grad, grad, 1 - alpha)
            sq[i] = s
            if centered:
                ga[i] = f32(f32(ga[i] * a) + f32(oma * gi))    # grad_avg.mul_(alpha).add_(grad, alpha=1 - alpha)
                avg = f32(math.sqrt(f32(s + f32(f32(-1.0 * ga[i]) * ga[i]))))
            else:
                avg = f32(math.sqrt(s))
            avg = f32(avg + e)
            if momentum:
                buf[i] = f32(f32(buf[i] * m) + f32(gi / avg))  # buf.mul_(momentum).addcdiv_(grad, avg)
                p[i] = f32(p[i] + f32(nlr * buf[i]))           # param.add_(buf, alpha=-lr)
            else:
                p[i] = f32(p[i] + f32(nlr * f32(gi / avg)))    # param.addcdiv_(grad, avg, value=-lr)
        out.append(list(p))
    return out


P0 = [1.0, -2.0, 0.5, 0.0]
GRADS = [[0.1 * (t + 1), -0.3 * (t + 1), 0.7 / (t + 1), -1e-3 * (t + 1)] for t in range(3)]
CASES = {
    "plain": dict(lr=1e-2, alpha=0.99, eps=1e-8, wd=0.0, momentum=0.0, centered=False),
    "all": dict(lr=1e-2, alpha=0.9, eps=1e-6, wd=0.1, momentum=0.5, centered=True),
}
for name, kw in CASES.items():
    steps = rmsprop([f32(x) for x in P0], GRADS, **kw)
    print("static const float expect_%s[3][4] = {" % name)
    for s in steps:
        print("    {%s}," % ", ".join("%.9ef" % v for v in s))
    print("};")

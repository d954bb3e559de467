#!/usr/bin/python3
"""Writes the PyTorch 1.13 reference of SyncBatchNorm's global statistics
into tests/fixtures/syncbn/ (run with Debian's python3-torch:
/usr/bin/python3 tools/gen_syncbn_fixtures.py; tests/nn/test_sync_bn_torch.c
reads them).

torch 1.13's nn.SyncBatchNorm runs on CUDA only, and what it computes is
BatchNorm over the concatenation of every rank's batch: the forward
normalises with the global mean and biased variance, the running variance
takes the unbiased one over the global count, and the input gradient of a
rank is that of the sum of every rank's loss (its all-reduced sum_dy and
sum_dy_xmu). So the reference is nn.BatchNorm on the whole batch in training
mode, one forward and backward; the test splits the batch over ranks
unevenly and compares its rows.

Files (float32), for each case P in (bn1d, bn2d):
  P.x                  the whole batch (a mean far from 0 next to its
                       deviation: the sums of squares must not cancel)
  P.k                  the loss weights: loss = sum(y * k)
  P.w.<name>           weight, bias, running_mean, running_var before
  P.y                  the output
  P.dx                 the input's gradient
  P.g.weight, P.g.bias their gradients (the whole loss's)
  P.s.running_mean, P.s.running_var   after the forward (momentum 0.1)
bn1d: BatchNorm1d(5) on [8, 5]; bn2d: BatchNorm2d(3) on [8, 3, 4, 4].
"""
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "syncbn")


def save(name, t):
    np.save(os.path.join(OUT, name + ".npy"), t.detach().numpy().astype(np.float32))


def case(prefix, bn, shape, seed):
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    x = (torch.randn(shape, generator=g) * 0.5 + 6.0).requires_grad_(True)
    k = torch.randn(shape, generator=g)
    with torch.no_grad():
        bn.weight.copy_(1.0 + 0.3 * torch.randn(c, generator=g))
        bn.bias.copy_(0.2 * torch.randn(c, generator=g))
        bn.running_mean.copy_(0.1 * torch.randn(c, generator=g))
        bn.running_var.copy_(1.0 + 0.1 * torch.rand(c, generator=g))
    save(prefix + ".x", x)
    save(prefix + ".k", k)
    for n in ("weight", "bias", "running_mean", "running_var"):
        save(prefix + ".w." + n, getattr(bn, n))
    bn.train()
    y = bn(x)
    (y * k).sum().backward()
    save(prefix + ".y", y)
    save(prefix + ".dx", x.grad)
    save(prefix + ".g.weight", bn.weight.grad)
    save(prefix + ".g.bias", bn.bias.grad)
    save(prefix + ".s.running_mean", bn.running_mean)
    save(prefix + ".s.running_var", bn.running_var)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    case("bn1d", torch.nn.BatchNorm1d(5), (8, 5), 1)
    case("bn2d", torch.nn.BatchNorm2d(3), (8, 3, 4, 4), 2)
    print("wrote", OUT, "with torch", torch.__version__)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Writes the PyTorch autocast parity fixtures into tests/fixtures/autocast/.

Run it with Debian's interpreter, which has python3-torch (PyTorch 1.13 CPU):

    /usr/bin/python3 tools/gen_autocast_fixtures.py            # rewrites tests/fixtures/autocast
    /usr/bin/python3 tools/gen_autocast_fixtures.py --out DIR  # elsewhere

Inputs and parameters are not stored: both sides compute them from
hvals(seed, n, lo, hi) of tools/gen_nn_fixtures.py (an integer hash numpy and
C evaluate exactly; tests/nn/nn_fixtures.h), which keeps the fixtures small
enough to hold models with 784 input features. For each case, under
<out>/<case>/:

    out.npy, loss.npy, grad_<param>.npy
        one step under torch.autocast("cpu", dtype=torch.bfloat16): forward
        output (bf16 in torch, stored widened to f32), loss, and the gradient
        of every parameter (f32: the parameters are f32 leaves)
    ref_out.npy, ref_loss.npy, ref_grad_<param>.npy
        the same step with the model, inputs and loss in float64 (stored f64)

The cases (their seeds and shapes are repeated in tests/parity/test_autocast.c):

    linear        F.linear, x [16, 96] (requires grad), weight [48, 96], bias
    conv2d        3x3, padding 1, x [4, 3, 10, 10] (requires grad), weight [8, 3, 3, 3], bias
    conv2d_1x1    1x1 pointwise, x [2, 16, 6, 6] (requires grad), weight [8, 16, 1, 1], bias
    conv2d_groups 3x3, stride 2, groups 2, x [3, 4, 9, 9] (requires grad), weight [6, 2, 3, 3], no bias
    mlp           lockstep's built-in mlp: 784-64-32-10, batch 16, cross-entropy
    autoencoder   lockstep's built-in autoencoder: 784-32-16-8 mirrored, batch 8, MSE
    cnn           lockstep's built-in cnn: 1x8x8 images, channels 4,8, hidden 16, batch 6,
                  cross-entropy (conv -> batch norm -> relu -> max pool, twice, then
                  two linears; batch norm in training mode, its weight 1 and bias 0)

The single-op cases use loss = sum(out * R), R = hvals(seed + 1, -1, 1) of
out's shape (so dY = R). In every case the loss is taken on out.float(),
outside the low-precision list: lockstep runs losses in f32 under autocast,
and torch would otherwise run log_softmax on the bf16 logits. The widths of
the two models are smaller than the built-in defaults (784-256-128-10 and
784-512-256-64) only to keep the gradient files under 2 MB in all.
"""

import argparse
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_nn_fixtures import hlabels, hvals, make_model  # noqa: E402


def hash_params(module, seed):
    """Parameter k (named_parameters order) ~ hvals(seed + k) in +-1/sqrt(fan_in),
    a 1-dim parameter with the bound of the weight before it: set_hash_weights
    of gen_nn_fixtures.py (and nn_set_hash_weights in C), for modules whose
    parameter names have no dot too. Batch norm parameters (a module named
    bn*) keep their defaults, as nn_set_hash_weights does."""
    import torch
    bound = 1.0
    with torch.no_grad():
        for k, (name, p) in enumerate(module.named_parameters()):
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2].startswith("bn"):
                continue
            if p.dim() >= 2:
                bound = 1.0 / math.sqrt(p.shape[1] * int(np.prod(p.shape[2:])))
            p.copy_(torch.from_numpy(hvals(seed + k, p.numel(), -bound, bound).reshape(p.shape)))


def op_case(name, seed, make_module, xshape):
    """A single module with loss = sum(out * R); x requires grad."""
    import torch

    def build():
        m = make_module()
        hash_params(m, seed + 10)
        x = torch.from_numpy(hvals(seed, int(np.prod(xshape)), -1.0, 1.0).reshape(xshape))
        return m, x

    def loss_fn(out, x, m):
        r = torch.from_numpy(hvals(seed + 1, out.numel(), -1.0, 1.0).reshape(out.shape)).to(out.dtype)
        return (out * r).sum()

    return name, build, loss_fn, True


def model_case(name, kind, kw, seed, batch):
    import torch
    import torch.nn.functional as F

    def build():
        m = make_model(kind, **kw)
        hash_params(m, seed + 10)
        x = torch.from_numpy(hvals(seed, batch * kw["input_dim"], 0.0, 1.0).reshape(batch, kw["input_dim"]))
        return m, x

    def loss_fn(out, x, m):
        if kind == "autoencoder":
            return F.mse_loss(out, x.to(out.dtype))
        y = torch.from_numpy(hlabels(seed + 1, batch, kw["num_classes"]))
        return F.cross_entropy(out, y)

    return name, build, loss_fn, False


def cnn_case(name, kw, seed, batch):
    """lockstep's cnn on [batch, 1, S, S] images in [0, 1], cross-entropy."""
    import torch
    import torch.nn.functional as F

    def build():
        m = make_model("cnn", **kw)
        hash_params(m, seed + 10)
        s = kw["image_size"]
        x = torch.from_numpy(hvals(seed, batch * s * s, 0.0, 1.0).reshape(batch, 1, s, s))
        return m, x

    def loss_fn(out, x, m):
        return F.cross_entropy(out, torch.from_numpy(hlabels(seed + 1, batch, kw["num_classes"])))

    return name, build, loss_fn, False


def cases():
    import torch.nn as nn
    return [
        op_case("linear", 1100, lambda: nn.Linear(96, 48), (16, 96)),
        op_case("conv2d", 1200, lambda: nn.Conv2d(3, 8, 3, padding=1), (4, 3, 10, 10)),
        op_case("conv2d_1x1", 1300, lambda: nn.Conv2d(16, 8, 1), (2, 16, 6, 6)),
        op_case("conv2d_groups", 1400, lambda: nn.Conv2d(4, 6, 3, stride=2, groups=2, bias=False), (3, 4, 9, 9)),
        model_case("mlp", "mlp", dict(input_dim=784, hidden=(64, 32), num_classes=10), 1500, 16),
        model_case("autoencoder", "autoencoder", dict(input_dim=784, hidden=(32, 16), latent_dim=8), 1600, 8),
        cnn_case("cnn", dict(image_size=8, channels=(4, 8), hidden=16, num_classes=10), 1700, 6),
    ]


def run(build, loss_fn, x_grad, autocast):
    """One forward + loss + backward; returns out, loss and {name: grad} as numpy."""
    import torch
    m, x = build()
    if not autocast:
        m = m.double()
        x = x.double()
    x.requires_grad_(x_grad)
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
        out = out.float()  # the loss in f32, as lockstep runs it
    else:
        out = m(x)
    loss = loss_fn(out, x.detach(), m)
    loss.backward()
    grads = {n: p.grad for n, p in m.named_parameters()}
    if x_grad:
        grads["x"] = x.grad
    dt = np.float32 if autocast else np.float64
    return (out.detach().numpy().astype(dt), np.array([loss.item()], dtype=dt),
            {n: g.detach().numpy().astype(dt) for n, g in grads.items()})


def main():
    import torch
    out = fresh_out_dir(__doc__, "autocast")
    names = []
    for name, build, loss_fn, x_grad in cases():
        d = os.path.join(out, name)
        os.makedirs(d)
        for prefix, autocast in (("", True), ("ref_", False)):
            o, l, grads = run(build, loss_fn, x_grad, autocast)
            np.save(os.path.join(d, prefix + "out.npy"), o)
            np.save(os.path.join(d, prefix + "loss.npy"), l)
            for n, g in grads.items():
                np.save(os.path.join(d, prefix + "grad_" + n + ".npy"), np.ascontiguousarray(g))
        names.append(name)
    write_manifest(out, "gen_autocast_fixtures.py", names)


def fresh_out_dir(doc, subdir):
    """--out (default tests/fixtures/<subdir>), emptied; torch on one thread
    (one summation order, whatever the machine)."""
    import torch
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", subdir))
    out = os.path.normpath(ap.parse_args().out)
    torch.set_num_threads(1)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    return out


def write_manifest(out, script, names):
    """<out>/MANIFEST: the versions that wrote the fixtures and the case names."""
    import torch
    with open(os.path.join(out, "MANIFEST"), "w") as f:
        f.write("# written by tools/%s; do not edit\n" % script)
        f.write("torch %s\nnumpy %s\ncases %d\n" % (torch.__version__, np.__version__, len(names)))
        for n in names:
            f.write(n + "\n")
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    print("wrote %d cases, %d bytes, to %s" % (len(names), total, out))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Writes the bf16-true / 16-true parity fixtures into tests/fixtures/true16/.

Run it with Debian's interpreter, which has python3-torch (PyTorch 1.13 CPU):

    /usr/bin/python3 tools/gen_true16_fixtures.py            # rewrites tests/fixtures/true16
    /usr/bin/python3 tools/gen_true16_fixtures.py --out DIR  # elsewhere

bf16-true is Lightning's HalfPrecision plugin: the module converted with
module.to(torch.bfloat16) and the float inputs with it, so forward, loss and
backward run on bf16 tensors and the gradients are bf16. Parameters and
inputs come from hvals() as in tools/gen_autocast_fixtures.py (the same
seeds and shapes as its mlp and autoencoder cases), rounded to bf16 by the
conversion. For each case, under <out>/<case>/:

    out.npy, loss.npy, grad_<param>.npy
        one step of the bf16 module in torch (values widened to f32; every
        file is f32 but loss.npy, f64)
    ref_out.npy, ref_loss.npy, ref_grad_<param>.npy
        the same step in float64 from the bf16-rounded parameters and inputs
        (what bf16-true computes, without its roundings)
    ref16_out.npy, ref16_loss.npy, ref16_grad_<param>.npy
        the same in float64 from f16-rounded parameters and inputs: 16-true's
        reference (torch 1.13 has no CPU float16 matmul, so there is no torch
        f16 run to compare with)

torch 1.13 has no CPU bf16 mse_loss kernel either: the autoencoder's loss
is its formula, ((out - x) ** 2).mean(), on the bf16 tensors.
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_autocast_fixtures import fresh_out_dir, hash_params, write_manifest  # noqa: E402
from gen_nn_fixtures import hlabels, hvals, make_model  # noqa: E402

CASES = [
    ("mlp", "mlp", dict(input_dim=784, hidden=(64, 32), num_classes=10), 1500, 16),
    ("autoencoder", "autoencoder", dict(input_dim=784, hidden=(32, 16), latent_dim=8), 1600, 8),
]


def step(kind, kw, seed, batch, dtype, compute):
    """One forward + loss + backward with parameters and input rounded to
    `dtype`, computed in `compute` (dtype itself, or float64)."""
    import torch
    import torch.nn.functional as F
    m = make_model(kind, **kw)
    hash_params(m, seed + 10)
    x = torch.from_numpy(hvals(seed, batch * kw["input_dim"], 0.0, 1.0).reshape(batch, kw["input_dim"]))
    m = m.to(dtype).to(compute)
    x = x.to(dtype).to(compute)
    out = m(x)
    if kind == "autoencoder":  # torch 1.13 has no bf16 mse_loss kernel on the CPU: its formula
        loss = ((out - x) ** 2).mean()
    else:
        loss = F.cross_entropy(out, torch.from_numpy(hlabels(seed + 1, batch, kw["num_classes"])))
    loss.backward()
    # stored as f32 (the float64 references too: 2^-24 is far below the
    # 16-bit tolerances they are held to, and it halves the files)
    grads = {n: p.grad.detach().to(torch.float64).numpy().astype(np.float32) for n, p in m.named_parameters()}
    return (out.detach().to(torch.float64).numpy().astype(np.float32), np.array([loss.item()], dtype=np.float64),
            grads)


def main():
    import torch
    out = fresh_out_dir(__doc__, "true16")
    for name, kind, kw, seed, batch in CASES:
        d = os.path.join(out, name)
        os.makedirs(d)
        runs = (("", torch.bfloat16, torch.bfloat16), ("ref_", torch.bfloat16, torch.float64),
                ("ref16_", torch.float16, torch.float64))
        for prefix, dtype, compute in runs:
            o, l, grads = step(kind, kw, seed, batch, dtype, compute)
            np.save(os.path.join(d, prefix + "out.npy"), o)
            np.save(os.path.join(d, prefix + "loss.npy"), l)
            for n, g in grads.items():
                np.save(os.path.join(d, prefix + "grad_" + n + ".npy"), np.ascontiguousarray(g))
    write_manifest(out, "gen_true16_fixtures.py", [c[0] for c in CASES])


if __name__ == "__main__":
    main()

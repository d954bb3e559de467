#!/usr/bin/python3
"""Writes the PyTorch parity fixtures for the nn, optim and models layers
into tests/fixtures/nn/ (small .npy files; run with Debian's python3-torch:
/usr/bin/python3 tools/gen_nn_fixtures.py).

Inputs, weights and gradients are not stored: both sides compute them from
hvals(seed, n, lo, hi), an integer hash that numpy and C evaluate exactly
(see tests/nn/nn_fixtures.h), so the fixtures hold only results: layer
outputs and gradients, optimizer trajectories, learning-rate sequences and
training loss curves. The PyTorch modules equivalent to lockstep's built-in
models are defined here too (tests/models/torch_load_check.py imports them).
"""
import math
import os
import sys

import numpy as np

M32 = np.uint64(0xFFFFFFFF)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "nn")


def hvals(seed, n, lo=-1.0, hi=1.0):
    """n float32 values in [lo, hi) from an integer hash of (seed, index)."""
    i = np.arange(n, dtype=np.uint64)
    x = (i * np.uint64(2654435761) + np.uint64(seed) * np.uint64(40503) + np.uint64(12345)) & M32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x2C1B3C6D)) & M32
    x ^= x >> np.uint64(12)
    x = (x * np.uint64(0x297A2D39)) & M32
    x ^= x >> np.uint64(15)
    u = x.astype(np.float64) / 4294967296.0
    return (lo + (hi - lo) * u).astype(np.float32)


def hlabels(seed, n, classes):
    u = hvals(seed, n, 0.0, 1.0).astype(np.float64)
    return np.minimum(np.floor(u * classes), classes - 1).astype(np.int64)


# ---- the PyTorch equivalents of src/models ---------------------------------------------

def _stack(w, dropout=0.0, sigmoid=False):
    import torch.nn as nn
    layers = []
    for i in range(len(w) - 1):
        layers.append(nn.Linear(w[i], w[i + 1]))
        if i + 2 < len(w):
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    if sigmoid:
        layers.append(nn.Sigmoid())
    return nn.Sequential(*layers)


def make_model(name, **kw):
    import torch.nn as nn
    import torch.nn.functional as F

    class Autoencoder(nn.Module):
        def __init__(self, input_dim=784, hidden=(512, 256), latent_dim=64, final_activation="none"):
            super().__init__()
            w = [input_dim, *hidden, latent_dim]
            self.encoder = _stack(w)
            self.decoder = _stack(w[::-1], sigmoid=final_activation == "sigmoid")

        def forward(self, x):
            return self.decoder(self.encoder(x.flatten(1)))

    class MLP(nn.Module):
        def __init__(self, input_dim=784, hidden=(256, 128), num_classes=10, dropout=0.0):
            super().__init__()
            self.layers = _stack([input_dim, *hidden, num_classes], dropout)

        def forward(self, x):
            return self.layers(x.flatten(1))

    class CNN(nn.Module):
        def __init__(self, in_channels=1, image_size=28, channels=(32, 64), hidden=128, num_classes=10):
            super().__init__()
            self.geom = (in_channels, image_size)
            self.conv1 = nn.Conv2d(in_channels, channels[0], 3, padding=1)
            self.bn1 = nn.BatchNorm2d(channels[0])
            self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
            self.bn2 = nn.BatchNorm2d(channels[1])
            self.fc1 = nn.Linear(channels[1] * (image_size // 4) ** 2, hidden)
            self.fc2 = nn.Linear(hidden, num_classes)

        def forward(self, x):
            if x.dim() == 2:
                x = x.view(x.shape[0], self.geom[0], self.geom[1], self.geom[1])
            x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
            x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
            return self.fc2(F.relu(self.fc1(x.flatten(1))))

    return {"autoencoder": Autoencoder, "mlp": MLP, "cnn": CNN}[name](**kw)


def set_hash_weights(model, seed):
    """Deterministic weights both sides can compute: parameter k (named_parameters
    order) of >= 2 dims ~ hvals(seed + k) in +-1/sqrt(fan_in); a 1-dim parameter
    the same bound as the weight before it; BatchNorm affine parameters keep
    their defaults (ones, zeros)."""
    import torch
    bound = 1.0
    with torch.no_grad():
        for k, (name, p) in enumerate(model.named_parameters()):
            if name.split(".")[-2].startswith("bn"):
                continue
            if p.dim() >= 2:
                bound = 1.0 / math.sqrt(p.shape[1] * int(np.prod(p.shape[2:])))
            p.copy_(torch.from_numpy(hvals(seed + k, p.numel(), -bound, bound).reshape(p.shape)))


# ---- writing ---------------------------------------------------------------------------

def save(name, arr):
    arr = np.ascontiguousarray(arr)
    if arr.dtype == np.float64 and not name.endswith((".lr", ".mom", ".loss")):
        arr = arr.astype(np.float32)
    np.save(os.path.join(OUT, name + ".npy"), arr, allow_pickle=False)


def t(a, grad=False):
    import torch
    x = torch.from_numpy(np.array(a))
    return x.requires_grad_(grad)


# ---- layers: forward and backward --------------------------------------------------------

def layer_cases():
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    cases = [
        # name, module, input shape, input range, seed
        ("linear", nn.Linear(5, 3), (4, 5), 1.0),
        ("linear_nobias", nn.Linear(6, 2, bias=False), (2, 3, 6), 1.0),
        ("conv2d", nn.Conv2d(3, 4, 3, padding=1), (2, 3, 6, 5), 1.0),
        ("conv2d_s2", nn.Conv2d(2, 3, (3, 2), stride=2, padding=(1, 0), bias=False), (2, 2, 7, 6), 1.0),
        ("maxpool2d", nn.MaxPool2d(2), (2, 3, 6, 6), 1.0),
        ("maxpool2d_s1p1", nn.MaxPool2d(3, stride=1, padding=1), (1, 2, 5, 4), 1.0),
        ("avgpool2d", nn.AvgPool2d(3, stride=2, padding=1), (2, 2, 7, 6), 1.0),
        ("adaptive_avgpool2d", nn.AdaptiveAvgPool2d((3, 2)), (2, 3, 7, 5), 1.0),
        ("batchnorm1d", nn.BatchNorm1d(4), (6, 4), 2.0),
        ("batchnorm2d", nn.BatchNorm2d(3, momentum=0.2), (3, 3, 4, 3), 2.0),
        ("layernorm", nn.LayerNorm((4, 5)), (3, 4, 5), 2.0),
        ("relu", nn.ReLU(), (3, 7), 3.0),
        ("gelu", nn.GELU(), (3, 7), 3.0),
        ("gelu_tanh", nn.GELU(approximate="tanh"), (3, 7), 3.0),
        ("tanh", nn.Tanh(), (3, 7), 3.0),
        ("sigmoid", nn.Sigmoid(), (3, 7), 3.0),
        ("leaky_relu", nn.LeakyReLU(0.1), (3, 7), 3.0),
        ("elu", nn.ELU(0.7), (3, 7), 3.0),
        ("silu", nn.SiLU(), (3, 7), 3.0),
        ("flatten", nn.Flatten(), (2, 3, 2, 2), 1.0),
        ("sequential", nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2)), (4, 5), 1.0),
        ("batchnorm2d_plain", nn.BatchNorm2d(3, affine=False, track_running_stats=False), (2, 3, 3, 4), 2.0),
        ("layernorm_plain", nn.LayerNorm(6, eps=1e-3, elementwise_affine=False), (4, 6), 2.0),
        ("batchnorm1d_3d", nn.BatchNorm1d(3), (4, 3, 5), 2.0),
    ]
    for ci, (name, mod, shape, rng) in enumerate(cases):
        seed = 1000 * (ci + 1)
        with torch.no_grad():
            for k, (pn, p) in enumerate(mod.named_parameters()):
                p.copy_(torch.from_numpy(hvals(seed + 1 + k, p.numel(), -0.5, 0.5).reshape(p.shape)))
        x = t(hvals(seed, int(np.prod(shape)), -rng, rng).reshape(shape), True)
        mod.train()
        y = mod(x)
        r = torch.from_numpy(hvals(seed + 100, y.numel(), -1.0, 1.0).reshape(y.shape))
        (y * r).sum().backward()
        save(f"layer.{name}.y", y.detach().numpy())
        save(f"layer.{name}.dx", x.grad.numpy())
        for pn, p in mod.named_parameters():
            save(f"layer.{name}.d.{pn}", p.grad.numpy())
        for bn, b in mod.named_buffers():
            save(f"layer.{name}.buf.{bn}", b.numpy())
        if name.startswith("batchnorm"):
            mod.eval()
            with torch.no_grad():
                save(f"layer.{name}.y_eval", mod(x).numpy())
    # BatchNorm with momentum=None: a cumulative average over three batches.
    bn = nn.BatchNorm1d(4, momentum=None)
    for k in range(3):
        bn(t(hvals(95000 + k, 24, -2.0, 2.0).reshape(6, 4)))
    save("layer.batchnorm_cumulative.buf.running_mean", bn.running_mean.numpy())
    save("layer.batchnorm_cumulative.buf.running_var", bn.running_var.numpy())
    # Embedding: integer input.
    emb = nn.Embedding(10, 4)
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(hvals(90001, 40, -0.5, 0.5).reshape(10, 4)))
    idx = torch.from_numpy(hlabels(90000, 6, 10).reshape(2, 3))
    y = emb(idx)
    r = torch.from_numpy(hvals(90100, y.numel()).reshape(y.shape))
    (y * r).sum().backward()
    save("layer.embedding.y", y.detach().numpy())
    save("layer.embedding.d.weight", emb.weight.grad.numpy())


# ---- optimizers: 100 steps from the same parameters and gradients ----------------------------

OPT_SHAPES = [(3, 4), (5,)]


def optimizer_cases():
    import torch
    cases = {
        "sgd": ("sgd", dict(lr=0.1)),
        "sgd_momentum": ("sgd", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
        "sgd_nesterov": ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
        "sgd_maximize": ("sgd", dict(lr=0.01, momentum=0.5, maximize=True)),
        "adam": ("adam", dict(lr=1e-2)),
        "adam_wd_amsgrad": ("adam", dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
        "adamw": ("adamw", dict(lr=1e-2, weight_decay=0.05)),
        "adamw_amsgrad": ("adamw", dict(lr=5e-3, betas=(0.8, 0.99), eps=1e-6, amsgrad=True)),
        "adam_groups": ("adam", None),
    }
    for name, (kind, kw) in cases.items():
        ps = [torch.from_numpy(hvals(1 + k, int(np.prod(s))).reshape(s)).requires_grad_(True) for k, s in enumerate(OPT_SHAPES)]
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
        if kw is None:
            opt = cls([{"params": [ps[0]], "lr": 1e-2}, {"params": [ps[1]], "lr": 1e-3, "weight_decay": 0.1}], lr=5e-3)
        else:
            opt = cls(ps, **kw)
        traj = []
        for step in range(100):
            for k, p in enumerate(ps):
                # gradient = hash noise + a pull towards zero, so the run is not pure noise
                g = hvals(10000 + 7 * step + k, p.numel()).reshape(p.shape)
                p.grad = torch.from_numpy(g) + 0.5 * p.detach()
                p.grad = p.grad.contiguous()
            opt.step()
            traj.append(np.concatenate([p.detach().numpy().ravel() for p in ps]))
        save(f"optim.{name}.traj", np.stack(traj))


# ---- schedulers: 100 steps -------------------------------------------------------------------

def scheduler_cases():
    import torch
    from torch.optim import lr_scheduler as S

    def run(name, make, kind="sgd", metric=None):
        p = torch.zeros(2, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.1, momentum=0.9) if kind == "sgd" else torch.optim.Adam([p], lr=0.01)
        sch = make(opt)
        lrs, moms = [opt.param_groups[0]["lr"]], []
        key = "momentum" if kind == "sgd" else "betas"
        mom = lambda: opt.param_groups[0][key] if kind == "sgd" else opt.param_groups[0][key][0]
        moms.append(mom())
        for step in range(100):
            opt.step()
            if metric is not None:
                sch.step(metric(step))
            else:
                sch.step()
            lrs.append(opt.param_groups[0]["lr"])
            moms.append(mom())
        save(f"sched.{name}.lr", np.array(lrs, dtype=np.float64))
        save(f"sched.{name}.mom", np.array(moms, dtype=np.float64))

    import warnings
    warnings.simplefilter("ignore")
    run("step", lambda o: S.StepLR(o, 7, gamma=0.5))
    run("multistep", lambda o: S.MultiStepLR(o, [10, 30, 30, 60], gamma=0.3))
    run("exponential", lambda o: S.ExponentialLR(o, 0.97))
    run("cosine", lambda o: S.CosineAnnealingLR(o, 30, eta_min=0.001))
    run("linear", lambda o: S.LinearLR(o, 0.25, 1.0, 10))
    run("sequential", lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, 1.0, 10), S.CosineAnnealingLR(o, 90)], [10]))
    run("onecycle", lambda o: S.OneCycleLR(o, 1.0, total_steps=100))
    run("onecycle_adam3", lambda o: S.OneCycleLR(o, 0.01, total_steps=101, three_phase=True, anneal_strategy="linear"),
        kind="adam")
    run("plateau", lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=3, cooldown=2, min_lr=1e-3),
        metric=lambda s: 1.0 / (1 + s) if s < 20 else 0.05 + 0.001 * ((s * 7) % 5))


# ---- training runs ----------------------------------------------------------------------------

TRAIN_RUNS = {
    # name: model, kwargs, batch, steps, optimizer, opt kwargs
    "autoencoder_small": ("autoencoder", dict(input_dim=64, hidden=(32, 16), latent_dim=8), 8, 50, "adam", dict(lr=1e-3)),
    "autoencoder_sigmoid": ("autoencoder", dict(input_dim=64, hidden=(32,), latent_dim=8, final_activation="sigmoid"), 8,
                            50, "sgd", dict(lr=0.5, momentum=0.9)),
    "autoencoder_default": ("autoencoder", dict(), 4, 50, "adam", dict(lr=1e-3)),
    "mlp_small": ("mlp", dict(input_dim=64, hidden=(32, 16), num_classes=10), 8, 50, "sgd", dict(lr=0.1, momentum=0.9)),
    "mlp_default": ("mlp", dict(), 4, 50, "adamw", dict(lr=1e-3)),
    "cnn_small": ("cnn", dict(image_size=8, channels=(4, 8), hidden=16), 4, 20, "adam", dict(lr=1e-3)),
}


def train_runs():
    import torch
    for name, (model, kw, batch, steps, okind, okw) in TRAIN_RUNS.items():
        m = make_model(model, **kw)
        set_hash_weights(m, 500)
        m.train()
        cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[okind]
        opt = cls(m.parameters(), **okw)
        in_dim = kw.get("input_dim", 784) if model != "cnn" else kw.get("in_channels", 1) * kw["image_size"] ** 2
        losses = []
        for step in range(steps):
            x = torch.from_numpy(hvals(7000 + step, batch * in_dim, 0.0, 1.0).reshape(batch, in_dim))
            out = m(x)
            if model == "autoencoder":
                loss = torch.nn.functional.mse_loss(out, x)
            else:
                y = torch.from_numpy(hlabels(8000 + step, batch, kw.get("num_classes", 10)))
                loss = torch.nn.functional.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        save(f"train.{name}.loss", np.array(losses, dtype=np.float64))


def main():
    import torch
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".npy"):
            os.remove(os.path.join(OUT, f))
    layer_cases()
    optimizer_cases()
    scheduler_cases()
    train_runs()
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, to {os.path.normpath(OUT)} (torch {torch.__version__})")


if __name__ == "__main__":
    sys.exit(main())

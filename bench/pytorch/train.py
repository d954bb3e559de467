#!/usr/bin/python3
"""PyTorch reference for bench/compare: lockstep's built-in models (autoencoder,
mlp, cnn) trained the way a PyTorch user normally writes it — a DataLoader
over a TensorDataset with a DistributedSampler, DistributedDataParallel on
the gloo backend, ranks started by torch.multiprocessing.spawn, Adam (lr 1e-3)
in fp32, torch.set_num_threads(cores // world). One rank runs in the launching
process with neither DDP nor a sampler, as a user would.

--precision bf16-mixed runs the forward pass and the loss under
torch.autocast("cpu", dtype=torch.bfloat16) and the backward pass and Adam
outside it, as PyTorch's AMP documentation writes it: the parameters, their
gradients and Adam's state stay f32 (what lockstep's trainer.precision
bf16-mixed does too). PyTorch 1.13's CPU autocast takes only bfloat16, so
16-mixed is refused rather than silently run in f32.

It prints one JSON line: steady-state samples/s (the first --warmup optimizer
steps skipped, then --steps timed, samples = timed steps x batch x world),
the time from launch to the first optimizer step, peak RSS per rank, the
mean step-time split, the precision and the dtypes autocast produced. "Launch"
is --t0 (a time.time() the caller takes just before starting this
interpreter) or, without it, the first line of this file, so the figure
includes the interpreter start and `import torch`.

--accelerator gpu (PyTorch with CUDA: the GPU machine's 2.11) puts rank r
on cuda:r: the dataset stays in host memory, the DataLoader pins it and each
batch is copied with non_blocking=True; DDP runs on NCCL; autocast is
torch.autocast("cuda", ...), which takes float16 too, so 16-mixed runs there
with torch's GradScaler. The timed window opens and closes on
torch.cuda.synchronize(); the per-phase split is host time (kernel launches
are asynchronous), so only samples/s compares with the GPU.

Shapes follow src/models/models.c: autoencoder 784-512-256-64 encoder (ReLU
between, none after the code) mirrored by the decoder, MSE on the input;
mlp 784-256-128-10 with ReLU, cross-entropy; cnn conv3x3(1->32, pad 1)+BN+ReLU
+maxpool2, conv3x3(32->64, pad 1)+BN+ReLU+maxpool2, Linear(3136->128)+ReLU,
Linear(128->10), cross-entropy. Parameters keep PyTorch's default init,
which lockstep's reset_parameters reproduces."""
import time

T_START = time.time()  # before any heavy import: launch time when --t0 is absent

import argparse
import gzip
import json
import os
import resource
import socket
import sys
import tempfile


PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")
GPU_PRECISIONS = PRECISIONS + ("16-mixed", "16-true")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["autoencoder", "mlp", "cnn", "resnet", "gpt"], default="autoencoder")
    p.add_argument("--gpt", default="4,4,128,64,256", metavar="L,H,C,T,V",
                   help="gpt: n_layer, n_head, n_embd, block_size, vocab_size (default 4,4,128,64,256; "
                        "GPT-2 124M: 12,12,768,1024,50304); a sample is one window of block_size tokens")
    p.add_argument("--batch-size", type=int, default=64, help="per-rank batch (default 64)")
    p.add_argument("--world-size", type=int, default=1, help="ranks (default 1)")
    p.add_argument("--steps", type=int, default=60,
                   help="optimizer steps in all, warm-up included (default 60)")
    p.add_argument("--warmup", type=int, default=5,
                   help="steps left out of the throughput (default 5, like lockstep's run.json; at least 1)")
    p.add_argument("--data", choices=["synthetic", "fashion_mnist"], default="synthetic")
    p.add_argument("--data-root", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--num-samples", type=int, default=8192,
                   help="synthetic training samples held in memory (default 8192; epochs repeat as needed)")
    p.add_argument("--num-workers", type=int, default=0,
                   help="DataLoader worker processes (default 0: the usual choice for an in-memory TensorDataset)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (default: cores // world)")
    p.add_argument("--no-blas-env", action="store_true",
                   help="do not set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS to the threads per rank, nor OMP_WAIT_POLICY=PASSIVE")
    p.add_argument("--precision", default="32-true", metavar="{32-true,bf16-mixed,bf16-true}",
                   help="32-true (default); bf16-mixed: forward and loss under CPU autocast to bfloat16; "
                        "bf16-true: the model and the inputs in bfloat16 (Lightning's module.to(torch.bfloat16))")
    p.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu",
                   help="cpu (default) or gpu: rank r on cuda:r, NCCL between ranks (needs PyTorch with CUDA)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--t0", type=float, default=0.0,
                   help="launch timestamp (time.time()) taken by the caller before starting this process")
    a = p.parse_args()
    # Lightning's short names mean the same thing; normalised so the output names one spelling.
    a.precision = {"32": "32-true", "bf16": "bf16-mixed", "16": "16-mixed"}.get(a.precision, a.precision)
    if a.accelerator == "gpu":
        import torch
        if not torch.cuda.is_available() or torch.cuda.device_count() < a.world_size:
            p.error(f"--accelerator gpu: {a.world_size} rank(s) need as many GPUs; this PyTorch "
                    f"({torch.__version__}) sees {torch.cuda.device_count() if torch.cuda.is_available() else 0}")
        if a.precision not in GPU_PRECISIONS:
            p.error(f"--precision {a.precision}: expected one of {', '.join(GPU_PRECISIONS)}")
    elif a.precision == "16-mixed":
        p.error(f"--precision {a.precision}: PyTorch 1.13's CPU autocast supports only torch.bfloat16 (float16 "
                "would be disabled with a warning and the run would be f32); use bf16-mixed or 32-true")
    elif a.precision not in PRECISIONS:
        p.error(f"--precision {a.precision}: expected one of {', '.join(PRECISIONS)}")
    for name in ("batch_size", "world_size", "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} = {getattr(a, name)}: expected a positive integer")
    if not 1 <= a.warmup < a.steps:
        p.error(f"--warmup = {a.warmup}: expected 1 <= warmup < steps ({a.steps}); the first step pays one-off costs")
    if a.num_samples < a.batch_size * a.world_size:
        p.error(f"--num-samples = {a.num_samples}: expected at least batch x world = {a.batch_size * a.world_size}")
    try:
        a.gpt = [int(v) for v in a.gpt.split(",")]
        assert len(a.gpt) == 5 and min(a.gpt) >= 1 and a.gpt[2] % a.gpt[1] == 0
    except (ValueError, AssertionError):
        p.error(f"--gpt {a.gpt}: expected n_layer,n_head,n_embd,block_size,vocab_size (positive, n_embd divisible "
                "by n_head)")
    cores = os.cpu_count() or 1
    if a.threads <= 0:
        a.threads = max(1, cores // a.world_size)
    if a.t0 <= 0:
        a.t0 = T_START
    return a


ARGS = parse_args()
if not ARGS.no_blas_env:
    # Read by libgomp / OpenBLAS when torch loads (here and in the spawned
    # ranks, which inherit the environment): one rank's BLAS must not spread
    # over the other ranks' cores. torchrun sets OMP_NUM_THREADS the same way.
    os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)
    # libgomp's workers spin after each parallel region by default; next to
    # OpenBLAS's own threads on a 2-core machine that also runs anything else,
    # a 2-thread rank then collapses (measured: 160-660 samples/s instead of
    # 5,000-6,000 on the autoencoder at batch 64). Passive waiting keeps the
    # reference strong on a shared machine; an explicit setting is kept.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


class Autoencoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                     nn.Linear(256, 64))
        self.decoder = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 512), nn.ReLU(),
                                     nn.Linear(512, 784))

    def forward(self, x):
        return self.decoder(self.encoder(x.flatten(1)))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                                    nn.Linear(128, 10))

    def forward(self, x):
        return self.layers(x.flatten(1))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock (conv-BN-ReLU-conv-BN + shortcut, ReLU)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet20(nn.Module):
    """The CIFAR ResNet-20 of width 8 on 1-channel 28x28 images: lockstep's
    `resnet` with depth 20, width 8, in_channels 1 (3x3 stem, no max-pool,
    3 stages of 3 basic blocks, 8/16/32 channels, global average pool, fc)."""

    def __init__(self, width=8, blocks=3):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        layers, cin = [], width
        for s in range(3):
            cout = width << s
            for b in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if s and not b else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, 10)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention as a PyTorch 1.13 user writes it (no
    scaled_dot_product_attention in 1.13): the explicit masked softmax."""

    def __init__(self, c, h, t):
        super().__init__()
        self.h = h
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
        att = F.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, c, h, t):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.attn = CausalSelfAttention(c, h, t)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT (dropout 0, bias on): token + position embeddings,
    pre-LayerNorm blocks, final LayerNorm, lm_head tied to wte."""

    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight
        for name, p in self.named_parameters():  # GPT-2's initialisation, as nanoGPT and lockstep's gpt
            if p.dim() == 2:
                std = 0.02 / (2 * n_layer) ** 0.5 if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight") else 0.02
                torch.nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)

    def forward(self, idx):
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(torch.arange(idx.size(1), device=idx.device))
        for blk in tr.h:
            x = blk(x)
        return self.lm_head(tr.ln_f(x))


MODELS = {"autoencoder": Autoencoder, "mlp": MLP, "cnn": CNN, "resnet": ResNet20}


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def make_dataset(a):
    """Inputs shaped [784] (autoencoder, mlp) or [1, 28, 28] (cnn), labels int64;
    gpt: windows of block_size random tokens and the same shifted by one."""
    if a.model == "gpt":
        t, v = a.gpt[3], a.gpt[4]
        g = torch.Generator().manual_seed(a.seed)
        stream = torch.randint(0, v, (a.num_samples * t + 1,), generator=g)
        x = stream[:-1].view(a.num_samples, t).clone()
        y = stream[1:].view(a.num_samples, t).clone()
        return TensorDataset(x, y), x.numel() * x.element_size() + y.numel() * y.element_size()
    shape = (1, 28, 28) if a.model in ("cnn", "resnet") else (784,)
    if a.data == "fashion_mnist":
        try:
            x = load_idx(os.path.join(a.data_root, "train-images-idx3-ubyte.gz"))
            y = load_idx(os.path.join(a.data_root, "train-labels-idx1-ubyte.gz"))
        except OSError as e:
            sys.exit(f"bench/pytorch/train.py: cannot read Fashion-MNIST in {a.data_root}: {e} "
                     "(install dataset-fashion-mnist or pass --data-root)")
        # lockstep's fashion_mnist data module trains on the first 55,000 (5,000 held out for validation)
        x = torch.from_numpy(x[:55000].astype(np.float32) / 255.0).reshape(-1, *shape)
        y = torch.from_numpy(y[:55000].astype(np.int64))
    else:
        # Like lockstep's synthetic classification data: one of 10 N(0, 1)
        # class centres plus N(0, 0.1^2) noise per feature.
        g = torch.Generator().manual_seed(a.seed)
        centres = torch.randn(10, 784, generator=g)
        y = torch.randint(0, 10, (a.num_samples,), generator=g)
        x = (centres[y] + 0.1 * torch.randn(a.num_samples, 784, generator=g)).reshape(-1, *shape)
    return TensorDataset(x, y), x.numel() * x.element_size() + y.numel() * y.element_size()


def train(rank, a, out_dir):
    world = a.world_size
    torch.set_num_threads(a.threads)
    gpu = a.accelerator == "gpu"
    dev = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(dev)
    if world > 1:
        dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
    torch.manual_seed(a.seed)
    dataset, dataset_bytes = make_dataset(a)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=a.seed,
                                 drop_last=True) if world > 1 else None
    loader = DataLoader(dataset, batch_size=a.batch_size, shuffle=sampler is None, sampler=sampler,
                        drop_last=True, num_workers=a.num_workers, pin_memory=gpu)
    model = (GPT(*a.gpt) if a.model == "gpt" else MODELS[a.model]()).to(dev)
    true16 = a.precision in ("bf16-true", "16-true")
    low = torch.float16 if a.precision.startswith("16") else torch.bfloat16
    if true16:  # parameters, gradients and Adam's state in 16 bits, as Lightning's HalfPrecision plugin
        model = model.to(low)
    if world > 1:
        model = DDP(model, device_ids=[rank] if gpu else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    # A disabled autocast context costs nothing measurable and keeps one loop for both precisions.
    mixed = a.precision in ("bf16-mixed", "16-mixed")
    scaler = torch.cuda.amp.GradScaler() if a.precision == "16-mixed" else None
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    out_dtype = None

    step = 0
    epoch = 0
    t_first = t_steady = t_end = None
    split = [0.0] * 4  # data, forward, backward (all-reduce included: DDP overlaps it), optimizer
    steady_split = None
    while step < a.steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        for x, y in loader:
            if gpu:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            t1 = time.perf_counter()
            if true16:
                x = x.to(low)
            with torch.autocast(dev.type, dtype=low, enabled=mixed):
                out = model(x)
                if a.model == "gpt":
                    loss = F.cross_entropy(out.flatten(0, 1), y.flatten())
                elif a.model != "autoencoder":
                    loss = F.cross_entropy(out, y)
                elif true16 and not gpu:  # torch 1.13 has no CPU bf16 mse_loss kernel: its formula, on the bf16 tensors
                    loss = ((out - x.flatten(1)) ** 2).mean()
                else:
                    loss = F.mse_loss(out, x.flatten(1))
            out_dtype = out.dtype
            t2 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            (scaler.scale(loss) if scaler else loss).backward()
            t3 = time.perf_counter()
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if step + 1 in (a.warmup, a.steps):
                sync()  # the timed window opens and closes with the GPU idle
            t4 = time.perf_counter()
            step += 1
            split[0] += t1 - t0
            split[1] += t2 - t1
            split[2] += t3 - t2
            split[3] += t4 - t3
            if step == 1:
                t_first = time.time()
            if step == a.warmup:
                t_steady = t4
                steady_split = list(split)
            if step == a.steps:
                t_end = t4
                break
            t0 = time.perf_counter()
        epoch += 1
    timed = a.steps - a.warmup
    res = {
        "rank": rank,
        "samples_per_s": timed * a.batch_size * world / (t_end - t_steady),
        "tokens_per_s": timed * a.batch_size * world * a.gpt[3] / (t_end - t_steady) if a.model == "gpt" else None,
        "launch_to_first_step_s": t_first - a.t0,
        "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "dataset_mb": dataset_bytes / 2**20,
        "step_time_ms": {k: 1e3 * (split[i] - steady_split[i]) / timed
                         for i, k in enumerate(["data_ms", "forward_ms", "backward_ms", "optimizer_ms"])},
        "final_loss": float(loss),
        "output_dtype": str(out_dtype).replace("torch.", ""),
        "grad_dtype": str(next(model.parameters()).grad.dtype).replace("torch.", ""),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    if world > 1:
        dist.destroy_process_group()


def cpu_capability():
    """The kernels PyTorch dispatches to here ("CPU capability usage: AVX2" in its build report)."""
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return None


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    a = ARGS
    with tempfile.TemporaryDirectory(prefix="lk-pytorch-") as out_dir:
        if a.world_size == 1:
            train(0, a, out_dir)
        else:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(free_port())
            mp.spawn(train, args=(a, out_dir), nprocs=a.world_size, join=True)
        ranks = []
        for r in range(a.world_size):
            with open(os.path.join(out_dir, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    r0 = ranks[0]
    print(json.dumps({
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "model": a.model,
        "world_size": a.world_size,
        "batch_size": a.batch_size,
        "threads_per_rank": a.threads,
        "accelerator": a.accelerator,
        "gpu": torch.cuda.get_device_name(0) if a.accelerator == "gpu" else None,
        "steps": a.steps,
        "warmup": a.warmup,
        "data": a.data,
        "precision": a.precision,
        # What autocast really did: bfloat16 model outputs, f32 gradients (the master weights' dtype).
        "output_dtype": r0["output_dtype"],
        "grad_dtype": r0["grad_dtype"],
        "torch_cpu_capability": cpu_capability(),
        "samples_per_s": r0["samples_per_s"],
        "tokens_per_s": r0["tokens_per_s"],
        "gpt": a.gpt if a.model == "gpt" else None,
        "launch_to_first_step_s": r0["launch_to_first_step_s"],
        "peak_rss_kb_per_rank": [r["peak_rss_kb"] for r in ranks],
        "dataset_mb_per_rank": r0["dataset_mb"],
        "step_time_ms": r0["step_time_ms"],
        "final_loss": r0["final_loss"],
    }))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Writes the PyTorch parity fixtures of the resnet model into
tests/fixtures/resnet/ (run with Debian's python3-torch:
/usr/bin/python3 tools/gen_resnet_fixtures.py; tests/models/test_resnet.c
reads them).

The reference is torchvision's ResNet (models/resnet.py: BasicBlock,
Bottleneck with the stride on the 3x3, 1x1-conv + BatchNorm downsample,
kaiming_normal fan_out init) written out in plain torch.nn with the same
module names (torchvision is not installed here), with the small stem
(conv1 3x3 stride 1, no max-pool). Everything in training mode.

Files (float32 unless said), for each case P:
  P.x, P.dy             the input (and for the blocks the output gradient)
  P.w.<name>            every state-dict entry after the init
                        (torch.manual_seed per case)
  P.y                   the output (blocks) / logits (net)
  P.dx                  blocks: the input's gradient
  P.g.<name>            the gradient of every named parameter
  net.loss              f64 [1]: cross-entropy of the logits against net.y_labels (i64)
  net.sgd.loss          f64 [5]: the loss before each of 5 SGD steps (lr
                        0.1, momentum 0.9, weight decay 5e-4)
  net.sgd.s.<name>      every state-dict entry after those 5 steps
                        (parameters and running statistics)
Cases: basic (a stride-2 BasicBlock 4 -> 8 with its downsample, the
resnet's layer2.0 at depth 20, width 4), bottleneck (a stride-2 Bottleneck
8 -> 4 -> 16 with its downsample: layer2.0 of depth 50, width 2), net (a
CIFAR ResNet-20 of width 4 on 1 x 8 x 8 images, 10 classes, batch 4).
"""
import os
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "resnet")


def modules():
    import torch.nn as nn

    def conv3x3(i, o, s=1):
        return nn.Conv2d(i, o, 3, stride=s, padding=1, bias=False)

    def conv1x1(i, o, s=1):
        return nn.Conv2d(i, o, 1, stride=s, bias=False)

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv3x3(inplanes, planes, stride)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = conv3x3(planes, planes)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            idt = self.downsample(x) if self.downsample is not None else x
            return self.relu(out + idt)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv1x1(inplanes, planes)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = conv3x3(planes, planes, stride)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = conv1x1(planes, planes * 4)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            idt = self.downsample(x) if self.downsample is not None else x
            return self.relu(out + idt)

    def make_block(cls, inplanes, planes, stride):
        ds = None
        if stride != 1 or inplanes != planes * cls.expansion:
            ds = nn.Sequential(conv1x1(inplanes, planes * cls.expansion, stride), nn.BatchNorm2d(planes * cls.expansion))
        return cls(inplanes, planes, stride, ds)

    class ResNet(nn.Module):
        """torchvision's ResNet with the small stem; `layers` per stage."""

        def __init__(self, block, layers, width, in_channels, num_classes):
            super().__init__()
            self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU(inplace=True)
            inplanes = width
            for s, n in enumerate(layers):
                planes = width << s
                blocks = []
                for b in range(n):
                    blocks.append(make_block(block, inplanes, planes, 2 if (b == 0 and s > 0) else 1))
                    inplanes = planes * block.expansion
                setattr(self, "layer%d" % (s + 1), nn.Sequential(*blocks))
            self.n_stages = len(layers)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(inplanes, num_classes)
            init(self)

        def forward(self, x):
            x = self.relu(self.bn1(self.conv1(x)))
            for s in range(self.n_stages):
                x = getattr(self, "layer%d" % (s + 1))(x)
            return self.fc(self.avgpool(x).flatten(1))

    def init(m):
        # torchvision's: conv kaiming_normal fan_out relu, BN 1 / 0
        for mod in m.modules():
            if isinstance(mod, nn.Conv2d):
                nn.init.kaiming_normal_(mod.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(mod, nn.BatchNorm2d):
                nn.init.constant_(mod.weight, 1)
                nn.init.constant_(mod.bias, 0)

    return BasicBlock, Bottleneck, make_block, ResNet, init


def save(name, arr):
    np.save(os.path.join(OUT, name + ".npy"), np.ascontiguousarray(arr), allow_pickle=False)


def state(prefix, m):
    for name, t in m.state_dict().items():
        a = t.numpy()
        save(prefix + name, a if a.dtype == np.int64 else a.astype(np.float32))


def block_case(tag, cls, make_block, init, inplanes, planes, x_shape, seed):
    import torch
    torch.manual_seed(seed)
    blk = make_block(cls, inplanes, planes, 2)
    init(blk)
    # non-trivial affine parameters, so their gradients see every path
    with torch.no_grad():
        for mod in blk.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    state(tag + ".w.", blk)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(*x_shape, generator=g).requires_grad_(True)
    y = blk(x)
    dy = torch.randn(*y.shape, generator=g)
    y.backward(dy)
    save(tag + ".x", x.detach().numpy())
    save(tag + ".dy", dy.numpy())
    save(tag + ".y", y.detach().numpy())
    save(tag + ".dx", x.grad.numpy())
    for name, p in blk.named_parameters():
        save(tag + ".g." + name, p.grad.numpy())


def main():
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".npy"):
            os.remove(os.path.join(OUT, f))
    BasicBlock, Bottleneck, make_block, ResNet, init = modules()
    block_case("basic", BasicBlock, make_block, init, 4, 8, (2, 4, 6, 6), 11)
    block_case("bottleneck", Bottleneck, make_block, init, 8, 4, (2, 8, 6, 6), 12)

    torch.manual_seed(13)
    net = ResNet(BasicBlock, [3, 3, 3], 4, 1, 10)
    start = {k: v.clone() for k, v in net.state_dict().items()}
    state("net.w.", net)
    g = torch.Generator().manual_seed(14)
    x = torch.randn(4, 1, 8, 8, generator=g)
    labels = torch.randint(0, 10, (4,), generator=g)
    save("net.x", x.numpy())
    save("net.labels", labels.numpy())
    logits = net(x)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    save("net.y", logits.detach().numpy())
    save("net.loss", np.array([loss.item()], dtype=np.float64))
    for name, p in net.named_parameters():
        save("net.g." + name, p.grad.numpy())

    # 5 SGD steps from the initial state: parameters and running statistics
    net.load_state_dict(start)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    losses = []
    for step in range(5):
        xs = torch.randn(4, 1, 8, 8, generator=g) if step else x
        opt.zero_grad()
        loss = F.cross_entropy(net(xs), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        save("net.sgd.x%d" % step, xs.numpy())
    save("net.sgd.loss", np.array(losses, dtype=np.float64))
    state("net.sgd.s.", net)
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, to {os.path.normpath(OUT)} (torch {torch.__version__})")


if __name__ == "__main__":
    sys.exit(main())

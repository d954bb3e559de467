#!/usr/bin/python3
"""PyTorch 1.13 reference values for tests/autograd/test_attention.c's
pytorch_values case: causal self-attention on GPT-2's packed qkv written out
as softmax(Q K^T / sqrt(d) + causal mask) V (1.13 has no
scaled_dot_product_attention). qkv[i] = sin(0.37 i) of shape [2, 5, 24],
2 heads of 4; L = sum(y * qkv.flatten()[:B T C].view(B, T, C)). Prints y's
first 8 values and sum(dL/dqkv * (i % 7)), the numbers the test holds."""
import math

import torch

B, T, C, H = 2, 5, 8, 2
x = torch.tensor([math.sin(i * 0.37) for i in range(B * T * 3 * C)], dtype=torch.float32)
qkv = x.view(B, T, 3 * C).clone().requires_grad_()
q, k, v = (z.view(B, T, H, C // H).transpose(1, 2) for z in qkv.split(C, dim=2))
att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf")).softmax(-1)
y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
(y * x[:B * T * C].view(B, T, C)).sum().backward()
print("y[:8]", " ".join("%.6f" % t for t in y.flatten()[:8].tolist()))
g = qkv.grad.flatten().double()
print("sum(dqkv * (i %% 7)) %.6f" % float((g * torch.arange(g.numel()).remainder(7).double()).sum()))

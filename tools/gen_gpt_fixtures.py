#!/usr/bin/python3
"""Writes the PyTorch parity fixtures of the gpt model into tests/fixtures/gpt/
(run with Debian's python3-torch: /usr/bin/python3 tools/gen_gpt_fixtures.py;
tests/models/test_gpt_parity.c reads them).

The reference is nanoGPT's GPT (model.py) written out in plain torch.nn with
the same module names, so its state dict is lockstep's gpt's, and with the
explicit attention softmax(q k^T / sqrt(d) + causal mask) v (PyTorch 1.13
has no scaled_dot_product_attention). A tiny configuration, dropout 0:
n_layer 2, n_head 2, n_embd 32, block_size 16, vocab 64, batch 2 x 16.

Files (float32 unless said):
  x, y                  i64 [2, 16]: the tokens and the next tokens
  w.<name>              every state-dict entry after GPT-2's initialisation
                        (torch.manual_seed(1337)); lm_head.weight is wte's
  logits                [2, 16, 64]
  loss                  f64 [1]
  g.<name>              the gradient of every named parameter (the tied
                        weight once, as transformer.wte.weight)
  block.x, block.dy     [2, 16, 32]: an input of transformer.h.0 and the
                        gradient its output is given
  block.y, block.dx     that block's output and its input's gradient
  adamw.loss            f64 [10]: the loss before each of 10 AdamW steps on
                        (x, y) with nanoGPT's configure_optimizers groups
                        (weight decay 0.1 on parameters of >= 2 dims, none
                        on biases and LayerNorm weights), lr 1e-3, betas
                        (0.9, 0.95), eps 1e-8
  adamw.p.<name>        every named parameter after the 10 steps
"""
import math
import os
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gpt")
CFG = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, dropout=0.0, bias=True)
B, T = 2, 16


def make_gpt(n_layer, n_head, n_embd, block_size, vocab_size, dropout, bias):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class LayerNorm(nn.Module):
        """nanoGPT's LayerNorm with an optional bias."""

        def __init__(self, ndim, bias):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ndim))
            self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

        def forward(self, x):
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
            self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
            self.attn_dropout = nn.Dropout(dropout)
            self.resid_dropout = nn.Dropout(dropout)

        def forward(self, x):
            Bx, Tx, C = x.size()
            q, k, v = self.c_attn(x).split(n_embd, dim=2)
            k = k.view(Bx, Tx, n_head, C // n_head).transpose(1, 2)
            q = q.view(Bx, Tx, n_head, C // n_head).transpose(1, 2)
            v = v.view(Bx, Tx, n_head, C // n_head).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.tril(torch.ones(Tx, Tx, dtype=torch.bool))
            att = att.masked_fill(~mask, float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = (att @ v).transpose(1, 2).contiguous().view(Bx, Tx, C)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = LayerNorm(n_embd, bias)
            self.attn = CausalSelfAttention()
            self.ln_2 = LayerNorm(n_embd, bias)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab_size, n_embd),
                wpe=nn.Embedding(block_size, n_embd),
                drop=nn.Dropout(dropout),
                h=nn.ModuleList([Block() for _ in range(n_layer)]),
                ln_f=LayerNorm(n_embd, bias),
            ))
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # nanoGPT's tying
            self.apply(self._init_weights)
            for pn, p in self.named_parameters():
                if pn.endswith("c_proj.weight"):
                    torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx, targets):
            t = idx.size(1)
            pos = torch.arange(0, t, dtype=torch.long)
            x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            return logits, loss

    return GPT()


def save(name, arr):
    np.save(os.path.join(OUT, name + ".npy"), np.ascontiguousarray(arr), allow_pickle=False)


def configure_optimizers(model, weight_decay, lr, betas):
    """nanoGPT's groups: parameters of >= 2 dims decay, the others do not."""
    import torch
    params = {pn: p for pn, p in model.named_parameters() if p.requires_grad}
    decay = [p for p in params.values() if p.dim() >= 2]
    nodecay = [p for p in params.values() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8)


def main():
    import torch
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".npy"):
            os.remove(os.path.join(OUT, f))
    torch.manual_seed(1337)
    model = make_gpt(**CFG)
    g = torch.Generator().manual_seed(7)
    stream = torch.randint(0, CFG["vocab_size"], (B, T + 1), generator=g)
    x, y = stream[:, :T].contiguous(), stream[:, 1:].contiguous()
    save("x", x.numpy())
    save("y", y.numpy())
    for name, t in model.state_dict().items():
        save("w." + name, t.numpy().astype(np.float32))

    logits, loss = model(x, y)
    loss.backward()
    save("logits", logits.detach().numpy())
    save("loss", np.array([loss.item()], dtype=np.float64))
    for name, p in model.named_parameters():
        save("g." + name, p.grad.numpy())

    # one block alone: transformer.h.0 on an input of the residual stream's scale
    bx = (torch.randn(B, T, CFG["n_embd"], generator=g) * 0.5).requires_grad_(True)
    dy = torch.randn(B, T, CFG["n_embd"], generator=g)
    by = model.transformer.h[0](bx)
    by.backward(dy)
    save("block.x", bx.detach().numpy())
    save("block.dy", dy.numpy())
    save("block.y", by.detach().numpy())
    save("block.dx", bx.grad.numpy())

    # 10 AdamW steps on (x, y), from the initial weights again
    torch.manual_seed(1337)
    model = make_gpt(**CFG)
    opt = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95))
    losses = []
    for _ in range(10):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    save("adamw.loss", np.array(losses, dtype=np.float64))
    for name, p in model.named_parameters():
        save("adamw.p." + name, p.detach().numpy())
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, to {os.path.normpath(OUT)} (torch {torch.__version__})")


if __name__ == "__main__":
    sys.exit(main())

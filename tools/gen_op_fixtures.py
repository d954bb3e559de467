#!/usr/bin/env python3
"""Writes the PyTorch parity fixtures of every lockstep op to tests/fixtures/ops/.

Run it with Debian's interpreter, which has python3-torch (PyTorch 1.13):

    /usr/bin/python3 tools/gen_op_fixtures.py            # rewrites tests/fixtures/ops
    /usr/bin/python3 tools/gen_op_fixtures.py --out DIR  # elsewhere

For each case it writes, under <out>/<case>/, small C-order .npy files:

    <name>.npy       every input the C test passes to the op (f32; targets and
                     indices i64, one embedding case i32)
    out.npy          the op's output (f32)
    R.npy            a fixed random tensor of out's shape
    grad_<name>.npy  d sum(out * R) / d <name>, for every input PyTorch
                     differentiated; the C test makes exactly those inputs
                     require grad
    <name>_after.npy state the op updates in place (batch_norm running stats)

The op parameters (dims, strides, reductions, ...) are not stored: the C test
(tests/parity/test_parity_ops.c) repeats them in its case of the same name.
Every case seeds its own generator from its name, so adding or editing one
case leaves every other fixture byte-identical. See docs/PARITY.md.
"""

import argparse
import os
import shutil
import sys
import zlib

import numpy as np
import torch
import torch.nn.functional as F

CASES = []


def case(name):
    def register(fn):
        CASES.append((name, fn))
        return fn
    return register


# ---- deterministic inputs -----------------------------------------------------


class Gen:
    """Random inputs for one case, from a generator seeded by the case name."""

    def __init__(self, name):
        self.g = torch.Generator().manual_seed(zlib.crc32(name.encode()))

    def randn(self, *shape):
        return torch.randn(tuple(shape), generator=self.g, dtype=torch.float32)

    def uniform(self, lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(tuple(shape), generator=self.g, dtype=torch.float32)

    def away(self, *shape, gap=0.1):
        """N(0,1) values pushed at least `gap` away from 0 (kinks of relu, abs, ...)."""
        x = self.randn(*shape)
        return x + gap * torch.where(x >= 0, 1.0, -1.0)

    def nonzero(self, *shape):
        """Divisors: |x| in [0.5, 2], random sign."""
        s = torch.where(self.randn(*shape) >= 0, 1.0, -1.0)
        return s * self.uniform(0.5, 2.0, *shape)

    def distinct(self, *shape):
        """A shuffled ramp: every value distinct, neighbours >= 4/n apart (max-pool ties)."""
        n = int(np.prod(shape))
        perm = torch.randperm(n, generator=self.g).to(torch.float32)
        return (perm * (4.0 / n) - 2.0).reshape(*shape)

    def ints(self, lo, hi, *shape):
        return torch.randint(lo, hi, shape, generator=self.g, dtype=torch.int64)


# ---- cases ------------------------------------------------------------------------
# Each returns (inputs, fn, grads): inputs is an ordered dict name -> tensor,
# fn(**inputs) returns the output (or (output, {name: tensor}) for extra state
# to save), grads names the inputs to differentiate.

# linear algebra
@case("matmul_2d")
def _(r):
    return dict(a=r.randn(5, 7), b=r.randn(7, 11)), lambda a, b: a @ b, "a b"


@case("matmul_3d_2d")
def _(r):
    return dict(a=r.randn(2, 5, 13), b=r.randn(13, 7)), lambda a, b: a @ b, "a b"


@case("matmul_batched")
def _(r):
    return dict(a=r.randn(3, 5, 7), b=r.randn(3, 7, 1)), lambda a, b: a @ b, "a b"


@case("matmul_batched_b1")
def _(r):
    return dict(a=r.randn(1, 11, 5), b=r.randn(1, 5, 13)), lambda a, b: a @ b, "a b"


@case("matmul_at")  # a stored [K, M], used as a^T
def _(r):
    return dict(a=r.randn(7, 5), b=r.randn(7, 11)), lambda a, b: a.t() @ b, "a b"


@case("matmul_bt")  # b stored [N, K], used as b^T
def _(r):
    return dict(a=r.randn(5, 13), b=r.randn(11, 13)), lambda a, b: a @ b.t(), "a b"


@case("matmul_at_bt")
def _(r):
    return dict(a=r.randn(13, 5), b=r.randn(7, 13)), lambda a, b: a.t() @ b.t(), "a b"


@case("matmul_outer")  # K = 1
def _(r):
    return dict(a=r.randn(11, 1), b=r.randn(1, 7)), lambda a, b: a @ b, "a b"


@case("matmul_dot")  # M = N = 1
def _(r):
    return dict(a=r.randn(1, 13), b=r.randn(13, 1)), lambda a, b: a @ b, "a b"


def lin(x, w, b=None):
    return F.linear(x, w, b)


@case("matmul_batched_bt")  # b stored [B, N, K], used as b.transpose(1, 2)
def _(r):
    return dict(a=r.randn(3, 5, 7), b=r.randn(3, 11, 7)), lambda a, b: a @ b.transpose(1, 2), "a b"


@case("matmul_batched_at")
def _(r):
    return dict(a=r.randn(3, 7, 5), b=r.randn(3, 7, 11)), lambda a, b: a.transpose(1, 2) @ b, "a b"


@case("matmul_3d_noncontig")  # a stored [5, 2, 7], used as a.transpose(0, 1): rows cannot be folded
def _(r):
    return dict(a=r.randn(5, 2, 7), b=r.randn(7, 3)), lambda a, b: a.transpose(0, 1) @ b, "a b"


@case("linear_bias")
def _(r):
    return dict(x=r.randn(5, 7), w=r.randn(11, 7), b=r.randn(11)), lin, "x w b"


@case("linear_nobias")
def _(r):
    return dict(x=r.randn(13, 7), w=r.randn(5, 7)), lin, "x w"


@case("linear_3d")
def _(r):
    return dict(x=r.randn(2, 5, 7), w=r.randn(3, 7), b=r.randn(3)), lin, "x w b"


@case("linear_1d")
def _(r):
    return dict(x=r.randn(7), w=r.randn(11, 7), b=r.randn(11)), lin, "x w b"


@case("linear_x_only")  # the usual first layer: data needs no grad
def _(r):
    return dict(x=r.randn(5, 13), w=r.randn(7, 13), b=r.randn(7)), lin, "w b"


@case("linear_noncontig_x")  # x stored [in, M], used as x^T
def _(r):
    return dict(x=r.randn(7, 5), w=r.randn(3, 7), b=r.randn(3)), lambda x, w, b: F.linear(x.t(), w, b), "x w b"


# element-wise binary, with broadcasting
def binary(name, op, sa, sb, div=False):
    @case(name)
    def _(r):
        b = r.nonzero(*sb) if div else r.randn(*sb)
        return dict(a=r.randn(*sa), b=b), lambda a, b: op(a, b), "a b"


binary("add_same", torch.add, (5, 7), (5, 7))
binary("add_bcast_row", torch.add, (2, 5, 7), (5, 1))
binary("add_bcast_both", torch.add, (5, 1), (1, 7))
binary("add_bcast_rank", torch.add, (7,), (3, 5, 7))
binary("sub_same", torch.sub, (5, 7), (5, 7))
binary("sub_bcast", torch.sub, (3, 1, 7), (5, 7))
binary("mul_same", torch.mul, (11, 5), (11, 5))
binary("mul_bcast", torch.mul, (2, 1, 5), (7, 1))
binary("mul_bcast_scalar", torch.mul, (5, 7), (1,))
binary("div_same", torch.div, (5, 7), (5, 7), div=True)
binary("div_bcast", torch.div, (5, 7), (7,), div=True)
binary("div_bcast_a", torch.div, (1, 7), (5, 1), div=True)


@case("add_transposed")
def _(r):
    return dict(a=r.randn(7, 5), b=r.randn(5, 7)), lambda a, b: a.t() + b, "a b"


@case("mul_transposed_bcast")
def _(r):
    return dict(a=r.randn(7, 1, 5), b=r.randn(7, 3)), lambda a, b: a.transpose(0, 2) * b.t(), "a b"


@case("add_scalar")
def _(r):
    return dict(x=r.randn(5, 7)), lambda x: x + 0.75, "x"


@case("mul_scalar")
def _(r):
    return dict(x=r.randn(5, 7)), lambda x: x * -1.5, "x"


@case("neg")
def _(r):
    return dict(x=r.randn(3, 1, 7)), torch.neg, "x"


# element-wise unary
def unary(name, fn, make=lambda r: r.randn(5, 13)):
    @case(name)
    def _(r):
        return dict(x=make(r)), lambda x: fn(x), "x"


unary("relu", F.relu, lambda r: r.away(5, 13))
unary("gelu_exact", F.gelu)
unary("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"))
unary("tanh", torch.tanh)
unary("sigmoid", torch.sigmoid)
unary("exp", torch.exp)
unary("log", torch.log, lambda r: r.uniform(0.1, 5.0, 5, 13))
unary("sqrt", torch.sqrt, lambda r: r.uniform(0.1, 5.0, 5, 13))
unary("abs", torch.abs, lambda r: r.away(5, 13))
unary("leaky_relu", lambda x: F.leaky_relu(x, 0.1), lambda r: r.away(5, 13))
unary("elu", lambda x: F.elu(x, 1.0), lambda r: r.away(5, 13))
unary("elu_alpha", lambda x: F.elu(x, 0.7), lambda r: r.away(5, 13))
unary("silu", F.silu)
unary("tanh_3d", torch.tanh, lambda r: r.randn(3, 1, 11))


@case("exp_transposed")
def _(r):
    return dict(x=r.randn(7, 5)), lambda x: torch.exp(x.t()), "x"


# Conventions at the kinks, where PyTorch picks a one-sided derivative:
# relu'(0) = 0, |x|'(0) = 0, leaky_relu'(0) = slope, elu'(0) = alpha.
def with_zeros(r, *shape):
    x = r.away(*shape)
    x.view(-1)[::3] = 0.0
    return x


unary("relu_at_zero", F.relu, lambda r: with_zeros(r, 3, 7))
unary("abs_at_zero", torch.abs, lambda r: with_zeros(r, 3, 7))
unary("leaky_relu_at_zero", lambda x: F.leaky_relu(x, 0.1), lambda r: with_zeros(r, 3, 7))
unary("elu_at_zero", lambda x: F.elu(x, 0.7), lambda r: with_zeros(r, 3, 7))


# reductions
def reduction(name, fn, shape):
    @case(name)
    def _(r):
        return dict(x=r.randn(*shape)), fn, "x"


reduction("sum_all", lambda x: x.sum(), (5, 7, 3))
reduction("sum_dim0", lambda x: x.sum(0), (5, 7))
reduction("sum_dim_last_keep", lambda x: x.sum(-1, keepdim=True), (5, 1, 13))
reduction("sum_dims_0_2", lambda x: x.sum((0, 2)), (5, 3, 7))
reduction("sum_dims_keep", lambda x: x.sum((1, 2), keepdim=True), (3, 5, 7))
reduction("mean_all", lambda x: x.mean(), (5, 11))
reduction("mean_dim1", lambda x: x.mean(1), (5, 7, 3))
reduction("mean_dims_keep", lambda x: x.mean((0, -1), keepdim=True), (5, 3, 7))
reduction("mean_size1_dim", lambda x: x.mean(1), (7, 1, 5))

reduction("sum_transposed", lambda x: x.transpose(0, 2).sum(1), (7, 5, 3))
reduction("mean_sliced", lambda x: x[:, 2:9].mean(0), (5, 11))

# softmax family
reduction("softmax_last", lambda x: F.softmax(x, -1), (5, 13))
reduction("softmax_dim0", lambda x: F.softmax(x, 0), (7, 5))
reduction("softmax_3d_mid", lambda x: F.softmax(x, 1), (3, 7, 5))
reduction("softmax_size1", lambda x: F.softmax(x, 1), (5, 1, 3))
reduction("log_softmax_last", lambda x: F.log_softmax(x, -1), (5, 13))
reduction("log_softmax_dim0", lambda x: F.log_softmax(x, 0), (7, 5))
reduction("log_softmax_3d_mid", lambda x: F.log_softmax(x, 1), (3, 7, 5))


reduction("softmax_transposed", lambda x: F.softmax(x.t(), -1), (7, 5))


@case("log_softmax_large_logits")
def _(r):
    return dict(x=r.randn(5, 7) * 30 + 50), lambda x: F.log_softmax(x, -1), "x"


@case("softmax_large_logits")  # needs the max subtraction
def _(r):
    return dict(x=r.randn(5, 7) * 30 + 50), lambda x: F.softmax(x, -1), "x"


# classification losses
def ce(name, n, c, extra=(), weight=False, ignore=None, **kw):
    @case(name)
    def _(r):
        logits = r.randn(n, c, *extra)
        target = r.ints(0, c, n, *extra)
        if ignore is not None:
            target.view(-1)[::3] = ignore
        inputs = dict(x=logits, target=target)
        if weight:
            inputs["weight"] = r.uniform(0.2, 2.0, c)
        kwargs = dict(kw)
        if ignore is not None:
            kwargs["ignore_index"] = ignore

        def fn(x, target, weight=None):
            return F.cross_entropy(x, target, weight=weight, **kwargs)
        return inputs, fn, "x"


ce("ce_mean", 7, 5)
ce("ce_sum", 7, 5, reduction="sum")
ce("ce_none", 7, 5, reduction="none")
ce("ce_weight", 11, 5, weight=True)
ce("ce_weight_sum", 11, 5, weight=True, reduction="sum")
ce("ce_ignore_default", 7, 5, ignore=-100)
ce("ce_ignore_2", 11, 5, ignore=2)
ce("ce_ignore_none", 7, 5, ignore=-100, reduction="none")
ce("ce_weight_ignore", 13, 5, weight=True, ignore=1)
ce("ce_smooth", 7, 5, label_smoothing=0.1)
ce("ce_smooth_sum", 7, 5, label_smoothing=0.2, reduction="sum")
ce("ce_smooth_none", 7, 5, label_smoothing=0.1, reduction="none")
ce("ce_smooth_weight", 11, 5, weight=True, label_smoothing=0.1)
ce("ce_smooth_ignore", 11, 5, ignore=-100, label_smoothing=0.1)
ce("ce_smooth_weight_ignore", 13, 5, weight=True, ignore=0, label_smoothing=0.15)
ce("ce_ncd", 3, 5, extra=(7,))
ce("ce_ncd_none", 3, 5, extra=(7,), reduction="none")
ce("ce_ncd_weight_smooth", 3, 5, extra=(7,), weight=True, label_smoothing=0.1)
ce("ce_nchw_ignore", 2, 3, extra=(5, 3), ignore=-100)
ce("ce_c1", 5, 1)


def nll(name, n, c, weight=False, ignore=None, **kw):
    @case(name)
    def _(r):
        inputs = dict(x=F.log_softmax(r.randn(n, c), -1), target=r.ints(0, c, n))
        if ignore is not None:
            inputs["target"][::3] = ignore
            kw["ignore_index"] = ignore
        if weight:
            inputs["weight"] = r.uniform(0.2, 2.0, c)

        def fn(x, target, weight=None):
            return F.nll_loss(x, target, weight=weight, **kw)
        return inputs, fn, "x"


nll("nll_mean", 7, 5)
nll("nll_sum", 7, 5, reduction="sum")
nll("nll_none", 7, 5, reduction="none")
nll("nll_weight", 11, 5, weight=True)
nll("nll_weight_ignore", 13, 5, weight=True, ignore=3)


@case("nll_ncd")
def _(r):
    return (dict(x=F.log_softmax(r.randn(3, 5, 7), 1), target=r.ints(0, 5, 3, 7), weight=r.uniform(0.2, 2.0, 5)),
            lambda x, target, weight: F.nll_loss(x, target, weight=weight), "x")


# regression losses (grads for input and target)
def regression(name, fn, shape=(5, 7), kink=None):
    @case(name)
    def _(r):
        x = r.randn(*shape)
        if kink is None:
            y = r.randn(*shape)
        else:  # keep |x - y| away from 0 and from beta
            d = r.uniform(0.1, 0.4, *shape) + torch.where(r.randn(*shape) > 0, kink + 0.1, 0.0)
            y = x - d * torch.where(r.randn(*shape) > 0, 1.0, -1.0)
        return dict(x=x, y=y), fn, "x y"


for red in ("mean", "sum", "none"):
    regression("mse_" + red, lambda x, y, red=red: F.mse_loss(x, y, reduction=red))
    regression("l1_" + red, lambda x, y, red=red: F.l1_loss(x, y, reduction=red), kink=0.0)
    regression("smooth_l1_" + red, lambda x, y, red=red: F.smooth_l1_loss(x, y, reduction=red, beta=1.0), kink=1.0)
regression("smooth_l1_beta05", lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), kink=0.5)
regression("smooth_l1_beta0", lambda x, y: F.smooth_l1_loss(x, y, beta=0.0), kink=0.0)
regression("mse_3d", lambda x, y: F.mse_loss(x, y), shape=(3, 1, 7))


@case("l1_at_zero")  # sign(0) = 0
def _(r):
    x = r.randn(3, 7)
    y = r.randn(3, 7)
    y.view(-1)[::3] = x.view(-1)[::3]
    return dict(x=x, y=y), lambda x, y: F.l1_loss(x, y, reduction="sum"), "x y"


@case("smooth_l1_at_zero")
def _(r):
    x = r.randn(3, 7)
    y = r.randn(3, 7)
    y.view(-1)[::3] = x.view(-1)[::3]
    return dict(x=x, y=y), lambda x, y: F.smooth_l1_loss(x, y, reduction="sum", beta=0.5), "x y"


def bce(name, shape=(5, 7), weight=None, **kw):
    @case(name)
    def _(r):
        inputs = dict(x=r.uniform(0.05, 0.95, *shape), y=r.uniform(0, 1, *shape))
        if weight is not None:
            inputs["weight"] = r.uniform(0.2, 2.0, *weight)

        def fn(x, y, weight=None):
            return F.binary_cross_entropy(x, y, weight=weight, **kw)
        return inputs, fn, "x"


bce("bce_mean")
bce("bce_sum", reduction="sum")
bce("bce_none", reduction="none")
bce("bce_weight", weight=(5, 7))
bce("bce_weight_bcast", weight=(7,), reduction="sum")


def bce_logits(name, shape=(5, 7), weight=None, pos_weight=None, **kw):
    @case(name)
    def _(r):
        inputs = dict(x=r.randn(*shape) * 3, y=r.uniform(0, 1, *shape))
        if weight is not None:
            inputs["weight"] = r.uniform(0.2, 2.0, *weight)
        if pos_weight is not None:
            inputs["pos_weight"] = r.uniform(0.5, 3.0, *pos_weight)

        def fn(x, y, weight=None, pos_weight=None):
            return F.binary_cross_entropy_with_logits(x, y, weight=weight, pos_weight=pos_weight, **kw)
        return inputs, fn, "x"


bce_logits("bcel_mean")
bce_logits("bcel_sum", reduction="sum")
bce_logits("bcel_none", reduction="none")
bce_logits("bcel_weight", weight=(5, 7))
bce_logits("bcel_pos_weight", pos_weight=(7,))
bce_logits("bcel_weight_pos_weight", weight=(7,), pos_weight=(7,), reduction="sum")


@case("bce_hard_targets")
def _(r):  # 0/1 targets
    return dict(x=r.uniform(0.05, 0.95, 11), y=(r.randn(11) > 0).float()), lambda x, y: F.binary_cross_entropy(x, y), "x"



@case("bce_clamp")  # p exactly 0 or 1: PyTorch clamps log() at -100 (and the grad's denominator at 1e-12)
def _(r):
    x = r.uniform(0.05, 0.95, 3, 5)
    x.view(-1)[::4] = 0.0
    x.view(-1)[2::4] = 1.0
    return dict(x=x, y=r.uniform(0, 1, 3, 5)), lambda x, y: F.binary_cross_entropy(x, y, reduction="sum"), "x"


@case("bcel_large_logits")  # log-sum-exp form must not overflow
def _(r):
    return (dict(x=r.randn(5, 7) * 40, y=r.uniform(0, 1, 5, 7)),
            lambda x, y: F.binary_cross_entropy_with_logits(x, y), "x")


# shape ops
@case("concat_dim0")
def _(r):
    return dict(a=r.randn(2, 7), b=r.randn(5, 7), c=r.randn(1, 7)), lambda a, b, c: torch.cat((a, b, c), 0), "a b c"


@case("concat_dim1")
def _(r):
    return dict(a=r.randn(3, 2, 5), b=r.randn(3, 7, 5)), lambda a, b: torch.cat((a, b), 1), "a b"


@case("concat_last_nograd_b")
def _(r):
    return dict(a=r.randn(5, 3), b=r.randn(5, 4)), lambda a, b: torch.cat((a, b), -1), "a"


@case("reshape")
def _(r):
    return dict(x=r.randn(5, 7, 3)), lambda x: x.reshape(7, 15), "x"


@case("reshape_infer")
def _(r):
    return dict(x=r.randn(5, 7, 3)), lambda x: x.reshape(-1, 3, 1), "x"


@case("transpose_2d")
def _(r):
    return dict(x=r.randn(5, 7)), lambda x: x.transpose(0, 1), "x"


@case("transpose_3d")
def _(r):
    return dict(x=r.randn(2, 5, 7)), lambda x: x.transpose(0, 2), "x"


@case("slice_dim1")
def _(r):
    return dict(x=r.randn(5, 7)), lambda x: x[:, 2:6], "x"


@case("slice_dim0_3d")
def _(r):
    return dict(x=r.randn(5, 3, 7)), lambda x: x[1:4], "x"


@case("slice_then_transpose")
def _(r):
    return dict(x=r.randn(5, 11)), lambda x: x[:, 3:10].transpose(0, 1).contiguous(), "x"


@case("flatten")
def _(r):
    return dict(x=r.randn(2, 5, 7)), lambda x: torch.flatten(x, 1, 2), "x"


# layers
@case("layer_norm_affine")
def _(r):
    return (dict(x=r.randn(5, 7) * 2 + 1, w=r.randn(7), b=r.randn(7)),
            lambda x, w, b: F.layer_norm(x, (7,), w, b, 1e-5), "x w b")


@case("layer_norm_2d_affine")
def _(r):
    return (dict(x=r.randn(2, 5, 7), w=r.randn(5, 7), b=r.randn(5, 7)),
            lambda x, w, b: F.layer_norm(x, (5, 7), w, b, 1e-5), "x w b")


@case("layer_norm_plain")
def _(r):
    return dict(x=r.randn(3, 1, 13)), lambda x: F.layer_norm(x, (13,), None, None, 1e-5), "x"


@case("layer_norm_eps")
def _(r):
    return dict(x=r.randn(5, 11) * 0.01, w=r.randn(11)), lambda x, w: F.layer_norm(x, (11,), w, None, 1e-3), "x w"


@case("embedding")
def _(r):
    return dict(w=r.randn(11, 5), idx=r.ints(0, 11, 3, 7)), lambda w, idx: F.embedding(idx, w), "w"


@case("embedding_i32")
def _(r):
    return (dict(w=r.randn(7, 3), idx=r.ints(0, 7, 13).to(torch.int32)),
            lambda w, idx: F.embedding(idx.long(), w), "w")


def conv(name, x, w, b=True, **kw):
    @case(name)
    def _(r):
        inputs = dict(x=r.randn(*x), w=r.randn(*w) * 0.5)
        if b:
            inputs["b"] = r.randn(w[0])

        def fn(x, w, b=None):
            return F.conv2d(x, w, b, **kw)
        return inputs, fn, "x w b" if b else "x w"


conv("conv2d_basic", (2, 3, 7, 5), (4, 3, 3, 3))
conv("conv2d_nobias", (1, 2, 7, 7), (3, 2, 3, 3), b=False)
conv("conv2d_stride2", (2, 3, 7, 7), (2, 3, 3, 3), stride=2)
conv("conv2d_pad1", (1, 3, 5, 7), (4, 3, 3, 3), padding=1)
conv("conv2d_dilation2", (1, 2, 11, 7), (3, 2, 3, 2), dilation=2)
conv("conv2d_groups3", (1, 6, 7, 5), (6, 2, 3, 3), groups=3, padding=1)
conv("conv2d_depthwise", (2, 4, 5, 5), (4, 1, 3, 3), groups=4, padding=1, b=False)
conv("conv2d_rect", (2, 3, 7, 5), (2, 3, 2, 3), stride=(2, 1), padding=(1, 0))
conv("conv2d_all", (2, 4, 11, 7), (6, 2, 3, 3), stride=(2, 1), padding=(2, 1), dilation=(2, 1), groups=2)
conv("conv2d_1x1", (2, 5, 3, 3), (7, 5, 1, 1))


@case("conv2d_noncontig")  # x stored [N, C, W, H], used as x.transpose(2, 3)
def _(r):
    return (dict(x=r.randn(2, 3, 5, 7), w=r.randn(4, 3, 3, 3) * 0.5, b=r.randn(4)),
            lambda x, w, b: F.conv2d(x.transpose(2, 3), w, b, padding=1), "x w b")


def pool(name, op, shape, distinct=False, **kw):
    @case(name)
    def _(r):
        x = r.distinct(*shape) if distinct else r.randn(*shape)
        return dict(x=x), lambda x: op(x, **kw), "x"


pool("max_pool2d_k2", F.max_pool2d, (2, 3, 6, 6), True, kernel_size=2)
pool("max_pool2d_k3s2p1", F.max_pool2d, (1, 3, 7, 7), True, kernel_size=3, stride=2, padding=1)
pool("max_pool2d_ceil", F.max_pool2d, (2, 2, 7, 5), True, kernel_size=2, stride=2, ceil_mode=True)
pool("max_pool2d_rect", F.max_pool2d, (1, 2, 7, 11), True, kernel_size=(3, 2), stride=(2, 3), padding=(1, 1))
pool("max_pool2d_overlap", F.max_pool2d, (1, 3, 5, 5), True, kernel_size=3, stride=1)
pool("max_pool2d_h1", F.max_pool2d, (1, 2, 1, 7), True, kernel_size=(1, 2))
# ties: PyTorch routes the gradient to the first maximum in the window's row-major scan
pool("avg_pool2d_k2", F.avg_pool2d, (2, 3, 6, 6), kernel_size=2)
pool("avg_pool2d_pad_incl", F.avg_pool2d, (1, 3, 7, 7), kernel_size=3, stride=2, padding=1, count_include_pad=True)
pool("avg_pool2d_pad_excl", F.avg_pool2d, (1, 3, 7, 7), kernel_size=3, stride=2, padding=1, count_include_pad=False)
pool("avg_pool2d_ceil", F.avg_pool2d, (2, 2, 7, 5), kernel_size=2, stride=2, ceil_mode=True)
pool("avg_pool2d_ceil_pad", F.avg_pool2d, (1, 2, 7, 7), kernel_size=3, stride=2, padding=1, ceil_mode=True)
pool("avg_pool2d_ceil_pad_excl", F.avg_pool2d, (1, 2, 7, 7), kernel_size=3, stride=2, padding=1, ceil_mode=True,
     count_include_pad=False)
pool("avg_pool2d_rect", F.avg_pool2d, (1, 2, 7, 11), kernel_size=(3, 2), stride=(2, 3), padding=(1, 1))
pool("adaptive_avg_pool2d_3x2", F.adaptive_avg_pool2d, (2, 3, 7, 5), output_size=(3, 2))
pool("adaptive_avg_pool2d_1x1", F.adaptive_avg_pool2d, (2, 5, 7, 5), output_size=(1, 1))
pool("adaptive_avg_pool2d_4x3", F.adaptive_avg_pool2d, (1, 2, 7, 5), output_size=(4, 3))
pool("adaptive_avg_pool2d_same", F.adaptive_avg_pool2d, (1, 2, 5, 3), output_size=(5, 3))
pool("adaptive_avg_pool2d_up", F.adaptive_avg_pool2d, (1, 2, 3, 2), output_size=(5, 3))


# Ties: PyTorch routes the gradient to the first maximum in the window's
# row-major scan. Inputs in {-1, 0, 1} make most windows tie.
@case("max_pool2d_ties")
def _(r):
    return dict(x=r.ints(-1, 2, 1, 2, 6, 6).float()), lambda x: F.max_pool2d(x, 2), "x"


@case("max_pool2d_ties_overlap")
def _(r):
    return dict(x=r.ints(-1, 2, 1, 2, 5, 5).float()), lambda x: F.max_pool2d(x, 3, 1, 1), "x"


def batch_norm(name, shape, training, affine=True, running=True, momentum=0.1, eps=1e-5):
    @case(name)
    def _(r):
        c = shape[1]
        inputs = dict(x=r.randn(*shape) * 1.5 + 0.5)
        if running:
            inputs["running_mean"] = r.randn(c) * 0.1
            inputs["running_var"] = r.uniform(0.5, 1.5, c)
        if affine:
            inputs["w"] = r.uniform(0.5, 1.5, c)
            inputs["b"] = r.randn(c)

        def fn(x, running_mean=None, running_var=None, w=None, b=None):
            rm = running_mean.clone() if running else None
            rv = running_var.clone() if running else None
            out = F.batch_norm(x, rm, rv, w, b, training, momentum, eps)
            if running and training:
                return out, dict(running_mean_after=rm, running_var_after=rv)
            return out
        return inputs, fn, "x w b" if affine else "x"


batch_norm("batch_norm_train_2d", (7, 5), True)
batch_norm("batch_norm_train_4d", (3, 4, 5, 3), True)
batch_norm("batch_norm_train_momentum", (2, 3, 5, 7), True, momentum=0.3, eps=1e-3)
batch_norm("batch_norm_train_noaffine", (5, 3, 2, 2), True, affine=False)
batch_norm("batch_norm_train_nostats", (5, 3, 3, 1), True, running=False)
batch_norm("batch_norm_train_n1", (1, 3, 5, 5), True)
batch_norm("batch_norm_eval_2d", (7, 5), False)
batch_norm("batch_norm_eval_4d", (3, 4, 5, 3), False)


# small graphs: gradients that reach a tensor along several paths, and ops
# composed as a model uses them
@case("graph_reuse")  # x on three paths: tanh(x) * x + x
def _(r):
    return dict(x=r.randn(5, 7)), lambda x: torch.tanh(x) * x + x, "x"


@case("graph_mlp")
def _(r):
    def fn(x, target, w1, b1, w2, b2):
        h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
        return F.cross_entropy(F.linear(h, w2, b2), target, label_smoothing=0.1)
    return (dict(x=r.randn(7, 13), target=r.ints(0, 5, 7), w1=r.randn(11, 13) * 0.3, b1=r.randn(11) * 0.1,
                 w2=r.randn(5, 11) * 0.3, b2=r.randn(5) * 0.1), fn, "x w1 b1 w2 b2")


@case("graph_cnn")
def _(r):
    # no conv bias: batch_norm removes it, so its exact gradient is 0 and
    # PyTorch's is rounding noise (~1e-8) with nothing to compare
    def fn(x, target, cw, running_mean, running_var, bw, bb, lw, lb):
        rm, rv = running_mean.clone(), running_var.clone()
        h = F.conv2d(x, cw, None, padding=1)
        h = F.relu(F.batch_norm(h, rm, rv, bw, bb, True, 0.1, 1e-5))
        h = torch.flatten(F.max_pool2d(h, 2), 1)
        loss = F.cross_entropy(F.linear(h, lw, lb), target)
        return loss, dict(running_mean_after=rm, running_var_after=rv)
    return (dict(x=r.randn(3, 2, 6, 6), target=r.ints(0, 5, 3), cw=r.randn(4, 2, 3, 3) * 0.3,
                 running_mean=torch.zeros(4), running_var=torch.ones(4), bw=r.uniform(0.5, 1.5, 4),
                 bb=r.randn(4) * 0.1, lw=r.randn(5, 36) * 0.2, lb=r.randn(5) * 0.1),
            fn, "x cw bw bb lw lb")


# ---- writing --------------------------------------------------------------------------


def save(path, t):
    a = t.detach().cpu().numpy()
    if a.dtype == np.float64:
        a = a.astype(np.float32)
    assert a.dtype in (np.float32, np.int64, np.int32), (path, a.dtype)
    np.save(path, a.copy(order="C"), allow_pickle=False)  # ascontiguousarray would make 0-d 1-d


def run_case(name, make, out_dir):
    r = Gen(name)
    inputs, fn, grads = make(r)
    grads = grads.split()
    leaves = {}
    for k, v in inputs.items():
        leaf = v.clone()
        if k in grads:
            leaf.requires_grad_(True)
        leaves[k] = leaf
    res = fn(**leaves)
    extra = {}
    if isinstance(res, tuple):
        res, extra = res
    R = r.randn(*res.shape)
    (res * R).sum().backward()
    d = os.path.join(out_dir, name)
    os.makedirs(d)
    for k, v in inputs.items():
        save(os.path.join(d, k + ".npy"), v)
    save(os.path.join(d, "out.npy"), res)
    save(os.path.join(d, "R.npy"), R)
    for k in grads:
        assert leaves[k].grad is not None, (name, k)
        save(os.path.join(d, "grad_" + k + ".npy"), leaves[k].grad)
    for k, v in extra.items():
        save(os.path.join(d, k + ".npy"), v)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "ops"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # one summation order, whatever the machine
    names = [n for n, _ in CASES]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        sys.exit("duplicate case names: %s" % sorted(dup))
    out = os.path.normpath(args.out)
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    for name, make in CASES:
        run_case(name, make, out)
    with open(os.path.join(out, "MANIFEST"), "w") as f:
        f.write("# written by tools/gen_op_fixtures.py; do not edit\n")
        f.write("torch %s\nnumpy %s\ncases %d\n" % (torch.__version__, np.__version__, len(CASES)))
        for n in names:
            f.write(n + "\n")
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(out) for f in fs)
    print("wrote %d cases, %d bytes, to %s" % (len(CASES), total, out))


if __name__ == "__main__":
    main()

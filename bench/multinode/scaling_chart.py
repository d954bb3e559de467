#!/usr/bin/env python3
"""The scaling model's projection as a chart (docs/scaling-projection.svg):
GPT-2-124M's f32 gradient all-reduce per DDP step against the number of
nodes, flat ring over every rank and hierarchical (a ring among the node
leaders), at 10, 100 and 400 Gb/s per link. The same formulas and
assumptions as the table in docs/SCALING.md (alpha 5 us per step, 8 ranks
per node, the intra-node part of the hierarchical form left out), so the
chart and the table agree; --check prints the table's points, --sharded
the FSDP, HYBRID_SHARD and pipeline x ddp rows (no chart).
usage: scaling_chart.py [OUT.svg] [--check] [--sharded]"""
import math, sys

S = 124e6 * 4   # bytes: GPT-2-124M's gradients in f32
ALPHA = 5e-6    # s per ring step (assumed, a typical RDMA network)
G = 8           # ranks per node
RATES = [(10, "#1f77b4"), (100, "#2ca02c"), (400, "#d62728")]  # Gb/s
NODES = [2 ** k for k in range(1, 11)]  # 2 .. 1024


def flat(n, gbps):
    p, b = n * G, gbps * 1e9 / 8
    return 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * S / b


def hier(n, gbps):
    b = gbps * 1e9 / 8
    return 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S / b


# FSDP (FULL_SHARD over every rank): per step an all-gather of the
# parameters in forward, another in backward, a reduce-scatter of the
# gradients, each a flat ring moving (p - 1) / p S per link: 1.5x ddp's
# flat ring in bytes, 1.5x its latency steps.
def fsdp_full(n, gbps):
    p, b = n * G, gbps * 1e9 / 8
    return 3 * ((p - 1) * ALPHA + (p - 1) / p * S / b)


# HYBRID_SHARD: sharded over a node's G ranks (NVLink / shared memory, left
# out as in hier), replicated across nodes: each rank all-reduces its S / G
# shard's gradients with its peers on the other nodes, G such rings share a
# node's link, so the link carries 2 (n - 1) / n S, as hierarchical ddp's.
def hybrid(n, gbps):
    b = gbps * 1e9 / 8
    return 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S / b


# Pipeline x ddp: PIPE consecutive nodes hold one stage each (GPT-2's 12
# blocks, 3 per stage), micro-batches of MB sequences of SEQ tokens cross
# each stage boundary forward (activations) and backward (their gradients),
# f32; the n / PIPE pipelines all-reduce each stage's S / PIPE gradients
# hierarchically. The activation time is per boundary and overlaps across
# boundaries; the bubble (PIPE - 1) / (M + PIPE - 1) is compute, not shown.
PIPE, M, MB, SEQ, D = 4, 8, 1, 1024, 768


def pipe_act(gbps):
    return 2 * M * (ALPHA + MB * SEQ * D * 4 / (gbps * 1e9 / 8))


def pipe_dp(n, gbps):
    r, b = max(1, n // PIPE), gbps * 1e9 / 8
    return 2 * (r - 1) * ALPHA + 2 * (r - 1) / r * S / PIPE / b


def check_sharded():
    for n in (8, 64, 1024):
        for gbps, _ in RATES:
            print("%5d nodes %3d Gb/s: ddp hier %4.0f ms, fsdp %4.0f ms, hybrid %4.0f ms, pipeline x4 %4.0f + %4.1f ms"
                  % (n, gbps, hier(n, gbps) * 1e3, fsdp_full(n, gbps) * 1e3, hybrid(n, gbps) * 1e3,
                     pipe_dp(n, gbps) * 1e3, pipe_act(gbps) * 1e3))


def check():
    for n in (8, 64, 1024):
        for gbps, _ in RATES:
            print("%5d nodes %3d Gb/s: flat %4.0f ms, hier %4.0f ms" % (n, gbps, flat(n, gbps) * 1e3, hier(n, gbps) * 1e3))


def svg(path):
    W, H, L, R, T, B = 760, 440, 70, 200, 40, 50
    x0, x1 = math.log2(NODES[0]), math.log2(NODES[-1])
    y0, y1 = math.log10(5), math.log10(2000)  # ms
    X = lambda n: L + (math.log2(n) - x0) / (x1 - x0) * (W - L - R)
    Y = lambda ms: H - B - (math.log10(ms) - y0) / (y1 - y0) * (H - T - B)
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="22" font-size="14">GPT-2-124M gradient all-reduce per step (496 MB f32), model projection</text>' % L]
    for n in NODES:
        o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (X(n), T, X(n), H - B))
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (X(n), H - B + 16, n))
    for ms in (5, 10, 20, 50, 100, 200, 500, 1000, 2000):
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, Y(ms), W - R, Y(ms)))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%d</text>' % (L - 6, Y(ms) + 4, ms))
    o.append('<text x="%d" y="%d" text-anchor="middle">nodes (8 ranks each)</text>' % ((L + W - R) // 2, H - 12))
    o.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">time per all-reduce (ms, log)</text>'
             % ((T + H - B) // 2, (T + H - B) // 2))
    ly = T + 10
    for gbps, color in RATES:
        for name, f, dash in (("flat ring", flat, ""), ("hierarchical", hier, ' stroke-dasharray="6 4"')):
            pts = " ".join("%.1f,%.1f" % (X(n), Y(f(n, gbps) * 1e3)) for n in NODES)
            o.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>' % (pts, color, dash))
            o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' % (W - R + 12, ly, W - R + 40, ly, color, dash))
            o.append('<text x="%d" y="%d">%d Gb/s %s</text>' % (W - R + 46, ly + 4, gbps, name))
            ly += 20
    o.append('<text x="%d" y="%d" font-size="11" fill="#555">alpha 5 us/step (assumed)</text>' % (W - R + 12, ly + 10))
    o.append('</svg>')
    open(path, "w").write("\n".join(o) + "\n")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--check", "--sharded")]
    if "--check" in sys.argv[1:]:
        check()
    if "--sharded" in sys.argv[1:]:
        check_sharded()
    svg(args[0] if args else "docs/scaling-projection.svg")

#!/usr/bin/env python3
"""Fits T(n) = alpha + n / B_eff to `lockstep bench comm` CSV rows (one file
per shaped rate and backend, rows backend,ranks,bytes,time_us,...), over the
sizes >= 256 KiB, by least squares; prints one row per (file, backend).
usage: alpha_beta.py CSV...  (file names f-<rate>-<worker>.csv)"""
import csv, os, sys

def fit(pts):
    n = len(pts)
    sx = sum(x for x, _ in pts); sy = sum(y for _, y in pts)
    sxx = sum(x * x for x, _ in pts); sxy = sum(x * y for x, y in pts)
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - b * sx) / n, b

print("| rate | backend | alpha (ms) | B_eff (MB/s) | 16 MiB measured (ms) |")
print("|---|---|---|---|---|")
for path in sys.argv[1:]:
    rate = os.path.basename(path).split("-")[1]
    rows = {}
    for r in csv.reader(open(path)):
        if r[0] == "backend": continue
        be = r[0] if r[0] != "MPI_Allreduce" else "MPI_Allreduce (raw, in the %s job)" % os.path.basename(path)[:-4].split("-")[-1]
        rows.setdefault(be, []).append((int(r[2]), float(r[3]) * 1e-6))
    for be, pts in rows.items():
        big = [(x, t) for x, t in pts if x >= 256 << 10]
        if len(big) < 2: continue
        a, b = fit(big)
        t16 = dict(pts).get(16 << 20)
        print("| %s | %s | %.1f | %.1f | %s |" % (rate, be, a * 1e3, 1 / b / 1e6 if b > 0 else float("nan"),
                                                  "%.0f" % (t16 * 1e3) if t16 else "-"))

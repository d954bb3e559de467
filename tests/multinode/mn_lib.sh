# Shared by the multinode tests (test_multinode.sh, test_slurm.sh).
# close FILE_A FILE_B: prints the largest difference between two exports' f32 tensors, relative to each
# tensor's largest value; fails unless they hold the same names and it is <= 1e-4
close() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             d[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__" and v["dtype"] == "F32"}
a, b = load(sys.argv[1]), load(sys.argv[2])
worst = 0.0
for k in a:
    scale = max(1e-6, max(abs(x) for x in a[k]))
    worst = max(worst, max(abs(x - y) for x, y in zip(a[k], b[k])) / scale)
print("%d tensors, largest relative difference %.3g" % (len(a), worst))
sys.exit(0 if a.keys() == b.keys() and worst <= 1e-4 else 1)
PY
}


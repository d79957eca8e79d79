"""NCCL's model (tracekit.model.nccl_tuning) against the measured peak busbw of the fleet's multi-node logs.

Reads ../shared/traces/nccltests_h100_fleet/multi_node/nccl_N10_G{1,2,4,8}.log (10 nodes of 8 × H100,
the machine taken as the dgx-h100 preset: 8 × 400 Gb/s NICs per node, which the logs do not state)
and prints a Markdown table: per log and op, the measured peak out-of-place busbw, the busbw of the
time NCCL's model predicts at the largest size (nccl-tests factors), the pick, and their ratio.

    PYTHONPATH=. python benchmarks/nccl_model_fleet.py [LOG ...]
    PYTHONPATH=. python benchmarks/nccl_model_fleet.py --pairwise   # the 180 node-pair logs, per G and op
"""

import glob
import os
import statistics
import re
import sys

from tracekit.model import busbw_factor
from tracekit.model.machine import machine_preset
from tracekit.model.nccl_tuning import nccl_choice

OPS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather", "reduce_scatter_perf": "reduce_scatter",
       "alltoall_perf": "all_to_all", "sendrecv_perf": "send"}
HERE = os.path.dirname(os.path.abspath(__file__))
FLEET = os.path.join(HERE, "..", "..", "shared", "traces", "nccltests_h100_fleet", "multi_node")


def _rows(path):
    """{op: [(size, out-of-place busbw GB/s)]} from a multi-test nccl-tests log."""
    cur, out = None, {}
    with open(path) as f:
        for line in f:
            m = re.match(r"# Collective test starting: (\S+)", line)
            if m:
                cur = OPS.get(m.group(1))
                if cur:
                    out[cur] = []
                continue
            if cur and re.match(r"\s+\d+\s+\d+\s+\w+", line):
                fields = line.split()
                out[cur].append((int(fields[0]), float(fields[7])))
    return out


def main(paths):
    m = machine_preset("dgx-h100")
    print("| log | op | ranks | measured peak busbw (GB/s) | model busbw at the largest size | NCCL pick | model/measured |")
    print("|---|---|---|---|---|---|---|")
    for p in paths:
        g = int(re.search(r"_G(\d+)", p).group(1))
        n = int(re.search(r"_N(\d+)", p).group(1))
        for op, rows in _rows(p).items():
            size, peak = rows[-1][0], max(r[1] for r in rows)
            c = nccl_choice(op, size, n * g, n, m)
            pred = size / c.time_s * (1.0 if op == "send" else busbw_factor(op, n * g)) / 1e9
            print(f"| {os.path.basename(p)} | {op} | {n * g} | {peak:.1f} | {pred:.1f} | {c.label} | {pred / peak:.2f} |")


def pairwise():
    """Per GPUs per node and op over the node-pair logs: median, min and max measured peak busbw and
    the model's busbw at the largest size."""
    m = machine_preset("dgx-h100")
    peaks: dict = {}
    for p in glob.glob(os.path.join(FLEET, "..", "pairwise", "*.log")):
        g = int(re.search(r"_G(\d+)", p).group(1))
        for op, rows in _rows(p).items():
            peaks.setdefault((g, op, rows[-1][0]), []).append(max(r[1] for r in rows))
    print("| GPUs per node | op | logs | measured peak busbw median (min–max) | model busbw | NCCL pick | model/median |")
    print("|---|---|---|---|---|---|---|")
    for (g, op, size), v in sorted(peaks.items()):
        c = nccl_choice(op, size, 2 * g, 2, m)
        pred = size / c.time_s * (1.0 if op == "send" else busbw_factor(op, 2 * g)) / 1e9
        med = statistics.median(v)
        print(f"| {g} | {op} | {len(v)} | {med:.1f} ({min(v):.1f}–{max(v):.1f}) | {pred:.1f} | {c.label} | {pred / med:.2f} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--pairwise"]:
        pairwise()
        sys.exit(0)
    args = sys.argv[1:] or sorted(glob.glob(os.path.join(FLEET, "*.log")))
    if not args:
        sys.exit(f"no logs: {FLEET} is absent")
    main(args)

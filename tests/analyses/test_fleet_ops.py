"""group_plateau (analyses/fleet.py) for a process group that runs two ops: one busbw curve per op,
each with its own plateau, worked out by hand. Pooling both ops' calls into one curve per group
gave one row whose op was whichever came first from an unordered query (the report's degraded-link
warning named all_reduce on one run and broadcast on the next)."""

from __future__ import annotations

import json

import pytest

from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store

SIZES = [1 << 20, 2 << 20, 4 << 20]
BUSBW = {"allreduce": 10.0, "broadcast": 20.0}  # GB/s, flat: busbw = S / t for both at k = 2
KERNEL = {"allreduce": "AllReduce", "broadcast": "Broadcast"}


def _write(path):
    path.mkdir(parents=True, exist_ok=True)
    evs = {0: [], 1: []}
    t, seq = 1_000_000.0, 0
    for coll in ("allreduce", "broadcast"):
        for size in SIZES:
            dur = size / (BUSBW[coll] * 1e3)  # µs: S / busbw with GB = 1e9
            args = {"Collective name": coll, "In msg nelems": size // 4, "Out msg nelems": size // 4, "dtype": "Float",
                    "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]", "Seq": seq,
                    "device": 0, "stream": 7}
            for r in (0, 1):
                evs[r].append({"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_{KERNEL[coll]}_RING_LL(x)",
                               "pid": 0, "tid": 7, "ts": t, "dur": round(dur, 3), "args": args})
            t += 1000.0
            seq += 1
    for r in (0, 1):
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Handmade GPU"}],
               "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 2}, "traceEvents": evs[r]}
        (path / f"rank{r}.json").write_text(json.dumps(doc))
    return path


def test_one_plateau_per_op_of_a_group(tmp_path):
    st = Store(tmp_path / "s")
    ingest_paths([_write(tmp_path / "t")], st, run_id="two_ops")
    con = analyses.connect(st)
    try:
        rows = con.execute("SELECT op, group_size, sizes, plateau_sizes, plateau_busbw_gbps, peak_busbw_gbps "
                           "FROM group_plateau ORDER BY op").fetchall()
    finally:
        con.close()
    # each op's curve is flat at its own busbw: every size is in the plateau, the plateau is that busbw
    assert rows == [("all_reduce", 2, 3, 3, pytest.approx(10.0, rel=1e-4), pytest.approx(10.0, rel=1e-4)),
                    ("broadcast", 2, 3, 3, pytest.approx(20.0, rel=1e-4), pytest.approx(20.0, rel=1e-4))]

"""The per-op views of analyses/collective_ops.sql (collective_ops, instance_health, calls_by_rank,
unattributed_comm) on a hand-made 2-rank trace whose answers are worked out here, and the report
reading them."""

from __future__ import annotations

import json

import pytest

from tests.conftest import view_rows
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
from tracekit.store import Store

KERNEL = {"allreduce": "AllReduce", "allgather": "AllGather", "broadcast": "Broadcast"}

# (collective, pg, ranks, seq, size_bytes, ranks that recorded it): each 10 µs, every recording rank
# starting at the same time (no wait), 1 ms apart
CALLS = [
    ("allreduce", "0", (0, 1), 0, 4096, (0, 1)),  # complete: busbw 4096 B / 10 µs × 2(2−1)/2
    ("allreduce", "0", (0, 1), 1, 8192, (0,)),  # rank 1 missing: incomplete, busbw 8192 B / 10 µs a lower bound
    ("broadcast", "0", (0, 1), 2, 4096, (0,)),  # incomplete and alone: no wait can be measured
    ("allgather", "1", (0,), 0, 4096, (0,)),  # a 1-rank group only: busbw 0 by definition, no peak
]


def _write(path):
    path.mkdir(parents=True, exist_ok=True)
    evs = {0: [], 1: []}
    for i, (coll, pg, ranks, seq, size, seen) in enumerate(CALLS):
        args = {"Collective name": coll, "In msg nelems": size // 4, "Out msg nelems": size // 4, "dtype": "Float",
                "Group size": len(ranks), "Process Group Name": pg, "Process Group Ranks": str(list(ranks)),
                "Seq": seq, "device": 0, "stream": 7}
        for r in seen:
            evs[r].append({"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_{KERNEL[coll]}_RING_LL(x)", "pid": 0,
                           "tid": 7, "ts": 1_000_000.0 + 1000 * i, "dur": 10.0, "args": args})
    for r in (0, 1):
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Handmade GPU"}],
               "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 2}, "traceEvents": evs[r]}
        (path / f"rank{r}.json").write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collective_ops")
    st = Store(tmp / "s")
    ingest_paths([_write(tmp / "t")], st, run_id="ops")
    return st


def _view(st, sql):
    return view_rows(st, sql, ["ops"])


def test_collective_ops_by_hand(store):
    ops = {r["op"]: r for r in _view(store, "SELECT * FROM collective_ops")}
    assert set(ops) == {"all_reduce", "broadcast", "all_gather"}
    ar, bc, ag = ops["all_reduce"], ops["broadcast"], ops["all_gather"]
    assert (ar["count"], ar["total_bytes"], ar["size_buckets"], ar["min_size_bytes"], ar["max_size_bytes"]) == (
        2, 4096 + 8192, 2, 4096, 8192)
    # the best busbw is the incomplete 8 KiB call's (8192 B / 10 µs; factor 1 at k = 2): a lower bound
    assert ar["peak_busbw_gbps"] == pytest.approx(8192 / 10_000) and ar["peak_busbw_size_bytes"] == 8192
    assert ar["peak_lower_bound"] is True
    # waits: the complete call's two ranks started together (0 each); the incomplete one's is not measured
    assert (ar["total_wait_ns"], ar["incomplete"], ar["disagreeing"]) == (0, 1, 0)
    assert bc["total_wait_ns"] is None and bc["incomplete"] == 1
    assert bc["peak_busbw_gbps"] == pytest.approx(4096 / 10_000) and bc["peak_lower_bound"] is True
    # all_gather only in a 1-rank group: no peak (busbw 0 is the definition, not a measurement)
    assert (ag["count"], ag["peak_busbw_gbps"], ag["peak_busbw_size_bytes"], ag["incomplete"]) == (1, None, None, 0)
    # an unknown device: no cap, nothing over it; every k came from the trace's metadata
    assert all((r["cap_gbps"], r["over_cap"], r["k_world"]) == (None, 0, 0) for r in ops.values())


def test_instance_health_and_calls_by_rank_by_hand(store):
    (h,) = _view(store, "SELECT * EXCLUDE (run_id) FROM instance_health")
    assert h == dict(instances=4, complete=2, incomplete=2, disagreeing=0)
    got = [(r["rank"], r["op"], r["calls"], r["bytes"]) for r in
           _view(store, "SELECT * FROM calls_by_rank ORDER BY rank, op")]
    assert got == [(0, "all_gather", 1, 4096), (0, "all_reduce", 2, 4096 + 8192), (0, "broadcast", 1, 4096),
                   (1, "all_reduce", 1, 4096)]
    assert _view(store, "SELECT * FROM unattributed_comm") == []


def test_report_reads_the_per_op_views(store):
    rep = build_report(store, "ops")
    # ordered by count, then op; the view's columns without run_id
    assert [r["op"] for r in rep["collectives"]] == ["all_reduce", "all_gather", "broadcast"]
    assert rep["collectives"][0]["peak_busbw_size_bytes"] == 8192
    assert rep["instances"] == dict(instances=4, complete=2, incomplete=2, disagreeing=0)
    assert "2 collective instance(s) incomplete" in " ".join(rep["warnings"])
    assert rep["null_reasons"]["collectives.total_wait_ns"].startswith("fewer than two ranks")

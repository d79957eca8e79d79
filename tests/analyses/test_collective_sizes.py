"""The per-size views of analyses/collective_sizes.sql (collective_sizes, collective_peaks,
collective_sizes_by_op) on a hand-made 2-rank trace whose statistics are computed here by hand,
and the report, its JSON and the diff reading them."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.conftest import view_rows, write_two_windows
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
from tracekit.report.diff import diff_runs
from tracekit.store import Store

T0 = 1_000_000.0  # µs
MIB = 1 << 20


def _comm(rank_ts, dur, size, pg, ranks, seq):
    args = {"Collective name": "allreduce", "In msg nelems": size // 4, "Out msg nelems": size // 4,
            "dtype": "Float", "Group size": len(ranks), "Process Group Name": pg,
            "Process Group Ranks": str(list(ranks)), "Seq": seq, "device": 0, "stream": 7}
    return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_RING_LL(x)", "pid": 0, "tid": 7,
            "ts": round(rank_ts, 3), "dur": round(dur, 3), "args": args}


# (pg, ranks, size_bytes, {rank: (start offset µs, duration µs)}): the calls in order, 1 ms apart
CALLS = [
    ("0", (0, 1), 4096, {0: (0, 12), 1: (2, 10)}),  # rank 1 arrives 2 µs late: wait 2 µs, sync 10 µs
    ("0", (0, 1), 4096, {0: (0, 30), 1: (0, 30)}),  # sync 30 µs; a 5 µs compute kernel under rank 0's span
    ("0", (0, 1), 6000, {0: (0, 20), 1: (0, 20)}),  # another size in the 4 KiB bucket: sync 20 µs
    ("0", (0, 1), MIB, {0: (0, 100), 1: (0, 100)}),
    ("0", (0, 1), MIB, {0: (0, 140), 1: (0, 140)}),
    ("1", (0,), 4096, {0: (0, 8)}),  # a 1-rank group: busbw 0 by definition (factor 2(k−1)/k = 0)
]
OVERLAP_CALL, OVERLAP_US = 1, 5


def _write(path, calls=CALLS):
    path.mkdir(parents=True, exist_ok=True)
    evs = {0: [], 1: []}
    seqs: dict = {}
    for i, (pg, ranks, size, per_rank) in enumerate(calls):
        t = T0 + 1000 * i
        seq = seqs[pg] = seqs.get(pg, -1) + 1
        for r, (off, dur) in per_rank.items():
            evs[r].append(_comm(t + off, dur, size, pg, ranks, seq))
        if i == OVERLAP_CALL:
            evs[0].append({"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 9, "ts": t,
                           "dur": OVERLAP_US, "args": {"device": 0, "stream": 9}})
    for r in (0, 1):
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Handmade GPU"}],
               "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 2}, "traceEvents": evs[r]}
        (path / f"rank{r}.json").write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collective_sizes")
    st = Store(tmp / "s")
    ingest_paths([_write(tmp / "t")], st, run_id="hand")
    ingest_paths([_write(tmp / "t2", CALLS[3:4])], st, run_id="one")  # one 1 MiB call of 100 µs
    return st


def _view(st, sql, run_ids=("hand",)):
    return view_rows(st, sql, run_ids)


def _sync_ns(per_rank):
    """DESIGN.md: sync time = median over ranks of end_r − last arrival."""
    last = max(off for off, _ in per_rank.values())
    return statistics.median((off + dur - last) * 1000 for off, dur in per_rank.values())


def test_collective_sizes_by_hand(store):
    rows = _view(store, "SELECT * EXCLUDE (run_id) FROM collective_sizes ORDER BY group_size, bucket_bytes")
    assert [(r["op"], r["group_size"], r["bucket_bytes"], r["count"], r["sizes"]) for r in rows] == [
        ("all_reduce", 1, 4096, 1, 1), ("all_reduce", 2, 4096, 3, 2), ("all_reduce", 2, MIB, 2, 1)]
    one, small, big = rows
    # the 1-rank group: sync 8 µs, busbw 0 by definition: no peak
    assert one["median_sync_time_ns"] == 8000.0 and one["median_busbw_gbps"] == 0.0 and one["peak_busbw_gbps"] is None
    # 4 KiB bucket, k = 2: sync 10, 30, 20 µs → median 20 µs; algbw S/t = 0.4096, 0.1365, 0.3 GB/s → median 0.3;
    # busbw = algbw × 2(k−1)/k = algbw for k = 2; peak 4096 B / 10 µs
    assert [_sync_ns(c[3]) for c in CALLS[:3]] == [10_000, 30_000, 20_000]
    assert small["median_sync_time_ns"] == 20_000.0
    assert small["median_algbw_gbps"] == pytest.approx(6000 / 20_000)
    assert small["median_busbw_gbps"] == pytest.approx(6000 / 20_000)
    assert small["peak_busbw_gbps"] == pytest.approx(4096 / 10_000)
    # 1 MiB: 100 and 140 µs → median 120 µs; median busbw = mean of S/100 µs and S/140 µs
    assert big["median_sync_time_ns"] == 120_000.0
    assert big["median_busbw_gbps"] == pytest.approx((MIB / 100_000 + MIB / 140_000) / 2)
    assert big["bench_run"] is None and big["link"] is None and big["link_regime"] is None
    # an unknown device and no sweep: no reference judges it ('no model' counts as one reference, no verdict)
    assert (big["references"], big["verdicts"], big["verdict"], big["median_efficiency"]) == (1, 0, None, None)


def test_collective_peaks_by_hand(store):
    rows = _view(store, "SELECT * EXCLUDE (run_id) FROM collective_peaks")
    # k = 1 has no peak row; k = 2: the best busbw is 1 MiB in 100 µs, over two size buckets
    assert rows == [dict(op="all_reduce", group_size=2, bench_run=None, peak_busbw_gbps=pytest.approx(MIB / 100_000),
                         at_size_bytes=MIB, size_buckets=2)]


def test_collective_sizes_by_op_by_hand(store):
    rows = {r["bucket_bytes"]: r for r in _view(store, "SELECT * FROM collective_sizes_by_op")}
    assert set(rows) == {4096, MIB}
    small = rows[4096]
    # every group and k pooled: sync 10, 30, 20 and 8 µs (the 1-rank group) → median 15 µs;
    # busbw 0.4096, 0.1365, 0.3 and 0 GB/s → median (0.1365 + 0.3) / 2
    assert (small["count"], small["groups"]) == (4, 2)
    assert small["median_sync_time_ns"] == 15_000.0
    assert small["median_busbw_gbps"] == pytest.approx((4096 / 30_000 + 6000 / 20_000) / 2)
    assert small["peak_busbw_gbps"] == pytest.approx(4096 / 10_000)
    # waits: rank 0 waited 2 µs at the first call; comm: every rank's span, Σ (12 + 10) + 2·30 + 2·20 + 8 µs
    assert small["wait_ns"] == 2000
    assert small["comm_ns"] == 1000 * sum(d for c in CALLS if c[2] < MIB for _, d in c[3].values()) == 130_000
    # the 5 µs compute kernel lies under rank 0's span of the second call
    assert small["overlap_ns"] == OVERLAP_US * 1000
    assert small["exposed_comm_ns"] == 125_000 and small["overlap_ratio"] == pytest.approx(5 / 130)
    big = rows[MIB]
    assert (big["count"], big["groups"], big["wait_ns"], big["comm_ns"], big["overlap_ns"]) == (2, 1, 0, 480_000, 0)
    assert big["overlap_ratio"] == 0.0


def test_report_and_diff_read_the_views(store):
    rep = build_report(store, "hand")
    # the report's per-size table holds the view's rows, in its order, without run_id
    want = _view(store, "SELECT * EXCLUDE (run_id) FROM collective_sizes "
                        "ORDER BY op, group_size, locality, bench_run, bucket_bytes", ["hand"])
    assert rep["by_size"] == want and [r["count"] for r in want] == [1, 3, 2]
    assert rep["peak_busbw"] == _view(store, "SELECT * EXCLUDE (run_id) FROM collective_peaks", ["hand"])
    (ar,) = rep["collectives"]
    assert ar["peak_busbw_gbps"] == pytest.approx(MIB / 100_000)
    d = diff_runs(store, "one", "hand")
    rows = {r["bucket"]["lo_bytes"]: r for r in d["rows"]}
    assert rows[4096]["a"] is None and rows[4096]["b"]["median_sync_time_ns"] == 15_000.0
    # A: one 1 MiB call of 100 µs on both ranks; B: 100 and 140 µs
    a, b = rows[MIB]["a"], rows[MIB]["b"]
    assert (a["count"], a["median_sync_time_ns"], a["comm_ns"]) == (1, 100_000.0, 200_000)
    assert (b["count"], b["median_sync_time_ns"], b["comm_ns"]) == (2, 120_000.0, 480_000)
    assert rows[MIB]["sync_time_change"] == pytest.approx(0.2)
    assert rows[MIB]["delta"]["comm_ns"] == 280_000


def test_html_instances_in_a_total_order(store):
    """The HTML's per-instance bandwidth rows are ordered by op, size, then group and seq: instances of
    one size come out in one order on every run (the page is the same bytes for the same store)."""
    from tracekit.report.html import html_data

    got = [(r["size_bytes"], r["pg_name"], r["seq"]) for r in html_data(store, "hand", steps=1)["bandwidth"]]
    assert got == [(4096, "0", 0), (4096, "0", 1), (4096, "1", 0), (6000, "0", 2), (MIB, "0", 3), (MIB, "0", 4)]


# -- a seq that restarts: fixtures/handmade/two_rank twice, 1 s apart (two profiler windows in one file) ----


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("windows")
    st = Store(tmp / "s")
    ingest_paths([write_two_windows(tmp / "t")], st, run_id="windows")
    return st


def test_sizes_by_op_counts_each_window_once(windows):
    """fixtures/handmade/NOTE.md, per window: the all_reduce (4 MiB) waits 20 µs on rank 0, spans
    50 + 40 µs, 20 µs of rank 0's under its GEMM; the all_gather (1 MiB) waits 4 µs, spans 10 + 12 µs,
    none covered. Two windows: each instance's waits and spans once (joined by (group, window, seq),
    not (group, seq), which counted each window's instance with both windows' waits and spans)."""
    rows = {r["op"]: r for r in _view(windows, "SELECT * FROM collective_sizes_by_op", ["windows"])}
    ar, ag = rows["all_reduce"], rows["all_gather"]
    assert (ar["bucket_bytes"], ar["count"], ar["median_sync_time_ns"]) == (4 << 20, 2, 35_000.0)
    assert (ar["wait_ns"], ar["comm_ns"], ar["overlap_ns"], ar["exposed_comm_ns"]) == (40_000, 180_000, 40_000, 140_000)
    assert (ag["bucket_bytes"], ag["count"], ag["median_sync_time_ns"]) == (1 << 20, 2, 9_000.0)
    assert (ag["wait_ns"], ag["comm_ns"], ag["overlap_ns"]) == (8_000, 44_000, 0)
    d = diff_runs(windows, "windows", "windows")
    assert {r["op"]: r["a"]["wait_ns"] for r in d["rows"]} == {"all_reduce": 40_000, "all_gather": 8_000}


def test_the_diff_builds_no_verdict(store, monkeypatch):
    """The diff's per-size rows need instances, waits and overlap only: no fit, reference or verdict."""
    built = []
    real = analyses.create_module
    monkeypatch.setattr(analyses, "create_module", lambda con, name: (built.append(name), real(con, name))[1])
    diff_runs(store, "one", "hand")
    assert "collective_sizes_by_op" in built
    assert not {"fit", "verdicts", "collective_sizes"} & set(built)


def test_run_comm_totals_by_hand(store):
    """Σ over ranks of each rank's unions: rank 0's spans 12 + 30 + 20 + 100 + 140 + 8 µs, rank 1's
    10 + 30 + 20 + 100 + 140 µs (1 ms apart: disjoint); the 5 µs compute kernel lies under rank 0's span."""
    (t,) = _view(store, "SELECT * EXCLUDE (run_id) FROM run_comm_totals")
    assert t == dict(ranks=2, comm_ns=610_000, compute_ns=5_000, overlap_ns=5_000, exposed_comm_ns=605_000,
                     overlap_ratio=pytest.approx(5 / 610))
    assert diff_runs(store, "one", "hand")["totals"]["b"] == t

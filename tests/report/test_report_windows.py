"""A seq that restarts (fixtures/handmade/two_rank twice, 1 s apart: two profiler windows in one
file) in the views keyed by instance and in what the report, its glance and the HTML draw from
them: each window's instance once. fixtures/handmade/NOTE.md: per window one all_reduce (rank 0
waits 20 µs, sync 35 µs) and one all_gather (rank 0 waits 4 µs, sync 9 µs), 2 ranks."""

from __future__ import annotations

import json

import pytest

from tests.conftest import write_two_windows
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
from tracekit.report.html import html_data
from tracekit.store import Store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("windows")
    st = Store(tmp / "s")
    ingest_paths([write_two_windows(tmp / "t")], st, run_id="w")
    return st


def test_one_row_per_instance_in_the_keyed_views(store):
    con = analyses.connect(store)
    try:
        for view in ("collective_instances", "collective_bandwidth", "collective_verdicts", "verdict_rows"):
            got = con.execute(f"SELECT win, seq FROM {view} ORDER BY win, seq").fetchall()
            assert got == [(0, 0), (0, 1), (1, 0), (1, 1)], view
        assert con.execute("SELECT op, instances FROM bandwidth_by_locality ORDER BY op").fetchall() == [
            ("all_gather", 2), ("all_reduce", 2)]
    finally:
        con.close()


def test_the_report_counts_each_window_once(store):
    rep = build_report(store, "w")
    assert [(r["op"], r["count"], r["median_sync_time_ns"]) for r in rep["by_size"]] == [
        ("all_gather", 2, 9_000.0), ("all_reduce", 2, 35_000.0)]
    assert sorted((v["op"], v["count"]) for v in rep["verdicts"]) == [("all_gather", 2), ("all_reduce", 2)]
    assert [(r["op"], r["count"], r["total_wait_ns"]) for r in rep["collectives"]] == [
        ("all_gather", 2, 8_000), ("all_reduce", 2, 40_000)]


def test_the_html_draws_each_instance_once(store):
    h = html_data(store, "w", steps=1)
    assert [(r["op"], r["seq"]) for r in h["bandwidth"]] == [
        ("all_gather", 1), ("all_gather", 1), ("all_reduce", 0), ("all_reduce", 0)]
    comm = h["timeline"]["comm"]
    assert len(comm) == 8  # 2 ranks × 2 calls × 2 windows, each span one bar
    assert sorted(x["sync_time_ns"] for x in comm) == [9_000.0] * 4 + [35_000.0] * 4
    waits = h["waits"]
    assert [r["instance"] for r in waits["instances"]] == ["0:0", "0:1", "0:0", "0:1"]  # by last arrival
    assert waits["wait_ns"] == [[20_000, 4_000, 20_000, 4_000], [0, 0, 0, 0]]  # rank 0, rank 1


def test_the_perfetto_export_links_each_window_once(store, tmp_path):
    """Each window's two instances are their own flows (2 ranks: one arrow each), named pg:seq in
    window 0 and pg:seq@w1 in window 1; each call's args carry its own window's wait and sync time."""
    from tracekit.report.perfetto import export_perfetto

    out = tmp_path / "w.json"
    stats = export_perfetto(store, out, run_id="w", critical_path=False)
    events = json.loads(out.read_text())["traceEvents"]
    starts = sorted(e["name"] for e in events if e.get("ph") == "s")
    assert starts == ["0:0", "0:0@w1", "0:1", "0:1@w1"] and stats.instances_linked == 4
    calls = sorted((e["args"]["instance"], e["args"]["sync_time_us"], e["args"]["wait_us"])
                   for e in events if e.get("ph") == "X" and "instance" in e.get("args", {}))
    assert calls == [("0:0", 35.0, 0.0), ("0:0", 35.0, 20.0), ("0:0@w1", 35.0, 0.0), ("0:0@w1", 35.0, 20.0),
                     ("0:1", 9.0, 0.0), ("0:1", 9.0, 4.0), ("0:1@w1", 9.0, 0.0), ("0:1@w1", 9.0, 4.0)]


def _a2a_rank(rank: int) -> list:
    """Two ranks, two all_to_alls (Seq 0, 1) per profiler window, the second window 1 s later (its Seq
    restarts). Splits in float elements: window 0 rank 0 sends [256, 768], rank 1 [512, 512];
    window 1 both send [512, 512]."""
    splits = {0: ["[256, 768]", "[512, 512]"], 1: ["[512, 512]", "[512, 512]"]}
    ev = []
    for win in (0, 1):
        for seq in (0, 1):  # two calls a window: the second window's seq 0 after seq 1 is the restart
            ev.append(dict(ph="X", cat="kernel", name="ncclDevKernel_SendRecv(x)", pid=0, tid=7,
                           ts=1000 + 1_000_000 * win + 100 * seq + 10 * rank, dur=50 - 10 * rank,
                           args={"device": 0, "stream": 7, "correlation": 0, "Seq": seq, "Collective name": "all_to_all",
                             "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float", "Group size": 2,
                             "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
                             "In split size": splits[win][rank], "Out split size": "[]"}))
    return ev


def test_the_alltoall_views_key_instances_by_window(tmp_path):
    """alltoall_imbalance: one row per window (keyed by (pg, seq) both windows' cells summed into
    one). Window 0 by hand: rank 0 receives 256 (its own) + 512 elements, rank 1 768 + 512 = 1280
    elements = 5,120 B, the most; total 2 × 1024 × 4 B = 8,192 B. Window 1: even, 4,096 B each."""
    d = tmp_path / "t"
    d.mkdir()
    for r in (0, 1):
        (d / f"rank{r}.json").write_text(json.dumps({
            "schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Handmade GPU", "computeMajor": 8}],
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 2}, "traceEvents": _a2a_rank(r)}))
    st = Store(tmp_path / "s")
    ingest_paths([d], st, run_id="a2a")
    con = analyses.connect(st)
    rows = con.execute("SELECT win, seq, total_bytes, send_max_bytes, recv_max_bytes, heaviest_receiver "
                       "FROM alltoall_imbalance ORDER BY win, seq").fetchall()
    assert rows == [(0, 0, 8192, 4096, 5120, 1), (0, 1, 8192, 4096, 5120, 1),
                    (1, 0, 8192, 4096, 4096, 0), (1, 1, 8192, 4096, 4096, 0)]
    cells = con.execute("SELECT win, src, dst, bytes FROM alltoall_matrix WHERE seq = 0 "
                        "ORDER BY win, src, dst").fetchall()
    assert cells == [(0, 0, 0, 1024), (0, 0, 1, 3072), (0, 1, 0, 2048), (0, 1, 1, 2048),
                     (1, 0, 0, 2048), (1, 0, 1, 2048), (1, 1, 0, 2048), (1, 1, 1, 2048)]
    con.close()

"""A seq that restarts (fixtures/handmade/two_rank twice, 1 s apart: two profiler windows in one
file) in the views keyed by instance and in what the report, its glance and the HTML draw from
them: each window's instance once. fixtures/handmade/NOTE.md: per window one all_reduce (rank 0
waits 20 µs, sync 35 µs) and one all_gather (rank 0 waits 4 µs, sync 9 µs), 2 ranks."""

from __future__ import annotations

import copy
import json

import pytest

from tests.conftest import FIXTURES
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
from tracekit.report.html import html_data
from tracekit.store import Store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("windows")
    d = tmp / "t"
    d.mkdir()
    for r in (0, 1):
        doc = json.loads((FIXTURES / "handmade" / "two_rank" / f"rank{r}.json").read_text())
        later = copy.deepcopy(doc["traceEvents"])
        for e in later:
            if "ts" in e:
                e["ts"] += 1_000_000.0
        doc["traceEvents"] += later
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    st = Store(tmp / "s")
    ingest_paths([d], st, run_id="w")
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

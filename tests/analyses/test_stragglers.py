"""The straggler views of analyses/stragglers.sql (straggler_instances, straggler_ranks) on
fixtures/handmade/two_rank (fixtures/handmade/NOTE.md: rank 1 arrives last at both calls, rank 0
waits 20 µs at the all_reduce and 4 µs at the all_gather), once and as two profiler windows in one
file, and the report reading them."""

from __future__ import annotations


import pytest

from tests.conftest import FIXTURES, view_rows, write_two_windows
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report
from tracekit.store import Store

TWO = FIXTURES / "handmade" / "two_rank"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stragglers")
    d = write_two_windows(tmp / "windows")  # the same calls 1 s later, seq restarting: a second window
    st = Store(tmp / "s")
    ingest_paths([TWO], st, run_id="once")
    ingest_paths([d], st, run_id="windows")
    ingest_paths([FIXTURES / "nccl_tests"], st, run_id="log")
    return st


def _view(st, run_id, sql):
    return view_rows(st, sql, [run_id])


def test_straggler_instances_by_hand(store):
    got = [(r["win"], r["seq"], r["op"], r["straggler"], r["skew_ns"], r["sync_time_ns"]) for r in
           _view(store, "windows", "SELECT * FROM straggler_instances ORDER BY skew_ns DESC, seq, win")]
    assert got == [(0, 0, "all_reduce", 1, 20_000, 35_000.0), (1, 0, "all_reduce", 1, 20_000, 35_000.0),
                   (0, 1, "all_gather", 1, 4_000, 9_000.0), (1, 1, "all_gather", 1, 4_000, 9_000.0)]


def test_straggler_ranks_by_hand(store):
    # rank 1 last at both calls: rank 0 waited 20 + 4 µs
    assert _view(store, "once", "SELECT * EXCLUDE (run_id) FROM straggler_ranks") == [
        dict(rank=1, times_last=2, wait_caused_ns=24_000, skew_sum_ns=24_000)]
    # two windows: each window's instance with its own waits (joined by group, window and seq; by
    # (group, seq) alone each instance took both windows' waits: 96 µs)
    assert _view(store, "windows", "SELECT * EXCLUDE (run_id) FROM straggler_ranks") == [
        dict(rank=1, times_last=4, wait_caused_ns=48_000, skew_sum_ns=48_000)]


def test_a_log_has_no_straggler(store):
    assert _view(store, "log", "SELECT count(*) AS n FROM collective_instances")[0]["n"] > 0
    assert _view(store, "log", "SELECT * FROM straggler_instances") == []
    assert _view(store, "log", "SELECT * FROM straggler_ranks") == []


def test_report_reads_the_straggler_views(store):
    rep = build_report(store, "windows")
    assert [(r["seq"], r["skew_ns"]) for r in rep["stragglers"]] == [(0, 20_000), (0, 20_000), (1, 4_000), (1, 4_000)]
    assert set(rep["stragglers"][0]) == {"pg_name", "seq", "op", "size_bytes", "group_size", "straggler", "skew_ns",
                                         "sync_time_ns"}
    assert rep["straggler_ranks"] == [dict(rank=1, times_last=4, wait_caused_ns=48_000, skew_sum_ns=48_000)]
    assert build_report(store, "log")["stragglers"] == []

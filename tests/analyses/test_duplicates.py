"""Repeated (pg, seq) rows within one rank are detected, never averaged into a negative number
(issue 17, item 3), and no analysis emits a negative time on any fixture or shared trace.

The cases are the handmade two-rank trace (fixtures/handmade/NOTE.md: all_reduce seq 0 on rank 0
1000-1050 µs and rank 1 1020-1060 µs, sync time median(30, 40) = 35 µs, rank 0 waits 20 µs;
all_gather seq 1 sync time median(6, 12) = 9 µs) with rows repeated three ways.
"""

from __future__ import annotations

from tracekit import analyses

import copy
import json

import pytest

from tests.conftest import FIXTURES, TRACES
from tracekit.ingest import ingest_paths
from tracekit.store import Store

TWO = FIXTURES / "handmade" / "two_rank"
SIGNED_NS = {("ranks", "clock_offset_ns")}  # DESIGN.md: a rank's clock offset is signed
SIGNED_NS |= {("measured_vs_model", c) for c in ("gap_ns", "gap_transfer_ns", "gap_exposure_ns")}  # measured − model
"""(view, column) pairs whose *_ns values may be negative by definition."""


def _ranks():
    return [json.loads((TWO / f"rank{r}.json").read_text()) for r in (0, 1)]


def _ingest(tmp_path, docs, name):
    d = tmp_path / name
    d.mkdir()
    for r, doc in enumerate(docs):
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    st = Store(tmp_path / f"store-{name}")
    ingest_paths([str(d)], st, run_id=name)
    return analyses.connect(st)


def _instances(con):
    return con.execute(
        "SELECT win, seq, op, ranks_seen, disagree, conflict, sync_time_ns, skew_ns FROM collective_instances "
        "ORDER BY win, seq").fetchall()


def _comm(doc):
    return [e for e in doc["traceEvents"] if e.get("name", "").startswith("ncclDevKernel")]


def test_concatenated_profiler_windows_are_matched_within_each_window(tmp_path):
    docs = _ranks()
    for doc in docs:  # a second window 1 s later, seq restarting at 0
        later = copy.deepcopy(doc["traceEvents"])
        for e in later:
            if "ts" in e:
                e["ts"] += 1_000_000.0
        doc["traceEvents"] += later
    con = _ingest(tmp_path, docs, "windows")
    assert _instances(con) == [
        (0, 0, "all_reduce", 2, False, False, 35_000.0, 20_000),
        (0, 1, "all_gather", 2, False, False, 9_000.0, 4_000),
        (1, 0, "all_reduce", 2, False, False, 35_000.0, 20_000),
        (1, 1, "all_gather", 2, False, False, 9_000.0, 4_000),
    ]
    assert con.execute("SELECT win, seq, rank, wait_ns FROM collective_waits ORDER BY ALL").fetchall() == [
        (0, 0, 0, 20_000), (0, 0, 1, 0), (0, 1, 0, 4_000), (0, 1, 1, 0),
        (1, 0, 0, 20_000), (1, 0, 1, 0), (1, 1, 0, 4_000), (1, 1, 1, 0)]
    assert con.execute("SELECT rank, kind, n FROM collective_duplicates ORDER BY ALL").fetchall() == [
        (0, "window", 1), (1, "window", 1)]
    # 4,194,304 B / 35,000 ns (NOTE.md), twice; no skew-bound verdict from a negative sync time
    assert con.execute("SELECT count(*), min(algbw_gbps), max(algbw_gbps) FROM collective_bandwidth "
                       "WHERE op = 'all_reduce'").fetchone() == (2, pytest.approx(119.837257), pytest.approx(119.837257))
    assert con.execute("SELECT count(*) FROM collective_verdicts WHERE verdict = 'skew-bound'").fetchone() == (0,)


def test_the_same_span_twice_is_one_row(tmp_path):
    docs = _ranks()
    docs[0]["traceEvents"].append(copy.deepcopy(_comm(docs[0])[0]))  # rank 0's all_reduce kernel again
    con = _ingest(tmp_path, docs, "copy")
    assert con.execute("SELECT count(*) FROM collectives WHERE rank = 0 AND seq = 0").fetchone() == (2,)
    assert _instances(con) == [
        (0, 0, "all_reduce", 2, False, False, 35_000.0, 20_000),  # not 30 µs (median of 30, 30, 40)
        (0, 1, "all_gather", 2, False, False, 9_000.0, 4_000),
    ]
    assert con.execute("SELECT seq, rank, wait_ns FROM collective_waits ORDER BY ALL").fetchall() == [
        (0, 0, 20_000), (0, 1, 0), (1, 0, 4_000), (1, 1, 0)]
    assert con.execute("SELECT rank, kind, n FROM collective_duplicates").fetchall() == [(0, "copy", 1)]


def test_a_conflicting_repeat_is_flagged_and_kept_out_of_the_statistics(tmp_path):
    docs = _ranks()
    other = copy.deepcopy(_comm(docs[0])[0])  # seq 0 again on rank 0, another span: 1500-1520 µs
    other["ts"], other["dur"] = 1500.0, 20.0
    docs[0]["traceEvents"].append(other)
    con = _ingest(tmp_path, docs, "conflict")
    assert _instances(con) == [
        (0, 0, "all_reduce", 2, True, True, None, 500_000),  # neither rank 0 start is *the* start
        (0, 1, "all_gather", 2, False, False, 9_000.0, 4_000),
    ]
    assert con.execute("SELECT seq, algbw_gbps FROM collective_bandwidth ORDER BY seq").fetchall() == [
        (0, None), (1, pytest.approx(116.508444))]
    assert con.execute("SELECT seq, verdict FROM collective_verdicts ORDER BY seq").fetchall()[0] == (0, None)
    assert con.execute("SELECT count(*) FROM collective_samples WHERE seq = 0").fetchone() == (0,)
    assert con.execute("SELECT DISTINCT seq FROM collective_waits").fetchall() == [(1,)]
    assert con.execute("SELECT rank, kind, n FROM collective_duplicates").fetchall() == [(0, "conflict", 1)]


def _negatives(con) -> list[tuple[str, str, float]]:
    """(view, column, min) for every *_ns column of every view and table with a negative value."""
    found = []
    con.analyses.ensure_all()  # every analysis module (they are built on first use)
    objs = [o for (o,) in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()]
    assert {"collective_instances", "collective_waits", "collective_verdicts", "overlap_by_rank",
            "measured_vs_model", "overlap_windows", "events", "collectives"} <= set(objs)
    for o in objs:
        cols = [c for c, t in con.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = ?", [o]).fetchall()
            if c.endswith("_ns") and t in ("BIGINT", "INTEGER", "DOUBLE", "HUGEINT")]
        if not cols:
            continue
        mins = con.execute("SELECT " + ", ".join(f'min("{c}")' for c in cols) + f" FROM {o}").fetchone()
        found += [(o, c, m) for c, m in zip(cols, mins) if m is not None and m < 0 and (o, c) not in SIGNED_NS]
    return found


def _sources():
    """Every recorded and handmade fixture run, and every shared trace (one run per file where the
    folder holds unrelated files)."""
    out = [p for p in sorted(FIXTURES.glob("*_2rank"))] + [TWO, FIXTURES / "defects" / "two_hosts"]
    out += sorted(p for p in (FIXTURES / "defects").glob("*.json"))
    if TRACES.is_dir():
        for p in sorted(TRACES.iterdir()):
            if p.name in ("pipit_nsys_sqlite", "hta_cpu_only_gloo", "kineto_legacy_2021"):
                out += sorted(f for f in p.iterdir() if f.is_file())
            elif p.name == "single_gpu_compute":
                out += sorted(f for f in p.iterdir() if f.is_dir())
            elif p.is_dir():
                out.append(p)
    return out


def test_no_view_has_a_negative_time_on_any_fixture_or_shared_trace(tmp_path):
    from tracekit.errors import BadInputError

    st = Store(tmp_path / "all")
    ingested = 0
    for i, src in enumerate(_sources()):
        try:
            ingest_paths([str(src)], st, run_id=f"run{i}")
            ingested += 1
        except BadInputError:
            pass  # defects fixtures that are refused on purpose
    assert ingested >= 15
    con = analyses.connect(st)
    assert _negatives(con) == []
    # nothing in them is repeated: no window, copy or conflict is invented
    assert con.execute("SELECT * FROM collective_duplicates").fetchall() == []
    con.close()


def test_no_negative_time_on_the_repeats(tmp_path):
    docs = _ranks()
    for doc in docs:
        later = copy.deepcopy(doc["traceEvents"])
        for e in later:
            if "ts" in e:
                e["ts"] += 1_000_000.0
        doc["traceEvents"] += later
    docs[1]["traceEvents"].append(copy.deepcopy(_comm(docs[1])[1]))
    assert _negatives(_ingest(tmp_path, docs, "mixed")) == []


def test_the_report_warns_of_each_kind(tmp_path):
    from tracekit.report.data import build_report

    docs = _ranks()
    for doc in docs:
        later = copy.deepcopy(doc["traceEvents"])
        for e in later:
            if "ts" in e:
                e["ts"] += 1_000_000.0
        doc["traceEvents"] += later
    docs[1]["traceEvents"].append(copy.deepcopy(_comm(docs[1])[1]))  # rank 1's all_gather kernel again
    other = copy.deepcopy(_comm(docs[0])[0])
    other["ts"], other["dur"] = 1500.0, 20.0
    docs[0]["traceEvents"].append(other)
    _ingest(tmp_path, docs, "all3").close()
    warnings = build_report(Store(tmp_path / "store-all3"), "all3")["warnings"]
    assert "rank 1: 1 collective span(s) of group 0 recorded twice (same seq and start): counted once" in warnings
    assert "rank 0: seq of group 0 restarts 1 time(s) (profiler windows in one file): matched per window" in warnings
    assert "rank 0: 1 seq(s) of group 0 recorded as different spans: flagged disagree, no sync time" in warnings

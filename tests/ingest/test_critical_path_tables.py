"""The critical path's tables written at ingest (tracekit.ingest.critical_path): which a run stores,
and what they hold, against SQL over the stored events (an independent computation)."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store

# the nodes of the walk, as analyses/critical_path.py's header defines them, in SQL over the events
_NODES = """
SELECT rank, event_id FROM events WHERE run_id = ? AND ts_ns IS NOT NULL AND dur_ns >= 0
  AND ((track_kind = 'gpu_stream' AND category IS DISTINCT FROM 'gpu_user_annotation')
       OR category = 'runtime' OR class IN ('compute', 'comm', 'sync'))
"""


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("cpt") / "s")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="two")
    ingest_paths([FIXTURES / "handmade" / "gpu_breakdown" / "rank0.json"], st, run_id="one")  # NCCL, named groups
    return st


def _q(st, sql, params):
    con = analyses.connect(st)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def test_a_run_of_several_ranks_stores_its_nodes_not_paths(stores):
    assert _q(stores, "SELECT count(*) FROM rank_critical_path WHERE run_id = ?", ["two"]) == [(0,)]
    assert _q(stores, "SELECT count(*) FROM rank_critical_path_summary WHERE run_id = ?", ["two"]) == [(0,)]
    got = _q(stores, "SELECT rank, event_id FROM critical_path_nodes WHERE run_id = ? ORDER BY ALL", ["two"])
    assert got and got == _q(stores, _NODES + " ORDER BY ALL", ["two"])
    # each node's times, launch, name and class are its event's
    assert _q(stores, """SELECT count(*) FROM critical_path_nodes n JOIN events e USING (run_id, rank, event_id)
                         WHERE n.run_id = ? AND (n.ts_ns IS DISTINCT FROM e.ts_ns OR n.end_ns IS DISTINCT FROM e.ts_ns + e.dur_ns
                           OR n.launch_event_id IS DISTINCT FROM e.launch_event_id OR n.name IS DISTINCT FROM e.name
                           OR n.class IS DISTINCT FROM e.class OR n.step IS DISTINCT FROM e.step
                           OR n.gpu IS DISTINCT FROM (e.track_kind = 'gpu_stream'))""", ["two"]) == [(0,)]


def test_tid_numbers_tracks_in_their_order(stores):
    """Equal tracks, equal tid; tids sort like (kind, device, track) within a rank."""
    rows = _q(stores, """SELECT DISTINCT n.rank, n.tid, e.track_kind, e.device, e.track FROM critical_path_nodes n
                         JOIN events e USING (run_id, rank, event_id) WHERE n.run_id = ?
                         ORDER BY n.rank, n.tid""", ["two"])
    for r in {x[0] for x in rows}:
        mine = [x[1:] for x in rows if x[0] == r]
        assert len({t for t, *_ in mine}) == len(mine) == len({tuple(x[1:]) for x in mine})
        assert [x[1:] for x in mine] == sorted((x[1:] for x in mine), key=lambda k: tuple((v is None, v) for v in k))


def test_a_run_of_one_rank_stores_its_final_paths(stores):
    assert _q(stores, "SELECT count(*) FROM critical_path_nodes WHERE run_id = ?", ["one"]) == [(0,)]
    n = _q(stores, "SELECT count(*) FROM rank_critical_path WHERE run_id = ?", ["one"])[0][0]
    assert n > 0
    # the view is the stored rows, and its summary's window_ns is the rank's own step span
    assert _q(stores, "SELECT count(*) FROM critical_path WHERE run_id = ?", ["one"]) == [(n,)]
    spans = dict(((s,), w) for s, w in _q(stores, """SELECT step, max(ts_ns + dur_ns) - min(ts_ns) FROM events
        WHERE run_id = ? AND ts_ns IS NOT NULL AND dur_ns >= 0 GROUP BY step""", ["one"]))
    for step, window in _q(stores, "SELECT step, window_ns FROM critical_path_summary WHERE run_id = ?", ["one"]):
        assert window == spans[(step,)]


def test_a_lone_rank_with_unnamed_gloo_calls_stores_its_nodes(tmp_path):
    """fixtures/tp_2rank's rank 0 alone: gloo calls whose process group the trace does not name are
    attributed after the ranks' tasks, so its calls may yet share an instance: its nodes are stored
    (one per node of the walk) and walked at analyze, not final paths."""
    st = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "tp_2rank" / "rank0.pt.trace.json.gz"], st, run_id="one")
    assert _q(st, "SELECT count(*) FROM rank_critical_path", []) == [(0,)]
    (nodes,) = _q(st, "SELECT count(*) FROM (" + _NODES + ")", ["one"])
    assert _q(st, "SELECT count(*) FROM critical_path_nodes", []) == [nodes] and nodes[0] > 0
    assert _q(st, "SELECT count(*) FROM critical_path", [])[0][0] > 0


def test_rank_steps_counts_every_event(stores):
    for run in ("one", "two"):
        want = _q(stores, """SELECT rank, step, count(*), min(ts_ns) FILTER (WHERE dur_ns >= 0),
                                    max(ts_ns + dur_ns) FILTER (WHERE dur_ns >= 0)
                             FROM events WHERE run_id = ? GROUP BY ALL ORDER BY ALL""", [run])
        got = _q(stores, "SELECT rank, step, events, first_ns, last_ns FROM rank_steps WHERE run_id = ? ORDER BY ALL",
                 [run])
        assert got == want and len(got) >= 2


def test_tables_written_in_small_parts_are_the_same(stores, tmp_path, monkeypatch):
    """ROWS_PER_PART = 7: both long tables are written in many parts, with the same rows."""
    import tracekit.ingest.critical_path as icp

    monkeypatch.setattr(icp, "ROWS_PER_PART", 7)
    small = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "tp_2rank"], small, run_id="two")
    ingest_paths([FIXTURES / "handmade" / "gpu_breakdown" / "rank0.json"], small, run_id="one")
    for table in ("critical_path_nodes", "rank_critical_path", "rank_critical_path_summary", "critical_path_summary"):
        sql = f"SELECT * FROM {table} ORDER BY ALL"
        assert _q(small, sql, []) == _q(stores, sql, []), table
    assert _q(small, "SELECT count(*) FROM rank_critical_path", [])[0][0] > 7


def test_distinct_rows_match_a_python_set():
    """_distinct_rows on random int64 columns (negative values and ties included): each row's number
    names a row equal to it, the representatives are distinct and in lexicographic (numeric) order,
    and there are as many as a Python set of the row tuples holds."""
    import numpy as np

    from tracekit.ingest.critical_path import _distinct_rows

    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 50, 2000):
        cols = [rng.integers(-3, 3, n), rng.integers(0, 2, n), rng.integers(-2**40, 2**40, n) // 2**38,
                rng.integers(0, 2, n), rng.integers(-5, 5, n)]
        first, inv = _distinct_rows(cols)
        rows = list(zip(*(c.tolist() for c in cols)))
        reps = [rows[i] for i in first.tolist()]
        assert reps == sorted(set(rows))
        assert [reps[j] for j in inv.tolist()] == rows


def test_a_lone_rank_whose_calls_share_a_seq_is_walked_with_its_own_collective_edge(tmp_path):
    """One rank (world_size 1) with two all-reduces of one (process group, seq): A on stream 7
    [1000, 1100) µs and B on stream 9 [1020, 1030), then a GEMM on stream 7 [1100, 1200). The two
    calls are one instance whose last arrival is B (at 1020), so A's path jumps to B: GEMM (100 µs,
    after A on its stream) ← A (1100 − 1020 = 80 µs after the arrival) ← B (collective edge, 0).
    Such a rank's paths are not final at ingest: its nodes are stored and walked at analyze, as
    for a run of several ranks (the rows the analysis computed before the path moved to the ingest)."""
    import json

    def nccl(ts, dur, stream):
        return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_RING_LL", "pid": 0, "tid": stream,
                "ts": ts, "dur": dur, "args": {"device": 0, "stream": stream, "correlation": 0, "Seq": 0,
                                               "Collective name": "allreduce", "In msg nelems": 1048576,
                                               "Out msg nelems": 1048576, "dtype": "Float", "Group size": 1,
                                               "Process Group Name": "0", "Process Group Ranks": "[0]"}}

    gemm = {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": 1100.0, "dur": 100.0,
            "args": {"device": 0, "stream": 7, "correlation": 0}}
    d = tmp_path / "tr"
    d.mkdir()
    (d / "rank0.json").write_text(json.dumps({
        "schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "deviceProperties": [{"id": 0, "name": "Handmade GPU"}],
        "traceEvents": [nccl(1000.0, 100.0, 7), nccl(1020.0, 10.0, 9), gemm], "traceName": "rank0"}))
    st = Store(tmp_path / "s")
    ingest_paths([d], st, run_id="d")
    con = analyses.connect(st)
    assert con.execute("SELECT count(*) FROM rank_critical_path").fetchall() == [(0,)]
    assert con.execute("SELECT count(*) FROM critical_path_nodes").fetchall() == [(3,)]
    rows = con.execute("SELECT pos, start_ns, on_path_ns, gap_ns, edge FROM critical_path ORDER BY pos").fetchall()
    assert rows == [(0, 1_020_000, 0, 0, "collective"), (1, 1_000_000, 80_000, 0, "stream"),
                    (2, 1_100_000, 100_000, 0, "end")]

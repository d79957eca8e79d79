"""Golden tests, Perfetto style, for the interval macros (tracekit/analyses/intervals.sql) and the
island views over events (overlap_islands.sql): each case is its input written inline as ``VALUES``
and the output table written by hand, compared row for row. No store and no ingest: the SQL files
run on a bare DuckDB connection, with ``events`` a view over the case's rows."""

from __future__ import annotations

import duckdb
import pytest

from tracekit.analyses import sql_text


def _con(events_values: str | None = None):
    con = duckdb.connect()
    con.execute(sql_text("intervals"))
    if events_values is not None:
        con.execute("CREATE VIEW events AS SELECT * FROM (VALUES " + events_values
                    + ") AS t(run_id, rank, ts_ns, dur_ns, class, step)")
        con.execute(sql_text("overlap_islands"))
    return con


def _spans(con, name: str, values: str) -> None:
    con.execute(f"CREATE TABLE {name} AS SELECT * FROM (VALUES {values}) AS t(run_id, rank, grp, s, e)")


def _rows(con, query: str) -> list[tuple]:
    return sorted(con.execute(query).fetchall())


# (case, spans as VALUES rows (run_id, rank, grp, s, e), merge_intervals' islands by hand)
MERGE = [
    ("touching intervals merge", "('r', 0, -1, 0, 10), ('r', 0, -1, 10, 20)", [("r", 0, -1, 0, 20)]),
    ("a gap of 1 ns keeps two islands", "('r', 0, -1, 0, 10), ('r', 0, -1, 11, 20)",
     [("r", 0, -1, 0, 10), ("r", 0, -1, 11, 20)]),
    ("nested inside a longer one", "('r', 0, -1, 30, 40), ('r', 0, -1, 32, 35)", [("r", 0, -1, 30, 40)]),
    ("equal starts: the longest wins", "('r', 0, -1, 0, 5), ('r', 0, -1, 0, 9), ('r', 0, -1, 0, 2)",
     [("r", 0, -1, 0, 9)]),
    ("a chain reaching back over a shorter middle",
     "('r', 0, -1, 0, 100), ('r', 0, -1, 10, 20), ('r', 0, -1, 90, 150), ('r', 0, -1, 200, 210)",
     [("r", 0, -1, 0, 150), ("r", 0, -1, 200, 210)]),
    ("a zero-length span is its own island; an inverted one is dropped",
     "('r', 0, -1, 50, 50), ('r', 0, -1, 70, 60)", [("r", 0, -1, 50, 50)]),
    ("ranks, windows and runs never merge",
     "('r', 0, -1, 0, 10), ('r', 1, -1, 5, 15), ('r', 0, 3, 5, 15), ('q', 0, -1, 5, 15)",
     [("q", 0, -1, 5, 15), ("r", 0, -1, 0, 10), ("r", 0, 3, 5, 15), ("r", 1, -1, 5, 15)]),
]


@pytest.mark.parametrize("case,values,want", MERGE, ids=[c[0] for c in MERGE])
def test_merge_intervals_golden(case, values, want):
    con = _con()
    _spans(con, "x", values)
    assert _rows(con, "SELECT * FROM merge_intervals('x')") == want


# (case, islands a, islands b, a ∩ b by hand); a and b are disjoint islands, as the macro requires
INTERSECT = [
    ("pieces of two sets", "('r', 0, -1, 0, 20), ('r', 0, -1, 30, 40)",
     "('r', 0, -1, 5, 12), ('r', 0, -1, 15, 35)",
     [("r", 0, -1, 5, 12), ("r", 0, -1, 15, 20), ("r", 0, -1, 30, 35)]),
    ("touching is not overlapping", "('r', 0, -1, 0, 10)", "('r', 0, -1, 10, 20)", []),
    ("one inside the other", "('r', 0, -1, 0, 100)", "('r', 0, -1, 40, 60)", [("r", 0, -1, 40, 60)]),
    ("equal islands", "('r', 0, -1, 7, 9)", "('r', 0, -1, 7, 9)", [("r", 0, -1, 7, 9)]),
    ("other rank or window: nothing", "('r', 0, -1, 0, 10)", "('r', 1, -1, 0, 10), ('r', 0, 2, 0, 10)", []),
]


@pytest.mark.parametrize("case,a,b,want", INTERSECT, ids=[c[0] for c in INTERSECT])
def test_intersect_islands_golden(case, a, b, want):
    con = _con()
    _spans(con, "a", a)
    _spans(con, "b", b)
    assert _rows(con, "SELECT * FROM intersect_islands('a', 'b')") == want
    assert _rows(con, "SELECT * FROM intersect_islands('b', 'a')") == want  # symmetric


def test_island_prefix_golden():
    con = _con()
    _spans(con, "x", "('r', 0, -1, 0, 10), ('r', 0, -1, 20, 25), ('r', 0, -1, 40, 47), ('r', 1, -1, 3, 4)")
    assert _rows(con, "SELECT * FROM island_prefix('x')") == [
        ("r", 0, -1, 0, 10, 0), ("r", 0, -1, 20, 25, 10), ("r", 0, -1, 40, 47, 15), ("r", 1, -1, 3, 4, 0)]


# events (run_id, rank, ts_ns, dur_ns, class, step): rank 0 has two steps; rank 1 no step
EVENTS = """
 ('r', 0,  0, 10, 'comm',    1), ('r', 0, 10, 10, 'comm',    1), ('r', 0,  5,  7, 'compute', 1),
 ('r', 0, 30, 10, 'comm',    2), ('r', 0, 15, 20, 'compute', 2), ('r', 0, 32,  3, 'comm',    2),
 ('r', 0, 60,  5, 'memory',  2), ('r', 0, 90,  5, 'comm', NULL),
 ('r', 1,  0, 50, 'compute', NULL), ('r', 1, 45, 10, 'comm', NULL)
"""


def test_island_views_over_events_golden():
    con = _con(EVENTS)
    assert _rows(con, "SELECT * FROM comm_islands") == [
        ("r", 0, -1, 0, 20), ("r", 0, -1, 30, 40), ("r", 0, -1, 90, 95),
        ("r", 0, 1, 0, 20), ("r", 0, 2, 30, 40),
        ("r", 1, -1, 45, 55)]
    assert _rows(con, "SELECT * FROM compute_islands") == [
        ("r", 0, -1, 5, 12), ("r", 0, -1, 15, 35), ("r", 0, 1, 5, 12), ("r", 0, 2, 15, 35), ("r", 1, -1, 0, 50)]
    # whole trace: comm [0,20) [30,40) [90,95) ∩ compute [5,12) [15,35) = [5,12) [15,20) [30,35); the
    # step windows see only their own events: step 1 [0,20) ∩ [5,12); step 2 [30,40) ∩ [15,35)
    assert _rows(con, "SELECT * FROM overlap_islands") == [
        ("r", 0, -1, 5, 12), ("r", 0, -1, 15, 20), ("r", 0, -1, 30, 35), ("r", 0, 1, 5, 12), ("r", 0, 2, 30, 35),
        ("r", 1, -1, 45, 50)]
    # whole trace, rank 0: comm 35 ns, of which overlapped 7 + 5 + 5 = 17, so 18 exposed
    assert con.execute("SELECT sum(e - s) FROM comm_islands WHERE rank = 0 AND grp = -1").fetchone()[0] == 35
    assert con.execute("SELECT sum(e - s) FROM overlap_islands WHERE rank = 0 AND grp = -1").fetchone()[0] == 17


def test_the_ingest_sweep_gives_the_golden_lengths():
    """The numpy sweep the ingest stores (tracekit.timeline.intervals.rank_overlap_summary) on rank 0's
    comm and compute events of EVENTS: the lengths of the golden islands above, per window."""
    import numpy as np
    import pyarrow as pa

    from tracekit.timeline.intervals import rank_overlap_summary

    rows = [(0, 10, "comm", 1), (10, 10, "comm", 1), (5, 7, "compute", 1), (30, 10, "comm", 2),
            (15, 20, "compute", 2), (32, 3, "comm", 2), (90, 5, "comm", None)]
    ev = pa.table({"event_id": pa.array(range(len(rows)), pa.int64()),
                   "ts_ns": pa.array([r[0] for r in rows], pa.int64()),
                   "dur_ns": pa.array([r[1] for r in rows], pa.int64()),
                   "step": pa.array([r[3] for r in rows], pa.int64())})
    is_comm = np.array([r[2] == "comm" for r in rows])
    names = pa.array(["c"] * int(is_comm.sum()))
    windows, spans = rank_overlap_summary("r", 0, ev, is_comm, names, np.array([], np.int64))
    got = {w["grp"]: (w["comm_ns"], w["compute_ns"], w["overlap_ns"]) for w in windows.to_pylist()}
    # whole trace: |[0,20) [30,40) [90,95)| = 35, |[5,12) [15,35)| = 27, overlap 17 (golden islands);
    # step 1: 20, 7, 7; step 2: |[30,40)| = 10, 20, |[30,35)| = 5
    assert got == {-1: (35, 27, 17), 1: (20, 7, 7), 2: (10, 20, 5)}
    # per span: the compute covered inside each comm span ([10,20) holds [10,12) and [15,20))
    assert [s["overlap_ns"] for s in spans.to_pylist()] == [5, 2 + 5, 5, 3, 0]

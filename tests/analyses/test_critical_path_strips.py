"""The report's critical-path strips (``critical_path.path_strips``, computed as arrays from the
selected paths' rows) against their definition: the pieces of ``path_segments`` merged path by path
in Python, on hand-made critical_path tables and on real stores."""

from __future__ import annotations

import duckdb
import pytest

from conftest import FIXTURES
from tracekit import analyses
from tracekit.analyses import critical_path as cp
from tracekit.ingest import ingest_paths
from tracekit.store import Store

SHARED = FIXTURES.parent.parent / "shared" / "traces"


def _by_definition(con, run_id, first):
    """path_segments' pieces, paths sorted by (step NULL first, rank), merged one piece at a time."""
    paths = sorted(cp.path_segments(con, run_id), key=lambda p: (p["step"] is not None, p["step"] or 0, p["rank"]))
    out = []
    for p in paths[:first]:
        merged: list[list] = []
        longest = 0
        for s, e, part, name, ev_rank in p["segments"]:
            if merged and merged[-1][2] == part and merged[-1][5] == ev_rank and merged[-1][1] == s:
                m = merged[-1]
                m[1], m[4] = e, m[4] + 1
                if e - s > longest:
                    m[3], longest = name, e - s
            else:
                merged.append([s, e, part, name, 1, ev_rank])
                longest = e - s
        out.append({**{k: p[k] for k in ("rank", "step", "start_ns", "end_ns")}, "segments": merged})
    return out


def _hand_tables():
    con = duckdb.connect()
    con.execute("CREATE TABLE critical_path (run_id VARCHAR, rank INTEGER, step BIGINT, pos INTEGER, "
                "event_rank INTEGER, name VARCHAR, class VARCHAR, on_path_ns BIGINT, gap_ns BIGINT, edge VARCHAR)")
    con.execute("CREATE TABLE critical_path_summary (run_id VARCHAR, rank INTEGER, step BIGINT, "
                "start_ns BIGINT, end_ns BIGINT)")
    con.execute("INSERT INTO critical_path_summary VALUES ('r', 0, 1, 100, 190), ('r', 1, 1, 100, 150), "
                "('r', 0, NULL, 0, 30)")
    con.execute("""INSERT INTO critical_path VALUES
        -- rank 0, no step: one kernel after 10 ns of idle (first row of the run: no edge before it)
        ('r', 0, NULL, 0, 0, 'k0', 'compute', 20, 10, 'thread'),
        -- rank 0, step 1: the gap before 'a' follows a 'thread' edge (the row before, in the other
        -- path): host code; then b (longer) and c merge with a as compute; then rank 1's work
        ('r', 0, 1, 0, 0, 'a', 'compute', 10, 5, 'stream'),
        ('r', 0, 1, 1, 0, 'b', 'compute', 30, 0, 'stream'),
        ('r', 0, 1, 2, 0, 'c', 'compute', 30, 0, 'collective'),
        ('r', 0, 1, 3, 1, 'x', 'comm', 10, 0, 'stream'),
        ('r', 0, 1, 4, 0, 'y', 'comm', 5, 0, 'end'),
        -- rank 1, step 1: a gap after an 'end' edge is idle
        ('r', 1, 1, 0, 1, 'z', 'memory', 40, 10, 'end')""")
    return con


def test_hand_made_paths_give_their_strips():
    con = _hand_tables()
    got = cp.path_strips(con, "r", 16)
    assert got == [
        {"rank": 0, "step": None, "start_ns": 0, "end_ns": 30,
         "segments": [[0, 10, "idle", "idle", 1, 0], [10, 30, "compute", "k0", 1, 0]]},
        {"rank": 0, "step": 1, "start_ns": 100, "end_ns": 190,
         "segments": [[100, 105, "launch_cpu", "host code", 1, 0], [105, 175, "compute", "b", 3, 0],
                      [175, 185, "straggler", "x", 1, 1], [185, 190, "exposed_comm", "y", 1, 0]]},
        {"rank": 1, "step": 1, "start_ns": 100, "end_ns": 150,
         "segments": [[100, 110, "idle", "idle", 1, 1], [110, 150, "memory", "z", 1, 1]]},
    ]
    assert got == _by_definition(con, "r", 16)
    assert cp.path_strips(con, "r", 2) == got[:2]
    assert cp.path_strips(con, "other", 16) == []


def _stores():
    yield FIXTURES / "3d_2x2x2"
    yield FIXTURES / "pp_2rank"
    yield FIXTURES / "handmade" / "two_rank"
    yield SHARED / "param_dlrm_8rank_v100"


@pytest.mark.parametrize("src", list(_stores()), ids=lambda p: p.name)
def test_real_stores_give_the_merged_pieces(src, tmp_path):
    if not src.exists():
        pytest.skip(f"{src} absent (../shared/traces is not checked out here)")
    store = Store(tmp_path / "s")
    ingest_paths([src], store, run_id="r")
    con = analyses.connect(store)
    con.analyses.ensure("critical_path")
    n = con.execute("SELECT count(*) FROM critical_path_summary").fetchone()[0]
    assert n > 0
    for first in (1, 3, n + 1):
        got = cp.path_strips(con, "r", first)
        assert got == _by_definition(con, "r", first)
        assert len(got) == min(first, n)
    con.close()


@pytest.mark.parametrize("src", [FIXTURES / "3d_2x2x2", SHARED / "param_dlrm_8rank_v100"], ids=lambda p: p.name)
def test_top_events_per_path_are_the_window_definition(src, tmp_path):
    """The report's top_by_path (an aggregate per path) against its definition: row_number() per
    (rank, step) by on_path_ns DESC, then path position, first 3."""
    from tracekit.report.data import critical_path_section

    if not src.exists():
        pytest.skip(f"{src} absent (../shared/traces is not checked out here)")
    store = Store(tmp_path / "s")
    ingest_paths([src], store, run_id="r")
    con = analyses.connect(store)
    con.analyses.ensure("critical_path")
    want = con.execute("""
        SELECT rank, step, event_rank, event_id, name, class, start_ns, end_ns, on_path_ns FROM (
            SELECT *, row_number() OVER (PARTITION BY rank, step ORDER BY on_path_ns DESC, pos) AS n
            FROM critical_path WHERE run_id = 'r' AND on_path_ns > 0)
        WHERE n <= 3 ORDER BY step, rank, n""").fetchall()
    got = [tuple(r.values()) for r in critical_path_section(con, "r", True)["top_by_path"]]
    assert len(want) > 3 and got == want
    con.close()

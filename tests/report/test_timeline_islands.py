"""The HTML timeline's islands (tracekit.report.html._timeline) are those of the views
compute_islands / overlap_islands for the shown ranks and windows, computed from those ranks' spans
only; and the report's calibration-run lookup connects with the runs view alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.report import html as H
from tracekit.report.data import _calibration_runs
from tracekit.store import Store

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("tl") / "store")
    ingest_paths([FIXTURES / "3d_2x2x2"], st, run_id="tp")
    return st


def _old(con, name, run_id, grps, ranks):
    gl, rl = ", ".join(map(str, grps)), ", ".join(map(str, ranks))
    cur = con.execute(
        f"SELECT rank, min(s) AS s, max(e) AS e FROM (SELECT rank, s, e FROM {name} "
        f"WHERE run_id = ? AND grp IN ({gl}) AND rank IN ({rl})) GROUP BY rank, s ORDER BY rank, s", [run_id])
    return [dict(rank=r, s=s, e=e) for r, s, e in cur.fetchall()]


@pytest.mark.parametrize("ranks_shown", [3, 8])
def test_islands_equal_the_views_filtered(store, monkeypatch, ranks_shown):
    monkeypatch.setattr(H, "MAX_TIMELINE_RANKS", ranks_shown)
    con = analyses.connect(store, run_ids=["tp"])
    try:
        tl = H._timeline(con, "tp", steps=2)
        grps = tl["steps"] or [-1]
        ranks = tl["ranks"]
        assert len(ranks) == ranks_shown
        compute = _old(con, "compute_islands", "tp", grps, ranks)
        overlap = _old(con, "overlap_islands", "tp", grps, ranks)
    finally:
        con.close()
    assert compute and overlap  # the fixture overlaps comm with compute
    assert [dict(rank=x["rank"], s=x["s"], e=x["e"]) for x in tl["compute"]] == compute
    assert [dict(rank=x["rank"], s=x["s"], e=x["e"]) for x in tl["overlap"]] == overlap


def test_connect_with_the_runs_view_only(store):
    con = store.connect(tables=("runs",))
    try:
        assert con.execute("SELECT run_id FROM runs").fetchall() == [("tp",)]
        with pytest.raises(Exception):
            con.execute("SELECT count(*) FROM events")
    finally:
        con.close()
    assert _calibration_runs(store) == []

"""The per-rank overlap summaries made at ingest (tracekit.timeline.intervals.rank_overlap_summary; the store's
overlap_summary and span_overlap tables, the only source the analyses read) against independent
computations from the events: the islands views (gaps-and-islands SQL, analyses/intervals.sql) and
the ASOF prefix join the collective_overlap view used before; their timestamps on the run's clock
after the clock offsets. A run stored without them, or with one damaged, is refused:
tests/analyses/test_summary_door.py."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import FIXTURES, REPO, shared_trace
from tracekit import analyses
from tracekit.ingest import ingest_paths
from tracekit.store import Store

_spec = importlib.util.spec_from_file_location("synth_job", REPO / "benchmarks" / "synth_job.py")
synth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synth)

# The per-span overlap from the islands (the view collective_overlap was before the summaries):
# C(t) = covered compute length up to t, by an ASOF join on the compute islands' prefix sums.
ISLANDS_CALL_OVERLAP = """
WITH p AS (SELECT * FROM island_prefix('compute_islands') WHERE grp = -1),
calls AS (SELECT run_id, rank, event_id, name, ts_ns AS s, ts_ns + dur_ns AS e FROM events WHERE class = 'comm'),
cs AS (SELECT c.*, coalesce(p.cum_before + least(c.s, p.e) - p.s, 0) AS cov_s
       FROM calls c ASOF LEFT JOIN p ON c.run_id = p.run_id AND c.rank = p.rank AND c.s >= p.s),
ce AS (SELECT x.*, coalesce(p.cum_before + least(x.e, p.e) - p.s, 0) AS cov_e
       FROM cs x ASOF LEFT JOIN p ON x.run_id = p.run_id AND x.rank = p.rank AND x.e >= p.s)
SELECT run_id, rank, event_id, name, s, e - s, (cov_e - cov_s)::BIGINT,
       CASE WHEN e > s THEN (cov_e - cov_s) / (e - s) END
FROM ce ORDER BY ALL
"""

# pipeline_bubbles' lengths from the islands: compute islands per step, recv spans merged and
# intersected with them (the view before the summaries)
ISLANDS_BUBBLES = """
WITH rs AS (
    SELECT c.run_id, c.rank, e.step AS grp, e.ts_ns AS s, e.ts_ns + e.dur_ns AS e
    FROM collectives c JOIN events e USING (run_id, rank, event_id) WHERE c.op = 'recv' AND e.step IS NOT NULL
)
SELECT * FROM rs
"""


def damage_file(f, damage: str) -> None:
    """Damage the run file ``f``: "truncated" (its first 100 bytes), "not parquet" (text), or
    "another table's file" (the run's ranks.parquet in its place)."""
    if damage == "truncated":
        f.write_bytes(f.read_bytes()[:100])
    elif damage == "not parquet":
        f.write_text("garbage")
    else:
        f.write_bytes((f.parent / "ranks.parquet").read_bytes())


def _rows(con, q):
    return con.execute(q).fetchall()


def _islands_lengths(con):
    out: dict = {}
    for name, i in (("comm_islands", 0), ("compute_islands", 1), ("overlap_islands", 2)):
        for run, rank, grp, n in _rows(con, f"SELECT run_id, rank, grp, sum(e - s) FROM {name} GROUP BY ALL"):
            out.setdefault((run, rank, grp), [0, 0, 0])[i] = int(n)
    return {k: tuple(v) for k, v in out.items() if v[0] + v[1] > 0}


def _recv_lengths(con):
    """(run, rank, step) → (|∪ recv|, |∪ recv ∩ ∪ compute|) from the islands macros."""
    con.execute("CREATE OR REPLACE TEMP VIEW _t_recv AS " + ISLANDS_BUBBLES)
    con.execute("CREATE OR REPLACE TEMP VIEW _t_recv_isl AS SELECT * FROM merge_intervals('_t_recv')")
    con.execute("CREATE OR REPLACE TEMP VIEW _t_hid AS SELECT * FROM intersect_islands('_t_recv_isl', 'compute_islands')")
    r = {k[:3]: int(k[3]) for k in _rows(con, "SELECT run_id, rank, grp, sum(e - s) FROM _t_recv_isl GROUP BY ALL")}
    h = {k[:3]: int(k[3]) for k in _rows(con, "SELECT run_id, rank, grp, sum(e - s) FROM _t_hid GROUP BY ALL")}
    return {k: (v, h.get(k, 0)) for k, v in r.items()}


def _ingest(tmp_path, source):
    if source.startswith("fixture:"):
        path = FIXTURES / source.split(":", 1)[1]
    elif source.startswith("synth:"):
        truth = synth.make_job(tmp_path / "job", 8, FIXTURES / "3d_2x2x2" / "rank0.pt.trace.json.gz",
                               layout="tp2xpp2xdp", seed=3, straggler=6, gpus_per_node=2, compute_events=150)
        path = truth["traces_dir"]
    else:
        path = shared_trace(source)
    st = Store(tmp_path / "s")
    ingest_paths([path], st, run_id="r")
    return st


SOURCES = ["fixture:tp_2rank", "fixture:pp_2rank", "fixture:3d_2x2x2", "synth:8", "param_dlrm_8rank_v100",
           "hta_pyper_a100_r0of16"]  # the last: comm spans with no collective op (op NULL)


@pytest.mark.parametrize("source", SOURCES)
def test_stored_summaries_equal_the_islands(source, tmp_path):
    st = _ingest(tmp_path, source)
    con = analyses.connect(st)
    got = {(r, k, g): (cm, cp, ov) for r, k, g, cm, cp, ov in _rows(
        con, "SELECT run_id, rank, grp, comm_ns, compute_ns, overlap_ns FROM overlap_windows "
             "WHERE comm_ns + compute_ns > 0")}
    assert got == _islands_lengths(con) and len(got) > 2
    # every rank has its whole-trace row in the store, every window with spans one row
    assert _rows(con, "SELECT count(*) FROM overlap_summary WHERE grp = -1") == _rows(con, "SELECT count(*) FROM ranks")
    calls = _rows(con, "SELECT run_id, rank, event_id, name, ts_ns, dur_ns, overlap_ns, overlap_fraction "
                       "FROM collective_overlap ORDER BY ALL")
    assert calls == _rows(con, ISLANDS_CALL_OVERLAP) and len(calls) > 2
    recv = {(r, k, g): (a, b) for r, k, g, a, b in _rows(
        con, "SELECT run_id, rank, grp, recv_ns, recv_hidden_ns FROM overlap_summary WHERE recv_ns > 0")}
    assert recv == _recv_lengths(con)
    # first start / last end of each (rank, step): the events', on the run's clock (after the offsets)
    want = _rows(con, "SELECT run_id, rank, step, min(ts_ns), max(ts_ns + dur_ns) FROM events "
                      "WHERE class IN ('comm', 'compute') AND step IS NOT NULL GROUP BY ALL ORDER BY ALL")
    assert _rows(con, "SELECT run_id, rank, grp, first_ns, last_ns FROM overlap_summary WHERE grp >= 0 "
                      "ORDER BY ALL") == want


def test_pp_summaries_hold_recv_time_hidden_and_not(tmp_path):
    con = analyses.connect(_ingest(tmp_path, "fixture:pp_2rank"))
    (n, hidden, total), = _rows(con, "SELECT count(*), sum(recv_hidden_ns), sum(recv_ns) FROM overlap_summary "
                                     "WHERE recv_ns > 0")
    assert n >= 2 and 0 < total and 0 <= hidden < total  # gloo recvs on the CPU: mostly exposed


def test_clock_offsets_shift_the_summaries_timestamps_only(tmp_path):
    st = _ingest(tmp_path, "synth:8")
    con = analyses.connect(st)
    assert _rows(con, "SELECT count(DISTINCT clock_offset_ns) FROM ranks")[0][0] > 1
    # span_overlap's starts are the (shifted) events' starts, row for row
    assert _rows(con, "SELECT count(*) FROM span_overlap o JOIN events e USING (run_id, rank, event_id) "
                      "WHERE o.ts_ns IS DISTINCT FROM e.ts_ns") == [(0,)]


def test_summaries_fed_in_small_chunks_are_the_same(tmp_path, monkeypatch):
    """intervals.SUMMARY_CHUNK rows at a time: 3 instead of 65,536 (every fixture fits one chunk)
    gives the same stored rows; in this process (jobs=1), so the patched size applies."""
    import tracekit.timeline.intervals as iv

    src = FIXTURES / "3d_2x2x2"
    tables = ("overlap_summary", "span_overlap")
    whole = Store(tmp_path / "whole")
    ingest_paths([src], whole, run_id="r", jobs=1)
    monkeypatch.setattr(iv, "SUMMARY_CHUNK", 3)
    small = Store(tmp_path / "small")
    ingest_paths([src], small, run_id="r", jobs=1)
    got = [_rows(small.connect(), f"SELECT * FROM {t} ORDER BY ALL") for t in tables]
    assert got == [_rows(whole.connect(), f"SELECT * FROM {t} ORDER BY ALL") for t in tables] and all(got)


def test_a_damaged_collectives_file_names_it(tmp_path, capsys):
    """A damaged collectives file (not a summary): one line naming it and --replace, exit 2."""
    from tracekit.cli import main

    st = _ingest(tmp_path, "fixture:pp_2rank")
    d = st.run_dir("r").resolve()
    (d / "collectives.parquet").write_bytes(b"PAR1")
    capsys.readouterr()
    assert main(["analyze", "--store", str(st.path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tracekit: {d / 'collectives.parquet'}: not a readable Parquet file") and "--replace" in err

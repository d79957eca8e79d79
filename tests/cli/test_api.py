"""tracekit.open: every public method of the Python API on the TP fixture, against the SQL views.

fixtures/tp_2rank (NOTE.md): 2 ranks, 8 all-reduces of 2·64·256·4 = 131,072 B per rank.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tracekit
from tests.conftest import FIXTURES, REPO
from tracekit import analyses
from tracekit.errors import BadInputError, StoreError

TP = FIXTURES / "tp_2rank"


@pytest.fixture(scope="module")
def tk(tmp_path_factory):
    return tracekit.open(tmp_path_factory.mktemp("api"))


@pytest.fixture(scope="module")
def run(tk):
    r = tk.ingest(TP)
    yield r
    r.close()


@pytest.fixture(scope="module")
def views(tk, run):
    """An independent connection to the same store: what `tracekit sql` sees."""
    con = analyses.connect(tk.store, run_ids=[run.run_id])
    yield con
    con.close()


def _same(df, con, sql, cols):
    """The DataFrame's columns ``cols`` (API names) equal the view's rows of ``sql``, in order."""
    want = [tuple(r) for r in con.execute(sql).fetchall()]
    got = [tuple(None if v != v else v for v in row) for row in df[cols].itertuples(index=False)]  # NaN → None
    want = [tuple(None if isinstance(v, float) and v != v else v for v in row) for row in want]
    assert got == want


def test_open_is_lazy_and_empty_store(tmp_path):
    tk = tracekit.open(tmp_path / "nothing-here")
    assert not (tmp_path / "nothing-here").exists()
    df = tk.runs()
    assert len(df) == 0 and "run_id" in df.columns
    with pytest.raises(StoreError, match="no runs"):
        tk.run()


def test_runs(tk, run):
    df = tk.runs()
    assert df["run_id"].tolist() == [run.run_id]
    row = df.iloc[0]
    cfg = json.loads((TP / "run_config.json").read_text())
    assert (row["workload"], row["backend"], int(row["world_size"]), int(row["ranks"])) == ("tp", "gloo", cfg["ranks"], 2)


def test_run_default_newest_unknown_and_lazy(tk, run):
    r = tk.run()
    assert r.run_id == run.run_id and r._con is None  # nothing opened yet
    assert r.sql("SELECT count(*) FROM events").fetchall()[0][0] > 0
    assert r.con.analyses.built == []  # a query of a base view builds no analysis
    r.close()
    with pytest.raises(StoreError, match="is not in"):
        tk.run("no-such-run")
    with pytest.raises(BadInputError):
        tk.run(link="no-such-link")


def test_ingest_again_gives_same_run(tk, run):
    assert tk.ingest([TP]).run_id == run.run_id
    assert len(tk.runs()) == 1


def test_collectives(run, views):
    df = run.collectives()
    assert len(df) == 16 and set(df["size_bytes"]) == {131072} and set(df["op"]) == {"all_reduce"}
    assert {"log_algbw_GBps", "log_busbw_GBps", "ts_ns", "dur_ns"} <= set(df.columns)
    _same(df, views, "SELECT rank, event_id, ts_ns, dur_ns FROM collectives ORDER BY rank, ts_ns, event_id",
          ["rank", "event_id", "ts_ns", "dur_ns"])


def test_instances_and_waits_by_hand(run, views):
    inst, waits, coll = run.instances(), run.waits(), run.collectives()
    assert len(inst) == 8 and inst["complete"].all()
    # by hand from the per-rank calls: last arrival − first arrival, and wait = last arrival − start
    starts = coll.groupby("seq")["ts_ns"]
    skew = (starts.max() - starts.min()).sort_index()
    assert inst.set_index("seq")["skew_ns"].sort_index().tolist() == skew.tolist()
    last = coll.groupby("seq")["ts_ns"].transform("max")
    by_hand = (last - coll["ts_ns"]).groupby([coll["seq"], coll["rank"]]).sum()
    assert waits.set_index(["seq", "rank"])["wait_ns"].sort_index().tolist() == by_hand.sort_index().tolist()
    _same(inst, views, "SELECT seq, sync_time_ns, straggler FROM collective_instances "
          "ORDER BY first_arrival_ns, pg_name, seq", ["seq", "sync_time_ns", "straggler"])


def test_bandwidth_units(run, views):
    bw = run.bandwidth()
    assert {"algbw_GBps", "busbw_GBps", "sync_time_ns", "size_bytes"} <= set(bw.columns)
    # algbw = S / t; bytes per ns is GB/s (GB = 1e9); all-reduce on 2 ranks: bus factor 2(n−1)/n = 1
    for _, r in bw.iterrows():
        assert r["algbw_GBps"] == pytest.approx(131072 / r["sync_time_ns"], rel=1e-12)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"], rel=1e-12)
    _same(bw, views, "SELECT seq, algbw_gbps, busbw_gbps FROM collective_bandwidth ORDER BY pg_name, seq",
          ["seq", "algbw_GBps", "busbw_GBps"])


def test_overlap_by_rank_step_call(run, views):
    by_rank, by_step, by_call = run.overlap(), run.overlap(by="step"), run.overlap(by="call")
    assert by_rank["rank"].tolist() == [0, 1]
    assert (by_rank["exposed_comm_ns"] == by_rank["comm_ns"] - by_rank["overlap_ns"]).all()
    _same(by_rank, views, "SELECT rank, comm_ns, overlap_ns, exposed_comm_ns FROM overlap_by_rank ORDER BY rank",
          ["rank", "comm_ns", "overlap_ns", "exposed_comm_ns"])
    _same(by_step, views, "SELECT rank, step, comm_ns FROM overlap_by_step ORDER BY rank, step", ["rank", "step", "comm_ns"])
    _same(by_call, views, "SELECT rank, event_id, overlap_ns FROM collective_overlap ORDER BY rank, ts_ns, event_id",
          ["rank", "event_id", "overlap_ns"])
    with pytest.raises(BadInputError, match="rank, step, call"):
        run.overlap(by="host")


def test_fit_verdicts_measured_vs_model(run, views):
    fit = run.fit()
    assert fit["op"].tolist() == ["all_reduce"] and "beta_GBps" in fit.columns
    _same(fit, views, "SELECT op, group_size, status FROM alpha_beta_fit WHERE run_id = "
          f"'{run.run_id}' ORDER BY op, group_size", ["op", "group_size", "status"])
    v = run.verdicts()
    assert len(v) == 8
    _same(v, views, "SELECT seq, verdict FROM collective_verdicts ORDER BY pg_name, seq", ["seq", "verdict"])
    m = run.measured_vs_model()
    assert m["rank"].tolist() == [0, 1]
    _same(m, views, "SELECT rank, exposed_ns, model FROM measured_vs_model ORDER BY rank", ["rank", "exposed_ns", "model"])


def test_sql_relation(run):
    rel = run.sql("SELECT op, count(*) AS n FROM collective_bandwidth WHERE run_id = ? GROUP BY op", [run.run_id])
    assert rel.fetchall() == [("all_reduce", 8)]


def test_report_html_perfetto(run, tmp_path):
    rep = run.report()
    assert rep["run"]["run_id"] == run.run_id
    assert {c["op"]: c["count"] for c in rep["collectives"]} == {"all_reduce": 8}
    page = run.html(tmp_path / "r.html").read_text()
    assert page.startswith("<!DOCTYPE html>") or page.lower().startswith("<!doctype html>")
    stats = run.export_perfetto(tmp_path / "m.json")
    assert (stats.collectives, stats.instances_linked) == (16, 8)
    assert json.loads((tmp_path / "m.json").read_text())["traceEvents"]


def test_notebook_tour_runs(tmp_path):
    """examples/notebook_tour.py, as a user runs it."""
    p = subprocess.run([sys.executable, str(REPO / "examples" / "notebook_tour.py"), str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "all_reduce" in p.stdout and (tmp_path / "s" / "report.html").is_file()


def test_sql_is_confined_like_the_cli(run):
    """issue 17: the API's .sql() on a user's query reads the store only and refuses writes."""
    from tracekit.errors import BadInputError

    for q in ("SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/proc/self/environ')",
              "COPY (SELECT 1) TO 'x.csv'", "ATTACH 'x.db'", "SET threads = 1", "SELECT 1; SELECT 2",
              "EXPLAIN ANALYZE COPY (SELECT 1) TO 'x.csv'"):
        with pytest.raises(BadInputError):
            run.sql(q).fetchall()
    # the views still answer, on the confined connection
    assert run.sql("SELECT count(*) FROM collective_verdicts WHERE run_id = ?", [run.run_id]).fetchall()[0][0] >= 0

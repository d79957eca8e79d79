"""One door to the summary tables (tracekit.store.SUMMARY_TABLES): every ingest path writes the
summary files, the analyses read them and nothing else, and a run stored without one, or holding one
damaged, is refused in one line (exit 2, no traceback) that says to ingest it again with --replace;
the base views still answer for it, and the other runs of the store are unaffected."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest

from tests.analyses.test_overlap_summaries import damage_file
from tests.conftest import FIXTURES
from tracekit import analyses
from tracekit.cli import main
from tracekit.errors import StoreError
from tracekit.ingest import ingest_paths
from tracekit.report.data import build_report, report_connection
from tracekit.store import CRITICAL_PATH_TABLES, SUMMARY_TABLES, Store

FILES = [f"{t}.parquet" for t in SUMMARY_TABLES]


def _fr_dumps(d):
    """Two ranks' Flight Recorder dumps (torch 2.13's pickle form), two all-reduces each."""
    from tests.ingest.test_flight_recorder import dump, entry, write

    for rank in (0, 1):
        write(d, rank, dump([entry(1), entry(2)]))
    return d


def _source(name, tmp_path):
    return {"kineto_gpu": lambda: FIXTURES / "handmade" / "gpu_breakdown",
            "kineto_cpu_only": lambda: FIXTURES / "tp_2rank",
            "nsys": lambda: FIXTURES / "nsys_job" / "job_2proc.sqlite",
            "nccl_tests": lambda: FIXTURES / "nccl_tests" / "slurm-4242.out",
            "flight_recorder": lambda: _fr_dumps(tmp_path / "dumps")}[name]()


def _analyze(store, capsys, *args):
    """(exit code, stdout, stderr lines) of ``tracekit analyze --json`` on ``store``."""
    capsys.readouterr()
    rc = main(["analyze", "--store", str(store), "--json", *args])
    out, err = capsys.readouterr()
    return rc, out, err.splitlines()


@pytest.mark.parametrize("source", ["kineto_gpu", "kineto_cpu_only", "nsys", "nccl_tests", "flight_recorder"])
def test_every_ingest_path_writes_the_summary_files(source, tmp_path, capsys):
    st = Store(tmp_path / "s")
    ingest_paths([_source(source, tmp_path)], st, run_id="r")
    d = st.run_dir("r").resolve()
    assert [f for f in FILES if not (d / f).is_file()] == []
    con = analyses.connect(st)
    n = dict(zip(SUMMARY_TABLES, con.execute(
        "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in SUMMARY_TABLES)).fetchone()))
    ranks, gpu_ranks = con.execute("SELECT count(*), count(*) FILTER (WHERE gpu_events > 0) FROM ranks").fetchone()
    windows = con.execute("SELECT grp, comm_ns, compute_ns, overlap_ns FROM overlap_windows").fetchall()
    breakdown = con.execute("SELECT count(*) FROM gpu_time_breakdown").fetchone()[0]
    con.close()
    if source in ("nccl_tests", "flight_recorder"):  # no events: the files are there, empty
        assert n == dict.fromkeys(SUMMARY_TABLES, 0)
        assert windows == [(-1, 0, 0, 0)] * ranks and ranks >= 1 and breakdown == 0
    else:
        # a whole-trace overlap row per rank; GPU windows exactly for the ranks with GPU work
        assert n["overlap_summary"] >= ranks >= 1
        assert (n["gpu_breakdown_summary"] > 0) == (gpu_ranks > 0) == (source != "kineto_cpu_only")
        assert breakdown == n["gpu_breakdown_summary"]
    rc, out, err = _analyze(st.path, capsys)
    assert rc == 0 and json.loads(out)["run"]["run_id"] == "r"


@pytest.mark.slow  # a local Ray instance: run one at a time with the other multi-process tests (tests/conftest.py)
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'tracekit[ray]')")
def test_the_ray_engine_writes_the_summary_files(tmp_path):
    import ray

    st = Store(tmp_path / "s")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        ingest_paths([FIXTURES / "tp_2rank"], st, run_id="r", engine="ray")
    finally:
        if started:
            ray.shutdown()
    d = st.run_dir("r").resolve()
    assert [f for f in FILES if not (d / f).is_file()] == []
    con = analyses.connect(st)
    assert con.execute("SELECT count(*) FROM overlap_windows WHERE grp = -1 AND comm_ns > 0").fetchone()[0] == 2
    con.close()


@pytest.fixture(scope="module")
def tp_store(tmp_path_factory):
    """tp_2rank stored twice, as runs a and b, and b's report as JSON (the same trace: a's too)."""
    import shutil

    base = tmp_path_factory.mktemp("tp")
    st = Store(base / "s")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="a")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="b")
    return st, shutil


def _copy(tp_store, tmp_path) -> Store:
    st, shutil = tp_store
    shutil.copytree(st.path, tmp_path / "s", symlinks=True)
    return Store(tmp_path / "s")


def _report(store, capsys, run):
    rc, out, err = _analyze(store.path, capsys, "--run", run)
    assert rc == 0, err
    d = json.loads(out)
    d["run"].pop("created_at", None)
    return d


@pytest.fixture(scope="module")
def b_report(tp_store):
    """Run b's ``analyze --json`` on the untouched store (created_at left out), once for the module."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["analyze", "--store", str(tp_store[0].path), "--json", "--run", "b"]) == 0
    d = json.loads(buf.getvalue())
    d["run"].pop("created_at", None)
    return d


@pytest.mark.parametrize("gone", SUMMARY_TABLES)
def test_a_run_without_a_summary_file_is_refused_in_one_line(gone, tp_store, b_report, tmp_path, capsys):
    """One of the summary files removed from run a: analyze a exits 2 with the one line; the base views
    still read a; run b of the same store reports as before; ingest --replace mends a."""
    st = _copy(tp_store, tmp_path)
    before = copy.deepcopy(b_report)
    (st.run_dir("a").resolve() / f"{gone}.parquet").unlink()
    rc, out, err = _analyze(st.path, capsys, "--run", "a")
    assert (rc, out) == (2, "")
    assert err == [f"tracekit: run 'a' was stored without {gone} ({gone}.parquet): ingest it again with --replace "
                   f"(its traces: {FIXTURES / 'tp_2rank'}, --run-id a)"]
    assert _report(st, capsys, "b") == before
    capsys.readouterr()
    assert main(["sql", "SELECT count(*) AS n FROM events WHERE run_id = 'a'", "--store", str(st.path),
                 "--format", "csv"]) == 0
    assert int(capsys.readouterr().out.split()[-1]) > 0
    view = {"overlap_summary": "overlap_by_rank", "span_overlap": "overlap_by_rank",
            "collective_steps": "measured_vs_model", **dict.fromkeys(CRITICAL_PATH_TABLES, "critical_path")
            }.get(gone, "gpu_time_breakdown")
    assert main(["sql", f"SELECT * FROM {view}", "--store", str(st.path), "--run", "a"]) == 2
    assert capsys.readouterr().err.splitlines() == err
    if gone in CRITICAL_PATH_TABLES:  # a report without the critical path reads none of its tables
        rc, out, _ = _analyze(st.path, capsys, "--run", "a", "--no-critical-path")
        assert rc == 0 and json.loads(out)["critical_path"]["skipped"] == "left out (--no-critical-path)"
    # the report refuses it before building any analysis (not after most of the report)
    rid, rcon = report_connection(st, "a")
    try:
        with pytest.raises(StoreError, match=f"^run 'a' was stored without {gone} "):
            build_report(st, rid, con=rcon)
        assert rcon.analyses.built == []
    finally:
        rcon.close()
    # a connection over every run: the analyses refuse it, naming the run
    con = analyses.connect(st)
    with pytest.raises(StoreError, match=f"^run 'a' was stored without {gone} "):
        con.execute(f"SELECT * FROM {view}").fetchall()
    con.close()
    assert main(["ingest", str(FIXTURES / "tp_2rank"), "--store", str(st.path), "--run-id", "a", "--replace"]) == 0
    after = _report(st, capsys, "a")
    before["run"]["run_id"] = "a"
    assert {k: v for k, v in after.items() if k != "ranks"} == {k: v for k, v in before.items() if k != "ranks"}


@pytest.mark.parametrize("damage", ["truncated", "not parquet", "another table's file"])
@pytest.mark.parametrize("table", ["span_overlap", "gpu_launcher_summary"])
def test_a_damaged_summary_file_is_refused_naming_it(table, damage, tp_store, tmp_path, capsys):
    st = _copy(tp_store, tmp_path)
    f = st.run_dir("a").resolve() / f"{table}.parquet"
    damage_file(f, damage)
    rc, out, err = _analyze(st.path, capsys, "--run", "a")
    assert (rc, out, len(err)) == (2, "", 1)
    why = "columns this table does not have" if damage == "another table's file" else "not a readable Parquet file"
    assert err[0].startswith(f"tracekit: {f}: {why}")
    assert err[0].endswith(f"; the run 'a' cannot be analyzed: ingest it again with --replace (its traces: "
                           f"{FIXTURES / 'tp_2rank'}, --run-id a)")
    assert _analyze(st.path, capsys, "--run", "b")[0] == 0


def test_an_old_nccl_tests_run_without_summary_files_blocks_no_report(tp_store, tmp_path, capsys):
    """A store's nccl-tests log stored before every run held the summary files (none of them: it has no
    events) is a calibration run of every report: run a still reports as before, and the log's own
    report works (its summaries are empty by definition)."""
    st = _copy(tp_store, tmp_path)
    before = _report(st, capsys, "a")
    assert main(["ingest", str(FIXTURES / "nccl_tests" / "slurm-4242.out"), "--store", str(st.path),
                 "--run-id", "oldlog"]) == 0
    capsys.readouterr()
    d = st.run_dir("oldlog").resolve()
    for t in SUMMARY_TABLES:
        (d / f"{t}.parquet").unlink()  # the layout of a log stored before
    after = _report(st, capsys, "a")
    assert after["overlap_by_rank"] == before["overlap_by_rank"]
    assert after["gpu_time_breakdown"] == before["gpu_time_breakdown"]
    assert _analyze(st.path, capsys, "--run", "oldlog")[0] == 0

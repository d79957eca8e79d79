"""Real hangs of real gloo jobs, recorded with Flight Recorder by `tracekit profile --fr`, and the
triage tracekit gives; compared with torchfrtrace (installed with torch) on the same dumps.

Each job is tracekit/collectors/workloads/fr_demo.py (an all_reduce per step) with one fault
injected (tracekit.collectors.faults), so the right answer is known: the collective seq of the
faulty step is step + 1 (collective_seq_id counts from 1; no collective precedes the loop), the
culprit is the injected rank.

torchfrtrace (torch 2.13) on these gloo dumps as torch writes them raises KeyError in
build_collectives: gloo leaves pg_config empty. Given the groups tracekit's agent records (its
``tracekit.groups`` key written into pg_config), it answers; where both answer they agree on the
collective and its kind; on a two-rank mismatch (a tie) torchfrtrace names rank 0, tracekit the
higher rank (culprit_basis 'tie': the lowest rank presumed right) — the tests pin both.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tracekit import analyses  # noqa: E402
from tracekit.cli import main  # noqa: E402
from tracekit.store import Store  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "tracekit" / "collectors" / "workloads" / "fr_demo.py"


def _job(tmp_path, monkeypatch, nproc, *demo_args, timeout=None, active=1):
    """Run fr_demo under `tracekit profile --fr`; returns (exit code, wall s, stdout, hang_divergence row, run dir)."""
    monkeypatch.setenv("PYTHONPATH", str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), str(DEMO),
           "--steps", "4", *demo_args]
    opts = ["--fr", "--wait", "0", "--warmup", "0", "--active", str(active), "--run-id", "job"]
    if timeout is not None:
        opts += ["--timeout", str(timeout)]
    t0 = time.monotonic()
    rc = main(["profile", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "runs"), *opts, "--", *cmd])
    wall = time.monotonic() - t0
    con = analyses.connect(Store(tmp_path / "store"))
    cur = con.execute("SELECT * FROM hang_divergence")
    row = dict(zip([c[0] for c in cur.description], cur.fetchone()))
    row["dumped"] = [r for (r,) in con.execute("SELECT rank FROM fr_dumps ORDER BY rank").fetchall()]
    return rc, wall, row, tmp_path / "runs" / "job"


def _torchfrtrace(run_dir: Path, tmp_path: Path, with_groups: bool) -> str:
    """torchfrtrace's output on the run's dumps, as pickles named torch's way (prefix + rank): what
    its ``main`` (the ``torchfrtrace`` command's entry point) prints and logs, then the traceback of
    what it raised. Run in this process, which has imported torch already (a ``torchfrtrace``
    process would spend seconds importing it again)."""
    import contextlib
    import io
    import logging
    import traceback

    from torch.distributed.flight_recorder import fr_trace

    d = tmp_path / ("tf-groups" if with_groups else "tf-raw")
    d.mkdir()
    for f in sorted(run_dir.glob("fr-rank*.json")):
        dump = json.loads(f.read_text())
        tk = dump.pop("tracekit")
        if with_groups:
            dump["pg_config"] = {n: {"name": n, "desc": g["desc"], "ranks": json.dumps(g["ranks"])}
                                 for n, g in tk["groups"].items()}
        (d / f"fr_trace_rank_{tk['rank']}").write_bytes(pickle.dumps(dump))
    out = io.StringIO()
    log = logging.getLogger("Flight Recorder")  # torchfrtrace's logger (its handler: the stderr of its first use)
    handlers, log.handlers = log.handlers, [logging.StreamHandler(out)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                fr_trace.main([str(d)])
            except Exception:  # noqa: BLE001 - its traceback is what the command would print
                out.write(traceback.format_exc())
    finally:
        log.handlers = handlers
    return out.getvalue()


def test_a_rank_that_never_arrives_ends_within_the_timeout(tmp_path, monkeypatch, capsys):
    # the process group would wait 120 s; --timeout stops the job after 25 s (start-up on a loaded 2-core
    # machine can take 10 s: a shorter limit may stop a rank that is slow, not hung), every rank dumping first
    rc, wall, d, run_dir = _job(tmp_path, monkeypatch, 2, "--inject", "hang:1@2", "--pg-timeout", "120", timeout=25,
                                active=4)  # the profiler records through the hang
    out = capsys.readouterr()
    assert rc == 124, out.err
    assert wall < 25 + 20  # the timeout, then SIGTERM (5 s to SIGKILL), the ingest and the report
    assert d["dumped"] == [0, 1] and d["ranks_without_dump"] == []
    assert (d["match_state"], d["pg_name"], d["seq"], d["op"]) == ("missing_ranks", "0", 3, "all_reduce")
    assert d["culprit_ranks"] == [1] and d["culprit_basis"] == "missing" and d["waiting_ranks"] == [0]
    assert (d["culprit_last_op"], d["culprit_last_seq"]) == ("all_reduce", 2)  # it finished step 1, then slept
    assert d["waited_ns"] > 0
    assert "first divergence: group 0 (default_pg), seq 3, all_reduce: missing_ranks" in out.out
    assert "the job ran past --timeout 25 s" in out.err
    # placed on the Kineto timeline: the offset estimated from the collectives (hang.timeline_offset) against
    # the traces' own baseTimeNanoseconds (Kineto time + base = wall clock); FR stamps ~tens of µs after Kineto
    import gzip

    base = json.loads(gzip.open(run_dir / "rank0.pt.trace.json.gz").read())["baseTimeNanoseconds"]
    assert d["timeline_pairs"] >= 2 and 0 <= d["timeline_offset_ns"] - base < 1_000_000
    export = tmp_path / "p.json"
    assert main(["export", "--perfetto", str(export), "--store", str(tmp_path / "store"), "--run", "job"]) == 0
    marks = [e for e in json.loads(export.read_text())["traceEvents"] if e.get("cat") == "tracekit.hang"]
    assert [m["name"] for m in marks] == ["hang: missing_ranks in group 0 seq 3 (all_reduce)"]
    assert "on the traces' timeline" in out.out and "after their first event" in out.out
    raw = _torchfrtrace(run_dir, tmp_path, with_groups=False)
    assert "KeyError" in raw and "build_collectives" in raw  # torch 2.13 on gloo's empty pg_config
    both = _torchfrtrace(run_dir, tmp_path, with_groups=True)
    assert "Not all ranks joining collective, sequence number: 3" in both and "missing ranks: {1}" in both


def test_a_different_op(tmp_path, monkeypatch, capsys):
    rc, _wall, d, run_dir = _job(tmp_path, monkeypatch, 2, "--inject", "op:1@1", "--pg-timeout", "4")
    capsys.readouterr()
    assert rc != 0  # rank 0's all_reduce times out after 4 s
    assert (d["match_state"], d["seq"], d["culprit_ranks"], d["culprit_basis"]) == ("op_mismatch", 2, [1], "tie")
    assert d["detail"] == "rank 1: broadcast where rank(s) 0 have all_reduce"
    both = _torchfrtrace(run_dir, tmp_path, with_groups=True)
    assert "COLLECTIVE_TYPE_MISMATCH" in both and "Culprit rank 0" in both  # the tie read the other way


def test_a_different_size(tmp_path, monkeypatch, capsys):
    rc, _wall, d, run_dir = _job(tmp_path, monkeypatch, 2, "--inject", "size:1@1", "--pg-timeout", "4")
    capsys.readouterr()
    assert rc == 0  # same bytes, another shape: gloo runs on, Flight Recorder records the shapes
    assert (d["match_state"], d["seq"], d["culprit_ranks"]) == ("size_mismatch", 2, [1])
    assert d["detail"] == "rank 1: in [[2, 512]] out [[2, 512]] where rank(s) 0 have in [[1024]] out [[1024]]"
    both = _torchfrtrace(run_dir, tmp_path, with_groups=True)
    assert "SIZE_OR_SYNTAX_MISMATCH" in both


def test_four_ranks_one_never_arrives(tmp_path, monkeypatch, capsys):
    rc, _wall, d, _run_dir = _job(tmp_path, monkeypatch, 4, "--inject", "hang:2@1", "--pg-timeout", "4", timeout=40)
    capsys.readouterr()
    assert rc != 0
    assert d["dumped"] == [0, 1, 2, 3]
    assert (d["match_state"], d["seq"], d["culprit_ranks"], d["waiting_ranks"]) == ("missing_ranks", 2, [2], [0, 1, 3])


def test_four_ranks_a_different_op_names_the_minority(tmp_path, monkeypatch, capsys):
    rc, _wall, d, _run_dir = _job(tmp_path, monkeypatch, 4, "--inject", "op:3@1", "--pg-timeout", "4", timeout=40)
    capsys.readouterr()
    assert (d["match_state"], d["seq"], d["culprit_ranks"], d["culprit_basis"]) == ("op_mismatch", 2, [3], "majority")


def test_a_healthy_job_is_fully_matched(tmp_path, monkeypatch, capsys):
    rc, _wall, d, _run_dir = _job(tmp_path, monkeypatch, 2, "--pg-timeout", "20")
    out = capsys.readouterr()
    assert rc == 0, out.err
    # 4 step all_reduces + the closing barrier (gloo records it as an all_reduce-like 'barrier' entry)
    assert d["match_state"] == "fully_matched" and d["dumped"] == [0, 1] and d["instances"] == 5
    assert "no divergence" in out.out


def test_fr_only_counts_the_collectives_without_a_profiler(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(DEMO),
           "--steps", "5", "--numel", "256"]
    rc = main(["profile", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "runs"), "--fr-only",
               "--run-id", "fo", "--", *cmd])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert not list((tmp_path / "runs" / "fo").glob("*.pt.trace.json.gz"))  # no profiler ran
    from tracekit.report.data import build_report

    rep = build_report(Store(tmp_path / "store"), "fo")
    rows = {r["op"]: r for r in rep["hang"]["collectives"]}
    # 5 steps × 2 ranks all_reduces of 256 float32 = 1024 B each; gloo records no duration
    ar = rows["all_reduce"]
    assert (ar["in_bytes"], ar["calls"], ar["ranks"], ar["instances"], ar["timed"]) == (1024, 10, 2, 5, 0)
    assert ar["median_duration_ns"] is None
    assert rep["hang"]["divergence"]["match_state"] == "fully_matched"
    assert json.loads((tmp_path / "runs" / "fo" / "run_config.json").read_text())["flight_recorder"]["only"] is True

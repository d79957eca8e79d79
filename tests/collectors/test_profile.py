"""`tracekit profile -- CMD` and the Python API, on real jobs.

The scripts under tests/scripts are written as users write them: ddp_train.py
(DDP + SGD, no tracekit import), infer_loop.py (no optimizer, calls
tracekit.step()), plain_train.py (never initialises torch.distributed).
Jobs run through ``python -m torch.distributed.run --standalone`` (a free
rendezvous port, so parallel runs cannot collide).
"""

from __future__ import annotations

from tracekit import analyses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tracekit.collectors.profile import agent as agent_mod  # noqa: E402
from tracekit.collectors.profile import runner  # noqa: E402
from tracekit.cli import main  # noqa: E402
from tracekit.store import Store  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

# parameters of ddp_train.MLP: fc1 64→256, fc2 256→256, head 256→10 (weights + biases), float32
DDP_GRAD_BYTES = 4 * ((64 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10))


def _profile(tmp_path, *args, command):
    return main(["profile", "--store", str(tmp_path / "store"), "--out", str(tmp_path / "runs"), *args, "--", *command])


def _run(tmp_path) -> tuple[str, dict, object]:
    st = Store(tmp_path / "store")
    con = analyses.connect(st)
    (rid, cfg) = con.execute("SELECT run_id, config FROM runs").fetchone()
    return rid, json.loads(cfg), con


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize("args", [["profile"], ["profile", "--"], ["profile", "python", "x.py"],
                                  ["profile", "--active", "2", "torchrun", "--nproc-per-node", "2", "t.py"]])
def test_without_dashdash_or_command_exits_2(args, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tracekit: usage: tracekit profile [OPTIONS] -- COMMAND")
    assert not (tmp_path / "tracekit-runs").exists()  # nothing started


def test_bad_schedule_exits_2(capsys, tmp_path):
    assert _profile(tmp_path, "--active", "0", command=["python", "-c", "pass"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["tracekit: --active must be an integer >= 1, got 0"]
    assert _profile(tmp_path, "--expect-ranks", "0", command=["python", "-c", "pass"]) == 2  # before "running ..."
    assert capsys.readouterr().err.strip().splitlines() == ["tracekit: --expect-ranks must be an integer >= 1, got 0"]


def test_unknown_command_exits_2(capsys, tmp_path):
    assert _profile(tmp_path, command=["no-such-command-tk"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "tracekit: no-such-command-tk: command not found"
    assert list((tmp_path / "runs").iterdir()) == []  # its run folder was removed


def test_help_says_how_to_keep_overhead_low(capsys):
    main(["profile", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "-- COMMAND" in out and "overhead" in out.lower() and "--with-stack" in out and "--active" in out


# --------------------------------------------------------------------------- pieces


def test_overhead_pct():
    assert agent_mod.overhead_pct([1.2, 1.2, 1.3], [1.0, 1.0]) == pytest.approx(20.0)
    assert agent_mod.overhead_pct([1.2], [1.0, 1.0]) is None
    assert agent_mod.overhead_pct([1.2, 1.2], [1.0]) is None


def test_gather_reports_missing_ranks_and_overhead(tmp_path):
    run_dir = tmp_path / "external-x"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "rank0.pt.trace.json.gz").write_bytes(b"")
    (run_dir / "rank2.pt.trace.json.tmp99.gz").write_bytes(b"")  # an export cut short
    base = dict(dist=True, world_size=4, finished=True, notes=[], traces=[], steps=5, claimed=True)
    statuses = [
        dict(base, pid=1, rank=0, overhead_pct=10.0, traces=["rank0.pt.trace.json.gz"], step_source="optimizer"),
        dict(base, pid=2, rank=1, overhead_pct=None, exit_reason="SIGTERM", phase_at_stop="warmup", steps=1),
        dict(base, pid=3, rank=2, finished=False, steps=0),
    ]
    for s in statuses:
        (run_dir / "logs" / f"agent.{s['pid']}.json").write_text(json.dumps(s))
    res = runner.JobResult(run_id=run_dir.name, run_dir=run_dir, command=["x"], exit_code=1, interrupted=False, wall_s=1.0)
    import datetime as dt

    runner.gather(res, runner.ProfileOptions(), dt.datetime.now(dt.timezone.utc))
    cfg = res.config
    assert (cfg["world_size"], cfg["missing_ranks"], cfg["partial"]) == (4, [1, 2, 3], True)
    assert cfg["profiler_overhead_pct"] == 10.0 and cfg["profiler"]["step_source"] == "optimizer"
    text = "\n".join(cfg["notes"])
    assert "rank 1: no trace (stopped (SIGTERM) after 1 step(s), in the warmup phase" in text
    assert "rank 2: no trace (its process ended without running its exit handlers" in text
    assert "rank 3: no trace and no agent status" in text
    assert not (run_dir / "rank2.pt.trace.json.tmp99.gz").exists()
    assert json.loads((run_dir / "run_config.json").read_text())["partial"] is True


def test_existing_sitecustomize_still_runs(tmp_path):
    """The injected sitecustomize chains to the one it shadows."""
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    mark = tmp_path / "mark.txt"
    (user_site / "sitecustomize.py").write_text(f"open({str(mark)!r}, 'w').write('ran')\n")
    env_before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(user_site) + (os.pathsep + env_before if env_before else "")
    try:
        res = runner.run_job(
            [sys.executable, "-c", "import sys; assert '_tracekit_profile_agent' in sys.modules"],
            runner.ProfileOptions(out=str(tmp_path / "runs")),
        )
    finally:
        if env_before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = env_before
    assert res.exit_code == 0
    assert mark.read_text() == "ran"
    assert res.traces == {} and res.statuses == []  # no torch.distributed, no step: not profiled


# --------------------------------------------------------------------------- real jobs


@pytest.mark.slow
def test_ddp_training_under_torchrun(tmp_path, capsys):
    rc = _profile(tmp_path, command=[*TORCHRUN, str(SCRIPTS / "ddp_train.py"), "--steps", "8"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "Collectives per op" in out.out  # the report
    rid, cfg, con = _run(tmp_path)
    assert cfg["workload"] == "external" and cfg["partial"] is False and cfg["exit_code"] == 0
    assert cfg["command"][-3:] == [str(SCRIPTS / "ddp_train.py"), "--steps", "8"]
    assert cfg["profiler"]["step_source"] == "optimizer" and cfg["world_size"] == 2
    assert con.execute("SELECT workload, world_size FROM runs").fetchone() == ("external", 2)
    assert [r[0] for r in con.execute("SELECT rank FROM ranks ORDER BY rank").fetchall()] == [0, 1]
    # one DDP bucket per step: 3 active steps → 3 gradient all-reduces, matched on both ranks
    rows = con.execute(
        "SELECT op, size_bytes, ranks_seen FROM collective_instances WHERE complete AND NOT disagree ORDER BY seq"
    ).fetchall()
    assert rows == [("all_reduce", DDP_GRAD_BYTES, 2)] * 3
    # 8 steps: 3 recorded, idle ones after the window → overhead measured
    assert "profiler_overhead_pct" in cfg and set(cfg["profiler_overhead"]["per_rank_pct"]) == {"0", "1"}


@pytest.mark.slow
def test_inference_loop_with_tracekit_step(tmp_path, capsys):
    rc = _profile(tmp_path, "--wait", "0", "--active", "2",
                  command=[*TORCHRUN, str(SCRIPTS / "infer_loop.py"), "--steps", "5"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rid, cfg, con = _run(tmp_path)
    assert cfg["profiler"]["step_source"] == "tracekit.step"
    assert [r[0] for r in con.execute("SELECT rank FROM ranks ORDER BY rank").fetchall()] == [0, 1]
    rows = con.execute(
        "SELECT op, size_bytes, ranks_seen FROM collective_instances WHERE complete AND NOT disagree ORDER BY seq"
    ).fetchall()
    assert rows == [("all_reduce", 128 * 4, 2)] * 2
    steps = con.execute("SELECT DISTINCT step FROM events WHERE step IS NOT NULL ORDER BY step").fetchall()
    assert [s[0] for s in steps] == [1, 2]
    # on gloo the agent names each call's group in the trace (tracekit.collectors.pg_labels): one range per
    # recorded all-reduce on each rank, the default group's name ("0")
    labels = con.execute("SELECT rank, name, count(*) FROM events WHERE name LIKE 'tracekit.process_group:%' "
                         "GROUP BY ALL ORDER BY rank").fetchall()
    assert labels == [(0, "tracekit.process_group:0", 2), (1, "tracekit.process_group:0", 2)]


@pytest.mark.slow
def test_crash_on_rank_1_gives_a_partial_run(tmp_path, capsys):
    rc = _profile(tmp_path, "--wait", "0", "--warmup", "1", "--active", "3",
                  command=[*TORCHRUN, str(SCRIPTS / "ddp_train.py"), "--steps", "8", "--crash-rank", "1"])
    err = capsys.readouterr().err
    rid, cfg, con = _run(tmp_path)
    assert rc == cfg["exit_code"] != 0
    assert cfg["partial"] is True and cfg["missing_ranks"] == [1] and cfg["ranks_with_trace"] == [0]
    assert [r[0] for r in con.execute("SELECT rank FROM ranks").fetchall()] == [0]
    assert "rank 1: no trace" in err
    last = err.strip().splitlines()[-1]
    assert last == f"tracekit: run {rid} is partial: the job exited with code {rc}; no trace from rank(s) 1"


def test_job_without_torch_distributed_is_one_rank(tmp_path, capsys):
    rc = _profile(tmp_path, command=[sys.executable, str(SCRIPTS / "plain_train.py")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    rid, cfg, con = _run(tmp_path)
    assert cfg["world_size"] == 1 and cfg["distributed"] is False
    assert any("never initialised torch.distributed" in n for n in cfg["notes"])
    assert "never initialised torch.distributed" in out.err
    assert con.execute("SELECT count(*) FROM ranks").fetchone() == (1,)


def _job_pids(marker_text: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker_text.encode() in (d / "environ").read_bytes():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc")
def test_ctrl_c_stops_the_job_and_keeps_the_traces(tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "tracekit", "profile", "--active", "1000", "--store", str(tmp_path / "store"),
           "--out", str(out), "--", *TORCHRUN, str(SCRIPTS / "ddp_train.py"), "--steps", "1000000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        recording = 0
        while time.monotonic() < deadline and recording < 2:
            time.sleep(0.2)
            recording = 0
            for f in out.glob("*/logs/agent.*.json"):
                try:
                    recording += json.loads(f.read_text()).get("phase") == "record"
                except ValueError:
                    pass
        assert recording == 2, "the ranks never reached the active window"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    (run_dir,) = out.iterdir()
    assert _job_pids(f"TRACEKIT_PROFILE_DIR={run_dir.resolve()}") == []  # no orphaned rank process
    cfg = json.loads((run_dir / "run_config.json").read_text())
    assert cfg["interrupted"] is True and cfg["partial"] is True and cfg["exit_code"] == 130
    assert cfg["ranks_with_trace"] == [0, 1]  # stopped inside the window: both wrote what they had
    assert "is partial: the job was interrupted" in stderr
    con = analyses.connect(Store(tmp_path / "store"))
    assert con.execute("SELECT count(*) FROM ranks").fetchone() == (2,)


# --------------------------------------------------------------------------- the Python API


def test_python_api_single_process(tmp_path, capsys):
    import tracekit

    x = torch.randn(64, 64)
    with tracekit.profile(store=tmp_path / "store", out=tmp_path / "runs", wait=1, warmup=1, active=2) as p:
        for i in range(6):
            for _ in range(3):
                x = torch.tanh(x @ x)
            if i % 2:
                p.step()
            else:
                tracekit.step()  # the same thing inside the block
    assert p.run_id is not None and p.trace is not None and p.trace.exists()
    assert "Overlap per rank" in capsys.readouterr().out  # the report was printed
    con = analyses.connect(Store(tmp_path / "store"))
    (cfg,) = con.execute("SELECT config FROM runs WHERE run_id = ?", [p.run_id]).fetchone()
    cfg = json.loads(cfg)
    assert cfg["workload"] == "external" and cfg["partial"] is False and cfg["api"] == "tracekit.profile"
    steps = con.execute("SELECT DISTINCT step FROM events WHERE step IS NOT NULL ORDER BY step").fetchall()
    assert [s[0] for s in steps] == [2, 3]
    mm = con.execute("SELECT count(*) FROM events WHERE name = 'aten::mm'").fetchone()[0]
    assert mm == 2 * 3


def test_tracekit_step_is_a_no_op_outside_profiling():
    import tracekit

    tracekit.step()  # nothing running: nothing happens


def test_import_tracekit_stays_light():
    code = "import sys, tracekit; tracekit.step; print('torch' in sys.modules, 'duckdb' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]

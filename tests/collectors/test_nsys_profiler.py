"""`tracekit collect tp --profiler nsys` and `tracekit profile --nsys`: running under Nsight Systems.

No real ``nsys`` was available where these tests were written (no GPU, Nsight
Systems not installable), so they check two things only:

- without ``nsys`` on PATH both commands fail first, with one line naming nsys,
  exit 2, and leave no run folder or store behind;
- with a FAKE ``nsys`` on PATH (a small Python script written here) the commands
  build the documented ``nsys profile ... --export=sqlite -o OUT CMD`` line, run
  every rank (or the job) under it, and ingest the ``OUT.sqlite`` the fake writes
  (a tiny file with the tables and columns of an nsys export, schema 3.x
  spelling, as tests/ingest/test_nsys.py builds them) as an ``nsys`` run.

What a real nsys does with the rank processes (passing stdin and the report pipe
on, CUDA capture, the real export) is not tested here.
"""

from __future__ import annotations

from tracekit import analyses
import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest

from tracekit.collectors.nsys import NOT_FOUND, find_nsys, nsys_command, sqlite_path
from tracekit.cli import main
from tracekit.errors import BadInputError
from tracekit.store import Store

# A stand-in for `nsys profile [switches] [-o OUT] [--] CMD...`: records its argv, runs CMD with
# stdin and every inherited descriptor passed on (launch's report pipe), then writes OUT.sqlite
# (nsys-shaped: one rank's NCCL all-reduce overlapping a GEMM, inside NVTX ProfilerStep#0) and
# OUT.nsys-rep, and exits with CMD's status.
FAKE_NSYS = r'''#!{python}
import json, os, sqlite3, subprocess, sys

args = sys.argv[1:]
if not args or args[0] != "profile":
    sys.exit("fake nsys: only `profile` is supported")
out, switches, i = None, {{}}, 1
while i < len(args):
    a = args[i]
    if a == "--":
        i += 1
        break
    if a in ("-o", "--output"):
        out, i = args[i + 1], i + 2
        continue
    if a.startswith("--") and "=" in a:
        key, value = a.split("=", 1)
        switches[key] = value
        if key == "--output":
            out = value
        i += 1
        continue
    if a.startswith("-"):
        sys.exit(f"fake nsys: unknown switch {{a}}")
    break
cmd = args[i:]
log_dir = os.environ["FAKE_NSYS_LOG"]
with open(os.path.join(log_dir, f"call-{{os.getpid()}}.json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "out": out, "switches": switches, "cmd": cmd}}, f)
rc = subprocess.call(cmd, close_fds=False)
if out and switches.get("--export") == "sqlite":
    path = out + ".sqlite"
    if switches.get("--force-overwrite") == "true" and os.path.exists(path):
        os.remove(path)
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
        CREATE TABLE TARGET_INFO_GPU (id INT, name TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT, contextId INT,
            streamId INT, correlationId INT, globalPid INT, demangledName INT, shortName INT,
            mangledName INT, graphNodeId INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, eventClass INT, globalTid INT,
            correlationId INT, nameId INT, returnValue INT, callchainId INT);
        CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, rangeId INT, category INT, color INT,
            text TEXT, globalTid INT, endGlobalTid INT, textId INT, domainId INT, uint64Value INT,
            int64Value INT, doubleValue REAL, uint32Value INT, int32Value INT, floatValue REAL,
            jsonTextId INT, jsonText TEXT);
        INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.13.2');
        INSERT INTO TARGET_INFO_GPU VALUES (0, 'Fake GPU');
        INSERT INTO StringIds VALUES (1, 'ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)');
        INSERT INTO StringIds VALUES (2, 'ncclDevKernel_AllReduce_Sum_f32_RING_LL');
        INSERT INTO StringIds VALUES (3, 'void gemm_kernel<128>(Params)');
        INSERT INTO StringIds VALUES (4, 'gemm_kernel');
        INSERT INTO StringIds VALUES (5, 'cudaLaunchKernel_v7000');
    """)
    pid, tid = 4242, 4243
    gtid = (1 << 56) | (pid << 24) | tid
    gpid = (1 << 56) | (pid << 24)
    nvtx = "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId, jsonText) VALUES (?, ?, 59, ?, ?, ?, ?)"
    db.execute(nvtx, (500, 9000, "ProfilerStep#0", gtid, 0, None))
    db.execute(nvtx, (1000, 1300, "ncclAllReduce", gtid, 1, '{{"Message size [bytes]": 4096}}'))
    api = "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, 5, 0, NULL)"
    db.execute(api, (1100, 1200, gtid, 7))
    db.execute(api, (1400, 1450, gtid, 8))
    kernel = "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 1, ?, ?, ?, ?, ?, ?, NULL)"
    db.execute(kernel, (2000, 3000, 20, 7, gpid, 1, 2, 2))
    db.execute(kernel, (2600, 3400, 7, 8, gpid, 3, 4, 4))
    db.commit()
    db.close()
    with open(out + ".nsys-rep", "w") as f:
        f.write("fake report\n")
sys.exit(rc)
'''


def _fake_nsys(tmp_path: Path, monkeypatch) -> Path:
    """Put the fake nsys first on PATH; returns the folder where it logs each call."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    exe = bin_dir / "nsys"
    exe.write_text(FAKE_NSYS.format(python=sys.executable))
    exe.chmod(0o755)
    log = tmp_path / "nsys-calls"
    log.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_NSYS_LOG", str(log))
    return log


def _calls(log: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(log.glob("call-*.json"))]


def _no_nsys(tmp_path: Path, monkeypatch) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


TINY_TP = ["--ranks", "2", "--layers", "1", "--hidden", "32", "--heads", "2", "--seq", "4", "--batch", "1",
           "--wait", "0", "--warmup", "0", "--active", "1", "--backend", "gloo"]


# -- the command line ---------------------------------------------------------------


def test_nsys_command_has_the_documented_switches(tmp_path):
    cmd = nsys_command("/opt/nsys/bin/nsys", tmp_path / "rank1")
    assert cmd == [
        "/opt/nsys/bin/nsys", "profile", "--trace=cuda,nvtx,osrt", "--export=sqlite", "--force-overwrite=true",
        "-o", str(tmp_path / "rank1"),
    ]
    assert "--capture-range=cudaProfilerApi" in nsys_command("nsys", "x", capture_range="cudaProfilerApi")
    assert sqlite_path(tmp_path / "rank1") == tmp_path / "rank1.sqlite"


def test_find_nsys(tmp_path, monkeypatch):
    _no_nsys(tmp_path, monkeypatch)
    with pytest.raises(BadInputError, match="nsys") as exc:
        find_nsys()
    assert str(exc.value) == NOT_FOUND and "\n" not in NOT_FOUND
    _fake_nsys(tmp_path, monkeypatch)
    assert find_nsys() == str(tmp_path / "fakebin" / "nsys")


# -- no nsys on PATH: a clear error, nothing started or created -----------------------


def test_collect_tp_without_nsys_exits_2_and_creates_nothing(tmp_path, monkeypatch, capsys):
    _no_nsys(tmp_path, monkeypatch)
    runs, store = tmp_path / "runs", tmp_path / "store"
    rc = main(["collect", "tp", *TINY_TP, "--profiler", "nsys", "--out", str(runs), "--store", str(store)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().splitlines() == [f"tracekit: {NOT_FOUND}"]
    assert not runs.exists() and not store.exists()


def test_profile_without_nsys_exits_2_and_starts_nothing(tmp_path, monkeypatch, capsys):
    _no_nsys(tmp_path, monkeypatch)
    marker = tmp_path / "ran"
    runs, store = tmp_path / "runs", tmp_path / "store"
    rc = main([
        "profile", "--nsys", "--store", str(store), "--out", str(runs), "--",
        sys.executable, "-c", f"open({str(marker)!r}, 'w')",
    ])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip().splitlines() == [f"tracekit: {NOT_FOUND}"]
    assert not marker.exists() and not runs.exists() and not store.exists()


def test_unknown_profiler_is_bad_input(capsys):
    assert main(["collect", "tp", "--profiler", "vtune"]) == 2
    assert "unknown profiler 'vtune'" in capsys.readouterr().err


# -- a fake nsys on PATH -------------------------------------------------------------


def test_profile_nsys_runs_the_job_under_nsys_and_ingests_job_sqlite(tmp_path, monkeypatch, capsys):
    log = _fake_nsys(tmp_path, monkeypatch)
    runs, store = tmp_path / "runs", tmp_path / "store"
    marker = tmp_path / "ran"
    job = [sys.executable, "-c", f"import os; open({str(marker)!r}, 'w').write(os.environ.get('PYTHONPATH', ''))"]
    rc = main(["profile", "--nsys", "--store", str(store), "--out", str(runs), "--", *job])
    err = capsys.readouterr().err
    assert rc == 0, err
    (call,) = _calls(log)
    (run_dir,) = runs.iterdir()
    assert call["cmd"] == job
    assert call["out"] == str(run_dir.resolve() / "job")
    assert call["switches"]["--export"] == "sqlite" and call["switches"]["--trace"] == "cuda,nvtx,osrt"
    # no torch.profiler agent injected: the job's PYTHONPATH has no tracekit site folder
    assert "tracekit-site-" not in marker.read_text()
    assert sorted(p.name for p in run_dir.iterdir()) == ["job.nsys-rep", "job.sqlite", "run_config.json"]
    cfg = json.loads((run_dir / "run_config.json").read_text())
    assert cfg["profiler"]["tool"] == "nsys" and cfg["profiler"]["one_file_for_all_ranks"]
    assert cfg["traces"] == ["job.sqlite"] and not cfg["partial"]
    assert any("all its processes (every rank) are in one file" in n for n in cfg["notes"])
    assert "one file" in err
    con = analyses.connect(Store(store))
    assert con.execute("SELECT source, world_size, workload FROM runs").fetchone() == ("nsys", 1, "external")
    assert con.execute("SELECT count(*) FROM events WHERE category = 'kernel'").fetchone()[0] == 2


def test_profile_nsys_job_failure_keeps_its_exit_code(tmp_path, monkeypatch, capsys):
    _fake_nsys(tmp_path, monkeypatch)
    runs, store = tmp_path / "runs", tmp_path / "store"
    rc = main(["profile", "--nsys", "--store", str(store), "--out", str(runs), "--",
               sys.executable, "-c", "raise SystemExit(3)"])
    assert rc == 3
    (run_dir,) = runs.iterdir()
    cfg = json.loads((run_dir / "run_config.json").read_text())
    assert cfg["partial"] and cfg["exit_code"] == 3


@pytest.mark.slow
def test_collect_tp_runs_every_rank_under_nsys_and_ingests_the_sqlite_files(tmp_path, monkeypatch, capsys):
    log = _fake_nsys(tmp_path, monkeypatch)
    runs, store = tmp_path / "runs", tmp_path / "store"
    rc = main(["collect", "tp", *TINY_TP, "--profiler", "nsys", "--out", str(runs), "--store", str(store)])
    err = capsys.readouterr().err
    assert rc == 0, err
    (run_dir,) = runs.iterdir()
    calls = _calls(log)
    assert sorted(c["out"] for c in calls) == [str(run_dir.resolve() / f"rank{r}") for r in (0, 1)]
    for c in calls:
        assert c["cmd"][:3] == [sys.executable, "-m", "tracekit.collectors._rank"]
        assert c["switches"]["--export"] == "sqlite"
        assert "--capture-range" not in c["switches"]  # gloo: the whole process is captured
    names = sorted(p.name for p in run_dir.iterdir() if p.is_file())
    assert names == ["rank0.nsys-rep", "rank0.sqlite", "rank1.nsys-rep", "rank1.sqlite", "run_config.json"]
    assert not list(run_dir.glob("*.pt.trace.json.gz"))  # torch.profiler stayed off
    cfg = json.loads((run_dir / "run_config.json").read_text())
    assert cfg["traces"] == ["rank0.sqlite", "rank1.sqlite"]
    assert cfg["profiler"]["tool"] == "nsys" and cfg["tp_check"]["passed"]
    con = analyses.connect(Store(store))
    assert con.execute("SELECT source, world_size, workload FROM runs").fetchone() == ("nsys", 2, "tp")
    assert con.execute("SELECT rank FROM ranks ORDER BY rank").fetchall() == [(0,), (1,)]
    assert con.execute("SELECT count(*), bool_and(complete) FROM collective_instances").fetchone() == (1, True)


def test_torch_run_config_is_unchanged_by_the_profiler_option():
    """The torch path's run_config.json has no new key (the option is not listed among the workload options)."""
    import datetime as dt

    from tracekit.collectors.workloads import tp

    cfg = tp.TPConfig(ranks=2, layers=1, hidden=32, heads=2, seq=4, batch=1).resolved()
    info = {"torch_version": "x", "python_version": "3", "platform": "p", "device_name": "cpu",
            "hostname": "h", "cpu_count": 2}
    results = [{"rank": r, "max_abs_err": 0.0, "rel_rms_err": 0.0, "criterion": "c", "step_s": [0.1] * cfg.steps,
                "threads": 1, "trace": f"rank{r}.pt.trace.json.gz", "trace_bytes": 1} for r in (0, 1)]
    doc = tp.build_run_config("tp-x", cfg, "gloo", info, results, 1.0, dt.datetime(2024, 1, 1))
    keys = list(doc)
    assert keys.index("profiler") > keys.index("threads_per_rank")
    assert "tool" not in doc["profiler"] and doc["profiler"]["record_shapes"] is True

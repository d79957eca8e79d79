"""Multi-node `tracekit profile`: one `tracekit profile` per node (torchrun --nnodes N --node-rank R,
or srun's tasks) writing into one shared run folder; node 0 waits for the others and ingests.

The real jobs run two launchers on this machine (loopback rendezvous, gloo): each is a
`python -m tracekit profile` process of its own, as on two nodes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracekit.errors import BadInputError
from tracekit.collectors.rundir import Launcher, detect_launcher, join_run_dir, slurm_rank_env, wait_for_ranks

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "scripts" / "infer_loop.py"  # gloo all-reduce per step, tracekit.step()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- which launcher am I


def test_torchrun_node_rank_and_one_run_id_for_every_node():
    cmd = ["--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "train.py", "--lr", "1"]
    a = detect_launcher(["torchrun", "--nnodes", "2", "--node-rank", "1", *cmd], {})
    b = detect_launcher([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--node_rank=0", *cmd], {})
    assert (a.index, a.count, b.index, b.count) == (1, 2, 0, 2)
    assert a.job_key == b.job_key == "torchrun 10.0.0.1:29400 id=none nnodes=2"
    assert a.default_run_id == b.default_run_id and a.default_run_id.startswith("external-torchrun-")
    other = detect_launcher(["torchrun", "--nnodes", "2", "--node-rank", "1", *cmd[:-1], "2"], {})
    assert other.default_run_id != a.default_run_id  # another command line, another run
    named = detect_launcher(["torchrun", "--nnodes", "1:4", "--node-rank", "3", "--rdzv-id", "job7", "t.py"], {})
    assert (named.index, named.count, named.default_run_id) == (3, None, "external-job7")
    env = {"PET_NNODES": "3", "PET_NODE_RANK": "2"}  # torchrun's options from the environment
    assert detect_launcher(["torchrun", "t.py"], env).index == 2
    for single in (["torchrun", "--standalone", "--nnodes", "2", "t.py"], ["torchrun", "--nproc-per-node", "2", "t.py"],
                   ["torchrun", "--nnodes", "1", "t.py"], ["python", "t.py"]):
        assert detect_launcher(single, {}) is None
    with pytest.raises(BadInputError, match="--node-rank"):
        detect_launcher(["torchrun", "--nnodes", "2", "t.py"], {})
    with pytest.raises(BadInputError, match="not below --nnodes 2"):
        detect_launcher(["torchrun", "--nnodes", "2", "--node-rank", "2", "t.py"], {})


def test_slurm_task_rank_and_world_from_slurm_variables():
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
    lau = detect_launcher(["python", "train.py"], env)
    assert (lau.index, lau.count, lau.source, lau.slurm_ranks) == (3, 4, "SLURM_PROCID", True)
    assert (lau.job_key, lau.default_run_id) == ("slurm job 4242.0", "external-slurm4242.0")
    assert slurm_rank_env(env) == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert slurm_rank_env({**env, "RANK": "0", "WORLD_SIZE": "1"}) == {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    # one task, or torchrun run by srun (torchrun's own --node-rank decides)
    assert detect_launcher(["python", "t.py"], {**env, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None
    t = detect_launcher(["torchrun", "--nnodes", "2", "--node-rank", "1", "t.py"], env)
    assert (t.index, t.source, t.slurm_ranks) == (1, "torchrun --node-rank", False)
    with pytest.raises(BadInputError, match="SLURM_PROCID 4 is not below SLURM_NTASKS 4"):
        detect_launcher(["python", "t.py"], {**env, "SLURM_PROCID": "4"})


def test_the_agent_takes_its_rank_from_slurm_without_torch_distributed(monkeypatch):
    from tracekit.collectors.profile import agent as profile_agent

    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    ag = profile_agent.Agent("/nonexistent", {})
    seen = {}
    monkeypatch.setattr(ag, "_start", lambda rank, world, how: seen.update(rank=rank, world=world))
    ag._start_without_dist()
    assert seen == {"rank": 5, "world": 8}


# --------------------------------------------------------------------------- the shared run folder


def _launcher(i, key="k", count=2):
    return Launcher(i, count, "test", key, "external-x")


def test_join_run_dir_shares_one_folder_and_refuses_a_second_run(tmp_path):
    a = join_run_dir(tmp_path, "external-x", _launcher(0))
    b = join_run_dir(tmp_path, "external-x", _launcher(1))
    assert a == b == tmp_path / "external-x"
    assert json.loads((a / "logs" / "job.json").read_text())["job_key"] == "k"
    with pytest.raises(BadInputError, match="node 1 already ran in this folder"):
        join_run_dir(tmp_path, "external-x", _launcher(1))
    with pytest.raises(BadInputError, match="holds the run of another job"):
        join_run_dir(tmp_path, "external-x", _launcher(2, key="other", count=3))
    assert sorted(p.name for p in (a / "logs").iterdir()) == ["job.json", "node0.claim", "node1.claim"]


def _agent(d: Path, rank, world=2, finished=True, host="h"):
    (d / "logs" / f"agent.{host}.{100 + rank}.json").write_text(
        json.dumps({"rank": rank, "world_size": world, "dist": True, "finished": finished}))


def test_wait_ends_when_every_node_ended_and_names_missing_ranks(tmp_path):
    d = join_run_dir(tmp_path, "external-x", _launcher(0))
    for i in (0, 1):
        (d / "logs" / f"node{i}.json").write_text(json.dumps({"index": i}))
    _agent(d, 0)
    (d / "rank0.pt.trace.json.gz").write_bytes(b"x")
    t0 = time.monotonic()
    w = wait_for_ranks(d, _launcher(0), timeout_s=30, poll_s=0.05)
    assert time.monotonic() - t0 < 5
    assert (w.world_size, w.missing, w.nodes_done, w.timed_out) == (2, [1], [0, 1], False)
    (d / "logs" / f"agent.h.100.json").unlink()  # before any agent reports, --expect-ranks is the count
    w = wait_for_ranks(d, _launcher(0), expect_ranks=3, timeout_s=30, poll_s=0.05)
    assert (w.world_size, w.missing) == (3, [1, 2])
    _agent(d, 0)  # an agent's torch.distributed world size (2) wins over a wrong --expect-ranks 3
    w = wait_for_ranks(d, _launcher(0), expect_ranks=3, timeout_s=30, poll_s=0.05)
    assert (w.world_size, w.missing) == (2, [1])


def test_wait_ends_when_every_rank_finished_or_at_the_timeout(tmp_path):
    d = join_run_dir(tmp_path, "external-x", _launcher(0))
    _agent(d, 0)
    _agent(d, 1, finished=False)
    (d / "rank0.pt.trace.json.gz").write_bytes(b"x")
    said = []
    w = wait_for_ranks(d, _launcher(0), timeout_s=0.3, poll_s=0.05, on_progress=said.append)
    assert (w.world_size, w.missing, w.timed_out) == (2, [1], True) and w.waited_s >= 0.3
    assert said == ["waiting for the other nodes: 0 of 2 node(s) and 1 of 2 rank(s) done (at most 0.3 s)"]
    _agent(d, 1)  # rank 1 finished (no node file yet): done after the grace period
    (d / "rank1.pt.trace.json.gz").write_bytes(b"x")
    w = wait_for_ranks(d, _launcher(0), timeout_s=30, poll_s=0.05, grace_s=0.2)
    assert (w.missing, w.timed_out) == ([], False) and 0.2 <= w.waited_s < 5


def test_node0_config_names_the_nodes_and_the_missing_ranks(tmp_path):
    pytest.importorskip("torch")
    from tracekit.collectors.profile import runner
    from tracekit.collectors.rundir import WaitResult, write_node_status

    d = join_run_dir(tmp_path, "external-x", _launcher(0))
    _agent(d, 0, world=3)
    (d / "rank0.pt.trace.json.gz").write_bytes(b"x")
    write_node_status(d, _launcher(0), {"exit_code": 0, "ranks": [0]})
    res = runner.JobResult(run_id=d.name, run_dir=d, command=["torchrun"], exit_code=0, interrupted=False,
                           wall_s=1.0, launcher=_launcher(0), wait=WaitResult(3, [1, 2], [0], True, 300.0))
    runner.gather(res, runner.ProfileOptions(), dt.datetime.now(dt.timezone.utc))
    cfg = res.config
    assert (cfg["partial"], cfg["missing_ranks"], cfg["missing_nodes"], cfg["wait"]["timed_out"]) == (True, [1, 2], [1], True)
    assert cfg["notes"][0] == "waited 300 s for the other nodes: no trace from rank(s) 1, 2 of 3"
    assert "ranks 1, 2: no trace and no agent status" in "\n".join(cfg["notes"])  # one line for both
    assert [n["index"] for n in cfg["nodes"]] == [0]


def test_wrong_expect_ranks_is_said_not_reported_as_dead_ranks(tmp_path):
    """--expect-ranks 4 on a job whose torch.distributed world size is 2: ranks 2 and 3 cannot
    exist, so they are not missing (no 'no trace' line); the mismatch is one note."""
    pytest.importorskip("torch")
    from tracekit.collectors.profile import runner
    from tracekit.collectors.rundir import WaitResult, write_node_status

    d = join_run_dir(tmp_path, "external-x", _launcher(0))
    for r in (0, 1):
        _agent(d, r, world=2)
        (d / f"rank{r}.pt.trace.json.gz").write_bytes(b"x")
    write_node_status(d, _launcher(0), {"exit_code": 0, "ranks": [0, 1]})
    res = runner.JobResult(run_id=d.name, run_dir=d, command=["torchrun"], exit_code=0, interrupted=False,
                           wall_s=1.0, launcher=_launcher(0), wait=WaitResult(2, [], [0, 1], False, 1.0))
    runner.gather(res, runner.ProfileOptions(expect_ranks=4), dt.datetime.now(dt.timezone.utc))
    assert res.config["missing_ranks"] == [] and res.world_size == 2
    notes = "\n".join(res.config["notes"])
    assert "--expect-ranks 4, but the job's torch.distributed world size is 2" in notes and "no trace" not in notes


# --------------------------------------------------------------------------- real 2-node jobs


def _launch(tmp_path, node: int, command: list[str], env: dict | None = None) -> subprocess.Popen:
    args = [sys.executable, "-m", "tracekit", "profile", "--store", str(tmp_path / f"store{node}"),
            "--out", str(tmp_path / "runs"), "--wait", "0", "--warmup", "1", "--active", "2", "--wait-timeout", "60",
            "--", *command]
    return subprocess.Popen(args, cwd=tmp_path, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(procs) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out.append((p.returncode, o, e))
    return out


def _check_one_run(tmp_path, run_id_prefix: str) -> dict:
    """Node 0's store holds one run with both ranks, every instance complete; node 1 ingested nothing."""
    from tracekit import analyses
    from tracekit.store import Store

    assert not (tmp_path / "store1").exists()  # the other node does not ingest
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith(run_id_prefix)
    names = sorted(p.name for p in run_dir.iterdir())
    assert {"rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "run_config.json", "logs"} <= set(names)
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert {"node0.json", "node1.json", "job.json"} <= set(logs)
    assert len([n for n in logs if n.startswith("agent.")]) == 2
    con = analyses.connect(Store(tmp_path / "store0"))
    (rid, cfg), = con.execute("SELECT run_id, config FROM runs").fetchall()
    cfg = json.loads(cfg)
    assert rid == run_dir.name and cfg["partial"] is False and cfg["missing_ranks"] == []
    assert [n["index"] for n in cfg["nodes"]] == [0, 1] and cfg["failed_nodes"] == {}
    assert sorted(r for n in cfg["nodes"] for r in n["ranks"]) == [0, 1]
    assert [r[0] for r in con.execute("SELECT rank FROM ranks ORDER BY rank").fetchall()] == [0, 1]
    rows = con.execute("SELECT op, size_bytes, ranks_seen, complete FROM collective_instances ORDER BY seq").fetchall()
    assert rows == [("all_reduce", 128 * 4, 2, True)] * 2  # 2 active steps, one 128-float all-reduce each
    return cfg


@pytest.mark.slow
def test_two_torchrun_nodes_give_one_run(tmp_path):
    pytest.importorskip("torch")
    port = _free_port()
    procs = [
        _launch(tmp_path, node, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                                 "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                 str(SCRIPT), "--steps", "4"])
        for node in (1, 0)
    ]
    (rc1, _, err1), (rc0, out0, err0) = _finish(procs)
    assert (rc0, rc1) == (0, 0), err0 + err1
    assert "node 1 (torchrun --node-rank): job exited with code 0" in err1 and "node 0 ingests the run" in err1
    assert "Collectives per op" in out0
    cfg = _check_one_run(tmp_path, "external-torchrun-")
    assert cfg["launch"]["source"] == "torchrun --node-rank" and cfg["launch"]["launchers"] == 2


@pytest.mark.slow
def test_two_slurm_tasks_give_one_run(tmp_path):
    """srun's environment without srun: each task's rank and world size come from SLURM_*."""
    pytest.importorskip("torch")
    port = str(_free_port())
    procs = []
    for task in (1, 0):
        env = {"SLURM_PROCID": str(task), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(task), "SLURM_JOB_ID": "77",
               "SLURM_STEP_ID": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in os.environ}
        try:
            procs.append(_launch(tmp_path, task, [sys.executable, str(SCRIPT), "--steps", "4"], env))
        finally:
            os.environ.update(saved)
    (rc1, _, err1), (rc0, _, err0) = _finish(procs)
    assert (rc0, rc1) == (0, 0), err0 + err1
    cfg = _check_one_run(tmp_path, "external-slurm77.0")
    assert cfg["launch"]["source"] == "SLURM_PROCID"


def test_cli_other_node_only_writes_and_node0_names_the_missing_ranks(tmp_path, capsys):
    """Two launchers whose jobs write no trace (a stand-in `torchrun` that profiles nothing): node 1
    says node 0 ingests and creates no store; node 0, once both nodes ended, names ranks 0 and 1."""
    pytest.importorskip("torch")
    from tracekit.cli import main

    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys; sys.exit(0)\n")
    fake.chmod(0o755)

    def node(i, *opts):
        return main(["profile", "--store", str(tmp_path / f"store{i}"), "--out", str(tmp_path / "runs"), *opts, "--",
                     str(fake), "--nnodes", "2", "--node-rank", str(i), "--rdzv-endpoint", "127.0.0.1:1", "t.py"])

    assert node(1) == 0
    err = capsys.readouterr().err
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert f"node 1 (torchrun --node-rank): job exited with code 0; traces of rank(s) none in {run_dir}" in err
    assert not (tmp_path / "store1").exists() and not (run_dir / "run_config.json").exists()
    assert node(0, "--expect-ranks", "2", "--wait-timeout", "30") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "warning: ranks 0, 1: no trace and no agent status" in "\n".join(err)
    assert err[-1].startswith("tracekit: no rank wrote a trace")
    cfg = json.loads((run_dir / "run_config.json").read_text())
    assert ([n["index"] for n in cfg["nodes"]], cfg["missing_ranks"], cfg["wait"]["timed_out"]) == ([0, 1], [0, 1], False)
    assert node(0) == 2  # node 0 again in the same folder: refused, nothing run
    assert "node 0 already ran in this folder" in capsys.readouterr().err

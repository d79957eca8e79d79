"""`tracekit ingest --engine ray` on a real local Ray cluster (issue 21, items 1 and 5).

One cluster for the module (``ray.cluster_utils.Cluster``): a head node and a second node, one CPU
each (two raylets, two object stores of 100 MB, a worker process per CPU), so tasks run two at a
time in worker processes of two nodes. The Ray engine must give the stores the local engine gives, row for row
(benchmarks/compare_checkouts.py's comparison: every table, EXCEPT ALL both ways, without
created_at and source_path), on the 8-rank DLRM set and on a 64-rank replica job
(benchmarks/bench_ray.py's write_replica_job: tp_2rank's two ranks copied 32 times each) and a
64-rank synthetic TP × PP × DP job with known truth (benchmarks/synth_job.py: offsets, stragglers); a
truncated rank file fails naming the file and leaves the store byte for byte as it was; a task
whose worker dies is rerun, one that raises BadInputError is not. Skips when Ray is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from tests.conftest import two_node_ray_cluster, FIXTURES, REPO, shared_trace, store_snapshot
from tracekit.errors import FileError
from tracekit.ingest import ingest_paths
from tracekit.store import Store

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (pip install 'tracekit[ray]')")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


compare = _load("compare_checkouts")
replica = _load("bench_ray")
synth = _load("synth_job")


@pytest.fixture(scope="module")
def cluster():
    yield from two_node_ray_cluster(__name__)  # the tasks below, in the workers


def _same_stores(tmp_path, src) -> Store:
    """Ingest ``src`` with each engine; assert the stores are equal; return the Ray one."""
    local, remote = Store(tmp_path / "local"), Store(tmp_path / "ray")
    ingest_paths([src], local, run_id="r")
    ingest_paths([src], remote, run_id="r", engine="ray")
    assert compare.compare_stores(local.path, remote.path) == []
    return remote


def _count(store: Store, table: str) -> int:
    return duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{store.run_dir('r')}/{table}')").fetchone()[0]


@needs_ray
def test_cluster_has_two_nodes_of_one_cpu(cluster):
    import ray

    alive = [n for n in ray.nodes() if n["Alive"]]
    assert sorted(n["Resources"].get("CPU", 0) for n in alive) == [1, 1]


@needs_ray
def test_the_clusters_gcs_answers_the_probe(cluster):
    """A real Ray head's GCS port answers the HTTP/2 preface with a SETTINGS frame (type 0x4) at
    once: engine._check_reachable lets it through."""
    import socket

    from tracekit.ingest.engine import _check_reachable, _h2_answer

    host, port = cluster.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = _h2_answer(sock)
    assert len(head) == 9 and head[3] == 4
    _check_reachable(cluster.address)


@needs_ray
def test_dlrm_8_ranks_ray_equals_local(cluster, tmp_path):
    st = _same_stores(tmp_path, shared_trace("param_dlrm_8rank_v100"))
    assert _count(st, "ranks.parquet") == 8
    assert _count(st, "collectives.parquet") > 0
    assert len(list((st.run_dir("r") / "events").iterdir())) == 8


@needs_ray
def test_synthetic_64_ranks_ray_equals_local(cluster, tmp_path):
    job = tmp_path / "job"
    replica.write_replica_job(FIXTURES / "tp_2rank", 64, job)
    st = _same_stores(tmp_path, job)
    # fixtures/tp_2rank/NOTE.md: 8 all-reduces of 131,072 B per rank, all matched across the 64 ranks
    con = duckdb.connect()
    rows = con.execute(f"SELECT count(*), count(DISTINCT rank), min(size_bytes), max(size_bytes), count(DISTINCT seq) "
                       f"FROM read_parquet('{st.run_dir('r')}/collectives.parquet') WHERE op = 'all_reduce'").fetchone()
    assert rows == (512, 64, 131072, 131072, 8)


@needs_ray
def test_synth_job_64_ranks_ray_equals_local_and_the_truth(cluster, tmp_path):
    """benchmarks/synth_job.py: 64 ranks in TP × PP × DP groups on 16 nodes with injected clock
    offsets and a straggler (rank 37): both engines give the same store, and its clock offsets and
    last arrivals are the injected ones."""
    truth = synth.make_job(tmp_path / "job", 64, FIXTURES / "3d_2x2x2" / "rank0.pt.trace.json.gz",
                           layout="tp2xpp2xdp", seed=4, straggler=37, gpus_per_node=4, compute_events=40)
    st = _same_stores(tmp_path, Path(truth["traces_dir"]))
    import tracekit

    run = tracekit.open(st.path).run("r")
    assert run.sql("SELECT clock_offset_ns FROM ranks ORDER BY rank").df()["clock_offset_ns"].tolist() == \
        truth["clock_offset_ns"]
    inst = run.instances().set_index(["pg_name", "seq"])
    assert len(inst) == len(truth["instances"])
    for t in truth["instances"]:
        row = inst.loc[(t["pg_name"], t["seq"])]
        assert int(row["straggler"]) == t["last_arrival_rank"] and int(row["last_arrival_ns"]) == t["last_arrival_ns"]
    assert any(37 in t["ranks"] and t["last_arrival_rank"] == 37 for t in truth["instances"])


@needs_ray
def test_comm_pattern_reaches_the_workers(cluster, tmp_path):
    # tests/ingest/test_comm_families.py: foo_kernel=all_gather makes the file's one kernel an all_gather
    st = Store(tmp_path / "s")
    ingest_paths([FIXTURES / "handmade" / "comm_families" / "user_kernel.json"], st, run_id="r", engine="ray",
                 comm_patterns=["foo_kernel=all_gather"])
    con = duckdb.connect()
    assert con.execute(f"SELECT op, meta_source FROM read_parquet('{st.run_dir('r')}/collectives.parquet')"
                       ).fetchall() == [("all_gather", "name_only")]


def _truncate(f: Path) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])


@needs_ray
def test_truncated_rank_file_names_it_and_leaves_the_store(cluster, tmp_path, capsys):
    from tracekit.cli import main

    st = Store(tmp_path / "store")
    ingest_paths([FIXTURES / "tp_2rank"], st, run_id="old")
    before = store_snapshot(st.path)
    job = tmp_path / "job"
    replica.write_replica_job(FIXTURES / "tp_2rank", 4, job)
    bad = job / "rank2.pt.trace.json.gz"
    _truncate(bad)
    capsys.readouterr()
    rc = main(["ingest", str(job), "--store", str(st.path), "--run-id", "new", "--engine", "ray",
               "--address", cluster.address])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(lines) == 1 and lines[0].startswith(f"tracekit: {bad}: truncated gzip stream"), lines
    assert store_snapshot(st.path) == before


_ATTEMPTS = "attempts"


def _die_first_time(folder: str) -> int:
    """A task whose worker process dies (os._exit) on its first attempt."""
    log = Path(folder) / _ATTEMPTS
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    if len(log.read_text().split()) == 1:
        os._exit(1)
    return 7


def _bad_file(folder: str) -> int:
    with open(Path(folder) / _ATTEMPTS, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    raise FileError(Path(folder) / "rank3.json", "truncated gzip stream (file incomplete?)")


@needs_ray
def test_lost_worker_is_retried_bad_input_is_not(cluster, tmp_path):
    from tracekit.ingest.engine import RayEngine

    lost, bad = tmp_path / "lost", tmp_path / "bad"
    lost.mkdir(), bad.mkdir()
    with RayEngine(cluster.address) as eng:
        assert eng.map(_die_first_time, [str(lost)], ["lost.json"]) == [7]
        with pytest.raises(FileError, match=r"rank3\.json: truncated gzip stream"):
            eng.map(_bad_file, [str(bad)], ["rank3.json"])
    died, rerun = (lost / _ATTEMPTS).read_text().split()
    assert died != rerun  # a new worker process ran it again
    assert len((bad / _ATTEMPTS).read_text().split()) == 1


def test_engine_ray_without_ray_says_how_to_install(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["ray"] = None  # as if Ray were not installed
        sys.argv = ["tracekit", "ingest", {str(FIXTURES / 'tp_2rank')!r}, "--store", {str(tmp_path / 's')!r},
                    "--engine", "ray"]
        from tracekit.cli import entry
        entry()
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["tracekit: --engine ray needs Ray, which is not installed: "
                                            "pip install 'tracekit[ray]'"]
    assert not (tmp_path / "s").exists()


_BLOCKING_DRIVER = """
import os, signal, sys, time
from pathlib import Path
from tracekit.ingest.engine import RayEngine

def block(folder):
    Path(folder, f"started-{os.getpid()}").write_text("")
    time.sleep(600)
    Path(folder, "finished").write_text("")

# a user's terminal delivers Ctrl-C to a process whose SIGINT raises KeyboardInterrupt; a test
# harness may start this one with SIGINT ignored (inherited), which Python then keeps ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    with RayEngine(sys.argv[1]) as eng:  # joins the cluster: leaving the block keeps the connection
        eng.map(block, [sys.argv[2]] * 2, ["a.json", "b.json"])
except KeyboardInterrupt:
    Path(sys.argv[2], "interrupted").write_text("")
    time.sleep(600)  # the driver (the tasks' owner) stays: only ray.cancel can have stopped them
"""


def _gone(pid: int) -> bool:
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True


def _poll(cond, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


@needs_ray
def test_ctrl_c_cancels_the_tasks(cluster, tmp_path):
    import signal

    script = tmp_path / "driver.py"
    script.write_text(_BLOCKING_DRIVER)
    p = subprocess.Popen([sys.executable, str(script), cluster.address, str(tmp_path)], stderr=subprocess.DEVNULL)
    try:
        assert _poll(lambda: len(list(tmp_path.glob("started-*"))) == 2, 60), "the two tasks never started"
        p.send_signal(signal.SIGINT)
        assert _poll(lambda: (tmp_path / "interrupted").exists(), 60), "the driver did not see the interrupt"
        # the engine waits for the cancelled tasks before it raises: their workers are gone already
        pids = [int(f.name.split("-")[1]) for f in tmp_path.glob("started-*")]
        assert all(_gone(pid) for pid in pids), "a cancelled task's worker still runs"
        assert p.poll() is None  # the driver still holds its connection
    finally:
        p.kill()
        p.wait()
    assert not (tmp_path / "finished").exists()


@pytest.mark.parametrize("args, message", [
    (["--address", "auto"], "tracekit: --address applies to --engine ray only"),
    (["--engine", "dask"], "tracekit: --engine must be one of local, ray, got 'dask'"),
])
def test_engine_options_are_checked_before_any_work(tmp_path, capsys, args, message):
    from tracekit.cli import main

    rc = main(["ingest", str(FIXTURES / "tp_2rank"), "--store", str(tmp_path / "s"), *args])
    assert rc == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]
    assert not (tmp_path / "s").exists()


@needs_ray
def test_unreachable_address_is_one_line(tmp_path):
    # a process of its own (this one is connected to the module's cluster, which an ingest would use);
    # nothing listens on port 1 of the loopback: refused at once, not Ray's minutes of retries
    p = subprocess.run([sys.executable, "-m", "tracekit", "ingest", str(FIXTURES / "tp_2rank"), "--store",
                        str(tmp_path / "s"), "--engine", "ray", "--address", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["tracekit: cannot reach a Ray cluster at 127.0.0.1:1 (Connection refused)"]
    assert not (tmp_path / "s").exists()


@needs_ray
def test_no_address_starts_an_instance_of_its_own_whatever_ray_address_says(tmp_path):
    """Without --address the ingest starts a Ray instance of its own, even where the environment
    names a cluster (RAY_ADDRESS; Ray's ray.init would also take the latest `ray start` cluster of
    the machine, dead or alive): here a port nothing listens on. Before, ray.init tried to join it
    (and refused the instance's num_cpus there). The run is the local engine's, collective for
    collective."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(REPO), RAY_ADDRESS="127.0.0.1:1")
    p = subprocess.run([sys.executable, "-m", "tracekit", "ingest", str(FIXTURES / "tp_2rank"), "--store",
                        str(tmp_path / "s"), "--engine", "ray", "--jobs", "1", "--run-id", "r"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    got = duckdb.sql(f"SELECT count(*) FROM '{tmp_path / 's'}/runs/r/collectives.parquet'").fetchall()[0][0]
    # fixtures/tp_2rank: 2 all-reduces per layer per active step, 2 layers, 2 steps, on 2 ranks
    assert got == 16


def _server(answer):
    """(listening socket, its HOST:PORT): each connection accepted is sent ``answer`` (bytes, once),
    b"": closed at once, None: held open and never written to."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:  # closed
                return
            held.append(c)
            if answer == b"":
                c.close()
            elif answer is not None:
                c.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return srv, f"127.0.0.1:{srv.getsockname()[1]}"


@pytest.mark.parametrize("answer, scheme, why", [
    (None, "", "the port accepts TCP connections but sent nothing in 3 s (not a Ray head's GCS port?)"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "", "the port answered, but not as a gRPC (HTTP/2) server (not a Ray head's GCS port?)"),
    (b"", "", "the port closed the connection on the HTTP/2 preface (not a Ray head's GCS port?)"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "ray://",
     "the port answered, but not as a gRPC (HTTP/2) server (not a Ray Client server's port?)"),
], ids=["silent", "http1", "closes", "ray-client-http1"])
def test_a_port_that_is_no_grpc_server_is_refused_before_ray_joins(answer, scheme, why):
    """--address at a port that accepts TCP but does not answer the HTTP/2 preface with a SETTINGS
    frame, as a Ray head's GCS does (a gRPC server): one line naming it, in seconds, before Ray's
    join (engine._check_reachable; the real GCS of this file's cluster passes it in the tests above)."""
    from tracekit.errors import BadInputError
    from tracekit.ingest.engine import _check_reachable

    srv, addr = _server(answer)
    addr = scheme + addr
    t0 = time.monotonic()
    with pytest.raises(BadInputError) as e:
        _check_reachable(addr)
    srv.close()
    assert str(e.value) == f"cannot join a Ray cluster at {addr}: {why}"
    assert time.monotonic() - t0 < 3 + 2


@needs_ray
def test_address_of_another_service_fails_in_seconds(tmp_path):
    """A port that accepts TCP and answers as an HTTP/2 server but is not a Ray head (here a socket
    that sends an empty SETTINGS frame, then nothing): Ray's join fails, one line naming the
    address, the store untouched. Ray's join timeouts are shortened in the environment, where a
    value the user set is kept (engine.RAY_JOIN_TIMEOUTS; "1" here); a port that says nothing is
    refused before Ray joins (test_a_port_that_is_no_grpc_server_is_refused_before_ray_joins,
    tests/ingest/test_bounded_procs.py's test_address_auto_that_finds_a_dead_cluster_fails_in_seconds)."""
    from tracekit.ingest.engine import RAY_JOIN_TIMEOUTS

    srv, addr = _server(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    env = dict(os.environ, **dict.fromkeys(RAY_JOIN_TIMEOUTS, "1"))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "tracekit", "ingest", str(FIXTURES / "tp_2rank"), "--store",
                        str(tmp_path / "s"), "--engine", "ray", "--address", addr],
                       capture_output=True, text=True, timeout=90, env=env)
    took = time.monotonic() - t0
    srv.close()
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith(f"tracekit: cannot start or join Ray cluster at {addr!r}: ") and "Failed to connect" in line
    assert not (tmp_path / "s").exists()
    assert took < 60, took  # ~5 s here; Ray's own defaults retried for ~2 minutes


def test_join_timeouts_are_ours_where_the_user_set_none(monkeypatch):
    """engine._join_timeouts: RAY_JOIN_TIMEOUTS in the environment while Ray joins, a value the user
    set kept, and the environment as it was afterwards."""
    from tracekit.ingest.engine import RAY_JOIN_TIMEOUTS, _join_timeouts

    mine, *ours = list(RAY_JOIN_TIMEOUTS)
    for k in RAY_JOIN_TIMEOUTS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(mine, "7")
    with _join_timeouts(True):
        assert [os.environ.get(k) for k in RAY_JOIN_TIMEOUTS] == ["7"] + [RAY_JOIN_TIMEOUTS[k] for k in ours]
    assert [os.environ.get(k) for k in RAY_JOIN_TIMEOUTS] == ["7"] + [None] * len(ours)
    with _join_timeouts(False):  # a local instance of our own: Ray's defaults
        assert [os.environ.get(k) for k in ours] == [None] * len(ours)

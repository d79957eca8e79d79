"""No process outlives the command: a parallel ingest killed (kill -9, SIGTERM, Ctrl-C's SIGINT)
leaves none of its processes (fork server, workers, resource tracker) behind, with a real pool."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to list the processes")


def _session(sid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes whose session is ``sid`` (zombies left out)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        f = stat.rsplit(")", 1)[1].split()
        if f[0] != "Z" and int(f[3]) == sid:
            out.append((int(d), cmd[:100]))
    return out


def _rank_files(d: Path, ranks: int) -> Path:
    """``ranks`` rank files in ``d`` of 400,001 events each (0.4 MB gzip; ~1.2 CPU s of ingest each):
    one gzip member for each file's header, the events' member compressed once and shared."""
    d.mkdir()
    ev = json.dumps({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": 1000.5, "dur": 5,
                     "args": {"correlation": 1, "stream": 7, "device": 0}})
    body = gzip.compress((",".join([ev] * 1000) + ",").encode() * 400 + ev.encode() + b"]}", compresslevel=1)
    for r in range(ranks):
        head = b'{"distributedInfo":{"rank":%d,"world_size":%d},"traceEvents":[' % (r, ranks)
        (d / f"rank{r}.json.gz").write_bytes(gzip.compress(head) + body)
    return d


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Four rank files that take the workers a few seconds each (:func:`_rank_files`)."""
    return _rank_files(tmp_path_factory.mktemp("big") / "traces", 4)


def _kill_and_count(traces: Path, store: Path, sig: int) -> tuple[int, list]:
    """Start a parallel ingest in a session of its own, wait for its pool (fork server, resource
    tracker, 2 workers), send ``sig`` to the command alone, and return (processes seen before,
    processes of the session still alive 5 s later)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "tracekit", "ingest", str(traces), "--store", str(store), "--jobs", "2"],
                         start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        t0 = time.monotonic()
        while len(_session(p.pid)) < 4 and time.monotonic() - t0 < 60 and p.poll() is None:
            time.sleep(0.05)
        before = len(_session(p.pid))
        time.sleep(0.3)  # the workers at work
        os.kill(p.pid, sig)
        p.wait(timeout=30)
        t1 = time.monotonic()
        left = _session(p.pid)
        while left and time.monotonic() - t1 < 5:
            time.sleep(0.1)
            left = _session(p.pid)
        return before, left
    finally:
        for pid, _ in _session(p.pid):  # never leave them to the next test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGKILL, signal.SIGKILL, signal.SIGTERM, signal.SIGINT],
                         ids=["kill-9-a", "kill-9-b", "kill-9-c", "sigterm", "sigint"])
def test_no_process_left_5s_after_the_command_dies(traces, tmp_path, sig):
    before, left = _kill_and_count(traces, tmp_path / "store", sig)
    assert before >= 4  # the command, its fork server, the resource tracker, a worker at least
    assert left == []


def test_guard_module_is_inert_when_imported_normally():
    """Imported by the command itself (not as a fork server's preload), it sets nothing."""
    code = ("import os; os.environ.pop('TRACEKIT_FORKSERVER_PARENT', None); "
            "import tracekit.ingest._orphan_guard as g; import ctypes; "
            "libc = ctypes.CDLL(None); v = ctypes.c_int(-1); libc.prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.stdout.strip() == "0", out.stderr  # PR_GET_PDEATHSIG: none


def _ray():
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _ray(), reason="Ray is not installed")
@pytest.mark.parametrize("listening", [False, True], ids=["refused", "accepts-but-silent"])
def test_address_auto_that_finds_a_dead_cluster_fails_in_seconds(tmp_path, listening):
    """--address auto resolving (RAY_ADDRESS) to a port that refuses, or accepts TCP and says
    nothing: exit 2, one line, in seconds (the silent one after engine.RAY_ANSWER_TIMEOUT_S, before
    Ray's own join retries start)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    if listening:
        srv.listen(64)
        threading.Thread(target=lambda: [srv.accept() for _ in iter(int, 1)], daemon=True).start()
    else:
        srv.close()
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_ADDRESS=f"127.0.0.1:{port}")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "tracekit", "ingest", str(REPO / "fixtures" / "tp_2rank"), "--store",
                        str(tmp_path / "s"), "--engine", "ray", "--address", "auto"],
                       capture_output=True, text=True, timeout=120, env=env)
    took = time.monotonic() - t0
    if listening:
        srv.close()
    assert p.returncode == 2, p.stderr[-2000:]
    (line,) = p.stderr.strip().splitlines()
    if listening:
        assert line == (f"tracekit: cannot join a Ray cluster at 127.0.0.1:{port} (--address auto): the port accepts "
                        "TCP connections but sent nothing in 3 s (not a Ray head's GCS port?)")
    else:
        assert line == f"tracekit: cannot reach a Ray cluster at 127.0.0.1:{port} (--address auto) (Connection refused)"
    assert took < 30, took
    assert not (tmp_path / "s").exists()


@pytest.mark.skipif(not _ray(), reason="Ray is not installed")
def test_ray_instance_of_our_own_dies_with_the_command(tmp_path):
    """--engine ray with no --address starts a local Ray instance; kill -9 of the command: its GCS,
    raylet, dashboard and runtime-env agents, log monitor and workers are gone 5 s later (a reaper
    notes them as they start and kills them once the command has ended). Twelve rank files (~15 CPU
    s of work for Ray's two workers), so that the ingest is still running when it is killed."""
    traces = _rank_files(tmp_path / "traces", 12)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "tracekit", "ingest", str(traces), "--store", str(tmp_path / "s"),
                              "--engine", "ray", "--jobs", "2"],
                             start_new_session=True, stdout=subprocess.DEVNULL, stderr=f, env=env)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120 and p.poll() is None:
            if any("raylet" in c for _, c in _session(p.pid)) and len(_session(p.pid)) >= 6:
                break
            time.sleep(0.2)
        before = len(_session(p.pid))
        time.sleep(2)
        assert p.poll() is None, f"the command ended before it was killed (exit {p.returncode}): {err.read_text()[-2000:]}"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        t1 = time.monotonic()
        left = _session(p.pid)
        while left and time.monotonic() - t1 < 5:
            time.sleep(0.2)
            left = _session(p.pid)
        assert before >= 6 and left == []
    finally:
        for pid, _ in _session(p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

"""Where an ingest's per-file work runs: this machine's process pool, or a Ray cluster.

An ingest has two per-file phases, each a module-level function of one picklable task run once
per task by an engine (both engines run the same functions):

1. read: :func:`tracekit.ingest._read_one` — one trace file → its staging file(s) and a
   :class:`~tracekit.ingest.staging.RankFile` (metadata, steps, warnings);
2. assemble: :func:`tracekit.ingest.assemble.assemble_rank` — one rank's staging file → its
   events file (link pass, classes, steps), its collectives (attribution, seq) and summary tables,
   all written to the staging area, and a small :class:`~tracekit.ingest.assemble.RankResult`.

Between the phases the driver numbers the ranks and takes the world size and process groups from
every file's metadata (they need all ranks); after the second it estimates clock offsets from the
staged collectives and streams the staged tables into the run's, then commits the run
(``tracekit.store.Staging``). The Ray engine keeps a bounded window of tasks submitted
(:meth:`RayEngine.in_flight`) and drops its reference to each task as soon as its result is
taken, so Ray frees its copy of the result and the task's lineage. The tasks read
and write files only under the paths they are given: with Ray, the rank files and the store must be
on a filesystem every worker mounts at the same path (docs/scale.md).

An engine is a context manager with ``map(fn, tasks, names, progress)``: the results in task order.
The first failing task's TracekitError is raised as is (its message names the file); any other
failure of a task becomes a TracekitError naming ``names[i]``. When a task fails, or on Ctrl-C,
the tasks not yet done are cancelled before the error propagates, so nothing writes into the
staging directory once it is removed (the store stays unchanged).
"""

from __future__ import annotations

import contextlib

import os
from typing import Callable, Sequence

from tracekit.errors import BadInputError, TracekitError

ENGINES = ("local", "ray")

RAY_MAX_RETRIES = 3
"""Times Ray reruns a task whose worker process or node died (``max_retries``). Exceptions a task
raises are not retried (``retry_exceptions=False``): a bad file is as bad the second time."""

RAY_IN_FLIGHT_PER_CPU = 4
"""Ray tasks the driver keeps submitted per CPU of the cluster (:meth:`RayEngine.in_flight`): enough
that a worker finishing a task finds the next one queued while the driver takes results."""

RAY_IN_FLIGHT_MIN = 16
"""The fewest Ray tasks kept submitted, whatever the cluster's CPUs (:meth:`RayEngine.in_flight`)."""

RAY_CANCEL_WAIT_S = 10.0
"""After a failure or Ctrl-C: how long the driver waits for cancelled tasks to stop."""


class LocalEngine:
    """The default engine: a forkserver process pool of ``jobs`` workers when ``parallel``, else the
    calling process itself (one pool for both phases of an ingest). The fork server and the
    workers die with the calling process, however it ends (:mod:`tracekit.ingest._orphan_guard`)."""

    name = "local"

    def __init__(self, jobs: int, parallel: bool):
        self.jobs, self.parallel = jobs, parallel
        self._pool = None

    def __enter__(self) -> "LocalEngine":
        if self.parallel and self.jobs > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            from tracekit.ingest import _orphan_guard

            ctx = multiprocessing.get_context("forkserver")
            _orphan_guard.start_forkserver(ctx)  # the fork server and the workers die with this process
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=ctx,
                                             initializer=_orphan_guard.guard_worker, initargs=(os.getpid(),))
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def map(self, fn: Callable, tasks: Sequence, names: Sequence[str], progress=None) -> list:
        if self._pool is None or len(tasks) < 2:
            out = []
            for t in tasks:
                out.append(fn(t))
                if progress:
                    progress(advance=1)
            return out
        from concurrent.futures import as_completed

        futures = {self._pool.submit(fn, t): i for i, t in enumerate(tasks)}
        out = [None] * len(tasks)
        try:
            for fut in as_completed(futures):
                out[futures[fut]] = fut.result()
                if progress:
                    progress(advance=1)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        return out


def _ray_call(fn: Callable, task):
    """The Ray task: ``fn(task)`` in a worker process."""
    return fn(task)


class RayEngine:
    """Each task is one Ray task (``max_retries`` = :data:`RAY_MAX_RETRIES` for lost workers).

    ``address``: None starts a local Ray instance for this ingest (``num_cpus`` = ``workers`` when
    given; whatever ``RAY_ADDRESS`` says) and stops it at the end; ``auto`` or ``HOST:PORT`` joins a running cluster (a HOST:PORT,
    or the one ``auto`` finds, that refuses a TCP connection fails at once; one that accepts but
    does not answer the HTTP/2 preface as a gRPC server fails within :data:`RAY_ANSWER_TIMEOUT_S`,
    :func:`_check_reachable`; a gRPC server that is no Ray head, or any port when ``RAY_USE_TLS``
    is set, within Ray's join timeouts, :data:`RAY_JOIN_TIMEOUTS`). A process already connected to Ray (``ray.init``
    in a notebook) keeps its connection, whatever ``address`` says.
    Raises BadInputError when Ray is not installed or the cluster cannot be reached or joined.
    """

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None):
        try:
            with _join_timeouts(address is not None):  # Ray reads some when imported
                import ray  # noqa: F401  (before any work: refuse at once when it is missing)
        except ImportError:
            raise BadInputError("--engine ray needs Ray, which is not installed: pip install 'tracekit[ray]'") from None
        self.address, self.workers = address, workers
        self._started = False
        self._remote = None
        self._reaper = None

    def __enter__(self) -> "RayEngine":
        import ray

        if not ray.is_initialized():
            kw = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                      configure_logging=True)
            if self.address is None:
                # "local": an instance of our own even where RAY_ADDRESS names a cluster (ray.init
                # would join that one, and refuse num_cpus there)
                kw.update(address="local", num_cpus=self.workers)
            else:
                if self.address != "auto":
                    _check_reachable(self.address)
                else:  # the address Ray would find (RAY_ADDRESS, the latest local cluster): checked alike
                    found = _auto_address()
                    if found is not None:
                        _check_reachable(found, given="auto")
                kw["address"] = self.address
            if self.address is None and os.path.isdir("/proc"):
                # an instance of our own: a reaper notes its processes as they start and kills them
                # if this process ends without ray.shutdown() (kill -9)
                from tracekit.ingest import _orphan_guard

                try:
                    self._reaper = _orphan_guard.start_reaper([])
                except OSError:  # no process to spare: ray.shutdown() only
                    self._reaper = None
            try:
                from tracekit.ingest._orphan_guard import reap_tag

                with _quiet_fd2(self.address is not None), _join_timeouts(self.address is not None), \
                        reap_tag(self._reaper):
                    ray.init(**kw)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                self._stop_reaper()
                where = "a local Ray instance" if self.address is None else f"Ray cluster at {self.address!r}"
                raise BadInputError(f"cannot start or join {where}: {' '.join(str(exc).split())[:300]}") from None
            self._started = True
        self._remote = ray.remote(_ray_call).options(max_retries=RAY_MAX_RETRIES, retry_exceptions=False)
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            import ray

            ray.shutdown()
            self._started = False
        self._stop_reaper()

    def _stop_reaper(self) -> None:
        """Ray shut down cleanly (or never started): nothing left for the reaper to kill."""
        if self._reaper is not None:
            self._reaper.kill()
            self._reaper.wait()
            self._reaper = None

    def map(self, fn: Callable, tasks: Sequence, names: Sequence[str], progress=None) -> list:
        """``fn`` over ``tasks`` as Ray tasks, at most :meth:`in_flight` submitted and not yet taken
        at a time (the driver's Ray state — task specs, their arguments, references — stays bounded
        by the cluster's size, not the task count); results in task order."""
        import ray

        window = self.in_flight(ray)
        out = [None] * len(tasks)
        index: dict = {}
        pending: list = []
        nxt = 0
        try:
            while nxt < len(tasks) or pending:
                while nxt < len(tasks) and len(pending) < window:
                    ref = self._remote.remote(fn, tasks[nxt])
                    index[ref] = nxt
                    pending.append(ref)
                    nxt += 1
                ref = None
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    i = index.pop(ref)  # the last reference to a finished task: Ray frees its copy of
                    out[i] = _ray_result(ray, ref, names[i])  # the result and the task's lineage
                    if progress:
                        progress(advance=1)
                done = ref = None
        except BaseException:
            _cancel(ray, pending)
            raise
        return out

    def in_flight(self, ray) -> int:
        """Tasks submitted and not yet taken, at most: RAY_IN_FLIGHT_PER_CPU per CPU of the cluster
        (``ray.cluster_resources``), at least RAY_IN_FLIGHT_MIN."""
        try:
            cpus = int(ray.cluster_resources().get("CPU", 0))
        except Exception:  # a cluster that cannot say: the floor
            cpus = 0
        return max(RAY_IN_FLIGHT_MIN, RAY_IN_FLIGHT_PER_CPU * cpus)


RAY_CONNECT_TIMEOUT_S = 10.0
"""How long ``--address HOST:PORT`` may take to accept a TCP connection (Ray itself retries for minutes)."""

RAY_ANSWER_TIMEOUT_S = 3.0
"""How long a port that accepted the TCP connection may take to answer the HTTP/2 connection preface
(a Ray head's GCS and Ray Client ports are gRPC servers, which answer with their SETTINGS frame)."""

_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""The HTTP/2 client connection preface followed by an empty SETTINGS frame (RFC 9113, sections 3.4
and 6.5: a 9-byte frame header of length 0, type 0x4, no flags, stream 0)."""


RAY_JOIN_TIMEOUTS = {
    "RAY_gcs_server_port_wait_time_s": "2",      # attempts to reach the GCS (Ray's default: 20)
    "RAY_gcs_rpc_server_connect_timeout_s": "3",  # each attempt's gRPC connect timeout, s
    "RAY_py_gcs_connect_timeout_s": "5",         # each attempt's wait for the cluster id, s
}
"""Ray's own settings (environment variables) for joining
``HOST:PORT``: with its defaults a port that accepts TCP but is not a Ray head (a mistyped port of
another service) keeps ``ray.init`` retrying for minutes; these cut the retries and timeouts
(benchmarks/README.md has the times). A value the user set in the environment is kept."""


@contextlib.contextmanager
def _quiet_fd2(on: bool):
    """Hold what is written to file descriptor 2 (Ray's C++ client logs three warnings per failed
    attempt to join a cluster there, below Python's sys.stderr) while the block runs; write it
    out after a success, drop it after a failure (whose one-line error says what happened)."""
    import sys
    import tempfile

    if not on:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        text = held.read().decode(errors="replace")
    if text:
        sys.stderr.write(text)


@contextlib.contextmanager
def _join_timeouts(on: bool):
    """RAY_JOIN_TIMEOUTS in the environment while the block runs (Ray reads some when it is first
    imported, the others in ``ray.init``), then the environment as it was (no later Ray start in
    the process, e.g. a local head, gets them)."""
    old = {k: os.environ.get(k) for k in RAY_JOIN_TIMEOUTS} if on else {}
    for k, v in RAY_JOIN_TIMEOUTS.items() if on else ():
        os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)


def _auto_address() -> str | None:
    """The ``HOST:PORT`` that ``--address auto`` resolves to (Ray's own lookup: ``RAY_ADDRESS``, then
    the latest cluster started on this machine), or None when Ray finds none or cannot say."""
    try:
        from ray._private.services import get_ray_address_from_environment

        found = get_ray_address_from_environment("auto", None)
    except Exception:  # no cluster found, or a Ray whose private lookup differs: ray.init says why
        return None
    return found if isinstance(found, str) and found != "auto" and ":" in found else None


def _check_reachable(address: str, given: str | None = None) -> None:
    """BadInputError unless ``HOST:PORT`` (a Ray head's GCS port, ``ray://`` for Ray Client) accepts a
    TCP connection within RAY_CONNECT_TIMEOUT_S and answers the HTTP/2 connection preface with a
    SETTINGS frame within RAY_ANSWER_TIMEOUT_S, as a gRPC server does (not checked when
    ``RAY_USE_TLS`` is set: that port expects TLS first). ``given``: what the user wrote, when
    ``address`` was found from it. A port that accepts and says nothing thus fails in seconds
    rather than after Ray's join retries (RAY_JOIN_TIMEOUTS)."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise BadInputError(f"--address must be auto or HOST:PORT, got {address!r}")
    via = f" (--address {given})" if given else ""
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise BadInputError(f"cannot reach a Ray cluster at {address}{via} ({exc.strerror or exc})") from None
    with sock:
        if os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true"):
            return  # a TLS cluster's port expects a TLS handshake first: Ray's own join says what fails
        answer = _h2_answer(sock)
    if answer is None:
        why = f"accepts TCP connections but sent nothing in {RAY_ANSWER_TIMEOUT_S:g} s"
    elif not answer:
        why = "closed the connection on the HTTP/2 preface"
    elif len(answer) < 4 or answer[3] != 4:  # not an HTTP/2 SETTINGS frame's header
        why = "answered, but not as a gRPC (HTTP/2) server"
    else:
        return
    port_kind = "Ray Client server's port" if address.startswith("ray://") else "Ray head's GCS port"
    raise BadInputError(f"cannot join a Ray cluster at {address}{via}: the port {why} (not a {port_kind}?)")


def _h2_answer(sock) -> bytes | None:
    """The first bytes (up to a frame header, 9) that the server on ``sock`` sends after the HTTP/2
    connection preface (:data:`_H2_PREFACE`) within RAY_ANSWER_TIMEOUT_S in all, b"" when it closes
    (or resets) the connection first, None when it sends nothing in that time."""
    import socket
    import time

    deadline = time.monotonic() + RAY_ANSWER_TIMEOUT_S  # for the whole answer, not each recv
    got = b""
    try:
        sock.settimeout(RAY_ANSWER_TIMEOUT_S)
        sock.sendall(_H2_PREFACE)
        while len(got) < 9:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout
            sock.settimeout(left)
            part = sock.recv(9 - len(got))
            if not part:
                break
            got += part
    except socket.timeout:
        return got or None
    except OSError:  # reset by the peer
        pass
    return got


def _ray_result(ray, ref, name: str):
    """``ray.get(ref)``: a task's own TracekitError comes out as it was raised; Ray's failures
    (a worker lost more than RAY_MAX_RETRIES times, a node gone) as one line naming the file."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else None
        if isinstance(cause, TracekitError):
            raise cause from None
        raise TracekitError(f"{name}: the Ray task failed: {type(cause or exc).__name__}: {cause or exc}") from None
    except ray.exceptions.RayError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise TracekitError(f"{name}: the Ray task was lost ({type(exc).__name__}; {first[:200]})") from None


def _cancel(ray, refs) -> None:
    """Cancel ``refs`` (their workers killed) and wait for them to stop."""
    for r in refs:
        try:
            ray.cancel(r, force=True)
        except Exception:  # a task already finished or never scheduled
            pass
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=RAY_CANCEL_WAIT_S)


def make_engine(engine: str, *, jobs: int | None, parallel: bool, address: str | None = None):
    """The engine called ``engine`` (``local`` | ``ray``). ``jobs``: the local pool's size, or the
    local Ray instance's CPUs; ``parallel``: whether the local engine uses its pool at all.
    Raises BadInputError for another name, or ``address`` with the local engine."""
    if engine == "local":
        if address is not None:
            raise BadInputError("--address applies to --engine ray only")
        return LocalEngine(jobs or 1, parallel)
    if engine == "ray":
        return RayEngine(address, jobs)
    raise BadInputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")


def default_jobs(n_files: int) -> int:
    """The local pool's default size: the files, the cores, at most 4."""
    return min(n_files, os.cpu_count() or 1, 4)

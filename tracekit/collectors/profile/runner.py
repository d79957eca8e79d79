"""Run a user's command with the profiler agent injected, and gather what it wrote.

:func:`run_job` starts COMMAND in its own process group with a private folder
holding only ``sitecustomize.py`` first on ``PYTHONPATH`` (see
``tracekit.collectors.profile.agent``), waits for it, and returns a :class:`JobResult`:
the per-rank traces found, the agents' status files, the ranks that wrote no
trace, notes, and the run config. :func:`profile_command` does that and then
ingests the traces as one run (workload ``external``).

Failure handling:

- the job exits non-zero → the traces written are still gathered, the run is
  marked ``partial`` and the result carries the job's exit code;
- Ctrl-C (SIGINT) → forwarded to the job's process group (the terminal no longer
  sends it there itself: the job runs in a process group of its own); after
  ``grace_s`` seconds, or at a second Ctrl-C, SIGTERM, then SIGKILL 5 s later.
  The run is partial with exit code 130;
- when the job's main process has ended, every process still carrying this job's
  marker in its environment (``TRACEKIT_PROFILE_JOB``) or still in its process
  group — rank processes a launcher left behind — gets SIGTERM, then SIGKILL:
  no rank process outlives ``tracekit profile``.

Multi-node (``tracekit.collectors.rundir.detect_launcher``: torchrun ``--nnodes`` > 1 with ``--node-rank``, or
srun's ``SLURM_NTASKS`` > 1): the run folder is shared, ``<out>/<run id>`` with a run id every node
derives alike (``tracekit.collectors.rundir.join_run_dir``); after its job each node writes
``logs/node<i>.json``; node 0 then waits for the others (``tracekit.collectors.rundir.wait_for_ranks``,
``expect_ranks``, ``wait_timeout_s``) and gathers every node's ranks; the other nodes stop there.
Under srun the job gets RANK / WORLD_SIZE / LOCAL_RANK from the SLURM_* variables where unset.

With ``ProfileOptions(nsys=True)`` (``tracekit profile --nsys``) no agent is
injected: COMMAND runs as ``nsys profile ... -o <run_dir>/job COMMAND``
(:func:`tracekit.collectors.nsys.nsys_command`; nsys follows the child processes itself)
and the one export, ``job.sqlite``, is what is gathered and ingested. One nsys
session is one file, so all the job's processes (every rank) land in it and
are ingested as one rank; the run config and the notes say so. Written and
tested against a fake ``nsys`` only (no Nsight Systems where this was written).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tracekit.errors import BadInputError, TracekitError

HERE = Path(__file__).resolve().parent
AGENT_PATH = HERE / "agent.py"  # injected by path: stdlib + torch only
SITECUSTOMIZE_PATH = HERE / "sitecustomize.py"
ENV_JOB = "TRACEKIT_PROFILE_JOB"
USAGE = "usage: tracekit profile [OPTIONS] -- COMMAND [ARGS]... (e.g. tracekit profile -- torchrun --nproc-per-node 2 train.py)"


class JobFailedError(TracekitError):
    """The profiled job failed (or was interrupted): tracekit exits with the job's own code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code if exit_code else 1

    def __reduce__(self):
        return (type(self), (str(self), self.exit_code))


@dataclass
class ProfileOptions:
    """The profiler schedule and where things go (see ``tracekit profile --help``)."""

    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    record_shapes: bool = True
    with_stack: bool = False
    out: str | None = None
    run_id: str | None = None
    grace_s: float = 10.0
    #: run the command under ``nsys profile`` instead of injecting torch.profiler
    nsys: bool = False
    #: multi-node: ranks node 0 waits for (None: the world size the ranks report)
    expect_ranks: int | None = None
    #: multi-node: how long node 0 waits for the other nodes after its own job ended, s
    wait_timeout_s: float = 300.0
    #: Flight Recorder on in every rank; each rank dumps into the run folder when the job ends or times out
    fr: bool = False
    #: Flight Recorder entries kept per rank (TORCH_FR_BUFFER_SIZE)
    fr_buffer: int = 2000
    #: Flight Recorder only: no torch.profiler in the ranks (implies fr)
    fr_only: bool = False
    #: stop the job after this many seconds (the ranks dump their Flight Recorder first); None: no limit
    timeout_s: float | None = None

    def validated(self) -> "ProfileOptions":
        for name in ("wait", "warmup", "repeat"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise BadInputError(f"--{name} must be an integer >= 0, got {v}")
        if not isinstance(self.active, int) or self.active < 1:
            raise BadInputError(f"--active must be an integer >= 1, got {self.active}")
        if self.run_id is not None:
            from tracekit.store import check_run_id

            check_run_id(self.run_id)
        if self.grace_s < 0:
            raise BadInputError(f"grace must be >= 0 s, got {self.grace_s}")
        if self.expect_ranks is not None and (not isinstance(self.expect_ranks, int) or self.expect_ranks < 1):
            raise BadInputError(f"--expect-ranks must be an integer >= 1, got {self.expect_ranks}")
        if not self.wait_timeout_s >= 0:
            raise BadInputError(f"--nodes-timeout must be >= 0 s, got {self.wait_timeout_s}")
        if not isinstance(self.fr_buffer, int) or self.fr_buffer < 1:
            raise BadInputError(f"--fr-buffer must be an integer >= 1, got {self.fr_buffer}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise BadInputError(f"--timeout must be > 0 s, got {self.timeout_s}")
        if (self.fr or self.fr_only) and self.nsys:
            raise BadInputError("--fr/--fr-only dump through the injected agent, which --nsys replaces: drop one of them")
        return self

    def agent_config(self) -> dict[str, Any]:
        return {
            "wait": self.wait,
            "warmup": self.warmup,
            "active": self.active,
            "repeat": self.repeat,
            "record_shapes": self.record_shapes,
            "with_stack": self.with_stack,
            "fr": self.fr or self.fr_only,
            "fr_only": self.fr_only,
        }


@dataclass
class JobResult:
    run_id: str
    run_dir: Path
    command: list[str]
    exit_code: int
    interrupted: bool
    wall_s: float
    statuses: list[dict] = field(default_factory=list)
    traces: dict[int, Path] = field(default_factory=dict)
    world_size: int | None = None
    missing_ranks: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    #: the ``nsys profile ...`` prefix the command ran under (empty: torch.profiler agent)
    nsys_command: list[str] = field(default_factory=list)
    #: a multi-node job: this ``tracekit profile``'s place in it (None: single node)
    launcher: Any = None
    #: multi-node, node 0: what waiting for the other nodes saw (tracekit.collectors.rundir.WaitResult)
    wait: Any = None
    #: --timeout: the job ran past it and was stopped
    timed_out: bool = False
    #: --fr: rank → its Flight Recorder dump in the run folder
    fr_dumps: dict[int, Path] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return bool(self.config.get("partial"))


# --------------------------------------------------------------------------- processes


def _read_environ(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return None


def job_processes(marker: str, pgid: int | None = None) -> list[int]:
    """Live processes of the job: those whose environment holds ``TRACEKIT_PROFILE_JOB=<marker>``
    or whose process group is `pgid` (Linux /proc; elsewhere only the group is used)."""
    me = os.getpid()
    needle = f"{ENV_JOB}={marker}".encode()
    found = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        if pid == me:
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # fields after the command name (which may hold spaces) start at the last ')'
        rest = stat[stat.rfind(")") + 2 :].split()
        if not rest or rest[0] == "Z":
            continue
        in_group = pgid is not None and len(rest) > 2 and rest[2] == str(pgid)
        env = _read_environ(pid)
        if in_group or (env is not None and needle in env.split(b"\0")):
            found.append(pid)
    return found


def _signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _killpg(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap_job(marker: str, pgid: int, wait_s: float = 5.0) -> list[int]:
    """End every process the job left: wait up to `wait_s` for them to exit by themselves,
    then SIGTERM, then SIGKILL after 3 s. Returns the pids that had to be signalled."""
    end = time.monotonic() + wait_s
    left = job_processes(marker, pgid)
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = job_processes(marker, pgid)
    if not left:
        return []
    signalled = list(left)
    _signal_all(left, signal.SIGTERM)
    end = time.monotonic() + 3.0
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = job_processes(marker, pgid)
    if left:
        _signal_all(left, signal.SIGKILL)
        end = time.monotonic() + 3.0
        while job_processes(marker, pgid) and time.monotonic() < end:
            time.sleep(0.05)
    return signalled


def _exit_code(returncode: int) -> int:
    """Popen's return code as a shell would report it (signal n → 128 + n)."""
    return 128 - returncode if returncode < 0 else returncode


# --------------------------------------------------------------------------- the job


def _prepare_site_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="tracekit-site-"))
    shutil.copyfile(SITECUSTOMIZE_PATH, d / "sitecustomize.py")
    return d


def job_env(site_dir: Path, run_dir: Path, opts: ProfileOptions, marker: str, base: dict | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(site_dir) + (os.pathsep + old if old else "")
    env["TRACEKIT_PROFILE_DIR"] = str(run_dir.resolve())
    env["TRACEKIT_PROFILE_AGENT"] = str(AGENT_PATH)
    env["TRACEKIT_PROFILE_CONFIG"] = json.dumps(opts.agent_config())
    env[ENV_JOB] = marker
    if opts.fr or opts.fr_only:  # read by torch when the process group is created (torch/csrc/distributed/c10d/FlightRecorder.hpp)
        env["TORCH_FR_BUFFER_SIZE"] = str(opts.fr_buffer)
    return env


def _make_run_dir(opts: ProfileOptions) -> Path:
    from tracekit.collectors.rundir import new_run_dir

    base = Path(opts.out) if opts.out is not None else Path("tracekit-runs")
    if opts.run_id is None:
        return new_run_dir(base, "external")
    d = base / opts.run_id
    try:
        base.mkdir(parents=True, exist_ok=True)
        d.mkdir()
    except FileExistsError:
        raise BadInputError(f"{d}: already exists (choose another --run-id or --out)") from None
    except OSError as exc:
        raise BadInputError(f"{d}: cannot create the run folder ({exc.strerror or exc})") from None
    return d


def run_job(
    command: list[str],
    opts: ProfileOptions,
    on_progress: Callable[[str], None] | None = None,
) -> JobResult:
    """Run `command` with the profiler agent injected; gather its traces (see module docstring).

    Raises BadInputError (exit 2) for an empty command, bad options, or a command
    that cannot be started. Never raises because the job failed: that is in the result.
    """
    if not command:
        raise BadInputError(USAGE)
    opts = opts.validated()
    from tracekit.collectors.rundir import detect_launcher, join_run_dir, slurm_rank_env

    launcher = detect_launcher(list(command))
    prefix: list[str] = []
    if opts.nsys:
        from tracekit.collectors.nsys import find_nsys

        if launcher is not None:
            raise BadInputError("--nsys profiles one node's job as one file: not for a multi-node launch "
                                f"({launcher.source} {launcher.index}); drop --nsys")
        nsys = find_nsys()  # no nsys: a clear error before anything is created
    if launcher is not None:
        run_dir = join_run_dir(opts.out, opts.run_id or launcher.default_run_id, launcher)
    else:
        run_dir = _make_run_dir(opts)
    site_dir = _prepare_site_dir()
    marker = secrets.token_hex(8)
    if opts.nsys:
        from tracekit.collectors.nsys import nsys_command

        prefix = nsys_command(nsys, run_dir.resolve() / "job")
        env = {**os.environ, ENV_JOB: marker}  # no agent: nsys records
    else:
        env = job_env(site_dir, run_dir, opts, marker)
        if launcher is not None and launcher.slurm_ranks:
            env.update(slurm_rank_env(env))
    kwargs: dict[str, Any] = {}
    if sys.version_info >= (3, 11):
        kwargs["process_group"] = 0
    else:  # pragma: no cover
        kwargs["preexec_fn"] = os.setpgrp
    created = _dt.datetime.now(_dt.timezone.utc).astimezone()
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(prefix + list(command), env=env, **kwargs)
    except OSError as exc:
        shutil.rmtree(site_dir, ignore_errors=True)
        if launcher is None:  # a shared multi-node folder holds the other nodes' files: kept
            shutil.rmtree(run_dir, ignore_errors=True)
        if isinstance(exc, FileNotFoundError):
            raise BadInputError(f"{command[0]}: command not found") from None
        raise BadInputError(f"{command[0]}: cannot start it ({exc.strerror or exc})") from None
    pgid = proc.pid

    state = {"interrupts": 0, "first": None, "termed": False, "killed_at": None}

    def on_sigint(signum, frame):
        state["interrupts"] += 1
        if state["interrupts"] == 1:
            state["first"] = time.monotonic()
            if on_progress:
                on_progress("interrupted: stopping the job (Ctrl-C again to force)")
            if opts.fr or opts.fr_only:  # every rank dumps, even one blocked inside a collective (fr_agent's watcher)
                try:
                    (run_dir / "fr-dump-request").write_text("interrupt\n")
                except OSError:
                    pass
            _killpg(pgid, signal.SIGINT)
        else:
            state["first"] = -1e9  # escalate now

    old_handler = None
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        old_handler = signal.signal(signal.SIGINT, on_sigint)
    deadline = None if opts.timeout_s is None else time.monotonic() + opts.timeout_s
    try:
        while proc.poll() is None:
            time.sleep(0.05)
            if deadline is not None and time.monotonic() > deadline and state["first"] is None:
                state["timed_out"] = True  # --timeout: every rank dumps, then the job is stopped
                _request_fr_dumps(run_dir, opts, proc, on_progress)
                state["first"] = -1e9  # escalate at once: SIGTERM, then SIGKILL 5 s later
            if state["first"] is None:
                continue
            now = time.monotonic()
            if not state["termed"] and now - state["first"] > opts.grace_s:
                state["termed"] = True
                state["killed_at"] = now + 5.0
                _killpg(pgid, signal.SIGTERM)
                _signal_all(job_processes(marker, pgid), signal.SIGTERM)
            elif state["termed"] and now > state["killed_at"]:
                _killpg(pgid, signal.SIGKILL)
                _signal_all(job_processes(marker, pgid), signal.SIGKILL)
                state["killed_at"] = now + 1.0
        code = _exit_code(proc.returncode)
        # whatever the job left behind (ranks of a launcher that died first): end it
        leftovers = reap_job(marker, pgid, wait_s=0.5 if state["interrupts"] else 5.0)
    finally:
        if in_main:
            signal.signal(signal.SIGINT, old_handler)
        if proc.poll() is None:  # an exception in this function (not the job): leave nothing behind
            _killpg(pgid, signal.SIGKILL)
            _signal_all(job_processes(marker, pgid), signal.SIGKILL)
            proc.wait()
        shutil.rmtree(site_dir, ignore_errors=True)
    wall = time.perf_counter() - t0
    interrupted = state["interrupts"] > 0
    if interrupted:
        code = 130
    if state.get("timed_out"):
        code = 124  # as timeout(1)
    result = JobResult(
        run_id=run_dir.name, run_dir=run_dir, command=list(command), exit_code=code,
        interrupted=interrupted, wall_s=wall, nsys_command=prefix, launcher=launcher,
        timed_out=bool(state.get("timed_out")),
    )
    if launcher is not None and not _node_done(result, opts, marker, on_progress):
        return result  # not node 0: its ranks' files are written, node 0 ingests
    gather(result, opts, created, leftovers)
    _gather_fr(result, opts)
    return result


def _request_fr_dumps(run_dir: Path, opts: ProfileOptions, proc, on_progress, wait_s: float = 5.0) -> None:
    """--timeout: ask every rank for its Flight Recorder dump (the request file its
    tracekit.collectors.fr_agent watcher polls for), then wait until as many dumps as agents that
    started have appeared, the job ends, or ``wait_s`` passes."""
    if on_progress:
        on_progress(f"the job ran past --timeout {opts.timeout_s:g} s: stopping it"
                    + (" (each rank dumps its Flight Recorder first)" if opts.fr else ""))
    if not (opts.fr or opts.fr_only):
        return
    from tracekit.collectors.fr_agent import REQUEST_FILE

    try:
        (run_dir / REQUEST_FILE).write_text("timeout\n")
    except OSError:
        return
    want = len(list((run_dir / "logs").glob("rank*.claim")))
    end = time.monotonic() + wait_s
    while time.monotonic() < end and proc.poll() is None:
        if want and len(list(run_dir.glob("fr-rank*.json"))) >= want:
            break
        time.sleep(0.1)


def _gather_fr(result: JobResult, opts: ProfileOptions) -> None:
    """--fr: the ranks' Flight Recorder dumps in the run folder, and a note naming the ranks that
    left none."""
    import re

    for f in sorted(result.run_dir.glob("fr-rank*.json")):
        m = re.fullmatch(r"fr-rank(\d+)\.json", f.name)
        if m:
            result.fr_dumps[int(m.group(1))] = f
    (result.run_dir / "fr-dump-request").unlink(missing_ok=True)
    if opts.fr or opts.fr_only:
        world = result.world_size or (max(result.fr_dumps) + 1 if result.fr_dumps else 0)
        none = [r for r in range(world) if r not in result.fr_dumps]
        if none:
            result.notes.append(f"Flight Recorder: rank(s) {', '.join(map(str, none))} left no dump "
                                "(killed before dumping, or never initialised torch.distributed)")
        if isinstance(result.config, dict) and result.config:
            result.config["flight_recorder"] = {"buffer_size": opts.fr_buffer, "ranks_without_dump": none,
                                                "dumps": [f.name for _r, f in sorted(result.fr_dumps.items())],
                                                "only": opts.fr_only}
            if opts.fr_only:  # no trace was expected: partial when a rank left no dump
                result.missing_ranks = none
                result.config["missing_ranks"] = none
                result.config["partial"] = bool(result.exit_code or result.interrupted or none)
    if result.timed_out:
        result.notes.append(f"the job ran past --timeout {opts.timeout_s:g} s and was stopped")
        if isinstance(result.config, dict) and result.config:
            result.config["timed_out_after_s"] = opts.timeout_s
    if (opts.fr or opts.fr_only or result.timed_out) and isinstance(result.config, dict) and result.config:
        path = result.run_dir / "run_config.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result.config, indent=2, default=str) + "\n")
        os.replace(tmp, path)


def _node_done(result: JobResult, opts: ProfileOptions, marker: str, on_progress) -> bool:
    """Multi-node: write this node's logs/node{i}.json; on node 0 wait for the others (True: gather
    and ingest here); elsewhere fill `result` with this node's own ranks (False: done)."""
    from tracekit.collectors.rundir import read_statuses, wait_for_ranks, write_node_status

    launcher, run_dir = result.launcher, result.run_dir
    mine = [s for s in read_statuses(run_dir, "agent.*.json") if s.get("job") == marker]
    ranks = sorted({s["rank"] for s in mine if isinstance(s.get("rank"), int) and s.get("claimed", True)})
    write_node_status(run_dir, launcher, {
        "exit_code": result.exit_code, "interrupted": result.interrupted, "wall_s": round(result.wall_s, 3),
        "ranks": ranks, "source": launcher.source,
    })
    if launcher.index != 0:
        result.statuses = mine
        result.traces = {r: run_dir / f"rank{r}.pt.trace.json.gz" for r in ranks
                         if (run_dir / f"rank{r}.pt.trace.json.gz").is_file()}
        return False
    if not result.interrupted:
        result.wait = wait_for_ranks(run_dir, launcher, expect_ranks=opts.expect_ranks,
                                     timeout_s=opts.wait_timeout_s, on_progress=on_progress)
    return True


# --------------------------------------------------------------------------- what the job wrote


def _rank_of_trace(name: str) -> int | None:
    if name.startswith("rank") and name.endswith(".pt.trace.json.gz"):
        num = name[len("rank") : -len(".pt.trace.json.gz")]
        if num.isdigit():
            return int(num)
    return None


def gather(result: JobResult, opts: ProfileOptions, created: _dt.datetime, leftovers: list[int] = ()) -> None:
    """Fill `result` from the run folder: traces, agent statuses, missing ranks, notes, config."""
    if opts.nsys:
        return _gather_nsys(result, opts, created, leftovers)
    run_dir = result.run_dir
    statuses = []
    for f in sorted((run_dir / "logs").glob("agent.*.json")):
        try:
            statuses.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            result.notes.append(f"{f}: unreadable agent status (process killed while writing it?)")
    statuses.sort(key=lambda s: (s.get("rank") is None, s.get("rank") or 0, s.get("pid") or 0))
    result.statuses = statuses
    still_writing = result.wait is not None and result.wait.timed_out  # another node may be exporting
    for f in ([] if still_writing else run_dir.rglob("*.tmp*.gz")):  # an export cut short (process killed)
        result.notes.append(f"{f.name}: a trace export was cut short (process killed while writing); removed")
        f.unlink(missing_ok=True)
    for f in sorted(run_dir.glob("rank*.pt.trace.json.gz")):
        r = _rank_of_trace(f.name)
        if r is not None:
            result.traces[r] = f
    dist_status = [s for s in statuses if s.get("dist")]
    worlds = [s["world_size"] for s in dist_status if isinstance(s.get("world_size"), int)]
    if worlds:
        result.world_size = max(worlds)
    elif statuses:
        result.world_size = max([s.get("world_size") or 1 for s in statuses] + [len(result.traces)])
    elif result.traces:
        result.world_size = max(result.traces) + 1
    notes = result.notes
    if opts.expect_ranks and worlds and opts.expect_ranks != max(worlds):
        # torch.distributed's world size is the job's own count: ranks beyond it cannot exist
        notes.append(f"--expect-ranks {opts.expect_ranks}, but the job's torch.distributed world size is "
                     f"{max(worlds)}: its ranks are counted against {max(worlds)}")
    elif opts.expect_ranks:
        result.world_size = max(result.world_size or 0, opts.expect_ranks)
    if result.world_size and not opts.fr_only:  # --fr-only: no trace is expected (_gather_fr names missing dumps)
        result.missing_ranks = [r for r in range(result.world_size) if r not in result.traces]

    if result.interrupted:
        notes.append("interrupted (Ctrl-C): the job was stopped; the traces written so far are kept")
    elif result.exit_code != 0:
        notes.append(f"the job exited with code {result.exit_code}")
    if statuses and not dist_status:
        ranks = sorted({s.get("rank") for s in statuses if s.get("rank") is not None})
        notes.append(
            "the job never initialised torch.distributed: profiled as a single rank "
            f"({', '.join(f'rank {r}' for r in ranks)}), from its first step"
        )
    by_rank: dict[int, list[dict]] = {}
    for s in statuses:
        if s.get("rank") is not None:
            by_rank.setdefault(s["rank"], []).append(s)
    unseen = [r for r in result.missing_ranks if not by_rank.get(r)]
    if unseen:  # one line however many
        notes.append(
            f"rank{'s' if len(unseen) > 1 else ''} {', '.join(map(str, unseen))}: no trace and no agent status (the "
            "process died before torch.distributed was initialised, was killed with SIGKILL or os._exit before "
            "writing, or did not run Python" + (", or its node has not finished" if result.launcher else "") + ")"
        )
    for r in result.missing_ranks:
        sts = by_rank.get(r)
        if not sts:
            continue
        s = sts[0]
        if s.get("finished"):
            why = (f"stopped ({s.get('exit_reason') or 'unknown'}) after {s.get('steps', 0)} step(s), in the "
                   f"{s.get('phase_at_stop') or 'unknown'} phase of the profiler schedule")
        else:
            why = "its process ended without running its exit handlers: killed (SIGKILL), crashed, or os._exit"
        notes.append(f"rank {r}: no trace ({why})")
    for s in statuses:
        for n in s.get("notes") or []:
            if n.startswith("profiler started at") or n.startswith("torch.distributed was never initialised"):
                continue
            if n.startswith("stopped (") and s.get("rank") in result.missing_ranks:
                continue  # said above
            notes.append(f"rank {s.get('rank')}: {n}")
        if not s.get("steps") and s.get("traces") == [] and s.get("finished") and not s.get("stood_down"):
            notes.append(
                f"rank {s.get('rank')}: no step was seen (no optimizer step, no tracekit.step()); "
                "call tracekit.step() once per iteration in loops without an optimizer"
            )
    extra_cycles = sorted({p.split("/")[0] for s in statuses for p in s.get("traces") or [] if p.startswith("cycle")})
    if extra_cycles:
        notes.append(
            f"profiler cycles after the first are in {', '.join(str(run_dir / c) for c in extra_cycles)} "
            "(not ingested; ingest each with `tracekit ingest DIR`)"
        )
    if (run_dir / "extra").is_dir():
        notes.append(f"traces of processes that duplicated a rank are in {run_dir / 'extra'} (not ingested)")
    if leftovers:
        notes.append(f"{len(leftovers)} process(es) of the job were still running after it ended and were stopped")

    per_rank_overhead = {
        str(s["rank"]): round(s["overhead_pct"], 2)
        for s in statuses
        if s.get("rank") is not None and s.get("overhead_pct") is not None and s.get("claimed", True)
    }
    sources = sorted({s.get("step_source") for s in statuses if s.get("step_source")})
    partial = result.exit_code != 0 or result.interrupted or bool(result.missing_ranks)
    first = statuses[0] if statuses else {}
    cfg: dict[str, Any] = {
        "workload": "external",
        "run_id": result.run_id,
        "created_at": created.isoformat(timespec="seconds"),
        "command": result.command,
        "command_line": shlex.join(result.command),
        "cwd": os.getcwd(),
        "exit_code": result.exit_code,
        "interrupted": result.interrupted,
        "partial": partial,
        "world_size": result.world_size,
        "ranks_with_trace": sorted(result.traces),
        "missing_ranks": result.missing_ranks,
        "distributed": bool(dist_status),
        "backend": first.get("backend"),
        "torch_version": first.get("torch_version"),
        "hostname": first.get("host"),
        "profiler": {
            **opts.agent_config(),
            "step_source": sources[0] if len(sources) == 1 else sources,
            "started_at": "init_process_group" if dist_status else ("first step" if statuses else None),
        },
        "notes": notes,
        "timing": {
            "job_wall_s": round(result.wall_s, 3),
            "clock": "time.perf_counter between consecutive steps, per rank, by profiler phase",
            "per_rank": {
                str(s.get("rank")): {
                    "steps": s.get("steps"),
                    "median_record_step_s": s.get("median_record_step_s"),
                    "median_idle_step_s": s.get("median_idle_step_s"),
                }
                for s in statuses
                if s.get("rank") is not None
            },
        },
        "traces": [p.name for _, p in sorted(result.traces.items())],
        "overlap_model": {"kind": "no_overlap", "params": {}},  # a user's job: nothing known about its overlap
    }
    if result.launcher is not None:
        _multinode_config(result, cfg)
    if per_rank_overhead:
        cfg["profiler_overhead_pct"] = round(statistics.median(per_rank_overhead.values()), 2)
        cfg["profiler_overhead"] = {
            "per_rank_pct": per_rank_overhead,
            "method": "median step time while the profiler records vs while it is idle (wait steps after the "
            "first, steps after the last cycle), same run; median over ranks",
        }
    result.config = cfg
    path = run_dir / "run_config.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(cfg, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _multinode_config(result: JobResult, cfg: dict) -> None:
    """Node 0 of a multi-node job: every node's end (logs/node{i}.json) and the wait, into the config."""
    from tracekit.collectors.rundir import read_statuses

    launcher, wait = result.launcher, result.wait
    nodes = sorted(read_statuses(result.run_dir, "node*.json"), key=lambda n: n.get("index", 0))
    done = {n.get("index") for n in nodes}
    missing_nodes = [i for i in range(launcher.count or 0) if i not in done]
    failed = {n["index"]: n.get("exit_code") for n in nodes if n.get("exit_code")}
    cfg["launch"] = {"source": launcher.source, "launchers": launcher.count, "job_key": launcher.job_key}
    cfg["nodes"] = nodes
    cfg["missing_nodes"] = missing_nodes
    cfg["failed_nodes"] = failed
    cfg["hosts"] = sorted({n.get("host") for n in nodes if n.get("host")})
    if wait is not None:
        cfg["wait"] = {"waited_s": round(wait.waited_s, 3), "timed_out": wait.timed_out}
        if wait.timed_out and result.missing_ranks:
            cfg["notes"].insert(0, f"waited {wait.waited_s:.0f} s for the other nodes: no trace from rank(s) "
                                   f"{', '.join(map(str, result.missing_ranks))} of {result.world_size}")
    if failed:
        cfg["notes"].append("node(s) " + ", ".join(f"{i} (exit code {c})" for i, c in sorted(failed.items()))
                            + " ended with an error")
    if missing_nodes:  # partial only through the ranks they leave missing
        cfg["notes"].append(f"node(s) {', '.join(map(str, missing_nodes))} wrote no logs/node<i>.json before node 0 "
                            "stopped waiting" + ("" if result.missing_ranks else " (every rank's trace is here)"))
    cfg["partial"] = bool(cfg["partial"] or failed)


def _gather_nsys(result: JobResult, opts: ProfileOptions, created: _dt.datetime, leftovers: list[int] = ()) -> None:
    """`gather` for a job run under one nsys session: its one export, ``job.sqlite``."""
    import socket

    from tracekit.collectors.nsys import DEFAULT_TRACE, sqlite_path

    run_dir = result.run_dir
    export = sqlite_path(run_dir / "job")
    if export.is_file():
        result.traces[0] = export
        result.world_size = 1
    notes = result.notes
    if result.interrupted:
        notes.append("interrupted (Ctrl-C): the job was stopped; what nsys exported is kept")
    elif result.exit_code != 0:
        notes.append(f"the job (under nsys) exited with code {result.exit_code}")
    if result.traces:
        notes.append(
            f"nsys: one session for the whole job, so all its processes (every rank) are in one file, "
            f"{export.name}, ingested as one rank; for one file per rank run each rank under its own nsys "
            "with the rank in the output name (nsys expands %q{RANK}) and ingest those files"
        )
    if leftovers:
        notes.append(f"{len(leftovers)} process(es) of the job were still running after it ended and were stopped")
    partial = result.exit_code != 0 or result.interrupted or not result.traces
    cfg: dict[str, Any] = {
        "workload": "external",
        "run_id": result.run_id,
        "created_at": created.isoformat(timespec="seconds"),
        "command": result.command,
        "command_line": shlex.join(result.command),
        "cwd": os.getcwd(),
        "exit_code": result.exit_code,
        "interrupted": result.interrupted,
        "partial": partial,
        "world_size": result.world_size,
        "ranks_with_trace": sorted(result.traces),
        "missing_ranks": [],
        "hostname": socket.gethostname(),
        "profiler": {
            "tool": "nsys",
            "nsys": result.nsys_command[0] if result.nsys_command else None,
            "command": result.nsys_command,
            "trace": DEFAULT_TRACE,
            "export": "sqlite",
            "capture": "the whole job, from start to exit",
            "one_file_for_all_ranks": True,
        },
        "notes": notes,
        "timing": {"job_wall_s": round(result.wall_s, 3)},
        "traces": [p.name for _, p in sorted(result.traces.items())],
        "overlap_model": {"kind": "no_overlap", "params": {}},  # a user's job: nothing known about its overlap
    }
    result.config = cfg
    path = run_dir / "run_config.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(cfg, indent=2, default=str) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- run + ingest


def profile_command(
    command: list[str],
    opts: ProfileOptions,
    store=None,
    on_progress: Callable[[str], None] | None = None,
) -> tuple[JobResult, str | None]:
    """Run `command` under the profiler, then ingest its traces as one run.

    Multi-node (torchrun ``--nnodes`` > 1 with ``--node-rank``, or srun's ``SLURM_NTASKS`` > 1; see
    tracekit.collectors.rundir): every node writes into the shared folder ``<out>/<run id>``; node 0 waits for the
    others (``opts.wait_timeout_s``) and ingests; another node returns (result, None) after its job.

    Returns (result, run_id in the store, or None when no trace was written or this is not node 0).
    Raises BadInputError before starting anything when the command is empty, an
    option is bad, or ``--run-id`` already names a run in the store.
    """
    from tracekit.store import Store

    st = store if isinstance(store, Store) else Store(store)
    if not command:
        raise BadInputError(USAGE)
    opts = opts.validated()
    from tracekit.collectors.rundir import detect_launcher

    launcher = detect_launcher(list(command))
    rid = opts.run_id or (launcher.default_run_id if launcher is not None else None)
    if rid is not None and (launcher is None or launcher.index == 0) and st.has_run(rid):
        raise BadInputError(f"run {rid!r} already exists in {st.path} (choose another --run-id"
                            + (", the same on every node)" if launcher is not None else ")"))
    result = run_job(command, opts, on_progress=on_progress)
    if not (result.traces or result.fr_dumps) or (result.launcher is not None and result.launcher.index != 0):
        return result, None  # another node than 0: node 0 ingests
    from tracekit.ingest import ingest_paths

    if on_progress:
        on_progress(f"ingesting {len(result.traces)} rank trace(s)")
    run_id = ingest_paths(
        [str(result.run_dir)], store=st, workload="external", config=result.config, run_id=result.run_id
    )
    return result, run_id


def no_trace_message(result: JobResult) -> str:
    """One line saying why nothing could be ingested."""
    if result.nsys_command:
        return (
            f"nsys wrote no job.sqlite (the job ended before nsys captured anything, or nsys failed: "
            f"see its output above); raw output in {result.run_dir}"
        )
    why = "no rank wrote a trace"
    if any(s.get("stood_down") for s in result.statuses):
        why += (
            ": the job runs its own torch.profiler (only one can run per process), so tracekit's stood down; "
            "ingest the job's own traces with `tracekit ingest DIR`"
        )
    elif not result.statuses:
        why += (
            ": profiling starts when torch.distributed is initialised or at the first optimizer step / "
            "tracekit.step(), and the job reached neither (or its Python ignored PYTHONPATH, e.g. python -I)"
        )
    else:
        steps = max(s.get("steps") or 0 for s in result.statuses)
        need = sum(result.config.get("profiler", {}).get(k, 0) for k in ("wait", "warmup"))
        if steps <= need:
            why += f": the job stopped after {steps} step(s), before the active window (wait + warmup = {need})"
        else:
            why += " (see the notes above)"
    return f"{why}; raw output in {result.run_dir}"

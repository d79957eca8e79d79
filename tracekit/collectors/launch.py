"""Launching real multi-rank workloads: processes, process group, profiler, run folder.

Shared by every built-in workload (tp now; ep, pp, disagg-kv and sweep later).
A workload is a module-level function ``fn(ctx: RankContext, payload) -> dict``
that :func:`launch` runs once per rank, each rank in its own fresh Python
process (``python -m tracekit.collectors._rank``, which never re-imports the caller's
``__main__``), with ``torch.distributed`` already initialised over a free TCP
port on 127.0.0.1. What the function returns (a small picklable dict)
comes back to the parent indexed by rank.

Failures: a rank that raises makes the whole job fail with that rank's error
(the first one reported; peers that then fail on a closed connection are
secondary). The remaining ranks are terminated, so no process outlives the job,
and each failing rank's traceback is written to ``<run_dir>/logs/rank{r}.error.log``
(next to ``logs/rank{r}.log``, the rank's stdout and stderr).

Torch is imported lazily so that importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses

import datetime as _dt
import os
import pickle
import queue as _queue
import signal
import socket
import struct
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tracekit.errors import BadInputError, TracekitError
from tracekit.collectors.rundir import new_run_dir, new_run_id  # noqa: F401  (the workloads' run folders)

MAX_RANKS = 8
BACKENDS = ("auto", "gloo", "nccl")


class RankFailedError(TracekitError):
    """A rank of a launched job failed (exit 1); the message names the rank and its error."""

    def __init__(self, rank: int, message: str, log_path: str | None = None, errors: list | None = None):
        self.rank = rank
        self.log_path = log_path
        #: every (rank, error type, message) reported, in arrival order
        self.errors = errors or []
        suffix = f" (details in {log_path})" if log_path else ""
        super().__init__(f"rank {rank} failed: {message}{suffix}")


# --------------------------------------------------------------------------- small helpers


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_backend(backend: str, ranks: int) -> str:
    """'auto' → 'nccl' when CUDA is present with a GPU per rank, else 'gloo' (CPU).
    Raises BadInputError for an unknown backend, nccl without CUDA, or more nccl
    ranks than GPUs."""
    if backend not in BACKENDS:
        raise BadInputError(f"unknown backend {backend!r} (choose one of {', '.join(BACKENDS)})")
    has_cuda = cuda_available()
    if backend == "auto":
        if has_cuda:
            import torch

            backend = "nccl" if torch.cuda.device_count() >= ranks else "gloo"
        else:
            backend = "gloo"
    if backend == "nccl":
        if not has_cuda:
            raise BadInputError("backend 'nccl' needs CUDA, but no CUDA device is available (use --backend gloo)")
        import torch

        n = torch.cuda.device_count()
        if ranks > n:
            raise BadInputError(f"backend 'nccl' with {ranks} ranks needs {ranks} GPUs, found {n}")
    return backend


def option(default: Any, help: str, **cli: Any) -> Any:
    """A workload config field that is also a ``tracekit collect`` option (``--name-with-dashes``;
    a bool gives ``--name/--no-name``), declared once: ``help`` is its text; ``cli`` may set
    ``cli_type`` and ``cli_default`` when the command line takes another form than the field (a
    size as text, '64M'). Fields made without it (eps, timeout_s, fault) are not options."""
    return dataclasses.field(default=default, metadata={"help": help, **cli})


@dataclasses.dataclass
class RunOptions:
    """The options every built-in model workload (tp, ep, pp, disagg-kv) shares; each
    workload's config subclasses it and adds its model's own fields after these.

    ``steps=None`` means wait + warmup + active. ``wait``/``warmup``/``active`` are the
    torch.profiler schedule, ``out`` the run folder (default: a new one under
    ``tracekit-runs/``), ``eps`` the norm epsilon, ``timeout_s`` the limit of the whole
    job, ``fault`` a testing-only fault the workload documents (None: none).
    """

    steps: int | None = option(None, "Steps (default: wait + warmup + active).")
    dtype: str = option("float32", "float32, bfloat16 or float16.")
    backend: str = option("auto", "auto (nccl with CUDA, else gloo), gloo or nccl.")
    seed: int = option(0, "Seed of the weights and inputs.")
    wait: int = option(1, "Profiler schedule: steps skipped.")
    warmup: int = option(1, "Profiler schedule: warm-up steps (traced, discarded).")
    active: int = option(3, "Profiler schedule: recorded steps.")
    out: str | None = None
    eps: float = 1e-6
    timeout_s: float = 300.0
    fault: str | None = None


def validate_run_options(backend: str, timeout_s: float, fault: str | None = None, faults: tuple = (None,)) -> None:
    """The checks every built-in workload's config ends with: backend, fault, timeout."""
    if backend not in BACKENDS:
        raise BadInputError(f"unknown backend {backend!r} (choose one of {', '.join(BACKENDS)})")
    if fault not in faults:
        raise BadInputError(f"unknown fault {fault!r}")
    if timeout_s <= 0:
        raise BadInputError(f"timeout_s must be positive, got {timeout_s}")


def active_steps(wait: int, warmup: int, active: int) -> list[int]:
    """ProfilerStep#N numbering: the step indices (0-based) inside the active window."""
    first_active = wait + warmup
    return list(range(first_active, first_active + active))


def config_options(cfg, exclude: tuple[str, ...] = ("out", "timeout_s", "fault")) -> dict[str, Any]:
    """A workload config's fields for its run_config.json, less `exclude`."""
    import dataclasses

    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in exclude}


def overlap_model(kind: str, **params: Any) -> dict[str, Any]:
    """The run config's ``overlap_model`` entry: the overlap model the analysis applies to this run
    (``{"kind": kind, "params": params}``; the kinds and their params are listed in
    analyses/measured_vs_model.py)."""
    return {"kind": kind, "params": params}


def run_config_base(
    info: dict[str, Any], results: list[dict[str, Any]], backend: str, wait: int, warmup: int, active: int
) -> dict[str, Any]:
    """The versions/host fields and the torch ``profiler`` block of a built-in
    workload's run_config.json (in this key order)."""
    return {
        "torch_version": info["torch_version"],
        "nccl_version": info.get("nccl_version"),
        "python_version": info["python_version"],
        "platform": info["platform"],
        "device_name": info["device_name"],
        "hostname": info["hostname"],
        "cpu_count": info["cpu_count"],
        "threads_per_rank": results[0]["threads"] if results else None,
        "profiler": {
            "wait": wait,
            "warmup": warmup,
            "active": active,
            "repeat": 1,
            "record_shapes": True,
            "activities": ["CPU", "CUDA"] if backend == "nccl" else ["CPU"],
            "active_steps": active_steps(wait, warmup, active),
        },
    }


def step_medians(per_rank_steps: list[list[float]], active: list[int]) -> dict[str, float | None]:
    """``median_step_s`` (all ranks, every step but the first, cold one) and
    ``median_active_step_s`` (all ranks, the steps in `active`)."""
    import statistics

    after_first = [s for r in per_rank_steps for s in r[1:]]
    in_active = [s for r in per_rank_steps for i, s in enumerate(r) if i in active]
    return {
        "median_step_s": round(statistics.median(after_first), 6) if after_first else None,
        "median_active_step_s": round(statistics.median(in_active), 6) if in_active else None,
    }


def timed_launch(
    rank_fn: Callable, cfg, backend: str, run_dir: Path, on_progress=None, **launch_kw
) -> tuple[list[dict[str, Any]], float, _dt.datetime]:
    """:func:`launch` `rank_fn` on ``cfg.ranks`` ranks (``cfg.timeout_s``);
    returns (results, job wall seconds, the local start time)."""
    created = _dt.datetime.now(_dt.timezone.utc).astimezone()
    t0 = time.perf_counter()
    results = launch(rank_fn, cfg.ranks, backend, run_dir, cfg, timeout_s=cfg.timeout_s, on_progress=on_progress, **launch_kw)
    return results, time.perf_counter() - t0, created


def write_json(path: Path, doc: dict[str, Any], indent: int = 2) -> Path:
    """Write `doc` to `path` atomically (a temporary file, then a rename)."""
    import json

    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=indent) + "\n")
    os.replace(tmp, path)
    return path


def validate_ranks(ranks: int) -> None:
    if not isinstance(ranks, int) or ranks < 1 or ranks > MAX_RANKS:
        raise BadInputError(f"ranks must be between 1 and {MAX_RANKS}, got {ranks}")


def validate_schedule(wait: int, warmup: int, active: int, steps: int | None) -> int:
    """Check a profiler schedule and return the number of steps to run
    (``wait + warmup + active`` when `steps` is None)."""
    if wait < 0 or warmup < 0:
        raise BadInputError(f"profiler wait and warmup must be >= 0, got wait={wait} warmup={warmup}")
    if active < 1:
        raise BadInputError(f"profiler active must be >= 1, got {active}")
    need = wait + warmup + active
    if steps is None:
        return need
    if steps < need:
        raise BadInputError(
            f"steps={steps} is fewer than the profiler schedule needs (wait {wait} + warmup {warmup} + active {active} = {need})"
        )
    return steps


def trace_path(run_dir: str | os.PathLike, rank: int) -> Path:
    """Where rank `rank` exports its Kineto trace: ``rank{r}.pt.trace.json.gz``."""
    return Path(run_dir) / f"rank{rank}.pt.trace.json.gz"


def log_path(run_dir: str | os.PathLike, rank: int, kind: str = "log") -> Path:
    """Where rank `rank`'s stdout and stderr go (``logs/rank{r}.log`` in the run
    folder), or with kind="error.log" its traceback when it failed. A subfolder,
    so that ingesting the run folder sees only the traces."""
    return Path(run_dir) / "logs" / f"rank{rank}.{kind}"


def host_info() -> dict[str, Any]:
    """Versions and machine facts for a run config (imports torch)."""
    import platform

    import torch

    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "cpu_count": os.cpu_count(),
        "cuda_available": torch.cuda.is_available(),
        "nccl_version": None,
        "device_name": platform.processor() or platform.machine() or "cpu",
    }
    if torch.cuda.is_available():
        info["device_name"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
        try:
            info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # pragma: no cover - depends on the build
            pass
    else:
        info["device_name"] = _cpu_model_name() or info["device_name"]
    return info


def _cpu_model_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# --------------------------------------------------------------------------- the profiler


@dataclass(frozen=True)
class ProfileSchedule:
    """torch.profiler's wait/warmup/active schedule, run once (repeat=1)."""

    wait: int = 1
    warmup: int = 1
    active: int = 3

    @property
    def total(self) -> int:
        return self.wait + self.warmup + self.active


def make_profiler(schedule: ProfileSchedule, out_file: str | os.PathLike, use_cuda: bool = False):
    """A ``torch.profiler.profile`` with record_shapes, the given schedule (one cycle),
    CPU activity (+CUDA when `use_cuda`), exporting its trace as gzipped Kineto JSON
    to `out_file` when the active window ends. Call ``prof.step()`` after every step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if use_cuda:
        activities.append(ProfilerActivity.CUDA)
    out_file = str(out_file)

    def on_ready(prof) -> None:
        export_trace(prof, out_file)

    return profile(
        activities=activities,
        schedule=torch.profiler.schedule(
            wait=schedule.wait, warmup=schedule.warmup, active=schedule.active, repeat=1
        ),
        on_trace_ready=on_ready,
        record_shapes=True,
    )


def export_trace(prof, out_file: str | os.PathLike) -> Path:
    """Export `prof`'s last cycle as Kineto JSON, gzipped when the name ends in .gz.
    Written to a temporary name, then renamed, so a reader never sees half a file."""
    out_file = Path(out_file)
    tmp = out_file.with_name(out_file.name + ".tmp" + (".gz" if out_file.suffix == ".gz" else ""))
    prof.export_chrome_trace(str(tmp))
    os.replace(tmp, out_file)
    return out_file


# --------------------------------------------------------------------------- spawning ranks


@dataclass
class RankContext:
    """What a rank's workload function gets: who it is and where to write."""

    rank: int
    world_size: int
    backend: str
    run_dir: Path
    device: Any = None  # torch.device
    extra: dict[str, Any] = field(default_factory=dict)
    _queue: Any = field(default=None, repr=False)

    def progress(self, text: str) -> None:
        """Send a short progress line to the parent (shown in its status line)."""
        if self._queue is not None:
            self._queue.put(("progress", self.rank, str(text)))

    @property
    def is_cuda(self) -> bool:
        return self.device is not None and self.device.type == "cuda"

    def trace_path(self) -> Path:
        return trace_path(self.run_dir, self.rank)

    def profiled_steps(self, prof, steps: int, step_s: list | None = None, *, report: bool | None = None):
        """The step numbers 0 … ``steps`` − 1 of a workload's loop under the profiler ``prof``; after
        each step's body: wait for the device (CUDA), append the step's wall time in s to ``step_s``
        (when given), advance the profiler's schedule (``prof.step()``) and send "step k/N" as progress
        (from rank 0, or where ``report`` is true)."""
        import time

        for step in range(steps):
            t0 = time.perf_counter()
            yield step
            if self.is_cuda:
                import torch

                torch.cuda.synchronize(self.device)
            if step_s is not None:
                step_s.append(time.perf_counter() - t0)
            prof.step()
            if (self.rank == 0) if report is None else report:
                self.progress(f"step {step + 1}/{steps}")

    def check_trace(self, out_file: Path) -> None:
        """TracekitError unless the profiler exported ``out_file``."""
        from tracekit.errors import TracekitError

        if not out_file.exists():
            raise TracekitError(f"{out_file}: the profiler exported no trace")


def _set_parent_death_signal() -> None:
    """Linux: have the kernel SIGKILL this process if the parent dies (no orphans)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # pragma: no cover - best effort
        pass


class _Channel:
    """The child's end of its report pipe: pickled (kind, rank, value) messages."""

    def __init__(self, fd: int):
        self._f = os.fdopen(fd, "wb", buffering=0)

    def put(self, msg: tuple) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        self._f.write(struct.pack("<Q", len(data)) + data)


def _read_messages(fd: int, rank: int, sink: "_queue.Queue") -> None:
    """Parent side: forward every message from rank `rank`'s pipe to `sink`, then ("eof", rank, None)."""
    with os.fdopen(fd, "rb") as f:
        while True:
            head = f.read(8)
            if len(head) < 8:
                break
            (n,) = struct.unpack("<Q", head)
            data = f.read(n)
            if len(data) < n:
                break
            try:
                sink.put(pickle.loads(data))
            except Exception as exc:  # a result that cannot be unpickled here
                sink.put(("error", rank, (f"unreadable report from rank: {type(exc).__name__}: {exc}", "")))
    sink.put(("eof", rank, None))


def rank_main(fd: int) -> int:
    """Entry point of one rank's process (``python -m tracekit.collectors._rank FD``):
    read the job from stdin, init the process group, run the workload function,
    report the result (or the error) on pipe `fd`. Returns the exit status."""
    _set_parent_death_signal()
    chan = _Channel(fd)
    rank = -1
    try:
        job = pickle.load(sys.stdin.buffer)
        rank = job["rank"]
        world_size, backend, port = job["world_size"], job["backend"], job["port"]
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
        )
        import torch
        import torch.distributed as dist

        torch.set_num_threads(job["threads"])
        if backend == "nccl":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        init_kwargs: dict[str, Any] = {}
        if backend == "nccl":
            init_kwargs["device_id"] = device
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=_dt.timedelta(seconds=job["timeout_s"]),
            **init_kwargs,
        )
        if backend == "gloo":  # gloo's trace names no call's group: the job names it (pg_labels)
            from tracekit.collectors import pg_labels

            pg_labels.install()
        ctx = RankContext(
            rank=rank, world_size=world_size, backend=backend, run_dir=Path(job["run_dir"]), device=device, _queue=chan
        )
        result = job["fn"](ctx, job["payload"])
        chan.put(("ok", rank, result))
        _destroy_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        # Report first: tearing the group down makes the peers fail too, and the
        # parent should hear this rank's error before theirs.
        tb = traceback.format_exc()
        kind = "bad_input" if isinstance(exc, BadInputError) else "error"
        msg = str(exc) if isinstance(exc, TracekitError) else f"{type(exc).__name__}: {exc}"
        msg = " ".join(msg.split()) or type(exc).__name__
        try:
            chan.put((kind, rank, (msg, tb)))
        except Exception:
            sys.stderr.write(tb)
        _destroy_group()
        return 1


def _destroy_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


#: words of the errors a rank reports when a *peer* went away (secondary failures)
_PEER_LOSS = ("connection closed by peer", "connection reset by peer", "remote worker crash", "broken pipe", "aborted")


def _root_cause(failures: list[tuple[str, int, str, str]]) -> tuple[str, int, str, str]:
    """The failure to report: the first one that is not a peer-loss echo, else the first."""
    for f in failures:
        if not any(w in f[2].lower() for w in _PEER_LOSS):
            return f
    return failures[0]


def launch(
    fn: Callable[[RankContext, Any], Any],
    world_size: int,
    backend: str,
    run_dir: str | os.PathLike,
    payload: Any = None,
    *,
    threads_per_rank: int | None = None,
    timeout_s: float = 300.0,
    on_progress: Callable[[str], None] | None = None,
    rank_prefix: Callable[[int], list[str]] | None = None,
) -> list[Any]:
    """Run ``fn(ctx, payload)`` on `world_size` ranks, one process each; return the
    per-rank results (index = rank).

    `fn` must be a module-level function of an importable module (not
    ``__main__``): each rank is a fresh ``python -m tracekit.collectors._rank`` process
    that receives `fn` and `payload` pickled. `backend` must already be
    resolved ('gloo' or 'nccl'). `threads_per_rank` defaults to the CPU count
    divided by the ranks (at least 1), so ranks do not oversubscribe the cores.
    `timeout_s` bounds the process group's collectives and the whole job (twice
    that). Raises RankFailedError (exit 1) or BadInputError (exit 2) with the
    first failing rank's message; no rank process survives the call.

    `rank_prefix(rank)`, when given, is put in front of each rank's command line
    (e.g. an ``nsys profile ... -o rank{r}`` wrapper, see :mod:`tracekit.collectors.nsys`);
    the wrapper must pass stdin and the inherited report pipe on to the rank. After
    a clean run the wrappers get up to `timeout_s` (instead of 30 s) to exit, so a
    profiler can finish writing its report.
    """
    import subprocess
    import threading

    validate_ranks(world_size)
    if backend not in ("gloo", "nccl"):
        raise BadInputError(f"launch needs a resolved backend (gloo or nccl), got {backend!r}")
    if getattr(fn, "__module__", None) in (None, "__main__"):
        raise TracekitError(f"launch needs a function from an importable module, got {fn!r} from __main__")
    run_dir = Path(run_dir)
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // world_size)
    port = free_port()
    env = dict(os.environ)
    # The children see the same modules as this process (as multiprocessing's spawn does).
    paths = [p or os.getcwd() for p in sys.path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)

    sink: _queue.Queue = _queue.Queue()
    procs: list[subprocess.Popen] = []
    readers: list[threading.Thread] = []
    outputs: dict[int, Any] = {}
    failures: list[tuple[str, int, str, str]] = []  # (kind, rank, message, traceback)
    try:
        for rank in range(world_size):
            job = pickle.dumps(
                {
                    "fn": fn,
                    "payload": payload,
                    "rank": rank,
                    "world_size": world_size,
                    "backend": backend,
                    "port": port,
                    "run_dir": str(run_dir),
                    "threads": threads,
                    "timeout_s": timeout_s,
                },
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            rfd, wfd = os.pipe()
            log_path(run_dir, rank).parent.mkdir(parents=True, exist_ok=True)
            log = open(log_path(run_dir, rank), "wb")
            try:
                p = subprocess.Popen(
                    [*(rank_prefix(rank) if rank_prefix else []), sys.executable, "-m", "tracekit.collectors._rank", str(wfd)],
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(wfd,),
                    env=env,
                )
            finally:
                os.close(wfd)
                log.close()
            procs.append(p)
            t = threading.Thread(target=_read_messages, args=(rfd, rank, sink), daemon=True)
            t.start()
            readers.append(t)
            try:
                p.stdin.write(job)
                p.stdin.close()
            except BrokenPipeError:  # it died at start-up; its exit is reported below
                pass

        eof: set[int] = set()
        deadline = time.monotonic() + 2 * timeout_s
        first_failure_at: float | None = None
        grace = 1.5  # seconds to collect peers' reports after the first failure
        while len(outputs) < world_size:
            try:
                kind, rank, value = sink.get(timeout=0.1)
            except _queue.Empty:
                pass
            else:
                if kind == "progress":
                    if on_progress:
                        on_progress(f"rank {rank}: {value}")
                elif kind == "ok":
                    outputs[rank] = value
                    if on_progress:
                        on_progress(f"rank {rank} done ({len(outputs)}/{world_size})")
                elif kind == "eof":
                    eof.add(rank)
                    if rank not in outputs and not any(f[1] == rank for f in failures):
                        code = procs[rank].wait()
                        text = _exit_text(code) if code else "exited without reporting a result"
                        failures.append(("error", rank, text, ""))
                        first_failure_at = first_failure_at or time.monotonic()
                else:
                    failures.append((kind, rank, value[0], value[1]))
                    first_failure_at = first_failure_at or time.monotonic()
                continue
            now = time.monotonic()
            if failures and (now - first_failure_at > grace or len(eof) == world_size):
                break
            if now > deadline:
                failures.append(("error", -1, f"job did not finish within {2 * timeout_s:.0f} s", ""))
                break
    finally:
        clean = not failures and len(outputs) == world_size
        _stop_all(procs, wait_s=(max(30.0, timeout_s) if rank_prefix else 30.0) if clean else 0.0)
        for t in readers:
            t.join(timeout=1)

    if failures:
        kind, rank, msg, tb = _root_cause(failures)
        log_file = None
        for _k, r, _m, t in failures:
            if t and r >= 0:
                path = log_path(run_dir, r, "error.log")
                try:
                    path.write_text(t)
                    if r == rank:
                        log_file = str(path)
                except OSError:
                    pass
        if log_file is None and not tb and rank >= 0:
            log_file = str(log_path(run_dir, rank))  # a crash: its output is all there is
        if kind == "bad_input":
            raise BadInputError(f"rank {rank}: {msg}")
        if rank < 0:
            raise TracekitError(msg)
        raise RankFailedError(rank, msg, log_file, [(f[1], f[0], f[2]) for f in failures])
    return [outputs[r] for r in range(world_size)]


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _stop_all(procs, wait_s: float = 0.0) -> None:
    """Reap every rank process: wait up to `wait_s` for a clean exit, then terminate
    (SIGTERM), then kill (SIGKILL) whatever still runs."""
    import subprocess

    end = time.monotonic() + wait_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=3)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

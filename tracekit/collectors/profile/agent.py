"""The profiler agent that ``tracekit profile`` injects into every Python process of a job.

Loaded by the injected ``sitecustomize`` as module ``_tracekit_profile_agent``
(standard library only at load time; torch is imported by the job, never by us
first). It lives in ``tracekit`` because the in-process API (``tracekit.profile``)
uses its profiler and export too; ``tracekit.collectors.profile.runner`` injects it by path.
What it does in a process:

1. :func:`install` puts an import hook on ``sys.meta_path`` that waits for
   ``torch.distributed.distributed_c10d`` and ``torch.optim.optimizer`` to be
   imported, then (a) wraps ``init_process_group`` so that profiling starts right
   after the process group exists (rank and world size known), and (b) registers
   a global optimizer step post-hook (``register_optimizer_step_post_hook``).
2. The profiler is ``torch.profiler.profile`` with the schedule the command line
   gave (wait / warmup / active / repeat), record_shapes and with_stack as asked,
   CPU activity (+ CUDA when available). Profiler step k ends on the k-th step of
   the *first optimizer that steps* (other optimizers are ignored, so two
   optimizers per iteration still count one step) or on the k-th
   ``tracekit.step()``; once ``tracekit.step()`` has been called, optimizer steps
   no longer count.
3. A process that never initialises torch.distributed starts profiling at its
   first step instead (rank from ``$RANK``, else ``$SLURM_PROCID``, else 0), with a note. A process that
   neither initialises torch.distributed nor steps (e.g. torchrun's launcher) is
   never profiled.
4. The trace of each completed cycle is exported (gzipped Kineto JSON, written
   to a temporary name and renamed) as ``<dir>/rank{r}.pt.trace.json.gz``
   (cycle 1) or ``<dir>/cycle{c}/rank{r}.pt.trace.json.gz``; after the last cycle
   the profiler is stopped. At process exit (atexit) or on SIGTERM (when the job
   left SIGTERM at its default), a profiler still inside an active window is
   stopped, which writes what it recorded; one still in wait/warm-up writes
   nothing. A process killed with SIGKILL, or ending in ``os._exit``, or blocked
   in a C++ call until SIGKILL, keeps only what was already exported.
5. A status file ``<dir>/logs/agent.<host>.<pid>.json`` records the rank, world size,
   how stepping was driven, per-step wall times by profiler phase, the traces
   written, notes and the job marker of the ``tracekit profile`` that started it
   (``job``: a multi-node run folder holds every node's agents); the runner reads
   it (missing ranks, overhead, notes).
6. On gloo, every ``torch.distributed`` call of the job runs inside a range naming its process
   group (:mod:`tracekit.collectors.pg_labels`, when ``tracekit`` is importable in the job's Python): gloo's
   trace names no call's group.

Step wall times give the profiler's overhead in place: steps recorded by the
profiler (active window) against steps with it idle (wait steps after the first,
and steps after the last cycle). ``overhead_pct`` is set when both sides have at
least 2 steps.

Nothing here may break the user's job: every hook catches its own errors and
turns them into notes.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time

ENV_DIR = "TRACEKIT_PROFILE_DIR"
ENV_CONFIG = "TRACEKIT_PROFILE_CONFIG"
ENV_AGENT = "TRACEKIT_PROFILE_AGENT"
ENV_JOB = "TRACEKIT_PROFILE_JOB"
MODULE_NAME = "_tracekit_profile_agent"
_HOST = "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname()) or "host"
DEFAULTS = {"wait": 1, "warmup": 1, "active": 3, "repeat": 1, "record_shapes": True, "with_stack": False}
MAX_TIMED_STEPS = 10_000

_AGENT: "Agent | None" = None


def trace_name(rank: int) -> str:
    return f"rank{rank}.pt.trace.json.gz"


def export_trace(prof, out_file: str) -> str:
    """Export `prof`'s last cycle as gzipped Kineto JSON, atomically (temporary name, then rename)."""
    os.makedirs(os.path.dirname(out_file) or ".", exist_ok=True)
    tmp = out_file[: -len(".gz")] + f".tmp{os.getpid()}.gz" if out_file.endswith(".gz") else out_file + ".tmp"
    prof.export_chrome_trace(tmp)
    os.replace(tmp, out_file)
    return out_file


def make_profiler(cfg: dict, on_trace_ready):
    """``torch.profiler.profile`` for `cfg` (wait, warmup, active, repeat, record_shapes, with_stack)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return profile(
        activities=activities,
        schedule=schedule(wait=cfg["wait"], warmup=cfg["warmup"], active=cfg["active"], repeat=cfg["repeat"]),
        on_trace_ready=on_trace_ready,
        record_shapes=bool(cfg["record_shapes"]),
        with_stack=bool(cfg["with_stack"]),
    )


class _DeferSigint:
    """While exporting a trace, hold a Ctrl-C back (main thread, default handler only)
    and raise it afterwards, so that an interrupt never leaves half a trace."""

    def __init__(self, reraise: bool = True):
        self.reraise = reraise
        self.pending = False
        self._old = None

    def _handler(self, signum, frame):
        self.pending = True

    def __enter__(self):
        try:
            if threading.current_thread() is threading.main_thread() and (
                signal.getsignal(signal.SIGINT) is signal.default_int_handler
            ):
                self._old = signal.signal(signal.SIGINT, self._handler)
        except Exception:  # noqa: BLE001
            self._old = None
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            if self.pending and self.reraise and exc[0] is None:
                raise KeyboardInterrupt
        return False


def overhead_pct(on_s: list[float], off_s: list[float]) -> float | None:
    """(median step time with the profiler recording / median with it idle − 1) × 100,
    or None with fewer than 2 steps on either side."""
    if len(on_s) < 2 or len(off_s) < 2:
        return None
    off = statistics.median(off_s)
    if off <= 0:
        return None
    return (statistics.median(on_s) / off - 1.0) * 100.0


class Agent:
    """Profiler state of one process (see the module docstring)."""

    def __init__(self, out_dir: str, cfg: dict):
        self.out_dir = out_dir
        self.cfg = {**DEFAULTS, **cfg}
        self.pid = os.getpid()
        self.prof = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self.dist = False
        self.backend: str | None = None
        self.mode: str | None = None  # "optimizer" | "tracekit.step"
        self.first_optimizer: int | None = None
        self.steps = 0
        self.timed: list[tuple[str, float]] = []  # (phase, seconds) per step since the profiler started
        self.last_t: float | None = None
        self.cycles = 0
        self.traces: list[str] = []
        self.stopped = False
        self.finished = False
        self.exit_reason: str | None = None
        self.phase_at_stop: str | None = None
        self.notes: list[str] = []
        self.started_at: float | None = None
        self.torch_version: str | None = None
        self._lock = threading.RLock()
        self._busy = False
        self._finishing = False
        self._term_pending = False
        self.claimed: bool | None = None
        self.stood_down = False

    # ------------------------------------------------------------------ events

    def on_dist_init(self) -> None:
        """Called right after ``init_process_group`` returned."""
        import torch.distributed as dist

        if self.prof is not None or self.finished or os.getpid() != self.pid:
            return
        self.dist = True
        self.backend = str(dist.get_backend())
        if self.backend == "gloo":  # gloo's trace names no call's group: name it (tracekit.collectors.pg_labels)
            try:
                from tracekit.collectors import pg_labels
            except ImportError:  # the job's Python has no tracekit: the ingest falls back on the timing
                self.notes.append("tracekit is not importable in the job's Python: gloo calls are not labelled "
                                  "with their process group (the ingest attributes them by timing)")
            else:
                pg_labels.install()
        self._start(dist.get_rank(), dist.get_world_size(), "init_process_group")
        if self.cfg.get("fr"):  # tracekit profile --fr: dump this rank's Flight Recorder buffer (collectors.fr_agent)
            try:
                from tracekit.collectors.fr_agent import FrDumper

                self.fr = FrDumper(self.out_dir, self.rank, self.world_size)
            except Exception as exc:  # noqa: BLE001 - ImportError: no tracekit in the job's Python
                self.notes.append(f"Flight Recorder dumps unavailable: {type(exc).__name__}: {exc}")

    def on_foreign_profiler(self) -> None:
        """The job starts a torch.profiler of its own: only one can run, so ours stands down
        (writing what it recorded if inside an active window) and never starts again."""
        if self.stood_down or os.getpid() != self.pid:
            return
        self.stood_down = True
        self.notes.append(
            "the job started its own torch.profiler: tracekit's injected profiler stood down "
            f"after {self.steps} step(s) (only one profiler can run in a process)"
        )
        if self.prof is not None:
            self.finish("the job's own profiler")
        else:
            self.finished = True
            self._write_status()

    def on_optimizer_step(self, optimizer) -> None:
        if self.mode == "tracekit.step":
            return
        if self.first_optimizer is None:
            self.first_optimizer = id(optimizer)
        elif id(optimizer) != self.first_optimizer:
            return
        self.mode = "optimizer"
        self.step()

    def manual_step(self) -> None:
        """``tracekit.step()``: from now on only these calls advance the schedule."""
        if self.mode != "tracekit.step":
            if self.mode == "optimizer":
                self.notes.append(f"tracekit.step() took over stepping from the optimizer at step {self.steps}")
            self.mode = "tracekit.step"
        self.step()

    def step(self) -> None:
        if os.getpid() != self.pid or self.finished or self.stood_down:
            return
        if self.cfg.get("fr_only"):  # no profiler to advance: count the step
            self.steps += 1
            return
        with self._lock:
            if self._busy:
                return
            self._busy = True
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001
                self._note(f"profiler step failed: {type(exc).__name__}: {exc}")
            finally:
                self._busy = False
        if self._term_pending:
            self._on_sigterm(signal.SIGTERM, None)

    def _step(self) -> None:
        if self.prof is None:
            self._start_without_dist()
            return
        now = time.perf_counter()
        self.steps += 1
        if self.last_t is not None and len(self.timed) < MAX_TIMED_STEPS:
            self.timed.append((self._phase(), now - self.last_t))
        if not self.stopped:
            before = self._phase()
            with _DeferSigint():
                self.prof.step()  # exports the trace at the end of a cycle
                if self._phase() != before:
                    self._write_status()  # phase changes only: cheap, and shows progress
                total = self.cfg["wait"] + self.cfg["warmup"] + self.cfg["active"]
                if self.cfg["repeat"] > 0 and self.prof.step_num >= self.cfg["repeat"] * total:
                    self.prof.stop()
                    self.stopped = True
                    self.phase_at_stop = "done"
                    self._write_status()
        self.last_t = time.perf_counter()

    def _phase(self) -> str:
        """Phase of the step now ending: none (profiler idle), warmup, record, or off (stopped)."""
        if self.stopped or self.prof is None:
            return "off"
        action = self.prof.schedule(self.prof.step_num)
        return {"NONE": "none", "WARMUP": "warmup", "RECORD": "record", "RECORD_AND_SAVE": "record"}.get(
            action.name, action.name.lower()
        )

    # ------------------------------------------------------------------ start / stop

    def _start_without_dist(self) -> None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():  # initialised before our hook took
                self.dist = True
                self.backend = str(dist.get_backend())
                self._start(dist.get_rank(), dist.get_world_size(), "first step")
                return
        except Exception:  # noqa: BLE001
            pass
        rank = _env_int("RANK", _env_int("SLURM_PROCID", 0))  # srun sets only the SLURM_* names
        world = _env_int("WORLD_SIZE", _env_int("SLURM_NTASKS", 1))
        self.notes.append(
            f"torch.distributed was never initialised in pid {self.pid}: profiled as a single process "
            f"(rank {rank}) from its first step"
        )
        self._start(rank, world, "first step")

    def _start(self, rank: int, world_size: int, how: str) -> None:
        import torch

        self.rank, self.world_size = int(rank), int(world_size)
        self.torch_version = torch.__version__
        self._claim_rank()
        if not self.cfg.get("fr_only"):  # --fr-only: Flight Recorder alone, no profiler
            self.prof = make_profiler(self.cfg, self._on_trace_ready)
            self.prof.start()
        self.started_at = time.time()
        self.last_t = time.perf_counter()
        self.notes.append(f"profiler started at {how}")
        self._install_sigterm()
        atexit.register(self.finish, "exit")
        self._write_status()

    def _claim_rank(self) -> None:
        """Make sure no other process of this job writes the same rank's files:
        the first to claim a rank gets ``rank{r}``; later ones write under extra/."""
        logs = os.path.join(self.out_dir, "logs")
        os.makedirs(logs, exist_ok=True)
        try:
            fd = os.open(os.path.join(logs, f"rank{self.rank}.claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, str(self.pid).encode())
            os.close(fd)
            self.claimed = True
        except FileExistsError:
            self.claimed = False
            self.notes.append(
                f"another process already profiles rank {self.rank}: pid {self.pid}'s trace goes to extra/ (not ingested)"
            )

    def _trace_path(self, cycle: int) -> str:
        if self.claimed is False:
            return os.path.join(self.out_dir, "extra", f"{_HOST}.pid{self.pid}.cycle{cycle}.pt.trace.json.gz")
        if cycle == 1:
            return os.path.join(self.out_dir, trace_name(self.rank))
        return os.path.join(self.out_dir, f"cycle{cycle}", trace_name(self.rank))

    def _on_trace_ready(self, prof) -> None:
        self.cycles += 1
        try:
            path = export_trace(prof, self._trace_path(self.cycles))
            self.traces.append(os.path.relpath(path, self.out_dir))
        except Exception as exc:  # noqa: BLE001
            self._note(f"exporting the trace of cycle {self.cycles} failed: {type(exc).__name__}: {exc}")
        self._write_status()

    def finish(self, reason: str = "exit") -> None:
        """Stop the profiler (writing a trace if inside an active window) and write the status."""
        if self.finished or os.getpid() != self.pid:
            return
        self.finished = True
        self._finishing = True
        self.exit_reason = reason
        if getattr(self, "fr", None) is not None:  # --fr: the Flight Recorder dump first (the job is ending)
            self.fr.dump(reason)
            if self.fr.error:
                self.notes.append(self.fr.error)
        if self.prof is not None and not self.stopped:
            self.phase_at_stop = self._phase()
            self.stopped = True
            try:
                with _DeferSigint(reraise=False):
                    self.prof.stop()  # exports the trace when inside an active window
            except Exception as exc:  # noqa: BLE001
                self._note(f"stopping the profiler failed: {type(exc).__name__}: {exc}")
            if self.phase_at_stop != "record":
                self.notes.append(
                    f"stopped ({reason}) during profiler step {self.steps} in its {self.phase_at_stop} phase: "
                    "nothing was being recorded"
                )
            elif self.cycles:
                self.notes.append(f"stopped ({reason}) inside an active window: trace of a partial cycle written")
        self._write_status()
        self._finishing = False

    # ------------------------------------------------------------------ signals

    def _install_sigterm(self) -> None:
        try:
            if threading.current_thread() is not threading.main_thread():
                return
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, self._on_sigterm)
        except Exception:  # noqa: BLE001
            pass

    def _on_sigterm(self, signum, frame) -> None:
        if self._finishing:  # already writing what there is; the process ends after that
            return
        if self._busy:  # inside a profiler step or export: finish right after it
            self._term_pending = True
            return
        self._term_pending = False
        self.finish("SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    # ------------------------------------------------------------------ status

    def _note(self, text: str) -> None:
        self.notes.append(text)
        try:
            sys.stderr.write(f"tracekit profile: {text}\n")
        except Exception:  # noqa: BLE001
            pass

    def status(self) -> dict:
        on = [s for p, s in self.timed if p == "record"]
        # the first timed step follows start-up (cold); it is not a fair "idle" sample
        off = [s for i, (p, s) in enumerate(self.timed) if p in ("none", "off") and i > 0]
        pct = overhead_pct(on, off)
        return {
            "pid": self.pid,
            "rank": self.rank,
            "world_size": self.world_size,
            "dist": self.dist,
            "backend": self.backend,
            "host": socket.gethostname(),  # the raw name (as run_config hosts); _HOST only names files
            "job": os.environ.get(ENV_JOB),
            "torch_version": self.torch_version,
            "step_source": self.mode,
            "steps": self.steps,
            "phase": self._phase() if not self.finished else None,
            "cycles_written": self.cycles,
            "traces": self.traces,
            "claimed": self.claimed,
            "stopped": self.stopped,
            "stood_down": self.stood_down,
            "finished": self.finished,
            "exit_reason": self.exit_reason,
            "phase_at_stop": self.phase_at_stop,
            "started_at": self.started_at,
            "step_s": [[p, round(s, 6)] for p, s in self.timed],
            "median_record_step_s": statistics.median(on) if on else None,
            "median_idle_step_s": statistics.median(off) if off else None,
            "overhead_pct": pct,
            "notes": self.notes,
            "config": self.cfg,
        }

    def _write_status(self) -> None:
        try:
            logs = os.path.join(self.out_dir, "logs")
            os.makedirs(logs, exist_ok=True)
            path = os.path.join(logs, f"agent.{_HOST}.{self.pid}.json")  # one run folder may serve many nodes
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.status(), f, indent=1)
            os.replace(tmp, path)
        except Exception:  # noqa: BLE001
            pass


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


# ---------------------------------------------------------------------- the import hook


class _WrapLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs a callback on the executed module."""

    def __init__(self, inner, callback):
        self._inner = inner
        self._callback = callback

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            self._callback(module)
        except Exception as exc:  # noqa: BLE001
            if _AGENT is not None:
                _AGENT._note(f"hooking {module.__name__} failed: {type(exc).__name__}: {exc}")

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...
        return getattr(self._inner, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Wraps the loaders of a few named modules (one shot each)."""

    def __init__(self, callbacks: dict):
        self.callbacks = dict(callbacks)

    def find_spec(self, fullname, path, target=None):
        cb = self.callbacks.get(fullname)
        if cb is None:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        del self.callbacks[fullname]
        if not self.callbacks:
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
        spec.loader = _WrapLoader(spec.loader, cb)
        return spec


def _hook_c10d(module) -> None:
    original = module.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        if _AGENT is not None:
            try:
                _AGENT.on_dist_init()
            except Exception as exc:  # noqa: BLE001
                _AGENT._note(f"starting the profiler failed: {type(exc).__name__}: {exc}")
        return result

    init_process_group.__tracekit_wrapped__ = True
    module.init_process_group = init_process_group


def _hook_optimizer(module) -> None:
    def post_hook(optimizer, args, kwargs):
        if _AGENT is not None:
            _AGENT.on_optimizer_step(optimizer)

    module.register_optimizer_step_post_hook(post_hook)


def _hook_profiler(module) -> None:
    original = module.profile.start

    @functools.wraps(original)
    def start(self, *args, **kwargs):
        if _AGENT is not None and self is not _AGENT.prof:
            try:
                _AGENT.on_foreign_profiler()
            except Exception as exc:  # noqa: BLE001
                _AGENT._note(f"standing down for the job's profiler failed: {type(exc).__name__}: {exc}")
        return original(self, *args, **kwargs)

    module.profile.start = start


def install() -> None:
    """Set up the agent in this process (called by the injected sitecustomize)."""
    global _AGENT
    out_dir = os.environ.get(ENV_DIR)
    if not out_dir or _AGENT is not None:
        return
    try:
        cfg = json.loads(os.environ.get(ENV_CONFIG) or "{}")
    except ValueError:
        cfg = {}
    _AGENT = Agent(out_dir, cfg)
    hooks = {
        "torch.distributed.distributed_c10d": _hook_c10d,
        "torch.optim.optimizer": _hook_optimizer,
        "torch.profiler.profiler": _hook_profiler,
    }
    already = [name for name in hooks if name in sys.modules]
    for name in already:  # imported before us (unusual): hook in place
        hooks.pop(name)(sys.modules[name])
    if hooks:
        sys.meta_path.insert(0, _ImportHook(hooks))


def agent() -> Agent | None:
    """The agent of this process, or None when not running under ``tracekit profile``."""
    return _AGENT


def step() -> None:
    """``tracekit.step()`` under ``tracekit profile``."""
    if _AGENT is not None:
        _AGENT.manual_step()

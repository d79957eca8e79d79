"""Python API: profile the current process from code, and mark steps.

::

    import tracekit

    with tracekit.profile(store="tracekit-store", active=3) as p:
        for batch in loader:
            train_step(batch)
            p.step()
    print(p.run_id)

``tracekit.profile(...)`` runs ``torch.profiler`` with the wait / warmup / active
/ repeat schedule on this process, advances it on ``p.step()`` (or
``tracekit.step()``), and at the end of the block writes the trace, ingests it
into the store (workload ``external``) and prints the report. When
torch.distributed is initialised, every rank runs the block: rank 0 chooses the
run folder (broadcast to the others before profiling starts), each rank writes
its own trace, and rank 0 ingests them all after a barrier (both outside the
profiled window). On several nodes ``out`` must be a folder every node sees (rank 0's
run folder is where every rank writes).

``tracekit.step()`` marks the end of one iteration: under ``tracekit profile``
it advances the injected profiler (for loops without an optimizer, e.g.
inference); inside ``with tracekit.profile(...)`` it is ``p.step()``; anywhere
else it does nothing, so scripts can keep the call.

Under ``tracekit profile`` a ``tracekit.profile(...)`` block does not start a
second profiler: ``p.step()`` advances the injected one, and the command ingests.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

_AGENT_MODULE = "_tracekit_profile_agent"
_ACTIVE: list["profile"] = []


def _injected_agent():
    mod = sys.modules.get(_AGENT_MODULE)
    if mod is None:
        return None
    return mod.agent()


def step() -> None:
    """End of one iteration: advance the profiler of ``tracekit profile`` or of the
    innermost ``tracekit.profile`` block; a no-op when neither is running."""
    agent = _injected_agent()
    if agent is not None:
        agent.manual_step()
        return
    if _ACTIVE:
        _ACTIVE[-1].step()


class profile:
    """Context manager profiling this process (see the module docstring).

    Parameters: ``store`` (path or Store; default ``$TRACEKIT_STORE`` or
    ./tracekit-store), ``wait``/``warmup``/``active``/``repeat`` (the
    torch.profiler schedule; cycles after the first are written under
    ``cycle<c>/`` and not ingested), ``record_shapes``, ``with_stack``, ``out``
    (folder receiving the run folder, default ./tracekit-runs), ``run_id``,
    ``ingest`` (False: only write the traces), ``report`` (print the report).

    After the block: ``run_id`` (None when nothing was ingested), ``run_dir``,
    ``trace`` (this rank's trace file or None), ``rank``.
    Raises BadInputError for a bad schedule. An exception in the block propagates
    after the trace recorded so far is written (and ingested, marked partial).
    """

    def __init__(
        self,
        store: Any = None,
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        record_shapes: bool = True,
        with_stack: bool = False,
        out: str | os.PathLike | None = None,
        run_id: str | None = None,
        ingest: bool = True,
        report: bool = True,
    ):
        from tracekit.errors import BadInputError

        for name, v, lo in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1), ("repeat", repeat, 0)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise BadInputError(f"{name} must be an integer >= {lo}, got {v!r}")
        self.store = store
        self.cfg = {
            "wait": wait, "warmup": warmup, "active": active, "repeat": repeat,
            "record_shapes": record_shapes, "with_stack": with_stack,
        }
        self.out = out
        self.run_id = run_id
        self._requested_run_id = run_id
        self.ingest = ingest
        self.report = report
        self.run_dir: Path | None = None
        self.trace: Path | None = None
        self.rank = 0
        self.world_size = 1
        self.steps = 0
        self._prof = None
        self._agent = None
        self._cycles = 0
        self._done = False

    # ------------------------------------------------------------------ the block

    def __enter__(self) -> "profile":
        self._agent = _injected_agent()
        if self._agent is not None:  # under `tracekit profile`: that profiler is the one
            self.run_id = None
            _ACTIVE.append(self)
            return self
        import torch.distributed as dist

        from tracekit.collectors.profile import agent as _agent_mod

        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        run_dir = self._make_run_dir() if self.rank == 0 else None
        if distributed and self.world_size > 1:
            box = [str(run_dir) if run_dir is not None else None]
            dist.broadcast_object_list(box, src=0)
            run_dir = Path(box[0])
        self.run_dir = Path(run_dir)
        self.run_id = self.run_dir.name
        self._prof = _agent_mod.make_profiler(self.cfg, self._on_trace_ready)
        self._prof.start()
        _ACTIVE.append(self)
        return self

    def step(self) -> None:
        """End of one iteration: advance the schedule (stops after the last cycle)."""
        self.steps += 1
        if self._agent is not None:
            self._agent.manual_step()
            return
        if self._prof is None or self._done:
            return
        self._prof.step()
        total = self.cfg["wait"] + self.cfg["warmup"] + self.cfg["active"]
        if self.cfg["repeat"] > 0 and self._prof.step_num >= self.cfg["repeat"] * total:
            self._prof.stop()
            self._done = True

    def __exit__(self, exc_type, exc, tb) -> bool:
        if _ACTIVE and _ACTIVE[-1] is self:
            _ACTIVE.pop()
        if self._agent is not None:
            return False
        if not self._done:
            self._done = True
            self._prof.stop()  # writes the trace if inside an active window
        self._finish(failed=exc_type is not None)
        return False

    # ------------------------------------------------------------------ internals

    def _make_run_dir(self) -> Path:
        from tracekit.collectors.rundir import new_run_dir
        from tracekit.errors import BadInputError

        base = Path(self.out) if self.out is not None else Path("tracekit-runs")
        if self._requested_run_id is None:
            return new_run_dir(base, "external")
        from tracekit.store import check_run_id

        check_run_id(self._requested_run_id)
        d = base / self._requested_run_id
        try:
            d.mkdir(parents=True)
        except FileExistsError:
            raise BadInputError(f"{d}: already exists (choose another run_id or out)") from None
        return d

    def _on_trace_ready(self, prof) -> None:
        from tracekit.collectors.profile import agent as _agent_mod

        self._cycles += 1
        name = _agent_mod.trace_name(self.rank)
        path = self.run_dir / name if self._cycles == 1 else self.run_dir / f"cycle{self._cycles}" / name
        _agent_mod.export_trace(prof, str(path))
        if self._cycles == 1:
            self.trace = path

    def _finish(self, failed: bool) -> None:
        import json

        if self.world_size > 1:
            import torch.distributed as dist

            try:
                # every rank has written its trace before rank 0 reads them
                flag = [failed]
                gathered = [None] * self.world_size
                dist.all_gather_object(gathered, flag)
                failed = any(g[0] for g in gathered)
            except Exception:  # noqa: BLE001 - a broken group: ingest what is there
                failed = True
        if self.rank != 0:
            return
        traces = sorted(self.run_dir.glob("rank*.pt.trace.json.gz"))
        missing = [r for r in range(self.world_size) if not (self.run_dir / f"rank{r}.pt.trace.json.gz").exists()]
        config = {
            "workload": "external",
            "run_id": self.run_id,
            "command": list(sys.argv),
            "command_line": " ".join(sys.argv),
            "api": "tracekit.profile",
            "partial": bool(failed or missing),
            "world_size": self.world_size,
            "missing_ranks": missing,
            "profiler": {**self.cfg, "step_source": "profile.step"},
            "steps": self.steps,
        }
        (self.run_dir / "run_config.json").write_text(json.dumps(config, indent=2) + "\n")
        if not traces:
            need = self.cfg["wait"] + self.cfg["warmup"]
            warnings.warn(
                f"tracekit.profile: no trace was written ({self.steps} step(s), the active window starts after "
                f"{need}); call p.step() once per iteration",
                RuntimeWarning,
                stacklevel=3,
            )
            self.run_id = None
            return
        if missing:
            warnings.warn(f"tracekit.profile: no trace from rank(s) {missing}", RuntimeWarning, stacklevel=3)
        if not self.ingest:
            return
        from tracekit.ingest import ingest_paths
        from tracekit.store import Store

        st = self.store if isinstance(self.store, Store) else Store(self.store)
        self.run_id = ingest_paths([str(self.run_dir)], store=st, workload="external", config=config, run_id=self.run_id)
        if self.report:
            from tracekit.report.data import print_run_report

            print_run_report(st, self.run_id)
